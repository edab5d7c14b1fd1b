/*
 * _conflux_context.c: the Context type (objects: put, get, delete, reduce)
 * and ArenaBuffer, arena memory exported zero-copy.  See _conflux.c for
 * lifetimes.
 */
#include "_conflux.h"

/* ---- Context ------------------------------------------------------------- */

static void put_capsule_free(PyObject *cap)
{
    struct put_entry *e = PyCapsule_GetPointer(cap, "conflux.put");
    if (e) {
        PyBuffer_Release(&e->view);
        PyMem_Free(e);
    }
}

static void context_destroy_now(ContextObject *c)
{
    if (c->ctx) {
        struct cfx_context *ctx = c->ctx;
        c->ctx = NULL;
        Py_BEGIN_ALLOW_THREADS
        cfx_context_destroy(ctx);
        Py_END_ALLOW_THREADS
    }
    /* The library no longer serves any put buffer: give them back. */
    if (c->puts)
        PyDict_Clear(c->puts);
}

void cfx__py_context_child_gone(ContextObject *c)
{
    c->children--;
    if (c->closed && c->children == 0)
        context_destroy_now(c);
}

/* The live context, or NULL with ClosedError set. */
struct cfx_context *cfx__py_live_ctx(ContextObject *c)
{
    if (!c->ctx || c->closed) {
        cfx__py_raise_status_detail(CFX_ERR_CLOSED, "the context is closed");
        return NULL;
    }
    return c->ctx;
}

static void context_undo(void *ctx)
{
    cfx_context_destroy(ctx);
}

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "coord",      "token", "transports", "timeout_ms",
                              "chunk_size", "name",  "bind_addr",  "secure", NULL };
    const char *coord = NULL, *token = NULL, *transports = NULL, *name = NULL, *bind = NULL;
    const char *secure = NULL;
    PyObject *timeout = Py_None;
    Py_ssize_t chunk = 0;
    if (self->ctx || self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Context.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzOnzzz", kwlist, &coord, &token, &transports,
                                     &timeout, &chunk, &name, &bind, &secure))
        return -1;
    struct cfx_context_params p = { 0 };
    int set = 0;
    if (cfx__py_parse_timeout(timeout, &p.timeout_ms, &set) < 0)
        return -1;
    if (set)
        p.field_mask |= CFX_CTX_PARAM_TIMEOUT;
    if (coord) {
        p.coord = coord;
        p.field_mask |= CFX_CTX_PARAM_COORD;
    }
    if (token) {
        p.token = token;
        p.field_mask |= CFX_CTX_PARAM_TOKEN;
    }
    if (transports) {
        p.transports = transports;
        p.field_mask |= CFX_CTX_PARAM_TRANSPORTS;
    }
    if (chunk < 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_size must be >= 0");
        return -1;
    }
    if (chunk > 0) {
        p.chunk_size = (size_t)chunk;
        p.field_mask |= CFX_CTX_PARAM_CHUNK_SIZE;
    }
    if (name) {
        p.name = name;
        p.field_mask |= CFX_CTX_PARAM_NAME;
    }
    if (bind) {
        p.bind_addr = bind;
        p.field_mask |= CFX_CTX_PARAM_BIND_ADDR;
    }
    if (secure) {
        p.secure = secure;
        p.field_mask |= CFX_CTX_PARAM_SECURE;
    }
    if (!(self->puts = PyDict_New()))
        return -1;
    struct cfx_context *ctx = NULL;
    int rc;
    /* Ctrl-C ends a wait for a coordinator that is not up yet */
    int intr = cfx__py_intr_begin();
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_context_create(&p, &ctx);
    Py_END_ALLOW_THREADS
    if (cfx__py_intr_end_undo(intr, context_undo, ctx) < 0)
        return -1; /* KeyboardInterrupt, or the handler's exception */
    if (rc) {
        cfx__py_raise_status(rc);
        return -1;
    }
    self->ctx = ctx;
    return 0;
}

static void Context_dealloc(ContextObject *self)
{
    /* Children hold references, so none is left here. */
    context_destroy_now(self);
    Py_CLEAR(self->puts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_close(ContextObject *self, PyObject *unused)
{
    if (!self->closed) {
        self->closed = 1;
        if (self->children == 0)
            context_destroy_now(self);
    }
    Py_RETURN_NONE;
}

static PyObject *Context_get_closed(ContextObject *self, void *unused)
{
    return PyBool_FromLong(self->closed);
}

static PyObject *Context_get_node_id(ContextObject *self, void *unused)
{
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    return ctx ? PyLong_FromUnsignedLong(cfx_context_node_id(ctx)) : NULL;
}

static PyObject *Context_config(ContextObject *self, PyObject *unused)
{
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    if (!ctx)
        return NULL;
    int n = cfx_context_config(ctx, NULL, 0);
    if (n < 0)
        return cfx__py_raise_status(n);
    char *buf = PyMem_Malloc((size_t)n + 1);
    if (!buf)
        return PyErr_NoMemory();
    n = cfx_context_config(ctx, buf, (size_t)n + 1);
    PyObject *r = n < 0 ? cfx__py_raise_status(n) : PyUnicode_FromStringAndSize(buf, n);
    PyMem_Free(buf);
    return r;
}

static PyObject *Context_stats(ContextObject *self, PyObject *unused)
{
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    if (!ctx)
        return NULL;
    struct cfx_context_stats s;
    int rc = cfx_context_stats(ctx, &s);
    if (rc)
        return cfx__py_raise_status(rc);
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsK}", "puts", s.puts, "gets", s.gets,
                         "gets_inline", s.gets_inline, "gets_local", s.gets_local, "bytes_received",
                         s.bytes_received, "bytes_sent", s.bytes_sent, "uploads", s.uploads,
                         "uploads_partial", s.uploads_partial, "source_failovers",
                         s.source_failovers, "reduce_reroutes", s.reduce_reroutes, "reduce_replans",
                         s.reduce_replans, "dir_lookups", s.dir_lookups, "loc_hits", s.loc_hits,
                         "loc_stale", s.loc_stale, "loc_evictions", s.loc_evictions);
}

static PyObject *Context_generate_id(ContextObject *self, PyObject *unused)
{
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    if (!ctx)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_generate(ctx, &id);
    if (rc)
        return cfx__py_raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static int obj_params(PyObject *timeout, Py_ssize_t chunk, int no_inline, struct cfx_obj_params *p)
{
    int set = 0;
    memset(p, 0, sizeof(*p));
    if (cfx__py_parse_timeout(timeout, &p->timeout_ms, &set) < 0)
        return -1;
    if (set)
        p->field_mask |= CFX_OBJ_PARAM_TIMEOUT;
    if (chunk < 0) {
        PyErr_SetString(PyExc_ValueError, "chunk_size must be >= 0");
        return -1;
    }
    if (chunk > 0) {
        p->chunk_size = (size_t)chunk;
        p->field_mask |= CFX_OBJ_PARAM_CHUNK_SIZE;
    }
    if (no_inline) {
        p->flags = CFX_OBJ_FLAG_NO_INLINE;
        p->field_mask |= CFX_OBJ_PARAM_FLAGS;
    }
    return 0;
}

/* A put succeeded but its export could not be kept (out of memory): the
 * object is withdrawn again, so the call fails as a whole.  @p cap (its
 * view) is released only when the delete gave the buffer back; otherwise
 * uploads may still read it, and the export is kept for the process's
 * life.  The caller's error stays set. */
static void put_undo(struct cfx_context *ctx, const struct cfx_object_id *id, PyObject *timeout,
                     PyObject *cap)
{
    PyObject *exc = cfx__py_exc_take();
    struct cfx_obj_params p;
    int rc = CFX_ERR_NOMEM;
    if (obj_params(timeout, 0, 0, &p) == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_delete(ctx, id, &p);
        Py_END_ALLOW_THREADS
    }
    PyErr_Clear();
    /* as Context_delete: these three release this node's copy (object.h) */
    if (rc == CFX_OK || rc == CFX_ERR_CONNECT || rc == CFX_ERR_NOT_FOUND)
        Py_DECREF(cap);
    cfx__py_exc_put(exc);
}

/* put(id, buffer, timeout_ms=None, chunk_size=0, no_inline=False) */
static PyObject *Context_put(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "buffer", "timeout_ms", "chunk_size", "no_inline", NULL };
    PyObject *ido, *bufo, *timeout = Py_None;
    Py_ssize_t chunk = 0;
    int no_inline = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Onp", kwlist, &ido, &bufo, &timeout, &chunk,
                                     &no_inline))
        return NULL;
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || cfx__py_parse_id(ido, &id) < 0 || obj_params(timeout, chunk, no_inline, &p) < 0)
        return NULL;
    PyObject *key = PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
    if (!key)
        return NULL;
    struct put_entry *e = PyMem_Calloc(1, sizeof(*e));
    if (!e) {
        Py_DECREF(key);
        return PyErr_NoMemory();
    }
    if (PyObject_GetBuffer(bufo, &e->view, PyBUF_C_CONTIGUOUS) < 0) {
        PyMem_Free(e);
        Py_DECREF(key);
        return NULL;
    }
    PyObject *cap = PyCapsule_New(e, "conflux.put", put_capsule_free);
    if (!cap) {
        PyBuffer_Release(&e->view);
        PyMem_Free(e);
        Py_DECREF(key);
        return NULL;
    }
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_put(ctx, &id, e->view.buf, (size_t)e->view.len, &p);
    Py_END_ALLOW_THREADS
    if (rc) {
        cfx__py_context_child_gone(self);
        cfx__py_raise_status(rc);
        Py_DECREF(cap); /* releases the view: the library did not keep it */
        Py_DECREF(key);
        return NULL;
    }
    /* The library now serves this memory: keep the export until delete (or
     * the context's end, which a close() during the call brings now). */
    int err = PyDict_SetItem(self->puts, key, cap);
    Py_DECREF(key);
    if (err < 0)
        put_undo(ctx, &id, timeout, cap); /* with the error set */
    else
        Py_DECREF(cap);
    cfx__py_context_child_gone(self);
    if (err < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* get_into(id, buffer, timeout_ms=None) -> object size */
static PyObject *Context_get_into(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "buffer", "timeout_ms", NULL };
    PyObject *ido, *bufo, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &ido, &bufo, &timeout))
        return NULL;
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || cfx__py_parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    /* the buffer is released (numpy may free or change it) when this
     * returns: the engine keeps no copy in it */
    p.flags |= CFX_OBJ_FLAG_NO_KEEP;
    p.field_mask |= CFX_OBJ_PARAM_FLAGS;
    Py_buffer view;
    if (PyObject_GetBuffer(bufo, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    size_t size = 0;
    int rc;
    self->children++;
    int intr = cfx__py_intr_begin();
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_get(ctx, &id, view.buf, (size_t)view.len, &size, &p);
    Py_END_ALLOW_THREADS
    intr = cfx__py_intr_end(intr);
    cfx__py_context_child_gone(self);
    PyBuffer_Release(&view);
    if (intr < 0) /* Ctrl-C: KeyboardInterrupt, whether or not the get completed */
        return NULL;
    if (rc)
        return cfx__py_raise_status(rc);
    return PyLong_FromSize_t(size);
}

/* get_nb(id, buffer, timeout_ms=None) -> Request: cfx_get_nb() into a
 * writable buffer, exported until the request completes; as get_into(), the
 * engine keeps no copy in it. */
static PyObject *Context_get_nb(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "buffer", "timeout_ms", NULL };
    PyObject *ido, *bufo, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O", kwlist, &ido, &bufo, &timeout))
        return NULL;
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!cfx__py_live_ctx(self) || cfx__py_parse_id(ido, &id) < 0 ||
        obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    p.flags |= CFX_OBJ_FLAG_NO_KEEP;
    p.field_mask |= CFX_OBJ_PARAM_FLAGS;
    return cfx__py_request_get_nb(self, &id, bufo, &p);
}

/* ---- ArenaBuffer: arena memory from cfx_get_alloc(), exported zero-copy --- */

typedef struct {
    PyObject_HEAD
    ContextObject *owner; /* keeps the context alive */
    void *buf;            /* arena memory; freed with cfx_buf_free() */
    Py_ssize_t len;
} ArenaObject;

/* Read-only: the node serves the object from this memory to other nodes
 * (and to its own later gets) until it is freed; a write would change the
 * object under them.  A writable request fails with BufferError. */
static int Arena_getbuffer(ArenaObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->buf, self->len, 1, flags);
}

static PyBufferProcs arena_as_buffer = { .bf_getbuffer = (getbufferproc)Arena_getbuffer };

static void Arena_dealloc(ArenaObject *self)
{
    if (self->owner) {
        if (self->owner->ctx) {
            struct cfx_context *ctx = self->owner->ctx;
            void *buf = self->buf;
            /* it may talk to the coordinator: other threads run meanwhile */
            Py_BEGIN_ALLOW_THREADS
            cfx_buf_free(ctx, buf);
            Py_END_ALLOW_THREADS
        }
        cfx__py_context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Arena_len(ArenaObject *self)
{
    return self->len;
}

static PySequenceMethods arena_as_seq = { .sq_length = (lenfunc)Arena_len };

PyTypeObject cfx__py_arena_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.ArenaBuffer",
    .tp_basicsize = sizeof(ArenaObject),
    .tp_dealloc = (destructor)Arena_dealloc,
    .tp_as_buffer = &arena_as_buffer,
    .tp_as_sequence = &arena_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Registered arena memory holding a fetched object (buffer protocol, read-only: "
              "the node serves the object from it); "
              "returned to the arena when the last view of it goes.",
};

/* get_alloc(id, timeout_ms=None) -> ArenaBuffer */
static PyObject *Context_get_alloc(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "timeout_ms", NULL };
    PyObject *ido, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &ido, &timeout))
        return NULL;
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || cfx__py_parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    ArenaObject *a = PyObject_New(ArenaObject, &cfx__py_arena_type);
    if (!a)
        return NULL;
    a->owner = NULL;
    a->buf = NULL;
    a->len = 0;
    void *buf = NULL;
    size_t size = 0;
    int rc;
    self->children++;
    int intr = cfx__py_intr_begin();
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_get_alloc(ctx, &id, &buf, &size, &p);
    Py_END_ALLOW_THREADS
    intr = cfx__py_intr_end(intr);
    if (rc) {
        cfx__py_context_child_gone(self);
        Py_DECREF(a);
        return cfx__py_raise_status(rc);
    }
    /* the call's hold on the context passes to the buffer: a close() that
     * came meanwhile waits for the buffer, which needs the context to free */
    a->buf = buf;
    a->len = (Py_ssize_t)size;
    a->owner = (ContextObject *)Py_NewRef(self);
    if (intr < 0) { /* Ctrl-C as it completed: the buffer goes back at once */
        PyObject *exc = cfx__py_exc_take();
        Py_DECREF(a);
        cfx__py_exc_put(exc);
        return NULL;
    }
    return (PyObject *)a;
}

/* delete(id, timeout_ms=None) */
static PyObject *Context_delete(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "timeout_ms", NULL };
    PyObject *ido, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &ido, &timeout))
        return NULL;
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || cfx__py_parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_delete(ctx, &id, &p);
    Py_END_ALLOW_THREADS
    cfx__py_context_child_gone(self);
    /* CFX_OK and CFX_ERR_CONNECT both release this node's copy (object.h);
     * a timeout leaves uploads draining from the buffer: keep it pinned. */
    if (rc == CFX_OK || rc == CFX_ERR_CONNECT || rc == CFX_ERR_NOT_FOUND) {
        PyObject *key = PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
        if (!key)
            return NULL;
        int had = PyDict_Contains(self->puts, key);
        if (had > 0 && PyDict_DelItem(self->puts, key) < 0) {
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(key);
    }
    if (rc)
        return cfx__py_raise_status(rc);
    Py_RETURN_NONE;
}

/* The node set a reduce's result must be produced in: None, or a sequence
 * of at most CFX_TASK_NODES_MAX node ids. */
static int place_nodes(PyObject *nodes, uint32_t *ids, struct cfx_task_needs *nd,
                       struct cfx_obj_params *p)
{
    if (nodes == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(nodes, "nodes must be a sequence of node ids");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > CFX_TASK_NODES_MAX) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "reduce_objects: nodes names 1..%d node ids, not %zd",
                     CFX_TASK_NODES_MAX, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "reduce_objects: node id %lu out of range", v);
            return -1;
        }
        ids[i] = (uint32_t)v;
    }
    Py_DECREF(seq);
    *nd = (struct cfx_task_needs){ .field_mask = CFX_TASK_NEEDS_NODES, .nodes = ids,
                                   .n_nodes = (size_t)n };
    p->field_mask |= CFX_OBJ_PARAM_PLACE;
    p->place = nd;
    return 0;
}

/* reduce_objects(inputs, k, dtype, op, result, timeout_ms=None, nodes=None,
 *                allreduce=False) -> list of used indices */
static PyObject *Context_reduce_objects(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "inputs", "k", "dtype", "op", "result", "timeout_ms", "nodes",
                              "allreduce", NULL };
    PyObject *inputs, *reso, *timeout = Py_None, *nodes = Py_None;
    Py_ssize_t k;
    int dtype, op, allreduce = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OniiO|OOp", kwlist, &inputs, &k, &dtype, &op,
                                     &reso, &timeout, &nodes, &allreduce))
        return NULL;
    struct cfx_context *ctx = cfx__py_live_ctx(self);
    struct cfx_object_id result;
    struct cfx_obj_params p;
    struct cfx_task_needs nd;
    uint32_t node_ids[CFX_TASK_NODES_MAX];
    if (!ctx || cfx__py_check_dtype(dtype) < 0 || cfx__py_parse_id(reso, &result) < 0 ||
        obj_params(timeout, 0, 0, &p) < 0 || place_nodes(nodes, node_ids, &nd, &p) < 0)
        return NULL;
    if (allreduce) {
        p.field_mask |= CFX_OBJ_PARAM_FLAGS;
        p.flags |= CFX_OBJ_FLAG_ALLREDUCE;
    }
    PyObject *seq = PySequence_Fast(inputs, "inputs must be a sequence of object ids");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || k < 1 || k > n) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "reduce_objects: need 1 <= k <= n (k=%zd, n=%zd)", k, n);
        return NULL;
    }
    struct cfx_object_id *ids = PyMem_Calloc((size_t)n, sizeof(*ids));
    size_t *used = PyMem_Calloc((size_t)k, sizeof(*used));
    PyObject *r = NULL;
    if (!ids || !used) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (cfx__py_parse_id(PySequence_Fast_GET_ITEM(seq, i), &ids[i]) < 0)
            goto out;
    int rc;
    self->children++;
    int intr = cfx__py_intr_begin(); /* Ctrl-C ends its waits */
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_reduce_objects(ctx, ids, (size_t)n, (size_t)k, (enum cfx_dtype)dtype,
                            (enum cfx_redop)op, &result, &p, used);
    Py_END_ALLOW_THREADS
    cfx__py_context_child_gone(self);
    if (cfx__py_intr_end(intr) < 0)
        goto out; /* KeyboardInterrupt (the reduce canceled, or complete all the same) */
    if (rc) {
        cfx__py_raise_status(rc);
        goto out;
    }
    r = PyList_New(k);
    if (!r)
        goto out;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *v = PyLong_FromSize_t(used[i]);
        if (!v) {
            Py_CLEAR(r);
            goto out;
        }
        PyList_SET_ITEM(r, i, v);
    }
out:
    PyMem_Free(used);
    PyMem_Free(ids);
    Py_DECREF(seq);
    return r;
}

static PyObject *Context_put_ids(ContextObject *self, PyObject *unused)
{
    return PyDict_Keys(self->puts);
}

static PyMethodDef Context_methods[] = {
    { "close", (PyCFunction)Context_close, METH_NOARGS,
      "Leave the cluster (at once, or when the last group, parameter-server handle or arena "
      "buffer of this context goes)." },
    { "config", (PyCFunction)Context_config, METH_NOARGS, "Effective configuration text." },
    { "stats", (PyCFunction)Context_stats, METH_NOARGS, "Data-plane counters as a dict." },
    { "generate_id", (PyCFunction)Context_generate_id, METH_NOARGS,
      "A fresh object id (20 bytes) unique in the cluster." },
    { "put", (PyCFunction)(void (*)(void))Context_put, METH_VARARGS | METH_KEYWORDS,
      "put(id, buffer, timeout_ms=None, chunk_size=0, no_inline=False): publish buffer "
      "(zero-copy; the buffer stays exported until delete(id))." },
    { "get_into", (PyCFunction)(void (*)(void))Context_get_into, METH_VARARGS | METH_KEYWORDS,
      "get_into(id, buffer, timeout_ms=None) -> size: fetch into a writable buffer, "
      "which is the caller's again on return (no copy is kept in it)." },
    { "get_nb", (PyCFunction)(void (*)(void))Context_get_nb, METH_VARARGS | METH_KEYWORDS,
      "get_nb(id, buffer, timeout_ms=None) -> Request: fetch into a writable buffer without "
      "waiting; the buffer stays exported until the request completes "
      "(wait/test), then is the caller's (no copy is kept in it)." },
    { "get_alloc", (PyCFunction)(void (*)(void))Context_get_alloc, METH_VARARGS | METH_KEYWORDS,
      "get_alloc(id, timeout_ms=None) -> ArenaBuffer: fetch into registered arena memory." },
    { "delete", (PyCFunction)(void (*)(void))Context_delete, METH_VARARGS | METH_KEYWORDS,
      "delete(id, timeout_ms=None): stop holding id (the putter's delete ends the object)." },
    { "reduce_objects", (PyCFunction)(void (*)(void))Context_reduce_objects,
      METH_VARARGS | METH_KEYWORDS,
      "reduce_objects(inputs, k, dtype, op, result, timeout_ms=None) -> used indices." },
    { "put_ids", (PyCFunction)Context_put_ids, METH_NOARGS,
      "Ids put by this context and not yet deleted (their buffers stay pinned)." },
    { 0 } /* sentinel */
};

static PyGetSetDef Context_getset[] = {
    { "node_id", (getter)Context_get_node_id, NULL, "Node id the coordinator assigned.", NULL },
    { "closed", (getter)Context_get_closed, NULL, "True once close() was called.", NULL },
    { 0 } /* sentinel */
};

PyTypeObject cfx__py_context_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Low-level context (see conflux.Context).",
    .tp_methods = Context_methods,
    .tp_getset = Context_getset,
    .tp_init = (initproc)Context_init,
    .tp_new = PyType_GenericNew,
};

/*
 * _conflux: the CPython extension under the `conflux` package.
 *
 * A thin layer over the public C API (include/conflux/): it turns Python
 * buffers into (pointer, length) pairs through the buffer protocol (no copy),
 * releases the GIL around every call that may block, and turns a negative
 * status into an exception of the class for that status, carrying the
 * status's name and cfx_last_error() of the calling thread.
 *
 * Everything shaped for users (numpy and torch arrays, dtypes, seconds)
 * lives in the pure-Python modules beside this file; here timeouts are
 * milliseconds and dtypes are the enum values of conflux/reduce.h.
 *
 * Lifetimes: a Group, a ParameterServer and an ArenaBuffer hold a reference
 * to their Context and count as its children.  Context.close() leaves the
 * cluster at once when it has no children; otherwise the context stops
 * taking calls and is destroyed when its last child goes, so that no
 * handle, and no numpy array over arena memory, ever outlives the C context.
 * A put buffer stays exported (pinned) until its delete or the context's
 * end, as cfx_put() requires.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <string.h>

#include <conflux/conflux.h>

/* ---- errors ------------------------------------------------------------- */

#define N_STATUS (-(CFX_STATUS_LAST))
static PyObject *error_base;            /* conflux.Error */
static PyObject *error_types[N_STATUS]; /* per negative status; [0] unused */

/* obj.attr = v, consuming the new reference @p v (NULL: an error is set). */
static int set_attr(PyObject *obj, const char *attr, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyObject_SetAttrString(obj, attr, v);
    Py_DECREF(v);
    return rc;
}

/* Raise the exception for @p status: its message is "NAME: text (detail)",
 * and it carries status, name, text and detail (cfx_last_error() of this
 * thread) as attributes. */
static PyObject *raise_status(int status)
{
    const char *detail = cfx_last_error();
    PyObject *type = error_base;
    if (status < 0 && status > CFX_STATUS_LAST && error_types[-status])
        type = error_types[-status];
    if (!detail)
        detail = "";
    PyObject *msg =
        *detail
            ? PyUnicode_FromFormat("%s: %s (%s)", cfx_errname(status), cfx_strerror(status), detail)
            : PyUnicode_FromFormat("%s: %s", cfx_errname(status), cfx_strerror(status));
    if (!msg)
        return NULL;
    PyObject *exc = PyObject_CallOneArg(type, msg);
    Py_DECREF(msg);
    if (!exc)
        return NULL;
    if (set_attr(exc, "status", PyLong_FromLong(status)) < 0 ||
        set_attr(exc, "name", PyUnicode_FromString(cfx_errname(status))) < 0 ||
        set_attr(exc, "text", PyUnicode_FromString(cfx_strerror(status))) < 0 ||
        set_attr(exc, "detail", PyUnicode_FromString(detail)) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* "CFX_ERR_PEER_FAILED" -> "PeerFailedError" */
static void class_name(const char *errname, char *out, size_t len)
{
    const char *p = errname + strlen("CFX_ERR_");
    size_t n = 0;
    int upper = 1;
    for (; *p && n + 6 < len; p++) {
        if (*p == '_') {
            upper = 1;
            continue;
        }
        out[n++] = upper ? *p : (char)(*p - 'A' + 'a');
        upper = 0;
    }
    memcpy(out + n, "Error", 6);
}

static int make_errors(PyObject *m)
{
    error_base = PyErr_NewExceptionWithDoc(
        "conflux.Error",
        "A Conflux call failed.  Attributes: status (the negative cfx_status), "
        "name ('CFX_ERR_TIMEOUT'), text (cfx_strerror) and detail "
        "(cfx_last_error(): what was waited for, on which node, and why).",
        NULL, NULL);
    if (!error_base || PyModule_AddObjectRef(m, "Error", error_base) < 0)
        return -1;
    for (int s = -1; s > CFX_STATUS_LAST; s--) {
        char cls[64], qual[80];
        class_name(cfx_errname(s), cls, sizeof(cls));
        snprintf(qual, sizeof(qual), "conflux.%s", cls);
        /* Also the builtin a Python caller would catch for this. */
        PyObject *extra = NULL;
        if (s == CFX_ERR_TIMEOUT)
            extra = PyExc_TimeoutError;
        else if (s == CFX_ERR_INVALID)
            extra = PyExc_ValueError;
        else if (s == CFX_ERR_CONNECT)
            extra = PyExc_ConnectionError;
        else if (s == CFX_ERR_NOMEM)
            extra = PyExc_MemoryError;
        PyObject *bases = extra ? PyTuple_Pack(2, error_base, extra) : PyTuple_Pack(1, error_base);
        if (!bases)
            return -1;
        PyObject *t = PyErr_NewException(qual, bases, NULL);
        Py_DECREF(bases);
        if (!t)
            return -1;
        PyObject *code = PyLong_FromLong(s);
        if (!code || PyObject_SetAttrString(t, "STATUS", code) < 0) {
            Py_XDECREF(code);
            Py_DECREF(t);
            return -1;
        }
        Py_DECREF(code);
        error_types[-s] = t;
        if (PyModule_AddObjectRef(m, cls, t) < 0)
            return -1;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------- */

/* Timeout argument: None = leave unset (*set = 0); else milliseconds >= 0. */
static int parse_timeout(PyObject *o, int *ms, int *set)
{
    *set = 0;
    if (o == NULL || o == Py_None)
        return 0;
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "timeout must be between 0 and 2147483647 ms (every call has a deadline)");
        return -1;
    }
    *ms = (int)v;
    *set = 1;
    return 0;
}

static int parse_id(PyObject *o, struct cfx_object_id *id)
{
    Py_buffer b;
    if (PyObject_GetBuffer(o, &b, PyBUF_SIMPLE) < 0)
        return -1;
    if (b.len != CFX_OBJECT_ID_LEN) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "an object id is %d bytes, not %zd", CFX_OBJECT_ID_LEN,
                     b.len);
        return -1;
    }
    memcpy(id->bytes, b.buf, CFX_OBJECT_ID_LEN);
    PyBuffer_Release(&b);
    return 0;
}

static int check_dtype(int dtype)
{
    if (dtype < 0 || dtype >= CFX_DTYPE_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
        return -1;
    }
    return 0;
}

/* ---- module functions ---------------------------------------------------- */

static PyObject *mod_id_from_name(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_from_name(name, &id);
    if (rc)
        return raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static PyObject *mod_id_from_hex(PyObject *self, PyObject *arg)
{
    const char *hex = PyUnicode_AsUTF8(arg);
    if (!hex)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_from_hex(hex, &id);
    if (rc)
        return raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static PyObject *mod_id_to_hex(PyObject *self, PyObject *arg)
{
    struct cfx_object_id id;
    if (parse_id(arg, &id) < 0)
        return NULL;
    char hex[CFX_OBJECT_ID_HEX_LEN];
    cfx_object_id_to_hex(&id, hex);
    return PyUnicode_FromString(hex);
}

static PyObject *mod_errname(PyObject *self, PyObject *arg)
{
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(cfx_errname((int)s));
}

static PyObject *mod_strerror(PyObject *self, PyObject *arg)
{
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(cfx_strerror((int)s));
}

/* reduce(dst, src, dtype, op): dst op= src on this host (the library's kernels). */
static PyObject *mod_reduce(PyObject *self, PyObject *args)
{
    PyObject *dsto, *srco;
    int dtype, op;
    if (!PyArg_ParseTuple(args, "OOii", &dsto, &srco, &dtype, &op) || check_dtype(dtype) < 0)
        return NULL;
    Py_buffer dst, src;
    if (PyObject_GetBuffer(dsto, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(srco, &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    size_t es = cfx_dtype_size((enum cfx_dtype)dtype);
    int rc = CFX_ERR_INVALID;
    if (dst.len != src.len || dst.len % es) {
        PyErr_SetString(PyExc_ValueError, "reduce: buffers of different sizes");
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_reduce(dst.buf, src.buf, (size_t)dst.len / es, (enum cfx_dtype)dtype,
                        (enum cfx_redop)op);
        Py_END_ALLOW_THREADS
        if (rc)
            raise_status(rc);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- Context ------------------------------------------------------------- */

struct put_entry {
    Py_buffer view; /* exported until the delete: cfx_put() serves it zero-copy */
};

typedef struct {
    PyObject_HEAD
    struct cfx_context *ctx; /* NULL once destroyed */
    int closed;              /* close() called: no more calls */
    Py_ssize_t children;     /* live groups, ps handles, arena buffers, and calls in
                               * flight without the GIL: close() from another thread
                               * never frees the context under a running call */
    PyObject *puts;          /* dict: id bytes -> capsule of struct put_entry */
} ContextObject;

static PyTypeObject ContextType;

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

static void context_child_gone(ContextObject *c)
{
    c->children--;
    if (c->closed && c->children == 0)
        context_destroy_now(c);
}

/* The live context, or NULL with ClosedError set. */
static struct cfx_context *live_ctx(ContextObject *c)
{
    if (!c->ctx || c->closed) {
        PyErr_SetString(error_types[-CFX_ERR_CLOSED], "the context is closed");
        return NULL;
    }
    return c->ctx;
}

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "coord",      "token", "transports", "timeout_ms",
                              "chunk_size", "name",  "bind_addr",  NULL };
    const char *coord = NULL, *token = NULL, *transports = NULL, *name = NULL, *bind = NULL;
    PyObject *timeout = Py_None;
    Py_ssize_t chunk = 0;
    if (self->ctx || self->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Context.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzOnzz", kwlist, &coord, &token, &transports,
                                     &timeout, &chunk, &name, &bind))
        return -1;
    struct cfx_context_params p = { 0 };
    int set = 0;
    if (parse_timeout(timeout, &p.timeout_ms, &set) < 0)
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
    if (!(self->puts = PyDict_New()))
        return -1;
    struct cfx_context *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_context_create(&p, &ctx);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_status(rc);
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
    struct cfx_context *ctx = live_ctx(self);
    return ctx ? PyLong_FromUnsignedLong(cfx_context_node_id(ctx)) : NULL;
}

static PyObject *Context_config(ContextObject *self, PyObject *unused)
{
    struct cfx_context *ctx = live_ctx(self);
    if (!ctx)
        return NULL;
    int n = cfx_context_config(ctx, NULL, 0);
    if (n < 0)
        return raise_status(n);
    char *buf = PyMem_Malloc((size_t)n + 1);
    if (!buf)
        return PyErr_NoMemory();
    n = cfx_context_config(ctx, buf, (size_t)n + 1);
    PyObject *r = n < 0 ? raise_status(n) : PyUnicode_FromStringAndSize(buf, n);
    PyMem_Free(buf);
    return r;
}

static PyObject *Context_stats(ContextObject *self, PyObject *unused)
{
    struct cfx_context *ctx = live_ctx(self);
    if (!ctx)
        return NULL;
    struct cfx_context_stats s;
    int rc = cfx_context_stats(ctx, &s);
    if (rc)
        return raise_status(rc);
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
    struct cfx_context *ctx = live_ctx(self);
    if (!ctx)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_generate(ctx, &id);
    if (rc)
        return raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static int obj_params(PyObject *timeout, Py_ssize_t chunk, int no_inline, struct cfx_obj_params *p)
{
    int set = 0;
    memset(p, 0, sizeof(*p));
    if (parse_timeout(timeout, &p->timeout_ms, &set) < 0)
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
    struct cfx_context *ctx = live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || parse_id(ido, &id) < 0 || obj_params(timeout, chunk, no_inline, &p) < 0)
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
        context_child_gone(self);
        raise_status(rc);
        Py_DECREF(cap); /* releases the view: the library did not keep it */
        Py_DECREF(key);
        return NULL;
    }
    /* The library now serves this memory: keep the export until delete (or
     * the context's end, which a close() during the call brings now). */
    int err = PyDict_SetItem(self->puts, key, cap);
    Py_DECREF(cap);
    Py_DECREF(key);
    context_child_gone(self);
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
    struct cfx_context *ctx = live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(bufo, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    size_t size = 0;
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_get(ctx, &id, view.buf, (size_t)view.len, &size, &p);
    Py_END_ALLOW_THREADS
    context_child_gone(self);
    PyBuffer_Release(&view);
    if (rc)
        return raise_status(rc);
    return PyLong_FromSize_t(size);
}

/* ---- ArenaBuffer: arena memory from cfx_get_alloc(), exported zero-copy --- */

typedef struct {
    PyObject_HEAD
    ContextObject *owner; /* keeps the context alive */
    void *buf;            /* arena memory; freed with cfx_buf_free() */
    Py_ssize_t len;
} ArenaObject;

static PyTypeObject ArenaType;

static int Arena_getbuffer(ArenaObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->buf, self->len, 0, flags);
}

static PyBufferProcs arena_as_buffer = { .bf_getbuffer = (getbufferproc)Arena_getbuffer };

static void Arena_dealloc(ArenaObject *self)
{
    if (self->owner) {
        if (self->owner->ctx)
            cfx_buf_free(self->owner->ctx, self->buf);
        context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t Arena_len(ArenaObject *self)
{
    return self->len;
}

static PySequenceMethods arena_as_seq = { .sq_length = (lenfunc)Arena_len };

static PyTypeObject ArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.ArenaBuffer",
    .tp_basicsize = sizeof(ArenaObject),
    .tp_dealloc = (destructor)Arena_dealloc,
    .tp_as_buffer = &arena_as_buffer,
    .tp_as_sequence = &arena_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Registered arena memory holding a fetched object (buffer protocol, read-write); "
              "returned to the arena when the last view of it goes.",
};

/* get_alloc(id, timeout_ms=None) -> ArenaBuffer */
static PyObject *Context_get_alloc(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "timeout_ms", NULL };
    PyObject *ido, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &ido, &timeout))
        return NULL;
    struct cfx_context *ctx = live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    ArenaObject *a = PyObject_New(ArenaObject, &ArenaType);
    if (!a)
        return NULL;
    a->owner = NULL;
    a->buf = NULL;
    a->len = 0;
    void *buf = NULL;
    size_t size = 0;
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_get_alloc(ctx, &id, &buf, &size, &p);
    Py_END_ALLOW_THREADS
    if (rc) {
        context_child_gone(self);
        Py_DECREF(a);
        return raise_status(rc);
    }
    /* the call's hold on the context passes to the buffer: a close() that
     * came meanwhile waits for the buffer, which needs the context to free */
    a->buf = buf;
    a->len = (Py_ssize_t)size;
    a->owner = (ContextObject *)Py_NewRef(self);
    return (PyObject *)a;
}

/* delete(id, timeout_ms=None) */
static PyObject *Context_delete(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "timeout_ms", NULL };
    PyObject *ido, *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kwlist, &ido, &timeout))
        return NULL;
    struct cfx_context *ctx = live_ctx(self);
    struct cfx_object_id id;
    struct cfx_obj_params p;
    if (!ctx || parse_id(ido, &id) < 0 || obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_delete(ctx, &id, &p);
    Py_END_ALLOW_THREADS
    context_child_gone(self);
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
        return raise_status(rc);
    Py_RETURN_NONE;
}

/* reduce_objects(inputs, k, dtype, op, result, timeout_ms=None) -> list of used indices */
static PyObject *Context_reduce_objects(ContextObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "inputs", "k", "dtype", "op", "result", "timeout_ms", NULL };
    PyObject *inputs, *reso, *timeout = Py_None;
    Py_ssize_t k;
    int dtype, op;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OniiO|O", kwlist, &inputs, &k, &dtype, &op, &reso,
                                     &timeout))
        return NULL;
    struct cfx_context *ctx = live_ctx(self);
    struct cfx_object_id result;
    struct cfx_obj_params p;
    if (!ctx || check_dtype(dtype) < 0 || parse_id(reso, &result) < 0 ||
        obj_params(timeout, 0, 0, &p) < 0)
        return NULL;
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
        if (parse_id(PySequence_Fast_GET_ITEM(seq, i), &ids[i]) < 0)
            goto out;
    int rc;
    self->children++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_reduce_objects(ctx, ids, (size_t)n, (size_t)k, (enum cfx_dtype)dtype,
                            (enum cfx_redop)op, &result, &p, used);
    Py_END_ALLOW_THREADS
    context_child_gone(self);
    if (rc) {
        raise_status(rc);
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
      "get_into(id, buffer, timeout_ms=None) -> size: fetch into a writable buffer." },
    { "get_alloc", (PyCFunction)(void (*)(void))Context_get_alloc, METH_VARARGS | METH_KEYWORDS,
      "get_alloc(id, timeout_ms=None) -> ArenaBuffer: fetch into registered arena memory." },
    { "delete", (PyCFunction)(void (*)(void))Context_delete, METH_VARARGS | METH_KEYWORDS,
      "delete(id, timeout_ms=None): stop holding id (the putter's delete ends the object)." },
    { "reduce_objects", (PyCFunction)(void (*)(void))Context_reduce_objects,
      METH_VARARGS | METH_KEYWORDS,
      "reduce_objects(inputs, k, dtype, op, result, timeout_ms=None) -> used indices." },
    { "put_ids", (PyCFunction)Context_put_ids, METH_NOARGS,
      "Ids put by this context and not yet deleted (their buffers stay pinned)." },
    { NULL }
};

static PyGetSetDef Context_getset[] = {
    { "node_id", (getter)Context_get_node_id, NULL, "Node id the coordinator assigned.", NULL },
    { "closed", (getter)Context_get_closed, NULL, "True once close() was called.", NULL },
    { NULL }
};

static PyTypeObject ContextType = {
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

/* ---- Group ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ContextObject *owner;
    struct cfx_group *g;     /* NULL once destroyed */
    PyThread_type_lock lock; /* a group is used by one thread at a time */
    Py_ssize_t pending;      /* non-blocking requests not yet complete */
    int closing;             /* close() came while requests were pending */
} GroupObject;

static void group_destroy_now(GroupObject *self)
{
    if (self->pending > 0) { /* the last request to complete destroys it */
        self->closing = 1;
        return;
    }
    if (self->g) {
        struct cfx_group *g = self->g;
        self->g = NULL;
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        cfx_group_destroy(g);
        PyThread_release_lock(self->lock);
        Py_END_ALLOW_THREADS
    }
    if (self->owner) {
        context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
}

static int Group_init(GroupObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "context", "name", "rank", "size", "timeout_ms", NULL };
    PyObject *ctxo, *timeout = Py_None, *ranko = Py_None, *sizeo = Py_None;
    const char *name = NULL;
    if (self->g || self->owner) {
        PyErr_SetString(PyExc_RuntimeError, "Group.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|zOOO", kwlist, &ContextType, &ctxo, &name,
                                     &ranko, &sizeo, &timeout))
        return -1;
    ContextObject *c = (ContextObject *)ctxo;
    struct cfx_context *ctx = live_ctx(c);
    if (!ctx)
        return -1;
    struct cfx_group_params p = { 0 };
    int set = 0;
    if (parse_timeout(timeout, &p.timeout_ms, &set) < 0)
        return -1;
    if (set)
        p.field_mask |= CFX_GROUP_PARAM_TIMEOUT;
    if (name) {
        p.name = name;
        p.field_mask |= CFX_GROUP_PARAM_NAME;
    }
    if (ranko != Py_None) {
        p.rank = (int)PyLong_AsLong(ranko);
        if (PyErr_Occurred())
            return -1;
        p.field_mask |= CFX_GROUP_PARAM_RANK;
    }
    if (sizeo != Py_None) {
        p.size = (int)PyLong_AsLong(sizeo);
        if (PyErr_Occurred())
            return -1;
        p.field_mask |= CFX_GROUP_PARAM_SIZE;
    }
    if (!self->lock && !(self->lock = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        return -1;
    }
    struct cfx_group *g = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_group_create(ctx, &p, &g);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_status(rc);
        return -1;
    }
    self->g = g;
    self->owner = (ContextObject *)Py_NewRef(c);
    c->children++;
    return 0;
}

static void Group_dealloc(GroupObject *self)
{
    group_destroy_now(self);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static struct cfx_group *live_group(GroupObject *self)
{
    if (!self->g || self->closing) {
        PyErr_SetString(error_types[-CFX_ERR_CLOSED], "the group is closed");
        return NULL;
    }
    return self->g;
}

static PyObject *Group_close(GroupObject *self, PyObject *unused)
{
    group_destroy_now(self);
    Py_RETURN_NONE;
}

static PyObject *Group_get_rank(GroupObject *self, void *unused)
{
    struct cfx_group *g = live_group(self);
    return g ? PyLong_FromLong(cfx_group_rank(g)) : NULL;
}

static PyObject *Group_get_size(GroupObject *self, void *unused)
{
    struct cfx_group *g = live_group(self);
    return g ? PyLong_FromLong(cfx_group_size(g)) : NULL;
}

enum coll_kind {
    K_ALLREDUCE,
    K_BROADCAST,
    K_REDUCE,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_GATHER,
    K_SCATTER,
    K_ALLTOALL,
    K_SEND,
    K_RECV,
    K_BARRIER,
};

/* ---- Request: a non-blocking collective in flight ------------------------- */

typedef struct {
    PyObject_HEAD
    GroupObject *group;      /* keeps the group (and its context) alive */
    struct cfx_request *req; /* NULL once complete */
    Py_buffer sb, rb;        /* exported until completion: the library uses them */
    int have_sb, have_rb;
    int status; /* final status once complete */
} RequestObject;

static PyTypeObject RequestType;

/* The request finished with @p status: give back its buffers and its group. */
static void request_finish(RequestObject *self, int status)
{
    cfx_request_free(self->req);
    self->req = NULL;
    self->status = status;
    if (self->have_sb)
        PyBuffer_Release(&self->sb);
    if (self->have_rb)
        PyBuffer_Release(&self->rb);
    self->have_sb = self->have_rb = 0;
    GroupObject *g = self->group;
    if (--g->pending == 0 && g->closing) {
        g->closing = 0;
        group_destroy_now(g);
    }
}

/* wait(timeout_ms=None): None waits for the operation, which ends by its own
 * deadline (the group's or the call's timeout). */
static PyObject *Request_wait(RequestObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "timeout_ms", NULL };
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
        return NULL;
    int ms = -1, set = 0;
    if (parse_timeout(timeout, &ms, &set) < 0)
        return NULL;
    if (self->req) {
        struct cfx_request *req = self->req;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_request_wait(req, set ? ms : -1);
        Py_END_ALLOW_THREADS
        if (rc == CFX_ERR_TIMEOUT && cfx_request_test(req) == CFX_ERR_AGAIN)
            return raise_status(CFX_ERR_TIMEOUT); /* still running: wait again later */
        request_finish(self, rc);
    }
    if (self->status)
        return raise_status(self->status);
    Py_RETURN_NONE;
}

/* test() -> True once complete (raising its error if it failed), else False. */
static PyObject *Request_test(RequestObject *self, PyObject *unused)
{
    if (self->req) {
        int rc = cfx_request_test(self->req);
        if (rc == CFX_ERR_AGAIN)
            Py_RETURN_FALSE;
        request_finish(self, rc);
    }
    if (self->status)
        return raise_status(self->status);
    Py_RETURN_TRUE;
}

static void Request_dealloc(RequestObject *self)
{
    if (self->req) { /* dropped while running: the library still uses the buffers */
        struct cfx_request *req = self->req;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_request_wait(req, -1); /* bounded by the operation's own deadline */
        Py_END_ALLOW_THREADS
        request_finish(self, rc);
    }
    Py_CLEAR(self->group);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Request_methods[] = {
    { "wait", (PyCFunction)(void (*)(void))Request_wait, METH_VARARGS | METH_KEYWORDS,
      "wait(timeout_ms=None): until complete; raises the operation's error." },
    { "test", (PyCFunction)Request_test, METH_NOARGS,
      "test() -> bool: complete yet? (raises the operation's error)" },
    { NULL }
};

static PyTypeObject RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-blocking collective in flight; its buffers stay exported until it completes.",
    .tp_methods = Request_methods,
};

/* One entry point for every collective: buffers are checked against the
 * sizes the C call will touch, so no call reads or writes past a buffer. */
static PyObject *group_coll(GroupObject *self, enum coll_kind kind, int nb, PyObject *args,
                            PyObject *kw)
{
    /* root is the peer of send / recv */
    static char *kwlist[] = { "send", "recv",       "count", "dtype", "op",
                              "root", "timeout_ms", "algo",  "tag",   NULL };
    PyObject *sendo = Py_None, *recvo = Py_None, *timeout = Py_None;
    Py_ssize_t count = 0;
    int dtype = CFX_DTYPE_U8, op = CFX_OP_SUM, root = 0, algo = 0, tag = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOniiiOii", kwlist, &sendo, &recvo, &count, &dtype,
                                     &op, &root, &timeout, &algo, &tag))
        return NULL;
    struct cfx_group *g = live_group(self);
    if (!g || check_dtype(dtype) < 0)
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return NULL;
    }
    struct cfx_coll_params p = { 0 };
    int set = 0;
    if (parse_timeout(timeout, &p.timeout_ms, &set) < 0)
        return NULL;
    if (set)
        p.field_mask |= CFX_COLL_PARAM_TIMEOUT;
    if (algo < 0 || algo >= CFX_ALGO_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown algorithm code %d", algo);
        return NULL;
    }
    if (algo) {
        p.algo = (enum cfx_algo)algo;
        p.field_mask |= CFX_COLL_PARAM_ALGO;
    }
    int size = cfx_group_size(g), rank = cfx_group_rank(g);
    size_t es = cfx_dtype_size((enum cfx_dtype)dtype);
    size_t n = (size_t)count * es;
    /* bytes the call reads from send / writes to recv on this rank */
    size_t need_send = 0, need_recv = 0;
    int has_send = 1, has_recv = 1;
    switch (kind) {
    case K_ALLREDUCE: need_send = need_recv = n; break;
    case K_BROADCAST:
        has_send = 0;
        need_recv = n;
        break;
    case K_REDUCE:
        need_send = n;
        need_recv = rank == root ? n : 0;
        break;
    case K_ALLGATHER:
        need_send = n;
        need_recv = n * (size_t)size;
        break;
    case K_REDUCE_SCATTER:
        need_send = n * (size_t)size;
        need_recv = n;
        break;
    case K_GATHER:
        need_send = n;
        need_recv = rank == root ? n * (size_t)size : 0;
        break;
    case K_SCATTER:
        need_send = rank == root ? n * (size_t)size : 0;
        need_recv = n;
        break;
    case K_ALLTOALL: need_send = need_recv = n * (size_t)size; break;
    case K_SEND:
        has_recv = 0;
        need_send = n;
        break;
    case K_RECV:
        has_send = 0;
        need_recv = n;
        break;
    case K_BARRIER: has_send = has_recv = 0; break;
    }
    if (kind == K_REDUCE || kind == K_GATHER || kind == K_SCATTER || kind == K_BROADCAST) {
        if (root < 0 || root >= size) {
            PyErr_Format(PyExc_ValueError, "root %d is not a rank of a group of %d", root, size);
            return NULL;
        }
    }
    Py_buffer sb = { 0 }, rb = { 0 };
    int have_sb = 0, have_rb = 0;
    PyObject *ret = NULL;
    if (has_send && sendo != Py_None) {
        if (PyObject_GetBuffer(sendo, &sb, PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        have_sb = 1;
    }
    if (has_recv && recvo != Py_None) {
        if (PyObject_GetBuffer(recvo, &rb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto out;
        have_rb = 1;
    }
    if ((need_send && (!have_sb || (size_t)sb.len < need_send)) ||
        (need_recv && (!have_rb || (size_t)rb.len < need_recv))) {
        PyErr_Format(PyExc_ValueError,
                     "buffers too small: this rank's call reads %zu bytes and writes %zu "
                     "(send has %zd, recv has %zd)",
                     need_send, need_recv, have_sb ? sb.len : (Py_ssize_t)-1,
                     have_rb ? rb.len : (Py_ssize_t)-1);
        goto out;
    }
    const void *s = have_sb ? sb.buf : NULL;
    void *r = have_rb ? rb.buf : NULL;
    size_t cnt = (size_t)count;
    enum cfx_dtype dt = (enum cfx_dtype)dtype;
    enum cfx_redop rop = (enum cfx_redop)op;
    int rc = CFX_ERR_INVALID;
    if (nb) { /* post it; the Request owns the buffers until it completes */
        RequestObject *ro = PyObject_New(RequestObject, &RequestType);
        if (!ro)
            goto out;
        ro->group = NULL;
        ro->req = NULL;
        ro->have_sb = ro->have_rb = 0;
        ro->status = 0;
        struct cfx_request *req = NULL;
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        switch (kind) {
        case K_ALLREDUCE: rc = cfx_group_iallreduce(g, s, r, cnt, dt, rop, &p, &req); break;
        case K_BROADCAST: rc = cfx_group_ibroadcast(g, r, cnt, dt, root, &p, &req); break;
        case K_REDUCE: rc = cfx_group_ireduce(g, s, r, cnt, dt, rop, root, &p, &req); break;
        case K_ALLGATHER: rc = cfx_group_iallgather(g, s, r, cnt, dt, &p, &req); break;
        default: break;
        }
        PyThread_release_lock(self->lock);
        Py_END_ALLOW_THREADS
        if (rc) {
            Py_DECREF(ro);
            raise_status(rc);
            goto out;
        }
        ro->req = req;
        ro->group = (GroupObject *)Py_NewRef(self);
        self->pending++;
        ro->sb = sb;
        ro->rb = rb;
        ro->have_sb = have_sb;
        ro->have_rb = have_rb;
        have_sb = have_rb = 0; /* moved into the request */
        ret = (PyObject *)ro;
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    switch (kind) {
    case K_ALLREDUCE: rc = cfx_group_allreduce(g, s, r, cnt, dt, rop, &p); break;
    case K_BROADCAST: rc = cfx_group_broadcast(g, r, cnt, dt, root, &p); break;
    case K_REDUCE: rc = cfx_group_reduce(g, s, r, cnt, dt, rop, root, &p); break;
    case K_ALLGATHER: rc = cfx_group_allgather(g, s, r, cnt, dt, &p); break;
    case K_REDUCE_SCATTER: rc = cfx_group_reduce_scatter(g, s, r, cnt, dt, rop, &p); break;
    case K_GATHER: rc = cfx_group_gather(g, s, r, cnt, dt, root, &p); break;
    case K_SCATTER: rc = cfx_group_scatter(g, s, r, cnt, dt, root, &p); break;
    case K_ALLTOALL: rc = cfx_group_alltoall(g, s, r, cnt, dt, &p); break;
    case K_SEND: rc = cfx_group_send(g, s, n, root, tag, &p); break;
    case K_RECV: rc = cfx_group_recv(g, r, n, root, tag, &p); break;
    case K_BARRIER: rc = cfx_group_barrier(g, &p); break;
    }
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (rc)
        raise_status(rc);
    else
        ret = Py_NewRef(Py_None);
out:
    if (have_sb)
        PyBuffer_Release(&sb);
    if (have_rb)
        PyBuffer_Release(&rb);
    return ret;
}

#define COLL_METHOD(fn, kind, nb)                                        \
    static PyObject *fn(GroupObject *self, PyObject *args, PyObject *kw) \
    {                                                                    \
        return group_coll(self, kind, nb, args, kw);                     \
    }
COLL_METHOD(Group_allreduce, K_ALLREDUCE, 0)
COLL_METHOD(Group_broadcast, K_BROADCAST, 0)
COLL_METHOD(Group_reduce, K_REDUCE, 0)
COLL_METHOD(Group_allgather, K_ALLGATHER, 0)
COLL_METHOD(Group_reduce_scatter, K_REDUCE_SCATTER, 0)
COLL_METHOD(Group_gather, K_GATHER, 0)
COLL_METHOD(Group_scatter, K_SCATTER, 0)
COLL_METHOD(Group_alltoall, K_ALLTOALL, 0)
COLL_METHOD(Group_send, K_SEND, 0)
COLL_METHOD(Group_recv, K_RECV, 0)
COLL_METHOD(Group_barrier, K_BARRIER, 0)
COLL_METHOD(Group_iallreduce, K_ALLREDUCE, 1)
COLL_METHOD(Group_ibroadcast, K_BROADCAST, 1)
COLL_METHOD(Group_ireduce, K_REDUCE, 1)
COLL_METHOD(Group_iallgather, K_ALLGATHER, 1)

#define COLL_DEF(name, fn, doc)                                                  \
    {                                                                            \
        name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc \
    }
static PyMethodDef Group_methods[] = {
    { "close", (PyCFunction)Group_close, METH_NOARGS, "Leave the group." },
    COLL_DEF("allreduce", Group_allreduce,
             "allreduce(send, recv, count, dtype, op, timeout_ms, algo)"),
    COLL_DEF("broadcast", Group_broadcast,
             "broadcast(recv=buf, count, dtype, root, timeout_ms, algo)"),
    COLL_DEF("reduce", Group_reduce,
             "reduce(send, recv, count, dtype, op, root, timeout_ms, algo)"),
    COLL_DEF("allgather", Group_allgather, "allgather(send, recv, count, dtype, timeout_ms, algo)"),
    COLL_DEF("reduce_scatter", Group_reduce_scatter,
             "reduce_scatter(send, recv, count, dtype, op, timeout_ms, algo)"),
    COLL_DEF("gather", Group_gather, "gather(send, recv, count, dtype, root, timeout_ms, algo)"),
    COLL_DEF("scatter", Group_scatter, "scatter(send, recv, count, dtype, root, timeout_ms, algo)"),
    COLL_DEF("alltoall", Group_alltoall, "alltoall(send, recv, count, dtype, timeout_ms, algo)"),
    COLL_DEF("send", Group_send, "send(send, count, dtype, root=peer, tag, timeout_ms)"),
    COLL_DEF("recv", Group_recv, "recv(recv=buf, count, dtype, root=peer, tag, timeout_ms)"),
    COLL_DEF("barrier", Group_barrier, "barrier(timeout_ms)"),
    COLL_DEF("iallreduce", Group_iallreduce, "as allreduce, returning a Request"),
    COLL_DEF("ibroadcast", Group_ibroadcast, "as broadcast, returning a Request"),
    COLL_DEF("ireduce", Group_ireduce, "as reduce, returning a Request"),
    COLL_DEF("iallgather", Group_iallgather, "as allgather, returning a Request"),
    { NULL }
};

static PyGetSetDef Group_getset[] = {
    { "rank", (getter)Group_get_rank, NULL, "This process's rank.", NULL },
    { "size", (getter)Group_get_size, NULL, "Number of ranks.", NULL },
    { NULL }
};

static PyTypeObject GroupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.Group",
    .tp_basicsize = sizeof(GroupObject),
    .tp_dealloc = (destructor)Group_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Low-level group (see conflux.Group).",
    .tp_methods = Group_methods,
    .tp_getset = Group_getset,
    .tp_init = (initproc)Group_init,
    .tp_new = PyType_GenericNew,
};

/* ---- ParameterServer --------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ContextObject *owner;
    struct cfx_ps *ps; /* NULL once destroyed */
    int closing;       /* close() called while calls were in flight */
    Py_ssize_t busy;   /* calls in flight without the GIL; the last one destroys */
    PyObject *sizes;   /* dict: key -> bytes of the tensor */
} PSObject;

static void ps_destroy_now(PSObject *self)
{
    if (self->busy > 0) { /* another thread is in a call: it destroys on its way out */
        self->closing = 1;
        return;
    }
    if (self->ps) {
        struct cfx_ps *ps = self->ps;
        self->ps = NULL;
        Py_BEGIN_ALLOW_THREADS
        cfx_ps_destroy(ps);
        Py_END_ALLOW_THREADS
    }
    if (self->owner) {
        context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
}

static int PS_init(PSObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "context",     "job",         "role",        "index",
                              "num_workers", "num_servers", "consistency", "staleness",
                              "block_size",  "optimizer",   "lr",          "momentum",
                              "beta1",       "beta2",       "eps",         "weight_decay",
                              "grad_scale",  "timeout_ms",  NULL };
    PyObject *ctxo, *timeout = Py_None;
    const char *job = NULL;
    int role = 0, index = 0, nw = 1, ns = 1, cons = 0, stale = 1, opt = 0;
    Py_ssize_t block = 0;
    double lr = 0.01, mom = 0.9, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0, gs = 1;
    if (self->ps || self->owner) {
        PyErr_SetString(PyExc_RuntimeError, "ParameterServer.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|ziiiiiinidddddddO", kwlist, &ContextType, &ctxo,
                                     &job, &role, &index, &nw, &ns, &cons, &stale, &block, &opt,
                                     &lr, &mom, &b1, &b2, &eps, &wd, &gs, &timeout))
        return -1;
    ContextObject *c = (ContextObject *)ctxo;
    struct cfx_context *ctx = live_ctx(c);
    if (!ctx)
        return -1;
    struct cfx_ps_params p = { 0 };
    int set = 0;
    if (parse_timeout(timeout, &p.timeout_ms, &set) < 0)
        return -1;
    p.field_mask = CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX | CFX_PS_PARAM_NUM_WORKERS |
                   CFX_PS_PARAM_NUM_SERVERS | CFX_PS_PARAM_CONSISTENCY | CFX_PS_PARAM_STALENESS |
                   CFX_PS_PARAM_OPTIMIZER;
    if (set)
        p.field_mask |= CFX_PS_PARAM_TIMEOUT;
    if (job) {
        p.job = job;
        p.field_mask |= CFX_PS_PARAM_JOB;
    }
    if (block < 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be >= 0");
        return -1;
    }
    if (block) {
        p.block_size = (size_t)block;
        p.field_mask |= CFX_PS_PARAM_BLOCK_SIZE;
    }
    p.role = (enum cfx_ps_role)role;
    p.index = index;
    p.num_workers = nw;
    p.num_servers = ns;
    p.consistency = (enum cfx_ps_consistency)cons;
    p.staleness = stale;
    p.optim = (struct cfx_ps_optim){ .type = (enum cfx_ps_optimizer)opt,
                                     .lr = lr,
                                     .momentum = mom,
                                     .beta1 = b1,
                                     .beta2 = b2,
                                     .eps = eps,
                                     .weight_decay = wd,
                                     .grad_scale = gs };
    if (!(self->sizes = PyDict_New()))
        return -1;
    struct cfx_ps *ps = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_ps_create(ctx, &p, &ps);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_status(rc);
        return -1;
    }
    self->ps = ps;
    self->owner = (ContextObject *)Py_NewRef(c);
    c->children++;
    return 0;
}

static void PS_dealloc(PSObject *self)
{
    ps_destroy_now(self);
    Py_CLEAR(self->sizes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void ps_leave(PSObject *self)
{
    if (--self->busy == 0 && self->closing)
        ps_destroy_now(self);
}

static struct cfx_ps *live_ps(PSObject *self)
{
    if (!self->ps || self->closing) {
        PyErr_SetString(error_types[-CFX_ERR_CLOSED], "the parameter-server handle is closed");
        return NULL;
    }
    return self->ps;
}

static PyObject *PS_close(PSObject *self, PyObject *unused)
{
    ps_destroy_now(self);
    Py_RETURN_NONE;
}

static PyObject *PS_serve(PSObject *self, PyObject *args)
{
    int ms;
    if (!PyArg_ParseTuple(args, "i", &ms))
        return NULL;
    struct cfx_ps *ps = live_ps(self);
    if (!ps)
        return NULL;
    if (ms < 0) {
        PyErr_SetString(PyExc_ValueError, "serve: timeout must be >= 0 ms");
        return NULL;
    }
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_ps_serve(ps, ms);
    Py_END_ALLOW_THREADS
    ps_leave(self);
    if (rc)
        return raise_status(rc);
    Py_RETURN_NONE;
}

/* register(name, dtype, count, init=None) -> key */
static PyObject *PS_register(PSObject *self, PyObject *args)
{
    const char *name;
    int dtype;
    Py_ssize_t count;
    PyObject *inito = Py_None;
    if (!PyArg_ParseTuple(args, "sin|O", &name, &dtype, &count, &inito))
        return NULL;
    struct cfx_ps *ps = live_ps(self);
    if (!ps || check_dtype(dtype) < 0)
        return NULL;
    if (count <= 0) {
        PyErr_SetString(PyExc_ValueError, "register: count must be > 0");
        return NULL;
    }
    size_t bytes = (size_t)count * cfx_dtype_size((enum cfx_dtype)dtype);
    Py_buffer ib;
    int have = 0;
    if (inito != Py_None) {
        if (PyObject_GetBuffer(inito, &ib, PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        have = 1;
        if ((size_t)ib.len != bytes) {
            PyBuffer_Release(&ib);
            PyErr_Format(PyExc_ValueError, "register: init has %zd bytes, the tensor %zu", ib.len,
                         bytes);
            return NULL;
        }
    }
    int key = -1, rc;
    const void *init = have ? ib.buf : NULL;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_ps_register(ps, name, (enum cfx_dtype)dtype, (size_t)count, init, &key);
    Py_END_ALLOW_THREADS
    ps_leave(self);
    if (have)
        PyBuffer_Release(&ib);
    if (rc)
        return raise_status(rc);
    PyObject *k = PyLong_FromLong(key), *b = PyLong_FromSize_t(bytes);
    if (!k || !b || PyDict_SetItem(self->sizes, k, b) < 0) {
        Py_XDECREF(k);
        Py_XDECREF(b);
        return NULL;
    }
    Py_DECREF(b);
    return k;
}

enum ps_op { PS_PUSH, PS_PULL, PS_PUSHPULL };

static PyObject *ps_op(PSObject *self, enum ps_op op, PyObject *args)
{
    int key;
    PyObject *a = Py_None, *b = Py_None;
    if (!PyArg_ParseTuple(args, op == PS_PUSHPULL ? "iOO" : "iO", &key, &a, &b))
        return NULL;
    struct cfx_ps *ps = live_ps(self);
    if (!ps)
        return NULL;
    PyObject *k = PyLong_FromLong(key);
    if (!k)
        return NULL;
    PyObject *bo = PyDict_GetItemWithError(self->sizes, k);
    Py_DECREF(k);
    if (!bo) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_KeyError, "no tensor with key %d was registered here", key);
        return NULL;
    }
    size_t bytes = PyLong_AsSize_t(bo);
    Py_buffer gb = { 0 }, ob = { 0 };
    int have_g = 0, have_o = 0, rc = CFX_ERR_INVALID;
    PyObject *grad = op == PS_PULL ? NULL : a,
             *out = op == PS_PUSH ? NULL : (op == PS_PULL ? a : b);
    if (grad) {
        if (PyObject_GetBuffer(grad, &gb, PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        have_g = 1;
    }
    if (out) {
        if (PyObject_GetBuffer(out, &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
        have_o = 1;
    }
    if ((have_g && (size_t)gb.len != bytes) || (have_o && (size_t)ob.len != bytes)) {
        PyErr_Format(PyExc_ValueError, "tensor %d has %zu bytes; buffers must match", key, bytes);
        goto fail;
    }
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    if (op == PS_PUSH)
        rc = cfx_ps_push(ps, key, gb.buf);
    else if (op == PS_PULL)
        rc = cfx_ps_pull(ps, key, ob.buf);
    else
        rc = cfx_ps_pushpull(ps, key, gb.buf, ob.buf);
    Py_END_ALLOW_THREADS
    ps_leave(self);
    if (rc)
        raise_status(rc);
fail:
    if (have_g)
        PyBuffer_Release(&gb);
    if (have_o)
        PyBuffer_Release(&ob);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *PS_push(PSObject *self, PyObject *args)
{
    return ps_op(self, PS_PUSH, args);
}
static PyObject *PS_pull(PSObject *self, PyObject *args)
{
    return ps_op(self, PS_PULL, args);
}
static PyObject *PS_pushpull(PSObject *self, PyObject *args)
{
    return ps_op(self, PS_PUSHPULL, args);
}

static PyMethodDef PS_methods[] = {
    { "close", (PyCFunction)PS_close, METH_NOARGS, "Leave the job." },
    { "serve", (PyCFunction)PS_serve, METH_VARARGS, "serve(timeout_ms): server loop." },
    { "register", (PyCFunction)PS_register, METH_VARARGS,
      "register(name, dtype, count, init=None) -> key" },
    { "push", (PyCFunction)PS_push, METH_VARARGS, "push(key, grad)" },
    { "pull", (PyCFunction)PS_pull, METH_VARARGS, "pull(key, out)" },
    { "pushpull", (PyCFunction)PS_pushpull, METH_VARARGS, "pushpull(key, grad, out)" },
    { NULL }
};

static PyTypeObject PSType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.ParameterServer",
    .tp_basicsize = sizeof(PSObject),
    .tp_dealloc = (destructor)PS_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Low-level parameter-server handle (see conflux.ParameterServer).",
    .tp_methods = PS_methods,
    .tp_init = (initproc)PS_init,
    .tp_new = PyType_GenericNew,
};

/* ---- module --------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    { "id_from_name", mod_id_from_name, METH_O, "20-byte id from a name (SHA-1)." },
    { "id_from_hex", mod_id_from_hex, METH_O, "20-byte id from 40 hex digits." },
    { "id_to_hex", mod_id_to_hex, METH_O, "40 hex digits of a 20-byte id." },
    { "errname", mod_errname, METH_O, "Symbolic name of a status." },
    { "strerror", mod_strerror, METH_O, "Text of a status." },
    { "reduce", mod_reduce, METH_VARARGS, "reduce(dst, src, dtype, op): dst op= src locally." },
    { NULL }
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "conflux._conflux",
    .m_doc = "CPython binding of libconflux (see the conflux package).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__conflux(void); /* the import hook: exported */
PyMODINIT_FUNC PyInit__conflux(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (make_errors(m) < 0 || PyType_Ready(&ContextType) < 0 || PyType_Ready(&GroupType) < 0 ||
        PyType_Ready(&RequestType) < 0 || PyType_Ready(&PSType) < 0 ||
        PyType_Ready(&ArenaType) < 0 ||
        PyModule_AddObjectRef(m, "Context", (PyObject *)&ContextType) < 0 ||
        PyModule_AddObjectRef(m, "Group", (PyObject *)&GroupType) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject *)&RequestType) < 0 ||
        PyModule_AddObjectRef(m, "ParameterServer", (PyObject *)&PSType) < 0 ||
        PyModule_AddObjectRef(m, "ArenaBuffer", (PyObject *)&ArenaType) < 0 ||
        PyModule_AddStringConstant(m, "LIB_VERSION", CFX_VERSION_STRING) < 0 ||
        PyModule_AddIntConstant(m, "OBJECT_ID_LEN", CFX_OBJECT_ID_LEN) < 0 ||
        PyModule_AddIntConstant(m, "OBJECT_INLINE_MAX", CFX_OBJECT_INLINE_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/*
 * _conflux_group.c: the Group type (blocking and non-blocking collectives)
 * and Request, a non-blocking collective in flight.
 */
#include "_conflux.h"

/* ---- Group ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ContextObject *owner;
    struct cfx_group *g;     /* NULL once destroyed */
    PyThread_type_lock lock; /* a group is used by one thread at a time */
    Py_ssize_t pending;      /* non-blocking requests not yet complete */
    int closing;             /* close() came while requests were pending */
    int destroyed;           /* the C group is gone (self->lock): a call that took the
                                group before a close() on another thread and its turn
                                after it must not use it */
    unsigned long holder;    /* the thread holding self->lock (atomic; 0: none) */
    unsigned long turns;     /* collectives handed to the library, refused ones too
                                (refuse_turn): _api.py tells by it whether a call it
                                refused itself took its turn */
} GroupObject;

static void group_lock(GroupObject *self)
{
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    __atomic_store_n(&self->holder, PyThread_get_thread_ident(), __ATOMIC_RELAXED);
}

static void group_unlock(GroupObject *self)
{
    __atomic_store_n(&self->holder, 0, __ATOMIC_RELAXED);
    PyThread_release_lock(self->lock);
}

/* A signal handler runs inside a blocking call of the group (the library
 * runs them in its waits: cfx__py_intr_begin): should it use the group
 * again, it would wait for the lock its own thread holds.  -1 with
 * RuntimeError then. */
static int group_reentered(GroupObject *self)
{
    if (__atomic_load_n(&self->holder, __ATOMIC_RELAXED) != PyThread_get_thread_ident())
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the group was used from a signal handler that ran "
                    "inside a call of the same group on this thread");
    return -1;
}

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
        group_lock(self);
        cfx_group_destroy(g);
        self->destroyed = 1;
        group_unlock(self);
        Py_END_ALLOW_THREADS
    }
    if (self->owner) {
        cfx__py_context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
}

/* A rank or size argument: an int in [@p lo, INT_MAX], else ValueError
 * naming it (TypeError when not an int). */
static int parse_rank_arg(PyObject *o, const char *what, long lo, int *out)
{
    long v;
    if (!PyIndex_Check(o)) { /* said by name: "'float' object cannot be interpreted ..." */
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.40s %R", what,
                     Py_TYPE(o)->tp_name, o);
        return -1;
    }
    if (cfx__py_long_sat(o, &v) < 0)
        return -1;
    if (v < lo || v > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "%s %R is out of range: 0 <= rank < size <= %d", what, o,
                     INT_MAX);
        return -1;
    }
    *out = (int)v;
    return 0;
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
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|zOOO", kwlist, &cfx__py_context_type, &ctxo,
                                     &name, &ranko, &sizeo, &timeout))
        return -1;
    ContextObject *c = (ContextObject *)ctxo;
    struct cfx_context *ctx = cfx__py_live_ctx(c);
    if (!ctx)
        return -1;
    struct cfx_group_params p = { 0 };
    int set = 0;
    if (cfx__py_parse_timeout(timeout, &p.timeout_ms, &set) < 0)
        return -1;
    if (set)
        p.field_mask |= CFX_GROUP_PARAM_TIMEOUT;
    if (name) {
        p.name = name;
        p.field_mask |= CFX_GROUP_PARAM_NAME;
    }
    if (ranko != Py_None) {
        if (parse_rank_arg(ranko, "rank", 0, &p.rank) < 0)
            return -1;
        p.field_mask |= CFX_GROUP_PARAM_RANK;
    }
    if (sizeo != Py_None) {
        if (parse_rank_arg(sizeo, "size", 1, &p.size) < 0)
            return -1;
        p.field_mask |= CFX_GROUP_PARAM_SIZE;
    }
    if (ranko != Py_None && sizeo != Py_None && p.rank >= p.size) {
        PyErr_Format(PyExc_ValueError, "rank %d is out of range: 0 <= rank < size (%d)", p.rank,
                     p.size);
        return -1;
    }
    if (!self->lock && !(self->lock = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        return -1;
    }
    struct cfx_group *g = NULL;
    int rc;
    int intr = cfx__py_intr_begin();
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_group_create(ctx, &p, &g);
    Py_END_ALLOW_THREADS
    if (cfx__py_intr_end(intr) < 0) { /* Ctrl-C: KeyboardInterrupt */
        if (g) { /* it completed all the same: the others' calls pair with none here */
            Py_BEGIN_ALLOW_THREADS
            cfx_group_destroy(g);
            Py_END_ALLOW_THREADS
        }
        return -1;
    }
    if (rc) {
        cfx__py_raise_status(rc);
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
        cfx__py_raise_status_detail(CFX_ERR_CLOSED, "the group is closed");
        return NULL;
    }
    return self->g;
}

static PyObject *Group_close(GroupObject *self, PyObject *unused)
{
    if (group_reentered(self) < 0)
        return NULL;
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
    GroupObject *group;      /* a collective's: keeps the group (and its context) alive */
    ContextObject *owner;    /* an object get's (group NULL): its context, one of its
                              * children until the get completes */
    struct cfx_request *req; /* NULL once complete and freed */
    Py_buffer sb, rb;        /* exported until completion: the library uses them */
    int have_sb, have_rb;
    int done;   /* complete: status, size and detail are final */
    int inside; /* threads in a wait or test of req without the GIL: req is
                 * freed (and the group or context let go) only by the last */
    int status; /* final status once complete */
    size_t size; /* a get's object size once complete */
    char *detail; /* a failure's cfx_last_error(), kept for every later wait() or test() */
} RequestObject;

/* A Request with nothing attached yet (its buffers, group or owner and
 * engine request are set by the caller that posts it). */
static RequestObject *request_alloc(void)
{
    RequestObject *ro = PyObject_New(RequestObject, &cfx__py_request_type);
    if (!ro)
        return NULL;
    ro->group = NULL;
    ro->owner = NULL;
    ro->req = NULL;
    ro->have_sb = ro->have_rb = 0;
    ro->done = 0;
    ro->inside = 0;
    ro->status = 0;
    ro->size = 0;
    ro->detail = NULL;
    return ro;
}

/* The request finished with @p status: record its outcome and give back its
 * buffers, once (the first thread to see it end; the others find done set).
 * Called with req alive: it is freed only by request_release(). */
static void request_finish(RequestObject *self, int status)
{
    if (self->done)
        return;
    self->done = 1;
    self->size = cfx_request_size(self->req);
    if (status != CFX_OK && !self->detail) /* before anything below calls the library */
        self->detail = strdup(cfx_last_error());
    self->status = status;
    if (self->have_sb)
        PyBuffer_Release(&self->sb);
    if (self->have_rb)
        PyBuffer_Release(&self->rb);
    self->have_sb = self->have_rb = 0;
}

/* Once complete and no other thread is inside a wait or test of it: free
 * the C request and let go of the group (or context) it counted in; that
 * may destroy the group or the context, which the request's lock lives in,
 * so never while a thread still uses it. */
static void request_release(RequestObject *self)
{
    if (!self->done || self->inside > 0 || !self->req)
        return;
    struct cfx_request *req = self->req;
    self->req = NULL;
    cfx_request_free(req);
    if (self->owner) {
        cfx__py_context_child_gone(self->owner);
        return;
    }
    GroupObject *g = self->group;
    if (--g->pending == 0 && g->closing) {
        g->closing = 0;
        group_destroy_now(g);
    }
}

static PyObject *request_raise(RequestObject *self)
{
    return cfx__py_raise_status_detail(self->status, self->detail ? self->detail : "");
}

static int rq_wait(void *req, int ms)
{
    return cfx_request_wait(req, ms);
}

static int rq_test(void *req)
{
    return cfx_request_test(req);
}

/* wait(timeout_ms=None): None waits for the operation, which ends by its own
 * deadline (the group's or the call's timeout).  On the main thread a signal
 * handler's exception (Ctrl-C) ends the wait within a slice and leaves the
 * operation running, as a timeout does. */
static PyObject *Request_wait(RequestObject *self, PyObject *args, PyObject *kw)
{
    int ms;
    if (cfx__py_wait_args(args, kw, &ms) < 0)
        return NULL;
    if (!self->done && self->req) {
        struct cfx_request *req = self->req; /* alive while this thread is inside */
        char why[512] = "";
        int rc;
        self->inside++;
        rc = cfx__py_wait_sliced(req, ms, rq_wait, rq_test, why, sizeof(why));
        self->inside--;
        if (rc != CFX_ERR_AGAIN && rc != CFX_PY_INTERRUPTED)
            request_finish(self, rc); /* no-op when another thread was first */
        request_release(self);
        if (rc == CFX_PY_INTERRUPTED) /* Ctrl-C: it runs on, as after a timeout */
            return NULL;
        if (!self->done) /* still running: wait again later */
            return cfx__py_raise_status_detail(CFX_ERR_TIMEOUT, why);
    }
    if (self->status)
        return request_raise(self);
    Py_RETURN_NONE;
}

/* test() -> True once complete (raising its error if it failed), else False. */
static PyObject *Request_test(RequestObject *self, PyObject *unused)
{
    if (!self->done && self->req) {
        int rc = cfx_request_test(self->req); /* with the GIL: nobody frees req meanwhile */
        if (rc == CFX_ERR_AGAIN)
            Py_RETURN_FALSE;
        request_finish(self, rc);
        request_release(self);
    }
    if (self->status)
        return request_raise(self);
    Py_RETURN_TRUE;
}

/* progress() -> (done, total): bytes of a get landed in order in its buffer
 * so far, of the object's size; total is None while the size is not known
 * (looking up a source).  Raises the get's error once it failed, and
 * UnsupportedError for a collective's request (cfx_request_progress). */
static PyObject *Request_progress(RequestObject *self, PyObject *unused)
{
    uint64_t done = 0, total = 0;
    if (!self->done && self->req) {
        int rc = cfx_request_progress(self->req, &done, &total);
        if (rc == CFX_ERR_AGAIN)
            return Py_BuildValue("(KO)", 0ULL, Py_None);
        if (rc)
            return cfx__py_raise_status(rc);
        return Py_BuildValue("(KK)", (unsigned long long)done, (unsigned long long)total);
    }
    if (!self->owner) { /* the request is freed; the library says so of a running one */
        return cfx__py_raise_status_detail(CFX_ERR_UNSUPPORTED,
                                           "a collective's request has no byte count");
    }
    if (self->status)
        return request_raise(self);
    return Py_BuildValue("(KK)", (unsigned long long)self->size, (unsigned long long)self->size);
}

PyObject *cfx__py_request_get_nb(ContextObject *owner, const struct cfx_object_id *id,
                                 PyObject *bufo, const struct cfx_obj_params *p)
{
    struct cfx_context *ctx = cfx__py_live_ctx(owner);
    if (!ctx)
        return NULL;
    RequestObject *ro = request_alloc();
    if (!ro)
        return NULL;
    if (PyObject_GetBuffer(bufo, &ro->rb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(ro);
        return NULL;
    }
    ro->have_rb = 1;
    struct cfx_request *req = NULL;
    int rc = cfx_get_nb(ctx, id, ro->rb.buf, (size_t)ro->rb.len, p, &req);
    if (rc) {
        Py_DECREF(ro); /* releases the buffer */
        return cfx__py_raise_status(rc);
    }
    ro->req = req;
    ro->owner = (ContextObject *)Py_NewRef((PyObject *)owner);
    owner->children++; /* a close() waits for the get to end */
    return (PyObject *)ro;
}

static void Request_dealloc(RequestObject *self)
{
    if (!self->done && self->req && self->owner) {
        /* a get dropped while running is canceled: cfx_request_free()
         * withdraws it before it returns (nothing lands in the buffer from
         * then on), so the buffer may go right after, without waiting out
         * the get's deadline */
        struct cfx_request *req = self->req;
        self->req = NULL;
        Py_BEGIN_ALLOW_THREADS
        cfx_request_free(req);
        Py_END_ALLOW_THREADS
        request_finish(self, CFX_ERR_CANCELED);
        cfx__py_context_child_gone(self->owner);
    } else if (!self->done && self->req) {
        /* a collective dropped while running runs to its end, as the other
         * ranks expect (torch's Work does the same); the library still
         * uses the buffers until then */
        struct cfx_request *req = self->req;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_request_wait(req, -1); /* bounded by the operation's own deadline */
        Py_END_ALLOW_THREADS
        request_finish(self, rc);
    }
    request_release(self); /* no thread is inside a wait of it any more */
    if (self->have_rb) /* a get that was never posted */
        PyBuffer_Release(&self->rb);
    Py_CLEAR(self->group);
    Py_CLEAR(self->owner);
    free(self->detail);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Request_methods[] = {
    { "wait", (PyCFunction)(void (*)(void))Request_wait, METH_VARARGS | METH_KEYWORDS,
      "wait(timeout_ms=None): until complete; raises the operation's error." },
    { "test", (PyCFunction)Request_test, METH_NOARGS,
      "test() -> bool: complete yet? (raises the operation's error)" },
    { "progress", (PyCFunction)Request_progress, METH_NOARGS,
      "progress() -> (done, total): a get's bytes landed of the object's size (total None "
      "until known); UnsupportedError for a collective" },
    { 0 } /* sentinel */
};

PyTypeObject cfx__py_request_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.Request",
    .tp_basicsize = sizeof(RequestObject),
    .tp_dealloc = (destructor)Request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-blocking collective or object get in flight; its buffers stay exported "
              "until it completes.",
    .tp_methods = Request_methods,
};

/*
 * This rank's @p kind call was refused before the library saw it (an
 * argument this module or _api.py turned down).  It still takes its turn
 * in the group's call order, and the other ranks hear of the refusal at
 * once, as for a call the library refuses itself (coll.c coll_refused):
 * left out, this rank's next call paired with the others' this one, and one
 * of the same arguments passed the argument check and reduced the wrong
 * data.  The library is handed arguments it refuses itself (a 0 ms
 * deadline, an unknown dtype, no buffers), which it answers exactly so.
 * The caller's Python error stands.  Point-to-point calls are matched by
 * tag, not by turn: nothing to do.
 */
static void refuse_turn(GroupObject *self, enum coll_kind kind, int nb)
{
    if (kind == K_SEND || kind == K_RECV || !self->g ||
        __atomic_load_n(&self->holder, __ATOMIC_RELAXED) == PyThread_get_thread_ident())
        return; /* closed, or inside a call of its own (group_reentered) */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    struct cfx_group *g = self->g;
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 0 };
    const enum cfx_dtype bad = (enum cfx_dtype)255;
    struct cfx_request *req = NULL;
    self->turns++;
    Py_BEGIN_ALLOW_THREADS
    group_lock(self);
    switch (self->destroyed ? -1 : (int)kind) {
    case K_ALLREDUCE:
        (void)(nb ? cfx_group_iallreduce(g, NULL, NULL, 1, bad, CFX_OP_SUM, &p, &req)
                  : cfx_group_allreduce(g, NULL, NULL, 1, bad, CFX_OP_SUM, &p));
        break;
    case K_BROADCAST:
        (void)(nb ? cfx_group_ibroadcast(g, NULL, 1, bad, 0, &p, &req)
                  : cfx_group_broadcast(g, NULL, 1, bad, 0, &p));
        break;
    case K_REDUCE:
        (void)(nb ? cfx_group_ireduce(g, NULL, NULL, 1, bad, CFX_OP_SUM, 0, &p, &req)
                  : cfx_group_reduce(g, NULL, NULL, 1, bad, CFX_OP_SUM, 0, &p));
        break;
    case K_ALLGATHER:
        (void)(nb ? cfx_group_iallgather(g, NULL, NULL, 1, bad, &p, &req)
                  : cfx_group_allgather(g, NULL, NULL, 1, bad, &p));
        break;
    case K_REDUCE_SCATTER: cfx_group_reduce_scatter(g, NULL, NULL, 1, bad, CFX_OP_SUM, &p); break;
    case K_GATHER: cfx_group_gather(g, NULL, NULL, 1, bad, 0, &p); break;
    case K_SCATTER: cfx_group_scatter(g, NULL, NULL, 1, bad, 0, &p); break;
    case K_ALLTOALL: cfx_group_alltoall(g, NULL, NULL, 1, bad, &p); break;
    case K_BARRIER: cfx_group_barrier(g, &p); break;
    default: break;
    }
    group_unlock(self);
    Py_END_ALLOW_THREADS
    if (req) /* not reached: a refused call hands out no request */
        cfx_request_free(req);
    PyErr_Restore(et, ev, tb);
}

/* One entry point for every collective: buffers are checked against the
 * sizes the C call will touch, so no call reads or writes past a buffer.
 * A call refused here still takes its turn (refuse_turn). */
static PyObject *group_coll_run(GroupObject *self, enum coll_kind kind, int nb, PyObject *args,
                                PyObject *kw);

static PyObject *group_coll(GroupObject *self, enum coll_kind kind, int nb, PyObject *args,
                            PyObject *kw)
{
    unsigned long turns = self->turns;
    PyObject *ret = group_coll_run(self, kind, nb, args, kw);
    if (!ret && self->turns == turns)
        refuse_turn(self, kind, nb);
    return ret;
}

static PyObject *group_coll_run(GroupObject *self, enum coll_kind kind, int nb, PyObject *args,
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
    if (!g || group_reentered(self) < 0 || cfx__py_check_dtype(dtype) < 0)
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return NULL;
    }
    struct cfx_coll_params p = { 0 };
    int set = 0;
    if (cfx__py_parse_timeout(timeout, &p.timeout_ms, &set) < 0)
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
        RequestObject *ro = request_alloc();
        if (!ro)
            goto out;
        struct cfx_request *req = NULL;
        int gone;
        /* counted before the GIL goes: a close() on another thread while
         * this call waits for its turn or has just posted defers to it (it
         * would otherwise destroy the group, and let the context go, under
         * a request not counted yet) */
        self->pending++;
        self->turns++;
        Py_BEGIN_ALLOW_THREADS
        group_lock(self);
        switch (self->destroyed ? -1 : (int)kind) {
        case K_ALLREDUCE: rc = cfx_group_iallreduce(g, s, r, cnt, dt, rop, &p, &req); break;
        case K_BROADCAST: rc = cfx_group_ibroadcast(g, r, cnt, dt, root, &p, &req); break;
        case K_REDUCE: rc = cfx_group_ireduce(g, s, r, cnt, dt, rop, root, &p, &req); break;
        case K_ALLGATHER: rc = cfx_group_iallgather(g, s, r, cnt, dt, &p, &req); break;
        default: break;
        }
        gone = self->destroyed;
        group_unlock(self);
        Py_END_ALLOW_THREADS
        if (gone || rc) {
            Py_DECREF(ro);
            if (gone)
                cfx__py_raise_status_detail(CFX_ERR_CLOSED, "the group was closed (on another "
                                            "thread) while this call waited for its turn");
            else
                cfx__py_raise_status(rc);
            if (--self->pending == 0 && self->closing) { /* a close() deferred to it */
                self->closing = 0;
                group_destroy_now(self);
            }
            goto out;
        }
        ro->req = req;
        ro->group = (GroupObject *)Py_NewRef(self);
        ro->sb = sb;
        ro->rb = rb;
        ro->have_sb = have_sb;
        ro->have_rb = have_rb;
        have_sb = have_rb = 0; /* moved into the request */
        ret = (PyObject *)ro;
        goto out;
    }
    int gone;
    int intr = cfx__py_intr_begin();
    self->turns++;
    Py_BEGIN_ALLOW_THREADS
    group_lock(self);
    switch (self->destroyed ? -1 : (int)kind) {
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
    default: break; /* closed on another thread meanwhile */
    }
    gone = self->destroyed;
    group_unlock(self);
    Py_END_ALLOW_THREADS
    if (cfx__py_intr_end(intr) < 0)
        ; /* Ctrl-C: KeyboardInterrupt (the call canceled, or complete all the same) */
    else if (gone)
        cfx__py_raise_status_detail(CFX_ERR_CLOSED, "the group was closed (on another thread) "
                                    "while this call waited for its turn");
    else if (rc)
        cfx__py_raise_status(rc);
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

/* _refuse(kind, nb): the call of @p kind (its name) that _api.py refused
 * before reaching this module takes its turn all the same (refuse_turn). */
static PyObject *Group_refuse(GroupObject *self, PyObject *args)
{
    static const char *const names[] = { "allreduce", "broadcast", "reduce", "allgather",
                                         "reduce_scatter", "gather", "scatter", "alltoall",
                                         "send", "recv", "barrier" };
    const char *name;
    int nb = 0;
    if (!PyArg_ParseTuple(args, "s|p", &name, &nb))
        return NULL;
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
        if (!strcmp(name, names[k])) {
            refuse_turn(self, (enum coll_kind)k, nb);
            Py_RETURN_NONE;
        }
    PyErr_Format(PyExc_ValueError, "no collective is called '%s'", name);
    return NULL;
}

static PyObject *Group_get_turns(GroupObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(self->turns);
}

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
    { "_refuse", (PyCFunction)Group_refuse, METH_VARARGS,
      "_refuse(kind, nb=False): a call refused before it got here takes its turn" },
    { 0 } /* sentinel */
};

static PyGetSetDef Group_getset[] = {
    { "rank", (getter)Group_get_rank, NULL, "This process's rank.", NULL },
    { "size", (getter)Group_get_size, NULL, "Number of ranks.", NULL },
    { "_turns", (getter)Group_get_turns, NULL, "Collectives that took their turn.", NULL },
    { 0 } /* sentinel */
};

PyTypeObject cfx__py_group_type = {
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

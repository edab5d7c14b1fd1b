/*
 * _conflux_ps.c: the ParameterServer type (server, scheduler and worker roles).
 */
#include "_conflux.h"

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
        cfx__py_context_child_gone(self->owner);
        Py_CLEAR(self->owner);
    }
}

static void ps_undo(void *ps)
{
    cfx_ps_destroy(ps);
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
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|ziiiiiinidddddddO", kwlist,
                                     &cfx__py_context_type, &ctxo, &job, &role, &index, &nw, &ns,
                                     &cons, &stale, &block, &opt, &lr, &mom, &b1, &b2, &eps, &wd,
                                     &gs, &timeout))
        return -1;
    ContextObject *c = (ContextObject *)ctxo;
    struct cfx_context *ctx = cfx__py_live_ctx(c);
    if (!ctx)
        return -1;
    struct cfx_ps_params p = { 0 };
    int set = 0;
    if (cfx__py_parse_timeout(timeout, &p.timeout_ms, &set) < 0)
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
    int intr = cfx__py_intr_begin(); /* Ctrl-C ends its wait for the job's members */
    Py_BEGIN_ALLOW_THREADS
    rc = cfx_ps_create(ctx, &p, &ps);
    Py_END_ALLOW_THREADS
    if (cfx__py_intr_end_undo(intr, ps_undo, ps) < 0)
        return -1; /* KeyboardInterrupt, or the handler's exception */
    if (rc) {
        cfx__py_raise_status(rc);
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
        cfx__py_raise_status_detail(CFX_ERR_CLOSED, "the parameter-server handle is closed");
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
        return cfx__py_raise_status(rc);
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
    if (!ps || cfx__py_check_dtype(dtype) < 0)
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
        return cfx__py_raise_status(rc);
    PyObject *k = PyLong_FromLong(key), *b = PyLong_FromSize_t(bytes);
    if (!k || !b || PyDict_SetItem(self->sizes, k, b) < 0) {
        Py_XDECREF(k);
        Py_XDECREF(b);
        return NULL;
    }
    Py_DECREF(b);
    return k;
}

/* ---- PSRequest: a non-blocking push / pull / pushpull ------------------------- */

/* Its buffers stay exported until its end is seen; the C request is freed
 * once it ended and no thread is inside a wait of it.  Dropped while
 * running, it waits for the end first (bounded by the op's own deadline):
 * the library writes into the output until then. */
typedef struct {
    PyObject_HEAD
    struct cfx_ps_request *req;
    Py_buffer gb, ob;
    int have_g, have_o;
    int done, status;
    int inside;     /* threads in a wait without the GIL */
    char *detail;   /* the failure's text */
} PSRequestObject;

static void psreq_finish(PSRequestObject *r, int rc, const char *why)
{
    if (r->done)
        return;
    r->done = 1;
    r->status = rc;
    if (rc && why && !r->detail) {
        size_t n = strlen(why) + 1;
        if ((r->detail = malloc(n)))
            memcpy(r->detail, why, n);
    }
    if (r->have_g)
        PyBuffer_Release(&r->gb);
    if (r->have_o)
        PyBuffer_Release(&r->ob);
    r->have_g = r->have_o = 0;
}

static void psreq_release(PSRequestObject *r)
{
    if (r->done && !r->inside && r->req) {
        cfx_ps_request_free(r->req);
        r->req = NULL;
    }
}

static PyObject *psreq_result(PSRequestObject *r)
{
    if (r->status)
        return cfx__py_raise_status_detail(r->status, r->detail ? r->detail : "");
    Py_RETURN_NONE;
}

static int psrq_wait(void *req, int ms)
{
    return cfx_ps_wait(req, ms);
}

static int psrq_test(void *req)
{
    return cfx_ps_test(req);
}

/* wait(timeout_ms=None): until its end (raising its error); TimeoutError,
 * or a signal handler's exception (Ctrl-C, on the main thread), leaves it
 * running. */
static PyObject *PSRequest_wait(PSRequestObject *self, PyObject *args, PyObject *kw)
{
    int ms;
    if (cfx__py_wait_args(args, kw, &ms) < 0)
        return NULL;
    if (!self->done && self->req) {
        struct cfx_ps_request *req = self->req; /* alive while a thread is inside */
        char why[512] = "";
        int rc;
        self->inside++;
        rc = cfx__py_wait_sliced(req, ms, psrq_wait, psrq_test, why, sizeof(why));
        self->inside--;
        if (rc != CFX_ERR_AGAIN && rc != CFX_PY_INTERRUPTED)
            psreq_finish(self, rc, why);
        psreq_release(self);
        if (rc == CFX_PY_INTERRUPTED) /* Ctrl-C: it runs on, as after a timeout */
            return NULL;
        if (!self->done)
            return cfx__py_raise_status_detail(CFX_ERR_TIMEOUT, why);
    }
    return psreq_result(self);
}

/* test() -> True once ended (raising its error if it failed), else False. */
static PyObject *PSRequest_test(PSRequestObject *self, PyObject *unused)
{
    (void)unused;
    if (!self->done && self->req) {
        if (cfx_ps_test(self->req) == CFX_ERR_AGAIN)
            Py_RETURN_FALSE;
        int rc = cfx_ps_wait(self->req, 0); /* ended: its status and text at once */
        psreq_finish(self, rc, cfx_last_error());
        psreq_release(self);
    }
    if (self->status)
        return psreq_result(self);
    Py_RETURN_TRUE;
}

static void PSRequest_dealloc(PSRequestObject *self)
{
    if (!self->done && self->req) {
        struct cfx_ps_request *req = self->req;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = cfx_ps_wait(req, -1); /* bounded by the op's own deadline */
        Py_END_ALLOW_THREADS
        psreq_finish(self, rc, NULL);
    }
    psreq_finish(self, CFX_OK, NULL); /* buffers of one never posted */
    psreq_release(self);
    free(self->detail);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef PSRequest_methods[] = {
    { "wait", (PyCFunction)(void (*)(void))PSRequest_wait, METH_VARARGS | METH_KEYWORDS,
      "wait(timeout_ms=None): until it ended; raises its error." },
    { "test", (PyCFunction)PSRequest_test, METH_NOARGS,
      "test() -> bool: ended yet? (raises its error)" },
    { 0 } /* sentinel */
};

static PyTypeObject psreq_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.PSRequest",
    .tp_basicsize = sizeof(PSRequestObject),
    .tp_dealloc = (destructor)PSRequest_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A non-blocking parameter-server push, pull or pushpull; its buffers stay "
              "exported until it ended.",
    .tp_methods = PSRequest_methods,
};

int cfx__py_ps_ready(PyObject *m)
{
    if (PyType_Ready(&psreq_type) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "PSRequest", (PyObject *)&psreq_type);
}

/* A blocking push, pull or pushpull on the main thread: @p r (consumed),
 * just posted, waited for in slices; cfx_ps_push() and the others post and
 * wait the same way, so this costs no more.  Interrupted (Ctrl-C), the op
 * is canceled: cfx_ps_request_free() returns once the library is done with
 * its buffers (a reply already landing is let finish; a push's blocks still
 * on their way go on with a copy, so some servers may have applied it), and
 * they are let go before KeyboardInterrupt reaches the caller. */
static PyObject *psreq_block(PSObject *self, PSRequestObject *r)
{
    char why[512] = "";
    self->busy++; /* a close() meanwhile waits for this call, as for a blocking one */
    int rc = cfx__py_wait_sliced(r->req, -1, psrq_wait, psrq_test, why, sizeof(why));
    if (rc == CFX_PY_INTERRUPTED) {
        PyObject *exc = cfx__py_exc_take(); /* the cleanup may run Python code */
        struct cfx_ps_request *req = r->req;
        r->req = NULL;
        Py_BEGIN_ALLOW_THREADS
        cfx_ps_request_free(req);
        Py_END_ALLOW_THREADS
        psreq_finish(r, CFX_ERR_CANCELED, NULL);
        Py_DECREF(r);
        ps_leave(self);
        cfx__py_exc_put(exc);
        return NULL;
    }
    psreq_finish(r, rc, why);
    psreq_release(r);
    ps_leave(self);
    PyObject *res = psreq_result(r);
    Py_DECREF(r);
    return res;
}

enum ps_op { PS_PUSH, PS_PULL, PS_PUSHPULL };

static PyObject *ps_op(PSObject *self, enum ps_op op, PyObject *args)
{
    int key, nb = 0;
    PyObject *a = Py_None, *b = Py_None;
    int ok = op == PS_PUSHPULL ? PyArg_ParseTuple(args, "iOO|p", &key, &a, &b, &nb)
                               : PyArg_ParseTuple(args, "iO|p", &key, &a, &nb);
    if (!ok)
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
            /* ValueError, as pull's (not a bare KeyError) */
            PyErr_Format(PyExc_ValueError, "tensor %d was not registered on this worker "
                         "(register it first)", key);
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
    /* On the main thread a blocking call is its request and a sliced wait
     * (psreq_block), so that Ctrl-C ends it; elsewhere nothing could raise
     * between slices, and the C call does the same */
    if (nb || cfx__py_main_thread()) {
        PSRequestObject *r = PyObject_New(PSRequestObject, &psreq_type);
        if (!r)
            goto fail;
        r->req = NULL;
        r->gb = gb;
        r->ob = ob;
        r->have_g = have_g;
        r->have_o = have_o;
        r->done = r->status = r->inside = 0;
        r->detail = NULL;
        have_g = have_o = 0; /* the request's now: released when it ends */
        if (op == PS_PUSH)
            rc = cfx_ps_ipush(ps, key, r->gb.buf, &r->req);
        else if (op == PS_PULL)
            rc = cfx_ps_ipull(ps, key, r->ob.buf, &r->req);
        else
            rc = cfx_ps_ipushpull(ps, key, r->gb.buf, r->ob.buf, &r->req);
        if (rc) { /* no request exists */
            cfx__py_raise_status(rc);
            Py_DECREF(r);
            return NULL;
        }
        return nb ? (PyObject *)r : psreq_block(self, r);
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
        cfx__py_raise_status(rc);
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

/* ---- statistics and administration ------------------------------------------ */

static const char *server_state(int s)
{
    switch (s) {
    case CFX_PS_SERVER_ACTIVE: return "active";
    case CFX_PS_SERVER_STANDBY: return "standby";
    case CFX_PS_SERVER_DRAINING: return "draining";
    case CFX_PS_SERVER_RETIRED: return "retired";
    case CFX_PS_SERVER_FAILED: return "failed";
    default: return "unknown";
    }
}

/* A handle's or a job's view as a dict (servers: a list of dicts). */
static PyObject *stats_dict(const struct cfx_ps_stats *s)
{
    PyObject *servers = PyList_New(0);
    if (!servers)
        return NULL;
    for (uint32_t i = 0; i < s->nservers && i < sizeof(s->servers) / sizeof(s->servers[0]);
         i++) {
        const struct cfx_ps_server_info *v = &s->servers[i];
        PyObject *d = Py_BuildValue("{s:i,s:k,s:s,s:k,s:K,s:d,s:O}", "index", v->index,
                                    "node_id", (unsigned long)v->node_id, "state",
                                    server_state(v->state), "blocks", (unsigned long)v->blocks,
                                    "bytes", (unsigned long long)v->bytes, "ns_per_byte",
                                    v->ns_per_byte, "straggler",
                                    v->straggler ? Py_True : Py_False);
        if (!d || PyList_Append(servers, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(servers);
            return NULL;
        }
        Py_DECREF(d);
    }
    return Py_BuildValue("{s:k,s:N,s:k,s:k,s:K,s:K,s:K,s:K,s:K,s:K}", "map_version",
                         (unsigned long)s->map_version, "servers", servers, "tensors",
                         (unsigned long)s->ntensors, "blocks", (unsigned long)s->nblocks,
                         "migrations_out", (unsigned long long)s->migrations_out,
                         "migrations_in", (unsigned long long)s->migrations_in, "forwarded",
                         (unsigned long long)s->forwarded, "redirects",
                         (unsigned long long)s->redirects, "rebalances",
                         (unsigned long long)s->rebalances, "lost_steps",
                         (unsigned long long)s->lost_steps);
}

static PyObject *PS_stats(PSObject *self, PyObject *unused)
{
    (void)unused;
    struct cfx_ps *ps = live_ps(self);
    if (!ps)
        return NULL;
    struct cfx_ps_stats st;
    int rc = cfx_ps_stats(ps, &st); /* a snapshot under the handle's lock: no wait */
    if (rc)
        return cfx__py_raise_status(rc);
    return stats_dict(&st);
}

/* ps_admin(context, op, job, value, timeout_ms) -> (server, map_version)
 * op: "add" (value: a server index, or -1: the one placement chooses),
 * "remove" (value: a server index), "rebalance", "auto" (value: 0 or 1),
 * "shards" (returns the stats dict instead). */
static PyObject *mod_ps_admin(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *ctxo;
    const char *op, *job;
    int value, timeout_ms;
    if (!PyArg_ParseTuple(args, "O!ssii", &cfx__py_context_type, &ctxo, &op, &job, &value,
                          &timeout_ms))
        return NULL;
    ContextObject *c = (ContextObject *)ctxo;
    struct cfx_context *ctx = cfx__py_live_ctx(c);
    if (!ctx)
        return NULL;
    enum { ADD, REMOVE, REBALANCE, AUTO, SHARDS } which;
    if (!strcmp(op, "add"))
        which = ADD;
    else if (!strcmp(op, "remove"))
        which = REMOVE;
    else if (!strcmp(op, "rebalance"))
        which = REBALANCE;
    else if (!strcmp(op, "auto"))
        which = AUTO;
    else if (!strcmp(op, "shards"))
        which = SHARDS;
    else
        return PyErr_Format(PyExc_ValueError, "unknown parameter-server command %R", args);
    int rc, server = value;
    uint32_t version = 0;
    struct cfx_ps_stats st;
    c->children++;
    Py_BEGIN_ALLOW_THREADS
    switch (which) {
    case ADD:
        rc = value < 0 ? cfx_ps_add_server_auto(ctx, job, timeout_ms, &server, &version)
                       : cfx_ps_add_server(ctx, job, value, timeout_ms, &version);
        break;
    case REMOVE: rc = cfx_ps_remove_server(ctx, job, value, timeout_ms, &version); break;
    case REBALANCE: rc = cfx_ps_rebalance(ctx, job, timeout_ms, &version); break;
    case AUTO: rc = cfx_ps_set_auto(ctx, job, value, timeout_ms); break;
    default: rc = cfx_ps_shards(ctx, job, timeout_ms, &st); break;
    }
    Py_END_ALLOW_THREADS
    cfx__py_context_child_gone(c);
    if (rc)
        return cfx__py_raise_status(rc);
    if (which == SHARDS)
        return stats_dict(&st);
    return Py_BuildValue("(ik)", server, (unsigned long)version);
}

PyMethodDef cfx__py_ps_functions[] = {
    { "ps_admin", mod_ps_admin, METH_VARARGS,
      "ps_admin(context, op, job, value, timeout_ms): add/remove/rebalance/auto/shards" },
    { 0 } /* sentinel */
};

static PyMethodDef PS_methods[] = {
    { "close", (PyCFunction)PS_close, METH_NOARGS, "Leave the job." },
    { "serve", (PyCFunction)PS_serve, METH_VARARGS, "serve(timeout_ms): server loop." },
    { "register", (PyCFunction)PS_register, METH_VARARGS,
      "register(name, dtype, count, init=None) -> key" },
    { "push", (PyCFunction)PS_push, METH_VARARGS, "push(key, grad)" },
    { "pull", (PyCFunction)PS_pull, METH_VARARGS, "pull(key, out)" },
    { "pushpull", (PyCFunction)PS_pushpull, METH_VARARGS, "pushpull(key, grad, out)" },
    { "stats", (PyCFunction)PS_stats, METH_NOARGS, "stats() -> dict: this handle's view" },
    { 0 } /* sentinel */
};

PyTypeObject cfx__py_ps_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "conflux._conflux.ParameterServer",
    .tp_basicsize = sizeof(PSObject),
    .tp_dealloc = (destructor)PS_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Low-level parameter-server handle (see conflux.ParameterServer).",
    .tp_methods = PS_methods,
    .tp_init = (initproc)PS_init,
    .tp_new = PyType_GenericNew,
};

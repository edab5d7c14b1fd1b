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
 *
 * This file holds the module itself (init, module functions, exceptions and
 * argument helpers); the types live in _conflux_context.c (Context,
 * ArenaBuffer), _conflux_group.c (Group, Request) and _conflux_ps.c
 * (ParameterServer), sharing _conflux.h.
 */
#include "_conflux.h"

#include <pthread.h>
#include <time.h>

/* ---- errors ------------------------------------------------------------- */

static PyObject *error_base;             /* conflux.Error */
PyObject *cfx__py_error_types[N_STATUS]; /* per negative status; [0] unused */

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
 * thread, or the @p detail given) as attributes. */
PyObject *cfx__py_raise_status(int status)
{
    return cfx__py_raise_status_detail(status, cfx_last_error());
}

PyObject *cfx__py_raise_status_detail(int status, const char *detail)
{
    /* Ctrl-C during the call (one that does not wait in slices ran to its
     * deadline or failed meanwhile: the library's waits do not look at
     * Python's signals; a sliced wait's last slice ran out): raise
     * KeyboardInterrupt alone, not as an exception raised while handling
     * the call's error */
    if (PyErr_Occurred() || PyErr_CheckSignals() < 0) /* a handler raised in the call */
        return NULL;
    PyObject *type = error_base;
    if (status < 0 && status > CFX_STATUS_LAST && cfx__py_error_types[-status])
        type = cfx__py_error_types[-status];
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

/* The class-level attributes of an exception class: what an exception of it
 * made by hand (conflux.TimeoutError("x")) reads, where a raised one has
 * its own (set_attr above).  STATUS too, for the per-status classes. */
static PyObject *error_dict(int status, int with_const)
{
    PyObject *d = Py_BuildValue("{s:i,s:s,s:s,s:s}", "status", status, "name", cfx_errname(status),
                                "text", cfx_strerror(status), "detail", "");
    if (d && with_const && PyDict_SetItemString(d, "STATUS", PyDict_GetItemString(d, "status")) < 0)
        Py_CLEAR(d);
    return d;
}

static int make_errors(PyObject *m)
{
    /* conflux.Error made by hand names no status of its own: it reads as
     * CFX_ERR_INTERNAL (an int, as a raised one's status always is) */
    PyObject *dict = error_dict(CFX_ERR_INTERNAL, 0);
    if (!dict)
        return -1;
    error_base = PyErr_NewExceptionWithDoc(
        "conflux.Error",
        "A Conflux call failed.  Attributes: status (the negative cfx_status), "
        "name ('CFX_ERR_TIMEOUT'), text (cfx_strerror) and detail "
        "(cfx_last_error(): what was waited for, on which node, and why).  One made by "
        "hand has its class's status, name and text and an empty detail (conflux.Error "
        "itself: CFX_ERR_INTERNAL's).",
        NULL, dict);
    Py_DECREF(dict);
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
        dict = error_dict(s, 1);
        PyObject *t = dict ? PyErr_NewException(qual, bases, dict) : NULL;
        Py_XDECREF(dict);
        Py_DECREF(bases);
        if (!t)
            return -1;
        cfx__py_error_types[-s] = t;
        if (PyModule_AddObjectRef(m, cls, t) < 0)
            return -1;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------- */

int cfx__py_long_sat(PyObject *o, long *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        v = LONG_MAX; /* beyond a C long: out of range for every caller */
    }
    *out = v;
    return 0;
}

/* Timeout argument: None = leave unset (*set = 0); else milliseconds >= 0. */
int cfx__py_parse_timeout(PyObject *o, int *ms, int *set)
{
    *set = 0;
    if (o == NULL || o == Py_None)
        return 0;
    if (PyBool_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "timeout_ms is a number of milliseconds, not %s %R",
                     Py_TYPE(o)->tp_name, o);
        return -1;
    }
    long v;
    if (cfx__py_long_sat(o, &v) < 0)
        return -1;
    if (v < 0 || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError,
                     "timeout_ms must be between 0 and 2147483647 milliseconds (2147483.647 s), "
                     "not %R (every call has a deadline)",
                     o);
        return -1;
    }
    *ms = (int)v;
    *set = 1;
    return 0;
}

int cfx__py_wait_args(PyObject *args, PyObject *kw, int *ms)
{
    static char *kwlist[] = { "timeout_ms", NULL };
    PyObject *timeout = Py_None;
    int set = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout) ||
        cfx__py_parse_timeout(timeout, ms, &set) < 0)
        return -1;
    if (!set)
        *ms = -1;
    return 0;
}

/* ---- waits that let Python's signal handlers run --------------------------- */

/* The thread CPython runs signal handlers on (its main thread): the only one
 * where PyErr_CheckSignals() can raise, so the only one whose waits are
 * sliced.  Set at import, and in a forked child to the thread that forked,
 * which CPython makes the child's main thread. */
static unsigned long main_thread;

static void main_thread_after_fork(void)
{
    main_thread = PyThread_get_thread_ident();
}

static int main_thread_init(void)
{
    PyObject *mt = NULL, *ident = NULL, *threading = PyImport_ImportModule("threading");
    if (threading && (mt = PyObject_CallMethod(threading, "main_thread", NULL)))
        ident = PyObject_GetAttrString(mt, "ident");
    if (ident)
        main_thread = PyLong_AsUnsignedLong(ident);
    Py_XDECREF(ident);
    Py_XDECREF(mt);
    Py_XDECREF(threading);
    if (PyErr_Occurred())
        return -1;
    if (pthread_atfork(NULL, NULL, main_thread_after_fork)) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_atfork failed");
        return -1;
    }
    return 0;
}

int cfx__py_main_thread(void)
{
    return PyThread_get_thread_ident() == main_thread;
}

/* The library's interrupt check on the main thread, called without the
 * GIL and without any lock of the library: Python's signal handlers run. */
static int interrupt_check(void *arg)
{
    (void)arg;
    PyGILState_STATE st = PyGILState_Ensure();
    int stop = PyErr_CheckSignals() < 0;
    PyGILState_Release(st);
    return stop;
}

/* Calls with the check set on this thread: a signal handler the check ran
 * may make a call of its own, which must leave the outer call's check in
 * place (main thread only, with the GIL). */
static int intr_depth;

int cfx__py_intr_begin(void)
{
    if (!cfx__py_main_thread())
        return 0;
    if (!intr_depth++)
        cfx_set_interrupt_check(interrupt_check, NULL);
    return 1;
}

int cfx__py_intr_end(int token)
{
    if (token && !--intr_depth)
        cfx_set_interrupt_check(NULL, NULL);
    return token && PyErr_Occurred() ? -1 : 0;
}

int cfx__py_intr_end_undo(int token, void (*undo)(void *), void *obj)
{
    if (cfx__py_intr_end(token) == 0)
        return 0;
    if (obj) { /* it was made as the check ran */
        Py_BEGIN_ALLOW_THREADS
        undo(obj);
        Py_END_ALLOW_THREADS
    }
    return -1;
}

/* One wait without the GIL: @p wait(req, ms) and, when that times out,
 * @p test(req), since the operation may have ended meanwhile.  Its final
 * status, or CFX_ERR_AGAIN while it runs on; @p why gets the failure's (or
 * the wait's timeout's) text. */
static int wait_req(void *req, int ms, int (*wait)(void *req, int ms), int (*test)(void *req),
                    char *why, size_t len)
{
    int rc = wait(req, ms);
    if (rc == CFX_ERR_TIMEOUT) {
        snprintf(why, len, "%s", cfx_last_error());
        int st = test(req);
        if (st == CFX_ERR_AGAIN)
            return st;
        rc = wait(req, 0); /* ended: its own status, and its text */
    }
    if (rc)
        snprintf(why, len, "%s", cfx_last_error());
    return rc;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A wait that ran out after slices: its text ("... still running after
 * 37 ms") names the last slice; make it name the whole wait. */
static void why_whole(char *why, size_t len, int slice, int ms)
{
    char was[32], tail[512];
    snprintf(was, sizeof(was), "after %d ms", slice);
    char *p = strstr(why, was);
    if (!p)
        return;
    snprintf(tail, sizeof(tail), "%s", p + strlen(was));
    snprintf(p, len - (size_t)(p - why), "after %d ms%s", ms, tail);
}

int cfx__py_wait_sliced(void *req, int ms, int (*wait)(void *req, int ms), int (*test)(void *req),
                        char *why, size_t len)
{
    int rc;
    if (!cfx__py_main_thread() || (ms >= 0 && ms <= CFX_PY_SLICE_MS)) {
        /* nothing to look at between slices (a signal handler raises on the
         * main thread only), or a single slice: the raise of its timeout
         * looks at the signals first (cfx__py_raise_status_detail) */
        Py_BEGIN_ALLOW_THREADS
        rc = wait_req(req, ms, wait, test, why, len);
        Py_END_ALLOW_THREADS
        return rc;
    }
    uint64_t end = ms >= 0 ? now_ms() + (uint64_t)ms : 0;
    for (;;) {
        int slice = CFX_PY_SLICE_MS;
        if (ms >= 0) {
            uint64_t now = now_ms();
            if (now >= end)
                slice = 0;
            else if (end - now < (uint64_t)slice)
                slice = (int)(end - now);
        }
        Py_BEGIN_ALLOW_THREADS
        rc = wait_req(req, slice, wait, test, why, len);
        Py_END_ALLOW_THREADS
        if (rc != CFX_ERR_AGAIN)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return CFX_PY_INTERRUPTED;
        if (ms >= 0 && now_ms() >= end) {
            why_whole(why, len, slice, ms);
            return CFX_ERR_AGAIN;
        }
    }
}

PyObject *cfx__py_exc_take(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

void cfx__py_exc_put(PyObject *exc)
{
    if (!exc)
        return;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

int cfx__py_parse_id(PyObject *o, struct cfx_object_id *id)
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

int cfx__py_check_dtype(int dtype)
{
    if (dtype < 0 || dtype >= CFX_DTYPE_LAST) {
        PyErr_Format(PyExc_ValueError, "unknown dtype code %d", dtype);
        return -1;
    }
    return 0;
}

/* ---- module functions ---------------------------------------------------- */

/* @p arg as UTF-8 for the C layer, which reads up to the first NUL: a
 * string holding one is a ValueError naming @p what (cut there, "w\0a" and
 * "w\0b" would both be "w"). */
static const char *utf8_without_nul(PyObject *arg, const char *what)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &len);
    if (s && strlen(s) != (size_t)len) {
        PyErr_Format(PyExc_ValueError, "%s %R holds a NUL character", what, arg);
        return NULL;
    }
    return s;
}

static PyObject *mod_id_from_name(PyObject *self, PyObject *arg)
{
    const char *name = utf8_without_nul(arg, "an object name");
    if (!name)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_from_name(name, &id);
    if (rc)
        return cfx__py_raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static PyObject *mod_id_from_hex(PyObject *self, PyObject *arg)
{
    const char *hex = utf8_without_nul(arg, "an object id's hex");
    if (!hex)
        return NULL;
    struct cfx_object_id id;
    int rc = cfx_object_id_from_hex(hex, &id);
    if (rc)
        return cfx__py_raise_status(rc);
    return PyBytes_FromStringAndSize((const char *)id.bytes, CFX_OBJECT_ID_LEN);
}

static PyObject *mod_id_to_hex(PyObject *self, PyObject *arg)
{
    struct cfx_object_id id;
    if (cfx__py_parse_id(arg, &id) < 0)
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
    if (!PyArg_ParseTuple(args, "OOii", &dsto, &srco, &dtype, &op) ||
        cfx__py_check_dtype(dtype) < 0)
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
            cfx__py_raise_status(rc);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- module --------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    { "id_from_name", mod_id_from_name, METH_O, "20-byte id from a name (SHA-1)." },
    { "id_from_hex", mod_id_from_hex, METH_O, "20-byte id from 40 hex digits." },
    { "id_to_hex", mod_id_to_hex, METH_O, "40 hex digits of a 20-byte id." },
    { "errname", mod_errname, METH_O, "Symbolic name of a status." },
    { "strerror", mod_strerror, METH_O, "Text of a status." },
    { "reduce", mod_reduce, METH_VARARGS, "reduce(dst, src, dtype, op): dst op= src locally." },
    { 0 } /* sentinel */
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
    if (make_errors(m) < 0 || main_thread_init() < 0 ||
        PyModule_AddFunctions(m, cfx__py_ps_functions) < 0 ||
        PyType_Ready(&cfx__py_context_type) < 0 || PyType_Ready(&cfx__py_group_type) < 0 ||
        PyType_Ready(&cfx__py_request_type) < 0 || PyType_Ready(&cfx__py_ps_type) < 0 ||
        PyType_Ready(&cfx__py_arena_type) < 0 || cfx__py_ps_ready(m) < 0 ||
        PyModule_AddObjectRef(m, "Context", (PyObject *)&cfx__py_context_type) < 0 ||
        PyModule_AddObjectRef(m, "Group", (PyObject *)&cfx__py_group_type) < 0 ||
        PyModule_AddObjectRef(m, "Request", (PyObject *)&cfx__py_request_type) < 0 ||
        PyModule_AddObjectRef(m, "ParameterServer", (PyObject *)&cfx__py_ps_type) < 0 ||
        PyModule_AddObjectRef(m, "ArenaBuffer", (PyObject *)&cfx__py_arena_type) < 0 ||
        PyModule_AddStringConstant(m, "LIB_VERSION", CFX_VERSION_STRING) < 0 ||
        PyModule_AddIntConstant(m, "OBJECT_ID_LEN", CFX_OBJECT_ID_LEN) < 0 ||
        PyModule_AddIntConstant(m, "OBJECT_INLINE_MAX", CFX_OBJECT_INLINE_MAX) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

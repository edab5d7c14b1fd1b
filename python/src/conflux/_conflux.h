/*
 * _conflux.h: what the files of the CPython extension share (private).
 *
 * _conflux.c         module init, module functions, exceptions, argument helpers
 * _conflux_context.c Context and ArenaBuffer
 * _conflux_group.c   Group and Request (collectives)
 * _conflux_ps.c      ParameterServer
 *
 * Every function here is called with the GIL held.
 */
#ifndef CFX_PY_CONFLUX_H
#define CFX_PY_CONFLUX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <string.h>

#include <conflux/conflux.h>

/* ---- exceptions and argument helpers (_conflux.c) ----------------------- */

#define N_STATUS (-(CFX_STATUS_LAST))
extern PyObject *cfx__py_error_types[N_STATUS]; /* per negative status; [0] unused */

/* Raise the exception for @p status (negative); returns NULL. */
PyObject *cfx__py_raise_status(int status);
/* The same with @p detail in place of this thread's cfx_last_error(). */
PyObject *cfx__py_raise_status_detail(int status, const char *detail);
/* Timeout argument: None = leave unset (*set = 0); else milliseconds >= 0. */
int cfx__py_parse_timeout(PyObject *o, int *ms, int *set);
/* The arguments of a request's wait(timeout_ms=None): *ms = -1 for None
 * (the operation's own deadline).  -1 with an exception set. */
int cfx__py_wait_args(PyObject *args, PyObject *kw, int *ms);
/* Whether this is the thread CPython runs signal handlers on (its main
 * thread), where a wait is sliced (below). */
int cfx__py_main_thread(void);
/* Longest wait without the GIL on the main thread between looks at
 * Python's signals: about how long Ctrl-C takes to reach a sliced wait. */
#define CFX_PY_SLICE_MS 100
/* cfx__py_wait_sliced() returned because a signal handler raised (Ctrl-C:
 * KeyboardInterrupt); the exception is set and the operation runs on. */
#define CFX_PY_INTERRUPTED 1
/* A request's wait, called with the GIL, which it releases while it waits:
 * @p wait(req, ms) (ms < 0: until the operation's own end) and, when that
 * times out, @p test(req), since the operation may have ended meanwhile.
 * On the main thread it waits in slices of at most CFX_PY_SLICE_MS, the
 * first a plain wait as any other, and runs Python's signal handlers
 * between them (PyErr_CheckSignals).  Returns the final status;
 * CFX_ERR_AGAIN when @p ms passed with the operation still running; or
 * CFX_PY_INTERRUPTED.  @p why gets the failure's (or the timeout's) text. */
int cfx__py_wait_sliced(void *req, int ms, int (*wait)(void *req, int ms), int (*test)(void *req),
                        char *why, size_t len);
/* Around a blocking library call that waits on other processes (a
 * collective, a get), called with the GIL: on the main thread the library
 * runs Python's signal handlers every 0.1 s or so of the wait
 * (cfx_set_interrupt_check), and one that raises (Ctrl-C) ends the call
 * CFX_ERR_CANCELED with its exception set.  cfx__py_intr_begin() returns
 * the token cfx__py_intr_end() takes; that returns -1 when a handler raised
 * (the call may have completed all the same), else 0. */
int cfx__py_intr_begin(void);
int cfx__py_intr_end(int token);
/* The same for a call that makes an object: when a handler raised (-1), the
 * object it made all the same, @p obj (NULL: none), is undone by
 * @p undo(@p obj), run without the GIL. */
int cfx__py_intr_end_undo(int token, void (*undo)(void *), void *obj);
/* The pending exception taken aside (NULL: none), while cleanup that may
 * run Python code (a buffer's release) goes on; and set again. */
PyObject *cfx__py_exc_take(void);
void cfx__py_exc_put(PyObject *exc);
/* An int as a C long, one beyond a C long as LONG_MAX (out of every
 * caller's range); -1 with the exception set when @p o is no int. */
int cfx__py_long_sat(PyObject *o, long *out);
/* A 20-byte object id from any bytes-like object; -1 with ValueError set. */
int cfx__py_parse_id(PyObject *o, struct cfx_object_id *id);
/* 0 when @p dtype is a known enum cfx_dtype, else -1 with ValueError set. */
int cfx__py_check_dtype(int dtype);

/* ---- Context (_conflux_context.c) ---------------------------------------- */

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

/* A child (group, ps handle, arena buffer, call in flight) of @p c went:
 * destroys the context when it was closed and this was the last. */
void cfx__py_context_child_gone(ContextObject *c);
/* The live context, or NULL with ClosedError set. */
struct cfx_context *cfx__py_live_ctx(ContextObject *c);

/* ---- Request (_conflux_group.c) ------------------------------------------ */

/* cfx_get_nb() of @p id into @p bufo (a writable contiguous buffer, exported
 * until the get completes) as a Request, one of @p owner's children until
 * then; NULL with the error set. */
PyObject *cfx__py_request_get_nb(ContextObject *owner, const struct cfx_object_id *id,
                                 PyObject *bufo, const struct cfx_obj_params *p);

/* ---- the types the module exports ---------------------------------------- */

extern PyTypeObject cfx__py_context_type; /* conflux._conflux.Context */
extern PyTypeObject cfx__py_arena_type;   /* conflux._conflux.ArenaBuffer */
extern PyTypeObject cfx__py_group_type;   /* conflux._conflux.Group */
extern PyTypeObject cfx__py_request_type; /* conflux._conflux.Request */
extern PyTypeObject cfx__py_ps_type;      /* conflux._conflux.ParameterServer */
extern PyMethodDef cfx__py_ps_functions[]; /* the module's ps_admin (_conflux_ps.c) */
/* Readies and adds the PSRequest type (_conflux_ps.c); -1 with the error set. */
int cfx__py_ps_ready(PyObject *m);

#endif /* CFX_PY_CONFLUX_H */

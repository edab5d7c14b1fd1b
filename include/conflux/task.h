/*
 * Tasks: named C functions that read objects and put objects, placed by the
 * coordinator on the node that suits them best (docs/ARCHITECTURE.md,
 * "Tasks and placement").
 *
 *  - A worker process registers functions by name (cfx_task_register()).
 *    It tells the coordinator what it offers (cores, GPUs, memory) and
 *    reports its load with every heartbeat.
 *  - Any process submits a task by name with its input object ids, the ids
 *    of the results it will put, and its needs (cfx_task_submit()).  The
 *    coordinator places it: among the nodes that registered the function
 *    and meet the needs, the one holding most bytes of its inputs (complete
 *    copies count whole, partial copies half), then the least loaded
 *    (spread) or the fullest that still fits (pack).  Each placement holds
 *    a reservation on its node until the task ends, so concurrent
 *    placements do not take the same cores.
 *  - The chosen worker runs the function on a task runner thread of its
 *    context (never the progress thread, never a caller's thread).  The
 *    function gets its inputs with cfx_get() and puts its results (with
 *    cfx_put() or cfx_task_result_put()).  Its status travels back to the
 *    submitter: cfx_task_wait() returns it, and the results are ordinary
 *    objects any node may cfx_get().  The submitter ends them (its
 *    cfx_delete() withdraws every copy), and they go when it leaves
 *    (docs/TASKS.md, "Who ends a result").
 *  - A worker that dies with tasks placed on it: each task is placed again
 *    when its inputs are still held elsewhere and another live node that
 *    registered the function could meet its needs (it waits queued while
 *    those are busy), else it fails with CFX_ERR_PEER_FAILED naming the
 *    dead node and why (the lost input; no other node offering it).  A worker whose context is
 *    destroyed cuts its tasks short (their ends are not reported): they are
 *    treated the same, and the text says the node left.
 *  - A node declared dead may only have been paused or cut off (missed
 *    heartbeats): its run of the task goes on when it resumes (nothing can
 *    stop it), while the task was placed again and runs on another node.
 *    So the function may run twice, but only one run's results count: the
 *    stale run (its process rejoins under a new node id) is refused, by
 *    the coordinator and by its own node once told at the rejoin.  Its
 *    cfx_task_result_put(), and its cfx_put() of a result id, fail with
 *    CFX_ERR_CANCELED, the text naming the task and the node it moved to;
 *    its end does not count; the submitter's cfx_task_wait() and cfx_get()
 *    see the winning run's status and bytes only.  Side effects a function
 *    has outside Conflux must therefore be idempotent.  (The coordinator
 *    recognizes a stale put while it remembers the task: 60 s after the
 *    task's end; the stale node's own refusal of cfx_task_result_put()
 *    holds for as long as the run goes on.)
 *  - Tasks survive a coordinator restart and run at most once.  Each
 *    submission carries an idempotency key the library chooses: a submit
 *    sent again after a lost reply is the same task.  After the restart the
 *    workers re-announce the tasks they run or ended lately and report
 *    their ends; a cfx_task_wait() on a handle the new coordinator does not
 *    know submits it again with the same key (held by the coordinator for
 *    at most its --task-grace-ms, 5 s by default, so that the running task
 *    is re-announced first) and returns the task's real status within its
 *    own timeout.  A task whose worker died while the coordinator was down
 *    fails with CFX_ERR_PEER_FAILED naming that node, or is placed again
 *    when its inputs are held elsewhere.  Not covered: a fire-and-forget
 *    submission (out NULL) still queued when the coordinator died is lost,
 *    and so is one whose worker died while the coordinator was down
 *    (nobody re-announces it, and no handle submits it again: its result
 *    never comes, so a cfx_get() of it ends at its timeout), and a task
 *    whose end neither its worker (60 s) nor the coordinator remembers is
 *    submitted and run again by a late wait (docs/ARCHITECTURE.md, "Tasks
 *    and placement").
 *
 * Thread safety: every function here may be called from any thread, the
 * task functions themselves included (a task may submit tasks).
 */
#ifndef CONFLUX_TASK_H
#define CONFLUX_TASK_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>
#include <conflux/object.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;
struct cfx_task;

#define CFX_TASK_NAME_MAX   63   /* bytes of a function name (no NUL) */
#define CFX_TASK_IO_MAX     16   /* inputs, and results, of one task */
#define CFX_TASK_NODES_MAX  32   /* nodes of a node set */
#define CFX_TASK_RESERVE_MAX_MS 300000 /* cfx_place()'s reserve_ms, at most */
#define CFX_TASK_GROUP_MAX  31   /* bytes of an anti-affinity group name */
#define CFX_TASK_ARG_MAX    4096 /* bytes of a task's argument */

/** What a running task sees.  Valid for the duration of the call only. */
struct cfx_task_call {
    struct cfx_context *ctx;                 /* the worker's context */
    uint64_t task_id;                        /* the coordinator's id of the task */
    const char *name;                        /* the function's name */
    const struct cfx_object_id *inputs;      /* n_inputs ids, to cfx_get() */
    size_t n_inputs;
    const struct cfx_object_id *results;     /* n_results ids the task must put */
    size_t n_results;
    const void *arg;                         /* the submitter's argument bytes (or NULL) */
    size_t arg_len;
    int timeout_ms;                          /* what is left of the task's deadline */
};

/**
 * A task function.  Return CFX_OK once every result is put, or a negative
 * cfx_status (with cfx_last_error() saying why: its text travels to the
 * submitter).  Runs on a task runner thread of the worker's context.
 */
typedef int (*cfx_task_fn)(const struct cfx_task_call *call, void *arg);

/**
 * Offer function @p fn under @p name on this node.  The first registration
 * starts the context's task runner threads ($CFX_TASK_THREADS, default 4).
 * The coordinator's answer is waited for until the context's deadline
 * (CFX_TIMEOUT_MS), as for cfx_place(); cfx_task_submit() waits until that
 * or the task's deadline, whichever comes first.
 * @param arg  handed to every call of @p fn; owned by the caller, valid until
 *             the context is destroyed.
 * @return CFX_OK; CFX_ERR_EXISTS when this context registered @p name
 *         already; CFX_ERR_INVALID (empty or too long name, a name starting
 *         with "cfx.", which the library keeps for itself, NULL fn);
 *         CFX_ERR_NO_RESOURCE when the coordinator's cap on functions per
 *         node is reached (named in cfx_last_error()); CFX_ERR_CONNECT.
 */
CFX_API int cfx_task_register(struct cfx_context *ctx, const char *name, cfx_task_fn fn,
                              void *arg);

enum cfx_task_needs_field {
    CFX_TASK_NEEDS_CORES   = 1u << 0,
    CFX_TASK_NEEDS_MEMORY  = 1u << 1,
    CFX_TASK_NEEDS_GPUS    = 1u << 2,
    CFX_TASK_NEEDS_NODES   = 1u << 3,
    CFX_TASK_NEEDS_POLICY  = 1u << 4,
    CFX_TASK_NEEDS_GROUP   = 1u << 5,
    CFX_TASK_NEEDS_RESERVE = 1u << 6,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_TASK_NEEDS_ALL                                                            \
    ((uint64_t)(CFX_TASK_NEEDS_CORES | CFX_TASK_NEEDS_MEMORY | CFX_TASK_NEEDS_GPUS |  \
                CFX_TASK_NEEDS_NODES | CFX_TASK_NEEDS_POLICY | CFX_TASK_NEEDS_GROUP | \
                CFX_TASK_NEEDS_RESERVE))

enum cfx_task_policy {
    CFX_TASK_SPREAD = 0, /* among equally local nodes, the least loaded (default) */
    CFX_TASK_PACK   = 1, /* ... the most loaded that still fits */
};

/** A task's needs; unset fields: 1 core, no memory, no GPU, any node, spread. */
struct cfx_task_needs {
    uint64_t field_mask;                /* which fields are set (CFX_TASK_NEEDS_*); a bit
                                           this library does not know:
                                           CFX_ERR_UNSUPPORTED */
    uint32_t cores;                     /* cores it keeps busy (reserved while it runs) */
    uint64_t memory;                    /* bytes of memory it needs */
    uint32_t gpus;                      /* GPUs it needs */
    const uint32_t *nodes;              /* only these node ids may run it ... */
    size_t n_nodes;                     /* ... (at most CFX_TASK_NODES_MAX; 0: any node) */
    enum cfx_task_policy policy;        /* spread or pack */
    const char *group;                  /* anti-affinity: never on a node that runs a
                                           task of the same group (NULL: none) */
    int reserve_ms;                     /* cfx_place(): how long its reservation holds
                                           (default 2000 ms; set, 1 to
                                           CFX_TASK_RESERVE_MAX_MS, else
                                           CFX_ERR_INVALID) */
};

enum cfx_task_param_field {
    CFX_TASK_PARAM_TIMEOUT = 1u << 0,
    CFX_TASK_PARAM_ARG     = 1u << 1,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_TASK_PARAM_ALL ((uint64_t)(CFX_TASK_PARAM_TIMEOUT | CFX_TASK_PARAM_ARG))

struct cfx_task_params {
    uint64_t field_mask;    /* which fields are set (CFX_TASK_PARAM_*); a bit this
                               library does not know: CFX_ERR_UNSUPPORTED */
    int timeout_ms;         /* the task's deadline from submission (queueing and
                               running); default the context's; < 0: none */
    const void *arg;        /* bytes handed to the function (copied) */
    size_t arg_len;         /* at most CFX_TASK_ARG_MAX */
};

/**
 * Submit a task: run function @p name on the node the coordinator places it
 * on.  Returns once it is placed (or queued: when every capable node is
 * busy, it waits at the coordinator for a free slot until its deadline).
 * @param inputs   n_inputs object ids (may be NULL when 0) that the task reads
 * @param results  n_results object ids that the task puts (1..CFX_TASK_IO_MAX)
 * @param needs    NULL for the defaults
 * @param out      receives the handle; free it with cfx_task_free().  NULL:
 *                 fire and forget (wait on the result with cfx_get()).
 * @return CFX_OK; CFX_ERR_NOT_FOUND when no live node registered @p name;
 *         CFX_ERR_NO_RESOURCE when no node that registered it could ever meet
 *         the needs, or a cap (tasks per node, queued tasks) is reached:
 *         cfx_last_error() says which; CFX_ERR_INVALID; CFX_ERR_CONNECT.
 */
CFX_API int cfx_task_submit(struct cfx_context *ctx, const char *name,
                            const struct cfx_object_id *inputs, size_t n_inputs,
                            const struct cfx_object_id *results, size_t n_results,
                            const struct cfx_task_needs *needs,
                            const struct cfx_task_params *params, struct cfx_task **out);

/**
 * Wait until the task ended or @p timeout_ms passed (<0: forever, but a
 * task with a deadline (CFX_TASK_PARAM_TIMEOUT, else the context's) is
 * waited for until that deadline and 10 s for the coordinator's answer at
 * most: past it, an unreachable coordinator fails the wait with
 * CFX_ERR_CONNECT naming it).
 * @param node_out  NULL, or receives the node that ran it (or last held it;
 *                  when the wait ends with no answer from the coordinator,
 *                  the node the task was last known on, as cfx_task_node())
 * Across a coordinator restart the wait goes on on the new connection; when
 * the new coordinator does not know the task it is submitted again from
 * the handle (same key, same id) and waited for, all within @p timeout_ms.
 * @return the task's status: CFX_OK; what its function returned (with its
 *         text, naming the node, in cfx_last_error()); CFX_ERR_PEER_FAILED
 *         naming the node that died with it when it could not be placed
 *         again (also when that node died while the coordinator was down);
 *         CFX_ERR_TIMEOUT when the task's own deadline passed;
 *         CFX_ERR_NO_RESOURCE when, queued, its needs or node set no longer
 *         fit any live node that could run it (its nodes died, say);
 *         CFX_ERR_AGAIN when @p timeout_ms passed first (it goes on), and
 *         CFX_ERR_CANCELED when the thread's interrupt check ended the wait
 *         (cfx_set_interrupt_check(); it goes on too);
 *         CFX_ERR_NOT_FOUND when the coordinator ended and forgot it long
 *         ago (it is not run again); CFX_ERR_CONNECT when the coordinator
 *         stayed unreachable for the whole wait.
 */
CFX_API int cfx_task_wait(struct cfx_task *task, int timeout_ms, uint32_t *node_out);

/** The coordinator's id of the task (kept across a coordinator restart). */
CFX_API uint64_t cfx_task_id(const struct cfx_task *task);

/** Node the task was placed on when submitted (it may move if that node dies). */
CFX_API uint32_t cfx_task_node(const struct cfx_task *task);

/** Free the handle (the task goes on); NULL is a no-op. */
CFX_API void cfx_task_free(struct cfx_task *task);

/**
 * Answer where a task with these needs and inputs would run, without running
 * anything.  The answer holds a reservation on that node for
 * needs->reserve_ms (default 2000 ms), so that concurrent queries spread as
 * concurrent tasks would; it expires by itself, or when the asking node
 * leaves.  A reserve_ms under 1 or over 300000 is CFX_ERR_INVALID; a node holds at
 * most 128 such reservations at once (then CFX_ERR_NO_RESOURCE).  When
 * @p name is NULL every node that registered any function is a candidate.
 * @return CFX_OK with *out_node set; CFX_ERR_NO_RESOURCE when no node could
 *         ever meet the needs; CFX_ERR_BUSY when candidates exist but all
 *         are taken now; CFX_ERR_NOT_FOUND when no live node registered
 *         @p name.
 */
CFX_API int cfx_place(struct cfx_context *ctx, const char *name,
                      const struct cfx_task_needs *needs, const struct cfx_object_id *inputs,
                      size_t n_inputs, uint32_t *out_node);

/**
 * Put result @p index of the running task from a copy of @p size bytes at
 * @p buf (the copy lives in the context's arena and is freed when the object
 * is deleted): the convenient way for a task to put a result whose buffer it
 * does not keep.
 * @return as cfx_put(); CFX_ERR_INVALID for an index out of range;
 *         CFX_ERR_CANCELED when this run is no longer the task's (its node
 *         was declared dead while it ran and the task moved: see the top),
 *         naming the task and the node it moved to.
 */
CFX_API int cfx_task_result_put(const struct cfx_task_call *call, size_t index,
                                const void *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif

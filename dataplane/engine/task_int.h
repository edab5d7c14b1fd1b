/*
 * Private to the task files: task.c (functions, runners, the API) and
 * task_keep.c (what keeps tasks across a coordinator restart).
 * rt->mu protects the function table, the queue, the running list, the
 * ended ring and the flags.
 */
#ifndef CFX_ENGINE_TASK_INT_H
#define CFX_ENGINE_TASK_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <conflux/task.h>

#include "control/proto.h"
#include "dataplane/engine/engine.h"

#define TASK_THREADS_DEFAULT 4
#define TASK_THREADS_MAX     64
#define TASK_REQ_MS          10000 /* a re-announcement after a restart, a resubmission */
#define TASK_ENDED_KEEP      128   /* ended tasks a worker remembers: re-announced after a
                                    * restart, never run a second time */
#define TASK_ENDED_KEEP_MS   60000 /* ... for at most this long (the coordinator's keep) */
#define TASK_ALIAS_MAX       4     /* more ids one task's end is reported under */
#define TASK_RESUBMIT_MAX    4     /* submissions again within one cfx_task_wait() */

struct task_fn_ent {
    char name[CFX_TASK_NAME_MAX + 1];
    cfx_task_fn fn;
    void *arg;
};

struct task_job {
    struct cfx_list link;       /* rt->jobs, then rt->running while it runs */
    struct cfx_msg_task t;      /* as sent (t.arg points to arg) */
    uint64_t deadline_ns;
    uint64_t alias[TASK_ALIAS_MAX]; /* other placements of its key: the end goes to each */
    unsigned nalias;
    bool moved;                 /* the coordinator refused its re-announcement: this node
                                 * was declared dead while it ran and the task moved; the
                                 * run goes on, but is not the task's (task_keep.c) */
    char moved_text[CFX_PROTO_TEXT_MAX]; /* ... the coordinator's words */
    uint8_t arg[];
};

/* A task that ended here, remembered (TASK_ENDED_KEEP, TASK_ENDED_KEEP_MS). */
struct task_ended {
    struct cfx_msg_task t;      /* its body, without the argument */
    uint64_t alias[TASK_ALIAS_MAX];
    unsigned nalias;
    uint64_t ended_ns;          /* 0: slot unused */
    int32_t status;
    char text[CFX_PROTO_TEXT_MAX];
};

struct cfx_task_rt {
    pthread_mutex_t mu;
    pthread_cond_t cond;        /* jobs queued, rereg, stop */
    struct task_fn_ent fns[CFX_TASK_FNS_MAX];
    unsigned nfns;
    struct cfx_list jobs;       /* struct task_job, oldest first */
    struct cfx_list running;    /* struct task_job being run */
    struct task_ended *ended;   /* ring of TASK_ENDED_KEEP (allocated with the runners;
                                 * NULL before: nothing ran here) */
    unsigned ended_next;        /* slot the next end takes */
    pthread_t threads[TASK_THREADS_MAX];
    unsigned nthreads;
    bool stop;
    bool rereg;                 /* register the functions again and re-announce the
                                 * tasks (the coordinator restarted) */
    uint32_t running_n;         /* tasks being run (atomic: heartbeats read it) */
    uint32_t cores;             /* what this node offers (CFX_TASK_CORES, ...) */
    uint32_t gpus;
    uint64_t memory;
    uint64_t key_base;          /* random: submissions' keys are key_base + seq */
    uint64_t key_seq;           /* atomic */
};

struct cfx_task {
    struct cfx_context *ctx;
    uint64_t id;
    uint32_t node;
    bool ended;                 /* a wait returned its end: never submitted again */
    uint64_t deadline_ns;       /* the task's own (UINT64_MAX: none) */
    struct cfx_msg_task t;      /* as submitted (t.arg points to arg): submitted
                                 * again when a restarted coordinator forgot it */
    uint8_t arg[];
};

/* task_keep.c */
/* A fresh idempotency key (never 0). */
uint64_t cfx__task_key(struct cfx_task_rt *rt);
/* Client thread, before queueing @p t: true when its key runs, is queued or
 * ended here already (the new id is reported with that run's end). */
bool cfx__task_dedup(struct cfx_context *ctx, const struct cfx_msg_task *t);
/* rt->mu held: remember the end of @p j. */
void cfx__task_ended_add(struct cfx_task_rt *rt, const struct task_job *j, int status,
                         const char *text);
/* Report an end (TASK_DONE) under @p id and each alias. */
void cfx__task_report(struct cfx_context *ctx, const struct cfx_msg_task *t,
                      const uint64_t *alias, unsigned nalias, int status, const char *text);
/* A runner, after registering again: re-announce every task queued, running
 * or ended here, close the list, and report the ends again. */
void cfx__task_announce(struct cfx_context *ctx);
/* Submit @p task again (the coordinator does not know it), by @p deadline. */
int cfx__task_resubmit(struct cfx_task *task, uint64_t deadline);

#endif

/*
 * Test helper shared by the coordinator outage and restart tests: a
 * conflux-coord child process with a state directory under /tmp, killed
 * with SIGKILL and started again on the same port and state directory,
 * and contexts that join it over tcp.
 */
#ifndef CFX_TEST_COORD_RUN_H
#define CFX_TEST_COORD_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "coord_child.h"

struct cfx_context;

struct coord_run {
    struct coord_child cc;    /* the running coordinator (cc.pid 0: none) */
    char token[64];           /* the cluster token */
    char dir[128];            /* /tmp/cfx-<tag>-<pid>, removed by the teardown */
    char statedir[160];       /* dir/state: --state-dir */
    char logpath[160];        /* dir/coord.log: its stderr, across restarts */
    char port[16];            /* --port of the next start ("0" at first) */
    const char *dead_after;   /* --dead-after-ms of the next start */
    const char *extra[8];     /* more arguments of the next start, NULL-ended */
    bool debug;               /* run it with CFX_LOG_LEVEL=DEBUG (log checks) */
};

/* A fresh token and directory, then the coordinator on a port of its own
 * (--heartbeat-ms 100 --dead-after-ms 1500). */
void coord_run_setup(struct coord_run *r, const char *tag, bool debug);
/* The same with more conflux-coord arguments (@p extra, NULL-ended, at most
 * 7), kept for every start. */
void coord_run_setup_with(struct coord_run *r, const char *tag, bool debug,
                          const char *const *extra);
/* Start it on r->port and r->statedir. */
void coord_run_start(struct coord_run *r);
/* kill -9 it; the next start takes the same port. */
void coord_run_kill(struct coord_run *r);
/* kill -9 and start again on the same port and state directory. */
void coord_run_restart(struct coord_run *r);
/* Stop it (SIGTERM), check that its log never shows the token, remove the
 * directory. */
void coord_run_teardown(struct coord_run *r);
/* A context on the coordinator at @p addr (tcp data plane, deadline
 * @p timeout_ms); NULL with cfx_last_error() set on failure.  Usable in a
 * child process, outside any Criterion test. */
struct cfx_context *coord_run_join_at(const char *addr, const char *token, int timeout_ms);
/* The same on @p r, asserting that it works. */
struct cfx_context *coord_run_join(struct coord_run *r, int timeout_ms);

struct cfx_task_call;
/* The body of a task worker child (the tasks tests): join @p addr, offer
 * @p fn as @p name, write this node's id (a uint32_t) to @p out, stay until a
 * byte (or the end) comes on @p in, then leave and _exit(0); exit status
 * 2-5 names the step that failed, with a line on stderr.  Never returns. */
void coord_run_task_worker(const char *addr, const char *token, const char *name,
                           int (*fn)(const struct cfx_task_call *, void *), int in, int out,
                           int timeout_ms) __attribute__((noreturn));

/* A task worker child: this test binary exec'd again, whose constructor
 * finds @p env set and runs coord_run_task_worker, with pipes to it. */
#define COORD_RUN_PIPES_MAX 4
struct coord_run_worker {
    pid_t pid;                       /* 0: none */
    int to, from;                    /* control pipe: 'D' ends it; its node id came back */
    int fd[COORD_RUN_PIPES_MAX];     /* this side's ends of the extra pipes, in order */
    int npipes;
    uint32_t node;                   /* its node id at the start */
};

/* Start one on @p r's coordinator and wait for its node id.  The child
 * finds @p env set to "IN OUT P... ADDR TOKEN": its ends of the control
 * pipe, then of one extra pipe per letter of @p dirs ('r': the child reads
 * it, this side writes fd[i]; 'w': the other way), and the "NAME=VALUE"
 * strings of @p envs (NULL-ended) in its environment. */
void coord_run_worker_start(struct coord_run *r, struct coord_run_worker *w, const char *env,
                            const char *dirs, const char *const *envs, int timeout_ms);
/* 'D' to it (and SIGCONT, for one a test stopped), then its exit waited
 * for, at most @p timeout_ms before SIGKILL; its pipes stay open. */
void coord_run_worker_stop(struct coord_run_worker *w, int timeout_ms);
/* SIGKILL, then its exit waited for; its pipes stay open. */
void coord_run_worker_kill(struct coord_run_worker *w);
/* Close this side's ends of its pipes. */
void coord_run_worker_close(struct coord_run_worker *w);

#endif

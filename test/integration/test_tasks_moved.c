/*
 * A task whose worker is only paused past the heartbeat deadline: the
 * coordinator declares the node dead and places the task again on another
 * worker, which runs it; then the paused process goes on (it rejoins under
 * a new node id) with its run of the task.  That run cannot be stopped, but
 * it is no longer the task's: its result puts (cfx_task_result_put, and a
 * cfx_put of the result id) fail with CFX_ERR_CANCELED naming the task and
 * the node it moved to, its end does not count, and the submitter sees the
 * winning run's status and bytes only (include/conflux/task.h).
 *
 * A conflux-coord child (--dead-after-ms 1500) and two worker processes,
 * exec'd fresh images of this binary (see the constructor), offering
 * "fence" with 1 core; this process submits.  Worker A is stopped with
 * SIGSTOP by its pid while it runs the task and resumed with SIGCONT once
 * the task runs on worker B.  "fence" writes a byte to its runs pipe as it
 * starts, waits for a byte on its gate pipe, puts result 0 as BIG bytes of
 * pattern(its pid) with cfx_task_result_put (and, when that is refused,
 * tries a cfx_put of the id too), and writes what the puts returned to its
 * said pipe.  Every step waits for an event (a pipe byte, the coordinator's
 * death event) with a deadline, never for a time.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client.h"
#include "coord_run.h"
#include "dataplane/engine/engine.h"
#include "dataplane/engine/p2p.h"

#define CHILD_ENV "CFX_TEST_TASKS_MOVED_CHILD"
#define CALL_MS   60000             /* past the suite's limit: a call must not wait for it */
#define BIG       (256u * 1024)     /* over the inline limit: served by its holder */

static uint8_t pattern(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 37u + i * 11u + (i >> 10));
}

/* What a run's puts returned, as the worker saw them. */
struct said {
    int32_t rc_result;   /* cfx_task_result_put */
    int32_t rc_put;      /* cfx_put of the result id, tried when the first was refused
                          * (1: not tried) */
    char text_result[256];
    char text_put[256];
};

/* ---- the worker ------------------------------------------------------------------ */

static int child_runs = -1, child_gate = -1, child_said = -1;
static uint8_t child_buf[BIG]; /* cfx_put's buffer: valid for the process's life */

static int fence(const struct cfx_task_call *call, void *arg)
{
    uint32_t seed = (uint32_t)getpid();
    struct said s;
    char c = 'S';
    int n;
    (void)arg;

    memset(&s, 0, sizeof(s));
    if (write(child_runs, &c, 1) != 1)
        return CFX_ERR_IO;
    /* the gate, waited for across a stop */
    struct pollfd p = { .fd = child_gate, .events = POLLIN };
    while ((n = poll(&p, 1, CALL_MS)) < 0 && errno == EINTR)
        ;
    if (n != 1 || read(child_gate, &c, 1) != 1)
        return CFX_ERR_TIMEOUT;
    for (size_t i = 0; i < BIG; i++)
        child_buf[i] = pattern(seed, i);
    s.rc_result = cfx_task_result_put(call, 0, child_buf, BIG);
    snprintf(s.text_result, sizeof(s.text_result), "%s", cfx_last_error());
    s.rc_put = 1;
    if (s.rc_result != CFX_OK) {
        s.rc_put = cfx_put(call->ctx, &call->results[0], child_buf, BIG, NULL);
        snprintf(s.text_put, sizeof(s.text_put), "%s", cfx_last_error());
    }
    if (write(child_said, &s, sizeof(s)) != (ssize_t)sizeof(s))
        return CFX_ERR_IO;
    return s.rc_result;
}

/* "IN OUT RUNS GATE SAID ADDR TOKEN": join, offer "fence", report the node
 * id, serve until 'D' (or the end of the pipe). */
__attribute__((constructor)) static void moved_child_main(void)
{
    const char *spec = getenv(CHILD_ENV);
    int in, out;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %d %d %d %d %63s %63s", &in, &out, &child_runs, &child_gate,
                        &child_said, a, tok) != 7)
        return;
    coord_run_task_worker(a, tok, "fence", fence, in, out, CALL_MS);
}

/* ---- the submitter -------------------------------------------------------------- */

/* A worker's pipes beside its control pipe (coord_run_worker's fd[]). */
enum {
    RUNS, /* read end: a byte per run started */
    GATE, /* write end: a byte lets a run put its result */
    SAID, /* read end: a struct said per run that put */
};

static struct coord_run co;
static struct coord_run_worker wa, wb;
static struct cfx_context *ctx;

static void worker_start(struct coord_run_worker *w)
{
    const char *envs[] = { "CFX_TASK_CORES=1", "CFX_TASK_MEMORY=1G", NULL };
    coord_run_worker_start(&co, w, CHILD_ENV, "wrw", envs, CALL_MS);
}

/* A run started on @p w (an event: its byte). */
static void started(struct coord_run_worker *w)
{
    struct pollfd p = { .fd = w->fd[RUNS], .events = POLLIN };
    char c;
    cr_assert(poll(&p, 1, CALL_MS) == 1 && read(w->fd[RUNS], &c, 1) == 1,
              "no run started on the worker of node %u (log %s)", w->node, co.logpath);
}

static void release(struct coord_run_worker *w)
{
    cr_assert_eq(write(w->fd[GATE], "g", 1), 1);
}

/* What @p w's run said of its puts. */
static struct said said(struct coord_run_worker *w)
{
    struct pollfd p = { .fd = w->fd[SAID], .events = POLLIN };
    struct said s;
    cr_assert(poll(&p, 1, CALL_MS) == 1 && read(w->fd[SAID], &s, sizeof(s)) == (ssize_t)sizeof(s),
              "the run on the worker of node %u said nothing (log %s)", w->node, co.logpath);
    return s;
}

static void worker_end(struct coord_run_worker *w)
{
    coord_run_worker_stop(w, CALL_MS);
    coord_run_worker_close(w);
}

static void setup(void)
{
    coord_run_setup(&co, "tmoved", false);
    worker_start(&wa);
    ctx = coord_run_join(&co, CALL_MS);
}

static void teardown(void)
{
    cfx_context_destroy(ctx);
    worker_end(&wa);
    worker_end(&wb);
    coord_run_teardown(&co);
}

TestSuite(tasks_moved, .init = setup, .fini = teardown, .timeout = 120);

static void oid(const char *name, struct cfx_object_id *id)
{
    cr_assert_eq(cfx_object_id_from_name(name, id), CFX_OK);
}

/* Until this process hears the coordinator declare node @p id dead. */
static void wait_dead(uint32_t id)
{
    uint64_t dl = cfx__deadline_ns(CALL_MS);
    pthread_mutex_lock(&ctx->lock);
    while (cfx__node_gone(ctx, id) != CFX_NODE_DEAD && cfx__obj_wait(ctx, dl))
        ;
    int gone = cfx__node_gone(ctx, id);
    pthread_mutex_unlock(&ctx->lock);
    cr_assert_eq(gone, CFX_NODE_DEAD, "node %u was not declared dead (log %s)", id, co.logpath);
}

/* Result @p r holds BIG bytes of pattern(@p seed), got by this process. */
static void check_result(const struct cfx_object_id *r, uint32_t seed)
{
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(cfx_get_alloc(ctx, r, &buf, &len, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(len, BIG, "%zu bytes, want %u", len, BIG);
    for (size_t i = 0; i < BIG; i++)
        cr_assert_eq(((uint8_t *)buf)[i], pattern(seed, i),
                     "byte %zu is not the winning run's (worker pid %u)", i, seed);
    cfx_buf_free(ctx, buf);
}

/* The coordinator's record of task @p id. */
static struct cfx_ctl_task_rec task_rec(uint64_t id)
{
    struct cfx_ctl_task_rec *recs = NULL, rec;
    size_t n = 0, i = 0;
    cr_assert_eq(cfx__ctl_tasks(ctx->ctl, &recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    while (i < n && recs[i].id != id)
        i++;
    cr_assert_lt(i, n, "task %llu is not listed", (unsigned long long)id);
    rec = recs[i];
    free(recs);
    return rec;
}

/* The id the live node of process @p pid has now (0: none). */
static uint32_t node_of(pid_t pid)
{
    struct cfx_node_rec *recs = NULL;
    size_t n = 0;
    uint32_t id = 0;
    cr_assert_eq(cfx__ctl_nodes(ctx->ctl, &recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    for (size_t i = 0; i < n; i++)
        if (recs[i].alive && recs[i].pid == (uint32_t)pid)
            id = recs[i].node_id;
    free(recs);
    return id;
}

/* A refused put of the stale run: CFX_ERR_CANCELED naming the task, the
 * node it moved to and the node declared dead. */
static void refused(int rc, const char *text, uint64_t id, const char *what)
{
    char want[128];
    cr_assert_eq(rc, CFX_ERR_CANCELED, "the stale run's %s: %s: %s", what, cfx_errname(rc),
                 text);
    snprintf(want, sizeof(want), "task %llu ('fence') moved to node %u", (unsigned long long)id,
             wb.node);
    cr_assert(strstr(text, want), "the stale run's %s: '%s' missing: %s", what, want, text);
    snprintf(want, sizeof(want), "node %u was declared dead", wa.node);
    cr_assert(strstr(text, want), "the stale run's %s: '%s' missing: %s", what, want, text);
}

/*
 * Worker A runs the task and is stopped; once the coordinator declared it
 * dead the task runs on worker B; A is resumed and its run goes on.  With
 * @p stale_first A's run puts while B's still runs, else after B's ended.
 * Either way A's puts are refused and the task is B's run's alone.  Before,
 * A's rejoin re-announced the task and took it over from B (its run was
 * "the task's"), so A's bytes were the result and B's put failed with
 * CFX_ERR_EXISTS; and after B's end, A's put failed with CFX_ERR_EXISTS (a
 * refusal that named neither the task nor the move).
 */
static void paused_run(bool stale_first)
{
    struct cfx_object_id r;
    struct cfx_task_params p = { .field_mask = CFX_TASK_PARAM_TIMEOUT, .timeout_ms = CALL_MS };
    struct cfx_task *t = NULL;
    struct cfx_ctl_source src;
    uint32_t node = 0;
    oid(stale_first ? "tasks/moved/stale-first" : "tasks/moved/winner-first", &r);

    cr_assert_eq(cfx_task_submit(ctx, "fence", NULL, 0, &r, 1, NULL, &p, &t), CFX_OK, "%s",
                 cfx_last_error());
    const uint64_t id = cfx_task_id(t);
    cr_assert_eq(cfx_task_node(t), wa.node);
    started(&wa);
    worker_start(&wb); /* a second worker offering it, after the placement */
    cr_assert_eq(kill(wa.pid, SIGSTOP), 0);
    wait_dead(wa.node);
    started(&wb); /* placed again on B, which runs it */
    cr_assert_eq(cfx_task_wait(t, 0, &node), CFX_ERR_AGAIN, "%s", cfx_last_error());

    if (!stale_first) {
        release(&wb);
        struct said sb = said(&wb);
        cr_assert_eq(sb.rc_result, CFX_OK, "%s", sb.text_result);
        cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(node, wb.node);
        check_result(&r, (uint32_t)wb.pid);
    }
    cr_assert_eq(kill(wa.pid, SIGCONT), 0);
    release(&wa);
    struct said sa = said(&wa);
    refused(sa.rc_result, sa.text_result, id, "cfx_task_result_put");
    refused(sa.rc_put, sa.text_put, id, "cfx_put");

    if (stale_first) {
        /* nothing changed: the task still runs on B, its result has no holder */
        cr_assert_eq(cfx_task_wait(t, 0, &node), CFX_ERR_AGAIN, "the stale run ended the "
                     "task: %s", cfx_last_error());
        cr_assert_eq(node, wb.node);
        int rc = cfx__ctl_obj_lookup_now(ctx->ctl, &r, NULL, 0, cfx__deadline_ns(CALL_MS),
                                         &src);
        cr_assert_eq(rc, CFX_ERR_TIMEOUT, "the result has a holder (node %u): %s: %s",
                     rc == CFX_OK ? src.node.node_id : 0, cfx_errname(rc), cfx_last_error());
        release(&wb);
        struct said sb = said(&wb);
        cr_assert_eq(sb.rc_result, CFX_OK, "%s", sb.text_result);
    }
    /* the winning run's end and bytes, whatever the stale run did */
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wb.node);
    check_result(&r, (uint32_t)wb.pid);
    struct cfx_ctl_task_rec rec = task_rec(id);
    cr_assert_eq(rec.state, CFX_CTL_TASK_DONE);
    cr_assert_eq(rec.status, CFX_OK, "%s: %s", cfx_errname(rec.status), rec.text);
    cr_assert_eq(rec.node_id, wb.node);
    cr_assert_eq(rec.placements, 2);
    cfx_task_free(t);

    /* A, rejoined, runs new tasks: the core its stale run held is free
     * once that run's end came (a task pinned there would wait for it) */
    uint32_t now = node_of(wa.pid);
    cr_assert(now && now != wa.node, "worker A (pid %d) is not back under a new id", wa.pid);
    struct cfx_task_needs on_a = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = &now,
                                   .n_nodes = 1 };
    oid(stale_first ? "tasks/moved/stale-first/next" : "tasks/moved/winner-first/next", &r);
    cr_assert_eq(cfx_task_submit(ctx, "fence", NULL, 0, &r, 1, &on_a, &p, &t), CFX_OK, "%s",
                 cfx_last_error());
    started(&wa);
    release(&wa);
    sa = said(&wa);
    cr_assert_eq(sa.rc_result, CFX_OK, "%s", sa.text_result);
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, now);
    check_result(&r, (uint32_t)wa.pid);
    cfx_task_free(t);
}

Test(tasks_moved, a_paused_run_that_puts_while_the_new_one_runs_is_refused)
{
    paused_run(true);
}

Test(tasks_moved, a_paused_run_that_puts_after_the_new_one_ended_is_refused)
{
    paused_run(false);
}

/*
 * Tasks across a coordinator restart (control/coord_task.c, "Restarts";
 * dataplane/engine/task_keep.c): a conflux-coord child with
 * --task-grace-ms 5000, one worker process (an exec'd fresh image of this
 * binary, see the constructor) offering "count" with 1 core, so that a
 * second task queues behind a running one, and this process submitting.
 *
 * "count" (struct count_arg) writes its tag byte to the runs pipe as it
 * starts (the test reads it: the task runs now; the bytes left at the end
 * count the runs), with gate waits for one byte on the gate pipe, then puts
 * result 0 as size bytes of pattern(seed).  Results are checked byte by
 * byte; the runs of each tag are counted after the worker exited.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "coord_run.h"
#include "testutil.h"
#include "dataplane/engine/engine.h"

#define CHILD_ENV "CFX_TEST_TASKS_RESTART_CHILD"
#define CALL_MS   30000
/* the default: a live worker reconnects within CFX_PROTO_RECONNECT_MAX_MS
 * (2 s) plus one attempt of the restarted coordinator, and a shorter grace
 * would let a waiter's repeat outrun a slow worker on a loaded machine */
#define GRACE_MS  "5000"

struct count_arg {
    uint8_t tag;     /* written to the runs pipe when a run starts */
    uint8_t gate;    /* then wait for a byte on the gate pipe */
    uint16_t pad;
    uint32_t seed;
    uint32_t size;   /* result 0: size bytes of pattern(seed) */
};

static uint8_t pattern(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 29u + i * 13u + (i >> 8));
}

/* ---- the worker ------------------------------------------------------------------ */

static int child_gate = -1, child_runs = -1;

static int count(const struct cfx_task_call *call, void *arg)
{
    struct count_arg a;
    char c;
    (void)arg;

    if (call->arg_len != sizeof(a))
        return CFX_ERR_INVALID;
    memcpy(&a, call->arg, sizeof(a));
    if (write(child_runs, &a.tag, 1) != 1)
        return CFX_ERR_INVALID;
    if (a.gate) {
        struct pollfd p = { .fd = child_gate, .events = POLLIN };
        if (poll(&p, 1, call->timeout_ms) != 1 || read(child_gate, &c, 1) != 1)
            return CFX_ERR_TIMEOUT;
    }
    uint8_t *out = malloc(a.size);
    if (!out)
        return CFX_ERR_NOMEM;
    for (size_t i = 0; i < a.size; i++)
        out[i] = pattern(a.seed, i);
    int rc = cfx_task_result_put(call, 0, out, a.size);
    free(out);
    return rc;
}

/* "IN OUT GATE RUNS ADDR TOKEN": join, offer "count", report the node id,
 * serve until 'D' (or the end of the pipe). */
__attribute__((constructor)) static void restart_child_main(void)
{
    const char *spec = getenv(CHILD_ENV);
    int in, out;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %d %d %d %63s %63s", &in, &out, &child_gate, &child_runs, a,
                        tok) != 6)
        return;
    coord_run_task_worker(a, tok, "count", count, in, out, CALL_MS);
}

/* ---- the submitter -------------------------------------------------------------- */

/* A worker: its child process and pipes (fd[GATE]: write end, one byte
 * lets one gated task go on; fd[RUNS]: read end, a tag byte per run
 * started), and the runs started, by tag, read so far. */
enum { GATE, RUNS };
struct worker {
    struct coord_run_worker c;
    unsigned seen[256];
};

static struct coord_run co;
static struct worker wk;
static struct cfx_context *ctx;

static void worker_start(struct worker *w)
{
    const char *envs[] = { "CFX_TASK_CORES=1", "CFX_TASK_MEMORY=1G", NULL };
    memset(w->seen, 0, sizeof(w->seen));
    coord_run_worker_start(&co, &w->c, CHILD_ENV, "rw", envs, CALL_MS);
}

/* The next run started on @p w has tag @p tag (an event: the byte). */
static void started(struct worker *w, uint8_t tag)
{
    struct pollfd p = { .fd = w->c.fd[RUNS], .events = POLLIN };
    uint8_t got = 0;
    cr_assert(poll(&p, 1, CALL_MS) == 1 && read(w->c.fd[RUNS], &got, 1) == 1,
              "no task started on node %u", w->c.node);
    cr_assert_eq(got, tag, "run of '%c' started, want '%c'", got, tag);
    w->seen[got]++;
}

static void release(struct worker *w)
{
    cr_assert_eq(write(w->c.fd[GATE], "g", 1), 1);
}

/* End @p w, then read every run byte it left: the pipe ends with it. */
static void worker_end(struct worker *w)
{
    uint8_t buf[64];
    ssize_t n;
    if (!w->c.pid)
        return;
    coord_run_worker_stop(&w->c, CALL_MS);
    while ((n = read(w->c.fd[RUNS], buf, sizeof(buf))) > 0)
        for (ssize_t i = 0; i < n; i++)
            w->seen[buf[i]]++;
    coord_run_worker_close(&w->c);
}

static void worker_kill(struct worker *w)
{
    coord_run_worker_kill(&w->c);
    coord_run_worker_close(&w->c);
}

static void setup(void)
{
    const char *extra[] = { "--task-grace-ms", GRACE_MS, NULL };
    coord_run_setup_with(&co, "trestart", false, extra);
    worker_start(&wk);
    ctx = coord_run_join(&co, CALL_MS);
}

static void teardown(void)
{
    cfx_context_destroy(ctx);
    worker_end(&wk);
    coord_run_teardown(&co);
}

TestSuite(tasks_restart, .init = setup, .fini = teardown, .timeout = 120);

static void oid(const char *name, struct cfx_object_id *id)
{
    cr_assert_eq(cfx_object_id_from_name(name, id), CFX_OK);
}

static struct cfx_task *submit(const char *result, struct count_arg *a)
{
    struct cfx_object_id r;
    struct cfx_task_params p = { .field_mask = CFX_TASK_PARAM_ARG | CFX_TASK_PARAM_TIMEOUT,
                                 .arg = a, .arg_len = sizeof(*a), .timeout_ms = CALL_MS };
    struct cfx_task *t = NULL;
    oid(result, &r);
    cr_assert_eq(cfx_task_submit(ctx, "count", NULL, 0, &r, 1, NULL, &p, &t), CFX_OK,
                 "submit: %s", cfx_last_error());
    return t;
}

static void check_result(const char *name, uint32_t seed, size_t size)
{
    struct cfx_object_id id;
    void *buf = NULL;
    size_t len = 0;
    oid(name, &id);
    cr_assert_eq(cfx_get_alloc(ctx, &id, &buf, &len, NULL), CFX_OK, "get %s: %s", name,
                 cfx_last_error());
    cr_assert_eq(len, size, "%s: %zu bytes, want %zu", name, len, size);
    for (size_t i = 0; i < size; i++)
        cr_assert_eq(((uint8_t *)buf)[i], pattern(seed, i), "%s: byte %zu", name, i);
    cfx_buf_free(ctx, buf);
}

struct waiter {
    pthread_t th;
    struct cfx_task *t;
    int rc;
    uint32_t node;
    char err[512];
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    w->rc = cfx_task_wait(w->t, CALL_MS, &w->node);
    snprintf(w->err, sizeof(w->err), "%s", cfx_last_error());
    return NULL;
}

Test(tasks_restart, running_task_ends_once_across_a_kill_9)
{
    /* the task runs when the coordinator is killed; a waiter waits across
     * the outage; the task goes on while the coordinator is down and ends
     * after the new one started */
    struct count_arg a = { .tag = 'a', .gate = 1, .seed = 11, .size = 3000 };
    struct waiter w = { .t = submit("trestart/a", &a) };
    uint64_t id = cfx_task_id(w.t);
    started(&wk, 'a');
    cr_assert_eq(pthread_create(&w.th, NULL, wait_main, &w), 0);
    coord_run_kill(&co);
    release(&wk);
    coord_run_start(&co);
    pthread_join(w.th, NULL);
    cr_assert_eq(w.rc, CFX_OK, "wait: %s", w.err);
    cr_assert_eq(w.node, wk.c.node);
    cr_assert_eq(cfx_task_id(w.t), id, "the task changed its id");
    check_result("trestart/a", 11, 3000);
    cfx_task_free(w.t);
    worker_end(&wk);
    cr_assert_eq(wk.seen['a'], 1, "the task ran %u times", wk.seen['a']);
}

/* The worker's one core runs @p run (held at its gate); @p queued waits
 * behind it at the coordinator, which is then killed and restarted: only
 * the submitter knows of the queued task after that.  The handles go to
 * *@p tr and *@p tq. */
static void queue_then_restart(const char *rname, struct count_arg *run, const char *qname,
                               struct count_arg *queued, struct cfx_task **tr,
                               struct cfx_task **tq)
{
    *tr = submit(rname, run);
    started(&wk, run->tag);
    *tq = submit(qname, queued);
    cr_assert_eq(cfx_task_node(*tq), 0, "placed at once on node %u", cfx_task_node(*tq));
    coord_run_restart(&co);
}

Test(tasks_restart, queued_task_placed_by_the_new_coordinator_runs_once)
{
    /* the worker's one core runs 'b'; 'q' is queued behind it at the old
     * coordinator, which only its submitter knows of after the kill */
    struct count_arg a = { .tag = 'b', .gate = 1, .seed = 12, .size = 100 };
    struct count_arg q = { .tag = 'q', .gate = 0, .seed = 13, .size = 70000 };
    struct cfx_task *tb, *tq;
    queue_then_restart("trestart/b", &a, "trestart/q", &q, &tb, &tq);
    release(&wk);
    uint32_t node = 0;
    cr_assert_eq(cfx_task_wait(tq, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk.c.node);
    cr_assert_eq(cfx_task_wait(tb, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    check_result("trestart/b", 12, 100);
    check_result("trestart/q", 13, 70000);
    cfx_task_free(tb);
    cfx_task_free(tq);
    worker_end(&wk);
    cr_assert_eq(wk.seen['b'], 1, "'b' ran %u times", wk.seen['b']);
    cr_assert_eq(wk.seen['q'], 1, "'q' ran %u times", wk.seen['q']);
}

Test(tasks_restart, poll_that_submits_again_says_again_not_timeout)
{
    /* 'q' is queued behind 'e' at the old coordinator; the new one does
     * not know it, so a poll (timeout 0) submits it again.  The poll's
     * timeout passed, not the task's deadline: CFX_ERR_AGAIN, and the task
     * goes on.  (Before: the repeat was sent with the poll's deadline,
     * already past, and its CFX_ERR_TIMEOUT, which names the task's own
     * deadline, was the answer.) */
    struct count_arg e = { .tag = 'e', .gate = 1, .seed = 17, .size = 40 };
    struct count_arg q = { .tag = 'p', .gate = 0, .seed = 18, .size = 5000 };
    struct cfx_task *te, *tq;
    queue_then_restart("trestart/e", &e, "trestart/p", &q, &te, &tq);
    struct cfx_ctl_status st; /* a call that waits for the reconnection */
    cr_assert_eq(cfx__ctl_status(ctx->ctl, &st, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_task_wait(tq, 0, NULL), CFX_ERR_AGAIN, "%s", cfx_last_error());
    release(&wk);
    cr_assert_eq(cfx_task_wait(tq, CALL_MS, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(te, CALL_MS, NULL), CFX_OK, "%s", cfx_last_error());
    check_result("trestart/e", 17, 40);
    check_result("trestart/p", 18, 5000);
    cfx_task_free(te);
    cfx_task_free(tq);
    worker_end(&wk);
    cr_assert_eq(wk.seen['e'], 1, "'e' ran %u times", wk.seen['e']);
    cr_assert_eq(wk.seen['p'], 1, "'p' ran %u times", wk.seen['p']);
}

Test(tasks_restart, wait_without_a_coordinator_ends_at_its_timeout)
{
    /* the coordinator is gone: a wait of 300 ms fails with CFX_ERR_CONNECT
     * once those 300 ms passed, as its error says.  (Before: it waited for
     * the reconnection CFX_PROTO_WAIT_MARGIN_MS longer, the margin a
     * wait's call keeps for the coordinator's answer, and said "within the
     * call's 10299 ms".)  The task ran and its end is known to the
     * coordinator that comes back. */
    struct count_arg f = { .tag = 'f', .gate = 0, .seed = 19, .size = 64 };
    struct cfx_task *t = submit("trestart/f", &f);
    started(&wk, 'f');
    coord_run_kill(&co);
    cr_assert_eq(cfx_task_wait(t, 300, NULL), CFX_ERR_CONNECT, "%s", cfx_last_error());
    const char *within = strstr(cfx_last_error(), "within the call's ");
    cr_assert(within, "%s", cfx_last_error());
    cr_assert_leq(atoi(within + strlen("within the call's ")), 300, "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), co.cc.addr), "%s", cfx_last_error());
    coord_run_start(&co);
    cr_assert_eq(cfx_task_wait(t, CALL_MS, NULL), CFX_OK, "%s", cfx_last_error());
    check_result("trestart/f", 19, 64);
    cfx_task_free(t);
    worker_end(&wk);
    cr_assert_eq(wk.seen['f'], 1, "'f' ran %u times", wk.seen['f']);
}

Test(tasks_restart, wait_forever_ends_at_the_tasks_deadline_without_a_coordinator)
{
    /* a wait without a timeout of its own (-1) on a task with a deadline:
     * the coordinator is gone for good, so the wait ends once the task's
     * deadline (and the margin for an answer) passed, with
     * CFX_ERR_CONNECT naming the coordinator.  (Before: it waited for the
     * reconnection forever, long after the task had ended for its waiter.) */
    struct count_arg g = { .tag = 'g', .gate = 1, .seed = 23, .size = 64 };
    struct cfx_object_id r;
    struct cfx_task_params p = { .field_mask = CFX_TASK_PARAM_ARG | CFX_TASK_PARAM_TIMEOUT,
                                 .arg = &g, .arg_len = sizeof(g), .timeout_ms = 200 };
    struct cfx_task *t = NULL;
    oid("trestart/g", &r);
    cr_assert_eq(cfx_task_submit(ctx, "count", NULL, 0, &r, 1, NULL, &p, &t), CFX_OK,
                 "submit: %s", cfx_last_error());
    started(&wk, 'g');
    coord_run_kill(&co);
    int rc = cfx_task_wait(t, -1, NULL);
    cr_assert_eq(rc, CFX_ERR_CONNECT, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), co.cc.addr), "%s", cfx_last_error());
    cfx_task_free(t);
    release(&wk);
    coord_run_start(&co);
    worker_end(&wk);
    cr_assert_eq(wk.seen['g'], 1, "'g' ran %u times", wk.seen['g']);
}

/* A raw TASK_SUBMIT of "count" with @p key, as cfx_task_submit sends it
 * (with @p flags: CFX_PROTO_TASK_AGAIN as its repeat after a lost reply). */
static int raw_submit(uint64_t key, uint8_t flags, const char *result, struct count_arg *a,
                      struct cfx_msg_task_st *st)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_SUBMIT }, reply;
    void *frame = NULL;
    snprintf(m.u.task.name, sizeof(m.u.task.name), "count");
    m.u.task.key = key;
    m.u.task.flags = flags;
    m.u.task.cores = 1;
    m.u.task.timeout_ms = CALL_MS;
    m.u.task.nresults = 1;
    oid(result, &m.u.task.results[0]);
    m.u.task.arg = (const uint8_t *)a;
    m.u.task.arg_len = sizeof(*a);
    int rc = cfx__ctl_request(ctx->ctl, &m, cfx__deadline_ns(CALL_MS), "raw submit",
                              CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK)
        *st = reply.u.task_st;
    free(frame);
    return rc;
}

static int raw_wait(uint64_t id)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_WAIT }, reply;
    void *frame = NULL;
    m.u.task_st.task_id = id;
    m.u.task_st.timeout_ms = CALL_MS;
    int rc = cfx__ctl_request(ctx->ctl, &m, cfx__deadline_ns(2 * CALL_MS), "raw wait",
                              CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK)
        rc = reply.u.task_st.status;
    free(frame);
    return rc;
}

Test(tasks_restart, submission_repeated_with_its_key_runs_once)
{
    /* the same key twice (a repeat whose first reply was lost): one task */
    struct count_arg a = { .tag = 'c', .gate = 1, .seed = 14, .size = 500 };
    struct cfx_msg_task_st s1, s2;
    uint64_t key = 0x6b657963ull << 20 | (uint64_t)getpid();
    cr_assert_eq(raw_submit(key, 0, "trestart/c", &a, &s1), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(raw_submit(key, CFX_PROTO_TASK_AGAIN, "trestart/c", &a, &s2), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(s2.task_id, s1.task_id);
    cr_assert_eq(s2.node_id, wk.c.node);
    started(&wk, 'c');
    release(&wk);
    cr_assert_eq(raw_wait(s1.task_id), CFX_OK, "%s", cfx_last_error());
    check_result("trestart/c", 14, 500);

    /* a repeat after a kill -9 (its reply lost with the old coordinator),
     * before the worker re-announced the running task: one task again */
    struct count_arg d = { .tag = 'd', .gate = 1, .seed = 15, .size = 900 };
    cr_assert_eq(raw_submit(key + 1, 0, "trestart/d", &d, &s1), CFX_OK, "%s", cfx_last_error());
    started(&wk, 'd');
    coord_run_restart(&co);
    cr_assert_eq(raw_submit(key + 1, CFX_PROTO_TASK_AGAIN, "trestart/d", &d, &s2), CFX_OK,
                 "%s", cfx_last_error());
    release(&wk);
    cr_assert_eq(raw_wait(s2.task_id), CFX_OK, "%s", cfx_last_error());
    check_result("trestart/d", 15, 900);
    worker_end(&wk);
    cr_assert_eq(wk.seen['c'], 1, "'c' ran %u times", wk.seen['c']);
    cr_assert_eq(wk.seen['d'], 1, "'d' ran %u times", wk.seen['d']);
}

Test(tasks_restart, worker_killed_while_the_coordinator_is_down)
{
    /* its only worker dies with it while the coordinator is away: the new
     * coordinator waits the grace for it, then fails the task naming it */
    struct count_arg a = { .tag = 'k', .gate = 1, .seed = 16, .size = 10 };
    struct cfx_task *t = submit("trestart/k", &a);
    uint32_t dead = wk.c.node;
    started(&wk, 'k');
    coord_run_kill(&co);
    worker_kill(&wk);
    coord_run_start(&co);
    uint32_t node = 0;
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_ERR_PEER_FAILED, "%s",
                 cfx_last_error());
    char want[32];
    snprintf(want, sizeof(want), "node %u ran it", dead);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cfx_task_free(t);
}

Test(tasks_restart, queued_task_waits_for_a_worker_when_the_last_one_dies)
{
    /* 'r' runs on the worker's one core, 'u' is queued behind it; the
     * worker dies, the only one offering "count": 'r' fails naming it, and
     * 'u' waits for the worker that registers next and runs there once.
     * (Before: 'u' ended with placement's CFX_ERR_NOT_FOUND, "no live node
     * registered the function", which for a wait says that the task ended
     * and was forgotten long ago.) */
    struct count_arg r = { .tag = 'r', .gate = 1, .seed = 20, .size = 30 };
    struct count_arg u = { .tag = 'u', .gate = 0, .seed = 22, .size = 7000 };
    struct cfx_task *tr = submit("trestart/r", &r);
    uint32_t dead = wk.c.node;
    started(&wk, 'r');
    struct cfx_task *tu = submit("trestart/u", &u);
    cr_assert_eq(cfx_task_node(tu), 0, "placed at once on node %u", cfx_task_node(tu));
    worker_kill(&wk);
    cr_assert_eq(cfx_task_wait(tr, CALL_MS, NULL), CFX_ERR_PEER_FAILED, "%s",
                 cfx_last_error());
    char want[32];
    snprintf(want, sizeof(want), "node %u died", dead);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    worker_start(&wk);
    uint32_t node = 0;
    cr_assert_eq(cfx_task_wait(tu, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk.c.node);
    check_result("trestart/u", 22, 7000);
    cfx_task_free(tr);
    cfx_task_free(tu);
    worker_end(&wk);
    cr_assert_eq(wk.seen['u'], 1, "'u' ran %u times", wk.seen['u']);
}

/* ---- without a state directory -------------------------------------------------- */

/* Start the coordinator of co on co.port without --state-dir (what coord_run
 * always passes): it keeps nothing across a restart, node ids included. */
static void stateless_start(void)
{
    const char *a[] = { "--port", co.port, "--token", co.token, "--heartbeat-ms", "100",
                        "--dead-after-ms", "1500", "--task-grace-ms", GRACE_MS, NULL };
    coord_child_start(&co.cc, co.logpath, 0, a);
}

static void stateless_setup(void)
{
    memset(&co, 0, sizeof(co));
    cfx_test_token(co.token, sizeof(co.token));
    snprintf(co.dir, sizeof(co.dir), "/tmp/cfx-trestart-sl-%d", (int)getpid());
    cr_assert(mkdir(co.dir, 0700) == 0 || errno == EEXIST, "mkdir %s", co.dir);
    snprintf(co.logpath, sizeof(co.logpath), "%s/coord.log", co.dir);
    snprintf(co.port, sizeof(co.port), "0");
    stateless_start();
}

static void stateless_teardown(void)
{
    char cmd[256];
    cfx_context_destroy(ctx);
    worker_end(&wk);
    coord_child_kill(&co.cc, SIGTERM);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", co.dir);
    (void)!system(cmd);
}

TestSuite(tasks_stateless, .init = stateless_setup, .fini = stateless_teardown, .timeout = 120);

Test(tasks_stateless, nodes_keep_their_ids_and_the_task_runs_once)
{
    /* Nodes 1 and 2 leave, so the worker is node 3 and the submitter node
     * 4.  After a kill -9 of a coordinator without a state directory each
     * gets its id back (none is taken), so the waiter's hint ("node 3")
     * still names the worker, which runs the task once.  (Before: the new
     * coordinator numbered the reconnecting nodes 1 and 2, in the order
     * they came; the wait answered from another id, or, with a hint
     * naming the wrong worker, a second run.) */
    struct cfx_context *gone[2];
    for (int i = 0; i < 2; i++)
        gone[i] = coord_run_join_at(co.cc.addr, co.token, CALL_MS);
    cr_assert(gone[0] && gone[1], "%s", cfx_last_error());
    worker_start(&wk);
    ctx = coord_run_join_at(co.cc.addr, co.token, CALL_MS);
    cr_assert(ctx, "%s", cfx_last_error());
    for (int i = 0; i < 2; i++)
        cfx_context_destroy(gone[i]);
    uint32_t me = cfx_context_node_id(ctx);
    cr_assert_eq(wk.c.node, 3);
    cr_assert_eq(me, 4);

    struct count_arg a = { .tag = 's', .gate = 1, .seed = 21, .size = 2000 };
    struct waiter w = { .t = submit("trestart/s", &a) };
    uint64_t id = cfx_task_id(w.t);
    started(&wk, 's');
    cr_assert_eq(pthread_create(&w.th, NULL, wait_main, &w), 0);
    snprintf(co.port, sizeof(co.port), "%u", co.cc.port);
    coord_child_kill(&co.cc, SIGKILL);
    stateless_start();
    release(&wk);
    pthread_join(w.th, NULL);
    cr_assert_eq(w.rc, CFX_OK, "wait: %s", w.err);
    cr_assert_eq(w.node, wk.c.node, "ended on node %u; the worker was node %u", w.node, wk.c.node);
    cr_assert_eq(cfx_task_id(w.t), id, "the task changed its id");
    cr_assert_eq(cfx_context_node_id(ctx), me, "the submitter is node %u now, was %u",
                 cfx_context_node_id(ctx), me);
    check_result("trestart/s", 21, 2000);
    cfx_task_free(w.t);
    worker_end(&wk);
    cr_assert_eq(wk.seen['s'], 1, "the task ran %u times", wk.seen['s']);
}

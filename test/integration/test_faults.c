/*
 * Fault tests: a process is SIGKILLed (or SIGSTOPped) in the middle of an
 * operation, over tcp and shm, and the survivors must end with the right
 * bytes or the stated error within the deadline — never hang.
 *
 *   receiver   a getter dies mid-get; the source carries on serving others
 *   relay      a relay in the middle of a broadcast chain dies; every
 *              getter below it resumes elsewhere with the right bytes
 *   reduce     an input holder dies during cfx_reduce_objects (k = n)
 *   allreduce  a group member dies during an allreduce (and, "stall", stops
 *              without closing anything, so only missed heartbeats tell);
 *              every survivor gets CFX_ERR_PEER_FAILED naming it, then the
 *              survivors form a new group and go on
 *   kill_in_loop a group member dies in a loop of allreduces, broadcasts or
 *              barriers: every survivor's error names it as the rank that
 *              died (not a survivor that gave up because of it)
 *   coord      the coordinator is killed with SIGKILL during a transfer
 *
 * The multi-process cases run test/progs/cfx_faulttest under cfx_run, which
 * checks bytes and statuses itself and exits non-zero on the first failure;
 * detection times are printed (METRIC lines), not checked.  Watchdogs: cfx_run --timeout inside, Criterion's
 * .timeout outside; a hang fails the test either way.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "coord_child.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

/* Run cfx_run over @p tp with @p env, @p extra options and cfx_faulttest
 * @p args; its exit status (128+SIG when killed). */
static int run(const char *env, const char *tp, int n, const char *extra, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s %s/cfx_run -n %d --transport %s --timeout 90 %s %s/cfx_faulttest %s", env,
             CFX_BIN_DIR, n, tp, extra, CFX_BIN_DIR, args);
    cr_log_info("%s", cmd);
    int st = system(cmd);
    cr_assert(st != -1, "cannot run %s", cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct tp_param {
    char tp[8]; /* an array, not a pointer: each test runs in a fresh process */
};

static struct tp_param tps[] = { { "tcp" }, { "shm" } };

#define TP_PARAMS(test)                                                        \
    ParameterizedTestParameters(faults, test)                                  \
    {                                                                          \
        return cr_make_param_array(struct tp_param, tps, 2);                   \
    }

TP_PARAMS(receiver)

/* A receiver is SIGKILLed after 2 MiB of a 32 MiB get paced at 16 MiB/s; a
 * later getter gets every byte from the source (--fanout 1: the slot the
 * dead receiver held must have been given back), and the source's delete
 * returns at once (no upload to the dead node left waiting). */
ParameterizedTest(struct tp_param *p, faults, receiver, .timeout = 150)
{
    int rc = run("CFX_UPLOAD_RATE=16M CFX_CHUNK_SIZE=262144", p->tp, 3,
                 "--fanout 1 --allow-fail 1", "receiver 33554432");
    cr_assert_eq(rc, 0, "receiver killed over %s: cfx_run exited %d", p->tp, rc);
}

TP_PARAMS(relay)

/* A chain 0 -> 1 -> 2 -> 3 -> 4 (fanout 1); rank 2 is SIGKILLed while rank 3
 * reads its partial copy; ranks 1, 3 and 4 end with the right bytes and
 * rank 3 switched source at least once. */
ParameterizedTest(struct tp_param *p, faults, relay, .timeout = 150)
{
    int rc = run("CFX_UPLOAD_RATE=16M CFX_CHUNK_SIZE=262144", p->tp, 5,
                 "--fanout 1 --allow-fail 2", "relay 33554432");
    cr_assert_eq(rc, 0, "relay killed over %s: cfx_run exited %d", p->tp, rc);
}

TP_PARAMS(reduce)

/* 4 inputs of 16 MiB reduced (k = n) as a chain, paced; the holder of input
 * 2 dies after 1 MiB has moved: the driver gets CFX_ERR_PEER_FAILED or
 * CFX_ERR_TIMEOUT naming its node within the 5 s deadline.  (Today the
 * driver learns of the death at once but waits out the deadline for other
 * inputs, even with k = n: docs/RELIABILITY.md.) */
ParameterizedTest(struct tp_param *p, faults, reduce, .timeout = 150)
{
    int rc = run("CFX_UPLOAD_RATE=16M CFX_CHUNK_SIZE=262144 CFX_REDUCE_SHAPE=chain "
                 "CFX_FAULT_DEADLINE_MS=5000", p->tp, 4,
                 "--allow-fail 2", "reduce 16777216");
    cr_assert_eq(rc, 0, "reduce input holder killed over %s: cfx_run exited %d", p->tp, rc);
}

TP_PARAMS(allreduce)

/*
 * A member of a 4-rank group dies in a 32 MiB allreduce (paced); every
 * survivor's call must end with CFX_ERR_PEER_FAILED naming it (the 30 s
 * deadline only ends a hang), never a wrong result; then the 3 survivors
 * form a new group whose allreduce is right.
 * How soon each survivor knew is printed (METRIC) and compared with the
 * documented 2 s by scripts/bench-goals.sh; CFX_FAULT_GROUP_STRICT=0 (see
 * docs/RELIABILITY.md, known gaps) would accept CFX_ERR_TIMEOUT as well.
 */
ParameterizedTest(struct tp_param *p, faults, allreduce, .timeout = 150)
{
    int rc = run("CFX_UPLOAD_RATE=32M CFX_FAULT_DEADLINE_MS=30000",
                 p->tp, 4, "--allow-fail 2", "allreduce 33554432");
    cr_assert_eq(rc, 0, "group member killed over %s: cfx_run exited %d", p->tp, rc);
}

TP_PARAMS(allreduce_stall)

/* As allreduce, but the member stops (SIGSTOP): its sockets stay open, so
 * only the coordinator's missed-heartbeat rule (dead after 1.5 s of
 * silence) can reveal it.  Every survivor must get CFX_ERR_PEER_FAILED
 * naming it (CFX_FAULT_GROUP_STRICT=1), which only that rule can give: the
 * calls' 30 s deadline leaves it all the room a loaded machine needs, and
 * how soon it came is printed for scripts/bench-goals.sh.  Rank 0 SIGKILLs
 * the stopped victim at the end. */
ParameterizedTest(struct tp_param *p, faults, allreduce_stall, .timeout = 150)
{
    int rc = run("CFX_UPLOAD_RATE=32M CFX_FAULT_DEADLINE_MS=30000", p->tp, 4, "--allow-fail 2",
                 "allreduce 33554432 stall");
    cr_assert_eq(rc, 0, "group member stalled over %s: cfx_run exited %d", p->tp, rc);
}

TP_PARAMS(gone_exit)

/*
 * A member of a 4-rank group destroys its group and context and exits 0
 * after a checked allreduce; once its process is gone, the survivors'
 * allreduce and barrier on the old group fail with CFX_ERR_PEER_FAILED
 * naming rank 2 and its node within their 10 s deadline, cfx_group_destroy
 * returns within it, and the 3 survivors' new group's allreduce is right.
 */
ParameterizedTest(struct tp_param *p, faults, gone_exit, .timeout = 150)
{
    int rc = run("CFX_FAULT_DEADLINE_MS=10000", p->tp, 4, "", "gone 262144 exit");
    cr_assert_eq(rc, 0, "group member gone (exit) over %s: cfx_run exited %d", p->tp, rc);
}

struct loop_param {
    char tp[8];
    char op[16];
};

static struct loop_param loops[] = {
    { "tcp", "allreduce" }, { "tcp", "broadcast" }, { "tcp", "barrier" },
    { "shm", "allreduce" }, { "shm", "broadcast" }, { "shm", "barrier" },
};

ParameterizedTestParameters(faults, kill_in_loop)
{
    return cr_make_param_array(struct loop_param, loops, CFX_ARRAY_SIZE(loops));
}

/*
 * A member of a 4-rank group is SIGKILLed in the middle of a loop of 1 MiB
 * allreduces, broadcasts or barriers (no pacing: the survivors learn of the
 * death at different moments, from their connections, the coordinator, or
 * a survivor that gave the call up).  Every survivor's error must say
 * "rank 2 (node N) died", never blame a survivor that withdrew because of
 * it, and no rank may log that the ranks "disagreed on" the arguments of a
 * call that failed because of the death; the survivors' new group's
 * allreduce is right (cfx_faulttest loop checks all of it but the log).
 */
ParameterizedTest(struct loop_param *p, faults, kill_in_loop, .timeout = 150)
{
    char log[128], env[256];
    snprintf(log, sizeof(log), "/tmp/cfx-test-faults-loop-%d.log", (int)getpid());
    unlink(log);
    snprintf(env, sizeof(env), "CFX_LOG_FILE=%s CFX_FAULT_DEADLINE_MS=30000", log);
    char args[64];
    snprintf(args, sizeof(args), "loop 1048576 %s", p->op);
    int rc = run(env, p->tp, 4, "--allow-fail 2", args);
    FILE *f = fopen(log, "r");
    char line[1024];
    bool disagreed = false;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "disagreed on its arguments")) {
            cr_log_error("%s", line);
            disagreed = true;
        }
    }
    if (f)
        fclose(f);
    unlink(log);
    cr_assert_eq(rc, 0, "%s loop with a member killed over %s: cfx_run exited %d", p->op,
                 p->tp, rc);
    cr_assert(!disagreed, "%s loop over %s: a false disagreement was logged", p->op, p->tp);
}

TP_PARAMS(gone_kill)

/* The same with the member SIGKILLed between two collectives. */
ParameterizedTest(struct tp_param *p, faults, gone_kill, .timeout = 150)
{
    int rc = run("CFX_FAULT_DEADLINE_MS=10000", p->tp, 4, "--allow-fail 2",
                 "gone 262144 kill");
    cr_assert_eq(rc, 0, "group member gone (SIGKILL) over %s: cfx_run exited %d", p->tp, rc);
}

/* ---- the coordinator killed mid-operation -------------------------------- */

#define BIG   (32u << 20) /* paced at 16 MiB/s: about two seconds on the wire */
#define SMALL 1000u

static struct coord_child cc;
static char token[64], dir[128], logpath[160];
static const char *cargs[16];

static void coord_start(const char *port)
{
    static char portarg[16];
    snprintf(portarg, sizeof(portarg), "%s", port);
    const char *a[] = { "--port", portarg, "--token", token, NULL };
    memcpy(cargs, a, sizeof(a));
    coord_child_start(&cc, logpath, 0, cargs);
}

static void coord_setup(void)
{
    cfx_test_token(token, sizeof(token));
    snprintf(dir, sizeof(dir), "/tmp/cfx-faults-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(logpath, sizeof(logpath), "%s/coord.log", dir);
    coord_start("0");
}

static void coord_teardown(void)
{
    char cmd[256];
    coord_child_kill(&cc, SIGTERM);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}

static struct cfx_context *join(const char *tp)
{
    struct cfx_context *ctx;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = cc.addr,
        .token = token,
        .timeout_ms = 20000,
        .transports = tp,
    };
    cr_assert_eq(cfx_context_create(&p, &ctx), CFX_OK, "%s", cfx_last_error());
    return ctx;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

TP_PARAMS(coord_killed)

/*
 * Two nodes in this process; b pulls a 32 MiB object from a and the
 * coordinator is SIGKILLed mid-transfer and left down.  Asserted: the
 * transfer completes with the right bytes without it; a get that needs the
 * directory while it is down ends by its 2 s deadline (no hang) with a
 * stated error; once the coordinator is back on its port, both nodes
 * reconnect and a get through the new directory succeeds.
 */
ParameterizedTest(struct tp_param *p, faults, coord_killed, .init = coord_setup,
                  .fini = coord_teardown, .timeout = 120)
{
    setenv("CFX_UPLOAD_RATE", "16777216", 1);
    struct cfx_context *a = join(p->tp), *b = join(p->tp);
    unsetenv("CFX_UPLOAD_RATE");
    uint8_t *big = malloc(BIG), *dst = malloc(BIG), small[SMALL], sdst[SMALL];
    cfx_test_fill(big, BIG, 1);
    cfx_test_fill(small, SMALL, 2);
    struct cfx_object_id xbig, xsmall, xlater;
    cfx_object_id_generate(a, &xbig);
    cfx_object_id_generate(a, &xsmall);
    cfx_object_id_generate(a, &xlater);
    cr_assert_eq(cfx_put(a, &xbig, big, BIG, NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_request *req;
    cr_assert_eq(cfx_get_nb(b, &xbig, dst, BIG, NULL, &req), CFX_OK, "%s", cfx_last_error());
    struct cfx_context_stats st;
    uint64_t deadline = cfx__deadline_ns(30000);
    do {
        usleep(5000);
        cfx_context_stats(b, &st);
    } while (st.bytes_received < (4u << 20) && cfx__now_ns() < deadline);
    cr_assert_geq(st.bytes_received, 4u << 20, "the transfer did not start");
    char port[16];
    snprintf(port, sizeof(port), "%u", cc.port);
    coord_child_kill(&cc, SIGKILL);
    cfx_context_stats(b, &st);
    cr_assert_lt(st.bytes_received, BIG, "the transfer finished before the kill");
    cr_log_info("coordinator killed over %s with %llu of %u bytes received", p->tp,
                (unsigned long long)st.bytes_received, BIG);

    /* the data plane finishes without the coordinator */
    cr_assert_eq(cfx_request_wait(req, 30000), CFX_OK, "%s", cfx_last_error());
    cfx_request_free(req);
    cr_assert_eq(cfx_test_check(dst, BIG, 1), (size_t)-1, "bytes differ");

    /* a lookup while the directory is gone ends by its deadline */
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 2000 };
    double t = now_s();
    int rc = cfx_get(b, &xlater, sdst, sizeof(sdst), NULL, &gp);
    t = now_s() - t;
    cr_log_info("get while the coordinator is down: %s after %.3f s: %s", cfx_errname(rc), t,
                cfx_last_error());
    cr_assert_neq(rc, CFX_OK, "a get of an object nobody put succeeded");
    /* it ended, with a stated error; 30 s is the limit against a hang */
    cr_assert_lt(t, 30.0, "a get with a 2 s deadline hung for %.3f s with the coordinator down", t);

    /* back on the same port: both reconnect; the directory works again */
    coord_start(port);
    deadline = cfx__deadline_ns(60000);
    while ((cfx__ctl_reconnects(a->ctl) == 0 || cfx__ctl_reconnects(b->ctl) == 0) &&
           cfx__now_ns() < deadline)
        usleep(10 * 1000);
    cr_assert_geq(cfx__ctl_reconnects(a->ctl), 1, "node a did not reconnect");
    cr_assert_geq(cfx__ctl_reconnects(b->ctl), 1, "node b did not reconnect");
    cr_assert_eq(cfx_put(a, &xsmall, small, SMALL, NULL), CFX_OK, "%s", cfx_last_error());
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &xsmall, sdst, SMALL, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, SMALL);
    cr_assert_eq(cfx_test_check(sdst, SMALL, 2), (size_t)-1, "bytes differ");

    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(dst);
    free(big);
}

/*
 * Rank program for the parameter-server tests, started by cfx_run.
 *
 *   cfx_run -n S+W+L cfx_pstest [options]
 *
 * Ranks 0..S-1 are servers, S..S+W-1 workers (worker index = rank - S), the
 * last L ranks are servers that join the running job when worker 0 says so.
 * Each worker runs STEPS steps; a step push-pulls three tensors (f32, f64,
 * i32, several blocks each) with gradients that depend on (worker, step,
 * element) and are exactly representable, so every result has one right
 * answer:
 *  - BSP: after each step the pulled values equal the analytic value
 *    exactly (SUM and SGD: closed form; MOMENTUM and ADAM: the same
 *    arithmetic replayed here);
 *  - SSP/ASP: the values after the last step equal the analytic sum, and
 *    with --trace, no worker ever ran more than the staleness bound ahead
 *    (checked by worker 0 from every worker's send/receive times).
 * Options:
 *   --servers S --workers W --late L --steps N --block BYTES
 *   --consistency bsp|ssp|asp --staleness K --opt sum|sgd|momentum|adam
 *   --remove-at STEP:SERVER   worker 0 removes SERVER before STEP
 *   --join-at STEP            worker 0 lets the next late server join before STEP
 *   --standby                 late servers join as standby; worker 0 adds them
 *                             with cfx_ps_add_server()
 *   --auto-add                ... with cfx_ps_add_server_auto() (placement chooses;
 *                             the one standby server must be chosen)
 *   --rebalance-at STEP       worker 0 asks for a rebalance before STEP
 *   --delay SERVER:US         test-only service delay on SERVER from the start
 *   --skew US                 worker w sleeps w*US per step (SSP tests)
 *   --trace DIR               write and check the SSP trace
 *   --expect-moves            fail unless blocks actually migrated (with --delay:
 *                             off the slowed server, below the others' mean)
 *   --expect-removed SERVER   fail unless SERVER ends with no blocks (removed by rdmactl)
 *   --sched-dies-at STEP      worker 0 lets the scheduler's rank (server 0) SIGKILL itself
 *                             before STEP; every other rank must then get
 *                             CFX_ERR_PEER_FAILED naming the scheduler's node (exit 0)
 *   --worker-dies-at STEP     the last worker SIGKILLs itself before STEP (BSP or SSP):
 *                             every other worker's op of a step its push is missing from
 *                             must fail with CFX_ERR_PEER_FAILED naming it (exit 0)
 *   --handover-lost SERVER    SERVER dies as it hands its blocks over (run with
 *                             CFX_PS_TEST_MIGRATE_DIE=1 CFX_PS_TEST_MIGRATE_SERVER=SERVER
 *                             and --remove-at STEP:SERVER): every worker's op from STEP on
 *                             must fail with CFX_ERR_PEER_FAILED naming SERVER's node
 *   --wait-retired            worker 0 waits (30 s at most) until the server removed by
 *                             --remove-at is retired before the job ends
 *   --pace US                 every worker sleeps US per step (a job that lasts)
 *   --extra N                 N more ranks run something else (a wrapper runs rdmactl)
 *   --device sim|cuda         workers push from and pull into device memory (sim: the
 *                             simulated device of gpu/sim.h; cuda: a real GPU); the
 *                             values are checked on host copies of the device buffers
 *   --late-tensor             after the last step every worker registers one more tensor
 *                             ("late", f32, 9 blocks) and runs LATE_STEPS BSP push-pulls of
 *                             it: its initial values and every result exact; worker 0
 *                             checks that no block of it went to a server that is not
 *                             active (removed) or that died (--server-dies)
 *   --server-dies K           (with --late-tensor) server K SIGKILLs itself after the last
 *                             step; worker 0 waits for its exit (a pidfd) and for the shard
 *                             map the scheduler publishes when it sees K go, which must
 *                             name K failed with the blocks it held (read as rdmactl ps
 *                             shards reads it, each version waited for as it is put), then
 *                             the late tensor is registered: every register must succeed
 *                             (none may time out or blame a worker), and the old tensors'
 *                             final pulls are exact or fail with CFX_ERR_PEER_FAILED naming
 *                             K's node, at least one failing, their blocks on live servers
 *                             exact all the same (run with --allow-fail K)
 *   --survivors SRV           (with --server-dies K and --delay SRV:US) the job starts with
 *                             automatic balancing off; once the map names K failed and
 *                             "late" is registered, worker 0 turns it on and the workers
 *                             push-pull "late" step after step, every element checked,
 *                             until the map moves blocks off straggler SRV (K's missing
 *                             traffic must not hold the decision), then worker 0 removes
 *                             SRV and they go on until it is retired (K's missing
 *                             settlement must not hold it); K keeps its blocks throughout.
 *                             Each phase waits for the map (30 s at most)
 *   --remove-failed           (with --server-dies K, K != 1) instead of the final pulls
 *                             worker 0 removes failed K, then live server 1: see
 *                             removed_failed(); with CFX_PS_TEST_SKIP_FAILED_MAPS=S in
 *                             the environment (server S deaf to the notices of maps
 *                             naming K failed) worker 0 registers a 1-element tensor
 *                             first, so that S skips a map, and the removal must give
 *                             S a block of K's
 *   --rdmactl PATH            (with --server-dies K) worker 0 runs PATH ps shards, text and
 *                             --json, once the map names K failed: both must say so
 *   --dies-registering        (with --server-dies K) K dies instead as the scheduler gives
 *                             it blocks of the late tensor, before the scheduler can have
 *                             seen it go (run with CFX_PS_TEST_DIE_TENSOR=late
 *                             CFX_PS_TEST_DIE_SERVER=K): every worker's register of it
 *                             must fail with CFX_ERR_PEER_FAILED naming K and its node, not
 *                             a worker, well before the job's timeout
 *   --timeout MS              the job's timeout (default 30000)
 *   --skip-server K           the rank of server K is server S instead: no process takes
 *                             index K (the initial servers' indices skip it).  The job
 *                             must not start: server 0 gives up at the timeout naming
 *                             server K as missing and server S as past the initial ones,
 *                             and every other member (waiting three times as long) hears
 *                             that from it (CFX_ERR_TIMEOUT; exit 0)
 *   --dies-at-start K         server K is killed right after it announced itself (run with
 *                             CFX_PS_TEST_DIE_ANNOUNCED=K), once every other rank's
 *                             context has joined; the last worker creates its
 *                             handle only once K's announcement went with its node.  The
 *                             job must not start, and every member must fail with
 *                             CFX_ERR_PEER_FAILED naming K's death (K 0: the scheduler's),
 *                             well before the timeout (exit 0)
 * Exits non-zero with a message on the first wrong value or failed call.
 */
#include <conflux/conflux.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/ps/ps_int.h" /* the shard map's owners, for --server-dies */
#include "gpu/memtype.h"
#include "gpu/sim.h"
#include "test/common/testutil.h"
#include "cfx_pstest/pstest.h"

#define DIE CFX_TEST_DIE

#define JOB "pstest"
#define NT  3

static int S = 2, W = 2, L = 0, STEPS = 20, STALE = 1, SKEW_US = 0, REMOVE_AT = -1, REMOVE_SRV = -1,
           JOIN_AT = -1, REBAL_AT = -1, DELAY_SRV = -1, EXPECT_MOVES = 0, EXTRA = 0, PACE_US = 0,
           EXPECT_REMOVED = -1, STANDBY = 0, AUTO_ADD = 0, WAIT_RETIRED = 0, SCHED_DIES_AT = -1,
           HANDOVER_LOST = -1, WORKER_DIES_AT = -1, RUNS = 1, TIMEOUT_MS = 30000,
           SKIP_SRV = -1, DIES_AT_START = -1, LATE_TENSOR = 0, SERVER_DIES = -1,
           DIES_REGISTERING = 0, SURVIVORS = -1, REMOVE_FAILED = 0,
           RUN = 0; /* --runs: the job again, same name, same contexts */
static size_t BLOCK = 4096;
static uint32_t DELAY_US = 0;
static enum cfx_ps_consistency CONS = CFX_PS_BSP;
static enum cfx_ps_optimizer OPT = CFX_PS_OPT_SUM;
static const char *TRACE;
static const char *DEVICE; /* --device */
static const char *RDMACTL; /* --rdmactl */

static const char *const tname[NT] = { "w_f32", "w_f64", "w_i32" };
static enum cfx_dtype tdt[NT] = { CFX_DTYPE_F32, CFX_DTYPE_F64, CFX_DTYPE_I32 };
static const size_t tcount[NT] = { 5000, 1500, 2100 };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double init_v(size_t i)
{
    return (double)(i % 7) - 3.0;
}

static double grad_v(int w, int step, size_t i)
{
    return (double)((w + 1) * (int)((i + (size_t)step) % 5)) - 2.0;
}

static struct cfx_ps_optim optim(void)
{
    struct cfx_ps_optim o = { .type = OPT,
                              .lr = 0.5,
                              .momentum = 0.5,
                              .beta1 = 0.9,
                              .beta2 = 0.999,
                              .eps = 1e-8,
                              .weight_decay = 0,
                              .grad_scale = 1.0 };
    return o;
}

/* The value of element i after @p steps rounds of every worker's pushes. */
static double expect_closed(size_t i, int steps)
{
    double sum = 0;
    for (int t = 0; t < steps; t++)
        for (int w = 0; w < W; w++)
            sum += grad_v(w, t, i);
    if (OPT == CFX_PS_OPT_SGD)
        return init_v(i) - 0.5 * sum;
    return init_v(i) + sum;
}

/* MOMENTUM / ADAM on f32, replayed exactly as the server computes it. */
struct replay {
    float *p, *m, *v;
    uint64_t t;
};

static double ipow(double x, uint64_t n)
{
    double r = 1;
    for (; n; n >>= 1, x *= x)
        if (n & 1)
            r *= x;
    return r;
}

static double root(double x)
{
    return __builtin_sqrt(x);
}

static void replay_round(struct replay *r, size_t n, int step)
{
    struct cfx_ps_optim o = optim();
    r->t++;
    double bc1 = 1 - ipow(o.beta1, r->t), bc2 = 1 - ipow(o.beta2, r->t);
    for (size_t i = 0; i < n; i++) {
        float acc = 0;
        for (int w = 0; w < W; w++)
            acc = w ? acc + (float)grad_v(w, step, i) : (float)grad_v(w, step, i);
        double gi = o.grad_scale * (double)acc + o.weight_decay * (double)r->p[i];
        if (o.type == CFX_PS_OPT_MOMENTUM) {
            r->m[i] = (float)(o.momentum * (double)r->m[i] + gi);
            r->p[i] = (float)((double)r->p[i] - o.lr * (double)r->m[i]);
        } else {
            r->m[i] = (float)(o.beta1 * (double)r->m[i] + (1 - o.beta1) * gi);
            r->v[i] = (float)(o.beta2 * (double)r->v[i] + (1 - o.beta2) * gi * gi);
            double mh = (double)r->m[i] / bc1, vh = (double)r->v[i] / bc2;
            r->p[i] = (float)((double)r->p[i] - o.lr * mh / (root(vh) + o.eps));
        }
    }
}

static void fill(void *buf, enum cfx_dtype dt, size_t n, double (*f)(int, int, size_t), int w,
                 int step)
{
    for (size_t i = 0; i < n; i++) {
        double v = f(w, step, i);
        if (dt == CFX_DTYPE_F32)
            ((float *)buf)[i] = (float)v;
        else if (dt == CFX_DTYPE_F64)
            ((double *)buf)[i] = v;
        else
            ((int32_t *)buf)[i] = (int32_t)v;
    }
}

static double init_f(int w, int s, size_t i)
{
    (void)w;
    (void)s;
    return init_v(i);
}

static double get(const void *buf, enum cfx_dtype dt, size_t i)
{
    return dt == CFX_DTYPE_F32   ? ((const float *)buf)[i]
           : dt == CFX_DTYPE_F64 ? ((const double *)buf)[i]
                                 : ((const int32_t *)buf)[i];
}

static void name_id(struct cfx_object_id *id, const char *what, int a)
{
    char name[96];
    snprintf(name, sizeof(name), JOB "-test/%d/%s/%d", RUN, what, a);
    cfx_object_id_from_name(name, id);
}

static void signal_obj(struct cfx_context *ctx, const char *what, int a)
{
    static uint8_t one = 1;
    struct cfx_object_id id;
    name_id(&id, what, a);
    CHECK_OK(cfx_put(ctx, &id, &one, 1, NULL));
}

static void wait_obj(struct cfx_context *ctx, const char *what, int a, int timeout_ms)
{
    static uint8_t b; /* a got object stays served from this buffer */
    size_t sz;
    struct cfx_object_id id;
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = timeout_ms };
    name_id(&id, what, a);
    CHECK_OK(cfx_get(ctx, &id, &b, 1, &sz, &op));
}

static struct cfx_ps_params base_params(void)
{
    struct cfx_ps_params p = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_CONSISTENCY | CFX_PS_PARAM_STALENESS | CFX_PS_PARAM_BLOCK_SIZE |
                      CFX_PS_PARAM_OPTIMIZER | CFX_PS_PARAM_TIMEOUT,
        .job = JOB,
        .num_workers = W,
        .num_servers = S,
        .consistency = CONS,
        .staleness = STALE,
        .block_size = BLOCK,
        .optim = optim(),
        .timeout_ms = TIMEOUT_MS,
    };
    if (DEVICE) {
        p.field_mask |= CFX_PS_PARAM_MEMTYPE;
        p.memtype = CFX_MEMTYPE_CUDA;
    }
    if (SURVIVORS > 0) { /* --survivors: nothing moves before the death */
        p.field_mask |= CFX_PS_PARAM_BALANCE;
        cfx__ps_balance_defaults(&p.balance);
        p.balance.enabled = 0;
        p.balance.interval_ms = 500;
    }
    return p;
}

/* --device: what push and pull see are device copies of the host buffers
 * the test fills and checks. */
static void *dgrad[NT], *dout[NT];

static void device_setup(const size_t *sz)
{
    if (!DEVICE)
        return;
    if (!strcmp(DEVICE, "sim"))
        CHECK_OK(cfx__gpu_sim_install());
    for (int t = 0; t < NT; t++) {
        CHECK_OK(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, sz[t], &dgrad[t]));
        CHECK_OK(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, sz[t], &dout[t]));
    }
}

static const void *push_buf(int t, const void *host, size_t sz)
{
    if (!DEVICE)
        return host;
    CHECK_OK(cfx__memcpy_typed(dgrad[t], CFX_MEMTYPE_CUDA, host, CFX_MEMTYPE_HOST, sz));
    return dgrad[t];
}

static void *pull_buf(int t, void *host)
{
    return DEVICE ? dout[t] : host;
}

/* After a pull: the device result into the host buffer that is checked. */
static void pulled(int t, void *host, size_t sz)
{
    if (DEVICE) {
        memset(host, 0xee, sz);
        CHECK_OK(cfx__memcpy_typed(host, CFX_MEMTYPE_HOST, dout[t], CFX_MEMTYPE_CUDA, sz));
    }
}

/* --sched-dies-at, --handover-lost: @p rc must be CFX_ERR_PEER_FAILED naming
 * the node of server @p srv (0: the scheduler). */
static void expect_lost(struct cfx_ps *ps, int rc, const char *role, int index, int srv)
{
    /* the failure's text first: every call that succeeds clears it */
    char err[512];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    const char *at = err;
    struct cfx_ps_stats st;
    CHECK_OK(cfx_ps_stats(ps, &st));
    char node[32];
    snprintf(node, sizeof(node), "node %u", st.servers[srv].node_id);
    size_t n = strlen(node);
    while ((at = strstr(at, node)) && at[n] >= '0' && at[n] <= '9')
        at += n; /* "node 1" in "node 12" */
    if (rc != CFX_ERR_PEER_FAILED || !at)
        DIE("%s %d: got %s (%s), want CFX_ERR_PEER_FAILED naming server %d's %s", role, index,
            cfx_errname(rc), err, srv, node);
    printf("%s %d: lost server %d: %s\n", role, index, srv, err);
}

/* --worker-dies-at: @p rc must be CFX_ERR_PEER_FAILED naming worker
 * @p gone as the one whose push the step waited for. */
static void expect_worker_gone(int rc, int w, int gone)
{
    char err[512], want[64];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    snprintf(want, sizeof(want), "waited for worker %d (node ", gone);
    if (rc != CFX_ERR_PEER_FAILED || !strstr(err, want) || !strstr(err, "is gone"))
        DIE("worker %d: got %s (%s), want CFX_ERR_PEER_FAILED saying the step %s...)", w,
            cfx_errname(rc), err, want);
    printf("worker %d: lost worker %d: %s\n", w, gone, err);
}

/* --dies-at-start: this rank's process id, put at its start (every rank
 * shares the host: cfx_run), for the last worker to wait for its exit. */
static void signal_pid(struct cfx_context *ctx, int rank)
{
    static int32_t pid;
    struct cfx_object_id id;
    pid = (int32_t)getpid();
    name_id(&id, "pid", rank);
    CHECK_OK(cfx_put(ctx, &id, &pid, sizeof(pid), NULL));
}

/* --dies-at-start: pidfds of the ranks that may hold a copy of server K's
 * announcement (K, and when K is the scheduler the other members, which
 * read it), opened by the last worker before its "up" lets K go: they are
 * all alive then, so a pid names its rank's process. */
static int exit_fd[64];
static int n_exit_fd;

/* A pidfd of rank @p r's process, from the id it put (signal_pid); its
 * copy here is dropped, so the object goes with the rank. */
static int pidfd_of_rank(struct cfx_context *ctx, int r)
{
    int32_t pid = 0;
    size_t sz = 0;
    struct cfx_object_id id;
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    name_id(&id, "pid", r);
    CHECK_OK(cfx_get(ctx, &id, &pid, sizeof(pid), &sz, &op));
    CHECK_OK(cfx_delete(ctx, &id, NULL));
    int fd = pidfd_open((pid_t)pid, 0);
    if (fd < 0)
        DIE("pidfd_open(%d), rank %d's process: %s", (int)pid, r, strerror(errno));
    return fd;
}

static void watch_exits(struct cfx_context *ctx, int k)
{
    for (int r = 0; r < S + W - 1 && n_exit_fd < 64; r++)
        if (r == k || k == 0)
            exit_fd[n_exit_fd++] = pidfd_of_rank(ctx, r);
}

/* The node that had put object @p id, once the directory dropped it with
 * that node (a get's timeout then says who had put it: object.h): each
 * get is a round trip to the coordinator, parked 200 ms when the object is
 * gone.  Its holders have exited (pidfds) before this is asked; until the
 * coordinator heard their connections close its inline copy answers, and
 * this node's copy of that answer is dropped before the next get. */
static uint32_t went_node(struct cfx_context *ctx, const struct cfx_object_id *id,
                          const char *what, int k)
{
    static const char key[] = "(the id was put by node ";
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 200 };
    uint64_t dl = now_ns() + 30000000000ull;
    while (now_ns() < dl) {
        uint8_t buf[64];
        size_t sz = 0;
        int rc = cfx_get(ctx, id, buf, sizeof(buf), &sz, &op);
        const char *w = rc == CFX_ERR_TIMEOUT ? strstr(cfx_last_error(), key) : NULL;
        unsigned node = 0;
        if (w && sscanf(w + strlen(key), "%u", &node) == 1 && node)
            return node;
        if (rc == CFX_OK) /* the coordinator has not yet heard a holder's
                             connection close: its inline copy answered */
            CHECK_OK(cfx_delete(ctx, id, NULL));
    }
    DIE("server %d's %s did not go within 30 s of its holders' exit", k, what);
}

/* --dies-at-start: the node of server K's announcement once it went with
 * that node (a get's timeout then says who had put it: object.h).  It
 * goes when no process holds a copy: K, and when K is the scheduler the
 * other members, which read it and fail at once when K dies.  Their
 * exits are waited for (watch_exits); the directory then drops their
 * copies as the coordinator hears their connections close, which each get
 * (a round trip to it, 200 ms at most) looks for (went_node). */
static uint32_t wait_went(struct cfx_context *ctx, int k)
{
    for (int i = 0; i < n_exit_fd; i++) {
        struct pollfd pe = { .fd = exit_fd[i], .events = POLLIN };
        if (poll(&pe, 1, 60000) != 1)
            DIE("a rank holding server %d's announcement did not exit within 60 s", k);
        close(exit_fd[i]);
    }
    char name[96];
    struct cfx_object_id id;
    snprintf(name, sizeof(name), "ps/%s/server/%d/0", JOB, k); /* dataplane/ps: cfx__ps_obj_id */
    cfx_object_id_from_name(name, &id);
    return went_node(ctx, &id, "announcement", k);
}

/* --skip-server, --dies-at-start: the job must not start, and create's
 * @p rc must say why (@p went: the dead node, when this member knows it). */
static void expect_no_start(int rc, bool server, int index, uint32_t went)
{
    char err[512];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    const char *role = server ? "server" : "worker";
    bool sched = server && index == 0;
    char want[3][96] = { "", "", "" };
    int code = CFX_ERR_PEER_FAILED;
    if (SKIP_SRV >= 0) {
        code = CFX_ERR_TIMEOUT;
        snprintf(want[0], sizeof(want[0]), "server %d did not join", SKIP_SRV);
        snprintf(want[1], sizeof(want[1]), "server %d did, past the job's %d initial", S, S);
        if (!sched)
            snprintf(want[2], sizeof(want[2]), "the job did not start");
    } else if (DIES_AT_START == 0) {
        int n = snprintf(want[0], sizeof(want[0]), "the scheduler (server 0, node ");
        if (went) {
            snprintf(want[0] + n, sizeof(want[0]) - (size_t)n, "%u)", went);
            snprintf(want[1], sizeof(want[1]), "died before this worker joined");
        }
    } else {
        int n = snprintf(want[0], sizeof(want[0]), "server %d (node ", DIES_AT_START);
        if (went)
            snprintf(want[0] + n, sizeof(want[0]) - (size_t)n, "%u)", went);
        snprintf(want[1], sizeof(want[1]), "died before the job started");
        if (!sched)
            snprintf(want[2], sizeof(want[2]), "the job did not start");
    }
    for (int i = 0; i < 3; i++)
        if (rc != code || (want[i][0] && !strstr(err, want[i])))
            DIE("%s %d: create got %s (%s), want %s saying '%s'", role, index, cfx_errname(rc),
                err, cfx_errname(code), want[i]);
    printf("%s %d: the job did not start: %s\n", role, index, err);
}

/* --late-tensor: "late", f32, 9 blocks of 4 KiB (the default --block). */
#define LATE_COUNT 9000
#define LATE_STEPS 5

/* --server-dies: server K's process ended (its pidfd, opened while it was
 * alive), then the shard map the scheduler publishes as it learns of the
 * death names K failed: each version is waited for as it is put (a get of
 * its object waits for it), and the latest read the way rdmactl ps shards
 * reads it.  K's entry keeps its node and the blocks it held (not served:
 * nothing moves them), and no other server changed state.  Before, the
 * scheduler published nothing: the map said "active" until some later
 * change, and this waited for an add-server of K to fail instead. */
static void wait_server_failed(struct cfx_context *ctx, int k, int fd,
                               const struct cfx_ps_server_info *pre)
{
    struct cfx_ps_server_info alive_k = *pre; /* the last map's before it failed */
    struct pollfd pe = { .fd = fd, .events = POLLIN };
    if (poll(&pe, 1, 60000) != 1)
        DIE("server %d's process did not exit within 60 s of its signal", k);
    close(fd);
    static uint8_t buf[PS_MAP_MAX]; /* a got object is served from it until dropped */
    struct cfx_ps_stats before, st;
    CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &before));
    st = before;
    uint64_t dl = now_ns() + 30000000000ull;
    while (st.servers[k].state != CFX_PS_SERVER_FAILED) {
        if (st.servers[k].state != CFX_PS_SERVER_ACTIVE)
            DIE("shard map %u: dead server %d is in state %d, neither active nor failed",
                st.map_version, k, st.servers[k].state);
        struct cfx_object_id id;
        cfx__ps_obj_id(JOB, "map", (long)st.map_version + 1, 0, &id);
        alive_k = st.servers[k]; /* the map before the one that says it failed */
        int left = (int)(((int64_t)dl - (int64_t)now_ns()) / 1000000);
        struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                     .timeout_ms = left > 0 ? left : 1 };
        size_t sz = 0;
        int rc = cfx_get(ctx, &id, buf, sizeof(buf), &sz, &op);
        if (rc == CFX_ERR_TIMEOUT)
            DIE("no shard map after %u within 30 s of server %d's exit: the scheduler did "
                "not publish its death", st.map_version, k);
        CHECK_OK(rc);
        CHECK_OK(cfx_delete(ctx, &id, NULL)); /* this copy, before buf is used again */
        CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &st));
    }
    const struct cfx_ps_server_info *x = &st.servers[k];
    if (x->node_id != alive_k.node_id || x->blocks != alive_k.blocks ||
        x->bytes != alive_k.bytes || st.nservers != before.nservers)
        DIE("shard map %u: failed server %d is node %u with %u blocks (%llu B), want node %u "
            "with the %u blocks (%llu B) it held", st.map_version, k, x->node_id, x->blocks,
            (unsigned long long)x->bytes, alive_k.node_id, alive_k.blocks,
            (unsigned long long)alive_k.bytes);
    for (uint32_t s = 0; s < st.nservers; s++)
        if ((int)s != k && st.servers[s].state != before.servers[s].state)
            DIE("shard map %u: server %u went from state %d to %d with server %d's death",
                st.map_version, s, before.servers[s].state, st.servers[s].state, k);
    printf("worker 0: shard map %u names server %d (node %u) failed, %u blocks not served\n",
           st.map_version, k, x->node_id, x->blocks);
    if (RDMACTL)
        pstest_rdmactl_says_failed(RDMACTL, JOB, k, x);
}

/* --dies-registering: the register of "late" fails at once, naming server
 * SERVER_DIES and its node (a block of it there was never initialized);
 * no worker is blamed (the others waited out the job's timeout, then said
 * that worker 0 stores the initial values). */
static void late_tensor_lost(struct cfx_ps *ps, int w)
{
    float *init = malloc(LATE_COUNT * sizeof(float));
    if (!init)
        DIE("out of memory");
    fill(init, CFX_DTYPE_F32, LATE_COUNT, init_f, 0, 0);
    uint64_t t0 = now_ns();
    int key = -1;
    int rc = cfx_ps_register(ps, "late", CFX_DTYPE_F32, LATE_COUNT, w == 0 ? init : NULL, &key);
    double secs = (double)(now_ns() - t0) / 1e9;
    char err[512];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    free(init);
    struct cfx_ps_stats st;
    CHECK_OK(cfx_ps_stats(ps, &st));
    char want[2][64];
    snprintf(want[0], sizeof(want[0]), "server %d (node %u)", SERVER_DIES,
             st.servers[SERVER_DIES].node_id);
    snprintf(want[1], sizeof(want[1]), "server %d (node %u,", SERVER_DIES,
             st.servers[SERVER_DIES].node_id);
    if (rc != CFX_ERR_PEER_FAILED || (!strstr(err, want[0]) && !strstr(err, want[1])) ||
        strstr(err, "worker"))
        DIE("worker %d: register of 'late' as server %d died: got %s (%s) after %.1f s, want "
            "CFX_ERR_PEER_FAILED naming '%s' and no worker", w, SERVER_DIES, cfx_errname(rc),
            err, secs, want[0]);
    printf("worker %d: register of 'late' failed in %.2f s: %s\n", w, secs, err);
}

/* One BSP push-pull of "late" (its step @p step), every element checked. */
static void late_step(struct cfx_ps *ps, int w, int key, int step, float *grad, float *out)
{
    fill(grad, CFX_DTYPE_F32, LATE_COUNT, grad_v, w, step);
    memset(out, 0xee, LATE_COUNT * sizeof(float));
    CHECK_OK(cfx_ps_pushpull(ps, key, grad, out));
    for (size_t i = 0; i < LATE_COUNT; i++)
        if (out[i] != (float)expect_closed(i, step + 1))
            DIE("worker %d: late step %d: late[%zu] = %.9g, want %.9g", w, step, i, out[i],
                expect_closed(i, step + 1));
}

/* --survivors: worker 0's word after each late step, 1 to go on, 0 to stop
 * (it puts "late-go/STEP"; the others wait for it). */
static bool late_go(struct cfx_context *ctx, int w, int step, bool more)
{
    static uint8_t v[2] = { 0, 1 }, got; /* a put object is served from its buffer */
    struct cfx_object_id id;
    name_id(&id, "late-go", step);
    if (w == 0) {
        CHECK_OK(cfx_put(ctx, &id, &v[more], 1, NULL));
        return more;
    }
    size_t sz = 0;
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    CHECK_OK(cfx_get(ctx, &id, &got, 1, &sz, &op));
    return got;
}

/* --survivors: after server K's failure, "late" steps until the map moved
 * blocks off straggler SRV (phase 0), then SRV removed (phase 1) until it
 * is retired.  Worker 0 reads its own latest map after each step. */
static int survivors_steps(struct cfx_context *ctx, struct cfx_ps *ps, int w, int key,
                           float *grad, float *out)
{
    const int k = SERVER_DIES, srv = SURVIVORS;
    struct cfx_ps_stats st, first;
    CHECK_OK(cfx_ps_stats(ps, &first));
    if (w == 0) {
        if (first.servers[k].state != CFX_PS_SERVER_FAILED || !first.servers[k].blocks ||
            first.servers[srv].state != CFX_PS_SERVER_ACTIVE || !first.servers[srv].blocks)
            DIE("map %u: server %d in state %d with %u blocks, straggler %d in state %d with "
                "%u: want failed and active, each with blocks", first.map_version, k,
                first.servers[k].state, first.servers[k].blocks, srv,
                first.servers[srv].state, first.servers[srv].blocks);
        CHECK_OK(cfx_ps_set_auto(ctx, JOB, 1, 5000));
    }
    int phase = 0, step = 0;
    uint64_t dl = now_ns() + 30000000000ull;
    for (bool more = true; more; step++) {
        late_step(ps, w, key, step, grad, out);
        if (w == 0) {
            CHECK_OK(cfx_ps_stats(ps, &st));
            if (st.servers[k].state != CFX_PS_SERVER_FAILED ||
                st.servers[k].blocks != first.servers[k].blocks)
                DIE("map %u: failed server %d is in state %d with %u blocks, want failed with "
                    "its %u", st.map_version, k, st.servers[k].state, st.servers[k].blocks,
                    first.servers[k].blocks);
            if (phase == 0 && st.servers[srv].blocks < first.servers[srv].blocks) {
                printf("worker 0: step %d: map %u moved straggler %d from %u to %u blocks "
                       "with server %d failed\n", step, st.map_version, srv,
                       first.servers[srv].blocks, st.servers[srv].blocks, k);
                uint32_t v = 0;
                CHECK_OK(cfx_ps_remove_server(ctx, JOB, srv, 20000, &v));
                printf("worker 0: removed server %d (map %u)\n", srv, v);
                phase = 1;
                dl = now_ns() + 30000000000ull;
            } else if (phase == 1 && st.servers[srv].state == CFX_PS_SERVER_RETIRED) {
                printf("worker 0: step %d: server %d retired (map %u)\n", step, srv,
                       st.map_version);
                phase = 2;
            } else if (now_ns() > dl && phase == 0) {
                DIE("no shard map moved blocks off straggler server %d within 30 s with "
                    "server %d failed (auto on): it owns %u blocks (map %u)", srv, k,
                    st.servers[srv].blocks, st.map_version);
            } else if (now_ns() > dl) {
                DIE("removed server %d was not retired within 30 s with server %d failed: "
                    "state %d, %u blocks (map %u)", srv, k, st.servers[srv].state,
                    st.servers[srv].blocks, st.map_version);
            }
        }
        more = late_go(ctx, w, step, phase < 2);
    }
    return step;
}

/* --late-tensor: every worker registers "late" after the last step (after
 * server SERVER_DIES died, as the scheduler saw), checks its initial
 * values and LATE_STEPS BSP push-pulls exactly; worker 0 checks that its
 * blocks went to live active servers only. */
static void late_tensor(struct cfx_context *ctx, struct cfx_ps *ps, int w)
{
    struct cfx_ps_stats before = { 0 };
    if (DIES_REGISTERING) {
        /* K dies as worker 0 registers: every worker has had its last
         * step's replies by then (one still waiting for them failed) */
        signal_obj(ctx, "steps-done", w);
        for (int o = 0; o < W; o++)
            wait_obj(ctx, "steps-done", o, 60000);
        late_tensor_lost(ps, w);
        return;
    }
    if (w == 0 && SERVER_DIES > 0) {
        int fd = pidfd_of_rank(ctx, SERVER_DIES); /* alive: it waits for "die" */
        struct cfx_ps_stats st;
        CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &st));
        if (st.servers[SERVER_DIES].state != CFX_PS_SERVER_ACTIVE ||
            !st.servers[SERVER_DIES].blocks)
            DIE("server %d is in state %d with %u blocks before its death, want active with "
                "some", SERVER_DIES, st.servers[SERVER_DIES].state,
                st.servers[SERVER_DIES].blocks);
        signal_obj(ctx, "die", SERVER_DIES);
        wait_server_failed(ctx, SERVER_DIES, fd, &st.servers[SERVER_DIES]);
        signal_obj(ctx, "dead-seen", 0);
    } else if (SERVER_DIES > 0) {
        wait_obj(ctx, "dead-seen", 0, 120000);
    }
    if (w == 0)
        CHECK_OK(cfx_ps_stats(ps, &before)); /* the map the late tensor is added to */
    size_t sz = LATE_COUNT * sizeof(float);
    float *init = malloc(sz), *grad = malloc(sz), *out = malloc(sz);
    if (!init || !grad || !out)
        DIE("out of memory");
    fill(init, CFX_DTYPE_F32, LATE_COUNT, init_f, 0, 0);
    int key;
    int rc = cfx_ps_register(ps, "late", CFX_DTYPE_F32, LATE_COUNT, w == 0 ? init : NULL, &key);
    if (rc != CFX_OK)
        DIE("worker %d: register of 'late'%s: got %s (%s), want CFX_OK", w,
            SERVER_DIES > 0 ? " after a server died" : "", cfx_errname(rc), cfx_last_error());
    memset(out, 0xee, sz);
    CHECK_OK(cfx_ps_pull(ps, key, out));
    for (size_t i = 0; i < LATE_COUNT; i++)
        if (out[i] != (float)init_v(i))
            DIE("worker %d: late[%zu] = %g after registration, want %g", w, i, out[i],
                init_v(i));
    signal_obj(ctx, "late-registered", w);
    for (int o = 0; o < W; o++)
        wait_obj(ctx, "late-registered", o, 60000);
    int steps = LATE_STEPS;
    if (SURVIVORS > 0)
        steps = survivors_steps(ctx, ps, w, key, grad, out);
    else
        for (int step = 0; step < LATE_STEPS; step++)
            late_step(ps, w, key, step, grad, out);
    free(init);
    free(grad);
    free(out);
    if (w != 0)
        return;
    if (SURVIVORS > 0) {
        printf("worker 0: late tensor: %d steps exact\n", steps);
        return; /* its blocks moved: checked step by step */
    }
    struct cfx_ps_stats after;
    CHECK_OK(cfx_ps_stats(ps, &after));
    uint32_t nb = (LATE_COUNT * sizeof(float) + BLOCK - 1) / BLOCK;
    if (after.nblocks != before.nblocks + nb || after.nservers != before.nservers)
        DIE("the late tensor took %u blocks over %u servers, want %u over %u",
            after.nblocks - before.nblocks, after.nservers, nb, before.nservers);
    for (uint32_t s = 0; s < after.nservers; s++) {
        bool live = after.servers[s].state == CFX_PS_SERVER_ACTIVE && (int)s != SERVER_DIES;
        if (!live && after.servers[s].blocks != before.servers[s].blocks)
            DIE("server %u (%s) went from %u to %u blocks with the late tensor", s,
                (int)s == SERVER_DIES ? "dead" : "not active", before.servers[s].blocks,
                after.servers[s].blocks);
    }
    printf("worker 0: late tensor: %u blocks, none on a dead or removed server; values exact\n",
           nb);
}

/* --remove-failed: wait (30 s at most) until this handle's map (its requests
 * go where it says) gives removed server @p srv no block and has it retired
 * (@p retired) or, failed, still failed. */
static void wait_moved_off(struct cfx_ps *ps, int srv, uint32_t v, bool retired)
{
    struct cfx_ps_stats st;
    uint64_t dl = now_ns() + 30000000000ull;
    for (;;) {
        CHECK_OK(cfx_ps_stats(ps, &st));
        if (st.map_version >= v && !st.servers[srv].blocks &&
            st.servers[srv].state == (retired ? CFX_PS_SERVER_RETIRED : CFX_PS_SERVER_FAILED))
            break;
        if (now_ns() > dl)
            DIE("removed server %d is in state %d with %u blocks in map %u (removal: map %u) "
                "after 30 s, with server %d failed", srv, st.servers[srv].state,
                st.servers[srv].blocks, st.map_version, v, SERVER_DIES);
        sched_yield();
    }
    printf("worker 0: map %u: server %d has no block%s\n", st.map_version, srv,
           retired ? ", retired" : "");
}

/* --remove-failed: @p what ("pull" or "push") of every tensor; those with a
 * block that failed server K held under map @p m must fail at once with
 * CFX_ERR_PEER_FAILED naming K, its node and the values lost; the elements
 * of every other block (a pull's) exact. */
static void lost_ops(struct cfx_ps *ps, int *key, void **out, const struct ps_map *m,
                     const char *what, const char *when)
{
    const int k = SERVER_DIES;
    struct cfx_ps_stats st;
    CHECK_OK(cfx_ps_stats(ps, &st)); /* K's node */
    char want[2][96];
    snprintf(want[0], sizeof(want[0]), "server %d (node %u)", k, st.servers[k].node_id);
    snprintf(want[1], sizeof(want[1]), "values were lost");
    bool pull = !strcmp(what, "pull");
    int lost = 0;
    for (int t = 0; t < NT; t++) {
        int mt = cfx__ps_map_find(m, tname[t]);
        if (mt < 0)
            DIE("tensor %s is not in shard map %u", tname[t], m->version);
        const struct ps_tensor *x = &m->tensors[mt];
        uint32_t was_k = 0;
        for (uint32_t b = 0; b < x->nblocks; b++)
            was_k += m->owner[x->first_block + b] == (uint32_t)k;
        memset(out[t], 0xee, tcount[t] * cfx_dtype_size(tdt[t]));
        uint64_t t0 = now_ns();
        int rc = pull ? cfx_ps_pull(ps, key[t], out[t])
                      : cfx_ps_push(ps, key[t], out[t]); /* any gradient */
        double secs = (double)(now_ns() - t0) / 1e9;
        char err[512];
        snprintf(err, sizeof(err), "%s", cfx_last_error());
        if (!was_k && rc != CFX_OK)
            DIE("%s of %s %s (no block of it on server %d): %s (%s)", what, tname[t], when, k,
                cfx_errname(rc), err);
        if (was_k && (rc != CFX_ERR_PEER_FAILED || !strstr(err, want[0]) ||
                      !strstr(err, want[1]) || secs > TIMEOUT_MS / 4000.0))
            DIE("%s of %s %s, %u of its blocks held by failed server %d: got %s (%s) after "
                "%.1f s, want CFX_ERR_PEER_FAILED at once naming '%s' and '%s'", what,
                tname[t], when, was_k, k, cfx_errname(rc), err, secs, want[0], want[1]);
        for (size_t i = 0; pull && i < tcount[t]; i++)
            if (m->owner[x->first_block + i / x->block_elems] != (uint32_t)k &&
                get(out[t], tdt[t], i) != expect_closed(i, STEPS))
                DIE("%s[%zu] (block %zu, not held by server %d) = %.9g %s, want %.9g", tname[t],
                    i, i / x->block_elems, k, get(out[t], tdt[t], i), when,
                    expect_closed(i, STEPS));
        if (was_k)
            printf("worker 0: %s of %s %s: %s\n", what, tname[t], when, err);
        lost += was_k != 0;
    }
    if (!lost)
        DIE("no tensor had a block on failed server %d: the check would be vacuous", k);
}

/* --remove-failed: failed server K removed (cfx_ps_remove_server), its
 * blocks (the owners of map @p m say which) go to live servers, but their
 * values went with K: a pull, a second pull, and after live server 1 was
 * removed too (it must retire: a block with no state to wait for holds no
 * settlement) a third pull and a push of each tensor with such a block fail
 * at once naming K and the values lost, never waiting for a state that
 * cannot come nor served with values that are not the tensor's. */
static void removed_failed(struct cfx_context *ctx, struct cfx_ps *ps, int *key, void **out,
                           const struct ps_map *m)
{
    const int k = SERVER_DIES;
    uint32_t v = 0;
    const char *skip = getenv("CFX_PS_TEST_SKIP_FAILED_MAPS");
    if (skip) {
        /* two maps (the register, the values stored) that the deaf server
         * hears of from no request, or only the first: it skips at least
         * the one before the removal */
        const float one = 1;
        int pad = -1;
        CHECK_OK(cfx_ps_register(ps, "pad", CFX_DTYPE_F32, 1, &one, &pad));
    }
    CHECK_OK(cfx_ps_remove_server(ctx, JOB, k, 20000, &v));
    wait_moved_off(ps, k, v, false);
    if (skip) {
        /* that server hears of the removal map only from our pull, and
         * skips the map naming K failed: it must own one of K's blocks */
        struct ps_map r;
        cfx__ps_map_init(&r);
        CHECK_OK(cfx__ps_map_get(ctx, JOB, v, 5000, &r));
        uint32_t n = 0;
        for (uint32_t b = 0; b < m->nblocks; b++)
            n += m->owner[b] == (uint32_t)k && r.owner[b] == (uint32_t)atoi(skip);
        cfx__ps_map_free(&r);
        if (!n)
            DIE("removal map %u gives server %s no block of failed server %d: the check of "
                "a server that skipped a map would be vacuous", v, skip, k);
        printf("worker 0: map %u gives server %s (deaf to notices) %u of server %d's blocks\n",
               v, skip, n, k);
    }
    lost_ops(ps, key, out, m, "pull", "after its removal");
    lost_ops(ps, key, out, m, "pull", "again");
    CHECK_OK(cfx_ps_remove_server(ctx, JOB, 1, 20000, &v));
    wait_moved_off(ps, 1, v, true);
    lost_ops(ps, key, out, m, "pull", "after server 1's retirement");
    lost_ops(ps, key, out, m, "push", "after server 1's retirement");
}

/* --server-dies: worker 0's final pulls of the first tensors: exact where
 * no block is on the dead server, else CFX_ERR_PEER_FAILED naming its node
 * (at least one is), with every element of the tensor's blocks on live
 * servers exact all the same (the map's owners say which: the dead one's
 * stayed its own).  @p ctx reads the latest map. */
static void final_after_death(struct cfx_context *ctx, struct cfx_ps *ps, int *key, void **out)
{
    struct ps_map m;
    cfx__ps_map_init(&m);
    CHECK_OK(cfx__ps_map_latest(ctx, JOB, 5000, &m));
    if (REMOVE_FAILED) {
        removed_failed(ctx, ps, key, out, &m);
        cfx__ps_map_free(&m);
        return;
    }
    int lost = 0;
    for (int t = 0; t < NT; t++) {
        int mt = cfx__ps_map_find(&m, tname[t]);
        if (mt < 0)
            DIE("tensor %s is not in shard map %u", tname[t], m.version);
        const struct ps_tensor *x = &m.tensors[mt];
        uint32_t on_dead = 0;
        for (uint32_t b = 0; b < x->nblocks; b++)
            on_dead += m.owner[x->first_block + b] == (uint32_t)SERVER_DIES;
        size_t sz = tcount[t] * cfx_dtype_size(tdt[t]);
        memset(out[t], 0xee, sz);
        int rc = cfx_ps_pull(ps, key[t], out[t]);
        if (rc != CFX_OK) {
            expect_lost(ps, rc, "worker", 0, SERVER_DIES);
            lost++;
        }
        if ((rc != CFX_OK) != (on_dead != 0))
            DIE("final pull of %s: %s with %u of its blocks on dead server %d", tname[t],
                cfx_errname(rc), on_dead, SERVER_DIES);
        for (size_t i = 0; i < tcount[t]; i++)
            if (m.owner[x->first_block + i / x->block_elems] != (uint32_t)SERVER_DIES &&
                get(out[t], tdt[t], i) != expect_closed(i, STEPS))
                DIE("final %s[%zu] (block %zu, on a live server) = %.9g, want %.9g", tname[t],
                    i, i / x->block_elems, get(out[t], tdt[t], i), expect_closed(i, STEPS));
    }
    cfx__ps_map_free(&m);
    if (!lost)
        DIE("no tensor had a block on dead server %d: the check would be vacuous", SERVER_DIES);
}

static int run_server(struct cfx_context *ctx, int index, bool late)
{
    struct cfx_ps_params p = base_params();
    p.role = CFX_PS_SERVER;
    p.index = index;
    p.field_mask |= CFX_PS_PARAM_STANDBY;
    p.standby = late && STANDBY;
    /* every other rank's context has joined before K goes, and so hears
     * that its node died (a member reads a gone announcement as a death
     * only then: one that went before it joined may be a previous job's) */
    for (int r = 0; index == DIES_AT_START && r < S + W; r++)
        if (r != index)
            wait_obj(ctx, "up", r, 60000);
    if (SKIP_SRV >= 0 && index > 0)
        p.timeout_ms = 3 * TIMEOUT_MS; /* the scheduler gives up first, and says why */
    struct cfx_ps *ps;
    int crc = cfx_ps_create(ctx, &p, &ps);
    if (SKIP_SRV >= 0 || DIES_AT_START >= 0) {
        if (crc == CFX_OK)
            DIE("server %d: the job started", index);
        expect_no_start(crc, true, index, 0);
        return 0;
    }
    CHECK_OK(crc);
    if (index == DELAY_SRV)
        CHECK_OK(cfx_ps_server_set_delay(ps, DELAY_US));
    if (index == 0 && SCHED_DIES_AT >= 0) {
        wait_obj(ctx, "die", 0, 120000);
        raise(SIGKILL);
    }
    if (index == SERVER_DIES) {
        wait_obj(ctx, "die", index, 120000); /* serving meanwhile (the loop thread) */
        raise(SIGKILL);
    }
    int rc;
    while ((rc = cfx_ps_serve(ps, 1000)) == CFX_ERR_TIMEOUT)
        ;
    if (SCHED_DIES_AT >= 0) {
        expect_lost(ps, rc, "server", index, 0);
        cfx_ps_destroy(ps);
        return 0;
    }
    CHECK_OK(rc);
    struct cfx_ps_stats st;
    CHECK_OK(cfx_ps_stats(ps, &st));
    printf("server %d%s: map %u, blocks in %" PRIu64 " out %" PRIu64 ", forwarded %" PRIu64 "\n",
           index, late ? " (joined late)" : "", st.map_version, st.migrations_in, st.migrations_out,
           st.forwarded);
    cfx_ps_destroy(ps);
    return 0;
}

static void check_ssp(int w_self)
{
    /* every worker's trace: S[k] push k sent, R[k] push-pull k returned */
    uint64_t *snd = calloc((size_t)W * STEPS, 8), *rcv = calloc((size_t)W * STEPS, 8);
    for (int w = 0; w < W; w++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/w%d.trace", TRACE, w);
        FILE *f = fopen(path, "r");
        if (!f)
            DIE("cannot read %s", path);
        for (int k = 0; k < STEPS; k++)
            if (fscanf(f, "%" SCNu64 " %" SCNu64, &snd[w * STEPS + k], &rcv[w * STEPS + k]) != 2)
                DIE("short trace %s", path);
        fclose(f);
    }
    /* after push-pull k returns, worker w starts step k+1; every other
     * worker must have sent at least k+1-s pushes by then */
    int max_lead = 0;
    for (int w = 0; w < W; w++)
        for (int k = 0; k < STEPS; k++) {
            uint64_t r = rcv[w * STEPS + k];
            for (int v = 0; v < W; v++) {
                int sent = 0;
                while (sent < STEPS && snd[v * STEPS + sent] < r)
                    sent++;
                int lead = (k + 1) - sent;
                if (lead > max_lead)
                    max_lead = lead;
                if (CONS != CFX_PS_ASP && lead > STALE)
                    DIE("worker %d started step %d when worker %d had sent only %d pushes "
                        "(lead %d > staleness %d)",
                        w, k + 1, v, sent, lead, STALE);
            }
        }
    printf("worker %d: trace of %d workers x %d steps: max lead %d (bound %d)\n", w_self, W, STEPS,
           max_lead, CONS == CFX_PS_BSP ? 0 : STALE);
    if (CONS == CFX_PS_SSP && SKEW_US && max_lead < 1)
        DIE("SSP with skew never ran ahead: the check would be vacuous");
    free(snd);
    free(rcv);
}

/* A worker's handle and buffers, at its end (normal or the scheduler lost). */
static void worker_end(struct cfx_ps *ps, void **grad, void **out, uint64_t *snd, uint64_t *rcv,
                       struct replay *rep)
{
    cfx_ps_destroy(ps);
    for (int t = 0; t < NT; t++) {
        free(grad[t]);
        free(out[t]);
    }
    free(snd);
    free(rcv);
    free(rep->p);
    free(rep->m);
    free(rep->v);
}

static int run_worker(struct cfx_context *ctx, int w)
{
    struct cfx_ps_params p = base_params();
    p.role = CFX_PS_WORKER;
    p.index = w;
    struct cfx_ps *ps;
    int key[NT];
    void *grad[NT], *out[NT];
    size_t tsz[NT];
    for (int t = 0; t < NT; t++)
        tsz[t] = tcount[t] * cfx_dtype_size(tdt[t]);
    device_setup(tsz); /* before the handle: it checks that the memory type is usable */
    if (SKIP_SRV >= 0)
        p.timeout_ms = 3 * TIMEOUT_MS; /* the scheduler gives up first, and says why */
    uint32_t went = 0;
    if (DIES_AT_START >= 0 && w == W - 1) /* the scheduler waits for it: K is gone before */
        went = wait_went(ctx, DIES_AT_START);
    int crc = cfx_ps_create(ctx, &p, &ps);
    if (SKIP_SRV >= 0 || DIES_AT_START >= 0) {
        if (crc == CFX_OK)
            DIE("worker %d: the job started", w);
        expect_no_start(crc, false, w, went);
        return 0;
    }
    CHECK_OK(crc);
    for (int t = 0; t < NT; t++) {
        size_t sz = tsz[t];
        void *init = malloc(sz);
        grad[t] = malloc(sz);
        out[t] = malloc(sz);
        fill(init, tdt[t], tcount[t], init_f, 0, 0);
        CHECK_OK(cfx_ps_register(ps, tname[t], tdt[t], tcount[t], w == 0 ? init : NULL, &key[t]));
        /* the first pull gives the initial values */
        CHECK_OK(cfx_ps_pull(ps, key[t], pull_buf(t, out[t])));
        pulled(t, out[t], sz);
        for (size_t i = 0; i < tcount[t]; i++)
            if (get(out[t], tdt[t], i) != init_v(i))
                DIE("worker %d: %s[%zu] = %g after registration, want %g", w, tname[t], i,
                    get(out[t], tdt[t], i), init_v(i));
        free(init);
    }
    /* nobody pushes before every worker has checked the initial values
     * (a fast worker's first push would otherwise show in a slow one's
     * first pull) */
    signal_obj(ctx, "registered", w);
    for (int o = 0; o < W; o++)
        wait_obj(ctx, "registered", o, 60000);
    struct replay rep = { 0 };
    bool replaying = OPT == CFX_PS_OPT_MOMENTUM || OPT == CFX_PS_OPT_ADAM;
    if (replaying) {
        rep.p = malloc(tcount[0] * sizeof(float));
        rep.m = calloc(tcount[0], sizeof(float));
        rep.v = calloc(tcount[0], sizeof(float));
        for (size_t i = 0; i < tcount[0]; i++)
            rep.p[i] = (float)init_v(i);
    }
    uint64_t *snd = calloc((size_t)STEPS, 8), *rcv = calloc((size_t)STEPS, 8);
    int joined = 0;
    uint64_t t0 = now_ns();
    for (int step = 0; step < STEPS; step++) {
        if (w == 0 && step == JOIN_AT) {
            signal_obj(ctx, "join", joined++);
            printf("worker 0: step %d: server %d may join\n", step, S + joined - 1);
            uint64_t dl = now_ns() + 20000000000ull;
            int arc = CFX_ERR_NOT_FOUND;
            while (STANDBY && arc == CFX_ERR_NOT_FOUND && now_ns() < dl) {
                uint32_t v = 0;
                int chosen = S + joined - 1;
                arc = AUTO_ADD ? cfx_ps_add_server_auto(ctx, JOB, 5000, &chosen, &v)
                               : cfx_ps_add_server(ctx, JOB, S + joined - 1, 5000, &v);
                if (arc == CFX_OK && chosen != S + joined - 1)
                    DIE("placement chose standby server %d, the only one is %d", chosen,
                        S + joined - 1);
                if (arc == CFX_OK)
                    printf("worker 0: added standby server %d%s (map %u)\n", chosen,
                           AUTO_ADD ? " chosen by placement" : "", v);
                else if (arc == CFX_ERR_NOT_FOUND)
                    usleep(20000); /* it has not announced itself yet */
            }
            if (STANDBY)
                CHECK_OK(arc);
        }
        if (w == 0 && step == REMOVE_AT) {
            uint32_t v = 0;
            CHECK_OK(cfx_ps_remove_server(ctx, JOB, REMOVE_SRV, 20000, &v));
            printf("worker 0: step %d: removed server %d (map %u)\n", step, REMOVE_SRV, v);
        }
        if (w == 0 && step == SCHED_DIES_AT)
            signal_obj(ctx, "die", 0);
        if (w == W - 1 && step == WORKER_DIES_AT)
            raise(SIGKILL);
        if (w == 0 && step == REBAL_AT) {
            uint32_t v = 0;
            CHECK_OK(cfx_ps_rebalance(ctx, JOB, 20000, &v));
            printf("worker 0: step %d: rebalance (map %u)\n", step, v);
        }
        if (SKEW_US || PACE_US)
            usleep((useconds_t)(w * SKEW_US + PACE_US));
        struct cfx_ps_request *req[NT];
        for (int t = 0; t < NT; t++)
            fill(grad[t], tdt[t], tcount[t], grad_v, w, step);
        snd[step] = now_ns();
        for (int t = 0; t < NT; t++)
            CHECK_OK(cfx_ps_ipushpull(ps, key[t], push_buf(t, grad[t], tsz[t]),
                                      pull_buf(t, out[t]), &req[t]));
        int lost = CFX_OK;
        for (int t = 0; t < NT; t++) {
            int rc = cfx_ps_wait(req[t], -1);
            if (rc != CFX_OK && SCHED_DIES_AT >= 0 && lost == CFX_OK) {
                expect_lost(ps, rc, "worker", w, 0);
                lost = rc;
            } else if (rc != CFX_OK && WORKER_DIES_AT >= 0 && step >= WORKER_DIES_AT &&
                       lost == CFX_OK) {
                expect_worker_gone(rc, w, W - 1);
                lost = rc;
            } else if (rc != CFX_OK && HANDOVER_LOST >= 0 && step >= REMOVE_AT &&
                       lost == CFX_OK) {
                expect_lost(ps, rc, "worker", w, HANDOVER_LOST);
                lost = rc;
            } else if (rc != CFX_OK && lost == CFX_OK) {
                CHECK_OK(rc);
            }
            cfx_ps_request_free(req[t]);
            pulled(t, out[t], tsz[t]);
        }
        if (lost != CFX_OK) {
            worker_end(ps, grad, out, snd, rcv, &rep);
            return 0;
        }
        rcv[step] = now_ns();
        if (CONS != CFX_PS_BSP)
            continue;
        if (replaying)
            replay_round(&rep, tcount[0], step);
        for (int t = 0; t < NT; t++) {
            if (replaying && t > 0)
                break; /* only the f32 tensor is replayed; the others are checked below */
            for (size_t i = 0; i < tcount[t]; i++) {
                double want = replaying ? (double)rep.p[i] : expect_closed(i, step + 1);
                if (get(out[t], tdt[t], i) != want)
                    DIE("worker %d: step %d: %s[%zu] = %.9g, want %.9g", w, step, tname[t], i,
                        get(out[t], tdt[t], i), want);
            }
        }
    }
    if (SCHED_DIES_AT >= 0 || HANDOVER_LOST >= 0)
        DIE("worker %d: %d steps and server %d's death was never seen", w, STEPS,
            SCHED_DIES_AT >= 0 ? 0 : HANDOVER_LOST);
    if (WORKER_DIES_AT >= 0)
        DIE("worker %d: %d steps and worker %d's death was never seen", w, STEPS, W - 1);
    double secs = (double)(now_ns() - t0) / 1e9;
    if (LATE_TENSOR)
        late_tensor(ctx, ps, w);
    if (TRACE) {
        char path[512];
        snprintf(path, sizeof(path), "%s/w%d.trace", TRACE, w);
        FILE *f = fopen(path, "w");
        if (!f)
            DIE("cannot write %s", path);
        for (int k = 0; k < STEPS; k++)
            fprintf(f, "%" PRIu64 " %" PRIu64 "\n", snd[k], rcv[k]);
        fclose(f);
    }
    signal_obj(ctx, "done", w);
    if (w == 0) {
        for (int v = 1; v < W; v++)
            wait_obj(ctx, "done", v, 60000);
        /* every push was applied before its push-pull returned: the sums are final */
        if (SERVER_DIES > 0)
            final_after_death(ctx, ps, key, out);
        else if (!replaying)
            for (int t = 0; t < NT; t++) {
                CHECK_OK(cfx_ps_pull(ps, key[t], pull_buf(t, out[t])));
                pulled(t, out[t], tsz[t]);
                for (size_t i = 0; i < tcount[t]; i++)
                    if (get(out[t], tdt[t], i) != expect_closed(i, STEPS))
                        DIE("final %s[%zu] = %.9g, want %.9g", tname[t], i, get(out[t], tdt[t], i),
                            expect_closed(i, STEPS));
            }
        if (TRACE)
            check_ssp(w);
        struct cfx_ps_stats st;
        CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &st));
        /* retirement needs every worker's report under the new map: wait for it */
        uint64_t dl = now_ns() + 30000000000ull;
        while (WAIT_RETIRED && REMOVE_SRV > 0 &&
               st.servers[REMOVE_SRV].state != CFX_PS_SERVER_RETIRED) {
            if (now_ns() > dl)
                DIE("server %d was not retired within 30 s (state %d)", REMOVE_SRV,
                    st.servers[REMOVE_SRV].state);
            usleep(10000);
            CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &st));
        }
        /* a removal asked by another process (rdmactl) may come after the
         * last step on a slow machine: wait for it too (the servers serve on
         * until the workers leave) */
        while (EXPECT_REMOVED > 0 && (st.servers[EXPECT_REMOVED].blocks ||
                                      st.servers[EXPECT_REMOVED].state == CFX_PS_SERVER_ACTIVE)) {
            if (now_ns() > dl)
                break; /* named by the check below */
            usleep(10000); /* the map names no waiter: read it again */
            CHECK_OK(cfx_ps_shards(ctx, JOB, 5000, &st));
        }
        if (WAIT_RETIRED)
            printf("worker 0: server %d retired (map %u)\n", REMOVE_SRV, st.map_version);
        printf("worker 0: %d steps in %.2f s; map %u:", STEPS, secs, st.map_version);
        for (uint32_t s = 0; s < st.nservers; s++)
            printf(" server %d %s %u blocks;", s,
                   st.servers[s].state == CFX_PS_SERVER_ACTIVE     ? "active"
                   : st.servers[s].state == CFX_PS_SERVER_RETIRED  ? "retired"
                   : st.servers[s].state == CFX_PS_SERVER_DRAINING ? "draining"
                   : st.servers[s].state == CFX_PS_SERVER_FAILED   ? "failed"
                                                                   : "standby",
                   st.servers[s].blocks);
        printf("\n");
        struct cfx_ps_stats mine;
        CHECK_OK(cfx_ps_stats(ps, &mine));
        if (EXPECT_MOVES && st.map_version <= 1u + NT * 2)
            DIE("expected blocks to move, but the map is still at version %u", st.map_version);
        if (EXPECT_MOVES && DELAY_SRV >= 0) {
            /* the slowed server must end with fewer blocks than the others' mean */
            uint32_t others = 0, nothers = 0;
            for (uint32_t s = 0; s < st.nservers; s++)
                if ((int)s != DELAY_SRV && st.servers[s].state == CFX_PS_SERVER_ACTIVE)
                    others += st.servers[s].blocks, nothers++;
            if (nothers && (uint64_t)st.servers[DELAY_SRV].blocks * nothers >= others)
                DIE("the slowed server %d still owns %u blocks (the others %u in all)", DELAY_SRV,
                    st.servers[DELAY_SRV].blocks, others);
        }
        if (REMOVE_SRV > 0 && st.servers[REMOVE_SRV].blocks)
            DIE("removed server %d still owns %u blocks", REMOVE_SRV,
                st.servers[REMOVE_SRV].blocks);
        if (EXPECT_REMOVED > 0 && (st.servers[EXPECT_REMOVED].blocks ||
                                   st.servers[EXPECT_REMOVED].state == CFX_PS_SERVER_ACTIVE))
            DIE("server %d should have been removed (state %d, %u blocks)", EXPECT_REMOVED,
                st.servers[EXPECT_REMOVED].state, st.servers[EXPECT_REMOVED].blocks);
        if (L && JOIN_AT >= 0 && !st.servers[S].blocks)
            DIE("the server that joined (%d) owns no blocks", S);
        printf("worker 0: all values exact (%s, %s)\n",
               CONS == CFX_PS_BSP   ? "bsp"
               : CONS == CFX_PS_SSP ? "ssp"
                                    : "asp",
               OPT == CFX_PS_OPT_SUM        ? "sum"
               : OPT == CFX_PS_OPT_SGD      ? "sgd"
               : OPT == CFX_PS_OPT_MOMENTUM ? "momentum"
                                            : "adam");
        signal_obj(ctx, "checked", 0);
        /* an object goes with its putter: leave only once every worker
         * has read "checked" (each says so) */
        for (int v = 1; v < W; v++)
            wait_obj(ctx, "bye", v, 60000);
    } else {
        wait_obj(ctx, "checked", 0, 60000);
        signal_obj(ctx, "bye", w);
        /* stay (serving "bye") until worker 0 has gone */
        struct cfx_object_id checked;
        name_id(&checked, "checked", 0);
        CHECK_OK(cfx_test_wait_gone(ctx, &checked, 60000));
    }
    worker_end(ps, grad, out, snd, rcv, &rep);
    return 0;
}

static void parse_pair(const char *s, int *a, int *b)
{
    if (sscanf(s, "%d:%d", a, b) != 2)
        DIE("expected A:B, got %s", s);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--servers"))
            S = atoi(v), i++;
        else if (!strcmp(a, "--workers"))
            W = atoi(v), i++;
        else if (!strcmp(a, "--late"))
            L = atoi(v), i++;
        else if (!strcmp(a, "--runs"))
            RUNS = atoi(v), i++;
        else if (!strcmp(a, "--steps"))
            STEPS = atoi(v), i++;
        else if (!strcmp(a, "--block"))
            BLOCK = strtoul(v, NULL, 0), i++;
        else if (!strcmp(a, "--staleness"))
            STALE = atoi(v), i++;
        else if (!strcmp(a, "--skew"))
            SKEW_US = atoi(v), i++;
        else if (!strcmp(a, "--trace"))
            TRACE = v, i++;
        else if (!strcmp(a, "--expect-moves"))
            EXPECT_MOVES = 1;
        else if (!strcmp(a, "--expect-removed"))
            EXPECT_REMOVED = atoi(v), i++;
        else if (!strcmp(a, "--sched-dies-at"))
            SCHED_DIES_AT = atoi(v), i++;
        else if (!strcmp(a, "--worker-dies-at"))
            WORKER_DIES_AT = atoi(v), i++;
        else if (!strcmp(a, "--handover-lost"))
            HANDOVER_LOST = atoi(v), i++;
        else if (!strcmp(a, "--timeout"))
            TIMEOUT_MS = atoi(v), i++;
        else if (!strcmp(a, "--skip-server"))
            SKIP_SRV = atoi(v), i++;
        else if (!strcmp(a, "--dies-at-start"))
            DIES_AT_START = atoi(v), i++;
        else if (!strcmp(a, "--late-tensor"))
            LATE_TENSOR = 1;
        else if (!strcmp(a, "--dies-registering"))
            DIES_REGISTERING = 1;
        else if (!strcmp(a, "--server-dies"))
            SERVER_DIES = atoi(v), i++;
        else if (!strcmp(a, "--survivors"))
            SURVIVORS = atoi(v), i++;
        else if (!strcmp(a, "--remove-failed"))
            REMOVE_FAILED = 1;
        else if (!strcmp(a, "--rdmactl"))
            RDMACTL = v, i++;
        else if (!strcmp(a, "--wait-retired"))
            WAIT_RETIRED = 1;
        else if (!strcmp(a, "--standby"))
            STANDBY = 1;
        else if (!strcmp(a, "--auto-add"))
            STANDBY = AUTO_ADD = 1;
        else if (!strcmp(a, "--pace"))
            PACE_US = atoi(v), i++;
        else if (!strcmp(a, "--device"))
            DEVICE = v, i++;
        else if (!strcmp(a, "--extra"))
            EXTRA = atoi(v), i++;
        else if (!strcmp(a, "--remove-at"))
            parse_pair(v, &REMOVE_AT, &REMOVE_SRV), i++;
        else if (!strcmp(a, "--join-at"))
            JOIN_AT = atoi(v), i++;
        else if (!strcmp(a, "--rebalance-at"))
            REBAL_AT = atoi(v), i++;
        else if (!strcmp(a, "--delay")) {
            int us;
            parse_pair(v, &DELAY_SRV, &us);
            DELAY_US = (uint32_t)us;
            i++;
        } else if (!strcmp(a, "--consistency")) {
            CONS = !strcmp(v, "ssp") ? CFX_PS_SSP : !strcmp(v, "asp") ? CFX_PS_ASP : CFX_PS_BSP;
            i++;
        } else if (!strcmp(a, "--opt")) {
            OPT = !strcmp(v, "sgd")        ? CFX_PS_OPT_SGD
                  : !strcmp(v, "momentum") ? CFX_PS_OPT_MOMENTUM
                  : !strcmp(v, "adam")     ? CFX_PS_OPT_ADAM
                                           : CFX_PS_OPT_SUM;
            i++;
        } else {
            DIE("unknown option %s", a);
        }
    }
    if (SERVER_DIES >= 0 && (SERVER_DIES == 0 || SERVER_DIES >= S || !LATE_TENSOR || DEVICE ||
                             OPT != CFX_PS_OPT_SUM || CONS != CFX_PS_BSP || RUNS > 1))
        DIE("--server-dies K takes 0 < K < S, --late-tensor, BSP and SUM on host buffers");
    if ((DIES_REGISTERING || RDMACTL || REMOVE_FAILED) && SERVER_DIES <= 0)
        DIE("--dies-registering, --rdmactl and --remove-failed take --server-dies K");
    if (REMOVE_FAILED && (SERVER_DIES == 1 || SURVIVORS >= 0 || DIES_REGISTERING || S < 3))
        DIE("--remove-failed takes --server-dies K > 1, and removes server 1 too");
    if (SURVIVORS >= 0 && (SERVER_DIES <= 0 || SURVIVORS == 0 || SURVIVORS == SERVER_DIES ||
                           SURVIVORS >= S || DELAY_SRV != SURVIVORS || DIES_REGISTERING))
        DIE("--survivors SRV takes --server-dies K, 0 < SRV < S, SRV != K and --delay SRV:US");
    if (LATE_TENSOR && (DEVICE || OPT != CFX_PS_OPT_SUM || CONS != CFX_PS_BSP || RUNS > 1))
        DIE("--late-tensor is checked under BSP and SUM on host buffers, one run");
    if (RUNS > 1 && (W > 1 || L || EXTRA))
        DIE("--runs takes one worker and no late servers (the others leave with worker 0)");
    if (OPT != CFX_PS_OPT_SUM)
        tdt[2] = CFX_DTYPE_F32; /* optimizers run on floating point only */
    if (OPT != CFX_PS_OPT_SUM && OPT != CFX_PS_OPT_SGD && CONS != CFX_PS_BSP)
        DIE("momentum/adam are checked under BSP only");
    int rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    int world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    if (world != S + W + L + EXTRA)
        DIE("run with %d ranks (%d servers, %d workers, %d late servers, %d others), not %d",
            S + W + L + EXTRA, S, W, L, EXTRA, world);
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct cfx_context *ctx;
    CHECK_OK(cfx_context_create(NULL, &ctx));
    int rc = 0;
    if (DIES_AT_START >= 0 || (SERVER_DIES > 0 && rank == SERVER_DIES))
        signal_pid(ctx, rank);
    if (DIES_AT_START >= 0 && rank == S + W - 1)
        watch_exits(ctx, DIES_AT_START);
    if (DIES_AT_START >= 0 && rank != DIES_AT_START)
        signal_obj(ctx, "up", rank);
    if (rank < S + W) {
        for (RUN = 0; RUN < RUNS && !rc; RUN++) {
            rc = rank < S ? run_server(ctx, rank == SKIP_SRV ? S : rank, false)
                          : run_worker(ctx, rank - S);
            if (RUNS == 1)
                break;
            /* the job ended everywhere before its name is used again:
             * server 0 has destroyed its handle, which took the job's maps
             * with it (a read of them now finds nothing).  After the last
             * run nobody waits: server 0 leaves, and its signal with it
             * (the others waited for one that went before they looked) */
            bool next = RUN + 1 < RUNS;
            if (rank == 0) {
                struct cfx_ps_stats st;
                int src = cfx_ps_shards(ctx, JOB, 1000, &st);
                if (src != CFX_ERR_NOT_FOUND)
                    DIE("run %d: the ended job's shard map is still read: %s", RUN,
                        cfx_errname(src));
                if (next)
                    signal_obj(ctx, "ended", 0);
            } else if (next) {
                wait_obj(ctx, "ended", 0, 60000);
            }
        }
    } else {
        int j = rank - S - W;
        /* wait for worker 0's signal */
        static uint8_t b;
        size_t sz;
        struct cfx_object_id id;
        struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 120000 };
        name_id(&id, "join", j);
        if (cfx_get(ctx, &id, &b, 1, &sz, &op) != CFX_OK)
            DIE("late server %d was never asked to join", S + j);
        rc = run_server(ctx, S + j, true);
    }
    cfx_context_destroy(ctx);
    return rc;
}

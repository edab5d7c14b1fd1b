/*
 * A coordinator outage is a pause, not an error.
 *
 * conflux-coord runs as a child process with a state directory.  Two nodes
 * in this process (A, B; tcp data plane) and one node in a child process
 * (an exec'd fresh image of this binary, see the constructor below) have
 * object calls waiting on the coordinator when it is killed with SIGKILL:
 * lookups parked in it (gets of objects not put yet), then, while it is
 * down, a burst of concurrent puts, gets and deletes.
 *
 *  - restarted after 1 s on the same port and state directory: every call
 *    succeeds (a put never fails on its own object, a get waits for the
 *    reconnect and its holder), every byte is checked, every object whose
 *    put returned CFX_OK can be fetched by a newcomer, and every deleted
 *    one is gone;
 *  - never restarted: every call ends by its own deadline with
 *    CFX_ERR_CONNECT and an error that names the coordinator's address, in
 *    both processes; a parameter-server server ends too (cfx_ps_serve
 *    returns CFX_ERR_CONNECT once the coordinator has been gone for the
 *    handle's timeout), and so does its worker: a register waiting for its
 *    shard map, and push, pull and a non-blocking push made once the
 *    coordinator has been gone for that long, fail with CFX_ERR_CONNECT
 *    naming the coordinator (they used to end with CFX_ERR_TIMEOUT, or be
 *    served as if the job could go on).
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <conflux/conflux.h>

#include "coord_run.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define OBJ_SIZE   (128u * 1024)   /* a data-plane object */
#define NPUT       16              /* new objects put by A while the coordinator is down */
#define NLATE      8               /* objects B waits for (parked) when it goes */
#define NDEL       8               /* objects A deletes while it is down */
#define NCHILD     4               /* objects the child waits for, and puts */
#define CALL_MS    20000           /* deadline of each call in the restart case (anti-hang) */
#define GONE_MS    3000            /* deadline of each call when it never comes back */
#define ERR_LEN    320

#define CHILD_ENV "CFX_TEST_OUTAGE_CHILD"

static struct coord_run co; /* the coordinator, its token and state directory */

/* DEBUG: the test waits for the log lines of parked lookups */
static void setup(void)
{
    coord_run_setup(&co, "outage", true);
}

static void teardown(void)
{
    coord_run_teardown(&co);
}

TestSuite(coord_outage, .init = setup, .fini = teardown, .timeout = 180);

static struct cfx_context *join(int timeout_ms)
{
    return coord_run_join(&co, timeout_ms);
}

static void oid(const char *fmt, int i, struct cfx_object_id *id)
{
    char name[64];
    snprintf(name, sizeof(name), fmt, i);
    cfx_object_id_from_name(name, id);
}

/* ---- one object call on a thread of its own ------------------------------------- */

enum op_kind { OP_PUT, OP_GET, OP_DELETE };

struct op {
    struct cfx_context *ctx;
    enum op_kind kind;
    struct cfx_object_id id;
    uint8_t *buf;          /* put: the bytes (seed), get: where they land */
    uint64_t seed;
    int timeout_ms;
    pthread_t thread;
    int rc;                /* status; CFX_ERR_INVALID: wrong bytes got */
    char err[ERR_LEN];     /* cfx_last_error() of a failure */
};

static void *op_main(void *arg)
{
    struct op *o = arg;
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = o->timeout_ms };
    size_t got = 0;
    switch (o->kind) {
    case OP_PUT:
        o->rc = cfx_put(o->ctx, &o->id, o->buf, OBJ_SIZE, &p);
        break;
    case OP_GET:
        o->rc = cfx_get(o->ctx, &o->id, o->buf, OBJ_SIZE, &got, &p);
        if (o->rc == CFX_OK && (got != OBJ_SIZE ||
                                cfx_test_check(o->buf, OBJ_SIZE, o->seed) != (size_t)-1)) {
            o->rc = CFX_ERR_INVALID;
            snprintf(o->err, sizeof(o->err), "got %zu bytes, not the ones put", got);
            return NULL;
        }
        break;
    case OP_DELETE:
        o->rc = cfx_delete(o->ctx, &o->id, &p);
        break;
    }
    if (o->rc != CFX_OK)
        snprintf(o->err, sizeof(o->err), "%s", cfx_last_error());
    return NULL;
}

static void op_start(struct op *o, struct cfx_context *ctx, enum op_kind kind,
                     const struct cfx_object_id *id, uint64_t seed, int timeout_ms)
{
    memset(o, 0, sizeof(*o));
    o->ctx = ctx;
    o->kind = kind;
    o->id = *id;
    o->seed = seed;
    o->timeout_ms = timeout_ms;
    if (kind != OP_DELETE) {
        o->buf = malloc(OBJ_SIZE);
        if (kind == OP_PUT)
            cfx_test_fill(o->buf, OBJ_SIZE, seed);
    }
    if (pthread_create(&o->thread, NULL, op_main, o) != 0)
        abort();
}

static void op_join(struct op *o)
{
    pthread_join(o->thread, NULL);
}

static const char *kind_name(enum op_kind k)
{
    return k == OP_PUT ? "put" : k == OP_GET ? "get" : "delete";
}

/* Restart case: the call succeeded (and a get got the right bytes). */
static void op_expect_ok(struct op *o, const char *what, int i)
{
    op_join(o);
    cr_expect_eq(o->rc, CFX_OK, "%s %s %d across the outage: %s: %s", what, kind_name(o->kind),
                 i, cfx_errname(o->rc), o->err);
}

/* Never-restarted case: it ended with CFX_ERR_CONNECT naming the coordinator. */
static void expect_lost(int rc, const char *err, const char *what, int i)
{
    cr_expect_eq(rc, CFX_ERR_CONNECT, "%s %d without a coordinator: %s (%s)", what, i,
                 cfx_errname(rc), err);
    cr_expect(strstr(err, co.cc.addr) != NULL, "%s %d: the error does not name the coordinator "
              "%s: %s", what, i, co.cc.addr, err);
    cr_expect(strstr(err, "no node put it") == NULL, "%s %d: the error blames the object: %s",
              what, i, err);
}

static void op_free(struct op *o)
{
    free(o->buf);
    o->buf = NULL;
}

/* The coordinator has parked a lookup of each of @p ids (its DEBUG log). */
static void wait_parked(const struct cfx_object_id *ids, int n)
{
    uint64_t deadline = cfx__deadline_ns(15000);
    for (int i = 0; i < n; i++) {
        char hex[CFX_OBJECT_ID_HEX_LEN], line[128];
        cfx_object_id_to_hex(&ids[i], hex);
        snprintf(line, sizeof(line), "waits for object %s", hex);
        while (!cfx_test_file_contains(co.logpath, line) && cfx__now_ns() < deadline)
            usleep(5 * 1000);
        cr_assert(cfx_test_file_contains(co.logpath, line), "no lookup of object %d parked", i);
    }
}

/* ---- the node in a child process ------------------------------------------------- */

/* What the child reports for each of its calls. */
struct child_result {
    int32_t kind;
    int32_t index;
    int32_t rc;
    char err[ERR_LEN];
};

#define CHILD_NRES (2 * NCHILD)

/*
 * The child node: NCHILD gets of "outage/late/c<i>" (parked before the
 * kill), then on 'G' NCHILD puts of "outage/child/<i>"; it reports every
 * result, then keeps its objects served until the parent writes 'D'.
 * With mode "gone" its calls have a short deadline (GONE_MS).
 */
__attribute__((constructor)) static void outage_child_main(void)
{
    const char *spec = getenv(CHILD_ENV); /* "IN OUT ADDR TOKEN MODE" */
    int in, out;
    char a[64], tok[64], mode[16];
    if (!spec || sscanf(spec, "%d %d %63s %63s %15s", &in, &out, a, tok, mode) != 5)
        return;
    int ms = strcmp(mode, "gone") ? CALL_MS : GONE_MS;
    struct cfx_context *ctx = coord_run_join_at(a, tok, ms);
    if (!ctx) {
        fprintf(stderr, "outage child: %s\n", cfx_last_error());
        _exit(2);
    }
    static struct op ops[CHILD_NRES];
    struct cfx_object_id id;
    for (int i = 0; i < NCHILD; i++) {
        oid("outage/late/c%d", i, &id);
        op_start(&ops[i], ctx, OP_GET, &id, 300 + i, ms);
    }
    char c = 'R';
    if (write(out, &c, 1) != 1 || read(in, &c, 1) != 1 || c != 'G')
        _exit(3);
    for (int i = 0; i < NCHILD; i++) {
        oid("outage/child/%d", i, &id);
        op_start(&ops[NCHILD + i], ctx, OP_PUT, &id, 400 + i, ms);
    }
    for (int i = 0; i < CHILD_NRES; i++) {
        struct child_result r = { .kind = ops[i].kind, .index = i % NCHILD, .rc = ops[i].rc };
        op_join(&ops[i]);
        r.rc = ops[i].rc;
        snprintf(r.err, sizeof(r.err), "%s", ops[i].err);
        if (write(out, &r, sizeof(r)) != (ssize_t)sizeof(r))
            _exit(4);
    }
    if (read(in, &c, 1) != 1) /* 'D': the parent has what it wanted */
        c = 0;
    if (strcmp(mode, "gone")) /* without a coordinator the leave would only wait */
        cfx_context_destroy(ctx);
    _exit(0);
}

struct child {
    pid_t pid;
    int to, from;
};

static void child_start(struct child *ch, const char *mode)
{
    int down[2], up[2];
    char spec[256], exe[512];
    cr_assert_eq(pipe(down), 0);
    cr_assert_eq(pipe(up), 0);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    snprintf(spec, sizeof(spec), "%d %d %s %s %s", down[0], up[1], co.cc.addr, co.token, mode);
    ch->pid = fork();
    cr_assert_geq(ch->pid, 0);
    if (ch->pid == 0) {
        close(down[1]);
        close(up[0]);
        setenv(CHILD_ENV, spec, 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    ch->to = down[1];
    ch->from = up[0];
    struct pollfd p = { .fd = ch->from, .events = POLLIN };
    char c = 0;
    cr_assert(poll(&p, 1, 30000) == 1 && read(ch->from, &c, 1) == 1 && c == 'R',
              "the child node did not start");
}

static void child_send(struct child *ch, char c)
{
    cr_assert_eq(write(ch->to, &c, 1), 1);
}

/* The child's results, in the order it reports them. */
static void child_results(struct child *ch, struct child_result *r)
{
    for (int i = 0; i < CHILD_NRES; i++) {
        struct pollfd p = { .fd = ch->from, .events = POLLIN };
        cr_assert(poll(&p, 1, 60000) == 1 &&
                  read(ch->from, &r[i], sizeof(r[i])) == (ssize_t)sizeof(r[i]),
                  "the child node reported %d of %d results", i, CHILD_NRES);
    }
}

static void child_end(struct child *ch)
{
    int st = 0;
    child_send(ch, 'D');
    close(ch->to);
    close(ch->from);
    /* it exits at once after 'D'; bounded all the same */
    for (int i = 0; i < 3000 && waitpid(ch->pid, &st, WNOHANG) == 0; i++)
        usleep(10 * 1000);
    if (waitpid(ch->pid, &st, WNOHANG) == 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, &st, 0);
        cr_expect_fail("the child node did not exit");
    }
}

/* ---- restarted after 1 s --------------------------------------------------------- */

Test(coord_outage, burst_across_restart)
{
    struct cfx_context *a = join(CALL_MS), *b = join(CALL_MS);
    static struct op puts[NPUT], gets[NPUT], late_get[NLATE], late_put[NLATE + NCHILD];
    static struct op del[NDEL], pre[NDEL];
    struct cfx_object_id id, parked[NLATE + NCHILD];

    /* objects A deletes during the outage, put before it */
    for (int i = 0; i < NDEL; i++) {
        oid("outage/del/%d", i, &id);
        op_start(&pre[i], a, OP_PUT, &id, 200 + i, CALL_MS);
        op_expect_ok(&pre[i], "before the outage:", i);
    }
    /* lookups waiting in the coordinator when it goes */
    struct child ch;
    child_start(&ch, "restart");
    for (int i = 0; i < NLATE; i++) {
        oid("outage/late/%d", i, &parked[i]);
        op_start(&late_get[i], b, OP_GET, &parked[i], 100 + i, CALL_MS);
    }
    for (int i = 0; i < NCHILD; i++)
        oid("outage/late/c%d", i, &parked[NLATE + i]);
    wait_parked(parked, NLATE + NCHILD);

    coord_run_kill(&co);

    /* the burst, while it is down */
    child_send(&ch, 'G');
    for (int i = 0; i < NPUT; i++) {
        oid("outage/new/%d", i, &id);
        op_start(&puts[i], a, OP_PUT, &id, 1000 + i, CALL_MS);
        op_start(&gets[i], b, OP_GET, &id, 1000 + i, CALL_MS);
    }
    for (int i = 0; i < NLATE + NCHILD; i++)
        op_start(&late_put[i], a, OP_PUT, &parked[i], i < NLATE ? 100 + i : 300 + i - NLATE,
                 CALL_MS);
    for (int i = 0; i < NDEL; i++) {
        oid("outage/del/%d", i, &id);
        op_start(&del[i], a, OP_DELETE, &id, 0, CALL_MS);
    }
    usleep(1000 * 1000); /* the outage: 1 s */
    coord_run_start(&co); /* same port, same state directory */

    for (int i = 0; i < NPUT; i++) {
        op_expect_ok(&puts[i], "A:", i);
        op_expect_ok(&gets[i], "B:", i);
    }
    for (int i = 0; i < NLATE + NCHILD; i++)
        op_expect_ok(&late_put[i], "A (late):", i);
    for (int i = 0; i < NLATE; i++)
        op_expect_ok(&late_get[i], "B (parked at the kill):", i);
    for (int i = 0; i < NDEL; i++)
        op_expect_ok(&del[i], "A:", i);
    struct child_result cr[CHILD_NRES];
    child_results(&ch, cr);
    for (int i = 0; i < CHILD_NRES; i++)
        cr_expect_eq(cr[i].rc, CFX_OK, "child node: %s %d across the outage: %s: %s",
                     kind_name((enum op_kind)cr[i].kind), cr[i].index, cfx_errname(cr[i].rc),
                     cr[i].err);

    /* every put that returned CFX_OK can be fetched, by a newcomer too;
     * every deleted object is gone */
    struct cfx_context *c = join(CALL_MS);
    struct op check;
    for (int i = 0; i < NPUT; i++) {
        oid("outage/new/%d", i, &id);
        op_start(&check, c, OP_GET, &id, 1000 + i, CALL_MS);
        op_expect_ok(&check, "newcomer:", i);
        op_free(&check);
    }
    for (int i = 0; i < NCHILD; i++) {
        oid("outage/child/%d", i, &id);
        op_start(&check, c, OP_GET, &id, 400 + i, CALL_MS);
        op_expect_ok(&check, "newcomer (the child's objects):", i);
        op_free(&check);
    }
    for (int i = 0; i < NDEL; i++) {
        struct cfx_ctl_source src;
        oid("outage/del/%d", i, &id);
        int rc = cfx__ctl_obj_lookup_now(c->ctl, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src);
        cr_expect_eq(rc, CFX_ERR_TIMEOUT, "deleted object %d is still listed (%s)", i,
                     cfx_errname(rc));
        if (rc == CFX_OK)
            free(src.data);
    }
    child_end(&ch);

    cfx_context_destroy(c);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    for (int i = 0; i < NPUT; i++) {
        op_free(&puts[i]);
        op_free(&gets[i]);
    }
    for (int i = 0; i < NLATE + NCHILD; i++)
        op_free(&late_put[i]);
    for (int i = 0; i < NLATE; i++)
        op_free(&late_get[i]);
    for (int i = 0; i < NDEL; i++)
        op_free(&pre[i]);
}

/* ---- never restarted -------------------------------------------------------------- */

struct ps_arg {
    struct cfx_context *ctx;
    enum cfx_ps_role role;
    struct cfx_ps *ps;
    int rc;
    char err[ERR_LEN];
};

#define PS_COUNT 1024 /* floats in the worker's tensor */

/* The worker registers a tensor after the coordinator is gone. */
static void *ps_register_main(void *p)
{
    static float init[PS_COUNT]; /* worker 0 gives the initial values */
    struct ps_arg *r = p;
    int key = -1;
    r->rc = cfx_ps_register(r->ps, "late", CFX_DTYPE_F32, PS_COUNT, init, &key);
    snprintf(r->err, sizeof(r->err), "%s", r->rc == CFX_OK ? "registered" : cfx_last_error());
    return NULL;
}

static void *ps_create_main(void *p)
{
    struct ps_arg *r = p;
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_TIMEOUT,
        .job = "outage",
        .role = r->role,
        .index = 0,
        .num_workers = 1,
        .num_servers = 1,
        .timeout_ms = GONE_MS,
    };
    r->rc = cfx_ps_create(r->ctx, &pp, &r->ps);
    if (r->rc != CFX_OK)
        snprintf(r->err, sizeof(r->err), "%s", cfx_last_error());
    return NULL;
}

Test(coord_outage, coordinator_gone_for_good)
{
    struct cfx_context *a = join(GONE_MS), *b = join(GONE_MS);
    struct cfx_context *s = join(GONE_MS), *w = join(GONE_MS);
    static struct op pre, puts[NPUT], gets[NPUT], late_get[NLATE], del;
    struct cfx_object_id id, parked[NLATE + NCHILD];

    /* a parameter-server job: one server (the scheduler), one worker */
    struct ps_arg ps[2] = { { .ctx = s, .role = CFX_PS_SERVER }, { .ctx = w, .role = CFX_PS_WORKER } };
    pthread_t pt[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&pt[i], NULL, ps_create_main, &ps[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(pt[i], NULL);
        cr_assert_eq(ps[i].rc, CFX_OK, "ps member %d: %s", i, ps[i].err);
    }
    /* the job works before the outage: a tensor, pushed and pulled back */
    static float init[PS_COUNT], grad[PS_COUNT], got[PS_COUNT];
    for (int i = 0; i < PS_COUNT; i++) {
        init[i] = (float)i;
        grad[i] = 1.0f;
    }
    int key = -1;
    cr_assert_eq(cfx_ps_register(ps[1].ps, "w", CFX_DTYPE_F32, PS_COUNT, init, &key), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx_ps_pull(ps[1].ps, key, got), CFX_OK, "%s", cfx_last_error());
    cr_assert(!memcmp(got, init, sizeof(got)), "pulled values differ from the initial ones");

    oid("gone/pre", 0, &id);
    op_start(&pre, a, OP_PUT, &id, 7, GONE_MS);
    op_expect_ok(&pre, "before the outage:", 0);
    struct child ch;
    child_start(&ch, "gone");
    for (int i = 0; i < NLATE; i++) {
        oid("outage/late/%d", i, &parked[i]);
        op_start(&late_get[i], b, OP_GET, &parked[i], 100 + i, GONE_MS);
    }
    for (int i = 0; i < NCHILD; i++)
        oid("outage/late/c%d", i, &parked[NLATE + i]);
    wait_parked(parked, NLATE + NCHILD);

    coord_run_kill(&co); /* for good */
    child_send(&ch, 'G');
    /* the worker registers a tensor once its node knows the coordinator is
     * gone: the map it waits for cannot come */
    uint64_t seen = cfx__deadline_ns(10000);
    while (cfx__ctl_lost_ms(w->ctl) == 0 && cfx__now_ns() < seen)
        usleep(1000);
    cr_assert_gt(cfx__ctl_lost_ms(w->ctl), 0, "the worker's node did not see the coordinator go");
    struct ps_arg late = { .ctx = w, .ps = ps[1].ps };
    pthread_t lt;
    cr_assert_eq(pthread_create(&lt, NULL, ps_register_main, &late), 0);
    for (int i = 0; i < NPUT; i++) {
        oid("gone/new/%d", i, &id);
        op_start(&puts[i], a, OP_PUT, &id, 1000 + i, GONE_MS);
        op_start(&gets[i], b, OP_GET, &id, 1000 + i, GONE_MS);
    }
    oid("gone/pre", 0, &id);
    op_start(&del, a, OP_DELETE, &id, 0, GONE_MS);

    /* the server ends: serve returns CFX_ERR_CONNECT naming the coordinator
     * once it has been gone for the handle's timeout (bounded loop: the
     * old code returned CFX_ERR_TIMEOUT for ever) */
    int src = CFX_ERR_TIMEOUT;
    char serr[ERR_LEN] = "";
    for (int i = 0; i < 20 && src == CFX_ERR_TIMEOUT; i++) {
        src = cfx_ps_serve(ps[0].ps, 500);
        snprintf(serr, sizeof(serr), "%s", cfx_last_error());
    }
    expect_lost(src, serr, "ps server: cfx_ps_serve", 0);

    /* the worker: its register ended, and push, pull and a non-blocking
     * push now fail at once, all naming the coordinator */
    pthread_join(lt, NULL);
    expect_lost(late.rc, late.err, "ps worker: cfx_ps_register", 0);
    char werr[ERR_LEN];
    int wrc = cfx_ps_push(ps[1].ps, key, grad);
    snprintf(werr, sizeof(werr), "%s", cfx_last_error());
    expect_lost(wrc, werr, "ps worker: cfx_ps_push", 0);
    wrc = cfx_ps_pull(ps[1].ps, key, got);
    snprintf(werr, sizeof(werr), "%s", cfx_last_error());
    expect_lost(wrc, werr, "ps worker: cfx_ps_pull", 0);
    struct cfx_ps_request *wreq = NULL;
    wrc = cfx_ps_ipush(ps[1].ps, key, grad, &wreq);
    if (wrc == CFX_OK) {
        wrc = cfx_ps_wait(wreq, -1);
        cfx_ps_request_free(wreq);
    }
    snprintf(werr, sizeof(werr), "%s", cfx_last_error());
    expect_lost(wrc, werr, "ps worker: cfx_ps_ipush", 0);

    for (int i = 0; i < NPUT; i++) {
        op_join(&puts[i]);
        expect_lost(puts[i].rc, puts[i].err, "A: put", i);
        op_join(&gets[i]);
        expect_lost(gets[i].rc, gets[i].err, "B: get", i);
    }
    for (int i = 0; i < NLATE; i++) {
        op_join(&late_get[i]);
        expect_lost(late_get[i].rc, late_get[i].err, "B: get parked at the kill", i);
    }
    op_join(&del);
    expect_lost(del.rc, del.err, "A: delete", 0);
    struct child_result cr[CHILD_NRES];
    child_results(&ch, cr);
    for (int i = 0; i < CHILD_NRES; i++)
        expect_lost(cr[i].rc, cr[i].err,
                    cr[i].kind == OP_PUT ? "child node: put" : "child node: get", cr[i].index);
    child_end(&ch);

    cfx_ps_destroy(ps[1].ps);
    cfx_ps_destroy(ps[0].ps);
    for (int i = 0; i < NPUT; i++) {
        op_free(&puts[i]);
        op_free(&gets[i]);
    }
    for (int i = 0; i < NLATE; i++)
        op_free(&late_get[i]);
    op_free(&pre);
    cfx_context_destroy(w);
    cfx_context_destroy(s);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

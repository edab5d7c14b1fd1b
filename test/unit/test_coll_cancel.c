/*
 * Canceling non-blocking collectives: cfx_request_free() of a request still
 * running or still queued, and cfx_group_destroy() with calls queued.  The
 * library ran such calls on, reading and writing buffers the caller had
 * freed (a new user's trial: a SIGSEGV in the reduction of the caller's
 * unmapped buffer), and a destroy ran every queued call to its deadline in
 * turn.  Now a canceled call never touches a buffer once the cancel
 * returned, and the other ranks hear that this rank canceled it.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "control/client_int.h"
#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#include "group_ranks.h"
#include "intr_probe.h"

#define COUNT (256u * 1024) /* floats: a ring allreduce of several steps */

static pthread_barrier_t bar;

/* Wait until the group's thread runs @p req (it marks it under ctx->lock
 * and wakes nobody: looked at on every engine event, at least every ms). */
static bool started(struct cfx_context *ctx, struct cfx_request *req)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&ctx->lock);
    while (!req->started && cfx__now_ns() < dl)
        cfx__obj_wait(ctx, CFX_MIN(dl, cfx__deadline_ns(1)));
    bool s = req->started;
    pthread_mutex_unlock(&ctx->lock);
    return s;
}

static int fail(struct rank_run *rr, const char *why)
{
    snprintf(rr->err, sizeof(rr->err), "%s", why);
    /* rank_main() reports cfx_last_error() (@p why may be it: copied first) */
    return cfx__err(CFX_ERR_INTERNAL, "%s", rr->err);
}

/* The ranks' common last call: the group still serves after the cancel. */
static int sum_ok(struct rank_run *rr)
{
    int32_t v = rr->rank + 1, s = 0;
    int rc = cfx_group_allreduce(rr->g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    if (rc != CFX_OK)
        return rc;
    return s == rr->size * (rr->size + 1) / 2 ? CFX_OK : fail(rr, "wrong sum after the cancel");
}

/* The other rank's side of a call rank 0 canceled: it fails at once with
 * the news, naming rank 0. */
static int peer_sees_cancel(struct rank_run *rr, float *buf)
{
    int rc = cfx_group_allreduce(rr->g, buf, buf, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
    if (rc != CFX_ERR_PEER_FAILED)
        return fail(rr, rc == CFX_OK ? "the canceled call completed on the other rank"
                                     : cfx_last_error());
    if (!strstr(cfx_last_error(), "rank 0 (node") || !strstr(cfx_last_error(), "canceled"))
        return fail(rr, cfx_last_error());
    return CFX_OK;
}

/* Two ranks over @p tp run @p body, both with the barrier, and must succeed. */
static void pair_ok(const char *tp, const char *name, int (*body)(struct rank_run *))
{
    struct rank_run rr[2];
    up(tp, 2);
    pthread_barrier_init(&bar, NULL, 2);
    run_ranks(2, name, 20000, body, rr);
    pthread_barrier_destroy(&bar);
    all_ok(2, rr);
    down(2);
}

/* Rank 0 cancels its 1 MiB allreduce by @p cancel while rank 1 has not
 * called it yet; @p cancel fills the buffer with 0x5A once the call let go
 * of it.  Rank 1 then makes its side and hears the cancel; the canceled
 * call never writes the buffer after that, and the next call sums. */
static int canceled_by_rank0(struct rank_run *rr, int (*cancel)(struct rank_run *, float *))
{
    float *buf = malloc(COUNT * sizeof(float));
    int rc = CFX_OK;
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1.0f;
    if (rr->rank == 0) {
        rc = cancel(rr, buf);
        pthread_barrier_wait(&bar);
        pthread_barrier_wait(&bar); /* rank 1 made its side of the call */
        for (size_t i = 0; rc == CFX_OK && i < COUNT * sizeof(float); i++)
            if (((uint8_t *)buf)[i] != 0x5A)
                rc = fail(rr, "the canceled call wrote the buffer after it let go");
    } else {
        pthread_barrier_wait(&bar);
        rc = peer_sees_cancel(rr, buf);
        pthread_barrier_wait(&bar);
    }
    free(buf);
    return rc == CFX_OK ? sum_ok(rr) : rc;
}

/* Sends of canceled calls withdrawn unasked, without the half-second grace
 * a peer still in the call gets (the news of the cancel tells a peer that
 * has not come): Ctrl-C waited out that grace, 0.5 s instead of 0.1 s. */
static uint64_t unasked(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    uint64_t n = ctx->n_sends_unasked;
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

/* Rank 0 frees its running iallreduce. */
static int free_running(struct rank_run *rr, float *buf)
{
    struct cfx_request *req;
    int rc = cfx_group_iallreduce(rr->g, buf, buf, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL, &req);
    if (rc == CFX_OK && !started(rr->ctx, req))
        rc = fail(rr, "the call never started");
    if (rc == CFX_OK) {
        uint64_t before = unasked(rr->ctx);
        cfx_request_free(req); /* returns once the call let go of the buffer */
        memset(buf, 0x5A, COUNT * sizeof(float));
        if (unasked(rr->ctx) == before)
            rc = fail(rr, "the free kept the sends of a rank that had not called for the grace");
    }
    return rc;
}

static int body_free_running(struct rank_run *rr)
{
    return canceled_by_rank0(rr, free_running);
}

Test(coll_cancel, freeing_a_running_call_cancels_it, .timeout = 60)
{
    pair_ok("tcp", "cancel_run", body_free_running);
}

/* Rank 0 posts allreduce a (of 1 MiB), which waits for rank 1, and has the
 * next call, on b, canceled by @p cancel_b while it waits behind a.  The
 * canceled call never runs: b is untouched, a completes when rank 1 joins,
 * and rank 1's side of the canceled one hears the cancel in its turn. */
static int queued_then_canceled(struct rank_run *rr, int (*cancel_b)(struct rank_run *, float *),
                                const char *wrote)
{
    float *a = malloc(COUNT * sizeof(float)), *b = malloc(COUNT * sizeof(float));
    int rc = CFX_OK;
    for (size_t i = 0; i < COUNT; i++)
        a[i] = b[i] = (float)(rr->rank + 1);
    if (rr->rank == 0) {
        struct cfx_request *ra = NULL;
        rc = cfx_group_iallreduce(rr->g, a, a, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL, &ra);
        if (rc == CFX_OK && !started(rr->ctx, ra))
            rc = fail(rr, "the first call never started");
        if (rc == CFX_OK)
            rc = cancel_b(rr, b);
        pthread_barrier_wait(&bar);
        if (ra) {
            int wrc = cfx_request_wait(ra, 20000);
            cfx_request_free(ra);
            if (rc == CFX_OK && wrc != CFX_OK)
                rc = wrc;
        }
        for (size_t i = 0; rc == CFX_OK && i < COUNT; i++)
            if (a[i] != 3.0f || b[i] != 1.0f)
                rc = fail(rr, a[i] != 3.0f ? "the first call's sum is wrong" : wrote);
        pthread_barrier_wait(&bar);
    } else {
        pthread_barrier_wait(&bar);
        rc = cfx_group_allreduce(rr->g, a, a, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
        if (rc == CFX_OK && a[0] != 3.0f)
            rc = fail(rr, "the first call's sum is wrong");
        if (rc == CFX_OK)
            rc = peer_sees_cancel(rr, b);
        pthread_barrier_wait(&bar);
    }
    free(a);
    free(b);
    return rc == CFX_OK ? sum_ok(rr) : rc;
}

/* The second call posted and its request freed while it waits. */
static int free_queued(struct rank_run *rr, float *b)
{
    struct cfx_request *rb;
    int rc = cfx_group_iallreduce(rr->g, b, b, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL, &rb);
    if (rc == CFX_OK)
        cfx_request_free(rb); /* queued: returns at once, it never runs */
    return rc;
}

static int body_free_queued(struct rank_run *rr)
{
    return queued_then_canceled(rr, free_queued, "the canceled call wrote its buffer");
}

Test(coll_cancel, freeing_a_queued_call_means_it_never_runs, .timeout = 60)
{
    pair_ok("shm", "cancel_queued", body_free_queued);
}

/* Rank 0 posts three calls rank 1 has not made and destroys the group: the
 * three end canceled (they ran one after the other to their deadlines). */
static int body_destroy_queued(struct rank_run *rr)
{
    float *buf = malloc(3 * COUNT * sizeof(float));
    int rc = CFX_OK;
    for (size_t i = 0; i < 3 * COUNT; i++)
        buf[i] = 1.0f;
    if (rr->rank == 0) {
        struct cfx_request *req[3];
        for (int k = 0; k < 3 && rc == CFX_OK; k++)
            rc = cfx_group_iallreduce(rr->g, buf + k * COUNT, buf + k * COUNT, COUNT,
                                      CFX_DTYPE_F32, CFX_OP_SUM, NULL, &req[k]);
        if (rc == CFX_OK && !started(rr->ctx, req[0]))
            rc = fail(rr, "the first call never started");
        if (rc == CFX_OK) {
            cfx_group_destroy(rr->g);
            rr->g = NULL;
            for (int k = 0; k < 3; k++) {
                int st = cfx_request_wait(req[k], 0);
                if (st != CFX_ERR_CANCELED && rc == CFX_OK)
                    rc = fail(rr, st == CFX_ERR_AGAIN ? "a call still runs after the destroy"
                                                      : cfx_last_error());
                cfx_request_free(req[k]);
            }
        }
        pthread_barrier_wait(&bar);
    } else {
        pthread_barrier_wait(&bar);
        rc = peer_sees_cancel(rr, buf);
    }
    free(buf);
    return rc;
}

Test(coll_cancel, destroy_cancels_what_is_queued, .timeout = 60)
{
    pair_ok("tcp", "cancel_destroy", body_destroy_queued);
}

/* Rank 1's call #7 (@p kind) once rank 0's news of call @p news_seq came in
 * (a cancel, blaming @p bad_rank): its send to rank 0 fails
 * CFX_ERR_CANCELED; what cfx__coll_msg_failed() makes of it. */
static int failed_after_news(struct cfx_group *g, enum coll_kind kind, const char *what,
                             uint32_t news_seq, int bad_rank)
{
    struct coll_args a = { .kind = kind, .count = 1, .dtype = CFX_DTYPE_F32, .root = 2,
                           .seq = 7 };
    struct coll_exec x = { .g = g, .a = &a, .what = what, .esz = sizeof(float),
                           .timeout_ms = 10000, .tag = 7, .bad_rank = -1, .news_rank = -1,
                           .blame_rank = -1, .blame_via = -1, .gave_rank = -1 };
    x.deadline = cfx__deadline_ns(x.timeout_ms);
    pthread_mutex_lock(&g->ctx->lock);
    g->gave[0] = (struct coll_gave){
        .set = true, .seq = news_seq, .bad_rank = bad_rank,
        .f = { .magic = COLL_FAIL_MAGIC, .status = CFX_ERR_CANCELED, .via = -1,
               .why = COLL_WHY_CANCELED },
    };
    g->ngave++;
    pthread_mutex_unlock(&g->ctx->lock);
    cfx__err(CFX_ERR_CANCELED, "send to node %u (tag 7) failed: operation canceled", g->ids[0]);
    int rc = cfx__coll_msg_failed(&x, 0, true, CFX_ERR_CANCELED);
    cfx__coll_news_forget(&(struct coll_exec){ .g = g, .a = &(struct coll_args){ .seq = 8 } });
    return rc;
}

/* A cancel heard second-hand.  Rank 2 canceled a reduce; rank 0 gave it up
 * on that news and withdrew its receive of rank 1's message, whose send so
 * failed with CFX_ERR_CANCELED, and the news of rank 0 explains it.  Rank
 * 1's call ended with that CFX_ERR_CANCELED, as if its own request had been
 * freed, where the same news heard before the message failed gives
 * CFX_ERR_PEER_FAILED (a randomized stress of canceled calls showed both).
 * The message failure is put to rank 1's call directly, the news in. */
static int body_cancel_relayed(struct rank_run *rr)
{
    if (rr->rank != 1)
        return CFX_OK;
    int rc = failed_after_news(rr->g, COLL_REDUCE, "reduce", 7, 2);
    if (rc != CFX_ERR_PEER_FAILED)
        return fail(rr, cfx_last_error());
    if (!strstr(cfx_last_error(), "rank 2 (node") || !strstr(cfx_last_error(), "canceled"))
        return fail(rr, cfx_last_error());
    return CFX_OK;
}

Test(coll_cancel, a_cancel_heard_second_hand_is_a_peer_failure, .timeout = 60)
{
    struct rank_run rr[3];
    up("tcp", 3);
    run_ranks(3, "cancel_relayed", 20000, body_cancel_relayed, rr);
    all_ok(3, rr);
    down(3);
}

/* News of an earlier call.  Rank 0 canceled call #5 and its news reached
 * rank 1 late, read by the sweep of a later call; in call #7, canceled by
 * another rank, rank 1's message with rank 0 failed before rank 0's news of
 * #7 came, and rank 1 blamed rank 0's cancel of #5 ("rank 0 canceled the
 * call"), naming the wrong rank.  News of another call is no cause. */
static int body_stale_news(struct rank_run *rr)
{
    if (rr->rank != 1)
        return CFX_OK;
    int rc = failed_after_news(rr->g, COLL_ALLREDUCE, "allreduce", 5, 0);
    if (rc == CFX_OK || strstr(cfx_last_error(), "canceled the call"))
        return fail(rr, cfx_last_error());
    return CFX_OK;
}

Test(coll_cancel, news_of_an_earlier_call_is_no_cause, .timeout = 60)
{
    struct rank_run rr[2];
    up("tcp", 2);
    run_ranks(2, "cancel_stale", 20000, body_stale_news, rr);
    all_ok(2, rr);
    down(2);
}

/*
 * Interrupting a blocking call (cfx_set_interrupt_check, as Ctrl-C in
 * Python): rank 0's allreduce waits for rank 1, which has not called it;
 * the check, run on rank 0's thread with no lock of the library held,
 * asks to stop, and the call ends CFX_ERR_CANCELED as a freed request's
 * would, without waiting for rank 1 to take its sends (it waited out a
 * half-second grace: Ctrl-C took 0.5 s instead of 0.1 s).  Rank 1's side
 * then hears the cancel, and the group goes on.
 */
/* A blocking allreduce on @p rr's group under intr_check: CFX_ERR_CANCELED
 * saying @p why, the check run once. */
static int allreduce_interrupted(struct rank_run *rr, float *buf, const char *why)
{
    struct intr_probe p = { .ctx = rr->ctx };
    cfx_set_interrupt_check(intr_check, &p);
    int rc = cfx_group_allreduce(rr->g, buf, buf, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
    cfx_set_interrupt_check(NULL, NULL);
    if (rc != CFX_ERR_CANCELED || !strstr(cfx_last_error(), why))
        return fail(rr, rc == CFX_OK ? "the interrupted call completed" : cfx_last_error());
    if (p.calls != 1)
        return fail(rr, "the check ran again after it asked to stop");
    return CFX_OK;
}

static int interrupt_blocking(struct rank_run *rr, float *buf)
{
    uint64_t before = unasked(rr->ctx);
    int rc = allreduce_interrupted(rr, buf, "interrupted");
    if (rc != CFX_OK)
        return rc;
    if (unasked(rr->ctx) == before)
        return fail(rr, "the interrupted call kept the sends of a rank that had not called for "
                    "the grace");
    memset(buf, 0x5A, COUNT * sizeof(float)); /* the call returned: the buffer is ours */
    return CFX_OK;
}

static int body_interrupted(struct rank_run *rr)
{
    return canceled_by_rank0(rr, interrupt_blocking);
}

Test(coll_cancel, an_interrupted_blocking_call_is_canceled, .timeout = 60)
{
    pair_ok("tcp", "cancel_intr", body_interrupted);
}

/* The second call a blocking one, its wait behind the first ended by the
 * interrupt check (before, it was a plain condition wait, bounded only by
 * the deadline of the call before). */
static int interrupt_queued(struct rank_run *rr, float *b)
{
    return allreduce_interrupted(rr, b, "1 call queued before it");
}

static int body_interrupted_queued(struct rank_run *rr)
{
    return queued_then_canceled(rr, interrupt_queued, "the interrupted call wrote its buffer");
}

Test(coll_cancel, an_interrupted_call_waiting_behind_queued_ones_never_runs, .timeout = 60)
{
    pair_ok("shm", "cancel_intr_queued", body_interrupted_queued);
}

/* The creation of a group waits for ranks that have not come: rank 0's
 * check asks to stop, the creation fails CFX_ERR_CANCELED having withdrawn
 * what it published, and the group is then created by both ranks. */
Test(coll_cancel, an_interrupted_group_creation_leaves_the_name_free, .timeout = 60)
{
    up("tcp", 2);
    struct intr_probe p = { .ctx = ctxs[0] };
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = "intr_create", .rank = 0, .size = 2, .timeout_ms = 20000,
    };
    struct cfx_group *g = NULL;
    cfx_set_interrupt_check(intr_check, &p);
    int rc = cfx_group_create(ctxs[0], &gp, &g);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());
    cr_assert_null(g);
    cr_assert_eq(p.calls, 1);

    struct rank_run rr[2];
    run_ranks(2, "intr_create", 20000, sum_ok, rr);
    all_ok(2, rr);
    down(2);
}

/*
 * cfx_group_destroy() while a blocking call of the group waits on another
 * thread of the same process (rank 0's call waits for rank 1, which has not
 * made its side): the destroy freed the group under the call, and the
 * process crashed (a new user's trial: SIGSEGV, 3 of 3 runs).  Now the call
 * stops at once with CFX_ERR_CANCELED naming the destroy, the destroy
 * waits for it to leave and returns, and nothing is used after it was
 * freed (run under ASan).  Rank 1's side of a collective hears the cancel.
 */
#define DESTROY_CALL_MS 60000 /* the waiting call's deadline: a CANCELED is no timeout */

enum { D_ALLREDUCE, D_RECV, D_QUEUED };

struct in_flight {
    struct cfx_group *g;
    int kind;
    size_t bytes;               /* D_RECV: the receive's size */
    float *buf;
    int rc;
    char err[512];
};

static void *in_flight_main(void *arg)
{
    struct in_flight *f = arg;
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT,
                                 .timeout_ms = DESTROY_CALL_MS };
    if (f->kind == D_RECV)
        f->rc = cfx_group_recv(f->g, f->buf, f->bytes, 1, 7, &p);
    else
        f->rc = cfx_group_allreduce(f->g, f->buf, f->buf, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    snprintf(f->err, sizeof(f->err), "%s", cfx_last_error());
    return NULL;
}

/* The call is inside the group and asleep in a wait (looked at again
 * after each yield, as cfx_test_await_count does: nothing signals a thread
 * falling asleep), up to a generous deadline: entered on the context, and a
 * thread asleep on the engine (the call, or the queued one it waits behind,
 * having taken its number: wait_turn() sleeps in the hold it takes it in). */
static bool call_waits(struct cfx_group *g, struct cfx_context *ctx, bool queued)
{
    uint64_t dl = cfx__deadline_ns(20000);
    bool in = false;
    while (!in && cfx__now_ns() < dl) {
        pthread_mutex_lock(&g->lock);
        pthread_mutex_lock(&ctx->lock);
        in = ctx->calls == 1 && ctx->obj_waiters > 0 && (!queued || g->next_seq == 2);
        pthread_mutex_unlock(&ctx->lock);
        pthread_mutex_unlock(&g->lock);
        if (!in)
            sched_yield();
    }
    return in;
}

static int destroy_kind;
static size_t destroy_bytes;

static int destroy_under_call(struct rank_run *rr)
{
    float *buf = malloc(COUNT * sizeof(float));
    int rc = CFX_OK;
    for (size_t i = 0; i < COUNT; i++)
        buf[i] = 1.0f;
    if (rr->rank == 0) {
        struct in_flight f = { .g = rr->g, .kind = destroy_kind, .bytes = destroy_bytes,
                               .buf = buf };
        struct cfx_request *req = NULL;
        if (destroy_kind == D_QUEUED) /* the blocking call waits behind it (wait_turn) */
            rc = cfx_group_iallreduce(rr->g, buf, buf, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL,
                                      &req);
        if (rc == CFX_OK && req && !started(rr->ctx, req))
            rc = fail(rr, "the queued call never started");
        pthread_t th;
        if (rc == CFX_OK && pthread_create(&th, NULL, in_flight_main, &f))
            rc = fail(rr, "pthread_create");
        if (rc == CFX_OK) {
            bool waits = call_waits(rr->g, rr->ctx, destroy_kind == D_QUEUED);
            cfx_group_destroy(rr->g); /* returns once the call left */
            rr->g = NULL;
            pthread_join(th, NULL);
            const char *why = destroy_kind == D_ALLREDUCE ? "group cancel_gd was destroyed"
                              : destroy_kind == D_RECV    ? "the group was destroyed meanwhile"
                                                          : "the group was destroyed while it "
                                                            "waited for 1 call queued";
            if (!waits)
                rc = fail(rr, "the call did not start waiting");
            else if (f.rc != CFX_ERR_CANCELED || !strstr(f.err, why))
                rc = fail(rr, f.err);
            else if (destroy_kind == D_RECV && !strstr(f.err, "rank 0 receiving from rank 1"))
                rc = fail(rr, f.err);
        }
        if (req) {
            int st = cfx_request_wait(req, 0);
            if (st != CFX_ERR_CANCELED && rc == CFX_OK) {
                char why[400];
                snprintf(why, sizeof(why), "the queued call: %s: %s", cfx_errname(st),
                         st == CFX_ERR_AGAIN ? "it still runs" : cfx_last_error());
                rc = fail(rr, why);
            }
            cfx_request_free(req);
        }
        pthread_barrier_wait(&bar);
    } else {
        pthread_barrier_wait(&bar);
        if (destroy_kind != D_RECV) /* each of rank 0's calls tells it was canceled */
            rc = peer_sees_cancel(rr, buf);
        if (rc == CFX_OK && destroy_kind == D_QUEUED)
            rc = peer_sees_cancel(rr, buf);
    }
    free(buf);
    return rc;
}

static void destroyed_under(int kind, size_t bytes, const char *tp)
{
    destroy_kind = kind;
    destroy_bytes = bytes;
    pair_ok(tp, "cancel_gd", destroy_under_call);
}

Test(coll_cancel, destroying_the_group_stops_a_blocking_collective, .timeout = 120)
{
    destroyed_under(D_ALLREDUCE, 0, "tcp");
}

Test(coll_cancel, destroying_the_group_stops_a_call_waiting_for_its_turn, .timeout = 120)
{
    destroyed_under(D_QUEUED, 0, "shm");
}

/* eager, eager pieces (group_split.c) and rendezvous receives */
Test(coll_cancel, destroying_the_group_stops_a_receive, .timeout = 120)
{
    const size_t sizes[] = { 64, 8192, 1u << 20 };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(sizes); i++)
        destroyed_under(D_RECV, sizes[i], i == 1 ? "shm" : "tcp");
}

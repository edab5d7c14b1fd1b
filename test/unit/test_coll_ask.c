/*
 * The argument check's question (coll_check.c, "argument check along the
 * messages"): a rank whose wait for another rank runs COLL_CHECK_ASK_MS
 * sends its header to that rank on the check channel.
 *  - Two ranks that wait for each other on different calls (a reduce's root
 *    waits for its children, which wait for it in a broadcast) learn of the
 *    disagreement from the question, not at their deadline.
 *  - The question goes to the rank waited for alone.  It went to every
 *    rank, so any call that ran past 50 ms on some rank (a late rank, a
 *    large ring allreduce) connected every rank to every other: a ring of
 *    4 held connections between ranks two apart, which its schedule never
 *    uses (on verbs each is a queue pair with its receive buffers).
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#define MAX_RANKS 8 /* the ring below */
#include "group_ranks.h"

/* The rank's failure, said in its cfx_last_error() (rank_main keeps that). */
static int fail(struct rank_run *rr, const char *why)
{
    return cfx__err(CFX_ERR_INTERNAL, "rank %d: %s", rr->rank, why);
}

/* After a failed call the group still works: a sum of ones. */
static int still_works(struct rank_run *rr)
{
    int32_t one = 1, sum = 0;
    int rc = cfx_group_allreduce(rr->g, &one, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    if (rc != CFX_OK)
        return rc;
    return sum == rr->size ? CFX_OK : fail(rr, "wrong sum after the failed call");
}

/* Rank 0 reduces to itself while the others broadcast from it: rank 0
 * waits for its children and they wait for it, and no message of the call
 * is ever sent.  Every rank fails with CFX_ERR_INVALID well before the
 * 20 s deadline (with it, they would say "timed out"). */
static int body_wait_each_other(struct rank_run *rr)
{
    float v[256];
    for (int i = 0; i < 256; i++)
        v[i] = (float)(rr->rank + i);
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 20000 };
    int rc = rr->rank == 0
                 ? cfx_group_reduce(rr->g, v, v, 256, CFX_DTYPE_F32, CFX_OP_SUM, 0, &p)
                 : cfx_group_broadcast(rr->g, v, 256, CFX_DTYPE_F32, 0, &p);
    if (rc != CFX_ERR_INVALID)
        return fail(rr, rc == CFX_OK ? "a call whose ranks disagree returned CFX_OK"
                                     : cfx_last_error());
    if (!strstr(cfx_last_error(), "disagree") || !strstr(cfx_last_error(), "reduce") ||
        !strstr(cfx_last_error(), "broadcast"))
        return fail(rr, cfx_last_error());
    for (int i = 0; rr->rank != 0 && i < 256; i++)
        if (v[i] != (float)(rr->rank + i))
            return fail(rr, "the failed broadcast wrote the buffer");
    return still_works(rr);
}

Test(coll_ask, ranks_that_wait_for_each_other_ask_and_fail, .timeout = 60)
{
    struct rank_run rr[4];
    up("tcp", 4);
    run_ranks(4, "ask_each", 20000, body_wait_each_other, rr);
    all_ok(4, rr);
    down(4);
}

#define RING_COUNT 4096 /* floats */
#define RING_RANKS 8

/* Does @p ctx hold a live data-plane connection with node @p node_id? */
static bool connected(struct cfx_context *ctx, uint32_t node_id)
{
    bool yes = false;
    struct cfx_list *pos;
    pthread_mutex_lock(&ctx->lock);
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node_id && c->state != CFX_CONN_FAILED)
            yes = true;
    }
    pthread_mutex_unlock(&ctx->lock);
    return yes;
}

/* The ranks @p me may have talked with: the group's creation ends with a
 * barrier (recursive doubling: me ^ 1, 2, 4), the ring's neighbours. */
static bool schedule_peer(int me, int q, int n)
{
    return q == (me ^ 1) || q == (me ^ 2) || q == (me ^ 4) || q == (me + 1) % n ||
           q == (me + n - 1) % n;
}

static bool any_message(void *arg, const struct cfx_eager_unexp *u)
{
    (void)arg;
    (void)u;
    return true;
}

/* Rank @p rr waits until a question of the call it has not made yet is in
 * (a rank whose wait for it ran COLL_CHECK_ASK_MS asked): it is late by
 * that much, whatever the machine's speed. */
static int wait_asked(struct rank_run *rr)
{
    struct cfx_context *ctx = rr->ctx;
    uint64_t dl = cfx__deadline_ns(15000);
    pthread_mutex_lock(&ctx->lock);
    bool asked;
    while (!(asked = cfx__eager_unexp_scan(ctx, rr->g->chan_chk, any_message, NULL)) &&
           cfx__obj_wait(ctx, dl)) /* an arrival there wakes the context's waiters */
        ;
    pthread_mutex_unlock(&ctx->lock);
    return asked ? CFX_OK : fail(rr, "no rank asked it within 15 s");
}

/* A ring allreduce of 8 ranks that the last joins once a rank waiting for
 * it asked (its wait ran past COLL_CHECK_ASK_MS).  Every value is checked;
 * then no rank holds a connection with a rank neither the creation's
 * barrier nor the ring uses (rank 0: ranks 3, 5 and 6). */
static int body_late_ring(struct rank_run *rr)
{
    static float s[RING_RANKS][RING_COUNT], r[RING_RANKS][RING_COUNT];
    const int me = rr->rank, n = rr->size;
    for (int i = 0; i < RING_COUNT; i++)
        s[me][i] = (float)(me * 1000 + i % 1000);
    if (me == n - 1) {
        int rc = wait_asked(rr);
        if (rc != CFX_OK)
            return rc;
    }
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_ALGO | CFX_COLL_PARAM_TIMEOUT,
                                 .algo = CFX_ALGO_RING, .timeout_ms = 20000 };
    int rc = cfx_group_allreduce(rr->g, s[me], r[me], RING_COUNT, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    if (rc != CFX_OK)
        return rc;
    for (int i = 0; i < RING_COUNT; i++)
        if (r[me][i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 1000)))
            return fail(rr, "wrong sum");
    for (int q = 0; q < n; q++)
        if (q != me && !schedule_peer(me, q, n) && connected(rr->ctx, rr->g->ids[q])) {
            char why[128];
            snprintf(why, sizeof(why), "it holds a connection with rank %d, which neither "
                     "the barrier nor the ring uses", q);
            return fail(rr, why);
        }
    return CFX_OK;
}

Test(coll_ask, a_late_rank_is_asked_by_its_neighbours_alone, .timeout = 60)
{
    struct rank_run rr[RING_RANKS];
    up("tcp", RING_RANKS);
    run_ranks(RING_RANKS, "ask_ring", 20000, body_late_ring, rr);
    all_ok(RING_RANKS, rr);
    down(RING_RANKS);
}

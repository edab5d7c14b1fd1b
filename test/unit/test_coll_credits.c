/*
 * A collective's eager pieces and the pair's eager credits.  Every group
 * and cfx_group_send() of two ranks share one grant of CFX_EAGER_CREDITS
 * eager messages per connection, and a piece waits in the receiver's
 * unexpected queue, on its credit, until the receiver reaches its call.  A
 * 256 KiB broadcast between ranks of one host went as four 64 KiB
 * segments of pieces (66 messages): with the receiver still in a call of
 * another group, the root's message of that call queued behind the pieces
 * and both calls ended at their deadlines (a randomized stress of several
 * groups found it).  A call now sends a rank at most COLL_SPLIT_BUDGET
 * pieces, the rest by rendezvous.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#include "group_ranks.h"

#define BIG (256u * 1024) /* bytes: four segments of COLL_SPLIT_MAX_SHM */
#define SMALL 16

static pthread_barrier_t bar;

static int fail(struct rank_run *rr, const char *why)
{
    return cfx__err(CFX_ERR_INTERNAL, "rank %d: %s", rr->rank, why);
}

static bool count_one(void *arg, const struct cfx_eager_unexp *u)
{
    (void)u;
    (*(int *)arg)++;
    return false;
}

/* Wait until @p n eager messages of group @p g's calls wait here unreceived. */
static bool pieces_in(struct cfx_group *g, int n)
{
    struct cfx_context *ctx = g->ctx;
    uint64_t dl = cfx__deadline_ns(10000);
    int in = 0;
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        in = 0;
        cfx__eager_unexp_scan(ctx, g->chan, count_one, &in);
        if (in >= n || cfx__now_ns() >= dl)
            break;
        cfx__obj_wait(ctx, CFX_MIN(dl, cfx__deadline_ns(1)));
    }
    pthread_mutex_unlock(&ctx->lock);
    return in >= n;
}

static int check(struct rank_run *rr, const uint8_t *buf, size_t len, uint8_t want)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != want)
            return fail(rr, "wrong byte in a broadcast");
    return CFX_OK;
}

/* Rank 0 broadcasts BIG on group A without blocking, then SMALL on group B;
 * rank 1 takes B's first (once A's first pieces wait here), then A's. */
static int body_other_group(struct rank_run *rr)
{
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = "credits_b", .rank = rr->rank, .size = rr->size, .timeout_ms = 5000,
    };
    struct cfx_group *b = NULL;
    struct cfx_request *req = NULL;
    uint8_t *big = malloc(BIG), small[SMALL];
    int rc = cfx_group_create(rr->ctx, &gp, &b);
    memset(big, rr->rank == 0 ? 0xA7 : 0, BIG);
    memset(small, rr->rank == 0 ? 0x5C : 0, SMALL);
    if (rc == CFX_OK && rr->rank == 0) {
        rc = cfx_group_ibroadcast(rr->g, big, BIG, CFX_DTYPE_U8, 0, NULL, &req);
        pthread_barrier_wait(&bar); /* rank 1 holds A's first pieces */
        if (rc == CFX_OK)
            rc = cfx_group_broadcast(b, small, SMALL, CFX_DTYPE_U8, 0, NULL);
        if (req) {
            int wrc = cfx_request_wait(req, -1);
            rc = rc != CFX_OK ? rc : wrc;
        }
    } else if (rc == CFX_OK) {
        /* A's first segment: COLL_SPLIT_MAX_SHM in pieces (its header in
         * front of the first) */
        int first = (int)(1 + (COLL_SPLIT_MAX_SHM - COLL_HDR_INLINE + CFX_EAGER_LIMIT - 1) /
                                  CFX_EAGER_LIMIT);
        if (!pieces_in(rr->g, first))
            rc = fail(rr, "the broadcast's first pieces never came");
        pthread_barrier_wait(&bar);
        if (rc == CFX_OK)
            rc = cfx_group_broadcast(b, small, SMALL, CFX_DTYPE_U8, 0, NULL);
        if (rc == CFX_OK)
            rc = check(rr, small, SMALL, 0x5C);
        if (rc == CFX_OK)
            rc = cfx_group_ibroadcast(rr->g, big, BIG, CFX_DTYPE_U8, 0, NULL, &req);
        if (rc == CFX_OK)
            rc = cfx_request_wait(req, -1);
        if (rc == CFX_OK)
            rc = check(rr, big, BIG, 0xA7);
    } else {
        pthread_barrier_wait(&bar);
    }
    char keep[512];
    snprintf(keep, sizeof(keep), "%s", cfx_last_error());
    cfx_request_free(req);
    cfx_group_destroy(b);
    free(big);
    return rc == CFX_OK ? CFX_OK : cfx__err(rc, "%s", keep); /* the call's, not the destroy's */
}

Test(coll_credits, pieces_leave_credits_for_another_group, .timeout = 60)
{
    struct rank_run rr[2];
    up("shm", 2);
    pthread_barrier_init(&bar, NULL, 2);
    run_ranks(2, "credits_a", 5000, body_other_group, rr);
    pthread_barrier_destroy(&bar);
    all_ok(2, rr);
    down(2);
}

/*
 * A group's and a group call's params with a field_mask bit this library
 * does not know (a field of a newer header): the call fails with
 * CFX_ERR_UNSUPPORTED naming the bits and does nothing, and a collective
 * refused so is told to the other ranks as any refusal of a rank's own
 * check is (coll.c coll_refused), so they fail at once naming it instead of
 * waiting for it until their deadline.  The bit was ignored: every such
 * call returned CFX_OK.  One process: an embedded coordinator, a context
 * and a thread per rank.  Also a group's parameter from the environment
 * (CFX_COLL_SEG) past its bound.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#define MAX_RANKS 2
#include "group_ranks.h"

#define NEWER (1ull << 40) /* a field of a newer header */
#define DEADLINE_MS 20000  /* the calls'; the test's limit is 60 s */

static int fail(struct rank_run *rr, const char *what, int rc)
{
    return cfx__err(CFX_ERR_INTERNAL, "rank %d: %s: %s (%s)", rr->rank, what, cfx_errname(rc),
                    cfx_last_error());
}

/* The refusal's text on the rank that made the call. */
static bool names_the_bit(const char *call)
{
    char want[160];
    snprintf(want, sizeof(want), "%s: cfx_coll_params.field_mask has bits 0x10000000000 this "
             "library does not know", call);
    return strstr(cfx_last_error(), want) != NULL;
}

/* The other rank's side of a call rank 0 refused: its refusal, at once. */
static bool told_of_the_refusal(int rc)
{
    const char *e = cfx_last_error();
    return rc == CFX_ERR_PEER_FAILED && strstr(e, "rank 0 (node") && strstr(e, "refused") &&
           strstr(e, "CFX_ERR_UNSUPPORTED");
}

/* Rank 0's calls set the bit, rank 1's do not. */
static int body(struct rank_run *rr)
{
    struct cfx_coll_params ok = { .field_mask = CFX_COLL_PARAM_TIMEOUT,
                                  .timeout_ms = DEADLINE_MS };
    struct cfx_coll_params bad = ok;
    bad.field_mask |= NEWER;
    const struct cfx_coll_params *p = rr->rank == 0 ? &bad : &ok;
    int32_t v = rr->rank + 1, sum = -1;

    /* blocking: rank 0's result is untouched, rank 1 hears of it */
    int rc = cfx_group_allreduce(rr->g, &v, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, p);
    if (rr->rank == 0 && (rc != CFX_ERR_UNSUPPORTED || !names_the_bit("allreduce")))
        return fail(rr, "allreduce with the bit", rc);
    if (rr->rank == 0 && sum != -1)
        return fail(rr, "the refused allreduce wrote its result", rc);
    if (rr->rank == 1 && !told_of_the_refusal(rc))
        return fail(rr, "allreduce rank 0 refused", rc);

    /* non-blocking: no request on rank 0, as for its other refusals */
    struct cfx_request *req = NULL;
    rc = cfx_group_iallreduce(rr->g, &v, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, p, &req);
    if (rr->rank == 0 && (rc != CFX_ERR_UNSUPPORTED || req || !names_the_bit("allreduce")))
        return fail(rr, "iallreduce with the bit", rc);
    if (rr->rank == 1) {
        if (rc != CFX_OK)
            return fail(rr, "iallreduce", rc);
        rc = cfx_request_wait(req, DEADLINE_MS);
        bool told = told_of_the_refusal(rc);
        cfx_request_free(req);
        if (!told)
            return fail(rr, "iallreduce rank 0 refused", rc);
    }

    /* point to point: the refused send sends nothing, the next one arrives */
    int32_t msg = 0;
    if (rr->rank == 0) {
        msg = 111;
        rc = cfx_group_send(rr->g, &msg, sizeof(msg), 1, 7, &bad);
        if (rc != CFX_ERR_UNSUPPORTED || !names_the_bit("cfx_group_send"))
            return fail(rr, "send with the bit", rc);
        msg = 222;
        if ((rc = cfx_group_send(rr->g, &msg, sizeof(msg), 1, 7, &ok)) != CFX_OK)
            return fail(rr, "send", rc);
    } else {
        bad.field_mask = CFX_COLL_PARAM_TIMEOUT | NEWER;
        rc = cfx_group_recv(rr->g, &msg, sizeof(msg), 0, 7, &bad);
        if (rc != CFX_ERR_UNSUPPORTED || !names_the_bit("cfx_group_recv") || msg != 0)
            return fail(rr, "recv with the bit", rc);
        if ((rc = cfx_group_recv(rr->g, &msg, sizeof(msg), 0, 7, &ok)) != CFX_OK)
            return fail(rr, "recv", rc);
        if (msg != 222)
            return cfx__err(CFX_ERR_INTERNAL, "rank 1 received %d, want 222", msg);
    }

    /* the ranks are still in step: the next calls pair */
    for (int32_t step = 1; step <= 2; step++) {
        v = step * (rr->rank + 1);
        if ((rc = cfx_group_allreduce(rr->g, &v, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, &ok)))
            return fail(rr, "allreduce after", rc);
        if (sum != step * 3)
            return cfx__err(CFX_ERR_INTERNAL, "allreduce %d: %d, want %d", step, sum, step * 3);
    }
    return CFX_OK;
}

Test(group_params, collective_refused_on_one_rank_is_told_to_the_other, .timeout = 60)
{
    struct rank_run rr[2];
    up("tcp", 2);
    run_ranks(2, "newer", DEADLINE_MS, body, rr);
    all_ok(2, rr);
    down(2);
}

/* A group's own params: refused before anything is done (no group of that
 * name on the context: one created after it is not CFX_ERR_EXISTS). */
Test(group_params, group_create_refused, .timeout = 60)
{
    up("tcp", 1);
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE | NEWER,
        .name = "solo",
        .rank = 0,
        .size = 1,
    };
    struct cfx_group *g = NULL;
    int rc = cfx_group_create(ctxs[0], &gp, &g);
    cr_assert_eq(rc, CFX_ERR_UNSUPPORTED, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(g);
    cr_assert(strstr(cfx_last_error(), "cfx_group_create: cfx_group_params.field_mask has bits "
                     "0x10000000000 this library does not know"), "%s", cfx_last_error());
    gp.field_mask &= CFX_GROUP_PARAM_ALL;
    cr_assert_eq(cfx_group_create(ctxs[0], &gp, &g), CFX_OK, "%s", cfx_last_error());
    cfx_group_destroy(g);
    down(1);
}

/* In place, one float per rank: the call whose scratch size wrapped. */
static int rs_body(struct rank_run *rr)
{
    float buf[2] = { 1.0f, 2.0f };
    if (rr->g->seg_bytes != COLL_SEG_MAX)
        return cfx__err(CFX_ERR_INTERNAL, "rank %d: seg_bytes %zu, want %u", rr->rank,
                        rr->g->seg_bytes, COLL_SEG_MAX);
    int rc = cfx_group_reduce_scatter(rr->g, buf, buf + rr->rank, 1, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL);
    if (rc != CFX_OK)
        return fail(rr, "reduce_scatter", rc);
    if (buf[rr->rank] != 2.0f * (float)(rr->rank + 1))
        return cfx__err(CFX_ERR_INTERNAL, "rank %d: got %g", rr->rank, buf[rr->rank]);
    return CFX_OK;
}

/* CFX_COLL_SEG past its bound (2^63) is brought to COLL_SEG_MAX, as README
 * says of every variable: it was taken whole, and a reduce_scatter failed
 * with CFX_ERR_NOMEM asking for 9223372036854775808 bytes of scratch. */
Test(group_params, coll_seg_past_its_bound_is_brought_to_it, .timeout = 60)
{
    struct rank_run rr[2];
    cr_assert_eq(setenv("CFX_COLL_SEG", "9223372036854775808", 1), 0);
    up("tcp", 2);
    run_ranks(2, "seg", DEADLINE_MS, rs_body, rr);
    unsetenv("CFX_COLL_SEG");
    all_ok(2, rr);
    down(2);
}

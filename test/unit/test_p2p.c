/*
 * Point-to-point messages between two contexts in one process, over tcp and
 * over shm: sizes, posting order, FIFO matching, size disagreement, missing
 * sender, withdrawal.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "dataplane/engine/p2p.h"
#include "testutil.h"

static struct cfx_coord *coord;
static char coord_addr[64], token[64];
static struct cfx_context *a, *b;
static struct cfx_node_rec ra, rb; /* a's record (for b) and b's (for a) */

static void join(const char *tps, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS,
        .coord = coord_addr, .token = token, .transports = tps,
    };
    cr_assert_eq(cfx_context_create(&p, out), CFX_OK, "%s", cfx_last_error());
}

static void up(const char *tps)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK);
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
    join(tps, &a);
    join(tps, &b);
    uint64_t dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__ctl_node_get(b->ctl, a->node_id, &ra, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_node_get(a->ctl, b->node_id, &rb, dl), CFX_OK);
}

static void down(void)
{
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    cfx__coord_stop(coord);
}

struct tp_param {
    char tp[8];
};
static struct tp_param tps[] = { { "tcp" }, { "shm" } };

ParameterizedTestParameters(p2p, sizes)
{
    return cr_make_param_array(struct tp_param, tps, 2);
}

ParameterizedTest(struct tp_param *p, p2p, sizes, .timeout = 60)
{
    static const size_t sizes[] = { 0, 1, 4095, 65536, (3u << 20) + 7 };
    up(p->tp);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        uint8_t *src = malloc(n + 1), *dst = malloc(n + 1);
        cfx_test_fill(src, n, 40 + i);
        memset(dst, 0, n + 1);
        struct cfx_p2p_req *s, *r;
        /* alternate which side posts first */
        if (i % 2) {
            cr_assert_eq(cfx__p2p_isend(a, &rb, 7, (uint32_t)i, src, n, CFX_MEMTYPE_HOST, &s), CFX_OK);
            cr_assert_eq(cfx__p2p_irecv(b, &ra, 7, (uint32_t)i, dst, n, CFX_MEMTYPE_HOST, &r), CFX_OK);
        } else {
            cr_assert_eq(cfx__p2p_irecv(b, &ra, 7, (uint32_t)i, dst, n, CFX_MEMTYPE_HOST, &r), CFX_OK);
            cr_assert_eq(cfx__p2p_isend(a, &rb, 7, (uint32_t)i, src, n, CFX_MEMTYPE_HOST, &s), CFX_OK);
        }
        uint64_t dl = cfx__deadline_ns(10000);
        cr_assert_eq(cfx__p2p_wait(r, dl), CFX_OK, "recv %zu: %s", n, cfx_last_error());
        cr_assert_eq(cfx__p2p_wait(s, dl), CFX_OK, "send %zu: %s", n, cfx_last_error());
        cr_assert_eq(cfx_test_check(dst, n, 40 + i), (size_t)-1, "%zu bytes differ", n);
        cr_assert_eq(dst[n], 0, "wrote past the end");
        cfx__p2p_free(s);
        cfx__p2p_free(r);
        free(src);
        free(dst);
    }
    down();
}

ParameterizedTestParameters(p2p, fifo_and_errors)
{
    return cr_make_param_array(struct tp_param, tps, 2);
}

ParameterizedTest(struct tp_param *p, p2p, fifo_and_errors, .timeout = 60)
{
    up(p->tp);
    enum { N = 6, LEN = 200000 };
    uint8_t *src[N], *dst[N];
    struct cfx_p2p_req *s[N], *r[N];
    for (int i = 0; i < N; i++) {
        src[i] = malloc(LEN);
        dst[i] = calloc(1, LEN);
        cfx_test_fill(src[i], LEN, 100 + (uint64_t)i);
        cr_assert_eq(cfx__p2p_isend(a, &rb, 9, 1, src[i], LEN, CFX_MEMTYPE_HOST, &s[i]), CFX_OK);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(cfx__p2p_irecv(b, &ra, 9, 1, dst[i], LEN, CFX_MEMTYPE_HOST, &r[i]), CFX_OK);
    uint64_t dl = cfx__deadline_ns(10000);
    cr_assert_eq(cfx__p2p_waitall(r, N, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__p2p_waitall(s, N, dl), CFX_OK, "%s", cfx_last_error());
    for (int i = 0; i < N; i++) {
        /* same (peer, channel, tag): matched in posting order */
        cr_assert_eq(cfx_test_check(dst[i], LEN, 100 + (uint64_t)i), (size_t)-1, "message %d", i);
        cfx__p2p_free(s[i]);
        cfx__p2p_free(r[i]);
        free(src[i]);
        free(dst[i]);
    }

    /* sizes disagree (rendezvous): both sides fail with CFX_ERR_INVALID */
    static uint8_t small[CFX_EAGER_LIMIT + 100], big[CFX_EAGER_LIMIT + 200];
    struct cfx_p2p_req *ss, *rr;
    cr_assert_eq(cfx__p2p_isend(a, &rb, 9, 2, big, sizeof(big), CFX_MEMTYPE_HOST, &ss), CFX_OK);
    cr_assert_eq(cfx__p2p_irecv(b, &ra, 9, 2, small, sizeof(small), CFX_MEMTYPE_HOST, &rr), CFX_OK);
    dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__p2p_wait(rr, dl), CFX_ERR_INVALID, "%s", cfx_last_error());
    cr_assert_eq(cfx__p2p_wait(ss, dl), CFX_ERR_INVALID, "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "disagree"), "%s", cfx_last_error());
    cfx__p2p_free(ss);
    cfx__p2p_free(rr);

    /* sizes disagree (eager): the send completed when handed over, the
     * receive fails with CFX_ERR_INVALID */
    cr_assert_eq(cfx__p2p_isend(a, &rb, 9, 5, big, 200, CFX_MEMTYPE_HOST, &ss), CFX_OK);
    cr_assert_eq(cfx__p2p_irecv(b, &ra, 9, 5, small, 100, CFX_MEMTYPE_HOST, &rr), CFX_OK);
    cr_assert_eq(cfx__p2p_wait(ss, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__p2p_wait(rr, dl), CFX_ERR_INVALID, "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "disagree"), "%s", cfx_last_error());
    cfx__p2p_free(ss);
    cfx__p2p_free(rr);

    /* nobody sends: the receive times out by its deadline and says on whom */
    cr_assert_eq(cfx__p2p_irecv(b, &ra, 9, 3, small, sizeof(small), CFX_MEMTYPE_HOST, &rr), CFX_OK);
    uint64_t t0 = cfx__now_ns();
    cr_assert_eq(cfx__p2p_wait(rr, cfx__deadline_ns(300)), CFX_ERR_TIMEOUT);
    uint64_t ms = (cfx__now_ns() - t0) / 1000000;
    cr_assert_geq(ms, 290, "gave up after %llu ms, before its deadline", (unsigned long long)ms);
    char want[32];
    snprintf(want, sizeof(want), "node %u", a->node_id);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cfx__p2p_free(rr); /* withdrawn while pending */

    /* an unmatched (rendezvous) send is withdrawn too, and a later receive
     * does not match it; an eager one is gone once handed over */
    cr_assert_eq(cfx__p2p_isend(a, &rb, 9, 4, big, sizeof(big), CFX_MEMTYPE_HOST, &ss), CFX_OK);
    cfx__p2p_free(ss);
    cr_assert_eq(cfx__p2p_irecv(b, &ra, 9, 4, big, sizeof(big), CFX_MEMTYPE_HOST, &rr), CFX_OK);
    cr_assert_eq(cfx__p2p_wait(rr, cfx__deadline_ns(300)), CFX_ERR_TIMEOUT);
    cfx__p2p_free(rr);
    down();
}

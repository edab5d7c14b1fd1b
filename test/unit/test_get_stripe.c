/*
 * Striped gets (get_stripe.c): a getter of a large object with several
 * complete holders pulls disjoint blocks of chunks from all of them, a slow
 * holder serves fewer blocks than the fast ones, a holder that dies or
 * stalls mid-stripe gives its block back to the others, CFX_GET_SOURCES=1 and
 * small objects take one source.  One process: an embedded coordinator and
 * a context per node.  Bytes served per node are read from
 * cfx_context_stats(); every get is checked byte for byte.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client_int.h"
#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "intr_probe.h"
#include "testutil.h"

#define CHUNK   65536u
#define NCHUNKS 128u
#define SIZE    ((size_t)NCHUNKS * CHUNK) /* 8 MiB: striped by default */
#define SEED    23

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    unsetenv("CFX_GET_SOURCES");
    unsetenv("CFX_UPLOAD_RATE");
    unsetenv("CFX_XFER_TEST_STALL");
    cfx_test_coord_down(&co);
}

TestSuite(get_stripe, .init = setup, .fini = teardown, .timeout = 120);

/* A context over @p tps; @p rate paces its uploads (bytes/s, 0: not). */
static struct cfx_context *join(const char *tps, const char *rate)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr,
        .token = co.token,
        .timeout_ms = 20000,
        .transports = tps,
    };
    struct cfx_context *ctx = NULL;
    if (rate)
        setenv("CFX_UPLOAD_RATE", rate, 1);
    int rc = cfx_context_create(&p, &ctx);
    unsetenv("CFX_UPLOAD_RATE");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    return ctx;
}

static uint64_t sent(struct cfx_context *c)
{
    struct cfx_context_stats st;
    cr_assert_eq(cfx_context_stats(c, &st), CFX_OK);
    return st.bytes_sent;
}

/* Get @p id on @p c and check every byte (NO_KEEP: the buffer is ours
 * again when the get returns). */
static void get_checked(struct cfx_context *c, const struct cfx_object_id *id, size_t size)
{
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = CFX_OBJ_FLAG_NO_KEEP };
    uint8_t *buf = malloc(size);
    cr_assert(buf);
    memset(buf, 0xA5, size);
    size_t got = 0;
    int rc = cfx_get(c, id, buf, size, &got, &gp);
    cr_assert_eq(rc, CFX_OK, "get on node %u: %s (%s)", cfx_context_node_id(c), cfx_errname(rc),
                 cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, SEED), (size_t)-1, "node %u: wrong bytes",
                 cfx_context_node_id(c));
    free(buf);
}

/* Wait until the directory lists @p n complete holders of @p id, none of
 * them uploading (the getters' completions are sent in the background). */
static void wait_holders(struct cfx_context *c, const struct cfx_object_id *id, unsigned n)
{
    uint64_t dl = cfx__deadline_ns(10000);
    for (;;) {
        struct cfx_ctl_obj_rec *recs = NULL;
        size_t nrec = 0;
        unsigned complete = 0, busy = 0;
        cr_assert_eq(cfx__ctl_objects(c->ctl, &recs, &nrec, cfx__deadline_ns(2000)), CFX_OK,
                     "%s", cfx_last_error());
        for (size_t i = 0; i < nrec; i++) {
            if (memcmp(recs[i].id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
                continue;
            for (uint32_t h = 0; h < recs[i].nholders && h < 16; h++) {
                complete += recs[i].holders[h].complete;
                busy += recs[i].holders[h].uploads;
            }
        }
        free(recs);
        if (complete >= n && !busy)
            return;
        cr_assert(cfx__now_ns() < dl, "the directory lists %u complete holders (%u uploads), "
                  "not %u", complete, busy, n);
        /* the directory announces no change of its listing: ask again */
        usleep(10000);
    }
}

/* holders[0] puts an object of @p size; the others get it one after the
 * other, so that all are complete holders.  Returns the put's buffer (it
 * must outlive the put: the caller frees it after the holders go). */
static uint8_t *replicate(struct cfx_context **holders, unsigned n, struct cfx_object_id *id,
                          size_t size)
{
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    uint8_t *src = malloc(size);
    cr_assert(src);
    cfx_test_fill(src, size, SEED);
    cfx_object_id_generate(holders[0], id);
    cr_assert_eq(cfx_put(holders[0], id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    for (unsigned i = 1; i < n; i++) {
        /* into the arena: the copy stays the holder's (a plain get's copy
         * lives in the caller's buffer) */
        void *copy = NULL;
        size_t got = 0;
        int rc = cfx_get_alloc(holders[i], id, &copy, &got, NULL);
        cr_assert_eq(rc, CFX_OK, "replica on node %u: %s (%s)", cfx_context_node_id(holders[i]),
                     cfx_errname(rc), cfx_last_error());
        cr_assert_eq(got, size);
        cr_assert_eq(cfx_test_check(copy, size, SEED), (size_t)-1, "node %u: wrong bytes",
                     cfx_context_node_id(holders[i]));
    }
    wait_holders(holders[0], id, n);
    return src;
}

static void destroy_all(struct cfx_context **c, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        cfx_context_destroy(c[i]);
}

/* Three complete holders: the get pulls from all three, and the blocks
 * they served add up to the object. */
static void three_holders(const char *tps)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;
    uint64_t before[3], total = 0;

    for (unsigned i = 0; i < 3; i++)
        h[i] = join(tps, NULL);
    g = join(tps, NULL);
    uint8_t *src = replicate(h, 3, &id, SIZE);
    for (unsigned i = 0; i < 3; i++)
        before[i] = sent(h[i]);
    get_checked(g, &id, SIZE);
    for (unsigned i = 0; i < 3; i++) {
        uint64_t d = sent(h[i]) - before[i];
        cr_expect_gt(d, 0, "holder %u (node %u) served nothing", i, cfx_context_node_id(h[i]));
        cr_expect_eq(d % CHUNK, 0);
        total += d;
    }
    /* at least the object; more only if a block starved for STRIPE_STALL_MS
     * on a loaded host was taken over and its first chunks sent twice */
    cr_expect_geq(total, SIZE, "the holders served %llu bytes of %zu",
                  (unsigned long long)total, SIZE);
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

Test(get_stripe, three_holders_tcp)
{
    three_holders("tcp");
}

Test(get_stripe, three_holders_shm)
{
    three_holders("shm");
}

/* Three complete holders of an object, h[1] and h[2] stalling mid-block
 * (test hook CFX_XFER_TEST_STALL: alive, their uploads stop after chunk 2),
 * and a getter *@p g.  Returns the put's buffer. */
static uint8_t *stalled_three(struct cfx_context **h, struct cfx_context **g,
                              struct cfx_object_id *id)
{
    h[0] = join("tcp", NULL);
    setenv("CFX_XFER_TEST_STALL", "2", 1);
    setenv("CFX_GET_SOURCES", "1", 1); /* their own copies come from h[0] (lowest id) */
    h[1] = join("tcp", NULL);
    h[2] = join("tcp", NULL);
    unsetenv("CFX_XFER_TEST_STALL");
    unsetenv("CFX_GET_SOURCES");
    *g = join("tcp", NULL);
    return replicate(h, 3, id, SIZE);
}

/* Two holders that stall mid-block (test hook CFX_XFER_TEST_STALL: alive,
 * their uploads stop): once the third, live one has no block left to take,
 * each stalled block goes to it (STRIPE_STALL_MS), and the get completes
 * byte for byte long before its deadline would have ended it. */
Test(get_stripe, stalled_holders_lose_their_blocks)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;

    uint8_t *src = stalled_three(h, &g, &id);
    uint64_t before = sent(h[0]);
    get_checked(g, &id, SIZE); /* the context's 20 s deadline */
    cr_expect_geq(sent(h[0]) - before, SIZE - 2 * 4 * CHUNK,
                  "the live holder served %llu bytes: the stalled blocks stayed where they were",
                  (unsigned long long)(sent(h[0]) - before));
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

/* Every source stalled: no idle one to take their blocks, so the get ends
 * at its deadline with CFX_ERR_TIMEOUT naming the nodes whose blocks are
 * out.  The stalled holders got their copies from h[0], which then left. */
Test(get_stripe, all_holders_stalled_end_at_the_deadline)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;

    uint8_t *src = stalled_three(h, &g, &id);
    cfx_context_destroy(h[0]);
    wait_holders(g, &id, 2);

    uint8_t *buf = malloc(SIZE);
    cr_assert(buf);
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT | CFX_OBJ_PARAM_FLAGS,
                                 .timeout_ms = 1000,
                                 .flags = CFX_OBJ_FLAG_NO_KEEP };
    uint64_t t0 = cfx__now_ns();
    int rc = cfx_get(g, &id, buf, SIZE, NULL, &gp);
    uint64_t ms = (cfx__now_ns() - t0) / 1000000;
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s (%s)", cfx_errname(rc), cfx_last_error());
    char want[2][32];
    for (int i = 0; i < 2; i++)
        snprintf(want[i], sizeof(want[i]), "%u", cfx_context_node_id(h[1 + i]));
    cr_expect(strstr(cfx_last_error(), "waiting for node") &&
              (strstr(cfx_last_error(), want[0]) || strstr(cfx_last_error(), want[1])),
              "the error does not name a stalled holder: %s", cfx_last_error());
    cr_expect_leq(ms, 1000 + 5000, "returned %llu ms after it began", (unsigned long long)ms);
    free(buf);
    cfx_context_destroy(g);
    destroy_all(h + 1, 2);
    free(src);
}

/* Blocks go to whichever source finished its last.  A holder paced to
 * 1 MB/s next to two unpaced ones serves fewer bytes than an even split
 * would give it, and fewer than the faster of the others: one block of 10
 * chunks takes it 0.65 s, in which the unpaced two move the other 118
 * unless they run below 12 MB/s together.  (Not fewer than each of them: on
 * a loaded machine one starved for a while may serve only its first block
 * too.) */
Test(get_stripe, slow_holder_serves_less)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;
    uint64_t before[3], d[3];

    h[0] = join("tcp", NULL);
    h[1] = join("tcp", NULL);
    h[2] = join("tcp", "1000000");
    g = join("tcp", NULL);
    uint8_t *src = replicate(h, 3, &id, SIZE);
    for (unsigned i = 0; i < 3; i++)
        before[i] = sent(h[i]);
    get_checked(g, &id, SIZE);
    for (unsigned i = 0; i < 3; i++)
        d[i] = sent(h[i]) - before[i];
    cr_expect_geq(d[0] + d[1] + d[2], SIZE); /* more after a starved block's takeover */
    cr_expect_gt(d[2], 0, "the slow holder got no block");
    cr_expect_lt(d[2], (uint64_t)(NCHUNKS / 3) * CHUNK,
                 "slow holder served %llu bytes, an even split's %llu or more",
                 (unsigned long long)d[2], (unsigned long long)(NCHUNKS / 3) * CHUNK);
    cr_expect_lt(d[2], CFX_MAX(d[0], d[1]), "slow holder served %llu bytes, fast ones %llu, %llu",
                 (unsigned long long)d[2], (unsigned long long)d[0], (unsigned long long)d[1]);
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

struct bg_get {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    uint8_t *buf;
    int rc;
    char err[256];
};

static void *bg_main(void *arg)
{
    struct bg_get *b = arg;
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = CFX_OBJ_FLAG_NO_KEEP };
    b->rc = cfx_get(b->ctx, b->id, b->buf, SIZE, NULL, &gp);
    snprintf(b->err, sizeof(b->err), "%s", cfx_last_error());
    return NULL;
}

/* Start @p c's get of @p id on a thread of its own, into a buffer of 0xA5. */
static void bg_start(struct bg_get *b, struct cfx_context *c, const struct cfx_object_id *id)
{
    b->ctx = c;
    b->id = id;
    b->buf = malloc(SIZE);
    cr_assert(b->buf);
    memset(b->buf, 0xA5, SIZE);
    cr_assert_eq(pthread_create(&b->thr, NULL, bg_main, b), 0);
}

/* The get ends with CFX_OK and every byte right. */
static void bg_ok(struct bg_get *b)
{
    pthread_join(b->thr, NULL);
    cr_assert_eq(b->rc, CFX_OK, "%s (%s)", cfx_errname(b->rc), b->err);
    cr_assert_eq(cfx_test_check(b->buf, SIZE, SEED), (size_t)-1, "wrong bytes");
    free(b->buf);
}

/* Until @p want of the @p n holders @p h have sent @p bytes since @p before
 * (*serving[i] says which), at most 10 s.  Their byte counters signal
 * nothing, so they are read every 2 ms.  Returns how many have. */
static int wait_serving(struct cfx_context **h, const uint64_t *before, int n, uint64_t bytes,
                        int want, bool *serving)
{
    int got = 0;
    for (uint64_t dl = cfx__deadline_ns(10000); cfx__now_ns() < dl;) {
        got = 0;
        for (int i = 0; i < n; i++)
            got += serving[i] = sent(h[i]) - before[i] >= bytes;
        if (got >= want)
            break;
        usleep(2000);
    }
    return got;
}

/* A slow holder destroyed while it serves its block: the others take the
 * block over and the get completes byte for byte. */
Test(get_stripe, holder_dies_mid_stripe)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;
    struct bg_get b = { 0 };

    h[0] = join("tcp", "8000000");
    h[1] = join("tcp", "8000000");
    h[2] = join("tcp", "2000000");
    g = join("tcp", NULL);
    uint8_t *src = replicate(h, 3, &id, SIZE);
    uint64_t before = sent(h[2]);

    bg_start(&b, g, &id);
    /* until the slow holder is inside its block (a few chunks out) */
    bool serving = false;
    cr_assert_eq(wait_serving(&h[2], &before, 1, 2 * CHUNK, 1, &serving), 1,
                 "the slow holder never served");
    cfx_context_destroy(h[2]);
    bg_ok(&b);
    struct cfx_context_stats st;
    cr_assert_eq(cfx_context_stats(g, &st), CFX_OK);
    cr_expect_eq(st.source_failovers, 0, "the stripe's survivors finished it, no failover");
    cfx_context_destroy(g);
    destroy_all(h, 2);
    free(src);
}

/* Every source of a striped get dies mid-stripe: the get falls back to the
 * one holder left, which sends from the first chunk missing on, the chunks
 * the stripes landed beyond it again.  Each of those writes took a credit
 * and must be owed back: only new chunks were, so with more of them than
 * the window the source ran dry and the get waited out its deadline with
 * the holder alive ("timed out ... with 35 of 64 chunks").
 *
 * Every holder stalls after the first 2 chunks of each upload (test hook),
 * so the stripe cannot finish before its sources are gone, however slowly
 * they go (an orderly destroy drains its uploads for up to a second): the
 * three sources land chunks 0-1, 10-11 and 20-21 of their blocks and stop.
 * The fourth holder is resumed; the three are destroyed; the fourth re-sends
 * 10-11 and 20-21 from chunk 2 on, as many as the 4-chunk window. */
Test(get_stripe, failover_after_every_stripe_source_died)
{
    struct cfx_context *h[4], *g;
    struct cfx_object_id id;
    struct bg_get b = { 0 };

    for (int i = 0; i < 4; i++)
        h[i] = join("tcp", NULL);
    setenv("CFX_WINDOW", "256K", 1); /* 4 chunks: the re-sent ones fill it */
    setenv("CFX_GET_SOURCES", "3", 1); /* the fourth holder is the one left */
    g = join("tcp", NULL);
    unsetenv("CFX_WINDOW");
    unsetenv("CFX_GET_SOURCES");
    uint8_t *src = replicate(h, 4, &id, SIZE);
    uint64_t before[4];
    for (int i = 0; i < 4; i++) {
        before[i] = sent(h[i]);
        cfx__xfer_test_stall(h[i], 2);
    }

    bg_start(&b, g, &id);
    /* until three holders served the 2 chunks of their blocks */
    bool serving[4] = { false };
    int n = wait_serving(h, before, 4, 2 * CHUNK, 3, serving);
    cr_assert_eq(n, 3, "%d holders served their stripes", n);
    for (int i = 0; i < 4; i++)
        if (!serving[i])
            cfx__xfer_test_resume(h[i]);
    for (int i = 0; i < 4; i++)
        if (serving[i]) {
            cr_expect_eq(sent(h[i]) - before[i], 2 * CHUNK, "a stalled holder sent more");
            cfx_context_destroy(h[i]);
            h[i] = NULL;
        }
    bg_ok(&b);
    struct cfx_context_stats st;
    cr_assert_eq(cfx_context_stats(g, &st), CFX_OK);
    cr_assert_geq(st.source_failovers, 1, "the get did not fall back to the last holder");
    cfx_context_destroy(g);
    for (int i = 0; i < 4; i++)
        if (h[i])
            cfx_context_destroy(h[i]);
    free(src);
}

/* CFX_GET_SOURCES=1: one holder serves the whole object. */
Test(get_stripe, one_source_when_off)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;
    uint64_t before[3];
    unsigned serving = 0;

    for (unsigned i = 0; i < 3; i++)
        h[i] = join("tcp", NULL);
    setenv("CFX_GET_SOURCES", "1", 1);
    g = join("tcp", NULL);
    unsetenv("CFX_GET_SOURCES");
    uint8_t *src = replicate(h, 3, &id, SIZE);
    for (unsigned i = 0; i < 3; i++)
        before[i] = sent(h[i]);
    get_checked(g, &id, SIZE);
    for (unsigned i = 0; i < 3; i++) {
        uint64_t d = sent(h[i]) - before[i];
        cr_expect(d == 0 || d == SIZE, "holder %u served %llu bytes", i, (unsigned long long)d);
        serving += d != 0;
    }
    cr_expect_eq(serving, 1);
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

/* A small object (four chunks) is not striped. */
Test(get_stripe, small_object_one_source)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;
    uint64_t before[3];
    unsigned serving = 0;
    const size_t size = 4 * CHUNK;

    for (unsigned i = 0; i < 3; i++)
        h[i] = join("tcp", NULL);
    g = join("tcp", NULL);
    uint8_t *src = replicate(h, 3, &id, size);
    for (unsigned i = 0; i < 3; i++)
        before[i] = sent(h[i]);
    get_checked(g, &id, size);
    for (unsigned i = 0; i < 3; i++)
        serving += sent(h[i]) != before[i];
    cr_expect_eq(serving, 1);
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

/* A striped get whose sources all stalled mid-block, interrupted on its
 * thread: it ends CFX_ERR_CANCELED saying so (it waited for its deadline,
 * the check never run), and nothing lands in its buffer once it returned. */
Test(get_stripe, interrupted_striped_get_is_canceled)
{
    struct cfx_context *h[3], *g;
    struct cfx_object_id id;

    for (unsigned i = 0; i < 3; i++)
        h[i] = join("tcp", NULL);
    g = join("tcp", NULL);
    uint8_t *src = replicate(h, 3, &id, SIZE);
    for (unsigned i = 0; i < 3; i++)
        cfx__xfer_test_stall(h[i], 2);

    uint8_t *buf = malloc(SIZE);
    cr_assert(buf);
    struct intr_probe p = { .ctx = g, .id = &id };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT | CFX_OBJ_PARAM_FLAGS,
                                 .timeout_ms = 10000,
                                 .flags = CFX_OBJ_FLAG_NO_KEEP };
    cfx_set_interrupt_check(intr_check, &p);
    int rc = cfx_get(g, &id, buf, SIZE, NULL, &gp);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());
    cr_assert_geq(p.calls, 1);
    memset(buf, 0x5A, SIZE); /* the caller's again */

    for (unsigned i = 0; i < 3; i++)
        cfx__xfer_test_resume(h[i]);
    get_checked(g, &id, SIZE);
    for (size_t i = 0; i < SIZE; i++)
        cr_assert_eq(buf[i], 0x5A, "the interrupted get wrote byte %zu after it returned", i);
    free(buf);
    cfx_context_destroy(g);
    destroy_all(h, 3);
    free(src);
}

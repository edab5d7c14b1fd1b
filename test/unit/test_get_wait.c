/*
 * GET_WAIT: a partial holder asked for an object before its entry exists
 * keeps the request and serves it once the entry comes, or answers
 * NOT_FOUND after its bound and the getter fails over.  (Split from
 * test_get.c.)
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define CHUNK   4096u
#define NCHUNKS 64u

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];

static void teardown(void)
{
    cfx__coord_stop(coord);
    coord = NULL;
}

/*
 * A getter the directory sends to a partial holder that has the
 * directory's answer but not yet its entry in the store: the holder keeps
 * the request (GET_WAIT) and serves it from the entry once it exists, so
 * the getter pulls from the partial holder with no failover to the putter
 * (which would then feed two getters at half its rate each).  A holder
 * whose entry never comes answers NOT_FOUND after its bound and the getter
 * fails over.  The coordinator here gives every holder one upload
 * (fan-out 1), so the second getter is sent to the first.
 */
static void setup_chain(void)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = 0, .token = token,
                                  .fanout = 1 };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "coordinator: %s", cfx_last_error());
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
}

TestSuite(get_wait, .init = setup_chain, .fini = teardown, .timeout = 60);

struct bg_get {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    uint8_t *buf;
    size_t size;
    int rc;
    char err[256];
    atomic_bool done;
};

static void *bg_get_main(void *arg)
{
    struct bg_get *g = arg;
    g->rc = cfx_get(g->ctx, g->id, g->buf, g->size, NULL, NULL);
    snprintf(g->err, sizeof(g->err), "%s", cfx_last_error());
    atomic_store(&g->done, true);
    return NULL;
}

static void bg_start(struct bg_get *g, struct cfx_context *ctx, const struct cfx_object_id *id,
                     size_t size)
{
    g->ctx = ctx;
    g->id = id;
    g->size = size;
    g->buf = malloc(size);
    cr_assert(g->buf);
    memset(g->buf, 0xA5, size);
    atomic_init(&g->done, false);
    cr_assert_eq(pthread_create(&g->thr, NULL, bg_get_main, g), 0);
}

static void bg_check(struct bg_get *g, const char *who)
{
    pthread_join(g->thr, NULL);
    cr_assert_eq(g->rc, CFX_OK, "%s: %s (%s)", who, cfx_errname(g->rc), g->err);
    cr_assert_eq(cfx_test_check(g->buf, g->size, 11), (size_t)-1, "%s: wrong bytes", who);
    free(g->buf);
}

/* Hold @p b's get before its store entry; true once it is held there. */
static bool hold_entry(struct cfx_context *b)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&b->lock);
    while (!b->test_entry_held && cfx__obj_wait(b, dl))
        ;
    bool held = b->test_entry_held;
    pthread_mutex_unlock(&b->lock);
    return held;
}

static void release_entry(struct cfx_context *b)
{
    pthread_mutex_lock(&b->lock);
    b->test_hold_entry = false;
    pthread_cond_broadcast(&b->obj_cond);
    pthread_mutex_unlock(&b->lock);
}

/* Until @p b has a request waiting, or @p d's get ended without one. */
static bool request_waits(struct cfx_context *b, struct bg_get *d)
{
    uint64_t dl = cfx__deadline_ns(10000);
    bool waits = false;
    while (!waits && !atomic_load(&d->done) && cfx__now_ns() < dl) {
        pthread_mutex_lock(&b->lock);
        waits = !cfx_list_empty(&b->waiting_gets);
        if (!waits)
            cfx__obj_wait(b, cfx__deadline_ns(20)); /* the queue has no wake-up of its own */
        pthread_mutex_unlock(&b->lock);
    }
    return waits;
}

/* The putter's buffer stays the object (cfx_put registers it): freed by the caller. */
static uint8_t *put_and_hold(const char *tps, struct cfx_context **a, struct cfx_context **b,
                             struct cfx_context **d, struct cfx_object_id *id, size_t size)
{
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    uint8_t *src = malloc(size);
    cr_assert(src);
    cr_assert_eq(cfx_test_join(coord_addr, token, tps, NULL, 5000, a), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_test_join(coord_addr, token, tps, NULL, 5000, b), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_test_join(coord_addr, token, tps, NULL, 5000, d), CFX_OK, "%s",
                 cfx_last_error());
    cfx_object_id_generate(*a, id);
    cfx_test_fill(src, size, 11);
    cr_assert_eq(cfx_put(*a, id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    pthread_mutex_lock(&(*b)->lock);
    (*b)->test_hold_entry = true;
    pthread_mutex_unlock(&(*b)->lock);
    return src;
}

static void partial_holder_without_entry(const char *tps)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b, *d;
    struct cfx_object_id id;
    struct bg_get gb, gd;

    uint8_t *src = put_and_hold(tps, &a, &b, &d, &id, size);
    bg_start(&gb, b, &id, size);
    cr_assert(hold_entry(b), "%s: the first getter never reached its entry", tps);
    bg_start(&gd, d, &id, size); /* the directory sends it to b, the newest holder */
    bool waited = request_waits(b, &gd);
    release_entry(b);
    bg_check(&gb, "first getter");
    bg_check(&gd, "second getter");
    cr_assert(waited, "%s: the partial holder did not keep the request for its entry", tps);

    struct cfx_context_stats sb, sd;
    cr_assert_eq(cfx_context_stats(b, &sb), CFX_OK);
    cr_assert_eq(cfx_context_stats(d, &sd), CFX_OK);
    cr_expect_eq(sd.source_failovers, 0, "%s: the second getter failed over", tps);
    cr_expect_eq(sb.uploads, 1, "%s: the partial holder served %llu uploads", tps,
                 (unsigned long long)sb.uploads);
    cr_expect_eq(sb.uploads_partial, 1, "%s: not served from the partial copy", tps);
    cfx_context_destroy(d);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

Test(get_wait, partial_holder_without_entry_tcp)
{
    partial_holder_without_entry("tcp");
}
Test(get_wait, partial_holder_without_entry_shm)
{
    partial_holder_without_entry("shm");
}

/* The partial holder's entry does not come within the bound: the request
 * ends NOT_FOUND there, the getter fails over to the putter and gets every
 * byte, and nothing stays queued at the holder. */
Test(get_wait, entry_that_never_comes_fails_over)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b, *d;
    struct cfx_object_id id;
    struct bg_get gb, gd;

    uint8_t *src = put_and_hold("tcp", &a, &b, &d, &id, size);
    bg_start(&gb, b, &id, size);
    cr_assert(hold_entry(b), "the first getter never reached its entry");
    bg_start(&gd, d, &id, size);
    bg_check(&gd, "second getter"); /* ends while b is still held */
    release_entry(b);
    bg_check(&gb, "first getter");

    struct cfx_context_stats sd;
    cr_assert_eq(cfx_context_stats(d, &sd), CFX_OK);
    cr_expect_eq(sd.source_failovers, 1, "the second getter did not fail over");
    pthread_mutex_lock(&b->lock);
    bool empty = cfx_list_empty(&b->waiting_gets);
    pthread_mutex_unlock(&b->lock);
    cr_expect(empty, "a request stayed queued at the holder");
    cfx_context_destroy(d);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

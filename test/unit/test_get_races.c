/*
 * A get racing a delete on the object's own id, each race forced in order
 * with the engine's test hooks (no sleeps):
 *  - the putter deletes an inline object between the directory's answer to
 *    a get and the getter keeping its copy: the get keeps the bytes, but no
 *    copy of the withdrawn object stays to answer later gets there, nor to
 *    refuse a put of the id there;
 *  - the putter deletes and puts the id again with another size between the
 *    directory's answer and the getter's request: the get fails as for an
 *    object that went (CFX_ERR_PEER_FAILED), never CFX_ERR_INVALID;
 *  - a cfx_delete on the getter's node while the get's last chunk has landed
 *    but the get has not finished: no copy is held yet (CFX_ERR_NOT_FOUND),
 *    and the get ends with every byte and keeps its copy;
 *  - a get and a delete on the node of a put the directory has not answered
 *    yet (and refuses: the id exists): the put's bytes are no object.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define CHUNK   4096u
#define NCHUNKS 16u
#define WAIT_MS 10000

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    unsetenv("CFX_XFER_TEST_STALL");
    cfx_test_coord_down(&co);
}

TestSuite(get_races, .init = setup, .fini = teardown, .timeout = 60);

static struct cfx_context *join(const char *stall)
{
    struct cfx_context *c;
    if (stall)
        setenv("CFX_XFER_TEST_STALL", stall, 1);
    int rc = cfx_test_join(co.addr, co.token, "tcp", NULL, 5000, &c);
    unsetenv("CFX_XFER_TEST_STALL");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    return c;
}

struct bg {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    uint8_t *buf;
    size_t cap, size;
    int rc;
    char err[256];
};

static void *bg_main(void *arg)
{
    struct bg *g = arg;
    g->rc = cfx_get(g->ctx, g->id, g->buf, g->cap, &g->size, NULL);
    snprintf(g->err, sizeof(g->err), "%s", cfx_last_error());
    return NULL;
}

static void bg_start(struct bg *g, struct cfx_context *c, const struct cfx_object_id *id,
                     size_t cap)
{
    *g = (struct bg){ .ctx = c, .id = id, .cap = cap, .buf = malloc(cap) };
    cr_assert(g->buf);
    memset(g->buf, 0xA5, cap);
    cr_assert_eq(pthread_create(&g->thr, NULL, bg_main, g), 0);
}

/* Hold @p b's gets where the directory has answered and nothing is in the
 * store yet; true once one is held there. */
static bool held(struct cfx_context *b)
{
    uint64_t dl = cfx__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&b->lock);
    while (!b->test_entry_held && cfx__obj_wait(b, dl))
        ;
    bool h = b->test_entry_held;
    pthread_mutex_unlock(&b->lock);
    return h;
}

static void set_hold(struct cfx_context *b, bool on)
{
    pthread_mutex_lock(&b->lock);
    b->test_hold_entry = on;
    b->test_entry_held = false;
    pthread_cond_broadcast(&b->obj_cond);
    pthread_mutex_unlock(&b->lock);
}

/* Start a get of @p id on @p b in @p g, held where the directory answered. */
static void held_get_start(struct cfx_context *b, struct bg *g, const struct cfx_object_id *id,
                           size_t size)
{
    set_hold(b, true);
    bg_start(g, b, id, size);
    cr_assert(held(b), "the get never got the directory's answer");
}

/* Let @p b's held get go and check it got the @p size bytes of @p seed. */
static void bg_end_ok(struct cfx_context *b, struct bg *g, size_t size, int seed)
{
    set_hold(b, false);
    pthread_join(g->thr, NULL);
    cr_assert_eq(g->rc, CFX_OK, "%s (%s)", cfx_errname(g->rc), g->err);
    cr_assert_eq(g->size, size);
    cr_assert_eq(cfx_test_check(g->buf, size, seed), (size_t)-1, "wrong bytes");
}

/* Objects of NCHUNKS chunks kept on the data plane. */
static const struct cfx_obj_params chunked = {
    .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
    .chunk_size = CHUNK,
    .flags = CFX_OBJ_FLAG_NO_INLINE,
};

/* A new id in @p id, put by @p a: @p size bytes of @p seed (the returned
 * buffer, the caller's to free once the object is deleted). */
static uint8_t *put_new(struct cfx_context *a, struct cfx_object_id *id, size_t size, int seed,
                        const struct cfx_obj_params *pp)
{
    uint8_t *src = malloc(size);
    cr_assert(src);
    cfx_object_id_generate(a, id);
    cfx_test_fill(src, size, seed);
    cr_assert_eq(cfx_put(a, id, src, size, pp), CFX_OK, "%s", cfx_last_error());
    return src;
}

Test(get_races, inline_object_deleted_before_its_copy_is_kept)
{
    const size_t size = 1000;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *mine = malloc(size), *out = malloc(size);
    uint8_t *src = put_new(a, &id, size, 21, NULL);

    struct bg g;
    held_get_start(b, &g, &id, size);
    /* every holder, b included, has dropped its copy when this returns */
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    bg_end_ok(b, &g, size, 21);

    /* the withdrawn bytes answer no get on b, and the id is free there */
    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    int rc = cfx_get(b, &id, out, size, NULL, &now);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "b answered a get of the deleted object: %s",
                 cfx_errname(rc));
    cfx_test_fill(mine, size, 22);
    rc = cfx_put(b, &id, mine, size, NULL);
    cr_assert_eq(rc, CFX_OK, "put after the delete: %s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(out);
    free(mine);
    free(src);
}

Test(get_races, object_put_again_with_another_size_before_the_request)
{
    const size_t size = (size_t)NCHUNKS * CHUNK, size2 = size + CHUNK;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *src2 = malloc(size2);
    cfx_test_fill(src2, size2, 32);
    uint8_t *src = put_new(a, &id, size, 31, &chunked);

    struct bg g;
    held_get_start(b, &g, &id, size2);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &id, src2, size2, &chunked), CFX_OK, "%s", cfx_last_error());
    set_hold(b, false); /* the request names the first object's size */
    pthread_join(g.thr, NULL);
    if (g.rc == CFX_OK) /* only ever the object the id names now, whole */
        cr_assert(g.size == size2 && cfx_test_check(g.buf, size2, 32) == (size_t)-1,
                  "the get returned %zu bytes not of the second put", g.size);
    else
        cr_assert_eq(g.rc, CFX_ERR_PEER_FAILED, "%s (%s)", cfx_errname(g.rc), g.err);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(src2);
    free(src);
}

/* A watched get whose callback stops the getter once a prefix landed, so
 * that the rest lands (the progress thread) while the get has not ended. */
struct stopper {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool in, go;
};

static int stop_here(void *arg, const void *buf, size_t from, size_t upto)
{
    (void)buf, (void)from, (void)upto;
    struct stopper *s = arg;
    pthread_mutex_lock(&s->lock);
    s->in = true;
    pthread_cond_broadcast(&s->cond);
    while (!s->go)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return CFX_OK;
}

/* Wait until @p s stopped its getter. */
static void stopper_wait_in(struct stopper *s)
{
    pthread_mutex_lock(&s->lock);
    while (!s->in)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

/* Let @p s's getter go on. */
static void stopper_go(struct stopper *s)
{
    pthread_mutex_lock(&s->lock);
    s->go = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

struct watched {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    struct cfx__get_watch w;
    void *buf;
    size_t size;
    int rc;
};

static void *watched_main(void *arg)
{
    struct watched *g = arg;
    g->rc = cfx__get_alloc_watched(g->ctx, g->id, &g->buf, &g->size, NULL, &g->w);
    return NULL;
}

static bool entry_complete(struct cfx_context *b, const struct cfx_object_id *id)
{
    uint64_t dl = cfx__deadline_ns(WAIT_MS);
    bool done = false;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        struct cfx_obj *o = cfx__store_find(&b->store, id);
        done = o && o->complete;
        if (done || !cfx__obj_wait(b, dl))
            break;
    }
    pthread_mutex_unlock(&b->lock);
    return done;
}

Test(get_races, delete_while_the_get_finishes)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a = join("4"), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *src = put_new(a, &id, size, 41, &chunked);

    struct stopper s = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
    struct watched g = { .ctx = b, .id = &id, .w = { .landed = stop_here, .arg = &s } };
    cr_assert_eq(pthread_create(&g.thr, NULL, watched_main, &g), 0);
    stopper_wait_in(&s); /* the holder stalls after 4 chunks: a prefix is told */
    cfx__xfer_test_resume(a); /* the rest lands while the getter is stopped */
    cr_assert(entry_complete(b, &id), "the rest of the object never landed");

    int rc = cfx_delete(b, &id, NULL);
    stopper_go(&s);
    pthread_join(g.thr, NULL);
    cr_assert_eq(rc, CFX_ERR_NOT_FOUND, "a delete took the copy of a get still running: %s",
                 cfx_errname(rc));
    cr_assert_eq(g.rc, CFX_OK, "%s", cfx_errname(g.rc));
    cr_assert_eq(g.size, size);
    cr_assert_eq(cfx_test_check(g.buf, size, 41), (size_t)-1, "wrong bytes");
    /* the get kept its copy: b's delete of it now finds it */
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_buf_free(b, g.buf);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

struct put_bg {
    pthread_t thr;
    struct cfx_context *c;
    const struct cfx_object_id *id;
    const void *buf;
    size_t size;
    int rc;
};

static void *put_main(void *arg)
{
    struct put_bg *q = arg;
    q->rc = cfx_put(q->c, q->id, q->buf, q->size, NULL);
    return NULL;
}

/* Start @p p's put, held on its node once its entry is in the store and
 * before the directory answers it (put_release() lets it go on). */
static void held_put_start(struct put_bg *p)
{
    struct cfx_context *b = p->c;
    uint64_t dl = cfx__deadline_ns(WAIT_MS);
    pthread_mutex_lock(&b->lock);
    b->test_hold_put = true;
    b->test_put_held = false;
    pthread_mutex_unlock(&b->lock);
    cr_assert_eq(pthread_create(&p->thr, NULL, put_main, p), 0);
    pthread_mutex_lock(&b->lock);
    while (!b->test_put_held && cfx__obj_wait(b, dl))
        ;
    bool put_held = b->test_put_held;
    pthread_mutex_unlock(&b->lock);
    cr_assert(put_held, "the put never reached the directory");
}

static void put_release(struct cfx_context *b)
{
    pthread_mutex_lock(&b->lock);
    b->test_hold_put = false;
    pthread_cond_broadcast(&b->obj_cond);
    pthread_mutex_unlock(&b->lock);
}

/* A put of an id that exists, held before the directory refuses it: until
 * then its bytes are no object, so a get on its node does not return them
 * and a delete there does not take its entry; the put then fails
 * CFX_ERR_EXISTS and the node gets the object the id names. */
Test(get_races, put_refused_by_the_directory_is_never_read)
{
    const size_t size = 3000;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *mine = malloc(size), *out = malloc(size);
    cfx_test_fill(mine, size, 52);
    uint8_t *src = put_new(a, &id, size, 51, NULL);

    struct put_bg p = { .c = b, .id = &id, .buf = mine, .size = size };
    held_put_start(&p);

    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    memset(out, 0xA5, size);
    int grc = cfx_get(b, &id, out, size, NULL, &now);
    int drc = cfx_delete(b, &id, NULL);
    put_release(b);
    pthread_join(p.thr, NULL);
    cr_assert_neq(grc, CFX_OK, "a get returned the bytes of a put not yet taken (%s)",
                  cfx_test_check(out, size, 52) == (size_t)-1 ? "that put's" : "others");
    cr_assert_eq(grc, CFX_ERR_TIMEOUT, "%s", cfx_errname(grc));
    cr_assert_eq(drc, CFX_ERR_NOT_FOUND, "a delete took a put not yet taken: %s",
                 cfx_errname(drc));
    cr_assert_eq(p.rc, CFX_ERR_EXISTS, "%s", cfx_errname(p.rc));

    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, out, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(out, size, 51), (size_t)-1, "not the object the id names");
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(out);
    free(mine);
    free(src);
}

/*
 * The directory keeps one record per node and id, which every get of the id
 * on that node stands on.  Whatever drops it (a get that keeps nothing, a
 * delete on that node) leaves the node's other gets of the id with a copy
 * the directory knows nothing of: nobody tells the node when the object
 * goes, and the copy must not be kept.  Each case ends the same way: once
 * the putter's delete returned, the node answers no get of the id and
 * takes a put of it.
 */
static void assert_id_free_on(struct cfx_context *b, const struct cfx_object_id *id,
                              size_t size, int seed)
{
    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    uint8_t *out = malloc(size), *mine = malloc(size);
    cr_assert(out && mine);
    int rc = cfx_get(b, id, out, size, NULL, &now);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "b answered a get of the deleted object: %s (%s)",
                 cfx_errname(rc), rc == CFX_OK && cfx_test_check(out, size, seed) == (size_t)-1
                                      ? "its bytes" : "other bytes");
    cfx_test_fill(mine, size, seed + 1);
    rc = cfx_put(b, id, mine, size, NULL);
    cr_assert_eq(rc, CFX_OK, "put after the delete: %s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(cfx_delete(b, id, NULL), CFX_OK, "%s", cfx_last_error());
    free(mine);
    free(out);
}

/* A get on b that ends at once (its buffer is too small) beside one whose
 * entry is not in the store yet: its end drops b's record. */
Test(get_races, get_that_keeps_nothing_beside_a_get)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t small[16];
    size_t got = 0;
    uint8_t *src = put_new(a, &id, size, 61, &chunked);

    struct bg g;
    held_get_start(b, &g, &id, size);
    int rc = cfx_get(b, &id, small, sizeof(small), &got, NULL);
    cr_assert_eq(rc, CFX_ERR_TRUNCATED, "%s", cfx_errname(rc));
    cr_assert_eq(got, size);
    bg_end_ok(b, &g, size, 61);

    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    assert_id_free_on(b, &id, size, 61);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(src);
}

/* A delete on b, which holds no copy yet, beside b's get of an inline
 * object: the directory drops b's record, so the get keeps no copy. */
Test(get_races, delete_without_a_copy_beside_a_get)
{
    const size_t size = 1000;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *src = put_new(a, &id, size, 71, NULL);

    struct bg g;
    held_get_start(b, &g, &id, size);
    /* the directory counts b a holder since it answered the get */
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    bg_end_ok(b, &g, size, 71);

    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    assert_id_free_on(b, &id, size, 71);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(src);
}

/* b's get of an id waits for its put, which b then makes and deletes: no
 * withdrawal is told to the putter, yet its get keeps no copy. */
Test(get_races, own_put_deleted_before_its_get_keeps_it)
{
    const size_t size = 1000;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *src = malloc(size);
    cfx_object_id_generate(b, &id);
    cfx_test_fill(src, size, 81);

    struct bg g;
    set_hold(b, true);
    bg_start(&g, b, &id, size);
    /* it asks the directory (and waits there for a put) before b puts it */
    struct cfx_context_stats st = { 0 };
    uint64_t dl = cfx__deadline_ns(WAIT_MS);
    while (cfx_context_stats(b, &st) == CFX_OK && !st.dir_lookups && cfx__now_ns() < dl)
        sched_yield();
    cr_assert_eq(st.dir_lookups, 1, "the get never asked the directory");
    cr_assert_eq(cfx_put(b, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert(held(b), "the get never got the directory's answer");
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    bg_end_ok(b, &g, size, 81);

    assert_id_free_on(b, &id, size, 81);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(src);
}

/* The putter deletes an object whose copy on b is complete but its get has
 * not ended: another get on b does not answer from that copy. */
Test(get_races, copy_withdrawn_before_its_get_ends)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a = join("4"), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *src = put_new(a, &id, size, 91, &chunked);

    struct stopper s = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
    struct watched g = { .ctx = b, .id = &id, .w = { .landed = stop_here, .arg = &s } };
    cr_assert_eq(pthread_create(&g.thr, NULL, watched_main, &g), 0);
    stopper_wait_in(&s);
    cfx__xfer_test_resume(a);
    cr_assert(entry_complete(b, &id), "the rest of the object never landed");
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    uint8_t *out = malloc(size);
    int rc = cfx_get(b, &id, out, size, NULL, &now);
    stopper_go(&s);
    pthread_join(g.thr, NULL);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "b answered a get from a withdrawn copy: %s",
                 cfx_errname(rc));
    cr_assert_eq(g.rc, CFX_OK, "%s", cfx_errname(g.rc));
    cr_assert_eq(g.size, size);
    cr_assert_eq(cfx_test_check(g.buf, size, 91), (size_t)-1, "wrong bytes");
    assert_id_free_on(b, &id, size, 91);
    cfx_buf_free(b, g.buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(out);
    free(src);
}

/* The same from a cached location (no directory record at all): the putter
 * deletes while b's copy from there is complete but its get has not ended. */
Test(get_races, copy_from_a_cached_location_before_its_get_ends)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *out = malloc(size);
    uint8_t *src = put_new(a, &id, size, 95, &chunked);
    /* b learns where it lives, and lets its copy go */
    cr_assert_eq(cfx_get(b, &id, out, size, NULL, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx__xfer_test_stall(a, 4);

    struct stopper s = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
    struct watched g = { .ctx = b, .id = &id, .w = { .landed = stop_here, .arg = &s } };
    cr_assert_eq(pthread_create(&g.thr, NULL, watched_main, &g), 0);
    stopper_wait_in(&s);
    cfx__xfer_test_resume(a);
    cr_assert(entry_complete(b, &id), "the rest of the object never landed");
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    int rc = cfx_get(b, &id, out, size, NULL, &now);
    stopper_go(&s);
    pthread_join(g.thr, NULL);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "b answered a get from a copy of a deleted object: %s",
                 cfx_errname(rc));
    cr_assert_eq(g.rc, CFX_OK, "%s", cfx_errname(g.rc));
    cr_assert_eq(g.size, size);
    cr_assert_eq(cfx_test_check(g.buf, size, 95), (size_t)-1, "wrong bytes");
    struct cfx_context_stats st;
    cr_assert_eq(cfx_context_stats(b, &st), CFX_OK);
    cr_assert_eq(st.loc_hits, 1, "the second get was not from the cached location");
    assert_id_free_on(b, &id, size, 95);
    cfx_buf_free(b, g.buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(out);
    free(src);
}

/*
 * A get that another entry of its id beats to the store waits for that
 * copy and tries again, as often as it takes within its deadline: three
 * threads getting one id with CFX_OBJ_FLAG_NO_KEEP (whose entries leave
 * without a copy) made such a get fail CFX_ERR_BUSY, which cfx_get does not
 * document, after its third round.  Here a put of the id on the getter's
 * node beats it each round, held before the directory refuses it.
 */
Test(get_races, get_beaten_to_its_entry_round_after_round)
{
    const size_t size = CFX_OBJECT_INLINE_MAX + 1000; /* not inline */
    struct cfx_context *a = join(NULL), *b = join(NULL);
    struct cfx_object_id id;
    uint8_t *mine = malloc(size);
    cfx_test_fill(mine, size, 62);
    uint8_t *src = put_new(a, &id, size, 61, NULL);

    struct bg g;
    held_get_start(b, &g, &id, size);
    for (int round = 0; round < 5; round++) {
        struct put_bg p = { .c = b, .id = &id, .buf = mine, .size = size };
        uint64_t dl = cfx__deadline_ns(WAIT_MS);
        held_put_start(&p);
        /* the get goes on into the put's entry, and is held at its next try */
        pthread_mutex_lock(&b->lock);
        uint32_t passes = b->test_entry_passes;
        b->test_hold_entry = false;
        b->test_entry_held = false;
        pthread_cond_broadcast(&b->obj_cond);
        while (b->test_entry_passes == passes && cfx__obj_wait(b, dl))
            ;
        cr_assert_neq(b->test_entry_passes, passes, "round %d: the get stayed held", round);
        b->test_hold_entry = true;
        /* the directory refuses the put: its entry goes, the get tries again */
        b->test_hold_put = false;
        pthread_cond_broadcast(&b->obj_cond);
        pthread_mutex_unlock(&b->lock);
        pthread_join(p.thr, NULL);
        cr_assert_eq(p.rc, CFX_ERR_EXISTS, "round %d: %s", round, cfx_errname(p.rc));
        cr_assert(held(b), "round %d: the get did not try again (%s)", round,
                  cfx_errname(g.rc));
    }
    bg_end_ok(b, &g, size, 61);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(g.buf);
    free(mine);
    free(src);
}

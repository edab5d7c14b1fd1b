/*
 * A get's deadline holds even when its holder stalls mid-transfer: the
 * getter withdraws the window at the deadline and returns CFX_ERR_TIMEOUT
 * naming the holder, without waiting for the holder's answer, and nothing
 * lands in the caller's buffer after that.  One process: an embedded
 * coordinator, a holder started with the test hook CFX_XFER_TEST_STALL and
 * a getter.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define CHUNK      4096u
#define NCHUNKS    64u
#define STALL_AT   4u /* the holder sends chunks [0, STALL_AT) and stalls */
#define TIMEOUT_MS 1000 /* long enough for the lookup, the connection and the first chunks */
#define SLACK_MS   700 /* scheduling on a loaded machine; the old wait was 1000 past */

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

TestSuite(get, .init = setup, .fini = teardown, .timeout = 60);

static void join(const char *tps, bool stall, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr,
        .token = co.token,
        .timeout_ms = 5000,
        .transports = tps,
    };
    char at[16];
    snprintf(at, sizeof(at), "%u", STALL_AT);
    if (stall)
        setenv("CFX_XFER_TEST_STALL", at, 1);
    int rc = cfx_context_create(&p, out);
    unsetenv("CFX_XFER_TEST_STALL");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
}

/* The holder @p a puts an object of NCHUNKS chunks; the getter @p b gets it
 * into @p buf and times out on the stall.  Checks the status, the holder
 * named, and that the get returned by its deadline (plus slack). */
static void stalled_get(struct cfx_context *a, struct cfx_context *b, struct cfx_object_id *id,
                        uint8_t *src, uint8_t *buf)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = TIMEOUT_MS };

    /* b connects to a first, with an object the stall does not reach (one
     * chunk): the timed get below then needs no connection set-up inside
     * its deadline, which a loaded machine can take most of */
    struct cfx_object_id warm;
    struct cfx_obj_params wp = pp;
    wp.chunk_size = 0;
    wp.field_mask &= ~CFX_OBJ_PARAM_CHUNK_SIZE;
    cfx_object_id_generate(a, &warm);
    cfx_test_fill(src, CHUNK, 8);
    cr_assert_eq(cfx_put(a, &warm, src, CHUNK, &wp), CFX_OK, "%s", cfx_last_error());
    struct cfx_obj_params nk = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = CFX_OBJ_FLAG_NO_KEEP };
    cr_assert_eq(cfx_get(b, &warm, buf, CHUNK, NULL, &nk), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(buf, CHUNK, 8), (size_t)-1);
    cr_assert_eq(cfx_delete(a, &warm, NULL), CFX_OK, "%s", cfx_last_error());

    cfx_object_id_generate(a, id);
    cfx_test_fill(src, size, 7);
    cr_assert_eq(cfx_put(a, id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    memset(buf, 0xA5, size);

    uint64_t t0 = cfx__now_ns();
    int rc = cfx_get(b, id, buf, size, NULL, &gp);
    uint64_t ms = (cfx__now_ns() - t0) / 1000000;
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s (%s)", cfx_errname(rc), cfx_last_error());
    char holder[32];
    snprintf(holder, sizeof(holder), "from node %u ", cfx_context_node_id(a));
    cr_expect(strstr(cfx_last_error(), holder), "the error does not name the holder: %s",
              cfx_last_error());
    cr_expect_leq(ms, TIMEOUT_MS + SLACK_MS,
                  "the get returned %llu ms after it began "
                  "(deadline %d ms)",
                  (unsigned long long)ms, TIMEOUT_MS);
}

/* Transfers @p c left behind at a deadline, its source yet to answer
 * (c->lock held). */
static unsigned n_abandoned(struct cfx_context *c)
{
    unsigned n = 0;
    for (unsigned s = 0; s < CFX_XFER_SLOTS; s++)
        n += c->slots[s] && c->slots[s]->abandoned;
    return n;
}

static bool has_abandoned(struct cfx_context *c)
{
    return n_abandoned(c) > 0;
}

/* Wait (on the getter's object condition) until @p b holds no transfer
 * left behind at a deadline: the holder's late answer reached it (its
 * CANCEL_ACK, after the writes it had on their way).  Returns whether it
 * ended. */
static bool wait_abandoned_gone(struct cfx_context *b)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&b->lock);
    while (has_abandoned(b) && cfx__obj_wait(b, dl))
        ;
    bool gone = !has_abandoned(b);
    pthread_mutex_unlock(&b->lock);
    return gone;
}

/* The holder resumes after the getter left: its late writes are dropped
 * (the grant was withdrawn at the deadline) without failing the
 * connection, which a healthy holder's in-flight writes are not a reason
 * to; the caller's buffer keeps the bytes it had when cfx_get() returned,
 * and a later get of the object from the same holder works, over the same
 * connection. */
static void stalled_holder_resumes_late(const char *tps)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint8_t *src = malloc(size), *buf = malloc(size), *seen = malloc(size);
    cr_assert(src && buf && seen);

    join(tps, true, &a);
    join(tps, false, &b);
    stalled_get(a, b, &id, src, buf);
    memcpy(seen, buf, size);

    struct cfx_context_stats before, after;
    cr_assert_eq(cfx_context_stats(b, &before), CFX_OK);
    pthread_mutex_lock(&b->lock);
    cr_assert(has_abandoned(b), "%s: no transfer was left behind at the deadline", tps);
    uint64_t gen = b->conn_gen;
    pthread_mutex_unlock(&b->lock);
    cfx__xfer_test_resume(a); /* the rest of the chunks go out now */
    cr_assert(wait_abandoned_gone(b), "%s: the holder never answered the cancel", tps);
    cr_assert_eq(cfx_context_stats(b, &after), CFX_OK);
    cr_expect_gt(after.writes_late, before.writes_late,
                 "%s: the holder's late writes were not dropped as late", tps);
    cr_expect_eq(after.writes_refused, before.writes_refused,
                 "%s: the holder's late writes were refused", tps);
    pthread_mutex_lock(&b->lock);
    cr_expect_eq(b->conn_gen, gen, "%s: the late writes failed the connection", tps);
    pthread_mutex_unlock(&b->lock);
    cr_assert_eq(memcmp(buf, seen, size), 0,
                 "%s: the buffer was written after the get "
                 "returned",
                 tps);

    /* the engine is sound afterwards: the same holder serves the object */
    memset(buf, 0, size);
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, buf, size, &got, NULL), CFX_OK, "%s: %s", tps, cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, 7), (size_t)-1, "%s: wrong bytes", tps);

    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
    free(seen);
}

Test(get, stalled_holder_tcp)
{
    stalled_holder_resumes_late("tcp");
}
Test(get, stalled_holder_shm)
{
    stalled_holder_resumes_late("shm");
}

/* A stalled holder *@p a over tcp, a getter *@p b whose get of the
 * holder's object timed out (stalled_get), with its buffers. */
static void stalled_pair(struct cfx_context **a, struct cfx_context **b, struct cfx_object_id *id,
                         uint8_t **src, uint8_t **buf)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    *src = malloc(size);
    *buf = malloc(size);
    cr_assert(*src && *buf);
    join("tcp", true, a);
    join("tcp", false, b);
    stalled_get(*a, *b, id, *src, *buf);
}

/* The holder never answers: the transfer the getter left behind is freed
 * with the context (ASan's leak check), and the getter's buffer is free
 * to go at once. */
Test(get, stalled_holder_never_answers)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint8_t *src, *buf;
    stalled_pair(&a, &b, &id, &src, &buf);
    free(buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

/* A holder that answers no CANCEL holds at most CFX_CONN_ABANDONED_MAX of
 * the getter's slots: a get that finds that many left on the connection
 * closes it (freeing them) and goes on over a new one.  Without the cap
 * each timed-out get kept one of the 4096 slots for as long as the
 * holder stayed connected.  Afterwards the holder resumes and the object
 * comes whole. */
Test(get, unanswered_cancels_are_capped)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    const unsigned gets = CFX_CONN_ABANDONED_MAX + CFX_CONN_ABANDONED_MAX / 2;
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint8_t *src, *buf;
    stalled_pair(&a, &b, &id, &src, &buf); /* connects; the holder's location is known now */
    /* each get lands the first chunks and is given up at its deadline,
     * its CANCEL dropped by the stalled holder */
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 100 };
    unsigned most = 0;
    bool capped = false;
    for (unsigned i = 0; i < gets; i++) {
        int rc = cfx_get(b, &id, buf, size, NULL, &gp);
        cr_assert_eq(rc, CFX_ERR_TIMEOUT, "get %u: %s (%s)", i, cfx_errname(rc),
                     cfx_last_error());
        pthread_mutex_lock(&b->lock);
        unsigned n = n_abandoned(b);
        pthread_mutex_unlock(&b->lock);
        capped |= n < most; /* a get closed the connection and freed them */
        most = CFX_MAX(most, n);
        cr_assert_leq(n, CFX_CONN_ABANDONED_MAX, "after get %u the holder holds %u slots", i, n);
    }
    cr_expect(capped, "%u slots held after %u gets, never fewer", most, gets + 1);

    cfx__xfer_test_resume(a);
    memset(buf, 0, size);
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, buf, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, 7), (size_t)-1, "wrong bytes");
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
}

/* cfx_get_alloc's buffer stays the caller's across a cfx_delete() of the
 * object on the same node: a later get must not be handed the same memory
 * (it was, and the first array's bytes changed under it), and the
 * caller's cfx_buf_free() afterwards frees it once.  @p flags: NO_INLINE
 * for a chunked transfer, 0 for a small object that came inline. */
static void alloc_outlives_delete(size_t size, uint32_t flags)
{
    struct cfx_context *a, *b;
    struct cfx_object_id x, y;
    uint8_t *sx = malloc(size), *sy = malloc(size);
    cr_assert(sx && sy);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = flags };

    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_test_fill(sx, size, 31);
    cfx_test_fill(sy, size, 32);
    cfx_object_id_generate(a, &x);
    cfx_object_id_generate(a, &y);
    cr_assert_eq(cfx_put(a, &x, sx, size, &pp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &y, sy, size, &pp), CFX_OK, "%s", cfx_last_error());

    void *px = NULL, *py = NULL, *px2 = NULL;
    size_t got = 0;
    cr_assert_eq(cfx_get_alloc(b, &x, &px, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_delete(b, &x, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get_alloc(b, &y, &py, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(px, py, "the deleted copy's buffer, still the caller's, was handed out again");
    cr_assert_eq(cfx_test_check(px, size, 31), (size_t)-1, "the first buffer changed");
    cr_assert_eq(cfx_test_check(py, size, 32), (size_t)-1, "wrong bytes in the second");
    /* the object is got again into a new buffer; the old one is freed by
     * its owner alone, the new copy's by cfx_buf_free (which withdraws it) */
    cr_assert_eq(cfx_get_alloc(b, &x, &px2, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(px2, px);
    cr_assert_eq(cfx_test_check(px2, size, 31), (size_t)-1);
    cfx_buf_free(b, px);
    cfx_buf_free(b, py);
    cfx_buf_free(b, px2);
    /* freed buffers go back to the arena: a get reuses the memory */
    cr_assert_eq(cfx_get_alloc(b, &y, &py, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(py, size, 32), (size_t)-1);
    cr_assert_eq(cfx_delete(b, &y, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_buf_free(b, py);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(sx);
    free(sy);
}

Test(get, alloc_buffer_outlives_delete_chunked)
{
    alloc_outlives_delete(1u << 20, CFX_OBJ_FLAG_NO_INLINE);
}

Test(get, alloc_buffer_outlives_delete_inline)
{
    alloc_outlives_delete(512, 0);
}

/* cfx_buf_free() of a got buffer with the coordinator gone does not wait
 * out the context's deadline for a reconnection that will not come (the
 * buffer was freed only after it, and Python freed it with the GIL held):
 * the copy goes at once, and the memory is the arena's again. */
Test(get, alloc_buffer_freed_without_a_coordinator)
{
    struct cfx_context *a, *b;
    struct cfx_object_id x;
    const size_t size = 1u << 20;
    uint8_t *src = malloc(size);
    cr_assert(src);
    cfx_test_fill(src, size, 51);
    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_object_id_generate(a, &x);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &x, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    void *got = NULL;
    size_t n = 0;
    cr_assert_eq(cfx_get_alloc(b, &x, &got, &n, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(got, size, 51), (size_t)-1);

    cfx_test_coord_down(&co);
    uint64_t dl = cfx__deadline_ns(5000);
    while (!cfx__ctl_lost_ms(b->ctl) && cfx__now_ns() < dl)
        poll(NULL, 0, 5); /* b has noticed */
    uint64_t t0 = cfx__now_ns();
    cfx_buf_free(b, got);
    double s = (double)(cfx__now_ns() - t0) / 1e9;
    /* the context's deadline is 5000 ms (join): well under it means it did
     * not wait for the reconnection */
    cr_assert_lt(s, 2.5, "cfx_buf_free waited %.1f s for a lost coordinator", s);
    pthread_mutex_lock(&b->lock);
    const struct cfx_obj *o = cfx__store_find(&b->store, &x);
    bool left = !o || o->deleting;
    pthread_mutex_unlock(&b->lock);
    cr_assert(left, "the copy is still served after its buffer was freed");
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

/* A holder that shares no transport with the getter (tcp against shm): the
 * get fails with CFX_ERR_UNSUPPORTED saying so, naming both nodes and the
 * getter's transports (it said only "operation not supported": the detail
 * was the progress thread's). */
Test(get, holder_sharing_no_transport_is_named)
{
    struct cfx_context *a, *b;
    struct cfx_object_id x;
    enum { SZ = 1 << 20 };
    uint8_t *src = malloc(SZ), *dst = malloc(SZ);
    cr_assert(src && dst);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    join("tcp", false, &a);
    join("shm", false, &b);
    cfx_test_fill(src, SZ, 9);
    cfx_object_id_generate(a, &x);
    cr_assert_eq(cfx_put(a, &x, src, SZ, &pp), CFX_OK, "%s", cfx_last_error());
    size_t got = 0;
    int rc = cfx_get(b, &x, dst, SZ, &got, NULL);
    cr_assert_eq(rc, CFX_ERR_UNSUPPORTED, "got %s: %s", cfx_errname(rc), cfx_last_error());
    char want[64];
    snprintf(want, sizeof(want), "from node %u (", cfx_context_node_id(a));
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "shares no transport with this one (ours: shm)"), "%s",
              cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(dst);
}

/*
 * A copy got from a cached location is unknown to the directory, so nobody
 * tells its node when the putter deletes the object.  Such a stale copy
 * must not keep the id from that node's own put: the putter's delete
 * promises the id is free everywhere.  b gets x (recorded: the directory
 * withdraws it with a's delete), a puts x again and b gets it from the
 * location cache (unrecorded), a deletes it; b's put of x succeeds (it
 * failed with CFX_ERR_EXISTS naming b) and a gets b's bytes.  With
 * @p alloc the cached get is a cfx_get_alloc, whose buffer stays the
 * caller's after its copy gives way.
 */
static void stale_cached_copy_then_put(bool alloc)
{
    const size_t size = 100000;
    struct cfx_context *a, *b;
    struct cfx_object_id x;
    uint8_t *s1 = malloc(size), *s2 = malloc(size), *s3 = malloc(size), *buf = malloc(size);
    cr_assert(s1 && s2 && s3 && buf);
    cfx_test_fill(s1, size, 41);
    cfx_test_fill(s2, size, 42);
    cfx_test_fill(s3, size, 43);

    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_object_id_from_name(alloc ? "stale-cached/alloc" : "stale-cached/buf", &x);
    size_t got = 0;
    cr_assert_eq(cfx_put(a, &x, s1, size, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &x, buf, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(a, &x, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &x, s2, size, NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_context_stats st0, st1;
    cfx_context_stats(b, &st0);
    void *abuf = NULL;
    if (alloc)
        cr_assert_eq(cfx_get_alloc(b, &x, &abuf, &got, NULL), CFX_OK, "%s", cfx_last_error());
    else
        cr_assert_eq(cfx_get(b, &x, buf, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_stats(b, &st1);
    cr_assert_eq(st1.loc_hits, st0.loc_hits + 1, "the second get did not use the cached location");
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(alloc ? abuf : buf, size, 42), (size_t)-1, "wrong bytes");

    cr_assert_eq(cfx_delete(a, &x, NULL), CFX_OK, "%s", cfx_last_error());
    int rc = cfx_put(b, &x, s3, size, NULL);
    cr_assert_eq(rc, CFX_OK, "put after the putter's delete: %s (%s)", cfx_errname(rc),
                 cfx_last_error());
    memset(buf, 0, size);
    cr_assert_eq(cfx_get(a, &x, buf, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, 43), (size_t)-1, "a got other bytes than b's put");
    if (alloc) {
        cr_assert_eq(cfx_test_check(abuf, size, 42), (size_t)-1, "the caller's buffer changed");
        cfx_buf_free(b, abuf);
    }
    cr_assert_eq(cfx_delete(b, &x, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(s1);
    free(s2);
    free(s3);
    free(buf);
}

Test(get, stale_cached_copy_gives_way_to_a_put)
{
    stale_cached_copy_then_put(false);
}

Test(get, stale_cached_alloc_copy_gives_way_to_a_put)
{
    stale_cached_copy_then_put(true);
}

/*
 * A holder's own delete of a copy its putter withdrew returns CFX_OK
 * (conflux/object.h), also after a get of the id that failed in between.
 * b gets x, a deletes it (b's copy is withdrawn), b tries a get of x (the
 * location cache sends it to a, which has none; it times out), then deletes
 * x.  That delete gave CFX_ERR_NOT_FOUND ("holds no object"): the failed
 * get's entry took the note of the withdrawn copy when it began.
 */
Test(get, a_failed_get_leaves_a_withdrawn_copys_delete_ok)
{
    const size_t size = 100000;
    struct cfx_context *a, *b;
    struct cfx_object_id x;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    cfx_test_fill(src, size, 44);
    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_object_id_from_name("withdrawn-then-failed-get", &x);
    struct cfx_obj_params np = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &x, src, size, &np), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &x, buf, size, NULL, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(buf, size, 44), (size_t)-1, "wrong bytes");
    cr_assert_eq(cfx_delete(a, &x, NULL), CFX_OK, "%s", cfx_last_error());
    struct cfx_obj_params tp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 300 };
    int rc = cfx_get(b, &x, buf, size, NULL, &tp);
    cr_assert(rc == CFX_ERR_TIMEOUT || rc == CFX_ERR_NOT_FOUND, "a get of a deleted id: %s (%s)",
              cfx_errname(rc), cfx_last_error());
    rc = cfx_delete(b, &x, NULL);
    cr_assert_eq(rc, CFX_OK, "the holder's delete: %s (%s)", cfx_errname(rc), cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
}

/*
 * cfx_request_progress() on a cfx_get_nb() whose holder stalls after
 * STALL_AT chunks: it reports exactly that prefix of the object's size, and
 * those bytes are the object's, the rest of the buffer untouched; once the
 * holder resumes, the whole size.  Before a get has a size it says
 * CFX_ERR_AGAIN; a failed request reports its error; a put reports its size
 * once done; NULL arguments are CFX_ERR_INVALID.
 */
static void wait_progress(struct cfx_request *req, uint64_t want, uint64_t *done, uint64_t *total)
{
    uint64_t dl = cfx__deadline_ns(10000);
    int rc;
    do {
        rc = cfx_request_progress(req, done, total);
        cr_assert(rc == CFX_OK || rc == CFX_ERR_AGAIN, "%s (%s)", cfx_errname(rc),
                  cfx_last_error());
        cr_assert_leq(*done, *total, "%llu bytes done of %llu", (unsigned long long)*done,
                      (unsigned long long)*total);
        if (rc == CFX_OK && *done >= want)
            break;
        cfx_request_test(req); /* drives a pass, as a caller polling would */
        poll(NULL, 0, 5);
    } while (cfx__now_ns() < dl);
}

Test(get, progress_of_a_stalled_get)
{
    const size_t size = (size_t)NCHUNKS * CHUNK, prefix = (size_t)STALL_AT * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id, late, missing;
    struct cfx_request *req, *preq;
    uint64_t done = 1, total = 1;
    uint8_t *src = malloc(size), *buf = malloc(size), *ref = malloc(size);
    cr_assert(src && buf && ref);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 30000 };

    join("tcp", true, &a);
    join("tcp", false, &b);
    cfx_object_id_generate(a, &id);
    cfx_test_fill(src, size, 7);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    memset(buf, 0xA5, size);
    memset(ref, 0xA5, size);

    cr_assert_eq(cfx_get_nb(b, &id, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    wait_progress(req, prefix, &done, &total);
    cr_assert_eq(total, size, "total %llu, the object is %zu bytes", (unsigned long long)total,
                 size);
    cr_assert_eq(done, prefix, "%llu bytes landed, the holder stalls after %zu",
                 (unsigned long long)done, prefix);
    cr_assert_eq(cfx_request_test(req), CFX_ERR_AGAIN);
    cr_assert_eq(memcmp(buf, src, prefix), 0, "the reported prefix is not the object's bytes");
    cr_assert_eq(memcmp(buf + prefix, ref + prefix, size - prefix), 0,
                 "bytes past the reported prefix were written");
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_OK);
    cr_assert_eq(done, prefix, "the stalled get moved to %llu bytes", (unsigned long long)done);
    /* a wait that runs out says which get, and how far it came */
    char hex[CFX_OBJECT_ID_HEX_LEN], want[160];
    cfx_object_id_to_hex(&id, hex);
    snprintf(want, sizeof(want), "get of object %s still running after 10 ms: %zu of %zu bytes "
             "landed", hex, prefix, size);
    cr_assert_eq(cfx_request_wait(req, 10), CFX_ERR_TIMEOUT);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());

    cfx__xfer_test_resume(a);
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(done, size);
    cr_assert_eq(total, size);
    cr_assert_eq(cfx_test_check(buf, size, 7), (size_t)-1, "wrong bytes");

    /* bad arguments, by code */
    cr_assert_eq(cfx_request_progress(NULL, &done, &total), CFX_ERR_INVALID);
    cr_assert_eq(cfx_request_progress(req, NULL, &total), CFX_ERR_INVALID);
    cr_assert_eq(cfx_request_progress(req, &done, NULL), CFX_ERR_INVALID);
    cfx_request_free(req);

    /* no size before a source: an object not put yet; then it is, and the
     * get completes with it (two chunks: under the holder's stall) */
    const size_t lsize = 2 * CHUNK;
    cfx_object_id_generate(a, &late);
    memset(buf, 0xA5, size);
    cr_assert_eq(cfx_get_nb(b, &late, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    done = total = 1;
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_ERR_AGAIN, "%s",
                 cfx_last_error());
    cr_assert_eq(done, 0);
    cr_assert_eq(total, 0);
    cfx_object_id_to_hex(&late, hex);
    snprintf(want, sizeof(want), "get of object %s still running after 10 ms: no source found "
             "yet", hex);
    cr_assert_eq(cfx_request_wait(req, 10), CFX_ERR_TIMEOUT);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    uint8_t *lsrc = malloc(lsize);
    cr_assert(lsrc);
    cfx_test_fill(lsrc, lsize, 9);
    cr_assert_eq(cfx_put_nb(a, &late, lsrc, lsize, &pp, &preq), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_wait(preq, 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_progress(preq, &done, &total), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(done, lsize);
    cr_assert_eq(total, lsize);
    cfx_request_free(preq);
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_OK);
    cr_assert_eq(done, lsize);
    cr_assert_eq(total, lsize);
    cr_assert_eq(cfx_test_check(buf, lsize, 9), (size_t)-1, "wrong bytes");
    cfx_request_free(req);

    /* a get that failed reports its error */
    struct cfx_obj_params sp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 100 };
    cfx_object_id_generate(a, &missing);
    cr_assert_eq(cfx_get_nb(b, &missing, buf, size, &sp, &req), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_ERR_TIMEOUT);
    /* with the get's own words, given to this thread from the worker's */
    cr_assert(strstr(cfx_last_error(), "no node put it within 100 ms"), "%s", cfx_last_error());
    cfx__err_clear();
    cr_assert_eq(cfx_request_test(req), CFX_ERR_TIMEOUT);
    cr_assert(strstr(cfx_last_error(), "no node put it within 100 ms"), "%s", cfx_last_error());
    done = total = 1;
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_ERR_TIMEOUT);
    cr_assert(strstr(cfx_last_error(), "no node put it within 100 ms"), "%s", cfx_last_error());
    cr_assert_eq(done, 0);
    cr_assert_eq(total, 0);
    cfx_request_free(req);

    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
    free(ref);
    free(lsrc);
}

/*
 * cfx_request_free() of a get that is writing the caller's buffer cancels
 * it before it returns: the get's entry (what grants the holder its writes
 * into the buffer) is gone, so the caller may free the buffer.  It only
 * marked the request freed and let the get run on to its deadline, the
 * holder's chunks landing in a buffer the caller had freed (a new user's
 * trial: 135 MB written after the free).  And a get still waiting for the
 * directory (an object nobody put) is let go at once, its buffer untouched.
 */
Test(get, freeing_a_running_get_cancels_it)
{
    const size_t size = (size_t)NCHUNKS * CHUNK, prefix = (size_t)STALL_AT * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id, none;
    struct cfx_request *req;
    uint64_t done = 0, total = 0;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 30000 };

    join("tcp", true, &a); /* stalls after STALL_AT chunks */
    join("tcp", false, &b);
    cfx_object_id_generate(a, &id);
    cfx_test_fill(src, size, 11);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get_nb(b, &id, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    wait_progress(req, prefix, &done, &total);
    cr_assert_eq(done, prefix, "%llu bytes landed", (unsigned long long)done);
    cfx_request_free(req);
    pthread_mutex_lock(&b->lock);
    struct cfx_obj *o = cfx__store_find(&b->store, &id);
    bool live = o && !o->deleting;
    pthread_mutex_unlock(&b->lock);
    cr_assert(!live, "the freed get's entry still exposes the buffer");

    /* the object is still whole at its holder: a new get takes it all,
     * also while the holder's late writes for the canceled one are on
     * their way (dropped, the connection kept); here after they came, and
     * the holder's answer to the cancel freed what the get left behind */
    cfx__xfer_test_resume(a);
    cr_assert(wait_abandoned_gone(b), "the holder never answered the cancel");
    memset(buf, 0, size);
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, buf, size, &got, &gp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(buf, size, 11), (size_t)-1, "wrong bytes");

    /* waiting for the directory: freed at once, nothing written */
    cfx_object_id_generate(a, &none);
    memset(buf, 0xA5, size);
    cr_assert_eq(cfx_get_nb(b, &none, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    cfx_request_free(req);
    for (size_t i = 0; i < size; i++)
        cr_assert_eq(buf[i], 0xA5, "byte %zu written", i);
    free(src);
    free(buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* cfx_request_free() on a thread of its own: it waits for the get it ends. */
struct free_run {
    struct cfx_request *req;
    atomic_bool done;
};

static void *free_main(void *arg)
{
    struct free_run *f = arg;
    cfx_request_free(f->req);
    atomic_store(&f->done, true);
    return NULL;
}

/*
 * A get whose request is freed while its last bytes are on their way ends
 * with them in, but the free hands the buffer back to the caller, so the
 * node keeps no copy in it.  The getter napping on the transports
 * (CFX_WAITER_NAP_MS) saw the cancel only once the transfer had ended, and
 * kept its copy: the node served, and a later get on it answered with,
 * whatever the caller wrote into the buffer next (a new user's trial: 8 of
 * 10 frees of a running 64 MiB get).
 */
Test(get, a_get_freed_as_its_bytes_land_keeps_no_copy)
{
    const size_t size = (size_t)NCHUNKS * CHUNK, prefix = (size_t)STALL_AT * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint64_t done = 0, total = 0;
    uint8_t *src = malloc(size), *buf = malloc(size), *got = malloc(size);
    cr_assert(src && buf && got);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 30000 };
    struct cfx_obj_params local = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };

    join("tcp", true, &a); /* stalls after STALL_AT chunks */
    setenv("CFX_WAITER_NAP_MS", "1000", 1); /* the getter naps through the free */
    join("tcp", false, &b);
    unsetenv("CFX_WAITER_NAP_MS");
    cfx_object_id_generate(a, &id);
    cfx_test_fill(src, size, 17);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    struct free_run f = { .req = NULL };
    cr_assert_eq(cfx_get_nb(b, &id, buf, size, &gp, &f.req), CFX_OK, "%s", cfx_last_error());
    wait_progress(f.req, prefix, &done, &total);
    cr_assert_eq(done, prefix, "%llu bytes landed", (unsigned long long)done);

    /* the free marks the get canceled and waits for it: the holder's
     * stall keeps the request alive until it resumes */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_main, &f), 0);
    bool marked = false;
    for (uint64_t dl = cfx__deadline_ns(10000); !marked && cfx__now_ns() < dl;) {
        pthread_mutex_lock(&b->lock);
        marked = f.req->cancel;
        pthread_mutex_unlock(&b->lock);
        if (!marked)
            poll(NULL, 0, 1);
    }
    cr_assert(marked, "the free never canceled the get");
    cfx__xfer_test_resume(a); /* the rest lands while the getter naps */
    pthread_join(t, NULL);
    cr_assert(atomic_load(&f.done));

    pthread_mutex_lock(&b->lock);
    struct cfx_obj *o = cfx__store_find(&b->store, &id);
    bool live = o && !o->deleting;
    pthread_mutex_unlock(&b->lock);
    cr_assert(!live, "the freed get's buffer is still this node's copy");

    /* the buffer is the caller's: what it writes there is no object */
    memset(buf, 0x5A, size);
    size_t n = 0;
    cr_assert_eq(cfx_get(b, &id, got, size, &n, &local), CFX_ERR_TIMEOUT, "%s",
                 cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "no copy held here"), "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &id, got, size, &n, &gp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(n, size);
    cr_assert_eq(cfx_test_check(got, size, 17), (size_t)-1, "wrong bytes");
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    free(src);
    free(buf);
    free(got);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/*
 * A get of an id that its own node then puts completes, with the put's
 * bytes: the directory answers the waiting lookup "you hold it" (the node
 * is no source for itself, and no other holder need ever come), and the
 * get reads its own store.  It waited out its deadline and said that no
 * node had put the object (a new user's trial).
 */
Test(get, get_before_its_own_nodes_put)
{
    const size_t size = 300000; /* not inline */
    struct cfx_context *a;
    struct cfx_object_id id;
    struct cfx_request *req;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 20000 };
    join("tcp", false, &a);
    cfx_object_id_generate(a, &id);
    cfx_test_fill(src, size, 13);
    memset(buf, 0, size);
    cr_assert_eq(cfx_get_nb(a, &id, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    /* the get waits at the directory (its progress knows no size yet) */
    uint64_t done = 1, total = 1;
    for (uint64_t dl = cfx__deadline_ns(10000); cfx__now_ns() < dl;) {
        pthread_mutex_lock(&a->lock);
        bool waiting = a->stats.dir_lookups > 0;
        pthread_mutex_unlock(&a->lock);
        if (waiting)
            break;
        poll(NULL, 0, 1);
    }
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_ERR_AGAIN);
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_size(req), size);
    cr_assert_eq(cfx_test_check(buf, size, 13), (size_t)-1, "wrong bytes");
    cfx_request_free(req);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    free(src);
    free(buf);
    cfx_context_destroy(a);
}

/* A get of an id whose object went (its putter left, no other copy) waits
 * for a new put of it and, at its deadline, says that the id's object was
 * put and went, and by whom: it said only "no node put it" (a new user's
 * trial), which sent the user looking for a put that had happened. */
Test(get, timeout_of_an_id_whose_object_went_says_so)
{
    const size_t size = 300000; /* not inline */
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    join("tcp", false, &a);
    join("tcp", false, &b);
    uint32_t putter = cfx_context_node_id(a);
    cfx_object_id_generate(a, &id);
    cfx_test_fill(src, size, 21);
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(a); /* leaves: the object goes with it */
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 500 };
    size_t got = 0;
    int rc = cfx_get(b, &id, buf, size, &got, &gp);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    char want[96], why[96];
    snprintf(want, sizeof(want), "(the id was put by node %u before, and went: ", putter);
    /* it left in good order: "left", not "died" (that is for a killed one) */
    snprintf(why, sizeof(why), "its putter node %u left and no other node held a complete copy",
             putter);
    cr_log_info("%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "no node put it within 500 ms") &&
              strstr(cfx_last_error(), want) && strstr(cfx_last_error(), why), "%s",
              cfx_last_error());
    free(src);
    free(buf);
    cfx_context_destroy(b);
}

/*
 * A get into a buffer too small for a copy held on the getter's own node
 * (the putter's, or one it got before) fails with CFX_ERR_TRUNCATED, the
 * size set, the bytes untouched, and says which object, as a get from
 * another node does.  It said only "object is N bytes, buffer M".
 */
Test(get, truncated_local_copy_names_the_object)
{
    const size_t size = 300000; /* not inline */
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    char hex[CFX_OBJECT_ID_HEX_LEN], want[128];
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_object_id_generate(a, &id);
    cfx_object_id_to_hex(&id, hex);
    snprintf(want, sizeof(want), "get of object %s: it is %zu bytes, the buffer %zu", hex, size,
             size - 1);
    cfx_test_fill(src, size, 17);
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    struct cfx_obj_params nk = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_KEEP };
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, buf, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, 17), (size_t)-1, "wrong bytes");
    /* both nodes now hold a complete copy: a's put, b's get */
    struct cfx_context *holders[2] = { a, b };
    uint8_t *small = malloc(size);
    cr_assert_not_null(small);
    for (int i = 0; i < 2; i++) {
        memset(small, 0xA5, size);
        got = 0;
        int rc = cfx_get(holders[i], &id, small, size - 1, &got, &nk);
        cr_assert_eq(rc, CFX_ERR_TRUNCATED, "node %d: %s (%s)", i, cfx_errname(rc),
                     cfx_last_error());
        cr_assert_eq(got, size);
        cr_assert(strstr(cfx_last_error(), want), "node %d: %s", i, cfx_last_error());
        for (size_t j = 0; j < size; j++)
            cr_assert_eq(small[j], 0xA5, "node %d: byte %zu written", i, j);
    }
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    free(small);
    free(src);
    free(buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/*
 * cfx_get_alloc of an empty object held on the caller's node copied from
 * the entry's buffer, which an empty object does not have: memcpy from
 * NULL (undefined, reported by UBSan in the object-store stress).  On the
 * putter's node and on a node that got it, every form of get returns it.
 */
Test(get, alloc_of_an_empty_object_held_here)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    join("tcp", false, &a);
    join("tcp", false, &b);
    cfx_object_id_generate(a, &id);
    cr_assert_eq(cfx_put(a, &id, NULL, 0, NULL), CFX_OK, "%s", cfx_last_error());
    size_t got = 1;
    cr_assert_eq(cfx_get(b, &id, NULL, 0, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, 0);
    struct cfx_context *holders[2] = { a, b };
    for (int i = 0; i < 2; i++) {
        void *buf = NULL;
        got = 1;
        cr_assert_eq(cfx_get_alloc(holders[i], &id, &buf, &got, NULL), CFX_OK, "node %d: %s",
                     i, cfx_last_error());
        cr_assert_eq(got, 0, "node %d", i);
        cfx_buf_free(holders[i], buf);
    }
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/*
 * A get with a timeout of 0 finds only a copy held on its own node
 * (object.h): elsewhere it fails with CFX_ERR_TIMEOUT at once, without
 * asking the directory, and writes nothing.  It asked, and on a fast
 * network the answer came in time: the get then moved the object, or part
 * of it before the deadline cut it off, and returned CFX_OK or
 * CFX_ERR_TIMEOUT by chance.  Once the node holds a copy, the same get
 * reads it.
 */
Test(get, timeout_zero_finds_only_a_copy_held_here)
{
    const size_t sizes[] = { 100, 300000, 4u << 20 }; /* inline, one chunk, chunked */
    struct cfx_context *a, *b;
    join("tcp", false, &a);
    join("tcp", false, &b);
    struct cfx_obj_params now = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 0 };
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        const size_t size = sizes[s];
        struct cfx_object_id id;
        struct cfx_context_stats st0, st1;
        uint8_t *src = malloc(size), *buf = malloc(size), *copy = malloc(size);
        cr_assert(src && buf && copy);
        cfx_object_id_generate(a, &id);
        cfx_test_fill(src, size, 31 + s);
        cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
        memset(buf, 0xA5, size);
        cr_assert_eq(cfx_context_stats(b, &st0), CFX_OK);
        int rc = cfx_get(b, &id, buf, size, NULL, &now);
        cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%zu bytes: %s (%s)", size, cfx_errname(rc),
                     cfx_last_error());
        cr_assert(strstr(cfx_last_error(), "no copy held here"), "%s", cfx_last_error());
        cr_assert_eq(cfx_context_stats(b, &st1), CFX_OK);
        cr_assert_eq(st1.dir_lookups, st0.dir_lookups, "%zu bytes: the directory was asked",
                     size);
        cr_assert_eq(st1.bytes_received, st0.bytes_received, "%zu bytes: bytes moved", size);
        for (size_t j = 0; j < size; j++)
            cr_assert_eq(buf[j], 0xA5, "%zu bytes: byte %zu written", size, j);
        /* the putter's own copy, and b's once it got one, answer at once */
        size_t got = 0;
        cr_assert_eq(cfx_get(a, &id, buf, size, &got, &now), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(got, size);
        cr_assert_eq(cfx_test_check(buf, size, 31 + s), (size_t)-1, "wrong bytes");
        cr_assert_eq(cfx_get(b, &id, copy, size, NULL, NULL), CFX_OK, "%s", cfx_last_error());
        memset(buf, 0, size);
        cr_assert_eq(cfx_get(b, &id, buf, size, &got, &now), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(got, size);
        cr_assert_eq(cfx_test_check(buf, size, 31 + s), (size_t)-1, "wrong bytes");
        cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
        free(src);
        free(buf);
        free(copy);
    }
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* The text of a refusal of field_mask bit 40 by @p call for @p field. */
static void expect_unknown_bit(const char *call, const char *field)
{
    char want[256];
    snprintf(want, sizeof(want), "%s: %s has bits 0x10000000000 this library does not know "
             "(conflux %s)", call, field, CFX_VERSION_STRING);
    cr_assert(strstr(cfx_last_error(), want), "%s: %s", call, cfx_last_error());
}

/* A field_mask bit this library does not know (a field of a newer header)
 * fails every object call with CFX_ERR_UNSUPPORTED naming the bits, before
 * the call does anything.  The bit was ignored: a put with it returned
 * CFX_OK and published the object. */
Test(get, unknown_field_bits_are_refused)
{
    const size_t size = 300000;
    struct cfx_context *a, *b;
    join("tcp", false, &a);
    join("tcp", false, &b);
    struct cfx_object_id id, res;
    cfx_object_id_generate(a, &id);
    cfx_object_id_generate(a, &res);
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    cfx_test_fill(src, size, 7);
    const uint64_t newer = 1ull << 40;
    struct cfx_obj_params bad = { .field_mask = CFX_OBJ_PARAM_TIMEOUT | newer,
                                  .timeout_ms = 5000 };
    struct cfx_obj_params wait = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 300 };
    struct cfx_request *req = NULL;
    const char *field = "cfx_obj_params.field_mask";

    cr_assert_eq(cfx_put(a, &id, src, size, &bad), CFX_ERR_UNSUPPORTED, "%s", cfx_last_error());
    expect_unknown_bit("cfx_put", field);
    cr_assert_eq(cfx_put_nb(a, &id, src, size, &bad, &req), CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_put_nb", field);
    cr_assert_null(req);
    /* nothing was put: the other node waits for it in vain, and the id is free */
    int rc = cfx_get(b, &id, buf, size, NULL, &wait);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());

    /* gets of it: nothing lands, no request, no buffer */
    memset(buf, 0xA5, size);
    cr_assert_eq(cfx_get(b, &id, buf, size, NULL, &bad), CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_get", field);
    cr_assert_eq(cfx_get_nb(b, &id, buf, size, &bad, &req), CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_get_nb", field);
    cr_assert_null(req);
    void *alloc = NULL;
    cr_assert_eq(cfx_get_alloc(b, &id, &alloc, NULL, &bad), CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_get_alloc", field);
    cr_assert_null(alloc);
    for (size_t j = 0; j < size; j++)
        cr_assert_eq(buf[j], 0xA5, "byte %zu written", j);
    struct cfx_context_stats st;
    cr_assert_eq(cfx_context_stats(b, &st), CFX_OK);
    cr_assert_eq(st.bytes_received, 0, "%llu bytes moved", (unsigned long long)st.bytes_received);

    /* a reduce, its own params or its placement's needs: no result */
    struct cfx_task_needs place = { .field_mask = CFX_TASK_NEEDS_MEMORY | newer, .memory = 1 };
    struct cfx_obj_params placed = { .field_mask = CFX_OBJ_PARAM_PLACE, .place = &place };
    cr_assert_eq(cfx_reduce_objects(b, &id, 1, 1, CFX_DTYPE_U8, CFX_OP_SUM, &res, &bad, NULL),
                 CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_reduce_objects", field);
    cr_assert_eq(cfx_reduce_objects(b, &id, 1, 1, CFX_DTYPE_U8, CFX_OP_SUM, &res, &placed, NULL),
                 CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_reduce_objects", "cfx_task_needs.field_mask");
    rc = cfx_get(a, &res, buf, size, NULL, &wait);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());

    /* a delete: the object stays */
    cr_assert_eq(cfx_delete(a, &id, &bad), CFX_ERR_UNSUPPORTED);
    expect_unknown_bit("cfx_delete", field);
    cr_assert_eq(cfx_get(b, &id, buf, size, NULL, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(buf, size, 7), (size_t)-1, "wrong bytes");
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    free(src);
    free(buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* ---- a delete of a copy still being released ------------------------------------------
 *
 * Once cfx_delete() returns anything but CFX_ERR_TIMEOUT, the engine refers
 * to the caller's buffer no more.  A delete that timed out leaves the entry
 * draining (an upload's writes, a reduce task reading it as its input); a
 * second delete of the id answered CFX_ERR_NOT_FOUND at once, while the entry
 * still pointed at the buffer, and a caller that took that as "no copy here"
 * (the Python binding drops its pin of the buffer on it) freed memory the
 * engine still read.
 */
#define DEL_SIZE (256u * 1024)

/* The buffer the entry of @p id serves from, NULL when there is none. */
static void *entry_buf(struct cfx_context *c, const struct cfx_object_id *id)
{
    pthread_mutex_lock(&c->lock);
    struct cfx_obj *o = cfx__store_find(&c->store, id);
    void *b = o ? o->buf : NULL;
    pthread_mutex_unlock(&c->lock);
    return b;
}

/* A reduce task reading @p id as its input (objreduce.c) takes or drops
 * its reference; the last one dropped finishes a release under way. */
static void hold(struct cfx_context *c, const struct cfx_object_id *id, bool take)
{
    pthread_mutex_lock(&c->lock);
    struct cfx_obj *o = cfx__store_find(&c->store, id);
    cr_assert(o, "the entry is gone while a reference holds it");
    if (take) {
        o->refs++;
    } else {
        o->refs--;
        pthread_cond_broadcast(&c->obj_cond);
        if (!o->refs && o->releasing)
            cfx__cmd_must(c, CFX_CMD_OBJ_RELEASE, o);
    }
    pthread_mutex_unlock(&c->lock);
}

Test(get, second_delete_of_a_draining_copy_waits_for_it)
{
    struct cfx_context *a;
    join("tcp", false, &a);
    uint8_t *buf = malloc(DEL_SIZE);
    cr_assert(buf);
    cfx_test_fill(buf, DEL_SIZE, 3);
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &id, buf, DEL_SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    hold(a, &id, true);

    struct cfx_obj_params short_dl = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 50 };
    int rc = cfx_delete(a, &id, &short_dl);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(entry_buf(a, &id), buf, "the copy still drains from the caller's buffer");

    /* asked again while it drains: not "no copy here" */
    rc = cfx_delete(a, &id, &short_dl);
    cr_expect_eq(rc, CFX_ERR_TIMEOUT, "a delete while the copy still drains from the buffer "
                 "returned %s (%s)", cfx_errname(rc), cfx_last_error());
    if (rc != CFX_ERR_TIMEOUT)
        cr_expect_null(entry_buf(a, &id), "%s, and the engine still serves from the buffer",
                       cfx_errname(rc));

    /* the reader ends: the release finishes, and a delete says so */
    hold(a, &id, false);
    rc = cfx_delete(a, &id, NULL);
    cr_assert(rc == CFX_OK || rc == CFX_ERR_NOT_FOUND, "%s: %s", cfx_errname(rc),
              cfx_last_error());
    cr_assert_null(entry_buf(a, &id));
    cr_assert_eq(cfx_test_check(buf, DEL_SIZE, 3), (size_t)-1, "the buffer was changed");
    /* the id is free again */
    cr_assert_eq(cfx_put(a, &id, buf, DEL_SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(a);
    free(buf);
}

/* A delete waiting for a draining copy to leave is a call in flight: the
 * context's destroy ends it at once with CFX_ERR_CANCELED (context.h).  It
 * waited on past the destroy's drain until its own deadline, none here: the
 * destroy gave up on it after 10 s, left the context allocated, and the
 * delete never returned (this test then hangs until its timeout). */
struct del_waiter {
    struct cfx_context *c;
    struct cfx_object_id id;
    int rc;
};

static void *del_main(void *arg)
{
    struct del_waiter *w = arg;
    struct cfx_obj_params dl = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = -1 };
    w->rc = cfx_delete(w->c, &w->id, &dl);
    return NULL;
}

Test(get, delete_waiting_for_a_draining_copy_ends_at_the_destroy, .timeout = 40)
{
    struct cfx_context *a;
    join("tcp", false, &a);
    uint8_t *buf = malloc(DEL_SIZE);
    cr_assert(buf);
    cfx_test_fill(buf, DEL_SIZE, 5);
    struct del_waiter w = { .c = a, .rc = CFX_OK };
    cfx_object_id_generate(a, &w.id);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &w.id, buf, DEL_SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    hold(a, &w.id, true); /* a reader that never ends */
#if defined(__SANITIZE_ADDRESS__)
    /* the destroy drops an entry a reader still holds without freeing it;
     * a real reader (a reduce task) is stopped before, this one never is */
    pthread_mutex_lock(&a->lock);
    __lsan_ignore_object(cfx__store_find(&a->store, &w.id));
    pthread_mutex_unlock(&a->lock);
#endif
    struct cfx_obj_params short_dl = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 50 };
    int rc = cfx_delete(a, &w.id, &short_dl);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());

    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, del_main, &w), 0);
    /* the second delete waits for the entry to leave */
    cr_assert(cfx_test_await_count(&a->lock, &a->obj_waiters, 20000),
              "the second delete never waited");
    cfx_context_destroy(a);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_expect_eq(w.rc, CFX_ERR_CANCELED, "the delete returned %s after the destroy",
                 cfx_errname(w.rc));
    free(buf);
}

/* ---- a get that times out after its object was deleted ------------------------------
 *
 * A get whose holder stalls runs out of time; meanwhile the putter deleted
 * the object, so the directory no longer knows the id when the getter tells
 * it the transfer ended.  The get fails CFX_ERR_TIMEOUT saying so, naming
 * the holder and how far it got.  The text was that of the transfer-end
 * message's own refusal ("transfer end of object ... is not in the
 * directory"), which hid why the get failed (seen over dpdk, where a slow
 * get let its putter's wait end first).
 */
static void *delete_main(void *arg)
{
    struct del_waiter *w = arg;
    w->rc = cfx_delete(w->c, &w->id, NULL);
    return NULL;
}

Test(get, timeout_after_the_delete_says_the_get_timed_out)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);
    join("tcp", true, &a);
    join("tcp", false, &b);
    struct del_waiter w = { .c = a, .rc = CFX_OK };
    cfx_object_id_generate(a, &w.id);
    cfx_test_fill(src, size, 9);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &w.id, src, size, &pp), CFX_OK, "%s", cfx_last_error());

    /* the get runs until the holder stalls, then the putter deletes */
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 3000 };
    struct cfx_request *req = NULL;
    cr_assert_eq(cfx_get_nb(b, &w.id, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    uint64_t done = 0, total = 0, dl = cfx__deadline_ns(20000);
    while (done < (uint64_t)STALL_AT * CHUNK && cfx__now_ns() < dl) {
        int pr = cfx_request_progress(req, &done, &total);
        cr_assert(pr == CFX_OK || pr == CFX_ERR_AGAIN, "%s: %s", cfx_errname(pr),
                  cfx_last_error());
        sched_yield();
    }
    cr_assert_eq(done, (uint64_t)STALL_AT * CHUNK, "the get never reached the stall");
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, delete_main, &w), 0);

    int rc = cfx_request_wait(req, -1);
    char why[CFX__ERR_TEXT_MAX];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    cfx_request_free(req);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_log_info("get: %s; delete: %s", why, cfx_errname(w.rc));
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s (%s)", cfx_errname(rc), why);
    char holder[32];
    snprintf(holder, sizeof(holder), "from node %u ", cfx_context_node_id(a));
    cr_assert(strstr(why, "timed out after 3000 ms") && strstr(why, holder) &&
                  !strstr(why, "transfer end"),
              "%s", why);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
}

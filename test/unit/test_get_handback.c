/*
 * Buffers handed back to their callers while other nodes still read them:
 * a get that ends without keeping its copy (it failed, or NO_KEEP) and a
 * put whose directory answer came too late.  Other nodes may be reading
 * the buffer (getters the directory sent there), with writes of it still
 * posted to a reader that stopped taking them; the call must not return
 * before those writes ended, or the reader takes what the caller writes
 * next as the object's bytes.  One process: an embedded coordinator and
 * three contexts over tcp with small socket buffers.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/client_int.h"
#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "intr_probe.h"
#include "testutil.h"

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    unsetenv("CFX_TCP_SNDBUF");
    unsetenv("CFX_TCP_RCVBUF");
    cfx_test_coord_down(&co);
}

TestSuite(get_handback, .init = setup, .fini = teardown, .timeout = 60);

static void join(struct cfx_context **out)
{
    cr_assert_eq(cfx_test_join(co.addr, co.token, "tcp", NULL, 5000, out), CFX_OK, "%s",
                 cfx_last_error());
}

/*
 * A get that ends without a copy (it failed, or kept none: NO_KEEP) hands
 * its buffer back to its caller, who may write it at once; another node
 * was reading the chunks that had landed (a get sent here, a partial
 * holder), and the transport still had writes of them on their way to it,
 * a reader that had stopped taking them (tcp sends from the buffer).  The
 * get waited 2 s for them and returned all the same (the NO_KEEP one
 * with CFX_ERR_TIMEOUT), and once the reader went on it took what the
 * caller had written since as the object's chunks, kept them, and its own
 * get ended CFX_OK.  Now writes that do not drain have their connection
 * failed before the buffer goes back: the reader fails over to the putter
 * and gets every byte as put.
 */
struct timed_get {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    uint8_t *buf;
    size_t size;
    struct cfx_obj_params params;
    int rc;
    char err[256];
};

static void *timed_get_main(void *arg)
{
    struct timed_get *g = arg;
    g->rc = cfx_get(g->ctx, g->id, g->buf, g->size, NULL, &g->params);
    snprintf(g->err, sizeof(g->err), "%s", cfx_last_error());
    return NULL;
}

static void timed_get_start(struct timed_get *g, struct cfx_context *c,
                            const struct cfx_object_id *id, size_t size, int timeout_ms,
                            bool no_keep)
{
    *g = (struct timed_get){ .ctx = c, .id = id, .size = size, .buf = malloc(size) };
    cr_assert(g->buf);
    memset(g->buf, 0xA5, size);
    g->params.field_mask = CFX_OBJ_PARAM_TIMEOUT | CFX_OBJ_PARAM_FLAGS;
    g->params.timeout_ms = timeout_ms;
    g->params.flags = no_keep ? CFX_OBJ_FLAG_NO_KEEP : 0;
    cr_assert_eq(pthread_create(&g->thr, NULL, timed_get_main, g), 0);
}

/* Until @p c's entry of @p id is there and @p pred holds for it (c->lock
 * held); nothing signals either: looked at every 20 ms, 10 s at most. */
static bool entry_until(struct cfx_context *c, const struct cfx_object_id *id,
                        bool (*pred)(const struct cfx_obj *))
{
    uint64_t dl = cfx__deadline_ns(10000);
    bool ok = false;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        const struct cfx_obj *o = cfx__store_find(&c->store, id);
        if ((ok = o && !o->deleting && pred(o)) || cfx__now_ns() >= dl)
            break;
        cfx__obj_wait(c, cfx__deadline_ns(20));
    }
    pthread_mutex_unlock(&c->lock);
    return ok;
}

#define CUT_CHUNK (64u * 1024) /* a chunk's write outgrows the small socket buffers */
#define CUT_HAVE  8u           /* chunks the putter sends before it stalls */

static bool has_half(const struct cfx_obj *o)
{
    return o->ready_chunks >= CUT_HAVE;
}

static bool is_read(const struct cfx_obj *o)
{
    return !cfx_list_empty(&o->uploads);
}

static bool writes_out(const struct cfx_obj *o)
{
    return is_read(o) && cfx_list_entry(o->uploads.next, struct cfx_upload, obj_link)->inflight;
}

static void buffer_back_with_a_stopped_reader(bool no_keep)
{
    const size_t size = 2 * (size_t)CUT_HAVE * CUT_CHUNK;
    /* a receiver that stops reading leaves the writes to it posted */
    setenv("CFX_TCP_SNDBUF", "4096", 1);
    setenv("CFX_TCP_RCVBUF", "4096", 1);
    struct cfx_context *a, *b, *d;
    join(&a);
    join(&b);
    join(&d);
    struct cfx_object_id id;
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CUT_CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    uint8_t *src = malloc(size);
    cr_assert(src);
    cfx_test_fill(src, size, 23);
    cfx_object_id_generate(a, &id);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    cfx__xfer_test_stall(a, CUT_HAVE);

    /* b gets the first chunks, then waits for the rest */
    struct timed_get gb, gd;
    timed_get_start(&gb, b, &id, size, 5000, no_keep);
    cr_assert(entry_until(b, &id, has_half), "b never got the first %u chunks", CUT_HAVE);
    /* d is sent to b, the newest holder; b serves it one chunk, then d
     * stops reading and b writes the others */
    cfx__xfer_test_stall(b, 1);
    timed_get_start(&gd, d, &id, size, 30000, false);
    cr_assert(entry_until(b, &id, is_read), "d did not read b's partial copy");
    cfx__progress_lock(d);
    cfx__xfer_test_resume(b);
    bool out = entry_until(b, &id, writes_out);
    if (no_keep)
        cfx__xfer_test_resume(a); /* b's get completes; its reader is still reading */

    pthread_join(gb.thr, NULL);
    if (no_keep) {
        cr_assert_eq(gb.rc, CFX_OK, "%s (%s)", cfx_errname(gb.rc), gb.err);
        cr_assert_eq(cfx_test_check(gb.buf, size, 23), (size_t)-1, "b: wrong bytes");
    } else {
        cr_assert_eq(gb.rc, CFX_ERR_TIMEOUT, "%s (%s)", cfx_errname(gb.rc), gb.err);
    }
    memset(gb.buf, 0xEE, size); /* the caller's again */
    cfx__progress_unlock(d);
    cfx__xfer_test_resume(a);
    pthread_join(gd.thr, NULL);
    cr_assert(out, "no write of b's to d stayed posted: the case was not made");
    cr_assert_eq(gd.rc, CFX_OK, "%s (%s)", cfx_errname(gd.rc), gd.err);
    size_t bad = cfx_test_check(gd.buf, size, 23);
    cr_assert_eq(bad, (size_t)-1, "d got byte %zu (chunk %zu) as b's caller wrote it after "
                 "b's get returned", bad, bad / CUT_CHUNK);

    cfx_context_destroy(d);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(gb.buf);
    free(gd.buf);
    free(src);
}

Test(get_handback, failed_get_leaves_the_buffer_to_its_caller)
{
    buffer_back_with_a_stopped_reader(false);
}

Test(get_handback, no_keep_get_leaves_the_buffer_to_its_caller)
{
    buffer_back_with_a_stopped_reader(true);
}

/*
 * A put the directory took, whose answer came after the put's deadline: it
 * fails CFX_ERR_TIMEOUT, and the caller has its buffer back, but a getter
 * the directory sent to it was already reading it.  The put waited for
 * nothing then (its release was only queued), and writes to a reader that
 * had stopped taking them read the caller's next bytes.  Now they are
 * waited for, and cut off with the reader's connection when they do not
 * move: the getter never gets other bytes than the put's.
 */
struct bg_put {
    pthread_t thr;
    struct cfx_context *ctx;
    const struct cfx_object_id *id;
    const uint8_t *buf;
    size_t size;
    int rc;
};

static void *bg_put_main(void *arg)
{
    struct bg_put *q = arg;
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CUT_CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    q->rc = cfx_put(q->ctx, q->id, q->buf, q->size, &pp);
    return NULL;
}

/* @p q's put (on q->ctx) reaches the directory, and its answer is held
 * back until late_put_end(), when the put ends CFX_ERR_TIMEOUT. */
static void late_put_start(struct bg_put *q)
{
    struct cfx_context *a = q->ctx;
    pthread_mutex_lock(&a->lock);
    a->test_put_late = true;
    a->test_put_held = false;
    pthread_mutex_unlock(&a->lock);
    cr_assert_eq(pthread_create(&q->thr, NULL, bg_put_main, q), 0);
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&a->lock);
    while (!a->test_put_held && cfx__obj_wait(a, dl))
        ;
    bool held = a->test_put_held;
    pthread_mutex_unlock(&a->lock);
    cr_assert(held, "the put never had its answer");
}

static int late_put_end(struct bg_put *q)
{
    struct cfx_context *a = q->ctx;
    pthread_mutex_lock(&a->lock);
    a->test_put_late = false;
    pthread_cond_broadcast(&a->obj_cond);
    pthread_mutex_unlock(&a->lock);
    pthread_join(q->thr, NULL);
    return q->rc;
}

Test(get_handback, late_put_answer_leaves_the_buffer_to_its_caller)
{
    const size_t size = 2 * (size_t)CUT_HAVE * CUT_CHUNK;
    setenv("CFX_TCP_SNDBUF", "4096", 1);
    setenv("CFX_TCP_RCVBUF", "4096", 1);
    struct cfx_context *a, *d;
    join(&a);
    join(&d);
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size);
    cr_assert(src);
    cfx_test_fill(src, size, 31);

    struct bg_put q = { .ctx = a, .id = &id, .buf = src, .size = size };
    late_put_start(&q);

    /* d gets it from a: one chunk, then d stops reading and a writes the
     * others, which stay posted */
    cfx__xfer_test_stall(a, 1);
    struct timed_get gd;
    timed_get_start(&gd, d, &id, size, 8000, false); /* it ends failed: a let go */
    cr_assert(entry_until(a, &id, is_read), "d did not read a's copy");
    cfx__progress_lock(d);
    cfx__xfer_test_resume(a);
    bool out = entry_until(a, &id, writes_out);

    int rc = late_put_end(&q);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "the put: %s", cfx_errname(rc));
    memset(src, 0xEE, size); /* the caller's again */
    cfx__progress_unlock(d);
    pthread_join(gd.thr, NULL);
    cr_assert(out, "no write of a's to d stayed posted: the case was not made");
    /* a was the only holder and has let go: d fails, or has every byte as put */
    if (gd.rc == CFX_OK) {
        size_t bad = cfx_test_check(gd.buf, size, 31);
        cr_assert_eq(bad, (size_t)-1, "d got byte %zu (chunk %zu) as a's caller wrote it "
                     "after the put returned", bad, bad / CUT_CHUNK);
    }
    cfx_context_destroy(d);
    cfx_context_destroy(a);
    free(gd.buf);
    free(src);
}

/* Two contexts, @p a putting and @p d getting, an id of a's, and @p size
 * bytes of source (pattern @p seed) and of destination. */
struct pair {
    struct cfx_context *a, *d;
    struct cfx_object_id id;
    uint8_t *src, *dst;
    size_t size;
    int seed;
};

static void pair_up(struct pair *p, size_t size, int seed)
{
    *p = (struct pair){ .size = size, .seed = seed };
    join(&p->a);
    join(&p->d);
    cfx_object_id_generate(p->a, &p->id);
    p->src = malloc(size);
    p->dst = malloc(size);
    cr_assert(p->src && p->dst);
    cfx_test_fill(p->src, size, seed);
}

static void pair_put(struct pair *p)
{
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CUT_CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(p->a, &p->id, p->src, p->size, &pp), CFX_OK, "the put: %s",
                 cfx_last_error());
}

/* d gets the object into @p buf: every byte as put */
static void pair_get_ok(struct pair *p, uint8_t *buf)
{
    memset(buf, 0xA5, p->size);
    int rc = cfx_get(p->d, &p->id, buf, p->size, NULL, NULL);
    cr_assert_eq(rc, CFX_OK, "the get: %s", cfx_last_error());
    size_t bad = cfx_test_check(buf, p->size, p->seed);
    cr_assert_eq(bad, (size_t)-1, "byte %zu differs from the put's", bad);
}

static void pair_down(struct pair *p)
{
    cfx_context_destroy(p->d);
    cfx_context_destroy(p->a);
    free(p->dst);
    free(p->src);
}

/*
 * The put that failed for its late answer had been taken by the directory,
 * which went on naming its node as the holder of an object the node no
 * longer held: a get of the id was sent there, waited to its deadline and
 * failed CFX_ERR_PEER_FAILED naming that node a failed source.  The failed
 * put withdraws itself: a get finds no holder (CFX_ERR_TIMEOUT), and the
 * put made again serves every byte.
 */
Test(get_handback, late_put_answer_withdraws_the_put)
{
    struct pair p;
    pair_up(&p, 4 * (size_t)CUT_CHUNK, 37);
    struct bg_put q = { .ctx = p.a, .id = &p.id, .buf = p.src, .size = p.size };
    late_put_start(&q);
    int rc = late_put_end(&q);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "the put: %s", cfx_errname(rc));

    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 500 };
    rc = cfx_get(p.d, &p.id, p.dst, p.size, NULL, &gp);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "a get of the failed put's id: %s (%s)", cfx_errname(rc),
                 cfx_last_error());
    pair_put(&p); /* again, answered in time */
    pair_get_ok(&p, p.dst);
    pair_down(&p);
}

/*
 * A blocking get interrupted (cfx_set_interrupt_check, as Ctrl-C in
 * Python): its check runs on the getter's thread, holding no lock of the
 * library, and asks to stop, and the get ends CFX_ERR_CANCELED: while the
 * directory is asked for an object nobody put yet, and mid-transfer, when
 * the buffer is the caller's again once it returned.
 */
/* d's get of the pair's id, with @p probe as its thread's check: canceled */
static void get_interrupted(struct pair *p, struct intr_probe *probe)
{
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 20000 };
    cfx_set_interrupt_check(intr_check, probe);
    int rc = cfx_get(p->d, &p->id, p->dst, p->size, NULL, &gp);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());
}

Test(get_handback, interrupted_get_of_an_object_not_put_yet)
{
    struct pair p;
    pair_up(&p, 4 * (size_t)CUT_CHUNK, 41);
    struct intr_probe probe = { .ctx = p.d };
    get_interrupted(&p, &probe);
    cr_assert_eq(probe.calls, 1);
    /* the directory's late answer to the lookup leaves nothing behind */
    pair_put(&p);
    pair_get_ok(&p, p.dst);
    pair_down(&p);
}

Test(get_handback, interrupted_get_mid_transfer_leaves_the_buffer)
{
    struct pair p;
    pair_up(&p, 2 * (size_t)CUT_HAVE * CUT_CHUNK, 43);
    uint8_t *again = malloc(p.size);
    cr_assert(again);
    pair_put(&p);
    cfx__xfer_test_stall(p.a, 1); /* a sends one chunk, then nothing */
    struct intr_probe probe = { .ctx = p.d, .id = &p.id };
    get_interrupted(&p, &probe);
    memset(p.dst, 0x5A, p.size); /* the caller's again */

    cfx__xfer_test_resume(p.a);
    pair_get_ok(&p, again);
    for (size_t i = 0; i < p.size; i++)
        cr_assert_eq(p.dst[i], 0x5A, "the interrupted get wrote byte %zu after it returned", i);
    free(again);
    pair_down(&p);
}

/*
 * A failed put's withdrawal (a drop bounded by the put's tag) takes this
 * node's put of the id and nothing else: a copy the node holds of another
 * node's object under that id (got on another thread while the put's
 * answer was late) stays recorded.  Dropped from the directory, the copy
 * was left out of its putter's delete, and the node went on answering its
 * own gets of the id from it after the delete.
 */
Test(get_handback, put_withdrawal_leaves_a_copy_of_another_nodes_object)
{
    const size_t size = 4 * (size_t)CUT_CHUNK;
    struct cfx_context *a, *d;
    join(&a);
    join(&d);
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size), *dst = malloc(size), *again = malloc(size);
    cr_assert(src && dst && again);
    cfx_test_fill(src, size, 47);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(d, &id, dst, size, NULL, NULL), CFX_OK, "%s", cfx_last_error());

    /* d's completion went first on its connection */
    int rc = cfx__ctl_obj_put_withdraw(d->ctl, &id, 1, cfx__deadline_ns(5000));
    cr_assert_eq(rc, CFX_ERR_NOT_FOUND, "withdrawal of a put d never made: %s (%s)",
                 cfx_errname(rc), cfx_last_error());

    /* a's delete reaches d's copy: d's get of the id finds none */
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 300 };
    rc = cfx_get(d, &id, again, size, NULL, &gp);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "d's get after a's delete: %s (%s)", cfx_errname(rc),
                 cfx_last_error());
    cfx_context_destroy(d);
    cfx_context_destroy(a);
    free(again);
    free(dst);
    free(src);
}

/*
 * A blocking get of an id that another thread of its node is getting waits
 * for that get (get.c get_held): interrupted there, it ends
 * CFX_ERR_CANCELED at once, while the other get goes on (it waited for the
 * other get to end, the check never run).
 */
struct behind_get {
    struct timed_get g;
    bool ended;
};

static void *behind_main(void *arg)
{
    struct behind_get *b = arg;
    timed_get_main(&b->g);
    __atomic_store_n(&b->ended, true, __ATOMIC_RELEASE);
    return NULL;
}

static bool has_one(const struct cfx_obj *o)
{
    return o->ready_chunks > 0;
}

Test(get_handback, interrupted_get_behind_another_threads_get)
{
    const size_t size = 2 * (size_t)CUT_HAVE * CUT_CHUNK;
    struct cfx_context *a, *d;
    join(&a);
    join(&d);
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size), *dst = malloc(size);
    cr_assert(src && dst);
    cfx_test_fill(src, size, 53);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = CUT_CHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());

    /* another thread of d gets it: one chunk, then a sends nothing more */
    cfx__xfer_test_stall(a, 1);
    struct behind_get b = { .g = { .ctx = d, .id = &id, .size = size, .buf = malloc(size) } };
    cr_assert(b.g.buf);
    b.g.params.field_mask = CFX_OBJ_PARAM_TIMEOUT;
    b.g.params.timeout_ms = 20000;
    cr_assert_eq(pthread_create(&b.g.thr, NULL, behind_main, &b), 0);
    cr_assert(entry_until(d, &id, has_one), "d's other thread never got a chunk");

    struct intr_probe p = { .ctx = d };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 20000 };
    cfx_set_interrupt_check(intr_check, &p);
    int rc = cfx_get(d, &id, dst, size, NULL, &gp);
    cfx_set_interrupt_check(NULL, NULL);
    bool other_ended = __atomic_load_n(&b.ended, __ATOMIC_ACQUIRE);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());
    cr_assert(!other_ended, "the interrupted get waited for the other thread's get to end");

    cfx__xfer_test_resume(a);
    pthread_join(b.g.thr, NULL);
    cr_assert_eq(b.g.rc, CFX_OK, "%s (%s)", cfx_errname(b.g.rc), b.g.err);
    size_t bad = cfx_test_check(b.g.buf, size, 53);
    cr_assert_eq(bad, (size_t)-1, "byte %zu differs from the put's", bad);
    cfx_context_destroy(d);
    cfx_context_destroy(a);
    free(b.g.buf);
    free(dst);
    free(src);
}

/*
 * A blocking get whose source failed looks for another holder (get.c
 * get_failover), a lookup that waits for one.  d cannot connect to a (test
 * hook CFX_TEST_CONNECT_BREAK), the object's only holder; d's get runs
 * with @p check as its interrupt check, which sees the failover begun
 * (stats.source_failovers) and returns whether to stop.
 */
static int failover_get(int (*check)(void *arg), int timeout_ms, uint8_t seed)
{
    const size_t size = 4 * (size_t)CUT_CHUNK;
    struct cfx_context *a, *d;
    join(&a);
    setenv("CFX_TEST_CONNECT_BREAK", "tcp", 1);
    join(&d);
    unsetenv("CFX_TEST_CONNECT_BREAK");
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size), *dst = malloc(size);
    cr_assert(src && dst);
    cfx_test_fill(src, size, seed);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());

    struct intr_probe p = { .ctx = d };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = timeout_ms };
    cfx_set_interrupt_check(check, &p);
    int rc = cfx_get(d, &id, dst, size, NULL, &gp);
    cfx_set_interrupt_check(NULL, NULL);
    char err[1024];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    cfx_context_destroy(d);
    cfx_context_destroy(a);
    free(dst);
    free(src);
    cfx__err(rc, "%s", err);
    return rc;
}

static bool in_failover(struct intr_probe *p)
{
    pthread_mutex_lock(&p->ctx->lock);
    bool failover = p->ctx->stats.source_failovers > 0; /* in the failover's lookup */
    pthread_mutex_unlock(&p->ctx->lock);
    return failover;
}

/* Interrupted in that lookup, the get ends CFX_ERR_CANCELED saying so, not
 * that the source failed and no other holder was found in time. */
static int failover_check(void *arg)
{
    return in_failover(arg);
}

Test(get_handback, interrupted_failover_lookup_says_so)
{
    int rc = failover_get(failover_check, 20000, 59);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());
}

/* With the coordinator gone (stopped once that lookup began) the get fails
 * with CFX_ERR_CONNECT and its error names the coordinator, as cfx_get's
 * header says.  (Before, it said only that the source failed and no other
 * holder was found in time.) */
static int stop_coord_at_failover(void *arg)
{
    if (in_failover(arg))
        cfx_test_coord_down(&co);
    return 0;
}

Test(get_handback, failover_lookup_without_a_coordinator_names_it)
{
    char addr[sizeof(co.addr)];
    snprintf(addr, sizeof(addr), "%s", co.addr);
    int rc = failover_get(stop_coord_at_failover, 2000, 61);
    cr_assert_null(co.coord, "the get never came to its failover's lookup");
    cr_assert_eq(rc, CFX_ERR_CONNECT, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_log_info("%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "source node"), "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), addr), "the coordinator %s is not named: %s", addr,
              cfx_last_error());
}

/*
 * A get that keeps no copy (CFX_OBJ_FLAG_NO_KEEP, as Python's get into a
 * buffer) and a delete release their entry on their own thread when the
 * progress lock is free, instead of queueing the release for the progress
 * thread and sleeping until it ran: that hand-off cost two wake-ups, a
 * known-location 8 B get over tcp took 40 us instead of 11.  With d's
 * progress thread paused (only API threads drive), each completes and its
 * entry is gone when it returns; before, each waited for the release to its
 * deadline.
 */
static void assert_no_entry(struct pair *p, const char *after)
{
    pthread_mutex_lock(&p->d->lock);
    const struct cfx_obj *o = cfx__store_find(&p->d->store, &p->id);
    pthread_mutex_unlock(&p->d->lock);
    cr_assert_null(o, "the entry outlived %s", after);
}

Test(get_handback, a_get_without_a_copy_releases_it_on_its_thread)
{
    struct pair p;
    pair_up(&p, 64, 53);
    pair_put(&p);
    pair_get_ok(&p, p.dst); /* a copy, and the holder's location learnt */
    struct cfx_obj_params dp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 20000 };
    cr_assert_eq(cfx_delete(p.d, &p.id, &dp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__progress_pause(p.d, true), CFX_OK, "%s", cfx_last_error());

    struct cfx_obj_params nk = { .field_mask = CFX_OBJ_PARAM_FLAGS | CFX_OBJ_PARAM_TIMEOUT,
                                 .flags = CFX_OBJ_FLAG_NO_KEEP, .timeout_ms = 20000 };
    for (int i = 0; i < 3; i++) {
        memset(p.dst, 0xA5, p.size);
        cr_assert_eq(cfx_get(p.d, &p.id, p.dst, p.size, NULL, &nk), CFX_OK, "get %d: %s", i,
                     cfx_last_error());
        cr_assert_eq(cfx_test_check(p.dst, p.size, p.seed), (size_t)-1, "get %d", i);
        assert_no_entry(&p, "the get without a copy");
    }
    pair_get_ok(&p, p.dst); /* a copy again, and its delete */
    cr_assert_eq(cfx_delete(p.d, &p.id, &dp), CFX_OK, "%s", cfx_last_error());
    assert_no_entry(&p, "the delete");
    cr_assert_eq(cfx__progress_pause(p.d, false), CFX_OK);
    pair_down(&p);
}

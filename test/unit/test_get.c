/*
 * A get's deadline holds even when its holder stalls mid-transfer: the
 * getter withdraws the window at the deadline and returns CFX_ERR_TIMEOUT
 * naming the holder, without waiting for the holder's answer, and nothing
 * lands in the caller's buffer after that.  One process: an embedded
 * coordinator, a holder started with the test hook CFX_XFER_TEST_STALL and
 * a getter.
 */
#include <criterion/criterion.h>

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
#define TIMEOUT_MS 500
#define SLACK_MS   700 /* scheduling on a loaded machine; the old wait was 1000 past */

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];

static void setup(void)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = 0, .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "coordinator: %s", cfx_last_error());
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
}

static void teardown(void)
{
    unsetenv("CFX_XFER_TEST_STALL");
    cfx__coord_stop(coord);
    coord = NULL;
}

TestSuite(get, .init = setup, .fini = teardown, .timeout = 60);

static void join(const char *tps, bool stall, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = coord_addr,
        .token = token,
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

static bool has_abandoned(struct cfx_context *c)
{
    for (unsigned s = 0; s < CFX_XFER_SLOTS; s++)
        if (c->slots[s] && c->slots[s]->abandoned)
            return true;
    return false;
}

/* Wait (on the getter's object condition) until @p b holds no transfer
 * left behind at a deadline: the holder's late answer reached it (here a
 * refused write, which fails the connection).  Returns whether it ended. */
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

/* The holder resumes after the getter left: its late writes are refused
 * (the grant was withdrawn at the deadline), the caller's buffer keeps the
 * bytes it had when cfx_get() returned, and a later get of the object from
 * the same holder works. */
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
    pthread_mutex_unlock(&b->lock);
    cfx__xfer_test_resume(a); /* the rest of the chunks go out now */
    cr_assert(wait_abandoned_gone(b), "%s: the holder's late writes never reached the getter", tps);
    cr_assert_eq(cfx_context_stats(b, &after), CFX_OK);
    cr_expect_gt(after.writes_refused, before.writes_refused,
                 "%s: the holder's late writes were not refused", tps);
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

/* The holder never answers: the transfer the getter left behind is freed
 * with the context (ASan's leak check), and the getter's buffer is free
 * to go at once. */
Test(get, stalled_holder_never_answers)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);

    join("tcp", true, &a);
    join("tcp", false, &b);
    stalled_get(a, b, &id, src, buf);
    free(buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

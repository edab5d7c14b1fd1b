/*
 * Requests that outlive their context.  A group may outlive its context,
 * and its destroy says the requests of its calls "end with
 * CFX_ERR_CANCELED, still to be freed" (conflux/group.h); a get_nb still
 * held at cfx_context_destroy() is in the same place.  Their test, wait and
 * free locked the freed context (a new user's trial: a wait that hung).
 * Now the destroy ends each request and lets it go of the context: it is
 * tested, waited for and freed afterwards with its final status.  And a
 * request does not wait behind others that wait (the last test).
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"
#include "group_ranks.h"

static pthread_barrier_t bar;

/* The request's calls after the destroy: each ends at once, canceled. */
static void expect_canceled_after_destroy(struct cfx_request *req)
{
    cr_expect_eq(cfx_request_test(req), CFX_ERR_CANCELED, "%s", cfx_last_error());
    cr_expect_eq(cfx_request_wait(req, -1), CFX_ERR_CANCELED, "%s", cfx_last_error());
    cr_expect_eq(cfx_request_wait(req, 0), CFX_ERR_CANCELED, "%s", cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "destroyed") != NULL, "%s", cfx_last_error());
    cfx_request_free(req);
}

Test(request, get_nb_held_across_the_context_destroy, .timeout = 60)
{
    up("tcp", 1);
    struct cfx_object_id id;
    memset(&id, 0xA7, sizeof(id)); /* nobody puts it: the get waits for a holder */
    uint8_t buf[64];
    memset(buf, 0x5A, sizeof(buf));
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    struct cfx_request *req;
    cr_assert_eq(cfx_get_nb(ctxs[0], &id, buf, sizeof(buf), &op, &req), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_test(req), CFX_ERR_AGAIN);
    cfx_context_destroy(ctxs[0]);
    ctxs[0] = NULL;
    uint64_t done = 1, total = 1;
    cr_expect_eq(cfx_request_progress(req, &done, &total), CFX_ERR_CANCELED, "%s",
                 cfx_last_error());
    cr_expect_eq(done, 0);
    cr_expect_eq(total, 0);
    expect_canceled_after_destroy(req);
    for (size_t i = 0; i < sizeof(buf); i++)
        cr_assert_eq(buf[i], 0x5A, "byte %zu of the buffer written", i);
    cfx__coord_stop(coord);
}

/* A thread waits (no deadline) on a get nobody can serve. */
struct waiter {
    struct cfx_request *req;
    int rc;
    char err[256];
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    w->rc = cfx_request_wait(w->req, -1);
    snprintf(w->err, sizeof(w->err), "%s", cfx_last_error());
    return NULL;
}

/* The destroy on one thread while another is blocked in cfx_request_wait():
 * the wait ends canceled, and the destroy returns only once that thread has
 * let go of the context (ASan: no use of it after its free). */
Test(request, wait_blocked_on_another_thread_during_the_destroy, .timeout = 60)
{
    up("tcp", 1);
    struct cfx_context *c = ctxs[0];
    struct cfx_object_id id;
    memset(&id, 0xB3, sizeof(id)); /* nobody puts it */
    uint8_t buf[64];
    memset(buf, 0x3C, sizeof(buf));
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    struct waiter w = { .rc = CFX_OK };
    cr_assert_eq(cfx_get_nb(c, &id, buf, sizeof(buf), &op, &w.req), CFX_OK, "%s",
                 cfx_last_error());
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, wait_main, &w), 0);
    /* the waiter is inside its wait (counted under the lock) */
    cr_assert(cfx_test_await_count(&c->lock, &c->req_waiters, 20000),
              "the waiter never waited");
    cfx_context_destroy(c);
    ctxs[0] = NULL;
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_expect_eq(w.rc, CFX_ERR_CANCELED, "%s: %s", cfx_errname(w.rc), w.err);
    expect_canceled_after_destroy(w.req);
    for (size_t i = 0; i < sizeof(buf); i++)
        cr_assert_eq(buf[i], 0x3C, "byte %zu of the buffer written", i);
    cfx__coord_stop(coord);
}

/* Rank 0 posts an allreduce rank 1 never makes and destroys its context
 * with the group still alive; the request is used after that destroy. */
static int body_ctx_destroyed(struct rank_run *rr)
{
    int32_t v = 7;
    int rc = CFX_OK;
    if (rr->rank == 0) {
        struct cfx_request *req;
        rc = cfx_group_iallreduce(rr->g, &v, &v, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL, &req);
        if (rc == CFX_OK) {
            cfx_context_destroy(rr->ctx);
            ctxs[0] = NULL;
            expect_canceled_after_destroy(req);
            if (v != 7)
                rc = CFX_ERR_INTERNAL;
        }
    }
    pthread_barrier_wait(&bar);
    return rc;
}

Test(request, group_request_held_across_the_context_destroy, .timeout = 60)
{
    struct rank_run rr[2];
    up("tcp", 2);
    pthread_barrier_init(&bar, NULL, 2);
    run_ranks(2, "req_ctx_gone", 20000, body_ctx_destroyed, rr);
    pthread_barrier_destroy(&bar);
    all_ok(2, rr);
    down(2);
}

/*
 * A non-blocking call never waits behind others that wait: two gets of
 * objects nobody has put yet, then a get of an object held here.  The
 * context had two worker threads, both held by the first two gets, so the
 * third waited until their deadlines ran out, long past its own (a new
 * user's trial: done after 8 s with a deadline of 1 s, behind two gets of
 * 8 s).  Now a request that finds no idle worker starts one, up to 64;
 * beyond, it waits in the queue with its deadline running from its
 * submission, and fails by it, saying so.
 */
#define NB_WORKERS_MAX 64

Test(request, a_request_does_not_wait_behind_waiting_ones, .timeout = 120)
{
    up("tcp", 1);
    struct cfx_object_id none[NB_WORKERS_MAX], held;
    struct cfx_request *wait_req[NB_WORKERS_MAX], *req;
    uint8_t src[256], buf[256], nbuf[NB_WORKERS_MAX][8];
    struct cfx_obj_params slow = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    struct cfx_obj_params fast = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 500 };
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 7 + 3);
    memset(&held, 0xC3, sizeof(held));
    cr_assert_eq(cfx_put(ctxs[0], &held, src, sizeof(src), NULL), CFX_OK, "%s",
                 cfx_last_error());
    for (int i = 0; i < NB_WORKERS_MAX; i++) {
        memset(&none[i], 0xD0, sizeof(none[i]));
        none[i].bytes[0] = (uint8_t)i; /* nobody puts these (until below) */
    }

    /* two gets that wait, then one of the object held here */
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx_get_nb(ctxs[0], &none[i], nbuf[i], sizeof(nbuf[i]), &slow,
                                &wait_req[i]), CFX_OK, "%s", cfx_last_error());
    memset(buf, 0, sizeof(buf));
    cr_assert_eq(cfx_get_nb(ctxs[0], &held, buf, sizeof(buf), &slow, &req), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(memcmp(buf, src, sizeof(src)), 0, "wrong bytes");
    cfx_request_free(req);

    /* every worker busy: a request waits in the queue and its deadline,
     * counted from its submission, passes there */
    for (int i = 2; i < NB_WORKERS_MAX; i++)
        cr_assert_eq(cfx_get_nb(ctxs[0], &none[i], nbuf[i], sizeof(nbuf[i]), &slow,
                                &wait_req[i]), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get_nb(ctxs[0], &held, buf, sizeof(buf), &fast, &req), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 1000), CFX_ERR_TIMEOUT); /* still queued */
    cr_assert_eq(cfx_request_test(req), CFX_ERR_AGAIN);
    /* one waiting get is served: its worker takes the queued request, late */
    cr_assert_eq(cfx_put(ctxs[0], &none[0], src, sizeof(nbuf[0]), NULL), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_wait(wait_req[0], 20000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_ERR_TIMEOUT);
    cr_assert(strstr(cfx_last_error(), "its 500 ms passed while it waited for one of the "
                     "context's 64 worker threads, all busy"), "%s", cfx_last_error());
    cfx_request_free(req);
    for (int i = 0; i < NB_WORKERS_MAX; i++)
        cfx_request_free(wait_req[i]);
    down(1);
}

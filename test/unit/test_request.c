/*
 * Requests that outlive their context.  A group may outlive its context,
 * and its destroy says the requests of its calls "end with
 * CFX_ERR_CANCELED, still to be freed" (conflux/group.h); a get_nb still
 * held at cfx_context_destroy() is in the same place.  Their test, wait and
 * free locked the freed context (a new user's trial: a wait that hung).
 * Now the destroy ends each request and lets it go of the context: it is
 * tested, waited for and freed afterwards with its final status.
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

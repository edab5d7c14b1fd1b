/*
 * cfx_ps_create() waits for the job's other members; when they do not come,
 * its CFX_ERR_TIMEOUT names who was waited for; and a BSP request that runs
 * out of time names the worker the round waits for.  The cause used to be lost
 * in the handle's teardown (its own calls reset the thread's error detail),
 * and the caller got "timed out" with no detail.  One process: an embedded
 * coordinator and one context.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "testutil.h"

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];
static struct cfx_context *ctx;

static void setup(void)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = 0, .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "coordinator: %s", cfx_last_error());
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
    cr_assert_eq(cfx_test_join(coord_addr, token, "tcp", NULL, 5000, &ctx), CFX_OK, "%s",
                 cfx_last_error());
}

static void teardown(void)
{
    cfx_context_destroy(ctx);
    cfx__coord_stop(coord);
}

TestSuite(ps_create, .init = setup, .fini = teardown, .timeout = 60);

static int create(enum cfx_ps_role role, struct cfx_ps **ps)
{
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS | CFX_PS_PARAM_TIMEOUT,
        .job = "lonely",
        .role = role,
        .index = 0,
        .num_workers = 1,
        .num_servers = 1,
        .timeout_ms = 300,
    };
    *ps = NULL;
    return cfx_ps_create(ctx, &pp, ps);
}

/* Server 0 alone: its worker never announces itself. */
Test(ps_create, server_alone_names_the_missing_worker)
{
    struct cfx_ps *ps;
    int rc = create(CFX_PS_SERVER, &ps);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(ps);
    cr_assert(strstr(cfx_last_error(), "job lonely: worker 0 did not join within 300 ms"), "%s",
              cfx_last_error());
}

/* A worker alone: no scheduler ever announces itself. */
Test(ps_create, worker_alone_names_the_missing_scheduler)
{
    struct cfx_ps *ps;
    int rc = create(CFX_PS_WORKER, &ps);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(ps);
    cr_assert(strstr(cfx_last_error(), "job lonely: server 0 (the scheduler) did not announce itself within 300 ms"),
              "%s", cfx_last_error());
}

/* ---- a BSP round that one worker holds ----------------------------------------- */

struct member {
    enum cfx_ps_role role;
    int index;
    struct cfx_context *ctx;
    struct cfx_ps *ps;
    int rc;
    char err[512];
};

static void *member_create(void *arg)
{
    struct member *m = arg;
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_CONSISTENCY | CFX_PS_PARAM_TIMEOUT,
        .job = "bsp",
        .role = m->role,
        .index = m->index,
        .num_workers = 2,
        .num_servers = 1,
        .consistency = CFX_PS_BSP,
        .timeout_ms = 3000, /* told at half of it: 1.5 s before the deadline */
    };
    m->rc = cfx_ps_create(m->ctx, &pp, &m->ps);
    snprintf(m->err, sizeof(m->err), "%s", cfx_last_error());
    return NULL;
}

/* As member_create, for the job "admins" (one server, one worker). */
static void *member_admins_create(void *arg)
{
    struct member *m = arg;
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS | CFX_PS_PARAM_TIMEOUT,
        .job = "admins",
        .role = m->role,
        .index = m->index,
        .num_workers = 1,
        .num_servers = 1,
        .timeout_ms = 20000,
    };
    m->rc = cfx_ps_create(m->ctx, &pp, &m->ps);
    snprintf(m->err, sizeof(m->err), "%s", cfx_last_error());
    return NULL;
}

static void *member_register(void *arg)
{
    struct member *m = arg;
    static const float init[4] = { 1, 2, 3, 4 };
    int key;
    m->rc = cfx_ps_register(m->ps, "w", CFX_DTYPE_F32, 4, m->index == 0 ? init : NULL, &key);
    snprintf(m->err, sizeof(m->err), "%s", cfx_last_error());
    return NULL;
}

/* Each member on its own thread at once (create and register wait for the
 * others). */
static void all_at_once(struct member *m, int n, void *(*fn)(void *))
{
    pthread_t t[3];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fn, &m[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < n; i++)
        cr_assert_eq(m[i].rc, CFX_OK, "member %d: %s", i, m[i].err);
}

/* Worker 0 push-pulls step 0 while worker 1 has not pushed it: under BSP
 * the server holds the request until the round is complete, so it runs out
 * of time, and its error named only the server ("no answer from server
 * 0").  The server tells the worker, at half the timeout, which worker's
 * push the round lacks; the error names worker 1. */
Test(ps_create, bsp_timeout_names_the_worker_the_round_waits_for, .timeout = 60)
{
    struct member m[3] = { { .role = CFX_PS_SERVER, .index = 0 },
                           { .role = CFX_PS_WORKER, .index = 0 },
                           { .role = CFX_PS_WORKER, .index = 1 } };
    m[0].ctx = ctx;
    for (int i = 1; i < 3; i++)
        cr_assert_eq(cfx_test_join(coord_addr, token, "tcp", NULL, 5000, &m[i].ctx), CFX_OK,
                     "%s", cfx_last_error());
    all_at_once(m, 3, member_create);
    all_at_once(m + 1, 2, member_register);

    const float g[4] = { 1, 1, 1, 1 };
    float out[4];
    int rc = cfx_ps_pushpull(m[1].ps, 0, g, out);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "worker 1 has not"), "%s", cfx_last_error());

    for (int i = 2; i >= 0; i--) {
        cfx_ps_destroy(m[i].ps);
        if (i)
            cfx_context_destroy(m[i].ctx);
    }
}

/* ---- administrators at once ------------------------------------------------------ */

#define ADMINS 4
#define ADMIN_ROUNDS 3

struct admin {
    struct cfx_context *ctx;
    pthread_barrier_t *start;
    int rc[ADMIN_ROUNDS];
    char err[ADMIN_ROUNDS][256];
};

static void *admin_remove_scheduler(void *arg)
{
    struct admin *a = arg;
    for (int r = 0; r < ADMIN_ROUNDS; r++) {
        pthread_barrier_wait(a->start); /* every administrator's request at once */
        a->rc[r] = cfx_ps_remove_server(a->ctx, "admins", 0, 20000, NULL);
        snprintf(a->err[r], sizeof(a->err[r]), "%s", cfx_last_error());
    }
    return NULL;
}

/* Four administrators ask the scheduler at once, three times over, to remove
 * server 0: each gets the scheduler's own answer to its own request (BUSY,
 * "cannot be removed").  They race for the request numbers: the loser of a
 * number got CFX_ERR_EXISTS for its put ("one administrator at a time"),
 * which failed a CI run of ps_ranks.py; now it takes the next number. */
Test(ps_create, administrators_at_once_are_served_in_turn, .timeout = 90)
{
    struct member m[2] = { { .role = CFX_PS_SERVER, .index = 0 },
                           { .role = CFX_PS_WORKER, .index = 0 } };
    m[0].ctx = ctx;
    cr_assert_eq(cfx_test_join(coord_addr, token, "tcp", NULL, 5000, &m[1].ctx), CFX_OK, "%s",
                 cfx_last_error());
    pthread_t t[ADMINS];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, member_admins_create, &m[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(m[i].rc, CFX_OK, "member %d: %s", i, m[i].err);

    pthread_barrier_t start;
    struct admin a[ADMINS];
    cr_assert_eq(pthread_barrier_init(&start, NULL, ADMINS), 0);
    for (int i = 0; i < ADMINS; i++) {
        memset(&a[i], 0, sizeof(a[i]));
        a[i].start = &start;
        cr_assert_eq(cfx_test_join(coord_addr, token, "tcp", NULL, 5000, &a[i].ctx), CFX_OK,
                     "%s", cfx_last_error());
    }
    for (int i = 0; i < ADMINS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, admin_remove_scheduler, &a[i]), 0);
    for (int i = 0; i < ADMINS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < ADMINS; i++)
        for (int r = 0; r < ADMIN_ROUNDS; r++) {
            cr_expect_eq(a[i].rc[r], CFX_ERR_BUSY, "administrator %d, round %d: %s: %s", i, r,
                         cfx_errname(a[i].rc[r]), a[i].err[r]);
            cr_expect(strstr(a[i].err[r], "cannot be removed"),
                      "administrator %d, round %d: not the scheduler's answer: %s", i, r,
                      a[i].err[r]);
        }
    for (int i = 0; i < ADMINS; i++)
        cfx_context_destroy(a[i].ctx);
    pthread_barrier_destroy(&start);
    cfx_ps_destroy(m[1].ps);
    cfx_ps_destroy(m[0].ps);
    cfx_context_destroy(m[1].ctx);
}

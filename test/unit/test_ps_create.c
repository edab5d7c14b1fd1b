/*
 * cfx_ps_create() waits for the job's other members; when they do not come,
 * its CFX_ERR_TIMEOUT names who was waited for.  The cause used to be lost
 * in the handle's teardown (its own calls reset the thread's error detail),
 * and the caller got "timed out" with no detail.  One process: an embedded
 * coordinator and one context.
 */
#include <criterion/criterion.h>

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

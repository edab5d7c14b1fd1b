/*
 * A cluster in one process: an embedded coordinator and up to MAX_RANKS
 * contexts on it (up/down; define MAX_RANKS before including to change it,
 * default 6).  Included by one test file each: the state is the file's own.
 */
#ifndef CFX_TEST_CLUSTER_UP_H
#define CFX_TEST_CLUSTER_UP_H

#include <criterion/criterion.h>

#include <stdio.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "testutil.h"

#ifndef MAX_RANKS
#define MAX_RANKS 6
#endif

static struct cfx_coord *coord;
static char coord_addr[64], token[64];
static struct cfx_context *ctxs[MAX_RANKS];

static inline void up(const char *tps, int n)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK);
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
    for (int i = 0; i < n; i++) {
        struct cfx_context_params cp = {
            .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS,
            .coord = coord_addr, .token = token, .transports = tps,
        };
        cr_assert_eq(cfx_context_create(&cp, &ctxs[i]), CFX_OK, "%s", cfx_last_error());
    }
}

static inline void down(int n)
{
    for (int i = n - 1; i >= 0; i--)
        cfx_context_destroy(ctxs[i]);
    cfx__coord_stop(coord);
}

#endif

/*
 * A cluster in one process for group tests (cluster_up.h: several contexts
 * on an embedded coordinator), one thread per rank (run_ranks), each creating the
 * group, running a body and destroying the group.  Included by one test
 * file each: the state is the file's own.
 */
#ifndef CFX_TEST_GROUP_RANKS_H
#define CFX_TEST_GROUP_RANKS_H

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>

#include <conflux/conflux.h>

#include "cluster_up.h"

struct rank_run {
    int rank, size;
    const char *name;
    int timeout_ms;
    struct cfx_context *ctx;
    struct cfx_group *g;
    int (*body)(struct rank_run *rr);
    int rc;
    char err[512];
};

/* @p rr's group: its name, rank, size and timeout, on its context. */
static inline int rank_group_create(struct rank_run *rr)
{
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = rr->name, .rank = rr->rank, .size = rr->size, .timeout_ms = rr->timeout_ms,
    };
    return cfx_group_create(rr->ctx, &gp, &rr->g);
}

static inline void *rank_main(void *arg)
{
    struct rank_run *rr = arg;
    rr->rc = rank_group_create(rr);
    if (rr->rc == CFX_OK && rr->body)
        rr->rc = rr->body(rr);
    if (rr->rc != CFX_OK)
        snprintf(rr->err, sizeof(rr->err), "%s", cfx_last_error());
    cfx_group_destroy(rr->g);
    return NULL;
}

/* Run @p body on ranks 0..n-1 (rank i on context i), each on its own thread. */
static inline void run_ranks(int n, const char *name, int timeout_ms,
                             int (*body)(struct rank_run *), struct rank_run *rr)
{
    pthread_t th[MAX_RANKS];
    for (int i = 0; i < n; i++) {
        rr[i] = (struct rank_run){ .rank = i, .size = n, .name = name, .timeout_ms = timeout_ms,
                                   .ctx = ctxs[i], .body = body };
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &rr[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

static inline void all_ok(int n, struct rank_run *rr)
{
    for (int i = 0; i < n; i++)
        cr_expect_eq(rr[i].rc, CFX_OK, "rank %d: %s: %s", i, cfx_errname(rr[i].rc), rr[i].err);
    for (int i = 0; i < n; i++)
        cr_assert_eq(rr[i].rc, CFX_OK);
}

#endif

/*
 * Rank program of test_bootstrap: started the way torchrun starts ranks
 * (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; no CFX_COORD), it joins
 * through the coordinator rank 0 hosts, runs one int32 sum allreduce of
 * COUNT elements on the world group and compares every element with the
 * value computed here.  Prints "rank R/N ok: S" (S: the sum over all
 * elements) or fails naming the call, the status and the detail.
 *
 *   cfx_boottest [COUNT]
 */
#include <conflux/conflux.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "test/common/testutil.h"

static int rank = -1;

#define DIE(...)                                 \
    do {                                         \
        fprintf(stderr, "FAIL rank %d: ", rank); \
        fprintf(stderr, __VA_ARGS__);            \
        fprintf(stderr, "\n");                   \
        exit(1);                                 \
    } while (0)

/* Element @p i of rank @p r's input: small, so every sum is exact. */
static int32_t val(int r, size_t i)
{
    return (int32_t)((i * 7 + (size_t)r * 13) % 1001) - 500;
}

int main(int argc, char **argv)
{
    size_t count = argc > 1 ? strtoull(argv[1], NULL, 10) : 262147;
    struct cfx_context *ctx;
    struct cfx_group *g;
    int32_t *in, *out;
    int64_t total = 0;

    CHECK_OK(cfx_context_create(NULL, &ctx));
    CHECK_OK(cfx_group_create(ctx, NULL, &g));
    rank = cfx_group_rank(g);
    int world = cfx_group_size(g);
    in = malloc(count * sizeof(*in));
    out = malloc(count * sizeof(*out));
    if (!in || !out)
        DIE("out of memory for %zu elements", count);
    for (size_t i = 0; i < count; i++)
        in[i] = val(rank, i);
    CHECK_OK(cfx_group_allreduce(g, in, out, count, CFX_DTYPE_I32, CFX_OP_SUM, NULL));
    for (size_t i = 0; i < count; i++) {
        int64_t want = 0;
        for (int r = 0; r < world; r++)
            want += val(r, i);
        if (out[i] != want)
            DIE("element %zu is %" PRId32 ", want %" PRId64, i, out[i], want);
        total += want;
    }
    printf("rank %d/%d ok: %" PRId64 "\n", rank, world, total);
    fflush(stdout);
    cfx_group_destroy(g);
    cfx_context_destroy(ctx);
    free(in);
    free(out);
    return 0;
}

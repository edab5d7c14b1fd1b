/*
 * The README's "Using the library" example, whole: rank 0 publishes an
 * object, the other ranks get it, and rank 0 keeps it until they have it
 * (a barrier after the gets, then rank 0 deletes it); then an allreduce.
 * Run with a coordinator up: cfx_run -n 3 ./put_get.  Exits 0 when every
 * byte and every sum is right.
 */
#include <stdio.h>
#include <stdlib.h>

#include <conflux/conflux.h>

#define COUNT (1u << 20) /* floats in the object and the allreduce */

static int fail(const char *what, int rc)
{
    fprintf(stderr, "put_get: %s: %s: %s\n", what, cfx_errname(rc), cfx_last_error());
    return 1;
}

int main(void)
{
    struct cfx_context *ctx;
    struct cfx_group *world;
    int rc = cfx_context_create(NULL, &ctx);     /* joins $CFX_COORD with $CFX_TOKEN */
    if (rc != CFX_OK)
        return fail("cfx_context_create", rc);
    rc = cfx_group_create(ctx, NULL, &world);    /* rank/size from cfx_run, Open MPI, Slurm, torchrun */
    if (rc != CFX_OK)
        return fail("cfx_group_create", rc);
    int rank = cfx_group_rank(world), size = cfx_group_size(world);
    size_t bytes = COUNT * sizeof(float);
    float *weights = malloc(bytes), *grads = malloc(bytes);
    if (!weights || !grads)
        return fail("malloc", CFX_ERR_NOMEM);
    for (size_t i = 0; i < COUNT; i++) {
        weights[i] = rank == 0 ? (float)(i % 1000) : -1.0f;
        grads[i] = (float)(rank + 1);
    }

    struct cfx_object_id id;
    cfx_object_id_from_name("model/weights", &id);
    if (rank == 0)
        rc = cfx_put(ctx, &id, weights, bytes, NULL);       /* zero-copy: keep it until cfx_delete */
    else
        rc = cfx_get(ctx, &id, weights, bytes, NULL, NULL); /* from any holder, chunk by chunk */
    if (rc != CFX_OK)
        return fail(rank == 0 ? "cfx_put" : "cfx_get", rc);
    /* The putter keeps its object until every reader has it: when the
     * barrier returns every rank has passed its get, and rank 0 may
     * delete the object (or leave). */
    rc = cfx_group_barrier(world, NULL);
    if (rc != CFX_OK)
        return fail("cfx_group_barrier", rc);
    if (rank == 0 && (rc = cfx_delete(ctx, &id, NULL)) != CFX_OK)
        return fail("cfx_delete", rc);

    rc = cfx_group_allreduce(world, grads, grads, COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
    if (rc != CFX_OK)
        return fail("cfx_group_allreduce", rc);
    int bad = 0;
    for (size_t i = 0; i < COUNT && !bad; i++)
        bad = weights[i] != (float)(i % 1000) || grads[i] != (float)(size * (size + 1) / 2);
    if (bad)
        fprintf(stderr, "put_get: rank %d: wrong values\n", rank);
    else
        printf("put_get: rank %d of %d: object and allreduce right\n", rank, size);

    free(grads);
    free(weights);
    cfx_group_destroy(world);
    cfx_context_destroy(ctx);
    return bad;
}

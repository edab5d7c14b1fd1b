/*
 * Objects in CUDA device memory over transports that move host memory:
 * the staging path.
 *
 * put: the device buffer is copied once into an arena buffer (host memory
 *      that shm maps zero-copy and tcp/verbs register once), which the
 *      store then owns (obj->arena) and serves until the object is deleted.
 *      The put is a snapshot: the device buffer may change after it returns
 *      (stronger than the host put's "unchanged until delete").
 * get: the object comes into an arena buffer as a host get would (and is
 *      served from there to later getters, as any got object), then is
 *      copied to the caller's device buffer.
 *
 * Device copies use a private non-blocking stream (gpu/cuda/cuda_stage.c),
 * so they do not serialize with the application's work on stream 0.
 * GPUDirect RDMA (verbs_gdr.c) is the zero-copy path for verbs; the engine
 * does not route device objects to it yet (see docs/GPU.md).
 */
#include "gpu_stage.h"

#include "engine.h"

#include <string.h>

#include "gpu/memtype.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

#ifdef CFX_HAVE_CUDA
/* Params of the host-memory call that carries a device request. */
static struct cfx_obj_params host_params(const struct cfx_obj_params *params)
{
    struct cfx_obj_params p;

    if (params)
        p = *params;
    else
        memset(&p, 0, sizeof(p));
    p.field_mask |= CFX_OBJ_PARAM_MEMTYPE;
    p.memtype = CFX_MEMTYPE_HOST;
    return p;
}

int cfx__gpu_stage_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *dev,
                       size_t size, const struct cfx_obj_params *params)
{
    struct cfx_obj_params hp = host_params(params);
    void *host = NULL;
    bool owned = false;
    int rc;

    if (!size) /* nothing to stage */
        return cfx_put(ctx, id, dev, 0, &hp);
    rc = cfx_buf_alloc(ctx, size, &host);
    if (rc != CFX_OK)
        return rc;
    rc = cfx__cuda_stage_d2h(host, dev, size);
    if (rc != CFX_OK) {
        cfx_buf_free(ctx, host);
        return cfx__err(rc, "cfx_put of device memory on node %u: %s", ctx->node_id,
                        cfx_last_error());
    }
    rc = cfx_put(ctx, id, host, size, &hp);
    /* Hand the buffer to the store entry, which frees it on release. */
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *obj = rc == CFX_OK ? cfx__store_find(&ctx->store, id) : NULL;
    if (obj && obj->buf == host) {
        obj->arena = true;
        owned = true;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (!owned)
        cfx_buf_free(ctx, host); /* put failed, or the object is already gone */
    return rc;
}

int cfx__gpu_stage_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *dev,
                       size_t capacity, size_t *size_out, const struct cfx_obj_params *params)
{
    struct cfx_obj_params hp = host_params(params);
    void *host = NULL;
    size_t size = 0;
    bool backs_object = false;
    int rc;

    rc = cfx_get_alloc(ctx, id, &host, &size, &hp);
    if (rc != CFX_OK)
        return rc;
    if (size > capacity) {
        rc = cfx__err(CFX_ERR_TRUNCATED, "get of an object into device memory on node %u: it is "
                      "%zu bytes, the buffer %zu", ctx->node_id, size, capacity);
    } else {
        rc = cfx__cuda_stage_h2d(dev, host, size);
        if (rc != CFX_OK)
            rc = cfx__err(rc, "get into device memory on node %u: %s", ctx->node_id,
                          cfx_last_error());
    }
    if (rc == CFX_OK && size_out)
        *size_out = size;
    /* A buffer that holds the store's copy stays to serve other getters
     * (freed on delete); a private copy of a local object goes now. */
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    backs_object = obj && obj->arena && obj->buf == host && !obj->deleting;
    if (!backs_object)
        cfx__arena_free(ctx, host);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}
#else
int cfx__gpu_stage_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *dev,
                       size_t size, const struct cfx_obj_params *params)
{
    return cfx__err(CFX_ERR_UNSUPPORTED, "cuda memory: this library was built without CUDA");
}

int cfx__gpu_stage_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *dev,
                       size_t capacity, size_t *size_out, const struct cfx_obj_params *params)
{
    return cfx__err(CFX_ERR_UNSUPPORTED, "cuda memory: this library was built without CUDA");
}
#endif

/*
 * Objects in CUDA device memory over transports that move host memory:
 * the staging path.
 *
 * put: the device buffer is copied once into an arena buffer (host memory
 *      that shm maps zero-copy and tcp/verbs register once), which the
 *      store then owns (obj->arena) and serves until the object is deleted.
 *      The put is a snapshot: the device buffer may change after it returns
 *      (stronger than the host put's "unchanged until delete").  The copy
 *      waits for the legacy default stream first; work of the caller's on
 *      other streams must be synchronized before the put (as CUDA-aware
 *      MPI asks).
 * get: the object comes into an arena buffer as a host get would (and is
 *      served from there to later getters, as any got object); each part
 *      is copied on to the caller's device buffer as soon as the contiguous
 *      prefix that holds it has landed, so the copy of chunk i runs while
 *      chunk i+1 is on the wire and only the last part is copied after the
 *      transfer.
 *
 * Device copies go through the memory-type table (gpu/memtype.h) on the
 * context's own device stream, so they do not serialize with the
 * application's work on the default stream.  GPUDirect RDMA (verbs_gdr.c)
 * is the zero-copy path for verbs; the engine does not route device
 * objects to it yet (see docs/GPU.md).
 */
#include "gpu_stage.h"

#include "engine.h"

#include <stdio.h>
#include <string.h>

#include "gpu/memtype.h"

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

/* The context's device stream, ordered after the caller's work on the
 * default stream (the kernel that made a put's bytes, or that still reads
 * a get's destination). */
static int dev_stream(struct cfx_context *ctx, void **out)
{
    return cfx__memtype_stream_for(CFX_MEMTYPE_CUDA, &ctx->dev_stream, &ctx->lock, out);
}

int cfx__gpu_stage_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *dev,
                       size_t size, const struct cfx_obj_params *params)
{
    struct cfx_obj_params hp = host_params(params);
    void *host = NULL, *stream = NULL;
    bool owned = false;
    int rc;

    if (!size) /* nothing to stage */
        return cfx_put(ctx, id, dev, 0, &hp);
    if ((rc = dev_stream(ctx, &stream)) != CFX_OK)
        return cfx__err(rc, "cfx_put of device memory on node %u: %s", ctx->node_id,
                        cfx_last_error());
    rc = cfx_buf_alloc(ctx, size, &host);
    if (rc != CFX_OK)
        return rc;
    rc = cfx__memcpy_typed_wait(host, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, size, stream);
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

/* A get into device memory in progress. */
struct stage_get {
    char *dev;       /* the caller's device buffer */
    size_t capacity; /* its size */
    void *stream;    /* the context's device stream */
    char why[256];   /* a failed copy's error text, kept at once */
};

/* Copy bytes [from, upto), which just landed, on to the device (told by
 * the get, on this thread; the rest of the object keeps arriving). */
static int stage_landed(void *arg, const void *buf, size_t from, size_t upto)
{
    struct stage_get *sg = arg;

    if (upto > sg->capacity)
        return CFX_ERR_TRUNCATED; /* said by the caller, who knows the size */
    int rc = cfx__memcpy_typed_wait(sg->dev + from, CFX_MEMTYPE_CUDA, (const char *)buf + from,
                                    CFX_MEMTYPE_HOST, upto - from, sg->stream);
    if (rc != CFX_OK)
        snprintf(sg->why, sizeof(sg->why), "%s", cfx_last_error());
    return rc;
}

int cfx__gpu_stage_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *dev,
                       size_t capacity, size_t *size_out, const struct cfx_obj_params *params)
{
    struct cfx_obj_params hp = host_params(params);
    struct stage_get sg = { .dev = dev, .capacity = capacity };
    struct cfx__get_watch w = { .landed = stage_landed, .arg = &sg };
    void *host = NULL;
    size_t size = 0;
    bool backs_object = false;
    int rc;

    if ((rc = dev_stream(ctx, &sg.stream)) != CFX_OK)
        return cfx__err(rc, "get into device memory on node %u: %s", ctx->node_id,
                        cfx_last_error());
    rc = cfx__get_alloc_watched(ctx, id, &host, &size, &hp, &w);
    if (rc != CFX_OK)
        return rc;
    if (size > capacity) {
        rc = cfx__err(CFX_ERR_TRUNCATED, "get of an object into device memory on node %u: it is "
                      "%zu bytes, the buffer %zu", ctx->node_id, size, capacity);
    } else {
        /* the part that landed last (or all of a local or inline object) */
        rc = w.rc != CFX_OK ? w.rc : stage_landed(&sg, host, w.upto, size);
        if (rc != CFX_OK)
            rc = cfx__err(rc, "get into device memory on node %u: copy to the device: %s",
                          ctx->node_id, sg.why);
    }
    if ((rc == CFX_OK || size > capacity) && size_out)
        *size_out = size; /* truncated too, as a host get says it */
    /* A buffer that holds the store's copy stays to serve other getters:
     * lent to no caller, the entry's release frees it (its delete, or one
     * under way now, after its uploads drained; as cfx_buf_free lets go).
     * A private copy of a local object goes now. */
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    backs_object = obj && obj->arena && obj->buf == host;
    if (backs_object)
        obj->lent = false;
    else
        cfx__arena_free(ctx, host);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

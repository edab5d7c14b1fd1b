/*
 * Chunked staging between device memory and pinned host memory, for the
 * engine's path that moves device objects over transports that carry host
 * memory only (tcp, shm, verbs without GPUDirect).
 *
 * Device -> host keeps two copies in flight at most: while the caller sends
 * chunk i, chunk i+1 is being copied (the stream runs the copies in order,
 * an event after each tells when its chunk is in host memory).  Host ->
 * device is queued as chunks land and waited for once at the end.
 */
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "cfx_cuda.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define STAGE_DEPTH 2 /* copies in flight: double buffering */

struct cfx__cuda_stager {
    int device;                      /* ordinal the stream belongs to */
    cudaStream_t stream;             /* non-blocking: no implicit sync with stream 0 */
    cudaEvent_t ev[STAGE_DEPTH];     /* "chunk i is in host memory", by i % depth */
};

int cfx__cuda_stager_create(int device, struct cfx__cuda_stager **out)
{
    struct cfx__cuda_stager *st;
    int cur = 0, rc;
    cudaError_t err;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "cuda stager: NULL result");
    if (!cfx__cuda_available())
        return cfx__err(CFX_ERR_NO_DEVICE, "cuda stager: CUDA is not usable here");
    st = calloc(1, sizeof(*st));
    if (!st)
        return cfx__err(CFX_ERR_NOMEM, "cuda stager: out of memory");

    err = cudaGetDevice(&cur);
    if (err != cudaSuccess) {
        rc = cfx__cuda_status(err, "cuda stager: cudaGetDevice");
        goto err_free;
    }
    st->device = device >= 0 ? device : cur;
    /* Streams and events belong to the device current at creation; switch
     * only for the creation and put the caller's device back. */
    if (st->device != cur && (err = cudaSetDevice(st->device)) != cudaSuccess) {
        rc = cfx__cuda_status(err, "cuda stager: cudaSetDevice");
        goto err_free;
    }
    err = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        rc = cfx__cuda_status(err, "cuda stager: cudaStreamCreate");
        goto err_restore;
    }
    for (int i = 0; i < STAGE_DEPTH; i++) {
        /* Blocking sync: a waiting thread sleeps instead of spinning (the
         * progress engine's CPU budget matters more than a few µs). */
        err = cudaEventCreateWithFlags(&st->ev[i], cudaEventDisableTiming | cudaEventBlockingSync);
        if (err != cudaSuccess) {
            rc = cfx__cuda_status(err, "cuda stager: cudaEventCreate");
            while (i-- > 0)
                cudaEventDestroy(st->ev[i]);
            goto err_destroy_stream;
        }
    }
    if (st->device != cur)
        cudaSetDevice(cur);
    *out = st;
    return CFX_OK;

err_destroy_stream:
    cudaStreamDestroy(st->stream);
err_restore:
    if (st->device != cur)
        cudaSetDevice(cur);
err_free:
    free(st);
    return rc;
}

void cfx__cuda_stager_destroy(struct cfx__cuda_stager *st)
{
    if (!st)
        return;
    if (cudaStreamSynchronize(st->stream) != cudaSuccess)
        CFX_LOG(WARN, GPU, "cuda stager: a staged copy failed: %s",
                cudaGetErrorString(cudaGetLastError()));
    for (int i = 0; i < STAGE_DEPTH; i++)
        cudaEventDestroy(st->ev[i]);
    cudaStreamDestroy(st->stream);
    free(st);
}

void *cfx__cuda_stager_stream(struct cfx__cuda_stager *st)
{
    return st ? (void *)st->stream : NULL;
}

/* Queue the copy of chunk @p i and the event that marks it done. */
static int stage_one(struct cfx__cuda_stager *st, char *dst, const char *src, size_t len,
                     size_t i)
{
    cudaError_t err = cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, st->stream);
    if (err == cudaSuccess)
        err = cudaEventRecord(st->ev[i % STAGE_DEPTH], st->stream);
    return cfx__cuda_status(err, "cuda staging: device to host copy");
}

int cfx__cuda_stage_to_host(struct cfx__cuda_stager *st, void *host, size_t host_len,
                            const void *dev, size_t len, size_t chunk, cfx__cuda_chunk_fn fn,
                            void *arg)
{
    size_t nch, slots;
    int rc = CFX_OK;

    if (!st || (len && (!host || !dev)) || !chunk)
        return cfx__err(CFX_ERR_INVALID, "cuda staging: NULL argument or zero chunk");
    if (!len)
        return CFX_OK;
    nch = (len + chunk - 1) / chunk;
    slots = host_len >= len ? 0 : host_len / chunk; /* 0: linear, chunk i at host + off */
    if (host_len < len && (slots < 2 || !fn))
        return cfx__err(CFX_ERR_INVALID, "cuda staging: %zu host bytes hold %zu chunk%s of %zu "
                        "(a ring needs two, and a callback to drain it)", host_len, slots,
                        slots == 1 ? "" : "s", chunk);

#define SLOT(i) ((char *)host + (slots ? ((i) % slots) * chunk : (i) * chunk))
#define CLEN(i) ((i) + 1 < nch ? chunk : len - (i) * chunk)
    for (size_t i = 0; i < nch && i < STAGE_DEPTH && rc == CFX_OK; i++)
        rc = stage_one(st, SLOT(i), (const char *)dev + i * chunk, CLEN(i), i);
    for (size_t i = 0; i < nch && rc == CFX_OK; i++) {
        cudaError_t err = cudaEventSynchronize(st->ev[i % STAGE_DEPTH]);
        if (err != cudaSuccess) {
            rc = cfx__cuda_status(err, "cuda staging: waiting for a chunk");
            break;
        }
        /* chunk i is in host memory; chunk i+1's copy runs meanwhile */
        if (fn && (rc = fn(arg, SLOT(i), i * chunk, CLEN(i))) != CFX_OK)
            break;
        /* its slot and event are free again */
        if (i + STAGE_DEPTH < nch)
            rc = stage_one(st, SLOT(i + STAGE_DEPTH), (const char *)dev + (i + STAGE_DEPTH) * chunk,
                           CLEN(i + STAGE_DEPTH), i + STAGE_DEPTH);
    }
#undef SLOT
#undef CLEN
    if (rc != CFX_OK)
        cudaStreamSynchronize(st->stream); /* leave nothing in flight */
    return rc;
}

int cfx__cuda_stager_h2d(struct cfx__cuda_stager *st, void *dev, const void *host, size_t len)
{
    if (!st || (len && (!dev || !host)))
        return cfx__err(CFX_ERR_INVALID, "cuda staging: NULL argument");
    if (!len)
        return CFX_OK;
    return cfx__cuda_status(cudaMemcpyAsync(dev, host, len, cudaMemcpyHostToDevice, st->stream),
                            "cuda staging: host to device copy");
}

int cfx__cuda_stager_query(struct cfx__cuda_stager *st)
{
    if (!st)
        return cfx__err(CFX_ERR_INVALID, "cuda staging: NULL stager");
    cudaError_t err = cudaStreamQuery(st->stream);
    if (err == cudaErrorNotReady)
        return CFX_ERR_AGAIN; /* not an error: nothing to record */
    return cfx__cuda_status(err, "cuda staging: copy");
}

int cfx__cuda_stager_wait(struct cfx__cuda_stager *st)
{
    if (!st)
        return cfx__err(CFX_ERR_INVALID, "cuda staging: NULL stager");
    return cfx__cuda_status(cudaStreamSynchronize(st->stream), "cuda staging: copy");
}

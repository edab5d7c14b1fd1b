/*
 * The CUDA memory type: probing the driver once, pointer detection, device
 * and pinned allocations, copies, and the table entry gpu/memtype.c uses.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cfx_cuda.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "gpu/memtype.h"

/* ---- probing ----------------------------------------------------------------- */

static struct {
    pthread_once_t once;
    enum cfx__cuda_state state;
    int ndev;
    int driver_version; /* cudaDriverGetVersion: 13000 for 13.0; 0 without a driver */
    int runtime_version;
    const char *why;
} probe = { .once = PTHREAD_ONCE_INIT };

static void probe_once(void)
{
    int n = 0;

    cudaRuntimeGetVersion(&probe.runtime_version);
    /* cuDriverGetVersion works without cuInit and says 0 when there is no
     * driver to ask; cudaGetDeviceCount then loads and initializes it. */
    if (cudaDriverGetVersion(&probe.driver_version) != cudaSuccess)
        probe.driver_version = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError(); /* none of these errors is sticky */
    if (err == cudaSuccess && n > 0) {
        probe.state = CFX__CUDA_READY;
        probe.ndev = n;
        probe.why = "";
    } else if (err == cudaSuccess || err == cudaErrorNoDevice) {
        probe.state = CFX__CUDA_NO_DEVICE;
        probe.why = "no CUDA device";
    } else if (err == cudaErrorInsufficientDriver && probe.driver_version > 0) {
        probe.state = CFX__CUDA_OLD_DRIVER;
        probe.why = "CUDA driver older than the runtime";
    } else if (err == cudaErrorInsufficientDriver || probe.driver_version == 0) {
        probe.state = CFX__CUDA_NO_DRIVER;
        probe.why = "no CUDA driver";
    } else {
        probe.state = CFX__CUDA_BROKEN;
        probe.why = cudaGetErrorString(err);
    }
    CFX_LOG(DEBUG, GPU, "cuda probe: %s (%d devices, driver %d, runtime %d, %s)",
            probe.state == CFX__CUDA_READY ? "ready" : probe.why, probe.ndev,
            probe.driver_version, probe.runtime_version, cudaGetErrorName(err));
}

enum cfx__cuda_state cfx__cuda_probe(int *ndev, const char **why)
{
    pthread_once(&probe.once, probe_once);
    if (ndev)
        *ndev = probe.ndev;
    if (why)
        *why = probe.why;
    return probe.state;
}

int cfx__cuda_available(void)
{
    return cfx__cuda_probe(NULL, NULL) == CFX__CUDA_READY;
}

int cfx__cuda_describe(char *buf, size_t len)
{
    const char *why;
    int ndev;
    size_t n;

    if (!buf || !len)
        return 0;
    if (cfx__cuda_probe(&ndev, &why) != CFX__CUDA_READY) {
        if (probe.state == CFX__CUDA_OLD_DRIVER)
            return snprintf(buf, len, "absent (%s: driver %d.%d, runtime %d.%d)", why,
                            probe.driver_version / 1000, probe.driver_version % 1000 / 10,
                            probe.runtime_version / 1000, probe.runtime_version % 1000 / 10);
        return snprintf(buf, len, "absent (%s)", why);
    }
    n = (size_t)snprintf(buf, len, "cuda: %d device%s (", ndev, ndev == 1 ? "" : "s");
    for (int d = 0; d < ndev && n < len; d++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
            (void)cudaGetLastError();
            n += (size_t)snprintf(buf + n, len - n, "%s?", d ? ", " : "");
            continue;
        }
        n += (size_t)snprintf(buf + n, len - n, "%s%s sm_%d%d", d ? ", " : "", p.name, p.major,
                              p.minor);
    }
    if (n < len)
        n += (size_t)snprintf(buf + n, len - n, "), driver %d.%d", probe.driver_version / 1000,
                              probe.driver_version % 1000 / 10);
    return (int)n;
}

int cfx__cuda_status(int cuda_err, const char *what)
{
    cudaError_t e = (cudaError_t)cuda_err;
    int status;

    if (e == cudaSuccess)
        return CFX_OK;
    switch (e) {
    case cudaErrorMemoryAllocation:
        status = CFX_ERR_NOMEM;
        break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
        status = CFX_ERR_INVALID;
        break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
        status = CFX_ERR_NO_DEVICE;
        break;
    case cudaErrorNotSupported:
        status = CFX_ERR_UNSUPPORTED;
        break;
    case cudaErrorNotReady:
        status = CFX_ERR_AGAIN;
        break;
    default:
        status = CFX_ERR_IO;
        break;
    }
    /* Sticky errors (a faulting kernel) stay; the rest must not be blamed
     * on the next call. */
    (void)cudaGetLastError();
    return cfx__err(status, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* CFX_OK when CUDA is usable, else CFX_ERR_NO_DEVICE naming why and what. */
static int need_cuda(const char *what)
{
    const char *why;

    if (cfx__cuda_probe(NULL, &why) == CFX__CUDA_READY)
        return CFX_OK;
    return cfx__err(CFX_ERR_NO_DEVICE, "%s: CUDA is not usable here (%s)", what, why);
}

/* ---- pointers, allocations, copies ----------------------------------------- */

int cfx__cuda_ptr_is_device(const void *ptr, int *is_dev, int *device)
{
    struct cudaPointerAttributes a;
    int rc = need_cuda("cuda pointer query");

    if (rc != CFX_OK)
        return rc;
    cudaError_t err = cudaPointerGetAttributes(&a, ptr);
    if (err != cudaSuccess) {
        /* Older drivers said "invalid value" for memory they do not know:
         * that is host memory. */
        (void)cudaGetLastError();
        *is_dev = 0;
        return CFX_OK;
    }
    *is_dev = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    if (device)
        *device = a.device;
    return CFX_OK;
}

int cfx__cuda_host_alloc(size_t len, void **out)
{
    int rc = need_cuda("pinned host allocation");

    if (rc != CFX_OK)
        return rc;
    cudaError_t err = cudaHostAlloc(out, len ? len : 1, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
        *out = NULL;
        return cfx__cuda_status(err, "cudaHostAlloc");
    }
    return CFX_OK;
}

void cfx__cuda_host_free(void *ptr)
{
    if (ptr && cudaFreeHost(ptr) != cudaSuccess) {
        CFX_LOG(WARN, GPU, "cudaFreeHost(%p): %s", ptr, cudaGetErrorString(cudaGetLastError()));
    }
}

int cfx__cuda_dev_alloc(size_t len, void **out)
{
    int rc = need_cuda("device allocation");

    if (rc != CFX_OK)
        return rc;
    cudaError_t err = cudaMalloc(out, len ? len : 1);
    if (err != cudaSuccess) {
        *out = NULL;
        return cfx__cuda_status(err, "cudaMalloc");
    }
    return CFX_OK;
}

void cfx__cuda_dev_free(void *ptr)
{
    if (ptr && cudaFree(ptr) != cudaSuccess) {
        CFX_LOG(WARN, GPU, "cudaFree(%p): %s", ptr, cudaGetErrorString(cudaGetLastError()));
    }
}

int cfx__cuda_copy(void *dst, const void *src, size_t len, void *stream)
{
    cudaError_t err;
    int rc = need_cuda("cuda copy");

    if (rc != CFX_OK)
        return rc;
    if (!len)
        return CFX_OK;
    if (stream)
        err = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, (cudaStream_t)stream);
    else
        err = cudaMemcpy(dst, src, len, cudaMemcpyDefault);
    return cfx__cuda_status(err, "cudaMemcpy");
}

int cfx__cuda_stream_sync(void *stream)
{
    int rc = need_cuda("cuda stream synchronize");

    if (rc != CFX_OK)
        return rc;
    return cfx__cuda_status(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

/* ---- reductions -------------------------------------------------------------- */

/* Whether the device can read (and write) memory at @p ptr: device or
 * managed memory, or pinned host memory mapped into the device's space.
 * Pageable host memory would fault the kernel and poison the context. */
static int device_reachable(const void *ptr, const char *which)
{
    struct cudaPointerAttributes a;
    cudaError_t err = cudaPointerGetAttributes(&a, ptr);

    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ||
        (a.type == cudaMemoryTypeHost && a.devicePointer == ptr))
        return CFX_OK;
    return cfx__err(CFX_ERR_INVALID, "cuda reduce: %s %p is %s memory the device cannot reach "
                    "(use device, managed or pinned host memory)", which, ptr,
                    a.type == cudaMemoryTypeHost ? "pinned host" : "pageable host");
}

int cfx__cuda_reduce3(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                      enum cfx_redop op, void *stream)
{
    int rc;

    if ((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST)
        return cfx__err(CFX_ERR_INVALID, "cuda reduce: unknown dtype %d or op %d", (int)dtype,
                        (int)op);
    if (!count)
        return CFX_OK;
    if (!dst || !a || !b)
        return cfx__err(CFX_ERR_INVALID, "cuda reduce: NULL %s", !dst ? "dst" : !a ? "a" : "b");
    if ((rc = need_cuda("cuda reduce")) != CFX_OK)
        return rc;
    if ((rc = device_reachable(dst, "dst")) != CFX_OK ||
        (a != dst && (rc = device_reachable(a, "a")) != CFX_OK) ||
        (b != dst && b != a && (rc = device_reachable(b, "b")) != CFX_OK))
        return rc;
    return cfx__cuda_reduce3_launch(dst, a, b, count, dtype, op, stream);
}

/* ---- the memory-type entry -------------------------------------------------- */

static int mt_detect(const void *ptr, size_t len, int *is_mine)
{
    return cfx__cuda_ptr_is_device(ptr, is_mine, NULL);
}

static int mt_reduce(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                     enum cfx_redop op, void *stream)
{
    return cfx__cuda_reduce3(dst, a, b, count, dtype, op, stream);
}

static int mt_stream_create(void **out)
{
    int rc = need_cuda("cuda stream creation");
    cudaStream_t s;

    if (rc != CFX_OK)
        return rc;
    rc = cfx__cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                          "cudaStreamCreateWithFlags");
    *out = rc == CFX_OK ? (void *)s : NULL;
    return rc;
}

static void mt_stream_destroy(void *stream)
{
    /* cudaStreamDestroy returns at once; the queued work is ours to wait for */
    cudaError_t e1 = cudaStreamSynchronize((cudaStream_t)stream);
    cudaError_t e2 = cudaStreamDestroy((cudaStream_t)stream);
    if (e1 != cudaSuccess || e2 != cudaSuccess)
        CFX_LOG(WARN, GPU, "cuda stream %p: %s", stream,
                cudaGetErrorString(e1 != cudaSuccess ? e1 : e2));
    (void)cudaGetLastError();
}

static int mt_wait_default(void *stream)
{
    cudaEvent_t ev;
    int rc = need_cuda("cuda stream wait");

    if (rc != CFX_OK)
        return rc;
    rc = cfx__cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                          "cudaEventCreateWithFlags");
    if (rc != CFX_OK)
        return rc;
    /* recorded on the legacy stream, the event completes after the work
     * queued there and on the blocking streams before it */
    rc = cfx__cuda_status(cudaEventRecord(ev, (cudaStream_t)0), "cudaEventRecord");
    if (rc == CFX_OK)
        rc = cfx__cuda_status(cudaStreamWaitEvent((cudaStream_t)stream, ev, 0),
                              "cudaStreamWaitEvent");
    cudaEventDestroy(ev); /* released once the wait is satisfied */
    return rc;
}

static int mt_get_device(int *out)
{
    int rc = need_cuda("cudaGetDevice");

    if (rc != CFX_OK)
        return rc;
    return cfx__cuda_status(cudaGetDevice(out), "cudaGetDevice");
}

static int mt_set_device(int dev)
{
    int cur = -1, rc = need_cuda("cudaSetDevice");

    if (rc != CFX_OK)
        return rc;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == dev)
        return CFX_OK;
    (void)cudaGetLastError();
    return cfx__cuda_status(cudaSetDevice(dev), "cudaSetDevice");
}

const struct cfx_memtype_ops cfx__memtype_cuda_ops = {
    .type = CFX_MEMTYPE_CUDA,
    .name = "cuda",
    .available = cfx__cuda_available,
    .detect = mt_detect,
    .copy = cfx__cuda_copy,
    .alloc = cfx__cuda_dev_alloc,
    .free_buf = cfx__cuda_dev_free,
    .reduce = mt_reduce,
    .sync = cfx__cuda_stream_sync,
    .stream_create = mt_stream_create,
    .stream_destroy = mt_stream_destroy,
    .wait_default = mt_wait_default,
    .describe = cfx__cuda_describe,
    .get_device = mt_get_device,
    .set_device = mt_set_device,
};

/*
 * Driver API entry points for GPUDirect RDMA, fetched through the runtime
 * (cudaGetDriverEntryPointByVersion) so that nothing links libcuda.so: the
 * runtime has already opened the driver by the time these are wanted, and
 * on a host without one they simply report "unsupported".
 */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cfx_cuda.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

/* The ABI version we ask the driver for: these calls exist unchanged since
 * CUDA 11.7 (cuMemGetHandleForAddressRange is the youngest). */
#define DRV_ABI_VERSION 12000

typedef CUresult (*get_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
typedef CUresult (*get_handle_fn)(void *handle, CUdeviceptr ptr, size_t size,
                                  CUmemRangeHandleType type, unsigned long long flags);
typedef CUresult (*set_attr_fn)(const void *value, CUpointer_attribute attr, CUdeviceptr ptr);
typedef CUresult (*dev_attr_fn)(int *value, CUdevice_attribute attr, CUdevice dev);
typedef CUresult (*err_str_fn)(CUresult err, const char **str);

static struct {
    pthread_once_t once;
    get_range_fn get_range;   /* cuMemGetAddressRange */
    get_handle_fn get_handle; /* cuMemGetHandleForAddressRange */
    set_attr_fn set_attr;     /* cuPointerSetAttribute */
    dev_attr_fn dev_attr;     /* cuDeviceGetAttribute */
    err_str_fn err_str;       /* cuGetErrorString */
} drv = { .once = PTHREAD_ONCE_INIT };

static void *entry(const char *name)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;

    if (cudaGetDriverEntryPointByVersion(name, &fn, DRV_ABI_VERSION, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        CFX_LOG(DEBUG, GPU, "cuda driver: no entry point %s", name);
        return NULL;
    }
    return fn;
}

static void drv_once(void)
{
    if (!cfx__cuda_available())
        return;
    drv.get_range = (get_range_fn)entry("cuMemGetAddressRange");
    drv.get_handle = (get_handle_fn)entry("cuMemGetHandleForAddressRange");
    drv.set_attr = (set_attr_fn)entry("cuPointerSetAttribute");
    drv.dev_attr = (dev_attr_fn)entry("cuDeviceGetAttribute");
    drv.err_str = (err_str_fn)entry("cuGetErrorString");
}

static const char *drv_strerror(CUresult r)
{
    const char *s = NULL;

    if (drv.err_str && drv.err_str(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA driver error";
}

int cfx__cuda_dmabuf_fd(const void *ptr, size_t len, int *fd, uint64_t *offset)
{
    CUdeviceptr base = 0;
    size_t size = 0;
    int is_dev = 0, device = 0, supported = 0, rc;
    CUresult r;

    if (!ptr || !len || !fd || !offset)
        return cfx__err(CFX_ERR_INVALID, "cuda dma-buf: NULL argument or empty range");
    pthread_once(&drv.once, drv_once);
    if (!drv.get_range || !drv.get_handle || !drv.dev_attr)
        return cfx__err(CFX_ERR_UNSUPPORTED, "cuda dma-buf: the CUDA driver has no "
                        "cuMemGetHandleForAddressRange (needs 11.7 or later)");
    rc = cfx__cuda_ptr_is_device(ptr, &is_dev, &device);
    if (rc != CFX_OK)
        return rc;
    if (!is_dev)
        return cfx__err(CFX_ERR_INVALID, "cuda dma-buf: %p is not device memory", ptr);
    r = drv.dev_attr(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, (CUdevice)device);
    if (r != CUDA_SUCCESS || !supported)
        return cfx__err(CFX_ERR_UNSUPPORTED, "cuda dma-buf: device %d cannot export dma-bufs%s%s",
                        device, r != CUDA_SUCCESS ? ": " : "",
                        r != CUDA_SUCCESS ? drv_strerror(r) : "");

    /* The handle covers whole allocations, page aligned; the registration
     * then names the offset of the caller's range inside it. */
    r = drv.get_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        return cfx__err(CFX_ERR_INVALID, "cuda dma-buf: cuMemGetAddressRange(%p): %s", ptr,
                        drv_strerror(r));
    if ((uintptr_t)ptr + len > base + size)
        return cfx__err(CFX_ERR_INVALID, "cuda dma-buf: [%p, +%zu) crosses the end of its "
                        "allocation (%zu bytes)", ptr, len, size);
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    CUdeviceptr abase = base & ~(CUdeviceptr)(pg - 1);
    size_t alen = (size_t)(((base + size + pg - 1) & ~(CUdeviceptr)(pg - 1)) - abase);
    int handle = -1;
    r = drv.get_handle(&handle, abase, alen, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS || handle < 0)
        return cfx__err(r == CUDA_ERROR_NOT_SUPPORTED ? CFX_ERR_UNSUPPORTED : CFX_ERR_IO,
                        "cuda dma-buf: cuMemGetHandleForAddressRange(%#llx, %zu): %s",
                        (unsigned long long)abase, alen, drv_strerror(r));
    *fd = handle;
    *offset = (uint64_t)((uintptr_t)ptr - abase);
    return CFX_OK;
}

int cfx__cuda_set_sync_memops(const void *ptr)
{
    unsigned int one = 1;

    pthread_once(&drv.once, drv_once);
    if (!drv.set_attr)
        return cfx__err(CFX_ERR_UNSUPPORTED, "cuda: the driver has no cuPointerSetAttribute");
    CUresult r = drv.set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        return cfx__err(CFX_ERR_IO, "cuda: SYNC_MEMOPS on %p: %s", ptr, drv_strerror(r));
    return CFX_OK;
}

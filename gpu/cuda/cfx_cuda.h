/*
 * The CUDA side of conflux, private: probing the driver, the CUDA memory
 * type's operations, pinned staging buffers, chunked staging with streams
 * and events, device reduction kernels and the driver entry points that
 * GPUDirect RDMA registration needs.  Built only with CFX_HAVE_CUDA.
 *
 * Loading: the CUDA runtime is linked statically (libcudart_static) and
 * opens the driver (libcuda.so.1) at its first call, so the library loads
 * and runs on a host without a driver.  Nothing here is called before
 * someone asks for CUDA: probing happens once, on first use, and its verdict
 * ("no CUDA driver", "no CUDA device", "N devices") is kept for the life of
 * the process.  A process that probes CUDA and then forks must not use CUDA
 * in the child (a CUDA rule, not ours).
 *
 * Thread safety: every function may be called from any thread.  A stager
 * (struct cfx__cuda_stager) is used by one thread at a time.
 */
#ifndef CFX_GPU_CUDA_H
#define CFX_GPU_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <conflux/reduce.h>
#include <conflux/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- probing ----------------------------------------------------------- */

enum cfx__cuda_state {
    CFX__CUDA_READY = 0,   /* driver loaded, at least one device */
    CFX__CUDA_NO_DRIVER,   /* libcuda.so.1 missing (or unusable) */
    CFX__CUDA_OLD_DRIVER,  /* a driver older than the runtime we link */
    CFX__CUDA_NO_DEVICE,   /* driver loaded, no device visible */
    CFX__CUDA_BROKEN,      /* any other initialization failure */
};

/*
 * Probe CUDA once per process (later calls return the kept verdict).
 * @param ndev  set to the number of visible devices (0 unless READY); may be NULL
 * @param why   set to a static reason string when not READY ("no CUDA driver",
 *              ...), "" when READY; may be NULL
 */
enum cfx__cuda_state cfx__cuda_probe(int *ndev, const char **why);

/* 1 when CUDA is usable in this process (probe is READY). */
int cfx__cuda_available(void);

/*
 * One line for configuration dumps and rdmactl: "cuda: 2 devices (NVIDIA
 * H200 sm_90, ...), driver 13.0" or "absent (no CUDA driver)".  Always
 * NUL-terminates when @p len > 0; returns snprintf's count.
 */
int cfx__cuda_describe(char *buf, size_t len);

/*
 * Translate a cudaError_t (as int) at the boundary: records "@p what: <CUDA
 * error name>: <text>" as the thread's error detail and returns the status.
 * cudaSuccess gives CFX_OK.  Clears CUDA's sticky "last error" for
 * non-sticky errors so that later calls are not blamed.
 */
int cfx__cuda_status(int cuda_err, const char *what);

/* ---- the memory type ------------------------------------------------------ */

/*
 * Whether @p ptr is device-accessible CUDA memory: device or managed memory
 * (*is_dev = 1, *device = its ordinal), else 0 (host memory, pinned or not).
 * CFX_OK; CFX_ERR_NO_DEVICE when CUDA is unavailable.
 */
int cfx__cuda_ptr_is_device(const void *ptr, int *is_dev, int *device);

/* Pinned (page-locked, portable, device-mapped) host memory for staging.
 * CFX_ERR_NOMEM / CFX_ERR_NO_DEVICE; release with cfx__cuda_host_free(). */
int cfx__cuda_host_alloc(size_t len, void **out);
void cfx__cuda_host_free(void *ptr); /* NULL is a no-op */

/* Device memory on the current device; release with cfx__cuda_dev_free(). */
int cfx__cuda_dev_alloc(size_t len, void **out);
void cfx__cuda_dev_free(void *ptr); /* NULL is a no-op */

/*
 * Copy between any two of host/device memory (cudaMemcpyDefault).  @p stream
 * (a cudaStream_t) NULL: cudaMemcpy, so @p src may be reused on return and a
 * copy to the host has landed; a copy from pageable host memory to the
 * device may still be on its way (CUDA's synchronous-copy rules), ordered
 * before later work on the legacy default stream and the streams that
 * synchronize with it, not before work on a non-blocking stream.
 * Otherwise queued on the stream; the caller synchronizes.
 */
int cfx__cuda_copy(void *dst, const void *src, size_t len, void *stream);

/*
 * Block until the work queued on @p stream (a cudaStream_t; NULL: the
 * legacy default stream) is done (cudaStreamSynchronize).  CFX_OK, the
 * status of a failed operation, CFX_ERR_NO_DEVICE.
 */
int cfx__cuda_stream_sync(void *stream);

/* ---- chunked staging ------------------------------------------------------- */

/*
 * A stager owns a non-blocking stream on one device and a small ring of
 * events, for the engine's staging path: device objects travel through
 * pinned host memory, with the copy of chunk i+1 in flight while chunk i is
 * sent (put) or with chunks copied to the device as they land (get).
 */
struct cfx__cuda_stager;

/* A stager for memory of @p device (-1: the device of the calling thread). */
int cfx__cuda_stager_create(int device, struct cfx__cuda_stager **out);
void cfx__cuda_stager_destroy(struct cfx__cuda_stager *st); /* waits for its copies; NULL ok */
void *cfx__cuda_stager_stream(struct cfx__cuda_stager *st); /* its cudaStream_t */

/*
 * Called once per staged chunk, in order, on the calling thread: @p host
 * holds bytes [off, off + len) of the object.  With a ring (below) the
 * slot is reused after the callback returns, so consume or copy it before
 * returning.  A non-CFX_OK return stops the staging and is returned.
 */
typedef int (*cfx__cuda_chunk_fn)(void *arg, void *host, size_t off, size_t len);

/*
 * Device -> host, chunk by chunk, the copy of chunk i+1 in flight while
 * @p fn handles chunk i (double buffering).
 *
 * @param host, host_len  pinned host memory (cfx__cuda_host_alloc or
 *        registered).  host_len >= len: chunk i lands at host + off and
 *        stays there.  Otherwise a ring of host_len / chunk slots (at least
 *        2) that chunks take in turn.
 * @param fn  may be NULL (just copy; then host_len must be >= len)
 * @return CFX_OK, the callback's status, or a CUDA error's status; on error
 *         no copy of this call is still in flight.
 */
int cfx__cuda_stage_to_host(struct cfx__cuda_stager *st, void *host, size_t host_len,
                            const void *dev, size_t len, size_t chunk, cfx__cuda_chunk_fn fn,
                            void *arg);

/*
 * Host -> device, asynchronous, for chunks as they land: queue the copy of
 * [off, off + len) from @p host to @p dev on the stager's stream and return
 * at once.  The host bytes must stay put until cfx__cuda_stager_wait() (or a
 * query that says done).
 */
int cfx__cuda_stager_h2d(struct cfx__cuda_stager *st, void *dev, const void *host, size_t len);

/* CFX_OK when every copy queued so far is done, CFX_ERR_AGAIN while some
 * run, or the status of a failed copy.  Never blocks. */
int cfx__cuda_stager_query(struct cfx__cuda_stager *st);

/* Block until every queued copy is done; its status. */
int cfx__cuda_stager_wait(struct cfx__cuda_stager *st);

/* ---- reduction kernels ------------------------------------------------------- */

/*
 * dst[i] = a[i] op b[i] on the GPU, with the exact semantics of cfx_reduce3()
 * (docs/REDUCTION.md) except that the NaN produced by a sum or product is
 * the device's (NaN-ness matches; bits are unspecified there as on the CPU).
 *
 * All three pointers must be device-accessible: device or managed memory,
 * or pinned host memory (read over the bus).  dst may equal a or b.
 * @param stream  a cudaStream_t: the kernel is queued on it and the call
 *        returns; NULL: the legacy default stream, and the call returns
 *        when the result is in place.
 * @return CFX_OK; CFX_ERR_INVALID (unknown dtype/op, NULL with count > 0,
 *         memory the device cannot reach); CFX_ERR_NO_DEVICE; a CUDA
 *         error's status.
 */
int cfx__cuda_reduce3(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                      enum cfx_redop op, void *stream);

/* The launcher without the pointer checks (cfx__cuda_reduce3 after its
 * checks; benchmarks).  gpu/cuda/cuda_reduce.cu. */
int cfx__cuda_reduce3_launch(void *dst, const void *a, const void *b, size_t count,
                             enum cfx_dtype dtype, enum cfx_redop op, void *stream);

/* ---- GPUDirect RDMA support (driver entry points) ---------------------------- */

/*
 * A dma-buf file descriptor for the CUDA allocation that holds
 * [ptr, ptr + len), from cuMemGetHandleForAddressRange: *fd covers the whole
 * allocation and *offset is where @p ptr sits in it.  The caller closes
 * *fd (a registration keeps its own reference to the dma-buf).
 * CFX_ERR_UNSUPPORTED when the driver or device cannot export dma-bufs.
 */
int cfx__cuda_dmabuf_fd(const void *ptr, size_t len, int *fd, uint64_t *offset);

/*
 * Ask the driver to make every memory operation on @p ptr's allocation
 * synchronous (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS), as GPUDirect RDMA needs
 * for a NIC's writes to be ordered with cudaMemcpy.  CFX_OK or a status.
 */
int cfx__cuda_set_sync_memops(const void *ptr);

#ifdef __cplusplus
}
#endif
#endif

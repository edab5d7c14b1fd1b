/*
 * Memory types: one ops table per kind of memory the data plane can touch
 * (host, CUDA), after perftest's memory_ctx.  Callers ask the table instead
 * of testing for CUDA themselves, so a CPU-only build differs only in which
 * entries exist.
 *
 * The host entry always exists.  The CUDA entry exists when the library is
 * built with CUDA (CFX_HAVE_CUDA, sources in gpu/cuda/); without it every
 * CUDA request fails with CFX_ERR_UNSUPPORTED ("built without CUDA").
 *
 * Every function here may be called from any thread.
 */
#ifndef CFX_GPU_MEMTYPE_H
#define CFX_GPU_MEMTYPE_H

#include <pthread.h>
#include <stddef.h>
#include <conflux/mem.h>
#include <conflux/reduce.h>

struct cfx_memtype_ops {
    enum cfx_memtype type; /* the slot this entry fills */
    const char *name;      /* "host", "cuda" */

    /* 1 when this memory type can be used in this process (a device is
     * present and the driver loads), else 0.  May be slow the first time. */
    int (*available)(void);

    /* Whether [ptr, ptr+len) is memory of this type: sets *is_mine to 1 or
     * 0 and returns CFX_OK, or a status when the question cannot be
     * answered.  NULL for host, the type of anything no other entry claims. */
    int (*detect)(const void *ptr, size_t len, int *is_mine);

    /* Copy @p len bytes between memory of this type and host memory (or
     * within this type).  @p stream: a device stream, NULL for a synchronous
     * copy that is complete when the call returns. */
    int (*copy)(void *dst, const void *src, size_t len, void *stream);

    /* Allocate @p len bytes of this type, page aligned, for tools and tests;
     * release with free_buf().  The data plane itself uses caller memory. */
    int (*alloc)(size_t len, void **out);
    void (*free_buf)(void *ptr); /* NULL is a no-op */

    /* dst[i] = a[i] op b[i] with cfx_reduce3()'s semantics, where dst is
     * memory of this type and a, b are memory it can read (for CUDA: device,
     * managed or pinned host memory).  @p stream as for copy(): NULL
     * returns with the result in place; otherwise queued on the stream.
     * NULL entry: the type cannot reduce (use cfx_reduce3 on host copies). */
    int (*reduce)(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                  enum cfx_redop op, void *stream);

    /* Block until the work queued on @p stream (copies, reductions and the
     * caller's own) is done; NULL: the type's default stream (for CUDA the
     * legacy stream 0).  NULL entry: nothing is ever queued (host). */
    int (*sync)(void *stream);

    /* A stream of this type of its own, for work that must not queue behind
     * the application's on the default stream (for CUDA a non-blocking
     * stream); stream_destroy() waits for the work queued on it.  NULL
     * entries: the type queues nothing (host). */
    int (*stream_create)(void **out);
    void (*stream_destroy)(void *stream); /* NULL stream is a no-op */

    /* Make @p stream wait (without blocking the caller) for the work queued
     * so far on the default stream, which for CUDA's legacy stream means
     * also the work of every blocking stream before it.  NULL entry: the
     * type queues nothing (host). */
    int (*wait_default)(void *stream);

    /* The device line of cfx__gpu_describe(); NULL for host. */
    int (*describe)(char *buf, size_t len);

    /* The calling thread's current device (for CUDA cudaGetDevice), and
     * making one current (cudaSetDevice): work handed to another thread
     * (a worker, the group's thread) runs on the device of the thread that
     * posted it.  NULL entries: the type has no devices (host). */
    int (*get_device)(int *out);
    int (*set_device)(int dev);
};

#ifdef CFX_HAVE_CUDA
extern const struct cfx_memtype_ops cfx__memtype_cuda_ops; /* gpu/cuda/ */
#endif

/*
 * Put @p ops in the slot of its type, for the whole process (gpu/sim.c puts
 * the simulated device in the CUDA slot this way).  Test processes only,
 * before any other thread touches memory types: nothing guards the table.
 */
void cfx__memtype_replace(const struct cfx_memtype_ops *ops);

/* The entry of @p type, or NULL when this build has none (CUDA without
 * CUDA) or @p type is out of range. */
const struct cfx_memtype_ops *cfx__memtype_ops(enum cfx_memtype type);

/* 1 when @p type is built in and usable in this process, else 0. */
int cfx__memtype_available(enum cfx_memtype type);

/*
 * Memory type of the buffer at @p ptr: asks each available non-host entry,
 * host when none claims it.
 * @return CFX_OK; CFX_ERR_INVALID for NULL @p ptr or @p out.
 */
int cfx__memtype_detect(const void *ptr, enum cfx_memtype *out);

/*
 * Copy @p len bytes from @p src (of type @p st) to @p dst (of type @p dt),
 * synchronously.  Host to host is memcpy(); any copy that involves a device
 * type goes through that type's entry.
 * @return CFX_OK; CFX_ERR_INVALID (NULL pointer with len > 0, type out of
 *         range); CFX_ERR_UNSUPPORTED when a type is not built in or the
 *         pair crosses two different device types.
 */
int cfx__memcpy_typed(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                      size_t len);

/*
 * As cfx__memcpy_typed(), queued on @p stream (a stream of the device type
 * involved; NULL: synchronous).  With a stream the copy may still run when
 * the call returns: cfx__memtype_sync() before touching either buffer.
 * Host to host ignores @p stream (memcpy).
 */
int cfx__memcpy_typed_async(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                            size_t len, void *stream);

/*
 * Wait for the work queued on @p stream of memory type @p type (NULL: its
 * default stream).  CFX_OK at once for host.
 * @return CFX_OK; CFX_ERR_UNSUPPORTED when @p type is not built in; the
 *         status of a failed queued operation.
 */
int cfx__memtype_sync(enum cfx_memtype type, void *stream);

/*
 * Whether buffers of @p type can be used in this process, with the reason
 * when not, for argument checks: CFX_OK for host and for a usable device
 * type; CFX_ERR_UNSUPPORTED "@p what: cuda memory: conflux was built without
 * CUDA"; CFX_ERR_NO_DEVICE "@p what: cuda memory: no usable device here:
 * gpu absent (no CUDA driver)" (the cfx__gpu_describe() line);
 * CFX_ERR_INVALID for a type out of range.  The message goes to
 * cfx_last_error().
 */
int cfx__memtype_require(enum cfx_memtype type, const char *what);

/*
 * dst[i] = a[i] op b[i] by the entry of @p dt, the memory type of @p dst:
 * cfx_reduce3() for host, the device kernels for CUDA (gpu/cuda/).
 * @p stream: NULL for a synchronous reduction, else a stream of that type
 * (cudaStream_t) the work is queued on.
 * @return as cfx_reduce3(); CFX_ERR_UNSUPPORTED when @p dt is not built in.
 */
int cfx__memtype_reduce3(enum cfx_memtype dt, void *dst, const void *a, const void *b,
                         size_t count, enum cfx_dtype dtype, enum cfx_redop op, void *stream);

/*
 * GPU support of this process, in one line, for the effective configuration
 * ("gpu = ...") and `rdmactl devices`: "cuda: 1 device (NVIDIA H200 sm_90),
 * driver 13.0", "absent (no CUDA driver)", "absent (no CUDA device)" or
 * "absent (built without CUDA)".  Probes CUDA on first call (see
 * gpu/cuda/cfx_cuda.h about fork).  Always NUL-terminates when @p len > 0.
 * @return the length of the full line (as snprintf).
 */
int cfx__gpu_describe(char *buf, size_t len);

/*
 * A stream of @p type of its own (see stream_create above); *out is NULL for
 * host, whose work never queues.  CFX_ERR_UNSUPPORTED when @p type is not
 * built in; CFX_ERR_NO_DEVICE; a device error's status.
 */
int cfx__memtype_stream_create(enum cfx_memtype type, void **out);
void cfx__memtype_stream_destroy(enum cfx_memtype type, void *stream); /* NULL ok */

/* Order @p stream of @p type after the work queued so far on the type's
 * default stream (see wait_default above); CFX_OK at once for host. */
int cfx__memtype_wait_default(enum cfx_memtype type, void *stream);

/*
 * A stream of @p type kept in *@p slot, made on first use, then ordered
 * after the work queued so far on the default stream (the caller's kernels
 * there): the stream of data-plane copies that have no stream of the
 * caller's.  @p lock (may be NULL when one thread owns the slot) guards
 * *@p slot; the stream is made outside it, since a first CUDA call can be
 * slow.  The slot's owner destroys the stream.  *@p out is the stream.
 */
int cfx__memtype_stream_for(enum cfx_memtype type, void **slot, pthread_mutex_t *lock,
                            void **out);

/*
 * The calling thread's current device of @p type in *@p out (-1 for host),
 * to hand to cfx__memtype_set_device() on the thread that does the work:
 * streams, scratch and kernel launches belong to the current device, and a
 * new thread's is device 0 whatever the application chose.
 * @return CFX_OK; CFX_ERR_UNSUPPORTED / CFX_ERR_NO_DEVICE; a device error's.
 */
int cfx__memtype_device(enum cfx_memtype type, int *out);

/* Make @p dev (from cfx__memtype_device()) the calling thread's current
 * device of @p type; CFX_OK at once for a @p dev below 0. */
int cfx__memtype_set_device(enum cfx_memtype type, int dev);

/* cfx__memcpy_typed_async() on @p stream, then wait for that stream. */
int cfx__memcpy_typed_wait(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                           size_t len, void *stream);

/* Allocate / free @p len bytes of @p type through its entry (tools, tests).
 * CFX_ERR_UNSUPPORTED when the type is not built in; CFX_ERR_NOMEM. */
int cfx__memtype_alloc(enum cfx_memtype type, size_t len, void **out);
void cfx__memtype_free(enum cfx_memtype type, void *ptr);

#endif

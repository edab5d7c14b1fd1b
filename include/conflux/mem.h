/*
 * Memory types and registration.
 *
 * Every buffer the data plane touches carries a memory type so that device
 * memory (CUDA) slots in beside host memory without changing any call.
 */
#ifndef CONFLUX_MEM_H
#define CONFLUX_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;

enum cfx_memtype {
    CFX_MEMTYPE_HOST = 0,   /* ordinary process memory */
    CFX_MEMTYPE_CUDA = 1,   /* CUDA device memory */
    CFX_MEMTYPE_LAST
};

/** Name of a memory type ("host", "cuda"). */
CFX_API const char *cfx_memtype_name(enum cfx_memtype type);

/**
 * Allocate @p size bytes from the context's registered arena.
 *
 * Arena memory is registered with every transport once and is shareable
 * between processes of one host, so puts and gets through it take the
 * fewest copies.  Release with cfx_buf_free().
 *
 * The pages are had as they are first touched, as malloc's are: a size
 * this machine's memory and swap together could never back fails here
 * with CFX_ERR_NOMEM, and one that merely does not fit now is found short
 * when written (the kernel's overcommit rules).
 *
 * @return CFX_OK, CFX_ERR_INVALID (NULL ctx/out, size 0), CFX_ERR_NOMEM.
 */
CFX_API int cfx_buf_alloc(struct cfx_context *ctx, size_t size, void **out);

/**
 * Return arena memory from cfx_buf_alloc() or cfx_get_alloc(); NULL is a
 * no-op.  A cfx_get_alloc() buffer is this node's copy of its object: the
 * copy is withdrawn with it (a cfx_delete() within the context's deadline;
 * with the coordinator lost, at once, without waiting for it to return).
 */
CFX_API void cfx_buf_free(struct cfx_context *ctx, void *buf);

#ifdef __cplusplus
}
#endif
#endif

/*
 * Reduction kernels, internal side: one table of kernels per instruction
 * set, and the choice of the table the public calls use.
 *
 * A kernel computes dst[i] = a[i] op b[i] for i < n.  dst may be the same
 * pointer as a or b; any other overlap is undefined.  No alignment is
 * required.  Kernels never fail, allocate or log.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef CFX_REDUCE_IMPL_H
#define CFX_REDUCE_IMPL_H

#include <stddef.h>

#include <conflux/reduce.h>

typedef void (*cfx__reduce_fn)(void *dst, const void *a, const void *b, size_t n);

enum cfx__reduce_isa {
    CFX__REDUCE_ISA_DEFAULT = 0, /* baseline x86-64 (SSE2), or plain C elsewhere */
    CFX__REDUCE_ISA_AVX2,        /* AVX2 + F16C, 256-bit vectors */
    CFX__REDUCE_ISA_AVX512,      /* AVX-512 F/BW/VL/DQ + F16C, 512-bit vectors */
    CFX__REDUCE_ISA_LAST
};

struct cfx__reduce_table {
    enum cfx__reduce_isa isa;                       /* what the kernels need */
    const char *name;                               /* "default", "avx2", "avx512" */
    cfx__reduce_fn fn[CFX_DTYPE_LAST][CFX_OP_LAST]; /* every entry is set */
};

/* The kernel tables (reduce_kernels.c); NULL where the build has no such set. */
extern const struct cfx__reduce_table *const cfx__reduce_tables[CFX__REDUCE_ISA_LAST];

/* Whether this process may run the kernels of @p isa: the build has them,
 * the CPU (and OS) can run them, and CFX_REDUCE_ISA does not cap them off. */
int cfx__reduce_isa_supported(enum cfx__reduce_isa isa);

/* Why @p isa is not supported (a static string), or NULL when it is. */
const char *cfx__reduce_isa_why_not(enum cfx__reduce_isa isa);

/* Name of an instruction set ("default", "avx2", "avx512"); "unknown" otherwise. */
const char *cfx__reduce_isa_name(enum cfx__reduce_isa isa);

/* The table in use: on first call, the best one the CPU supports, capped by
 * CFX_REDUCE_ISA; afterwards whatever cfx__reduce_set_isa() chose. */
const struct cfx__reduce_table *cfx__reduce_active(void);

/*
 * Switch every later reduction of the process to the kernels of @p isa (for
 * tests and benchmarks).  Calls in flight finish with the table they began
 * with.  CFX_OK, CFX_ERR_INVALID (unknown isa), CFX_ERR_UNSUPPORTED (this
 * CPU or build cannot run it).
 */
int cfx__reduce_set_isa(enum cfx__reduce_isa isa);

/*
 * The kernel for (dtype, op) from the active table, for callers that reduce
 * many chunks of one collective and want to look it up once; NULL for an
 * unknown dtype or op.
 */
cfx__reduce_fn cfx__reduce_kernel(enum cfx_dtype dtype, enum cfx_redop op);

#endif

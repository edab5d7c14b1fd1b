/*
 * Element-wise reduction kernels: the arithmetic under reduce, allreduce and
 * reduce-scatter.  Collectives call them on each chunk as it lands, so a
 * reduction never needs a temporary copy of a whole input.
 *
 * Semantics (docs/REDUCTION.md has the full statement):
 *  - f16 and bf16 are widened to f32, combined once, and rounded back to
 *    nearest-even once per pairwise operation (as NCCL does).
 *  - min/max follow IEEE 754-2019 minimum/maximum: a NaN operand gives a NaN
 *    (the first NaN operand, bit for bit) and -0 < +0.  The result is always
 *    one of the two inputs, unchanged.
 *  - Integer sum and prod wrap modulo 2^bits (two's complement); u8 sum
 *    wraps modulo 256.
 *  - f32/f64 arithmetic follows the calling thread's floating-point
 *    environment (round-to-nearest-even unless the caller changed it).
 *
 * The best kernel set for the CPU (AVX-512, AVX2+F16C, or baseline x86-64)
 * is chosen once, on first use; CFX_REDUCE_ISA=default|avx2|avx512 caps it.
 *
 * Thread safety: every function here may be called from any thread, and the
 * kernels neither allocate nor log.
 */
#ifndef CONFLUX_REDUCE_H
#define CONFLUX_REDUCE_H

#include <stddef.h>
#include <conflux/visibility.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cfx_dtype {
    CFX_DTYPE_F32 = 0, /* IEEE binary32 */
    CFX_DTYPE_F64,     /* IEEE binary64 */
    CFX_DTYPE_F16,     /* IEEE binary16 (half) */
    CFX_DTYPE_BF16,    /* bfloat16: the top half of a binary32 */
    CFX_DTYPE_I32,     /* int32_t, two's complement */
    CFX_DTYPE_I64,     /* int64_t, two's complement */
    CFX_DTYPE_U8,      /* uint8_t */
    CFX_DTYPE_LAST
};

enum cfx_redop {
    CFX_OP_SUM = 0, /* a + b */
    CFX_OP_PROD,    /* a * b */
    CFX_OP_MIN,     /* IEEE 754-2019 minimum for floats */
    CFX_OP_MAX,     /* IEEE 754-2019 maximum for floats */
    CFX_OP_LAST
};

/** Size in bytes of one element of @p dtype; 0 for an unknown dtype. */
CFX_API size_t cfx_dtype_size(enum cfx_dtype dtype);

/**
 * Canonical name of @p dtype, in the spelling of nccl-tests ("float",
 * "double", "half", "bfloat16", "int32", "int64", "uint8"); "unknown" for an
 * unknown dtype.  Never NULL; the string is static.
 */
CFX_API const char *cfx_dtype_name(enum cfx_dtype dtype);

/** Canonical name of @p op ("sum", "prod", "min", "max"); "unknown" otherwise. */
CFX_API const char *cfx_redop_name(enum cfx_redop op);

/**
 * Parse a dtype name, case-insensitively.  Accepts the canonical names and
 * the usual aliases: f32/fp32/float32, f64/fp64/float64, f16/fp16/float16,
 * bf16, i32/int, i64, u8/uint8_t/char, and the C spellings int32_t, int64_t.
 *
 * @return CFX_OK with *out set, or CFX_ERR_INVALID (NULL or unknown name;
 *         *out untouched).
 */
CFX_API int cfx_dtype_from_name(const char *name, enum cfx_dtype *out);

/**
 * Parse a reduction op name, case-insensitively: sum, prod, min, max (and
 * "product", "add"/"plus", "mul").
 *
 * @return CFX_OK with *out set, or CFX_ERR_INVALID (*out untouched).
 */
CFX_API int cfx_redop_from_name(const char *name, enum cfx_redop *out);

/**
 * In-place reduction: dst[i] = dst[i] op src[i] for i < count.
 *
 * @param dst    accumulator, @p count elements; read and written
 * @param src    operand, @p count elements; may equal @p dst but must not
 *               otherwise overlap it
 * @param count  number of elements (not bytes); 0 is a no-op
 * The buffers need no particular alignment.
 *
 * @return CFX_OK, or CFX_ERR_INVALID for an unknown dtype or op, or a NULL
 *         pointer with count > 0 (nothing is written then).
 */
CFX_API int cfx_reduce(void *dst, const void *src, size_t count, enum cfx_dtype dtype,
                       enum cfx_redop op);

/**
 * Out-of-place reduction: dst[i] = a[i] op b[i] for i < count.
 *
 * Saves the copy that an in-place reduction would need when the first chunk
 * of a reduction lands.  @p dst may be the same pointer as @p a or @p b (or
 * both); any other overlap is undefined.  For min/max, when both operands
 * are NaN the result is @p a's NaN.
 *
 * @return as cfx_reduce().
 */
CFX_API int cfx_reduce3(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                        enum cfx_redop op);

#ifdef __cplusplus
}
#endif
#endif

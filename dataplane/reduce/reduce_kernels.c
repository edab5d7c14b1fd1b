/*
 * The reduction kernels: dst[i] = a[i] op b[i] for every dtype x op, built
 * once per instruction set (baseline, AVX2+F16C, AVX-512) from one source.
 *
 * Why explicit per-ISA copies rather than target_clones: the copies are the
 * same function multi-versioning GCC's target_clones generates, but with our
 * own dispatch table instead of an ifunc resolver, so a test can run every
 * copy the CPU supports (the baseline copy, with its software half
 * conversions, would otherwise never run on a modern machine),
 * CFX_REDUCE_ISA can cap the choice, and static links need no IRELATIVE
 * support.  The choice itself is made once, in reduce.c.
 *
 * How the loops are written for the vectoriser:
 *  - O3 for this file only (the library builds at O2, whose very cheap cost
 *    model refuses loops of unknown trip count).
 *  - `GCC ivdep` instead of restrict: the contract lets dst be the same
 *    pointer as a or b, which restrict would make undefined; what the loops
 *    really rely on is that no iteration reads what an earlier one wrote,
 *    which is what ivdep asserts, and it spares the runtime alias checks.
 *  - Element types carry aligned(1) so any byte address is valid and the
 *    vectoriser uses unaligned loads instead of peeling for alignment.
 *  - Float min/max and all 16-bit float conversions are integer selects, so
 *    they vectorise without -ffast-math and are exact.
 */
#if defined(__clang__)
/* clang vectorises these loops at -O2 already; it takes the no-dependence
 * promise as `loop vectorize(assume_safety)` and target regions as function
 * attributes applied to every function inside them. */
#define RK_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#define RK_TARGET_AVX2 \
    _Pragma("clang attribute push(__attribute__((target(\"avx2,f16c\"))), apply_to = function)")
#define RK_TARGET_AVX512 \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c\"))), apply_to = function)")
#define RK_TARGET_END _Pragma("clang attribute pop")
#else
#pragma GCC optimize("O3")
#define RK_IVDEP       _Pragma("GCC ivdep")
#define RK_TARGET_AVX2 _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,f16c\")")
#define RK_TARGET_AVX512 \
    _Pragma("GCC push_options") \
    _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,prefer-vector-width=512\")")
#define RK_TARGET_END _Pragma("GCC pop_options")
#endif

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RK_X86 1
#endif

#include "dataplane/reduce/fp16.h"
#include "dataplane/reduce/reduce_impl.h"

#define RK_INLINE static inline __attribute__((always_inline))

/* Element storage types: any alignment, may alias anything. */
typedef float rk_f32 __attribute__((aligned(1), may_alias));
typedef double rk_f64 __attribute__((aligned(1), may_alias));
typedef uint8_t rk_u8 __attribute__((aligned(1), may_alias));
typedef uint16_t rk_u16 __attribute__((aligned(1), may_alias));
typedef uint32_t rk_u32 __attribute__((aligned(1), may_alias));
typedef uint64_t rk_u64 __attribute__((aligned(1), may_alias));
typedef int32_t rk_i32 __attribute__((aligned(1), may_alias));
typedef int64_t rk_i64 __attribute__((aligned(1), may_alias));

/*
 * IEEE 754-2019 minimum/maximum on encodings of width W: a NaN operand wins
 * (the first one when both are), otherwise compare keys that order like the
 * values, with -0 below +0.  The key of a negative encoding flips every bit
 * but the sign, which turns sign-magnitude into two's complement order.
 */
#define RK_FMINMAX(tag, UT, ST, W, ABS, INF)                \
    RK_INLINE ST rk_key_##tag(UT x)                         \
    {                                                       \
        return (ST)(x ^ (UT)((UT)((ST)x >> ((W)-1)) >> 1)); \
    }                                                       \
    RK_INLINE int rk_isnan_##tag(UT x)                      \
    {                                                       \
        return (ST)(x & (UT)(ABS)) > (ST)(INF);             \
    }                                                       \
    RK_INLINE UT rk_min_##tag(UT x, UT y)                   \
    {                                                       \
        UT r = rk_key_##tag(x) <= rk_key_##tag(y) ? x : y;  \
        r = rk_isnan_##tag(y) ? y : r;                      \
        return rk_isnan_##tag(x) ? x : r;                   \
    }                                                       \
    RK_INLINE UT rk_max_##tag(UT x, UT y)                   \
    {                                                       \
        UT r = rk_key_##tag(x) >= rk_key_##tag(y) ? x : y;  \
        r = rk_isnan_##tag(y) ? y : r;                      \
        return rk_isnan_##tag(x) ? x : r;                   \
    }

RK_FMINMAX(f16, uint16_t, int16_t, 16, 0x7fffu, 0x7c00)
RK_FMINMAX(bf16, uint16_t, int16_t, 16, 0x7fffu, 0x7f80)
RK_FMINMAX(f32, uint32_t, int32_t, 32, 0x7fffffffu, 0x7f800000)
RK_FMINMAX(f64, uint64_t, int64_t, 64, 0x7fffffffffffffffull, 0x7ff0000000000000ll)

/* 16-bit float arithmetic: widen to f32, one f32 operation, round once. */
RK_INLINE uint16_t rk_f16_sum(uint16_t x, uint16_t y)
{
    return cfx__f32_to_f16(cfx__f16_to_f32(x) + cfx__f16_to_f32(y));
}
RK_INLINE uint16_t rk_f16_prod(uint16_t x, uint16_t y)
{
    return cfx__f32_to_f16(cfx__f16_to_f32(x) * cfx__f16_to_f32(y));
}
RK_INLINE uint16_t rk_bf16_sum(uint16_t x, uint16_t y)
{
    return cfx__f32_to_bf16(cfx__bf16_to_f32(x) + cfx__bf16_to_f32(y));
}
RK_INLINE uint16_t rk_bf16_prod(uint16_t x, uint16_t y)
{
    return cfx__f32_to_bf16(cfx__bf16_to_f32(x) * cfx__bf16_to_f32(y));
}

#define RK_MIN(x, y) ((x) < (y) ? (x) : (y))
#define RK_MAX(x, y) ((x) > (y) ? (x) : (y))

/* One element-wise kernel: ST is the storage type, VT the value type. */
#define RK_KERNEL(isa, name, ST, VT, EXPR)                                             \
    static void rk_##name##_##isa(void *dst, const void *a_, const void *b_, size_t n) \
    {                                                                                  \
        ST *d = dst;                                                                   \
        const ST *a = a_, *b = b_;                                                     \
        RK_IVDEP for (size_t i = 0; i < n; i++)                                        \
        {                                                                              \
            VT x = a[i], y = b[i];                                                     \
            d[i] = (VT)(EXPR);                                                         \
        }                                                                              \
    }

/* Integer sums and products use the unsigned type: wrap-around, no UB. */
#define RK_KERNELS_COMMON(isa)                                    \
    RK_KERNEL(isa, f32_sum, rk_f32, float, x + y)                 \
    RK_KERNEL(isa, f32_prod, rk_f32, float, x *y)                 \
    RK_KERNEL(isa, f32_min, rk_u32, uint32_t, rk_min_f32(x, y))   \
    RK_KERNEL(isa, f32_max, rk_u32, uint32_t, rk_max_f32(x, y))   \
    RK_KERNEL(isa, f64_sum, rk_f64, double, x + y)                \
    RK_KERNEL(isa, f64_prod, rk_f64, double, x *y)                \
    RK_KERNEL(isa, f64_min, rk_u64, uint64_t, rk_min_f64(x, y))   \
    RK_KERNEL(isa, f64_max, rk_u64, uint64_t, rk_max_f64(x, y))   \
    RK_KERNEL(isa, f16_min, rk_u16, uint16_t, rk_min_f16(x, y))   \
    RK_KERNEL(isa, f16_max, rk_u16, uint16_t, rk_max_f16(x, y))   \
    RK_KERNEL(isa, bf16_min, rk_u16, uint16_t, rk_min_bf16(x, y)) \
    RK_KERNEL(isa, bf16_max, rk_u16, uint16_t, rk_max_bf16(x, y)) \
    RK_KERNEL(isa, i32_sum, rk_u32, uint32_t, x + y)              \
    RK_KERNEL(isa, i32_prod, rk_u32, uint32_t, x *y)              \
    RK_KERNEL(isa, i32_min, rk_i32, int32_t, RK_MIN(x, y))        \
    RK_KERNEL(isa, i32_max, rk_i32, int32_t, RK_MAX(x, y))        \
    RK_KERNEL(isa, i64_sum, rk_u64, uint64_t, x + y)              \
    RK_KERNEL(isa, i64_prod, rk_u64, uint64_t, x *y)              \
    RK_KERNEL(isa, i64_min, rk_i64, int64_t, RK_MIN(x, y))        \
    RK_KERNEL(isa, i64_max, rk_i64, int64_t, RK_MAX(x, y))        \
    RK_KERNEL(isa, u8_sum, rk_u8, uint8_t, x + y)                 \
    RK_KERNEL(isa, u8_prod, rk_u8, uint8_t, x *y)                 \
    RK_KERNEL(isa, u8_min, rk_u8, uint8_t, RK_MIN(x, y))          \
    RK_KERNEL(isa, u8_max, rk_u8, uint8_t, RK_MAX(x, y))

#define RK_TABLE(sfx, ISA) \
    static const struct cfx__reduce_table rk_table_##sfx = {                                       \
        .isa = ISA,                                                                                \
        .name = #sfx,                                                                              \
        .fn = {                                                                                    \
            [CFX_DTYPE_F32] = { rk_f32_sum_##sfx, rk_f32_prod_##sfx, rk_f32_min_##sfx,             \
                                rk_f32_max_##sfx },                                                \
            [CFX_DTYPE_F64] = { rk_f64_sum_##sfx, rk_f64_prod_##sfx, rk_f64_min_##sfx,             \
                                rk_f64_max_##sfx },                                                \
            [CFX_DTYPE_F16] = { rk_f16_sum_##sfx, rk_f16_prod_##sfx, rk_f16_min_##sfx,             \
                                rk_f16_max_##sfx },                                                \
            [CFX_DTYPE_BF16] = { rk_bf16_sum_##sfx, rk_bf16_prod_##sfx, rk_bf16_min_##sfx,         \
                                 rk_bf16_max_##sfx },                                              \
            [CFX_DTYPE_I32] = { rk_i32_sum_##sfx, rk_i32_prod_##sfx, rk_i32_min_##sfx,             \
                                rk_i32_max_##sfx },                                                \
            [CFX_DTYPE_I64] = { rk_i64_sum_##sfx, rk_i64_prod_##sfx, rk_i64_min_##sfx,             \
                                rk_i64_max_##sfx },                                                \
            [CFX_DTYPE_U8] = { rk_u8_sum_##sfx, rk_u8_prod_##sfx, rk_u8_min_##sfx,                 \
                               rk_u8_max_##sfx },                                                  \
        },                                                                                         \
    };

_Static_assert(CFX_OP_SUM == 0 && CFX_OP_PROD == 1 && CFX_OP_MIN == 2 && CFX_OP_MAX == 3,
               "RK_TABLE lists the ops in enum order");

/* ---- baseline: plain C, half conversions in software --------------------- */

RK_KERNELS_COMMON(default)
RK_KERNEL(default, f16_sum, rk_u16, uint16_t, rk_f16_sum(x, y))
RK_KERNEL(default, f16_prod, rk_u16, uint16_t, rk_f16_prod(x, y))
RK_KERNEL(default, bf16_sum, rk_u16, uint16_t, rk_bf16_sum(x, y))
RK_KERNEL(default, bf16_prod, rk_u16, uint16_t, rk_bf16_prod(x, y))
RK_TABLE(default, CFX__REDUCE_ISA_DEFAULT)

#ifdef RK_X86
/*
 * Half arithmetic with the F16C conversions, VL floats at a time.  The tail
 * goes through a zero-padded block so it rounds exactly like the body.
 */
#define RK_F16C_KERNEL(isa, name, VL, VEC, LOADH, STOREH, CVT_IN, CVT_OUT, VOP)            \
    static void rk_f16_##name##_##isa(void *dst, const void *a_, const void *b_, size_t n) \
    {                                                                                      \
        uint8_t *d = dst;                                                                  \
        const uint8_t *a = a_, *b = b_;                                                    \
        size_t i = 0;                                                                      \
        _Pragma("GCC unroll 4") for (; i + (VL) <= n; i += (VL))                           \
        {                                                                                  \
            VEC x = CVT_IN(LOADH(a + 2 * i));                                              \
            VEC y = CVT_IN(LOADH(b + 2 * i));                                              \
            STOREH(d + 2 * i, CVT_OUT(VOP(x, y), _MM_FROUND_TO_NEAREST_INT));              \
        }                                                                                  \
        if (i < n) {                                                                       \
            uint16_t ta[VL] = { 0 }, tb[VL] = { 0 };                                       \
            size_t bytes = 2 * (n - i);                                                    \
            memcpy(ta, a + 2 * i, bytes);                                                  \
            memcpy(tb, b + 2 * i, bytes);                                                  \
            VEC x = CVT_IN(LOADH(ta));                                                     \
            VEC y = CVT_IN(LOADH(tb));                                                     \
            STOREH(ta, CVT_OUT(VOP(x, y), _MM_FROUND_TO_NEAREST_INT));                     \
            memcpy(d + 2 * i, ta, bytes);                                                  \
        }                                                                                  \
    }

/*
 * bfloat16 arithmetic, VL values at a time.  GCC vectorises the scalar form
 * too, but widens and narrows with cross-lane shuffles; here the widening is
 * an in-lane interleave with zeros (which puts each value in the top half of
 * a 32-bit lane) and the narrowing the in-lane unsigned pack that undoes it,
 * so no permutes are needed.  Rounding is the scalar recipe of fp16.h:
 * add 0x7fff plus the lowest kept bit; a NaN keeps its bits, made quiet.
 */
#define RK_BF16_KERNEL(isa, name, VL, IV, FV, LOAD, STORE, ZERO, UNPLO, UNPHI, PACKUS, ADD32, AND, \
                       OR, SRLI, CMPGT, BLEND, SET1, CASTPS, CASTSI, VOP)                          \
    static inline __attribute__((always_inline)) IV rk_bf16_round_##name##_##isa(FV v)             \
    {                                                                                              \
        IV u = CASTPS(v);                                                                          \
        IV odd = AND(SRLI(u, 16), SET1(1));                                                        \
        IV rnd = ADD32(ADD32(u, SET1(0x7fff)), odd);                                               \
        IV isnan = CMPGT(AND(u, SET1(0x7fffffff)), SET1(0x7f800000));                              \
        return SRLI(BLEND(rnd, OR(u, SET1(0x00400000)), isnan), 16);                               \
    }                                                                                              \
    static inline __attribute__((always_inline)) IV rk_bf16_block_##name##_##isa(IV x, IV y)       \
    {                                                                                              \
        IV z = ZERO();                                                                             \
        FV lo = VOP(CASTSI(UNPLO(z, x)), CASTSI(UNPLO(z, y)));                                     \
        FV hi = VOP(CASTSI(UNPHI(z, x)), CASTSI(UNPHI(z, y)));                                     \
        return PACKUS(rk_bf16_round_##name##_##isa(lo), rk_bf16_round_##name##_##isa(hi));         \
    }                                                                                              \
    static void rk_bf16_##name##_##isa(void *dst, const void *a_, const void *b_, size_t n)        \
    {                                                                                              \
        uint8_t *d = dst;                                                                          \
        const uint8_t *a = a_, *b = b_;                                                            \
        size_t i = 0;                                                                              \
        _Pragma("GCC unroll 2") for (; i + (VL) <= n; i += (VL))                                   \
        {                                                                                          \
            STORE(d + 2 * i, rk_bf16_block_##name##_##isa(LOAD(a + 2 * i), LOAD(b + 2 * i)));      \
        }                                                                                          \
        if (i < n) {                                                                               \
            uint16_t ta[VL] = { 0 }, tb[VL] = { 0 };                                               \
            size_t bytes = 2 * (n - i);                                                            \
            memcpy(ta, a + 2 * i, bytes);                                                          \
            memcpy(tb, b + 2 * i, bytes);                                                          \
            STORE(ta, rk_bf16_block_##name##_##isa(LOAD(ta), LOAD(tb)));                           \
            memcpy(d + 2 * i, ta, bytes);                                                          \
        }                                                                                          \
    }

/* ---- AVX2 + F16C ---------------------------------------------------------- */

RK_TARGET_AVX2

#define RK_LOAD128(p)     _mm_loadu_si128((const __m128i *)(const void *)(p))
#define RK_STORE128(p, v) _mm_storeu_si128((__m128i *)(void *)(p), (v))

RK_KERNELS_COMMON(avx2)
RK_F16C_KERNEL(avx2, sum, 8, __m256, RK_LOAD128, RK_STORE128, _mm256_cvtph_ps, _mm256_cvtps_ph,
               _mm256_add_ps)
RK_F16C_KERNEL(avx2, prod, 8, __m256, RK_LOAD128, RK_STORE128, _mm256_cvtph_ps, _mm256_cvtps_ph,
               _mm256_mul_ps)

#define RK_LOAD256(p)        _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define RK_STORE256(p, v)    _mm256_storeu_si256((__m256i *)(void *)(p), (v))
#define RK_BLEND256(a, b, m) _mm256_blendv_epi8((a), (b), (m))
#define RK_BF16_AVX2(name, VOP)                                                                    \
    RK_BF16_KERNEL(avx2, name, 16, __m256i, __m256, RK_LOAD256, RK_STORE256, _mm256_setzero_si256, \
                   _mm256_unpacklo_epi16, _mm256_unpackhi_epi16, _mm256_packus_epi32,              \
                   _mm256_add_epi32, _mm256_and_si256, _mm256_or_si256, _mm256_srli_epi32,         \
                   _mm256_cmpgt_epi32, RK_BLEND256, _mm256_set1_epi32, _mm256_castps_si256,        \
                   _mm256_castsi256_ps, VOP)
RK_BF16_AVX2(sum, _mm256_add_ps)
RK_BF16_AVX2(prod, _mm256_mul_ps)
RK_TABLE(avx2, CFX__REDUCE_ISA_AVX2)

RK_TARGET_END

/* ---- AVX-512 (F, BW, VL, DQ) + F16C --------------------------------------- */

RK_TARGET_AVX512

RK_KERNELS_COMMON(avx512)
RK_F16C_KERNEL(avx512, sum, 16, __m512, RK_LOAD256, RK_STORE256, _mm512_cvtph_ps, _mm512_cvtps_ph,
               _mm512_add_ps)
RK_F16C_KERNEL(avx512, prod, 16, __m512, RK_LOAD256, RK_STORE256, _mm512_cvtph_ps, _mm512_cvtps_ph,
               _mm512_mul_ps)

#define RK_LOAD512(p)        _mm512_loadu_si512((const void *)(p))
#define RK_STORE512(p, v)    _mm512_storeu_si512((void *)(p), (v))
#define RK_CMPGT512(a, b)    _mm512_movm_epi32(_mm512_cmpgt_epi32_mask((a), (b)))
#define RK_BLEND512(a, b, m) _mm512_mask_blend_epi32(_mm512_movepi32_mask(m), (a), (b))
#define RK_BF16_AVX512(name, VOP)                                                            \
    RK_BF16_KERNEL(avx512, name, 32, __m512i, __m512, RK_LOAD512, RK_STORE512,               \
                   _mm512_setzero_si512, _mm512_unpacklo_epi16, _mm512_unpackhi_epi16,       \
                   _mm512_packus_epi32, _mm512_add_epi32, _mm512_and_si512, _mm512_or_si512, \
                   _mm512_srli_epi32, RK_CMPGT512, RK_BLEND512, _mm512_set1_epi32,           \
                   _mm512_castps_si512, _mm512_castsi512_ps, VOP)
RK_BF16_AVX512(sum, _mm512_add_ps)
RK_BF16_AVX512(prod, _mm512_mul_ps)
RK_TABLE(avx512, CFX__REDUCE_ISA_AVX512)

RK_TARGET_END

const struct cfx__reduce_table *const cfx__reduce_tables[CFX__REDUCE_ISA_LAST] = {
    [CFX__REDUCE_ISA_DEFAULT] = &rk_table_default,
    [CFX__REDUCE_ISA_AVX2] = &rk_table_avx2,
    [CFX__REDUCE_ISA_AVX512] = &rk_table_avx512,
};

#else /* !RK_X86 */

const struct cfx__reduce_table *const cfx__reduce_tables[CFX__REDUCE_ISA_LAST] = {
    [CFX__REDUCE_ISA_DEFAULT] = &rk_table_default,
};

#endif

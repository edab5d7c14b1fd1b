/*
 * Scalar conversions between binary32 and the two 16-bit float formats.
 *
 * Exact in both directions where the value fits; binary32 -> 16-bit rounds to
 * nearest, ties to even, overflows to infinity and keeps the sign, the
 * quiet bit and the top payload bits of a NaN (the same bits the F16C
 * instructions produce).  Written branch-free (selects) so that GCC can
 * vectorise loops built on them.
 *
 * The half conversions follow F. Giesen's "half <-> float" constructions
 * (public domain), which lean on one binary32 addition or subtraction to
 * align subnormals; they are exact under the default rounding mode
 * (round-to-nearest-even) and are unaffected by FTZ/DAZ because every
 * intermediate they form is a normal binary32.
 */
#ifndef CFX_REDUCE_FP16_H
#define CFX_REDUCE_FP16_H

#include <stdint.h>
#include <string.h>

#define CFX__FP_INLINE static inline __attribute__((always_inline))

CFX__FP_INLINE uint32_t cfx__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

CFX__FP_INLINE float cfx__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* bfloat16 -> binary32: exact (bf16 is the top half of a binary32). */
CFX__FP_INLINE float cfx__bf16_to_f32(uint16_t h)
{
    return cfx__f32_from_bits((uint32_t)h << 16);
}

/* binary32 -> bfloat16, round to nearest even; NaN stays NaN (made quiet). */
CFX__FP_INLINE uint16_t cfx__f32_to_bf16(float f)
{
    uint32_t u = cfx__f32_bits(f);
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to the
     * even neighbour; a carry out of the mantissa bumps the exponent, which
     * is exactly right up to and including overflow to infinity.  NaN is
     * excluded because the carry could turn it into infinity. */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* binary16 -> binary32: exact, subnormals included; NaN payload kept. */
CFX__FP_INLINE float cfx__f16_to_f32(uint16_t h)
{
    const float magic = cfx__f32_from_bits(113u << 23); /* 2^-14 */
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;        /* exponent+mantissa */
    uint32_t exp = em & 0x0f800000u;
    uint32_t normal = em + (112u << 23); /* rebias 15 -> 127 */
    uint32_t infnan = em + (224u << 23); /* exponent 31 -> 255 */
    /* Subnormal: read the mantissa as 2^-14 * (1 + m/1024) and take 2^-14
     * away, which leaves m * 2^-24 exactly. */
    uint32_t sub = cfx__f32_bits(cfx__f32_from_bits(em + (113u << 23)) - magic);
    /* Masks rather than ?: so that GCC keeps the loop free of branches. */
    uint32_t m_infnan = 0u - (uint32_t)(exp == 0x0f800000u);
    uint32_t m_sub = 0u - (uint32_t)(exp == 0);
    uint32_t o = (infnan & m_infnan) | (sub & m_sub) | (normal & ~(m_infnan | m_sub));
    return cfx__f32_from_bits(o | ((uint32_t)(h & 0x8000u) << 16));
}

/* binary32 -> binary16, round to nearest even; overflow gives infinity. */
CFX__FP_INLINE uint16_t cfx__f32_to_f16(float f)
{
    uint32_t u = cfx__f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* |f| >= 2^16 is infinity in half after rounding; NaN stays NaN. */
    uint32_t big = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
    /* |f| < 2^-14 (half subnormal or zero): adding 0.5 puts the half quantum
     * 2^-24 in the last mantissa place, so the hardware addition rounds to
     * nearest even for us; what is left above 0.5 is the half encoding. */
    uint32_t small = cfx__f32_bits(cfx__f32_from_bits(a) + 0.5f) - (126u << 23);
    /* Normal: rebias the exponent and round the 13 dropped bits to nearest
     * even; a carry propagates into the exponent (up to infinity). */
    uint32_t norm = (a + (((uint32_t)(15 - 127)) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t m_big = 0u - (uint32_t)(a >= 0x47800000u);
    uint32_t m_small = 0u - (uint32_t)(a < 0x38800000u);
    uint32_t o = (big & m_big) | (small & m_small) | (norm & ~(m_big | m_small));
    return (uint16_t)(o | sign);
}

#endif

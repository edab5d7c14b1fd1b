/*
 * Device reduction kernels: dst[i] = a[i] op b[i] for every dtype and op of
 * the reduce API, with the semantics of the CPU kernels (docs/REDUCTION.md):
 *
 *  - f32/f64 sum and prod: one IEEE operation, round to nearest even
 *    (__fadd_rn & co., which nvcc never contracts into an FMA);
 *  - f16/bf16 sum and prod: widen to f32, one f32 operation, round once to
 *    the 16-bit format to nearest even (subnormals kept, overflow to inf);
 *  - min/max on floats: IEEE 754-2019 minimum/maximum on the encodings (a
 *    NaN operand wins, the first one if both are; -0 < +0), so the result is
 *    always one input, bit for bit;
 *  - integers: sum/prod wrap (computed unsigned), min/max signed for
 *    i32/i64, unsigned for u8.
 *
 * Memory-bound by design: each thread moves UNROLL 16-byte vectors of each
 * operand, all loads issued before any arithmetic, so that enough bytes are
 * in flight to approach the memory system's bandwidth.  Buffers that are not
 * all 16-byte aligned take the scalar kernel.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cfx_cuda.h"

extern "C" {
#include "dataplane/common/util.h"
}

namespace {

constexpr int kThreads = 256;   // threads per block
constexpr int kUnroll = 4;      // 16-byte vectors per thread and operand
constexpr unsigned kMaxBlocks = 1u << 20; // grid cap; larger inputs loop

/* ---- element types: storage and the f32 view of the 16-bit floats ---------- */

struct F32 { typedef float T; };
struct F64 { typedef double T; };
struct F16 { typedef uint16_t T; };
struct BF16 { typedef uint16_t T; };
struct I32 { typedef int32_t T; };
struct I64 { typedef int64_t T; };
struct U8 { typedef uint8_t T; };

__device__ __forceinline__ bool nan32(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool nan64(uint64_t u)
{
    return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
__device__ __forceinline__ bool nan16(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
__device__ __forceinline__ bool nanbf(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* Keys that order encodings as the numbers they stand for, with -0 < +0:
 * negative values flip every bit, the others set the sign bit. */
template <typename U> __device__ __forceinline__ U order_key(U u)
{
    const U sign = (U)((U)1 << (sizeof(U) * 8 - 1));
    return (u & sign) ? (U)~u : (U)(u | sign);
}

/* IEEE 754-2019 minimum (want_min) / maximum on raw encodings. */
template <typename U>
__device__ __forceinline__ U fminmax(U a, U b, bool a_nan, bool b_nan, bool want_min)
{
    if (a_nan)
        return a;
    if (b_nan)
        return b;
    U ka = order_key(a), kb = order_key(b);
    return want_min ? (kb < ka ? b : a) : (kb > ka ? b : a);
}

__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* binary32 -> binary16, nearest even; a NaN keeps sign and top payload
 * bits and is made quiet, as the CPU's conversion does. */
__device__ __forceinline__ uint16_t f32_to_f16(float f)
{
    uint32_t u = __float_as_uint(f);
    if (nan32(u))
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* binary32 -> bfloat16, nearest even: the CPU kernels' integer recipe. */
__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if (nan32(u))
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- ops ------------------------------------------------------------------ */

template <class D, int OP> struct Op;

#define CFX_FLOAT_OPS(D, ADD, MUL, BITS, NAN)                                              \
    template <> struct Op<D, CFX_OP_SUM> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b) { return ADD(a, b); } \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_PROD> {                                                \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b) { return MUL(a, b); } \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_MIN> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b)                       \
        {                                                                                  \
            BITS ua = to_bits(a), ub = to_bits(b);                                         \
            return from_bits(fminmax<BITS>(ua, ub, NAN(ua), NAN(ub), true), a);            \
        }                                                                                  \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_MAX> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b)                       \
        {                                                                                  \
            BITS ua = to_bits(a), ub = to_bits(b);                                         \
            return from_bits(fminmax<BITS>(ua, ub, NAN(ua), NAN(ub), false), a);           \
        }                                                                                  \
    };

__device__ __forceinline__ uint32_t to_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ uint64_t to_bits(double d) { return (uint64_t)__double_as_longlong(d); }
__device__ __forceinline__ uint16_t to_bits(uint16_t h) { return h; }
__device__ __forceinline__ float from_bits(uint32_t u, float) { return __uint_as_float(u); }
__device__ __forceinline__ double from_bits(uint64_t u, double)
{
    return __longlong_as_double((long long)u);
}
__device__ __forceinline__ uint16_t from_bits(uint16_t u, uint16_t) { return u; }

__device__ __forceinline__ float add32(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float mul32(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double add64(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double mul64(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ uint16_t addh(uint16_t a, uint16_t b)
{
    return f32_to_f16(__fadd_rn(f16_to_f32(a), f16_to_f32(b)));
}
__device__ __forceinline__ uint16_t mulh(uint16_t a, uint16_t b)
{
    return f32_to_f16(__fmul_rn(f16_to_f32(a), f16_to_f32(b)));
}
__device__ __forceinline__ uint16_t addbf(uint16_t a, uint16_t b)
{
    return f32_to_bf16(__fadd_rn(bf16_to_f32(a), bf16_to_f32(b)));
}
__device__ __forceinline__ uint16_t mulbf(uint16_t a, uint16_t b)
{
    return f32_to_bf16(__fmul_rn(bf16_to_f32(a), bf16_to_f32(b)));
}

CFX_FLOAT_OPS(F32, add32, mul32, uint32_t, nan32)
CFX_FLOAT_OPS(F64, add64, mul64, uint64_t, nan64)
CFX_FLOAT_OPS(F16, addh, mulh, uint16_t, nan16)
CFX_FLOAT_OPS(BF16, addbf, mulbf, uint16_t, nanbf)
#undef CFX_FLOAT_OPS

/* Integers: arithmetic in the unsigned type (wraps, no undefined
 * behaviour); comparisons in the declared type. */
#define CFX_INT_OPS(D, U)                                                                  \
    template <> struct Op<D, CFX_OP_SUM> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b)                       \
        {                                                                                  \
            return (D::T)(U)((U)a + (U)b);                                                 \
        }                                                                                  \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_PROD> {                                                \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b)                       \
        {                                                                                  \
            return (D::T)(U)((U)a * (U)b);                                                 \
        }                                                                                  \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_MIN> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b) { return b < a ? b : a; } \
    };                                                                                     \
    template <> struct Op<D, CFX_OP_MAX> {                                                 \
        static __device__ __forceinline__ D::T apply(D::T a, D::T b) { return b > a ? b : a; } \
    };

CFX_INT_OPS(I32, uint32_t)
CFX_INT_OPS(I64, uint64_t)
CFX_INT_OPS(U8, uint32_t) /* promoted, then truncated back to 8 bits */
#undef CFX_INT_OPS

/* ---- kernels ---------------------------------------------------------------- */

template <class D> union Vec {
    uint4 v;
    typename D::T e[sizeof(uint4) / sizeof(typename D::T)];
};

/* Vectors [0, nvec): each block takes tiles of kThreads * kUnroll vectors,
 * threads stride by kThreads inside a tile so every load is coalesced. */
template <class D, int OP>
__global__ void __launch_bounds__(kThreads)
    reduce_vec(uint4 *dst, const uint4 *a, const uint4 *b, size_t nvec)
{
    const size_t tile = (size_t)kThreads * kUnroll;
    for (size_t base = (size_t)blockIdx.x * tile; base < nvec; base += (size_t)gridDim.x * tile) {
        Vec<D> va[kUnroll], vb[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            size_t i = base + (size_t)u * kThreads + threadIdx.x;
            if (i < nvec) {
                va[u].v = a[i];
                vb[u].v = b[i];
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            size_t i = base + (size_t)u * kThreads + threadIdx.x;
            if (i < nvec) {
#pragma unroll
                for (unsigned k = 0; k < sizeof(va[u].e) / sizeof(va[u].e[0]); k++)
                    va[u].e[k] = Op<D, OP>::apply(va[u].e[k], vb[u].e[k]);
                dst[i] = va[u].v;
            }
        }
    }
}

/* Any alignment, and the tail after the vectors. */
template <class D, int OP>
__global__ void __launch_bounds__(kThreads)
    reduce_scalar(typename D::T *dst, const typename D::T *a, const typename D::T *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * kThreads + threadIdx.x; i < n;
         i += (size_t)gridDim.x * kThreads)
        dst[i] = Op<D, OP>::apply(a[i], b[i]);
}

unsigned grid_for(size_t work_items, size_t per_block)
{
    size_t g = (work_items + per_block - 1) / per_block;
    return (unsigned)(g < 1 ? 1 : g > kMaxBlocks ? kMaxBlocks : g);
}

template <class D, int OP>
cudaError_t launch(void *dst, const void *a, const void *b, size_t count, cudaStream_t s)
{
    typedef typename D::T T;
    const size_t per_vec = sizeof(uint4) / sizeof(T);
    size_t done = 0;

    /* Each launch is judged by what cudaLaunchKernel returns for it, not by
     * cudaGetLastError(): that also returns an error an earlier call of
     * this thread left (a failed cudaMalloc the application handled), which
     * would fail a reduction that was queued, and clearing the slot first
     * would take the application's error away from it. */
    if ((((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b) & (sizeof(uint4) - 1)) == 0) {
        size_t nvec = count / per_vec;
        if (nvec) {
            uint4 *vd = (uint4 *)dst;
            const uint4 *va = (const uint4 *)a, *vb = (const uint4 *)b;
            void *args[] = { &vd, &va, &vb, &nvec };
            cudaError_t err = cudaLaunchKernel((const void *)reduce_vec<D, OP>,
                                               dim3(grid_for(nvec, (size_t)kThreads * kUnroll)),
                                               dim3(kThreads), args, 0, s);
            if (err != cudaSuccess)
                return err;
            done = nvec * per_vec;
        }
    }
    if (done < count) {
        T *sd = (T *)dst + done;
        const T *sa = (const T *)a + done, *sb = (const T *)b + done;
        size_t n = count - done;
        void *args[] = { &sd, &sa, &sb, &n };
        return cudaLaunchKernel((const void *)reduce_scalar<D, OP>, dim3(grid_for(n, kThreads)),
                                dim3(kThreads), args, 0, s);
    }
    return cudaSuccess;
}

typedef cudaError_t (*launch_fn)(void *, const void *, const void *, size_t, cudaStream_t);

#define CFX_ROW(D) { launch<D, CFX_OP_SUM>, launch<D, CFX_OP_PROD>, launch<D, CFX_OP_MIN>, \
                     launch<D, CFX_OP_MAX> }
/* Indexed [dtype][op], in the order of enum cfx_dtype / enum cfx_redop. */
const launch_fn launchers[CFX_DTYPE_LAST][CFX_OP_LAST] = {
    CFX_ROW(F32), CFX_ROW(F64), CFX_ROW(F16), CFX_ROW(BF16),
    CFX_ROW(I32), CFX_ROW(I64), CFX_ROW(U8),
};
#undef CFX_ROW
static_assert(CFX_DTYPE_F32 == 0 && CFX_DTYPE_F64 == 1 && CFX_DTYPE_F16 == 2 &&
                  CFX_DTYPE_BF16 == 3 && CFX_DTYPE_I32 == 4 && CFX_DTYPE_I64 == 5 &&
                  CFX_DTYPE_U8 == 6 && CFX_DTYPE_LAST == 7,
              "launchers[] follows enum cfx_dtype");
static_assert(CFX_OP_SUM == 0 && CFX_OP_PROD == 1 && CFX_OP_MIN == 2 && CFX_OP_MAX == 3,
              "launchers[][] follows enum cfx_redop");

} // namespace

extern "C" int cfx__cuda_reduce3_launch(void *dst, const void *a, const void *b, size_t count,
                                        enum cfx_dtype dtype, enum cfx_redop op, void *stream)
{
    if ((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST)
        return cfx__err(CFX_ERR_INVALID, "cuda reduce: unknown dtype %d or op %d", (int)dtype,
                        (int)op);
    if (!count)
        return CFX_OK;
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = launchers[dtype][op](dst, a, b, count, s);
    if (err == cudaSuccess && !stream)
        err = cudaStreamSynchronize(s);
    return cfx__cuda_status(err, "cuda reduce");
}

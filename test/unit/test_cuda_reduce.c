/*
 * gpu/cuda device reduction kernels against the host reference: every dtype
 * x op, aligned (vector kernel) and misaligned (scalar kernel) buffers,
 * tails, special values (NaN, +-0, infinities, subnormals), in-place and
 * pinned-host operands, the caller's stream, and argument errors.
 *
 * The reference is cfx_reduce3() on the CPU.  Bits must match, except that
 * where a float sum or product is a NaN only NaN-ness must (which NaN comes
 * out is unspecified, docs/REDUCTION.md).  Without a GPU every test skips
 * with the reason.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/reduce.h>
#include <conflux/status.h>

#include "dataplane/common/util.h"
#include "gpu/memtype.h"
#include "testutil.h"
#ifdef CFX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda/cfx_cuda.h"
#endif

TestSuite(cuda_reduce, .timeout = 300);

static void need_gpu(void)
{
#ifndef CFX_HAVE_CUDA
    cr_skip_test("no CUDA device: conflux was built without CUDA");
#else
    const char *why = "";
    if (cfx__cuda_probe(NULL, &why) != CFX__CUDA_READY)
        cr_skip_test("no CUDA device: %s", why);
#endif
}

#ifndef CFX_HAVE_CUDA
Test(cuda_reduce, every_dtype_and_op_matches_host)
{
    need_gpu();
}
#else

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Specials of each float format, mixed into the inputs. */
static const uint16_t f16_special[] = { 0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01,
                                        0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x3c00 };
static const uint16_t bf16_special[] = { 0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81,
                                         0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x3f80 };
static const uint32_t f32_special[] = { 0x00000000, 0x80000000, 0x7f800000, 0xff800000,
                                        0x7fc00000, 0xffc00001, 0x7f800001, 0x00000001,
                                        0x80000001, 0x007fffff, 0x00800000, 0x7f7fffff,
                                        0xff7fffff, 0x3f800000 };
static const uint64_t f64_special[] = { 0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull,
                                        0xfff0000000000000ull, 0x7ff8000000000000ull,
                                        0xfff8000000000001ull, 0x7ff0000000000001ull, 0x1ull,
                                        0x000fffffffffffffull, 0x7fefffffffffffffull,
                                        0x3ff0000000000000ull };

/* Element i of an input: mostly random encodings (every class of value
 * shows up), some numbers near 1 (so that sums and products do not just
 * overflow), some specials, some equal pairs. */
static void fill(void *buf, size_t count, enum cfx_dtype dt, uint64_t seed)
{
    rng_state = seed * 0x2545f4914f6cdd1dull + 1;
    for (size_t i = 0; i < count; i++) {
        uint64_t r = rnd(), pick = r % 8;
        switch (dt) {
        case CFX_DTYPE_F16: {
            uint16_t v = pick == 0 ? f16_special[rnd() % CFX_ARRAY_SIZE(f16_special)]
                       : pick < 4  ? (uint16_t)(0x3800 + rnd() % 0x0800) | (uint16_t)((r >> 20) & 0x8000)
                                   : (uint16_t)rnd();
            ((uint16_t *)buf)[i] = v;
            break;
        }
        case CFX_DTYPE_BF16: {
            uint16_t v = pick == 0 ? bf16_special[rnd() % CFX_ARRAY_SIZE(bf16_special)]
                       : pick < 4  ? (uint16_t)(0x3f00 + rnd() % 0x0100) | (uint16_t)((r >> 20) & 0x8000)
                                   : (uint16_t)rnd();
            ((uint16_t *)buf)[i] = v;
            break;
        }
        case CFX_DTYPE_F32: {
            uint32_t v = pick == 0 ? f32_special[rnd() % CFX_ARRAY_SIZE(f32_special)]
                       : pick < 4  ? (uint32_t)(0x3f000000u + rnd() % 0x01000000u) |
                                        (uint32_t)((r >> 8) & 0x80000000u)
                                   : (uint32_t)rnd();
            ((uint32_t *)buf)[i] = v;
            break;
        }
        case CFX_DTYPE_F64: {
            uint64_t v = pick == 0 ? f64_special[rnd() % CFX_ARRAY_SIZE(f64_special)]
                       : pick < 4  ? (0x3fe0000000000000ull + rnd() % 0x0020000000000000ull) |
                                        (r & 0x8000000000000000ull)
                                   : rnd();
            ((uint64_t *)buf)[i] = v;
            break;
        }
        case CFX_DTYPE_I32:
            ((uint32_t *)buf)[i] = pick == 0 ? (uint32_t)(0x7fffffff + (r >> 40) % 3) : (uint32_t)rnd();
            break;
        case CFX_DTYPE_I64:
            ((uint64_t *)buf)[i] = pick == 0 ? 0x7fffffffffffffffull + (r >> 40) % 3 : rnd();
            break;
        case CFX_DTYPE_U8:
            ((uint8_t *)buf)[i] = (uint8_t)rnd();
            break;
        default:
            cr_assert_fail("dtype %d", (int)dt);
        }
    }
}

static int is_nan(const void *buf, size_t i, enum cfx_dtype dt)
{
    switch (dt) {
    case CFX_DTYPE_F16:
        return (((const uint16_t *)buf)[i] & 0x7fffu) > 0x7c00u;
    case CFX_DTYPE_BF16:
        return (((const uint16_t *)buf)[i] & 0x7fffu) > 0x7f80u;
    case CFX_DTYPE_F32:
        return (((const uint32_t *)buf)[i] & 0x7fffffffu) > 0x7f800000u;
    case CFX_DTYPE_F64:
        return (((const uint64_t *)buf)[i] & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default:
        return 0;
    }
}

/* First element where @p got differs from the reference @p want, or SIZE_MAX. */
static size_t first_mismatch(const void *got, const void *want, size_t count, enum cfx_dtype dt,
                             enum cfx_redop op)
{
    size_t es = cfx_dtype_size(dt);
    int nan_free = (op == CFX_OP_SUM || op == CFX_OP_PROD) &&
                   (dt == CFX_DTYPE_F16 || dt == CFX_DTYPE_BF16 || dt == CFX_DTYPE_F32 ||
                    dt == CFX_DTYPE_F64);
    for (size_t i = 0; i < count; i++) {
        if (nan_free && is_nan(want, i, dt)) {
            if (!is_nan(got, i, dt))
                return i;
            continue;
        }
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0)
            return i;
    }
    return SIZE_MAX;
}

static void *dmalloc(size_t n)
{
    void *p = NULL;
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &p), CFX_OK, "%s", cfx_last_error());
    return p;
}

static void h2d(void *dev, const void *host, size_t n)
{
    cr_assert_eq(cfx__memcpy_typed(dev, CFX_MEMTYPE_CUDA, host, CFX_MEMTYPE_HOST, n), CFX_OK);
}

static void d2h(void *host, const void *dev, size_t n)
{
    cr_assert_eq(cfx__memcpy_typed(host, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, n), CFX_OK);
}

/* One case: @p count elements at element offset @p skew from the device
 * buffers' starts (skew != 0 takes the scalar kernel). */
static void check_case(enum cfx_dtype dt, enum cfx_redop op, size_t count, size_t skew,
                       uint64_t seed)
{
    size_t es = cfx_dtype_size(dt), n = (count + skew) * es;
    char *a = malloc(n), *b = malloc(n), *want = malloc(n), *got = malloc(n);
    char *da = dmalloc(n), *db = dmalloc(n), *dd = dmalloc(n);

    fill(a, count + skew, dt, seed);
    fill(b, count + skew, dt, seed + 1000003);
    /* some equal pairs: ties of min/max, x - x */
    for (size_t i = 0; i < count + skew; i += 17)
        memcpy(b + i * es, a + i * es, es);
    h2d(da, a, n);
    h2d(db, b, n);
    cr_assert_eq(cfx_reduce3(want + skew * es, a + skew * es, b + skew * es, count, dt, op),
                 CFX_OK);
    cr_assert_eq(cfx__cuda_reduce3(dd + skew * es, da + skew * es, db + skew * es, count, dt, op,
                                   NULL),
                 CFX_OK, "%s", cfx_last_error());
    d2h(got, dd, n);
    size_t bad = first_mismatch(got + skew * es, want + skew * es, count, dt, op);
    cr_assert_eq(bad, SIZE_MAX, "%s %s, %zu elements at skew %zu: element %zu differs",
                 cfx_dtype_name(dt), cfx_redop_name(op), count, skew, bad);

    /* in place (dst == a), as cfx_reduce does */
    cr_assert_eq(cfx__cuda_reduce3(da + skew * es, da + skew * es, db + skew * es, count, dt, op,
                                   NULL),
                 CFX_OK);
    d2h(got, da, n);
    bad = first_mismatch(got + skew * es, want + skew * es, count, dt, op);
    cr_assert_eq(bad, SIZE_MAX, "%s %s in place: element %zu differs", cfx_dtype_name(dt),
                 cfx_redop_name(op), bad);

    cfx__cuda_dev_free(da);
    cfx__cuda_dev_free(db);
    cfx__cuda_dev_free(dd);
    free(a);
    free(b);
    free(want);
    free(got);
}

Test(cuda_reduce, every_dtype_and_op_matches_host)
{
    need_gpu();
    static const size_t counts[] = { 1, 7, 64, 1000, 4099, (1u << 20) + 3 };
    for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
        for (int op = 0; op < CFX_OP_LAST; op++)
            for (size_t c = 0; c < CFX_ARRAY_SIZE(counts); c++)
                check_case((enum cfx_dtype)dt, (enum cfx_redop)op, counts[c], 0,
                           (uint64_t)(dt * 100 + op * 10 + (int)c + 1));
}

Test(cuda_reduce, misaligned_buffers_take_the_scalar_path)
{
    need_gpu();
    for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
        for (int op = 0; op < CFX_OP_LAST; op++)
            check_case((enum cfx_dtype)dt, (enum cfx_redop)op, 100003, 1,
                       (uint64_t)(dt * 7 + op + 5000));
}

/* Exact cases pinned down by docs/REDUCTION.md, checked on the device. */
Test(cuda_reduce, documented_edge_cases)
{
    need_gpu();
    /* f16: 65504 + 16 rounds (ties to even) to infinity; 2^-24 quanta exact */
    uint16_t ha[4] = { 0x7bff, 0x0001, 0x8000, 0x7e00 }, hb[4] = { 0x4c00, 0x0001, 0x0000, 0x3c00 };
    uint16_t hr[4];
    uint16_t *d16 = dmalloc(sizeof(ha)), *e16 = dmalloc(sizeof(hb));
    h2d(d16, ha, sizeof(ha));
    h2d(e16, hb, sizeof(hb));
    cr_assert_eq(cfx__cuda_reduce3(d16, d16, e16, 4, CFX_DTYPE_F16, CFX_OP_SUM, NULL), CFX_OK);
    d2h(hr, d16, sizeof(hr));
    cr_assert_eq(hr[0], 0x7c00, "65504 + 16 = inf, got %#x", hr[0]);
    cr_assert_eq(hr[1], 0x0002);
    cr_assert_eq(hr[2], 0x0000, "-0 + +0 = +0");
    cr_assert((hr[3] & 0x7fff) > 0x7c00, "NaN + 1 is NaN");

    /* f32 min/max: -0 < +0 either order; NaN of the first operand wins */
    uint32_t fa[4] = { 0x80000000, 0x00000000, 0x7fc00123, 0x3f800000 };
    uint32_t fb[4] = { 0x00000000, 0x80000000, 0x7fc00456, 0x7fc00789 };
    uint32_t fr[4];
    uint32_t *d32 = dmalloc(sizeof(fa)), *e32 = dmalloc(sizeof(fb)), *o32 = dmalloc(sizeof(fa));
    h2d(d32, fa, sizeof(fa));
    h2d(e32, fb, sizeof(fb));
    cr_assert_eq(cfx__cuda_reduce3(o32, d32, e32, 4, CFX_DTYPE_F32, CFX_OP_MIN, NULL), CFX_OK);
    d2h(fr, o32, sizeof(fr));
    cr_assert_eq(fr[0], 0x80000000);
    cr_assert_eq(fr[1], 0x80000000);
    cr_assert_eq(fr[2], 0x7fc00123);
    cr_assert_eq(fr[3], 0x7fc00789);
    cr_assert_eq(cfx__cuda_reduce3(o32, d32, e32, 4, CFX_DTYPE_F32, CFX_OP_MAX, NULL), CFX_OK);
    d2h(fr, o32, sizeof(fr));
    cr_assert_eq(fr[0], 0x00000000);
    cr_assert_eq(fr[1], 0x00000000);

    /* integers wrap */
    int32_t ia[2] = { INT32_MAX, 3 }, ib[2] = { 1, -7 }, ir[2];
    uint8_t ua[2] = { 200, 16 }, ub[2] = { 100, 17 }, ur[2];
    int32_t *di = dmalloc(sizeof(ia)), *ei = dmalloc(sizeof(ib));
    uint8_t *du = dmalloc(2), *eu = dmalloc(2);
    h2d(di, ia, sizeof(ia));
    h2d(ei, ib, sizeof(ib));
    h2d(du, ua, 2);
    h2d(eu, ub, 2);
    cr_assert_eq(cfx__cuda_reduce3(di, di, ei, 2, CFX_DTYPE_I32, CFX_OP_SUM, NULL), CFX_OK);
    d2h(ir, di, sizeof(ir));
    cr_assert_eq(ir[0], INT32_MIN);
    cr_assert_eq(ir[1], -4);
    cr_assert_eq(cfx__cuda_reduce3(du, du, eu, 2, CFX_DTYPE_U8, CFX_OP_SUM, NULL), CFX_OK);
    d2h(ur, du, 2);
    cr_assert_eq(ur[0], 44);
    h2d(du, ua, 2);
    cr_assert_eq(cfx__cuda_reduce3(du, du, eu, 2, CFX_DTYPE_U8, CFX_OP_PROD, NULL), CFX_OK);
    d2h(ur, du, 2);
    cr_assert_eq(ur[1], 16);

    void *all[] = { d16, e16, d32, e32, o32, di, ei, du, eu };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(all); i++)
        cfx__cuda_dev_free(all[i]);
}

/* The reduce of a landed chunk: the operand in pinned host memory, the
 * accumulator on the device, queued on the caller's stream. */
Test(cuda_reduce, pinned_operand_on_callers_stream)
{
    need_gpu();
    const size_t count = (3u << 20) + 5, n = count * sizeof(float);
    float *acc = malloc(n), *chunk = NULL, *want = malloc(n), *got = malloc(n);
    float *dacc = dmalloc(n);
    cudaStream_t s;

    cr_assert_eq(cfx__cuda_host_alloc(n, (void **)&chunk), CFX_OK);
    fill(acc, count, CFX_DTYPE_F32, 77);
    fill(chunk, count, CFX_DTYPE_F32, 78);
    memcpy(want, acc, n);
    cr_assert_eq(cfx_reduce(want, chunk, count, CFX_DTYPE_F32, CFX_OP_SUM), CFX_OK);
    h2d(dacc, acc, n);
    cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, dacc, dacc, chunk, count, CFX_DTYPE_F32,
                                      CFX_OP_SUM, s),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    d2h(got, dacc, n);
    size_t bad = first_mismatch(got, want, count, CFX_DTYPE_F32, CFX_OP_SUM);
    cr_assert_eq(bad, SIZE_MAX, "element %zu differs", bad);
    cudaStreamDestroy(s);
    cfx__cuda_host_free(chunk);
    cfx__cuda_dev_free(dacc);
    free(acc);
    free(want);
    free(got);
}

Test(cuda_reduce, argument_errors)
{
    need_gpu();
    float host[16] = { 0 };
    float *dev = dmalloc(sizeof(host));

    cr_assert_eq(cfx__cuda_reduce3(dev, dev, dev, 16, CFX_DTYPE_LAST, CFX_OP_SUM, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__cuda_reduce3(dev, dev, dev, 16, CFX_DTYPE_F32, CFX_OP_LAST, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__cuda_reduce3(NULL, dev, dev, 16, CFX_DTYPE_F32, CFX_OP_SUM, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__cuda_reduce3(NULL, NULL, NULL, 0, CFX_DTYPE_F32, CFX_OP_SUM, NULL), CFX_OK);
    /* pageable host memory would fault the kernel: refused up front */
    cr_assert_eq(cfx__cuda_reduce3(dev, dev, host, 16, CFX_DTYPE_F32, CFX_OP_SUM, NULL),
                 CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "pageable"), "%s", cfx_last_error());
    cr_assert_eq(cfx__cuda_reduce3(host, dev, dev, 16, CFX_DTYPE_F32, CFX_OP_SUM, NULL),
                 CFX_ERR_INVALID);
    /* and the context is still fine */
    cr_assert_eq(cfx__cuda_reduce3(dev, dev, dev, 16, CFX_DTYPE_F32, CFX_OP_SUM, NULL), CFX_OK);
    cfx__cuda_dev_free(dev);
}
#endif

/*
 * dataplane/reduce: every dtype x op against scalar references written here,
 * on every kernel set the CPU can run, at awkward counts and alignments,
 * with aliasing, special values and the error paths.
 *
 * The 16-bit float references are built from double arithmetic and
 * ldexp/frexp/rint, independently of the library's bit tricks; where the
 * compiler has _Float16, the half reference is itself checked against it.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/reduce.h>
#include <conflux/status.h>

#include "dataplane/reduce/fp16.h"
#include "dataplane/reduce/reduce_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define TEST_X86 1
#endif

#define ARRAY_N(a) (sizeof(a) / sizeof((a)[0]))

TestSuite(reduce);

/* ---- random values --------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* ---- independent 16-bit float reference ------------------------------------ */

struct fmt16 {
    int mbits; /* stored mantissa bits */
    int ebits; /* exponent bits */
};

static const struct fmt16 FMT_F16 = { 10, 5 };
static const struct fmt16 FMT_BF16 = { 7, 8 };

static double ref_decode(uint16_t h, struct fmt16 f)
{
    int bias = (1 << (f.ebits - 1)) - 1;
    unsigned e = (h >> f.mbits) & ((1u << f.ebits) - 1);
    unsigned m = h & ((1u << f.mbits) - 1);
    double s = (h & 0x8000) ? -1.0 : 1.0;

    if (e == (1u << f.ebits) - 1)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, 1 - bias - f.mbits);
    return s * ldexp((double)(m + (1u << f.mbits)), (int)e - bias - f.mbits);
}

/* Round a double (which here always holds a binary32) to the format: nearest,
 * ties to even, by scaling to an integer count of quanta and rint(). */
static uint16_t ref_encode(double x, struct fmt16 f)
{
    int bias = (1 << (f.ebits - 1)) - 1;
    int emin = 1 - bias, emax = bias;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint16_t expmask = (uint16_t)(((1u << f.ebits) - 1) << f.mbits);
    double a = fabs(x);
    int e;

    if (isnan(x))
        return sign | expmask | (uint16_t)(1u << (f.mbits - 1));
    if (isinf(a))
        return sign | expmask;
    if (a == 0)
        return sign;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin)
        e = emin;
    double n = rint(a / ldexp(1.0, e - f.mbits)); /* exact division: power of two */
    if (n >= ldexp(1.0, f.mbits + 1)) {           /* rounded up a binade */
        n /= 2;
        e += 1;
    }
    if (e > emax)
        return sign | expmask;
    if (n < ldexp(1.0, f.mbits)) /* subnormal */
        return sign | (uint16_t)n;
    return sign | (uint16_t)((e + bias) << f.mbits) | (uint16_t)(n - ldexp(1.0, f.mbits));
}

/* ---- reference element ops ------------------------------------------------- */

static int is_float(enum cfx_dtype dt)
{
    return dt == CFX_DTYPE_F32 || dt == CFX_DTYPE_F64 || dt == CFX_DTYPE_F16 ||
           dt == CFX_DTYPE_BF16;
}

/* Value of a float element as a double (exact), NaN-ness included. */
static double elem_value(enum cfx_dtype dt, const void *p)
{
    switch (dt) {
    case CFX_DTYPE_F32: {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    case CFX_DTYPE_F64: {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    case CFX_DTYPE_F16:
    case CFX_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return ref_decode(h, dt == CFX_DTYPE_F16 ? FMT_F16 : FMT_BF16);
    }
    default: return 0;
    }
}

/* IEEE 754-2019 minimum/maximum: first NaN wins, -0 < +0; returns 0 for a, 1 for b. */
static int ref_pick(double x, double y, enum cfx_redop op)
{
    if (isnan(x))
        return 0;
    if (isnan(y))
        return 1;
    if (x != y)
        return op == CFX_OP_MIN ? (y < x) : (y > x);
    if (op == CFX_OP_MIN)
        return signbit(x) ? 0 : 1;
    return signbit(x) ? 1 : 0;
}

static void ref_op(enum cfx_dtype dt, enum cfx_redop op, const void *a, const void *b, void *out)
{
    size_t sz = cfx_dtype_size(dt);

    if (is_float(dt) && (op == CFX_OP_MIN || op == CFX_OP_MAX)) {
        memcpy(out, ref_pick(elem_value(dt, a), elem_value(dt, b), op) ? b : a, sz);
        return;
    }
    switch (dt) {
    case CFX_DTYPE_F32: {
        float x, y, r;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        r = op == CFX_OP_SUM ? x + y : x * y;
        memcpy(out, &r, 4);
        break;
    }
    case CFX_DTYPE_F64: {
        double x, y, r;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        r = op == CFX_OP_SUM ? x + y : x * y;
        memcpy(out, &r, 8);
        break;
    }
    case CFX_DTYPE_F16:
    case CFX_DTYPE_BF16: {
        struct fmt16 f = dt == CFX_DTYPE_F16 ? FMT_F16 : FMT_BF16;
        volatile float x = (float)elem_value(dt, a), y = (float)elem_value(dt, b);
        volatile float r = op == CFX_OP_SUM ? x + y : x * y;
        uint16_t h = ref_encode(r, f);
        memcpy(out, &h, 2);
        break;
    }
    case CFX_DTYPE_I32: {
        int32_t x, y, r;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        int64_t wide = op == CFX_OP_SUM ? (int64_t)x + y : (int64_t)x * y;
        if (op == CFX_OP_MIN)
            r = x < y ? x : y;
        else if (op == CFX_OP_MAX)
            r = x > y ? x : y;
        else
            r = (int32_t)(uint32_t)((uint64_t)wide & 0xffffffffu);
        memcpy(out, &r, 4);
        break;
    }
    case CFX_DTYPE_I64: {
        int64_t x, y, r;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (op == CFX_OP_MIN)
            r = x < y ? x : y;
        else if (op == CFX_OP_MAX)
            r = x > y ? x : y;
        else if (op == CFX_OP_SUM)
            r = (int64_t)(uint64_t)((__int128)x + y);
        else
            r = (int64_t)(uint64_t)((__int128)x * y);
        memcpy(out, &r, 8);
        break;
    }
    case CFX_DTYPE_U8: {
        unsigned x = *(const uint8_t *)a, y = *(const uint8_t *)b, r;
        switch (op) {
        case CFX_OP_SUM: r = (x + y) % 256; break;
        case CFX_OP_PROD: r = (x * y) % 256; break;
        case CFX_OP_MIN: r = x < y ? x : y; break;
        default: r = x > y ? x : y; break;
        }
        *(uint8_t *)out = (uint8_t)r;
        break;
    }
    default: cr_assert_fail("bad dtype");
    }
}

/* Whether @p got is the right answer: bit-exact, except that a NaN from sum
 * or prod only has to be a NaN (its payload is unspecified). */
static int elem_ok(enum cfx_dtype dt, enum cfx_redop op, const void *got, const void *want)
{
    if (is_float(dt) && (op == CFX_OP_SUM || op == CFX_OP_PROD) && isnan(elem_value(dt, want)))
        return isnan(elem_value(dt, got));
    return memcmp(got, want, cfx_dtype_size(dt)) == 0;
}

/* ---- input generation ------------------------------------------------------ */

static const uint32_t f32_special[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
    0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000, 0xbf800000,
    0x3f000000, 0x33800000, 0x477fe000, 0x477ff000, 0x387fc000, 0x33000000,
};
static const uint64_t f64_special[] = {
    0,
    0x8000000000000000ull,
    0x7ff0000000000000ull,
    0xfff0000000000000ull,
    0x7ff8000000000000ull,
    0xfff8000000000001ull,
    0x7ff0000000000001ull,
    1,
    0x800fffffffffffffull,
    0x0010000000000000ull,
    0x7fefffffffffffffull,
    0x3ff0000000000000ull,
    0xbff0000000000000ull,
};
static const uint16_t f16_special[] = {
    0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x0001, 0x83ff,
    0x0400, 0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x3800, 0x5bf8, 0x0200,
};
static const uint16_t bf16_special[] = {
    0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x0001, 0x807f,
    0x0080, 0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x3f00, 0x3b80, 0x3f81,
};

static void gen_elem(enum cfx_dtype dt, void *p)
{
    uint64_t r = rng();
    int special = (r & 3) == 0;
    uint64_t v = rng();

    switch (dt) {
    case CFX_DTYPE_F32: {
        uint32_t u = special ? f32_special[v % ARRAY_N(f32_special)] : (uint32_t)v;
        memcpy(p, &u, 4);
        break;
    }
    case CFX_DTYPE_F64: {
        uint64_t u = special ? f64_special[v % ARRAY_N(f64_special)] : v;
        memcpy(p, &u, 8);
        break;
    }
    case CFX_DTYPE_F16: {
        uint16_t u = special ? f16_special[v % ARRAY_N(f16_special)] : (uint16_t)v;
        memcpy(p, &u, 2);
        break;
    }
    case CFX_DTYPE_BF16: {
        uint16_t u = special ? bf16_special[v % ARRAY_N(bf16_special)] : (uint16_t)v;
        memcpy(p, &u, 2);
        break;
    }
    case CFX_DTYPE_I32: {
        static const uint32_t sp[] = { 0, 1, 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x10000u };
        uint32_t u = special ? sp[v % ARRAY_N(sp)] : (uint32_t)v;
        memcpy(p, &u, 4);
        break;
    }
    case CFX_DTYPE_I64: {
        static const uint64_t sp[] = { 0, 1, ~0ull, 0x7fffffffffffffffull, 1ull << 63, 1ull << 32 };
        uint64_t u = special ? sp[v % ARRAY_N(sp)] : v;
        memcpy(p, &u, 8);
        break;
    }
    default: *(uint8_t *)p = (uint8_t)v; break;
    }
}

/* ---- the exhaustive-ish sweep ---------------------------------------------- */

enum mode {
    MODE_INPLACE,      /* cfx_reduce(A, B) */
    MODE_OUT,          /* cfx_reduce3(D, A, B) */
    MODE_ALIAS_A,      /* cfx_reduce3(A, A, B) */
    MODE_ALIAS_B,      /* cfx_reduce3(B, A, B) */
    MODE_ALIAS_ALL,    /* cfx_reduce3(A, A, A) */
    MODE_INPLACE_SELF, /* cfx_reduce(A, A) */
    MODE_LAST
};

static const size_t counts[] = { 0, 1, 7, 15, 16, 17, 31, 33, 64, 1023, 4099 };
#define MAXCOUNT 4099
#define GUARD    64
#define GUARDB   0xa5

/* Run one (isa, dtype, op, count, byte offset, mode) case; asserts inside. */
static void run_case(const char *isa, enum cfx_dtype dt, enum cfx_redop op, size_t n, size_t off,
                     enum mode mode)
{
    size_t sz = cfx_dtype_size(dt);
    size_t span = GUARD + off + n * sz + GUARD;
    uint8_t *A = malloc(span), *B = malloc(span), *D = malloc(span);
    uint8_t *a0 = malloc(n * sz + 1), *b0 = malloc(n * sz + 1), *want = malloc(n * sz + 1);
    cr_assert(A && B && D && a0 && b0 && want);
    memset(A, GUARDB, span);
    memset(B, GUARDB, span);
    memset(D, GUARDB, span);

    uint8_t *pa = A + GUARD + off, *pb = B + GUARD + off, *pd = D + GUARD + off;
    for (size_t i = 0; i < n; i++) {
        gen_elem(dt, pa + i * sz);
        gen_elem(dt, pb + i * sz);
    }
    if (mode == MODE_ALIAS_ALL || mode == MODE_INPLACE_SELF)
        memcpy(pb, pa, n * sz);
    memcpy(a0, pa, n * sz);
    memcpy(b0, pb, n * sz);
    for (size_t i = 0; i < n; i++)
        ref_op(dt, op, a0 + i * sz, b0 + i * sz, want + i * sz);

    int rc;
    uint8_t *res, *buf;
    switch (mode) {
    case MODE_INPLACE: rc = cfx_reduce(pa, pb, n, dt, op), res = pa, buf = A; break;
    case MODE_OUT: rc = cfx_reduce3(pd, pa, pb, n, dt, op), res = pd, buf = D; break;
    case MODE_ALIAS_A: rc = cfx_reduce3(pa, pa, pb, n, dt, op), res = pa, buf = A; break;
    case MODE_ALIAS_B: rc = cfx_reduce3(pb, pa, pb, n, dt, op), res = pb, buf = B; break;
    case MODE_ALIAS_ALL: rc = cfx_reduce3(pa, pa, pa, n, dt, op), res = pa, buf = A; break;
    default: rc = cfx_reduce(pa, pa, n, dt, op), res = pa, buf = A; break;
    }
    cr_assert_eq(rc, CFX_OK);

    for (size_t i = 0; i < n; i++) {
        const uint8_t *g = res + i * sz, *w = want + i * sz;
        if (!elem_ok(dt, op, g, w)) {
            uint64_t gv = 0, wv = 0, av = 0, bv = 0;
            memcpy(&gv, g, sz);
            memcpy(&wv, w, sz);
            memcpy(&av, a0 + i * sz, sz);
            memcpy(&bv, b0 + i * sz, sz);
            cr_assert_fail("%s %s %s n=%zu off=%zu mode=%d [%zu]: %#llx op %#llx = %#llx, "
                           "want %#llx",
                           isa, cfx_dtype_name(dt), cfx_redop_name(op), n, off, (int)mode, i,
                           (unsigned long long)av, (unsigned long long)bv, (unsigned long long)gv,
                           (unsigned long long)wv);
        }
    }
    /* Nothing outside the destination range is touched. */
    for (size_t i = 0; i < GUARD + off; i++)
        cr_assert_eq(buf[i], GUARDB, "%s %s %s n=%zu: wrote before dst", isa, cfx_dtype_name(dt),
                     cfx_redop_name(op), n);
    for (size_t i = GUARD + off + n * sz; i < span; i++)
        cr_assert_eq(buf[i], GUARDB, "%s %s %s n=%zu: wrote past dst", isa, cfx_dtype_name(dt),
                     cfx_redop_name(op), n);
    /* Inputs that are not the destination are left alone. */
    if (mode == MODE_OUT || mode == MODE_INPLACE || mode == MODE_ALIAS_A)
        cr_assert(memcmp(pb, b0, n * sz) == 0, "src changed");
    if (mode == MODE_OUT || mode == MODE_ALIAS_B)
        cr_assert(memcmp(pa, a0, n * sz) == 0, "a changed");

    free(A);
    free(B);
    free(D);
    free(a0);
    free(b0);
    free(want);
}

/* Switch to the kernels of @p isa, or skip the test saying why this process
 * cannot run them (the CPU lacks them, or CFX_REDUCE_ISA caps them off). */
static void use_isa(enum cfx__reduce_isa isa)
{
    const char *why = cfx__reduce_isa_why_not(isa);
    if (why)
        cr_skip_test("kernel set %s not run: %s", cfx__reduce_isa_name(isa), why);
    cr_assert_eq(cfx__reduce_set_isa(isa), CFX_OK);
    cr_assert_eq(cfx__reduce_active(), cfx__reduce_tables[isa]);
}

static void sweep(enum cfx__reduce_isa isa, enum cfx_dtype dt)
{
    use_isa(isa);
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)dt;
    const char *name = cfx__reduce_isa_name(isa);
    size_t sz = cfx_dtype_size(dt);
    /* Offsets: aligned, one element off, and (for wide types) one byte off. */
    size_t offs[3] = { 0, sz, 1 };
    int noffs = sz > 1 ? 3 : 2;
    for (int op = 0; op < CFX_OP_LAST; op++)
        for (size_t c = 0; c < ARRAY_N(counts); c++)
            for (int o = 0; o < noffs; o++)
                for (int m = 0; m < MODE_LAST; m++)
                    run_case(name, dt, (enum cfx_redop)op, counts[c], offs[o], (enum mode)m);
}

/* One test per kernel set and dtype, so a set this machine cannot run shows
 * up as skipped tests with the reason, never as a pass. */
#define SWEEP_TESTS(dname, DT)                                                                     \
    Test(reduce, sweep_##dname##_default)                                                          \
    {                                                                                              \
        sweep(CFX__REDUCE_ISA_DEFAULT, DT);                                                        \
    }                                                                                              \
    Test(reduce, sweep_##dname##_avx2)                                                             \
    {                                                                                              \
        sweep(CFX__REDUCE_ISA_AVX2, DT);                                                           \
    }                                                                                              \
    Test(reduce, sweep_##dname##_avx512)                                                           \
    {                                                                                              \
        sweep(CFX__REDUCE_ISA_AVX512, DT);                                                         \
    }

SWEEP_TESTS(f32, CFX_DTYPE_F32)
SWEEP_TESTS(f64, CFX_DTYPE_F64)
SWEEP_TESTS(f16, CFX_DTYPE_F16)
SWEEP_TESTS(bf16, CFX_DTYPE_BF16)
SWEEP_TESTS(i32, CFX_DTYPE_I32)
SWEEP_TESTS(i64, CFX_DTYPE_I64)
SWEEP_TESTS(u8, CFX_DTYPE_U8)

/* The same for a check written as static void NAME(void) that runs on the
 * active kernel set. */
#define PER_ISA_TESTS(fn)                                                                          \
    Test(reduce, fn##_default)                                                                     \
    {                                                                                              \
        use_isa(CFX__REDUCE_ISA_DEFAULT);                                                          \
        fn();                                                                                      \
    }                                                                                              \
    Test(reduce, fn##_avx2)                                                                        \
    {                                                                                              \
        use_isa(CFX__REDUCE_ISA_AVX2);                                                             \
        fn();                                                                                      \
    }                                                                                              \
    Test(reduce, fn##_avx512)                                                                      \
    {                                                                                              \
        use_isa(CFX__REDUCE_ISA_AVX512);                                                           \
        fn();                                                                                      \
    }

/* ---- named special cases, on every kernel set ------------------------------ */

struct case16 {
    enum cfx_dtype dt;
    enum cfx_redop op;
    uint16_t a, b, want;
    const char *what;
};

static const struct case16 cases16[] = {
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x7bff, 0x4c00, 0x7c00, "65504 + 16 ties up to inf" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x7bff, 0x4bff, 0x7bff, "65504 + 15.99 stays at max" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x7bff, 0x7bff, 0x7c00, "max + max = inf" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0xfbff, 0xfbff, 0xfc00, "-max + -max = -inf" },
    { CFX_DTYPE_F16, CFX_OP_PROD, 0x5cb0, 0x5cb0, 0x7c00, "300 * 300 = inf" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x0001, 0x0001, 0x0002, "subnormal + subnormal" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x03ff, 0x0001, 0x0400, "subnormal carries into normal" },
    { CFX_DTYPE_F16, CFX_OP_PROD, 0x0001, 0x3800, 0x0000, "2^-25 ties to even (0)" },
    { CFX_DTYPE_F16, CFX_OP_PROD, 0x0003, 0x3800, 0x0002, "3*2^-25 ties to even (2)" },
    { CFX_DTYPE_F16, CFX_OP_PROD, 0x8001, 0x3800, 0x8000, "-2^-25 ties to -0" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x3c00, 0x1000, 0x3c00, "1 + 2^-11 ties to even (1)" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x3c01, 0x1000, 0x3c02, "(1+2^-10) + 2^-11 ties up" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x3c00, 0xbc00, 0x0000, "1 + -1 = +0" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x8000, 0x8000, 0x8000, "-0 + -0 = -0" },
    { CFX_DTYPE_F16, CFX_OP_SUM, 0x7c00, 0x3c00, 0x7c00, "inf + 1 = inf" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0x8000, 0x0000, 0x8000, "min(-0, +0) = -0" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0x0000, 0x8000, 0x8000, "min(+0, -0) = -0" },
    { CFX_DTYPE_F16, CFX_OP_MAX, 0x8000, 0x0000, 0x0000, "max(-0, +0) = +0" },
    { CFX_DTYPE_F16, CFX_OP_MAX, 0x0000, 0x8000, 0x0000, "max(+0, -0) = +0" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0x7e00, 0x3c00, 0x7e00, "min(NaN, 1) = NaN" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0x3c00, 0x7e01, 0x7e01, "min(1, NaN) = that NaN" },
    { CFX_DTYPE_F16, CFX_OP_MAX, 0xfe05, 0x7e01, 0xfe05, "max(NaN1, NaN2) = NaN1" },
    { CFX_DTYPE_F16, CFX_OP_MAX, 0x7c00, 0x7e00, 0x7e00, "max(inf, NaN) = NaN" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0xfc00, 0x7c01, 0x7c01, "min(-inf, sNaN) = sNaN, unquieted" },
    { CFX_DTYPE_F16, CFX_OP_MIN, 0xbc00, 0x3c00, 0xbc00, "min(-1, 1) = -1" },
    { CFX_DTYPE_F16, CFX_OP_MAX, 0x0001, 0x8001, 0x0001, "max of subnormals" },
    { CFX_DTYPE_BF16, CFX_OP_SUM, 0x3f80, 0x3b80, 0x3f80, "1 + 2^-8 ties to even (1)" },
    { CFX_DTYPE_BF16, CFX_OP_SUM, 0x3f81, 0x3b80, 0x3f82, "(1+2^-7) + 2^-8 ties up" },
    { CFX_DTYPE_BF16, CFX_OP_SUM, 0x7f7f, 0x7f7f, 0x7f80, "max + max = inf" },
    { CFX_DTYPE_BF16, CFX_OP_PROD, 0x0001, 0x3f00, 0x0000, "min subnormal * 0.5 ties to 0" },
    { CFX_DTYPE_BF16, CFX_OP_SUM, 0x0001, 0x0001, 0x0002, "subnormal + subnormal" },
    { CFX_DTYPE_BF16, CFX_OP_SUM, 0xff80, 0x3f80, 0xff80, "-inf + 1 = -inf" },
    { CFX_DTYPE_BF16, CFX_OP_MIN, 0x8000, 0x0000, 0x8000, "min(-0, +0) = -0" },
    { CFX_DTYPE_BF16, CFX_OP_MAX, 0x0000, 0x8000, 0x0000, "max(+0, -0) = +0" },
    { CFX_DTYPE_BF16, CFX_OP_MAX, 0x3f80, 0xffc1, 0xffc1, "max(1, NaN) = that NaN" },
};

static int nan16(enum cfx_dtype dt, uint16_t h)
{
    return dt == CFX_DTYPE_F16 ? (h & 0x7fff) > 0x7c00 : (h & 0x7fff) > 0x7f80;
}

static void special_values_16bit(void)
{
    for (size_t i = 0; i < ARRAY_N(cases16); i++) {
        const struct case16 *c = &cases16[i];
        /* Put the pair in a 37-element run so the vector body and the
         * tail both see it. */
        uint16_t a[37], b[37], d[37];
        for (int k = 0; k < 37; k++)
            a[k] = c->a, b[k] = c->b;
        cr_assert_eq(cfx_reduce3(d, a, b, 37, c->dt, c->op), CFX_OK);
        for (int k = 0; k < 37; k++)
            cr_assert_eq(d[k], c->want, "%s: %s: got %#06x want %#06x at %d",
                         cfx__reduce_active()->name, c->what, d[k],
                         c->want, k);
    }
    /* Arithmetic NaN: NaN in, NaN out (payload unspecified). */
    for (int dt = CFX_DTYPE_F16; dt <= CFX_DTYPE_BF16; dt++) {
        uint16_t qn = dt == CFX_DTYPE_F16 ? 0x7e00 : 0x7fc0;
        uint16_t one = dt == CFX_DTYPE_F16 ? 0x3c00 : 0x3f80;
        uint16_t inf = dt == CFX_DTYPE_F16 ? 0x7c00 : 0x7f80;
        uint16_t a[4] = { qn, one, inf, 0 }, b[4] = { one, qn, (uint16_t)(inf | 0x8000), inf };
        cr_assert_eq(cfx_reduce(a, b, 4, (enum cfx_dtype)dt, CFX_OP_SUM), CFX_OK);
        cr_assert(nan16(dt, a[0]) && nan16(dt, a[1]) && nan16(dt, a[2]), "NaN / inf-inf");
        cr_assert_eq(a[3], inf);
        uint16_t p[2] = { 0, inf }, q[2] = { inf, 0x8000 };
        cr_assert_eq(cfx_reduce(p, q, 2, (enum cfx_dtype)dt, CFX_OP_PROD), CFX_OK);
        cr_assert(nan16(dt, p[0]) && nan16(dt, p[1]), "0 * inf");
    }
}
PER_ISA_TESTS(special_values_16bit)

static void special_values_f32_f64(void)
{
    float fa[19], fb[19], fd[19];
    double da[19], db[19], dd[19];
    for (int k = 0; k < 19; k++) {
        fa[k] = -0.0f, fb[k] = 0.0f;
        da[k] = 0.0, db[k] = -0.0;
    }
    fa[3] = NAN, fb[3] = 1.0f;    /* min(NaN, 1) */
    fa[4] = 1.0f, fb[4] = -NAN;   /* min(1, -NaN) */
    fa[5] = -INFINITY, fb[5] = 5; /* ordinary */
    fa[6] = FLT_TRUE_MIN, fb[6] = -FLT_TRUE_MIN;
    cr_assert_eq(cfx_reduce3(fd, fa, fb, 19, CFX_DTYPE_F32, CFX_OP_MIN), CFX_OK);
    cr_assert(signbit(fd[0]) && fd[0] == 0, "min(-0, +0) = -0");
    cr_assert(isnan(fd[3]) && !signbit(fd[3]));
    cr_assert(isnan(fd[4]) && signbit(fd[4]), "min(1, -NaN) is that NaN");
    cr_assert(fd[5] == -INFINITY);
    cr_assert(fd[6] == -FLT_TRUE_MIN);
    cr_assert_eq(cfx_reduce3(fd, fa, fb, 19, CFX_DTYPE_F32, CFX_OP_MAX), CFX_OK);
    cr_assert(!signbit(fd[0]) && fd[0] == 0, "max(-0, +0) = +0");
    cr_assert(isnan(fd[3]) && isnan(fd[4]));
    cr_assert(fd[5] == 5 && fd[6] == FLT_TRUE_MIN);

    da[2] = DBL_MAX, db[2] = DBL_MAX;
    da[3] = DBL_TRUE_MIN, db[3] = DBL_TRUE_MIN;
    da[4] = INFINITY, db[4] = -INFINITY;
    cr_assert_eq(cfx_reduce3(dd, da, db, 19, CFX_DTYPE_F64, CFX_OP_SUM), CFX_OK);
    cr_assert(dd[0] == 0 && !signbit(dd[0]), "+0 + -0 = +0");
    cr_assert(dd[2] == INFINITY && dd[3] == 2 * DBL_TRUE_MIN && isnan(dd[4]));
    cr_assert_eq(cfx_reduce3(dd, da, db, 19, CFX_DTYPE_F64, CFX_OP_MIN), CFX_OK);
    cr_assert(dd[0] == 0 && signbit(dd[0]), "min(+0, -0) = -0");
    cr_assert(dd[4] == -INFINITY);
}
PER_ISA_TESTS(special_values_f32_f64)

static void integers_wrap(void)
{
    int32_t i32a[9] = { INT32_MAX, INT32_MIN, -1, 65536 }, i32b[9] = { 1, -1, 1, 65536 };
    cr_assert_eq(cfx_reduce(i32a, i32b, 9, CFX_DTYPE_I32, CFX_OP_SUM), CFX_OK);
    cr_assert(i32a[0] == INT32_MIN && i32a[1] == INT32_MAX && i32a[2] == 0);
    int32_t i32c[9] = { 65536, INT32_MIN, -3 }, i32d[9] = { 65536, -1, 7 };
    cr_assert_eq(cfx_reduce(i32c, i32d, 9, CFX_DTYPE_I32, CFX_OP_PROD), CFX_OK);
    cr_assert(i32c[0] == 0 && i32c[1] == INT32_MIN && i32c[2] == -21);
    int32_t mn[9] = { -5, INT32_MIN }, mx[9] = { 3, INT32_MAX };
    cr_assert_eq(cfx_reduce(mn, mx, 9, CFX_DTYPE_I32, CFX_OP_MIN), CFX_OK);
    cr_assert(mn[0] == -5 && mn[1] == INT32_MIN, "min is signed");

    int64_t i64a[5] = { INT64_MAX, INT64_MIN, (int64_t)1 << 32 },
            i64b[5] = { 1, -1, (int64_t)1 << 32 };
    cr_assert_eq(cfx_reduce(i64a, i64b, 5, CFX_DTYPE_I64, CFX_OP_SUM), CFX_OK);
    cr_assert(i64a[0] == INT64_MIN && i64a[1] == INT64_MAX);
    int64_t i64c[5] = { (int64_t)1 << 32, -3, INT64_MIN },
            i64d[5] = { (int64_t)1 << 32, 7, -1 };
    cr_assert_eq(cfx_reduce(i64c, i64d, 5, CFX_DTYPE_I64, CFX_OP_PROD), CFX_OK);
    cr_assert(i64c[0] == 0 && i64c[1] == -21 && i64c[2] == INT64_MIN);
    int64_t l[5] = { -1 }, r[5] = { 1 };
    cr_assert_eq(cfx_reduce(l, r, 5, CFX_DTYPE_I64, CFX_OP_MAX), CFX_OK);
    cr_assert(l[0] == 1, "max is signed");

    uint8_t u[40], v[40];
    for (int k = 0; k < 40; k++)
        u[k] = 200, v[k] = 100;
    cr_assert_eq(cfx_reduce(u, v, 40, CFX_DTYPE_U8, CFX_OP_SUM), CFX_OK);
    for (int k = 0; k < 40; k++)
        cr_assert_eq(u[k], 44, "200 + 100 wraps to 44");
    for (int k = 0; k < 40; k++)
        u[k] = 16, v[k] = 17;
    cr_assert_eq(cfx_reduce(u, v, 40, CFX_DTYPE_U8, CFX_OP_PROD), CFX_OK);
    for (int k = 0; k < 40; k++)
        cr_assert_eq(u[k], 16, "16 * 17 = 272 wraps to 16");
    for (int k = 0; k < 40; k++)
        u[k] = 255, v[k] = 1;
    cr_assert_eq(cfx_reduce(u, v, 40, CFX_DTYPE_U8, CFX_OP_MIN), CFX_OK);
    for (int k = 0; k < 40; k++)
        cr_assert_eq(u[k], 1, "u8 min is unsigned");
}
PER_ISA_TESTS(integers_wrap)

/* A chain of reductions rounds after every step: adding 1.0 to a half
 * accumulator 3000 times stalls at 2048, where 2048 + 1 ties to even. */
Test(reduce, f16_chain_rounds_each_step)
{
    uint16_t acc = 0x0000, one = 0x3c00;
    for (int k = 0; k < 3000; k++)
        cr_assert_eq(cfx_reduce(&acc, &one, 1, CFX_DTYPE_F16, CFX_OP_SUM), CFX_OK);
    /* 2048 + 1 = 2049 ties to even (2048) in half: the sum stops at 2048. */
    cr_assert_eq(acc, 0x6800, "got %#06x", acc);
}

/* ---- conversions: library helpers vs the reference and the hardware -------- */

Test(reduce, f16_decode_all)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float got = cfx__f16_to_f32((uint16_t)h);
        double want = ref_decode((uint16_t)h, FMT_F16);
        if (isnan(want))
            cr_assert(isnan(got), "%#06x", h);
        else
            cr_assert(got == want && !signbit(got) == !signbit(want), "%#06x -> %a, want %a", h,
                      (double)got, want);
        cr_assert_eq(cfx__f32_bits(cfx__bf16_to_f32((uint16_t)h)), h << 16);
    }
}

/* f32 -> 16-bit on every tie point of the format, one ulp either side, and a
 * stride through the whole binary32 space. */
static void check_encode(uint32_t u)
{
    float f = cfx__f32_from_bits(u);
    uint16_t h = cfx__f32_to_f16(f), b = cfx__f32_to_bf16(f);
    uint16_t wh = ref_encode(f, FMT_F16), wb = ref_encode(f, FMT_BF16);
    if (isnan(f)) {
        cr_assert(nan16(CFX_DTYPE_F16, h) && nan16(CFX_DTYPE_BF16, b), "%#010x", u);
        cr_assert_eq(h & 0x8000, (u >> 16) & 0x8000, "NaN sign kept");
        cr_assert_eq(b, (uint16_t)((u >> 16) | 0x40), "bf16 NaN keeps its top payload");
        return;
    }
    cr_assert_eq(h, wh, "f16(%a [%#010x]) = %#06x, want %#06x", (double)f, u, h, wh);
    cr_assert_eq(b, wb, "bf16(%a [%#010x]) = %#06x, want %#06x", (double)f, u, b, wb);
}

Test(reduce, f16_bf16_encode)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        /* Half: the exact value, and the midpoint to the next value up. */
        double v = ref_decode((uint16_t)h, FMT_F16);
        if (!isnan(v) && !isinf(v)) {
            uint16_t up = (uint16_t)(h + 1);
            double nv = (h & 0x7fff) == 0x7bff ? copysign(65536.0, v) : ref_decode(up, FMT_F16);
            uint32_t mid = cfx__f32_bits((float)((v + nv) / 2)); /* exact in f32 */
            uint32_t at = cfx__f32_bits((float)v);
            for (int d = -2; d <= 2; d++) {
                check_encode(mid + (uint32_t)d);
                check_encode(at + (uint32_t)d);
            }
        }
        /* bf16: ties sit at the 0x8000 point of the dropped half. */
        uint32_t base = h << 16;
        static const uint32_t low[] = { 0, 1, 0x7fff, 0x8000, 0x8001, 0xffff };
        for (size_t k = 0; k < ARRAY_N(low); k++)
            check_encode(base | low[k]);
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093)
        check_encode((uint32_t)u);
}

#ifdef __FLT16_MAX__
/* The half reference itself, against the compiler's _Float16 (libgcc). */
Test(reduce, f16_reference_matches_float16)
{
    rng_state = 12345;
    for (int k = 0; k < 2000000; k++) {
        uint32_t u = (uint32_t)rng();
        float f = cfx__f32_from_bits(u);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &h, 2);
        cr_assert_eq(ref_encode(f, FMT_F16), hb, "%#010x", u);
    }
}
#endif

#ifdef TEST_X86
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}

__attribute__((target("f16c"))) static uint32_t hw_f16_to_f32(uint16_t h)
{
    return cfx__f32_bits(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
}

/* The software conversions give the F16C bits exactly, NaNs included, so
 * the baseline and the vector kernels agree bit for bit. */
Test(reduce, f16_software_matches_f16c)
{
    unsigned eax, ebx, ecx, edx; /* CPUID.1:ECX.F16C (clang's builtin lacks "f16c") */
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C))
        cr_skip_test("this CPU has no F16C");
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t hw = hw_f16_to_f32((uint16_t)h), sw = cfx__f32_bits(cfx__f16_to_f32((uint16_t)h));
        if ((h & 0x7fff) > 0x7c00) /* F16C quiets signalling NaNs */
            cr_assert_eq(hw, sw | 0x00400000u, "%#06x", h);
        else
            cr_assert_eq(hw, sw, "%#06x", h);
    }
    for (uint64_t u = 0; u < 0x100000000ull; u += 997) {
        float f = cfx__f32_from_bits((uint32_t)u);
        cr_assert_eq(cfx__f32_to_f16(f), hw_f32_to_f16(f), "%#010llx", (unsigned long long)u);
    }
}
#endif

/* ---- error paths and names ------------------------------------------------- */

Test(reduce, invalid_arguments)
{
    float x[4] = { 0 }, y[4] = { 0 };
    cr_assert_eq(cfx_reduce(x, y, 4, CFX_DTYPE_LAST, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(x, y, 4, (enum cfx_dtype) - 1, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(x, y, 4, CFX_DTYPE_F32, CFX_OP_LAST), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(x, y, 4, CFX_DTYPE_F32, (enum cfx_redop)77), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(x, y, 0, CFX_DTYPE_LAST, CFX_OP_SUM), CFX_ERR_INVALID,
                 "a bad dtype is an error even for no elements");
    cr_assert_eq(cfx_reduce(NULL, y, 4, CFX_DTYPE_F32, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(x, NULL, 4, CFX_DTYPE_F32, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce(NULL, NULL, 0, CFX_DTYPE_F32, CFX_OP_SUM), CFX_OK);
    cr_assert_eq(cfx_reduce3(x, x, NULL, 1, CFX_DTYPE_F32, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce3(x, NULL, y, 1, CFX_DTYPE_F32, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce3(NULL, x, y, 1, CFX_DTYPE_F32, CFX_OP_SUM), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce3(x, x, y, 1, CFX_DTYPE_U8, CFX_OP_LAST), CFX_ERR_INVALID);
    cr_assert_str_neq(cfx_last_error(), "", "the error says what was wrong");
    cr_assert_eq(cfx_reduce3(NULL, NULL, NULL, 0, CFX_DTYPE_U8, CFX_OP_MAX), CFX_OK);
    cr_assert_str_eq(cfx_last_error(), "", "a success clears the last error");

    cr_assert_eq(cfx__reduce_set_isa(CFX__REDUCE_ISA_LAST), CFX_ERR_INVALID);
    cr_assert_eq(cfx__reduce_kernel(CFX_DTYPE_LAST, CFX_OP_SUM), NULL);
    cr_assert_eq(cfx__reduce_kernel(CFX_DTYPE_F32, CFX_OP_LAST), NULL);
    cr_assert_not_null(cfx__reduce_kernel(CFX_DTYPE_F32, CFX_OP_SUM));
}

Test(reduce, kernel_sets)
{
    cr_assert(cfx__reduce_isa_supported(CFX__REDUCE_ISA_DEFAULT));
    cr_assert_not_null(cfx__reduce_active());
    for (int isa = 0; isa < CFX__REDUCE_ISA_LAST; isa++) {
        const struct cfx__reduce_table *t = cfx__reduce_tables[isa];
        if (!t)
            continue;
        cr_assert_eq((int)t->isa, isa);
        cr_assert_str_eq(t->name, cfx__reduce_isa_name((enum cfx__reduce_isa)isa));
        for (int d = 0; d < CFX_DTYPE_LAST; d++)
            for (int o = 0; o < CFX_OP_LAST; o++)
                cr_assert_not_null(t->fn[d][o], "%s [%d][%d]", t->name, d, o);
        if (cfx__reduce_isa_supported((enum cfx__reduce_isa)isa)) {
            cr_assert_eq(cfx__reduce_set_isa((enum cfx__reduce_isa)isa), CFX_OK);
            cr_assert_eq(cfx__reduce_active(), t);
        } else {
            cr_assert_eq(cfx__reduce_set_isa((enum cfx__reduce_isa)isa), CFX_ERR_UNSUPPORTED);
        }
    }
    cr_assert_str_eq(cfx__reduce_isa_name(CFX__REDUCE_ISA_LAST), "unknown");
}

/* CFX_REDUCE_ISA=default makes the process run as a baseline x86-64 CPU
 * would: the vector sets are unsupported, with the cap as the reason, and
 * the first reduction picks the baseline kernels.  (Criterion runs each test
 * in a fresh process, so the variable is read here for the first time.) */
Test(reduce, cap_from_environment)
{
    cr_assert_eq(setenv("CFX_REDUCE_ISA", "default", 1), 0);
    cr_assert(cfx__reduce_isa_supported(CFX__REDUCE_ISA_DEFAULT));
    for (int isa = CFX__REDUCE_ISA_DEFAULT + 1; isa < CFX__REDUCE_ISA_LAST; isa++) {
        cr_assert_not(cfx__reduce_isa_supported((enum cfx__reduce_isa)isa));
        cr_assert_not_null(cfx__reduce_isa_why_not((enum cfx__reduce_isa)isa));
        cr_assert_eq(cfx__reduce_set_isa((enum cfx__reduce_isa)isa), CFX_ERR_UNSUPPORTED);
        cr_assert_not_null(strstr(cfx_last_error(), "not supported here"), "%s", cfx_last_error());
    }
    cr_assert_eq(cfx__reduce_active(), cfx__reduce_tables[CFX__REDUCE_ISA_DEFAULT]);
    float a[33], b[33];
    for (int k = 0; k < 33; k++)
        a[k] = (float)k, b[k] = 0.5f;
    cr_assert_eq(cfx_reduce(a, b, 33, CFX_DTYPE_F32, CFX_OP_SUM), CFX_OK);
    for (int k = 0; k < 33; k++)
        cr_assert_eq(a[k], (float)k + 0.5f);
}

Test(reduce, names_round_trip)
{
    static const size_t sizes[CFX_DTYPE_LAST] = { 4, 8, 2, 2, 4, 8, 1 };
    for (int d = 0; d < CFX_DTYPE_LAST; d++) {
        enum cfx_dtype back = CFX_DTYPE_LAST;
        cr_assert_eq(cfx_dtype_from_name(cfx_dtype_name((enum cfx_dtype)d), &back), CFX_OK);
        cr_assert_eq((int)back, d);
        cr_assert_eq(cfx_dtype_size((enum cfx_dtype)d), sizes[d]);
    }
    for (int o = 0; o < CFX_OP_LAST; o++) {
        enum cfx_redop back = CFX_OP_LAST;
        cr_assert_eq(cfx_redop_from_name(cfx_redop_name((enum cfx_redop)o), &back), CFX_OK);
        cr_assert_eq((int)back, o);
    }
    cr_assert_str_eq(cfx_dtype_name(CFX_DTYPE_LAST), "unknown");
    cr_assert_str_eq(cfx_redop_name(CFX_OP_LAST), "unknown");
    cr_assert_eq(cfx_dtype_size(CFX_DTYPE_LAST), 0);

    static const struct {
        const char *name;
        enum cfx_dtype dt;
    } alias[] = {
        { "float", CFX_DTYPE_F32 },  { "f32", CFX_DTYPE_F32 },     { "FP32", CFX_DTYPE_F32 },
        { "double", CFX_DTYPE_F64 }, { "f64", CFX_DTYPE_F64 },     { "half", CFX_DTYPE_F16 },
        { "f16", CFX_DTYPE_F16 },    { "float16", CFX_DTYPE_F16 }, { "bfloat16", CFX_DTYPE_BF16 },
        { "BF16", CFX_DTYPE_BF16 },  { "int32", CFX_DTYPE_I32 },   { "int", CFX_DTYPE_I32 },
        { "i32", CFX_DTYPE_I32 },    { "int64", CFX_DTYPE_I64 },   { "i64", CFX_DTYPE_I64 },
        { "uint8", CFX_DTYPE_U8 },   { "u8", CFX_DTYPE_U8 },       { "char", CFX_DTYPE_U8 },
    };
    for (size_t i = 0; i < ARRAY_N(alias); i++) {
        enum cfx_dtype dt;
        cr_assert_eq(cfx_dtype_from_name(alias[i].name, &dt), CFX_OK, "%s", alias[i].name);
        cr_assert_eq(dt, alias[i].dt, "%s", alias[i].name);
    }
    static const char *const ops[] = { "sum", "SUM", "prod", "product", "min", "Max" };
    static const enum cfx_redop opv[] = { CFX_OP_SUM,  CFX_OP_SUM, CFX_OP_PROD,
                                          CFX_OP_PROD, CFX_OP_MIN, CFX_OP_MAX };
    for (size_t i = 0; i < ARRAY_N(ops); i++) {
        enum cfx_redop op;
        cr_assert_eq(cfx_redop_from_name(ops[i], &op), CFX_OK, "%s", ops[i]);
        cr_assert_eq(op, opv[i]);
    }

    enum cfx_dtype dt = CFX_DTYPE_U8;
    enum cfx_redop op = CFX_OP_MAX;
    static const char *const bad[] = { "", "floaty", "f8", "int16", " float", "avg" };
    for (size_t i = 0; i < ARRAY_N(bad); i++) {
        cr_assert_eq(cfx_dtype_from_name(bad[i], &dt), CFX_ERR_INVALID, "'%s'", bad[i]);
        cr_assert_eq(cfx_redop_from_name(bad[i], &op), CFX_ERR_INVALID, "'%s'", bad[i]);
    }
    cr_assert_eq(dt, CFX_DTYPE_U8, "failure leaves *out alone");
    cr_assert_eq(op, CFX_OP_MAX);
    cr_assert_eq(cfx_dtype_from_name(NULL, &dt), CFX_ERR_INVALID);
    cr_assert_eq(cfx_dtype_from_name("float", NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_redop_from_name(NULL, &op), CFX_ERR_INVALID);
}

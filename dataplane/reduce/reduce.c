/*
 * Public reduction entry points: names of dtypes and ops, argument checks,
 * and the choice of the kernel table, made once per process.
 */
#include <stdint.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <conflux/reduce.h>
#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/reduce/reduce_impl.h"

static const size_t dtype_sizes[CFX_DTYPE_LAST] = {
    [CFX_DTYPE_F32] = 4, [CFX_DTYPE_F64] = 8, [CFX_DTYPE_F16] = 2, [CFX_DTYPE_BF16] = 2,
    [CFX_DTYPE_I32] = 4, [CFX_DTYPE_I64] = 8, [CFX_DTYPE_U8] = 1,
};

static const char *const dtype_names[CFX_DTYPE_LAST] = {
    [CFX_DTYPE_F32] = "float",     [CFX_DTYPE_F64] = "double", [CFX_DTYPE_F16] = "half",
    [CFX_DTYPE_BF16] = "bfloat16", [CFX_DTYPE_I32] = "int32",  [CFX_DTYPE_I64] = "int64",
    [CFX_DTYPE_U8] = "uint8",
};

static const char *const redop_names[CFX_OP_LAST] = {
    [CFX_OP_SUM] = "sum",
    [CFX_OP_PROD] = "prod",
    [CFX_OP_MIN] = "min",
    [CFX_OP_MAX] = "max",
};

/* Every spelling the parsers accept (the canonical names come first). */
static const struct {
    const char *name;
    enum cfx_dtype dtype;
} dtype_aliases[] = {
    { "float", CFX_DTYPE_F32 },     { "f32", CFX_DTYPE_F32 },     { "fp32", CFX_DTYPE_F32 },
    { "float32", CFX_DTYPE_F32 },   { "double", CFX_DTYPE_F64 },  { "f64", CFX_DTYPE_F64 },
    { "fp64", CFX_DTYPE_F64 },      { "float64", CFX_DTYPE_F64 }, { "half", CFX_DTYPE_F16 },
    { "f16", CFX_DTYPE_F16 },       { "fp16", CFX_DTYPE_F16 },    { "float16", CFX_DTYPE_F16 },
    { "bfloat16", CFX_DTYPE_BF16 }, { "bf16", CFX_DTYPE_BF16 },   { "int32", CFX_DTYPE_I32 },
    { "i32", CFX_DTYPE_I32 },       { "int", CFX_DTYPE_I32 },     { "int32_t", CFX_DTYPE_I32 },
    { "int64", CFX_DTYPE_I64 },     { "i64", CFX_DTYPE_I64 },     { "int64_t", CFX_DTYPE_I64 },
    { "uint8", CFX_DTYPE_U8 },      { "u8", CFX_DTYPE_U8 },       { "uint8_t", CFX_DTYPE_U8 },
    { "char", CFX_DTYPE_U8 },
};

static const struct {
    const char *name;
    enum cfx_redop op;
} redop_aliases[] = {
    { "sum", CFX_OP_SUM },   { "add", CFX_OP_SUM },      { "plus", CFX_OP_SUM },
    { "prod", CFX_OP_PROD }, { "product", CFX_OP_PROD }, { "mul", CFX_OP_PROD },
    { "min", CFX_OP_MIN },   { "max", CFX_OP_MAX },
};

size_t cfx_dtype_size(enum cfx_dtype dtype)
{
    return (unsigned)dtype < CFX_DTYPE_LAST ? dtype_sizes[dtype] : 0;
}

const char *cfx_dtype_name(enum cfx_dtype dtype)
{
    return (unsigned)dtype < CFX_DTYPE_LAST ? dtype_names[dtype] : "unknown";
}

const char *cfx_redop_name(enum cfx_redop op)
{
    return (unsigned)op < CFX_OP_LAST ? redop_names[op] : "unknown";
}

int cfx_dtype_from_name(const char *name, enum cfx_dtype *out)
{
    cfx__err_clear();
    if (!name || !out)
        return cfx__err(CFX_ERR_INVALID, "dtype name: NULL argument");
    for (size_t i = 0; i < CFX_ARRAY_SIZE(dtype_aliases); i++) {
        if (strcasecmp(name, dtype_aliases[i].name) == 0) {
            *out = dtype_aliases[i].dtype;
            return CFX_OK;
        }
    }
    return cfx__err(CFX_ERR_INVALID, "unknown dtype '%s'", name);
}

int cfx_redop_from_name(const char *name, enum cfx_redop *out)
{
    cfx__err_clear();
    if (!name || !out)
        return cfx__err(CFX_ERR_INVALID, "reduction op name: NULL argument");
    for (size_t i = 0; i < CFX_ARRAY_SIZE(redop_aliases); i++) {
        if (strcasecmp(name, redop_aliases[i].name) == 0) {
            *out = redop_aliases[i].op;
            return CFX_OK;
        }
    }
    return cfx__err(CFX_ERR_INVALID, "unknown reduction op '%s'", name);
}

/* ---- kernel table choice -------------------------------------------------- */

/* The table in use; NULL until the first reduction.  Written only with a
 * complete, immutable table, so a racing first use just chooses twice. */
static const struct cfx__reduce_table *reduce_active_table;

static const char *const isa_names[CFX__REDUCE_ISA_LAST] = {
    [CFX__REDUCE_ISA_DEFAULT] = "default",
    [CFX__REDUCE_ISA_AVX2] = "avx2",
    [CFX__REDUCE_ISA_AVX512] = "avx512",
};

const char *cfx__reduce_isa_name(enum cfx__reduce_isa isa)
{
    return (unsigned)isa < CFX__REDUCE_ISA_LAST ? isa_names[isa] : "unknown";
}

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
 * not know "f16c".  It needs the AVX state the OS saves, which the "avx2"
 * check below has already established. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

/* What the CPU (and OS) can run, ignoring CFX_REDUCE_ISA. */
static int isa_cpu_supported(enum cfx__reduce_isa isa)
{
    switch (isa) {
    case CFX__REDUCE_ISA_DEFAULT: return 1;
#if defined(__x86_64__) || defined(__i386__)
    case CFX__REDUCE_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && cpu_has_f16c();
    case CFX__REDUCE_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && cpu_has_f16c();
#endif
    default: return 0;
    }
}

/* The highest set CFX_REDUCE_ISA allows, read once per process.  A cap makes
 * the sets above it unsupported to every caller, tests included, so a
 * machine with AVX-512 runs exactly what an AVX2-only or a baseline x86-64
 * machine would. */
static enum cfx__reduce_isa isa_cap(void)
{
    static int cap = -1; /* -1: not read yet */
    int c = __atomic_load_n(&cap, __ATOMIC_ACQUIRE);

    if (c < 0) {
        const char *want = cfx__env_str("CFX_REDUCE_ISA", NULL);
        c = CFX__REDUCE_ISA_LAST - 1;
        if (want && *want) {
            int i;
            for (i = 0; i < CFX__REDUCE_ISA_LAST; i++)
                if (strcasecmp(want, isa_names[i]) == 0)
                    break;
            if (i < CFX__REDUCE_ISA_LAST)
                c = i;
            else
                CFX_LOG(WARN, REDUCE,
                        "CFX_REDUCE_ISA='%s' is not default, avx2 or avx512; ignored", want);
        }
        __atomic_store_n(&cap, c, __ATOMIC_RELEASE);
    }
    return (enum cfx__reduce_isa)c;
}

int cfx__reduce_isa_supported(enum cfx__reduce_isa isa)
{
    return cfx__reduce_isa_why_not(isa) == NULL;
}

const char *cfx__reduce_isa_why_not(enum cfx__reduce_isa isa)
{
    if ((unsigned)isa >= CFX__REDUCE_ISA_LAST)
        return "no such kernel set";
    if (!cfx__reduce_tables[isa])
        return "this build has no such kernel set (not x86-64)";
    if (!isa_cpu_supported(isa))
        return isa == CFX__REDUCE_ISA_AVX512
                   ? "this CPU lacks AVX-512 F/BW/VL/DQ (or AVX2/F16C)"
                   : "this CPU lacks AVX2 or F16C";
    if (isa > isa_cap())
        return "capped by CFX_REDUCE_ISA";
    return NULL;
}

static const struct cfx__reduce_table *reduce_choose(void)
{
    for (int i = CFX__REDUCE_ISA_LAST - 1; i > CFX__REDUCE_ISA_DEFAULT; i--)
        if (cfx__reduce_isa_supported((enum cfx__reduce_isa)i))
            return cfx__reduce_tables[i];
    return cfx__reduce_tables[CFX__REDUCE_ISA_DEFAULT];
}

const struct cfx__reduce_table *cfx__reduce_active(void)
{
    const struct cfx__reduce_table *t = __atomic_load_n(&reduce_active_table, __ATOMIC_ACQUIRE);

    if (unlikely(!t)) {
        t = reduce_choose();
        __atomic_store_n(&reduce_active_table, t, __ATOMIC_RELEASE);
        CFX_LOG(INFO, REDUCE, "reduction kernels: %s", t->name);
    }
    return t;
}

int cfx__reduce_set_isa(enum cfx__reduce_isa isa)
{
    if ((unsigned)isa >= CFX__REDUCE_ISA_LAST)
        return cfx__err(CFX_ERR_INVALID, "reduction ISA %d unknown", (int)isa);
    if (!cfx__reduce_isa_supported(isa))
        return cfx__err(CFX_ERR_UNSUPPORTED, "reduction ISA %s not supported here: %s",
                        isa_names[isa], cfx__reduce_isa_why_not(isa));
    __atomic_store_n(&reduce_active_table, cfx__reduce_tables[isa], __ATOMIC_RELEASE);
    return CFX_OK;
}

cfx__reduce_fn cfx__reduce_kernel(enum cfx_dtype dtype, enum cfx_redop op)
{
    if ((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST)
        return NULL;
    return cfx__reduce_active()->fn[dtype][op];
}

/* ---- the public kernels --------------------------------------------------- */

int cfx_reduce3(void *dst, const void *a, const void *b, size_t count, enum cfx_dtype dtype,
                enum cfx_redop op)
{
    cfx__err_clear();
    if (unlikely((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST))
        return cfx__err(CFX_ERR_INVALID, "reduce: unknown dtype %d or op %d", (int)dtype, (int)op);
    if (unlikely(count == 0))
        return CFX_OK;
    if (unlikely(!dst || !a || !b))
        return cfx__err(CFX_ERR_INVALID, "reduce: NULL buffer for %zu %s elements", count,
                        dtype_names[dtype]);
    cfx__reduce_active()->fn[dtype][op](dst, a, b, count);
    return CFX_OK;
}

int cfx_reduce(void *dst, const void *src, size_t count, enum cfx_dtype dtype, enum cfx_redop op)
{
    return cfx_reduce3(dst, dst, src, count, dtype, op);
}

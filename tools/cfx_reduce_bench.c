/*
 * cfx_reduce_bench: bandwidth of the reduction kernels on one core.
 *
 *   cfx_reduce_bench                      every dtype x op, 64 MiB, in place
 *   cfx_reduce_bench -d float,half -o sum -s 4M -n 50
 *   cfx_reduce_bench --isa=avx2 --json
 *
 * Each measurement reduces a buffer of -s bytes in place (dst op= src), -n
 * times after -w warm-up runs.  Bandwidth counts the bytes the kernel moves:
 * two reads and one write of the buffer size per run.  The memcpy reference
 * copies a buffer of the same size in the same run and counts one read and
 * one write; "x memcpy" is the ratio of the two bandwidths, so 1.0 means the
 * kernel moves bytes as fast as memcpy does.
 */
#include <conflux/conflux.h>

#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "dataplane/common/util.h"
#include "dataplane/reduce/fp16.h"
#include "dataplane/reduce/reduce_impl.h"

#define PROG "cfx_reduce_bench"

struct bench_opts {
    int dtypes[CFX_DTYPE_LAST]; /* selected dtypes */
    int ops[CFX_OP_LAST];       /* selected ops */
    size_t size;                /* bytes per buffer */
    long iters;                 /* measured runs */
    long warmup;                /* unmeasured runs first */
    int out_of_place;           /* cfx_reduce3(d, a, b) into a third buffer */
    int json;                   /* one JSON document on stdout */
    const char *isa;            /* kernel set to force; NULL: the default choice */
};

struct bench_result {
    double avg_s;  /* mean seconds per run */
    double best_s; /* fastest run */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(const char *prog, FILE *f)
{
    fprintf(
        f,
        "Usage: %s [options]\n"
        "  -d, --dtype=LIST     dtypes, comma separated, or all (default all):\n"
        "                       float half bfloat16 double int32 int64 uint8 (f32, f16, bf16...)\n"
        "  -o, --op=LIST        ops, comma separated, or all (default all): sum prod min max\n"
        "  -s, --size=N         bytes per buffer, K/M/G suffixes, at least 64 (default 64M);\n"
        "                       the buffers must fit in this machine's memory\n"
        "  -n, --iters=N        measured runs per dtype x op, >= 1 (default 20)\n"
        "  -w, --warmup=N       unmeasured runs first, >= 0 (default 2)\n"
        "  -3, --out-of-place   dst = a op b into a third buffer (cfx_reduce3)\n"
        "  -i, --isa=NAME       kernel set: default, avx2, avx512 (default: best supported)\n"
        "  -J, --json           print one JSON document instead of the table\n"
        "  -h, --help           this text\n"
        "A bad value is named on stderr; usage errors exit with status 2.\n",
        prog);
}

/* Parse "all" or a comma-separated list of names into @p sel. */
static int parse_list(const char *arg, int *sel, int n, int is_dtype)
{
    char buf[256];
    const char *opt = is_dtype ? "-d" : "-o";
    if (strlen(arg) >= sizeof(buf) || !*arg)
        return fprintf(stderr, "%s: %s: '%s' is not a list of %s\n", PROG, opt, arg,
                       is_dtype ? "dtypes" : "ops"), -1;
    memset(sel, 0, sizeof(int) * (size_t)n);
    if (strcmp(arg, "all") == 0) {
        for (int i = 0; i < n; i++)
            sel[i] = 1;
        return 0;
    }
    strcpy(buf, arg);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (is_dtype) {
            enum cfx_dtype d;
            if (cfx_dtype_from_name(tok, &d) != CFX_OK)
                return fprintf(stderr, "%s: -d: '%s' is not a dtype (in '%s')\n", PROG, tok,
                               arg), -1;
            sel[d] = 1;
        } else {
            enum cfx_redop o;
            if (cfx_redop_from_name(tok, &o) != CFX_OK)
                return fprintf(stderr, "%s: -o: '%s' is not an op (in '%s')\n", PROG, tok,
                               arg), -1;
            sel[o] = 1;
        }
    }
    return 0;
}

static int parse_opts(int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {
        { "dtype", required_argument, NULL, 'd' },  { "op", required_argument, NULL, 'o' },
        { "size", required_argument, NULL, 's' },   { "iters", required_argument, NULL, 'n' },
        { "warmup", required_argument, NULL, 'w' }, { "out-of-place", no_argument, NULL, '3' },
        { "isa", required_argument, NULL, 'i' },    { "json", no_argument, NULL, 'J' },
        { "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
    };
    const char *size_arg = NULL;
    int c;

    memset(o, 0, sizeof(*o));
    for (int i = 0; i < CFX_DTYPE_LAST; i++)
        o->dtypes[i] = 1;
    for (int i = 0; i < CFX_OP_LAST; i++)
        o->ops[i] = 1;
    o->size = 64u << 20;
    o->iters = 20;
    o->warmup = 2;
    while ((c = getopt_long(argc, argv, "d:o:s:n:w:3i:Jh", longopts, NULL)) != -1) {
        switch (c) {
        case 'd':
            if (parse_list(optarg, o->dtypes, CFX_DTYPE_LAST, 1))
                return 2;
            break;
        case 'o':
            if (parse_list(optarg, o->ops, CFX_OP_LAST, 0))
                return 2;
            break;
        case 's':
            if (tool_arg_size(PROG, "-s", optarg, 64, SIZE_MAX / 4, &o->size))
                return TOOL_EXIT_USAGE;
            size_arg = optarg;
            break;
        case 'n':
            if (tool_arg_long(PROG, "-n", optarg, 1, INT_MAX, "an iteration count", &o->iters))
                return TOOL_EXIT_USAGE;
            break;
        case 'w':
            if (tool_arg_long(PROG, "-w", optarg, 0, INT_MAX, "a warm-up count", &o->warmup))
                return TOOL_EXIT_USAGE;
            break;
        case '3': o->out_of_place = 1; break;
        case 'i': {
            const char *isas[CFX__REDUCE_ISA_LAST + 1] = { NULL };
            int isa;
            for (isa = 0; isa < CFX__REDUCE_ISA_LAST; isa++)
                isas[isa] = cfx__reduce_isa_name((enum cfx__reduce_isa)isa);
            if (tool_arg_word(PROG, "-i", optarg, isas, &isa))
                return TOOL_EXIT_USAGE;
            o->isa = optarg;
            break;
        }
        case 'J': o->json = 1; break;
        case 'h': usage(argv[0], stdout); exit(0);
        default: usage(argv[0], stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", PROG, argv[optind]);
        usage(argv[0], stderr);
        return TOOL_EXIT_USAGE;
    }
    /* two buffers (three out of place), before any is allocated */
    if (tool_arg_mem(PROG, "-s", size_arg ? size_arg : "64M",
                     o->size * (o->out_of_place ? 3 : 2), 0))
        return TOOL_EXIT_USAGE;
    return 0;
}

static void *alloc_buf(size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, size))
        return NULL;
    memset(p, 0, size); /* fault every page in before timing */
    return p;
}

/* Fill with 1.0 (or 1) so that repeated sums and products stay finite and
 * never become subnormal, which would time the FPU's slow path instead. */
static void fill_ones(void *buf, size_t count, enum cfx_dtype dt)
{
    for (size_t i = 0; i < count; i++) {
        switch (dt) {
        case CFX_DTYPE_F32: ((float *)buf)[i] = 1.0f; break;
        case CFX_DTYPE_F64: ((double *)buf)[i] = 1.0; break;
        case CFX_DTYPE_F16: ((uint16_t *)buf)[i] = 0x3c00; break;
        case CFX_DTYPE_BF16: ((uint16_t *)buf)[i] = 0x3f80; break;
        case CFX_DTYPE_I32: ((int32_t *)buf)[i] = 1; break;
        case CFX_DTYPE_I64: ((int64_t *)buf)[i] = 1; break;
        default: ((uint8_t *)buf)[i] = 1; break;
        }
    }
}

static struct bench_result time_memcpy(void *dst, const void *src, size_t size, long warmup,
                                       long iters)
{
    struct bench_result r = { 0, 1e30 };
    for (long i = 0; i < warmup; i++)
        memcpy(dst, src, size);
    double start = now_s();
    for (long i = 0; i < iters; i++) {
        double t = now_s();
        memcpy(dst, src, size);
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        t = now_s() - t;
        r.best_s = t < r.best_s ? t : r.best_s;
    }
    r.avg_s = (now_s() - start) / (double)iters;
    return r;
}

static int time_reduce(const struct bench_opts *o, void *d, void *a, void *b, size_t count,
                       enum cfx_dtype dt, enum cfx_redop op, struct bench_result *r)
{
    r->avg_s = 0;
    r->best_s = 1e30;
    for (long i = 0; i < o->warmup + o->iters; i++) {
        double t = now_s();
        int rc =
            o->out_of_place ? cfx_reduce3(d, a, b, count, dt, op) : cfx_reduce(a, b, count, dt, op);
        __asm__ __volatile__("" : : "r"(a), "r"(d) : "memory");
        t = now_s() - t;
        if (rc != CFX_OK)
            return rc;
        if (i >= o->warmup) {
            r->avg_s += t;
            r->best_s = t < r->best_s ? t : r->best_s;
        }
    }
    r->avg_s /= (double)o->iters;
    return CFX_OK;
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;

    if (o.isa) {
        int isa;
        for (isa = 0; isa < CFX__REDUCE_ISA_LAST; isa++)
            if (strcasecmp(o.isa, cfx__reduce_isa_name((enum cfx__reduce_isa)isa)) == 0)
                break;
        rc = cfx__reduce_set_isa((enum cfx__reduce_isa)isa);
        if (rc != CFX_OK) {
            fprintf(stderr, "kernel set '%s': %s\n", o.isa, cfx_strerror(rc));
            return 1;
        }
    }
    const char *isa_name = cfx__reduce_active()->name;

    void *a = alloc_buf(o.size), *b = alloc_buf(o.size);
    void *d = o.out_of_place ? alloc_buf(o.size) : NULL;
    if (!a || !b || (o.out_of_place && !d)) {
        fprintf(stderr, "cannot allocate 3 x %zu bytes\n", o.size);
        return 1;
    }

    struct bench_result mc = time_memcpy(a, b, o.size, o.warmup, o.iters);
    double mc_bw = 2.0 * (double)o.size / mc.avg_s / 1e9;

    if (o.json) {
        printf("{\n  \"tool\": \"cfx_reduce_bench\",\n  \"kernels\": \"%s\",\n"
               "  \"size\": %zu,\n  \"iters\": %ld,\n  \"mode\": \"%s\",\n"
               "  \"memcpy_gbps\": %.3f,\n  \"memcpy_best_gbps\": %.3f,\n  \"results\": [",
               isa_name, o.size, o.iters, o.out_of_place ? "out-of-place" : "in-place", mc_bw,
               2.0 * (double)o.size / mc.best_s / 1e9);
    } else {
        printf("---------------------------------------------------------------\n");
        printf(" Reduction kernel bandwidth (one core)\n");
        printf(" kernels        : %s\n", isa_name);
        printf(" buffer size    : %zu bytes\n", o.size);
        printf(" iterations     : %ld (+%ld warm-up)\n", o.iters, o.warmup);
        printf(" mode           : %s\n",
               o.out_of_place ? "out of place, d = a op b" : "in place, dst op= src");
        printf(" bytes counted  : reduce 2 reads + 1 write; memcpy 1 read + 1 write\n");
        printf(" memcpy         : %.2f GB/s (best %.2f)\n", mc_bw,
               2.0 * (double)o.size / mc.best_s / 1e9);
        printf("---------------------------------------------------------------\n");
        printf(" %-9s %-5s %12s %10s %9s %9s %9s\n", "type", "redop", "count", "time(us)", "GB/s",
               "best", "xmemcpy");
    }

    int first = 1;
    for (int dt = 0; dt < CFX_DTYPE_LAST; dt++) {
        if (!o.dtypes[dt])
            continue;
        size_t count = o.size / cfx_dtype_size((enum cfx_dtype)dt);
        for (int op = 0; op < CFX_OP_LAST; op++) {
            if (!o.ops[op])
                continue;
            struct bench_result r;
            fill_ones(a, count, (enum cfx_dtype)dt);
            fill_ones(b, count, (enum cfx_dtype)dt);
            rc = time_reduce(&o, d, a, b, count, (enum cfx_dtype)dt, (enum cfx_redop)op, &r);
            if (rc != CFX_OK) {
                fprintf(stderr, "reduce failed: %s\n", cfx_strerror(rc));
                return 1;
            }
            double bytes = 3.0 * (double)(count * cfx_dtype_size((enum cfx_dtype)dt));
            double bw = bytes / r.avg_s / 1e9, best = bytes / r.best_s / 1e9;
            if (o.json)
                printf("%s\n    {\"dtype\": \"%s\", \"op\": \"%s\", \"count\": %zu, "
                       "\"time_us\": %.1f, \"gbps\": %.3f, \"best_gbps\": %.3f, "
                       "\"ratio_memcpy\": %.3f}",
                       first ? "" : ",", cfx_dtype_name((enum cfx_dtype)dt),
                       cfx_redop_name((enum cfx_redop)op), count, r.avg_s * 1e6, bw, best,
                       bw / mc_bw);
            else
                printf(" %-9s %-5s %12zu %10.1f %9.2f %9.2f %9.2f\n",
                       cfx_dtype_name((enum cfx_dtype)dt), cfx_redop_name((enum cfx_redop)op),
                       count, r.avg_s * 1e6, bw, best, bw / mc_bw);
            first = 0;
        }
    }
    if (o.json)
        printf("\n  ]\n}\n");
    else
        printf("---------------------------------------------------------------\n");

    free(a);
    free(b);
    free(d);
    return 0;
}

/*
 * cfx_gpu_bench: bandwidth of the device reduction kernels, as a ratio of
 * device-to-device cudaMemcpy bandwidth measured in the same run.
 *
 *   cfx_gpu_bench                     every dtype x op, 256 MiB buffers
 *   cfx_gpu_bench -d float,half -o sum -s 1G -n 50 --json
 *
 * Each run is dst = a op b on the device (cfx__cuda_reduce3 on one
 * stream), timed with CUDA events, -n runs after -w warm-up runs.
 * Bandwidth counts what the kernel moves: two reads and one write of the
 * buffer size.  The reference copies a buffer of the same size with
 * cudaMemcpy (device to device) and counts one read and one write; "x copy"
 * is the ratio of the two, the goal being >= 0.8.
 *
 * Exit status: 0 after printing results, 1 on an error, 2 when there is no
 * CUDA device (or this build has no CUDA).
 */
#include <conflux/conflux.h>

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "dataplane/common/util.h"
#include "gpu/memtype.h"

#define PROG "cfx_gpu_bench"

struct opts {
    int dtypes[CFX_DTYPE_LAST];
    int ops[CFX_OP_LAST];
    size_t size;
    long iters, warmup;
    int json;
};

static int parse_list(const char *s, int *sel, int n, int is_dtype)
{
    char buf[256], *save = NULL;

    memset(sel, 0, sizeof(int) * (size_t)n);
    if (!strcmp(s, "all")) {
        for (int i = 0; i < n; i++)
            sel[i] = 1;
        return 0;
    }
    if (!*s || strlen(s) >= sizeof(buf)) {
        fprintf(stderr, "%s: %s: '%s' is not a list\n", PROG, is_dtype ? "-d" : "-o", s);
        return -1;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int rc;
        if (is_dtype) {
            enum cfx_dtype d;
            rc = cfx_dtype_from_name(t, &d);
            if (rc == CFX_OK)
                sel[d] = 1;
        } else {
            enum cfx_redop o;
            rc = cfx_redop_from_name(t, &o);
            if (rc == CFX_OK)
                sel[o] = 1;
        }
        if (rc != CFX_OK) {
            fprintf(stderr, "%s: %s: '%s' is not %s (in '%s')\n", PROG, is_dtype ? "-d" : "-o", t,
                    is_dtype ? "a dtype" : "an op", s);
            return -1;
        }
    }
    return 0;
}

/* 0, or an exit status: TOOL_EXIT_USAGE with the bad option and value named */
static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        { "dtype", required_argument, NULL, 'd' }, { "op", required_argument, NULL, 'o' },
        { "size", required_argument, NULL, 's' },  { "iters", required_argument, NULL, 'n' },
        { "warmup", required_argument, NULL, 'w' }, { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },        { NULL, 0, NULL, 0 },
    };
    int c;

    parse_list("all", o->dtypes, CFX_DTYPE_LAST, 1);
    parse_list("all", o->ops, CFX_OP_LAST, 0);
    while ((c = getopt_long(argc, argv, "d:o:s:n:w:jh", lo, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'd': bad = parse_list(optarg, o->dtypes, CFX_DTYPE_LAST, 1); break;
        case 'o': bad = parse_list(optarg, o->ops, CFX_OP_LAST, 0); break;
        case 's': bad = tool_arg_size(PROG, "-s", optarg, 4096, 1ull << 40, &o->size); break;
        case 'n':
            bad = tool_arg_long(PROG, "-n", optarg, 1, INT_MAX, "an iteration count", &o->iters);
            break;
        case 'w':
            bad = tool_arg_long(PROG, "-w", optarg, 0, INT_MAX, "a warm-up count", &o->warmup);
            break;
        case 'j': o->json = 1; break;
        case 'h':
            printf("Usage: %s [-d LIST] [-o LIST] [-s SIZE] [-n ITERS] [-w WARMUP] [--json]\n"
                   "  SIZE at least 4K; ITERS >= 1; WARMUP >= 0\n", argv[0]);
            exit(0);
        default:
            fprintf(stderr, "Usage: %s [-d LIST] [-o LIST] [-s SIZE] [-n ITERS] [-w WARMUP] "
                    "[--json]\n", argv[0]);
            return TOOL_EXIT_USAGE;
        }
        if (bad)
            return TOOL_EXIT_USAGE;
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", PROG, argv[optind]);
        return TOOL_EXIT_USAGE;
    }
    return 0;
}

#ifndef CFX_HAVE_CUDA
/* Options are still checked, so that a bad one is named in every build. */
int main(int argc, char **argv)
{
    struct opts o = { .size = 256u << 20, .iters = 20, .warmup = 3 };
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc;
    fprintf(stderr, "%s: this build of conflux has no CUDA support (configure with "
            "-DCFX_WITH_CUDA=ON and the CUDA toolkit installed)\n", argv[0]);
    return 2;
}
#else

#include <cuda_runtime_api.h>

#include "gpu/cuda/cfx_cuda.h"

#define CK(call)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                \
                    cudaGetErrorString(e_));                                             \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* Mean seconds per run of a copy (op < 0) or a reduction. */
static double time_runs(const struct opts *o, void *d, void *a, void *b, size_t count,
                        enum cfx_dtype dt, int op, cudaStream_t s)
{
    cudaEvent_t t0, t1;
    float ms = 0;

    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (long i = 0; i < o->warmup + o->iters; i++) {
        if (i == o->warmup)
            CK(cudaEventRecord(t0, s));
        if (op < 0) {
            CK(cudaMemcpyAsync(d, a, o->size, cudaMemcpyDeviceToDevice, s));
        } else if (cfx__cuda_reduce3_launch(d, a, b, count, dt, (enum cfx_redop)op, s) != CFX_OK) {
            fprintf(stderr, "reduce: %s\n", cfx_last_error());
            exit(1);
        }
    }
    CK(cudaEventRecord(t1, s));
    CK(cudaEventSynchronize(t1));
    CK(cudaEventElapsedTime(&ms, t0, t1));
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    return (double)ms / 1e3 / (double)o->iters;
}

int main(int argc, char **argv)
{
    struct opts o = { .size = 256u << 20, .iters = 20, .warmup = 3 };
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc;

    char gpu[512];
    cfx__gpu_describe(gpu, sizeof(gpu));
    if (!cfx__cuda_available()) {
        fprintf(stderr, "%s: no CUDA device: gpu %s\n", argv[0], gpu);
        return 2;
    }
    o.size &= ~(size_t)15;
    void *a = NULL, *b = NULL, *d = NULL;
    cudaStream_t s;
    CK(cudaMalloc(&a, o.size));
    CK(cudaMalloc(&b, o.size));
    CK(cudaMalloc(&d, o.size));
    CK(cudaMemset(a, 0x3c, o.size)); /* 1.0-ish values in every format: no inf/NaN storms */
    CK(cudaMemset(b, 0x3b, o.size));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    double copy_s = time_runs(&o, d, a, NULL, 0, CFX_DTYPE_F32, -1, s);
    double copy_bw = 2.0 * (double)o.size / copy_s / 1e9;
    double worst = 1e9, sum_ratio = 0;
    int n = 0;

    if (!o.json) {
        printf(" gpu          : %s\n size         : %zu bytes\n iters        : %ld (+%ld warm-up)\n"
               " d2d copy     : %.1f GB/s (cudaMemcpy, read + write)\n",
               gpu, o.size, o.iters, o.warmup, copy_bw);
        printf("%10s %6s %12s %10s %8s\n", "type", "redop", "time(us)", "GB/s", "x copy");
    } else {
        printf("{\"gpu\": \"%s\", \"size\": %zu, \"copy_gbps\": %.2f, \"results\": [", gpu, o.size,
               copy_bw);
    }
    for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
        for (int op = 0; op < CFX_OP_LAST; op++) {
            if (!o.dtypes[dt] || !o.ops[op])
                continue;
            size_t count = o.size / cfx_dtype_size((enum cfx_dtype)dt);
            double t = time_runs(&o, d, a, b, count, (enum cfx_dtype)dt, op, s);
            double bw = 3.0 * (double)o.size / t / 1e9, ratio = bw / copy_bw;
            worst = ratio < worst ? ratio : worst;
            sum_ratio += ratio;
            if (o.json)
                printf("%s{\"type\": \"%s\", \"redop\": \"%s\", \"time_us\": %.1f, \"gbps\": %.2f, "
                       "\"ratio\": %.3f}", n ? ", " : "", cfx_dtype_name((enum cfx_dtype)dt),
                       cfx_redop_name((enum cfx_redop)op), t * 1e6, bw, ratio);
            else
                printf("%10s %6s %12.1f %10.1f %8.3f\n", cfx_dtype_name((enum cfx_dtype)dt),
                       cfx_redop_name((enum cfx_redop)op), t * 1e6, bw, ratio);
            n++;
        }
    if (o.json)
        printf("], \"min_ratio\": %.3f, \"avg_ratio\": %.3f}\n", n ? worst : 0, n ? sum_ratio / n : 0);
    else if (n)
        printf("# reduce bandwidth / d2d copy bandwidth: min %.3f, avg %.3f (goal >= 0.8: %s)\n",
               worst, sum_ratio / n, worst >= 0.8 ? "met" : "NOT met");
    cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    return 0;
}
#endif

/*
 * cfx_coll_perf: group collective bandwidth, in the manner of nccl-tests.
 *
 *   cfx_run -n 4 build/bin/cfx_coll_perf -o allreduce -b 8 -e 64M -f 2
 *
 * or one process per node, each with CFX_COORD, CFX_TOKEN (or CFX_TOKEN_FILE),
 * CFX_RANK and CFX_WORLD_SIZE (or another launcher's rank variables) in its
 * environment.
 *
 * Every rank runs the same sweep; rank 0 prints the table (the others print
 * only errors).  Columns and bandwidth conventions are those of nccl-tests
 * (doc/PERFORMANCE.md there):
 *   size   bytes of the larger of the send and receive buffers of one rank
 *   count  elements passed to the call
 *   time   time of one call, the maximum over the ranks of each rank's mean
 *   algbw  size / time
 *   busbw  algbw times the op's factor: allreduce 2(n-1)/n; allgather,
 *          reducescatter, alltoall, gather, scatter (n-1)/n; broadcast,
 *          reduce, sendrecv, sendburst 1
 *   #wrong elements that differ from the expected result, summed over ranks
 *          (-c 1: inputs are deterministic per rank, chosen so that every
 *          result is exact in every dtype)
 */
#include "perf_common.h"
#include "sweep.h"

#include <conflux/group.h>

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <strings.h>

#define PROG "cfx_coll_perf"

enum op_kind {
    OP_ALLREDUCE,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALLGATHER,
    OP_REDUCESCATTER,
    OP_ALLTOALL,
    OP_GATHER,
    OP_SCATTER,
    OP_SENDRECV,
    OP_SENDBURST,
    OP_BARRIER,
    OP_LAST
};

enum bus_factor {
    BUS_ONE,    /* broadcast, reduce, sendrecv */
    BUS_RING,   /* (n-1)/n */
    BUS_ALLRED, /* 2(n-1)/n */
    BUS_NONE,   /* barrier: no bandwidth */
};

struct op_desc {
    const char *name;
    int redop;              /* takes a reduction op */
    int root;               /* takes a root */
    int blocked;            /* one of the buffers holds n blocks of count elements */
    int inplace;            /* has an in-place form */
    enum bus_factor factor; /* busbw = algbw * factor */
};

static const struct op_desc ops[OP_LAST] = {
    [OP_ALLREDUCE] = { "allreduce", 1, 0, 0, 1, BUS_ALLRED },
    [OP_BROADCAST] = { "broadcast", 0, 1, 0, 1, BUS_ONE },
    [OP_REDUCE] = { "reduce", 1, 1, 0, 1, BUS_ONE },
    [OP_ALLGATHER] = { "allgather", 0, 0, 1, 1, BUS_RING },
    [OP_REDUCESCATTER] = { "reducescatter", 1, 0, 1, 1, BUS_RING },
    [OP_ALLTOALL] = { "alltoall", 0, 0, 1, 1, BUS_RING },
    [OP_GATHER] = { "gather", 0, 1, 1, 1, BUS_RING },
    [OP_SCATTER] = { "scatter", 0, 1, 1, 1, BUS_RING },
    [OP_SENDRECV] = { "sendrecv", 0, 0, 0, 0, BUS_ONE },
    [OP_SENDBURST] = { "sendburst", 0, 0, 0, 0, BUS_ONE },
    [OP_BARRIER] = { "barrier", 0, 0, 0, 0, BUS_NONE },
};

enum place {
    PLACE_OUT = 1, /* out-of-place */
    PLACE_IN = 2,  /* in-place */
    PLACE_BOTH = 3,
};

struct coll_opts {
    enum op_kind op;
    struct sweep_opts sw; /* -b -e -f -n -w -r -c -T (0 = the group's) --json */
    enum cfx_dtype dtype; /* -d */
    enum cfx_redop redop; /* -R */
    int algo_set;         /* -a given (and not "auto") */
    enum cfx_algo algo;   /* -a */
    int place;            /* -i: enum place bits */
    int user_buf;         /* -u: malloc'd buffers instead of the arena */
};

/* Buffers and the parameters of one call. */
struct coll_run {
    struct cfx_context *ctx;
    struct cfx_group *g;
    const struct coll_opts *o;
    struct cfx_coll_params cp;       /* params of the measured calls */
    struct cfx_coll_params cp_plain; /* barriers and result reductions: no forced algo */
    int rank, n;
    size_t count;      /* elements per call (per block for blocked ops) */
    size_t esize;      /* bytes per element */
    char *send, *recv; /* max-size buffers */
    char *expect;      /* one element, scratch for the check */
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: cfx_coll_perf [options]   (every rank of the group runs it)\n"
        "\n"
        "  -o, --op=OP           allreduce, broadcast, reduce, allgather, reducescatter,\n"
        "                        alltoall, gather, scatter, sendrecv, sendburst, barrier\n"
        "                        (default allreduce); sendburst: an even number of ranks, even\n"
        "                        rank r sends SENDBURST_N (128) messages to r+1 back to back,\n"
        "                        then receives one from r-1 (time: the whole call)\n"
        "  -b, --minbytes=N      smallest size, K/M/G suffixes (default 32M)\n"
        "  -e, --maxbytes=N      largest size (default 32M); two buffers of it must fit in\n"
        "                        memory (and, over verbs, in ulimit -l)\n"
        "  -f, --stepfactor=N    multiply the size by N each step, 2..1048576 (default 2)\n"
        "  -n, --iters=N         timed calls per size, >= 1 (default 20)\n"
        "  -w, --warmup_iters=N  untimed calls first (default 5)\n"
        "  -d, --datatype=T      float, double, half, bfloat16, int32, int64, uint8\n"
        "                        (default float)\n"
        "  -R, --op_redop=OP     sum, prod, min, max (default sum)\n"
        "  -r, --root=R          root of broadcast, reduce, gather, scatter (default 0)\n"
        "  -c, --check=0|1       check every result and count wrong elements (default 1)\n"
        "  -a, --algo=A          auto, ring, tree, chain, dbtree, rhd, direct, recdbl\n"
        "                        (default auto, i.e. $CFX_ALGO or the library's choice)\n"
        "  -i, --inplace=M       0 out-of-place, 1 in-place, both (default 0)\n"
        "  -T, --timeout=MS      deadline of each call, >= 1 (default: the group's)\n"
        "  -u, --user-buf        malloc'd buffers instead of the registered arena\n"
        "      --json            one JSON document on stdout instead of the table\n"
        "  -h, --help\n"
        "\n"
        "Sizes are the bytes of one rank's larger buffer, as in nccl-tests: for\n"
        "allgather, gather and alltoall the receive buffer, for reducescatter and\n"
        "scatter the send buffer.  A size counts whole elements of -d (rounded down;\n"
        "for those blocked ops, whole elements per rank): a size below one gives no row,\n"
        "and a sweep with no size of one element or more is refused.  Ranks and the\n"
        "cluster come from the environment\n"
        "(cfx_run sets CFX_RANK, CFX_WORLD_SIZE, CFX_COORD, CFX_TOKEN_FILE).  A bad value\n"
        "is named on stderr; usage errors exit with status 2.\n");
}

static int parse_op(const char *s, enum op_kind *out)
{
    for (int i = 0; i < OP_LAST; i++)
        if (!strcasecmp(s, ops[i].name)) {
            *out = (enum op_kind)i;
            return 0;
        }
    if (!strcasecmp(s, "reduce_scatter") || !strcasecmp(s, "reduce-scatter")) {
        *out = OP_REDUCESCATTER;
        return 0;
    }
    if (!strcasecmp(s, "bcast")) {
        *out = OP_BROADCAST;
        return 0;
    }
    return -1;
}

static int parse_algo(const char *s, struct coll_opts *o)
{
    if (!strcasecmp(s, "auto")) {
        o->algo_set = 0;
        o->algo = CFX_ALGO_AUTO;
        return 0;
    }
    for (int a = CFX_ALGO_AUTO + 1; a < CFX_ALGO_LAST; a++)
        if (!strcasecmp(s, cfx_algo_name((enum cfx_algo)a))) {
            o->algo_set = 1;
            o->algo = (enum cfx_algo)a;
            return 0;
        }
    return -1;
}

/* A value of -o, -d, -R, -a or -i that is none of its words: named, with
 * the words there are (aliases, such as bcast or fp16, are taken too).
 * Returns TOOL_EXIT_USAGE. */
static int bad_word(int c, const char *arg)
{
    const char *words[OP_LAST + CFX_DTYPE_LAST + CFX_OP_LAST + CFX_ALGO_LAST + 4];
    char opt[4] = { '-', (char)c, 0, 0 };
    int n = 0;
    switch (c) {
    case 'o':
        for (int i = 0; i < OP_LAST; i++)
            words[n++] = ops[i].name;
        break;
    case 'd':
        for (int i = 0; i < CFX_DTYPE_LAST; i++)
            words[n++] = cfx_dtype_name((enum cfx_dtype)i);
        break;
    case 'R':
        for (int i = 0; i < CFX_OP_LAST; i++)
            words[n++] = cfx_redop_name((enum cfx_redop)i);
        break;
    case 'a':
        words[n++] = "auto";
        for (int a = CFX_ALGO_AUTO + 1; a < CFX_ALGO_LAST; a++)
            words[n++] = cfx_algo_name((enum cfx_algo)a);
        break;
    default:
        words[n++] = "0";
        words[n++] = "1";
        words[n++] = "both";
        break;
    }
    words[n] = NULL;
    tool_arg_not_word(PROG, opt, arg, words);
    return TOOL_EXIT_USAGE;
}

static int parse_opts(int argc, char **argv, struct coll_opts *o)
{
    static const struct option lopts[] = {
        { "op", required_argument, NULL, 'o' },
        { "minbytes", required_argument, NULL, 'b' },
        { "maxbytes", required_argument, NULL, 'e' },
        { "stepfactor", required_argument, NULL, 'f' },
        { "iters", required_argument, NULL, 'n' },
        { "warmup_iters", required_argument, NULL, 'w' },
        { "datatype", required_argument, NULL, 'd' },
        { "op_redop", required_argument, NULL, 'R' },
        { "redop", required_argument, NULL, 'R' },
        { "root", required_argument, NULL, 'r' },
        { "check", required_argument, NULL, 'c' },
        { "algo", required_argument, NULL, 'a' },
        { "inplace", required_argument, NULL, 'i' },
        { "timeout", required_argument, NULL, 'T' },
        { "user-buf", no_argument, NULL, 'u' },
        { "json", no_argument, NULL, 'J' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c;
    memset(o, 0, sizeof(*o));
    o->op = OP_ALLREDUCE;
    o->sw.min_bytes = o->sw.max_bytes = 32u << 20;
    o->sw.factor = 2;
    o->sw.iters = 20;
    o->sw.warmup = 5;
    o->dtype = CFX_DTYPE_F32;
    o->redop = CFX_OP_SUM;
    o->sw.check = 1;
    o->place = PLACE_OUT;
    while ((c = getopt_long(argc, argv, "o:b:e:f:n:w:d:R:r:c:a:i:T:uh", lopts, NULL)) != -1) {
        int taken = sweep_opt(PROG, c, optarg, 0, INT_MAX, &o->sw);
        if (taken < 0)
            return TOOL_EXIT_USAGE;
        if (taken)
            continue;
        switch (c) {
        case 'o':
            if (parse_op(optarg, &o->op))
                goto bad_word;
            break;
        case 'd':
            if (cfx_dtype_from_name(optarg, &o->dtype) != CFX_OK)
                goto bad_word;
            break;
        case 'R':
            if (cfx_redop_from_name(optarg, &o->redop) != CFX_OK)
                goto bad_word;
            break;
        case 'a':
            if (parse_algo(optarg, o))
                goto bad_word;
            break;
        case 'i':
            if (!strcmp(optarg, "0"))
                o->place = PLACE_OUT;
            else if (!strcmp(optarg, "1"))
                o->place = PLACE_IN;
            else if (!strcmp(optarg, "2") || !strcasecmp(optarg, "both"))
                o->place = PLACE_BOTH;
            else
                goto bad_word;
            break;
        case 'u': o->user_buf = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return 2;
        }
    }
    if (sweep_done(PROG, argc, argv, optind, &o->sw, usage))
        return TOOL_EXIT_USAGE;
    /* a send and a receive buffer of the largest size, before anything is allocated */
    if (tool_arg_mem(PROG, o->sw.max_arg ? "-e" : "-b",
                     o->sw.max_arg   ? o->sw.max_arg
                     : o->sw.min_arg ? o->sw.min_arg
                                     : "32M",
                     2 * o->sw.max_bytes, 0))
        return TOOL_EXIT_USAGE;
    /* a size below one element is no row: a sweep with no other size would
     * print an empty table and say OK */
    size_t esize = cfx_dtype_size(o->dtype), last = sweep_last(&o->sw);
    if (o->op != OP_BARRIER && last < esize) {
        fprintf(stderr, "%s: -b %zu -e %zu: no size of the sweep holds one %s element (%zu "
                "byte%s), so no row would run: sizes count whole elements of -d (give -e %zu "
                "or more)\n", PROG, o->sw.min_bytes, o->sw.max_bytes, cfx_dtype_name(o->dtype),
                esize, esize == 1 ? "" : "s", esize);
        return TOOL_EXIT_USAGE;
    }
    if (o->place & PLACE_IN && !ops[o->op].inplace && o->place != PLACE_BOTH) {
        fprintf(stderr, "cfx_coll_perf: %s has no in-place form\n", ops[o->op].name);
        return 2;
    }
    return 0;
bad_word:
    return bad_word(c, optarg);
}

/* ---- deterministic inputs and expected results ---------------------------- */

static uint32_t mix(uint32_t rank, uint64_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 32);
    h ^= rank * 0x9e3779b9u + 0x7f4a7c15u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    h *= 0x297a2d39u;
    h ^= h >> 15;
    return h;
}

/*
 * Element i of rank r's input.  Small integers, so that every result is exact
 * in every dtype whatever order the ranks are combined in: a sum stays
 * within 240 (exact in bfloat16, no u8 wrap), a product is a power of two.
 */
static double input_value(const struct coll_run *R, int r, uint64_t i)
{
    uint32_t h = mix((uint32_t)r, i);
    if (!ops[R->o->op].redop)
        return (double)(h % 128);
    switch (R->o->redop) {
    case CFX_OP_SUM: {
        uint32_t span = (uint32_t)(240 / R->n) + 1;
        span = span > 64 ? 64 : span < 2 ? 2 : span;
        return (double)(h % span);
    }
    case CFX_OP_PROD: return (h & 3) == 0 ? 2.0 : 1.0;
    default: return (double)(h % 128);
    }
}

static double combine(enum cfx_redop op, double a, double b)
{
    switch (op) {
    case CFX_OP_SUM: return a + b;
    case CFX_OP_PROD: return a * b;
    case CFX_OP_MIN: return b < a ? b : a;
    default: return b > a ? b : a;
    }
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf, NaN */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* rounds past 65504 */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

/* Store @p v (an exact integer) as element @p idx of @p buf in the dtype. */
static void store(enum cfx_dtype t, void *buf, size_t idx, double v)
{
    switch (t) {
    case CFX_DTYPE_F32: ((float *)buf)[idx] = (float)v; break;
    case CFX_DTYPE_F64: ((double *)buf)[idx] = v; break;
    case CFX_DTYPE_F16: ((uint16_t *)buf)[idx] = f32_to_f16((float)v); break;
    case CFX_DTYPE_BF16: ((uint16_t *)buf)[idx] = f32_to_bf16((float)v); break;
    /* integers wrap modulo 2^bits, as the library's kernels do */
    case CFX_DTYPE_I32: ((int32_t *)buf)[idx] = (int32_t)(uint32_t)(uint64_t)(int64_t)v; break;
    case CFX_DTYPE_I64: ((int64_t *)buf)[idx] = (int64_t)v; break;
    default: ((uint8_t *)buf)[idx] = (uint8_t)(uint64_t)(int64_t)v; break;
    }
}

/* Fill @p count elements at @p buf with rank r's inputs first..first+count-1. */
static void fill(const struct coll_run *R, void *buf, int r, uint64_t first, size_t count)
{
    for (size_t i = 0; i < count; i++)
        store(R->o->dtype, buf, i, input_value(R, r, first + i));
}

/* Element i of the reduction over all ranks of their inputs at index i. */
static double reduced(const struct coll_run *R, uint64_t i)
{
    double v = input_value(R, 0, i);
    for (int r = 1; r < R->n; r++)
        v = combine(R->o->redop, v, input_value(R, r, i));
    return v;
}

/* Count the elements of out[0..count) that differ, bit for bit, from the
 * expected values; which(R, k) gives the expected value of element k. */
static uint64_t compare(struct coll_run *R, const char *out, size_t count,
                        double (*which)(const struct coll_run *, size_t))
{
    uint64_t wrong = 0;
    for (size_t k = 0; k < count; k++) {
        store(R->o->dtype, R->expect, 0, which(R, k));
        if (memcmp(R->expect, out + k * R->esize, R->esize))
            wrong++;
    }
    return wrong;
}

/* The expected value of element k of this rank's output, per op. */

static double exp_allreduce(const struct coll_run *R, size_t k)
{
    return reduced(R, k);
}

static double exp_bcast(const struct coll_run *R, size_t k)
{
    return input_value(R, R->o->sw.root, k);
}

static double exp_allgather(const struct coll_run *R, size_t k)
{
    return input_value(R, (int)(k / R->count), k % R->count);
}

static double exp_reducescatter(const struct coll_run *R, size_t k)
{
    return reduced(R, (uint64_t)R->rank * R->count + k);
}

static double exp_alltoall(const struct coll_run *R, size_t k)
{
    return input_value(R, (int)(k / R->count), (uint64_t)R->rank * R->count + k % R->count);
}

static double exp_scatter(const struct coll_run *R, size_t k)
{
    return input_value(R, R->o->sw.root, (uint64_t)R->rank * R->count + k);
}

static double exp_sendrecv(const struct coll_run *R, size_t k)
{
    return input_value(R, (R->rank + R->n - 1) % R->n, k);
}

/* ---- the calls ------------------------------------------------------------- */

/* Pointers of one call: the in-place forms pass the same memory, as
 * MPI_IN_PLACE does (group.h says where each op's block sits). */
static void buffers(struct coll_run *R, int inplace, size_t count, char **s, char **r)
{
    size_t blk = count * R->esize;
    *s = R->send;
    *r = R->recv;
    if (!inplace)
        return;
    switch (R->o->op) {
    case OP_ALLGATHER:
    case OP_GATHER: *s = R->recv + (size_t)R->rank * blk; break;
    case OP_REDUCESCATTER:
    case OP_SCATTER:
        *r = R->send + (size_t)R->rank * blk;
        *s = R->send;
        break;
    default: *s = R->recv; break;
    }
}

static int sendrecv(struct coll_run *R, const char *s, char *r, size_t bytes)
{
    int next = (R->rank + 1) % R->n, prev = (R->rank + R->n - 1) % R->n, rc;
    if (R->n == 1) {
        memmove(r, s, bytes);
        return CFX_OK;
    }
    /* Blocking send and receive: even ranks send first, odd ranks receive
     * first, so a ring of any size makes progress. */
    if (R->rank % 2 == 0) {
        rc = cfx_group_send(R->g, s, bytes, next, 0, &R->cp);
        if (rc == CFX_OK)
            rc = cfx_group_recv(R->g, r, bytes, prev, 0, &R->cp);
    } else {
        rc = cfx_group_recv(R->g, r, bytes, prev, 0, &R->cp);
        if (rc == CFX_OK)
            rc = cfx_group_send(R->g, s, bytes, next, 0, &R->cp);
    }
    return rc;
}

#define SENDBURST_N 128 /* messages of one sendburst call */

/* Even ranks send SENDBURST_N messages in a row to r+1, odd ranks receive
 * them, then odd ranks send one to r+1 and even ones receive it: with two
 * ranks, a burst and an answer to its last message (osu_bw's window). */
static int sendburst(struct coll_run *R, const char *s, char *r, size_t bytes)
{
    int next = (R->rank + 1) % R->n, prev = (R->rank + R->n - 1) % R->n, rc = CFX_OK;
    if (R->n == 1) {
        memmove(r, s, bytes);
        return CFX_OK;
    }
    if (R->n % 2)
        return CFX_ERR_INVALID;
    if (R->rank % 2 == 0) {
        for (int i = 0; i < SENDBURST_N && rc == CFX_OK; i++)
            rc = cfx_group_send(R->g, s, bytes, next, 0, &R->cp);
        if (rc == CFX_OK)
            rc = cfx_group_recv(R->g, r, bytes, prev, 0, &R->cp);
    } else {
        for (int i = 0; i < SENDBURST_N && rc == CFX_OK; i++)
            rc = cfx_group_recv(R->g, r, bytes, prev, 0, &R->cp);
        if (rc == CFX_OK)
            rc = cfx_group_send(R->g, s, bytes, next, 0, &R->cp);
    }
    return rc;
}

static int call(struct coll_run *R, int inplace, size_t count)
{
    const struct coll_opts *o = R->o;
    char *s, *r;
    buffers(R, inplace, count, &s, &r);
    switch (o->op) {
    case OP_ALLREDUCE: return cfx_group_allreduce(R->g, s, r, count, o->dtype, o->redop, &R->cp);
    case OP_BROADCAST:
        /* one buffer: both placements broadcast in place (the out-of-place
         * form would only add the root's copy) */
        return cfx_group_broadcast(R->g, r, count, o->dtype, o->sw.root, &R->cp);
    case OP_REDUCE:
        return cfx_group_reduce(R->g, s, r, count, o->dtype, o->redop, o->sw.root, &R->cp);
    case OP_ALLGATHER: return cfx_group_allgather(R->g, s, r, count, o->dtype, &R->cp);
    case OP_REDUCESCATTER:
        return cfx_group_reduce_scatter(R->g, s, r, count, o->dtype, o->redop, &R->cp);
    case OP_ALLTOALL: return cfx_group_alltoall(R->g, s, r, count, o->dtype, &R->cp);
    case OP_GATHER: return cfx_group_gather(R->g, s, r, count, o->dtype, o->sw.root, &R->cp);
    case OP_SCATTER: return cfx_group_scatter(R->g, s, r, count, o->dtype, o->sw.root, &R->cp);
    case OP_SENDRECV: return sendrecv(R, s, r, count * R->esize);
    case OP_SENDBURST: return sendburst(R, s, r, count * R->esize);
    default: return cfx_group_barrier(R->g, &R->cp);
    }
}

/* Set this rank's inputs, poison its outputs, run once, count wrong elements. */
static int check(struct coll_run *R, int inplace, size_t count, uint64_t *wrong)
{
    const struct coll_opts *o = R->o;
    size_t blk = count * R->esize, n = (size_t)R->n;
    size_t total = ops[o->op].blocked ? n * blk : blk;
    char *s, *r;
    int rc, me = R->rank, is_root = me == o->sw.root;
    buffers(R, inplace, count, &s, &r);
    /* poison both buffers: the timed calls left correct results in them */
    memset(R->recv, 0xa5, total);
    memset(R->send, 0x5a, total);
    R->count = count;

    switch (o->op) {
    case OP_ALLREDUCE:
    case OP_REDUCE:
    case OP_SENDRECV:
    case OP_SENDBURST: fill(R, s, me, 0, count); break;
    case OP_BROADCAST:
        if (is_root)
            fill(R, r, me, 0, count);
        break;
    case OP_ALLGATHER:
    case OP_GATHER: fill(R, s, me, 0, count); break;
    case OP_REDUCESCATTER:
    case OP_ALLTOALL: fill(R, s, me, 0, n * count); break;
    case OP_SCATTER:
        if (is_root)
            fill(R, s, me, 0, n * count);
        break;
    default: break;
    }

    rc = call(R, inplace, count);
    if (rc != CFX_OK)
        return rc;

    switch (o->op) {
    case OP_ALLREDUCE: *wrong = compare(R, r, count, exp_allreduce); break;
    case OP_REDUCE: *wrong = is_root ? compare(R, r, count, exp_allreduce) : 0; break;
    case OP_BROADCAST: *wrong = compare(R, r, count, exp_bcast); break;
    case OP_ALLGATHER: *wrong = compare(R, R->recv, n * count, exp_allgather); break;
    case OP_GATHER: *wrong = is_root ? compare(R, R->recv, n * count, exp_allgather) : 0; break;
    case OP_REDUCESCATTER: *wrong = compare(R, r, count, exp_reducescatter); break;
    case OP_ALLTOALL: *wrong = compare(R, r, n * count, exp_alltoall); break;
    case OP_SCATTER: *wrong = compare(R, r, count, exp_scatter); break;
    case OP_SENDRECV:
    case OP_SENDBURST: *wrong = compare(R, r, count, exp_sendrecv); break;
    default: *wrong = 0; break;
    }
    return CFX_OK;
}

/* Mean time of one call in seconds on this rank, after a barrier. */
static int timed(struct coll_run *R, int inplace, size_t count, double *sec)
{
    int rc;
    for (long i = 0; i < R->o->sw.warmup; i++)
        if ((rc = call(R, inplace, count)) != CFX_OK)
            return rc;
    if ((rc = cfx_group_barrier(R->g, &R->cp_plain)) != CFX_OK)
        return rc;
    double t = perf_now();
    for (long i = 0; i < R->o->sw.iters; i++)
        if ((rc = call(R, inplace, count)) != CFX_OK)
            return rc;
    *sec = (perf_now() - t) / (double)R->o->sw.iters;
    return CFX_OK;
}

static double bus_factor(enum bus_factor f, int n)
{
    switch (f) {
    case BUS_ALLRED: return 2.0 * (n - 1) / n;
    case BUS_RING: return (double)(n - 1) / n;
    case BUS_ONE: return 1.0;
    default: return 0.0;
    }
}

static void print_time(double us)
{
    if (us >= 10000.0)
        printf("  %7.0f", us);
    else if (us >= 100.0)
        printf("  %7.1f", us);
    else
        printf("  %7.2f", us);
}

/* After a failed call: say what failed, leave the cluster (the coordinator
 * would list a rank that only exits as dead) and exit 1. */
static void die(struct coll_run *R, const char *what, size_t size, int rc)
{
    fprintf(stderr, "cfx_coll_perf: rank %d: %s %s of %zu bytes: %s: %s\n", R->rank,
            ops[R->o->op].name, what, size, cfx_errname(rc), cfx_last_error());
    cfx_group_destroy(R->g);
    cfx_context_destroy(R->ctx);
    exit(1);
}

/* Banner lines after "# ": one per rank, gathered with allgather when it works. */
struct rank_info {
    int32_t pid;
    uint32_t node;
    char host[56];
};

static void print_ranks(struct coll_run *R, struct cfx_context *ctx)
{
    struct rank_info me = { .pid = (int32_t)getpid(), .node = cfx_context_node_id(ctx) };
    struct rank_info *all = calloc((size_t)R->n, sizeof(*all));
    gethostname(me.host, sizeof(me.host) - 1);
    int rc = all ? cfx_group_allgather(R->g, &me, all, sizeof(me), CFX_DTYPE_U8, &R->cp_plain)
                 : CFX_ERR_NOMEM;
    if (R->rank == 0 && !R->o->sw.json) {
        printf("#\n# Using ranks\n");
        if (rc == CFX_OK)
            for (int r = 0; r < R->n; r++)
                printf("#  Rank %2d Pid %6d on %10.*s node %u\n", r, (int)all[r].pid,
                       (int)sizeof(all[r].host), all[r].host, (unsigned)all[r].node);
        else
            printf("#  Rank %2d Pid %6d on %10s node %u (rank list: %s)\n", 0, (int)me.pid, me.host,
                   (unsigned)me.node, cfx_errname(rc));
        printf("#\n");
    }
    free(all);
}

int main(int argc, char **argv)
{
    struct coll_opts o;
    struct coll_run R = { .o = &o };
    struct cfx_context *ctx = NULL;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;
    const struct op_desc *d = &ops[o.op];
    R.esize = cfx_dtype_size(o.dtype);

    /* the coordinator may still be starting when a launcher starts us: the
     * context retries it until its deadline (CFX_TIMEOUT_MS) */
    rc = cfx_context_create(NULL, &ctx);
    if (rc != CFX_OK) {
        fprintf(stderr, "cfx_coll_perf: cannot join the cluster: %s: %s\n", cfx_errname(rc),
                cfx_last_error());
        return 1;
    }
    R.ctx = ctx;
    rc = cfx_group_create(ctx, NULL, &R.g);
    if (rc != CFX_OK) {
        fprintf(stderr, "cfx_coll_perf: cannot create the group: %s: %s\n", cfx_errname(rc),
                cfx_last_error());
        cfx_context_destroy(ctx);
        return 1;
    }
    R.rank = cfx_group_rank(R.g);
    R.n = cfx_group_size(R.g);
    if ((d->root && o.sw.root >= R.n) || (o.op == OP_SENDBURST && R.n > 1 && R.n % 2)) {
        if (R.rank == 0 && o.op == OP_SENDBURST)
            fprintf(stderr, "cfx_coll_perf: -o sendburst pairs the ranks: it needs 1 or an "
                    "even number of them, not %d\n", R.n);
        else if (R.rank == 0)
            fprintf(stderr, "cfx_coll_perf: root %d is not a rank of a group of %d\n", o.sw.root,
                    R.n);
        cfx_group_barrier(R.g, NULL); /* rank 0 has said why before any rank exits */
        cfx_group_destroy(R.g);
        cfx_context_destroy(ctx);
        return 2;
    }
    /* blocked ops: a size holds n blocks of at least one element each */
    size_t last = sweep_last(&o.sw);
    if (d->blocked && last < (size_t)R.n * R.esize) {
        if (R.rank == 0)
            fprintf(stderr, "cfx_coll_perf: -b %zu -e %zu: no size of the sweep holds one %s "
                    "element (%zu bytes) per rank for %s over %d ranks, so no row would run "
                    "(give -e %zu or more)\n", o.sw.min_bytes, o.sw.max_bytes,
                    cfx_dtype_name(o.dtype), R.esize, d->name, R.n, (size_t)R.n * R.esize);
        /* rank 0 has said why before any rank exits (a launcher stops the
         * others at the first exit) */
        cfx_group_barrier(R.g, NULL);
        cfx_group_destroy(R.g);
        cfx_context_destroy(ctx);
        return TOOL_EXIT_USAGE;
    }
    R.cp.field_mask =
        (o.algo_set ? CFX_COLL_PARAM_ALGO : 0) | (o.sw.timeout_ms ? CFX_COLL_PARAM_TIMEOUT : 0);
    R.cp.algo = o.algo;
    R.cp.timeout_ms = o.sw.timeout_ms;
    R.cp_plain.field_mask = o.sw.timeout_ms ? CFX_COLL_PARAM_TIMEOUT : 0;
    R.cp_plain.timeout_ms = o.sw.timeout_ms;

    /* Buffers for the largest size: blocked ops hold n blocks on one side. */
    size_t n = (size_t)R.n;
    size_t maxcount = o.sw.max_bytes / R.esize / (d->blocked ? n : 1);
    size_t bufbytes = (d->blocked ? n : 1) * maxcount * R.esize;
    bufbytes = bufbytes ? bufbytes : R.esize;
    if (!o.user_buf && perf_pins(ctx)) { /* the arena is pinned over verbs */
        char val[32];
        snprintf(val, sizeof(val), "%zu", o.sw.max_bytes);
        if (tool_arg_mem(PROG, "-e", val, 2 * bufbytes, 1)) {
            cfx_group_destroy(R.g);
            cfx_context_destroy(ctx);
            return TOOL_EXIT_USAGE;
        }
    }
    if (o.user_buf) {
        R.send = malloc(bufbytes);
        R.recv = malloc(bufbytes);
        rc = R.send && R.recv ? CFX_OK : CFX_ERR_NOMEM;
    } else {
        rc = cfx_buf_alloc(ctx, bufbytes, (void **)&R.send);
        if (rc == CFX_OK)
            rc = cfx_buf_alloc(ctx, bufbytes, (void **)&R.recv);
    }
    R.expect = malloc(16);
    if (rc != CFX_OK || !R.expect) {
        fprintf(stderr, "cfx_coll_perf: rank %d: cannot allocate 2 x %zu bytes: %s\n", R.rank,
                bufbytes, cfx_last_error());
        cfx_group_destroy(R.g);
        cfx_context_destroy(ctx); /* arena buffers go with it; malloc'd ones at exit */
        return 1;
    }
    memset(R.send, 1, bufbytes);
    memset(R.recv, 1, bufbytes);

    if (R.rank == 0 && !o.sw.json)
        printf("# Conflux %s test: nRanks %d minBytes %zu maxBytes %zu step: %ld(factor) "
               "warmup iters: %ld iters: %ld validation: %d algo: %s buffers: %s\n",
               d->name, R.n, o.sw.min_bytes, o.sw.max_bytes, o.sw.factor, o.sw.warmup, o.sw.iters,
               o.sw.check, o.algo_set ? cfx_algo_name(o.algo) : "auto",
               o.user_buf ? "user" : "arena");
    print_ranks(&R, ctx);
    int place_lo = o.place & PLACE_OUT ? 0 : 1, place_hi = o.place & PLACE_IN ? 1 : 0;
    if (R.rank == 0) {
        if (o.sw.json) {
            printf("{\"tool\":\"cfx_coll_perf\",\"op\":\"%s\",\"nranks\":%d,\"datatype\":\"%s\","
                   "\"redop\":\"%s\",\"root\":%d,\"algo\":\"%s\",\"iters\":%ld,\"warmup\":%ld,"
                   "\"check\":%d,\"buffer\":\"%s\",\"results\":[",
                   d->name, R.n, cfx_dtype_name(o.dtype),
                   d->redop ? cfx_redop_name(o.redop) : "none", d->root ? o.sw.root : -1,
                   o.algo_set ? cfx_algo_name(o.algo) : "auto", o.sw.iters, o.sw.warmup, o.sw.check,
                   o.user_buf ? "user" : "arena");
        } else {
            printf("# %10s  %12s  %8s  %6s  %6s", "", "", "", "", "");
            if (o.place & PLACE_OUT)
                printf("           out-of-place          ");
            if (o.place & PLACE_IN)
                printf("             in-place          ");
            printf("\n# %10s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
            for (int p = place_lo; p <= place_hi; p++)
                printf("  %7s  %6s  %6s %6s", "time", "algbw", "busbw", "#wrong");
            printf("\n# %10s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
            for (int p = place_lo; p <= place_hi; p++)
                printf("  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
            printf("\n");
        }
        fflush(stdout);
    }

    double bw_sum = 0;
    long bw_count = 0, rows = 0;
    int64_t wrong_total = 0;
    size_t size = o.sw.min_bytes;
    for (;;) {
        size_t count = d->blocked ? size / R.esize / n : size / R.esize;
        size_t bytes = (d->blocked ? n : 1) * count * R.esize;
        if (o.op == OP_BARRIER)
            count = bytes = 0;
        if (count || o.op == OP_BARRIER) {
            if (R.rank == 0 && !o.sw.json)
                printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count,
                       o.op == OP_BARRIER ? "none" : cfx_dtype_name(o.dtype),
                       d->redop ? cfx_redop_name(o.redop) : "none", d->root ? o.sw.root : -1);
            for (int p = place_lo; p <= place_hi; p++) {
                if (p == 1 && !d->inplace) {
                    if (R.rank == 0 && !o.sw.json)
                        printf("  %7s  %6s  %6s  %5s", "-", "-", "-", "-");
                    continue;
                }
                double sec = 0, maxsec = 0;
                int64_t wrong = 0, wrong_sum = 0;
                if ((rc = timed(&R, p, count, &sec)) != CFX_OK)
                    die(&R, "timed loop", bytes, rc);
                rc = cfx_group_allreduce(R.g, &sec, &maxsec, 1, CFX_DTYPE_F64, CFX_OP_MAX,
                                         &R.cp_plain);
                if (rc != CFX_OK)
                    die(&R, "time reduction after", bytes, rc);
                if (o.sw.check && o.op != OP_BARRIER) {
                    uint64_t w = 0;
                    if ((rc = check(&R, p, count, &w)) != CFX_OK)
                        die(&R, "check run", bytes, rc);
                    wrong = (int64_t)w;
                    rc = cfx_group_allreduce(R.g, &wrong, &wrong_sum, 1, CFX_DTYPE_I64, CFX_OP_SUM,
                                             &R.cp_plain);
                    if (rc != CFX_OK)
                        die(&R, "error count reduction after", bytes, rc);
                    wrong_total += wrong_sum;
                }
                double algbw = maxsec > 0 ? (double)bytes / maxsec / 1e9 : 0;
                double busbw = algbw * bus_factor(d->factor, R.n);
                bw_sum += busbw;
                bw_count++;
                if (R.rank != 0)
                    continue;
                if (o.sw.json) {
                    printf("%s{\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"redop\":\"%s\","
                           "\"root\":%d,\"inplace\":%d,\"time_us\":%.3f,\"algbw\":%.6f,"
                           "\"busbw\":%.6f,\"wrong\":",
                           rows++ ? "," : "", bytes, count, cfx_dtype_name(o.dtype),
                           d->redop ? cfx_redop_name(o.redop) : "none", d->root ? o.sw.root : -1, p,
                           maxsec * 1e6, algbw, busbw);
                    if (o.sw.check && o.op != OP_BARRIER)
                        printf("%" PRId64 "}", wrong_sum);
                    else
                        printf("null}");
                } else {
                    print_time(maxsec * 1e6);
                    printf("  %6.2f  %6.2f", algbw, busbw);
                    if (o.sw.check && o.op != OP_BARRIER)
                        printf("  %5" PRId64, wrong_sum);
                    else
                        printf("  %5s", "N/A");
                }
            }
            if (R.rank == 0 && !o.sw.json) {
                printf("\n");
                fflush(stdout);
            }
        }
        if (o.op == OP_BARRIER || size >= last)
            break;
        size = size ? size * (size_t)o.sw.factor : 1;
    }

    double avg = bw_count ? bw_sum / (double)bw_count : 0;
    if (R.rank == 0) {
        if (o.sw.json)
            printf("],\"wrong\":%" PRId64 ",\"avg_busbw\":%.6f}\n", wrong_total, avg);
        else {
            printf("# Out of bounds values : %" PRId64 " %s\n", wrong_total,
                   wrong_total ? "FAILED" : "OK");
            printf("# Avg bus bandwidth    : %g \n", avg);
            printf("#\n");
        }
        fflush(stdout);
    }
    /* leave together, so that no rank tears down a link another still uses */
    cfx_group_barrier(R.g, &R.cp_plain);
    if (o.user_buf) {
        free(R.send);
        free(R.recv);
    } else {
        cfx_buf_free(ctx, R.send);
        cfx_buf_free(ctx, R.recv);
    }
    free(R.expect);
    cfx_group_destroy(R.g);
    cfx_context_destroy(ctx);
    return wrong_total ? 1 : 0;
}

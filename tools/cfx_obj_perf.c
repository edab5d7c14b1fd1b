/*
 * cfx_obj_perf: object broadcast, reduce and allreduce (many gets of one
 * object, cfx_reduce_objects, and the two together), in the manner of
 * nccl-tests and cfx_coll_perf.
 *
 *   cfx_run -n 4 build/bin/cfx_obj_perf -o broadcast -b 1M -e 64M
 *   cfx_run -n 4 build/bin/cfx_obj_perf -o broadcast -e 64M -A 200
 *   cfx_run -n 8 build/bin/cfx_obj_perf -o reduce -k 6 -e 64M
 *   cfx_run -n 4 build/bin/cfx_obj_perf -o broadcast -e 256M --kill 2@1000
 *   cfx_run -n 5 build/bin/cfx_obj_perf -o broadcast -r 1 --replicas 3
 *
 * or one process per node, each with CFX_COORD, CFX_TOKEN (or CFX_TOKEN_FILE),
 * CFX_RANK and CFX_WORLD_SIZE (or another launcher's rank variables) in its
 * environment.
 *
 * One iteration of each op, after a barrier of all ranks:
 *   broadcast  the root puts an object of SIZE bytes; every other rank gets
 *              it.
 *   reduce     every rank puts an input of SIZE bytes (float32); the root
 *              reduces (sum) the first k of the n inputs with
 *              cfx_reduce_objects.
 *   allreduce  as reduce, with CFX_OBJ_FLAG_ALLREDUCE (every holder reads the
 *              result: striped when k = n), and every rank gets the result,
 *              asking for it right after its own put (as it is produced).
 * With --replicas K (broadcast) the K ranks after the root (root + 1, ...)
 * get the object before the barrier, untimed, so that the timed getters
 * find K + 1 complete holders (a get then pulls from several at once:
 * CFX_GET_SOURCES); the copies settle in the directory for 200 ms first.
 * With -A MS the ranks arrive apart: the rank in arrival slot s begins its
 * part (its get, or its put) s * MS ms after the barrier.  Slots rotate
 * every iteration, so no rank is always first.
 *
 * Columns (rank 0 prints; times are each rank's own, counted from the moment
 * it left the barrier, so no two hosts' clocks are compared):
 *   size    bytes of the object (of each input)
 *   time    the median over the iterations of: the last end minus the last
 *           start, where a start is a rank beginning its part (a get; for
 *           reduce and allreduce, the put of an input that was reduced) and
 *           an end is its part returning (a get; the root's reduce).  With
 *           -A 0 it is the time of the whole op; with spacing it is how long
 *           the op ran after its last arrival.
 *   algbw   size / time
 *   xbound  with -B GBIT (the link rate, Gbit/s): time over the bound a link
 *           of that rate sets: S/B for broadcast and reduce, 2(n-1)/n S/B for
 *           allreduce (as test/cluster/bench.sh for the group collectives)
 *   #wrong  bytes (broadcast) or elements (reduce, allreduce) that differ
 *           from the expected values, summed over ranks and iterations; every
 *           iteration uses other values, so a stale copy is counted
 *
 * --kill R@MS: rank R ends MS ms into the first timed iteration of the first
 * size, without leaving the cluster (_exit(0): its sockets close as in a
 * crash; exit status 0, so a launcher that stops every rank when one fails
 * lets the others finish).  The survivors finish that iteration, report it
 * through a group of their own, and stop.  A call that failed because of the
 * victim is reported with its status, not counted as wrong data.
 */
#include <conflux/conflux.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "sweep.h"

#define PROG      "cfx_obj_perf"
#define ITERS_MAX 100000L

enum op_kind { OP_BROADCAST, OP_REDUCE, OP_ALLREDUCE, OP_LAST };
static const char *const op_names[] = { "broadcast", "reduce", "allreduce", NULL };

struct opts {
    enum op_kind op;
    struct sweep_opts sw; /* -b -e -f -n -w -r -c -T (0 = the context's) --json */
    int k;              /* reduce: first k of n; 0 = n */
    int spacing_ms;     /* -A */
    double link_gbit;   /* -B; 0 = no bound column */
    int kill_rank;      /* --kill R@MS; -1 = none */
    int replicas;       /* --replicas K: complete copies made before the timed gets */
    int kill_ms;
};

struct run {
    const struct opts *o;
    struct cfx_context *ctx;
    struct cfx_group *g;
    int rank, n;
    uint64_t tag;       /* this run's ids differ from every earlier run's */
    char *buf;          /* the object (broadcast) or this rank's input */
    char *res;          /* reduce result read back */
    struct cfx_obj_params op;
    struct cfx_coll_params cp;
};

/* What one rank measured in one iteration (allgathered as doubles). */
struct sample {
    double start, end; /* seconds since the rank left the barrier; end < 0: no part */
    double rc;         /* status of its part */
    double wrong;      /* bytes / elements that differ */
};
#define SAMPLE_DOUBLES (sizeof(struct sample) / sizeof(double))

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    double d;
    while ((d = t - now_s()) > 0) {
        struct timespec ts = { .tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9) };
        nanosleep(&ts, NULL);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cfx_obj_perf [options]   (every rank runs it)\n"
            "\n"
            "  -o, --op=OP           broadcast, reduce, allreduce (default broadcast)\n"
            "  -b, --minbytes=N      smallest size, K/M/G suffixes (default 64M)\n"
            "  -e, --maxbytes=N      largest size (default 64M)\n"
            "  -f, --stepfactor=N    multiply the size by N each step, 2..1048576 (default 2)\n"
            "  -n, --iters=N         timed iterations per size, 1..%ld (default 5)\n"
            "  -w, --warmup_iters=N  untimed iterations first (default 1)\n"
            "  -r, --root=R          the putter (broadcast) or reducer (default 0)\n"
            "  -k, --first=K         reduce the first K of the n inputs (default n)\n"
            "  -A, --spacing=MS      arrivals MS ms apart, in an order that changes every\n"
            "                        iteration (default 0: all at once)\n"
            "  -B, --link=GBIT       link rate in Gbit/s: print time over the bound it sets\n"
            "  -c, --check=0|1       check every byte of every result (default 1)\n"
            "  -T, --timeout=MS      deadline of each get, put and reduce (default: the\n"
            "                        context's)\n"
            "      --kill=R@MS       rank R ends MS ms into the first timed iteration, as in\n"
            "                        a crash; the others finish it and report\n"
            "      --replicas=K      broadcast: the K ranks after the root get the object\n"
            "                        first, untimed; the others' gets are timed\n"
            "      --json            one JSON document on stdout instead of the table\n"
            "  -h, --help\n"
            "\n"
            "Ranks and the cluster come from the environment (cfx_run sets CFX_RANK,\n"
            "CFX_WORLD_SIZE, CFX_COORD, CFX_TOKEN_FILE).  A bad value is named on stderr;\n"
            "usage errors exit with status 2.  Exit status 1 when a call failed or data was\n"
            "wrong.\n",
            ITERS_MAX);
}

static int parse_kill(const char *s, struct opts *o)
{
    const char *at = strchr(s, '@');
    char rank[32];
    if (!at || (size_t)(at - s) >= sizeof(rank)) {
        fprintf(stderr, "%s: --kill: '%s' is not RANK@MS\n", PROG, s);
        return -1;
    }
    memcpy(rank, s, (size_t)(at - s));
    rank[at - s] = '\0';
    if (tool_arg_int(PROG, "--kill", rank, 0, 1 << 20, "a rank", &o->kill_rank) ||
        tool_arg_int(PROG, "--kill", at + 1, 0, INT_MAX, "a time in ms", &o->kill_ms))
        return -1;
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    static const struct option lopts[] = {
        { "op", required_argument, NULL, 'o' },
        { "minbytes", required_argument, NULL, 'b' },
        { "maxbytes", required_argument, NULL, 'e' },
        { "stepfactor", required_argument, NULL, 'f' },
        { "iters", required_argument, NULL, 'n' },
        { "warmup_iters", required_argument, NULL, 'w' },
        { "root", required_argument, NULL, 'r' },
        { "first", required_argument, NULL, 'k' },
        { "spacing", required_argument, NULL, 'A' },
        { "link", required_argument, NULL, 'B' },
        { "check", required_argument, NULL, 'c' },
        { "timeout", required_argument, NULL, 'T' },
        { "kill", required_argument, NULL, 'K' },
        { "replicas", required_argument, NULL, 'R' },
        { "json", no_argument, NULL, 'J' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, w;
    memset(o, 0, sizeof(*o));
    o->op = OP_BROADCAST;
    o->sw.min_bytes = o->sw.max_bytes = 64u << 20;
    o->sw.factor = 2;
    o->sw.iters = 5;
    o->sw.warmup = 1;
    o->sw.check = 1;
    o->kill_rank = -1;
    while ((c = getopt_long(argc, argv, "o:b:e:f:n:w:r:k:A:B:c:T:h", lopts, NULL)) != -1) {
        int taken = sweep_opt(PROG, c, optarg, 1, ITERS_MAX, &o->sw);
        if (taken < 0)
            return TOOL_EXIT_USAGE;
        if (taken)
            continue;
        switch (c) {
        case 'o':
            if (tool_arg_word(PROG, "-o", optarg, op_names, &w))
                return TOOL_EXIT_USAGE;
            o->op = (enum op_kind)w;
            break;
        case 'k':
            if (tool_arg_int(PROG, "-k", optarg, 1, 1 << 20, "an input count", &o->k))
                return TOOL_EXIT_USAGE;
            break;
        case 'A':
            if (tool_arg_int(PROG, "-A", optarg, 0, 3600000, "a spacing in ms", &o->spacing_ms))
                return TOOL_EXIT_USAGE;
            break;
        case 'B':
            if (tool_arg_double(PROG, "-B", optarg, 1e-6, 1e6, "a link rate in Gbit/s",
                                &o->link_gbit))
                return TOOL_EXIT_USAGE;
            break;
        case 'K':
            if (parse_kill(optarg, o))
                return TOOL_EXIT_USAGE;
            break;
        case 'R':
            if (tool_arg_int(PROG, "--replicas", optarg, 0, 1 << 20, "a rank count",
                             &o->replicas))
                return TOOL_EXIT_USAGE;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return TOOL_EXIT_USAGE;
        }
    }
    if (sweep_done(PROG, argc, argv, optind, &o->sw, usage))
        return TOOL_EXIT_USAGE;
    if (o->op != OP_BROADCAST && o->sw.min_bytes < 4) {
        fprintf(stderr, "%s: -b: %s needs at least one float32 (4 bytes)\n", PROG,
                op_names[o->op]);
        return TOOL_EXIT_USAGE;
    }
    /* the object or input, and for reduce the result read back */
    if (tool_arg_mem(PROG, "-e", o->sw.max_arg ? o->sw.max_arg : "64M",
                     (o->op == OP_BROADCAST ? 1 : 2) * o->sw.max_bytes, 0))
        return TOOL_EXIT_USAGE;
    return 0;
}

/* ---- values: other ones every iteration, exact in float32 ----------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

/* Byte i of the broadcast object of iteration @p it. */
static uint8_t bcast_byte(uint64_t seed, uint64_t i)
{
    return (uint8_t)(mix64(seed ^ (i >> 3) * 0x100000001b3ull) >> ((i & 7) * 8));
}

/* Element i of rank r's input: a small integer, so any sum of up to 2^20
 * of them is exact in float32 in any order. */
static float input_elem(uint64_t seed, int r, uint64_t i)
{
    return (float)(mix64(seed ^ ((uint64_t)r << 48) ^ i) & 15);
}

static void make_id(const struct run *R, size_t size, long it, const char *what, int r,
                    struct cfx_object_id *id)
{
    char name[128];
    snprintf(name, sizeof(name), "cfx_obj_perf/%016" PRIx64 "/%zu/%ld/%s/%d", R->tag, size, it,
             what, r);
    cfx_object_id_from_name(name, id);
}

/* Arrival slot of @p rank in iteration @p it among @p m participants,
 * @p pos being its index among them. */
static int slot_of(int pos, long it, int m)
{
    return m > 0 ? (int)(((long)pos + it) % m) : 0;
}

/* ---- one iteration -------------------------------------------------------- */

struct put_job {
    struct run *R;
    const struct cfx_object_id *id;
    size_t size;
    double at, t0;        /* start at t0 + at */
    struct sample *s;
};

static void *put_later(void *arg)
{
    struct put_job *j = arg;
    sleep_until(j->t0 + j->at);
    j->s->start = now_s() - j->t0;
    int rc = cfx_put(j->R->ctx, j->id, j->R->buf, j->size, &j->R->op);
    j->s->rc = rc;
    if (rc != CFX_OK)
        fprintf(stderr, "%s: rank %d: put of %zu B: %s: %s\n", PROG, j->R->rank, j->size,
                cfx_errname(rc), cfx_last_error());
    return NULL;
}

static void maybe_die(const struct run *R, bool fault, double t0)
{
    if (fault && R->rank == R->o->kill_rank) {
        sleep_until(t0 + R->o->kill_ms / 1e3);
        fflush(stdout);
        fflush(stderr);
        _exit(0);
    }
}

static void *kill_later(void *arg)
{
    const struct run *R = ((const void **)arg)[0];
    double t0 = *(const double *)((const void **)arg)[1];
    maybe_die(R, true, t0);
    return NULL;
}

/* The root's reduce of every rank's input of iteration @p it into
 * @p result; @p used gets k entries (cfx_reduce_objects). */
static int reduce_inputs(struct run *R, size_t size, long it, int k,
                         const struct cfx_object_id *result, size_t *used)
{
    struct cfx_object_id *in = calloc((size_t)R->n, sizeof(*in));
    if (!in)
        return CFX_ERR_NOMEM;
    for (int r = 0; r < R->n; r++)
        make_id(R, size, it, "in", r, &in[r]);
    struct cfx_obj_params p = R->op; /* an allreduce says so: every holder reads the result */
    if (R->o->op == OP_ALLREDUCE) {
        p.field_mask |= CFX_OBJ_PARAM_FLAGS;
        p.flags |= CFX_OBJ_FLAG_ALLREDUCE;
    }
    int rc = cfx_reduce_objects(R->ctx, in, (size_t)R->n, (size_t)k, CFX_DTYPE_F32, CFX_OP_SUM,
                                result, &p, used);
    free(in);
    return rc;
}

/*
 * --kill, allreduce: the victim produced the result (its input was the last
 * of the first k to arrive) and died before any survivor held a complete
 * copy, so the result went with it (include/conflux/object.h, lifecycle).
 * As an application re-runs lost work, the root reduces the survivors'
 * inputs again under the same id and every survivor gets it anew (a get
 * of an id that is gone waits for its next put).
 */
static int result_again(struct run *R, size_t size, long it, const struct cfx_object_id *result,
                        size_t count)
{
    const struct opts *o = R->o;
    int k = o->k ? o->k : R->n;
    fprintf(stderr, "%s: rank %d: the result went with the victim; %s\n", PROG, R->rank,
            R->rank == o->sw.root ? "reducing the survivors' inputs again" : "getting it again");
    if (R->rank == o->sw.root) {
        size_t *u = calloc((size_t)k, sizeof(*u));
        int rc = u ? reduce_inputs(R, size, it, k, result, u) : CFX_ERR_NOMEM;
        free(u);
        /* EXISTS: a survivor did hold a complete copy (this get failed for
         * another reason): get that one */
        if (rc != CFX_OK && rc != CFX_ERR_EXISTS) {
            fprintf(stderr, "%s: rank %d: reduce again: %s: %s\n", PROG, R->rank,
                    cfx_errname(rc), cfx_last_error());
            return rc;
        }
    }
    size_t got = 0;
    memset(R->res, 0, count * 4);
    return cfx_get(R->ctx, result, R->res, count * 4, &got, &R->op);
}

/*
 * Run iteration @p it of size @p size; fill @p s with this rank's part.
 * @p used_out (k entries) gets the reduced inputs' ranks at the root.
 * Every rank returns here (the victim of --kill never does).
 */
/* --replicas: the root puts and the replicas get, before the timed part
 * (every rank calls it; a failure is this rank's status). */
static int replicate(struct run *R, const struct cfx_object_id *obj, size_t size, uint64_t seed,
                     bool replica, struct sample *s)
{
    int rc = CFX_OK;
    if (R->rank == R->o->sw.root) {
        rc = cfx_put(R->ctx, obj, R->buf, size, &R->op);
    } else if (replica) {
        size_t got = 0;
        memset(R->buf, 0, size);
        rc = cfx_get(R->ctx, obj, R->buf, size, &got, &R->op); /* the copy stays in R->buf */
        for (size_t i = 0; rc == CFX_OK && R->o->sw.check && i < size; i++)
            s->wrong += (uint8_t)R->buf[i] != bcast_byte(seed, i);
    }
    if (rc != CFX_OK)
        fprintf(stderr, "%s: rank %d: %s of %zu B before the timed gets: %s: %s\n", PROG,
                R->rank, replica ? "get" : "put", size, cfx_errname(rc), cfx_last_error());
    int brc = cfx_group_barrier(R->g, &R->cp);
    /* the getters told the directory they are complete in the background */
    usleep(200 * 1000);
    return rc != CFX_OK ? rc : brc;
}

static int iteration(struct run *R, size_t size, long it, bool fault, struct sample *s,
                     uint64_t *used_out)
{
    const struct opts *o = R->o;
    uint64_t seed = mix64(R->tag ^ ((uint64_t)size << 20) ^ (uint64_t)it);
    int k = o->k ? o->k : R->n;
    size_t count = size / 4;
    struct cfx_object_id obj, result;
    int rc = CFX_OK;

    memset(s, 0, sizeof(*s));
    s->end = -1;
    if (o->op == OP_BROADCAST) {
        make_id(R, size, it, "bcast", 0, &obj);
        if (R->rank == o->sw.root)
            for (size_t i = 0; i < size; i++)
                R->buf[i] = (char)bcast_byte(seed, i);
    } else {
        make_id(R, size, it, "result", 0, &result);
        make_id(R, size, it, "in", R->rank, &obj);
        for (size_t i = 0; i < count; i++) {
            float v = input_elem(seed, R->rank, i);
            memcpy(R->buf + i * 4, &v, 4);
        }
    }
    bool replica = false; /* --replicas: this rank got its copy before the barrier */
    if (o->op == OP_BROADCAST && o->replicas) {
        int pos = (R->rank - o->sw.root + R->n) % R->n;
        replica = pos >= 1 && pos <= o->replicas;
        if ((rc = replicate(R, &obj, size, seed, replica, s)) != CFX_OK)
            return rc;
    }
    if ((rc = cfx_group_barrier(R->g, &R->cp)) != CFX_OK)
        return rc;
    double t0 = now_s();
    pthread_t killer;
    const void *kargs[2] = { R, &t0 };
    bool killing = fault && R->rank == o->kill_rank;
    if (killing && pthread_create(&killer, NULL, kill_later, kargs) != 0)
        maybe_die(R, true, t0); /* no thread: die at once rather than never */

    if (o->op == OP_BROADCAST && (replica || (o->replicas && R->rank == o->sw.root))) {
        /* a holder already: no timed part */
    } else if (o->op == OP_BROADCAST) {
        if (R->rank == o->sw.root) {
            s->start = 0;
            s->rc = rc = cfx_put(R->ctx, &obj, R->buf, size, &R->op);
            if (rc != CFX_OK)
                fprintf(stderr, "%s: rank %d: put of %zu B: %s: %s\n", PROG, R->rank, size,
                        cfx_errname(rc), cfx_last_error());
        } else {
            int pos = R->rank < o->sw.root ? R->rank : R->rank - 1;
            sleep_until(t0 + slot_of(pos, it, R->n - 1) * o->spacing_ms / 1e3);
            memset(R->buf, 0, size);
            s->start = now_s() - t0;
            size_t got = 0;
            rc = cfx_get(R->ctx, &obj, R->buf, size, &got, &R->op);
            s->end = now_s() - t0;
            s->rc = rc;
            if (rc != CFX_OK) {
                fprintf(stderr, "%s: rank %d: get of %zu B: %s: %s\n", PROG, R->rank, size,
                        cfx_errname(rc), cfx_last_error());
            } else if (o->sw.check) {
                for (size_t i = 0; i < size; i++)
                    s->wrong += (uint8_t)R->buf[i] != bcast_byte(seed, i);
                s->wrong += got != size ? 1 : 0;
            }
        }
    } else {
        /* every rank puts its input at its slot; the root reduces from the
         * start, on this thread, and puts from another */
        struct put_job pj = { R, &obj, count * 4,
                              slot_of(R->rank, it, R->n) * o->spacing_ms / 1e3, t0, s };
        pthread_t putter;
        bool threaded = R->rank == o->sw.root && pthread_create(&putter, NULL, put_later, &pj) == 0;
        if (R->rank == o->sw.root) {
            size_t used[1 << 10];
            size_t *u = k <= (int)(sizeof(used) / sizeof(used[0])) ? used
                                                                     : malloc(sizeof(size_t) * (size_t)k);
            if (!threaded)
                put_later(&pj);
            rc = u ? reduce_inputs(R, size, it, k, &result, u) : CFX_ERR_NOMEM;
            s->end = now_s() - t0;
            if (threaded)
                pthread_join(putter, NULL);
            if (rc != CFX_OK)
                fprintf(stderr, "%s: rank %d: reduce of %d inputs of %zu B: %s: %s\n", PROG,
                        R->rank, R->n, size, cfx_errname(rc), cfx_last_error());
            for (int i = 0; i < k; i++)
                used_out[i] = rc == CFX_OK ? (uint64_t)u[i] : UINT64_MAX;
            s->rc = rc != CFX_OK ? rc : s->rc;
            if (u != used)
                free(u);
        } else {
            put_later(&pj);
        }
    }
    bool check = false; /* allreduce: every rank asks for the result at once, as it is made */
    if (o->op == OP_ALLREDUCE || (o->op == OP_REDUCE && o->sw.check && R->rank == o->sw.root)) {
        size_t got = 0;
        memset(R->res, 0, count * 4);
        int grc = cfx_get(R->ctx, &result, R->res, count * 4, &got, &R->op);
        if (grc == CFX_ERR_PEER_FAILED && fault && o->op == OP_ALLREDUCE)
            grc = result_again(R, size, it, &result, count);
        if (o->op == OP_ALLREDUCE && grc == CFX_OK)
            s->end = now_s() - t0; /* its start stays its input's put */
        if (grc != CFX_OK) {
            fprintf(stderr, "%s: rank %d: get of the result (%zu B): %s: %s\n", PROG, R->rank,
                    count * 4, cfx_errname(grc), cfx_last_error());
            s->rc = grc;
        }
        check = grc == CFX_OK && o->sw.check && !fault;
    }
    if (killing) { /* the victim outlived its own part: it still dies on time */
        double end_ms = (now_s() - t0) * 1e3;
        if (end_ms < o->kill_ms)
            fprintf(stderr,
                    "%s: rank %d: its own part ended at %.0f ms, before --kill's %d ms; it dies "
                    "then (a holder may still be serving the others)\n",
                    PROG, R->rank, end_ms, o->kill_ms);
        pthread_join(killer, NULL);
    }
    if (o->op == OP_BROADCAST || fault)
        return CFX_OK;
    /* the root says which inputs it reduced; every rank checks against them */
    if ((rc = cfx_group_broadcast(R->g, used_out, (size_t)k, CFX_DTYPE_I64, o->sw.root,
                                  &R->cp)) != CFX_OK)
        return rc;
    /* Check once every rank's timed part is over: the check costs a core
     * for a while (k inputs recomputed per element), which a rank still
     * moving data on the same host would otherwise lose. */
    if ((rc = cfx_group_barrier(R->g, &R->cp)) != CFX_OK)
        return rc;
    for (size_t i = 0; check && i < count; i++) {
        float want = 0, have;
        for (int j = 0; j < k; j++)
            want += input_elem(seed, (int)used_out[j], i);
        memcpy(&have, R->res + i * 4, 4);
        s->wrong += memcmp(&want, &have, 4) != 0;
    }
    return CFX_OK;
}

/* Drop this iteration's objects everywhere, once every rank is done with them. */
static int cleanup(struct run *R, size_t size, long it)
{
    struct cfx_object_id id;
    int rc = cfx_group_barrier(R->g, &R->cp);
    if (rc != CFX_OK)
        return rc;
    if (R->o->op == OP_BROADCAST) {
        make_id(R, size, it, "bcast", 0, &id);
        cfx_delete(R->ctx, &id, &R->op); /* the putter's ends it; a getter drops its copy */
    } else {
        make_id(R, size, it, "in", R->rank, &id);
        cfx_delete(R->ctx, &id, &R->op);
        make_id(R, size, it, "result", 0, &id);
        cfx_delete(R->ctx, &id, &R->op); /* whoever holds a copy of the result */
    }
    return cfx_group_barrier(R->g, &R->cp);
}

/* ---- reporting ------------------------------------------------------------ */

static double bound_s(const struct opts *o, size_t size, int n)
{
    if (o->link_gbit <= 0)
        return 0;
    double sb = (double)size * 8 / (o->link_gbit * 1e9);
    return o->op == OP_ALLREDUCE ? sb * 2 * (n - 1) / n : sb;
}

/* The time of one iteration from every rank's sample (see the header). */
static double iteration_time(const struct run *R, const struct sample *all, const bool *alive,
                             const uint64_t *used, int k)
{
    double last_start = 0, last_end = 0;
    for (int r = 0; r < R->n; r++) {
        if (!alive[r])
            continue;
        bool starts = R->o->op == OP_BROADCAST ? all[r].end >= 0 : false;
        for (int j = 0; R->o->op != OP_BROADCAST && j < k; j++)
            starts |= used[j] == (uint64_t)r;
        if (starts && all[r].start > last_start)
            last_start = all[r].start;
        if (all[r].end > last_end)
            last_end = all[r].end;
    }
    return last_end - last_start;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void print_head(const struct run *R)
{
    const struct opts *o = R->o;
    int k = o->k ? o->k : R->n;
    if (o->sw.json) {
        printf("{\"tool\":\"%s\",\"op\":\"%s\",\"nranks\":%d,\"root\":%d,\"k\":%d,"
               "\"spacing_ms\":%d,\"link_gbit\":%g,\"iters\":%ld,\"warmup\":%ld,\"check\":%d,"
               "\"replicas\":%d,\"kill\":",
               PROG, op_names[o->op], R->n, o->sw.root, o->op == OP_BROADCAST ? 0 : k,
               o->spacing_ms, o->link_gbit, o->sw.iters, o->sw.warmup, o->sw.check, o->replicas);
        if (o->kill_rank >= 0)
            printf("{\"rank\":%d,\"ms\":%d}", o->kill_rank, o->kill_ms);
        else
            printf("null");
        printf(",\"results\":[");
    } else {
        printf("# Conflux object %s test: nRanks %d root %d spacing %d ms iters %ld "
               "warmup %ld validation %d",
               op_names[o->op], R->n, o->sw.root, o->spacing_ms, o->sw.iters, o->sw.warmup,
               o->sw.check);
        if (o->op != OP_BROADCAST)
            printf(" first %d of %d (float32 sum)", k, R->n);
        if (o->kill_rank >= 0)
            printf(" kill rank %d at %d ms", o->kill_rank, o->kill_ms);
        printf("\n# %12s  %10s  %10s  %10s  %8s  %7s  %6s\n", "size", "time", "min", "max",
               "algbw", "xbound", "#wrong");
        printf("# %12s  %10s  %10s  %10s  %8s  %7s  %6s\n", "(B)", "(ms)", "(ms)", "(ms)",
               "(GB/s)", o->link_gbit > 0 ? "" : "(-B)", "");
    }
    fflush(stdout);
}

static void print_row(const struct run *R, size_t size, double *times, long nt, int64_t wrong,
                      int failed, long *rows)
{
    const struct opts *o = R->o;
    qsort(times, (size_t)nt, sizeof(double), cmp_double);
    double med = nt ? (nt & 1 ? times[nt / 2] : (times[nt / 2 - 1] + times[nt / 2]) / 2) : 0;
    double bound = bound_s(o, size, R->n);
    double algbw = med > 0 ? (double)size / med / 1e9 : 0;
    if (o->sw.json) {
        printf("%s{\"size\":%zu,\"time_ms\":%.3f,\"min_ms\":%.3f,\"max_ms\":%.3f,"
               "\"algbw\":%.6f,\"xbound\":",
               (*rows)++ ? "," : "", size, med * 1e3, nt ? times[0] * 1e3 : 0,
               nt ? times[nt - 1] * 1e3 : 0, algbw);
        if (bound > 0)
            printf("%.4f", med / bound);
        else
            printf("null");
        printf(",\"wrong\":%" PRId64 ",\"failed\":%d}", wrong, failed);
    } else {
        printf("%14zu  %10.3f  %10.3f  %10.3f  %8.3f  ", size, med * 1e3,
               nt ? times[0] * 1e3 : 0, nt ? times[nt - 1] * 1e3 : 0, algbw);
        if (bound > 0)
            printf("%7.3f", med / bound);
        else
            printf("%7s", "-");
        printf("  %6" PRId64 "%s\n", wrong, failed ? "  (calls failed: see stderr)" : "");
    }
    fflush(stdout);
}

/* Gather every rank's samples at every rank; false for ranks absent. */
static int gather(struct run *R, const struct sample *mine, struct sample *all)
{
    return cfx_group_allgather(R->g, mine, all, SAMPLE_DOUBLES, CFX_DTYPE_F64, &R->cp);
}

/* After --kill: the survivors' group (the victim's rank left out). */
static int survivors_group(struct run *R, struct cfx_context *ctx, struct cfx_group **out)
{
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE,
        .name = "cfx_obj_perf/survivors",
        .rank = R->rank < R->o->kill_rank ? R->rank : R->rank - 1,
        .size = R->n - 1,
    };
    return cfx_group_create(ctx, &gp, out);
}

/* A rank that fails after the group is made still leaves it and the
 * cluster in order: its group's records go, and the coordinator lists it
 * as left, not dead.  Exit status 1. */
static int leave(struct run *R)
{
    if (R->g)
        cfx_group_destroy(R->g);
    cfx_context_destroy(R->ctx);
    return 1;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct run R = { .o = &o };
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc;

    /* the coordinator may still be starting: the context retries it until
     * its deadline (CFX_TIMEOUT_MS) */
    rc = cfx_context_create(NULL, &R.ctx);
    if (rc != CFX_OK) {
        fprintf(stderr, "%s: cannot join the cluster: %s: %s\n", PROG, cfx_errname(rc),
                cfx_last_error());
        return 1;
    }
    if ((rc = cfx_group_create(R.ctx, NULL, &R.g)) != CFX_OK) {
        fprintf(stderr, "%s: cannot create the group: %s: %s\n", PROG, cfx_errname(rc),
                cfx_last_error());
        cfx_context_destroy(R.ctx);
        return 1;
    }
    R.rank = cfx_group_rank(R.g);
    R.n = cfx_group_size(R.g);
    int status = 0;
    const char *why = NULL;
    if (o.sw.root >= R.n)
        why = "-r: the root is not a rank of the group";
    else if (o.k > R.n)
        why = "-k: more inputs than ranks";
    else if (o.kill_rank >= R.n)
        why = "--kill: no such rank";
    else if (o.replicas && o.op != OP_BROADCAST)
        why = "--replicas: broadcast only";
    else if (o.replicas > R.n - 2)
        why = "--replicas: leaves no timed getter";
    else if (o.replicas && o.kill_rank >= 0)
        why = "--replicas and --kill: one at a time";
    else if (o.kill_rank >= 0 && R.n < 3)
        why = "--kill: needs at least 3 ranks (two survivors)";
    else if (o.kill_rank >= 0 && o.op != OP_BROADCAST && o.kill_rank == o.sw.root)
        why = "--kill: the root of a reduce is the one rank that calls it; choose another";
    else if (o.kill_rank >= 0 && o.op != OP_BROADCAST && o.k == 0)
        why = "--kill: a reduce that survives a victim needs -k below n";
    if (why) {
        if (R.rank == 0)
            fprintf(stderr, "%s: %s (n = %d)\n", PROG, why, R.n);
        cfx_group_destroy(R.g);
        cfx_context_destroy(R.ctx);
        return TOOL_EXIT_USAGE;
    }
    if (o.sw.timeout_ms) {
        R.op.field_mask = CFX_OBJ_PARAM_TIMEOUT;
        R.op.timeout_ms = o.sw.timeout_ms;
        R.cp.field_mask = CFX_COLL_PARAM_TIMEOUT;
        R.cp.timeout_ms = o.sw.timeout_ms;
    }
    /* Ids of this run: rank 0's random tag, so that a long-running
     * coordinator never confuses two runs. */
    if (R.rank == 0) {
        struct cfx_object_id g;
        cfx_object_id_generate(R.ctx, &g);
        memcpy(&R.tag, g.bytes + CFX_OBJECT_ID_LEN - sizeof(R.tag), sizeof(R.tag));
    }
    if ((rc = cfx_group_broadcast(R.g, &R.tag, 1, CFX_DTYPE_I64, 0, &R.cp)) != CFX_OK) {
        fprintf(stderr, "%s: rank %d: %s: %s\n", PROG, R.rank, cfx_errname(rc), cfx_last_error());
        return leave(&R);
    }
    rc = cfx_buf_alloc(R.ctx, o.sw.max_bytes, (void **)&R.buf);
    if (rc == CFX_OK && o.op != OP_BROADCAST)
        rc = cfx_buf_alloc(R.ctx, o.sw.max_bytes, (void **)&R.res);
    if (rc != CFX_OK) {
        fprintf(stderr, "%s: rank %d: cannot allocate %zu bytes: %s\n", PROG, R.rank,
                o.sw.max_bytes, cfx_last_error());
        return leave(&R);
    }
    memset(R.buf, 0, o.sw.max_bytes);
    if (R.res)
        memset(R.res, 0, o.sw.max_bytes);

    int k = o.k ? o.k : R.n;
    struct sample *all = calloc((size_t)R.n, sizeof(*all));
    bool *alive = calloc((size_t)R.n, sizeof(*alive));
    uint64_t *used = calloc((size_t)k, sizeof(*used));
    double *times = calloc((size_t)o.sw.iters, sizeof(*times));
    if (!all || !alive || !used || !times) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        goto err_leave;
    }
    for (int r = 0; r < R.n; r++)
        alive[r] = true;
    if (R.rank == 0)
        print_head(&R);

    int64_t wrong_total = 0;
    long rows = 0;
    for (size_t size = o.sw.min_bytes;; size *= (size_t)o.sw.factor) {
        size_t bytes = o.op == OP_BROADCAST ? size : size / 4 * 4;
        int64_t wrong = 0;
        int failed = 0;
        long nt = 0;
        bool fault = false;
        for (long it = 0; it < o.sw.warmup + o.sw.iters; it++) {
            struct sample mine;
            fault = o.kill_rank >= 0 && it == o.sw.warmup;
            rc = iteration(&R, bytes, it, fault, &mine, used);
            if (fault) {
                /* the group has lost a rank: go on with the survivors */
                cfx_group_destroy(R.g);
                R.g = NULL;
                alive[o.kill_rank] = false;
                int grc = survivors_group(&R, R.ctx, &R.g);
                if (grc != CFX_OK) {
                    fprintf(stderr, "%s: rank %d: survivors' group: %s: %s\n", PROG, R.rank,
                            cfx_errname(grc), cfx_last_error());
                    goto err_leave;
                }
                /* the root told nobody what it reduced: it says it now */
                if (o.op != OP_BROADCAST && o.sw.root != o.kill_rank) {
                    int root = o.sw.root < o.kill_rank ? o.sw.root : o.sw.root - 1;
                    grc = cfx_group_broadcast(R.g, used, (size_t)k, CFX_DTYPE_I64, root, &R.cp);
                    if (grc != CFX_OK)
                        rc = grc;
                }
                struct sample *sv = calloc((size_t)R.n - 1, sizeof(*sv));
                grc = sv ? cfx_group_allgather(R.g, &mine, sv, SAMPLE_DOUBLES, CFX_DTYPE_F64, &R.cp)
                         : CFX_ERR_NOMEM;
                if (grc != CFX_OK) {
                    fprintf(stderr, "%s: rank %d: survivors' report: %s: %s\n", PROG, R.rank,
                            cfx_errname(grc), cfx_last_error());
                    free(sv);
                    goto err_leave;
                }
                for (int r = 0, j = 0; r < R.n; r++)
                    all[r] = r == o.kill_rank ? (struct sample){ 0, -1, 0, 0 } : sv[j++];
                free(sv);
            } else if (rc == CFX_OK) {
                rc = gather(&R, &mine, all);
            }
            if (rc != CFX_OK) {
                fprintf(stderr, "%s: rank %d: iteration %ld of %zu B: %s: %s\n", PROG, R.rank, it,
                        bytes, cfx_errname(rc), cfx_last_error());
                goto err_leave;
            }
            for (int r = 0; r < R.n; r++) {
                if (!alive[r])
                    continue;
                wrong += (int64_t)all[r].wrong;
                failed += all[r].rc != CFX_OK;
            }
            if (it >= o.sw.warmup)
                times[nt++] = iteration_time(&R, all, alive, used, k);
            if (fault)
                break;
            if ((rc = cleanup(&R, bytes, it)) != CFX_OK) {
                fprintf(stderr, "%s: rank %d: after iteration %ld: %s: %s\n", PROG, R.rank, it,
                        cfx_errname(rc), cfx_last_error());
                goto err_leave;
            }
        }
        wrong_total += wrong;
        status |= failed != 0 || wrong != 0;
        if (R.rank == 0 || (fault && R.rank == 1 && o.kill_rank == 0))
            print_row(&R, bytes, times, nt, wrong, failed, &rows);
        if (fault || size > o.sw.max_bytes / (size_t)o.sw.factor)
            break;
    }
    bool printer = R.rank == 0 || (o.kill_rank == 0 && R.rank == 1);
    if (printer) {
        if (o.sw.json)
            printf("],\"wrong\":%" PRId64 ",\"status\":%d}\n", wrong_total, status);
        else
            printf("# Out of bounds values : %" PRId64 " %s\n", wrong_total,
                   wrong_total ? "FAILED" : status ? "(calls failed: see stderr)" : "OK");
        fflush(stdout);
    }
    /* leave together: a rank's copies may still be feeding another */
    cfx_group_barrier(R.g, &R.cp);
    cfx_buf_free(R.ctx, R.buf);
    if (R.res)
        cfx_buf_free(R.ctx, R.res);
    free(all);
    free(alive);
    free(used);
    free(times);
    cfx_group_destroy(R.g);
    cfx_context_destroy(R.ctx);
    return status;

err_leave:
    free(all);
    free(alive);
    free(used);
    free(times);
    return leave(&R);
}

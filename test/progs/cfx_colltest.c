/*
 * Rank program for the multi-process collective tests, started by cfx_run.
 * Inputs are deterministic per (rank, element) and chosen as small integers,
 * so every reduction is exact in every dtype whatever the order of
 * operations; every result is compared bit for bit with a reference
 * computed here.  The first mismatch or unexpected status exits non-zero.
 *
 *   matrix         every collective x dtype x op at small sizes (auto
 *                  algorithm), then every algorithm forced on a few
 *                  combinations, in place and out of place
 *   big BYTES      float sum allreduce, broadcast and reduce of BYTES
 *   mismatch       count (0 included) / dtype / op / root disagreements ->
 *                  CFX_ERR_INVALID
 *                  on every rank, and the group still works afterwards
 *   nb             non-blocking forms, several in flight, mixed with blocking
 *   late MS        the last rank enters broadcast / allreduce MS late
 *   misc           send/recv, barrier, re-creating a group of the same name
 *   gaps N         N small allreduces, each after the rank's progress thread
 *                  went to sleep: over dpdk the link went quiet in between
 *                  and the engine napped, as in a training loop's compute
 *   waiterpoll     ranks 0 and 1 ping-pong with rank 0's progress thread
 *                  parked: over a busy-polled transport (dpdk) its waits
 *                  must poll on by themselves once their spin runs out
 */
#include <conflux/conflux.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/engine/engine.h"
#include "dataplane/reduce/fp16.h"

#include "test/common/testutil.h"

#define DIE(...)                                                               \
    do {                                                                       \
        fprintf(stderr, "FAIL rank %d: ", rank);                               \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        exit(1);                                                               \
    } while (0)

static int rank, world;
static long checks;
static double coll_s; /* time in the last collective call */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- values ------------------------------------------------------------------------ */

enum kind { K_ALLREDUCE, K_BCAST, K_REDUCE, K_ALLGATHER, K_RS, K_GATHER, K_SCATTER, K_A2A,
            K_LAST };
static const char *const kind_names[K_LAST] = { "allreduce", "broadcast", "reduce",
                                                "allgather", "reduce_scatter", "gather",
                                                "scatter", "alltoall" };

/* Input element @p i of rank @p q (small integers: exact everywhere). */
static int64_t val(int q, size_t i, enum cfx_redop op, int reducing, enum cfx_dtype dt)
{
    uint64_t a = (uint64_t)q, b = (uint64_t)i;
    int u = dt == CFX_DTYPE_U8;
    if (!reducing)
        return (int64_t)((a * 31 + b) % 97) - (u ? 0 : 48);
    switch (op) {
    case CFX_OP_SUM: return (int64_t)((a * 7 + b * 3) % 11) - (u ? 0 : 5);
    case CFX_OP_PROD: {
        static const int64_t s[3] = { 1, -1, 2 }, us[3] = { 1, 3, 2 };
        return u ? us[(a + b) % 3] : s[(a + b) % 3];
    }
    default: return (int64_t)((a * 13 + b * 5) % 17) - (u ? 0 : 8);
    }
}

static int64_t combine(int64_t x, int64_t y, enum cfx_redop op, enum cfx_dtype dt)
{
    int64_t r;
    switch (op) {
    case CFX_OP_SUM: r = x + y; break;
    case CFX_OP_PROD: r = x * y; break;
    case CFX_OP_MIN: r = x < y ? x : y; break;
    default: r = x > y ? x : y; break;
    }
    if (dt == CFX_DTYPE_U8)
        r &= 0xff;
    return r;
}

static void store(void *buf, size_t i, enum cfx_dtype dt, int64_t v)
{
    switch (dt) {
    case CFX_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case CFX_DTYPE_F64: ((double *)buf)[i] = (double)v; break;
    case CFX_DTYPE_F16: ((uint16_t *)buf)[i] = cfx__f32_to_f16((float)v); break;
    case CFX_DTYPE_BF16: ((uint16_t *)buf)[i] = cfx__f32_to_bf16((float)v); break;
    case CFX_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CFX_DTYPE_I64: ((int64_t *)buf)[i] = v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

static void fill(void *buf, size_t n, int q, enum cfx_redop op, int reducing, enum cfx_dtype dt,
                 size_t first)
{
    for (size_t i = 0; i < n; i++)
        store(buf, i, dt, val(q, first + i, op, reducing, dt));
}

static int64_t reduced(size_t i, enum cfx_redop op, enum cfx_dtype dt)
{
    int64_t acc = val(0, i, op, 1, dt);
    for (int q = 1; q < world; q++)
        acc = combine(acc, val(q, i, op, 1, dt), op, dt);
    return acc;
}

/* Every input pattern in val() repeats with the element index modulo one of
 * 11, 3, 17, 97: their product is a period of all of them. */
#define REF_PERIOD ((size_t)11 * 3 * 17 * 97)

/* Compare @p n elements with what store() makes of @p ref(i); @p periodic
 * when ref(i) repeats every REF_PERIOD elements. */
static void expect(const void *got, size_t n, enum cfx_dtype dt, const char *what,
                   int64_t (*ref)(size_t i, void *arg), void *arg, int periodic)
{
    size_t esz = cfx_dtype_size(dt);
    uint8_t want[8];
    if (periodic && n > 2 * REF_PERIOD) {
        /* the reference repeats every REF_PERIOD elements: compare whole
         * periods against one table (64 MiB checks in a blink) */
        uint8_t *tab = malloc(REF_PERIOD * esz);
        if (!tab)
            DIE("out of memory");
        for (size_t i = 0; i < REF_PERIOD; i++)
            store(tab, i, dt, ref(i, arg));
        for (size_t c = 0; c < n; c += REF_PERIOD) {
            size_t len = (n - c < REF_PERIOD ? n - c : REF_PERIOD) * esz;
            if (memcmp(tab, (const uint8_t *)got + c * esz, len))
                DIE("%s: elements %zu.. of %zu are wrong", what, c, n);
        }
        free(tab);
        checks++;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t v = ref(i, arg);
        store(want, 0, dt, v);
        if (memcmp(want, (const uint8_t *)got + i * esz, esz))
            DIE("%s: element %zu of %zu is wrong (want %" PRId64 ")", what, i, n, v);
    }
    checks++;
}

struct refarg {
    enum cfx_redop op;
    enum cfx_dtype dt;
    size_t count;
    size_t base;   /* element offset */
    int q;         /* rank whose input it is */
};

static int64_t ref_reduced(size_t i, void *p)
{
    struct refarg *a = p;
    return reduced(a->base + i, a->op, a->dt);
}

static int64_t ref_input(size_t i, void *p)
{
    struct refarg *a = p;
    return val(a->q, a->base + i, a->op, 0, a->dt);
}

/* block layout of gathered data: block q holds rank q's input (count elements) */
static int64_t ref_blocks(size_t i, void *p)
{
    struct refarg *a = p;
    return val((int)(i / a->count), a->base + i % a->count, a->op, 0, a->dt);
}

/* ---- one collective, checked ---------------------------------------------------------- */

static struct cfx_group *grp;

static void run_one(enum kind k, enum cfx_dtype dt, enum cfx_redop op, size_t count,
                    int inplace, enum cfx_algo algo, int root)
{
    const size_t esz = cfx_dtype_size(dt), n = (size_t)world;
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_ALGO, .algo = algo };
    char what[160];
    snprintf(what, sizeof(what), "%s %s %s count %zu %s algo %s root %d", kind_names[k],
             cfx_dtype_name(dt), cfx_redop_name(op), count, inplace ? "in-place" : "out-of-place",
             cfx_algo_name(algo), root);
    size_t sbytes = count * esz * ((k == K_RS || k == K_A2A || k == K_SCATTER) ? n : 1);
    size_t rbytes = count * esz * ((k == K_ALLGATHER || k == K_GATHER || k == K_A2A) ? n : 1);
    uint8_t *s = malloc(sbytes + 1), *r = malloc(rbytes + 1);
    if (!s || !r)
        DIE("out of memory");
    memset(r, 0xa5, rbytes + 1);
    struct refarg ra = { .op = op, .dt = dt, .count = count };
    int rc;

    switch (k) {
    case K_ALLREDUCE:
        fill(s, count, rank, op, 1, dt, 0);
        if (inplace)
            memcpy(r, s, count * esz);
        coll_s = now_s();
        rc = cfx_group_allreduce(grp, inplace ? r : s, r, count, dt, op, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        expect(r, count, dt, what, ref_reduced, &ra, 1);
        break;
    case K_BCAST:
        if (rank == root)
            fill(r, count, root, op, 0, dt, 0);
        coll_s = now_s();
        rc = cfx_group_broadcast(grp, r, count, dt, root, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        ra.q = root;
        expect(r, count, dt, what, ref_input, &ra, 1);
        break;
    case K_REDUCE:
        fill(s, count, rank, op, 1, dt, 0);
        if (inplace)
            memcpy(r, s, count * esz);
        coll_s = now_s();
        rc = cfx_group_reduce(grp, inplace ? r : s, r, count, dt, op, root, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        if (rank == root)
            expect(r, count, dt, what, ref_reduced, &ra, 1);
        break;
    case K_ALLGATHER: {
        uint8_t *mine = inplace ? r + (size_t)rank * count * esz : s;
        fill(mine, count, rank, op, 0, dt, 0);
        coll_s = now_s();
        rc = cfx_group_allgather(grp, mine, r, count, dt, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        expect(r, count * n, dt, what, ref_blocks, &ra, 0);
        break;
    }
    case K_RS: {
        fill(s, count * n, rank, op, 1, dt, 0);
        uint8_t *out = inplace ? s + (size_t)rank * count * esz : r;
        coll_s = now_s();
        rc = cfx_group_reduce_scatter(grp, s, out, count, dt, op, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        ra.base = (size_t)rank * count;
        expect(out, count, dt, what, ref_reduced, &ra, 1);
        break;
    }
    case K_GATHER: {
        uint8_t *mine = inplace && rank == root ? r + (size_t)rank * count * esz : s;
        fill(mine, count, rank, op, 0, dt, 0);
        coll_s = now_s();
        rc = cfx_group_gather(grp, mine, r, count, dt, root, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        if (rank == root)
            expect(r, count * n, dt, what, ref_blocks, &ra, 0);
        break;
    }
    case K_SCATTER: {
        /* root's block q = rank q's "input" */
        if (rank == root)
            for (int q = 0; q < world; q++)
                fill(s + (size_t)q * count * esz, count, q, op, 0, dt, 0);
        uint8_t *out = inplace && rank == root ? s + (size_t)rank * count * esz : r;
        coll_s = now_s();
        rc = cfx_group_scatter(grp, s, out, count, dt, root, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        ra.q = rank;
        expect(out, count, dt, what, ref_input, &ra, 1);
        break;
    }
    case K_A2A: {
        /* block q of rank r's input: elements starting at (r * n + q) * count of the
         * pattern; so block q of the output at rank r is block r of rank q */
        uint8_t *in = inplace ? r : s;
        for (int q = 0; q < world; q++)
            fill(in + (size_t)q * count * esz, count, rank, op, 0, dt,
                 ((size_t)rank * n + (size_t)q) * count);
        coll_s = now_s();
        rc = cfx_group_alltoall(grp, in, r, count, dt, &p);
        coll_s = now_s() - coll_s;
        if (rc != CFX_OK)
            DIE("%s: %s (%s)", what, cfx_errname(rc), cfx_last_error());
        for (int q = 0; q < world; q++) {
            ra.q = q;
            ra.base = ((size_t)q * n + (size_t)rank) * count;
            expect(r + (size_t)q * count * esz, count, dt, what, ref_input, &ra, 1);
        }
        break;
    }
    default: break;
    }
    if (r[rbytes] != 0xa5)
        DIE("%s: wrote past the end of the receive buffer", what);
    free(s);
    free(r);
}

static int is_reduction(enum kind k)
{
    return k == K_ALLREDUCE || k == K_REDUCE || k == K_RS;
}

static void mode_matrix(void)
{
    /* sizes: 0, 1, odd, and more than one segment (the test sets a small
     * CFX_COLL_SEG) */
    const size_t sizes[] = { 0, 1, 1023, 5000 };
    double t = now_s();
    for (int k = 0; k < K_LAST; k++)
        for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
            for (int op = 0; op < (is_reduction(k) ? CFX_OP_LAST : 1); op++)
                for (size_t si = 0; si < 3; si++)
                    run_one(k, dt, op, sizes[si], (int)(si % 2), CFX_ALGO_AUTO,
                            (int)(si + (size_t)dt) % world);
    printf("matrix (auto): %ld checks in %.2f s\n", checks, now_s() - t);

    /* bytes around where a message changes form (coll.c post_data): the
     * header in front up to 4048 B of payload, one eager send up to 4072 B,
     * eager pieces up to 16 KiB, then rendezvous */
    static const size_t edges[] = { 4047, 4048, 4049, 4071, 4072, 4073, 8144, 8145,
                                    16383, 16384, 16385 };
    static const enum kind edge_kinds[] = { K_BCAST, K_ALLREDUCE, K_REDUCE, K_ALLGATHER, K_A2A };
    for (size_t e = 0; e < sizeof(edges) / sizeof(edges[0]); e++)
        for (size_t k = 0; k < sizeof(edge_kinds) / sizeof(edge_kinds[0]); k++)
            run_one(edge_kinds[k], CFX_DTYPE_U8, is_reduction(edge_kinds[k]) ? CFX_OP_MAX : 0,
                    edges[e], (int)(e % 2), CFX_ALGO_AUTO, (int)e % world);

    static const struct {
        enum kind k;
        enum cfx_algo algo;
    } forced[] = {
        { K_ALLREDUCE, CFX_ALGO_RING },   { K_ALLREDUCE, CFX_ALGO_RHD },
        { K_ALLREDUCE, CFX_ALGO_DBTREE }, { K_ALLREDUCE, CFX_ALGO_TREE },
        { K_ALLREDUCE, CFX_ALGO_CHAIN },  { K_BCAST, CFX_ALGO_TREE },
        { K_BCAST, CFX_ALGO_CHAIN },      { K_REDUCE, CFX_ALGO_TREE },
        { K_REDUCE, CFX_ALGO_CHAIN },     { K_ALLGATHER, CFX_ALGO_RING },
        { K_ALLGATHER, CFX_ALGO_DIRECT }, { K_RS, CFX_ALGO_RING },
        { K_RS, CFX_ALGO_DIRECT },        { K_GATHER, CFX_ALGO_DIRECT },
        { K_SCATTER, CFX_ALGO_DIRECT },   { K_A2A, CFX_ALGO_DIRECT },
        { K_ALLREDUCE, CFX_ALGO_RECDBL }, { K_BCAST, CFX_ALGO_RHD }, /* does not apply */
        { K_REDUCE, CFX_ALGO_RECDBL },    /* does not apply: falls back */
    };
    t = now_s();
    long before = checks;
    for (size_t f = 0; f < sizeof(forced) / sizeof(forced[0]); f++)
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
            for (int inplace = 0; inplace < 2; inplace++) {
                run_one(forced[f].k, CFX_DTYPE_F32, CFX_OP_SUM, sizes[si], inplace,
                        forced[f].algo, (int)(si + f) % world);
                run_one(forced[f].k, CFX_DTYPE_I32, CFX_OP_MAX, sizes[si] + 3, inplace,
                        forced[f].algo, (int)(si + f + 1) % world);
            }
    printf("matrix (forced algorithms): %ld checks in %.2f s\n", checks - before,
           now_s() - t);

    /* the small-message schedules the table picks below its thresholds,
     * forced, for every dtype and op, in and out of place, at sizes around
     * the thresholds (a few elements, 1 KiB, 4 KiB and just over) */
    static const struct {
        enum kind k;
        enum cfx_algo algo;
    } small[] = {
        { K_ALLREDUCE, CFX_ALGO_RECDBL }, { K_ALLREDUCE, CFX_ALGO_AUTO },
        { K_BCAST, CFX_ALGO_TREE },       { K_REDUCE, CFX_ALGO_TREE },
    };
    const size_t small_bytes[] = { 8, 1024, 4096, 4100 };
    t = now_s();
    before = checks;
    for (size_t f = 0; f < sizeof(small) / sizeof(small[0]); f++)
        for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
            for (int op = 0; op < (is_reduction(small[f].k) ? CFX_OP_LAST : 1); op++)
                for (size_t si = 0; si < sizeof(small_bytes) / sizeof(small_bytes[0]); si++) {
                    size_t esz = cfx_dtype_size((enum cfx_dtype)dt);
                    size_t count = (small_bytes[si] + esz - 1) / esz;
                    run_one(small[f].k, (enum cfx_dtype)dt, (enum cfx_redop)op, count,
                            (int)((si + (size_t)op) % 2), small[f].algo,
                            (int)(si + (size_t)dt) % world);
                }
    printf("matrix (small-message schedules): %ld checks in %.2f s\n", checks - before,
           now_s() - t);
}

static void mode_big(size_t bytes)
{
    const size_t count = bytes / sizeof(float);
    static const enum kind ks[] = { K_ALLREDUCE, K_BCAST, K_REDUCE };
    for (size_t i = 0; i < 3; i++) {
        CHECK_OK(cfx_group_barrier(grp, NULL)); /* time the collective, not the checks */
        double t = now_s();
        run_one(ks[i], CFX_DTYPE_F32, CFX_OP_SUM, count, 0, CFX_ALGO_AUTO, world - 1);
        t = now_s() - t;
        printf("%s float sum %zu B: ok in %.2f s (collective %.2f s, %.1f MB/s algbw)\n",
               kind_names[ks[i]], bytes, t, coll_s, (double)bytes / coll_s / 1e6);
    }
}

static void want_invalid(int rc, const char *what);

/* CFX_COLL_CHECK=2 compares every rank's arguments with every other's. */
static bool check_all(void)
{
    const char *c = getenv("CFX_COLL_CHECK");
    return c && atoi(c) >= 2;
}

/*
 * After a call whose ranks disagree: CFX_ERR_INVALID on every rank with
 * CFX_COLL_CHECK=2.  By default (the check along the messages) on every
 * rank whose part depends on a rank of the other opinion (@p all_fail: the
 * call's result depends on every rank), and a rank whose messages all came
 * from ranks of its own opinion may return CFX_OK; at least one fails.  The
 * ranks then count the failures with a call they agree on, which shows the
 * group still works.
 */
static bool none_waits; /* no rank receives in the call: nobody can see it */

static void want_disagreement(int rc, const char *what, bool all_fail)
{
    if (rc != CFX_OK || all_fail || check_all())
        want_invalid(rc, what);
    else
        printf("%s -> CFX_OK (its part needed no rank of the other opinion)\n", what);
    int32_t failed = rc != CFX_OK, sum = 0;
    int r = cfx_group_allreduce(grp, &failed, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    if (r != CFX_OK)
        DIE("%s: the allreduce after it: %s (%s)", what, cfx_errname(r), cfx_last_error());
    if (sum < 1 && (all_fail || check_all() || !none_waits))
        DIE("%s: no rank failed", what);
    checks++;
}

static void want_invalid(int rc, const char *what)
{
    if (rc != CFX_ERR_INVALID)
        DIE("%s: %s (%s), expected CFX_ERR_INVALID", what, cfx_errname(rc), cfx_last_error());
    if (!strstr(cfx_last_error(), "disagree"))
        DIE("%s: error text '%s' does not say the ranks disagree", what, cfx_last_error());
    printf("%s -> CFX_ERR_INVALID: %s\n", what, cfx_last_error());
    checks++;
}

/* A rejected in-place call has written nothing: each rank's buffer is byte
 * for byte what it passed in, for every kind with an in-place form and for
 * counts large enough that data moves in many segments (1M elements, the
 * case that had rewritten up to a third of the buffer before it failed). */
static void mismatch_in_place(void)
{
    enum { BIG = 1 << 20 };
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 20000 };
    int odd = rank == world - 1;
    size_t n = (size_t)BIG * (size_t)world;
    float *buf = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    if (!buf || !ref)
        DIE("out of memory");
    for (size_t i = 0; i < n; i++)
        ref[i] = (float)(rank * 7 + 1) + (float)(i % 1000) * 0.25f;
    static const char *const what[] = { "allreduce", "reduce", "allgather", "reduce_scatter",
                                        "alltoall" };
    for (int k = 0; k < 5; k++) {
        for (int algo = 0; algo < 2; algo++) {
            struct cfx_coll_params q = p;
            if (algo) {
                if (k != 0)
                    continue; /* the other kinds have one schedule each at this size */
                q.field_mask |= CFX_COLL_PARAM_ALGO;
                q.algo = CFX_ALGO_TREE;
            }
            memcpy(buf, ref, n * sizeof(float));
            /* the last rank disagrees on the count */
            size_t c = k < 2 ? BIG : BIG / (size_t)world;
            c -= odd ? 1 : 0;
            int rc;
            switch (k) {
            case 0: rc = cfx_group_allreduce(grp, buf, buf, c, CFX_DTYPE_F32, CFX_OP_SUM, &q); break;
            case 1: rc = cfx_group_reduce(grp, buf, buf, c, CFX_DTYPE_F32, CFX_OP_SUM, 0, &q); break;
            case 2:
                rc = cfx_group_allgather(grp, buf + (size_t)rank * c, buf, c, CFX_DTYPE_F32, &q);
                break;
            case 3:
                rc = cfx_group_reduce_scatter(grp, buf, buf + (size_t)rank * c, c, CFX_DTYPE_F32,
                                              CFX_OP_SUM, &q);
                break;
            default: rc = cfx_group_alltoall(grp, buf, buf, c, CFX_DTYPE_F32, &q); break;
            }
            char label[96];
            snprintf(label, sizeof(label), "in-place %s%s, count mismatch", what[k],
                     algo ? " (tree)" : "");
            want_disagreement(rc, label, k != 1); /* a reduce's leaves only send */
            if (!check_all())
                continue; /* the check along the messages may have written it */
            for (size_t i = 0; i < n; i++)
                if (memcmp(&buf[i], &ref[i], sizeof(float)) != 0)
                    DIE("%s: element %zu of the caller's buffer changed (%g, was %g)", label, i,
                        (double)buf[i], (double)ref[i]);
            checks++;
        }
    }
    /* small in-place calls: recursive doubling works in scratch and the
     * reduce root checks the headers before its first write; a disagreement
     * the message sizes do not show (dtype, op) lets all the data move */
    for (int c = 0; c < 6; c++) {
        const size_t cnt = 16;
        struct cfx_coll_params q = p;
        if (c % 2) {
            q.field_mask |= CFX_COLL_PARAM_ALGO;
            q.algo = c < 4 ? CFX_ALGO_RECDBL : CFX_ALGO_CHAIN;
        }
        memcpy(buf, ref, cnt * sizeof(float));
        int rc;
        const char *label;
        switch (c / 2) {
        case 0:
            rc = cfx_group_allreduce(grp, buf, buf, cnt, odd ? CFX_DTYPE_I32 : CFX_DTYPE_F32,
                                     CFX_OP_SUM, &q);
            label = c % 2 ? "small in-place allreduce (recdbl), dtype mismatch"
                          : "small in-place allreduce, dtype mismatch";
            break;
        case 1:
            rc = cfx_group_allreduce(grp, buf, buf, cnt - (odd ? 1 : 0), CFX_DTYPE_F32,
                                     CFX_OP_SUM, &q);
            label = c % 2 ? "small in-place allreduce (recdbl), count mismatch"
                          : "small in-place allreduce, count mismatch";
            break;
        default:
            rc = cfx_group_reduce(grp, buf, buf, cnt, CFX_DTYPE_F32, odd ? CFX_OP_MAX : CFX_OP_SUM,
                                  0, &q);
            label = c % 2 ? "small in-place reduce (chain), op mismatch"
                          : "small in-place reduce, op mismatch";
            break;
        }
        want_disagreement(rc, label, c / 2 != 2);
        if (check_all() && memcmp(buf, ref, cnt * sizeof(float)) != 0)
            DIE("%s: the caller's buffer changed", label);
        checks++;
    }
    free(buf);
    free(ref);
}

static void mode_mismatch(void)
{
    if (world < 2)
        return;
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 10000 };
    int odd = rank == world - 1;
    float f[64] = { 0 };
    int rc;
    /* count (byte sizes differ) */
    rc = cfx_group_allreduce(grp, f, f, odd ? 33 : 32, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    want_disagreement(rc, "allreduce, count mismatch", true);
    /* dtype with equal byte size */
    rc = cfx_group_allreduce(grp, f, f, 16, odd ? CFX_DTYPE_I32 : CFX_DTYPE_F32, CFX_OP_SUM, &p);
    want_disagreement(rc, "allreduce, dtype mismatch", true);
    rc = cfx_group_reduce(grp, f, f, 16, CFX_DTYPE_F32, odd ? CFX_OP_MAX : CFX_OP_SUM, 0, &p);
    want_disagreement(rc, "reduce, op mismatch", false);
    rc = cfx_group_broadcast(grp, f, 16, CFX_DTYPE_F32, odd ? 1 : 0, &p);
    none_waits = world == 2; /* both ranks think themselves the root */
    want_disagreement(rc, "broadcast, root mismatch", false);
    none_waits = false;
    /* a larger broadcast (its header a message of its own before the data) */
    static float big[8192];
    rc = cfx_group_broadcast(grp, big, 8192, odd ? CFX_DTYPE_I32 : CFX_DTYPE_F32, 0, &p);
    want_disagreement(rc, "32 KiB broadcast, dtype mismatch", false);
    /* every rank's result depends on the rank of the other opinion, whose
     * data is used only after its header is checked: all fail */
    rc = cfx_group_allreduce(grp, big, big, 8192, odd ? CFX_DTYPE_I32 : CFX_DTYPE_F32,
                             CFX_OP_SUM, &p);
    want_disagreement(rc, "32 KiB allreduce, dtype mismatch", true);
    /* one rank has nothing to add: still a disagreement, not a hang */
    rc = cfx_group_allreduce(grp, f, f, odd ? 0 : 8, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    want_disagreement(rc, "allreduce, count 0 on one rank", true);
    /* one rank calls another collective */
    rc = odd ? cfx_group_barrier(grp, &p)
             : cfx_group_allreduce(grp, f, f, 4, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    want_disagreement(rc, "barrier vs allreduce", true);
    mismatch_in_place();
    /* the group still works */
    run_one(K_ALLREDUCE, CFX_DTYPE_F32, CFX_OP_SUM, 1000, 0, CFX_ALGO_AUTO, 0);
    run_one(K_ALLREDUCE, CFX_DTYPE_F32, CFX_OP_SUM, 100000, 0, CFX_ALGO_RING, 0);
}

static void mode_nb(void)
{
    enum { N = 6, COUNT = 70000 };
    float *buf[N];
    float *gath = malloc(sizeof(float) * COUNT * (size_t)world);
    struct cfx_request *req[N + 1];
    for (int i = 0; i < N; i++) {
        buf[i] = malloc(sizeof(float) * COUNT);
        fill(buf[i], COUNT, rank, CFX_OP_SUM, i % 2 == 0, CFX_DTYPE_F32, 0);
    }
    /* allreduce, broadcast, reduce, allgather queued; then a blocking barrier
     * and allreduce that must run after them */
    CHECK_OK(cfx_group_iallreduce(grp, buf[0], buf[0], COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL,
                                  &req[0]));
    if (rank != 0)
        memset(buf[1], 0, sizeof(float) * COUNT);
    CHECK_OK(cfx_group_ibroadcast(grp, buf[1], COUNT, CFX_DTYPE_F32, 0, NULL, &req[1]));
    CHECK_OK(cfx_group_ireduce(grp, buf[2], buf[3], COUNT, CFX_DTYPE_F32, CFX_OP_SUM,
                               world - 1, NULL, &req[2]));
    CHECK_OK(cfx_group_iallgather(grp, buf[5], gath, COUNT, CFX_DTYPE_F32, NULL, &req[3]));
    CHECK_OK(cfx_group_barrier(grp, NULL));
    float one = 1.0f, sum = 0;
    CHECK_OK(cfx_group_allreduce(grp, &one, &sum, 1, CFX_DTYPE_F32, CFX_OP_SUM, NULL));
    if (sum != (float)world)
        DIE("blocking allreduce after non-blocking ones: %f", (double)sum);
    for (int i = 0; i < 4; i++) {
        int rc = cfx_request_wait(req[i], 30000);
        if (rc != CFX_OK)
            DIE("request %d: %s", i, cfx_errname(rc));
        cfx_request_free(req[i]);
    }
    struct refarg ra = { .op = CFX_OP_SUM, .dt = CFX_DTYPE_F32, .count = COUNT };
    expect(buf[0], COUNT, CFX_DTYPE_F32, "iallreduce", ref_reduced, &ra, 1);
    ra.q = 0;
    float *want1 = malloc(sizeof(float) * COUNT);
    fill(want1, COUNT, 0, CFX_OP_SUM, 0, CFX_DTYPE_F32, 0);
    if (memcmp(want1, buf[1], sizeof(float) * COUNT))
        DIE("ibroadcast result wrong");
    if (rank == world - 1)
        expect(buf[3], COUNT, CFX_DTYPE_F32, "ireduce", ref_reduced, &ra, 1);
    for (int q = 0; q < world; q++) {
        fill(want1, COUNT, q, CFX_OP_SUM, 0, CFX_DTYPE_F32, 0);
        if (memcmp(want1, gath + (size_t)q * COUNT, sizeof(float) * COUNT))
            DIE("iallgather block %d wrong", q);
    }
    /* a request freed before it completes is canceled (on some ranks it may
     * have completed first): the group goes on with the next call */
    CHECK_OK(cfx_group_iallreduce(grp, buf[4], buf[4], COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL,
                                  &req[4]));
    int rc = cfx_request_test(req[4]);
    /* running, done, or failed by another rank's cancel that came first */
    if (rc != CFX_ERR_AGAIN && rc != CFX_OK && rc != CFX_ERR_PEER_FAILED)
        DIE("request_test: %s (%s)", cfx_errname(rc), cfx_last_error());
    cfx_request_free(req[4]);
    CHECK_OK(cfx_group_barrier(grp, NULL));
    printf("nb ok\n");
    checks += 5;
    free(want1);
    free(gath);
    for (int i = 0; i < N; i++)
        free(buf[i]);
}

static void mode_late(int ms)
{
    const size_t count = 300000;
    for (int round = 0; round < 2; round++) {
        if (rank == world - 1)
            usleep((useconds_t)ms * 1000);
        double t = now_s();
        if (round == 0)
            run_one(K_BCAST, CFX_DTYPE_F32, CFX_OP_SUM, count, 0, CFX_ALGO_AUTO, 0);
        else
            run_one(K_ALLREDUCE, CFX_DTYPE_F32, CFX_OP_SUM, count, 0, CFX_ALGO_AUTO, 0);
        printf("%s with rank %d %d ms late: ok after %.2f s\n", round ? "allreduce" : "broadcast",
               world - 1, ms, now_s() - t);
    }
}

/* Until this rank's progress thread sleeps in epoll (the dpdk link went
 * quiet), at most 10 s.  Going to sleep signals nothing: the flag is read
 * every millisecond. */
static void wait_progress_asleep(struct cfx_context *ctx)
{
    uint64_t dl = cfx__deadline_ns(10000);
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        bool asleep = ctx->sleeping && !ctx->waiter_napping;
        pthread_mutex_unlock(&ctx->lock);
        if (asleep)
            return;
        if (cfx__now_ns() >= dl)
            DIE("gaps: the progress thread never went to sleep");
        usleep(1000);
    }
}

static void mode_gaps(struct cfx_context *ctx, int n)
{
    for (int i = 0; i < n; i++) {
        wait_progress_asleep(ctx); /* the compute between two steps */
        run_one(K_ALLREDUCE, CFX_DTYPE_F32, CFX_OP_SUM, 1024, 0, CFX_ALGO_AUTO, 0);
    }
    printf("gaps: %d allreduces, each after the progress thread slept, ok\n", n);
}

static void mode_misc(struct cfx_context *ctx)
{
    /* send / recv around a ring */
    if (world > 1) {
        int out = rank * 10, in = -1;
        int to = (rank + 1) % world, from = (rank + world - 1) % world;
        if (rank % 2 == 0) {
            CHECK_OK(cfx_group_send(grp, &out, sizeof(out), to, 5, NULL));
            CHECK_OK(cfx_group_recv(grp, &in, sizeof(in), from, 5, NULL));
        } else {
            CHECK_OK(cfx_group_recv(grp, &in, sizeof(in), from, 5, NULL));
            CHECK_OK(cfx_group_send(grp, &out, sizeof(out), to, 5, NULL));
        }
        if (in != from * 10)
            DIE("recv got %d, want %d", in, from * 10);
    }
    for (int i = 0; i < 5; i++)
        CHECK_OK(cfx_group_barrier(grp, NULL));
    /* re-create the group under the same name, and a second group beside it */
    for (int i = 0; i < 3; i++) {
        cfx_group_destroy(grp);
        struct cfx_group_params gp = { .field_mask = CFX_GROUP_PARAM_NAME, .name = "world" };
        CHECK_OK(cfx_group_create(ctx, &gp, &grp));
        run_one(K_ALLREDUCE, CFX_DTYPE_I64, CFX_OP_SUM, 777, 0, CFX_ALGO_AUTO, 0);
    }
    struct cfx_group *g2, *save = grp;
    struct cfx_group_params gp = { .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK,
                                   .name = "reversed", .rank = world - 1 - rank };
    CHECK_OK(cfx_group_create(ctx, &gp, &g2));
    if (cfx_group_rank(g2) != world - 1 - rank || cfx_group_size(g2) != world)
        DIE("group 2: rank %d size %d", cfx_group_rank(g2), cfx_group_size(g2));
    int64_t v = rank, s = 0;
    CHECK_OK(cfx_group_allreduce(g2, &v, &s, 1, CFX_DTYPE_I64, CFX_OP_SUM, NULL));
    if (s != (int64_t)world * (world - 1) / 2)
        DIE("group 2 allreduce: %" PRId64, s);
    grp = save;
    run_one(K_BCAST, CFX_DTYPE_U8, CFX_OP_SUM, 100, 0, CFX_ALGO_AUTO, world - 1);
    cfx_group_destroy(g2);
    printf("misc ok\n");
    checks += 3;
}

/*
 * A waiter whose spin ran out, over a busy-polled transport (a user-space
 * NIC queue, which no fd announces), polls on by itself instead of handing
 * back to the progress thread (cfx__progress_poll_wait).  Rank 0 parks its
 * progress thread and spins for 1 us only, so each pong (a round trip
 * away) comes after its spin: with the hand-back, nobody would poll for it
 * and the wait would end at its deadline (20 s here).  Then two threads per
 * rank ping-pong at once with the progress thread running: one waiter
 * polls on at a time, the other sleeps until the first one's passes
 * complete its message.  Every byte checked; rank 0's count of spells
 * polled on must have grown.
 */
#define WP_N   200
#define WP_LEN 100

struct wp_arg {
    int tag, rc;
};

static int wp_pingpong(int tag, const struct cfx_coll_params *cp)
{
    uint8_t out[WP_LEN], in[WP_LEN];
    int peer = 1 - rank, rc = CFX_OK;
    for (int i = 0; i < WP_N && rc == CFX_OK; i++) {
        uint64_t ping = (uint64_t)tag << 32 | (uint64_t)i, pong = ping + 1000000;
        if (rank == 0) {
            cfx_test_fill(out, WP_LEN, ping);
            rc = cfx_group_send(grp, out, WP_LEN, peer, tag, cp);
            if (rc == CFX_OK)
                rc = cfx_group_recv(grp, in, WP_LEN, peer, tag + 1, cp);
            if (rc == CFX_OK && cfx_test_check(in, WP_LEN, pong) != (size_t)-1)
                DIE("waiterpoll: tag %d pong %d differs", tag, i);
        } else {
            rc = cfx_group_recv(grp, in, WP_LEN, peer, tag, cp);
            if (rc == CFX_OK && cfx_test_check(in, WP_LEN, ping) != (size_t)-1)
                DIE("waiterpoll: tag %d ping %d differs", tag, i);
            cfx_test_fill(out, WP_LEN, pong);
            if (rc == CFX_OK)
                rc = cfx_group_send(grp, out, WP_LEN, peer, tag + 1, cp);
        }
    }
    if (rc != CFX_OK)
        fprintf(stderr, "rank %d: waiterpoll tag %d: %s: %s\n", rank, tag, cfx_errname(rc),
                cfx_last_error());
    return rc;
}

static void *wp_thread(void *p)
{
    struct wp_arg *a = p;
    struct cfx_coll_params cp = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 20000 };
    a->rc = wp_pingpong(a->tag, &cp);
    return NULL;
}

static void mode_waiterpoll(struct cfx_context *ctx)
{
    struct cfx_coll_params cp = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 20000 };
    uint32_t spin = ctx->cfg.spin_us, nap = ctx->cfg.waiter_nap_ms;
    uint64_t polls = 0;

    if (rank > 1)
        return;
    ctx->cfg.spin_us = 1;
    if (rank == 0) {
        ctx->cfg.waiter_nap_ms = 60000;
        CHECK_OK(cfx__progress_pause(ctx, true));
    }
    CHECK_OK(wp_pingpong(7, &cp));
    if (rank == 0) {
        CHECK_OK(cfx__progress_pause(ctx, false));
        ctx->cfg.waiter_nap_ms = nap;
    }
    struct wp_arg a[2] = { { .tag = 20 }, { .tag = 30 } };
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        if (pthread_create(&th[t], NULL, wp_thread, &a[t]) != 0)
            DIE("waiterpoll: pthread_create");
    for (int t = 0; t < 2; t++) {
        pthread_join(th[t], NULL);
        CHECK_OK(a[t].rc);
    }
    ctx->cfg.spin_us = spin;
    if (rank == 0) {
        pthread_mutex_lock(&ctx->lock);
        polls = ctx->n_waiter_polls;
        pthread_mutex_unlock(&ctx->lock);
        if (!polls)
            DIE("waiterpoll: no wait polled on by itself (n_waiter_polls 0)");
        printf("waiterpoll ok: %d round trips alone, %d by two threads at once; "
               "%" PRIu64 " spells polled on\n",
               WP_N, 2 * WP_N, polls);
    }
    checks += 3 * WP_N;
}

int main(int argc, char **argv)
{
    struct cfx_context *ctx;
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s matrix | big BYTES | mismatch | nb | late MS | gaps N | misc | "
                "waiterpoll\n",
                argv[0]);
        return 2;
    }
    rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    CHECK_OK(cfx_context_create(NULL, &ctx));
    CHECK_OK(cfx_group_create(ctx, NULL, &grp));
    if (cfx_group_rank(grp) != rank || cfx_group_size(grp) != world)
        DIE("group says rank %d of %d", cfx_group_rank(grp), cfx_group_size(grp));

    double t = now_s();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "matrix"))
            mode_matrix();
        else if (!strcmp(argv[i], "big") && i + 1 < argc)
            mode_big(strtoul(argv[++i], NULL, 0));
        else if (!strcmp(argv[i], "mismatch"))
            mode_mismatch();
        else if (!strcmp(argv[i], "nb"))
            mode_nb();
        else if (!strcmp(argv[i], "late") && i + 1 < argc)
            mode_late(atoi(argv[++i]));
        else if (!strcmp(argv[i], "gaps") && i + 1 < argc)
            mode_gaps(ctx, atoi(argv[++i]));
        else if (!strcmp(argv[i], "misc"))
            mode_misc(ctx);
        else if (!strcmp(argv[i], "waiterpoll"))
            mode_waiterpoll(ctx);
        else
            DIE("unknown mode %s", argv[i]);
    }
    CHECK_OK(cfx_group_barrier(grp, NULL));
    cfx_group_destroy(grp);
    cfx_context_destroy(ctx);
    printf("rank %d: %ld checks ok in %.2f s\n", rank, checks, now_s() - t);
    return 0;
}

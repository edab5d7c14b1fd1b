/*
 * Device buffers over tcp and shm: objects put from and got into CUDA
 * device memory between the contexts of a 2-4 rank group, then every group
 * collective on device buffers (CFX_COLL_PARAM_MEMTYPE), with and without
 * the caller's stream, in place and not, compared byte for byte with the
 * same call on host buffers (the host reference) and, for integer sums,
 * with the closed form.  Contexts live in one process, one thread per rank,
 * as in test_coll_group.c.
 *
 * Every device test runs twice: on a real GPU (cuda_coll; skipped with the
 * reason, "no CUDA device: ...", where there is none) and on the simulated
 * device (cuda_coll_sim, gpu/sim.h: device memory the CPU cannot touch,
 * streams that run late), which runs everywhere and also checks where the
 * work went: reductions on the device, on the caller's stream when one is
 * passed, and each byte of a get copied to the device once.  The refusal of
 * device buffers on a host without a device is tested for real.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "gpu/memtype.h"
#include "gpu/sim.h"
#include "testutil.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

#define MAX_RANKS 4

#include "cluster_up.h"

static bool sim; /* this test runs on the simulated device */

static void use_sim(void)
{
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    sim = true;
}

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

struct rank_run {
    int rank, size;
    const char *name; /* group name */
    const char *tp;   /* transport, for object names and messages */
    struct cfx_context *ctx;
    struct cfx_group *g;
    int (*body)(struct rank_run *rr);
    int rc;
    char err[512];
};

static void *rank_main(void *arg)
{
    struct rank_run *rr = arg;
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = rr->name,
        .rank = rr->rank,
        .size = rr->size,
        .timeout_ms = 30000,
    };
    rr->rc = cfx_group_create(rr->ctx, &gp, &rr->g);
    if (rr->rc == CFX_OK && rr->body)
        rr->rc = rr->body(rr);
    if (rr->rc != CFX_OK)
        snprintf(rr->err, sizeof(rr->err), "%s", cfx_last_error());
    cfx_group_destroy(rr->g);
    return NULL;
}

static void run_ranks(int n, const char *name, const char *tp, int (*body)(struct rank_run *))
{
    struct rank_run rr[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int i = 0; i < n; i++) {
        rr[i] = (struct rank_run){
            .rank = i, .size = n, .name = name, .tp = tp, .ctx = ctxs[i], .body = body
        };
        cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &rr[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        cr_assert_eq(rr[i].rc, CFX_OK, "rank %d of %d over %s: %s: %s", i, n, tp,
                     cfx_errname(rr[i].rc), rr[i].err);
}

/* ---- without a device: refused up front, with the reason ------------------------ */

static int expect_refused(int rc, const char *what)
{
#ifdef CFX_HAVE_CUDA
    const int want = CFX_ERR_NO_DEVICE;
    const char *text = "absent (";
#else
    const int want = CFX_ERR_UNSUPPORTED;
    const char *text = "without CUDA";
#endif
    if (rc != want)
        return cfx__err(CFX_ERR_INTERNAL, "%s of device memory gave %s, want %s", what,
                        cfx_errname(rc), cfx_errname(want));
    if (!strstr(cfx_last_error(), text) || !strstr(cfx_last_error(), what))
        return cfx__err(CFX_ERR_INTERNAL, "%s: message \"%s\" does not say \"%s\"", what,
                        cfx_last_error(), text);
    return CFX_OK;
}

static int body_refused(struct rank_run *rr)
{
    float buf[64] = { 0 }, out[64];
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_MEMTYPE | CFX_COLL_PARAM_TIMEOUT,
                                 .memtype = CFX_MEMTYPE_CUDA,
                                 .timeout_ms = 5000 };
    int rc;
    if ((rc =
             expect_refused(cfx_group_allreduce(rr->g, buf, out, 64, CFX_DTYPE_F32, CFX_OP_SUM, &p),
                            "allreduce")) != CFX_OK ||
        (rc = expect_refused(cfx_group_broadcast(rr->g, buf, 64, CFX_DTYPE_F32, 0, &p),
                             "broadcast")) != CFX_OK ||
        (rc = expect_refused(cfx_group_allgather(rr->g, buf, out, 64 / rr->size, CFX_DTYPE_F32, &p),
                             "allgather")) != CFX_OK ||
        (rc = expect_refused(
             cfx_group_send(rr->g, buf, sizeof(buf), (rr->rank + 1) % rr->size, 7, &p),
             "group send")) != CFX_OK)
        return rc;
    /* the group still works on host memory */
    float one = 1, sum = 0;
    if ((rc = cfx_group_allreduce(rr->g, &one, &sum, 1, CFX_DTYPE_F32, CFX_OP_SUM, NULL)))
        return rc;
    return sum == (float)rr->size ? CFX_OK : cfx__err(CFX_ERR_INTERNAL, "sum %f", (double)sum);
}

Test(cuda_coll, refused_without_device, .timeout = 60)
{
    if (cfx__memtype_available(CFX_MEMTYPE_CUDA))
        cr_skip_test("a CUDA device is present: this test covers hosts without one");
    up("tcp", 2);
    run_ranks(2, "nodev", "tcp", body_refused);
    down(2);
}

/* ---- with a device ------------------------------------------------------------------ */

static int dev_alloc(size_t len, void **out)
{
    int rc = cfx__memtype_alloc(CFX_MEMTYPE_CUDA, len ? len : 1, out);
    return rc == CFX_OK ? rc
                        : cfx__err(rc, "device allocation of %zu bytes: %s", len, cfx_last_error());
}

static int to_dev(void *dev, const void *host, size_t len)
{
    return cfx__memcpy_typed(dev, CFX_MEMTYPE_CUDA, host, CFX_MEMTYPE_HOST, len);
}

static int from_dev(void *host, const void *dev, size_t len)
{
    return cfx__memcpy_typed(host, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, len);
}

static const struct cfx_obj_params obj_dev = {
    .field_mask = CFX_OBJ_PARAM_MEMTYPE | CFX_OBJ_PARAM_TIMEOUT,
    .memtype = CFX_MEMTYPE_CUDA,
    .timeout_ms = 20000,
};

/* Put from device memory on every rank, get the next rank's object into
 * device memory, check the bytes. */
static int body_put_get(struct rank_run *rr)
{
    static const size_t sizes[] = { 1, 65537, (3u << 20) + 5 };
    const int n = rr->size, next = (rr->rank + 1) % n;
    int rc = CFX_OK;
    for (size_t k = 0; k < CFX_ARRAY_SIZE(sizes) && rc == CFX_OK; k++) {
        const size_t len = sizes[k];
        char name[96];
        struct cfx_object_id mine, theirs;
        void *host = malloc(len), *dsrc = NULL, *ddst = NULL;
        size_t got = 0;
        if (!host)
            return cfx__err(CFX_ERR_NOMEM, "host buffer");
        snprintf(name, sizeof(name), "cuda-coll-%s-%d-%zu", rr->tp, rr->rank, len);
        cfx_object_id_from_name(name, &mine);
        snprintf(name, sizeof(name), "cuda-coll-%s-%d-%zu", rr->tp, next, len);
        cfx_object_id_from_name(name, &theirs);
        cfx_test_fill(host, len, 1000u * k + (unsigned)rr->rank);
        if ((rc = dev_alloc(len, &dsrc)) != CFX_OK || (rc = dev_alloc(len, &ddst)) != CFX_OK ||
            (rc = to_dev(dsrc, host, len)) != CFX_OK)
            goto next;
        if ((rc = cfx_put(rr->ctx, &mine, dsrc, len, &obj_dev)) != CFX_OK ||
            (rc = cfx_group_barrier(rr->g, NULL)) != CFX_OK)
            goto next;
        struct cfx__gpu_sim_counts before = { 0 }, after = { 0 };
        if (sim && (rc = cfx__gpu_sim_stream_counts(rr->ctx->dev_stream, &before)) != CFX_OK)
            goto next;
        if ((rc = cfx_get(rr->ctx, &theirs, ddst, len, &got, &obj_dev)) != CFX_OK)
            goto next;
        /* every byte went to the device once, on the context's stream */
        if (sim && (rc = cfx__gpu_sim_stream_counts(rr->ctx->dev_stream, &after)) == CFX_OK &&
            after.h2d_bytes - before.h2d_bytes != len)
            rc = cfx__err(CFX_ERR_INTERNAL, "get of %zu bytes into device memory copied %" PRIu64
                          " bytes to the device", len, after.h2d_bytes - before.h2d_bytes);
        if (rc != CFX_OK)
            goto next;
        memset(host, 0, len);
        if ((rc = from_dev(host, ddst, len)) != CFX_OK)
            goto next;
        size_t bad = cfx_test_check(host, len, 1000u * k + (unsigned)next);
        if (got != len || bad != (size_t)-1)
            rc = cfx__err(CFX_ERR_INTERNAL,
                          "rank %d got %zu of %zu bytes of rank %d's object "
                          "over %s, first wrong byte %zu",
                          rr->rank, got, len, next, rr->tp, bad);
        /* nobody deletes before everybody has got */
        if (rc == CFX_OK)
            rc = cfx_group_barrier(rr->g, NULL);
        if (rc == CFX_OK)
            rc = cfx_delete(rr->ctx, &mine, NULL);
        cfx_delete(rr->ctx, &theirs, NULL); /* the copy this node serves */
    next:
        cfx__memtype_free(CFX_MEMTYPE_CUDA, dsrc);
        cfx__memtype_free(CFX_MEMTYPE_CUDA, ddst);
        free(host);
    }
    return rc;
}

/* Finite values of every dtype, rank dependent (no NaN, so results do not
 * depend on NaN payloads; the comparison is byte for byte anyway). */
static void fill_values(void *buf, size_t count, enum cfx_dtype dt, int rank, unsigned salt)
{
    for (size_t i = 0; i < count; i++) {
        int v = (int)((i * 7 + (size_t)rank * 13 + salt) % 1000) - 500;
        float f = (float)v * 0.37f;
        switch (dt) {
        case CFX_DTYPE_F32: ((float *)buf)[i] = f; break;
        case CFX_DTYPE_F64: ((double *)buf)[i] = (double)v * 0.37; break;
        case CFX_DTYPE_BF16: {
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
            break;
        }
        case CFX_DTYPE_F16: ((uint16_t *)buf)[i] = (uint16_t)(0x3c00 + (v & 0x3ff)); break;
        case CFX_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)(i * 3 + (size_t)rank * 1000); break;
        case CFX_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v * 1000003; break;
        default: ((uint8_t *)buf)[i] = (uint8_t)(v + rank); break;
        }
    }
}

enum kind {
    K_ALLREDUCE,
    K_BROADCAST,
    K_REDUCE,
    K_ALLGATHER,
    K_REDUCE_SCATTER,
    K_GATHER,
    K_SCATTER,
    K_ALLTOALL,
    K_LAST
};
static const char *const kind_names[K_LAST] = {
    "allreduce",      "broadcast", "reduce",  "allgather",
    "reduce_scatter", "gather",    "scatter", "alltoall",
};

/* Elements of the send / receive buffers of one call (count per block). */
static void kind_sizes(enum kind k, size_t count, int n, size_t *scount, size_t *rcount)
{
    const size_t all = count * (size_t)n;
    switch (k) {
    case K_ALLGATHER:
    case K_GATHER:
        *scount = count;
        *rcount = all;
        break;
    case K_REDUCE_SCATTER:
    case K_SCATTER:
        *scount = all;
        *rcount = count;
        break;
    case K_ALLTOALL:
        *scount = all;
        *rcount = all;
        break;
    default:
        *scount = count;
        *rcount = count;
        break;
    }
}

static int call(struct cfx_group *g, enum kind k, const void *s, void *r, size_t count,
                enum cfx_dtype dt, enum cfx_redop op, int root, const struct cfx_coll_params *p)
{
    switch (k) {
    case K_ALLREDUCE: return cfx_group_allreduce(g, s, r, count, dt, op, p);
    case K_BROADCAST: return cfx_group_broadcast(g, r, count, dt, root, p);
    case K_REDUCE: return cfx_group_reduce(g, s, r, count, dt, op, root, p);
    case K_ALLGATHER: return cfx_group_allgather(g, s, r, count, dt, p);
    case K_REDUCE_SCATTER: return cfx_group_reduce_scatter(g, s, r, count, dt, op, p);
    case K_GATHER: return cfx_group_gather(g, s, r, count, dt, root, p);
    case K_SCATTER: return cfx_group_scatter(g, s, r, count, dt, root, p);
    default: return cfx_group_alltoall(g, s, r, count, dt, p);
    }
}

struct coll_case {
    enum kind kind;
    enum cfx_dtype dt;
    enum cfx_redop op;
    enum cfx_algo algo;
    size_t count;
    bool inplace; /* allreduce only: send == receive */
    bool stream;  /* on the caller's stream */
};

/*
 * One call on device buffers against the same call on host buffers.  The
 * receive buffers start with a pattern, so bytes a rank must not write
 * (a non-root's reduce output, etc.) are checked to be untouched as well.
 */
static int one_case(struct rank_run *rr, const struct coll_case *c, void *stream)
{
    const int n = rr->size, root = n - 1;
    const size_t esz = cfx_dtype_size(c->dt);
    size_t sc, rcnt;
    kind_sizes(c->kind, c->count, n, &sc, &rcnt);
    const size_t sb = sc * esz, rb = rcnt * esz;
    char *hs = malloc(sb), *hr = malloc(rb), *back = malloc(rb);
    void *ds = NULL, *dr = NULL;
    int rc;
    if (!hs || !hr || !back) {
        rc = cfx__err(CFX_ERR_NOMEM, "host buffers");
        goto out;
    }
    fill_values(hs, sc, c->dt, rr->rank, (unsigned)c->count);
    cfx_test_fill(hr, rb, 77);
    if (c->kind == K_BROADCAST && rr->rank == root)
        fill_values(hr, rcnt, c->dt, rr->rank, 5);
    if (c->inplace)
        memcpy(hr, hs, rb);
    if ((rc = dev_alloc(sb, &ds)) != CFX_OK || (rc = dev_alloc(rb, &dr)) != CFX_OK ||
        (rc = to_dev(ds, hs, sb)) != CFX_OK || (rc = to_dev(dr, hr, rb)) != CFX_OK)
        goto out;

    struct cfx_coll_params hp = { .field_mask = CFX_COLL_PARAM_ALGO, .algo = c->algo };
    struct cfx_coll_params dp = hp;
    dp.field_mask |= CFX_COLL_PARAM_MEMTYPE;
    dp.memtype = CFX_MEMTYPE_CUDA;
    if (c->stream) {
        dp.field_mask |= CFX_COLL_PARAM_STREAM;
        dp.stream = stream;
    }
    /* the host reference, then the device call */
    struct cfx__gpu_sim_counts before = { 0 }, after = { 0 };
    rc = call(rr->g, c->kind, c->inplace ? hr : hs, hr, c->count, c->dt, c->op, root, &hp);
    if (rc == CFX_OK && sim && c->stream)
        rc = cfx__gpu_sim_stream_counts(stream, &before);
    if (rc == CFX_OK)
        rc = call(rr->g, c->kind, c->inplace ? dr : ds, dr, c->count, c->dt, c->op, root, &dp);
    /* where the reductions ran: every rank of a ring allreduce, of a
     * recursive-halving or recursive-doubling one over a power of two
     * ranks, and of a reduce-scatter reduces a block of its own */
    bool pow2 = (n & (n - 1)) == 0;
    bool reduces = n > 1 && ((c->kind == K_ALLREDUCE && c->count >= (size_t)n &&
                              (c->algo == CFX_ALGO_RING ||
                               ((c->algo == CFX_ALGO_RHD || c->algo == CFX_ALGO_RECDBL) && pow2))) ||
                             c->kind == K_REDUCE_SCATTER);
    if (rc == CFX_OK && sim && c->stream && reduces &&
        (rc = cfx__gpu_sim_stream_counts(stream, &after)) == CFX_OK &&
        after.reduces == before.reduces)
        rc = cfx__err(CFX_ERR_INTERNAL, "rank %d: no reduction ran on the caller's stream",
                      rr->rank);
    if (rc == CFX_OK)
        rc = from_dev(back, dr, rb);
    if (rc != CFX_OK) {
        char why[400];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        rc = cfx__err(rc, "%s %s %s count %zu: %s", kind_names[c->kind], cfx_dtype_name(c->dt),
                      cfx_redop_name(c->op), c->count, why);
        goto out;
    }
    for (size_t i = 0; i < rb; i++)
        if (back[i] != hr[i]) {
            rc = cfx__err(CFX_ERR_INTERNAL,
                          "%s %s %s algo %s count %zu%s%s: rank %d byte %zu "
                          "is %02x on the device, %02x on the host",
                          kind_names[c->kind], cfx_dtype_name(c->dt), cfx_redop_name(c->op),
                          cfx_algo_name(c->algo), c->count, c->inplace ? " in place" : "",
                          c->stream ? " stream" : "", rr->rank, i, (unsigned char)back[i],
                          (unsigned char)hr[i]);
            goto out;
        }
    /* not vacuous: integer sums against the closed form */
    if (c->kind == K_ALLREDUCE && c->dt == CFX_DTYPE_I32 && c->op == CFX_OP_SUM)
        for (size_t i = 0; i < c->count; i++) {
            int32_t want = (int32_t)(i * 3 * (size_t)n + 1000 * (size_t)(n * (n - 1) / 2)), got;
            memcpy(&got, back + i * 4, 4);
            if (got != want) {
                rc = cfx__err(CFX_ERR_INTERNAL,
                              "allreduce int32 sum count %zu: element %zu "
                              "is %d, want %d",
                              c->count, i, got, want);
                goto out;
            }
        }
out:
    cfx__memtype_free(CFX_MEMTYPE_CUDA, ds);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dr);
    free(hs);
    free(hr);
    free(back);
    return rc;
}

static int body_allreduce(struct rank_run *rr)
{
    static const struct {
        enum cfx_dtype dt;
        enum cfx_redop op;
    } ops[] = {
        { CFX_DTYPE_I32, CFX_OP_SUM },  { CFX_DTYPE_F32, CFX_OP_SUM },
        { CFX_DTYPE_BF16, CFX_OP_SUM }, { CFX_DTYPE_F64, CFX_OP_MAX },
        { CFX_DTYPE_U8, CFX_OP_PROD },
    };
    static const enum cfx_algo algos[] = { CFX_ALGO_AUTO, CFX_ALGO_RING, CFX_ALGO_RHD,
                                           CFX_ALGO_DBTREE, CFX_ALGO_RECDBL };
    static const size_t counts[] = { 1, 4097, 70001 };
    void *stream = NULL;
    int rc = cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &stream);
    if (rc != CFX_OK)
        return rc;
    for (size_t o = 0; o < CFX_ARRAY_SIZE(ops) && rc == CFX_OK; o++)
        for (size_t a = 0; a < CFX_ARRAY_SIZE(algos) && rc == CFX_OK; a++)
            for (size_t k = 0; k < CFX_ARRAY_SIZE(counts) && rc == CFX_OK; k++)
                for (int v = 0; v < 4 && rc == CFX_OK; v++) {
                    struct coll_case c = {
                        .kind = K_ALLREDUCE,
                        .dt = ops[o].dt,
                        .op = ops[o].op,
                        .algo = algos[a],
                        .count = counts[k],
                        .inplace = v & 1,
                        .stream = v & 2,
                    };
                    rc = one_case(rr, &c, stream);
                }
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, stream);
    return rc;
}

static int body_every_kind(struct rank_run *rr)
{
    static const size_t counts[] = { 3, 40000 };
    void *stream = NULL;
    int rc = cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &stream);
    if (rc != CFX_OK)
        return rc;
    for (int k = K_BROADCAST; k < K_LAST && rc == CFX_OK; k++)
        for (size_t i = 0; i < CFX_ARRAY_SIZE(counts) && rc == CFX_OK; i++)
            for (int v = 0; v < 2 && rc == CFX_OK; v++) {
                struct coll_case c = {
                    .kind = (enum kind)k,
                    .dt = CFX_DTYPE_F32,
                    .op = CFX_OP_SUM,
                    .algo = CFX_ALGO_AUTO,
                    .count = counts[i],
                    .stream = v,
                };
                rc = one_case(rr, &c, stream);
            }
    /* point to point from device memory into device memory */
    if (rc == CFX_OK && rr->size > 1 && rr->rank < 2) {
        const size_t len = 100003;
        char *h = malloc(len);
        void *d = NULL;
        struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_MEMTYPE,
                                     .memtype = CFX_MEMTYPE_CUDA };
        if (!h)
            rc = cfx__err(CFX_ERR_NOMEM, "host buffer");
        if (rc == CFX_OK)
            rc = dev_alloc(len, &d);
        if (rc == CFX_OK && rr->rank == 0) {
            cfx_test_fill(h, len, 4242);
            if ((rc = to_dev(d, h, len)) == CFX_OK)
                rc = cfx_group_send(rr->g, d, len, 1, 9, &p);
        } else if (rc == CFX_OK) {
            if ((rc = cfx_group_recv(rr->g, d, len, 0, 9, &p)) == CFX_OK &&
                (rc = from_dev(h, d, len)) == CFX_OK && cfx_test_check(h, len, 4242) != (size_t)-1)
                rc = cfx__err(CFX_ERR_INTERNAL, "group recv into device memory: wrong bytes");
        }
        cfx__memtype_free(CFX_MEMTYPE_CUDA, d);
        free(h);
    }
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, stream);
    return rc;
}

struct tp_param {
    char tp[8];
    int n;
};

static struct tp_param tps[] = { { "tcp", 2 }, { "shm", 3 }, { "tcp", 4 }, { "shm", 2 } };

/* Bring up @p p's ranks on a real GPU (skipping without one) or on the
 * simulated device, and run @p body on each. */
static void run_device(const struct tp_param *p, bool on_sim, const char *name,
                       int (*body)(struct rank_run *))
{
    if (on_sim)
        use_sim();
    else
        need_gpu();
    up(p->tp, p->n);
    run_ranks(p->n, name, p->tp, body);
    down(p->n);
}

#define DEVICE_TEST(suite, test, on_sim, name, body)                                      \
    ParameterizedTestParameters(suite, test)                                              \
    {                                                                                     \
        return cr_make_param_array(struct tp_param, tps, CFX_ARRAY_SIZE(tps));            \
    }                                                                                     \
    ParameterizedTest(struct tp_param *p, suite, test, .timeout = 240)                    \
    {                                                                                     \
        run_device(p, on_sim, name, body);                                                \
    }

DEVICE_TEST(cuda_coll, put_get_device, false, "pg", body_put_get)
DEVICE_TEST(cuda_coll, allreduce_device, false, "ar", body_allreduce)
DEVICE_TEST(cuda_coll, every_collective_device, false, "all", body_every_kind)

/* ---- the same on the simulated device --------------------------------------------- */

DEVICE_TEST(cuda_coll_sim, put_get_device, true, "pg", body_put_get)
DEVICE_TEST(cuda_coll_sim, allreduce_device, true, "ar", body_allreduce)
DEVICE_TEST(cuda_coll_sim, every_collective_device, true, "all", body_every_kind)

/* ---- non-blocking calls on a device other than 0 --------------------------------------- */

/*
 * Rank r works on device 1 + r % 3 (as a process that drives several
 * devices, or one that is not device 0) and posts non-blocking allreduces,
 * which the group's thread runs: its stream, scratch and kernels must be the
 * poster's device's (the simulated device refuses a kernel launched into a
 * stream of another device, or on memory of another device, as CUDA does),
 * with and without the caller's stream; and nothing may use device 0, where
 * a GPU would get a context (and the default stream waited for) of a device
 * the application never chose.
 */
static int body_nb_own_device(struct rank_run *rr)
{
    const size_t count = 70001;
    const int n = rr->size;
    int32_t *h = malloc(count * sizeof(*h));
    void *ds = NULL, *dr = NULL, *stream = NULL;
    int rc = h ? cfx__memtype_set_device(CFX_MEMTYPE_CUDA, 1 + rr->rank % 3) : CFX_ERR_NOMEM;
    if (rc == CFX_OK && (rc = dev_alloc(count * 4, &ds)) == CFX_OK &&
        (rc = dev_alloc(count * 4, &dr)) == CFX_OK)
        rc = cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &stream);
    for (size_t i = 0; rc == CFX_OK && i < count; i++)
        h[i] = (int32_t)(i * 3 + 1000 * (size_t)rr->rank);
    if (rc == CFX_OK)
        rc = to_dev(ds, h, count * 4);
    for (int v = 0; v < 2 && rc == CFX_OK; v++) {
        struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_MEMTYPE | CFX_COLL_PARAM_ALGO,
                                     .memtype = CFX_MEMTYPE_CUDA,
                                     .algo = CFX_ALGO_RING };
        if (v) {
            p.field_mask |= CFX_COLL_PARAM_STREAM;
            p.stream = stream;
        }
        struct cfx_request *req = NULL;
        rc = cfx_group_iallreduce(rr->g, ds, dr, count, CFX_DTYPE_I32, CFX_OP_SUM, &p, &req);
        if (rc == CFX_OK) {
            rc = cfx_request_wait(req, 30000);
            cfx_request_free(req);
        }
        if (rc == CFX_OK)
            rc = from_dev(h, dr, count * 4);
        for (size_t i = 0; rc == CFX_OK && i < count; i++) {
            int32_t want = (int32_t)(i * 3 * (size_t)n + 1000 * (size_t)(n * (n - 1) / 2));
            if (h[i] != want)
                rc = cfx__err(CFX_ERR_INTERNAL, "iallreduce%s: element %zu is %d, want %d",
                              v ? " on the caller's stream" : "", i, h[i], want);
        }
    }
    if (rc == CFX_OK && (cfx__gpu_sim_devices_used() & 1u))
        rc = cfx__err(CFX_ERR_INTERNAL, "rank %d: device 0 was used (devices %#x)", rr->rank,
                      cfx__gpu_sim_devices_used());
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, stream);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, ds);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dr);
    free(h);
    return rc;
}

DEVICE_TEST(cuda_coll_sim, nb_on_the_posters_device, true, "nbdev", body_nb_own_device)

/* ---- a rank that fails on its own in the middle of a call ----------------------------- */

#define LOCAL_COUNT 1024

/* Rank 0 passes host memory as device memory: the device's reduction
 * refuses it once rank 1's data is in (CFX_ERR_INVALID on rank 0, an error
 * of its own).  Rank 1 (host buffers) fails at once, saying that rank 0
 * gave the call up and with what, not that the ranks disagree: they called
 * alike.  Both must not wait for their deadline, which they would name. */
static int body_local_failure(struct rank_run *rr)
{
    static float s[2][LOCAL_COUNT], r[2][LOCAL_COUNT];
    const int me = rr->rank;
    for (int i = 0; i < LOCAL_COUNT; i++)
        s[me][i] = (float)(me * 1000 + i);
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT | CFX_COLL_PARAM_ALGO,
                                 .algo = CFX_ALGO_RING, .timeout_ms = 20000 };
    if (me == 0) {
        p.field_mask |= CFX_COLL_PARAM_MEMTYPE;
        p.memtype = CFX_MEMTYPE_CUDA;
    }
    int rc = cfx_group_allreduce(rr->g, s[me], r[me], LOCAL_COUNT, CFX_DTYPE_F32, CFX_OP_SUM,
                                 &p);
    const char *e = cfx_last_error();
    char want[128], bad[768] = "";
    snprintf(want, sizeof(want), "allreduce #0: rank 1: rank 0 (node %u) gave the call up on an "
             "error of its own (CFX_ERR_INVALID", cfx_context_node_id(ctxs[0]));
    if (me == 0 && (rc != CFX_ERR_INVALID || !strstr(e, "host memory the device cannot reach")))
        snprintf(bad, sizeof(bad), "rank 0: %s: %s", cfx_errname(rc), e);
    if (me == 1 && (rc != CFX_ERR_PEER_FAILED || !strstr(e, want) || strstr(e, "disagree")))
        snprintf(bad, sizeof(bad), "rank 1: %s: %s (wanted \"%s...\")", cfx_errname(rc), e,
                 want);
    /* the group still works (and the other rank's verdict is its own) */
    int32_t one = 1, sum = 0;
    p = (struct cfx_coll_params){ .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 10000 };
    rc = cfx_group_allreduce(rr->g, &one, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, &p);
    if (bad[0])
        return cfx__err(CFX_ERR_INTERNAL, "%s", bad);
    if (rc != CFX_OK)
        return rc;
    return sum == rr->size ? CFX_OK : cfx__err(CFX_ERR_INTERNAL, "sum %d", sum);
}

struct local_param {
    char tp[8];
    char check[4]; /* CFX_COLL_CHECK */
};

static struct local_param locals[] = { { "tcp", "1" }, { "shm", "1" }, { "tcp", "2" } };

ParameterizedTestParameters(cuda_coll_sim, local_failure_is_news_not_a_disagreement)
{
    return cr_make_param_array(struct local_param, locals, CFX_ARRAY_SIZE(locals));
}

ParameterizedTest(struct local_param *lp, cuda_coll_sim,
                  local_failure_is_news_not_a_disagreement, .timeout = 60)
{
    setenv("CFX_COLL_CHECK", lp->check, 1); /* read at the group's creation */
    use_sim();
    up(lp->tp, 2);
    run_ranks(2, "local", lp->tp, body_local_failure);
    down(2);
}

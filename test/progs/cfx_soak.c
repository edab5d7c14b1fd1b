/*
 * Soak: ROUNDS rounds of put / get / reduce across the ranks of cfx_run,
 * deleting as it goes, with memory and directory size checked at the end.
 *
 *   cfx_soak [ROUNDS [RSS_MIB]]      (defaults 10000 and 8)
 *
 * Round i belongs to rank i % n, which puts one object every other rank
 * gets and checks byte for byte:
 *   - most rounds: a small inline object (64..319 B, through the coordinator)
 *   - i % 8 == 3:  a 96 KiB object through the data plane (CFX_OBJ_FLAG_NO_INLINE)
 *   - i % 100 == 37: instead, every rank puts a 16 KiB float input and the
 *                  owner runs cfx_reduce_objects over all n (k = n); every
 *                  rank gets the result and checks it
 *   - i % 100 == 87: instead, a group allreduce of 4096 floats, checked
 * Every 16 rounds the ranks meet at a barrier and each deletes what it holds
 * of those rounds (its puts and the copies it got).
 *
 * After WARMUP (512) rounds each rank reads its VmRSS and rank 0 reads the
 * coordinator's object count; after the last round both are read again.
 * Fails when a rank's VmRSS grew by more than RSS_MIB MiB (not checked
 * under AddressSanitizer, whose quarantine keeps freed memory on purpose;
 * its leak checker covers that build) or when the object count did not
 * return to its baseline.  Prints "METRIC soak_*" lines.
 */
#include <conflux/conflux.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataplane/engine/engine.h"
#include "test/common/testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define SOAK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOAK_ASAN 1
#endif
#endif
#ifndef SOAK_ASAN
#define SOAK_ASAN 0
#endif

#define DIE(...)                                                               \
    do {                                                                       \
        fprintf(stderr, "FAIL rank %d round %ld: ", rank, cur_round);          \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        exit(1);                                                               \
    } while (0)

#define BATCH      16            /* rounds between barriers and deletes */
#define WARMUP     512           /* rounds before the baseline (a multiple of BATCH) */
#define DP_SIZE    (96u << 10)   /* data-plane objects */
#define RED_BYTES  (16u << 10)   /* reduce inputs */
#define AR_COUNT   4096          /* allreduce floats */
#define MAX_HELD   (BATCH * 8)

static int rank, world;
static long cur_round;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* VmRSS of this process in KiB. */
static long vmrss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = strtol(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

static void name_id(struct cfx_object_id *id, const char *what, long a, long b)
{
    char name[96];
    snprintf(name, sizeof(name), "soak-%s-%ld-%ld", what, a, b);
    cfx_object_id_from_name(name, id);
}

static struct cfx_object_id held[MAX_HELD];
static int nheld;

static void hold(const struct cfx_object_id *id)
{
    if (nheld == MAX_HELD)
        DIE("more than %d objects held in one batch", MAX_HELD);
    held[nheld++] = *id;
}

/* Drop every object of the batch: our puts must be there; a copy we got
 * may already be gone (a holder that is not in the directory). */
static void drop_held(struct cfx_context *ctx)
{
    for (int i = 0; i < nheld; i++) {
        int rc = cfx_delete(ctx, &held[i], NULL);
        if (rc != CFX_OK && rc != CFX_ERR_NOT_FOUND)
            DIE("delete: %s (%s)", cfx_errname(rc), cfx_last_error());
    }
    nheld = 0;
}

static uint32_t coord_objects(struct cfx_context *ctx)
{
    struct cfx_ctl_status st;
    CHECK_OK(cfx__ctl_status(ctx->ctl, &st, cfx__deadline_ns(5000)));
    return st.objects;
}

/* A holder serves from the caller's buffer until the delete (cfx_put's
 * buffer and cfx_get's destination alike): every round of a batch has its
 * own slot of SLOT_BYTES, reused only after the batch's deletes. */
#define SLOT_BYTES (DP_SIZE > 2 * RED_BYTES ? DP_SIZE : 2 * RED_BYTES)
static uint8_t *slot[BATCH];

static void round_object(struct cfx_context *ctx, long i)
{
    uint8_t *buf = slot[i % BATCH], *dst = buf;
    int owner = (int)(i % world);
    int dp = i % 8 == 3;
    size_t size = dp ? DP_SIZE : 64 + (size_t)(i % 256);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = dp ? CFX_OBJ_FLAG_NO_INLINE : 0 };
    struct cfx_object_id id;
    name_id(&id, "obj", i, 0);
    if (rank == owner) {
        cfx_test_fill(buf, size, (uint64_t)i);
        CHECK_OK(cfx_put(ctx, &id, buf, size, &pp));
    } else {
        size_t got = 0;
        CHECK_OK(cfx_get(ctx, &id, dst, SLOT_BYTES, &got, NULL));
        if (got != size || cfx_test_check(dst, size, (uint64_t)i) != (size_t)-1)
            DIE("object of %zu B: got %zu B or wrong bytes", size, got);
    }
    hold(&id);
}

static void round_reduce(struct cfx_context *ctx, long i)
{
    float *in = (float *)(void *)slot[i % BATCH];
    float *out = (float *)(void *)(slot[i % BATCH] + RED_BYTES);
    struct cfx_object_id ids[64], res;
    const size_t count = RED_BYTES / sizeof(float);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    for (int r = 0; r < world; r++)
        name_id(&ids[r], "red-in", i, r);
    name_id(&res, "red-out", i, 0);
    for (size_t e = 0; e < count; e++)
        in[e] = (float)(rank + 1 + (int)(e % 7));
    CHECK_OK(cfx_put(ctx, &ids[rank], in, RED_BYTES, &pp));
    hold(&ids[rank]);
    /* the others read the result once the driver says it is complete (a
     * get on the node still producing it waits for it there) */
    struct cfx_object_id done;
    uint8_t one = 1;
    name_id(&done, "red-done", i, 0);
    if (rank == (int)(i % world)) {
        CHECK_OK(cfx_reduce_objects(ctx, ids, (size_t)world, (size_t)world, CFX_DTYPE_F32,
                                    CFX_OP_SUM, &res, NULL, NULL));
        CHECK_OK(cfx_put(ctx, &done, &one, 1, NULL));
    } else {
        CHECK_OK(cfx_get(ctx, &done, &one, 1, NULL, NULL));
    }
    hold(&done);
    size_t got = 0;
    CHECK_OK(cfx_get(ctx, &res, out, RED_BYTES, &got, NULL));
    hold(&res);
    for (size_t e = 0; e < count; e++) {
        float want = (float)(world * (world + 1) / 2 + world * (int)(e % 7));
        if (got != RED_BYTES || out[e] != want)
            DIE("reduce result[%zu] = %g, expected %g", e, (double)out[e], (double)want);
    }
}

static void round_allreduce(struct cfx_group *g, float *in, float *out)
{
    for (size_t e = 0; e < AR_COUNT; e++)
        in[e] = (float)(rank + (int)(e % 5));
    CHECK_OK(cfx_group_allreduce(g, in, out, AR_COUNT, CFX_DTYPE_F32, CFX_OP_SUM, NULL));
    for (size_t e = 0; e < AR_COUNT; e++) {
        float want = (float)(world * (world - 1) / 2 + world * (int)(e % 5));
        if (out[e] != want)
            DIE("allreduce[%zu] = %g, expected %g", e, (double)out[e], (double)want);
    }
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? strtol(argv[1], NULL, 0) : 10000;
    long rss_mib = argc > 2 ? strtol(argv[2], NULL, 0) : 8;
    struct cfx_context *ctx;
    struct cfx_group *g;
    rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    if (world < 2 || world > 64 || rounds < WARMUP + BATCH)
        DIE("want 2..64 ranks and at least %d rounds", WARMUP + BATCH);
    CHECK_OK(cfx_context_create(NULL, &ctx));
    CHECK_OK(cfx_group_create(ctx, NULL, &g));
    for (int b = 0; b < BATCH; b++)
        if (!(slot[b] = malloc(SLOT_BYTES)))
            DIE("out of memory");
    float *fin = malloc(AR_COUNT * sizeof(float));
    float *fout = malloc(AR_COUNT * sizeof(float));
    if (!fin || !fout)
        DIE("out of memory");

    long rss0 = 0;
    uint32_t objs0 = 0;
    long n_obj = 0, n_red = 0, n_ar = 0;
    double t0 = now_s(), tw = t0;
    for (cur_round = 0; cur_round < rounds; cur_round++) {
        long i = cur_round;
        if (i % 100 == 37) {
            round_reduce(ctx, i);
            n_red++;
        } else if (i % 100 == 87) {
            round_allreduce(g, fin, fout);
            n_ar++;
        } else {
            round_object(ctx, i);
            n_obj++;
        }
        if ((i + 1) % BATCH == 0 || i + 1 == rounds) {
            CHECK_OK(cfx_group_barrier(g, NULL));
            drop_held(ctx);
        }
        if (i + 1 == WARMUP) {
            CHECK_OK(cfx_group_barrier(g, NULL)); /* every rank's deletes are in */
            rss0 = vmrss_kib();
            if (rank == 0)
                objs0 = coord_objects(ctx);
            tw = now_s();
            printf("rank %d: after %d rounds VmRSS %ld KiB%s\n", rank, WARMUP, rss0,
                   rank == 0 ? ", baseline objects taken" : "");
            if (rank == 0)
                printf("coordinator objects after warm-up: %u\n", objs0);
        }
        if (rank == 0 && (i + 1) % 2000 == 0)
            printf("%ld rounds, %.1f s\n", i + 1, now_s() - t0);
    }
    CHECK_OK(cfx_group_barrier(g, NULL));
    double t = now_s() - t0;
    long rss1 = vmrss_kib();
    long grew = rss1 - rss0;
    printf("rank %d: %ld rounds (%ld objects, %ld reduces, %ld allreduces) in %.1f s; "
           "VmRSS %ld -> %ld KiB (%+ld KiB since round %d, bound %ld MiB%s)\n", rank, rounds,
           n_obj, n_red, n_ar, t, rss0, rss1, grew, WARMUP, rss_mib,
           SOAK_ASAN ? ", not checked under ASan" : "");
    printf("METRIC soak_rank%d_rss_growth_kib %ld\n", rank, grew);
    if (!SOAK_ASAN && grew > rss_mib * 1024)
        DIE("VmRSS grew by %ld KiB over %ld rounds after warm-up (bound %ld MiB)", grew,
            rounds - WARMUP, rss_mib);
    if (rank == 0) {
        uint32_t objs1 = coord_objects(ctx);
        printf("METRIC soak_seconds %.1f\nMETRIC soak_rounds_per_s %.0f\n", t,
               (double)(rounds - WARMUP) / (now_s() - tw));
        printf("coordinator objects: %u after warm-up, %u at the end\n", objs0, objs1);
        if (objs1 != objs0)
            DIE("the coordinator holds %u objects at the end, %u after warm-up", objs1, objs0);
    }
    CHECK_OK(cfx_group_barrier(g, NULL)); /* rank 0's count is taken before anyone leaves */
    cfx_group_destroy(g);
    cfx_context_destroy(ctx);
    for (int b = 0; b < BATCH; b++)
        free(slot[b]);
    free(fin);
    free(fout);
    return 0;
}

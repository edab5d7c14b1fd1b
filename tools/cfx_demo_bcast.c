/*
 * The demo's job (for now): rank 0 puts a 256 MiB object, every other rank
 * gets it, checks every byte, and reports its throughput.  Run under cfx_run:
 *   cfx_run -n 4 cfx_demo_bcast [SIZE]
 */
#include <conflux/conflux.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "dataplane/common/util.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t word(uint64_t i)
{
    i ^= i >> 31;
    i *= 0x9e3779b97f4a7c15ull;
    return i ^ (i >> 29);
}

int main(int argc, char **argv)
{
    size_t size = 256u << 20;
    struct cfx_context *ctx;
    struct cfx_object_id id, done;
    int rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    int world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    int rc;

    if (argc > 2 || (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: cfx_run -n N %s [SIZE, e.g. 256M; default 256M]\n", argv[0]);
        return argc == 2 ? 0 : TOOL_EXIT_USAGE;
    }
    /* the object is checked in 8-byte words; the arena holds it before anything else */
    if (argc > 1 && (tool_arg_size("cfx_demo_bcast", "SIZE", argv[1], 8, 1ull << 46, &size) ||
                     tool_arg_mem("cfx_demo_bcast", "SIZE", argv[1], size, 0)))
        return TOOL_EXIT_USAGE;
    size &= ~(size_t)7;
    if ((rc = cfx_context_create(NULL, &ctx)) != CFX_OK) {
        fprintf(stderr, "cannot join the cluster: %s\n", cfx_last_error());
        return 1;
    }
    cfx_object_id_from_name("demo/model-weights", &id);
    uint64_t *buf;
    if ((rc = cfx_buf_alloc(ctx, size, (void **)&buf)) != CFX_OK) {
        fprintf(stderr, "cannot allocate %zu bytes: %s\n", size, cfx_last_error());
        cfx_context_destroy(ctx); /* leave, not just vanish: the coordinator logs a death */
        return 1;
    }
    int status = 0;
    if (rank == 0) {
        for (size_t i = 0; i < size / 8; i++)
            buf[i] = word(i);
        double t = now_s();
        rc = cfx_put(ctx, &id, buf, size, NULL);
        printf("node %u put %zu MiB in %.1f ms; waiting for %d getters\n",
               cfx_context_node_id(ctx), size >> 20, (now_s() - t) * 1e3, world - 1);
        fflush(stdout);
    } else {
        memset(buf, 0, size);
        double t = now_s();
        size_t got = 0;
        rc = cfx_get(ctx, &id, buf, size, &got, NULL);
        t = now_s() - t;
        if (rc == CFX_OK) {
            for (size_t i = 0; i < size / 8; i++)
                if (buf[i] != word(i)) {
                    fprintf(stderr, "byte %zu differs\n", i * 8);
                    status = 1;
                    break;
                }
            printf("node %u got %zu MiB in %.1f ms: %.2f GB/s%s\n", cfx_context_node_id(ctx),
                   got >> 20, t * 1e3, (double)got / t / 1e9, status ? " WRONG DATA" : ", verified");
            fflush(stdout);
        }
    }
    if (rc != CFX_OK) {
        fprintf(stderr, "%s: %s\n", cfx_errname(rc), cfx_last_error());
        status = 1;
    }
    /* stay until everyone has the object: ranks may be serving each other.
     * Each rank says it is done; rank 0 answers once all have, and leaves
     * last (an object goes with its last complete copy, so a rank's "done"
     * must be read before that rank leaves). */
    uint8_t one = 1, b;
    char name[64];
    struct cfx_object_id all;
    cfx_object_id_from_name("demo/done/all", &all);
    snprintf(name, sizeof(name), "demo/done/%d", rank);
    cfx_object_id_from_name(name, &done);
    cfx_put(ctx, &done, &one, 1, NULL);
    if (rank != 0 && cfx_get(ctx, &all, &b, 1, NULL, NULL) != CFX_OK) {
        fprintf(stderr, "rank 0 never finished: %s\n", cfx_last_error());
        status = 1;
    }
    for (int r = 1; rank == 0 && r < world; r++) {
        snprintf(name, sizeof(name), "demo/done/%d", r);
        cfx_object_id_from_name(name, &done);
        if (cfx_get(ctx, &done, &b, 1, NULL, NULL) != CFX_OK) {
            fprintf(stderr, "rank %d never finished: %s\n", r, cfx_last_error());
            status = 1;
        }
    }
    if (rank == 0 && cfx_put(ctx, &all, &one, 1, NULL) == CFX_OK) {
        /* a rank has left once its "done" can be put again (our copy
         * dropped first); bounded by the context's deadline per rank */
        for (int r = 1; r < world; r++) {
            snprintf(name, sizeof(name), "demo/done/%d", r);
            cfx_object_id_from_name(name, &done);
            cfx_delete(ctx, &done, NULL);
            for (int tries = 0; tries < 6000; tries++) {
                int prc = cfx_put(ctx, &done, &one, 1, NULL);
                if (prc != CFX_ERR_EXISTS) {
                    if (prc == CFX_OK)
                        cfx_delete(ctx, &done, NULL);
                    break;
                }
                usleep(5000);
            }
        }
    }
    cfx_delete(ctx, &id, NULL);
    cfx_buf_free(ctx, buf);
    cfx_context_destroy(ctx);
    return status;
}

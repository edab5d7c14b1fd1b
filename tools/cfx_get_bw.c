/*
 * cfx_get_bw: object get bandwidth between two processes, perftest style.
 *
 *   server:  CFX_TOKEN=t cfx_get_bw -s 64M
 *   client:  CFX_TOKEN=t cfx_get_bw -s 64M 127.0.0.1
 *
 * The server puts one object per measured get; the client gets each (timed)
 * and deletes its copy (not timed), so every get crosses the data plane.
 * Objects are named by position (size index, iteration), not by size, so a
 * client run with another -s than its server finds the server's object and
 * reports the mismatch at once instead of waiting for an object nobody puts;
 * it tells the server so in its "done" object, and the server names it too.
 */
#include "perf_common.h"

#include <math.h>
#include <sys/resource.h>


static double memcpy_bw(size_t size, long iters)
{
    char *a = malloc(size), *b = malloc(size);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, size);
    memset(b, 2, size);
    memcpy(b, a, size); /* warm */
    double t = perf_now();
    for (long i = 0; i < iters; i++) {
        memcpy(b, a, size);
        __asm__ __volatile__("" : : "r"(b) : "memory");
    }
    t = perf_now() - t;
    free(a);
    free(b);
    return (double)size * (double)iters / t;
}

/* CPU seconds (user + system) of every thread of this process so far. */
static double cpu_now(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

static const struct perf_tool tool = {
    .prog = "cfx_get_bw",
    .what = "objects",
    .size = 64u << 20,
    .iters = 20,
    .sweep_min = 4096,
    .sweep_max = 64u << 20,
    .unused = "rN", /* --repeat and --no-keep are cfx_get_lat's */
};

int main(int argc, char **argv)
{
    struct perf_opts o;
    struct cfx_coord *coord;
    struct cfx_object_id id;
    size_t sizes[PERF_SWEEP_MAX];
    int rc = perf_parse(argc, argv, &o, &tool);
    if (rc)
        return rc;
    const int nsizes = perf_sizes(&tool, &o, sizes);
    struct perf_shape shape; /* what the server puts; a put keeps it to the end */
    perf_shape_set(&shape, sizes, nsizes, &o);
    size_t maxsize = 1;
    for (int i = 0; i < nsizes; i++)
        maxsize = sizes[i] > maxsize ? sizes[i] : maxsize;

    struct cfx_context *ctx = perf_join(&o, &coord, argv[0]);
    void *buf = NULL;
    int arena = o.arena || !o.host;
    /* an arena buffer is registered with every transport: over verbs, pinned */
    if (arena && perf_pins(ctx)) {
        char val[32];
        snprintf(val, sizeof(val), "%zu", maxsize);
        if (tool_arg_mem("cfx_get_bw", o.all ? "-a" : "-s", val, maxsize, 1)) {
            cfx_context_destroy(ctx);
            cfx__coord_stop(coord);
            return TOOL_EXIT_USAGE;
        }
    }
    if (arena)
        rc = cfx_buf_alloc(ctx, maxsize, &buf);
    else if (!(buf = malloc(maxsize)))
        rc = cfx__err(CFX_ERR_NOMEM, "malloc of %zu bytes failed", maxsize);
    if (rc != CFX_OK) {
        fprintf(stderr, "%s: cannot allocate %zu bytes: %s\n", argv[0], maxsize, cfx_last_error());
        cfx_context_destroy(ctx);
        cfx__coord_stop(coord);
        return 1;
    }
    memset(buf, 0x5a, maxsize);
    int status = 0;

    if (!o.host) {
        /* server: publish every object the client will get, then wait */
        struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                     .flags = o.inline_ok ? 0 : CFX_OBJ_FLAG_NO_INLINE };
        for (int s = 0; s < nsizes; s++)
            for (long i = 0; i < o.iters + o.warmup; i++) {
                perf_id(&id, "bw", (size_t)s, i);
                rc = cfx_put(ctx, &id, buf, sizes[s], &pp);
                if (rc != CFX_OK) {
                    fprintf(stderr, "%s: put: %s\n", argv[0], cfx_last_error());
                    cfx_buf_free(ctx, buf);
                    cfx_context_destroy(ctx);
                    cfx__coord_stop(coord);
                    return 1;
                }
            }
        if (perf_shape_put(ctx, "bw-done", &shape) != CFX_OK) {
            fprintf(stderr, "%s: put: %s\n", argv[0], cfx_last_error());
            cfx_buf_free(ctx, buf);
            cfx_context_destroy(ctx);
            cfx__coord_stop(coord);
            return 1;
        }
        if (!o.json)
            printf("Waiting for a client on port %d...\n", o.port);
        fflush(stdout);
        double served = 0, cpu0 = cpu_now();
        for (int s = 0; s < nsizes; s++)
            served += (double)sizes[s] * (double)(o.iters + o.warmup);
        rc = perf_server_wait(ctx, coord, "bw-done");
        if (rc != CFX_OK) {
            fprintf(stderr, "%s: client did not finish: %s\n", argv[0], cfx_last_error());
            status = 1;
        } else {
            /* from the end of the puts to the client's last get: the
             * wait for the client to start is in it (a busy-polled
             * transport spins through it) */
            double cpu = (cpu_now() - cpu0) / (served * 1e-9);
            if (o.json)
                printf("{\"tool\":\"cfx_get_bw\",\"role\":\"server\",\"served_bytes\":%.0f,"
                       "\"cpu_s_per_gb\":%.4f}\n", served, cpu);
            else
                printf("Client done; server CPU %.3f s per GB served.\n", cpu);
        }
    } else {
        char cfg[2048];
        cfx_context_config(ctx, cfg, sizeof(cfg));
        const char *tp = strstr(cfg, "transports = ");
        char tpname[64] = "?";
        if (tp)
            sscanf(tp, "transports = %63[^ \n]", tpname);
        if (o.json)
            printf("{\"tool\":\"cfx_get_bw\",\"transport\":\"%s\",\"buffer\":\"%s\",\"results\":[",
                   o.transport ? o.transport : tpname, o.arena ? "arena" : "user");
        else {
            printf("---------------------------------------------------------------------------\n");
            printf("                    Conflux object get bandwidth test\n");
            printf(" Coordinator     : %s:%d\n", o.host, o.port);
            printf(" Transport       : %s\n", o.transport ? o.transport : tpname);
            printf(" Chunk size      : %s\n", o.chunk ? "fixed" : "follows object size");
            printf(" Destination     : %s buffer\n", o.arena ? "arena" : "user");
            printf(" Iterations      : %ld (+%ld warm-up)\n", o.iters, o.warmup);
            printf("---------------------------------------------------------------------------\n");
            printf(" %-12s %-12s %-18s %-20s %-10s %s\n", "#bytes", "#iterations",
                   o.gbits ? "BW peak[Gb/sec]" : "BW peak[GB/sec]",
                   o.gbits ? "BW average[Gb/sec]" : "BW average[GB/sec]", "CPU[s/GB]",
                   "memcpy ratio");
        }
        status = perf_shape_check(ctx, argv[0], "bw-done", &shape);
        for (int s = 0; s < nsizes && !status; s++) {
            double total = 0, best = INFINITY, cpu0 = cpu_now();
            for (long i = 0; i < o.iters + o.warmup; i++) {
                size_t got = 0;
                if (i == o.warmup)
                    cpu0 = cpu_now(); /* connection setup is in the warm-up */
                perf_id(&id, "bw", (size_t)s, i);
                double t = perf_now();
                rc = cfx_get(ctx, &id, buf, maxsize, &got, NULL);
                t = perf_now() - t;
                if ((rc == CFX_OK || rc == CFX_ERR_TRUNCATED) && got != sizes[s]) {
                    fprintf(stderr, "%s: size mismatch: the server put %zu bytes where this "
                            "client expects %zu: give both sides the same -s (and -a)\n",
                            argv[0], got, sizes[s]);
                    perf_mismatch_tell(ctx, "bw-done", got, sizes[s]);
                    status = 1;
                    break;
                }
                if (rc != CFX_OK) {
                    fprintf(stderr, "%s: get of %zu bytes: %s\n", argv[0], sizes[s],
                            cfx_last_error());
                    status = 1;
                    break;
                }
                cfx_delete(ctx, &id, NULL);
                if (i >= o.warmup) {
                    total += t;
                    best = t < best ? t : best;
                }
            }
            if (status)
                break;
            /* this process's CPU (every thread: the progress thread's
             * polling too) per GB of the measured gets, their deletes in */
            double cpu = (cpu_now() - cpu0) / ((double)sizes[s] * (double)o.iters * 1e-9);
            double scale = o.gbits ? 8e-9 : 1e-9;
            double avg = (double)sizes[s] * (double)o.iters / total;
            double peak = (double)sizes[s] / best;
            double ref = o.memcpy_ref ? memcpy_bw(sizes[s], o.iters) : 0;
            if (o.json) {
                /* without -m there is no reference: null, as the table's '-' */
                char mbw[32] = "null", mratio[32] = "null";
                if (ref > 0) {
                    snprintf(mbw, sizeof(mbw), "%.4f", ref * scale);
                    snprintf(mratio, sizeof(mratio), "%.4f", avg / ref);
                }
                printf("%s{\"bytes\":%zu,\"iterations\":%ld,\"bw_peak\":%.4f,\"bw_avg\":%.4f,"
                       "\"unit\":\"%s\",\"cpu_s_per_gb\":%.4f,\"memcpy_bw\":%s,"
                       "\"memcpy_ratio\":%s}",
                       s ? "," : "", sizes[s], o.iters, peak * scale, avg * scale,
                       o.gbits ? "Gb/s" : "GB/s", cpu, mbw, mratio);
            } else if (ref > 0)
                printf(" %-12zu %-12ld %-18.3f %-20.3f %-10.3f %.3f (memcpy %.3f)\n", sizes[s],
                       o.iters, peak * scale, avg * scale, cpu, avg / ref, ref * scale);
            else
                printf(" %-12zu %-12ld %-18.3f %-20.3f %-10.3f -\n", sizes[s], o.iters,
                       peak * scale, avg * scale, cpu);
            fflush(stdout);
        }
        if (o.json)
            printf("]}\n");
        else
            printf("---------------------------------------------------------------------------\n");
        uint8_t one = 1;
        /* after a failure the server may be gone with the coordinator it
         * runs; if not, it sees this process leave */
        if (!status && perf_client_done(ctx, "bw-done", &one, 1) != CFX_OK) {
            fprintf(stderr, "%s: cannot tell the server we are done: %s\n", argv[0],
                    cfx_last_error());
            status = 1;
        }
    }
    if (o.arena || !o.host)
        cfx_buf_free(ctx, buf);
    else
        free(buf);
    cfx_context_destroy(ctx);
    cfx__coord_stop(coord);
    return status;
}

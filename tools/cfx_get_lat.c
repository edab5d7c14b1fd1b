/*
 * cfx_get_lat: latency of getting small objects, perftest style.
 *
 *   server:  CFX_TOKEN=t cfx_get_lat -t shm
 *   client:  CFX_TOKEN=t cfx_get_lat -t shm 127.0.0.1
 *
 * Each measured get is a whole get as an application sees it: directory
 * lookup, the data-plane request and write, and the completion report.
 * Objects go through the data plane unless --inline is given.  With
 * --repeat each object is got once unmeasured and its copy deleted first,
 * so the measured get is a second one, whose location this node knows
 * (the location cache: no directory lookup).
 */
#include "perf_common.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    struct perf_opts o;
    struct cfx_coord *coord;
    struct cfx_object_id id;
    int rc = perf_parse(argc, argv, &o, "cfx_get_lat", "small objects", 8, 1000);
    if (rc)
        return rc;
    struct cfx_context *ctx = perf_join(&o, &coord, argv[0]);
    uint8_t *buf = malloc(o.size);
    int status = 0;
    if (!buf) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", argv[0], o.size);
        cfx_context_destroy(ctx);
        cfx__coord_stop(coord);
        return 1;
    }
    memset(buf, 0x11, o.size);

    if (!o.host) {
        struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                     .flags = o.inline_ok ? 0 : CFX_OBJ_FLAG_NO_INLINE };
        for (long i = 0; i < o.iters + o.warmup; i++) {
            perf_id(&id, "lat", 0, i); /* by position: see cfx_get_bw */
            if ((rc = cfx_put(ctx, &id, buf, o.size, &pp)) != CFX_OK) {
                fprintf(stderr, "%s: put: %s\n", argv[0], cfx_last_error());
                return 1;
            }
        }
        if (!o.json)
            printf("Waiting for a client on port %d...\n", o.port);
        fflush(stdout);
        /* a client that failed (and so said nothing) or was killed ends it */
        if (perf_server_wait(ctx, coord, "lat-done") != CFX_OK) {
            fprintf(stderr, "%s: client did not finish: %s\n", argv[0], cfx_last_error());
            status = 1;
        }
    } else {
        double *lat = calloc((size_t)o.iters, sizeof(double));
        if (!lat) {
            fprintf(stderr, "%s: cannot allocate %ld latencies\n", argv[0], o.iters);
            status = 1;
        }
        for (long i = 0; i < o.iters + o.warmup && !status; i++) {
            size_t got = 0;
            perf_id(&id, "lat", 0, i);
            if (o.repeat) {
                if ((rc = cfx_get(ctx, &id, buf, o.size, &got, NULL)) != CFX_OK) {
                    fprintf(stderr, "%s: first get: %s\n", argv[0], cfx_last_error());
                    status = 1;
                    break;
                }
                cfx_delete(ctx, &id, NULL);
            }
            double t = perf_now();
            rc = cfx_get(ctx, &id, buf, o.size, &got, NULL);
            t = perf_now() - t;
            if ((rc == CFX_OK || rc == CFX_ERR_TRUNCATED) && got != o.size) {
                fprintf(stderr, "%s: size mismatch: the server put %zu bytes where this "
                        "client expects %zu: give both sides the same -s\n", argv[0], got,
                        o.size);
                status = 1;
                break;
            }
            if (rc != CFX_OK) {
                fprintf(stderr, "%s: get: %s\n", argv[0], cfx_last_error());
                status = 1;
                break;
            }
            cfx_delete(ctx, &id, NULL);
            if (i >= o.warmup)
                lat[i - o.warmup] = t * 1e6;
        }
        if (!status) {
            qsort(lat, (size_t)o.iters, sizeof(double), cmp_double);
            double sum = 0;
            for (long i = 0; i < o.iters; i++)
                sum += lat[i];
            double p50 = lat[o.iters / 2], p99 = lat[(o.iters * 99) / 100];
            const char *tp = o.transport ? o.transport : "auto";
            if (o.json)
                printf("{\"tool\":\"cfx_get_lat\",\"transport\":\"%s\",\"bytes\":%zu,"
                       "\"iterations\":%ld,\"inline\":%s,\"repeat\":%s,\"t_min_us\":%.2f,\"t_p50_us\":%.2f,"
                       "\"t_p99_us\":%.2f,\"t_max_us\":%.2f,\"t_avg_us\":%.2f}\n",
                       tp, o.size, o.iters, o.inline_ok ? "true" : "false",
                       o.repeat ? "true" : "false", lat[0], p50, p99,
                       lat[o.iters - 1], sum / (double)o.iters);
            else {
                printf("---------------------------------------------------------------------------\n");
                printf("                    Conflux object get latency test\n");
                printf(" Coordinator     : %s:%d\n", o.host, o.port);
                printf(" Transport       : %s\n", tp);
                printf(" Path            : %s\n", o.inline_ok ? "inline via coordinator" : "data plane");
                printf(" Measured get    : %s\n", o.repeat ? "second of each object" : "first");
                printf("---------------------------------------------------------------------------\n");
                printf(" %-8s %-12s %-10s %-10s %-10s %-10s %-10s\n", "#bytes", "#iterations",
                       "t_min[us]", "t_p50[us]", "t_p99[us]", "t_max[us]", "t_avg[us]");
                printf(" %-8zu %-12ld %-10.2f %-10.2f %-10.2f %-10.2f %-10.2f\n", o.size,
                       o.iters, lat[0], p50, p99, lat[o.iters - 1], sum / (double)o.iters);
                printf("---------------------------------------------------------------------------\n");
            }
        }
        free(lat);
        uint8_t one = 1;
        perf_id(&id, "lat-done", 0, 0);
        /* only a run that succeeded says done: the server sees a failed
         * one leave without it, and fails too */
        if (!status && cfx_put(ctx, &id, &one, 1, NULL) != CFX_OK) {
            fprintf(stderr, "%s: cannot tell the server we are done: %s\n", argv[0],
                    cfx_last_error());
            status = 1;
        }
    }
    free(buf);
    cfx_context_destroy(ctx);
    cfx__coord_stop(coord);
    return status;
}

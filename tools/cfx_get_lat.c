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
 * (the location cache: no directory lookup).  With --no-keep the measured
 * gets keep no copy here (CFX_OBJ_FLAG_NO_KEEP, as Python's get into a
 * buffer), so none is deleted after them.  With -a it runs every size
 * from 2 bytes to 8 MiB by powers of two, one row each, as perftest's
 * ib_*_lat -a: the server puts the objects of every size, named by position
 * (size index, iteration) as cfx_get_bw's, so a client with another -s or
 * -a than its server reports the mismatch at once.
 */
#include "perf_common.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const struct perf_tool tool = {
    .prog = "cfx_get_lat",
    .what = "small objects",
    .size = 8,
    .iters = 1000,
    .sweep_min = 2,
    .sweep_max = 8u << 20,
    .unused = "umG", /* cfx_get_bw's: it gets into malloc'd memory and reports no bandwidth */
};

/* The measured gets of size index @p s (@p size bytes) into @p lat (us). */
static int measure(struct cfx_context *ctx, const struct perf_opts *o, int s, size_t size,
                   uint8_t *buf, double *lat, const char *prog)
{
    struct cfx_object_id id;
    for (long i = 0; i < o->iters + o->warmup; i++) {
        size_t got = 0;
        int rc;
        perf_id(&id, "lat", (size_t)s, i);
        if (o->repeat) {
            if ((rc = cfx_get(ctx, &id, buf, size, &got, NULL)) != CFX_OK) {
                fprintf(stderr, "%s: first get of %zu bytes: %s\n", prog, size,
                        cfx_last_error());
                return 1;
            }
            cfx_delete(ctx, &id, NULL);
        }
        struct cfx_obj_params nk = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                     .flags = CFX_OBJ_FLAG_NO_KEEP };
        double t = perf_now();
        rc = cfx_get(ctx, &id, buf, size, &got, o->no_keep ? &nk : NULL);
        t = perf_now() - t;
        if ((rc == CFX_OK || rc == CFX_ERR_TRUNCATED) && got != size) {
            fprintf(stderr, "%s: size mismatch: the server put %zu bytes where this client "
                    "expects %zu: give both sides the same -s (and -a)\n", prog, got, size);
            perf_mismatch_tell(ctx, "lat-done", got, size);
            return 1;
        }
        if (rc != CFX_OK) {
            fprintf(stderr, "%s: get of %zu bytes: %s\n", prog, size, cfx_last_error());
            return 1;
        }
        if (!o->no_keep)
            cfx_delete(ctx, &id, NULL);
        if (i >= o->warmup)
            lat[i - o->warmup] = t * 1e6;
    }
    return 0;
}

/* One row (or JSON document) of the results of @p size bytes. */
static void report(const struct perf_opts *o, size_t size, double *lat)
{
    qsort(lat, (size_t)o->iters, sizeof(double), cmp_double);
    double sum = 0;
    for (long i = 0; i < o->iters; i++)
        sum += lat[i];
    double p50 = lat[o->iters / 2], p99 = lat[(o->iters * 99) / 100];
    if (o->json)
        printf("{\"tool\":\"cfx_get_lat\",\"transport\":\"%s\",\"bytes\":%zu,"
               "\"iterations\":%ld,\"inline\":%s,\"repeat\":%s,\"no_keep\":%s,"
               "\"t_min_us\":%.2f,\"t_p50_us\":%.2f,\"t_p99_us\":%.2f,\"t_max_us\":%.2f,"
               "\"t_avg_us\":%.2f}\n",
               o->transport ? o->transport : "auto", size, o->iters,
               o->inline_ok ? "true" : "false", o->repeat ? "true" : "false",
               o->no_keep ? "true" : "false", lat[0], p50, p99,
               lat[o->iters - 1], sum / (double)o->iters);
    else
        printf(" %-8zu %-12ld %-10.2f %-10.2f %-10.2f %-10.2f %-10.2f\n", size, o->iters,
               lat[0], p50, p99, lat[o->iters - 1], sum / (double)o->iters);
    fflush(stdout);
}

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
    const size_t maxsize = sizes[nsizes - 1]; /* a sweep grows */
    struct cfx_context *ctx = perf_join(&o, &coord, argv[0]);
    uint8_t *buf = malloc(maxsize);
    int status = 0;
    if (!buf) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", argv[0], maxsize);
        cfx_context_destroy(ctx);
        cfx__coord_stop(coord);
        return 1;
    }
    memset(buf, 0x11, maxsize);

    if (!o.host) {
        struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                     .flags = o.inline_ok ? 0 : CFX_OBJ_FLAG_NO_INLINE };
        for (int s = 0; s < nsizes; s++)
            for (long i = 0; i < o.iters + o.warmup; i++) {
                perf_id(&id, "lat", (size_t)s, i); /* by position: see cfx_get_bw */
                if ((rc = cfx_put(ctx, &id, buf, sizes[s], &pp)) != CFX_OK) {
                    fprintf(stderr, "%s: put: %s\n", argv[0], cfx_last_error());
                    free(buf);
                    cfx_context_destroy(ctx);
                    cfx__coord_stop(coord);
                    return 1;
                }
            }
        if (perf_shape_put(ctx, "lat-done", &shape) != CFX_OK) {
            fprintf(stderr, "%s: put: %s\n", argv[0], cfx_last_error());
            free(buf);
            cfx_context_destroy(ctx);
            cfx__coord_stop(coord);
            return 1;
        }
        if (!o.json)
            printf("Waiting for a client on port %d...\n", o.port);
        fflush(stdout);
        /* a client that failed (saying why when the sizes disagree) or was
         * killed ends it */
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
        if (!status && !o.json) {
            printf("---------------------------------------------------------------------------\n");
            printf("                    Conflux object get latency test\n");
            printf(" Coordinator     : %s:%d\n", o.host, o.port);
            printf(" Transport       : %s\n", o.transport ? o.transport : "auto");
            printf(" Path            : %s\n",
                   o.inline_ok ? "inline via coordinator" : "data plane");
            printf(" Measured get    : %s%s\n", o.repeat ? "second of each object" : "first",
                   o.no_keep ? ", keeping no copy" : "");
            printf("---------------------------------------------------------------------------\n");
            printf(" %-8s %-12s %-10s %-10s %-10s %-10s %-10s\n", "#bytes", "#iterations",
                   "t_min[us]", "t_p50[us]", "t_p99[us]", "t_max[us]", "t_avg[us]");
        }
        if (!status)
            status = perf_shape_check(ctx, argv[0], "lat-done", &shape);
        for (int s = 0; s < nsizes && !status; s++) {
            status = measure(ctx, &o, s, sizes[s], buf, lat, argv[0]);
            if (!status)
                report(&o, sizes[s], lat);
        }
        if (!status && !o.json)
            printf("---------------------------------------------------------------------------\n");
        free(lat);
        uint8_t one = 1;
        /* only a run that succeeded says done: the server sees a failed
         * one leave without it, and fails too */
        if (!status && perf_client_done(ctx, "lat-done", &one, 1) != CFX_OK) {
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

/*
 * cfx_ps_bench: parameter-server throughput with one straggling server,
 * before and after elastic load distribution, in one run.
 *
 *   cfx_run -n S+W cfx_ps_bench [-s SERVERS] [-b BYTES] [-B BLOCK] [-D US]
 *                               [--static N] [--warm N] [--steps N] [--recover N] [--json]
 *
 * Ranks 0..S-1 are servers, the rest workers.  Every step each worker
 * push-pulls one f32 tensor of BYTES (BSP, summing servers).  Server 1 is
 * slowed by D microseconds per request (the test-only delay knob, standing
 * in for interference or a slow link).  The scheduler starts with automatic
 * load distribution off: the first N steps measure the static assignment.
 * Worker 0 then turns it on; after the warm-up steps (in which the scheduler
 * measures, detects the straggler and migrates blocks) the last N steps
 * measure the rebalanced assignment.  With --recover N, server 1 then
 * loses its delay (worker 0 puts the object "psbench/recover", which server
 * 1 waits for) and the workers run N more steps: the scheduler, which kept
 * measuring the demoted server on its small share, gives it blocks back;
 * the last --steps of them are the "recovered" phase, and the step at which
 * server 1's share first grew is reported.  Prints a key : value banner, a
 * table of the phases and the speed-up.
 */
#include <conflux/conflux.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "dataplane/common/util.h"

#define PROG "cfx_ps_bench"

#define JOB "psbench"

struct opts {
    int servers;
    size_t bytes, block;
    unsigned delay_us;
    int n_static, n_warm, n_steps, n_recover;
    int json;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(const char *p, FILE *to)
{
    fprintf(to,
            "usage: cfx_run -n S+W %s [-s SERVERS] [-b BYTES] [-B BLOCK] [-D DELAY_US] "
            "[--static N] [--warm N] [--steps N] [--recover N] [--json]\n"
            "  -s SERVERS   2..64 (default 2)      -b BYTES  tensor size, >= 4 (default 8M)\n"
            "  -B BLOCK     >= 4 (default 256K)    -D US     slow server's delay (default 2000)\n"
            "  --static N, --steps N: >= 1; --warm N: >= 0 (defaults 15, 30, 25)\n"
            "  --recover N  after the rebalanced phase, server 1 loses its delay and the\n"
            "               workers run N more steps (>= --steps; default 0: no such phase)\n",
            p);
}

/* 0, or TOOL_EXIT_USAGE with the bad option and value named on stderr */
static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){ .servers = 2,
                        .bytes = 8u << 20,
                        .block = 256u << 10,
                        .delay_us = 2000,
                        .n_static = 15,
                        .n_warm = 25,
                        .n_steps = 30 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad, d;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(argv[0], stdout);
            exit(0);
        }
        if (strcmp(a, "-s") && strcmp(a, "-b") && strcmp(a, "-B") && strcmp(a, "-D") &&
            strcmp(a, "--static") && strcmp(a, "--warm") && strcmp(a, "--steps") &&
            strcmp(a, "--recover")) {
            fprintf(stderr, "cfx_ps_bench: unknown argument '%s'\n", a);
            usage(argv[0], stderr);
            return TOOL_EXIT_USAGE;
        }
        if (!v) {
            fprintf(stderr, "cfx_ps_bench: %s needs a value\n", a);
            usage(argv[0], stderr);
            return TOOL_EXIT_USAGE;
        }
        i++;
        if (!strcmp(a, "-s"))
            bad = tool_arg_int(PROG, a, v, 2, 64, "a number of servers", &o->servers);
        else if (!strcmp(a, "-b"))
            bad = tool_arg_size(PROG, a, v, 4, 1ull << 40, &o->bytes) ||
                  tool_arg_mem(PROG, a, v, o->bytes, 0);
        else if (!strcmp(a, "-B"))
            bad = tool_arg_size(PROG, a, v, 4, 1ull << 40, &o->block);
        else if (!strcmp(a, "-D")) {
            bad = tool_arg_int(PROG, a, v, 0, 10000000, "a delay in us", &d);
            o->delay_us = (unsigned)d;
        } else if (!strcmp(a, "--static"))
            bad = tool_arg_int(PROG, a, v, 1, 1000000, "a number of steps", &o->n_static);
        else if (!strcmp(a, "--warm"))
            bad = tool_arg_int(PROG, a, v, 0, 1000000, "a number of steps", &o->n_warm);
        else if (!strcmp(a, "--recover"))
            bad = tool_arg_int(PROG, a, v, 0, 1000000, "a number of steps", &o->n_recover);
        else
            bad = tool_arg_int(PROG, a, v, 1, 1000000, "a number of steps", &o->n_steps);
        if (bad)
            return TOOL_EXIT_USAGE;
    }
    if (o->n_recover && o->n_recover < o->n_steps) {
        fprintf(stderr, "cfx_ps_bench: --recover %d: at least --steps (%d) steps\n", o->n_recover,
                o->n_steps);
        return TOOL_EXIT_USAGE;
    }
    return 0;
}

/* Server: serve until the job ends; server 1 is slowed by @p delay_us until
 * the object "psbench/recover" appears (when @p recover). */
static int serve(struct cfx_context *ctx, struct cfx_ps *ps, int index, unsigned delay_us,
                 bool recover)
{
    struct cfx_request *lift = NULL;
    static char flag;
    if (index == 1) {
        cfx_ps_server_set_delay(ps, delay_us);
        struct cfx_object_id id;
        struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = -1 };
        if (recover && (cfx_object_id_from_name(JOB "/recover", &id) != CFX_OK ||
                        cfx_get_nb(ctx, &id, &flag, 1, &op, &lift) != CFX_OK)) {
            fprintf(stderr, "server 1: cannot wait for the recovery: %s\n", cfx_last_error());
            return 1;
        }
    }
    int rc, status = 0;
    while ((rc = cfx_ps_serve(ps, lift ? 50 : 1000)) == CFX_ERR_TIMEOUT) {
        int lrc = lift ? cfx_request_test(lift) : CFX_ERR_AGAIN;
        if (lrc == CFX_ERR_AGAIN)
            continue;
        if (lrc == CFX_OK) {
            cfx_ps_server_set_delay(ps, 0);
        } else {
            fprintf(stderr, "server 1: waiting for the recovery: %s\n", cfx_last_error());
            status = 1;
        }
        cfx_request_free(lift);
        lift = NULL;
    }
    cfx_request_free(lift);
    return status || rc != CFX_OK;
}

/* The blocks per server of @p st as "a/b/c" (map v). */
static void blocks_of(const struct cfx_ps_stats *st, char *own, size_t cap)
{
    size_t off = 0;
    own[0] = 0;
    for (uint32_t s = 0; s < st->nservers && off < cap; s++)
        off += (size_t)snprintf(own + off, cap - off, "%s%u", s ? "/" : "", st->servers[s].blocks);
    if (off < cap)
        snprintf(own + off, cap - off, " (map %u)", st->map_version);
}

int main(int argc, char **argv)
{
    struct opts o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc;
    int rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    int world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    int workers = world - o.servers;
    if (workers < 1) {
        fprintf(stderr, "need more ranks than servers (%d ranks, %d servers)\n", world, o.servers);
        return 2;
    }
    struct cfx_context *ctx;
    if (cfx_context_create(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "cannot join the cluster: %s\n", cfx_last_error());
        return 1;
    }
    struct cfx_ps_params p = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_BLOCK_SIZE | CFX_PS_PARAM_BALANCE,
        .job = JOB,
        .num_workers = workers,
        .num_servers = o.servers,
        .block_size = o.block,
        .role = rank < o.servers ? CFX_PS_SERVER : CFX_PS_WORKER,
        .index = rank < o.servers ? rank : rank - o.servers,
        .balance = { .enabled = 0,
                     .interval_ms = 300,
                     .straggler_factor = 1.5,
                     .min_gain = 0.2,
                     .explore = 0.05,
                     .report_ms = 100 },
    };
    struct cfx_ps *ps;
    int rc = cfx_ps_create(ctx, &p, &ps);
    if (rc != CFX_OK) {
        fprintf(stderr, "cfx_ps_create: %s\n", cfx_last_error());
        cfx_context_destroy(ctx); /* leave, not just vanish: the coordinator logs a death */
        return 1;
    }
    int status = 0;
    if (p.role == CFX_PS_SERVER) {
        status = serve(ctx, ps, p.index, o.delay_us, o.n_recover > 0);
        cfx_ps_destroy(ps);
        cfx_context_destroy(ctx);
        return status;
    }

    size_t n = o.bytes / 4;
    float *init = calloc(n, 4), *grad = malloc(n * 4), *out = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        grad[i] = 1.0f;
    int key;
    if ((rc = cfx_ps_register(ps, "bench", CFX_DTYPE_F32, n, init, &key)) != CFX_OK) {
        fprintf(stderr, "register: %s\n", cfx_last_error());
        cfx_ps_destroy(ps);
        cfx_context_destroy(ctx);
        return 1;
    }
    int bal_end = o.n_static + o.n_warm + o.n_steps;
    int total = bal_end + o.n_recover, rec_from = total - o.n_steps;
    double t_static = 0, t_bal = 0, t_rec = 0, t0 = 0, t_lift = 0, back_s = -1;
    int back_step = -1; /* recovery steps until server 1 owned more blocks */
    static char flag = 1;
    struct cfx_ps_stats before, after, rec = { 0 }, now;
    cfx_ps_stats(ps, &before);
    for (int step = 0; step < total && status == 0; step++) {
        if (step == 0)
            t0 = now_s();
        if (step == o.n_static) {
            t_static = now_s() - t0;
            if (p.index == 0 && (rc = cfx_ps_set_auto(ctx, JOB, 1, 10000)) != CFX_OK) {
                fprintf(stderr, "auto on: %s\n", cfx_last_error());
                status = 1;
            }
        }
        if (step == o.n_static + o.n_warm) {
            cfx_ps_stats(ps, &after);
            t0 = now_s();
        }
        if (step == bal_end) {
            t_bal = now_s() - t0;
            struct cfx_object_id id;
            t_lift = now_s();
            if (p.index == 0 && (cfx_object_id_from_name(JOB "/recover", &id) != CFX_OK ||
                                 cfx_put(ctx, &id, &flag, 1, NULL) != CFX_OK)) {
                fprintf(stderr, "recover: %s\n", cfx_last_error());
                status = 1;
            }
        }
        if (step > bal_end && back_step < 0 && cfx_ps_stats(ps, &now) == CFX_OK &&
            now.nservers > 1 && after.nservers > 1 &&
            now.servers[1].blocks > after.servers[1].blocks) {
            back_step = step - bal_end;
            back_s = now_s() - t_lift;
        }
        if (o.n_recover && step == rec_from) {
            cfx_ps_stats(ps, &rec);
            t0 = now_s();
        }
        if ((rc = cfx_ps_pushpull(ps, key, grad, out)) != CFX_OK) {
            fprintf(stderr, "step %d: %s\n", step, cfx_last_error());
            status = 1;
        }
        if (out[0] != (float)(step + 1) * (float)workers || out[n - 1] != out[0]) {
            fprintf(stderr, "step %d: wrong value %g\n", step, out[0]);
            status = 1;
        }
    }
    if (o.n_recover)
        t_rec = now_s() - t0;
    else
        t_bal = now_s() - t0;
    if (p.index == 0 && status == 0) {
        double r_static = o.n_static / t_static, r_bal = o.n_steps / t_bal;
        double r_rec = o.n_recover ? o.n_steps / t_rec : 0;
        double gb = 2.0 * (double)o.bytes * workers / 1e9;
        if (o.json) {
            /* slow_blocks_*: blocks the slowed server 1 owned in each phase */
            printf("{\"servers\":%d,\"workers\":%d,\"bytes\":%zu,\"block\":%zu,\"delay_us\":%u,"
                   "\"static_steps_per_s\":%.3f,\"balanced_steps_per_s\":%.3f,\"speedup\":%.3f,"
                   "\"map_before\":%u,\"map_after\":%u,\"slow_blocks_before\":%u,"
                   "\"slow_blocks_after\":%u,\"recover_steps\":%d,\"recovered_steps_per_s\":%.3f,"
                   "\"slow_blocks_recovered\":%u,\"blocks_back_after_steps\":%d,"
                   "\"blocks_back_after_s\":%.3f}\n",
                   o.servers, workers, o.bytes, o.block, o.delay_us, r_static, r_bal,
                   r_bal / r_static, before.map_version, after.map_version,
                   before.nservers > 1 ? before.servers[1].blocks : 0,
                   after.nservers > 1 ? after.servers[1].blocks : 0, o.n_recover, r_rec,
                   rec.nservers > 1 ? rec.servers[1].blocks : 0, back_step, back_s);
        } else {
            printf("%-22s : %d (server 1 slowed by %u us per request, test-only knob)\n", "servers",
                   o.servers, o.delay_us);
            printf("%-22s : %d\n", "workers", workers);
            printf("%-22s : %zu bytes f32, blocks of %zu bytes\n", "tensor", o.bytes, o.block);
            printf("%-22s : BSP push-pull, summing servers\n", "step");
            printf("\n%-12s %7s %10s %10s %12s  %s\n", "phase", "steps", "time_s", "steps/s",
                   "GB/s", "blocks per server");
            static const char *const names[] = { "static", "rebalanced", "recovered" };
            const struct cfx_ps_stats *sts[] = { &before, &after, &rec };
            const double ts[] = { t_static, t_bal, t_rec };
            for (int ph = 0; ph < (o.n_recover ? 3 : 2); ph++) {
                char own[192];
                blocks_of(sts[ph], own, sizeof(own));
                int steps = ph ? o.n_steps : o.n_static;
                printf("%-12s %7d %10.3f %10.2f %12.3f  %s\n", names[ph], steps, ts[ph],
                       steps / ts[ph], gb * steps / ts[ph], own);
            }
            if (after.map_version != before.map_version)
                printf("\n# speed-up after rebalancing: %.2fx\n", r_bal / r_static);
            else /* the same map both times: any difference is noise, not rebalancing */
                printf("\n# no rebalance: the second phase ran on the same map (%.2fx)\n",
                       r_bal / r_static);
            if (o.n_recover && back_step >= 0)
                printf("# server 1 recovered: blocks back after %d steps (%.2f s); recovered "
                       "phase %.2fx the rebalanced one\n",
                       back_step, back_s, r_rec / r_bal);
            else if (o.n_recover)
                printf("# server 1 recovered: no blocks back in %d steps\n", o.n_recover);
        }
        /* with no straggler (-D 0) there is nothing to move: the run times
         * the static split (docs/PARAMETER_SERVER.md, the cost of a block) */
        if (after.map_version == before.map_version && o.delay_us) {
            fprintf(stderr, "no rebalance happened during the warm-up steps\n");
            status = 1;
        }
        if (o.n_recover && back_step < 0) {
            fprintf(stderr, "server 1 got no blocks back in the %d steps after it recovered\n",
                    o.n_recover);
            status = 1;
        }
    }
    cfx_ps_destroy(ps);
    free(init);
    free(grad);
    free(out);
    cfx_context_destroy(ctx);
    return status;
}

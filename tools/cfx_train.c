/*
 * cfx_train: data-parallel training of a small MLP through the parameter
 * server (the demo's job), or with group allreduce for comparison.
 *
 *   cfx_run -n 6 cfx_train [--epochs N] [--batch B] [--slow-us US] [--allreduce]
 *
 * Ranks 0 and 1 are parameter servers (server 0 also schedules), ranks 2..5
 * the four workers.  The data set is synthetic and deterministic: 4 classes,
 * each a mixture of two Gaussian clusters in 32 dimensions placed so that no
 * linear model separates them; 8192 training samples (a quarter per worker)
 * and 2048 test samples.  The model is 32 -> 64 (ReLU) -> 4 (softmax), one
 * flat f32 tensor of 2372 parameters split into 1 KiB blocks.
 *
 * Worker 0 initializes the model and broadcasts it to the other workers
 * (group broadcast); it registers the tensor with the servers, which run
 * momentum SGD on the workers' mean gradient (BSP).  Halfway through, server
 * 1 is made slow (a per-request delay, the demo stand-in for a busy or
 * badly placed server): the scheduler sees it, moves most of its blocks to
 * server 0, and the samples per second recover.  Every epoch prints loss,
 * accuracy, samples per second and the blocks per server; the run ends with
 * the test accuracy.  --allreduce trains the same model on the same data
 * with cfx_group_allreduce of the gradients and the same update on every
 * worker (the servers then have nothing to do).
 */
#include <conflux/conflux.h>

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"

#define JOB      "train"
#define NSERVERS 2
#define D        32
#define H        64
#define C        4
#define NTRAIN   8192
#define NTEST    2048
#define NPARAM   (H * D + H + C * H + C)
#define LR       0.1
#define MU       0.9

static int epochs = 8, batch = 32, slow_us = 1500, use_allreduce = 0;

/* this process's context and workers' group, for DIE */
static struct cfx_context *train_ctx;
static struct cfx_group *train_group;

/* Say what failed, leave the cluster (a process that only exits is listed
 * as dead by the coordinator) and exit 1. */
#define DIE(...)                                     \
    do {                                             \
        fprintf(stderr, __VA_ARGS__);                \
        fprintf(stderr, ": %s\n", cfx_last_error()); \
        if (train_group)                             \
            cfx_group_destroy(train_group);          \
        if (train_ctx)                               \
            cfx_context_destroy(train_ctx);          \
        exit(1);                                     \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- deterministic data --------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(void)
{
    return (double)(rng() >> 11) / 9007199254740992.0;
}

static double gauss(void)
{
    double u = uniform() + 1e-12, v = uniform();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float xs[NTRAIN + NTEST][D];
static int ys[NTRAIN + NTEST];

static void make_data(void)
{
    double centers[2 * C][D];
    rng_state = 2024;
    for (int k = 0; k < 2 * C; k++)
        for (int j = 0; j < D; j++)
            centers[k][j] = 1.6 * (uniform() - 0.5);
    for (int i = 0; i < NTRAIN + NTEST; i++) {
        int k = (int)(rng() % (2 * C)); /* cluster k belongs to class k % C */
        ys[i] = k % C;
        for (int j = 0; j < D; j++)
            xs[i][j] = (float)(centers[k][j] + 0.9 * gauss());
    }
}

/* ---- the model -------------------------------------------------------------------- */

struct model {
    const float *w1, *b1, *w2, *b2;
};

static struct model view(const float *p)
{
    return (struct model){ p, p + H * D, p + H * D + H, p + H * D + H + C * H };
}

/* Loss of sample i; adds its gradient into g (when non-NULL). */
static double sample(const float *p, int i, float *g, int *correct)
{
    struct model m = view(p);
    float h[H], z[C];
    for (int a = 0; a < H; a++) {
        float s = m.b1[a];
        for (int j = 0; j < D; j++)
            s += m.w1[a * D + j] * xs[i][j];
        h[a] = s > 0 ? s : 0;
    }
    float zmax = -1e30f;
    for (int c = 0; c < C; c++) {
        float s = m.b2[c];
        for (int a = 0; a < H; a++)
            s += m.w2[c * H + a] * h[a];
        z[c] = s;
        zmax = s > zmax ? s : zmax;
    }
    double sum = 0;
    for (int c = 0; c < C; c++)
        sum += exp(z[c] - zmax);
    int best = 0;
    for (int c = 1; c < C; c++)
        best = z[c] > z[best] ? c : best;
    *correct += best == ys[i];
    double loss = -(z[ys[i]] - zmax - log(sum));
    if (!g)
        return loss;
    struct model gm = view(g);
    float *gw1 = (float *)gm.w1, *gb1 = (float *)gm.b1, *gw2 = (float *)gm.w2,
          *gb2 = (float *)gm.b2;
    float dz[C], dh[H] = { 0 };
    for (int c = 0; c < C; c++)
        dz[c] = (float)(exp(z[c] - zmax) / sum) - (c == ys[i]);
    for (int c = 0; c < C; c++) {
        gb2[c] += dz[c];
        for (int a = 0; a < H; a++) {
            gw2[c * H + a] += dz[c] * h[a];
            dh[a] += m.w2[c * H + a] * dz[c];
        }
    }
    for (int a = 0; a < H; a++) {
        if (h[a] <= 0)
            continue;
        gb1[a] += dh[a];
        for (int j = 0; j < D; j++)
            gw1[a * D + j] += dh[a] * xs[i][j];
    }
    return loss;
}

/* ---- servers ------------------------------------------------------------------------ */

struct slow_arg {
    struct cfx_context *ctx;
    struct cfx_ps *ps;
};

static void *slow_watch(void *arg)
{
    struct slow_arg *a = arg;
    static uint8_t b; /* a got object stays served from this buffer */
    size_t sz;
    struct cfx_object_id id;
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = -1 };
    cfx_object_id_from_name("train/slow-server-1", &id);
    if (cfx_get(a->ctx, &id, &b, 1, &sz, &op) == CFX_OK && b)
        cfx_ps_server_set_delay(a->ps, (uint32_t)slow_us);
    return NULL;
}

static int run_server(struct cfx_context *ctx, int index, int workers)
{
    struct cfx_ps_params p = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_BLOCK_SIZE | CFX_PS_PARAM_OPTIMIZER | CFX_PS_PARAM_BALANCE,
        .job = JOB,
        .role = CFX_PS_SERVER,
        .index = index,
        .num_workers = workers,
        .num_servers = NSERVERS,
        .block_size = 1024,
        .optim = { .type = CFX_PS_OPT_MOMENTUM,
                   .lr = LR,
                   .momentum = MU,
                   .grad_scale = 1.0 / workers },
        .balance = { .enabled = 1,
                     .interval_ms = 400,
                     .straggler_factor = 1.5,
                     .min_gain = 0.2,
                     .explore = 0.05,
                     .report_ms = 100 },
    };
    struct cfx_ps *ps;
    if (cfx_ps_create(ctx, &p, &ps) != CFX_OK)
        DIE("server %d: cannot join the job", index);
    pthread_t t;
    struct slow_arg a = { ctx, ps };
    if (index == 1)
        pthread_create(&t, NULL, slow_watch, &a);
    int rc;
    while ((rc = cfx_ps_serve(ps, 1000)) == CFX_ERR_TIMEOUT)
        ;
    if (index == 1)
        pthread_join(t, NULL);
    cfx_ps_destroy(ps);
    return rc != CFX_OK;
}

/* ---- workers ------------------------------------------------------------------------- */

static void blocks_line(struct cfx_ps *ps, char *buf, size_t len)
{
    struct cfx_ps_stats st;
    buf[0] = '\0';
    if (!ps || cfx_ps_stats(ps, &st) != CFX_OK)
        return;
    size_t off = (size_t)snprintf(buf, len, "map %2u, blocks", st.map_version);
    for (uint32_t s = 0; s < st.nservers && off < len; s++)
        off += (size_t)snprintf(buf + off, len - off, " s%u:%u%s", s, st.servers[s].blocks,
                                st.servers[s].straggler ? "(slow)" : "");
}

static int run_worker(struct cfx_context *ctx, int w, int workers)
{
    struct cfx_group_params gp = { .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK |
                                                 CFX_GROUP_PARAM_SIZE,
                                   .name = "train-workers",
                                   .rank = w,
                                   .size = workers };
    struct cfx_group *g;
    if (cfx_group_create(ctx, &gp, &g) != CFX_OK)
        DIE("worker %d: cannot join the workers' group", w);
    train_group = g;

    /* worker 0 initializes; everyone gets the same model by broadcast */
    float *params = malloc(NPARAM * sizeof(float)), *grad = malloc(NPARAM * sizeof(float));
    float *vel = calloc(NPARAM, sizeof(float));
    if (w == 0) {
        rng_state = 7;
        for (int i = 0; i < NPARAM; i++)
            params[i] = (float)(gauss() * (i < H * D               ? sqrt(2.0 / D)
                                           : i < H * D + H         ? 0
                                           : i < H * D + H + C * H ? sqrt(2.0 / H)
                                                                   : 0));
    }
    if (cfx_group_broadcast(g, params, NPARAM, CFX_DTYPE_F32, 0, NULL) != CFX_OK)
        DIE("worker %d: broadcast of the initial model", w);

    struct cfx_ps *ps = NULL;
    int key = -1;
    if (!use_allreduce) {
        struct cfx_ps_params p = {
            .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                          CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS,
            .job = JOB,
            .role = CFX_PS_WORKER,
            .index = w,
            .num_workers = workers,
            .num_servers = NSERVERS,
        };
        if (cfx_ps_create(ctx, &p, &ps) != CFX_OK)
            DIE("worker %d: cannot join the job", w);
        if (cfx_ps_register(ps, "mlp", CFX_DTYPE_F32, NPARAM, params, &key) != CFX_OK)
            DIE("worker %d: register", w);
    }
    if (w == 0)
        printf("%s: %d workers, %s; MLP %d-%d-%d (%d parameters), %d training samples, "
               "batch %d per worker\n",
               use_allreduce ? "allreduce" : "parameter server", workers,
               use_allreduce ? "momentum SGD on every worker"
                             : "2 servers running momentum SGD, BSP",
               D, H, C, NPARAM, NTRAIN, batch);

    int per = NTRAIN / workers, steps = per / batch;
    int status = 0;
    for (int e = 0; e < epochs && !status; e++) {
        if (e == epochs / 2 && w == 0 && !use_allreduce) {
            static uint8_t one = 1;
            struct cfx_object_id id;
            cfx_object_id_from_name("train/slow-server-1", &id);
            cfx_put(ctx, &id, &one, 1, NULL);
            printf("-- epoch %d: server 1 becomes slow (%d us per request) --\n", e + 1, slow_us);
        }
        double t0 = now_s(), stats[2] = { 0, 0 };
        int correct = 0;
        for (int s = 0; s < steps; s++) {
            memset(grad, 0, NPARAM * sizeof(float));
            for (int b = 0; b < batch; b++) {
                /* a deterministic shuffle of the worker's shard per epoch */
                int i =
                    w * per + (int)(((uint64_t)(s * batch + b) * 2654435761u + (uint64_t)e * 97) %
                                    (uint64_t)per);
                stats[0] += sample(params, i, grad, &correct);
            }
            for (int i = 0; i < NPARAM; i++)
                grad[i] /= (float)batch;
            int rc;
            if (use_allreduce) {
                rc = cfx_group_allreduce(g, grad, grad, NPARAM, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
                for (int i = 0; rc == CFX_OK && i < NPARAM; i++) {
                    /* the servers' momentum rule, in the same arithmetic */
                    double gi = (1.0 / workers) * (double)grad[i];
                    vel[i] = (float)(MU * (double)vel[i] + gi);
                    params[i] = (float)((double)params[i] - LR * (double)vel[i]);
                }
            } else {
                rc = cfx_ps_pushpull(ps, key, grad, params);
            }
            if (rc != CFX_OK) {
                fprintf(stderr, "worker %d: step %d: %s\n", w, s, cfx_last_error());
                status = 1;
                break;
            }
        }
        double dt = now_s() - t0;
        stats[1] = correct;
        if (status || cfx_group_allreduce(g, stats, stats, 2, CFX_DTYPE_F64, CFX_OP_SUM, NULL))
            break;
        if (w == 0) {
            char line[160];
            blocks_line(ps, line, sizeof(line));
            double n = (double)steps * batch * workers;
            printf("epoch %2d  loss %.4f  train acc %5.1f%%  %8.0f samples/s  %s\n", e + 1,
                   stats[0] / n, 100.0 * stats[1] / n, n / dt, line);
            fflush(stdout);
        }
    }
    if (w == 0 && !status) {
        int correct = 0;
        double loss = 0;
        for (int i = NTRAIN; i < NTRAIN + NTEST; i++)
            loss += sample(params, i, NULL, &correct);
        printf("final: test loss %.4f, test accuracy %.1f%% (%d/%d)\n", loss / NTEST,
               100.0 * correct / NTEST, correct, NTEST);
        if (100.0 * correct / NTEST < 80.0) {
            fprintf(stderr, "the model did not learn (accuracy under 80%%)\n");
            status = 1;
        }
    }
    if (w == 0 && use_allreduce) {
        /* the servers wait for the slow signal only in parameter-server mode */
    }
    cfx_ps_destroy(ps);
    train_group = NULL;
    cfx_group_destroy(g);
    free(params);
    free(grad);
    free(vel);
    return status;
}

int main(int argc, char **argv)
{
    int help = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help = 1;
            goto usage;
        }
        if (!strcmp(a, "--allreduce")) {
            use_allreduce = 1;
            continue;
        }
        if (!strcmp(a, "--epochs") || !strcmp(a, "--batch") || !strcmp(a, "--slow-us")) {
            if (!v) {
                fprintf(stderr, "cfx_train: %s needs a value\n", a);
                goto usage;
            }
            i++;
        } else {
            fprintf(stderr, "cfx_train: unknown argument '%s'\n", a);
            goto usage;
        }
        if (!strcmp(a, "--epochs"))
            bad = tool_arg_int("cfx_train", a, v, 1, 1000000, "a number of epochs", &epochs);
        else if (!strcmp(a, "--batch"))
            bad = tool_arg_int("cfx_train", a, v, 1, NTRAIN, "a batch size", &batch);
        else
            bad = tool_arg_int("cfx_train", a, v, 0, 10000000, "a delay in us", &slow_us);
        if (bad)
            return TOOL_EXIT_USAGE;
    }
    int rank = atoi(getenv("CFX_RANK") ? getenv("CFX_RANK") : "0");
    int world = atoi(getenv("CFX_WORLD_SIZE") ? getenv("CFX_WORLD_SIZE") : "1");
    int workers = world - NSERVERS;
    if (workers < 1 || epochs < 1 || batch < 1 || NTRAIN / workers / batch < 1) {
        fprintf(stderr, "cfx_train: run with more than %d ranks (cfx_run -n 6)\n", NSERVERS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    make_data();
    if (use_allreduce && rank < NSERVERS)
        return 0; /* no servers in allreduce mode */
    struct cfx_context *ctx;
    if (cfx_context_create(NULL, &ctx) != CFX_OK)
        DIE("cannot join the cluster");
    train_ctx = ctx;
    int rc = rank < NSERVERS ? run_server(ctx, rank, workers)
                             : run_worker(ctx, rank - NSERVERS, workers);
    cfx_context_destroy(ctx);
    return rc;
usage:
    fprintf(help ? stdout : stderr,
            "usage: cfx_run -n 6 %s [--epochs N] [--batch B] [--slow-us US] [--allreduce]\n"
            "  --epochs N    1..1000000 (default 8)\n"
            "  --batch B     samples per step, 1..%d (default 32)\n"
            "  --slow-us US  delay of the slow server, 0..10000000 (default 1500)\n",
            argv[0], NTRAIN);
    return help ? 0 : TOOL_EXIT_USAGE;
}

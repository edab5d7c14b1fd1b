/*
 * mpi_coll: MPI_Bcast, MPI_Reduce, MPI_Allreduce, MPI_Barrier and a
 * send/receive ring timed the way cfx_coll_perf times the group collectives,
 * with the same flags and the same nccl-tests columns, so that the two
 * tables can be set side by side.
 *
 *   mpicc -O2 -o mpi_coll test/mpi/mpi_coll.c
 *   mpirun -np 4 ./mpi_coll -o allreduce -b 1M -e 64M -f 2 -n 10 -w 2
 *
 * time: a barrier, then -n calls; each rank's mean per call, the maximum
 * over the ranks.  algbw = size / time; busbw = algbw * 2(n-1)/n for
 * allreduce, * 1 for broadcast, reduce and sendrecv.  Data: float; -c 1
 * checks the result of one extra call (inputs are small integers, so sums
 * are exact).
 *
 * sendrecv is cfx_coll_perf's: rank r sends to r+1 and receives from r-1,
 * even ranks sending first, odd ranks receiving first, with blocking
 * MPI_Send / MPI_Recv.  With 2 ranks one call is a ping-pong, a whole round
 * trip (half of it is the usual one-way latency).  sendburst is cfx_coll_perf's
 * too: even ranks send 128 messages in a row to r+1, then receive one from
 * r-1; odd ranks receive the 128, then send one (an even number of ranks).  barrier has no size: it
 * runs once per listed size, like cfx_coll_perf's.
 */
#include <mpi.h>

#include <ctype.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum op { OP_BCAST, OP_REDUCE, OP_ALLREDUCE, OP_SENDRECV, OP_SENDBURST, OP_BARRIER, OP_LAST };

static const char *op_names[] = { "broadcast", "reduce",    "allreduce",
                                  "sendrecv",  "sendburst", "barrier" };

struct opts {
    enum op op;
    size_t min_bytes, max_bytes;
    long factor, iters, warmup;
    int root, check, json;
};

static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'G':
        v <<= 30;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mpi_coll [-o broadcast|reduce|allreduce|sendrecv|sendburst|barrier]\n"
               "                [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-r ROOT]\n"
               "                [-c 0|1] [--json]\n"
               "  sizes take K/M/G suffixes; defaults: allreduce, 32M..32M, x2, 20 iters,\n"
               "  5 warm-up, root 0, check 1; data type float, sum\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option lopts[] = {
        { "op", required_argument, NULL, 'o' },
        { "minbytes", required_argument, NULL, 'b' },
        { "maxbytes", required_argument, NULL, 'e' },
        { "stepfactor", required_argument, NULL, 'f' },
        { "iters", required_argument, NULL, 'n' },
        { "warmup_iters", required_argument, NULL, 'w' },
        { "root", required_argument, NULL, 'r' },
        { "check", required_argument, NULL, 'c' },
        { "json", no_argument, NULL, 'J' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, i;
    memset(o, 0, sizeof(*o));
    o->op = OP_ALLREDUCE;
    o->min_bytes = o->max_bytes = 32u << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    while ((c = getopt_long(argc, argv, "o:b:e:f:n:w:r:c:h", lopts, NULL)) != -1) {
        switch (c) {
        case 'o':
            for (i = 0; i < OP_LAST && strcasecmp(optarg, op_names[i]); i++)
                ;
            if (i == OP_LAST && strcasecmp(optarg, "bcast"))
                return -1;
            o->op = i == OP_LAST ? OP_BCAST : (enum op)i;
            break;
        case 'b':
            if (parse_size(optarg, &o->min_bytes))
                return -1;
            break;
        case 'e':
            if (parse_size(optarg, &o->max_bytes))
                return -1;
            break;
        case 'f': o->factor = atol(optarg); break;
        case 'n': o->iters = atol(optarg); break;
        case 'w': o->warmup = atol(optarg); break;
        case 'r': o->root = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'J': o->json = 1; break;
        case 'h': usage(stdout); exit(0);
        default: return -1;
        }
    }
    if (optind < argc || o->factor < 2 || o->iters < 1 || o->warmup < 0 || o->root < 0 ||
        o->min_bytes > o->max_bytes)
        return -1;
    return 0;
}

static float input(int rank, size_t i)
{
    return (float)((rank * 7 + i * 13) % 16);
}

static void sendrecv(float *send, float *recv, int count)
{
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    if (n == 1) {
        memmove(recv, send, (size_t)count * sizeof(float));
    } else if (rank % 2 == 0) {
        MPI_Send(send, count, MPI_FLOAT, next, 0, MPI_COMM_WORLD);
        MPI_Recv(recv, count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(recv, count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(send, count, MPI_FLOAT, next, 0, MPI_COMM_WORLD);
    }
}

#define SENDBURST_N 128

static void sendburst(float *send, float *recv, int count)
{
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    if (n == 1) {
        memmove(recv, send, (size_t)count * sizeof(float));
    } else if (rank % 2 == 0) {
        for (int i = 0; i < SENDBURST_N; i++)
            MPI_Send(send, count, MPI_FLOAT, next, 0, MPI_COMM_WORLD);
        MPI_Recv(recv, count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        for (int i = 0; i < SENDBURST_N; i++)
            MPI_Recv(recv, count, MPI_FLOAT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(send, count, MPI_FLOAT, next, 0, MPI_COMM_WORLD);
    }
}

static void call(const struct opts *o, float *send, float *recv, int count)
{
    switch (o->op) {
    case OP_SENDRECV: sendrecv(send, recv, count); break;
    case OP_SENDBURST: sendburst(send, recv, count); break;
    case OP_BARRIER: MPI_Barrier(MPI_COMM_WORLD); break;
    case OP_BCAST: MPI_Bcast(recv, count, MPI_FLOAT, o->root, MPI_COMM_WORLD); break;
    case OP_REDUCE:
        MPI_Reduce(send, recv, count, MPI_FLOAT, MPI_SUM, o->root, MPI_COMM_WORLD);
        break;
    default: MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    }
}

static long check(const struct opts *o, float *send, float *recv, int count, int rank, int n)
{
    long wrong = 0;
    for (int i = 0; i < count; i++) {
        send[i] = input(rank, (size_t)i);
        recv[i] = o->op == OP_BCAST && rank == o->root ? input(rank, (size_t)i) : -1.0f;
    }
    call(o, send, recv, count);
    if ((o->op == OP_REDUCE && rank != o->root) || o->op == OP_BARRIER)
        return 0;
    for (int i = 0; i < count; i++) {
        float want = 0;
        if (o->op == OP_SENDRECV || o->op == OP_SENDBURST)
            want = input((rank + n - 1) % n, (size_t)i);
        else if (o->op == OP_BCAST)
            want = input(o->root, (size_t)i);
        else
            for (int r = 0; r < n; r++)
                want += input(r, (size_t)i);
        wrong += recv[i] != want;
    }
    return wrong;
}

int main(int argc, char **argv)
{
    struct opts o;
    int rank, n, rows = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (parse(argc, argv, &o) || o.root >= n) {
        if (rank == 0)
            usage(stderr);
        MPI_Finalize();
        return 2;
    }
    size_t maxcount = o.max_bytes / sizeof(float);
    if (maxcount > INT32_MAX) {
        if (rank == 0)
            fprintf(stderr, "mpi_coll: -e too large for an int count\n");
        MPI_Finalize();
        return 2;
    }
    float *send = malloc((maxcount ? maxcount : 1) * sizeof(float));
    float *recv = malloc((maxcount ? maxcount : 1) * sizeof(float));
    if (!send || !recv) {
        fprintf(stderr, "mpi_coll: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, maxcount * sizeof(float));
    memset(recv, 0, maxcount * sizeof(float));
    double factor = o.op == OP_ALLREDUCE ? 2.0 * (n - 1) / n : 1.0;
    int root = o.op == OP_BCAST || o.op == OP_REDUCE ? o.root : -1;
    const char *redop = o.op == OP_REDUCE || o.op == OP_ALLREDUCE ? "sum" : "none";

    if (rank == 0) {
        if (o.json)
            printf("{\"tool\":\"mpi_coll\",\"op\":\"%s\",\"nranks\":%d,\"datatype\":\"float\","
                   "\"redop\":\"%s\",\"root\":%d,\"iters\":%ld,\"warmup\":%ld,\"results\":[",
                   op_names[o.op], n, redop, root, o.iters, o.warmup);
        else {
            printf("# MPI %s test: nRanks %d minBytes %zu maxBytes %zu step: %ld(factor) "
                   "warmup iters: %ld iters: %ld validation: %d\n",
                   op_names[o.op], n, o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters,
                   o.check);
            printf("#\n# %10s  %12s  %8s  %6s  %6s           out-of-place          \n", "", "", "",
                   "", "");
            printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
                   "redop", "root", "time", "algbw", "busbw", "#wrong");
            printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
                   "", "(us)", "(GB/s)", "(GB/s)", "");
        }
        fflush(stdout);
    }

    double bw_sum = 0;
    long bw_count = 0, wrong_total = 0;
    for (size_t size = o.min_bytes;; size = size ? size * (size_t)o.factor : 1) {
        int count = o.op == OP_BARRIER ? 0 : (int)(size / sizeof(float));
        size_t bytes = (size_t)count * sizeof(float);
        if (count || o.op == OP_BARRIER) {
            for (long i = 0; i < o.warmup; i++)
                call(&o, send, recv, count);
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            for (long i = 0; i < o.iters; i++)
                call(&o, send, recv, count);
            t = (MPI_Wtime() - t) / (double)o.iters;
            double tmax = 0;
            MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            long wrong = o.check ? check(&o, send, recv, count, rank, n) : 0, wsum = 0;
            MPI_Allreduce(&wrong, &wsum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
            wrong_total += wsum;
            double algbw = tmax > 0 ? (double)bytes / tmax / 1e9 : 0, busbw = algbw * factor;
            bw_sum += busbw;
            bw_count++;
            if (rank == 0) {
                double us = tmax * 1e6;
                if (o.json)
                    printf("%s{\"size\":%zu,\"count\":%d,\"type\":\"float\",\"redop\":\"%s\","
                           "\"root\":%d,\"inplace\":0,\"time_us\":%.3f,\"algbw\":%.6f,"
                           "\"busbw\":%.6f,\"wrong\":%ld}",
                           rows++ ? "," : "", bytes, count, redop, root, us, algbw, busbw, wsum);
                else {
                    printf("%12zu  %12d  %8s  %6s  %6d", bytes, count, "float", redop, root);
                    printf(us >= 10000.0 ? "  %7.0f" : us >= 100.0 ? "  %7.1f" : "  %7.2f", us);
                    printf("  %6.2f  %6.2f", algbw, busbw);
                    if (o.check)
                        printf("  %5ld\n", wsum);
                    else
                        printf("  %5s\n", "N/A");
                }
                fflush(stdout);
            }
        }
        if (size > o.max_bytes / (size_t)o.factor)
            break;
    }
    if (rank == 0) {
        double avg = bw_count ? bw_sum / (double)bw_count : 0;
        if (o.json)
            printf("],\"wrong\":%ld,\"avg_busbw\":%.6f}\n", wrong_total, avg);
        else
            printf("# Out of bounds values : %ld %s\n# Avg bus bandwidth    : %g \n#\n",
                   wrong_total, wrong_total ? "FAILED" : "OK", avg);
        fflush(stdout);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return wrong_total ? 1 : 0;
}

/*
 * Multi-process group collectives over tcp and shm: cfx_run starts an
 * embedded coordinator and N ranks of cfx_colltest, which compare every
 * result bit for bit with a reference and exit non-zero on the first
 * difference or unexpected status.
 *
 * Budget (2 cores): the full collective x dtype x op matrix runs at small
 * sizes for 1..8 ranks with a 16 KiB pipeline segment so that a few
 * thousand elements already take several segments; 64 MiB float sum
 * allreduce / broadcast / reduce run for 2 and 8 ranks; every schedule is
 * also forced for a whole run through CFX_ALGO.
 *
 * CFX_TEST_SUBSET=1 (scripts/test.sh sets it for the runs again under the
 * sanitizers and with the reduction kernels capped, where the full matrix
 * already passed in the plain run) keeps every test and every schedule but
 * fewer group sizes: tcp 2 and 5, shm 3 and 8 ranks for the matrix; one
 * 10-rank group; 64 MiB for 2 ranks on tcp and 8 on shm.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

/* Run cfx_run with the given environment and arguments; its exit status. */
static int run(const char *env, int n, const char *tp, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "%s %s/cfx_run -n %d --transport %s --timeout 200 %s/cfx_colltest %s", env,
             CFX_BIN_DIR, n, tp, CFX_BIN_DIR, args);
    cr_log_info("%s", cmd);
    int st = system(cmd);
    cr_assert(st != -1, "cannot run %s", cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#include "dpdk_run.h" /* run_dpdk() */

struct case_param {
    char tp[8]; /* arrays, not pointers: Criterion runs each test in a fresh process */
    int n;
};

static int subset(void)
{
    const char *s = getenv("CFX_TEST_SUBSET");
    return s && s[0] == '1';
}

/* @p full, or its cases whose (transport, ranks) are in @p keep. */
static struct criterion_test_params pick(struct case_param *full, size_t n,
                                         const struct case_param *keep, size_t nkeep)
{
    if (!subset())
        return cr_make_param_array(struct case_param, full, n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < nkeep; j++)
            if (!strcmp(full[i].tp, keep[j].tp) && full[i].n == keep[j].n) {
                full[k++] = full[i];
                break;
            }
    return cr_make_param_array(struct case_param, full, k);
}

static struct case_param all_sizes[] = {
    { "tcp", 1 }, { "tcp", 2 }, { "tcp", 3 }, { "tcp", 4 }, { "tcp", 5 }, { "tcp", 6 },
    { "tcp", 7 }, { "tcp", 8 }, { "shm", 1 }, { "shm", 2 }, { "shm", 3 }, { "shm", 4 },
    { "shm", 5 }, { "shm", 6 }, { "shm", 7 }, { "shm", 8 },
};

ParameterizedTestParameters(coll, matrix)
{
    static const struct case_param keep[] = { { "tcp", 2 }, { "tcp", 5 }, { "shm", 3 },
                                              { "shm", 8 } };
    return pick(all_sizes, sizeof(all_sizes) / sizeof(all_sizes[0]), keep, 4);
}

/* Every collective x dtype x op x size, every schedule forced once,
 * argument mismatches, non-blocking forms, send/recv and re-creation. */
ParameterizedTest(struct case_param *p, coll, matrix, .timeout = 240)
{
    int rc = run("CFX_COLL_SEG=16384", p->n, p->tp, "matrix mismatch nb misc");
    cr_assert_eq(rc, 0, "collective matrix over %s with %d ranks: cfx_run exited %d", p->tp,
                 p->n, rc);
}

/* CFX_COLL_CHECK=2: every rank's header against every other's, so every
 * rank fails a call whose ranks disagree and an in-place call that fails
 * has written nothing (the default checks along the messages). */
Test(coll, mismatch_all_ranks, .timeout = 120)
{
    int rc = run("CFX_COLL_CHECK=2 CFX_COLL_SEG=16384", 4, "tcp", "mismatch");
    cr_assert_eq(rc, 0, "mismatches with CFX_COLL_CHECK=2 over tcp with 4 ranks: cfx_run "
                 "exited %d", rc);
    rc = run("CFX_COLL_CHECK=2", 10, "shm", "mismatch");
    cr_assert_eq(rc, 0, "mismatches with CFX_COLL_CHECK=2 over shm with 10 ranks: cfx_run "
                 "exited %d", rc);
}

static struct case_param large_groups[] = { { "tcp", 10 }, { "shm", 10 } };

ParameterizedTestParameters(coll, large_group)
{
    static const struct case_param keep[] = { { "shm", 10 } };
    return pick(large_groups, 2, keep, 1);
}

/* Beyond 8 ranks the argument headers go round a dissemination pattern
 * before any data (and a barrier is that pattern): the same matrix,
 * mismatches and re-creation as above. */
ParameterizedTest(struct case_param *p, coll, large_group, .timeout = 240)
{
    int rc = run("CFX_COLL_SEG=16384", p->n, p->tp, "matrix mismatch nb misc");
    cr_assert_eq(rc, 0, "collective matrix over %s with %d ranks: cfx_run exited %d", p->tp,
                 p->n, rc);
}

static struct case_param big_cases[] = {
    { "tcp", 2 }, { "tcp", 8 }, { "shm", 2 }, { "shm", 8 },
};

ParameterizedTestParameters(coll, big)
{
    static const struct case_param keep[] = { { "tcp", 2 }, { "shm", 8 } };
    return pick(big_cases, sizeof(big_cases) / sizeof(big_cases[0]), keep, 2);
}

/* 64 MiB float sum allreduce, broadcast and reduce with the default
 * (256 KiB) segments; 3 MiB + 4 B runs a partial last segment. */
ParameterizedTest(struct case_param *p, coll, big, .timeout = 240)
{
    int rc = run("", p->n, p->tp, "big 67108864 big 3145732");
    cr_assert_eq(rc, 0, "64 MiB collectives over %s with %d ranks: cfx_run exited %d", p->tp,
                 p->n, rc);
}

struct algo_param {
    char algo[8];
    char tp[8];
    int n;
};

static struct algo_param algo_cases[] = {
    { "ring", "tcp", 5 },   { "rhd", "shm", 7 },   { "dbtree", "tcp", 6 },
    { "tree", "shm", 5 },   { "chain", "tcp", 7 }, { "direct", "shm", 3 },
    { "recdbl", "shm", 6 }, { "recdbl", "tcp", 4 },
};

ParameterizedTestParameters(coll, env_algo)
{
    return cr_make_param_array(struct algo_param, algo_cases,
                               sizeof(algo_cases) / sizeof(algo_cases[0]));
}

/* CFX_ALGO forces a schedule for every call it applies to; the others
 * fall back to the tuning table. */
ParameterizedTest(struct algo_param *p, coll, env_algo, .timeout = 240)
{
    char env[64];
    snprintf(env, sizeof(env), "CFX_ALGO=%s CFX_COLL_SEG=8192", p->algo);
    int rc = run(env, p->n, p->tp, "matrix big 1000004");
    cr_assert_eq(rc, 0, "CFX_ALGO=%s over %s with %d ranks: cfx_run exited %d", p->algo, p->tp,
                 p->n, rc);
}

static struct case_param late_cases[] = { { "tcp", 4 }, { "shm", 3 } };

ParameterizedTestParameters(coll, late)
{
    return cr_make_param_array(struct case_param, late_cases, 2);
}

/* The last rank enters a broadcast and an allreduce 1 s late. */
ParameterizedTest(struct case_param *p, coll, late, .timeout = 120)
{
    int rc = run("", p->n, p->tp, "late 1000");
    cr_assert_eq(rc, 0, "late arrival over %s: cfx_run exited %d", p->tp, rc);
}

#ifdef CFX_HAVE_DPDK
/* The collective matrix over dpdk between two processes. */
Test(coll, matrix_dpdk, .timeout = 240)
{
    int rc = run_dpdk("CFX_COLL_SEG=16384", "cfx_colltest", "matrix mismatch nb misc");
    cr_assert_eq(rc, 0, "collective matrix over dpdk with 2 ranks: cfx_run exited %d", rc);
}

/* Collectives apart by more than the dpdk link's quiet time (a training
 * loop's compute): the engine naps in between, and a leaving waiter asked
 * the transports for the nap without the progress lock (an abort with the
 * thread checks on, an unlocked walk of the endpoints without). */
Test(coll, gaps_dpdk, .timeout = 240)
{
    int rc = run_dpdk("", "cfx_colltest", "gaps 12");
    cr_assert_eq(rc, 0, "allreduces after quiet spells over dpdk with 2 ranks: cfx_run exited %d",
                 rc);
}

/* A wait over dpdk polls on by itself once its spin ran out (rank 0's
 * progress thread parked: nothing else would poll for it). */
Test(coll, waiter_polls_dpdk, .timeout = 240)
{
    int rc = run_dpdk("", "cfx_colltest", "waiterpoll");
    cr_assert_eq(rc, 0, "waiter polling over dpdk with 2 ranks: cfx_run exited %d", rc);
}

/* EAL's runtime directory of a rank that was killed (its exit handler never
 * ran: /var/run/dpdk/cfx<pid>) is removed by the next process that starts
 * EAL with the default prefix; one of a live process stays. */
Test(coll, dpdk_dead_ranks_runtime_dirs_go, .timeout = 240)
{
    if (geteuid() != 0)
        cr_skip_test("EAL keeps its runtime directories under /var/run/dpdk for root only");
    pid_t dead = fork();
    cr_assert_neq(dead, -1);
    if (dead == 0)
        _exit(0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    char dir[64], file[96], live[64];
    snprintf(dir, sizeof(dir), "/var/run/dpdk/cfx%d", (int)dead);
    snprintf(file, sizeof(file), "%s/config", dir);
    snprintf(live, sizeof(live), "/var/run/dpdk/cfx%d", (int)getpid());
    (void)mkdir("/var/run/dpdk", 0700);
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST, "%s: %s", dir, strerror(errno));
    cr_assert(mkdir(live, 0700) == 0 || errno == EEXIST, "%s: %s", live, strerror(errno));
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    int rc = run_dpdk("", "cfx_colltest", "waiterpoll");
    struct stat st;
    bool dead_left = stat(dir, &st) == 0, live_left = stat(live, &st) == 0;
    rmdir(live);
    unlink(file);
    rmdir(dir);
    cr_assert_eq(rc, 0, "cfx_run exited %d", rc);
    cr_expect_not(dead_left, "%s (a dead process's) is still there", dir);
    cr_expect(live_left, "%s (this live process's) was removed", live);
}
#endif

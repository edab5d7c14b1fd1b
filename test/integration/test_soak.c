/*
 * Soak: 4 processes run 10,000 rounds of put / get / reduce / allreduce
 * (test/progs/cfx_soak), deleting as they go; each rank's VmRSS may grow by
 * at most RSS_MIB MiB between round 512 and the end, and the coordinator's
 * object count must be back at its round-512 value.  cfx_run --timeout
 * inside and Criterion's .timeout outside: a hang fails the test.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

struct tp_param {
    char tp[8]; /* an array, not a pointer: each test runs in a fresh process */
};

static struct tp_param tps[] = { { "tcp" }, { "shm" } };

ParameterizedTestParameters(soak, rounds_10k)
{
    return cr_make_param_array(struct tp_param, tps, 2);
}

ParameterizedTest(struct tp_param *p, soak, rounds_10k, .timeout = 240)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/cfx_run -n 4 --transport %s --timeout 180 %s/cfx_soak 10000 %s",
             CFX_BIN_DIR, p->tp, CFX_BIN_DIR,
             /* 16 MiB: growth over 10,000 rounds is 0.1-0.5 MiB, but a thread
              * or malloc arena that first appears after the warm-up can add
              * one 8 MiB step; a real leak of even 1 KiB a round exceeds it */
             "16");
    cr_log_info("%s", cmd);
    int st = system(cmd);
    cr_assert(st != -1, "cannot run %s", cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "soak over %s: cfx_run status %d", p->tp,
              st);
}

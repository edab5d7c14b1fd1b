/*
 * Object lifecycle across processes (docs/ARCHITECTURE.md, Object
 * lifecycle): one long-running conflux-coord, and each step a separate
 * cfx_lifetest process that checks every byte it gets and every status it
 * is given, exiting non-zero with a "FAIL:" line otherwise.
 *
 *  - An object goes with its last complete copy, inline (100 B) and
 *    data-plane (1 MiB) alike: once the process that put it and the one
 *    that got it exited, nobody is served it, nobody can delete it, and
 *    another process's put of the id succeeds and is what every reader gets.
 *  - Put, delete, put of one id: the delete is complete when it returns, so
 *    the second put succeeds at once, many rounds in a row.
 *  - A parameter-server job run twice against the same coordinator.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <sys/stat.h>

#include "coord_child.h"
#include "testutil.h"

static struct coord_child cc;
static char token[64];
static char dir[128], logpath[160];

static void setup(void)
{
    cfx_test_token(token, sizeof(token));
    snprintf(dir, sizeof(dir), "/tmp/cfx-lifetime-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(logpath, sizeof(logpath), "%s/coord.log", dir);
    const char *a[] = { "--port", "0", "--token", token, NULL };
    coord_child_start(&cc, logpath, 0, a);
}

static void teardown(void)
{
    char cmd[256];
    coord_child_kill(&cc, SIGTERM);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}

TestSuite(lifetime, .init = setup, .fini = teardown, .timeout = 240);

/* Run one process of @p prog @p args against the coordinator over @p tp;
 * returns its exit status (128+SIG when killed).  timeout(1) is the
 * anti-hang limit. */
static int step(const char *tp, const char *prog, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "CFX_COORD=%s CFX_TOKEN=%s CFX_TRANSPORT=%s timeout -k 5 120 "
             "%s/%s %s", cc.addr, token, tp, CFX_BIN_DIR, prog, args);
    cr_log_info("%s %s", prog, args);
    int st = system(cmd);
    cr_assert(st != -1, "cannot run %s", prog);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int life(const char *tp, const char *fmt, const char *name, size_t size, const char *x)
{
    char args[256];
    snprintf(args, sizeof(args), fmt, name, size, x);
    return step(tp, "cfx_lifetest", args);
}

struct life_case {
    char tp[8];   /* arrays, not pointers: Criterion runs each test in a fresh process */
    size_t size;
};

static struct life_case cases[] = {
    { "tcp", 100 }, { "tcp", 1u << 20 }, { "shm", 100 }, { "shm", 1u << 20 },
};

ParameterizedTestParameters(lifetime, dies_with_putter)
{
    return cr_make_param_array(struct life_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* Issue: a 100-byte object outlived its putter and shadowed the next put
 * of its id (the second put returned CFX_OK, readers got the first bytes). */
ParameterizedTest(struct life_case *p, lifetime, dies_with_putter)
{
    char name[64];
    snprintf(name, sizeof(name), "run/cfg-%s-%zu", p->tp, p->size);
    cr_assert_eq(life(p->tp, "putget %s %zu %s", name, p->size, "A"), 0,
                 "the first putter's object was not served right");
    cr_expect_eq(life(p->tp, "gone %s %zu%s", name, p->size, ""), 0,
                 "%s (%zu B) outlived its putter", name, p->size);
    cr_assert_eq(life(p->tp, "putget %s %zu %s", name, p->size, "B"), 0,
                 "a second process's put of %s (%zu B) was not what readers got", name,
                 p->size);
}

ParameterizedTestParameters(lifetime, put_delete_put)
{
    return cr_make_param_array(struct life_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* Issue: put, delete, put failed with CFX_ERR_EXISTS for about a ms. */
ParameterizedTest(struct life_case *p, lifetime, put_delete_put)
{
    char name[64];
    snprintf(name, sizeof(name), "model/weights-%s-%zu", p->tp, p->size);
    cr_assert_eq(life(p->tp, "redo %s %zu %s", name, p->size, "20"), 0,
                 "put, delete, put of %s (%zu B) over %s failed", name, p->size, p->tp);
}

ParameterizedTestParameters(lifetime, regot_one_process)
{
    return cr_make_param_array(struct life_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* Issue: a node that got a copy answered its own later gets of the id from
 * that copy after the putter deleted it (and put it again): B read 'A'
 * where A had put 'B', then 'C' in another size, then nothing.  Here B
 * reads right after A's call returns, with nothing reaching B in between:
 * the delete returns only once every holder dropped its copy. */
ParameterizedTest(struct life_case *p, lifetime, regot_one_process)
{
    char name[64], args[160];
    snprintf(name, sizeof(name), "regot1-%s-%zu", p->tp, p->size);
    snprintf(args, sizeof(args), "regot both %s %zu %zu", name, p->size, 2 * p->size + 7);
    cr_assert_eq(step(p->tp, "cfx_lifetest", args), 0,
                 "a copy of %s (%zu B) answered a get after its putter withdrew it", name,
                 p->size);
}

ParameterizedTestParameters(lifetime, regot_two_processes)
{
    return cr_make_param_array(struct life_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* The same with A and B in two processes taking turns through marker
 * objects. */
ParameterizedTest(struct life_case *p, lifetime, regot_two_processes)
{
    char cmd[1024], name[64];
    snprintf(name, sizeof(name), "regot2-%s-%zu", p->tp, p->size);
    snprintf(cmd, sizeof(cmd), "pids=; for r in put get; do CFX_COORD=%s CFX_TOKEN=%s "
             "CFX_TRANSPORT=%s timeout -k 5 120 %s/cfx_lifetest regot $r %s %zu %zu & "
             "pids=\"$pids $!\"; done; st=0; for p in $pids; do wait $p || st=1; done; "
             "exit $st", cc.addr, token, p->tp, CFX_BIN_DIR, name, p->size, 2 * p->size + 7);
    int st = system(cmd);
    cr_assert(st != -1, "cannot run cfx_lifetest");
    cr_assert_eq(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), 0,
                 "a copy of %s (%zu B) answered a get after its putter withdrew it", name,
                 p->size);
}

/* Issue: a parameter-server job run again against the same coordinator
 * failed ("cannot publish shard map 2: ... already exists"): the first
 * run's shard maps and member records outlived it.  Two runs of one job
 * (2 servers, 2 workers, every pulled value checked), one after the other,
 * each rank its own process. */
Test(lifetime, ps_job_rerun)
{
    for (int run = 0; run < 2; run++) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd),
                 "pids=; for r in 0 1 2 3; do CFX_RANK=$r CFX_LOCAL_RANK=$r CFX_WORLD_SIZE=4 "
                 "CFX_COORD=%s CFX_TOKEN=%s CFX_TRANSPORT=shm timeout -k 5 90 %s/cfx_pstest "
                 "--servers 2 --workers 2 --steps 10 & pids=\"$pids $!\"; done; st=0; "
                 "for p in $pids; do wait $p || st=1; done; exit $st",
                 cc.addr, token, CFX_BIN_DIR);
        cr_log_info("parameter-server job, run %d", run + 1);
        int st = system(cmd);
        cr_assert(st != -1, "cannot run the job");
        cr_assert_eq(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), 0,
                     "run %d of the job against one coordinator failed", run + 1);
    }
}

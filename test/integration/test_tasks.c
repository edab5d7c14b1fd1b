/*
 * Tasks and their placement across processes: a conflux-coord child, three
 * worker processes (exec'd fresh images of this binary, see the constructor
 * below) that offer the function "work" with 2 cores each (the third also 1
 * GPU), and this process submitting tasks.
 *
 * "work" (struct work_arg): optionally waits for the object "tasks/go";
 * with make, puts result 0 as size bytes of pattern(seed); else puts
 * result 0 as its node id (u32 LE) followed by every input's bytes plus 1;
 * with fail, returns CFX_ERR_INVALID instead.  Every result is checked
 * byte by byte here, and the node id in it says where it ran.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client.h"
#include "coord_run.h"
#include "dataplane/engine/engine.h"

#define CHILD_ENV "CFX_TEST_TASKS_CHILD"
#define NWORKERS  3
#define CALL_MS   30000
#define BIG       (256u * 1024) /* over the inline limit: held by its node, not the coordinator */

struct work_arg {
    uint8_t wait_go;
    uint8_t make;
    uint8_t fail;
    uint8_t linger; /* with wait_go: wait CALL_MS for "go", past the task's own deadline */
    uint32_t seed;
    uint64_t size;
};

static uint8_t pattern(uint32_t seed, size_t i)
{
    return (uint8_t)(seed * 31u + i * 7u + (i >> 9));
}

static void oid(const char *name, struct cfx_object_id *id)
{
    cr_assert_eq(cfx_object_id_from_name(name, id), CFX_OK);
}

/* ---- the worker ------------------------------------------------------------------ */

static int work(const struct cfx_task_call *call, void *arg)
{
    struct work_arg a;
    uint8_t *out = NULL;
    size_t len = 0;
    int rc = CFX_OK;
    (void)arg;

    if (call->arg_len != sizeof(a))
        return CFX_ERR_INVALID;
    memcpy(&a, call->arg, sizeof(a));
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                 .timeout_ms = a.linger ? CALL_MS : call->timeout_ms };
    if (a.wait_go) {
        struct cfx_object_id go;
        char b;
        cfx_object_id_from_name("tasks/go", &go);
        rc = cfx_get(call->ctx, &go, &b, 1, NULL, &op);
        if (rc != CFX_OK)
            return rc;
    }
    if (a.fail)
        return CFX_ERR_INVALID;
    if (a.make) {
        len = a.size;
        out = malloc(len);
        for (size_t i = 0; out && i < len; i++)
            out[i] = pattern(a.seed, i);
    } else {
        uint32_t node = cfx_context_node_id(call->ctx);
        len = 4;
        out = malloc(4);
        if (out)
            memcpy(out, &node, 4);
        for (size_t k = 0; out && k < call->n_inputs; k++) {
            void *in = NULL;
            size_t n = 0;
            rc = cfx_get_alloc(call->ctx, &call->inputs[k], &in, &n, &op);
            if (rc != CFX_OK)
                break;
            uint8_t *grown = realloc(out, len + n);
            if (!grown) {
                cfx_buf_free(call->ctx, in);
                break;
            }
            out = grown;
            for (size_t i = 0; i < n; i++)
                out[len + i] = (uint8_t)(((const uint8_t *)in)[i] + 1);
            len += n;
            cfx_buf_free(call->ctx, in);
        }
    }
    if (!out)
        return rc != CFX_OK ? rc : CFX_ERR_NOMEM;
    if (rc == CFX_OK)
        rc = cfx_task_result_put(call, 0, out, len);
    free(out);
    return rc;
}

/* "IN OUT ADDR TOKEN": join, offer "work", report the node id, serve until
 * 'D' (or the end of the pipe). */
__attribute__((constructor)) static void tasks_child_main(void)
{
    const char *spec = getenv(CHILD_ENV);
    int in, out;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %d %63s %63s", &in, &out, a, tok) != 4)
        return;
    coord_run_task_worker(a, tok, "work", work, in, out, CALL_MS);
}

/* ---- the submitter -------------------------------------------------------------- */

static struct coord_run co;
static struct coord_run_worker wk[NWORKERS];
static struct cfx_context *ctx;

static void worker_start(struct coord_run_worker *w, int gpus)
{
    const char *envs[] = { "CFX_TASK_CORES=2", gpus ? "CFX_TASK_GPUS=1" : "CFX_TASK_GPUS=0",
                           "CFX_TASK_MEMORY=1G", NULL };
    coord_run_worker_start(&co, w, CHILD_ENV, "", envs, CALL_MS);
}

static void worker_end(struct coord_run_worker *w)
{
    coord_run_worker_stop(w, 30000);
    coord_run_worker_close(w);
}

static void worker_kill(struct coord_run_worker *w)
{
    coord_run_worker_kill(w);
    coord_run_worker_close(w);
}

static void setup(void)
{
    coord_run_setup(&co, "tasks", false);
    for (int i = 0; i < NWORKERS; i++)
        worker_start(&wk[i], i == 2);
    ctx = coord_run_join(&co, CALL_MS);
}

static void teardown(void)
{
    cfx_context_destroy(ctx);
    for (int i = 0; i < NWORKERS; i++)
        worker_end(&wk[i]);
    coord_run_teardown(&co);
}

TestSuite(tasks, .init = setup, .fini = teardown, .timeout = 120);

static const struct cfx_task_params *targ(struct cfx_task_params *p, struct work_arg *a)
{
    p->field_mask = CFX_TASK_PARAM_ARG | CFX_TASK_PARAM_TIMEOUT;
    p->arg = a;
    p->arg_len = sizeof(*a);
    p->timeout_ms = CALL_MS;
    return p;
}

/* Run "work" with @p a on node @p node (0: anywhere), wait, return the node. */
static uint32_t run(const char *result, const struct cfx_object_id *inputs, size_t n,
                    struct work_arg a, uint32_t node)
{
    struct cfx_object_id r;
    struct cfx_task_params p;
    struct cfx_task_needs nd = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = &node,
                                 .n_nodes = 1 };
    struct cfx_task *t;
    uint32_t ran = 0;
    oid(result, &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", inputs, n, &r, 1, node ? &nd : NULL,
                                 targ(&p, &a), &t), CFX_OK, "submit: %s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &ran), CFX_OK, "task: %s", cfx_last_error());
    cr_assert_eq(ran, cfx_task_node(t));
    cfx_task_free(t);
    return ran;
}

/* Get @p name and check it is node id + (each expected input + 1). */
static uint32_t check_result(const char *name, const uint8_t *const *ins, const size_t *lens,
                             size_t n)
{
    struct cfx_object_id id;
    void *buf = NULL;
    size_t len = 0, want = 4;
    uint32_t node;
    oid(name, &id);
    cr_assert_eq(cfx_get_alloc(ctx, &id, &buf, &len, NULL), CFX_OK, "get %s: %s", name,
                 cfx_last_error());
    for (size_t k = 0; k < n; k++)
        want += lens[k];
    cr_assert_eq(len, want, "%s: %zu bytes, want %zu", name, len, want);
    memcpy(&node, buf, 4);
    const uint8_t *p = (const uint8_t *)buf + 4;
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < lens[k]; i++)
            cr_assert_eq(p[i], (uint8_t)(ins[k][i] + 1), "%s: input %zu byte %zu", name, k, i);
        p += lens[k];
    }
    cfx_buf_free(ctx, buf);
    return node;
}

static uint8_t *made(uint32_t seed, size_t size)
{
    uint8_t *b = malloc(size);
    cr_assert(b);
    for (size_t i = 0; i < size; i++)
        b[i] = pattern(seed, i);
    return b;
}

Test(tasks, locality_wins)
{
    /* a big input made on each worker in turn: the task reading it goes there */
    for (int w = 0; w < NWORKERS; w++) {
        char in_name[64], out_name[64];
        struct cfx_object_id in;
        struct work_arg mk = { .make = 1, .seed = 10u + (uint32_t)w, .size = BIG };
        snprintf(in_name, sizeof(in_name), "tasks/loc/in%d", w);
        snprintf(out_name, sizeof(out_name), "tasks/loc/out%d", w);
        cr_assert_eq(run(in_name, NULL, 0, mk, wk[w].node), wk[w].node);
        oid(in_name, &in);
        uint32_t placed = 0;
        cr_assert_eq(cfx_place(ctx, "work", NULL, &in, 1, &placed), CFX_OK, "%s",
                     cfx_last_error());
        cr_assert_eq(placed, wk[w].node, "placement query chose node %u, the input is on %u",
                     placed, wk[w].node);
        struct work_arg xf = { .seed = 0 };
        cr_assert_eq(run(out_name, &in, 1, xf, 0), wk[w].node);
        uint8_t *ref = made(10u + (uint32_t)w, BIG);
        const uint8_t *ins[1] = { ref };
        size_t lens[1] = { BIG };
        cr_assert_eq(check_result(out_name, ins, lens, 1), wk[w].node);
        free(ref);
    }
}

Test(tasks, resources_respected)
{
    struct cfx_object_id r;
    struct work_arg a = { .seed = 0 };
    struct cfx_task_params p;
    struct cfx_task *t = NULL;
    uint32_t node = 0;
    oid("tasks/res/r", &r);

    struct cfx_task_needs cores = { .field_mask = CFX_TASK_NEEDS_CORES, .cores = 3 };
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, &cores, targ(&p, &a), &t),
                 CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "3 cores"), "%s", cfx_last_error());
    struct cfx_task_needs gpus2 = { .field_mask = CFX_TASK_NEEDS_GPUS, .gpus = 2 };
    cr_assert_eq(cfx_place(ctx, "work", &gpus2, NULL, 0, &node), CFX_ERR_NO_RESOURCE);
    struct cfx_task_needs mem = { .field_mask = CFX_TASK_NEEDS_MEMORY, .memory = 2ull << 30 };
    cr_assert_eq(cfx_place(ctx, "work", &mem, NULL, 0, &node), CFX_ERR_NO_RESOURCE);
    cr_assert_eq(cfx_task_submit(ctx, "nosuch", NULL, 0, &r, 1, NULL, targ(&p, &a), &t),
                 CFX_ERR_NOT_FOUND);

    /* one GPU: only the third worker has one */
    struct cfx_task_needs gpu = { .field_mask = CFX_TASK_NEEDS_GPUS, .gpus = 1 };
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, &gpu, targ(&p, &a), &t), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk[2].node);
    cfx_task_free(t);
    cr_assert_eq(check_result("tasks/res/r", NULL, NULL, 0), wk[2].node);

    /* a node set of one: honoured however the others rank */
    for (int w = 0; w < NWORKERS; w++) {
        char name[64];
        snprintf(name, sizeof(name), "tasks/res/set%d", w);
        cr_assert_eq(run(name, NULL, 0, a, wk[w].node), wk[w].node);
        cr_assert_eq(check_result(name, NULL, NULL, 0), wk[w].node);
    }
    /* a node set with no capable node: 3 cores nowhere */
    struct cfx_task_needs set_gpu = { .field_mask = CFX_TASK_NEEDS_GPUS | CFX_TASK_NEEDS_NODES,
                                      .gpus = 1, .nodes = &wk[0].node, .n_nodes = 1 };
    cr_assert_eq(cfx_place(ctx, "work", &set_gpu, NULL, 0, &node), CFX_ERR_NO_RESOURCE);

    /* a task's own failure comes back with its code, naming its node */
    struct work_arg bad = { .fail = 1 };
    struct cfx_task_needs on0 = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = &wk[0].node,
                                  .n_nodes = 1 };
    oid("tasks/res/bad", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, &on0, targ(&p, &bad), &t), CFX_OK);
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_ERR_INVALID);
    char want[96];
    snprintf(want, sizeof(want), "on node %u: the function returned CFX_ERR_INVALID",
             wk[0].node);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cfx_task_free(t);
}

static void submit_waiting(const char *fmt, int i, const struct cfx_task_needs *nd,
                           struct cfx_task **t)
{
    char name[64];
    struct cfx_object_id r;
    struct cfx_task_params p;
    struct work_arg a = { .wait_go = 1 };
    snprintf(name, sizeof(name), fmt, i);
    oid(name, &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, nd, targ(&p, &a), t), CFX_OK,
                 "%s", cfx_last_error());
}

/* Put "tasks/go", wait for the tasks, check their results, delete "go". */
static void release_and_check(const char *fmt, struct cfx_task **t, int n)
{
    struct cfx_object_id go;
    oid("tasks/go", &go);
    cr_assert_eq(cfx_put(ctx, &go, "g", 1, NULL), CFX_OK);
    for (int i = 0; i < n; i++) {
        char name[64];
        uint32_t ran = 0;
        cr_assert_eq(cfx_task_wait(t[i], CALL_MS, &ran), CFX_OK, "%s", cfx_last_error());
        snprintf(name, sizeof(name), fmt, i);
        cr_assert_eq(check_result(name, NULL, NULL, 0), ran);
        cr_assert_eq(ran, cfx_task_node(t[i]));
        cfx_task_free(t[i]);
    }
    cr_assert_eq(cfx_delete(ctx, &go, NULL), CFX_OK);
}

Test(tasks, spread_under_load)
{
    /* one-core tasks that hold their cores until "tasks/go" appears: the
     * first 3 go one to each worker, the next 3 too (2 cores each), then no
     * core is left */
    enum { N = 6 };
    struct cfx_task *t[N];
    struct cfx_task_needs sp = { .field_mask = CFX_TASK_NEEDS_POLICY, .policy = CFX_TASK_SPREAD };
    for (int round = 0; round < 2; round++) {
        unsigned per[NWORKERS] = { 0 };
        for (int i = 0; i < 3; i++)
            submit_waiting("tasks/spread/%d", round * 3 + i, &sp, &t[round * 3 + i]);
        for (int i = 0; i < N; i++)
            for (int w = 0; w < NWORKERS && i < (round + 1) * 3; w++)
                per[w] += cfx_task_node(t[i]) == wk[w].node;
        for (int w = 0; w < NWORKERS; w++)
            cr_assert_eq(per[w], (unsigned)round + 1, "round %d: worker %d (node %u) got %u "
                         "tasks", round, w, wk[w].node, per[w]);
    }
    uint32_t node;
    cr_assert_eq(cfx_place(ctx, "work", NULL, NULL, 0, &node), CFX_ERR_BUSY);
    release_and_check("tasks/spread/%d", t, N);
}

Test(tasks, pack_fills_one_node)
{
    struct cfx_task *t[2];
    struct cfx_task_needs pk = { .field_mask = CFX_TASK_NEEDS_POLICY, .policy = CFX_TASK_PACK };
    for (int i = 0; i < 2; i++)
        submit_waiting("tasks/pack/%d", i, &pk, &t[i]);
    cr_assert_neq(cfx_task_node(t[0]), 0);
    cr_assert_eq(cfx_task_node(t[0]), cfx_task_node(t[1]));
    /* anti-affinity: a second task of a group never shares a node with the first */
    struct cfx_task *g[2];
    struct cfx_task_needs grp = { .field_mask = CFX_TASK_NEEDS_POLICY | CFX_TASK_NEEDS_GROUP,
                                  .policy = CFX_TASK_PACK, .group = "replica" };
    for (int i = 0; i < 2; i++)
        submit_waiting("tasks/group/%d", i, &grp, &g[i]);
    cr_assert_neq(cfx_task_node(g[0]), 0);
    cr_assert_neq(cfx_task_node(g[1]), 0);
    cr_assert_neq(cfx_task_node(g[0]), cfx_task_node(g[1]));
    release_and_check("tasks/pack/%d", t, 2);
    /* "go" is deleted, but the group tasks read it before, or read the new one */
    struct cfx_object_id go;
    oid("tasks/go", &go);
    cr_assert_eq(cfx_put(ctx, &go, "g", 1, NULL), CFX_OK);
    for (int i = 0; i < 2; i++) {
        uint32_t ran = 0;
        char name[64];
        cr_assert_eq(cfx_task_wait(g[i], CALL_MS, &ran), CFX_OK, "%s", cfx_last_error());
        snprintf(name, sizeof(name), "tasks/group/%d", i);
        cr_assert_eq(check_result(name, NULL, NULL, 0), ran);
        cfx_task_free(g[i]);
    }
}

Test(tasks, reservation_expires)
{
    /* a placement query holds both cores of worker 0 for 5 s: the next two
     * calls must come within it, so it is long beside a loaded machine's
     * pauses (a second-long stall has been seen), and the task then waits
     * out the rest of it */
    uint32_t node = 0;
    struct cfx_task_needs all = { .field_mask = CFX_TASK_NEEDS_CORES | CFX_TASK_NEEDS_NODES |
                                                CFX_TASK_NEEDS_RESERVE,
                                  .cores = 2, .nodes = &wk[0].node, .n_nodes = 1,
                                  .reserve_ms = 5000 };
    cr_assert_eq(cfx_place(ctx, "work", &all, NULL, 0, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk[0].node);
    cr_assert_eq(cfx_place(ctx, "work", &all, NULL, 0, &node), CFX_ERR_BUSY);

    /* a task that needs them queues, and runs once the reservation expired */
    struct cfx_object_id r;
    struct cfx_task_params p;
    struct cfx_task *t;
    struct work_arg a = { .seed = 0 };
    all.field_mask &= ~(uint64_t)CFX_TASK_NEEDS_RESERVE;
    oid("tasks/resv/r", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, &all, targ(&p, &a), &t), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t), 0, "placed at once on node %u", cfx_task_node(t));
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk[0].node);
    cr_assert_eq(check_result("tasks/resv/r", NULL, NULL, 0), wk[0].node);
    cfx_task_free(t);
}

/* A reservation's length out of 1..CFX_TASK_RESERVE_MAX_MS is refused,
 * named; a negative one was taken for 1 ms without a word.  An empty node
 * set is any node. */
Test(tasks, reservation_out_of_range_is_refused)
{
    uint32_t node = 0;
    struct cfx_task_needs n = { .field_mask = CFX_TASK_NEEDS_RESERVE | CFX_TASK_NEEDS_NODES,
                                .n_nodes = 0 };
    static const int bad[] = { -5, 0, CFX_TASK_RESERVE_MAX_MS + 1 };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n.reserve_ms = bad[i];
        cr_assert_eq(cfx_place(ctx, "work", &n, NULL, 0, &node), CFX_ERR_INVALID,
                     "reserve_ms %d: %s", bad[i], cfx_last_error());
        cr_assert(strstr(cfx_last_error(), "reserve_ms"), "%s", cfx_last_error());
    }
    n.reserve_ms = 1;
    cr_assert_eq(cfx_place(ctx, "work", &n, NULL, 0, &node), CFX_OK, "%s", cfx_last_error());
    bool worker = false;
    for (int i = 0; i < NWORKERS; i++)
        worker |= node == wk[i].node;
    cr_assert(worker, "placed on node %u, not a worker", node);
}

/* A field_mask bit this library does not know (a field of a newer header),
 * in a task's needs or params, is refused with CFX_ERR_UNSUPPORTED naming
 * the bits, and nothing runs: the task's result never appears.  The bit was
 * ignored: the task ran and the query answered. */
Test(tasks, unknown_field_bits_are_refused)
{
    const uint64_t newer = 1ull << 40;
    struct cfx_object_id r;
    struct cfx_task_params p;
    struct work_arg a = { .make = 1, .seed = 9, .size = 64 };
    struct cfx_task_needs nd = { .field_mask = CFX_TASK_NEEDS_CORES | newer, .cores = 1 };
    struct cfx_task *t = NULL;
    uint32_t node = 0;
    oid("tasks/newer/r", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, &nd, targ(&p, &a), &t),
                 CFX_ERR_UNSUPPORTED, "%s", cfx_last_error());
    cr_assert_null(t);
    cr_assert(strstr(cfx_last_error(), "cfx_task_submit: cfx_task_needs.field_mask has bits "
                     "0x10000000000 this library does not know"), "%s", cfx_last_error());
    targ(&p, &a);
    p.field_mask |= newer;
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, 1, NULL, &p, &t), CFX_ERR_UNSUPPORTED,
                 "%s", cfx_last_error());
    cr_assert_null(t);
    cr_assert(strstr(cfx_last_error(), "cfx_task_submit: cfx_task_params.field_mask has bits "
                     "0x10000000000 this library does not know"), "%s", cfx_last_error());
    cr_assert_eq(cfx_place(ctx, "work", &nd, NULL, 0, &node), CFX_ERR_UNSUPPORTED, "%s",
                 cfx_last_error());
    cr_assert_eq(node, 0);
    cr_assert(strstr(cfx_last_error(), "cfx_place: cfx_task_needs.field_mask has bits "
                     "0x10000000000 this library does not know"), "%s", cfx_last_error());
    struct cfx_obj_params wait = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 500 };
    uint8_t b[64];
    int rc = cfx_get(ctx, &r, b, sizeof(b), NULL, &wait);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());
}

/* Input or result ids at NULL are refused, named as such; the text spoke of
 * the counts ("1 inputs and 1 results (at most 16 each)"), which were in
 * range. */
Test(tasks, ids_at_null_are_named)
{
    struct cfx_object_id r;
    struct cfx_task *t = NULL;
    uint32_t node = 0;
    oid("tasks/null/r", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 1, &r, 1, NULL, NULL, &t), CFX_ERR_INVALID,
                 "%s", cfx_last_error());
    cr_assert_null(t);
    cr_assert(strstr(cfx_last_error(), "cfx_task_submit: 1 inputs at NULL"), "%s",
              cfx_last_error());
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, NULL, 2, NULL, NULL, &t), CFX_ERR_INVALID,
                 "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "cfx_task_submit: 2 results at NULL"), "%s",
              cfx_last_error());
    cr_assert_eq(cfx_place(ctx, "work", NULL, NULL, 3, &node), CFX_ERR_INVALID, "%s",
                 cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "cfx_place: 3 inputs at NULL"), "%s", cfx_last_error());
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r, CFX_TASK_IO_MAX + 1, NULL, NULL, &t),
                 CFX_ERR_INVALID, "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "0 inputs and 17 results (at most 16 each)"), "%s",
              cfx_last_error());
}

Test(tasks, replaced_when_its_node_dies)
{
    /* a task waiting for "tasks/go", its input inline (held by the
     * coordinator): its node is killed, it runs elsewhere */
    struct cfx_object_id in, r;
    uint8_t small[100];
    for (size_t i = 0; i < sizeof(small); i++)
        small[i] = pattern(77, i);
    oid("tasks/die/in", &in);
    cr_assert_eq(cfx_put(ctx, &in, small, sizeof(small), NULL), CFX_OK);
    struct cfx_task_params p;
    struct cfx_task *t;
    struct work_arg a = { .wait_go = 1 };
    oid("tasks/die/r", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", &in, 1, &r, 1, NULL, targ(&p, &a), &t), CFX_OK,
                 "%s", cfx_last_error());
    uint32_t first = cfx_task_node(t);
    int victim = -1;
    for (int w = 0; w < NWORKERS; w++)
        victim = wk[w].node == first ? w : victim;
    cr_assert_geq(victim, 0, "placed on node %u, no worker", first);
    worker_kill(&wk[victim]);

    struct cfx_object_id go;
    oid("tasks/go", &go);
    cr_assert_eq(cfx_put(ctx, &go, "g", 1, NULL), CFX_OK);
    uint32_t ran = 0;
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &ran), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(ran, first);
    const uint8_t *ins[1] = { small };
    size_t lens[1] = { sizeof(small) };
    cr_assert_eq(check_result("tasks/die/r", ins, lens, 1), ran);
    cfx_task_free(t);
    cr_assert_eq(cfx_delete(ctx, &go, NULL), CFX_OK);
}

/* A task queued behind another for the one node of its node set: that node
 * dies, and the queued task can no longer be placed.  It fails
 * CFX_ERR_NO_RESOURCE, its text naming it (it named neither the task nor
 * that it had been queued). */
Test(tasks, a_queued_task_its_node_gone_is_named)
{
    struct cfx_task_needs all = { .field_mask = CFX_TASK_NEEDS_CORES | CFX_TASK_NEEDS_NODES,
                                  .cores = 2, .nodes = &wk[0].node, .n_nodes = 1 };
    struct cfx_object_id r1, r2;
    struct cfx_task_params p1, p2;
    struct cfx_task *t1, *t2;
    struct work_arg a = { .wait_go = 1 };
    oid("tasks/qgone/r1", &r1);
    oid("tasks/qgone/r2", &r2);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r1, 1, &all, targ(&p1, &a), &t1),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t1), wk[0].node);
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r2, 1, &all, targ(&p2, &a), &t2),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t2), 0, "placed at once on node %u", cfx_task_node(t2));
    worker_kill(&wk[0]);

    cr_assert_eq(cfx_task_wait(t2, CALL_MS, NULL), CFX_ERR_NO_RESOURCE, "%s",
                 cfx_last_error());
    char want[96];
    snprintf(want, sizeof(want), "task %llu ('work'), queued, can no longer be placed",
             (unsigned long long)cfx_task_id(t2));
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(t1, CALL_MS, NULL), CFX_ERR_PEER_FAILED, "%s", cfx_last_error());
    cfx_task_free(t2);
    cfx_task_free(t1);
}

/* The input is made on worker 1 and held nowhere else; the task reading it
 * goes there and waits for "tasks/go", and worker 1 is killed (@p left
 * false) or leaves in good order, its context destroyed: the destroy
 * cancels that get and the task's end is not reported, so it goes as with
 * a death.  The task fails naming the node and how it went. */
static void input_went_with(bool left)
{
    struct cfx_object_id in, r;
    struct work_arg mk = { .make = 1, .seed = left ? 6 : 5, .size = BIG };
    cr_assert_eq(run(left ? "tasks/left/in" : "tasks/lost/in", NULL, 0, mk, wk[1].node),
                 wk[1].node);
    oid(left ? "tasks/left/in" : "tasks/lost/in", &in);
    struct cfx_task_params p;
    struct cfx_task *t;
    struct work_arg a = { .wait_go = 1 };
    oid(left ? "tasks/left/r" : "tasks/lost/r", &r);
    cr_assert_eq(cfx_task_submit(ctx, "work", &in, 1, &r, 1, NULL, targ(&p, &a), &t), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t), wk[1].node);
    uint32_t gone = wk[1].node;
    if (left)
        worker_end(&wk[1]);
    else
        worker_kill(&wk[1]);
    uint32_t ran = 0;
    cr_assert_eq(cfx_task_wait(t, CALL_MS, &ran), CFX_ERR_PEER_FAILED);
    char want[48];
    snprintf(want, sizeof(want), "node %u %s while it ran there", gone, left ? "left" : "died");
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(ran, gone);
    cfx_task_free(t);
}

Test(tasks, fails_naming_the_dead_node_when_its_input_went_with_it)
{
    input_went_with(false);
}

Test(tasks, fails_naming_the_node_that_left_with_its_input)
{
    input_went_with(true);
}

Test(tasks, chain_of_results)
{
    /* made on worker 0, then 4 tasks each reading the previous result,
     * all submitted at once: each one's get waits for its input */
    enum { STEPS = 4 };
    struct cfx_object_id ids[STEPS + 1];
    struct cfx_task *t[STEPS];
    struct cfx_task_params p;
    struct work_arg mk = { .make = 1, .seed = 3, .size = BIG };
    cr_assert_eq(run("tasks/chain/0", NULL, 0, mk, wk[0].node), wk[0].node);
    oid("tasks/chain/0", &ids[0]);
    struct work_arg a = { .seed = 0 };
    for (int s = 1; s <= STEPS; s++) {
        char name[64];
        snprintf(name, sizeof(name), "tasks/chain/%d", s);
        oid(name, &ids[s]);
        cr_assert_eq(cfx_task_submit(ctx, "work", &ids[s - 1], 1, &ids[s], 1, NULL,
                                     targ(&p, &a), &t[s - 1]), CFX_OK, "%s", cfx_last_error());
    }
    /* expected bytes: step s = node(s) + (step s-1 + 1) */
    size_t len = BIG;
    uint8_t *cur = made(3, BIG);
    for (int s = 1; s <= STEPS; s++) {
        char name[64];
        uint32_t ran = 0;
        cr_assert_eq(cfx_task_wait(t[s - 1], CALL_MS, &ran), CFX_OK, "step %d: %s", s,
                     cfx_last_error());
        snprintf(name, sizeof(name), "tasks/chain/%d", s);
        const uint8_t *ins[1] = { cur };
        size_t lens[1] = { len };
        cr_assert_eq(check_result(name, ins, lens, 1), ran);
        uint8_t *next = malloc(len + 4);
        cr_assert(next);
        memcpy(next, &ran, 4);
        for (size_t i = 0; i < len; i++)
            next[4 + i] = (uint8_t)(cur[i] + 1);
        free(cur);
        cur = next;
        len += 4;
        cfx_task_free(t[s - 1]);
    }
    free(cur);
}

Test(tasks, offered_again_after_a_coordinator_restart)
{
    /* tasks are soft state, but the workers register "work" again once they
     * rejoined the restarted coordinator; nothing tells this process when,
     * so it asks for each worker until the deadline */
    coord_run_restart(&co);
    for (int w = 0; w < NWORKERS; w++) {
        struct cfx_task_needs nd = { .field_mask = CFX_TASK_NEEDS_NODES | CFX_TASK_NEEDS_RESERVE,
                                     .nodes = &wk[w].node, .n_nodes = 1, .reserve_ms = 1 };
        uint64_t dl = cfx__deadline_ns(CALL_MS);
        uint32_t node = 0;
        int rc;
        while ((rc = cfx_place(ctx, "work", &nd, NULL, 0, &node)) != CFX_OK &&
               cfx__now_ns() < dl)
            usleep(20 * 1000);
        cr_assert_eq(rc, CFX_OK, "worker %d (node %u): %s", w, wk[w].node, cfx_last_error());
        cr_assert_eq(node, wk[w].node);
    }
    for (int w = 0; w < NWORKERS; w++) {
        char name[64];
        struct work_arg a = { .seed = 0 };
        snprintf(name, sizeof(name), "tasks/restart/%d", w);
        cr_assert_eq(run(name, NULL, 0, a, wk[w].node), wk[w].node);
        cr_assert_eq(check_result(name, NULL, NULL, 0), wk[w].node);
    }
}

Test(tasks, deadline_keeps_the_slot_until_the_run_ends)
{
    /* A task that outlives its deadline: its waiter gets CFX_ERR_TIMEOUT at
     * the deadline, but the run goes on on its node (nothing stops it), so
     * its 2 cores stay reserved: a second 2-core task for that node waits
     * for the run's end instead of running beside it.  Its late end stays
     * a timeout.  (Before: the deadline freed the cores at once and the
     * second task was placed beside the run still going.) */
    struct cfx_object_id r1, r2, go;
    struct cfx_task_params p1, p2;
    struct work_arg slow = { .wait_go = 1, .linger = 1 }, quick = { .seed = 0 };
    struct cfx_task_needs on0 = { .field_mask = CFX_TASK_NEEDS_NODES | CFX_TASK_NEEDS_CORES,
                                  .cores = 2, .nodes = &wk[0].node, .n_nodes = 1 };
    struct cfx_task *t1 = NULL, *t2 = NULL;
    uint32_t node = 0;
    oid("tasks/late/1", &r1);
    oid("tasks/late/2", &r2);
    oid("tasks/go", &go);
    targ(&p1, &slow);
    p1.timeout_ms = 300;
    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r1, 1, &on0, &p1, &t1), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_task_node(t1), wk[0].node);
    cr_assert_eq(cfx_task_wait(t1, CALL_MS, &node), CFX_ERR_TIMEOUT, "%s", cfx_last_error());

    cr_assert_eq(cfx_task_submit(ctx, "work", NULL, 0, &r2, 1, &on0, targ(&p2, &quick), &t2),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t2), 0, "placed at once on node %u beside the run past its "
                 "deadline", cfx_task_node(t2));
    cr_assert_eq(cfx_task_wait(t2, 0, &node), CFX_ERR_AGAIN, "%s", cfx_last_error());

    /* the run ends: its cores are free, the second task runs there */
    cr_assert_eq(cfx_put(ctx, &go, "g", 1, NULL), CFX_OK);
    cr_assert_eq(cfx_task_wait(t2, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, wk[0].node);
    cr_assert_eq(check_result("tasks/late/2", NULL, NULL, 0), wk[0].node);
    /* the late end (the run put its result) is still a timeout */
    cr_assert_eq(cfx_task_wait(t1, CALL_MS, &node), CFX_ERR_TIMEOUT, "%s", cfx_last_error());
    cfx_task_free(t1);
    cfx_task_free(t2);
    cr_assert_eq(cfx_delete(ctx, &go, NULL), CFX_OK);
}

Test(tasks, submitter_withdraws_its_results)
{
    /* The submitter may withdraw its task's result as the putter (the
     * worker) may: every copy goes and the id is free for a new put.
     * Another node's delete drops its own copy only.  (Before: the
     * submitter's delete dropped its own copy, the record stayed with the
     * worker's copy, and a put of the id failed with CFX_ERR_EXISTS.) */
    struct cfx_object_id r;
    struct work_arg mk = { .make = 1, .seed = 77, .size = BIG };
    void *buf = NULL;
    size_t len = 0;
    uint8_t *ref = made(77, BIG);
    struct cfx_context *other = coord_run_join(&co, CALL_MS);
    oid("tasks/own/r", &r);

    cr_assert_eq(run("tasks/own/r", NULL, 0, mk, wk[1].node), wk[1].node);
    /* a third node, neither putter nor submitter: its delete drops its copy */
    buf = malloc(BIG);
    cr_assert(buf);
    cr_assert_eq(cfx_get(other, &r, buf, BIG, &len, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(len, BIG);
    cr_assert_eq(memcmp(buf, ref, BIG), 0);
    cr_assert_eq(cfx_delete(other, &r, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(other, &r, ref, BIG, NULL), CFX_ERR_EXISTS, "%s", cfx_last_error());

    /* the submitter's delete withdraws the object */
    memset(buf, 0, BIG);
    cr_assert_eq(cfx_get(ctx, &r, buf, BIG, &len, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(len, BIG);
    cr_assert_eq(memcmp(buf, ref, BIG), 0);
    cr_assert_eq(cfx_delete(ctx, &r, NULL), CFX_OK, "%s", cfx_last_error());
    free(buf);
    cr_assert_eq(cfx_put(other, &r, ref, BIG, NULL), CFX_OK, "the id is still taken: %s",
                 cfx_last_error());
    cr_assert_eq(cfx_delete(other, &r, NULL), CFX_OK, "%s", cfx_last_error());

    /* the submitter's cfx_buf_free of a cfx_get_alloc copy drops that copy
     * only (freeing a buffer is no decision to end the result); its delete
     * ends it even holding no copy */
    struct cfx_object_id r2;
    void *ab = NULL;
    size_t al = 0;
    oid("tasks/own/r2", &r2);
    cr_assert_eq(run("tasks/own/r2", NULL, 0, mk, wk[2].node), wk[2].node);
    cr_assert_eq(cfx_get_alloc(ctx, &r2, &ab, &al, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(al, BIG);
    cr_assert_eq(memcmp(ab, ref, BIG), 0);
    cfx_buf_free(ctx, ab);
    cr_assert_eq(cfx_put(other, &r2, ref, BIG, NULL), CFX_ERR_EXISTS,
                 "a freed buffer withdrew the result: %s", cfx_last_error());
    cr_assert_eq(cfx_delete(ctx, &r2, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(other, &r2, ref, BIG, NULL), CFX_OK, "the id is still taken: %s",
                 cfx_last_error());
    cr_assert_eq(cfx_delete(other, &r2, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(other);
    free(ref);
}

/* Whether the id @p r is free for a new put by @p c (the put is deleted
 * again), asked again for up to 10 s: the coordinator handles a leave on
 * its own time, and @p c drops its copy when it hears of the withdrawal
 * (an engine event: looked at again on each, at least every 20 ms). */
static bool id_freed(struct cfx_context *c, const struct cfx_object_id *r)
{
    static const char b = 'x';
    uint64_t dl = cfx__deadline_ns(10000);
    int rc;
    while ((rc = cfx_put(c, r, &b, 1, NULL)) == CFX_ERR_EXISTS && cfx__now_ns() < dl) {
        pthread_mutex_lock(&c->lock);
        cfx__obj_wait(c, CFX_MIN(dl, cfx__deadline_ns(20)));
        pthread_mutex_unlock(&c->lock);
    }
    if (rc != CFX_OK)
        return false;
    cr_assert_eq(cfx_delete(c, r, NULL), CFX_OK, "%s", cfx_last_error());
    return true;
}

Test(tasks, results_go_with_their_submitter)
{
    /* Only a result's putter (the worker) and its task's submitter may end
     * it, and the worker never does: when the submitter left, its results
     * (and the worker's memory behind them) stayed until the worker left.
     * Now they go with the submitter, as an owner's objects do in Ray:
     * those of a task that ended before it left, and the result of one
     * that ends after (withdrawn as soon as its end is known); one still
     * waiting for a slot is not run at all. */
    struct cfx_object_id r1, r2, r3, go;
    struct work_arg mk = { .make = 1, .seed = 5, .size = BIG };
    struct work_arg late = { .make = 1, .seed = 6, .size = BIG, .wait_go = 1, .linger = 1 };
    struct cfx_task_params p1, p2;
    struct cfx_task_needs on1 = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = &wk[1].node,
                                  .n_nodes = 1 };
    struct cfx_task_needs all1 = { .field_mask = CFX_TASK_NEEDS_NODES | CFX_TASK_NEEDS_CORES,
                                   .cores = 2, .nodes = &wk[1].node, .n_nodes = 1 };
    struct cfx_task_params p3;
    struct cfx_task *t1 = NULL, *t2 = NULL, *t3 = NULL;
    uint32_t node = 0;
    struct cfx_context *sub = coord_run_join(&co, CALL_MS);
    oid("tasks/sub/r1", &r1);
    oid("tasks/sub/r2", &r2);
    oid("tasks/sub/r3", &r3);
    oid("tasks/go", &go);

    cr_assert_eq(cfx_task_submit(sub, "work", NULL, 0, &r1, 1, &on1, targ(&p1, &mk), &t1),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(t1, CALL_MS, &node), CFX_OK, "%s", cfx_last_error());
    cfx_task_free(t1);
    uint8_t *ref = made(5, BIG), *buf = malloc(BIG);
    size_t len = 0;
    cr_assert(buf);
    cr_assert_eq(cfx_get(ctx, &r1, buf, BIG, &len, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(len, BIG);
    cr_assert_eq(memcmp(buf, ref, BIG), 0, "wrong bytes");
    free(buf);
    free(ref);
    cr_assert_eq(cfx_task_submit(sub, "work", NULL, 0, &r2, 1, &on1, targ(&p2, &late), &t2),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t2), wk[1].node);
    cfx_task_free(t2);
    /* both of node 1's cores: waits while the second task holds one */
    cr_assert_eq(cfx_task_submit(sub, "work", NULL, 0, &r3, 1, &all1, targ(&p3, &mk), &t3),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_node(t3), 0, "placed beside a running task on a 2-core node");
    const uint64_t id3 = cfx_task_id(t3);
    char said[128];
    snprintf(said, sizeof(said), "its submitter node %u left before it was placed",
             cfx_context_node_id(sub));
    cfx_task_free(t3);
    /* the result is held while its submitter lives */
    static const char b = 'x';
    cr_assert_eq(cfx_put(ctx, &r1, &b, 1, NULL), CFX_ERR_EXISTS, "%s", cfx_last_error());

    cfx_context_destroy(sub); /* leaves */
    cr_assert(id_freed(ctx, &r1), "the result of a task whose submitter left stayed: %s",
              cfx_last_error());
    /* the waiting task ended, never placed (the coordinator's listing) */
    struct cfx_ctl_task_rec *recs = NULL;
    size_t n = 0;
    cr_assert_eq(cfx__ctl_tasks(ctx->ctl, &recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    size_t i = 0;
    while (i < n && recs[i].id != id3)
        i++;
    cr_assert_lt(i, n, "task %llu is not listed", (unsigned long long)id3);
    cr_assert_eq(recs[i].state, CFX_CTL_TASK_DONE);
    cr_assert_eq(recs[i].status, CFX_ERR_PEER_FAILED, "%s", cfx_errname(recs[i].status));
    cr_assert_eq(recs[i].placements, 0);
    cr_assert(strstr(recs[i].text, said), "%s", recs[i].text);
    free(recs);
    /* the second task ends now, its submitter gone: its result goes */
    cr_assert_eq(cfx_put(ctx, &go, "g", 1, NULL), CFX_OK);
    cr_assert(id_freed(ctx, &r2), "the late result of a submitter that left stayed: %s",
              cfx_last_error());
    cr_assert_eq(cfx_delete(ctx, &go, NULL), CFX_OK);
}

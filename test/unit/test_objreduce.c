/*
 * cfx_reduce_objects() into an id that names another object: it fails with
 * CFX_ERR_EXISTS and leaves that object the only one under the id, on every
 * node (the reduce used to return CFX_OK while the directory refused its
 * result, and the result's node answered its own gets with it).  One
 * process: an embedded coordinator and four contexts over tcp.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define NCTX  4
#define COUNT (300u * 1024) /* floats: 1.2 MB, chunked */
#define SIZE  (COUNT * sizeof(float))

static struct cfx_coord *coord;
static struct cfx_context *ctx[NCTX];
static char token[64];

static void setup(void)
{
    char addr[64];
    cr_assert_eq(cfx_test_coord_start(NULL, &coord, token, sizeof(token), addr,
                                      sizeof(addr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
    for (int i = 0; i < NCTX; i++) {
        struct cfx_context_params cp = {
            .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                          CFX_CTX_PARAM_TRANSPORTS,
            .coord = addr, .token = token, .timeout_ms = 10000, .transports = "tcp",
        };
        cr_assert_eq(cfx_context_create(&cp, &ctx[i]), CFX_OK, "%s", cfx_last_error());
    }
}

static void teardown(void)
{
    for (int i = NCTX - 1; i >= 0; i--)
        cfx_context_destroy(ctx[i]);
    cfx__coord_stop(coord);
}

TestSuite(objreduce, .init = setup, .fini = teardown, .timeout = 90);

static float *filled(float v)
{
    float *a = malloc(SIZE);
    cr_assert_not_null(a);
    for (size_t i = 0; i < COUNT; i++)
        a[i] = v;
    return a;
}

/* Every node gets @p id and finds @p v everywhere in it (a node holding
 * other bytes under the id would answer with those). */
static void all_read(const struct cfx_object_id *id, float v)
{
    float *buf = malloc(SIZE);
    cr_assert_not_null(buf);
    /* the buffer is ours again when the get returns (no copy kept in it) */
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = CFX_OBJ_FLAG_NO_KEEP };
    for (int i = 0; i < NCTX; i++) {
        size_t got = 0;
        memset(buf, 0, SIZE);
        int rc = cfx_get(ctx[i], id, buf, SIZE, &got, &p);
        cr_assert_eq(rc, CFX_OK, "node %d: %s (%s)", i, cfx_errname(rc), cfx_last_error());
        cr_assert_eq(got, SIZE);
        for (size_t j = 0; j < COUNT; j++)
            cr_assert_eq(buf[j], v, "node %d reads %g at %zu, the object under the id is %g", i,
                         (double)buf[j], j, (double)v);
    }
    free(buf);
}

static int stop_at_the_second_check(void *arg)
{
    int *n = arg;
    return ++*n >= 2;
}

/* A reduce whose inputs nobody puts ends when the thread's interrupt check
 * says stop (Ctrl-C in Python), with CFX_ERR_CANCELED saying so, not at its
 * deadline: before, the check never ran in its waits.  The context is usable
 * after: a reduce of inputs that are there completes, every float right. */
Test(objreduce, a_reduce_waiting_for_its_inputs_is_interrupted)
{
    struct cfx_object_id in[2], r;
    cfx_object_id_from_name("objreduce/intr/a", &in[0]);
    cfx_object_id_from_name("objreduce/intr/b", &in[1]);
    cfx_object_id_from_name("objreduce/intr/r", &r);
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    int checks = 0;
    cfx_set_interrupt_check(stop_at_the_second_check, &checks);
    int rc = cfx_reduce_objects(ctx[0], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &r, &p, NULL);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(checks, 2);
    /* (in the wait for the inputs' holders, or for the result) */
    cr_assert(strstr(cfx_last_error(), "interrupted"), "%s", cfx_last_error());

    float *a = filled(1.5f), *b = filled(2.0f);
    cr_assert_eq(cfx_put(ctx[1], &in[0], a, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[2], &in[1], b, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_object_id_from_name("objreduce/intr/r2", &r);
    rc = cfx_reduce_objects(ctx[0], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &r, NULL, NULL);
    cr_assert_eq(rc, CFX_OK, "%s: %s", cfx_errname(rc), cfx_last_error());
    all_read(&r, 3.5f);
    free(a);
    free(b);
}

/* The id was taken before the reduce started: refused at once. */
Test(objreduce, result_id_taken_before)
{
    struct cfx_object_id x, y, z;
    cfx_object_id_from_name("objreduce/before/x", &x);
    cfx_object_id_from_name("objreduce/before/y", &y);
    cfx_object_id_from_name("objreduce/before/z", &z);
    float *ax = filled(1.0f), *ay = filled(2.0f), *az = filled(100.0f);
    cr_assert_eq(cfx_put(ctx[0], &x, ax, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[1], &y, ay, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[2], &z, az, SIZE, NULL), CFX_OK, "%s", cfx_last_error());

    const struct cfx_object_id in[2] = { x, y };
    int rc = cfx_reduce_objects(ctx[0], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &z, NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_EXISTS, "%s (%s)", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "names an object already (node"), "%s",
              cfx_last_error());
    /* the node that holds it, as driver */
    rc = cfx_reduce_objects(ctx[2], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &z, NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_EXISTS, "%s (%s)", cfx_errname(rc), cfx_last_error());
    all_read(&z, 100.0f);
    free(ax);
    free(ay);
    free(az);
}

struct reducer {
    const struct cfx_object_id *in;
    size_t n, k;
    const struct cfx_object_id *out;
    int rc;
    char err[512];
};

static void *reducer_main(void *arg)
{
    struct reducer *r = arg;
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 20000 };
    r->rc = cfx_reduce_objects(ctx[0], r->in, r->n, r->k, CFX_DTYPE_F32, CFX_OP_SUM, r->out, &p,
                               NULL);
    snprintf(r->err, sizeof(r->err), "%s", cfx_last_error());
    return NULL;
}

/*
 * The id is taken while the reduce waits for its last input: the
 * directory refuses the result's announcement and the reduce fails with
 * CFX_ERR_EXISTS; no node answers a get with the reduced bytes.  With
 * @p k == @p n the result is announced as it starts (getters may read it
 * as it is reduced); with k < n once complete.
 */
static void taken_during(size_t n, size_t k, const char *tag)
{
    char name[64];
    struct cfx_object_id in[3], z;
    for (size_t i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "objreduce/%s/in%zu", tag, i);
        cfx_object_id_from_name(name, &in[i]);
    }
    snprintf(name, sizeof(name), "objreduce/%s/z", tag);
    cfx_object_id_from_name(name, &z);
    float *a0 = filled(1.0f), *a1 = filled(2.0f), *az = filled(100.0f);
    cr_assert_eq(cfx_put(ctx[0], &in[0], a0, SIZE, NULL), CFX_OK, "%s", cfx_last_error());

    struct reducer r = { .in = in, .n = n, .k = k, .out = &z };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, reducer_main, &r), 0);
    /* once the reduce has found the id free (it waits for in[1] then), the
     * id is taken: the directory refuses the result's announcement */
    uint64_t dl = cfx__deadline_ns(20000);
    bool checked = false;
    while (!checked && cfx__now_ns() < dl) {
        pthread_mutex_lock(&ctx[0]->lock);
        checked = ctx[0]->reduce_id_checks > 0;
        pthread_mutex_unlock(&ctx[0]->lock);
        if (!checked)
            sched_yield();
    }
    cr_assert(checked, "the reduce never checked its result's id");
    cr_assert_eq(cfx_put(ctx[2], &z, az, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[1], &in[1], a1, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    pthread_join(th, NULL);
    cr_log_info("%s: %s: %s", tag, cfx_errname(r.rc), r.err);
    cr_assert_eq(r.rc, CFX_ERR_EXISTS, "%s (%s)", cfx_errname(r.rc), r.err);
    all_read(&z, 100.0f);
    free(a0);
    free(a1);
    free(az);
}

Test(objreduce, result_id_taken_during_announced_early)
{
    taken_during(2, 2, "early");
}

Test(objreduce, result_id_taken_during_announced_complete)
{
    taken_during(3, 2, "complete");
}

/*
 * Inputs put with the default chunk size reduce whatever their size: the
 * chunk is S/128 in whole pages.  It was S/128 exactly, 65537 bytes for
 * these 8388736 (2097184 floats), no whole number of floats, and the reduce
 * was refused ("inputs of 8388736 bytes are not a whole number of float
 * elements": the size was, the chunk was not).
 */
Test(objreduce, default_chunks_hold_whole_elements)
{
    enum { N = 2097184 };
    struct cfx_object_id x, y, z;
    cfx_object_id_from_name("objreduce/chunks/x", &x);
    cfx_object_id_from_name("objreduce/chunks/y", &y);
    cfx_object_id_from_name("objreduce/chunks/z", &z);
    cr_assert_eq(cfx__chunk_size_for((uint64_t)N * sizeof(float), 0) % 4096, 0);
    float *ax = malloc((size_t)N * sizeof(float)), *ay = malloc((size_t)N * sizeof(float));
    float *out = malloc((size_t)N * sizeof(float));
    cr_assert(ax && ay && out);
    for (size_t i = 0; i < N; i++) {
        ax[i] = (float)(i % 1000);
        ay[i] = (float)(i % 7);
    }
    cr_assert_eq(cfx_put(ctx[0], &x, ax, (size_t)N * sizeof(float), NULL), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_put(ctx[1], &y, ay, (size_t)N * sizeof(float), NULL), CFX_OK, "%s",
                 cfx_last_error());
    const struct cfx_object_id in[2] = { x, y };
    int rc = cfx_reduce_objects(ctx[2], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &z, NULL, NULL);
    cr_assert_eq(rc, CFX_OK, "%s: %s", cfx_errname(rc), cfx_last_error());
    size_t got = 0;
    cr_assert_eq(cfx_get(ctx[3], &z, out, (size_t)N * sizeof(float), &got, NULL), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(got, (size_t)N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(out[i], (float)(i % 1000) + (float)(i % 7), "element %zu: %g", i,
                     (double)out[i]);
    cr_assert_eq(cfx_delete(ctx[0], &x, NULL), CFX_OK);
    cr_assert_eq(cfx_delete(ctx[1], &y, NULL), CFX_OK);
    free(ax);
    free(ay);
    free(out);
}

/*
 * A placement whose node set is empty (CFX_TASK_NEEDS_NODES with n_nodes 0)
 * places on any node, as task.h says and as a task's does: the reduce
 * produces the result.  It was CFX_ERR_NO_RESOURCE, "none of the holders
 * ... is in the node set".
 */
Test(objreduce, place_empty_node_set_is_any_node)
{
    struct cfx_object_id x, y, z;
    cfx_object_id_from_name("objreduce/anynode/x", &x);
    cfx_object_id_from_name("objreduce/anynode/y", &y);
    cfx_object_id_from_name("objreduce/anynode/z", &z);
    float *ax = filled(1.0f), *ay = filled(2.0f);
    cr_assert_eq(cfx_put(ctx[0], &x, ax, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[1], &y, ay, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    const struct cfx_object_id in[2] = { x, y };
    uint32_t unused = 12345;
    struct cfx_task_needs nd = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = &unused,
                                 .n_nodes = 0 };
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_PLACE, .place = &nd };
    int rc = cfx_reduce_objects(ctx[2], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &z, &p, NULL);
    cr_assert_eq(rc, CFX_OK, "%s: %s", cfx_errname(rc), cfx_last_error());
    all_read(&z, 3.0f);
    free(ax);
    free(ay);
}

/*
 * A placement policy that is neither spread nor pack is refused with
 * CFX_ERR_INVALID naming it, as cfx_task_submit() refuses it, and the
 * result's id stays free.  It was taken for spread without a word.
 */
Test(objreduce, place_unknown_policy_refused)
{
    struct cfx_object_id x, y, z;
    cfx_object_id_from_name("objreduce/policy/x", &x);
    cfx_object_id_from_name("objreduce/policy/y", &y);
    cfx_object_id_from_name("objreduce/policy/z", &z);
    float *ax = filled(1.0f), *ay = filled(2.0f), *az = filled(7.0f);
    cr_assert_eq(cfx_put(ctx[0], &x, ax, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(ctx[1], &y, ay, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    const struct cfx_object_id in[2] = { x, y };
    struct cfx_task_needs nd = { .field_mask = CFX_TASK_NEEDS_POLICY,
                                 .policy = (enum cfx_task_policy)7 };
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_PLACE, .place = &nd };
    int rc = cfx_reduce_objects(ctx[2], in, 2, 2, CFX_DTYPE_F32, CFX_OP_SUM, &z, &p, NULL);
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "unknown policy 7"), "%s", cfx_last_error());
    /* nothing was produced under the id: it is free for a put */
    cr_assert_eq(cfx_put(ctx[3], &z, az, SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    all_read(&z, 7.0f);
    free(ax);
    free(ay);
    free(az);
}

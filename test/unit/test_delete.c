/*
 * cfx_delete() and a copy whose release is still under way: once a delete
 * returns anything but CFX_ERR_TIMEOUT, the engine refers to the caller's
 * buffer no more.  A delete that timed out leaves the entry draining (an
 * upload's writes, a reduce task reading it as its input); a second delete
 * of the id answered CFX_ERR_NOT_FOUND at once, while the entry still
 * pointed at the buffer, and a caller that took that as "no copy here" (the
 * Python binding drops its pin of the buffer on it) freed memory the
 * engine still read.  One process: an embedded coordinator and one node.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define SIZE (256u * 1024)

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];

static void setup(void)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = 0, .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "coordinator: %s", cfx_last_error());
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
}

static void teardown(void)
{
    cfx__coord_stop(coord);
    coord = NULL;
}

TestSuite(delete, .init = setup, .fini = teardown, .timeout = 60);

static struct cfx_context *join(void)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT,
        .coord = coord_addr,
        .token = token,
        .timeout_ms = 5000,
    };
    struct cfx_context *c = NULL;
    cr_assert_eq(cfx_context_create(&p, &c), CFX_OK, "%s", cfx_last_error());
    return c;
}

/* The buffer the entry of @p id serves from, NULL when there is none. */
static void *entry_buf(struct cfx_context *c, const struct cfx_object_id *id)
{
    pthread_mutex_lock(&c->lock);
    struct cfx_obj *o = cfx__store_find(&c->store, id);
    void *b = o ? o->buf : NULL;
    pthread_mutex_unlock(&c->lock);
    return b;
}

/* A reduce task reading @p id as its input (objreduce.c) takes or drops
 * its reference; the last one dropped finishes a release under way. */
static void hold(struct cfx_context *c, const struct cfx_object_id *id, bool take)
{
    pthread_mutex_lock(&c->lock);
    struct cfx_obj *o = cfx__store_find(&c->store, id);
    cr_assert(o, "the entry is gone while a reference holds it");
    if (take) {
        o->refs++;
    } else {
        o->refs--;
        pthread_cond_broadcast(&c->obj_cond);
        if (!o->refs && o->releasing)
            cfx__cmd_must(c, CFX_CMD_OBJ_RELEASE, o);
    }
    pthread_mutex_unlock(&c->lock);
}

Test(delete, second_delete_of_a_draining_copy_waits_for_it)
{
    struct cfx_context *a = join();
    uint8_t *buf = malloc(SIZE);
    cr_assert(buf);
    cfx_test_fill(buf, SIZE, 3);
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(a, &id, buf, SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    hold(a, &id, true);

    struct cfx_obj_params short_dl = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 50 };
    int rc = cfx_delete(a, &id, &short_dl);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(entry_buf(a, &id), buf, "the copy still drains from the caller's buffer");

    /* asked again while it drains: not "no copy here" */
    rc = cfx_delete(a, &id, &short_dl);
    cr_expect_eq(rc, CFX_ERR_TIMEOUT, "a delete while the copy still drains from the buffer "
                 "returned %s (%s)", cfx_errname(rc), cfx_last_error());
    if (rc != CFX_ERR_TIMEOUT)
        cr_expect_null(entry_buf(a, &id), "%s, and the engine still serves from the buffer",
                       cfx_errname(rc));

    /* the reader ends: the release finishes, and a delete says so */
    hold(a, &id, false);
    rc = cfx_delete(a, &id, NULL);
    cr_assert(rc == CFX_OK || rc == CFX_ERR_NOT_FOUND, "%s: %s", cfx_errname(rc),
              cfx_last_error());
    cr_assert_null(entry_buf(a, &id));
    cr_assert_eq(cfx_test_check(buf, SIZE, 3), (size_t)-1, "the buffer was changed");
    /* the id is free again */
    cr_assert_eq(cfx_put(a, &id, buf, SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(a);
    free(buf);
}

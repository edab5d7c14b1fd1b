/*
 * Object lifetime checks, one process per step, against a long-running
 * coordinator (CFX_COORD, CFX_TOKEN in the environment).  Each mode exits 0
 * when everything was as the lifecycle says (docs/ARCHITECTURE.md, Object
 * lifecycle), else prints "FAIL: ..." naming the call, the status and the
 * bytes, and exits 1.
 *
 *   putget NAME SIZE CHAR   one context puts SIZE bytes of CHAR as NAME,
 *                           a second context (another node) gets it and
 *                           checks every byte; the process then exits, and
 *                           the object with its two copies
 *   redo NAME SIZE ROUNDS   put, get from another node, delete, and put the
 *                           same id again at once, ROUNDS times, each round
 *                           with other bytes; every call must succeed
 *   gone NAME SIZE          nobody holds NAME: a get finds nothing within
 *                           its deadline (CFX_ERR_TIMEOUT), and a delete
 *                           of it finds nothing either
 */
#include <conflux/conflux.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/common/testutil.h"

#define DIE CFX_TEST_DIE

static struct cfx_context *join(void)
{
    struct cfx_context *ctx;
    struct cfx_context_params p = { .field_mask = CFX_CTX_PARAM_TIMEOUT, .timeout_ms = 20000 };
    CHECK_OK(cfx_context_create(&p, &ctx));
    return ctx;
}

/* Get @p id on @p ctx and check that all @p size bytes are @p c. */
static void get_check(struct cfx_context *ctx, const struct cfx_object_id *id, const char *name,
                      size_t size, int c)
{
    unsigned char *buf = malloc(size + 1);
    size_t got = 0;
    if (!buf)
        DIE("no memory for %zu bytes", size);
    int rc = cfx_get(ctx, id, buf, size + 1, &got, NULL);
    if (rc != CFX_OK)
        DIE("node %u: cfx_get %s -> %s (%s)", cfx_context_node_id(ctx), name, cfx_errname(rc),
            cfx_last_error());
    if (got != size)
        DIE("node %u: cfx_get %s: %zu bytes, want %zu", cfx_context_node_id(ctx), name, got,
            size);
    for (size_t i = 0; i < size; i++)
        if (buf[i] != (unsigned char)c)
            DIE("node %u: cfx_get %s: byte %zu of %zu is '%c', want '%c'",
                cfx_context_node_id(ctx), name, i, size, buf[i], c);
    free(buf);
}

static void mode_putget(const char *name, size_t size, int c)
{
    struct cfx_object_id id;
    struct cfx_context *putter = join(), *reader = join();
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf)
        DIE("no memory for %zu bytes", size);
    memset(buf, c, size);
    CHECK_OK(cfx_object_id_from_name(name, &id));
    CHECK_OK(cfx_put(putter, &id, buf, size, NULL));
    get_check(reader, &id, name, size, c);
    cfx_context_destroy(reader);
    cfx_context_destroy(putter);
    free(buf);
}

static void mode_redo(const char *name, size_t size, int rounds)
{
    struct cfx_object_id id;
    struct cfx_context *putter = join();
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf)
        DIE("no memory for %zu bytes", size);
    CHECK_OK(cfx_object_id_from_name(name, &id));
    for (int r = 0; r < rounds; r++) {
        int c = 'a' + r % 26;
        /* a fresh reader each round: a copy a node got is its own to delete */
        struct cfx_context *reader = join();
        memset(buf, c, size);
        int rc = cfx_put(putter, &id, buf, size, NULL);
        if (rc != CFX_OK)
            DIE("round %d: cfx_put %s right after its delete returned -> %s (%s)", r, name,
                cfx_errname(rc), cfx_last_error());
        get_check(reader, &id, name, size, c);
        cfx_context_destroy(reader);
        rc = cfx_delete(putter, &id, NULL);
        if (rc != CFX_OK)
            DIE("round %d: cfx_delete %s -> %s (%s)", r, name, cfx_errname(rc),
                cfx_last_error());
    }
    cfx_context_destroy(putter);
    free(buf);
}

static void mode_gone(const char *name, size_t size)
{
    struct cfx_object_id id;
    struct cfx_context *ctx = join();
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 300 };
    unsigned char *buf = malloc(size + 1);
    if (!buf)
        DIE("no memory for %zu bytes", size);
    CHECK_OK(cfx_object_id_from_name(name, &id));
    int rc = cfx_get(ctx, &id, buf, size + 1, NULL, &gp);
    if (rc != CFX_ERR_TIMEOUT)
        DIE("cfx_get %s after its putter left -> %s, want CFX_ERR_TIMEOUT (%s)", name,
            cfx_errname(rc), rc == CFX_OK ? "it is still served" : cfx_last_error());
    rc = cfx_delete(ctx, &id, NULL);
    if (rc != CFX_ERR_NOT_FOUND)
        DIE("cfx_delete %s by a node that never held it -> %s, want CFX_ERR_NOT_FOUND", name,
            cfx_errname(rc));
    cfx_context_destroy(ctx);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "putget"))
        mode_putget(argv[2], strtoul(argv[3], NULL, 0), argv[4][0]);
    else if (argc == 5 && !strcmp(argv[1], "redo"))
        mode_redo(argv[2], strtoul(argv[3], NULL, 0), atoi(argv[4]));
    else if (argc == 4 && !strcmp(argv[1], "gone"))
        mode_gone(argv[2], strtoul(argv[3], NULL, 0));
    else
        DIE("usage: %s putget NAME SIZE CHAR | redo NAME SIZE ROUNDS | gone NAME SIZE",
            argv[0]);
    return 0;
}

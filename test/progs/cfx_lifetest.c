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
 *   regot ROLE NAME S1 S2   a node that got a copy reads the id again after
 *                           its putter withdrew it: A puts S1 bytes of 'A',
 *                           B gets them; A deletes and puts S1 bytes of 'B',
 *                           B's get returns them; A deletes and puts S2
 *                           bytes of 'C', B's get returns them; A deletes,
 *                           B's get waits for a new put (CFX_ERR_TIMEOUT).
 *                           ROLE "put" is A and "get" is B, two processes
 *                           that take turns through small marker objects;
 *                           "both" runs A and B as two contexts of one
 *                           process, B reading right after A's call returns
 *                           (nothing reaches B in between)
 */
#include <conflux/conflux.h>

#include <stdbool.h>
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

/* regot: the turn of the other process.  A marker NAME/ROLE/STEP is put by
 * the process whose turn ended; the other gets it (waiting for it up to the
 * context's deadline). */
static void turn_end(struct cfx_context *ctx, const char *name, const char *who, int step)
{
    char m[160];
    struct cfx_object_id id;
    static const uint8_t one = 1;
    snprintf(m, sizeof(m), "%s/turn-%s-%d", name, who, step);
    CHECK_OK(cfx_object_id_from_name(m, &id));
    CHECK_OK(cfx_put(ctx, &id, &one, 1, NULL));
}

static void turn_wait(struct cfx_context *ctx, const char *name, const char *who, int step)
{
    char m[160];
    struct cfx_object_id id;
    uint8_t got = 0;
    snprintf(m, sizeof(m), "%s/turn-%s-%d", name, who, step);
    CHECK_OK(cfx_object_id_from_name(m, &id));
    int rc = cfx_get(ctx, &id, &got, 1, NULL, NULL);
    if (rc != CFX_OK || got != 1)
        DIE("waiting for %s's turn %d to end: cfx_get -> %s (%s)", who, step, cfx_errname(rc),
            cfx_last_error());
}

static void regot_a(struct cfx_context *a, const struct cfx_object_id *id, unsigned char *buf,
                    int step, size_t s1, size_t s2)
{
    switch (step) {
    case 0:
        memset(buf, 'A', s1);
        CHECK_OK(cfx_put(a, id, buf, s1, NULL));
        break;
    case 1:
        CHECK_OK(cfx_delete(a, id, NULL));
        memset(buf, 'B', s1);
        CHECK_OK(cfx_put(a, id, buf, s1, NULL));
        break;
    case 2:
        CHECK_OK(cfx_delete(a, id, NULL));
        memset(buf, 'C', s2);
        CHECK_OK(cfx_put(a, id, buf, s2, NULL));
        break;
    default:
        CHECK_OK(cfx_delete(a, id, NULL));
        break;
    }
}

/* B's reads go into arena buffers (cfx_get_alloc) that B keeps until the end
 * (a copy serves from its buffer until it goes); @p keep collects them. */
static void regot_b(struct cfx_context *b, const struct cfx_object_id *id, const char *name,
                    int step, size_t s1, size_t s2, void **keep)
{
    static const char want[] = "ABC";
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 300 };
    unsigned char *buf = NULL;
    size_t got = 0, size = step < 2 ? s1 : s2;
    /* step 3: withdrawn, nothing put since: the get waits for a new put */
    int rc = cfx_get_alloc(b, id, (void **)&buf, &got, step < 3 ? NULL : &gp);
    keep[step] = buf;
    if (step == 3) {
        if (rc != CFX_ERR_TIMEOUT)
            DIE("node %u: cfx_get_alloc %s after its putter deleted it -> %s, want "
                "CFX_ERR_TIMEOUT%s", cfx_context_node_id(b), name, cfx_errname(rc),
                rc == CFX_OK ? " (it answered with a withdrawn copy)" : "");
        return;
    }
    if (rc != CFX_OK)
        DIE("node %u: cfx_get_alloc %s (step %d) -> %s (%s)", cfx_context_node_id(b), name,
            step, cfx_errname(rc), cfx_last_error());
    if (got != size)
        DIE("node %u: cfx_get_alloc %s (step %d): %zu bytes, want %zu", cfx_context_node_id(b),
            name, step, got, size);
    for (size_t i = 0; i < size; i++)
        if (buf[i] != (unsigned char)want[step])
            DIE("node %u: cfx_get_alloc %s (step %d): byte %zu of %zu is 0x%02x, want '%c'",
                cfx_context_node_id(b), name, step, i, size, buf[i], want[step]);
}

static void mode_regot(const char *role, const char *name, size_t s1, size_t s2)
{
    struct cfx_object_id id;
    bool is_a = !strcmp(role, "put") || !strcmp(role, "both");
    bool is_b = !strcmp(role, "get") || !strcmp(role, "both");
    struct cfx_context *a = is_a ? join() : NULL, *b = is_b ? join() : NULL;
    void *keep[4] = { NULL };
    unsigned char *buf = malloc(s1 > s2 ? s1 : s2);
    if (!buf || (!is_a && !is_b))
        DIE("regot: role %s (put, get or both), or no memory", role);
    CHECK_OK(cfx_object_id_from_name(name, &id));
    for (int step = 0; step < 4; step++) {
        if (a) {
            if (!b && step)
                turn_wait(a, name, "get", step - 1);
            regot_a(a, &id, buf, step, s1, s2);
            if (!b)
                turn_end(a, name, "put", step);
        }
        if (b) {
            if (!a)
                turn_wait(b, name, "put", step);
            regot_b(b, &id, name, step, s1, s2, keep);
            if (!a)
                turn_end(b, name, "get", step);
        }
    }
    /* the putter stays until the reader read its last marker */
    if (a && !b)
        turn_wait(a, name, "get", 3);
    for (int i = 0; b && i < 4; i++)
        cfx_buf_free(b, keep[i]);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
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
    else if (argc == 6 && !strcmp(argv[1], "regot"))
        mode_regot(argv[2], argv[3], strtoul(argv[4], NULL, 0), strtoul(argv[5], NULL, 0));
    else
        DIE("usage: %s putget NAME SIZE CHAR | redo NAME SIZE ROUNDS | gone NAME SIZE | "
            "regot put|get|both NAME S1 S2", argv[0]);
    return 0;
}

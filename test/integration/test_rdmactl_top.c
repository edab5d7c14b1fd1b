/*
 * rdmactl top: its frames read from a pipe (--once, --count), after two
 * nodes join, put three objects and one gets another's object.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "testutil.h"

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_start(NULL, &coord, token, sizeof(token), coord_addr,
                                      sizeof(coord_addr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    cfx__coord_stop(coord);
}

TestSuite(rdmactl_top, .init = setup, .fini = teardown, .timeout = 60);

/* stdout of `rdmactl --coord ... ARGS` (token from the environment). */
static int rdmactl(const char *args, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "CFX_TOKEN=%s %s/rdmactl --coord %s %s", token, CFX_BIN_DIR,
             coord_addr, args);
    int st = cfx_test_run_output(cmd, out, cap);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    return st;
}

static int join(const char *name, struct cfx_context **out)
{
    return cfx_test_join(coord_addr, token, "tcp", name, 10000, out);
}

Test(rdmactl_top, once_shows_members_copies_and_transfers)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id[4];
    static const size_t size[4] = { 100, 300000, 200000, 50 };
    static uint8_t data[300000], got[300000];
    char out[8192], line[256];
    size_t gsz = 0;

    cr_assert_eq(join("top-a", &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join("top-b", &b), CFX_OK, "%s", cfx_last_error());
    cfx_test_fill(data, sizeof(data), 7);
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof(name), "top-%d", i);
        cfx_object_id_from_name(name, &id[i]);
        cr_assert_eq(cfx_put(i < 2 ? a : b, &id[i], data, size[i], NULL), CFX_OK, "%s",
                     cfx_last_error());
    }
    /* b gets a's object 1: a complete copy on b once the get returned */
    cr_assert_eq(cfx_get(b, &id[1], got, sizeof(got), &gsz, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(gsz, size[1]);
    cr_assert_eq(cfx_test_check(got, gsz, 7), (size_t)-1);
    /* the get tells the directory of b's copy without waiting; a request b
     * makes after it is handled after that (one connection, in order): a
     * put of a fourth object, so the listing below finds the copy complete */
    cfx_object_id_from_name("top-3", &id[3]);
    cr_assert_eq(cfx_put(b, &id[3], data, size[3], NULL), CFX_OK, "%s", cfx_last_error());

    cr_assert_eq(rdmactl("top --once", out, sizeof(out)), 0, "%s", out);
    cr_log_info("%s", out);
    cr_expect_null(strchr(out, '\033'), "escapes in --once output");
    cr_expect_eq(strncmp(out, "conflux top  ", 13), 0, "%s", out);
    cr_expect_not_null(strstr(out, "\nmembers: 2 alive, 0 dead   objects: 4 ("), "%s", out);
    cr_expect_not_null(strstr(out, "\ntransfers: 0 copies being received, 0 uploads\n"), "%s", out);
    /* a: objects 0 and 1 (puts); b: objects 2 and 3 (puts) and its copy of 1 */
    snprintf(line, sizeof(line), "\n%6u  %-5s  ", cfx_context_node_id(a), "top-a");
    const char *ra = strstr(out, line);
    cr_assert_not_null(ra, "no row for node a ('%s'):\n%s", line + 1, out);
    /* no rates in a first frame; nothing in flight */
    cr_expect_not_null(strstr(ra, " ms         2         0         0             -             -"
                                  "     0     0\n"),
                       "%s", out);
    snprintf(line, sizeof(line), "\n%6u  %-5s  ", cfx_context_node_id(b), "top-b");
    const char *rb = strstr(out, line);
    cr_assert_not_null(rb, "no row for node b ('%s'):\n%s", line + 1, out);
    cr_expect_not_null(strstr(rb, " ms         3         0         0             -             -"
                                  "     0     0\n"),
                       "%s", out);
    int rows = 0;
    for (const char *p = out; (p = strstr(p, " ms ")); p++)
        rows++;
    cr_expect_eq(rows, 2, "one row per member:\n%s", out);

    /* --count 2: two frames, one after the other, separated by a blank line */
    cr_assert_eq(rdmactl("top --count 2 --interval 100", out, sizeof(out)), 0, "%s", out);
    int frames = 0;
    for (const char *p = out; (p = strstr(p, "conflux top  ")); p++)
        frames++;
    cr_expect_eq(frames, 2, "%s", out);
    const char *second = strstr(out, "\n\nconflux top  ");
    cr_expect_not_null(second, "%s", out);
    /* the second frame has rates (bytes/s since the first) in both rows */
    int rated = 0;
    for (const char *p = second; p && (p = strstr(p, "B/s ")); p++)
        rated++;
    cr_expect_geq(rated, 4, "%s", out);

    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

Test(rdmactl_top, usage_errors)
{
    char out[1024];
    cr_expect_eq(rdmactl("top --interval 5 2>/dev/null", out, sizeof(out)), 2);
    cr_expect_eq(rdmactl("top --count 0 2>/dev/null", out, sizeof(out)), 2);
    cr_expect_eq(rdmactl("top extra 2>/dev/null", out, sizeof(out)), 2);
    cr_expect_eq(rdmactl("--json top 2>/dev/null", out, sizeof(out)), 2);
}

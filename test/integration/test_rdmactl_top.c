/*
 * rdmactl top: its frames read from a pipe (--once, --count), after two
 * nodes join, put three objects and one gets another's object.  rdmactl
 * objects: a partial copy held mid-transfer shows the bytes it has.  rdmactl
 * tasks --json: a task not ended has no status yet.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <conflux/conflux.h>

#include "dataplane/engine/engine.h"

#include "control/coord.h"
#include "testutil.h"

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    cfx_test_coord_down(&co);
}

TestSuite(rdmactl_top, .init = setup, .fini = teardown, .timeout = 60);

/* stdout of `rdmactl --coord ... ARGS` (token from the environment). */
static int rdmactl(const char *args, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "CFX_TOKEN=%s %s/rdmactl --coord %s %s", co.token, CFX_BIN_DIR,
             co.addr, args);
    int st = cfx_test_run_output(cmd, out, cap);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    return st;
}

static int join(const char *name, struct cfx_context **out)
{
    return cfx_test_join(co.addr, co.token, "tcp", name, 10000, out);
}

Test(rdmactl_top, once_shows_members_copies_and_transfers)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id[4];
    static const size_t size[4] = { 100, 300000, 200000, 50 };
    static uint8_t data[300000], got[300000];
    char out[8192];
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

    /* IN/OUT (the last two columns) ride the nodes' heartbeats, every
     * 250 ms: one sent while b's get ran says 1 until the next; a first
     * frame is asked for again (each --once is one) until both say 0 */
    static const char idle_a[] = " ms         2         0         0             -             -"
                                 "     0     0\n",
                      idle_b[] = " ms         3         0         0             -             -"
                                 "     0     0\n";
    char la[64], lb[64];
    snprintf(la, sizeof(la), "\n%6u  %-5s  ", cfx_context_node_id(a), "top-a");
    snprintf(lb, sizeof(lb), "\n%6u  %-5s  ", cfx_context_node_id(b), "top-b");
    uint64_t until = cfx__deadline_ns(20000);
    for (;;) {
        cr_assert_eq(rdmactl("top --once", out, sizeof(out)), 0, "%s", out);
        const char *pa = strstr(out, la), *pb = strstr(out, lb);
        if ((pa && strstr(pa, idle_a) && pb && strstr(pb, idle_b)) || cfx__now_ns() >= until)
            break;
        poll(NULL, 0, 50); /* the next heartbeat's report signals nothing here */
    }
    cr_log_info("%s", out);
    cr_expect_null(strchr(out, '\033'), "escapes in --once output");
    cr_expect_eq(strncmp(out, "conflux top  ", 13), 0, "%s", out);
    cr_expect_not_null(strstr(out, "\nmembers: 2 alive, 0 dead   objects: 4 ("), "%s", out);
    cr_expect_not_null(strstr(out, "\ntransfers: 0 copies being received, 0 uploads\n"), "%s", out);
    /* a: objects 0 and 1 (puts); b: objects 2 and 3 (puts) and its copy of 1 */
    const char *ra = strstr(out, la);
    cr_assert_not_null(ra, "no row for node a ('%s'):\n%s", la + 1, out);
    /* no rates in a first frame; nothing in flight */
    cr_expect_not_null(strstr(ra, idle_a), "%s", out);
    const char *rb = strstr(out, lb);
    cr_assert_not_null(rb, "no row for node b ('%s'):\n%s", lb + 1, out);
    cr_expect_not_null(strstr(rb, idle_b), "%s", out);
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

TestSuite(rdmactl_objects, .init = setup, .fini = teardown, .timeout = 120);

#define PCHUNK   (64u * 1024)
#define PCHUNKS  64u
#define PSTALL   12u /* the holder sends chunks [0, PSTALL) and stalls: 768 KiB of 4 MiB */

/* Run `rdmactl ARGS` until its output holds @p want (up to 20 s: a
 * report rides the next heartbeat).  Whether it did; the last output in @p out. */
static bool rdmactl_until(const char *args, const char *want, char *out, size_t cap)
{
    uint64_t dl = cfx__deadline_ns(20000);
    do {
        cr_assert_eq(rdmactl(args, out, cap), 0, "%s", out);
        if (strstr(out, want))
            return true;
        poll(NULL, 0, 50);
    } while (cfx__now_ns() < dl);
    return false;
}

/*
 * A named object on holder a, stalled by CFX_XFER_TEST_STALL after PSTALL
 * chunks, got by b with cfx_get_nb(): once b has exactly that prefix
 * (cfx_request_progress), `rdmactl objects` lists b's partial copy with
 * those bytes of the size, fed by a, and --json carries them as a number;
 * once a resumes and the get completes, b is a complete holder.
 */
Test(rdmactl_objects, partial_copy_shows_its_bytes)
{
    const size_t size = (size_t)PCHUNKS * PCHUNK, prefix = (size_t)PSTALL * PCHUNK;
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    struct cfx_request *req;
    static char out[16384];
    char want[256], at[16];
    uint8_t *src = malloc(size), *buf = malloc(size);
    cr_assert(src && buf);

    snprintf(at, sizeof(at), "%u", PSTALL);
    setenv("CFX_XFER_TEST_STALL", at, 1);
    int rc = join("objects-a", &a);
    unsetenv("CFX_XFER_TEST_STALL");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join("objects-b", &b), CFX_OK, "%s", cfx_last_error());
    const uint32_t na = cfx_context_node_id(a), nb = cfx_context_node_id(b);

    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = PCHUNK,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 60000 };
    cr_assert_eq(cfx_object_id_from_name("progress/model", &id), CFX_OK);
    cfx_test_fill(src, size, 5);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    memset(buf, 0, size);
    cr_assert_eq(cfx_get_nb(b, &id, buf, size, &gp, &req), CFX_OK, "%s", cfx_last_error());

    uint64_t done = 0, total = 0, dl = cfx__deadline_ns(20000);
    do {
        rc = cfx_request_progress(req, &done, &total);
        cr_assert(rc == CFX_OK || rc == CFX_ERR_AGAIN, "%s", cfx_errname(rc));
        if (done >= prefix)
            break;
        poll(NULL, 0, 10);
    } while (cfx__now_ns() < dl);
    cr_assert_eq(done, prefix, "the get has %llu bytes, the holder stalls after %zu",
                 (unsigned long long)done, prefix);
    cr_assert_eq(total, size);
    cr_assert_eq(memcmp(buf, src, prefix), 0, "wrong bytes in the landed prefix");

    /* b: partial, 768 KiB of 4 MiB, fed by a; a: complete, serving b */
    snprintf(want, sizeof(want), " %u:p0(768.0 KiB/4.0 MiB)<%u", nb, na);
    bool shown = rdmactl_until("objects", want, out, sizeof(out));
    cr_log_info("rdmactl objects:\n%s", out);
    cr_assert(shown, "no '%s' in:\n%s", want + 1, out);
    const char *row = strstr(out, "progress/model");
    cr_assert_not_null(row, "the object's name is not listed:\n%s", out);
    snprintf(want, sizeof(want), "%u:c1 ", na);
    cr_assert_not_null(strstr(row, want), "no complete holder '%s' serving one:\n%s", want, out);

    snprintf(want, sizeof(want),
             "{\"node\":%u,\"complete\":false,\"uploads\":0,\"fed_by\":%u,"
             "\"ready_bytes\":%zu}", nb, na, prefix);
    shown = rdmactl_until("--json objects", want, out, sizeof(out));
    cr_assert(shown, "no '%s' in:\n%s", want, out);
    snprintf(want, sizeof(want),
             "{\"node\":%u,\"complete\":true,\"uploads\":1,\"fed_by\":0,"
             "\"ready_bytes\":%zu}", na, size);
    cr_assert_not_null(strstr(out, want), "no '%s' in:\n%s", want, out);
    cr_assert_not_null(strstr(out, "\"name\":\"progress/model\""), "%s", out);

    /* the holder resumes: the get completes and b holds a complete copy */
    cfx__xfer_test_resume(a);
    cr_assert_eq(cfx_request_wait(req, 60000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_progress(req, &done, &total), CFX_OK);
    cr_assert_eq(done, size);
    cr_assert_eq(cfx_test_check(buf, size, 5), (size_t)-1, "wrong bytes");
    cfx_request_free(req);
    snprintf(want, sizeof(want), "{\"node\":%u,\"complete\":true,\"uploads\":0,"
             "\"fed_by\":0,\"ready_bytes\":%zu}", nb, size);
    shown = rdmactl_until("--json objects", want, out, sizeof(out));
    cr_assert(shown, "no '%s' in:\n%s", want, out);

    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(buf);
}

/*
 * A parameter-server job (test/common: one server, one worker, tensor a of
 * 40 blocks pushed once, b of 2 blocks pushed three times and pulled
 * twice): `rdmactl top --once` shows a PS section for the job, with the
 * server's node, its 42 blocks, its 50 requests and 3200 bytes (no rate in
 * a first frame), and b's two blocks heaviest, 5 requests and 320 bytes
 * each.
 */
Test(rdmactl_top, once_shows_ps_servers_and_blocks)
{
    struct cfx_context *s, *w;
    struct cfx_ps *srv, *wrk;
    char out[8192], err[512], row[256];

    cr_assert_eq(join("top-ps-s", &s), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join("top-ps-w", &w), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_ps_load_job(s, w, "top-ps", 64, 40, 2, &srv, &wrk, err, sizeof(err)),
                 CFX_OK, "%s", err);
    /* the server's node reports its load with its next heartbeat */
    snprintf(row, sizeof(row), "\n  %6u  %8u  %8u  %10u  %12s  %12s\n", 0,
             cfx_context_node_id(s), 42, 50, "3.1 KiB", "-");
    cr_assert(rdmactl_until("top --once", row, out, sizeof(out)), "no row '%s' in:\n%s", row + 1,
              out);
    cr_log_info("%s", out);
    const char *job = strstr(out, "\nPS job top-ps\n  SERVER      NODE    BLOCKS    REQUESTS"
                                  "         BYTES       BYTES/s\n");
    cr_assert_not_null(job, "%s", out);
    cr_expect_null(strstr(job + 1, "\nPS job "), "one job:\n%s", out);
    const char *blocks = strstr(job, "\n  BLOCK   SERVER      NODE    REQUESTS         BYTES\n");
    cr_assert_not_null(blocks, "%s", out);
    for (unsigned b = 40; b < 42; b++) {
        snprintf(row, sizeof(row), "\n  %-6u  %6u  %8u  %10u  %12s\n", b, 0,
                 cfx_context_node_id(s), 5, "320 B");
        cr_expect_not_null(strstr(blocks, row), "no row '%s' in:\n%s", row + 1, out);
    }
    /* then three of a's blocks, one request each (5 shown per job) */
    int rows = 0;
    for (const char *p = blocks + 1; (p = strstr(p, "\n  ")); p++)
        rows++;
    cr_expect_eq(rows, 5, "five heaviest blocks:\n%s", out);
    cfx_ps_destroy(wrk);
    cfx_ps_destroy(srv);
    cfx_context_destroy(w);
    cfx_context_destroy(s);
}

TestSuite(rdmactl_tasks, .init = setup, .fini = teardown, .timeout = 120);

/* A task that runs until the object "rdmactl-tasks/go" exists. */
static int hold_until_go(const struct cfx_task_call *call, void *arg)
{
    struct cfx_object_id go;
    char b;
    (void)arg;
    cfx_object_id_from_name("rdmactl-tasks/go", &go);
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                 .timeout_ms = call->timeout_ms };
    int rc = cfx_get(call->ctx, &go, &b, 1, NULL, &op);
    return rc != CFX_OK ? rc : cfx_task_result_put(call, 0, &b, 1);
}

/*
 * `rdmactl --json tasks`: a task still running has no status yet ("status"
 * null, as the table's "-"), not CFX_OK; once it ended, its status.
 */
Test(rdmactl_tasks, json_status_only_once_ended)
{
    struct cfx_context *w, *s;
    struct cfx_object_id go, res;
    struct cfx_task *t;
    static char out[16384];
    char want[256];
    const char b = 1;

    cr_assert_eq(join("tasks-w", &w), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join("tasks-s", &s), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_register(w, "hold", hold_until_go, NULL), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_object_id_from_name("rdmactl-tasks/result", &res), CFX_OK);
    cr_assert_eq(cfx_task_submit(s, "hold", NULL, 0, &res, 1, NULL, NULL, &t), CFX_OK, "%s",
                 cfx_last_error());

    snprintf(want, sizeof(want), "{\"id\":%llu,\"function\":\"hold\",\"state\":\"running\"",
             (unsigned long long)cfx_task_id(t));
    cr_assert(rdmactl_until("--json tasks", want, out, sizeof(out)), "no '%s' in:\n%s", want,
              out);
    const char *rec = strstr(out, want), *end = strchr(rec, '}');
    const char *st = strstr(rec, "\"status\":");
    cr_assert(st && st < end, "%s", out);
    cr_expect_eq(strncmp(st, "\"status\":null,", 14), 0, "a running task's status: %s", out);

    cr_assert_eq(cfx_object_id_from_name("rdmactl-tasks/go", &go), CFX_OK);
    cr_assert_eq(cfx_put(s, &go, &b, 1, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_task_wait(t, 30000, NULL), CFX_OK, "%s", cfx_last_error());
    snprintf(want, sizeof(want), "{\"id\":%llu,\"function\":\"hold\",\"state\":\"ok\"",
             (unsigned long long)cfx_task_id(t));
    cr_assert(rdmactl_until("--json tasks", want, out, sizeof(out)), "no '%s' in:\n%s", want,
              out);
    rec = strstr(out, want);
    cr_expect_not_null(strstr(rec, "\"status\":\"CFX_OK\","), "%s", out);

    cfx_task_free(t);
    cr_assert_eq(cfx_delete(s, &res, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(s, &go, NULL), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(s);
    cfx_context_destroy(w);
}

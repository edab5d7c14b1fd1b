/*
 * Coordinator restart: conflux-coord runs as a child process with a state
 * directory; two nodes (contexts in this process, tcp data plane) move a
 * large object between them, and the coordinator is killed with SIGKILL in
 * the middle of that transfer and restarted on the same port.  Asserted:
 * the transfer completes with the right bytes (the data plane does not need
 * the coordinator), both nodes reconnect and keep their node ids, objects
 * put before the restart can be got after it (the nodes re-announced them),
 * and the durable state survived (node ids are not reused).
 */
#include <criterion/criterion.h>

#include <sys/stat.h>

#include <conflux/conflux.h>

#include "coord_child.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define BIG   (32u << 20)   /* paced at 16 MiB/s: about two seconds on the wire */
#define MED   (1u << 20)
#define SMALL 1000u

static struct coord_child cc;
static char token[64];
static char dir[128], statedir[160], logpath[160];
static const char *args[16];
static char portarg[16];

static void start_coord(const char *port)
{
    snprintf(portarg, sizeof(portarg), "%s", port);
    const char *a[] = { "--port", portarg, "--token", token, "--state-dir", statedir,
                        "--heartbeat-ms", "100", "--dead-after-ms", "1500", NULL };
    memcpy(args, a, sizeof(a));
    coord_child_start(&cc, logpath, 0, args);
}

static void setup(void)
{
    cfx_test_token(token, sizeof(token));
    snprintf(dir, sizeof(dir), "/tmp/cfx-restart-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(statedir, sizeof(statedir), "%s/state", dir);
    snprintf(logpath, sizeof(logpath), "%s/coord.log", dir);
    start_coord("0");
}

static void teardown(void)
{
    char cmd[256];
    coord_child_kill(&cc, SIGTERM);
    cr_expect(!cfx_test_file_contains(logpath, token), "the token appears in the log");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}

TestSuite(coord_restart, .init = setup, .fini = teardown, .timeout = 180);

static struct cfx_context *join(void)
{
    struct cfx_context *ctx;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = cc.addr,
        .token = token,
        .timeout_ms = 20000,
        .transports = "tcp",
    };
    cr_assert_eq(cfx_context_create(&p, &ctx), CFX_OK, "%s", cfx_last_error());
    return ctx;
}

static void wait_reconnected(struct cfx_context *ctx, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    while (cfx__ctl_reconnects(ctx->ctl) == 0 && cfx__now_ns() < deadline)
        usleep(10 * 1000);
    cr_assert_geq(cfx__ctl_reconnects(ctx->ctl), 1, "node %u did not reconnect",
                  cfx_context_node_id(ctx));
}

static void get_check(struct cfx_context *ctx, const struct cfx_object_id *id, size_t size,
                      uint64_t seed)
{
    uint8_t *buf = malloc(size);
    size_t got = 0;
    int rc = cfx_get(ctx, id, buf, size, &got, NULL);
    cr_assert_eq(rc, CFX_OK, "get after the restart: %s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(buf, size, seed), (size_t)-1, "bytes differ");
    free(buf);
}

Test(coord_restart, kill_9_mid_transfer)
{
    setenv("CFX_UPLOAD_RATE", "16777216", 1);
    struct cfx_context *a = join(), *b = join();
    unsetenv("CFX_UPLOAD_RATE");
    uint32_t ida = cfx_context_node_id(a), idb = cfx_context_node_id(b);
    /* a third node comes and goes: its id must never be handed out again */
    struct cfx_context *gone = join();
    uint32_t idgone = cfx_context_node_id(gone);
    cfx_context_destroy(gone);

    uint8_t *big = malloc(BIG), *med = malloc(MED), *small = malloc(SMALL);
    cfx_test_fill(big, BIG, 1);
    cfx_test_fill(med, MED, 2);
    cfx_test_fill(small, SMALL, 3);
    struct cfx_object_id xbig, xmed, xsmall;
    cfx_object_id_generate(a, &xbig);
    cfx_object_id_generate(a, &xmed);
    cfx_object_id_generate(a, &xsmall);
    cr_assert_eq(cfx_put(a, &xbig, big, BIG, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &xmed, med, MED, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &xsmall, small, SMALL, NULL), CFX_OK, "%s", cfx_last_error());

    /* b starts pulling the big object; kill -9 the coordinator mid-way */
    uint8_t *dst = malloc(BIG);
    struct cfx_request *req;
    cr_assert_eq(cfx_get_nb(b, &xbig, dst, BIG, NULL, &req), CFX_OK, "%s", cfx_last_error());
    struct cfx_context_stats st;
    uint64_t deadline = cfx__deadline_ns(10000);
    do {
        usleep(5000);
        cfx_context_stats(b, &st);
    } while (st.bytes_received < (4u << 20) && cfx__now_ns() < deadline);
    cr_assert_geq(st.bytes_received, 4u << 20, "the transfer did not start");
    cr_assert_lt(st.bytes_received, BIG, "the transfer finished before the kill");
    char port[16];
    snprintf(port, sizeof(port), "%u", cc.port);
    coord_child_kill(&cc, SIGKILL);
    cfx_context_stats(b, &st);
    cr_log_info("coordinator killed with %llu of %u bytes received",
                (unsigned long long)st.bytes_received, BIG);
    cr_assert_lt(st.bytes_received, BIG, "the transfer finished before the kill");
    usleep(300 * 1000);
    start_coord(port); /* same port, same state directory */

    /* the transfer completes with the right bytes */
    cr_assert_eq(cfx_request_wait(req, 60000), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_request_size(req), BIG);
    cfx_request_free(req);
    cr_assert_eq(cfx_test_check(dst, BIG, 1), (size_t)-1, "bytes differ");

    /* both nodes reconnect, keeping their ids */
    wait_reconnected(a, 15000);
    wait_reconnected(b, 15000);
    cr_assert_eq(cfx_context_node_id(a), ida);
    cr_assert_eq(cfx_context_node_id(b), idb);

    /* objects put before the restart are found again (re-announced) */
    get_check(b, &xmed, MED, 2);
    get_check(b, &xsmall, SMALL, 3);

    /* durable state: a newcomer gets an id never handed out before */
    struct cfx_context *c = join();
    uint32_t idc = cfx_context_node_id(c);
    cr_assert(idc != ida && idc != idb && idc != idgone && idc > idgone,
              "node id %u handed out again (ids before: %u %u %u)", idc, ida, idb, idgone);
    char rec[256];
    snprintf(rec, sizeof(rec), "%s/coord.node_ids.rec", statedir);
    struct stat sb;
    cr_assert_eq(stat(rec, &sb), 0, "no state record %s", rec);
    get_check(c, &xbig, BIG, 1); /* from a or b, through the new directory */

    cfx_context_destroy(c);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(dst);
    free(big);
    free(med);
    free(small);
}

/*
 * Coordinator restart: conflux-coord runs as a child process with a state
 * directory; two nodes (contexts in this process, tcp data plane) move a
 * large object between them, and the coordinator is killed with SIGKILL in
 * the middle of that transfer and restarted on the same port.  Asserted:
 * the transfer completes with the right bytes (the data plane does not need
 * the coordinator), both nodes reconnect and keep their node ids, objects
 * put before the restart can be got after it (the nodes re-announced them),
 * and the durable state survived (node ids are not reused).
 *
 * Durable inline objects: served with the same bytes after kill -9 and a
 * restart while plain ones are gone until their putter puts them again; a
 * deleted one stays deleted through the next restart; corrupt records are
 * refused with a logged error.  Group bootstrap: two ranks wait for a third
 * while the coordinator is killed and restarted; the third joins afterwards
 * and the group's allreduce is right.  A rank that is slow to reconnect (a
 * process stopped across the restart) is not taken for a dead one by a rank
 * that reads its bootstrap object before it is back.  A node that a
 * coordinator without its old state gives a new id takes that id in its
 * log lines and on its data plane.  A state directory that lost its node id
 * record still knows its durable objects' putters: they get their ids back
 * within the rejoin window, and the records of those not back then go.  A
 * rank back only after that window gets a new id; the other rank learns
 * its old id is gone as the window ends, and its calls with it fail.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client_int.h"
#include "coord_run.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define BIG   (32u << 20)   /* paced at 16 MiB/s: about two seconds on the wire */
#define MED   (1u << 20)
#define SMALL 1000u

static struct coord_run co; /* the coordinator, its token and state directory */

static void setup(void)
{
    coord_run_setup(&co, "restart", false);
}

static void teardown(void)
{
    coord_run_teardown(&co);
}

TestSuite(coord_restart, .init = setup, .fini = teardown, .timeout = 180);

static struct cfx_context *join(void)
{
    return coord_run_join(&co, 20000);
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
    coord_run_kill(&co);
    cfx_context_stats(b, &st);
    cr_log_info("coordinator killed with %llu of %u bytes received",
                (unsigned long long)st.bytes_received, BIG);
    cr_assert_lt(st.bytes_received, BIG, "the transfer finished before the kill");
    usleep(300 * 1000);
    coord_run_start(&co); /* same port, same state directory */

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
    snprintf(rec, sizeof(rec), "%s/coord.node_ids.rec", co.statedir);
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

/* Wait until @p ctx finished a re-announce round (after its reconnect). */
static void wait_reannounced(struct cfx_context *ctx, int ms);

/*
 * A coordinator that comes back without its state (a new state directory
 * here, as after a restart without --state-dir) knows no ids of before:
 * node b, the only one left, asks for its id 2 and is given 1.  b takes the
 * new id everywhere: cfx_context_node_id(), its log lines' node=, its
 * transports (a newcomer authenticates it under the new id: it gets the
 * objects b put before the restart, re-announced, and b gets one of its).
 */
Test(coord_restart, node_given_a_new_id)
{
    char logdir[] = "/tmp/cfx-test-newid-XXXXXX", logpath[128];
    cr_assert_not_null(mkdtemp(logdir));
    snprintf(logpath, sizeof(logpath), "%s/node.log", logdir);
    /* this process's lines go to the file from its first (read once) */
    setenv("CFX_LOG_FILE", logpath, 1);
    struct cfx_context *a = join(), *b = join();
    unsetenv("CFX_LOG_FILE"); /* not for the coordinator started again below */
    cr_assert_eq(cfx_context_node_id(a), 1);
    cr_assert_eq(cfx_context_node_id(b), 2);
    cfx_context_destroy(a);

    uint8_t *med = malloc(MED), *small = malloc(SMALL), *buf = malloc(MED);
    cfx_test_fill(med, MED, 4);
    cfx_test_fill(small, SMALL, 5);
    struct cfx_object_id xmed, xsmall, xc;
    cfx_object_id_from_name("newid/med", &xmed);
    cfx_object_id_from_name("newid/small", &xsmall);
    cfx_object_id_from_name("newid/fromc", &xc);
    cr_assert_eq(cfx_put(b, &xmed, med, MED, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(b, &xsmall, small, SMALL, NULL), CFX_OK, "%s", cfx_last_error());

    coord_run_kill(&co);
    snprintf(co.statedir, sizeof(co.statedir), "%s/state-new", co.dir);
    coord_run_start(&co);
    wait_reconnected(b, 15000);
    wait_reannounced(b, 15000);
    cr_assert_eq(cfx_context_node_id(b), 1, "node 2 is now node %u", cfx_context_node_id(b));
    /* the line that says so is the first under the new id */
    char text[8192], *end;
    FILE *lf = fopen(logpath, "r");
    cr_assert_not_null(lf, "%s", logpath);
    size_t tn = fread(text, 1, sizeof(text) - 1, lf);
    fclose(lf);
    text[tn] = '\0';
    char *said = strstr(text, "gave this node id 1 (it was 2: ");
    cr_assert_not_null(said, "no line of the new id in %s:\n%s", logpath, text);
    *said = '\0';
    if ((end = strrchr(text, '\n')))
        memmove(text, end + 1, strlen(end + 1) + 1);
    cr_assert_not_null(strstr(text, " node=1 rank="), "the line is tagged: %s", text);

    struct cfx_context *c = join();
    cr_assert_eq(cfx_context_node_id(c), 2);
    size_t got = 0;
    cr_assert_eq(cfx_get(c, &xmed, buf, MED, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, MED);
    cr_assert_eq(cfx_test_check(buf, MED, 4), (size_t)-1, "bytes differ");
    cr_assert_eq(cfx_get(c, &xsmall, buf, MED, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, SMALL);
    cr_assert_eq(cfx_test_check(buf, SMALL, 5), (size_t)-1, "bytes differ");
    cfx_test_fill(med, MED, 6);
    cr_assert_eq(cfx_put(c, &xc, med, MED, NULL), CFX_OK, "%s", cfx_last_error());
    memset(buf, 0, MED);
    cr_assert_eq(cfx_get(b, &xc, buf, MED, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(buf, MED, 6), (size_t)-1, "bytes differ");

    cfx_context_destroy(c);
    cfx_context_destroy(b);
    free(med);
    free(small);
    free(buf);
    unlink(logpath);
    rmdir(logdir);
}

/* Wait until @p ctx finished a re-announce round (after its reconnect). */
static void wait_reannounced(struct cfx_context *ctx, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    pthread_mutex_lock(&ctx->lock);
    while (ctx->reannounce_rounds == 0 && cfx__obj_wait(ctx, deadline))
        ;
    uint64_t rounds = ctx->reannounce_rounds;
    pthread_mutex_unlock(&ctx->lock);
    cr_assert_geq(rounds, 1, "node %u did not re-announce its objects",
                  cfx_context_node_id(ctx));
}

/* Issue: a cfx_delete made just after the reconnect, while the re-announce
 * was still sending, was announced back: the re-announce had collected the
 * id before the delete and sent it after, so the object lived again in the
 * directory with nobody holding it (another node's put of the id failed
 * with CFX_ERR_EXISTS naming the deleter).  The test hook holds the
 * re-announce between its list and its sends until the delete returned. */
Test(coord_restart, delete_during_reannounce)
{
    setenv("CFX_REANNOUNCE_TEST_HOLD", "1", 1);
    struct cfx_context *a = join();
    unsetenv("CFX_REANNOUNCE_TEST_HOLD");
    struct cfx_context *b = join();
    uint8_t *gone = malloc(MED), *keep = malloc(MED), *again = malloc(MED);
    cfx_test_fill(gone, MED, 2);
    cfx_test_fill(keep, MED, 4);
    cfx_test_fill(again, MED, 5);
    struct cfx_object_id xgone, xkeep;
    cfx_object_id_generate(a, &xgone);
    cfx_object_id_generate(a, &xkeep);
    cr_assert_eq(cfx_put(a, &xgone, gone, MED, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &xkeep, keep, MED, NULL), CFX_OK, "%s", cfx_last_error());

    coord_run_restart(&co);

    /* returns once a's re-announce listed both objects (hook), before it
     * sent either */
    cr_assert_eq(cfx_delete(a, &xgone, NULL), CFX_OK, "%s", cfx_last_error());
    wait_reannounced(a, 20000);

    /* the kept object is back; the deleted one is not: its id is free */
    get_check(b, &xkeep, MED, 4);
    int rc = cfx_put(b, &xgone, again, MED, NULL);
    cr_assert_eq(rc, CFX_OK, "a put of the id deleted during the re-announce -> %s (%s)",
                 cfx_errname(rc), cfx_last_error());
    struct cfx_context *c = join();
    get_check(c, &xgone, MED, 5);

    cfx_context_destroy(c);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(gone);
    free(keep);
    free(again);
}

/* Issue: only what a node put was announced again after a restart, not
 * the copies it got.  The putter leaves before the restart with a complete
 * copy on another node: by the lifecycle the object lives on, but the
 * restarted directory never learnt of the copy, and a newcomer's get waited
 * for a new put (CFX_ERR_TIMEOUT).  Data-plane and inline objects. */
Test(coord_restart, copy_announced_after_putter_left)
{
    struct cfx_context *a = join(), *b = join();
    uint8_t *med = malloc(MED), *small = malloc(SMALL);
    uint8_t *bmed = malloc(MED), *bsmall = malloc(SMALL); /* b's copies live here */
    cfx_test_fill(med, MED, 6);
    cfx_test_fill(small, SMALL, 7);
    struct cfx_object_id xmed, xsmall;
    cfx_object_id_generate(a, &xmed);
    cfx_object_id_generate(a, &xsmall);
    cr_assert_eq(cfx_put(a, &xmed, med, MED, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &xsmall, small, SMALL, NULL), CFX_OK, "%s", cfx_last_error());
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &xmed, bmed, MED, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &xsmall, bsmall, SMALL, &got, NULL), CFX_OK, "%s",
                 cfx_last_error());
    uint32_t ida = cfx_context_node_id(a);
    cfx_context_destroy(a); /* b's complete copies keep both objects */

    coord_run_restart(&co);
    wait_reconnected(b, 15000);
    wait_reannounced(b, 20000);

    struct cfx_context *c = join();
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 5000 };
    uint8_t *dst = malloc(MED);
    int rc = cfx_get(c, &xmed, dst, MED, &got, &gp);
    cr_assert_eq(rc, CFX_OK, "get of a copy's object after the restart -> %s (%s)",
                 cfx_errname(rc), cfx_last_error());
    cr_assert_eq(got, MED);
    cr_assert_eq(cfx_test_check(dst, MED, 6), (size_t)-1, "bytes differ");
    rc = cfx_get(c, &xsmall, dst, MED, &got, &gp);
    cr_assert_eq(rc, CFX_OK, "get of a copy's inline object after the restart -> %s (%s)",
                 cfx_errname(rc), cfx_last_error());
    cr_assert_eq(got, SMALL);
    cr_assert_eq(cfx_test_check(dst, SMALL, 7), (size_t)-1, "bytes differ");
    /* still the object its putter put: the id is taken, and named so */
    struct cfx_context *d = join();
    rc = cfx_put(d, &xmed, med, MED, NULL);
    cr_assert_eq(rc, CFX_ERR_EXISTS, "a put of the id of a copy's object -> %s",
                 cfx_errname(rc));
    char want[32];
    snprintf(want, sizeof(want), "node %u put it", ida);
    cr_assert(strstr(cfx_last_error(), want), "%s (want \"%s\")", cfx_last_error(), want);

    cfx_context_destroy(d);
    cfx_context_destroy(c);
    cfx_context_destroy(b);
    free(dst);
    free(med);
    free(small);
    free(bmed);
    free(bsmall);
}

/* ---- durable inline objects ------------------------------------------------------ */

/* A member client named @p name; @p on_dead (may be NULL) hears the
 * coordinator's node-death events, @p on_back (may be NULL) its rejoins
 * after a reconnect. */
static struct cfx_ctl *open_ctl_cb(const char *name, void (*on_dead)(void *, uint32_t),
                                   void (*on_back)(void *))
{
    struct cfx_node_rec self;
    struct cfx_ctl *c = NULL;
    memset(&self, 0, sizeof(self));
    snprintf(self.name, sizeof(self.name), "%s", name);
    snprintf(self.host_id, sizeof(self.host_id), "test-host");
    self.pid = (uint32_t)getpid();
    struct cfx_ctl_params p = {
        .coord = co.cc.addr,
        .token = co.token,
        .role = CFX_CTL_ROLE_NODE,
        .self = &self,
        .timeout_ms = 5000,
        .on_node_dead = on_dead,
        .on_reconnected = on_back,
    };
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_OK, "%s", cfx_last_error());
    return c;
}

static struct cfx_ctl *open_ctl_with(const char *name, void (*on_dead)(void *, uint32_t))
{
    return open_ctl_cb(name, on_dead, NULL);
}

static struct cfx_ctl *open_ctl(const char *name)
{
    return open_ctl_with(name, NULL);
}

static void ctl_wait_reconnects(struct cfx_ctl *c, uint64_t n)
{
    uint64_t deadline = cfx__deadline_ns(15000);
    while (cfx__ctl_reconnects(c) < n && cfx__now_ns() < deadline)
        usleep(10 * 1000);
    cr_assert_geq(cfx__ctl_reconnects(c), n, "node %u did not reconnect", cfx__ctl_node_id(c));
}

static void rec_path(const struct cfx_object_id *id, char *buf, size_t cap)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    cfx_object_id_to_hex(id, hex);
    snprintf(buf, cap, "%s/obj.%s.rec", co.statedir, hex);
}

/* The coordinator serves @p id inline with @p size bytes of pattern @p seed. */
static void expect_inline(struct cfx_ctl *c, const struct cfx_object_id *id, size_t size,
                          uint32_t chunk, uint64_t seed)
{
    struct cfx_ctl_source src;
    int rc = cfx__ctl_obj_lookup_now(c, id, NULL, 0, cfx__deadline_ns(5000), &src);
    cr_assert_eq(rc, CFX_OK, "lookup: %s", cfx_last_error());
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(src.size, size);
    cr_assert_eq(src.chunk_size, chunk);
    cr_assert(src.data || size == 0);
    cr_assert_eq(cfx_test_check(src.data, size, seed), (size_t)-1, "bytes differ");
    free(src.data);
}

static void expect_gone(struct cfx_ctl *c, const struct cfx_object_id *id)
{
    struct cfx_ctl_source src;
    int rc = cfx__ctl_obj_lookup_now(c, id, NULL, 0, cfx__deadline_ns(5000), &src);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "object still served (%s)", cfx_errname(rc));
}

/* A record file the store accepts (framing and checksum right) with @p val. */
static void write_record(const char *key, const void *val, uint32_t vlen)
{
    char path[320];
    uint32_t klen = (uint32_t)strlen(key);
    size_t total = 8 + 8 + 4 + 4 + klen + vlen + 8;
    uint8_t *b = calloc(1, total);
    uint64_t h = 0xcbf29ce484222325ull;
    memcpy(b, "CFXSTAT1", 8);
    b[8] = 1;                                   /* version 1 */
    for (int i = 0; i < 4; i++) {
        b[16 + i] = (uint8_t)(klen >> (8 * i));
        b[20 + i] = (uint8_t)(vlen >> (8 * i));
    }
    memcpy(b + 24, key, klen);
    memcpy(b + 24 + klen, val, vlen);
    for (size_t i = 0; i < total - 8; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    for (int i = 0; i < 8; i++)
        b[total - 8 + i] = (uint8_t)(h >> (8 * i));
    snprintf(path, sizeof(path), "%s/%s.rec", co.statedir, key);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, total), (ssize_t)total);
    close(fd);
    free(b);
}

Test(coord_restart, durable_objects)
{
    struct cfx_ctl *a = open_ctl("putter"), *b = open_ctl("getter");
    uint32_t ida = cfx__ctl_node_id(a);
    uint8_t d[300], n[200], x[10], k[5000];
    cfx_test_fill(d, sizeof(d), 11);
    cfx_test_fill(n, sizeof(n), 12);
    cfx_test_fill(x, sizeof(x), 13);
    cfx_test_fill(k, sizeof(k), 14);
    struct cfx_object_id xd, xn, xx, xk, xe, xbad, xbad2;
    cfx_object_id_from_name("restart/durable", &xd);
    cfx_object_id_from_name("restart/plain", &xn);
    cfx_object_id_from_name("restart/deleted", &xx);
    cfx_object_id_from_name("restart/kept", &xk);
    cfx_object_id_from_name("restart/empty", &xe);
    cfx_object_id_from_name("restart/bad", &xbad);
    cfx_object_id_from_name("restart/bad2", &xbad2);
    uint64_t dl = cfx__deadline_ns(5000);

    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xd, sizeof(d), 128, d, dl), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(a, &xn, sizeof(n), 64, n, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xx, sizeof(x), 10, x, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xk, sizeof(k), 4096, k, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xe, 0, 0, NULL, dl), CFX_OK);
    /* only inline objects can be durable; a second put by the putter is refused */
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xbad, 100, 100, NULL, dl), CFX_ERR_INVALID);
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xd, sizeof(d), 128, d, dl), CFX_ERR_EXISTS);
    expect_inline(b, &xd, sizeof(d), 128, 11);
    expect_inline(b, &xn, sizeof(n), 64, 12);

    /* records exist for the durable ones only; a delete removes its record */
    char path[320];
    struct stat sb;
    rec_path(&xd, path, sizeof(path));
    cr_assert_eq(stat(path, &sb), 0, "no record %s", path);
    rec_path(&xn, path, sizeof(path));
    cr_assert_neq(stat(path, &sb), 0, "a plain object was recorded");
    rec_path(&xx, path, sizeof(path));
    cr_assert_eq(stat(path, &sb), 0);
    cr_assert_eq(cfx__ctl_obj_delete(a, &xx, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(stat(path, &sb), 0, "the record of a deleted object is still there");

    coord_run_restart(&co);
    ctl_wait_reconnects(a, 1);
    ctl_wait_reconnects(b, 1);
    cr_assert_eq(cfx__ctl_node_id(a), ida);

    /* durable: same bytes, size and chunk size; plain and deleted: gone */
    struct cfx_ctl *c = open_ctl("late");
    expect_inline(c, &xd, sizeof(d), 128, 11);
    expect_inline(c, &xk, sizeof(k), 4096, 14);
    expect_inline(c, &xe, 0, 0, 0);
    expect_gone(c, &xn);
    expect_gone(c, &xx);
    /* a plain object comes back when its putter announces it again */
    cr_assert_eq(cfx__ctl_obj_put(a, &xn, sizeof(n), 64, n, cfx__deadline_ns(5000)), CFX_OK);
    expect_inline(c, &xn, sizeof(n), 64, 12);

    /* b's holding did not survive; another holder's delete withdraws its
     * own copy only; a (the putter, no holder since the restart) may still
     * delete the object, and it goes with every copy and its record */
    dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__ctl_obj_delete(b, &xd, dl), CFX_ERR_NOT_FOUND);
    expect_inline(b, &xd, sizeof(d), 128, 11);
    cr_assert_eq(cfx__ctl_obj_delete(b, &xd, dl), CFX_OK);
    rec_path(&xd, path, sizeof(path));
    cr_assert_eq(stat(path, &sb), 0, "the record went with another holder's copy");
    expect_inline(b, &xd, sizeof(d), 128, 11);
    cr_assert_eq(cfx__ctl_obj_delete(a, &xd, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_delete(a, &xd, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_delete(c, &xd, dl), CFX_ERR_NOT_FOUND);
    cr_assert_neq(stat(path, &sb), 0, "the record of a deleted object is still there");
    expect_gone(c, &xd);

    /* corrupt records: a flipped byte (checksum), and a well-framed record
     * whose value is not a durable object (too short; size disagrees) */
    cfx__ctl_close(c);
    rec_path(&xe, path, sizeof(path));
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "\xff", 1, 40), 1);
    close(fd);
    char hex[CFX_OBJECT_ID_HEX_LEN], key[64];
    cfx_object_id_to_hex(&xbad, hex);
    snprintf(key, sizeof(key), "obj.%s", hex);
    write_record(key, "\x01short", 6);
    uint8_t lie[1 + 20 + 4 + 8 + 4 + 3] = { 1 };
    memcpy(lie + 1, xbad2.bytes, 20);
    lie[1 + 20 + 4] = 200;                      /* says 200 bytes, holds 3 */
    cfx_object_id_to_hex(&xbad2, hex);
    snprintf(key, sizeof(key), "obj.%s", hex);
    write_record(key, lie, sizeof(lie));

    coord_run_restart(&co);
    ctl_wait_reconnects(a, 2);
    c = open_ctl("late2");
    expect_gone(c, &xd);
    expect_gone(c, &xe);
    expect_gone(c, &xbad);
    expect_gone(c, &xbad2);
    expect_inline(c, &xk, sizeof(k), 4096, 14);
    cr_assert(cfx_test_file_contains(co.logpath, "is unreadable or corrupt"),
              "no error logged for the corrupt record file");
    cr_assert(cfx_test_file_contains(co.logpath, "is not a durable object"),
              "no error logged for the bad durable record");
    cr_assert_eq(kill(co.cc.pid, 0), 0, "the coordinator died");

    cfx__ctl_close(c);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

/* ---- a group bootstraps across a coordinator restart ---------------------------- */

struct rank_arg {
    struct cfx_context *ctx;
    int rank;
    const char *name;           /* "survivors" when NULL */
    int size;                   /* 3 when 0 */
    int timeout_ms;             /* 40000 when 0 */
    struct cfx_group *g;
    int rc;
    char err[256];
};

static void *rank_create(void *p)
{
    struct rank_arg *r = p;
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = r->name ? r->name : "survivors",
        .rank = r->rank,
        .size = r->size ? r->size : 3,
        .timeout_ms = r->timeout_ms ? r->timeout_ms : 40000,
    };
    r->rc = cfx_group_create(r->ctx, &gp, &r->g);
    if (r->rc != CFX_OK)
        snprintf(r->err, sizeof(r->err), "%s", cfx_last_error());
    return NULL;
}

static void *rank_allreduce(void *p)
{
    struct rank_arg *r = p;
    int32_t v[4];
    for (int i = 0; i < 4; i++)
        v[i] = (r->rank + 1) * (i + 1);
    r->rc = cfx_group_allreduce(r->g, v, v, 4, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    if (r->rc == CFX_OK)
        for (int i = 0; i < 4; i++)
            if (v[i] != 6 * (i + 1))
                r->rc = CFX_ERR_INVALID;
    return NULL;
}

static void run_ranks(struct rank_arg *r, int n, void *(*fn)(void *))
{
    pthread_t t[3];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fn, &r[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

Test(coord_restart, group_bootstrap_across_restart)
{
    struct rank_arg r[3];
    pthread_t t[2];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 3; i++)
        r[i].rank = i;
    r[0].ctx = join();
    r[1].ctx = join();
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, rank_create, &r[i]), 0);

    /* wait until ranks 0 and 1 have published (their slot-0 objects exist) */
    struct cfx_ctl *probe = open_ctl("probe");
    for (int q = 0; q < 2; q++) {
        char name[64];
        struct cfx_object_id id;
        struct cfx_ctl_source src;
        snprintf(name, sizeof(name), "cfx.group/survivors/0/%d/0", q);
        cfx_object_id_from_name(name, &id);
        cr_assert_eq(cfx__ctl_obj_lookup(probe, &id, NULL, 0, cfx__deadline_ns(20000), &src),
                     CFX_OK, "rank %d did not publish: %s", q, cfx_last_error());
        free(src.data);
    }
    cfx__ctl_close(probe);

    coord_run_restart(&co);
    wait_reconnected(r[0].ctx, 15000);
    wait_reconnected(r[1].ctx, 15000);

    /* the late rank finds the others through the durable objects */
    r[2].ctx = join();
    rank_create(&r[2]);
    cr_assert_eq(r[2].rc, CFX_OK, "late rank: %s", r[2].err);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(r[i].rc, CFX_OK, "rank %d: %s", i, r[i].err);
    }
    run_ranks(r, 3, rank_allreduce);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(r[i].rc, CFX_OK, "allreduce on rank %d: %s", i, cfx_strerror(r[i].rc));
    for (int i = 0; i < 3; i++) {
        cfx_group_destroy(r[i].g);
        cfx_context_destroy(r[i].ctx);
    }
}

/* This binary's path, for a child that execs a fresh image of it (the
 * constructors below run the child's part). */
static void self_exe(char *exe, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", exe, len - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
}

/* ---- a rank slow to reconnect is not taken for a dead one --------------------------- */

/*
 * Rank 1 of group "slowrejoin" in a child process: it execs a fresh image of
 * this binary (the constructor below runs the rank; this process has
 * threads, see test_coord.c), creates the group, runs one allreduce and
 * writes its status (CFX_OK, an error, or CFX_ERR_INVALID for wrong bytes)
 * to the pipe.
 */
#define RANK_CHILD_ENV "CFX_TEST_RESTART_RANK"
#define SLOW_N         4

static int slow_group(struct cfx_context *ctx, int rank, struct cfx_group **g)
{
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = "slowrejoin",
        .rank = rank,
        .size = 2,
        .timeout_ms = 40000,
    };
    return cfx_group_create(ctx, &gp, g);
}

/* One allreduce of SLOW_N int32s, checked: (rank + 1) * (i + 1) summed over 2 ranks. */
static int slow_allreduce(struct cfx_group *g, int rank)
{
    int32_t v[SLOW_N];
    for (int i = 0; i < SLOW_N; i++)
        v[i] = (rank + 1) * (i + 1);
    int rc = cfx_group_allreduce(g, v, v, SLOW_N, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    for (int i = 0; rc == CFX_OK && i < SLOW_N; i++)
        if (v[i] != 3 * (i + 1))
            rc = CFX_ERR_INVALID;
    return rc;
}

__attribute__((constructor)) static void rank_child_main(void)
{
    const char *spec = getenv(RANK_CHILD_ENV); /* "FD ADDR TOKEN" */
    int fd;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %63s %63s", &fd, a, tok) != 3)
        return;
    struct cfx_context *ctx = coord_run_join_at(a, tok, 20000);
    struct cfx_group *g = NULL;
    int32_t rc = ctx ? CFX_OK : CFX_ERR_CONNECT;
    if (rc == CFX_OK && (rc = slow_group(ctx, 1, &g)) == CFX_OK)
        rc = slow_allreduce(g, 1);
    if (rc != CFX_OK)
        fprintf(stderr, "rank 1 (child): %s\n", cfx_last_error());
    if (write(fd, &rc, sizeof(rc)) != sizeof(rc))
        _exit(1);
    cfx_group_destroy(g);
    cfx_context_destroy(ctx);
    _exit(0);
}

struct slow_rank0 {
    struct cfx_context *ctx;
    struct cfx_group *g;
    int rc;
    char err[256];
};

static void *slow_rank0_main(void *p)
{
    struct slow_rank0 *r = p;
    r->rc = slow_group(r->ctx, 0, &r->g);
    if (r->rc == CFX_OK)
        r->rc = slow_allreduce(r->g, 0);
    if (r->rc != CFX_OK)
        snprintf(r->err, sizeof(r->err), "%s", cfx_last_error());
    return NULL;
}

/*
 * Rank 1 publishes and waits for rank 0; it is stopped (SIGSTOP) while the
 * coordinator is killed and restarted, so it has not rejoined when rank 0
 * comes and reads its bootstrap object.  Its node is not dead, only not back
 * yet: rank 0 must wait for it rather than skip its object as stale (and
 * then wait for a slot-1 object that never comes).  Rank 1 is let go once
 * the coordinator has parked rank 0's query of its node; the coordinator
 * runs with a rejoin window far longer than that takes (--dead-after-ms
 * 10000), so the window is not what is tested.
 */
Test(coord_restart, rank_slow_to_rejoin)
{
    int fds[2];
    char spec[192], exe[512];
    cr_assert_eq(pipe(fds), 0);
    self_exe(exe, sizeof(exe));
    snprintf(spec, sizeof(spec), "%d %s %s", fds[1], co.cc.addr, co.token);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        setenv(RANK_CHILD_ENV, spec, 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);

    /* rank 1 has published (its slot-0 object exists): stop it */
    struct cfx_ctl *probe = open_ctl("probe");
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    cfx_object_id_from_name("cfx.group/slowrejoin/0/1/0", &id);
    int prc = cfx__ctl_obj_lookup(probe, &id, NULL, 0, cfx__deadline_ns(20000), &src);
    char perr[256];
    snprintf(perr, sizeof(perr), "%s", cfx_last_error());
    if (prc == CFX_OK)
        free(src.data);
    cfx__ctl_close(probe);
    if (prc != CFX_OK) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("rank 1 did not publish: %s", perr);
    }
    cr_assert_eq(kill(pid, SIGSTOP), 0);

    /* INFO for the restarted coordinator only: it logs the parked query */
    co.dead_after = "10000";
    setenv("CFX_LOG_LEVEL", "INFO", 1);
    coord_run_restart(&co);
    unsetenv("CFX_LOG_LEVEL");
    co.dead_after = "1500";

    struct slow_rank0 r0 = { .ctx = join() };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, slow_rank0_main, &r0), 0);
    /* let rank 1 go once rank 0's query of its node is parked (on code
     * without the wait there is no such query: go on after the bound) */
    uint64_t deadline = cfx__deadline_ns(15000);
    while (!cfx_test_file_contains(co.logpath, "waits for it to rejoin") &&
           cfx__now_ns() < deadline)
        usleep(10 * 1000);
    cr_assert_eq(kill(pid, SIGCONT), 0);
    pthread_join(t, NULL);

    /* rank 1's verdict, then the process (killed if it is still waiting) */
    int32_t crc = CFX_ERR_TIMEOUT;
    struct pollfd pfd = { .fd = fds[0], .events = POLLIN };
    if (poll(&pfd, 1, r0.rc == CFX_OK ? 30000 : 0) != 1 ||
        read(fds[0], &crc, sizeof(crc)) != (ssize_t)sizeof(crc))
        crc = CFX_ERR_TIMEOUT;
    close(fds[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    cr_assert_eq(r0.rc, CFX_OK, "rank 0: %s", r0.err);
    cr_assert_eq(crc, CFX_OK, "rank 1 (child): %s", cfx_strerror(crc));
    cfx_group_destroy(r0.g);
    cfx_context_destroy(r0.ctx);
}

/* ---- jobs killed before they destroyed their groups ----------------------------- */

/*
 * Rank RANK of the 2-rank group "killed" in a child process (an exec'd
 * image of this binary, as above): it creates the group, writes its status
 * and node id to the pipe, and waits to be killed with SIGKILL, leaving its
 * bootstrap object behind as a crashed or OOM-killed rank does.
 */
#define KILLED_CHILD_ENV "CFX_TEST_KILLED_RANK"
#define KILLED_RUNS      12 /* more than the slots a rank's object may take */

__attribute__((constructor)) static void killed_child_main(void)
{
    const char *spec = getenv(KILLED_CHILD_ENV); /* "FD RANK ADDR TOKEN NAME" */
    int fd, rank;
    char a[64], tok[64], name[32];
    if (!spec || sscanf(spec, "%d %d %63s %63s %31s", &fd, &rank, a, tok, name) != 5)
        return;
    struct cfx_context *ctx = coord_run_join_at(a, tok, 20000);
    struct cfx_group *g = NULL;
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = name, .rank = rank, .size = 2, .timeout_ms = 20000,
    };
    int32_t out[2] = { ctx ? cfx_group_create(ctx, &gp, &g) : CFX_ERR_CONNECT,
                       ctx ? (int32_t)cfx_context_node_id(ctx) : 0 };
    if (out[0] != CFX_OK)
        fprintf(stderr, "rank %d (child): %s\n", rank, cfx_last_error());
    if (write(fd, out, sizeof(out)) != sizeof(out))
        _exit(1);
    for (;;)
        pause();
}

static int durable_objects_in(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    cr_assert(d, "opendir %s: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));)
        n += !strncmp(e->d_name, "obj.", 4);
    closedir(d);
    return n;
}

/* The node deaths the coordinator told the probe of (its client thread
 * writes, the test waits on the condition). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    uint32_t ids[16];
    int n;
} deaths = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void on_death(void *arg, uint32_t node_id)
{
    (void)arg;
    pthread_mutex_lock(&deaths.lock);
    if (deaths.n < (int)CFX_ARRAY_SIZE(deaths.ids))
        deaths.ids[deaths.n++] = node_id;
    pthread_cond_broadcast(&deaths.cond);
    pthread_mutex_unlock(&deaths.lock);
}

static struct cfx_ctl *open_probe(void)
{
    cfx__cond_init_mono(&deaths.cond);
    deaths.n = 0;
    return open_ctl_with("probe", on_death);
}

static bool death_heard(uint32_t node_id) /* deaths.lock held */
{
    for (int i = 0; i < deaths.n; i++)
        if (deaths.ids[i] == node_id)
            return true;
    return false;
}

/*
 * Run @p run of the job: both ranks of group @p name join in child processes
 * and are killed with SIGKILL; returns once the coordinator told the probe
 * (open_probe()) that both nodes died.
 */
static void killed_run(const char *exe, int run, const char *name)
{
    pid_t pid[2];
    int rfd[2];
    int32_t got[2][2]; /* status, node id */
    pthread_mutex_lock(&deaths.lock);
    deaths.n = 0; /* the runs before have been heard */
    pthread_mutex_unlock(&deaths.lock);
    for (int r = 0; r < 2; r++) {
        int fds[2];
        char spec[192];
        cr_assert_eq(pipe(fds), 0);
        snprintf(spec, sizeof(spec), "%d %d %s %s %s", fds[1], r, co.cc.addr, co.token,
                 name);
        pid[r] = fork();
        cr_assert_geq(pid[r], 0);
        if (pid[r] == 0) {
            close(fds[0]);
            setenv(KILLED_CHILD_ENV, spec, 1);
            execl(exe, exe, (char *)NULL);
            _exit(127);
        }
        close(fds[1]);
        rfd[r] = fds[0];
    }
    for (int r = 0; r < 2; r++) {
        struct pollfd pfd = { .fd = rfd[r], .events = POLLIN };
        if (poll(&pfd, 1, 30000) != 1 ||
            read(rfd[r], got[r], sizeof(got[r])) != (ssize_t)sizeof(got[r]))
            got[r][0] = CFX_ERR_TIMEOUT;
        close(rfd[r]);
    }
    for (int r = 0; r < 2; r++) {
        kill(pid[r], SIGKILL);
        waitpid(pid[r], NULL, 0);
    }
    for (int r = 0; r < 2; r++)
        cr_assert_eq(got[r][0], CFX_OK, "run %d, rank %d: %s (its stderr says why)", run,
                     r, cfx_errname(got[r][0]));
    /* the coordinator saw both connections close and told the probe */
    uint64_t dl = cfx__deadline_ns(15000);
    pthread_mutex_lock(&deaths.lock);
    for (int r = 0; r < 2; r++) {
        while (!death_heard((uint32_t)got[r][1]) &&
               cfx__cond_wait_until(&deaths.cond, &deaths.lock, dl))
            ;
        bool heard = death_heard((uint32_t)got[r][1]);
        if (!heard)
            pthread_mutex_unlock(&deaths.lock);
        cr_assert(heard, "run %d: rank %d (node %d) not reported dead", run, r,
                  (int)got[r][1]);
    }
    pthread_mutex_unlock(&deaths.lock);
}

/*
 * A job whose ranks are killed right after they joined, KILLED_RUNS times
 * in a row on one coordinator: every run joins.  A killed rank's bootstrap
 * object used to stay (durable), and the next rank of that number skipped
 * it for the next slot; without withdrawing them once its group formed, the
 * run after BOOT_SLOTS such kills failed with CFX_ERR_NO_RESOURCE ("found 8
 * stale bootstrap objects") on that coordinator for good.  The coordinator
 * now drops them when it sees their putters die: no record stays.
 */
Test(coord_restart, killed_jobs_leave_no_pile_of_bootstrap_objects)
{
    char exe[512];
    self_exe(exe, sizeof(exe));
    struct cfx_ctl *probe = open_probe();
    for (int run = 0; run < KILLED_RUNS; run++)
        killed_run(exe, run, "killed");
    cfx__ctl_close(probe);
    int left = durable_objects_in(co.statedir);
    cr_assert_eq(left, 0, "%d bootstrap records of killed jobs stay", left);
}

/* The directory's object count and the state directory's records. */
static void expect_counts(struct cfx_ctl *probe, uint32_t objects, int records, int run)
{
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(probe, &st, cfx__deadline_ns(5000)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(st.objects, objects, "after run %d: %u objects", run, st.objects);
    int left = durable_objects_in(co.statedir);
    cr_assert_eq(left, records, "after run %d: %d records", run, left);
}

/*
 * Jobs killed with SIGKILL, each under a group name of its own (a job id in
 * the name, as a platform's jobs have): no later group of that name sweeps
 * their slots, and a durable object outlived its putter for as long as
 * nobody deleted it, so each killed rank left one object in the directory
 * and one record in the state directory for good (a long-running
 * coordinator filled up to --max-objects).  They go when their putter dies.
 */
Test(coord_restart, killed_jobs_under_new_names_leave_no_records)
{
    char exe[512], name[32];
    self_exe(exe, sizeof(exe));
    struct cfx_ctl *probe = open_probe();
    expect_counts(probe, 0, 0, -1);
    for (int run = 0; run < 4; run++) {
        snprintf(name, sizeof(name), "job-%d", run);
        killed_run(exe, run, name);
        expect_counts(probe, 0, 0, run);
    }
    cfx__ctl_close(probe);
}

/*
 * A durable object whose putter dies while the coordinator is down: the
 * restarted coordinator loads it and waits for the putter to rejoin; once
 * its rejoin window ended, the record and the object go, before a NODE_GET
 * of it is answered NOT_FOUND in the same tick (the answer came first, and
 * a loaded machine saw the record still there).
 */
Test(coord_restart, durable_object_of_a_putter_not_back_goes)
{
    struct cfx_ctl *a = open_ctl("putter");
    uint32_t ida = cfx__ctl_node_id(a);
    uint8_t d[100];
    cfx_test_fill(d, sizeof(d), 21);
    struct cfx_object_id x;
    char path[320];
    struct stat sb;
    cfx_object_id_from_name("restart/orphan", &x);
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &x, sizeof(d), 128, d, cfx__deadline_ns(5000)),
                 CFX_OK, "%s", cfx_last_error());
    coord_run_kill(&co);
    cfx__ctl_close(a); /* dies while the coordinator is down */
    coord_run_start(&co);

    struct cfx_ctl *probe = open_ctl("probe");
    rec_path(&x, path, sizeof(path));
    cr_assert_eq(stat(path, &sb), 0, "no record %s", path);
    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(probe, ida, &rec, cfx__deadline_ns(30000)),
                 CFX_ERR_NOT_FOUND, "%s", cfx_last_error());
    cr_assert_neq(stat(path, &sb), 0, "the record of a putter gone for good stays");
    expect_counts(probe, 0, 0, 0);
    cfx__ctl_close(probe);
}

/* The rejoins of the clients opened with on_rejoined (their client threads
 * count, the test waits on the condition). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    int n;
} rejoins = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void on_rejoined(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&rejoins.lock);
    rejoins.n++;
    pthread_cond_broadcast(&rejoins.cond);
    pthread_mutex_unlock(&rejoins.lock);
}

/* Until @p n rejoins were heard, for at most @p ms; whether they were. */
static bool rejoins_heard(int n, int ms)
{
    uint64_t dl = cfx__deadline_ns(ms);
    pthread_mutex_lock(&rejoins.lock);
    while (rejoins.n < n && cfx__cond_wait_until(&rejoins.cond, &rejoins.lock, dl))
        ;
    bool heard = rejoins.n >= n;
    pthread_mutex_unlock(&rejoins.lock);
    return heard;
}

/*
 * A state directory that lost its node id record (removed here; a corrupt
 * one is skipped alike) but kept its durable objects.  The restarted
 * coordinator gave ids afresh from 1 and opened no rejoin window: the
 * putter that stayed came back under the gone putter's id and was taken
 * for it, could not put its own object again (CFX_ERR_EXISTS), and the
 * gone putter's record stayed for as long as some node held its id.  The
 * putters' ids count as of before the restart now: the one that stayed
 * takes its id and its object back, a newcomer gets an id above theirs,
 * and the record of the putter not back goes when the window ends.
 */
Test(coord_restart, durable_objects_of_a_state_without_its_id_record)
{
    cfx__cond_init_mono(&rejoins.cond);
    struct cfx_ctl *a = open_ctl("gone putter"), *b = open_ctl_cb("putter", NULL, on_rejoined);
    uint32_t ida = cfx__ctl_node_id(a), idb = cfx__ctl_node_id(b);
    cr_assert_lt(ida, idb);
    uint8_t da[100], db[200];
    cfx_test_fill(da, sizeof(da), 31);
    cfx_test_fill(db, sizeof(db), 32);
    struct cfx_object_id xa, xb;
    char ids[320], patha[320], pathb[320];
    struct stat sb;
    cfx_object_id_from_name("restart/no-ids/gone", &xa);
    cfx_object_id_from_name("restart/no-ids/stays", &xb);
    uint64_t dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__ctl_obj_put_durable(a, &xa, sizeof(da), 128, da, dl), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put_durable(b, &xb, sizeof(db), 128, db, dl), CFX_OK, "%s",
                 cfx_last_error());
    rec_path(&xa, patha, sizeof(patha));
    rec_path(&xb, pathb, sizeof(pathb));
    snprintf(ids, sizeof(ids), "%s/coord.node_ids.rec", co.statedir);

    coord_run_kill(&co);
    cfx__ctl_close(a); /* dies while the coordinator is down */
    cr_assert_eq(unlink(ids), 0, "%s: %s", ids, strerror(errno));
    coord_run_start(&co);

    cr_assert(rejoins_heard(1, 15000), "node %u did not rejoin", idb);
    cr_assert_eq(cfx__ctl_node_id(b), idb, "the putter that stayed came back as node %u",
                 cfx__ctl_node_id(b));
    struct cfx_ctl *probe = open_ctl("probe");
    uint32_t idp = cfx__ctl_node_id(probe);
    cr_assert_gt(idp, idb, "a newcomer was given id %u, an id of before (putters %u, %u)", idp,
                 ida, idb);
    /* b's object is still b's: b may put it again (it holds it again) */
    expect_inline(probe, &xb, sizeof(db), 128, 32);
    cr_assert_eq(cfx__ctl_obj_put_durable(b, &xb, sizeof(db), 128, db, cfx__deadline_ns(5000)),
                 CFX_OK, "%s", cfx_last_error());

    /* a's id waits for its rejoin, then is not known; its record goes in
     * that tick (the status asked after it is answered after it) */
    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(probe, ida, &rec, cfx__deadline_ns(30000)),
                 CFX_ERR_NOT_FOUND, "%s", cfx_last_error());
    expect_counts(probe, 1, 1, 0);
    cr_assert_neq(stat(patha, &sb), 0, "the record of a putter gone for good stays");
    cr_assert_eq(stat(pathb, &sb), 0, "the record of the putter that stayed went");
    cr_assert_eq(stat(ids, &sb), 0, "the node id record was not written again");
    cr_assert(cfx_test_file_contains(co.logpath, "no node id record, yet durable objects"),
              "the coordinator did not say why ids continue above %u", idb);
    cfx__ctl_close(probe);
    cfx__ctl_close(b);
}

/*
 * A process joining as rank 0 of a group whose rank 0 is joined is told so
 * (CFX_ERR_EXISTS), after a killed run of that name.  The killed run's
 * bootstrap objects go with their putters now, so the next run's rank 0
 * takes slot 0.  (While a gone putter's record stood, the next run joined in
 * slot 1 and withdrew slot 0 below it, and a second rank 0 took that slot
 * unopposed until creations looked above theirs: a record still outlives its
 * putter until the rejoin window after a coordinator restart ends.)
 */
Test(coord_restart, a_rank_above_a_withdrawn_slot_is_still_taken)
{
    char exe[512];
    self_exe(exe, sizeof(exe));
    struct cfx_ctl *probe = open_probe();
    killed_run(exe, 0, "killed");

    struct rank_arg r[3];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 3; i++) {
        r[i].ctx = join();
        r[i].rank = i % 2;
        r[i].name = "killed";
        r[i].size = 2;
    }
    run_ranks(r, 2, rank_create);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(r[i].rc, CFX_OK, "rank %d: %s", i, r[i].err);
    /* the killed run's objects went with their putters: slot 0 is the
     * new rank 0's */
    struct cfx_object_id id;
    struct cfx_ctl_source src = { 0 };
    uint32_t in_slot = 0;
    cfx_object_id_from_name("cfx.group/killed/0/0/0", &id);
    int rc = cfx__ctl_obj_lookup_now(probe, &id, NULL, 0, cfx__deadline_ns(5000), &src);
    if (rc == CFX_OK && src.size >= 8)
        memcpy(&in_slot, (const uint8_t *)src.data + 4, 4); /* boot_rec.node_id */
    free(src.data);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(in_slot, cfx_context_node_id(r[0].ctx), "slot 0 holds node %u", in_slot);
    cfx__ctl_close(probe);

    r[2].timeout_ms = 5000;
    rank_create(&r[2]);
    cr_assert_eq(r[2].rc, CFX_ERR_EXISTS, "%s: %s", cfx_errname(r[2].rc), r[2].err);
    cr_assert(strstr(r[2].err, "already joined"), "%s", r[2].err);
    for (int i = 0; i < 3; i++) {
        cfx_group_destroy(r[i].g);
        cfx_context_destroy(r[i].ctx);
    }
}

/*
 * A rank whose node the restarted coordinator did not give its id back (it
 * came back after its rejoin window: its client held from reconnecting
 * until the window ended, as for a process stopped across the restart).
 * The new coordinator never knew the old id and sends no event; the other
 * rank, which kept its id, asks it about its peers as it rejoins and is
 * told, once the window ended, that the old id is gone.  Its barrier with
 * the rank, running from before then, and its receive from it fail with
 * CFX_ERR_PEER_FAILED naming the old id (before, they waited until their
 * deadline, 60 s here, and ended CFX_ERR_TIMEOUT).  The late rank's own
 * call fails at once, saying the others were told.
 */
Test(coord_restart, a_rank_back_after_its_window_fails_the_others_calls_with_it)
{
    struct rank_arg r[2];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 2; i++) {
        r[i].ctx = join();
        r[i].rank = i;
        r[i].name = "late";
        r[i].size = 2;
        r[i].timeout_ms = 60000; /* past the window by far: a call must not wait for it */
    }
    run_ranks(r, 2, rank_create);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(r[i].rc, CFX_OK, "rank %d: %s", i, r[i].err);
    const uint32_t was = cfx_context_node_id(r[1].ctx);
    const uint32_t a_id = cfx_context_node_id(r[0].ctx);

    cfx__ctl_test_hold_reconnect(r[1].ctx->ctl, true);
    coord_run_restart(&co);
    wait_reconnected(r[0].ctx, 15000);
    cr_assert_eq(cfx_context_node_id(r[0].ctx), a_id, "rank 0 did not keep its id");
    /* rank 0's barrier waits for rank 1, until it hears the old id is gone */
    int rc = cfx_group_barrier(r[0].g, NULL);
    const char *err = cfx_last_error();
    char want[96];
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "barrier: %s: %s", cfx_errname(rc), err);
    snprintf(want, sizeof(want), "rank 1 (node %u)", was);
    cr_expect(strstr(err, want), "barrier: '%s' missing: %s", want, err);
    cr_expect(strstr(err, "died"), "barrier: %s", err);
    int32_t v = 0;
    rc = cfx_group_recv(r[0].g, &v, sizeof(v), 1, 7, NULL);
    err = cfx_last_error();
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "recv: %s: %s", cfx_errname(rc), err);
    cr_expect(strstr(err, want), "recv: '%s' missing: %s", want, err);
    /* the coordinator says the same of the old id now */
    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(r[0].ctx->ctl, was, &rec, cfx__deadline_ns(30000)),
                 CFX_ERR_NOT_FOUND, "%s", cfx_last_error());

    cfx__ctl_test_hold_reconnect(r[1].ctx->ctl, false);
    uint64_t dl = cfx__deadline_ns(20000);
    pthread_mutex_lock(&r[1].ctx->lock);
    while (r[1].ctx->node_id == was && cfx__obj_wait(r[1].ctx, dl))
        ;
    const uint32_t now = r[1].ctx->node_id;
    pthread_mutex_unlock(&r[1].ctx->lock);
    cr_assert_neq(now, was, "node %u got its id back after its window", was);

    rc = cfx_group_barrier(r[1].g, NULL);
    err = cfx_last_error();
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "%s: %s", cfx_errname(rc), err);
    snprintf(want, sizeof(want), "rejoined as node %u", now);
    cr_expect(strstr(err, want), "'%s' missing: %s", want, err);
    cr_expect(strstr(err, "restarted and did not give the id back"), "%s", err);
    cr_expect(strstr(err, "once its rejoin window ended"), "%s", err);
    cr_expect(!strstr(err, "nobody tells them"), "%s", err);
    cr_expect(strstr(err, "create a new group"), "%s", err);
    for (int i = 0; i < 2; i++) {
        cfx_group_destroy(r[i].g);
        cfx_context_destroy(r[i].ctx);
    }
}

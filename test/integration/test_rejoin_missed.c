/*
 * Deaths and leaves that a node missed while it was cut off from the
 * coordinator.  The coordinator tells its members once, as it happens, that
 * a node died or left; a node cut off then (stopped, or its control
 * connection lost past the heartbeat deadline) never heard it.  When it came
 * back under its new id it also dropped its record of the peers whose
 * connections had ended meanwhile (taking them all for peers that only
 * dropped its old id), so a receive from a peer that had really gone waited
 * for its whole deadline.  Now the node asks the coordinator about each peer
 * it dealt with as it rejoins (engine/reannounce.c), and such a receive
 * fails at once with CFX_ERR_PEER_FAILED naming the peer; a live peer's
 * messages still come.
 *
 * Node A (context 0) is cut off by hand: its control socket is shut and its
 * client held from reconnecting (cfx__ctl_test_hold_reconnect), so the
 * coordinator declares it dead at once while its data plane runs on.
 * Meanwhile peer B leaves (its context destroyed), or B, a process of its
 * own, is killed by its pid, or B is cut off too while serving A a get (the
 * coordinator declares it dead with its data plane up).  Then A is let go
 * and rejoins under a new id.  And a rejoin that keeps its id: the
 * coordinator restarts while B is held from reconnecting past the new
 * coordinator's rejoin window; A is told B's old id is gone once the window
 * ended (before, such a rejoin asked nothing).  Each step waits for its
 * condition (the members the coordinator counts alive, the new id, the
 * re-announce round), never for a time; the calls' deadline (60 s) is past
 * the test's limit, so one that waited for it fails the test.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_RANKS 3
#include "cluster_up.h"
#include "control/client_int.h"
#include "dataplane/engine/engine.h"
#include "dataplane/engine/p2p.h"

#define CALL_MS  60000 /* past the test's .timeout: a call must not wait for it */
#define HANG_MS  20000 /* a condition that never comes: ends a hang only */
#define MSG_LEN  64    /* eager */
#define MSG_CHAN 0x6d6973736564ull

/* The coordinator's record of node @p id, asked from @p ctx. */
static struct cfx_node_rec node_rec(struct cfx_context *ctx, uint32_t id)
{
    struct cfx_node_rec rec;
    int rc = cfx__ctl_node_get(ctx->ctl, id, &rec, cfx__deadline_ns(HANG_MS));
    cr_assert_eq(rc, CFX_OK, "node %u: %s", id, cfx_last_error());
    return rec;
}

/* @p from sends tag @p tag (bytes of stream @p tag) to @p to; @p to
 * receives it from @p from, checked byte for byte. */
static void message(struct cfx_context *from, struct cfx_context *to, uint32_t tag)
{
    struct cfx_node_rec dst = node_rec(from, to->node_id), src = node_rec(to, from->node_id);
    uint8_t out[MSG_LEN], in[MSG_LEN] = { 0 };
    struct cfx_p2p_req *s, *r;
    cfx_test_fill(out, sizeof(out), tag);
    cr_assert_eq(cfx__p2p_irecv(to, &src, MSG_CHAN, tag, in, sizeof(in), CFX_MEMTYPE_HOST, &r),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__p2p_isend(from, &dst, MSG_CHAN, tag, out, sizeof(out), CFX_MEMTYPE_HOST,
                                &s), CFX_OK, "%s", cfx_last_error());
    int rc = cfx__p2p_wait_free(r, cfx__deadline_ns(CALL_MS));
    cr_assert_eq(rc, CFX_OK, "receive from node %u: %s: %s", from->node_id, cfx_errname(rc),
                 cfx_last_error());
    rc = cfx__p2p_wait_free(s, cfx__deadline_ns(CALL_MS));
    cr_assert_eq(rc, CFX_OK, "send to node %u: %s: %s", to->node_id, cfx_errname(rc),
                 cfx_last_error());
    cr_assert_eq(cfx_test_check(in, sizeof(in), tag), (size_t)-1, "message %u differs", tag);
}

/* Until the coordinator counts @p n members alive. */
static void members(uint32_t n)
{
    int rc = cfx__coord_wait_members(coord, n, cfx__deadline_ns(HANG_MS));
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    uint32_t joined, alive;
    cfx__coord_member_counts(coord, &joined, &alive);
    cr_assert_eq(alive, n, "%u members alive, not %u", alive, n);
}

/* Cut @p ctx off: its control connection shut, its client held from
 * reconnecting; returns once the coordinator declared it dead (@p alive
 * members are left). */
static void cut_off(struct cfx_context *ctx, uint32_t alive)
{
    cfx__ctl_test_hold_reconnect(ctx->ctl, true);
    shutdown(ctx->ctl->fd, SHUT_RDWR);
    members(alive);
}

/* Let @p ctx reconnect; returns its new node id once it took it
 * (reannounce.c adopt_node_id). */
static uint32_t let_back(struct cfx_context *ctx, uint32_t was)
{
    cfx__ctl_test_hold_reconnect(ctx->ctl, false);
    uint64_t dl = cfx__deadline_ns(HANG_MS);
    pthread_mutex_lock(&ctx->lock);
    while (ctx->node_id == was && cfx__obj_wait(ctx, dl))
        ;
    uint32_t now = ctx->node_id;
    pthread_mutex_unlock(&ctx->lock);
    cr_assert_neq(now, was, "node %u did not rejoin under a new id", was);
    return now;
}

/* A receive on @p ctx from @p peer fails at once, naming it and @p how. */
static void recv_fails(struct cfx_context *ctx, const struct cfx_node_rec *peer, const char *how)
{
    uint8_t in[MSG_LEN];
    struct cfx_p2p_req *r;
    cr_assert_eq(cfx__p2p_irecv(ctx, peer, MSG_CHAN, 99, in, sizeof(in), CFX_MEMTYPE_HOST, &r),
                 CFX_OK, "%s", cfx_last_error());
    int rc = cfx__p2p_wait_free(r, cfx__deadline_ns(CALL_MS));
    const char *err = cfx_last_error();
    char want[96];
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "%s: %s", cfx_errname(rc), err);
    snprintf(want, sizeof(want), "receive from node %u", peer->node_id);
    cr_expect(strstr(err, want), "'%s' missing: %s", want, err);
    snprintf(want, sizeof(want), "node %u %s", peer->node_id, how);
    cr_expect(strstr(err, want), "'%s' missing: %s", want, err);
}

/* ---- a peer that left ---------------------------------------------------------- */

/*
 * A (context 0) has had messages from B and C (contexts 1 and 2); A is cut
 * off; B leaves in good order; A comes back.  A's receive from B fails at
 * once ("left the cluster"); C, alive, which dropped A's old node and so
 * ended its connections with it too, still reaches A under the new id.
 */
static void peer_left(const char *tp)
{
    up(tp, 3);
    struct cfx_context *a = ctxs[0];
    message(ctxs[1], a, 1);
    message(ctxs[2], a, 2);
    const struct cfx_node_rec b = node_rec(a, ctxs[1]->node_id);
    const uint32_t was = a->node_id;

    cut_off(a, 2);
    cfx_context_destroy(ctxs[1]);
    ctxs[1] = NULL;
    members(1);
    let_back(a, was);
    members(2);

    recv_fails(a, &b, "left the cluster");
    message(ctxs[2], a, 3);
    down(3);
}

/* ---- a peer killed -------------------------------------------------------------- */

/*
 * Node B in a process of its own: this binary run again (the constructor
 * below is B; this process has threads), which joins the coordinator of
 * this one, sends A one message, writes its node id to the pipe and waits
 * to be killed.
 */
#define PEER_ENV "CFX_TEST_MISSED_PEER"

__attribute__((constructor)) static void peer_main(void)
{
    const char *spec = getenv(PEER_ENV); /* "IN OUT ADDR TOKEN TP A" */
    int in, out;
    unsigned a_id;
    char addr[64], tok[64], tp[16];
    if (!spec || sscanf(spec, "%d %d %63s %63s %15s %u", &in, &out, addr, tok, tp, &a_id) != 6)
        return;
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS,
        .coord = addr, .token = tok, .transports = tp,
    };
    struct cfx_context *ctx = NULL;
    struct cfx_node_rec a;
    struct cfx_p2p_req *s = NULL;
    uint8_t msg[MSG_LEN];
    cfx_test_fill(msg, sizeof(msg), 1);
    if (cfx_context_create(&cp, &ctx) != CFX_OK ||
        cfx__ctl_node_get(ctx->ctl, a_id, &a, cfx__deadline_ns(HANG_MS)) != CFX_OK ||
        cfx__p2p_isend(ctx, &a, MSG_CHAN, 1, msg, sizeof(msg), CFX_MEMTYPE_HOST, &s) != CFX_OK ||
        cfx__p2p_wait_free(s, cfx__deadline_ns(HANG_MS)) != CFX_OK) {
        fprintf(stderr, "peer (child): %s\n", cfx_last_error());
        _exit(2);
    }
    uint32_t id = ctx->node_id;
    char c;
    if (write(out, &id, sizeof(id)) != sizeof(id) || read(in, &c, 1) < 0)
        _exit(3);
    cfx_context_destroy(ctx); /* the parent gave up before killing it */
    _exit(0);
}

/*
 * A has had a message from B, a process of its own; A is cut off; B is
 * killed (SIGKILL by its pid: A's connection with it breaks while A is
 * away); A comes back.  A's receive from B fails at once ("died").
 */
static void peer_killed(const char *tp)
{
    int to[2], from[2];
    char spec[256], exe[512];
    up(tp, 1);
    struct cfx_context *a = ctxs[0];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    cr_assert_eq(pipe(to), 0);
    cr_assert_eq(pipe(from), 0);
    snprintf(spec, sizeof(spec), "%d %d %s %s %s %u", to[0], from[1], coord_addr, token, tp,
             a->node_id);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(to[1]); /* its read ends when this process goes */
        close(from[0]);
        setenv(PEER_ENV, spec, 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    uint32_t b_id = 0;
    cr_assert_eq(read(from[0], &b_id, sizeof(b_id)), (ssize_t)sizeof(b_id),
                 "the peer process did not start");
    /* its message, received here: A has dealt with B */
    struct cfx_node_rec b = node_rec(a, b_id);
    uint8_t in[MSG_LEN] = { 0 };
    struct cfx_p2p_req *r;
    cr_assert_eq(cfx__p2p_irecv(a, &b, MSG_CHAN, 1, in, sizeof(in), CFX_MEMTYPE_HOST, &r),
                 CFX_OK);
    int rc = cfx__p2p_wait_free(r, cfx__deadline_ns(CALL_MS));
    cr_assert_eq(rc, CFX_OK, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(cfx_test_check(in, sizeof(in), 1), (size_t)-1, "the message differs");
    const uint32_t was = a->node_id;

    cut_off(a, 1);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    members(0);
    let_back(a, was);
    members(1);

    recv_fails(a, &b, "died");
    close(to[1]);
    close(from[0]);
    down(1);
}

/* ---- a peer declared dead, a get from it under way ---------------------------- */

#define OBJ_CHUNK  (64u * 1024)
#define OBJ_CHUNKS 8u

/*
 * B (context 1) puts an object and serves A's get of it, stalling after its
 * first chunk (test hook: B stays alive and holds the rest).  A is cut off;
 * then B is cut off too (its client held as A's), so the coordinator
 * declares it dead with its data plane still up: nothing on A's connection
 * with B says so.  A comes back.  Its get, which had waited for B's next
 * chunk, fails at once naming B (the object went with its only holder),
 * and so does a receive from B.
 */
static void peer_dead_get(const char *tp)
{
    up(tp, 2);
    struct cfx_context *a = ctxs[0], *bc = ctxs[1];
    struct cfx_object_id id;
    const size_t size = (size_t)OBJ_CHUNK * OBJ_CHUNKS;
    uint8_t *src = malloc(size), *dst = calloc(1, size);
    cr_assert(src && dst);
    cfx_test_fill(src, size, 5);
    cr_assert_eq(cfx_object_id_generate(bc, &id), CFX_OK);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE | CFX_OBJ_PARAM_FLAGS,
                                 .chunk_size = OBJ_CHUNK, .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(bc, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    message(bc, a, 1);
    cfx__xfer_test_stall(bc, 1);

    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = CALL_MS };
    struct cfx_request *req = NULL;
    cr_assert_eq(cfx_get_nb(a, &id, dst, size, &gp, &req), CFX_OK, "%s", cfx_last_error());
    /* until B's first chunk landed (polled: progress wakes nobody) */
    uint64_t done = 0, total = 0, dl = cfx__deadline_ns(HANG_MS);
    while ((cfx_request_progress(req, &done, &total) == CFX_ERR_AGAIN || done < OBJ_CHUNK) &&
           cfx__now_ns() < dl) {
        pthread_mutex_lock(&a->lock);
        cfx__obj_wait(a, cfx__deadline_ns(1));
        pthread_mutex_unlock(&a->lock);
    }
    cr_assert_eq(done, OBJ_CHUNK, "%llu bytes landed, not the first chunk",
                 (unsigned long long)done);
    const struct cfx_node_rec b = node_rec(a, bc->node_id);
    const uint32_t was = a->node_id;

    cut_off(a, 1);
    cut_off(bc, 0);
    let_back(a, was);

    int rc = cfx_request_wait(req, CALL_MS);
    const char *err = cfx_last_error();
    char want[64];
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "get: %s: %s", cfx_errname(rc), err);
    snprintf(want, sizeof(want), "source node %u failed", b.node_id);
    cr_expect(strstr(err, want), "get: '%s' missing: %s", want, err);
    snprintf(want, sizeof(want), "its putter node %u died", b.node_id);
    cr_expect(strstr(err, want), "get: '%s' missing: %s", want, err);
    cfx_request_free(req);
    recv_fails(a, &b, "died");

    cfx__xfer_test_resume(bc);
    let_back(bc, b.node_id);
    down(2);
    free(src);
    free(dst);
}

/* ---- a peer gone across a coordinator restart, the id kept ------------------- */

/* Stop the coordinator and start a new one on its port, without a state
 * directory: it learns it restarted from the first rejoin that names an id,
 * gives ids back within its rejoin window (coord.c) and holds a query of an
 * id of before until that node is back or the window ends. */
static void restart_coord(void)
{
    uint16_t port = cfx__coord_port(coord);
    cfx__coord_stop(coord);
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = port, .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "%s", cfx_last_error());
}

/* Until @p ctx finished its re-announce round after the restart; it kept
 * its id @p was. */
static void back_as(struct cfx_context *ctx, uint32_t was)
{
    uint64_t dl = cfx__deadline_ns(HANG_MS);
    pthread_mutex_lock(&ctx->lock);
    while (ctx->reannounce_rounds == 0 && cfx__obj_wait(ctx, dl))
        ;
    const uint64_t rounds = ctx->reannounce_rounds;
    const uint32_t now = ctx->node_id;
    pthread_mutex_unlock(&ctx->lock);
    cr_assert_gt(rounds, 0, "node %u did not rejoin", was);
    cr_assert_eq(now, was, "node %u rejoined as node %u", was, now);
}

/*
 * A (context 0) has had messages from B and C; the coordinator restarts; B
 * is held from reconnecting past the new coordinator's rejoin window (a
 * process stopped across the restart: its data plane up, nothing on A's
 * connection with it says so), A and C rejoin at once and keep their ids.
 * The new coordinator never knew B and sends nobody an event.  A asks it
 * about its peers as it rejoins and hears, once the window ended, that B's
 * id is not known: its receive from B fails with CFX_ERR_PEER_FAILED naming
 * B (before, a rejoin that kept its id asked nothing and the receive
 * waited for its deadline).  C's message still arrives; B comes back under
 * a new id.
 */
static void peer_gone_across_restart(const char *tp)
{
    up(tp, 3);
    struct cfx_context *a = ctxs[0], *bc = ctxs[1], *c = ctxs[2];
    message(bc, a, 1);
    message(c, a, 2);
    const struct cfx_node_rec b = node_rec(a, bc->node_id);
    const uint32_t a_was = a->node_id, c_was = c->node_id;

    cfx__ctl_test_hold_reconnect(bc->ctl, true);
    restart_coord();
    back_as(a, a_was);
    back_as(c, c_was);

    recv_fails(a, &b, "died");
    message(c, a, 3);

    let_back(bc, b.node_id);
    down(3);
}

/* ---- the new id taken before the calls go on --------------------------------------- */

struct waiting_call {
    struct cfx_context *ctx;
    uint32_t peer;
    int rc;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* A control call that waits for @p arg's node to rejoin. */
static void *waiting_call_main(void *arg)
{
    struct waiting_call *w = arg;
    struct cfx_node_rec rec;
    int rc = cfx__ctl_node_get(w->ctx->ctl, w->peer, &rec, cfx__deadline_ns(CALL_MS));
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->done = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/*
 * A rejoin under a new id: the calls that waited for it go on only once the
 * data plane answers to the new id.  It took it on the re-announce thread,
 * after they went on: a task's result that A put at once was looked up
 * under the new id by a peer, whose connection A refused ("does not prove
 * the cluster token for the node id it claims", the proof being bound to
 * A's old id), and the peer's get waited for another holder until its
 * deadline.  Here A's context lock is held while A rejoins, so the id
 * cannot be taken: a control call waiting for the rejoin must not return
 * meanwhile.  It did (the id still the old one) before.
 */
static void new_id_before_calls(const char *tp)
{
    up(tp, 2);
    struct cfx_context *a = ctxs[0];
    struct waiting_call w = { .ctx = a, .peer = ctxs[1]->node_id };
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    const uint32_t was = a->node_id;
    pthread_t th;

    cut_off(a, 1);
    cr_assert_eq(pthread_create(&th, NULL, waiting_call_main, &w), 0);
    pthread_mutex_lock(&a->lock);
    cfx__ctl_test_hold_reconnect(a->ctl, false);
    /* the client rejoins at once (its attempt waited for the hold), then needs
     * the lock held here before the call may go on: it did not go on within
     * 2 s (before: at once) */
    uint64_t dl = cfx__deadline_ns(2000);
    pthread_mutex_lock(&w.mu);
    while (!w.done && cfx__now_ns() < dl)
        cfx__cond_wait_until(&w.cv, &w.mu, dl);
    const bool went = w.done;
    pthread_mutex_unlock(&w.mu);
    const uint32_t then = a->node_id;
    pthread_mutex_unlock(&a->lock);
    cr_assert(!went, "a call that waited for the rejoin went on while the data plane still "
              "answered to node %u (the coordinator gave node %u)", then,
              cfx__ctl_node_id(a->ctl));
    pthread_join(th, NULL);
    cr_assert_eq(w.rc, CFX_OK, "%s", cfx_last_error());
    pthread_mutex_lock(&a->lock);
    const uint32_t now = a->node_id;
    pthread_mutex_unlock(&a->lock);
    cr_assert_neq(now, was, "node %u did not rejoin under a new id", was);
    cr_assert_eq(now, cfx__ctl_node_id(a->ctl));
    message(ctxs[1], a, 1); /* the peer reaches it under the new id */
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    down(2);
}

/* Test @p name_tcp and @p name_shm: @p fn over that transport. */
#define ON_TCP_AND_SHM(name, fn)                     \
    Test(rejoin_missed, name##_tcp, .timeout = 40) \
    {                                              \
        fn("tcp");                                 \
    }                                              \
    Test(rejoin_missed, name##_shm, .timeout = 40) \
    {                                              \
        fn("shm");                                 \
    }

ON_TCP_AND_SHM(a_receive_from_a_peer_that_left_meanwhile_fails_at_once, peer_left)
ON_TCP_AND_SHM(a_receive_from_a_peer_killed_meanwhile_fails_at_once, peer_killed)
ON_TCP_AND_SHM(a_get_from_a_peer_declared_dead_meanwhile_fails_at_once, peer_dead_get)
ON_TCP_AND_SHM(a_receive_from_a_peer_gone_across_a_restart_fails_the_id_kept,
               peer_gone_across_restart)
ON_TCP_AND_SHM(a_rejoin_takes_its_new_id_before_the_waiting_calls_go_on, new_id_before_calls)

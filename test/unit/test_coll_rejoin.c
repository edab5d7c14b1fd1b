/*
 * A rank that came back as another node.  A rank whose process was stopped
 * or cut off past the coordinator's heartbeat deadline is declared dead:
 * the other ranks drop it and go on.  Once it runs again its control
 * client rejoins under a new node id, which no rank of its groups knows.
 * Its calls on such a group failed after a wait with a text that blamed
 * the live peer ("no rank of the group is known to have died, and rank 0
 * did not say why"); now they fail at once with CFX_ERR_PEER_FAILED naming
 * both ids and saying to make a new group, and a new group of the same
 * name forms (its epoch is counted under the id the context joined with).
 *
 * The cut is made by hand (shutdown of the control socket): the coordinator
 * declares the node dead at once, and a rejoin after that gets a new id.
 * Each step waits for its condition (the new id adopted, the death heard),
 * never for a time; the groups' deadline (60 s) is past the test's limit,
 * so a call that waited for it fails the test.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_RANKS 2
#include "control/client_int.h"
#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#include "group_ranks.h"

#define GROUP_MS 60000 /* past the test's .timeout: a call must not wait for it */
#define HANG_MS  20000 /* a condition that never comes: ends a hang only */

/* A rank's group (group_ranks.h), created on both ranks at once. */
static void *create_one(void *arg)
{
    struct rank_run *b = arg;
    b->rc = rank_group_create(b);
    snprintf(b->err, sizeof(b->err), "%s", cfx_last_error());
    return NULL;
}

static void *sum_one(void *arg)
{
    struct rank_run *b = arg;
    int32_t v = b->rank + 1, s = 0;
    b->rc = cfx_group_allreduce(b->g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    snprintf(b->err, sizeof(b->err), "%s", cfx_last_error());
    if (b->rc == CFX_OK && s != 3)
        b->rc = cfx__err(CFX_ERR_INTERNAL, "sum %d, not 3", (int)s);
    return NULL;
}

/* @p fn on both ranks at once (a creation waits for the other rank). */
static void on_both(struct rank_run *b, void *(*fn)(void *))
{
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        cr_assert_eq(pthread_create(&th[r], NULL, fn, &b[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(b[r].rc, CFX_OK, "rank %d: %s: %s", r, cfx_errname(b[r].rc), b[r].err);
}

/* Group @p name of ranks 0 and 1 (contexts 0 and 1), its allreduce right. */
static void group_up(struct rank_run *b, const char *name)
{
    for (int r = 0; r < 2; r++)
        b[r] = (struct rank_run){ .rank = r, .size = 2, .name = name,
                                  .timeout_ms = GROUP_MS, .ctx = ctxs[r] };
    on_both(b, create_one);
    on_both(b, sum_one);
}

/* Context 1's control connection cut: the coordinator declares node @p was
 * dead and the client rejoins under a new id, returned once the context
 * took it (reannounce.c adopt_node_id). */
static uint32_t cut_and_rejoin(uint32_t was)
{
    struct cfx_context *c = ctxs[1];
    shutdown(c->ctl->fd, SHUT_RDWR);
    uint64_t dl = cfx__deadline_ns(HANG_MS);
    pthread_mutex_lock(&c->lock);
    while (c->node_id == was && cfx__obj_wait(c, dl))
        ;
    uint32_t now = c->node_id;
    pthread_mutex_unlock(&c->lock);
    cr_assert_neq(now, was, "node %u did not rejoin under a new id", was);
    return now;
}

/* Context 0 heard that node @p was died (cfx__node_gone, set by its
 * progress thread). */
static void death_heard(uint32_t was)
{
    struct cfx_context *c = ctxs[0];
    uint64_t dl = cfx__deadline_ns(HANG_MS);
    pthread_mutex_lock(&c->lock);
    while (cfx__node_gone(c, was) != CFX_NODE_DEAD && cfx__obj_wait(c, dl))
        ;
    int gone = cfx__node_gone(c, was);
    pthread_mutex_unlock(&c->lock);
    cr_assert_eq(gone, CFX_NODE_DEAD, "node 0 never heard that node %u died", was);
}

/* The error of a call of the rank that came back as node @p now. */
static void says_moved(const char *call, int rc, const char *err, uint32_t was, uint32_t now)
{
    char want[128];
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "%s: %s: %s", call, cfx_errname(rc), err);
    snprintf(want, sizeof(want), "declared this rank's node %u dead", was);
    cr_expect(strstr(err, want), "%s: '%s' missing: %s", call, want, err);
    snprintf(want, sizeof(want), "rejoined as node %u", now);
    cr_expect(strstr(err, want), "%s: '%s' missing: %s", call, want, err);
    cr_expect(strstr(err, "create a new group"), "%s: %s", call, err);
    cr_expect(!strstr(err, "did not say why"), "%s: %s", call, err);
}

/* Destroy the old group on both ranks, create @p name again (the same
 * name: the rank that came back meets the other at the next epoch), and
 * its allreduce is right. */
static void new_group_works(struct rank_run *b, const char *name)
{
    for (int r = 0; r < 2; r++)
        cfx_group_destroy(b[r].g);
    group_up(b, name);
    for (int r = 0; r < 2; r++)
        cfx_group_destroy(b[r].g);
}

static void calls_after_rejoin(const char *tp)
{
    struct rank_run b[2];
    up(tp, 2);
    group_up(b, "rejoin");
    const uint32_t was = ctxs[1]->node_id;
    const uint32_t now = cut_and_rejoin(was);
    death_heard(was);

    /* every call of the rank that came back fails at once */
    int32_t v = 2, s = 0;
    int rc = cfx_group_allreduce(b[1].g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    says_moved("allreduce", rc, cfx_last_error(), was, now);
    rc = cfx_group_barrier(b[1].g, NULL);
    says_moved("barrier", rc, cfx_last_error(), was, now);
    rc = cfx_group_send(b[1].g, &v, sizeof(v), 0, 7, NULL);
    says_moved("send", rc, cfx_last_error(), was, now);
    rc = cfx_group_recv(b[1].g, &s, sizeof(s), 0, 7, NULL);
    says_moved("recv", rc, cfx_last_error(), was, now);
    struct cfx_request *req = NULL;
    rc = cfx_group_iallreduce(b[1].g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL, &req);
    says_moved("iallreduce", rc, cfx_last_error(), was, now);
    cr_expect_null(req, "a failed post returned a request");
    /* a call wrong in itself is still told so, before anything else */
    rc = cfx_group_allreduce(b[1].g, NULL, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    cr_expect_eq(rc, CFX_ERR_INVALID, "allreduce of NULL: %s: %s", cfx_errname(rc),
                 cfx_last_error());
    rc = cfx_group_iallreduce(b[1].g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL, NULL);
    cr_expect_eq(rc, CFX_ERR_INVALID, "iallreduce without a request pointer: %s: %s",
                 cfx_errname(rc), cfx_last_error());

    /* the other rank says that this one died, naming its old id */
    rc = cfx_group_allreduce(b[0].g, &v, &s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    char want[64];
    snprintf(want, sizeof(want), "rank 1 (node %u) died", was);
    cr_expect_eq(rc, CFX_ERR_PEER_FAILED, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), want), "'%s' missing: %s", want, cfx_last_error());

    new_group_works(b, "rejoin");
    down(2);
}

/* Test @p name_tcp and @p name_shm: @p fn over that transport. */
#define ON_TCP_AND_SHM(name, fn)                  \
    Test(coll_rejoin, name##_tcp, .timeout = 30) \
    {                                            \
        fn("tcp");                               \
    }                                            \
    Test(coll_rejoin, name##_shm, .timeout = 30) \
    {                                            \
        fn("shm");                               \
    }

ON_TCP_AND_SHM(calls_after_a_rejoin_as_another_node_fail_at_once, calls_after_rejoin)

/* A call of rank 1's, started by one of the two below and ended by
 * call_end(): an iallreduce (its request), or a blocking receive on a
 * thread of its own. */
struct call {
    struct cfx_group *g;
    struct cfx_request *req;
    pthread_t th;
    int32_t v, s;
    int rc;
    char err[512];
};

static void *recv_main(void *arg)
{
    struct call *c = arg;
    c->rc = cfx_group_recv(c->g, &c->v, sizeof(c->v), 0, 9, NULL);
    snprintf(c->err, sizeof(c->err), "%s", cfx_last_error());
    return NULL;
}

static void start_iallreduce(struct call *c)
{
    c->v = 2;
    int rc = cfx_group_iallreduce(c->g, &c->v, &c->s, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL,
                                  &c->req);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
}

static void start_recv(struct call *c)
{
    cr_assert_eq(pthread_create(&c->th, NULL, recv_main, c), 0);
}

static void call_end(struct call *c)
{
    if (!c->req) {
        pthread_join(c->th, NULL);
        return;
    }
    c->rc = cfx_request_wait(c->req, HANG_MS);
    snprintf(c->err, sizeof(c->err), "%s", cfx_last_error());
    cfx_request_free(c->req);
}

/* Context @p c's call is in its wait: its receive is posted (rank 0 sends
 * nothing), and a request's call has started on the group's thread. */
static bool waiting(struct cfx_context *c, const struct call *call)
{
    uint64_t dl = cfx__deadline_ns(HANG_MS);
    bool w;
    pthread_mutex_lock(&c->lock);
    while (!(w = (!call->req || call->req->started) && !cfx_list_empty(&c->eager_posted)) &&
           cfx__now_ns() < dl)
        cfx__obj_wait(c, CFX_MIN(dl, cfx__deadline_ns(1))); /* marked without a wake-up */
    pthread_mutex_unlock(&c->lock);
    return w;
}

/*
 * The call was running when its rank was cut off.  Rank 0's progress thread
 * stands still meanwhile, so nothing of rank 1's call fails on the data
 * plane (rank 0 neither drops the old node's connections nor reads): the
 * call ends because its rank came back as another node, at once, not at
 * its deadline, and says so.  (Before, a receive waited for the peer to
 * drop the old node's connection, or for its deadline.)
 */
static void running_call(const char *tp, const char *name, void (*start)(struct call *))
{
    struct rank_run b[2];
    up(tp, 2);
    group_up(b, name);
    const uint32_t was = ctxs[1]->node_id;
    cr_assert_eq(cfx__progress_pause(ctxs[0], true), CFX_OK, "%s", cfx_last_error());

    struct call c = { .g = b[1].g };
    start(&c);
    cr_assert(waiting(ctxs[1], &c), "the call never came to its wait");
    const uint32_t now = cut_and_rejoin(was);
    call_end(&c);
    says_moved(name, c.rc, c.err, was, now);

    cr_assert_eq(cfx__progress_pause(ctxs[0], false), CFX_OK);
    death_heard(was);
    new_group_works(b, name);
    down(2);
}

static void running_iallreduce(const char *tp)
{
    running_call(tp, "rejoin_running", start_iallreduce);
}

static void waiting_recv(const char *tp)
{
    running_call(tp, "rejoin_recv", start_recv);
}

ON_TCP_AND_SHM(a_running_call_ends_when_its_rank_rejoins_as_another_node, running_iallreduce)
ON_TCP_AND_SHM(a_waiting_recv_ends_when_its_rank_rejoins_as_another_node, waiting_recv)

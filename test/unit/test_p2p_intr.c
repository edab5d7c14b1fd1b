/*
 * Interrupted point-to-point calls: cfx_group_send() and cfx_group_recv()
 * run their thread's interrupt check (cfx_set_interrupt_check()) while they
 * wait for the peer, as the collectives do.  A check that asks to stop
 * withdraws the message and the call fails CFX_ERR_CANCELED, saying it was
 * interrupted: a receive takes nothing (the message, sent later, goes to
 * the next receive of the tag), and a send is not sent (the next message of
 * the tag is the one the receiver gets).  Each size class: one eager send
 * (64 B), eager pieces (8 KiB) and the rendezvous (256 KiB); and a
 * rendezvous message cut off mid-transfer from either side, the other
 * side's call failing so; and a send that takes the request of a receive
 * withdrawn already.  Before, these waits never ran the check: Ctrl-C
 * in Python's Group.recv() waited for the call's deadline.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control/client_int.h"
#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#include "group_ranks.h"
#include "intr_probe.h"
#include "testutil.h"

#define TAG    7
#define FILLER 1 /* the tag of the messages that use up the receiver's slots */

static const struct {
    const char *tp;
    size_t size;
} cases[] = {
    { "tcp", 64 }, { "tcp", 8192 }, { "tcp", 256 * 1024 },
    { "shm", 64 }, { "shm", 8192 }, { "shm", 256 * 1024 },
};

static size_t cur; /* the case the ranks run */
static pthread_barrier_t bar;

static void pattern(uint8_t *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 131 + seed * 17 + (i >> 8));
}

static int fail(struct rank_run *rr, const char *why)
{
    snprintf(rr->err, sizeof(rr->err), "%s", why);
    return cfx__err(CFX_ERR_INTERNAL, "%s", rr->err);
}

/* A call interrupted by @p p's check: CFX_ERR_CANCELED, saying so. */
static int interrupted(struct rank_run *rr, int rc, const struct intr_probe *p)
{
    if (rc != CFX_ERR_CANCELED || !strstr(cfx_last_error(), "interrupted"))
        return fail(rr, rc == CFX_OK ? "the interrupted call completed" : cfx_last_error());
    if (p->calls < 1)
        return fail(rr, "the check never ran");
    return CFX_OK;
}

/* Receive @p n bytes of tag @p tag from the other rank and compare them
 * with pattern @p seed. */
static int recv_check(struct rank_run *rr, size_t n, int tag, unsigned seed)
{
    uint8_t *got = malloc(n), *want = malloc(n);
    pattern(want, n, seed);
    memset(got, 0xEE, n);
    int rc = cfx_group_recv(rr->g, got, n, 1 - rr->rank, tag, NULL);
    if (rc == CFX_OK && memcmp(got, want, n) != 0)
        rc = fail(rr, "the message received is not the one sent last");
    free(got);
    free(want);
    return rc;
}

static int send_pattern(struct rank_run *rr, size_t n, int tag, unsigned seed,
                        struct intr_probe *p)
{
    uint8_t *b = malloc(n);
    pattern(b, n, seed);
    if (p)
        cfx_set_interrupt_check(intr_check, p);
    int rc = cfx_group_send(rr->g, b, n, 1 - rr->rank, tag, NULL);
    cfx_set_interrupt_check(NULL, NULL);
    free(b);
    return rc;
}

/* Rank 1 (@p at) no longer keeps a receive request of rank 0's for the
 * tag: the withdrawn rendezvous receive's CANCEL was read there.  Waited
 * for (generously), so that rank 1's send cannot take the stale request
 * before it reads the CANCEL on a loaded machine (then the send fails as
 * cut off by its receiver, correctly, and the test would have raced). */
static bool request_dropped(struct rank_run *rr, struct cfx_context *at)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&at->lock);
    for (;;) {
        int n = 0;
        struct cfx_list *pos;
        cfx_list_for_each(pos, &at->p2p_rtrs) {
            const struct cfx_p2p_rtr *r = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
            n += r->conn->node_id == rr->ctx->node_id && r->req.chan == rr->g->chan_user &&
                 r->req.tag == TAG;
        }
        /* a request's withdrawal signals nothing: look every 10 ms */
        if (!n || cfx__now_ns() >= dl) {
            pthread_mutex_unlock(&at->lock);
            return !n;
        }
        cfx__obj_wait(at, CFX_MIN(dl, cfx__deadline_ns(10)));
    }
}

/* Rank 0's receive is interrupted before rank 1 sends; rank 1 then sends,
 * and rank 0's next receive of the tag gets the message whole. */
static int body_recv(struct rank_run *rr)
{
    size_t n = cases[cur].size;
    int rc = CFX_OK;
    if (rr->rank == 0) {
        uint8_t *buf = malloc(n);
        memset(buf, 0xEE, n);
        struct intr_probe p = { .ctx = rr->ctx };
        cfx_set_interrupt_check(intr_check, &p);
        rc = interrupted(rr, cfx_group_recv(rr->g, buf, n, 1, TAG, NULL), &p);
        cfx_set_interrupt_check(NULL, NULL);
        for (size_t i = 0; rc == CFX_OK && i < n; i++)
            if (buf[i] != 0xEE)
                rc = fail(rr, "the interrupted receive wrote the buffer");
        free(buf);
        if (rc == CFX_OK && !request_dropped(rr, ctxs[1]))
            rc = fail(rr, "rank 1 kept the withdrawn receive's request");
        pthread_barrier_wait(&bar);
        if (rc == CFX_OK)
            rc = recv_check(rr, n, TAG, 1);
    } else {
        pthread_barrier_wait(&bar);
        rc = send_pattern(rr, n, TAG, 1, NULL);
    }
    return rc;
}

/* Sends of 8 B fillers that complete at once, until one waits for the
 * receiver's slots (it has taken none of them): that one is interrupted and
 * withdrawn.  Returns how many went, or -1. */
static int fill(struct rank_run *rr, struct intr_probe *p)
{
    for (uint64_t i = 0; i <= CFX_EAGER_CREDITS; i++) {
        cfx_set_interrupt_check(intr_check, p);
        int rc = cfx_group_send(rr->g, &i, sizeof(i), 1, FILLER, NULL);
        cfx_set_interrupt_check(NULL, NULL);
        if (rc == CFX_ERR_CANCELED)
            return interrupted(rr, rc, p) == CFX_OK ? (int)i : -1;
        if (rc != CFX_OK) {
            fail(rr, cfx_last_error());
            return -1;
        }
    }
    fail(rr, "every filler went: the receiver's slots never ran out");
    return -1;
}

/* Rank 0's send of the case's size is interrupted while it waits: the
 * rendezvous for a receive, an eager one for the receiver's slots (fillers
 * took them).  Rank 1 then receives the fillers and the next message of
 * the tag, which must be the one rank 0 sends after (seed 2), not the
 * withdrawn one; and after the fillers, the next filler is the one sent
 * after the withdrawn filler.  (The ranks tell each other how many fillers
 * went through memory: rank 0 has no slot left for a message.) */
static int nfill;

static int body_send(struct rank_run *rr)
{
    size_t n = cases[cur].size;
    bool rndv = n > cfx__coll_split_max(rr->g, 1 - rr->rank);
    int rc = CFX_OK;
    if (rr->rank == 0) {
        struct intr_probe p = { .ctx = rr->ctx };
        nfill = rndv ? 0 : fill(rr, &p);
        if (nfill < 0)
            rc = CFX_ERR_INTERNAL;
        if (rc == CFX_OK) {
            p.calls = 0;
            rc = interrupted(rr, send_pattern(rr, n, TAG, 1, &p), &p);
        }
        if (rc != CFX_OK)
            nfill = -1;
        pthread_barrier_wait(&bar);
        if (rc != CFX_OK)
            return rc;
        uint64_t last = UINT64_MAX;
        rc = cfx_group_send(rr->g, &last, sizeof(last), 1, FILLER, NULL);
        return rc == CFX_OK ? send_pattern(rr, n, TAG, 2, NULL) : rc;
    }
    pthread_barrier_wait(&bar);
    if (nfill < 0)
        return fail(rr, "rank 0 failed");
    for (uint64_t i = 0; rc == CFX_OK && i <= (uint64_t)nfill; i++) {
        uint64_t got = 0, want = i < (uint64_t)nfill ? i : UINT64_MAX;
        rc = cfx_group_recv(rr->g, &got, sizeof(got), 0, FILLER, NULL);
        if (rc == CFX_OK && got != want)
            rc = fail(rr, got == (uint64_t)nfill ? "the withdrawn filler was received"
                                                 : "the fillers came out of order");
    }
    return rc == CFX_OK ? recv_check(rr, n, TAG, 2) : rc;
}

static void pair(size_t i, const char *name, int (*body)(struct rank_run *))
{
    struct rank_run rr[2];
    cur = i;
    up(cases[i].tp, 2);
    pthread_barrier_init(&bar, NULL, 2);
    run_ranks(2, name, 20000, body, rr);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < 2; r++)
        cr_expect_eq(rr[r].rc, CFX_OK, "%s, %zu B, rank %d: %s: %s", cases[i].tp,
                     cases[i].size, r, cfx_errname(rr[r].rc), rr[r].err);
    down(2);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(rr[r].rc, CFX_OK);
}

ParameterizedTestParameters(p2p_intr, an_interrupted_receive_leaves_the_message)
{
    CFX_TEST_INDEX_PARAMS(cases);
}

ParameterizedTest(size_t *i, p2p_intr, an_interrupted_receive_leaves_the_message,
                  .timeout = 60)
{
    pair(*i, "intr_recv", body_recv);
}

ParameterizedTestParameters(p2p_intr, an_interrupted_send_is_not_sent)
{
    CFX_TEST_INDEX_PARAMS(cases);
}

ParameterizedTest(size_t *i, p2p_intr, an_interrupted_send_is_not_sent, .timeout = 60)
{
    pair(*i, "intr_send", body_send);
}

/* Rank 0's receive of 8 MiB is interrupted mid-transfer (rank 1 stalls
 * after one chunk; the check asks to stop once bytes landed): the receive
 * is cut off and fails, the buffer is the caller's again once it returned
 * (nothing of the rest lands in it), and rank 1's send fails saying the
 * receiver withdrew it.  The next message of the tag then goes whole. */
#define MID_SIZE (8u << 20)

static size_t mid_tps[] = { 0, 3 }; /* tcp and shm (cases[]) */

/* Test @p name: @p body on two ranks of group @p gname, over tcp and shm. */
#define TP_PAIR_TEST(name, gname, body)                                        \
    ParameterizedTestParameters(p2p_intr, name)                                \
    {                                                                          \
        return cr_make_param_array(size_t, mid_tps, 2);                        \
    }                                                                          \
    ParameterizedTest(size_t *i, p2p_intr, name, .timeout = 60)                \
    {                                                                          \
        pair(*i, gname, body);                                                 \
    }

/* An interrupt check that asks to stop once @p count (a counter of the
 * context's stats: bytes received, bytes sent) grew past its value when the
 * probe was made. */
struct bytes_probe {
    struct cfx_context *ctx;
    const uint64_t *count;
    uint64_t base;
};

static struct bytes_probe bytes_probe(struct cfx_context *ctx, const uint64_t *count)
{
    pthread_mutex_lock(&ctx->lock);
    struct bytes_probe p = { .ctx = ctx, .count = count, .base = *count };
    pthread_mutex_unlock(&ctx->lock);
    return p;
}

static int bytes_check(void *arg)
{
    struct bytes_probe *p = arg;
    pthread_mutex_lock(&p->ctx->lock);
    bool stop = *p->count > p->base;
    pthread_mutex_unlock(&p->ctx->lock);
    return stop;
}

static struct cfx_context *sender_ctx; /* rank 1's, which rank 0 resumes */
static size_t mid_size;                /* the message of body_mid */

static int body_mid(struct rank_run *rr)
{
    int rc;
    if (rr->rank == 1) {
        sender_ctx = rr->ctx;
        cfx__xfer_test_stall(rr->ctx, 1);
        pthread_barrier_wait(&bar);
        rc = send_pattern(rr, mid_size, TAG, 1, NULL);
        if (rc != CFX_ERR_CANCELED || !strstr(cfx_last_error(), "the receiver withdrew"))
            return fail(rr, rc == CFX_OK ? "the send completed" : cfx_last_error());
        return send_pattern(rr, mid_size, TAG, 2, NULL);
    }
    uint8_t *buf = malloc(MID_SIZE);
    memset(buf, 0xEE, MID_SIZE);
    pthread_barrier_wait(&bar);
    struct bytes_probe p = bytes_probe(rr->ctx, &rr->ctx->stats.bytes_received);
    cfx_set_interrupt_check(bytes_check, &p);
    rc = cfx_group_recv(rr->g, buf, mid_size, 1, TAG, NULL);
    cfx_set_interrupt_check(NULL, NULL);
    if (rc != CFX_ERR_CANCELED || !strstr(cfx_last_error(), "interrupted"))
        rc = fail(rr, rc == CFX_OK ? "the interrupted receive completed" : cfx_last_error());
    else
        rc = CFX_OK;
    memset(buf, 0x5A, MID_SIZE); /* the caller's again */
    cfx__xfer_test_resume(sender_ctx);
    if (rc == CFX_OK)
        rc = recv_check(rr, mid_size, TAG, 2);
    for (size_t i = 0; rc == CFX_OK && i < MID_SIZE; i++)
        if (buf[i] != 0x5A)
            rc = fail(rr, "the interrupted receive wrote the buffer after it returned");
    free(buf);
    return rc;
}

static int body_mid_window(struct rank_run *rr)
{
    mid_size = MID_SIZE; /* more than one credit window of chunks */
    return body_mid(rr);
}

TP_PAIR_TEST(a_receive_interrupted_mid_transfer_is_cut_off, "intr_mid", body_mid_window)

/* As above with 256 KiB, whose every chunk the stalled sender writes once
 * it resumes, after rank 0 gave its receive up (the CANCEL unanswered for
 * its grace: the writes land nowhere).  The receiver's CANCEL_DONE says it
 * dropped the message, and the send fails: it completed, and the message
 * was lost. */
static int body_mid_whole(struct rank_run *rr)
{
    mid_size = 256u << 10;
    return body_mid(rr);
}

TP_PAIR_TEST(a_send_written_whole_after_its_receive_gave_up_fails, "intr_midw", body_mid_whole)

/* A receive of 0 bytes by rendezvous (CFX_EAGER_MAX=0: every message is) that
 * times out with no send takes nothing: it came back CFX_OK, a message of
 * nothing landed "whole"; the message sent after goes to the next receive. */
static int body_empty(struct rank_run *rr)
{
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 300 };
    char none;
    int rc;
    if (rr->rank == 0) {
        rc = cfx_group_recv(rr->g, &none, 0, 1, TAG, &p);
        if (rc != CFX_ERR_TIMEOUT)
            return fail(rr, rc == CFX_OK ? "a receive with no send completed" : cfx_last_error());
        pthread_barrier_wait(&bar);
        return cfx_group_recv(rr->g, &none, 0, 1, TAG, NULL);
    }
    pthread_barrier_wait(&bar);
    return cfx_group_send(rr->g, &none, 0, 0, TAG, NULL);
}

Test(p2p_intr, an_empty_receive_that_times_out_takes_nothing, .timeout = 60)
{
    setenv("CFX_EAGER_MAX", "0", 1);
    pair(0, "intr_empty", body_empty);
    unsetenv("CFX_EAGER_MAX");
}

/* Rank 0's send of 8 MiB is interrupted mid-transfer (it stalls after one
 * chunk; the check asks to stop once bytes went): the send is withdrawn and
 * fails, and rank 1's receive fails saying the sender withdrew the message.
 * The next message of the tag then goes whole. */
static int body_send_mid(struct rank_run *rr)
{
    int rc;
    if (rr->rank == 1) {
        uint8_t *buf = malloc(MID_SIZE);
        rc = cfx_group_recv(rr->g, buf, MID_SIZE, 0, TAG, NULL);
        free(buf);
        if (rc != CFX_ERR_NOT_FOUND || !strstr(cfx_last_error(), "the sender withdrew"))
            return fail(rr, rc == CFX_OK ? "the receive completed" : cfx_last_error());
        return recv_check(rr, MID_SIZE, TAG, 2);
    }
    cfx__xfer_test_stall(rr->ctx, 1);
    uint8_t *b = malloc(MID_SIZE);
    pattern(b, MID_SIZE, 1);
    struct bytes_probe p = bytes_probe(rr->ctx, &rr->ctx->stats.bytes_sent);
    cfx_set_interrupt_check(bytes_check, &p);
    rc = cfx_group_send(rr->g, b, MID_SIZE, 1, TAG, NULL);
    cfx_set_interrupt_check(NULL, NULL);
    free(b);
    cfx__xfer_test_resume(rr->ctx);
    if (rc != CFX_ERR_CANCELED || !strstr(cfx_last_error(), "interrupted"))
        return fail(rr, rc == CFX_OK ? "the interrupted send completed" : cfx_last_error());
    return send_pattern(rr, MID_SIZE, TAG, 2, NULL);
}

TP_PAIR_TEST(a_send_interrupted_mid_transfer_is_cut_off, "intr_smid", body_send_mid)

/* Whether rank 1 holds a request of rank 0's for the tag is @p want
 * (generously waited for). */
static bool request_queued(struct rank_run *rr, int from_rank, bool want)
{
    uint64_t dl = cfx__deadline_ns(10000);
    uint32_t from = rr->g->nodes[from_rank].node_id;
    pthread_mutex_lock(&rr->ctx->lock);
    for (;;) {
        bool found = false;
        struct cfx_list *pos;
        cfx_list_for_each(pos, &rr->ctx->p2p_rtrs) {
            const struct cfx_p2p_rtr *r = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
            found |= r->conn->node_id == from && r->req.chan == rr->g->chan_user &&
                     r->req.tag == TAG;
        }
        if (found == want || cfx__now_ns() >= dl) {
            pthread_mutex_unlock(&rr->ctx->lock);
            return found == want;
        }
        cfx__obj_wait(rr->ctx, CFX_MIN(dl, cfx__deadline_ns(10)));
    }
}

static atomic_bool stale_go;

static int stale_check(void *arg)
{
    (void)arg;
    return atomic_load(&stale_go);
}

/* Rank 0 (@p at) sent the CANCEL of a withdrawn receive (generously waited
 * for): on loopback it is in rank 1's queue once the send returned. */
static bool cancel_sent(struct cfx_context *at)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&at->lock);
    for (;;) {
        bool sent = false;
        for (unsigned i = 0; i < CFX_XFER_SLOTS; i++)
            sent |= at->slots[i] && at->slots[i]->cancel_sent;
        if (sent || cfx__now_ns() >= dl) {
            pthread_mutex_unlock(&at->lock);
            return sent;
        }
        cfx__obj_wait(at, CFX_MIN(dl, cfx__deadline_ns(1)));
    }
}

/* Rank 1 (@p rr): once rank 0's receive request is here, park the progress
 * thread (nobody reads what comes next) and let rank 0's check fire. */
static int park_with_request(struct rank_run *rr)
{
    atomic_store(&stale_go, false);
    if (!request_queued(rr, 0, true))
        return fail(rr, "rank 0's request never came");
    int rc = cfx__progress_pause(rr->ctx, true);
    if (rc == CFX_OK)
        atomic_store(&stale_go, true);
    return rc;
}

/*
 * A send that takes a request its receiver has withdrawn already: rank 0's
 * rendezvous receive is interrupted after its request reached rank 1, whose
 * progress thread is parked, so that nobody there reads the CANCEL; rank 1
 * posts its send once the CANCEL went, and the send matches that request
 * and starts writing before it reads it.  Before, a send that could write
 * every chunk at once completed while the receive failed (the message was
 * lost), and one that could not failed as cut off by its receiver, though
 * the receive took nothing.  Now:
 *  - 8 MiB (one credit window of its chunks, no more credit coming): the
 *    CANCEL says none of it landed (CANCEL_UNSEEN), and the send goes on
 *    to rank 0's next receive, which gets it whole;
 *  - 256 KiB (every chunk written at once): it lands whole before the
 *    CANCEL's answer, and the interrupted receive completes with it.
 */
static size_t stale_size;

/* Rank 1's progress thread goes on once the send took the stale request
 * (the send's wait polls only for a while, then leaves it to that thread). */
static void *stale_resume(void *arg)
{
    struct rank_run *rr = arg;
    if (!request_queued(rr, 0, false))
        fail(rr, "the send never took rank 0's request");
    cfx__progress_pause(rr->ctx, false);
    return NULL;
}

static int body_stale(struct rank_run *rr)
{
    int rc = CFX_OK;
    if (rr->rank == 0) {
        uint8_t *got = malloc(stale_size), *want = malloc(stale_size);
        pattern(want, stale_size, 3);
        cfx_set_interrupt_check(stale_check, NULL);
        rc = cfx_group_recv(rr->g, got, stale_size, 1, TAG, NULL);
        cfx_set_interrupt_check(NULL, NULL);
        if (stale_size == MID_SIZE && (rc != CFX_ERR_CANCELED ||
                                       !strstr(cfx_last_error(), "interrupted")))
            rc = fail(rr, rc == CFX_OK ? "the interrupted receive completed" : cfx_last_error());
        else if (stale_size == MID_SIZE)
            rc = recv_check(rr, stale_size, TAG, 3);
        else if (rc == CFX_OK && memcmp(got, want, stale_size) != 0)
            rc = fail(rr, "the message received is not the one sent");
        free(got);
        free(want);
        return rc;
    }
    if ((rc = park_with_request(rr)) != CFX_OK)
        return rc;
    if (!cancel_sent(ctxs[0])) {
        cfx__progress_pause(rr->ctx, false);
        return fail(rr, "rank 0 never withdrew its receive");
    }
    pthread_mutex_lock(&rr->ctx->lock);
    uint64_t before = rr->ctx->n_sends_reoffered;
    pthread_mutex_unlock(&rr->ctx->lock);
    pthread_t t;
    pthread_create(&t, NULL, stale_resume, rr);
    rc = send_pattern(rr, stale_size, TAG, 3, NULL);
    pthread_join(t, NULL);
    if (rc == CFX_OK && rr->err[0])
        rc = CFX_ERR_INTERNAL;
    pthread_mutex_lock(&rr->ctx->lock);
    uint64_t reoffered = rr->ctx->n_sends_reoffered - before;
    pthread_mutex_unlock(&rr->ctx->lock);
    if (rc == CFX_OK && reoffered != (stale_size == MID_SIZE))
        rc = fail(rr, reoffered ? "a message that landed whole was offered again"
                                : "the send never took the withdrawn request");
    return rc;
}

static int body_stale_reoffer(struct rank_run *rr)
{
    stale_size = MID_SIZE;
    return body_stale(rr);
}

static int body_stale_whole(struct rank_run *rr)
{
    stale_size = 256u << 10;
    return body_stale(rr);
}

TP_PAIR_TEST(a_send_that_takes_a_withdrawn_request_goes_to_the_next_receive, "intr_stale",
             body_stale_reoffer)
TP_PAIR_TEST(a_withdrawn_receive_that_landed_whole_completes, "intr_whole", body_stale_whole)

/*
 * Order kept around a withdrawn receive: rank 1 has messages A and B of
 * one tag.  Rank 0's receive R1 is withdrawn and given up (rank 1 parked,
 * the CANCEL unread), then A takes R1's stale request and writes a chunk
 * (rank 1 stalls after one), and rank 0's next receive R2 asks while rank 1
 * holds the CANCEL, undecided about A.  R2 must wait for that: A goes on to
 * it (none of A had landed when R1 was withdrawn), and B to R3.  Before, R2
 * took B, and A came after it.
 */
static bool order_cut; /* body_order: rank 1's connection fails instead of resuming */

/* Every connection of @p at with node @p node fails. */
static void conns_fail(struct cfx_context *at, uint32_t node)
{
    cfx__progress_lock(at);
    pthread_mutex_lock(&at->lock);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &at->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node)
            cfx__conn_fail(c, CFX_ERR_IO, "test: cut");
    }
    pthread_mutex_unlock(&at->lock);
    cfx__progress_unlock(at);
}

static int body_order(struct rank_run *rr)
{
    struct cfx_node_rec *peer = &rr->g->nodes[1 - rr->rank];
    uint64_t chan = rr->g->chan_user;
    int rc = CFX_OK;
    if (rr->rank == 0) {
        uint8_t *buf = malloc(MID_SIZE), *want = malloc(MID_SIZE);
        cfx_set_interrupt_check(stale_check, NULL);
        rc = cfx_group_recv(rr->g, buf, MID_SIZE, 1, TAG, NULL);
        cfx_set_interrupt_check(NULL, NULL);
        if (rc != CFX_ERR_CANCELED)
            rc = fail(rr, rc == CFX_OK ? "the interrupted receive completed" : cfx_last_error());
        else
            rc = CFX_OK;
        pthread_barrier_wait(&bar); /* rank 1 posts A and B */
        pthread_barrier_wait(&bar); /* ... and holds the CANCEL */
        struct cfx_p2p_req *r2 = NULL;
        if (rc == CFX_OK)
            rc = cfx__p2p_irecv(rr->ctx, peer, chan, TAG, buf, MID_SIZE, CFX_MEMTYPE_HOST, &r2);
        if (rc == CFX_OK && !request_queued(&(struct rank_run){ .ctx = ctxs[1], .g = rr->g }, 0,
                                            true))
            rc = fail(rr, "rank 1 never held R2's request");
        if (order_cut) {
            /* the connection goes with A undecided and R2 held: nothing of
             * it may start B on it (B ran on with an upload whose connection
             * was freed, and its withdrawal used it) */
            conns_fail(ctxs[1], rr->ctx->node_id);
            pthread_barrier_wait(&bar); /* rank 1 looks at B */
            cfx__xfer_test_resume(ctxs[1]);
            int wrc = r2 ? cfx__p2p_wait_free(r2, cfx__deadline_ns(20000)) : rc;
            free(buf);
            free(want);
            return rc != CFX_OK ? rc : wrc == CFX_ERR_PEER_FAILED ? CFX_OK
                 : fail(rr, wrc == CFX_OK ? "R2 completed over a cut connection"
                                          : cfx_last_error());
        }
        cfx__xfer_test_resume(ctxs[1]);
        if (r2) {
            int wrc = cfx__p2p_wait_free(r2, cfx__deadline_ns(20000));
            pattern(want, MID_SIZE, 1);
            if (rc == CFX_OK && wrc != CFX_OK)
                rc = wrc;
            else if (rc == CFX_OK && memcmp(buf, want, MID_SIZE) != 0)
                rc = fail(rr, "R2 did not get A, the message sent first");
        }
        if (rc == CFX_OK)
            rc = recv_check(rr, MID_SIZE, TAG, 2);
        free(buf);
        free(want);
        return rc;
    }
    if ((rc = park_with_request(rr)) != CFX_OK)
        return rc;
    pthread_barrier_wait(&bar); /* R1 given up after its grace */
    cfx__xfer_test_stall(rr->ctx, 1);
    uint8_t *a = malloc(MID_SIZE), *b = malloc(MID_SIZE);
    pattern(a, MID_SIZE, 1);
    pattern(b, MID_SIZE, 2);
    struct cfx_p2p_req *ra = NULL, *rb = NULL;
    rc = cfx__p2p_isend_reoffer(rr->ctx, peer, chan, TAG, a, MID_SIZE, CFX_MEMTYPE_HOST, &ra);
    if (rc == CFX_OK)
        rc = cfx__p2p_isend_reoffer(rr->ctx, peer, chan, TAG, b, MID_SIZE, CFX_MEMTYPE_HOST, &rb);
    cfx__progress_pause(rr->ctx, false);
    /* the CANCEL read (held: the upload is stalled) before R2 is asked for */
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&rr->ctx->lock);
    for (;;) {
        bool held = false;
        struct cfx_list *pos;
        cfx_list_for_each(pos, &rr->ctx->conns) {
            struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
            struct cfx_list *u;
            cfx_list_for_each(u, &c->uploads)
                held |= cfx_list_entry(u, struct cfx_upload, conn_link)->cancel_held;
        }
        if (held || cfx__now_ns() >= dl)
            break;
        cfx__obj_wait(rr->ctx, CFX_MIN(dl, cfx__deadline_ns(1))); /* it signals nothing */
    }
    pthread_mutex_unlock(&rr->ctx->lock);
    pthread_barrier_wait(&bar);
    if (order_cut) {
        /* B is still queued, asked for by nobody: R2's request went with
         * the connection */
        pthread_barrier_wait(&bar);
        bool queued = false;
        pthread_mutex_lock(&rr->ctx->lock);
        struct cfx_list *pos;
        cfx_list_for_each(pos, &rr->ctx->p2p_sends) {
            const struct cfx_obj *o = cfx_list_entry(pos, struct cfx_obj, p2p_link);
            queued |= o->peer_node == peer->node_id && o->chan == chan && o->tag == TAG;
        }
        pthread_mutex_unlock(&rr->ctx->lock);
        if (!queued)
            rc = fail(rr, "B started on the connection that failed");
        /* A fails with its connection; B is taken by nobody: it ends at its
         * deadline, withdrawn */
        int arc = ra ? cfx__p2p_wait_free(ra, cfx__deadline_ns(20000)) : rc;
        int brc = rb ? cfx__p2p_wait_free(rb, cfx__deadline_ns(2000)) : rc;
        free(a);
        free(b);
        if (rc != CFX_OK)
            return rc;
        if (arc != CFX_ERR_PEER_FAILED)
            return fail(rr, arc == CFX_OK ? "A completed over a cut connection"
                                          : cfx_last_error());
        return brc == CFX_ERR_TIMEOUT ? CFX_OK : fail(rr, brc == CFX_OK ? "B completed unasked"
                                                                        : cfx_last_error());
    }
    int arc = ra ? cfx__p2p_wait_free(ra, cfx__deadline_ns(20000)) : rc;
    int brc = rb ? cfx__p2p_wait_free(rb, cfx__deadline_ns(20000)) : rc;
    free(a);
    free(b);
    return rc != CFX_OK ? rc : arc != CFX_OK ? arc : brc;
}

static int body_order_cut(struct rank_run *rr)
{
    order_cut = true;
    return body_order(rr);
}

Test(p2p_intr, a_connection_cut_with_a_send_undecided_starts_no_other, .timeout = 60)
{
    pair(0, "intr_ordcut", body_order_cut);
}

Test(p2p_intr, a_withdrawn_receive_keeps_the_order_of_its_tag, .timeout = 60)
{
    pair(0, "intr_order", body_order);
}

/* Rank 0's receive waits first for the group's non-blocking allreduce
 * before it, which rank 1 has not joined: the check ends that wait too,
 * and the allreduce then completes when rank 1 joins it. */
static int body_behind_queue(struct rank_run *rr)
{
    int32_t v = rr->rank + 1, sum = 0;
    int rc;
    if (rr->rank == 1) {
        pthread_barrier_wait(&bar);
        rc = cfx_group_allreduce(rr->g, &v, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
        return rc == CFX_OK && sum != 3 ? fail(rr, "wrong sum") : rc;
    }
    struct cfx_request *req = NULL;
    rc = cfx_group_iallreduce(rr->g, &v, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL, &req);
    if (rc != CFX_OK)
        return rc;
    uint8_t buf[64];
    struct intr_probe p = { .ctx = rr->ctx };
    cfx_set_interrupt_check(intr_check, &p);
    rc = interrupted(rr, cfx_group_recv(rr->g, buf, sizeof(buf), 1, TAG, NULL), &p);
    cfx_set_interrupt_check(NULL, NULL);
    if (rc == CFX_OK && !strstr(cfx_last_error(), "non-blocking calls before it"))
        rc = fail(rr, cfx_last_error());
    pthread_barrier_wait(&bar);
    int wrc = cfx_request_wait(req, 20000);
    cfx_request_free(req);
    if (rc == CFX_OK && (wrc != CFX_OK || sum != 3))
        rc = wrc != CFX_OK ? wrc : fail(rr, "wrong sum");
    return rc;
}

Test(p2p_intr, a_receive_waiting_behind_queued_calls_is_interrupted, .timeout = 60)
{
    pair(0, "intr_queue", body_behind_queue);
}

/*
 * Messages of eager pieces sent ahead until the receiver's slots run out,
 * with as many slots left as part of a message takes: the next message
 * goes whole once its slots are there, or not at all.  Interrupted, or at
 * its deadline, it is withdrawn whole, and the receiver takes every message
 * before it and the one sent after it byte for byte.  Before, the slots
 * left took the first pieces of it; Ctrl-C then waited for the deadline,
 * after which the rest were withdrawn, and the receiver took the next
 * message's pieces as that one's end (a size disagreement, a message lost).
 */
#define PIECES_TAG 11
#define PIECES_MSG 8192u /* three pieces */

/* Credits of this node's connection to @p node above those ordinary sends
 * leave to urgent ones: slots of the receiver this node may fill. */
static int free_slots(struct cfx_context *ctx, uint32_t node)
{
    int n = -1;
    pthread_mutex_lock(&ctx->lock);
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        const struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node && c->outbound && c->state == CFX_CONN_READY)
            n = (int)c->eager_credits -
                (int)CFX_MIN(CFX_EAGER_URGENT, c->eager_granted / 2);
    }
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

static int body_pieces(struct rank_run *rr)
{
    int rc = CFX_OK;
    uint8_t *b = malloc(PIECES_MSG);
    if (rr->rank == 0) {
        struct intr_probe p = { .ctx = rr->ctx };
        uint32_t node = rr->g->nodes[1].node_id;
        nfill = 0;
        /* a first message makes the connection; then one of 8 B if need be,
         * so that the slots left after the last whole message are one or two */
        for (;; nfill++) {
            if (nfill == 1 && free_slots(rr->ctx, node) % 3 == 0 &&
                (rc = send_pattern(rr, 8, PIECES_TAG + 1, 0, NULL)) != CFX_OK)
                break;
            pattern(b, PIECES_MSG, 100 + (unsigned)nfill);
            cfx_set_interrupt_check(intr_check, &p);
            rc = cfx_group_send(rr->g, b, PIECES_MSG, 1, PIECES_TAG, NULL);
            cfx_set_interrupt_check(NULL, NULL);
            if (rc != CFX_OK || nfill > CFX_EAGER_CREDITS)
                break;
        }
        if (rc == CFX_ERR_CANCELED)
            rc = interrupted(rr, rc, &p);
        else if (rc == CFX_OK)
            rc = fail(rr, "every message went: the slots never ran out");
        struct cfx_coll_params cp = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 300 };
        if (rc == CFX_OK) {
            pattern(b, PIECES_MSG, 99);
            rc = cfx_group_send(rr->g, b, PIECES_MSG, 1, PIECES_TAG, &cp);
            rc = rc == CFX_ERR_TIMEOUT ? CFX_OK
                                       : fail(rr, rc == CFX_OK ? "the send at its deadline "
                                              "went" : cfx_last_error());
        }
        if (rc != CFX_OK)
            nfill = -1;
        pthread_barrier_wait(&bar);
        if (rc == CFX_OK)
            rc = send_pattern(rr, PIECES_MSG, PIECES_TAG, 7, NULL);
    } else {
        pthread_barrier_wait(&bar);
        if (nfill < 0)
            rc = fail(rr, "rank 0 failed");
        for (int i = 0; rc == CFX_OK && i < nfill; i++)
            rc = recv_check(rr, PIECES_MSG, PIECES_TAG, 100 + (unsigned)i);
        if (rc == CFX_OK)
            rc = recv_check(rr, PIECES_MSG, PIECES_TAG, 7);
    }
    free(b);
    return rc;
}

TP_PAIR_TEST(messages_of_pieces_go_whole_or_not_at_all, "intr_pieces", body_pieces)

/*
 * The progress thread's sleep decision (dataplane/engine/progress.c): a
 * transport that packets reach with no fd turning readable
 * (CFX_TP_CAP_BUSY_POLL, or no wait fd at all) is polled without a nap
 * while it has a live connection.  And the last poller's hand-back to a
 * sleeping progress thread: it arms the ifaces again itself, without
 * waking the thread, unless there is work the thread must take.  The
 * progress thread's spin after a wake-up, and the traffic counted per peer
 * for the heartbeat.  Checked on a context assembled by hand with stand-in
 * transports: no thread, no timing.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "control/proto.h"
#include "dataplane/engine/engine.h"

TestSuite(progress_nap);

static const struct cfx_transport_ops fd_ops = { .version = CFX_TP_OPS_VERSION,
                                                 .name = "fake-fd" };
static const struct cfx_transport_ops busy_ops = { .version = CFX_TP_OPS_VERSION,
                                                   .name = "fake-busy",
                                                   .caps = CFX_TP_CAP_BUSY_POLL };

static struct cfx_context *ctx_new(void)
{
    struct cfx_context *ctx = calloc(1, sizeof(*ctx));
    cr_assert_not_null(ctx);
    cfx_list_init(&ctx->conns);
    cfx_list_init(&ctx->paced_uploads);
    ctx->tp[0] = (struct cfx_tp_slot){ .ops = &fd_ops, .fd = 5 };
    ctx->ntp = 1;
    return ctx;
}

static void conn_add(struct cfx_context *ctx, struct cfx_conn *c, int tp,
                     enum cfx_conn_state state)
{
    *c = (struct cfx_conn){ .ctx = ctx, .tp = tp, .state = state };
    cfx_list_add_tail(&c->link, &ctx->conns);
}

Test(progress_nap, fd_transports_sleep_long)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c;
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_MS);
    conn_add(ctx, &c, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_MS,
                 "an fd wakes the thread for this one's packets");
    free(ctx);
}

Test(progress_nap, busy_poll_transport_with_a_connection_never_naps)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c0, c1;
    ctx->tp[1] = (struct cfx_tp_slot){ .ops = &busy_ops, .fd = 7 };
    ctx->ntp = 2;

    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS,
                 "an idle busy-polled iface is looked at often (new peers)");
    conn_add(ctx, &c0, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS);
    conn_add(ctx, &c1, 1, CFX_CONN_CONNECTING);
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0, "packets may arrive: no nap");
    c1.state = CFX_CONN_READY;
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0);
    c1.state = CFX_CONN_FAILED;
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS,
                 "a failed connection receives nothing");
    free(ctx);
}

static int quiet_ms;

static int fake_quiet(struct cfx_tp_iface *iface)
{
    (void)iface;
    return quiet_ms;
}

static const struct cfx_transport_ops quiet_ops = { .version = CFX_TP_OPS_VERSION,
                                                    .name = "fake-quiet",
                                                    .caps = CFX_TP_CAP_BUSY_POLL,
                                                    .iface_quiet_ms = fake_quiet };

Test(progress_nap, busy_poll_transport_naps_when_it_says_it_is_quiet)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c0, c1;
    ctx->tp[1] = (struct cfx_tp_slot){ .ops = &quiet_ops, .fd = -1 };
    ctx->tp[2] = (struct cfx_tp_slot){ .ops = &busy_ops, .fd = 7 };
    ctx->ntp = 3;
    conn_add(ctx, &c0, 1, CFX_CONN_READY);
    quiet_ms = 0;
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0, "in flight: poll on");
    quiet_ms = 1;
    cr_assert_eq(cfx__progress_nap_ms(ctx), 1, "quiet: a nap of what it allows");
    quiet_ms = 50;
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS,
                 "never longer than a busy-polled iface's short nap");
    conn_add(ctx, &c1, 2, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0, "another that cannot say: poll on");
    free(ctx);
}

Test(progress_nap, transport_without_a_wait_fd_is_busy_polled)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c;
    ctx->tp[0].fd = -1; /* iface_fd said -1 */
    conn_add(ctx, &c, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0);
    cfx_list_del(&c.link);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS);
    free(ctx);
}

/* ---- hand-back to a sleeping progress thread ------------------------------------- */

static int arm_calls, arm_result;

static int fake_arm(struct cfx_tp_iface *iface)
{
    (void)iface;
    arm_calls++;
    return arm_result;
}

static const struct cfx_transport_ops arm_ops = { .version = CFX_TP_OPS_VERSION,
                                                  .name = "fake-arm",
                                                  .iface_arm = fake_arm };
static struct cfx_tp_iface arm_iface = { .ops = &arm_ops };

/* A context whose progress thread sleeps in epoll, one API thread polling. */
static struct cfx_context *sleeper_new(void)
{
    struct cfx_context *ctx = calloc(1, sizeof(*ctx));
    cr_assert_not_null(ctx);
    cfx_list_init(&ctx->conns);
    cfx_list_init(&ctx->cmds);
    cfx_list_init(&ctx->busy_uploads);
    cfx_list_init(&ctx->paced_uploads);
    cfx_list_init(&ctx->arena.doomed);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->progress_lock, NULL);
    ctx->cmd_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    cr_assert_geq(ctx->cmd_fd, 0);
    ctx->tp[0] = (struct cfx_tp_slot){ .ops = &arm_ops, .iface = &arm_iface, .fd = 5 };
    ctx->ntp = 1;
    ctx->sleeping = true;
    arm_calls = 0;
    arm_result = CFX_OK;
    cfx__progress_poll_begin(ctx);
    return ctx;
}

/* The progress thread's eventfd was written since the last look. */
static bool kicked(struct cfx_context *ctx)
{
    uint64_t v = 0;
    ssize_t r = read(ctx->cmd_fd, &v, sizeof(v));
    cr_assert(r == (ssize_t)sizeof(v) || errno == EAGAIN, "eventfd read: %s", strerror(errno));
    return r == (ssize_t)sizeof(v) && v > 0;
}

static void handback(struct cfx_context *ctx, bool polled)
{
    pthread_mutex_lock(&ctx->lock);
    cfx__progress_handback(ctx, polled);
    pthread_mutex_unlock(&ctx->lock);
}

static void sleeper_free(struct cfx_context *ctx)
{
    close(ctx->cmd_fd);
    pthread_mutex_destroy(&ctx->progress_lock);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

Test(progress_nap, last_poller_rearms_a_sleeper_without_waking_it)
{
    struct cfx_context *ctx = sleeper_new();
    handback(ctx, true);
    cr_assert_eq(arm_calls, 1, "the poller arms the iface its polls disarmed");
    cr_assert_eq(ctx->n_rearms, 1);
    cr_assert_eq(ctx->n_kicks, 0);
    cr_assert_not(kicked(ctx), "no wake-up: the thread sleeps on armed ifaces");
    cr_assert_not(cfx__progress_held(ctx), "the progress lock is given back");
    cr_assert_eq(pthread_mutex_trylock(&ctx->progress_lock), 0);
    pthread_mutex_unlock(&ctx->progress_lock);
    sleeper_free(ctx);
}

Test(progress_nap, iface_with_work_pending_wakes_the_sleeper)
{
    struct cfx_context *ctx = sleeper_new();
    arm_result = CFX_ERR_AGAIN; /* something came in after the last poll */
    handback(ctx, true);
    cr_assert_eq(arm_calls, 1);
    cr_assert_eq(ctx->n_rearms, 0);
    cr_assert(kicked(ctx), "the thread must poll what is pending");
    sleeper_free(ctx);
}

Test(progress_nap, queued_command_wakes_the_sleeper)
{
    struct cfx_context *ctx = sleeper_new();
    struct cfx_cmd cmd = { .type = CFX_CMD_EAGER_CREDIT };
    cfx_list_add_tail(&cmd.link, &ctx->cmds);
    handback(ctx, true);
    cr_assert_eq(arm_calls, 0, "work it would not sleep on: not armed, woken");
    cr_assert(kicked(ctx));
    sleeper_free(ctx);
}

Test(progress_nap, busy_progress_lock_wakes_the_sleeper)
{
    struct cfx_context *ctx = sleeper_new();
    pthread_mutex_lock(&ctx->progress_lock); /* someone else drives */
    handback(ctx, true);
    pthread_mutex_unlock(&ctx->progress_lock);
    cr_assert_eq(arm_calls, 0, "a transport is called only by the progress-lock holder");
    cr_assert(kicked(ctx));
    sleeper_free(ctx);
}

Test(progress_nap, handback_without_a_poll_or_before_the_last_poller_does_nothing)
{
    struct cfx_context *ctx = sleeper_new();
    handback(ctx, false); /* never got the lock: the ifaces are as it armed them */
    cr_assert_eq(arm_calls, 0);
    cr_assert_not(kicked(ctx));

    cfx__progress_poll_begin(ctx);
    cfx__progress_poll_begin(ctx);
    handback(ctx, true); /* another poller carries on */
    cr_assert_eq(arm_calls, 0);
    cr_assert_not(kicked(ctx));
    handback(ctx, true);
    cr_assert_eq(arm_calls, 1);
    cr_assert_not(kicked(ctx));
    sleeper_free(ctx);
}

/* The poller's passes queued a paced upload (or connected a busy-polled
 * transport): the nap the progress thread chose is now too long, so it is
 * woken to choose again rather than re-armed to sleep it out. */
Test(progress_nap, shorter_nap_due_wakes_the_sleeper)
{
    struct cfx_context *ctx = sleeper_new();
    ctx->sleep_nap_ms = CFX_PROGRESS_NAP_MS;
    struct cfx_list paced;
    cfx_list_add_tail(&paced, &ctx->paced_uploads);
    cr_assert_lt(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_MS);
    handback(ctx, true);
    cr_assert_eq(arm_calls, 0, "not re-armed for a nap too long");
    cr_assert(kicked(ctx));
    sleeper_free(ctx);
}

/* Two pollers: the first polls (its pass disarms the ifaces the sleeper
 * armed, and says so: sleeper_disarmed) and leaves first; the last never got
 * the lock (a tester whose one pass found it busy, a waiter whose message
 * the other's pass completed).  It must still re-arm: before, only a
 * poller that had polled itself did, and the progress thread slept out its
 * nap (100 ms) on disarmed shm rings while a peer's writes rang no bell. */
Test(progress_nap, last_poller_rearms_after_another_pollers_pass)
{
    struct cfx_context *ctx = sleeper_new();
    cfx__progress_poll_begin(ctx);
    pthread_mutex_lock(&ctx->lock);
    ctx->sleeper_disarmed = true; /* what the first poller's progress_pass left */
    pthread_mutex_unlock(&ctx->lock);
    handback(ctx, true); /* the first leaves: another poller carries on */
    cr_assert_eq(arm_calls, 0);
    handback(ctx, false); /* the last, which never polled */
    cr_assert_eq(arm_calls, 1, "the ifaces another poller disarmed are armed again");
    cr_assert_not(ctx->sleeper_disarmed);
    cr_assert_not(kicked(ctx));
    sleeper_free(ctx);
}

/* ---- hand-back to a progress thread standing aside ------------------------------ */

struct aside_arg {
    struct cfx_context *ctx;
    bool waiting, woken;
};

/* stand_aside() without its ASIDE_MS bound: only a signal ends it. */
static void *aside_thread(void *p)
{
    struct aside_arg *a = p;
    pthread_mutex_lock(&a->ctx->lock);
    a->ctx->aside = true;
    a->waiting = true;
    pthread_cond_wait(&a->ctx->progress_cond, &a->ctx->lock);
    a->ctx->aside = false;
    a->woken = true;
    pthread_mutex_unlock(&a->ctx->lock);
    return NULL;
}

/* A waiter that leaves its polling with its request still running (a
 * rendezvous receive waiting for the peer's writes, on no list the engine
 * looks at for pending work) wakes the progress thread that stood aside
 * for it: nobody else would drive the transports until the stand-aside
 * timed out, a millisecond per message. */
Test(progress_nap, waiter_leaving_its_poll_wakes_the_thread_standing_aside, .timeout = 10)
{
    struct cfx_context *ctx = sleeper_new();
    ctx->sleeping = false;
    pthread_cond_init(&ctx->progress_cond, NULL);
    struct aside_arg a = { .ctx = ctx };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, aside_thread, &a), 0);
    for (;;) {
        pthread_mutex_lock(&ctx->lock);
        bool w = a.waiting;
        pthread_mutex_unlock(&ctx->lock);
        if (w)
            break;
        sched_yield();
    }
    pthread_mutex_lock(&ctx->lock);
    cfx__progress_handback_waiter(ctx, true);
    pthread_mutex_unlock(&ctx->lock);
    pthread_join(t, NULL);
    cr_assert(a.woken, "the thread standing aside was signalled");
    cr_assert_not(kicked(ctx), "it was not asleep in epoll: no eventfd write");
    pthread_cond_destroy(&ctx->progress_cond);
    sleeper_free(ctx);
}

/* ---- the progress thread's spin after a wake-up ------------------------------ */

Test(progress_nap, spin_adapts_to_requests_that_come_back_soon)
{
    const uint64_t us = 1000, spin = 20 * us, cap = 250 * us;
    cr_assert_eq(cfx__progress_spin_after(spin, cap, 60 * us, true), 120 * us,
                 "a request 60 us after the last work: spin twice that");
    cr_assert_eq(cfx__progress_spin_after(spin, cap, 5 * us, true), spin,
                 "never shorter than CFX_SPIN_US");
    cr_assert_eq(cfx__progress_spin_after(spin, cap, 200 * us, true), cap, "at most the cap");
    cr_assert_eq(cfx__progress_spin_after(spin, cap, 250 * us, true), spin,
                 "a gap at the cap or longer: the peer is not that eager");
    cr_assert_eq(cfx__progress_spin_after(spin, cap, UINT64_MAX, true), spin,
                 "a nap that timed out");
    cr_assert_eq(cfx__progress_spin_after(spin, cap, 60 * us, false), spin,
                 "nothing served (eager messages, credits): nobody waits on us");
    cr_assert_eq(cfx__progress_spin_after(spin, 0, 60 * us, true), spin,
                 "CFX_SPIN_ADAPT_US=0 turns it off");
}

/* ---- traffic per peer (cfx__conn_count, cfx__task_beat_fill) ---------------- */

/* Each connection's bytes count for its transport and for its (peer,
 * transport) entry; an accepted connection before its HELLO and the pairs
 * beyond the table count for the transport only; a heartbeat carries the
 * CFX_CTL_PEERS_MAX entries with the most bytes. */
Test(progress_nap, traffic_is_counted_per_peer)
{
    struct cfx_context *ctx = ctx_new();
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->tp[1] = (struct cfx_tp_slot){ .ops = &busy_ops, .fd = 7 };
    ctx->ntp = 2;
    pthread_mutex_init(&ctx->ps_load_lock, NULL);
    enum { N = CFX_PEER_BYTES_MAX + 6 };
    static struct cfx_conn c[N];
    uint64_t total[2] = { 0, 0 };
    for (unsigned i = 0; i < N; i++) {
        c[i] = (struct cfx_conn){ .ctx = ctx, .tp = (int)(i % 2), .node_id = 100 + i / 2 };
        cfx__conn_count(&c[i], true, 1000 * (i + 1));
        cfx__conn_count(&c[i], false, 10 * (i + 1));
        total[i % 2] += 1010 * (i + 1);
    }
    cr_assert_eq(ctx->tp[0].tx_bytes + ctx->tp[0].rx_bytes, total[0]);
    cr_assert_eq(ctx->tp[1].tx_bytes + ctx->tp[1].rx_bytes, total[1]);
    cr_assert_eq(ctx->npeer_bytes, CFX_PEER_BYTES_MAX, "the table holds its first pairs");
    for (unsigned i = 0; i < CFX_PEER_BYTES_MAX; i++) {
        const struct cfx_ctl_peer_traffic *p = &ctx->peer_bytes[i].t;
        cr_assert_eq(p->peer, 100 + i / 2);
        cr_assert_eq(p->tp, i % 2);
        cr_assert_eq(p->tx_bytes, 1000 * (i + 1));
        cr_assert_eq(p->rx_bytes, 10 * (i + 1));
    }
    /* the same pair again adds up; an unnamed connection counts apart only
     * for its transport */
    struct cfx_conn again = { .ctx = ctx, .tp = 0, .node_id = 100 };
    cfx__conn_count(&again, true, 5);
    cr_assert_eq(ctx->peer_bytes[0].t.tx_bytes, 1005);
    struct cfx_conn anon = { .ctx = ctx, .tp = 0 };
    cfx__conn_count(&anon, false, 7);
    cr_assert_eq(ctx->tp[0].rx_bytes + ctx->tp[0].tx_bytes, total[0] + 5 + 7);
    cr_assert_eq(ctx->npeer_bytes, CFX_PEER_BYTES_MAX);

    static struct cfx_msg_heartbeat hb;
    cfx__task_beat_fill(ctx, &hb);
    cr_assert_eq(hb.nprogress, 0);
    cr_assert_eq(hb.npeers, CFX_CTL_PEERS_MAX);
    for (unsigned k = 0; k < CFX_CTL_PEERS_MAX; k++) {
        unsigned i = CFX_PEER_BYTES_MAX - 1 - k; /* the largest first */
        cr_assert_eq(hb.peers[k].peer, 100 + i / 2, "entry %u", k);
        cr_assert_eq(hb.peers[k].tp, i % 2);
        cr_assert_eq(hb.peers[k].tx_bytes, 1000 * (i + 1));
    }
    pthread_mutex_destroy(&ctx->ps_load_lock);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* Every (peer, transport) series a reader has seen, with its last values:
 * a series may end, never go down. */
struct series {
    uint32_t peer;
    uint8_t tp;
    uint64_t tx, rx;
};

static void series_check(struct series *seen, unsigned *nseen, unsigned cap,
                         const struct cfx_ctl_peer_traffic *p, const char *where)
{
    for (unsigned k = 0; k < *nseen; k++) {
        struct series *x = &seen[k];
        if (x->peer != p->peer || x->tp != p->tp)
            continue;
        cr_assert(p->tx_bytes >= x->tx && p->rx_bytes >= x->rx,
                  "%s: peer %u transport %u went down: %llu/%llu after %llu/%llu", where,
                  p->peer, p->tp, (unsigned long long)p->tx_bytes,
                  (unsigned long long)p->rx_bytes, (unsigned long long)x->tx,
                  (unsigned long long)x->rx);
        x->tx = p->tx_bytes;
        x->rx = p->rx_bytes;
        return;
    }
    cr_assert_lt(*nseen, cap);
    seen[(*nseen)++] = (struct series){ p->peer, p->tp, p->tx_bytes, p->rx_bytes };
}

/* Read the whole table and a heartbeat: every series against the last. */
static void table_check(struct cfx_context *ctx, struct series *seen, unsigned *nseen,
                        unsigned cap)
{
    static struct cfx_msg_heartbeat hb;
    for (unsigned i = 0; i < ctx->npeer_bytes; i++) {
        struct cfx_ctl_peer_traffic p;
        cr_assert(cfx__peer_bytes_read(ctx, i, &p), "entry %u is stable", i);
        series_check(seen, nseen, cap, &p, "table");
    }
    cfx__task_beat_fill(ctx, &hb);
    cr_assert_eq(hb.npeers, CFX_CTL_PEERS_MAX);
    for (unsigned k = 0; k < hb.npeers; k++)
        series_check(seen, nseen, cap, &hb.peers[k], "heartbeat");
}

/* The entry of (@p peer, @p tp), or NULL. */
static const struct cfx_peer_bytes *entry_of(const struct cfx_context *ctx, uint32_t peer,
                                             int tp)
{
    for (unsigned i = 0; i < ctx->npeer_bytes; i++)
        if (ctx->peer_bytes[i].t.peer == peer && ctx->peer_bytes[i].t.tp == tp)
            return &ctx->peer_bytes[i];
    return NULL;
}

/*
 * Peers come and go, over 160 pairs in all through a table of 64: a peer
 * the coordinator reports dead or gone (cfx__conn_node_dead,
 * cfx__conn_peer_departed) keeps its entry,
 * counts and place in heartbeats until a new pair needs a slot with the
 * table full; the new pair then takes a departed peer's slot and counts
 * from its own first bytes; a connection that found the table full gets a
 * slot once one is free; a peer that left in good order counts on its
 * closing connection for the transport only, never into the slot a
 * newcomer took; a departed peer back under its id goes on from its
 * counts.  Through it all no series the table or a heartbeat showed ever
 * goes down, and the transport totals hold every byte.
 */
Test(progress_nap, departed_peers_free_their_slots)
{
    struct cfx_context *ctx = ctx_new();
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->ps_load_lock, NULL);
    ctx->tp[1] = (struct cfx_tp_slot){ .ops = &busy_ops, .fd = 7 };
    ctx->ntp = 2;
    enum { PEERS0 = CFX_PEER_BYTES_MAX / 2, ROUNDS = 6, CHURN = 8, CAP = 512 };
    static struct cfx_conn c[2 * (PEERS0 + ROUNDS * CHURN)];
    static struct series seen[CAP];
    unsigned nseen = 0, nc = 0;
    uint64_t total = 0;

    /* 32 peers on both transports fill the table */
    for (uint32_t peer = 100; peer < 100 + PEERS0; peer++)
        for (int tp = 0; tp < 2; tp++, nc++) {
            c[nc] = (struct cfx_conn){ .ctx = ctx, .tp = tp, .node_id = peer };
            cfx__conn_count(&c[nc], true, 1000 * peer + (uint64_t)tp);
            cfx__conn_count(&c[nc], false, 10 * peer);
            total += 1010 * peer + (uint64_t)tp;
        }
    cr_assert_eq(ctx->npeer_bytes, CFX_PEER_BYTES_MAX);
    table_check(ctx, seen, &nseen, CAP);
    /* one more: the table is full of live peers, the transport counts it */
    struct cfx_conn late = { .ctx = ctx, .tp = 0, .node_id = 999 };
    cfx__conn_count(&late, true, 77);
    total += 77;
    cr_assert_null(entry_of(ctx, 999, 0));

    uint32_t next_new = 100 + PEERS0, oldest = 100; /* ids in order of arrival */
    for (int r = 0; r < ROUNDS; r++) {
        /* CHURN peers leave; their entries stay as they were, and reported */
        for (int k = 0; k < CHURN; k++)
            cfx__conn_node_dead(ctx, oldest + (uint32_t)k);
        if (oldest == 100 + PEERS0) /* round 0's newcomers go, and the late one */
            cfx__conn_node_dead(ctx, 999);
        for (int k = 0; k < CHURN; k++) {
            const struct cfx_peer_bytes *e = entry_of(ctx, oldest + (uint32_t)k, 0);
            cr_assert_not_null(e, "round %d: peer %u's entry kept", r, oldest + k);
            cr_assert(e->departed);
        }
        table_check(ctx, seen, &nseen, CAP);
        if (r == 0) {
            /* the connection that found the table full takes a freed slot,
             * counting from there (its first 77 bytes: the transport's) */
            cfx__conn_count(&late, true, 5);
            total += 5;
            const struct cfx_peer_bytes *e = entry_of(ctx, 999, 0);
            cr_assert_not_null(e);
            cr_assert_eq(e->t.tx_bytes, 5);
            cr_assert_eq(e->t.rx_bytes, 0);
        }
        /* new peers take the departed peers' slots, from their own bytes;
         * round 0 has one slot less (the late connection's) */
        for (int k = 0; k < CHURN; k++, next_new++)
            for (int tp = 0; tp < 2 && !(r == 0 && k == CHURN - 1 && tp == 1); tp++, nc++) {
                c[nc] = (struct cfx_conn){ .ctx = ctx, .tp = tp, .node_id = next_new };
                cfx__conn_count(&c[nc], true, 3 + (uint64_t)tp);
                cfx__conn_count(&c[nc], false, 1);
                total += 4 + (uint64_t)tp;
                const struct cfx_peer_bytes *e = entry_of(ctx, next_new, tp);
                cr_assert_not_null(e, "round %d: new peer %u on %d has a slot", r, next_new, tp);
                cr_assert_eq(e->t.tx_bytes, 3 + (uint64_t)tp);
                cr_assert_eq(e->t.rx_bytes, 1);
                cr_assert_not(e->departed);
                table_check(ctx, seen, &nseen, CAP);
            }
        cr_assert_eq(ctx->npeer_bytes, CFX_PEER_BYTES_MAX, "never more than the table");
        oldest += CHURN;
    }
    /* a peer that leaves in good order keeps its connection open while it
     * closes: what that still carries counts for the transport only, also
     * once a new pair took the peer's slot */
    uint32_t leaver = oldest + 1;
    struct cfx_conn lc;
    conn_add(ctx, &lc, 0, CFX_CONN_READY);
    lc.node_id = leaver;
    cfx__conn_count(&lc, true, 1);
    const struct cfx_peer_bytes *le = entry_of(ctx, leaver, 0);
    cr_assert_not_null(le);
    uint64_t was = le->t.tx_bytes;
    cfx__conn_peer_departed(ctx, leaver); /* the coordinator's leave event */
    cfx__conn_count(&lc, true, 100);
    cr_assert_eq(le->t.tx_bytes, was, "nothing counts into a departed peer's slot");
    struct cfx_conn newcomer = { .ctx = ctx, .tp = 0, .node_id = 5000 };
    cfx__conn_count(&newcomer, true, 2);
    const struct cfx_peer_bytes *ne = entry_of(ctx, 5000, 0);
    cr_assert_not_null(ne, "the newcomer takes one of the leaver's slots");
    cfx__conn_count(&lc, true, 50);
    cr_assert_eq(ne->t.tx_bytes, 2, "the leaver's bytes never land in the newcomer's slot");
    total += 1 + 100 + 2 + 50;
    table_check(ctx, seen, &nseen, CAP);
    cfx_list_del(&lc.link);

    /* a departed peer whose slot nobody took goes on from its counts when
     * it comes back under its id */
    uint32_t back = oldest;
    cfx__conn_node_dead(ctx, back);
    const struct cfx_peer_bytes *e = entry_of(ctx, back, 0);
    cr_assert_not_null(e);
    uint64_t before = e->t.tx_bytes;
    struct cfx_conn again = { .ctx = ctx, .tp = 0, .node_id = back };
    cfx__conn_count(&again, true, 9);
    total += 9;
    cr_assert_eq(entry_of(ctx, back, 0), e, "the same slot");
    cr_assert_eq(e->t.tx_bytes, before + 9);
    cr_assert_not(e->departed);
    table_check(ctx, seen, &nseen, CAP);
    cr_assert_gt(nseen, CFX_PEER_BYTES_MAX + 2 * ROUNDS * CHURN - 2, "%u series seen", nseen);
    cr_assert_eq(ctx->tp[0].tx_bytes + ctx->tp[0].rx_bytes + ctx->tp[1].tx_bytes +
                     ctx->tp[1].rx_bytes,
                 total, "the transports count every byte");
    pthread_mutex_destroy(&ctx->ps_load_lock);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

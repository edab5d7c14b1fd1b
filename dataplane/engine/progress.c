/*
 * The progress engine.  Whoever holds the context's progress lock drives
 * the transports: the progress thread, or an API thread that waits on a
 * request and polls for itself (cfx__progress_drive) instead of sleeping
 * until the progress thread wakes it.  One pass (progress_pass) polls every
 * iface, runs the queued commands, pumps uploads and flushes connections.
 *
 * The progress thread polls while work is in flight, spins briefly when it
 * runs dry, then arms every iface and sleeps in epoll on their wait fds and
 * on the command eventfd, so an idle process costs no CPU.  While an API
 * thread polls (ctx->pollers > 0) it stands aside on ctx->progress_cond
 * instead, so the two do not fight over the lock and the core; the last
 * poller to leave wakes it when there is work for it (cfx__progress_handback),
 * and a stand-aside never lasts longer than ASIDE_MS in any case.
 */
#include "engine.h"
#include "p2p.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POLL_BATCH 64
#define ASIDE_MS   1  /* longest the progress thread stands aside for a poller */

/* The context whose progress lock this thread holds (NULL: none) is
 * cfx__tp_driver (transport.h): the transports' thread checks read it. */

int cfx__conn_flush_all(struct cfx_context *ctx);
void cfx__conn_connected(struct cfx_conn *conn);
void cfx__rtask_cmd(struct cfx_context *ctx, struct cfx_cmd *cmd);
struct cfx_conn *cfx__conn_accepted(struct cfx_context *ctx, int tp, struct cfx_tp_ep *ep);

/* ctx->lock held */
static void kick_eventfd(struct cfx_context *ctx)
{
    uint64_t one = 1;
    ctx->n_kicks++;
    ssize_t rc = write(ctx->cmd_fd, &one, sizeof(one));
    (void)rc; /* a full eventfd counter still wakes the reader */
}

void cfx__cmd_post(struct cfx_context *ctx, struct cfx_cmd *cmd)
{
    cfx_list_add_tail(&cmd->link, &ctx->cmds);
    if (cfx__tp_driver == ctx)
        return; /* this thread drives the transports: it runs the queue itself */
    if (ctx->sleeping)
        kick_eventfd(ctx);
    else if (ctx->aside)
        pthread_cond_signal(&ctx->progress_cond);
}

bool cfx__progress_held(const struct cfx_context *ctx)
{
    return cfx__tp_driver == ctx;
}

bool cfx__progress_trylock(struct cfx_context *ctx)
{
    if (pthread_mutex_trylock(&ctx->progress_lock) != 0)
        return false;
    cfx__tp_driver = ctx;
    return true;
}

void cfx__progress_lock(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->progress_lock);
    cfx__tp_driver = ctx;
}

void cfx__progress_wake(struct cfx_context *ctx)
{
    if (ctx->sleeping)
        kick_eventfd(ctx);
    else if (ctx->aside)
        pthread_cond_signal(&ctx->progress_cond);
}

void cfx__progress_unlock(struct cfx_context *ctx)
{
    cfx__tp_driver = NULL;
    pthread_mutex_unlock(&ctx->progress_lock);
}

/* ctx->lock held: a command that ran goes back to the free list. */
static void cmd_put(struct cfx_context *ctx, struct cfx_cmd *cmd)
{
    if (ctx->cmd_ncached >= CFX_FREE_LIST_MAX) {
        free(cmd);
        return;
    }
    cfx_list_add_head(&cmd->link, &ctx->cmd_cache); /* the warmest first */
    ctx->cmd_ncached++;
}

int cfx__cmd_new(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj,
                 const struct cfx_node_rec *node)
{
    struct cfx_cmd *cmd;
    if (likely(!cfx_list_empty(&ctx->cmd_cache))) {
        cmd = cfx_list_entry(ctx->cmd_cache.next, struct cfx_cmd, link);
        cfx_list_del(&cmd->link);
        ctx->cmd_ncached--;
        memset(cmd, 0, sizeof(*cmd));
    } else if (!(cmd = calloc(1, sizeof(*cmd)))) {
        return CFX_ERR_NOMEM;
    }
    cmd->type = type;
    cmd->obj = obj;
    if (node)
        cmd->node = *node;
    cfx__cmd_post(ctx, cmd);
    return CFX_OK;
}

static void cmd_exec(struct cfx_context *ctx, struct cfx_cmd *cmd);

void cfx__cmd_must(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj)
{
    if (likely(!ctx->test_cmd_nomem) && likely(cfx__cmd_new(ctx, type, obj, NULL) == CFX_OK))
        return;
    /* no memory for the command: run it here, after those queued before it */
    struct cfx_cmd cmd = { .type = type, .obj = obj };
    bool was_held = cfx__progress_enter(ctx);
    cmd_exec(ctx, &cmd);
    ctx->cmd_seq_done++;
    pthread_cond_broadcast(&ctx->cmd_done);
    cfx__progress_leave(ctx, was_held);
}

static bool progress_wanted(struct cfx_context *ctx);

void cfx__cmd_must_here(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj)
{
    bool drive = !cfx__progress_held(ctx) && cfx__progress_trylock(ctx);
    /* those queued before it first: with no memory for the command,
     * cfx__cmd_must() runs it at once, as the holder we now are */
    if (drive && !cfx_list_empty(&ctx->cmds))
        cfx__progress_run_cmds(ctx);
    cfx__cmd_must(ctx, type, obj);
    if (drive) {
        cfx__progress_run_cmds(ctx);
        /* what the commands left for later (a refusal queued on a busy
         * connection, uploads draining) is the progress thread's: queued,
         * the command had woken it */
        if (progress_wanted(ctx))
            cfx__progress_wake(ctx);
        cfx__progress_unlock(ctx);
    }
}

bool cfx__obj_wait(struct cfx_context *ctx, uint64_t deadline)
{
    ctx->obj_waiters++; /* someone relies on the progress thread (handback) */
    bool r = cfx__cond_wait_until(&ctx->obj_cond, &ctx->lock, deadline);
    ctx->obj_waiters--;
    return r;
}

bool cfx__obj_wait_intr(struct cfx_context *ctx, uint64_t deadline)
{
    ctx->obj_waiters++; /* as cfx__obj_wait */
    bool r = cfx__cond_wait_intr(&ctx->obj_cond, &ctx->lock, deadline);
    ctx->obj_waiters--;
    return r;
}

/* The coordinator reported node @p id dead.  Once: the same news heard
 * again (the event, and a rejoin's look at the peers, reannounce.c) finds
 * it done. */
static void node_dead(struct cfx_context *ctx, uint32_t id)
{
    if (cfx__node_gone(ctx, id) == CFX_NODE_DEAD)
        return;
    cfx__conn_node_dead(ctx, id);
    cfx__p2p_node_dead(ctx, id);
    cfx__eager_node_dead(ctx, id);
    cfx__rtask_node_dead(ctx, id);
    if (ctx->ndead < CFX_ARRAY_SIZE(ctx->dead))
        ctx->dead[ctx->ndead++] = id;
    else /* forget the oldest: groups hold live members only */
        memmove(ctx->dead, ctx->dead + 1, sizeof(ctx->dead) - sizeof(ctx->dead[0])),
            ctx->dead[CFX_ARRAY_SIZE(ctx->dead) - 1] = id;
    pthread_cond_broadcast(&ctx->obj_cond);
}

/* It left in good order (once, as above). */
static void node_left(struct cfx_context *ctx, uint32_t id)
{
    if (cfx__node_gone(ctx, id))
        return;
    cfx__conn_peer_departed(ctx, id);
    if (ctx->nleft < CFX_ARRAY_SIZE(ctx->left))
        ctx->left[ctx->nleft++] = id;
    else /* forget the oldest, as for the dead */
        memmove(ctx->left, ctx->left + 1, sizeof(ctx->left) - sizeof(ctx->left[0])),
            ctx->left[CFX_ARRAY_SIZE(ctx->left) - 1] = id;
    pthread_cond_broadcast(&ctx->obj_cond);
}

/*
 * The coordinator's record @p rec of a peer that died or left while this
 * node was cut off from it, learnt on rejoining (reannounce.c): the event
 * went to the members of then.  A death is handled as its event would have
 * been.  A leave too, and, as the peer's connections with this node ended
 * meanwhile (or end later, eager.c), its eager receives fail once none is
 * open: those ends may have been seen before the rejoin, under the old id,
 * and forgotten with the peers that only dropped that id.
 */
static void node_missed(struct cfx_context *ctx, const struct cfx_node_rec *rec)
{
    uint32_t id = rec->node_id;
    if (cfx__node_gone(ctx, id))
        return;
    if (!(rec->flags & CFX_NODE_F_LEFT)) {
        cfx__loc_forget_node(&ctx->loc, id);
        node_dead(ctx, id);
        return;
    }
    node_left(ctx, id);
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        const struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == id && c->state != CFX_CONN_FAILED)
            return; /* what it sent last may still be unread: its end fails them */
    }
    ctx->eager_gone[ctx->eager_ngone++ % CFX_ARRAY_SIZE(ctx->eager_gone)] = id;
    cfx__eager_node_dead(ctx, id);
}

/* Run one command (progress lock and ctx->lock held). */
static void cmd_exec(struct cfx_context *ctx, struct cfx_cmd *cmd)
{
    switch (cmd->type) {
    case CFX_CMD_GET_START:
        cfx__xfer_get_start(ctx, cmd->obj, &cmd->node);
        break;
    case CFX_CMD_GET_CANCEL:
        cfx__xfer_get_cancel(ctx, cmd->obj);
        break;
    case CFX_CMD_OBJ_RELEASE:
        cfx__obj_release(ctx, cmd->obj);
        break;
    case CFX_CMD_NODE_DEAD:
        node_dead(ctx, cmd->node_id);
        break;
    case CFX_CMD_NODE_LEFT:
        node_left(ctx, cmd->node_id);
        break;
    case CFX_CMD_NODE_MISSED:
        node_missed(ctx, &cmd->node);
        break;
    case CFX_CMD_P2P_SEND:
        cfx__eager_send_post(ctx, cmd->obj, &cmd->node, false);
        break;
    case CFX_CMD_EAGER_CREDIT:
        cfx__eager_return_credits(ctx);
        break;
    case CFX_CMD_P2P_CANCEL:
        cfx__p2p_send_cancel(ctx, cmd->obj);
        break;
    case CFX_CMD_RTASK:
        cfx__rtask_cmd(ctx, cmd);
        break;
    case CFX_CMD_PUT_ANSWER:
        cfx__rtask_put_answer(ctx, cmd->msg);
        free(cmd->msg);
        break;
    }
}

int cfx__progress_run_cmds(struct cfx_context *ctx)
{
    int n = 0;
    while (!cfx_list_empty(&ctx->cmds)) {
        struct cfx_cmd *cmd = cfx_list_entry(ctx->cmds.next, struct cfx_cmd, link);
        cfx_list_del(&cmd->link);
        cmd_exec(ctx, cmd);
        cmd_put(ctx, cmd);
        n++;
    }
    ctx->cmd_seq_done++;
    pthread_cond_broadcast(&ctx->cmd_done);
    return n;
}

/* Is @p ep still owned by a live connection?  Used after a connection was
 * torn down in the middle of a batch of completions. */
static struct cfx_conn *conn_of(struct cfx_context *ctx, struct cfx_tp_ep *ep)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->ep == ep)
            return c;
    }
    return NULL;
}

static void handle_comp(struct cfx_context *ctx, int tp, const struct cfx_tp_completion *c,
                        bool checked)
{
    struct cfx_conn *conn;

    if (c->type == CFX_TP_COMP_ACCEPT) {
        cfx__conn_accepted(ctx, tp, c->ep);
        return;
    }
    conn = checked ? conn_of(ctx, c->ep) : (struct cfx_conn *)c->ep->user;
    if (!conn)
        return; /* its connection was closed earlier in this batch */

    switch (c->type) {
    case CFX_TP_COMP_WRITE_IMM:
        cfx__conn_count(conn, false, c->len);
        cfx__xfer_write_imm(ctx, conn, c->imm, c->len);
        break;
    case CFX_TP_COMP_RECV:
        cfx__conn_count(conn, false, c->len);
        cfx__xfer_recv(ctx, conn, c->data, c->len);
        break;
    case CFX_TP_COMP_WRITE:
        if (c->wr_id)
            cfx__xfer_write_done(ctx, (struct cfx_upload *)(uintptr_t)c->wr_id, c->status);
        break;
    case CFX_TP_COMP_SEND:
        if (conn->sends_out) /* the transport let go of it: closing no longer drops it */
            conn->sends_out--;
        break;
    case CFX_TP_COMP_CONNECTED:
        cfx__conn_connected(conn);
        break;
    case CFX_TP_COMP_EP_ERROR: {
        /* a connect that failed tries the next transport both sides share,
         * one closed before the handshake ended the same again (conn.c) */
        if ((conn->state == CFX_CONN_CONNECTING || (conn->outbound && !conn->authed)) &&
            cfx__conn_fallback(conn, c->status ? c->status : CFX_ERR_CONNECT))
            break;
        const char *why = conn->ep ? conn->ep->why : NULL;
        char text[160] = "transport reported the endpoint failed";
        if (why)
            snprintf(text, sizeof(text), "the %s transport refused the peer: %s",
                     ctx->tp[conn->tp].ops->name, why);
        cfx__conn_fail(conn, c->status ? c->status : CFX_ERR_PEER_FAILED, text);
        break;
    }
    }
}

/* Poll transport @p tp and handle what it gives under ctx->lock, taken
 * when there is something and kept (*@p locked): the rest of the pass runs
 * in the same hold, one lock round trip per pass. */
static int poll_tp(struct cfx_context *ctx, int tp, bool *locked)
{
    struct cfx_tp_completion comps[POLL_BATCH];
    const struct cfx_transport_ops *ops = ctx->tp[tp].ops;
    int n = ops->poll(ctx->tp[tp].iface, comps, POLL_BATCH);

    if (n <= 0) {
        if (n < 0)
            CFX_LOG(WARN, PROGRESS, "node %u: %s poll failed: %s", ctx->node_id, ops->name,
                    cfx_strerror(n));
        return 0;
    }
    if (!*locked) {
        pthread_mutex_lock(&ctx->lock);
        *locked = true;
    }
    uint64_t gen = ctx->conn_gen;
    for (int i = 0; i < n; i++)
        handle_comp(ctx, tp, &comps[i], ctx->conn_gen != gen);
    return n;
}

/* Is there work the progress thread must not leave for the next poller:
 * commands, uploads, reduce tasks, connections with something queued or a
 * handshake under way, threads asleep on the engine, eager receives or
 * unmatched sends?  ctx->lock held. */
static bool progress_wanted(struct cfx_context *ctx)
{
    if (!cfx_list_empty(&ctx->cmds) || !cfx_list_empty(&ctx->busy_uploads) ||
        !cfx_list_empty(&ctx->paced_uploads) || !cfx_list_empty(&ctx->rtasks) ||
        !cfx_list_empty(&ctx->rwaits) || !cfx_list_empty(&ctx->waiting_gets) ||
        !cfx_list_empty(&ctx->eager_posted) || !cfx_list_empty(&ctx->p2p_sends) ||
        !cfx_list_empty(&ctx->arena.doomed) || ctx->obj_waiters || ctx->stop)
        return true;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->state != CFX_CONN_READY || !c->authed || !cfx_list_empty(&c->pending) ||
            cfx__eager_queued(c) || !cfx_list_empty(&c->uploads))
            return true;
    }
    return false;
}

/* One round of everything the lock holder does; progress lock held, not
 * ctx->lock.  Returns the work done, or -1 once the context stops. */
static int progress_pass(struct cfx_context *ctx)
{
    int work = 0;
    bool locked = false;
    for (int t = 0; t < ctx->ntp; t++)
        work += poll_tp(ctx, t, &locked);

    if (!locked)
        pthread_mutex_lock(&ctx->lock);
    if (ctx->stop) {
        pthread_mutex_unlock(&ctx->lock);
        return -1;
    }
    /* our polls disarmed the ifaces the progress thread sleeps on: the
     * last poller to leave must re-arm them, even one that never got the
     * lock itself (handback) */
    if (ctx->sleeping && !ctx->waiter_napping)
        ctx->sleeper_disarmed = true;
    work += cfx__progress_run_cmds(ctx);
    work += cfx__xfer_pump_busy(ctx);
    work += cfx__rtask_poll(ctx);
    work += cfx__xfer_waiting_expire(ctx);
    work += cfx__conn_flush_all(ctx);
    work += cfx__arena_reap(ctx);
    /* a waiter napping on the fds: this pass may have completed its request
     * or disarmed what it sleeps on (waiter_nap); wake it once */
    if (unlikely(ctx->waiter_napping) && !ctx->waiter_kicked) {
        ctx->waiter_kicked = true;
        kick_eventfd(ctx);
    }
    pthread_mutex_unlock(&ctx->lock);
    return work;
}

int cfx__progress_drive(struct cfx_context *ctx)
{
    if (!cfx__progress_trylock(ctx))
        return -1;
    int work = progress_pass(ctx);
    cfx__progress_unlock(ctx);
    return work < 0 ? 0 : work;
}

void cfx__progress_test_pass(struct cfx_context *ctx)
{
    cfx__progress_poll_begin(ctx);
    int work = cfx__progress_drive(ctx);
    pthread_mutex_lock(&ctx->lock);
    cfx__progress_handback(ctx, work >= 0);
    pthread_mutex_unlock(&ctx->lock);
}

/* Arm every iface before a sleep in epoll (progress lock held): false as
 * soon as one says work is pending (poll again instead of sleeping). */
static bool arm_all(struct cfx_context *ctx)
{
    for (int t = 0; t < ctx->ntp; t++)
        if (ctx->tp[t].ops->iface_arm &&
            ctx->tp[t].ops->iface_arm(ctx->tp[t].iface) == CFX_ERR_AGAIN)
            return false;
    return true;
}

/* One spell of spinning (see cfx__progress_poll_wait), which work done
 * lengthens up to @p cap_ns; true if @p st is no longer CFX_ERR_AGAIN. */
static bool spin(struct cfx_context *ctx, const int *st, bool *polled, uint64_t cap_ns)
{
    const uint64_t spin_ns = (uint64_t)ctx->cfg.spin_us * 1000;
    uint64_t end = cfx__now_ns() + spin_ns;
    uint32_t idle = 0, yield_every = ctx->cfg.spin_yield;
    for (unsigned i = 0; i < (1u << 20); i++) { /* bounded even if the clock stalls */
        int work = cfx__progress_drive(ctx);
        *polled |= work >= 0;
        if (__atomic_load_n(st, __ATOMIC_ACQUIRE) != CFX_ERR_AGAIN)
            return true;
        /* The clock only bounds the spin: read it every 16th pass, not on
         * every pass of the hot loop. */
        if ((i & 15) == 15 && cfx__now_ns() >= end)
            break;
        if (work > 0) {
            /* something came: more is likely on its way (a message's
             * chunks, the peer's next packet), so the spell runs
             * CFX_SPIN_US from the last work, not from its start; a nap
             * between two chunks of one message cost a wake-up each */
            idle = 0;
            uint64_t more = CFX_MIN(cfx__now_ns() + spin_ns, cap_ns);
            end = CFX_MAX(end, more);
            continue;
        }
        /* Nothing came.  A sched_yield costs a system call, most of a
         * short round trip, and gains nothing when the peer has a core of
         * its own; on fewer cores than busy threads the peer needs ours.
         * Which of the two holds cannot be known from here, so: pause
         * (cheap, and kind to a sibling hyperthread) for CFX_SPIN_YIELD
         * empty polls, then yield once. */
        if (++idle < yield_every) {
            cfx__cpu_relax();
            continue;
        }
        idle = 0;
        if (cfx__now_ns() >= end)
            break;
        sched_yield();
    }
    return __atomic_load_n(st, __ATOMIC_ACQUIRE) != CFX_ERR_AGAIN;
}

/*
 * A waiter's nap on the transports' wait fds, in place of the progress
 * thread (which stands aside while there are pollers): arm every iface as
 * the progress thread does before it sleeps, sleep in epoll on the context's
 * set until a packet, a doorbell, a command or @p until_ns, then run one
 * pass.  When the message comes, the thread that waits for it is the one
 * woken, and it reads it itself: one wake-up instead of two (the progress
 * thread's, then the waiter's on obj_cond), which is most of a round trip
 * once a wait outlasts the spin (a peer on another host, or more ranks than
 * cores).
 *
 * Another thread driving (the progress lock taken): true without a nap,
 * the caller spins on, watching its request.  A busy-polled transport with
 * connections (nothing would wake a nap): true without a nap, the caller
 * spins on, polling (ctx->waiter_polling, ctx->n_waiter_polls), unless
 * another waiter polls on already (false).  Not possible, false: another
 * thread sleeps in epoll (the progress thread asleep before we came: it is
 * not moved; another waiter napping), the context stops, or the request
 * completed meanwhile.  Whoever runs a pass while a waiter naps
 * kicks it awake (progress_pass), since the pass may have completed its
 * request or disarmed an iface it sleeps on.
 */
static bool waiter_nap(struct cfx_context *ctx, const int *st, uint64_t until_ns, bool *polled,
                       bool *polling)
{
    if (!cfx__progress_trylock(ctx)) {
        sched_yield(); /* another waiter drives for all: watch, as in spin() */
        return true;
    }
    *polled = true;
    pthread_mutex_lock(&ctx->lock);
    int nap_ms = cfx__progress_nap_ms(ctx); /* the progress thread's bound applies */
    bool busy = nap_ms == 0 && !ctx->stop;
    bool poll_on = busy && (*polling || !ctx->waiter_polling);
    if (poll_on) {
        ctx->waiter_polling = *polling = true;
        ctx->n_waiter_polls++;
    }
    if (busy) {
        pthread_mutex_unlock(&ctx->lock);
        /* A busy-polled transport (a user-space NIC queue) has connections:
         * a nap would sleep through its packets, and handing back would have
         * the progress thread poll in our place and then wake us, a wake-up
         * per message that outlasts the spin (a peer across a network).
         * Poll on ourselves, for as long as a nap would have lasted; the
         * progress thread keeps standing aside.  One waiter at a time, as
         * one naps at a time: a second hands back and sleeps, and the
         * first one's passes complete its request too (so k waiting
         * threads keep one core busy, not k). */
        cfx__progress_unlock(ctx);
        return poll_on;
    }
    /* arm as the progress thread does before it sleeps (under ctx->lock,
     * as a leaving poller re-arms: rearm_for_sleeper) */
    bool pending = !arm_all(ctx);
    bool can = !ctx->sleeping && !ctx->stop &&
               __atomic_load_n(st, __ATOMIC_ACQUIRE) == CFX_ERR_AGAIN && nap_ms != 0;
    if (can && (pending || !cfx_list_empty(&ctx->cmds) || !cfx_list_empty(&ctx->busy_uploads) ||
                !cfx_list_empty(&ctx->arena.doomed)))
        pending = true;
    bool nap = can && !pending;
    if (nap) {
        ctx->sleeping = ctx->waiter_napping = true;
        ctx->waiter_kicked = false;
        ctx->n_waiter_naps++;
    }
    pthread_mutex_unlock(&ctx->lock);
    cfx__progress_unlock(ctx);
    if (!can)
        return false;
    if (nap) {
        struct epoll_event evs[CFX_MAX_TPS + 1];
        uint64_t now = cfx__now_ns();
        int ms = until_ns > now ? (int)CFX_MIN((until_ns - now + 999999) / 1000000,
                                               (uint64_t)nap_ms) : 0;
        int n = epoll_wait(ctx->epfd, evs, CFX_ARRAY_SIZE(evs), ms);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == ctx->cmd_fd) {
                uint64_t v;
                ssize_t r = read(ctx->cmd_fd, &v, sizeof(v));
                (void)r;
            }
        }
        pthread_mutex_lock(&ctx->lock);
        ctx->sleeping = ctx->waiter_napping = false;
        pthread_mutex_unlock(&ctx->lock);
    }
    cfx__progress_drive(ctx);
    return true;
}

/*
 * Caller-driven progress.  For up to CFX_SPIN_US (past the last pass that
 * did work, within the nap period below) the waiting thread drives
 * the transports itself (one pass of the progress loop whenever the
 * progress lock is free: its own message is read off the wire by this
 * thread, with no wake-up in between) and watches the request; the
 * progress thread stands aside meanwhile (message waits, p2p.c).  Several
 * waiters of one context share the lock: the one holding it polls for all,
 * the others watch their request (an atomic load of @p st, a status
 * written under ctx->lock, CFX_ERR_AGAIN while it runs) and yield.  When
 * the spin runs out, the waiter sleeps on the transports' fds itself
 * (waiter_nap; or, with a busy-polled transport connected, polls on) and
 * spins again when woken, for up to CFX_WAITER_NAP_MS:
 * what only the progress thread sees (a node's death, a predicate of the
 * caller's) is looked at when the caller's loop resumes, that much later
 * at most.  Returns with ctx->lock held, the polling handed back to the
 * progress thread; the caller confirms the status and sleeps on
 * ctx->obj_cond.
 */
void cfx__progress_poll_wait(struct cfx_context *ctx, const int *st, uint64_t deadline_ns)
{
    if (!ctx->cfg.spin_us || __atomic_load_n(st, __ATOMIC_ACQUIRE) != CFX_ERR_AGAIN) {
        pthread_mutex_lock(&ctx->lock);
        return;
    }
    bool polled = false, polling = false;
    uint64_t nap_end = cfx__now_ns() + (uint64_t)ctx->cfg.waiter_nap_ms * 1000000;
    if (nap_end > deadline_ns)
        nap_end = deadline_ns;
    cfx__progress_poll_begin(ctx);
    while (!spin(ctx, st, &polled, nap_end) && cfx__now_ns() < nap_end &&
           waiter_nap(ctx, st, nap_end, &polled, &polling))
        ;
    pthread_mutex_lock(&ctx->lock);
    if (polling)
        ctx->waiter_polling = false; /* another waiter may poll on now */
    /* the caller sleeps next if its request still runs: then someone must
     * drive the transports for it, whatever else is pending (a rendezvous
     * receive waiting for the peer's writes is on no list progress_wanted()
     * looks at; the progress thread stood aside for ASIDE_MS, a millisecond
     * per message of 4 KiB .. 64 KiB) */
    if (__atomic_load_n(st, __ATOMIC_ACQUIRE) == CFX_ERR_AGAIN)
        cfx__progress_handback_waiter(ctx, polled);
    else
        cfx__progress_handback(ctx, polled);
}

void cfx__progress_poll_begin(struct cfx_context *ctx)
{
    __atomic_add_fetch(&ctx->pollers, 1, __ATOMIC_SEQ_CST);
}

/*
 * ctx->lock held, the progress thread asleep in epoll: arm the ifaces again
 * from this thread, as the progress thread would before sleeping.  Our
 * polls disarmed them (a peer no longer rings our doorbell); waking the
 * thread to re-arm them cost, per message, an eventfd write, a wake-up and
 * CFX_SPIN_US of its spinning beside the callers, on the cores the ranks
 * need.  False when it must be woken after all: work it would not have
 * slept on (as in progress_main), an iface with work pending, or the
 * progress lock busy (we cannot arm; its holder may be leaving).
 */
static bool rearm_for_sleeper(struct cfx_context *ctx)
{
    if (!cfx_list_empty(&ctx->cmds) || !cfx_list_empty(&ctx->busy_uploads) ||
        !cfx_list_empty(&ctx->arena.doomed) || ctx->stop)
        return false;
    if (!cfx__progress_trylock(ctx))
        return false;
    /* our passes may have made its nap too long (a paced upload queued, a
     * busy-polled transport connected): it must choose again.  The nap is
     * asked of the transports, so under the progress lock. */
    if (!ctx->waiter_napping && cfx__progress_nap_ms(ctx) < ctx->sleep_nap_ms) {
        cfx__progress_unlock(ctx);
        return false;
    }
    bool armed = arm_all(ctx);
    cfx__progress_unlock(ctx);
    ctx->n_rearms += armed;
    if (armed)
        ctx->sleeper_disarmed = false;
    return armed;
}

static void handback(struct cfx_context *ctx, bool polled, bool waiting)
{
    if (__atomic_sub_fetch(&ctx->pollers, 1, __ATOMIC_SEQ_CST) != 0)
        return; /* another poller carries on */
    if (ctx->aside) {
        if (waiting || progress_wanted(ctx))
            pthread_cond_signal(&ctx->progress_cond);
    } else if (ctx->sleeping && (polled || ctx->sleeper_disarmed) && !rearm_for_sleeper(ctx)) {
        kick_eventfd(ctx); /* it arms them itself */
    }
}

void cfx__progress_handback(struct cfx_context *ctx, bool polled)
{
    handback(ctx, polled, false);
}

void cfx__progress_handback_waiter(struct cfx_context *ctx, bool polled)
{
    handback(ctx, polled, true);
}

/* Does transport @p t have to be polled without a nap: no wait fd, or
 * packets that arrive without one turning readable? */
static bool tp_busy_polled(const struct cfx_context *ctx, int t)
{
    return (ctx->tp[t].ops->caps & CFX_TP_CAP_BUSY_POLL) || ctx->tp[t].fd < 0;
}

/* Has busy-polled transport @p t a connection that is not failed? */
static bool tp_connected(const struct cfx_context *ctx, int t)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        const struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->tp == t && c->state != CFX_CONN_FAILED)
            return true;
    }
    return false;
}

int cfx__progress_nap_ms(struct cfx_context *ctx)
{
    bool busy_iface = false;
    int nap = CFX_PROGRESS_NAP_SHORT_MS;
    for (int t = 0; t < ctx->ntp; t++) {
        if (!tp_busy_polled(ctx, t))
            continue;
        busy_iface = true;
        if (!tp_connected(ctx, t))
            continue;
        /* packets may arrive with nothing to wake us: poll on, unless the
         * transport says it has been quiet long enough to be looked at
         * only now and then (its connections idle, no timer due) */
        int q = ctx->tp[t].ops->iface_quiet_ms ? ctx->tp[t].ops->iface_quiet_ms(ctx->tp[t].iface)
                                               : 0;
        if (q <= 0)
            return 0;
        nap = CFX_MIN(nap, q);
    }
    /* An idle busy-polled iface may still be called by a new peer, and
     * paced uploads have their next step due: a short nap.  Otherwise a
     * bounded one: endpoints still connecting get looked at now and then. */
    if (busy_iface || !cfx_list_empty(&ctx->paced_uploads))
        return nap;
    return CFX_PROGRESS_NAP_MS;
}

/* Stand aside while an API thread polls; ctx->lock held.  True when woken
 * for work (spin afterwards), false after the timeout (sleep at once). */
static bool stand_aside(struct cfx_context *ctx)
{
    bool woken = false;
    if (!__atomic_load_n(&ctx->pollers, __ATOMIC_SEQ_CST) || ctx->stop)
        return true;
    ctx->aside = true;
    uint64_t until = cfx__deadline_ns(ASIDE_MS);
    woken = cfx__cond_wait_until(&ctx->progress_cond, &ctx->lock, until) &&
            cfx__now_ns() < until;
    ctx->aside = false;
    return woken;
}

uint64_t cfx__progress_spin_after(uint64_t spin_ns, uint64_t adapt_ns, uint64_t gap_ns,
                                  bool served)
{
    if (!served || gap_ns >= adapt_ns)
        return spin_ns;
    return CFX_MIN(adapt_ns, CFX_MAX(spin_ns, 2 * gap_ns));
}

static void *progress_main(void *arg)
{
    struct cfx_context *ctx = arg;
    const uint64_t spin_ns = (uint64_t)ctx->cfg.spin_us * 1000;
    const uint64_t adapt_ns = (uint64_t)ctx->cfg.spin_adapt_us * 1000;
    uint64_t spin_cur = spin_ns; /* this idle spell's spin (see the wake-up below) */
    uint64_t idle_since = cfx__now_ns();
    bool from_epoll = false;     /* woken from epoll: the next pass sets spin_cur */
    uint64_t woke_gap = 0;       /* time from our last work to that wake-up */
    struct epoll_event evs[CFX_MAX_TPS + 1];

    for (;;) {
        /* a hint read without ctx->lock (set atomically, under it, by
         * cfx__progress_pause): atomic, else it races with that store */
        if (unlikely(__atomic_load_n(&ctx->paused_req, __ATOMIC_RELAXED))) {
            pthread_mutex_lock(&ctx->lock);
            while (ctx->paused_req && !ctx->stop) {
                ctx->paused = true; /* tests: only API threads drive now */
                pthread_cond_broadcast(&ctx->obj_cond);
                pthread_cond_wait(&ctx->progress_cond, &ctx->lock);
            }
            ctx->paused = false;
            pthread_mutex_unlock(&ctx->lock);
        }
        if (__atomic_load_n(&ctx->pollers, __ATOMIC_RELAXED)) {
            pthread_mutex_lock(&ctx->lock);
            bool woken = stand_aside(ctx);
            bool napper = ctx->waiter_napping, poller = ctx->waiter_polling;
            pthread_mutex_unlock(&ctx->lock);
            if (napper) /* it drives, woken by what would wake us (a packet, a */
                continue; /* command): a pass here would only wake it */
            if (poller) /* a waiter polls on in place of a nap: it runs */
                continue; /* whole passes, ours would only contend */
            /* woken for work: spin as after any work; timed out: the
             * poller just did the polling, sleep right after one pass */
            idle_since = woken ? cfx__now_ns() : cfx__now_ns() - spin_cur;
        }
        cfx__progress_lock(ctx);
        uint64_t served = ctx->n_served;
        int work = progress_pass(ctx);
        if (work < 0) {
            cfx__progress_unlock(ctx);
            break;
        }
        if (from_epoll) {
            /* Adaptive spin: a peer's request that came back within
             * CFX_SPIN_ADAPT_US of our last work (a getter's next get, a
             * receiver's next rendezvous) will likely come as soon again,
             * and that peer waits on our answer: a wake-up from epoll costs
             * it 10-15 us (most of a loopback round trip).  So spin twice
             * that gap next time, up to the cap.  Only for requests served:
             * a process that merely receives (eager messages, credits)
             * keeps CFX_SPIN_US, since on fewer cores than ranks a longer
             * spin takes the core from the ranks that do the work.  A
             * longer gap or a nap that timed out goes back to CFX_SPIN_US,
             * so an idle process still sleeps at once. */
            spin_cur = cfx__progress_spin_after(spin_ns, adapt_ns, woke_gap,
                                                ctx->n_served != served);
            from_epoll = false;
        }
        uint64_t now = cfx__now_ns();
        if (work) {
            cfx__progress_unlock(ctx);
            idle_since = now;
            continue;
        }
        if (now - idle_since < spin_cur) {
            cfx__progress_unlock(ctx);
            /* spin politely: on a machine with fewer cores than busy
             * threads, the thread we wait for may need this core */
            sched_yield();
            continue;
        }

        /* Sleep: arm every iface (any that has work pending aborts the
         * nap) and say so under the progress lock, so a poller that comes
         * after the arming sees `sleeping` when it hands back. */
        bool pending = !arm_all(ctx);
        pthread_mutex_lock(&ctx->lock);
        if (!cfx_list_empty(&ctx->cmds) || !cfx_list_empty(&ctx->busy_uploads) ||
            !cfx_list_empty(&ctx->arena.doomed) || ctx->stop ||
            __atomic_load_n(&ctx->pollers, __ATOMIC_SEQ_CST))
            pending = true;
        int nap_ms = pending ? 0 : cfx__progress_nap_ms(ctx);
        ctx->sleeping = !pending && nap_ms != 0;
        ctx->sleep_nap_ms = nap_ms;
        ctx->sleeper_disarmed = false; /* armed just now */
        pthread_mutex_unlock(&ctx->lock);
        cfx__progress_unlock(ctx);
        if (pending)
            continue;
        if (nap_ms == 0) {
            /* a busy-polled transport has endpoints: packets may arrive
             * with nothing to wake us, so keep polling (politely) */
            sched_yield();
            continue;
        }
        int rc = epoll_wait(ctx->epfd, evs, CFX_ARRAY_SIZE(evs), nap_ms);
        pthread_mutex_lock(&ctx->lock);
        ctx->sleeping = false;
        pthread_mutex_unlock(&ctx->lock);
        if (rc < 0 && errno != EINTR)
            CFX_LOG(ERR, PROGRESS, "node %u: epoll_wait: %s", ctx->node_id, strerror(errno));
        for (int i = 0; i < rc; i++) {
            if (evs[i].data.fd == ctx->cmd_fd) {
                uint64_t v;
                ssize_t r = read(ctx->cmd_fd, &v, sizeof(v));
                (void)r;
            }
        }
        uint64_t woke = cfx__now_ns();
        from_epoll = true;
        woke_gap = rc > 0 ? woke - idle_since : UINT64_MAX; /* a timeout: no adapting */
        idle_since = woke;
    }
    return NULL;
}

int cfx__progress_pause(struct cfx_context *ctx, bool on)
{
    uint64_t dl = cfx__deadline_ns(5000);
    pthread_mutex_lock(&ctx->lock);
    __atomic_store_n(&ctx->paused_req, on, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&ctx->progress_cond);
    if (ctx->sleeping)
        kick_eventfd(ctx);
    while (on && !ctx->paused && cfx__obj_wait(ctx, dl))
        ;
    bool ok = !on || ctx->paused;
    pthread_mutex_unlock(&ctx->lock);
    return ok ? CFX_OK : cfx__err(CFX_ERR_TIMEOUT, "node %u: the progress thread did not pause",
                                  ctx->node_id);
}

int cfx__progress_start(struct cfx_context *ctx)
{
    struct epoll_event ev = { .events = EPOLLIN };
    int rc;

    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->epfd < 0)
        return cfx__err(cfx__status_from_errno(errno), "epoll_create1: %s", strerror(errno));
    ctx->cmd_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctx->cmd_fd < 0) {
        rc = cfx__err(cfx__status_from_errno(errno), "eventfd: %s", strerror(errno));
        goto err_close_ep;
    }
    ev.data.fd = ctx->cmd_fd;
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->cmd_fd, &ev) < 0) {
        rc = cfx__err(CFX_ERR_IO, "epoll_ctl: %s", strerror(errno));
        goto err_close_cmd;
    }
    for (int t = 0; t < ctx->ntp; t++) {
        int fd = ctx->tp[t].ops->iface_fd ? ctx->tp[t].ops->iface_fd(ctx->tp[t].iface) : -1;
        ctx->tp[t].fd = fd;
        if (fd < 0)
            continue;
        ev.data.fd = fd;
        if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            rc = cfx__err(CFX_ERR_IO, "epoll_ctl(%s): %s", ctx->tp[t].ops->name, strerror(errno));
            goto err_close_cmd;
        }
    }
    rc = pthread_create(&ctx->progress, NULL, progress_main, ctx);
    if (rc) {
        rc = cfx__err(CFX_ERR_NOMEM, "cannot start the progress thread: %s", strerror(rc));
        goto err_close_cmd;
    }
    pthread_setname_np(ctx->progress, "cfx-progress");
    return CFX_OK;

err_close_cmd:
    close(ctx->cmd_fd);
    ctx->cmd_fd = -1;
err_close_ep:
    close(ctx->epfd);
    ctx->epfd = -1;
    return rc;
}

void cfx__progress_stop(struct cfx_context *ctx)
{
    uint64_t one = 1;
    pthread_mutex_lock(&ctx->lock);
    ctx->stop = true;
    pthread_cond_signal(&ctx->progress_cond);
    pthread_mutex_unlock(&ctx->lock);
    ssize_t r = write(ctx->cmd_fd, &one, sizeof(one));
    (void)r;
    pthread_join(ctx->progress, NULL);
    close(ctx->cmd_fd);
    close(ctx->epfd);
}

bool cfx__progress_enter(struct cfx_context *ctx)
{
    if (cfx__progress_held(ctx))
        return true;
    pthread_mutex_unlock(&ctx->lock);
    cfx__progress_lock(ctx);
    pthread_mutex_lock(&ctx->lock);
    cfx__progress_run_cmds(ctx);
    return false;
}

void cfx__progress_leave(struct cfx_context *ctx, bool was_held)
{
    if (was_held)
        return;
    cfx__progress_wake(ctx);
    cfx__progress_unlock(ctx);
}

/*
 * Eager point-to-point messages: a message of at most the receiver's
 * threshold (CFX_EAGER_MAX, at most CFX_EAGER_LIMIT) travels whole, with its
 * match information, in one ep_send on the sender's connection to the
 * receiver.  No registration, no request from the receiver, no write.
 *
 * Threshold.  The receiver's value rules a connection: the acceptor tells
 * it in its AUTH, and the connector (the sender) classifies every send by
 * it; the receiver classifies every receive by its own value.  So both sides
 * use one number without the receiver needing a connection first, and two
 * ranks with different CFX_EAGER_MAX never disagree.  Until the handshake
 * told it, every send to that peer waits on the connection, in posting
 * order, then goes eager or to the rendezvous FIFO (p2p.c); after it, a
 * rendezvous-class send goes to that FIFO at once.
 *
 * Matching.  Eager receives match eager messages only, in posting order per
 * (peer, channel, tag); the rendezvous class keeps its own FIFO.  A message
 * with no posted receive is copied into the unexpected queue, which a later
 * receive checks first.  A size disagreement fails the receive with
 * CFX_ERR_INVALID (the send completed when it was handed over).
 *
 * Credits.  The acceptor grants CFX_EAGER_CREDITS messages per connection;
 * the sender spends one per message and queues, in order, when it has none.
 * The receiver returns credits for consumed messages once half the grant is
 * owed (EAGER_CREDIT).  A message beyond the grant is a protocol error, so
 * a peer can hold at most CFX_EAGER_CREDITS entries in the unexpected queue
 * per connection.  Ordinary sends leave the last CFX_EAGER_URGENT credits
 * to urgent ones (a group's check channel: a question, the news that a call
 * failed), which wait in a queue of their own that goes first (each queue
 * keeps posting order; no channel carries both kinds): messages the
 * receiver never takes (a rank of another opinion sent them) hold their
 * credits until its call ends, and the news that would end it must not
 * wait behind them.  The receiver sees one grant as before.
 *
 * Threads: the progress-lock holder (the progress thread, or an API thread
 * that posts or waits while the lock is free) sends, receives and returns
 * credits; API threads post receives and consume unexpected entries under
 * ctx->lock (a credit return they make due is a command, run at once when
 * they hold the progress lock).
 */
#include "engine.h"
#include "p2p.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/memtype.h"

static void wake(struct cfx_context *ctx)
{
    pthread_cond_broadcast(&ctx->obj_cond);
}

/* ---- sender ---------------------------------------------------------------- */

/* One message out; CFX_ERR_AGAIN: the send queue is full. *copy_rc is set
 * when the payload could not be read (the send fails, not the connection). */
static int eager_push(struct cfx_conn *conn, struct cfx_obj *obj, int *copy_rc)
{
    struct cfx_context *ctx = conn->ctx;
    union {
        struct cfx_dp_eager m;
        uint8_t raw[CFX_TP_SEND_MAX];
    } u;
    struct cfx_dp_eager *m = &u.m;

    m->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                  .type = CFX_DP_P2P_EAGER, .slot = 0 };
    m->chan = obj->chan;
    m->tag = obj->tag;
    m->len = (uint32_t)obj->size;
    *copy_rc = CFX_OK;
    if (obj->size) {
        if (likely(obj->memtype == CFX_MEMTYPE_HOST))
            memcpy(m->data, obj->buf, obj->size);
        else if ((*copy_rc = cfx__memcpy_typed(m->data, CFX_MEMTYPE_HOST, obj->buf, obj->memtype,
                                               obj->size)) != CFX_OK)
            return *copy_rc;
    }
    uint8_t wire[CFX_TP_SEND_MAX];
    int n = cfx__dp_msg_encode(m, sizeof(*m) + obj->size, wire, sizeof(wire));
    int rc = n < 0 ? n : ctx->tp[conn->tp].ops->ep_send(conn->ep, wire, (size_t)n, 0);
    if (rc == CFX_OK) {
        cfx__conn_count(conn, true, (uint64_t)n);
        conn->sends_out++; /* out of the process at its CFX_TP_COMP_SEND */
        conn->eager_credits--;
        ctx->stats.bytes_sent += obj->size;
    }
    return rc;
}

/* Post the rendezvous-class sends queued before the handshake told the
 * threshold (each class keeps posting order on its own). */
static void sort_queued(struct cfx_conn *conn, struct cfx_list *q)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, q) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (cfx__eager_class(obj->size, conn->eager_max))
            continue;
        cfx_list_del(&obj->p2p_link);
        /* matching a waiting request may serve (and fail) other
         * connections, never this outbound one: tmp stays valid */
        cfx__p2p_send_post(conn->ctx, obj);
    }
}

/* Can the batch that @p first (at the head of @p q) begins go whole: all
 * its sends queued, and credits for all of them above @p keep?  A batch
 * larger than the grant allows ever goes as credits come, as before. */
static bool batch_fits(const struct cfx_conn *conn, const struct cfx_list *q,
                       const struct cfx_obj *first, uint32_t keep)
{
    uint32_t n = first->eager_batch;
    if (conn->eager_granted <= keep || n > conn->eager_granted - keep)
        return true;
    if (conn->eager_credits < keep + n)
        return false;
    uint32_t queued = 0;
    for (const struct cfx_list *pos = &first->p2p_link; pos != q && queued < n; pos = pos->next)
        queued++;
    return queued == n;
}

/* Send from the head of @p q while more than @p keep credits last (a batch:
 * only once all of it fits).  0: the queue is empty; 1: it waits (credits,
 * or a full send queue); < 0: the send failed with that code, and with it
 * the connection (the caller fails it). */
static int pump_queue(struct cfx_conn *conn, struct cfx_list *q, uint32_t keep)
{
    struct cfx_context *ctx = conn->ctx;
    while (!cfx_list_empty(q)) {
        if (conn->eager_credits <= keep)
            return 1;
        struct cfx_obj *obj = cfx_list_entry(q->next, struct cfx_obj, p2p_link);
        if (unlikely(obj->eager_batch > 1) && !batch_fits(conn, q, obj, keep))
            return 1;
        int copy_rc;
        int rc = eager_push(conn, obj, &copy_rc);
        if (rc == CFX_ERR_AGAIN)
            return 1;
        cfx_list_del(&obj->p2p_link);
        cfx__status_set(&obj->p2p_status, copy_rc != CFX_OK ? copy_rc : rc);
        obj->eager = copy_rc == CFX_OK && rc == CFX_OK;
        wake(ctx);
        if (copy_rc == CFX_OK && rc != CFX_OK)
            return rc;
    }
    return 0;
}

/* More than one send in the connection's two queues together. */
static bool several_queued(const struct cfx_conn *conn)
{
    const struct cfx_list *u = &conn->eager_uq, *o = &conn->eager_q;
    unsigned n = (u->next != u) + (u->next != u && u->next->next != u) + (o->next != o) +
                 (o->next != o && o->next->next != o);
    return n > 1;
}

/* Send what the connection's queues allow: urgent sends while any credit
 * lasts, then ordinary ones while more than the urgent reserve (less under
 * a small grant: every kind of send must still go) lasts, each queue in
 * posting order.  Every pass stops at the first send that waits, so a pass
 * costs what it sends, not what is queued. */
void cfx__eager_pump(struct cfx_conn *conn)
{
    struct cfx_context *ctx = conn->ctx;
    const struct cfx_transport_ops *ops = ctx->tp[conn->tp].ops;
    struct cfx_tp_ep *ep = conn->ep;

    if (!conn->eager_known || conn->state != CFX_CONN_READY || !conn->authed)
        return;
    if (unlikely(conn->eager_unsorted)) {
        conn->eager_unsorted = false;
        sort_queued(conn, &conn->eager_uq);
        sort_queued(conn, &conn->eager_q);
    }
    if (!cfx__eager_queued(conn) || !conn->eager_credits)
        return;
    /* Several waiting (credits came back, or posts queued while the lock
     * was busy): let the transport send them together (tcp: one sendmsg). */
    bool batch = conn->eager_credits > 1 && several_queued(conn);
    if (batch)
        cfx__tp_ep_batch(ops, ep, true);
    int rc = pump_queue(conn, &conn->eager_uq, 0);
    if (rc == 0)
        rc = pump_queue(conn, &conn->eager_q,
                        CFX_MIN(CFX_EAGER_URGENT, conn->eager_granted / 2));
    if (batch)
        cfx__tp_ep_batch(ops, ep, false);
    if (rc < 0)
        cfx__conn_fail(conn, rc, "eager send failed"); /* fails the rest of the queues */
}

void cfx__eager_send_post(struct cfx_context *ctx, struct cfx_obj *obj,
                          const struct cfx_node_rec *peer, bool more)
{
    int status = CFX_OK;
    struct cfx_conn *conn = cfx__conn_get(ctx, peer, &status);
    if (!conn) {
        if (obj->size > CFX_EAGER_LIMIT) {
            /* rendezvous in any case, and the receiver drives it */
            cfx__p2p_send_post(ctx, obj);
            return;
        }
        obj->p2p_status = status == CFX_ERR_UNSUPPORTED || status == CFX_ERR_PEER_FAILED
                              ? status
                              : CFX_ERR_CONNECT;
        wake(ctx);
        return;
    }
    if (conn->eager_known && !conn->eager_unsorted &&
        !cfx__eager_class(obj->size, conn->eager_max)) {
        cfx__p2p_send_post(ctx, obj); /* rendezvous: the receiver drives it */
        if (!more && cfx__eager_queued(conn))
            cfx__eager_pump(conn); /* what cfx__p2p_isend_more queued before it */
        return;
    }
    conn->eager_unsorted |= !conn->eager_known;
    cfx_list_add_tail(&obj->p2p_link, obj->urgent ? &conn->eager_uq : &conn->eager_q);
    if (!more)
        cfx__eager_pump(conn);
}

void cfx__eager_credit_msg(struct cfx_conn *conn, uint32_t credits)
{
    if (!conn->outbound || !conn->eager_known || credits == 0 ||
        credits > conn->eager_granted - conn->eager_credits) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "eager credits beyond the grant");
        return;
    }
    conn->eager_credits += credits;
    cfx__eager_pump(conn);
}

/* ---- receiver ------------------------------------------------------------------ */

static bool key_match(const struct cfx_obj *obj, uint32_t node, uint64_t chan, uint32_t tag)
{
    return obj->peer_node == node && obj->chan == chan && obj->tag == tag;
}

/* Complete the eager receive @p obj with a message of @p len bytes. */
static void deliver(struct cfx_context *ctx, struct cfx_obj *obj, const void *data,
                    uint32_t len)
{
    struct cfx_xfer_in *in = obj->in;
    int st = CFX_OK;
    if (len != obj->size) {
        CFX_LOG(WARN, P2P, "node %u: node %u sent %u bytes on tag %d, the receive wants %" PRIu64,
                ctx->node_id, obj->peer_node, len, (int)obj->tag, obj->size);
        st = CFX_ERR_INVALID;
    } else if (len) {
        if (likely(obj->memtype == CFX_MEMTYPE_HOST))
            memcpy(obj->buf, data, len);
        else
            st = cfx__memcpy_typed(obj->buf, obj->memtype, data, CFX_MEMTYPE_HOST, len);
    }
    obj->complete = st == CFX_OK;
    if (in && in->status == CFX_ERR_AGAIN)
        cfx__status_set(&in->status, st);
    wake(ctx);
}

static void send_credit(struct cfx_conn *conn)
{
    struct cfx_dp_credit c = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                 .type = CFX_DP_EAGER_CREDIT, .slot = 0 },
        .credits = conn->eager_owed,
    };
    conn->eager_held -= conn->eager_owed;
    conn->eager_owed = 0;
    cfx__conn_send(conn, &c, sizeof(c));
}

static bool credit_due(const struct cfx_conn *conn)
{
    return conn->eager_owed && conn->eager_owed >= CFX_MAX(conn->eager_granted / 2, 1u);
}

/* A message that came on connection @p conn_id was consumed.  @p progress:
 * the progress lock is held (send the credit now), else leave it to a
 * command. */
static void consumed(struct cfx_context *ctx, uint64_t conn_id, bool progress)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->eager_id != conn_id || c->state == CFX_CONN_FAILED)
            continue;
        c->eager_owed++;
        if (credit_due(c)) {
            if (progress)
                send_credit(c);
            else
                cfx__cmd_new(ctx, CFX_CMD_EAGER_CREDIT, NULL, NULL); /* NOMEM: sent by the next */
        }
        return;
    }
    /* the connection is gone: its credits went with it */
}

int cfx__eager_return_credits(struct cfx_context *ctx)
{
    struct cfx_list *pos;
    int n = 0;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->state != CFX_CONN_FAILED && credit_due(c)) {
            send_credit(c);
            n++;
        }
    }
    return n;
}

/* An unexpected-queue entry for @p len bytes (ctx->lock held): one of
 * CFX_UNEXP_CACHED_LEN bytes comes from the context's free list when it
 * has one, and is allocated at that size otherwise so it can go back. */
static struct cfx_eager_unexp *unexp_take(struct cfx_context *ctx, uint32_t len)
{
    if (len > CFX_UNEXP_CACHED_LEN)
        return malloc(sizeof(struct cfx_eager_unexp) + len);
    if (likely(!cfx_list_empty(&ctx->unexp_cache))) {
        struct cfx_eager_unexp *u =
            cfx_list_entry(ctx->unexp_cache.next, struct cfx_eager_unexp, link);
        cfx_list_del(&u->link);
        ctx->unexp_ncached--;
        return u;
    }
    return malloc(sizeof(struct cfx_eager_unexp) + CFX_UNEXP_CACHED_LEN);
}

/* ctx->lock held: a consumed entry goes back to the free list or is freed. */
static void unexp_put(struct cfx_context *ctx, struct cfx_eager_unexp *u)
{
    if (u->len > CFX_UNEXP_CACHED_LEN || ctx->unexp_ncached >= CFX_FREE_LIST_MAX) {
        free(u);
        return;
    }
    cfx_list_add_head(&u->link, &ctx->unexp_cache); /* the warmest first */
    ctx->unexp_ncached++;
}

static bool chan_closed(const struct cfx_context *ctx, uint64_t chan)
{
    for (unsigned i = 0; i < CFX_CLOSED_CHANS && i < ctx->closed_next; i++)
        if (ctx->closed_chans[i] == chan)
            return true;
    return false;
}

static bool drop_any(void *arg, const struct cfx_eager_unexp *u)
{
    (void)arg;
    (void)u;
    return true;
}

int cfx__eager_chan_close(struct cfx_context *ctx, uint64_t chan)
{
    if (!chan_closed(ctx, chan))
        ctx->closed_chans[ctx->closed_next++ % CFX_CLOSED_CHANS] = chan;
    return cfx__eager_unexp_drop(ctx, chan, drop_any, NULL);
}

void cfx__eager_msg(struct cfx_context *ctx, struct cfx_conn *conn, const void *msg, size_t len)
{
    const struct cfx_dp_eager *m = msg;
    struct cfx_list *pos;
    (void)len; /* cfx__dp_msg_check: len == sizeof(*m) + m->len */

    if (unlikely(conn->outbound || conn->eager_held >= conn->eager_granted)) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "eager message beyond the credits granted");
        return;
    }
    if (unlikely(!cfx__eager_class(m->len, ctx->cfg.eager_max))) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "eager message above the threshold granted");
        return;
    }
    conn->eager_held++;
    ctx->stats.bytes_received += m->len;
    cfx_list_for_each(pos, &ctx->eager_posted) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (!key_match(obj, conn->node_id, m->chan, m->tag))
            continue;
        cfx_list_del(&obj->p2p_link);
        deliver(ctx, obj, m->data, m->len);
        consumed(ctx, conn->eager_id, true);
        return;
    }
    if (unlikely(chan_closed(ctx, m->chan))) {
        consumed(ctx, conn->eager_id, true); /* for nobody: a destroyed group's */
        return;
    }
    struct cfx_eager_unexp *u = unexp_take(ctx, m->len);
    if (!u) {
        cfx__conn_fail(conn, CFX_ERR_NOMEM, "out of memory holding an eager message");
        return;
    }
    u->node_id = conn->node_id;
    u->conn_id = conn->eager_id;
    u->chan = m->chan;
    u->tag = m->tag;
    u->len = m->len;
    memcpy(u->data, m->data, m->len);
    cfx_list_add_tail(&u->link, &ctx->eager_unexp);
    wake(ctx); /* a waiter's stop predicate may look at the queue (coll.c) */
}

bool cfx__node_is_dead(struct cfx_context *ctx, uint32_t node_id)
{
    for (unsigned d = 0; d < ctx->ndead; d++)
        if (ctx->dead[d] == node_id)
            return true;
    return false;
}

/* Did a connection with @p node_id end, with none live since? */
static bool node_gone(struct cfx_context *ctx, uint32_t node_id)
{
    bool gone = false;
    for (unsigned i = 0; i < ctx->eager_ngone && i < CFX_ARRAY_SIZE(ctx->eager_gone); i++)
        gone |= ctx->eager_gone[i] == node_id;
    if (!gone)
        return false;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node_id && c->state != CFX_CONN_FAILED)
            return false; /* it came back */
    }
    return true;
}

int cfx__eager_recv_post(struct cfx_context *ctx, struct cfx_obj *obj, struct cfx_xfer_in *in)
{
    struct cfx_list *pos;
    obj->eager = true;
    cfx_list_for_each(pos, &ctx->eager_unexp) {
        struct cfx_eager_unexp *u = cfx_list_entry(pos, struct cfx_eager_unexp, link);
        if (!key_match(obj, u->node_id, u->chan, u->tag))
            continue;
        cfx_list_del(&u->link);
        deliver(ctx, obj, u->data, u->len);
        consumed(ctx, u->conn_id, false);
        unexp_put(ctx, u);
        return CFX_OK;
    }
    if (cfx__node_is_dead(ctx, obj->peer_node) || node_gone(ctx, obj->peer_node)) {
        /* what it sent before it went was matched above */
        cfx__status_set(&in->status, CFX_ERR_PEER_FAILED);
        return CFX_OK;
    }
    cfx_list_add_tail(&obj->p2p_link, &ctx->eager_posted);
    return CFX_OK;
}

bool cfx__eager_unexp_scan(struct cfx_context *ctx, uint64_t chan,
                           bool (*fn)(void *arg, const struct cfx_eager_unexp *u), void *arg)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->eager_unexp) {
        const struct cfx_eager_unexp *u = cfx_list_entry(pos, struct cfx_eager_unexp, link);
        if (u->chan == chan && fn(arg, u))
            return true;
    }
    return false;
}

int cfx__eager_unexp_drop(struct cfx_context *ctx, uint64_t chan,
                          bool (*fn)(void *arg, const struct cfx_eager_unexp *u), void *arg)
{
    struct cfx_list *pos, *tmp;
    int n = 0;
    cfx_list_for_each_safe(pos, tmp, &ctx->eager_unexp) {
        struct cfx_eager_unexp *u = cfx_list_entry(pos, struct cfx_eager_unexp, link);
        if (u->chan != chan || !fn(arg, u))
            continue;
        cfx_list_del(&u->link);
        consumed(ctx, u->conn_id, false); /* the sender's credit comes back */
        unexp_put(ctx, u);
        n++;
    }
    return n;
}

void cfx__eager_recv_cancel(struct cfx_context *ctx, struct cfx_obj *obj, struct cfx_xfer_in *in)
{
    if (in->status != CFX_ERR_AGAIN)
        return;
    cfx_list_del(&obj->p2p_link);
    cfx_list_init(&obj->p2p_link);
    cfx__status_set(&in->status, CFX_ERR_CANCELED);
    wake(ctx);
}

/* Fail the eager receives waiting on @p node_id. */
static void fail_posted(struct cfx_context *ctx, uint32_t node_id, int status)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->eager_posted) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (obj->peer_node != node_id)
            continue;
        cfx_list_del(&obj->p2p_link);
        cfx_list_init(&obj->p2p_link);
        if (obj->in && obj->in->status == CFX_ERR_AGAIN)
            cfx__status_set(&obj->in->status, status);
        wake(ctx);
    }
}

/*
 * A connection ended.  Sends still queued on it fail; eager receives from
 * its node fail (nothing more can come: a peer that reconnects is a new
 * incarnation of the same rank only after a restart, which fails its
 * groups anyway).  Messages already in the unexpected queue stay: they
 * arrived whole, and a rank that sent and exited may be matched later.
 */
/*
 * Messages a closed connection left in the unexpected queue stay for the
 * receives that want them (sent before their sender went), but no credit
 * bounds them any more: a peer that holds the token could close and open
 * connections (under any node id it names) and pile up 64 on each, without
 * end.  So what closed connections left is capped: EAGER_ORPHANS_NODE of one
 * node, EAGER_ORPHANS_ALL in all; past that the oldest go, with a warning
 * (an honest peer leaves that many only after several connections failed
 * with its messages unread).
 */
#define EAGER_ORPHANS_NODE (4 * CFX_EAGER_CREDITS)
#define EAGER_ORPHANS_ALL  (64 * CFX_EAGER_CREDITS)

/* Mark what @p conn left as orphans (conn_id 0: no credit goes back for it)
 * and enforce the caps, oldest first. */
static void orphans_cap(struct cfx_context *ctx, const struct cfx_conn *conn)
{
    unsigned node = 0, all = 0, dropped = 0;
    struct cfx_list *pos, *tmp;
    cfx_list_for_each(pos, &ctx->eager_unexp) {
        struct cfx_eager_unexp *u = cfx_list_entry(pos, struct cfx_eager_unexp, link);
        if (u->conn_id == conn->eager_id)
            u->conn_id = 0;
        all += !u->conn_id;
        node += !u->conn_id && u->node_id == conn->node_id;
    }
    cfx_list_for_each_safe(pos, tmp, &ctx->eager_unexp) {
        struct cfx_eager_unexp *u = cfx_list_entry(pos, struct cfx_eager_unexp, link);
        if (node <= EAGER_ORPHANS_NODE && all <= EAGER_ORPHANS_ALL)
            break;
        bool mine = u->node_id == conn->node_id;
        if (u->conn_id || !((mine && node > EAGER_ORPHANS_NODE) || all > EAGER_ORPHANS_ALL))
            continue;
        node -= mine;
        all--;
        dropped++;
        cfx_list_del(&u->link);
        unexp_put(ctx, u);
    }
    if (dropped)
        CFX_LOG(WARN, P2P, "node %u: dropped the %u oldest messages that closed connections "
                "left here unreceived (node %u's now hold %u; more than %u of one node's, or "
                "%u in all, are not kept)", ctx->node_id, dropped, conn->node_id, node,
                EAGER_ORPHANS_NODE, EAGER_ORPHANS_ALL);
}

void cfx__eager_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn)
{
    orphans_cap(ctx, conn);
    struct cfx_list *pos, *tmp, *queues[] = { &conn->eager_uq, &conn->eager_q };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(queues); i++) {
        cfx_list_for_each_safe(pos, tmp, queues[i]) {
            struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
            cfx_list_del(&obj->p2p_link);
            cfx_list_init(&obj->p2p_link);
            cfx__status_set(&obj->p2p_status, CFX_ERR_PEER_FAILED);
            wake(ctx);
        }
    }
    /* one made as the node this one was before a rejoin under a new id
     * ended because the peer dropped that node, not because the peer went:
     * receives from the peer under the new id go on; unless the peer did go
     * (its leave learnt on rejoining, progress.c node_missed) */
    if (conn->node_id &&
        (conn->self_id == ctx->node_id || cfx__node_gone(ctx, conn->node_id))) {
        /* a peer that left is not reported dead: remember that it went */
        ctx->eager_gone[ctx->eager_ngone++ % CFX_ARRAY_SIZE(ctx->eager_gone)] = conn->node_id;
        /* The node's messages come on its own (inbound) connection; the
         * hang-up of ours to it can be seen first while what it sent just
         * before it left is still unread on the other one.  Fail the
         * receives when the last connection with the node ends. */
        struct cfx_list *p;
        bool other = false;
        cfx_list_for_each(p, &ctx->conns) {
            struct cfx_conn *c = cfx_list_entry(p, struct cfx_conn, link);
            other |= c != conn && c->node_id == conn->node_id && c->state != CFX_CONN_FAILED;
        }
        if (!other)
            fail_posted(ctx, conn->node_id, CFX_ERR_PEER_FAILED);
    }
}

void cfx__eager_node_dead(struct cfx_context *ctx, uint32_t node_id)
{
    fail_posted(ctx, node_id, CFX_ERR_PEER_FAILED);
}

void cfx__eager_destroy_all(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->eager_unexp) {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_eager_unexp, link));
    }
    cfx_list_for_each_safe(pos, tmp, &ctx->unexp_cache)
    {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_eager_unexp, link));
    }
    ctx->unexp_ncached = 0;
    cfx_list_for_each_safe(pos, tmp, &ctx->eager_posted) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        cfx_list_del(pos);
        cfx_list_init(&obj->p2p_link);
        if (obj->in && obj->in->status == CFX_ERR_AGAIN)
            cfx__status_set(&obj->in->status, CFX_ERR_CLOSED);
    }
}

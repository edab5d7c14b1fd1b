/*
 * Connections to peer nodes.  Outbound connections (ours, for gets) are
 * found by node id; inbound ones (peers getting from us) are learned from
 * their HELLO.  Messages posted while connecting are queued and flushed on
 * CONNECTED.  Progress-lock holder only, ctx->lock held.
 */
#include "engine.h"
#include "p2p.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct cfx_node_addr *cfx__node_addr(const struct cfx_node_rec *node, const char *tp)
{
    for (unsigned a = 0; a < node->naddr && a < CFX_NODE_ADDRS_MAX; a++)
        if (!strncmp(node->addr[a].tp, tp, CFX_TP_NAME_MAX))
            return &node->addr[a];
    return NULL;
}

/* The transport to reach @p node with: the first of ours (in preference
 * order), not in @p tried (a mask of ctx->tp[] indices), that the node also
 * listens on and that can reach it; -1 when none is left. */
static int tp_next(struct cfx_context *ctx, const struct cfx_node_rec *node, uint32_t tried)
{
    for (int t = 0; t < ctx->ntp; t++) {
        const struct cfx_transport_ops *ops = ctx->tp[t].ops;
        if (tried & (1u << t))
            continue;
        if ((ops->caps & CFX_TP_CAP_SAME_HOST) &&
            strncmp(node->host_id, ctx->self.host_id, CFX_HOST_ID_MAX))
            continue;
        if (cfx__node_addr(node, ops->name))
            return t;
    }
    return -1;
}

int cfx__conn_tp_for(struct cfx_context *ctx, const struct cfx_node_rec *node)
{
    return tp_next(ctx, node, 0);
}

/* Test hook CFX_TEST_CONNECT_BREAK=<transport>: connections over that
 * transport go to an address nobody listens on (that of an iface of the
 * same transport opened and closed at once), so they fail the way a
 * connection to a peer that cannot be reached does. */
static bool test_dead_addr(struct cfx_context *ctx, int t, struct cfx_node_addr *out)
{
    const struct cfx_transport_ops *ops = ctx->tp[t].ops;
    struct cfx_tp_iface_params ip = { .field_mask = CFX_TP_IFACE_PARAM_BIND_ADDR,
                                      .bind_addr = ctx->cfg.bind_addr };
    struct cfx_tp_iface *iface;
    size_t len = sizeof(out->addr);

    if (!ctx->test_connect_break[0] ||
        strncmp(ctx->test_connect_break, ops->name, sizeof(ctx->test_connect_break)))
        return false;
    if (ops->iface_open(&ip, &iface) != CFX_OK)
        return false;
    bool ok = ops->iface_addr(iface, out->addr, &len) == CFX_OK;
    ops->iface_close(iface);
    out->len = (uint8_t)len;
    if (ok)
        CFX_LOG(WARN, CONN, "node %u: test hook: connecting over %s to %.*s, where nobody "
                "listens", ctx->node_id, ops->name, (int)len, (const char *)out->addr);
    return ok;
}

/*
 * Connect @p conn to its peer over the next transport both sides share
 * that it has not tried yet; a transport whose ep_connect fails at once is
 * logged and the next one tried.  CFX_OK with conn->tp and conn->ep set, or
 * the status of the last failure (CFX_ERR_UNSUPPORTED: nothing shared).
 */
static int conn_dial(struct cfx_conn *conn)
{
    struct cfx_context *ctx = conn->ctx;
    const struct cfx_node_rec *node = conn->peer;
    int rc = CFX_ERR_UNSUPPORTED, t;

    while ((t = tp_next(ctx, node, conn->tps_tried)) >= 0) {
        struct cfx_node_addr dead;
        const struct cfx_node_addr *addr = cfx__node_addr(node, ctx->tp[t].ops->name);
        conn->tps_tried |= 1u << t;
        /* tcp's and shm's addresses are text ("127.0.0.1:4321"); dpdk's is
         * a binary record, whose text the endpoint's own name carries */
        int alen = (int)strnlen((const char *)addr->addr, addr->len);
        bool text = alen > 0;
        for (int i = 0; i < alen && text; i++)
            text = addr->addr[i] >= 0x20 && addr->addr[i] < 0x7f;
        snprintf(conn->name, sizeof(conn->name), "node %u (%s %.*s)", node->node_id,
                 ctx->tp[t].ops->name, text ? alen : 7,
                 text ? (const char *)addr->addr : "address");
        if (unlikely(ctx->test_connect_break[0]) && test_dead_addr(ctx, t, &dead))
            addr = &dead;
        rc = ctx->tp[t].ops->ep_connect(ctx->tp[t].iface, addr->addr, addr->len,
                                        node->node_id, &conn->ep);
        if (rc == CFX_OK) {
            conn->tp = t;
            conn->ep->user = conn;
            snprintf(conn->ep->peer_name, sizeof(conn->ep->peer_name), "node %u",
                     node->node_id);
            return CFX_OK;
        }
        rc = cfx__err(rc, "cannot connect to %s: %s", conn->name, cfx_strerror(rc));
        CFX_LOG(WARN, CONN, "node %u: %s%s", ctx->node_id, cfx_last_error(),
                tp_next(ctx, node, conn->tps_tried) >= 0 ? "; trying the next transport" : "");
    }
    if (rc == CFX_ERR_UNSUPPORTED)
        rc = cfx__err(CFX_ERR_UNSUPPORTED,
                      "node %u (%s) shares no transport with node %u (ours: %s)",
                      node->node_id, node->name, ctx->node_id, ctx->cfg.transports);
    return rc;
}

struct cfx_conn *cfx__conn_get(struct cfx_context *ctx, const struct cfx_node_rec *node,
                               int *status)
{
    struct cfx_list *pos;
    struct cfx_conn *conn;

    cfx_list_for_each(pos, &ctx->conns) {
        conn = cfx_list_entry(pos, struct cfx_conn, link);
        if (conn->outbound && conn->node_id == node->node_id &&
            conn->state != CFX_CONN_FAILED) {
            if (unlikely(conn->self_id != ctx->node_id)) {
                /* made as the node this one was before it rejoined under a
                 * new id (reannounce.c adopt_node_id): the peer takes what
                 * comes on it for that node's, which it dropped as dead */
                char why[96];
                snprintf(why, sizeof(why), "made as node %u, before this node rejoined as "
                         "node %u", conn->self_id, ctx->node_id);
                cfx__conn_fail(conn, CFX_ERR_CLOSED, why);
                break;
            }
            if (likely(conn->abandoned < CFX_CONN_ABANDONED_MAX))
                return conn;
            /* Each transfer abandoned at its deadline keeps its slot until
             * the peer answers its CANCEL (xfer.c); a peer that answers
             * none would hold them all.  Closing the connection ends them
             * (their grants were revoked already) and a new one starts. */
            CFX_LOG(WARN, CONN, "node %u: %s has left %u cancels unanswered (transfers "
                    "given up at their deadline); closing the connection to free their "
                    "slots", ctx->node_id, conn->name, conn->abandoned);
            cfx__conn_fail(conn, CFX_ERR_PEER_FAILED, "cancels unanswered");
            break;
        }
    }

    /* a node the coordinator reported dead or gone does not come back (ids
     * are never reused): no dial, no transport fallback and its warnings,
     * for each later message or collective that names it */
    int gone = cfx__node_gone(ctx, node->node_id);
    if (gone) {
        *status = cfx__err(CFX_ERR_PEER_FAILED, "node %u (%s) %s", node->node_id, node->name,
                           gone == CFX_NODE_DEAD ? "is dead (the coordinator reported it)"
                                                 : "left the cluster");
        return NULL;
    }
    if (cfx__conn_tp_for(ctx, node) < 0) {
        *status = cfx__err(CFX_ERR_UNSUPPORTED,
                           "node %u (%s) shares no transport with node %u (ours: %s)",
                           node->node_id, node->name, ctx->node_id, ctx->cfg.transports);
        return NULL;
    }
    conn = calloc(1, sizeof(*conn));
    if (!conn || !(conn->peer = malloc(sizeof(*conn->peer)))) {
        free(conn);
        *status = cfx__err(CFX_ERR_NOMEM, "out of memory connecting to node %u", node->node_id);
        return NULL;
    }
    *conn->peer = *node;
    conn->ctx = ctx;
    conn->node_id = node->node_id;
    conn->self_id = ctx->node_id;
    conn->outbound = true;
    conn->state = CFX_CONN_CONNECTING;
    cfx_list_init(&conn->pending);
    cfx_list_init(&conn->uploads);
    cfx_list_init(&conn->eager_q);
    cfx_list_init(&conn->eager_uq);
    conn->eager_id = ++ctx->eager_conn_ids;

    ctx->n_dials++;
    int rc = conn_dial(conn);
    if (rc != CFX_OK) {
        *status = rc;
        free(conn->peer);
        free(conn);
        return NULL;
    }
    cfx_list_add_tail(&conn->link, &ctx->conns);
    CFX_LOG(DEBUG, CONN, "node %u: connecting to %s", ctx->node_id, conn->name);
    rc = cfx__conn_auth_hello_out(conn); /* HELLO with our nonce (conn_auth.c) */
    if (rc != CFX_OK) {
        *status = rc; /* the connection is gone */
        return NULL;
    }
    return conn;
}

/* The GET_REQs queued on @p conn name windows granted over transport
 * @p old_tp: grant them again over the connection's new transport. */
static int conn_regrant(struct cfx_conn *conn, int old_tp)
{
    struct cfx_context *ctx = conn->ctx;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &conn->pending) {
        struct cfx_pending_msg *pm = cfx_list_entry(pos, struct cfx_pending_msg, link);
        struct cfx_dp_get_req *req = (struct cfx_dp_get_req *)(void *)pm->data;
        if (pm->len != sizeof(*req) || req->hdr.type != CFX_DP_GET_REQ || !req->rdesc.len)
            continue;
        struct cfx_xfer_in *in = req->hdr.slot < CFX_XFER_SLOTS ? ctx->slots[req->hdr.slot]
                                                                : NULL;
        if (!in || in->conn != conn || !in->obj)
            continue;
        struct cfx_obj *obj = in->obj;
        const struct cfx_transport_ops *old = ctx->tp[old_tp].ops;
        if (in->mr) {
            /* a striped get's own registration (xfer.c): made again over
             * the new transport */
            int st = CFX_OK;
            cfx__xfer_stripe_mr_drop(ctx, in);
            if ((st = cfx__xfer_stripe_mr(ctx, in, conn->tp)) != CFX_OK ||
                (st = cfx__xfer_grant(ctx, conn, in->mr, &req->rdesc)) != CFX_OK)
                return st;
            continue;
        }
        if (obj->mr[old_tp] && old->mr_revoke)
            old->mr_revoke(obj->mr[old_tp]);
        int status = CFX_OK;
        struct cfx_tp_mr *mr = cfx__obj_mr(ctx, obj, conn->tp, &status);
        if (!mr || (status = cfx__xfer_grant(ctx, conn, mr, &req->rdesc)) != CFX_OK)
            return status;
    }
    return CFX_OK;
}

/*
 * A connection closed by the peer before the handshake ended may have been
 * closed for a newer one at the peer's caps on connections not yet
 * authenticated (tpbase/tp_strangers.h): a burst of connections from
 * token holders does that (an alltoall of 100 ranks on one host did, at
 * 32 of one address).  It is dialled again over the same transport, up to
 * CFX_CONN_REDIALS times within its auth deadline; a peer that is gone
 * refuses the new one (CFX_ERR_CONNECT), which moves on as before.
 */
static bool conn_redial(const struct cfx_conn *conn, int status)
{
    return conn->redials < CFX_CONN_REDIALS &&
           (status == CFX_ERR_PEER_FAILED || status == CFX_ERR_CLOSED ||
            status == CFX_ERR_NO_RESOURCE || status == CFX_ERR_IO);
}

bool cfx__conn_fallback(struct cfx_conn *conn, int status)
{
    struct cfx_context *ctx = conn->ctx;
    /* a peer that refused us (token, version) would refuse us over any
     * transport: only a connection that could not be made moves on */
    if (!conn->outbound || conn->authed || !conn->peer || status == CFX_ERR_AUTH ||
        status == CFX_ERR_VERSION)
        return false;
    bool again = conn_redial(conn, status);
    if (!again && (conn->state != CFX_CONN_CONNECTING ||
                   tp_next(ctx, conn->peer, conn->tps_tried) < 0))
        return false;

    int old_tp = conn->tp;
    if (again) {
        conn->redials++;
        conn->tps_tried &= ~(1u << old_tp);
        conn->state = CFX_CONN_CONNECTING;
        CFX_LOG(INFO, CONN, "node %u: %s closed the connection before the handshake ended "
                "(%s%s%s; at its cap on connections not yet authenticated?): dialling again "
                "(%u of %u)", ctx->node_id, conn->name, cfx_errname(status),
                conn->ep && conn->ep->why ? ": " : "", conn->ep && conn->ep->why ?
                conn->ep->why : "", conn->redials, CFX_CONN_REDIALS);
    } else {
        CFX_LOG(WARN, CONN, "node %u: connecting to %s failed (%s%s%s); trying the next "
                "transport", ctx->node_id, conn->name, cfx_errname(status),
                conn->ep && conn->ep->why ? ": " : "", conn->ep && conn->ep->why ?
                conn->ep->why : "");
    }
    ctx->tp[old_tp].ops->ep_close(conn->ep);
    conn->ep = NULL;
    ctx->conn_gen++; /* completions of the old endpoint in this batch are stale */
    conn->sends_out = 0; /* its handshake messages: dropped with it */
    conn->auth_sent = false;
    conn->eager_known = false;
    /* the handshake starts again on the new endpoint */
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &conn->pending) {
        struct cfx_pending_msg *pm = cfx_list_entry(pos, struct cfx_pending_msg, link);
        if (pm->hs) {
            cfx_list_del(pos);
            free(pm);
        }
    }
    int rc = conn_dial(conn);
    if (rc == CFX_OK)
        rc = conn_regrant(conn, old_tp);
    if (rc != CFX_OK) {
        cfx__conn_fail(conn, rc, "no transport left to connect over");
        return true;
    }
    if (!again)
        CFX_LOG(INFO, CONN, "node %u: connecting to %s instead", ctx->node_id, conn->name);
    cfx__conn_auth_hello_out(conn); /* a failure ended the connection */
    return true;
}

/* Encode the host-form message @p msg for the wire (dp_msg.c) and hand it
 * to the transport.  What waits in conn->pending stays in host form: a
 * fallback to another transport grants its requests anew (conn_regrant). */
static int conn_ep_send(struct cfx_conn *conn, const struct cfx_transport_ops *ops,
                        const void *msg, size_t len)
{
    uint8_t wire[CFX_TP_SEND_MAX];
    int n = cfx__dp_msg_encode(msg, len, wire, sizeof(wire));
    if (unlikely(n < 0))
        return cfx__err(n, "%s: a data-plane message of type %u does not encode (%s)",
                        conn->name, ((const struct cfx_dp_hdr *)msg)->type, cfx_errname(n));
    int rc = ops->ep_send(conn->ep, wire, (size_t)n, 0);
    if (rc == CFX_OK)
        cfx__conn_count(conn, true, (uint64_t)n);
    return rc;
}

#define PEER_SLOT_NONE 0xff /* conn->peer_slot: the table was full, not counted apart */
#define PEER_SLOT_GONE 0xfe /* conn->peer_slot: its peer departed; not counted apart */
_Static_assert(CFX_PEER_BYTES_MAX < PEER_SLOT_GONE, "a slot number must not read as NONE/GONE");

/* Give slot @p i, whose peer departed, to (@p peer, @p tp) from zero.  The
 * heartbeat reads it under the sequence lock: a departed peer's series
 * ends, the new one's starts at its own first bytes. */
static void peer_slot_take(struct cfx_context *ctx, unsigned i, uint32_t peer, uint8_t tp)
{
    struct cfx_peer_bytes *e = &ctx->peer_bytes[i];
    uint32_t seq = e->seq;
    __atomic_store_n(&e->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&e->t.peer, peer, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t.tp, tp, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t.tx_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->t.rx_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->seq, seq + 2, __ATOMIC_RELEASE);
    e->departed = false;
    ctx->npeer_departed--;
}

/* The slot of @p conn's (peer, transport), made if needed: its own entry
 * (one of a peer that departed and came back under its id goes on counting:
 * its series never goes down), a new one while the table has room, else
 * the first departed peer's; PEER_SLOT_NONE when every slot is a live
 * peer's. */
static uint8_t peer_slot_find(struct cfx_context *ctx, const struct cfx_conn *conn)
{
    unsigned used = ctx->npeer_bytes, i, free_at = used;
    for (i = 0; i < used; i++) {
        struct cfx_peer_bytes *e = &ctx->peer_bytes[i];
        if (e->t.peer == conn->node_id && e->t.tp == conn->tp) {
            if (e->departed) {
                e->departed = false;
                ctx->npeer_departed--;
            }
            return (uint8_t)(i + 1);
        }
        if (e->departed && free_at == used)
            free_at = i;
    }
    if (used < CFX_PEER_BYTES_MAX) {
        ctx->peer_bytes[used].t.peer = conn->node_id;
        ctx->peer_bytes[used].t.tp = (uint8_t)conn->tp;
        __atomic_store_n(&ctx->npeer_bytes, used + 1, __ATOMIC_RELEASE);
        return (uint8_t)(used + 1);
    }
    if (free_at == used)
        return PEER_SLOT_NONE;
    peer_slot_take(ctx, free_at, conn->node_id, (uint8_t)conn->tp);
    return (uint8_t)(free_at + 1);
}

void cfx__conn_count(struct cfx_conn *conn, bool tx, uint64_t n)
{
    struct cfx_context *ctx = conn->ctx;
    struct cfx_tp_slot *t = &ctx->tp[conn->tp];
    cfx__tp_count(tx ? &t->tx_bytes : &t->rx_bytes, n);
    /* a connection that found the table full looks again once a slot is free */
    if (unlikely(conn->peer_slot == PEER_SLOT_NONE) && unlikely(ctx->npeer_departed))
        conn->peer_slot = 0;
    if (unlikely(!conn->peer_slot)) {
        if (!conn->node_id)
            return; /* accepted, before its HELLO */
        conn->peer_slot = peer_slot_find(ctx, conn);
    }
    if (conn->peer_slot == PEER_SLOT_NONE || conn->peer_slot == PEER_SLOT_GONE)
        return;
    struct cfx_ctl_peer_traffic *p = &ctx->peer_bytes[conn->peer_slot - 1].t;
    cfx__tp_count(tx ? &p->tx_bytes : &p->rx_bytes, n);
}

bool cfx__peer_bytes_read(struct cfx_context *ctx, unsigned i, struct cfx_ctl_peer_traffic *out)
{
    struct cfx_peer_bytes *e = &ctx->peer_bytes[i];
    uint32_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
    out->peer = __atomic_load_n(&e->t.peer, __ATOMIC_RELAXED);
    out->tp = __atomic_load_n(&e->t.tp, __ATOMIC_RELAXED);
    out->tx_bytes = __atomic_load_n(&e->t.tx_bytes, __ATOMIC_RELAXED);
    out->rx_bytes = __atomic_load_n(&e->t.rx_bytes, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return !(seq & 1) && __atomic_load_n(&e->seq, __ATOMIC_RELAXED) == seq;
}

int cfx__conn_send(struct cfx_conn *conn, const void *msg, size_t len)
{
    const struct cfx_transport_ops *ops = conn->ctx->tp[conn->tp].ops;

    if (conn->state == CFX_CONN_FAILED)
        return conn->status;
    if (conn->state == CFX_CONN_READY && conn->authed && cfx_list_empty(&conn->pending)) {
        int rc = conn_ep_send(conn, ops, msg, len);
        if (rc == CFX_OK)
            conn->sends_out++;
        if (rc != CFX_ERR_AGAIN)
            return rc;
    }
    /* queue: connecting, authenticating, or the send queue is full */
    struct cfx_pending_msg *pm = malloc(sizeof(*pm) + len);
    if (!pm)
        return CFX_ERR_NOMEM;
    pm->hs = false;
    pm->len = len;
    memcpy(pm->data, msg, len);
    cfx_list_add_tail(&pm->link, &conn->pending);
    return CFX_OK;
}

static int conn_flush(struct cfx_conn *conn);

int cfx__conn_send_hs(struct cfx_conn *conn, const void *msg, size_t len)
{
    if (conn->state == CFX_CONN_FAILED)
        return conn->status;
    struct cfx_pending_msg *pm = malloc(sizeof(*pm) + len);
    if (!pm) {
        /* a handshake that cannot go out would leave the connection
         * unauthenticated for good: end it (a failure means it is gone) */
        cfx__conn_fail(conn, CFX_ERR_NOMEM, "out of memory for a handshake message");
        return CFX_ERR_NOMEM;
    }
    pm->hs = true;
    pm->len = len;
    memcpy(pm->data, msg, len);
    cfx_list_add_head(&pm->link, &conn->pending); /* ahead of what waits for authentication */
    int n = conn_flush(conn);
    return n < 0 ? n : CFX_OK; /* < 0: the connection failed and is gone */
}

int cfx__conn_flush(struct cfx_conn *conn)
{
    return conn_flush(conn);
}

/* Flush queued control messages; returns how many went out, or a negative
 * status when sending failed the connection (which is then freed). */
static int conn_flush(struct cfx_conn *conn)
{
    const struct cfx_transport_ops *ops = conn->ctx->tp[conn->tp].ops;
    struct cfx_tp_ep *ep = conn->ep;
    int n = 0;
    /* Several queued: the transport may send them together (tcp: one sendmsg). */
    bool batch = conn->state == CFX_CONN_READY && !cfx_list_empty(&conn->pending) &&
                 conn->pending.next->next != &conn->pending;
    if (batch)
        cfx__tp_ep_batch(ops, ep, true);
    while (conn->state == CFX_CONN_READY && !cfx_list_empty(&conn->pending)) {
        struct cfx_pending_msg *pm =
            cfx_list_entry(conn->pending.next, struct cfx_pending_msg, link);
        if (!conn->authed && !pm->hs)
            break; /* the rest waits for the handshake */
        int rc = conn_ep_send(conn, ops, pm->data, pm->len);
        if (rc == CFX_ERR_AGAIN)
            break;
        cfx_list_del(&pm->link);
        free(pm);
        if (rc != CFX_OK) {
            if (batch)
                cfx__tp_ep_batch(ops, ep, false);
            cfx__conn_fail(conn, rc, "send failed");
            return rc;
        }
        conn->sends_out++;
        n++;
    }
    if (batch)
        cfx__tp_ep_batch(ops, ep, false);
    return n;
}

int cfx__conn_flush_all(struct cfx_context *ctx);
int cfx__conn_flush_all(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    uint64_t now = 0; /* read once, and only for a connection still unauthenticated */
    int n = 0;
    /* a failing flush frees its own connection (only that one) */
    cfx_list_for_each_safe(pos, tmp, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(pos, struct cfx_conn, link);
        if (unlikely(!conn->authed && !conn->outbound)) {
            /* a peer that connects and never proves the token does not
             * keep the connection (and its buffers) for ever; our own
             * connections are bounded by the deadlines of their requests */
            if (!now)
                now = cfx__now_ns();
            if (!conn->auth_deadline) {
                conn->auth_deadline = now + (uint64_t)CFX_CONN_AUTH_MS * 1000000ull;
            } else if (now > conn->auth_deadline) {
                char why[64];
                snprintf(why, sizeof(why), "no authentication within %d ms", CFX_CONN_AUTH_MS);
                cfx__conn_fail(conn, CFX_ERR_TIMEOUT, why);
                continue;
            }
        }
        if (!cfx_list_empty(&conn->pending)) {
            int k = conn_flush(conn);
            n += k > 0 ? k : 0;
            if (k < 0)
                continue; /* failed and freed */
        }
        if (unlikely(cfx__eager_queued(conn)) && conn->eager_credits) {
            /* eager sends that met a full send queue */
            uint64_t gen = ctx->conn_gen;
            cfx__eager_pump(conn);
            if (ctx->conn_gen != gen)
                break; /* connections were freed: the rest waits for the next round */
        }
    }
    return n;
}

void cfx__conn_connected(struct cfx_conn *conn);
void cfx__conn_connected(struct cfx_conn *conn)
{
    conn->state = CFX_CONN_READY;
    CFX_LOG(DEBUG, CONN, "node %u: connected to %s", conn->ctx->node_id, conn->name);
    conn_flush(conn);
}

struct cfx_conn *cfx__conn_accepted(struct cfx_context *ctx, int tp, struct cfx_tp_ep *ep);
struct cfx_conn *cfx__conn_accepted(struct cfx_context *ctx, int tp, struct cfx_tp_ep *ep)
{
    struct cfx_conn *conn = calloc(1, sizeof(*conn));
    if (!conn) {
        CFX_LOG(ERR, CONN, "node %u: out of memory accepting a connection", ctx->node_id);
        ctx->tp[tp].ops->ep_close(ep);
        return NULL;
    }
    conn->ctx = ctx;
    conn->self_id = ctx->node_id;
    conn->tp = tp;
    conn->ep = ep;
    conn->state = CFX_CONN_READY;
    cfx_list_init(&conn->pending);
    cfx_list_init(&conn->uploads);
    cfx_list_init(&conn->eager_q);
    cfx_list_init(&conn->eager_uq);
    conn->eager_id = ++ctx->eager_conn_ids;
    snprintf(conn->name, sizeof(conn->name), "unidentified peer (%s %s)",
             ctx->tp[tp].ops->name, ep->peer_name);
    ep->user = conn;
    cfx_list_add_tail(&conn->link, &ctx->conns);
    return conn;
}

void cfx__conn_hello(struct cfx_conn *conn, uint32_t node_id);
void cfx__conn_hello(struct cfx_conn *conn, uint32_t node_id)
{
    char old[96];
    snprintf(old, sizeof(old), "%s", conn->name);
    conn->node_id = node_id;
    conn->ep->peer_node = node_id;
    snprintf(conn->name, sizeof(conn->name), "node %u (%s %s)", node_id,
             conn->ctx->tp[conn->tp].ops->name, conn->ep->peer_name);
    CFX_LOG(DEBUG, CONN, "node %u: %s is %s", conn->ctx->node_id, old, conn->name);
}

/* The connection failed: fail its transfers, close the endpoint. */
void cfx__conn_fail(struct cfx_conn *conn, int status, const char *why)
{
    struct cfx_context *ctx = conn->ctx;
    if (conn->state == CFX_CONN_FAILED)
        return;
    conn->state = CFX_CONN_FAILED;
    conn->status = status;
    struct cfx_conn_failure *f = &ctx->conn_fails[ctx->conn_fails_next++ % CFX_CONN_FAILS_KEEP];
    f->node_id = conn->node_id;
    f->status = status;
    f->at_ns = cfx__now_ns();
    snprintf(f->why, sizeof(f->why), "%s", why);
    CFX_LOG(INFO, CONN, "node %u: connection to %s failed: %s (%s)", ctx->node_id,
            conn->name, why, cfx_errname(status));
    cfx__xfer_conn_failed(ctx, conn);
    cfx__conn_destroy(conn);
}

const struct cfx_conn_failure *cfx__conn_failure(const struct cfx_context *ctx,
                                                 uint32_t node_id)
{
    for (unsigned i = 1; i <= CFX_CONN_FAILS_KEEP && i <= ctx->conn_fails_next; i++) {
        const struct cfx_conn_failure *f =
            &ctx->conn_fails[(ctx->conn_fails_next - i) % CFX_CONN_FAILS_KEEP];
        if (f->node_id == node_id)
            return f;
    }
    return NULL;
}

void cfx__conn_destroy(struct cfx_conn *conn)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &conn->pending) {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_pending_msg, link));
    }
    if (conn->ep)
        conn->ctx->tp[conn->tp].ops->ep_close(conn->ep);
    conn->ep = NULL;
    conn->ctx->conn_gen++;
    cfx_list_del(&conn->link);
    free(conn->peer);
    free(conn);
}

void cfx__conn_node_dead(struct cfx_context *ctx, uint32_t node_id)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(pos, struct cfx_conn, link);
        if (conn->node_id == node_id)
            cfx__conn_fail(conn, CFX_ERR_PEER_FAILED, "coordinator reports the node dead");
    }
    cfx__conn_peer_departed(ctx, node_id);
}

void cfx__conn_peer_departed(struct cfx_context *ctx, uint32_t node_id)
{
    struct cfx_list *pos;
    /* a leaving peer's connections close in order: what they still carry
     * counts for the transport only, never into a slot another pair took */
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(pos, struct cfx_conn, link);
        if (conn->node_id == node_id)
            conn->peer_slot = PEER_SLOT_GONE;
    }
    /* its entries keep their counts (and are reported) until a new pair
     * needs the slot */
    for (unsigned i = 0; i < ctx->npeer_bytes; i++)
        if (ctx->peer_bytes[i].t.peer == node_id && !ctx->peer_bytes[i].departed) {
            ctx->peer_bytes[i].departed = true;
            ctx->npeer_departed++;
        }
}

/* Register @p obj with transport @p tp on first use. */
struct cfx_tp_mr *cfx__obj_mr(struct cfx_context *ctx, struct cfx_obj *obj, int tp,
                              int *status)
{
    if (obj->mr[tp])
        return obj->mr[tp];
    struct cfx_tp_mem_desc mem = {
        .addr = obj->buf,
        .len = obj->size ? obj->size : 1,
        .memtype = obj->memtype,
        .file_fd = obj->shm_fd,
        .file_off = obj->shm_off,
    };
    int rc = ctx->tp[tp].ops->mem_reg(ctx->tp[tp].iface, &mem,
                                      CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE,
                                      &obj->mr[tp]);
    if (rc != CFX_OK) {
        *status = cfx__err(rc, "node %u: cannot register %" PRIu64 " bytes with %s: %s",
                           ctx->node_id, obj->size, ctx->tp[tp].ops->name, cfx_strerror(rc));
        return NULL;
    }
    return obj->mr[tp];
}

/*
 * dpdk transport: endpoints.  One reliability session each (dpdk_rel.c);
 * posted ops wait in a ring and are fed to the session as messages (the
 * session keeps up to CFX_DPDK_SENDQ queued); completions come from the
 * session's "sent" callback, in order.  Received messages are checked and
 * placed by deliver() (see dpdk.h for the message layout).
 *
 * Sealed (CFX_SECURE, ep_seal): after each side's last clear message (a SEND
 * with CFX_DPDK_OP_F_LAST_CLEAR) every message it queues in the session is
 * an AES-256-GCM record of the clear message (control/seal.h: a counter
 * nonce per direction; the session delivers each message once, in order):
 * the sealed bytes then the tag.  The sender seals into a copy that lives
 * until the session acknowledged it (at most CFX_DPDK_SEAL_INFLIGHT bytes of
 * them per ep), so a write's chunks are no longer taken straight from the
 * source.  The receiver opens each message into a buffer of its own before
 * any of it is looked at: a message that does not open fails the ep with
 * CFX_ERR_AUTH and is counted (n_seal_refused), and nothing of it lands.
 */
#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"
#include "dpdk.h"

static void seal_free(struct cfx__dpdk_ep *ep);

/* Session payloads live until their message is acknowledged (the ack
 * settles the port first: rel_sent), so they go zero-copy. */
static int rel_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    struct cfx__dpdk_ep *ep = ctx;
    return cfx__dpdk_port_tx_zc(ep->iface->port, &ep->peer, h, payload);
}

static void rel_sent(void *ctx, void *cookie)
{
    struct cfx__dpdk_ep *ep = ctx;
    struct cfx__dpdk_seal *s = ep->seal;

    /* a copy sealed for the wire is freed, and the user may reuse a
     * write's source once its completion is out: no frame of the batch
     * may still point at them */
    cfx__dpdk_port_settle(ep->iface->port);
    /* acknowledged in the order queued: a sealed copy is the oldest one */
    uint64_t acked = ep->msgs_acked++; /* every message counts: first_sealed is a count of all */
    if (s && acked >= s->first_sealed && s->q_head != s->q_tail) {
        uint32_t i = s->q_head++ % CFX_DPDK_SENDQ;
        s->q_bytes -= s->q_len[i];
        free(s->q[i]);
    }
    if (!cookie || ep->state == CFX_DPDK_EP_FAILED)
        return;
    struct cfx__dpdk_op *op = cookie;
    /* the session acknowledges in order: it is the oldest op */
    if (unlikely(op != &ep->ops[ep->op_tail % CFX_DPDK_TXQ_DEPTH])) {
        cfx__dpdk_ep_fail(ep, CFX_ERR_INTERNAL, "completion out of order");
        return;
    }
    struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->cq);
    c->type = op->type == CFX_DPDK_OP_SEND ? CFX_TP_COMP_SEND : CFX_TP_COMP_WRITE;
    c->status = CFX_OK;
    c->ep = &ep->super;
    c->wr_id = op->wr_id;
    cfx__dpdk_op_free(op);
    ep->op_tail++;
}

/* A protocol breach by the peer: it learns (RST), the ep fails. */
static void ep_proto(struct cfx__dpdk_ep *ep, int status, const char *why)
{
    cfx__dpdk_ctl_send(ep->iface, &ep->peer, CFX_DPDK_CTL_RST, ep->sess_id, ep->peer_sess,
                       (uint32_t)status);
    cfx__dpdk_ep_fail(ep, status, why);
}

static int deliver_chunk(struct cfx__dpdk_ep *ep, const void *buf, size_t len)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    if (unlikely(len != ep->rx_len)) {
        ep_proto(ep, CFX_ERR_PROTO, "write chunk of another length than its header said");
        return CFX_OK;
    }
    if (ep->rx_last && ep->rx_unreported >= CFX_DPDK_RX_MAX)
        return CFX_ERR_AGAIN;
    /* the registration may have gone or its grant been revoked since the
     * header was checked: then the bytes go nowhere (rel_place dropped
     * those after it) and the write reports nothing; buf NULL: rel_place
     * put them in place already */
    struct cfx__dpdk_mr *mr = cfx__tp_table_get(&iface->mrs, ep->rx_mr_idx, ep->rx_mr_gen);
    if (unlikely(mr && mr->grant.key != ep->rx_key)) {
        atomic_fetch_add_explicit(&iface->n_late_dropped, 1, memory_order_relaxed);
        mr = NULL;
    }
    if (mr && len && buf)
        memcpy((uint8_t *)mr->super.addr + ep->rx_off, buf, len);
    ep->rx_expect = false;
    if (ep->rx_last && mr) {
        struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
        c->type = CFX_TP_COMP_WRITE_IMM;
        c->ep = &ep->super;
        c->imm = ep->rx_imm;
        c->len = ep->rx_total;
        ep->rx_unreported++;
    }
    return CFX_OK;
}

static int deliver_send(struct cfx__dpdk_ep *ep, const uint8_t *data, uint32_t len)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    uint8_t *copy = NULL;

    if (ep->rx_unreported >= CFX_DPDK_RX_MAX)
        return CFX_ERR_AGAIN;
    if (len) { /* an empty message takes no buffer */
        while (ep->rx_slot_tail != ep->rx_slot_ret &&
               ep->rx_slots[ep->rx_slot_tail % CFX_DPDK_RX_SLOTS].returned_gen < iface->poll_gen)
            ep->rx_slot_tail++;
        if (ep->rx_slot_head - ep->rx_slot_tail == CFX_DPDK_RX_SLOTS)
            return CFX_ERR_AGAIN;
        struct cfx__dpdk_rx_slot *slot = &ep->rx_slots[ep->rx_slot_head % CFX_DPDK_RX_SLOTS];
        if (!slot->buf && !(slot->buf = malloc(CFX_TP_SEND_MAX)))
            return CFX_ERR_AGAIN;
        copy = slot->buf;
        memcpy(copy, data, len);
        ep->rx_slot_head++;
    }
    struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
    c->type = CFX_TP_COMP_RECV;
    c->ep = &ep->super;
    c->len = len;
    c->data = copy;
    ep->rx_unreported++;
    return CFX_OK;
}

/* The peer's last clear message was taken: what follows is sealed, and
 * waits for the keys unless ep_seal gave them already. */
static void rx_switch(struct cfx__dpdk_ep *ep)
{
    ep->rx_seal = ep->rx_seal == CFX_DPDK_RX_SEAL_EXPECT ? CFX_DPDK_RX_SEALED
                                                         : CFX_DPDK_RX_SEAL_WAIT;
}

/* A message in clear (as received, or as opened). */
static int deliver_clear(struct cfx__dpdk_ep *ep, const void *buf, size_t len)
{
    struct cfx__dpdk_op_hdr h;
    const char *why;

    if (ep->rx_expect)
        return deliver_chunk(ep, buf, len);
    if (unlikely(!buf)) { /* placed: only a write chunk is */
        cfx__dpdk_ep_fail(ep, CFX_ERR_INTERNAL, "a placed message that is no write chunk");
        return CFX_OK;
    }
    if (unlikely(len < sizeof(h))) {
        ep_proto(ep, CFX_ERR_PROTO, "message shorter than its header");
        return CFX_OK;
    }
    memcpy(&h, buf, sizeof(h));
    uint32_t hlen = le32toh(h.len);
    bool mark = h.type == CFX_DPDK_OP_SEND && (h.flags & CFX_DPDK_OP_F_LAST_CLEAR);
    if (unlikely(mark ? ep->rx_seal == CFX_DPDK_RX_SEALED
                      : ep->rx_seal == CFX_DPDK_RX_SEAL_EXPECT)) {
        /* the mark comes once, on the clear message where both sides
         * agreed to seal; after ep_seal the next clear one must carry it */
        ep_proto(ep, CFX_ERR_PROTO, mark ? "a second last-clear mark"
                                         : "a message in clear after sealing was agreed");
        return CFX_OK;
    }
    switch (h.type) {
    case CFX_DPDK_OP_SEND: {
        if (unlikely(hlen != len - sizeof(h) || hlen > CFX_TP_SEND_MAX ||
                     (h.flags & ~CFX_DPDK_OP_F_LAST_CLEAR))) {
            ep_proto(ep, CFX_ERR_PROTO, "send of a bad length or flags");
            return CFX_OK;
        }
        int rc = deliver_send(ep, (const uint8_t *)buf + sizeof(h), hlen);
        if (rc == CFX_OK && mark)
            rx_switch(ep);
        return rc;
    }
    case CFX_DPDK_OP_WRITE: {
        uint64_t off = le64toh(h.off);
        if (unlikely(len != sizeof(h) || hlen > CFX_DPDK_CHUNK)) {
            ep_proto(ep, CFX_ERR_PROTO, "write header of a bad length");
            return CFX_OK;
        }
        struct cfx__dpdk_mr *mr = cfx__dpdk_mr_lookup(ep->iface, ep, le32toh(h.key_idx),
                                                      le64toh(h.key), off, hlen, &why);
        if (unlikely(!mr) &&
            cfx__tp_revoked_has(&ep->iface->revoked, le64toh(h.key), ep->serial)) {
            /* a write the receiver gave up on while it was on its way
             * (tpbase.h): its chunk goes nowhere and reports nothing (no
             * registration has that index), the endpoint lives on */
            atomic_fetch_add_explicit(&ep->iface->n_late_dropped, 1, memory_order_relaxed);
            ep->rx_expect = true;
            ep->rx_len = hlen;
            ep->rx_sum = (h.flags & CFX_DPDK_OP_F_LAST) ? 0 : ep->rx_sum + hlen;
            ep->rx_mr_idx = UINT32_MAX;
            ep->rx_mr_gen = 0;
            ep->rx_key = 0;
            ep->rx_off = 0;
            ep->rx_last = false;
            return CFX_OK;
        }
        if (unlikely(!mr)) {
            atomic_fetch_add_explicit(&ep->iface->n_grant_refused, 1, memory_order_relaxed);
            char msg[128];
            snprintf(msg, sizeof(msg), "write refused: %s", why);
            ep_proto(ep, CFX_ERR_PROTO, msg);
            return CFX_OK;
        }
        /* the length the last chunk reports is what the chunks carried,
         * not what a peer says (tcp reports its frames, shm what it pulled) */
        ep->rx_sum += hlen;
        if ((h.flags & CFX_DPDK_OP_F_LAST) && ep->rx_sum != le32toh(h.total)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "a write said %" PRIu32 " bytes, its chunks carried %"
                     PRIu64, le32toh(h.total), ep->rx_sum);
            ep_proto(ep, CFX_ERR_PROTO, msg);
            return CFX_OK;
        }
        if (h.flags & CFX_DPDK_OP_F_LAST)
            ep->rx_sum = 0;
        ep->rx_expect = true;
        ep->rx_len = hlen;
        ep->rx_mr_idx = mr->idx;
        ep->rx_mr_gen = mr->gen;
        ep->rx_key = mr->grant.key;
        ep->rx_off = off;
        ep->rx_last = h.flags & CFX_DPDK_OP_F_LAST;
        ep->rx_imm = le32toh(h.imm);
        ep->rx_total = le32toh(h.total);
        return CFX_OK;
    }
    default:
        ep_proto(ep, CFX_ERR_PROTO, "unknown message type");
        return CFX_OK;
    }
}

static int rel_deliver(void *ctx, const void *buf, size_t len)
{
    struct cfx__dpdk_ep *ep = ctx;

    if (ep->state != CFX_DPDK_EP_OPEN)
        return CFX_OK; /* dropped: a refused write's bytes among them */
    if (likely(ep->rx_seal < CFX_DPDK_RX_SEAL_WAIT))
        return deliver_clear(ep, buf, len);
    if (ep->rx_seal == CFX_DPDK_RX_SEAL_WAIT)
        return CFX_ERR_AGAIN; /* the session keeps it until ep_seal */

    struct cfx__dpdk_seal *s = ep->seal;
    const uint8_t *in = buf;
    int rc = len < CFX_SEAL_TAG_LEN ? CFX_ERR_AUTH
             : cfx__seal_open(&s->rx, NULL, 0, in, len - CFX_SEAL_TAG_LEN, s->open_buf,
                              in + len - CFX_SEAL_TAG_LEN);
    if (unlikely(rc != CFX_OK)) {
        atomic_fetch_add_explicit(&ep->iface->n_seal_refused, 1, memory_order_relaxed);
        char msg[128];
        snprintf(msg, sizeof(msg), "sealed message %" PRIu64 " refused: %s", s->rx.seq,
                 rc == CFX_ERR_AUTH ? "it fails its integrity check (altered or sealed with "
                                      "another key)"
                                    : "the cipher failed");
        ep_proto(ep, rc, msg);
        return CFX_OK;
    }
    rc = deliver_clear(ep, s->open_buf, len - CFX_SEAL_TAG_LEN);
    if (rc == CFX_ERR_AGAIN)
        s->rx.seq--; /* offered again later: opened again under the same nonce */
    return rc;
}

/*
 * The write chunk due next goes straight into its granted window: its
 * header was checked (cfx__dpdk_mr_lookup: key, bounds, access) when it
 * came, and the registration and its grant are looked up again for every
 * packet, so bytes never land in a region deregistered meanwhile, nor
 * after the receiver revoked the grant (a transfer it gave up while the
 * chunk was on its way: a later grant of the region is another peer's).
 * Sealed chunks are opened into a buffer first (rel_deliver).
 */
static void *rel_place(void *ctx, uint32_t msg_len, uint32_t off, uint32_t len)
{
    struct cfx__dpdk_ep *ep = ctx;
    (void)len; /* off + len <= msg_len == rx_len: the session checked the fragment */

    if (ep->state != CFX_DPDK_EP_OPEN || ep->rx_seal >= CFX_DPDK_RX_SEAL_WAIT || !ep->rx_expect ||
        msg_len != ep->rx_len || !msg_len)
        return NULL;
    struct cfx__dpdk_mr *mr = cfx__tp_table_get(&ep->iface->mrs, ep->rx_mr_idx, ep->rx_mr_gen);
    if (!mr || mr->grant.key != ep->rx_key)
        return NULL;
    return (uint8_t *)mr->super.addr + ep->rx_off + off;
}

static const struct cfx__dpdk_rel_ops rel_ops = {
    .tx = rel_tx,
    .deliver = rel_deliver,
    .sent = rel_sent,
    .place = rel_place,
};

int cfx__dpdk_ep_new(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *peer,
                     uint32_t peer_node, struct cfx__dpdk_ep **out)
{
    struct cfx__dpdk_ep *ep = calloc(1, sizeof(*ep));
    uint32_t gen;
    int rc;

    if (!ep)
        return cfx__err(CFX_ERR_NOMEM, "dpdk: out of memory for an endpoint");
    cfx_list_init(&ep->link);
    if ((rc = cfx__tp_cq_reserve(&iface->cq, CFX_DPDK_CQ_PER_EP)) != CFX_OK) {
        free(ep);
        return rc;
    }
    if ((rc = cfx__tp_table_add(&iface->eps_tab, ep, &ep->idx, &gen)) != CFX_OK) {
        cfx__tp_cq_unreserve(&iface->cq, CFX_DPDK_CQ_PER_EP);
        free(ep);
        return rc;
    }
    ep->in_tab = true;
    ep->super.iface = &iface->super;
    ep->super.peer_node = peer_node;
    ep->super.status = CFX_OK;
    ep->iface = iface;
    ep->serial = ++iface->ep_serial;
    ep->sess_id = cfx__dpdk_sess_id(ep->idx, gen);
    ep->peer = *peer;
    ep->heard = iface->now;
    snprintf(ep->super.peer_name, sizeof(ep->super.peer_name),
             "node %u (%02x:%02x:%02x:%02x:%02x:%02x %u.%u.%u.%u:%u)", peer_node, peer->mac[0],
             peer->mac[1], peer->mac[2], peer->mac[3], peer->mac[4], peer->mac[5], peer->ip >> 24,
             peer->ip >> 16 & 0xFF, peer->ip >> 8 & 0xFF, peer->ip & 0xFF, peer->port);
    cfx_list_add_tail(&ep->link, &iface->eps);
    *out = ep;
    return CFX_OK;
}

int cfx__dpdk_ep_open(struct cfx__dpdk_ep *ep, uint32_t peer_sess)
{
    struct cfx__dpdk_rel_params p = {
        .mtu_payload = CFX_DPDK_MTU,
        .sendq_max = CFX_DPDK_SENDQ,
        .msg_max = CFX_DPDK_CHUNK + sizeof(struct cfx__dpdk_op_hdr) + CFX_SEAL_TAG_LEN,
        .max_retries = 20, /* with the RTO's backoff: over a second of silence */
        /* the peer's port may be napping after that long without data */
        .idle_restart_ns = ep->iface->quiet_ns,
    };
    int rc = cfx__dpdk_sess_init(&ep->sess, &p, &rel_ops, ep, ep->sess_id, peer_sess,
                                 ep->super.peer_name);
    if (rc != CFX_OK)
        return rc;
    ep->sess_up = true;
    ep->peer_sess = peer_sess;
    ep->state = CFX_DPDK_EP_OPEN;
    ep->heard = ep->iface->now;
    ep->ping_next = ep->iface->now + CFX_DPDK_PING_MS * 1000000ull;
    return CFX_OK;
}

void cfx__dpdk_ep_half_open_end(struct cfx__dpdk_ep *ep)
{
    if (ep->half_open) {
        ep->half_open = false;
        ep->iface->half_open--;
    }
}

void cfx__dpdk_ep_heard(struct cfx__dpdk_ep *ep)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    ep->heard = iface->now;
    if (likely(!ep->half_open))
        return;
    cfx__dpdk_ep_half_open_end(ep);
    if (ep->authorized || ep->state != CFX_DPDK_EP_OPEN)
        return;
    cfx__tp_strangers_admit(&iface->strangers, ep->peer.ip, iface->now);
    cfx__tp_stranger_add(&iface->strangers, &ep->stranger, ep->peer.ip, ep->super.peer_name,
                         iface->now);
}

int cfx__dpdk_ep_authorize(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_authorize: NULL endpoint");
    struct cfx__dpdk_ep *ep = cfx__dpdk_ep_of(tp_ep);
    ep->authorized = true;
    cfx__tp_stranger_del(&ep->iface->strangers, &ep->stranger);
    return CFX_OK;
}

void cfx__dpdk_ep_evict(struct cfx__tp_stranger *st, const char *why)
{
    struct cfx__dpdk_ep *ep = container_of(st, struct cfx__dpdk_ep, stranger);
    cfx__dpdk_ctl_send(ep->iface, &ep->peer, CFX_DPDK_CTL_RST, ep->sess_id, ep->peer_sess,
                       (uint32_t)CFX_ERR_NO_RESOURCE);
    ep->super.why = why;
    cfx__dpdk_ep_fail(ep, CFX_ERR_NO_RESOURCE, why);
}

void cfx__dpdk_ep_destroy(struct cfx__dpdk_ep *ep)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    cfx__dpdk_port_settle(iface->port); /* its messages are freed below */
    cfx__dpdk_ep_half_open_end(ep);
    cfx__tp_stranger_del(&iface->strangers, &ep->stranger);
    cfx_list_del(&ep->link);
    if (ep->in_tab) {
        cfx__tp_table_remove(&iface->eps_tab, ep->idx);
        cfx__tp_cq_unreserve(&iface->cq, CFX_DPDK_CQ_PER_EP);
    }
    if (ep->sess_up) {
        /* what the session's reliability and congestion control did, for
         * the operator: INFO when anything was resent or cut, else DEBUG */
        const struct cfx__dpdk_rel_stats *st = &ep->sess.stats;
        bool eventful = st->tx_retx || st->cwnd_cut_loss || st->cwnd_cut_delay;
        int lvl = eventful ? CFX_LOG_LEVEL_INFO : CFX_LOG_LEVEL_DEBUG;
        if (lvl <= cfx__log_level)
            cfx__log(lvl, "DPDK", __FILE__, __LINE__,
                     "node %u: session with %s closed: %" PRIu64 " data packets sent, %" PRIu64
                     " resent (%" PRIu64 " timeouts, %" PRIu64 " of them undone as spurious, %"
                     PRIu64 " fast, %" PRIu64 " tail probes), %" PRIu64 " received (%" PRIu64
                     " duplicates, %" PRIu64
                     " past the window, %" PRIu64 " taken in order; %" PRIu64
                     " messages placed), window cut %" PRIu64 "x on loss and %" PRIu64
                     "x on delay, restarted %" PRIu64 "x after idle; smoothed RTT %" PRIu64 " us",
                     iface->super.node_id, ep->super.peer_name, st->tx_data, st->tx_retx, st->rto,
                     st->rto_undone, st->fast_retx, st->tlp, st->rx_data, st->rx_dup,
                     st->rx_beyond, st->rx_direct, st->msgs_placed, st->cwnd_cut_loss,
                     st->cwnd_cut_delay, st->cwnd_idle_restarts, ep->sess.srtt_ns / 1000);
        cfx__dpdk_sess_fini(&ep->sess);
    }
    for (uint32_t i = ep->op_tail; i != ep->op_head; i++)
        cfx__dpdk_op_free(&ep->ops[i % CFX_DPDK_TXQ_DEPTH]);
    for (int i = 0; i < CFX_DPDK_RX_SLOTS; i++)
        free(ep->rx_slots[i].buf);
    seal_free(ep);
    free(ep);
}

void cfx__dpdk_ep_fail(struct cfx__dpdk_ep *ep, int status, const char *why)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    if (ep->state == CFX_DPDK_EP_FAILED)
        return;
    /* the peer closing its end is the normal end of a connection; a
     * stranger closed for a newcomer has its (rate-limited) line already */
    int lvl = status == CFX_ERR_CLOSED ? CFX_LOG_LEVEL_INFO
              : ep->stranger.on && status == CFX_ERR_NO_RESOURCE ? CFX_LOG_LEVEL_DEBUG
                                                                  : CFX_LOG_LEVEL_WARN;
    if (lvl <= cfx__log_level)
        cfx__log(lvl, "DPDK", __FILE__, __LINE__, "node %u: connection to %s failed (%s): %s",
                 iface->super.node_id, ep->super.peer_name, cfx_errname(status), why);
    ep->state = CFX_DPDK_EP_FAILED;
    ep->super.status = status;
    cfx__tp_stranger_del(&iface->strangers, &ep->stranger);
    cfx__dpdk_port_settle(iface->port); /* before the ops' memory goes */
    /* every outstanding op completes, in order, with the status */
    for (; ep->op_tail != ep->op_head; ep->op_tail++) {
        struct cfx__dpdk_op *op = &ep->ops[ep->op_tail % CFX_DPDK_TXQ_DEPTH];
        struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
        c->type = op->type == CFX_DPDK_OP_SEND ? CFX_TP_COMP_SEND : CFX_TP_COMP_WRITE;
        c->status = status;
        c->ep = &ep->super;
        c->wr_id = op->wr_id;
        cfx__dpdk_op_free(op);
    }
    ep->op_feed = ep->op_head;
    struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
    c->type = CFX_TP_COMP_EP_ERROR;
    c->status = status;
    c->ep = &ep->super;
}

void cfx__dpdk_ep_rx(struct cfx__dpdk_ep *ep, const struct cfx__dpdk_hdr *h, const void *payload)
{
    cfx__dpdk_ep_heard(ep);
    /* it came after the last poll: the time since is the most it waited
     * here unread (a burst left in the ring by that poll waited longer,
     * and is taken as waiting less: the safe side) */
    const struct cfx__dpdk_iface *iface = ep->iface;
    uint64_t waited = iface->rx_prev ? iface->rx_at - iface->rx_prev : 0;
    int rc = cfx__dpdk_sess_rx(&ep->sess, h, payload, iface->now, waited);
    if (unlikely(rc < 0 && rc != CFX_ERR_INVALID && ep->state == CFX_DPDK_EP_OPEN))
        ep_proto(ep, rc, ep->sess.error_msg);
}

/*
 * Queue one message of @p op in the session: as it is, or sealed into a
 * copy that lives until the session acknowledged it.  The room is checked
 * before sealing, so a sealed copy is always queued: the direction's nonce
 * is never spent on a message that does not go.  CFX_ERR_AGAIN: no room.
 */
static int sess_queue(struct cfx__dpdk_ep *ep, const struct cfx__dpdk_op *op, const void *msg,
                      size_t len, void *cookie, uint64_t now)
{
    struct cfx__dpdk_seal *s = ep->seal;
    int rc;

    if (!op->sealed) {
        rc = cfx__dpdk_sess_send(&ep->sess, msg, len, cookie, now);
        ep->msgs_queued += rc == CFX_OK;
        return rc;
    }
    if (ep->sess.error)
        return ep->sess.error;
    if (!cfx__dpdk_sess_room(&ep->sess) ||
        (s->q_bytes && s->q_bytes + len > CFX_DPDK_SEAL_INFLIGHT))
        return CFX_ERR_AGAIN;
    uint8_t *copy = malloc(len + CFX_SEAL_TAG_LEN);
    if (!copy)
        return CFX_ERR_AGAIN; /* tried again at the next progress */
    struct iovec iov = { (void *)msg, len };
    if ((rc = cfx__seal(&s->tx, NULL, 0, &iov, 1, copy, copy + len)) != CFX_OK) {
        free(copy);
        return rc;
    }
    if (unlikely(s->test_corrupt)) {
        copy[len / 2] ^= 0x01;
        s->test_corrupt = false;
    }
    rc = cfx__dpdk_sess_send(&ep->sess, copy, len + CFX_SEAL_TAG_LEN, cookie, now);
    if (rc != CFX_OK) {
        cfx__dpdk_port_settle(ep->iface->port); /* a failing session may have sent some */
        free(copy); /* its nonce stays spent: the next message takes the next one */
        return rc;
    }
    if (s->first_sealed == UINT64_MAX)
        s->first_sealed = ep->msgs_queued; /* every later message is sealed too */
    s->q_len[s->q_tail % CFX_DPDK_SENDQ] = (uint32_t)(len + CFX_SEAL_TAG_LEN);
    s->q[s->q_tail++ % CFX_DPDK_SENDQ] = copy;
    s->q_bytes += len + CFX_SEAL_TAG_LEN;
    ep->msgs_queued++;
    return CFX_OK;
}

/* Feed posted ops to the session while it takes them. */
static void ep_pump(struct cfx__dpdk_ep *ep)
{
    uint64_t now = ep->iface->now;
    int rc;

    while (ep->op_feed != ep->op_head && ep->state == CFX_DPDK_EP_OPEN) {
        struct cfx__dpdk_op *op = &ep->ops[ep->op_feed % CFX_DPDK_TXQ_DEPTH];
        if (op->type == CFX_DPDK_OP_SEND) {
            rc = sess_queue(ep, op, op->msg, op->msg_len, op, now);
            if (rc == CFX_ERR_AGAIN)
                return;
            if (rc != CFX_OK)
                goto err;
            ep->op_feed++;
            continue;
        }
        for (;;) {
            uint64_t chunk = op->len - op->done;
            if (chunk > CFX_DPDK_CHUNK)
                chunk = CFX_DPDK_CHUNK;
            bool last = op->done + chunk == op->len;
            if (!op->hdr_queued) {
                /* CFX_DPDK_SENDQ + 1 entries used in turn: the one written
                 * now is not still queued in the session (it holds
                 * CFX_DPDK_SENDQ).  hdr_next wraps at the ring's size, not
                 * at 2^32 (which 129 does not divide) */
                struct cfx__dpdk_op_hdr *h = &ep->hdrs[ep->hdr_next];
                memset(h, 0, sizeof(*h));
                h->type = CFX_DPDK_OP_WRITE;
                h->flags = last ? CFX_DPDK_OP_F_LAST : 0;
                h->imm = htole32(op->imm);
                h->key_idx = htole32(op->key_idx);
                h->len = htole32((uint32_t)chunk);
                h->total = htole32((uint32_t)op->len);
                h->key = htole64(op->key);
                h->off = htole64(op->roff + op->done);
                rc = sess_queue(ep, op, h, sizeof(*h), NULL, now);
                if (rc == CFX_ERR_AGAIN)
                    return;
                if (rc != CFX_OK)
                    goto err;
                ep->hdr_next = (ep->hdr_next + 1) % (CFX_DPDK_SENDQ + 1);
                op->hdr_queued = true;
            }
            rc = sess_queue(ep, op, op->src + op->done, chunk, last ? op : NULL, now);
            if (rc == CFX_ERR_AGAIN)
                return;
            if (rc != CFX_OK)
                goto err;
            op->done += chunk;
            op->hdr_queued = false;
            if (last)
                break;
        }
        ep->op_feed++;
    }
    return;
err:
    ep_proto(ep, rc, ep->sess.error_msg[0] ? ep->sess.error_msg : "the session refused a message");
}

bool cfx__dpdk_ep_quiet(const struct cfx__dpdk_ep *ep)
{
    if (ep->state != CFX_DPDK_EP_OPEN) /* a failed one waits for its close: quiet */
        return ep->state != CFX_DPDK_EP_CONNECTING && !ep->tx_unreported && !ep->rx_unreported;
    return ep->op_head == ep->op_tail && !ep->rx_expect && !ep->tx_unreported &&
           !ep->rx_unreported && cfx__dpdk_sess_idle(&ep->sess) &&
           cfx__dpdk_sess_deadline(&ep->sess) == UINT64_MAX;
}

void cfx__dpdk_ep_progress(struct cfx__dpdk_ep *ep)
{
    struct cfx__dpdk_iface *iface = ep->iface;
    uint64_t now = iface->now;

    if (ep->state == CFX_DPDK_EP_CONNECTING) {
        if (now >= ep->connect_deadline) {
            /* a link that never came up is the cause to name (a net_memif
             * client whose socket's server has another client already) */
            char why[192];
            bool down = !cfx__dpdk_port_link_up(iface->port);
            snprintf(why, sizeof(why), "no answer to the connection request%s%s",
                     down ? ": this port's link is down" : "",
                     down && cfx__dpdk_port_is_memif_client(iface->port)
                         ? " (is a net_memif server up on its socket=, and free? a server takes "
                           "one client)"
                         : "");
            cfx__dpdk_ep_fail(ep, CFX_ERR_CONNECT, why);
        } else if (now >= ep->syn_next) {
            cfx__dpdk_ctl_send(iface, &ep->peer, CFX_DPDK_CTL_SYN, ep->sess_id, 0,
                               iface->super.node_id);
            ep->syn_next = now + CFX_DPDK_SYN_MS * 1000000ull;
        }
        return;
    }
    if (ep->state != CFX_DPDK_EP_OPEN)
        return;
    ep_pump(ep);
    int rc = cfx__dpdk_sess_poll(&ep->sess, now);
    if (rc < 0) {
        if (ep->state == CFX_DPDK_EP_OPEN)
            ep_proto(ep, rc == CFX_ERR_TIMEOUT ? CFX_ERR_PEER_FAILED : rc, ep->sess.error_msg);
        return;
    }
    if (ep->state != CFX_DPDK_EP_OPEN)
        return;
    ep_pump(ep);
    uint64_t silent = now - ep->heard;
    if (silent > CFX_DPDK_DEAD_MS * 1000000ull) {
        char msg[64];
        snprintf(msg, sizeof(msg), "nothing heard for %llu ms",
                 (unsigned long long)(silent / 1000000));
        cfx__dpdk_ep_fail(ep, CFX_ERR_PEER_FAILED, msg);
    } else if (silent > CFX_DPDK_PING_MS * 1000000ull && now >= ep->ping_next) {
        cfx__dpdk_ctl_send(iface, &ep->peer, CFX_DPDK_CTL_PING, ep->sess_id, ep->peer_sess, 0);
        ep->ping_next = now + CFX_DPDK_PING_MS * 1000000ull;
    }
}

void cfx__dpdk_ep_returned(struct cfx__dpdk_ep *ep, const struct cfx_tp_completion *c)
{
    switch (c->type) {
    case CFX_TP_COMP_RECV:
        if (c->len)
            ep->rx_slots[ep->rx_slot_ret++ % CFX_DPDK_RX_SLOTS].returned_gen = ep->iface->poll_gen;
        ep->rx_unreported--;
        break;
    case CFX_TP_COMP_WRITE_IMM:
        ep->rx_unreported--;
        break;
    case CFX_TP_COMP_WRITE:
    case CFX_TP_COMP_SEND:
        ep->tx_unreported--;
        break;
    default:
        break;
    }
}

void cfx__dpdk_ep_mr_gone(struct cfx__dpdk_ep *ep, struct cfx__dpdk_mr *mr)
{
    for (uint32_t i = ep->op_tail; i != ep->op_head; i++) {
        const struct cfx__dpdk_op *op = &ep->ops[i % CFX_DPDK_TXQ_DEPTH];
        if (op->type == CFX_DPDK_OP_WRITE && op->mr == mr) {
            ep_proto(ep, CFX_ERR_CANCELED, "a region with writes from it queued was deregistered");
            return;
        }
    }
}

void cfx__dpdk_ep_goodbye(struct cfx__dpdk_ep *ep)
{
    /* a message delivered here is acknowledged before the reset: its
     * sender completes on that ack, and a one-packet message's may still
     * wait for an answer that now never goes (the sender would be told
     * CFX_ERR_CLOSED for a message that arrived) */
    cfx__dpdk_sess_ack_flush(&ep->sess, cfx__now_ns());
    cfx__dpdk_ctl_send(ep->iface, &ep->peer, CFX_DPDK_CTL_RST, ep->sess_id, ep->peer_sess,
                       (uint32_t)CFX_ERR_CLOSED);
}

void cfx__dpdk_ep_close(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep)
        return;
    struct cfx__dpdk_ep *ep = cfx__dpdk_ep_of(tp_ep);
    struct cfx__dpdk_iface *iface = ep->iface;

    if (ep->state == CFX_DPDK_EP_OPEN) {
        cfx__dpdk_ep_goodbye(ep);
        cfx__dpdk_port_flush(iface->port);
    }
    /* its ops are dropped without completions, and the engine hands their
     * sources back at once: no frame may still point at them.  A flush the
     * gate put off left the batch as it was: its frames sent from payloads
     * are dropped (lost, to the other endpoints' sessions), and the reset,
     * a copy, waits for the next flush */
    cfx__dpdk_port_settle(iface->port);
    ep->state = CFX_DPDK_EP_FAILED;
    cfx__dpdk_ep_half_open_end(ep); /* its memory goes at the next poll */
    cfx__tp_stranger_del(&iface->strangers, &ep->stranger);
    cfx__tp_cq_drop_ep(&iface->cq, tp_ep);
    /* its session id answers with a reset from now on */
    cfx__tp_table_remove(&iface->eps_tab, ep->idx);
    cfx__tp_cq_unreserve(&iface->cq, CFX_DPDK_CQ_PER_EP);
    ep->in_tab = false;
    cfx__tp_graveyard_add(&iface->graveyard, &ep->link);
}

int cfx__dpdk_ep_connect(struct cfx_tp_iface *tp_iface, const void *addr, size_t len,
                         uint32_t peer_node, struct cfx_tp_ep **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__dpdk_ifaddr a;
    struct cfx__dpdk_ep *ep;
    int rc;

    if (!tp_iface || !addr || !out || len != sizeof(a))
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_connect: NULL argument or address of %zu bytes",
                        len);
    memcpy(&a, addr, sizeof(a));
    if (le32toh(a.magic) != CFX_DPDK_ADDR_MAGIC)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_connect: not a dpdk address");
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);
    struct cfx__dpdk_addr peer = { .ip = le32toh(a.ip), .port = le16toh(a.port) };
    memcpy(peer.mac, a.mac, 6);
    iface->now = cfx__now_ns();
    if ((rc = cfx__dpdk_ep_new(iface, &peer, peer_node, &ep)) != CFX_OK)
        return rc;
    ep->state = CFX_DPDK_EP_CONNECTING;
    ep->connect_deadline = iface->now + CFX_DPDK_CONNECT_MS * 1000000ull;
    ep->syn_next = iface->now; /* the first SYN leaves at the next poll */
    *out = &ep->super;
    return CFX_OK;
}

/* Room for one more op on ep, or why not. */
static int ep_room(struct cfx__dpdk_ep *ep)
{
    if (ep->super.status != CFX_OK)
        return ep->super.status;
    if (ep->tx_unreported >= CFX_DPDK_TXQ_DEPTH || cfx__tp_cq_backlogged(&ep->iface->cq))
        return CFX_ERR_AGAIN;
    return CFX_OK;
}

int cfx__dpdk_ep_write(struct cfx_tp_ep *tp_ep, struct cfx_tp_mr *tp_mr, uint64_t loff,
                       const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len, uint32_t imm,
                       uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    struct cfx__dpdk_rkey k;
    int rc;

    if (!tp_ep || !tp_mr || !rdesc)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_write: NULL argument");
    struct cfx__dpdk_ep *ep = cfx__dpdk_ep_of(tp_ep);
    if ((rc = ep_room(ep)) != CFX_OK)
        return rc;
    if (len > CFX_TP_WRITE_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "dpdk ep_write: %zu bytes to %s", len,
                        tp_ep->peer_name);
    if (tp_mr->iface != tp_ep->iface || loff > tp_mr->len || len > tp_mr->len - loff)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_write: source outside its registration");
    if (rdesc->len != sizeof(k) || rdesc->data[0] != CFX_DPDK_RDESC_TAG)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_write: not a dpdk remote descriptor");
    if (ep->tx_mark_next)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_write: the last clear message is a send");
    memcpy(&k, rdesc->data, sizeof(k));

    struct cfx__dpdk_op *op = &ep->ops[ep->op_head % CFX_DPDK_TXQ_DEPTH];
    op->msg = NULL;
    op->msg_len = 0;
    op->done = 0;
    op->hdr_queued = false;
    op->type = CFX_DPDK_OP_WRITE;
    op->wr_id = wr_id;
    op->mr = cfx__dpdk_mr_of(tp_mr);
    op->src = (const uint8_t *)tp_mr->addr + loff;
    op->len = len;
    op->key_idx = le32toh(k.idx);
    op->key = le64toh(k.key);
    op->roff = roff;
    op->imm = imm;
    op->sealed = ep->tx_sealing;
    ep->op_head++;
    ep->tx_unreported++;
    ep->iface->now = cfx__now_ns();
    ep_pump(ep);
    return CFX_OK;
}

int cfx__dpdk_ep_send(struct cfx_tp_ep *tp_ep, const void *buf, size_t len, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    struct cfx__dpdk_op_hdr h;
    int rc;

    if (!tp_ep || (!buf && len))
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_send: NULL argument");
    struct cfx__dpdk_ep *ep = cfx__dpdk_ep_of(tp_ep);
    if ((rc = ep_room(ep)) != CFX_OK)
        return rc;
    if (len > CFX_TP_SEND_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "dpdk ep_send: %zu bytes to %s, at most %u", len,
                        tp_ep->peer_name, CFX_TP_SEND_MAX);
    struct cfx__dpdk_op *op = &ep->ops[ep->op_head % CFX_DPDK_TXQ_DEPTH];
    uint8_t *msg = sizeof(h) + len <= sizeof(op->small) ? op->small : malloc(sizeof(h) + len);
    if (!msg)
        return cfx__err(CFX_ERR_NOMEM, "dpdk ep_send: out of memory");
    memset(&h, 0, sizeof(h));
    h.type = CFX_DPDK_OP_SEND;
    h.len = htole32((uint32_t)len);
    op->sealed = ep->tx_sealing;
    if (ep->tx_mark_next) {
        /* the last message in clear: the peer opens every later one */
        h.flags = CFX_DPDK_OP_F_LAST_CLEAR;
        ep->tx_mark_next = false;
        ep->tx_sealing = true;
    }
    memcpy(msg, &h, sizeof(h));
    if (len)
        memcpy(msg + sizeof(h), buf, len);

    op->type = CFX_DPDK_OP_SEND;
    op->wr_id = wr_id;
    op->msg = msg;
    op->msg_len = (uint32_t)(sizeof(h) + len);
    ep->op_head++;
    ep->tx_unreported++;
    ep->iface->now = cfx__now_ns();
    ep_pump(ep);
    return CFX_OK;
}

/* --- sealing (CFX_SECURE) ---------------------------------------------------- */

static void seal_free(struct cfx__dpdk_ep *ep)
{
    struct cfx__dpdk_seal *s = ep->seal;
    if (!s)
        return;
    cfx__seal_dir_fini(&s->tx);
    cfx__seal_dir_fini(&s->rx);
    for (; s->q_head != s->q_tail; s->q_head++)
        free(s->q[s->q_head % CFX_DPDK_SENDQ]);
    free(s->open_buf);
    free(s);
    ep->seal = NULL;
}

int cfx__dpdk_ep_seal(struct cfx_tp_ep *tp_ep, int mode, const struct cfx_seal_keys *keys,
                      bool connector)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep || !keys)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_seal: NULL argument");
    struct cfx__dpdk_ep *ep = cfx__dpdk_ep_of(tp_ep);
    if (ep->super.status != CFX_OK)
        return ep->super.status;
    if (ep->state != CFX_DPDK_EP_OPEN || ep->seal || ep->tx_sealing)
        return cfx__err(CFX_ERR_INVALID, "dpdk ep_seal: %s is not an open endpoint in clear",
                        tp_ep->peer_name);
    struct cfx__dpdk_seal *s = calloc(1, sizeof(*s));
    if (!s || !(s->open_buf = malloc(CFX_DPDK_CHUNK + sizeof(struct cfx__dpdk_op_hdr)))) {
        free(s);
        return cfx__err(CFX_ERR_NOMEM, "dpdk: out of memory for sealing %s", tp_ep->peer_name);
    }
    int me = connector ? CFX_SEAL_DIR_CONNECTOR : CFX_SEAL_DIR_ACCEPTOR;
    int rc = cfx__seal_dir_init(&s->tx, mode, keys, me, true);
    if (rc == CFX_OK && (rc = cfx__seal_dir_init(&s->rx, mode, keys, !me, false)) != CFX_OK)
        cfx__seal_dir_fini(&s->tx);
    if (rc != CFX_OK) {
        free(s->open_buf);
        free(s);
        return rc;
    }
    s->first_sealed = UINT64_MAX;
    ep->seal = s;
    ep->tx_mark_next = true;
    /* the peer's mark came already: the session offers what it held again
     * at the next poll, and it opens now */
    ep->rx_seal = ep->rx_seal == CFX_DPDK_RX_SEAL_WAIT ? CFX_DPDK_RX_SEALED
                                                       : CFX_DPDK_RX_SEAL_EXPECT;
    CFX_LOG(DEBUG, DPDK, "node %u: %s sealed (%s)", ep->iface->super.node_id, tp_ep->peer_name,
            cfx__seal_mode_name(mode));
    return CFX_OK;
}

/*
 * shm endpoint: life cycle, the send queue, and both directions of the data
 * path (producing into the outbound ring, consuming the inbound one).
 *
 * Hot path (ep_send, ep_write, tx/rx progress): no logging except on a
 * protocol failure, no allocation (mapping a peer's source region the first
 * time a one-copy write reads from it is the one exception, cached
 * afterwards).
 *
 * Writes.  The receiver's memory is written only by the receiver, after
 * its grant check: staged writes (WFRAG) are copied out of the ring, and
 * one-copy writes (WPULL, when the source is in the writer's arena file)
 * are copied by the receiver from its read-only mapping of that file
 * (shm_mr.c).  A one-copy write completes only when the receiver answered
 * in the ring's control block (ctl->pulled): until then it may still read
 * the source.  Unanswered WPULLs stay at the head of the send queue
 * (pull_inflight); once the peer has read one source of ours (pull_ok),
 * up to CFX_SHM_PULL_INFLIGHT consecutive ones are in flight, so the
 * receiver copies one write after the other without waiting for us; any
 * other op waits until they are answered (completions stay in order).
 */
#include "shm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dataplane/common/log.h"

/* ---- life cycle ------------------------------------------------------------------- */

struct cfx__shm_ep *cfx__shm_ep_alloc(struct cfx__shm_iface *iface, int sock,
                                      int state, uint32_t peer_node)
{
    struct cfx__shm_ep *ep = calloc(1, sizeof(*ep));
    if (!ep)
        return NULL;
    ep->serial = ++iface->ep_serial;
    ep->txq = calloc(CFX_SHM_TXQ_DEPTH, sizeof(*ep->txq));
    ep->send_pool = malloc((size_t)CFX_SHM_SEND_SLOTS * CFX_TP_SEND_MAX);
    ep->rx_copy = malloc((size_t)CFX_SHM_RX_COPIES * CFX_TP_SEND_MAX);
    if (!ep->txq || !ep->send_pool || !ep->rx_copy) {
        free(ep->txq);
        free(ep->send_pool);
        free(ep->rx_copy);
        free(ep);
        return NULL;
    }
    ep->super.iface = &iface->super;
    ep->super.peer_node = peer_node;
    ep->super.status = CFX_OK;
    ep->iface = iface;
    ep->ev.kind = CFX_SHM_EV_EP;
    ep->state = state;
    ep->sock = sock;
    ep->peer_doorbell = -1;
    ep->send_free = CFX_SHM_SEND_SLOTS == 32 ? UINT32_MAX : (1u << CFX_SHM_SEND_SLOTS) - 1;
    cfx_list_add_tail(&ep->link, &iface->eps);
    iface->handshaking++;
    return ep;
}

void cfx__shm_ep_set_rings(struct cfx__shm_ep *ep, void *seg, size_t seg_len,
                           size_t ring_size, bool connector)
{
    struct cfx__shm_seg_hdr *h = seg;
    uint8_t *data0 = (uint8_t *)seg + CFX_SHM_SEG_HDR;
    uint8_t *data1 = data0 + ring_size;

    ep->seg = seg;
    ep->seg_len = seg_len;
    /* ring 0 carries connector -> acceptor */
    cfx__shm_ring_view(&ep->tx, &h->ctl[connector ? 0 : 1], connector ? data0 : data1,
                       ring_size, 1);
    cfx__shm_ring_view(&ep->rx, &h->ctl[connector ? 1 : 0], connector ? data1 : data0,
                       ring_size, 0);
}

static void op_pop(struct cfx__shm_ep *ep, struct cfx__shm_op *op)
{
    if (op->type == CFX_SHM_OP_SEND && op->send_slot >= 0)
        ep->send_free |= 1u << op->send_slot;
    if (ep->pull_inflight)
        ep->pull_inflight--; /* they sit at the head */
    ep->txq_head = (ep->txq_head + 1) % CFX_SHM_TXQ_DEPTH;
    ep->txq_count--;
}

static void op_complete(struct cfx__shm_ep *ep, struct cfx__shm_op *op, int status)
{
    cfx__shm_cq_push(ep->iface,
                     op->type == CFX_SHM_OP_WRITE ? CFX_TP_COMP_WRITE : CFX_TP_COMP_SEND,
                     status, ep, op->wr_id);
    op_pop(ep, op);
}

void cfx__shm_ep_fail(struct cfx__shm_ep *ep, int status, bool tell_peer)
{
    if (ep->state == CFX_SHM_EP_FAILED)
        return;
    if (cfx__shm_state_handshaking(ep->state))
        ep->iface->handshaking--;
    cfx__shm_ep_sock_close(ep, tell_peer, status);
    ep->state = CFX_SHM_EP_FAILED;
    ep->super.status = status;
    while (ep->txq_count)
        op_complete(ep, &ep->txq[ep->txq_head], status);
    CFX_LOG(DEBUG, SHM, "node %u: endpoint to %s failed: %s", ep->iface->super.node_id,
            ep->super.peer_name, cfx_errname(status));
    cfx__shm_cq_push(ep->iface, CFX_TP_COMP_EP_ERROR, status, ep, 0);
}

void cfx__shm_ep_close(struct cfx_tp_ep *tpe)
{
    CFX_TP_THREAD_CHECK(tpe ? tpe->iface : NULL);
    struct cfx__shm_ep *ep;

    if (!tpe)
        return;
    ep = cfx__shm_ep_of(tpe);
    if (cfx__shm_state_handshaking(ep->state))
        ep->iface->handshaking--;
    cfx__shm_ep_sock_close(ep, true, CFX_ERR_CLOSED);
    ep->state = CFX_SHM_EP_FAILED;
    if (ep->super.status == CFX_OK)
        ep->super.status = CFX_ERR_CLOSED;
    while (ep->txq_count)
        op_pop(ep, &ep->txq[ep->txq_head]);
    cfx__tp_cq_drop_ep(&ep->iface->cq, &ep->super);
    /* RECV data returned by the last poll() stays readable until the next. */
    cfx__tp_graveyard_add(&ep->iface->graveyard, &ep->link);
}

void cfx__shm_ep_free(struct cfx__shm_ep *ep)
{
    while (ep->txq_count)
        op_pop(ep, &ep->txq[ep->txq_head]);
    cfx__shm_map_flush(ep);
    if (ep->seg)
        munmap(ep->seg, ep->seg_len);
    if (ep->peer_doorbell >= 0)
        close(ep->peer_doorbell);
    if (ep->sock >= 0)
        cfx__shm_ep_sock_close(ep, false, 0);
    free(ep->txq);
    free(ep->send_pool);
    free(ep->rx_copy);
    free(ep);
}

/* ---- doorbells ---------------------------------------------------------------------- */

static void ring_doorbell(struct cfx__shm_ep *ep)
{
    static const uint64_t one = 1;
    /* A failure means the peer is gone (its socket tells us) or its counter
     * is already huge (it is awake anyway): nothing to do either way. */
    ssize_t rc = write(ep->peer_doorbell, &one, sizeof(one));
    (void)rc;
}

/* After publishing head: wake the peer if it went to sleep on our ring. */
static inline void wake_consumer(struct cfx__shm_ep *ep)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (unlikely(atomic_load_explicit(&ep->tx.ctl->consumer_sleeping, memory_order_relaxed)) &&
        atomic_exchange_explicit(&ep->tx.ctl->consumer_sleeping, 0, memory_order_relaxed))
        ring_doorbell(ep);
}

/* After releasing tail: wake the peer if it waits for room in our inbound ring. */
static inline void wake_producer(struct cfx__shm_ep *ep)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (unlikely(atomic_load_explicit(&ep->rx.ctl->producer_waiting, memory_order_relaxed)) &&
        atomic_exchange_explicit(&ep->rx.ctl->producer_waiting, 0, memory_order_relaxed))
        ring_doorbell(ep);
}

/* ---- ring positions -------------------------------------------------------------------- */

/* The peer published a ring position that cannot be: fail the endpoint. */
static void ring_corrupt(struct cfx__shm_ep *ep, const char *which)
{
    struct cfx__shm_ring *r = which[0] == 't' ? &ep->tx : &ep->rx;
    ep->iface->n_ring_errors++;
    CFX_LOG(ERR, SHM, "node %u: %s published %s %llu, impossible at our position %llu "
            "(ring of %llu B, last seen %llu): failing the endpoint",
            ep->iface->super.node_id, ep->super.peer_name, which,
            (unsigned long long)atomic_load_explicit(which[0] == 't' ? &r->ctl->tail
                                                                     : &r->ctl->head,
                                                     memory_order_relaxed),
            (unsigned long long)r->pos, (unsigned long long)r->size,
            (unsigned long long)r->cached);
    cfx__shm_ep_fail(ep, CFX_ERR_PROTO, true);
}

/* ---- posting ------------------------------------------------------------------------- */

/* Status a post gets instead of being queued, or CFX_OK. */
static inline int post_check(struct cfx__shm_ep *ep)
{
    if (unlikely(ep->state == CFX_SHM_EP_FAILED))
        return ep->super.status;
    if (unlikely(ep->state == CFX_SHM_EP_PEER_GONE))
        return ep->peer_status;
    if (unlikely(ep->txq_count == CFX_SHM_TXQ_DEPTH ||
                 cfx__tp_cq_count(&ep->iface->cq) >= CFX_SHM_CQ_SOFT_MAX))
        return CFX_ERR_AGAIN;
    return CFX_OK;
}

static void queued_while_armed(struct cfx__shm_ep *ep);

static inline struct cfx__shm_op *op_push(struct cfx__shm_ep *ep)
{
    struct cfx__shm_op *op = &ep->txq[(ep->txq_head + ep->txq_count++) % CFX_SHM_TXQ_DEPTH];
    memset(op, 0, offsetof(struct cfx__shm_op, rd));
    op->send_slot = -1;
    return op;
}

int cfx__shm_ep_send(struct cfx_tp_ep *tpe, const void *buf, size_t len, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tpe ? tpe->iface : NULL);
    struct cfx__shm_ep *ep = cfx__shm_ep_of(tpe);
    struct cfx__shm_op *op;
    uint64_t fit_len;
    int rc, where;

    if (unlikely(len > CFX_TP_SEND_MAX))
        return CFX_ERR_TOO_BIG;
    if (unlikely(!buf && len))
        return CFX_ERR_INVALID;
    if ((rc = post_check(ep)) != CFX_OK)
        return rc;
    if (likely(ep->state == CFX_SHM_EP_READY && ep->txq_count == 0) &&
        (where = cfx__shm_ring_fit(&ep->tx, len, len, &fit_len)) != 0) {
        if (unlikely(where < 0)) {
            ring_corrupt(ep, "tail");
            return CFX_ERR_PROTO;
        }
        struct cfx__shm_msg *m = cfx__shm_ring_begin(&ep->tx, where);
        m->type = CFX_SHM_MSG_SEND;
        m->flags = 0;
        m->len = (uint32_t)len;
        if (len)
            memcpy((uint8_t *)m + CFX_SHM_MSG_HDR, buf, len);
        cfx__shm_ring_commit(&ep->tx, len);
        cfx__shm_ring_publish(&ep->tx);
        wake_consumer(ep);
        cfx__shm_cq_push(ep->iface, CFX_TP_COMP_SEND, CFX_OK, ep, wr_id);
        return CFX_OK;
    }
    /* behind earlier ops or a full ring: keep a copy */
    if (!ep->send_free)
        return CFX_ERR_AGAIN;
    op = op_push(ep);
    op->type = CFX_SHM_OP_SEND;
    op->send_slot = (int16_t)__builtin_ctz(ep->send_free);
    ep->send_free &= ~(1u << op->send_slot);
    op->src = ep->send_pool + (size_t)op->send_slot * CFX_TP_SEND_MAX;
    if (len)
        memcpy((uint8_t *)op->src, buf, len);
    op->len = len;
    op->wr_id = wr_id;
    if (unlikely(ep->iface->armed))
        queued_while_armed(ep);
    return CFX_OK;
}

int cfx__shm_ep_write(struct cfx_tp_ep *tpe, struct cfx_tp_mr *mr, uint64_t loff,
                      const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len,
                      uint32_t imm, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tpe ? tpe->iface : NULL);
    struct cfx__shm_ep *ep = cfx__shm_ep_of(tpe);
    struct cfx__shm_rdesc rd;
    struct cfx__shm_op *op;
    int rc;

    if (unlikely(!mr || !rdesc || rdesc->len != sizeof(rd)))
        return CFX_ERR_INVALID;
    memcpy(&rd, rdesc->data, sizeof(rd));
    if (unlikely(rd.tag != CFX_SHM_RDESC_TAG))
        return CFX_ERR_INVALID;
    if ((rc = post_check(ep)) != CFX_OK)
        return rc;
    if (unlikely(len > CFX_TP_WRITE_MAX))
        return CFX_ERR_TOO_BIG;
    if (unlikely(loff > mr->len || len > mr->len - loff))
        return CFX_ERR_INVALID;
    op = op_push(ep);
    op->type = CFX_SHM_OP_WRITE;
    op->src = (const uint8_t *)mr->addr + loff;
    op->key = rd.key;
    op->roff = roff;
    op->len = len;
    op->imm = imm;
    op->wr_id = wr_id;
    op->rd = rd;
    op->src_fd = -1;
    if (mr->iface == tpe->iface && cfx__shm_mr_of(mr)->shm_fd >= 0) {
        /* the receiver may read it from the file: one copy (shm_mr.c) */
        const struct cfx__shm_mr *smr = cfx__shm_mr_of(mr);
        op->src_fd = smr->shm_fd;
        op->src_ino = smr->ino;
        op->src_foff = smr->shm_off;
        op->src_flen = mr->len;
        op->src_soff = loff;
    }
    if (ep->state == CFX_SHM_EP_READY && ep->txq_count == ep->pull_inflight + 1)
        cfx__shm_ep_tx_progress(ep);
    if (unlikely(ep->iface->armed) && ep->txq_count)
        queued_while_armed(ep);
    return CFX_OK;
}

/* ---- producing ---------------------------------------------------------------------------- */

/* The peer answered something no WPULL of ours could have got. */
static void pulled_corrupt(struct cfx__shm_ep *ep, uint64_t v)
{
    ep->iface->n_ring_errors++;
    CFX_LOG(ERR, SHM, "node %u: %s answered pull %llu with %#llx (last %#llx): failing "
            "the endpoint", ep->iface->super.node_id, ep->super.peer_name,
            (unsigned long long)ep->pull_seq, (unsigned long long)v,
            (unsigned long long)ep->pulled_seen);
    cfx__shm_ep_fail(ep, CFX_ERR_PROTO, true);
}

/* Complete the unanswered WPULLs the peer answered.  An answer "could not
 * read the source" is expected only for the first one (pull_ok not yet
 * set, nothing else in flight): that write is staged, and every later one.
 * Returns false when the endpoint failed. */
static bool pull_reap(struct cfx__shm_ep *ep)
{
    uint64_t v = atomic_load_explicit(&ep->tx.ctl->pulled, memory_order_acquire);
    uint64_t seq = v >> 1;

    if (v == ep->pulled_seen)
        return true;
    /* answered: one seq after the last answer, up to the last one sent */
    if (unlikely(seq - (ep->pulled_seen >> 1) - 1 >= ep->pull_seq - (ep->pulled_seen >> 1))) {
        pulled_corrupt(ep, v);
        return false;
    }
    ep->pulled_seen = v;
    if (unlikely(v & 1)) {
        struct cfx__shm_op *op = &ep->txq[ep->txq_head];
        if (ep->pull_ok || ep->pull_inflight != 1 || op->pull_seq != seq) {
            CFX_LOG(ERR, SHM, "node %u: %s could not read the source of write %llu after "
                    "reading earlier ones: failing the endpoint", ep->iface->super.node_id,
                    ep->super.peer_name, (unsigned long long)seq);
            cfx__shm_ep_fail(ep, CFX_ERR_PROTO, true);
            return false;
        }
        ep->direct_off = true; /* it cannot read our files: stage from now on */
        ep->n_direct--;
        ep->n_staged++;
        op->pull = false;
        op->posted = false;
        ep->pull_inflight = 0;
        return true;
    }
    ep->pull_ok = true;
    while (ep->pull_inflight && ep->txq[ep->txq_head].pull_seq - 1 < seq)
        op_complete(ep, &ep->txq[ep->txq_head], CFX_OK);
    return true;
}

/* One copy: tell the peer where to read the source; pull_reap completes the
 * write when it answers.  Returns false when blocked (ring). */
static bool tx_pull(struct cfx__shm_ep *ep, struct cfx__shm_op *op)
{
    uint64_t fit_len;
    int where;

    if ((where = cfx__shm_ring_fit(&ep->tx, sizeof(struct cfx__shm_pull),
                                   sizeof(struct cfx__shm_pull), &fit_len)) <= 0) {
        if (where < 0)
            ring_corrupt(ep, "tail"); /* op completed with the failure */
        return false;
    }
    struct cfx__shm_msg *m = cfx__shm_ring_begin(&ep->tx, where);
    struct cfx__shm_pull pl = {
        .fd = op->src_fd, .ino = op->src_ino, .foff = op->src_foff, .flen = op->src_flen,
        .soff = op->src_soff, .seq = ++ep->pull_seq,
    };
    memcpy((uint8_t *)m + CFX_SHM_MSG_HDR, &pl, sizeof(pl));
    m->type = CFX_SHM_MSG_WPULL;
    m->flags = 0;
    m->len = sizeof(pl);
    m->key = op->key;
    m->grant = op->rd.grant;
    m->imm = op->imm;
    m->off = op->roff;
    m->start = op->roff;
    m->total = op->len;
    cfx__shm_ring_commit(&ep->tx, sizeof(pl));
    cfx__shm_ring_publish(&ep->tx);
    wake_consumer(ep);
    op->posted = true;
    op->pull_seq = pl.seq;
    ep->pull_inflight++;
    return true;
}

/* May @p op (not yet posted) go behind the unanswered WPULLs? */
static inline bool pull_can_follow(const struct cfx__shm_ep *ep, const struct cfx__shm_op *op)
{
    return ep->pull_ok && ep->pull_inflight < CFX_SHM_PULL_INFLIGHT &&
           op->type == CFX_SHM_OP_WRITE && !op->started && op->len && op->src_fd >= 0 &&
           !ep->direct_off;
}

/* Staged: copy fragments into the ring; the peer copies them out. */
static bool tx_staged(struct cfx__shm_ep *ep, struct cfx__shm_op *op, uint64_t *budget)
{
    size_t frag = ep->iface->frag_size;
    uint64_t p;
    int where;

    do {
        if (!*budget && op->len)
            return false;
        uint64_t want = CFX_MIN(op->len - op->done, (uint64_t)frag);
        if ((where = cfx__shm_ring_fit(&ep->tx, want, CFX_SHM_FRAG_MIN, &p)) <= 0) {
            if (where < 0)
                ring_corrupt(ep, "tail");
            return false;
        }
        struct cfx__shm_msg *m = cfx__shm_ring_begin(&ep->tx, where);
        memcpy((uint8_t *)m + CFX_SHM_MSG_HDR, op->src + op->done, p);
        m->type = CFX_SHM_MSG_WFRAG;
        m->flags = op->done + p == op->len ? CFX_SHM_MSG_LAST : 0;
        m->len = (uint32_t)p;
        m->key = op->key;
        m->grant = op->rd.grant;
        m->imm = op->imm;
        m->off = op->roff + op->done;
        m->start = op->roff;
        m->total = op->len;
        cfx__shm_ring_commit(&ep->tx, p);
        cfx__shm_ring_publish(&ep->tx);
        wake_consumer(ep);
        op->done += p;
        *budget -= CFX_MIN(*budget, p);
    } while (op->done < op->len);
    return true;
}

void cfx__shm_ep_tx_progress(struct cfx__shm_ep *ep)
{
    uint64_t budget = CFX_SHM_TX_BUDGET;
    uint64_t fit_len;
    int where;

    if (ep->pull_inflight && !pull_reap(ep))
        return;
    while (ep->txq_count > ep->pull_inflight) {
        struct cfx__shm_op *op = &ep->txq[(ep->txq_head + ep->pull_inflight) % CFX_SHM_TXQ_DEPTH];
        if (ep->pull_inflight && !pull_can_follow(ep, op))
            return; /* after the answers */
        if (op->type == CFX_SHM_OP_SEND) {
            if ((where = cfx__shm_ring_fit(&ep->tx, op->len, op->len, &fit_len)) <= 0) {
                if (where < 0)
                    ring_corrupt(ep, "tail");
                return;
            }
            struct cfx__shm_msg *m = cfx__shm_ring_begin(&ep->tx, where);
            m->type = CFX_SHM_MSG_SEND;
            m->flags = 0;
            m->len = (uint32_t)op->len;
            memcpy((uint8_t *)m + CFX_SHM_MSG_HDR, op->src, op->len);
            cfx__shm_ring_commit(&ep->tx, op->len);
            cfx__shm_ring_publish(&ep->tx);
            wake_consumer(ep);
        } else {
            if (!op->started) {
                op->started = true;
                op->pull = op->len && op->src_fd >= 0 && !ep->direct_off;
                if (op->pull)
                    ep->n_direct++;
                else
                    ep->n_staged++;
            }
            if (op->pull) {
                if (!tx_pull(ep, op))
                    return;
                if (!ep->pull_ok)
                    return; /* the first answer says whether the peer can read ours */
                continue; /* completed by pull_reap */
            }
            if (!tx_staged(ep, op, &budget))
                return;
        }
        op_complete(ep, op, CFX_OK);
    }
}

/* ---- consuming ----------------------------------------------------------------------------- */

/* A write under a grant revoked lately (tpbase.h): the receiver gave it up
 * while it was on its way.  Dropped, nothing of it copied; the endpoint
 * lives on.  True when @p grant is one. */
static bool rx_late(struct cfx__shm_ep *ep, uint64_t grant, const struct cfx__shm_msg *h)
{
    if (!cfx__tp_revoked_has(&ep->iface->revoked, grant, ep->serial))
        return false;
    atomic_fetch_add_explicit(&ep->iface->n_late_dropped, 1, memory_order_relaxed);
    CFX_LOG(DEBUG, SHM, "node %u: %s wrote [%llu, +%llu) under registration %u's grant "
            "revoked lately: dropped", ep->iface->super.node_id, ep->super.peer_name,
            (unsigned long long)h->start, (unsigned long long)h->total, h->key);
    return true;
}

/* A write outside a live grant: nothing of it was copied here. */
static int rx_refused(struct cfx__shm_ep *ep, const char *why, const struct cfx__shm_msg *h)
{
    atomic_fetch_add_explicit(&ep->iface->n_grant_refused, 1, memory_order_relaxed);
    CFX_LOG(ERR, SHM,
            "node %u: %s wrote [%llu, +%llu) into registration %u: refused, %s; "
            "failing the endpoint",
            ep->iface->super.node_id, ep->super.peer_name, (unsigned long long)h->start,
            (unsigned long long)h->total, h->key, why);
    cfx__shm_ep_fail(ep, CFX_ERR_PROTO, true);
    return CFX_ERR_PROTO;
}

static int rx_proto(struct cfx__shm_ep *ep, const char *what, const struct cfx__shm_msg *h);

/* Answer the peer's WPULL @p seq (@p failed: we could not read its source). */
static void pull_reply(struct cfx__shm_ep *ep, uint64_t seq, bool failed)
{
    atomic_store_explicit(&ep->rx.ctl->pulled, seq << 1 | failed, memory_order_release);
}

/* Copy the peer's WPULL under way, at most *budget bytes: 1 done, 2 ended
 * without landing whole (its grant revoked lately: dropped, to be reported
 * to no one), 0 more to do, -1 the endpoint failed.  The grant is looked up
 * again before every step: one revoked (or a registration gone) mid-copy
 * takes no more bytes. */
static int rx_pull_step(struct cfx__shm_ep *ep, uint64_t *budget)
{
    struct cfx__shm_msg *h = &ep->rx_pull.h;
    const char *why;
    int done = 1;

    if (unlikely(ep->state == CFX_SHM_EP_PEER_GONE)) {
        /* the writer is gone or closed: its source may already be reused */
        cfx__shm_ep_fail(ep, ep->peer_status, false);
        return -1;
    }
    while (ep->rx_pull.done < h->total) {
        if (!*budget)
            return 0;
        struct cfx__shm_mr *mr = cfx__shm_mr_lookup(ep->iface, ep, h->key, h->grant, h->off,
                                                    h->total, &why);
        if (unlikely(!mr)) {
            h->start = h->off;
            if (rx_late(ep, h->grant, h)) {
                done = 2; /* the rest goes nowhere; the pull is answered as done */
                break;
            }
            rx_refused(ep, why, h);
            return -1;
        }
        uint64_t n = CFX_MIN(h->total - ep->rx_pull.done, (uint64_t)CFX_SHM_DIRECT_CHUNK);
        n = CFX_MIN(n, *budget);
        memcpy((uint8_t *)mr->super.addr + h->off + ep->rx_pull.done,
               ep->rx_pull.map->region + ep->rx_pull.soff + ep->rx_pull.done, n);
        ep->rx_pull.done += n;
        *budget -= n;
    }
    cfx__shm_map_put(ep->rx_pull.map);
    ep->rx_pull.map = NULL;
    ep->rx_pull.active = false;
    ep->n_rx_direct += done == 1;
    pull_reply(ep, ep->rx_pull.seq, false);
    return done;
}

/* A WPULL at the read position: check it and the grant, map the source.
 * 1 copying (ep->rx_pull), 0 answered "cannot read" (consume it), -1 the
 * endpoint failed. */
static int rx_pull_start(struct cfx__shm_ep *ep, const struct cfx__shm_msg *h,
                         const uint8_t *payload)
{
    struct cfx__shm_pull pl;
    struct cfx__shm_mr *mr;
    const char *why;

    memcpy(&pl, payload, sizeof(pl)); /* once: the peer may change it under us */
    if (unlikely(pl.seq != ep->rx_pull_seq + 1)) {
        rx_proto(ep, "a pull out of sequence", h);
        return -1;
    }
    ep->rx_pull_seq = pl.seq;
    /* the grant first: a refused write reads nothing and writes nothing */
    mr = cfx__shm_mr_lookup(ep->iface, ep, h->key, h->grant, h->off, h->total, &why);
    if (unlikely(!mr)) {
        struct cfx__shm_msg r = *h;
        r.start = r.off;
        if (rx_late(ep, h->grant, &r)) {
            pull_reply(ep, pl.seq, false); /* "done": its bytes go nowhere */
            return 0;
        }
        rx_refused(ep, why, &r);
        return -1;
    }
    if (unlikely(pl.soff > pl.flen || h->total > pl.flen - pl.soff)) {
        rx_proto(ep, "a pull outside its source", h);
        return -1;
    }
    struct cfx__shm_rdesc src = {
        .direct = 1, .pid = ep->peer_pid, .fd = pl.fd, .ino = pl.ino, .off = pl.foff,
        .len = pl.flen,
    };
    struct cfx__shm_map *map = cfx__shm_map_get(ep, &src);
    if (!map) {
        pull_reply(ep, pl.seq, true); /* the writer stages it */
        return 0;
    }
    ep->rx_pull.active = true;
    ep->rx_pull.h = *h;
    ep->rx_pull.map = map;
    ep->rx_pull.soff = pl.soff;
    ep->rx_pull.done = 0;
    ep->rx_pull.seq = pl.seq;
    return 1;
}

static int rx_proto(struct cfx__shm_ep *ep, const char *what, const struct cfx__shm_msg *h)
{
    ep->iface->n_ring_errors++;
    CFX_LOG(ERR, SHM, "node %u: %s sent %s (type %#x key %#x off %llu len %u total %llu): "
            "failing the endpoint", ep->iface->super.node_id, ep->super.peer_name, what,
            h->type, h->key, (unsigned long long)h->off, h->len,
            (unsigned long long)h->total);
    cfx__shm_ep_fail(ep, CFX_ERR_PROTO, true);
    return CFX_ERR_PROTO;
}

int cfx__shm_ep_rx_progress(struct cfx__shm_ep *ep, struct cfx_tp_completion *comps, int max)
{
    struct cfx__shm_ring *r = &ep->rx;
    struct cfx__shm_msg h;
    bool consumed = false;
    int n = 0, copies = 0;
    uint64_t budget = CFX_SHM_RX_BUDGET;

    while (n < max) {
        uint64_t avail;
        if (ep->rx_pull.active) {
            /* its message stays in the ring until the copy is done */
            int rc = rx_pull_step(ep, &budget);
            if (rc < 0)
                return n;
            if (!rc)
                goto out;
            if (rc == 1) {
                struct cfx_tp_completion *c = &comps[n++];
                memset(c, 0, sizeof(*c));
                c->type = CFX_TP_COMP_WRITE_IMM;
                c->ep = &ep->super;
                c->imm = ep->rx_pull.h.imm;
                c->len = (uint32_t)ep->rx_pull.h.total;
            }
            r->pos += cfx__shm_msg_size(sizeof(struct cfx__shm_pull));
            consumed = true;
            cfx__shm_ring_release(r);
            continue;
        }
        if (unlikely(cfx__shm_ring_avail(r, &avail) < 0)) {
            ring_corrupt(ep, "head");
            return n;
        }
        if (!avail)
            break;
        uint64_t contig = r->size - (r->pos & r->mask);
        const uint8_t *msg = r->data + (r->pos & r->mask);
        const char *why;
        /* the peer could change the header under us: the check copies it */
        if (unlikely(cfx__shm_msg_check(msg, CFX_SHM_MSG_HDR, avail, contig, r->size, &h,
                                        &why) < 0)) {
            rx_proto(ep, why, &h);
            return n;
        }
        if (h.type == CFX_SHM_MSG_WRAP) {
            r->pos += contig;
            consumed = true;
            continue;
        }
        uint64_t sz = cfx__shm_msg_size(h.len);
        const uint8_t *payload = msg + CFX_SHM_MSG_HDR;
        struct cfx__shm_mr *mr;
        struct cfx_tp_completion *c = &comps[n];

        switch (h.type) {
        case CFX_SHM_MSG_SEND: {
            if (copies == CFX_SHM_RX_COPIES)
                goto out; /* the rest at the next poll */
            /* handed out as a private copy: the peer maps the ring
             * read-write and could change a message between the user's
             * validation and its use */
            uint8_t *copy = ep->rx_copy + (size_t)copies++ * CFX_TP_SEND_MAX;
            memcpy(copy, payload, h.len);
            memset(c, 0, sizeof(*c));
            c->type = CFX_TP_COMP_RECV;
            c->ep = &ep->super;
            c->len = h.len;
            c->data = copy; /* reused at the next poll */
            n++;
            break;
        }
        case CFX_SHM_MSG_WFRAG:
            /* the whole write must fit, not just this fragment: a refused
             * write touches nothing */
            mr = cfx__shm_mr_lookup(ep->iface, ep, h.key, h.grant, h.start, h.total, &why);
            if (unlikely(!mr) && rx_late(ep, h.grant, &h))
                break; /* consumed, nothing copied, no completion */
            if (unlikely(!mr)) {
                rx_refused(ep, why, &h);
                return n;
            }
            memcpy((uint8_t *)mr->super.addr + h.off, payload, h.len);
            if (h.flags & CFX_SHM_MSG_LAST) {
                ep->n_rx_staged++;
                memset(c, 0, sizeof(*c));
                c->type = CFX_TP_COMP_WRITE_IMM;
                c->ep = &ep->super;
                c->imm = h.imm;
                c->len = (uint32_t)h.total;
                n++;
            }
            break;
        case CFX_SHM_MSG_WPULL: {
            int rc = rx_pull_start(ep, &h, payload);
            if (rc < 0)
                return n;
            if (rc > 0)
                continue; /* copied from the top of the loop */
            break;
        }
        default:
            rx_proto(ep, "an unknown message", &h);
            return n;
        }
        r->pos += sz;
        consumed = true;
        cfx__shm_ring_release(r); /* room for the producer's next fragment */
    }
out:
    if (consumed)
        wake_producer(ep);
    if (ep->state == CFX_SHM_EP_PEER_GONE && n < max) {
        uint64_t avail;
        if (cfx__shm_ring_avail(r, &avail) < 0)
            ring_corrupt(ep, "head");
        else if (!avail)
            cfx__shm_ep_fail(ep, ep->peer_status, false);
    }
    return n;
}

/* ---- sleeping --------------------------------------------------------------------------------- */

bool cfx__shm_ep_arm(struct cfx__shm_ep *ep)
{
    switch (ep->state) {
    case CFX_SHM_EP_CONNECTING:  /* retried from poll() */
    case CFX_SHM_EP_PEER_GONE:   /* EP_ERROR to report */
        return true;
    case CFX_SHM_EP_READY:
        break;
    default:
        return false;            /* the socket wakes us */
    }
    atomic_store_explicit(&ep->rx.ctl->consumer_sleeping, 1, memory_order_relaxed);
    if (ep->txq_count)
        atomic_store_explicit(&ep->tx.ctl->producer_waiting, 1, memory_order_relaxed);
    return false;
}

/* A bad tail (fit < 0) counts as progress: the poll it causes fails the ep. */
static bool tx_can_progress(struct cfx__shm_ep *ep)
{
    struct cfx__shm_op *op = &ep->txq[(ep->txq_head + ep->pull_inflight) % CFX_SHM_TXQ_DEPTH];
    uint64_t p;

    if (ep->pull_inflight) {
        if (atomic_load_explicit(&ep->tx.ctl->pulled, memory_order_acquire) != ep->pulled_seen)
            return true; /* an answer to reap */
        if (ep->txq_count == ep->pull_inflight || !pull_can_follow(ep, op))
            return false;
    }
    if (op->type == CFX_SHM_OP_SEND)
        return cfx__shm_ring_fit(&ep->tx, op->len, op->len, &p) != 0;
    if (!op->started)
        return true;
    if (op->pull)
        return cfx__shm_ring_fit(&ep->tx, sizeof(struct cfx__shm_pull),
                                 sizeof(struct cfx__shm_pull), &p) != 0;
    return cfx__shm_ring_fit(&ep->tx, CFX_MIN(op->len - op->done, (uint64_t)ep->iface->frag_size),
                             CFX_SHM_FRAG_MIN, &p) != 0;
}

/*
 * An op was queued (a full ring, or ops before it) while this iface is
 * armed: a thread sleeps in epoll on it, and only a doorbell wakes it.
 * cfx__shm_ep_arm asked the consumer for one when it found ops queued;
 * this op came after the arming (posted by a thread that drives without
 * polling, p2p.c), so ask now, then look again (the Dekker pairing of
 * cfx__shm_iface_arm): room made before the flag was seen is used here.
 */
static void queued_while_armed(struct cfx__shm_ep *ep)
{
    if (ep->state != CFX_SHM_EP_READY || !ep->txq_count)
        return;
    atomic_store_explicit(&ep->tx.ctl->producer_waiting, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (tx_can_progress(ep))
        cfx__shm_ep_tx_progress(ep);
}

bool cfx__shm_ep_recheck(struct cfx__shm_ep *ep)
{
    if (ep->state != CFX_SHM_EP_READY)
        return false;
    if (atomic_load_explicit(&ep->rx.ctl->head, memory_order_acquire) != ep->rx.pos)
        return true;
    return ep->txq_count && tx_can_progress(ep);
}

void cfx__shm_ep_disarm(struct cfx__shm_ep *ep)
{
    if (!ep->seg || ep->state == CFX_SHM_EP_FAILED)
        return;
    atomic_store_explicit(&ep->rx.ctl->consumer_sleeping, 0, memory_order_relaxed);
    atomic_store_explicit(&ep->tx.ctl->producer_waiting, 0, memory_order_relaxed);
}

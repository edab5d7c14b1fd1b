/*
 * verbs transport: endpoints (one RC queue pair each).
 *
 * Send side: ep_write posts RDMA_WRITE_WITH_IMM straight from the user's
 * registered memory; ep_send posts SEND_WITH_IMM, inline when the QP takes
 * that many inline bytes, otherwise from the endpoint's registered send
 * ring.  Both need a send-queue slot and a receive credit; without one they
 * return CFX_ERR_AGAIN.  Signaling follows verbs_credit.h: one signaled CQE
 * retires every WR before it, and the WR table turns that into one user
 * completion per write or send, in posted order.
 *
 * Receive side: every receive buffer is CFX_TP_SEND_MAX bytes of one
 * registered block.  A buffer whose RECV or WRITE_IMM completion poll() has
 * returned is re-posted at the next poll() (RECV data lives until then);
 * credit messages are re-posted at the end of the CQ pass that saw them.
 * Re-posted buffers become credits owed to the peer.
 *
 * Remote access: the QP comes up with none, so a peer the engine has not
 * authenticated cannot write a byte here, not even the iface's no-op page
 * whose rkey the hello carries.  ep_authorize (called by the engine's token
 * handshake) grants remote write with ibv_modify_qp(IBV_QP_ACCESS_FLAGS) in
 * RTS and tells the peer with a MSG_AUTHZ message.  Until that message came,
 * every WR is signaled: the no-op, a zero-length RDMA write, would be
 * refused by the peer's QP and kill the connection.
 *
 * Failure: the first error (completion error, QP async event, rdma_cm
 * disconnect, oob socket hang-up) moves the QP to ERR, completes every
 * outstanding write and send with the error, then reports one EP_ERROR.
 * CQEs that arrive for a failed or destroyed endpoint are dropped.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "verbs.h"

#define RECV_BATCH 16

static inline uint8_t *rxbuf(struct cfx__verbs_ep *ep, uint32_t i)
{
    return ep->bufs + CFX_VERBS_SBUF_SIZE + (size_t)i * CFX_VERBS_RX_SIZE;
}

static void push_comp(struct cfx__verbs_ep *ep, uint8_t type, int32_t status)
{
    struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->swq);
    c->type = type;
    c->status = status;
    c->ep = &ep->super;
}

void cfx__verbs_ep_set_peer_name(struct cfx__verbs_ep *ep)
{
    if (ep->super.peer_node != CFX_VERBS_NODE_NONE)
        snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "node %u (%s)",
                 ep->super.peer_node, ep->addr);
    else
        snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "%s", ep->addr);
}

struct cfx__verbs_ep *cfx__verbs_ep_of_qp(struct cfx__verbs_iface *iface, struct ibv_qp *qp)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &iface->eps) {
        struct cfx__verbs_ep *ep = cfx_list_entry(pos, struct cfx__verbs_ep, link);
        if (ep->qp == qp)
            return ep;
    }
    return NULL;
}

/* --- endpoint table ------------------------------------------------------------ */

static int slot_alloc(struct cfx__verbs_iface *iface, struct cfx__verbs_ep *ep)
{
    int rc = cfx__tp_table_add(&iface->ep_tab, ep, &ep->slot, &ep->gen);
    if (rc == CFX_ERR_NO_RESOURCE)
        return cfx__err(rc, "verbs iface %s: %u endpoints is the limit", iface->addr,
                        iface->ep_tab.cap);
    return rc;
}

static void slot_free(struct cfx__verbs_iface *iface, struct cfx__verbs_ep *ep)
{
    cfx__tp_table_remove(&iface->ep_tab, ep->slot);
}

/* --- create / destroy --------------------------------------------------------------- */

int cfx__verbs_ep_create(struct cfx__verbs_iface *iface, uint32_t peer_node, const char *addr,
                         struct cfx__verbs_ep **out)
{
    size_t bufs_len = CFX_VERBS_SBUF_SIZE + (size_t)iface->rq_depth * CFX_VERBS_RX_SIZE;
    struct cfx__verbs_ep *ep;
    int rc;

    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return cfx__err(CFX_ERR_NOMEM, "verbs: out of memory for an endpoint");
    ep->sq_ents = calloc(iface->sq_depth, sizeof(*ep->sq_ents));
    ep->repost_now = calloc(iface->rq_depth, sizeof(uint32_t));
    ep->repost_later = calloc(iface->rq_depth, sizeof(uint32_t));
    if (!ep->sq_ents || !ep->repost_now || !ep->repost_later ||
        posix_memalign((void **)&ep->bufs, 4096, bufs_len)) {
        ep->bufs = NULL;
        rc = cfx__err(CFX_ERR_NOMEM, "verbs: out of memory for an endpoint");
        goto err_free;
    }
    ep->bufs_mr = ibv_reg_mr(iface->pd, ep->bufs, bufs_len, IBV_ACCESS_LOCAL_WRITE);
    if (!ep->bufs_mr) {
        rc = cfx__err(cfx__verbs_status(errno), "verbs: cannot register %zu bytes of endpoint "
                      "buffers on %s: %s%s", bufs_len, iface->dev_name, strerror(errno),
                      errno == EPERM || errno == ENOMEM ? " (check 'ulimit -l')" : "");
        goto err_free;
    }

    ep->super.iface = &iface->super;
    ep->super.peer_node = peer_node;
    ep->super.status = CFX_OK;
    ep->iface = iface;
    ep->oob_fd = -1;
    ep->oob_src.kind = CFX_VERBS_SRC_OOB_EP;
    cfx_list_init(&ep->link);
    cfx_list_init(&ep->touch_link);
    cfx_list_init(&ep->later_link);
    snprintf(ep->addr, sizeof(ep->addr), "%s", addr);
    cfx__verbs_ep_set_peer_name(ep);
    cfx__verbs_sq_init(&ep->sq, iface->sq_depth, iface->sig_interval);
    cfx__verbs_fc_init(&ep->fc, iface->rq_depth, 0); /* credits come with the hello */

    if ((rc = slot_alloc(iface, ep)) != CFX_OK)
        goto err_dereg;
    if ((rc = cfx__tp_cq_reserve(&iface->swq, CFX_VERBS_SWQ_PER_EP(iface))) != CFX_OK)
        goto err_slot;
    if ((rc = cfx__verbs_cq_reserve(iface, CFX_VERBS_CQ_PER_EP(iface))) != CFX_OK)
        goto err_swq;
    cfx_list_add_tail(&ep->link, &iface->eps);
    *out = ep;
    return CFX_OK;

err_swq:
    cfx__tp_cq_unreserve(&iface->swq, CFX_VERBS_SWQ_PER_EP(iface));
err_slot:
    slot_free(iface, ep);
err_dereg:
    ibv_dereg_mr(ep->bufs_mr);
err_free:
    free(ep->bufs);
    free(ep->repost_later);
    free(ep->repost_now);
    free(ep->sq_ents);
    free(ep);
    return rc;
}

/* The caller took @p ep off its list. */
void cfx__verbs_ep_destroy(struct cfx__verbs_ep *ep)
{
    struct cfx__verbs_iface *iface = ep->iface;

    if (ep->qp) {
        int err = ibv_destroy_qp(ep->qp);
        if (err)
            CFX_LOG(WARN, VERBS, "iface %s: ibv_destroy_qp(%#x): %s", iface->addr,
                    ep->qp->qp_num, strerror(err));
        ep->qp = NULL;
    }
    if (ep->cm_id)
        cfx__verbs_cm_destroy(ep);
    cfx__verbs_oob_sock_close(ep);
    ibv_dereg_mr(ep->bufs_mr);
    slot_free(iface, ep);
    cfx__tp_cq_unreserve(&iface->swq, CFX_VERBS_SWQ_PER_EP(iface));
    cfx__verbs_cq_unreserve(iface, CFX_VERBS_CQ_PER_EP(iface));
    free(ep->bufs);
    free(ep->repost_later);
    free(ep->repost_now);
    free(ep->sq_ents);
    free(ep);
}

/* --- queue pair -------------------------------------------------------------------------- */

static int post_recvs(struct cfx__verbs_ep *ep, const uint32_t *idx, uint32_t n)
{
    struct ibv_recv_wr wr[RECV_BATCH], *bad;
    struct ibv_sge sge[RECV_BATCH];

    while (n) {
        uint32_t k = CFX_MIN(n, (uint32_t)RECV_BATCH);
        for (uint32_t i = 0; i < k; i++) {
            sge[i].addr = (uintptr_t)rxbuf(ep, idx[i]);
            sge[i].length = CFX_VERBS_RX_SIZE;
            sge[i].lkey = ep->bufs_mr->lkey;
            wr[i].wr_id = CFX_VERBS_WRID(ep->slot, ep->gen, 1, idx[i]);
            wr[i].sg_list = &sge[i];
            wr[i].num_sge = 1;
            wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
        }
        int err = ibv_post_recv(ep->qp, wr, &bad);
        if (unlikely(err))
            return err;
        ep->rx_posted += k;
        idx += k;
        n -= k;
    }
    return 0;
}

static int qp_modify(struct cfx__verbs_ep *ep, struct ibv_qp_attr *a, int mask, const char *what)
{
    int err = ibv_modify_qp(ep->qp, a, mask);
    if (err)
        return cfx__err(CFX_ERR_CONNECT, "verbs ep to %s: QP %#x to %s: %s", ep->super.peer_name,
                        ep->qp->qp_num, what, strerror(err));
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: QP %#x -> %s", ep->iface->addr,
            ep->super.peer_name, ep->qp->qp_num, what);
    return CFX_OK;
}

static int qp_init(struct cfx__verbs_ep *ep)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = ep->iface->port_num,
        .qp_access_flags = 0, /* no remote writes until ep_authorize */
    };
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

    if (ep->cm_id) {
        /* Port and P_Key index as rdma_cm resolved them. */
        if (rdma_init_qp_attr(ep->cm_id, &a, &mask))
            return cfx__err(CFX_ERR_CONNECT, "verbs ep to %s: rdma_init_qp_attr(INIT): %s",
                            ep->super.peer_name, strerror(errno));
        /* No remote access at all until the engine authenticated the peer
         * (ep_authorize); no remote reads ever: nobody needs them. */
        a.qp_access_flags = 0;
        mask |= IBV_QP_ACCESS_FLAGS;
    }
    return qp_modify(ep, &a, mask, "INIT");
}

enum ibv_mtu cfx__verbs_ep_path_mtu(const struct cfx__verbs_ep *ep)
{
    enum ibv_mtu m = ep->iface->active_mtu;
    if (ep->peer_mtu >= IBV_MTU_256 && ep->peer_mtu < m)
        m = ep->peer_mtu;
    return m;
}

/* rdma_init_qp_attr() failed: EINVAL once the connection left the states
 * that make one, the peer having rejected it meanwhile (verbs_cm.c). */
static int cm_attr_err(struct cfx__verbs_ep *ep, const char *what)
{
    int err = errno;
    return cfx__err(err == EINVAL ? CFX_ERR_PEER_FAILED : CFX_ERR_CONNECT,
                    "verbs ep to %s: rdma_init_qp_attr(%s): %s%s", ep->super.peer_name, what,
                    strerror(err), err == EINVAL ? " (the peer rejected the connection)" : "");
}

int cfx__verbs_ep_qp_cm_rtr_rts(struct cfx__verbs_ep *ep)
{
    struct ibv_qp_attr a;
    int mask = 0, rc;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    if (rdma_init_qp_attr(ep->cm_id, &a, &mask))
        return cm_attr_err(ep, "RTR");
    enum ibv_mtu mtu = cfx__verbs_ep_path_mtu(ep);
    if (!(mask & IBV_QP_PATH_MTU) || a.path_mtu > mtu || a.path_mtu < IBV_MTU_256)
        a.path_mtu = mtu;
    a.min_rnr_timer = CFX_VERBS_MIN_RNR_TIMER;
    mask |= IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER;
    if ((rc = qp_modify(ep, &a, mask, "RTR")) != CFX_OK)
        return rc;
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: RTR with remote QP %#x PSN %#x, path MTU %s%s",
            ep->iface->addr, ep->super.peer_name, a.dest_qp_num, a.rq_psn,
            cfx__verbs_mtu_str(a.path_mtu), a.ah_attr.is_global ? ", GRH" : "");

    memset(&a, 0, sizeof(a));
    mask = 0;
    a.qp_state = IBV_QPS_RTS;
    if (rdma_init_qp_attr(ep->cm_id, &a, &mask))
        return cm_attr_err(ep, "RTS");
    /* Ours, not the CM's packet-lifetime default (seconds for RoCE). */
    a.timeout = CFX_VERBS_ACK_TIMEOUT;
    a.retry_cnt = CFX_VERBS_RETRY_CNT;
    a.rnr_retry = CFX_VERBS_RNR_RETRY;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY;
    return qp_modify(ep, &a, mask, "RTS");
}

int cfx__verbs_ep_qp_create(struct cfx__verbs_ep *ep)
{
    struct cfx__verbs_iface *iface = ep->iface;
    struct ibv_qp_init_attr a;
    int rc, err = 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        memset(&a, 0, sizeof(a));
        a.qp_context = ep;
        a.send_cq = iface->cq;
        a.recv_cq = iface->cq;
        a.cap.max_send_wr = iface->sq_depth;
        a.cap.max_recv_wr = iface->rq_depth;
        a.cap.max_send_sge = 1;
        a.cap.max_recv_sge = 1;
        a.cap.max_inline_data = attempt == 0 ? CFX_VERBS_INLINE_WANT : 0;
        a.qp_type = IBV_QPT_RC;
        a.sq_sig_all = 0;
        if ((ep->qp = ibv_create_qp(iface->pd, &a)))
            break;
        err = errno;
        /* Some devices refuse the inline size: try once without inline. */
    }
    if (!ep->qp)
        return cfx__err(cfx__verbs_status(err), "verbs ep to %s: cannot create a QP on %s "
                        "(SQ %u, RQ %u): %s", ep->super.peer_name, iface->dev_name,
                        iface->sq_depth, iface->rq_depth, strerror(err));

    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    ep->max_inline = a.cap.max_inline_data;
    if (ibv_query_qp(ep->qp, &qa, IBV_QP_CAP, &qi) == 0)
        ep->max_inline = qi.cap.max_inline_data;
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: QP %#x created (RESET), max_inline %u",
            iface->addr, ep->super.peer_name, ep->qp->qp_num, ep->max_inline);

    if ((rc = qp_init(ep)) != CFX_OK)
        return rc;

    /* Every receive is posted before the peer can send. */
    uint32_t idx[CFX_VERBS_RQ_DEPTH];
    for (uint32_t i = 0; i < iface->rq_depth; i++)
        idx[i] = i;
    if ((err = post_recvs(ep, idx, iface->rq_depth)))
        return cfx__err(CFX_ERR_CONNECT, "verbs ep to %s: ibv_post_recv: %s",
                        ep->super.peer_name, strerror(err));
    return CFX_OK;
}

int cfx__verbs_ep_qp_rtr_rts(struct cfx__verbs_ep *ep, const struct cfx__verbs_oob_info *peer,
                             uint32_t my_psn)
{
    struct cfx__verbs_iface *iface = ep->iface;
    enum ibv_mtu mtu = cfx__verbs_ep_path_mtu(ep); /* the smaller active MTU */
    int rc;

    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu,
        .dest_qp_num = le32toh(peer->qpn),
        .rq_psn = le32toh(peer->psn) & 0xffffff,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = CFX_VERBS_MIN_RNR_TIMER,
        .ah_attr = {
            .dlid = le16toh(peer->lid),
            .sl = iface->sl,
            .src_path_bits = 0,
            .port_num = iface->port_num,
        },
    };
    if (iface->link_layer == IBV_LINK_LAYER_ETHERNET) {
        /* RoCE: addressed by GID, always with a GRH. */
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)iface->gid_index;
        a.ah_attr.grh.hop_limit = CFX_VERBS_HOP_LIMIT;
        a.ah_attr.grh.traffic_class = iface->tc;
    }
    rc = qp_modify(ep, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
    if (rc != CFX_OK)
        return rc;
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: RTR with remote QP %#x PSN %#x, path MTU %s",
            iface->addr, ep->super.peer_name, a.dest_qp_num, a.rq_psn, cfx__verbs_mtu_str(mtu));

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = CFX_VERBS_ACK_TIMEOUT;
    a.retry_cnt = CFX_VERBS_RETRY_CNT;
    a.rnr_retry = CFX_VERBS_RNR_RETRY;
    a.sq_psn = my_psn & 0xffffff;
    a.max_rd_atomic = 1;
    return qp_modify(ep, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
}

/* --- hello ------------------------------------------------------------------------------ */

void cfx__verbs_ep_hello_fill(struct cfx__verbs_ep *ep, struct cfx__verbs_hello *h)
{
    struct cfx__verbs_iface *iface = ep->iface;
    memset(h, 0, sizeof(*h));
    h->magic = htole32(CFX_VERBS_MAGIC);
    h->version = htole16(CFX_VERBS_VERSION);
    h->mtu = (uint8_t)iface->active_mtu;
    h->node_id = htole32(iface->super.node_id);
    h->rq_depth = htole32(iface->rq_depth);
    h->nop_addr = htole64((uint64_t)(uintptr_t)iface->nop_buf);
    h->nop_rkey = htole32(iface->nop_mr->rkey);
    h->listen_ip = iface->ip.s_addr;
    h->listen_port = htons(iface->port);
}

int cfx__verbs_ep_hello_take(struct cfx__verbs_ep *ep, const void *data, size_t len)
{
    struct cfx__verbs_hello h;

    if (!data || len < sizeof(h))
        return cfx__err(CFX_ERR_PROTO, "verbs: connection from %s carries %zu bytes of hello, "
                        "%zu expected", ep->addr, len, sizeof(h));
    memcpy(&h, data, sizeof(h));
    if (le32toh(h.magic) != CFX_VERBS_MAGIC)
        return cfx__err(CFX_ERR_PROTO, "verbs: connection from %s is not from conflux "
                        "(magic %08x)", ep->addr, le32toh(h.magic));
    if (le16toh(h.version) != CFX_VERBS_VERSION)
        return cfx__err(CFX_ERR_VERSION, "verbs: %s speaks verbs protocol version %u, we speak %u",
                        ep->addr, le16toh(h.version), CFX_VERBS_VERSION);
    uint32_t rq = le32toh(h.rq_depth);
    if (rq < 4 || rq > CFX_VERBS_CREDITS_MAX)
        return cfx__err(CFX_ERR_PROTO, "verbs: %s announced %u receives", ep->addr, rq);

    uint32_t node = le32toh(h.node_id);
    if (ep->super.peer_node == CFX_VERBS_NODE_NONE)
        ep->super.peer_node = node;
    else if (node != CFX_VERBS_NODE_NONE && node != ep->super.peer_node)
        CFX_LOG(WARN, VERBS, "iface %s: dialled node %u at %s, but node %u answered",
                ep->iface->addr, ep->super.peer_node, ep->addr, node);
    if (!ep->visible && h.listen_ip) {
        char ip[INET_ADDRSTRLEN];
        struct in_addr a = { .s_addr = h.listen_ip };
        inet_ntop(AF_INET, &a, ip, sizeof(ip));
        snprintf(ep->addr, sizeof(ep->addr), "%s:%u", ip, ntohs(h.listen_port));
    }
    ep->peer_rq = rq;
    ep->peer_mtu = h.mtu >= IBV_MTU_256 && h.mtu <= IBV_MTU_4096 ? (enum ibv_mtu)h.mtu
                                                                 : (enum ibv_mtu)0;
    ep->peer_nop_addr = le64toh(h.nop_addr);
    ep->peer_nop_rkey = le32toh(h.nop_rkey);
    cfx__verbs_fc_init(&ep->fc, ep->iface->rq_depth, rq);
    cfx__verbs_ep_set_peer_name(ep);
    return CFX_OK;
}

void cfx__verbs_ep_established(struct cfx__verbs_ep *ep)
{
    struct cfx__verbs_iface *iface = ep->iface;

    if (ep->state != CFX_VERBS_EP_CONNECTING && ep->state != CFX_VERBS_EP_ACCEPTING)
        return;
    bool accepted = ep->state == CFX_VERBS_EP_ACCEPTING;
    ep->state = CFX_VERBS_EP_OPEN;
    ep->visible = true;
    push_comp(ep, accepted ? CFX_TP_COMP_ACCEPT : CFX_TP_COMP_CONNECTED, CFX_OK);

    if (cfx__log_level >= CFX_LOG_LEVEL_DEBUG) {
        struct ibv_qp_attr a;
        struct ibv_qp_init_attr ia;
        if (ibv_query_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, &ia) == 0)
            CFX_LOG(DEBUG, VERBS, "iface %s: %s %s: QP %#x -> %#x state %d, path MTU %s, "
                    "timeout %u, retry %u, rnr_retry %u, credits %u, max_inline %u",
                    iface->addr, accepted ? "accepted" : "connected to", ep->super.peer_name,
                    ep->qp->qp_num, a.dest_qp_num, a.qp_state, cfx__verbs_mtu_str(a.path_mtu),
                    a.timeout, a.retry_cnt, a.rnr_retry, ep->fc.tx_credits, ep->max_inline);
    }
}

/* --- failure and close ---------------------------------------------------------------------- */

static void qp_to_error(struct cfx__verbs_ep *ep)
{
    if (!ep->qp)
        return;
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
    int err = ibv_modify_qp(ep->qp, &a, IBV_QP_STATE);
    if (err)
        CFX_LOG(DEBUG, VERBS, "iface %s: QP %#x -> ERR: %s", ep->iface->addr, ep->qp->qp_num,
                strerror(err));
    else
        CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: QP %#x -> ERR", ep->iface->addr,
                ep->super.peer_name, ep->qp->qp_num);
}

static void drop_pending(struct cfx__verbs_ep *ep)
{
    ep->n_repost_now = 0;
    ep->n_repost_later = 0;
    cfx_list_del(&ep->later_link);
    if (ep->touched) {
        cfx_list_del(&ep->touch_link);
        ep->touched = false;
    }
}

void cfx__verbs_ep_fail(struct cfx__verbs_ep *ep, int status)
{
    struct cfx__verbs_iface *iface = ep->iface;

    if (ep->state >= CFX_VERBS_EP_FAILED)
        return;
    int prev = ep->state;
    ep->state = CFX_VERBS_EP_FAILED;
    cfx__tp_stranger_del(&iface->strangers, &ep->stranger);
    qp_to_error(ep); /* the hardware stops touching the buffers */
    if (ep->cm_id && prev != CFX_VERBS_EP_RESOLVING)
        cfx__verbs_cm_disconnect(ep);
    cfx__verbs_oob_sock_close(ep);
    drop_pending(ep);

    if (!ep->visible) {
        /* Accepted, never shown to the user: it just goes away. */
        CFX_LOG(DEBUG, VERBS, "iface %s: incoming connection from %s dropped (%s): %s",
                iface->addr, ep->addr, cfx_errname(status), cfx_last_error());
        cfx__tp_graveyard_add(&iface->graveyard, &ep->link);
        return;
    }

    ep->super.status = status;
    for (uint32_t s = ep->sq.retired; s != ep->sq.posted; s++) {
        struct cfx__verbs_sq_ent *e = &ep->sq_ents[s & (ep->sq.depth - 1)];
        if (e->comp_type) {
            struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->swq);
            c->type = e->comp_type;
            c->status = status;
            c->ep = &ep->super;
            c->wr_id = e->wr_id;
        }
    }
    ep->sq.retired = ep->sq.posted;
    ep->sbuf_head = ep->sbuf_used = 0;
    push_comp(ep, CFX_TP_COMP_EP_ERROR, status);
}

void cfx__verbs_ep_close(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep)
        return;
    struct cfx__verbs_ep *ep = cfx__verbs_ep_of(tp_ep);
    struct cfx__verbs_iface *iface = ep->iface;

    if (ep->state == CFX_VERBS_EP_CLOSED)
        return;
    if (ep->state < CFX_VERBS_EP_FAILED) {
        if (ep->oob_fd >= 0 && ep->state == CFX_VERBS_EP_OPEN) {
            /* Best effort: the peer reports CLOSED rather than PEER_FAILED. */
            static const uint8_t bye = 'B';
            (void)!send(ep->oob_fd, &bye, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        qp_to_error(ep);
        if (ep->cm_id && ep->state != CFX_VERBS_EP_RESOLVING)
            cfx__verbs_cm_disconnect(ep);
        cfx__verbs_oob_sock_close(ep);
    }
    drop_pending(ep);
    cfx__tp_stranger_del(&iface->strangers, &ep->stranger);
    cfx__tp_cq_drop_ep(&iface->swq, tp_ep);
    ep->state = CFX_VERBS_EP_CLOSED;
    /* Destroyed at the next poll(): data of RECVs it returned stays valid. */
    cfx__tp_graveyard_add(&iface->graveyard, &ep->link);
}

/* --- connect --------------------------------------------------------------------------------- */

int cfx__verbs_ep_connect(struct cfx_tp_iface *tp_iface, const void *addr, size_t len,
                          uint32_t peer_node, struct cfx_tp_ep **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__verbs_iface *iface;
    struct cfx__verbs_ep *ep;
    struct sockaddr_in sa;
    char host[CFX_TP_ADDR_MAX];
    int rc;

    if (!tp_iface || !addr || !out || len == 0)
        return cfx__err(CFX_ERR_INVALID, "verbs ep_connect: NULL argument");
    iface = cfx__verbs_iface_of(tp_iface);
    size_t n = strnlen(addr, len);
    if (n == 0 || n >= sizeof(host))
        return cfx__err(CFX_ERR_INVALID, "verbs ep_connect: malformed address (%zu bytes)", len);
    memcpy(host, addr, n);
    host[n] = '\0';

    bool peer_oob = !strncmp(host, "oob:", 4);
    const char *hp = peer_oob ? host + 4 : host;
    if (peer_oob != (iface->mode == CFX_VERBS_OOB))
        return cfx__err(CFX_ERR_CONNECT, "verbs ep_connect to %s: the peer connects with "
                        "CFX_IB_CONNECT=%s and this node with %s: set the same on every node",
                        hp, peer_oob ? "oob" : "cm", peer_oob ? "cm" : "oob");
    if ((rc = cfx__parse_hostport(hp, &sa)) != CFX_OK)
        return rc;
    if ((rc = cfx__verbs_ep_create(iface, peer_node, hp, &ep)) != CFX_OK)
        return rc;
    ep->visible = true;
    rc = iface->mode == CFX_VERBS_CM ? cfx__verbs_cm_connect(ep, &sa)
                                     : cfx__verbs_oob_connect(ep, &sa);
    if (rc != CFX_OK) {
        cfx_list_del(&ep->link);
        cfx__verbs_ep_destroy(ep);
        return rc;
    }
    CFX_LOG(DEBUG, VERBS, "iface %s: connecting to %s", iface->addr, ep->super.peer_name);
    *out = &ep->super;
    return CFX_OK;
}

/* --- transmit -------------------------------------------------------------------------------- */

static inline uint8_t *sbuf_alloc(struct cfx__verbs_ep *ep, uint32_t len, uint32_t *cost)
{
    uint32_t head = ep->sbuf_head, free_bytes = CFX_VERBS_SBUF_SIZE - ep->sbuf_used;

    if (head + len <= CFX_VERBS_SBUF_SIZE) {
        if (len > free_bytes)
            return NULL;
        *cost = len;
        ep->sbuf_head = head + len;
    } else {
        uint32_t pad = CFX_VERBS_SBUF_SIZE - head;
        if (pad + len > free_bytes)
            return NULL;
        *cost = pad + len;
        head = 0;
        ep->sbuf_head = len;
    }
    ep->sbuf_used += *cost;
    return ep->bufs + head;
}

static inline void sbuf_release(struct cfx__verbs_ep *ep, uint32_t cost)
{
    ep->sbuf_used -= cost;
    if (ep->sbuf_used == 0)
        ep->sbuf_head = 0;
}

/* Post one send WR; returns 0 or the provider's error (state unchanged). */
static inline int post_wr(struct cfx__verbs_ep *ep, struct ibv_send_wr *wr, uint8_t comp_type,
                          uint64_t user_wr_id, uint32_t sbuf_cost, bool force_sig)
{
    struct cfx__verbs_sq saved = ep->sq;
    struct ibv_send_wr *bad;
    uint32_t seq = ep->sq.posted;

    /* Until the peer's QP takes our writes, no no-op can retire unsignaled
     * WRs: signal every one (only the handshake's few messages). */
    if (cfx__verbs_sq_post(&ep->sq, force_sig || !ep->peer_authorized))
        wr->send_flags |= IBV_SEND_SIGNALED;
    wr->wr_id = CFX_VERBS_WRID(ep->slot, ep->gen, 0, seq);
    wr->next = NULL;
    int err = ibv_post_send(ep->qp, wr, &bad);
    if (unlikely(err)) {
        cfx__verbs_sq_unpost(&ep->sq, &saved);
        return err;
    }
    struct cfx__verbs_sq_ent *e = &ep->sq_ents[seq & (ep->sq.depth - 1)];
    e->wr_id = user_wr_id;
    e->sbuf_cost = sbuf_cost;
    e->comp_type = comp_type;
    return 0;
}

/* A post failed for a reason other than a full queue: the endpoint is done. */
static int post_failed(struct cfx__verbs_ep *ep, int err, const char *what)
{
    if (err == ENOMEM)
        return CFX_ERR_AGAIN;
    CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_IO, "%s: ibv_post_send: %s", what, strerror(err));
    return cfx__err(CFX_ERR_IO, "verbs ep to %s: %s: ibv_post_send: %s", ep->super.peer_name,
                    what, strerror(err));
}

/* A control message (CFX_VERBS_MSG_CREDIT, or CFX_VERBS_MSG_AUTHZ: our QP
 * now takes the peer's writes, its no-ops included) carrying the credits
 * we owe.  True when it was posted. */
static bool post_ctl_msg(struct cfx__verbs_ep *ep, uint32_t type, const char *what)
{
    uint32_t credits = cfx__verbs_fc_take(&ep->fc, CFX_VERBS_CREDITS_MAX);
    struct ibv_send_wr wr = {
        .opcode = IBV_WR_SEND_WITH_IMM,
        .num_sge = 0,
        .imm_data = htobe32(CFX_VERBS_IMM(type, credits)),
    };
    int err = post_wr(ep, &wr, 0, 0, 0, false);
    if (unlikely(err)) {
        cfx__verbs_fc_untake(&ep->fc, credits);
        if (err != ENOMEM)
            post_failed(ep, err, what);
        return false;
    }
    cfx__verbs_fc_consume(&ep->fc);
    return true;
}

static void post_credit_msg(struct cfx__verbs_ep *ep)
{
    post_ctl_msg(ep, CFX_VERBS_MSG_CREDIT, "credit message");
}

static void post_authz_msg(struct cfx__verbs_ep *ep)
{
    if (post_ctl_msg(ep, CFX_VERBS_MSG_AUTHZ, "authorization message"))
        ep->authz_pending = false;
}

/* A signaled zero-length RDMA write: retires the unsignaled WRs before it.
 * Only once the peer's QP takes our writes (peer_authorized): before that
 * every WR is signaled, so none is ever left uncovered. */
static void post_nop(struct cfx__verbs_ep *ep)
{
    struct ibv_send_wr wr = {
        .opcode = IBV_WR_RDMA_WRITE,
        .num_sge = 0,
        .wr.rdma = { .remote_addr = ep->peer_nop_addr, .rkey = ep->peer_nop_rkey },
    };
    int err = post_wr(ep, &wr, 0, 0, 0, true);
    if (unlikely(err) && err != ENOMEM)
        post_failed(ep, err, "no-op");
}

static void tx_maintain(struct cfx__verbs_ep *ep)
{
    if (ep->authz_pending && cfx__verbs_fc_can_ctrl(&ep->fc) && cfx__verbs_sq_can_post(&ep->sq))
        post_authz_msg(ep);
    if (cfx__verbs_fc_need_msg(&ep->fc) && cfx__verbs_fc_can_ctrl(&ep->fc) &&
        cfx__verbs_sq_can_post(&ep->sq))
        post_credit_msg(ep);
    if (ep->state == CFX_VERBS_EP_OPEN && ep->peer_authorized &&
        cfx__verbs_sq_need_nop(&ep->sq) && cfx__verbs_sq_outstanding(&ep->sq) < ep->sq.depth)
        post_nop(ep);
}

int cfx__verbs_ep_write(struct cfx_tp_ep *tp_ep, struct cfx_tp_mr *tp_mr, uint64_t loff,
                        const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len,
                        uint32_t imm, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    struct cfx__verbs_rkey k;

    if (unlikely(!tp_ep || !tp_mr || !rdesc))
        return CFX_ERR_INVALID;
    struct cfx__verbs_ep *ep = cfx__verbs_ep_of(tp_ep);
    if (unlikely(ep->super.status != CFX_OK))
        return ep->super.status;
    if (unlikely(tp_mr->iface != tp_ep->iface || loff > tp_mr->len ||
                 len > tp_mr->len - loff || len > CFX_TP_WRITE_MAX ||
                 rdesc->len != sizeof(k) || rdesc->data[0] != CFX_VERBS_RDESC_TAG))
        return CFX_ERR_INVALID;
    if (unlikely(ep->state != CFX_VERBS_EP_OPEN))
        return CFX_ERR_AGAIN;
    if (unlikely(!cfx__verbs_sq_can_post(&ep->sq) || !cfx__verbs_fc_can_data(&ep->fc)))
        return CFX_ERR_AGAIN;
    memcpy(&k, rdesc->data, sizeof(k));
    uint64_t rlen = le64toh(k.len);

    if (unlikely(roff > rlen || len > rlen - roff)) {
        /* The responder's NIC would refuse this with a remote access error
         * (the rkey covers whole pages, so it might not): fail the endpoint
         * the same way, before a byte leaves.  The write completes with the
         * error, in order, then EP_ERROR; the peer sees the disconnect. */
        struct cfx__verbs_sq_ent *e = &ep->sq_ents[ep->sq.posted & (ep->sq.depth - 1)];
        e->wr_id = wr_id;
        e->sbuf_cost = 0;
        e->comp_type = CFX_TP_COMP_WRITE;
        ep->sq.posted++;
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PROTO, "write of [%llu, +%zu) outside the peer's "
                          "region of %llu bytes refused", (unsigned long long)roff, len,
                          (unsigned long long)rlen);
        return CFX_OK;
    }

    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);
    struct ibv_sge sge = {
        .addr = (uintptr_t)tp_mr->addr + loff,
        .length = (uint32_t)len,
        .lkey = mr->region->reg.lkey,
    };
    struct ibv_send_wr wr = {
        .sg_list = &sge,
        .num_sge = len ? 1 : 0,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = len && len <= ep->max_inline ? IBV_SEND_INLINE : 0,
        .imm_data = htobe32(imm),
        .wr.rdma = { .remote_addr = le64toh(k.addr) + roff, .rkey = le32toh(k.rkey) },
    };
    int err = post_wr(ep, &wr, CFX_TP_COMP_WRITE, wr_id, 0, false);
    if (unlikely(err))
        return post_failed(ep, err, "write");
    cfx__verbs_fc_consume(&ep->fc);
    return CFX_OK;
}

int cfx__verbs_ep_bind_mw(struct cfx__verbs_ep *ep, struct ibv_mw *mw, struct ibv_mr *mr,
                          uint64_t addr, uint64_t len, uint32_t rkey, uint32_t *seq)
{
    if (ep->super.status != CFX_OK)
        return cfx__err(ep->super.status, "verbs ep to %s: failed, nothing to grant to",
                        ep->super.peer_name);
    if (ep->state != CFX_VERBS_EP_OPEN || !cfx__verbs_sq_can_post(&ep->sq))
        return cfx__err(CFX_ERR_AGAIN, "verbs ep to %s: send queue full, cannot bind a window",
                        ep->super.peer_name);
    struct ibv_send_wr wr = {
        .opcode = IBV_WR_BIND_MW,
        .bind_mw = {
            .mw = mw,
            .rkey = rkey,
            .bind_info = { .mr = mr, .addr = addr, .length = len,
                           .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
        },
    };
    *seq = ep->sq.posted;
    /* Signaled: a revoke waits for this WR to retire before it frees the
     * window (verbs_mr.c). */
    int err = post_wr(ep, &wr, 0, 0, 0, true);
    if (err == ENOMEM)
        return cfx__err(CFX_ERR_AGAIN, "verbs ep to %s: send queue full, cannot bind a window",
                        ep->super.peer_name);
    if (err) {
        post_failed(ep, err, "memory window bind");
        return cfx__err(CFX_ERR_IO, "verbs ep to %s: bind of a memory window: %s",
                        ep->super.peer_name, strerror(err));
    }
    return CFX_OK;
}

void cfx__verbs_ep_write_refused(struct cfx__verbs_ep *ep, const char *why)
{
    if (ep->state >= CFX_VERBS_EP_FAILED)
        return; /* counted when it first failed */
    atomic_fetch_add_explicit(&ep->iface->n_grant_refused, 1, memory_order_relaxed);
    CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PROTO, "the HCA refused a write of the peer into this "
                      "side (%s): no live grant for its key on this connection, or outside "
                      "the granted bytes", why);
}

uint32_t cfx__verbs_ep_max_inline(struct cfx_tp_ep *tp_ep)
{
    return tp_ep ? cfx__verbs_ep_of(tp_ep)->max_inline : 0;
}

int cfx__verbs_ep_send(struct cfx_tp_ep *tp_ep, const void *buf, size_t len, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    uint32_t cost = 0;

    if (unlikely(!tp_ep || (!buf && len)))
        return CFX_ERR_INVALID;
    struct cfx__verbs_ep *ep = cfx__verbs_ep_of(tp_ep);
    if (unlikely(ep->super.status != CFX_OK))
        return ep->super.status;
    if (unlikely(len > CFX_TP_SEND_MAX))
        return CFX_ERR_TOO_BIG;
    if (unlikely(ep->state != CFX_VERBS_EP_OPEN))
        return CFX_ERR_AGAIN;
    if (unlikely(!cfx__verbs_sq_can_post(&ep->sq) || !cfx__verbs_fc_can_data(&ep->fc)))
        return CFX_ERR_AGAIN;

    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len,
                           .lkey = ep->bufs_mr->lkey };
    struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = len ? 1 : 0,
                              .opcode = IBV_WR_SEND_WITH_IMM };
    uint32_t old_head = ep->sbuf_head, old_used = ep->sbuf_used;
    if (len && len <= ep->max_inline) {
        wr.send_flags = IBV_SEND_INLINE; /* copied into the WQE by ibv_post_send */
    } else if (len) {
        uint8_t *dst = sbuf_alloc(ep, (uint32_t)len, &cost);
        if (unlikely(!dst))
            return CFX_ERR_AGAIN;
        memcpy(dst, buf, len);
        sge.addr = (uintptr_t)dst;
    }
    uint32_t credits = cfx__verbs_fc_take(&ep->fc, CFX_VERBS_CREDITS_MAX);
    wr.imm_data = htobe32(CFX_VERBS_IMM(CFX_VERBS_MSG_DATA, credits));
    int err = post_wr(ep, &wr, CFX_TP_COMP_SEND, wr_id, cost, false);
    if (unlikely(err)) {
        cfx__verbs_fc_untake(&ep->fc, credits);
        ep->sbuf_head = old_head;
        ep->sbuf_used = old_used;
        return post_failed(ep, err, "send");
    }
    cfx__verbs_fc_consume(&ep->fc);
    return CFX_OK;
}

int cfx__verbs_ep_authorize(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (unlikely(!tp_ep))
        return CFX_ERR_INVALID;
    struct cfx__verbs_ep *ep = cfx__verbs_ep_of(tp_ep);
    if (ep->super.status != CFX_OK)
        return ep->super.status;
    if (ep->state != CFX_VERBS_EP_OPEN)
        return cfx__err(CFX_ERR_INVALID, "verbs ep to %s: not connected, nothing to authorize",
                        ep->super.peer_name);
    if (ep->authorized)
        return CFX_OK;
    cfx__tp_stranger_del(&ep->iface->strangers, &ep->stranger);
    /* RTS -> RTS with the access flags alone: an optional attribute of that
     * transition for RC (IBTA 11.2.4.2; ib_modify_qp_is_ok). */
    struct ibv_qp_attr a = { .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
    int err = ibv_modify_qp(ep->qp, &a, IBV_QP_ACCESS_FLAGS);
    if (err) {
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_IO, "QP %#x: remote write not granted: %s",
                          ep->qp->qp_num, strerror(err));
        return cfx__err(CFX_ERR_IO, "verbs ep to %s: QP %#x: ibv_modify_qp(ACCESS_FLAGS): %s",
                        ep->super.peer_name, ep->qp->qp_num, strerror(err));
    }
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: QP %#x takes remote writes", ep->iface->addr,
            ep->super.peer_name, ep->qp->qp_num);
    ep->authorized = true;
    /* Now, or from tx_maintain once a credit and a slot are free: the
     * peer signals every WR meanwhile, so nothing waits on it. */
    ep->authz_pending = true;
    if (cfx__verbs_fc_can_ctrl(&ep->fc) && cfx__verbs_sq_can_post(&ep->sq))
        post_authz_msg(ep);
    return ep->super.status;
}

/* --- completions ------------------------------------------------------------------------------ */

static inline void touch(struct cfx__verbs_ep *ep)
{
    if (!ep->touched) {
        ep->touched = true;
        cfx_list_add_tail(&ep->touch_link, &ep->iface->touched);
    }
}

static void wc_error(struct cfx__verbs_ep *ep, const struct ibv_wc *wc, bool rq)
{
    const char *hint = "";
    int st;

    if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        /* A flush says only that the QP is in the error state, not why.
         * When the HCA moved it there itself (a responder's access error,
         * a local work queue error), the cause is an affiliated async event
         * (IBV_EVENT_QP_ACCESS_ERR, QP_REQ_ERR, QP_FATAL) that the provider
         * may deliver after the flushed CQEs were written: read it first,
         * so that a refused write is counted and reported as one. */
        cfx__verbs_async_progress(ep->iface);
        if (ep->state >= CFX_VERBS_EP_FAILED)
            return;
    }
    if (rq && (wc->status == IBV_WC_REM_ACCESS_ERR || wc->status == IBV_WC_LOC_ACCESS_ERR ||
               wc->status == IBV_WC_LOC_PROT_ERR)) {
        /* A receive completes with an access error when the peer's
         * RDMA_WRITE_WITH_IMM named memory we did not grant it. */
        cfx__verbs_ep_write_refused(ep, ibv_wc_status_str(wc->status));
        return;
    }
    switch (wc->status) {
    case IBV_WC_MW_BIND_ERR:
        st = CFX_ERR_IO;
        hint = "; a memory window bind (write grant) was refused by the device";
        break;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        st = CFX_ERR_PEER_FAILED;
        hint = "; the peer stopped answering (host down, link down or process gone)";
        break;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
        st = CFX_ERR_PROTO;
        hint = "; the peer refused the access (stale or foreign key, or out of bounds)";
        break;
    case IBV_WC_LOC_LEN_ERR:
        st = CFX_ERR_PROTO;
        hint = "; a message was longer than the receive buffer";
        break;
    case IBV_WC_WR_FLUSH_ERR:
        st = CFX_ERR_PEER_FAILED;
        hint = "; the queue pair went into the error state";
        break;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_LOC_QP_OP_ERR:
        st = CFX_ERR_IO;
        hint = "; a local buffer is not registered as posted";
        break;
    default:
        st = CFX_ERR_PEER_FAILED;
        break;
    }
    CFX_VERBS_EP_FAIL(ep, WARN, st, "%s completion error: %s (wc status %d, vendor error %#x, "
                      "QP %#x)%s", rq ? "receive" : "send", ibv_wc_status_str(wc->status),
                      (int)wc->status, wc->vendor_err, wc->qp_num, hint);
}

static void sq_complete(struct cfx__verbs_ep *ep, uint32_t seq)
{
    uint32_t old = ep->sq.retired;
    uint32_t n = cfx__verbs_sq_retire(&ep->sq, seq);

    for (uint32_t i = 0; i < n; i++) {
        struct cfx__verbs_sq_ent *e = &ep->sq_ents[(old + i) & (ep->sq.depth - 1)];
        if (e->sbuf_cost)
            sbuf_release(ep, e->sbuf_cost);
        if (e->comp_type) {
            struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->swq);
            c->type = e->comp_type;
            c->ep = &ep->super;
            c->wr_id = e->wr_id;
        }
    }
}

void cfx__verbs_ep_process_wc(struct cfx__verbs_iface *iface, const struct ibv_wc *wc)
{
    struct cfx__verbs_ep *ep = cfx__tp_table_get(&iface->ep_tab, CFX_VERBS_WRID_SLOT(wc->wr_id),
                                                 CFX_VERBS_WRID_GEN(wc->wr_id));
    if (unlikely(!ep || ep->state >= CFX_VERBS_EP_FAILED))
        return; /* for an endpoint that failed or is gone */
    bool rq = CFX_VERBS_WRID_RQ(wc->wr_id);
    if (unlikely(wc->status != IBV_WC_SUCCESS)) {
        wc_error(ep, wc, rq);
        return;
    }
    touch(ep);
    if (!rq) {
        sq_complete(ep, CFX_VERBS_WRID_SEQ(wc->wr_id));
        return;
    }

    uint32_t idx = CFX_VERBS_WRID_SEQ(wc->wr_id);
    if (unlikely(idx >= iface->rq_depth))
        return;
    ep->rx_posted--;
    if (unlikely(ep->state == CFX_VERBS_EP_ACCEPTING)) {
        /* The peer's first message overtook the connection event (rdma_cm
         * ESTABLISHED or the oob READY byte): the connection is up. */
        if (ep->cm_id)
            rdma_notify(ep->cm_id, IBV_EVENT_COMM_EST);
        cfx__verbs_ep_established(ep);
    }

    struct cfx_tp_completion *c;
    if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        c = cfx__tp_cq_push(&iface->swq);
        c->type = CFX_TP_COMP_WRITE_IMM;
        c->ep = &ep->super;
        c->imm = be32toh(wc->imm_data);
        c->len = wc->byte_len;
        c->wr_id = idx; /* buffer to re-post once returned; cleared by poll() */
        return;
    }
    if (unlikely(wc->opcode != IBV_WC_RECV || !(wc->wc_flags & IBV_WC_WITH_IMM))) {
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PROTO, "unexpected receive completion (opcode %d, "
                          "flags %#x)", (int)wc->opcode, (unsigned)wc->wc_flags);
        return;
    }
    uint32_t imm = be32toh(wc->imm_data);
    uint32_t credits = CFX_VERBS_IMM_CREDITS(imm);
    if (credits && unlikely(!cfx__verbs_fc_grant(&ep->fc, credits, ep->peer_rq))) {
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PROTO, "peer returned %u credits, holding %u of %u",
                          credits, ep->fc.tx_credits, ep->peer_rq);
        return;
    }
    switch (CFX_VERBS_IMM_TYPE(imm)) {
    case CFX_VERBS_MSG_DATA:
        c = cfx__tp_cq_push(&iface->swq);
        c->type = CFX_TP_COMP_RECV;
        c->ep = &ep->super;
        c->len = wc->byte_len;
        c->data = rxbuf(ep, idx);
        c->wr_id = idx;
        break;
    case CFX_VERBS_MSG_AUTHZ:
        ep->peer_authorized = true;
        ep->repost_now[ep->n_repost_now++] = idx;
        break;
    case CFX_VERBS_MSG_CREDIT:
        ep->repost_now[ep->n_repost_now++] = idx;
        break;
    default:
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PROTO, "message of unknown type %u",
                          CFX_VERBS_IMM_TYPE(imm));
        break;
    }
}

static void repost(struct cfx__verbs_ep *ep, uint32_t *idx, uint32_t *n)
{
    if (!*n)
        return;
    int err = post_recvs(ep, idx, *n);
    if (unlikely(err)) {
        *n = 0;
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_IO, "ibv_post_recv: %s", strerror(err));
        return;
    }
    cfx__verbs_fc_reposted(&ep->fc, *n);
    *n = 0;
}

void cfx__verbs_ep_after_pass(struct cfx__verbs_ep *ep)
{
    if (ep->state != CFX_VERBS_EP_OPEN && ep->state != CFX_VERBS_EP_ACCEPTING)
        return;
    repost(ep, ep->repost_now, &ep->n_repost_now);
    if (ep->state == CFX_VERBS_EP_OPEN)
        tx_maintain(ep);
}

void cfx__verbs_ep_repost_later(struct cfx__verbs_ep *ep)
{
    if (ep->state != CFX_VERBS_EP_OPEN) {
        ep->n_repost_later = 0;
        return;
    }
    repost(ep, ep->repost_later, &ep->n_repost_later);
    if (ep->state == CFX_VERBS_EP_OPEN)
        tx_maintain(ep);
}

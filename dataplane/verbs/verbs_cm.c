/*
 * verbs transport: connection establishment through rdma_cm.
 *
 * The iface listens on its IP with an ephemeral port; its address is
 * "IP:PORT".  The QP lives on the iface's own device context and is moved
 * through its states here, with the attributes rdma_init_qp_attr() reports
 * (ACK timeout, retries and path MTU set by us), as UCX does:
 *
 *   active:  resolve address (from the iface's IP, so the route uses our
 *            device) -> resolve route -> QP to INIT, post receives ->
 *            rdma_connect(qp_num, hello) -> CONNECT_RESPONSE with the peer's
 *            hello -> RTR, RTS -> rdma_establish (RTU): CONNECTED.
 *   passive: CONNECT_REQUEST with the hello -> QP to INIT, post receives,
 *            RTR, RTS -> rdma_accept(qp_num, hello) -> ESTABLISHED (or the
 *            first message, which proves the same): ACCEPT.
 *
 * DISCONNECTED, or an error event, fails the endpoint.  A side that refuses
 * the other's hello (another version, not understood) says why in its
 * reject's private data (struct cfx__verbs_rej): the connector then fails
 * with CFX_ERR_VERSION (or AUTH, PROTO) rather than CFX_ERR_CONNECT, and the
 * engine does not try another transport for a refusal it would meet there.
 *
 * Anyone who reaches the port may ask, and each accepted request holds an
 * endpoint (QP, registered buffers, CQ room) until the engine's handshake
 * authorizes it or its deadline passes: those not yet authorized are capped
 * as tcp's connections are (tp_strangers.h).  A connection the acceptor
 * closes at its cap before the engine's handshake ended must reach the
 * connector as tcp's does, CFX_ERR_PEER_FAILED, which the engine dials again
 * (conn.c, conn_redial), not CFX_ERR_CONNECT, which moves on to the next
 * transport: a peer that answered with a REP is there.  So a connection that
 * fails after the REP came is CFX_ERR_PEER_FAILED however it ends: a REJ,
 * DISCONNECTED or an error event once open, and the REP's QP attributes or
 * the RTU refused because a REJ came first (the acceptor closed it between
 * REP and RTU: destroying the id sent a plain REJ).  The acceptor does not
 * rdma_reject() with a reason after its REP: the kernel (6.1) keeps the REP's
 * MAD outstanding then, and rdma_destroy_id() waits for its retries
 * (cm_destroy_id_wait_timeout, the progress thread stuck for a minute).
 *
 * The event channel fd is non-blocking and sits in the iface's epoll set.
 * Every event is copied and acknowledged before it is acted on, so that
 * destroying an id from a handler never waits for an unacknowledged event.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

#include "verbs.h"

#define LISTEN_BACKLOG 128

/* The reason of a connection that failed after the peer's REP (above). */
static const char closed_after_rep[] = "it closed the connection after its REP, before our RTU "
                                       "reached it";

struct cm_event {
    enum rdma_cm_event_type type;
    int status;
    struct rdma_cm_id *id;
    struct rdma_cm_id *listen_id;
    uint8_t priv[64];      /* private data (hello), copied before the ack */
    size_t priv_len;
};

static void conn_param_init(struct cfx__verbs_ep *ep, struct rdma_conn_param *cp,
                            struct cfx__verbs_hello *h)
{
    cfx__verbs_ep_hello_fill(ep, h);
    memset(cp, 0, sizeof(*cp));
    cp->private_data = h;
    cp->private_data_len = (uint8_t)sizeof(*h);
    cp->responder_resources = 1;
    cp->initiator_depth = 1;
    cp->retry_count = CFX_VERBS_RETRY_CNT;
    cp->rnr_retry_count = CFX_VERBS_RNR_RETRY;
    cp->qp_num = ep->qp->qp_num; /* our QP: rdma_cm does not own it */
}

size_t cfx__verbs_rej_fill(struct cfx__verbs_rej *r, int status)
{
    uint16_t reason;

    switch (status) {
    case CFX_ERR_VERSION: reason = CFX_VERBS_REJ_R_VERSION; break;
    case CFX_ERR_AUTH: reason = CFX_VERBS_REJ_R_AUTH; break;
    case CFX_ERR_PROTO: reason = CFX_VERBS_REJ_R_HELLO; break;
    default: return 0; /* our own trouble (resources): a plain reject */
    }
    r->magic = htole32(CFX_VERBS_REJ_MAGIC);
    r->version = htole16(CFX_VERBS_REJ_VERSION);
    r->reason = htole16(reason);
    return sizeof(*r);
}

int cfx__verbs_rej_decode(int cm_status, const void *data, size_t len, const char **why)
{
    struct cfx__verbs_rej r;

    *why = NULL;
    if (cm_status != CFX_VERBS_REJ_CONSUMER || !data || len < sizeof(r))
        return CFX_ERR_CONNECT;
    memcpy(&r, data, sizeof(r));
    if (le32toh(r.magic) != CFX_VERBS_REJ_MAGIC || le16toh(r.version) < 1)
        return CFX_ERR_CONNECT;
    switch (le16toh(r.reason)) {
    case CFX_VERBS_REJ_R_VERSION:
        *why = "it rejected our hello: it speaks another verbs protocol version";
        return CFX_ERR_VERSION;
    case CFX_VERBS_REJ_R_AUTH:
        *why = "it rejected our credentials";
        return CFX_ERR_AUTH;
    case CFX_VERBS_REJ_R_HELLO:
        *why = "it rejected our hello as malformed";
        return CFX_ERR_PROTO;
    default:
        return CFX_ERR_CONNECT;
    }
}

/* Reject a connection request (or reply) that @p status refused, saying why
 * where the reason is one the peer would meet over any transport. */
static void reject(struct rdma_cm_id *id, int status)
{
    struct cfx__verbs_rej r;
    size_t n = cfx__verbs_rej_fill(&r, status);
    rdma_reject(id, n ? &r : NULL, (uint8_t)n);
}

int cfx__verbs_cm_listen(struct cfx__verbs_iface *iface)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = iface->ip };
    int rc, fl;

    iface->cm_ch = rdma_create_event_channel();
    if (!iface->cm_ch)
        return cfx__err(cfx__verbs_status(errno), "verbs: rdma_create_event_channel: %s "
                        "(is the rdma_ucm module loaded?)", strerror(errno));
    fl = fcntl(iface->cm_ch->fd, F_GETFL);
    if (fl < 0 || fcntl(iface->cm_ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return cfx__err(cfx__status_from_errno(errno), "verbs: rdma_cm channel: fcntl: %s",
                        strerror(errno));
    if (rdma_create_id(iface->cm_ch, &iface->listen_id, NULL, RDMA_PS_TCP))
        return cfx__err(cfx__verbs_status(errno), "verbs: rdma_create_id: %s", strerror(errno));
    if (rdma_bind_addr(iface->listen_id, (struct sockaddr *)&sa))
        return cfx__err(errno == EADDRNOTAVAIL || errno == ENODEV ? CFX_ERR_NO_DEVICE
                                                                  : cfx__verbs_status(errno),
                        "verbs: rdma_bind_addr(%s): %s", iface->ip_str, strerror(errno));
    if (!iface->listen_id->verbs)
        return cfx__err(CFX_ERR_NO_DEVICE, "verbs: %s is not the address of an RDMA device's "
                        "network interface (set CFX_BIND_ADDR to one; see 'rdmactl devices')",
                        iface->ip_str);
    if (rdma_listen(iface->listen_id, LISTEN_BACKLOG))
        return cfx__err(cfx__verbs_status(errno), "verbs: rdma_listen on %s: %s", iface->ip_str,
                        strerror(errno));
    iface->port = ntohs(rdma_get_src_port(iface->listen_id));
    snprintf(iface->addr, sizeof(iface->addr), "%s:%u", iface->ip_str, iface->port);

    /* The device is the one rdma_cm bound the IP to.  Our own context on
     * it holds the PD, CQ and QPs (librdmacm's is only compared by name). */
    const char *name = ibv_get_device_name(iface->listen_id->verbs->device);
    uint8_t port = iface->listen_id->port_num ? iface->listen_id->port_num : 1;
    if (strcmp(name, iface->dev_name) || port != iface->port_num) {
        CFX_LOG(INFO, VERBS, "iface %s: rdma_cm bound %s to device %s port %u", iface->addr,
                iface->ip_str, name, port);
        if ((rc = cfx__verbs_iface_use_device(iface, name, port)) != CFX_OK)
            return rc;
    }
    if ((rc = cfx__verbs_epoll_add(iface, iface->cm_ch->fd, EPOLLIN, &iface->cm_src)) != CFX_OK)
        return rc;
    CFX_LOG(DEBUG, VERBS, "iface %s: rdma_cm listening (device %s port %u)", iface->addr,
            iface->dev_name, iface->port_num);
    return CFX_OK;
}

void cfx__verbs_cm_close(struct cfx__verbs_iface *iface)
{
    if (iface->listen_id) {
        rdma_destroy_id(iface->listen_id);
        iface->listen_id = NULL;
    }
    if (iface->cm_ch) {
        rdma_destroy_event_channel(iface->cm_ch);
        iface->cm_ch = NULL;
    }
}

int cfx__verbs_cm_connect(struct cfx__verbs_ep *ep, const struct sockaddr_in *dst)
{
    struct cfx__verbs_iface *iface = ep->iface;
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr = iface->ip };

    if (rdma_create_id(iface->cm_ch, &ep->cm_id, ep, RDMA_PS_TCP))
        return cfx__err(cfx__verbs_status(errno), "verbs ep_connect to %s: rdma_create_id: %s",
                        ep->addr, strerror(errno));
    ep->state = CFX_VERBS_EP_RESOLVING;
    if (rdma_resolve_addr(ep->cm_id, (struct sockaddr *)&src, (struct sockaddr *)dst,
                          CFX_VERBS_RESOLVE_MS)) {
        int err = errno;
        rdma_destroy_id(ep->cm_id);
        ep->cm_id = NULL;
        return cfx__err(CFX_ERR_CONNECT, "verbs ep_connect to %s: rdma_resolve_addr: %s",
                        ep->addr, strerror(err));
    }
    return CFX_OK;
}

void cfx__verbs_cm_disconnect(struct cfx__verbs_ep *ep)
{
    /* Sends a DREQ; the QP is ours and moved to ERR by the caller.  Fails
     * harmlessly when already disconnected. */
    if (rdma_disconnect(ep->cm_id) == 0)
        CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: rdma_disconnect", ep->iface->addr,
                ep->super.peer_name);
}

void cfx__verbs_cm_destroy(struct cfx__verbs_ep *ep)
{
    /* The QP is ours (destroyed by the caller first). */
    rdma_destroy_id(ep->cm_id);
    ep->cm_id = NULL;
}

/* A peer asks to connect. */
static void on_connect_request(struct cfx__verbs_iface *iface, const struct cm_event *ev)
{
    struct rdma_cm_id *id = ev->id;
    struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(id);
    struct cfx__verbs_ep *ep;
    struct rdma_conn_param cp;
    struct cfx__verbs_hello h;
    char addr[32], ip[INET_ADDRSTRLEN] = "?";
    uint64_t now = cfx__now_ns();
    uint32_t ip4 = 0; /* 0: not IPv4, no per-address cap */
    int rc;

    if (peer && peer->sin_family == AF_INET) {
        inet_ntop(AF_INET, &peer->sin_addr, ip, sizeof(ip));
        ip4 = peer->sin_addr.s_addr;
    }
    snprintf(addr, sizeof(addr), "%s:%u", ip, peer ? ntohs(peer->sin_port) : 0);

    if (!id->verbs || strcmp(ibv_get_device_name(id->verbs->device), iface->dev_name)) {
        CFX_RATELOG(&iface->accept_log, VERBS, now, "iface %s: connection from %s arrived on "
                    "another device; rejected", iface->addr, addr);
        rdma_reject(id, NULL, 0);
        rdma_destroy_id(id);
        return;
    }
    cfx__tp_strangers_admit(&iface->strangers, ip4, now);
    if ((rc = cfx__verbs_ep_create(iface, CFX_VERBS_NODE_NONE, addr, &ep)) != CFX_OK) {
        CFX_RATELOG(&iface->accept_log, VERBS, now, "iface %s: connection from %s rejected: "
                    "%s", iface->addr, addr, cfx_last_error());
        reject(id, rc);
        rdma_destroy_id(id);
        return;
    }
    ep->cm_id = id;
    id->context = ep;
    ep->state = CFX_VERBS_EP_ACCEPTING;
    cfx__tp_stranger_add(&iface->strangers, &ep->stranger, ip4, ep->addr, now);
    if ((rc = cfx__verbs_ep_hello_take(ep, ev->priv, ev->priv_len)) != CFX_OK)
        goto err_reject;
    if ((rc = cfx__verbs_ep_qp_create(ep)) != CFX_OK ||
        (rc = cfx__verbs_ep_qp_cm_rtr_rts(ep)) != CFX_OK)
        goto err_reject;
    conn_param_init(ep, &cp, &h);
    if (rdma_accept(id, &cp)) {
        rc = cfx__err(CFX_ERR_CONNECT, "rdma_accept: %s", strerror(errno));
        goto err_reject;
    }
    CFX_LOG(DEBUG, VERBS, "iface %s: accepting %s: QP %#x in RTS, REP sent", iface->addr,
            ep->super.peer_name, ep->qp->qp_num);
    return;

err_reject:
    CFX_RATELOG(&iface->accept_log, VERBS, now, "iface %s: connection from %s rejected (%s): "
                "%s", iface->addr, ep->super.peer_name, cfx_errname(rc), cfx_last_error());
    reject(id, rc);
    cfx__verbs_ep_fail(ep, rc); /* invisible: to the graveyard, id destroyed there */
}

static void on_addr_resolved(struct cfx__verbs_ep *ep)
{
    struct cfx__verbs_iface *iface = ep->iface;
    if (!ep->cm_id->verbs ||
        strcmp(ibv_get_device_name(ep->cm_id->verbs->device), iface->dev_name)) {
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "the route to %s leaves through device %s, "
                          "this iface uses %s", ep->addr,
                          ep->cm_id->verbs ? ibv_get_device_name(ep->cm_id->verbs->device) : "?",
                          iface->dev_name);
        return;
    }
    if (rdma_resolve_route(ep->cm_id, CFX_VERBS_RESOLVE_MS))
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "rdma_resolve_route: %s", strerror(errno));
}

static void on_route_resolved(struct cfx__verbs_ep *ep)
{
    struct rdma_conn_param cp;
    struct cfx__verbs_hello h;
    int rc;

    if ((rc = cfx__verbs_ep_qp_create(ep)) != CFX_OK) {
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "%s", cfx_last_error());
        return;
    }
    conn_param_init(ep, &cp, &h);
    ep->state = CFX_VERBS_EP_CONNECTING;
    if (rdma_connect(ep->cm_id, &cp)) {
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "rdma_connect: %s", strerror(errno));
        return;
    }
    CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: route resolved, QP %#x in INIT, REQ sent",
            ep->iface->addr, ep->super.peer_name, ep->qp->qp_num);
}

/* Active side: the peer accepted; its hello came with the REP.  Where the
 * acceptor closed the connection since (its REJ came first: the REJECTED
 * event is next, dropped for a failed ep), rdma_init_qp_attr() and
 * rdma_establish() refuse with EINVAL: CFX_ERR_PEER_FAILED, to dial again. */
static void on_connect_response(struct cfx__verbs_ep *ep, const struct cm_event *ev, bool rtu)
{
    int rc;
    if ((rc = cfx__verbs_ep_hello_take(ep, ev->priv, ev->priv_len)) != CFX_OK) {
        reject(ep->cm_id, rc);
        CFX_VERBS_EP_FAIL(ep, ERR, rc, "%s", cfx_last_error());
        return;
    }
    if ((rc = cfx__verbs_ep_qp_cm_rtr_rts(ep)) != CFX_OK) {
        rdma_reject(ep->cm_id, NULL, 0);
        if (rc == CFX_ERR_PEER_FAILED)
            ep->super.why = closed_after_rep;
        else
            rc = CFX_ERR_CONNECT;
        CFX_VERBS_EP_FAIL(ep, WARN, rc, "%s", cfx_last_error());
        return;
    }
    if (rtu && rdma_establish(ep->cm_id)) {
        int err = errno;
        if (err == EINVAL)
            ep->super.why = closed_after_rep;
        CFX_VERBS_EP_FAIL(ep, WARN, err == EINVAL ? CFX_ERR_PEER_FAILED : CFX_ERR_CONNECT,
                          "rdma_establish: %s%s%s", strerror(err), err == EINVAL ? ": " : "",
                          err == EINVAL ? closed_after_rep : "");
        return;
    }
    cfx__verbs_ep_established(ep);
}

static void on_established(struct cfx__verbs_ep *ep, const struct cm_event *ev)
{
    if (ep->state == CFX_VERBS_EP_CONNECTING)
        on_connect_response(ep, ev, false); /* not expected without an rdma_cm QP */
    else /* ACCEPTING; already OPEN when the peer's first message came first */
        cfx__verbs_ep_established(ep);
}

/* Error events before or after the connection is up. */
static void on_error_event(struct cfx__verbs_ep *ep, const struct cm_event *ev)
{
    const char *what = rdma_event_str(ev->type);

    if (ep->state == CFX_VERBS_EP_OPEN) {
        if (ev->type == RDMA_CM_EVENT_REJECTED) /* it crossed our RTU */
            ep->super.why = closed_after_rep;
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_PEER_FAILED, "rdma_cm %s (status %d)%s%s", what,
                          ev->status, ep->super.why ? ": " : "",
                          ep->super.why ? ep->super.why : "");
        return;
    }
    if (ev->type == RDMA_CM_EVENT_REJECTED) {
        const char *why;
        int rc = cfx__verbs_rej_decode(ev->status, ev->priv, ev->priv_len, &why);
        if (why) { /* a refusal we would meet over any transport */
            ep->super.why = why;
            CFX_VERBS_EP_FAIL(ep, WARN, rc, "rdma_cm REJECTED by %s: %s", ep->addr, why);
        } else {
            CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "rdma_cm REJECTED (reason %d): "
                              "nobody listens at %s, or it refused us", ev->status, ep->addr);
        }
    } else {
        CFX_VERBS_EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "rdma_cm %s (status %d) while connecting "
                          "to %s", what, ev->status, ep->addr);
    }
}

static void dispatch(struct cfx__verbs_iface *iface, const struct cm_event *ev)
{
    if (ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        on_connect_request(iface, ev);
        return;
    }
    if (ev->id == iface->listen_id || !ev->id->context) {
        if (ev->type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
            struct cfx_list *pos, *tmp;
            CFX_LOG(ERR, VERBS, "iface %s: device %s removed", iface->addr, iface->dev_name);
            cfx_list_for_each_safe(pos, tmp, &iface->eps) {
                struct cfx__verbs_ep *ep = cfx_list_entry(pos, struct cfx__verbs_ep, link);
                CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_NO_DEVICE, "device removed");
            }
        } else {
            CFX_LOG(INFO, VERBS, "iface %s: listener event %s (status %d)", iface->addr,
                    rdma_event_str(ev->type), ev->status);
        }
        return;
    }

    struct cfx__verbs_ep *ep = ev->id->context;
    if (ep->state >= CFX_VERBS_EP_FAILED)
        return;
    switch (ev->type) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
        on_addr_resolved(ep);
        break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
        on_route_resolved(ep);
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        on_established(ep, ev);
        break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
        on_error_event(ep, ev);
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
        if (ep->state == CFX_VERBS_EP_OPEN)
            CFX_VERBS_EP_FAIL(ep, INFO, CFX_ERR_PEER_FAILED, "peer disconnected (it closed the "
                              "endpoint or exited)");
        else
            on_error_event(ep, ev);
        break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_NO_DEVICE, "device %s removed", iface->dev_name);
        break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
        if (ep->state == CFX_VERBS_EP_CONNECTING)
            on_connect_response(ep, ev, true);
        break;
    default: /* TIMEWAIT_EXIT, ADDR_CHANGE, ... */
        CFX_LOG(DEBUG, VERBS, "iface %s: ep to %s: rdma_cm %s", iface->addr,
                ep->super.peer_name, rdma_event_str(ev->type));
        break;
    }
}

void cfx__verbs_cm_progress(struct cfx__verbs_iface *iface)
{
    struct rdma_cm_event *e;

    while (rdma_get_cm_event(iface->cm_ch, &e) == 0) {
        struct cm_event ev = {
            .type = e->event,
            .status = e->status,
            .id = e->id,
            .listen_id = e->listen_id,
        };
        if (e->param.conn.private_data && e->param.conn.private_data_len) {
            ev.priv_len = CFX_MIN((size_t)e->param.conn.private_data_len, sizeof(ev.priv));
            memcpy(ev.priv, e->param.conn.private_data, ev.priv_len);
        }
        rdma_ack_cm_event(e);
        CFX_LOG(DEBUG, VERBS, "iface %s: rdma_cm event %s (status %d)", iface->addr,
                rdma_event_str(ev.type), ev.status);
        dispatch(iface, &ev);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        CFX_LOG(WARN, VERBS, "iface %s: rdma_get_cm_event: %s", iface->addr, strerror(errno));
}

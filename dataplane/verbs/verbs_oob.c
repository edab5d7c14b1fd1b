/*
 * verbs transport: out-of-band connection establishment over TCP
 * (CFX_IB_CONNECT=oob), for fabrics or hosts without rdma_cm, as perftest
 * offers it.  The iface address is "oob:IP:PORT".
 *
 *   connect side                         accept side
 *   TCP connect
 *   QP -> INIT, post receives
 *   send info (hello, QPN, PSN, GID) ->  read info
 *                                        QP -> INIT, post receives, RTR, RTS
 *   read info                        <-  send info
 *   QP -> RTR, RTS
 *   send READY, report CONNECTED     ->  READY (or a first message): ACCEPT
 *
 * The socket stays open for the life of the endpoint: a hang-up means the
 * peer process is gone (CFX_ERR_PEER_FAILED) and a 'B' byte that it closed
 * the endpoint (CFX_ERR_CLOSED).  Keepalive notices a vanished host.  A
 * hang-up during the exchange, the TCP connection made, is the acceptor
 * closing it (at its cap on strangers, below) and CFX_ERR_PEER_FAILED too,
 * as on tcp: the engine dials again (conn.c, conn_redial), where
 * CFX_ERR_CONNECT (a refused or failed TCP connect) moves on.  So an
 * acceptor that refuses the hello (another version, one not understood)
 * answers with a refusal record before it closes (verbs.h, struct
 * cfx__verbs_oob_info), and the connector fails with its reason,
 * CFX_ERR_VERSION naming both versions, which is not dialled again.
 *
 * Anyone may connect to the listening socket, and each accepted socket
 * holds an endpoint (registered buffers, CQ entries, a table slot) before
 * the peer has said a word: one whose exchange is not done within
 * CFX_IB_OOB_ACCEPT_MS (default CFX_VERBS_ACCEPT_MS) is dropped, as tcp
 * drops a connection that sends no HELLO, and those not yet authorized are
 * capped, with the out-of-descriptors rule, as tcp's (tp_strangers.h).
 * Lines a flood repeats are written once a second at most.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "verbs.h"

#define ACCEPT_BURST   16
#define OOB_BYE        0x42 /* 'B' */

static uint32_t random_psn(void)
{
    return cfx__random_u32() & 0xffffff;
}

int cfx__verbs_oob_listen(struct cfx__verbs_iface *iface)
{
    int rc = cfx__tp_sock_listen("verbs oob", &iface->ip, &iface->listen_fd, &iface->port);
    if (rc != CFX_OK)
        return rc;
    snprintf(iface->addr, sizeof(iface->addr), "oob:%s:%u", iface->ip_str, iface->port);
    iface->accept_ms = (uint32_t)cfx__env_ll_clamp("CFX_IB_OOB_ACCEPT_MS", CFX_VERBS_ACCEPT_MS,
                                                   1, 3600 * 1000);
    return cfx__verbs_epoll_add(iface, iface->listen_fd, EPOLLIN, &iface->listen_src);
}

void cfx__verbs_oob_close(struct cfx__verbs_iface *iface)
{
    if (iface->listen_fd >= 0)
        close(iface->listen_fd);
    iface->listen_fd = -1;
}

void cfx__verbs_oob_sock_close(struct cfx__verbs_ep *ep)
{
    if (ep->oob_fd < 0)
        return;
    epoll_ctl(ep->iface->epfd, EPOLL_CTL_DEL, ep->oob_fd, NULL);
    shutdown(ep->oob_fd, SHUT_RDWR);
    close(ep->oob_fd);
    ep->oob_fd = -1;
    ep->oob_events = 0;
}

static int set_events(struct cfx__verbs_ep *ep, uint32_t events)
{
    if (ep->oob_events == events)
        return CFX_OK;
    struct epoll_event ev = { .events = events, .data.ptr = &ep->oob_src };
    int op = ep->oob_events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(ep->iface->epfd, op, ep->oob_fd, &ev) < 0)
        return cfx__err(cfx__status_from_errno(errno), "verbs oob ep %s: epoll_ctl: %s",
                        ep->super.peer_name, strerror(errno));
    ep->oob_events = events;
    return CFX_OK;
}

int cfx__verbs_oob_connect(struct cfx__verbs_ep *ep, const struct sockaddr_in *dst)
{
    int fd = cfx__tp_sock_connect("verbs ep_connect", ep->addr, dst);
    if (fd < 0)
        return fd;
    cfx__tp_sock_setup(fd, false);
    ep->oob_fd = fd;
    ep->state = CFX_VERBS_EP_CONNECTING;
    return set_events(ep, EPOLLOUT | EPOLLIN);
}

void cfx__verbs_oob_accept(struct cfx__verbs_iface *iface)
{
    struct cfx__tp_strangers *s = &iface->strangers;
    uint64_t now = cfx__now_ns();

    for (int i = 0; i < ACCEPT_BURST && !cfx__tp_strangers_paused(s); i++) {
        char addr[32];
        struct cfx__verbs_ep *ep;
        uint32_t ip = 0;

        int fd = cfx__tp_sock_accept(iface->listen_fd, addr, sizeof(addr), &ip);
        if (fd < 0) {
            int err = errno;
            if (err == EMFILE || err == ENFILE) {
                if (cfx__tp_strangers_out_of_fds(s, iface->listen_fd, err, now))
                    continue;
            } else if (cfx__tp_sock_accept_err_notable(err)) {
                CFX_RATELOG(&iface->accept_log, VERBS, now, "iface %s: accept: %s",
                            iface->addr, strerror(err));
            }
            return;
        }
        cfx__tp_strangers_admit(s, ip, now);
        cfx__tp_sock_setup(fd, false);
        if (cfx__verbs_ep_create(iface, CFX_VERBS_NODE_NONE, addr, &ep) != CFX_OK) {
            CFX_RATELOG(&iface->accept_log, VERBS, now, "iface %s: dropping connection from "
                        "%s: %s", iface->addr, addr, cfx_last_error());
            close(fd);
            continue;
        }
        ep->oob_fd = fd;
        ep->state = CFX_VERBS_EP_ACCEPTING;
        ep->accept_deadline = now + (uint64_t)iface->accept_ms * 1000000ull;
        cfx__tp_stranger_add(s, &ep->stranger, ip, ep->addr, now);
        if (set_events(ep, EPOLLIN) != CFX_OK) {
            ep->oob_fd = -1;
            close(fd);
            cfx__verbs_ep_fail(ep, CFX_ERR_IO);
        }
    }
}

void cfx__verbs_oob_accept_expire(struct cfx__verbs_iface *iface, uint64_t now)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &iface->eps) {
        struct cfx__verbs_ep *ep = cfx_list_entry(pos, struct cfx__verbs_ep, link);
        if (ep->visible || ep->state != CFX_VERBS_EP_ACCEPTING || now <= ep->accept_deadline)
            continue;
        CFX_RATELOG(&iface->expire_log, VERBS, now, "iface %s: connection from %s did not "
                    "finish the out-of-band exchange in %u ms (%u of %zu bytes came); dropped",
                    iface->addr, ep->addr, iface->accept_ms, ep->oob_got, sizeof(ep->oob_in));
        cfx__verbs_ep_fail(ep, CFX_ERR_TIMEOUT); /* invisible: to the graveyard */
    }
}

/* Move bytes of the info exchange: 1 done, 0 would block, -1 failed (errno,
 * 0 for a hang-up). */
static int xfer(struct cfx__verbs_ep *ep, bool out, void *buf, uint32_t total, uint32_t *done)
{
    while (*done < total) {
        ssize_t n = out ? send(ep->oob_fd, (uint8_t *)buf + *done, total - *done,
                               MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(ep->oob_fd, (uint8_t *)buf + *done, total - *done, MSG_DONTWAIT);
        if (n > 0) {
            *done += (uint32_t)n;
            continue;
        }
        if (n == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
    return 1;
}

static void fill_info(struct cfx__verbs_ep *ep, uint32_t psn)
{
    struct cfx__verbs_iface *iface = ep->iface;
    struct cfx__verbs_oob_info *o = &ep->oob_out;

    memset(o, 0, sizeof(*o));
    cfx__verbs_ep_hello_fill(ep, &o->hello);
    o->qpn = htole32(ep->qp->qp_num);
    o->psn = htole32(psn);
    memcpy(o->gid, iface->gid.raw, 16);
    o->lid = htole16(iface->lid);
    ep->oob_sent = 0;
}

#define OOB_FAIL(ep, status, ...) CFX_VERBS_EP_FAIL(ep, WARN, status, __VA_ARGS__)

static const char *xfer_why(void)
{
    return errno ? strerror(errno) : "connection closed by peer";
}

/* The status of a failed xfer() (errno) for the connect side (an accepted
 * ep is not shown: its status goes nowhere): the peer closed the connection
 * (a hang-up, a reset), or another failure. */
static int xfer_status(void)
{
    return errno == 0 || errno == ECONNRESET || errno == EPIPE ? CFX_ERR_PEER_FAILED
                                                                : CFX_ERR_CONNECT;
}

/* Send what is left of our info; false when the ep failed or must wait. */
static bool send_info(struct cfx__verbs_ep *ep)
{
    int r = xfer(ep, true, &ep->oob_out, sizeof(ep->oob_out), &ep->oob_sent);
    if (r < 0) {
        int st = xfer_status();
        OOB_FAIL(ep, st, "out-of-band send: %s", xfer_why());
        return false;
    }
    if (r == 0) {
        set_events(ep, EPOLLIN | EPOLLOUT);
        return false;
    }
    set_events(ep, EPOLLIN);
    return true;
}

/* The peer's magic and version came (its exchange's first
 * CFX_VERBS_OOB_HEAD bytes, which every version keeps), and it speaks
 * another version: whatever the size of its exchange, or of its refusal,
 * nothing more need come. */
static bool other_version(const struct cfx__verbs_ep *ep)
{
    const struct cfx__verbs_hello *h = &ep->oob_in.hello;
    return ep->oob_got >= CFX_VERBS_OOB_HEAD && le32toh(h->magic) == CFX_VERBS_MAGIC &&
           le16toh(h->version) != CFX_VERBS_VERSION;
}

/* The acceptor refused our hello (another version, or its refusal record,
 * accept_progress): fail with its reason, which the engine does not dial
 * again for (CFX_ERR_VERSION, CFX_ERR_AUTH: cfx__conn_fallback), where a
 * bare hang-up is CFX_ERR_PEER_FAILED, dialled CFX_CONN_REDIALS times. */
static void connect_refused(struct cfx__verbs_ep *ep)
{
    const struct cfx__verbs_hello *h = &ep->oob_in.hello;
    int st;

    if (other_version(ep)) {
        st = CFX_ERR_VERSION;
        snprintf(ep->oob_why, sizeof(ep->oob_why), "it refused our hello: it speaks verbs "
                 "protocol version %u, we speak %u", le16toh(h->version), CFX_VERBS_VERSION);
    } else {
        struct cfx__verbs_rej rej = { .magic = htole32(CFX_VERBS_REJ_MAGIC),
                                      .version = htole16(CFX_VERBS_REJ_VERSION),
                                      .reason = ep->oob_in.refused };
        const char *why;
        st = cfx__verbs_rej_decode(CFX_VERBS_REJ_CONSUMER, &rej, sizeof(rej), &why);
        if (why)
            snprintf(ep->oob_why, sizeof(ep->oob_why), "%s", why);
        else
            snprintf(ep->oob_why, sizeof(ep->oob_why), "it refused us (reason %u)",
                     le16toh(ep->oob_in.refused));
    }
    ep->super.why = ep->oob_why;
    OOB_FAIL(ep, st, "out-of-band exchange with %s: %s", ep->addr, ep->oob_why);
}

static void connect_progress(struct cfx__verbs_ep *ep)
{
    int rc;

    if (!ep->qp) {
        int err = 0;
        socklen_t elen = sizeof(err);
        if (getsockopt(ep->oob_fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
            err = errno;
        if (err == EINPROGRESS || err == EALREADY)
            return;
        if (err) { /* refused: nobody listens; reset: accepted, then closed */
            OOB_FAIL(ep, err == ECONNRESET ? CFX_ERR_PEER_FAILED : CFX_ERR_CONNECT,
                     "connect to %s: %s", ep->addr, strerror(err));
            return;
        }
        if ((rc = cfx__verbs_ep_qp_create(ep)) != CFX_OK) {
            OOB_FAIL(ep, CFX_ERR_CONNECT, "%s", cfx_last_error());
            return;
        }
        fill_info(ep, random_psn());
    }
    if (ep->oob_sent < sizeof(ep->oob_out) && !send_info(ep))
        return;
    int r = xfer(ep, false, &ep->oob_in, sizeof(ep->oob_in), &ep->oob_got);
    if (other_version(ep) || (r > 0 && ep->oob_in.refused)) {
        connect_refused(ep);
        return;
    }
    if (r < 0) {
        int st = xfer_status();
        OOB_FAIL(ep, st, "out-of-band exchange with %s: %s", ep->addr, xfer_why());
        return;
    }
    if (r == 0)
        return;
    if ((rc = cfx__verbs_ep_hello_take(ep, &ep->oob_in.hello, sizeof(ep->oob_in.hello))) != CFX_OK ||
        (rc = cfx__verbs_ep_qp_rtr_rts(ep, &ep->oob_in, le32toh(ep->oob_out.psn))) != CFX_OK) {
        OOB_FAIL(ep, rc == CFX_ERR_VERSION ? rc : CFX_ERR_CONNECT, "%s", cfx_last_error());
        return;
    }
    static const uint8_t ready = CFX_VERBS_OOB_READY;
    uint32_t sent = 0;
    if (xfer(ep, true, (void *)&ready, 1, &sent) != 1) {
        int st = xfer_status();
        OOB_FAIL(ep, st, "out-of-band READY: %s", xfer_why());
        return;
    }
    cfx__verbs_ep_established(ep);
}

/* Refuse the connector's hello for @p status (cfx_last_error() says why),
 * telling it why before closing, as rdma_cm's REJ does (a bare hang-up it
 * takes for a cap's and dials again): a refusal record, our magic and
 * version, the reason, no QP (struct cfx__verbs_oob_info).  Best effort:
 * nothing of ours is in the socket's buffer yet. */
static void accept_refuse(struct cfx__verbs_ep *ep, int status)
{
    struct cfx__verbs_iface *iface = ep->iface;
    struct cfx__verbs_oob_info *o = &ep->oob_out;
    struct cfx__verbs_rej rej;

    /* short: the line keeps 160 bytes (flood.h) */
    CFX_RATELOG(&iface->accept_log, VERBS, cfx__now_ns(), "iface %s: refused %s: %s",
                iface->addr, ep->addr, cfx_last_error());
    if (cfx__verbs_rej_fill(&rej, status)) {
        memset(o, 0, sizeof(*o));
        o->hello.magic = htole32(CFX_VERBS_MAGIC);
        o->hello.version = htole16(CFX_VERBS_VERSION);
        o->refused = rej.reason; /* little endian already */
        (void)!send(ep->oob_fd, o, sizeof(*o), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    OOB_FAIL(ep, status, "%s", cfx_last_error());
}

static void accept_progress(struct cfx__verbs_ep *ep)
{
    int rc;

    if (ep->oob_got < sizeof(ep->oob_in)) {
        int r = xfer(ep, false, &ep->oob_in, sizeof(ep->oob_in), &ep->oob_got);
        if (r < 0 && !other_version(ep)) {
            OOB_FAIL(ep, CFX_ERR_CONNECT, "out-of-band exchange: %s", xfer_why());
            return;
        }
        if (r == 0 && !other_version(ep))
            return;
        /* (another version's hello is refused as soon as its head came) */
        if ((rc = cfx__verbs_ep_hello_take(ep, &ep->oob_in.hello, sizeof(ep->oob_in.hello)))) {
            accept_refuse(ep, rc);
            return;
        }
        uint32_t psn = random_psn();
        if ((rc = cfx__verbs_ep_qp_create(ep)) ||
            (rc = cfx__verbs_ep_qp_rtr_rts(ep, &ep->oob_in, psn))) {
            OOB_FAIL(ep, rc, "%s", cfx_last_error());
            return;
        }
        fill_info(ep, psn);
    }
    if (ep->oob_sent < sizeof(ep->oob_out) && !send_info(ep))
        return;
    uint8_t b;
    uint32_t got = 0;
    int r = xfer(ep, false, &b, 1, &got);
    if (r < 0) {
        OOB_FAIL(ep, CFX_ERR_CONNECT, "out-of-band exchange: %s", xfer_why());
        return;
    }
    if (r == 0)
        return;
    if (b != CFX_VERBS_OOB_READY) {
        OOB_FAIL(ep, CFX_ERR_PROTO, "out-of-band: unexpected byte %#x instead of READY", b);
        return;
    }
    cfx__verbs_ep_established(ep);
}

/* An open endpoint's socket turned readable: READY (late), BYE or hang-up. */
static void open_progress(struct cfx__verbs_ep *ep)
{
    for (;;) {
        uint8_t b;
        uint32_t got = 0;
        int r = xfer(ep, false, &b, 1, &got);
        if (r == 0)
            return;
        if (r < 0) {
            OOB_FAIL(ep, CFX_ERR_PEER_FAILED, "out-of-band connection lost (%s): the peer "
                     "process exited or its host went away", xfer_why());
            return;
        }
        if (b == OOB_BYE) {
            OOB_FAIL(ep, CFX_ERR_CLOSED, "peer closed the endpoint");
            return;
        }
        if (b != CFX_VERBS_OOB_READY) {
            OOB_FAIL(ep, CFX_ERR_PROTO, "out-of-band: unexpected byte %#x", b);
            return;
        }
    }
}

void cfx__verbs_oob_progress(struct cfx__verbs_ep *ep, uint32_t events)
{
    if (ep->oob_fd < 0)
        return;
    switch (ep->state) {
    case CFX_VERBS_EP_CONNECTING:
        connect_progress(ep);
        break;
    case CFX_VERBS_EP_ACCEPTING:
        accept_progress(ep);
        break;
    case CFX_VERBS_EP_OPEN:
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            open_progress(ep);
        break;
    default:
        break;
    }
}

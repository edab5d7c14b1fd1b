/*
 * tcp transport: endpoints.
 *
 * Transmit: posted frames wait in a per-ep ring and are handed to the kernel
 * with sendmsg() straight from their source (a write's payload from the
 * registered memory, a send's payload from the ep's send buffer), header and
 * payload in one call, several frames per call, resuming partial writes.  A
 * post on an idle ep goes out at once (lowest latency); inside an ep_batch
 * bracket posts wait, up to CFX_TCP_BATCH_MAX frames, and leave together in
 * one sendmsg.  A frame's local completion is queued once its last byte is
 * in the kernel.
 *
 * Receive: one recv() takes whatever the socket holds, up to
 * CFX_TCP_RXBUF_SIZE, into the ep's receive buffer, and every complete frame
 * in it is parsed before the socket is read again; a read shorter than the
 * buffer means the socket is empty, so no recv() is spent to learn EAGAIN.
 * Headers are checked exactly as before (key, bounds) before a byte of
 * their payload is placed.  A payload with at least a buffer's worth still
 * to come is received straight into its destination (a write's registered
 * memory): large writes stay zero-copy, small frames cost one copy out of
 * the buffer.  The read that ends such a payload takes what follows it into
 * the buffer too (recvmsg, two iovecs), so a stream of chunks costs one
 * read per chunk, not one for the payload and one for the next header.
 * When parsing must stop with bytes buffered (the user holds
 * every RECV slot or RX_MAX completions), the ep goes on iface->rx_backlog
 * and poll() resumes it: the socket may have nothing more to say.
 *
 * Sealed (CFX_SECURE, tcp.h): frames posted after the last clear one are
 * gathered the same way but sealed into records (up to CFX_TCP_REC_PER_TX at
 * a time) and sent from the ep's record buffer; their completions are queued
 * once the record holding their last byte is in the kernel.  Received
 * records are opened one at a time into the receive buffer and parsed as
 * above; nothing is received straight into its destination.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dataplane/common/log.h"
#include "tcp.h"

#define HDR_SIZE ((uint32_t)sizeof(struct cfx__tcp_hdr))

/* Keepalive: notice a peer host that vanished without a reset. */

static void ep_tx_progress(struct cfx__tcp_ep *ep);
static void ep_rx_progress(struct cfx__tcp_ep *ep);
static void ep_rx_sealed(struct cfx__tcp_ep *ep);

/* --- helpers ---------------------------------------------------------------- */

static void set_peer_name(struct cfx__tcp_ep *ep)
{
    if (ep->super.peer_node != CFX_TCP_NODE_NONE)
        snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "node %u (%s)",
                 ep->super.peer_node, ep->addr);
    else
        snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "%s", ep->addr);
}

static void push_comp(struct cfx__tcp_ep *ep, uint8_t type, int32_t status)
{
    struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->cq);
    c->type = type;
    c->status = status;
    c->ep = &ep->super;
}

/* Release the send-buffer bytes of the oldest send (FIFO). */
static inline void sbuf_release(struct cfx__tcp_ep *ep, uint32_t cost)
{
    ep->sbuf_used -= cost;
    if (ep->sbuf_used == 0)
        ep->sbuf_head = 0;
}

/* Contiguous room for @p len bytes in the send buffer, or NULL when full. */
static inline uint8_t *sbuf_alloc(struct cfx__tcp_ep *ep, uint32_t len, uint32_t *cost)
{
    uint32_t head = ep->sbuf_head, free_bytes = CFX_TCP_SBUF_SIZE - ep->sbuf_used;

    if (head + len <= CFX_TCP_SBUF_SIZE) {
        if (len > free_bytes)
            return NULL;
        *cost = len;
        ep->sbuf_head = head + len;
    } else {
        uint32_t pad = CFX_TCP_SBUF_SIZE - head;
        if (pad + len > free_bytes)
            return NULL;
        *cost = pad + len;
        head = 0;
        ep->sbuf_head = len;
    }
    ep->sbuf_used += *cost;
    return ep->sbuf + head;
}

static void rx_release_mr(struct cfx__tcp_ep *ep)
{
    if (ep->rx_mr) {
        ep->rx_mr->rx_busy--;
        ep->rx_mr = NULL;
    }
}

static inline void rx_backlog_add(struct cfx__tcp_ep *ep)
{
    if (!ep->rx_backlogged) {
        ep->rx_backlogged = true;
        cfx_list_add_tail(&ep->rx_link, &ep->iface->rx_backlog);
    }
}

/* Forget buffered bytes (the socket is gone). */
static void rx_buf_drop(struct cfx__tcp_ep *ep)
{
    if (ep->rx_backlogged) {
        cfx_list_del(&ep->rx_link);
        ep->rx_backlogged = false;
    }
    ep->rxb_off = ep->rxb_len = 0;
}

static void sock_close(struct cfx__tcp_ep *ep)
{
    if (ep->fd < 0)
        return;
    if (ep->epoll_events)
        epoll_ctl(ep->iface->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
    ep->epoll_events = 0;
    /* shutdown() ends the connection even if a forked child shares the fd. */
    shutdown(ep->fd, SHUT_RDWR);
    close(ep->fd);
    ep->fd = -1;
}

/* @p ep no longer waits to prove the token: it did, or it is going. */
static void unauth_drop(struct cfx__tcp_ep *ep)
{
    cfx__tp_stranger_del(&ep->iface->strangers, &ep->stranger);
}

/* Empty the send queue, completing each user op with @p status if @p report. */
static void txq_drop(struct cfx__tcp_ep *ep, bool report, int status)
{
    for (; ep->txq_tail != ep->txq_head; ep->txq_tail = (ep->txq_tail + 1) % CFX_TCP_TXQ_SLOTS) {
        struct cfx__tcp_op *op = &ep->txq[ep->txq_tail];
        if (op->mr)
            op->mr->tx_busy--;
        if (report && op->comp_type) {
            struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->cq);
            c->type = op->comp_type;
            c->status = status;
            c->ep = &ep->super;
            c->wr_id = op->wr_id;
        }
    }
    ep->tx_off = 0;
    ep->tx_held = 0;
    ep->sbuf_used = ep->sbuf_head = 0;
    if (ep->seal)
        ep->seal->stx_len = ep->seal->stx_off = 0;
}

/*
 * The endpoint failed: close the socket, flush every op not yet in the kernel
 * with @p status, then report one EP_ERROR.  An accepted connection that
 * never said HELLO was never shown to the user and just goes away.
 */
static void ep_fail(struct cfx__tcp_ep *ep, int status)
{
    if (ep->state == CFX_TCP_EP_FAILED)
        return;
    unauth_drop(ep);
    sock_close(ep);
    rx_release_mr(ep);
    rx_buf_drop(ep);

    if (ep->state == CFX_TCP_EP_HELLO_WAIT) {
        ep->state = CFX_TCP_EP_FAILED;
        cfx__tp_graveyard_add(&ep->iface->graveyard, &ep->link);
        cfx__tp_cq_unreserve(&ep->iface->cq, CFX_TCP_CQ_PER_EP);
        return;
    }

    ep->state = CFX_TCP_EP_FAILED;
    ep->super.status = status;
    txq_drop(ep, true, status);
    push_comp(ep, CFX_TP_COMP_EP_ERROR, status);
}

void cfx__tcp_ep_hello_expire(struct cfx__tcp_iface *iface, uint64_t now)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &iface->eps) {
        struct cfx__tcp_ep *ep = cfx_list_entry(pos, struct cfx__tcp_ep, link);
        if (ep->state == CFX_TCP_EP_HELLO_WAIT && now > ep->hello_deadline) {
            /* a flood of silent peers: one line a second */
            CFX_RATELOG(&iface->hello_log, TCP, now, "iface %s: connection from %s sent no "
                        "HELLO in %d ms; dropped", iface->addr, ep->addr, CFX_TCP_HELLO_MS);
            ep_fail(ep, CFX_ERR_TIMEOUT); /* to the graveyard: only this one leaves the list */
        }
    }
}

#define EP_FAIL_QUIET_NS 2000000000ull /* a peer's other eps failing within 2 s */

/*
 * Whether the failure of @p ep is news: a peer that dies fails each of its
 * eps (one each way), and the first says so; the others, within
 * EP_FAIL_QUIET_NS on the same iface, log at DEBUG.
 */
static bool ep_fail_is_news(struct cfx__tcp_ep *ep, int status)
{
    struct cfx__tcp_iface *iface = ep->iface;
    uint32_t node = ep->super.peer_node;
    if (status != CFX_ERR_PEER_FAILED || node == CFX_TCP_NODE_NONE)
        return true;
    uint64_t now = cfx__now_ns();
    bool news = !(node == iface->fail_node && now - iface->fail_ns < EP_FAIL_QUIET_NS);
    iface->fail_node = node;
    iface->fail_ns = now;
    return news;
}

/* Failure with a log line naming both ends; @p status and why. */
#define EP_FAIL(ep, lvl, status, ...)                                                  \
    do {                                                                               \
        if ((ep)->state != CFX_TCP_EP_HELLO_WAIT) {                                    \
            char why_[160];                                                            \
            snprintf(why_, sizeof(why_), __VA_ARGS__);                                 \
            if (ep_fail_is_news((ep), (status)))                                       \
                CFX_LOG(lvl, TCP, "iface %s: ep to %s failed (%s): %s",                \
                        (ep)->iface->addr, (ep)->super.peer_name, cfx_errname(status), \
                        why_);                                                         \
            else                                                                       \
                CFX_LOG(DEBUG, TCP, "iface %s: ep to %s failed (%s): %s",              \
                        (ep)->iface->addr, (ep)->super.peer_name, cfx_errname(status), \
                        why_);                                                         \
        }                                                                              \
        ep_fail((ep), (status));                                                       \
    } while (0)

/* Status for a failed socket call. */
static int sock_errno_status(int err)
{
    switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED: return CFX_ERR_PEER_FAILED;
    default: return CFX_ERR_IO;
    }
}

/* --- create / destroy -------------------------------------------------------- */

int cfx__tcp_ep_create(struct cfx__tcp_iface *iface, int fd, int state, uint32_t peer_node,
                       const char *addr, struct cfx__tcp_ep **out)
{
    struct cfx__tcp_ep *ep;
    uint8_t *slots;
    int rc;

    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return cfx__err(CFX_ERR_NOMEM, "tcp: out of memory for an endpoint");
    ep->txq = malloc(CFX_TCP_TXQ_SLOTS * sizeof(*ep->txq));
    ep->sbuf = malloc(CFX_TCP_SBUF_SIZE);
    ep->rxbuf = malloc(CFX_TCP_RXBUF_SIZE);
    slots = malloc((size_t)CFX_TCP_RX_SLOTS * CFX_TP_SEND_MAX);
    if (!ep->txq || !ep->sbuf || !ep->rxbuf || !slots) {
        rc = cfx__err(CFX_ERR_NOMEM, "tcp: out of memory for an endpoint");
        goto err_free;
    }
    for (int i = 0; i < CFX_TCP_RX_SLOTS; i++)
        ep->rx_slots[i].buf = slots + (size_t)i * CFX_TP_SEND_MAX;

    ep->super.iface = &iface->super;
    ep->serial = ++iface->ep_serial;
    ep->super.peer_node = peer_node;
    ep->super.status = CFX_OK;
    ep->iface = iface;
    ep->fd = fd;
    ep->state = state;
    if (state == CFX_TCP_EP_HELLO_WAIT)
        ep->hello_deadline = cfx__now_ns() + (uint64_t)CFX_TCP_HELLO_MS * 1000000ull;
    snprintf(ep->addr, sizeof(ep->addr), "%s", addr);
    set_peer_name(ep);

    if ((rc = cfx__tp_cq_reserve(&iface->cq, CFX_TCP_CQ_PER_EP)) != CFX_OK)
        goto err_free;
    if (fd >= 0) {
        cfx__tp_sock_setup(fd, true);
        rc = cfx__tcp_epoll_set(ep, state == CFX_TCP_EP_CONNECTING ? EPOLLOUT : EPOLLIN);
        if (rc != CFX_OK)
            goto err_unreserve;
    }
    cfx_list_add_tail(&ep->link, &iface->eps);
    *out = ep;
    return CFX_OK;

err_unreserve:
    cfx__tp_cq_unreserve(&iface->cq, CFX_TCP_CQ_PER_EP);
err_free:
    free(slots);
    free(ep->rxbuf);
    free(ep->sbuf);
    free(ep->txq);
    free(ep);
    return rc;
}

void cfx__tcp_ep_destroy(struct cfx__tcp_ep *ep)
{
    cfx__tcp_seal_free(ep);
    free(ep->rx_slots[0].buf);
    free(ep->rxbuf);
    free(ep->sbuf);
    free(ep->txq);
    free(ep);
}

void cfx__tcp_ep_evict(struct cfx__tcp_ep *ep, const char *why)
{
    ep->super.why = why;
    ep_fail(ep, CFX_ERR_NO_RESOURCE);
}

int cfx__tcp_ep_authorize(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep)
        return cfx__err(CFX_ERR_INVALID, "tcp ep_authorize: NULL endpoint");
    unauth_drop(cfx__tcp_ep_of(tp_ep));
    return CFX_OK;
}

/* --- connect / close ----------------------------------------------------------- */

int cfx__tcp_ep_connect(struct cfx_tp_iface *tp_iface, const void *addr, size_t len,
                        uint32_t peer_node, struct cfx_tp_ep **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__tcp_iface *iface;
    struct cfx__tcp_ep *ep;
    struct sockaddr_in sa;
    char host[32];
    int fd, rc;

    if (!tp_iface || !addr || !out || len == 0)
        return cfx__err(CFX_ERR_INVALID, "tcp ep_connect: NULL argument");
    iface = cfx__tcp_iface_of(tp_iface);
    /* The address is "ip:port", with or without its NUL. */
    size_t n = strnlen(addr, len);
    if (n == 0 || n >= sizeof(host))
        return cfx__err(CFX_ERR_INVALID, "tcp ep_connect: malformed address (%zu bytes)", len);
    memcpy(host, addr, n);
    host[n] = '\0';
    if ((rc = cfx__parse_hostport(host, &sa)) != CFX_OK)
        return rc;

    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "tcp ep_connect to %s: socket: %s", host,
                        strerror(errno));
    if ((rc = cfx__tcp_ep_create(iface, fd, CFX_TCP_EP_CONNECTING, peer_node, host, &ep)) !=
        CFX_OK) {
        close(fd);
        return rc;
    }

    /* HELLO goes first; it does not count against the user's queue depth. */
    ep->hello.magic = htole32(CFX_TCP_MAGIC);
    ep->hello.version = htole32(CFX_TCP_VERSION);
    ep->hello.node_id = htole32(iface->super.node_id);
    snprintf(ep->hello.addr, sizeof(ep->hello.addr), "%s", iface->addr);
    struct cfx__tcp_op *op = &ep->txq[ep->txq_head];
    memset(op, 0, sizeof(*op));
    op->hdr.type = CFX_TCP_FRAME_HELLO;
    op->hdr.len = htole32((uint32_t)sizeof(ep->hello));
    op->payload = (const uint8_t *)&ep->hello;
    op->total = HDR_SIZE + sizeof(ep->hello);
    ep->txq_head = (ep->txq_head + 1) % CFX_TCP_TXQ_SLOTS;

    *out = &ep->super;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        ep->state = CFX_TCP_EP_OPEN;
        cfx__tcp_epoll_set(ep, EPOLLIN);
        push_comp(ep, CFX_TP_COMP_CONNECTED, CFX_OK);
        ep_tx_progress(ep);
    } else if (errno != EINPROGRESS) {
        /* Reported like a late failure: the caller learns it from poll(). */
        EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "connect to %s: %s", host, strerror(errno));
    }
    return CFX_OK;
}

static void ep_connect_done(struct cfx__tcp_ep *ep)
{
    int err = 0;
    socklen_t elen = sizeof(err);

    if (getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
        err = errno;
    if (err == EINPROGRESS || err == EALREADY)
        return;
    if (err) {
        EP_FAIL(ep, WARN, CFX_ERR_CONNECT, "connect to %s: %s", ep->addr, strerror(err));
        return;
    }
    ep->state = CFX_TCP_EP_OPEN;
    push_comp(ep, CFX_TP_COMP_CONNECTED, CFX_OK);
    cfx__tcp_epoll_set(ep, EPOLLIN | EPOLLOUT);
    ep_tx_progress(ep);
}

/*
 * Best effort, never waiting, only at a frame boundary: a frame that goes
 * around the queue (BYE, ERROR).  Once our last clear frame left, the peer
 * reads records only, so it goes as one (at a record boundary).
 */
static void send_raw_frame(struct cfx__tcp_ep *ep, const struct cfx__tcp_hdr *h)
{
    if (ep->tx_off != 0 || ep->fd < 0)
        return;
    if (!ep->tx_clear_done) {
        (void)!send(ep->fd, h, sizeof(*h), MSG_DONTWAIT | MSG_NOSIGNAL);
        return;
    }
    struct cfx__tcp_seal *s = ep->seal;
    uint8_t rec[CFX_TCP_REC_OVH + sizeof(*h)];
    struct iovec iov = { (void *)h, sizeof(*h) };
    uint32_t len = htole32((uint32_t)sizeof(*h));
    if (s->stx_len != 0)
        return; /* in the middle of a record */
    memcpy(rec, &len, 4);
    if (cfx__seal(&s->tx, rec, 4, &iov, 1, rec + 4, rec + 4 + sizeof(*h)) == CFX_OK)
        (void)!send(ep->fd, rec, sizeof(rec), MSG_DONTWAIT | MSG_NOSIGNAL);
}

void cfx__tcp_ep_close(struct cfx_tp_ep *tp_ep)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep)
        return;
    struct cfx__tcp_ep *ep = cfx__tcp_ep_of(tp_ep);
    struct cfx__tcp_iface *iface = ep->iface;

    if (ep->state == CFX_TCP_EP_OPEN) {
        /* the peer reports CLOSED rather than PEER_FAILED */
        struct cfx__tcp_hdr bye = { .type = CFX_TCP_FRAME_BYE };
        send_raw_frame(ep, &bye);
    }
    unauth_drop(ep);
    sock_close(ep);
    rx_release_mr(ep);
    rx_buf_drop(ep);
    txq_drop(ep, false, CFX_OK);
    cfx__tp_cq_drop_ep(&iface->cq, tp_ep);
    cfx__tp_cq_unreserve(&iface->cq, CFX_TCP_CQ_PER_EP);
    ep->state = CFX_TCP_EP_FAILED;
    /* Freed at the next poll(): data of RECVs it returned stays valid. */
    cfx__tp_graveyard_add(&iface->graveyard, &ep->link);
}

/* --- transmit ------------------------------------------------------------------- */

/* @p done more bytes of the queue are in the kernel: retire every op whose
 * last byte went out. */
static void tx_retire(struct cfx__tcp_ep *ep, size_t done)
{
    while (done) {
        struct cfx__tcp_op *op = &ep->txq[ep->txq_tail];
        size_t rem = op->total - ep->tx_off;
        if (done < rem) {
            ep->tx_off += done;
            break;
        }
        done -= rem;
        ep->tx_off = 0;
        if (op->sbuf_cost)
            sbuf_release(ep, op->sbuf_cost);
        if (op->mr)
            op->mr->tx_busy--;
        if (unlikely(op->hdr.flags & CFX_TCP_F_LAST_CLEAR))
            ep->tx_clear_done = true;
        if (op->comp_type) {
            struct cfx_tp_completion *c = cfx__tp_cq_push(&ep->iface->cq);
            c->type = op->comp_type;
            c->ep = &ep->super;
            c->wr_id = op->wr_id;
        }
        ep->txq_tail = (ep->txq_tail + 1) % CFX_TCP_TXQ_SLOTS;
    }
}

/* A failed send(): take in what the peer sent before it left, then fail. */
static void tx_failed(struct cfx__tcp_ep *ep, int err)
{
    /* A peer that finished and closed may have sent its last messages just
     * before: they wait in our receive queue.  Take them in first (their
     * completions come before the error), or a reply of ours to a peer that
     * left would lose them. */
    if (ep->state == CFX_TCP_EP_OPEN)
        ep_rx_progress(ep);
    if (ep->state != CFX_TCP_EP_FAILED)
        EP_FAIL(ep, WARN, sock_errno_status(err), "send: %s", strerror(err));
}

/* Seal the next up to CFX_TCP_REC_PER_TX records of the queue (from its
 * oldest unsent byte) into the record buffer.  false: the ep failed. */
static bool tx_seal_records(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = ep->seal;
    uint32_t i = ep->txq_tail;
    size_t off = ep->tx_off;

    s->stx_len = s->stx_off = 0;
    s->stx_plain = 0;
    for (int r = 0; r < CFX_TCP_REC_PER_TX && i != ep->txq_head; r++) {
        struct iovec iov[CFX_TCP_IOV_MAX];
        size_t got = 0;
        int niov = 0;
        while (i != ep->txq_head && got < CFX_TCP_REC_MAX && niov + 2 <= CFX_TCP_IOV_MAX) {
            struct cfx__tcp_op *op = &ep->txq[i];
            size_t n;
            if (off < HDR_SIZE) {
                n = CFX_MIN(HDR_SIZE - off, CFX_TCP_REC_MAX - got);
                iov[niov].iov_base = (uint8_t *)&op->hdr + off;
                iov[niov++].iov_len = n;
                off += n;
                got += n;
            }
            if (off >= HDR_SIZE && off < op->total && got < CFX_TCP_REC_MAX) {
                n = CFX_MIN(op->total - off, CFX_TCP_REC_MAX - got);
                iov[niov].iov_base = (void *)(op->payload + (off - HDR_SIZE));
                iov[niov++].iov_len = n;
                off += n;
                got += n;
            }
            if (off == op->total) {
                i = (i + 1) % CFX_TCP_TXQ_SLOTS;
                off = 0;
            }
        }
        uint8_t *rec = s->stx + s->stx_len;
        uint32_t len = htole32((uint32_t)got);
        memcpy(rec, &len, 4);
        int rc = cfx__seal(&s->tx, rec, 4, iov, niov, rec + 4, rec + 4 + got);
        if (unlikely(rc != CFX_OK)) {
            EP_FAIL(ep, ERR, rc, "cannot seal: %s", cfx_last_error());
            return false;
        }
        s->stx_len += (uint32_t)(got + CFX_TCP_REC_OVH);
        s->stx_plain += got;
    }
    return true;
}

/* Sealed transmit: one buffer of records into the socket.  1: all of it
 * went, go on; 0: the socket is full; -1: the ep failed. */
static int tx_sealed_step(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = ep->seal;

    if (s->stx_len == 0 && !tx_seal_records(ep))
        return -1;
    for (;;) {
        ssize_t n = send(ep->fd, s->stx + s->stx_off, s->stx_len - s->stx_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            tx_failed(ep, errno);
            return -1;
        }
        s->stx_off += (uint32_t)n;
        if (s->stx_off < s->stx_len)
            return 0;
        size_t plain = s->stx_plain;
        s->stx_len = s->stx_off = 0;
        tx_retire(ep, plain);
        return 1;
    }
}

static void ep_tx_progress(struct cfx__tcp_ep *ep)
{
    struct iovec iov[CFX_TCP_IOV_MAX];
    struct msghdr msg = { .msg_iov = iov };

    while (ep->txq_tail != ep->txq_head) {
        size_t want = 0, off = ep->tx_off;
        int niov = 0;

        if (unlikely(ep->txq[ep->txq_tail].sealed)) {
            int r = tx_sealed_step(ep);
            if (r < 0)
                return;
            if (r == 0)
                break;
            continue;
        }
        /* Gather from the oldest op, skipping what is already sent, up to
         * the first one that goes sealed. */
        for (uint32_t i = ep->txq_tail; i != ep->txq_head && niov + 2 <= CFX_TCP_IOV_MAX;
             i = (i + 1) % CFX_TCP_TXQ_SLOTS) {
            struct cfx__tcp_op *op = &ep->txq[i];
            if (unlikely(op->sealed))
                break;
            size_t plen = op->total - HDR_SIZE;
            if (off < HDR_SIZE) {
                iov[niov].iov_base = (uint8_t *)&op->hdr + off;
                iov[niov++].iov_len = HDR_SIZE - off;
                off = 0;
            } else {
                off -= HDR_SIZE;
            }
            if (plen > off) {
                iov[niov].iov_base = (void *)(op->payload + off);
                iov[niov++].iov_len = plen - off;
            }
            want += op->total - (i == ep->txq_tail ? ep->tx_off : 0);
            off = 0;
        }
        msg.msg_iovlen = (size_t)niov;

        ssize_t n = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            tx_failed(ep, errno);
            return;
        }
        tx_retire(ep, (size_t)n);
        if ((size_t)n < want)
            break; /* socket buffer full */
    }

    /* Ask for EPOLLOUT only while something waits for room. */
    cfx__tcp_epoll_set(ep, cfx__tcp_ep_events(ep));
}

/* Queue an op; kick the socket when the queue was idle (lowest latency),
 * or, inside a batch, once CFX_TCP_BATCH_MAX frames wait. */
static inline void ep_post(struct cfx__tcp_ep *ep)
{
    bool idle = ep->txq_tail == ep->txq_head;
    struct cfx__tcp_op *op = &ep->txq[ep->txq_head];
    op->sealed = ep->tx_sealing;
    if (unlikely(ep->tx_mark_next)) {
        /* the last frame in clear: the peer opens records after it */
        op->hdr.flags |= CFX_TCP_F_LAST_CLEAR;
        ep->tx_mark_next = false;
        ep->tx_sealing = true;
    }
    ep->txq_head = (ep->txq_head + 1) % CFX_TCP_TXQ_SLOTS;
    ep->tx_unreported++;
    if (unlikely(ep->state != CFX_TCP_EP_OPEN))
        return; /* sent once connected */
    if (ep->tx_batch) {
        if (++ep->tx_held < CFX_TCP_BATCH_MAX)
            return;
        ep->tx_held = 0;
        ep_tx_progress(ep);
        return;
    }
    if (idle)
        ep_tx_progress(ep);
}

int cfx__tcp_ep_batch(struct cfx_tp_ep *tp_ep, bool on)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (unlikely(!tp_ep))
        return CFX_ERR_INVALID;
    struct cfx__tcp_ep *ep = cfx__tcp_ep_of(tp_ep);
    ep->tx_batch = on;
    if (!on && ep->tx_held) {
        ep->tx_held = 0;
        if (ep->state == CFX_TCP_EP_OPEN)
            ep_tx_progress(ep);
    }
    return CFX_OK;
}

int cfx__tcp_ep_write(struct cfx_tp_ep *tp_ep, struct cfx_tp_mr *tp_mr, uint64_t loff,
                      const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len, uint32_t imm,
                      uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    struct cfx__tcp_rkey k;

    if (unlikely(!tp_ep || !tp_mr || !rdesc))
        return CFX_ERR_INVALID;
    struct cfx__tcp_ep *ep = cfx__tcp_ep_of(tp_ep);
    if (unlikely(ep->super.status != CFX_OK))
        return ep->super.status;
    if (unlikely(tp_mr->iface != tp_ep->iface || loff > tp_mr->len || len > tp_mr->len - loff ||
                 len > CFX_TP_WRITE_MAX || rdesc->len != sizeof(k) ||
                 rdesc->data[0] != CFX_TCP_RDESC_TAG))
        return CFX_ERR_INVALID;
    if (unlikely(ep->tx_unreported >= CFX_TCP_TXQ_DEPTH))
        return CFX_ERR_AGAIN;
    if (unlikely(ep->tx_mark_next))
        return CFX_ERR_INVALID; /* the last clear frame is a send (ep_seal) */

    /* The remote bounds are the receiver's to check (as an RDMA responder
     * would): a bad write fails the connection on both sides. */
    memcpy(&k, rdesc->data, sizeof(k));
    struct cfx__tcp_op *op = &ep->txq[ep->txq_head];
    op->hdr = (struct cfx__tcp_hdr){
        .type = CFX_TCP_FRAME_WRITE,
        .len = htole32((uint32_t)len),
        .imm = htole32(imm),
        .key_lo = k.key_lo, /* already little endian */
        .key_idx = k.idx,
        .key_hi = k.key_hi,
        .off = htole64(roff),
    };
    op->payload = (const uint8_t *)tp_mr->addr + loff;
    op->mr = cfx__tcp_mr_of(tp_mr);
    op->mr->tx_busy++;
    op->sbuf_cost = 0;
    op->comp_type = CFX_TP_COMP_WRITE;
    op->wr_id = wr_id;
    op->total = HDR_SIZE + len;
    ep_post(ep);
    return CFX_OK;
}

int cfx__tcp_ep_send(struct cfx_tp_ep *tp_ep, const void *buf, size_t len, uint64_t wr_id)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    uint32_t cost = 0;
    uint8_t *dst;

    if (unlikely(!tp_ep || (!buf && len)))
        return CFX_ERR_INVALID;
    struct cfx__tcp_ep *ep = cfx__tcp_ep_of(tp_ep);
    if (unlikely(ep->super.status != CFX_OK))
        return ep->super.status;
    if (unlikely(len > CFX_TP_SEND_MAX))
        return CFX_ERR_TOO_BIG;
    if (unlikely(ep->tx_unreported >= CFX_TCP_TXQ_DEPTH))
        return CFX_ERR_AGAIN;
    dst = sbuf_alloc(ep, (uint32_t)len, &cost);
    if (unlikely(!dst))
        return CFX_ERR_AGAIN;
    if (len)
        memcpy(dst, buf, len);

    struct cfx__tcp_op *op = &ep->txq[ep->txq_head];
    op->hdr = (struct cfx__tcp_hdr){ .type = CFX_TCP_FRAME_SEND, .len = htole32((uint32_t)len) };
    op->payload = dst;
    op->mr = NULL;
    op->sbuf_cost = cost;
    op->comp_type = CFX_TP_COMP_SEND;
    op->wr_id = wr_id;
    op->total = HDR_SIZE + len;
    ep_post(ep);
    return CFX_OK;
}

/* --- receive ------------------------------------------------------------------------ */

/* Tell the peer why we drop it (best effort, only at a frame boundary). */
static void send_error_frame(struct cfx__tcp_ep *ep, int status)
{
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_ERROR, .imm = htole32((uint32_t)status) };
    send_raw_frame(ep, &h);
}

/* A whole header arrived: check it and set up its payload.  false: ep failed. */
static bool rx_header(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_hdr *h = &ep->rx_hdr;
    struct cfx__tcp_hdr wire = *h;
    const char *why = "bad header";
    int type = cfx__tcp_hdr_check(&wire, sizeof(wire), ep->state == CFX_TCP_EP_HELLO_WAIT, h,
                                  &why);

    ep->rx_got = 0;
    ep->rx_dst = NULL;

    if (unlikely(ep->state == CFX_TCP_EP_HELLO_WAIT)) {
        if (type < 0) {
            CFX_LOG(WARN, TCP, "iface %s: connection from %s did not start with HELLO; dropped",
                    ep->iface->addr, ep->addr);
            ep_fail(ep, CFX_ERR_PROTO);
            return false;
        }
        ep->rx_dst = (uint8_t *)&ep->hello;
        ep->rx_state = CFX_TCP_RX_PAYLOAD;
        return true;
    }

    if (unlikely(ep->rx_seal != CFX_TCP_RX_CLEAR && type >= 0)) {
        /* the mark comes once, where both sides agreed to seal, on a clear
         * frame; and after ep_seal the next clear frame must carry it */
        bool mark = h->flags & CFX_TCP_F_LAST_CLEAR;
        bool bye = h->type == CFX_TCP_FRAME_BYE || h->type == CFX_TCP_FRAME_ERROR;
        if (mark ? ep->rx_seal != CFX_TCP_RX_SEAL_EXPECT
                 : ep->rx_seal == CFX_TCP_RX_SEAL_EXPECT && !bye) {
            EP_FAIL(ep, ERR, CFX_ERR_PROTO, "%s", mark ? "a second last-clear mark"
                                                       : "a frame in clear after sealing "
                                                         "was agreed");
            return false;
        }
    }

    switch (h->type) {
    case CFX_TCP_FRAME_WRITE: {
        /* checked before a byte is read: a refused write lands nothing */
        const char *gwhy = why;
        struct cfx__tcp_mr *mr = type < 0 ? NULL : cfx__tcp_mr_lookup(ep->iface, ep, h, &gwhy);
        if (unlikely(!mr) && type >= 0 && ep->rx_seal == CFX_TCP_RX_CLEAR &&
            cfx__tp_revoked_has(&ep->iface->revoked, (uint64_t)h->key_hi << 32 | h->key_lo,
                                ep->serial)) {
            /* a write the receiver gave up on while it was on its way: its
             * bytes go nowhere, and the endpoint lives on (tpbase.h) */
            atomic_fetch_add_explicit(&ep->iface->n_late_dropped, 1, memory_order_relaxed);
            CFX_LOG(DEBUG, TCP, "iface %s: %s wrote [%llu, +%u) under grant %u revoked lately: "
                    "dropped", ep->iface->addr, ep->super.peer_name,
                    (unsigned long long)h->off, h->len, h->key_idx);
            ep->rx_state = CFX_TCP_RX_DISCARD;
            return true;
        }
        if (unlikely(!mr)) {
            atomic_fetch_add_explicit(&ep->iface->n_grant_refused, 1, memory_order_relaxed);
            send_error_frame(ep, CFX_ERR_PROTO);
            EP_FAIL(ep, ERR, CFX_ERR_PROTO, "write [%llu, +%u) into registration %u refused: %s",
                    (unsigned long long)h->off, h->len, h->key_idx, gwhy);
            return false;
        }
        ep->rx_dst = (uint8_t *)mr->super.addr + h->off;
        ep->rx_mr = mr;
        mr->rx_busy++;
        ep->rx_state = CFX_TCP_RX_PAYLOAD;
        return true;
    }
    case CFX_TCP_FRAME_SEND:
        if (unlikely(type < 0)) {
            EP_FAIL(ep, ERR, CFX_ERR_PROTO, "control message of %u bytes (max %u)", h->len,
                    CFX_TP_SEND_MAX);
            return false;
        }
        ep->rx_state = CFX_TCP_RX_PAYLOAD; /* rx_dst: a slot, taken when free */
        return true;
    case CFX_TCP_FRAME_ERROR: {
        int st = (int32_t)h->imm;
        if (st >= 0 || st <= CFX_STATUS_LAST)
            st = CFX_ERR_PROTO;
        EP_FAIL(ep, WARN, st, "peer reported %s and dropped the connection", cfx_errname(st));
        return false;
    }
    case CFX_TCP_FRAME_BYE:
        EP_FAIL(ep, INFO, CFX_ERR_CLOSED, "peer closed the endpoint");
        return false;
    default: EP_FAIL(ep, ERR, CFX_ERR_PROTO, "unexpected frame type %u", h->type); return false;
    }
}

/* The peer's last clear frame was parsed: what follows in the buffer is
 * its first sealed bytes.  They move to the record buffer, and wait there
 * for the keys unless ep_seal gave them already. */
static void rx_switch(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = cfx__tcp_seal_get(ep);
    if (!s) {
        EP_FAIL(ep, ERR, CFX_ERR_NOMEM, "out of memory for sealing");
        return;
    }
    uint32_t rest = ep->rxb_len - ep->rxb_off; /* <= CFX_TCP_RXBUF_SIZE: fits */
    memcpy(s->srx, ep->rxbuf + ep->rxb_off, rest);
    s->srx_off = 0;
    s->srx_len = rest;
    ep->rxb_off = ep->rxb_len = 0;
    if (ep->rx_seal == CFX_TCP_RX_SEAL_EXPECT) {
        ep->rx_seal = CFX_TCP_RX_SEALED;
    } else {
        ep->rx_seal = CFX_TCP_RX_SEAL_WAIT;
        cfx__tcp_epoll_set(ep, cfx__tcp_ep_events(ep));
    }
}

/* The whole payload arrived. */
static void rx_frame_done(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_hdr *h = &ep->rx_hdr;
    struct cfx_tp_completion *c;

    ep->rx_state = CFX_TCP_RX_HDR;
    ep->rx_got = 0;

    switch (h->type) {
    case CFX_TCP_FRAME_WRITE:
        rx_release_mr(ep);
        c = cfx__tp_cq_push(&ep->iface->cq);
        c->type = CFX_TP_COMP_WRITE_IMM;
        c->ep = &ep->super;
        c->imm = h->imm;
        c->len = h->len;
        ep->rx_unreported++;
        break;
    case CFX_TCP_FRAME_SEND:
        c = cfx__tp_cq_push(&ep->iface->cq);
        c->type = CFX_TP_COMP_RECV;
        c->ep = &ep->super;
        c->len = h->len;
        c->data = ep->rx_dst;
        ep->rx_unreported++;
        if (unlikely(h->flags & CFX_TCP_F_LAST_CLEAR))
            rx_switch(ep);
        break;
    case CFX_TCP_FRAME_HELLO: {
        struct cfx__tcp_hello *hl = &ep->hello;
        struct cfx__tcp_hello wire = *hl;
        if (cfx__tcp_hello_check(&wire, sizeof(wire), hl) != CFX_OK) {
            CFX_LOG(WARN, TCP,
                    "iface %s: connection from %s: bad HELLO (magic %08x version %u); dropped",
                    ep->iface->addr, ep->addr, le32toh(hl->magic), le32toh(hl->version));
            ep_fail(ep, CFX_ERR_VERSION);
            return;
        }
        ep->super.peer_node = le32toh(hl->node_id);
        if (hl->addr[0])
            snprintf(ep->addr, sizeof(ep->addr), "%s", hl->addr);
        set_peer_name(ep);
        ep->state = CFX_TCP_EP_OPEN;
        push_comp(ep, CFX_TP_COMP_ACCEPT, CFX_OK);
        CFX_LOG(DEBUG, TCP, "iface %s: accepted %s", ep->iface->addr, ep->super.peer_name);
        break;
    }
    }
}

/* A free RECV slot, or NULL while the user still holds all of them. */
static inline uint8_t *rx_slot_take(struct cfx__tcp_ep *ep)
{
    if (ep->rx_slot_head - ep->rx_slot_tail == CFX_TCP_RX_SLOTS)
        return NULL;
    struct cfx__tcp_rx_slot *s = &ep->rx_slots[ep->rx_slot_head++ % CFX_TCP_RX_SLOTS];
    s->returned_gen = 0;
    return s->buf;
}

/* Free slots returned before this poll (the user's view of them ended). */
static inline void rx_slots_reclaim(struct cfx__tcp_ep *ep)
{
    while (ep->rx_slot_tail != ep->rx_slot_ret) {
        struct cfx__tcp_rx_slot *s = &ep->rx_slots[ep->rx_slot_tail % CFX_TCP_RX_SLOTS];
        if (!s->returned_gen || s->returned_gen >= ep->iface->poll_gen)
            break;
        ep->rx_slot_tail++;
    }
}

/* Read into @p iov: > 0 bytes, 0 would block, -1 ep failed. */
static inline ssize_t rx_readv(struct cfx__tcp_ep *ep, struct iovec *iov, int n)
{
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)n };
    for (;;) {
        /* one buffer: recv(), the cheaper call, on the small frames' path */
        ssize_t got = n == 1 ? recv(ep->fd, iov->iov_base, iov->iov_len, MSG_DONTWAIT)
                             : recvmsg(ep->fd, &msg, MSG_DONTWAIT);
        if (likely(got > 0))
            return got;
        if (got == 0) {
            EP_FAIL(ep, WARN, CFX_ERR_PEER_FAILED, "connection closed by peer");
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        EP_FAIL(ep, WARN, sock_errno_status(errno), "recv: %s", strerror(errno));
        return -1;
    }
}

static inline ssize_t rx_read(struct cfx__tcp_ep *ep, void *buf, size_t len)
{
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    return rx_readv(ep, &iov, 1);
}

/*
 * Parse the frames buffered in rxbuf.  true: the buffer is used up; false:
 * stop (the ep failed, or the user must poll first: then the ep is on the
 * backlog with its bytes kept).
 */
static bool rx_parse(struct cfx__tcp_ep *ep)
{
    while (ep->rxb_off < ep->rxb_len) {
        const uint8_t *p = ep->rxbuf + ep->rxb_off;
        size_t avail = ep->rxb_len - ep->rxb_off, n;

        switch (ep->rx_state) {
        case CFX_TCP_RX_HDR:
            /* Stop while the user holds too many receive completions. */
            if (unlikely(ep->rx_unreported >= CFX_TCP_RX_MAX)) {
                rx_backlog_add(ep);
                return false;
            }
            n = CFX_MIN(HDR_SIZE - ep->rx_got, avail);
            memcpy((uint8_t *)&ep->rx_hdr + ep->rx_got, p, n);
            ep->rxb_off += (uint32_t)n;
            ep->rx_got += n;
            if (ep->rx_got < HDR_SIZE)
                break; /* the rest of the header is still in the socket */
            if (!rx_header(ep))
                return false;
            if (ep->rx_hdr.len == 0 && ep->rx_state == CFX_TCP_RX_DISCARD) {
                ep->rx_state = CFX_TCP_RX_HDR; /* an empty write dropped: nothing to read */
            } else if (ep->rx_hdr.len == 0) {
                rx_frame_done(ep);
                if (ep->state == CFX_TCP_EP_FAILED)
                    return false;
            }
            break;

        case CFX_TCP_RX_PAYLOAD:
            if (!ep->rx_dst) {
                rx_slots_reclaim(ep);
                if (!(ep->rx_dst = rx_slot_take(ep))) {
                    rx_backlog_add(ep); /* poll() frees slots, then resumes us */
                    return false;
                }
            }
            n = CFX_MIN(ep->rx_hdr.len - ep->rx_got, avail);
            memcpy(ep->rx_dst + ep->rx_got, p, n);
            ep->rxb_off += (uint32_t)n;
            ep->rx_got += n;
            if (ep->rx_got == ep->rx_hdr.len) {
                rx_frame_done(ep);
                if (ep->state == CFX_TCP_EP_FAILED)
                    return false;
            }
            break;

        case CFX_TCP_RX_DISCARD:
            n = CFX_MIN(ep->rx_hdr.len - ep->rx_got, avail);
            ep->rxb_off += (uint32_t)n;
            ep->rx_got += n;
            if (ep->rx_got == ep->rx_hdr.len) {
                ep->rx_state = CFX_TCP_RX_HDR;
                ep->rx_got = 0;
            }
            break;
        }
    }
    ep->rxb_off = ep->rxb_len = 0;
    if (unlikely(ep->rx_backlogged)) {
        /* resumed by its socket before poll() got to it: nothing waits */
        cfx_list_del(&ep->rx_link);
        ep->rx_backlogged = false;
    }
    return true;
}

/* The rest of a large payload, straight from the socket into its
 * destination, and in the same call what follows it into rxbuf (the next
 * frame's header: a chunk cost a read for its payload and one for the next
 * header).  true: go on (rxbuf may hold bytes to parse); false: the socket
 * is empty (what came is parsed) or the ep failed. */
static bool rx_direct(struct cfx__tcp_ep *ep, size_t left)
{
    ssize_t n;

    if (ep->rx_state == CFX_TCP_RX_DISCARD) {
        size_t want = CFX_MIN(left, CFX_TCP_DISCARD_SIZE);
        if ((n = rx_read(ep, ep->iface->discard, want)) <= 0)
            return false;
        ep->rx_got += (size_t)n;
        if (ep->rx_got == ep->rx_hdr.len) {
            ep->rx_state = CFX_TCP_RX_HDR;
            ep->rx_got = 0;
        }
        return (size_t)n == want;
    }
    struct iovec iov[2] = {
        { .iov_base = ep->rx_dst + ep->rx_got, .iov_len = left },
        { .iov_base = ep->rxbuf, .iov_len = CFX_TCP_RXBUF_SIZE },
    };
    if ((n = rx_readv(ep, iov, 2)) <= 0)
        return false;
    ep->rx_got += CFX_MIN((size_t)n, left);
    if ((size_t)n < left)
        return false; /* short read: the socket is empty */
    /* in rxbuf before the frame ends: a last-clear mark moves what follows
     * it to the record buffer (rx_switch) */
    const size_t behind = (size_t)n - left;
    ep->rxb_off = 0;
    ep->rxb_len = (uint32_t)behind;
    rx_frame_done(ep);
    if (ep->state == CFX_TCP_EP_FAILED)
        return false;
    if (behind < CFX_TCP_RXBUF_SIZE) {
        /* short read: the socket is empty; parse what came and stop */
        if (rx_parse(ep) && unlikely(ep->rx_seal == CFX_TCP_RX_SEALED))
            ep_rx_sealed(ep); /* records came right behind the mark */
        return false;
    }
    return true;
}

static void ep_rx_progress(struct cfx__tcp_ep *ep)
{
    for (;;) {
        if (unlikely(ep->rx_seal >= CFX_TCP_RX_SEAL_WAIT)) {
            ep_rx_sealed(ep);
            return;
        }
        if (!rx_parse(ep))
            return;
        if (unlikely(ep->rx_seal >= CFX_TCP_RX_SEAL_WAIT))
            continue; /* the rest of the stream is records */
        /* rxbuf is empty: read the socket again. */
        if (ep->rx_state != CFX_TCP_RX_HDR) {
            size_t left = ep->rx_hdr.len - ep->rx_got;
            /* Only a WRITE (or a discarded one) has a buffer's worth left:
             * SEND and HELLO payloads are smaller than the buffer. */
            if (left >= CFX_TCP_RXBUF_SIZE) {
                if (!rx_direct(ep, left))
                    return;
                continue;
            }
        } else if (unlikely(ep->rx_unreported >= CFX_TCP_RX_MAX)) {
            return; /* read on once the user polled */
        }
        ssize_t n = rx_read(ep, ep->rxbuf, CFX_TCP_RXBUF_SIZE);
        if (n <= 0)
            return;
        ep->rxb_off = 0;
        ep->rxb_len = (uint32_t)n;
        if ((size_t)n < CFX_TCP_RXBUF_SIZE) {
            /* Short read: the socket is empty; parse and stop (epoll says
             * when more arrives). */
            if (rx_parse(ep) && unlikely(ep->rx_seal == CFX_TCP_RX_SEALED))
                ep_rx_sealed(ep); /* records came right behind the mark */
            return;
        }
    }
}

/* A record that cannot be opened: counted, and the connection ends. */
static void rx_record_refused(struct cfx__tcp_ep *ep, int status, const char *why)
{
    atomic_fetch_add_explicit(&ep->iface->n_seal_refused, 1, memory_order_relaxed);
    EP_FAIL(ep, ERR, status, "sealed record %llu refused: %s",
            (unsigned long long)ep->seal->rx.seq, why);
}

/*
 * Sealed receive: open the peer's records one at a time into the receive
 * buffer and parse each before the next (rx_parse stops, and the ep waits on
 * the backlog, exactly as in clear).  Nothing is parsed that did not open.
 */
static void ep_rx_sealed(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = ep->seal;
    bool empty = false;

    if (ep->rx_seal == CFX_TCP_RX_SEAL_WAIT)
        return; /* ep_seal resumes us */
    for (;;) {
        if (!rx_parse(ep))
            return;
        uint32_t have = s->srx_len - s->srx_off;
        if (have >= 4) {
            const uint8_t *rec = s->srx + s->srx_off;
            uint32_t len;
            memcpy(&len, rec, 4);
            len = le32toh(len);
            if (unlikely(len == 0 || len > CFX_TCP_REC_MAX)) {
                rx_record_refused(ep, CFX_ERR_AUTH, "impossible record length");
                return;
            }
            if (have >= len + CFX_TCP_REC_OVH) {
                int rc = cfx__seal_open(&s->rx, rec, 4, rec + 4, len, ep->rxbuf, rec + 4 + len);
                if (unlikely(rc != CFX_OK)) {
                    rx_record_refused(ep, rc, rc == CFX_ERR_AUTH
                                                  ? "it fails its integrity check (altered, "
                                                    "replayed or sealed with another key)"
                                                  : "the cipher failed");
                    return;
                }
                s->srx_off += len + CFX_TCP_REC_OVH;
                ep->rxb_off = 0;
                ep->rxb_len = len;
                continue;
            }
        }
        if (empty)
            return; /* epoll says when more arrives */
        if (s->srx_off) {
            memmove(s->srx, s->srx + s->srx_off, have);
            s->srx_off = 0;
            s->srx_len = have;
        }
        size_t room = CFX_TCP_SEAL_BUF - s->srx_len;
        ssize_t n = rx_read(ep, s->srx + s->srx_len, room);
        if (n <= 0)
            return;
        s->srx_len += (uint32_t)n;
        empty = (size_t)n < room;
    }
}

void cfx__tcp_ep_rx_resume(struct cfx__tcp_ep *ep) { rx_backlog_add(ep); }

void cfx__tcp_rx_backlog_run(struct cfx__tcp_iface *iface)
{
    struct cfx_list todo;

    /* Take the list as it is: an ep that stops again goes back on the
     * iface's list for the next poll, not on this walk. */
    cfx_list_init(&todo);
    while (!cfx_list_empty(&iface->rx_backlog)) {
        struct cfx_list *pos = iface->rx_backlog.next;
        cfx_list_del(pos);
        cfx_list_add_tail(pos, &todo);
    }
    while (!cfx_list_empty(&todo)) {
        struct cfx__tcp_ep *ep = cfx_list_entry(todo.next, struct cfx__tcp_ep, rx_link);
        cfx_list_del(&ep->rx_link);
        ep->rx_backlogged = false;
        if (ep->state == CFX_TCP_EP_OPEN || ep->state == CFX_TCP_EP_HELLO_WAIT)
            ep_rx_progress(ep);
    }
}

void cfx__tcp_ep_mr_gone(struct cfx__tcp_ep *ep, struct cfx__tcp_mr *mr)
{
    if (ep->rx_mr == mr) {
        /* the receiver gave the transfer up (a deadline, a freed request):
         * no fault of the writer's, so no warning */
        CFX_LOG(DEBUG, TCP,
                "iface %s: region deregistered while %s writes into it; "
                "dropping the rest of that write",
                ep->iface->addr, ep->super.peer_name);
        rx_release_mr(ep);
        ep->rx_state = CFX_TCP_RX_DISCARD;
    }
    for (uint32_t i = ep->txq_tail; i != ep->txq_head; i = (i + 1) % CFX_TCP_TXQ_SLOTS) {
        if (ep->txq[i].mr == mr) {
            EP_FAIL(ep, ERR, CFX_ERR_CANCELED,
                    "source region %p deregistered with writes from it still queued",
                    mr->super.addr);
            return;
        }
    }
}

void cfx__tcp_ep_progress(struct cfx__tcp_ep *ep, uint32_t events)
{
    if (unlikely(ep->state == CFX_TCP_EP_FAILED))
        return;
    if (unlikely(ep->state == CFX_TCP_EP_CONNECTING)) {
        ep_connect_done(ep);
        return;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        ep_rx_progress(ep);
        if (ep->state == CFX_TCP_EP_FAILED)
            return;
    }
    if (events & (EPOLLOUT | EPOLLERR))
        ep_tx_progress(ep);
}

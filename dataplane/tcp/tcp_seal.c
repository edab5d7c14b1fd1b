/*
 * tcp transport: sealing state of an endpoint (CFX_SECURE; the record
 * format is in tcp.h, the record loops in tcp_ep.c).
 *
 * The switch from clear to sealed is decided by the frames themselves, so
 * neither side can read the other's sealed bytes as clear ones or the
 * reverse: each side's last clear frame says so in its header.  The engine
 * calls ep_seal before it posts that frame (connector: its proof; acceptor:
 * its answer).  On the receiving side, the peer's mark may come before the
 * keys (the acceptor gets the connector's proof, and must verify it before
 * it can derive them): the parser stops right after the marked frame, keeps
 * what follows unread, and the ep_seal call resumes it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include <openssl/crypto.h>

#include "dataplane/common/log.h"
#include "tcp.h"

struct cfx__tcp_seal *cfx__tcp_seal_get(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = ep->seal;
    if (s)
        return s;
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->stx = malloc(CFX_TCP_SEAL_BUF);
    s->srx = malloc(CFX_TCP_SEAL_BUF);
    if (!s->stx || !s->srx) {
        free(s->stx);
        free(s->srx);
        free(s);
        return NULL;
    }
    ep->seal = s;
    return s;
}

void cfx__tcp_seal_free(struct cfx__tcp_ep *ep)
{
    struct cfx__tcp_seal *s = ep->seal;
    if (!s)
        return;
    if (s->keyed) {
        cfx__seal_dir_fini(&s->tx);
        cfx__seal_dir_fini(&s->rx);
    }
    /* what was sealed or opened here is the peer's and ours: wipe it */
    OPENSSL_cleanse(s->stx, CFX_TCP_SEAL_BUF);
    OPENSSL_cleanse(s->srx, CFX_TCP_SEAL_BUF);
    free(s->stx);
    free(s->srx);
    free(s);
    ep->seal = NULL;
}

uint32_t cfx__tcp_ep_events(const struct cfx__tcp_ep *ep)
{
    bool tx = ep->txq_tail != ep->txq_head;
    /* waiting for keys: leave the peer's sealed bytes in the socket (the
     * descriptor stays registered for errors and hang-ups) */
    if (ep->rx_seal == CFX_TCP_RX_SEAL_WAIT)
        return tx ? EPOLLOUT : EPOLLERR;
    return tx ? EPOLLIN | EPOLLOUT : EPOLLIN;
}

int cfx__tcp_ep_seal(struct cfx_tp_ep *tp_ep, int mode, const struct cfx_seal_keys *keys,
                     bool connector)
{
    CFX_TP_THREAD_CHECK(tp_ep ? tp_ep->iface : NULL);
    if (!tp_ep || !keys)
        return cfx__err(CFX_ERR_INVALID, "tcp ep_seal: NULL argument");
    struct cfx__tcp_ep *ep = cfx__tcp_ep_of(tp_ep);
    if (ep->super.status != CFX_OK)
        return ep->super.status;
    if (ep->state != CFX_TCP_EP_OPEN || ep->tx_mark_next || ep->tx_sealing ||
        (ep->seal && ep->seal->keyed))
        return cfx__err(CFX_ERR_INVALID, "tcp ep_seal: %s is not an open endpoint in clear",
                        ep->super.peer_name);
    struct cfx__tcp_seal *s = cfx__tcp_seal_get(ep);
    if (!s)
        return cfx__err(CFX_ERR_NOMEM, "tcp: out of memory for sealing %s",
                        ep->super.peer_name);
    int me = connector ? CFX_SEAL_DIR_CONNECTOR : CFX_SEAL_DIR_ACCEPTOR;
    int rc = cfx__seal_dir_init(&s->tx, mode, keys, me, true);
    if (rc == CFX_OK) {
        rc = cfx__seal_dir_init(&s->rx, mode, keys, !me, false);
        if (rc != CFX_OK)
            cfx__seal_dir_fini(&s->tx);
    }
    if (rc != CFX_OK)
        return rc;
    s->keyed = true;
    ep->tx_mark_next = true;
    if (ep->rx_seal == CFX_TCP_RX_SEAL_WAIT) {
        /* the peer's sealed bytes wait (some in srx, the rest in the socket) */
        ep->rx_seal = CFX_TCP_RX_SEALED;
        cfx__tcp_epoll_set(ep, cfx__tcp_ep_events(ep));
        cfx__tcp_ep_rx_resume(ep);
    } else {
        ep->rx_seal = CFX_TCP_RX_SEAL_EXPECT;
    }
    CFX_LOG(DEBUG, TCP, "iface %s: %s sealed (%s)", ep->iface->addr, ep->super.peer_name,
            cfx__seal_mode_name(mode));
    return CFX_OK;
}

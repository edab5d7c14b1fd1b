/*
 * tcp transport: the iface (listening socket, epoll set, completion queue,
 * progress) and the ops table.
 */
#include <arpa/inet.h>
#include <errno.h>
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

#define ACCEPT_BURST   16 /* connections accepted per poll() */
#define CQ_INITIAL     64

static void ep_bury(struct cfx_list *link)
{
    cfx__tcp_ep_destroy(cfx_list_entry(link, struct cfx__tcp_ep, link));
}

/* --- completion queue ------------------------------------------------------ */

/* Pop up to @p max completions, releasing what each one held. */
static int cq_drain(struct cfx__tcp_iface *iface, struct cfx_tp_completion *out, int max)
{
    struct cfx_tp_completion *c;
    int n = 0;
    while (n < max && (c = cfx__tp_cq_head(&iface->cq))) {
        struct cfx__tcp_ep *ep = cfx__tcp_ep_of(c->ep);

        switch (c->type) {
        case CFX_TP_COMP_WRITE:
        case CFX_TP_COMP_SEND: ep->tx_unreported--; break;
        case CFX_TP_COMP_RECV:
            /* an empty message is completed from its header and took no
             * slot: returning one for it would put the ring out of step */
            if (c->len)
                ep->rx_slots[ep->rx_slot_ret++ % CFX_TCP_RX_SLOTS].returned_gen = iface->poll_gen;
            ep->rx_unreported--;
            break;
        case CFX_TP_COMP_WRITE_IMM: ep->rx_unreported--; break;
        default: break;
        }
        out[n++] = *c;
        cfx__tp_cq_pop(&iface->cq);
    }
    return n;
}

/* --- iface ------------------------------------------------------------------ */

int cfx__tcp_epoll_set(struct cfx__tcp_ep *ep, uint32_t events)
{
    if (ep->epoll_events == events)
        return CFX_OK;
    struct epoll_event ev = { .events = events, .data.ptr = ep };
    int op = ep->epoll_events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(ep->iface->epfd, op, ep->fd, &ev) < 0)
        return cfx__err(cfx__status_from_errno(errno), "tcp ep %s: epoll_ctl: %s",
                        ep->super.peer_name, strerror(errno));
    ep->epoll_events = events;
    return CFX_OK;
}

/*
 * Strangers.  Anyone may connect to the data port, and a connection costs a
 * descriptor and an endpoint's buffers until its peer proves the token (the
 * engine's handshake ends in ep_authorize) or its deadline passes (10 s for
 * the HELLO, CFX_TCP_HELLO_MS, and as long again for the proof,
 * CFX_CONN_AUTH_MS).  So, as the coordinator does (control/coord.c):
 *
 *  - connections not yet authorized are capped, of all sources
 *    (max_unauth) and of one address (max_unauth_per_ip); at a cap the
 *    oldest of them (of the newcomer's address at the second) is closed
 *    for the newcomer rather than the newcomer refused: it proved nothing
 *    for the longest time, while a refusal would let a flood lock every
 *    token holder out until its connections' deadlines.  A token holder's
 *    handshake takes a round trip or two, so a flood must open a whole
 *    cap's worth within it to push it out;
 *  - out of descriptors (EMFILE/ENFILE), the pending connection keeps the
 *    level-triggered listener readable and the progress thread would spin
 *    (it logged 3.4 million lines in 20 s): the oldest unauthorized
 *    connection is closed for it as at a cap; with none, it is accepted on
 *    the reserve fd and closed (cfx__accept_shed); with no reserve either,
 *    accepting pauses for ACCEPT_PAUSE_MS;
 *  - each of these lines is written at most once a second (CFX_RATELOG).
 *
 * The caps are small, so the oldest of an address is found by walking the
 * list (no hash of addresses as the coordinator's thousands need).
 */
#define ACCEPT_PAUSE_MS 100
#define PAUSE_TEXT      "100 ms" /* ACCEPT_PAUSE_MS, in the log line */

/* Close the oldest unauthorized ep (of @p ip unless @p any) when the cap it
 * reached says so.  Returns whether one was closed. */
static bool unauth_make_room(struct cfx__tcp_iface *iface, uint32_t ip, uint64_t now)
{
    struct cfx__tcp_ep *oldest_ip = NULL, *old = NULL;
    const char *cap = NULL, *why;
    uint32_t from = 0, limit = 0;
    struct cfx_list *pos;

    cfx_list_for_each(pos, &iface->unauth) {
        struct cfx__tcp_ep *ep = cfx_list_entry(pos, struct cfx__tcp_ep, unauth_link);
        if (ep->ip == ip && from++ == 0)
            oldest_ip = ep;
    }
    if (from >= iface->max_unauth_per_ip) {
        old = oldest_ip;
        cap = "CFX_TCP_MAX_UNAUTH_PER_IP";
        limit = iface->max_unauth_per_ip;
        why = "the oldest connection of its address not authenticated, closed for a newer one";
    } else if (iface->nunauth >= iface->max_unauth) {
        old = cfx_list_entry(iface->unauth.next, struct cfx__tcp_ep, unauth_link);
        cap = "CFX_TCP_MAX_UNAUTH";
        limit = iface->max_unauth;
        why = "the oldest connection not authenticated, closed for a newer one";
    }
    if (!old)
        return false;
    CFX_RATELOG(&iface->evict_log, TCP, now, "iface %s: closing %s: %s (%u) reached, and it is "
                "the oldest not authenticated (%llu ms)", iface->addr, old->addr, cap, limit,
                (unsigned long long)((now - old->accepted_ns) / 1000000ull));
    atomic_fetch_add_explicit(&iface->n_unauth_evicted, 1, memory_order_relaxed);
    cfx__tcp_ep_evict(old, why);
    return true;
}

static void listen_events(struct cfx__tcp_iface *iface, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.ptr = NULL };
    epoll_ctl(iface->epfd, EPOLL_CTL_MOD, iface->listen_fd, &ev);
}

/* accept() failed with EMFILE/ENFILE (@p err).  Returns whether to accept
 * again: a descriptor was freed. */
static bool accept_out_of_fds(struct cfx__tcp_iface *iface, int err, uint64_t now)
{
    if (iface->nunauth) {
        struct cfx__tcp_ep *old =
            cfx_list_entry(iface->unauth.next, struct cfx__tcp_ep, unauth_link);
        CFX_RATELOG(&iface->evict_log, TCP, now, "iface %s: closing %s: out of file "
                    "descriptors (%s), and it is the oldest not authenticated (%llu ms)",
                    iface->addr, old->addr, strerror(err),
                    (unsigned long long)((now - old->accepted_ns) / 1000000ull));
        atomic_fetch_add_explicit(&iface->n_unauth_evicted, 1, memory_order_relaxed);
        cfx__tcp_ep_evict(old, "the oldest connection not authenticated, closed for a newer "
                               "one: out of file descriptors");
        return true;
    }
    bool shed = cfx__accept_shed(iface->listen_fd, &iface->spare_fd);
    if (shed) {
        atomic_fetch_add_explicit(&iface->n_accept_shed, 1, memory_order_relaxed);
    } else {
        listen_events(iface, 0);
        iface->accept_resume = now + ACCEPT_PAUSE_MS * 1000000ull;
    }
    CFX_RATELOG(&iface->emfile_log, TCP, now, "iface %s is out of file descriptors (%s, none "
                "waiting to authenticate): %s", iface->addr, strerror(err),
                shed ? "shed a new connection" : "accepting paused for " PAUSE_TEXT);
    return shed;
}

/* On the poll's tick: accepting again after a pause, lines a flood held. */
static void accept_tick(struct cfx__tcp_iface *iface, uint64_t now)
{
    if (iface->accept_resume && now >= iface->accept_resume) {
        if (iface->spare_fd < 0)
            iface->spare_fd = cfx__spare_fd_open();
        iface->accept_resume = 0;
        listen_events(iface, EPOLLIN);
    }
    CFX_RATELOG_FLUSH(&iface->evict_log, TCP, now);
    CFX_RATELOG_FLUSH(&iface->emfile_log, TCP, now);
    CFX_RATELOG_FLUSH(&iface->accept_log, TCP, now);
    CFX_RATELOG_FLUSH(&iface->hello_log, TCP, now);
}

static void iface_accept(struct cfx__tcp_iface *iface)
{
    uint64_t now = cfx__now_ns();

    for (int i = 0; i < ACCEPT_BURST && !iface->accept_resume; i++) {
        char addr[32];
        struct cfx__tcp_ep *ep;
        uint32_t ip = 0;

        int fd = cfx__tp_sock_accept(iface->listen_fd, addr, sizeof(addr), &ip);
        if (fd < 0) {
            int err = errno;
            if (err == EMFILE || err == ENFILE) {
                if (accept_out_of_fds(iface, err, now))
                    continue;
            } else if (cfx__tp_sock_accept_err_notable(err)) {
                CFX_RATELOG(&iface->accept_log, TCP, now, "iface %s: accept: %s", iface->addr,
                            strerror(err));
            }
            return;
        }
        unauth_make_room(iface, ip, now);
        if (cfx__tcp_ep_create(iface, fd, CFX_TCP_EP_HELLO_WAIT, CFX_TCP_NODE_NONE, addr, &ep) !=
            CFX_OK) {
            CFX_RATELOG(&iface->accept_log, TCP, now, "iface %s: dropping connection from %s: "
                        "%s", iface->addr, addr, cfx_last_error());
            close(fd);
            continue;
        }
        ep->ip = ip;
        ep->accepted_ns = now;
        ep->unauth = true;
        iface->nunauth++;
        cfx_list_add_tail(&ep->unauth_link, &iface->unauth);
    }
}

static int tcp_iface_open(const struct cfx_tp_iface_params *params, struct cfx_tp_iface **out)
{
    const char *bind_addr = "127.0.0.1";
    struct sockaddr_in sa = { .sin_family = AF_INET };
    struct cfx__tcp_iface *iface;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "tcp iface_open: NULL out");
    if (params && (params->field_mask & CFX_TP_IFACE_PARAM_BIND_ADDR) && params->bind_addr)
        bind_addr = params->bind_addr;
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1)
        return cfx__err(CFX_ERR_INVALID, "tcp iface_open: bind address '%s' is not an IPv4 address",
                        bind_addr);

    iface = calloc(1, sizeof(*iface));
    if (!iface)
        return cfx__err(CFX_ERR_NOMEM, "tcp iface_open: out of memory");
    iface->super.ops = &cfx__tcp_ops;
    iface->fail_node = CFX_TCP_NODE_NONE;
    iface->super.node_id = (params && (params->field_mask & CFX_TP_IFACE_PARAM_NODE_ID))
                               ? params->node_id
                               : CFX_TCP_NODE_NONE;
    iface->listen_fd = -1;
    iface->spare_fd = -1;
    cfx_list_init(&iface->unauth);
    iface->max_unauth =
        (uint32_t)cfx__env_ll_clamp("CFX_TCP_MAX_UNAUTH", CFX_TCP_UNAUTH_MAX, 1, 1 << 20);
    iface->max_unauth_per_ip = (uint32_t)cfx__env_ll_clamp("CFX_TCP_MAX_UNAUTH_PER_IP",
                                                           CFX_TCP_UNAUTH_PER_IP, 1, 1 << 20);
    cfx__tp_table_init(&iface->mrs, 16, 1u << 24, 32, "tcp registration");
    cfx_list_init(&iface->eps);
    cfx__tp_graveyard_init(&iface->graveyard, ep_bury);
    cfx_list_init(&iface->rx_backlog);

    iface->discard = malloc(CFX_TCP_DISCARD_SIZE);
    if (!iface->discard || cfx__tp_cq_init(&iface->cq, CQ_INITIAL, iface->addr) != CFX_OK) {
        rc = cfx__err(CFX_ERR_NOMEM, "tcp iface_open: out of memory");
        goto err_free;
    }

    iface->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (iface->epfd < 0) {
        rc = cfx__err(cfx__status_from_errno(errno), "tcp iface_open: epoll_create1: %s",
                      strerror(errno));
        goto err_free;
    }

    uint16_t port;
    if ((rc = cfx__tp_sock_listen("tcp iface_open", &sa.sin_addr, &iface->listen_fd, &port)) !=
        CFX_OK)
        goto err_close_epoll;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(iface->addr, sizeof(iface->addr), "%s:%u", ip, port);

    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    if (epoll_ctl(iface->epfd, EPOLL_CTL_ADD, iface->listen_fd, &ev) < 0) {
        rc = cfx__err(cfx__status_from_errno(errno), "tcp iface_open: epoll_ctl: %s",
                      strerror(errno));
        goto err_close_listen;
    }

    iface->spare_fd = cfx__spare_fd_open(); /* none: shedding pauses instead */
    CFX_LOG(DEBUG, TCP, "iface listening on %s", iface->addr);
    *out = &iface->super;
    return CFX_OK;

err_close_listen:
    close(iface->listen_fd);
err_close_epoll:
    close(iface->epfd);
err_free:
    cfx__tp_cq_fini(&iface->cq);
    free(iface->discard);
    free(iface);
    return rc;
}

static void tcp_iface_close(struct cfx_tp_iface *tp_iface)
{
    if (!tp_iface)
        return;
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_iface);
    struct cfx_list *pos, *tmp;

    cfx_list_for_each_safe(pos, tmp, &iface->eps)
        cfx__tcp_ep_close(&cfx_list_entry(pos, struct cfx__tcp_ep, link)->super);
    cfx__tp_graveyard_free(&iface->graveyard);
    cfx__tcp_mr_table_free(iface);
    cfx__keystream_wipe(&iface->keys);
    if (iface->spare_fd >= 0)
        close(iface->spare_fd);
    close(iface->listen_fd);
    close(iface->epfd);
    cfx__tp_cq_fini(&iface->cq);
    free(iface->discard);
    free(iface);
}

static int tcp_iface_addr(struct cfx_tp_iface *tp_iface, void *buf, size_t *len)
{
    if (!tp_iface || !len || (!buf && *len))
        return cfx__err(CFX_ERR_INVALID, "tcp iface_addr: NULL argument");
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_iface);
    size_t need = strlen(iface->addr) + 1;
    if (*len < need) {
        *len = need;
        return cfx__err(CFX_ERR_TRUNCATED, "tcp iface_addr: need %zu bytes", need);
    }
    memcpy(buf, iface->addr, need);
    *len = need;
    return CFX_OK;
}

static int tcp_iface_fd(struct cfx_tp_iface *tp_iface)
{
    return tp_iface ? cfx__tcp_iface_of(tp_iface)->epfd : -1;
}

static int tcp_iface_arm(struct cfx_tp_iface *tp_iface)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    if (!tp_iface)
        return CFX_ERR_INVALID;
    /* epoll is level-triggered: the fd stays readable while any socket has
     * work, so only completions queued here and frames buffered here need
     * saying. */
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_iface);
    return cfx__tp_cq_count(&iface->cq) || !cfx_list_empty(&iface->rx_backlog) ? CFX_ERR_AGAIN
                                                                          : CFX_OK;
}

static void iface_progress(struct cfx__tcp_iface *iface)
{
    struct epoll_event evs[CFX_TCP_EVENTS];
    int n = epoll_wait(iface->epfd, evs, CFX_TCP_EVENTS, 0);

    for (int i = 0; i < n; i++) {
        if (!evs[i].data.ptr)
            iface_accept(iface);
        else
            cfx__tcp_ep_progress(evs[i].data.ptr, evs[i].events);
    }
}

static int tcp_poll(struct cfx_tp_iface *tp_iface, struct cfx_tp_completion *comps, int max)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    if (unlikely(!tp_iface || (!comps && max > 0) || max < 0))
        return CFX_ERR_INVALID;
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_iface);

    /* RECV data returned by the previous poll() is released from here on. */
    iface->poll_gen++;
    if (unlikely(!cfx__tp_graveyard_empty(&iface->graveyard)))
        cfx__tp_graveyard_free(&iface->graveyard);

    int n = cq_drain(iface, comps, max);
    if (n < max) {
        if (unlikely(!cfx_list_empty(&iface->rx_backlog)))
            cfx__tcp_rx_backlog_run(iface);
        iface_progress(iface);
        n += cq_drain(iface, comps + n, max - n);
    }
    uint64_t now = cfx__now_ns();
    if (unlikely(now > iface->hello_check)) {
        iface->hello_check = now + 100 * 1000000ull;
        cfx__tcp_ep_hello_expire(iface, now);
        accept_tick(iface, now);
    }
    return n ? n : cfx__tp_cq_take_status(&iface->cq);
}

static uint64_t tcp_grant_refused(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__tcp_iface_of(tp_iface)->n_grant_refused,
                                memory_order_relaxed);
}

static uint64_t tcp_late_dropped(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__tcp_iface_of(tp_iface)->n_late_dropped,
                                memory_order_relaxed);
}

static uint64_t tcp_seal_refused(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__tcp_iface_of(tp_iface)->n_seal_refused,
                                memory_order_relaxed);
}

const struct cfx_transport_ops cfx__tcp_ops = {
    .version = CFX_TP_OPS_VERSION,
    .name = "tcp",
    .caps = CFX_TP_CAP_SEAL,
    .iface_open = tcp_iface_open,
    .iface_close = tcp_iface_close,
    .iface_addr = tcp_iface_addr,
    .iface_fd = tcp_iface_fd,
    .iface_arm = tcp_iface_arm,
    .ep_connect = cfx__tcp_ep_connect,
    .ep_close = cfx__tcp_ep_close,
    .ep_authorize = cfx__tcp_ep_authorize,
    .mem_reg = cfx__tcp_mem_reg,
    .mem_dereg = cfx__tcp_mem_dereg,
    .mr_pack = cfx__tcp_mr_pack,
    .mr_grant = cfx__tcp_mr_grant,
    .mr_revoke = cfx__tcp_mr_revoke,
    .iface_grant_refused = tcp_grant_refused,
    .iface_late_dropped = tcp_late_dropped,
    .ep_write = cfx__tcp_ep_write,
    .ep_send = cfx__tcp_ep_send,
    .poll = tcp_poll,
    .ep_batch = cfx__tcp_ep_batch,
    .ep_seal = cfx__tcp_ep_seal,
    .iface_seal_refused = tcp_seal_refused,
};

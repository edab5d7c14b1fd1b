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
 * CFX_CONN_AUTH_MS).  They are capped (CFX_TCP_MAX_UNAUTH of all,
 * CFX_TCP_MAX_UNAUTH_PER_IP of one address), and a process out of
 * descriptors sheds them rather than spin, as tp_strangers.h says.
 */
static void stranger_evict(struct cfx__tp_stranger *st, const char *why)
{
    cfx__tcp_ep_evict(container_of(st, struct cfx__tcp_ep, stranger), why);
}

static void listen_events(struct cfx__tp_strangers *s, bool on)
{
    struct cfx__tcp_iface *iface = container_of(s, struct cfx__tcp_iface, strangers);
    struct epoll_event ev = { .events = on ? EPOLLIN : 0, .data.ptr = NULL };
    epoll_ctl(iface->epfd, EPOLL_CTL_MOD, iface->listen_fd, &ev);
}

/* On the poll's tick: accepting again after a pause, lines a flood held. */
static void accept_tick(struct cfx__tcp_iface *iface, uint64_t now)
{
    cfx__tp_strangers_tick(&iface->strangers, now);
    CFX_RATELOG_FLUSH(&iface->accept_log, TCP, now);
    CFX_RATELOG_FLUSH(&iface->hello_log, TCP, now);
}

static void iface_accept(struct cfx__tcp_iface *iface)
{
    struct cfx__tp_strangers *s = &iface->strangers;
    uint64_t now = cfx__now_ns();

    for (int i = 0; i < ACCEPT_BURST && !cfx__tp_strangers_paused(s); i++) {
        char addr[32];
        struct cfx__tcp_ep *ep;
        uint32_t ip = 0;

        int fd = cfx__tp_sock_accept(iface->listen_fd, addr, sizeof(addr), &ip);
        if (fd < 0) {
            int err = errno;
            if (err == EMFILE || err == ENFILE) {
                if (cfx__tp_strangers_out_of_fds(s, iface->listen_fd, err, now))
                    continue;
            } else if (cfx__tp_sock_accept_err_notable(err)) {
                CFX_RATELOG(&iface->accept_log, TCP, now, "iface %s: accept: %s", iface->addr,
                            strerror(err));
            }
            return;
        }
        cfx__tp_strangers_admit(s, ip, now);
        if (cfx__tcp_ep_create(iface, fd, CFX_TCP_EP_HELLO_WAIT, CFX_TCP_NODE_NONE, addr, &ep) !=
            CFX_OK) {
            CFX_RATELOG(&iface->accept_log, TCP, now, "iface %s: dropping connection from %s: "
                        "%s", iface->addr, addr, cfx_last_error());
            close(fd);
            continue;
        }
        cfx__tp_stranger_add(s, &ep->stranger, ip, ep->addr, now);
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

    struct cfx__tp_strangers_params sp = {
        .who = iface->addr, .subsys = "TCP",
        .env_max = "CFX_TCP_MAX_UNAUTH", .def_max = CFX_TCP_UNAUTH_MAX,
        .env_per_ip = "CFX_TCP_MAX_UNAUTH_PER_IP", .def_per_ip = CFX_TCP_UNAUTH_PER_IP,
        .evict = stranger_evict, .listen = listen_events,
    };
    cfx__tp_strangers_init(&iface->strangers, &sp, true);
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
    cfx__tp_strangers_fini(&iface->strangers);
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

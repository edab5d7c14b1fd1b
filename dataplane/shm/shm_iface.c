/*
 * shm iface: the listening socket, the doorbell, the completion queue, and
 * poll()/iface_arm() over every endpoint.
 */
#include "shm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "dataplane/common/log.h"

#define SHM_EVENTS 32
#define SHM_CQ_INIT 1024

static void ep_bury(struct cfx_list *link)
{
    cfx__shm_ep_free(cfx_list_entry(link, struct cfx__shm_ep, link));
}

/* ---- completion queue ----------------------------------------------------- */

static int cq_drain(struct cfx__shm_iface *iface, struct cfx_tp_completion *comps, int max)
{
    struct cfx_tp_completion *c;
    int n = 0;
    while (n < max && (c = cfx__tp_cq_head(&iface->cq))) {
        comps[n++] = *c;
        cfx__tp_cq_pop(&iface->cq);
    }
    return n;
}

/* ---- open / close ------------------------------------------------------------ */

static int epoll_add(int epfd, int fd, struct cfx__shm_ev *ev)
{
    struct epoll_event e = { .events = EPOLLIN, .data.ptr = ev };
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e);
}

/* $name in [min, max], rounded down to a power of two (min and max are
 * powers of two); a value beyond them or between two is brought to the
 * nearest one below (the bound beyond them), with a warning naming it. */
static size_t env_pow2(const char *name, size_t def, size_t min, size_t max)
{
    size_t v = cfx__env_size(name, def), used = v;
    if (used < min)
        used = min;
    if (used > max)
        used = max;
    while (used & (used - 1))
        used &= used - 1; /* the highest bit alone */
    if (used != v)
        CFX_LOG(WARN, CONFIG, "%s=%zu: using %zu (a power of two in [%zu, %zu])", name, v, used,
                min, max);
    return used;
}

/* $CFX_SHM_FRAG_SIZE in [CFX_SHM_FRAG_MIN, ring / 4]: a value beyond is
 * brought to the nearest bound, with a warning naming it. */
static size_t env_frag(size_t ring)
{
    size_t def = CFX_MIN((size_t)CFX_SHM_FRAG_DEFAULT, ring / 4);
    size_t v = cfx__env_size("CFX_SHM_FRAG_SIZE", def);
    size_t used = CFX_MIN(CFX_MAX(v, (size_t)CFX_SHM_FRAG_MIN), ring / 4);
    if (used != v)
        CFX_LOG(WARN, CONFIG, "CFX_SHM_FRAG_SIZE=%zu: using %zu (%u .. a quarter of the "
                "%zu-byte ring)", v, used, CFX_SHM_FRAG_MIN, ring);
    return used;
}

static int shm_iface_open(const struct cfx_tp_iface_params *params,
                          struct cfx_tp_iface **out)
{
    struct cfx__shm_iface *iface;
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    uint32_t rnd = 0;
    int status;

    if (!out)
        return CFX_ERR_INVALID;
    cfx__log_init();
    iface = calloc(1, sizeof(*iface));
    if (!iface)
        return cfx__err(CFX_ERR_NOMEM, "shm: out of memory for an iface");
    iface->super.ops = &cfx__shm_ops;
    if (params && (params->field_mask & CFX_TP_IFACE_PARAM_NODE_ID))
        iface->super.node_id = params->node_id;
    if (params && (params->field_mask & CFX_TP_IFACE_PARAM_TOKEN) && params->token) {
        if (strlen(params->token) >= sizeof(iface->token)) {
            free(iface);
            return cfx__err(CFX_ERR_TOO_BIG, "shm: cluster token longer than %zu bytes",
                            sizeof(iface->token) - 1);
        }
        strcpy(iface->token, params->token);
    }
    iface->pid = getpid();
    iface->ring_size = env_pow2("CFX_SHM_RING_SIZE", CFX_SHM_RING_DEFAULT,
                                CFX_SHM_RING_MIN, CFX_SHM_RING_MAX);
    iface->frag_size = env_frag(iface->ring_size);
    cfx__tp_table_init(&iface->mrs, 64, 0x10000u, 32, "shm registration");
    iface->listen_ev.kind = CFX_SHM_EV_LISTEN;
    iface->doorbell_ev.kind = CFX_SHM_EV_DOORBELL;
    cfx_list_init(&iface->eps);
    cfx__tp_graveyard_init(&iface->graveyard, ep_bury);
    if (cfx__tp_cq_init(&iface->cq, SHM_CQ_INIT, iface->addr) != CFX_OK) {
        free(iface);
        return cfx__err(CFX_ERR_NOMEM, "shm: out of memory for an iface");
    }

    iface->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (iface->epfd < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "shm: epoll_create1: %s",
                          strerror(errno));
        goto err_free;
    }
    iface->doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (iface->doorbell < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "shm: eventfd: %s", strerror(errno));
        goto err_close_epfd;
    }
    iface->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (iface->listen_fd < 0) {
        status = errno == EAFNOSUPPORT || errno == EPROTONOSUPPORT
                     ? cfx__err(CFX_ERR_NO_DEVICE, "shm: no AF_UNIX seqpacket sockets")
                     : cfx__err(cfx__status_from_errno(errno), "shm: socket: %s",
                                strerror(errno));
        goto err_close_doorbell;
    }
    rnd = cfx__random_u32();
    snprintf(iface->addr, sizeof(iface->addr), "@conflux-shm-%d-%08x", (int)iface->pid, rnd);
    /* abstract namespace: a leading NUL, no file to clean up */
    size_t nlen = strlen(iface->addr);
    memcpy(sun.sun_path, iface->addr, nlen);
    sun.sun_path[0] = '\0';
    if (bind(iface->listen_fd, (struct sockaddr *)&sun,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nlen)) < 0 ||
        listen(iface->listen_fd, SOMAXCONN) < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "shm: cannot listen on %s: %s",
                          iface->addr, strerror(errno));
        goto err_close_listen;
    }
    if (epoll_add(iface->epfd, iface->listen_fd, &iface->listen_ev) < 0 ||
        epoll_add(iface->epfd, iface->doorbell, &iface->doorbell_ev) < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "shm: epoll_ctl: %s", strerror(errno));
        goto err_close_listen;
    }
    CFX_LOG(DEBUG, SHM, "node %u: shm iface listening on %s (ring %zu B, fragment %zu B)",
            iface->super.node_id, iface->addr, iface->ring_size, iface->frag_size);
    *out = &iface->super;
    return CFX_OK;

err_close_listen:
    close(iface->listen_fd);
err_close_doorbell:
    close(iface->doorbell);
err_close_epfd:
    close(iface->epfd);
err_free:
    cfx__tp_cq_fini(&iface->cq);
    free(iface);
    return status;
}

static void shm_iface_close(struct cfx_tp_iface *tpi)
{
    struct cfx__shm_iface *iface;
    struct cfx_list *pos, *tmp;

    if (!tpi)
        return;
    iface = cfx__shm_iface_of(tpi);
    cfx_list_for_each_safe(pos, tmp, &iface->eps) {
        struct cfx__shm_ep *ep = cfx_list_entry(pos, struct cfx__shm_ep, link);
        cfx__shm_ep_close(&ep->super);
    }
    cfx__tp_graveyard_free(&iface->graveyard);
    cfx__shm_mr_table_free(iface);
    cfx__keystream_wipe(&iface->keys);
    explicit_bzero(iface->token, sizeof(iface->token));
    close(iface->listen_fd);
    close(iface->doorbell);
    close(iface->epfd);
    cfx__tp_cq_fini(&iface->cq);
    free(iface);
}

static int shm_iface_addr(struct cfx_tp_iface *tpi, void *buf, size_t *len)
{
    struct cfx__shm_iface *iface = cfx__shm_iface_of(tpi);
    size_t need = strlen(iface->addr) + 1;

    if (!len)
        return CFX_ERR_INVALID;
    if (!buf || *len < need) {
        size_t had = *len;
        *len = need; /* tell the caller what it takes */
        return cfx__err(CFX_ERR_TRUNCATED, "shm: address needs %zu bytes, got %zu", need, had);
    }
    memcpy(buf, iface->addr, need);
    *len = need;
    return CFX_OK;
}

static int shm_iface_fd(struct cfx_tp_iface *tpi)
{
    return cfx__shm_iface_of(tpi)->epfd;
}

/* ---- sleeping ------------------------------------------------------------------ */

static void drain_doorbell(struct cfx__shm_iface *iface)
{
    uint64_t v;
    while (read(iface->doorbell, &v, sizeof(v)) == (ssize_t)sizeof(v))
        ;
}

static void disarm(struct cfx__shm_iface *iface)
{
    struct cfx_list *pos;
    iface->armed = false;
    cfx_list_for_each(pos, &iface->eps)
        cfx__shm_ep_disarm(cfx_list_entry(pos, struct cfx__shm_ep, link));
}

static int shm_iface_arm(struct cfx_tp_iface *tpi)
{
    CFX_TP_THREAD_CHECK(tpi);
    struct cfx__shm_iface *iface = cfx__shm_iface_of(tpi);
    struct cfx_list *pos;
    bool pending = cfx__tp_cq_count(&iface->cq) > 0 || !cfx__tp_graveyard_empty(&iface->graveyard);

    drain_doorbell(iface);
    cfx_list_for_each(pos, &iface->eps)
        pending |= cfx__shm_ep_arm(cfx_list_entry(pos, struct cfx__shm_ep, link));
    iface->armed = true;
    /* Dekker with the peers: flag stores above, then their head/tail loads. */
    atomic_thread_fence(memory_order_seq_cst);
    cfx_list_for_each(pos, &iface->eps)
        pending |= cfx__shm_ep_recheck(cfx_list_entry(pos, struct cfx__shm_ep, link));
    return pending ? CFX_ERR_AGAIN : CFX_OK;
}

/* ---- progress ------------------------------------------------------------------ */

static void sock_check(struct cfx__shm_iface *iface, uint64_t now)
{
    struct epoll_event evs[SHM_EVENTS];
    struct cfx_list *pos, *tmp;
    int n;

    iface->next_sock_check = now + CFX_SHM_SOCK_CHECK_NS;
    CFX_RATELOG_FLUSH(&iface->refuse_log, SHM, now);
    n = epoll_wait(iface->epfd, evs, SHM_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        struct cfx__shm_ev *ev = evs[i].data.ptr;
        switch (ev->kind) {
        case CFX_SHM_EV_LISTEN:
            cfx__shm_accept(iface);
            break;
        case CFX_SHM_EV_DOORBELL:
            drain_doorbell(iface);
            break;
        case CFX_SHM_EV_EP:
            cfx__shm_ep_sock_event(container_of(ev, struct cfx__shm_ep, ev));
            break;
        }
    }
    if (iface->handshaking) {
        cfx_list_for_each_safe(pos, tmp, &iface->eps) {
            struct cfx__shm_ep *ep = cfx_list_entry(pos, struct cfx__shm_ep, link);
            if (ep->state == CFX_SHM_EP_CONNECTING)
                cfx__shm_ep_connect_retry(ep);
            else if (cfx__shm_state_handshaking(ep->state))
                cfx__shm_ep_handshake_expire(ep, now);
        }
    }
}

static int shm_poll(struct cfx_tp_iface *tpi, struct cfx_tp_completion *comps, int max)
{
    CFX_TP_THREAD_CHECK(tpi);
    struct cfx__shm_iface *iface = cfx__shm_iface_of(tpi);
    struct cfx_list *pos, *tmp;
    int n = 0;

    if (unlikely(!comps || max < 0))
        return CFX_ERR_INVALID;
    if (unlikely(!cfx__tp_graveyard_empty(&iface->graveyard)))
        cfx__tp_graveyard_free(&iface->graveyard);
    if (unlikely(iface->armed)) {
        disarm(iface);
        iface->next_sock_check = 0;
        iface->polls_unclocked = CFX_SHM_CLOCK_POLLS; /* check the sockets now */
    }
    /* The socket check is due once a millisecond; a busy caller polls
     * millions of times a second, so the clock is read only while a
     * handshake runs, after a sleep (armed), and once every
     * CFX_SHM_CLOCK_POLLS polls: a busy poller checks at most some tens of
     * microseconds late, a rare poller (one that polls less often than
     * the period) at most that many polls late. */
    if (unlikely(iface->handshaking) || ++iface->polls_unclocked >= CFX_SHM_CLOCK_POLLS) {
        iface->polls_unclocked = 0;
        uint64_t now = cfx__now_ns();
        if (iface->handshaking || now >= iface->next_sock_check)
            sock_check(iface, now);
    }

    cfx_list_for_each(pos, &iface->eps) {
        struct cfx__shm_ep *ep = cfx_list_entry(pos, struct cfx__shm_ep, link);
        if (ep->txq_count && ep->state == CFX_SHM_EP_READY)
            cfx__shm_ep_tx_progress(ep);
    }
    n = cq_drain(iface, comps, max);
    cfx_list_for_each_safe(pos, tmp, &iface->eps) {
        struct cfx__shm_ep *ep = cfx_list_entry(pos, struct cfx__shm_ep, link);
        if (n >= max)
            break;
        if (ep->state == CFX_SHM_EP_READY || ep->state == CFX_SHM_EP_PEER_GONE)
            n += cfx__shm_ep_rx_progress(ep, comps + n, max - n);
    }
    /* round robin: the first endpoint goes last next time */
    if (iface->eps.next != iface->eps.prev) {
        struct cfx_list *first = iface->eps.next;
        cfx_list_del(first);
        cfx_list_add_tail(first, &iface->eps);
    }
    if (cfx__tp_cq_count(&iface->cq) && n < max)
        n += cq_drain(iface, comps + n, max - n);
    return n ? n : cfx__tp_cq_take_status(&iface->cq);
}

static uint64_t shm_grant_refused(struct cfx_tp_iface *tpi)
{
    return atomic_load_explicit(&cfx__shm_iface_of(tpi)->n_grant_refused, memory_order_relaxed);
}

static uint64_t shm_late_dropped(struct cfx_tp_iface *tpi)
{
    return atomic_load_explicit(&cfx__shm_iface_of(tpi)->n_late_dropped, memory_order_relaxed);
}

const struct cfx_transport_ops cfx__shm_ops = {
    .version = CFX_TP_OPS_VERSION,
    .name = "shm",
    .caps = CFX_TP_CAP_SAME_HOST,
    .iface_open = shm_iface_open,
    .iface_close = shm_iface_close,
    .iface_addr = shm_iface_addr,
    .iface_fd = shm_iface_fd,
    .iface_arm = shm_iface_arm,
    .ep_connect = cfx__shm_ep_connect,
    .ep_close = cfx__shm_ep_close,
    .mem_reg = cfx__shm_mem_reg,
    .mem_dereg = cfx__shm_mem_dereg,
    .mr_pack = cfx__shm_mr_pack,
    .mr_grant = cfx__shm_mr_grant,
    .mr_revoke = cfx__shm_mr_revoke,
    .iface_grant_refused = shm_grant_refused,
    .iface_late_dropped = shm_late_dropped,
    .ep_write = cfx__shm_ep_write,
    .ep_send = cfx__shm_ep_send,
    .poll = shm_poll,
};

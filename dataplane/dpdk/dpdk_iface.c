/*
 * dpdk transport: the iface (one DPDK port), its poll loop, control
 * packets and the ops table.
 *
 * Which port: the iface parameter device names it (an ethdev name such as
 * "net_memif0"); otherwise $CFX_DPDK_PORT; otherwise the first port this
 * process has not opened yet, so that two ifaces of one process (the
 * transport tests: two memif vdevs joined to each other) take one port each.
 * Our IPv4 address: $CFX_DPDK_IP, else bind_addr, else 10.77.0.<n + 1> for
 * the n-th port; it only has to be what peers send to (their address record).
 * $CFX_DPDK_RX_DROP_PPM (a test hook) drops that many received frames per
 * million before the transport sees them.
 *
 * No wait fd: the transport is busy-polled (CFX_TP_CAP_BUSY_POLL); timers
 * (SYN repeats, RTO, keepalive) run from poll() with the time it reads.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dataplane/common/log.h"
#include "dpdk.h"

#define CQ_INITIAL 1024
#define RX_BURSTS  8 /* receive bursts per poll() at most */

/* Ports of this process that an iface holds (EAL and its ports are process-wide). */
static pthread_mutex_t ports_lock = PTHREAD_MUTEX_INITIALIZER;
static char ports_held[8][64];
static char ports_closed[128]; /* names of ports closed in this process, for the error text */

static bool port_hold(const char *name)
{
    bool ok = false;
    int free_at = -1;
    pthread_mutex_lock(&ports_lock);
    for (int i = 0; i < 8; i++) {
        if (!strcmp(ports_held[i], name))
            goto out;
        if (!ports_held[i][0] && free_at < 0)
            free_at = i;
    }
    if (free_at >= 0) {
        snprintf(ports_held[free_at], sizeof(ports_held[free_at]), "%s", name);
        ok = true;
    }
out:
    pthread_mutex_unlock(&ports_lock);
    return ok;
}

static void port_release(const char *name)
{
    pthread_mutex_lock(&ports_lock);
    for (int i = 0; i < 8; i++)
        if (!strcmp(ports_held[i], name))
            ports_held[i][0] = 0;
    pthread_mutex_unlock(&ports_lock);
}

void cfx__dpdk_ctl_send(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *dst,
                        unsigned type, uint32_t from_sess, uint32_t to_sess, uint64_t arg)
{
    struct cfx__dpdk_hdr h = {
        .flags = CFX_DPDK_F_CTL,
        .session = 0,
        .seq = type,
        .ack = from_sess,
        .msg_id = to_sess,
        .sack = arg,
        .ts = iface->now,
    };
    /* best effort: a lost control packet is repeated (SYN, PING) or made up
     * for by the reset answering the peer's next packet */
    (void)cfx__dpdk_port_tx(iface->port, dst, &h, NULL);
}

static bool same_addr(const struct cfx__dpdk_addr *a, const struct cfx__dpdk_addr *b)
{
    return !memcmp(a->mac, b->mac, 6) && a->ip == b->ip && a->port == b->port;
}

static struct cfx__dpdk_ep *ep_by_peer(struct cfx__dpdk_iface *iface,
                                       const struct cfx__dpdk_addr *src, uint32_t peer_sess)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &iface->eps) {
        struct cfx__dpdk_ep *ep = cfx_list_entry(pos, struct cfx__dpdk_ep, link);
        if (ep->peer_sess == peer_sess && same_addr(&ep->peer, src))
            return ep;
    }
    return NULL;
}

static struct cfx__dpdk_ep *ep_by_sess(struct cfx__dpdk_iface *iface, uint32_t sess)
{
    if (!sess || !(sess & 0xFFFFu))
        return NULL;
    return cfx__tp_table_get(&iface->eps_tab, (sess & 0xFFFFu) - 1, sess >> 16);
}

static void accept_syn(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *src,
                       const struct cfx__dpdk_hdr *h)
{
    struct cfx__dpdk_ep *ep = ep_by_peer(iface, src, h->ack);
    if (ep) { /* our SYNACK was lost */
        if (ep->state == CFX_DPDK_EP_OPEN)
            cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_SYNACK, ep->sess_id, h->ack,
                               iface->super.node_id);
        return;
    }
    uint32_t node = (uint32_t)h->sack;
    if (unlikely(iface->half_open >= CFX_DPDK_HALF_OPEN_MAX)) {
        /* a SYN costs its sender one frame and us an endpoint with its
         * session's rings (some 480 KB), kept until the peer is silent for
         * CFX_DPDK_DEAD_MS: SYNs from addresses that never answer (forged)
         * would take every slot and all memory.  Dropped, not refused: a
         * real connector repeats its SYN (CFX_DPDK_SYN_MS) until its
         * deadline, and gets in as the endpoints before it hear from
         * their peers. */
        iface->syn_refused++;
        if (iface->now >= iface->syn_log_at) {
            CFX_LOG(WARN, DPDK, "iface %s: %d endpoints accepted whose peers sent nothing yet: "
                    "%" PRIu64 " connection requests dropped (the last from node %u, "
                    "%u.%u.%u.%u:%u)", iface->name, CFX_DPDK_HALF_OPEN_MAX,
                    iface->syn_refused, node, src->ip >> 24, src->ip >> 16 & 0xFF,
                    src->ip >> 8 & 0xFF, src->ip & 0xFF, src->port);
            iface->syn_refused = 0;
            iface->syn_log_at = iface->now + 10000000000ull;
        }
        return;
    }
    if (cfx__dpdk_ep_new(iface, src, node, &ep) != CFX_OK) {
        CFX_LOG(WARN, DPDK, "iface %s: connection from node %u refused: %s", iface->name, node,
                cfx_last_error());
        cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_RST, 0, h->ack, (uint32_t)CFX_ERR_CONNECT);
        return;
    }
    if (cfx__dpdk_ep_open(ep, h->ack) != CFX_OK) {
        cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_RST, 0, h->ack, (uint32_t)CFX_ERR_CONNECT);
        cfx__dpdk_ep_destroy(ep);
        return;
    }
    ep->half_open = true;
    iface->half_open++;
    struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
    c->type = CFX_TP_COMP_ACCEPT;
    c->ep = &ep->super;
    cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_SYNACK, ep->sess_id, h->ack, iface->super.node_id);
}

static void ctl_rx(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *src,
                   const struct cfx__dpdk_hdr *h)
{
    struct cfx__dpdk_ep *ep;

    switch (h->seq) {
    case CFX_DPDK_CTL_SYN:
        accept_syn(iface, src, h);
        return;
    case CFX_DPDK_CTL_SYNACK:
        ep = ep_by_sess(iface, h->msg_id);
        if (!ep || ep->state != CFX_DPDK_EP_CONNECTING || !same_addr(&ep->peer, src))
            return; /* a repeated SYNACK */
        ep->heard = iface->now;
        if (cfx__dpdk_ep_open(ep, h->ack) != CFX_OK) {
            cfx__dpdk_ep_fail(ep, CFX_ERR_NOMEM, "no memory for the session");
            return;
        }
        struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
        c->type = CFX_TP_COMP_CONNECTED;
        c->ep = &ep->super;
        return;
    case CFX_DPDK_CTL_RST:
        ep = h->msg_id ? ep_by_sess(iface, h->msg_id) : ep_by_peer(iface, src, h->ack);
        if (!ep || !same_addr(&ep->peer, src) ||
            (ep->state == CFX_DPDK_EP_OPEN && ep->peer_sess != h->ack))
            return;
        int st = (int32_t)(uint32_t)h->sack;
        if (st >= 0 || st <= CFX_STATUS_LAST)
            st = CFX_ERR_PEER_FAILED;
        cfx__dpdk_ep_fail(ep, st,
                          st == CFX_ERR_CLOSED ? "the peer closed the connection"
                          : st == CFX_ERR_NO_RESOURCE
                              ? "the peer closed it for a newer one: it holds as many "
                                "connections not yet authenticated as it takes"
                              : "the peer reset the connection");
        return;
    case CFX_DPDK_CTL_PING:
    case CFX_DPDK_CTL_PONG:
        ep = ep_by_sess(iface, h->msg_id);
        if (!ep || ep->state != CFX_DPDK_EP_OPEN || ep->peer_sess != h->ack ||
            !same_addr(&ep->peer, src)) {
            /* the pinger's session is not ours (a process restarted on
             * this address, a session closed): reset it, from the id it
             * sent to, which the pinger checks a reset of its open
             * session against */
            if (h->seq == CFX_DPDK_CTL_PING)
                cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_RST, h->msg_id, h->ack,
                                   (uint32_t)CFX_ERR_PEER_FAILED);
            return;
        }
        cfx__dpdk_ep_heard(ep);
        if (h->seq == CFX_DPDK_CTL_PING)
            cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_PONG, ep->sess_id, ep->peer_sess, 0);
        return;
    default:
        return;
    }
}

static void rx_cb(void *ctx, const struct cfx__dpdk_addr *src, const struct cfx__dpdk_hdr *h,
                  const void *payload)
{
    struct cfx__dpdk_iface *iface = ctx;
    if (h->session == 0 || (h->flags & CFX_DPDK_F_CTL)) {
        if (h->session == 0 && (h->flags & CFX_DPDK_F_CTL))
            ctl_rx(iface, src, h);
        return; /* a control packet for a session, or session 0 without one: dropped */
    }
    struct cfx__dpdk_ep *ep = ep_by_sess(iface, h->session);
    iface->data_at = iface->now; /* control packets (PING, PONG) leave it quiet */
    if (unlikely(!ep || ep->state == CFX_DPDK_EP_CONNECTING || !same_addr(&ep->peer, src))) {
        /* a session that is gone: tell the sender (by the id it used) */
        if (h->flags & CFX_DPDK_F_DATA)
            cfx__dpdk_ctl_send(iface, src, CFX_DPDK_CTL_RST, h->session, 0,
                               (uint32_t)CFX_ERR_PEER_FAILED);
        return;
    }
    if (ep->state == CFX_DPDK_EP_OPEN)
        cfx__dpdk_ep_rx(ep, h, payload);
}

/* A link that stays down gets its port restarted: a net_memif client that
 * reached its server's socket before the server's port started is turned
 * away ("ID not found") and does not try again by itself. */
static void link_watch(struct cfx__dpdk_iface *iface)
{
    iface->link_check = iface->now + CFX_DPDK_LINK_CHECK_MS * 1000000ull;
    if (cfx__dpdk_port_link_up(iface->port)) {
        iface->link_down_since = 0;
        iface->restart_fails = 0;
        return;
    }
    if (!iface->link_down_since) {
        iface->link_down_since = iface->now;
        iface->link_down_first = iface->now;
        return;
    }
    /* every CFX_DPDK_LINK_RESTART_MS, twice as long after each restart
     * that brought no link, up to 32 times as long: a peer gone for good is
     * not asked every second for ever, and a handshake slower than the
     * first wait (a memif server on a loaded host answers in seconds) is
     * not cut by every restart after it */
    uint64_t wait_ms = (uint64_t)CFX_DPDK_LINK_RESTART_MS << CFX_MIN(iface->restart_fails, 5u);
    if (iface->now - iface->link_down_since >= wait_ms * 1000000ull) {
        unsigned n = ++iface->restart_fails;
        unsigned long long down_ms = (iface->now - iface->link_down_since) / 1000000;
        int rc = cfx__dpdk_port_restart(iface->port);
        bool warn = n >= 4 && !(n & (n - 1)); /* 15 s without a link, and at every doubling */
        if (warn && rc == 1) /* a net_memif server: not restarted, it waits for its client */
            CFX_LOG(WARN, DPDK, "iface %s: no link for %llu s: no net_memif client has connected "
                    "to this server port's socket (is a role=client port started on the same "
                    "socket=?)",
                    iface->name, (iface->now - iface->link_down_first) / 1000000000ull);
        else if (warn)
            CFX_LOG(WARN, DPDK, "iface %s: no link after %u port restarts (the last %llu ms "
                    "apart)%s", iface->name, n, down_ms,
                    cfx__dpdk_port_is_memif_client(iface->port)
                        ? ": is a role=server port up on the same memif socket=?"
                        : "");
        else if (rc == CFX_OK)
            CFX_LOG(INFO, DPDK, "iface %s: link down for %llu ms, port restarted", iface->name,
                    down_ms);
        iface->link_down_since = iface->now;
    }
}

static int dpdk_poll(struct cfx_tp_iface *tp_iface, struct cfx_tp_completion *comps, int max)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);
    struct cfx_list *pos, *n;
    int got = 0;

    if (!cfx__tp_graveyard_empty(&iface->graveyard))
        cfx__tp_graveyard_free(&iface->graveyard);
    iface->poll_gen++;
    iface->now = cfx__now_ns();
    iface->rx_prev = iface->rx_at;
    iface->rx_at = iface->now;
    for (int i = 0; i < RX_BURSTS; i++)
        if (cfx__dpdk_port_rx(iface->port, rx_cb, iface) <= 0)
            break;
    cfx_list_for_each_safe(pos, n, &iface->eps)
        cfx__dpdk_ep_progress(cfx_list_entry(pos, struct cfx__dpdk_ep, link));
    cfx__dpdk_port_flush(iface->port);
    if (unlikely(iface->now >= iface->link_check)) {
        link_watch(iface);
        cfx__tp_strangers_tick(&iface->strangers, iface->now);
    }

    while (got < max) {
        struct cfx_tp_completion *c = cfx__tp_cq_head(&iface->cq);
        if (!c)
            break;
        comps[got++] = *c;
        cfx__tp_cq_pop(&iface->cq);
        cfx__dpdk_ep_returned(cfx__dpdk_ep_of(comps[got - 1].ep), &comps[got - 1]);
    }
    return got ? got : cfx__tp_cq_take_status(&iface->cq);
}

static void ep_bury(struct cfx_list *link)
{
    cfx__dpdk_ep_destroy(cfx_list_entry(link, struct cfx__dpdk_ep, link));
}

/* Strangers' pause out of descriptors: sessions take none. */
static void no_listener(struct cfx__tp_strangers *s, bool on)
{
    (void)s;
    (void)on;
}

static int parse_ip(const char *s, uint32_t *ip)
{
    struct in_addr a;
    if (!s || inet_pton(AF_INET, s, &a) != 1)
        return CFX_ERR_INVALID;
    *ip = ntohl(a.s_addr);
    return CFX_OK;
}

static int pick_port(struct cfx__dpdk_iface *iface, const struct cfx_tp_iface_params *params,
                     unsigned *nth)
{
    const char *want = (params && (params->field_mask & CFX_TP_IFACE_PARAM_DEVICE) &&
                        params->device && params->device[0])
                           ? params->device
                           : cfx__dpdk_env("CFX_DPDK_PORT");
    char name[64], names[256] = "";
    unsigned n = 0;
    for (unsigned i = 0; cfx__dpdk_port_name(i, name, sizeof(name)) == CFX_OK; i++, n++) {
        size_t l = strlen(names);
        snprintf(names + l, sizeof(names) - l, "%s%s", l ? ", " : "", name);
        if (want && strcmp(want, name))
            continue;
        if (port_hold(name)) {
            snprintf(iface->port_name, sizeof(iface->port_name), "%s", name);
            *nth = i;
            return CFX_OK;
        }
        if (want)
            return cfx__err(CFX_ERR_BUSY, "dpdk iface_open: port %s is held by another context "
                            "of this process (one context per port)", want);
    }
    /* why none: each cause its own words */
    char closed[sizeof(ports_closed)];
    pthread_mutex_lock(&ports_lock);
    snprintf(closed, sizeof(closed), "%s", ports_closed);
    pthread_mutex_unlock(&ports_lock);
    if (want)
        return cfx__err(CFX_ERR_NO_DEVICE, "dpdk iface_open: no DPDK port %s (CFX_DPDK_PORT); "
                        "this process has %s%s", want, n ? "" : "none", names);
    if (n)
        return cfx__err(CFX_ERR_BUSY, "dpdk iface_open: every DPDK port of this process (%s) "
                        "is held by another context (one context per port)", names);
    if (closed[0])
        return cfx__err(CFX_ERR_NO_DEVICE, "dpdk iface_open: port %s was closed by an earlier "
                        "context of this process, and DPDK cannot open a port again in the "
                        "same process: a new context needs a new process", closed);
    if (!cfx__dpdk_env("CFX_DPDK_VDEV") && !cfx__dpdk_env("CFX_DPDK_EAL"))
        return cfx__err(CFX_ERR_NO_DEVICE, "dpdk iface_open: no DPDK port asked for: set "
                        "CFX_DPDK_VDEV (a virtual device such as "
                        "net_memif0,role=server,socket=NAME) or CFX_DPDK_EAL");
    return cfx__err(CFX_ERR_NO_DEVICE, "dpdk iface_open: DPDK's EAL found no port: the device "
                    "of CFX_DPDK_VDEV / CFX_DPDK_EAL did not probe (DPDK's own message above "
                    "says why: a memif socket name in use, a bad argument)");
}

/*
 * Holds our UDP address in the kernel on a port the kernel shares
 * (net_af_packet): every frame for us also climbs the kernel's stack there.
 * Unheld, a local process could bind the address, read this transport's
 * frames and send frames our peers take for ours (they check the source
 * address), and the kernel answers every frame with an ICMP port
 * unreachable (rate limited, but routed each time).  Held by a socket whose
 * filter drops everything (classic BPF "ret #0"), the copies go nowhere.
 * Nothing to hold on a NIC DPDK owns or on memif (the kernel never sees
 * those frames), nor where the kernel does not have the IP.  CFX_OK, or
 * CFX_ERR_BUSY when another socket on this host holds the address already.
 */
static int hold_kernel_addr(struct cfx__dpdk_iface *iface)
{
    static struct sock_filter drop_all[] = { BPF_STMT(BPF_RET | BPF_K, 0) };
    struct sock_fprog prog = { .len = 1, .filter = drop_all };
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons(iface->local.port),
                              .sin_addr.s_addr = htonl(iface->local.ip) };
    iface->kernel_fd = -1;
    if (!cfx__dpdk_port_kernel_shared(iface->port))
        return CFX_OK;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) < 0) {
        CFX_LOG(WARN, DPDK, "%s: cannot hold the address in the kernel (%s): a local process "
                "that binds it would see this port's frames", iface->name, strerror(errno));
        if (fd >= 0)
            close(fd);
        return CFX_OK;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        iface->kernel_fd = fd;
        CFX_LOG(DEBUG, DPDK, "%s: the kernel has this address: held (what it gets is dropped)",
                iface->name);
        return CFX_OK;
    }
    int e = errno;
    close(fd);
    if (e == EADDRINUSE)
        return cfx__err(CFX_ERR_BUSY, "dpdk iface_open: UDP %u.%u.%u.%u:%u is bound by another "
                        "socket on this host, which would read this port's frames",
                        iface->local.ip >> 24, iface->local.ip >> 16 & 0xFF,
                        iface->local.ip >> 8 & 0xFF, iface->local.ip & 0xFF, iface->local.port);
    if (e != EADDRNOTAVAIL)
        CFX_LOG(WARN, DPDK, "%s: cannot hold the address in the kernel (%s)", iface->name,
                strerror(e));
    return CFX_OK;
}

static int dpdk_iface_open(const struct cfx_tp_iface_params *params, struct cfx_tp_iface **out)
{
    struct cfx__dpdk_iface *iface;
    unsigned nth = 0;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "dpdk iface_open: NULL argument");
    if ((rc = cfx__dpdk_eal_init(NULL)) != CFX_OK)
        return rc == CFX_ERR_INVALID || cfx__dpdk_eal_why()
                   ? cfx__err(rc == CFX_ERR_INVALID ? rc : CFX_ERR_NO_DEVICE,
                              "dpdk iface_open: %s", cfx_last_error())
                   : cfx__err(CFX_ERR_NO_DEVICE, "dpdk iface_open: DPDK's EAL did not start");
    iface = calloc(1, sizeof(*iface));
    if (!iface)
        return cfx__err(CFX_ERR_NOMEM, "dpdk iface_open: out of memory");
    iface->super.ops = &cfx__dpdk_ops;
    iface->super.node_id = (params && (params->field_mask & CFX_TP_IFACE_PARAM_NODE_ID))
                               ? params->node_id
                               : CFX_DPDK_NODE_NONE;
    cfx_list_init(&iface->eps);
    cfx__tp_graveyard_init(&iface->graveyard, ep_bury);
    struct cfx__tp_strangers_params sp = {
        .who = iface->name, .subsys = "DPDK",
        .env_max = "CFX_DPDK_MAX_UNAUTH", .def_max = CFX_DPDK_UNAUTH_MAX,
        .env_per_ip = "CFX_DPDK_MAX_UNAUTH_PER_IP", .def_per_ip = CFX_DPDK_UNAUTH_PER_IP,
        .evict = cfx__dpdk_ep_evict, .listen = no_listener,
    };
    cfx__tp_strangers_init(&iface->strangers, &sp, false); /* no descriptor per peer */
    cfx__tp_table_init(&iface->mrs, 16, 1u << 24, 32, "dpdk registration");
    cfx__tp_table_init(&iface->eps_tab, 16, 0xFFFEu, 15, "dpdk endpoint");
    /* session ids are (slot, generation): random generations, so that a
     * process restarted on the same address does not send its SYNs under
     * the session ids of its former self, whose sessions a peer may still
     * hold open (accept_syn would take them for repeats and attach the new
     * stream to the old sequence numbers) */
    cfx__tp_table_seed_gen(&iface->eps_tab, (uint32_t)cfx__keystream_next(&iface->keys));

    if ((rc = pick_port(iface, params, &nth)) != CFX_OK)
        goto err_free;
    struct cfx__dpdk_port_params pp = { .name = iface->port_name };
    const char *ip = getenv("CFX_DPDK_IP"), *ip_from = "CFX_DPDK_IP";
    if (!ip && params && (params->field_mask & CFX_TP_IFACE_PARAM_BIND_ADDR)) {
        ip = params->bind_addr;
        ip_from = "the bind address (CFX_BIND_ADDR)";
    }
    if (ip && parse_ip(ip, &pp.ip) != CFX_OK) {
        rc = cfx__err(CFX_ERR_INVALID, "dpdk iface_open: %s '%s' is not an IPv4 address",
                      ip_from, ip);
        goto err_release;
    }
    if (!ip)
        pp.ip = 0x0A4D0000u | ((nth + 1) & 0xFFu); /* 10.77.0.<n + 1> */
    /* a memif client may start before its server: wait for it a while */
    /* a negative one wrapped to 49 days of retries */
    pp.start_wait_ms = (uint32_t)cfx__env_ll_clamp("CFX_DPDK_START_MS", 10000, 0, 3600000);
    pp.tx_copy = cfx__env_ll("CFX_DPDK_TX_ZC", 1) == 0;
    pp.mtu_need = CFX_DPDK_MTU + 20 + 8 + CFX_DPDK_HDR_DATA; /* 1500: IPv4, UDP, data header */
    long long quiet = cfx__env_ll_clamp("CFX_DPDK_QUIET_MS", CFX_DPDK_QUIET_MS, 0, 60000);
    iface->quiet_ns = (uint64_t)quiet * 1000000ull;
    iface->data_at = cfx__now_ns();
    const char *drop = getenv("CFX_DPDK_RX_DROP_PPM");
    if (drop) {
        pp.rx_drop_ppm = (uint32_t)strtoul(drop, NULL, 10);
        pp.rx_drop_seed = 0x5EED0000u + nth;
    }
    cfx__err_clear();
    if ((rc = cfx__dpdk_port_open(&pp, &iface->port)) != CFX_OK) {
        rc = cfx__err(rc, "dpdk iface_open: port %s did not open: %s", iface->port_name,
                      *cfx_last_error() ? cfx_last_error() : cfx_errname(rc));
        goto err_release;
    }
    cfx__dpdk_port_addr(iface->port, &iface->local);
    snprintf(iface->name, sizeof(iface->name), "%s %u.%u.%u.%u:%u", iface->port_name,
             iface->local.ip >> 24, iface->local.ip >> 16 & 0xFF, iface->local.ip >> 8 & 0xFF,
             iface->local.ip & 0xFF, iface->local.port);
    if ((rc = hold_kernel_addr(iface)) != CFX_OK)
        goto err_port;
    if (cfx__tp_cq_init(&iface->cq, CQ_INITIAL, iface->name) != CFX_OK) {
        rc = cfx__err(CFX_ERR_NOMEM, "dpdk iface_open: out of memory");
        goto err_port;
    }
    CFX_LOG(INFO, DPDK, "node %u: dpdk iface on %s", iface->super.node_id, iface->name);
    *out = &iface->super;
    return CFX_OK;

err_port:
    if (iface->kernel_fd >= 0)
        close(iface->kernel_fd);
    cfx__dpdk_port_close(iface->port);
err_release:
    port_release(iface->port_name);
err_free:
    cfx__tp_table_fini(&iface->eps_tab);
    cfx__tp_table_fini(&iface->mrs);
    free(iface);
    return rc;
}

static void dpdk_iface_close(struct cfx_tp_iface *tp_iface)
{
    if (!tp_iface)
        return;
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);
    struct cfx_list *pos, *n;

    iface->now = cfx__now_ns();
    cfx_list_for_each_safe(pos, n, &iface->eps) {
        struct cfx__dpdk_ep *ep = cfx_list_entry(pos, struct cfx__dpdk_ep, link);
        if (ep->state == CFX_DPDK_EP_OPEN)
            cfx__dpdk_ep_goodbye(ep);
        cfx__dpdk_ep_destroy(ep);
    }
    cfx__tp_graveyard_free(&iface->graveyard);
    cfx__dpdk_port_flush(iface->port);
    struct cfx__dpdk_port_stats st;
    cfx__dpdk_port_get_stats(iface->port, &st);
    CFX_LOG(INFO, DPDK,
            "node %u: port %s closed: %" PRIu64 " frames sent (%" PRIu64 " zero-copy, %" PRIu64
            " the device did not take), %" PRIu64 " received (%" PRIu64 " refused, %" PRIu64
            " dropped by the test hook)",
            iface->super.node_id, iface->name, st.tx, st.tx_zc, st.tx_full, st.rx, st.rx_refused,
            st.rx_dropped);
    /* net_memif connects from EAL's interrupt thread: closing a port in the
     * middle of that handshake crashes it (DPDK 22.11), so a port whose link
     * never came up gets a moment to finish first */
    uint64_t until = cfx__deadline_ns(500);
    while (!cfx__dpdk_port_link_up(iface->port) && cfx__now_ns() < until)
        usleep(1000);
    cfx__dpdk_port_close(iface->port);
    if (iface->kernel_fd >= 0)
        close(iface->kernel_fd);
    pthread_mutex_lock(&ports_lock);
    size_t used = strlen(ports_closed);
    if (!strstr(ports_closed, iface->port_name) && used + strlen(iface->port_name) + 3 <
                                                          sizeof(ports_closed))
        snprintf(ports_closed + used, sizeof(ports_closed) - used, "%s%s", used ? ", " : "",
                 iface->port_name);
    pthread_mutex_unlock(&ports_lock);
    port_release(iface->port_name);
    cfx__dpdk_mr_table_free(iface);
    cfx__tp_table_fini(&iface->eps_tab);
    cfx__tp_cq_fini(&iface->cq);
    cfx__keystream_wipe(&iface->keys);
    free(iface);
}

static int dpdk_iface_addr(struct cfx_tp_iface *tp_iface, void *buf, size_t *len)
{
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);
    struct cfx__dpdk_ifaddr a;

    if (!buf || !len || *len < sizeof(a)) {
        if (len)
            *len = sizeof(a);
        return cfx__err(CFX_ERR_INVALID, "dpdk iface_addr: buffer under %zu bytes", sizeof(a));
    }
    memset(&a, 0, sizeof(a));
    a.magic = htole32(CFX_DPDK_ADDR_MAGIC);
    memcpy(a.mac, iface->local.mac, 6);
    a.port = htole16(iface->local.port);
    a.ip = htole32(iface->local.ip);
    a.node_id = htole32(iface->super.node_id);
    memcpy(buf, &a, sizeof(a));
    *len = sizeof(a);
    return CFX_OK;
}

static int dpdk_iface_fd(struct cfx_tp_iface *tp_iface)
{
    return -1;
}

static int dpdk_iface_quiet_ms(struct cfx_tp_iface *tp_iface);

/* A user-space queue has no fd: sleep only as long as a quiet port allows
 * (cfx__progress_nap_ms asks dpdk_iface_quiet_ms how long). */
static int dpdk_iface_arm(struct cfx_tp_iface *tp_iface)
{
    return dpdk_iface_quiet_ms(tp_iface) > 0 ? CFX_OK : CFX_ERR_AGAIN;
}

/*
 * "Interrupt mode" without interrupts: the port's queues turn no fd
 * readable (net_memif and net_af_packet offer no receive interrupt through
 * the ethdev API), so an idle process with open sessions would poll a core
 * for ever.  Once no session packet has come for quiet_ns
 * (CFX_DPDK_QUIET_MS, default 100 ms; 0: never) and nothing is in flight on
 * any endpoint, the engine may leave the port for CFX_DPDK_NAP_MS between
 * polls: a packet arriving meanwhile waits in the port's queue that long at
 * most (its sender retransmits whatever the queue could not hold), and the
 * first data packet puts the port back to continuous polling.  PINGs and
 * PONGs keep a session alive without counting as data.
 */
static int dpdk_iface_quiet_ms(struct cfx_tp_iface *tp_iface)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);
    struct cfx_list *pos;
    if (!iface->quiet_ns || cfx__now_ns() - iface->data_at < iface->quiet_ns ||
        cfx__tp_cq_count(&iface->cq))
        return 0;
    cfx_list_for_each(pos, &iface->eps)
        if (!cfx__dpdk_ep_quiet(cfx_list_entry(pos, struct cfx__dpdk_ep, link)))
            return 0;
    return CFX_DPDK_NAP_MS;
}

static uint64_t dpdk_seal_refused(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__dpdk_iface_of(tp_iface)->n_seal_refused,
                                memory_order_relaxed);
}

static uint64_t dpdk_grant_refused(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__dpdk_iface_of(tp_iface)->n_grant_refused,
                                memory_order_relaxed);
}

static uint64_t dpdk_late_dropped(struct cfx_tp_iface *tp_iface)
{
    return atomic_load_explicit(&cfx__dpdk_iface_of(tp_iface)->n_late_dropped,
                                memory_order_relaxed);
}

const struct cfx_transport_ops cfx__dpdk_ops = {
    .version = CFX_TP_OPS_VERSION,
    .name = "dpdk",
    .caps = CFX_TP_CAP_BUSY_POLL | CFX_TP_CAP_SEAL,
    .iface_open = dpdk_iface_open,
    .iface_close = dpdk_iface_close,
    .iface_addr = dpdk_iface_addr,
    .iface_fd = dpdk_iface_fd,
    .iface_arm = dpdk_iface_arm,
    .ep_connect = cfx__dpdk_ep_connect,
    .ep_close = cfx__dpdk_ep_close,
    .ep_authorize = cfx__dpdk_ep_authorize,
    .mem_reg = cfx__dpdk_mem_reg,
    .mem_dereg = cfx__dpdk_mem_dereg,
    .mr_pack = cfx__dpdk_mr_pack,
    .mr_grant = cfx__dpdk_mr_grant,
    .mr_revoke = cfx__dpdk_mr_revoke,
    .iface_grant_refused = dpdk_grant_refused,
    .iface_late_dropped = dpdk_late_dropped,
    .ep_seal = cfx__dpdk_ep_seal,
    .iface_seal_refused = dpdk_seal_refused,
    .ep_write = cfx__dpdk_ep_write,
    .ep_send = cfx__dpdk_ep_send,
    .poll = dpdk_poll,
    .iface_quiet_ms = dpdk_iface_quiet_ms,
};

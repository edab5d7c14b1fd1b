/*
 * verbs transport: the iface (device, port and GID selection, protection
 * domain, completion queue and channel, async events, progress) and the ops
 * table.
 *
 * Configuration (environment):
 *   CFX_IB_CONNECT      cm (default) or oob: connection establishment
 *   CFX_IB_HCA          device name, optionally name:port (params->device wins)
 *   CFX_IB_GID_INDEX    GID index (oob; with cm the kernel picks the GID by IP)
 *   CFX_IB_SIG_INTERVAL signal every Nth send WR (default 16, at most a quarter of
 *                       the send queue)
 *   CFX_IB_SL, CFX_IB_TC service level (0..15), RoCE traffic class (0..255); 0
 *   CFX_IB_MEMLOCK_MIN  locked memory required at iface_open (default 64M)
 *   CFX_IB_RCACHE_MAX   idle registrations kept cached (default 256)
 *   CFX_IB_FORK_INIT    0: do not call ibv_fork_init() on kernels that need it
 *   CFX_IB_OOB_ACCEPT_MS oob: ms an accepted socket has to finish the exchange (10000)
 *
 * Without a bind address, or with a loopback one that no RDMA device
 * carries, the iface binds to the IPv4 address of the selected port's RoCE
 * v2 GID (the default 127.0.0.1 is useless to a peer on another host).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "verbs.h"

#define SWQ_INITIAL   256
#define FD_CHECK_EVERY 64  /* busy polls between looks at the event fds */
#define EVENTS_MAX    32
#define CQ_ACK_BATCH  64

/* --- helpers ----------------------------------------------------------------- */

int cfx__verbs_status(int err)
{
    switch (err) {
    case 0:
        return CFX_OK;
    case ENODEV:
    case ENXIO:
    case ENOSYS:
        return CFX_ERR_NO_DEVICE;
    case EPERM:
    case EACCES:
        return CFX_ERR_MEMLOCK; /* pinning refused: RLIMIT_MEMLOCK */
    default:
        return cfx__status_from_errno(err);
    }
}

const char *cfx__verbs_mtu_str(enum ibv_mtu mtu)
{
    switch (mtu) {
    case IBV_MTU_256:  return "256";
    case IBV_MTU_512:  return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
    default:           return "?";
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return cfx__status_from_errno(errno);
    return CFX_OK;
}

int cfx__verbs_epoll_add(struct cfx__verbs_iface *iface, int fd, uint32_t events,
                         struct cfx__verbs_src *src)
{
    struct epoll_event ev = { .events = events, .data.ptr = src };
    if (epoll_ctl(iface->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
        return cfx__err(cfx__status_from_errno(errno), "verbs iface %s: epoll_ctl: %s",
                        iface->addr, strerror(errno));
    return CFX_OK;
}

/* --- fork safety, decided once per process ----------------------------------- */

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_decide(void)
{
    switch (ibv_is_fork_initialized()) {
    case IBV_FORK_UNNEEDED:
        CFX_LOG(DEBUG, VERBS, "fork: the kernel keeps registered pages across fork(); "
                "ibv_fork_init() not needed");
        return;
    case IBV_FORK_ENABLED:
        CFX_LOG(INFO, VERBS, "fork: fork support already enabled (RDMAV_FORK_SAFE/IBV_FORK_SAFE)");
        return;
    default:
        break;
    }
    if (cfx__env_ll("CFX_IB_FORK_INIT", 1) == 0) {
        CFX_LOG(WARN, VERBS, "fork: CFX_IB_FORK_INIT=0: a fork() after memory registration "
                "may corrupt RDMA transfers on this kernel");
        return;
    }
    int rc = ibv_fork_init();
    if (rc)
        CFX_LOG(WARN, VERBS, "fork: ibv_fork_init: %s; set RDMAV_FORK_SAFE=1 before start",
                strerror(rc));
    else
        CFX_LOG(INFO, VERBS, "fork: ibv_fork_init() called (registered memory is not "
                "inherited by children)");
}

/* --- locked memory ------------------------------------------------------------ */

static bool have_cap_ipc_lock(void)
{
    struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) != 0)
        return false;
    return data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32));
}

static void size_str(unsigned long long v, char *buf, size_t len)
{
    if (v >= (1ull << 30) && !(v & ((1ull << 30) - 1)))
        snprintf(buf, len, "%llu GiB", v >> 30);
    else if (v >= (1ull << 20) && !(v & ((1ull << 20) - 1)))
        snprintf(buf, len, "%llu MiB", v >> 20);
    else if (v >= 1024 && !(v & 1023))
        snprintf(buf, len, "%llu KiB", v >> 10);
    else
        snprintf(buf, len, "%llu bytes", v);
}

static int memlock_check(void)
{
    struct rlimit rl;
    char cur[32], need_s[32];

    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return CFX_OK;
    if (have_cap_ipc_lock()) /* the kernel does not count pinned pages then */
        return CFX_OK;
    unsigned long long need = cfx__env_size("CFX_IB_MEMLOCK_MIN", CFX_VERBS_MEMLOCK_NEED);
    if ((unsigned long long)rl.rlim_cur >= need)
        return CFX_OK;
    size_str((unsigned long long)rl.rlim_cur, cur, sizeof(cur));
    size_str(need, need_s, sizeof(need_s));
    return cfx__err(CFX_ERR_MEMLOCK,
                    "verbs: the locked-memory limit (RLIMIT_MEMLOCK) is %s but RDMA "
                    "registration of the arena and the per-connection rings needs at least %s: "
                    "run 'ulimit -l unlimited' in the shell that starts the job, or add "
                    "'* - memlock unlimited' to /etc/security/limits.conf and log in again, or "
                    "set LimitMEMLOCK=infinity in the systemd unit (docker: --ulimit memlock=-1); "
                    "CFX_IB_MEMLOCK_MIN changes the amount required",
                    cur, need_s);
}

/* --- device, port and GID selection -------------------------------------------- */

struct devsel {
    struct ibv_context *ctx;      /* open; NULL: nothing found */
    uint8_t port;
    int gid_index;
    struct ibv_gid_entry gid;
    struct ibv_port_attr pattr;
    struct in_addr ip;            /* IPv4 of the GID, if any */
    bool have_ip;
    int score;
};

/* How well GID entry @p e fits: 0 not at all, higher is better. */
static int gid_score(const struct ibv_gid_entry *e, uint8_t ll, const struct in_addr *want,
                     struct in_addr *ip)
{
    if (ll != IBV_LINK_LAYER_ETHERNET) /* IB: the GID says nothing about IP */
        return e->gid_index == 0 ? 1 : 0;
    if (!cfx__verbs_gid_ipv4(&e->gid, ip))
        return 0;
    if (want && ip->s_addr != want->s_addr)
        return 0;
    return e->gid_type == IBV_GID_TYPE_ROCE_V2 ? 3 : 2;
}

static void note(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    va_list ap;
    if (used + 3 >= len)
        return;
    if (used) {
        strcat(buf, "; ");
        used += 2;
    }
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/*
 * Pick device, port and GID.  @p hca: device name or NULL; @p hca_port: 0 any;
 * @p gid_index: -1 automatic; @p want: IPv4 the GID must carry, or NULL.
 */
static int select_device(struct ibv_device **list, int n, const char *hca, int hca_port,
                         int gid_index, const struct in_addr *want, struct devsel *best,
                         char *why, size_t why_len)
{
    memset(best, 0, sizeof(*best));
    for (int d = 0; d < n; d++) {
        const char *name = ibv_get_device_name(list[d]);
        if (hca && strcmp(hca, name))
            continue;
        struct ibv_context *ctx = ibv_open_device(list[d]);
        struct ibv_device_attr da;
        if (!ctx) {
            note(why, why_len, "%s: cannot open (%s)", name, strerror(errno));
            continue;
        }
        if (ibv_query_device(ctx, &da)) {
            note(why, why_len, "%s: ibv_query_device failed", name);
            ibv_close_device(ctx);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt; p++) {
            struct ibv_port_attr pa;
            bool used = false;
            if (hca_port && p != hca_port)
                continue;
            if (ibv_query_port(ctx, (uint8_t)p, &pa)) {
                note(why, why_len, "%s port %d: ibv_query_port failed", name, p);
                continue;
            }
            if (pa.state != IBV_PORT_ACTIVE) {
                note(why, why_len, "%s port %d is %s", name, p, cfx__verbs_port_state_str(pa.state));
                continue;
            }
            for (int i = 0; i < pa.gid_tbl_len; i++) {
                struct ibv_gid_entry e;
                struct in_addr ip = { 0 };
                int s;
                if (gid_index >= 0 && i != gid_index)
                    continue;
                if (ibv_query_gid_ex(ctx, (uint32_t)p, (uint32_t)i, &e, 0))
                    continue;
                if (gid_index >= 0)
                    s = 10 + (cfx__verbs_gid_ipv4(&e.gid, &ip) ? 1 : 0);
                else
                    s = gid_score(&e, pa.link_layer, want, &ip);
                if (s <= best->score)
                    continue;
                if (best->ctx && best->ctx != ctx)
                    ibv_close_device(best->ctx);
                best->ctx = ctx;
                best->port = (uint8_t)p;
                best->gid_index = i;
                best->gid = e;
                best->pattr = pa;
                best->ip = ip;
                best->have_ip = pa.link_layer == IBV_LINK_LAYER_ETHERNET &&
                                cfx__verbs_gid_ipv4(&e.gid, &ip);
                best->score = s;
                used = true;
            }
            if (!used) {
                char ws[INET_ADDRSTRLEN] = "";
                if (want)
                    inet_ntop(AF_INET, want, ws, sizeof(ws));
                if (gid_index >= 0)
                    note(why, why_len, "%s port %d has no GID at index %d", name, p, gid_index);
                else
                    note(why, why_len, "%s port %d has no RoCE GID for %s", name, p,
                         want ? ws : "any IPv4 address");
            }
        }
        if (best->ctx != ctx)
            ibv_close_device(ctx);
    }
    if (!best->ctx) {
        if (hca && !why[0])
            note(why, why_len, "no device named '%s'", hca);
        return CFX_ERR_NO_DEVICE;
    }
    return CFX_OK;
}

static bool ip_is_wildcard(struct in_addr a)
{
    uint32_t h = ntohl(a.s_addr);
    return h == 0 || (h >> 24) == 127;
}

/* Record the chosen port's attributes on the iface. */
static void iface_take_port(struct cfx__verbs_iface *iface, const struct ibv_port_attr *pa)
{
    iface->link_layer = pa->link_layer;
    iface->active_mtu = pa->active_mtu;
    iface->lid = pa->lid;
}

/*
 * Choose the device, port, GID and (when not given) the IP address, and
 * open the device in iface->ctx.  With cm, rdma_cm has the last word on the
 * device: cfx__verbs_iface_use_device() switches when it binds the IP
 * elsewhere.
 */
static int iface_select(struct cfx__verbs_iface *iface, const char *hca_spec, int gid_index)
{
    struct ibv_device **list;
    char hca[64] = "", why[512] = "";
    int hca_port = 0, n, rc;
    struct devsel sel;

    if (hca_spec && *hca_spec) {
        snprintf(hca, sizeof(hca), "%s", hca_spec);
        char *colon = strchr(hca, ':');
        if (colon) {
            *colon = '\0';
            hca_port = atoi(colon + 1);
            if (hca_port <= 0 || hca_port > 255)
                return cfx__err(CFX_ERR_INVALID, "verbs: CFX_IB_HCA '%s': bad port number",
                                hca_spec);
        }
    }
    if ((rc = cfx__verbs_device_list(&list, &n)) != CFX_OK)
        return rc;

    /* Fork support is decided before anything is registered. */
    pthread_once(&fork_once, fork_decide);

    bool wildcard = ip_is_wildcard(iface->ip);
    rc = select_device(list, n, hca[0] ? hca : NULL, hca_port, gid_index, &iface->ip, &sel,
                       why, sizeof(why));
    if (rc != CFX_OK && (wildcard || iface->mode == CFX_VERBS_CM)) {
        /* Loopback: any port will do, and we take its address.  cm with a
         * routable IP: rdma_cm decides (an IB port's GID carries no IP). */
        why[0] = '\0';
        rc = select_device(list, n, hca[0] ? hca : NULL, hca_port, gid_index, NULL, &sel, why,
                           sizeof(why));
        if (rc == CFX_OK && wildcard) {
            if (!sel.have_ip) {
                ibv_close_device(sel.ctx);
                rc = cfx__err(CFX_ERR_NO_DEVICE,
                              "verbs: device %s port %u has no IPv4 GID to bind to: set the "
                              "bind address (CFX_BIND_ADDR) to the IP of its network interface",
                              ibv_get_device_name(sel.ctx->device), sel.port);
                goto out;
            }
            iface->ip = sel.ip;
            inet_ntop(AF_INET, &iface->ip, iface->ip_str, sizeof(iface->ip_str));
        }
    }
    if (rc != CFX_OK) {
        rc = cfx__err(CFX_ERR_NO_DEVICE, "verbs: no usable RDMA port%s%s for %s: %s",
                      hca[0] ? " on " : "", hca, iface->ip_str, why[0] ? why : "no device");
        goto out;
    }

    snprintf(iface->dev_name, sizeof(iface->dev_name), "%s", ibv_get_device_name(sel.ctx->device));
    iface->port_num = sel.port;
    iface->gid_index = sel.gid_index;
    iface->gid = sel.gid.gid;
    iface->gid_type = sel.gid.gid_type;
    iface_take_port(iface, &sel.pattr);
    iface->ctx = sel.ctx;
    iface->own_ctx = true;
out:
    ibv_free_device_list(list);
    return rc;
}

int cfx__verbs_iface_use_device(struct cfx__verbs_iface *iface, const char *name, uint8_t port)
{
    struct ibv_device **list;
    struct devsel sel;
    char why[256] = "";
    int n, rc;

    if ((rc = cfx__verbs_device_list(&list, &n)) != CFX_OK)
        return rc;
    rc = select_device(list, n, name, port, -1, &iface->ip, &sel, why, sizeof(why));
    if (rc != CFX_OK)
        rc = select_device(list, n, name, port, -1, NULL, &sel, why, sizeof(why));
    ibv_free_device_list(list);
    if (rc != CFX_OK)
        return cfx__err(CFX_ERR_NO_DEVICE, "verbs: cannot use device %s port %u for %s: %s",
                        name, port, iface->ip_str, why);
    if (iface->own_ctx && iface->ctx)
        ibv_close_device(iface->ctx);
    iface->ctx = sel.ctx;
    iface->own_ctx = true;
    snprintf(iface->dev_name, sizeof(iface->dev_name), "%s", name);
    iface->port_num = sel.port;
    iface->gid_index = sel.gid_index;
    iface->gid = sel.gid.gid;
    iface->gid_type = sel.gid.gid_type;
    iface_take_port(iface, &sel.pattr);
    return CFX_OK;
}

static void log_selection(struct cfx__verbs_iface *iface)
{
    char gs[INET6_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET6, iface->gid.raw, gs, sizeof(gs));
    CFX_LOG(INFO, VERBS, "iface %s: device %s port %u (%s, active MTU %s), GID index %d "
            "(%s, %s)%s, connect via %s",
            iface->addr, iface->dev_name, iface->port_num,
            cfx__verbs_link_layer_str(iface->link_layer), cfx__verbs_mtu_str(iface->active_mtu),
            iface->gid_index, cfx__verbs_gid_type_str(iface->gid_type, iface->link_layer), gs,
            iface->mode == CFX_VERBS_CM ? " (rdma_cm resolves the GID of each route)" : "",
            iface->mode == CFX_VERBS_CM ? "rdma_cm" : "out-of-band TCP");
}

/* --- software completion queue ------------------------------------------------- */

/* Pop up to @p max completions.  A receive buffer whose completion leaves
 * here is re-posted at the next poll (its data lives until then). */
static int swq_drain(struct cfx__verbs_iface *iface, struct cfx_tp_completion *out, int max)
{
    struct cfx_tp_completion *c;
    int n = 0;
    while (n < max && (c = cfx__tp_cq_head(&iface->swq))) {
        if (c->type == CFX_TP_COMP_RECV || c->type == CFX_TP_COMP_WRITE_IMM) {
            struct cfx__verbs_ep *ep = cfx__verbs_ep_of(c->ep);
            ep->repost_later[ep->n_repost_later++] = (uint32_t)c->wr_id; /* buffer index */
            if (ep->n_repost_later == 1)
                cfx_list_add_tail(&ep->later_link, &iface->later);
            c->wr_id = 0;
        }
        out[n++] = *c;
        cfx__tp_cq_pop(&iface->swq);
    }
    return n;
}

/* --- hardware completion queue ---------------------------------------------------- */

int cfx__verbs_cq_reserve(struct cfx__verbs_iface *iface, uint32_t n)
{
    uint32_t need = iface->cq_reserved + n;
    if (need > iface->cq_size) {
        uint32_t want = CFX_MAX(need, iface->cq_size * 2);
        if (want > (uint32_t)iface->dev_attr.max_cqe)
            want = (uint32_t)iface->dev_attr.max_cqe;
        if (want < need)
            return cfx__err(CFX_ERR_NO_RESOURCE, "verbs iface %s: completion queue of %s "
                            "cannot hold %u entries (max_cqe %d): too many endpoints",
                            iface->addr, iface->dev_name, need, iface->dev_attr.max_cqe);
        int err = ibv_resize_cq(iface->cq, (int)want);
        if (err)
            return cfx__err(CFX_ERR_NO_RESOURCE, "verbs iface %s: ibv_resize_cq to %u: %s",
                            iface->addr, want, strerror(err));
        iface->cq_size = (uint32_t)iface->cq->cqe;
        CFX_LOG(DEBUG, VERBS, "iface %s: completion queue resized to %u", iface->addr,
                iface->cq_size);
    }
    iface->cq_reserved = need;
    return CFX_OK;
}

void cfx__verbs_cq_unreserve(struct cfx__verbs_iface *iface, uint32_t n)
{
    iface->cq_reserved -= n;
}

/* Poll the CQ dry (bounded), then let touched endpoints re-post and
 * return credits.  Returns the CQEs seen. */
static int cq_pass(struct cfx__verbs_iface *iface)
{
    struct ibv_wc wc[CFX_VERBS_CQ_BURST];
    int total = 0;

    for (int round = 0; round < 8; round++) {
        int n = ibv_poll_cq(iface->cq, CFX_VERBS_CQ_BURST, wc);
        if (unlikely(n < 0)) {
            CFX_LOG(ERR, VERBS, "iface %s: ibv_poll_cq failed (%d)", iface->addr, n);
            break;
        }
        for (int i = 0; i < n; i++)
            cfx__verbs_ep_process_wc(iface, &wc[i]);
        total += n;
        if (n < CFX_VERBS_CQ_BURST)
            break;
    }
    while (!cfx_list_empty(&iface->touched)) {
        struct cfx__verbs_ep *ep = cfx_list_entry(iface->touched.next, struct cfx__verbs_ep,
                                                  touch_link);
        cfx_list_del(&ep->touch_link);
        ep->touched = false;
        cfx__verbs_ep_after_pass(ep);
    }
    return total;
}

int cfx__verbs_cq_pass(struct cfx__verbs_iface *iface)
{
    return cq_pass(iface);
}

static void comp_channel_drain(struct cfx__verbs_iface *iface)
{
    struct ibv_cq *cq;
    void *cq_ctx;
    while (ibv_get_cq_event(iface->comp_ch, &cq, &cq_ctx) == 0)
        iface->cq_unacked++;
    if (iface->cq_unacked >= CQ_ACK_BATCH) {
        ibv_ack_cq_events(iface->cq, iface->cq_unacked);
        iface->cq_unacked = 0;
    }
}

/* --- async events ----------------------------------------------------------------- */

static void fail_all(struct cfx__verbs_iface *iface, int status, const char *why)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &iface->eps) {
        struct cfx__verbs_ep *ep = cfx_list_entry(pos, struct cfx__verbs_ep, link);
        CFX_VERBS_EP_FAIL(ep, ERR, status, "%s", why);
    }
}

void cfx__verbs_async_progress(struct cfx__verbs_iface *iface)
{
    struct ibv_async_event ev;

    while (ibv_get_async_event(iface->ctx, &ev) == 0) {
        const char *what = ibv_event_type_str(ev.event_type);
        struct cfx__verbs_ep *ep;

        switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
            ep = cfx__verbs_ep_of_qp(iface, ev.element.qp);
            if (ep && ev.event_type == IBV_EVENT_QP_ACCESS_ERR) {
                cfx__verbs_ep_write_refused(ep, what);
            } else if (ep) {
                CFX_VERBS_EP_FAIL(ep, ERR, CFX_ERR_PEER_FAILED, "async event %s on QP %#x",
                                  what, ev.element.qp->qp_num);
            } else {
                CFX_LOG(WARN, VERBS, "iface %s: async event %s on QP %#x of another iface",
                        iface->addr, what, ev.element.qp->qp_num);
            }
            break;
        case IBV_EVENT_CQ_ERR:
            CFX_LOG(ERR, VERBS, "iface %s: async event %s: completions were lost",
                    iface->addr, what);
            if (ev.element.cq == iface->cq)
                fail_all(iface, CFX_ERR_INTERNAL, "completion queue overrun");
            break;
        case IBV_EVENT_DEVICE_FATAL:
            CFX_LOG(ERR, VERBS, "iface %s: device %s: %s", iface->addr, iface->dev_name, what);
            fail_all(iface, CFX_ERR_NO_DEVICE, "device fatal error");
            break;
        case IBV_EVENT_PORT_ERR:
            if (ev.element.port_num == iface->port_num)
                CFX_LOG(WARN, VERBS, "iface %s: device %s port %d went down (%s); "
                        "connections fail when their retries run out", iface->addr,
                        iface->dev_name, ev.element.port_num, what);
            break;
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER:
            CFX_LOG(INFO, VERBS, "iface %s: device %s port %d: %s", iface->addr,
                    iface->dev_name, ev.element.port_num, what);
            break;
        default:
            CFX_LOG(DEBUG, VERBS, "iface %s: async event %s", iface->addr, what);
            break;
        }
        ibv_ack_async_event(&ev);
    }
}

/* --- progress ----------------------------------------------------------------------- */

static void fds_progress(struct cfx__verbs_iface *iface)
{
    struct epoll_event evs[EVENTS_MAX];
    int n = epoll_wait(iface->epfd, evs, EVENTS_MAX, 0);

    for (int i = 0; i < n; i++) {
        struct cfx__verbs_src *src = evs[i].data.ptr;
        switch (src->kind) {
        case CFX_VERBS_SRC_COMP:
            comp_channel_drain(iface);
            break;
        case CFX_VERBS_SRC_ASYNC:
            cfx__verbs_async_progress(iface);
            break;
        case CFX_VERBS_SRC_CM:
            cfx__verbs_cm_progress(iface);
            break;
        case CFX_VERBS_SRC_LISTEN:
            cfx__verbs_oob_accept(iface);
            break;
        case CFX_VERBS_SRC_OOB_EP:
            cfx__verbs_oob_progress(container_of(src, struct cfx__verbs_ep, oob_src),
                                    evs[i].events);
            break;
        }
    }
    iface->poll_count = 0;
    uint64_t now = cfx__now_ns();
    if (now > iface->accept_check) {
        iface->accept_check = now + 100 * 1000000ull;
        if (iface->mode == CFX_VERBS_OOB)
            cfx__verbs_oob_accept_expire(iface, now);
        cfx__tp_strangers_tick(&iface->strangers, now);
        CFX_RATELOG_FLUSH(&iface->expire_log, VERBS, now);
        CFX_RATELOG_FLUSH(&iface->accept_log, VERBS, now);
    }
}

static void ep_bury(struct cfx_list *link)
{
    cfx__verbs_ep_destroy(cfx_list_entry(link, struct cfx__verbs_ep, link));
}

static void free_graveyard(struct cfx__verbs_iface *iface)
{
    /* Take what the CQ still holds for the dying QPs first. */
    cq_pass(iface);
    cfx__tp_graveyard_free(&iface->graveyard);
}

static void repost_deferred(struct cfx__verbs_iface *iface)
{
    while (!cfx_list_empty(&iface->later)) {
        struct cfx__verbs_ep *ep = cfx_list_entry(iface->later.next, struct cfx__verbs_ep,
                                                  later_link);
        cfx_list_del(&ep->later_link);
        cfx__verbs_ep_repost_later(ep);
    }
}

static int verbs_poll(struct cfx_tp_iface *tp_iface, struct cfx_tp_completion *comps, int max)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    if (unlikely(!tp_iface || (!comps && max > 0) || max < 0))
        return CFX_ERR_INVALID;
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_iface);

    /* RECV data returned by the previous poll() is released from here on. */
    if (unlikely(!cfx__tp_graveyard_empty(&iface->graveyard)))
        free_graveyard(iface);
    if (!cfx_list_empty(&iface->later))
        repost_deferred(iface);

    int n = swq_drain(iface, comps, max);
    if (n < max) {
        int got = cq_pass(iface);
        /* The fds (connection events, async events, oob sockets) are looked
         * at when the CQ is quiet, and at least every FD_CHECK_EVERY polls. */
        if (!got || ++iface->poll_count >= FD_CHECK_EVERY)
            fds_progress(iface);
        n += swq_drain(iface, comps + n, max - n);
    }
    return n ? n : cfx__tp_cq_take_status(&iface->swq);
}

static int verbs_iface_arm(struct cfx_tp_iface *tp_iface)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    if (!tp_iface)
        return CFX_ERR_INVALID;
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_iface);

    /* Receive buffers waiting for the next poll() would leave the peer
     * without credits while we sleep. */
    if (cfx__tp_cq_count(&iface->swq) || !cfx_list_empty(&iface->later) ||
        !cfx__tp_graveyard_empty(&iface->graveyard))
        return CFX_ERR_AGAIN;
    comp_channel_drain(iface);
    if (iface->cq_unacked) {
        ibv_ack_cq_events(iface->cq, iface->cq_unacked);
        iface->cq_unacked = 0;
    }
    int err = ibv_req_notify_cq(iface->cq, 0);
    if (err) {
        CFX_LOG(ERR, VERBS, "iface %s: ibv_req_notify_cq: %s", iface->addr, strerror(err));
        return CFX_ERR_AGAIN; /* cannot sleep safely: keep polling */
    }
    /* A CQE that arrived before the request raised no event: look again. */
    if (cq_pass(iface) || cfx__tp_cq_count(&iface->swq))
        return CFX_ERR_AGAIN;
    return CFX_OK;
}

static int verbs_iface_fd(struct cfx_tp_iface *tp_iface)
{
    return tp_iface ? cfx__verbs_iface_of(tp_iface)->epfd : -1;
}

static int verbs_iface_addr(struct cfx_tp_iface *tp_iface, void *buf, size_t *len)
{
    if (!tp_iface || !len || (!buf && *len))
        return cfx__err(CFX_ERR_INVALID, "verbs iface_addr: NULL argument");
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_iface);
    size_t need = strlen(iface->addr) + 1;
    if (*len < need) {
        *len = need;
        return cfx__err(CFX_ERR_TRUNCATED, "verbs iface_addr: need %zu bytes", need);
    }
    memcpy(buf, iface->addr, need);
    *len = need;
    return CFX_OK;
}

/* --- open / close ------------------------------------------------------------------- */

/* Strangers (tpbase/tp_strangers.h): accepted eps whose peer has not proven
 * the token hold a QP, registered buffers and CQ room each; they are capped
 * as tcp's are.  A stranger closed for a newcomer fails CFX_ERR_NO_RESOURCE
 * (the engine drops it), one not yet shown goes away. */
static void stranger_evict(struct cfx__tp_stranger *st, const char *why)
{
    struct cfx__verbs_ep *ep = container_of(st, struct cfx__verbs_ep, stranger);
    ep->super.why = why;
    CFX_VERBS_EP_FAIL(ep, INFO, CFX_ERR_NO_RESOURCE, "%s", why);
}

/* oob: the listener's events on or off (a pause out of descriptors). */
static void listen_events(struct cfx__tp_strangers *s, bool on)
{
    struct cfx__verbs_iface *iface = container_of(s, struct cfx__verbs_iface, strangers);
    if (iface->listen_fd < 0)
        return;
    struct epoll_event ev = { .events = on ? EPOLLIN : 0, .data.ptr = &iface->listen_src };
    epoll_ctl(iface->epfd, EPOLL_CTL_MOD, iface->listen_fd, &ev);
}

static void iface_release(struct cfx__verbs_iface *iface)
{
    cfx__verbs_rcache_destroy(iface->rcache);
    if (iface->nop_mr)
        ibv_dereg_mr(iface->nop_mr);
    free(iface->nop_buf);
    if (iface->cq) {
        if (iface->cq_unacked)
            ibv_ack_cq_events(iface->cq, iface->cq_unacked);
        ibv_destroy_cq(iface->cq);
    }
    if (iface->comp_ch)
        ibv_destroy_comp_channel(iface->comp_ch);
    if (iface->pd)
        ibv_dealloc_pd(iface->pd);
    if (iface->mode == CFX_VERBS_CM)
        cfx__verbs_cm_close(iface);
    else
        cfx__verbs_oob_close(iface);
    if (iface->own_ctx && iface->ctx)
        ibv_close_device(iface->ctx);
    if (iface->epfd >= 0)
        close(iface->epfd);
    cfx__tp_table_fini(&iface->ep_tab);
    cfx__tp_strangers_fini(&iface->strangers);
    cfx__tp_cq_fini(&iface->swq);
    free(iface);
}

static int verbs_iface_open(const struct cfx_tp_iface_params *params, struct cfx_tp_iface **out)
{
    const char *bind_addr = "127.0.0.1";
    const char *hca = NULL;
    struct cfx__verbs_iface *iface;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "verbs iface_open: NULL out");
    if (params && (params->field_mask & CFX_TP_IFACE_PARAM_BIND_ADDR) && params->bind_addr)
        bind_addr = params->bind_addr;
    if (params && (params->field_mask & CFX_TP_IFACE_PARAM_DEVICE) && params->device)
        hca = params->device;
    else
        hca = cfx__env_str("CFX_IB_HCA", NULL);

    iface = calloc(1, sizeof(*iface));
    if (!iface)
        return cfx__err(CFX_ERR_NOMEM, "verbs iface_open: out of memory");
    iface->super.ops = &cfx__verbs_ops;
    iface->super.node_id = (params && (params->field_mask & CFX_TP_IFACE_PARAM_NODE_ID))
                               ? params->node_id : CFX_VERBS_NODE_NONE;
    iface->epfd = -1;
    iface->listen_fd = -1;
    iface->gid_index = -1;
    cfx__tp_table_init(&iface->ep_tab, 16, CFX_VERBS_EP_MAX, 15, "verbs endpoint");
    iface->comp_src.kind = CFX_VERBS_SRC_COMP;
    iface->async_src.kind = CFX_VERBS_SRC_ASYNC;
    iface->cm_src.kind = CFX_VERBS_SRC_CM;
    iface->listen_src.kind = CFX_VERBS_SRC_LISTEN;
    cfx_list_init(&iface->eps);
    cfx__tp_graveyard_init(&iface->graveyard, ep_bury);
    cfx_list_init(&iface->touched);
    cfx_list_init(&iface->later);

    const char *mode = cfx__env_str("CFX_IB_CONNECT", "cm");
    if (!strcmp(mode, "cm")) {
        iface->mode = CFX_VERBS_CM;
    } else if (!strcmp(mode, "oob")) {
        iface->mode = CFX_VERBS_OOB;
    } else {
        free(iface);
        return cfx__err(CFX_ERR_INVALID, "verbs: CFX_IB_CONNECT='%s': use cm or oob", mode);
    }
    if (inet_pton(AF_INET, bind_addr, &iface->ip) != 1) {
        free(iface);
        return cfx__err(CFX_ERR_INVALID, "verbs iface_open: bind address '%s' is not an IPv4 "
                        "address", bind_addr);
    }
    snprintf(iface->ip_str, sizeof(iface->ip_str), "%s", bind_addr);
    snprintf(iface->addr, sizeof(iface->addr), "verbs(%s)", bind_addr); /* until listening */
    struct cfx__tp_strangers_params sp = {
        .who = iface->addr, .subsys = "VERBS",
        .env_max = "CFX_IB_MAX_UNAUTH", .def_max = CFX_VERBS_UNAUTH_MAX,
        .env_per_ip = "CFX_IB_MAX_UNAUTH_PER_IP", .def_per_ip = CFX_VERBS_UNAUTH_PER_IP,
        .evict = stranger_evict, .listen = listen_events,
    };
    cfx__tp_strangers_init(&iface->strangers, &sp, iface->mode == CFX_VERBS_OOB);
    if ((rc = cfx__tp_cq_init(&iface->swq, SWQ_INITIAL, iface->addr)) != CFX_OK) {
        rc = cfx__err(rc, "verbs iface_open: out of memory");
        goto err_free;
    }

    long long gid_index = cfx__env_ll("CFX_IB_GID_INDEX", -1);
    if (gid_index >= 0 && iface->mode == CFX_VERBS_CM)
        CFX_LOG(INFO, VERBS, "CFX_IB_GID_INDEX applies to CFX_IB_CONNECT=oob; rdma_cm picks "
                "the GID from the IP address");
    if ((rc = iface_select(iface, hca, iface->mode == CFX_VERBS_OOB ? (int)gid_index : -1))
        != CFX_OK)
        goto err_free;
    if ((rc = memlock_check()) != CFX_OK)
        goto err_release;

    iface->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (iface->epfd < 0) {
        rc = cfx__err(cfx__status_from_errno(errno), "verbs iface_open: epoll_create1: %s",
                      strerror(errno));
        goto err_release;
    }
    rc = iface->mode == CFX_VERBS_CM ? cfx__verbs_cm_listen(iface) : cfx__verbs_oob_listen(iface);
    if (rc != CFX_OK)
        goto err_release;
    size_t hca_len = hca ? strcspn(hca, ":") : 0;
    if (iface->mode == CFX_VERBS_CM && hca_len &&
        (strlen(iface->dev_name) != hca_len || strncmp(hca, iface->dev_name, hca_len))) {
        rc = cfx__err(CFX_ERR_INVALID, "verbs: CFX_IB_HCA=%s, but %s belongs to device %s",
                      hca, iface->ip_str, iface->dev_name);
        goto err_release;
    }

    if (ibv_query_device(iface->ctx, &iface->dev_attr)) {
        rc = cfx__err(CFX_ERR_NO_DEVICE, "verbs: ibv_query_device(%s) failed", iface->dev_name);
        goto err_release;
    }
    /* Grants to an endpoint are type-2 memory windows where the device has
     * them (verbs.h); CFX_IB_GRANT_MW=0 uses per-grant registrations. */
    iface->has_mw2 = iface->dev_attr.max_mw > 0 &&
                     (iface->dev_attr.device_cap_flags &
                      (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)) &&
                     cfx__env_ll("CFX_IB_GRANT_MW", 1) != 0;
    CFX_LOG(DEBUG, VERBS, "verbs: device %s: write grants by %s", iface->dev_name,
            iface->has_mw2 ? "type-2 memory windows" : "per-grant registrations");
    /* A power of two: send WR sequences index the WR table modulo 2^32. */
    iface->sq_depth = CFX_VERBS_SQ_DEPTH;
    while (iface->sq_depth > (uint32_t)iface->dev_attr.max_qp_wr)
        iface->sq_depth /= 2;
    iface->rq_depth = CFX_MIN(CFX_VERBS_RQ_DEPTH, (uint32_t)iface->dev_attr.max_qp_wr);
    iface->sig_interval = (uint32_t)cfx__env_ll_clamp("CFX_IB_SIG_INTERVAL",
                                                      CFX_MIN(CFX_VERBS_SIG_INTERVAL,
                                                              CFX_MAX(1u, iface->sq_depth / 4)),
                                                      1, CFX_MAX(1u, iface->sq_depth / 4));
    /* read once per interface (a warning per connection otherwise): an SL
     * is 4 bits, a traffic class 8; past them they were cut to other values */
    iface->sl = (uint8_t)cfx__env_ll_clamp("CFX_IB_SL", 0, 0, 15);
    iface->tc = (uint8_t)cfx__env_ll_clamp("CFX_IB_TC", 0, 0, 255);
    if (iface->sq_depth < 8 || iface->rq_depth < 8) {
        rc = cfx__err(CFX_ERR_NO_DEVICE, "verbs: device %s allows only %d WRs per queue",
                      iface->dev_name, iface->dev_attr.max_qp_wr);
        goto err_release;
    }

    iface->pd = ibv_alloc_pd(iface->ctx);
    if (!iface->pd) {
        rc = cfx__err(cfx__verbs_status(errno), "verbs: ibv_alloc_pd(%s): %s", iface->dev_name,
                      strerror(errno));
        goto err_release;
    }
    iface->comp_ch = ibv_create_comp_channel(iface->ctx);
    if (!iface->comp_ch || set_nonblock(iface->comp_ch->fd) != CFX_OK) {
        rc = cfx__err(cfx__verbs_status(errno), "verbs: completion channel on %s: %s",
                      iface->dev_name, strerror(errno));
        goto err_release;
    }
    int cqe = CFX_MIN(4 * CFX_VERBS_CQ_MIN, iface->dev_attr.max_cqe);
    iface->cq = ibv_create_cq(iface->ctx, cqe, iface, iface->comp_ch, 0);
    if (!iface->cq) {
        rc = cfx__err(cfx__verbs_status(errno), "verbs: ibv_create_cq(%d) on %s: %s", cqe,
                      iface->dev_name, strerror(errno));
        goto err_release;
    }
    iface->cq_size = (uint32_t)iface->cq->cqe;
    if (posix_memalign(&iface->nop_buf, 4096, 4096)) {
        iface->nop_buf = NULL;
        rc = cfx__err(CFX_ERR_NOMEM, "verbs iface_open: out of memory");
        goto err_release;
    }
    memset(iface->nop_buf, 0, 4096);
    iface->nop_mr = ibv_reg_mr(iface->pd, iface->nop_buf, 64,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!iface->nop_mr) {
        rc = cfx__err(cfx__verbs_status(errno), "verbs: ibv_reg_mr of %d bytes on %s: %s%s",
                      64, iface->dev_name, strerror(errno),
                      errno == EPERM || errno == ENOMEM ? " (check 'ulimit -l')" : "");
        goto err_release;
    }
    if ((rc = cfx__verbs_rcache_open(iface)) != CFX_OK)
        goto err_release;

    if (set_nonblock(iface->ctx->async_fd) != CFX_OK ||
        (rc = cfx__verbs_epoll_add(iface, iface->comp_ch->fd, EPOLLIN, &iface->comp_src)) ||
        (rc = cfx__verbs_epoll_add(iface, iface->ctx->async_fd, EPOLLIN, &iface->async_src))) {
        if (rc == CFX_OK)
            rc = cfx__err(CFX_ERR_IO, "verbs: cannot make the async event fd non-blocking");
        goto err_release;
    }

    log_selection(iface);
    CFX_LOG(DEBUG, VERBS, "iface %s: SQ %u, RQ %u, signal every %u, CQ %u, max_inline asked %u",
            iface->addr, iface->sq_depth, iface->rq_depth, iface->sig_interval, iface->cq_size,
            CFX_VERBS_INLINE_WANT);
    *out = &iface->super;
    return CFX_OK;

err_release:
    iface_release(iface);
    return rc;
err_free:
    cfx__tp_strangers_fini(&iface->strangers);
    cfx__tp_cq_fini(&iface->swq);
    free(iface);
    return rc;
}

static void verbs_iface_close(struct cfx_tp_iface *tp_iface)
{
    if (!tp_iface)
        return;
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_iface);

    while (!cfx_list_empty(&iface->eps))
        cfx__verbs_ep_close(&cfx_list_entry(iface->eps.next, struct cfx__verbs_ep, link)->super);
    free_graveyard(iface);
    iface_release(iface);
}

static uint64_t verbs_iface_grant_refused(struct cfx_tp_iface *tp_iface)
{
    return tp_iface ? atomic_load_explicit(&cfx__verbs_iface_of(tp_iface)->n_grant_refused,
                                           memory_order_relaxed)
                    : 0;
}

const struct cfx_transport_ops cfx__verbs_ops = {
    .version     = CFX_TP_OPS_VERSION,
    .name        = "verbs",
    .caps        = 0,
    .iface_open  = verbs_iface_open,
    .iface_close = verbs_iface_close,
    .iface_addr  = verbs_iface_addr,
    .iface_fd    = verbs_iface_fd,
    .iface_arm   = verbs_iface_arm,
    .ep_connect  = cfx__verbs_ep_connect,
    .ep_close    = cfx__verbs_ep_close,
    .mem_reg     = cfx__verbs_mem_reg,
    .mem_dereg   = cfx__verbs_mem_dereg,
    .mr_pack     = cfx__verbs_mr_pack,
    .mr_grant    = cfx__verbs_mr_grant,
    .mr_revoke   = cfx__verbs_mr_revoke,
    .iface_grant_refused = verbs_iface_grant_refused,
    .ep_write    = cfx__verbs_ep_write,
    .ep_send     = cfx__verbs_ep_send,
    .ep_authorize = cfx__verbs_ep_authorize,
    .poll        = verbs_poll,
    .mem_invalidate = cfx__verbs_rcache_invalidate,
};

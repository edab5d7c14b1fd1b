/*
 * verbs transport: private definitions shared by verbs_iface.c, verbs_ep.c,
 * verbs_cm.c, verbs_oob.c and verbs_mr.c.
 *
 * One iface owns one device context (port, GID) that it opened itself (also
 * with rdma_cm, whose own contexts are only used to name the device: QPs and
 * registrations never depend on librdmacm's device handling, and a forked
 * child opens its own), a protection domain, one
 * completion queue shared by the send and receive queues of all its
 * endpoints, the completion channel that wakes a sleeping progress thread,
 * and an epoll set over every fd that may need attention: the completion
 * channel, the device's async event fd, the rdma_cm event channel (cm mode)
 * or the out-of-band listening socket and per-endpoint sockets (oob mode).
 *
 * Each endpoint is one RC queue pair.  Connection setup:
 *   cm   (CFX_IB_CONNECT=cm, default): rdma_cm on the iface's IP; the hello
 *        (node id, receive credits, MTU, no-op target) travels as private
 *        data; the QP is moved INIT -> RTR -> RTS here with the attributes
 *        rdma_init_qp_attr() reports, timeouts and path MTU adjusted.
 *   oob  (CFX_IB_CONNECT=oob): a TCP socket to the peer's out-of-band port
 *        carries the hello plus QPN, PSN, GID, LID and active MTU, as
 *        perftest does; the socket stays open afterwards, and its hang-up
 *        tells one side that the other went away.
 *
 * Data path: ep_write is RDMA_WRITE_WITH_IMM into the region an rdesc
 * names; ep_send is SEND_WITH_IMM (inline when it fits, else from the
 * endpoint's registered send ring).  The immediate of a SEND carries the
 * message type and the receive credits returned to the peer.  Every
 * message consumes one receive at the peer, which is why sends and writes
 * are gated by credits (see verbs_credit.h).
 *
 * Work request ids name the endpoint by a table slot and a generation, so a
 * completion that arrives after its endpoint was destroyed is recognised and
 * dropped instead of touching freed memory:
 *   bits 63..48 slot, 47..33 generation, 32 receive queue, 31..0 sequence
 *   (send queue: WR sequence; receive queue: receive buffer index).
 *
 * Completions reach the user through the transport base's software queue
 * (tpbase.h), whose capacity is reserved per endpoint.
 *
 * Threading: an iface, its endpoints and registrations belong to one thread.
 */
#ifndef CFX_VERBS_VERBS_H
#define CFX_VERBS_VERBS_H

#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "dataplane/common/list.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/tpbase/tp_strangers.h"
#include "dataplane/tpbase/tpbase.h"
#include "dataplane/transport.h"
#include "verbs_credit.h"
#include "verbs_rcache.h"

#define CFX_VERBS_MAGIC        0x43465856u /* hello magic */
#define CFX_VERBS_VERSION      1
#define CFX_VERBS_RDESC_TAG    0x56        /* 'V': first byte of a verbs rdesc */
#define CFX_VERBS_NODE_NONE    UINT32_MAX

#define CFX_VERBS_SQ_DEPTH     256   /* send WRs per endpoint */
#define CFX_VERBS_RQ_DEPTH     64    /* receives posted per endpoint */
#define CFX_VERBS_SIG_INTERVAL 16    /* signal at least every Nth send WR */
#define CFX_VERBS_SBUF_SIZE    (64u * 1024) /* send ring bytes per endpoint */
#define CFX_VERBS_RX_SIZE      CFX_TP_SEND_MAX /* bytes of one receive buffer */
#define CFX_VERBS_INLINE_WANT  256   /* inline bytes asked for at QP creation */
#define CFX_VERBS_CQ_MIN       1024  /* CQ entries at iface_open */
#define CFX_VERBS_CQ_BURST     32    /* CQEs per ibv_poll_cq */
#define CFX_VERBS_EP_MAX       65535 /* endpoints per iface (wr_id slot bits) */

/* QP attributes: notice a dead peer in well under a second
 * (4.096 us * 2^14 = 67 ms per try, 7 retries). */
#define CFX_VERBS_ACK_TIMEOUT  14
#define CFX_VERBS_RETRY_CNT    7
#define CFX_VERBS_RNR_RETRY    7     /* infinite: a safety net, credits prevent RNR */
#define CFX_VERBS_MIN_RNR_TIMER 12   /* 0.64 ms */
#define CFX_VERBS_HOP_LIMIT    64
#define CFX_VERBS_RESOLVE_MS   2000  /* rdma_cm address and route resolution */
#define CFX_VERBS_ACCEPT_MS    10000 /* oob: an accepted socket's exchange must be done by then */
/* Accepted endpoints whose peer has not proven the token (until the engine's
 * ep_authorize), of all sources and of one address: at a cap the oldest is
 * closed for the newcomer (tpbase/tp_strangers.h).  CFX_IB_MAX_UNAUTH and
 * CFX_IB_MAX_UNAUTH_PER_IP set them when the iface opens. */
#define CFX_VERBS_UNAUTH_MAX    128
#define CFX_VERBS_UNAUTH_PER_IP 32

#define CFX_VERBS_MEMLOCK_NEED (64ull << 20) /* default RLIMIT_MEMLOCK wanted */
#define CFX_VERBS_IDLE_MAX     256           /* idle cached registrations */
#define CFX_VERBS_IDLE_BYTES   (1ull << 30)  /* bytes of idle cached registrations */
#define CFX_VERBS_BIND_WAIT_MS 1000          /* revoke waits this long for a queued bind */

/* Type of a SEND_WITH_IMM, in bits 31..24 of its immediate; bits 15..0
 * carry receive credits returned to the peer. */
enum cfx__verbs_msg {
    CFX_VERBS_MSG_DATA = 1,    /* ep_send payload */
    CFX_VERBS_MSG_CREDIT,      /* zero length: credits only */
    CFX_VERBS_MSG_BYE,         /* zero length: ep_close, the peer reports CLOSED */
    CFX_VERBS_MSG_AUTHZ,       /* zero length: the sender's QP now takes our RDMA writes
                                  (ep_authorize); credits like MSG_CREDIT */
};

#define CFX_VERBS_IMM(type, credits) (((uint32_t)(type) << 24) | ((credits) & 0xffffu))
#define CFX_VERBS_IMM_TYPE(imm)      ((imm) >> 24)
#define CFX_VERBS_IMM_CREDITS(imm)   ((imm) & 0xffffu)
#define CFX_VERBS_CREDITS_MAX        0xffffu

/* wr_id layout (see above). */
#define CFX_VERBS_WRID(slot, gen, rq, seq)                                      \
    (((uint64_t)(slot) << 48) | ((uint64_t)((gen) & 0x7fffu) << 33) |           \
     ((uint64_t)((rq) ? 1 : 0) << 32) | (uint64_t)(uint32_t)(seq))
#define CFX_VERBS_WRID_SLOT(w) ((uint32_t)((w) >> 48))
#define CFX_VERBS_WRID_GEN(w)  ((uint32_t)((w) >> 33) & 0x7fffu)
#define CFX_VERBS_WRID_RQ(w)   ((uint32_t)((w) >> 32) & 1u)
#define CFX_VERBS_WRID_SEQ(w)  ((uint32_t)(w))

/* Connection hello, little endian.  Fits rdma_cm REQ private data (56 bytes
 * for RDMA_PS_TCP over IB CM). */
struct cfx__verbs_hello {
    uint32_t magic;        /* CFX_VERBS_MAGIC */
    uint16_t version;      /* CFX_VERBS_VERSION */
    uint8_t mtu;           /* sender's port active MTU (enum ibv_mtu): path MTU is the min */
    uint8_t rsv;
    uint32_t node_id;      /* sender's node id, CFX_VERBS_NODE_NONE if unknown */
    uint32_t rq_depth;     /* receives the sender posted for us: our initial credits */
    uint64_t nop_addr;     /* where our signaled no-op may write 0 bytes */
    uint32_t nop_rkey;
    uint32_t listen_ip;    /* sender's listening IPv4 address, network order */
    uint16_t listen_port;  /* network order */
    uint16_t rsv2;
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__verbs_hello) <= 56, "hello fits REQ private data");

/* Why an acceptor rejected a connection (rdma_cm: the REJ's private data, at
 * most 148 bytes on IB and RoCE, rdma_reject(3)), little endian.  Sent only
 * for a refusal the peer would meet over any transport (cfx__conn_fallback);
 * anything else is a plain reject, CFX_ERR_CONNECT at the connector.  The
 * connector trusts none of it: a REJECTED event counts as a reason only with
 * status IB_CM_REJ_CONSUMER_DEFINED, at least sizeof(struct) bytes, the magic
 * and a version of 1 or more (a later one may append fields, never change
 * these), and a reason it knows (cfx__verbs_rej_decode). */
#define CFX_VERBS_REJ_MAGIC    0x43465852u /* "RXFC" */
#define CFX_VERBS_REJ_VERSION  1
#define CFX_VERBS_REJ_CONSUMER 28          /* IB_CM_REJ_CONSUMER_DEFINED: rdma_reject's */

enum cfx__verbs_rej_reason {
    CFX_VERBS_REJ_R_VERSION = 1, /* another verbs protocol version: CFX_ERR_VERSION */
    CFX_VERBS_REJ_R_AUTH,        /* credentials refused: CFX_ERR_AUTH */
    CFX_VERBS_REJ_R_HELLO,       /* the hello was not understood: CFX_ERR_PROTO */
};

struct cfx__verbs_rej {
    uint32_t magic;        /* CFX_VERBS_REJ_MAGIC */
    uint16_t version;      /* CFX_VERBS_REJ_VERSION */
    uint16_t reason;       /* enum cfx__verbs_rej_reason */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__verbs_rej) <= 148, "reason fits REJ private data");

/* Out-of-band exchange: hello plus what rdma_cm would otherwise negotiate,
 * 64 bytes, little endian.  An acceptor that refuses the connector's hello
 * answers with a refusal before it closes (as rdma_cm's REJ says why): its
 * magic and version in the hello, the rest zero but @refused, an enum
 * cfx__verbs_rej_reason.  A connector reads the hello's first 6 bytes
 * (magic, version) as soon as they came, so that another version's
 * exchange of another size still shows as CFX_ERR_VERSION. */
struct cfx__verbs_oob_info {
    struct cfx__verbs_hello hello;
    uint32_t qpn;          /* sender's QP number */
    uint32_t psn;          /* sender's initial send PSN */
    uint8_t gid[16];       /* sender's GID */
    uint16_t lid;          /* sender's LID (IB) */
    uint16_t refused;      /* 0, or a refusal: why (enum cfx__verbs_rej_reason) */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__verbs_oob_info) == 64, "the oob exchange's size");
#define CFX_VERBS_OOB_HEAD 6 /* magic and version: what every version keeps */

#define CFX_VERBS_OOB_READY 0x52 /* 'R': connect side reached RTS (oob) */

/* Remote descriptor layout inside struct cfx_tp_rdesc.data, little endian. */
struct cfx__verbs_rkey {
    uint8_t tag;           /* CFX_VERBS_RDESC_TAG */
    uint8_t rsv[3];
    uint32_t rkey;         /* of the region holding the memory */
    uint64_t addr;         /* virtual address of the registration's first byte */
    uint64_t len;          /* bytes the registration covers */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__verbs_rkey) <= CFX_TP_RDESC_MAX, "rkey fits an rdesc");

enum cfx__verbs_mode {
    CFX_VERBS_CM = 1,      /* rdma_cm */
    CFX_VERBS_OOB,         /* TCP out-of-band exchange */
};

/* What an epoll event points at. */
enum cfx__verbs_src_kind {
    CFX_VERBS_SRC_COMP = 1,  /* completion channel */
    CFX_VERBS_SRC_ASYNC,     /* device async events */
    CFX_VERBS_SRC_CM,        /* rdma_cm event channel */
    CFX_VERBS_SRC_LISTEN,    /* oob listening socket */
    CFX_VERBS_SRC_OOB_EP,    /* oob socket of an endpoint */
};

struct cfx__verbs_src {
    uint8_t kind;          /* enum cfx__verbs_src_kind */
};

/*
 * Write grants (mr_grant / mr_revoke).  A remotely writable registration's
 * own region is exactly its bytes and carries no remote access: its rkey
 * writes nothing.  A grant hands out another key, for exactly
 * [addr, addr + len) and until the revoke:
 *   - to an endpoint: a type-2 memory window bound with IBV_WR_BIND_MW on
 *     that endpoint's QP, so the HCA takes its rkey from that QP only; the
 *     rkey's key byte is random; revoke deallocates the window (synchronous
 *     invalidation);
 *   - to any peer (mr_pack, transport tests), where the device has no
 *     type-2 windows, or when the endpoint's send queue has no room for the
 *     bind: a registration of exactly the bytes with remote write,
 *     deregistered at revoke.
 */
struct cfx__verbs_mr {
    struct cfx_tp_mr super;
    struct cfx__verbs_region *region;  /* from the rcache, one reference held */
    struct ibv_mw *grant_mw;           /* live grant to an endpoint, or NULL */
    uint32_t grant_rkey;               /* its rkey as bound */
    uint32_t bind_slot, bind_gen;      /* endpoint whose QP bound it */
    uint32_t bind_seq;                 /* send-queue sequence of the bind WR */
    struct ibv_mr *grant_mr;           /* live grant to any peer (or no MWs), or NULL */
};

/* One posted send WR. */
struct cfx__verbs_sq_ent {
    uint64_t wr_id;        /* user's (WRITE, SEND) */
    uint32_t sbuf_cost;    /* send-ring bytes released when it retires */
    uint8_t comp_type;     /* CFX_TP_COMP_WRITE / SEND; 0: internal WR */
};

enum cfx__verbs_ep_state {
    CFX_VERBS_EP_RESOLVING = 1, /* cm: resolving address and route */
    CFX_VERBS_EP_CONNECTING,    /* cm: REQ sent; oob: TCP connect / info exchange */
    CFX_VERBS_EP_ACCEPTING,     /* passive side, not yet shown to the user */
    CFX_VERBS_EP_OPEN,          /* usable */
    CFX_VERBS_EP_FAILED,        /* sticky status set; flushed */
    CFX_VERBS_EP_CLOSED,        /* ep_close called: in the graveyard */
};

struct cfx__verbs_ep {
    struct cfx_tp_ep super;
    struct cfx__verbs_iface *iface;
    struct cfx_list link;        /* iface->eps or iface->graveyard */
    struct cfx_list touch_link;  /* iface->touched during a progress pass */
    struct cfx_list later_link;  /* iface->later while repost_later is not empty */
    uint32_t slot, gen;          /* iface->ep_tab slot and generation: name it in wr_ids */
    int state;                   /* enum cfx__verbs_ep_state */
    bool visible;                /* the user holds it (connect side, or ACCEPT reported) */
    bool touched;                /* on iface->touched */
    char addr[32];               /* peer "ip:port" */
    struct cfx__tp_stranger stranger; /* accepted, the token not proven: on iface->strangers */

    /* connection */
    struct rdma_cm_id *cm_id;    /* cm mode */
    int oob_fd;                  /* oob mode: -1 when none */
    struct cfx__verbs_src oob_src; /* epoll tag of oob_fd */
    uint32_t oob_events;         /* epoll events registered for oob_fd */
    struct cfx__verbs_oob_info oob_out;  /* what we send */
    struct cfx__verbs_oob_info oob_in;   /* what we receive */
    uint32_t oob_sent, oob_got;  /* bytes of oob_out sent / oob_in received */
    char oob_why[112];           /* connect side: the acceptor's refusal (super.why) */
    bool oob_ready_sent;         /* connect side: READY byte sent */
    uint64_t accept_deadline;    /* oob accept side: dropped unless up by then (ns) */

    struct ibv_qp *qp;
    uint32_t max_inline;         /* inline bytes the QP accepts */
    uint32_t peer_rq;            /* receives the peer keeps posted for us */
    enum ibv_mtu peer_mtu;       /* peer port's active MTU */
    uint64_t peer_nop_addr;
    uint32_t peer_nop_rkey;
    /* Remote write, one flag per direction.  The QP comes up with no remote
     * access; ep_authorize grants it (the engine authenticated the peer)
     * and tells the peer with MSG_AUTHZ.  Until the peer's MSG_AUTHZ came,
     * its QP refuses any RDMA write from us, the zero-length no-op
     * included, so every WR is signaled and no no-op is ever needed. */
    bool authorized;             /* our QP takes the peer's writes */
    bool authz_pending;          /* MSG_AUTHZ still to post (no credit or slot yet) */
    bool peer_authorized;        /* the peer's QP takes ours: no-ops may be posted */

    /* send */
    struct cfx__verbs_sq sq;
    struct cfx__verbs_fc fc;
    struct cfx__verbs_sq_ent *sq_ents;  /* sq.depth entries, by sequence */
    uint32_t sbuf_head, sbuf_used;      /* send ring allocation (FIFO) */

    /* receive */
    uint32_t rx_posted;          /* receives posted on the QP */
    uint32_t *repost_now;        /* buffers to re-post after this progress pass */
    uint32_t n_repost_now;
    uint32_t *repost_later;      /* RECV buffers returned by poll(): re-posted at the next */
    uint32_t n_repost_later;

    /* registered buffers: send ring, then rq_depth receive buffers */
    uint8_t *bufs;
    struct ibv_mr *bufs_mr;
};

struct cfx__verbs_iface {
    struct cfx_tp_iface super;
    int mode;                    /* enum cfx__verbs_mode */
    char addr[CFX_TP_ADDR_MAX];  /* what iface_addr returns */
    char ip_str[INET_ADDRSTRLEN]; /* bound IPv4 address */
    struct in_addr ip;
    uint16_t port;               /* listening port (cm or oob), host order */

    /* device */
    char dev_name[64];
    uint8_t port_num;
    int gid_index;               /* -1: chosen by rdma_cm */
    union ibv_gid gid;
    uint32_t gid_type;           /* enum ibv_gid_type */
    uint8_t link_layer;          /* IBV_LINK_LAYER_* */
    enum ibv_mtu active_mtu;
    uint16_t lid;
    struct ibv_context *ctx;
    bool own_ctx;                /* opened here (oob) rather than by rdma_cm */
    struct ibv_device_attr dev_attr;
    struct ibv_pd *pd;
    struct ibv_comp_channel *comp_ch;
    struct ibv_cq *cq;
    uint32_t cq_size;            /* CQEs the CQ holds */
    uint32_t cq_reserved;        /* CQEs reserved by endpoints */
    unsigned cq_unacked;         /* CQ events read and not yet acked */
    struct ibv_mr *nop_mr;       /* target of zero-length no-op writes */
    void *nop_buf;               /* its own page: with ibv_fork_init a registered
                                  * page is not inherited by children */

    /* queue sizing, after device limits */
    uint32_t sq_depth, rq_depth, sig_interval;
    uint8_t sl, tc;             /* CFX_IB_SL, CFX_IB_TC (0..15, 0..255) */

    /* events */
    int epfd;
    struct cfx__verbs_src comp_src, async_src, cm_src, listen_src;
    struct rdma_event_channel *cm_ch;
    struct rdma_cm_id *listen_id;
    int listen_fd;               /* oob */
    uint32_t poll_count;         /* polls since the fds were last looked at */
    uint32_t accept_ms;          /* oob: CFX_IB_OOB_ACCEPT_MS, exchange deadline of a socket */
    uint64_t accept_check;       /* next look for strangers past a deadline, caps' lines (ns) */
    struct cfx__tp_strangers strangers; /* accepted eps not yet authorized */
    struct cfx_ratelog expire_log; /* oob: accepted sockets dropped at their deadline */
    struct cfx_ratelog accept_log; /* accepts that failed, connections refused or dropped */

    /* endpoints */
    struct cfx__tp_table ep_tab; /* endpoints (struct cfx__verbs_ep) by wr_id slot */
    struct cfx_list eps;         /* live endpoints */
    struct cfx__tp_graveyard graveyard; /* closed endpoints, freed at the next poll */
    struct cfx_list touched;     /* endpoints with work after a CQ pass */
    struct cfx_list later;       /* endpoints with RECV buffers to re-post */

    struct cfx__tp_cq swq;       /* software completion queue */

    struct cfx__verbs_rcache *rcache;
    bool has_mw2;                /* device binds type-2 memory windows (grants) */
    uint8_t last_grant_key;      /* key byte of the last window bound (never repeated next) */
    uint32_t last_reg_rkey;      /* rkey of the last per-grant registration (idem) */
    _Atomic uint64_t n_grant_refused; /* peers' writes the HCA refused here (no live grant) */
};

#define CFX_VERBS_SWQ_PER_EP(i) ((i)->sq_depth + (i)->rq_depth + 2)
#define CFX_VERBS_CQ_PER_EP(i)  ((i)->sq_depth + (i)->rq_depth)

static inline struct cfx__verbs_iface *cfx__verbs_iface_of(struct cfx_tp_iface *i)
{
    return container_of(i, struct cfx__verbs_iface, super);
}

static inline struct cfx__verbs_ep *cfx__verbs_ep_of(struct cfx_tp_ep *e)
{
    return container_of(e, struct cfx__verbs_ep, super);
}

static inline struct cfx__verbs_mr *cfx__verbs_mr_of(struct cfx_tp_mr *m)
{
    return container_of(m, struct cfx__verbs_mr, super);
}

/* Log an endpoint failure naming both ends, then fail it. */
#define CFX_VERBS_EP_FAIL(ep, lvl, status, ...)                                 \
    do {                                                                        \
        if ((ep)->visible && (ep)->state < CFX_VERBS_EP_FAILED) {               \
            char why_[200];                                                     \
            snprintf(why_, sizeof(why_), __VA_ARGS__);                          \
            CFX_LOG(lvl, VERBS, "iface %s: ep to %s failed (%s): %s",           \
                    (ep)->iface->addr, (ep)->super.peer_name,                   \
                    cfx_errname(status), why_);                                 \
        }                                                                       \
        cfx__verbs_ep_fail((ep), (status));                                     \
    } while (0)

/* verbs_iface.c */
/* Switch to device @p name, port @p port (cm: the device rdma_cm bound). */
int cfx__verbs_iface_use_device(struct cfx__verbs_iface *iface, const char *name, uint8_t port);
/* One pass over the CQ (completions go to the software queue); returns
 * the CQEs taken. */
int cfx__verbs_cq_pass(struct cfx__verbs_iface *iface);
/* Read and act on the device's pending async events (QP and CQ errors, port
 * and device events). */
void cfx__verbs_async_progress(struct cfx__verbs_iface *iface);
int cfx__verbs_cq_reserve(struct cfx__verbs_iface *iface, uint32_t n);
void cfx__verbs_cq_unreserve(struct cfx__verbs_iface *iface, uint32_t n);
int cfx__verbs_epoll_add(struct cfx__verbs_iface *iface, int fd, uint32_t events,
                         struct cfx__verbs_src *src);
/* Status for a verbs call's errno (positive error code). */
int cfx__verbs_status(int err);
const char *cfx__verbs_mtu_str(enum ibv_mtu mtu);

/* verbs_ep.c */
int cfx__verbs_ep_create(struct cfx__verbs_iface *iface, uint32_t peer_node, const char *addr,
                         struct cfx__verbs_ep **out);
void cfx__verbs_ep_destroy(struct cfx__verbs_ep *ep);
void cfx__verbs_ep_set_peer_name(struct cfx__verbs_ep *ep);
/* Create the QP, move it to INIT (cm: attributes from rdma_cm), post receives. */
int cfx__verbs_ep_qp_create(struct cfx__verbs_ep *ep);
/* oob: RTR, RTS with the peer's info (after cfx__verbs_ep_hello_take). */
int cfx__verbs_ep_qp_rtr_rts(struct cfx__verbs_ep *ep, const struct cfx__verbs_oob_info *peer,
                             uint32_t my_psn);
/* cm: RTR, RTS with what rdma_init_qp_attr() says (after the hello);
 * CFX_ERR_PEER_FAILED when the peer rejected the connection meanwhile. */
int cfx__verbs_ep_qp_cm_rtr_rts(struct cfx__verbs_ep *ep);
/* Path MTU for this connection: the smaller active MTU of both ports. */
enum ibv_mtu cfx__verbs_ep_path_mtu(const struct cfx__verbs_ep *ep);
void cfx__verbs_ep_hello_fill(struct cfx__verbs_ep *ep, struct cfx__verbs_hello *h);
/* Check a peer's hello and take its credits; CFX_OK or a status. */
int cfx__verbs_ep_hello_take(struct cfx__verbs_ep *ep, const void *data, size_t len);
/* The connection is up: report CONNECTED/ACCEPT. */
void cfx__verbs_ep_established(struct cfx__verbs_ep *ep);
void cfx__verbs_ep_fail(struct cfx__verbs_ep *ep, int status);
/* The HCA refused a peer's write into this side (no live grant for its
 * key on this QP, or outside the granted bytes): count it once per
 * endpoint and fail the endpoint with CFX_ERR_PROTO. */
void cfx__verbs_ep_write_refused(struct cfx__verbs_ep *ep, const char *why);
void cfx__verbs_ep_process_wc(struct cfx__verbs_iface *iface, const struct ibv_wc *wc);
void cfx__verbs_ep_after_pass(struct cfx__verbs_ep *ep);
void cfx__verbs_ep_repost_later(struct cfx__verbs_ep *ep);
void cfx__verbs_ep_close(struct cfx_tp_ep *ep);
int cfx__verbs_ep_connect(struct cfx_tp_iface *iface, const void *addr, size_t len,
                          uint32_t peer_node, struct cfx_tp_ep **out);
int cfx__verbs_ep_write(struct cfx_tp_ep *ep, struct cfx_tp_mr *mr, uint64_t loff,
                        const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len,
                        uint32_t imm, uint64_t wr_id);
/* Inline bytes the ep's QP took (sends and writes up to it are posted
 * IBV_SEND_INLINE); 0 for NULL.  For tests. */
uint32_t cfx__verbs_ep_max_inline(struct cfx_tp_ep *ep);
int cfx__verbs_ep_send(struct cfx_tp_ep *ep, const void *buf, size_t len, uint64_t wr_id);
/* ops->ep_authorize: let the peer's RDMA writes in (IBV_QP_ACCESS_FLAGS in RTS). */
int cfx__verbs_ep_authorize(struct cfx_tp_ep *ep);
/* Bind @p mw over [addr, addr + len) of @p mr on the ep's QP with the key
 * byte of @p rkey (remote write); the bind WR is signaled.  *seq: its
 * send-queue sequence.  CFX_ERR_AGAIN: send queue full. */
int cfx__verbs_ep_bind_mw(struct cfx__verbs_ep *ep, struct ibv_mw *mw, struct ibv_mr *mr,
                          uint64_t addr, uint64_t len, uint32_t rkey, uint32_t *seq);
/* Endpoint of @p iface that owns @p qp, or NULL. */
struct cfx__verbs_ep *cfx__verbs_ep_of_qp(struct cfx__verbs_iface *iface, struct ibv_qp *qp);

/* verbs_cm.c */
int cfx__verbs_cm_listen(struct cfx__verbs_iface *iface);
void cfx__verbs_cm_close(struct cfx__verbs_iface *iface);
int cfx__verbs_cm_connect(struct cfx__verbs_ep *ep, const struct sockaddr_in *dst);
void cfx__verbs_cm_progress(struct cfx__verbs_iface *iface);
void cfx__verbs_cm_disconnect(struct cfx__verbs_ep *ep);
void cfx__verbs_cm_destroy(struct cfx__verbs_ep *ep);
/* The reject private data saying why @p status refused a peer into @p r: its
 * length, 0 when @p status is no reason to send (a plain reject). */
size_t cfx__verbs_rej_fill(struct cfx__verbs_rej *r, int status);
/* What an rdma_cm REJECTED with @p cm_status and private data @p data, @p len
 * (from the network: only those bytes are read) means: CFX_ERR_VERSION,
 * CFX_ERR_AUTH or CFX_ERR_PROTO with a static text in *@p why, else
 * CFX_ERR_CONNECT with *@p why NULL. */
int cfx__verbs_rej_decode(int cm_status, const void *data, size_t len, const char **why);

/* verbs_oob.c */
int cfx__verbs_oob_listen(struct cfx__verbs_iface *iface);
void cfx__verbs_oob_close(struct cfx__verbs_iface *iface);
int cfx__verbs_oob_connect(struct cfx__verbs_ep *ep, const struct sockaddr_in *dst);
void cfx__verbs_oob_accept(struct cfx__verbs_iface *iface);
void cfx__verbs_oob_progress(struct cfx__verbs_ep *ep, uint32_t events);
void cfx__verbs_oob_sock_close(struct cfx__verbs_ep *ep);
/* Drop accepted connections whose exchange is not done by their deadline. */
void cfx__verbs_oob_accept_expire(struct cfx__verbs_iface *iface, uint64_t now);

/* verbs_mr.c */
int cfx__verbs_rcache_open(struct cfx__verbs_iface *iface);
int cfx__verbs_mem_reg(struct cfx_tp_iface *iface, const struct cfx_tp_mem_desc *mem,
                       unsigned access, struct cfx_tp_mr **out);
void cfx__verbs_mem_dereg(struct cfx_tp_mr *mr);
int cfx__verbs_mr_pack(struct cfx_tp_mr *mr, struct cfx_tp_rdesc *out);
int cfx__verbs_mr_grant(struct cfx_tp_mr *mr, struct cfx_tp_ep *ep, struct cfx_tp_rdesc *out);
void cfx__verbs_mr_revoke(struct cfx_tp_mr *mr);
/*
 * Memory in [addr, addr + len) is about to be unmapped: drop cached
 * registrations of it (ops->mem_invalidate).  The engine's arena calls it
 * before it unmaps a segment (registrations of arena memory are cached
 * after their last mem_dereg; user memory never is).  Safe on any iface of any transport:
 * not a verbs iface -> no-op.  Returns the number of regions dropped.
 */
uint32_t cfx__verbs_rcache_invalidate(struct cfx_tp_iface *iface, const void *addr, size_t len);

/* verbs_devinfo.c */
/* ibv_get_device_list() with the "no device" case turned into
 * CFX_ERR_NO_DEVICE and an actionable cfx__err message. */
int cfx__verbs_device_list(struct ibv_device ***out, int *n);
const char *cfx__verbs_gid_type_str(uint32_t type, uint8_t link_layer);
const char *cfx__verbs_port_state_str(enum ibv_port_state s);
const char *cfx__verbs_link_layer_str(uint8_t ll);
/* IPv4 address inside an IPv4-mapped GID; false when it is not one. */
bool cfx__verbs_gid_ipv4(const union ibv_gid *gid, struct in_addr *out);

#endif

/*
 * dpdk transport: private definitions shared by dpdk_iface.c, dpdk_ep.c and
 * dpdk_mr.c.  Built only with DPDK (CFX_HAVE_DPDK).
 *
 * Layers.  One iface owns one DPDK port (dpdk_io.c).  Each endpoint is one
 * reliability session (dpdk_rel.c) named by a session id: its slot in the
 * iface's endpoint table and that slot's generation, so a packet for a
 * closed endpoint is recognised and answered with a reset.  Writes and sends
 * are messages of the session, which fragments them, retransmits what is
 * lost and delivers whole messages in order.
 *
 * Connection setup.  Control packets (session 0, only the ACKREQ flag; the
 * header's seq is the type, ack the sender's session id, msg_id the
 * receiver's, sack the sender's node id or a status):
 *
 *   SYN     connector -> listener, repeated until answered or the connect
 *           deadline (then CFX_ERR_CONNECT);
 *   SYNACK  listener -> connector, also for a repeated SYN;
 *   RST     an endpoint ends: sack carries the status the peer reports
 *           (CFX_ERR_CLOSED on ep_close, CFX_ERR_PROTO on a refused write,
 *           CFX_ERR_PEER_FAILED for a packet to a session that is gone);
 *   PING    sent on an endpoint that heard nothing for CFX_DPDK_PING_MS;
 *   PONG    its answer.  An endpoint silent for CFX_DPDK_DEAD_MS fails.
 *
 * Messages of a session (struct cfx__dpdk_op_hdr, little endian):
 *
 *   SEND   header + the payload (<= CFX_TP_SEND_MAX) in one message;
 *   WRITE  per chunk of at most CFX_DPDK_CHUNK bytes: a header message
 *          (key, offset, chunk length; on the last chunk the immediate and
 *          the write's length), then a message of the chunk's bytes, taken
 *          straight from the registered source.  The receiver checks the
 *          grant on the header, before a byte of the chunk is placed; the
 *          last chunk completes the write (WRITE_IMM), in order, so every
 *          byte before it has landed.
 *
 * Completion bookkeeping as in tcp (tcp.h): the iface's queue reserves
 * CFX_DPDK_CQ_PER_EP per endpoint.
 *
 * Threading: an iface, its endpoints and registrations belong to one thread.
 */
#ifndef CFX_DPDK_DPDK_H
#define CFX_DPDK_DPDK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "control/seal.h"
#include "dataplane/common/list.h"
#include "dataplane/common/util.h"
#include "dataplane/tpbase/tp_strangers.h"
#include "dataplane/tpbase/tpbase.h"
#include "dataplane/transport.h"
#include "dpdk_io.h"
#include "dpdk_rel.h"

#define CFX_DPDK_ADDR_MAGIC 0x4B445043u  /* "CPDK": first word of an iface address */
#define CFX_DPDK_RDESC_TAG  0x44         /* 'D': first byte of a dpdk rdesc */
#define CFX_DPDK_TXQ_DEPTH  256          /* ops posted and not yet reported, per ep */
#define CFX_DPDK_RX_MAX     64           /* receive completions not yet reported, per ep */
#define CFX_DPDK_RX_SLOTS   16           /* RECV message buffers per ep */
#define CFX_DPDK_CHUNK      (256u << 10) /* bytes of a write per payload message */
#define CFX_DPDK_MTU        1436u        /* payload bytes per packet: a 1500-byte IP MTU less
                                            IPv4 (20), UDP (8) and a data header (36) */
#define CFX_DPDK_SENDQ      128u         /* messages queued in a session */
#define CFX_DPDK_SYN_MS     20           /* SYN repeated this often */
#define CFX_DPDK_CONNECT_MS 5000         /* connect gives up after this */
#define CFX_DPDK_PING_MS    200          /* silence before a PING */
#define CFX_DPDK_DEAD_MS    3000         /* silence that fails the endpoint */
#define CFX_DPDK_QUIET_MS   100          /* no data this long: the engine may nap (default) */
#define CFX_DPDK_NAP_MS     1            /* ... this long at most between polls */
#define CFX_DPDK_LINK_CHECK_MS   100  /* poll() looks at the link this often */
#define CFX_DPDK_LINK_RESTART_MS 1000 /* a link down this long restarts the port */
#define CFX_DPDK_SEND_INLINE 256 /* sends up to this (with header) need no allocation */
#define CFX_DPDK_HALF_OPEN_MAX 256 /* endpoints accepted whose peer sent nothing on them yet */
/* Endpoints whose peer answered (so no forged address) but has not proven
 * the token (until the engine's ep_authorize), of all sources and of one
 * address: at a cap the oldest is closed for the newcomer, as tcp's
 * connections are (tpbase/tp_strangers.h).  CFX_DPDK_MAX_UNAUTH and
 * CFX_DPDK_MAX_UNAUTH_PER_IP set them when the iface opens. */
#define CFX_DPDK_UNAUTH_MAX    128
#define CFX_DPDK_UNAUTH_PER_IP 32
#define CFX_DPDK_NODE_NONE  UINT32_MAX
#define CFX_DPDK_CQ_PER_EP  (CFX_DPDK_TXQ_DEPTH + CFX_DPDK_RX_MAX + 2)

enum cfx__dpdk_ctl {
    CFX_DPDK_CTL_SYN = 1,
    CFX_DPDK_CTL_SYNACK,
    CFX_DPDK_CTL_RST,
    CFX_DPDK_CTL_PING,
    CFX_DPDK_CTL_PONG,
};

enum cfx__dpdk_op_type {
    CFX_DPDK_OP_SEND = 1,
    CFX_DPDK_OP_WRITE,
};
#define CFX_DPDK_OP_F_LAST       1u /* WRITE: last chunk: report WRITE_IMM */
#define CFX_DPDK_OP_F_LAST_CLEAR 2u /* SEND: the sender seals every later message */
#define CFX_DPDK_SEAL_INFLIGHT   (1u << 20) /* sealed bytes queued in a session, per ep */

/* Message header, little endian on the wire. */
struct cfx__dpdk_op_hdr {
    uint8_t type;     /* enum cfx__dpdk_op_type */
    uint8_t flags;    /* CFX_DPDK_OP_F_* */
    uint16_t rsv;     /* zero */
    uint32_t imm;     /* WRITE, last chunk: the immediate */
    uint32_t key_idx; /* WRITE: registration table index */
    uint32_t len;     /* WRITE: bytes of the chunk message that follows; SEND: payload */
    uint32_t total;   /* WRITE, last chunk: bytes of the whole write */
    uint32_t rsv2;    /* zero */
    uint64_t key;     /* WRITE: grant key */
    uint64_t off;     /* WRITE: offset of the chunk in the registration */
};
_Static_assert(sizeof(struct cfx__dpdk_op_hdr) == 40, "message header is 40 bytes");

/* Iface address (iface_addr), little endian. */
struct cfx__dpdk_ifaddr {
    uint32_t magic;   /* CFX_DPDK_ADDR_MAGIC */
    uint8_t mac[6];   /* port's Ethernet address */
    uint16_t port;    /* UDP port */
    uint32_t ip;      /* IPv4 address */
    uint32_t node_id; /* CFX_DPDK_NODE_NONE if unknown */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__dpdk_ifaddr) <= CFX_TP_ADDR_MAX, "address fits");

/* Remote descriptor inside struct cfx_tp_rdesc.data, little endian. */
struct cfx__dpdk_rkey {
    uint8_t tag; /* CFX_DPDK_RDESC_TAG */
    uint8_t rsv[3];
    uint32_t idx; /* registration table index */
    uint64_t key; /* grant key: random per grant, 0 matches nothing */
    uint64_t len; /* bytes in the region */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__dpdk_rkey) <= CFX_TP_RDESC_MAX, "rkey fits an rdesc");

struct cfx__dpdk_mr {
    struct cfx_tp_mr super;
    uint32_t idx, gen;  /* slot in the iface table and its generation */
    struct cfx__tp_grant grant; /* the live write grant (tpbase.h) */
};

/* One posted op. */
struct cfx__dpdk_op {
    uint8_t type;                /* enum cfx__dpdk_op_type */
    uint64_t wr_id;              /* as posted */
    struct cfx__dpdk_mr *mr;     /* WRITE: source */
    const uint8_t *src;          /* WRITE: first byte to send */
    uint64_t len;                /* WRITE: bytes */
    uint64_t done;               /* WRITE: bytes queued in the session */
    bool hdr_queued;             /* WRITE: the header of the next chunk is queued */
    uint32_t key_idx, imm;       /* WRITE: target */
    uint64_t key, roff;          /* WRITE: target */
    uint8_t *msg;                /* SEND: header + payload (small, or allocated) */
    uint32_t msg_len;            /* SEND: bytes at msg */
    uint8_t small[CFX_DPDK_SEND_INLINE]; /* SEND: msg when it fits */
    bool sealed;                 /* posted after the last clear message: sealed (dpdk_ep.c) */
};

/* Receive side of sealing (as tcp.h's). */
enum cfx__dpdk_rx_seal {
    CFX_DPDK_RX_CLEAR = 0,   /* no sealing agreed */
    CFX_DPDK_RX_SEAL_EXPECT, /* keys in: the peer's next message must be its last clear one */
    CFX_DPDK_RX_SEAL_WAIT,   /* the peer's last clear message came: the rest waits for keys */
    CFX_DPDK_RX_SEALED,      /* sealed messages only */
};

/* Sealing state of an ep (CFX_SECURE, dpdk_ep.c). */
struct cfx__dpdk_seal {
    struct cfx_seal_dir tx, rx;
    uint8_t *q[CFX_DPDK_SENDQ]; /* sealed copies queued in the session, oldest first */
    uint32_t q_len[CFX_DPDK_SENDQ];
    uint32_t q_head, q_tail;
    size_t q_bytes;             /* their bytes: at most CFX_DPDK_SEAL_INFLIGHT (+ one) */
    uint64_t first_sealed;      /* index of the first sealed message queued in the session */
    uint8_t *open_buf;          /* an opened message: CFX_DPDK_CHUNK + a header */
    bool test_corrupt;          /* test hook: flip a bit of the next message sealed */
};

/* Free what a SEND op allocated. */
static inline void cfx__dpdk_op_free(struct cfx__dpdk_op *op)
{
    if (op->msg != op->small)
        free(op->msg);
    op->msg = NULL;
}

enum cfx__dpdk_ep_state {
    CFX_DPDK_EP_CONNECTING = 1, /* SYN sent, no SYNACK yet */
    CFX_DPDK_EP_OPEN,           /* usable */
    CFX_DPDK_EP_FAILED,         /* status is sticky */
};

struct cfx__dpdk_rx_slot {
    uint8_t *buf;          /* CFX_TP_SEND_MAX bytes */
    uint64_t returned_gen; /* poll generation that returned it */
};

struct cfx__dpdk_ep {
    struct cfx_tp_ep super;
    struct cfx__dpdk_iface *iface;
    struct cfx_list link;      /* iface->eps or the graveyard */
    uint64_t serial;           /* never reused in the iface: names the ep in grants */
    int state;                 /* enum cfx__dpdk_ep_state */
    uint32_t idx;              /* slot in iface->eps_tab */
    bool in_tab;               /* idx is still ours (until ep_close) */
    uint32_t sess_id;          /* ours: packets to us carry it */
    uint32_t peer_sess;        /* the peer's (OPEN) */
    struct cfx__dpdk_addr peer; /* where the peer's port is */
    bool sess_up;              /* sess is initialised */
    bool half_open;            /* accepted, and nothing came from the peer on it yet */
    bool authorized;           /* the engine's handshake proved the peer (ep_authorize) */
    struct cfx__tp_stranger stranger; /* accepted, heard from, not authorized: on strangers */
    struct cfx__dpdk_sess sess;
    uint64_t connect_deadline; /* CONNECTING: fail after (ns) */
    uint64_t syn_next;         /* CONNECTING: next SYN (ns) */
    uint64_t heard;            /* last packet from the peer (ns) */
    uint64_t ping_next;        /* next PING while silent (ns) */

    /* transmit */
    struct cfx__dpdk_op ops[CFX_DPDK_TXQ_DEPTH];
    uint32_t op_head;        /* next op posted */
    uint32_t op_feed;        /* next op to queue in the session */
    uint32_t op_tail;        /* oldest op not completed */
    uint32_t tx_unreported;  /* ops posted whose completion poll() has not returned */
    struct cfx__dpdk_op_hdr hdrs[CFX_DPDK_SENDQ + 1]; /* chunk headers in the session */
    uint32_t hdr_next;       /* next entry of hdrs (0 .. CFX_DPDK_SENDQ) */
    uint64_t msgs_queued;    /* messages handed to the session, ever */
    uint64_t msgs_acked;     /* ... and acknowledged (its sent() calls) */

    /* sealing (CFX_SECURE): NULL and false while in clear */
    struct cfx__dpdk_seal *seal;
    bool tx_mark_next;       /* the next send is the last clear message */
    bool tx_sealing;         /* posts are sealed */
    uint8_t rx_seal;         /* enum cfx__dpdk_rx_seal */

    /* receive */
    bool rx_expect;          /* the next message is a chunk's bytes */
    uint32_t rx_len;         /* its length */
    uint32_t rx_mr_idx, rx_mr_gen; /* its registration */
    uint64_t rx_key;         /* its grant's key: each packet lands only while it is live */
    uint64_t rx_off;         /* where it lands */
    bool rx_last;            /* it ends the write */
    uint32_t rx_imm, rx_total;
    uint64_t rx_sum;         /* bytes the chunks of the write under way carried so far */
    struct cfx__dpdk_rx_slot rx_slots[CFX_DPDK_RX_SLOTS];
    uint32_t rx_slot_head, rx_slot_ret, rx_slot_tail; /* as in tcp.h */
    uint32_t rx_unreported;  /* RECV/WRITE_IMM pushed, not returned */
};

struct cfx__dpdk_iface {
    struct cfx_tp_iface super;
    struct cfx__dpdk_port *port;
    struct cfx__dpdk_addr local;  /* our MAC, IP, UDP port */
    char name[96];                /* "net_memif0 10.77.0.1:4791" for messages */
    char port_name[64];           /* the ethdev name */
    uint64_t ep_serial;           /* last ep serial handed out */
    _Atomic uint64_t n_grant_refused; /* writes refused for want of a live grant */
    _Atomic uint64_t n_seal_refused;  /* sealed messages that did not open */
    struct cfx__keystream keys;   /* grant keys */
    struct cfx__tp_revoked revoked; /* grants revoked lately: their late writes dropped */
    _Atomic uint64_t n_late_dropped; /* write chunks under such a grant, dropped */
    int kernel_fd;                /* our UDP address held in the kernel, or -1 (dpdk_iface.c) */
    uint64_t poll_gen;            /* incremented by every poll() */
    struct cfx_list eps;          /* live endpoints */
    struct cfx__tp_graveyard graveyard;
    struct cfx__tp_cq cq;
    struct cfx__tp_table mrs;     /* registrations, by rkey index */
    struct cfx__tp_table eps_tab; /* endpoints, by session id */
    uint64_t now;                 /* time of the current poll (ns) */
    uint64_t rx_at, rx_prev;      /* receive time of this poll and of the one before: what
                                   * this poll receives came after rx_prev (0: none yet) */
    uint64_t link_check;          /* next look at the link (ns) */
    uint64_t link_down_since;     /* link seen down since (ns); 0: up */
    uint64_t link_down_first;     /* ... and since when without a break (ns) */
    unsigned restart_fails;       /* port restarts in a row with no link after (link_watch
                                     backs off) */
    uint64_t data_at;             /* last packet of a session received (ns) */
    uint32_t half_open;           /* endpoints half_open (CFX_DPDK_HALF_OPEN_MAX at most) */
    struct cfx__tp_strangers strangers; /* endpoints heard from, not yet authorized */
    uint64_t syn_refused;         /* SYNs dropped for want of room, since the last report */
    uint64_t syn_log_at;          /* ... reported again from then (ns) */
    uint64_t quiet_ns;            /* CFX_DPDK_QUIET_MS: no data this long is quiet; 0: never */
};

static inline struct cfx__dpdk_iface *cfx__dpdk_iface_of(struct cfx_tp_iface *i)
{
    return container_of(i, struct cfx__dpdk_iface, super);
}

static inline struct cfx__dpdk_ep *cfx__dpdk_ep_of(struct cfx_tp_ep *e)
{
    return container_of(e, struct cfx__dpdk_ep, super);
}

static inline struct cfx__dpdk_mr *cfx__dpdk_mr_of(struct cfx_tp_mr *m)
{
    return container_of(m, struct cfx__dpdk_mr, super);
}

/* Session id of table slot idx, generation gen (never 0: 0 is control). */
static inline uint32_t cfx__dpdk_sess_id(uint32_t idx, uint32_t gen)
{
    return (gen & 0x7FFFu) << 16 | (idx + 1);
}

/* dpdk_iface.c */
/* Send a control packet of type to dst. */
void cfx__dpdk_ctl_send(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *dst,
                        unsigned type, uint32_t from_sess, uint32_t to_sess, uint64_t arg);

/* dpdk_ep.c */
/* Nothing in flight on @p ep: no op posted and not completed, no message
 * unacknowledged, no acknowledgement or retransmission due, no write half
 * received, no completion unreported. */
bool cfx__dpdk_ep_quiet(const struct cfx__dpdk_ep *ep);
int cfx__dpdk_ep_new(struct cfx__dpdk_iface *iface, const struct cfx__dpdk_addr *peer,
                     uint32_t peer_node, struct cfx__dpdk_ep **out);
/* Start the session with the peer's id: the ep is OPEN. */
int cfx__dpdk_ep_open(struct cfx__dpdk_ep *ep, uint32_t peer_sess);
void cfx__dpdk_ep_destroy(struct cfx__dpdk_ep *ep);
/* Fail ep with status (sticky): flush its ops, report EP_ERROR once. */
void cfx__dpdk_ep_fail(struct cfx__dpdk_ep *ep, int status, const char *why);
/* The peer spoke on ep's session (a packet of it, a PING or a PONG): it
 * is alive, and got our SYNACK if ep was accepted (which makes an
 * accepted ep a stranger until it is authorized). */
void cfx__dpdk_ep_heard(struct cfx__dpdk_ep *ep);
/* ops->ep_authorize: ep's peer proved the token, it is no stranger. */
int cfx__dpdk_ep_authorize(struct cfx_tp_ep *ep);
/* tp_strangers' evict: close a stranger for a newcomer, telling its peer. */
void cfx__dpdk_ep_evict(struct cfx__tp_stranger *st, const char *why);
/* ep no longer counts as half open (it is closed). */
void cfx__dpdk_ep_half_open_end(struct cfx__dpdk_ep *ep);
/* A packet of ep's session arrived. */
void cfx__dpdk_ep_rx(struct cfx__dpdk_ep *ep, const struct cfx__dpdk_hdr *h, const void *payload);
/* Timers, queued ops, retransmissions. */
void cfx__dpdk_ep_progress(struct cfx__dpdk_ep *ep);
/* A completion of ep that poll() returns. */
void cfx__dpdk_ep_returned(struct cfx__dpdk_ep *ep, const struct cfx_tp_completion *c);
/* mr is deregistered: an ep with writes from it still queued fails. */
void cfx__dpdk_ep_mr_gone(struct cfx__dpdk_ep *ep, struct cfx__dpdk_mr *mr);
void cfx__dpdk_ep_close(struct cfx_tp_ep *ep);
/* An open ep ends on this side: the ack its session owes, then the RST
 * that tells the peer CFX_ERR_CLOSED (not flushed). */
void cfx__dpdk_ep_goodbye(struct cfx__dpdk_ep *ep);
int cfx__dpdk_ep_connect(struct cfx_tp_iface *iface, const void *addr, size_t len,
                         uint32_t peer_node, struct cfx_tp_ep **out);
int cfx__dpdk_ep_write(struct cfx_tp_ep *ep, struct cfx_tp_mr *mr, uint64_t loff,
                       const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len, uint32_t imm,
                       uint64_t wr_id);
int cfx__dpdk_ep_send(struct cfx_tp_ep *ep, const void *buf, size_t len, uint64_t wr_id);
int cfx__dpdk_ep_seal(struct cfx_tp_ep *ep, int mode, const struct cfx_seal_keys *keys,
                      bool connector);

/* dpdk_mr.c */
int cfx__dpdk_mem_reg(struct cfx_tp_iface *iface, const struct cfx_tp_mem_desc *mem,
                      unsigned access, struct cfx_tp_mr **out);
void cfx__dpdk_mem_dereg(struct cfx_tp_mr *mr);
int cfx__dpdk_mr_pack(struct cfx_tp_mr *mr, struct cfx_tp_rdesc *out);
int cfx__dpdk_mr_grant(struct cfx_tp_mr *mr, struct cfx_tp_ep *ep, struct cfx_tp_rdesc *out);
void cfx__dpdk_mr_revoke(struct cfx_tp_mr *mr);
/* Registration whose live grant lets ep write [off, off+len), or NULL with
 * a static reason in *why. */
struct cfx__dpdk_mr *cfx__dpdk_mr_lookup(struct cfx__dpdk_iface *iface,
                                         const struct cfx__dpdk_ep *ep, uint32_t idx, uint64_t key,
                                         uint64_t off, uint64_t len, const char **why);
void cfx__dpdk_mr_table_free(struct cfx__dpdk_iface *iface);

#endif

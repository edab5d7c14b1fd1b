/*
 * tcp transport: private definitions shared by tcp_iface.c, tcp_ep.c and
 * tcp_mr.c.
 *
 * Wire format.  A connection carries frames, each a fixed header
 * (struct cfx__tcp_hdr, little endian) followed by hdr.len payload bytes:
 *
 *   HELLO  first frame from the connecting side: payload is struct
 *          cfx__tcp_hello (its node id and listen address), so the accepting
 *          side can name its peer before it reports ACCEPT;
 *   SEND   control message, payload <= CFX_TP_SEND_MAX;
 *   WRITE  one-sided write: key_idx names a registration of the receiver,
 *          key_lo/key_hi the 64 random bits of its live grant (mr_grant), off
 *          the offset in it; the payload is received straight into the
 *          registered memory only after the grant (key, the writing
 *          endpoint, bounds) is checked, so a refused write lands nothing;
 *   ERROR  sent best-effort before a protocol failure closes the socket,
 *          imm carries the status;
 *   BYE    sent best-effort by ep_close so the peer reports CFX_ERR_CLOSED.
 *
 * Sealing (CFX_SECURE, ep_seal, tcp_seal.c).  Once the engine's handshake
 * agreed on it, each side marks its last frame in clear (a SEND whose
 * header has CFX_TCP_F_LAST_CLEAR) and every byte it sends after that is a
 * sequence of sealed records:
 *
 *   u32 len (little endian, 1..CFX_TCP_REC_MAX) | len sealed bytes | 16-byte tag
 *
 * each an AES-256-GCM record of the next len bytes of the frame stream
 * (control/seal.h: the length under the tag, a counter nonce per direction).
 * The frame parser sees only bytes whose record opened: a WRITE lands in
 * registered memory only after the tag of every byte of it verified (the
 * zero-copy receive is off while sealed).  A record that fails to open
 * fails the endpoint with CFX_ERR_AUTH and is counted (n_seal_refused).
 *
 * Completion bookkeeping.  Every completion goes through the iface's queue
 * (the transport base's cq, tpbase.h).  Its capacity is reserved per endpoint
 * (TXQ_DEPTH + RX_MAX + 2), so a push always finds room in the ring: an endpoint owns at most TXQ_DEPTH unreported
 * write/send completions (posting beyond that returns CFX_ERR_AGAIN), at most
 * RX_MAX unreported receive completions (the endpoint stops reading its
 * socket until the user polls), one CONNECTED/ACCEPT and one EP_ERROR.
 *
 * Threading: an iface, its endpoints and registrations belong to one thread.
 */
#ifndef CFX_TCP_TCP_H
#define CFX_TCP_TCP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/seal.h"
#include "dataplane/common/flood.h"
#include "dataplane/common/list.h"
#include "dataplane/common/util.h"
#include "dataplane/tpbase/tp_strangers.h"
#include "dataplane/tpbase/tpbase.h"
#include "dataplane/transport.h"

#define CFX_TCP_MAGIC     0x43465854u /* "TXFC" on the wire: HELLO frames */
#define CFX_TCP_VERSION   1
#define CFX_TCP_TXQ_DEPTH 512                     /* ops posted and not yet reported, per ep */
#define CFX_TCP_TXQ_SLOTS (CFX_TCP_TXQ_DEPTH + 1) /* + the HELLO frame */
#define CFX_TCP_RX_MAX    64                      /* receive completions not yet reported, per ep */
#define CFX_TCP_RX_SLOTS  16                      /* RECV message buffers per ep */
#define CFX_TCP_SBUF_SIZE (64u * 1024)            /* bytes of queued ep_send payloads per ep */
#define CFX_TCP_IOV_MAX   64                      /* iovecs gathered into one sendmsg */
#define CFX_TCP_EVENTS    64                      /* epoll events reaped per epoll_wait */
#define CFX_TCP_NODE_NONE UINT32_MAX              /* peer node id not known */
#define CFX_TCP_RDESC_TAG 0x54                    /* 'T': first byte of a tcp rdesc */
#define CFX_TCP_F_LAST_CLEAR 0x01                 /* hdr.flags: the sender seals what follows */

/* Accepted connections whose peer has not proven the cluster token yet (from
 * accept until the engine's ep_authorize): at a cap the oldest goes for the
 * newcomer (tcp_iface.c).  CFX_TCP_MAX_UNAUTH / CFX_TCP_MAX_UNAUTH_PER_IP
 * set them, read when the iface opens. */
#define CFX_TCP_UNAUTH_MAX    128 /* of all sources */
#define CFX_TCP_UNAUTH_PER_IP 32  /* of one source address */

/* Sealed records (CFX_SECURE) */
#define CFX_TCP_REC_MAX     (16u * 1024) /* frame-stream bytes per record: one rxbuf */
#define CFX_TCP_REC_OVH     (4u + CFX_SEAL_TAG_LEN)
#define CFX_TCP_REC_PER_TX  4            /* records sealed ahead, sent in one send() */
#define CFX_TCP_SEAL_BUF    (CFX_TCP_REC_PER_TX * (CFX_TCP_REC_MAX + CFX_TCP_REC_OVH))

/* Small-message fast path (tcp_ep.c) */
#define CFX_TCP_BATCH_MAX  32           /* frames an ep_batch holds back before sending */
#define CFX_TCP_RXBUF_SIZE (16u * 1024) /* receive buffer per ep: headers and small payloads */

enum cfx__tcp_frame {
    CFX_TCP_FRAME_HELLO = 1,
    CFX_TCP_FRAME_SEND,
    CFX_TCP_FRAME_WRITE,
    CFX_TCP_FRAME_ERROR,
    CFX_TCP_FRAME_BYE,
};

/* Frame header, little endian on the wire. */
struct cfx__tcp_hdr {
    uint8_t type;        /* enum cfx__tcp_frame */
    uint8_t flags;       /* CFX_TCP_F_LAST_CLEAR on a SEND, else zero */
    uint8_t rsv[2];      /* zero */
    uint32_t len;        /* payload bytes that follow */
    uint32_t imm;        /* WRITE: immediate; ERROR: status */
    uint32_t key_lo;     /* WRITE: grant key, low 32 bits */
    uint32_t key_idx;    /* WRITE: registration table index */
    uint32_t key_hi;     /* WRITE: grant key, high 32 bits */
    uint64_t off;        /* WRITE: offset inside the registration */
};

_Static_assert(sizeof(struct cfx__tcp_hdr) == 32, "wire header is 32 bytes");

/* HELLO payload. */
struct cfx__tcp_hello {
    uint32_t magic;   /* CFX_TCP_MAGIC */
    uint32_t version; /* CFX_TCP_VERSION */
    uint32_t node_id; /* sender's node id, CFX_TCP_NODE_NONE if unknown */
    uint32_t rsv;
    char addr[32]; /* sender's listen address "ip:port", NUL-terminated */
};

/* Remote descriptor layout inside struct cfx_tp_rdesc.data, little endian. */
struct cfx__tcp_rkey {
    uint8_t tag; /* CFX_TCP_RDESC_TAG */
    uint8_t rsv[3];
    uint32_t key_lo; /* grant key, low 32 bits: random per grant */
    uint32_t idx;    /* registration table index */
    uint32_t key_hi; /* grant key, high 32 bits */
    uint64_t len;    /* bytes in the region */
} __attribute__((packed));
_Static_assert(sizeof(struct cfx__tcp_rkey) <= CFX_TP_RDESC_MAX, "rkey fits an rdesc");

struct cfx__tcp_mr {
    struct cfx_tp_mr super;
    uint32_t idx;     /* slot in the iface table */
    struct cfx__tp_grant grant; /* the live write grant (tpbase.h) */
    uint32_t rx_busy; /* eps currently receiving a payload into it */
    uint32_t tx_busy; /* queued writes reading from it */
};

/* One queued outgoing frame. */
struct cfx__tcp_op {
    struct cfx__tcp_hdr hdr; /* wire header */
    const uint8_t *payload;  /* registered memory (WRITE) or sbuf (SEND) */
    struct cfx__tcp_mr *mr;  /* WRITE: source region (tx_busy held) */
    uint32_t sbuf_cost;      /* sbuf bytes to release when sent (SEND) */
    uint8_t comp_type;       /* CFX_TP_COMP_WRITE / SEND; 0: internal frame */
    uint64_t wr_id;          /* as posted */
    size_t total;            /* header + payload bytes */
    bool sealed;             /* posted after the last clear frame: goes out in records */
};

/* Receive side of sealing, per ep. */
enum cfx__tcp_rx_seal {
    CFX_TCP_RX_CLEAR = 0,     /* no sealing agreed */
    CFX_TCP_RX_SEAL_EXPECT,   /* keys in: the peer's next frame must be its last clear one */
    CFX_TCP_RX_SEAL_WAIT,     /* the peer's last clear frame came: the rest waits for keys */
    CFX_TCP_RX_SEALED,        /* records only */
};

/* Sealing state of an ep (tcp_seal.c); allocated when first needed. */
struct cfx__tcp_seal {
    struct cfx_seal_dir tx, rx;
    bool keyed;               /* ep_seal ran: tx and rx are set up */
    uint8_t *stx;             /* sealed records waiting for the socket */
    uint32_t stx_len, stx_off;
    size_t stx_plain;         /* frame-stream bytes those records carry */
    uint8_t *srx;             /* bytes of the peer's records not yet opened */
    uint32_t srx_off, srx_len;
};

enum cfx__tcp_ep_state {
    CFX_TCP_EP_CONNECTING = 1, /* non-blocking connect in flight */
    CFX_TCP_EP_HELLO_WAIT,     /* accepted; waiting for the peer's HELLO */
    CFX_TCP_EP_OPEN,           /* usable */
    CFX_TCP_EP_FAILED,         /* socket closed; status is sticky */
};

enum cfx__tcp_rx_state {
    CFX_TCP_RX_HDR = 0, /* reading a frame header */
    CFX_TCP_RX_PAYLOAD, /* reading a payload to rx_dst */
    CFX_TCP_RX_DISCARD, /* draining a payload whose target went away */
};

struct cfx__tcp_rx_slot {
    uint8_t *buf;          /* CFX_TP_SEND_MAX bytes */
    uint64_t returned_gen; /* poll generation that returned it; 0: busy */
};

struct cfx__tcp_ep {
    struct cfx_tp_ep super;
    struct cfx__tcp_iface *iface;
    uint64_t serial;      /* never reused in the iface: names the ep in grants */
    struct cfx_list link; /* iface->eps or iface->graveyard */
    int fd;
    int state;             /* enum cfx__tcp_ep_state */
    uint64_t hello_deadline; /* HELLO_WAIT: dropped unless the HELLO is in by then (ns) */
    struct cfx__tp_stranger stranger; /* accepted, the token not proven yet: on strangers */
    uint32_t epoll_events; /* events registered now */
    char addr[32];         /* peer "ip:port" (connect side: dialled) */

    /* transmit */
    struct cfx__tcp_op *txq; /* CFX_TCP_TXQ_SLOTS ring */
    uint32_t txq_head;       /* next slot to post */
    uint32_t txq_tail;       /* oldest op not fully sent */
    uint32_t tx_unreported;  /* WRITE/SEND ops posted, completion not returned */
    size_t tx_off;           /* bytes of the tail op already sent */
    uint32_t tx_held;        /* frames posted inside an ep_batch, not yet handed to the kernel */
    bool tx_batch;           /* inside ep_batch(ep, true): posts wait for ep_batch(ep, false) */
    uint8_t *sbuf;           /* ring of ep_send payloads */
    uint32_t sbuf_head;      /* next byte to allocate */
    uint32_t sbuf_used;      /* bytes allocated, including wrap padding */

    /* receive */
    uint8_t *rxbuf;             /* CFX_TCP_RXBUF_SIZE bytes read ahead from the socket */
    uint32_t rxb_off;           /* next unparsed byte in rxbuf */
    uint32_t rxb_len;           /* bytes valid in rxbuf */
    bool rx_backlogged;         /* on iface->rx_backlog */
    struct cfx_list rx_link;    /* iface->rx_backlog: parsing stopped with bytes in rxbuf */
    int rx_state;               /* enum cfx__tcp_rx_state */
    struct cfx__tcp_hdr rx_hdr; /* header being read */
    size_t rx_got;              /* bytes of header or payload read so far */
    uint8_t *rx_dst;            /* payload destination */
    struct cfx__tcp_mr *rx_mr;  /* WRITE target (rx_busy held) */
    struct cfx__tcp_rx_slot rx_slots[CFX_TCP_RX_SLOTS];
    uint32_t rx_slot_head;       /* next slot to fill */
    uint32_t rx_slot_ret;        /* next slot whose RECV poll() returns */
    uint32_t rx_slot_tail;       /* oldest slot not known free */
    uint32_t rx_unreported;      /* RECV/WRITE_IMM pushed, not returned */
    struct cfx__tcp_hello hello; /* HELLO we send (connect) or receive (accept) */

    /* sealing (CFX_SECURE): NULL and false while in clear */
    struct cfx__tcp_seal *seal;
    bool tx_mark_next;   /* the next post is the last clear frame */
    bool tx_sealing;     /* posts are sealed */
    bool tx_clear_done;  /* the last clear frame left: raw frames (BYE, ERROR) go sealed */
    uint8_t rx_seal;     /* enum cfx__tcp_rx_seal */
};

struct cfx__tcp_iface {
    struct cfx_tp_iface super;
    int epfd; /* epoll: listen socket + ep sockets */
    int listen_fd;
    char addr[32];             /* "ip:port" we listen on */
    uint64_t ep_serial;        /* last ep serial handed out */
    _Atomic uint64_t n_grant_refused; /* writes refused: no live grant, another ep's, out of
                                         bounds (read by any thread) */
    _Atomic uint64_t n_seal_refused;  /* sealed records that did not open (any thread) */
    struct cfx__keystream keys; /* grant keys */
    struct cfx__tp_revoked revoked; /* grants revoked lately: their late writes dropped */
    _Atomic uint64_t n_late_dropped; /* writes under such a grant, dropped (any thread) */
    uint64_t poll_gen;         /* incremented by every poll() */
    uint64_t hello_check;      /* next look for accepted eps silent past their deadline (ns) */
    uint32_t fail_node;        /* the last peer node whose ep failed, and when (ns): */
    uint64_t fail_ns;          /*   its other eps' failures soon after log at DEBUG */
    struct cfx_list eps;       /* live endpoints */
    struct cfx__tp_graveyard graveyard; /* closed eps freed at the next poll */
    struct cfx_list rx_backlog; /* eps with buffered frames waiting for slots/credits */

    struct cfx__tp_strangers strangers; /* accepted eps not yet authorized (tp_strangers.h) */
    struct cfx_ratelog accept_log; /* other accept failures, eps that could not be made */
    struct cfx_ratelog hello_log;  /* accepted eps dropped for a HELLO that never came */

    struct cfx__tp_cq cq;      /* completions, capacity reserved per ep */
    struct cfx__tp_table mrs;  /* registrations (struct cfx__tcp_mr), by rkey index */
    uint8_t *discard;  /* scratch for draining dropped payloads */
};

#define CFX_TCP_CQ_PER_EP    (CFX_TCP_TXQ_DEPTH + CFX_TCP_RX_MAX + 2)
#define CFX_TCP_DISCARD_SIZE (64u * 1024)

static inline struct cfx__tcp_iface *cfx__tcp_iface_of(struct cfx_tp_iface *i)
{
    return container_of(i, struct cfx__tcp_iface, super);
}

static inline struct cfx__tcp_ep *cfx__tcp_ep_of(struct cfx_tp_ep *e)
{
    return container_of(e, struct cfx__tcp_ep, super);
}

static inline struct cfx__tcp_mr *cfx__tcp_mr_of(struct cfx_tp_mr *m)
{
    return container_of(m, struct cfx__tcp_mr, super);
}

/* tcp_wire.c: pure checks of received bytes (fuzzed by test/fuzz/fuzz_tcp_hdr.c) */
/* Decode the 32-byte little-endian header at @p buf into host order in
 * @p out and check what needs no state: the frame type (only HELLO while
 * @p hello_wait), the HELLO and SEND payload sizes, a WRITE under
 * CFX_TP_WRITE_MAX.  Returns the frame type, or CFX_ERR_PROTO with a
 * static reason in *why. */
int cfx__tcp_hdr_check(const void *buf, size_t len, bool hello_wait, struct cfx__tcp_hdr *out,
                       const char **why);
/* Copy and check a HELLO payload (magic, version; addr is NUL-terminated in
 * @p out).  CFX_OK, CFX_ERR_PROTO or CFX_ERR_VERSION. */
int cfx__tcp_hello_check(const void *buf, size_t len, struct cfx__tcp_hello *out);

/* tcp_iface.c */
int cfx__tcp_epoll_set(struct cfx__tcp_ep *ep, uint32_t events);

/* tcp_ep.c */
/* Drop accepted endpoints whose HELLO did not arrive in time (a peer that
 * connects and says nothing must not pin a descriptor and buffers). */
#define CFX_TCP_HELLO_MS 10000
void cfx__tcp_ep_hello_expire(struct cfx__tcp_iface *iface, uint64_t now);

int cfx__tcp_ep_create(struct cfx__tcp_iface *iface, int fd, int state, uint32_t peer_node,
                       const char *addr, struct cfx__tcp_ep **out);
/* Close an accepted ep not yet authorized to make room for a newcomer
 * (@p why, static): quietly before its HELLO, else reported as EP_ERROR
 * (CFX_ERR_NO_RESOURCE). */
void cfx__tcp_ep_evict(struct cfx__tcp_ep *ep, const char *why);
/* ops->ep_authorize: the engine's handshake proved the peer holds the
 * token; the ep no longer counts against the caps on strangers. */
int cfx__tcp_ep_authorize(struct cfx_tp_ep *ep);
void cfx__tcp_ep_destroy(struct cfx__tcp_ep *ep);
void cfx__tcp_ep_progress(struct cfx__tcp_ep *ep, uint32_t events);
/* Parse the frames of backlogged eps (buffered while poll() owed room). */
void cfx__tcp_rx_backlog_run(struct cfx__tcp_iface *iface);
/* Hold posts back (@p on) and send them together in one sendmsg (!on). */
int cfx__tcp_ep_batch(struct cfx_tp_ep *ep, bool on);
/* @p mr is being deregistered: stop receiving into it; an ep with writes
 * from it still queued fails (CFX_ERR_CANCELED). */
void cfx__tcp_ep_mr_gone(struct cfx__tcp_ep *ep, struct cfx__tcp_mr *mr);
void cfx__tcp_ep_close(struct cfx_tp_ep *ep);
int cfx__tcp_ep_connect(struct cfx_tp_iface *iface, const void *addr, size_t len,
                        uint32_t peer_node, struct cfx_tp_ep **out);
int cfx__tcp_ep_write(struct cfx_tp_ep *ep, struct cfx_tp_mr *mr, uint64_t loff,
                      const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len, uint32_t imm,
                      uint64_t wr_id);
int cfx__tcp_ep_send(struct cfx_tp_ep *ep, const void *buf, size_t len, uint64_t wr_id);

/* tcp_seal.c */
int cfx__tcp_ep_seal(struct cfx_tp_ep *ep, int mode, const struct cfx_seal_keys *keys,
                     bool connector);
/* The ep's sealing state, allocated on first use.  NULL: out of memory. */
struct cfx__tcp_seal *cfx__tcp_seal_get(struct cfx__tcp_ep *ep);
void cfx__tcp_seal_free(struct cfx__tcp_ep *ep);
/* The epoll events @p ep needs now. */
uint32_t cfx__tcp_ep_events(const struct cfx__tcp_ep *ep);
/* tcp_ep.c: resume the receive of an ep whose keys came (its bytes wait). */
void cfx__tcp_ep_rx_resume(struct cfx__tcp_ep *ep);

/* tcp_mr.c */
int cfx__tcp_mem_reg(struct cfx_tp_iface *iface, const struct cfx_tp_mem_desc *mem, unsigned access,
                     struct cfx_tp_mr **out);
void cfx__tcp_mem_dereg(struct cfx_tp_mr *mr);
int cfx__tcp_mr_pack(struct cfx_tp_mr *mr, struct cfx_tp_rdesc *out);
int cfx__tcp_mr_grant(struct cfx_tp_mr *mr, struct cfx_tp_ep *ep, struct cfx_tp_rdesc *out);
void cfx__tcp_mr_revoke(struct cfx_tp_mr *mr);
/* Registration whose live grant lets @p ep write [off, off+len), or NULL
 * with a static reason in *why. */
struct cfx__tcp_mr *cfx__tcp_mr_lookup(struct cfx__tcp_iface *iface, const struct cfx__tcp_ep *ep,
                                       const struct cfx__tcp_hdr *h, const char **why);
void cfx__tcp_mr_table_free(struct cfx__tcp_iface *iface);

#endif

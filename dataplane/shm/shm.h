/*
 * shm transport: private definitions shared by shm_iface.c, shm_ep.c,
 * shm_conn.c, shm_mr.c and shm_ring.c.
 *
 * Wiring.  An iface listens on an AF_UNIX SOCK_SEQPACKET socket in the
 * abstract namespace ("@conflux-shm-<pid>-<random>").  The connecting side
 * creates a sealed memfd segment holding two single-producer/single-consumer
 * byte rings (one per direction) and passes it with its doorbell eventfd in
 * a HELLO (SCM_RIGHTS); the accepting side maps it and answers with an ACK
 * carrying its own doorbell.  The socket stays open for the endpoint's life:
 * its hang-up is how a dead peer is noticed, and a best-effort BYE on it
 * carries the reason of an orderly close or a protocol failure.
 *
 * Data.  Each ring carries 64-byte aligned messages [header | payload]:
 *   SEND   control message (<= CFX_TP_SEND_MAX), handed to the user as a private
 *          copy (valid until the next poll; the peer could rewrite the ring);
 *   WFRAG  staged write fragment: the receiver copies the payload into its
 *          registration (key + offset checked first); the LAST one reports
 *          WRITE_IMM;
 *   WPULL  one-copy write: the source is a region of a sealed file the
 *          writer holds (its arena memfd); the receiver checks key, grant,
 *          writer and bounds first, then copies from its read-only mapping
 *          of that file into the registration, reports WRITE_IMM and
 *          answers in the ring's control block (ctl->pulled), which is when
 *          the writer's write completes (shm_mr.c says why this way round);
 *   WRAP   padding up to the end of the ring.
 *
 * Doorbells.  One eventfd per iface.  iface_arm() sets consumer_sleeping in
 * every inbound ring (and producer_waiting in outbound rings it is blocked
 * on), issues a full barrier and re-checks; the other side writes the
 * eventfd only when it sees a flag set, so a busy peer costs no syscalls.
 *
 * Trust.  Only a peer of our effective uid in our user namespace
 * (SO_PEERCRED and /proc/<pid>/ns/user, checked on accept and on connect)
 * gets past the socket, and only one that proves the cluster token with a
 * mutual HMAC over fresh nonces (HELLO: Nc; ACK: Na, MAC_accept; AUTH:
 * MAC_connect) gets its ring read: the acceptor maps the segment at HELLO
 * but consumes nothing until AUTH verified.  Every ring position the peer
 * publishes is checked against what it could be before use; one that
 * cannot be fails the endpoint with CFX_ERR_PROTO (iface->n_ring_errors).
 *
 * Threading: an iface, its endpoints and registrations belong to one thread.
 */
#ifndef CFX_SHM_SHM_H
#define CFX_SHM_SHM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "dataplane/common/flood.h"
#include "dataplane/common/list.h"
#include "dataplane/common/util.h"
#include "dataplane/tpbase/tpbase.h"
#include "dataplane/transport.h"
#include "shm_ring.h"

#define CFX_SHM_MAGIC        0x53584643u /* "CFXS" */
#define CFX_SHM_VERSION      4  /* 2: nonces and MACs in the handshake; 3: WPULL, not WDONE;
                                   4: the connector proves the token first (PROOF) */
#define CFX_SHM_RING_DEFAULT (4u << 20)  /* bytes per direction (CFX_SHM_RING_SIZE) */
#define CFX_SHM_RING_MIN     (64u << 10)
#define CFX_SHM_RING_MAX     (256u << 20)
#define CFX_SHM_FRAG_DEFAULT (256u << 10) /* staged fragment payload (CFX_SHM_FRAG_SIZE) */
#define CFX_SHM_FRAG_MIN     (4u << 10)   /* never cut a fragment smaller than this */
#define CFX_SHM_DIRECT_CHUNK (8u << 20)   /* one-copy (WPULL) copy per step */
#define CFX_SHM_RX_BUDGET    (16u << 20)  /* one-copy bytes pulled per ep per progress call */
#define CFX_SHM_PULL_INFLIGHT 16          /* WPULLs unanswered at once, per ep */
#define CFX_SHM_TX_BUDGET    (16u << 20)  /* bytes copied per ep per progress call */
#define CFX_SHM_TXQ_DEPTH    256   /* ops queued behind the ring, per ep */
#define CFX_SHM_SEND_SLOTS   32    /* ep_send copies queued behind a write, per ep */
#define CFX_SHM_RX_COPIES   16   /* SENDs handed to the user per poll of one ep */
#define CFX_SHM_MAP_CACHE    64    /* peer registrations mapped, per ep */
#define CFX_SHM_MAP_BYTES    (4ull << 30) /* idle mappings kept beyond this are dropped */
#define CFX_SHM_CQ_SOFT_MAX  65536 /* unpolled completions before posts say AGAIN */
#define CFX_SHM_SOCK_CHECK_NS 1000000ull /* socket poll period while busy */
#define CFX_SHM_CLOCK_POLLS   64         /* a busy poll reads the clock once in this many */
#define CFX_SHM_CONNECT_NS   (10ull * 1000000000ull) /* retrying a full backlog */
#define CFX_SHM_RDESC_TAG    0x53  /* 'S': first byte of an shm rdesc */

/* Handshake and control messages on the unix socket. */
enum cfx__shm_ctl_type {
    CFX_SHM_CTL_HELLO = 1,  /* connector -> acceptor, fds: memfd, doorbell */
    CFX_SHM_CTL_ACK,        /* acceptor -> connector, fds: doorbell */
    CFX_SHM_CTL_BYE,        /* either way, best effort: status says why */
    CFX_SHM_CTL_AUTH,       /* connector -> acceptor: mac proves the token */
    CFX_SHM_CTL_PROOF,      /* acceptor -> connector, once AUTH verified: its mac */
};

#define CFX_SHM_NONCE_LEN 32  /* == CFX_AUTH_NONCE_LEN (checked in shm_conn.c) */
#define CFX_SHM_MAC_LEN   32  /* == CFX_AUTH_MAC_LEN */

struct cfx__shm_ctl {
    uint32_t magic;        /* CFX_SHM_MAGIC */
    uint16_t version;      /* CFX_SHM_VERSION */
    uint16_t type;         /* enum cfx__shm_ctl_type */
    uint32_t node_id;      /* sender's node id */
    int32_t status;        /* BYE: CFX_ERR_CLOSED, CFX_ERR_PROTO, ... */
    uint64_t ring_size;    /* HELLO: bytes per ring */
    uint64_t seg_size;     /* HELLO: bytes of the memfd */
    uint8_t nonce[CFX_SHM_NONCE_LEN]; /* HELLO: connector's; ACK: acceptor's */
    uint8_t mac[CFX_SHM_MAC_LEN];     /* AUTH, PROOF: HMAC over both nonces; zero in ACK */
};

/* Remote descriptor layout inside struct cfx_tp_rdesc.data (same host). */
struct cfx__shm_rdesc {
    uint8_t tag;           /* CFX_SHM_RDESC_TAG */
    uint8_t direct;        /* 1: pid/fd/ino/off name a mappable memfd (only for the
                              receiver's own map cache of a writer's source: a
                              grant never names the granted memory's file) */
    uint16_t rsv;
    uint32_t key;          /* index in the owner's table */
    uint64_t len;          /* bytes in the region */
    int32_t pid;           /* owner's pid */
    int32_t fd;            /* owner's fd of the shareable file */
    uint64_t ino;          /* inode of that file: a reused fd number won't match */
    uint64_t off;          /* offset of the region in that file */
    uint64_t grant;        /* random key of the grant (mr_grant), fresh per grant */
};
_Static_assert(sizeof(struct cfx__shm_rdesc) <= CFX_TP_RDESC_MAX, "shm rdesc fits an rdesc");

struct cfx__shm_mr {
    struct cfx_tp_mr super;
    uint32_t key;          /* index in the iface table */
    struct cfx__tp_grant grant; /* the live write grant (tpbase.h) */
    int shm_fd;            /* -1, or fd holding addr (not owned) */
    uint64_t shm_off;
    uint64_t ino;
};

/* A peer's source region mapped read-only into this process (WPULL). */
struct cfx__shm_map {
    uint64_t ino;          /* 0: unused entry */
    uint64_t off;          /* region offset in the file (as in the rdesc) */
    uint64_t len;          /* region length */
    uint8_t *base;         /* mapping start (page aligned) */
    size_t map_len;
    uint8_t *region;       /* base + (off - page-aligned off) */
    uint64_t last_use;     /* LRU clock */
    uint32_t refs;         /* pulls using it */
};

enum cfx__shm_op_type { CFX_SHM_OP_SEND = 1, CFX_SHM_OP_WRITE };

struct cfx__shm_op {
    uint8_t type;          /* enum cfx__shm_op_type */
    bool started;          /* WRITE: first fragment emitted */
    int16_t send_slot;     /* SEND: slot in ep->send_pool */
    uint32_t imm;
    uint32_t key;          /* WRITE: receiver's key */
    uint64_t wr_id;
    const uint8_t *src;    /* WRITE: local source; SEND: payload copy */
    bool pull;             /* WRITE: one-copy (WPULL), else staged */
    bool posted;           /* WRITE, pull: WPULL in the ring, waiting for ctl->pulled */
    int32_t src_fd;        /* WRITE: source registration's file (-1: none), ... */
    uint64_t src_ino;      /* ... its inode, */
    uint64_t src_foff;     /* ... the registration's offset in it */
    uint64_t src_flen;     /* ... and length; */
    uint64_t src_soff;     /* ... the source's offset in the registration */
    uint64_t pull_seq;     /* WRITE, posted: its WPULL's seq */
    uint64_t roff;         /* WRITE: offset in the receiver's region */
    uint64_t len;
    uint64_t done;         /* bytes copied so far */
    struct cfx__shm_rdesc rd; /* WRITE: destination, resolved when started */
};

enum cfx__shm_ep_state {
    CFX_SHM_EP_CONNECTING = 1, /* connect() said EAGAIN: retried */
    CFX_SHM_EP_HELLO_SENT,     /* waiting for the acceptor's ACK */
    CFX_SHM_EP_HELLO_WAIT,     /* accepted: waiting for the HELLO */
    CFX_SHM_EP_AUTH_WAIT,      /* accepted, ACK sent: waiting for the connector's MAC */
    CFX_SHM_EP_PROOF_WAIT,     /* connecting, our MAC sent: waiting for the acceptor's */
    CFX_SHM_EP_READY,
    CFX_SHM_EP_PEER_GONE,      /* socket hung up: drain the ring, then fail */
    CFX_SHM_EP_FAILED,         /* status is sticky, EP_ERROR queued */
};

/* What an epoll event points at. */
enum cfx__shm_ev_kind { CFX_SHM_EV_LISTEN = 1, CFX_SHM_EV_DOORBELL, CFX_SHM_EV_EP };

struct cfx__shm_ev {
    int kind;              /* enum cfx__shm_ev_kind */
};

struct cfx__shm_ep {
    struct cfx_tp_ep super;
    struct cfx__shm_iface *iface;
    uint64_t serial;              /* never reused in the iface: names the ep in grants */
    struct cfx__shm_ev ev;        /* epoll tag for sock */
    struct cfx_list link;         /* iface->eps or iface->graveyard */
    int state;                    /* enum cfx__shm_ep_state */
    int sock;                     /* unix socket, -1 once closed */
    int peer_doorbell;            /* peer iface's eventfd, -1 before the handshake */
    pid_t peer_pid;               /* from SO_PEERCRED */
    uid_t peer_uid;               /* from SO_PEERCRED: always ours once checked */
    uint8_t nonce[CFX_SHM_NONCE_LEN];      /* ours for this handshake */
    uint8_t peer_nonce[CFX_SHM_NONCE_LEN]; /* the peer's */
    int peer_status;              /* status from the peer's BYE */
    bool direct_off;              /* peer memfds cannot be opened: stage */
    uint64_t connect_deadline;    /* CONNECTING, HELLO_SENT, HELLO_WAIT: give up after */
    char sun_path[108];           /* CONNECTING: abstract name (leading NUL) */
    uint32_t sun_len;

    void *seg;                    /* shared segment */
    size_t seg_len;
    struct cfx__shm_ring tx;      /* we produce */
    struct cfx__shm_ring rx;      /* we consume */

    struct cfx__shm_op *txq;      /* CFX_SHM_TXQ_DEPTH ring */
    uint32_t txq_head;            /* oldest op */
    uint32_t txq_count;
    uint8_t *send_pool;           /* CFX_SHM_SEND_SLOTS * CFX_TP_SEND_MAX */
    uint8_t *rx_copy;             /* CFX_SHM_RX_COPIES * CFX_TP_SEND_MAX: received SENDs,
                                     copied out of the ring the peer can still rewrite */
    uint32_t send_free;           /* bitmap of free slots */

    uint64_t pull_seq;            /* WPULLs we sent */
    uint64_t pulled_seen;         /* peer's last answer (ctl->pulled), as checked */
    uint32_t pull_inflight;       /* ops at the head of txq whose WPULL is unanswered */
    bool pull_ok;                 /* the peer read a source of ours: pipeline WPULLs */
    uint64_t rx_pull_seq;         /* WPULLs the peer sent, as checked */
    struct {                      /* the peer's WPULL being copied (one at a time: the ring
                                     message stays unconsumed until it is done) */
        bool active;
        struct cfx__shm_msg h;    /* our copy of its header (the peer may rewrite the ring) */
        struct cfx__shm_map *map; /* the source mapping */
        uint64_t soff;            /* source offset in the mapped region */
        uint64_t done;            /* bytes copied */
        uint64_t seq;
    } rx_pull;
    struct cfx__shm_map maps[CFX_SHM_MAP_CACHE];
    uint64_t map_clock;
    uint64_t map_bytes;           /* bytes mapped in maps[] */

    uint64_t n_direct;            /* writes sent one-copy (WPULL) */
    uint64_t n_staged;            /* writes sent through the ring */
    uint64_t n_rx_direct;         /* peer's one-copy writes copied here */
    uint64_t n_rx_staged;         /* peer's staged writes landed here */
};

struct cfx__shm_iface {
    struct cfx_tp_iface super;
    int epfd;                     /* iface_fd: listen, doorbell, ep sockets */
    int listen_fd;
    int doorbell;                 /* our eventfd, given to every peer */
    struct cfx__shm_ev listen_ev;
    struct cfx__shm_ev doorbell_ev;
    char addr[80];                /* "@conflux-shm-<pid>-<random>" */
    size_t ring_size;             /* rings we create */
    size_t frag_size;             /* staged fragment payload */
    pid_t pid;
    bool armed;                   /* flags set in the rings by iface_arm */
    unsigned handshaking;         /* eps not yet READY/FAILED */
    char token[257];              /* cluster token (CFX_TOKEN_MAX + 1), "" for none */
    uint64_t n_refused;           /* peers refused: another uid or user namespace,
                                     or no proof of the token */
    struct cfx_ratelog refuse_log; /* their lines: another user may connect at will */
    uint64_t ep_serial;           /* last ep serial handed out */
    _Atomic uint64_t n_grant_refused; /* writes refused: no live grant, another ep's,
                                         or out of bounds (read by any thread) */
    struct cfx__keystream keys;   /* grant keys */
    struct cfx__tp_revoked revoked; /* grants revoked lately: their late writes dropped */
    _Atomic uint64_t n_late_dropped; /* writes under such a grant, dropped (any thread) */
    uint64_t n_ring_errors;       /* endpoints failed for a ring position or message
                                     the peer wrote that cannot be */
    uint64_t next_sock_check;     /* ns */
    uint32_t polls_unclocked;     /* polls since the clock was last read (shm_poll) */
    struct cfx_list eps;          /* live endpoints */
    struct cfx__tp_graveyard graveyard; /* closed eps, freed at the next poll */

    struct cfx__tp_cq cq;         /* completions not yet polled (no reservations:
                                     posts say AGAIN past CFX_SHM_CQ_SOFT_MAX) */
    struct cfx__tp_table mrs;     /* registrations (struct cfx__shm_mr), by key */
};

static inline struct cfx__shm_iface *cfx__shm_iface_of(struct cfx_tp_iface *i)
{
    return container_of(i, struct cfx__shm_iface, super);
}

static inline struct cfx__shm_ep *cfx__shm_ep_of(struct cfx_tp_ep *e)
{
    return container_of(e, struct cfx__shm_ep, super);
}

static inline struct cfx__shm_mr *cfx__shm_mr_of(struct cfx_tp_mr *m)
{
    return container_of(m, struct cfx__shm_mr, super);
}

/* shm_iface.c */
static inline void cfx__shm_cq_push(struct cfx__shm_iface *iface, uint8_t type, int status,
                                    struct cfx__shm_ep *ep, uint64_t wr_id)
{
    struct cfx_tp_completion *c = cfx__tp_cq_push(&iface->cq);
    c->type = type;
    c->status = status;
    c->ep = &ep->super;
    c->wr_id = wr_id;
}

/* shm_conn.c: sockets, handshake, hang-up */
int cfx__shm_ep_connect(struct cfx_tp_iface *iface, const void *addr, size_t len,
                        uint32_t peer_node, struct cfx_tp_ep **out);
void cfx__shm_accept(struct cfx__shm_iface *iface);
void cfx__shm_ep_sock_event(struct cfx__shm_ep *ep);
void cfx__shm_ep_connect_retry(struct cfx__shm_ep *ep);
/* True when an endpoint in @p state counts in iface->handshaking. */
static inline bool cfx__shm_state_handshaking(int state)
{
    return state == CFX_SHM_EP_CONNECTING || state == CFX_SHM_EP_HELLO_SENT ||
           state == CFX_SHM_EP_HELLO_WAIT || state == CFX_SHM_EP_AUTH_WAIT ||
           state == CFX_SHM_EP_PROOF_WAIT;
}
/* A handshake past its deadline: an accepted peer that sent no HELLO is
 * dropped quietly, a connection whose ACK never came fails (CFX_ERR_TIMEOUT).
 * @return true when @p ep is gone from the iface's list. */
bool cfx__shm_ep_handshake_expire(struct cfx__shm_ep *ep, uint64_t now);
/* Close the socket (after a best-effort BYE(@p status) when @p bye). */
void cfx__shm_ep_sock_close(struct cfx__shm_ep *ep, bool bye, int status);

/* shm_ep.c: endpoints and the data path */
struct cfx__shm_ep *cfx__shm_ep_alloc(struct cfx__shm_iface *iface, int sock,
                                      int state, uint32_t peer_node);
void cfx__shm_ep_set_rings(struct cfx__shm_ep *ep, void *seg, size_t seg_len,
                           size_t ring_size, bool connector);
void cfx__shm_ep_fail(struct cfx__shm_ep *ep, int status, bool tell_peer);
void cfx__shm_ep_close(struct cfx_tp_ep *ep);
void cfx__shm_ep_free(struct cfx__shm_ep *ep);
int cfx__shm_ep_write(struct cfx_tp_ep *ep, struct cfx_tp_mr *mr, uint64_t loff,
                      const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len,
                      uint32_t imm, uint64_t wr_id);
int cfx__shm_ep_send(struct cfx_tp_ep *ep, const void *buf, size_t len, uint64_t wr_id);
void cfx__shm_ep_tx_progress(struct cfx__shm_ep *ep);
int cfx__shm_ep_rx_progress(struct cfx__shm_ep *ep, struct cfx_tp_completion *comps,
                            int max);
/* iface_arm helper: set the wake-up flags; true when work is pending. */
bool cfx__shm_ep_arm(struct cfx__shm_ep *ep);
bool cfx__shm_ep_recheck(struct cfx__shm_ep *ep);
void cfx__shm_ep_disarm(struct cfx__shm_ep *ep);

/* shm_mr.c */
int cfx__shm_mem_reg(struct cfx_tp_iface *iface, const struct cfx_tp_mem_desc *mem,
                     unsigned access, struct cfx_tp_mr **out);
void cfx__shm_mem_dereg(struct cfx_tp_mr *mr);
int cfx__shm_mr_pack(struct cfx_tp_mr *mr, struct cfx_tp_rdesc *out);
int cfx__shm_mr_grant(struct cfx_tp_mr *tpm, struct cfx_tp_ep *tpe, struct cfx_tp_rdesc *out);
void cfx__shm_mr_revoke(struct cfx_tp_mr *tpm);
/* Registration whose live grant @p grant lets @p ep write [off, off+len),
 * or NULL with a static reason in *why. */
struct cfx__shm_mr *cfx__shm_mr_lookup(struct cfx__shm_iface *iface, const struct cfx__shm_ep *ep,
                                       uint32_t key, uint64_t grant, uint64_t off, uint64_t len,
                                       const char **why);
void cfx__shm_mr_table_free(struct cfx__shm_iface *iface);
/* Read-only mapping of the peer's source region @p rd (WPULL), or NULL
 * when it cannot be read (the writer stages instead). */
struct cfx__shm_map *cfx__shm_map_get(struct cfx__shm_ep *ep,
                                      const struct cfx__shm_rdesc *rd);
void cfx__shm_map_put(struct cfx__shm_map *map);
void cfx__shm_map_flush(struct cfx__shm_ep *ep);

#endif

/*
 * The transport contract.
 *
 * Every transport (tcp, shm, verbs, later dpdk) fills one versioned ops
 * table.  The shape is one-sided, after RDMA verbs, NCCL's net plugin and
 * UCX's uct, so that verbs is the natural case and the others emulate it:
 *
 *   - memory is registered (mem_reg) and described to peers by a remote
 *     descriptor (mr_pack -> struct cfx_tp_rdesc);
 *   - ep_write() is a one-sided write with a 32-bit immediate into a peer's
 *     registered memory; the peer sees a CFX_TP_COMP_WRITE_IMM completion
 *     carrying the immediate once every byte has landed (verbs:
 *     RDMA_WRITE_WITH_IMM; tcp: framed header + payload read straight into
 *     the registered window after a bounds check; shm: one copy into the
 *     mapped peer memory, or through a staging ring, plus a doorbell);
 *   - ep_send() carries small control messages (<= CFX_TP_SEND_MAX bytes);
 *   - poll() returns completions; nothing calls back.
 *
 * Ordering: writes and sends posted on one endpoint are delivered to the
 * peer in the order they were posted (RC semantics).
 *
 * Errors are sticky per endpoint: after a failure every outstanding write and
 * send on it completes with a non-OK status (flushed), then exactly one
 * CFX_TP_COMP_EP_ERROR is reported, and later posts return the sticky status.
 * Nothing ever hangs on a dead peer: a transport notices a dead peer from its
 * connection (socket hang-up, QP error, peer process exit).
 *
 * Threading: one iface and all its endpoints and registrations are driven by
 * one thread at a time: whoever holds the context's progress lock (the
 * progress thread, or an API thread polling in a wait; engine.h).  The lock
 * orders every call, so transports need no locks of their own.  Built with
 * CFX_THREAD_CHECKS (the default where tests are built), every entry point
 * but iface_open/close/addr/fd and iface_grant_refused checks that rule and
 * aborts, naming the function, when another thread calls it
 * (CFX_TP_THREAD_CHECK below; the engine sets iface->owner once its
 * progress thread starts, and cfx__tp_driver while a thread drives).
 * A missing op is NULL; callers treat NULL as CFX_ERR_UNSUPPORTED.
 */
#ifndef CFX_DATAPLANE_TRANSPORT_H
#define CFX_DATAPLANE_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <conflux/mem.h>
#include <conflux/status.h>

#define CFX_TP_OPS_VERSION 1
#define CFX_TP_ADDR_MAX    108   /* bytes of an iface address */
#define CFX_TP_RDESC_MAX   48    /* bytes of a remote memory descriptor */
#define CFX_TP_SEND_MAX    4096  /* largest ep_send() payload */
#define CFX_TP_WRITE_MAX   (1u << 30) /* largest single ep_write() */
#define CFX_TP_NAME_MAX    16

struct cfx_transport_ops;

/* Base objects; each transport embeds them and uses container_of(). */
struct cfx_tp_iface {
    const struct cfx_transport_ops *ops;
    uint32_t node_id;                 /* local node id, for log messages */
    const void *owner;                /* the engine's context driving it (thread checks);
                                         NULL: unchecked (a transport on its own, tests) */
};

/* The owner this thread drives now (the context whose progress lock it
 * holds), NULL for none; set by the engine (progress.c). */
extern __thread const void *cfx__tp_driver;

/* Report a transport entry point called by a thread that does not drive
 * its iface, and abort (CFX_THREAD_CHECKS builds). */
void cfx__tp_thread_violation(const struct cfx_tp_iface *iface, const char *fn);

#ifdef CFX_THREAD_CHECKS
#define CFX_TP_THREAD_CHECK(iface)                                                     \
    do {                                                                               \
        const struct cfx_tp_iface *chk_ = (iface);                                     \
        if (__builtin_expect(chk_ && chk_->owner && chk_->owner != cfx__tp_driver, 0)) \
            cfx__tp_thread_violation(chk_, __func__);                                  \
    } while (0)
#else
#define CFX_TP_THREAD_CHECK(iface) ((void)0)
#endif

struct cfx_tp_ep {
    struct cfx_tp_iface *iface;
    uint32_t peer_node;               /* peer node id given at connect/learned by engine */
    int status;                       /* sticky: CFX_OK until the ep fails */
    void *user;                       /* owned by the engine */
    char peer_name[64];               /* "node 3 (127.0.0.1:4321)" for messages */
    const char *why;                  /* NULL, or a static text: why the transport failed it
                                         where the status alone does not say (shm: the peer
                                         is another user), for the engine's messages */
};

struct cfx_tp_mr {
    struct cfx_tp_iface *iface;
    void *addr;
    size_t len;
    enum cfx_memtype memtype;
    unsigned access;                  /* CFX_TP_ACCESS_* it was registered with */
};

/* What mem_reg is told about a region: what the memory is, never what a
 * transport should do with it.  What a transport derives from it (shm: the
 * file's inode, the rdesc that lets a peer map it) lives in its own
 * registration object, which embeds struct cfx_tp_mr. */
struct cfx_tp_mem_desc {
    void *addr;
    size_t len;
    enum cfx_memtype memtype;
    int file_fd;          /* -1, or fd of a shareable file (memfd) that holds addr: the
                             engine's arena, whose memory outlives any one user (shm
                             lets a peer process map it; verbs caches its registrations
                             past mem_dereg, see mem_invalidate) */
    uint64_t file_off;    /* offset of addr inside file_fd */
};

/* Access rights of a registration. */
enum {
    CFX_TP_ACCESS_LOCAL  = 1u << 0,   /* source of local writes */
    CFX_TP_ACCESS_REMOTE_WRITE = 1u << 1, /* peers may write into it */
};

/* Remote descriptor: the bytes a peer needs to write into a registration. */
struct cfx_tp_rdesc {
    uint8_t len;                       /* bytes used in data[] */
    uint8_t data[CFX_TP_RDESC_MAX];
};

enum cfx_tp_comp_type {
    CFX_TP_COMP_WRITE = 1, /* a local ep_write finished: source buffer reusable */
    CFX_TP_COMP_SEND,      /* a local ep_send finished */
    CFX_TP_COMP_RECV,      /* control message from the peer: data, len */
    CFX_TP_COMP_WRITE_IMM, /* peer's write landed in local memory: imm, len */
    CFX_TP_COMP_CONNECTED, /* ep_connect() finished; the ep may now be used */
    CFX_TP_COMP_ACCEPT,    /* a peer connected: ep is new and ready */
    CFX_TP_COMP_EP_ERROR,  /* ep failed (after its flushed ops): status */
};

struct cfx_tp_completion {
    uint8_t type;          /* enum cfx_tp_comp_type */
    int32_t status;        /* CFX_OK or a negative status */
    struct cfx_tp_ep *ep;  /* endpoint concerned */
    uint64_t wr_id;        /* WRITE, SEND: as posted */
    uint32_t imm;          /* WRITE_IMM: the immediate */
    uint32_t len;          /* WRITE_IMM, RECV: bytes */
    const void *data;      /* RECV: the message, valid until the next poll() */
};

enum cfx_tp_iface_param_field {
    CFX_TP_IFACE_PARAM_BIND_ADDR = 1u << 0,
    CFX_TP_IFACE_PARAM_NODE_ID   = 1u << 1,
    CFX_TP_IFACE_PARAM_DEVICE    = 1u << 2,
    CFX_TP_IFACE_PARAM_TOKEN     = 1u << 3,
};

struct cfx_tp_iface_params {
    uint64_t field_mask;
    const char *bind_addr;  /* tcp/verbs: local IP to listen on (default 127.0.0.1) */
    uint32_t node_id;       /* local node id */
    const char *device;     /* verbs: HCA name */
    const char *token;      /* shm: cluster token every peer must prove before its
                               rings carry anything (copied; NULL or "": same-user
                               peers without a token, for transport unit tests) */
};

enum {
    CFX_TP_CAP_SAME_HOST = 1u << 0, /* only reaches peers on the same host */
    CFX_TP_CAP_BUSY_POLL = 1u << 1, /* packets arrive with no fd turning readable (a user-space
                                       NIC queue): the progress thread polls it without a nap
                                       while it has endpoints (a transport whose iface_fd is
                                       -1 is treated the same) */
    CFX_TP_CAP_SEAL = 1u << 2,      /* has ep_seal: its traffic can be sealed (CFX_SECURE) */
};

struct cfx_seal_keys; /* control/seal.h */

struct cfx_transport_ops {
    unsigned version;   /* CFX_TP_OPS_VERSION */
    const char *name;   /* "tcp", "shm", "verbs" */
    unsigned caps;      /* CFX_TP_CAP_* */

    /* Open an iface (listening for peers).  CFX_ERR_NO_DEVICE when the
     * transport cannot run on this machine. */
    int (*iface_open)(const struct cfx_tp_iface_params *params,
                      struct cfx_tp_iface **out);
    void (*iface_close)(struct cfx_tp_iface *iface);

    /* Address peers pass to ep_connect(); *len in: capacity, out: used. */
    int (*iface_addr)(struct cfx_tp_iface *iface, void *buf, size_t *len);

    /* Fd that turns readable when poll() may have work after iface_arm();
     * -1 when the transport must be polled (as CFX_TP_CAP_BUSY_POLL). */
    int (*iface_fd)(struct cfx_tp_iface *iface);

    /* Prepare to sleep on iface_fd.  CFX_ERR_AGAIN when work is already
     * pending (poll again instead of sleeping). */
    int (*iface_arm)(struct cfx_tp_iface *iface);

    /* Start connecting to a peer; completes with CONNECTED or EP_ERROR. */
    int (*ep_connect)(struct cfx_tp_iface *iface, const void *addr, size_t len,
                      uint32_t peer_node, struct cfx_tp_ep **out);
    /* Close now: outstanding ops are dropped without completions; the peer
     * sees an EP_ERROR (CFX_ERR_PEER_FAILED or CFX_ERR_CLOSED). */
    void (*ep_close)(struct cfx_tp_ep *ep);

    int (*mem_reg)(struct cfx_tp_iface *iface, const struct cfx_tp_mem_desc *mem,
                   unsigned access, struct cfx_tp_mr **out);
    void (*mem_dereg)(struct cfx_tp_mr *mr);
    /* Describe @p mr to peers.  tcp and shm: a grant of the whole region to
     * any peer, as mr_grant(mr, NULL, out) (transport tests and verbs). */
    int (*mr_pack)(struct cfx_tp_mr *mr, struct cfx_tp_rdesc *out);

    /* One-sided write of [loff, loff+len) of @p mr to [roff, roff+len) of the
     * peer region @p rdesc, then WRITE_IMM(imm, len) at the peer.
     * CFX_ERR_AGAIN: send queue full, retry after polling. */
    int (*ep_write)(struct cfx_tp_ep *ep, struct cfx_tp_mr *mr, uint64_t loff,
                    const struct cfx_tp_rdesc *rdesc, uint64_t roff, size_t len,
                    uint32_t imm, uint64_t wr_id);

    /* Send a control message (copied before return).  CFX_ERR_AGAIN: queue full. */
    int (*ep_send)(struct cfx_tp_ep *ep, const void *buf, size_t len, uint64_t wr_id);

    /* Reap up to @p max completions; returns the count or a negative status. */
    int (*poll)(struct cfx_tp_iface *iface, struct cfx_tp_completion *comps, int max);

    /* Optional, for a transport polled without a wait fd
     * (CFX_TP_CAP_BUSY_POLL): how long the engine may leave it unpolled
     * while it has connections, in ms.  0 (or no op): poll on, packets may
     * arrive any moment.  More once it has been quiet a while: nothing in
     * flight, no timer of its own due, no data for some time; a packet that
     * arrives meanwhile waits in the port's queue that long at most. */
    int (*iface_quiet_ms)(struct cfx_tp_iface *iface);

    /* Optional.  @p on: the sends and writes posted on @p ep from now on may
     * wait, so that several leave together (tcp: one sendmsg); !on: they are
     * handed over now, as an unbatched post would have been.  A transport
     * bounds what it holds back by itself.  Callers bracket a loop of posts
     * with (true) ... (false) and never poll in between. */
    int (*ep_batch)(struct cfx_tp_ep *ep, bool on);

    /* Optional (tcp, shm).  Let the peer of @p ep (NULL: any peer) write
     * into [0, mr->len) of @p mr until mr_revoke() or mem_dereg(), and pack
     * the rdesc that names this grant: its key is fresh random bits, so no
     * peer can derive it from the keys of earlier grants.  One live grant
     * per registration: a new one revokes the one before.  A write outside a
     * live grant (stale key, another peer's, past the region) changes no
     * byte of the registration, fails the writer's endpoint with
     * CFX_ERR_PROTO and is counted (the iface's n_grant_refused); but on
     * tcp (in clear), shm and dpdk a write under one of the last
     * CFX_TP_REVOKED_KEEP grants revoked, from the endpoint it was granted
     * to, is dropped whole, reports nothing, and is counted apart
     * (n_late_dropped): the receiver gave the transfer up while it was on
     * its way (tpbase.h).  On verbs the HCA refuses it. */
    int (*mr_grant)(struct cfx_tp_mr *mr, struct cfx_tp_ep *ep, struct cfx_tp_rdesc *out);
    /* End the live grant of @p mr, if any: its key is refused from now on,
     * in every write or chunk of a write that starts after.  A chunk whose
     * header was accepted before (tcp: a frame being read; dpdk: a 256 KiB
     * chunk in flight) still lands: only mem_dereg() stops the bytes of
     * writes already under way (what the engine does before a caller's
     * buffer is handed back). */
    void (*mr_revoke)(struct cfx_tp_mr *mr);
    /* Optional.  Writes refused so far for want of a live grant; may be
     * called from any thread (cfx_context_stats: writes_refused). */
    uint64_t (*iface_grant_refused)(struct cfx_tp_iface *iface);
    /* Optional.  Writes dropped so far under a grant revoked lately (see
     * mr_grant); any thread (cfx_context_stats: writes_late). */
    uint64_t (*iface_late_dropped)(struct cfx_tp_iface *iface);

    /* Optional.  The memory in [addr, addr + len) is about to be unmapped
     * (the engine's arena drops a segment): forget whatever the transport
     * keeps of it past mem_dereg (verbs: cached registrations), so a later
     * mapping at the same address is not taken for it.  Returns the number
     * of registrations dropped.  NULL: the transport keeps nothing of a
     * region past its mem_dereg, so there is nothing to invalidate. */
    uint32_t (*mem_invalidate)(struct cfx_tp_iface *iface, const void *addr, size_t len);

    /* Optional.  The engine authenticated the peer of @p ep (its token
     * handshake, conn_auth.c): from now on the peer may write into this
     * side's memory through the grants it is given.  Until then a
     * transport whose hardware takes remote writes by itself (verbs: the
     * QP's remote access flags) refuses every write of the peer, whatever
     * key it names.  tcp, verbs and dpdk count an accepted ep against
     * their caps on strangers until then (tpbase/tp_strangers.h).
     * Idempotent.  An error fails @p ep (sticky status).  NULL: the
     * transport checks every write against its grants itself and keeps no
     * strangers' caps (shm: same user only), so authentication changes
     * nothing there. */
    int (*ep_authorize)(struct cfx_tp_ep *ep);

    /* Optional (CFX_TP_CAP_SEAL: tcp, dpdk).  The engine's token handshake on
     * @p ep agreed on sealing (CFX_SECURE, control/seal.h) in @p mode with
     * @p keys; @p connector says which side of the handshake this end was.
     * The next frame posted on @p ep is the last one in clear (its header
     * says so to the peer) and every later one is sealed; the peer's frame
     * that says it is its last in clear (received already or still to
     * come) ends the clear bytes this side takes.  Before that frame, the
     * transport reads nothing of the peer's stream that it could not yet
     * open.  A record that fails to open fails @p ep with CFX_ERR_AUTH and is
     * counted (iface_seal_refused); nothing of it is reported or lands in
     * registered memory.  The keys are copied.  On an error nothing changed: the
     * caller ends the connection. */
    int (*ep_seal)(struct cfx_tp_ep *ep, int mode, const struct cfx_seal_keys *keys,
                   bool connector);
    /* Optional.  Sealed records refused so far (any thread). */
    uint64_t (*iface_seal_refused)(struct cfx_tp_iface *iface);
};

/* ops->ep_authorize when the transport has one; CFX_OK otherwise. */
static inline int cfx__tp_ep_authorize(const struct cfx_transport_ops *ops, struct cfx_tp_ep *ep)
{
    return ops->ep_authorize ? ops->ep_authorize(ep) : CFX_OK;
}

/* ops->mem_invalidate when the transport has one; 0 otherwise. */
static inline uint32_t cfx__tp_mem_invalidate(const struct cfx_transport_ops *ops,
                                              struct cfx_tp_iface *iface, const void *addr,
                                              size_t len)
{
    return ops->mem_invalidate ? ops->mem_invalidate(iface, addr, len) : 0;
}

/* ops->ep_batch when the transport has one; CFX_ERR_UNSUPPORTED otherwise
 * (posting unbatched is then just as correct). */
static inline int cfx__tp_ep_batch(const struct cfx_transport_ops *ops, struct cfx_tp_ep *ep,
                                   bool on)
{
    return ops->ep_batch ? ops->ep_batch(ep, on) : CFX_ERR_UNSUPPORTED;
}

/* Registered transports, in default preference order; NULL-terminated. */
extern const struct cfx_transport_ops *const cfx__transports[];

/* Find a transport by name; NULL if not built. */
const struct cfx_transport_ops *cfx__transport_find(const char *name);

extern const struct cfx_transport_ops cfx__tcp_ops;
extern const struct cfx_transport_ops cfx__shm_ops;
#ifdef CFX_HAVE_VERBS
extern const struct cfx_transport_ops cfx__verbs_ops;
#endif
#ifdef CFX_HAVE_DPDK
extern const struct cfx_transport_ops cfx__dpdk_ops;
#endif

#endif

/*
 * The data-plane engine: context, progress thread, local object store and
 * the receiver-driven, credit-based chunk transfer protocol.
 *
 * Threads (docs/ARCHITECTURE.md, "Which thread owns what"):
 *  - Transports are driven by whoever holds the context's progress lock
 *    (ctx->progress_lock; cfx__progress_held() says whether this thread
 *    does): the progress thread, or an API thread that got it with
 *    cfx__progress_trylock() while it posts a message or waits on one.
 *    One thread at a time, so transports stay lock-free inside.  Lock
 *    order: progress lock, then ctx->lock; ctx->lock holders only ever
 *    trylock the progress lock.  A thread that must have a transport
 *    called before it returns (a get at its deadline withdrawing its
 *    window, a failed get's release, teardown) blocks on it with no lock
 *    held (cfx__progress_lock): a holder never blocks, so that is one pass
 *    at most.  CFX_THREAD_CHECKS builds abort on a transport call from a
 *    thread that does not hold it (transport.h).
 *  - API threads call the public functions and take ctx->lock for short
 *    sections.  Work that needs a transport is done right there when the
 *    progress lock is free (a send, the commands queued before it, an
 *    arena segment's unmapping), else queued as a command (or, for an
 *    unmapping, on arena.doomed) for whoever holds it next.  A blocking
 *    p2p wait or get polls the transports itself, spinning CFX_SPIN_US at
 *    a time and napping on the transports' fds in between for up to
 *    CFX_WAITER_NAP_MS (cfx__progress_poll_wait), then sleeps on
 *    ctx->obj_cond.  (An eager receive is matched against the unexpected
 *    queue and posted right on the calling thread: memory only, eager.c.)
 *  - The progress thread does what must happen with no caller polling:
 *    serving uploads, partial copies, accepting connections, commands.  It
 *    polls while work is in flight, stands aside while an API thread polls
 *    (ctx->pollers), then sleeps on an epoll set of the ifaces' wait fds
 *    and a command eventfd.
 *  - The coordinator client's thread reports dead nodes (queued as commands).
 * ctx->lock protects the store, the transfer tables, connections, commands.
 */
#ifndef CFX_ENGINE_H
#define CFX_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <conflux/conflux.h>

#include "control/client.h"
#include "control/seal.h"
#include "dataplane/common/intr.h"
#include "dataplane/common/list.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/transport.h"

#define CFX_MAX_TPS        4         /* transports open at once */
#define CFX_GET_SOURCES_DEFAULT 4    /* CFX_GET_SOURCES: sources of a striped get */
#define CFX_GET_SOURCES_MAX     8    /* its cap (CFX_PROTO_SOURCES_MAX) */
#define CFX_WINDOW_MAX          (1u << 31) /* CFX_WINDOW's bound (2G; 32-bit field) */
#define CFX_CONN_AUTH_MS   10000     /* an accepted connection proves the token within this */
#define CFX_CONN_REDIALS   8         /* a connection closed before auth is dialled again */
#define CFX_XFER_SLOTS     4096      /* incoming transfers in flight per node */
#define CFX_CONN_ABANDONED_MAX 64    /* transfers from one peer left at their deadline, CANCEL
                                        unanswered: at this many its connection is closed */
#define CFX_PEER_BYTES_MAX 64 /* (peer, transport) pairs whose traffic a context counts apart */
#define CFX_IMM_SLOT_SHIFT 20        /* imm = slot << 20 | chunk */
#define CFX_IMM_CHUNK_MASK ((1u << CFX_IMM_SLOT_SHIFT) - 1)
#define CFX_MAX_CHUNKS     (1u << CFX_IMM_SLOT_SHIFT)
#define CFX_STORE_BUCKETS  1024
#define CFX_CHUNK_MIN      CFX_CHUNK_SIZE_MIN
#define CFX_CHUNK_MAX      CFX_CHUNK_SIZE_MAX
#define CFX_XFER_SIZE_MAX  (1ull << 46) /* largest object or message: ~CFX_MAX_CHUNKS of
                                           CFX_CHUNK_MAX bytes (64 TiB) */

/* ---- data-plane control messages (sent with ep_send) --------------------- */

#define CFX_DP_MAGIC   0xCF1Du
#define CFX_DP_VERSION 11        /* 2: HELLO nonce, AUTH; 3: eager messages; 4: explicit
                                    little-endian layout; 5: the connector proves the token
                                    first; 6: CFX_SECURE in HELLO and AUTH; 7: end_chunk in
                                    GET_REQ; 8: striped REDUCE_TASKs; 9: a group's news that
                                    a rank gave a call up; 10: eager pieces of 16-64 KiB on
                                    one host; 11: CANCEL_UNSEEN and CANCEL_DONE (p2p.c) */
#define CFX_DP_NONCE_LEN 32
#define CFX_DP_MAC_LEN   32

enum cfx_dp_type {
    CFX_DP_HELLO = 1,   /* first message on a connection: who I am */
    CFX_DP_GET_REQ,     /* receiver -> source: serve chunks into my window */
    CFX_DP_GET_NACK,    /* source -> receiver: cannot serve (status) */
    CFX_DP_CREDIT,      /* receiver -> source: more chunk credits */
    CFX_DP_CANCEL,      /* receiver -> source: stop, I withdraw the window */
    CFX_DP_CANCEL_ACK,  /* source -> receiver: no more writes for the slot */
    CFX_DP_AUTH,        /* handshake: acceptor's nonce, connector's MAC, acceptor's MAC */
    CFX_DP_REDUCE_TASK, /* reduce driver -> node: produce a partial reduction */
    CFX_DP_REDUCE_DONE, /* node producing the result -> driver: finished (status) */
    CFX_DP_REDUCE_ABORT,/* driver -> node: give up a task (the driver re-plans) */
    CFX_DP_REDUCE_LOST, /* node -> driver: a child stream died (node_id); task goes on */
    CFX_DP_REDUCE_ADOPT,/* driver -> node: read these streams in place of a lost one */
    CFX_DP_P2P_EAGER,   /* sender -> receiver: a whole small message (eager.c) */
    CFX_DP_EAGER_CREDIT,/* receiver -> sender: eager messages consumed, send more */
    CFX_DP_GET_DATA,    /* source -> receiver: a whole small object, answering a GET_REQ
                           flagged CFX_DP_GET_SMALL */
    CFX_DP_CANCEL_UNSEEN,/* as CANCEL, from a p2p receive none of whose message landed */
    CFX_DP_CANCEL_DONE, /* receiver -> source, after a p2p receive's CANCEL_ACK: CFX_OK (the
                           message landed whole: taken) or not (struct cfx_dp_nack) */
    CFX_DP_TYPE_MAX
};

struct cfx_dp_hdr {
    uint16_t magic;
    uint8_t version;
    uint8_t type;
    uint32_t slot;      /* receiver's transfer slot (GET_REQ..CANCEL_ACK) */
};

struct cfx_dp_hello {
    struct cfx_dp_hdr hdr;
    uint32_t node_id;
    uint8_t nonce[CFX_DP_NONCE_LEN]; /* connector's fresh nonce (conn_auth.c) */
    uint32_t secure;                 /* connector's CFX_SECURE (enum cfx_seal_mode) */
};

/* Cluster-token handshake (conn_auth.c): acceptor -> connector with the
 * acceptor's nonce alone (the challenge), connector -> acceptor with its MAC,
 * then acceptor -> connector with its MAC (the proof). */
struct cfx_dp_auth {
    struct cfx_dp_hdr hdr;
    uint8_t nonce[CFX_DP_NONCE_LEN]; /* acceptor's nonce (echoed in the later two) */
    uint8_t mac[CFX_DP_MAC_LEN];     /* HMAC-SHA256 over both nonces and both node ids;
                                        zero in the challenge */
    uint32_t eager_max;              /* acceptor's proof: largest eager payload it takes
                                        (eager.c); 0 in the other two */
    uint32_t eager_credits;          /* acceptor's: eager messages the connector may have
                                        unconsumed here (0 from the connector) */
    uint32_t secure;                 /* sender's CFX_SECURE (enum cfx_seal_mode); under
                                        the MACs */
};

/* An eager point-to-point message: match information and the payload, in
 * one ep_send (eager.c).  Variable length: sizeof + len bytes. */
struct cfx_dp_eager {
    struct cfx_dp_hdr hdr;      /* slot 0 */
    uint64_t chan;
    uint32_t tag;
    uint32_t len;               /* payload bytes that follow */
    uint8_t data[];
};

/* Largest eager payload any transport carries in one ep_send. */
#define CFX_EAGER_LIMIT   (CFX_TP_SEND_MAX - (uint32_t)sizeof(struct cfx_dp_eager))
#define CFX_EAGER_CREDITS 64    /* eager messages granted per connection (its unexpected-
                                   queue bound; closed ones' entries: eager.c orphans_cap) */
#define CFX_EAGER_URGENT  4     /* ... of which ordinary sends leave this many to urgent ones
                                   (cfx__p2p_isend_urgent), which data the peer does not
                                   receive must not hold up (eager.c, "Credits") */

/* A whole small object in one message, in place of the chunk write: the
 * answer to a GET_REQ flagged CFX_DP_GET_SMALL (xfer.c).  Variable length:
 * sizeof + len bytes.  The receiver checks id and len against its request. */
struct cfx_dp_get_data {
    struct cfx_dp_hdr hdr;      /* receiver's slot */
    uint8_t id[CFX_OBJECT_ID_LEN];
    uint32_t len;               /* the object's size: bytes that follow */
    uint8_t data[];
};

/* Largest object that travels as one GET_DATA message. */
#define CFX_DP_GET_SMALL_MAX (CFX_TP_SEND_MAX - (uint32_t)sizeof(struct cfx_dp_get_data))

struct cfx_dp_get_req {
    struct cfx_dp_hdr hdr;
    uint8_t id[CFX_OBJECT_ID_LEN];
    uint64_t size;          /* object size the receiver expects */
    uint32_t chunk_size;
    uint32_t first_chunk;   /* resume point */
    uint32_t credits;       /* initial window, in chunks */
    uint32_t flags;         /* CFX_DP_GET_P2P: match a posted send, not an object */
    uint64_t chan;          /* P2P: channel (e.g. a group) */
    uint32_t tag;           /* P2P: tag within the channel */
    uint32_t ring;          /* RING: slots of the receiver's scratch ring */
    uint32_t end_chunk;     /* serve [first_chunk, end_chunk) only; 0: to the last chunk
                               (a striped get asks several holders for disjoint ranges) */
    struct cfx_tp_rdesc rdesc; /* receiver's destination */
};

#define CFX_DP_GET_P2P  1u /* match a posted send, not an object */
#define CFX_DP_GET_RING 2u /* chunk i goes to slot i % ring of the destination */
#define CFX_DP_GET_WAIT 4u /* the object is about to appear here: wait for it */
#define CFX_DP_GET_CACHED 8u /* the getter took this holder from its location cache, not
                                from the directory: serve only the putter's own copy
                                (loccache.c); NOT_FOUND otherwise */
#define CFX_DP_GET_SMALL 16u /* answer with GET_DATA (size <= CFX_DP_GET_SMALL_MAX, one chunk,
                                a complete copy): no window, rdesc unused */
#define CFX_DP_GET_FLAGS (CFX_DP_GET_P2P | CFX_DP_GET_RING | CFX_DP_GET_WAIT | \
                          CFX_DP_GET_CACHED | CFX_DP_GET_SMALL)

/* A node record in a data-plane message: every address a node has
 * (CFX_NODE_ADDRS_MAX, as in the directory's records); on the wire only
 * the bytes used (dp_msg.c). */
struct cfx_dp_node {
    uint32_t node_id;
    uint8_t naddr;
    uint8_t pad[3];
    char host_id[CFX_HOST_ID_MAX];
    struct cfx_node_addr addr[CFX_NODE_ADDRS_MAX];
};

#define CFX_RTASK_MAX_CHILDREN 7   /* child streams named in one message */
#define CFX_RTASK_MAX_SLOTS    32  /* child streams of a task, adopted ones included */
#define CFX_RTASK_FINAL 1u
#define CFX_RTASK_EARLY 2u
#define CFX_RTASK_REPAIR 4u        /* a child lost to a dead peer is reported, not fatal:
                                      the driver sends REDUCE_ADOPT to route around it */
#define CFX_RTASK_GATHER 8u        /* no reduction: the output (the whole result) is
                                      gathered from the children, child c's stream
                                      landing in stripe c (cfx__stripe_first): a child
                                      named by the output's own id is stripe c of
                                      that node's gather, read as it lands there;
                                      kept, unannounced, until the driver's end */
#define CFX_RTASK_FLAGS (CFX_RTASK_FINAL | CFX_RTASK_EARLY | CFX_RTASK_REPAIR | \
                         CFX_RTASK_GATHER)
/* REDUCE_ABORT status: the reduce succeeded; a finished gather keeps its output
 * as the result (FINAL: this node is its putter; else a copy of `putter`'s) */
#define CFX_RTASK_KEEP 1

/* Reduce task: out = input op child_1 op ... op child_n, chunk by chunk. */
struct cfx_dp_reduce_task {
    struct cfx_dp_hdr hdr;
    uint64_t task;              /* driver's id for the whole reduce */
    uint8_t input[CFX_OBJECT_ID_LEN];  /* held complete by the receiving node */
    uint8_t output[CFX_OBJECT_ID_LEN]; /* produced here, read by the parent */
    uint64_t size;
    uint32_t chunk_size;
    uint32_t timeout_ms;
    uint8_t dtype;
    uint8_t op;
    uint8_t nchildren;
    uint8_t final;              /* CFX_RTASK_FINAL: the output is the result (announce it,
                                   report DONE); CFX_RTASK_EARLY: announce it at once,
                                   so getters stream it while it is produced;
                                   CFX_RTASK_GATHER: see above */
    uint64_t offset;            /* bytes of the input before the range reduced (a
                                   stripe; a multiple of chunk_size); 0 for a gather */
    uint32_t putter;            /* a gather without FINAL: the node whose gather puts
                                   the result (its copy is a copy of that put) */
    uint8_t stripes;            /* a gather: stripes of the result, 1..CFX_RTASK_MAX_SLOTS;
                                   those past the children named here come in
                                   REDUCE_ADOPT messages (`replaces` unused), and the
                                   gather starts once it has them all; else 0 */
    uint8_t child_obj[CFX_RTASK_MAX_CHILDREN][CFX_OBJECT_ID_LEN];
    struct cfx_dp_node child[CFX_RTASK_MAX_CHILDREN];
};

struct cfx_dp_reduce_done {
    struct cfx_dp_hdr hdr;
    uint64_t task;
    int32_t status;
    uint32_t node_id;           /* node that failed (or produced the result) */
};

/* Route around a lost child: the receiving task reads each child[i]'s
 * object child_obj[i] from the chunk where its stream of replaces[i] (the
 * object of the lost child) stopped, in place of that stream. */
struct cfx_dp_reduce_adopt {
    struct cfx_dp_hdr hdr;
    uint64_t task;
    uint8_t n;                  /* 1..CFX_RTASK_MAX_CHILDREN entries */
    uint8_t last;               /* 1: the last message of this reroute (0 or 1) */
    uint8_t pad[6];
    uint8_t replaces[CFX_RTASK_MAX_CHILDREN][CFX_OBJECT_ID_LEN];
    uint8_t child_obj[CFX_RTASK_MAX_CHILDREN][CFX_OBJECT_ID_LEN];
    struct cfx_dp_node child[CFX_RTASK_MAX_CHILDREN];
};

struct cfx_dp_nack {
    struct cfx_dp_hdr hdr;
    int32_t status;
};

struct cfx_dp_credit {
    struct cfx_dp_hdr hdr;
    uint32_t credits;
};

/* Wire sizes of the messages (dp_msg.c has the layout): the fixed part of
 * REDUCE_TASK, REDUCE_ADOPT, P2P_EAGER and GET_DATA, all of the others. */
#define CFX_DP_WIRE_HDR          8
#define CFX_DP_WIRE_HELLO        48
#define CFX_DP_WIRE_AUTH         84
#define CFX_DP_WIRE_GET_REQ      121
#define CFX_DP_WIRE_NACK         12
#define CFX_DP_WIRE_CREDIT       12
#define CFX_DP_WIRE_REDUCE_DONE  24
#define CFX_DP_WIRE_REDUCE_TASK  89
#define CFX_DP_WIRE_REDUCE_ADOPT 18
#define CFX_DP_WIRE_EAGER        24
#define CFX_DP_WIRE_GET_DATA     32

/* Any data-plane message in host form, with room for the payload of an
 * eager or GET_DATA message. */
union cfx_dp_msg {
    struct cfx_dp_hdr hdr;
    struct cfx_dp_hello hello;
    struct cfx_dp_auth auth;
    struct cfx_dp_get_req get_req;
    struct cfx_dp_nack nack;
    struct cfx_dp_credit credit;
    struct cfx_dp_reduce_task reduce_task;
    struct cfx_dp_reduce_done reduce_done;
    struct cfx_dp_reduce_adopt reduce_adopt;
    struct cfx_dp_eager eager;
    struct cfx_dp_get_data get_data;
    uint8_t raw[CFX_TP_SEND_MAX + 64];
};

/* Encode the host-form message @p msg (@p len bytes: its struct, plus the
 * payload of an eager or GET_DATA message) into @p out: its wire length,
 * or CFX_ERR_TOO_BIG (does not fit @p cap) / CFX_ERR_INVALID (not a
 * message an encoder can write). */
int cfx__dp_msg_encode(const void *msg, size_t len, void *out, size_t cap);
/* Decode and validate the wire bytes of a received message into @p out
 * (host form; its length in *out_len): its type, or CFX_ERR_PROTO. */
int cfx__dp_msg_decode(const void *buf, size_t len, union cfx_dp_msg *out, size_t *out_len);
/* cfx__dp_msg_decode into a scratch message: the type, or CFX_ERR_PROTO. */
int cfx__dp_msg_check(const void *buf, size_t len);

/* ---- local object store -------------------------------------------------- */

struct cfx_obj {
    struct cfx_object_id id;
    uint64_t size;
    uint32_t chunk_size;
    uint32_t nchunks;
    void *buf;
    enum cfx_memtype memtype;
    bool arena;                 /* buf came from the arena and is ours to free */
    bool lent;                  /* ... and the caller holds it too (cfx_get_alloc): freed
                                   by whichever lets go last, its cfx_buf_free() or the
                                   entry's release; a delete leaves it the caller's */
    bool heap;                  /* buf is the engine's malloc'd copy (an inline object got
                                   by cfx_get, a detached send), freed with the entry */
    int shm_fd;                 /* arena segment fd (-1 otherwise) */
    uint64_t shm_off;
    struct cfx_tp_mr *mr[CFX_MAX_TPS]; /* lazily registered per transport */
    bool complete;
    bool deleting;              /* withdrawn: serve no new uploads */
    bool announced;             /* known to the directory */
    bool owned;                 /* put here (cfx_put, a reduce result): this node is its putter */
    bool putting;               /* its cfx_put awaits the directory: no object yet, for gets
                                   and deletes here (it may be refused, CFX_ERR_EXISTS) */
    bool releasing;             /* being freed once uploads drain */
    bool ephemeral;             /* reduce intermediate: freed by its task */
    bool unrecorded;            /* a copy got from a cached location: the directory does not
                                   know it, so it is never told when the object goes; it
                                   answers no get (the next get fetches again) */
    bool withdrawn;             /* a copy whose object the directory withdrew while it was
                                   being got: the get keeps the bytes, the store drops it */
    bool loc_src;               /* being got from a cached location: no directory record
                                   of this node stands for it */
    uint32_t ready_chunks;      /* contiguous prefix received */
    bool watched;               /* its getter handles the prefix as it grows: wake it */
    bool serve_landed;          /* a gather's output, whose stripes fill side by side:
                                   uploads serve any chunk landed, not only the prefix */
    uint64_t *bitmap;           /* received chunks (partial copies) */
    struct cfx_list uploads;    /* struct cfx_upload.obj_link */
    struct cfx_xfer_in *in;     /* active incoming transfer, if any */
    unsigned refs;              /* reduce tasks reading it as their input */
    struct cfx_obj *hnext;      /* hash chain */
    uint64_t seq;               /* insertion order in the store: tells entries of one id apart */
    bool reannouncing;          /* its re-announce is being sent: a delete waits for it */
    uint32_t putter_node;       /* a got copy: the node that put it (0 unknown) */
    uint64_t put_tag;           /* ... and its mark of that put (the directory's tag) */

    /* point-to-point messages (p2p.c) are anonymous objects, not in the store */
    uint8_t p2p;                /* 0, CFX_P2P_SEND or CFX_P2P_RECV */
    uint32_t peer_node;
    uint64_t chan;
    uint32_t tag;
    int p2p_status;             /* send: CFX_ERR_AGAIN until done (cfx__status_set) */
    struct cfx_list p2p_link;   /* ctx->p2p_sends while unmatched; conn->eager_q/uq while a
                                   send waits for its connection or credits; ctx->eager_posted
                                   while an eager receive waits */
    bool eager;                 /* receive: in the eager class (eager.c) */
    bool urgent;                /* send: may use the credits kept back (CFX_EAGER_URGENT) */
    bool reoffer;               /* send: cfx__p2p_send_reoffer (a group's send) */
    uint32_t await_slot;        /* send on ctx->p2p_awaits: 1 + its withdrawn receive's slot */
    bool await_unseen;          /* ... whose CANCEL said none of it landed then */
    uint16_t eager_batch;       /* send: the first of this many eager sends that go to the
                                   peer together or not at all (cfx__p2p_isend_batch) */
};

enum { CFX_P2P_SEND = 1, CFX_P2P_RECV = 2 };

/* A receiver's request that arrived before the matching send was posted. */
struct cfx_p2p_rtr {
    struct cfx_list link;       /* ctx->p2p_rtrs, or ctx->waiting_gets */
    struct cfx_conn *conn;
    struct cfx_dp_get_req req;
    uint64_t deadline;          /* waiting_gets: NOT_FOUND after it (0: none, xfer.c) */
};

#define CFX_WITHDRAWN_KEEP 64 /* withdrawn copies remembered for their holder's delete */
#define CFX_GONE_RECENT 64    /* withdrawals a get that is about to keep a copy looks back on */

struct cfx_store {
    struct cfx_obj *buckets[CFX_STORE_BUCKETS];
    size_t count;
    uint64_t last_seq;          /* seq of the latest entry inserted */
};

struct cfx_obj *cfx__store_find(struct cfx_store *s, const struct cfx_object_id *id);
/* Remember / forget (returns whether it was there) that the directory
 * withdrew this node's copy of @p id (ctx->lock held). */
void cfx__withdrawn_add(struct cfx_context *ctx, const struct cfx_object_id *id);
bool cfx__withdrawn_take(struct cfx_context *ctx, const struct cfx_object_id *id);
void cfx__gone_note(struct cfx_context *ctx, const struct cfx_object_id *id);
bool cfx__gone_since(const struct cfx_context *ctx, const struct cfx_object_id *id, uint64_t seq);
/* This node sends the directory what may drop its record of @p id (a get's
 * OBJ_DONE without a copy, a delete): gets of the id here whose lookups the
 * record may stand for keep no copy, as after a withdrawal, for nobody
 * would tell this node when the object goes.  _begin before the message
 * (its result is for _end), _end once it is sent: it drops the copies such
 * gets kept meanwhile (ctx->lock held for both). */
uint64_t cfx__record_drop_begin(struct cfx_context *ctx, const struct cfx_object_id *id);
void cfx__record_drop_end(struct cfx_context *ctx, const struct cfx_object_id *id, uint64_t seq);
void cfx__store_insert(struct cfx_store *s, struct cfx_obj *o);
void cfx__store_remove(struct cfx_store *s, struct cfx_obj *o);
uint32_t cfx__chunk_size_for(uint64_t size, size_t configured);
/* A fresh entry of @p size bytes in chunks of @p chunk (not in the store). */
struct cfx_obj *cfx__obj_alloc(uint64_t size, uint32_t chunk);
static inline uint32_t cfx__nchunks(uint64_t size, uint32_t chunk)
{
    return (uint32_t)((size + chunk - 1) / chunk);
}
/* First chunk of stripe @p s of @p m over an object of @p nchunks chunks
 * (s = m: the end): striped reduces cut the result this way. */
static inline uint32_t cfx__stripe_first(uint32_t nchunks, uint32_t m, uint32_t s)
{
    return (uint32_t)((uint64_t)nchunks * s / m);
}

/* ---- connections ----------------------------------------------------------- */

enum cfx_conn_state {
    CFX_CONN_CONNECTING,
    CFX_CONN_READY,
    CFX_CONN_FAILED,
};

struct cfx_conn {
    struct cfx_context *ctx;
    struct cfx_tp_ep *ep;
    int tp;                     /* index into ctx->tp[] */
    uint32_t node_id;           /* 0 until HELLO on accepted connections */
    uint32_t self_id;           /* ctx->node_id when made: a rejoin's new id drops it (conn.c) */
    uint8_t peer_slot;          /* ctx->peer_bytes[] index + 1 of its traffic; 0: not yet */
    bool outbound;              /* we connected (used for our gets) */
    enum cfx_conn_state state;
    int status;                 /* failure status */
    struct cfx_list link;       /* ctx->conns */
    struct cfx_list pending;    /* struct cfx_pending_msg queued while connecting */
    struct cfx_list uploads;    /* struct cfx_upload.conn_link */
    unsigned p2p_rtrs;          /* its receive requests on ctx->p2p_rtrs (CFX_XFER_SLOTS at
                                   most: one per transfer slot of the peer's) */
    char name[96];              /* "node 3 (tcp 127.0.0.1:4000)" */
    struct cfx_node_rec *peer;  /* outbound: the peer's record (owned), to dial it again */
    uint32_t tps_tried;         /* outbound: ctx->tp[] indices tried (bit mask) */
    uint8_t redials;            /* outbound: dialled again, closed before auth (conn.c) */
    /* cluster-token handshake (conn_auth.c) */
    bool authed;                /* peer proved the token: serve it, flush pending */
    uint64_t auth_deadline;     /* not authed by then (ns): failed; 0 until first looked at */
    bool auth_sent;             /* acceptor: our challenge went out; connector: our MAC */
    uint8_t nonce[CFX_DP_NONCE_LEN];      /* ours */
    uint8_t peer_nonce[CFX_DP_NONCE_LEN]; /* theirs */
    /* eager messages (eager.c).  Sender side (our outbound connection): */
    bool eager_known;           /* the acceptor's AUTH told eager_max and the grant */
    uint32_t eager_max;         /* receiver's threshold: sends up to this go eager */
    uint32_t eager_credits;     /* eager messages we may still send */
    struct cfx_list eager_q;    /* struct cfx_obj.p2p_link: ordinary sends in posting order
                                   waiting for the handshake (all) or for credits (eager
                                   ones) */
    struct cfx_list eager_uq;   /* ... urgent ones (they pass the ordinary ones) */
    bool eager_unsorted;        /* a send queued before eager_max was known: the queues
                                   may hold rendezvous-class ones (the next pump posts them) */
    /* Receiver side (a peer's connection to us): */
    uint64_t eager_id;          /* names this connection in unexpected-queue entries */
    uint32_t eager_granted;     /* credits granted in our AUTH */
    uint32_t eager_held;        /* messages received, credit not yet returned */
    uint32_t eager_owed;        /* ... of which consumed: return at granted / 2 */
    /* ep_sends the transport took (CFX_OK) and has not yet reported with
     * CFX_TP_COMP_SEND: they may still sit in its user-space queue, and
     * closing the endpoint would drop them (cfx_context_destroy waits) */
    uint32_t sends_out;
    uint32_t abandoned;         /* our transfers from it abandoned at deadline, CANCEL unanswered */
};

struct cfx_pending_msg {
    struct cfx_list link;
    bool hs;                    /* handshake message: may go before authentication */
    size_t len;
    uint8_t data[];
};

/* ---- transfers -------------------------------------------------------------- */

/* Source side: one receiver's window we are writing chunks into. */
struct cfx_upload {
    struct cfx_obj *obj;
    struct cfx_conn *conn;
    uint32_t slot;              /* receiver's slot */
    uint32_t first;             /* first chunk asked for (the request's resume point) */
    uint32_t next;              /* next chunk to write */
    uint32_t end;               /* one past the last chunk to write (a striped get's
                                   range ends before nchunks) */
    uint32_t credits;           /* chunks we may still write */
    uint32_t inflight;          /* writes posted, not yet completed */
    uint32_t ring;              /* receiver's scratch ring slots (0 = linear) */
    bool canceled;              /* receiver withdrew: CANCEL_ACK once drained */
    bool unseen;                /* ... before any of it landed there (CANCEL_UNSEEN) */
    bool aborted;               /* we release the object: NACK once drained */
    bool cancel_held;           /* test hook: a CANCEL that came while stalled,
                                   taken at cfx__xfer_test_resume() */
    struct cfx_tp_rdesc rdesc;
    struct cfx_list obj_link;   /* obj->uploads */
    struct cfx_list conn_link;  /* conn->uploads */
    struct cfx_list busy_link;  /* ctx->busy_uploads (blocked on AGAIN) or
                                   ctx->paced_uploads (waiting for its rate) */
    bool busy;                  /* on one of those two lists */
    bool paced;                 /* ... the paced one */
    uint64_t next_send_ns;      /* pacing: earliest time of the next chunk */
};

/* Receiver side: chunks of an object arriving from one source. */
struct cfx_xfer_in {
    struct cfx_obj *obj;
    struct cfx_conn *conn;      /* source connection; NULL until posted */
    uint32_t slot;
    uint32_t src_node;
    uint32_t window;            /* credits granted per round */
    uint32_t owed;              /* chunks landed, credit not yet returned */
    int status;                 /* CFX_ERR_AGAIN while running (cfx__status_set) */
    bool cancel_sent;
    bool verdict;               /* a p2p receive's CANCEL: its ACK is answered (CANCEL_DONE) */
    bool cached;                /* source from the location cache: GET_REQ says so */
    bool small;                 /* may ask for the object in one GET_DATA message */
    bool wait;                  /* the source is a partial holder whose entry may not
                                   exist yet: the request says GET_WAIT */
    uint32_t end;               /* a striped get's range [first, end): 0 = to the last chunk */
    uint32_t left;              /* writes of that range still to come */
    struct cfx_tp_mr *mr;       /* a striped get's own registration of obj's buffer (one
                                   per source: a registration holds one live grant);
                                   NULL: obj->mr */
    bool abandoned;             /* a get's, left by its getter at the deadline: obj is NULL,
                                   the grant revoked; it keeps the slot until the source's
                                   answer (or the connection) ends it, then is freed */
    struct cfx_request *req;
    struct cfx_rchild *rchild;  /* chunks feed a reduce task instead of obj */
};

/* ---- object reduce (objreduce.c) ------------------------------------------- */

/* One child stream of a reduce task: its chunks land in a scratch ring and
 * are reduced into the task's output as they arrive. */
struct cfx_rchild {
    struct cfx_rtask *task;
    struct cfx_xfer_in in;      /* slot; in.obj is the scratch ring */
    struct cfx_obj *scratch;
    uint32_t ring;              /* slots in the scratch ring */
    uint32_t got;               /* chunks reduced so far (they arrive in order) */
    bool lost;                  /* its node died: stopped at chunk `got` */
    bool adopting;              /* replacements being named (ADOPT without `last`) */
    bool adopted;               /* replaced by streams the driver named */
    struct cfx_node_rec node;
    struct cfx_object_id src;   /* object read from the child */
    uint64_t size;              /* ... its size: the task's output, or one stripe of it */
    uint32_t nchunks;           /* ... in chunks */
    uint32_t base;              /* output chunk its chunk 0 lands in (a gather's stripe) */
    bool range;                 /* a gather reading its stripe out of another node's copy
                                   of the whole result: chunks [base, base + nchunks) */
};

struct cfx_rtask {
    struct cfx_list link;       /* ctx->rtasks */
    uint64_t task;
    struct cfx_conn *driver;    /* NULL when the driver is this node */
    bool driver_lost;           /* its connection failed: nobody to report to */
    uint32_t driver_node;
    struct cfx_obj *x;          /* local input (refs held) */
    struct cfx_obj *out;        /* output, in the store */
    enum cfx_dtype dtype;
    enum cfx_redop op;
    bool final;
    bool early;                 /* result announced before it is complete */
    bool repair;                /* CFX_RTASK_REPAIR: report lost children, await ADOPT */
    bool aborted;               /* the driver is done with it: free it */
    bool gather;                /* CFX_RTASK_GATHER */
    bool answer_due;            /* its result's announcement awaits the directory's answer */
    bool done_due;              /* complete: REDUCE_DONE goes once that answer is yes */
    uint32_t stripes;           /* a gather: children it reads, once all are named */
    uint32_t putter;            /* a gather: the node that puts the result */
    uint64_t in_off;            /* bytes of the input before the range reduced */
    uint8_t *count;             /* contributions reduced into each chunk */
    uint8_t *need;              /* ... that make the chunk whole (adoption changes it) */
    uint32_t nchildren;         /* slots used, lost ones included */
    struct cfx_rchild child[CFX_RTASK_MAX_SLOTS];
    uint64_t deadline;
    int status;                 /* CFX_ERR_AGAIN while running */
};

/* Driver-side wait for a reduce's result. */
struct cfx_rwait {
    struct cfx_list link;       /* ctx->rwaits */
    uint64_t task;
    int status;                 /* CFX_ERR_AGAIN until REDUCE_DONE */
    uint32_t node_id;           /* who reported */
    const uint32_t *nodes;      /* nodes whose death fails the wait at once */
    size_t nnodes;
    uint32_t lost[16];          /* repairable: nodes reported lost, for the driver */
    unsigned nlost;
    const uint32_t *tasks;      /* nodes running tasks of the plan: who may report */
    size_t ntasks;
    unsigned need;              /* DONE reports of success that finish it (0: the first) */
    unsigned nok;               /* ... received so far */
    uint8_t *done;              /* need > 1: which of `tasks` reported success */
};

void cfx__rtask_msg(struct cfx_context *ctx, struct cfx_conn *conn, const void *msg, size_t len);
void cfx__rtask_chunk(struct cfx_context *ctx, struct cfx_rchild *ch, uint32_t chunk,
                      uint32_t len);
void cfx__rtask_child_failed(struct cfx_context *ctx, struct cfx_rchild *ch, int status);
struct cfx_put_answer;
/* Progress thread: the directory's answer to a reduce result's announcement
 * (the task reports done once it is yes; a refusal fails it, or drops the
 * result kept here). */
void cfx__rtask_put_answer(struct cfx_context *ctx, const struct cfx_put_answer *a);
int cfx__rtask_poll(struct cfx_context *ctx);
void cfx__rtask_destroy_all(struct cfx_context *ctx);
void cfx__rtask_node_dead(struct cfx_context *ctx, uint32_t node_id);
void cfx__rtask_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn);

/* ---- requests --------------------------------------------------------------- */

enum cfx_req_type { CFX_REQ_PUT = 1, CFX_REQ_GET };

struct cfx_request {
    struct cfx_context *ctx;
    enum cfx_req_type type;
    int status;                 /* CFX_ERR_AGAIN while running (cfx__status_set) */
    size_t size;
    pthread_cond_t cond;        /* signalled under ctx->lock on progress */
    /* non-blocking requests run on a worker thread */
    bool freed_by_user;         /* free requested while running */
    bool started;               /* a put or get: taken off ctx->async_q by a worker; a
                                   collective: its group's thread runs it */
    bool cancel;                /* cfx_request_free() of a running get: it ends at once
                                   (its waits look, ctx->lock; cfx__req_canceled()); of a
                                   collective, or its group's destroy: cfx__coll_stop() */
    bool in_lookup;             /* the get waits for the directory: its buffer is not
                                   exposed, and nothing writes it before it looks again */
    struct cfx_list link;       /* ctx->async_q */
    struct cfx_list live;       /* ctx->reqs until freed; at the context's destroy the
                                   request is taken off and ctx set to NULL: it keeps
                                   its final status for test, wait and free */
    struct cfx_object_id id;
    void *buf;
    size_t capacity;
    struct cfx_obj_params params;
    int device;                 /* device memory: the poster's device, made the worker's; -1 */
    uint64_t queued_ns;         /* queued with all workers busy (else 0): deadline from then */
    uint64_t seq0;              /* get: the store's last_seq at submission; its entry
                                   is a later one (cfx_request_progress) */
    uint64_t seen_done;         /* get: the last progress seen of its entry, for when the */
    uint64_t seen_total;        /* entry has gone before the worker set the status */
    /* the failed operation's cfx_last_error(), taken on the thread that ran
     * it and given to whichever thread tests or waits on the request */
    char err[CFX__ERR_TEXT_MAX];
};

/* ---- commands for the progress thread ------------------------------------- */

enum cfx_cmd_type {
    CFX_CMD_GET_START = 1,  /* post a GET_REQ for obj->in */
    CFX_CMD_GET_CANCEL,     /* withdraw the window of obj->in */
    CFX_CMD_OBJ_RELEASE,    /* deregister and free an object entry */
    CFX_CMD_NODE_DEAD,      /* fail everything with a node */
    CFX_CMD_NODE_LEFT,      /* a node left in good order: group waits stop waiting for it */
    CFX_CMD_NODE_MISSED,    /* cmd->node died or left unheard: a rejoin found (progress.c) */
    CFX_CMD_P2P_SEND,       /* post a send: match a waiting receiver or queue */
    CFX_CMD_P2P_CANCEL,     /* withdraw an unfinished send */
    CFX_CMD_RTASK,          /* start or send a reduce task (cmd->msg) */
    CFX_CMD_EAGER_CREDIT,   /* return eager credits owed to peers */
    CFX_CMD_PUT_ANSWER,     /* the directory answered an async put (cmd->msg) */
};

/* CFX_CMD_PUT_ANSWER's message: on_put_answer's arguments (control/client.h). */
struct cfx_put_answer {
    struct cfx_object_id id;
    int status;
    char why[256];
};

struct cfx_cmd {
    struct cfx_list link;
    enum cfx_cmd_type type;
    struct cfx_obj *obj;
    struct cfx_node_rec node;   /* GET_START: source; NODE_MISSED: the coordinator's record */
    uint32_t node_id;           /* NODE_DEAD, _LEFT; RTASK: node to run it (0 = here) */
    void *msg;                  /* RTASK: reduce task or abort, owned by the command */
    size_t msg_len;
};

/* ---- arena ----------------------------------------------------------------- */

struct cfx_arena_seg {
    struct cfx_list link;
    void *base;
    size_t len;
    int fd;
    bool used;
    bool tainted;               /* a peer may still write into it: never reuse */
    uint64_t freed;             /* cached: when it was freed (arena.free_seq), the oldest
                                   goes first when the cache is full */
};

struct cfx_arena {
    struct cfx_list segs;
    struct cfx_list doomed;     /* segments to unmap by the next progress-lock holder
                                   (the verbs registration cache is a transport's) */
    size_t cached_bytes;        /* free segments kept for reuse */
    unsigned cached_segs;       /* ... and how many (each holds an fd) */
    uint64_t free_seq;          /* frees so far (cfx_arena_seg.freed) */
    uint64_t used_bytes;        /* bytes of segments in use (atomic: heartbeats read it) */
};

int cfx__arena_alloc(struct cfx_context *ctx, size_t size, void **out,
                     int *fd, uint64_t *off);
/* The same with ctx->lock already held (progress thread). */
int cfx__arena_alloc_locked(struct cfx_context *ctx, size_t size, void **out,
                            int *fd, uint64_t *off);
int cfx__arena_lookup(struct cfx_context *ctx, const void *p, int *fd, uint64_t *off);
void cfx__arena_free(struct cfx_context *ctx, void *p);
/* ctx->lock held: the segment holding @p may still receive a peer's direct
 * (shm) writes that nobody waits for any more; when freed it is closed and
 * unmapped instead of cached, so no later buffer shares its pages or inode. */
void cfx__arena_taint(struct cfx_context *ctx, const void *p);
void cfx__arena_destroy(struct cfx_context *ctx);
/* Progress lock and ctx->lock held: unmap the doomed segments; returns how many. */
int cfx__arena_reap(struct cfx_context *ctx);

/* ---- location cache (loccache.c) -------------------------------------------- */

/* Where an object this node got lives: the directory's answer, kept. */
struct cfx_loc {
    struct cfx_object_id id;
    uint64_t size;
    uint32_t chunk_size;
    int32_t hnext;              /* next entry in the hash chain, -1 = end */
    bool used;
    bool ref;                   /* clock: hit since the hand last passed */
    struct cfx_node_rec node;   /* the holder */
};

struct cfx_loccache {
    struct cfx_loc *e;          /* cap entries */
    int32_t *buckets;           /* nbuckets chain heads (power of two), -1 = empty */
    uint32_t cap;               /* 0: the cache is off */
    uint32_t nbuckets;
    uint32_t n;                 /* entries in use */
    uint32_t hand;              /* clock hand */
};

/* All under ctx->lock (memory only, any thread). */
int cfx__loc_init(struct cfx_loccache *lc, uint32_t cap);
void cfx__loc_fini(struct cfx_loccache *lc);
/* The cached location of @p id into @p out (a complete, non-inline source). */
bool cfx__loc_find(struct cfx_loccache *lc, const struct cfx_object_id *id,
                   struct cfx_ctl_source *out);
/* Remember @p src for @p id; returns 1 when another entry was evicted for it. */
uint64_t cfx__loc_put(struct cfx_loccache *lc, const struct cfx_object_id *id,
                      const struct cfx_ctl_source *src);
void cfx__loc_forget(struct cfx_loccache *lc, const struct cfx_object_id *id);
/* Forget every location on @p node_id; returns how many. */
unsigned cfx__loc_forget_node(struct cfx_loccache *lc, uint32_t node_id);

/* ---- the context ------------------------------------------------------------- */

struct cfx_tp_slot {
    const struct cfx_transport_ops *ops;
    struct cfx_tp_iface *iface;
    int fd;
    char addr[CFX_TP_ADDR_MAX];
    size_t addr_len;
    /* traffic, for the heartbeat's report: written only by the progress-lock
     * holder (cfx__tp_count), read by the control client's thread */
    uint64_t tx_bytes;          /* bytes handed to ep_send/ep_write and taken */
    uint64_t rx_bytes;          /* bytes of RECV and WRITE_IMM completions */
};

/* Add @p n to a traffic counter of a cfx_tp_slot (one writer: the
 * progress-lock holder; relaxed, so the heartbeat thread reads whole values). */
static inline void cfx__tp_count(uint64_t *ctr, uint64_t n)
{
    __atomic_store_n(ctr, __atomic_load_n(ctr, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

/* Set the status a request's waiter watches: a cfx_obj's p2p_status, a
 * cfx_xfer_in's or a cfx_request's status (ctx->lock held).  The waiter
 * reads it without the lock while it spins (cfx__progress_poll_wait,
 * cfx__p2p_test, cfx_request_test: acquire), so the store is atomic; a
 * plain one races with that read.  The rest of the request is read under
 * ctx->lock once the status says it ended. */
static inline void cfx__status_set(int *st, int status)
{
    __atomic_store_n(st, status, __ATOMIC_RELEASE);
}

/* Count @p n bytes sent (@p tx) or received on @p conn, for its transport
 * and for its peer (conn.c; progress lock held).  A peer's entry in
 * ctx->peer_bytes is found once per connection; before an accepted
 * connection's HELLO names the peer, or with the table full (and no entry
 * of a departed peer to take over), only the transport's count moves. */
void cfx__conn_count(struct cfx_conn *conn, bool tx, uint64_t n);

/* Node @p node_id left the cluster or died (progress-lock holder): its
 * entries in ctx->peer_bytes may go to new pairs once the table is full,
 * and its connections count for their transport only from now on. */
void cfx__conn_peer_departed(struct cfx_context *ctx, uint32_t node_id);

/* One (peer, transport) entry of ctx->peer_bytes.  A slot that changes
 * hands (a departed peer's, taken by a new pair) is written under seq as
 * a sequence lock: odd while it changes, so that the heartbeat never
 * reports the new peer with the old one's counts. */
struct cfx_peer_bytes {
    struct cfx_ctl_peer_traffic t; /* peer, transport, counts: what a heartbeat reports */
    uint32_t seq;               /* even when stable; odd while the slot changes hands */
    bool departed;              /* its peer left the cluster: the slot may be taken over
                                   (progress-lock holder only) */
};
/* Read entry @p i of ctx->peer_bytes whole (the control client's thread):
 * false while it is changing hands. */
bool cfx__peer_bytes_read(struct cfx_context *ctx, unsigned i, struct cfx_ctl_peer_traffic *out);

/* A coordinator found through the launcher's environment (bootstrap.c). */
struct cfx_boot {
    bool used;            /* coord came from MASTER_ADDR, not CFX_COORD */
    bool host;            /* this process is rank 0: it hosts the coordinator */
    int rank;             /* from rank_var */
    const char *rank_var; /* the variable the rank came from ("RANK", ...) */
    char master[64];      /* MASTER_ADDR */
    uint16_t port;        /* CFX_COORD_PORT, else MASTER_PORT+1 */
};

struct cfx_coord;
struct cfx_ps_load; /* dataplane/ps/ps_load.c */

/* Fill @p b and "MASTER_ADDR:port" into @p coord from the environment;
 * CFX_ERR_INVALID naming the variable missing or wrong. */
int cfx__boot_resolve(struct cfx_boot *b, char *coord, size_t len);
/* Rank 0: start the embedded coordinator on MASTER_ADDR (CFX_ERR_AUTH
 * without a token).  *out is the caller's, for cfx__boot_unhost(). */
int cfx__boot_host(const struct cfx_boot *b, const char *token, int secure,
                   struct cfx_coord **out);
/* Wait (at most @p timeout_ms) for the other members to leave, then stop
 * the coordinator.  NULL is a no-op. */
void cfx__boot_unhost(struct cfx_coord *coord, int timeout_ms);

/* The IPv4 address of the first interface that is up and selected by
 * @p spec (NCCL_SOCKET_IFNAME syntax: prefixes, '=' exact, '^' exclude;
 * @p exact: @p spec lists whole names only),
 * into @p ip.  CFX_ERR_INVALID naming @p var and listing the interfaces
 * there are when none is (netif.c). */
int cfx__netif_pick(const char *var, const char *spec, bool exact, char *ip, size_t len);

struct cfx_config {
    struct cfx_boot boot; /* used when CFX_COORD is not given */
    char coord[128];
    char transports[64];
    char bind_addr[64];
    char name[CFX_NODE_NAME_MAX];
    size_t chunk_size;          /* 0 = follow object size */
    size_t inline_max;          /* objects up to this go through the coordinator */
    int timeout_ms;
    uint32_t window_bytes;      /* credit window per transfer */
    uint32_t spin_us;           /* busy-poll before sleeping (progress thread and waiters) */
    uint32_t spin_adapt_us;     /* progress thread: longest spin after work came back soon */
    uint32_t waiter_nap_ms;     /* a waiter sleeps on the fds itself this long at most */
    uint32_t spin_yield;        /* a waiter's polls that find nothing between two
                                   sched_yield calls (pause instructions meanwhile) */
    uint32_t eager_max;         /* CFX_EAGER_MAX: messages up to this go eager (receiver's
                                   value rules a connection) */
    uint64_t upload_rate;       /* bytes/s per upload, 0 = unlimited */
    uint32_t get_sources;       /* CFX_GET_SOURCES: complete holders a large get pulls
                                   from at once (get_stripe.c), 1 = one */
    uint32_t loc_cache;         /* CFX_LOC_CACHE: location cache entries, 0 = off */
    int secure;                 /* CFX_SECURE: enum cfx_seal_mode of control and tcp
                                   connections (control/seal.h) */
};

#define CFX_CLOSED_CHANS 64 /* closed p2p channels remembered (struct cfx_context) */
#define CFX_CONN_FAILS_KEEP 8 /* connection failures remembered (struct cfx_context) */

struct cfx_context {
    pthread_mutex_t lock;
    uint32_t fork_gen;          /* cfx__fork_gen() at create: another is a forked child's */
    struct cfx_config cfg;
    char token[256];
    struct cfx_coord *hosted; /* the coordinator this rank 0 hosts (bootstrap.c), or NULL */
    struct cfx_ctl *ctl;
    uint32_t node_id;
    uint32_t joined_id;         /* node_id when it joined, kept across a rejoin (group.c) */
    struct cfx_node_rec self;

    struct cfx_tp_slot tp[CFX_MAX_TPS];
    int ntp;

    struct cfx_store store;
    struct cfx_loccache loc;    /* where objects asked about live (loccache.c) */
    /* ids whose copies here the directory withdrew (context.c on_obj_gone),
     * latest first out: the holder's own cfx_delete of such a copy still
     * succeeds, as when the putter left (object.c) */
    struct cfx_object_id withdrawn[CFX_WITHDRAWN_KEEP];
    unsigned nwithdrawn;        /* entries used */
    /* every withdrawal the directory sent (on_obj_gone), copy held or not:
     * a get whose lookup was answered before it keeps no copy (get.c) */
    struct cfx_object_id gone_recent[CFX_GONE_RECENT]; /* by gone_seq % CFX_GONE_RECENT */
    uint64_t gone_seq;          /* withdrawals so far */
    /* the latest connection failures (conn.c cfx__conn_fail; ctx->lock): a
     * get whose source failed names why its connection did (a refused shm
     * peer of another user, a wrong token ...), not only that it failed */
    struct cfx_conn_failure {
        uint32_t node_id;
        int status;
        uint64_t at_ns;         /* when (a get quotes only what failed during it) */
        char why[96];
    } conn_fails[CFX_CONN_FAILS_KEEP];
    unsigned conn_fails_next;
    unsigned withdrawn_next;    /* next slot to write */
    struct cfx_arena arena;
    void *dev_stream;           /* device stream of the staging path (gpu_stage.c), made on
                                   first use under lock; NULL until then */
    struct cfx_list conns;
    uint64_t conn_gen;          /* bumped whenever a connection is destroyed */
    struct cfx_list busy_uploads;
    struct cfx_list paced_uploads;
    struct cfx_list p2p_sends;  /* struct cfx_obj.p2p_link: posted, unmatched */
    struct cfx_list p2p_rtrs;   /* struct cfx_p2p_rtr: receivers waiting for a send */
    struct cfx_list p2p_awaits; /* struct cfx_obj.p2p_link: sends awaiting CANCEL_DONE */
    struct cfx_list eager_posted; /* struct cfx_obj.p2p_link: eager receives, posting order */
    struct cfx_list eager_unexp;  /* struct cfx_eager_unexp: arrived before their receive */
    /* channels closed for good (a destroyed group's): what is queued on
     * them went, and what comes later is dropped on arrival, its credit
     * given back (cfx__eager_chan_close; ctx->lock) */
    uint64_t closed_chans[CFX_CLOSED_CHANS];
    unsigned closed_next;
    uint64_t eager_conn_ids;    /* last cfx_conn.eager_id handed out */
    uint32_t eager_gone[64];    /* nodes whose connection ended (ring): a receive from one
                                   with none live fails at once (eager.c, progress.c) */
    unsigned eager_ngone;
    struct cfx_list rtasks;     /* struct cfx_rtask running here */
    struct cfx_list rwaits;     /* struct cfx_rwait: reduces this node drives */
    struct cfx_list waiting_gets; /* struct cfx_p2p_rtr: GET_REQ (WAIT) for objects
                                     a reduce task is about to produce */
    uint64_t rtask_counter;
    uint32_t dead[256];         /* nodes the coordinator reported dead (ring) */
    unsigned ndead;
    uint32_t left[256];         /* nodes it reported gone in good order (ring) */
    unsigned nleft;
    /* calls in flight, for cfx_context_destroy() (ctx->lock) */
    unsigned calls;             /* API calls between cfx__ctx_enter() and _leave() */
    bool closing;               /* destroy has begun: calls end, new ones are refused */
    pthread_cond_t calls_cond;  /* calls reached 0 while closing */
    struct cfx_list users;      /* struct cfx_ctx_user: handles on this context (users_lock
                                   in context.c, not ctx->lock) */
    /* Traffic per (peer, transport) for the heartbeat, for CFX_PEER_BYTES_MAX
     * pairs at a time (the transport totals count every byte): entries
     * filled by the progress-lock holder (cfx__conn_count), npeer_bytes
     * published after each new one; read by the control client's thread
     * (cfx__task_beat_fill).  An entry whose peer left the cluster
     * (cfx__conn_node_dead) keeps its counts until a new pair needs its
     * slot when the table is full (docs/OPERATING.md, "Metrics"). */
    struct cfx_peer_bytes peer_bytes[CFX_PEER_BYTES_MAX];
    unsigned npeer_bytes;
    unsigned npeer_departed;    /* entries marked departed (progress-lock holder only) */
    /* Parameter-server load for the heartbeat (dataplane/ps/ps_load.c): the
     * tables of the PS servers on this context, added and removed under
     * ps_load_lock, which the heartbeat only tries (a busy lock repeats
     * ps_last, the report it sent before; that is the control client's
     * thread's alone). */
    pthread_mutex_t ps_load_lock;
    struct cfx_ps_load *ps_load[CFX_CTL_PS_SERVERS_MAX];
    struct cfx_ctl_ps_report ps_last;
    struct cfx_msg_load report; /* the heartbeat's last report (the control client's thread:
                                   what ctx->lock guards is refreshed when the lock is free) */
    uint32_t report_slot;       /* transfer slot the next heartbeat's progress reports
                                   start at (the control client's thread) */
    double est_bw;              /* measured get bandwidth, bytes/s (EWMA) */
    double est_lat;             /* measured small-get latency, s (EWMA) */
    struct cfx_xfer_in *slots[CFX_XFER_SLOTS];
    uint32_t next_slot;

    /* progress thread */
    pthread_t progress;
    pthread_mutex_t progress_lock; /* held by whoever drives the transports (before ctx->lock) */
    pthread_cond_t progress_cond;  /* with ctx->lock: wakes the progress thread standing aside */
    unsigned pollers;           /* API threads polling in a wait (atomic) */
    unsigned obj_waiters;       /* threads asleep in cfx__obj_wait (ctx->lock) */
    bool aside;                 /* progress thread stands aside for a poller (ctx->lock) */
    bool paused_req;            /* tests: park the progress thread (cfx__progress_pause;
                                   ctx->lock, read atomically as a hint) */
    bool paused;                /* ... and it is parked (ctx->lock) */
    int epfd;
    int cmd_fd;                 /* eventfd */
    bool sleeping;              /* a thread in epoll_wait on epfd (ctx->lock): the progress
                                 * thread, or a waiter when waiter_napping */
    bool waiter_napping;        /* ... a waiter (cfx__progress_poll_wait; ctx->lock, read
                                 * atomically as a hint) */
    bool waiter_kicked;         /* ... and someone's pass kicked it awake (ctx->lock) */
    int sleep_nap_ms;           /* the nap the progress thread sleeps (while sleeping and not
                                 * waiter_napping; ctx->lock) */
    bool sleeper_disarmed;      /* a pass ran while the progress thread slept in epoll: its
                                 * ifaces are disarmed until re-armed (ctx->lock); the last
                                 * poller to leave re-arms them, whoever polled */
    bool waiter_polling;        /* a waiter polls on in place of a nap, one at a time
                                 * (cfx__progress_poll_wait; ctx->lock) */
    uint64_t n_served;          /* data requests served (GET_REQ; progress lock) */
    uint64_t n_waiter_naps;     /* waiters that slept on epfd themselves (ctx->lock; tests) */
    uint64_t n_waiter_polls;    /* spells of a waiter polling on in place of a nap: a
                                 * busy-polled transport had connections (ctx->lock; tests) */
    uint64_t n_kicks;           /* command eventfd writes (ctx->lock; tests) */
    uint64_t n_rearms;          /* ifaces re-armed by a leaving poller (ctx->lock; tests) */
    uint64_t n_dials;           /* outbound connections started (ctx->lock; tests) */
    uint64_t n_sends_reoffered; /* cfx__p2p_send_reoffer (ctx->lock; tests) */
    uint64_t n_sends_unasked;   /* canceled collectives' sends withdrawn unasked, without
                                 * their grace (cfx__p2p_send_unasked; ctx->lock; tests) */
    bool stop;
    struct cfx_list cmds;
    pthread_cond_t cmd_done;    /* broadcast when a command finished */
    /* Free lists of the small-message path, so that a steady stream of messages
     * does no malloc/free (ctx->lock; each bounded by CFX_FREE_LIST_MAX, emptied
     * by cfx_context_destroy) */
    struct cfx_list p2p_cache; /* p2p request blocks (p2p.c), by obj.p2p_link */
    unsigned p2p_ncached;
    struct cfx_list unexp_cache; /* struct cfx_eager_unexp of CFX_UNEXP_CACHED_LEN bytes */
    unsigned unexp_ncached;
    struct cfx_list cmd_cache; /* struct cfx_cmd */
    unsigned cmd_ncached;
    uint64_t cmd_seq_done;

    /* async workers for the non-blocking calls */
    pthread_t workers[64];      /* started while requests outnumber the idle ones (worker.c) */
    int nworkers, nidle, nqueued; /* idle: waiting for a request; queued: not taken yet */
    struct cfx_list async_q;
    struct cfx_list reqs;       /* struct cfx_request: every request not yet freed */
    unsigned req_waiters;       /* threads in cfx_request_wait() or _free() (ctx->lock) */
    pthread_cond_t async_cond;
    bool workers_stop;          /* context destroy: workers finish and exit */

    uint64_t id_counter;
    struct cfx_context_stats stats; /* under ctx->lock */
    pthread_cond_t obj_cond;    /* broadcast when an object changes state */
    struct cfx_reannounce *reannounce; /* reannounce.c; NULL until a reconnect */
    struct cfx_task_rt *tasks;  /* task.c: functions offered, runner threads */
    uint64_t reannounce_rounds; /* re-announce rounds finished (after reconnects) */
    uint64_t reduce_id_checks;  /* reduces that found their result's id free (tests wait on it) */
    uint64_t deletes_done;      /* cfx_delete calls that returned */
    bool reannounce_hold;       /* test hook CFX_REANNOUNCE_TEST_HOLD (reannounce.c) */
    bool test_cmd_nomem;        /* test hook: cfx__cmd_must() inline, as if out of memory */
    uint32_t test_stall;        /* test hook CFX_XFER_TEST_STALL: each upload stops after
                                   this many chunks (0: off; xfer.c) */
    char test_connect_break[CFX_TP_NAME_MAX]; /* test hook CFX_TEST_CONNECT_BREAK (conn.c):
                                                 connects over this transport fail */
    bool reannounce_held;       /* ... a round has its list and waits for a delete */
    bool test_hold_entry;       /* test hook (get.c): gets wait before their store entry */
    bool test_hold_put;         /* test hook (object.c): puts wait before the directory */
    bool test_put_held;         /* ... and one did */
    bool test_put_late;         /* test hook (object.c): a put the directory took waits, then
                                   fails CFX_ERR_TIMEOUT as if its answer came too late */
    bool test_entry_held;       /* ... and one did */
    uint32_t test_entry_passes; /* ... and how many held went on */
};

/* reannounce.c: after the coordinator client reconnected (a restarted
 * coordinator knows no objects), announce again every complete object this
 * node holds, from a thread of its own.  on_rejoined (the id taken) and on_reconnected
 * run on the client thread; stop joins that thread (call before cfx__ctl_close). */
void cfx__reannounce_on_rejoined(void *arg);
void cfx__reannounce_on_reconnected(void *arg);
void cfx__reannounce_stop(struct cfx_context *ctx);

/* The directory no longer has @p o (a copy this node got) as the object its
 * id names: it answers no more gets and leaves the store (ctx->lock held;
 * context.c).  Objects this node put are left alone. */
void cfx__copy_withdrawn(struct cfx_context *ctx, struct cfx_obj *o);

/*
 * Progress of a get, told on the getting thread as the object's contiguous
 * prefix grows (gpu_stage.c copies each part to the device while the rest
 * is still on the wire).
 */
struct cfx__get_watch {
    /* bytes [@p from, @p upto) of @p buf landed, and with them all of
     * [0, @p upto) is final; @p from is the previous call's @p upto (0
     * first).  Called without the context lock; a non-OK return stops the
     * calls */
    int (*landed)(void *arg, const void *buf, size_t from, size_t upto);
    void *arg;
    size_t upto; /* the last upto told (start 0) */
    int rc;      /* first failure of landed(), else CFX_OK */
};

/* cfx_get_alloc() that tells @p w of the bytes as they land from a remote
 * source; an object held here or inline arrives whole, untold: the caller
 * finishes from w->upto. */
int cfx__get_alloc_watched(struct cfx_context *ctx, const struct cfx_object_id *id,
                           void **buf_out, size_t *size_out, const struct cfx_obj_params *params,
                           struct cfx__get_watch *w);

/* context.c: cfx_context_create() with CFX_NODE_F_* flags for the member
 * record (CFX_NODE_F_OBSERVER: a tool's context, such as rdmactl ps, that
 * rdmactl nodes does not list by default). */
int cfx__context_create_flags(const struct cfx_context_params *params, uint8_t node_flags,
                              struct cfx_context **out);

/* progress.c */
int cfx__progress_start(struct cfx_context *ctx);
void cfx__progress_stop(struct cfx_context *ctx);
/* Queue a command (ctx->lock held); takes ownership of @p cmd.  Posted by
 * the progress-lock holder, it waits for that thread's next pass (no
 * wake-up); otherwise the progress thread is woken if it sleeps. */
void cfx__cmd_post(struct cfx_context *ctx, struct cfx_cmd *cmd);
/* The progress lock (see the top of this file).  trylock may be called with
 * ctx->lock held; it never blocks. */
bool cfx__progress_trylock(struct cfx_context *ctx);
/* Take the progress lock, waiting for the holder's current pass (no lock
 * held on entry; a pass never blocks, so the wait is short).  For an API
 * thread that must have a transport called before it returns. */
void cfx__progress_lock(struct cfx_context *ctx);
void cfx__progress_unlock(struct cfx_context *ctx);
/* ctx->lock held, after an API thread drove the transports: wake the
 * progress thread (asleep or standing aside) to take over what it queued. */
void cfx__progress_wake(struct cfx_context *ctx);
bool cfx__progress_held(const struct cfx_context *ctx);
/* Both locks held: run the queued commands now; returns how many. */
int cfx__progress_run_cmds(struct cfx_context *ctx);
/* Become the progress-lock holder for a transport call an API thread must
 * make itself (ctx->lock held; dropped while waiting, as the lock order
 * wants), running the commands queued so far first, as any holder does.
 * Returns whether this thread held it already, for cfx__progress_leave(),
 * which wakes the progress thread for what was queued (a CANCEL goes out
 * on its pass) and lets the lock go. */
bool cfx__progress_enter(struct cfx_context *ctx);
void cfx__progress_leave(struct cfx_context *ctx, bool was_held);
/* An API thread's poll: one pass of the progress loop if the progress lock
 * is free (neither lock held on entry).  Returns the work done, or -1 when
 * another thread drives the transports. */
int cfx__progress_drive(struct cfx_context *ctx);
/* Bracket a waiter's polling: begin before the first cfx__progress_drive,
 * handback (ctx->lock held) after the last, saying whether any drive got
 * the lock; it wakes the progress thread when it has work to take over. */
void cfx__progress_poll_begin(struct cfx_context *ctx);
void cfx__progress_handback(struct cfx_context *ctx, bool polled);
/* The same for a waiter that sleeps next on a request still running: a
 * progress thread standing aside is woken whatever else is pending, since
 * nobody else drives the transports for that request. */
void cfx__progress_handback_waiter(struct cfx_context *ctx, bool polled);
/* A non-blocking test's share of progress, as MPI_Test: one bracketed pass
 * when the progress lock is free, none when another thread drives (no lock
 * held on entry or return). */
void cfx__progress_test_pass(struct cfx_context *ctx);
/* A blocking wait's first part: drive the transports from this thread
 * while *@p st is CFX_ERR_AGAIN, spinning for up to CFX_SPIN_US at a time
 * and in between sleeping on the transports' wait fds itself (as the
 * progress thread would), for up to CFX_WAITER_NAP_MS or @p deadline_ns,
 * whichever comes first (no lock held on entry; ctx->lock held on return,
 * the polling handed back to the progress thread).  The caller then
 * confirms the status and sleeps on obj_cond. */
void cfx__progress_poll_wait(struct cfx_context *ctx, const int *st, uint64_t deadline_ns);
/* The progress thread's spin before its next sleep, after a wake-up from
 * epoll @p gap_ns after its last work whose pass @p served a data request:
 * twice the gap, within [@p spin_ns, @p adapt_ns], when the gap is below
 * @p adapt_ns (CFX_SPIN_ADAPT_US), else @p spin_ns (CFX_SPIN_US). */
uint64_t cfx__progress_spin_after(uint64_t spin_ns, uint64_t adapt_ns, uint64_t gap_ns,
                                  bool served);
/* How long the idle progress thread may sleep in epoll (ctx->lock and the
 * progress lock held): 0 while a busy-polled transport (CFX_TP_CAP_BUSY_POLL,
 * or no wait fd) has a live connection: it must not nap while packets can
 * arrive, unless that transport says it has been quiet long enough
 * (iface_quiet_ms: nothing in flight, no data lately), then what it says, at
 * most CFX_PROGRESS_NAP_SHORT_MS; CFX_PROGRESS_NAP_SHORT_MS while such a
 * transport is open without one, or paced uploads wait;
 * CFX_PROGRESS_NAP_MS otherwise (connections still connecting get looked
 * at now and then). */
#define CFX_PROGRESS_NAP_MS       100
#define CFX_PROGRESS_NAP_SHORT_MS 1
int cfx__progress_nap_ms(struct cfx_context *ctx);
/* Tests: park the progress thread (@p on) so that only API threads drive
 * the transports, or let it go again.  Returns once it is parked (any
 * thread, no lock held). */
int cfx__progress_pause(struct cfx_context *ctx, bool on);
/* Allocate (from the context's free list when it has one) and queue a
 * command about @p obj (and @p node); ctx->lock held. */
int cfx__cmd_new(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj,
                 const struct cfx_node_rec *node);
/* As cfx__cmd_new() for a command that must not be lost (a release, a
 * cancel): with no memory for it, this thread runs it at once as the
 * progress-lock holder (cfx__progress_enter: ctx->lock is dropped while it
 * waits for that lock, so the caller looks again at what it had seen). */
void cfx__cmd_must(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj);
/* As cfx__cmd_must(), and when the progress lock is free this thread runs
 * the queue itself (the command after those queued before it), as a post
 * does, instead of waking the progress thread for it: a caller that then
 * waits for the command's effect (a release) waits on no thread hop. */
void cfx__cmd_must_here(struct cfx_context *ctx, enum cfx_cmd_type type, struct cfx_obj *obj);
/* Wait on ctx->obj_cond (ctx->lock held) until woken or @p deadline
 * (CLOCK_MONOTONIC ns; UINT64_MAX = none).  False once the deadline passed. */
bool cfx__obj_wait(struct cfx_context *ctx, uint64_t deadline);
/* As cfx__obj_wait(), running the thread's interrupt check when due
 * (without ctx->lock; dataplane/common/intr.h): true also when it ran, so
 * that the caller looks at cfx__req_canceled() or its stop predicate. */
bool cfx__obj_wait_intr(struct cfx_context *ctx, uint64_t deadline);

/* xfer.c (progress-lock holder, ctx->lock held) */
void cfx__xfer_get_start(struct cfx_context *ctx, struct cfx_obj *obj,
                         const struct cfx_node_rec *src);
void cfx__xfer_get_cancel(struct cfx_context *ctx, struct cfx_obj *obj);
/* One range [first, end) of in->obj from @p src, a complete holder, into
 * in's own registration of the buffer (in->mr, made on first use: each
 * source of a striped get has its own, since a registration holds one
 * live grant).  in->status is CFX_ERR_AGAIN while it runs; returns it, or
 * the failure (the transfer is finished then). */
int cfx__xfer_stripe_start(struct cfx_context *ctx, struct cfx_xfer_in *in,
                           const struct cfx_node_rec *src, uint32_t first, uint32_t end);
/* Register in->obj's buffer as in->mr with transport @p tp. */
int cfx__xfer_stripe_mr(struct cfx_context *ctx, struct cfx_xfer_in *in, int tp);
/* Drop in->mr (no transfer of in's running). */
void cfx__xfer_stripe_mr_drop(struct cfx_context *ctx, struct cfx_xfer_in *in);
/* A get's deadline passed: withdraw obj->in's window now (CANCEL to the
 * source, grant revoked, arena behind it tainted) and detach it from obj;
 * the engine frees it when its slot is released.  False when the transfer
 * had ended already (in->status says how; the getter still owns it). */
bool cfx__xfer_get_abandon(struct cfx_context *ctx, struct cfx_xfer_in *in);
/* As cfx__xfer_get_abandon() for a transfer state its owner cannot leave
 * behind (a p2p receive's, inside its request): the engine carries on with
 * @p spare (heap, a copy of @p in), which is the engine's when true is
 * returned (freed once the source answers); a running @p in ends
 * CFX_ERR_CANCELED either way.  With @p spare NULL (out of memory) the transfer is cut off
 * in place instead: grant revoked, slot freed, false. */
bool cfx__xfer_in_abandon(struct cfx_context *ctx, struct cfx_xfer_in *in,
                          struct cfx_xfer_in *spare);
/* Test hook CFX_XFER_TEST_STALL=N: each upload of this node stops after
 * the first N chunks it was asked for, and CANCELs are held (a holder
 * that stalls mid-transfer), until resumed here (any thread, no lock
 * held): what the receivers' credits allow goes out, then the CANCELs
 * are answered.  cfx__xfer_test_stall() turns it on later (a node that first
 * replicated an object unstalled). */
void cfx__xfer_test_resume(struct cfx_context *ctx);
void cfx__xfer_test_stall(struct cfx_context *ctx, uint32_t n);
void cfx__xfer_recv(struct cfx_context *ctx, struct cfx_conn *conn,
                    const void *data, size_t len);
void cfx__xfer_write_imm(struct cfx_context *ctx, struct cfx_conn *conn,
                         uint32_t imm, uint32_t len);
void cfx__xfer_write_done(struct cfx_context *ctx, struct cfx_upload *up, int status);
int cfx__xfer_pump_busy(struct cfx_context *ctx);
void cfx__xfer_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn);
void cfx__xfer_in_finish(struct cfx_context *ctx, struct cfx_xfer_in *in, int status);
void cfx__obj_release(struct cfx_context *ctx, struct cfx_obj *obj);
/* cfx_delete() for a handle's detach (struct cfx_ctx_user), which runs once
 * the context's destroy has refused new calls: not counted as a call. */
int cfx__delete_detaching(struct cfx_context *ctx, const struct cfx_object_id *id,
                          const struct cfx_obj_params *params);

/* worker.c: requests completed by another module's thread (e.g. a group's
 * collective thread).  A new request runs (CFX_ERR_AGAIN) until completed;
 * completing one the user already freed frees it.  Any thread. */
struct cfx_request *cfx__request_new(struct cfx_context *ctx);
/* Complete @p req with @p status (a failure's detail is the calling thread's
 * cfx_last_error(): call it on the thread that ran the operation). */
void cfx__request_complete(struct cfx_request *req, int status, size_t size);
/* The context's destroy, once its workers and groups stopped: every request
 * not yet freed is let go of the context (include/conflux/context.h). */
void cfx__request_detach_all(struct cfx_context *ctx);

/* eager.c: small messages pushed whole to the receiver (see p2p.h). */
#define CFX_FREE_LIST_MAX    64  /* entries kept by each free list of a context */
#define CFX_UNEXP_CACHED_LEN 256 /* unexpected messages up to this size reuse entries */

struct cfx_eager_unexp {
    struct cfx_list link;       /* ctx->eager_unexp, arrival order */
    uint32_t node_id;           /* sender */
    uint64_t conn_id;           /* cfx_conn.eager_id it came on (credit return) */
    uint64_t chan;
    uint32_t tag;
    uint32_t len;
    uint8_t data[];
};
/* Is a message of @p len bytes eager under threshold @p max (0: none is)? */
static inline bool cfx__eager_class(uint64_t len, uint32_t max)
{
    return max && len <= max;
}
/* Progress-lock holder, ctx->lock held.  @p more: another send to the same
 * peer follows at once: queue this one and let that one send both (tcp: one
 * sendmsg); a queue left behind is sent by the next progress pass. */
void cfx__eager_send_post(struct cfx_context *ctx, struct cfx_obj *obj,
                          const struct cfx_node_rec *peer, bool more);
void cfx__eager_pump(struct cfx_conn *conn);
static inline bool cfx__eager_queued(const struct cfx_conn *c)
{
    return !cfx_list_empty(&c->eager_q) || !cfx_list_empty(&c->eager_uq);
}
void cfx__eager_msg(struct cfx_context *ctx, struct cfx_conn *conn, const void *msg, size_t len);
void cfx__eager_credit_msg(struct cfx_conn *conn, uint32_t credits);
void cfx__eager_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn);
void cfx__eager_node_dead(struct cfx_context *ctx, uint32_t node_id);
int cfx__eager_return_credits(struct cfx_context *ctx);
/* Any thread, ctx->lock held (no transport is called). */
int cfx__eager_recv_post(struct cfx_context *ctx, struct cfx_obj *obj, struct cfx_xfer_in *in);
void cfx__eager_recv_cancel(struct cfx_context *ctx, struct cfx_obj *obj, struct cfx_xfer_in *in);
/* The unexpected messages of channel @p chan, in arrival order: @p fn is
 * called on each until it returns true (then so does the scan).  Drop
 * removes the ones @p fn returns true for and gives their senders the
 * credit back; it returns how many.  For a layer that checks messages
 * nobody will receive (coll.c: strays of a call whose ranks disagreed). */
bool cfx__eager_unexp_scan(struct cfx_context *ctx, uint64_t chan,
                           bool (*fn)(void *arg, const struct cfx_eager_unexp *u), void *arg);
int cfx__eager_unexp_drop(struct cfx_context *ctx, uint64_t chan,
                          bool (*fn)(void *arg, const struct cfx_eager_unexp *u), void *arg);
/* ctx->lock held: channel @p chan is done with for good (a group's at its
 * destroy): the messages queued on it nobody will receive go, and so does
 * each later one on arrival, every sender's credit given back (held, they
 * would stall the pair's eager traffic once the grant is used up).  The
 * last CFX_CLOSED_CHANS channels are remembered.  Returns how many went. */
int cfx__eager_chan_close(struct cfx_context *ctx, uint64_t chan);
bool cfx__node_is_dead(struct cfx_context *ctx, uint32_t node_id);
/* Teardown (no progress thread any more). */
void cfx__eager_destroy_all(struct cfx_context *ctx);
/* Free the context's cached p2p request blocks (destroy, no thread left). */
void cfx__p2p_cache_destroy(struct cfx_context *ctx);

/* p2p.c (progress-lock holder, ctx->lock held) */
void cfx__p2p_send_post(struct cfx_context *ctx, struct cfx_obj *obj);
void cfx__p2p_send_cancel(struct cfx_context *ctx, struct cfx_obj *obj);
void cfx__p2p_send_reoffer(struct cfx_context *ctx, struct cfx_obj *obj);
void cfx__p2p_send_await(struct cfx_context *ctx, struct cfx_obj *obj, uint32_t slot,
                         bool unseen);
void cfx__p2p_limbo_over(struct cfx_context *ctx, const struct cfx_obj *obj);
void cfx__p2p_cancel_done(struct cfx_context *ctx, uint32_t node, uint32_t slot, int status);
void cfx__p2p_rtr(struct cfx_context *ctx, struct cfx_conn *conn,
                  const struct cfx_dp_get_req *req);
void cfx__p2p_node_dead(struct cfx_context *ctx, uint32_t node_id);
/* xfer.c: start serving @p req from @p obj on @p conn */
void cfx__xfer_upload_start(struct cfx_context *ctx, struct cfx_conn *conn,
                            struct cfx_obj *obj, const struct cfx_dp_get_req *req);
/* xfer.c: serve the GET_WAIT requests queued for @p obj, which is in the store now */
void cfx__xfer_serve_waiting(struct cfx_context *ctx, struct cfx_obj *obj);
/* xfer.c: NOT_FOUND to waiting requests past their deadline; returns how many */
int cfx__xfer_waiting_expire(struct cfx_context *ctx);
/* xfer.c: drop queued (unserved) requests of a connection; slot UINT32_MAX = all */
void cfx__xfer_forget_req(struct cfx_context *ctx, struct cfx_conn *conn, uint32_t slot);
void cfx__xfer_upload_abort(struct cfx_context *ctx, struct cfx_upload *up);
/* xfer.c: transfer slots, and chunks becoming ready in a partial object */
int cfx__xfer_slot_alloc(struct cfx_context *ctx, struct cfx_xfer_in *in);
/* Grant the peer of @p conn writes into @p mr for one transfer and pack the
 * rdesc naming the grant (a fresh random key); cfx__xfer_in_finish() revokes
 * it.  Transports without grants (verbs) pack the registration's rkey. */
int cfx__xfer_grant(struct cfx_context *ctx, struct cfx_conn *conn, struct cfx_tp_mr *mr,
                    struct cfx_tp_rdesc *out);
void cfx__obj_advance(struct cfx_context *ctx, struct cfx_obj *obj);
void cfx__dp_send_credit(struct cfx_conn *conn, uint32_t slot, uint32_t credits);

/* conn.c (progress-lock holder, ctx->lock held) */
struct cfx_conn *cfx__conn_get(struct cfx_context *ctx, const struct cfx_node_rec *node,
                               int *status);
int cfx__conn_send(struct cfx_conn *conn, const void *msg, size_t len);
void cfx__conn_fail(struct cfx_conn *conn, int status, const char *why);
/* ctx->lock held: the latest recorded failure of a connection with
 * @p node_id, or NULL. */
const struct cfx_conn_failure *cfx__conn_failure(const struct cfx_context *ctx,
                                                 uint32_t node_id);
void cfx__conn_destroy(struct cfx_conn *conn);
void cfx__conn_node_dead(struct cfx_context *ctx, uint32_t node_id);
int cfx__conn_tp_for(struct cfx_context *ctx, const struct cfx_node_rec *node);
/* @p node's address on transport @p tp (its name), or NULL when it has none. */
const struct cfx_node_addr *cfx__node_addr(const struct cfx_node_rec *node, const char *tp);
/* An outbound connection failed before it connected (@p status): connect again
 * over the next transport both sides share, its queued requests granted anew
 * over that one.  False when there is none left (the caller fails it); true
 * when it was taken care of (connecting again, or failed and freed). */
bool cfx__conn_fallback(struct cfx_conn *conn, int status);
/* Queue a handshake message ahead of everything else and flush (a failure freed it). */
int cfx__conn_send_hs(struct cfx_conn *conn, const void *msg, size_t len);
int cfx__conn_flush(struct cfx_conn *conn); /* once usable: queued messages; how many */

/* conn_auth.c (progress-lock holder, ctx->lock held): the data-plane handshake.
 * Connector: HELLO{C, Nc} -> acceptor: AUTH{Na} -> connector: AUTH{Na,
 * MAC_conn(Na,Nc,C,A)} -> acceptor checks it, is authenticated and answers
 * AUTH{Na, MAC_acc(Na,Nc,C,A), eager}; the connector is once it checked that.
 * Nothing but HELLO and AUTH is accepted on an unauthenticated connection:
 * cfx__conn_refuse() fails one (a line a second at most).  A failure ended it. */
int cfx__conn_auth_hello_out(struct cfx_conn *conn);
void cfx__conn_refuse(struct cfx_conn *conn, int status, const char *why);
void cfx__conn_auth_hello_in(struct cfx_conn *conn, const struct cfx_dp_hello *m);
void cfx__conn_auth_msg(struct cfx_conn *conn, const struct cfx_dp_auth *m);
struct cfx_tp_mr *cfx__obj_mr(struct cfx_context *ctx, struct cfx_obj *obj, int tp,
                              int *status);

/* ---- tasks (task.c) ------------------------------------------------------- */

#define CFX_TASK_FNS_MAX 64        /* functions one context may register */
#define CFX_TASK_RESERVED "cfx."   /* prefix of the library's own names (refused to users) */
#define CFX_TASK_PS_SERVER "cfx.ps.server" /* offered by parameter servers, for placement */

struct cfx_task_rt;
struct cfx_msg_task;
struct cfx_msg_load;
/* Set up the runner state (threads start with the first registration). */
int cfx__task_init(struct cfx_context *ctx);
/* Stop and join the runners (calls already drained); later EV_TASK_RUNs are dropped. */
void cfx__task_stop(struct cfx_context *ctx);
/* Free it (the coordinator client is closed: no more events). */
void cfx__task_fini(struct cfx_context *ctx);
/* Client thread: queue a task the coordinator placed here. */
void cfx__task_on_run(void *arg, const struct cfx_msg_task *t);
/* Client thread: this node's load for a heartbeat. */
void cfx__task_load_fill(void *arg, struct cfx_msg_load *out);
/* What a heartbeat carries after the load: the copies being received here
 * (cfx__task_progress_fill) and the traffic per peer (the largest
 * CFX_CTL_PEERS_MAX entries of ctx->peer_bytes). */
void cfx__task_beat_fill(void *arg, struct cfx_msg_heartbeat *hb);
/* dataplane/ps/ps_load.c: the PS part of a heartbeat (control client's
 * thread; never waits for a lock). */
void cfx__ps_load_beat(struct cfx_context *ctx, struct cfx_ctl_ps_report *out);
/* Client thread: how far copies being received here got, for a heartbeat. */
unsigned cfx__task_progress_fill(void *arg, struct cfx_ctl_progress *out, unsigned max);
/* Client thread: the coordinator restarted; a runner registers the functions again. */
void cfx__task_on_reconnected(struct cfx_context *ctx);
/* Offer @p name for placement only (never run here; registered again after
 * a coordinator restart); a second offer is CFX_OK. */
int cfx__task_offer(struct cfx_context *ctx, const char *name);
/* cfx_put() of arena buffer @p buf that the store then owns (frees with the object). */
int cfx__put_arena(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                   size_t size);

/* ---- calls in flight and handles, for cfx_context_destroy() (context.c) ----
 *
 * A blocking API call runs between cfx__ctx_enter() and cfx__ctx_leave().
 * cfx_context_destroy() first marks the context closing: waits that watch
 * it (p2p and group waits, object transfers, the coordinator's replies) end
 * at once, and cfx__ctx_enter() refuses new calls; then it waits (bounded)
 * until every call has left before it frees anything.
 */
#define CFX_DESTROY_DRAIN_MS 10000 /* how long destroy waits for calls to leave */

/* worker.c: the non-blocking request this thread runs (NULL: none), and
 * whether it was canceled (ctx->lock held): a get run for it gives up at
 * its next wake-up, withdrawing what exposes the caller's buffer. */
extern _Thread_local struct cfx_request *cfx__cur_req;
bool cfx__req_canceled(void);
/* CFX_OK and the call counted, or CFX_ERR_CANCELED (last error set, naming
 * @p what) when the context is being destroyed, or CFX_ERR_INVALID in a
 * forked child (cfx__ctx_forked()). */
int cfx__ctx_enter(struct cfx_context *ctx, const char *what);
/* Whether this process is a fork of the one that created @p ctx: its copy
 * may not be used (calls fail) nor torn down (destroys leave it). */
bool cfx__ctx_forked(const struct cfx_context *ctx);
/* The call ends with @p rc; a failure while the context is being destroyed
 * becomes CFX_ERR_CANCELED ("the context ... is being destroyed: <why>"). */
int cfx__ctx_leave(struct cfx_context *ctx, int rc);
/* cfx__ctx_leave() for a public call whose CFX_OK is its whole answer:
 * cfx_last_error() is left empty then (the object calls). */
int cfx__api_done(struct cfx_context *ctx, int rc);
/* ctx->lock held: destroy has begun (waits give up with CFX_ERR_CANCELED). */
static inline bool cfx__ctx_closing(const struct cfx_context *ctx)
{
    return ctx->closing;
}

/*
 * A handle that holds the context (a group).  Its owner attaches it at
 * creation; cfx_context_destroy() calls @p detach for each one still
 * attached once every call has left (progress thread and coordinator
 * connection still up): detach lets go of everything the handle holds in
 * the context, after which the handle's own destroy frees only its memory.
 * The owner's destroy calls cfx__ctx_user_release() first.
 */
struct cfx_ctx_user {
    struct cfx_list link;                      /* ctx->users */
    void (*detach)(struct cfx_ctx_user *u);    /* the context's side of the destroy */
    int state;                                 /* enum in context.c (users_lock) */
};

void cfx__ctx_user_attach(struct cfx_context *ctx, struct cfx_ctx_user *u,
                          void (*detach)(struct cfx_ctx_user *u));
/* The owner destroys the handle: 1 when it may still use the context for
 * that (a call is entered: end it with cfx__ctx_leave()); 0 when the
 * context is being or was destroyed and did the detach: only the handle's
 * memory is left to free (returns once the detach is done); -1 when that
 * destroy gave up on calls that did not leave (the context was left
 * allocated): the handle must be left allocated too, as they may use it. */
int cfx__ctx_user_release(struct cfx_context *ctx, struct cfx_ctx_user *u);

#endif

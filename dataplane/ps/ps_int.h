/*
 * Parameter server, internal side: the shard map, the load-distribution
 * algorithm, the message layer and the roles.
 *
 * Threads.  Each handle runs one loop thread that owns all protocol state
 * (mailboxes, blocks, requests, the scheduler).  The scheduler adds two
 * watcher threads that wait on the object directory for joining servers and
 * admin requests and hand them to the loop under ps->lock.  API calls queue
 * ops under ps->lock and wake the loop.  A new map version reaches members
 * as a MAP message from the scheduler (or a REDIRECT naming it); they fetch
 * it from the directory, where it already exists, so no wait expires.
 *
 * Messages.  Every message is a fixed-size header (struct ps_hdr) sent with
 * tag PS_TAG_HDR, followed by hdr.len payload bytes with tag PS_TAG_DATA, on
 * the receiving handle's channel.  Each handle keeps PS_HDR_AHEAD header
 * receives posted per peer and delivers a peer's messages in the order they
 * were sent (p2p matches one (peer, channel, tag) in posting order).
 */
#ifndef CFX_PS_INT_H
#define CFX_PS_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <conflux/conflux.h>
#include <conflux/ps.h>

#include "control/client.h"
#include "dataplane/common/list.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/engine/engine.h" /* struct cfx_ctx_user */
#include "dataplane/engine/p2p.h"

#define PS_MAGIC            0xCF505333u /* 2: ps_hdr.lost_base, lost_mask, held_ns; 3: a
                                           map's owner words carry lost marks */
#define PS_JOB_MAX          64
#define PS_TENSOR_NAME_MAX  48
#define PS_MAX_SERVERS      64
#define PS_MAX_WORKERS      256
#define PS_MAX_TENSORS      256
#define PS_MAX_BLOCKS       16384
#define PS_MAX_STALENESS    64
#define PS_MAP_MAX          CFX_OBJECT_INLINE_MAX
#define PS_HDR_AHEAD        4                 /* header receives posted per peer */
#define PS_TAG_HDR          1
#define PS_TAG_DATA         2
#define PS_BLOCK_DEFAULT    (4u << 20)
#define PS_BLOCK_MIN        64u
#define PS_JOIN_SLICE_MS    250               /* startup: a wait for a member's announcement
                                                 looks at deaths this often */

/* ---- shard map (ps_map.c) ---------------------------------------------------- */

enum ps_map_flags {
    PS_MAP_SHUTDOWN = 1u << 0,  /* every worker left: servers stop */
};

struct ps_tensor {
    char name[PS_TENSOR_NAME_MAX];
    uint32_t dtype;             /* enum cfx_dtype */
    uint32_t ready;             /* initial values stored: blocks may move */
    uint64_t count;             /* elements */
    uint64_t block_elems;       /* elements per block (the last may be short) */
    uint32_t first_block;       /* global id of block 0 */
    uint32_t nblocks;
};

struct ps_server_ent {
    uint32_t node_id;
    uint32_t state;             /* CFX_PS_SERVER_* */
    double ns_per_byte;         /* scheduler's estimate; 0 = unknown */
    uint32_t straggler;         /* flagged by the last decision */
};

/* Job-wide settings, fixed by server 0 and carried in every map. */
struct ps_conf {
    uint32_t consistency;       /* enum cfx_ps_consistency */
    uint32_t staleness;
    uint64_t block_size;
    struct cfx_ps_optim optim;
};

struct ps_map {
    uint32_t version;
    uint32_t flags;             /* PS_MAP_* */
    uint32_t admin_next;        /* sequence number of the next admin request */
    struct ps_conf conf;
    uint32_t nworkers;
    uint32_t worker_node[PS_MAX_WORKERS];
    uint32_t nservers;
    struct ps_server_ent server[PS_MAX_SERVERS];
    uint32_t ntensors;
    struct ps_tensor *tensors;  /* [ntensors] */
    uint32_t nblocks;
    uint16_t *owner;            /* [nblocks] server index */
    uint8_t *lost;              /* [nblocks] or NULL (none): 1 + the FAILED server a block's
                                   values were lost with (0: not lost), set by the map that
                                   moved it off that server and kept wherever it moves */
};

/* 1 + the failed server block @p b's values were lost with, or 0. */
static inline uint32_t cfx__ps_map_lost(const struct ps_map *m, uint32_t b)
{
    return m->lost && b < m->nblocks ? m->lost[b] : 0;
}

void cfx__ps_map_init(struct ps_map *m);
void cfx__ps_map_free(struct ps_map *m);
int cfx__ps_map_copy(struct ps_map *dst, const struct ps_map *src);
/* Append a tensor; its blocks go to the active servers with the fewest bytes,
 * none to a server @p gone marks (NULL: none is; [nservers], 1: its mailbox
 * failed or its node died).  @return the tensor index, or a negative status:
 * CFX_ERR_INVALID with no active server, CFX_ERR_PEER_FAILED when every
 * active one is gone. */
int cfx__ps_map_add_tensor(struct ps_map *m, const char *name, enum cfx_dtype dtype,
                           uint64_t count, const uint8_t *gone);
int cfx__ps_map_find(const struct ps_map *m, const char *name);
/* Tensor, first element and element count of global block @p b. */
int cfx__ps_map_block(const struct ps_map *m, uint32_t b, uint32_t *tensor, uint64_t *off,
                      uint64_t *elems);
uint64_t cfx__ps_map_block_bytes(const struct ps_map *m, uint32_t b);
/* Blocks and bytes server @p s owns. */
void cfx__ps_map_load(const struct ps_map *m, uint32_t s, uint32_t *blocks, uint64_t *bytes);
/* Flat little-endian encoding; encode returns the length or a negative status,
 * decode CFX_OK or CFX_ERR_PROTO with the reason (a server state this build
 * does not know, a lost mark naming no failed server, among them) as the
 * thread's error.  An owner word is the owner | lost mark << 8. */
int cfx__ps_map_encode(const struct ps_map *m, void *buf, size_t cap);
int cfx__ps_map_decode(const void *buf, size_t len, struct ps_map *m);
void cfx__ps_map_stats(const struct ps_map *m, struct cfx_ps_stats *out);

/* ---- load distribution (ps_balance.c) ------------------------------------------ */

struct ps_balance_in {
    uint32_t nservers;
    const uint32_t *state;      /* [nservers] CFX_PS_SERVER_* */
    const double *ns_per_byte;  /* [nservers] measured; 0 = unknown */
    uint32_t nblocks;
    const uint64_t *bytes;      /* [nblocks] */
    const uint8_t *movable;     /* [nblocks] 0: pinned (tensor not ready) */
    const uint8_t *gone;        /* [nservers] or NULL; 1: its mailbox failed: it takes no
                                   block (a state sent there is lost) */
    const uint8_t *lost;        /* [nblocks] or NULL; nonzero: the block's values were lost
                                   (ps_map.lost): nobody serves it, it is out of the
                                   measurement, and it moves only off a server that drains */
    const struct cfx_ps_balance *knobs;
    bool force;                 /* ignore min_gain (admin rebalance, server added) */
};

struct ps_balance_out {
    uint32_t moves;             /* blocks whose owner changed */
    double cur_max;             /* predicted time of the slowest server before */
    double new_max;             /* ... after */
    uint64_t stragglers;        /* bit s: server s flagged */
};

/* Decide a new assignment in @p owner (in/out, [nblocks]).  Blocks on servers
 * that are not ACTIVE always move (a gone active server and a FAILED one keep
 * their own, and take none).  @return CFX_OK or CFX_ERR_INVALID (no active
 * server). */
int cfx__ps_balance(const struct ps_balance_in *in, uint16_t *owner, struct ps_balance_out *out);
void cfx__ps_balance_defaults(struct cfx_ps_balance *k);
/* Whether a server in @p state serves its blocks: not gone, not FAILED.  One
 * that does not is waited for by nothing (measurements, settlements). */
bool cfx__ps_balance_serves(uint32_t state, bool gone);
/* The first server that owns blocks whose values are not lost (@p owner
 * [in->nblocks], in->lost), serves them and has no traffic measured
 * (@p measured [nservers], bytes): a decision waits for it.  -1 when there
 * is none; in->state and in->gone are read. */
int cfx__ps_balance_unmeasured(const struct ps_balance_in *in, const uint16_t *owner,
                               const double *measured);

/* ---- messages ------------------------------------------------------------------ */

enum ps_msg_type {
    PS_MSG_REQ = 1,     /* worker -> server (or forwarded server -> server) */
    PS_MSG_REPLY,       /* server -> worker */
    PS_MSG_REDIRECT,    /* server -> worker: re-send with map >= hdr.map_version */
    PS_MSG_STATE,       /* server -> server: a migrating block's state */
    PS_MSG_REGISTER,    /* worker 0 -> scheduler: payload struct ps_tensor */
    PS_MSG_READY,       /* worker 0 -> scheduler: tensor hdr.block initialized */
    PS_MSG_REPORT,      /* worker -> scheduler: payload struct ps_report_ent[] */
    PS_MSG_BYE,         /* worker -> scheduler: done; the scheduler answers in kind */
    PS_MSG_MAP,         /* scheduler -> member: map hdr.map_version is out;
                           hdr.clock: PS_NOTICE_* for the recipient */
    PS_MSG_DONE,        /* server -> scheduler: I have the map that ends my service
                           (hdr.map_version); nothing more comes from me */
    PS_MSG_LEAVE,       /* scheduler -> server: I am leaving; at the end of the job I
                           wait for your DONE, before it you have lost me */
    PS_MSG_SETTLED,     /* server -> scheduler: under map hdr.clock (a server is
                           draining) every ready block it owns is installed here */
    PS_MSG_WAITING,     /* server -> worker: request hdr.req_id has been held half the
                           job's timeout for version hdr.min_version, which waits for
                           hdr.forwarded workers' pushes, the first worker hdr.clock */
    PS_MSG_ABORT,       /* scheduler -> member, before the first map: the job does not
                           start (hdr.status); payload: why, NUL-terminated */
};

/* PS_MSG_MAP's hdr.clock. */
enum ps_notice_flags {
    PS_NOTICE_END = 1u << 0, /* this map ends the recipient's service (shutdown or retired) */
};

enum ps_req_kind {
    PS_REQ_PUSH = 1,
    PS_REQ_PULL,
    PS_REQ_PUSHPULL,
    PS_REQ_INIT,
};

struct ps_hdr {
    uint32_t magic;
    uint16_t type;          /* enum ps_msg_type */
    uint16_t kind;          /* enum ps_req_kind (REQ, REPLY) */
    uint32_t from;          /* sender's (role << 16 | index) */
    uint32_t worker;        /* worker the request belongs to */
    uint32_t block;         /* global block id (REQ, STATE); tensor (READY) */
    uint32_t map_version;   /* sender's map version */
    int32_t status;         /* REPLY; STATE: CFX_ERR_PEER_FAILED, no payload: the block's
                               values were lost with failed server forwarded - 1 */
    uint32_t forwarded;     /* REQ: hops so far; failed REPLY: 1 + the server the block's
                               state was to come from, which it did not (0: none) */
    uint64_t req_id;        /* worker's request id */
    uint64_t clock;         /* PUSH: the worker's step; REPLY: block version */
    uint64_t min_version;   /* PULL, PUSHPULL: wait until the block has this version;
                               failed REPLY: 1 + a gone worker whose push it waited for */
    uint64_t len;           /* payload bytes */
    uint64_t lost_base;     /* PUSH, PUSHPULL, PULL: bit i of lost_mask set: the worker's */
    uint64_t lost_mask;     /* push of step lost_base + i of the tensor ended with no answer
                               from some block (given up: it may have been lost there); a
                               block that has not applied it counts it as empty */
    uint64_t held_ns;       /* REPLY: how long the request waited at the server for other
                               workers' pushes (its round, or the version it asked for) */
};

struct ps_report_ent {
    uint32_t server;
    uint32_t requests;
    uint64_t busy_ns;       /* time with at least one request outstanding */
    uint64_t bytes;         /* request + reply payload of completed requests */
};

/* Admin requests and answers (ps_admin.c, ps_sched.c). */
enum ps_admin_cmd {
    PS_ADMIN_ADD = 1,
    PS_ADMIN_REMOVE,
    PS_ADMIN_REBALANCE,
    PS_ADMIN_AUTO,
};

struct ps_admin_req {
    uint32_t magic;
    uint32_t cmd;           /* enum ps_admin_cmd */
    int32_t arg;            /* server index; AUTO: on/off */
    uint32_t reserved;      /* 0 */
    uint64_t nonce;         /* the administrator's, random: echoed in the answer */
};

struct ps_admin_rep {
    uint32_t magic;
    int32_t status;
    uint32_t version;       /* map version after the command */
    uint32_t reserved;      /* 0 */
    uint64_t nonce;         /* the request's (0: a malformed request) */
    char detail[112];
};

/* ---- peers and mailboxes (ps_net.c) -------------------------------------------- */

#define PS_ID(role, idx) (((uint32_t)(role) << 16) | (uint32_t)(idx))

struct ps_rx {
    struct cfx_p2p_req *hreq;
    struct cfx_p2p_req *dreq;
    struct ps_hdr hdr;
    void *payload;          /* malloc'd, or a worker's output buffer */
    bool owned;             /* payload is ours to free */
};

struct ps_peer {
    uint32_t id;                /* PS_ID */
    struct cfx_node_rec rec;
    bool up;                    /* receives posted */
    bool closed;                /* failed or said goodbye: no more receives */
    struct ps_rx rx[PS_HDR_AHEAD]; /* ring in posting order */
    unsigned rx_head;
};

struct ps_tx {
    struct cfx_list link;
    struct cfx_p2p_req *hreq;
    struct cfx_p2p_req *dreq;
    struct ps_hdr hdr;
    void *owned;            /* payload to free when sent */
    const void *borrowed;   /* payload that is the caller's (a push's gradient) */
    uint32_t peer;          /* PS_ID, for messages */
    int hs, ds;             /* the two sends' states when reaped (poll_tx) */
};

/* The member object of (role, idx): its node id and flags. */
struct ps_member {
    uint32_t magic;
    uint32_t node_id;
    uint32_t role;
    uint32_t index;
    uint32_t standby;
};

struct ps_block;
struct ps_sched;
struct ps_worker;

struct cfx_ps {
    struct cfx_context *ctx;
    struct cfx_ctx_user user;   /* attached to ctx->users while the handle lives */
    bool attached;              /* ... once cfx_ps_create() succeeded */
    bool detaching;             /* ... its side goes now (ps_detach) */
    bool detached;              /* the context was destroyed first: its side is gone */
    uint32_t fork_gen;          /* cfx__fork_gen() at create: another is a forked child's */
    char job[PS_JOB_MAX];
    enum cfx_ps_role role;
    int index;
    uint32_t self_id;           /* PS_ID */
    int timeout_ms;
    struct cfx_ps_params params;

    int refs;                   /* the handle, and each request not freed yet (atomic):
                                   the last drop frees the lock and what is left */
    pthread_mutex_t lock;       /* API <-> loop hand-over */
    pthread_cond_t cond;        /* ops completed, maps applied, loop stopped */
    pthread_t loop_thread;
    bool loop_started;
    bool stop;                  /* threads exit */
    bool finished;              /* server: job over or retired */
    int lost_status;            /* the scheduler went before our end (ps->lock) */
    uint64_t create_dl;         /* cfx_ps_create's one deadline, for all its waits (ns) */
    uint64_t bye_dl;            /* a goodbye waits for its answer until then at most (ns; 0:
                                   its own bound): a failed create's teardown keeps its deadline */
    char lost_why[CFX__ERR_TEXT_MAX]; /* ... and the text cfx_last_error() gives for it */

    struct ps_map map;          /* loop thread's current map */
    uint32_t map_applied;       /* version visible to API threads (ps->lock) */
    uint32_t map_wanted;        /* loop: a map named to us whose fetch failed (0: none) */
    uint64_t map_retry_at;      /* ... fetched again from then, backing off */
    uint32_t map_retry_ms;
    struct cfx_ps_stats stats;  /* published by the loop (ps->lock) */

    /* peers indexed by role */
    struct ps_peer *workers[PS_MAX_WORKERS];
    struct ps_peer *servers[PS_MAX_SERVERS];
    bool worker_gone[PS_MAX_WORKERS]; /* server: its mailbox failed with no goodbye: a round
                                   that lacks its push fails (cfx__ps_server_worker_gone) */
    bool any_worker_gone;
    struct cfx_list tx;         /* struct ps_tx: sends in flight */
    unsigned tx_sweeps;         /* poll_tx calls (every PS_TX_FULL_EVERY-th sweeps all) */
    unsigned cancels;           /* requests freed while running, not yet canceled by the
                                   loop (atomic) */

    struct ps_block **blocks;   /* server: [map.nblocks] or NULL entries */
    uint64_t expire_at;         /* server: next sweep of requests held too long (ns) */
    uint32_t nblocks_cap;
    struct cfx_list orphans;    /* server: requests for blocks not here yet */
    uint16_t *owner_was;        /* server: map.owner as of the map before (where the state of
                                   a block that became ours comes from) */
    uint32_t owner_was_n;
    uint32_t owner_was_version; /* ... the version of that map */
    uint32_t delay_us;          /* test-only service delay (ps->lock) */
    bool hold_end;              /* test-only: hold the scheduler's end notice (ps_net.c) */
    bool skip_failed_maps;      /* test-only: deaf to notices of maps naming a failed server
                                   while active in them (ps.c: skips_notice) */
    uint32_t migrate_delay_ms;  /* test-only: sleep before a map's migrations (ps_server.c) */
    bool migrate_die;           /* test-only: SIGKILL itself there instead */
    char die_tensor[PS_TENSOR_NAME_MAX]; /* test-only: SIGKILL itself when a map gives it a
                                   block of this tensor before it is ready ("": never) */
    uint32_t drop_worker;       /* test-only: drop this worker's push of step drop_at - 1, */
    uint64_t drop_at;           /* once, as a hand-over that lost it would (0: none) */
    uint32_t settled_sent;      /* server: last map version reported PS_MSG_SETTLED */
    struct ps_sched *sched;     /* server 0 */
    struct ps_worker *w;        /* workers */

    struct cfx_ps_load *load;   /* server: requests and bytes per block (ps_load.c) */
    struct ps_member member;    /* our announcement (its object's buffer) */

    /* objects this handle put (the scheduler's maps and admin replies), with
     * the buffers behind them: deleted, then freed, by cfx_ps_destroy */
    struct ps_pub {
        struct cfx_object_id id;
        void *buf;
    } *pubs;
    uint32_t npubs;
};

/* Whether this process is a fork of the one that created @p ps. */
static inline bool cfx__ps_forked(const struct cfx_ps *ps)
{
    return cfx__fork_gen() != ps->fork_gen;
}

/* CFX_OK, or CFX_ERR_CANCELED (set as the thread's error) when the
 * handle's context was destroyed before it (ps.c: ps_detach). */
/* Drop a reference to @p ps (cfx_ps_destroy(), a request freed): the last
 * one frees what cfx_ps_destroy() left, the lock among it, so that a
 * request waited for on another thread while the handle is destroyed
 * still has it. */
void cfx__ps_unref(struct cfx_ps *ps);
int cfx__ps_gone(const struct cfx_ps *ps);

/* Put @p buf (@p len bytes, malloc'd) as @p id; on CFX_OK it is the
 * handle's until cfx_ps_destroy deletes the object and frees it. */
int cfx__ps_publish(struct cfx_ps *ps, const struct cfx_object_id *id, void *buf, size_t len);

/* Object names. */
void cfx__ps_obj_id(const char *job, const char *what, long a, long b,
                    struct cfx_object_id *id);
uint64_t cfx__ps_chan(const char *job, uint32_t id);
/* Peer record for @p id at @p node_id (looked up once); NULL on failure. */
struct ps_peer *cfx__ps_peer(struct cfx_ps *ps, uint32_t id, uint32_t node_id);
/* Post the peer's header receives. */
int cfx__ps_peer_up(struct cfx_ps *ps, struct ps_peer *p);
/* Withdraw the peer's receives (it left or failed). */
void cfx__ps_peer_down(struct cfx_ps *ps, struct ps_peer *p);
/* Send a header and @p len payload bytes; @p owned (may equal payload) is
 * freed once sent.  On failure @p owned is freed too. */
int cfx__ps_send(struct cfx_ps *ps, struct ps_peer *to, struct ps_hdr *hdr, const void *payload,
                 size_t len, void *owned);
/* Sends whose payload lies in [@p base, + @p len), a buffer going back to
 * its caller, stop reading it (they copy it, or end; ps_net.c). */
void cfx__ps_net_unborrow(struct cfx_ps *ps, const void *base, size_t len);
/* Poll every mailbox and the sends; returns the number of events. */
int cfx__ps_net_poll(struct cfx_ps *ps);
void cfx__ps_net_close(struct cfx_ps *ps);
/* cfx_get() of a small object into a buffer the caller may free afterwards. */
int cfx__ps_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf, size_t cap,
                size_t *size, int timeout_ms);
/* A get that timed out (cfx_last_error() @p err): the node that had put the
 * object before it went, when the directory said so (object.h) and this
 * context has heard that node declared dead; else 0.  A record of a member
 * that announced itself and died (its announcement went with it). */
uint32_t cfx__ps_went_dead(struct cfx_context *ctx, const char *err);
/* The directory's "(the id was put by node N before, and went: ...)" in a
 * get's @p err, or "". */
const char *cfx__ps_went_clause(const char *err);
/* One slice of a wait for a member's announcement @p id: cfx__ps_get for at
 * most PS_JOIN_SLICE_MS, to @p deadline (ns).  When the slice times out,
 * @p why (CFX__ERR_TEXT_MAX bytes) keeps the last text that said the record
 * went, and the return is *@p dead = cfx__ps_went_dead's node when nonzero
 * (CFX_ERR_PEER_FAILED), else CFX_ERR_TIMEOUT. */
int cfx__ps_announce_slice(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                           size_t cap, size_t *size, uint64_t deadline, char *why,
                           uint32_t *dead);
/* Which of @p n objects exist now (one directory listing, no waiting). */
int cfx__ps_probe(struct cfx_context *ctx, const struct cfx_object_id *ids, size_t n,
                  uint64_t deadline, bool *present);
/* Install map @p version (loop thread) if newer than ours. */
int cfx__ps_map_fetch(struct cfx_ps *ps, uint32_t version);
/* Loop: fetch again a map whose fetch failed, when its backoff is up (1:
 * fetched). */
int cfx__ps_map_retry(struct cfx_ps *ps);
/* Fetch map @p version into @p m, waiting up to @p timeout_ms. */
int cfx__ps_map_get(struct cfx_context *ctx, const char *job, uint32_t version, int timeout_ms,
                    struct ps_map *m);
/* The newest published map (exponential probe); CFX_ERR_TIMEOUT if none in time. */
int cfx__ps_map_latest(struct cfx_context *ctx, const char *job, int timeout_ms,
                       struct ps_map *m);
/* Wake the loop thread. */
void cfx__ps_kick(struct cfx_ps *ps);

/* ---- roles --------------------------------------------------------------------- */

/* Called by the mailbox layer: where a REPLY's payload goes (worker), NULL
 * for a scratch buffer. */
void *cfx__ps_worker_reply_buf(struct cfx_ps *ps, const struct ps_hdr *h);
void cfx__ps_deliver(struct cfx_ps *ps, struct ps_peer *from, const struct ps_hdr *h,
                     void *payload, bool owned);
/* A peer's mailbox failed. */
void cfx__ps_peer_failed(struct cfx_ps *ps, struct ps_peer *p, int status);

/* server (ps_server.c) */
int cfx__ps_server_handle(struct cfx_ps *ps, const struct ps_hdr *h, void *payload, bool owned);
void cfx__ps_server_map_changed(struct cfx_ps *ps);
int cfx__ps_server_tick(struct cfx_ps *ps);
void cfx__ps_server_free(struct cfx_ps *ps);
/* Server: server @p srv's mailbox failed: the requests held here for blocks
 * whose state was to come from it fail, naming it. */
void cfx__ps_server_peer_gone(struct cfx_ps *ps, uint32_t srv);
/* Worker @p w's mailbox failed with no goodbye (it died, or left): requests
 * held for a round (BSP) or a version (SSP) that lacks its push fail now,
 * naming it, and so do those held later (the expiry sweep), where they
 * waited for the job's deadline. */
void cfx__ps_server_worker_gone(struct cfx_ps *ps, uint32_t w);
/* Server: whether every block of a ready tensor that ps->map gives this
 * server has its state here (none is on its way). */
bool cfx__ps_server_settled(const struct cfx_ps *ps);

/* load per block for the heartbeat (ps_load.c) */
/* Server: make its table and add it to the context's reports (before the loop starts). */
int cfx__ps_load_start(struct cfx_ps *ps);
/* Remove it from the reports and free it (loop stopped); no-op without one. */
void cfx__ps_load_stop(struct cfx_ps *ps);
/* Loop thread: a request on @p block was served, @p bytes of payload both ways. */
void cfx__ps_load_count(struct cfx_ps *ps, uint32_t block, uint64_t bytes);
/* Loop thread: ps->map changed: the blocks it gives this server. */
void cfx__ps_load_owned(struct cfx_ps *ps);

/* scheduler (ps_sched.c) */
int cfx__ps_sched_create(struct cfx_ps *ps);
void cfx__ps_sched_free(struct cfx_ps *ps);
void cfx__ps_sched_handle(struct cfx_ps *ps, struct ps_peer *from, const struct ps_hdr *h,
                          void *payload);
int cfx__ps_sched_tick(struct cfx_ps *ps);
/* A worker's mailbox failed: it will not say goodbye. */
void cfx__ps_sched_worker_gone(struct cfx_ps *ps, uint32_t w);
/* A server's mailbox failed: it will not confirm its end. */
void cfx__ps_sched_server_gone(struct cfx_ps *ps, uint32_t srv, int status);
/* Whether the scheduler still waits for server @p srv's DONE (keeps its
 * mailbox open although the map retired it). */
bool cfx__ps_sched_awaits(const struct cfx_ps *ps, uint32_t srv);
/* Leave (API thread, loop running, from cfx_ps_destroy): tell the servers
 * that have not confirmed their end, and after a shutdown wait until each
 * did or failed, for at most the handle's timeout. */
void cfx__ps_sched_leave(struct cfx_ps *ps);
/* Start / stop (ps->stop set) the threads that watch for joins and admin requests. */
int cfx__ps_sched_start(struct cfx_ps *ps);
void cfx__ps_sched_stop(struct cfx_ps *ps);
/* Publish ps->map with version + 1 (loop thread). */
int cfx__ps_sched_publish(struct cfx_ps *ps);

/* worker (ps_worker.c) */
int cfx__ps_worker_create(struct cfx_ps *ps);
void cfx__ps_worker_free(struct cfx_ps *ps);
void cfx__ps_worker_handle(struct cfx_ps *ps, const struct ps_hdr *h, void *payload, bool owned);
int cfx__ps_worker_tick(struct cfx_ps *ps);
void cfx__ps_worker_map_changed(struct cfx_ps *ps);
/* Worker: say goodbye to the scheduler and wait for its answer (API thread,
 * loop running). */
void cfx__ps_worker_say_bye(struct cfx_ps *ps);
/* Worker: the scheduler answered our goodbye (loop thread). */
bool cfx__ps_worker_said_bye(const struct cfx_ps *ps);
/* Worker: fail what is still pending (loop stopped). */
void cfx__ps_worker_bye(struct cfx_ps *ps);

/* Bring peers in line with ps->map (post receives to new members). */
void cfx__ps_sync_peers(struct cfx_ps *ps);
/* ps->map changed (loop thread): peers, migrations, re-sends, end of service. */
void cfx__ps_after_map(struct cfx_ps *ps);
/* Server: the end of its service (job over, or retired) is known: finish and
 * confirm it to the scheduler (PS_MSG_DONE).  Idempotent. */
void cfx__ps_server_end(struct cfx_ps *ps);
/* The scheduler is gone before this member's end: remember why (ps->lock
 * taken here) so that waits return CFX_ERR_PEER_FAILED naming its node. */
void cfx__ps_sched_lost(struct cfx_ps *ps, const char *how);
/* The scheduler told this member, before the first map, that the job does
 * not start (PS_MSG_ABORT): create's wait ends with its @p status and @p why. */
void cfx__ps_start_aborted(struct cfx_ps *ps, int status, const char *why, size_t len);
/* ps->lock held: the status of a lost scheduler, recorded as this thread's
 * last error; CFX_OK when it is not lost. */
int cfx__ps_lost_err(struct cfx_ps *ps);
/* ps->lock held: the coordinator has been unreachable for the handle's
 * timeout: record CFX_ERR_CONNECT naming it as the lost status (waits end). */
void cfx__ps_check_coord(struct cfx_ps *ps);
/* Worker: a server's mailbox failed; its outstanding requests fail. */
void cfx__ps_worker_server_failed(struct cfx_ps *ps, uint32_t srv, int status);

#endif

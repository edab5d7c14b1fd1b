/*
 * Group collectives, internal side: the group object, the per-call
 * execution state and the schedules (one file per family of collectives).
 *
 * Every collective call becomes a struct coll_args with a sequence number
 * taken when it is posted.  Blocking calls run on the caller's thread once
 * the group's queue of non-blocking calls has drained; non-blocking calls
 * run on the group's own thread, in posting order.  So at most one
 * collective of a group runs at a time, and all ranks run them in the same
 * order.
 *
 * Wire rules (shared by every schedule):
 *  - collectives travel on the group's channel g->chan with tag = sequence
 *    number; two ranks' messages of one collective are matched in posting
 *    order, so every schedule posts the messages between one pair of ranks
 *    in the same order on both sides;
 *  - cfx_group_send/recv travel on g->chan_user with the user's tag, those
 *    of more than one eager send up to cfx__coll_split_max() as eager
 *    pieces on g->chan_split (group_split.c);
 *  - the ranks' arguments are compared (coll.c "argument check"): by
 *    default each rank's header of the call rides on the first message it
 *    sends to each peer and is compared by that peer (no message of its
 *    own); CFX_COLL_CHECK=2 exchanges the headers between all ranks, so
 *    that every rank fails in the same call.
 *
 * Threads: coll_exec is used by the thread that runs the collective only.
 */
#ifndef CFX_COLL_H
#define CFX_COLL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <conflux/conflux.h>
#include <conflux/group.h>

#include "control/client.h"
#include "dataplane/common/list.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/engine/engine.h" /* struct cfx_ctx_user */
#include "dataplane/engine/p2p.h"

#define COLL_NAME_MAX     128
#define COLL_SEG_DEFAULT  (256u * 1024) /* pipeline segment; CFX_COLL_SEG overrides */
#define COLL_SEG_MIN      (4u * 1024)
#define COLL_SEG_MAX      (1u << 30) /* past it, segment arithmetic overflowed */
#define COLL_SEG_PIPE_MIN (16u * 1024)  /* smallest segment a rooted pipeline cuts by itself */
#define COLL_WINDOW       4             /* receives posted ahead in pipelines */
#define COLL_SEND_GRACE_MS 500          /* on failure: let peers take what we sent */
#define COLL_BOUNCE_HELD  (32u << 20)   /* device calls: bytes of received bounces kept ... */
#define COLL_BOUNCE_HELD_N 64           /* ... and how many, before a sync frees them */
#define COLL_CHECK_ASK_MS 50            /* a wait this long asks the rank waited for */
#define COLL_BLAME_WAIT_MS 500          /* a message that failed with a live-looking peer: how
                                         * long to wait for the news of the cause */

/* CFX_COLL_CHECK: how the ranks' arguments are compared. */
enum coll_check {
    COLL_CHECK_OFF = 0,         /* not at all */
    COLL_CHECK_EDGES = 1,       /* along the call's own messages (default) */
    COLL_CHECK_ALL = 2,         /* all ranks' headers, every rank fails in the same call */
};

/* One rank's view of a call, as compared between ranks. */
struct coll_hdr {
    uint32_t magic;
    uint32_t seq;
    uint8_t kind;
    uint8_t dtype;
    uint8_t op;
    uint8_t algo;
    int32_t root;
    uint64_t count;
};
#define COLL_HDR_MAGIC 0xC011EC7Fu

/* Why a rank gave up a call for a reason other than a disagreement
 * (COLL_CHK_GAVE_UP), in place of coll_chk_msg.bad: what it knows of the
 * cause, about coll_chk_msg.bad_rank (-1: no rank to blame). */
struct coll_chk_fail {
    uint32_t magic;             /* COLL_FAIL_MAGIC */
    int32_t status;             /* the sender's status of the call */
    int32_t via;                /* the rank it learned the cause from; -1: itself */
    uint8_t why;                /* enum coll_why */
    uint8_t pad[11];
};
#define COLL_FAIL_MAGIC 0xC011FA11u

enum coll_why {
    COLL_WHY_OTHER = 0,         /* a failure of its own (status), no rank to blame */
    COLL_WHY_DIED,              /* bad_rank died */
    COLL_WHY_LEFT,              /* bad_rank left the cluster */
    COLL_WHY_TIMEOUT,           /* it waited for bad_rank until its deadline */
    COLL_WHY_FAILED,            /* a message with bad_rank failed (status), bad_rank not
                                 * known to have died */
    COLL_WHY_REFUSED,           /* bad_rank's own check refused its arguments (status) */
    COLL_WHY_CANCELED,          /* bad_rank canceled its call (its request freed, its group
                                 * destroyed) */
};

/* coll_chk_msg.failed */
#define COLL_CHK_DISAGREE 1u    /* found a disagreement (bad, bad_rank) or sizes that differ */
#define COLL_CHK_GAVE_UP  2u    /* failed the call for another reason (fail, bad_rank) */

/* What travels on the check channel: the sender's header and, when it
 * failed the call because the ranks disagree (failed COLL_CHK_DISAGREE),
 * the header of another opinion it saw (or bad_rank -1: message sizes that
 * disagreed, no header seen); when it gave the call up for another reason
 * (COLL_CHK_GAVE_UP: a rank died, a wait timed out), what it knows of the
 * cause.  The latter goes before the rank withdraws its messages, so a rank
 * whose message with it fails names the real cause, not the rank that gave
 * up (coll_check.c "failures"). */
struct coll_chk_msg {
    struct coll_hdr me;
    union {
        struct coll_hdr bad;
        struct coll_chk_fail fail;
    };
    int32_t bad_rank;
    uint32_t failed;
};
_Static_assert(sizeof(struct coll_chk_fail) == sizeof(struct coll_hdr),
               "the failure news fits in place of a header");

/* What a rank told the group when it gave up a call (struct cfx_group.gave). */
struct coll_gave {
    bool set;
    uint32_t seq;               /* its call */
    int32_t bad_rank;
    struct coll_chk_fail f;
};
/* First messages up to this carry the header in front, and stay eager at
 * the default CFX_EAGER_MAX; larger ones go after a header message. */
#define COLL_HDR_INLINE (CFX_EAGER_LIMIT - (uint32_t)sizeof(struct coll_hdr))
/* Messages of up to this go as eager pieces rather than by rendezvous:
 * between ranks that can share memory (cfx__coll_split_max), where a piece
 * costs a copy into the ring and one out and the rendezvous its request,
 * registration and the wake-ups of two threads per side (a 2-rank ping-pong
 * of 64 KiB: 27-33 us in pieces, 34-115 us by rendezvous), up to
 * COLL_SPLIT_MAX_SHM; elsewhere up to COLL_SPLIT_MAX, past which the pieces
 * cost more than the request's round trip (docs/PERFORMANCE_LATENCY.md). */
#define COLL_SPLIT_MAX     (16u * 1024)
#define COLL_SPLIT_MAX_SHM (64u * 1024)
/* Eager pieces one call sends one rank, at most (its messages past them go
 * by rendezvous): enough for one message of COLL_SPLIT_MAX_SHM.  Pieces wait
 * in the receiver's unexpected queue until it reaches the call, each on one
 * of the pair's CFX_EAGER_CREDITS, which every group and cfx_group_send()
 * share: a 256 KiB broadcast of four 64 KiB pieced segments took them all,
 * and another group's call, which the receiver had to finish first, waited
 * behind them until both deadlines.  Three calls at the budget leave the
 * urgent credits (CFX_EAGER_URGENT). */
#define COLL_SPLIT_BUDGET  20u

enum coll_kind {
    COLL_BARRIER = 1,
    COLL_ALLREDUCE,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_GATHER,
    COLL_SCATTER,
    COLL_ALLTOALL,
    COLL_KIND_LAST
};

/* One collective call, as posted. */
struct coll_args {
    enum coll_kind kind;
    const void *sbuf;           /* send buffer (broadcast: the buffer) */
    void *rbuf;                 /* receive buffer */
    size_t count;
    enum cfx_dtype dtype;
    enum cfx_redop op;          /* reductions only; else 0 */
    int root;                   /* rooted collectives only; else 0 */
    struct cfx_coll_params params; /* fields outside field_mask are zero */
    uint32_t seq;               /* position in the group's call order */
    struct cfx_request *req;    /* non-blocking: completed when done */
    int refused;                /* non-blocking call refused when posted (its status):
                                 * queued only to tell the others in its turn */
    int device;                 /* non-blocking on device memory: the poster's current
                                 * device, made current on the group's thread; else -1 */
    struct cfx_list link;       /* group->queue */
};

struct cfx_group {
    struct cfx_context *ctx;
    uint32_t fork_gen;          /* cfx__fork_gen() at create: another is a forked child's */
    char name[COLL_NAME_MAX];
    int rank;
    int size;
    int timeout_ms;             /* default deadline of calls */
    uint32_t epoch;             /* how many times this context created the name before */
    uint64_t chan;              /* p2p channel of collectives */
    uint64_t chan_user;         /* p2p channel of cfx_group_send/recv */
    uint64_t chan_split;        /* ... of those sent as eager pieces (group_split.c) */
    pthread_mutex_t split_lock; /* one message's pieces are posted together */
    pthread_cond_t split_cond;  /* a receive of g->split_rx posted the rest */
    struct cfx_list split_rx;   /* receives between piece 0 and the rest (group_split.c) */
    struct cfx_node_rec *nodes; /* [size]: node record of each rank */
    uint32_t *ids;              /* [size]: node id of each rank (death watch) */

    /* bootstrap objects to withdraw at destroy */
    struct cfx_object_id *held;
    int nheld;
    uint8_t stale;              /* this rank's slots a gone node's object held (bit per slot) */
    int slot;                   /* the slot this rank's own object is in */
    bool size_clash;            /* creation failed: another rank's object says another size */

    /* tuning, read once at creation */
    enum cfx_algo env_algo;     /* $CFX_ALGO, or AUTO */
    size_t seg_bytes;           /* $CFX_COLL_SEG */
    enum coll_check check;      /* $CFX_COLL_CHECK: argument check (default EDGES) */
    uint64_t chan_chk;          /* p2p channel of headers sent to every rank (EDGES) */
    uint8_t *edge_dir;          /* [size]: coll_exec.dir of the running call */
    struct coll_hdr *edge_hin;  /* [size]: coll_exec.hin of the running call */
    struct coll_chk_msg *edge_cin; /* [size]: coll_exec.cin of the running call */
    int *edge_hrx;              /* [size]: coll_exec.hrx of the running call */
    uint16_t *split_used;       /* [2 * size]: coll_exec.split_used of the running call */
    /* failures (coll_check.c "failures"): what each rank said when it gave
     * up a call, and the last call this rank failed other than by a
     * disagreement (its leftover messages are no sign of one); ctx->lock */
    struct coll_gave *gave;     /* [size] */
    int ngave;                  /* how many are set */
    bool quiet;
    uint32_t quiet_seq;

    /* scratch memory of the running collective (one runs at a time) */
    void *scratch;
    size_t scratch_len;
    void *dscratch;             /* device scratch of calls on device buffers */
    size_t dscratch_len;
    void *dstream;              /* device stream of calls that pass none; made on first use */

    /* call ordering */
    pthread_mutex_t lock;
    pthread_cond_t cond;        /* queue changed / drained */
    struct cfx_list queue;      /* struct coll_args.link: posted, not finished */
    uint32_t next_seq;
    bool thread_started;
    bool stop;
    pthread_t thread;

    /* the context's destroy may come first (context.c "handles") */
    struct cfx_ctx_user user;   /* attached to ctx->users while the group lives */
    bool orphan;                /* its context was destroyed: calls fail (lock) */

    /* the group's own destroy during calls on other threads (group.c
     * "calls in flight"): lock */
    unsigned calls;             /* public calls between group_enter() and group_leave() */
    bool closing;               /* destroy has begun: new calls fail, running ones stop
                                 * (set atomically: read under other locks and by the
                                 * calls' interruptible waits, cfx__intr_flag()) */
    pthread_cond_t calls_cond;  /* calls reached 0 while closing */
};

/* Whether the group's destroy has begun (any lock, or none). */
static inline bool cfx__group_closing(const struct cfx_group *g)
{
    return __atomic_load_n(&g->closing, __ATOMIC_ACQUIRE);
}

/* An outstanding message of the running collective. */
struct coll_msg {
    struct cfx_p2p_req *req;    /* NULL once finished */
    int peer;                   /* rank */
    bool send;
    bool hdr;                   /* an argument header (coll.c), not data */
    void *bounce;               /* device data: the host copy on the wire (arena), or NULL */
    void *dev;                  /* a receive's device destination of the bounce */
    void *wire;                 /* what the transfer reads or writes: the bounce, or the
                                 * caller's buffer (outlives the message: coll_cleanup()) */
    size_t len;
    /* EDGES check: the first message between two ranks has the header in
     * front (front), in pfx for host data, in the bounce (at off) for device
     * data */
    bool front;
    void *pfx;                  /* header + payload on the wire (malloc), or NULL */
    void *user;                 /* a host receive's destination of the payload */
    size_t off;                 /* where the payload starts in the bounce */
    bool chk;                   /* a header sent on chan_chk: advisory, never waited for */
    bool chk_in;                /* a check message received into x->cin[peer] */
    int prev_h;                 /* waited for first: the header message of its own, or the
                                 * piece before (coll.c post_split); -1 */
};

#define EDGE_SENT  1u   /* coll_exec.dir: our header went to the rank */
#define EDGE_RECVD 2u   /* a message from the rank was posted: its first carries its header */
#define EDGE_SEEN  4u   /* during a scan of the unexpected queue (coll_check.c) */
#define EDGE_ASKED 8u   /* our header went to the rank on chan_chk as a question */

/* The dissemination exchange's message (cfx__coll_agree_all()). */
struct coll_agree_msg {
    struct coll_hdr lo, hi;     /* smallest / largest header seen */
    int32_t lo_rank, hi_rank;
};

/* Execution state of one collective on one rank. */
struct coll_exec {
    struct cfx_group *g;
    const struct coll_args *a;
    const char *what;           /* "allreduce" */
    enum cfx_algo algo;         /* the schedule that runs */
    size_t esz;                 /* element size */
    enum cfx_memtype mt;
    uint64_t deadline;
    int timeout_ms;
    uint32_t tag;
    bool more;                  /* the post being made has another to the same peer right
                                 * behind it (post_split): sent together */
    uint16_t *split_used;       /* [2 * size]: eager pieces received from [2 r] and sent
                                 * to [2 r + 1] rank r so far (COLL_SPLIT_BUDGET) */
    struct coll_msg *msgs;
    int nmsgs;
    int cap;
    struct coll_agree *agree;   /* argument headers exchanged alongside the data */
    bool gate;                  /* in place, headers not all checked: cfx__coll_gate()
                                 * before the first write to the caller's buffers */

    /* EDGES check (coll.c "argument check along the messages") */
    bool edges;
    struct coll_hdr hdr;        /* this rank's header of the call */
    uint8_t *dir;               /* [size]: EDGE_SENT / EDGE_RECVD, header sent to / first
                                 * message posted from each rank */
    struct coll_hdr *hin;       /* [size]: separate headers received */
    int *hrx;                   /* [size]: the receive that carries the rank's header (msgs
                                 * index), -1: none posted */
    bool listen;                /* EDGES mode, any call: look at the check channel */
    bool asked;                 /* a message of ours went on chan_chk (chk_finish()) */
    bool told;                  /* ... to every rank, the news that we failed the call */
    struct coll_chk_msg ask, tell; /* what those messages carry */
    struct coll_chk_msg *cin;   /* [size]: check messages received (calls of count 0) */
    uint64_t ask_at;            /* a wait still running then sends it (ns) */
    bool disagree;              /* the call failed because the ranks disagree (headers, or
                                 * message sizes): its CFX_ERR_INVALID is not one of this
                                 * rank's own (a kernel refusing a buffer), which the others
                                 * hear as news that it gave the call up */
    int bad_rank;               /* a rank whose header differs, -1 */
    struct coll_hdr bad;        /* its header */
    int news_rank;              /* a rank that told us it failed the call, -1 */
    int dropped;                /* messages nobody will receive, dropped during the call */
    struct coll_chk_msg news;   /* what it said */
    /* failures other than a disagreement (coll_check.c "failures") */
    int blame_rank;             /* the rank this rank's failure is blamed on, -1 */
    uint8_t blame_why;          /* enum coll_why */
    int blame_via;              /* the rank that told us, -1 */
    int32_t blame_status;       /* its status of the call, 0: ours */
    int gave_rank;              /* a rank whose news that it gave up the call stopped a wait */
    int wait_peer;              /* the rank of the message a wait is for now, -1 */
    bool gave_told;             /* our news went to our edges (or every rank) */
    bool sched_unknown;         /* no schedule: refused arguments that name none; the news
                                 * goes to every rank */
    bool canceled;              /* a wait stopped: the call's request was canceled */
    struct coll_chk_msg gave_msg;
    struct coll_agree_msg seq_me, seq_in; /* cfx__coll_agree_all()'s round, sent and
                                 * received: withdrawn only by coll_cleanup() */
    int failed_h;               /* a wait stopped: 1 + the handle of a message of the call
                                 * that failed meanwhile (its error is the call's), 0 none */

    /* device buffers (mt != host, coll.c "device buffers") */
    void *stream;               /* where the device work goes: the caller's or the group's */
    void **held;                /* received bounces whose copy to the device may still run */
    int nheld, held_cap;
    size_t held_bytes;
};

static inline bool coll_has_op(enum coll_kind k)
{
    return k == COLL_ALLREDUCE || k == COLL_REDUCE || k == COLL_REDUCE_SCATTER;
}

static inline bool coll_has_root(enum coll_kind k)
{
    return k == COLL_BROADCAST || k == COLL_REDUCE || k == COLL_GATHER || k == COLL_SCATTER;
}

/* ---- coll.c: messages of the running collective --------------------------- */

/* Post a send / receive to @p peer; returns a handle >= 0 or a status. */
int cfx__coll_send(struct coll_exec *x, int peer, const void *buf, size_t len);
int cfx__coll_recv(struct coll_exec *x, int peer, void *buf, size_t len);
/* Wait for a handle; the message is freed.  A failure names the collective,
 * both ranks and the peer's node in cfx_last_error(). */
int cfx__coll_wait(struct coll_exec *x, int h);
/* Wait for every outstanding message. */
int cfx__coll_wait_all(struct coll_exec *x);
/* Send and receive at once, then wait for both. */
int cfx__coll_sendrecv(struct coll_exec *x, int to, const void *sbuf, size_t slen, int from,
                  void *rbuf, size_t rlen);
/* Scratch memory of at least @p len bytes, of the collective's memory type,
 * valid until the collective ends. */
int cfx__coll_scratch(struct coll_exec *x, size_t len, void **out);
/* Copy between buffers of the collective's memory type (device: queued on
 * x->stream, ordered with the messages and reductions around it). */
int cfx__coll_copy(struct coll_exec *x, void *dst, const void *src, size_t len);
/* dst = dst op src / dst = a op b over @p n elements of the call's dtype
 * (device: the device kernels, queued on x->stream). */
int cfx__coll_reduce(struct coll_exec *x, void *dst, const void *src, size_t n);
int cfx__coll_reduce3(struct coll_exec *x, void *dst, const void *a, const void *b, size_t n);
/* Before a schedule that defers the argument gate (coll.c gate_deferred())
 * first writes the caller's buffers: wait for every argument header and
 * fail, having written nothing, when the ranks disagree.  A no-op when
 * nothing is pending (out of place, or checked already). */
int cfx__coll_gate(struct coll_exec *x);
/* Pipeline segment size in elements for messages of @p bytes (>= 1). */
size_t cfx__coll_seg_elems(const struct coll_exec *x, size_t bytes);

/* Element range of block @p b when @p count elements are cut into @p n blocks
 * (the first count % n blocks are one element longer). */
static inline void coll_block(size_t count, int n, int b, size_t *off, size_t *len)
{
    size_t q = count / (size_t)n, r = count % (size_t)n;
    *off = (size_t)b * q + CFX_MIN((size_t)b, r);
    *len = q + ((size_t)b < r);
}

static inline int coll_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* ---- the schedules ----------------------------------------------------------- */

int cfx__coll_allreduce_ring(struct coll_exec *x, const void *s, void *r);
int cfx__coll_allreduce_recdbl(struct coll_exec *x, const void *s, void *r);
int cfx__coll_allreduce_rhd(struct coll_exec *x, const void *s, void *r);
int cfx__coll_allreduce_dbtree(struct coll_exec *x, const void *s, void *r);
int cfx__coll_bcast_chain(struct coll_exec *x, void *buf, int root);
int cfx__coll_bcast_tree(struct coll_exec *x, void *buf, int root);
int cfx__coll_reduce_chain(struct coll_exec *x, const void *s, void *r, int root);
int cfx__coll_reduce_tree(struct coll_exec *x, const void *s, void *r, int root);
int cfx__coll_allgather_ring(struct coll_exec *x, const void *s, void *r);
int cfx__coll_allgather_direct(struct coll_exec *x, const void *s, void *r);
int cfx__coll_reduce_scatter_ring(struct coll_exec *x, const void *s, void *r);
int cfx__coll_reduce_scatter_direct(struct coll_exec *x, const void *s, void *r);
int cfx__coll_gather_direct(struct coll_exec *x, const void *s, void *r, int root);
int cfx__coll_scatter_direct(struct coll_exec *x, const void *s, void *r, int root);
int cfx__coll_alltoall_pairwise(struct coll_exec *x, const void *s, void *r);

/* ---- the edges of a call (coll_peers.c) ---------------------------------------- */

/* Groups up to this size tell every rank that they gave a call up: at most
 * 3 messages a rank, over connections the creation's barrier and the
 * schedules mostly hold already, and the cause is named first hand. */
#define COLL_NEWS_ALL_MAX 4

/* The ranks this rank exchanges messages with in a call of @p kind with
 * schedule @p algo (its schedule's and the argument exchange's peers): set
 * in @p peer[g->size], which the caller cleared (this rank's own entry may
 * be set).  False: not known (a root out of range, an unknown kind). */
bool cfx__coll_peers(const struct cfx_group *g, enum coll_kind kind, enum cfx_algo algo, int root,
                     size_t count, bool *peer);
/* coll_rooted.c: parent and children of rank @p me in the chain (@p chain)
 * or binomial tree of @p n ranks from @p root, set in @p peer. */
void cfx__coll_tree_peers(int n, int me, int root, bool chain, bool *peer);

/* ---- tuning (coll.c) ------------------------------------------------------------ */

/* The schedule for a call: CFX_COLL_PARAM_ALGO, else $CFX_ALGO, else the
 * tuning table; a forced algorithm that does not apply falls back to the
 * table's choice. */
enum cfx_algo cfx__coll_choose(const struct cfx_group *g, enum coll_kind kind, size_t bytes,
                          enum cfx_algo forced);
const char *cfx__coll_kind_name(enum coll_kind kind);

/* Trees of the double binary tree (also used by unit tests): parent and the
 * two children of @p rank in tree @p t (0 or 1) of @p n ranks; -1 = none. */
void cfx__coll_dtree(int n, int rank, int t, int *parent, int *child0, int *child1);

/* Local checks of a call's arguments (before anything is sent or queued), a
 * field_mask bit this library does not know first (CFX_ERR_UNSUPPORTED). */
int cfx__coll_check(struct cfx_group *g, const struct coll_args *a, const char *what);

/* ---- group.c --------------------------------------------------------------------- */

/* Run one collective to completion on the calling thread. */
int cfx__coll_run(struct cfx_group *g, const struct coll_args *a);

/*
 * group_moved.c: this rank's node rejoined under another id (the comment
 * there): the coordinator declared it dead (stopped or cut off past its
 * heartbeat deadline) and the other ranks dropped it, or a restarted
 * coordinator did not give its id back; either way they know nothing of
 * the new id, and the group is unusable from this rank.
 * cfx__group_moved(): whether that happened (any thread, any lock; false
 * in a group of one).  cfx__group_moved_err(): CFX_ERR_PEER_FAILED saying
 * so, for call @p what.  cfx__group_moved_wait(): after a message of a call
 * failed, whether it happened, waiting (ctx->lock not held) while this
 * node's control connection is being made again, up to
 * COLL_REJOIN_WAIT_MS and @p deadline: the failure may be the others
 * dropping this node, which the new id tells.
 */
#define COLL_REJOIN_WAIT_MS 2500 /* one reconnection attempt (control/client.c) and more */
bool cfx__group_moved(const struct cfx_group *g);
int cfx__group_moved_err(const struct cfx_group *g, const char *what);
bool cfx__group_moved_wait(struct cfx_group *g, uint64_t deadline);

/* Post a message of @p len bytes on channel @p chan (the group's, or its
 * check channel); a handle >= 0 or a status.  Device data goes through a
 * host bounce. */
int cfx__coll_post_on(struct coll_exec *x, uint64_t chan, int peer, bool send, void *buf,
                      size_t len, enum cfx_memtype mt);

/* ---- coll_check.c: the argument check ------------------------------------ */

#define AGREE_ALL_MAX 8         /* ranks up to which headers go all-to-all */

struct coll_agree {
    struct coll_hdr me;
    struct coll_hdr *in;        /* [size]: each rank's header */
    int *rh;                    /* [size]: receive handles, -1 for this rank */
};

/* All ranks' headers: alongside the data in groups of up to AGREE_ALL_MAX
 * (post before the data, finish after it, gate before an in-place call's
 * first write), in a dissemination exchange before the data beyond. */
int cfx__coll_agree_post(struct coll_exec *x, struct coll_agree *ag, struct coll_hdr *in,
                         int *rh);
int cfx__coll_agree_finish(struct coll_exec *x, int rc);
int cfx__coll_agree_gate(struct coll_exec *x);
int cfx__coll_agree_all(struct coll_exec *x);
bool cfx__coll_writes_input(const struct coll_exec *x);
bool cfx__coll_gate_deferred(const struct coll_exec *x);
/* Along the messages: the header that came with a message from @p from;
 * a check-channel message; a call of count 0; the end of a call. */
int cfx__coll_hdr_check(struct coll_exec *x, int from, const void *in);
int cfx__coll_chk_check(struct coll_exec *x, int from, const struct coll_chk_msg *c);
int cfx__coll_check_empty(struct coll_exec *x);
int cfx__coll_check_end(struct coll_exec *x, int rc);
/* Failures other than a disagreement (coll_check.c "failures"): the error
 * of a message with @p peer that failed with @p rc (its text in
 * cfx_last_error()), named after the rank that died or gave up when that is
 * known; the error of a wait that saw group member @p dead gone; the news
 * that this rank gave up a call with @p rc, to the ranks of its edges and
 * those that asked it a question in the call (every rank in a group of up
 * to COLL_NEWS_ALL_MAX, or with x->sched_unknown). */
int cfx__coll_msg_failed(struct coll_exec *x, int peer, bool send, int rc);
int cfx__coll_member_gone(struct coll_exec *x, int dead);
void cfx__coll_gave_up(struct coll_exec *x, int rc);
/* Whether rank @p peer takes nothing more of the running call: known gone,
 * or its news says it gave the call up (its receives withdrawn).  Sends to
 * it get no grace after a failure.  Takes ctx->lock. */
bool cfx__coll_peer_out(struct coll_exec *x, int peer);
/* A call ended well: the news of the calls before it is stale (g->ngave). */
void cfx__coll_news_forget(struct coll_exec *x);
/* A wait for @p peer that ran COLL_CHECK_ASK_MS: our header to that rank
 * (once per rank and call). */
void cfx__coll_ask(struct coll_exec *x, int peer);
/* Stop predicate of every wait (lock held), and the error of a stopped
 * wait: the ranks disagree (or this rank's node rejoined as another,
 * cfx__group_moved: the error of cfx__coll_moved_fail). */
bool cfx__coll_stop(void *arg);
int cfx__coll_stopped(struct coll_exec *x);
int cfx__coll_moved_fail(struct coll_exec *x);
/* Drop the messages nobody will receive: of earlier calls, and with
 * @p upto of this one (its end). */
void cfx__coll_strays_sweep(struct coll_exec *x, bool upto);

/* The largest message to rank @p peer that goes as eager pieces: both
 * ranks compute the same from the two node records (a shm address each,
 * one host), whichever transport their connection then takes, so both cut
 * a message alike. */
size_t cfx__coll_split_max(const struct cfx_group *g, int peer);

/* group_split.c: whether cfx_group_send/recv of @p bytes with rank @p peer
 * go as eager pieces, and the send or receive of such a message (a host
 * buffer) */
bool cfx__group_split_size(const struct cfx_group *g, int peer, size_t bytes);
int cfx__group_split_p2p(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer,
                         int tag, uint64_t deadline);

#endif

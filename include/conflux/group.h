/*
 * Group collectives in the style of NCCL, MPI and ray.util.collective.
 *
 * A group is a fixed set of ranks 0..size-1, one per context.  Collectives
 * are called by every rank of the group in the same order with matching
 * arguments (count, dtype, op, root, a forced algorithm).  A call whose
 * ranks disagree fails with CFX_ERR_INVALID instead of returning wrong
 * data: by default on every rank whose part depends on a rank of the other
 * opinion.  A rank that only sends (a broadcast's root, a reduce's leaves)
 * or hears only from ranks of its own opinion may return CFX_OK, having
 * done its own part with its own arguments; a failed in-place call may
 * have written its buffer.  With CFX_COLL_CHECK=2 every rank fails in the
 * same call and a failed in-place call has written nothing, at the cost of
 * a barrier per call (docs/COLLECTIVES.md, "Argument check").  After such a
 * failure the group stays usable.  By default a rank waiting for a rank of
 * the other opinion that already left the call so (a gather's or reduce's
 * root waiting for a rank that took another rank for the root and sent
 * there) is not told: it fails at its deadline with CFX_ERR_TIMEOUT naming
 * that rank, as for a rank that never came.  Every blocking call has a
 * deadline (the group's timeout unless a call's params say otherwise) and
 * fails with CFX_ERR_TIMEOUT or CFX_ERR_PEER_FAILED naming the rank it
 * waited for.
 *
 * A rank whose process was stopped (SIGSTOP) or cut off past the
 * coordinator's heartbeat deadline is declared dead: the other ranks' calls
 * fail naming it, and they go on without it.  Once it runs again it
 * rejoins the cluster as a new node (a new node id), which no rank of its
 * groups knows: every call of such a group on that rank then fails at once
 * with CFX_ERR_PEER_FAILED saying so (its old and new node ids; a call
 * running at the time stops at its next wait).  The group is unusable
 * from that rank: destroy it and create a new group (the same name may be
 * used again).  A restarted coordinator that did not give the rank's node
 * its id back leaves the group so too; the other ranks learn it as they
 * rejoin and ask the coordinator about their peers: once the rank's rejoin
 * window ended, their calls with it fail with CFX_ERR_PEER_FAILED naming it.
 *
 * Buffers may be host memory (and CUDA device memory in CUDA builds: say so
 * with CFX_COLL_PARAM_MEMTYPE).  In-place operation: pass the same pointer
 * as send and receive buffer (for allgather / gather, the rank's own block
 * of the receive buffer; for reduce-scatter, the rank's block of the send
 * buffer), as in MPI_IN_PLACE.  Buffers that overlap in any other way are
 * refused with CFX_ERR_INVALID (they would be read after they were
 * written).
 *
 * Thread safety: a group is used by one thread at a time; several groups
 * of one context may be used from different threads.
 */
#ifndef CONFLUX_GROUP_H
#define CONFLUX_GROUP_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>
#include <conflux/mem.h>
#include <conflux/reduce.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;
struct cfx_group;
struct cfx_request;

enum cfx_group_param_field {
    CFX_GROUP_PARAM_NAME    = 1u << 0,
    CFX_GROUP_PARAM_RANK    = 1u << 1,
    CFX_GROUP_PARAM_SIZE    = 1u << 2,
    CFX_GROUP_PARAM_TIMEOUT = 1u << 3,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_GROUP_PARAM_ALL                                                          \
    ((uint64_t)(CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE | \
                CFX_GROUP_PARAM_TIMEOUT))

struct cfx_group_params {
    uint64_t field_mask;   /* which fields are set (CFX_GROUP_PARAM_*); a bit this
                              library does not know: CFX_ERR_UNSUPPORTED */
    const char *name;      /* group name, 1 to 127 bytes (else CFX_ERR_INVALID), unique
                              among the context's live groups; default (also when
                              NULL) "world" */
    int rank;              /* this process's rank; default from the environment */
    int size;              /* number of ranks; default from the environment */
    int timeout_ms;        /* default deadline of the group's calls, >= 1 (else
                              CFX_ERR_INVALID); default the context's */
};

/**
 * Create (join) a group.  Rank and size come from @p params or, when unset,
 * from the launcher's variables, one launcher's pair for both, the first
 * set of: CFX_RANK/CFX_WORLD_SIZE (cfx_run), RANK/WORLD_SIZE (torchrun,
 * both set: inside srun or mpirun it is the innermost launcher),
 * OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI),
 * SLURM_PROCID/SLURM_NTASKS (Slurm), PMI_RANK/PMI_SIZE.  Waits until
 * every rank has joined (the group's deadline).
 *
 * @return CFX_OK; CFX_ERR_INVALID (no rank/size found, rank out of range,
 *         or ranks that disagree on the size: the rank that sees it fails at
 *         once and tells the others while its context lives; one that exits
 *         on the error leaves them to their deadline);
 *         CFX_ERR_TIMEOUT naming the ranks that did not join;
 *         CFX_ERR_EXISTS when another process already joined as this rank, or
 *         when this context already has a group of this name (until
 *         cfx_group_destroy() of that one); CFX_ERR_CANCELED when the
 *         thread's interrupt check ended the wait (cfx_set_interrupt_check()).
 *         On failure *out is set to NULL (do not pass the variable that
 *         holds a live group).
 */
CFX_API int cfx_group_create(struct cfx_context *ctx, const struct cfx_group_params *params,
                             struct cfx_group **out);

/** Leave the group and free it; NULL is a no-op.  Its non-blocking calls
 * still queued or running are canceled first (their requests end with
 * CFX_ERR_CANCELED, still to be freed; the other ranks are told).  A
 * call of the group already running on another thread (a blocking
 * collective, cfx_group_send/recv, a post) stops at its next wake-up and
 * returns CFX_ERR_CANCELED saying the group was destroyed (the other ranks
 * hear of a stopped collective as of an interrupted one); one that begins
 * while the destroy runs fails so at once.  The destroy waits for them to
 * return before it frees anything (at most 10 s: a call stuck past that
 * leaves the group allocated, never freed under it).  A call made after
 * the destroy returned uses a freed handle: the caller's error.  May come
 * after cfx_context_destroy() of its context, or race with it on another
 * thread (the context then does the leaving, this frees the memory); the
 * group's calls fail with CFX_ERR_CANCELED once that destroy has begun. */
CFX_API void cfx_group_destroy(struct cfx_group *group);

CFX_API int cfx_group_rank(const struct cfx_group *group);
CFX_API int cfx_group_size(const struct cfx_group *group);

enum cfx_algo {
    CFX_ALGO_AUTO = 0,      /* chosen by size and group size */
    CFX_ALGO_RING,          /* ring reduce-scatter + allgather; ring allgather */
    CFX_ALGO_TREE,          /* binomial tree (broadcast, reduce) */
    CFX_ALGO_CHAIN,         /* pipelined chain (broadcast, reduce) */
    CFX_ALGO_DBTREE,        /* double binary tree (allreduce, small messages) */
    CFX_ALGO_RHD,           /* recursive halving-doubling (allreduce) */
    CFX_ALGO_DIRECT,        /* direct exchange (all-to-all, gather, scatter) */
    CFX_ALGO_RECDBL,        /* recursive doubling (allreduce, small messages) */
    CFX_ALGO_LAST
};

/** Name of an algorithm ("ring", ...). */
CFX_API const char *cfx_algo_name(enum cfx_algo algo);

enum cfx_coll_param_field {
    CFX_COLL_PARAM_TIMEOUT = 1u << 0,
    CFX_COLL_PARAM_ALGO    = 1u << 1,
    CFX_COLL_PARAM_MEMTYPE = 1u << 2,
    CFX_COLL_PARAM_STREAM  = 1u << 3,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_COLL_PARAM_ALL                                                              \
    ((uint64_t)(CFX_COLL_PARAM_TIMEOUT | CFX_COLL_PARAM_ALGO | CFX_COLL_PARAM_MEMTYPE | \
                CFX_COLL_PARAM_STREAM))

struct cfx_coll_params {
    uint64_t field_mask;      /* which fields are set (CFX_COLL_PARAM_*); a bit this
                                 library does not know: CFX_ERR_UNSUPPORTED, refused as
                                 bad arguments are (the other ranks hear it) */
    int timeout_ms;           /* deadline of this call, >= 1 (else CFX_ERR_INVALID) */
    enum cfx_algo algo;       /* force an algorithm (else $CFX_ALGO, else auto) */
    enum cfx_memtype memtype; /* memory type of the buffers (default host) */
    void *stream;             /* CUDA stream for device reductions (CUDA builds) */
};

/* Point to point.  Messages between two ranks with the same tag are
 * matched in posting order, and their sizes must agree.  A receive of
 * another size than its message fails with CFX_ERR_INVALID (a message
 * that goes by rendezvous fails its send too) and the message is dropped,
 * the messages after it on that pair and tag arriving as sent.  When the
 * two sizes go by different protocols (one eager send, CFX_EAGER_MAX:
 * 4072 B by default; eager pieces up to 16 KiB, up to 64 KiB between two
 * ranks of one host that both have the shm transport; the rendezvous
 * above: docs/COLLECTIVES.md) the receive does not take the message and
 * times out; the message waits for a receive of its own kind.  Both run
 * their thread's interrupt check while they wait (for the peer, and for
 * the group's non-blocking calls before them), and one interrupted
 * withdraws its message (cfx_set_interrupt_check(), conflux/context.h).
 * A receive withdrawn (interrupted, or at its deadline) takes nothing
 * unless its message landed whole meanwhile (then it returns CFX_OK, as
 * the send does); the message goes to the next receive of the tag, also
 * where the send had begun to write it, none of it having landed (it
 * took the receive's request before it heard of the withdrawal).  One cut
 * off with part of its message landed fails that send, saying so. */
CFX_API int cfx_group_send(struct cfx_group *g, const void *buf, size_t bytes, int peer,
                           int tag, const struct cfx_coll_params *params);
CFX_API int cfx_group_recv(struct cfx_group *g, void *buf, size_t bytes, int peer, int tag,
                           const struct cfx_coll_params *params);

CFX_API int cfx_group_barrier(struct cfx_group *g, const struct cfx_coll_params *params);

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. */
CFX_API int cfx_group_allreduce(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                                size_t count, enum cfx_dtype dtype, enum cfx_redop op,
                                const struct cfx_coll_params *params);
/* buf of root to every rank. */
CFX_API int cfx_group_broadcast(struct cfx_group *g, void *buf, size_t count,
                                enum cfx_dtype dtype, int root,
                                const struct cfx_coll_params *params);
/* recvbuf (significant at root only) = op over ranks of sendbuf. */
CFX_API int cfx_group_reduce(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                             size_t count, enum cfx_dtype dtype, enum cfx_redop op, int root,
                             const struct cfx_coll_params *params);
/* recvbuf[r*count ..] = sendbuf of rank r (count elements each). */
CFX_API int cfx_group_allgather(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                                size_t count, enum cfx_dtype dtype,
                                const struct cfx_coll_params *params);
/* recvbuf (count elements) = op over ranks of block `rank` of sendbuf
 * (size*count elements). */
CFX_API int cfx_group_reduce_scatter(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                                     size_t count, enum cfx_dtype dtype, enum cfx_redop op,
                                     const struct cfx_coll_params *params);
/* root's recvbuf[r*count ..] = sendbuf of rank r. */
CFX_API int cfx_group_gather(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                             size_t count, enum cfx_dtype dtype, int root,
                             const struct cfx_coll_params *params);
/* recvbuf of rank r = root's sendbuf[r*count ..]. */
CFX_API int cfx_group_scatter(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                              size_t count, enum cfx_dtype dtype, int root,
                              const struct cfx_coll_params *params);
/* recvbuf[r*count ..] of rank q = sendbuf[q*count ..] of rank r. */
CFX_API int cfx_group_alltoall(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                               size_t count, enum cfx_dtype dtype,
                               const struct cfx_coll_params *params);

/*
 * Non-blocking forms: same arguments, plus a request completed with
 * cfx_request_test() / cfx_request_wait() and freed with cfx_request_free().
 * A group runs its collectives in the order they were posted.  Freeing a
 * request not yet complete cancels its call: queued, it never runs; running,
 * it stops at its next wait and the free returns once neither buffer is
 * touched any more (within about half a second: what it sent to ranks
 * still in the call gets that long to be taken).  The other ranks'
 * matching calls fail with CFX_ERR_PEER_FAILED naming this rank (or
 * complete, correct, when this rank had already sent all they needed of
 * it: the eager messages of a small call); the group goes on with the next.
 * A blocking call that the thread's interrupt check ends
 * (cfx_set_interrupt_check(), conflux/context.h) is canceled the same way
 * and returns CFX_ERR_CANCELED; one ended while it waited for the group's
 * non-blocking calls before it never runs, as a queued call freed.
 */
CFX_API int cfx_group_iallreduce(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                                 size_t count, enum cfx_dtype dtype, enum cfx_redop op,
                                 const struct cfx_coll_params *params, struct cfx_request **req);
CFX_API int cfx_group_ibroadcast(struct cfx_group *g, void *buf, size_t count,
                                 enum cfx_dtype dtype, int root,
                                 const struct cfx_coll_params *params, struct cfx_request **req);
CFX_API int cfx_group_ireduce(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                              size_t count, enum cfx_dtype dtype, enum cfx_redop op, int root,
                              const struct cfx_coll_params *params, struct cfx_request **req);
CFX_API int cfx_group_iallgather(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                                 size_t count, enum cfx_dtype dtype,
                                 const struct cfx_coll_params *params, struct cfx_request **req);

#ifdef __cplusplus
}
#endif
#endif

/*
 * Parameter server with elastic load distribution (PSLD, SoCC'20).
 *
 * A job has W workers and a changing set of servers.  Workers register
 * tensors by name; a tensor is split into blocks (4 MiB by default) and a
 * versioned shard map assigns each block to one server.  Workers push
 * gradients and pull parameters block by block.  Servers either sum what
 * they receive into the stored value (CFX_PS_OPT_SUM: the workers run the
 * optimizer and push updates) or apply an optimizer themselves (SGD,
 * momentum, Adam).  Consistency is BSP, SSP with a staleness bound, or ASP.
 *
 * Server 0 also runs the scheduler: it publishes shard maps as immutable
 * small objects "ps/<job>/map/<version>", collects the service time per byte
 * that workers measure for each server, detects stragglers and moves blocks
 * toward measured capacity while keeping a small exploration share on every
 * server, so that a recovered server wins its blocks back.  Migration is live
 * and loses no update (docs/PARAMETER_SERVER.md has the protocol and knobs).
 * The job-wide settings (consistency, optimizer, block size, balancing
 * knobs) are those of server 0; the other members' values are ignored.
 *
 * One role per context: a process that wants to be a worker and a server
 * uses two contexts.  Jobs that run at the same time on one coordinator
 * need different names; a job may take the name of one that has ended
 * (docs/PARAMETER_SERVER.md, "Limits").
 *
 * Thread safety: a worker handle may be used from several threads; ops of
 * one tensor are applied in the order they were posted.  cfx_ps_destroy()
 * must not race with other calls on the same handle (a wait for one of its
 * requests may: cfx_ps_request_free()).  Every wait is bounded
 * by a deadline and fails with CFX_ERR_TIMEOUT or CFX_ERR_PEER_FAILED naming
 * the server or worker it waited for (cfx_last_error()); a reply already
 * arriving into the caller's buffer at the deadline is taken in first (up
 * to 2 s more), so no byte lands in a buffer after its op ended.
 */
#ifndef CONFLUX_PS_H
#define CONFLUX_PS_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>
#include <conflux/mem.h>
#include <conflux/reduce.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;
struct cfx_ps;
struct cfx_ps_request;

enum cfx_ps_role {
    CFX_PS_WORKER = 0, /* registers tensors, pushes and pulls */
    CFX_PS_SERVER = 1, /* stores blocks; server 0 also schedules */
};

enum cfx_ps_consistency {
    CFX_PS_BSP = 0, /* every pull of step t sees all workers' pushes of steps < t */
    CFX_PS_SSP,     /* ... of steps < t - staleness */
    CFX_PS_ASP,     /* pulls never wait */
};

enum cfx_ps_optimizer {
    CFX_PS_OPT_SUM = 0,  /* value += sum of pushes (any dtype) */
    CFX_PS_OPT_SGD,      /* p -= lr * (g + wd * p)                     (f32/f64) */
    CFX_PS_OPT_MOMENTUM, /* v = mu * v + g + wd * p; p -= lr * v      (f32/f64) */
    CFX_PS_OPT_ADAM,     /* Adam with bias correction, L2 weight decay (f32/f64) */
};

enum cfx_ps_param_field {
    CFX_PS_PARAM_JOB         = 1u << 0,
    CFX_PS_PARAM_ROLE        = 1u << 1,
    CFX_PS_PARAM_INDEX       = 1u << 2,
    CFX_PS_PARAM_NUM_WORKERS = 1u << 3,
    CFX_PS_PARAM_NUM_SERVERS = 1u << 4,
    CFX_PS_PARAM_CONSISTENCY = 1u << 5,
    CFX_PS_PARAM_STALENESS   = 1u << 6,
    CFX_PS_PARAM_BLOCK_SIZE  = 1u << 7,
    CFX_PS_PARAM_OPTIMIZER   = 1u << 8,
    CFX_PS_PARAM_TIMEOUT     = 1u << 9,
    CFX_PS_PARAM_BALANCE     = 1u << 10,
    CFX_PS_PARAM_STANDBY     = 1u << 11,
    CFX_PS_PARAM_MEMTYPE     = 1u << 12,
    CFX_PS_PARAM_STREAM      = 1u << 13,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_PS_PARAM_ALL                                                                      \
    ((uint64_t)(CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |                   \
                CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |                         \
                CFX_PS_PARAM_CONSISTENCY | CFX_PS_PARAM_STALENESS | CFX_PS_PARAM_BLOCK_SIZE | \
                CFX_PS_PARAM_OPTIMIZER | CFX_PS_PARAM_TIMEOUT | CFX_PS_PARAM_BALANCE |        \
                CFX_PS_PARAM_STANDBY | CFX_PS_PARAM_MEMTYPE | CFX_PS_PARAM_STREAM))

/* Optimizer hyper-parameters (server side).  g is the aggregated gradient:
 * grad_scale times the sum of the round's pushes (BSP) or one push (SSP,
 * ASP).  The defaults below apply when CFX_PS_PARAM_OPTIMIZER is not set;
 * with it every field is taken as given, and server 0 (whose settings are
 * the job's) refuses an optimizer other than SUM with grad_scale 0 (every
 * push ignored), or Adam with a beta outside [0, 1): CFX_ERR_INVALID. */
struct cfx_ps_optim {
    enum cfx_ps_optimizer type;
    double lr;           /* learning rate; default 0.01 */
    double momentum;     /* MOMENTUM: mu; default 0.9 */
    double beta1;        /* ADAM; default 0.9 */
    double beta2;        /* ADAM; default 0.999 */
    double eps;          /* ADAM; default 1e-8 */
    double weight_decay; /* L2 term added to g; default 0 */
    double grad_scale;   /* g = grad_scale * pushes; default 1 (SUM ignores it) */
};

/* Load-distribution knobs of the scheduler (docs/PARAMETER_SERVER.md). */
struct cfx_ps_balance {
    int enabled;             /* rebalance automatically; default 1 */
    int interval_ms;         /* measurement window per decision; default 1000 */
    double straggler_factor; /* straggler: time/byte > factor x median; default 1.5 */
    double min_gain;         /* move only if the slowest server's predicted time drops
                                by this fraction; default 0.2 */
    double explore;          /* share of an equal split every active server keeps
                                (at least one block); default 0.05 */
    int report_ms;           /* workers report measurements this often; default 200 */
};

struct cfx_ps_params {
    uint64_t field_mask;                 /* which fields are set (CFX_PS_PARAM_*); a bit
                                            this library does not know:
                                            CFX_ERR_UNSUPPORTED */
    const char *job;                     /* job name; default "ps" */
    enum cfx_ps_role role;               /* default from $CFX_PS_ROLE (worker or server;
                                            another value: CFX_ERR_INVALID), else WORKER */
    int index;                           /* worker or server index; default $CFX_PS_INDEX */
    int num_workers;                     /* workers in the job; default $CFX_PS_WORKERS */
    int num_servers;                     /* servers at start; default $CFX_PS_SERVERS */
    enum cfx_ps_consistency consistency; /* default BSP */
    int staleness;                       /* SSP bound (0..64); default 1 */
    size_t block_size;                   /* bytes per block; default 4 MiB */
    struct cfx_ps_optim optim;           /* default SUM */
    int timeout_ms;                      /* deadline of every wait; default the context's */
    struct cfx_ps_balance balance;       /* scheduler knobs; defaults above */
    int standby;                         /* server joining later waits for add-server */
    enum cfx_memtype memtype;            /* worker: memory type of push / pull buffers
                                            (register's init stays host); default host */
    void *stream;                        /* worker, device buffers: the stream they are made
                                            and read on (cudaStream_t); default: ordered
                                            after the legacy default stream */
};

/**
 * Join a job as a worker or a server.
 *
 * Server 0 waits for every initial worker and server to announce itself,
 * then publishes shard map 1.  The others wait for a map that lists them.
 * A server whose index is at least the initial server count joins a running
 * job: it is admitted at once (or on cfx_ps_add_server() when standby) and
 * receives blocks at the next rebalance.  A job that cannot start fails
 * every member's create: when server 0 gives up, the members that announced
 * themselves hear why from it, with its status ("the job did not start").
 *
 * @param out  receives the handle; release with cfx_ps_destroy().
 * @return CFX_OK; CFX_ERR_INVALID (role, index, counts); CFX_ERR_TIMEOUT
 *         naming the members that did not appear (with a server past the
 *         initial ones present, that the initial servers' indices skip
 *         one; a member that got no map names the initial members still
 *         missing, not its own index); CFX_ERR_PEER_FAILED naming, with its
 *         node, a member that died before the job started (also when its
 *         announcement went with it before server 0 read it), or the
 *         scheduler (server 0) when it died before this member joined:
 *         at once, once the coordinator declared the node dead (for a
 *         death this member's context heard of; docs/PARAMETER_SERVER.md,
 *         "Startup").
 */
CFX_API int cfx_ps_create(struct cfx_context *ctx, const struct cfx_ps_params *params,
                          struct cfx_ps **out);

/**
 * Leave the job.  A worker tells the scheduler it is done and waits for its
 * answer (pending ops fail with CFX_ERR_CANCELED); when every worker is
 * done the servers stop.  Server 0 (the scheduler) waits here, at the end
 * of a job, until every other server has confirmed that it has the map
 * that ends its service or has failed, for at most the handle's timeout
 * (it logs the servers it leaves behind).  NULL is a no-op.  May come after
 * cfx_context_destroy() of its context, which then takes the handle's side
 * of it (no goodbye: the scheduler counts a worker whose context went as
 * done): the handle's calls fail with CFX_ERR_CANCELED, and this frees it.
 */
CFX_API void cfx_ps_destroy(struct cfx_ps *ps);

/**
 * Server: serve until the job ends (every worker destroyed its handle) or
 * this server was removed and drained.
 *
 * The end is confirmed to the scheduler (server 0), which does not leave
 * before that, so a server never misses it.  If the scheduler is lost (its
 * connection fails, or it leaves) after this server learnt of its end,
 * that changes nothing; if it is lost before, serve returns at once with
 * CFX_ERR_PEER_FAILED, and cfx_last_error() names the scheduler's node.
 *
 * The job's shard maps, and so its end, travel through the coordinator: a
 * coordinator outage shorter than the handle's timeout is a pause (the
 * context reconnects; serving goes on), but once the coordinator has been
 * unreachable for the handle's timeout, serve returns CFX_ERR_CONNECT and
 * cfx_last_error() names the coordinator's address, so that no server
 * waits for an end it can no longer learn.
 * @return CFX_OK at the end; CFX_ERR_PEER_FAILED as above, or
 *         CFX_ERR_CONNECT (the coordinator lost, as above): destroy the
 *         handle; CFX_ERR_TIMEOUT after @p timeout_ms (<0: no limit), the
 *         server keeps serving and serve may be called again.
 */
CFX_API int cfx_ps_serve(struct cfx_ps *ps, int timeout_ms);

/**
 * Worker: register a tensor; every worker calls it with the same name,
 * dtype and count (in any order).  Worker 0's @p init (count elements)
 * gives the initial values; the others may pass NULL.  Blocks until the
 * tensor is stored on the servers.
 * @param key  receives the tensor's key for push/pull.
 * @return CFX_OK; CFX_ERR_INVALID (a worker disagrees); CFX_ERR_UNSUPPORTED
 *         (an optimizer other than SUM on an integer dtype); CFX_ERR_TIMEOUT;
 *         CFX_ERR_PEER_FAILED naming the scheduler's node when it is lost, or
 *         naming a server and its node that failed before the tensor's
 *         initial values were stored on it (at once, once this worker's
 *         connection to it failed; a server the scheduler has seen fail
 *         gets no block of a tensor registered after);
 *         CFX_ERR_CONNECT naming the coordinator's address when it has been
 *         unreachable for the handle's timeout, or is unreachable when the
 *         wait runs out (the shard maps come through its directory).
 */
CFX_API int cfx_ps_register(struct cfx_ps *ps, const char *name, enum cfx_dtype dtype,
                            size_t count, const void *init, int *key);

/* Blocking push / pull / push-pull of a whole tensor (count elements).
 * push: send this step's gradient (or update, for SUM).  pull: parameters
 * as of this worker's step under the job's consistency.  pushpull: push,
 * then the parameters once this step has been applied (BSP: by every
 * worker).  @p grad must stay unchanged until the call returns.
 * Once the coordinator has been unreachable for the handle's timeout these
 * (and the non-blocking forms, at the call or in flight) fail with
 * CFX_ERR_CONNECT naming its address; a request that runs out of time
 * while it is unreachable fails so too, not with CFX_ERR_TIMEOUT. */
CFX_API int cfx_ps_push(struct cfx_ps *ps, int key, const void *grad);
CFX_API int cfx_ps_pull(struct cfx_ps *ps, int key, void *out);
CFX_API int cfx_ps_pushpull(struct cfx_ps *ps, int key, const void *grad, void *out);

/* Non-blocking forms: buffers stay owned by the caller and must stay valid
 * (and @p grad unchanged) until the request completes, and are not read
 * after it, even when it failed (blocks of @p grad still on their way then
 * go on with a copy).  On CFX_OK *req is
 * set; complete it with cfx_ps_wait() or cfx_ps_test() and release it with
 * cfx_ps_request_free().  On an error no request exists.  Under BSP, with
 * several push-pulls of one tensor in flight while its blocks move between
 * servers (add, remove, rebalance), a block of a result may already hold
 * the next round (docs/PARAMETER_SERVER.md). */
CFX_API int cfx_ps_ipush(struct cfx_ps *ps, int key, const void *grad,
                         struct cfx_ps_request **req);
CFX_API int cfx_ps_ipull(struct cfx_ps *ps, int key, void *out, struct cfx_ps_request **req);
CFX_API int cfx_ps_ipushpull(struct cfx_ps *ps, int key, const void *grad, void *out,
                             struct cfx_ps_request **req);

/** CFX_ERR_AGAIN while running, else the final status. */
CFX_API int cfx_ps_test(struct cfx_ps_request *req);
/** Wait up to @p timeout_ms (<0: until the op's own deadline); final status
 *  (cfx_last_error() names the server on failure) or CFX_ERR_TIMEOUT. */
CFX_API int cfx_ps_wait(struct cfx_ps_request *req, int timeout_ms);
/** Free a request.  One still running is canceled first, and the free returns
 *  once its buffers are the caller's again: a reply already landing in @p out
 *  is let finish (2 s at most, then that server's mailbox is failed), blocks
 *  of @p grad still on their way go on with a copy, so a canceled push may
 *  have been applied by some servers (its step stays taken, as one that ran
 *  out of time).  NULL: no-op.
 *  cfx_ps_destroy() ends every request of its handle (CFX_ERR_CANCELED):
 *  a request may still be waited for, tested and freed after it, and a wait
 *  of it on another thread while the handle is destroyed ends with
 *  CFX_ERR_CANCELED (the handle's last memory goes with its last request). */
CFX_API void cfx_ps_request_free(struct cfx_ps_request *req);

/* What a handle knows about the job, from its latest shard map. */
struct cfx_ps_server_info {
    int index;
    uint32_t node_id;
    int state;             /* CFX_PS_SERVER_* */
    uint32_t blocks;       /* blocks it owns */
    uint64_t bytes;        /* bytes it owns */
    double ns_per_byte;    /* measured service time per byte; 0 = not yet */
    int straggler;         /* flagged by the last decision */
};

enum cfx_ps_server_state {
    CFX_PS_SERVER_ACTIVE = 1,   /* owns blocks, takes new ones */
    CFX_PS_SERVER_STANDBY,      /* joined, waits for add-server */
    CFX_PS_SERVER_DRAINING,     /* being removed: its blocks move away */
    CFX_PS_SERVER_RETIRED,      /* removed and drained */
    CFX_PS_SERVER_FAILED,       /* the scheduler saw it go (its mailbox failed, or its node
                                   died) before its end: the blocks it owns are not served
                                   (no replication) and it takes none; remove-server moves
                                   them, their values lost (requests for them still fail
                                   naming it), and it stays failed */
};

struct cfx_ps_stats {
    uint32_t map_version;  /* latest shard map this handle applied */
    uint32_t nservers;     /* entries in servers[] */
    struct cfx_ps_server_info servers[64];
    uint32_t ntensors;
    uint32_t nblocks;
    uint64_t migrations_out;   /* server: blocks it handed over */
    uint64_t migrations_in;    /* server: blocks it received */
    uint64_t forwarded;        /* server: requests forwarded after a move */
    uint64_t redirects;        /* worker: requests re-sent after a move */
    uint64_t rebalances;       /* scheduler: maps published by load distribution */
    uint64_t lost_steps;       /* server: workers' steps of a block counted as empty pushes:
                                  their push never came and the worker's next said it may
                                  have been lost (its request for it had failed) */
};

/** Snapshot of the handle's view. @return CFX_OK or CFX_ERR_INVALID. */
CFX_API int cfx_ps_stats(struct cfx_ps *ps, struct cfx_ps_stats *out);

/**
 * Server: add a delay of @p us microseconds to every push or pull this
 * server processes.  TEST AND DEMO ONLY: it emulates a straggling server
 * (so does $CFX_PS_TEST_DELAY_US on the server whose index is
 * $CFX_PS_TEST_DELAY_SERVER, default 1).  0 removes it.
 */
CFX_API int cfx_ps_server_set_delay(struct cfx_ps *ps, uint32_t us);

/*
 * Administration, from any member context (rdmactl joins as one): requests
 * travel to the scheduler as small objects "ps/<job>/admin/<n>"; several
 * administrators at once are served in turn (one that lost the numbers to
 * 64 others' requests in a row fails with CFX_ERR_BUSY).  Each waits for
 * the scheduler's answer and, for
 * add/remove/rebalance, for the map version that carries the change
 * (*version_out, may be NULL).  These and cfx_ps_shards() address a running
 * job: one whose first shard map the coordinator does not hold fails at once
 * with CFX_ERR_NOT_FOUND (no wait); a negative @p timeout_ms is
 * CFX_ERR_INVALID.  While the job's tensors are still being registered (its
 * first moments) a request is asked again until @p timeout_ms, then
 * CFX_ERR_TIMEOUT says so.  A server the scheduler has seen fail is not
 * added: CFX_ERR_PEER_FAILED naming it.
 */
CFX_API int cfx_ps_add_server(struct cfx_context *ctx, const char *job, int server,
                              int timeout_ms, uint32_t *version_out);
/* As cfx_ps_add_server() for the standby server that task placement
 * chooses among the job's standby servers (include/conflux/task.h: every
 * server offers itself; among their nodes, the least loaded); *server_out
 * (may be NULL) receives its index.  A chosen one the scheduler has seen
 * go (CFX_ERR_PEER_FAILED) is passed over for the next choice.
 * CFX_ERR_NOT_FOUND when the job has no standby server, or none on a node
 * placement may choose (they died or left: named). */
CFX_API int cfx_ps_add_server_auto(struct cfx_context *ctx, const char *job, int timeout_ms,
                                   int *server_out, uint32_t *version_out);
/* Drain @p server's blocks to the others; it stops serving once no request
 * can reach it any more.  Server 0 (the scheduler) cannot be removed.  A
 * FAILED server's blocks move the same way, without their values (they
 * went with it), and it stays FAILED: their new owners wait for no state
 * and serve no made-up values; every push and pull of a tensor with such a
 * block fails at once, for the rest of the job, with CFX_ERR_PEER_FAILED
 * naming the failed server and its node and saying the block's values were
 * lost (there is no call that stores a tensor's values again: register the
 * values under a new name to go on).  It holds no removal of a live
 * server after. */
CFX_API int cfx_ps_remove_server(struct cfx_context *ctx, const char *job, int server,
                                 int timeout_ms, uint32_t *version_out);
/* Decide now from the latest measurements (ignores the minimum gain). */
CFX_API int cfx_ps_rebalance(struct cfx_context *ctx, const char *job, int timeout_ms,
                             uint32_t *version_out);
/* Turn automatic load distribution on (1) or off (0). */
CFX_API int cfx_ps_set_auto(struct cfx_context *ctx, const char *job, int enabled,
                            int timeout_ms);
/* The latest shard map as stats (no scheduler round trip): a server the
 * scheduler saw go is CFX_PS_SERVER_FAILED from the map it published then,
 * with the blocks it held.  CFX_ERR_PROTO, naming the server and the state,
 * for a map with a server state this build does not know. */
CFX_API int cfx_ps_shards(struct cfx_context *ctx, const char *job, int timeout_ms,
                          struct cfx_ps_stats *out);

#ifdef __cplusplus
}
#endif
#endif

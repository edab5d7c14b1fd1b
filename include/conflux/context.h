/*
 * The context: one process's membership in a Conflux cluster.
 *
 * A context owns a connection to the coordinator, one progress thread that
 * drives every transport, the local object store and the registered arena.
 * All functions here may be called from any thread.
 *
 * Destroying a context while other threads are inside calls on it: calls
 * in flight when cfx_context_destroy() begins (cfx_get/put/delete and
 * their _alloc form, cfx_reduce_objects, and the calls of the context's
 * groups: collectives, cfx_group_send/recv, cfx_group_create) end at once
 * with CFX_ERR_CANCELED, cfx_last_error() saying "the context of node N is
 * being destroyed"; calls that begin while it runs are refused the same
 * way.  The destroy waits for those calls to leave (at most 10 s; should
 * one not leave by then, the context is logged and left allocated, never
 * freed under it, and so are its groups) and returns.  Groups of the
 * context may outlive it: their calls then fail with CFX_ERR_CANCELED ("its
 * context was destroyed"), and cfx_group_destroy() frees them.  No call may
 * begin after cfx_context_destroy() has returned (the context is gone).
 * Parameter-server handles may outlive it too: their calls then fail with
 * CFX_ERR_CANCELED and cfx_ps_destroy() frees them (conflux/ps.h).
 * Requests (cfx_*_nb, cfx_group_i*) may outlive it too: the destroy ends
 * those still running (CFX_ERR_CANCELED; a get's buffer is not written
 * after it returns) and lets them go of the context, so that a later
 * cfx_request_test(), _wait() or _progress() returns the final status at
 * once and cfx_request_free() frees them.  A wait already blocked on
 * another thread when the destroy begins returns before the destroy does.
 *
 * fork(): a context, its groups and parameter-server handles belong to the
 * process that created them.  In a forked child the copies are not usable
 * (object, task and group calls, cfx_buf_alloc, the waits and tests of
 * requests, and parameter-server pushes, pulls, registers and serves fail
 * with CFX_ERR_INVALID saying so) and their destroys do nothing, nor do
 * cfx_buf_free and cfx_request_free: the coordinator connection,
 * transports and directory records are the parent's, the threads are not
 * in the child, and a lock one of them held at the fork stays held.
 * A child that uses Conflux creates its own context.
 */
#ifndef CONFLUX_CONTEXT_H
#define CONFLUX_CONTEXT_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;

enum cfx_context_param_field {
    CFX_CTX_PARAM_COORD      = 1u << 0, /* coordinator "host:port" */
    CFX_CTX_PARAM_TOKEN      = 1u << 1, /* cluster token */
    CFX_CTX_PARAM_TRANSPORTS = 1u << 2, /* preference list, e.g. "shm,tcp" */
    CFX_CTX_PARAM_CHUNK_SIZE = 1u << 3, /* fixed chunk size in bytes */
    CFX_CTX_PARAM_TIMEOUT    = 1u << 4, /* default deadline in ms */
    CFX_CTX_PARAM_NAME       = 1u << 5, /* node name shown by rdmactl */
    CFX_CTX_PARAM_BIND_ADDR  = 1u << 6, /* IP address the data plane listens on */
    CFX_CTX_PARAM_SECURE     = 1u << 7, /* sealing of control and tcp connections */
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_CTX_PARAM_ALL                                                               \
    ((uint64_t)(CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS |  \
                CFX_CTX_PARAM_CHUNK_SIZE | CFX_CTX_PARAM_TIMEOUT | CFX_CTX_PARAM_NAME | \
                CFX_CTX_PARAM_BIND_ADDR | CFX_CTX_PARAM_SECURE))

struct cfx_context_params {
    uint64_t field_mask;    /* which of the fields below are set (CFX_CTX_PARAM_*); a
                             * bit this library does not know: CFX_ERR_UNSUPPORTED */
    const char *coord;      /* "host:port", at most 127 bytes; default $CFX_COORD */
    const char *token;      /* cluster token; default $CFX_TOKEN or $CFX_TOKEN_FILE */
    const char *transports; /* comma list, e.g. "tcp"; default $CFX_TRANSPORT or
                             * "shm,verbs,tcp" (those this build and host lack are
                             * skipped) */
    size_t chunk_size;      /* 0 = follow object size; default $CFX_CHUNK_SIZE */
    int timeout_ms;         /* default deadline, >= 1 (else CFX_ERR_INVALID); default
                             * $CFX_TIMEOUT_MS or 30000 */
    const char *name;       /* node name, at most 63 bytes (else CFX_ERR_INVALID);
                               default hostname:pid */
    const char *bind_addr;  /* data-plane listen address; default $CFX_BIND_ADDR or the coordinator-facing address */
    /* Added later: "off", "integrity" or "encrypt" (also "0", "1"); default
     * $CFX_SECURE, else off: seals the coordinator connection and the tcp
     * and dpdk data planes (shm stays on one host; verbs cannot seal and is
     * not opened).  Every node and the coordinator must agree
     * (docs/SECURITY.md, *Sealed tcp connections*). */
    const char *secure;
};

/**
 * Join a cluster: connect and authenticate to the coordinator, start the
 * progress engine and the transports, and register this node.  A coordinator
 * that is not up yet (connection refused) is retried with backoff until the
 * deadline (timeout_ms), so processes may start in any order.
 *
 * The cluster token comes from params->token, else $CFX_TOKEN, else the file
 * named by $CFX_TOKEN_FILE.  $CFX_TOKEN is read once: the library then
 * overwrites its value in place (so /proc/PID/environ no longer shows it)
 * and removes it from the environment, so child processes do not inherit
 * it; later contexts of the process use the copy it kept.  Do not call
 * getenv()/setenv() from other threads during the first create.
 *
 * @param params  NULL or a params struct; unset fields come from CFX_* variables.
 * @param out     receives the context; owned by the caller, released with
 *                cfx_context_destroy().
 * @return CFX_OK; CFX_ERR_INVALID when no coordinator is configured;
 *         CFX_ERR_CONNECT (no coordinator answered by the deadline),
 *         CFX_ERR_AUTH, CFX_ERR_TIMEOUT, CFX_ERR_VERSION.
 *         cfx_last_error() says which coordinator and why.
 */
CFX_API int cfx_context_create(const struct cfx_context_params *params,
                               struct cfx_context **out);

/**
 * Leave the cluster and free everything; NULL is a no-op.  Calls blocked on
 * other threads end with CFX_ERR_CANCELED first (see the top of this file);
 * returns within about 10 s of that plus the leave itself.
 */
CFX_API void cfx_context_destroy(struct cfx_context *ctx);

/** Node id the coordinator assigned to this context (never 0). */
CFX_API uint32_t cfx_context_node_id(const struct cfx_context *ctx);

/**
 * Write the effective configuration as "key = value" lines into @p buf.
 * @return number of bytes the full text needs (excluding NUL), like snprintf,
 *         or a negative status.
 */
CFX_API int cfx_context_config(const struct cfx_context *ctx, char *buf, size_t len);

/* Counters of what this context's data plane has done since creation. */
struct cfx_context_stats {
    uint64_t puts;              /* objects put */
    uint64_t gets;              /* gets that moved data over the data plane */
    uint64_t gets_inline;       /* gets answered inline by the coordinator */
    uint64_t gets_local;        /* gets answered from this node's store */
    uint64_t bytes_received;    /* chunk bytes that landed here */
    uint64_t bytes_sent;        /* chunk bytes written to peers */
    uint64_t uploads;           /* transfers served to other nodes */
    uint64_t uploads_partial;   /* ... of which started from a partial copy */
    uint64_t source_failovers;  /* gets resumed at another source */
    uint64_t reduce_reroutes;   /* reduces this node drove that routed around a dead node */
    uint64_t reduce_replans;    /* ... that had to plan again from the start */
    /* fields added later go at the end */
    uint64_t dir_lookups;       /* directory lookups gets made (the coordinator's round trip) */
    uint64_t loc_hits;          /* gets that went straight to a holder from the location cache */
    uint64_t loc_stale;         /* ... of which the holder refused or failed: asked the directory */
    uint64_t loc_evictions;     /* locations evicted to make room (CFX_LOC_CACHE bounds it) */
    uint64_t writes_refused;    /* peers' writes outside a live grant (stale key, granted to
                                   another peer, outside the object): refused by the transport
                                   before a byte landed, their connection failed (tcp, shm) */
    uint64_t records_refused;   /* sealed records (CFX_SECURE) that failed to open: altered,
                                   replayed or sealed with another key; nothing of them was
                                   used, their connection failed (tcp) */
    uint64_t writes_late;       /* peers' writes that came after this node gave their
                                   transfer up (a get's deadline, a freed request): dropped
                                   whole before a byte landed, the connection kept (tcp in
                                   clear, shm, dpdk; on verbs such a write is refused) */
};

/** Snapshot of the context's counters. @return CFX_OK or CFX_ERR_INVALID. */
CFX_API int cfx_context_stats(struct cfx_context *ctx, struct cfx_context_stats *out);

/**
 * Let the calling thread's blocking calls be interrupted (Ctrl-C in an
 * interpreter that runs its signal handlers on this thread).  While a
 * blocking collective, cfx_group_send() or cfx_group_recv(), or
 * cfx_group_create() (conflux/group.h), a cfx_get() or cfx_get_alloc(), a
 * cfx_reduce_objects(), a cfx_ps_create() (conflux/ps.h), a cfx_task_wait(),
 * or a cfx_context_create() waiting for a coordinator that does not answer
 * yet, of this thread waits on other processes, it calls
 * @p check(@p arg) on this thread every 100 ms or so of the wait (never in a
 * call that completes sooner), holding no lock of the library; @p check
 * must not call the library.  A nonzero return ends the call with
 * CFX_ERR_CANCELED as a free of its request would: a collective tells the
 * other ranks that this rank canceled it (their calls fail saying so, and
 * the group's next call pairs as usual), a group's creation withdraws what
 * it published, and a get writes nothing into the buffer once it returned.
 * A receive is withdrawn: a message none of which landed yet is left for
 * the next receive of its tag, one part of which landed is cut off (its
 * send fails CFX_ERR_CANCELED), and one that landed whole meanwhile is
 * taken (the call returns CFX_OK).  A send its receiver has not taken yet is withdrawn
 * and never arrives; one under way is cut off (its receive fails
 * CFX_ERR_NOT_FOUND).  (A message of eager pieces leaves whole, once the
 * receiver has room for all of it, or not at all.)  A message that
 * completed while @p check ran is not withdrawn: the call returns CFX_OK.
 * Per thread; NULL @p check removes it.
 */
CFX_API void cfx_set_interrupt_check(int (*check)(void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif

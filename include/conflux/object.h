/*
 * Objects: immutable byte strings named by a 20-byte id, moved chunk by chunk
 * between the nodes that hold them.
 *
 * Ownership:
 *  - cfx_put() registers the caller's buffer and serves it to other nodes
 *    without copying.  The buffer must stay valid and unchanged until
 *    cfx_delete() of that id returns (or the context is destroyed).
 *  - cfx_get() writes into the caller's buffer, which then becomes this
 *    node's copy: other nodes read the object from it (while it lands, so
 *    getters pipeline through each other, and after), and later gets on
 *    this node copy from it.  Like a put buffer it must stay valid and
 *    unchanged until cfx_delete() of the id returns (or the context is
 *    destroyed).  With CFX_OBJ_FLAG_NO_KEEP the buffer is the caller's
 *    again when the get returns: the nodes reading it while the bytes
 *    landed get theirs first (the get returns once they are done, or at
 *    its deadline, where they are cut off and fail over to another
 *    holder), and nothing is kept.  So is the buffer of a cfx_get() that
 *    failed, its readers cut off.  Cut off, nothing reads the buffer after
 *    the get returned (writes from it still on their way then are waited
 *    for, and ended with their connection when they do not move for 2 s).
 *    Objects small enough to travel inline are kept in a copy of the
 *    engine's own either way.
 *  - cfx_get_alloc() hands out an arena buffer that the caller releases
 *    with cfx_buf_free() (which also ends this node's copy); the caller
 *    must not change it.
 *  - A node that has got an object also serves it to later getters, until
 *    cfx_delete(), context destruction, or the object's end (below).
 *
 * Lifecycle (docs/ARCHITECTURE.md, "Object lifecycle"), the same for
 * objects small enough to travel inline and for the rest:
 *  - The node that put an id is its putter.  The id names that object while
 *    a node holds a complete copy: the putter, or a node that got all of it.
 *    When the putter leaves (context destroyed, process exited or died),
 *    such copies keep it served; with none, it is gone, and a cfx_get() of
 *    the id waits for a new put.  A putter that publishes for others stays
 *    until they have it.
 *  - cfx_put() of an id that exists fails with CFX_ERR_EXISTS, whichever
 *    node calls it; it never succeeds while the old bytes are served: while
 *    the putter's cfx_delete() of the id has not returned, a put of it
 *    fails so too (docs/ARCHITECTURE.md, Delete).
 *  - The putter's cfx_delete() withdraws the object with every copy; when
 *    it returns, the id is free: a cfx_put() of it from any node, this one
 *    included, succeeds at once, and no node answers a cfx_get() of the id
 *    from a copy of the withdrawn object, its own gets included (every
 *    holder dropped its copy before the delete returned; a holder's own
 *    cfx_delete() of such a copy returns CFX_OK).  A get that was under way
 *    keeps the bytes it got, but they are not kept as a copy.
 *  - A coordinator outage is a pause: a call that needs the coordinator
 *    (a put, a get looking for a holder, a delete) while it is away, or
 *    that is waiting on it when it goes, waits for the reconnection and is
 *    sent again on it, all within its own deadline; a put is never refused
 *    for its own object because of that (it is acknowledged once), and an
 *    object whose put returned CFX_OK is announced again after a restart,
 *    as are the complete copies nodes got of it (so an object whose putter
 *    left before the restart is still served from them).
 *    Transfers between nodes go on meanwhile.  When the deadline passes
 *    with the coordinator still unreachable, the call fails with
 *    CFX_ERR_CONNECT and cfx_last_error() names the coordinator's address.
 *
 * Known locations: a node remembers where the objects it got through the
 * data plane live (up to CFX_LOC_CACHE ids, default 4096, 0 = off) and gets
 * such an id again (after deleting its copy) straight from that holder,
 * without asking the coordinator.  Only the putter's own copy answers such
 * a request, and only with the size asked for, so a location that went
 * stale (the object deleted or put again, the holder dead) costs one round
 * trip to the directory and never yields bytes the id no longer names.  A
 * copy got that way is not recorded in the directory, so nobody would tell
 * this node when it is withdrawn: it serves nobody, it gives way to a
 * cfx_put() of the id on this node (which the directory then judges), and
 * a later get of the id on this node fetches again from the location
 * instead of answering from it (a data-plane round trip, no directory
 * lookup).  Objects up to CFX_EAGER_MAX bytes (at most 4064) come back from a
 * complete holder in one message.  cfx_context_stats() counts directory
 * lookups (dir_lookups) and cache hits (loc_hits, loc_stale).
 *
 * Thread safety: any thread may call these concurrently on one context.
 */
#ifndef CONFLUX_OBJECT_H
#define CONFLUX_OBJECT_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/visibility.h>
#include <conflux/mem.h>
#include <conflux/reduce.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cfx_context;
struct cfx_request;

#define CFX_OBJECT_ID_LEN 20
#define CFX_OBJECT_ID_HEX_LEN (2 * CFX_OBJECT_ID_LEN + 1) /* with NUL */
#define CFX_OBJECT_INLINE_MAX (64u * 1024)  /* objects up to this travel via the coordinator */

struct cfx_object_id {
    uint8_t bytes[CFX_OBJECT_ID_LEN];
};

/** Id from a user-chosen name (SHA-1 of the name; same name, same id). */
CFX_API int cfx_object_id_from_name(const char *name, struct cfx_object_id *out);

/** A fresh id unique in the cluster (node id, counter, random bits). */
CFX_API int cfx_object_id_generate(struct cfx_context *ctx, struct cfx_object_id *out);

/** Hex text of an id into @p buf (at least CFX_OBJECT_ID_HEX_LEN bytes). */
CFX_API void cfx_object_id_to_hex(const struct cfx_object_id *id, char *buf);

/** Parse 40 hex digits. @return CFX_OK or CFX_ERR_INVALID. */
CFX_API int cfx_object_id_from_hex(const char *hex, struct cfx_object_id *out);

enum cfx_obj_param_field {
    CFX_OBJ_PARAM_TIMEOUT    = 1u << 0,
    CFX_OBJ_PARAM_MEMTYPE    = 1u << 1,
    CFX_OBJ_PARAM_CHUNK_SIZE = 1u << 2,
    CFX_OBJ_PARAM_FLAGS      = 1u << 3,
    CFX_OBJ_PARAM_PLACE      = 1u << 4,
};
/* The fields this library knows: a field_mask bit outside them (a field of a
 * newer header) fails the call with CFX_ERR_UNSUPPORTED, not ignored. */
#define CFX_OBJ_PARAM_ALL                                                                  \
    ((uint64_t)(CFX_OBJ_PARAM_TIMEOUT | CFX_OBJ_PARAM_MEMTYPE | CFX_OBJ_PARAM_CHUNK_SIZE | \
                CFX_OBJ_PARAM_FLAGS | CFX_OBJ_PARAM_PLACE))

enum cfx_obj_flags {
    /* put: serve the object through the data plane even when it is small
     * enough to travel inline through the coordinator */
    CFX_OBJ_FLAG_NO_INLINE = 1u << 0,
    /* cfx_get: keep no copy in the caller's buffer; it is the caller's
     * again when the get returns (see ownership) */
    CFX_OBJ_FLAG_NO_KEEP = 1u << 1,
    /* cfx_reduce_objects: every node holding an input reads the result (an
     * allreduce): the reduce leaves a complete copy on each (see there) */
    CFX_OBJ_FLAG_ALLREDUCE = 1u << 2,
};

struct cfx_task_needs; /* conflux/task.h */

/** The chunk sizes a put, a context (CFX_CHUNK_SIZE) or a tool accepts. */
#define CFX_CHUNK_SIZE_MIN (4u * 1024)
#define CFX_CHUNK_SIZE_MAX (64u * 1024 * 1024)

struct cfx_obj_params {
    uint64_t field_mask;          /* which fields are set (CFX_OBJ_PARAM_*); a bit this
                                   * library does not know: CFX_ERR_UNSUPPORTED */
    int timeout_ms;               /* deadline; default the context's; <0 = forever; 0 (or
                                   * less than a round trip to the coordinator): a get
                                   * finds only a copy held on this node */
    enum cfx_memtype memtype;     /* memory type of the buffer; default host */
    size_t chunk_size;            /* put: chunk size for this object */
    uint64_t flags;               /* CFX_OBJ_FLAG_* */
    const struct cfx_task_needs *place; /* cfx_reduce_objects: what the node that
                                           produces the result must meet */
};

/**
 * Publish @p size bytes at @p buf as object @p id (zero-copy: see ownership);
 * this node becomes its putter (see the lifecycle).
 * @return CFX_OK; CFX_ERR_EXISTS if @p id exists (put by any node, and
 *         neither deleted by its putter nor gone with its last complete
 *         copy; cfx_last_error() names the putter), or its putter's
 *         delete has not returned yet (it names the holders that delete
 *         waits for), or this node holds a copy of it;
 *         CFX_ERR_INVALID (NULL ctx/id, NULL buf with size > 0);
 *         CFX_ERR_TOO_BIG when @p size is beyond the largest object (64 TiB);
 *         CFX_ERR_CONNECT when the coordinator was unreachable until the
 *         deadline (named in cfx_last_error()); CFX_ERR_TIMEOUT when it did
 *         not answer in time.  A put that failed is withdrawn from the
 *         directory should it have taken it after all (this costs the
 *         failed call one more round trip to the coordinator, 2 s at most).
 */
CFX_API int cfx_put(struct cfx_context *ctx, const struct cfx_object_id *id,
                    const void *buf, size_t size, const struct cfx_obj_params *params);

/**
 * Fetch object @p id into @p buf of @p capacity bytes; the object's size is
 * stored in @p size_out (may be NULL).  Waits for a holder to appear until the
 * deadline.
 * @return CFX_OK; CFX_ERR_TIMEOUT when no holder appeared or the transfer did
 *         not finish in time (an id whose object went before the get began,
 *         its putter gone or its delete done, is waited for as any other,
 *         and cfx_last_error() then says who put it and why it went; that
 *         wait ends up to a tenth, at most 100 ms, sooner, for the answer to
 *         come in time); CFX_ERR_TRUNCATED when capacity < size (size_out
 *         still set); CFX_ERR_PEER_FAILED when every source died, or when
 *         the object went while it was being got (its putter left with no
 *         complete copy anywhere, or deleted it: cfx_last_error() says
 *         which, naming the putter node);
 *         CFX_ERR_CONNECT when a holder had to be looked up and the
 *         coordinator was unreachable until the deadline (named in
 *         cfx_last_error()); CFX_ERR_CANCELED when the thread's interrupt
 *         check ended it (cfx_set_interrupt_check(): nothing lands in
 *         @p buf once it returned).
 */
CFX_API int cfx_get(struct cfx_context *ctx, const struct cfx_object_id *id,
                    void *buf, size_t capacity, size_t *size_out,
                    const struct cfx_obj_params *params);

/**
 * As cfx_get() into a fresh arena buffer, released with cfx_buf_free().
 * This node keeps the object in that buffer and serves it from there:
 * leave the bytes unchanged until cfx_buf_free() (which also withdraws this
 * node's copy) or cfx_delete() of @p id.  After a cfx_delete() the buffer is
 * still the caller's, bytes unchanged, until its cfx_buf_free().
 */
CFX_API int cfx_get_alloc(struct cfx_context *ctx, const struct cfx_object_id *id,
                          void **buf_out, size_t *size_out,
                          const struct cfx_obj_params *params);

/**
 * Stop holding @p id on this node and withdraw it from the directory: the
 * putter's delete ends the object everywhere (see the lifecycle), another
 * node's delete withdraws its own copy.  Waits for uploads of it to other
 * nodes in progress to finish, up to the deadline; those still running
 * then are stopped (their getters go on at another holder, or fail when
 * the object went with this delete) and waited for, up to 2 s past the
 * deadline, to let go of the buffer.  Complete when it returns: the
 * buffer is the caller's again and the id may be put at once.
 * @return CFX_OK (also when uploads were stopped at the deadline);
 *         CFX_ERR_NOT_FOUND when this node holds no copy;
 *         CFX_ERR_TIMEOUT when the uploads stopped at the deadline had
 *         not let go of the buffer 2 s later (cfx_last_error() says so):
 *         the buffer is not the caller's yet; a later delete of the id waits for that copy to
 *         go (up to its own deadline; a context destroy on another
 *         thread ends the wait, CFX_ERR_CANCELED) before it answers;
 *         CFX_ERR_CONNECT
 *         when the coordinator was unreachable until the deadline (named in
 *         cfx_last_error()): this node's copy is released all the same, and
 *         the object is not announced again should the coordinator return.
 */
CFX_API int cfx_delete(struct cfx_context *ctx, const struct cfx_object_id *id,
                       const struct cfx_obj_params *params);

/**
 * Reduce objects (Hoplite style): @p result = @p op over the first @p k of the
 * @p n input objects to become available, element-wise as @p dtype.
 *
 * The inputs stay where they were put.  Their holders form a reduction tree
 * in the order the inputs become ready — a chain for large objects, a
 * binomial tree for small ones, chosen from the object size and the measured
 * bandwidth and latency (CFX_REDUCE_SHAPE=chain|tree overrides) — and stream
 * chunk by chunk, reducing each chunk as it lands.  Late inputs are fine:
 * the reduce waits for k of them until the deadline.  All inputs must have
 * the same size, a multiple of the dtype size, and the same chunk size.
 *
 * Where the result goes: it is produced (and announced; any node may
 * cfx_get() it) on a node holding one of the k inputs reduced, the root of
 * the tree, which the coordinator's placement chooses among those holders
 * (at most the first CFX_TASK_NODES_MAX of them): the one holding most
 * bytes of the inputs, then the calling node (it reads the result next),
 * then the least loaded, with the memory for the result free (as its last
 * heartbeat reported it: a node that has sent none yet, in its first
 * second or so, is not known to be short and may be chosen).  With
 * CFX_OBJ_PARAM_PLACE, @p params->place narrows the choice (conflux/task.h:
 * a node set, memory, GPUs, spread or pack, an anti-affinity group; cores
 * and reserve_ms do not apply); no holder meeting it is CFX_ERR_NO_RESOURCE.
 * Inputs of up to CFX_OBJECT_INLINE_MAX bytes put without
 * CFX_OBJ_FLAG_NO_INLINE are kept by the coordinator and fetched by the
 * calling node, which is then the holder the choice sees.
 * Without it, a coordinator that cannot answer leaves the result on the
 * holder of the last input to become ready.
 *
 * An allreduce (CFX_OBJ_FLAG_ALLREDUCE in @p params->flags): the holders of
 * the inputs all read the result.  When k = n, no placement is asked for,
 * the inputs are held on more than one host, and the object has at least
 * two chunks for each node holding one, the result is cut into stripes, one
 * per node (up to 32); each stripe is reduced along a chain that ends on its
 * own node, and every node gathers the other stripes from the node before it,
 * as they are reduced, into a complete copy of the result (reduce-scatter,
 * then allgather round the nodes: each node sends and receives 2(m-1)/m of
 * the object for m nodes, where a reduce followed by gets sends up to twice
 * the object).  The copy on this node, or on the last input's node when
 * this node holds none, is the result's put; the others are copies of it,
 * so a cfx_get() there is a local copy.  They appear once every node has
 * its copy; until then a get there waits for it.  Should any of it fail (a
 * participant dies), nothing of it stays and the plain plan runs instead,
 * within the same deadline.  Within one host (CFX_REDUCE_SHAPE=striped
 * forces it) and otherwise the flag changes nothing.
 *
 * @param used  NULL, or k entries that receive the indices (into @p inputs)
 *              of the inputs reduced, in the order they became ready.
 * @return CFX_OK once the result is complete; CFX_ERR_TIMEOUT when fewer than
 *         k inputs appeared in time (cfx_last_error() names the missing ones),
 *         or when they had and the result was not complete by the deadline:
 *         the tree then runs on, as a task does after its waiter gave up, and
 *         the result may appear later (a cfx_get() of it may still succeed,
 *         and a reduce into the same id again then fails CFX_ERR_EXISTS: a
 *         retry takes a new result id);
 *         CFX_ERR_INVALID for bad arguments or inputs of different sizes;
 *         CFX_ERR_EXISTS when @p result names an object already (put before
 *         the reduce, or while it ran: that object stays the only one
 *         under the id, on every node);
 *         CFX_ERR_PEER_FAILED naming the node when a participant died;
 *         CFX_ERR_NO_RESOURCE when no holder of a ready input meets
 *         @p params->place (named in cfx_last_error()).
 */
CFX_API int cfx_reduce_objects(struct cfx_context *ctx, const struct cfx_object_id *inputs,
                               size_t n, size_t k, enum cfx_dtype dtype, enum cfx_redop op,
                               const struct cfx_object_id *result,
                               const struct cfx_obj_params *params, size_t *used);

/* Non-blocking variants.  On CFX_OK *req is set and must be freed with
 * cfx_request_free() after it completes; on error no request exists.
 * Each runs on a worker thread of the context, one started for each
 * request that finds none idle (up to 64), so a request does not wait
 * behind others that wait; beyond that it waits in a queue, its deadline
 * counted from the call (CFX_ERR_TIMEOUT saying so when it passes there). */
CFX_API int cfx_put_nb(struct cfx_context *ctx, const struct cfx_object_id *id,
                       const void *buf, size_t size, const struct cfx_obj_params *params,
                       struct cfx_request **req);
CFX_API int cfx_get_nb(struct cfx_context *ctx, const struct cfx_object_id *id,
                       void *buf, size_t capacity, const struct cfx_obj_params *params,
                       struct cfx_request **req);

/**
 * CFX_ERR_AGAIN while in progress, else the final status.  A request that
 * failed gives its operation's detail (the peer, the object, the deadline)
 * in the calling thread's cfx_last_error(), as the blocking call would:
 * this holds for cfx_request_wait() and for the group calls' requests too.
 */
CFX_API int cfx_request_test(struct cfx_request *req);

/** Wait until done or @p timeout_ms passes (<0 = forever); CFX_ERR_TIMEOUT then. */
CFX_API int cfx_request_wait(struct cfx_request *req, int timeout_ms);

/**
 * How far @p req has got, in bytes: @p done of @p total.  Thread-safe and
 * non-blocking (a short section under the context's lock; it drives no
 * transport and waits for nothing), so any thread may ask while another
 * tests, waits on or runs the request.
 *  - cfx_get_nb(): @p done is the prefix of the object landed in order in
 *    the caller's buffer (whole chunks, as a partial holder would serve
 *    them), @p total the object's size; done == total once it completed.
 *    A get of device memory counts what landed in its host staging buffer
 *    (copied on to the device as it lands).  Another get of the same id
 *    on this node that started first fills its own buffer, and this one
 *    copies from it at the end: done stays 0 until then.
 *  - cfx_put_nb(): total is the size put; done is 0 until the directory
 *    knows the object (the put is zero-copy: publishing it is the work),
 *    then the size.
 *  - requests of the group calls (cfx_group_i*): CFX_ERR_UNSUPPORTED.
 * @return CFX_OK with both counts set; CFX_ERR_AGAIN while a get has no
 *         size yet (it is still looking up a source; both counts 0);
 *         the request's own error once it failed (counts 0);
 *         CFX_ERR_INVALID for a NULL argument; CFX_ERR_UNSUPPORTED (above).
 */
CFX_API int cfx_request_progress(struct cfx_request *req, uint64_t *done, uint64_t *total);

/** Object size known to the request (valid once complete). */
CFX_API size_t cfx_request_size(const struct cfx_request *req);

/** Free a completed request; a request still running is canceled first. NULL: no-op.
 *  (A group collective's request: include/conflux/group.h.)
 *  A get that may be writing its buffer is withdrawn before this returns
 *  (the holder's writes land nothing from then on), so the buffer is the
 *  caller's again, and no copy of this node's (also when its last bytes
 *  landed meanwhile); one still waiting for the directory is let go at once
 *  (it writes nothing after).  A put or get still queued behind others
 *  never runs; a put running runs on to its end (its buffer is served
 *  until cfx_delete(), as ever).  A get that completed before the free
 *  (its test or wait would have said CFX_OK, which a caller that frees it
 *  unasked cannot know) keeps its copy in the buffer, as a cfx_get()
 *  does: to have the buffer back either way, get with
 *  CFX_OBJ_FLAG_NO_KEEP, or cfx_delete() the id after the free
 *  (CFX_ERR_NOT_FOUND: no copy stayed).  As with free(), a request freed
 *  once is gone: freeing or using it again is undefined. */
CFX_API void cfx_request_free(struct cfx_request *req);

#ifdef __cplusplus
}
#endif
#endif

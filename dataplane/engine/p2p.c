/* Point-to-point messages: see p2p.h. */
#include "p2p.h"

#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gpu/memtype.h"
#include "object.h"

#define P2P_CANCEL_GRACE_MS 1000
#define P2P_DRAIN_POLL_MS   20 /* a withdrawn send looks at its writes in flight */
#define DEATH_GRACE_MS      300 /* see cfx__p2p_wait_watch() */

struct cfx_p2p_req {
    struct cfx_context *ctx;
    struct cfx_obj *obj;        /* anonymous object: buffer, registration */
    struct cfx_xfer_in in;      /* receive state */
    uint8_t kind;               /* CFX_P2P_SEND / CFX_P2P_RECV */
    uint32_t peer;
    uint32_t tag;
    uint32_t self_id;           /* this node's id (its control client's) when posted */
};

/*
 * A request and its anonymous object in one block, the object first: an
 * eager message's block goes back to the context's free list when the
 * request is freed (no malloc/free per message); a block whose object is
 * handed to the release path (rendezvous, or withdrawn) is freed there by
 * free(obj), which frees the request with it.  The bitmap is allocated
 * with the block, P2P_BITMAP_WORDS at least, and stays with it in the list.
 */
struct p2p_block {
    struct cfx_obj obj; /* first: free(&obj) frees the block */
    struct cfx_p2p_req req;
};

#define P2P_BITMAP_WORDS 2 /* (nchunks + 63) / 64 + 1 for a message of one chunk */

/* ctx->lock held: a block from the free list for a message of @p len bytes
 * in chunks of @p chunk, or NULL when the list is empty. */
static struct p2p_block *block_take(struct cfx_context *ctx, uint64_t len, uint32_t chunk)
{
    uint32_t nchunks = cfx__nchunks(len, chunk);
    if (cfx_list_empty(&ctx->p2p_cache) || (nchunks + 63) / 64 + 1 > P2P_BITMAP_WORDS)
        return NULL;
    struct p2p_block *b = cfx_list_entry(ctx->p2p_cache.next, struct p2p_block, obj.p2p_link);
    cfx_list_del(&b->obj.p2p_link);
    ctx->p2p_ncached--;
    uint64_t *bitmap = b->obj.bitmap;
    memset(b, 0, sizeof(*b));
    memset(bitmap, 0, P2P_BITMAP_WORDS * sizeof(uint64_t));
    b->obj.bitmap = bitmap;
    b->obj.size = len;
    b->obj.chunk_size = chunk;
    b->obj.nchunks = nchunks;
    b->obj.shm_fd = -1;
    cfx_list_init(&b->obj.uploads);
    cfx_list_init(&b->obj.p2p_link);
    return b;
}

/* A fresh block (as cfx__obj_alloc, with the request behind the object). */
static struct p2p_block *block_alloc(uint64_t len, uint32_t chunk)
{
    struct p2p_block *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->obj.size = len;
    b->obj.chunk_size = chunk;
    b->obj.nchunks = cfx__nchunks(len, chunk);
    b->obj.shm_fd = -1;
    cfx_list_init(&b->obj.uploads);
    cfx_list_init(&b->obj.p2p_link);
    b->obj.bitmap =
        calloc(CFX_MAX((b->obj.nchunks + 63) / 64 + 1, P2P_BITMAP_WORDS), sizeof(uint64_t));
    if (!b->obj.bitmap) {
        free(b);
        return NULL;
    }
    return b;
}

static void block_free(struct p2p_block *b)
{
    if (b->obj.heap)
        free(b->obj.buf); /* a detached send's copy */
    free(b->obj.bitmap);
    free(b);
}

/* ctx->lock held: a block nothing refers to any more goes back to the free
 * list; false: the list is full, the caller frees it (block_free). */
static bool block_put(struct cfx_context *ctx, struct p2p_block *b)
{
    if (b->obj.heap) {
        free(b->obj.buf);
        b->obj.heap = false;
    }
    if (ctx->p2p_ncached >= CFX_FREE_LIST_MAX)
        return false;
    cfx_list_add_head(&b->obj.p2p_link, &ctx->p2p_cache); /* the warmest first */
    ctx->p2p_ncached++;
    return true;
}

void cfx__p2p_cache_destroy(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->p2p_cache)
    {
        cfx_list_del(pos);
        block_free(cfx_list_entry(pos, struct p2p_block, obj.p2p_link));
    }
    ctx->p2p_ncached = 0;
}

/* ---- progress thread (ctx->lock held) ------------------------------------- */

static bool p2p_match(const struct cfx_obj *obj, uint32_t node, const struct cfx_dp_get_req *r)
{
    return obj->peer_node == node && obj->chan == r->chan && obj->tag == r->tag;
}

/* A send of @p r's key is in limbo: it took a receive that withdrew, and
 * whether it goes on to the next receive is not known yet (its upload stops
 * and drains, or it awaits the receiver's CANCEL_DONE).  A request for the
 * key waits until that is known: a later send of the key must not pass it
 * (a receive given up after its grace comes back with its next request
 * before its sender read the CANCEL). */
static bool key_in_limbo(struct cfx_context *ctx, struct cfx_conn *conn,
                         const struct cfx_dp_get_req *r)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->p2p_awaits)
        if (p2p_match(cfx_list_entry(pos, struct cfx_obj, p2p_link), conn->node_id, r))
            return true;
    cfx_list_for_each(pos, &conn->uploads) {
        const struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, conn_link);
        /* (a CANCEL held by the test hook counts as read: it came first) */
        if ((up->canceled || up->cancel_held) && up->obj->p2p == CFX_P2P_SEND &&
            p2p_match(up->obj, conn->node_id, r))
            return true;
    }
    return false;
}

/* A receiver asks for a message: serve a posted send, or keep the request. */
void cfx__p2p_rtr(struct cfx_context *ctx, struct cfx_conn *conn,
                  const struct cfx_dp_get_req *req)
{
    struct cfx_list *pos;
    if (key_in_limbo(ctx, conn, req))
        goto keep;
    cfx_list_for_each(pos, &ctx->p2p_sends) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (!p2p_match(obj, conn->node_id, req))
            continue;
        cfx_list_del(&obj->p2p_link);
        if (obj->size != req->size) {
            CFX_LOG(WARN, P2P, "node %u: %s wants %" PRIu64 " bytes on tag %d, we send %" PRIu64,
                    ctx->node_id, conn->name, req->size, (int)req->tag, obj->size);
            struct cfx_dp_nack n = {
                .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                         .type = CFX_DP_GET_NACK, .slot = req->hdr.slot },
                .status = CFX_ERR_INVALID,
            };
            cfx__conn_send(conn, &n, sizeof(n));
            cfx__status_set(&obj->p2p_status, CFX_ERR_INVALID);
            pthread_cond_broadcast(&ctx->obj_cond);
            return;
        }
        /* the receiver's chunking rules */
        obj->chunk_size = req->chunk_size;
        obj->nchunks = cfx__nchunks(obj->size, obj->chunk_size);
        obj->ready_chunks = obj->nchunks;
        cfx__xfer_upload_start(ctx, conn, obj, req);
        return;
    }
keep:
    /* Kept until a send matches it.  A receiver asks once per receive, and
     * each of its receives takes one of its CFX_XFER_SLOTS transfer slots:
     * a peer with more waiting here is not one (each costs memory and a
     * step of every later send's match). */
    if (conn->p2p_rtrs >= CFX_XFER_SLOTS) {
        char why[128];
        snprintf(why, sizeof(why), "%u receive requests wait for sends here, more than a "
                 "receiver has transfer slots (%u)", conn->p2p_rtrs + 1, CFX_XFER_SLOTS);
        cfx__conn_fail(conn, CFX_ERR_PROTO, why);
        return;
    }
    struct cfx_p2p_rtr *rtr = malloc(sizeof(*rtr));
    if (!rtr) {
        cfx__conn_fail(conn, CFX_ERR_NOMEM, "out of memory queueing a receive request");
        return;
    }
    rtr->conn = conn;
    rtr->req = *req;
    cfx_list_add_tail(&rtr->link, &ctx->p2p_rtrs);
    conn->p2p_rtrs++;
}

/* @p obj is on ctx->p2p_sends: a request of its receiver's that came before
 * it takes it, re-run as if it had just arrived (one matching path).  A
 * queued request means no send of its key was queued when it came, so the
 * send it matches is @p obj. */
static bool take_queued_rtr(struct cfx_context *ctx, struct cfx_obj *obj)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->p2p_rtrs) {
        struct cfx_p2p_rtr *rtr = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
        if (!p2p_match(obj, rtr->conn->node_id, &rtr->req))
            continue;
        if (rtr->conn->state == CFX_CONN_FAILED || key_in_limbo(ctx, rtr->conn, &rtr->req))
            return false; /* it waits, first of its key still (or goes with its connection) */
        cfx_list_del(&rtr->link);
        rtr->conn->p2p_rtrs--;
        cfx__p2p_rtr(ctx, rtr->conn, &rtr->req);
        free(rtr);
        return true;
    }
    return false;
}

/* The send @p obj, in limbo (key_in_limbo), ended instead of going on: the
 * requests its key kept meanwhile take the sends queued behind it, in order. */
void cfx__p2p_limbo_over(struct cfx_context *ctx, const struct cfx_obj *obj)
{
    for (;;) {
        struct cfx_obj *next = NULL;
        struct cfx_list *pos;
        cfx_list_for_each(pos, &ctx->p2p_sends) {
            struct cfx_obj *o = cfx_list_entry(pos, struct cfx_obj, p2p_link);
            if (o->peer_node == obj->peer_node && o->chan == obj->chan && o->tag == obj->tag) {
                next = o;
                break;
            }
        }
        if (!next || !take_queued_rtr(ctx, next))
            return; /* no send or no request of the key waits, or it is in limbo again */
    }
}

void cfx__p2p_send_post(struct cfx_context *ctx, struct cfx_obj *obj)
{
    cfx_list_add_tail(&obj->p2p_link, &ctx->p2p_sends);
    take_queued_rtr(ctx, obj);
}

void cfx__p2p_send_cancel(struct cfx_context *ctx, struct cfx_obj *obj)
{
    if (obj->p2p_status != CFX_ERR_AGAIN)
        return;
    if (cfx_list_empty(&obj->uploads)) {
        /* not matched yet, or awaiting its receiver's CANCEL_DONE */
        cfx_list_del(&obj->p2p_link);
        obj->await_slot = 0;
        cfx__status_set(&obj->p2p_status, CFX_ERR_CANCELED);
        cfx__p2p_limbo_over(ctx, obj);
        pthread_cond_broadcast(&ctx->obj_cond);
        return;
    }
    /* matched and writing: stop; the receiver is told once writes drain
     * (an idle upload, e.g. waiting for credits, ends at once) */
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &obj->uploads)
        cfx__xfer_upload_abort(ctx, cfx_list_entry(pos, struct cfx_upload, obj_link));
}

/* The receive that matched @p obj (a cfx__p2p_isend_reoffer send) was
 * withdrawn before any of it landed (CANCEL_UNSEEN), and the upload drained:
 * the message is offered again as if never matched, ahead of the later
 * sends of its key (they were posted after it), to the next request of the
 * receiver's. */
void cfx__p2p_send_reoffer(struct cfx_context *ctx, struct cfx_obj *obj)
{
    ctx->n_sends_reoffered++;
    cfx_list_add_head(&obj->p2p_link, &ctx->p2p_sends);
    take_queued_rtr(ctx, obj);
}

/* @p obj (a send) was written whole, but its receive withdrew before it
 * heard so: whether the receiver took it comes in its CANCEL_DONE for
 * @p slot (it does not when it gave the receive up after its grace: the
 * writes landed nowhere).  The send waits for that, still running. */
void cfx__p2p_send_await(struct cfx_context *ctx, struct cfx_obj *obj, uint32_t slot,
                         bool unseen)
{
    obj->await_slot = slot + 1;
    obj->await_unseen = unseen;
    cfx_list_add_tail(&obj->p2p_link, &ctx->p2p_awaits);
}

/* The CANCEL_DONE of node @p node's slot @p slot (UINT32_MAX: every one of
 * the node's, its connection failed): a send awaiting it completes (taken),
 * goes on to the next receive (dropped, none of it having landed when the
 * receive withdrew; a group's send), or fails. */
void cfx__p2p_cancel_done(struct cfx_context *ctx, uint32_t node, uint32_t slot, int status)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->p2p_awaits) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (obj->peer_node != node || (slot != UINT32_MAX && obj->await_slot != slot + 1))
            continue;
        cfx_list_del(&obj->p2p_link);
        obj->await_slot = 0;
        if (status != CFX_OK && status != CFX_ERR_PEER_FAILED && obj->reoffer &&
            obj->await_unseen) {
            cfx__p2p_send_reoffer(ctx, obj);
        } else {
            cfx__status_set(&obj->p2p_status, status == CFX_OK || status == CFX_ERR_PEER_FAILED
                                                  ? status : CFX_ERR_CANCELED);
            cfx__p2p_limbo_over(ctx, obj);
        }
        pthread_cond_broadcast(&ctx->obj_cond);
        if (slot != UINT32_MAX)
            return;
    }
}

void cfx__p2p_node_dead(struct cfx_context *ctx, uint32_t node_id)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->p2p_sends) {
        struct cfx_obj *obj = cfx_list_entry(pos, struct cfx_obj, p2p_link);
        if (obj->peer_node != node_id)
            continue;
        cfx_list_del(&obj->p2p_link);
        cfx__status_set(&obj->p2p_status, CFX_ERR_PEER_FAILED);
        pthread_cond_broadcast(&ctx->obj_cond);
    }
    cfx__p2p_cancel_done(ctx, node_id, UINT32_MAX, CFX_ERR_PEER_FAILED);
}

/* ---- API side ---------------------------------------------------------------- */

enum {
    P2P_MORE = 1u << 0,    /* cfx__p2p_isend_more */
    P2P_URGENT = 1u << 1,  /* cfx__p2p_isend_urgent */
    P2P_REOFFER = 1u << 2, /* cfx__p2p_isend_reoffer */
};

static int p2p_new(struct cfx_context *ctx, uint8_t kind, const struct cfx_node_rec *peer,
                   uint64_t chan, uint32_t tag, void *buf, size_t len, enum cfx_memtype mt,
                   unsigned flags, uint16_t batch, struct cfx_p2p_req **out)
{
    if (!ctx || !peer || !out || (!buf && len))
        return cfx__err(CFX_ERR_INVALID, "%s: NULL argument",
                        kind == CFX_P2P_SEND ? "send" : "recv");
    if (mt != CFX_MEMTYPE_HOST && mt != CFX_MEMTYPE_CUDA)
        return cfx__err(CFX_ERR_INVALID, "unknown memory type %d", (int)mt);
    /* beyond it no chunk size fits the chunk numbers (it came out 0) */
    if (len > CFX_XFER_SIZE_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "%s %zu bytes %s node %u: larger than a message "
                        "may be (%llu bytes)", kind == CFX_P2P_SEND ? "send of" : "receive of",
                        len, kind == CFX_P2P_SEND ? "to" : "from", peer->node_id,
                        CFX_XFER_SIZE_MAX);
    uint32_t chunk = cfx__chunk_size_for(len, ctx->cfg.chunk_size);
    pthread_mutex_lock(&ctx->lock);
    struct p2p_block *b = block_take(ctx, len, chunk);
    if (!b) {
        pthread_mutex_unlock(&ctx->lock);
        b = block_alloc(len, chunk);
        if (!b)
            return cfx__err(CFX_ERR_NOMEM, "out of memory for a message");
        pthread_mutex_lock(&ctx->lock);
    }
    struct cfx_p2p_req *req = &b->req;
    struct cfx_obj *obj = &b->obj;
    obj->buf = buf;
    obj->memtype = mt;
    obj->p2p = kind;
    obj->peer_node = peer->node_id;
    obj->chan = chan;
    obj->tag = tag;
    obj->urgent = flags & P2P_URGENT;
    obj->reoffer = flags & P2P_REOFFER;
    obj->eager_batch = batch;
    cfx__status_set(&obj->p2p_status, CFX_ERR_AGAIN);
    cfx_list_init(&obj->p2p_link);
    req->ctx = ctx;
    req->obj = obj;
    req->kind = kind;
    req->peer = peer->node_id;
    req->tag = tag;
    req->self_id = cfx__ctl_node_id(ctx->ctl);

    /* With the progress lock free, this thread posts the message itself:
     * an eager send is copied into the transport before we return, with no
     * command, no eventfd and no progress-thread wake-up.  Commands other
     * threads queued meanwhile run first (in posting order). */
    bool drive = cfx__progress_trylock(ctx);
    cfx__arena_lookup(ctx, buf, &obj->shm_fd, &obj->shm_off);
    int rc;
    if (kind == CFX_P2P_SEND) {
        /* eager or rendezvous: decided by the receiver's threshold when the
         * command runs (eager.c) */
        obj->complete = true;
        obj->ready_chunks = obj->nchunks;
        if (drive) {
            /* we drive: what others queued first, then ours, with no
             * command to allocate, queue and free */
            cfx__progress_run_cmds(ctx);
            cfx__eager_send_post(ctx, obj, peer, flags & P2P_MORE);
            rc = CFX_OK;
        } else {
            rc = cfx__cmd_new(ctx, CFX_CMD_P2P_SEND, obj, peer);
        }
    } else {
        req->in.obj = obj;
        cfx__status_set(&req->in.status, CFX_ERR_AGAIN);
        req->in.src_node = peer->node_id;
        obj->in = &req->in;
        if (cfx__eager_class(len, ctx->cfg.eager_max))
            rc = cfx__eager_recv_post(ctx, obj, &req->in); /* no transport: right here */
        else
            rc = cfx__cmd_new(ctx, CFX_CMD_GET_START, obj, peer);
    }
    if (drive) {
        cfx__progress_run_cmds(ctx);
        cfx__progress_unlock(ctx);
    }
    pthread_mutex_unlock(&ctx->lock);
    if (rc != CFX_OK) {
        block_free(b);
        return cfx__err(rc, "out of memory posting a message");
    }
    *out = req;
    return CFX_OK;
}

int cfx__p2p_isend(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                   uint32_t tag, const void *buf, size_t len, enum cfx_memtype mt,
                   struct cfx_p2p_req **out)
{
    return p2p_new(ctx, CFX_P2P_SEND, peer, chan, tag, (void *)buf, len, mt, 0, 0, out);
}

int cfx__p2p_isend_reoffer(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                           uint64_t chan, uint32_t tag, const void *buf, size_t len,
                           enum cfx_memtype mt, struct cfx_p2p_req **out)
{
    return p2p_new(ctx, CFX_P2P_SEND, peer, chan, tag, (void *)buf, len, mt, P2P_REOFFER, 0,
                   out);
}

int cfx__p2p_isend_more(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                        uint32_t tag, const void *buf, size_t len, struct cfx_p2p_req **out)
{
    return p2p_new(ctx, CFX_P2P_SEND, peer, chan, tag, (void *)buf, len, CFX_MEMTYPE_HOST,
                   P2P_MORE, 0, out);
}

int cfx__p2p_isend_batch(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                         uint64_t chan, uint32_t tag, const void *buf, size_t len, int n,
                         struct cfx_p2p_req **out)
{
    if (n < 2 || n > UINT16_MAX)
        return cfx__err(CFX_ERR_INVALID, "a batch of %d sends", n);
    return p2p_new(ctx, CFX_P2P_SEND, peer, chan, tag, (void *)buf, len, CFX_MEMTYPE_HOST,
                   P2P_MORE, (uint16_t)n, out);
}

int cfx__p2p_isend_urgent(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                          uint64_t chan, uint32_t tag, const void *buf, size_t len,
                          struct cfx_p2p_req **out)
{
    return p2p_new(ctx, CFX_P2P_SEND, peer, chan, tag, (void *)buf, len, CFX_MEMTYPE_HOST,
                   P2P_URGENT, 0, out);
}

int cfx__p2p_irecv(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                   uint32_t tag, void *buf, size_t len, enum cfx_memtype mt,
                   struct cfx_p2p_req **out)
{
    return p2p_new(ctx, CFX_P2P_RECV, peer, chan, tag, buf, len, mt, 0, 0, out);
}

/* ctx->lock held */
static int p2p_status(const struct cfx_p2p_req *req)
{
    return req->kind == CFX_P2P_SEND ? req->obj->p2p_status : req->in.status;
}

/* Caller-driven progress while @p req runs (cfx__progress_poll_wait):
 * returns with ctx->lock held, the polling handed back. */
static void poll_wait(const struct cfx_p2p_req *req, uint64_t deadline_ns)
{
    cfx__progress_poll_wait(req->ctx,
                            req->kind == CFX_P2P_SEND ? &req->obj->p2p_status : &req->in.status,
                            deadline_ns);
}

int cfx__p2p_test(struct cfx_p2p_req *req)
{
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "test of a NULL message request");
    const int *st_p = req->kind == CFX_P2P_SEND ? &req->obj->p2p_status : &req->in.status;
    /* a caller that only tests must still move its message along */
    if (__atomic_load_n(st_p, __ATOMIC_ACQUIRE) == CFX_ERR_AGAIN)
        cfx__progress_test_pass(req->ctx);
    pthread_mutex_lock(&req->ctx->lock);
    int st = p2p_status(req);
    pthread_mutex_unlock(&req->ctx->lock);
    return st;
}

/* ctx->lock not held. */
static void describe(const struct cfx_p2p_req *req, int st)
{
    if (st == CFX_ERR_PEER_FAILED) {
        /* what the coordinator said of the peer, when it did */
        pthread_mutex_lock(&req->ctx->lock);
        int gone = cfx__node_gone(req->ctx, req->peer);
        pthread_mutex_unlock(&req->ctx->lock);
        if (gone) {
            cfx__err(st, "%s node %u (tag %d) failed: node %u %s", req->kind == CFX_P2P_SEND
                     ? "send to" : "receive from", req->peer, (int)req->tag, req->peer,
                     gone == CFX_NODE_LEFT ? "left the cluster"
                                           : "died (the coordinator reported it)");
            return;
        }
    }
    if (st == CFX_ERR_TIMEOUT)
        cfx__err(st, "%s node %u (tag %d) did not complete in time: %s", req->kind == CFX_P2P_SEND
                 ? "send to" : "receive from", req->peer, (int)req->tag,
                 req->kind == CFX_P2P_SEND ? "the receiver never took it"
                                           : "the sender never sent it");
    else if (st != CFX_OK)
        cfx__err(st, "%s node %u (tag %d) failed: %s", req->kind == CFX_P2P_SEND ? "send to"
                 : "receive from", req->peer, (int)req->tag,
                 st == CFX_ERR_INVALID ? "the two sides disagree on the message size"
                 /* the other side withdrew it under way (cfx__p2p_withdraw) */
                 : st == CFX_ERR_CANCELED && req->kind == CFX_P2P_SEND
                     ? "the receiver withdrew its receive while the message was under way"
                 : st == CFX_ERR_NOT_FOUND && req->kind == CFX_P2P_RECV
                     ? "the sender withdrew the message while it was under way"
                     : cfx_strerror(st));
}

int cfx__p2p_wait(struct cfx_p2p_req *req, uint64_t deadline_ns)
{
    return cfx__p2p_waitall(&req, 1, deadline_ns);
}

int cfx__node_gone(const struct cfx_context *ctx, uint32_t node)
{
    for (unsigned d = 0; d < ctx->ndead; d++)
        if (ctx->dead[d] == node)
            return CFX_NODE_DEAD;
    for (unsigned d = 0; d < ctx->nleft; d++)
        if (ctx->left[d] == node)
            return CFX_NODE_LEFT;
    return 0;
}

/* ctx->lock held: whether @p node left in good order. */
static bool node_left(const struct cfx_context *ctx, uint32_t node)
{
    return cfx__node_gone(ctx, node) == CFX_NODE_LEFT;
}

/* ctx->lock held (connections are added and removed under it too): whether
 * a connection with @p node is still open here. */
static bool conn_open_to(const struct cfx_context *ctx, uint32_t node)
{
    const struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        const struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node && c->state != CFX_CONN_FAILED)
            return true;
    }
    return false;
}

/* ctx->lock held: index in @p nodes of a node known dead or gone in good
 * order (either way it sends nothing more), or -1. */
/*
 * ctx->lock held: the index of a node of @p nodes gone for @p req, or -1.
 * One that died is; one that left in good order only when it is the peer:
 * a group member leaves once its part of the calls is done (a barrier's
 * first rank out may leave while the others still wait for each other),
 * so its leaving says nothing of a wait for a live peer.  Such a wait ended
 * 2 s after the leave (a grace for a slow peer), and a loaded machine ran
 * past it: the last rank's barrier failed naming a rank that had finished.
 * A call that the leave did break ends all the same: the ranks that wait
 * for the leaver fail and tell the others (coll_check.c, the news).
 */
static int watch_dead(struct cfx_context *ctx, const struct cfx_p2p_req *req,
                      const uint32_t *nodes, int nnodes)
{
    for (int i = 0; i < nnodes; i++) {
        int gone = cfx__node_gone(ctx, nodes[i]);
        if (gone == CFX_NODE_DEAD || (gone && nodes[i] == req->peer))
            return i;
    }
    return -1;
}

bool cfx__p2p_node_left(struct cfx_context *ctx, uint32_t node)
{
    pthread_mutex_lock(&ctx->lock);
    bool left = node_left(ctx, node);
    pthread_mutex_unlock(&ctx->lock);
    return left;
}

int cfx__p2p_status_locked(const struct cfx_p2p_req *req)
{
    return p2p_status(req);
}

int cfx__p2p_wait_watch(struct cfx_p2p_req *req, uint64_t deadline_ns, const uint32_t *nodes,
                        int nnodes, int *dead)
{
    return cfx__p2p_wait_stop(req, deadline_ns, nodes, nnodes, dead, NULL, NULL, NULL);
}

int cfx__p2p_wait_stop(struct cfx_p2p_req *req, uint64_t deadline_ns, const uint32_t *nodes,
                       int nnodes, int *dead, bool (*stop)(void *), void *arg, bool *was_stopped)
{
    struct cfx_context *ctx = req->ctx;
    int st, who = -1;
    bool stopped = false;
    *dead = -1;
    if (was_stopped)
        *was_stopped = false;
    poll_wait(req, deadline_ns);
    /* a wait that can be stopped is a collective's, which a blocking call's
     * interrupt stops as a cancel does (cfx__coll_stop) */
    while ((st = p2p_status(req)) == CFX_ERR_AGAIN &&
           (who = watch_dead(ctx, req, nodes, nnodes)) < 0 && !(stopped = stop && stop(arg)) &&
           !cfx__ctx_closing(ctx) &&
           (stop ? cfx__obj_wait_intr(ctx, deadline_ns) : cfx__obj_wait(ctx, deadline_ns)))
        ;
    if (st == CFX_ERR_AGAIN && who < 0 && !stopped && cfx__ctx_closing(ctx)) {
        pthread_mutex_unlock(&ctx->lock);
        return cfx__err(CFX_ERR_CANCELED, "%s node %u (tag %d): the context is being destroyed",
                        req->kind == CFX_P2P_SEND ? "send to" : "receive from", req->peer,
                        (int)req->tag);
    }
    if (st == CFX_ERR_AGAIN && stopped) {
        pthread_mutex_unlock(&ctx->lock);
        if (was_stopped)
            *was_stopped = true;
        return CFX_ERR_CANCELED; /* the caller says why */
    }
    if (st == CFX_ERR_AGAIN && who >= 0) {
        /* The news of a death can overtake what the node sent just before
         * it went (a rank that finished and exited): let bytes already on
         * their way land before calling the call failed. */
        uint64_t grace = cfx__deadline_ns(DEATH_GRACE_MS);
        if (grace > deadline_ns)
            grace = deadline_ns;
        while ((st = p2p_status(req)) == CFX_ERR_AGAIN && cfx__obj_wait(ctx, grace))
            ;
        /* A node that left in good order said so before it flushed what it
         * had sent (its destroy leaves the directory first, then lets its
         * sends go out for up to a second, then closes its connections), and
         * a loaded receiver may take longer than the grace to read them: as
         * long as a connection with it is open here, its last bytes may still
         * be in it.  The close is the end of them (a transport reports it
         * after the data before it); nothing signals it to this wait, so it
         * looks every 10 ms, until the deadline. */
        while (st == CFX_ERR_AGAIN && node_left(ctx, nodes[who]) &&
               conn_open_to(ctx, nodes[who]) && cfx__now_ns() < deadline_ns) {
            uint64_t nap = cfx__deadline_ns(10);
            cfx__obj_wait(ctx, nap < deadline_ns ? nap : deadline_ns);
            st = p2p_status(req);
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    if (st != CFX_ERR_AGAIN)
        who = -1;
    if (st == CFX_ERR_AGAIN && who >= 0) {
        *dead = who;
        return cfx__err(CFX_ERR_PEER_FAILED, "node %u %s", nodes[who],
                        cfx__p2p_node_left(ctx, nodes[who]) ? "left the cluster" : "died");
    }
    if (st == CFX_ERR_AGAIN)
        st = CFX_ERR_TIMEOUT;
    if (st != CFX_OK)
        describe(req, st);
    return st;
}

/* One sleep of a request's wait (ctx->lock held): false at the deadline,
 * and with @p intr (a blocking call's wait its thread's interrupt check may
 * stop) once the check fired. */
static bool wait_on(struct cfx_context *ctx, uint64_t deadline_ns, bool intr)
{
    if (!intr)
        return cfx__obj_wait(ctx, deadline_ns);
    return !cfx__intr_fired() && cfx__obj_wait_intr(ctx, deadline_ns);
}

/*
 * A group's wait (the interruptible ones): this node came back under
 * another node id since @p req was posted (its control connection was cut
 * past the heartbeat deadline: coll/group.c cfx__group_moved).  The peers
 * dropped the node it was, so nothing of the request can come any more.
 */
static bool node_moved(const struct cfx_p2p_req *req)
{
    uint32_t id = cfx__ctl_node_id(req->ctx->ctl);
    return id && id != req->self_id;
}

static int moved_err(const struct cfx_p2p_req *req)
{
    return cfx__err(CFX_ERR_PEER_FAILED, "%s node %u (tag %d): this node came back as node %u "
                    "(it was node %u), whom the peer does not know", req->kind == CFX_P2P_SEND
                    ? "send to" : "receive from", req->peer, (int)req->tag,
                    cfx__ctl_node_id(req->ctx->ctl), req->self_id);
}

static int wait_all(struct cfx_p2p_req **reqs, int n, uint64_t deadline_ns, bool intr)
{
    if (n <= 0)
        return CFX_OK;
    struct cfx_context *ctx = reqs[0]->ctx;
    for (int i = 0; i < n; i++) {
        int st;
        poll_wait(reqs[i], deadline_ns);
        while ((st = p2p_status(reqs[i])) == CFX_ERR_AGAIN && !cfx__ctx_closing(ctx) &&
               !(intr && node_moved(reqs[i])) && wait_on(ctx, deadline_ns, intr))
            ;
        if (st == CFX_ERR_AGAIN && intr && cfx__intr_fired()) {
            pthread_mutex_unlock(&ctx->lock);
            return CFX_ERR_CANCELED; /* still running: the caller withdraws it */
        }
        if (st == CFX_ERR_AGAIN && intr && node_moved(reqs[i])) {
            pthread_mutex_unlock(&ctx->lock);
            return moved_err(reqs[i]); /* still running: the caller withdraws it */
        }
        if (st == CFX_ERR_AGAIN && cfx__ctx_closing(ctx)) {
            pthread_mutex_unlock(&ctx->lock);
            return cfx__err(CFX_ERR_CANCELED, "%s node %u (tag %d): the context is being "
                            "destroyed", reqs[i]->kind == CFX_P2P_SEND ? "send to"
                            : "receive from", reqs[i]->peer, (int)reqs[i]->tag);
        }
        if (st == CFX_ERR_AGAIN)
            st = CFX_ERR_TIMEOUT;
        pthread_mutex_unlock(&ctx->lock);
        if (st != CFX_OK) {
            describe(reqs[i], st);
            return st;
        }
    }
    return CFX_OK;
}

int cfx__p2p_waitall(struct cfx_p2p_req **reqs, int n, uint64_t deadline_ns)
{
    return wait_all(reqs, n, deadline_ns, false);
}

int cfx__p2p_wait_intr(struct cfx_p2p_req *req, uint64_t deadline_ns)
{
    return wait_all(&req, 1, deadline_ns, true);
}

/* A pending rendezvous receive is freed (ctx->lock held).  A sender that is
 * alive answers the CANCEL within a round trip, after the writes it had in
 * flight landed in the window (still granted until then): wait for that, up
 * to a grace period, since those writes refused would fail the connection
 * and every message it carries (a collective's argument headers, say).  A
 * sender that has not answered by then is cut off as a get is at its
 * deadline: the grant is revoked, so a write it makes later is refused (and
 * fails that connection) instead of landing in the caller's buffer, and the
 * transfer state goes on in a heap copy the engine frees when the sender
 * answers or the connection ends.  No wait depends on the sender beyond the
 * grace. */
static void recv_withdraw(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    cfx__cmd_must(ctx, CFX_CMD_GET_CANCEL, req->obj);
    uint64_t grace = cfx__deadline_ns(P2P_CANCEL_GRACE_MS);
    while (p2p_status(req) == CFX_ERR_AGAIN && cfx__obj_wait(ctx, grace))
        ;
    if (p2p_status(req) != CFX_ERR_AGAIN)
        return;
    struct cfx_xfer_in *spare = malloc(sizeof(*spare));
    bool was_held = cfx__progress_enter(ctx);
    if (cfx__xfer_in_abandon(ctx, &req->in, spare))
        spare = NULL; /* the engine's now */
    cfx__progress_leave(ctx, was_held);
    free(spare);
}

/* A pending send is freed (ctx->lock held): unmatched it ends at once;
 * matched, its writes in flight still read the caller's buffer, so the
 * upload stops and we wait for the transport to finish them.  The grace
 * starts again whenever one finishes: a slow transport (dpdk on a loaded
 * host moves a window of 2 MiB in seconds) drains, and only one where
 * nothing completes for the grace is failed, which ends them.  No wait
 * depends on the receiver answering a message. */
static void send_withdraw(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    struct cfx_obj *obj = req->obj;
    cfx__cmd_must(ctx, CFX_CMD_P2P_CANCEL, obj);
    uint64_t grace = cfx__deadline_ns(P2P_CANCEL_GRACE_MS);
    uint64_t left = cfx__obj_writes_in_flight(obj);
    while (p2p_status(req) == CFX_ERR_AGAIN) {
        uint64_t now_left = cfx__obj_writes_in_flight(obj);
        if (now_left < left)
            grace = cfx__deadline_ns(P2P_CANCEL_GRACE_MS); /* still draining */
        left = now_left;
        if (cfx__now_ns() >= grace)
            break;
        /* write completions signal nothing here: look again every poll */
        cfx__obj_wait(ctx, CFX_MIN(grace, cfx__deadline_ns(P2P_DRAIN_POLL_MS)));
    }
    if (p2p_status(req) != CFX_ERR_AGAIN)
        return;
    bool was_held = cfx__progress_enter(ctx);
    while (p2p_status(req) == CFX_ERR_AGAIN && !cfx_list_empty(&obj->uploads)) {
        struct cfx_upload *up = cfx_list_entry(obj->uploads.next, struct cfx_upload, obj_link);
        if (up->conn->state == CFX_CONN_FAILED)
            break; /* its teardown is under way: it ends the upload */
        cfx__conn_fail(up->conn, CFX_ERR_TIMEOUT, "a send withdrawn with writes in flight "
                       "did not drain in time");
    }
    if (p2p_status(req) == CFX_ERR_AGAIN) {
        if (!cfx_list_empty(&obj->p2p_link))
            cfx_list_del(&obj->p2p_link);
        cfx__status_set(&obj->p2p_status, CFX_ERR_CANCELED);
    }
    cfx__progress_leave(ctx, was_held);
}

/* A request still running is withdrawn (ctx->lock held): an eager receive
 * taken off the posted list, a rendezvous receive or any send as above. */
static void withdraw_locked(struct cfx_p2p_req *req)
{
    if (req->kind == CFX_P2P_RECV && req->obj->eager)
        cfx__eager_recv_cancel(req->ctx, req->obj, &req->in); /* nothing in flight for it */
    else if (p2p_status(req) == CFX_ERR_AGAIN && req->kind == CFX_P2P_RECV)
        recv_withdraw(req);
    else if (p2p_status(req) == CFX_ERR_AGAIN)
        send_withdraw(req);
}

int cfx__p2p_withdraw(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    pthread_mutex_lock(&ctx->lock);
    withdraw_locked(req);
    int st = p2p_status(req);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

static int wait_free(struct cfx_p2p_req *req, uint64_t deadline_ns, bool intr)
{
    struct cfx_context *ctx = req->ctx;
    int st;
    poll_wait(req, deadline_ns);
    while ((st = p2p_status(req)) == CFX_ERR_AGAIN && !cfx__ctx_closing(ctx) &&
           !(intr && node_moved(req)) && wait_on(ctx, deadline_ns, intr))
        ;
    if (st == CFX_ERR_AGAIN && intr && (cfx__intr_fired() || node_moved(req))) {
        /* interrupted, or this node came back as another: withdrawn as a
         * free would, unless it ended first */
        bool moved = !cfx__intr_fired();
        pthread_mutex_unlock(&ctx->lock);
        st = cfx__p2p_withdraw(req);
        if (st == CFX_ERR_CANCELED) {
            if (moved)
                st = moved_err(req);
            cfx__p2p_free(req);
            return st; /* interrupted: the caller says why */
        }
        pthread_mutex_lock(&ctx->lock);
    }
    if (likely(st == CFX_OK && req->obj->eager)) {
        /* cfx__p2p_free's first case, in the hold the wait ends with: an
         * eager message that completed was never registered nor shared
         * after completion, so its block goes back to the free list now */
        struct p2p_block *b = container_of(req, struct p2p_block, req);
        bool kept = block_put(ctx, b);
        pthread_mutex_unlock(&ctx->lock);
        if (!kept)
            block_free(b);
        return CFX_OK;
    }
    pthread_mutex_unlock(&ctx->lock);
    /* anything else (rendezvous, failure, timeout): the ordinary wait sees
     * the final status at once and names the peer, then the free */
    int rc = st;
    if (st == CFX_ERR_AGAIN || st == CFX_OK)
        rc = cfx__p2p_wait(req, deadline_ns);
    else
        describe(req, st);
    if (rc == CFX_ERR_TIMEOUT && req->kind == CFX_P2P_RECV && !req->obj->eager &&
        cfx__p2p_withdraw(req) == CFX_OK) {
        /* the message landed whole while its receive was withdrawn (its send
         * took the request before it read the CANCEL, and completed):
         * taken, as the sender was told */
        cfx__err_clear();
        rc = CFX_OK;
    }
    cfx__p2p_free(req);
    return rc;
}

int cfx__p2p_wait_free(struct cfx_p2p_req *req, uint64_t deadline_ns)
{
    return wait_free(req, deadline_ns, false);
}

int cfx__p2p_wait_free_intr(struct cfx_p2p_req *req, uint64_t deadline_ns)
{
    return wait_free(req, deadline_ns, true);
}

/* A send no receiver took yet (ctx->lock and the progress lock held): still
 * running, and no upload of it began. */
static bool send_untaken(const struct cfx_p2p_req *req)
{
    return req->kind == CFX_P2P_SEND && p2p_status(req) == CFX_ERR_AGAIN &&
           cfx_list_empty(&req->obj->uploads) && !req->obj->await_slot;
}

bool cfx__p2p_send_unasked(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    struct cfx_obj *obj = req->obj;
    pthread_mutex_lock(&ctx->lock);
    /* and the progress lock: a post still queued as a command runs first,
     * and no request of the receiver matches the send while we look */
    bool was_held = cfx__progress_enter(ctx);
    bool unasked = !obj->eager && send_untaken(req);
    ctx->n_sends_unasked += unasked;
    cfx__progress_leave(ctx, was_held);
    pthread_mutex_unlock(&ctx->lock);
    return unasked;
}

bool cfx__p2p_withdraw_unsent(struct cfx_p2p_req **reqs, int n)
{
    struct cfx_context *ctx = reqs[0]->ctx;
    pthread_mutex_lock(&ctx->lock);
    /* and the progress lock: posts still queued as commands run first, and
     * no pass pushes one of the sends or matches a receiver's request with
     * one while they go: all or none */
    bool was_held = cfx__progress_enter(ctx);
    bool unsent = send_untaken(reqs[0]);
    for (int i = 0; unsent && i < n; i++)
        cfx__p2p_send_cancel(ctx, reqs[i]->obj);
    cfx__progress_leave(ctx, was_held);
    pthread_mutex_unlock(&ctx->lock);
    return unsent;
}

int cfx__p2p_send_detach(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    struct cfx_obj *obj = req->obj;
    int rc = CFX_OK;
    pthread_mutex_lock(&ctx->lock);
    /* and the progress lock: a post still queued as a command runs first,
     * and no pass pushes or matches the send while its buffer changes */
    bool was_held = cfx__progress_enter(ctx);
    if (req->kind != CFX_P2P_SEND) {
        rc = cfx__err(CFX_ERR_INVALID, "detach: not a send");
    } else if (p2p_status(req) != CFX_ERR_AGAIN || obj->heap || !obj->size) {
        rc = CFX_OK; /* reads no caller memory any more (or none at all) */
    } else if (!cfx_list_empty(&obj->uploads)) {
        rc = CFX_ERR_AGAIN; /* the transport reads it now */
    } else {
        void *copy = malloc(obj->size);
        if (!copy)
            rc = cfx__err(CFX_ERR_NOMEM, "detach: no memory for a copy of %" PRIu64 " bytes",
                          obj->size);
        else if (obj->memtype == CFX_MEMTYPE_HOST)
            memcpy(copy, obj->buf, obj->size);
        else
            rc = cfx__memcpy_typed(copy, CFX_MEMTYPE_HOST, obj->buf, obj->memtype, obj->size);
        if (rc == CFX_OK) {
            obj->buf = copy;
            obj->memtype = CFX_MEMTYPE_HOST;
            obj->heap = true;
            obj->shm_fd = -1; /* not in the arena any more */
            obj->shm_off = 0;
        } else {
            free(copy);
        }
    }
    cfx__progress_leave(ctx, was_held);
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

int cfx__p2p_cancel(struct cfx_p2p_req *req)
{
    struct cfx_context *ctx = req->ctx;
    pthread_mutex_lock(&ctx->lock);
    if (req->kind == CFX_P2P_RECV && req->obj->eager)
        cfx__eager_recv_cancel(ctx, req->obj, &req->in);
    int st = p2p_status(req);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

void cfx__p2p_free(struct cfx_p2p_req *req)
{
    if (!req)
        return;
    struct cfx_context *ctx = req->ctx;
    struct cfx_obj *obj = req->obj;
    struct p2p_block *b = container_of(req, struct p2p_block, req);
    pthread_mutex_lock(&ctx->lock);
    if (req->kind == CFX_P2P_RECV && obj->eager)
        cfx__eager_recv_cancel(ctx, obj, &req->in); /* nothing in flight for it */
    if (obj->eager && p2p_status(req) != CFX_ERR_AGAIN) {
        /* an eager message's object was never registered nor shared with
         * the progress thread after completion: reuse or free it here */
        bool kept = block_put(ctx, b);
        pthread_mutex_unlock(&ctx->lock);
        if (!kept)
            block_free(b);
        return;
    }
    withdraw_locked(req);
    obj->in = NULL;
    obj->deleting = true;
    /* The release frees the block, this request with it: touch neither
     * after.  With the progress lock free, this thread runs it (after what
     * others queued first), as a post does: queued for the progress thread,
     * it woke that thread from standing aside for a poller, once per
     * rendezvous message, to contend with the caller for ctx->lock. */
    cfx__cmd_must_here(ctx, CFX_CMD_OBJ_RELEASE, obj);
    pthread_mutex_unlock(&ctx->lock);
}

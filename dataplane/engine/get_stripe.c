/*
 * Striped gets: one large object from several complete holders at once.
 *
 * A getter whose downlink is faster than what one holder can spare asks the
 * directory for extra sources with its lookup (complete holders that serve
 * no upload now, coord_directory.c).  The object is cut into blocks of
 * chunks, a pool handed out receiver-driven: every source pulls one block
 * (a GET_REQ for [first, end), written into the getter's window under the
 * usual credits) and takes the next free one when it finished its own, so a
 * faster source takes more blocks and the slowest holds up at most one
 * block at the end.  The lowest free block goes first, so the copy's prefix
 * (which other nodes may read while it fills) grows nearly in order.
 *
 * A source that fails gives its block back to the pool (from its first
 * missing chunk: the chunks it landed stay) and the others finish it.  So
 * does one that stalls: alive but landing nothing of its block for
 * STRIPE_STALL_MS while another source is idle with no block left to take
 * (a holder whose progress stopped, a link that died without a reset).
 * Its transfer is abandoned as a get's is at its deadline (the CANCEL
 * sent, its grant revoked so that a late write is refused) and an idle
 * source takes the block.
 * Only when every source failed does the get fall back to the ordinary
 * failover (get.c: another holder from the directory, from the first
 * missing chunk on).
 *
 * Each source has its own registration of the buffer (in->mr): a
 * registration holds one live grant, scoped to one peer, on every
 * transport.  The getter thread drives all of this under ctx->lock; it
 * takes the progress lock only to post a request or to withdraw windows.
 */
#include "object.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRIPE_MIN_BYTES (4ull << 20) /* smaller objects: one source (setup costs more) */
#define STRIPE_MIN_CHUNKS 16u         /* and at least this many chunks */
#define STRIPE_BLOCKS_PER_SRC 4u      /* blocks per source: the slowest source's last block
                                         is 1/(4 n) of the object */
#define STRIPE_NODE_MS 1000           /* a source's node record from the directory */
#define STRIPE_STALL_MS 500           /* a source that landed nothing of its block this long,
                                         while another source is idle, loses the block */

enum { BLOCK_FREE, BLOCK_BUSY, BLOCK_DONE };

struct stripe_src {
    struct cfx_node_rec node;
    struct cfx_xfer_in *in;   /* its transfer state (heap, reused from block to block) */
    uint32_t block;           /* block it pulls now; UINT32_MAX: none */
    uint32_t blocks;          /* blocks it finished */
    uint32_t left;            /* in->left when last looked at */
    uint64_t moved_ns;        /* when in->left was last seen to move (or the block began) */
    bool gone;                /* failed or stalled: takes no more blocks */
};

struct stripe {
    struct cfx_context *ctx;
    struct cfx_obj *obj;
    const char *hex;                          /* the object's id, for messages */
    uint32_t bchunks;                         /* chunks per block */
    uint32_t nblocks;
    uint8_t *state;                           /* BLOCK_* per block */
    struct stripe_src src[CFX_GET_SOURCES_MAX];
    unsigned nsrc;
    uint32_t *failed;                         /* sources that failed, for the caller */
    unsigned *nfailed;
};

bool cfx__get_stripe_wanted(const struct cfx_context *ctx, const struct cfx_obj *obj,
                            const struct cfx_ctl_source *src)
{
    return ctx->cfg.get_sources > 1 && src->complete && src->nextra > 0 &&
           obj->size >= STRIPE_MIN_BYTES && obj->nchunks >= STRIPE_MIN_CHUNKS &&
           obj->memtype == CFX_MEMTYPE_HOST && !obj->watched && !obj->p2p;
}

static bool chunk_in(const struct cfx_obj *obj, uint32_t c)
{
    return (obj->bitmap[c / 64] >> (c % 64)) & 1;
}

/* Post the next free block to @p s (ctx->lock held).  False when there is
 * none left or the post failed at once (then s is marked gone). */
static bool stripe_assign(struct stripe *st, struct stripe_src *s)
{
    struct cfx_context *ctx = st->ctx;
    struct cfx_obj *obj = st->obj;

    for (uint32_t b = 0; b < st->nblocks; b++) {
        if (st->state[b] != BLOCK_FREE)
            continue;
        uint32_t first = b * st->bchunks;
        uint32_t end = CFX_MIN(first + st->bchunks, obj->nchunks);
        while (first < end && chunk_in(obj, first))
            first++; /* landed before its source failed */
        if (first == end) {
            st->state[b] = BLOCK_DONE;
            continue;
        }
        bool was_held = cfx__progress_enter(ctx);
        int rc = cfx__xfer_stripe_start(ctx, s->in, &s->node, first, end);
        struct cfx_conn *conn = s->in->conn;
        if (rc == CFX_ERR_AGAIN && conn &&
            (conn->state != CFX_CONN_READY || !conn->authed || !cfx_list_empty(&conn->pending)))
            cfx__progress_wake(ctx); /* a request queued on a connection being set up */
        cfx__progress_leave(ctx, was_held);
        if (rc != CFX_ERR_AGAIN) {
            CFX_LOG(INFO, OBJ, "node %u: striped get of %s: cannot ask node %u (%s) for "
                    "chunks [%u, %u): %s", ctx->node_id, st->hex, s->node.node_id,
                    s->node.name, first, end, cfx_errname(rc));
            s->gone = true;
            st->failed[(*st->nfailed)++] = s->node.node_id;
            return false;
        }
        st->state[b] = BLOCK_BUSY;
        s->block = b;
        s->left = s->in->left;
        s->moved_ns = cfx__now_ns();
        return true;
    }
    return false;
}

/* The extra sources' node records (ctx->lock held; dropped for the
 * directory).  The primary source's came with the lookup. */
static void stripe_nodes(struct stripe *st, const struct cfx_ctl_source *src, uint64_t deadline)
{
    struct cfx_context *ctx = st->ctx;
    unsigned want = CFX_MIN(ctx->cfg.get_sources, CFX_GET_SOURCES_MAX) - 1;
    unsigned n = CFX_MIN(src->nextra, want);

    st->src[0].node = src->node;
    st->nsrc = 1;
    pthread_mutex_unlock(&ctx->lock);
    for (unsigned i = 0; i < n; i++) {
        struct cfx_node_rec *rec = &st->src[st->nsrc].node;
        uint64_t until = CFX_MIN(deadline, cfx__deadline_ns(STRIPE_NODE_MS));
        int rc = cfx__ctl_node_get(ctx->ctl, src->extra[i], rec, until);
        if (rc == CFX_OK && rec->alive && rec->node_id == src->extra[i])
            st->nsrc++;
        else
            CFX_LOG(DEBUG, OBJ, "node %u: striped get of %s: no record of node %u (%s)",
                    ctx->node_id, st->hex, src->extra[i], cfx_errname(rc));
    }
    cfx__err_clear();
    pthread_mutex_lock(&ctx->lock);
}

/* A source's transfer ended (ctx->lock held).  A status other than CFX_OK
 * when the get cannot go on (a failure that is no lost source). */
static int stripe_reap(struct stripe *st, struct stripe_src *s)
{
    struct cfx_context *ctx = st->ctx;
    int rc = s->in->status;
    uint32_t b = s->block;

    s->block = UINT32_MAX;
    if (rc == CFX_OK) {
        st->state[b] = BLOCK_DONE;
        s->blocks++;
        return CFX_OK;
    }
    st->state[b] = BLOCK_FREE; /* the others finish it */
    s->gone = true;
    st->failed[(*st->nfailed)++] = s->node.node_id;
    CFX_LOG(INFO, OBJ, "node %u: striped get of %s: source node %u (%s) failed (%s) in "
            "chunks [%u, %u); the other sources take its block", ctx->node_id, st->hex,
            s->node.node_id, s->node.name, cfx_errname(rc), b * st->bchunks,
            CFX_MIN((b + 1) * st->bchunks, st->obj->nchunks));
    if (rc == CFX_ERR_PEER_FAILED || rc == CFX_ERR_NOT_FOUND || rc == CFX_ERR_CONNECT)
        return CFX_OK;
    return cfx__err(rc, "get of object %s on node %u from node %u (%s): %s", st->hex,
                    ctx->node_id, s->node.node_id, s->node.name, cfx_strerror(rc));
}

/* Abandon @p s's transfer (ctx->lock held): the engine keeps it until the
 * source answers the cancel, its grant revoked first; its registration is
 * dropped and @p s keeps no transfer.  False when it ended meanwhile (the
 * caller reaps it as usual). */
static bool stripe_abandon(struct stripe *st, struct stripe_src *s)
{
    struct cfx_context *ctx = st->ctx;
    struct cfx_xfer_in *in = s->in;
    struct cfx_tp_mr *mr = in->mr;
    bool was_held = cfx__progress_enter(ctx);
    struct cfx_xfer_in *marker = st->obj->in;
    bool kept = in->status == CFX_ERR_AGAIN && cfx__xfer_get_abandon(ctx, in);
    if (in->status != CFX_ERR_CANCELED && !kept) {
        st->obj->in = marker;
        cfx__progress_leave(ctx, was_held);
        return false;
    }
    in->mr = mr;
    cfx__xfer_stripe_mr_drop(ctx, in);
    if (!kept)
        free(in);
    s->in = NULL;
    /* the entry is still being got: obj->in names a live source's transfer */
    st->obj->in = marker == in ? NULL : marker;
    for (unsigned i = 0; i < st->nsrc && !st->obj->in; i++)
        if (st->src[i].in)
            st->obj->in = st->src[i].in;
    cfx__progress_leave(ctx, was_held);
    return true;
}

/* A busy source that landed nothing for STRIPE_STALL_MS while @p idle
 * sources wait with no block to take loses its block (ctx->lock held;
 * *@p dropped says whether one did).  Returns when the next source would
 * count as stalled (UINT64_MAX: none to watch). */
static uint64_t stripe_stalls(struct stripe *st, unsigned idle, bool *dropped)
{
    const uint64_t stall = (uint64_t)STRIPE_STALL_MS * 1000000;
    uint64_t now = cfx__now_ns(), next = UINT64_MAX;
    for (unsigned i = 0; i < st->nsrc; i++) {
        struct stripe_src *s = &st->src[i];
        if (s->block == UINT32_MAX)
            continue;
        if (s->in->left != s->left) {
            s->left = s->in->left;
            s->moved_ns = now;
        }
        if (!idle || now - s->moved_ns < stall) {
            next = CFX_MIN(next, s->moved_ns + stall);
            continue;
        }
        uint32_t b = s->block;
        if (!stripe_abandon(st, s))
            continue; /* it ended: reaped on the next round */
        CFX_LOG(INFO, OBJ, "node %u: striped get of %s: source node %u (%s) landed nothing of "
                "chunks [%u, %u) for %d ms; an idle source takes its block", st->ctx->node_id,
                st->hex, s->node.node_id, s->node.name, b * st->bchunks,
                CFX_MIN((b + 1) * st->bchunks, st->obj->nchunks), STRIPE_STALL_MS);
        st->state[b] = BLOCK_FREE;
        s->block = UINT32_MAX;
        s->gone = true;
        st->failed[(*st->nfailed)++] = s->node.node_id;
        *dropped = true;
        idle--;
    }
    return next;
}

/* The get is over (ctx->lock held): withdraw the windows still open, drop
 * the registrations and free what the engine does not keep. */
static void stripe_end(struct stripe *st)
{
    struct cfx_context *ctx = st->ctx;
    bool was_held = cfx__progress_enter(ctx);
    st->obj->in = NULL;
    for (unsigned i = 0; i < st->nsrc; i++) {
        struct cfx_xfer_in *in = st->src[i].in;
        if (!in)
            continue;
        struct cfx_tp_mr *mr = in->mr;
        /* abandoned: the engine keeps it until the source answers the
         * cancel (its grant revoked first, so no write lands after) */
        bool kept = in->status == CFX_ERR_AGAIN && cfx__xfer_get_abandon(ctx, in);
        in->mr = mr;
        cfx__xfer_stripe_mr_drop(ctx, in);
        if (!kept)
            free(in);
        st->src[i].in = NULL;
    }
    cfx__progress_leave(ctx, was_held);
    free(st->state);
}

int cfx__get_stripe(struct cfx_context *ctx, struct cfx_obj *obj,
                    const struct cfx_ctl_source *src, uint64_t deadline, int timeout_ms,
                    const char *hex, uint32_t *failed, unsigned *nfailed)
{
    struct stripe st = { .ctx = ctx, .obj = obj, .hex = hex, .failed = failed,
                         .nfailed = nfailed };
    int rc = CFX_OK;

    *nfailed = 0;
    stripe_nodes(&st, src, deadline);
    if (st.nsrc < 2 || obj->complete)
        return CFX_ERR_AGAIN; /* one source after all: the plain get */
    st.nsrc = CFX_MIN(st.nsrc, obj->nchunks / 4); /* at least 4 chunks per source */
    st.bchunks = CFX_MAX(obj->nchunks / (st.nsrc * STRIPE_BLOCKS_PER_SRC), 1u);
    st.nblocks = (obj->nchunks + st.bchunks - 1) / st.bchunks;
    st.state = calloc(st.nblocks, 1);
    if (!st.state)
        return cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", hex);
    for (unsigned i = 0; i < st.nsrc; i++) {
        st.src[i].block = UINT32_MAX;
        st.src[i].in = calloc(1, sizeof(*st.src[i].in));
        if (!st.src[i].in) {
            rc = cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", hex);
            goto end;
        }
        st.src[i].in->obj = obj;
        cfx__status_set(&st.src[i].in->status, CFX_OK);
    }
    CFX_LOG(DEBUG, OBJ, "node %u: get of %s (%" PRIu64 " B) from %u complete holders in %u "
            "blocks of %u chunks", ctx->node_id, hex, obj->size, st.nsrc, st.nblocks,
            st.bchunks);
    /* the entry is being got (what obj->in says to the rest of the engine:
     * a withdrawal meanwhile leaves it to this get, cfx__copy_withdrawn) */
    obj->in = st.src[0].in;

    for (;;) {
        unsigned active = 0, idle = 0;
        for (unsigned i = 0; i < st.nsrc && rc == CFX_OK; i++) {
            struct stripe_src *s = &st.src[i];
            if (s->block != UINT32_MAX && s->in->status != CFX_ERR_AGAIN)
                rc = stripe_reap(&st, s);
            if (rc == CFX_OK && !s->gone && s->block == UINT32_MAX && !obj->complete)
                stripe_assign(&st, s);
            active += s->block != UINT32_MAX;
            idle += !s->gone && s->block == UINT32_MAX;
        }
        if (rc != CFX_OK || obj->complete)
            break;
        if (cfx__ctx_closing(ctx)) {
            rc = cfx__err(CFX_ERR_CANCELED, "get of object %s on node %u: the context is being "
                          "destroyed", hex, ctx->node_id);
            break;
        }
        if (cfx__req_canceled()) {
            rc = cfx__err(CFX_ERR_CANCELED, "get of object %s on node %u: canceled (%s)", hex,
                          ctx->node_id, cfx__cur_req ? "its request was freed"
                                                     : "interrupted on its thread");
            break;
        }
        if (!active) {
            /* every source failed, or took no request: the caller fails
             * over from the first missing chunk */
            rc = cfx__err(CFX_ERR_PEER_FAILED, "get of object %s on node %u: all %u sources "
                          "of its stripe failed", hex, ctx->node_id, st.nsrc);
            break;
        }
        /* a stalled source's block goes to an idle one; landings signal
         * nothing here, so look again when the next could count as stalled */
        bool dropped = false;
        uint64_t next = stripe_stalls(&st, idle, &dropped);
        if (dropped)
            continue;
        /* (a blocking get's interrupt check runs in the wait: get.c get_attempt) */
        uint64_t until = idle ? CFX_MIN(deadline, next) : deadline;
        if (cfx__obj_wait_intr(ctx, until) || cfx__now_ns() < deadline)
            continue;
        /* name the sources whose blocks are still out */
        char who[CFX_GET_SOURCES_MAX * 12] = "";
        size_t len = 0;
        for (unsigned i = 0; i < st.nsrc && len < sizeof(who); i++)
            if (st.src[i].block != UINT32_MAX)
                len += (size_t)snprintf(who + len, sizeof(who) - len, "%s%u", len ? ", " : "",
                                        st.src[i].node.node_id);
        rc = cfx__err(CFX_ERR_TIMEOUT, "get of object %s (%" PRIu64 " B) on node %u from "
                      "%u sources: timed out after %d ms with %u of %u chunks in order, "
                      "waiting for node %s", hex, obj->size, ctx->node_id, st.nsrc,
                      timeout_ms, obj->ready_chunks, obj->nchunks, who);
        break;
    }
    if (rc == CFX_OK) {
        for (unsigned i = 0; i < st.nsrc; i++)
            CFX_LOG(DEBUG, OBJ, "node %u: get of %s: node %u served %u blocks", ctx->node_id,
                    hex, st.src[i].node.node_id, st.src[i].blocks);
    }
end:
    stripe_end(&st);
    return rc;
}

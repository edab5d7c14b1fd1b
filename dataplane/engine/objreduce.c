/*
 * Object reduce (Hoplite style): the holders of the inputs form a chain or a
 * binomial tree in the order the inputs became ready; each inner node pulls
 * its children's partial results through a small scratch ring (no copy of a
 * whole child object), reduces every chunk into its own output as it lands,
 * and serves that output, chunk by chunk, to its parent.  The root's output
 * is the result object.
 *
 * Driver: cfx_reduce_objects() (any API thread) finds k ready inputs, plans
 * the shape and sends one REDUCE_TASK per inner node.  Node side: the
 * progress thread runs tasks (ctx->lock held).
 *
 * A dead participant is routed around where it stands.  The parent whose
 * stream from it broke (at chunk g) reports REDUCE_LOST to the driver and
 * keeps going; the driver names what replaces the dead position: its
 * children's streams, which the parent now reads itself, and its input from
 * another node holding a copy.  The parent reads those from chunk g on
 * (chunks before g already hold the dead node's whole subtree), so no chunk
 * is reduced twice and nothing else restarts.  Intermediates are kept by
 * their tasks until the driver ends the reduce (REDUCE_ABORT after the
 * result, or the deadline), so an adopted stream can be read again from any
 * chunk.  A dead result holder (the root), or a
 * dead input nobody else holds, makes the driver plan again from the start
 * with a spare input (first k of n) or fail: a spare cannot stand in for the
 * lost input in place, because chunks before g already hold that input.
 */
#include "engine.h"

#include <conflux/task.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/proto.h"
#include "objreduce.h"

#define RING_SLOTS        8          /* scratch chunks per child stream */
#define POLL_MIN_US       500        /* driver: first re-check of missing inputs */
#define POLL_MAX_US       20000      /* ... backing off to this */
#define CANCEL_GRACE_NS   1000000000ull
#define MAX_INPUTS        1024
#define TREE_MAX_INPUTS   64         /* binomial trees up to this; chains beyond */
#define MAX_ATTEMPTS      4          /* plans tried when participants die */

/* ---- node records in messages ------------------------------------------- */

void cfx__rtask_rec_to_dp(const struct cfx_node_rec *r, struct cfx_dp_node *n)
{
    memset(n, 0, sizeof(*n));
    n->node_id = r->node_id;
    memcpy(n->host_id, r->host_id, sizeof(n->host_id));
    n->host_id[sizeof(n->host_id) - 1] = '\0';
    for (unsigned a = 0; a < r->naddr && n->naddr < CFX_NODE_ADDRS_MAX; a++)
        n->addr[n->naddr++] = r->addr[a];
}

static void dp_to_rec(const struct cfx_dp_node *n, struct cfx_node_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->node_id = n->node_id;
    memcpy(r->host_id, n->host_id, sizeof(r->host_id));
    snprintf(r->name, sizeof(r->name), "node %u", n->node_id);
    r->alive = 1;
    for (unsigned a = 0; a < n->naddr && a < CFX_NODE_ADDRS_MAX; a++)
        r->addr[r->naddr++] = n->addr[a];
}

/* ---- driver bookkeeping (ctx->lock held) -------------------------------- */

static void rwait_finish(struct cfx_context *ctx, uint64_t task, int status, uint32_t node)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rwaits) {
        struct cfx_rwait *w = cfx_list_entry(pos, struct cfx_rwait, link);
        if (w->task != task || w->status != CFX_ERR_AGAIN)
            continue;
        if (status == CFX_OK && w->need > 1) {
            /* a striped reduce: one success from each gathering node */
            size_t i = 0;
            while (i < w->ntasks && (w->tasks[i] != node || w->done[i]))
                i++;
            if (i == w->ntasks)
                return; /* not a gathering node, or its second report */
            w->done[i] = 1;
            if (++w->nok < w->need)
                return;
        }
        w->status = status;
        w->node_id = node;
        pthread_cond_broadcast(&ctx->obj_cond);
        return;
    }
}

/* Whether @p conn's node runs a task of the reduce @p task drives here. */
static bool rwait_from_task(struct cfx_context *ctx, uint64_t task, const struct cfx_conn *conn)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rwaits) {
        struct cfx_rwait *w = cfx_list_entry(pos, struct cfx_rwait, link);
        if (w->task != task)
            continue;
        for (size_t i = 0; i < w->ntasks; i++)
            if (w->tasks[i] == conn->node_id)
                return true;
        return false;
    }
    return true; /* over already: rwait_lost finds nothing to do */
}

/* A task of @p task lost its stream from @p node: the driver routes around it. */
static void rwait_lost(struct cfx_context *ctx, uint64_t task, uint32_t node)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rwaits) {
        struct cfx_rwait *w = cfx_list_entry(pos, struct cfx_rwait, link);
        if (w->task != task || w->status != CFX_ERR_AGAIN)
            continue;
        for (unsigned i = 0; i < w->nlost; i++)
            if (w->lost[i] == node)
                return; /* already being repaired */
        if (w->nlost == CFX_ARRAY_SIZE(w->lost)) {
            rwait_finish(ctx, task, CFX_ERR_PEER_FAILED, node);
            return;
        }
        w->lost[w->nlost++] = node;
        pthread_cond_broadcast(&ctx->obj_cond);
        return;
    }
}

/* The coordinator reports @p node_id dead: reduces that cannot go on
 * without it (it holds their result, or they cannot be repaired) fail now
 * rather than at their deadline (it may have been the one to report). */
void cfx__rtask_node_dead(struct cfx_context *ctx, uint32_t node_id)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rwaits) {
        struct cfx_rwait *w = cfx_list_entry(pos, struct cfx_rwait, link);
        for (size_t i = 0; i < w->nnodes && w->status == CFX_ERR_AGAIN; i++)
            if (w->nodes[i] == node_id)
                rwait_finish(ctx, w->task, CFX_ERR_PEER_FAILED, node_id);
    }
}

/* @p conn is being torn down: tasks it brought forget it. */
void cfx__rtask_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        if (t->driver == conn) {
            t->driver = NULL;
            t->driver_lost = true;
        }
    }
}

/* Tell the driver: DONE (the result, or a failure) or LOST (a child's node). */
static void report(struct cfx_context *ctx, struct cfx_rtask *t, uint8_t type, int status,
                   uint32_t node)
{
    if (t->driver_lost)
        return; /* the driver is gone; it learns from its own side */
    if (!t->driver) {
        if (type == CFX_DP_REDUCE_DONE)
            rwait_finish(ctx, t->task, status, node);
        else
            rwait_lost(ctx, t->task, node);
        return;
    }
    struct cfx_dp_reduce_done d = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = type },
        .task = t->task,
        .status = status,
        .node_id = node,
    };
    cfx__conn_send(t->driver, &d, sizeof(d));
}

static void send_done(struct cfx_context *ctx, struct cfx_rtask *t, int status, uint32_t node)
{
    report(ctx, t, CFX_DP_REDUCE_DONE, status, node);
}

/* ---- node side ------------------------------------------------------------ */

static void report_lost(struct cfx_context *ctx, struct cfx_rtask *t, uint32_t node)
{
    report(ctx, t, CFX_DP_REDUCE_LOST, CFX_ERR_PEER_FAILED, node);
}

static void rtask_fail(struct cfx_context *ctx, struct cfx_rtask *t, int status, uint32_t node)
{
    if (t->status != CFX_ERR_AGAIN)
        return;
    t->status = status;
    CFX_LOG(WARN, REDUCE, "node %u: reduce task %" PRIx64 " failed: %s (node %u)", ctx->node_id,
            t->task, cfx_errname(status), node);
    send_done(ctx, t, status, node);
    for (uint32_t c = 0; c < t->nchildren; c++)
        if (t->child[c].scratch && t->child[c].in.status == CFX_ERR_AGAIN)
            cfx__xfer_get_cancel(ctx, t->child[c].scratch);
    /* the parent reading our output is told (NACK) and fails in turn */
    if (t->out) {
        if (t->out->announced)
            cfx__ctl_obj_delete_async(ctx->ctl, &t->out->id);
        t->out->announced = false;
        t->out->deleting = true;
        t->out->ephemeral = false;
        cfx__obj_release(ctx, t->out);
        t->out = NULL;
    }
}

void cfx__rtask_child_failed(struct cfx_context *ctx, struct cfx_rchild *ch, int status)
{
    struct cfx_rtask *t = ch->task;
    if (ch->lost)
        return; /* withdrawn on the driver's word: adopted streams replace it */
    if (t->repair && status == CFX_ERR_PEER_FAILED && t->status == CFX_ERR_AGAIN &&
        !t->driver_lost) {
        /* keep going with the other children; the driver names what
         * replaces this one from chunk `got` on */
        ch->lost = true;
        CFX_LOG(INFO, REDUCE, "node %u: reduce task %" PRIx64 ": stream from node %u lost at "
                "chunk %u; asking the driver (node %u) to route around it", ctx->node_id,
                t->task, ch->node.node_id, ch->got, t->driver_node);
        report_lost(ctx, t, ch->node.node_id);
        return;
    }
    rtask_fail(ctx, t, status, ch->node.node_id);
}

static void rtask_complete(struct cfx_context *ctx, struct cfx_rtask *t)
{
    struct cfx_obj *out = t->out;
    out->complete = true;
    t->status = CFX_OK;
    if (t->gather) {
        /* kept, unannounced (a get here reads it), until the driver says
         * whether the reduce as a whole succeeded (rtask_abort) */
        send_done(ctx, t, CFX_OK, ctx->node_id);
    } else if (t->final) {
        /* the result becomes an ordinary object of this node */
        out->ephemeral = false;
        out->owned = true; /* this node is the result's putter */
        if (!t->early)
            t->answer_due = out->announced =
                cfx__ctl_obj_put_async(ctx->ctl, &out->id, out->size, out->chunk_size, 0) ==
                CFX_OK;
        /* done once the directory took it: the id may name another object
         * (cfx__rtask_put_answer) */
        if (t->answer_due)
            t->done_due = true;
        else
            send_done(ctx, t, CFX_OK, ctx->node_id);
    }
    pthread_cond_broadcast(&ctx->obj_cond);
}

void cfx__rtask_chunk(struct cfx_context *ctx, struct cfx_rchild *ch, uint32_t chunk,
                      uint32_t len)
{
    struct cfx_rtask *t = ch->task;
    struct cfx_obj *out = t->out;
    struct cfx_conn *conn = ch->in.conn;

    if (t->status != CFX_ERR_AGAIN || !out || ch->lost)
        return; /* failing, or a stream replaced: the window is being withdrawn */
    /* the stream's chunk c is chunk c - base of a range read: the slot in
     * the scratch ring follows the former, the stripe's geometry the latter */
    uint32_t rel = ch->range ? chunk - ch->base : chunk;
    uint64_t coff = (uint64_t)rel * out->chunk_size; /* in the child's stripe */
    uint64_t want = rel < ch->nchunks ? CFX_MIN((uint64_t)out->chunk_size, ch->size - coff) : 0;
    if (unlikely(rel != ch->got || len != want)) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "reduce stream out of order");
        return;
    }
    const uint8_t *src = (const uint8_t *)ch->scratch->buf +
                         (uint64_t)(chunk % ch->ring) * out->chunk_size;
    uint32_t oc = ch->base + rel; /* the output's chunk */
    uint64_t off = (uint64_t)oc * out->chunk_size;
    uint8_t *dst = (uint8_t *)out->buf + off;
    size_t n = len / cfx_dtype_size(t->dtype);
    if (ch->range)
        memcpy(dst, src, len); /* a gather's stripe from the node before */
    else if (t->count[oc] == 0)
        cfx_reduce3(dst, (const uint8_t *)t->x->buf + t->in_off + off, src, n, t->dtype, t->op);
    else
        cfx_reduce(dst, src, n, t->dtype, t->op);
    t->count[oc]++;
    ch->got++;
    ctx->stats.bytes_received += len;

    /* the slot is free again: give the credit back */
    ch->in.owed++;
    if (ch->got == ch->nchunks) {
        cfx__xfer_in_finish(ctx, &ch->in, CFX_OK);
    } else if (ch->in.owed >= CFX_MAX(ch->ring / 2, 1u)) {
        cfx__dp_send_credit(conn, ch->in.slot, ch->in.owed);
        ch->in.owed = 0;
    }
    if (t->count[oc] == t->need[oc]) {
        out->bitmap[oc / 64] |= 1ull << (oc % 64);
        cfx__obj_advance(ctx, out); /* the parent may read this chunk now */
    }
    if (out->ready_chunks == out->nchunks)
        rtask_complete(ctx, t);
}

/* What child @p c of @p t streams: the whole output's shape, or for a
 * gather stripe c of it. */
static void child_shape(const struct cfx_rtask *t, struct cfx_rchild *ch, uint32_t c)
{
    const struct cfx_obj *out = t->out;
    ch->base = 0;
    ch->nchunks = out->nchunks;
    ch->size = out->size;
    if (!t->gather)
        return;
    ch->base = cfx__stripe_first(out->nchunks, t->stripes, c);
    uint32_t end = cfx__stripe_first(out->nchunks, t->stripes, c + 1);
    ch->nchunks = end - ch->base;
    ch->size = CFX_MIN((uint64_t)end * out->chunk_size, out->size) -
               (uint64_t)ch->base * out->chunk_size;
    ch->range = !memcmp(ch->src.bytes, out->id.bytes, CFX_OBJECT_ID_LEN);
}

/* Start reading child @p ch's object from chunk @p first; @p wait: the
 * object may not exist yet (a task starting at the same time makes it). */
static int child_start(struct cfx_context *ctx, struct cfx_rtask *t, struct cfx_rchild *ch,
                       uint32_t first, bool wait)
{
    struct cfx_obj *out = t->out;
    int status = CFX_OK;
    struct cfx_conn *conn = cfx__conn_get(ctx, &ch->node, &status);
    if (!conn)
        return status;

    ch->ring = CFX_MIN((uint32_t)RING_SLOTS, ch->nchunks);
    ch->scratch = cfx__obj_alloc((uint64_t)ch->ring * out->chunk_size, out->chunk_size);
    if (!ch->scratch)
        return CFX_ERR_NOMEM;
    status = cfx__arena_alloc_locked(ctx, (size_t)ch->scratch->size, &ch->scratch->buf,
                                     &ch->scratch->shm_fd, &ch->scratch->shm_off);
    if (status != CFX_OK)
        return status;
    ch->scratch->arena = true;
    ch->scratch->deleting = true; /* never served: not an object */
    struct cfx_tp_mr *mr = cfx__obj_mr(ctx, ch->scratch, conn->tp, &status);
    if (!mr)
        return status;

    ch->in.obj = ch->scratch;
    ch->in.status = CFX_ERR_AGAIN;
    ch->in.rchild = ch;
    ch->in.src_node = ch->node.node_id;
    ch->in.window = ch->ring;
    ch->got = first;
    ch->scratch->in = &ch->in;
    status = cfx__xfer_slot_alloc(ctx, &ch->in);
    if (status != CFX_OK)
        return status;
    ch->in.conn = conn;

    struct cfx_dp_get_req req = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                 .type = CFX_DP_GET_REQ, .slot = ch->in.slot },
        .size = ch->range ? out->size : ch->size,
        .chunk_size = out->chunk_size,
        .first_chunk = (ch->range ? ch->base : 0) + first,
        .end_chunk = ch->range ? ch->base + ch->nchunks : 0,
        .credits = ch->ring,
        .flags = CFX_DP_GET_RING | (wait ? CFX_DP_GET_WAIT : 0),
        .ring = ch->ring,
    };
    memcpy(req.id, ch->src.bytes, CFX_OBJECT_ID_LEN);
    status = cfx__xfer_grant(ctx, conn, mr, &req.rdesc);
    if (status == CFX_OK)
        status = cfx__conn_send(conn, &req, sizeof(req));
    return status;
}

/* Child @p c of @p t as its driver named it: where it is read, and what. */
static void child_named(struct cfx_rtask *t, uint32_t c, const struct cfx_dp_node *node,
                        const uint8_t *obj)
{
    struct cfx_rchild *ch = &t->child[c];
    ch->task = t;
    ch->in.status = CFX_ERR_CANCELED; /* not started */
    dp_to_rec(node, &ch->node);
    memcpy(ch->src.bytes, obj, CFX_OBJECT_ID_LEN);
}

/* Start reading every child of @p t (or fail it). */
static void children_start(struct cfx_context *ctx, struct cfx_rtask *t)
{
    for (uint32_t c = 0; c < t->nchildren; c++) {
        struct cfx_rchild *ch = &t->child[c];
        child_shape(t, ch, c);
        if (!ch->range && !t->x) { /* a stripe to reduce, and nothing to reduce it with */
            rtask_fail(ctx, t, CFX_ERR_INVALID, t->driver_node);
            return;
        }
        int status = child_start(ctx, t, ch, 0, true);
        if (status != CFX_OK) {
            rtask_fail(ctx, t, status, ch->node.node_id);
            return;
        }
    }
}

/* The stripes of gather @p t past those its task message named. */
static void gather_more(struct cfx_context *ctx, struct cfx_rtask *t,
                        const struct cfx_dp_reduce_adopt *a)
{
    if (t->nchildren + a->n > t->stripes || (a->last && t->nchildren + a->n != t->stripes)) {
        rtask_fail(ctx, t, CFX_ERR_PROTO, t->driver_node);
        return;
    }
    for (unsigned i = 0; i < a->n; i++)
        child_named(t, t->nchildren++, &a->child[i], a->child_obj[i]);
    if (a->last)
        children_start(ctx, t);
}

static void rtask_start(struct cfx_context *ctx, struct cfx_conn *driver,
                        const struct cfx_dp_reduce_task *m)
{
    struct cfx_object_id in_id, out_id;
    struct cfx_rtask *t = calloc(1, sizeof(*t));
    int status = CFX_OK;

    if (!t) {
        struct cfx_rtask tmp = { .task = m->task, .driver = driver };
        send_done(ctx, &tmp, CFX_ERR_NOMEM, ctx->node_id);
        return;
    }
    t->task = m->task;
    t->driver = driver;
    t->driver_node = driver ? driver->node_id : ctx->node_id;
    t->dtype = (enum cfx_dtype)m->dtype;
    t->op = (enum cfx_redop)m->op;
    t->final = m->final & CFX_RTASK_FINAL;
    t->early = t->final && (m->final & CFX_RTASK_EARLY);
    t->repair = m->final & CFX_RTASK_REPAIR;
    t->gather = m->final & CFX_RTASK_GATHER;
    t->putter = t->final ? ctx->node_id : m->putter;
    t->in_off = m->offset;
    t->stripes = m->stripes;
    t->nchildren = m->nchildren;
    t->status = CFX_ERR_AGAIN;
    t->deadline = cfx__deadline_ns((int)CFX_MIN(m->timeout_ms, 0x7fffffffu));
    cfx_list_add_tail(&t->link, &ctx->rtasks);

    memcpy(in_id.bytes, m->input, CFX_OBJECT_ID_LEN);
    memcpy(out_id.bytes, m->output, CFX_OBJECT_ID_LEN);
    /* a gather reduces its own stripe with its node's input (none: the
     * node roots no stripe, every child is a range) */
    static const uint8_t none[CFX_OBJECT_ID_LEN];
    bool has_input = !t->gather || memcmp(m->input, none, sizeof(none));
    struct cfx_obj *x = has_input ? cfx__store_find(&ctx->store, &in_id) : NULL;
    if (has_input && (!x || !x->complete || x->deleting)) {
        rtask_fail(ctx, t, CFX_ERR_NOT_FOUND, ctx->node_id);
        return;
    }
    /* a range of the input (a stripe), or all of it; a gather's stripes
     * are at least a chunk each */
    if ((x && (x->chunk_size != m->chunk_size || m->offset > x->size ||
               x->size - m->offset < m->size)) ||
        (t->gather && cfx__nchunks(m->size, m->chunk_size) < m->stripes)) {
        rtask_fail(ctx, t, CFX_ERR_INVALID, ctx->node_id);
        return;
    }
    if (cfx__store_find(&ctx->store, &out_id)) {
        rtask_fail(ctx, t, CFX_ERR_EXISTS, ctx->node_id);
        return;
    }
    if (x) {
        x->refs++;
        t->x = x;
    }

    struct cfx_obj *out = cfx__obj_alloc(m->size, m->chunk_size);
    if (!out || !(t->count = calloc(out->nchunks + 1, 1)) ||
        !(t->need = malloc(out->nchunks + 1))) {
        if (out) {
            free(out->bitmap);
            free(out);
        }
        rtask_fail(ctx, t, CFX_ERR_NOMEM, ctx->node_id);
        return;
    }
    memset(t->need, t->gather ? 1 : (int)t->nchildren, out->nchunks + 1);
    out->id = out_id;
    status = cfx__arena_alloc_locked(ctx, m->size ? (size_t)m->size : 1, &out->buf,
                                     &out->shm_fd, &out->shm_off);
    if (status != CFX_OK) {
        free(out->bitmap);
        free(out);
        rtask_fail(ctx, t, status, ctx->node_id);
        return;
    }
    out->arena = true;
    out->ephemeral = !t->final || t->gather;
    out->serve_landed = t->gather; /* its next node reads stripes of it as they land */
    cfx__store_insert(&ctx->store, out);
    t->out = out;
    if (t->early) {
        /* getters may attach now and read chunks as they are reduced */
        out->owned = true;
        t->answer_due = out->announced =
            cfx__ctl_obj_put_async(ctx->ctl, &out->id, out->size, out->chunk_size, 0) == CFX_OK;
    }

    if (t->nchildren == 0) {
        /* a reduce of one input (or a leaf of a stripe's chain): the
         * output is a copy of it */
        if (out->size)
            memcpy(out->buf, (const uint8_t *)x->buf + t->in_off, out->size);
        out->ready_chunks = out->nchunks;
        rtask_complete(ctx, t);
    } else {
        for (uint32_t c = 0; c < t->nchildren; c++)
            child_named(t, c, &m->child[c], m->child_obj[c]);
        /* a gather of more stripes than one message names waits for the rest */
        if (!t->gather || t->nchildren == t->stripes)
            children_start(ctx, t);
    }
    CFX_LOG(DEBUG, REDUCE, "node %u: reduce task %" PRIx64 ": %u children, %s", ctx->node_id,
            t->task, t->nchildren, t->gather ? "gathers the result's stripes"
                                   : t->final ? "produces the result" : "inner node");
    cfx__xfer_serve_waiting(ctx, out);
}

/* A finished gather's output becomes the result here: this node's put
 * (FINAL), or a copy of the putter's put, announced as such. */
static void gather_keep(struct cfx_context *ctx, struct cfx_rtask *t)
{
    struct cfx_obj *out = t->out;
    out->ephemeral = false;
    if (t->final) {
        out->owned = true;
        out->announced = cfx__ctl_obj_put_async(ctx->ctl, &out->id, out->size,
                                                out->chunk_size, 0) == CFX_OK;
    } else {
        out->putter_node = t->putter;
        out->put_tag = 0; /* a reduce's result is put untagged */
        out->announced = cfx__ctl_obj_put_async(ctx->ctl, &out->id, out->size,
                                                out->chunk_size, t->putter) == CFX_OK;
    }
    CFX_LOG(DEBUG, REDUCE, "node %u: reduce task %" PRIx64 ": keeps the result as %s",
            ctx->node_id, t->task, t->final ? "its putter" : "a copy");
}

/* @p o, a result this node announced, is not the object the directory
 * knows by its id: it leaves, so that no get here answers with it. */
static void result_refused(struct cfx_context *ctx, struct cfx_obj *o)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        if (t->out == o)
            t->out = NULL;
    }
    o->announced = false;
    o->deleting = true;
    o->ephemeral = false;
    cfx__obj_release(ctx, o);
    pthread_cond_broadcast(&ctx->obj_cond);
}

void cfx__rtask_put_answer(struct cfx_context *ctx, const struct cfx_put_answer *a)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    bool yes = a->status == CFX_OK || a->status == CFX_ERR_CONNECT; /* CONNECT: announced
                                                                       again on the reconnect */
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        if (!t->answer_due || !t->out || memcmp(&t->out->id, &a->id, sizeof(a->id)))
            continue;
        t->answer_due = false;
        if (yes) {
            if (t->done_due) {
                t->done_due = false;
                send_done(ctx, t, CFX_OK, ctx->node_id);
            }
            return;
        }
        cfx_object_id_to_hex(&a->id, hex);
        CFX_LOG(WARN, REDUCE, "node %u: reduce task %" PRIx64 ": the directory refused its "
                "result %s (%s): %s", ctx->node_id, t->task, hex, cfx_errname(a->status),
                a->why);
        t->out->announced = false; /* the id is another node's: nothing of ours to withdraw */
        if (t->status == CFX_ERR_AGAIN) {
            rtask_fail(ctx, t, a->status, ctx->node_id);
        } else {
            /* complete, its REDUCE_DONE held back for this answer */
            t->status = a->status;
            t->done_due = false;
            send_done(ctx, t, a->status, ctx->node_id);
            result_refused(ctx, t->out);
        }
        return;
    }
    if (yes)
        return;
    /* no task waits for it: a gathered result kept after its reduce ended */
    struct cfx_obj *o = cfx__store_find(&ctx->store, &a->id);
    if (o && !o->deleting && o->announced && !o->p2p) {
        cfx_object_id_to_hex(&a->id, hex);
        CFX_LOG(WARN, REDUCE, "node %u: the directory refused the reduce result %s kept here "
                "(%s): %s; dropped", ctx->node_id, hex, cfx_errname(a->status), a->why);
        result_refused(ctx, o);
    }
}

/* The driver (@p conn; NULL: this node) is done with @p task: stop its
 * tasks here, and free what they made, but for finished gathers when it
 * says @p status CFX_RTASK_KEEP.  Only a task's driver ends it. */
static void rtask_abort(struct cfx_context *ctx, const struct cfx_conn *conn, uint64_t task,
                        int status)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        if (t->task != task || t->aborted || t->driver != conn)
            continue;
        if (status == CFX_RTASK_KEEP && t->gather && t->status == CFX_OK && t->out &&
            t->out->ephemeral)
            gather_keep(ctx, t);
        rtask_fail(ctx, t, CFX_ERR_CANCELED, ctx->node_id);
        t->aborted = true; /* a finished intermediate goes too */
    }
}

/* Chunks [from, nchunks) that adoption made whole are ready now. */
static void rtask_recheck(struct cfx_context *ctx, struct cfx_rtask *t, uint32_t from)
{
    struct cfx_obj *out = t->out;
    for (uint32_t c = from; c < out->nchunks; c++) {
        if ((out->bitmap[c / 64] >> (c % 64)) & 1 || t->count[c] != t->need[c])
            continue;
        if (t->need[c] == 0) {
            /* every stream of this chunk went away: it is the input alone */
            uint64_t off = (uint64_t)c * out->chunk_size;
            memcpy((uint8_t *)out->buf + off, (const uint8_t *)t->x->buf + t->in_off + off,
                   CFX_MIN((uint64_t)out->chunk_size, out->size - off));
        }
        out->bitmap[c / 64] |= 1ull << (c % 64);
    }
    cfx__obj_advance(ctx, out);
    if (out->ready_chunks == out->nchunks)
        rtask_complete(ctx, t);
}

/* The driver names the streams that replace lost children. */
static void rtask_adopt(struct cfx_context *ctx, struct cfx_conn *conn,
                        const struct cfx_dp_reduce_adopt *a)
{
    struct cfx_rtask *t = NULL;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->rtasks) {
        struct cfx_rtask *x = cfx_list_entry(pos, struct cfx_rtask, link);
        if (x->task == a->task && x->status == CFX_ERR_AGAIN) {
            t = t ? t : x;
            if (x->gather) {
                t = x; /* a striped reduce's stripe tasks take no ADOPT */
                break;
            }
        }
    }
    if (!t)
        return; /* finished or failed meanwhile: the driver learns that on its own */
    if (t->driver != conn) {
        CFX_LOG(WARN, REDUCE, "node %u: reduce task %" PRIx64 ": adopt from %s, which is not "
                "its driver: ignored", ctx->node_id, t->task, conn ? conn->name : "this node");
        return;
    }
    if (t->gather) {
        gather_more(ctx, t, a);
        return;
    }
    struct cfx_obj *out = t->out;
    uint32_t from = out->nchunks;
    for (unsigned i = 0; i < a->n; i++) {
        struct cfx_rchild *lost = NULL;
        for (uint32_t c = t->nchildren; c-- > 0;)
            if (!memcmp(t->child[c].src.bytes, a->replaces[i], CFX_OBJECT_ID_LEN)) {
                lost = &t->child[c];
                break;
            }
        if (!lost) {
            rtask_fail(ctx, t, CFX_ERR_PROTO, t->driver_node);
            return;
        }
        if (!lost->lost) {
            /* the driver heard of the death first: stop reading it here */
            lost->lost = true;
            if (lost->in.status == CFX_ERR_AGAIN)
                cfx__xfer_get_cancel(ctx, lost->scratch);
        }
        uint32_t g = lost->got;
        if (!lost->adopted)
            lost->adopting = true; /* its own share comes off with the last message */
        if (g >= out->nchunks)
            continue; /* it had delivered everything: nothing to replace */
        if (t->nchildren == CFX_RTASK_MAX_SLOTS) {
            rtask_fail(ctx, t, CFX_ERR_NO_RESOURCE, ctx->node_id);
            return;
        }
        struct cfx_rchild *ch = &t->child[t->nchildren++];
        memset(ch, 0, sizeof(*ch));
        ch->task = t;
        ch->in.status = CFX_ERR_CANCELED; /* not started */
        dp_to_rec(&a->child[i], &ch->node);
        memcpy(ch->src.bytes, a->child_obj[i], CFX_OBJECT_ID_LEN);
        for (uint32_t c = g; c < out->nchunks; c++)
            t->need[c]++;
        from = CFX_MIN(from, g);
        CFX_LOG(INFO, REDUCE, "node %u: reduce task %" PRIx64 ": reading node %u from chunk %u "
                "in place of node %u", ctx->node_id, t->task, ch->node.node_id, g,
                lost->node.node_id);
        child_shape(t, ch, 0);
        int status = child_start(ctx, t, ch, g, false);
        if (status != CFX_OK) {
            rtask_fail(ctx, t, status, ch->node.node_id);
            return;
        }
    }
    if (!a->last)
        return; /* more replacements to come: no chunk may count as whole yet */
    for (uint32_t c = 0; c < t->nchildren; c++) {
        struct cfx_rchild *lost = &t->child[c];
        if (!lost->adopting)
            continue;
        lost->adopting = false;
        lost->adopted = true;
        for (uint32_t k = lost->got; k < out->nchunks; k++)
            t->need[k]--;
        from = CFX_MIN(from, lost->got);
    }
    rtask_recheck(ctx, t, from);
}

void cfx__rtask_msg(struct cfx_context *ctx, struct cfx_conn *conn, const void *msg, size_t len)
{
    const struct cfx_dp_hdr *h = msg;
    if (h->type == CFX_DP_REDUCE_TASK) {
        rtask_start(ctx, conn, msg);
    } else if (h->type == CFX_DP_REDUCE_ABORT) {
        const struct cfx_dp_reduce_done *d = msg;
        rtask_abort(ctx, conn, d->task, d->status);
    } else if (h->type == CFX_DP_REDUCE_ADOPT) {
        rtask_adopt(ctx, conn, msg);
    } else if (h->type == CFX_DP_REDUCE_LOST) {
        const struct cfx_dp_reduce_done *d = msg;
        if (rwait_from_task(ctx, d->task, conn))
            rwait_lost(ctx, d->task, d->node_id);
        else
            CFX_LOG(WARN, REDUCE, "node %u: a loss report for reduce %" PRIx64 " from %s, "
                    "which runs none of its tasks: ignored", ctx->node_id, d->task, conn->name);
    } else {
        const struct cfx_dp_reduce_done *d = msg;
        rwait_finish(ctx, d->task, d->status < 0 && d->status > CFX_STATUS_LAST ? d->status
                     : d->status == CFX_OK ? CFX_OK : CFX_ERR_PROTO, d->node_id);
    }
    (void)len;
}

static void rtask_free(struct cfx_context *ctx, struct cfx_rtask *t)
{
    for (uint32_t c = 0; c < t->nchildren; c++) {
        struct cfx_obj *s = t->child[c].scratch;
        if (s) {
            s->in = NULL;
            cfx__obj_release(ctx, s);
        }
    }
    if (t->out && t->out->ephemeral)
        cfx__obj_release(ctx, t->out); /* an intermediate: its reader is done or gone */
    if (t->x) {
        t->x->refs--;
        pthread_cond_broadcast(&ctx->obj_cond); /* cfx_delete may wait for it */
        if (!t->x->refs && t->x->releasing)
            cfx__obj_release(ctx, t->x);
    }
    cfx_list_del(&t->link);
    free(t->count);
    free(t->need);
    free(t);
}

int cfx__rtask_poll(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    int n = 0;
    if (cfx_list_empty(&ctx->rtasks))
        return 0;
    uint64_t now = cfx__now_ns();
    cfx_list_for_each_safe(pos, tmp, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        if (t->status == CFX_ERR_AGAIN) {
            if (now < t->deadline)
                continue;
            rtask_fail(ctx, t, CFX_ERR_TIMEOUT, ctx->node_id);
        } else if (t->out && t->out->ephemeral && !t->aborted && now < t->deadline) {
            continue; /* an intermediate: a parent may adopt it until the reduce ends */
        } else if (t->done_due && now < t->deadline) {
            continue; /* its result's announcement awaits the directory's answer */
        }
        bool running = false;
        for (uint32_t c = 0; c < t->nchildren; c++) {
            if (t->child[c].in.status != CFX_ERR_AGAIN)
                continue;
            /* withdrawn but never acknowledged: cut it off */
            if (now > t->deadline + CANCEL_GRACE_NS && t->child[c].scratch)
                cfx__xfer_get_cancel(ctx, t->child[c].scratch);
            running = true;
        }
        if (!running) {
            rtask_free(ctx, t);
            n++;
        }
    }
    return n;
}

void cfx__rtask_destroy_all(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->rtasks) {
        struct cfx_rtask *t = cfx_list_entry(pos, struct cfx_rtask, link);
        for (uint32_t c = 0; c < t->nchildren; c++)
            t->child[c].in.status = CFX_ERR_CLOSED;
        rtask_free(ctx, t);
    }
    cfx_list_for_each_safe(pos, tmp, &ctx->waiting_gets) {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_p2p_rtr, link));
    }
}

/* ---- driver (API thread) -------------------------------------------------- */

/* Parent of position i among k in a binomial tree laid out in arrival
 * order: early arrivals are leaves, the last one is the root. */
static size_t tree_parent(size_t i, size_t k)
{
    size_t p = i + ((i + 1) & -(i + 1));
    return p >= k ? k - 1 : p;
}

static bool use_tree(struct cfx_context *ctx, uint64_t size, uint32_t chunk, size_t k)
{
    const char *force = getenv("CFX_REDUCE_SHAPE");
    if (force && !strcmp(force, "chain"))
        return false;
    if (k > TREE_MAX_INPUTS)
        return false;
    if (force && !strcmp(force, "tree"))
        return true;
    pthread_mutex_lock(&ctx->lock);
    double bw = ctx->est_bw > 0 ? ctx->est_bw : 1e9;
    double lat = ctx->est_lat > 0 ? ctx->est_lat : 100e-6;
    pthread_mutex_unlock(&ctx->lock);
    /* a chain costs one object time plus a chunk per hop; a binomial tree
     * one object time per level, since each level waits for the one below */
    double s = (double)size, c = (double)chunk;
    double chain = s / bw + (double)(k - 1) * (lat + c / bw);
    unsigned levels = 0;
    while ((1ull << levels) < k)
        levels++;
    double tree = (double)levels * (lat + s / bw);
    return tree < chain;
}

void cfx__rtask_derived_id(const struct cfx_object_id *result, uint64_t task, size_t pos,
                           struct cfx_object_id *out)
{
    char hex[CFX_OBJECT_ID_HEX_LEN], name[128];
    cfx_object_id_to_hex(result, hex);
    snprintf(name, sizeof(name), "conflux/reduce/%s/%" PRIx64 "/%zu", hex, task, pos);
    cfx_object_id_from_name(name, out);
}

int cfx__rtask_post(struct cfx_context *ctx, void *msg, size_t len,
                    const struct cfx_node_rec *node)
{
    struct cfx_cmd *cmd = calloc(1, sizeof(*cmd));
    if (!cmd)
        return CFX_ERR_NOMEM;
    cmd->type = CFX_CMD_RTASK;
    cmd->msg = msg;
    cmd->msg_len = len;
    cmd->node = *node;
    cmd->node_id = node->node_id == ctx->node_id ? 0 : node->node_id;
    cfx__cmd_post(ctx, cmd);
    return CFX_OK;
}

/* Progress thread: run a task here, or send it to its node. */
void cfx__rtask_cmd(struct cfx_context *ctx, struct cfx_cmd *cmd);
void cfx__rtask_cmd(struct cfx_context *ctx, struct cfx_cmd *cmd)
{
    if (cmd->node_id == 0) {
        cfx__rtask_msg(ctx, NULL, cmd->msg, cmd->msg_len);
    } else {
        int status = CFX_OK;
        struct cfx_conn *conn = cfx__conn_get(ctx, &cmd->node, &status);
        if (conn)
            status = cfx__conn_send(conn, cmd->msg, cmd->msg_len);
        if (status != CFX_OK && ((struct cfx_dp_hdr *)cmd->msg)->type == CFX_DP_REDUCE_TASK)
            rwait_finish(ctx, ((struct cfx_dp_reduce_task *)cmd->msg)->task, status,
                         cmd->node_id);
    }
    free(cmd->msg);
}

/* Where input @p id can be read now: CFX_OK with its node, size and chunk
 * size; CFX_ERR_TIMEOUT when no live node holds it yet; another error. */
static int locate_input(struct cfx_context *ctx, const struct cfx_object_id *id,
                        const uint32_t *dead, unsigned ndead, uint64_t deadline,
                        struct cfx_node_rec *node, uint64_t *sz, uint32_t *cs)
{
    uint64_t step = CFX_MIN(deadline, cfx__deadline_ns(5000));
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *o = cfx__store_find(&ctx->store, id);
    bool local = o && o->complete && !o->deleting;
    if (local) {
        *sz = o->size;
        *cs = o->chunk_size;
        *node = ctx->self;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (local)
        return CFX_OK;

    struct cfx_ctl_source src;
    int rc = cfx__ctl_obj_lookup_now(ctx->ctl, id, dead, ndead, step, &src);
    if (rc != CFX_OK)
        return rc;
    if (src.is_inline) {
        /* small input kept by the coordinator: hold it here */
        free(src.data);
        void *buf;
        size_t bsz;
        int ms = cfx__ms_left(deadline);
        struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                     .timeout_ms = ms < 1 ? 1 : ms };
        rc = cfx_get_alloc(ctx, id, &buf, &bsz, &gp);
        if (rc != CFX_OK)
            return rc;
        pthread_mutex_lock(&ctx->lock);
        o = cfx__store_find(&ctx->store, id);
        *cs = o ? o->chunk_size : cfx__chunk_size_for(bsz, 0);
        pthread_mutex_unlock(&ctx->lock);
        *sz = bsz;
        *node = ctx->self;
        return CFX_OK;
    }
    /* we only wanted to know where it is */
    cfx__ctl_obj_done(ctx->ctl, id, src.node.node_id, 0, step);
    *sz = src.size;
    *cs = src.chunk_size;
    *node = src.node;
    return CFX_OK;
}

/* Find k ready inputs, in the order they become ready. */
static int gather_inputs(struct cfx_context *ctx, const struct cfx_object_id *inputs, size_t n,
                         size_t k, uint64_t deadline, const uint32_t *dead, unsigned ndead,
                         const bool *lost, struct arrival *arr, uint64_t *size, uint32_t *chunk)
{
    bool *pending = calloc(n, sizeof(bool));
    size_t got = 0;
    unsigned poll_us = POLL_MIN_US;
    int rc = CFX_OK;

    if (!pending)
        return cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
    for (size_t i = 0; i < n; i++)
        pending[i] = !lost[i];
    while (got < k) {
        bool progress = false;
        for (size_t i = 0; i < n && got < k; i++) {
            if (!pending[i])
                continue;
            struct cfx_node_rec node;
            uint64_t sz;
            uint32_t cs;
            rc = locate_input(ctx, &inputs[i], dead, ndead, deadline, &node, &sz, &cs);
            if (rc == CFX_ERR_TIMEOUT)
                continue;
            if (rc != CFX_OK)
                goto out;
            if (got == 0) {
                *size = sz;
                *chunk = cs;
            } else if (sz != *size || cs != *chunk) {
                rc = cfx__err(CFX_ERR_INVALID, "reduce: input %zu is %" PRIu64 " bytes in %u-byte "
                              "chunks, input %zu is %" PRIu64 " in %u", i, sz, cs, arr[0].idx,
                              *size, *chunk);
                goto out;
            }
            pending[i] = false;
            arr[got].idx = i;
            arr[got].node = node;
            got++;
            progress = true;
        }
        if (got == k)
            break;
        if (!progress) {
            if (cfx__now_ns() >= deadline) {
                char missing[256] = "";
                size_t len = 0;
                for (size_t i = 0; i < n && len + 8 < sizeof(missing); i++)
                    if (pending[i])
                        len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%zu",
                                                len ? "," : "", i);
                rc = cfx__err(CFX_ERR_TIMEOUT, "reduce on node %u: %zu of the %zu inputs needed "
                              "became ready in time; still missing inputs %s", ctx->node_id,
                              got, k, missing);
                goto out;
            }
            usleep(poll_us);
            poll_us = CFX_MIN(poll_us * 2, (unsigned)POLL_MAX_US);
        } else {
            poll_us = POLL_MIN_US;
        }
    }
out:
    free(pending);
    return rc;
}

/* ---- one plan: its positions, and routing around dead ones ------------------ */

static void rec_dead(struct rplan *pl, uint32_t node)
{
    for (unsigned i = 0; i < pl->ndead; i++)
        if (pl->dead[i] == node)
            return;
    if (pl->ndead < MAX_DEAD)
        pl->dead[pl->ndead++] = node;
}

/* A new leaf position under @p parent: input pl->pos[p].idx from another
 * live holder.  Not a spare input: the parent's chunks before the break
 * already hold this input, so only the same input keeps every chunk a
 * reduction of the same k inputs (no holder: the driver plans again). */
static int replace_input(struct rplan *pl, size_t p, size_t parent, uint32_t who)
{
    struct cfx_node_rec node;
    uint64_t sz;
    uint32_t cs;
    size_t idx = pl->pos[p].idx;
    if (pl->npos == pl->cap)
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %.12s on node %u: node %u died and "
                        "this plan has replaced %zu positions already", pl->hex,
                        pl->ctx->node_id, who, pl->npos - pl->k);
    int rc = locate_input(pl->ctx, &pl->inputs[idx], pl->dead, pl->ndead, pl->deadline, &node,
                          &sz, &cs);
    if (rc == CFX_ERR_TIMEOUT)
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %.12s on node %u: node %u died "
                        "holding input %zu and no other node holds it", pl->hex,
                        pl->ctx->node_id, who, idx);
    if (rc != CFX_OK)
        return rc;
    if (sz != pl->size || cs != pl->chunk)
        return cfx__err(CFX_ERR_INVALID, "reduce: another copy of input %zu is %" PRIu64
                        " bytes in %u-byte chunks, not %" PRIu64 " in %u", idx, sz, cs, pl->size,
                        pl->chunk);
    struct rpos *y = &pl->pos[pl->npos++];
    *y = (struct rpos){ .idx = idx, .node = node, .obj = pl->inputs[idx], .parent = parent };
    return CFX_OK;
}

struct adopt_list {
    struct cfx_object_id replaces;
    size_t n;
    size_t *pos;                /* positions the adopting parent reads instead */
};

/* Position @p p (on dead node @p who) and every position below it on the
 * same node go; its parent @p q reads their live children and replacements
 * of their inputs instead. */
static int collect(struct rplan *pl, size_t p, size_t q, uint32_t who, struct adopt_list *al)
{
    /* not dead before it is replaced: a plan that fails here still lists
     * it, so the caller leaves its input out of the next plan */
    int rc = replace_input(pl, p, q, who);
    if (rc != CFX_OK)
        return rc;
    pl->pos[p].dead = true;
    al->pos[al->n++] = pl->npos - 1;
    for (size_t c = 0; c < pl->npos; c++) {
        if (pl->pos[c].parent != p || pl->pos[c].dead)
            continue;
        if (pl->pos[c].node.node_id == who) {
            if ((rc = collect(pl, c, q, who, al)) != CFX_OK)
                return rc;
        } else {
            pl->pos[c].parent = q;
            al->pos[al->n++] = c;
        }
    }
    return CFX_OK;
}

static int send_adopt(struct rplan *pl, size_t q, const struct adopt_list *al)
{
    struct cfx_context *ctx = pl->ctx;
    for (size_t i = 0; i < al->n; i += CFX_RTASK_MAX_CHILDREN) {
        struct cfx_dp_reduce_adopt *m = calloc(1, sizeof(*m));
        if (!m)
            return cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
        m->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                      .type = CFX_DP_REDUCE_ADOPT };
        m->task = pl->task;
        m->n = (uint8_t)CFX_MIN(al->n - i, (size_t)CFX_RTASK_MAX_CHILDREN);
        m->last = i + m->n == al->n;
        for (unsigned e = 0; e < m->n; e++) {
            const struct rpos *c = &pl->pos[al->pos[i + e]];
            memcpy(m->replaces[e], al->replaces.bytes, CFX_OBJECT_ID_LEN);
            memcpy(m->child_obj[e], c->obj.bytes, CFX_OBJECT_ID_LEN);
            cfx__rtask_rec_to_dp(&c->node, &m->child[e]);
        }
        pthread_mutex_lock(&ctx->lock);
        int rc = cfx__rtask_post(ctx, m, sizeof(*m), &pl->pos[q].node);
        pthread_mutex_unlock(&ctx->lock);
        if (rc != CFX_OK) {
            free(m);
            return rc;
        }
    }
    return CFX_OK;
}

/* Route the running plan around dead node @p who. */
static int reroute(struct rplan *pl, uint32_t who, size_t root)
{
    struct cfx_context *ctx = pl->ctx;
    if (who == pl->pos[root].node.node_id)
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %.12s: node %u, which produces the "
                        "result, died", pl->hex, who);
    rec_dead(pl, who);
    size_t npos0 = pl->npos;
    for (size_t p = 0; p < npos0; p++) {
        struct rpos *x = &pl->pos[p];
        if (x->dead || x->node.node_id != who || x->parent == NO_PARENT)
            continue;
        size_t q = x->parent;
        if (pl->pos[q].node.node_id == who)
            continue; /* goes with its parent */
        struct adopt_list al = { .replaces = x->obj, .n = 0 };
        al.pos = calloc(pl->cap, sizeof(*al.pos));
        if (!al.pos)
            return cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
        int rc = collect(pl, p, q, who, &al);
        if (rc == CFX_OK)
            rc = send_adopt(pl, q, &al);
        free(al.pos);
        if (rc != CFX_OK)
            return rc;
        CFX_LOG(INFO, REDUCE, "node %u: reduce into %.12s: node %u died; node %u reads its "
                "%zu replacement stream(s) instead", ctx->node_id, pl->hex, who,
                pl->pos[q].node.node_id, al.n);
    }
    return CFX_OK;
}

void cfx__rtask_post_abort(struct cfx_context *ctx, uint64_t task, int status,
                           const struct cfx_node_rec *node)
{
    struct cfx_dp_reduce_done *a = calloc(1, sizeof(*a));
    if (!a)
        return; /* its tasks end at their deadline */
    a->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                  .type = CFX_DP_REDUCE_ABORT };
    a->task = task;
    a->status = status;
    if (cfx__rtask_post(ctx, a, sizeof(*a), node) != CFX_OK)
        free(a);
}

static void post_aborts(struct rplan *pl, bool all)
{
    struct cfx_context *ctx = pl->ctx;
    pthread_mutex_lock(&ctx->lock);
    for (size_t p = 0; p < pl->npos; p++)
        if (pl->pos[p].task && (!pl->pos[p].dead || all))
            cfx__rtask_post_abort(ctx, pl->task, 0, &pl->pos[p].node);
    pthread_mutex_unlock(&ctx->lock);
}

/* One plan and its execution; on failure *who names the node blamed.  On
 * return arr holds the k inputs the plan ended with. */
static bool in_nodes(const uint32_t *nodes, size_t n, uint32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (nodes[i] == id)
            return true;
    return false;
}

/* The placement query for the result: data placement (coord_place.c) among
 * the holders of the ready inputs that are in the caller's node set. */
static int place_msg(struct rplan *pl, const struct arrival *arr, struct cfx_msg_task *t)
{
    const struct cfx_task_needs *nd = pl->place;
    bool set = nd && (nd->field_mask & CFX_TASK_NEEDS_NODES);
    if (set && (nd->n_nodes > CFX_TASK_NODES_MAX || (nd->n_nodes && !nd->nodes)))
        return cfx__err(CFX_ERR_INVALID, "reduce into %.12s: a node set of %zu nodes (at most "
                        "%d)", pl->hex, nd->n_nodes, CFX_TASK_NODES_MAX);
    t->flags = CFX_PROTO_TASK_DATA;
    t->memory = pl->size;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_MEMORY) && nd->memory > t->memory)
        t->memory = nd->memory;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_GPUS))
        t->gpus = nd->gpus;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_POLICY) && nd->policy == CFX_TASK_PACK)
        t->flags |= CFX_PROTO_TASK_PACK;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_GROUP) && nd->group) {
        if (strlen(nd->group) > CFX_TASK_GROUP_MAX)
            return cfx__err(CFX_ERR_INVALID, "reduce into %.12s: group name longer than %d "
                            "bytes", pl->hex, CFX_TASK_GROUP_MAX);
        snprintf(t->group, sizeof(t->group), "%s", nd->group);
    }
    char holders[128] = "";
    size_t len = 0;
    for (size_t i = 0; i < pl->k; i++) {
        uint32_t id = arr[i].node.node_id;
        if (in_nodes(t->nodes, t->nnodes, id))
            continue;
        if (len + 12 < sizeof(holders))
            len += (size_t)snprintf(holders + len, sizeof(holders) - len, "%s%u",
                                    len ? ", " : "", id);
        if ((!set || in_nodes(nd->nodes, nd->n_nodes, id)) && t->nnodes < CFX_TASK_NODES_MAX)
            t->nodes[t->nnodes++] = id;
    }
    if (!t->nnodes)
        return cfx__err(CFX_ERR_NO_RESOURCE, "reduce into %.12s: the result is produced on a "
                        "node holding one of the inputs, and none of the holders of the %zu "
                        "inputs ready (nodes %s) is in the node set", pl->hex, pl->k, holders);
    for (size_t i = 0; i < pl->k && t->ninputs < CFX_TASK_IO_MAX; i++)
        t->inputs[t->ninputs++] = pl->inputs[arr[i].idx];
    return CFX_OK;
}

/*
 * Where the result goes (see cfx_reduce_objects): ask the coordinator's
 * placement which holder of the k ready inputs produces it, and move that
 * holder's input to the last position, the root of either shape.  All k
 * are ready when the plan is made, so the order of the others (arrival)
 * is kept and the root costs nothing in waiting.  With no placement asked
 * for, a coordinator that cannot answer leaves the last arrival the root.
 */
static int place_root(struct rplan *pl, struct arrival *arr)
{
    struct cfx_context *ctx = pl->ctx;
    struct cfx_msg m = { .type = CFX_MSG_TASK_PLACE }, reply;
    void *frame = NULL;
    int rc = place_msg(pl, arr, &m.u.task);
    if (rc == CFX_OK)
        rc = cfx__ctl_request(ctx->ctl, &m, CFX_MIN(pl->deadline, cfx__deadline_ns(5000)),
                              "placement of a reduce result", CFX_MSG_TASK_REPLY, &reply,
                              &frame);
    free(frame);
    if (rc != CFX_OK) {
        if (pl->place)
            return rc == CFX_ERR_NO_RESOURCE || rc == CFX_ERR_INVALID
                       ? rc
                       : cfx__err(rc, "reduce into %.12s: placing the result: %s", pl->hex,
                                  cfx_last_error());
        CFX_LOG(DEBUG, REDUCE, "node %u: reduce into %.12s: no placement (%s); the last input "
                "ready is the root", ctx->node_id, pl->hex, cfx_last_error());
        cfx__err_clear();
        return CFX_OK;
    }
    uint32_t node = reply.u.task_st.node_id;
    for (size_t j = pl->k; j-- > 0;) {
        if (arr[j].node.node_id != node)
            continue;
        struct arrival root = arr[j];
        memmove(&arr[j], &arr[j + 1], (pl->k - 1 - j) * sizeof(*arr));
        arr[pl->k - 1] = root;
        CFX_LOG(DEBUG, REDUCE, "node %u: reduce into %.12s: the result goes to node %u "
                "(input %zu)", ctx->node_id, pl->hex, node, root.idx);
        return CFX_OK;
    }
    return cfx__err(CFX_ERR_PROTO, "reduce into %.12s: placement chose node %u, which holds "
                    "none of the inputs ready", pl->hex, node);
}

static int reduce_attempt(struct rplan *pl, struct arrival *arr, uint32_t *who)
{
    struct cfx_context *ctx = pl->ctx;
    size_t k = pl->k;
    int rc = CFX_OK;

    int prc = place_root(pl, arr);
    if (prc != CFX_OK)
        return prc;
    bool tree = use_tree(ctx, pl->size, pl->chunk, k);
    size_t root = k - 1;
    pthread_mutex_lock(&ctx->lock);
    pl->task = (uint64_t)ctx->node_id << 32 | (++ctx->rtask_counter & 0xffffffffu);
    pthread_mutex_unlock(&ctx->lock);

    pl->npos = k;
    for (size_t i = 0; i < k; i++) {
        pl->pos[i] = (struct rpos){ .idx = arr[i].idx, .node = arr[i].node,
                                    .parent = i == root ? NO_PARENT : tree ? tree_parent(i, k)
                                                                            : i + 1 };
    }
    for (size_t i = 0; i + 1 < k; i++)
        pl->pos[pl->pos[i].parent].task = true;
    pl->pos[root].task = true;
    for (size_t i = 0; i < k; i++) {
        if (i == root)
            pl->pos[i].obj = *pl->result;
        else if (pl->pos[i].task)
            cfx__rtask_derived_id(pl->result, pl->task, i, &pl->pos[i].obj);
        else
            pl->pos[i].obj = pl->inputs[pl->pos[i].idx];
    }

    /* only the death of the result's node ends this plan at once; any other
     * is routed around when a task reports the stream it lost */
    uint32_t root_node = pl->pos[root].node.node_id;
    uint32_t *tasks = calloc(k, sizeof(*tasks));
    size_t ntasks = 0;
    if (!tasks)
        return cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
    for (size_t p = 0; p < k; p++)
        if (pl->pos[p].task)
            tasks[ntasks++] = pl->pos[p].node.node_id;
    struct cfx_rwait wait = { .task = pl->task, .status = CFX_ERR_AGAIN, .nodes = &root_node,
                              .nnodes = 1, .tasks = tasks, .ntasks = ntasks };
    pthread_mutex_lock(&ctx->lock);
    cfx_list_add_tail(&wait.link, &ctx->rwaits);
    pthread_mutex_unlock(&ctx->lock);

    int ms_left = cfx__ms_left(pl->deadline);
    for (size_t p = 0; p < k && rc == CFX_OK; p++) {
        if (!pl->pos[p].task)
            continue; /* a leaf: its parent reads its input directly */
        struct cfx_dp_reduce_task *m = calloc(1, sizeof(*m));
        if (!m) {
            rc = cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
            break;
        }
        m->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                      .type = CFX_DP_REDUCE_TASK };
        m->task = pl->task;
        memcpy(m->input, pl->inputs[pl->pos[p].idx].bytes, CFX_OBJECT_ID_LEN);
        memcpy(m->output, pl->pos[p].obj.bytes, CFX_OBJECT_ID_LEN);
        m->size = pl->size;
        m->chunk_size = pl->chunk;
        m->timeout_ms = ms_left < 0 ? 0x7fffffffu : (uint32_t)ms_left;
        m->dtype = (uint8_t)pl->dtype;
        m->op = (uint8_t)pl->op;
        /* with no spare input a failure of the root cannot be re-planned, so
         * the result can be read while it is produced (allreduce = reduce +
         * gets overlapping); with spares it appears once complete, so a
         * reader never mixes two plans' bytes */
        m->final = CFX_RTASK_REPAIR;
        if (p == root)
            m->final |= (uint8_t)(CFX_RTASK_FINAL | (k == pl->n ? CFX_RTASK_EARLY : 0));
        for (size_t c = 0; c < k; c++) {
            if (pl->pos[c].parent != p)
                continue;
            memcpy(m->child_obj[m->nchildren], pl->pos[c].obj.bytes, CFX_OBJECT_ID_LEN);
            cfx__rtask_rec_to_dp(&pl->pos[c].node, &m->child[m->nchildren]);
            m->nchildren++;
        }
        pthread_mutex_lock(&ctx->lock);
        rc = cfx__rtask_post(ctx, m, sizeof(*m), &pl->pos[p].node);
        pthread_mutex_unlock(&ctx->lock);
        if (rc != CFX_OK)
            free(m);
    }

    unsigned handled = 0, reroutes = 0;
    char why[256] = ""; /* why a reroute failed */
    pthread_mutex_lock(&ctx->lock);
    while (rc == CFX_OK && wait.status == CFX_ERR_AGAIN) {
        if (wait.nlost > handled) {
            uint32_t node = wait.lost[handled++];
            pthread_mutex_unlock(&ctx->lock);
            int r = reroute(pl, node, root);
            pthread_mutex_lock(&ctx->lock);
            if (r != CFX_OK && wait.status == CFX_ERR_AGAIN) {
                snprintf(why, sizeof(why), "%s", cfx_last_error());
                wait.status = r;
                wait.node_id = node;
            }
            reroutes += r == CFX_OK;
            continue;
        }
        if (cfx__ctx_closing(ctx) || !cfx__obj_wait(ctx, pl->deadline))
            break;
    }
    int st = wait.status;
    *who = wait.node_id;
    cfx_list_del(&wait.link);
    pthread_mutex_unlock(&ctx->lock);
    free(tasks);
    /* end every task of this plan: on failure they stop (they would time
     * out anyway); on success their intermediates, kept until now for a
     * parent that might have adopted them, are freed */
    post_aborts(pl, st != CFX_OK);
    if (reroutes) {
        pthread_mutex_lock(&ctx->lock);
        ctx->stats.reduce_reroutes += reroutes;
        pthread_mutex_unlock(&ctx->lock);
    }

    size_t a = 0;
    for (size_t p = 0; p < pl->npos && a < k; p++)
        if (!pl->pos[p].dead)
            arr[a++] = (struct arrival){ .idx = pl->pos[p].idx, .node = pl->pos[p].node };
    if (rc == CFX_OK) {
        if (st == CFX_ERR_AGAIN)
            rc = cfx__err(CFX_ERR_TIMEOUT, "reduce into %.12s on node %u: the result was not "
                          "produced within %d ms", pl->hex, ctx->node_id, pl->timeout_ms);
        else if (st != CFX_OK && why[0])
            rc = cfx__err(st, "%s", why);
        else if (st != CFX_OK)
            rc = cfx__err(st, "reduce into %.12s: node %u failed: %s", pl->hex, *who,
                          cfx_strerror(st));
    }
    CFX_LOG(DEBUG, REDUCE, "node %u: reduce of %zu/%zu inputs (%" PRIu64 " B) as a %s, %u "
            "reroute(s): %s", ctx->node_id, k, pl->n, pl->size, tree ? "tree" : "chain",
            reroutes, cfx_errname(rc));
    return rc;
}

/* The result's id must name no object yet: one that does fails the reduce
 * at once (the directory would refuse the result's announcement at its
 * end: cfx__rtask_put_answer).  A copy got from a cached location does not
 * count (it gives way, as to a put). */
static int result_free(struct cfx_context *ctx, const struct cfx_object_id *result,
                       const char *hex, uint64_t deadline)
{
    pthread_mutex_lock(&ctx->lock);
    const struct cfx_obj *o = cfx__store_find(&ctx->store, result);
    bool here = o && !o->deleting && !(o->complete && o->unrecorded);
    pthread_mutex_unlock(&ctx->lock);
    if (here)
        return cfx__err(CFX_ERR_EXISTS, "reduce into %.12s: node %u holds an object of that id "
                        "already; a result needs an id of its own", hex, ctx->node_id);
    uint64_t step = CFX_MIN(deadline, cfx__deadline_ns(5000));
    struct cfx_ctl_source src;
    int rc = cfx__ctl_obj_lookup_now(ctx->ctl, result, NULL, 0, step, &src);
    if (rc == CFX_ERR_TIMEOUT) { /* no node holds it */
        cfx__err_clear();
        return CFX_OK;
    }
    if (rc != CFX_OK)
        return rc;
    if (!src.is_inline) /* we only wanted to know whether it is there */
        cfx__ctl_obj_done(ctx->ctl, result, src.node.node_id, 0, step);
    free(src.data);
    return cfx__err(CFX_ERR_EXISTS, "reduce into %.12s: the id names an object already (node %u "
                    "put it, %" PRIu64 " bytes); a result needs an id of its own", hex,
                    src.putter, src.size);
}

static int reduce_call(struct cfx_context *ctx, const struct cfx_object_id *inputs, size_t n,
                       size_t k, enum cfx_dtype dtype, enum cfx_redop op,
                       const struct cfx_object_id *result, const struct cfx_obj_params *params,
                       size_t *used)
{
    int rc;

    cfx__err_clear();
    if (!ctx || !inputs || !result)
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: NULL argument");
    if (n == 0 || n > MAX_INPUTS || k == 0 || k > n)
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: need 1 <= k <= n <= %d "
                        "(k = %zu, n = %zu)", MAX_INPUTS, k, n);
    if ((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST)
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: unknown dtype %d or op %d",
                        (int)dtype, (int)op);
    struct rplan pl = { .ctx = ctx, .inputs = inputs, .n = n, .k = k, .dtype = dtype, .op = op,
                        .result = result };
    pl.timeout_ms = params && (params->field_mask & CFX_OBJ_PARAM_TIMEOUT) ? params->timeout_ms
                                                                          : ctx->cfg.timeout_ms;
    pl.deadline = cfx__deadline_ns(pl.timeout_ms);
    pl.place = params && (params->field_mask & CFX_OBJ_PARAM_PLACE) ? params->place : NULL;
    bool allreduce = params && (params->field_mask & CFX_OBJ_PARAM_FLAGS) &&
                     (params->flags & CFX_OBJ_FLAG_ALLREDUCE);
    bool striped_tried = false;
    cfx_object_id_to_hex(result, pl.hex);
    pl.cap = 2 * k + 1;

    rc = result_free(ctx, result, pl.hex, pl.deadline);
    if (rc != CFX_OK)
        return rc;
    struct arrival *arr = calloc(k, sizeof(*arr));
    pl.lost = calloc(n, sizeof(bool));
    pl.pos = calloc(pl.cap, sizeof(*pl.pos));
    if (!arr || !pl.lost || !pl.pos) {
        rc = cfx__err(CFX_ERR_NOMEM, "cfx_reduce_objects: out of memory");
        goto out;
    }
    for (int attempt = 0;; attempt++) {
        uint32_t who = 0;
        rc = gather_inputs(ctx, inputs, n, k, pl.deadline, pl.dead, pl.ndead, pl.lost, arr,
                           &pl.size, &pl.chunk);
        if (rc == CFX_ERR_TIMEOUT && pl.ndead) {
            rc = cfx__err(CFX_ERR_PEER_FAILED, "reduce into %.12s on node %u: node %u died and "
                          "too few of the other inputs became ready in time (%s)", pl.hex,
                          ctx->node_id, pl.dead[pl.ndead - 1], cfx_last_error());
            break;
        }
        if (rc != CFX_OK)
            break;
        size_t dsz = cfx_dtype_size(dtype);
        if (pl.size % dsz || pl.chunk % dsz) {
            rc = cfx__err(CFX_ERR_INVALID, "reduce: inputs of %" PRIu64 " bytes are not a whole "
                          "number of %s elements", pl.size, cfx_dtype_name(dtype));
            break;
        }
        rc = CFX_ERR_UNSUPPORTED;
        if (allreduce && !striped_tried && k == n && !pl.place) {
            striped_tried = true;
            rc = cfx__reduce_striped(&pl, arr, &who);
            if (rc != CFX_OK && rc != CFX_ERR_UNSUPPORTED)
                CFX_LOG(INFO, REDUCE, "node %u: striped reduce into %.12s failed (%s); the "
                        "plain plan runs instead", ctx->node_id, pl.hex, cfx_last_error());
        }
        /* a striped plan that failed for want of another node (a dead
         * one) plans again without it below; any other failure runs the
         * plain plan with the same inputs */
        if (rc == CFX_ERR_UNSUPPORTED ||
            (rc != CFX_OK && (rc != CFX_ERR_PEER_FAILED || !who || who == ctx->node_id))) {
            cfx__err_clear();
            rc = reduce_attempt(&pl, arr, &who);
        }
        if (rc == CFX_OK) {
            if (used)
                for (size_t i = 0; i < k; i++)
                    used[i] = arr[i].idx;
            break;
        }
        /* The plan could not go on (the result's node died, or a reroute
         * found no replacement): leave the dead node's inputs out and plan
         * again with spares if there are enough; the tasks of the failed
         * plan have been told to stop. */
        if (rc != CFX_ERR_PEER_FAILED || !who || who == ctx->node_id ||
            attempt + 1 >= MAX_ATTEMPTS)
            break;
        rec_dead(&pl, who);
        for (size_t i = 0; i < k; i++)
            if (arr[i].node.node_id == who && !pl.lost[arr[i].idx]) {
                pl.lost[arr[i].idx] = true;
                pl.nlost++;
            }
        if (n - pl.nlost < k) {
            rc = cfx__err(CFX_ERR_PEER_FAILED, "reduce into %.12s on node %u: node %u died "
                          "holding an input, and %zu of %zu inputs cannot make %zu (%s)", pl.hex,
                          ctx->node_id, who, n - pl.nlost, n, k, cfx_last_error());
            break;
        }
        CFX_LOG(INFO, REDUCE, "node %u: reduce into %.12s: node %u failed; planning again "
                "without it", ctx->node_id, pl.hex, who);
        pthread_mutex_lock(&ctx->lock);
        ctx->stats.reduce_replans++;
        pthread_mutex_unlock(&ctx->lock);
    }
out:
    free(pl.pos);
    free(pl.lost);
    free(arr);
    return rc;
}

/* Counted for cfx_context_destroy(). */
int cfx_reduce_objects(struct cfx_context *ctx, const struct cfx_object_id *inputs, size_t n,
                       size_t k, enum cfx_dtype dtype, enum cfx_redop op,
                       const struct cfx_object_id *result, const struct cfx_obj_params *params,
                       size_t *used)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_reduce_objects") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = reduce_call(ctx, inputs, n, k, dtype, op, result, params, used);
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

/*
 * Object reduce (Hoplite style): the holders of the inputs form a chain or a
 * binomial tree in the order the inputs became ready; each inner node pulls
 * its children's partial results through a small scratch ring (no copy of a
 * whole child object), reduces every chunk into its own output as it lands,
 * and serves that output, chunk by chunk, to its parent.  The root's output
 * is the result object.
 *
 * Driver: cfx_reduce_objects() (any API thread, objreduce_plan.c) finds k
 * ready inputs, plans the shape and sends one REDUCE_TASK per inner node.
 * Node side (this file): the progress thread runs tasks (ctx->lock held).
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
#define CANCEL_GRACE_NS   1000000000ull

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
    /* a task the driver cancelled (a reduce of the first k of n that had
     * its k, a replan) ended as asked: no warning */
    if (status == CFX_ERR_CANCELED)
        CFX_LOG(DEBUG, REDUCE, "node %u: reduce task %" PRIx64 " cancelled", ctx->node_id,
                t->task);
    else
        CFX_LOG(WARN, REDUCE, "node %u: reduce task %" PRIx64 " failed: %s (node %u)",
                ctx->node_id, t->task, cfx_errname(status), node);
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
    cfx__status_set(&ch->in.status, CFX_ERR_AGAIN);
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
    cfx__status_set(&ch->in.status, CFX_ERR_CANCELED); /* not started */
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

    if (t->nchildren == 0 || !out->size) {
        /* a reduce of one input (or a leaf of a stripe's chain): the
         * output is a copy of it; of empty inputs, empty: no stream to
         * read (a stream of no chunk ended as lost, and the driver took
         * the result's own node for dead) */
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
    /* a child that failed at once (its node known dead: no connection is
     * tried) failed the task in children_start(), which released the
     * output: nothing to serve then */
    if (t->out == out)
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
        cfx__status_set(&ch->in.status, CFX_ERR_CANCELED); /* not started */
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
            cfx__status_set(&t->child[c].in.status, CFX_ERR_CLOSED);
        rtask_free(ctx, t);
    }
    cfx_list_for_each_safe(pos, tmp, &ctx->waiting_gets) {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_p2p_rtr, link));
    }
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


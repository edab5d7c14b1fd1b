/*
 * Object reduce, the driver's side (cfx_reduce_objects(), any API thread):
 * find k ready inputs in the order they become ready, place the result,
 * plan a chain or a binomial tree, send the tasks and route around the
 * dead (the node side, which runs the tasks, is objreduce.c; the striped
 * plan of an allreduce is objstripe.c).
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

#define POLL_MIN_US       500        /* first re-check of missing inputs */
#define POLL_MAX_US       20000      /* ... backing off to this */
#define MAX_INPUTS        1024
#define TREE_MAX_INPUTS   64         /* binomial trees up to this; chains beyond */
#define MAX_ATTEMPTS      4          /* plans tried when participants die */

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

/* Where input @p id can be read now: CFX_OK with its node, size and chunk
 * size; CFX_ERR_TIMEOUT when no live node holds it yet; another error. */
static int locate_input(struct cfx_context *ctx, const struct cfx_object_id *id,
                        const uint32_t *dead, unsigned ndead, uint64_t deadline,
                        struct cfx_node_rec *node, uint64_t *sz, uint32_t *cs)
{
    uint64_t step = CFX_MIN(deadline, cfx__deadline_ns(5000));
    int tries = 0;
again:
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
    if (rc == CFX_ERR_AGAIN && tries++ < 3) /* this node put it meanwhile: it is here */
        goto again;
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
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %s on node %u: node %u died and "
                        "this plan has replaced %zu positions already", pl->hex,
                        pl->ctx->node_id, who, pl->npos - pl->k);
    int rc = locate_input(pl->ctx, &pl->inputs[idx], pl->dead, pl->ndead, pl->deadline, &node,
                          &sz, &cs);
    if (rc == CFX_ERR_TIMEOUT)
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %s on node %u: node %u died "
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
        return cfx__err(CFX_ERR_PEER_FAILED, "reduce into %s: node %u, which produces the "
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
        CFX_LOG(INFO, REDUCE, "node %u: reduce into %s: node %u died; node %u reads its "
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
    /* n_nodes 0 is any node (task.h), as for a task */
    bool set = nd && (nd->field_mask & CFX_TASK_NEEDS_NODES) && nd->n_nodes;
    if (set && !nd->nodes)
        return cfx__err(CFX_ERR_INVALID, "reduce into %s: a node set of %zu nodes with no node "
                        "list", pl->hex, nd->n_nodes);
    if (set && nd->n_nodes > CFX_TASK_NODES_MAX)
        return cfx__err(CFX_ERR_INVALID, "reduce into %s: a node set of %zu nodes (at most "
                        "%d)", pl->hex, nd->n_nodes, CFX_TASK_NODES_MAX);
    t->flags = CFX_PROTO_TASK_DATA;
    t->memory = pl->size;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_MEMORY) && nd->memory > t->memory)
        t->memory = nd->memory;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_GPUS))
        t->gpus = nd->gpus;
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_POLICY) && nd->policy == CFX_TASK_PACK)
        t->flags |= CFX_PROTO_TASK_PACK;
    else if (nd && (nd->field_mask & CFX_TASK_NEEDS_POLICY) && nd->policy != CFX_TASK_SPREAD)
        return cfx__err(CFX_ERR_INVALID, "reduce into %s: unknown policy %d", pl->hex,
                        (int)nd->policy);
    if (nd && (nd->field_mask & CFX_TASK_NEEDS_GROUP) && nd->group) {
        if (strlen(nd->group) > CFX_TASK_GROUP_MAX)
            return cfx__err(CFX_ERR_INVALID, "reduce into %s: group name longer than %d "
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
        return cfx__err(CFX_ERR_NO_RESOURCE, "reduce into %s: the result is produced on a "
                        "node holding one of the inputs, and none of the holders of the %zu "
                        "inputs ready (nodes %s) is in the node set%s", pl->hex, pl->k, holders,
                        pl->size <= CFX_OBJECT_INLINE_MAX
                            ? " (inputs this small, unless put with CFX_OBJ_FLAG_NO_INLINE, are "
                              "kept by the coordinator: the calling node fetched and holds them)"
                            : "");
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
                       : cfx__err(rc, "reduce into %s: placing the result: %s", pl->hex,
                                  cfx_last_error());
        CFX_LOG(DEBUG, REDUCE, "node %u: reduce into %s: no placement (%s); the last input "
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
        CFX_LOG(DEBUG, REDUCE, "node %u: reduce into %s: the result goes to node %u "
                "(input %zu)", ctx->node_id, pl->hex, node, root.idx);
        return CFX_OK;
    }
    return cfx__err(CFX_ERR_PROTO, "reduce into %s: placement chose node %u, which holds "
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
        /* the thread's interrupt check (cfx_set_interrupt_check) may end
         * the wait: the plan's tasks are stopped as on a failure */
        if (cfx__intr_fired()) {
            snprintf(why, sizeof(why), "reduce into %s: interrupted while waiting for its "
                     "result", pl->hex);
            wait.status = CFX_ERR_CANCELED;
            break;
        }
        if (cfx__ctx_closing(ctx) || !cfx__obj_wait_intr(ctx, pl->deadline))
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
            rc = cfx__err(CFX_ERR_TIMEOUT, "reduce into %s on node %u: the result was not "
                          "produced within %d ms", pl->hex, ctx->node_id, pl->timeout_ms);
        else if (st != CFX_OK && why[0])
            rc = cfx__err(st, "%s", why);
        else if (st != CFX_OK)
            rc = cfx__err(st, "reduce into %s: node %u failed: %s", pl->hex, *who,
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
        return cfx__err(CFX_ERR_EXISTS, "reduce into %s: node %u holds an object of that id "
                        "already; a result needs an id of its own", hex, ctx->node_id);
    uint64_t step = CFX_MIN(deadline, cfx__deadline_ns(5000));
    struct cfx_ctl_source src;
    int rc = cfx__ctl_obj_lookup_now(ctx->ctl, result, NULL, 0, step, &src);
    if (rc == CFX_ERR_AGAIN) /* this node put it meanwhile */
        return cfx__err(CFX_ERR_EXISTS, "reduce into %s: node %u holds an object of that id "
                        "already; a result needs an id of its own", hex, ctx->node_id);
    if (rc == CFX_ERR_TIMEOUT) { /* no node holds it */
        cfx__err_clear();
        pthread_mutex_lock(&ctx->lock);
        ctx->reduce_id_checks++;
        pthread_mutex_unlock(&ctx->lock);
        return CFX_OK;
    }
    if (rc != CFX_OK)
        return rc;
    if (!src.is_inline) /* we only wanted to know whether it is there */
        cfx__ctl_obj_done(ctx->ctl, result, src.node.node_id, 0, step);
    free(src.data);
    return cfx__err(CFX_ERR_EXISTS, "reduce into %s: the id names an object already (node %u "
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
    uint64_t m = params ? params->field_mask : 0;
    rc = cfx__mask_check(m, CFX_OBJ_PARAM_ALL, "cfx_reduce_objects", "cfx_obj_params.field_mask");
    if (rc == CFX_OK && (m & CFX_OBJ_PARAM_PLACE) && params->place)
        rc = cfx__mask_check(params->place->field_mask, CFX_TASK_NEEDS_ALL, "cfx_reduce_objects",
                             "cfx_task_needs.field_mask");
    if (rc != CFX_OK)
        return rc;
    if (n == 0 || n > MAX_INPUTS || k == 0 || k > n)
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: need 1 <= k <= n <= %d "
                        "(k = %zu, n = %zu)", MAX_INPUTS, k, n);
    if ((unsigned)dtype >= CFX_DTYPE_LAST || (unsigned)op >= CFX_OP_LAST)
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: unknown dtype %d or op %d",
                        (int)dtype, (int)op);
    if (params && (params->field_mask & CFX_OBJ_PARAM_FLAGS) &&
        (params->flags & ~(uint64_t)(CFX_OBJ_FLAG_NO_INLINE | CFX_OBJ_FLAG_NO_KEEP |
                                     CFX_OBJ_FLAG_ALLREDUCE)))
        return cfx__err(CFX_ERR_INVALID, "cfx_reduce_objects: unknown flags %#llx",
                        (unsigned long long)params->flags);
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
            rc = cfx__err(CFX_ERR_PEER_FAILED, "reduce into %s on node %u: node %u died and "
                          "too few of the other inputs became ready in time (%s)", pl.hex,
                          ctx->node_id, pl.dead[pl.ndead - 1], cfx_last_error());
            break;
        }
        if (rc != CFX_OK)
            break;
        size_t dsz = cfx_dtype_size(dtype);
        if (pl.size % dsz) {
            rc = cfx__err(CFX_ERR_INVALID, "reduce: inputs of %" PRIu64 " bytes are not a whole "
                          "number of %s elements", pl.size, cfx_dtype_name(dtype));
            break;
        }
        if (pl.chunk % dsz) { /* chunks are reduced each on its own */
            rc = cfx__err(CFX_ERR_INVALID, "reduce: the inputs' chunks of %" PRIu32 " bytes "
                          "are not a whole number of %s elements (put them with a chunk_size "
                          "that is)", pl.chunk, cfx_dtype_name(dtype));
            break;
        }
        rc = CFX_ERR_UNSUPPORTED;
        if (allreduce && !striped_tried && k == n && !pl.place) {
            striped_tried = true;
            rc = cfx__reduce_striped(&pl, arr, &who);
            if (rc != CFX_OK && rc != CFX_ERR_UNSUPPORTED)
                CFX_LOG(INFO, REDUCE, "node %u: striped reduce into %s failed (%s); the "
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
            rc = cfx__err(CFX_ERR_PEER_FAILED, "reduce into %s on node %u: node %u died "
                          "holding an input, and %zu of %zu inputs cannot make %zu (%s)", pl.hex,
                          ctx->node_id, who, n - pl.nlost, n, k, cfx_last_error());
            break;
        }
        CFX_LOG(INFO, REDUCE, "node %u: reduce into %s: node %u failed; planning again "
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
    cfx__intr_begin(); /* its wait for the result runs the thread's interrupt check */
    rc = reduce_call(ctx, inputs, n, k, dtype, op, result, params, used);
    cfx__intr_end();
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

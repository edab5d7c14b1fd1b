/*
 * Striped object allreduce (CFX_OBJ_FLAG_ALLREDUCE; conflux/object.h says
 * when it applies): a reduce-scatter and an allgather of objects, built
 * from the reduce tasks of objreduce.c.
 *
 * The nodes holding inputs, in the order their first input became ready,
 * are a ring, when they are on more than one host (spans_hosts).  The
 * result is cut into one stripe of whole chunks per node (cfx__stripe_first;
 * up to STRIPES_MAX).  Stripe j is reduced along a chain of every input,
 * node by node from node j + 1 round to node j: each task reduces its
 * input's range of the stripe (REDUCE_TASK offset) with the stream of the
 * position before it.  Every node runs a gather task (CFX_RTASK_GATHER)
 * whose output is a whole copy of the result: it is the root of its own
 * stripe's chain (the last stream, reduced with its input straight into
 * the copy) and reads every other stripe out of the copy of the node
 * before it, each chunk as soon as it landed there.  So every node sends
 * all it sends to the next node, (m-1)/m of the object for the reduce and
 * (m-1)/m for the gather: 2(m-1)/m, the ring's bound, with each chunk
 * forwarded as soon as it is whole.  The streams are ordinary reduce
 * streams (a ring of scratch chunks, credits); new on the wire are only
 * the range, the gather and its stripes.
 *
 * The copies stay unannounced, and are read only by the next node's gather
 * and gets on their own node, until every gather has reported; the driver
 * then tells each node to keep its copy (REDUCE_ABORT with CFX_RTASK_KEEP):
 * one node's is the result's put (this node's when it holds an input), the
 * others announce themselves as copies of that put.  Anything less, and
 * every task is told to drop what it made; the caller runs the plain plan.
 * The driver does not route around a dead participant here: a chain broken
 * anywhere breaks a stripe, which every copy needs.
 */
#include "objreduce.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define STRIPES_MAX       CFX_RTASK_MAX_SLOTS /* a gather reads each stripe in a slot */
#define STRIPE_INPUTS_MAX 64                  /* more inputs: the plain plan */

static struct cfx_dp_reduce_task *task_msg(const struct rplan *pl, uint32_t timeout_ms)
{
    struct cfx_dp_reduce_task *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                  .type = CFX_DP_REDUCE_TASK };
    m->task = pl->task;
    m->chunk_size = pl->chunk;
    m->timeout_ms = timeout_ms;
    m->dtype = (uint8_t)pl->dtype;
    m->op = (uint8_t)pl->op;
    return m;
}

/* Post message @p m (NULL: out of memory) of @p len bytes to @p node. */
static int post(struct cfx_context *ctx, void *m, size_t len, const struct cfx_node_rec *node)
{
    if (!m)
        return cfx__err(CFX_ERR_NOMEM, "reduce: out of memory");
    pthread_mutex_lock(&ctx->lock);
    int rc = cfx__rtask_post(ctx, m, len, node);
    pthread_mutex_unlock(&ctx->lock);
    if (rc != CFX_OK)
        free(m);
    return rc;
}

/* The chain of stripe @p j: the inputs node by node, starting after node
 * j and going round (nodes in the order of @p nodes), node j's first input
 * last (the stripe's root, whose part node j's gather plays).  The starts
 * rotate, so each node heads one chain and roots one: every node receives
 * and sends the same share.  Position p reads the input at arr[order[p]]
 * and the stream of position p - 1. */
static void stripe_order(const struct rplan *pl, const struct arrival *arr,
                         const uint32_t *nodes, const size_t *first, size_t nn, size_t j,
                         size_t *order)
{
    size_t n = 0;
    for (size_t r = 1; r <= nn; r++) {
        uint32_t node = nodes[(j + r) % nn];
        for (size_t i = 0; i < pl->k; i++)
            if (arr[i].node.node_id == node && i != first[j])
                order[n++] = i;
    }
    order[n] = first[j];
}

static int post_stripe(const struct rplan *pl, const struct arrival *arr, const uint32_t *nodes,
                       const size_t *first, size_t nn, size_t m, size_t j, uint32_t timeout_ms)
{
    size_t k = pl->k, order[STRIPE_INPUTS_MAX];
    stripe_order(pl, arr, nodes, first, nn, j, order);

    uint32_t nch = cfx__nchunks(pl->size, pl->chunk);
    uint32_t c0 = cfx__stripe_first(nch, (uint32_t)m, (uint32_t)j);
    uint32_t c1 = cfx__stripe_first(nch, (uint32_t)m, (uint32_t)j + 1);
    uint64_t off = (uint64_t)c0 * pl->chunk;
    uint64_t len = CFX_MIN((uint64_t)c1 * pl->chunk, pl->size) - off;
    for (size_t p = 0; p + 1 < k; p++) { /* the root's part is node j's gather */
        struct cfx_dp_reduce_task *t = task_msg(pl, timeout_ms);
        if (t) {
            struct cfx_object_id out;
            cfx__rtask_derived_id(pl->result, pl->task, j * k + p, &out);
            memcpy(t->input, pl->inputs[arr[order[p]].idx].bytes, CFX_OBJECT_ID_LEN);
            memcpy(t->output, out.bytes, CFX_OBJECT_ID_LEN);
            t->size = len;
            t->offset = off;
            if (p > 0) {
                struct cfx_object_id in;
                cfx__rtask_derived_id(pl->result, pl->task, j * k + p - 1, &in);
                memcpy(t->child_obj[0], in.bytes, CFX_OBJECT_ID_LEN);
                cfx__rtask_rec_to_dp(&arr[order[p - 1]].node, &t->child[0]);
                t->nchildren = 1;
            }
        }
        int rc = post(pl->ctx, t, sizeof(*t), &arr[order[p]].node);
        if (rc != CFX_OK)
            return rc;
    }
    return CFX_OK;
}

/* Node g's gather.  It is the root of stripe g's chain: it reduces the
 * chain's last stream with its own input into stripe g of its copy.  Every
 * other stripe it reads out of the copy of the node before it, each chunk
 * once it landed there; so stripe j goes round the nodes from node j, and
 * a node sends all it sends, the reduce's and the gather's, to the next
 * node: one stream of traffic a link, as in a ring allreduce, and no node
 * reads from itself (a DPDK port cannot). */
static int post_gather(const struct rplan *pl, const struct arrival *arr, const uint32_t *nodes,
                       const size_t *first, size_t nn, size_t m, size_t g, uint32_t putter,
                       uint32_t timeout_ms)
{
    size_t prev = (g + nn - 1) % nn, k = pl->k;
    struct cfx_object_id obj[STRIPES_MAX];
    const struct cfx_node_rec *from[STRIPES_MAX];
    for (size_t j = 0; j < m; j++) {
        obj[j] = *pl->result;
        from[j] = &arr[first[prev]].node;
        if (j == g) {
            /* its own stripe: the chain's last stream, reduced with this
             * node's input straight into the copy */
            size_t order[STRIPE_INPUTS_MAX];
            stripe_order(pl, arr, nodes, first, nn, j, order);
            cfx__rtask_derived_id(pl->result, pl->task, j * k + k - 2, &obj[j]);
            from[j] = &arr[order[k - 2]].node;
        }
    }
    struct cfx_dp_reduce_task *t = task_msg(pl, timeout_ms);
    size_t j = 0;
    if (t) {
        if (g < m) /* it roots stripe g */
            memcpy(t->input, pl->inputs[arr[first[g]].idx].bytes, CFX_OBJECT_ID_LEN);
        memcpy(t->output, pl->result->bytes, CFX_OBJECT_ID_LEN);
        t->size = pl->size;
        t->putter = putter;
        t->stripes = (uint8_t)m;
        t->final = CFX_RTASK_GATHER |
                   (arr[first[g]].node.node_id == putter ? CFX_RTASK_FINAL : 0);
        for (; j < m && j < CFX_RTASK_MAX_CHILDREN; j++) {
            memcpy(t->child_obj[j], obj[j].bytes, CFX_OBJECT_ID_LEN);
            cfx__rtask_rec_to_dp(from[j], &t->child[j]);
        }
        t->nchildren = (uint8_t)j;
    }
    int rc = post(pl->ctx, t, sizeof(*t), &arr[first[g]].node);
    /* the rest, in the messages that name a reduce task more streams */
    while (rc == CFX_OK && j < m) {
        struct cfx_dp_reduce_adopt *a = calloc(1, sizeof(*a));
        if (a) {
            a->hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                          .type = CFX_DP_REDUCE_ADOPT };
            a->task = pl->task;
            for (; j < m && a->n < CFX_RTASK_MAX_CHILDREN; j++, a->n++) {
                memcpy(a->child_obj[a->n], obj[j].bytes, CFX_OBJECT_ID_LEN);
                cfx__rtask_rec_to_dp(from[j], &a->child[a->n]);
            }
            a->last = j == m;
        }
        rc = post(pl->ctx, a, sizeof(*a), &arr[first[g]].node);
    }
    return rc;
}

/* One REDUCE_ABORT a node ends every task of the reduce there. */
static void end_tasks(const struct rplan *pl, const struct arrival *arr, const size_t *first,
                      size_t nn, bool keep)
{
    struct cfx_context *ctx = pl->ctx;
    pthread_mutex_lock(&ctx->lock);
    for (size_t g = 0; g < nn; g++)
        cfx__rtask_post_abort(ctx, pl->task, keep ? CFX_RTASK_KEEP : 0, &arr[first[g]].node);
    pthread_mutex_unlock(&ctx->lock);
}

/* Striping trades memory copies (each node gathers through a scratch ring,
 * then its reader copies the result out) for link traffic spread evenly:
 * among the processes of one host there is no link to spread it over, and
 * the plain plan moves fewer bytes through memory. */
static bool spans_hosts(const struct arrival *arr, size_t k)
{
    for (size_t i = 1; i < k; i++)
        if (strncmp(arr[i].node.host_id, arr[0].node.host_id, sizeof(arr[0].node.host_id)))
            return true;
    return false;
}

/* CFX_REDUCE_SHAPE=striped: stripe an allreduce within one host too. */
static bool forced(void)
{
    const char *force = getenv("CFX_REDUCE_SHAPE");
    return force && !strcmp(force, "striped");
}

int cfx__reduce_striped(struct rplan *pl, const struct arrival *arr, uint32_t *who)
{
    struct cfx_context *ctx = pl->ctx;
    size_t k = pl->k, nn = 0;
    size_t first[STRIPE_INPUTS_MAX];  /* each node's first input ready, by node */
    uint32_t nodes[STRIPE_INPUTS_MAX];
    *who = 0;
    if (k > STRIPE_INPUTS_MAX)
        return CFX_ERR_UNSUPPORTED;
    for (size_t i = 0; i < k; i++) {
        size_t g = 0;
        while (g < nn && nodes[g] != arr[i].node.node_id)
            g++;
        if (g == nn) {
            nodes[nn] = arr[i].node.node_id;
            first[nn++] = i;
        }
    }
    size_t m = CFX_MIN(nn, (size_t)STRIPES_MAX);
    if (m < 2 || cfx__nchunks(pl->size, pl->chunk) < 2 * m || !(spans_hosts(arr, k) || forced()))
        return CFX_ERR_UNSUPPORTED;
    uint32_t putter = nodes[nn - 1];
    for (size_t g = 0; g < nn; g++)
        if (nodes[g] == ctx->node_id)
            putter = ctx->node_id;

    uint8_t done[STRIPE_INPUTS_MAX] = { 0 };
    pthread_mutex_lock(&ctx->lock);
    pl->task = (uint64_t)ctx->node_id << 32 | (++ctx->rtask_counter & 0xffffffffu);
    struct cfx_rwait wait = { .task = pl->task, .status = CFX_ERR_AGAIN, .nodes = nodes,
                              .nnodes = nn, .tasks = nodes, .ntasks = nn,
                              .need = (unsigned)nn, .done = done };
    cfx_list_add_tail(&wait.link, &ctx->rwaits);
    pthread_mutex_unlock(&ctx->lock);

    int ms = cfx__ms_left(pl->deadline);
    uint32_t timeout_ms = ms < 0 ? 0x7fffffffu : (uint32_t)ms;
    int rc = CFX_OK;
    for (size_t j = 0; j < m && rc == CFX_OK; j++)
        rc = post_stripe(pl, arr, nodes, first, nn, m, j, timeout_ms);
    for (size_t g = 0; g < nn && rc == CFX_OK; g++)
        rc = post_gather(pl, arr, nodes, first, nn, m, g, putter, timeout_ms);

    pthread_mutex_lock(&ctx->lock);
    while (rc == CFX_OK && wait.status == CFX_ERR_AGAIN && !cfx__ctx_closing(ctx) &&
           cfx__obj_wait(ctx, pl->deadline))
        ;
    int st = wait.status;
    *who = wait.node_id;
    cfx_list_del(&wait.link);
    pthread_mutex_unlock(&ctx->lock);
    end_tasks(pl, arr, first, nn, rc == CFX_OK && st == CFX_OK);

    if (rc == CFX_OK && st == CFX_ERR_AGAIN)
        rc = cfx__err(CFX_ERR_TIMEOUT, "reduce into %.12s on node %u: the stripes were not "
                      "reduced and gathered within %d ms", pl->hex, ctx->node_id,
                      pl->timeout_ms);
    else if (rc == CFX_OK && st != CFX_OK)
        rc = cfx__err(st, "reduce into %.12s: node %u failed: %s", pl->hex, *who,
                      cfx_strerror(st));
    CFX_LOG(DEBUG, REDUCE, "node %u: reduce of %zu inputs (%" PRIu64 " B) in %zu stripes "
            "over %zu nodes, the put on node %u: %s", ctx->node_id, k, pl->size, m, nn,
            putter, cfx_errname(rc));
    return rc;
}

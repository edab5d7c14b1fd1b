/*
 * Object reduce, the driver's side shared by the plain plan (objreduce_plan.c)
 * and the striped one (objstripe.c).  API threads only; ctx->lock is taken
 * where said.
 */
#ifndef CFX_OBJREDUCE_H
#define CFX_OBJREDUCE_H

#include "engine.h"

#define NO_PARENT SIZE_MAX
#define MAX_DEAD  64

struct arrival {
    size_t idx;
    struct cfx_node_rec node;
};

/* A position of the plan: an input, where it is read, and who reads it. */
struct rpos {
    size_t idx;                 /* input index */
    struct cfx_node_rec node;   /* where it is read (and its task runs) */
    struct cfx_object_id obj;   /* what its parent reads: the input, or an intermediate */
    size_t parent;              /* NO_PARENT: the root */
    bool task;                  /* runs a reduce task (inner node or root) */
    bool dead;
};

/* Everything one cfx_reduce_objects() call knows, across plans. */
struct rplan {
    struct cfx_context *ctx;
    const struct cfx_object_id *inputs;
    size_t n, k;
    uint64_t size;
    uint32_t chunk;
    enum cfx_dtype dtype;
    enum cfx_redop op;
    const struct cfx_object_id *result;
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint64_t deadline;
    int timeout_ms;
    uint32_t dead[MAX_DEAD];    /* nodes left out of every later plan */
    unsigned ndead;
    bool *lost;                 /* inputs whose holder died, none other known */
    size_t nlost;
    struct rpos *pos;           /* current plan: k positions, then replacements */
    size_t npos, cap;
    uint64_t task;
    const struct cfx_task_needs *place; /* CFX_OBJ_PARAM_PLACE, else NULL */
};

/* Node record @p r in the form reduce messages carry it. */
void cfx__rtask_rec_to_dp(const struct cfx_node_rec *r, struct cfx_dp_node *n);

/* The id of a plan's intermediate at position @p pos of reduce @p task. */
void cfx__rtask_derived_id(const struct cfx_object_id *result, uint64_t task, size_t pos,
                           struct cfx_object_id *out);

/* Hand a reduce message (malloc'd; taken on CFX_OK) to the progress thread,
 * for this node or to send to @p node.  ctx->lock held. */
int cfx__rtask_post(struct cfx_context *ctx, void *msg, size_t len,
                    const struct cfx_node_rec *node);

/* Post a REDUCE_ABORT of reduce @p task, with @p status (CFX_RTASK_KEEP, or
 * 0), to @p node (dropped when out of memory: the tasks end at their
 * deadline).  ctx->lock held. */
void cfx__rtask_post_abort(struct cfx_context *ctx, uint64_t task, int status,
                           const struct cfx_node_rec *node);

/* The striped plan of an allreduce (CFX_OBJ_FLAG_ALLREDUCE): the k ready
 * inputs in @p arr.  CFX_ERR_UNSUPPORTED when it does not apply (too few
 * nodes or chunks): the plain plan runs instead.  On another failure *who
 * names the node blamed (0 none), and every task of it has been told to
 * stop. */
int cfx__reduce_striped(struct rplan *pl, const struct arrival *arr, uint32_t *who);

#endif

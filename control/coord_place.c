/*
 * Placement: which node runs a task (or would, for a placement query).
 *
 * Candidates are the live nodes that registered the function (any function
 * for a query without a name), are in the task's node set when it has one,
 * and offer at least the cores, GPUs and memory it needs.  No candidate:
 * CFX_ERR_NO_RESOURCE (or CFX_ERR_NOT_FOUND when nobody registered the
 * function), since waiting would not help.  Of those, the ones with room
 * now: what live reservations hold plus what the task needs fits what the
 * node offers, it has fewer than max_node_tasks reservations, and none of
 * them is of the task's anti-affinity group.  None with room: CFX_ERR_BUSY
 * (a task waits in the queue for one).
 *
 * Ranking, best first:
 *  1. bytes of the task's inputs the node holds (cfx__coord_dir_held_bytes:
 *     complete copies whole, partial copies half); moving the task is
 *     cheaper than moving its inputs;
 *  2. spread: the fewest reservations, then the lowest load (heartbeat's
 *     load average per offered core, then arena bytes in use);
 *     pack: the most reservations (that still fit);
 *  3. the lowest node id, so that equal nodes are chosen the same way.
 * A reservation is taken for the chosen node by the caller
 * (cfx__coord_resv_take), so the next placement, handled after this one on
 * the same loop thread, sees it.
 *
 * Data placement (CFX_PROTO_TASK_DATA: where an object reduce produces its
 * result) asks where bytes should live, not where a task runs: every live
 * member that is not an observer is a candidate, workers or not; it must
 * be in the node set, have the memory free that its last heartbeat
 * reported (none reported: not known to be short), offer the GPUs when
 * GPUs are asked for (only a worker offers any), and run no task of the
 * anti-affinity group.  The ranking is the one above with one step after
 * the input bytes: the asker first (it reads the result next), and no
 * reservation is taken (the bytes are an object, which the directory
 * accounts for).
 */
#include "control/coord_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"

static int worker_has(const struct coord_worker *w, const char *name)
{
    if (!name[0])
        return w->nfuncs > 0;
    for (uint32_t i = 0; i < w->nfuncs; i++)
        if (!strcmp(w->funcs[i], name))
            return 1;
    return 0;
}

static int in_set(const struct cfx_msg_task *t, uint32_t node_id)
{
    if (!t->nnodes)
        return 1;
    for (unsigned i = 0; i < t->nnodes; i++)
        if (t->nodes[i] == node_id)
            return 1;
    return 0;
}

/* Does a reservation of the task's anti-affinity group sit on the node? */
static int group_taken(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t node_id)
{
    struct cfx_list *pos;
    if (!t->group[0])
        return 0;
    cfx_list_for_each(pos, &co->resvs) {
        struct coord_resv *r = cfx_list_entry(pos, struct coord_resv, link);
        if (r->node_id == node_id && !strcmp(r->group, t->group))
            return 1;
    }
    return 0;
}

/* Does @p need fit in what is left of @p offer, @p used taken?  Written so
 * that nothing wraps: a worker may offer UINT32_MAX cores, a task ask for
 * 2^64-1 bytes, and a re-announced run (adopted, never refused) may have
 * pushed what is taken past the offer. */
static int fits(uint64_t offer, uint64_t used, uint64_t need)
{
    return used <= offer && need <= offer - used;
}

static int has_room(struct cfx_coord *co, const struct coord_worker *w,
                    const struct cfx_msg_task *t, uint32_t node_id)
{
    return fits(w->cores, w->res_cores, t->cores) && fits(w->gpus, w->res_gpus, t->gpus) &&
           fits(w->memory, w->res_memory, t->memory) && w->nres < co->max_node_tasks &&
           !group_taken(co, t, node_id);
}

struct cand {
    struct coord_node *n;
    uint64_t local;     /* input bytes held */
    int asker;          /* data placement: the node that asked */
    uint32_t nres;
    uint64_t load;      /* load average x 1000 per core */
    uint64_t arena;
};

/* Is @p a better than @p b? */
static int better(const struct cand *a, const struct cand *b, int pack)
{
    if (a->local != b->local)
        return a->local > b->local;
    if (a->asker != b->asker)
        return a->asker;
    if (a->nres != b->nres)
        return pack ? a->nres > b->nres : a->nres < b->nres;
    if (!pack && a->load != b->load)
        return a->load < b->load;
    if (!pack && a->arena != b->arena)
        return a->arena < b->arena;
    return a->n->rec.node_id < b->n->rec.node_id;
}

/* Can node @p n ever take @p t, and has it room now?  0: not a candidate
 * (not counted), 1: registered but cannot meet the needs, 2: capable but
 * full now, 3: a candidate. */
static int fit(struct cfx_coord *co, const struct cfx_msg_task *t, struct coord_node *n)
{
    const struct coord_worker *w = n->worker;
    if (t->flags & CFX_PROTO_TASK_DATA) {
        if (n->rec.flags & (CFX_NODE_F_OBSERVER | CFX_NODE_F_LEFT))
            return 0;
        if (!in_set(t, n->rec.node_id) || t->gpus > (w ? w->gpus : 0) ||
            (n->load.mem_avail && t->memory > n->load.mem_avail))
            return 1;
        return group_taken(co, t, n->rec.node_id) ? 2 : 3;
    }
    if (!w || !worker_has(w, t->name))
        return 0;
    if (!in_set(t, n->rec.node_id) || t->cores > w->cores || t->gpus > w->gpus ||
        t->memory > w->memory)
        return 1;
    return has_room(co, w, t, n->rec.node_id) ? 3 : 2;
}

static int place(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t avoid,
                 uint32_t asker, struct coord_node **out, char *why, size_t why_len)
{
    struct cfx_list *pos;
    struct cand best = { 0 };
    uint32_t nregistered = 0, ncapable = 0, nfull = 0;
    int pack = (t->flags & CFX_PROTO_TASK_PACK) != 0;
    int data = (t->flags & CFX_PROTO_TASK_DATA) != 0;
    const char *what = data ? "data" : t->name[0] ? t->name : "(any)";

    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        struct coord_worker *w = n->worker;
        if (!n->rec.alive || n->rec.node_id == avoid)
            continue;
        int f = fit(co, t, n);
        nregistered += f > 0;
        ncapable += f > 1;
        if (f == 2) {
            nfull += w && w->nres >= co->max_node_tasks;
            continue;
        }
        if (f != 3)
            continue;
        struct cand c = { .n = n, .asker = data && n->rec.node_id == asker,
                          .nres = w ? w->nres : 0, .arena = n->load.arena_used };
        c.load = w && w->cores ? (uint64_t)n->load.load_milli / w->cores : n->load.load_milli;
        for (unsigned i = 0; i < t->ninputs; i++)
            c.local += cfx__coord_dir_held_bytes(co, &t->inputs[i], n->rec.node_id);
        if (!best.n || better(&c, &best, pack))
            best = c;
    }
    if (best.n) {
        *out = best.n;
        CFX_LOG(DEBUG, CTL, "placement of '%s': node %u (%llu input bytes there, %u "
                "reservations%s)", what, best.n->rec.node_id, (unsigned long long)best.local,
                best.nres, best.asker ? ", the asker" : "");
        return CFX_OK;
    }
    if (!nregistered) {
        char besides[32] = ""; /* the node that died or left: it may be either */
        if (avoid)
            snprintf(besides, sizeof(besides), " besides node %u", avoid);
        if (data)
            snprintf(why, why_len, "no live member");
        else if (!t->name[0]) /* a query for any function */
            snprintf(why, why_len, "no live node registered any function%s", besides);
        else
            snprintf(why, why_len, "no live node registered the function '%s'%s", what,
                     besides);
        return CFX_ERR_NOT_FOUND;
    }
    if (!ncapable) {
        char who[CFX_TASK_NAME_MAX + 48];
        if (data)
            snprintf(who, sizeof(who), "%u live member(s)", nregistered);
        else
            snprintf(who, sizeof(who), "%u node(s) that registered '%s'", nregistered, what);
        snprintf(why, why_len, "none of the %s %s (needs: %u cores, %u GPUs, %llu bytes of "
                 "memory)", who,
                 t->nnodes ? "is in the node set and offers what it needs" : "offers what it needs",
                 t->cores, t->gpus, (unsigned long long)t->memory);
        return CFX_ERR_NO_RESOURCE;
    }
    if (nfull == ncapable)
        snprintf(why, why_len, "every capable node has max_node_tasks (%u) tasks placed",
                 co->max_node_tasks);
    else
        snprintf(why, why_len, "all %u capable node(s) are busy (cores, GPUs%s%s%s or memory "
                 "taken)", ncapable, t->group[0] ? ", anti-affinity group '" : "", t->group,
                 t->group[0] ? "'" : "");
    return CFX_ERR_BUSY;
}

int cfx__coord_place(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t avoid,
                     struct coord_node **out, char *why, size_t why_len)
{
    return place(co, t, avoid, 0, out, why, why_len);
}

int cfx__coord_place_data(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t asker,
                          struct coord_node **out, char *why, size_t why_len)
{
    return place(co, t, 0, asker, out, why, why_len);
}

struct coord_resv *cfx__coord_resv_take(struct cfx_coord *co, struct coord_node *n,
                                        const struct cfx_msg_task *t, uint64_t expires_ns)
{
    struct coord_resv *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->node_id = n->rec.node_id;
    r->cores = t->cores;
    r->gpus = t->gpus;
    r->memory = t->memory;
    snprintf(r->group, sizeof(r->group), "%s", t->group);
    r->expires_ns = expires_ns;
    n->worker->res_cores += r->cores; /* 64 bits: at most max_node_tasks u32s */
    n->worker->res_gpus += r->gpus;
    /* a re-announced run is taken whatever it says it holds (it runs): its
     * memory saturates rather than wrap what has_room compares */
    if (r->memory > UINT64_MAX - n->worker->res_memory)
        r->memory = UINT64_MAX - n->worker->res_memory;
    n->worker->res_memory += r->memory;
    n->worker->nres++;
    cfx_list_add_tail(&r->link, &co->resvs);
    return r;
}

void cfx__coord_resv_free(struct cfx_coord *co, struct coord_resv *r)
{
    struct coord_node *n;
    if (!r)
        return;
    n = cfx__coord_node_find(co, r->node_id);
    if (n && n->worker) {
        n->worker->res_cores -= r->cores;
        n->worker->res_gpus -= r->gpus;
        n->worker->res_memory -= r->memory;
        n->worker->nres--;
    }
    if (r->asker) {
        struct coord_node *a = cfx__coord_node_find(co, r->asker);
        if (a && a->nqueries)
            a->nqueries--;
    }
    if (r->task)
        r->task->resv = NULL;
    cfx_list_del(&r->link);
    free(r);
}

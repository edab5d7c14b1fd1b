/*
 * Tasks at the coordinator: the functions nodes offer, the tasks submitted,
 * where they run (coord_place.c chooses), and how they end.
 *
 * A task's life: SUBMIT -> placed (a reservation on its node, EV_TASK_RUN
 * sent to it) or queued (every capable node busy; placed when a slot frees:
 * a task ends, a reservation expires, a node registers) -> DONE when its
 * worker reports TASK_DONE, its deadline passes, or its node dies and it
 * cannot be placed again.  A task ended by its deadline while it runs
 * keeps its reservation, as its run's, until the node reports the run's
 * end or dies (run_detach): no message stops a run.  Ended tasks are
 * remembered for a while
 * (COORD_TASKS_DONE_KEEP, COORD_TASK_DONE_KEEP_MS) so that a TASK_WAIT sent
 * after the end still gets the status.
 *
 * Restarts.  The coordinator keeps no task on disk; tasks survive its
 * restart because the nodes hold them.  Every submission carries an
 * idempotency key chosen by its submitter, and the coordinator answers a
 * SUBMIT whose key it knows with that task (a repeat whose reply was lost
 * runs once).  After a reconnect each worker registers its functions
 * again, re-announces (TASK_ANNOUNCE) every task it runs, queues or ended
 * without a sure report, then an empty TASK_ANNOUNCE that closes the list;
 * the coordinator adopts each one, placed on that worker under its old id.
 * A submitter whose wait finds its task unknown submits it again (AGAIN,
 * with its old id and the node it ran on).  So that a repeat that comes
 * before its worker's re-announcement does not run the task a second time,
 * a repeat is HELD: until its node closed its re-announcement list, and at
 * most task_grace_ms (COORD_TASK_GRACE_MS) after the start.  A re-announced
 * key merges with the held repeat (the running one wins).  When the grace
 * ends, a held task whose node never came back fails with
 * CFX_ERR_PEER_FAILED naming it, or is placed elsewhere, as when a node
 * dies; one whose node closed its list without it, or with no node known,
 * is placed.  A hint names a node by its id of before; hint_find says when
 * the node holding that id now is that process.  A re-announcement wins
 * over a placement this coordinator made from a repeat meanwhile (the
 * re-announced run is the task's; the other keeps its slot until it ends).
 * Workers also refuse to run a key a second time (they run it
 * once and report its end under each id).  Task ids start from the wall
 * clock in microseconds at each start, so ids of an earlier incarnation
 * (fewer than one a microsecond) are below first_task_id and never handed
 * out again (unless the clock was stepped back by more than that
 * incarnation lived: a new id still skips every id in use); a repeat naming
 * an id of this incarnation that is no longer known ended long ago and is
 * not run again (CFX_ERR_NOT_FOUND).
 *
 * Fences.  A node declared dead may only have been paused or cut off: its
 * run of a task goes on, and nothing can stop it (no message reaches a
 * stopped process).  The task, placed again, runs elsewhere, so the
 * function runs twice, but only one run's results may count: a task keeps
 * the ids of the nodes it moved off when they were declared dead, and the
 * process of such a node, which rejoins under a new id asking for its old
 * one, is fenced too (cfx__coord_task_rejoined).  A fenced node's
 * re-announcement of the task, its puts of the task's results and its
 * report of the run's end are refused or ignored, its puts and
 * re-announcement with CFX_ERR_CANCELED naming the task and where it
 * went; its run keeps a reservation, as run_detach's, until that end (an
 * end heard before the re-announcement is remembered in the fence: that
 * re-announcement then holds nothing).
 * The fence lives as long as the task's record (COORD_TASK_DONE_KEEP_MS
 * after its end); the worker, told by the refused re-announcement, also
 * refuses cfx_task_result_put itself for as long as the run goes on.
 *
 * Caps on what peers push: re-announced tasks count against max_node_tasks
 * of their node, held repeats against max_queued_tasks; the keys remembered
 * are those of the live tasks and of the ended ones kept for late waits
 * (COORD_TASKS_DONE_KEEP, COORD_TASK_DONE_KEEP_MS).
 *
 * Trust: TASK_ANNOUNCE is accepted only from a joined, authenticated member
 * that registered a function, and only for itself: the task is placed on
 * the sending node, under max_node_tasks like any placement.
 *
 * Everything here runs on the coordinator's loop thread.
 */
#include "control/coord_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dataplane/common/log.h"

void cfx__coord_task_init(struct cfx_coord *co)
{
    struct timespec ts;

    /* ids of an earlier incarnation stay below (see the header) */
    clock_gettime(CLOCK_REALTIME, &ts);
    co->next_task_id = (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000u;
    co->first_task_id = co->next_task_id + 1;
    co->task_grace_ms = co->task_grace_ms ? co->task_grace_ms : COORD_TASK_GRACE_MS;
    cfx_list_init(&co->tasks);
    cfx_list_init(&co->tasks_done);
    cfx_list_init(&co->resvs);
    cfx_list_init(&co->task_waits);
    co->max_node_tasks = co->max_node_tasks ? co->max_node_tasks : COORD_NODE_TASKS_MAX;
    co->max_queued_tasks = co->max_queued_tasks ? co->max_queued_tasks : COORD_QUEUED_TASKS_MAX;
}

static void task_wait_free(struct cfx_coord *co, struct coord_task_wait *w)
{
    cfx_list_del(&w->link);
    w->conn->ntask_waits--;
    co->ntask_waits--;
    free(w);
}

static void task_free(struct coord_task *t)
{
    free(t->arg);
    free(t);
}

void cfx__coord_task_fini(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &co->task_waits) {
        task_wait_free(co, cfx_list_entry(pos, struct coord_task_wait, link));
    }
    cfx_list_for_each_safe(pos, tmp, &co->resvs)
        cfx__coord_resv_free(co, cfx_list_entry(pos, struct coord_resv, link));
    cfx_list_for_each_safe(pos, tmp, &co->tasks) {
        cfx_list_del(pos);
        task_free(cfx_list_entry(pos, struct coord_task, link));
    }
    cfx_list_for_each_safe(pos, tmp, &co->tasks_done) {
        cfx_list_del(pos);
        task_free(cfx_list_entry(pos, struct coord_task, link));
    }
    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        free(n->worker);
        n->worker = NULL;
    }
}

static struct coord_task *task_find(struct cfx_coord *co, uint64_t id)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->id == id)
            return t;
    }
    cfx_list_for_each(pos, &co->tasks_done) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->id == id)
            return t;
    }
    return NULL;
}

static struct coord_task *task_find_key(struct cfx_coord *co, uint64_t key)
{
    struct cfx_list *lists[2] = { &co->tasks, &co->tasks_done }, *pos;
    for (int l = 0; l < 2; l++)
        cfx_list_for_each(pos, lists[l]) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            if (t->key == key)
                return t;
        }
    return NULL;
}

static uint64_t task_new_id(struct cfx_coord *co)
{
    uint64_t id;
    do
        id = ++co->next_task_id;
    while (!id || task_find(co, id));
    return id;
}

static void reply_task(struct coord_conn *c, uint64_t req_id, const struct coord_task *t,
                       int status)
{
    struct cfx_msg r = { .type = CFX_MSG_TASK_REPLY, .req_id = req_id };
    r.u.task_st.task_id = t->id;
    r.u.task_st.node_id = t->node_id;
    r.u.task_st.status = status;
    if (status != CFX_OK && status != CFX_ERR_AGAIN)
        snprintf(r.u.task_st.text, sizeof(r.u.task_st.text), "%s", t->text);
    cfx__coord_send(c, &r);
}

static void retry_queue(struct cfx_coord *co);

/* Task @p t, placed, ends for its waiters while its node goes on running
 * it (its deadline passed, or another node's run of it won): its
 * reservation stays, as that run's, until the node reports the run's end or
 * dies.  There is no message that stops a run, so releasing the slot here
 * put a second task onto cores still busy. */
static void run_detach(struct coord_task *t)
{
    struct coord_resv *r = t->resv;
    if (!r)
        return;
    r->task = NULL;
    r->run_id = t->run_id;
    r->expires_ns = UINT64_MAX;
    t->resv = NULL;
}

/* The reservation of the run @p run_id that node @p node goes on with
 * (run_detach), or NULL. */
static struct coord_resv *run_find(struct cfx_coord *co, uint64_t run_id, uint32_t node)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->resvs) {
        struct coord_resv *r = cfx_list_entry(pos, struct coord_resv, link);
        if (!r->task && r->run_id == run_id && r->node_id == node)
            return r;
    }
    return NULL;
}

/* The index in t->fenced of the fence against node @p node's run of @p t,
 * or -1: that run is the task's (see "Fences"). */
static int fence_of(const struct coord_task *t, uint32_t node)
{
    for (unsigned i = 0; i < t->nfenced; i++)
        if (t->fenced[i].node == node)
            return (int)i;
    return -1;
}

static bool task_fences(const struct coord_task *t, uint32_t node)
{
    return fence_of(t, node) >= 0;
}

/* Fence node @p node's run of @p t, which goes by @p run_id. */
static void fence_add(struct coord_task *t, uint32_t node, uint64_t run_id)
{
    if (task_fences(t, node))
        return;
    if (t->nfenced == COORD_TASK_FENCED_MAX) { /* the oldest goes: a chain that long is moot */
        memmove(t->fenced, t->fenced + 1, sizeof(t->fenced) - sizeof(t->fenced[0]));
        t->nfenced--;
    }
    t->fenced[t->nfenced++] = (struct coord_fence){ .node = node, .run_id = run_id };
}

/* Why fenced node @p n's run of @p t is not the task's, into @p buf. */
static void fence_text(const struct coord_task *t, const struct coord_node *n, char *buf,
                       size_t len)
{
    char where[48];
    uint32_t was = n->was_id ? n->was_id : n->rec.node_id;

    if (t->node_id && !task_fences(t, t->node_id))
        snprintf(where, sizeof(where), "moved to node %u", t->node_id);
    else
        snprintf(where, sizeof(where), "was taken from it");
    snprintf(buf, len, "task %llu ('%s') %s when node %u was declared dead while it ran "
             "there (only paused or cut off: it rejoined as node %u); the run it goes on with "
             "is not the task's", (unsigned long long)t->id, t->t.name, where, was,
             n->rec.node_id);
}

/* The task, live or ended, that fences node @p node's run going by @p id
 * (the task's id, or the one a re-announcement merged into it), or NULL;
 * that fence in *@p fence. */
static struct coord_task *fenced_find(struct cfx_coord *co, uint64_t id, uint32_t node,
                                      struct coord_fence **fence)
{
    struct cfx_list *lists[2] = { &co->tasks, &co->tasks_done }, *pos;
    for (int l = 0; l < 2; l++)
        cfx_list_for_each(pos, lists[l]) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            int k = fence_of(t, node);
            if (k >= 0 && (t->id == id || t->fenced[k].run_id == id)) {
                *fence = &t->fenced[k];
                return t;
            }
        }
    return NULL;
}

void cfx__coord_task_rejoined(struct cfx_coord *co, struct coord_node *n, uint32_t was)
{
    struct cfx_list *lists[2] = { &co->tasks, &co->tasks_done }, *pos;
    char text[CFX_PROTO_TEXT_MAX];

    n->was_id = was;
    for (int l = 0; l < 2; l++)
        cfx_list_for_each(pos, lists[l]) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            if (!task_fences(t, was))
                continue;
            fence_add(t, n->rec.node_id, t->fenced[fence_of(t, was)].run_id);
            n->stale_runs = 1;
            fence_text(t, n, text, sizeof(text));
            CFX_LOG(WARN, CTL, "%s: its result puts and its end will be refused", text);
        }
}

bool cfx__coord_task_put_fenced(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                                const struct cfx_object_id *id)
{
    struct cfx_list *lists[2] = { &co->tasks, &co->tasks_done }, *pos;
    struct coord_node *n = c->node;
    char text[CFX_PROTO_TEXT_MAX - 128], hex[CFX_OBJECT_ID_HEX_LEN];

    /* only a node that rejoined with runs of moved tasks pays for the look */
    if (!n || !n->stale_runs)
        return false;
    for (int l = 0; l < 2; l++)
        cfx_list_for_each(pos, lists[l]) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            if (!task_fences(t, n->rec.node_id))
                continue;
            for (unsigned i = 0; i < t->t.nresults; i++) {
                if (memcmp(&t->t.results[i], id, sizeof(*id)))
                    continue;
                fence_text(t, n, text, sizeof(text));
                cfx_object_id_to_hex(id, hex);
                CFX_LOG(WARN, CTL, "node %u puts object %s, result %u of task %llu: refused: "
                        "%s", n->rec.node_id, hex, i, (unsigned long long)t->id, text);
                cfx__coord_reply_err(c, req_id, CFX_ERR_CANCELED, "result %u of %s: its put "
                                     "is refused", i, text);
                return true;
            }
        }
    return false;
}

/* The results of @p t, which ran on its node: its submitter may withdraw
 * them (cfx__coord_dir_task_result; docs/TASKS.md, "Results"). */
static void results_grant(struct cfx_coord *co, const struct coord_task *t, uint32_t node)
{
    for (unsigned i = 0; i < t->t.nresults; i++)
        cfx__coord_dir_task_result(co, &t->t.results[i], node, t->submitter);
}

/* The task ended with @p status: release its slot (or, with @p runs_on,
 * leave it to the run its node goes on with), answer its waiters, remember
 * it for late ones. */
static void task_end_run(struct cfx_coord *co, struct coord_task *t, int status,
                         const char *text, bool runs_on)
{
    struct cfx_list *pos, *tmp;

    if (t->state == COORD_TASK_QUEUED || t->state == COORD_TASK_HELD)
        co->ntasks_queued--;
    if (t->state == COORD_TASK_PLACED)
        results_grant(co, t, t->node_id);
    if (runs_on && t->state == COORD_TASK_PLACED)
        run_detach(t);
    cfx__coord_resv_free(co, t->resv);
    t->resv = NULL;
    t->state = COORD_TASK_DONE;
    t->status = status;
    t->done_ns = cfx__now_ns();
    snprintf(t->text, sizeof(t->text), "%s", text ? text : "");
    if (status == CFX_OK)
        co->tasks_ok++;
    else
        co->tasks_failed++;
    if (status == CFX_OK)
        CFX_LOG(DEBUG, CTL, "task %llu ('%s') ended on node %u", (unsigned long long)t->id,
                t->t.name, t->node_id);
    else
        CFX_LOG(INFO, CTL, "task %llu ('%s') failed (%s): %s", (unsigned long long)t->id,
                t->t.name, cfx_errname(status), t->text);
    cfx_list_del(&t->link);
    cfx_list_add_tail(&t->link, &co->tasks_done);
    co->ntasks_done++;
    cfx_list_for_each_safe(pos, tmp, &co->task_waits) {
        struct coord_task_wait *w = cfx_list_entry(pos, struct coord_task_wait, link);
        if (w->task_id != t->id)
            continue;
        reply_task(w->conn, w->req_id, t, status);
        task_wait_free(co, w);
    }
    while (co->ntasks_done > COORD_TASKS_DONE_KEEP) {
        struct coord_task *old = cfx_list_entry(co->tasks_done.next, struct coord_task, link);
        cfx_list_del(&old->link);
        task_free(old);
        co->ntasks_done--;
    }
}

static void task_end(struct cfx_coord *co, struct coord_task *t, int status, const char *text)
{
    task_end_run(co, t, status, text, false);
}

/* Send the task to node @p n with a reservation there. */
static int task_start(struct cfx_coord *co, struct coord_task *t, struct coord_node *n)
{
    struct cfx_msg ev = { .type = CFX_MSG_EV_TASK_RUN, .req_id = 0 };
    uint64_t now = cfx__now_ns();

    t->resv = cfx__coord_resv_take(co, n, &t->t, UINT64_MAX);
    if (!t->resv)
        return CFX_ERR_NOMEM;
    t->resv->task = t;
    if (t->state == COORD_TASK_QUEUED)
        co->ntasks_queued--;
    t->state = COORD_TASK_PLACED;
    t->node_id = n->rec.node_id;
    t->run_id = t->id;
    t->adopted = 0;
    /* placed back on a node it was fenced against (rejoined): that node
     * runs the key once (task_keep.c), so the run it goes on with counts */
    for (unsigned i = 0; i < t->nfenced; i++)
        if (t->fenced[i].node == t->node_id) {
            t->fenced[i] = t->fenced[--t->nfenced];
            break;
        }
    t->placements++;
    ev.u.task = t->t;
    ev.u.task.task_id = t->id;
    ev.u.task.hint_node = 0;
    ev.u.task.timeout_ms = t->deadline_ns == UINT64_MAX ? CFX_PROTO_TIMEOUT_NONE
                           : t->deadline_ns > now ? (uint32_t)((t->deadline_ns - now) / 1000000ull) + 1
                                                  : 1;
    cfx__coord_send(n->conn, &ev);
    return CFX_OK;
}

void cfx__coord_task_reg(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct coord_node *n = c->node;
    struct coord_worker *w = n->worker;

    if (!w) {
        w = calloc(1, sizeof(*w));
        if (!w) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory",
                                 co->addr);
            return;
        }
        n->worker = w;
    }
    for (uint32_t i = 0; i < w->nfuncs; i++) {
        if (!strcmp(w->funcs[i], m->u.task_reg.name)) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS, "node %u registered the "
                                 "function '%s' already", n->rec.node_id, m->u.task_reg.name);
            return;
        }
    }
    if (w->nfuncs >= COORD_NODE_FUNCS_MAX) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "node %u registered %u "
                             "functions: the cap on functions per node", n->rec.node_id,
                             w->nfuncs);
        return;
    }
    snprintf(w->funcs[w->nfuncs++], sizeof(w->funcs[0]), "%s", m->u.task_reg.name);
    w->cores = m->u.task_reg.cores;
    w->gpus = m->u.task_reg.gpus;
    w->memory = m->u.task_reg.memory;
    CFX_LOG(INFO, CTL, "node %u offers task '%s' (%u cores, %u GPUs, %llu bytes)",
            n->rec.node_id, m->u.task_reg.name, w->cores, w->gpus,
            (unsigned long long)w->memory);
    cfx__coord_reply_ok(c, m->req_id);
    retry_queue(co);
}

/* A new task from @p mt (its argument copied) on co->tasks, QUEUED or HELD
 * (counted against max_queued_tasks by the caller's check); NULL when out of
 * memory. */
static struct coord_task *task_new(struct cfx_coord *co, const struct cfx_msg_task *mt,
                                   uint64_t id, uint32_t submitter,
                                   enum coord_task_state state)
{
    struct coord_task *t = calloc(1, sizeof(*t));
    uint64_t now = cfx__now_ns();

    if (!t || (mt->arg_len && !(t->arg = malloc(mt->arg_len)))) {
        free(t);
        return NULL;
    }
    t->t = *mt;
    if (t->arg)
        memcpy(t->arg, mt->arg, mt->arg_len);
    t->t.arg = t->arg;
    t->t.flags &= (uint8_t)~CFX_PROTO_TASK_AGAIN;
    t->t.task_id = 0;
    t->t.hint_node = 0;
    t->t.submitter = submitter;
    t->id = t->run_id = id;
    t->key = mt->key;
    t->hint_node = state == COORD_TASK_HELD ? mt->hint_node : 0;
    t->submitter = submitter;
    t->submit_ns = now;
    t->deadline_ns = mt->timeout_ms == CFX_PROTO_TIMEOUT_NONE
                         ? UINT64_MAX
                         : now + (uint64_t)mt->timeout_ms * 1000000ull;
    t->state = state;
    co->ntasks_queued++;
    cfx_list_add_tail(&t->link, &co->tasks);
    return t;
}

/* The node a repeat's hint names, when it is the process the hint meant.
 * With a state directory ids are never reused: the node holding the id is
 * that one.  Without, after a restart (co->ids_of_before), only a node that
 * took its id of before back is; one that got the id afresh (a node that
 * joined first may: see stateless_rejoin in coord.c) is another process,
 * which never ran the task.  Trusting it released the repeat to run a
 * second time while the task still ran where it had been. */
static struct coord_node *hint_find(struct cfx_coord *co, uint32_t hint_node)
{
    struct coord_node *n = hint_node ? cfx__coord_node_find(co, hint_node) : NULL;
    return n && (n->rejoined || !co->ids_of_before) ? n : NULL;
}

/* A repeat with @p hint_node waits: the grace after the start runs, and
 * that node (when known) has not closed its re-announcement list. */
static int held_now(struct cfx_coord *co, uint32_t hint_node)
{
    struct coord_node *n = hint_find(co, hint_node);

    if (cfx__now_ns() - co->start_ns >= (uint64_t)co->task_grace_ms * 1000000ull)
        return 0;
    return !(n && n->rec.alive && n->worker && n->worker->announced);
}

/* The id a new task gets: a repeat keeps the one of an earlier incarnation
 * when it is free (the submitter's handle and the worker know it). */
static uint64_t submit_id(struct cfx_coord *co, const struct cfx_msg_task *mt)
{
    if ((mt->flags & CFX_PROTO_TASK_AGAIN) && mt->task_id && mt->task_id < co->first_task_id &&
        !task_find(co, mt->task_id))
        return mt->task_id;
    return task_new_id(co);
}

void cfx__coord_task_submit(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    const struct cfx_msg_task *mt = &m->u.task;
    bool again = (mt->flags & CFX_PROTO_TASK_AGAIN) != 0;
    struct coord_task *t;
    struct coord_node *n = NULL;
    char why[CFX_PROTO_TEXT_MAX - 64];
    int rc;

    if (!mt->name[0] || !mt->nresults || !mt->key) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID, "a task needs a function name, "
                             "at least one result and an idempotency key");
        return;
    }
    t = task_find_key(co, mt->key);
    if (t) { /* a repeat: the task it made, whatever became of it */
        CFX_LOG(DEBUG, CTL, "node %u submitted task %llu ('%s') again: key known",
                c->node->rec.node_id, (unsigned long long)t->id, t->t.name);
        reply_task(c, m->req_id, t, CFX_OK);
        return;
    }
    if (again && mt->task_id >= co->first_task_id) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND, "coordinator %s: task %llu "
                             "ended long ago and is forgotten; it is not run again", co->addr,
                             (unsigned long long)mt->task_id);
        return;
    }
    bool hold = again && held_now(co, mt->hint_node);
    rc = hold ? CFX_ERR_BUSY : cfx__coord_place(co, mt, 0, &n, why, sizeof(why));
    if (hold)
        snprintf(why, sizeof(why), "held while workers re-announce their tasks");
    if (rc == CFX_ERR_BUSY && co->ntasks_queued >= co->max_queued_tasks) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "coordinator %s: %u tasks "
                             "queued, the max_queued_tasks cap (%s)", co->addr,
                             co->ntasks_queued, why);
        return;
    }
    if (rc != CFX_OK && rc != CFX_ERR_BUSY) {
        cfx__coord_reply_err(c, m->req_id, rc, "task '%s': %s", mt->name, why);
        return;
    }
    t = task_new(co, mt, submit_id(co, mt), c->node->rec.node_id,
                 hold ? COORD_TASK_HELD : COORD_TASK_QUEUED);
    if (!t) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory for a "
                             "task", co->addr);
        return;
    }
    if (rc == CFX_OK && task_start(co, t, n) != CFX_OK) {
        task_end(co, t, CFX_ERR_NOMEM, "coordinator out of memory");
        reply_task(c, m->req_id, t, CFX_ERR_NOMEM);
        return;
    }
    if (rc == CFX_ERR_BUSY)
        CFX_LOG(DEBUG, CTL, "task %llu ('%s') %s: %s", (unsigned long long)t->id, t->t.name,
                hold ? "held" : "queued", why);
    reply_task(c, m->req_id, t, CFX_OK);
}

static int task_by_id(const void *a, const void *b)
{
    uint64_t x = (*(struct coord_task *const *)a)->id, y = (*(struct coord_task *const *)b)->id;
    return (x > y) - (x < y);
}

static void task_rec(const struct coord_task *t, uint64_t now, struct cfx_ctl_task_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->id = t->id;
    snprintf(r->name, sizeof(r->name), "%s", t->t.name);
    r->state = t->state == COORD_TASK_PLACED ? CFX_CTL_TASK_PLACED
               : t->state == COORD_TASK_DONE ? CFX_CTL_TASK_DONE
                                             : CFX_CTL_TASK_QUEUED; /* queued or held */
    r->node_id = t->node_id;
    r->submitter = t->submitter;
    r->placements = t->placements;
    r->status = t->state == COORD_TASK_DONE ? t->status : 0;
    uint64_t age = (now - t->submit_ns) / 1000000ull;
    r->age_ms = age > UINT32_MAX ? UINT32_MAX : (uint32_t)age;
    r->cores = t->t.cores;
    r->gpus = t->t.gpus;
    r->memory = t->t.memory;
    r->ninputs = t->t.ninputs;
    r->nresults = t->t.nresults;
    if (t->t.nresults)
        r->result = t->t.results[0];
    if (t->state == COORD_TASK_DONE)
        snprintf(r->text, sizeof(r->text), "%.*s", (int)sizeof(r->text) - 1, t->text);
}

/*
 * The ids above the cursor, smallest first, a page at a time.  Live and
 * ended tasks sit on two lists in no common order; both are bounded
 * (max_queued_tasks, max_node_tasks per node, COORD_TASKS_DONE_KEEP), so a
 * page sorts what is above the cursor.
 */
void cfx__coord_tasks_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_list *lists[2] = { &co->tasks, &co->tasks_done }, *pos;
    struct coord_task **v = NULL;
    struct cfx_ctl_task_rec *recs = NULL;
    size_t n = 0, cap = 0;
    uint64_t now = cfx__now_ns();

    for (int l = 0; l < 2; l++)
        cfx_list_for_each(pos, lists[l]) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            if (t->id <= m->u.task_cursor)
                continue;
            if (n == cap) {
                size_t ncap = cap ? 2 * cap : 64;
                struct coord_task **nv = realloc(v, ncap * sizeof(*nv));
                if (!nv)
                    goto err_nomem;
                v = nv;
                cap = ncap;
            }
            v[n++] = t;
        }
    if (n > 1)
        qsort(v, n, sizeof(*v), task_by_id);
    uint32_t count = n > CFX_PROTO_TASKS_PAGE ? CFX_PROTO_TASKS_PAGE : (uint32_t)n;
    if (count && !(recs = malloc(count * sizeof(*recs))))
        goto err_nomem;
    for (uint32_t i = 0; i < count; i++)
        task_rec(v[i], now, &recs[i]);
    struct cfx_msg r = { .type = CFX_MSG_TASKS_REPLY, .req_id = m->req_id };
    r.u.tpage.count = count;
    r.u.tpage.next = count ? recs[count - 1].id : m->u.task_cursor;
    r.u.tpage.more = n > count;
    r.u.tpage.recs_in = recs;
    cfx__coord_send(c, &r);
    free(recs);
    free(v);
    return;

err_nomem:
    free(v);
    cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                         co->addr);
}

void cfx__coord_task_place(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct coord_node *n = NULL;
    char why[CFX_PROTO_TEXT_MAX - 64];
    uint32_t ms = m->u.task.reserve_ms ? m->u.task.reserve_ms : COORD_PLACE_RESERVE_MS;
    bool data = m->u.task.flags & CFX_PROTO_TASK_DATA;
    struct coord_node *asker = c->node;
    const char *what = data ? "data" : m->u.task.name[0] ? m->u.task.name : "(any)";

    /* A query's reservation holds a worker's capacity away from every
     * other member: for a bounded time, and so many at once per asker (it
     * goes when the asker dies or leaves: cfx__coord_task_node_gone). */
    if (!data && ms > COORD_PLACE_RESERVE_MAX_MS) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID, "placement of '%s' by node %u: "
                             "reserve_ms %u is above the cap of %u ms", what,
                             asker->rec.node_id, ms, COORD_PLACE_RESERVE_MAX_MS);
        return;
    }
    if (!data && asker->nqueries >= COORD_NODE_QUERIES_MAX) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "placement of '%s': node %u "
                             "holds %u placement reservations, the cap of a node (they expire "
                             "after their reserve_ms)", what, asker->rec.node_id,
                             asker->nqueries);
        return;
    }
    int rc = data ? cfx__coord_place_data(co, &m->u.task, asker->rec.node_id, &n, why,
                                          sizeof(why))
                  : cfx__coord_place(co, &m->u.task, 0, &n, why, sizeof(why));

    if (rc != CFX_OK) {
        cfx__coord_reply_err(c, m->req_id, rc, "placement of '%s': %s", what, why);
        return;
    }
    uint64_t until = cfx__now_ns() + (uint64_t)ms * 1000000ull;
    if (!data) {
        struct coord_resv *r = cfx__coord_resv_take(co, n, &m->u.task, until);
        if (!r) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory",
                                 co->addr);
            return;
        }
        r->asker = asker->rec.node_id;
        asker->nqueries++;
    }
    struct cfx_msg r = { .type = CFX_MSG_TASK_REPLY, .req_id = m->req_id };
    r.u.task_st.node_id = n->rec.node_id;
    cfx__coord_send(c, &r);
}

void cfx__coord_task_wait(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct coord_task *t = task_find(co, m->u.task_st.task_id);
    struct coord_task_wait *w;

    if (!t) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND, "coordinator %s knows no task "
                             "%llu (ended long ago, or submitted before a restart)", co->addr,
                             (unsigned long long)m->u.task_st.task_id);
        return;
    }
    if (t->state == COORD_TASK_DONE || m->u.task_st.timeout_ms == 0) {
        reply_task(c, m->req_id, t, t->state == COORD_TASK_DONE ? t->status : CFX_ERR_AGAIN);
        return;
    }
    /* as parked lookups: a connection's share, then the budget of all
     * (coord_waits.c) */
    uint32_t share = cfx__coord_wait_share(co);
    if (c->ntask_waits >= share) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "coordinator %s: node %u "
                             "already waits for %u tasks, its cap (%u: at most %u a member, "
                             "or its share of max_parked %u among %u live members)", co->addr,
                             c->node->rec.node_id, c->ntask_waits, share,
                             COORD_PARKED_PER_CONN, co->max_parked, co->nodes_alive);
        return;
    }
    if (co->ntask_waits >= co->max_parked) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "coordinator %s: %u task "
                             "waits parked, the max_parked cap; node %u's wait refused",
                             co->addr, co->ntask_waits, c->node->rec.node_id);
        return;
    }
    w = calloc(1, sizeof(*w));
    if (!w) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory",
                             co->addr);
        return;
    }
    w->conn = c;
    w->req_id = m->req_id;
    w->task_id = t->id;
    w->deadline_ns = m->u.task_st.timeout_ms == CFX_PROTO_TIMEOUT_NONE
                         ? UINT64_MAX
                         : cfx__now_ns() + (uint64_t)m->u.task_st.timeout_ms * 1000000ull;
    cfx_list_add_tail(&w->link, &co->task_waits);
    c->ntask_waits++;
    co->ntask_waits++;
}

/* The ended task that node @p node ran under @p run_id (an adopted id), or NULL. */
static struct coord_task *task_find_done_run(struct cfx_coord *co, uint64_t run_id,
                                             uint32_t node)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->tasks_done) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->node_id == node && t->run_id == run_id)
            return t;
    }
    return NULL;
}

/* The live task that node @p node runs under @p run_id. */
static struct coord_task *task_find_run(struct cfx_coord *co, uint64_t run_id, uint32_t node)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->state == COORD_TASK_PLACED && t->node_id == node && t->run_id == run_id)
            return t;
    }
    return NULL;
}

void cfx__coord_task_done(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    uint32_t node = c->node->rec.node_id;
    struct coord_task *t = task_find_run(co, m->u.task_st.task_id, node);

    /* a task that moved (its node was declared dead, then spoke), ended by
     * its deadline, or not re-announced yet after a restart (its
     * re-announcement ends it): the report does not count */
    if (!t) {
        struct coord_resv *r = run_find(co, m->u.task_st.task_id, node);
        struct coord_fence *fence = NULL;
        struct coord_task *moved = fenced_find(co, m->u.task_st.task_id, node, &fence);
        if (moved) {
            /* a run that went on after its node was declared dead: the
             * task is another run's (see "Fences") */
            char text[CFX_PROTO_TEXT_MAX - 64];
            fence_text(moved, c->node, text, sizeof(text));
            CFX_LOG(INFO, CTL, "node %u ended its run of task %llu (%s): the end does not "
                    "count: %s", node, (unsigned long long)m->u.task_st.task_id,
                    cfx_errname(m->u.task_st.status), text);
            /* remembered: a re-announcement of the run sent before this
             * end but handled after it must not hold its cores again */
            fence->ended = 1;
            if (r) {
                cfx__coord_resv_free(co, r);
                retry_queue(co);
            }
            return;
        }
        if (r) {
            /* a run that went on after its task ended for its waiter:
             * the end counted already (a timed-out task stays timed out);
             * its slot is free now, and its results are the submitter's */
            struct coord_task *ended = task_find(co, m->u.task_st.task_id);
            if (!ended)
                ended = task_find_done_run(co, m->u.task_st.task_id, node);
            CFX_LOG(INFO, CTL, "node %u ended task %llu after it ended for its waiter (%s; "
                    "the run's own status %s): its reservation is released", node,
                    (unsigned long long)m->u.task_st.task_id,
                    ended ? cfx_errname(ended->status) : "forgotten",
                    cfx_errname(m->u.task_st.status));
            if (ended)
                results_grant(co, ended, node);
            cfx__coord_resv_free(co, r);
            retry_queue(co);
            return;
        }
        CFX_LOG(DEBUG, CTL, "node %u reports task %llu, which it does not hold (now)", node,
                (unsigned long long)m->u.task_st.task_id);
        return;
    }
    task_end(co, t, m->u.task_st.status, m->u.task_st.text);
    retry_queue(co);
}

/* Place the queued tasks that fit now, oldest first.  One whose function no
 * live node offers now stays queued: a node that registers it places it, or
 * its deadline ends it (CFX_ERR_TIMEOUT).  Ending it with placement's
 * CFX_ERR_NOT_FOUND gave its waiter a status that, for cfx_task_wait(),
 * says the task ended and was forgotten long ago. */
static void retry_queue(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    char why[CFX_PROTO_TEXT_MAX - 64];

    if (!co->ntasks_queued)
        return;
    cfx_list_for_each_safe(pos, tmp, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        struct coord_node *n = NULL;
        if (t->state != COORD_TASK_QUEUED)
            continue;
        int rc = cfx__coord_place(co, &t->t, 0, &n, why, sizeof(why));
        if (rc == CFX_OK)
            rc = task_start(co, t, n);
        if (rc != CFX_OK && rc != CFX_ERR_BUSY && rc != CFX_ERR_NOT_FOUND) {
            /* its nodes changed since it was queued (one left or died) */
            char text[CFX_PROTO_TEXT_MAX + CFX_TASK_NAME_MAX + 64]; /* task_end cuts it */
            snprintf(text, sizeof(text), "task %llu ('%s'), queued, can no longer be placed: "
                     "%s", (unsigned long long)t->id, t->t.name, why);
            task_end(co, t, rc, text);
        }
    }
}

static void held_release(struct cfx_coord *co, struct coord_task *t);

void cfx__coord_task_tick(struct cfx_coord *co, uint64_t now)
{
    struct cfx_list *pos, *tmp;
    int freed = 0;
    char text[CFX_PROTO_TEXT_MAX];

    if (now - co->start_ns >= (uint64_t)co->task_grace_ms * 1000000ull)
        cfx_list_for_each_safe(pos, tmp, &co->tasks) {
            struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
            if (t->state == COORD_TASK_HELD) {
                held_release(co, t);
                freed = 1;
            }
        }

    cfx_list_for_each_safe(pos, tmp, &co->resvs) {
        struct coord_resv *r = cfx_list_entry(pos, struct coord_resv, link);
        if (!r->task && r->expires_ns <= now) {
            cfx__coord_resv_free(co, r);
            freed = 1;
        }
    }
    cfx_list_for_each_safe(pos, tmp, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->deadline_ns > now)
            continue;
        if (t->state != COORD_TASK_PLACED)
            snprintf(text, sizeof(text), "task %llu ('%s') found no free node before its "
                     "deadline (%u ms)", (unsigned long long)t->id, t->t.name,
                     t->t.timeout_ms);
        else
            snprintf(text, sizeof(text), "task %llu ('%s') did not end on node %u before its "
                     "deadline (%u ms)", (unsigned long long)t->id, t->t.name, t->node_id,
                     t->t.timeout_ms);
        /* a placed one still runs there (nothing stops it): its slot stays
         * taken until the node reports the end (run_detach) */
        freed |= t->state != COORD_TASK_PLACED;
        task_end_run(co, t, CFX_ERR_TIMEOUT, text, true);
    }
    cfx_list_for_each_safe(pos, tmp, &co->task_waits) {
        struct coord_task_wait *w = cfx_list_entry(pos, struct coord_task_wait, link);
        struct coord_task *t = task_find(co, w->task_id);
        if (w->deadline_ns > now || !t)
            continue;
        reply_task(w->conn, w->req_id, t, CFX_ERR_AGAIN);
        task_wait_free(co, w);
    }
    while (co->ntasks_done) {
        struct coord_task *old = cfx_list_entry(co->tasks_done.next, struct coord_task, link);
        /* one ended in this tick (a deadline above) ended after @p now: the
         * difference wrapped, and the task was forgotten at once */
        if (old->done_ns >= now ||
            now - old->done_ns < (uint64_t)COORD_TASK_DONE_KEEP_MS * 1000000ull)
            break;
        cfx_list_del(&old->link);
        task_free(old);
        co->ntasks_done--;
    }
    if (freed)
        retry_queue(co);
}

/* Which input of @p t no live node but @p dead holds completely (NULL: none). */
static const struct cfx_object_id *input_lost(struct cfx_coord *co, const struct coord_task *t,
                                              uint32_t dead)
{
    for (unsigned i = 0; i < t->t.ninputs; i++)
        if (!cfx__coord_dir_held_elsewhere(co, &t->t.inputs[i], dead))
            return &t->t.inputs[i];
    return NULL;
}

void cfx__coord_task_node_gone(struct cfx_coord *co, struct coord_node *n)
{
    struct cfx_list *pos, *tmp;
    uint32_t dead = n->rec.node_id;
    /* a node that said goodbye cut its running tasks short (task.c): that
     * is not a failure of the node, and its waiters are told which it was */
    const char *how = n->rec.flags & CFX_NODE_F_LEFT ? "left" : "died";
    char why[256], text[CFX_PROTO_TEXT_MAX];

    /* Its tasks still waiting for a slot (or, after a restart, for their
     * worker's word) are not run, nor placed again if they ran on it: their
     * results would go with their submitter at once (coord_directory.c,
     * task results) */
    cfx_list_for_each_safe(pos, tmp, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->submitter != dead ||
            !(t->state == COORD_TASK_QUEUED || t->state == COORD_TASK_HELD ||
              (t->state == COORD_TASK_PLACED && t->node_id == dead)))
            continue;
        snprintf(text, sizeof(text), "task %llu ('%s'): its submitter node %u left before it "
                 "%s", (unsigned long long)t->id, t->t.name, dead,
                 t->state == COORD_TASK_PLACED ? "ended" : "was placed");
        task_end(co, t, CFX_ERR_PEER_FAILED, text);
    }
    /* The placement queries it asked: nobody will submit their tasks, and
     * their capacity was held away from every other member until expiry. */
    int freed = 0;
    cfx_list_for_each_safe(pos, tmp, &co->resvs) {
        struct coord_resv *r = cfx_list_entry(pos, struct coord_resv, link);
        if (r->asker == dead && !r->task) {
            cfx__coord_resv_free(co, r);
            freed = 1;
        }
    }
    if (!n->worker) {
        if (freed)
            retry_queue(co);
        return;
    }
    cfx_list_for_each_safe(pos, tmp, &co->resvs) {
        struct coord_resv *r = cfx_list_entry(pos, struct coord_resv, link);
        if (r->node_id == dead && !r->task)
            cfx__coord_resv_free(co, r);
    }
    cfx_list_for_each_safe(pos, tmp, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        struct coord_node *to = NULL;
        const struct cfx_object_id *lost;
        if (t->state != COORD_TASK_PLACED || t->node_id != dead)
            continue;
        cfx__coord_resv_free(co, t->resv);
        /* a node declared dead may only be paused: its run is no longer the task's */
        fence_add(t, dead, t->run_id);
        lost = input_lost(co, t, dead);
        if (lost) {
            char hex[CFX_OBJECT_ID_HEX_LEN];
            cfx_object_id_to_hex(lost, hex);
            snprintf(text, sizeof(text), "task %llu ('%s'): node %u %s while it ran there, "
                     "and its input %s is held by no other live node", (unsigned long long)t->id,
                     t->t.name, dead, how, hex);
            task_end(co, t, CFX_ERR_PEER_FAILED, text);
            continue;
        }
        t->state = COORD_TASK_QUEUED;
        co->ntasks_queued++;
        t->node_id = 0;
        int rc = cfx__coord_place(co, &t->t, dead, &to, why, sizeof(why));
        if (rc == CFX_OK)
            rc = task_start(co, t, to);
        if (rc == CFX_OK) {
            CFX_LOG(INFO, CTL, "task %llu ('%s') placed again on node %u: node %u %s while "
                    "it ran there", (unsigned long long)t->id, t->t.name, to->rec.node_id, dead,
                    how);
        } else if (rc != CFX_ERR_BUSY) {
            snprintf(text, sizeof(text), "task %llu ('%s'): node %u %s while it ran there, "
                     "and it cannot be placed again: %s", (unsigned long long)t->id, t->t.name,
                     dead, how, why);
            t->node_id = dead; /* the node that last held it, for its waiters (task.h) */
            task_end(co, t, CFX_ERR_PEER_FAILED, text);
        }
    }
    free(n->worker);
    n->worker = NULL;
    retry_queue(co);
}

/*
 * The grace after the start is over and @p t is still held: when its node
 * came back and closed its re-announcement list without it, or no node is
 * known, it is queued (and placed); when its node never came back it is
 * treated as a task of a dead node: placed elsewhere when its inputs are
 * held elsewhere, else failed naming the node.
 */
static void held_release(struct cfx_coord *co, struct coord_task *t)
{
    uint32_t gone = t->hint_node;
    struct coord_node *n = hint_find(co, gone), *to = NULL;
    const struct cfx_object_id *lost;
    char why[256], text[CFX_PROTO_TEXT_MAX];

    t->state = COORD_TASK_QUEUED;
    if (!gone || (n && n->rec.alive && n->worker && n->worker->announced))
        return;
    /* the id's holder now is another process (hint_find): its copies and
     * slots are its own, nothing to avoid */
    uint32_t avoid = !n && cfx__coord_node_find(co, gone) ? 0 : gone;
    lost = input_lost(co, t, avoid);
    if (lost) {
        char hex[CFX_OBJECT_ID_HEX_LEN];
        cfx_object_id_to_hex(lost, hex);
        snprintf(text, sizeof(text), "task %llu ('%s'): node %u ran it before the coordinator "
                 "restarted and did not come back within %u ms, and its input %s is held by "
                 "no other live node", (unsigned long long)t->id, t->t.name, gone,
                 co->task_grace_ms, hex);
        task_end(co, t, CFX_ERR_PEER_FAILED, text);
        return;
    }
    int rc = cfx__coord_place(co, &t->t, avoid, &to, why, sizeof(why));
    if (rc == CFX_OK)
        rc = task_start(co, t, to);
    if (rc == CFX_OK) {
        CFX_LOG(INFO, CTL, "task %llu ('%s') placed again on node %u: node %u, which ran it "
                "before the coordinator restarted, did not come back", (unsigned long long)t->id,
                t->t.name, to->rec.node_id, gone);
    } else if (rc != CFX_ERR_BUSY) {
        snprintf(text, sizeof(text), "task %llu ('%s'): node %u ran it before the coordinator "
                 "restarted and did not come back within %u ms, and it cannot be placed "
                 "again: %s", (unsigned long long)t->id, t->t.name, gone, co->task_grace_ms,
                 why);
        task_end(co, t, CFX_ERR_PEER_FAILED, text);
    }
}

/* Place @p t on @p n, where it runs already under @p run_id (no EV_TASK_RUN). */
static int task_adopt(struct cfx_coord *co, struct coord_task *t, struct coord_node *n,
                      uint64_t run_id)
{
    t->resv = cfx__coord_resv_take(co, n, &t->t, UINT64_MAX);
    if (!t->resv)
        return CFX_ERR_NOMEM;
    t->resv->task = t;
    if (t->state == COORD_TASK_QUEUED || t->state == COORD_TASK_HELD)
        co->ntasks_queued--;
    t->state = COORD_TASK_PLACED;
    t->node_id = n->rec.node_id;
    t->run_id = run_id;
    t->adopted = 1;
    t->placements++;
    return CFX_OK;
}

/* The empty TASK_ANNOUNCE: node @p n re-announced all it holds; the repeats
 * held for it go to the queue. */
static void announce_end(struct cfx_coord *co, struct coord_node *n)
{
    struct cfx_list *pos;
    n->worker->announced = 1;
    /* a node that got its id afresh may not be the one the hints name
     * (hint_find): the repeats wait for that one, or the grace */
    cfx_list_for_each(pos, &co->tasks) {
        struct coord_task *t = cfx_list_entry(pos, struct coord_task, link);
        if (t->state == COORD_TASK_HELD && t->hint_node == n->rec.node_id &&
            hint_find(co, t->hint_node) == n)
            t->state = COORD_TASK_QUEUED;
    }
    retry_queue(co);
}

void cfx__coord_task_announce(struct cfx_coord *co, struct coord_conn *c,
                              const struct cfx_msg *m)
{
    const struct cfx_msg_task *mt = &m->u.task;
    struct coord_node *n = c->node;
    uint32_t node = n->rec.node_id;
    struct coord_task *t;

    if (!n->worker) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID, "node %u re-announces a task but "
                             "registered no function", node);
        return;
    }
    if (!mt->name[0]) {
        announce_end(co, n);
        cfx__coord_reply_ok(c, m->req_id);
        return;
    }
    if (!mt->key || !mt->task_id || !mt->nresults) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID, "node %u re-announces task %llu "
                             "without a key, an id or a result", node,
                             (unsigned long long)mt->task_id);
        return;
    }
    t = task_find_key(co, mt->key);
    if (t && task_fences(t, node)) {
        /* this node was declared dead while it ran the task, which moved:
         * the run goes on (nothing stops it) and keeps its cores, as
         * run_detach's, until it reports its end (unless it did already);
         * it is not the task's */
        char text[CFX_PROTO_TEXT_MAX - 64];
        fence_text(t, n, text, sizeof(text));
        CFX_LOG(WARN, CTL, "node %u re-announces task %llu: refused: %s", node,
                (unsigned long long)mt->task_id, text);
        if (!t->fenced[fence_of(t, node)].ended && !run_find(co, mt->task_id, node) &&
            n->worker->nres < co->max_node_tasks) {
            struct coord_resv *r = cfx__coord_resv_take(co, n, &t->t, UINT64_MAX);
            if (r)
                r->run_id = mt->task_id;
        }
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_CANCELED, "%s", text);
        return;
    }
    if (t && t->state == COORD_TASK_PLACED && t->node_id != node && t->adopted) {
        /* two nodes each say they run it: both runs are real (one was taken
         * for dead before the restart and spoke again); the first stays */
        CFX_LOG(ERR, CTL, "node %u re-announces task %llu ('%s'), which node %u re-announced "
                "already (node %u was taken for dead before the restart): it runs twice",
                node, (unsigned long long)t->id, t->t.name, t->node_id, node);
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS, "task %llu is placed on node %u",
                             (unsigned long long)t->id, t->node_id);
        return;
    }
    if (t && t->state == COORD_TASK_PLACED && t->node_id != node) {
        /* This coordinator placed it (a repeat released by the grace, or by
         * a hint), but node @p node has run it since before the restart:
         * that run is the task's, and its end is what the waiter gets.  The
         * run sent meanwhile cannot be stopped (no message does): it keeps
         * its reservation until its node reports its end (run_detach). */
        if (n->worker->nres >= co->max_node_tasks) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "node %u re-announces "
                                 "task %llu with %u tasks placed on it: the max_node_tasks cap",
                                 node, (unsigned long long)mt->task_id, n->worker->nres);
            return;
        }
        CFX_LOG(WARN, CTL, "node %u re-announces task %llu ('%s') after the grace, which "
                "had placed it on node %u: node %u's run is the task's; the one on node %u "
                "cannot be stopped", node, (unsigned long long)t->id, t->t.name, t->node_id,
                node, t->node_id);
        run_detach(t);
        t->state = COORD_TASK_QUEUED;
        co->ntasks_queued++; /* task_adopt takes it off the queue again */
        t->node_id = 0;
    }
    if (t && (t->state == COORD_TASK_DONE || t->state == COORD_TASK_PLACED)) {
        cfx__coord_reply_ok(c, m->req_id); /* known already: a repeat */
        return;
    }
    if (n->worker->nres >= co->max_node_tasks) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE, "node %u re-announces task "
                             "%llu with %u tasks placed on it: the max_node_tasks cap", node,
                             (unsigned long long)mt->task_id, n->worker->nres);
        return;
    }
    if (!t && task_find(co, mt->task_id)) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS, "node %u re-announces task %llu: "
                             "that id is another task's", node, (unsigned long long)mt->task_id);
        return;
    }
    if (!t && !(t = task_new(co, mt, mt->task_id, mt->submitter, COORD_TASK_QUEUED))) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory for a "
                             "task", co->addr);
        return;
    }
    if (task_adopt(co, t, n, mt->task_id) != CFX_OK) {
        task_end(co, t, CFX_ERR_NOMEM, "coordinator out of memory");
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s: no memory",
                             co->addr);
        return;
    }
    CFX_LOG(INFO, CTL, "node %u re-announced task %llu ('%s', submitted by node %u)", node,
            (unsigned long long)t->id, t->t.name, t->submitter);
    cfx__coord_reply_ok(c, m->req_id);
}

void cfx__coord_task_conn_gone(struct cfx_coord *co, struct coord_conn *c)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &co->task_waits) {
        struct coord_task_wait *w = cfx_list_entry(pos, struct coord_task_wait, link);
        if (w->conn == c)
            task_wait_free(co, w);
    }
}

/*
 * Tasks across a coordinator restart, on the node side (the coordinator's
 * side and the whole protocol: control/coord_task.c, "Restarts").
 *
 *  - Submitter: every submission carries an idempotency key, key_base (64
 *    random bits drawn when the context starts) plus a per-context sequence.
 *    The handle keeps the submission; when a wait finds the task unknown
 *    (the coordinator restarted and nobody re-announced it yet) it submits
 *    it again with CFX_PROTO_TASK_AGAIN, its old id and the node it was
 *    placed on, and waits again, all within the wait's deadline.
 *  - Worker: after a reconnect a runner registers the functions again, then
 *    re-announces (TASK_ANNOUNCE) each task queued or running here and each
 *    one ended here in the last TASK_ENDED_KEEP_MS (the last TASK_ENDED_KEEP),
 *    closes the list with an empty TASK_ANNOUNCE, and sends the ends of the
 *    ended ones again (a TASK_DONE the coordinator has already counted, or
 *    for a task it does not hold, is ignored).  A task asked to run whose key
 *    runs, waits or ended here is not run again: its end is reported under
 *    the new id as well (at most once, even if a repeat came after the grace
 *    and was placed here again).
 *  - A node declared dead while it was only paused or cut off rejoins under
 *    a new id, and its re-announcements follow.  A task that moved off it
 *    meanwhile is refused (CFX_ERR_CANCELED, control/coord_task.c,
 *    "Fences"): one still queued here is dropped, never run; a run going on
 *    is marked moved (its cfx_task_result_put fails at once with the
 *    coordinator's words, and its end is reported, not remembered); an end
 *    remembered here is forgotten and reported once more (that frees the
 *    run's cores at the coordinator, and counts for nothing else).
 *
 * Threads: cfx__task_dedup() runs on the control client's thread and never
 * waits for a reply; cfx__task_announce() runs on a runner; resubmission on
 * the thread of cfx_task_wait().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/task_int.h"

uint64_t cfx__task_key(struct cfx_task_rt *rt)
{
    uint64_t k;
    do
        k = rt->key_base + __atomic_add_fetch(&rt->key_seq, 1, __ATOMIC_RELAXED);
    while (!k);
    return k;
}

static void alias_add(uint64_t *alias, unsigned *n, uint64_t id, uint64_t own)
{
    if (id == own)
        return;
    for (unsigned i = 0; i < *n; i++)
        if (alias[i] == id)
            return;
    if (*n < TASK_ALIAS_MAX)
        alias[(*n)++] = id;
}

static struct task_job *job_by_key(struct cfx_list *list, uint64_t key)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, list) {
        struct task_job *j = cfx_list_entry(pos, struct task_job, link);
        if (j->t.key == key)
            return j;
    }
    return NULL;
}

/* rt->mu held: the remembered end of @p key, or NULL. */
static struct task_ended *ended_by_key(struct cfx_task_rt *rt, uint64_t key)
{
    uint64_t now = cfx__now_ns();
    for (unsigned i = 0; rt->ended && i < TASK_ENDED_KEEP; i++) {
        struct task_ended *e = &rt->ended[i];
        if (e->ended_ns && e->t.key == key &&
            now - e->ended_ns < (uint64_t)TASK_ENDED_KEEP_MS * 1000000ull)
            return e;
    }
    return NULL;
}

bool cfx__task_dedup(struct cfx_context *ctx, const struct cfx_msg_task *t)
{
    struct cfx_task_rt *rt = ctx->tasks;
    struct task_job *j;
    struct task_ended *e;
    int status;
    char *text;

    pthread_mutex_lock(&rt->mu);
    j = job_by_key(&rt->running, t->key);
    if (!j)
        j = job_by_key(&rt->jobs, t->key);
    if (j) {
        alias_add(j->alias, &j->nalias, t->task_id, j->t.task_id);
        /* placed here again after it moved off: the run is the task's again */
        j->moved = false;
        pthread_mutex_unlock(&rt->mu);
        CFX_LOG(INFO, CTL, "node %u: task %llu ('%s') runs here already as task %llu: not run "
                "twice", ctx->node_id, (unsigned long long)t->task_id, t->name,
                (unsigned long long)j->t.task_id);
        return true;
    }
    e = ended_by_key(rt, t->key);
    if (!e) {
        pthread_mutex_unlock(&rt->mu);
        return false;
    }
    status = e->status;
    text = strdup(e->text);
    pthread_mutex_unlock(&rt->mu);
    CFX_LOG(INFO, CTL, "node %u: task %llu ('%s') ended here already: not run twice",
            ctx->node_id, (unsigned long long)t->task_id, t->name);
    cfx__task_report(ctx, t, NULL, 0, status, text ? text : "");
    free(text);
    return true;
}

void cfx__task_ended_add(struct cfx_task_rt *rt, const struct task_job *j, int status,
                         const char *text)
{
    struct task_ended *e = &rt->ended[rt->ended_next];

    rt->ended_next = (rt->ended_next + 1) % TASK_ENDED_KEEP;
    e->t = j->t;
    e->t.arg = NULL;
    e->t.arg_len = 0;
    memcpy(e->alias, j->alias, sizeof(e->alias));
    e->nalias = j->nalias;
    e->ended_ns = cfx__now_ns();
    e->status = status;
    snprintf(e->text, sizeof(e->text), "%s", text);
}

void cfx__task_report(struct cfx_context *ctx, const struct cfx_msg_task *t,
                      const uint64_t *alias, unsigned nalias, int status, const char *text)
{
    for (unsigned i = 0; i <= nalias; i++) {
        struct cfx_msg done = { .type = CFX_MSG_TASK_DONE };
        done.u.task_st.task_id = i ? alias[i - 1] : t->task_id;
        done.u.task_st.node_id = ctx->node_id;
        done.u.task_st.status = status;
        snprintf(done.u.task_st.text, sizeof(done.u.task_st.text), "%s", text);
        if (cfx__ctl_send_nowait(ctx->ctl, &done, "task end") != CFX_OK)
            CFX_LOG(WARN, CTL, "node %u: cannot report the end of task %llu now (%s): it is "
                    "reported again after the reconnection", ctx->node_id,
                    (unsigned long long)done.u.task_st.task_id, cfx_last_error());
    }
}

/* One task to re-announce: its body and argument, copied out of rt->mu,
 * and for one that ended, its end (reported right after it). */
struct announce_ent {
    struct cfx_msg_task t;
    bool ended;
    int32_t status;
    uint64_t alias[TASK_ALIAS_MAX];
    unsigned nalias;
    char text[CFX_PROTO_TEXT_MAX];
    uint8_t arg[];
};

/* rt->mu held: append copies of the tasks of @p list to @p v. */
static void collect_jobs(struct cfx_list *list, struct announce_ent **v, size_t *n, size_t cap)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, list) {
        struct task_job *j = cfx_list_entry(pos, struct task_job, link);
        struct announce_ent *a;
        if (*n == cap || !(a = malloc(sizeof(*a) + j->t.arg_len)))
            return;
        a->t = j->t;
        a->ended = false;
        memcpy(a->arg, j->arg, j->t.arg_len);
        a->t.arg = a->arg;
        uint64_t ms = j->deadline_ns == UINT64_MAX ? CFX_PROTO_TIMEOUT_NONE
                                                    : (uint64_t)cfx__ms_left(j->deadline_ns);
        a->t.timeout_ms = ms == 0 ? 1 : (uint32_t)ms;
        v[(*n)++] = a;
    }
}

static int announce_one(struct cfx_context *ctx, struct cfx_msg_task *t)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_ANNOUNCE };
    char what[96];

    m.u.task = *t;
    m.u.task.flags &= (uint8_t)~CFX_PROTO_TASK_AGAIN;
    m.u.task.hint_node = 0;
    if (t->name[0])
        snprintf(what, sizeof(what), "re-announcement of task %llu ('%s')",
                 (unsigned long long)t->task_id, t->name);
    else
        snprintf(what, sizeof(what), "end of the task re-announcements");
    int rc = cfx__ctl_request(ctx->ctl, &m, cfx__deadline_ns(TASK_REQ_MS), what, CFX_MSG_OK,
                              NULL, NULL);
    if (rc != CFX_OK)
        CFX_LOG(WARN, CTL, "node %u: %s", ctx->node_id, cfx_last_error());
    return rc;
}

/* The coordinator refused the re-announcement of @p a with CFX_ERR_CANCELED:
 * the task moved off this node while it was taken for dead (see the top). */
static void task_moved(struct cfx_context *ctx, const struct announce_ent *a)
{
    struct cfx_task_rt *rt = ctx->tasks;
    struct task_job *queued, *running = NULL;
    struct task_ended *e, end;
    char why[CFX_PROTO_TEXT_MAX];

    snprintf(why, sizeof(why), "%s", cfx_last_error()[0] ? cfx_last_error()
                                                          : "the task moved to another node");
    pthread_mutex_lock(&ctx->lock);
    bool closing = cfx__ctx_closing(ctx);
    pthread_mutex_unlock(&ctx->lock);
    if (closing) /* the request was cut short by the destroy, not refused */
        return;
    pthread_mutex_lock(&rt->mu);
    queued = job_by_key(&rt->jobs, a->t.key);
    if (queued)
        cfx_list_del(&queued->link);
    else if ((running = job_by_key(&rt->running, a->t.key))) {
        running->moved = true;
        memcpy(running->moved_text, why, sizeof(why));
    }
    /* ended, before the list was taken or since */
    e = ended_by_key(rt, a->t.key);
    if (e) {
        end = *e;
        e->ended_ns = 0;
    }
    pthread_mutex_unlock(&rt->mu);
    CFX_LOG(INFO, CTL, "node %u: task %llu ('%s') %s: %s", ctx->node_id,
            (unsigned long long)a->t.task_id, a->t.name,
            queued ? "is dropped, not run" : running ? "runs on, but not as the task's run"
                                                     : "ended here, not as the task's run", why);
    if (queued) {
        cfx__task_report(ctx, &queued->t, queued->alias, queued->nalias, CFX_ERR_CANCELED, why);
        free(queued);
    }
    if (e)
        cfx__task_report(ctx, &end.t, end.alias, end.nalias, end.status, end.text);
}

void cfx__task_announce(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    size_t n = 0, cap;
    struct announce_ent **v;
    struct cfx_list *pos;
    struct cfx_msg_task end = { .task_id = 0 };

    pthread_mutex_lock(&rt->mu);
    cap = TASK_ENDED_KEEP;
    cfx_list_for_each(pos, &rt->jobs)
        cap++;
    cfx_list_for_each(pos, &rt->running)
        cap++;
    v = malloc(cap * sizeof(*v));
    if (v) {
        collect_jobs(&rt->running, v, &n, cap);
        collect_jobs(&rt->jobs, v, &n, cap);
        for (unsigned i = 0; rt->ended && i < TASK_ENDED_KEEP && n < cap; i++) {
            struct task_ended *e = &rt->ended[i];
            /* a run that just ended is still on rt->running until its
             * runner takes it off: announced once, as running (its end
             * follows the list); twice, a refused one's second
             * announcement could come after its end and hold its cores at
             * the coordinator for good */
            if (!e->ended_ns || !ended_by_key(rt, e->t.key) ||
                job_by_key(&rt->running, e->t.key) || !(v[n] = malloc(sizeof(**v))))
                continue;
            v[n]->t = e->t;
            v[n]->t.timeout_ms = CFX_PROTO_TIMEOUT_NONE; /* its end follows at once */
            v[n]->ended = true;
            v[n]->status = e->status;
            memcpy(v[n]->alias, e->alias, sizeof(e->alias));
            v[n]->nalias = e->nalias;
            memcpy(v[n]->text, e->text, sizeof(e->text));
            n++;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    if (!v)
        CFX_LOG(ERR, CTL, "node %u: no memory to re-announce the tasks held here; their "
                "deadlines will end them", ctx->node_id);
    for (size_t i = 0; i < n; i++) {
        /* an ended one's end at once: were this node to die before it, the
         * coordinator would place the task again */
        int rc = announce_one(ctx, &v[i]->t);
        if (rc == CFX_OK && v[i]->ended)
            cfx__task_report(ctx, &v[i]->t, v[i]->alias, v[i]->nalias, v[i]->status,
                             v[i]->text);
        else if (rc == CFX_ERR_CANCELED)
            task_moved(ctx, v[i]);
        free(v[i]);
    }
    free(v);
    announce_one(ctx, &end);

    /* the ends again: those that came meanwhile (to tasks announced as
     * running or queued); a repeat is ignored */
    for (unsigned i = 0; rt->ended && i < TASK_ENDED_KEEP; i++) {
        pthread_mutex_lock(&rt->mu);
        struct task_ended e = rt->ended[i];
        bool live = e.ended_ns && ended_by_key(rt, e.t.key);
        pthread_mutex_unlock(&rt->mu);
        if (live)
            cfx__task_report(ctx, &e.t, e.alias, e.nalias, e.status, e.text);
    }
}

int cfx__task_resubmit(struct cfx_task *task, uint64_t deadline)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_SUBMIT }, reply;
    void *frame = NULL;
    char what[96];
    uint64_t dl = cfx__deadline_ns(TASK_REQ_MS);
    int rc;

    m.u.task = task->t;
    m.u.task.arg = task->t.arg_len ? task->arg : NULL;
    m.u.task.flags |= CFX_PROTO_TASK_AGAIN;
    m.u.task.task_id = task->id;
    m.u.task.hint_node = task->node;
    if (task->deadline_ns != UINT64_MAX) {
        int ms = cfx__ms_left(task->deadline_ns);
        m.u.task.timeout_ms = ms <= 0 ? 1 : (uint32_t)ms;
    }
    snprintf(what, sizeof(what), "submission again of task %llu ('%s')",
             (unsigned long long)task->id, task->t.name);
    CFX_LOG(INFO, CTL, "node %u: the coordinator does not know task %llu ('%s'): %s",
            task->ctx->node_id, (unsigned long long)task->id, task->t.name,
            "submitting it again (same key)");
    rc = cfx__ctl_request(task->ctx->ctl, &m, deadline < dl ? deadline : dl, what,
                          CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK) {
        task->id = reply.u.task_st.task_id;
        task->node = reply.u.task_st.node_id ? reply.u.task_st.node_id : task->node;
    }
    free(frame);
    return rc;
}

/*
 * Tasks on the node side (include/conflux/task.h): the functions this
 * context offers, the task runner threads that run what the coordinator
 * places here, and the calls that submit, wait for and place tasks.
 *
 * Threads: the coordinator client's thread hands each EV_TASK_RUN to
 * cfx__task_on_run(), which only queues a copy (it must not wait for a
 * reply); $CFX_TASK_THREADS runner threads (default 4, started by the first
 * cfx_task_register()) take the queue in order, run the function, check
 * that its results are here, and report TASK_DONE.  After a coordinator
 * restart a runner registers the functions again and re-announces the
 * tasks held here (task_keep.c, which also keeps what lets a submitter
 * submit again after a restart).  rt->mu protects the function table, the
 * queue and the flags (task_int.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <sys/random.h>

#include "dataplane/engine/task_int.h"

/* ---- setup ------------------------------------------------------------------ */

int cfx__task_init(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = calloc(1, sizeof(*rt));
    struct sysinfo si;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    if (!rt)
        return cfx__err(CFX_ERR_NOMEM, "no memory for the task runner");
    pthread_mutex_init(&rt->mu, NULL);
    pthread_cond_init(&rt->cond, NULL);
    cfx_list_init(&rt->jobs);
    cfx_list_init(&rt->running);
    if (getrandom(&rt->key_base, sizeof(rt->key_base), 0) != sizeof(rt->key_base))
        rt->key_base = cfx__now_ns() ^ ((uint64_t)getpid() << 32); /* unique enough */
    /* counts: a negative one wrapped to 4 billion offered, silently */
    rt->cores = (uint32_t)cfx__env_ll_clamp("CFX_TASK_CORES", ncpu > 0 ? ncpu : 1, 0, UINT32_MAX);
    rt->gpus = (uint32_t)cfx__env_ll_clamp("CFX_TASK_GPUS", 0, 0, UINT32_MAX);
    rt->memory = cfx__env_size("CFX_TASK_MEMORY",
                               sysinfo(&si) == 0 ? (size_t)si.totalram * si.mem_unit : 0);
    ctx->tasks = rt;
    return CFX_OK;
}

void cfx__task_stop(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    if (!rt)
        return;
    pthread_mutex_lock(&rt->mu);
    rt->stop = true;
    pthread_cond_broadcast(&rt->cond);
    pthread_mutex_unlock(&rt->mu);
    for (unsigned i = 0; i < rt->nthreads; i++)
        pthread_join(rt->threads[i], NULL);
    rt->nthreads = 0;
}

void cfx__task_fini(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    if (!rt)
        return;
    cfx__task_stop(ctx);
    while (!cfx_list_empty(&rt->jobs)) {
        struct task_job *j = cfx_list_entry(rt->jobs.next, struct task_job, link);
        cfx_list_del(&j->link);
        free(j);
    }
    pthread_cond_destroy(&rt->cond);
    pthread_mutex_destroy(&rt->mu);
    free(rt->ended);
    free(rt);
    ctx->tasks = NULL;
}

/* ---- client thread ------------------------------------------------------------ */

void cfx__task_on_run(void *arg, const struct cfx_msg_task *t)
{
    struct cfx_context *ctx = arg;
    struct cfx_task_rt *rt = ctx->tasks;
    struct task_job *j;

    if (cfx__task_dedup(ctx, t))
        return;
    j = malloc(sizeof(*j) + t->arg_len);
    if (!j) {
        CFX_LOG(ERR, CTL, "node %u: no memory to queue task %llu ('%s'); its deadline will "
                "fail it", ctx->node_id, (unsigned long long)t->task_id, t->name);
        return;
    }
    j->t = *t;
    j->nalias = 0;
    j->moved = false;
    if (t->arg_len)
        memcpy(j->arg, t->arg, t->arg_len);
    j->t.arg = j->arg;
    j->deadline_ns = t->timeout_ms == CFX_PROTO_TIMEOUT_NONE
                         ? UINT64_MAX
                         : cfx__now_ns() + (uint64_t)t->timeout_ms * 1000000ull;
    pthread_mutex_lock(&rt->mu);
    if (rt->stop) {
        pthread_mutex_unlock(&rt->mu);
        free(j);
        return;
    }
    cfx_list_add_tail(&j->link, &rt->jobs);
    pthread_cond_signal(&rt->cond);
    pthread_mutex_unlock(&rt->mu);
}

/*
 * The heartbeat's report: load for placement, traffic for the coordinator's
 * metrics and `rdmactl top`.  Called on the control client's thread, which
 * must never wait for ctx->lock (an API thread may hold it while it waits for
 * that thread's reply), so what ctx->lock guards (counters, transfers in
 * flight) is refreshed only when the lock is free at once, and otherwise
 * reported as of the last heartbeat that found it free.
 */
void cfx__task_load_fill(void *arg, struct cfx_msg_load *out)
{
    struct cfx_context *ctx = arg;
    struct cfx_msg_load *r = &ctx->report;
    struct sysinfo si;
    double avg;

    if (getloadavg(&avg, 1) == 1 && avg >= 0)
        r->load_milli = (uint32_t)(avg * 1000.0);
    if (sysinfo(&si) == 0)
        r->mem_avail = (uint64_t)si.freeram * si.mem_unit;
    r->arena_used = __atomic_load_n(&ctx->arena.used_bytes, __ATOMIC_RELAXED);
    if (ctx->tasks)
        r->tasks_running = __atomic_load_n(&ctx->tasks->running_n, __ATOMIC_RELAXED);
    r->ntp = (uint8_t)CFX_MIN((unsigned)ctx->ntp, CFX_LOAD_TPS_MAX);
    r->writes_refused = 0;
    for (int t = 0; t < ctx->ntp; t++) {
        if (t < (int)CFX_LOAD_TPS_MAX) {
            snprintf(r->tp[t].name, sizeof(r->tp[t].name), "%s", ctx->tp[t].ops->name);
            r->tp[t].tx_bytes = __atomic_load_n(&ctx->tp[t].tx_bytes, __ATOMIC_RELAXED);
            r->tp[t].rx_bytes = __atomic_load_n(&ctx->tp[t].rx_bytes, __ATOMIC_RELAXED);
        }
        if (ctx->tp[t].ops->iface_grant_refused) /* an atomic counter of the iface */
            r->writes_refused += ctx->tp[t].ops->iface_grant_refused(ctx->tp[t].iface);
    }
    if (pthread_mutex_trylock(&ctx->lock) == 0) {
        uint32_t gets = 0, uploads = 0;
        struct cfx_list *pos, *u;
        for (unsigned s = 0; s < CFX_XFER_SLOTS; s++)
            gets += ctx->slots[s] && !ctx->slots[s]->abandoned;
        cfx_list_for_each(pos, &ctx->conns) {
            struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
            cfx_list_for_each(u, &c->uploads)
                uploads++;
        }
        r->xfers_in_active = gets;
        r->uploads_active = uploads;
        r->puts = ctx->stats.puts;
        r->gets = ctx->stats.gets;
        r->uploads = ctx->stats.uploads;
        r->failovers = ctx->stats.source_failovers;
        r->reduce_reroutes = ctx->stats.reduce_reroutes;
        r->link_bw = ctx->est_bw > 0 ? (uint64_t)ctx->est_bw : 0;
        r->link_lat_ns = ctx->est_lat > 0 ? (uint64_t)(ctx->est_lat * 1e9) : 0;
        pthread_mutex_unlock(&ctx->lock);
    }
    *out = *r;
}

/*
 * The heartbeat's progress reports: the copies of objects this node is
 * receiving (one per transfer slot: an object has one incoming transfer at a
 * time), with the prefix landed in order.  At most @p max a beat; with more,
 * the next beat goes on from the slot after the last one reported, so every
 * copy is reported in turn.  As cfx__task_load_fill(), only when ctx->lock
 * is free at once: a beat that finds it held reports none, and the
 * directory keeps the last counts it had.  Messages, reduce intermediates
 * and copies the directory does not know (got from a cached location) are
 * not its business.
 */
unsigned cfx__task_progress_fill(void *arg, struct cfx_ctl_progress *out, unsigned max)
{
    struct cfx_context *ctx = arg;
    unsigned n = 0;

    if (pthread_mutex_trylock(&ctx->lock) != 0)
        return 0;
    uint32_t s = ctx->report_slot % CFX_XFER_SLOTS;
    for (unsigned k = 0; k < CFX_XFER_SLOTS && n < max; k++, s = (s + 1) % CFX_XFER_SLOTS) {
        const struct cfx_xfer_in *in = ctx->slots[s];
        const struct cfx_obj *o = in && !in->abandoned ? in->obj : NULL;
        if (!o || o->p2p || o->ephemeral || o->unrecorded || o->complete || o->deleting)
            continue;
        out[n].id = o->id;
        out[n].ready = CFX_MIN((uint64_t)o->ready_chunks * o->chunk_size, o->size);
        n++;
        if (n == max)
            ctx->report_slot = (s + 1) % CFX_XFER_SLOTS;
    }
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

void cfx__task_beat_fill(void *arg, struct cfx_msg_heartbeat *hb)
{
    struct cfx_context *ctx = arg;
    hb->nprogress = CFX_MIN(cfx__task_progress_fill(ctx, hb->progress, CFX_CTL_PROGRESS_MAX),
                            CFX_CTL_PROGRESS_MAX);
    /* the CFX_CTL_PEERS_MAX pairs with the most bytes, by selection (64 at most) */
    unsigned used = __atomic_load_n(&ctx->npeer_bytes, __ATOMIC_ACQUIRE);
    struct cfx_ctl_peer_traffic all[CFX_PEER_BYTES_MAX];
    bool taken[CFX_PEER_BYTES_MAX] = { false };
    for (unsigned i = 0; i < used; i++)
        if (!cfx__peer_bytes_read(ctx, i, &all[i]))
            taken[i] = true; /* changing hands: left out of this beat */
    hb->npeers = 0;
    while (hb->npeers < CFX_CTL_PEERS_MAX) {
        int best = -1;
        for (unsigned i = 0; i < used; i++)
            if (!taken[i] && all[i].tp < CFX_LOAD_TPS_MAX &&
                (best < 0 || all[i].tx_bytes + all[i].rx_bytes >
                                 all[best].tx_bytes + all[best].rx_bytes))
                best = (int)i;
        if (best < 0)
            break;
        taken[best] = true;
        hb->peers[hb->npeers++] = all[best];
    }
    cfx__ps_load_beat(ctx, &hb->ps);
}

void cfx__task_on_reconnected(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    pthread_mutex_lock(&rt->mu);
    if (rt->nfns && rt->nthreads) {
        rt->rereg = true;
        pthread_cond_signal(&rt->cond);
    }
    pthread_mutex_unlock(&rt->mu);
}

/* ---- runners ------------------------------------------------------------------ */

static int send_reg(struct cfx_context *ctx, const char *name)
{
    struct cfx_task_rt *rt = ctx->tasks;
    struct cfx_msg m = { .type = CFX_MSG_TASK_REG };
    char what[96];

    snprintf(m.u.task_reg.name, sizeof(m.u.task_reg.name), "%s", name);
    m.u.task_reg.cores = rt->cores;
    m.u.task_reg.gpus = rt->gpus;
    m.u.task_reg.memory = rt->memory;
    snprintf(what, sizeof(what), "registration of task '%s'", name);
    return cfx__ctl_request(ctx->ctl, &m, cfx__deadline_ns(ctx->cfg.timeout_ms), what,
                            CFX_MSG_OK, NULL, NULL);
}

/* A runner: register again after a restart. */
static void rereg_all(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    char names[CFX_TASK_FNS_MAX][CFX_TASK_NAME_MAX + 1];
    unsigned n;

    pthread_mutex_lock(&rt->mu);
    n = rt->nfns;
    for (unsigned i = 0; i < n; i++)
        memcpy(names[i], rt->fns[i].name, sizeof(names[i]));
    pthread_mutex_unlock(&rt->mu);
    for (unsigned i = 0; i < n; i++) {
        int rc = send_reg(ctx, names[i]);
        if (rc != CFX_OK && rc != CFX_ERR_EXISTS)
            CFX_LOG(WARN, CTL, "node %u: cannot register task '%s' again: %s", ctx->node_id,
                    names[i], cfx_last_error());
    }
}

/* Every result of the task is held here (put by it). */
static int results_here(struct cfx_context *ctx, const struct cfx_msg_task *t, unsigned *missing)
{
    int ok = 1;
    pthread_mutex_lock(&ctx->lock);
    for (unsigned i = 0; i < t->nresults && ok; i++) {
        struct cfx_obj *o = cfx__store_find(&ctx->store, &t->results[i]);
        if (!o || !o->complete || !o->owned) {
            *missing = i;
            ok = 0;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    return ok;
}

static void run_job(struct cfx_context *ctx, struct task_job *j)
{
    struct cfx_task_rt *rt = ctx->tasks;
    struct task_fn_ent ent = { .fn = NULL };
    unsigned missing = 0;
    int rc;

    pthread_mutex_lock(&rt->mu);
    for (unsigned i = 0; i < rt->nfns; i++)
        if (!strcmp(rt->fns[i].name, j->t.name))
            ent = rt->fns[i];
    bool moved = j->moved;
    pthread_mutex_unlock(&rt->mu);

    cfx__err_clear();
    if (moved) { /* moved before it started (task_keep.c): not run at all */
        rc = cfx__err(CFX_ERR_CANCELED, "%s", j->moved_text);
    } else if (!ent.fn) {
        rc = cfx__err(CFX_ERR_NOT_FOUND, "node %u offers no function '%s'", ctx->node_id,
                      j->t.name);
    } else {
        struct cfx_task_call call = {
            .ctx = ctx,
            .task_id = j->t.task_id,
            .name = j->t.name,
            .inputs = j->t.inputs,
            .n_inputs = j->t.ninputs,
            .results = j->t.results,
            .n_results = j->t.nresults,
            .arg = j->t.arg_len ? j->arg : NULL,
            .arg_len = j->t.arg_len,
            .timeout_ms = cfx__ms_left(j->deadline_ns),
        };
        CFX_LOG(DEBUG, CTL, "node %u: running task %llu ('%s')", ctx->node_id,
                (unsigned long long)j->t.task_id, j->t.name);
        rc = ent.fn(&call, ent.arg);
        if (rc > 0)
            rc = cfx__err(CFX_ERR_INVALID, "task function '%s' returned %d, not a status",
                          j->t.name, rc);
        if (rc == CFX_OK && !results_here(ctx, &j->t, &missing)) {
            char hex[CFX_OBJECT_ID_HEX_LEN];
            cfx_object_id_to_hex(&j->t.results[missing], hex);
            rc = cfx__err(CFX_ERR_INVALID, "task function '%s' returned CFX_OK without "
                          "putting its result %u (%s)", j->t.name, missing, hex);
        }
        /* past the task's deadline its waiter was told CFX_ERR_TIMEOUT: the
         * end says so too, also to a coordinator that restarted since (a
         * re-announced CFX_OK would list it as done) */
        if (rc == CFX_OK && j->deadline_ns != UINT64_MAX && cfx__now_ns() > j->deadline_ns)
            rc = cfx__err(CFX_ERR_TIMEOUT, "it ended past its deadline"); /* named below */
    }
    pthread_mutex_lock(&ctx->lock);
    bool closing = cfx__ctx_closing(ctx);
    pthread_mutex_unlock(&ctx->lock);
    if (closing) {
        /* the node leaves: the coordinator places its tasks again */
        CFX_LOG(INFO, CTL, "node %u: task %llu ('%s') cut short: the context is being "
                "destroyed", ctx->node_id, (unsigned long long)j->t.task_id, j->t.name);
        return;
    }
    char text[CFX_PROTO_TEXT_MAX] = "";
    uint64_t alias[TASK_ALIAS_MAX];
    unsigned nalias;
    if (rc != CFX_OK && cfx_last_error()[0])
        snprintf(text, sizeof(text), "task %llu ('%s') on node %u: %s",
                 (unsigned long long)j->t.task_id, j->t.name, ctx->node_id, cfx_last_error());
    else if (rc != CFX_OK) /* the function returned a status without a failed call's text */
        snprintf(text, sizeof(text), "task %llu ('%s') on node %u: the function returned %s (%s)",
                 (unsigned long long)j->t.task_id, j->t.name, ctx->node_id, cfx_errname(rc),
                 cfx_strerror(rc));
    /* remembered before the report: a report lost with the coordinator is
     * sent again after the reconnection (task_keep.c); not a run that is no
     * longer the task's (re-announced after a restart, its end could pass
     * for the task's): its end is reported once, which frees its cores at
     * the coordinator and counts for nothing else */
    pthread_mutex_lock(&rt->mu);
    moved = j->moved;
    if (!moved)
        cfx__task_ended_add(rt, j, rc, text);
    nalias = j->nalias;
    memcpy(alias, j->alias, sizeof(alias));
    pthread_mutex_unlock(&rt->mu);
    if (moved)
        CFX_LOG(INFO, CTL, "node %u: task %llu ('%s') ended here (%s), but this run was not "
                "the task's any more: %s", ctx->node_id, (unsigned long long)j->t.task_id,
                j->t.name, cfx_errname(rc), j->moved_text);
    cfx__task_report(ctx, &j->t, alias, nalias, rc, text);
}

static void *runner(void *arg)
{
    struct cfx_context *ctx = arg;
    struct cfx_task_rt *rt = ctx->tasks;

    pthread_mutex_lock(&rt->mu);
    while (!rt->stop) {
        if (rt->rereg) {
            rt->rereg = false;
            pthread_mutex_unlock(&rt->mu);
            rereg_all(ctx);
            cfx__task_announce(ctx);
            pthread_mutex_lock(&rt->mu);
            continue;
        }
        if (cfx_list_empty(&rt->jobs)) {
            pthread_cond_wait(&rt->cond, &rt->mu);
            continue;
        }
        struct task_job *j = cfx_list_entry(rt->jobs.next, struct task_job, link);
        cfx_list_del(&j->link);
        cfx_list_add_tail(&j->link, &rt->running);
        __atomic_add_fetch(&rt->running_n, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&rt->mu);
        run_job(ctx, j);
        pthread_mutex_lock(&rt->mu);
        cfx_list_del(&j->link);
        free(j);
        __atomic_sub_fetch(&rt->running_n, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&rt->mu);
    return NULL;
}

/* rt->mu held: start the runners once. */
static int start_runners(struct cfx_context *ctx)
{
    struct cfx_task_rt *rt = ctx->tasks;
    if (rt->nthreads)
        return CFX_OK;
    /* out of range: the nearest bound, with a warning (README, "Environment") */
    long long want = cfx__env_ll_clamp("CFX_TASK_THREADS", TASK_THREADS_DEFAULT, 1,
                                       TASK_THREADS_MAX);
    /* what a worker remembers of the tasks it ended (task_keep.c) */
    if (!rt->ended && !(rt->ended = calloc(TASK_ENDED_KEEP, sizeof(*rt->ended))))
        return cfx__err(CFX_ERR_NOMEM, "node %u: no memory for the task runner",
                        ctx->node_id);
    for (long long i = 0; i < want; i++) {
        int e = pthread_create(&rt->threads[rt->nthreads], NULL, runner, ctx);
        if (e) {
            if (rt->nthreads)
                break; /* fewer runners still run tasks */
            return cfx__err(CFX_ERR_NO_RESOURCE, "node %u: cannot start a task runner: %s",
                            ctx->node_id, strerror(e));
        }
        pthread_setname_np(rt->threads[rt->nthreads], "cfx-task");
        rt->nthreads++;
    }
    return CFX_OK;
}

/* ---- API ---------------------------------------------------------------------- */

static int name_check(const char *name, const char *what)
{
    if (!name || !*name || strlen(name) > CFX_TASK_NAME_MAX)
        return cfx__err(CFX_ERR_INVALID, "%s: the function name must be 1..%d bytes", what,
                        CFX_TASK_NAME_MAX);
    if (!strncmp(name, CFX_TASK_RESERVED, strlen(CFX_TASK_RESERVED)))
        return cfx__err(CFX_ERR_INVALID, "%s: names starting with '%s' are the library's "
                        "('%s')", what, CFX_TASK_RESERVED, name);
    return CFX_OK;
}

/* Add @p name to the table (fn NULL: offered for placement only, never run
 * here) and register it with the coordinator.  @p quiet_exists: a second
 * offer of the name is CFX_OK. */
static int task_add(struct cfx_context *ctx, const char *name, cfx_task_fn fn, void *arg,
                    bool quiet_exists)
{
    struct cfx_task_rt *rt = ctx->tasks;
    int rc;

    pthread_mutex_lock(&rt->mu);
    for (unsigned i = 0; i < rt->nfns; i++) {
        if (!strcmp(rt->fns[i].name, name)) {
            pthread_mutex_unlock(&rt->mu);
            return quiet_exists ? CFX_OK
                                : cfx__err(CFX_ERR_EXISTS, "node %u registered the function "
                                           "'%s' already", ctx->node_id, name);
        }
    }
    if (rt->nfns >= CFX_TASK_FNS_MAX) {
        pthread_mutex_unlock(&rt->mu);
        return cfx__err(CFX_ERR_NO_RESOURCE, "node %u registered %d functions, the most one "
                        "context may", ctx->node_id, CFX_TASK_FNS_MAX);
    }
    /* runners also register the functions again after a coordinator restart */
    rc = start_runners(ctx);
    if (rc != CFX_OK) {
        pthread_mutex_unlock(&rt->mu);
        return rc;
    }
    struct task_fn_ent *e = &rt->fns[rt->nfns++];
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->fn = fn;
    e->arg = arg;
    pthread_mutex_unlock(&rt->mu);

    /* the table has it first: a task placed here at once finds it */
    rc = send_reg(ctx, name);
    if (rc != CFX_OK) {
        pthread_mutex_lock(&rt->mu);
        for (unsigned i = 0; i < rt->nfns; i++) {
            if (!strcmp(rt->fns[i].name, name)) {
                rt->fns[i] = rt->fns[--rt->nfns];
                break;
            }
        }
        pthread_mutex_unlock(&rt->mu);
    }
    return rc;
}

int cfx__task_offer(struct cfx_context *ctx, const char *name)
{
    return task_add(ctx, name, NULL, NULL, true);
}

int cfx_task_register(struct cfx_context *ctx, const char *name, cfx_task_fn fn, void *arg)
{
    int rc;

    cfx__err_clear();
    if (!ctx || !fn)
        return cfx__err(CFX_ERR_INVALID, "cfx_task_register: NULL %s", !ctx ? "context" : "fn");
    rc = name_check(name, "cfx_task_register");
    if (rc != CFX_OK)
        return rc;
    rc = cfx__ctx_enter(ctx, "cfx_task_register");
    if (rc != CFX_OK)
        return rc;
    return cfx__ctx_leave(ctx, task_add(ctx, name, fn, arg, false));
}

/* The wire form of a task from the API's arguments. */
static int task_msg(const char *what, const char *name, const struct cfx_object_id *inputs,
                    size_t n_inputs, const struct cfx_object_id *results, size_t n_results,
                    const struct cfx_task_needs *needs, struct cfx_msg_task *t)
{
    uint64_t f = needs ? needs->field_mask : 0;

    int rc = cfx__mask_check(f, CFX_TASK_NEEDS_ALL, what, "cfx_task_needs.field_mask");
    if (rc != CFX_OK)
        return rc;
    if (n_inputs > CFX_TASK_IO_MAX || n_results > CFX_TASK_IO_MAX)
        return cfx__err(CFX_ERR_INVALID, "%s: %zu inputs and %zu results (at most %d each)",
                        what, n_inputs, n_results, CFX_TASK_IO_MAX);
    if ((n_inputs && !inputs) || (n_results && !results))
        return cfx__err(CFX_ERR_INVALID, "%s: %zu %s at NULL", what,
                        n_inputs && !inputs ? n_inputs : n_results,
                        n_inputs && !inputs ? "inputs" : "results");
    snprintf(t->name, sizeof(t->name), "%s", name ? name : "");
    t->cores = (f & CFX_TASK_NEEDS_CORES) ? needs->cores : 1;
    t->memory = (f & CFX_TASK_NEEDS_MEMORY) ? needs->memory : 0;
    t->gpus = (f & CFX_TASK_NEEDS_GPUS) ? needs->gpus : 0;
    if (f & CFX_TASK_NEEDS_NODES) {
        if (needs->n_nodes && !needs->nodes)
            return cfx__err(CFX_ERR_INVALID, "%s: a node set of %zu nodes with no node list",
                            what, needs->n_nodes);
        if (needs->n_nodes > CFX_TASK_NODES_MAX)
            return cfx__err(CFX_ERR_INVALID, "%s: a node set of %zu nodes (at most %d)", what,
                            needs->n_nodes, CFX_TASK_NODES_MAX);
        t->nnodes = (uint8_t)needs->n_nodes;
        for (size_t i = 0; i < needs->n_nodes; i++)
            t->nodes[i] = needs->nodes[i];
    }
    if ((f & CFX_TASK_NEEDS_POLICY) && needs->policy == CFX_TASK_PACK)
        t->flags |= CFX_PROTO_TASK_PACK;
    else if ((f & CFX_TASK_NEEDS_POLICY) && needs->policy != CFX_TASK_SPREAD)
        return cfx__err(CFX_ERR_INVALID, "%s: unknown policy %d", what, (int)needs->policy);
    if ((f & CFX_TASK_NEEDS_GROUP) && needs->group) {
        if (strlen(needs->group) > CFX_TASK_GROUP_MAX)
            return cfx__err(CFX_ERR_INVALID, "%s: group name over %d bytes", what,
                            CFX_TASK_GROUP_MAX);
        snprintf(t->group, sizeof(t->group), "%s", needs->group);
    }
    if (f & CFX_TASK_NEEDS_RESERVE) {
        /* set means meant: 0 or less was taken for 1 ms without a word */
        if (needs->reserve_ms < 1 || needs->reserve_ms > CFX_TASK_RESERVE_MAX_MS)
            return cfx__err(CFX_ERR_INVALID, "%s: reserve_ms %d is outside 1..%d", what,
                            needs->reserve_ms, CFX_TASK_RESERVE_MAX_MS);
        t->reserve_ms = (uint32_t)needs->reserve_ms;
    }
    t->ninputs = (uint8_t)n_inputs;
    for (size_t i = 0; i < n_inputs; i++)
        t->inputs[i] = inputs[i];
    t->nresults = (uint8_t)n_results;
    for (size_t i = 0; i < n_results; i++)
        t->results[i] = results[i];
    return CFX_OK;
}

int cfx_task_submit(struct cfx_context *ctx, const char *name,
                            const struct cfx_object_id *inputs, size_t n_inputs,
                            const struct cfx_object_id *results, size_t n_results,
                            const struct cfx_task_needs *needs,
                            const struct cfx_task_params *params, struct cfx_task **out)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_SUBMIT }, reply;
    void *frame = NULL;
    char what[96];
    int rc;

    cfx__err_clear();
    if (out)
        *out = NULL;
    if (!ctx)
        return cfx__err(CFX_ERR_INVALID, "cfx_task_submit: NULL context");
    rc = cfx__mask_check(params ? params->field_mask : 0, CFX_TASK_PARAM_ALL, "cfx_task_submit",
                         "cfx_task_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    rc = name_check(name, "cfx_task_submit");
    if (rc != CFX_OK)
        return rc;
    if (!n_results)
        return cfx__err(CFX_ERR_INVALID, "cfx_task_submit: a task puts at least one result");
    rc = task_msg("cfx_task_submit", name, inputs, n_inputs, results, n_results, needs, &m.u.task);
    if (rc != CFX_OK)
        return rc;
    int timeout_ms = params && (params->field_mask & CFX_TASK_PARAM_TIMEOUT)
                         ? params->timeout_ms : ctx->cfg.timeout_ms;
    m.u.task.timeout_ms = timeout_ms < 0 ? CFX_PROTO_TIMEOUT_NONE : (uint32_t)timeout_ms;
    if (params && (params->field_mask & CFX_TASK_PARAM_ARG) && params->arg_len) {
        if (!params->arg)
            return cfx__err(CFX_ERR_INVALID, "cfx_task_submit: argument of %zu bytes at NULL",
                            params->arg_len);
        if (params->arg_len > CFX_TASK_ARG_MAX)
            return cfx__err(CFX_ERR_INVALID, "cfx_task_submit: argument of %zu bytes (at most "
                            "%d)", params->arg_len, CFX_TASK_ARG_MAX);
        m.u.task.arg = params->arg;
        m.u.task.arg_len = (uint16_t)params->arg_len;
    }
    m.u.task.key = cfx__task_key(ctx->tasks);
    uint64_t task_dl = timeout_ms < 0 ? UINT64_MAX : cfx__deadline_ns(timeout_ms);
    struct cfx_task *task = out ? calloc(1, sizeof(*task) + m.u.task.arg_len) : NULL;
    if (out && !task)
        return cfx__err(CFX_ERR_NOMEM, "cfx_task_submit: no memory");
    rc = cfx__ctx_enter(ctx, "cfx_task_submit");
    if (rc != CFX_OK) {
        free(task);
        return rc;
    }
    snprintf(what, sizeof(what), "submission of task '%s'", name);
    /* sent again after a lost connection with CFX_PROTO_TASK_AGAIN and the
     * same key: the coordinator runs it once (control/client.c); answered
     * within the context's deadline, and the task's when that is sooner */
    uint64_t req_dl = cfx__deadline_ns(ctx->cfg.timeout_ms);
    rc = cfx__ctl_request(ctx->ctl, &m, task_dl < req_dl ? task_dl : req_dl, what,
                          CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK && task) {
        task->ctx = ctx;
        task->id = reply.u.task_st.task_id;
        task->node = reply.u.task_st.node_id;
        task->deadline_ns = task_dl;
        task->t = m.u.task;
        task->t.flags &= (uint8_t)~CFX_PROTO_TASK_AGAIN;
        if (m.u.task.arg_len)
            memcpy(task->arg, m.u.task.arg, m.u.task.arg_len);
        task->t.arg = task->arg;
        *out = task;
        task = NULL;
    }
    free(frame);
    free(task);
    return cfx__ctx_leave(ctx, rc);
}

/* One TASK_WAIT for what is left until @p wait_dl (UINT64_MAX: forever). */
static int wait_once(struct cfx_task *task, uint64_t wait_dl, int timeout_ms,
                     struct cfx_msg *reply, void **frame)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_WAIT };
    char what[64];
    int left = wait_dl == UINT64_MAX ? -1 : cfx__ms_left(wait_dl);

    m.u.task_st.task_id = task->id;
    m.u.task_st.timeout_ms = wait_dl == UINT64_MAX ? CFX_PROTO_TIMEOUT_NONE
                             : timeout_ms == 0 || left <= 0 ? 0 : (uint32_t)left;
    snprintf(what, sizeof(what), "wait for task %llu", (unsigned long long)task->id);
    /* the coordinator answers by the timeout; the margin covers the round trip */
    return cfx__ctl_request(task->ctx->ctl, &m,
                            wait_dl == UINT64_MAX ? UINT64_MAX
                                                  : wait_dl + CFX_PROTO_WAIT_MARGIN_MS * 1000000ull,
                            what, CFX_MSG_TASK_REPLY, reply, frame);
}

int cfx_task_wait(struct cfx_task *task, int timeout_ms, uint32_t *node_out)
{
    struct cfx_msg reply;
    void *frame = NULL;
    int rc;

    cfx__err_clear();
    if (!task)
        return cfx__err(CFX_ERR_INVALID, "cfx_task_wait: NULL task");
    /* a wait that ends with no answer (interrupted, the coordinator away)
     * says where the task was last known to be; an answer overwrites it */
    if (node_out)
        *node_out = task->node;
    uint64_t wait_dl = timeout_ms < 0 ? UINT64_MAX : cfx__deadline_ns(timeout_ms);
    /* The task's own deadline bounds the wait: by then the coordinator has
     * ended it for its waiters (CFX_ERR_TIMEOUT), so waiting longer only
     * waits on a coordinator that is gone.  The margin lets its answer
     * come; a wait begun after that still asks it once. */
    bool by_task = false;
    if (task->deadline_ns != UINT64_MAX) {
        uint64_t now = cfx__now_ns();
        uint64_t bound = (task->deadline_ns > now ? task->deadline_ns : now) +
                         CFX_PROTO_WAIT_MARGIN_MS * 1000000ull;
        if (bound < wait_dl) {
            wait_dl = bound;
            by_task = true;
        }
    }
    rc = cfx__ctx_enter(task->ctx, "cfx_task_wait");
    if (rc != CFX_OK)
        return rc;
    cfx__intr_begin();
    rc = wait_once(task, wait_dl, timeout_ms, &reply, &frame);
    /* unknown: the coordinator restarted and nobody re-announced it yet;
     * the same key again, which the coordinator runs at most once */
    for (int again = 0; rc == CFX_ERR_NOT_FOUND && !task->ended && again < TASK_RESUBMIT_MAX;
         again++) {
        rc = cfx__task_resubmit(task, wait_dl);
        if (rc == CFX_OK)
            rc = wait_once(task, wait_dl, timeout_ms, &reply, &frame);
    }
    cfx__intr_end();
    /* a request of this wait outlived the wait's own timeout (a repeat
     * sent once that had passed, as by a poll, is not waited for): the
     * task goes on.  CFX_ERR_TIMEOUT would say the task's deadline passed */
    if (rc == CFX_ERR_TIMEOUT && by_task)
        rc = cfx__err(CFX_ERR_TIMEOUT, "task %llu: its deadline passed with no answer from "
                      "the coordinator (%s)", (unsigned long long)task->id, cfx_last_error());
    else if (rc == CFX_ERR_TIMEOUT && wait_dl != UINT64_MAX && cfx__now_ns() >= wait_dl)
        rc = cfx__err(CFX_ERR_AGAIN, "task %llu has not ended after %d ms (%s)",
                      (unsigned long long)task->id, timeout_ms, cfx_last_error());
    if (rc == CFX_OK) {
        cfx__err_clear(); /* what the first wait said of an unknown task */
        if (node_out)
            *node_out = reply.u.task_st.node_id;
        task->node = reply.u.task_st.node_id ? reply.u.task_st.node_id : task->node;
        rc = reply.u.task_st.status;
        task->ended = rc != CFX_ERR_AGAIN;
        if (rc == CFX_ERR_AGAIN && by_task)
            cfx__err(rc, "task %llu has not ended by its deadline", (unsigned long long)task->id);
        else if (rc == CFX_ERR_AGAIN)
            cfx__err(rc, "task %llu has not ended after %d ms", (unsigned long long)task->id,
                     timeout_ms);
        else if (rc != CFX_OK)
            cfx__err(rc, "%s", reply.u.task_st.text);
    }
    free(frame);
    /* not through cfx__ctx_leave's rewrite of the status: a task's own
     * failure is the answer, not this call's */
    int left = cfx__ctx_leave(task->ctx, CFX_OK);
    return rc != CFX_OK ? rc : left;
}

uint64_t cfx_task_id(const struct cfx_task *task)
{
    return task ? task->id : 0;
}

uint32_t cfx_task_node(const struct cfx_task *task)
{
    return task ? task->node : 0;
}

void cfx_task_free(struct cfx_task *task)
{
    free(task);
}

int cfx_place(struct cfx_context *ctx, const char *name,
                      const struct cfx_task_needs *needs, const struct cfx_object_id *inputs,
                      size_t n_inputs, uint32_t *out_node)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_PLACE }, reply;
    void *frame = NULL;
    int rc;

    cfx__err_clear();
    if (!ctx || !out_node)
        return cfx__err(CFX_ERR_INVALID, "cfx_place: NULL %s", !ctx ? "context" : "out_node");
    /* a query may name the library's own offers (cfx_ps_add_server_auto) */
    if (name && (!*name || strlen(name) > CFX_TASK_NAME_MAX))
        return cfx__err(CFX_ERR_INVALID, "cfx_place: the function name must be 1..%d bytes",
                        CFX_TASK_NAME_MAX);
    rc = task_msg("cfx_place", name, inputs, n_inputs, NULL, 0, needs, &m.u.task);
    if (rc != CFX_OK)
        return rc;
    rc = cfx__ctx_enter(ctx, "cfx_place");
    if (rc != CFX_OK)
        return rc;
    rc = cfx__ctl_request(ctx->ctl, &m, cfx__deadline_ns(ctx->cfg.timeout_ms),
                          "placement query", CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK)
        *out_node = reply.u.task_st.node_id;
    free(frame);
    return cfx__ctx_leave(ctx, rc);
}

/* The run of @p call is no longer its task's (see task_keep.c): its result
 * puts fail at once, naming the task and where it went. */
static int moved_check(const struct cfx_task_call *call, size_t index)
{
    struct cfx_task_rt *rt = call->ctx->tasks;
    char text[CFX_PROTO_TEXT_MAX] = "";
    struct cfx_list *pos;

    pthread_mutex_lock(&rt->mu);
    cfx_list_for_each(pos, &rt->running) {
        struct task_job *j = cfx_list_entry(pos, struct task_job, link);
        if (j->moved && j->t.task_id == call->task_id && j->t.results == call->results) {
            memcpy(text, j->moved_text, sizeof(text));
            break;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    if (!text[0])
        return CFX_OK;
    return cfx__err(CFX_ERR_CANCELED, "cfx_task_result_put: result %zu of task %llu ('%s') is "
                    "refused: %s", index, (unsigned long long)call->task_id, call->name, text);
}

int cfx_task_result_put(const struct cfx_task_call *call, size_t index,
                                const void *buf, size_t size)
{
    void *copy = NULL;
    int rc;

    cfx__err_clear();
    if (!call || index >= call->n_results || (size && !buf))
        return cfx__err(CFX_ERR_INVALID, "cfx_task_result_put: result %zu of %zu%s", index,
                        call ? call->n_results : 0, size && !buf ? ", NULL buffer" : "");
    rc = moved_check(call, index);
    if (rc != CFX_OK)
        return rc;
    if (size) {
        rc = cfx_buf_alloc(call->ctx, size, &copy);
        if (rc != CFX_OK)
            return rc;
        memcpy(copy, buf, size);
    }
    rc = cfx__put_arena(call->ctx, &call->results[index], copy, size);
    if (rc != CFX_OK && copy)
        cfx_buf_free(call->ctx, copy);
    return rc;
}

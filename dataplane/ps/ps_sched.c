/*
 * Scheduler role (runs inside server 0): owns the shard map, publishes each
 * version as an immutable small object "ps/<job>/map/<version>", turns
 * workers' load reports into per-server service times, and decides when and
 * where blocks move (ps_balance.c).  It also admits joining servers, drains
 * removed ones and answers admin requests ("ps/<job>/admin/<n>").
 *
 * Measurement window.  Reports carry the oldest map version the worker still
 * has requests under; reports older than the window's map version are
 * dropped, so a window never mixes two assignments.  A decision needs at
 * least interval_ms of data, a report from every worker still in the job and
 * traffic to every server that owns blocks and serves them (a failed one's
 * blocks get none, nor do blocks whose values were lost with one: they are
 * out of the measurement).
 *
 * Retiring.  A removed server is DRAINING once a map moves its blocks away;
 * it becomes RETIRED when every worker reports that it has no request left
 * under an older map, so nothing can reach it any more, and every server
 * that owns blocks under the current map reports (SETTLED) that it holds
 * their states (a failed one is not waited for: its states went with it),
 * so nothing from it is still on its way: the retirement makes
 * every server stop listening to it, and it ends.
 *
 * The end of the job.  When every worker has said goodbye (or failed) the
 * scheduler publishes a map flagged PS_MAP_SHUTDOWN.  The notice of a map
 * that ends a server's service (shutdown, or its retirement) says so in its
 * header, and the server answers it with DONE once it has the map.  The
 * scheduler keeps a retired server's mailbox open until that answer.  Its
 * own server finishes at the shutdown (cfx_ps_serve returns), but the
 * scheduler leaves (cfx_ps_destroy) only once every other server has
 * answered or failed, or the handle's timeout has passed since it started
 * to leave; then it names the servers it left behind.  It tells the ones
 * that have not answered that it is leaving (LEAVE): at the end of a job
 * that changes nothing for them, before it they have lost the scheduler.
 */
#include "ps_int.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum ps_ev_type { PS_EV_JOIN = 1, PS_EV_ADMIN };

struct ps_ev {
    struct ps_ev *next;
    enum ps_ev_type type;
    uint32_t n; /* JOIN: server index; ADMIN: sequence */
    bool bad;   /* the object was no record of its kind: answered (admin) or skipped */
    struct ps_member member;
    struct ps_admin_req req;
};

struct ps_sched {
    uint64_t admin_nonce;       /* the admin request being answered (loop thread) */
    /* measurement window (loop thread) */
    uint64_t win_start;
    uint32_t win_version;
    double busy[PS_MAX_SERVERS];
    double bytes[PS_MAX_SERVERS];
    uint32_t reports[PS_MAX_WORKERS];
    double est[PS_MAX_SERVERS]; /* ns per byte; 0 unknown */
    uint64_t stragglers;
    uint32_t worker_ver[PS_MAX_WORKERS]; /* oldest map version in use */
    bool bye[PS_MAX_WORKERS];
    uint32_t nbye;
    uint32_t drain_version[PS_MAX_SERVERS];
    uint32_t settled[PS_MAX_SERVERS]; /* latest map under which it holds all its blocks */
    bool auto_on;
    bool srv_done[PS_MAX_SERVERS];  /* confirmed its end (DONE) or failed */
    uint8_t gone[PS_MAX_SERVERS];   /* its mailbox failed before its end: no blocks for it */
    bool removed[PS_MAX_SERVERS];   /* FAILED and removed: decisions move its blocks away */
    bool failed_news;               /* a server marked FAILED in ps->map, not yet published */
    bool told_end[PS_MAX_SERVERS];  /* was sent the notice that ends its service */
    uint64_t leave_deadline;        /* leaving: 0 not yet */
    /* a change is in ps->map but its publish failed (the coordinator out,
     * say): published again from the tick, backing off, until it lands */
    uint64_t republish_at;          /* 0: nothing to publish again */
    uint32_t republish_ms;

    /* API <-> loop (ps->lock) */
    bool leaving;          /* cfx_ps_destroy started to leave */
    bool left;             /* every server answered, failed or was given up */

    /* watcher -> loop (ps->lock) */
    struct ps_ev *events;
    uint32_t watch_server; /* next server index to look for */
    uint32_t watch_admin;  /* next admin request to look for */

    pthread_t join_thread, admin_thread;
    bool join_started, admin_started;
};

/* Cumulate the window into the published map's server entries. */
static void stamp_estimates(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    for (uint32_t i = 0; i < ps->map.nservers; i++) {
        ps->map.server[i].ns_per_byte = s->est[i];
        ps->map.server[i].straggler = !!(s->stragglers & (1ull << i));
    }
}

static void window_reset(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    s->win_start = cfx__now_ns();
    s->win_version = ps->map.version;
    memset(s->busy, 0, sizeof(s->busy));
    memset(s->bytes, 0, sizeof(s->bytes));
    memset(s->reports, 0, sizeof(s->reports));
}

/* Tell every member (retiring servers included) that a new map exists. */
static void notify(struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    struct ps_hdr h = { .type = PS_MSG_MAP };
    for (uint32_t i = 0; i < m->nworkers; i++) {
        if (ps->sched->bye[i])
            continue;
        struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_WORKER, i), m->worker_node[i]);
        if (p && !p->closed)
            cfx__ps_send(ps, p, &h, NULL, 0, NULL);
    }
    for (uint32_t i = 1; i < m->nservers; i++) {
        if (ps->sched->told_end[i] || ps->sched->srv_done[i])
            continue; /* it knows it is done: nothing later concerns it */
        struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_SERVER, i), m->server[i].node_id);
        bool end = (m->flags & PS_MAP_SHUTDOWN) || m->server[i].state == CFX_PS_SERVER_RETIRED;
        h.clock = end ? PS_NOTICE_END : 0;
        if (p && !p->closed && cfx__ps_send(ps, p, &h, NULL, 0, NULL) == CFX_OK)
            ps->sched->told_end[i] = end;
    }
}

int cfx__ps_sched_publish(struct cfx_ps *ps)
{
    struct ps_map next;
    cfx__ps_map_init(&next);
    stamp_estimates(ps);
    int rc = cfx__ps_map_copy(&next, &ps->map);
    if (rc != CFX_OK)
        return rc;
    next.version = ps->map.version + 1;
    next.admin_next = ps->sched->watch_admin;
    void *buf = malloc(PS_MAP_MAX);
    if (!buf) {
        cfx__ps_map_free(&next);
        return CFX_ERR_NOMEM;
    }
    int len = cfx__ps_map_encode(&next, buf, PS_MAP_MAX);
    if (len < 0) {
        CFX_LOG(ERR, PS, "job %s: shard map %u does not fit in %u bytes (%u blocks)", ps->job,
                next.version, PS_MAP_MAX, next.nblocks);
        free(buf);
        cfx__ps_map_free(&next);
        return len;
    }
    struct cfx_object_id id;
    cfx__ps_obj_id(ps->job, "map", next.version, 0, &id);
    rc = cfx__ps_publish(ps, &id, buf, (size_t)len);
    if (rc != CFX_OK) {
        struct ps_sched *s = ps->sched;
        s->republish_ms = CFX_MIN(CFX_MAX(s->republish_ms * 2, 100u), 5000u);
        s->republish_at = cfx__deadline_ns((int)s->republish_ms);
        if (s->republish_ms == 100) /* the first failure; the retries quietly */
            CFX_LOG(ERR, PS, "job %s: cannot publish shard map %u: %s; trying again", ps->job,
                    next.version, cfx_last_error());
        free(buf);
        cfx__ps_map_free(&next);
        return rc;
    }
    if (ps->sched->republish_ms > 100)
        CFX_LOG(INFO, PS, "job %s: shard map %u published after all", ps->job, next.version);
    ps->sched->republish_at = 0;
    ps->sched->republish_ms = 0;
    ps->sched->failed_news = false;
    pthread_mutex_lock(&ps->lock);
    struct ps_map old = ps->map;
    ps->map = next;
    ps->map_applied = next.version;
    cfx__ps_map_stats(&ps->map, &ps->stats);
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_map_free(&old);
    CFX_LOG(INFO, PS, "job %s: published shard map %u", ps->job, ps->map.version);
    notify(ps);
    cfx__ps_after_map(ps);
    return CFX_OK;
}

/*
 * Startup.  The scheduler waits for every initial member's announcement,
 * workers first, then servers, each until the one deadline of create.  A
 * member may die meanwhile (the job cannot start: a server's blocks would
 * be lost, a worker's pushes never come): one read already is checked
 * between slices of the wait, and one that announced itself and died
 * before it was read took its announcement with it, which the slice's end
 * says (cfx__ps_went_dead).  Either ends the startup at once with
 * CFX_ERR_PEER_FAILED naming it, where the scheduler waited out its
 * deadline ("did not join") or started the job with a dead server.  When
 * the startup fails, the members that announced themselves hear why
 * (PS_MSG_ABORT), instead of waiting out their own deadline to be listed.
 */

/* A member read at startup whose node has gone since: CFX_ERR_PEER_FAILED. */
static int start_alive(struct cfx_ps *ps, const int nread[2])
{
    const struct ps_map *m = &ps->map;
    for (int r = 0; r < 2; r++)
        for (int i = r; i < nread[r]; i++) { /* server 0 is this one */
            uint32_t node = r ? m->server[i].node_id : m->worker_node[i];
            pthread_mutex_lock(&ps->ctx->lock);
            int gone = cfx__node_gone(ps->ctx, node);
            pthread_mutex_unlock(&ps->ctx->lock);
            if (gone)
                return cfx__err(CFX_ERR_PEER_FAILED, "job %s: %s %d (node %u) %s before the job "
                                "started", ps->job, r ? "server" : "worker", i, node,
                                gone == CFX_NODE_DEAD ? "died" : "left");
        }
    return CFX_OK;
}

/* Servers past the initial ones that announced themselves: an index
 * skipped among the initial servers shows as one of them. */
static int start_skipped(struct cfx_ps *ps)
{
    int first = ps->params.num_servers, n = PS_MAX_SERVERS - first;
    struct cfx_object_id ids[PS_MAX_SERVERS];
    bool present[PS_MAX_SERVERS];
    for (int i = 0; i < n; i++)
        cfx__ps_obj_id(ps->job, "server", first + i, 0, &ids[i]);
    if (n <= 0 || cfx__ps_probe(ps->ctx, ids, (size_t)n, cfx__deadline_ns(2000), present))
        return -1;
    for (int i = 0; i < n; i++)
        if (present[i])
            return first + i;
    return -1;
}

/* The startup failed with @p rc (the thread's error says why): every member
 * that announced itself and is alive hears it; returns @p rc, the error kept. */
static int start_failed(struct cfx_ps *ps, int rc)
{
    char why[CFX__ERR_TEXT_MAX], job[sizeof(ps->job) + 8];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    /* the members name the job themselves */
    size_t jl = (size_t)snprintf(job, sizeof(job), "job %s: ", ps->job);
    const char *reason = strncmp(why, job, jl) ? why : why + jl;
    int nw = ps->params.num_workers, n = nw + PS_MAX_SERVERS - 1;
    struct cfx_object_id *ids = calloc((size_t)n, sizeof(*ids));
    bool *present = calloc((size_t)n, sizeof(*present));
    for (int i = 0; ids && present && i < n; i++)
        cfx__ps_obj_id(ps->job, i < nw ? "worker" : "server", i < nw ? i : i - nw + 1, 0,
                       &ids[i]);
    if (!ids || !present || cfx__ps_probe(ps->ctx, ids, (size_t)n, cfx__deadline_ns(2000),
                                          present) != CFX_OK)
        n = 0;
    for (int i = 0; i < n; i++) {
        struct ps_member mem;
        size_t sz = 0;
        if (!present[i] || cfx__ps_get(ps->ctx, &ids[i], &mem, sizeof(mem), &sz, 1000) ||
            sz != sizeof(mem) || mem.magic != PS_MAGIC)
            continue;
        pthread_mutex_lock(&ps->ctx->lock);
        int gone = cfx__node_gone(ps->ctx, mem.node_id);
        pthread_mutex_unlock(&ps->ctx->lock);
        uint32_t id = i < nw ? PS_ID(CFX_PS_WORKER, i) : PS_ID(CFX_PS_SERVER, i - nw + 1);
        struct ps_peer *p = gone ? NULL : cfx__ps_peer(ps, id, mem.node_id);
        char *text = p ? malloc(CFX__ERR_TEXT_MAX) : NULL;
        if (!text)
            continue;
        int len = snprintf(text, CFX__ERR_TEXT_MAX, "the scheduler (server 0, node %u) gave "
                           "up: %s", ps->ctx->node_id, reason);
        len = CFX_MIN(len, CFX__ERR_TEXT_MAX - 1);
        struct ps_hdr h = { .type = PS_MSG_ABORT, .status = rc };
        cfx__ps_send(ps, p, &h, text, (size_t)len + 1, text); /* the teardown lets it go out */
    }
    free(ids);
    free(present);
    return cfx__err(rc, "%s", why);
}

int cfx__ps_sched_create(struct cfx_ps *ps)
{
    struct ps_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return cfx__err(CFX_ERR_NOMEM, "job %s: out of memory", ps->job);
    ps->sched = s;
    s->auto_on = ps->params.balance.enabled != 0;
    const struct cfx_ps_params *p = &ps->params;
    uint64_t deadline = ps->create_dl;

    /* wait for every initial member's announcement */
    struct ps_map *m = &ps->map;
    cfx__ps_map_init(m);
    m->conf.consistency = p->consistency;
    m->conf.staleness = (uint32_t)p->staleness;
    m->conf.block_size = p->block_size;
    m->conf.optim = p->optim;
    m->nworkers = (uint32_t)p->num_workers;
    m->nservers = (uint32_t)p->num_servers;
    int nread[2] = { 0, 0 };
    for (int r = 0; r < 2; r++) {
        int n = r ? p->num_servers : p->num_workers;
        for (int i = 0; i < n; i++) {
            struct cfx_object_id id;
            struct ps_member mem;
            size_t sz = 0;
            char why[CFX__ERR_TEXT_MAX] = "";
            const char *role = r ? "server" : "worker";
            cfx__ps_obj_id(ps->job, role, i, 0, &id);
            int rc;
            for (;;) {
                uint32_t dead;
                rc = cfx__ps_announce_slice(ps->ctx, &id, &mem, sizeof(mem), &sz, deadline,
                                            why, &dead);
                if (dead)
                    return start_failed(ps, cfx__err(CFX_ERR_PEER_FAILED, "job %s: %s %d "
                                                     "(node %u) died before the job started: "
                                                     "its announcement went with it", ps->job,
                                                     role, i, dead));
                if (rc != CFX_ERR_TIMEOUT)
                    break;
                if ((rc = start_alive(ps, nread)) != CFX_OK)
                    return start_failed(ps, rc);
                rc = CFX_ERR_TIMEOUT;
                if (cfx__now_ns() >= deadline)
                    break;
            }
            if (rc != CFX_OK || sz != sizeof(mem) || mem.magic != PS_MAGIC) {
                /* a server missing while one past the initial ones came:
                 * the servers' indices skip one (say so, not just "late") */
                int past = r && rc == CFX_ERR_TIMEOUT ? start_skipped(ps) : -1;
                char hint[200] = "";
                if (past >= 0)
                    snprintf(hint, sizeof(hint), "; server %d did, past the job's %d initial "
                             "servers: initial servers take indices 0..%d, none skipped",
                             past, p->num_servers, p->num_servers - 1);
                const char *went = cfx__ps_went_clause(why);
                return start_failed(ps, cfx__err(rc == CFX_OK ? CFX_ERR_PROTO : rc,
                                                 "job %s: %s %d did not join within %d ms "
                                                 "(%s)%s%s%s", ps->job, role, i,
                                                 ps->timeout_ms, cfx_strerror(rc), hint,
                                                 *went ? " " : "", went));
            }
            if (r) {
                m->server[i].node_id = mem.node_id;
                m->server[i].state = CFX_PS_SERVER_ACTIVE;
            } else {
                m->worker_node[i] = mem.node_id;
            }
            nread[r] = i + 1;
        }
    }
    int rc = start_alive(ps, nread);
    if (rc != CFX_OK)
        return start_failed(ps, rc);
    s->watch_server = (uint32_t)p->num_servers;
    s->watch_admin = 1;
    m->version = 0;
    rc = cfx__ps_sched_publish(ps);
    if (rc != CFX_OK)
        return cfx__err(rc, "job %s: cannot publish the first shard map: %s", ps->job,
                        cfx_strerror(rc));
    window_reset(ps);
    CFX_LOG(INFO, PS, "job %s: scheduler up: %d workers, %d servers", ps->job, p->num_workers,
            p->num_servers);
    return CFX_OK;
}

void cfx__ps_sched_free(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    if (!s)
        return;
    while (s->events) {
        struct ps_ev *e = s->events;
        s->events = e->next;
        free(e);
    }
    free(s);
    ps->sched = NULL;
}

/* ---- decisions ---------------------------------------------------------------------- */

static bool all_ready(const struct ps_map *m)
{
    for (uint32_t t = 0; t < m->ntensors; t++)
        if (!m->tensors[t].ready)
            return false;
    return true;
}

/*
 * The blocks a decision moved off a FAILED server (removed after it
 * failed) are marked lost in the map (@p was: the owners before): their
 * values went with it, and the mark goes with them wherever they move, so
 * that every owner knows it from the map alone, whichever versions it saw,
 * and decisions keep them out of the measurement.  The servers' own rule
 * (ps_server.c: an owner before that is FAILED in the map) says the same
 * of these blocks.
 */
static void mark_lost(struct ps_map *m, const uint16_t *was)
{
    for (uint32_t b = 0; b < m->nblocks; b++) {
        if (was[b] == m->owner[b] || was[b] >= m->nservers || (m->lost && m->lost[b]) ||
            m->server[was[b]].state != CFX_PS_SERVER_FAILED)
            continue;
        if (!m->lost)
            m->lost = calloc(m->nblocks, 1);
        if (!m->lost)
            return; /* its owner's own rule still marks it (a map that skipped none) */
        m->lost[b] = (uint8_t)(was[b] + 1);
    }
}

/* Run the algorithm on ps->map; publish when blocks move.  Returns moves. */
static int decide(struct cfx_ps *ps, bool force, const char *why)
{
    struct ps_sched *s = ps->sched;
    struct ps_map *m = &ps->map;
    uint32_t state[PS_MAX_SERVERS];
    uint64_t *bytes = calloc(m->nblocks + 1, sizeof(*bytes));
    uint8_t *movable = calloc(m->nblocks + 1, 1);
    uint16_t *was = malloc((m->nblocks + 1) * sizeof(*was));
    if (!bytes || !movable || !was) {
        free(bytes);
        free(movable);
        free(was);
        return CFX_ERR_NOMEM;
    }
    if (m->nblocks)
        memcpy(was, m->owner, m->nblocks * sizeof(*was));
    for (uint32_t i = 0; i < m->nservers; i++)
        state[i] = m->server[i].state == CFX_PS_SERVER_FAILED && s->removed[i]
                       ? CFX_PS_SERVER_DRAINING /* its blocks move, as any removed one's */
                       : m->server[i].state;
    for (uint32_t b = 0; b < m->nblocks; b++) {
        uint32_t t = 0;
        cfx__ps_map_block(m, b, &t, NULL, NULL);
        bytes[b] = cfx__ps_map_block_bytes(m, b);
        movable[b] = m->tensors[t].ready != 0;
    }
    struct ps_balance_in in = {
        .nservers = m->nservers,
        .state = state,
        .ns_per_byte = s->est,
        .nblocks = m->nblocks,
        .bytes = bytes,
        .movable = movable,
        .gone = s->gone,
        .lost = m->lost,
        .knobs = &ps->params.balance,
        .force = force,
    };
    struct ps_balance_out out;
    uint16_t *owner = m->owner;
    int rc = m->nblocks ? cfx__ps_balance(&in, owner, &out) : CFX_OK;
    free(bytes);
    free(movable);
    if (rc == CFX_OK && m->nblocks)
        mark_lost(m, was);
    free(was);
    if (rc != CFX_OK || !m->nblocks)
        return rc;
    s->stragglers = out.stragglers;
    for (uint32_t i = 0; i < m->nservers; i++)
        if (out.stragglers & (1ull << i))
            CFX_LOG(INFO, PS, "job %s: server %u is a straggler: %.3f ns/B", ps->job, i, s->est[i]);
    if (!out.moves)
        return 0;
    CFX_LOG(INFO, PS, "job %s: %s: moving %u blocks, predicted step %.0f -> %.0f us", ps->job, why,
            out.moves, out.cur_max / 1e3, out.new_max / 1e3);
    rc = cfx__ps_sched_publish(ps);
    if (rc != CFX_OK)
        return rc;
    ps->stats.rebalances++;
    window_reset(ps);
    return (int)out.moves;
}

static void estimate(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    for (uint32_t i = 0; i < ps->map.nservers; i++)
        if (s->bytes[i] > 0)
            s->est[i] = s->busy[i] / s->bytes[i];
}

/* A decision's data: interval_ms of it, a report from every worker still in
 * the job, and traffic to every server that owns blocks and serves them.  A
 * failed server's blocks get none, ever, nor do blocks whose values were
 * lost (their requests fail): waiting for them stopped every later
 * decision, and the survivors' blocks no longer followed their speed. */
static bool window_full(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    const struct ps_map *m = &ps->map;
    if (cfx__now_ns() - s->win_start < (uint64_t)ps->params.balance.interval_ms * 1000000ull)
        return false;
    for (uint32_t w = 0; w < m->nworkers; w++)
        if (!s->bye[w] && !s->reports[w])
            return false;
    uint32_t state[PS_MAX_SERVERS];
    for (uint32_t i = 0; i < m->nservers; i++)
        state[i] = m->server[i].state;
    struct ps_balance_in in = { .nservers = m->nservers, .state = state, .gone = s->gone,
                                .nblocks = m->nblocks, .lost = m->lost };
    return cfx__ps_balance_unmeasured(&in, m->owner, s->bytes) < 0;
}

/* ---- admin requests and joins ------------------------------------------------------- */

static void admin_reply(struct cfx_ps *ps, uint32_t n, int status, const char *detail)
{
    struct ps_admin_rep *rep = calloc(1, sizeof(*rep));
    if (!rep) {
        CFX_LOG(WARN, PS, "job %s: cannot answer admin request %u: out of memory", ps->job, n);
        return;
    }
    rep->magic = PS_MAGIC;
    rep->status = status;
    rep->version = ps->map.version;
    rep->nonce = ps->sched->admin_nonce; /* whose answer this is */
    snprintf(rep->detail, sizeof(rep->detail), "%s", detail ? detail : "");
    struct cfx_object_id id;
    cfx__ps_obj_id(ps->job, "admin-reply", n, 0, &id);
    int rc = cfx__ps_publish(ps, &id, rep, sizeof(*rep));
    if (rc != CFX_OK) {
        CFX_LOG(WARN, PS, "job %s: cannot answer admin request %u: %s", ps->job, n,
                cfx_strerror(rc));
        free(rep);
    }
}

static void admin(struct cfx_ps *ps, uint32_t n, const struct ps_admin_req *req)
{
    struct ps_sched *s = ps->sched;
    struct ps_map *m = &ps->map;
    char why[96];
    int idx = req->arg;
    switch (req->cmd) {
    case PS_ADMIN_ADD:
        if (idx < 0 || (uint32_t)idx >= m->nservers) {
            snprintf(why, sizeof(why), "server %d has not joined the job", idx);
            admin_reply(ps, n, CFX_ERR_NOT_FOUND, why);
            return;
        }
        if (s->gone[idx]) {
            /* blocks handed to it would lose their state on the way */
            snprintf(why, sizeof(why), "server %d (node %u) is gone", idx,
                     m->server[idx].node_id);
            admin_reply(ps, n, CFX_ERR_PEER_FAILED, why);
            return;
        }
        if (m->server[idx].state == CFX_PS_SERVER_ACTIVE) {
            admin_reply(ps, n, CFX_OK, "already active");
            return;
        }
        if (m->server[idx].state != CFX_PS_SERVER_STANDBY) {
            snprintf(why, sizeof(why), "server %d was removed", idx);
            admin_reply(ps, n, CFX_ERR_INVALID, why);
            return;
        }
        m->server[idx].state = CFX_PS_SERVER_ACTIVE;
        snprintf(why, sizeof(why), "server %d added", idx);
        if (decide(ps, true, why) <= 0)
            cfx__ps_sched_publish(ps);
        admin_reply(ps, n, CFX_OK, why);
        return;
    case PS_ADMIN_REMOVE: {
        if (idx == 0) {
            admin_reply(ps, n, CFX_ERR_BUSY, "server 0 runs the scheduler and cannot be removed");
            return;
        }
        if (idx < 0 || (uint32_t)idx >= m->nservers) {
            snprintf(why, sizeof(why), "no server %d in the job", idx);
            admin_reply(ps, n, CFX_ERR_NOT_FOUND, why);
            return;
        }
        bool failed = m->server[idx].state == CFX_PS_SERVER_FAILED;
        if (m->server[idx].state == CFX_PS_SERVER_DRAINING ||
            m->server[idx].state == CFX_PS_SERVER_RETIRED || (failed && s->removed[idx])) {
            admin_reply(ps, n, CFX_OK, "already removed");
            return;
        }
        if (!all_ready(m)) {
            admin_reply(ps, n, CFX_ERR_AGAIN, "tensors are still being registered");
            return;
        }
        uint32_t active = 0;
        for (uint32_t i = 0; i < m->nservers; i++)
            active += m->server[i].state == CFX_PS_SERVER_ACTIVE;
        if (active <= 1 && m->server[idx].state == CFX_PS_SERVER_ACTIVE) {
            admin_reply(ps, n, CFX_ERR_INVALID, "it is the last active server");
            return;
        }
        /* a failed server's blocks move as a removed one's do, but its
         * state stays what happened to it: it does not drain, nor retire */
        if (failed)
            s->removed[idx] = true;
        else
            m->server[idx].state = CFX_PS_SERVER_DRAINING;
        snprintf(why, sizeof(why), "server %d removed%s", idx, failed ? " (it had failed)" : "");
        if (decide(ps, true, why) <= 0)
            cfx__ps_sched_publish(ps);
        s->drain_version[idx] = m->version;
        admin_reply(ps, n, CFX_OK, why);
        return;
    }
    case PS_ADMIN_REBALANCE: {
        estimate(ps);
        int moved = decide(ps, true, "rebalance requested");
        snprintf(why, sizeof(why), "%d blocks moved", moved < 0 ? 0 : moved);
        admin_reply(ps, n, moved < 0 ? moved : CFX_OK, why);
        return;
    }
    case PS_ADMIN_AUTO:
        s->auto_on = idx != 0;
        window_reset(ps);
        admin_reply(ps, n, CFX_OK,
                    s->auto_on ? "automatic rebalancing on" : "automatic rebalancing off");
        return;
    default: admin_reply(ps, n, CFX_ERR_INVALID, "unknown command");
    }
}

static void join(struct cfx_ps *ps, uint32_t idx, const struct ps_member *mem)
{
    struct ps_map *m = &ps->map;
    if (idx != m->nservers || idx >= PS_MAX_SERVERS)
        return;
    m->server[idx].node_id = mem->node_id;
    m->server[idx].state = mem->standby ? CFX_PS_SERVER_STANDBY : CFX_PS_SERVER_ACTIVE;
    m->server[idx].ns_per_byte = 0;
    m->nservers++;
    ps->sched->est[idx] = 0;
    char why[64];
    snprintf(why, sizeof(why), "server %u joined", idx);
    CFX_LOG(INFO, PS, "job %s: %s (node %u)%s", ps->job, why, mem->node_id,
            mem->standby ? ", standby" : "");
    if (mem->standby || decide(ps, true, why) <= 0)
        cfx__ps_sched_publish(ps);
}

/*
 * Watcher threads: one waits for the next server to announce itself, the
 * other for the next admin request.  Each blocks in a lookup that ends
 * when the object appears or after PS_WATCH_SLICE_MS, so an idle job costs
 * the coordinator one lookup per second per watcher;
 * cfx__ps_sched_stop() wakes them by putting the objects they wait for
 * (or, with no coordinator to put them, they see the stop within a slice).
 */
static void queue_event(struct cfx_ps *ps, struct ps_ev *e)
{
    struct ps_sched *s = ps->sched;
    pthread_mutex_lock(&ps->lock);
    struct ps_ev **tail = &s->events;
    while (*tail)
        tail = &(*tail)->next;
    *tail = e;
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_kick(ps);
}

#define PS_WATCH_SLICE_MS 1000 /* a watcher's lookup, then it looks at ps->stop again */

/*
 * A watcher waits (in lookups of PS_WATCH_SLICE_MS; woken at shutdown by the
 * object it waits for, or by the end of a slice) for the next small object of a numbered series in the
 * directory — server announcements, admin requests — and turns each into a
 * scheduler event.
 */
struct watch {
    const char *kind;           /* "server" or "admin" */
    int type;                   /* PS_EV_JOIN / PS_EV_ADMIN */
    uint32_t *next;             /* s->watch_server / s->watch_admin */
    uint32_t limit;             /* stop at this index */
    size_t off, len;            /* where the object lands in struct ps_ev */
};

static void watch_series(struct cfx_ps *ps, const struct watch *w)
{
    for (;;) {
        pthread_mutex_lock(&ps->lock);
        bool stop = ps->stop;
        uint32_t n = *w->next;
        pthread_mutex_unlock(&ps->lock);
        if (stop || n >= w->limit)
            break;
        struct ps_ev *e = calloc(1, sizeof(*e));
        if (!e)
            break;
        struct cfx_object_id id;
        size_t sz = 0;
        void *dst = (char *)e + w->off;
        cfx__ps_obj_id(ps->job, w->kind, n, 0, &id);
        /* in slices: a coordinator outage holds a lookup until the
         * deadline, and the stop must still be seen (the wake-up object
         * cannot be put without a coordinator) */
        int rc = cfx__ps_get(ps->ctx, &id, dst, w->len, &sz, PS_WATCH_SLICE_MS);
        uint32_t magic;
        memcpy(&magic, dst, sizeof(magic)); /* both records start with it */
        if (rc != CFX_OK) {
            free(e);
            if (rc != CFX_ERR_TIMEOUT && rc != CFX_ERR_CONNECT) {
                struct timespec ts = { 0, 100000000 };
                nanosleep(&ts, NULL);
            }
            continue; /* woken to stop, or nothing yet: look again */
        }
        /* an object of the name that is no such record: the stop's wake-up
         * (cfx__ps_sched_stop puts one), or else a member's bug or another
         * program's object, passed over rather than read again for ever (an
         * admin request is answered so, a join skipped) */
        e->bad = sz != w->len || magic != PS_MAGIC;
        if (e->bad) {
            pthread_mutex_lock(&ps->lock);
            stop = ps->stop;
            pthread_mutex_unlock(&ps->lock);
            if (stop) {
                free(e);
                break;
            }
            CFX_LOG(WARN, PS, "job %s: object %s/%u is no %s record (%zu bytes); passed over",
                    ps->job, w->kind, n, w->kind, sz);
        }
        e->type = w->type;
        e->n = n;
        pthread_mutex_lock(&ps->lock);
        (*w->next)++;
        pthread_mutex_unlock(&ps->lock);
        queue_event(ps, e);
    }
}

static void *watch_joins(void *arg)
{
    struct cfx_ps *ps = arg;
    struct watch w = { "server", PS_EV_JOIN, &ps->sched->watch_server, PS_MAX_SERVERS,
                       offsetof(struct ps_ev, member), sizeof(((struct ps_ev *)0)->member) };
    watch_series(ps, &w);
    return NULL;
}

static void *watch_admin(void *arg)
{
    struct cfx_ps *ps = arg;
    struct watch w = { "admin", PS_EV_ADMIN, &ps->sched->watch_admin, UINT32_MAX,
                       offsetof(struct ps_ev, req), sizeof(((struct ps_ev *)0)->req) };
    watch_series(ps, &w);
    return NULL;
}

int cfx__ps_sched_start(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    if (pthread_create(&s->join_thread, NULL, watch_joins, ps))
        return CFX_ERR_NOMEM;
    s->join_started = true;
    pthread_setname_np(s->join_thread, "cfx-ps-joins");
    if (pthread_create(&s->admin_thread, NULL, watch_admin, ps))
        return CFX_ERR_NOMEM;
    s->admin_started = true;
    pthread_setname_np(s->admin_thread, "cfx-ps-admin");
    return CFX_OK;
}

/* ps->stop is set: wake the watchers with the objects they wait for. */
void cfx__ps_sched_stop(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    if (!s)
        return;
    static const struct ps_member wake_m; /* magic 0: not a member */
    static const struct ps_admin_req wake_a;
    struct cfx_object_id jid, aid;
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 1000 };
    pthread_mutex_lock(&ps->lock);
    cfx__ps_obj_id(ps->job, "server", s->watch_server, 0, &jid);
    cfx__ps_obj_id(ps->job, "admin", s->watch_admin, 0, &aid);
    pthread_mutex_unlock(&ps->lock);
    /* the wake-ups only save a watcher the rest of its slice: a second at
     * most each, not the context's 30 s deadline when the coordinator is
     * gone (a destroy then took a minute) */
    bool jput = s->join_started &&
                cfx_put(ps->ctx, &jid, &wake_m, sizeof(wake_m), &op) == CFX_OK;
    bool aput = s->admin_started &&
                cfx_put(ps->ctx, &aid, &wake_a, sizeof(wake_a), &op) == CFX_OK;
    if (s->join_started)
        pthread_join(s->join_thread, NULL);
    if (s->admin_started)
        pthread_join(s->admin_thread, NULL);
    s->join_started = s->admin_started = false;
    if (jput)
        cfx_delete(ps->ctx, &jid, &op);
    if (aput)
        cfx_delete(ps->ctx, &aid, &op);
}

/*
 * Server @p i is gone before its end, as the scheduler just learned: it
 * takes no block (gone[]), and unless it was retired or the job is over
 * (its going is then no failure), the map names it FAILED, published
 * from this loop pass's tick, so every reader (members, rdmactl ps shards)
 * sees which server went and that its blocks are not served; they stayed
 * "active" until some later change.  Server 0 runs this.
 */
static void sched_failed(struct cfx_ps *ps, uint32_t i)
{
    struct ps_sched *s = ps->sched;
    struct ps_server_ent *e = &ps->map.server[i];
    s->gone[i] = 1;
    if (e->state == CFX_PS_SERVER_RETIRED || e->state == CFX_PS_SERVER_FAILED ||
        (ps->map.flags & PS_MAP_SHUTDOWN) || s->leave_deadline)
        return;
    uint32_t nb = 0;
    cfx__ps_map_load(&ps->map, i, &nb, NULL);
    CFX_LOG(WARN, PS, "job %s: server %u (node %u) failed; the next shard map says so (%u "
            "blocks on it not served)", ps->job, i, e->node_id, nb);
    s->removed[i] = e->state == CFX_PS_SERVER_DRAINING; /* what it still owns moves on */
    e->state = CFX_PS_SERVER_FAILED;
    s->failed_news = true;
}

/*
 * Servers whose node this context heard declared dead (or gone) count as
 * gone now, before their mailbox reports it (the loop polls it later): the
 * scheduler's record of the deaths it knows of, for where blocks may go.
 */
static void sched_note_dead(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    const struct ps_map *m = &ps->map;
    for (uint32_t i = 1; i < m->nservers; i++) {
        if (s->gone[i] || m->server[i].state == CFX_PS_SERVER_RETIRED)
            continue;
        pthread_mutex_lock(&ps->ctx->lock);
        int gone = cfx__node_gone(ps->ctx, m->server[i].node_id);
        pthread_mutex_unlock(&ps->ctx->lock);
        if (!gone)
            continue;
        CFX_LOG(WARN, PS, "job %s: server %u (node %u) %s: it takes no more blocks", ps->job, i,
                m->server[i].node_id, gone == CFX_NODE_DEAD ? "died" : "left");
        sched_failed(ps, i);
    }
}

/* ---- messages from workers ------------------------------------------------------------ */

void cfx__ps_sched_handle(struct cfx_ps *ps, struct ps_peer *from, const struct ps_hdr *h,
                          void *payload)
{
    struct ps_sched *s = ps->sched;
    struct ps_map *m = &ps->map;
    uint32_t w = h->from & 0xffff;
    if (h->type == PS_MSG_DONE && (h->from >> 16) == CFX_PS_SERVER && w > 0 && w < m->nservers) {
        if (!s->srv_done[w])
            CFX_LOG(INFO, PS, "job %s: server %u (node %u) confirmed the end of its service (map %u)",
                    ps->job, w, from->rec.node_id, h->map_version);
        s->srv_done[w] = true;
        cfx__ps_peer_down(ps, from); /* nothing more comes from it */
        return;
    }
    if (h->type == PS_MSG_SETTLED && (h->from >> 16) == CFX_PS_SERVER && w > 0 &&
        w < m->nservers) {
        s->settled[w] = CFX_MAX(s->settled[w], (uint32_t)h->clock);
        return;
    }
    if ((h->from >> 16) != CFX_PS_WORKER || w >= m->nworkers)
        return;
    switch (h->type) {
    case PS_MSG_REGISTER: {
        struct ps_tensor t;
        if (h->len != sizeof(t))
            return;
        memcpy(&t, payload, sizeof(t));
        t.name[sizeof(t.name) - 1] = '\0';
        /* no block for a server seen gone: it would never be initialized,
         * the tensor never ready, and every worker's register would wait
         * out its deadline (server 0, this one, is always live and active) */
        if (cfx__ps_map_find(m, t.name) < 0)
            sched_note_dead(ps);
        int rc = cfx__ps_map_add_tensor(m, t.name, (enum cfx_dtype)t.dtype, t.count, s->gone);
        if (rc == CFX_ERR_EXISTS)
            return; /* the worker compares what the map says */
        if (rc < 0) {
            CFX_LOG(ERR, PS, "job %s: cannot register tensor %s (%" PRIu64 " elements): %s",
                    ps->job, t.name, t.count, cfx_strerror(rc));
            return;
        }
        cfx__ps_sched_publish(ps);
        return;
    }
    case PS_MSG_READY:
        if (h->block < m->ntensors && !m->tensors[h->block].ready) {
            m->tensors[h->block].ready = 1;
            cfx__ps_sched_publish(ps);
        }
        return;
    case PS_MSG_REPORT: {
        s->worker_ver[w] = (uint32_t)h->clock;
        if (h->clock < s->win_version)
            return; /* measured (partly) under an older assignment */
        size_t n = h->len / sizeof(struct ps_report_ent);
        const struct ps_report_ent *r = payload;
        for (size_t i = 0; i < n; i++)
            if (r[i].server < m->nservers) {
                s->busy[r[i].server] += (double)r[i].busy_ns;
                s->bytes[r[i].server] += (double)r[i].bytes;
            }
        s->reports[w]++;
        return;
    }
    case PS_MSG_BYE:
        if (!s->bye[w]) {
            s->bye[w] = true;
            s->nbye++;
        }
        {
            struct ps_hdr ack = { .type = PS_MSG_BYE };
            cfx__ps_send(ps, from, &ack, NULL, 0, NULL);
        }
        cfx__ps_peer_down(ps, from);
        return;
    default: return;
    }
}

void cfx__ps_sched_server_gone(struct cfx_ps *ps, uint32_t srv, int status)
{
    struct ps_sched *s = ps->sched;
    if (srv == 0 || srv >= PS_MAX_SERVERS || s->srv_done[srv])
        return;
    struct ps_peer *p = ps->servers[srv];
    CFX_LOG(WARN, PS, "job %s: server %u (node %u) is gone before confirming its end: %s", ps->job,
            srv, p ? p->rec.node_id : 0, cfx_strerror(status));
    s->srv_done[srv] = true;
    if (srv < ps->map.nservers)
        sched_failed(ps, srv);
    else
        s->gone[srv] = 1;
}

bool cfx__ps_sched_awaits(const struct cfx_ps *ps, uint32_t srv)
{
    return ps->sched && srv > 0 && srv < PS_MAX_SERVERS && !ps->sched->srv_done[srv];
}

void cfx__ps_sched_worker_gone(struct cfx_ps *ps, uint32_t w)
{
    struct ps_sched *s = ps->sched;
    if (w >= PS_MAX_WORKERS || s->bye[w])
        return;
    CFX_LOG(WARN, PS, "job %s: worker %u left without saying goodbye; counting it as done", ps->job,
            w);
    s->bye[w] = true;
    s->nbye++;
}

/*
 * Whether every server that owns blocks under the current map holds their
 * state.  There is one copy of a block's state: once its owner under the
 * current map has it, no STATE for it travels any more, so none from a
 * draining server is lost when its retirement stops everyone listening.
 * A failed server is not asked: it never says so again, and its blocks'
 * states went with it (none travels to or from it); waiting for it kept
 * every draining server from retiring.
 */
static bool blocks_settled(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    const struct ps_map *m = &ps->map;
    if (!cfx__ps_server_settled(ps))
        return false;
    for (uint32_t i = 1; i < m->nservers; i++) {
        uint32_t nb = 0;
        cfx__ps_map_load(m, i, &nb, NULL);
        if (nb && s->settled[i] < m->version &&
            cfx__ps_balance_serves(m->server[i].state, s->gone[i]))
            return false;
    }
    return true;
}

/* ---- leaving ------------------------------------------------------------------------ */

/* Servers that have not confirmed their end: tell them we leave, once. */
static void send_leave(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    const struct ps_map *m = &ps->map;
    struct ps_hdr h = { .type = PS_MSG_LEAVE };
    for (uint32_t i = 1; i < m->nservers; i++) {
        if (s->srv_done[i])
            continue;
        struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_SERVER, i), m->server[i].node_id);
        if (!p || p->closed || cfx__ps_send(ps, p, &h, NULL, 0, NULL) != CFX_OK) {
            CFX_LOG(WARN, PS, "job %s: server %u (node %u) cannot be reached: counting it as done",
                    ps->job, i, m->server[i].node_id);
            s->srv_done[i] = true;
        }
    }
}

/* Loop side of cfx__ps_sched_leave(): returns events. */
static int leave_tick(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    const struct ps_map *m = &ps->map;
    pthread_mutex_lock(&ps->lock);
    bool leaving = s->leaving && !s->left;
    pthread_mutex_unlock(&ps->lock);
    if (!leaving)
        return 0;
    int n = 0;
    if (!s->leave_deadline) {
        s->leave_deadline = cfx__deadline_ns(ps->timeout_ms);
        send_leave(ps);
        n++;
    }
    /* before the end of the job nobody waits for us: the LEAVE tells them */
    bool all = true;
    if (m->flags & PS_MAP_SHUTDOWN)
        for (uint32_t i = 1; i < m->nservers; i++)
            all &= s->srv_done[i];
    if (!all && cfx__now_ns() >= s->leave_deadline) {
        for (uint32_t i = 1; i < m->nservers; i++)
            if (!s->srv_done[i])
                CFX_LOG(WARN, PS,
                        "job %s: server %u (node %u) did not confirm the end of the job within "
                        "%d ms: leaving without it",
                        ps->job, i, m->server[i].node_id, ps->timeout_ms);
        all = true;
    }
    if (!all)
        return n;
    pthread_mutex_lock(&ps->lock);
    s->left = true;
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    return n + 1;
}

void cfx__ps_sched_leave(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    /* the loop gives up at the handle's timeout; this bound is for a loop
     * that cannot run at all */
    int bound_ms = ps->timeout_ms > INT_MAX - 2000 ? INT_MAX : ps->timeout_ms + 2000;
    uint64_t dl = cfx__deadline_ns(bound_ms);
    pthread_mutex_lock(&ps->lock);
    s->leaving = true;
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_kick(ps);
    pthread_mutex_lock(&ps->lock);
    while (!s->left && cfx__cond_wait_until(&ps->cond, &ps->lock, dl))
        ;
    bool left = s->left;
    pthread_mutex_unlock(&ps->lock);
    if (!left)
        CFX_LOG(WARN, PS, "job %s: the scheduler's loop did not finish leaving within %d ms",
                ps->job, bound_ms);
}

int cfx__ps_sched_tick(struct cfx_ps *ps)
{
    struct ps_sched *s = ps->sched;
    int n = 0;
    pthread_mutex_lock(&ps->lock);
    struct ps_ev *ev = s->events;
    s->events = NULL;
    pthread_mutex_unlock(&ps->lock);
    while (ev) {
        struct ps_ev *next = ev->next;
        s->admin_nonce = ev->type == PS_EV_ADMIN && !ev->bad ? ev->req.nonce : 0;
        if (ev->bad && ev->type == PS_EV_ADMIN)
            admin_reply(ps, ev->n, CFX_ERR_PROTO, "the request object was malformed");
        else if (ev->type == PS_EV_JOIN && !ev->bad)
            join(ps, ev->n, &ev->member);
        else if (!ev->bad)
            admin(ps, ev->n, &ev->req);
        free(ev);
        ev = next;
        n++;
    }
    struct ps_map *m = &ps->map;
    if (s->republish_at && cfx__now_ns() >= s->republish_at)
        n += cfx__ps_sched_publish(ps) == CFX_OK;
    else if (s->failed_news && !s->republish_at)
        n += cfx__ps_sched_publish(ps) == CFX_OK; /* a failure seen: its map now */
    n += leave_tick(ps);
    if (s->nbye == m->nworkers && !(m->flags & PS_MAP_SHUTDOWN)) {
        m->flags |= PS_MAP_SHUTDOWN;
        CFX_LOG(INFO, PS, "job %s: every worker is done: shutting down", ps->job);
        cfx__ps_sched_publish(ps);
        return n + 1;
    }
    if (m->flags & PS_MAP_SHUTDOWN)
        return n; /* no retirements, no decisions: the job is over */
    /* retire drained servers nothing can reach any more */
    for (uint32_t i = 1; i < m->nservers; i++) {
        if (m->server[i].state != CFX_PS_SERVER_DRAINING)
            continue;
        bool clear = true;
        for (uint32_t w = 0; w < m->nworkers; w++)
            clear &= s->bye[w] || s->worker_ver[w] >= s->drain_version[i];
        uint32_t nb = 0;
        cfx__ps_map_load(m, i, &nb, NULL);
        if (!clear || nb || !blocks_settled(ps))
            continue;
        m->server[i].state = CFX_PS_SERVER_RETIRED;
        CFX_LOG(INFO, PS, "job %s: server %u drained and retired", ps->job, i);
        cfx__ps_sched_publish(ps);
        n++;
    }
    if (s->auto_on && window_full(ps)) {
        estimate(ps);
        int moved = decide(ps, false, "load distribution");
        if (moved <= 0)
            window_reset(ps);
        n++;
    }
    return n;
}

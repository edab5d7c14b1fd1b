/*
 * Parameter-server handles: creation and teardown, the loop and watcher
 * threads, map changes, and message dispatch to the roles.
 */
#include "ps_int.h"

#include "gpu/memtype.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dataplane/engine/engine.h"

#define PS_IDLE_MIN_NS 20000ull /* first idle sleep */
#define PS_IDLE_MAX_NS \
    5000000ull /* longest idle sleep: p2p progress and API calls
                                         wake the loop earlier */

static const char *role_name(const struct cfx_ps *ps)
{
    return ps->role == CFX_PS_SERVER ? "server" : "worker";
}

/* ---- map changes ----------------------------------------------------------------------- */

void cfx__ps_sync_peers(struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    if (ps->role == CFX_PS_SERVER)
        for (uint32_t i = 0; i < m->nworkers; i++) {
            struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_WORKER, i), m->worker_node[i]);
            if (p && !p->closed)
                cfx__ps_peer_up(ps, p);
        }
    for (uint32_t i = 0; i < m->nservers; i++) {
        if (ps->role == CFX_PS_SERVER && (int)i == ps->index)
            continue;
        struct ps_peer *cur = ps->servers[i];
        if (m->server[i].state == CFX_PS_SERVER_RETIRED) {
            /* the scheduler listens until it confirmed its end */
            if (cur && cur->up && !cfx__ps_sched_awaits(ps, i))
                cfx__ps_peer_down(ps, cur);
            continue;
        }
        struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_SERVER, i), m->server[i].node_id);
        if (p && !p->closed) {
            int rc = cfx__ps_peer_up(ps, p);
            if (rc != CFX_OK)
                CFX_LOG(WARN, PS, "job %s: cannot listen to server %u (node %u): %s", ps->job, i,
                        p->rec.node_id, cfx_strerror(rc));
        }
    }
}

void cfx__ps_after_map(struct cfx_ps *ps)
{
    cfx__ps_sync_peers(ps);
    if (ps->role == CFX_PS_SERVER) {
        cfx__ps_server_map_changed(ps);
        bool done = (ps->map.flags & PS_MAP_SHUTDOWN) ||
                    ((uint32_t)ps->index < ps->map.nservers &&
                     ps->map.server[ps->index].state == CFX_PS_SERVER_RETIRED);
        if (done)
            cfx__ps_server_end(ps);
    } else {
        cfx__ps_worker_map_changed(ps);
    }
}

void cfx__ps_server_end(struct cfx_ps *ps)
{
    pthread_mutex_lock(&ps->lock);
    bool was = ps->finished;
    ps->finished = true;
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    if (was || ps->sched)
        return;
    /* the scheduler does not leave before this answer */
    struct ps_peer *sch = ps->servers[0];
    struct ps_hdr h = { .type = PS_MSG_DONE };
    if (sch && !sch->closed && cfx__ps_send(ps, sch, &h, NULL, 0, NULL) == CFX_OK)
        CFX_LOG(INFO, PS, "job %s: server %d: end of service (map %u) confirmed to the scheduler",
                ps->job, ps->index, ps->map.version);
}

void cfx__ps_sched_lost(struct cfx_ps *ps, const char *how)
{
    struct ps_peer *sch = ps->servers[0];
    pthread_mutex_lock(&ps->lock);
    if (!ps->lost_status) {
        ps->lost_status = CFX_ERR_PEER_FAILED;
        snprintf(ps->lost_why, sizeof(ps->lost_why),
                 "job %s: %s %d: the scheduler (server 0, node %u) %s before the job ended",
                 ps->job, ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index,
                 sch ? sch->rec.node_id : 0, how);
        CFX_LOG(WARN, PS, "%s", ps->lost_why);
    }
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
}

void cfx__ps_start_aborted(struct cfx_ps *ps, int status, const char *why, size_t len)
{
    /* the peer's numbers: a status that is no failure is its error */
    int st = status < 0 && status > CFX_STATUS_LAST && status != CFX_ERR_AGAIN ? status
                                                                                : CFX_ERR_PROTO;
    /* the peer's text goes into errors and log lines: a byte outside
     * printable ASCII (a terminal's escape, a line break) becomes '?' */
    char text[CFX__ERR_TEXT_MAX];
    size_t n = why ? strnlen(why, CFX_MIN(len, sizeof(text) - 1)) : 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)why[i];
        text[i] = c < 0x20 || c > 0x7e ? '?' : (char)c;
    }
    text[n] = '\0';
    if (!n)
        snprintf(text, sizeof(text), "the scheduler (server 0) gave up");
    pthread_mutex_lock(&ps->lock);
    if (!ps->lost_status) {
        ps->lost_status = st;
        snprintf(ps->lost_why, sizeof(ps->lost_why), "job %s: %s %d: the job did not start: "
                 "%.*s", ps->job, role_name(ps), ps->index, (int)strlen(text), text);
        CFX_LOG(WARN, PS, "%s", ps->lost_why);
    }
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
}

int cfx__ps_lost_err(struct cfx_ps *ps)
{
    return ps->lost_status ? cfx__err(ps->lost_status, "%s", ps->lost_why) : CFX_OK;
}

int cfx__ps_map_fetch(struct cfx_ps *ps, uint32_t version)
{
    if (version <= ps->map.version)
        return CFX_OK;
    struct ps_map m;
    cfx__ps_map_init(&m);
    /* it was published before anyone could name it: this does not wait */
    int rc = cfx__ps_map_get(ps->ctx, ps->job, version, CFX_MIN(ps->timeout_ms, 5000), &m);
    if (rc != CFX_OK) {
        /* fetched again from the loop (cfx__ps_map_retry): a member left on
         * its old map would route to old owners, never migrate, never
         * settle, until some later map came */
        if (!ps->map_wanted)
            CFX_LOG(WARN, PS, "job %s: cannot fetch shard map %u: %s; trying again", ps->job,
                    version, cfx_last_error());
        ps->map_wanted = CFX_MAX(ps->map_wanted, version);
        ps->map_retry_ms = CFX_MIN(CFX_MAX(ps->map_retry_ms * 2, 100u), 2000u);
        ps->map_retry_at = cfx__deadline_ns((int)ps->map_retry_ms);
        return rc;
    }
    if (ps->map_wanted && ps->map_wanted <= m.version) {
        CFX_LOG(INFO, PS, "job %s: shard map %u fetched after all", ps->job, m.version);
        ps->map_wanted = 0;
        ps->map_retry_ms = 0;
    }
    pthread_mutex_lock(&ps->lock);
    struct ps_map old = ps->map;
    ps->map = m;
    ps->map_applied = m.version;
    cfx__ps_map_stats(&ps->map, &ps->stats);
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_map_free(&old);
    cfx__ps_after_map(ps);
    return CFX_OK;
}

int cfx__ps_map_retry(struct cfx_ps *ps)
{
    if (!ps->map_wanted || cfx__now_ns() < ps->map_retry_at)
        return 0;
    if (ps->map_wanted <= ps->map.version) { /* a newer one came meanwhile */
        ps->map_wanted = 0;
        ps->map_retry_ms = 0;
        return 0;
    }
    return cfx__ps_map_fetch(ps, ps->map_wanted) == CFX_OK;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

/* Test hook (CFX_PS_TEST_SKIP_FAILED_MAPS): a server deaf to the notice of
 * map @p version when it names a failed server and this one active (not
 * the job's end): it learns of it, or a newer one, from a request that
 * carries it, and fetches that directly, the versions between skipped. */
static bool skips_notice(struct cfx_ps *ps, uint32_t version)
{
    struct ps_map m;
    bool skip = false;
    cfx__ps_map_init(&m);
    if (version <= ps->map.version ||
        cfx__ps_map_get(ps->ctx, ps->job, version, CFX_MIN(ps->timeout_ms, 5000), &m) != CFX_OK)
        return false; /* as without the hook: the fetch tries again */
    if ((uint32_t)ps->index < m.nservers && !(m.flags & PS_MAP_SHUTDOWN) &&
        m.server[ps->index].state == CFX_PS_SERVER_ACTIVE)
        for (uint32_t s = 0; s < m.nservers; s++)
            skip |= m.server[s].state == CFX_PS_SERVER_FAILED;
    cfx__ps_map_free(&m);
    if (skip)
        CFX_LOG(WARN, PS, "job %s: server %d: test hook: the notice of map %u is not heeded",
                ps->job, ps->index, version);
    return skip;
}

void cfx__ps_deliver(struct cfx_ps *ps, struct ps_peer *from, const struct ps_hdr *h, void *payload,
                     bool owned)
{
    switch (h->type) {
    case PS_MSG_MAP:
        if (!ps->skip_failed_maps || !skips_notice(ps, h->map_version))
            cfx__ps_map_fetch(ps, h->map_version);
        /* the notice alone says the job is over for us, should the map
         * itself not come */
        if (ps->role == CFX_PS_SERVER && !ps->sched && (h->clock & PS_NOTICE_END))
            cfx__ps_server_end(ps);
        return;
    case PS_MSG_LEAVE:
        if (ps->role == CFX_PS_SERVER && !ps->sched && !ps->finished)
            cfx__ps_sched_lost(ps, "left");
        return;
    case PS_MSG_ABORT:
        /* before the first map only: then create still waits to be listed */
        if (!ps->sched && from->id == PS_ID(CFX_PS_SERVER, 0) && !ps->map.version) {
            cfx__ps_start_aborted(ps, h->status, payload, h->len);
            cfx__ps_peer_down(ps, from); /* it leaves: no goodbye waits for its answer */
        }
        break;
    case PS_MSG_DONE:
    case PS_MSG_SETTLED:
        if (ps->sched)
            cfx__ps_sched_handle(ps, from, h, payload);
        break;
    case PS_MSG_REQ:
    case PS_MSG_STATE:
        if (ps->role == CFX_PS_SERVER) {
            cfx__ps_server_handle(ps, h, payload, owned);
            return;
        }
        break;
    case PS_MSG_REPLY:
    case PS_MSG_REDIRECT:
    case PS_MSG_WAITING:
    worker:
        if (ps->role == CFX_PS_WORKER) {
            cfx__ps_worker_handle(ps, h, payload, owned);
            return;
        }
        break;
    case PS_MSG_REGISTER:
    case PS_MSG_READY:
    case PS_MSG_REPORT:
    case PS_MSG_BYE:
        if (ps->role == CFX_PS_WORKER)
            goto worker; /* the scheduler's answer */
        if (ps->sched) {
            cfx__ps_sched_handle(ps, from, h, payload);
            if (h->type == PS_MSG_BYE && ps->role == CFX_PS_SERVER) {
                /* nothing more comes from that worker */
            }
        } else if (h->type == PS_MSG_BYE) {
            cfx__ps_peer_down(ps, from);
        }
        break;
    default:
        CFX_LOG(WARN, PS, "job %s: message of unknown type %u from node %u", ps->job, h->type,
                from->rec.node_id);
        break;
    }
    if (owned)
        free(payload);
}

void cfx__ps_peer_failed(struct cfx_ps *ps, struct ps_peer *p, int status)
{
    bool worker = (p->id >> 16) == CFX_PS_WORKER;
    uint32_t idx = p->id & 0xffff;
    bool quiet = ps->stop || (ps->map.flags & PS_MAP_SHUTDOWN) || ps->finished;
    if (ps->sched && worker)
        cfx__ps_sched_worker_gone(ps, idx);
    if (ps->sched && !worker) {
        cfx__ps_sched_server_gone(ps, idx, status);
        quiet = true; /* said there */
    }
    if (!worker && idx == 0 && !ps->sched && !quiet) {
        /* a server's end or a worker's goodbye that came first ended it cleanly */
        bool bye_done = ps->role == CFX_PS_WORKER && cfx__ps_worker_said_bye(ps);
        if (!bye_done)
            cfx__ps_sched_lost(ps, "is gone");
        quiet = true;
    }
    if (!quiet && worker)
        CFX_LOG(INFO, PS, "job %s: worker %u (node %u) is gone: %s", ps->job, idx, p->rec.node_id,
                cfx_strerror(status));
    else if (!quiet)
        CFX_LOG(WARN, PS, "job %s: server %u (node %u) is gone: %s", ps->job, idx, p->rec.node_id,
                cfx_strerror(status));
    cfx__ps_peer_down(ps, p);
    if (!worker && ps->role == CFX_PS_SERVER)
        cfx__ps_server_peer_gone(ps, idx);
    if (worker && ps->role == CFX_PS_SERVER && status == CFX_ERR_PEER_FAILED)
        cfx__ps_server_worker_gone(ps, idx);
    if (!worker && ps->role == CFX_PS_WORKER)
        cfx__ps_worker_server_failed(ps, idx, status);
}

/* ---- threads ------------------------------------------------------------------------------ */

static void *loop_main(void *arg)
{
    struct cfx_ps *ps = arg;
    uint64_t idle = PS_IDLE_MIN_NS;
    for (;;) {
        pthread_mutex_lock(&ps->lock);
        bool stop = ps->stop;
        pthread_mutex_unlock(&ps->lock);
        if (stop)
            break;
        int n = cfx__ps_net_poll(ps) + cfx__ps_map_retry(ps);
        if (ps->role == CFX_PS_WORKER)
            n += cfx__ps_worker_tick(ps);
        else
            n += cfx__ps_server_tick(ps);
        if (ps->sched)
            n += cfx__ps_sched_tick(ps);
        if (n) {
            idle = PS_IDLE_MIN_NS;
            continue;
        }
        /* sleep until the engine makes progress (or an API call kicks us) */
        pthread_mutex_lock(&ps->ctx->lock);
        cfx__obj_wait(ps->ctx, cfx__now_ns() + idle);
        pthread_mutex_unlock(&ps->ctx->lock);
        idle = CFX_MIN(idle * 2, PS_IDLE_MAX_NS);
    }
    return NULL;
}

/* ---- creation ---------------------------------------------------------------------------- */

static int env_int(const char *name, int def)
{
    return (int)cfx__env_ll(name, def);
}

/* $CFX_PS_ROLE: worker (the default) or server, as a word or the enum's
 * number; anything else is no role (validate() names the variable), not a
 * worker that then waits for a scheduler it should have been. */
static enum cfx_ps_role env_role(void)
{
    const char *r = cfx__env_str("CFX_PS_ROLE", "worker");
    if (!strcasecmp(r, "worker") || !strcmp(r, "0"))
        return CFX_PS_WORKER;
    if (!strcasecmp(r, "server") || !strcmp(r, "1"))
        return CFX_PS_SERVER;
    return (enum cfx_ps_role)-1;
}

static void defaults(struct cfx_ps_params *p, const struct cfx_ps_params *in,
                     const struct cfx_context *ctx)
{
    uint64_t m = in ? in->field_mask : 0;
    memset(p, 0, sizeof(*p));
    p->job = (m & CFX_PS_PARAM_JOB) && in->job ? in->job : cfx__env_str("CFX_PS_JOB", "ps");
    p->role = (m & CFX_PS_PARAM_ROLE) ? in->role : env_role();
    p->index = (m & CFX_PS_PARAM_INDEX) ? in->index : env_int("CFX_PS_INDEX", 0);
    p->num_workers =
        (m & CFX_PS_PARAM_NUM_WORKERS) ? in->num_workers : env_int("CFX_PS_WORKERS", 1);
    p->num_servers =
        (m & CFX_PS_PARAM_NUM_SERVERS) ? in->num_servers : env_int("CFX_PS_SERVERS", 1);
    p->consistency = (m & CFX_PS_PARAM_CONSISTENCY) ? in->consistency : CFX_PS_BSP;
    p->staleness = (m & CFX_PS_PARAM_STALENESS) ? in->staleness : 1;
    p->block_size = (m & CFX_PS_PARAM_BLOCK_SIZE)
                        ? in->block_size
                        : cfx__env_size("CFX_PS_BLOCK_SIZE", PS_BLOCK_DEFAULT);
    struct cfx_ps_optim o = { .type = CFX_PS_OPT_SUM,
                              .lr = 0.01,
                              .momentum = 0.9,
                              .beta1 = 0.9,
                              .beta2 = 0.999,
                              .eps = 1e-8,
                              .grad_scale = 1.0 };
    p->optim = (m & CFX_PS_PARAM_OPTIMIZER) ? in->optim : o;
    p->timeout_ms = (m & CFX_PS_PARAM_TIMEOUT) ? in->timeout_ms : ctx->cfg.timeout_ms;
    cfx__ps_balance_defaults(&p->balance);
    if (m & CFX_PS_PARAM_BALANCE)
        p->balance = in->balance;
    p->standby = (m & CFX_PS_PARAM_STANDBY) ? in->standby : 0;
    p->memtype = (m & CFX_PS_PARAM_MEMTYPE) ? in->memtype : CFX_MEMTYPE_HOST;
    p->stream = (m & CFX_PS_PARAM_STREAM) ? in->stream : NULL;
}

static int validate(const struct cfx_ps_params *p, uint64_t m)
{
    if (!p->job || !*p->job || strlen(p->job) >= PS_JOB_MAX || strchr(p->job, '/'))
        return cfx__err(CFX_ERR_INVALID, "ps: job name must be 1..%d characters without '/'",
                        PS_JOB_MAX - 1);
    if (p->role != CFX_PS_WORKER && p->role != CFX_PS_SERVER && !(m & CFX_PS_PARAM_ROLE))
        return cfx__err(CFX_ERR_INVALID, "ps: CFX_PS_ROLE=%s is not worker or server",
                        cfx__env_str("CFX_PS_ROLE", ""));
    if (p->role != CFX_PS_WORKER && p->role != CFX_PS_SERVER)
        return cfx__err(CFX_ERR_INVALID, "ps: unknown role %d", (int)p->role);
    if (p->num_workers < 1 || p->num_workers > PS_MAX_WORKERS || p->num_servers < 1 ||
        p->num_servers > PS_MAX_SERVERS)
        return cfx__err(CFX_ERR_INVALID, "ps: %d workers, %d servers (1..%d, 1..%d)",
                        p->num_workers, p->num_servers, PS_MAX_WORKERS, PS_MAX_SERVERS);
    int lim = p->role == CFX_PS_WORKER ? p->num_workers : PS_MAX_SERVERS;
    if (p->index < 0 || p->index >= lim)
        return cfx__err(CFX_ERR_INVALID, "ps: %s index %d out of range (0..%d)",
                        p->role == CFX_PS_WORKER ? "worker" : "server", p->index, lim - 1);
    if ((unsigned)p->consistency > CFX_PS_ASP || p->staleness < 0 ||
        p->staleness > PS_MAX_STALENESS)
        return cfx__err(CFX_ERR_INVALID, "ps: consistency %d / staleness %d (consistency "
                        "0..%d, staleness 0..%d)", (int)p->consistency, p->staleness,
                        (int)CFX_PS_ASP, PS_MAX_STALENESS);
    if (p->timeout_ms < 1)
        return cfx__err(CFX_ERR_INVALID, "ps: timeout %d ms: every wait of the job has a "
                        "deadline (>= 1 ms)", p->timeout_ms);
    if (p->block_size < PS_BLOCK_MIN)
        return cfx__err(CFX_ERR_INVALID, "ps: block size %zu below %u bytes", p->block_size,
                        PS_BLOCK_MIN);
    if ((unsigned)p->optim.type > CFX_PS_OPT_ADAM)
        return cfx__err(CFX_ERR_INVALID, "ps: unknown optimizer %d", (int)p->optim.type);
    const struct cfx_ps_optim *o = &p->optim;
    const double nums[] = { o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay,
                            o->grad_scale };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
        if (!__builtin_isfinite(nums[i]))
            return cfx__err(CFX_ERR_INVALID, "ps: optimizer settings must be finite numbers "
                            "(lr %g, momentum %g, beta1 %g, beta2 %g, eps %g, weight_decay %g, "
                            "grad_scale %g)", o->lr, o->momentum, o->beta1, o->beta2, o->eps,
                            o->weight_decay, o->grad_scale);
    if (o->lr < 0 || o->eps < 0)
        return cfx__err(CFX_ERR_INVALID, "ps: lr %g and eps %g must not be negative", o->lr,
                        o->eps);
    /* the struct is taken whole once its bit is set: one filled in part left
     * grad_scale 0, and every push was ignored without a word.  Only server
     * 0's settings are the job's (ps.h): the other members' are not judged
     * by what they would do */
    bool job_optim = p->role == CFX_PS_SERVER && p->index == 0;
    if (job_optim && o->type != CFX_PS_OPT_SUM && o->grad_scale == 0)
        return cfx__err(CFX_ERR_INVALID, "ps: optimizer grad_scale 0 would ignore every push "
                        "(with CFX_PS_PARAM_OPTIMIZER every field of cfx_ps_optim is taken as "
                        "given: the defaults apply to none; grad_scale's is 1)");
    if (job_optim && o->type == CFX_PS_OPT_ADAM &&
        (o->beta1 < 0 || o->beta1 >= 1 || o->beta2 < 0 || o->beta2 >= 1))
        return cfx__err(CFX_ERR_INVALID, "ps: Adam beta1 %g and beta2 %g must be in [0, 1) "
                        "(the bias correction divides by 1 - beta^t)", o->beta1, o->beta2);
    if (p->balance.interval_ms < 1 || p->balance.report_ms < 1 || p->balance.explore < 0 ||
        p->balance.explore > 1 || p->balance.min_gain < 0 || p->balance.min_gain >= 1)
        return cfx__err(CFX_ERR_INVALID, "ps: balance knobs out of range");
    /* device buffers: built in and a device here (a server ignores it) */
    if (p->role == CFX_PS_WORKER)
        return cfx__memtype_require(p->memtype, "ps worker");
    return CFX_OK;
}

/*
 * No shard map came: the job did not start, because the scheduler waits
 * for every initial member (servers 0..S-1, workers 0..W-1, as this member
 * counts them) to announce itself.  Into @p out, those that have not (one
 * listing of the directory), so that the error names the member to look
 * at (an index no process took, one that died) and not this member's own.
 */
static void not_started(struct cfx_ps *ps, char *out, size_t len)
{
    int ns = ps->params.num_servers, nw = ps->params.num_workers, n = ns + nw;
    struct cfx_object_id *ids = calloc((size_t)n, sizeof(*ids));
    bool *present = calloc((size_t)n, sizeof(*present));
    int rc = ids && present ? CFX_OK : CFX_ERR_NOMEM;
    for (int i = 0; rc == CFX_OK && i < n; i++)
        cfx__ps_obj_id(ps->job, i < ns ? "server" : "worker", i < ns ? i : i - ns, 0, &ids[i]);
    if (rc == CFX_OK)
        rc = cfx__ps_probe(ps->ctx, ids, (size_t)n, cfx__deadline_ns(2000), present);
    size_t at = (size_t)snprintf(out, len, "the job did not start (no shard map): ");
    int missing = 0;
    for (int i = 0; rc == CFX_OK && i < n && at < len; i++) {
        if (present[i])
            continue;
        if (missing++ < 3)
            at += (size_t)snprintf(out + at, len - at, "%s%s %d", missing > 1 ? ", " : "",
                                   i < ns ? "server" : "worker", i < ns ? i : i - ns);
    }
    if (at < len && rc != CFX_OK)
        snprintf(out + at, len - at, "the directory could not be listed (%s)",
                 cfx_strerror(rc));
    else if (at < len && !missing)
        snprintf(out + at, len - at, "every initial member announced itself, and the scheduler "
                 "(server 0) published no map (its own error says why)");
    else if (at < len)
        snprintf(out + at, len - at, "%s %s not announced %s (the scheduler waits for every "
                 "initial member: servers 0..%d, workers 0..%d)",
                 missing > 3 ? " and others" : "", missing > 1 ? "have" : "has",
                 missing > 1 ? "themselves" : "itself", ns - 1, nw - 1);
    free(ids);
    free(present);
}

/* Whether the job has published a map (a server joining a running job
 * hears of none before it is listed): then *@p v and *@p nservers are the
 * latest one's. */
static bool job_started(struct cfx_ps *ps, uint32_t *v, uint32_t *nservers)
{
    struct cfx_object_id id;
    bool present = false;
    cfx__ps_obj_id(ps->job, "map", 1, 0, &id);
    if (cfx__ps_probe(ps->ctx, &id, 1, cfx__deadline_ns(2000), &present) != CFX_OK || !present)
        return false;
    struct ps_map m;
    cfx__ps_map_init(&m);
    if (cfx__ps_map_latest(ps->ctx, ps->job, 2000, &m) == CFX_OK) {
        *v = m.version;
        *nservers = m.nservers;
    }
    cfx__ps_map_free(&m);
    return true;
}

static bool listed(const struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    return ps->role == CFX_PS_WORKER
               ? (uint32_t)ps->index < m->nworkers && m->worker_node[ps->index] == ps->ctx->node_id
               : (uint32_t)ps->index < m->nservers &&
                     m->server[ps->index].node_id == ps->ctx->node_id;
}

/* Non-schedulers: listen to the scheduler, whose MAP messages bring the
 * shard maps, then wait (after the loop started) for a map that lists us. */
static int join_sched(struct cfx_ps *ps)
{
    struct ps_member m0;
    struct cfx_object_id id;
    size_t sz = 0;
    cfx__ps_obj_id(ps->job, "server", 0, 0, &id);
    /* in slices: a scheduler that announced itself and died before we
     * looked took its announcement with it, and a wait for it to the
     * deadline ended "did not announce itself", long after its node was
     * declared dead.  Each slice that ends says whether the record went,
     * and with which node (cfx__ps_went_dead) */
    int rc;
    char why[CFX__ERR_TEXT_MAX] = "";
    for (;;) {
        uint32_t dead;
        rc = cfx__ps_announce_slice(ps->ctx, &id, &m0, sizeof(m0), &sz, ps->create_dl, why,
                                    &dead);
        if (dead)
            return cfx__err(CFX_ERR_PEER_FAILED, "job %s: %s %d: the scheduler (server 0, "
                            "node %u) died before this %s joined: its announcement went with "
                            "it", ps->job, role_name(ps), ps->index, dead, role_name(ps));
        if (rc != CFX_ERR_TIMEOUT || cfx__now_ns() >= ps->create_dl)
            break;
    }
    if (rc != CFX_OK || sz != sizeof(m0) || m0.magic != PS_MAGIC)
        return cfx__err(rc == CFX_OK ? CFX_ERR_PROTO : rc,
                        "job %s: server 0 (the scheduler) "
                        "did not announce itself within %d ms%s%s",
                        ps->job, ps->timeout_ms, *cfx__ps_went_clause(why) ? " " : "",
                        cfx__ps_went_clause(why));
    struct ps_peer *p = cfx__ps_peer(ps, PS_ID(CFX_PS_SERVER, 0), m0.node_id);
    if (!p)
        return cfx__err(CFX_ERR_PEER_FAILED,
                        "job %s: server 0 is node %u, which the "
                        "coordinator does not know",
                        ps->job, m0.node_id);
    return cfx__ps_peer_up(ps, p);
}

static int wait_listed(struct cfx_ps *ps)
{
    /* the rest of the create's deadline, not a new one; a scheduler found
     * gone meanwhile ends the wait at once, with its cause */
    uint64_t dl = ps->create_dl;
    pthread_mutex_lock(&ps->lock);
    while (!listed(ps) && !ps->lost_status && cfx__cond_wait_until(&ps->cond, &ps->lock, dl))
        ;
    if (!listed(ps) && ps->lost_status) {
        int rc = cfx__ps_lost_err(ps);
        pthread_mutex_unlock(&ps->lock);
        return rc;
    }
    bool ok = listed(ps);
    uint32_t v = ps->map.version, nworkers = ps->map.nworkers, nservers = ps->map.nservers;
    pthread_mutex_unlock(&ps->lock);
    if (ok)
        return CFX_OK;
    if (ps->role == CFX_PS_WORKER && v && (uint32_t)ps->index >= nworkers)
        return cfx__err(CFX_ERR_INVALID, "job %s: shard map %u has %u workers, so no worker %d "
                        "(num_workers differs from server 0's)",
                        ps->job, v, nworkers, ps->index);
    if (ps->role == CFX_PS_WORKER && v)
        return cfx__err(CFX_ERR_EXISTS, "job %s: shard map %u lists another node as worker %d",
                        ps->job, v, ps->index);
    if (!v && !job_started(ps, &v, &nservers)) {
        /* not this member's fault: name who the scheduler still waits for */
        char why[320];
        not_started(ps, why, sizeof(why));
        return cfx__err(CFX_ERR_TIMEOUT, "job %s: %s %d was not listed by the scheduler "
                        "(server 0) within %d ms: %s", ps->job, role_name(ps), ps->index,
                        ps->timeout_ms, why);
    }
    if (ps->role == CFX_PS_SERVER && ps->index > 0 && (!v || (uint32_t)ps->index > nservers))
        /* the scheduler watches the next index alone: a server past it is
         * never seen (and, not listed, gets no map that would say which) */
        return cfx__err(CFX_ERR_TIMEOUT, "job %s: server %d was not listed by the scheduler "
                        "(server 0) within %d ms (map %u): a server added must take the next "
                        "index, one past the job's last server, which is the only one the "
                        "scheduler watches for", ps->job, ps->index, ps->timeout_ms, v);
    return cfx__err(CFX_ERR_TIMEOUT,
                    "job %s: %s %d was not listed by the scheduler (server 0) "
                    "within %d ms (map %u)",
                    ps->job, ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index,
                    ps->timeout_ms, v);
}

static void ps_detach(struct cfx_ctx_user *u);

static int ps_create(struct cfx_context *ctx, const struct cfx_ps_params *params,
                     struct cfx_ps **out);

int cfx_ps_create(struct cfx_context *ctx, const struct cfx_ps_params *params, struct cfx_ps **out)
{
    /* its waits for the job's other members (gets of their announcements)
     * run the thread's interrupt check (cfx_set_interrupt_check): one that
     * fires ends the create with CFX_ERR_CANCELED, its member withdrawn as
     * on any failure */
    cfx__intr_begin();
    int rc = ps_create(ctx, params, out);
    cfx__intr_end();
    return rc;
}

static int ps_create(struct cfx_context *ctx, const struct cfx_ps_params *params,
                     struct cfx_ps **out)
{
    cfx__err_clear();
    if (!ctx || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_create: NULL argument");
    int rc = cfx__mask_check(params ? params->field_mask : 0, CFX_PS_PARAM_ALL, "cfx_ps_create",
                             "cfx_ps_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    struct cfx_ps *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return cfx__err(CFX_ERR_NOMEM, "cfx_ps_create: out of memory");
    ps->fork_gen = cfx__fork_gen();
    ps->refs = 1;
    defaults(&ps->params, params, ctx);
    if ((rc = validate(&ps->params, params ? params->field_mask : 0)) != CFX_OK)
        goto err_free;
    ps->ctx = ctx;
    ps->create_dl = cfx__deadline_ns(ps->params.timeout_ms);
    snprintf(ps->job, sizeof(ps->job), "%s", ps->params.job);
    ps->params.job = ps->job;
    ps->role = ps->params.role;
    ps->index = ps->params.index;
    ps->self_id = PS_ID(ps->role, ps->index);
    ps->timeout_ms = ps->params.timeout_ms < 0 ? 3600 * 1000 : ps->params.timeout_ms;
    pthread_mutex_init(&ps->lock, NULL);
    cfx__cond_init_mono(&ps->cond);
    cfx_list_init(&ps->tx);
    cfx_list_init(&ps->orphans);
    cfx__ps_map_init(&ps->map);
    if (ps->role == CFX_PS_SERVER) {
        long us = cfx__env_ll("CFX_PS_TEST_DELAY_US", 0);
        if (us > 0 && cfx__env_ll("CFX_PS_TEST_DELAY_SERVER", 1) == ps->index) {
            ps->delay_us = (uint32_t)us;
            CFX_LOG(WARN, PS, "job %s: server %d: test-only delay of %ld us per request", ps->job,
                    ps->index, us);
        }
        long ms = cfx__env_ll("CFX_PS_TEST_MIGRATE_DELAY_MS", 0);
        bool die = cfx__env_ll("CFX_PS_TEST_MIGRATE_DIE", 0) == 1;
        if ((ms > 0 || die) && cfx__env_ll("CFX_PS_TEST_MIGRATE_SERVER", 1) == ps->index) {
            ps->migrate_delay_ms = ms > 0 ? (uint32_t)ms : 0;
            ps->migrate_die = die;
            CFX_LOG(WARN, PS, "job %s: server %d: test-only: each map's migrations %s", ps->job,
                    ps->index, die ? "are preceded by this server's SIGKILL" : "wait");
        }
        long dw = cfx__env_ll("CFX_PS_TEST_DROP_WORKER", -1);
        long ds = cfx__env_ll("CFX_PS_TEST_DROP_STEP", -1);
        if (dw >= 0 && ds >= 0 && cfx__env_ll("CFX_PS_TEST_DROP_SERVER", 0) == ps->index) {
            ps->drop_worker = (uint32_t)dw;
            ps->drop_at = (uint64_t)ds + 1;
            CFX_LOG(WARN, PS, "job %s: server %d: test-only: worker %ld's push of step %ld is "
                    "dropped", ps->job, ps->index, dw, ds);
        }
        const char *dt = getenv("CFX_PS_TEST_DIE_TENSOR");
        if (ps->index > 0 && dt && *dt && cfx__env_ll("CFX_PS_TEST_DIE_SERVER", 1) == ps->index) {
            snprintf(ps->die_tensor, sizeof(ps->die_tensor), "%s", dt);
            CFX_LOG(WARN, PS, "job %s: server %d: test-only: SIGKILLed by a map that gives it a "
                    "block of tensor '%s' before it is ready", ps->job, ps->index, dt);
        }
        if (ps->index > 0 && cfx__env_ll("CFX_PS_TEST_SKIP_FAILED_MAPS", -1) == ps->index) {
            ps->skip_failed_maps = true;
            CFX_LOG(WARN, PS, "job %s: server %d: test-only: deaf to the notices of maps that "
                    "name a failed server while it is active in them", ps->job, ps->index);
        }
        if (ps->index > 0 && cfx__env_ll("CFX_PS_TEST_HOLD_END", -1) == ps->index) {
            ps->hold_end = true;
            CFX_LOG(WARN, PS,
                    "job %s: server %d: test-only: the scheduler's end notice waits until the "
                    "scheduler sent something after it or is gone",
                    ps->job, ps->index);
        }
    }

    /* a server offers itself to placement, so that an administrator may let
     * it choose which standby server to admit (cfx_ps_add_server_auto) */
    if (ps->role == CFX_PS_SERVER && cfx__task_offer(ctx, CFX_TASK_PS_SERVER) != CFX_OK)
        CFX_LOG(WARN, PS, "job %s: server %d: not offered to placement (add-server --auto "
                "will not choose it): %s", ps->job, ps->index, cfx_last_error());

    /* announce ourselves */
    ps->member = (struct ps_member){ .magic = PS_MAGIC,
                                     .node_id = ctx->node_id,
                                     .role = ps->role,
                                     .index = (uint32_t)ps->index,
                                     .standby = !!ps->params.standby };
    struct cfx_object_id id;
    cfx__ps_obj_id(ps->job, ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index, 0, &id);
    /* within the create's deadline (the context's default was used: a
     * coordinator down held a create of 1 s for the context's 30), and the
     * put's own words, which name the coordinator */
    int left = cfx__ms_left(ps->create_dl); /* -1: none */
    struct cfx_obj_params ap = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                 .timeout_ms = left < 0 ? -1 : CFX_MAX(left, 1) };
    rc = cfx_put(ctx, &id, &ps->member, sizeof(ps->member), &ap);
    if (rc != CFX_OK) {
        rc = cfx__err(rc, "job %s: cannot announce %s %d: %s", ps->job,
                      ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index,
                      rc == CFX_ERR_EXISTS ? "another process uses that index"
                                           : cfx_last_error());
        goto err_lock;
    }

    if (ps->role == CFX_PS_SERVER && cfx__env_ll("CFX_PS_TEST_DIE_ANNOUNCED", -1) == ps->index) {
        /* test hook: a server killed during the job's startup */
        CFX_LOG(WARN, PS, "job %s: server %d: test hook: killed right after announcing itself",
                ps->job, ps->index);
        raise(SIGKILL);
    }
    if (ps->role == CFX_PS_SERVER && (rc = cfx__ps_load_start(ps)) != CFX_OK)
        goto err_delete;
    if (ps->role == CFX_PS_WORKER && (rc = cfx__ps_worker_create(ps)) != CFX_OK)
        goto err_delete;
    if (ps->role == CFX_PS_SERVER && ps->index == 0)
        rc = cfx__ps_sched_create(ps);
    else
        rc = join_sched(ps);
    if (rc != CFX_OK)
        goto err_delete;
    if (pthread_create(&ps->loop_thread, NULL, loop_main, ps)) {
        rc = cfx__err(CFX_ERR_NOMEM, "job %s: cannot start the loop thread", ps->job);
        goto err_delete;
    }
    ps->loop_started = true;
    pthread_setname_np(ps->loop_thread, "cfx-ps");
    if (ps->sched && (rc = cfx__ps_sched_start(ps)) != CFX_OK) {
        rc = cfx__err(rc, "job %s: cannot start the scheduler's watchers", ps->job);
        goto err_delete;
    }
    if (!ps->sched && (rc = wait_listed(ps)) == CFX_OK) {
        /* every member says how many workers the job has: one that says
         * otherwise than the scheduler's map (under BSP a round would sum
         * another count of pushes) is refused, naming both */
        pthread_mutex_lock(&ps->lock);
        uint32_t mw = ps->map.nworkers;
        pthread_mutex_unlock(&ps->lock);
        if (mw != (uint32_t)ps->params.num_workers)
            rc = cfx__err(CFX_ERR_INVALID, "job %s: this %s says num_workers %d, server 0 "
                          "(the scheduler) %u", ps->job,
                          ps->role == CFX_PS_WORKER ? "worker" : "server",
                          ps->params.num_workers, mw);
    }
    if (!ps->sched && rc != CFX_OK)
        goto err_delete;
    CFX_LOG(INFO, PS, "job %s: %s %d up (map %u)", ps->job,
            ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index, ps->map.version);
    cfx__ctx_user_attach(ctx, &ps->user, ps_detach);
    ps->attached = true;
    *out = ps;
    return CFX_OK;

err_delete: {
    /* the handle's teardown makes calls of its own: the cause survives it */
    char why[CFX__ERR_TEXT_MAX];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    ps->bye_dl = ps->create_dl; /* a goodbye the scheduler may never answer: not past it */
    cfx_ps_destroy(ps);
    return cfx__err(rc, "%s", why);
}
err_lock:
    pthread_cond_destroy(&ps->cond);
    pthread_mutex_destroy(&ps->lock);
err_free:
    free(ps);
    return rc;
}

int cfx__ps_publish(struct cfx_ps *ps, const struct cfx_object_id *id, void *buf, size_t len)
{
    struct ps_pub *n = realloc(ps->pubs, (ps->npubs + 1) * sizeof(*n));
    if (!n)
        return cfx__err(CFX_ERR_NOMEM, "job %s: out of memory", ps->job);
    ps->pubs = n;
    /* within the job's timeout, not the context's (a scheduler leaving with
     * its coordinator gone waited 30 s per map) */
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = ps->timeout_ms };
    int rc = cfx_put(ps->ctx, id, buf, len, &op);
    if (rc == CFX_OK)
        ps->pubs[ps->npubs++] = (struct ps_pub){ .id = *id, .buf = buf };
    return rc;
}

/* The objects the handle put go, and then their buffers (object.h: a put
 * buffer stays valid until the object is deleted): the job's name may be
 * used again on this context, and nothing reads them after.  All within
 * PS_UNPUBLISH_MS; the delete releases the local copy even when the
 * coordinator does not answer, and a copy that uploads still read at the
 * deadline keeps its buffer (leaked rather than read after it is freed). */
#define PS_UNPUBLISH_MS 2000

/* The handle's own objects go; in its detach, past the context's gate. */
static int ps_delete(struct cfx_ps *ps, const struct cfx_object_id *id,
                     const struct cfx_obj_params *op)
{
    return ps->detaching ? cfx__delete_detaching(ps->ctx, id, op) : cfx_delete(ps->ctx, id, op);
}
static void unpublish(struct cfx_ps *ps)
{
    struct cfx_context *ctx = ps->ctx;
    uint64_t dl = cfx__deadline_ns(PS_UNPUBLISH_MS);
    for (uint32_t i = 0; i < ps->npubs; i++) {
        uint64_t now = cfx__now_ns();
        struct cfx_obj_params op = {
            .field_mask = CFX_OBJ_PARAM_TIMEOUT,
            .timeout_ms = now < dl ? (int)((dl - now) / 1000000) + 1 : 1,
        };
        int rc = ps_delete(ps, &ps->pubs[i].id, &op);
        pthread_mutex_lock(&ctx->lock);
        bool held = cfx__store_find(&ctx->store, &ps->pubs[i].id) != NULL;
        pthread_mutex_unlock(&ctx->lock);
        if (!held)
            free(ps->pubs[i].buf);
        else
            CFX_LOG(WARN, PS, "job %s: an object of this handle is still read (%s): its "
                    "buffer is kept", ps->job, cfx_strerror(rc));
    }
    free(ps->pubs);
    ps->pubs = NULL;
    ps->npubs = 0;
}

/* Everything the handle holds in its context.  @p goodbye: tell the
 * scheduler (a worker) or the servers (the scheduler) first; a context
 * being destroyed can no longer carry that, and its peers see its
 * mailboxes fail instead (a worker is then counted as done). */
static void ps_teardown(struct cfx_ps *ps, bool goodbye)
{
    if (goodbye && ps->w && ps->loop_started)
        cfx__ps_worker_say_bye(ps);
    if (goodbye && ps->sched && ps->loop_started)
        cfx__ps_sched_leave(ps);
    pthread_mutex_lock(&ps->lock);
    ps->stop = true;
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_kick(ps);
    cfx__ps_sched_stop(ps);
    if (ps->loop_started)
        pthread_join(ps->loop_thread, NULL);
    /* the mailboxes first: their sends read the callers' gradients and
     * their receives write the callers' outputs until withdrawn here, so
     * no request may end (and hand its buffers back) before */
    cfx__ps_net_close(ps);
    if (ps->w)
        cfx__ps_worker_bye(ps);
    cfx__ps_server_free(ps);
    cfx__ps_load_stop(ps);
    cfx__ps_worker_free(ps);
    cfx__ps_sched_free(ps);
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 1000 };
    struct cfx_object_id id;
    cfx__ps_obj_id(ps->job, ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index, 0, &id);
    ps_delete(ps, &id, &op);
    unpublish(ps);
}

void cfx__ps_unref(struct cfx_ps *ps)
{
    if (__atomic_sub_fetch(&ps->refs, 1, __ATOMIC_ACQ_REL))
        return;
    cfx__ps_map_free(&ps->map);
    pthread_cond_destroy(&ps->cond);
    pthread_mutex_destroy(&ps->lock);
    free(ps);
}

/* The context is destroyed before the handle: the handle's side of the
 * context goes now (its loop stops, its requests end), so that nothing of
 * the handle touches the context after; cfx_ps_destroy() frees the rest.
 * It used to keep running on the freed context, and cfx_ps_destroy() hung. */
static void ps_detach(struct cfx_ctx_user *u)
{
    struct cfx_ps *ps = container_of(u, struct cfx_ps, user);
    CFX_LOG(INFO, PS, "job %s: %s %d: the context is destroyed before the handle: its calls "
            "fail with CFX_ERR_CANCELED", ps->job,
            ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index);
    ps->detaching = true;
    ps_teardown(ps, false);
    pthread_mutex_lock(&ps->lock);
    __atomic_store_n(&ps->detached, true, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
}

int cfx__ps_gone(const struct cfx_ps *ps)
{
    if (!__atomic_load_n(&ps->detached, __ATOMIC_ACQUIRE))
        return CFX_OK;
    return cfx__err(CFX_ERR_CANCELED, "job %s: %s %d: its context was destroyed", ps->job,
                    ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index);
}

void cfx_ps_destroy(struct cfx_ps *ps)
{
    /* a forked child's copy: its threads are not here, and what it would
     * tell and withdraw is the parent's (see cfx_context_destroy) */
    if (!ps || cfx__ps_forked(ps))
        return;
    struct cfx_context *ctx = ps->ctx;
    int r = ps->attached ? cfx__ctx_user_release(ctx, &ps->user) : 1;
    if (r < 0) {
        CFX_LOG(ERR, PS, "job %s: its context's destroy gave up on calls still in flight: the "
                "handle is left allocated", ps->job);
        return;
    }
    if (r > 0) {
        ps_teardown(ps, true);
        if (ps->attached)
            cfx__ctx_leave(ctx, CFX_OK);
    }
    cfx__ps_unref(ps); /* requests not freed yet keep it */
}

/*
 * ps->lock held: a member whose coordinator has been unreachable for the
 * handle's timeout ends (the job's maps, and so its end, travel through
 * the coordinator's directory: without it a server would serve for ever
 * and a worker wait for maps that never come).  Shorter outages are a
 * pause; the client reconnects meanwhile.  Waits are woken to see it.
 */
void cfx__ps_check_coord(struct cfx_ps *ps)
{
    uint64_t gone = cfx__ctl_lost_ms(ps->ctx->ctl);
    if (ps->lost_status || ps->finished || ps->timeout_ms <= 0 ||
        gone < (uint64_t)ps->timeout_ms)
        return;
    ps->lost_status = CFX_ERR_CONNECT;
    snprintf(ps->lost_why, sizeof(ps->lost_why),
             "job %s: %s %d: the coordinator %s has been unreachable for %llu ms "
             "(the job's timeout is %d ms): the job cannot go on", ps->job,
             ps->role == CFX_PS_SERVER ? "server" : "worker", ps->index, ps->ctx->cfg.coord,
             (unsigned long long)gone, ps->timeout_ms);
    CFX_LOG(ERR, PS, "%s", ps->lost_why);
    pthread_cond_broadcast(&ps->cond);
}

#define SERVE_CHECK_MS 250 /* how often serve looks at the coordinator */

int cfx_ps_serve(struct cfx_ps *ps, int timeout_ms)
{
    cfx__err_clear();
    if (!ps || ps->role != CFX_PS_SERVER)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_serve: not a server handle");
    if (cfx__ps_forked(ps))
        return cfx__err(CFX_ERR_INVALID, "job %s: the handle was created before this process "
                        "forked: a child creates its own", ps->job);
    int gone = cfx__ps_gone(ps);
    if (gone != CFX_OK)
        return gone;
    uint64_t dl = cfx__deadline_ns(timeout_ms);
    pthread_mutex_lock(&ps->lock);
    for (;;) {
        cfx__ps_check_coord(ps);
        if (ps->finished || ps->lost_status)
            break;
        uint64_t slice = cfx__deadline_ns(SERVE_CHECK_MS);
        bool last = slice >= dl;
        while (!ps->finished && !ps->lost_status &&
               cfx__cond_wait_until(&ps->cond, &ps->lock, last ? dl : slice))
            ;
        if (last && !ps->finished && !ps->lost_status) {
            cfx__ps_check_coord(ps);
            break;
        }
    }
    bool fin = ps->finished;
    int rc = fin ? CFX_OK : cfx__ps_lost_err(ps);
    pthread_mutex_unlock(&ps->lock);
    if (fin || rc != CFX_OK)
        return rc;
    return cfx__err(CFX_ERR_TIMEOUT, "job %s: server %d still serving after %d ms", ps->job,
                    ps->index, timeout_ms);
}

int cfx_ps_stats(struct cfx_ps *ps, struct cfx_ps_stats *out)
{
    cfx__err_clear();
    if (!ps || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_stats: NULL argument");
    pthread_mutex_lock(&ps->lock);
    *out = ps->stats;
    pthread_mutex_unlock(&ps->lock);
    return CFX_OK;
}

int cfx_ps_server_set_delay(struct cfx_ps *ps, uint32_t us)
{
    cfx__err_clear();
    if (!ps || ps->role != CFX_PS_SERVER)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_server_set_delay: not a server handle");
    pthread_mutex_lock(&ps->lock);
    ps->delay_us = us;
    pthread_mutex_unlock(&ps->lock);
    return CFX_OK;
}

/*
 * Administration of a running job from any member context (rdmactl joins as
 * one).  Requests and answers are small objects:
 *
 *   ps/<job>/admin/<n>        struct ps_admin_req, put by the administrator
 *   ps/<job>/admin-reply/<n>  struct ps_admin_rep, put by the scheduler
 *
 * The scheduler looks for request n = 1, 2, ... in order; the latest map
 * says which n comes next (admin_next), and the administrator skips numbers
 * already taken.  Administrators at once race for a number: the directory
 * gives a name to one putter (the other's put fails with CFX_ERR_EXISTS),
 * and a request carries a random nonce that its answer echoes, so one put
 * under a number whose request was answered and deleted meanwhile (the
 * scheduler will not read it) sees another's answer and moves on.  Either
 * way the loser takes the next number: they are served in turn.
 */
#include "ps_int.h"

#include "dataplane/engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Numbers an administrator tries before it gives up (each lost to another
 * administrator's request at once). */
#define PS_ADMIN_TRIES 64u

/*
 * An administrator addresses a running job: with no shard map 1 in the
 * directory there is none, and the coordinator's answer says so at once;
 * waiting out the deadline for a map would only turn that into a timeout.
 */
static int job_check(struct cfx_context *ctx, const char *job, int timeout_ms, const char *what)
{
    struct cfx_object_id id;
    bool present = false;
    if (timeout_ms < 0)
        return cfx__err(CFX_ERR_INVALID, "%s: timeout %d ms is negative", what, timeout_ms);
    if (strlen(job) >= PS_JOB_MAX || strchr(job, '/')) /* as cfx_ps_create() refuses it */
        return cfx__err(CFX_ERR_INVALID, "%s: job name '%s' is not 1..%d characters without "
                        "'/'", what, job, PS_JOB_MAX - 1);
    cfx__ps_obj_id(job, "map", 1, 0, &id);
    int rc = cfx__ps_probe(ctx, &id, 1, cfx__deadline_ns(timeout_ms), &present);
    if (rc != CFX_OK)
        return cfx__err(rc, "job %s: cannot list the object directory: %s", job,
                        cfx_last_error());
    if (!present)
        return cfx__err(CFX_ERR_NOT_FOUND,
                        "job %s: no such job (the coordinator has no shard map of it; is its "
                        "server 0 running?)", job);
    return CFX_OK;
}

static int admin_once(struct cfx_context *ctx, const char *job, uint32_t cmd, int arg,
                      int timeout_ms, uint32_t *version_out);

/*
 * One request, asked again while the scheduler answers CFX_ERR_AGAIN (a job
 * whose tensors are still being registered: a state every job passes
 * through at its start), until the caller's deadline.
 */
static int admin(struct cfx_context *ctx, const char *job, uint32_t cmd, int arg, int timeout_ms,
                 uint32_t *version_out)
{
    cfx__err_clear();
    if (!ctx || !job || !*job)
        return cfx__err(CFX_ERR_INVALID, "ps admin: NULL context or job");
    if ((cmd == PS_ADMIN_ADD || cmd == PS_ADMIN_REMOVE) && (arg < 0 || arg >= PS_MAX_SERVERS))
        return cfx__err(CFX_ERR_INVALID, "ps admin: server index %d is not in 0..%d", arg,
                        PS_MAX_SERVERS - 1);
    int rc = job_check(ctx, job, timeout_ms, "ps admin");
    if (rc != CFX_OK)
        return rc;
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    for (;;) {
        int left = cfx__ms_left(deadline);
        rc = admin_once(ctx, job, cmd, arg, left, version_out);
        if (rc != CFX_ERR_AGAIN)
            return rc;
        if (cfx__ms_left(deadline) <= 20) {
            char why[256];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            return cfx__err(CFX_ERR_TIMEOUT, "%s (still so after %d ms)", why, timeout_ms);
        }
        usleep(20 * 1000); /* the scheduler publishes the next map when registration ends */
    }
}

static int admin_once(struct cfx_context *ctx, const char *job, uint32_t cmd, int arg,
                      int timeout_ms, uint32_t *version_out)
{
    int rc;
    struct ps_map m;
    cfx__ps_map_init(&m);
    rc = cfx__ps_map_latest(ctx, job, timeout_ms, &m);
    if (rc != CFX_OK)
        return rc;
    uint32_t n = m.admin_next ? m.admin_next : 1;
    cfx__ps_map_free(&m);
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    struct ps_admin_req *req = calloc(1, sizeof(*req));
    if (!req)
        return cfx__err(CFX_ERR_NOMEM, "ps admin: out of memory");
    *req = (struct ps_admin_req){
        .magic = PS_MAGIC, .cmd = cmd, .arg = arg, .nonce = cfx__random_u64() | 1
    };
    struct cfx_object_id id, rid;
    struct ps_admin_rep rep;
    size_t sz = 0;
    for (unsigned tries = 0;; tries++, n++) {
        if (tries == PS_ADMIN_TRIES) {
            free(req);
            return cfx__err(CFX_ERR_BUSY,
                            "job %s: %u other administrators' requests took the numbers "
                            "before this one's; try again", job, PS_ADMIN_TRIES);
        }
        /* skip numbers taken (a request, or an answer to one already deleted) */
        for (;;) {
            struct cfx_object_id ids[2];
            bool present[2];
            cfx__ps_obj_id(job, "admin", n, 0, &ids[0]);
            cfx__ps_obj_id(job, "admin-reply", n, 0, &ids[1]);
            if ((rc = cfx__ps_probe(ctx, ids, 2, deadline, present)) != CFX_OK) {
                free(req);
                return cfx__err(rc, "job %s: cannot list the object directory", job);
            }
            if (!present[0] && !present[1])
                break;
            n++;
        }
        cfx__ps_obj_id(job, "admin", n, 0, &id);
        cfx__ps_obj_id(job, "admin-reply", n, 0, &rid);
        rc = cfx_put(ctx, &id, req, sizeof(*req), NULL);
        if (rc == CFX_ERR_EXISTS)
            continue; /* another administrator put it first: the next number */
        if (rc != CFX_OK) {
            free(req);
            return cfx__err(rc, "job %s: cannot post admin request %u: %s", job, n,
                            cfx_strerror(rc));
        }
        sz = 0;
        rc = cfx__ps_get(ctx, &rid, &rep, sizeof(rep), &sz, cfx__ms_left(deadline));
        struct cfx_obj_params dop = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 1000 };
        cfx_delete(ctx, &id, &dop);
        if (rc == CFX_OK && sz == sizeof(rep) && rep.magic == PS_MAGIC &&
            rep.nonce != req->nonce)
            continue; /* another's answer: the number was served before our put */
        break;
    }
    free(req);
    if (rc == CFX_ERR_TIMEOUT)
        return cfx__err(rc,
                        "job %s: the scheduler (server 0) did not answer admin request %u "
                        "within %d ms",
                        job, n, timeout_ms);
    if (rc != CFX_OK)
        return rc;
    if (sz != sizeof(rep) || rep.magic != PS_MAGIC)
        return cfx__err(CFX_ERR_PROTO, "job %s: malformed answer to admin request %u", job, n);
    rep.detail[sizeof(rep.detail) - 1] = '\0';
    if (version_out)
        *version_out = rep.version;
    if (rep.status != CFX_OK)
        return cfx__err(rep.status, "job %s: %s", job, rep.detail);
    return CFX_OK;
}

int cfx_ps_add_server(struct cfx_context *ctx, const char *job, int server, int timeout_ms,
                      uint32_t *version_out)
{
    return admin(ctx, job, PS_ADMIN_ADD, server, timeout_ms, version_out);
}

/* The nodes of @p st's standby servers not yet @p tried into @p nodes. */
static size_t standby_nodes(const struct cfx_ps_stats *st, const bool *tried, uint32_t *nodes)
{
    size_t n = 0;
    for (uint32_t i = 0; i < st->nservers && n < CFX_TASK_NODES_MAX; i++)
        if (st->servers[i].state == CFX_PS_SERVER_STANDBY && !tried[i])
            nodes[n++] = st->servers[i].node_id;
    return n;
}

int cfx_ps_add_server_auto(struct cfx_context *ctx, const char *job, int timeout_ms,
                           int *server_out, uint32_t *version_out)
{
    struct cfx_ps_stats *st;
    uint32_t nodes[CFX_TASK_NODES_MAX], node = 0;
    bool tried[CFX_ARRAY_SIZE(st->servers)] = { false };
    size_t n;
    int rc, index = -1;

    cfx__err_clear();
    if (!ctx || !job)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_add_server_auto: NULL argument");
    st = calloc(1, sizeof(*st));
    if (!st)
        return cfx__err(CFX_ERR_NOMEM, "cfx_ps_add_server_auto: out of memory");
    rc = cfx_ps_shards(ctx, job, timeout_ms, st);
    if (rc != CFX_OK)
        goto out;
    if (!(n = standby_nodes(st, tried, nodes))) {
        rc = cfx__err(CFX_ERR_NOT_FOUND, "job %s: no standby server to add (shard map %u)", job,
                      st->map_version);
        goto out;
    }
    /* The placement's choice among their nodes: the least loaded (spread).
     * A standby the scheduler has seen go (its handle gone, its node still
     * alive, so placement may choose it) is refused with CFX_ERR_PEER_FAILED:
     * the others are tried in turn. */
    do {
        struct cfx_task_needs needs = { .field_mask = CFX_TASK_NEEDS_NODES, .nodes = nodes,
                                        .n_nodes = n };
        rc = cfx_place(ctx, CFX_TASK_PS_SERVER, &needs, NULL, 0, &node);
        if (rc == CFX_ERR_NO_RESOURCE) {
            /* none of their nodes is one placement may choose (they died or
             * left): no standby server is left to add (ps.h) */
            char names[192] = "";
            size_t len = 0;
            for (uint32_t i = 0; i < st->nservers && len < sizeof(names); i++)
                if (st->servers[i].state == CFX_PS_SERVER_STANDBY && !tried[i])
                    len += (size_t)snprintf(names + len, sizeof(names) - len, "%sserver %d "
                                            "(node %u)", len ? ", " : "", st->servers[i].index,
                                            st->servers[i].node_id);
            rc = cfx__err(CFX_ERR_NOT_FOUND, "job %s: no standby server left to add: "
                          "placement may choose none of %s (gone, or not serving it): %s",
                          job, names, cfx_last_error());
            goto out;
        }
        if (rc != CFX_OK) {
            rc = cfx__err(rc, "job %s: placement among %zu standby server(s): %s", job, n,
                          cfx_last_error());
            goto out;
        }
        int at = -1;
        for (uint32_t i = 0; i < st->nservers; i++)
            if (st->servers[i].state == CFX_PS_SERVER_STANDBY && !tried[i] &&
                st->servers[i].node_id == node)
                at = (int)i;
        if (at < 0) {
            rc = cfx__err(CFX_ERR_NOT_FOUND, "job %s: placement chose node %u, which runs no "
                          "standby server of it", job, node);
            goto out;
        }
        tried[at] = true;
        index = st->servers[at].index;
        CFX_LOG(INFO, PS, "job %s: placement chose standby server %d on node %u", job, index,
                node);
        rc = cfx_ps_add_server(ctx, job, index, timeout_ms, version_out);
        if (rc == CFX_ERR_PEER_FAILED)
            CFX_LOG(WARN, PS, "job %s: %s; trying another standby server", job,
                    cfx_last_error());
    } while (rc == CFX_ERR_PEER_FAILED && (n = standby_nodes(st, tried, nodes)));
    if (rc == CFX_OK && server_out)
        *server_out = index;
out:
    free(st);
    return rc;
}

int cfx_ps_remove_server(struct cfx_context *ctx, const char *job, int server, int timeout_ms,
                         uint32_t *version_out)
{
    return admin(ctx, job, PS_ADMIN_REMOVE, server, timeout_ms, version_out);
}

int cfx_ps_rebalance(struct cfx_context *ctx, const char *job, int timeout_ms,
                     uint32_t *version_out)
{
    return admin(ctx, job, PS_ADMIN_REBALANCE, 0, timeout_ms, version_out);
}

int cfx_ps_set_auto(struct cfx_context *ctx, const char *job, int enabled, int timeout_ms)
{
    return admin(ctx, job, PS_ADMIN_AUTO, enabled, timeout_ms, NULL);
}

int cfx_ps_shards(struct cfx_context *ctx, const char *job, int timeout_ms,
                  struct cfx_ps_stats *out)
{
    cfx__err_clear();
    if (!ctx || !job || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_ps_shards: NULL argument");
    int rc = job_check(ctx, job, timeout_ms, "cfx_ps_shards");
    if (rc != CFX_OK)
        return rc;
    struct ps_map m;
    cfx__ps_map_init(&m);
    rc = cfx__ps_map_latest(ctx, job, timeout_ms, &m);
    if (rc != CFX_OK)
        return rc;
    memset(out, 0, sizeof(*out));
    cfx__ps_map_stats(&m, out);
    cfx__ps_map_free(&m);
    return CFX_OK;
}

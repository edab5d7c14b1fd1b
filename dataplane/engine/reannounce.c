/*
 * Re-announcing this node's objects after the coordinator restarted.
 *
 * The coordinator keeps members and the object directory in memory only
 * (soft state): after a restart it knows nothing, so every node, once its
 * client has reconnected and rejoined (control/client.c), announces again
 * each complete object it put, and each complete copy it got through the
 * directory, as a copy of its putter's put (CFX_PROTO_PUT_COPY, with the
 * putter's node id and tag learnt from the lookup): the directory takes it
 * when the id names that same put, or nothing (the putter left before the
 * restart, or has not announced it yet), and refuses it otherwise, when
 * the copy is dropped here (see the lifecycle in docs/ARCHITECTURE.md).
 * Copies got from a cached location are not announced: the directory never
 * knew them.  The client calls
 * cfx__reannounce_on_reconnected() on its reader thread, which must not
 * wait for replies, so the announcing runs on a thread of its own: it copies
 * the ids, sizes, chunk sizes and inline bytes out of the store under
 * ctx->lock, then calls cfx__ctl_obj_put_own() for each without the lock.
 *
 * A cfx_delete() may run meanwhile: the announcement of an id must never
 * reach the coordinator after its delete (the object would live again in
 * the directory with nobody holding it).  So each id is checked again just
 * before it is sent, under ctx->lock: its store entry must still be the one
 * collected (same seq) and not being deleted, and is marked reannouncing
 * until the coordinator answered; a delete marks the entry deleting first
 * and then waits for that mark to clear before it sends its own request.
 * Whichever takes the lock first wins: the announcement is skipped, or the
 * delete follows it.
 *
 * Test hook CFX_REANNOUNCE_TEST_HOLD=1: once a round has its list it waits
 * (up to the context's timeout) until a cfx_delete() on this node returned,
 * and a cfx_delete() first waits until a round has its list.  That forces
 * the order of the race above: delete after the list, before the sends.
 *
 * Data-plane transfers do not need the coordinator and go on while it is
 * away; gets that need a lookup wait for the reconnection until their
 * deadline.
 *
 * Events missed meanwhile.  The coordinator tells its members of a death
 * or a leave once, as it happens; a node cut off then (stopped, its control
 * connection lost, or the coordinator restarting) never hears it.  So after
 * every rejoin the thread asks the coordinator about every peer this node
 * deals with and has not heard gone (connections, messages posted to or
 * from it, traffic counted with it, connections that ended: known_peers,
 * taken on the client thread as the rejoin succeeds, with the new id),
 * one NODE_GET each.  One not alive, or not known any more (forgotten after
 * its dead_keep_ms, or not back by the end of its rejoin window after a
 * restart), is handed to the progress thread as its event would have been
 * (CFX_CMD_NODE_MISSED, progress.c; once: whichever of it and the event
 * comes second finds it done).
 *
 * A rejoin under a new id (the coordinator declared this node dead, or
 * restarted and did not give the id back) asks before the announcements.
 * One that kept its id follows a restart, and asks after them: the
 * restarted coordinator holds a query of a node of before until that node
 * is back or its rejoin window ends (coord_members.c), and the
 * announcements must not wait for the slowest peer.  A peer stopped past
 * that window (it comes back under a new id) is then learnt gone as the
 * window ends, where before the node's calls with it waited for their
 * deadline.  The queries have one deadline for the round: the context's
 * timeout, or the window when longer (the coordinator's dead_after_ms, told
 * at the join, plus CFX_PROTO_RECONNECT_MAX_MS); a peer not asked in time
 * is named in the log, and what waits on it keeps its own deadline.  The
 * queries run on this thread only, with no lock held, and the context's
 * destroy interrupts them (cfx__reannounce_stop).
 */
#include "engine.h"
#include "p2p.h"
#include "control/proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct peers {
    uint32_t *ids;
    size_t n, cap;
};

struct cfx_reannounce {
    struct cfx_context *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    bool started;       /* thread running */
    bool pending;       /* a reconnect not announced for yet */
    bool stop;          /* context being destroyed */
    bool moved;         /* a rejoin since the last round gave this node a new id */
    struct peers peers; /* the peers to ask about, taken as the id changed or kept */
};

/* ctx->reannounce once the context is being destroyed (never written). */
static struct cfx_reannounce reannounce_closed;

struct announcement {
    struct cfx_object_id id;
    uint64_t seq;       /* the store entry's, when collected */
    uint32_t copy_of;   /* a copy: its putter's node id; 0 for our own put */
    uint64_t tag;       /* a copy: the putter's tag of the put */
    uint64_t size;
    uint32_t chunk_size;
    void *data;         /* inline bytes (malloc'd) or NULL */
};

static bool stopping(struct cfx_reannounce *ra)
{
    pthread_mutex_lock(&ra->mu);
    bool s = ra->stop;
    pthread_mutex_unlock(&ra->mu);
    return s;
}

/* The coordinator may have given us a new id (ours was taken): true then. */
static bool adopt_node_id(struct cfx_context *ctx)
{
    uint32_t id = cfx__ctl_node_id(ctx->ctl);
    if (!id || id == ctx->node_id)
        return false;
    /* the log's node= follows, as at the start (context.c) */
    char old_tag[16], tag[16];
    snprintf(old_tag, sizeof(old_tag), "%u", ctx->node_id);
    snprintf(tag, sizeof(tag), "%u", id);
    cfx__log_retag(old_tag, tag);
    CFX_LOG(WARN, CTL, "node %u: on rejoining, coordinator %s gave this node id %u (it was %u: "
            "the coordinator restarted, or declared this node dead while it was stopped or cut "
            "off); the groups it was a rank of are unusable here: create new ones", id,
            ctx->cfg.coord, id, ctx->node_id);
    ctx->node_id = id;
    ctx->self.node_id = id;
    for (int t = 0; t < ctx->ntp; t++)
        ctx->tp[t].iface->node_id = id;
    /* the connections that ended meanwhile were the old node's, which the
     * peers dropped as dead: the peers are not gone (eager.c node_gone),
     * unless the coordinator says so (ask_peers); those still open are
     * dropped at their next use (conn.c) */
    ctx->eager_ngone = 0;
    /* the groups of the old id are unusable here: their calls stop at once
     * (coll/group.c cfx__group_moved) */
    pthread_cond_broadcast(&ctx->obj_cond);
    return true;
}

static void peers_add(struct peers *p, uint32_t id)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        uint32_t *ids = realloc(p->ids, cap * sizeof(*ids));
        if (!ids)
            return; /* one fewer asked about: its event stays missed, as before */
        p->ids = ids;
        p->cap = cap;
    }
    p->ids[p->n++] = id;
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The peers this node deals with and has not heard gone, each once
 * (ctx->lock held, before adopt_node_id clears ctx->eager_gone). */
static struct peers known_peers(struct cfx_context *ctx)
{
    struct peers p = { 0 };
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns)
        peers_add(&p, cfx_list_entry(pos, struct cfx_conn, link)->node_id);
    cfx_list_for_each(pos, &ctx->eager_posted)
        peers_add(&p, cfx_list_entry(pos, struct cfx_obj, p2p_link)->peer_node);
    cfx_list_for_each(pos, &ctx->p2p_sends)
        peers_add(&p, cfx_list_entry(pos, struct cfx_obj, p2p_link)->peer_node);
    unsigned used = __atomic_load_n(&ctx->npeer_bytes, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < used; i++) {
        struct cfx_ctl_peer_traffic t;
        if (cfx__peer_bytes_read(ctx, i, &t))
            peers_add(&p, t.peer);
    }
    for (unsigned i = 0; i < ctx->eager_ngone && i < CFX_ARRAY_SIZE(ctx->eager_gone); i++)
        peers_add(&p, ctx->eager_gone[i]);
    if (p.n)
        qsort(p.ids, p.n, sizeof(*p.ids), u32_cmp);
    size_t k = 0;
    for (size_t i = 0; i < p.n; i++) {
        uint32_t id = p.ids[i];
        /* an id of this node's own (a connection to itself) is not a peer */
        if (id && (!k || id != p.ids[k - 1]) && id != ctx->node_id && id != ctx->joined_id &&
            !cfx__node_gone(ctx, id))
            p.ids[k++] = id;
    }
    p.n = k;
    return p;
}

/* The round's deadline for the queries (see the top): a restarted
 * coordinator may hold one until the rejoin window of its start ends. */
static uint64_t ask_deadline(struct cfx_context *ctx)
{
    uint64_t ms = ctx->cfg.timeout_ms > 0 ? (uint64_t)ctx->cfg.timeout_ms : 30000;
    uint64_t window = CFX_PROTO_RECONNECT_MAX_MS + cfx__ctl_dead_after_ms(ctx->ctl) + 1000;
    ms = CFX_MAX(ms, window);
    return cfx__deadline_ns((int)CFX_MIN(ms, (uint64_t)INT32_MAX));
}

/* Ask the coordinator about each of @p p: the ones that died or left while
 * this node was away go to the progress thread (see the top). */
static void ask_peers(struct cfx_context *ctx, struct cfx_reannounce *ra, const struct peers *p)
{
    uint64_t deadline = ask_deadline(ctx);
    size_t missed = 0;
    for (size_t i = 0; i < p->n && !stopping(ra); i++) {
        struct cfx_node_rec rec;
        if (cfx__now_ns() >= deadline) {
            CFX_LOG(WARN, CTL, "node %u: on rejoining, no time left to ask coordinator %s "
                    "about node %u and %zu more peers; what waits on them here learns of "
                    "their going by their connections only", ctx->node_id, ctx->cfg.coord,
                    p->ids[i], p->n - i - 1);
            break;
        }
        int rc = cfx__ctl_node_get(ctx->ctl, p->ids[i], &rec, deadline);
        if (rc == CFX_OK && rec.alive)
            continue;
        if (rc == CFX_ERR_NOT_FOUND) { /* forgotten since: gone for good, how unknown */
            rec = (struct cfx_node_rec){ .node_id = p->ids[i] };
        } else if (rc == CFX_ERR_CANCELED) { /* the context is being destroyed */
            break;
        } else if (rc != CFX_OK) {
            CFX_LOG(WARN, CTL, "node %u: on rejoining, cannot ask coordinator %s about node "
                    "%u: %s; what waits on it here learns of its going by its connection "
                    "only", ctx->node_id, ctx->cfg.coord, p->ids[i], cfx_last_error());
            continue;
        }
        CFX_LOG(INFO, CTL, "node %u: node %u %s while this node was away from coordinator "
                "%s (not heard then)", ctx->node_id, rec.node_id,
                rc == CFX_ERR_NOT_FOUND    ? "went (not known to the coordinator any more)"
                : rec.flags & CFX_NODE_F_LEFT ? "left the cluster"
                                             : "died", ctx->cfg.coord);
        pthread_mutex_lock(&ctx->lock);
        rc = cfx__cmd_new(ctx, CFX_CMD_NODE_MISSED, NULL, &rec);
        pthread_mutex_unlock(&ctx->lock);
        if (rc == CFX_OK)
            missed++;
        else
            CFX_LOG(ERR, CTL, "node %u: out of memory: node %u's going not handled here",
                    ctx->node_id, rec.node_id);
    }
    if (missed)
        CFX_LOG(WARN, CTL, "node %u: %zu of the %zu peers it dealt with went while it was away "
                "from coordinator %s; what waited on them here fails now", ctx->node_id,
                missed, p->n, ctx->cfg.coord);
}

/* Copy out what to announce (ctx->lock held). */
static struct announcement *collect(struct cfx_context *ctx, size_t *n)
{
    struct announcement *a = calloc(ctx->store.count ? ctx->store.count : 1, sizeof(*a));
    size_t k = 0;
    if (!a)
        return NULL;
    for (unsigned b = 0; b < CFX_STORE_BUCKETS; b++) {
        for (struct cfx_obj *o = ctx->store.buckets[b]; o && k < ctx->store.count; o = o->hnext) {
            /* What this node put, and the copies it got through the
             * directory, announced as copies of their putter's put (never
             * as this node's own: that would make it the putter). */
            bool copy = !o->owned && !o->ephemeral && !o->withdrawn && !o->unrecorded &&
                        o->putter_node && o->size;
            if (!o->complete || o->deleting || o->releasing || o->p2p || (!o->owned && !copy))
                continue;
            struct announcement *x = &a[k];
            x->id = o->id;
            x->seq = o->seq;
            x->copy_of = copy ? o->putter_node : 0;
            x->tag = o->put_tag;
            x->size = o->size;
            x->chunk_size = o->chunk_size;
            if (copy) {
                k++;
                continue;
            }
            /* Small host objects travel inline again, as cfx_put sends them. */
            if (o->size && o->size <= ctx->cfg.inline_max && o->memtype == CFX_MEMTYPE_HOST &&
                (x->data = malloc((size_t)o->size)))
                memcpy(x->data, o->buf, (size_t)o->size);
            k++;
        }
    }
    *n = k;
    return a;
}

/* Test hook (see the top): ctx->lock held. */
static void hold_for_delete(struct cfx_context *ctx, struct cfx_reannounce *ra)
{
    uint64_t deletes = ctx->deletes_done;
    uint64_t deadline = cfx__deadline_ns(ctx->cfg.timeout_ms > 0 ? ctx->cfg.timeout_ms : 30000);
    ctx->reannounce_held = true;
    pthread_cond_broadcast(&ctx->obj_cond);
    CFX_LOG(WARN, CTL, "node %u: test hook: the re-announce waits for a cfx_delete",
            ctx->node_id);
    while (ctx->deletes_done == deletes && !stopping(ra) && cfx__obj_wait(ctx, deadline))
        ;
}

/* The entry of @p x is still the one collected and not being deleted: mark
 * it reannouncing (true), else skip it (false). */
static bool announce_begin(struct cfx_context *ctx, const struct announcement *x)
{
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *o = cfx__store_find(&ctx->store, &x->id);
    bool live = o && o->seq == x->seq && !o->deleting;
    if (live)
        o->reannouncing = true;
    pthread_mutex_unlock(&ctx->lock);
    return live;
}

static void announce_end(struct cfx_context *ctx, const struct announcement *x, bool ok)
{
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *o = cfx__store_find(&ctx->store, &x->id);
    if (o && o->seq == x->seq) { /* a delete of it waited for this */
        o->reannouncing = false;
        if (ok && !o->deleting)
            o->announced = true;
        pthread_cond_broadcast(&ctx->obj_cond);
    }
    pthread_mutex_unlock(&ctx->lock);
}

static void announce_all(struct cfx_context *ctx, struct cfx_reannounce *ra)
{
    size_t n = 0, done = 0, gone = 0;

    /* taken at the rejoin, as the id changed (cfx__reannounce_on_rejoined) */
    pthread_mutex_lock(&ra->mu);
    struct peers peers = ra->peers;
    bool moved = ra->moved;
    ra->peers = (struct peers){ 0 };
    ra->moved = false;
    pthread_mutex_unlock(&ra->mu);
    if (moved) {
        ask_peers(ctx, ra, &peers);
        peers.n = 0;
    }
    pthread_mutex_lock(&ctx->lock);
    struct announcement *a = collect(ctx, &n);
    if (a && ctx->reannounce_hold)
        hold_for_delete(ctx, ra);
    pthread_mutex_unlock(&ctx->lock);
    if (!a) {
        CFX_LOG(ERR, CTL, "node %u: out of memory re-announcing objects", ctx->node_id);
        ask_peers(ctx, ra, &peers);
        free(peers.ids);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (stopping(ra))
            break;
        if (!announce_begin(ctx, &a[i])) {
            gone++; /* deleted since it was collected */
            continue;
        }
        /* flagged as a repeat: a put of it still in flight (cfx_put waits
         * for the reconnect and sends it again) and this announcement are
         * the same put, and whichever comes second is acknowledged */
        uint64_t deadline = cfx__deadline_ns(ctx->cfg.timeout_ms > 0 ? ctx->cfg.timeout_ms
                                                                      : 30000);
        int rc = a[i].copy_of
                     ? cfx__ctl_obj_put_copy(ctx->ctl, &a[i].id, a[i].size, a[i].chunk_size,
                                             a[i].copy_of, a[i].tag, deadline)
                     : cfx__ctl_obj_put_own(ctx->ctl, &a[i].id, a[i].size, a[i].chunk_size,
                                            a[i].data, a[i].seq, deadline);
        if (a[i].copy_of && rc == CFX_ERR_EXISTS) {
            /* the id names another put by now: this copy is of none */
            announce_end(ctx, &a[i], false);
            pthread_mutex_lock(&ctx->lock);
            struct cfx_obj *o = cfx__store_find(&ctx->store, &a[i].id);
            if (o && o->seq == a[i].seq)
                cfx__copy_withdrawn(ctx, o);
            pthread_mutex_unlock(&ctx->lock);
            gone++;
            continue;
        }
        announce_end(ctx, &a[i], rc == CFX_OK || rc == CFX_ERR_EXISTS);
        if (rc == CFX_OK || rc == CFX_ERR_EXISTS) {
            done++;
        } else {
            char hex[CFX_OBJECT_ID_HEX_LEN];
            cfx_object_id_to_hex(&a[i].id, hex);
            CFX_LOG(WARN, CTL, "node %u: cannot re-announce object %s: %s", ctx->node_id, hex,
                    cfx_last_error());
        }
    }
    for (size_t i = 0; i < n; i++)
        free(a[i].data);
    free(a);
    CFX_LOG(INFO, CTL, "node %u: re-announced %zu of %zu objects to coordinator %s (%zu "
            "deleted meanwhile)", ctx->node_id, done, n, ctx->cfg.coord, gone);
    pthread_mutex_lock(&ctx->lock);
    ctx->reannounce_rounds++;
    pthread_cond_broadcast(&ctx->obj_cond);
    pthread_mutex_unlock(&ctx->lock);
    /* the id kept: a restart's queries may wait for its window (see the top) */
    ask_peers(ctx, ra, &peers);
    free(peers.ids);
}

static void *reannounce_thread(void *arg)
{
    struct cfx_reannounce *ra = arg;
    struct cfx_context *ctx = ra->ctx;

    pthread_mutex_lock(&ra->mu);
    for (;;) {
        while (!ra->pending && !ra->stop)
            pthread_cond_wait(&ra->cond, &ra->mu);
        if (ra->stop)
            break;
        ra->pending = false;
        pthread_mutex_unlock(&ra->mu);
        announce_all(ctx, ra);
        pthread_mutex_lock(&ra->mu);
    }
    pthread_mutex_unlock(&ra->mu);
    return NULL;
}

/* ctx->reannounce, made on the first rejoin (ctx->lock held); NULL once
 * the context is being destroyed, or out of memory. */
static struct cfx_reannounce *ra_of(struct cfx_context *ctx)
{
    struct cfx_reannounce *ra = ctx->reannounce;
    if (ra == &reannounce_closed)
        return NULL;
    if (!ra) {
        ra = calloc(1, sizeof(*ra));
        if (!ra) {
            CFX_LOG(ERR, CTL, "node %u: out of memory: objects not re-announced",
                    ctx->node_id);
            return NULL;
        }
        ra->ctx = ctx;
        pthread_mutex_init(&ra->mu, NULL);
        pthread_cond_init(&ra->cond, NULL);
        ctx->reannounce = ra;
    }
    return ra;
}

/*
 * The client thread, as the rejoin succeeded and before the calls waiting
 * for it go on: the node answers to its new id from now on.  It took it on
 * the re-announce thread before, so a peer that learnt the new id from a
 * put this node made at once (a task's result) could connect while the
 * data plane still proved the old one, be refused ("does not prove the
 * cluster token for the node id it claims"), and its get wait for another
 * holder until its deadline.  The peers to ask about are taken first, as
 * adopting the id forgets which connections ended meanwhile.
 */
void cfx__reannounce_on_rejoined(void *arg)
{
    struct cfx_context *ctx = arg;

    pthread_mutex_lock(&ctx->lock);
    struct cfx_reannounce *ra = ra_of(ctx);
    if (!ra) {
        pthread_mutex_unlock(&ctx->lock);
        return;
    }
    struct peers p = known_peers(ctx);
    bool moved = adopt_node_id(ctx);
    pthread_mutex_lock(&ra->mu);
    /* a round not yet run for an earlier rejoin asks about its peers too */
    for (size_t i = 0; i < p.n; i++) {
        size_t k = 0;
        while (k < ra->peers.n && ra->peers.ids[k] != p.ids[i])
            k++;
        if (k == ra->peers.n) /* each asked about once */
            peers_add(&ra->peers, p.ids[i]);
    }
    ra->moved = ra->moved || moved;
    pthread_mutex_unlock(&ra->mu);
    pthread_mutex_unlock(&ctx->lock);
    free(p.ids);
}

void cfx__reannounce_on_reconnected(void *arg)
{
    struct cfx_context *ctx = arg;

    pthread_mutex_lock(&ctx->lock);
    struct cfx_reannounce *ra = ra_of(ctx);
    pthread_mutex_unlock(&ctx->lock);
    if (!ra)
        return;

    pthread_mutex_lock(&ra->mu);
    ra->pending = true;
    if (!ra->started && !ra->stop) {
        if (pthread_create(&ra->thread, NULL, reannounce_thread, ra) == 0) {
            ra->started = true;
            pthread_setname_np(ra->thread, "cfx-reannounce");
        } else {
            CFX_LOG(ERR, CTL, "node %u: no thread to re-announce objects", ctx->node_id);
        }
    }
    pthread_cond_signal(&ra->cond);
    pthread_mutex_unlock(&ra->mu);
}

void cfx__reannounce_stop(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    struct cfx_reannounce *ra = ctx->reannounce;
    ctx->reannounce = &reannounce_closed;
    pthread_mutex_unlock(&ctx->lock);
    if (ra && ra != &reannounce_closed) {
        pthread_mutex_lock(&ra->mu);
        ra->stop = true;
        pthread_mutex_unlock(&ra->mu);
        pthread_mutex_lock(&ctx->lock);
        pthread_cond_broadcast(&ctx->obj_cond); /* a held round (test hook) */
        pthread_mutex_unlock(&ctx->lock);
    }
    if (!ra || ra == &reannounce_closed)
        return;
    pthread_mutex_lock(&ra->mu);
    ra->stop = true;
    pthread_cond_signal(&ra->cond);
    bool started = ra->started;
    pthread_mutex_unlock(&ra->mu);
    if (started) {
        /* a query parked in a restarted coordinator (ask_peers) ends now and
         * none starts: the destroy does not wait for the rejoin window */
        cfx__ctl_interrupt(ctx->ctl, true);
        pthread_join(ra->thread, NULL);
        cfx__ctl_interrupt(ctx->ctl, false);
    }
    pthread_cond_destroy(&ra->cond);
    pthread_mutex_destroy(&ra->mu);
    free(ra->peers.ids);
    free(ra);
}

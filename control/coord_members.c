/*
 * Coordinator membership: join, leave, heartbeats, dead-node detection and
 * the node_dead events that tell every live member about it.
 *
 * Node ids start at 1 and are never reused: with a state directory the
 * high-water mark is recorded (in batches of COORD_IDS_BATCH) before an id is
 * handed out, so a restarted coordinator continues above it.  The
 * coordinator chooses every id: a JOIN that names a previous id gets it back
 * only when it is an id of before the restart (below the recorded mark),
 * within the rejoin window, and not yet taken back by anyone since the
 * restart; any other JOIN gets the next fresh id.  So a client can neither
 * push the ids (and the index) up nor take an id that was ever given out in
 * this coordinator's life.  The id index is a hash of the records held
 * (alive, plus dead ones still listed), so its memory follows the number of
 * records and at most max_nodes members are alive at once.
 * A node is dead when it leaves,
 * when its connection closes, or when it has been silent for dead_after_ms;
 * death is final (a restarted process joins again under a new id).  Dead
 * records stay listed (alive = 0, CFX_NODE_F_LEFT when it left in good
 * order) for dead_keep_ms after death, and never more than COORD_DEAD_KEEP
 * of them; then they are forgotten (node_get answers CFX_ERR_NOT_FOUND).
 *
 * After a restart the coordinator knows no member; the nodes of before come
 * back one by one, in no particular order.  Until one has, "not known" does
 * not mean "dead": a group rank that took it so skipped a live rank's
 * bootstrap object as stale and waited for one that never came.  So a
 * NODE_GET about an id of before the restart (below the recorded mark) that
 * has not rejoined waits, until the node rejoins (the reply is its record) or
 * its rejoin window ends (not found, as for any node gone for good).  The
 * window is the heartbeat rule applied to the restart: a live client tries
 * again at least every CFX_PROTO_RECONNECT_MAX_MS, and then may be silent
 * for dead_after_ms like any member before it counts as dead.
 */
#include "control/coord_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

void cfx__coord_members_init(struct cfx_coord *co)
{
    cfx_list_init(&co->nodes);
    for (uint32_t i = 0; i < COORD_NODE_WAIT_BUCKETS; i++)
        cfx_list_init(&co->node_waits[i]);
    co->node_wait_key = cfx__random_u64();
    co->next_node_id = 1;
}

/* The bucket of the NODE_GETs waiting for @p node_id. */
static struct cfx_list *node_wait_bucket(struct cfx_coord *co, uint32_t node_id)
{
    uint64_t h = ((uint64_t)node_id ^ co->node_wait_key) * 0x9e3779b97f4a7c15ull;
    return &co->node_waits[(h >> 32) & (COORD_NODE_WAIT_BUCKETS - 1)];
}

static void node_wait_free(struct coord_node_wait *w)
{
    cfx_list_del(&w->link);
    cfx_list_del(&w->conn_link);
    w->conn->nnode_waits--;
    w->conn->coord->nnode_waits--;
    free(w);
}

static void node_waits_answer_in(struct cfx_coord *co, struct cfx_list *bucket, uint32_t node_id,
                                 const struct coord_node *n)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, bucket) {
        struct coord_node_wait *w = cfx_list_entry(pos, struct coord_node_wait, link);
        if (n && w->node_id != node_id)
            continue;
        if (n) {
            struct cfx_msg r = { .type = CFX_MSG_NODE_REPLY, .req_id = w->req_id };
            cfx__coord_node_fill(co, n, &r.u.join);
            cfx__coord_send(w->conn, &r);
        } else {
            cfx__coord_reply_err(w->conn, w->req_id, CFX_ERR_NOT_FOUND,
                                 "node %u is not known to coordinator %s: it did not rejoin "
                                 "within %u ms of the coordinator's restart", w->node_id,
                                 co->addr, cfx__coord_rejoin_ms(co));
        }
        node_wait_free(w);
    }
}

/* Answer the NODE_GETs waiting for @p node_id: with @p n's record once it
 * rejoined; all of them, not found, when @p n is NULL (the window ended). */
static void node_waits_answer(struct cfx_coord *co, uint32_t node_id, const struct coord_node *n)
{
    if (!co->nnode_waits)
        return;
    if (n) {
        node_waits_answer_in(co, node_wait_bucket(co, node_id), node_id, n);
        return;
    }
    for (uint32_t i = 0; i < COORD_NODE_WAIT_BUCKETS; i++)
        node_waits_answer_in(co, &co->node_waits[i], 0, NULL);
}

void cfx__coord_members_conn_gone(struct cfx_coord *co, struct coord_conn *c)
{
    (void)co;
    while (!cfx_list_empty(&c->node_waits))
        node_wait_free(cfx_list_entry(c->node_waits.next, struct coord_node_wait, conn_link));
}

void cfx__coord_members_fini(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    for (uint32_t i = 0; i < COORD_NODE_WAIT_BUCKETS; i++)
        cfx_list_for_each_safe(pos, tmp, &co->node_waits[i]) {
            struct coord_node_wait *w = cfx_list_entry(pos, struct coord_node_wait, link);
            cfx_list_del(&w->link);
            cfx_list_del(&w->conn_link);
            free(w);
        }
    co->nnode_waits = 0;
    cfx_list_for_each_safe(pos, tmp, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        cfx_list_del(&n->link);
        free(n);
    }
    free(co->by_id);
    co->by_id = NULL;
    co->by_id_cap = co->by_id_count = 0;
    free(co->reclaimed);
    co->reclaimed = NULL;
    co->nreclaimed = 0;
}

/* ---- the id index: linear probing, backward-shift deletion ---------------- */

static uint32_t id_slot(uint32_t id, uint32_t cap)
{
    return (id * 2654435761u) & (cap - 1); /* Knuth's multiplicative hash */
}

static void index_put(struct coord_node **tab, uint32_t cap, struct coord_node *n)
{
    uint32_t i = id_slot(n->rec.node_id, cap);
    while (tab[i])
        i = (i + 1) & (cap - 1);
    tab[i] = n;
}

/* Resize to @p cap slots (a power of two above the count). */
static int index_resize(struct cfx_coord *co, uint32_t cap)
{
    struct coord_node **tab = calloc(cap, sizeof(*tab));
    if (!tab)
        return CFX_ERR_NOMEM;
    for (uint32_t i = 0; i < co->by_id_cap; i++)
        if (co->by_id[i])
            index_put(tab, cap, co->by_id[i]);
    free(co->by_id);
    co->by_id = tab;
    co->by_id_cap = cap;
    return CFX_OK;
}

/* Room for one more record: at most half full.  The record count is bounded
 * (max_nodes alive + COORD_DEAD_KEEP dead), so the doubling is too. */
static int index_reserve(struct cfx_coord *co)
{
    if ((uint64_t)(co->by_id_count + 1) * 2 <= co->by_id_cap)
        return CFX_OK;
    return index_resize(co, co->by_id_cap ? co->by_id_cap * 2 : 64);
}

static void index_add(struct cfx_coord *co, struct coord_node *n)
{
    index_put(co->by_id, co->by_id_cap, n);
    co->by_id_count++;
}

static void index_del(struct cfx_coord *co, uint32_t id)
{
    uint32_t mask = co->by_id_cap - 1, i, j;
    if (!co->by_id_cap)
        return;
    for (i = id_slot(id, co->by_id_cap); co->by_id[i]; i = (i + 1) & mask)
        if (co->by_id[i]->rec.node_id == id)
            break;
    if (!co->by_id[i])
        return;
    co->by_id[i] = NULL;
    co->by_id_count--;
    /* shift back the entries of the cluster that probed past the hole */
    for (j = (i + 1) & mask; co->by_id[j]; j = (j + 1) & mask) {
        uint32_t home = id_slot(co->by_id[j]->rec.node_id, co->by_id_cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            co->by_id[i] = co->by_id[j];
            co->by_id[j] = NULL;
            i = j;
        }
    }
    /* shrink when a quarter full, so a past crowd does not keep its slots */
    if (co->by_id_cap > 64 && (uint64_t)co->by_id_count * 8 < co->by_id_cap)
        (void)index_resize(co, co->by_id_cap / 2); /* on failure the big table stays */
}

/* Forget a dead record. */
static void node_forget(struct cfx_coord *co, struct coord_node *n)
{
    index_del(co, n->rec.node_id);
    cfx_list_del(&n->link);
    co->nodes_dead--;
    if (n->rec.flags & CFX_NODE_F_LEFT)
        co->nodes_left--;
    free(n);
}

/* ---- ids of before a restart taken back ---------------------------------- */

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static bool reclaimed_has(const struct cfx_coord *co, uint32_t id)
{
    return co->nreclaimed &&
           bsearch(&id, co->reclaimed, co->nreclaimed, sizeof(id), u32_cmp) != NULL;
}

/* Record @p id as taken back (kept sorted; the window bounds how long). */
static int reclaimed_add(struct cfx_coord *co, uint32_t id)
{
    if (co->nreclaimed == COORD_REJOIN_MAX)
        return CFX_ERR_NO_RESOURCE;
    uint32_t *p = realloc(co->reclaimed, (co->nreclaimed + 1) * sizeof(*p));
    if (!p)
        return CFX_ERR_NOMEM;
    uint32_t i = co->nreclaimed;
    while (i > 0 && p[i - 1] > id) {
        p[i] = p[i - 1];
        i--;
    }
    p[i] = id;
    co->reclaimed = p;
    co->nreclaimed++;
    return CFX_OK;
}

void cfx__coord_members_load(struct cfx_coord *co)
{
    void *val = NULL;
    size_t len = 0;
    if (cfx__coord_state_get(co, COORD_IDS_KEY, &val, &len, NULL) != CFX_OK)
        return;
    if (len == 4) {
        const uint8_t *p = val;
        uint32_t mark = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                        (uint32_t)p[3] << 24;
        if (mark > co->next_node_id) {
            co->next_node_id = mark;
            co->ids_reserved = mark;
            co->restart_mark = mark;
            co->rejoin_until_ns = cfx__now_ns() +
                (uint64_t)cfx__coord_rejoin_ms(co) * 1000000ull;
            CFX_LOG(INFO, CTL, "coordinator %s: node ids continue at %u", co->addr, mark);
        }
    }
    free(val);
}

void cfx__coord_members_of_before(struct cfx_coord *co, uint32_t mark)
{
    if (mark <= co->restart_mark)
        return; /* the id record said as much (or more) */
    CFX_LOG(WARN, CTL, "coordinator state %s: %s node id record, yet durable objects name "
            "nodes up to %u as their putters: ids below %u count as of before the restart, "
            "new ones continue above", co->state_dir, co->restart_mark ? "a lower" : "no",
            mark - 1, mark);
    co->restart_mark = mark;
    if (mark > co->next_node_id)
        co->next_node_id = mark; /* ids_reserve() records the mark at the next join */
    if (!co->rejoin_until_ns)
        co->rejoin_until_ns = cfx__now_ns() +
            (uint64_t)cfx__coord_rejoin_ms(co) * 1000000ull;
    /* ids above the putters' were given too, to nodes that put nothing
     * durable: a newcomer may get one that a node of before has not taken
     * back yet, as without a state directory (coord.c, stateless_rejoin) */
    co->ids_of_before = 1;
}

/* Record that ids below @p upto are taken (before handing one out). */
static int ids_reserve(struct cfx_coord *co, uint32_t upto)
{
    if (upto <= co->ids_reserved)
        return CFX_OK;
    uint32_t mark = upto > UINT32_MAX - COORD_IDS_BATCH ? UINT32_MAX : upto + COORD_IDS_BATCH;
    uint8_t b[4] = { (uint8_t)mark, (uint8_t)(mark >> 8), (uint8_t)(mark >> 16),
                     (uint8_t)(mark >> 24) };
    int rc = cfx__coord_state_put(co, COORD_IDS_KEY, b, sizeof(b), NULL);
    if (rc == CFX_OK)
        co->ids_reserved = mark;
    return rc;
}

struct coord_node *cfx__coord_node_find(struct cfx_coord *co, uint32_t node_id)
{
    if (node_id == 0 || !co->by_id_cap)
        return NULL;
    for (uint32_t i = id_slot(node_id, co->by_id_cap); co->by_id[i];
         i = (i + 1) & (co->by_id_cap - 1))
        if (co->by_id[i]->rec.node_id == node_id)
            return co->by_id[i];
    return NULL;
}

void cfx__coord_node_fill(struct cfx_coord *co, const struct coord_node *n,
                          struct cfx_node_rec *out)
{
    uint64_t ms = (cfx__now_ns() - n->last_seen_ns) / 1000000ull;
    (void)co;
    *out = n->rec;
    out->last_seen_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

void cfx__coord_join(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct coord_node *n;
    uint32_t id = co->next_node_id;
    uint32_t want = m->u.join.node_id; /* previous id of a rejoining node, 0 if none */
    const uint32_t asked = want;

    if (co->nodes_alive >= co->max_nodes) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s: max_nodes reached (%u members alive; "
                             "conflux-coord --max-nodes)", co->addr, co->max_nodes);
        return;
    }
    /* Only an id of before the restart, in the rejoin window, once. */
    if (want && want < co->restart_mark && co->rejoin_until_ns &&
        cfx__now_ns() < co->rejoin_until_ns && !cfx__coord_node_find(co, want) &&
        !reclaimed_has(co, want))
        id = want;
    else
        want = 0;
    if (id == 0 || id == UINT32_MAX) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s has run out of node ids", co->addr);
        return;
    }
    /* a rejoin's id is below the mark; the mark itself may not be recorded
     * yet (cfx__coord_members_of_before) */
    if (ids_reserve(co, CFX_MAX(id + 1, co->next_node_id)) != CFX_OK) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_IO,
                             "coordinator %s cannot record node ids in its state directory",
                             co->addr);
        return;
    }
    if (want) {
        int rc = reclaimed_add(co, want);
        if (rc != CFX_OK) {
            cfx__coord_reply_err(c, m->req_id, rc,
                                 rc == CFX_ERR_NO_RESOURCE
                                     ? "coordinator %s: rejoin cap reached (%u ids taken back "
                                       "since the restart)"
                                     : "coordinator %s is out of memory (%u ids taken back)",
                                 co->addr, co->nreclaimed);
            return;
        }
    }
    n = calloc(1, sizeof(*n));
    if (!n || index_reserve(co) != CFX_OK) {
        free(n);
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM,
                             "coordinator %s is out of memory", co->addr);
        return;
    }
    n->rec = m->u.join;
    n->rec.node_id = id;
    n->rec.alive = 1;
    n->rec.flags &= CFX_NODE_F_OBSERVER; /* the only flag a member says of itself */
    n->rec.last_seen_ms = 0;
    snprintf(n->rec.ctl_addr, sizeof(n->rec.ctl_addr), "%s", c->peer);
    n->last_seen_ns = cfx__now_ns();
    n->conn = c;
    cfx_list_init(&n->holdings);
    /* co->nodes stays in id order, which the listings page by (a cursor of
     * the last id sent): a node taking back its id of before a restart goes
     * before the ids given since, not after them (where a paged listing
     * skipped it) */
    struct cfx_list *at = co->nodes.prev;
    while (at != &co->nodes && cfx_list_entry(at, struct coord_node, link)->rec.node_id > id)
        at = at->prev;
    cfx_list_add_head(&n->link, at);
    index_add(co, n);
    if (id >= co->next_node_id)
        co->next_node_id = id + 1;
    co->nodes_alive++;
    co->joins++;
    cfx__coord_alive_publish(co);
    c->node = n;
    c->state = COORD_CONN_NODE;
    /* declared dead while only paused or cut off: its runs of the tasks
     * that moved meanwhile are fenced before anything it sends is read */
    if (asked && asked != id)
        cfx__coord_task_rejoined(co, n, asked);
    CFX_LOG(INFO, CTL, "node %u %s: name '%s', host '%s' (%s), pid %u, from %s%s", id,
            want ? "rejoined" : "joined", n->rec.name, n->rec.host, n->rec.host_id, n->rec.pid,
            c->peer, (n->rec.flags & CFX_NODE_F_OBSERVER) ? " (observer)" : "");
    node_waits_answer(co, id, n);

    struct cfx_msg r = { .type = CFX_MSG_JOIN_REPLY, .req_id = m->req_id };
    r.u.join_reply.node_id = id;
    r.u.join_reply.heartbeat_ms = co->heartbeat_ms;
    r.u.join_reply.dead_after_ms = co->dead_after_ms;
    cfx__coord_send(c, &r);
}

static void node_kill(struct cfx_coord *co, struct coord_node *n, const char *why, int close_conn)
{
    struct coord_conn *c = n->conn;
    struct cfx_list *pos;

    if (!n->rec.alive)
        return;
    n->rec.alive = 0;
    n->dead_ns = cfx__now_ns();
    if (!close_conn) {
        n->rec.flags |= CFX_NODE_F_LEFT;
        co->nodes_left++;
    }
    co->nodes_alive--;
    cfx__coord_alive_publish(co);
    co->nodes_dead++;
    /* Beyond the listing limit the oldest dead record goes now, not at the
     * next tick: JOIN/LEAVE in a loop must not pile records up between. */
    if (co->nodes_dead > COORD_DEAD_KEEP) {
        cfx_list_for_each(pos, &co->nodes) {
            struct coord_node *o = cfx_list_entry(pos, struct coord_node, link);
            if (!o->rec.alive && o != n) {
                node_forget(co, o);
                break;
            }
        }
    }
    if (close_conn)
        CFX_LOG(WARN, CTL, "node %u ('%s', %s) is dead: %s", n->rec.node_id, n->rec.name,
                n->rec.ctl_addr, why);
    else
        CFX_LOG(INFO, CTL, "node %u ('%s', %s) %s", n->rec.node_id, n->rec.name,
                n->rec.ctl_addr, why);

    cfx__coord_dir_node_gone(co, n);
    cfx__coord_task_node_gone(co, n);
    if (c) {
        cfx__coord_dir_conn_gone(co, c);
        c->node = NULL;
        c->state = COORD_CONN_READY;
        n->conn = NULL;
        if (close_conn)
            cfx__coord_conn_fail(c);
    }

    /* The event's request id says why: CFX_PROTO_EV_DIED (0), or
     * CFX_PROTO_EV_LEFT for a node that said goodbye (nothing it had
     * promised is lost: peers must not treat it as a failure). */
    struct cfx_msg ev = { .type = CFX_MSG_EV_NODE_DEAD,
                          .req_id = close_conn ? CFX_PROTO_EV_DIED : CFX_PROTO_EV_LEFT };
    ev.u.node_dead.node_id = n->rec.node_id;
    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *o = cfx_list_entry(pos, struct coord_node, link);
        if (o->rec.alive && o->conn)
            cfx__coord_send(o->conn, &ev);
    }
}

void cfx__coord_node_kill(struct cfx_coord *co, struct coord_node *n, const char *why)
{
    node_kill(co, n, why, 1);
}

void cfx__coord_leave(struct cfx_coord *co, struct coord_conn *c)
{
    if (c->node)
        node_kill(co, c->node, "left the cluster", 0);
}

/*
 * The rejoin window is over at @p now: whoever of before has not rejoined is
 * gone.  Their durable records go first: a NODE_GET answered NOT_FOUND below
 * is on the wire at once, and its asker may look for them the moment it
 * hears.  Run by the tick, and by a NODE_GET that comes between the end of
 * the window and the next tick (it was answered NOT_FOUND at once, with the
 * records still there).
 */
static void rejoin_end(struct cfx_coord *co, uint64_t now)
{
    if (!co->rejoin_until_ns || now < co->rejoin_until_ns)
        return;
    co->rejoin_until_ns = 0;
    cfx__coord_dir_rejoin_over(co);
    node_waits_answer(co, 0, NULL);
    free(co->reclaimed); /* no id of before can be taken back any more */
    co->reclaimed = NULL;
    co->nreclaimed = 0;
}

void cfx__coord_members_tick(struct cfx_coord *co, uint64_t now)
{
    struct cfx_list *pos, *tmp;
    uint64_t limit = (uint64_t)co->dead_after_ms * 1000000ull;
    char why[96];

    /*
     * Time the loop could not read is nobody's silence.  A stall (durable
     * puts waiting on a slow disk, the machine swapping) delays this tick
     * and the reading of heartbeats alike; without this, the first tick
     * after a stall longer than dead_after_ms would declare every member
     * dead whose beats still wait in its socket.  So each alive member is
     * credited with the part of the gap since the last tick beyond two
     * periods.  A member that really died is found that much later.
     */
    if (co->last_tick_ns && now - co->last_tick_ns > 2ull * COORD_TICK_MS * 1000000ull) {
        uint64_t stall = now - co->last_tick_ns - (uint64_t)COORD_TICK_MS * 1000000ull;
        cfx_list_for_each(pos, &co->nodes) {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            if (n->rec.alive)
                n->last_seen_ns = CFX_MIN(now, n->last_seen_ns + stall);
        }
        CFX_LOG(WARN, CTL, "coordinator %s: the loop was stalled for %llu ms; members are "
                "not blamed for it", co->addr, (unsigned long long)(stall / 1000000ull));
    }
    co->last_tick_ns = now;

    rejoin_end(co, now);

    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        /* its heartbeats wait unread behind its requests while its
         * replies drain (coord.c): alive while its socket drains */
        if (n->rec.alive && n->conn && cfx__coord_conn_draining(n->conn))
            n->last_seen_ns = now;
        if (n->rec.alive && now - n->last_seen_ns > limit) {
            snprintf(why, sizeof(why), "no heartbeat for %llu ms (limit %u ms)",
                     (unsigned long long)((now - n->last_seen_ns) / 1000000ull),
                     co->dead_after_ms);
            node_kill(co, n, why, 1);
        }
    }
    /* Forget dead records older than dead_keep_ms, and the oldest beyond
     * the listing limit. */
    uint64_t keep = (uint64_t)co->dead_keep_ms * 1000000ull;
    cfx_list_for_each_safe(pos, tmp, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.alive)
            continue;
        if (co->nodes_dead <= COORD_DEAD_KEEP && (now <= n->dead_ns || now - n->dead_ns <= keep))
            continue;
        node_forget(co, n);
    }
}

void cfx__coord_node_get(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    uint32_t id = m->u.node_get.node_id;
    uint64_t now = cfx__now_ns();
    rejoin_end(co, now); /* over since the last tick: its records go before the answer */
    struct coord_node *n = cfx__coord_node_find(co, id);
    if (!n && id != 0 && id < co->restart_mark && co->rejoin_until_ns &&
        now < co->rejoin_until_ns) {
        /* maybe a live node that has not reconnected yet: wait for it,
         * within the caps of parked lookups (coord_waits.c) */
        const uint32_t share = cfx__coord_wait_share(co);
        if (c->nnode_waits >= share) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                                 "coordinator %s: %s (node %u) already has %u queries of nodes "
                                 "that have not rejoined yet waiting, its cap (%u: at most %u "
                                 "a connection, or its share of max_parked %u among %u live "
                                 "members); query of node %u refused", co->addr, c->peer,
                                 c->node ? c->node->rec.node_id : 0, c->nnode_waits, share,
                                 COORD_PARKED_PER_CONN, co->max_parked, co->nodes_alive, id);
            return;
        }
        if (co->nnode_waits >= co->max_parked) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                                 "coordinator %s: max_parked reached (%u queries of nodes that "
                                 "have not rejoined yet wait; conflux-coord --max-parked); "
                                 "query of node %u from %s refused", co->addr, co->nnode_waits,
                                 id, c->peer);
            return;
        }
        struct coord_node_wait *w = calloc(1, sizeof(*w));
        if (!w) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                                 co->addr);
            return;
        }
        w->conn = c;
        w->req_id = m->req_id;
        w->node_id = id;
        cfx_list_add_tail(&w->link, node_wait_bucket(co, id));
        cfx_list_add_tail(&w->conn_link, &c->node_waits);
        c->nnode_waits++;
        co->nnode_waits++;
        CFX_LOG(INFO, CTL, "query of node %u from %s waits for it to rejoin", id, c->peer);
        return;
    }
    if (!n) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "node %u is not known to coordinator %s",
                             m->u.node_get.node_id, co->addr);
        return;
    }
    struct cfx_msg r = { .type = CFX_MSG_NODE_REPLY, .req_id = m->req_id };
    cfx__coord_node_fill(co, n, &r.u.join);
    cfx__coord_send(c, &r);
}

void cfx__coord_nodes_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_node_rec *recs = malloc(CFX_PROTO_NODES_PAGE * sizeof(*recs));
    struct cfx_msg r = { .type = CFX_MSG_NODES_REPLY, .req_id = m->req_id };
    struct cfx_list *pos;
    uint32_t count = 0, last = m->u.list.cursor;

    if (!recs) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM,
                             "coordinator %s is out of memory", co->addr);
        return;
    }
    r.u.page.more = 0;
    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.node_id <= m->u.list.cursor)
            continue;
        if (count == CFX_PROTO_NODES_PAGE) {
            r.u.page.more = 1;
            break;
        }
        cfx__coord_node_fill(co, n, &recs[count]);
        recs[count++].load = n->load;
        last = n->rec.node_id;
    }
    r.u.page.count = count;
    r.u.page.next = last;
    r.u.page.recs_in = recs;
    cfx__coord_send(c, &r);
    free(recs);
}

void cfx__coord_ps_loads_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_msg r = { .type = CFX_MSG_PS_LOADS_REPLY, .req_id = m->req_id };
    struct cfx_list *pos;

    cfx_list_for_each(pos, &co->nodes) {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.node_id <= m->u.ps_cursor || !n->rec.alive || !n->ps.nservers)
            continue;
        if (r.u.ps_loads.node_id) {
            r.u.ps_loads.more = 1;
            break;
        }
        r.u.ps_loads.node_id = n->rec.node_id;
        r.u.ps_loads.ps = n->ps;
    }
    cfx__coord_send(c, &r);
}

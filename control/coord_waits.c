/*
 * What the object directory parks: lookups waiting for a holder of an id,
 * and putters' deletes waiting for the other holders to acknowledge that
 * they dropped their copies (EV_OBJ_GONE -> OBJ_GONE_ACK).
 *
 * Parked lookups.  They sit in a hash table by object id, so that a put,
 * a finished transfer or a withdrawal touches the lookups of its own id
 * only (coord_directory.c, wake_parked); a single list of every parked
 * lookup made each put cost a walk of up to max_parked entries (1.5 ms at
 * 65536).  Ids are chosen by the peers, so the hash is keyed with a random
 * seed: nobody can aim 65536 lookups at the bucket of another node's id.
 * The table doubles with the lookups, keeping about one per bucket.  Each
 * lookup has its deadline (a loop timer) unless it asked for none.
 *
 * Caps.  max_parked bounds the lookups of all members together, and the
 * task waits likewise (coord_task.c).  Each connection (a member: one
 * connection per node) may hold COORD_PARKED_PER_CONN of each, or less,
 * its share of max_parked among the live members, and at least
 * COORD_PARKED_SHARE_MIN: so a few members cannot take the whole budget
 * and leave every other member's wait refused (16 connections of 4096 did,
 * at the default 65536).  Both refusals are CFX_ERR_NO_RESOURCE naming
 * the cap and the node.
 *
 * Waiting deletes.  A putter's delete is answered once every live holder
 * acknowledged, or died (docs/ARCHITECTURE.md, "Delete").  A holder that
 * stopped is declared dead after dead_after_ms; one that goes on beating
 * but never acknowledges (a broken or hostile client) held the delete for
 * ever.  So each waiting delete has a deadline, dead_after_ms plus
 * COORD_DEL_WAIT_MARGIN_MS after the withdrawal, by which a stopped holder
 * is dead.  At it the delete is complete, and the putter is answered
 * CFX_ERR_PEER_FAILED naming the holders that did not acknowledge: those
 * may still answer a get of the withdrawn bytes that reaches them without
 * the directory.  One connection may have COORD_DEL_WAITS_PER_CONN deletes
 * waiting; beyond, a delete is refused (CFX_ERR_NO_RESOURCE, nothing
 * withdrawn).  Acknowledgements find their delete by token in a hash
 * table.
 *
 * The id of a waiting delete is not free yet.  It has left the directory
 * (lookups find nothing, a get waits for a new put), but a put of it from
 * any node is refused CFX_ERR_EXISTS until the delete is answered: a put
 * that succeeded there while a holder had not yet taken the event let that
 * holder answer its own gets of the new object with the withdrawn bytes (a
 * randomized stress saw it a few times a run).  The exception is a holder
 * the delete waits for: its store let its put through only once its copy
 * had left, so that put is its acknowledgement (its own OBJ_GONE_ACK may
 * still be on its way behind it).  Puts find the waits by id in a second
 * hash table, keyed as the parked lookups are.
 *
 * Everything here runs on the coordinator's loop thread.
 */
#include "control/coord_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define PARKED_BUCKETS_INITIAL 256u

static uint32_t parked_hash(const struct cfx_coord *co, const struct cfx_object_id *id)
{
    uint64_t x, y;
    uint32_t z;
    memcpy(&x, id->bytes, sizeof(x));
    memcpy(&y, id->bytes + 8, sizeof(y));
    memcpy(&z, id->bytes + 16, sizeof(z)); /* every byte: a peer picks the ids */
    x ^= co->parked_seed;
    y ^= (uint64_t)z << 32 | z;
    x ^= y * 0x9e3779b97f4a7c15ull;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

int cfx__coord_waits_init(struct cfx_coord *co)
{
    co->parked = malloc(PARKED_BUCKETS_INITIAL * sizeof(*co->parked));
    co->del_waits = malloc(COORD_DEL_WAIT_BUCKETS * sizeof(*co->del_waits));
    co->del_ids = malloc(COORD_DEL_WAIT_BUCKETS * sizeof(*co->del_ids));
    if (!co->parked || !co->del_waits || !co->del_ids) {
        free(co->parked);
        free(co->del_waits);
        free(co->del_ids);
        co->parked = co->del_waits = co->del_ids = NULL;
        return cfx__err(CFX_ERR_NOMEM, "no memory for the directory's waits");
    }
    co->nparked_buckets = PARKED_BUCKETS_INITIAL;
    for (uint32_t i = 0; i < co->nparked_buckets; i++)
        cfx_list_init(&co->parked[i]);
    for (uint32_t i = 0; i < COORD_DEL_WAIT_BUCKETS; i++) {
        cfx_list_init(&co->del_waits[i]);
        cfx_list_init(&co->del_ids[i]);
    }
    co->parked_seed = cfx__random_u64();
    return CFX_OK;
}

static void del_wait_free(struct cfx_coord *co, struct coord_del_wait *w)
{
    cfx__ev_timer_stop(co->loop, &w->timer);
    cfx_list_del(&w->link);
    cfx_list_del(&w->id_link);
    w->conn->ndel_waits--;
    free(w->wait);
    free(w);
}

void cfx__coord_waits_fini(struct cfx_coord *co)
{
    if (co->del_waits) {
        for (uint32_t i = 0; i < COORD_DEL_WAIT_BUCKETS; i++)
            while (!cfx_list_empty(&co->del_waits[i]))
                del_wait_free(co, cfx_list_entry(co->del_waits[i].next, struct coord_del_wait,
                                                 link));
        free(co->del_waits);
        co->del_waits = NULL;
    }
    free(co->del_ids);
    co->del_ids = NULL;
    if (co->parked) {
        for (uint32_t i = 0; i < co->nparked_buckets; i++)
            while (!cfx_list_empty(&co->parked[i]))
                cfx__coord_parked_free(co, cfx_list_entry(co->parked[i].next,
                                                          struct coord_parked, link));
        free(co->parked);
        co->parked = NULL;
    }
}

uint32_t cfx__coord_wait_share(struct cfx_coord *co)
{
    uint32_t share = co->max_parked / (co->nodes_alive ? co->nodes_alive : 1);
    return CFX_MIN(CFX_MAX(share, (uint32_t)COORD_PARKED_SHARE_MIN),
                   (uint32_t)COORD_PARKED_PER_CONN);
}

struct cfx_list *cfx__coord_parked_bucket(struct cfx_coord *co, const struct cfx_object_id *id)
{
    return &co->parked[parked_hash(co, id) & (co->nparked_buckets - 1)];
}

/* Twice the buckets; the order of each id's lookups (oldest first) stays. */
static void parked_grow(struct cfx_coord *co)
{
    uint32_t n = co->nparked_buckets * 2;
    struct cfx_list *nb = malloc((size_t)n * sizeof(*nb));
    if (!nb)
        return; /* longer chains, still correct */
    for (uint32_t i = 0; i < n; i++)
        cfx_list_init(&nb[i]);
    for (uint32_t i = 0; i < co->nparked_buckets; i++)
        while (!cfx_list_empty(&co->parked[i])) {
            struct coord_parked *p = cfx_list_entry(co->parked[i].next, struct coord_parked,
                                                    link);
            cfx_list_del(&p->link);
            cfx_list_add_tail(&p->link, &nb[parked_hash(co, &p->id) & (n - 1)]);
        }
    free(co->parked);
    co->parked = nb;
    co->nparked_buckets = n;
}

void cfx__coord_parked_free(struct cfx_coord *co, struct coord_parked *p)
{
    cfx__ev_timer_stop(co->loop, &p->timer);
    cfx_list_del(&p->link);
    cfx_list_del(&p->conn_link);
    p->conn->nparked--;
    co->nparked--;
    free(p);
}

static void on_parked_timeout(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    struct coord_parked *p = t->arg;
    struct cfx_coord *co = p->conn->coord;
    char hex[CFX_OBJECT_ID_HEX_LEN];
    (void)loop;
    cfx_object_id_to_hex(&p->id, hex);
    /* the id had an object that went (its putter died or deleted it): say
     * so, as the getter may be waiting for what will never come back */
    const struct coord_gone *g = cfx__coord_gone_find(co, &p->id);
    if (g)
        cfx__coord_reply_err(p->conn, p->req_id, CFX_ERR_TIMEOUT,
                             "no holder of object %s appeared within %u ms (the id was put by "
                             "node %u before, and went: %s)", hex, p->timeout_ms, g->putter,
                             g->why);
    else
        cfx__coord_reply_err(p->conn, p->req_id, CFX_ERR_TIMEOUT,
                             "no holder of object %s appeared within %u ms", hex, p->timeout_ms);
    cfx__coord_parked_free(co, p);
}

struct coord_parked *cfx__coord_parked_add(struct cfx_coord *co, struct coord_conn *c,
                                           const struct cfx_msg *m)
{
    const uint32_t me = c->node ? c->node->rec.node_id : 0;
    const uint32_t share = cfx__coord_wait_share(co);
    char hex[CFX_OBJECT_ID_HEX_LEN];

    cfx_object_id_to_hex(&m->u.lookup.id, hex);
    if (c->nparked >= share) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s: node %u already waits for %u objects, its cap "
                             "(%u: at most %u a member, or its share of max_parked %u among "
                             "%u live members); lookup of %s refused", co->addr, me,
                             c->nparked, share, COORD_PARKED_PER_CONN, co->max_parked,
                             co->nodes_alive, hex);
        return NULL;
    }
    if (co->nparked >= co->max_parked) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s: max_parked reached (%u lookups wait; "
                             "conflux-coord --max-parked); node %u's lookup of %s refused",
                             co->addr, co->nparked, me, hex);
        return NULL;
    }
    struct coord_parked *p = calloc(1, sizeof(*p));
    if (!p) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                             co->addr);
        return NULL;
    }
    p->conn = c;
    p->req_id = m->req_id;
    p->id = m->u.lookup.id;
    p->start_ns = cfx__now_ns();
    p->timeout_ms = m->u.lookup.timeout_ms;
    p->nexclude = m->u.lookup.nexclude;
    memcpy(p->exclude, m->u.lookup.exclude, p->nexclude * sizeof(p->exclude[0]));
    cfx__ev_timer_init(&p->timer, on_parked_timeout, p);
    if (p->timeout_ms != CFX_PROTO_TIMEOUT_NONE) {
        /* an id whose object went: the answer that says so (on_parked_timeout)
         * must reach the getter before its own deadline, which ends with
         * ours, so ours ends a tenth sooner (at most 100 ms) */
        uint64_t ms = p->timeout_ms;
        if (cfx__coord_gone_find(co, &p->id))
            ms -= CFX_MIN(ms / 10, 100);
        cfx__ev_timer_start(co->loop, &p->timer, p->start_ns + ms * 1000000ull);
    }
    if (co->nparked >= co->nparked_buckets)
        parked_grow(co);
    cfx_list_add_tail(&p->link, cfx__coord_parked_bucket(co, &p->id));
    cfx_list_add_tail(&p->conn_link, &c->parked);
    c->nparked++;
    co->nparked++;
    return p;
}

/* ---- waiting deletes -------------------------------------------------------- */

static struct cfx_list *del_bucket(struct cfx_coord *co, uint64_t token)
{
    return &co->del_waits[token & (COORD_DEL_WAIT_BUCKETS - 1)];
}

static struct cfx_list *del_id_bucket(struct cfx_coord *co, const struct cfx_object_id *id)
{
    return &co->del_ids[parked_hash(co, id) & (COORD_DEL_WAIT_BUCKETS - 1)];
}

static struct coord_del_wait *del_wait_find(struct cfx_coord *co,
                                            const struct cfx_object_id *id)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, del_id_bucket(co, id)) {
        struct coord_del_wait *w = cfx_list_entry(pos, struct coord_del_wait, id_link);
        if (!memcmp(w->id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return w;
    }
    return NULL;
}

static bool del_wait_has(const struct coord_del_wait *w, uint32_t node)
{
    for (uint32_t i = 0; i < w->nwait; i++)
        if (w->wait[i] == node)
            return true;
    return false;
}

/* "3, 7, 12" (the holders @p w waits for) into @p who. */
static void del_wait_who(const struct coord_del_wait *w, char *who, size_t len)
{
    size_t off = 0;
    who[0] = '\0';
    for (uint32_t i = 0; i < w->nwait && off < len - 16; i++) {
        int k = snprintf(who + off, len - off, "%s%u", i ? ", " : "", w->wait[i]);
        off += k > 0 ? (size_t)k : 0;
    }
    if (off >= len - 16 && w->nwait)
        snprintf(who + off, len - off, ", ...");
}

/* @p w's holder @p node answered or is gone; the delete is answered with the last. */
static void del_wait_drop(struct cfx_coord *co, struct coord_del_wait *w, uint32_t node)
{
    for (uint32_t i = 0; i < w->nwait; i++) {
        if (w->wait[i] == node) {
            w->wait[i] = w->wait[--w->nwait];
            break;
        }
    }
    if (w->nwait)
        return;
    cfx__coord_reply_ok(w->conn, w->req_id);
    del_wait_free(co, w);
}

bool cfx__coord_del_waits_put(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                              const struct cfx_object_id *id, bool copy)
{
    const uint32_t me = c->node ? c->node->rec.node_id : 0;
    struct coord_del_wait *w;
    char hex[CFX_OBJECT_ID_HEX_LEN], who[128];

    while ((w = del_wait_find(co, id)) && !copy && me && del_wait_has(w, me))
        del_wait_drop(co, w, me); /* may answer the delete, and free it */
    if (!w)
        return false;
    cfx_object_id_to_hex(id, hex);
    del_wait_who(w, who, sizeof(who));
    cfx__coord_reply_err(c, req_id, CFX_ERR_EXISTS,
                         "object %s is being deleted by node %u: node%s %s ha%s not yet "
                         "dropped %s copy; the id is free once that delete returns", hex,
                         w->conn->node ? w->conn->node->rec.node_id : 0,
                         w->nwait == 1 ? "" : "s", who, w->nwait == 1 ? "s" : "ve",
                         w->nwait == 1 ? "its" : "their");
    return true;
}

bool cfx__coord_del_waits_full(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                               const struct cfx_object_id *id)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    if (c->ndel_waits < COORD_DEL_WAITS_PER_CONN)
        return false;
    cfx_object_id_to_hex(id, hex);
    cfx__coord_reply_err(c, req_id, CFX_ERR_NO_RESOURCE,
                         "coordinator %s: node %u has %u deletes waiting for holders to drop "
                         "their copies, the cap of a connection; the delete of object %s is "
                         "refused (nothing withdrawn)", co->addr,
                         c->node ? c->node->rec.node_id : 0, c->ndel_waits, hex);
    return true;
}

static void on_del_wait_timeout(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    struct coord_del_wait *w = t->arg;
    struct cfx_coord *co = w->conn->coord;
    char hex[CFX_OBJECT_ID_HEX_LEN], who[128];
    (void)loop;

    del_wait_who(w, who, sizeof(who));
    cfx_object_id_to_hex(&w->id, hex);
    CFX_LOG(WARN, CTL, "object %s: node%s %s did not acknowledge its withdrawal within %u ms; "
            "the delete of node %u is answered without them", hex, w->nwait == 1 ? "" : "s",
            who, co->dead_after_ms + COORD_DEL_WAIT_MARGIN_MS,
            w->conn->node ? w->conn->node->rec.node_id : 0);
    cfx__coord_reply_err(w->conn, w->req_id, CFX_ERR_PEER_FAILED,
                         "object %s is withdrawn (the id is free), but node%s %s did not "
                         "acknowledge dropping %s copy within %u ms and may still answer "
                         "gets of it", hex, w->nwait == 1 ? "" : "s", who,
                         w->nwait == 1 ? "its" : "their",
                         co->dead_after_ms + COORD_DEL_WAIT_MARGIN_MS);
    del_wait_free(co, w);
}

struct coord_del_wait *cfx__coord_del_wait_new(struct cfx_coord *co, struct coord_conn *c,
                                               uint64_t req_id, const struct cfx_object_id *id,
                                               uint32_t nholders)
{
    struct coord_del_wait *w = calloc(1, sizeof(*w));
    if (!w || !(w->wait = calloc(nholders ? nholders : 1, sizeof(*w->wait)))) {
        free(w);
        return NULL;
    }
    w->conn = c;
    w->req_id = req_id;
    w->id = *id;
    w->token = ++co->next_token;
    cfx__ev_timer_init(&w->timer, on_del_wait_timeout, w);
    return w;
}

void cfx__coord_del_wait_start(struct cfx_coord *co, struct coord_del_wait *w)
{
    if (!w->nwait) {
        cfx__coord_reply_ok(w->conn, w->req_id);
        free(w->wait);
        free(w);
        return;
    }
    cfx_list_add_tail(&w->link, del_bucket(co, w->token));
    cfx_list_add_tail(&w->id_link, del_id_bucket(co, &w->id));
    w->conn->ndel_waits++;
    cfx__ev_timer_start(co->loop, &w->timer,
                        cfx__now_ns() + (uint64_t)(co->dead_after_ms + COORD_DEL_WAIT_MARGIN_MS) *
                                            1000000ull);
}

void cfx__coord_obj_gone_ack(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, del_bucket(co, m->req_id)) {
        struct coord_del_wait *w = cfx_list_entry(pos, struct coord_del_wait, link);
        if (w->token == m->req_id) {
            del_wait_drop(co, w, c->node ? c->node->rec.node_id : 0);
            return;
        }
    }
}

void cfx__coord_del_waits_node_gone(struct cfx_coord *co, uint32_t node)
{
    struct cfx_list *pos, *tmp;
    for (uint32_t i = 0; i < COORD_DEL_WAIT_BUCKETS; i++)
        cfx_list_for_each_safe(pos, tmp, &co->del_waits[i])
            del_wait_drop(co, cfx_list_entry(pos, struct coord_del_wait, link), node);
}

void cfx__coord_waits_conn_gone(struct cfx_coord *co, struct coord_conn *c)
{
    struct cfx_list *pos, *tmp;
    for (uint32_t i = 0; i < COORD_DEL_WAIT_BUCKETS && c->ndel_waits; i++)
        cfx_list_for_each_safe(pos, tmp, &co->del_waits[i]) {
            struct coord_del_wait *w = cfx_list_entry(pos, struct coord_del_wait, link);
            if (w->conn == c)
                del_wait_free(co, w);
        }
    while (!cfx_list_empty(&c->parked))
        cfx__coord_parked_free(co, cfx_list_entry(c->parked.next, struct coord_parked,
                                                  conn_link));
}

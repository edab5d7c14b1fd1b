/*
 * Coordinator object directory: object id -> size, chunk size, inline bytes
 * and holders (complete or partial copies), plus lookups parked until a
 * holder appears.
 *
 * Choosing a source.  Each holder has an upload count (receivers pulling
 * from it) and a depth (0 for a complete copy, source depth + 1 for a
 * partial one).  A lookup takes, among live holders other than the requester
 * and its exclude list:
 *   1. a holder below the fanout before one at or above it (soft limit);
 *   2. below the fanout: the smallest depth, then the fewest uploads;
 *      at or above it: the fewest uploads, then the smallest depth;
 *   3. the lowest node id.
 * Depth first (below the fanout) is what makes concurrent getters form a
 * tree: ordering purely by "fewest uploads" would always pick the newest
 * partial holder, which has none yet, and grow a chain P->A->B->C...  With
 * depth first, P feeds fanout receivers, each of those feeds fanout more,
 * and so on; complete copies (depth 0) still come before partial ones.
 *
 * Extra sources (striping).  A lookup may ask for up to CFX_PROTO_EXTRA_MAX
 * more sources (OBJ_LOOKUP want); the getter then pulls disjoint chunk
 * ranges from all of them (get_stripe.c).  They are offered only when the
 * chosen source is complete, and only complete holders that serve no
 * upload now (uploads == 0), alive, not excluded: a holder feeding a tree
 * or a chain is never one, so the broadcast trees stay as they are, and a
 * getter sent to a partial holder gets that one source as before.  The
 * extras are not counted as uploads (the getter hands its blocks to
 * whichever source finishes first, so one that a later lookup also picks
 * slows the stripe, not the tree) and need no OBJ_DONE.
 *
 * Fan-out.  `conflux-coord --fanout N` fixes it for every object.  Without
 * it the directory chooses per object from its shape.  An object of at
 * least DIR_CHAIN_MIN_CHUNKS chunks is bandwidth-bound: getters stream it
 * chunk by chunk, so a chain (fan-out 1: every holder's uplink feeds one
 * getter at the full link rate, and a later getter attaches to the newest
 * partial holder) finishes in S/B plus one chunk time and latency per hop,
 * where any wider tree sends every byte f times over a holder's uplink
 * (about f S/B).  A smaller object is latency-bound: its hops are what
 * cost, so it gets a wider tree (DIR_FANOUT_SMALL).  Measured on the 4-node
 * 1 Gbit/s emulated cluster, 64 MiB, three getters at once: fan-out 2 took
 * 2.0x S/B, fan-out 1 1.04-1.10x (docs/PERFORMANCE.md).
 *
 * Once members report their links with heartbeats (the bandwidth B and
 * small-get latency L their gets measured), the choice comes from those
 * instead: for n getters (the live members but one, a broadcast's worst
 * case), fan-out f pipelines k chunks of c bytes (object S) through
 * d_f = the depth of an f-ary tree of n nodes, each hop at B/f, so the last
 * getter finishes near
 *
 *   T_f = f S / B + (d_f - 1) (f c / B + L) + L
 *
 * and the smallest T_f of f in {1, 2, 4} wins (ties to the narrower tree).
 * A many-chunk object gets the chain as above; a one-chunk object on a
 * high-latency link a wider tree, more so the more getters there are.
 *
 * Lifecycle.  The node that puts an id is its putter (o->putter).  The id
 * names that one object while a node holds a complete copy of it; inline
 * bytes are the putter's copy, kept here for speed, not a copy of their own.
 * The putter's delete withdraws the object with every copy's record.  When
 * the putter leaves (LEAVE, a lost connection, missed heartbeats), nodes
 * that got all of it keep it alive and served (what lets a get or a reduce
 * go on at another holder); with none, it goes at once, inline bytes and
 * partial copies included.  Another holder's delete withdraws its own copy
 * only; the object goes with the last.  A put of an id in the directory
 * fails with CFX_ERR_EXISTS, whoever sends it, and so does one while the
 * putter's delete of it waits for holders (coord_waits.c).  Durable
 * objects outlive all holders (below).
 *
 * Task results.  A task's worker puts its results, but only the task's
 * submitter knows when they may go; a worker never deletes them, so they
 * stayed (and their buffers) for as long as the worker lived.  When a task
 * that ran ends, coord_task.c names its submitter on each result its node
 * put (o->submitter, cfx__coord_dir_task_result); from then on that node's
 * delete withdraws the object as the putter's does.  Those two are the
 * only nodes whose delete withdraws an object (but for a durable object's,
 * below); any other node's delete drops its own copy only.  The mark lives
 * in memory: a result re-announced to a restarted coordinator carries it
 * again only if its task's end is reported to it again (its worker does so
 * for the tasks it ended lately, control/coord_task.c).  When the submitter
 * leaves (LEAVE, a lost connection, missed heartbeats) its results go as
 * its delete would take them, and a result whose task ends after its
 * submitter left goes at once: as with an owner in Ray, nobody else could
 * end them, and they held their workers' memory until the workers left.
 *
 * Durable objects.  An inline put flagged durable (group bootstrap records)
 * is also written to the state store (coord_state.c) before it is
 * acknowledged, as record "obj.<hex id>":
 *
 *   u8 format (1)  id[20]  u32 putter node  u64 size  u32 chunk size  data
 *
 * (little endian).  A restarted coordinator loads those records back as
 * inline objects whose only memory of a holder is the putter's node id:
 * holders are soft state, so a getter is a holder again once it looks the
 * object up, and the putter once it puts it again.  The putter's delete
 * counts even before that (it is the one that would otherwise be unable to
 * withdraw it).  A durable object stays without holders and while its
 * putter may come back; it goes, record first, when its putter deletes it,
 * or any holder once the putter is gone (nobody else could).  When the
 * putter is gone for good (its death, or the end of its rejoin window after
 * a restart, which every loaded putter gets, even when the node id record
 * was lost: cfx__coord_dir_load) the record goes and the object lives on as
 * an ordinary one (dur_putter_gone).  Without a state directory the flag is
 * ignored.
 */
#include "control/coord_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define DIR_BUCKETS_INITIAL 256u
#define DUR_FORMAT          1u
#define DUR_HDR_LEN         (1 + CFX_OBJECT_ID_LEN + 4 + 8 + 4)
#define DUR_KEY_LEN         (sizeof(COORD_OBJ_KEY_PREFIX) - 1 + 2 * CFX_OBJECT_ID_LEN)

static const char *idhex(const struct cfx_object_id *id, char buf[CFX_OBJECT_ID_HEX_LEN])
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < CFX_OBJECT_ID_LEN; i++) {
        buf[2 * i] = digits[id->bytes[i] >> 4];
        buf[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    buf[2 * CFX_OBJECT_ID_LEN] = '\0';
    return buf;
}

static uint32_t id_hash(const struct cfx_object_id *id)
{
    uint64_t x;
    memcpy(&x, id->bytes, sizeof(x));
    /* Ids are usually SHA-1 output, but user-made ids may not be: mix. */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x ^ ((uint32_t)id->bytes[19] << 24);
}

static uint32_t node_id_of(const struct coord_conn *c)
{
    return c->node ? c->node->rec.node_id : 0;
}

int cfx__coord_dir_init(struct cfx_coord *co)
{
    cfx_list_init(&co->objects);
    co->buckets = malloc(DIR_BUCKETS_INITIAL * sizeof(*co->buckets));
    if (!co->buckets)
        return cfx__err(CFX_ERR_NOMEM, "no memory for the object directory");
    co->nbuckets = DIR_BUCKETS_INITIAL;
    for (uint32_t i = 0; i < co->nbuckets; i++)
        cfx_list_init(&co->buckets[i]);
    int rc = cfx__coord_waits_init(co);
    if (rc != CFX_OK) {
        free(co->buckets);
        co->buckets = NULL;
    }
    return rc;
}

static struct coord_obj *obj_find(struct cfx_coord *co, const struct cfx_object_id *id)
{
    struct cfx_list *b = &co->buckets[id_hash(id) & (co->nbuckets - 1)], *pos;
    cfx_list_for_each(pos, b) {
        struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, hash_link);
        if (!memcmp(o->id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return o;
    }
    return NULL;
}

static void dir_grow(struct cfx_coord *co)
{
    uint32_t n = co->nbuckets * 2;
    struct cfx_list *nb = malloc((size_t)n * sizeof(*nb)), *pos;
    if (!nb)
        return; /* longer chains, still correct */
    for (uint32_t i = 0; i < n; i++)
        cfx_list_init(&nb[i]);
    cfx_list_for_each(pos, &co->objects) {
        struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, link);
        cfx_list_add_tail(&o->hash_link, &nb[id_hash(&o->id) & (n - 1)]);
    }
    free(co->buckets);
    co->buckets = nb;
    co->nbuckets = n;
}

/* @p o enters the directory (listing order, id hash); CFX_ERR_NOMEM. */
static int obj_link(struct cfx_coord *co, struct coord_obj *o)
{
    int rc = cfx__coord_dir_index_add(co, o);
    if (rc != CFX_OK)
        return rc;
    cfx_list_add_tail(&o->link, &co->objects);
    cfx_list_add_tail(&o->hash_link, &co->buckets[id_hash(&o->id) & (co->nbuckets - 1)]);
    co->nobjects++;
    if (co->nobjects > co->nbuckets)
        dir_grow(co);
    return CFX_OK;
}

/* True (and @p c answered) when the directory holds max_objects entries:
 * a new one is refused, whichever node asks. */
static bool objects_full(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                         const char *hex)
{
    if (co->nobjects < co->max_objects)
        return false;
    cfx__coord_reply_err(c, req_id, CFX_ERR_NO_RESOURCE,
                         "coordinator %s: max_objects reached (%u objects in the directory; "
                         "conflux-coord --max-objects); node %u's put of %s refused", co->addr,
                         co->nobjects, node_id_of(c), hex);
    return true;
}

static struct coord_holder *holder_find(struct coord_obj *o, uint32_t node_id)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        if (h->node->rec.node_id == node_id)
            return h;
    }
    return NULL;
}

static struct coord_holder *holder_add(struct coord_obj *o, struct coord_node *n,
                                       int complete, uint32_t depth)
{
    struct coord_holder *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->obj = o;
    h->node = n;
    h->complete = complete ? 1 : 0;
    h->depth = complete ? 0 : depth;
    h->ready = CFX_CTL_READY_UNKNOWN;
    cfx_list_add_tail(&h->obj_link, &o->holders);
    cfx_list_add_tail(&h->node_link, &n->holdings);
    n->nholdings++;
    o->nholders++;
    return h;
}

/* @p h stops pulling from its source: the source's upload slot frees. */
static void holder_release_src(struct coord_obj *o, struct coord_holder *h)
{
    if (!h->src)
        return;
    struct coord_holder *s = holder_find(o, h->src);
    if (s && s->uploads)
        s->uploads--;
    h->src = 0;
}

static void holder_remove(struct coord_obj *o, struct coord_holder *h)
{
    struct cfx_list *pos;
    uint32_t id = h->node->rec.node_id;

    holder_release_src(o, h);
    cfx_list_del(&h->obj_link);
    cfx_list_del(&h->node_link);
    h->node->nholdings--;
    o->nholders--;
    free(h);
    /* Receivers that were pulling from it will look up another source. */
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *r = cfx_list_entry(pos, struct coord_holder, obj_link);
        if (r->src == id)
            r->src = 0;
    }
}

static void obj_drop(struct cfx_coord *co, struct coord_obj *o)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        cfx_list_del(&h->obj_link);
        cfx_list_del(&h->node_link);
        h->node->nholdings--;
        free(h);
    }
    cfx_list_del(&o->hash_link);
    cfx_list_del(&o->link);
    cfx__coord_dir_index_del(co, o);
    if (o->is_inline) {
        co->inline_bytes -= o->size;
        /* ids are never reused: a record under the putter's id is the putter */
        struct coord_node *putter = cfx__coord_node_find(co, o->putter);
        if (putter)
            putter->put_bytes -= CFX_MIN(putter->put_bytes, o->size);
    }
    co->nobjects--;
    free(o->data);
    free(o);
}

/* An object without holders goes, except that a durable one outlives its
 * holders (the coordinator keeps its bytes and record) until its putter
 * deletes it.  Inline bytes of an ordinary object are no holder: they go
 * with the last node that holds it, as a data-plane object's bytes do. */
static void obj_maybe_drop(struct cfx_coord *co, struct coord_obj *o)
{
    if (o->nholders == 0 && !o->durable)
        obj_drop(co, o);
}

/* Does a live node other than @p h's hold a complete copy of @p o? */
static int other_complete(struct coord_obj *o, const struct coord_holder *h)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *x = cfx_list_entry(pos, struct coord_holder, obj_link);
        if (x != h && x->complete && x->node->rec.alive)
            return 1;
    }
    return 0;
}

/* Keep why @p o went, for getters that resume after their source failed. */
static void gone_record(struct cfx_coord *co, const struct coord_obj *o, const char *why)
{
    struct coord_gone *g = &co->gone[co->gone_next++ % COORD_GONE_KEEP];
    g->id = o->id;
    g->putter = o->putter;
    g->used = 1;
    snprintf(g->why, sizeof(g->why), "%s", why);
}

const struct coord_gone *cfx__coord_gone_find(struct cfx_coord *co,
                                              const struct cfx_object_id *id)
{
    for (uint32_t k = 1; k <= COORD_GONE_KEEP; k++) {
        const struct coord_gone *g = &co->gone[(co->gone_next - k) % COORD_GONE_KEEP];
        if (!g->used)
            return NULL;
        if (!memcmp(g->id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return g;
    }
    return NULL;
}

/*
 * The putter of @p o withdrew it, or left it to nobody: the id is gone from
 * the directory, every copy's record with it (the lifecycle at the top).
 * Every live holder but @p by is told (EV_OBJ_GONE), so that its copy no
 * longer answers its own gets; with @p w (the putter's delete) each of them
 * is to acknowledge, and the delete is answered once all have (or died).
 * A holder's lookup parked here is a get resuming after its source failed:
 * it is answered with why the object went, as is one that comes later.
 */
static void obj_withdraw(struct cfx_coord *co, struct coord_obj *o, const char *why,
                         uint32_t by, struct coord_del_wait *w)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_list *pos, *tmp;

    idhex(&o->id, hex);
    CFX_LOG(DEBUG, CTL, "object %s of node %u goes (%s; %u holder%s)", hex, o->putter, why,
            o->nholders, o->nholders == 1 ? "" : "s");
    gone_record(co, o, why);
    cfx_list_for_each_safe(pos, tmp, cfx__coord_parked_bucket(co, &o->id)) {
        struct coord_parked *p = cfx_list_entry(pos, struct coord_parked, link);
        if (memcmp(p->id.bytes, o->id.bytes, CFX_OBJECT_ID_LEN) || !p->conn->node ||
            !holder_find(o, p->conn->node->rec.node_id))
            continue;
        cfx__coord_reply_err(p->conn, p->req_id, CFX_ERR_PEER_FAILED,
                             "object %s is gone: %s", hex, why);
        cfx__coord_parked_free(co, p);
    }
    struct cfx_msg ev = { .type = CFX_MSG_EV_OBJ_GONE, .req_id = w ? w->token : 0 };
    ev.u.gone.id = o->id;
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        struct coord_node *n = h->node;
        if (n->rec.node_id == by || !n->rec.alive || !n->conn)
            continue;
        cfx__coord_send(n->conn, &ev);
        if (w)
            w->wait[w->nwait++] = n->rec.node_id;
    }
    obj_drop(co, o);
}

/* ---- durable objects (see the top of the file) ---------------------------------- */

static int dur_unrecord(struct cfx_coord *co, struct coord_obj *o, bool sync);

/* @p o is durable and its putter is gone for good (dead, or not back by the
 * end of the rejoin window).  Its record served only that putter's live
 * group (readers take the object of a gone node as stale) and nobody would
 * delete it, so a killed job under a new group name left one for good in
 * memory and in the state directory.  Its record goes now and the object
 * as an ordinary one: at once, or with the last live complete copy. */
static void dur_putter_gone(struct cfx_coord *co, struct coord_obj *o)
{
    char hex[CFX_OBJECT_ID_HEX_LEN], why[96];
    /* no sync: after a crash the record is back, and goes again when the
     * rejoin window ends without its putter (a killed job of 1,000 ranks
     * would otherwise cost its event loop turn 1,000 syncs) */
    if (dur_unrecord(co, o, false) != CFX_OK) {
        CFX_LOG(WARN, CTL, "coordinator %s keeps object %s of gone node %u: %s", co->addr,
                idhex(&o->id, hex), o->putter, cfx_last_error());
        return;
    }
    if (other_complete(o, NULL))
        return;
    snprintf(why, sizeof(why), "its putter node %u is gone and no live node held a complete "
             "copy (durable)", o->putter);
    obj_withdraw(co, o, why, o->putter, NULL);
}

static void dur_key(const struct cfx_object_id *id, char key[DUR_KEY_LEN + 1])
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    snprintf(key, DUR_KEY_LEN + 1, "%s%s", COORD_OBJ_KEY_PREFIX, idhex(id, hex));
}

/* Write @p o's record (durably) and mark it durable. */
static int dur_record(struct cfx_coord *co, struct coord_obj *o)
{
    char key[DUR_KEY_LEN + 1];
    size_t len = DUR_HDR_LEN + (size_t)o->size;
    uint8_t *val = malloc(len);
    dur_key(&o->id, key);
    if (!val)
        return cfx__err(CFX_ERR_NOMEM, "no memory to record object %s", key);
    val[0] = DUR_FORMAT;
    memcpy(val + 1, o->id.bytes, CFX_OBJECT_ID_LEN);
    cfx__coord_put_le(val + 1 + CFX_OBJECT_ID_LEN, o->putter, 4);
    cfx__coord_put_le(val + 1 + CFX_OBJECT_ID_LEN + 4, o->size, 8);
    cfx__coord_put_le(val + 1 + CFX_OBJECT_ID_LEN + 12, o->chunk_size, 4);
    if (o->size)
        memcpy(val + DUR_HDR_LEN, o->data, (size_t)o->size);
    int rc = cfx__coord_state_put(co, key, val, len, NULL);
    free(val);
    if (rc == CFX_OK)
        o->durable = 1;
    return rc;
}

/* Remove @p o's record; it is an ordinary object afterwards. */
static int dur_unrecord(struct cfx_coord *co, struct coord_obj *o, bool sync)
{
    char key[DUR_KEY_LEN + 1];
    dur_key(&o->id, key);
    int rc = cfx__coord_state_del(co, key, sync);
    if (rc != CFX_OK && rc != CFX_ERR_NOT_FOUND)
        return rc;
    o->durable = 0;
    return CFX_OK;
}

static void dur_load_one(void *arg, const char *key, const void *val, size_t len)
{
    struct cfx_coord *co = arg;
    const uint8_t *p = val;
    char want[DUR_KEY_LEN + 1];
    struct cfx_object_id id;
    struct coord_obj *o;
    const char *why = NULL;
    uint32_t putter, chunk;
    uint64_t size;

    if (len < DUR_HDR_LEN || p[0] != DUR_FORMAT) {
        why = "unknown format or truncated";
        goto bad;
    }
    memcpy(id.bytes, p + 1, CFX_OBJECT_ID_LEN);
    dur_key(&id, want);
    putter = (uint32_t)cfx__coord_get_le(p + 1 + CFX_OBJECT_ID_LEN, 4);
    size = cfx__coord_get_le(p + 1 + CFX_OBJECT_ID_LEN + 4, 8);
    chunk = (uint32_t)cfx__coord_get_le(p + 1 + CFX_OBJECT_ID_LEN + 12, 4);
    if (strcmp(key, want))
        why = "the key does not name the object's id";
    else if (size > CFX_OBJECT_INLINE_MAX || len != DUR_HDR_LEN + size)
        why = "the size disagrees with the record's length";
    else if (obj_find(co, &id))
        why = "the object is loaded already";
    else if (co->inline_bytes + size > COORD_INLINE_TOTAL_MAX)
        why = "over the coordinator's inline byte limit";
    if (why)
        goto bad;

    o = calloc(1, sizeof(*o));
    if (!o)
        goto err_nomem;
    if (size) {
        o->data = malloc((size_t)size);
        if (!o->data)
            goto err_free_obj;
        memcpy(o->data, p + DUR_HDR_LEN, (size_t)size);
    }
    o->id = id;
    o->size = size;
    o->chunk_size = chunk;
    o->is_inline = 1;
    o->durable = 1;
    o->putter = putter;
    cfx_list_init(&o->holders);
    if (obj_link(co, o) != CFX_OK)
        goto err_free_data;
    co->inline_bytes += size;
    return;

err_free_data:
    free(o->data);
err_free_obj:
    free(o);
err_nomem:
    why = "out of memory";
bad:
    CFX_LOG(ERR, CTL, "coordinator state %s: record %s is not a durable object (%s); "
            "not loading it", co->state_dir, key, why);
}

void cfx__coord_dir_load(struct cfx_coord *co)
{
    uint32_t before = co->nobjects, mark = 0;
    struct cfx_list *pos;
    cfx__coord_state_foreach(co, COORD_OBJ_KEY_PREFIX, dur_load_one, co);
    if (co->nobjects > before)
        CFX_LOG(INFO, CTL, "coordinator state %s: %u durable object%s loaded", co->state_dir,
                co->nobjects - before, co->nobjects - before == 1 ? "" : "s");
    /*
     * A putter's id was given before this start, whatever the id record
     * says.  That record is a file of its own and may be lost alone
     * (removed, or corrupt and skipped): the coordinator then gave ids
     * afresh from 1 and opened no rejoin window, so a newcomer given a
     * putter's id was taken for the putter (its life kept the record, its
     * delete withdrew the object, readers took a gone rank's bootstrap
     * record for a live one's), the putter itself came back under another
     * id and could not put its object again (CFX_ERR_EXISTS), and a record
     * whose putter's id nobody got again stayed for good.  Removing such
     * records at once would also remove those of live groups whose ranks
     * are about to reconnect.  So the putters' ids count as of before, as
     * a recorded mark would have it: new ids continue above them, a putter
     * back within the rejoin window takes its id and its objects back, and
     * the records of those not back go when the window ends
     * (cfx__coord_dir_rejoin_over), as after any restart.
     */
    cfx_list_for_each(pos, &co->objects) {
        const struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, link);
        if (o->durable && o->putter && o->putter >= mark && o->putter < UINT32_MAX)
            mark = o->putter + 1;
    }
    cfx__coord_members_of_before(co, mark);
}

#define DIR_CHAIN_MIN_CHUNKS 4 /* objects of at least this many chunks: a chain */
#define DIR_FANOUT_SMALL 2     /* fan-out for fewer chunks */

#define DIR_LINK_REFRESH_NS 1000000000ull /* medians of the reports: at most once a second */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Medians of what live members report of their links (see "Fan-out"). */
static void link_refresh(struct cfx_coord *co)
{
    uint64_t now = cfx__now_ns();
    if (co->link_at_ns && now - co->link_at_ns < DIR_LINK_REFRESH_NS)
        return;
    co->link_at_ns = now;
    co->link_bw = co->link_lat = 0;
    co->link_getters = co->nodes_alive > 1 ? co->nodes_alive - 1 : 1;
    double *bw = malloc(2 * ((size_t)co->nodes_alive + 1) * sizeof(*bw));
    if (!bw)
        return; /* the shape rule meanwhile; tried again in a second */
    double *lat = bw + co->nodes_alive;
    uint32_t nb = 0, nl = 0;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->nodes) {
        const struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (!n->rec.alive || nb == co->nodes_alive)
            continue;
        if (n->load.link_bw)
            bw[nb++] = (double)n->load.link_bw;
        if (n->load.link_lat_ns)
            lat[nl++] = (double)n->load.link_lat_ns / 1e9;
    }
    if (nb && nl) {
        qsort(bw, nb, sizeof(*bw), cmp_double);
        qsort(lat, nl, sizeof(*lat), cmp_double);
        co->link_bw = bw[nb / 2];
        co->link_lat = lat[nl / 2];
    }
    free(bw);
}

/* T_f of "Fan-out": when the last of @p n getters finishes with fan-out @p f. */
static double fanout_time(double size, double chunk, double bw, double lat, uint32_t n,
                          uint32_t f)
{
    uint32_t depth = 0;
    for (uint64_t reached = 0, level = 1; reached < n; depth++) {
        level *= f;
        reached += level;
    }
    return f * size / bw + (depth - 1) * (f * chunk / bw + lat) + lat;
}

/* The fan-out for @p o (see "Fan-out" above). */
static uint32_t obj_fanout(struct cfx_coord *co, const struct coord_obj *o)
{
    static const uint32_t choices[] = { 1, 2, 4 };
    if (co->fanout)
        return co->fanout;
    uint64_t chunks = o->chunk_size ? (o->size + o->chunk_size - 1) / o->chunk_size : 1;
    link_refresh(co);
    if (co->link_bw <= 0 || co->link_lat <= 0)
        return chunks >= DIR_CHAIN_MIN_CHUNKS ? 1 : DIR_FANOUT_SMALL;
    double size = (double)(o->size ? o->size : 1);
    double chunk = o->chunk_size ? CFX_MIN((double)o->chunk_size, size) : size;
    uint32_t best = 1;
    double tbest = 0;
    for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
        double t = fanout_time(size, chunk, co->link_bw, co->link_lat, co->link_getters,
                               choices[i]);
        if (i == 0 || t < tbest) {
            tbest = t;
            best = choices[i];
        }
    }
    return best;
}

static int excluded(const uint32_t *ex, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (ex[i] == id)
            return 1;
    return 0;
}

static int holder_better(const struct coord_holder *a, const struct coord_holder *b,
                         uint32_t fanout)
{
    int abelow = a->uploads < fanout, bbelow = b->uploads < fanout;
    if (abelow != bbelow)
        return abelow;
    if (abelow) {
        if (a->depth != b->depth)
            return a->depth < b->depth;
        if (a->uploads != b->uploads)
            return a->uploads < b->uploads;
    } else {
        if (a->uploads != b->uploads)
            return a->uploads < b->uploads;
        if (a->depth != b->depth)
            return a->depth < b->depth;
    }
    return a->node->rec.node_id < b->node->rec.node_id;
}

/* Does partial holder @p h get its bytes, directly or through other partial
 * holders, from @p node?  Then it cannot feed @p node: a getter that resumes
 * after its source died would otherwise be sent to a copy that only it was
 * filling, and both would wait for ever. */
static int fed_by(struct coord_obj *o, const struct coord_holder *h, uint32_t node)
{
    for (int hops = 0; h && !h->complete && h->src && hops < 64; hops++) {
        if (h->src == node)
            return 1;
        h = holder_find(o, h->src);
    }
    return 0;
}

static struct coord_holder *choose_source(struct cfx_coord *co, struct coord_obj *o,
                                          uint32_t requester, const uint32_t *ex, uint32_t nex)
{
    struct coord_holder *best = NULL;
    struct cfx_list *pos;
    uint32_t fanout = obj_fanout(co, o);
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        uint32_t id = h->node->rec.node_id;
        if (id == requester || !h->node->rec.alive || excluded(ex, nex, id) ||
            fed_by(o, h, requester))
            continue;
        if (!best || holder_better(h, best, fanout))
            best = h;
    }
    return best;
}

static void reply_inline(struct coord_conn *c, uint64_t req_id, const struct coord_obj *o)
{
    struct cfx_msg r = { .type = CFX_MSG_LOOKUP_REPLY, .req_id = req_id };
    r.u.lookup_reply.id = o->id;
    r.u.lookup_reply.size = o->size;
    r.u.lookup_reply.chunk_size = o->chunk_size;
    r.u.lookup_reply.is_inline = 1;
    r.u.lookup_reply.complete = 1;
    r.u.lookup_reply.putter = o->putter;
    r.u.lookup_reply.tag = o->tag;
    r.u.lookup_reply.data = o->data;
    cfx__coord_send(c, &r);
}

/* Serve an inline object: the requester now holds a complete copy too. */
static void serve_inline(struct coord_conn *c, uint64_t req_id, struct coord_obj *o)
{
    if (c->node && !holder_find(o, c->node->rec.node_id))
        holder_add(o, c->node, 1, 0);
    reply_inline(c, req_id, o);
}

/* Record @p c's node as a receiver of @p src and answer.  Returns 1 when the
 * node became a new (partial) holder, which may unblock parked lookups. */
/* Up to @p want complete, idle holders besides @p src for a striped get
 * (see the top of the file), into the reply @p r. */
static void add_extras(struct coord_obj *o, const struct coord_holder *src, uint32_t requester,
                       const uint32_t *ex, uint32_t nex, uint32_t want, struct cfx_msg *r)
{
    struct cfx_list *pos;
    r->u.lookup_reply.nextra = 0;
    if (!src->complete)
        return;
    want = CFX_MIN(want, CFX_PROTO_EXTRA_MAX);
    cfx_list_for_each(pos, &o->holders) {
        const struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        uint32_t id = h->node->rec.node_id;
        if (r->u.lookup_reply.nextra >= want)
            break;
        if (h == src || !h->complete || h->uploads || id == requester || !h->node->rec.alive ||
            excluded(ex, nex, id))
            continue;
        r->u.lookup_reply.extra[r->u.lookup_reply.nextra++] = id;
    }
}

static int assign_source(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                         struct coord_obj *o, struct coord_holder *src, uint32_t nex,
                         const uint32_t *ex, uint32_t want)
{
    struct coord_holder *rh = holder_find(o, c->node->rec.node_id);
    int added = 0;

    if (!rh) {
        rh = holder_add(o, c->node, 0, src->depth + 1);
        if (!rh) {
            cfx__coord_reply_err(c, req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                                 co->addr);
            return 0;
        }
        added = 1;
    } else if (!rh->complete) {
        rh->depth = src->depth + 1;
    }
    holder_release_src(o, rh);
    rh->src = src->node->rec.node_id;
    src->uploads++;

    struct cfx_msg r = { .type = CFX_MSG_LOOKUP_REPLY, .req_id = req_id };
    r.u.lookup_reply.id = o->id;
    r.u.lookup_reply.size = o->size;
    r.u.lookup_reply.chunk_size = o->chunk_size;
    r.u.lookup_reply.is_inline = 0;
    r.u.lookup_reply.complete = src->complete;
    r.u.lookup_reply.putter = o->putter;
    r.u.lookup_reply.tag = o->tag;
    cfx__coord_node_fill(co, src->node, &r.u.lookup_reply.node);
    if (want)
        add_extras(o, src, c->node->rec.node_id, ex, nex, want, &r);
    /* nex: sources the getter left after they failed it (a failover) */
    CFX_LOG(DEBUG, CTL, "node %u gets %llu bytes from node %u (%s, depth %u, %u uploads, "
            "fan-out %u, %u sources failed it before, %u more complete sources of %u wanted)",
            c->node->rec.node_id, (unsigned long long)o->size, src->node->rec.node_id,
            src->complete ? "complete" : "partial", src->depth, src->uploads,
            obj_fanout(co, o), nex, (unsigned)r.u.lookup_reply.nextra, want);
    cfx__coord_send(c, &r);
    return added;
}

/* Try parked lookups of @p o again until none can be served. */
static void wake_parked(struct cfx_coord *co, struct coord_obj *o)
{
    int progress = 1;
    while (progress) {
        struct cfx_list *pos, *tmp;
        progress = 0;
        cfx_list_for_each_safe(pos, tmp, cfx__coord_parked_bucket(co, &o->id)) {
            struct coord_parked *p = cfx_list_entry(pos, struct coord_parked, link);
            if (memcmp(p->id.bytes, o->id.bytes, CFX_OBJECT_ID_LEN) || !p->conn->node)
                continue;
            struct coord_holder *own = holder_find(o, p->conn->node->rec.node_id);
            if (o->is_inline) {
                serve_inline(p->conn, p->req_id, o);
            } else if (own && own->complete) {
                /* the node waiting is the one that put it (a get before its
                 * own put): it is no source for itself, and no other holder
                 * may ever come; it reads its own copy (CFX_ERR_AGAIN: look
                 * here again) */
                char hex[CFX_OBJECT_ID_HEX_LEN];
                cfx__coord_reply_err(p->conn, p->req_id, CFX_ERR_AGAIN,
                                     "node %u holds object %s itself now",
                                     p->conn->node->rec.node_id, idhex(&o->id, hex));
            } else {
                struct coord_holder *src = choose_source(co, o, p->conn->node->rec.node_id,
                                                         p->exclude, p->nexclude);
                if (!src)
                    continue;
                if (assign_source(co, p->conn, p->req_id, o, src, p->nexclude, p->exclude, 0))
                    progress = 1;
            }
            /* assign_source never frees parked entries, so tmp stays valid. */
            cfx__coord_parked_free(co, p);
        }
    }
}

/* True (and the caller answered) when @p c's node may not hold one more
 * directory entry: max_node_objects.  An entry it holds already is free. */
static bool node_objects_full(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                              const struct coord_obj *o)
{
    struct coord_node *n = c->node;
    if (!n || n->nholdings < co->max_node_objects ||
        (o && holder_find((struct coord_obj *)o, n->rec.node_id)))
        return false;
    cfx__coord_reply_err(c, req_id, CFX_ERR_NO_RESOURCE,
                         "coordinator %s: max_node_objects reached (node %u holds %u objects; "
                         "conflux-coord --max-node-objects)", co->addr, n->rec.node_id,
                         n->nholdings);
    return true;
}

void cfx__coord_obj_lookup(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    const uint32_t me = node_id_of(c);
    struct coord_obj *o = obj_find(co, &m->u.lookup.id);
    char hex[CFX_OBJECT_ID_HEX_LEN];

    if (node_objects_full(co, c, m->req_id, o))
        return;

    if (o && o->is_inline) {
        serve_inline(c, m->req_id, o);
        return;
    }
    if (o) {
        struct coord_holder *src = choose_source(co, o, me, m->u.lookup.exclude,
                                                 m->u.lookup.nexclude);
        if (src) {
            if (assign_source(co, c, m->req_id, o, src, m->u.lookup.nexclude,
                              m->u.lookup.exclude, m->u.lookup.want))
                wake_parked(co, o);
            return;
        }
        struct coord_holder *own = holder_find(o, me);
        if (own && own->complete && !m->u.lookup.nexclude) {
            /* only the asker holds it (it put it after its get began): it
             * reads its own copy, no other holder need come (wake_parked) */
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_AGAIN, "node %u holds object %s itself",
                                 me, idhex(&m->u.lookup.id, hex));
            return;
        }
    }
    const struct coord_gone *g = !o && m->u.lookup.nexclude && m->u.lookup.timeout_ms
                                     ? cfx__coord_gone_find(co, &m->u.lookup.id)
                                     : NULL;
    if (g) {
        /* a get resuming after its source failed: the object it was
         * getting is gone, and a later put of the id is another object */
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_PEER_FAILED, "object %s is gone: %s",
                             idhex(&m->u.lookup.id, hex), g->why);
        return;
    }
    if (m->u.lookup.timeout_ms == 0) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_TIMEOUT, "object %s has no holder",
                             idhex(&m->u.lookup.id, hex));
        return;
    }
    struct coord_parked *p = cfx__coord_parked_add(co, c, m);
    if (!p)
        return; /* answered */
    CFX_LOG(DEBUG, CTL, "node %u waits for object %s (%u ms)", me, idhex(&p->id, hex),
            p->timeout_ms);
}

/*
 * A node announces again, after a restart, a complete copy it got of another
 * node's put (CFX_PROTO_PUT_COPY, with that putter and its tag).  The copy
 * is the object the id names when the directory has nothing under the id
 * (the putter left before the restart, or has not announced it yet) or the
 * same put (putter, tag, size, chunk size): the node is a complete holder
 * again.  Anything else means the id names another object by now:
 * CFX_ERR_EXISTS, and the node drops its copy.
 */
static void put_copy(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m,
                     struct coord_obj *o)
{
    const uint32_t me = node_id_of(c);
    char hex[CFX_OBJECT_ID_HEX_LEN];

    idhex(&m->u.put.id, hex);
    if (o && (o->putter != m->u.put.putter || o->tag != m->u.put.tag ||
              o->size != m->u.put.size || o->chunk_size != m->u.put.chunk_size)) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS,
                             "object %s is another put by now: node %u put %llu bytes; node "
                             "%u holds a copy of node %u's put of %llu bytes", hex, o->putter,
                             (unsigned long long)o->size, me, m->u.put.putter,
                             (unsigned long long)m->u.put.size);
        return;
    }
    if (!o && objects_full(co, c, m->req_id, hex))
        return;
    if (!o) {
        o = calloc(1, sizeof(*o));
        if (!o) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of "
                                 "memory", co->addr);
            return;
        }
        o->id = m->u.put.id;
        o->size = m->u.put.size;
        o->chunk_size = m->u.put.chunk_size;
        o->putter = m->u.put.putter;
        o->tag = m->u.put.tag;
        memcpy(o->name, m->u.put.name, sizeof(o->name));
        cfx_list_init(&o->holders);
        if (obj_link(co, o) != CFX_OK) {
            free(o);
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of "
                                 "memory", co->addr);
            return;
        }
    }
    struct coord_holder *h = holder_find(o, me);
    if (h) {
        holder_release_src(o, h);
        h->complete = 1;
        h->depth = 0;
    } else if (!holder_add(o, c->node, 1, 0)) {
        obj_maybe_drop(co, o);
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                             co->addr);
        return;
    }
    CFX_LOG(DEBUG, CTL, "node %u holds a copy of object %s (node %u's put, %llu bytes) again",
            me, hex, o->putter, (unsigned long long)o->size);
    cfx__coord_reply_ok(c, m->req_id);
    wake_parked(co, o);
}

void cfx__coord_obj_put(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    const uint32_t me = node_id_of(c);
    struct coord_obj *o = obj_find(co, &m->u.put.id);
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint64_t size = m->u.put.size;

    idhex(&m->u.put.id, hex);
    /* a result of a task that moved off this node while it was taken for
     * dead: its run goes on, but only the task's run may put it */
    if (!m->u.put.copy && cfx__coord_task_put_fenced(co, c, m->req_id, &m->u.put.id))
        return;
    if (node_objects_full(co, c, m->req_id, o))
        return;
    /* not free while its putter's delete waits for holders (coord_waits.c) */
    if (!o && cfx__coord_del_waits_put(co, c, m->req_id, &m->u.put.id, m->u.put.copy))
        return;
    if (m->u.put.copy) {
        put_copy(co, c, m, o);
        return;
    }
    /* small objects normally carry their data (inline); a putter may keep
     * one on the data plane (CFX_OBJ_FLAG_NO_INLINE) */
    if (o) {
        /* An id names one object until its putter deletes it or leaves: a
         * second put never succeeds with the first one's bytes visible.  The
         * one exception is the putter itself announcing it again after a
         * coordinator restart reloaded it (durable), same size. */
        /* A repeat (CFX_PROTO_PUT_AGAIN: sent again after a reconnect, or
         * re-announced) from the putter that holds it already is the same
         * put: acknowledged, so that a put never fails on its own object. */
        struct coord_holder *mine = me ? holder_find(o, me) : NULL;
        if (m->u.put.again && !mine && o->putter == me && o->tag && m->u.put.tag &&
            o->tag != m->u.put.tag && !o->durable) {
            /* Its record came from a copy announced after a restart, of an
             * earlier put of this id by this node (deleted while the
             * coordinator was away): that copy is stale, this put wins. */
            char why[96];
            snprintf(why, sizeof(why), "node %u put the id again", me);
            obj_withdraw(co, o, why, me, NULL);
            o = NULL;
        }
    }
    if (o) {
        struct coord_holder *mine = me ? holder_find(o, me) : NULL;
        if (m->u.put.again && mine && mine->complete && o->putter == me && o->size == size &&
            o->chunk_size == m->u.put.chunk_size && !o->is_inline == !m->u.put.has_data) {
            CFX_LOG(DEBUG, CTL, "node %u put object %s again (a repeat): acknowledged", me, hex);
            cfx__coord_reply_ok(c, m->req_id);
            return;
        }
        if (mine || o->putter != me || !me || o->size != size) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS,
                                 "object %s already exists: node %u put it (%llu bytes%s); "
                                 "node %u put %llu bytes", hex, o->putter,
                                 (unsigned long long)o->size, o->durable ? ", durable" : "",
                                 me, (unsigned long long)size);
            return;
        }
        /* A durable put of an inline object put plainly before makes it durable. */
        if (m->u.put.durable && o->is_inline && !o->durable && co->state_dirfd >= 0 &&
            dur_record(co, o) != CFX_OK) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_IO, "coordinator %s cannot record "
                                 "object %s: %s", co->addr, hex, cfx_last_error());
            return;
        }
        if (!holder_add(o, c->node, 1, 0)) {
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM,
                                 "coordinator %s is out of memory", co->addr);
            return;
        }
        cfx__coord_reply_ok(c, m->req_id);
        wake_parked(co, o);
        return;
    }

    /* a new object from here on (a stale record of the putter's id may
     * have been withdrawn above): its inline bytes count as any put's */
    if (c->node && m->u.put.has_data &&
        size > co->max_node_bytes - CFX_MIN(co->max_node_bytes, c->node->put_bytes)) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s: max_node_bytes reached (node %u stores %llu "
                             "inline bytes, %llu more asked; conflux-coord --max-node-bytes)",
                             co->addr, me, (unsigned long long)c->node->put_bytes,
                             (unsigned long long)size);
        return;
    }
    if (objects_full(co, c, m->req_id, hex))
        return;
    if (m->u.put.has_data && co->inline_bytes + size > COORD_INLINE_TOTAL_MAX) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NO_RESOURCE,
                             "coordinator %s stores %llu inline bytes already (limit %llu)",
                             co->addr, (unsigned long long)co->inline_bytes,
                             (unsigned long long)COORD_INLINE_TOTAL_MAX);
        return;
    }
    o = calloc(1, sizeof(*o));
    if (!o)
        goto err_nomem;
    if (m->u.put.has_data && size) {
        o->data = malloc((size_t)size);
        if (!o->data)
            goto err_free_obj;
        memcpy(o->data, m->u.put.data, (size_t)size);
    }
    o->id = m->u.put.id;
    o->size = size;
    o->chunk_size = m->u.put.chunk_size;
    o->is_inline = m->u.put.has_data;
    o->putter = me;
    o->tag = m->u.put.tag;
    memcpy(o->name, m->u.put.name, sizeof(o->name)); /* validated by the decoder */
    cfx_list_init(&o->holders);
    if (cfx__coord_dir_index_add(co, o) != CFX_OK)
        goto err_free_data;
    /* Recorded before it is acknowledged: an OK means it survives kill -9. */
    if (m->u.put.durable && o->is_inline && co->state_dirfd >= 0 &&
        dur_record(co, o) != CFX_OK)
        goto err_io;
    if (!holder_add(o, c->node, 1, 0))
        goto err_unrecord;
    cfx_list_add_tail(&o->link, &co->objects);
    cfx_list_add_tail(&o->hash_link, &co->buckets[id_hash(&o->id) & (co->nbuckets - 1)]);
    co->nobjects++;
    if (o->is_inline) {
        co->inline_bytes += size;
        if (c->node)
            c->node->put_bytes += size;
    }
    if (co->nobjects > co->nbuckets)
        dir_grow(co);
    CFX_LOG(DEBUG, CTL, "node %u put object %s (%llu bytes%s)", me, hex,
            (unsigned long long)size,
            o->durable ? ", inline, durable" : o->is_inline ? ", inline" : "");
    cfx__coord_reply_ok(c, m->req_id);
    wake_parked(co, o);
    return;

err_io:
    cfx__coord_reply_err(c, m->req_id, CFX_ERR_IO, "coordinator %s cannot record object %s: "
                         "%s", co->addr, hex, cfx_last_error());
    cfx__coord_dir_index_del(co, o);
    free(o->data);
    free(o);
    return;
err_unrecord:
    if (o->durable)
        dur_unrecord(co, o, true);
    cfx__coord_dir_index_del(co, o);
err_free_data:
    free(o->data);
err_free_obj:
    free(o);
err_nomem:
    cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                         co->addr);
}

void cfx__coord_obj_done(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    const uint32_t me = node_id_of(c);
    struct coord_obj *o = obj_find(co, &m->u.done.id);
    char hex[CFX_OBJECT_ID_HEX_LEN];

    if (!o) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "object %s is not in the directory", idhex(&m->u.done.id, hex));
        return;
    }
    struct coord_holder *rh = holder_find(o, me);
    if (!rh && m->u.done.complete) {
        /* Its lookup's record went with the object it was getting (the
         * putter deleted it or left): a copy of that one must not count as
         * a copy of whatever was put under the id since. */
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "node %u holds no record of object %s (its putter withdrew "
                             "the one it got, or the directory restarted since): its copy "
                             "is not recorded", me, idhex(&o->id, hex));
        return;
    }
    /* a complete copy pulls from nobody (another get of the node may have
     * been assigned a source since this one's, and ended without a word) */
    if (rh && (rh->src == m->u.done.source_node || m->u.done.complete))
        holder_release_src(o, rh);
    else
        CFX_LOG(DEBUG, CTL, "node %u: done with object %s from node %u, which it was not "
                "pulling from", me, idhex(&o->id, hex), m->u.done.source_node);

    if (m->u.done.complete) {
        rh->complete = 1;
        rh->depth = 0;
        cfx__coord_reply_ok(c, m->req_id);
        wake_parked(co, o);
        return;
    }
    if (rh && !rh->complete) {
        holder_remove(o, rh);
        obj_maybe_drop(co, o);
    }
    cfx__coord_reply_ok(c, m->req_id);
}

void cfx__coord_obj_delete(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    const uint32_t me = node_id_of(c);
    struct coord_obj *o = obj_find(co, &m->u.del.id);
    struct coord_holder *h = o ? holder_find(o, me) : NULL;
    char hex[CFX_OBJECT_ID_HEX_LEN];

    idhex(&m->u.del.id, hex);
    /* The putter's delete withdraws the object.  A durable object whose
     * putter is gone has no owner left: any node may delete it (else it
     * would stay for ever). */
    struct coord_node *pn = o && o->putter ? cfx__coord_node_find(co, o->putter) : NULL;
    const int owner = o && me && (o->putter == me || (o->submitter == me && m->u.del.end) ||
                                  (o->durable && h && !(pn && pn->rec.alive)));

    /* The putter of a durable object loaded after a restart is no holder
     * until it puts it again; its delete counts all the same. */
    if (!h && !owner) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "node %u holds no copy of object %s", me, hex);
        return;
    }
    /* A failed put's withdrawal (a drop bounded by the put's tag,
     * object.c put_withdraw) takes the node's own put only: a copy it
     * holds of another node's object (got on another thread meanwhile)
     * stays recorded, or the putter's delete would pass it by, and the
     * node answer its gets of the id from it after the delete. */
    if (!m->u.del.end && m->u.del.put_below && o->putter != me) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "node %u put no object %s (node %u did): its withdrawal takes "
                             "nothing", me, hex, o->putter);
        return;
    }
    /* A delete that found no copy on its node takes no put of it that
     * began there after (a put on another thread): that put was still
     * held there, unwithdrawn, answering the node's own gets, after the
     * directory had let another node put the id. */
    if (o->putter == me && m->u.del.put_below && o->tag >= m->u.del.put_below) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOT_FOUND,
                             "node %u held no copy of object %s when it deleted it (its put "
                             "of the id began after)", me, hex);
        return;
    }
    /* The putter's delete waits for the holders' acknowledgements: a
     * connection has so many such deletes at most (coord_waits.c). */
    if (owner && cfx__coord_del_waits_full(co, c, m->req_id, &m->u.del.id))
        return;
    /* The object goes: its record first, so a failure changes nothing. */
    if (o->durable && owner && dur_unrecord(co, o, true) != CFX_OK) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_IO, "coordinator %s cannot remove the "
                             "record of object %s: %s", co->addr, hex, cfx_last_error());
        return;
    }
    if (owner) {
        /* The reply waits until every other holder dropped its copy (so
         * that none of them answers a get of the id with these bytes once
         * the delete returned), and the id is free for a new put from then
         * on (coord_waits.c). */
        char why[96];
        if (o->putter == me)
            snprintf(why, sizeof(why), "its putter node %u deleted it", me);
        else if (o->submitter == me)
            snprintf(why, sizeof(why), "node %u, which submitted the task that put it on node "
                     "%u, deleted it", me, o->putter);
        else
            snprintf(why, sizeof(why), "node %u deleted it, its putter node %u gone", me,
                     o->putter);
        struct coord_del_wait *w = cfx__coord_del_wait_new(co, c, m->req_id, &o->id,
                                                           o->nholders);
        if (!w)
            CFX_LOG(ERR, CTL, "coordinator %s is out of memory: the delete of object %s by "
                    "node %u does not wait for its holders", co->addr, hex, me);
        obj_withdraw(co, o, why, me, w);
        if (w) {
            cfx__coord_del_wait_start(co, w); /* answers it now when nobody is to ack */
            return;
        }
    } else if (!o->durable && h->complete && !other_complete(o, h)) {
        char why[96];
        snprintf(why, sizeof(why), "node %u deleted its last complete copy (its putter node "
                 "%u gone)", me, o->putter);
        obj_withdraw(co, o, why, me, NULL);
    } else {
        holder_remove(o, h);
        obj_maybe_drop(co, o); /* a durable object stays without holders */
    }
    cfx__coord_reply_ok(c, m->req_id);
}

/*
 * A member's heartbeat says how far its copies being received got (at most
 * CFX_CTL_PROGRESS_MAX a beat, so at most that many lookups).  Only the
 * partial copies the directory assigned it are updated: a copy it does not
 * hold here (a cached-location get, or one withdrawn since), one already
 * complete (the report was taken before its OBJ_DONE) and a count over the
 * object's size are ignored.
 */
void cfx__coord_dir_progress(struct cfx_coord *co, struct coord_node *n,
                             const struct cfx_msg_heartbeat *hb)
{
    for (uint32_t i = 0; i < hb->nprogress && i < CFX_CTL_PROGRESS_MAX; i++) {
        struct coord_obj *o = obj_find(co, &hb->progress[i].id);
        struct coord_holder *h = o ? holder_find(o, n->rec.node_id) : NULL;
        if (!h || h->complete || hb->progress[i].ready > o->size)
            continue;
        h->ready = hb->progress[i].ready;
    }
}

void cfx__coord_dir_node_gone(struct cfx_coord *co, struct coord_node *n)
{
    struct cfx_list *pos, *tmp;
    /* the words say whether it said goodbye or was found dead (killed, or
     * its connection lost), as the task messages do (coord_task.c) */
    const char *how = n->rec.flags & CFX_NODE_F_LEFT ? "left" : "died";
    /* deletes waiting for it to drop its copies wait no more */
    cfx__coord_del_waits_node_gone(co, n->rec.node_id);
    /* A node holds an object once, so the next entry of its holdings never
     * belongs to the object dropped here. */
    cfx_list_for_each_safe(pos, tmp, &n->holdings) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, node_link);
        struct coord_obj *o = h->obj;
        if (!o->durable && h->complete && !other_complete(o, h)) {
            /* partial copies cannot complete without a complete one */
            char why[96];
            if (o->putter == n->rec.node_id)
                snprintf(why, sizeof(why), "its putter node %u %s and no other node held "
                         "a complete copy", o->putter, how);
            else
                snprintf(why, sizeof(why), "node %u, which held its last complete copy, %s "
                         "(its putter node %u gone)", n->rec.node_id, how, o->putter);
            obj_withdraw(co, o, why, n->rec.node_id, NULL);
            continue;
        }
        holder_remove(o, h);
        obj_maybe_drop(co, o);
    }
    /* The results of the tasks it submitted go as its delete would take
     * them: no other node may end them, so they stayed (and their workers'
     * memory) until their workers left. */
    cfx_list_for_each_safe(pos, tmp, &co->objects) {
        struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, link);
        if (o->durable && o->putter == n->rec.node_id) {
            dur_putter_gone(co, o); /* its own copy was dropped above */
            continue;
        }
        if (o->submitter != n->rec.node_id)
            continue;
        char why[96];
        snprintf(why, sizeof(why), "node %u, which submitted the task that put it on node %u, "
                 "%s", o->submitter, o->putter, how);
        obj_withdraw(co, o, why, n->rec.node_id, NULL);
    }
}

void cfx__coord_dir_rejoin_over(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &co->objects) {
        struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, link);
        struct coord_node *pn = o->durable ? cfx__coord_node_find(co, o->putter) : NULL;
        if (o->durable && !(pn && pn->rec.alive))
            dur_putter_gone(co, o);
    }
}

void cfx__coord_dir_conn_gone(struct cfx_coord *co, struct coord_conn *c)
{
    cfx__coord_waits_conn_gone(co, c);
}

void cfx__coord_dir_fini(struct cfx_coord *co)
{
    if (!co->buckets)
        return;
    cfx__coord_waits_fini(co);
    while (!cfx_list_empty(&co->objects))
        obj_drop(co, cfx_list_entry(co->objects.next, struct coord_obj, link));
    cfx__coord_dir_index_fini(co);
    free(co->buckets);
    co->buckets = NULL;
}

uint64_t cfx__coord_dir_held_bytes(struct cfx_coord *co, const struct cfx_object_id *id,
                                   uint32_t node_id)
{
    struct coord_obj *o = obj_find(co, id);
    struct cfx_list *pos;
    if (!o || o->is_inline) /* inline: every node gets it from the coordinator alike */
        return 0;
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        if (h->node->rec.node_id == node_id)
            return h->complete ? o->size : o->size / 2;
    }
    return 0;
}

void cfx__coord_dir_task_result(struct cfx_coord *co, const struct cfx_object_id *id,
                                uint32_t putter, uint32_t submitter)
{
    struct coord_obj *o = obj_find(co, id);
    /* only what the task's own node put: an id someone else put first is
     * not the task's result, and its putter's alone */
    if (!o || !putter || o->putter != putter || !submitter)
        return;
    struct coord_node *sn = cfx__coord_node_find(co, submitter);
    /* unknown: a node of before a restart that may still join again (a
     * restarted coordinator hears of a task's end before its submitter);
     * else long gone (dead records are forgotten after a while, and ids
     * are never reused) */
    bool may_rejoin = !sn && submitter < co->restart_mark && co->rejoin_until_ns &&
                      cfx__now_ns() < co->rejoin_until_ns;
    if ((sn && sn->rec.alive) || may_rejoin) {
        o->submitter = submitter;
        return;
    }
    /* its submitter left while the task ran: nobody is left to end it */
    char why[96];
    snprintf(why, sizeof(why), "node %u, which submitted the task that put it on node %u, "
             "had left", submitter, putter);
    obj_withdraw(co, o, why, 0, NULL);
}

int cfx__coord_dir_held_elsewhere(struct cfx_coord *co, const struct cfx_object_id *id,
                                  uint32_t dead)
{
    struct coord_obj *o = obj_find(co, id);
    struct cfx_list *pos;
    if (!o)
        return 0;
    if (o->is_inline)
        return 1;
    cfx_list_for_each(pos, &o->holders) {
        struct coord_holder *h = cfx_list_entry(pos, struct coord_holder, obj_link);
        if (h->complete && h->node->rec.node_id != dead && h->node->rec.alive)
            return 1;
    }
    return 0;
}

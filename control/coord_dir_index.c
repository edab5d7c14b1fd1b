/*
 * The directory's entries in insertion order, and the OBJECTS listing that
 * pages through them.
 *
 * Each entry gets a sequence number when it enters the directory
 * (o->seq, increasing); co->obj_index holds (seq, entry) pairs in that
 * order, so a listing's cursor, the seq of the last entry it returned, is
 * found by a binary search: a page costs O(log n + page), where walking
 * the list from its head to the cursor made each page O(n) and a listing
 * O(n^2) (one admin with far cursors froze the loop for seconds).  An entry
 * that goes leaves a hole (o NULL) that keeps its seq, so the order stays
 * searchable; the holes are squeezed out when they outnumber the entries,
 * or when a page had to step over many of them (so no cursor can make
 * every page walk a long run of holes).  Each squeeze costs O(n) and
 * removes at least n/2, or 4 pages', holes: amortised over the removals.
 *
 * The cursor is 32 bits on the wire: the low half of the seq.  The
 * coordinator takes the latest seq with those low bits (listings are not
 * snapshots, and one spanning 2^32 puts is not a concern), skips seqs whose
 * low half is 0 (cursor 0 is "from the start"), so a cursor from an
 * earlier page always means the entries after it.
 *
 * Loop thread only.
 */
#include "control/coord_int.h"

#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

#define INDEX_CAP_INITIAL 256u
#define INDEX_SQUEEZE_MIN 64u   /* fewer holes are left alone */
#define INDEX_SKIP_MAX    (4u * CFX_PROTO_OBJECTS_PAGE) /* a page stepping over more squeezes */

static void index_squeeze(struct cfx_coord *co)
{
    uint32_t j = 0;
    for (uint32_t i = 0; i < co->obj_index_len; i++) {
        struct coord_obj *o = co->obj_index[i].o;
        if (!o)
            continue;
        co->obj_index[j] = co->obj_index[i];
        o->index_at = j++;
    }
    co->obj_index_len = j;
    co->obj_index_holes = 0;
}

int cfx__coord_dir_index_add(struct cfx_coord *co, struct coord_obj *o)
{
    if (co->obj_index_len == co->obj_index_cap) {
        if (co->obj_index_holes >= INDEX_SQUEEZE_MIN &&
            co->obj_index_holes >= co->obj_index_len / 4) {
            index_squeeze(co);
        } else {
            uint32_t ncap = co->obj_index_cap ? 2 * co->obj_index_cap : INDEX_CAP_INITIAL;
            struct coord_obj_slot *n = ncap > co->obj_index_cap
                                           ? realloc(co->obj_index, (size_t)ncap * sizeof(*n))
                                           : NULL;
            if (!n)
                return cfx__err(CFX_ERR_NOMEM, "no memory for the directory's index");
            co->obj_index = n;
            co->obj_index_cap = ncap;
        }
    }
    do
        o->seq = ++co->obj_seq;
    while (!(uint32_t)o->seq); /* a cursor of 0 means the start */
    o->index_at = co->obj_index_len;
    co->obj_index[co->obj_index_len].seq = o->seq;
    co->obj_index[co->obj_index_len++].o = o;
    return CFX_OK;
}

void cfx__coord_dir_index_del(struct cfx_coord *co, struct coord_obj *o)
{
    co->obj_index[o->index_at].o = NULL;
    co->obj_index_holes++;
    if (co->obj_index_holes >= INDEX_SQUEEZE_MIN &&
        co->obj_index_holes > co->obj_index_len - co->obj_index_holes)
        index_squeeze(co);
}

void cfx__coord_dir_index_fini(struct cfx_coord *co)
{
    free(co->obj_index);
    co->obj_index = NULL;
    co->obj_index_len = co->obj_index_cap = co->obj_index_holes = 0;
}

/* The first slot after the entry of wire cursor @p cursor. */
static uint32_t index_seek(struct cfx_coord *co, uint32_t cursor)
{
    if (!cursor)
        return 0;
    /* the latest seq whose low half is @p cursor */
    uint64_t after = co->obj_seq - (uint32_t)((uint32_t)co->obj_seq - cursor);
    uint32_t lo = 0, hi = co->obj_index_len;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (co->obj_index[mid].seq <= after)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void obj_rec(const struct coord_obj *o, struct cfx_ctl_obj_rec *rec)
{
    struct cfx_list *hp;
    uint32_t nh = 0;
    rec->id = o->id;
    rec->size = o->size;
    rec->chunk_size = o->chunk_size;
    rec->is_inline = o->is_inline;
    rec->nholders = o->nholders;
    memcpy(rec->name, o->name, sizeof(rec->name));
    cfx_list_for_each(hp, &o->holders) {
        struct coord_holder *h = cfx_list_entry(hp, struct coord_holder, obj_link);
        if (nh == CFX_PROTO_HOLDERS_MAX)
            break;
        rec->holders[nh].node_id = h->node->rec.node_id;
        rec->holders[nh].complete = h->complete;
        rec->holders[nh].uploads = h->uploads;
        rec->holders[nh].src = h->complete ? 0 : h->src;
        rec->holders[nh].ready = h->complete ? o->size : h->ready;
        nh++;
    }
}

void cfx__coord_objects_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJECTS_REPLY, .req_id = m->req_id };
    struct cfx_ctl_obj_rec *recs;
    uint32_t count = 0, skipped = 0, i;
    uint64_t last = 0;

    recs = calloc(CFX_PROTO_OBJECTS_PAGE, sizeof(*recs));
    if (!recs) {
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_NOMEM, "coordinator %s is out of memory",
                             co->addr);
        return;
    }
    /* The cursor is a position in insertion order: cheap, not a snapshot. */
    for (i = index_seek(co, m->u.list.cursor); i < co->obj_index_len; i++) {
        const struct coord_obj *o = co->obj_index[i].o;
        if (!o) {
            skipped++;
            continue;
        }
        if (count == CFX_PROTO_OBJECTS_PAGE) {
            r.u.page.more = 1;
            break;
        }
        obj_rec(o, &recs[count++]);
        last = o->seq;
    }
    r.u.page.count = count;
    r.u.page.next = count ? (uint32_t)last : m->u.list.cursor;
    r.u.page.recs_in = recs;
    cfx__coord_send(c, &r);
    free(recs);
    if (skipped > INDEX_SKIP_MAX)
        index_squeeze(co);
}

/*
 * Location cache: where objects this node asked the directory about live,
 * so that a later get of the same id goes straight to that holder over the
 * data plane (get.c) instead of asking the coordinator first.
 *
 * An entry is the directory's answer for one id: the holder's node record
 * and the object's size and chunk size.  The cache is bounded
 * (CFX_LOC_CACHE entries, 0 = off) and evicts with a clock: a hit sets an
 * entry's reference bit, the hand clears bits as it passes and takes the
 * first entry without one.
 *
 * Correctness does not rest on the cache being fresh.  A get from a cached
 * location flags its GET_REQ CFX_DP_GET_CACHED, and the holder serves it
 * only from the putter's own copy of the id, announced to the directory,
 * complete and of the size and chunk size asked for; else it answers
 * NOT_FOUND and the getter forgets the entry and asks the directory.  The
 * putter's copy is, by the lifecycle rules, the one object the id names
 * while it exists (its cfx_delete takes it out of the store before the id
 * is free; a new put of the id makes a new entry), so a stale entry costs
 * one round trip and never yields bytes the id no longer names.  Copies on
 * other nodes refuse cached requests: they are not told when the putter
 * withdraws the object and may hold bytes of an earlier put of the id.
 * Entries also go when the coordinator reports their holder dead
 * (context.c) and when a get from them fails.
 *
 * Memory only: any thread, ctx->lock held.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

static uint32_t loc_hash(const struct cfx_object_id *id)
{
    uint32_t h;
    memcpy(&h, id->bytes, sizeof(h)); /* ids are hashes or carry random bits */
    return h * 2654435761u;
}

int cfx__loc_init(struct cfx_loccache *lc, uint32_t cap)
{
    memset(lc, 0, sizeof(*lc));
    if (!cap)
        return CFX_OK;
    uint32_t nb = 16;
    while (nb < cap && nb < (1u << 24))
        nb <<= 1;
    lc->e = calloc(cap, sizeof(*lc->e));
    lc->buckets = malloc(nb * sizeof(*lc->buckets));
    if (!lc->e || !lc->buckets) {
        free(lc->e);
        free(lc->buckets);
        lc->e = NULL;
        lc->buckets = NULL;
        return CFX_ERR_NOMEM;
    }
    for (uint32_t b = 0; b < nb; b++)
        lc->buckets[b] = -1;
    lc->cap = cap;
    lc->nbuckets = nb;
    return CFX_OK;
}

void cfx__loc_fini(struct cfx_loccache *lc)
{
    free(lc->e);
    free(lc->buckets);
    memset(lc, 0, sizeof(*lc));
}

static int32_t *loc_slot(struct cfx_loccache *lc, const struct cfx_object_id *id)
{
    int32_t *p = &lc->buckets[loc_hash(id) & (lc->nbuckets - 1)];
    while (*p >= 0 && memcmp(lc->e[*p].id.bytes, id->bytes, CFX_OBJECT_ID_LEN) != 0)
        p = &lc->e[*p].hnext;
    return p;
}

static void loc_unlink(struct cfx_loccache *lc, uint32_t i)
{
    int32_t *p = loc_slot(lc, &lc->e[i].id);
    if (*p == (int32_t)i)
        *p = lc->e[i].hnext;
    lc->e[i].used = false;
    lc->n--;
}

bool cfx__loc_find(struct cfx_loccache *lc, const struct cfx_object_id *id,
                   struct cfx_ctl_source *out)
{
    if (!lc->cap)
        return false;
    int32_t i = *loc_slot(lc, id);
    if (i < 0)
        return false;
    struct cfx_loc *e = &lc->e[i];
    e->ref = true;
    memset(out, 0, sizeof(*out));
    out->size = e->size;
    out->chunk_size = e->chunk_size;
    out->complete = 1;
    out->node = e->node;
    return true;
}

uint64_t cfx__loc_put(struct cfx_loccache *lc, const struct cfx_object_id *id,
                      const struct cfx_ctl_source *src)
{
    uint64_t evicted = 0;
    if (!lc->cap || src->is_inline)
        return 0;
    int32_t *p = loc_slot(lc, id);
    int32_t i = *p;
    if (i < 0) {
        /* clock: at most two sweeps find an entry that is free or unused
         * since the hand last passed */
        for (uint32_t step = 0; step < 2 * lc->cap; step++) {
            uint32_t h = lc->hand;
            lc->hand = (lc->hand + 1) % lc->cap;
            if (!lc->e[h].used) {
                i = (int32_t)h;
                break;
            }
            if (lc->e[h].ref) {
                lc->e[h].ref = false;
                continue;
            }
            loc_unlink(lc, h);
            evicted = 1;
            i = (int32_t)h;
            break;
        }
        if (i < 0)
            return 0; /* unreachable: the second sweep finds every bit clear */
        struct cfx_loc *e = &lc->e[i];
        e->id = *id;
        e->used = true;
        p = loc_slot(lc, id); /* an eviction may have changed the chain */
        e->hnext = *p;
        *p = i;
        lc->n++;
    }
    struct cfx_loc *e = &lc->e[i];
    e->ref = false;
    e->size = src->size;
    e->chunk_size = src->chunk_size;
    e->node = src->node;
    return evicted;
}

void cfx__loc_forget(struct cfx_loccache *lc, const struct cfx_object_id *id)
{
    if (!lc->cap)
        return;
    int32_t i = *loc_slot(lc, id);
    if (i >= 0)
        loc_unlink(lc, (uint32_t)i);
}

unsigned cfx__loc_forget_node(struct cfx_loccache *lc, uint32_t node_id)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < lc->cap; i++)
        if (lc->e[i].used && lc->e[i].node.node_id == node_id) {
            loc_unlink(lc, i);
            n++;
        }
    return n;
}

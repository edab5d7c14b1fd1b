/* Local object store: a chained hash table of objects by id. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

static unsigned store_hash(const struct cfx_object_id *id)
{
    uint32_t h;
    /* Ids are SHA-1 outputs or carry a counter in their first bytes: mix. */
    memcpy(&h, id->bytes + 16, sizeof(h));
    uint32_t l;
    memcpy(&l, id->bytes, sizeof(l));
    h ^= l * 0x9e3779b1u;
    return h % CFX_STORE_BUCKETS;
}

struct cfx_obj *cfx__store_find(struct cfx_store *s, const struct cfx_object_id *id)
{
    for (struct cfx_obj *o = s->buckets[store_hash(id)]; o; o = o->hnext)
        if (!memcmp(o->id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return o;
    return NULL;
}

void cfx__store_insert(struct cfx_store *s, struct cfx_obj *o)
{
    unsigned b = store_hash(&o->id);
    o->hnext = s->buckets[b];
    s->buckets[b] = o;
    s->count++;
    o->seq = ++s->last_seq;
}

void cfx__store_remove(struct cfx_store *s, struct cfx_obj *o)
{
    struct cfx_obj **pp = &s->buckets[store_hash(&o->id)];
    for (; *pp; pp = &(*pp)->hnext) {
        if (*pp == o) {
            *pp = o->hnext;
            o->hnext = NULL;
            s->count--;
            return;
        }
    }
}

/*
 * Default chunk: S/128 rounded up to whole pages and clamped to 64 KiB..4
 * MiB, so that a multi-hop pipeline has enough stages to approach S/B;
 * never more than CFX_MAX_CHUNKS chunks (the immediate carries 20 bits of
 * chunk index).  Whole pages, so that a chunk holds whole elements of every
 * dtype (an object reduce reduces chunk by chunk: 100 MB of float32 in
 * chunks of S/128 = 781250 bytes could not be reduced) and starts aligned.
 */
uint32_t cfx__chunk_size_for(uint64_t size, size_t configured)
{
    uint64_t c;
    if (configured) {
        c = configured;
    } else {
        /* 128 chunks: a chain of partial holders pays a chunk's time per
         * hop before its last node starts (8 nodes at 1 Gbit/s: 64 MiB in
         * 1 MiB chunks ended at 1.12x the bound, in 512 KiB at 1.07x), and
         * halving again costs tcp's per-chunk overhead on fast links */
        c = (size / 128 + 4095) & ~(uint64_t)4095;
        if (c < 64 * 1024)
            c = 64 * 1024;
        if (c > 4 * 1024 * 1024)
            c = 4 * 1024 * 1024;
    }
    if (c < CFX_CHUNK_MIN)
        c = CFX_CHUNK_MIN;
    while (size / c >= CFX_MAX_CHUNKS)
        c *= 2;
    if (c > CFX_CHUNK_MAX && size / CFX_CHUNK_MAX < CFX_MAX_CHUNKS)
        c = CFX_CHUNK_MAX;
    return (uint32_t)c;
}

struct cfx_obj *cfx__obj_alloc(uint64_t size, uint32_t chunk)
{
    struct cfx_obj *obj = calloc(1, sizeof(*obj));
    if (!obj)
        return NULL;
    obj->size = size;
    obj->chunk_size = chunk;
    obj->nchunks = cfx__nchunks(size, chunk);
    obj->shm_fd = -1;
    cfx_list_init(&obj->uploads);
    cfx_list_init(&obj->p2p_link);
    obj->bitmap = calloc((obj->nchunks + 63) / 64 + 1, sizeof(uint64_t));
    if (!obj->bitmap) {
        free(obj);
        return NULL;
    }
    return obj;
}

void cfx__withdrawn_add(struct cfx_context *ctx, const struct cfx_object_id *id)
{
    if (cfx__withdrawn_take(ctx, id) || ctx->nwithdrawn < CFX_WITHDRAWN_KEEP)
        ctx->nwithdrawn++;
    ctx->withdrawn[ctx->withdrawn_next] = *id;
    ctx->withdrawn_next = (ctx->withdrawn_next + 1) % CFX_WITHDRAWN_KEEP;
}

bool cfx__withdrawn_take(struct cfx_context *ctx, const struct cfx_object_id *id)
{
    for (unsigned k = 1; k <= ctx->nwithdrawn; k++) {
        unsigned i = (ctx->withdrawn_next + CFX_WITHDRAWN_KEEP - k) % CFX_WITHDRAWN_KEEP;
        if (memcmp(ctx->withdrawn[i].bytes, id->bytes, CFX_OBJECT_ID_LEN))
            continue;
        /* close the gap: the entries newer than i move down one */
        for (unsigned j = i; j != (ctx->withdrawn_next + CFX_WITHDRAWN_KEEP - 1) %
                                    CFX_WITHDRAWN_KEEP;
             j = (j + 1) % CFX_WITHDRAWN_KEEP)
            ctx->withdrawn[j] = ctx->withdrawn[(j + 1) % CFX_WITHDRAWN_KEEP];
        ctx->withdrawn_next = (ctx->withdrawn_next + CFX_WITHDRAWN_KEEP - 1) % CFX_WITHDRAWN_KEEP;
        ctx->nwithdrawn--;
        return true;
    }
    return false;
}

void cfx__gone_note(struct cfx_context *ctx, const struct cfx_object_id *id)
{
    ctx->gone_recent[ctx->gone_seq++ % CFX_GONE_RECENT] = *id;
}

/* Was @p id withdrawn since withdrawal count @p seq?  Too many since to
 * tell: taken as yes. */
bool cfx__gone_since(const struct cfx_context *ctx, const struct cfx_object_id *id, uint64_t seq)
{
    if (ctx->gone_seq - seq >= CFX_GONE_RECENT)
        return ctx->gone_seq != seq;
    for (uint64_t s = seq; s < ctx->gone_seq; s++)
        if (!memcmp(ctx->gone_recent[s % CFX_GONE_RECENT].bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return true;
    return false;
}

uint64_t cfx__record_drop_begin(struct cfx_context *ctx, const struct cfx_object_id *id)
{
    cfx__gone_note(ctx, id);
    return ctx->store.last_seq;
}

void cfx__record_drop_end(struct cfx_context *ctx, const struct cfx_object_id *id, uint64_t seq)
{
    cfx__gone_note(ctx, id);
    struct cfx_obj *o = cfx__store_find(&ctx->store, id);
    if (o && o->seq > seq) /* kept by a get whose lookup the message may have overtaken */
        cfx__copy_withdrawn(ctx, o);
}

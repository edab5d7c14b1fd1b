/*
 * Shard maps: which server owns each block, plus the job's members and
 * settings.  A map is immutable once published; a change is a new version.
 *
 * Blocks are numbered globally in registration order: tensor t owns blocks
 * first_block .. first_block + nblocks - 1, block i of it holds elements
 * i * block_elems .. min(count, (i + 1) * block_elems) - 1.
 *
 * The wire form is a flat record in host byte order (every member of a
 * cluster runs the same build): fixed header, workers, servers, tensors,
 * owners.  Decoding checks every count and index before use.
 *
 * A block whose values were lost with a failed server (moved off it after
 * it failed: no state ever comes) carries the mark in the map itself, in
 * the high byte of its owner word: every owner, whichever versions it saw,
 * knows it from the map alone.
 */
#include "ps_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cfx__ps_map_init(struct ps_map *m)
{
    memset(m, 0, sizeof(*m));
}

void cfx__ps_map_free(struct ps_map *m)
{
    if (!m)
        return;
    free(m->tensors);
    free(m->owner);
    free(m->lost);
    m->tensors = NULL;
    m->owner = NULL;
    m->lost = NULL;
    m->ntensors = m->nblocks = 0;
}

int cfx__ps_map_copy(struct ps_map *dst, const struct ps_map *src)
{
    struct ps_map tmp = *src;
    tmp.tensors = NULL;
    tmp.owner = NULL;
    tmp.lost = NULL;
    if (src->ntensors) {
        tmp.tensors = malloc(src->ntensors * sizeof(*tmp.tensors));
        if (!tmp.tensors)
            return CFX_ERR_NOMEM;
        memcpy(tmp.tensors, src->tensors, src->ntensors * sizeof(*tmp.tensors));
    }
    if (src->nblocks) {
        tmp.owner = malloc(src->nblocks * sizeof(*tmp.owner));
        if (!tmp.owner) {
            free(tmp.tensors);
            return CFX_ERR_NOMEM;
        }
        memcpy(tmp.owner, src->owner, src->nblocks * sizeof(*tmp.owner));
    }
    if (src->nblocks && src->lost) {
        tmp.lost = malloc(src->nblocks);
        if (!tmp.lost) {
            free(tmp.tensors);
            free(tmp.owner);
            return CFX_ERR_NOMEM;
        }
        memcpy(tmp.lost, src->lost, src->nblocks);
    }
    cfx__ps_map_free(dst);
    *dst = tmp;
    return CFX_OK;
}

int cfx__ps_map_find(const struct ps_map *m, const char *name)
{
    for (uint32_t t = 0; t < m->ntensors; t++)
        if (!strncmp(m->tensors[t].name, name, PS_TENSOR_NAME_MAX))
            return (int)t;
    return CFX_ERR_NOT_FOUND;
}

int cfx__ps_map_block(const struct ps_map *m, uint32_t b, uint32_t *tensor, uint64_t *off,
                      uint64_t *elems)
{
    if (b >= m->nblocks)
        return CFX_ERR_INVALID;
    /* tensors are few and sorted by first_block: binary search */
    uint32_t lo = 0, hi = m->ntensors;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (m->tensors[mid].first_block <= b)
            lo = mid;
        else
            hi = mid;
    }
    const struct ps_tensor *t = &m->tensors[lo];
    if (b < t->first_block || b >= t->first_block + t->nblocks)
        return CFX_ERR_INVALID;
    uint64_t o = (uint64_t)(b - t->first_block) * t->block_elems;
    if (tensor)
        *tensor = lo;
    if (off)
        *off = o;
    if (elems)
        *elems = CFX_MIN(t->block_elems, t->count - o);
    return CFX_OK;
}

uint64_t cfx__ps_map_block_bytes(const struct ps_map *m, uint32_t b)
{
    uint32_t t;
    uint64_t elems;
    if (cfx__ps_map_block(m, b, &t, NULL, &elems) != CFX_OK)
        return 0;
    return elems * cfx_dtype_size((enum cfx_dtype)m->tensors[t].dtype);
}

void cfx__ps_map_load(const struct ps_map *m, uint32_t s, uint32_t *blocks, uint64_t *bytes)
{
    uint32_t nb = 0;
    uint64_t by = 0;
    for (uint32_t b = 0; b < m->nblocks; b++)
        if (m->owner[b] == s) {
            nb++;
            by += cfx__ps_map_block_bytes(m, b);
        }
    if (blocks)
        *blocks = nb;
    if (bytes)
        *bytes = by;
}

int cfx__ps_map_add_tensor(struct ps_map *m, const char *name, enum cfx_dtype dtype, uint64_t count,
                           const uint8_t *gone)
{
    size_t esz = cfx_dtype_size(dtype);
    if (!name || !*name || strlen(name) >= PS_TENSOR_NAME_MAX || !esz || !count ||
        count > UINT64_MAX / esz)
        return CFX_ERR_INVALID; /* its size in bytes must be a number */
    if (cfx__ps_map_find(m, name) >= 0)
        return CFX_ERR_EXISTS;
    if (m->ntensors >= PS_MAX_TENSORS)
        return CFX_ERR_NO_RESOURCE;
    uint64_t bs = m->conf.block_size ? m->conf.block_size : PS_BLOCK_DEFAULT;
    uint64_t be = CFX_MAX(1, bs / esz);
    uint64_t nb = count / be + (count % be != 0);
    if (nb > PS_MAX_BLOCKS - m->nblocks)
        return CFX_ERR_NO_RESOURCE;

    /* bytes per active server so far: new blocks go to the least loaded
     * that is not gone (a block given to a dead server would never be
     * initialized: its tensor never gets ready) */
    uint64_t load[PS_MAX_SERVERS] = { 0 };
    bool any = false, live = false;
    for (uint32_t s = 0; s < m->nservers; s++) {
        bool active = m->server[s].state == CFX_PS_SERVER_ACTIVE;
        any |= active;
        live |= active && !(gone && gone[s]);
    }
    if (!any)
        return CFX_ERR_INVALID;
    if (!live)
        return CFX_ERR_PEER_FAILED;
    for (uint32_t b = 0; b < m->nblocks; b++)
        load[m->owner[b]] += cfx__ps_map_block_bytes(m, b);

    struct ps_tensor *nt = realloc(m->tensors, (m->ntensors + 1) * sizeof(*nt));
    if (!nt)
        return CFX_ERR_NOMEM;
    m->tensors = nt;
    uint16_t *no = realloc(m->owner, (m->nblocks + nb) * sizeof(*no));
    if (!no)
        return CFX_ERR_NOMEM;
    m->owner = no;
    if (m->lost) {
        uint8_t *nl = realloc(m->lost, m->nblocks + nb);
        if (!nl)
            return CFX_ERR_NOMEM;
        memset(nl + m->nblocks, 0, nb);
        m->lost = nl;
    }

    struct ps_tensor *t = &m->tensors[m->ntensors];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->dtype = dtype;
    t->count = count;
    t->block_elems = be;
    t->first_block = m->nblocks;
    t->nblocks = (uint32_t)nb;
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t bytes = CFX_MIN(be, count - i * be) * esz;
        uint32_t best = UINT32_MAX;
        for (uint32_t s = 0; s < m->nservers; s++)
            if (m->server[s].state == CFX_PS_SERVER_ACTIVE && !(gone && gone[s]) &&
                (best == UINT32_MAX || load[s] < load[best]))
                best = s;
        m->owner[m->nblocks + i] = (uint16_t)best;
        load[best] += bytes;
    }
    m->nblocks += (uint32_t)nb;
    return (int)m->ntensors++;
}

/* ---- wire form ------------------------------------------------------------------ */

struct wbuf {
    uint8_t *p;
    size_t len, cap;
    bool over;
};

static void put(struct wbuf *w, const void *v, size_t n)
{
    if (!n)
        return; /* v may be NULL then */
    if (w->len + n > w->cap) {
        w->over = true;
        return;
    }
    memcpy(w->p + w->len, v, n);
    w->len += n;
}

#define PUT(w, v) put((w), &(v), sizeof(v))

int cfx__ps_map_encode(const struct ps_map *m, void *buf, size_t cap)
{
    struct wbuf w = { .p = buf, .cap = cap };
    uint32_t magic = PS_MAGIC;
    PUT(&w, magic);
    PUT(&w, m->version);
    PUT(&w, m->flags);
    PUT(&w, m->admin_next);
    PUT(&w, m->conf);
    PUT(&w, m->nworkers);
    put(&w, m->worker_node, m->nworkers * sizeof(uint32_t));
    PUT(&w, m->nservers);
    put(&w, m->server, m->nservers * sizeof(m->server[0]));
    PUT(&w, m->ntensors);
    put(&w, m->tensors, m->ntensors * sizeof(m->tensors[0]));
    PUT(&w, m->nblocks);
    for (uint32_t b = 0; b < m->nblocks; b++) {
        uint16_t word = (uint16_t)(m->owner[b] | cfx__ps_map_lost(m, b) << 8);
        PUT(&w, word);
    }
    return w.over ? CFX_ERR_TOO_BIG : (int)w.len;
}

struct rbuf {
    const uint8_t *p;
    size_t len, off;
    bool bad;
};

static void get(struct rbuf *r, void *v, size_t n)
{
    if (!n)
        return;
    if (r->bad || r->off + n > r->len) {
        r->bad = true;
        memset(v, 0, n);
        return;
    }
    memcpy(v, r->p + r->off, n);
    r->off += n;
}

#define GET(r, v) get((r), &(v), sizeof(v))

int cfx__ps_map_decode(const void *buf, size_t len, struct ps_map *out)
{
    struct rbuf r = { .p = buf, .len = len };
    struct ps_map m;
    uint32_t magic;
    cfx__ps_map_init(&m);
    GET(&r, magic);
    GET(&r, m.version);
    GET(&r, m.flags);
    GET(&r, m.admin_next);
    GET(&r, m.conf);
    GET(&r, m.nworkers);
    if (r.bad || magic != PS_MAGIC || m.nworkers > PS_MAX_WORKERS)
        goto bad;
    get(&r, m.worker_node, m.nworkers * sizeof(uint32_t));
    GET(&r, m.nservers);
    if (r.bad || m.nservers > PS_MAX_SERVERS)
        goto bad;
    get(&r, m.server, m.nservers * sizeof(m.server[0]));
    GET(&r, m.ntensors);
    if (r.bad || m.ntensors > PS_MAX_TENSORS)
        goto bad;
    if (m.ntensors) {
        m.tensors = malloc(m.ntensors * sizeof(*m.tensors));
        if (!m.tensors)
            return CFX_ERR_NOMEM;
        get(&r, m.tensors, m.ntensors * sizeof(*m.tensors));
    }
    GET(&r, m.nblocks);
    if (r.bad || m.nblocks > PS_MAX_BLOCKS)
        goto bad;
    if (m.nblocks) {
        m.owner = malloc(m.nblocks * sizeof(*m.owner));
        m.lost = malloc(m.nblocks);
        if (!m.owner || !m.lost)
            goto nomem;
        get(&r, m.owner, m.nblocks * sizeof(*m.owner));
        for (uint32_t b = 0; b < m.nblocks; b++) {
            m.lost[b] = (uint8_t)(m.owner[b] >> 8);
            m.owner[b] &= 0xff;
        }
    }
    if (r.bad || r.off != len)
        goto bad;
    /* tensors tile the blocks in order; owners name servers */
    uint32_t next = 0;
    for (uint32_t t = 0; t < m.ntensors; t++) {
        const struct ps_tensor *x = &m.tensors[t];
        size_t esz = cfx_dtype_size((enum cfx_dtype)x->dtype);
        if (x->first_block != next || !x->block_elems || !x->count || !esz ||
            x->count > UINT64_MAX / esz || x->nblocks > m.nblocks - next ||
            x->count / x->block_elems + (x->count % x->block_elems != 0) != x->nblocks ||
            memchr(x->name, 0, sizeof(x->name)) == NULL)
            goto bad;
        next += x->nblocks;
    }
    if (next != m.nblocks)
        goto bad;
    for (uint32_t b = 0; b < m.nblocks; b++)
        if (m.owner[b] >= m.nservers)
            goto bad;
    if (m.conf.consistency > CFX_PS_ASP || m.conf.staleness > PS_MAX_STALENESS ||
        m.conf.optim.type > CFX_PS_OPT_ADAM)
        goto bad;
    /* a state is a name's index to readers (rdmactl, Python): one this build
     * does not know is refused, named, not shown as another or read past */
    for (uint32_t s = 0; s < m.nservers; s++)
        if (m.server[s].state < CFX_PS_SERVER_ACTIVE || m.server[s].state > CFX_PS_SERVER_FAILED) {
            cfx__err(CFX_ERR_PROTO,
                     "server %u (node %u) is in state %u, which this build "
                     "does not know (%d..%d)",
                     s, m.server[s].node_id, m.server[s].state, CFX_PS_SERVER_ACTIVE,
                     CFX_PS_SERVER_FAILED);
            cfx__ps_map_free(&m);
            return CFX_ERR_PROTO;
        }
    /* a lost mark names the failed server the values went with: failed in
     * this map (a failed state is final), and not the block's owner */
    for (uint32_t b = 0; b < m.nblocks; b++) {
        uint32_t l = m.lost[b];
        if (l && (l > m.nservers || m.server[l - 1].state != CFX_PS_SERVER_FAILED ||
                  l - 1 == m.owner[b])) {
            cfx__err(CFX_ERR_PROTO, "block %u is marked lost with server %u, which %s", b, l - 1,
                     l > m.nservers        ? "is not in the job"
                     : l - 1 == m.owner[b] ? "owns it"
                                           : "has not failed");
            cfx__ps_map_free(&m);
            return CFX_ERR_PROTO;
        }
    }
    cfx__ps_map_free(out);
    *out = m;
    return CFX_OK;
bad:
    cfx__ps_map_free(&m);
    return cfx__err(CFX_ERR_PROTO, "counts, sizes or settings out of range");
nomem:
    cfx__ps_map_free(&m);
    return CFX_ERR_NOMEM;
}

void cfx__ps_map_stats(const struct ps_map *m, struct cfx_ps_stats *out)
{
    out->map_version = m->version;
    out->nservers = m->nservers;
    out->ntensors = m->ntensors;
    out->nblocks = m->nblocks;
    for (uint32_t s = 0; s < m->nservers && s < CFX_ARRAY_SIZE(out->servers); s++) {
        struct cfx_ps_server_info *i = &out->servers[s];
        i->index = (int)s;
        i->node_id = m->server[s].node_id;
        i->state = (int)m->server[s].state;
        i->ns_per_byte = m->server[s].ns_per_byte;
        i->straggler = (int)m->server[s].straggler;
        cfx__ps_map_load(m, s, &i->blocks, &i->bytes);
    }
}

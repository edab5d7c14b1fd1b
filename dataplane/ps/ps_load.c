/*
 * Parameter-server load per block, for the heartbeat (docs/OPERATING.md,
 * "Metrics").  A server counts, per global block, the requests it served
 * (push, pull, push-pull; not the initial store) and their payload bytes,
 * from its start: a block it handed on keeps its counts here, the new
 * owner counts from zero.
 *
 * Threads.  The server's loop thread is the only writer: one relaxed
 * atomic add per counter per request, no lock.  The counters sit in
 * chunks of PS_LOAD_CHUNK blocks, allocated by the loop thread when a map
 * first gives the server a block of the chunk (not while serving),
 * published with a release store and freed only with the table (after it
 * left ctx->ps_load, under ps_load_lock).  The control client's thread
 * reads them in cfx__ps_load_beat(), which only tries ps_load_lock: while
 * a server is being added or removed it repeats the report before.
 */
#include "ps_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"

_Static_assert(CFX_CTL_PS_JOB_MAX + 1 == PS_JOB_MAX, "a job name fits a PS report whole");

#define PS_LOAD_CHUNK  256u                            /* blocks per chunk */
#define PS_LOAD_CHUNKS (PS_MAX_BLOCKS / PS_LOAD_CHUNK) /* chunks per table */

struct ps_block_load {
    uint64_t requests; /* served on this block */
    uint64_t bytes;    /* their payload: pushed and pulled */
};

struct cfx_ps_load {
    char job[PS_JOB_MAX];                        /* the server's job */
    uint32_t server;                             /* index in the job */
    uint32_t blocks;                             /* blocks the current map gives it (atomic) */
    uint64_t requests;                           /* all blocks (atomic) */
    uint64_t bytes;                              /* ... and their payload bytes (atomic) */
    struct ps_block_load *chunk[PS_LOAD_CHUNKS]; /* NULL: none of its blocks owned yet */
};

int cfx__ps_load_start(struct cfx_ps *ps)
{
    struct cfx_context *ctx = ps->ctx;
    struct cfx_ps_load *l = calloc(1, sizeof(*l));
    if (!l)
        return cfx__err(CFX_ERR_NOMEM, "job %s: server %d: no memory for its load table", ps->job,
                        ps->index);
    snprintf(l->job, sizeof(l->job), "%s", ps->job);
    l->server = (uint32_t)ps->index;
    ps->load = l;
    pthread_mutex_lock(&ctx->ps_load_lock);
    unsigned i;
    for (i = 0; i < CFX_CTL_PS_SERVERS_MAX && ctx->ps_load[i]; i++)
        ;
    if (i < CFX_CTL_PS_SERVERS_MAX)
        ctx->ps_load[i] = l;
    pthread_mutex_unlock(&ctx->ps_load_lock);
    if (i == CFX_CTL_PS_SERVERS_MAX)
        CFX_LOG(WARN, PS,
                "job %s: server %d: this context already reports %u PS servers; "
                "its load is counted but not reported",
                ps->job, ps->index, CFX_CTL_PS_SERVERS_MAX);
    return CFX_OK;
}

void cfx__ps_load_stop(struct cfx_ps *ps)
{
    struct cfx_context *ctx = ps->ctx;
    struct cfx_ps_load *l = ps->load;
    if (!l)
        return;
    pthread_mutex_lock(&ctx->ps_load_lock);
    for (unsigned i = 0; i < CFX_CTL_PS_SERVERS_MAX; i++)
        if (ctx->ps_load[i] == l)
            ctx->ps_load[i] = NULL;
    pthread_mutex_unlock(&ctx->ps_load_lock);
    for (unsigned c = 0; c < PS_LOAD_CHUNKS; c++)
        free(l->chunk[c]);
    free(l);
    ps->load = NULL;
}

/* The chunk of @p block, made if needed (loop thread); NULL without memory. */
static struct ps_block_load *chunk_of(struct cfx_ps_load *l, uint32_t block)
{
    struct ps_block_load *c = l->chunk[block / PS_LOAD_CHUNK];
    if (!c) {
        c = calloc(PS_LOAD_CHUNK, sizeof(*c));
        if (c)
            __atomic_store_n(&l->chunk[block / PS_LOAD_CHUNK], c, __ATOMIC_RELEASE);
    }
    return c;
}

void cfx__ps_load_count(struct cfx_ps *ps, uint32_t block, uint64_t bytes)
{
    struct cfx_ps_load *l = ps->load;
    if (unlikely(!l || block >= PS_MAX_BLOCKS))
        return;
    __atomic_add_fetch(&l->requests, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&l->bytes, bytes, __ATOMIC_RELAXED);
    /* made when a map gave us the block (cfx__ps_load_owned); here only if
     * that found no memory */
    struct ps_block_load *c = l->chunk[block / PS_LOAD_CHUNK];
    if (unlikely(!c) && !(c = chunk_of(l, block)))
        return; /* the totals above still count it */
    struct ps_block_load *b = &c[block % PS_LOAD_CHUNK];
    __atomic_add_fetch(&b->requests, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&b->bytes, bytes, __ATOMIC_RELAXED);
}

void cfx__ps_load_owned(struct cfx_ps *ps)
{
    struct cfx_ps_load *l = ps->load;
    uint32_t blocks = 0;
    uint64_t bytes;
    if (!l)
        return;
    cfx__ps_map_load(&ps->map, (uint32_t)ps->index, &blocks, &bytes);
    __atomic_store_n(&l->blocks, blocks, __ATOMIC_RELAXED);
    /* the counters of the blocks it owns now, so that serving them allocates nothing */
    for (uint32_t b = 0; b < ps->map.nblocks && b < PS_MAX_BLOCKS; b++)
        if (ps->map.owner[b] == (uint32_t)ps->index && !l->chunk[b / PS_LOAD_CHUNK])
            chunk_of(l, b);
}

/* Whether @p a goes before @p b: more bytes, then the lower server entry
 * and block (so that equal loads report the same blocks every beat). */
static bool heavier(const struct cfx_ctl_ps_block *a, const struct cfx_ctl_ps_block *b)
{
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes;
    if (a->srv != b->srv)
        return a->srv < b->srv;
    return a->block < b->block;
}

/* Keep @p out's blocks the CFX_CTL_PS_BLOCKS_MAX heaviest, heaviest first. */
static void keep_heaviest(struct cfx_ctl_ps_report *out, const struct cfx_ctl_ps_block *x)
{
    uint32_t n = out->nblocks;
    if (n == CFX_CTL_PS_BLOCKS_MAX && !heavier(x, &out->blocks[n - 1]))
        return;
    if (n < CFX_CTL_PS_BLOCKS_MAX)
        n++;
    uint32_t i = n - 1;
    for (; i > 0 && heavier(x, &out->blocks[i - 1]); i--)
        out->blocks[i] = out->blocks[i - 1];
    out->blocks[i] = *x;
    out->nblocks = n;
}

/* ctx->ps_load_lock held: the servers and their heaviest blocks. */
static void fill(struct cfx_context *ctx, struct cfx_ctl_ps_report *out)
{
    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i < CFX_CTL_PS_SERVERS_MAX; i++) {
        const struct cfx_ps_load *l = ctx->ps_load[i];
        if (!l)
            continue;
        uint8_t srv = (uint8_t)out->nservers++;
        struct cfx_ctl_ps_server *s = &out->servers[srv];
        snprintf(s->job, sizeof(s->job), "%s", l->job);
        s->server = l->server;
        s->blocks = __atomic_load_n(&l->blocks, __ATOMIC_RELAXED);
        s->requests = __atomic_load_n(&l->requests, __ATOMIC_RELAXED);
        s->bytes = __atomic_load_n(&l->bytes, __ATOMIC_RELAXED);
        for (unsigned c = 0; c < PS_LOAD_CHUNKS; c++) {
            const struct ps_block_load *chunk = __atomic_load_n(&l->chunk[c], __ATOMIC_ACQUIRE);
            for (unsigned k = 0; chunk && k < PS_LOAD_CHUNK; k++) {
                struct cfx_ctl_ps_block b = {
                    .srv = srv,
                    .block = c * PS_LOAD_CHUNK + k,
                    .requests = __atomic_load_n(&chunk[k].requests, __ATOMIC_RELAXED),
                    .bytes = __atomic_load_n(&chunk[k].bytes, __ATOMIC_RELAXED),
                };
                if (b.requests)
                    keep_heaviest(out, &b);
            }
        }
    }
}

void cfx__ps_load_beat(struct cfx_context *ctx, struct cfx_ctl_ps_report *out)
{
    if (pthread_mutex_trylock(&ctx->ps_load_lock) == 0) {
        fill(ctx, &ctx->ps_last);
        pthread_mutex_unlock(&ctx->ps_load_lock);
    }
    *out = ctx->ps_last;
}

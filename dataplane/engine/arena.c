/*
 * The registered arena: memfd-backed MAP_SHARED segments, so that a peer on
 * the same host can map a destination and copy into it once (shm transport).
 * One segment per allocation; freed segments are cached for reuse (their fd
 * stays open, so a peer's cached mapping of an fd number never points at a
 * different file) up to a bound in bytes and one in segments, the one freed
 * longest ago closed to make room: each holds a file descriptor, and a
 * process frees buffers of many sizes (a worker's task results) under a
 * limit of 1024 descriptors by default.
 */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#define ARENA_CACHE_MAX  (1024ull * 1024 * 1024) /* bytes of free segments kept */
#define ARENA_CACHE_SEGS 64u                     /* ... and at most this many */
#define ARENA_ALIGN     4096u

static int arena_alloc(struct cfx_context *ctx, size_t size, void **out, int *fd,
                       uint64_t *off, bool locked);

int cfx__arena_alloc(struct cfx_context *ctx, size_t size, void **out, int *fd,
                     uint64_t *off)
{
    return arena_alloc(ctx, size, out, fd, off, false);
}

int cfx__arena_alloc_locked(struct cfx_context *ctx, size_t size, void **out, int *fd,
                            uint64_t *off)
{
    return arena_alloc(ctx, size, out, fd, off, true);
}

static int arena_alloc(struct cfx_context *ctx, size_t size, void **out, int *fd,
                       uint64_t *off, bool locked)
{
    struct cfx_arena *a = &ctx->arena;
    struct cfx_arena_seg *seg = NULL, *best = NULL;
    struct cfx_list *pos;
    size_t len = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    int status;

    if (size > SIZE_MAX - (ARENA_ALIGN - 1)) /* the rounding would wrap to a small length */
        return cfx__err(CFX_ERR_NOMEM, "arena: %zu bytes cannot be allocated", size);
    if (len == 0)
        len = ARENA_ALIGN;

    if (!locked)
        pthread_mutex_lock(&ctx->lock);
    cfx_list_for_each(pos, &a->segs) {
        seg = cfx_list_entry(pos, struct cfx_arena_seg, link);
        /* reuse a cached segment that is big enough but not wasteful */
        if (!seg->used && seg->len >= len && seg->len <= 2 * len &&
            (!best || seg->len < best->len))
            best = seg;
    }
    if (best) {
        best->used = true;
        a->cached_bytes -= best->len;
        a->cached_segs--;
        __atomic_add_fetch(&a->used_bytes, best->len, __ATOMIC_RELAXED);
        if (!locked)
            pthread_mutex_unlock(&ctx->lock);
        *out = best->base;
        *fd = best->fd;
        *off = 0;
        return CFX_OK;
    }
    if (!locked)
        pthread_mutex_unlock(&ctx->lock);

    /* A new segment's pages are had as they are first touched (shmem
     * overcommits: a 32 TiB buffer came back CFX_OK on a 23 GiB machine, to
     * die of SIGBUS or the OOM killer when written).  What this machine's
     * memory and swap together could never back is refused now; below that,
     * running short is found when the pages are touched, as with malloc. */
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        unsigned long long cap = ((unsigned long long)si.totalram + si.totalswap) * si.mem_unit;
        if (len > cap)
            return cfx__err(CFX_ERR_NOMEM, "arena: %zu bytes: more than this machine's memory "
                            "and swap together (%llu bytes)", size, cap);
    }

    seg = calloc(1, sizeof(*seg));
    if (!seg)
        return cfx__err(CFX_ERR_NOMEM, "arena: out of memory for a segment header");
    seg->fd = memfd_create("conflux-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (seg->fd < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "arena: memfd_create: %s",
                          strerror(errno));
        goto err_free_seg;
    }
    if (ftruncate(seg->fd, (off_t)len) < 0) {
        status = cfx__err(CFX_ERR_NOMEM, "arena: cannot size a %zu-byte segment: %s",
                          len, strerror(errno));
        goto err_close_fd;
    }
    /* sealed against resizing: a peer that maps it for direct writes can
     * rely on its size (shm refuses to write into unsealed files) */
    if (fcntl(seg->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "arena: cannot seal a segment: %s",
                          strerror(errno));
        goto err_close_fd;
    }
    seg->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (seg->base == MAP_FAILED) {
        status = cfx__err(CFX_ERR_NOMEM, "arena: cannot map %zu bytes: %s", len,
                          strerror(errno));
        goto err_close_fd;
    }
    seg->len = len;
    seg->used = true;

    if (!locked)
        pthread_mutex_lock(&ctx->lock);
    cfx_list_add_tail(&seg->link, &a->segs);
    __atomic_add_fetch(&a->used_bytes, seg->len, __ATOMIC_RELAXED);
    if (!locked)
        pthread_mutex_unlock(&ctx->lock);
    *out = seg->base;
    *fd = seg->fd;
    *off = 0;
    return CFX_OK;

err_close_fd:
    close(seg->fd);
err_free_seg:
    free(seg);
    return status;
}

/* ctx->lock held. */
static struct cfx_arena_seg *arena_find(struct cfx_arena *a, const void *p)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &a->segs) {
        struct cfx_arena_seg *seg = cfx_list_entry(pos, struct cfx_arena_seg, link);
        if (seg->used && (const char *)p >= (const char *)seg->base &&
            (const char *)p < (const char *)seg->base + seg->len)
            return seg;
    }
    return NULL;
}

int cfx__arena_lookup(struct cfx_context *ctx, const void *p, int *fd, uint64_t *off)
{
    struct cfx_arena_seg *seg = arena_find(&ctx->arena, p);
    if (!seg)
        return CFX_ERR_NOT_FOUND;
    *fd = seg->fd;
    *off = (uint64_t)((const char *)p - (const char *)seg->base);
    return CFX_OK;
}

/* Unmap a segment for good.  A transport may still hold a registration of
 * these pages past its last user (verbs caches them for reuse); it drops
 * it first (mem_invalidate), or a later segment mapped at the same address
 * would hit it and peers would write into the old, still pinned, pages. */
static void seg_unmap(struct cfx_context *ctx, struct cfx_arena_seg *seg)
{
    for (int i = 0; i < ctx->ntp; i++)
        cfx__tp_mem_invalidate(ctx->tp[i].ops, ctx->tp[i].iface, seg->base, seg->len);
    munmap(seg->base, seg->len);
    close(seg->fd);
    free(seg);
}

void cfx__arena_taint(struct cfx_context *ctx, const void *p)
{
    struct cfx_arena_seg *seg = arena_find(&ctx->arena, p);
    if (seg)
        seg->tainted = true;
}

static void seg_drop(struct cfx_context *ctx, struct cfx_arena_seg *seg);

/* ctx->lock held: the cached segment freed longest ago but @p except (one
 * being freed), or NULL. */
static struct cfx_arena_seg *oldest_cached(struct cfx_arena *a,
                                           const struct cfx_arena_seg *except)
{
    struct cfx_arena_seg *old = NULL;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &a->segs) {
        struct cfx_arena_seg *s = cfx_list_entry(pos, struct cfx_arena_seg, link);
        if (!s->used && s != except && (!old || s->freed < old->freed))
            old = s;
    }
    return old;
}

/* ctx->lock held. */
void cfx__arena_free(struct cfx_context *ctx, void *p)
{
    struct cfx_arena *a = &ctx->arena;
    struct cfx_arena_seg *seg = arena_find(a, p);
    if (!seg || seg->base != p) {
        CFX_LOG(ERR, ARENA, "free of %p which is not an arena buffer: ignored", p);
        return;
    }
    seg->used = false;
    __atomic_sub_fetch(&a->used_bytes, seg->len, __ATOMIC_RELAXED);
    if (!seg->tainted && seg->len <= ARENA_CACHE_MAX) {
        /* kept; the oldest cached ones make room (a size not asked for
         * again does not hold its place for good) */
        struct cfx_arena_seg *old;
        while ((a->cached_segs >= ARENA_CACHE_SEGS ||
                a->cached_bytes + seg->len > ARENA_CACHE_MAX) &&
               (old = oldest_cached(a, seg))) {
            a->cached_bytes -= old->len;
            a->cached_segs--;
            seg_drop(ctx, old);
        }
        seg->freed = ++a->free_seq;
        a->cached_bytes += seg->len;
        a->cached_segs++;
        return;
    }
    seg_drop(ctx, seg);
}

/* ctx->lock held: @p seg (not used, not counted as cached) goes for good. */
static void seg_drop(struct cfx_context *ctx, struct cfx_arena_seg *seg)
{
    struct cfx_arena *a = &ctx->arena;
    cfx_list_del(&seg->link);
    /* Unmapping drops the segment from the transports' registration caches
     * (mem_invalidate): a transport call, for the progress-lock holder only.  An API thread
     * does it when the lock is free, else leaves it to the holder (the
     * pages stay mapped until then, so their address is not reused). */
    if (cfx__progress_held(ctx)) {
        seg_unmap(ctx, seg);
    } else if (cfx__progress_trylock(ctx)) {
        seg_unmap(ctx, seg);
        cfx__progress_unlock(ctx);
    } else {
        cfx_list_add_tail(&seg->link, &a->doomed);
        cfx__progress_wake(ctx); /* an asleep progress thread reaps it now, not at its nap's end */
    }
}

int cfx__arena_reap(struct cfx_context *ctx)
{
    int n = 0;
    while (!cfx_list_empty(&ctx->arena.doomed)) {
        struct cfx_arena_seg *seg =
            cfx_list_entry(ctx->arena.doomed.next, struct cfx_arena_seg, link);
        cfx_list_del(&seg->link);
        seg_unmap(ctx, seg);
        n++;
    }
    return n;
}

void cfx__arena_destroy(struct cfx_context *ctx)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->arena.segs) {
        struct cfx_arena_seg *seg = cfx_list_entry(pos, struct cfx_arena_seg, link);
        cfx_list_del(&seg->link);
        seg_unmap(ctx, seg);
    }
    ctx->arena.cached_bytes = 0;
    ctx->arena.cached_segs = 0;
    cfx__arena_reap(ctx);
}

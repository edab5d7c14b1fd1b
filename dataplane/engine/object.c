/* The object API: put, get, delete and their non-blocking forms. */
#include "engine.h"
#include "gpu_stage.h"
#include "gpu/memtype.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANCEL_GRACE_MS 1000 /* how long a withdrawn window waits for the source's ack */
#define MAX_SOURCES 16       /* sources a get tries before giving up */
#define RELEASE_WAIT_MS 2000 /* a failed get waits this long for its release */

static int obj_timeout(const struct cfx_context *ctx, const struct cfx_obj_params *p)
{
    return p && (p->field_mask & CFX_OBJ_PARAM_TIMEOUT) ? p->timeout_ms : ctx->cfg.timeout_ms;
}

static enum cfx_memtype obj_memtype(const struct cfx_obj_params *p)
{
    return p && (p->field_mask & CFX_OBJ_PARAM_MEMTYPE) ? p->memtype : CFX_MEMTYPE_HOST;
}

/* Buffers of @p mt can be used here: CFX_ERR_INVALID for an unknown type,
 * CFX_ERR_UNSUPPORTED when not built in, CFX_ERR_NO_DEVICE with no device. */
static int check_memtype(enum cfx_memtype mt, const char *what)
{
    if ((unsigned)mt >= CFX_MEMTYPE_LAST)
        return cfx__err(CFX_ERR_INVALID, "%s: unknown memory type %d", what, (int)mt);
    return cfx__memtype_require(mt, what);
}

static struct cfx_obj *obj_new(const struct cfx_object_id *id, uint64_t size, uint32_t chunk)
{
    struct cfx_obj *obj = cfx__obj_alloc(size, chunk);
    if (obj)
        obj->id = *id;
    return obj;
}

/* ---- put ------------------------------------------------------------------- */

static int put_call(struct cfx_context *ctx, const struct cfx_object_id *id,
                    const void *buf, size_t size, const struct cfx_obj_params *params)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    int rc;

    cfx__err_clear();
    if (!ctx || !id || (!buf && size))
        return cfx__err(CFX_ERR_INVALID, "cfx_put: NULL %s", !ctx ? "context" : !id ? "id" : "buffer");
    if (size > (1ull << 46))
        return cfx__err(CFX_ERR_TOO_BIG, "cfx_put: %zu bytes is larger than an object may be", size);
    rc = check_memtype(obj_memtype(params), "cfx_put");
    if (rc != CFX_OK)
        return rc;
    if (obj_memtype(params) == CFX_MEMTYPE_CUDA) /* staged through host memory */
        return cfx__gpu_stage_put(ctx, id, buf, size, params);
    cfx_object_id_to_hex(id, hex);

    size_t want_chunk = params && (params->field_mask & CFX_OBJ_PARAM_CHUNK_SIZE)
                            ? params->chunk_size : ctx->cfg.chunk_size;
    if (want_chunk && (want_chunk < CFX_CHUNK_MIN || want_chunk > CFX_CHUNK_MAX))
        return cfx__err(CFX_ERR_INVALID, "cfx_put: chunk size %zu out of range [%u, %u]",
                        want_chunk, CFX_CHUNK_MIN, CFX_CHUNK_MAX);
    uint32_t chunk = cfx__chunk_size_for(size, want_chunk);
    struct cfx_obj *obj = obj_new(id, size, chunk);
    if (!obj)
        return cfx__err(CFX_ERR_NOMEM, "cfx_put %s: out of memory", hex);
    obj->buf = (void *)buf;
    obj->memtype = obj_memtype(params);
    obj->complete = true;
    obj->owned = true;
    obj->ready_chunks = obj->nchunks;

    uint64_t deadline = cfx__deadline_ns(obj_timeout(ctx, params));
    struct cfx_obj *old;
    pthread_mutex_lock(&ctx->lock);
    if (buf)
        cfx__arena_lookup(ctx, buf, &obj->shm_fd, &obj->shm_off);
    /* a copy on its way out (deleted here, or withdrawn by its putter) is no
     * object: the id is free once it has left the store */
    while ((old = cfx__store_find(&ctx->store, id)) && old->deleting &&
           cfx__obj_wait(ctx, deadline))
        ;
    if (cfx__store_find(&ctx->store, id)) {
        pthread_mutex_unlock(&ctx->lock);
        free(obj->bitmap);
        free(obj);
        return cfx__err(CFX_ERR_EXISTS, "cfx_put: node %u already holds object %s",
                        ctx->node_id, hex);
    }
    cfx__store_insert(&ctx->store, obj);
    cfx__withdrawn_take(ctx, id);
    uint64_t tag = obj->seq; /* tells this put apart from other puts of the id */
    pthread_mutex_unlock(&ctx->lock);

    bool no_inline = params && (params->field_mask & CFX_OBJ_PARAM_FLAGS) &&
                     (params->flags & CFX_OBJ_FLAG_NO_INLINE);
    bool inl = size <= ctx->cfg.inline_max && !no_inline;
    /* The store refused a second object under this id above, so a record
     * of this node as the id's putter can only be this put: sent again
     * after a reconnect, or re-announced first (reannounce.c). */
    rc = cfx__ctl_obj_put_own(ctx->ctl, id, size, chunk, inl ? buf : NULL, tag, deadline);
    pthread_mutex_lock(&ctx->lock);
    if (rc != CFX_OK) {
        cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, obj, NULL);
        obj->deleting = true;
    } else {
        obj->announced = true;
        ctx->stats.puts++;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (rc == CFX_OK)
        CFX_LOG(DEBUG, OBJ, "node %u: put %s (%zu B, %u B chunks)", ctx->node_id, hex, size, chunk);
    return rc;
}

/* ---- get ------------------------------------------------------------------- */

/* The object is complete on this node already (ctx->lock held). */
static int get_local(struct cfx_context *ctx, struct cfx_obj *obj, void *buf, size_t cap,
                     bool alloc, void **out_buf, size_t *size_out)
{
    if (size_out)
        *size_out = obj->size;
    if (alloc) {
        int fd;
        uint64_t off;
        void *p;
        int rc = cfx__arena_alloc(ctx, obj->size, &p, &fd, &off);
        if (rc != CFX_OK)
            return rc;
        buf = p;
        *out_buf = p;
    } else if (cap < obj->size) {
        return cfx__err(CFX_ERR_TRUNCATED, "object is %" PRIu64 " bytes, buffer %zu",
                        obj->size, cap);
    }
    if (obj->size)
        memcpy(buf, obj->buf, obj->size);
    return CFX_OK;
}

/*
 * Keep a got inline object in the store like any other got object, so that
 * later gets on this node are local and cfx_delete() behaves the same.  The
 * directory recorded this node as a holder of the inline object; deleting
 * here withdraws that record.
 */
static void hold_inline(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                        const struct cfx_ctl_source *src, bool arena)
{
    uint64_t size = src->size;
    /* the putter's chunk size, so that the copy matches its put */
    uint32_t chunk = src->chunk_size >= CFX_CHUNK_MIN && src->chunk_size <= CFX_CHUNK_MAX
                         ? src->chunk_size : cfx__chunk_size_for(size, 0);
    struct cfx_obj *obj = obj_new(id, size, chunk);
    if (!obj)
        return; /* only an optimisation: the get itself succeeded */
    obj->putter_node = src->putter;
    obj->put_tag = src->tag;
    obj->buf = buf;
    obj->arena = arena;
    obj->complete = true;
    obj->announced = true;
    obj->ready_chunks = obj->nchunks;
    pthread_mutex_lock(&ctx->lock);
    cfx__arena_lookup(ctx, buf, &obj->shm_fd, &obj->shm_off);
    if (cfx__store_find(&ctx->store, id)) {
        pthread_mutex_unlock(&ctx->lock);
        free(obj->bitmap);
        free(obj);
        return;
    }
    cfx__store_insert(&ctx->store, obj);
    cfx__withdrawn_take(ctx, id);
    pthread_mutex_unlock(&ctx->lock);
}

/* ctx->lock held: tell @p w of the prefix of @p obj that landed since last
 * time (the lock is dropped around the call; the get owns obj). */
static void watch_prefix(struct cfx_context *ctx, struct cfx_obj *obj, struct cfx__get_watch *w)
{
    uint64_t upto = CFX_MIN((uint64_t)obj->ready_chunks * obj->chunk_size, obj->size);
    if (!w || w->rc != CFX_OK || upto <= w->upto)
        return;
    const void *buf = obj->buf;
    pthread_mutex_unlock(&ctx->lock);
    w->rc = w->landed(w->arg, buf, w->upto, (size_t)upto);
    pthread_mutex_lock(&ctx->lock);
    if (w->rc == CFX_OK)
        w->upto = (size_t)upto;
}

/* Ask the directory for a source of @p id (counted: cfx_context_stats). */
static int dir_lookup(struct cfx_context *ctx, const struct cfx_object_id *id,
                      const uint32_t *exclude, unsigned nexclude, uint64_t deadline,
                      struct cfx_ctl_source *src)
{
    pthread_mutex_lock(&ctx->lock);
    ctx->stats.dir_lookups++;
    pthread_mutex_unlock(&ctx->lock);
    return cfx__ctl_obj_lookup(ctx->ctl, id, exclude, nexclude, deadline, src);
}

/* The get no longer pulls from @p src: tell the directory, which assigned
 * it (a source from the location cache was never assigned). */
static void src_done(struct cfx_context *ctx, const struct cfx_object_id *id,
                     const struct cfx_ctl_source *src, bool cached)
{
    if (!cached && src->node.node_id)
        cfx__ctl_obj_done(ctx->ctl, id, src->node.node_id, 0, cfx__deadline_ns(1000));
}

static int get_impl(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                    size_t cap, bool alloc, void **out_buf, size_t *size_out,
                    const struct cfx_obj_params *params, struct cfx__get_watch *watch)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    int timeout_ms = obj_timeout(ctx, params);
    uint64_t t0 = cfx__now_ns();
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    struct cfx_ctl_source src;
    uint32_t exclude[MAX_SOURCES];
    unsigned nexclude = 0;
    struct cfx_obj *obj;
    int rc;
    bool use_cache = true;      /* false once a cached location failed this get */
    uint32_t refused = 0;       /* holder that refused a cached request: not cached again */

    cfx_object_id_to_hex(id, hex);

    int local_retries = 0;
again:
    /* 1. held here already (put here, got before, or being got by another
     *    thread of this node: wait for that one) */
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        obj = cfx__store_find(&ctx->store, id);
        if (!obj)
            break;
        if (obj->deleting) {
            /* being released (deleted here, or withdrawn by its putter):
             * it answers nothing, and the store takes a new copy of the id
             * only once it has left */
            if (!cfx__obj_wait(ctx, deadline)) {
                pthread_mutex_unlock(&ctx->lock);
                return cfx__err(CFX_ERR_TIMEOUT, "get of object %s on node %u: its copy "
                                "here was still being released after %d ms", hex,
                                ctx->node_id, timeout_ms);
            }
            continue;
        }
        if (obj->complete && obj->unrecorded) {
            /* Got from a cached location, unknown to the directory: nobody
             * would tell us if the putter withdrew it since.  Fetch again
             * from the location (the putter checks the request) instead of
             * answering from it; this entry gives way to the new copy (its
             * buffer is the caller's of the get that made it). */
            obj->deleting = true;
            obj->arena = false;
            if (cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, obj, NULL) != CFX_OK) {
                pthread_mutex_unlock(&ctx->lock);
                return cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", hex);
            }
            continue;
        }
        if (obj->complete) {
            /* the arena allocation takes the lock itself */
            pthread_mutex_unlock(&ctx->lock);
            void *p = NULL;
            size_t sz = 0;
            if (alloc) {
                int fd;
                uint64_t off;
                pthread_mutex_lock(&ctx->lock);
                obj = cfx__store_find(&ctx->store, id);
                sz = obj ? obj->size : 0;
                pthread_mutex_unlock(&ctx->lock);
                rc = cfx__arena_alloc(ctx, sz, &p, &fd, &off);
                if (rc != CFX_OK)
                    return rc;
            }
            pthread_mutex_lock(&ctx->lock);
            obj = cfx__store_find(&ctx->store, id);
            if (obj && obj->complete && !obj->deleting && (!alloc || obj->size <= sz)) {
                if (alloc) {
                    memcpy(p, obj->buf, obj->size);
                    *out_buf = p;
                    if (size_out)
                        *size_out = obj->size;
                    rc = CFX_OK;
                } else {
                    rc = get_local(ctx, obj, buf, cap, false, NULL, size_out);
                }
                ctx->stats.gets_local += rc == CFX_OK;
                pthread_mutex_unlock(&ctx->lock);
                return rc;
            }
            if (p)
                cfx__arena_free(ctx, p);
            continue;
        }
        if (cfx__ctx_closing(ctx)) {
            pthread_mutex_unlock(&ctx->lock);
            return cfx__err(CFX_ERR_CANCELED, "get of object %s on node %u: the context is "
                            "being destroyed", hex, ctx->node_id);
        }
        if (!cfx__obj_wait(ctx, deadline)) {
            pthread_mutex_unlock(&ctx->lock);
            return cfx__err(CFX_ERR_TIMEOUT, "get of object %s on node %u: another get of it "
                            "on this node did not finish within %d ms", hex, ctx->node_id,
                            timeout_ms);
        }
    }
    /* 2. a source: where the location cache says the object lives (no
     *    round trip; the holder checks the request, loccache.c), else the
     *    directory's answer */
    bool cached = use_cache && cfx__loc_find(&ctx->loc, id, &src);
    if (cached && !alloc && cap < src.size) {
        cfx__loc_forget(&ctx->loc, id); /* a size learnt earlier: let the directory say */
        cached = false;
    }
    ctx->stats.loc_hits += cached;
    pthread_mutex_unlock(&ctx->lock);

    rc = cached ? CFX_OK : dir_lookup(ctx, id, NULL, 0, deadline, &src);
    if (rc != CFX_OK) {
        if (rc == CFX_ERR_TIMEOUT)
            return cfx__err(rc, "get of object %s on node %u: no node put it within %d ms",
                            hex, ctx->node_id, timeout_ms);
        return rc;
    }
    if (size_out)
        *size_out = src.size;
    if (src.is_inline) {
        rc = CFX_OK;
        if (alloc) {
            int fd;
            uint64_t off;
            rc = cfx__arena_alloc(ctx, src.size, out_buf, &fd, &off);
            buf = rc == CFX_OK ? *out_buf : NULL;
        } else if (cap < src.size) {
            rc = cfx__err(CFX_ERR_TRUNCATED, "get of object %s: it is %" PRIu64
                          " bytes, the buffer %zu", hex, src.size, cap);
        }
        if (rc == CFX_OK && src.size)
            memcpy(buf, src.data, src.size);
        free(src.data);
        if (rc == CFX_OK) {
            hold_inline(ctx, id, buf, &src, alloc);
            pthread_mutex_lock(&ctx->lock);
            ctx->stats.gets_inline++;
            pthread_mutex_unlock(&ctx->lock);
        }
        return rc;
    }
    if (!alloc && cap < src.size) {
        src_done(ctx, id, &src, cached);
        return cfx__err(CFX_ERR_TRUNCATED, "get of object %s: it is %" PRIu64
                        " bytes, the buffer %zu", hex, src.size, cap);
    }

    /* 3. a partial copy in the store, fed by the source; others may read
     *    from it while it fills */
    if (src.chunk_size < CFX_CHUNK_MIN || src.chunk_size > CFX_CHUNK_MAX ||
        src.size / src.chunk_size >= CFX_MAX_CHUNKS) {
        src_done(ctx, id, &src, cached);
        return cfx__err(CFX_ERR_PROTO, "object %s: directory gave chunk size %u for %" PRIu64
                        " bytes", hex, src.chunk_size, src.size);
    }
    obj = obj_new(id, src.size, src.chunk_size);
    if (!obj) {
        src_done(ctx, id, &src, cached);
        return cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", hex);
    }
    obj->memtype = obj_memtype(params);
    obj->watched = watch != NULL;
    obj->putter_node = src.putter;
    obj->put_tag = src.tag;
    if (alloc) {
        rc = cfx__arena_alloc(ctx, src.size, &obj->buf, &obj->shm_fd, &obj->shm_off);
        if (rc != CFX_OK) {
            free(obj->bitmap);
            free(obj);
            src_done(ctx, id, &src, cached);
            return rc;
        }
        obj->arena = true;
    } else {
        obj->buf = buf;
        pthread_mutex_lock(&ctx->lock);
        cfx__arena_lookup(ctx, buf, &obj->shm_fd, &obj->shm_off);
        pthread_mutex_unlock(&ctx->lock);
    }

    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *other = cfx__store_find(&ctx->store, id);
    if (other) {
        /* meanwhile another thread of ours started the same get, or a reduce
         * task here started producing the object: wait for that copy (a
         * copy being released is waited for above, and is no retry) */
        bool releasing = other->deleting;
        if (obj->arena)
            cfx__arena_free(ctx, obj->buf);
        pthread_mutex_unlock(&ctx->lock);
        free(obj->bitmap);
        free(obj);
        src_done(ctx, id, &src, cached);
        if (!releasing && ++local_retries > 3)
            return cfx__err(CFX_ERR_BUSY, "get of object %s: another get of it keeps running "
                            "on node %u", hex, ctx->node_id);
        goto again;
    }
    cfx__store_insert(&ctx->store, obj);
    cfx__withdrawn_take(ctx, id); /* a new copy: its delete is its own */
    if (obj->nchunks == 0)
        obj->complete = true;

    struct cfx_xfer_in in;
    rc = CFX_OK;
    while (!obj->complete) {
        memset(&in, 0, sizeof(in));
        in.obj = obj;
        in.status = CFX_ERR_AGAIN;
        in.src_node = src.node.node_id;
        in.cached = cached;
        /* a complete holder answers a small object in one message (the
         * getter's CFX_EAGER_MAX bounds it, 0 = always the chunk write) */
        in.small = (cached || src.complete) && obj->size <= ctx->cfg.eager_max;
        obj->in = &in;
        rc = cfx__cmd_new(ctx, CFX_CMD_GET_START, obj, &src.node);
        if (rc != CFX_OK) {
            obj->in = NULL;
            break;
        }
        /* a destroy of the context ends it as the deadline would (the
         * caller's leave says CFX_ERR_CANCELED) */
        while (in.status == CFX_ERR_AGAIN && !cfx__ctx_closing(ctx) &&
               cfx__obj_wait(ctx, deadline))
            watch_prefix(ctx, obj, watch);
        if (in.status == CFX_ERR_AGAIN) {
            /* deadline: withdraw the window and wait for the source to
             * confirm no more writes are coming before the buffer is
             * handed back */
            cfx__cmd_new(ctx, CFX_CMD_GET_CANCEL, obj, NULL);
            uint64_t grace = cfx__deadline_ns(CANCEL_GRACE_MS);
            while (in.status == CFX_ERR_AGAIN && cfx__obj_wait(ctx, grace))
                ;
            if (in.status == CFX_ERR_AGAIN) {
                /* no ack: cut the window off (a late write now fails its
                 * connection instead of landing in the caller's buffer) */
                cfx__cmd_new(ctx, CFX_CMD_GET_CANCEL, obj, NULL);
                while (in.status == CFX_ERR_AGAIN)
                    cfx__obj_wait(ctx, UINT64_MAX);
            }
            uint32_t got = obj->ready_chunks;
            obj->in = NULL;
            rc = cfx__err(CFX_ERR_TIMEOUT, "get of object %s (%" PRIu64 " B) on node %u from "
                          "node %u (%s): timed out after %d ms with %u of %u chunks", hex,
                          obj->size, ctx->node_id, src.node.node_id, src.node.name, timeout_ms,
                          got, obj->nchunks);
            break;
        }
        obj->in = NULL;
        rc = in.status;
        if (rc == CFX_OK)
            break;
        if (cached)
            break; /* below: forget the location, start over at the directory */
        /* the source failed or dropped the object: resume from the first
         * missing chunk at another holder */
        uint32_t failed = src.node.node_id;
        CFX_LOG(INFO, OBJ, "node %u: get of %s from node %u failed (%s) at chunk %u of %u; "
                "looking for another source", ctx->node_id, hex, failed, cfx_errname(rc),
                obj->ready_chunks, obj->nchunks);
        if (nexclude == MAX_SOURCES || (rc != CFX_ERR_PEER_FAILED && rc != CFX_ERR_NOT_FOUND &&
                                        rc != CFX_ERR_CONNECT)) {
            rc = cfx__err(rc, "get of object %s on node %u from node %u: %s", hex, ctx->node_id,
                          failed, cfx_strerror(rc));
            break;
        }
        exclude[nexclude++] = failed;
        ctx->stats.source_failovers++;
        pthread_mutex_unlock(&ctx->lock);
        /* Stay a partial holder while looking again: nodes reading our copy
         * still do, and the directory must know it so that it never offers
         * us one of them (a cycle in which both wait).  The new assignment
         * releases the old source's upload slot. */
        rc = dir_lookup(ctx, id, exclude, nexclude, deadline, &src);
        pthread_mutex_lock(&ctx->lock);
        if (rc == CFX_ERR_PEER_FAILED) {
            /* the directory says why the object went (its putter left with
             * no complete copy anywhere, or deleted it): that is the cause,
             * not the source that failed because of it */
            char why[512];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            rc = cfx__err(rc, "get of object %s on node %u: source node %u failed because "
                          "the object went (%s)", hex, ctx->node_id, failed, why);
            src.node.node_id = 0;
            break;
        }
        if (rc != CFX_OK) {
            rc = cfx__err(rc == CFX_ERR_TIMEOUT ? CFX_ERR_PEER_FAILED : rc,
                          "get of object %s on node %u: source node %u failed and no other "
                          "holder was found in time", hex, ctx->node_id, failed);
            src.node.node_id = 0;
            break;
        }
        free(src.data);
        if (src.is_inline || src.size != obj->size || src.chunk_size != obj->chunk_size) {
            rc = cfx__err(CFX_ERR_PROTO, "object %s changed shape between sources", hex);
            break;
        }
    }
    if (rc != CFX_OK) {
        obj->deleting = true;
        /* The buffer goes back to the caller: wait (briefly) until the
         * progress thread has run the release, so that the registration
         * exposing it to peers is gone before we return. */
        uint64_t seq = ctx->cmd_seq_done;
        cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, obj, NULL);
        uint64_t until = cfx__deadline_ns(RELEASE_WAIT_MS);
        while (ctx->cmd_seq_done == seq &&
               cfx__cond_wait_until(&ctx->cmd_done, &ctx->lock, until))
            ;
        if (cached && rc != CFX_ERR_TIMEOUT && rc != CFX_ERR_NOMEM) {
            /* The cached holder refused (the putter's copy of the id is gone
             * or changed) or failed: a stale location costs this one round
             * trip; the directory knows where the object is now. */
            cfx__loc_forget(&ctx->loc, id);
            ctx->stats.loc_stale++;
            pthread_mutex_unlock(&ctx->lock);
            CFX_LOG(DEBUG, OBJ, "node %u: cached location of %s (node %u) failed (%s); asking "
                    "the directory", ctx->node_id, hex, src.node.node_id, cfx_errname(rc));
            refused = src.node.node_id;
            use_cache = false;
            cfx__err_clear();
            goto again;
        }
        if (cached)
            cfx__loc_forget(&ctx->loc, id);
        pthread_mutex_unlock(&ctx->lock);
        src_done(ctx, id, &src, cached);
        return rc;
    }
    void *data = obj->buf;
    if (obj->withdrawn) {
        /* The directory withdrew the object while it was on its way (the
         * putter deleted it, or it went with its last complete copy): the
         * get began before that and keeps the bytes, but they are no copy
         * of whatever the id names from now on.  Drop the entry (the buffer
         * is the caller's) and wait for its registration to go, as a failed
         * get does. */
        obj->deleting = true;
        obj->arena = false;
        uint64_t seq = ctx->cmd_seq_done;
        if (cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, obj, NULL) == CFX_OK) {
            uint64_t until = cfx__deadline_ns(RELEASE_WAIT_MS);
            while (ctx->cmd_seq_done == seq &&
                   cfx__cond_wait_until(&ctx->cmd_done, &ctx->lock, until))
                ;
        }
        ctx->stats.gets++;
        pthread_mutex_unlock(&ctx->lock);
        src_done(ctx, id, &src, cached);
        if (alloc)
            *out_buf = data;
        CFX_LOG(DEBUG, OBJ, "node %u: got %s (%" PRIu64 " B), withdrawn meanwhile: not kept",
                ctx->node_id, hex, src.size);
        return CFX_OK;
    }
    /* remember where it lives for the next get of the id here (after this
     * node deleted its copy): only a complete holder, and not one that just
     * refused a cached request (a copy that is not the putter's) */
    if (!cached && src.complete && src.node.node_id != refused)
        ctx->stats.loc_evictions += cfx__loc_put(&ctx->loc, id, &src);
    /* Without the lock the entry may go (withdrawn meanwhile: on_obj_gone
     * releases a complete copy): found again by its seq below. */
    uint64_t entry_seq = obj->seq;
    pthread_mutex_unlock(&ctx->lock);

    /* the directory learns we are complete in the background: the bytes
     * are the caller's now, and our partial-holder record already lets
     * others read from us.  A get from a cached location made no record:
     * the copy serves this node only, and is not announced. */
    rc = cached ? CFX_ERR_NOT_FOUND : cfx__ctl_obj_done_async(ctx->ctl, id, src.node.node_id, 1);
    pthread_mutex_lock(&ctx->lock);
    obj = cfx__store_find(&ctx->store, id);
    if (obj && obj->seq == entry_seq && !obj->deleting) {
        obj->announced = rc == CFX_OK;
        obj->unrecorded = rc != CFX_OK; /* cached, or the directory was not told */
    }
    ctx->stats.gets++;
    pthread_mutex_unlock(&ctx->lock);
    if (alloc)
        *out_buf = data;
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    /* what reduce planning uses as this node's bandwidth and latency */
    pthread_mutex_lock(&ctx->lock);
    if (src.size >= (1u << 20) && secs > 0)
        ctx->est_bw = ctx->est_bw > 0 ? 0.8 * ctx->est_bw + 0.2 * (double)src.size / secs
                                      : (double)src.size / secs;
    else if (src.size <= 65536)
        ctx->est_lat = ctx->est_lat > 0 ? 0.8 * ctx->est_lat + 0.2 * secs : secs;
    pthread_mutex_unlock(&ctx->lock);
    CFX_LOG(DEBUG, OBJ, "node %u: got %s (%" PRIu64 " B) in %.3f s", ctx->node_id, hex,
            src.size, secs);
    return CFX_OK;
}

static int get_call(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                    size_t capacity, size_t *size_out, const struct cfx_obj_params *params)
{
    cfx__err_clear();
    if (!ctx || !id || (!buf && capacity))
        return cfx__err(CFX_ERR_INVALID, "cfx_get: NULL %s", !ctx ? "context" : !id ? "id" : "buffer");
    int rc = check_memtype(obj_memtype(params), "cfx_get");
    if (rc != CFX_OK)
        return rc;
    if (obj_memtype(params) == CFX_MEMTYPE_CUDA) /* staged through host memory */
        return cfx__gpu_stage_get(ctx, id, buf, capacity, size_out, params);
    return get_impl(ctx, id, buf, capacity, false, NULL, size_out, params, NULL);
}

static int get_alloc_call(struct cfx_context *ctx, const struct cfx_object_id *id,
                          void **buf_out, size_t *size_out, const struct cfx_obj_params *params)
{
    cfx__err_clear();
    if (!ctx || !id || !buf_out)
        return cfx__err(CFX_ERR_INVALID, "cfx_get_alloc: NULL %s",
                        !ctx ? "context" : !id ? "id" : "buf_out");
    *buf_out = NULL;
    if (obj_memtype(params) != CFX_MEMTYPE_HOST)
        return cfx__err(CFX_ERR_UNSUPPORTED, "cfx_get_alloc: the arena holds host memory only");
    return get_impl(ctx, id, NULL, 0, true, buf_out, size_out, params, NULL);
}

int cfx__get_alloc_watched(struct cfx_context *ctx, const struct cfx_object_id *id,
                           void **buf_out, size_t *size_out, const struct cfx_obj_params *params,
                           struct cfx__get_watch *w)
{
    *buf_out = NULL;
    return get_impl(ctx, id, NULL, 0, true, buf_out, size_out, params, w);
}

/* ---- delete ---------------------------------------------------------------- */

static int delete_call(struct cfx_context *ctx, const struct cfx_object_id *id,
                       const struct cfx_obj_params *params)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint64_t deadline;

    cfx__err_clear();
    if (!ctx || !id)
        return cfx__err(CFX_ERR_INVALID, "cfx_delete: NULL %s", !ctx ? "context" : "id");
    cfx_object_id_to_hex(id, hex);
    deadline = cfx__deadline_ns(obj_timeout(ctx, params));

    pthread_mutex_lock(&ctx->lock);
    while (ctx->reannounce_hold && !ctx->reannounce_held && cfx__obj_wait(ctx, deadline))
        ; /* test hook: see reannounce.c */
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    if ((!obj || obj->deleting) && cfx__withdrawn_take(ctx, id)) {
        /* its putter withdrew the copy this node got (on_obj_gone): done
         * already, as when the putter left */
        pthread_mutex_unlock(&ctx->lock);
        return CFX_OK;
    }
    if (!obj || obj->deleting || !obj->complete) {
        pthread_mutex_unlock(&ctx->lock);
        return cfx__err(CFX_ERR_NOT_FOUND, "cfx_delete: node %u holds no object %s",
                        ctx->node_id, hex);
    }
    obj->deleting = true; /* new GET_REQs are refused, and no re-announce starts */
    /* a re-announce of it under way reaches the coordinator before this
     * delete does (reannounce.c) */
    while (obj->reannouncing && cfx__obj_wait(ctx, deadline))
        ;
    bool announced = obj->announced;
    pthread_mutex_unlock(&ctx->lock);

    int rc = CFX_OK;
    if (announced)
        rc = cfx__ctl_obj_delete(ctx->ctl, id, deadline);

    /* let uploads in progress finish, and reduce tasks reading the object
     * as their input, up to the deadline: the caller may free the buffer
     * once we return */
    pthread_mutex_lock(&ctx->lock);
    while ((!cfx_list_empty(&obj->uploads) || obj->refs) && !cfx__ctx_closing(ctx) &&
           cfx__obj_wait(ctx, deadline))
        ;
    obj->announced = false;
    int crc = cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, obj, NULL);
    /* The delete is complete when it returns: the entry leaves the store
     * (and its registration goes) on the progress thread, and until then a
     * put of the id here would find it.  Wait for that; uploads told to
     * stop drain within a completion, so a short grace past the caller's
     * deadline is enough. */
    uint64_t until = CFX_MAX(deadline, cfx__deadline_ns(RELEASE_WAIT_MS));
    struct cfx_obj *left = NULL;
    while (crc == CFX_OK && (left = cfx__store_find(&ctx->store, id)) && left->deleting &&
           cfx__obj_wait(ctx, until))
        ;
    left = crc == CFX_OK ? cfx__store_find(&ctx->store, id) : obj;
    bool released = !left || !left->deleting;
    ctx->deletes_done++;
    pthread_cond_broadcast(&ctx->obj_cond);
    pthread_mutex_unlock(&ctx->lock);
    if (crc != CFX_OK)
        return cfx__err(CFX_ERR_NOMEM, "cfx_delete: node %u cannot release object %s: out "
                        "of memory", ctx->node_id, hex);
    if (!released)
        return cfx__err(CFX_ERR_TIMEOUT, "cfx_delete: node %u could not release object %s: "
                        "uploads of it to other nodes were still draining at the deadline",
                        ctx->node_id, hex);
    if (rc == CFX_ERR_NOT_FOUND)
        rc = CFX_OK; /* the directory had already dropped it (its putter left) */
    return rc;
}

/* ---- arena ----------------------------------------------------------------- */

int cfx_buf_alloc(struct cfx_context *ctx, size_t size, void **out)
{
    int fd;
    uint64_t off;
    cfx__err_clear();
    if (!ctx || !out || !size)
        return cfx__err(CFX_ERR_INVALID, "cfx_buf_alloc: %s", !size ? "size 0" : "NULL argument");
    return cfx__arena_alloc(ctx, size, out, &fd, &off);
}

void cfx_buf_free(struct cfx_context *ctx, void *buf)
{
    struct cfx_object_id id;
    bool backs_object = false;

    if (!ctx || !buf)
        return;
    pthread_mutex_lock(&ctx->lock);
    for (unsigned b = 0; b < CFX_STORE_BUCKETS && !backs_object; b++)
        for (struct cfx_obj *o = ctx->store.buckets[b]; o; o = o->hnext)
            if (o->arena && o->buf == buf && !o->deleting) {
                id = o->id;
                backs_object = true;
                break;
            }
    if (!backs_object)
        cfx__arena_free(ctx, buf);
    pthread_mutex_unlock(&ctx->lock);
    /* The buffer holds an object this node serves (cfx_get_alloc): withdraw
     * the object; its release frees the buffer once uploads have drained. */
    if (backs_object)
        cfx_delete(ctx, &id, NULL);
}

/* ---- the API: each call counted for cfx_context_destroy() ------------------- */

int cfx_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *buf,
            size_t size, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_put") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = put_call(ctx, id, buf, size, params);
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

int cfx__put_arena(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                   size_t size)
{
    int rc = cfx__ctx_enter(ctx, "cfx_put");
    if (rc != CFX_OK)
        return rc;
    rc = put_call(ctx, id, buf, size, NULL);
    if (rc == CFX_OK && buf) {
        /* the store frees it with the object (its delete, or the context's end) */
        pthread_mutex_lock(&ctx->lock);
        struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
        if (obj && obj->owned && obj->buf == buf)
            obj->arena = true;
        pthread_mutex_unlock(&ctx->lock);
    }
    return cfx__ctx_leave(ctx, rc);
}

int cfx_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf, size_t capacity,
            size_t *size_out, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_get") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = get_call(ctx, id, buf, capacity, size_out, params);
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

int cfx_get_alloc(struct cfx_context *ctx, const struct cfx_object_id *id, void **buf_out,
                  size_t *size_out, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_get_alloc") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = get_alloc_call(ctx, id, buf_out, size_out, params);
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

int cfx_delete(struct cfx_context *ctx, const struct cfx_object_id *id,
               const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_delete") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = delete_call(ctx, id, params);
    return ctx ? cfx__ctx_leave(ctx, rc) : rc;
}

/* The object get: cfx_get(), cfx_get_alloc() and the engine's watched get. */
#include "object.h"
#include "gpu_stage.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GET_RELEASE_WAIT_MS 2000 /* a copy let go: its uploads' writes move within this, or end */
#define MAX_SOURCES 16 /* sources a get tries before giving up */

/* The object (@p hex) is complete on this node already (ctx->lock held). */
static int get_local(struct cfx_context *ctx, struct cfx_obj *obj, const char *hex, void *buf,
                     size_t cap, bool alloc, void **out_buf, size_t *size_out)
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
        return cfx__err(CFX_ERR_TRUNCATED, "get of object %s: it is %" PRIu64 " bytes, the "
                        "buffer %zu", hex, obj->size, cap);
    }
    if (obj->size)
        memcpy(buf, obj->buf, obj->size);
    return CFX_OK;
}

/*
 * Keep a got inline object in the store like any other got object, so that
 * later gets on this node are local and cfx_delete() behaves the same.  The
 * directory recorded this node as a holder of the inline object; deleting
 * here withdraws that record.  The copy kept is the engine's own (the
 * object is small), so the caller's buffer of a cfx_get() is never read
 * after the get; @p buf is kept only when it is the caller's arena buffer
 * (cfx_get_alloc, @p arena).
 */
static void test_hold(struct cfx_context *ctx, uint64_t deadline);

static void hold_inline(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                        const struct cfx_ctl_source *src, bool arena, uint64_t gone_seq,
                        uint64_t deadline)
{
    uint64_t size = src->size;
    void *copy = NULL; /* the engine's copy (cfx_get), freed with the entry */
    if (!arena && size) {
        copy = malloc(size);
        if (!copy)
            return; /* only an optimisation: the get itself succeeded */
        memcpy(copy, buf, size);
    }
    /* the putter's chunk size, so that the copy matches its put */
    uint32_t chunk = src->chunk_size >= CFX_CHUNK_MIN && src->chunk_size <= CFX_CHUNK_MAX
                         ? src->chunk_size
                         : cfx__chunk_size_for(size, 0);
    struct cfx_obj *obj = obj_new(id, size, chunk);
    if (!obj) {
        free(copy);
        return;
    }
    obj->putter_node = src->putter;
    obj->put_tag = src->tag;
    obj->buf = arena ? buf : copy;
    obj->arena = arena;
    obj->lent = arena;
    obj->heap = copy != NULL;
    obj->complete = true;
    obj->announced = true;
    obj->ready_chunks = obj->nchunks;
    pthread_mutex_lock(&ctx->lock);
    if (arena) /* the engine's heap copy is in no segment */
        cfx__arena_lookup(ctx, obj->buf, &obj->shm_fd, &obj->shm_off);
    test_hold(ctx, deadline);
    /* withdrawn since the directory answered (its putter deleted it): the
     * get keeps the bytes, but no copy of an object that went */
    if (cfx__store_find(&ctx->store, id) || cfx__gone_since(ctx, id, gone_seq)) {
        pthread_mutex_unlock(&ctx->lock);
        free(copy);
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
    /* a first lookup asks for extra complete holders too: a large object
     * is striped over them (get_stripe.c); a failover takes one source */
    unsigned want = nexclude ? 0 : ctx->cfg.get_sources - 1;
    return cfx__ctl_obj_lookup_sources(ctx->ctl, id, exclude, nexclude, want, deadline, src);
}

/* The get no longer pulls from @p src and keeps no copy: tell the directory,
 * which assigned it (a source from the location cache was never assigned),
 * and drops this node's record of the id unless it is a complete copy's.
 * That record is the node's, not this get's: when another get of the id
 * here fills an entry on the directory's word, that get's own OBJ_DONE
 * settles it, and this one sends none (cfx__record_drop_begin otherwise).
 * ctx->lock not held. */
static void src_done(struct cfx_context *ctx, const struct cfx_object_id *id,
                     const struct cfx_ctl_source *src, bool cached)
{
    if (cached || !src->node.node_id)
        return;
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *o = cfx__store_find(&ctx->store, id);
    if (o && !o->deleting && !o->owned && !o->announced && !o->unrecorded && !o->withdrawn &&
        !o->loc_src) {
        pthread_mutex_unlock(&ctx->lock);
        return;
    }
    uint64_t seq = cfx__record_drop_begin(ctx, id);
    pthread_mutex_unlock(&ctx->lock);
    /* whatever the directory answers (it may have forgotten the id: the
     * putter deleted it meanwhile) is not the get's outcome: the text of
     * the get's own error, set before this, is what its caller reads */
    char why[CFX__ERR_TEXT_MAX];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    cfx__ctl_obj_done(ctx->ctl, id, src->node.node_id, 0, cfx__deadline_ns(1000));
    cfx__err(CFX_OK, "%s", why);
    pthread_mutex_lock(&ctx->lock);
    cfx__record_drop_end(ctx, id, seq);
    pthread_mutex_unlock(&ctx->lock);
}

/*
 * A get, in steps (get_impl):
 *  1. held here already?  Copy it out (get_held);
 *  2. a source: the location cache, else the directory; an inline object
 *     is done right there (get_source);
 *  3. an entry in the store that the source fills, which other nodes may
 *     read while it fills (get_entry);
 *  4. pull: post the request, wait up to the deadline, withdraw the window
 *     at the deadline, fail over to another holder (get_pull);
 *  5. keep the copy, or let it go when the get failed (get_finish,
 *     get_fail), and start over once when a cached location was stale.
 */
enum {
    GET_MISSING = 1, /* step 1: not held here */
    GET_AGAIN,       /* look again from step 1 */
    GET_FETCH,       /* step 2: a source to pull from */
};

struct get_op {
    struct cfx_context *ctx;             /* the getter's context */
    const struct cfx_object_id *id;      /* the object */
    char hex[CFX_OBJECT_ID_HEX_LEN];     /* id for messages */
    void *buf;                           /* the caller's destination (NULL with alloc) */
    size_t cap;                          /* its capacity */
    bool alloc;                          /* cfx_get_alloc: an arena buffer, in *out_buf */
    void **out_buf;                      /* alloc: where the buffer goes */
    size_t *size_out;                    /* the object's size (may be NULL) */
    const struct cfx_obj_params *params; /* the caller's (may be NULL) */
    struct cfx__get_watch *watch;        /* told of the prefix as it lands (may be NULL) */
    int timeout_ms;                      /* the get's timeout, for messages */
    uint64_t t0;                         /* start (ns), for the latency estimate */
    uint64_t deadline;                   /* CLOCK_MONOTONIC ns */
    struct cfx_ctl_source src;           /* the source pulled from now */
    bool cached;                         /* src came from the location cache */
    bool use_cache;                      /* false once a cached location failed this get */
    uint32_t refused;                    /* node that refused a cached request: not cached */
    uint32_t exclude[MAX_SOURCES];       /* sources that failed this get */
    unsigned nexclude;                   /* entries of exclude used */
    bool striped;                        /* pulled from several sources once (get_stripe.c) */
    struct cfx_obj *obj;                 /* our entry in the store while it fills */
    uint64_t gone_seq;                   /* ctx->gone_seq when the directory was asked */
};

/* The get's request was freed while it ran (cfx_request_free): it ends
 * now, the buffer withdrawn as at a deadline (ctx->lock held). */
static int get_canceled(const struct get_op *g)
{
    return cfx__err(CFX_ERR_CANCELED, "get of object %s on node %u: canceled (%s)", g->hex,
                    g->ctx->node_id, cfx__cur_req ? "its request was freed"
                                                  : "interrupted on its thread");
}

/* Step 1, the object is complete here: copy it out (ctx->lock held on
 * entry and return).  GET_AGAIN when the entry changed meanwhile. */
static int get_copy_held(struct get_op *g, struct cfx_obj *obj)
{
    struct cfx_context *ctx = g->ctx;
    void *p = NULL;
    size_t sz = 0;
    int rc;

    if (g->alloc) {
        /* the arena allocation takes the lock itself */
        int fd;
        uint64_t off;
        sz = obj->size;
        pthread_mutex_unlock(&ctx->lock);
        rc = cfx__arena_alloc(ctx, sz, &p, &fd, &off);
        pthread_mutex_lock(&ctx->lock);
        if (rc != CFX_OK)
            return rc;
        obj = cfx__store_find(&ctx->store, g->id);
        if (!obj || !obj->complete || obj->deleting || obj->withdrawn || obj->size > sz) {
            cfx__arena_free(ctx, p);
            return GET_AGAIN;
        }
        if (obj->size) /* an empty object has no buffer */
            memcpy(p, obj->buf, obj->size);
        *g->out_buf = p;
        if (g->size_out)
            *g->size_out = obj->size;
        rc = CFX_OK;
    } else {
        rc = get_local(ctx, obj, g->hex, g->buf, g->cap, false, NULL, g->size_out);
    }
    ctx->stats.gets_local += rc == CFX_OK;
    return rc;
}

/* Step 1: held here already (put here, got before, or being got by another
 * thread of this node: wait for that one).  Returns a status when done;
 * GET_MISSING, with ctx->lock still held, when step 2 is next. */
static int get_held(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    int rc = GET_MISSING;

    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        struct cfx_obj *obj = cfx__store_find(&ctx->store, g->id);
        if (!obj)
            return GET_MISSING;
        if (cfx__req_canceled()) {
            rc = get_canceled(g);
            break;
        }
        if (obj->deleting) {
            /* being released (deleted here, or withdrawn by its putter):
             * it answers nothing, and the store takes a new copy of the id
             * only once it has left */
            if (!cfx__obj_wait(ctx, g->deadline)) {
                rc = cfx__err(CFX_ERR_TIMEOUT,
                              "get of object %s on node %u: its copy "
                              "here was still being released after %d ms",
                              g->hex, ctx->node_id, g->timeout_ms);
                break;
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
            cfx__cmd_must(ctx, CFX_CMD_OBJ_RELEASE, obj);
            continue;
        }
        /* (a copy withdrawn while it was got, or got from a cached location, is
         * its get's to drop or mark unrecorded: waited for) */
        if (obj->complete && !obj->putting && !obj->withdrawn && !obj->loc_src) {
            rc = get_copy_held(g, obj);
            if (rc == GET_AGAIN)
                continue;
            break;
        }
        if (cfx__ctx_closing(ctx)) {
            rc = cfx__err(CFX_ERR_CANCELED,
                          "get of object %s on node %u: the context is "
                          "being destroyed",
                          g->hex, ctx->node_id);
            break;
        }
        /* (a blocking get's interrupt check runs here too: the other get
         * waits on other processes) */
        if (!cfx__obj_wait_intr(ctx, g->deadline)) {
            rc = cfx__err(CFX_ERR_TIMEOUT,
                          "get of object %s on node %u: another get of it "
                          "on this node did not finish within %d ms",
                          g->hex, ctx->node_id, g->timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

/* An inline object came with the directory's answer: copy it out and keep
 * it (hold_inline).  Done either way. */
static int get_inline(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    void *buf = g->buf;
    int rc = CFX_OK;

    if (g->alloc) {
        int fd;
        uint64_t off;
        rc = cfx__arena_alloc(ctx, g->src.size, g->out_buf, &fd, &off);
        buf = rc == CFX_OK ? *g->out_buf : NULL;
    } else if (g->cap < g->src.size) {
        rc = cfx__err(CFX_ERR_TRUNCATED,
                      "get of object %s: it is %" PRIu64 " bytes, the "
                      "buffer %zu",
                      g->hex, g->src.size, g->cap);
    }
    if (rc == CFX_OK && g->src.size)
        memcpy(buf, g->src.data, g->src.size);
    free(g->src.data);
    if (rc == CFX_OK) {
        hold_inline(ctx, g->id, buf, &g->src, g->alloc, g->gone_seq, g->deadline);
        pthread_mutex_lock(&ctx->lock);
        ctx->stats.gets_inline++;
        pthread_mutex_unlock(&ctx->lock);
    }
    return rc;
}

/* Step 2 (ctx->lock held on entry, not on return): a source, where the
 * location cache says the object lives (no round trip; the holder checks
 * the request, loccache.c), else the directory's answer.  GET_FETCH with
 * g->src set, or a status when done (an inline object, or a failure). */
static int get_source(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    int rc;

    if (g->timeout_ms == 0) {
        /* only a copy held here is found (object.h): the directory's
         * answer came in time on a fast network and started a transfer
         * that the deadline then cut off, or not, at random */
        pthread_mutex_unlock(&ctx->lock);
        return cfx__err(CFX_ERR_TIMEOUT, "get of object %s on node %u: no copy held here, "
                        "and a timeout of 0 ms looks no further", g->hex, ctx->node_id);
    }
    g->cached = g->use_cache && cfx__loc_find(&ctx->loc, g->id, &g->src);
    if (g->cached && !g->alloc && g->cap < g->src.size) {
        cfx__loc_forget(&ctx->loc, g->id); /* a size learnt earlier: let the directory say */
        g->cached = false;
    }
    ctx->stats.loc_hits += g->cached;
    g->gone_seq = ctx->gone_seq;
    struct cfx_request *req = cfx__cur_req;
    if (req && !g->cached) {
        /* nothing exposes the buffer while the directory is asked: a free
         * of the request meanwhile need not wait for the answer */
        req->in_lookup = true;
        pthread_cond_broadcast(&req->cond);
    }
    pthread_mutex_unlock(&ctx->lock);

    rc = g->cached ? CFX_OK : dir_lookup(ctx, g->id, NULL, 0, g->deadline, &g->src);
    if (rc == CFX_ERR_CANCELED && !req && cfx__intr_fired())
        return get_canceled(g);
    if (req && !g->cached) {
        pthread_mutex_lock(&ctx->lock);
        req->in_lookup = false;
        bool canceled = req->cancel;
        pthread_mutex_unlock(&ctx->lock);
        if (canceled) { /* the request may be gone with its buffer: touch neither */
            if (rc == CFX_OK && g->src.is_inline)
                free(g->src.data);
            else if (rc == CFX_OK)
                src_done(ctx, g->id, &g->src, false);
            return get_canceled(g);
        }
    }
    if (rc == CFX_ERR_TIMEOUT) {
        /* the directory's word that the id's object went, if it said so */
        char was[192] = "";
        const char *w = strstr(cfx_last_error(), "(the id was put by node");
        if (w)
            snprintf(was, sizeof(was), " %s", w);
        return cfx__err(rc, "get of object %s on node %u: no node put it within %d ms%s",
                        g->hex, ctx->node_id, g->timeout_ms, was);
    }
    if (rc == CFX_ERR_AGAIN && !g->cached) { /* this node put it meanwhile: read it here */
        cfx__err_clear();
        return GET_AGAIN;
    }
    if (rc != CFX_OK)
        return rc;
    if (g->size_out)
        *g->size_out = g->src.size;
    if (g->src.is_inline)
        return get_inline(g);
    if (!g->alloc && g->cap < g->src.size) {
        src_done(ctx, g->id, &g->src, g->cached);
        return cfx__err(CFX_ERR_TRUNCATED,
                        "get of object %s: it is %" PRIu64 " bytes, the buffer %zu", g->hex,
                        g->src.size, g->cap);
    }
    if (g->src.chunk_size < CFX_CHUNK_MIN || g->src.chunk_size > CFX_CHUNK_MAX ||
        g->src.size / g->src.chunk_size >= CFX_MAX_CHUNKS) {
        src_done(ctx, g->id, &g->src, g->cached);
        return cfx__err(CFX_ERR_PROTO,
                        "object %s: directory gave chunk size %u for %" PRIu64 " bytes", g->hex,
                        g->src.chunk_size, g->src.size);
    }
    return GET_FETCH;
}

/* Test hook (test_get.c; ctx->lock held): hold the get here, where the
 * directory has named this node a holder and the store has no entry yet. */
static void test_hold(struct cfx_context *ctx, uint64_t deadline)
{
    if (ctx->test_hold_entry) {
        ctx->test_entry_held = true;
        pthread_cond_broadcast(&ctx->obj_cond);
        while (ctx->test_hold_entry && cfx__obj_wait(ctx, deadline))
            ;
        ctx->test_entry_passes++;
        pthread_cond_broadcast(&ctx->obj_cond);
    }
}

/* Step 3: a partial copy in the store, fed by the source; others may read
 * from it while it fills.  CFX_OK with ctx->lock held and g->obj in the
 * store; GET_AGAIN (lock not held) when another copy of the id got there
 * first; else a status (lock not held). */
static int get_entry(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    struct cfx_obj *obj = obj_new(g->id, g->src.size, g->src.chunk_size);
    int rc;

    if (!obj) {
        src_done(ctx, g->id, &g->src, g->cached);
        return cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", g->hex);
    }
    obj->memtype = obj_memtype(g->params);
    obj->watched = g->watch != NULL;
    obj->putter_node = g->src.putter;
    obj->put_tag = g->src.tag;
    obj->loc_src = g->cached;
    if (g->alloc) {
        rc = cfx__arena_alloc(ctx, g->src.size, &obj->buf, &obj->shm_fd, &obj->shm_off);
        if (rc != CFX_OK) {
            free(obj->bitmap);
            free(obj);
            src_done(ctx, g->id, &g->src, g->cached);
            return rc;
        }
        obj->arena = obj->lent = true;
    }

    pthread_mutex_lock(&ctx->lock);
    test_hold(ctx, g->deadline);
    if (!g->alloc) {
        obj->buf = g->buf;
        cfx__arena_lookup(ctx, g->buf, &obj->shm_fd, &obj->shm_off);
    }
    struct cfx_obj *other = cfx__store_find(&ctx->store, g->id);
    if (other) {
        /* meanwhile another thread of ours started the same get, or a reduce
         * task here started producing the object: wait for that copy in
         * step 1.  However often another get wins the entry (gets that
         * keep nothing leave without a copy, and the next race starts),
         * only the deadline ends this get: it failed CFX_ERR_BUSY, which
         * cfx_get does not document, after 3 such rounds (three threads
         * getting one id with CFX_OBJ_FLAG_NO_KEEP met it in seconds). */
        if (obj->arena)
            cfx__arena_free(ctx, obj->buf);
        pthread_mutex_unlock(&ctx->lock);
        free(obj->bitmap);
        free(obj);
        src_done(ctx, g->id, &g->src, g->cached);
        return GET_AGAIN;
    }
    cfx__store_insert(&ctx->store, obj);
    /* withdrawn after the directory answered, before the entry was here to
     * be told: the bytes are the caller's, but no copy (get_finish) */
    obj->withdrawn = cfx__gone_since(ctx, g->id, g->gone_seq);
    if (obj->nchunks == 0)
        obj->complete = true;
    g->obj = obj;
    return CFX_OK;
}

/* Step 4b, the deadline passed with the transfer running: withdraw its
 * window before the buffer goes back to the caller.  That calls a
 * transport, so this thread takes the progress lock for it (a pass never
 * blocks: a short wait), and does not wait for the source's answer: the
 * transfer state is the engine's from here (cfx__xfer_get_abandon).
 * ctx->lock held.  True when abandoned; false when it ended meanwhile. */
static bool get_abandon(struct get_op *g, struct cfx_xfer_in *in)
{
    bool was_held = cfx__progress_enter(g->ctx);
    bool gone = cfx__xfer_get_abandon(g->ctx, in);
    cfx__progress_leave(g->ctx, was_held);
    return gone;
}

/* Post the request for g->obj (ctx->lock held).  With the progress lock
 * free this thread sends it itself, after the commands queued before it,
 * with no command and no wake-up of the progress thread (as a message
 * post does, p2p.c); otherwise it is queued for the holder. */
static int get_post(struct get_op *g, struct cfx_xfer_in *in)
{
    struct cfx_context *ctx = g->ctx;
    if (!cfx__progress_trylock(ctx))
        return cfx__cmd_new(ctx, CFX_CMD_GET_START, g->obj, &g->src.node);
    cfx__progress_run_cmds(ctx);
    cfx__xfer_get_start(ctx, g->obj, &g->src.node);
    /* a request left queued on a connection still being set up (or a
     * handshake to finish) needs the progress thread */
    struct cfx_conn *conn = in->conn;
    if (conn && (conn->state != CFX_CONN_READY || !conn->authed || !cfx_list_empty(&conn->pending)))
        cfx__progress_wake(ctx);
    cfx__progress_unlock(ctx);
    return CFX_OK;
}

/* Step 4a: one request to g->src, waited for up to the deadline (ctx->lock
 * held, dropped while waiting).  Returns the transfer's status. */
static int get_attempt(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    struct cfx_obj *obj = g->obj;
    /* on the heap: at the deadline the getter leaves, the engine keeps it
     * until the source's answer comes (or never does) */
    struct cfx_xfer_in *in = calloc(1, sizeof(*in));
    int rc;

    if (!in)
        return cfx__err(CFX_ERR_NOMEM, "get of object %s: out of memory", g->hex);
    in->obj = obj;
    cfx__status_set(&in->status, CFX_ERR_AGAIN);
    in->src_node = g->src.node.node_id;
    in->cached = g->cached;
    /* a complete holder answers a small object in one message (the
     * getter's CFX_EAGER_MAX bounds it, 0 = always the chunk write) */
    in->small = (g->cached || g->src.complete) && obj->size <= ctx->cfg.eager_max;
    /* a partial holder may not have its entry yet (the directory answered
     * it just before us): it holds the request until it has (xfer.c) */
    in->wait = !g->cached && !g->src.complete;
    obj->in = in;
    rc = get_post(g, in);
    if (rc != CFX_OK) {
        obj->in = NULL;
        free(in);
        return cfx__err(rc, "get of object %s: out of memory", g->hex);
    }
    /* Drive the transports from this thread while the answer is near (a
     * watched get takes its prefixes at every wake-up instead). */
    if (!g->watch) {
        pthread_mutex_unlock(&ctx->lock);
        cfx__progress_poll_wait(ctx, &in->status, g->deadline);
    }
    /* A destroy of the context ends the wait as the deadline would (the
     * caller's leave says CFX_ERR_CANCELED). */
    while (in->status == CFX_ERR_AGAIN && !cfx__ctx_closing(ctx) && !cfx__req_canceled() &&
           cfx__obj_wait_intr(ctx, g->deadline))
        watch_prefix(ctx, obj, g->watch);
    if (in->status == CFX_ERR_AGAIN && cfx__req_canceled() && get_abandon(g, in))
        return get_canceled(g);
    if (in->status == CFX_ERR_AGAIN && get_abandon(g, in))
        return cfx__err(CFX_ERR_TIMEOUT,
                        "get of object %s (%" PRIu64 " B) on node %u from "
                        "node %u (%s): timed out after %d ms with %u of %u chunks",
                        g->hex, obj->size, ctx->node_id, g->src.node.node_id, g->src.node.name,
                        g->timeout_ms, obj->ready_chunks, obj->nchunks);
    obj->in = NULL;
    rc = in->status;
    free(in);
    return rc;
}

/* Step 4c: the source failed or dropped the object: resume from the first
 * missing chunk at another holder (ctx->lock held, dropped for the
 * directory).  CFX_OK with the new g->src, else the get's status. */
static int get_failover(struct get_op *g, int rc)
{
    struct cfx_context *ctx = g->ctx;
    struct cfx_obj *obj = g->obj;
    uint32_t failed = g->src.node.node_id;

    CFX_LOG(INFO, OBJ,
            "node %u: get of %s from node %u failed (%s) at chunk %u of %u; "
            "looking for another source",
            ctx->node_id, g->hex, failed, cfx_errname(rc), obj->ready_chunks, obj->nchunks);
    if (rc == CFX_ERR_UNSUPPORTED) /* the detail was the progress thread's (conn.c) */
        return cfx__err(rc,
                        "get of object %s on node %u from node %u (%s): that node shares no "
                        "transport with this one (ours: %s)",
                        g->hex, ctx->node_id, failed, g->src.node.name, ctx->cfg.transports);
    if (g->nexclude == MAX_SOURCES ||
        (rc != CFX_ERR_PEER_FAILED && rc != CFX_ERR_NOT_FOUND && rc != CFX_ERR_CONNECT))
        return cfx__err(rc, "get of object %s on node %u from node %u: %s", g->hex, ctx->node_id,
                        failed, cfx_strerror(rc));
    g->exclude[g->nexclude++] = failed;
    ctx->stats.source_failovers++;
    pthread_mutex_unlock(&ctx->lock);
    /* Stay a partial holder while looking again: nodes reading our copy
     * still do, and the directory must know it so that it never offers us
     * one of them (a cycle in which both wait).  The new assignment
     * releases the old source's upload slot. */
    rc = dir_lookup(ctx, g->id, g->exclude, g->nexclude, g->deadline, &g->src);
    pthread_mutex_lock(&ctx->lock);
    if (rc == CFX_ERR_CANCELED && !cfx__cur_req && cfx__intr_fired()) {
        g->src.node.node_id = 0; /* the lookup was interrupted: nothing to release */
        return get_canceled(g);
    }
    if (rc == CFX_ERR_PEER_FAILED) {
        /* the directory says why the object went (its putter left with no
         * complete copy anywhere, or deleted it): that is the cause, not
         * the source that failed because of it */
        char why[512];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        g->src.node.node_id = 0;
        return cfx__err(rc,
                        "get of object %s on node %u: source node %u failed because "
                        "the object went (%s)",
                        g->hex, ctx->node_id, failed, why);
    }
    if (rc != CFX_OK) {
        g->src.node.node_id = 0;
        const struct cfx_conn_failure *f = cfx__conn_failure(ctx, failed);
        char cause[160] = "", lookup[320] = "";
        if (f && f->at_ns >= g->t0) /* not an older connection's */
            snprintf(cause, sizeof(cause), " (its connection: %s, %s: %s)", f->why,
                     cfx_errname(f->status), cfx_strerror(f->status));
        if (rc == CFX_ERR_CONNECT) /* the lookup's text names the coordinator */
            snprintf(lookup, sizeof(lookup), ": the directory could not be asked (%s)",
                     cfx_last_error());
        return cfx__err(rc == CFX_ERR_TIMEOUT ? CFX_ERR_PEER_FAILED : rc,
                        "get of object %s on node %u: source node %u failed%s and no other "
                        "holder was found in time%s",
                        g->hex, ctx->node_id, failed, cause, lookup);
    }
    free(g->src.data);
    g->src.data = NULL;
    /* The directory names the holders of what the id names now: another
     * put of it (the one being got was deleted meanwhile) is another
     * object, whose chunks must not be mixed with those that landed. */
    if (g->src.is_inline || g->src.size != obj->size || g->src.chunk_size != obj->chunk_size ||
        (g->src.tag && obj->put_tag &&
         (g->src.tag != obj->put_tag || g->src.putter != obj->putter_node)))
        return cfx__err(CFX_ERR_PEER_FAILED,
                        "get of object %s on node %u: the object went while it was being "
                        "got (put by node %u; the id names another put by node %u now)",
                        g->hex, ctx->node_id, obj->putter_node, g->src.putter);
    return CFX_OK;
}

/* Step 4: pull g->obj from g->src, failing over to other holders (ctx->lock
 * held on entry and return). */
static int get_pull(struct get_op *g)
{
    int rc = CFX_OK;
    while (!g->obj->complete) {
        if (!g->striped && !g->cached && cfx__get_stripe_wanted(g->ctx, g->obj, &g->src)) {
            uint32_t failed[CFX_GET_SOURCES_MAX];
            unsigned nfailed = 0;
            g->striped = true;
            rc = cfx__get_stripe(g->ctx, g->obj, &g->src, g->deadline, g->timeout_ms, g->hex,
                                 failed, &nfailed);
            if (rc == CFX_OK || rc == CFX_ERR_TIMEOUT || rc == CFX_ERR_CANCELED ||
                (rc != CFX_ERR_AGAIN && rc != CFX_ERR_PEER_FAILED))
                break;
            if (rc == CFX_ERR_PEER_FAILED) {
                /* every source of the stripe failed: on from the first
                 * missing chunk at another holder (the primary source is
                 * excluded by get_failover) */
                for (unsigned i = 0; i < nfailed; i++)
                    if (failed[i] != g->src.node.node_id && g->nexclude < MAX_SOURCES - 1)
                        g->exclude[g->nexclude++] = failed[i];
                rc = get_failover(g, rc);
                if (rc != CFX_OK)
                    break;
                continue;
            }
            cfx__err_clear(); /* CFX_ERR_AGAIN: one source after all */
        }
        rc = get_attempt(g);
        if (rc == CFX_OK || rc == CFX_ERR_TIMEOUT || rc == CFX_ERR_CANCELED || g->cached)
            break; /* a cached location that failed: get_fail starts over */
        rc = get_failover(g, rc);
        if (rc == CFX_OK && cfx__req_canceled())
            rc = get_canceled(g);
        if (rc != CFX_OK)
            break;
    }
    return rc;
}

/* The entry goes (a failed get, or one withdrawn meanwhile), and with it
 * the registration that exposes the caller's buffer to peers: released
 * right here as the progress-lock holder, so that it is gone before the
 * buffer goes back (ctx->lock held; the buffer stays the caller's). */
static void get_release(struct get_op *g, bool keep_buf)
{
    struct cfx_obj *obj = g->obj;
    obj->deleting = true; /* nobody else releases it while we take the lock */
    if (keep_buf)
        obj->arena = false;
    else
        obj->lent = false; /* a failed cfx_get_alloc: its buffer never reached the caller */
    const struct cfx_object_id id = obj->id;
    bool was_held = cfx__progress_enter(g->ctx);
    cfx__obj_release(g->ctx, obj); /* uploads reading it may keep it a little longer */
    cfx__progress_leave(g->ctx, was_held);
    g->obj = NULL;
    /* Uploads of this node's partial copy to other getters, told to stop,
     * still read the buffer until their posted writes complete (tcp sends
     * from it, verbs reads it by DMA): the buffer goes back to its caller
     * only once the entry has left, or another node would get what the
     * caller writes there next.  A completion or two; writes to a reader
     * that stopped taking them are ended with its connection.  (The wait
     * gave up after 2 s with a warning, and a reader that took its writes
     * later kept the caller's new bytes as the object's chunks.) */
    if (!cfx__obj_wait_released(g->ctx, &id, GET_RELEASE_WAIT_MS))
        CFX_LOG(WARN, OBJ, "node %u: get of %s ended, but its partial copy was still "
                "held after its uploads ended", g->ctx->node_id, g->hex);
}

/* Step 5, the get failed (ctx->lock held on entry, not on return).
 * GET_AGAIN when a cached location was stale: once more from the
 * directory; else the get's status. */
static int get_fail(struct get_op *g, int rc)
{
    struct cfx_context *ctx = g->ctx;

    get_release(g, false);
    if (g->cached && rc != CFX_ERR_TIMEOUT && rc != CFX_ERR_NOMEM && rc != CFX_ERR_CANCELED) {
        /* The cached holder refused (the putter's copy of the id is gone or
         * changed) or failed: a stale location costs this one round trip;
         * the directory knows where the object is now. */
        cfx__loc_forget(&ctx->loc, g->id);
        ctx->stats.loc_stale++;
        pthread_mutex_unlock(&ctx->lock);
        CFX_LOG(DEBUG, OBJ,
                "node %u: cached location of %s (node %u) failed (%s); asking "
                "the directory",
                ctx->node_id, g->hex, g->src.node.node_id, cfx_errname(rc));
        g->refused = g->src.node.node_id;
        g->use_cache = false;
        cfx__err_clear();
        return GET_AGAIN;
    }
    if (g->cached)
        cfx__loc_forget(&ctx->loc, g->id);
    pthread_mutex_unlock(&ctx->lock);
    src_done(ctx, g->id, &g->src, g->cached);
    return rc;
}

/* A get done: its counts, and what reduce planning uses as this node's
 * bandwidth and latency (ctx->lock held). */
static void get_account(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    double secs = (double)(cfx__now_ns() - g->t0) / 1e9;
    ctx->stats.gets++;
    if (g->src.size >= (1u << 20) && secs > 0)
        ctx->est_bw = ctx->est_bw > 0 ? 0.8 * ctx->est_bw + 0.2 * (double)g->src.size / secs
                                      : (double)g->src.size / secs;
    else if (g->src.size <= 65536)
        ctx->est_lat = ctx->est_lat > 0 ? 0.8 * ctx->est_lat + 0.2 * secs : secs;
    CFX_LOG(DEBUG, OBJ, "node %u: got %s (%" PRIu64 " B) in %.3f s", ctx->node_id, g->hex,
            g->src.size, secs);
}

/*
 * Step 5 of a cfx_get() with CFX_OBJ_FLAG_NO_KEEP, the bytes are in the
 * caller's buffer, which is the caller's again when the get returns
 * (ctx->lock held on entry, not on return).  The copy served the nodes
 * that pulled from it while it filled (a chain or tree of getters
 * pipelines through it); it takes no new readers from here, and the
 * directory drops this node's record, so later getters go to other
 * holders.  The readers it has get their bytes first: the get returns once
 * they are done, or at its deadline (at most the context's timeout from
 * now, also for a get that waits for ever), where they are cut off and
 * fail over.  A get that shall leave a copy here for others (and for later
 * gets on this node) is a plain cfx_get() or cfx_get_alloc().
 */
static int get_finish_caller(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    struct cfx_obj *obj = g->obj;
    obj->deleting = true; /* refuses new requests: they fail over */
    cfx__withdrawn_take(ctx, g->id); /* got anew: a delete here is of no old copy */
    get_account(g);
    uint64_t seq = cfx__record_drop_begin(ctx, g->id);
    pthread_mutex_unlock(&ctx->lock);
    if (!g->cached)
        cfx__ctl_obj_done_async(ctx->ctl, g->id, g->src.node.node_id, 0);
    pthread_mutex_lock(&ctx->lock);
    cfx__record_drop_end(ctx, g->id, seq);
    /* the copy was never announced complete: a withdrawal meanwhile
     * (cfx__copy_withdrawn) passes a deleting entry by, so it is ours */
    uint64_t until = g->deadline;
    if (ctx->cfg.timeout_ms > 0)
        until = CFX_MIN(until, cfx__deadline_ns(ctx->cfg.timeout_ms));
    int rc = cfx__obj_drain_release(ctx, obj, until);
    /* readers whose writes did not drain by then are cut off: their
     * connections failed, as the buffer goes back to the caller (it was
     * handed back with them still reading it, under a CFX_ERR_TIMEOUT) */
    if (rc != CFX_OK && cfx__obj_wait_released(ctx, g->id, GET_RELEASE_WAIT_MS))
        rc = CFX_OK;
    pthread_mutex_unlock(&ctx->lock);
    g->obj = NULL;
    if (rc != CFX_OK)
        return cfx__err(rc, "get of object %s on node %u: the bytes are in, but its copy "
                        "was still held after the deadline", g->hex, ctx->node_id);
    return CFX_OK;
}

/* Step 5, the bytes are in (ctx->lock held on entry, not on return). */
static int get_finish(struct get_op *g)
{
    struct cfx_context *ctx = g->ctx;
    struct cfx_obj *obj = g->obj;
    void *data = obj->buf;
    int rc;

    if (obj->withdrawn) {
        /* The directory withdrew the object while it was on its way (the
         * putter deleted it, or it went with its last complete copy): the
         * get began before that and keeps the bytes, but they are no copy
         * of whatever the id names from now on.  Drop the entry (the buffer
         * is the caller's) and its registration, as a failed get does. */
        get_release(g, true);
        ctx->stats.gets++;
        pthread_mutex_unlock(&ctx->lock);
        src_done(ctx, g->id, &g->src, g->cached);
        if (g->alloc)
            *g->out_buf = data;
        CFX_LOG(DEBUG, OBJ, "node %u: got %s (%" PRIu64 " B), withdrawn meanwhile: not kept",
                ctx->node_id, g->hex, g->src.size);
        return CFX_OK;
    }
    /* remember where it lives for the next get of the id here (after this
     * node deleted its copy): only a complete holder, and not one that just
     * refused a cached request (a copy that is not the putter's) */
    if (!g->cached && g->src.complete && g->src.node.node_id != g->refused)
        ctx->stats.loc_evictions += cfx__loc_put(&ctx->loc, g->id, &g->src);
    if (!g->alloc && g->params && (g->params->field_mask & CFX_OBJ_PARAM_FLAGS) &&
        (g->params->flags & CFX_OBJ_FLAG_NO_KEEP))
        return get_finish_caller(g);
    /* Without the lock the entry may go (withdrawn meanwhile: on_obj_gone
     * releases a complete copy): found again by its seq below. */
    uint64_t entry_seq = obj->seq;
    pthread_mutex_unlock(&ctx->lock);

    /* the directory learns we are complete in the background: the bytes
     * are the caller's now, and our partial-holder record already lets
     * others read from us.  A get from a cached location made no record:
     * the copy serves this node only, and is not announced. */
    rc = g->cached ? CFX_ERR_NOT_FOUND
                   : cfx__ctl_obj_done_async(ctx->ctl, g->id, g->src.node.node_id, 1);
    pthread_mutex_lock(&ctx->lock);
    obj = cfx__store_find(&ctx->store, g->id);
    if (obj && obj->seq == entry_seq && !obj->deleting) {
        /* a new copy here: its delete is its own.  Only now: a get that
         * failed (of an id whose copy here its putter withdrew) leaves that
         * delete's answer as it was (CFX_OK) */
        cfx__withdrawn_take(ctx, g->id);
        obj->announced = rc == CFX_OK;
        obj->unrecorded = rc != CFX_OK; /* cached, or the directory was not told */
        pthread_cond_broadcast(&ctx->obj_cond); /* gets here waiting for it (get_held) */
    }
    get_account(g);
    pthread_mutex_unlock(&ctx->lock);
    g->obj = NULL;
    if (g->alloc)
        *g->out_buf = data;
    return CFX_OK;
}

static int get_impl(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf, size_t cap,
                    bool alloc, void **out_buf, size_t *size_out,
                    const struct cfx_obj_params *params, struct cfx__get_watch *watch)
{
    struct get_op g = {
        .ctx = ctx,
        .id = id,
        .buf = buf,
        .cap = cap,
        .alloc = alloc,
        .out_buf = out_buf,
        .size_out = size_out,
        .params = params,
        .watch = watch,
        .timeout_ms = obj_timeout(ctx, params),
        .t0 = cfx__now_ns(),
        .use_cache = true,
    };
    int rc;

    g.deadline = cfx__deadline_ns(g.timeout_ms);
    cfx_object_id_to_hex(id, g.hex);
    cfx__intr_begin();
    for (;;) {
        rc = get_held(&g); /* 1 (GET_MISSING: ctx->lock held) */
        if (rc != GET_MISSING)
            break;
        rc = get_source(&g); /* 2 */
        if (rc == GET_AGAIN)
            continue;
        if (rc != GET_FETCH)
            break;
        rc = get_entry(&g); /* 3 (CFX_OK: ctx->lock held) */
        if (rc == GET_AGAIN)
            continue;
        if (rc != CFX_OK)
            break;
        rc = get_pull(&g); /* 4 */
        if (rc == CFX_OK && cfx__cur_req && cfx__cur_req->cancel) {
            /* its request was freed while the last bytes landed (the
             * free waits for the get; a waiter napping on the transports
             * sees the cancel only once the transfer ended): the buffer
             * is the caller's again, so it is no copy here.  Kept, the
             * node served, and later gets here answered with, whatever
             * the caller wrote into it next. */
            rc = get_canceled(&g);
        }
        if (rc == CFX_OK) {
            rc = get_finish(&g); /* 5 */
            break;
        }
        rc = get_fail(&g, rc);
        if (rc != GET_AGAIN)
            break;
    }
    cfx__intr_end();
    return rc;
}

int cfx__get_call(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                  size_t capacity, size_t *size_out, const struct cfx_obj_params *params)
{
    cfx__err_clear();
    if (!ctx || !id || (!buf && capacity))
        return cfx__err(CFX_ERR_INVALID, "cfx_get: NULL %s",
                        !ctx  ? "context"
                        : !id ? "id"
                              : "buffer");
    int rc = check_params(params, "cfx_get");
    if (rc != CFX_OK)
        return rc;
    if (obj_memtype(params) == CFX_MEMTYPE_CUDA) /* staged through host memory */
        return cfx__gpu_stage_get(ctx, id, buf, capacity, size_out, params);
    return get_impl(ctx, id, buf, capacity, false, NULL, size_out, params, NULL);
}

int cfx__get_alloc_call(struct cfx_context *ctx, const struct cfx_object_id *id, void **buf_out,
                        size_t *size_out, const struct cfx_obj_params *params)
{
    cfx__err_clear();
    if (!ctx || !id || !buf_out)
        return cfx__err(CFX_ERR_INVALID, "cfx_get_alloc: NULL %s",
                        !ctx  ? "context"
                        : !id ? "id"
                              : "buf_out");
    *buf_out = NULL;
    if (obj_memtype(params) != CFX_MEMTYPE_HOST)
        return cfx__err(CFX_ERR_UNSUPPORTED, "cfx_get_alloc: the arena holds host memory only");
    int rc = check_params(params, "cfx_get_alloc");
    if (rc != CFX_OK)
        return rc;
    return get_impl(ctx, id, NULL, 0, true, buf_out, size_out, params, NULL);
}

int cfx__get_alloc_watched(struct cfx_context *ctx, const struct cfx_object_id *id, void **buf_out,
                           size_t *size_out, const struct cfx_obj_params *params,
                           struct cfx__get_watch *w)
{
    *buf_out = NULL;
    return get_impl(ctx, id, NULL, 0, true, buf_out, size_out, params, w);
}

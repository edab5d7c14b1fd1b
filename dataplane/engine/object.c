/* The object API: put, delete and the arena; the get is in get.c. */
#include "object.h"
#include "gpu_stage.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RELEASE_WAIT_MS 2000 /* a delete waits past its deadline this long for its release */
#define RELEASE_POLL_MS 20   /* cfx__obj_wait_released() looks at the writes in flight */

/* ---- put ------------------------------------------------------------------- */

/*
 * A put that failed on this side (its answer late, or lost with a
 * connection since restored) may have been taken by the directory all the
 * same, which would then send getters here for an object this node no
 * longer holds: they would wait for it to their deadlines and fail naming
 * this node as a failed source.  The directory withdraws it (this put only:
 * not a later put of the id here, nor anyone else's object).  With the
 * connection lost, the coordinator drops this node's records when it finds
 * the node gone.  The put's own error stays the caller's.
 */
static void put_withdraw(struct cfx_context *ctx, const struct cfx_object_id *id, uint64_t tag,
                         int put_rc)
{
    char why[CFX__ERR_TEXT_MAX], hex[CFX_OBJECT_ID_HEX_LEN];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    int rc = cfx__ctl_obj_put_withdraw(ctx->ctl, id, tag, cfx__deadline_ns(RELEASE_WAIT_MS));
    if (rc != CFX_OK && rc != CFX_ERR_NOT_FOUND) {
        cfx_object_id_to_hex(id, hex);
        CFX_LOG(WARN, OBJ, "node %u: failed put of %s: the directory may still name this node "
                "as its holder: %s", ctx->node_id, hex, cfx_last_error());
    }
    cfx__err(put_rc, "%s", why);
}

static int put_call(struct cfx_context *ctx, const struct cfx_object_id *id,
                    const void *buf, size_t size, const struct cfx_obj_params *params)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    int rc;

    cfx__err_clear();
    if (!ctx || !id || (!buf && size))
        return cfx__err(CFX_ERR_INVALID, "cfx_put: NULL %s", !ctx ? "context" : !id ? "id" : "buffer");
    if (size > CFX_XFER_SIZE_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "cfx_put: %zu bytes is larger than an object may be", size);
    rc = check_params(params, "cfx_put");
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
    obj->putting = true;
    obj->ready_chunks = obj->nchunks;

    uint64_t deadline = cfx__deadline_ns(obj_timeout(ctx, params));
    struct cfx_obj *old;
    pthread_mutex_lock(&ctx->lock);
    if (buf)
        cfx__arena_lookup(ctx, buf, &obj->shm_fd, &obj->shm_off);
    /* a copy on its way out (deleted here, or withdrawn by its putter) is no
     * object: the id is free once it has left the store */
    while ((old = cfx__store_find(&ctx->store, id))) {
        if (!old->deleting && old->complete && old->unrecorded) {
            /* A copy got from a cached location, unknown to the directory:
             * nobody would have told us if its putter deleted it since, so
             * it cannot say the id is taken.  It gives way (as to a get,
             * get.c get_held; a buffer lent to a cfx_get_alloc caller stays
             * theirs) and the directory judges the put. */
            old->deleting = true;
            cfx__cmd_must(ctx, CFX_CMD_OBJ_RELEASE, old);
            continue; /* released here at once (no memory for a command) it is gone */
        }
        /* (a copy withdrawn while it was got is on its way out too, and one
         * got from a cached location gives way once its get is done) */
        if ((!old->deleting && !old->withdrawn && !(old->loc_src && !old->unrecorded)) ||
            !cfx__obj_wait(ctx, deadline))
            break;
    }
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
    if (ctx->test_hold_put) { /* test hook (test_get_races.c) */
        ctx->test_put_held = true;
        pthread_cond_broadcast(&ctx->obj_cond);
        while (ctx->test_hold_put && cfx__obj_wait(ctx, deadline))
            ;
    }
    pthread_mutex_unlock(&ctx->lock);

    bool no_inline = params && (params->field_mask & CFX_OBJ_PARAM_FLAGS) &&
                     (params->flags & CFX_OBJ_FLAG_NO_INLINE);
    bool inl = size <= ctx->cfg.inline_max && !no_inline;
    /* The store refused a second object under this id above, so a record
     * of this node as the id's putter can only be this put: sent again
     * after a reconnect, or re-announced first (reannounce.c). */
    rc = cfx__ctl_obj_put_own(ctx->ctl, id, size, chunk, inl ? buf : NULL, tag, deadline);
    pthread_mutex_lock(&ctx->lock);
    if (unlikely(ctx->test_put_late) && rc == CFX_OK) {
        /* test hook (test_get_handback.c): the directory took the put, and
         * its answer comes after the put's deadline */
        ctx->test_put_held = true;
        pthread_cond_broadcast(&ctx->obj_cond);
        while (ctx->test_put_late && cfx__obj_wait(ctx, deadline))
            ;
        rc = CFX_ERR_TIMEOUT;
    }
    obj->putting = false;
    pthread_cond_broadcast(&ctx->obj_cond); /* gets here waited for the answer */
    if (rc != CFX_OK) {
        obj->deleting = true;
        cfx__cmd_must(ctx, CFX_CMD_OBJ_RELEASE, obj);
        /* A directory that took the put (its answer late, or lost with the
         * connection) may have sent getters here already: writes of theirs
         * read the buffer until they complete, and the caller has it back
         * when this returns. */
        if (!cfx__obj_wait_released(ctx, id, RELEASE_WAIT_MS))
            CFX_LOG(WARN, OBJ, "node %u: failed put of %s: its entry was still held after its "
                    "uploads ended", ctx->node_id, hex);
    } else {
        obj->announced = true;
        ctx->stats.puts++;
    }
    pthread_mutex_unlock(&ctx->lock);
    if ((rc == CFX_ERR_TIMEOUT || rc == CFX_ERR_CONNECT) && !cfx__ctl_lost_ms(ctx->ctl))
        put_withdraw(ctx, id, tag, rc);
    if (rc == CFX_OK)
        CFX_LOG(DEBUG, OBJ, "node %u: put %s (%zu B, %u B chunks)", ctx->node_id, hex, size, chunk);
    return rc;
}

/*
 * ctx->lock held, @p obj marked deleting: let uploads of it in progress
 * finish, and reduce tasks reading it as their input, up to @p deadline;
 * then release it (uploads still running are told to stop) and wait for
 * the entry to leave the store, with its registrations: the caller may
 * reuse the buffer once this returns CFX_OK.  Uploads told to stop drain
 * within a completion, so a short grace past the deadline is enough.
 * CFX_ERR_TIMEOUT: still draining.
 */
int cfx__obj_drain_release(struct cfx_context *ctx, struct cfx_obj *obj, uint64_t deadline)
{
    const struct cfx_object_id id = obj->id;
    while ((!cfx_list_empty(&obj->uploads) || obj->refs) && !cfx__ctx_closing(ctx) &&
           cfx__obj_wait(ctx, deadline))
        ;
    cfx__cmd_must_here(ctx, CFX_CMD_OBJ_RELEASE, obj);
    /* until the entry has left, a put or get of the id here would find it */
    uint64_t until = CFX_MAX(deadline, cfx__deadline_ns(RELEASE_WAIT_MS));
    struct cfx_obj *left;
    while ((left = cfx__store_find(&ctx->store, &id)) && left->deleting &&
           cfx__obj_wait(ctx, until))
        ;
    left = cfx__store_find(&ctx->store, &id);
    return !left || !left->deleting ? CFX_OK : CFX_ERR_TIMEOUT;
}

/* Writes of @p obj's uploads posted and not completed (ctx->lock held). */
uint64_t cfx__obj_writes_in_flight(const struct cfx_obj *obj)
{
    uint64_t n = 0;
    const struct cfx_list *pos;
    cfx_list_for_each(pos, &obj->uploads)
        n += cfx_list_entry(pos, const struct cfx_upload, obj_link)->inflight;
    return n;
}

bool cfx__obj_wait_released(struct cfx_context *ctx, const struct cfx_object_id *id,
                            int grace_ms)
{
    uint64_t grace = 0, left = UINT64_MAX;
    struct cfx_obj *o;
    while ((o = cfx__store_find(&ctx->store, id)) && o->deleting) {
        uint64_t now_left = cfx__obj_writes_in_flight(o);
        if (now_left < left)
            grace = cfx__deadline_ns(grace_ms); /* still draining */
        left = now_left;
        if (cfx__now_ns() >= grace)
            break;
        /* write completions signal nothing here: look again every poll */
        cfx__obj_wait(ctx, CFX_MIN(grace, cfx__deadline_ns(RELEASE_POLL_MS)));
    }
    bool was_held = cfx__progress_enter(ctx);
    while ((o = cfx__store_find(&ctx->store, id)) && o->deleting &&
           !cfx_list_empty(&o->uploads)) {
        struct cfx_upload *up = cfx_list_entry(o->uploads.next, struct cfx_upload, obj_link);
        if (up->conn->state == CFX_CONN_FAILED)
            break; /* its teardown is under way: it ends the upload */
        /* held while the connection goes, so that the entry's release (its
         * registrations with it) comes after the endpoint closed, not
         * under the writes still queued there */
        o->refs++;
        cfx__conn_fail(up->conn, CFX_ERR_TIMEOUT, "writes from a copy whose buffer goes back "
                       "to its caller did not drain in time");
        if (!--o->refs && o->releasing)
            cfx__obj_release(ctx, o);
    }
    cfx__progress_leave(ctx, was_held);
    o = cfx__store_find(&ctx->store, id);
    return !o || !o->deleting;
}

/* ---- delete ---------------------------------------------------------------- */

/* @p end: a cfx_delete, which ends the object when this node may (its
 * putter, or the submitter of the task that put it, even holding no copy);
 * else the copy of a freed cfx_get_alloc buffer goes, and only it. */
static int delete_call(struct cfx_context *ctx, const struct cfx_object_id *id,
                       const struct cfx_obj_params *params, bool end)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint64_t deadline;
    int rc;

    cfx__err_clear();
    if (!ctx || !id)
        return cfx__err(CFX_ERR_INVALID, "cfx_delete: NULL %s", !ctx ? "context" : "id");
    rc = cfx__mask_check(params ? params->field_mask : 0, CFX_OBJ_PARAM_ALL, "cfx_delete",
                         "cfx_obj_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    cfx_object_id_to_hex(id, hex);
    deadline = cfx__deadline_ns(obj_timeout(ctx, params));

    pthread_mutex_lock(&ctx->lock);
    while (ctx->reannounce_hold && !ctx->reannounce_held && cfx__obj_wait(ctx, deadline))
        ; /* test hook: see reannounce.c */
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    /* A copy on its way out (an earlier delete that timed out, a copy its
     * putter withdrew) may still be read by uploads or reduce tasks: none
     * of the answers below may hand the buffer back before it has left.  A
     * destroy ends the wait (closing): the call is one in flight. */
    while (obj && obj->deleting && !cfx__ctx_closing(ctx) && cfx__obj_wait(ctx, deadline))
        obj = cfx__store_find(&ctx->store, id);
    if (obj && obj->deleting) {
        pthread_mutex_unlock(&ctx->lock);
        return cfx__err(CFX_ERR_TIMEOUT, "cfx_delete: node %u could not release object %s: "
                        "its copy here was still being released at the deadline (uploads "
                        "draining, or reduce tasks reading it)", ctx->node_id, hex);
    }
    if ((!obj || obj->deleting) && cfx__withdrawn_take(ctx, id)) {
        /* its putter withdrew the copy this node got (on_obj_gone): done
         * already, as when the putter left */
        pthread_mutex_unlock(&ctx->lock);
        return CFX_OK;
    }
    if (!obj && end && !cfx__ctl_lost_ms(ctx->ctl)) {
        /* no copy here: the task this node submitted may have put it (the
         * coordinator decides; NOT_FOUND from it names what it knows); with
         * the coordinator lost, the local answer at once, as before.  The
         * directory drops this node's record of the id, which a get of it
         * here may have just made (cfx__record_drop_begin). */
        uint64_t seq = cfx__record_drop_begin(ctx, id);
        /* a put of the id here from now on is not this delete's to take:
         * it is tagged with a later store sequence (cfx__store_insert) */
        uint64_t put_below = ctx->store.last_seq + 1;
        pthread_mutex_unlock(&ctx->lock);
        rc = cfx__ctl_obj_delete_before(ctx->ctl, id, put_below, deadline);
        pthread_mutex_lock(&ctx->lock);
        cfx__record_drop_end(ctx, id, seq);
        pthread_mutex_unlock(&ctx->lock);
        return rc;
    }
    /* obj->in: a get here still owns the entry (its last chunk landed, the
     * getter has yet to finish it): no copy here until that get returns;
     * obj->putting: nor before the directory took this node's put */
    if (!obj || obj->deleting || !obj->complete || obj->in || obj->putting) {
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
    /* gets of the id here whose lookups came before it keep no copy (a
     * putter's own withdrawal is not told to it) */
    uint64_t seq = announced ? cfx__record_drop_begin(ctx, id) : 0;
    pthread_mutex_unlock(&ctx->lock);

    rc = CFX_OK;
    if (announced)
        rc = end ? cfx__ctl_obj_delete(ctx->ctl, id, deadline)
                 : cfx__ctl_obj_drop(ctx->ctl, id, deadline);

    pthread_mutex_lock(&ctx->lock);
    if (announced)
        cfx__record_drop_end(ctx, id, seq);
    obj->announced = false;
    int drc = cfx__obj_drain_release(ctx, obj, deadline);
    ctx->deletes_done++;
    pthread_cond_broadcast(&ctx->obj_cond);
    pthread_mutex_unlock(&ctx->lock);
    if (drc != CFX_OK)
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
    if (cfx__ctx_forked(ctx))
        return cfx__err(CFX_ERR_INVALID, "cfx_buf_alloc: the context was created before this "
                        "process forked: a child creates its own");
    return cfx__arena_alloc(ctx, size, out, &fd, &off);
}

void cfx_buf_free(struct cfx_context *ctx, void *buf)
{
    struct cfx_object_id id;
    bool backs_object = false;

    /* a forked child's: its memory goes with the process (the parent's
     * threads may have held ctx->lock at the fork) */
    if (!ctx || !buf || cfx__ctx_forked(ctx))
        return;
    struct cfx_obj *entry = NULL;
    pthread_mutex_lock(&ctx->lock);
    for (unsigned b = 0; b < CFX_STORE_BUCKETS && !entry; b++)
        for (struct cfx_obj *o = ctx->store.buckets[b]; o; o = o->hnext)
            if (o->arena && o->buf == buf) {
                entry = o;
                break;
            }
    if (entry) {
        /* the caller lets go: the entry's release frees the buffer; one
         * being released already (a delete) needs nothing more */
        entry->lent = false;
        id = entry->id;
        backs_object = !entry->deleting;
    } else {
        cfx__arena_free(ctx, buf); /* no entry (left): the buffer is the caller's alone */
    }
    pthread_mutex_unlock(&ctx->lock);
    /* The buffer holds an object this node serves (cfx_get_alloc): withdraw
     * the object; its release frees the buffer once uploads have drained.
     * Nobody waits for the answer: with the coordinator lost, the copy goes
     * here at once instead of after the whole deadline of a call that waits
     * for the reconnection (a stale record elsewhere costs a getter one
     * failover; a restarted coordinator knew nothing of it anyway). */
    if (backs_object) {
        struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 100 };
        if (cfx__ctx_enter(ctx, "cfx_buf_free") == CFX_OK)
            cfx__api_done(ctx, delete_call(ctx, &id, cfx__ctl_lost_ms(ctx->ctl) ? &p : NULL,
                                           false));
    }
}

void cfx__copy_drop_freed(struct cfx_context *ctx, const struct cfx_object_id *id,
                          const void *buf)
{
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    bool held = obj && obj->buf == buf && !obj->arena && !obj->deleting;
    pthread_mutex_unlock(&ctx->lock);
    /* with the coordinator lost, at once (as cfx_buf_free) */
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 100 };
    if (held && cfx__ctx_enter(ctx, "cfx_request_free") == CFX_OK)
        cfx__api_done(ctx, delete_call(ctx, id, cfx__ctl_lost_ms(ctx->ctl) ? &p : NULL,
                                       false));
}

/* ---- the API: each call counted for cfx_context_destroy() ------------------- */

int cfx_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *buf,
            size_t size, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_put") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = put_call(ctx, id, buf, size, params);
    return ctx ? cfx__api_done(ctx, rc) : rc;
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
    return cfx__api_done(ctx, rc);
}

int cfx_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf, size_t capacity,
            size_t *size_out, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_get") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = cfx__get_call(ctx, id, buf, capacity, size_out, params);
    return ctx ? cfx__api_done(ctx, rc) : rc;
}

int cfx_get_alloc(struct cfx_context *ctx, const struct cfx_object_id *id, void **buf_out,
                  size_t *size_out, const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_get_alloc") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = cfx__get_alloc_call(ctx, id, buf_out, size_out, params);
    return ctx ? cfx__api_done(ctx, rc) : rc;
}

int cfx__delete_detaching(struct cfx_context *ctx, const struct cfx_object_id *id,
                          const struct cfx_obj_params *params)
{
    return delete_call(ctx, id, params, true);
}

int cfx_delete(struct cfx_context *ctx, const struct cfx_object_id *id,
               const struct cfx_obj_params *params)
{
    int rc = ctx ? cfx__ctx_enter(ctx, "cfx_delete") : CFX_OK;
    if (rc != CFX_OK)
        return rc;
    rc = delete_call(ctx, id, params, true);
    return ctx ? cfx__api_done(ctx, rc) : rc;
}

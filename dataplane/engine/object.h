/*
 * What put, get and delete share (object.c, get.c): the call's parameters
 * read with their defaults, and a new store entry.
 */
#ifndef CFX_ENGINE_OBJECT_H
#define CFX_ENGINE_OBJECT_H

#include "engine.h"
#include "gpu/memtype.h"

static inline int obj_timeout(const struct cfx_context *ctx, const struct cfx_obj_params *p)
{
    return p && (p->field_mask & CFX_OBJ_PARAM_TIMEOUT) ? p->timeout_ms : ctx->cfg.timeout_ms;
}

static inline enum cfx_memtype obj_memtype(const struct cfx_obj_params *p)
{
    return p && (p->field_mask & CFX_OBJ_PARAM_MEMTYPE) ? p->memtype : CFX_MEMTYPE_HOST;
}

/* Buffers of @p mt can be used here: CFX_ERR_INVALID for an unknown type,
 * CFX_ERR_UNSUPPORTED when not built in, CFX_ERR_NO_DEVICE with no device. */
static inline int check_memtype(enum cfx_memtype mt, const char *what)
{
    if ((unsigned)mt >= CFX_MEMTYPE_LAST)
        return cfx__err(CFX_ERR_INVALID, "%s: unknown memory type %d", what, (int)mt);
    return cfx__memtype_require(mt, what);
}

#define CFX_OBJ_FLAGS_KNOWN \
    (CFX_OBJ_FLAG_NO_INLINE | CFX_OBJ_FLAG_NO_KEEP | CFX_OBJ_FLAG_ALLREDUCE)

/* The params a call takes: no field this library does not know
 * (CFX_ERR_UNSUPPORTED: a newer header's field is not ignored), its memory
 * type usable here (check_memtype), and no flag this library does not know
 * (a caller's typo or a newer library's flag is an error, not ignored). */
static inline int check_params(const struct cfx_obj_params *p, const char *what)
{
    int rc = cfx__mask_check(p ? p->field_mask : 0, CFX_OBJ_PARAM_ALL, what,
                             "cfx_obj_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    if (p && (p->field_mask & CFX_OBJ_PARAM_FLAGS) && (p->flags & ~(uint64_t)CFX_OBJ_FLAGS_KNOWN))
        return cfx__err(CFX_ERR_INVALID, "%s: unknown flags %#llx", what,
                        (unsigned long long)(p->flags & ~(uint64_t)CFX_OBJ_FLAGS_KNOWN));
    return check_memtype(obj_memtype(p), what);
}

static inline struct cfx_obj *obj_new(const struct cfx_object_id *id, uint64_t size, uint32_t chunk)
{
    struct cfx_obj *obj = cfx__obj_alloc(size, chunk);
    if (obj)
        obj->id = *id;
    return obj;
}

/* object.c: ctx->lock held, @p obj marked deleting: let its uploads and
 * readers finish (up to @p deadline), release it and wait for it to leave
 * the store.  CFX_OK, CFX_ERR_NOMEM, or CFX_ERR_TIMEOUT (still draining). */
int cfx__obj_drain_release(struct cfx_context *ctx, struct cfx_obj *obj, uint64_t deadline);

/* object.c: ctx->lock held, the entry of @p id released (deleting, its
 * uploads told to stop), its buffer about to go back to its caller: wait
 * until the entry has left the store.  Uploads still writing from it read
 * the buffer until their posted writes complete (tcp sends from it, shm
 * peers and verbs devices read it); the wait starts again whenever one
 * completes, and writes that make no progress for @p grace_ms have their
 * connection failed, which ends them (as a withdrawn send's, p2p.c).
 * False when the entry is still there (a reader that is no upload). */
bool cfx__obj_wait_released(struct cfx_context *ctx, const struct cfx_object_id *id,
                            int grace_ms);
/* object.c: writes of @p obj's uploads posted and not completed (ctx->lock
 * held); a withdrawn send's drain watches them too (p2p.c). */
uint64_t cfx__obj_writes_in_flight(const struct cfx_obj *obj);

/* object.c: a cfx_get_nb() whose request was freed while it ran made a
 * copy here in @p buf all the same (worker.c): this node's copy goes, as a
 * freed cfx_get_alloc() buffer's does; nothing when @p buf holds none. */
void cfx__copy_drop_freed(struct cfx_context *ctx, const struct cfx_object_id *id,
                          const void *buf);

/* get.c: cfx_get() and cfx_get_alloc() once counted as calls (object.c). */
int cfx__get_call(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                  size_t capacity, size_t *size_out, const struct cfx_obj_params *params);
int cfx__get_alloc_call(struct cfx_context *ctx, const struct cfx_object_id *id, void **buf_out,
                        size_t *size_out, const struct cfx_obj_params *params);

/* get_stripe.c (ctx->lock held): should the get of @p obj from @p src
 * (its lookup's answer) pull from several complete holders at once? */
bool cfx__get_stripe_wanted(const struct cfx_context *ctx, const struct cfx_obj *obj,
                            const struct cfx_ctl_source *src);
/* Pull @p obj from src's holder and its extra sources at once, until it is
 * complete (CFX_OK), the deadline (CFX_ERR_TIMEOUT), a failure that is no
 * lost source (its status, naming the peer), or every source failed
 * (CFX_ERR_PEER_FAILED: the caller fails over from the first missing
 * chunk).  CFX_ERR_AGAIN: fewer than two sources were usable, nothing was
 * asked.  @p failed (CFX_GET_SOURCES_MAX entries) gets the sources that
 * failed.  ctx->lock held on entry and return (dropped while waiting). */
int cfx__get_stripe(struct cfx_context *ctx, struct cfx_obj *obj,
                    const struct cfx_ctl_source *src, uint64_t deadline, int timeout_ms,
                    const char *hex, uint32_t *failed, unsigned *nfailed);

#endif

/*
 * Non-blocking calls.  A put or get needs coordinator round trips and waits
 * on transfers; the non-blocking forms hand the whole operation to one of a
 * context's worker threads (started on first use) and return a request.
 */
#include "engine.h"
#include "object.h"

#include "gpu/memtype.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Worker threads a context may start: one for each request that finds no
 * idle one, so that a request never waits behind others that wait (two
 * gets of objects nobody had put yet held up a third of an object held
 * here, past its own deadline, until theirs ran out).  Beyond this many a
 * request waits in the queue, its deadline running from its submission. */
#define NWORKERS ((int)(sizeof(((struct cfx_context *)0)->workers) / sizeof(pthread_t)))

/* Set the final status (ctx->lock held).  A failure keeps this thread's
 * cfx_last_error(), the operation's own words (the peer it failed with,
 * the deadline it missed), for the thread that tests or waits. */
static void complete_locked(struct cfx_request *req, int status, size_t size)
{
    req->size = size;
    cfx__status_set(&req->status, status);
    if (status != CFX_OK)
        snprintf(req->err, sizeof(req->err), "%s", cfx_last_error());
    pthread_cond_broadcast(&req->cond);
    if (req->freed_by_user) {
        cfx_list_del(&req->live);
        pthread_cond_destroy(&req->cond);
        free(req);
    }
}

/* The status of a finished request, its detail made the calling thread's
 * cfx_last_error() (ctx->lock held). */
static int finished(const struct cfx_request *req)
{
    int st = req->status;
    if (st != CFX_OK)
        cfx__err(st, "%s", req->err[0] ? req->err : cfx_strerror(st));
    return st;
}

_Thread_local struct cfx_request *cfx__cur_req;

bool cfx__req_canceled(void)
{
    /* a request's own cancel, or the interrupt of a blocking call (never
     * on a worker: it runs no check) */
    return (cfx__cur_req && cfx__cur_req->cancel) || cfx__intr_fired();
}

/* A request taken off the queue after it waited for a worker (all NWORKERS
 * busy when it came): what is left of its deadline, counted from its
 * submission, becomes its call's timeout.  CFX_ERR_TIMEOUT when it ran out
 * in the queue. */
static int deadline_left(struct cfx_context *ctx, struct cfx_request *req)
{
    struct cfx_obj_params *p = &req->params;
    int t = (p->field_mask & CFX_OBJ_PARAM_TIMEOUT) ? p->timeout_ms : ctx->cfg.timeout_ms;
    if (!req->queued_ns || t <= 0) /* a worker was free; no deadline, or a get of a copy
                                      held here only */
        return CFX_OK;
    uint64_t waited_ms = (cfx__now_ns() - req->queued_ns) / 1000000u;
    if (waited_ms < (uint64_t)t) {
        p->field_mask |= CFX_OBJ_PARAM_TIMEOUT;
        p->timeout_ms = t - (int)waited_ms;
        return CFX_OK;
    }
    char hex[CFX_OBJECT_ID_HEX_LEN];
    cfx_object_id_to_hex(&req->id, hex);
    return cfx__err(CFX_ERR_TIMEOUT, "%s of object %s on node %u: its %d ms passed while it "
                    "waited for one of the context's %d worker threads, all busy",
                    req->type == CFX_REQ_PUT ? "cfx_put_nb" : "cfx_get_nb", hex, ctx->node_id, t,
                    NWORKERS);
}

static void *worker_main(void *arg)
{
    struct cfx_context *ctx = arg;

    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        while (cfx_list_empty(&ctx->async_q) && !ctx->workers_stop) {
            ctx->nidle++;
            pthread_cond_wait(&ctx->async_cond, &ctx->lock);
            ctx->nidle--;
        }
        if (cfx_list_empty(&ctx->async_q))
            break;
        struct cfx_request *req = cfx_list_entry(ctx->async_q.next, struct cfx_request, link);
        cfx_list_del(&req->link);
        ctx->nqueued--;
        req->started = true;
        pthread_mutex_unlock(&ctx->lock);

        size_t size = 0;
        int rc = deadline_left(ctx, req);
        if (rc != CFX_OK) {
            /* its deadline passed in the queue (said so) */
        } else if ((rc = cfx__memtype_set_device(CFX_MEMTYPE_CUDA, req->device)) != CFX_OK) {
            /* device memory: on the device the poster had current, not
             * this thread's (streams, and the default stream the copy is
             * ordered after, are the current device's) */
            rc = cfx__err(rc, "%s of device memory: device %d on a worker thread: %s",
                          req->type == CFX_REQ_PUT ? "cfx_put_nb" : "cfx_get_nb", req->device,
                          cfx_last_error());
        } else if (req->type == CFX_REQ_PUT) {
            rc = cfx_put(ctx, &req->id, req->buf, req->capacity, &req->params);
            size = req->capacity;
        } else {
            cfx__cur_req = req;
            rc = cfx_get(ctx, &req->id, req->buf, req->capacity, &size, &req->params);
            cfx__cur_req = NULL;
            pthread_mutex_lock(&ctx->lock);
            bool freed = req->cancel;
            pthread_mutex_unlock(&ctx->lock);
            /* freed after the get kept its copy, before it reported: the
             * free returns the buffer to the caller, so the copy goes */
            if (rc == CFX_OK && freed)
                cfx__copy_drop_freed(ctx, &req->id, req->buf);
        }

        pthread_mutex_lock(&ctx->lock);
        complete_locked(req, rc, size);
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

static int submit(struct cfx_context *ctx, enum cfx_req_type type, const struct cfx_object_id *id,
                  void *buf, size_t len, const struct cfx_obj_params *params,
                  struct cfx_request **out)
{
    struct cfx_request *req = calloc(1, sizeof(*req));
    if (!req)
        return cfx__err(CFX_ERR_NOMEM, "out of memory for a request");
    req->ctx = ctx;
    req->type = type;
    cfx__status_set(&req->status, CFX_ERR_AGAIN);
    req->id = *id;
    req->buf = buf;
    req->capacity = len;
    if (params)
        req->params = *params;
    /* device memory: the worker works on the device current here */
    req->device = -1;
    int drc = params && (params->field_mask & CFX_OBJ_PARAM_MEMTYPE) &&
                      params->memtype == CFX_MEMTYPE_CUDA &&
                      cfx__memtype_available(CFX_MEMTYPE_CUDA)
                  ? cfx__memtype_device(CFX_MEMTYPE_CUDA, &req->device)
                  : CFX_OK;
    if (drc != CFX_OK) {
        free(req);
        return cfx__err(drc, "%s of device memory: the current device: %s",
                        type == CFX_REQ_PUT ? "cfx_put_nb" : "cfx_get_nb", cfx_last_error());
    }
    cfx__cond_init_mono(&req->cond);

    pthread_mutex_lock(&ctx->lock);
    req->seq0 = ctx->store.last_seq;
    if (ctx->workers_stop) {
        pthread_mutex_unlock(&ctx->lock);
        pthread_cond_destroy(&req->cond);
        free(req);
        return cfx__err(CFX_ERR_CLOSED, "context is being destroyed");
    }
    /* a worker for each request queued: an idle one, else a new one */
    bool behind = ctx->nqueued + 1 > ctx->nidle;
    if (behind && ctx->nworkers < NWORKERS &&
        !pthread_create(&ctx->workers[ctx->nworkers], NULL, worker_main, ctx)) {
        pthread_setname_np(ctx->workers[ctx->nworkers], "cfx-worker");
        ctx->nworkers++;
        behind = false;
    }
    if (!ctx->nworkers) {
        pthread_mutex_unlock(&ctx->lock);
        pthread_cond_destroy(&req->cond);
        free(req);
        return cfx__err(CFX_ERR_NO_RESOURCE, "cannot start a worker thread");
    }
    /* none free for it: it waits for one, on its own deadline */
    req->queued_ns = behind ? cfx__now_ns() : 0;
    ctx->nqueued++;
    cfx_list_add_tail(&req->link, &ctx->async_q);
    cfx_list_add_tail(&req->live, &ctx->reqs);
    pthread_cond_signal(&ctx->async_cond);
    pthread_mutex_unlock(&ctx->lock);
    *out = req;
    return CFX_OK;
}

int cfx_put_nb(struct cfx_context *ctx, const struct cfx_object_id *id, const void *buf,
               size_t size, const struct cfx_obj_params *params, struct cfx_request **req)
{
    cfx__err_clear();
    if (!ctx || !id || !req || (!buf && size))
        return cfx__err(CFX_ERR_INVALID, "cfx_put_nb: NULL argument");
    int rc = cfx__mask_check(params ? params->field_mask : 0, CFX_OBJ_PARAM_ALL, "cfx_put_nb",
                             "cfx_obj_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    return submit(ctx, CFX_REQ_PUT, id, (void *)buf, size, params, req);
}

int cfx_get_nb(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
               size_t capacity, const struct cfx_obj_params *params, struct cfx_request **req)
{
    cfx__err_clear();
    if (!ctx || !id || !req || (!buf && capacity))
        return cfx__err(CFX_ERR_INVALID, "cfx_get_nb: NULL argument");
    int rc = cfx__mask_check(params ? params->field_mask : 0, CFX_OBJ_PARAM_ALL, "cfx_get_nb",
                             "cfx_obj_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    return submit(ctx, CFX_REQ_GET, id, buf, capacity, params, req);
}

/* A request of a context made before this process forked (include/conflux/context.h). */
static int forked_err(const char *what)
{
    return cfx__err(CFX_ERR_INVALID, "%s: the request was made before this process forked: a "
                    "child waits for nothing of its parent's", what);
}

int cfx_request_test(struct cfx_request *req)
{
    cfx__err_clear();
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "cfx_request_test: NULL request");
    if (!req->ctx) /* its context was destroyed: the status is final */
        return finished(req);
    if (cfx__ctx_forked(req->ctx))
        return forked_err("cfx_request_test");
    /* the worker running it may wait on a transfer only progress moves: a
     * caller that only tests drives one pass, as MPI_Test does */
    if (__atomic_load_n(&req->status, __ATOMIC_ACQUIRE) == CFX_ERR_AGAIN)
        cfx__progress_test_pass(req->ctx);
    pthread_mutex_lock(&req->ctx->lock);
    int st = req->status == CFX_ERR_AGAIN ? CFX_ERR_AGAIN : finished(req);
    pthread_mutex_unlock(&req->ctx->lock);
    return st;
}

static bool get_progress(struct cfx_context *ctx, struct cfx_request *req, uint64_t *done,
                         uint64_t *total);

/* A wait that ran out (ctx->lock held): CFX_ERR_TIMEOUT, saying what still
 * runs and how far a get has come. */
static int still_running(struct cfx_request *req, int timeout_ms)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint64_t done = 0, total = 0;
    if (req->type != CFX_REQ_PUT && req->type != CFX_REQ_GET)
        return cfx__err(CFX_ERR_TIMEOUT, "request still running after %d ms", timeout_ms);
    cfx_object_id_to_hex(&req->id, hex);
    if (req->type == CFX_REQ_PUT)
        return cfx__err(CFX_ERR_TIMEOUT, "put of object %s still running after %d ms", hex,
                        timeout_ms);
    if (!get_progress(req->ctx, req, &done, &total))
        return cfx__err(CFX_ERR_TIMEOUT, "get of object %s still running after %d ms: no "
                        "source found yet", hex, timeout_ms);
    return cfx__err(CFX_ERR_TIMEOUT, "get of object %s still running after %d ms: %" PRIu64
                    " of %" PRIu64 " bytes landed", hex, timeout_ms, done, total);
}

/* One wait on @p req's condition until @p deadline (ctx->lock held; as
 * cfx__cond_wait_until), counted: a destroy on another thread ends the
 * request, lets it go of the context and frees the context only once this
 * thread has left ctx->lock. */
static bool counted_wait(struct cfx_context *ctx, struct cfx_request *req, uint64_t deadline)
{
    ctx->req_waiters++;
    bool more = cfx__cond_wait_until(&req->cond, &ctx->lock, deadline);
    if (--ctx->req_waiters == 0 && ctx->closing)
        pthread_cond_broadcast(&ctx->calls_cond);
    return more;
}

int cfx_request_wait(struct cfx_request *req, int timeout_ms)
{
    cfx__err_clear();
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "cfx_request_wait: NULL request");
    if (!req->ctx) /* its context was destroyed: the status is final */
        return finished(req);
    if (cfx__ctx_forked(req->ctx)) /* nothing here would ever complete it */
        return forked_err("cfx_request_wait");
    struct cfx_context *ctx = req->ctx;
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    pthread_mutex_lock(&ctx->lock);
    while (req->status == CFX_ERR_AGAIN && counted_wait(ctx, req, deadline))
        ;
    int st = req->status == CFX_ERR_AGAIN ? CFX_ERR_AGAIN : finished(req);
    if (st == CFX_ERR_AGAIN)
        st = still_running(req, timeout_ms);
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

/* A running get's progress (ctx->lock held): its entry in the store is the
 * newest of its id, inserted after the request was submitted, and for host
 * memory it fills the caller's own buffer (another get of the id on this
 * node fills its own, copied out only at the end: nothing landed here yet).
 * Device memory lands in a host staging entry and goes on to the device as
 * its prefix grows (gpu_stage.c): its prefix is what is reported.  False
 * while no entry tells the size. */
static bool get_progress(struct cfx_context *ctx, struct cfx_request *req, uint64_t *done,
                         uint64_t *total)
{
    const struct cfx_obj *o = cfx__store_find(&ctx->store, &req->id);
    bool host = !(req->params.field_mask & CFX_OBJ_PARAM_MEMTYPE) ||
                req->params.memtype == CFX_MEMTYPE_HOST;

    if (o && !o->deleting && o->seq > req->seq0 && !o->p2p) {
        *total = o->size;
        *done = 0;
        if (!host || o->buf == req->buf)
            *done = CFX_MIN((uint64_t)o->ready_chunks * o->chunk_size, o->size);
        req->seen_done = *done;
        req->seen_total = *total;
        return true;
    }
    if (req->seen_total) {
        /* the entry left (a get that keeps no copy ends by releasing it)
         * before the worker set the status: what had landed stays landed */
        *done = req->seen_done;
        *total = req->seen_total;
        return true;
    }
    return false;
}

int cfx_request_progress(struct cfx_request *req, uint64_t *done, uint64_t *total)
{
    cfx__err_clear();
    if (!req || !done || !total)
        return cfx__err(CFX_ERR_INVALID, "cfx_request_progress: NULL argument");
    if (req->ctx && cfx__ctx_forked(req->ctx))
        return forked_err("cfx_request_progress");
    *done = 0;
    *total = 0;
    if (req->type != CFX_REQ_PUT && req->type != CFX_REQ_GET)
        return cfx__err(CFX_ERR_UNSUPPORTED,
                        "cfx_request_progress: a collective's request has no byte count");
    if (!req->ctx) { /* its context was destroyed: the status is final */
        if (req->status != CFX_OK)
            return cfx__err(req->status, "cfx_request_progress: the %s failed: %s",
                            req->type == CFX_REQ_PUT ? "put" : "get",
                            req->err[0] ? req->err : cfx_errname(req->status));
        *done = *total = req->size;
        return CFX_OK;
    }
    struct cfx_context *ctx = req->ctx;
    int rc = CFX_OK;
    pthread_mutex_lock(&ctx->lock);
    int st = req->status;
    if (st == CFX_OK) {
        *done = req->size;
        *total = req->size;
    } else if (st != CFX_ERR_AGAIN) {
        rc = cfx__err(st, "cfx_request_progress: the %s failed: %s",
                      req->type == CFX_REQ_PUT ? "put" : "get",
                      req->err[0] ? req->err : cfx_errname(st));
    } else if (req->type == CFX_REQ_PUT) {
        /* zero-copy: nothing moves before the directory knows the object,
         * and once it does the put is complete */
        *total = req->capacity;
    } else if (!get_progress(ctx, req, done, total)) {
        rc = cfx__err(CFX_ERR_AGAIN,
                      "cfx_request_progress: the get has no size yet (looking up a source)");
    }
    pthread_mutex_unlock(&ctx->lock);
    return rc;
}

size_t cfx_request_size(const struct cfx_request *req)
{
    return req ? req->size : 0;
}

void cfx_request_free(struct cfx_request *req)
{
    if (!req)
        return;
    if (!req->ctx) { /* its context was destroyed, which ended it */
        pthread_cond_destroy(&req->cond);
        free(req);
        return;
    }
    if (cfx__ctx_forked(req->ctx)) /* a forked child's copy goes with it */
        return;
    struct cfx_context *ctx = req->ctx;
    pthread_mutex_lock(&ctx->lock);
    if (req->status == CFX_ERR_AGAIN && !req->type) {
        /* a group's non-blocking collective (coll/group.c): canceled.  One
         * still queued never runs (its turn tells the other ranks, touching
         * neither buffer, and frees the request); the running one stops at
         * its next wait, and is waited for here, so that neither buffer is
         * touched once this returns.  Either way the others hear that this
         * rank canceled the call.  (It ran on, reading and writing buffers
         * the caller had freed.) */
        req->cancel = true;
        pthread_cond_broadcast(&ctx->obj_cond);
        if (!req->started) {
            req->freed_by_user = true;
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
        while (req->status == CFX_ERR_AGAIN)
            counted_wait(ctx, req, UINT64_MAX);
    }
    if (req->status == CFX_ERR_AGAIN && req->type && !req->started) {
        /* still queued behind other requests: it never runs */
        cfx_list_del(&req->link);
        ctx->nqueued--;
        cfx_list_del(&req->live);
        pthread_mutex_unlock(&ctx->lock);
        pthread_cond_destroy(&req->cond);
        free(req);
        return;
    }
    if (req->status == CFX_ERR_AGAIN && (req->type != CFX_REQ_GET || req->in_lookup)) {
        /* a put (it reads the buffer only until it returns, which the
         * caller's free of the buffer must wait for anyway: object.h), or
         * a get waiting for the directory: it runs on, or gives up when it
         * looks again, without writing the buffer; the worker frees the
         * request when done */
        req->cancel = req->type == CFX_REQ_GET;
        req->freed_by_user = true;
        pthread_mutex_unlock(&ctx->lock);
        return;
    }
    if (req->status == CFX_ERR_AGAIN) {
        /* a get that may be writing the caller's buffer (or about to):
         * canceled, and waited for, so that nothing lands there once this
         * returns.  Its waits wake on obj_cond and give up, withdrawing
         * the transfer, as at their deadline (bounded: no answer is
         * awaited).  One waiting for the directory is let go (above). */
        req->cancel = true;
        pthread_cond_broadcast(&ctx->obj_cond);
        while (req->status == CFX_ERR_AGAIN && !req->in_lookup)
            counted_wait(ctx, req, UINT64_MAX);
        if (req->status == CFX_ERR_AGAIN) {
            req->freed_by_user = true;
            pthread_mutex_unlock(&ctx->lock);
            return;
        }
    }
    cfx_list_del(&req->live);
    pthread_mutex_unlock(&ctx->lock);
    pthread_cond_destroy(&req->cond);
    free(req);
}

struct cfx_request *cfx__request_new(struct cfx_context *ctx)
{
    struct cfx_request *req = calloc(1, sizeof(*req));
    if (!req)
        return NULL;
    req->ctx = ctx;
    req->device = -1;
    cfx__status_set(&req->status, CFX_ERR_AGAIN);
    cfx__cond_init_mono(&req->cond);
    pthread_mutex_lock(&ctx->lock);
    cfx_list_add_tail(&req->live, &ctx->reqs);
    pthread_mutex_unlock(&ctx->lock);
    return req;
}

void cfx__request_complete(struct cfx_request *req, int status, size_t size)
{
    struct cfx_context *ctx = req->ctx;
    pthread_mutex_lock(&ctx->lock);
    complete_locked(req, status, size);
    pthread_mutex_unlock(&ctx->lock);
}

void cfx__request_detach_all(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    while (!cfx_list_empty(&ctx->reqs)) {
        struct cfx_request *req = cfx_list_entry(ctx->reqs.next, struct cfx_request, live);
        cfx_list_del(&req->live);
        if (req->status == CFX_ERR_AGAIN) { /* none should be left running: never hang */
            snprintf(req->err, sizeof(req->err), "the context of node %u was destroyed "
                     "before the request ended", ctx->node_id);
            cfx__status_set(&req->status, CFX_ERR_CANCELED);
            pthread_cond_broadcast(&req->cond);
        }
        req->ctx = NULL;
        if (req->freed_by_user) { /* nobody holds it any more */
            pthread_cond_destroy(&req->cond);
            free(req);
        }
    }
    /* waits begun before the destroy leave ctx->lock before it is freed */
    while (ctx->req_waiters)
        pthread_cond_wait(&ctx->calls_cond, &ctx->lock);
    pthread_mutex_unlock(&ctx->lock);
}

void cfx__worker_stop(struct cfx_context *ctx);
void cfx__worker_stop(struct cfx_context *ctx)
{
    /* the workers' own flag: the progress thread must keep running until
     * they are done (a worker may still be waiting on a transfer) */
    pthread_mutex_lock(&ctx->lock);
    ctx->workers_stop = true;
    pthread_cond_broadcast(&ctx->async_cond);
    int n = ctx->nworkers;
    pthread_mutex_unlock(&ctx->lock);
    for (int i = 0; i < n; i++)
        pthread_join(ctx->workers[i], NULL);
    pthread_mutex_lock(&ctx->lock);
    ctx->nworkers = 0;
    pthread_mutex_unlock(&ctx->lock);
}

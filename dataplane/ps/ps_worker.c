/*
 * Worker role: tensor registration, push / pull ops split into one request
 * per block, re-sending after a block moved, and the load measurements that
 * feed the scheduler.
 *
 * Every request carries the worker's clock for its tensor (the number of
 * pushes posted before it) so servers apply each push exactly once, in
 * order, and a min_version that encodes the consistency model:
 *   pull at clock t:         BSP t,      SSP max(0, t - s),      ASP 0
 *   push-pull of clock t:    BSP t + 1,  SSP max(0, t + 1 - s),  ASP 0
 *
 * Measurement.  For each server the worker accumulates the time during
 * which it had at least one request outstanding there (busy time) and the
 * payload bytes of the requests completed; busy / bytes is the service time
 * per byte this worker saw.  Because it counts busy periods, not single
 * latencies, it does not grow with the number of blocks the server holds;
 * what a period's last request waited at the server for other workers'
 * pushes (ps_hdr.held_ns) is left out of it (meter_end()).
 *
 * Device buffers (CFX_PS_PARAM_MEMTYPE): requests carry host bytes.  A
 * gradient is copied off the device into a host copy when the op is posted
 * (on the caller's stream, or a stream of the worker's ordered after the
 * legacy default stream), and a result lands in a host copy that goes on to
 * the device when the op completes, before the request says so.
 */
#include "ps_int.h"

#include "gpu/memtype.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h" /* the context's coordinator connection and address */

enum ps_op_kind {
    PS_OP_PUSH = PS_REQ_PUSH,
    PS_OP_PULL = PS_REQ_PULL,
    PS_OP_PUSHPULL = PS_REQ_PUSHPULL,
    PS_OP_INIT = PS_REQ_INIT,
    PS_OP_REGISTER = 16, /* control: send REGISTER to the scheduler */
    PS_OP_READY,         /* control: send READY */
    PS_OP_BYE,           /* control: say goodbye, complete on the answer */
};

struct cfx_ps_request {
    struct cfx_ps *ps;
    int status; /* CFX_ERR_AGAIN while running (ps->lock) */
    bool freed; /* freed by the user while running */
    bool cancel; /* freed while running: the loop cancels its op (ps->lock) */
    char err[240];
};

struct ps_op {
    struct cfx_list link; /* queue (ps->lock), then w->ops */
    struct cfx_ps_request *req;
    enum ps_op_kind kind;
    int tensor;
    const void *grad;
    void *out;
    uint64_t clock;
    uint64_t min_version;
    uint64_t lost_base;   /* the tensor's pushes given up on (ps_hdr.lost_base, lost_mask) */
    uint64_t lost_mask;
    struct ps_tensor reg; /* REGISTER */
    uint32_t nsub, ndone;
    int status;
    bool unknown;         /* a push's block ended with no answer (deadline, server lost):
                             it may have been applied there */
    bool canceled;        /* its request was freed: its subs went to the head of w->subs */
    char err[240];
    uint64_t deadline;
    void *hgrad;          /* device buffers: host copy of the gradient ... */
    void *hout;           /* ... and of the result, which goes on to dout */
    void *dout;
    size_t bytes;         /* of each */
    int device;           /* device buffers: the poster's current device, for dout's copy */
};

struct ps_sub {
    struct cfx_list link; /* w->subs */
    struct cfx_list id_link; /* w->by_id[req_id % PS_SUB_BUCKETS] */
    struct ps_op *op;
    uint32_t block;
    uint64_t req_id;
    uint32_t server;      /* sent to */
    uint32_t map_version; /* map it was routed with */
    bool waiting;         /* redirected: waits for need_version */
    uint32_t need_version;
    const void *pay;
    size_t len;
    void *out;
    size_t out_len;
    bool rx_live;         /* the reply's bytes are being received into out */
    /* the server said it holds the request for held_version, which lacks
     * the pushes of held_n workers, the first held_by (PS_MSG_WAITING) */
    uint32_t held_n, held_by;
    uint64_t held_version;
};

/* A reply whose header came before the op's deadline is taken in for this
 * much longer: its bytes are on the way into the caller's buffer (or the
 * op's host copy), so the op may not end before they land.  A server whose
 * reply is still not in then is failed, which withdraws the receive. */
#define PS_REPLY_GRACE_MS 2000
#define PS_FREE_WAIT_MS   30000 /* a freed request's cancel: replies' grace, payloads' drain */

/* Buckets of outstanding requests by id: a reply finds its request in
 * one (a step of small blocks has thousands out, answered by several
 * servers out of each other's order). */
#define PS_SUB_BUCKETS 1024

struct ps_worker {
    struct cfx_list queue; /* struct ps_op posted by API threads (ps->lock) */
    struct cfx_list ops;   /* running (loop) */
    struct cfx_list subs;  /* outstanding requests (loop), in the order their ops started */
    struct cfx_list by_id[PS_SUB_BUCKETS]; /* the same, by req_id */
    uint64_t next_req;
    uint64_t clock[PS_MAX_TENSORS]; /* pushes posted per tensor (ps->lock) */
    /* per tensor, bit i of unsure_mask: the push of step unsure_base + i
     * ended with no answer from some block (it may or may not have been
     * applied there).  Later requests say so (ps_hdr.lost_base, lost_mask)
     * until a push after it is answered by every block (ps->lock) */
    uint64_t unsure_base[PS_MAX_TENSORS];
    uint64_t unsure_mask[PS_MAX_TENSORS];
    /* measurement (loop) */
    uint32_t outstanding[PS_MAX_SERVERS];
    uint64_t busy_start[PS_MAX_SERVERS];
    uint64_t busy[PS_MAX_SERVERS];
    uint64_t bytes[PS_MAX_SERVERS];
    uint32_t reqs[PS_MAX_SERVERS];
    uint64_t last_report;
    uint32_t last_report_ver;
    /* servers whose mailbox failed here, and how (ps->lock): a tensor with
     * a block on one never gets ready (cfx_ps_register fails naming it) */
    bool srv_failed[PS_MAX_SERVERS];
    int srv_fail_status[PS_MAX_SERVERS];
    struct ps_op *bye; /* waiting for the scheduler's answer */
    bool bye_answered; /* the scheduler answered our goodbye */
    void *dev_stream;  /* device buffers without the caller's stream: ours (made on first use) */
};

int cfx__ps_worker_create(struct cfx_ps *ps)
{
    struct ps_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return CFX_ERR_NOMEM;
    cfx_list_init(&w->queue);
    cfx_list_init(&w->ops);
    cfx_list_init(&w->subs);
    for (size_t i = 0; i < PS_SUB_BUCKETS; i++)
        cfx_list_init(&w->by_id[i]);
    w->next_req = 1;
    w->last_report = cfx__now_ns();
    ps->w = w;
    return CFX_OK;
}

static void op_free(struct ps_op *op)
{
    free(op->hgrad);
    free(op->hout);
    free(op);
}

/* Copy between the caller's device buffer and a host copy, and wait: on
 * the caller's stream, else on the worker's own. */
static int dev_copy(struct cfx_ps *ps, void *dst, enum cfx_memtype dt, const void *src,
                    enum cfx_memtype st, size_t len)
{
    void *stream = ps->params.stream;
    int rc = stream ? CFX_OK
                    : cfx__memtype_stream_for(ps->params.memtype, &ps->w->dev_stream, &ps->lock,
                                              &stream);
    return rc == CFX_OK ? cfx__memcpy_typed_wait(dst, dt, src, st, len, stream) : rc;
}

/* A push ended (ps->lock held): one with a block that gave no answer joins
 * the tensor's unsure steps; one every block applied ends those before it
 * (each block has passed them, applied or counted empty).  The window is 64
 * steps: an unsure step that falls out of it is no longer said (its block
 * waits for it, as for a push still on the way). */
static void note_unsure(struct ps_worker *w, const struct ps_op *op)
{
    uint64_t *base = &w->unsure_base[op->tensor], *mask = &w->unsure_mask[op->tensor];
    uint64_t c = op->clock;
    if (op->status != CFX_OK && op->unknown) {
        if (!*mask) {
            *base = c;
        } else if (c < *base) {
            *mask = *base - c >= 64 ? 0 : *mask << (*base - c); /* the newest fall out */
            *base = c;
        } else if (c - *base >= 64) {
            uint64_t d = c - *base - 63; /* the oldest fall out */
            *mask = d >= 64 ? 0 : *mask >> d;
            *base += d;
        }
        *mask |= 1ull << (c - *base);
    } else if (op->status == CFX_OK && *mask && c >= *base) {
        uint64_t d = c - *base + 1;
        *mask = d >= 64 ? 0 : *mask >> d;
        *base += d;
    }
}

static void op_complete(struct cfx_ps *ps, struct ps_op *op)
{
    struct cfx_ps_request *r = op->req;
    if (op->status != CFX_OK && op->grad && op->bytes)
        cfx__ps_net_unborrow(ps, op->grad, op->bytes); /* the caller's again: sends copy it */
    if (op->dout && op->status == CFX_OK) {
        /* the result on to the device before anyone hears it is done, on
         * the device the poster had current (this thread's may be another) */
        op->status = cfx__memtype_set_device(ps->params.memtype, op->device);
        if (op->status == CFX_OK)
            op->status = dev_copy(ps, op->dout, ps->params.memtype, op->hout, CFX_MEMTYPE_HOST,
                                  op->bytes);
        if (op->status != CFX_OK)
            snprintf(op->err, sizeof(op->err), "job %s: result of tensor %d to the device: %s",
                     ps->job, op->tensor, cfx_last_error());
    }
    pthread_mutex_lock(&ps->lock);
    bool freed = r->freed;
    if ((op->kind == PS_OP_PUSH || op->kind == PS_OP_PUSHPULL) && op->tensor >= 0 &&
        op->tensor < PS_MAX_TENSORS)
        note_unsure(ps->w, op);
    if (op->status != CFX_OK && !op->unknown &&
        (op->kind == PS_OP_PUSH || op->kind == PS_OP_PUSHPULL) && op->tensor >= 0 &&
        op->tensor < PS_MAX_TENSORS && ps->w->clock[op->tensor] == op->clock + 1) {
        /* the step was refused by a server on some blocks (each answered:
         * not applied there) and no later push of the tensor was posted:
         * the next push sends this step again, which the blocks that
         * applied it take as a repeat, instead of a step after it that the
         * refusing blocks would hold back for ever.  A block that did not
         * answer may have applied it: then the step stays taken (a repeat
         * would be dropped there as a duplicate, its new gradient lost). */
        ps->w->clock[op->tensor] = op->clock;
    }
    memcpy(r->err, op->err, sizeof(r->err));
    /* last: once it reads final, the request is its owner's alone (it may
     * be waited for, tested or freed without the handle, which may be
     * gone: cfx_ps_destroy ends every request) */
    __atomic_store_n(&r->status, op->status, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&ps->cond);
    pthread_mutex_unlock(&ps->lock);
    if (freed) {
        free(r);
        cfx__ps_unref(ps); /* not the last: the handle's own is held here */
    }
    op_free(op);
}

static void op_fail(struct cfx_ps *ps, struct ps_op *op, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void op_fail(struct cfx_ps *ps, struct ps_op *op, int status, const char *fmt, ...)
{
    (void)ps;
    if (op->status != CFX_OK)
        return; /* keep the first failure */
    op->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->err, sizeof(op->err), fmt, ap);
    va_end(ap);
}

static void sub_free(struct ps_worker *w, struct ps_sub *s)
{
    (void)w;
    cfx_list_del(&s->link);
    cfx_list_del(&s->id_link);
    free(s);
}

/* One request finished: account it and complete its op when it was the last. */
static void sub_done(struct cfx_ps *ps, struct ps_sub *s)
{
    struct ps_op *op = s->op;
    sub_free(ps->w, s);
    if (++op->ndone == op->nsub) {
        cfx_list_del(&op->link);
        op_complete(ps, op);
    }
}

static void meter_start(struct ps_worker *w, uint32_t srv)
{
    if (srv >= PS_MAX_SERVERS)
        return;
    if (w->outstanding[srv]++ == 0)
        w->busy_start[srv] = cfx__now_ns();
}

/* A request to @p srv ended; @p held_ns of it it waited at the server for
 * other workers' pushes.  A busy period ends with the last request out:
 * what that one waited there (the round's other pushes, the workers' skew)
 * is not the server's work, and on a server of a small share it would be
 * most of the period, so it is left out. */
static void meter_end(struct ps_worker *w, uint32_t srv, uint64_t bytes, uint64_t held_ns)
{
    if (srv >= PS_MAX_SERVERS || !w->outstanding[srv])
        return;
    w->bytes[srv] += bytes;
    w->reqs[srv]++;
    if (--w->outstanding[srv] == 0) {
        uint64_t period = cfx__now_ns() - w->busy_start[srv];
        w->busy[srv] += period - CFX_MIN(held_ns, period);
    }
}

static const char *tensor_name(const struct cfx_ps *ps, int t)
{
    return t >= 0 && (uint32_t)t < ps->map.ntensors ? ps->map.tensors[t].name : "?";
}

static void report(struct cfx_ps *ps, bool force);

static void send_sub(struct cfx_ps *ps, struct ps_sub *s)
{
    struct ps_worker *w = ps->w;
    struct ps_op *op = s->op;
    s->held_n = 0; /* what a server said it waits for is that server's */
    if (s->block >= ps->map.nblocks) {
        op_fail(ps, op, CFX_ERR_INVALID, "block %u is not in shard map %u", s->block,
                ps->map.version);
        sub_done(ps, s);
        return;
    }
    uint32_t srv = ps->map.owner[s->block];
    struct ps_peer *p = srv < PS_MAX_SERVERS ? ps->servers[srv] : NULL;
    if (!p || p->closed) {
        op_fail(ps, op, CFX_ERR_PEER_FAILED,
                "tensor %s block %u: server %u (node %u, map %u) is not reachable",
                tensor_name(ps, op->tensor), s->block, srv,
                srv < ps->map.nservers ? ps->map.server[srv].node_id : 0, ps->map.version);
        sub_done(ps, s);
        return;
    }
    struct ps_hdr h = {
        .type = PS_MSG_REQ,
        .kind = (uint16_t)op->kind,
        .worker = (uint32_t)ps->index,
        .block = s->block,
        .req_id = s->req_id,
        .clock = op->clock,
        .min_version = op->min_version,
        .lost_base = op->lost_base,
        .lost_mask = op->lost_mask,
    };
    s->server = srv;
    s->map_version = ps->map.version;
    s->waiting = false;
    meter_start(w, srv);
    if (cfx__ps_send(ps, p, &h, s->pay, s->len, NULL) != CFX_OK) {
        meter_end(w, srv, 0, 0);
        op_fail(ps, op, CFX_ERR_PEER_FAILED,
                "tensor %s block %u: cannot send to server %u "
                "(node %u)",
                tensor_name(ps, op->tensor), s->block, srv, p->rec.node_id);
        sub_done(ps, s);
    }
}

static void start_op(struct cfx_ps *ps, struct ps_op *op)
{
    struct ps_worker *w = ps->w;
    cfx_list_add_tail(&op->link, &w->ops);
    if (op->kind == PS_OP_BYE) {
        /* the last report, then goodbye; the scheduler answers so we know it
         * arrived before our context goes away */
        report(ps, true);
        struct ps_peer *sch = ps->servers[0];
        struct ps_hdr h = { .type = PS_MSG_BYE };
        if (!sch || sch->closed || cfx__ps_send(ps, sch, &h, NULL, 0, NULL) != CFX_OK) {
            op_fail(ps, op, CFX_ERR_PEER_FAILED, "cannot reach the scheduler (server 0, node %u)",
                    sch ? sch->rec.node_id : 0);
            cfx_list_del(&op->link);
            op_complete(ps, op);
            return;
        }
        op->deadline = cfx__deadline_ns(CFX_MIN(ps->timeout_ms, 5000));
        if (ps->bye_dl && ps->bye_dl < op->deadline)
            op->deadline = ps->bye_dl;
        w->bye = op;
        return;
    }
    if (op->kind == PS_OP_REGISTER || op->kind == PS_OP_READY) {
        struct ps_peer *sch = ps->servers[0];
        struct ps_hdr h = { .type = op->kind == PS_OP_REGISTER ? PS_MSG_REGISTER : PS_MSG_READY,
                            .block = (uint32_t)op->tensor };
        int rc = CFX_ERR_PEER_FAILED;
        if (sch && !sch->closed) {
            void *copy = NULL;
            if (op->kind == PS_OP_REGISTER && (copy = malloc(sizeof(op->reg))))
                memcpy(copy, &op->reg, sizeof(op->reg));
            rc = cfx__ps_send(ps, sch, &h, copy, copy ? sizeof(op->reg) : 0, copy);
        }
        if (rc != CFX_OK)
            op_fail(ps, op, rc, "cannot reach the scheduler (server 0)");
        cfx_list_del(&op->link);
        op_complete(ps, op);
        return;
    }
    const struct ps_tensor *t = &ps->map.tensors[op->tensor];
    size_t esz = cfx_dtype_size((enum cfx_dtype)t->dtype);
    op->nsub = t->nblocks;
    op->deadline = cfx__deadline_ns(ps->timeout_ms);
    struct cfx_list *first = w->subs.prev; /* this op's subs follow it */
    for (uint32_t i = 0; i < t->nblocks; i++) {
        struct ps_sub *s = calloc(1, sizeof(*s));
        if (!s) {
            op_fail(ps, op, CFX_ERR_NOMEM, "out of memory");
            op->nsub = i;
            break;
        }
        uint64_t off = (uint64_t)i * t->block_elems;
        uint64_t n = CFX_MIN(t->block_elems, t->count - off);
        s->op = op;
        s->block = t->first_block + i;
        s->req_id = w->next_req++;
        if (op->kind != PS_OP_PULL) {
            s->pay = (const uint8_t *)op->grad + off * esz;
            s->len = n * esz;
        }
        if (op->kind == PS_OP_PULL || op->kind == PS_OP_PUSHPULL) {
            s->out = (uint8_t *)op->out + off * esz;
            s->out_len = n * esz;
        }
        cfx_list_add_tail(&s->link, &w->subs);
        cfx_list_add_tail(&s->id_link, &w->by_id[s->req_id % PS_SUB_BUCKETS]);
    }
    if (op->nsub == 0) {
        cfx_list_del(&op->link);
        op_complete(ps, op);
        return;
    }
    /* send after queueing all: send_sub may complete the op */
    struct cfx_list *pos, *tmp;
    uint32_t left = op->nsub;
    for (pos = first->next, tmp = pos->next; pos != &w->subs; pos = tmp, tmp = pos->next)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        if (s->op != op || s->map_version)
            continue;
        bool last = --left == 0;
        send_sub(ps, s);
        if (last)
            break;
    }
}

static struct ps_sub *find_sub(struct ps_worker *w, uint64_t req_id)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &w->by_id[req_id % PS_SUB_BUCKETS])
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, id_link);
        if (s->req_id == req_id)
            return s;
    }
    return NULL;
}

void *cfx__ps_worker_reply_buf(struct cfx_ps *ps, const struct ps_hdr *h)
{
    if (!ps->w || h->status != CFX_OK)
        return NULL;
    struct ps_sub *s = find_sub(ps->w, h->req_id);
    if (!s || !s->out || s->out_len != h->len)
        return NULL;
    s->rx_live = true;
    return s->out;
}

void cfx__ps_worker_handle(struct cfx_ps *ps, const struct ps_hdr *h, void *payload, bool owned)
{
    struct ps_worker *w = ps->w;
    if (h->type == PS_MSG_BYE) {
        w->bye_answered = true;
        if (w->bye) {
            cfx_list_del(&w->bye->link);
            op_complete(ps, w->bye);
            w->bye = NULL;
        }
        if (owned)
            free(payload);
        return;
    }
    struct ps_sub *s = find_sub(w, h->req_id);
    if (!s) {
        if (owned)
            free(payload);
        return; /* its op failed or was canceled */
    }
    struct ps_op *op = s->op;
    uint32_t from = h->from & 0xffff;
    if (h->type == PS_MSG_WAITING) {
        /* a peer's numbers: kept only as they can name a worker of ours */
        if (h->forwarded && h->clock < PS_MAX_WORKERS) {
            s->held_n = h->forwarded;
            s->held_by = (uint32_t)h->clock;
            s->held_version = h->min_version;
        }
        if (owned)
            free(payload);
        return;
    }
    if (h->type == PS_MSG_REDIRECT) {
        meter_end(w, s->server, 0, 0);
        s->waiting = true;
        s->need_version = h->map_version;
        ps->stats.redirects++;
        if (ps->map.version < s->need_version)
            cfx__ps_map_fetch(ps, s->need_version); /* re-sends every waiting request */
        else
            send_sub(ps, s);
        return;
    }
    meter_end(w, s->server, s->len + h->len, h->held_ns);
    /* the header is the peer's: an index past our table, or a status that
     * is no failure (CFX_ERR_AGAIN reads as "still running"), is its error */
    const struct ps_peer *fp = from < PS_MAX_SERVERS ? ps->servers[from] : NULL;
    if (h->status != CFX_OK) {
        int st = h->status < 0 && h->status > CFX_STATUS_LAST && h->status != CFX_ERR_AGAIN
                     ? h->status
                     : CFX_ERR_PROTO;
        /* a block whose hand-over did not come: the server it was to come
         * from is the one to name */
        uint32_t was = h->forwarded && h->forwarded <= PS_MAX_SERVERS ? h->forwarded - 1
                                                                      : UINT32_MAX;
        const struct ps_peer *wp = was < PS_MAX_SERVERS ? ps->servers[was] : NULL;
        /* a round (or version) that waited for a worker that is gone */
        uint64_t gone = h->min_version;
        char src[200] = "";
        /* the map says it failed: its values went with it (no replication) */
        bool failed = was < ps->map.nservers &&
                      ps->map.server[was].state == CFX_PS_SERVER_FAILED;
        if (was != UINT32_MAX && failed && st == CFX_ERR_PEER_FAILED)
            snprintf(src, sizeof(src), "; its state was to come from server %u (node %u), its "
                     "owner before, which failed: the block's values were lost with it", was,
                     ps->map.server[was].node_id);
        else if (was != UINT32_MAX)
            snprintf(src, sizeof(src), "; it was to come from server %u (node %u), its owner "
                     "before, which %s", was, wp ? wp->rec.node_id : 0,
                     st == CFX_ERR_PEER_FAILED ? "went before handing it over"
                                               : "has not handed it over");
        else if (gone && gone <= ps->map.nworkers && gone <= PS_MAX_WORKERS)
            snprintf(src, sizeof(src), ": the step waited for worker %u (node %u), which is "
                     "gone with no goodbye: its push never comes", (unsigned)(gone - 1),
                     ps->map.worker_node[gone - 1]);
        op_fail(ps, op, st, "tensor %s block %u: server %u (node %u) answered %s%s",
                tensor_name(ps, op->tensor), s->block, from, fp ? fp->rec.node_id : 0,
                st == h->status ? cfx_strerror(st) : "a status that is none", src);
    } else if (s->out && payload != s->out) {
        if (h->len == s->out_len)
            memcpy(s->out, payload, h->len);
        else
            op_fail(ps, op, CFX_ERR_PROTO,
                    "tensor %s block %u: server %u sent %" PRIu64 " bytes, expected %zu",
                    tensor_name(ps, op->tensor), s->block, from, h->len, s->out_len);
    }
    if (owned)
        free(payload);
    sub_done(ps, s);
}

void cfx__ps_worker_map_changed(struct cfx_ps *ps)
{
    struct ps_worker *w = ps->w;
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &w->subs)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        if (s->waiting && ps->map.version >= s->need_version)
            send_sub(ps, s);
    }
}

/* A server's mailbox failed: its outstanding requests fail. */
void cfx__ps_worker_server_failed(struct cfx_ps *ps, uint32_t srv, int status)
{
    struct ps_worker *w = ps->w;
    struct cfx_list *pos, *tmp;
    if (srv < PS_MAX_SERVERS) {
        pthread_mutex_lock(&ps->lock);
        w->srv_failed[srv] = true;
        w->srv_fail_status[srv] = status;
        pthread_cond_broadcast(&ps->cond); /* a register waiting for its tensor */
        pthread_mutex_unlock(&ps->lock);
    }
    cfx_list_for_each_safe(pos, tmp, &w->subs)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        if (s->waiting || s->server != srv || !s->map_version)
            continue;
        meter_end(w, srv, 0, 0);
        /* a server that goes after the scheduler was lost ends because of
         * it: name the cause (the caller waits on the scheduler's node) */
        pthread_mutex_lock(&ps->lock);
        int lost = ps->lost_status;
        char why[sizeof(ps->lost_why)];
        memcpy(why, ps->lost_why, sizeof(why));
        pthread_mutex_unlock(&ps->lock);
        if (lost == CFX_ERR_PEER_FAILED && srv != 0)
            op_fail(ps, s->op, lost, "%s (server %u, node %u, went too)", why, srv,
                    ps->servers[srv] ? ps->servers[srv]->rec.node_id : 0);
        else
            /* whatever broke the mailbox (closed, reset, a connect that
             * failed to a server that went): the server failed, as
             * docs/PARAMETER_SERVER.md says; its reason is in the text */
            op_fail(ps, s->op, CFX_ERR_PEER_FAILED, "tensor %s block %u: server %u (node %u) "
                    "failed: %s", tensor_name(ps, s->op->tensor), s->block, srv,
                    ps->servers[srv] ? ps->servers[srv]->rec.node_id : 0, cfx_strerror(status));
        s->op->unknown = true; /* it may have applied the push before it went */
        sub_done(ps, s);
    }
}

static void report(struct cfx_ps *ps, bool force)
{
    struct ps_worker *w = ps->w;
    uint64_t now = cfx__now_ns();
    if (!force && now - w->last_report < (uint64_t)ps->params.balance.report_ms * 1000000ull)
        return;
    struct ps_peer *sch = ps->servers[0];
    if (!sch || sch->closed)
        return;
    uint32_t oldest = ps->map.version;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &w->subs)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        if (s->map_version && s->map_version < oldest)
            oldest = s->map_version;
    }
    struct ps_report_ent ent[PS_MAX_SERVERS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < ps->map.nservers && i < PS_MAX_SERVERS; i++) {
        if (w->outstanding[i]) {
            w->busy[i] += now - w->busy_start[i];
            w->busy_start[i] = now;
        }
        if (!w->bytes[i])
            continue;
        ent[n++] = (struct ps_report_ent){
            .server = i, .requests = w->reqs[i], .busy_ns = w->busy[i], .bytes = w->bytes[i]
        };
        w->busy[i] = w->bytes[i] = 0;
        w->reqs[i] = 0;
    }
    w->last_report = now;
    if (!n && oldest == w->last_report_ver)
        return;
    w->last_report_ver = oldest;
    void *buf = n ? malloc(n * sizeof(ent[0])) : NULL;
    if (n && !buf)
        return;
    if (n)
        memcpy(buf, ent, n * sizeof(ent[0]));
    struct ps_hdr h = { .type = PS_MSG_REPORT, .clock = oldest };
    cfx__ps_send(ps, sch, &h, buf, n * sizeof(ent[0]), buf);
}

/*
 * Requests freed while their ops ran (cfx_ps_request_free): each op's subs
 * go to the head of w->subs with the op due now, so the deadline walk below
 * ends them as a deadline would (the walk's order holds: whatever is not
 * due yet stays behind everything that is, in start order): a
 * reply already landing in the op's buffer gets its grace, and the op's
 * payloads still on their way are copied off the caller's gradient as it
 * completes (op_complete).  The walk of every op and sub is the rare
 * path's.
 */
static int cancel_ops(struct cfx_ps *ps)
{
    struct ps_worker *w = ps->w;
    int n = 0;
    __atomic_store_n(&ps->cancels, 0, __ATOMIC_RELEASE);
    struct cfx_list *pos, *tmp, *opos;
    cfx_list_for_each(opos, &w->ops)
    {
        struct ps_op *op = cfx_list_entry(opos, struct ps_op, link);
        if (op->canceled || !op->req || !__atomic_load_n(&op->req->cancel, __ATOMIC_ACQUIRE))
            continue;
        op->canceled = true;
        op->deadline = cfx__now_ns(); /* due now; a reply landing gets its grace from now */
        struct cfx_list head;
        cfx_list_init(&head);
        cfx_list_for_each_safe(pos, tmp, &w->subs)
        {
            struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
            if (s->op != op)
                continue;
            cfx_list_del(&s->link);
            cfx_list_add_tail(&s->link, &head);
        }
        if (!cfx_list_empty(&head)) {
            head.prev->next = w->subs.next; /* the op's subs, in order, before the rest */
            w->subs.next->prev = head.prev;
            w->subs.next = head.next;
            head.next->prev = &w->subs;
        }
        n++;
    }
    return n;
}

int cfx__ps_worker_tick(struct cfx_ps *ps)
{
    struct ps_worker *w = ps->w;
    int n = 0;
    /* new ops */
    pthread_mutex_lock(&ps->lock);
    struct cfx_list todo;
    cfx_list_init(&todo);
    if (!cfx_list_empty(&w->queue)) {
        todo = w->queue;
        todo.next->prev = &todo;
        todo.prev->next = &todo;
        cfx_list_init(&w->queue);
    }
    pthread_mutex_unlock(&ps->lock);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &todo)
    {
        struct ps_op *op = cfx_list_entry(pos, struct ps_op, link);
        cfx_list_del(pos);
        if (__atomic_load_n(&op->req->cancel, __ATOMIC_ACQUIRE)) {
            op_fail(ps, op, CFX_ERR_CANCELED, "job %s: the request was freed before it ran",
                    ps->job);
            op_complete(ps, op);
        } else {
            start_op(ps, op);
        }
        n++;
    }
    if (__atomic_load_n(&ps->cancels, __ATOMIC_ACQUIRE))
        n += cancel_ops(ps);
    /* the coordinator gone for the job's timeout ends every request now;
     * one gone for less names it in a request that runs out of time */
    pthread_mutex_lock(&ps->lock);
    cfx__ps_check_coord(ps);
    bool lost = ps->lost_status == CFX_ERR_CONNECT;
    char why[sizeof(ps->lost_why)];
    memcpy(why, ps->lost_why, sizeof(why));
    pthread_mutex_unlock(&ps->lock);
    uint64_t cgone = lost ? 0 : cfx__ctl_lost_ms(ps->ctx->ctl);
    /* deadlines: w->subs is in the order ops started, each op's deadline
     * its start plus the one timeout, so the first sub not due ends the
     * walk (a tick costs what is due, not what is in flight) */
    uint64_t now = cfx__now_ns();
again:
    cfx_list_for_each_safe(pos, tmp, &w->subs)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        if (!lost && now < s->op->deadline)
            break;
        struct ps_peer *p = s->server < PS_MAX_SERVERS ? ps->servers[s->server] : NULL;
        if (s->rx_live && p && !p->closed) {
            /* its reply is landing in the op's buffer: wait for it, or
             * withdraw the receive with the server's mailbox */
            if (now < s->op->deadline + PS_REPLY_GRACE_MS * 1000000ull)
                continue;
            op_fail(ps, s->op, CFX_ERR_TIMEOUT,
                    "tensor %s block %u: the reply of server %u (node %u) was still "
                    "arriving %d ms after the deadline (%d ms)",
                    tensor_name(ps, s->op->tensor), s->block, s->server, p->rec.node_id,
                    PS_REPLY_GRACE_MS, ps->timeout_ms);
            cfx__ps_peer_failed(ps, p, CFX_ERR_TIMEOUT); /* ends s and the server's others */
            n++;
            goto again;
        }
        if (s->op->canceled)
            op_fail(ps, s->op, CFX_ERR_CANCELED,
                    "job %s: the request was freed while it ran (tensor %s block %u had no "
                    "answer yet)", ps->job, tensor_name(ps, s->op->tensor), s->block);
        else if (lost)
            op_fail(ps, s->op, CFX_ERR_CONNECT, "%s", why);
        else if (cgone)
            op_fail(ps, s->op, CFX_ERR_CONNECT,
                    "tensor %s block %u: no answer within %d ms while the coordinator %s "
                    "has been unreachable for %llu ms",
                    tensor_name(ps, s->op->tensor), s->block, ps->timeout_ms,
                    ps->ctx->cfg.coord, (unsigned long long)cgone);
        else if (s->waiting)
            op_fail(ps, s->op, CFX_ERR_TIMEOUT,
                    "tensor %s block %u: shard map %u (where it "
                    "moved) did not arrive within %d ms",
                    tensor_name(ps, s->op->tensor), s->block, s->need_version, ps->timeout_ms);
        else if (s->held_n)
            op_fail(ps, s->op, CFX_ERR_TIMEOUT,
                    "tensor %s block %u: no answer within %d ms: server %u (node %u) holds "
                    "the request until every worker has pushed the step before version %llu, "
                    "and worker %u%s has not%s",
                    tensor_name(ps, s->op->tensor), s->block, ps->timeout_ms, s->server,
                    p ? p->rec.node_id : 0, (unsigned long long)s->held_version, s->held_by,
                    s->held_n > 1 ? " and others" : "",
                    s->held_by == (uint32_t)ps->index ? " (this worker: an earlier push of "
                                                        "it did not arrive)" : "");
        else
            op_fail(ps, s->op, CFX_ERR_TIMEOUT,
                    "tensor %s block %u: no answer from server %u "
                    "(node %u) within %d ms",
                    tensor_name(ps, s->op->tensor), s->block, s->server, p ? p->rec.node_id : 0,
                    ps->timeout_ms);
        if (!s->waiting)
            meter_end(w, s->server, 0, 0);
        s->op->unknown |= !s->waiting; /* sent, and no answer */
        sub_done(ps, s);
        n++;
    }
    if (w->bye && now >= w->bye->deadline) {
        op_fail(ps, w->bye, CFX_ERR_TIMEOUT,
                "the scheduler (server 0) did not acknowledge our "
                "goodbye");
        cfx_list_del(&w->bye->link);
        op_complete(ps, w->bye);
        w->bye = NULL;
        n++;
    }
    if (!w->bye)
        report(ps, false);
    return n;
}

void cfx__ps_worker_bye(struct cfx_ps *ps)
{
    struct ps_worker *w = ps->w;
    if (w->bye) {
        op_fail(ps, w->bye, CFX_ERR_CANCELED, "the handle was destroyed");
        cfx_list_del(&w->bye->link);
        op_complete(ps, w->bye);
        w->bye = NULL;
    }
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &w->subs)
    {
        struct ps_sub *s = cfx_list_entry(pos, struct ps_sub, link);
        op_fail(ps, s->op, CFX_ERR_CANCELED, "the handle was destroyed");
        sub_done(ps, s);
    }
    pthread_mutex_lock(&ps->lock);
    struct cfx_list todo = w->queue;
    bool any = !cfx_list_empty(&w->queue);
    cfx_list_init(&w->queue);
    pthread_mutex_unlock(&ps->lock);
    if (any) {
        todo.next->prev = &todo;
        todo.prev->next = &todo;
        cfx_list_for_each_safe(pos, tmp, &todo)
        {
            struct ps_op *op = cfx_list_entry(pos, struct ps_op, link);
            cfx_list_del(pos);
            op_fail(ps, op, CFX_ERR_CANCELED, "the handle was destroyed");
            op_complete(ps, op);
        }
    }
}

void cfx__ps_worker_free(struct cfx_ps *ps)
{
    if (ps->w)
        cfx__memtype_stream_destroy(ps->params.memtype, ps->w->dev_stream);
    free(ps->w);
    ps->w = NULL;
}

/* ---- API ------------------------------------------------------------------------------ */

static int post(struct cfx_ps *ps, struct ps_op *op, struct cfx_ps_request **out)
{
    struct cfx_ps_request *r = calloc(1, sizeof(*r));
    if (!r) {
        op_free(op);
        return cfx__err(CFX_ERR_NOMEM, "job %s: out of memory", ps->job);
    }
    r->ps = ps;
    __atomic_add_fetch(&ps->refs, 1, __ATOMIC_RELAXED); /* dropped when r is freed */
    r->status = CFX_ERR_AGAIN;
    op->req = r;
    op->status = CFX_OK;
    pthread_mutex_lock(&ps->lock);
    cfx_list_add_tail(&op->link, &ps->w->queue);
    pthread_mutex_unlock(&ps->lock);
    cfx__ps_kick(ps);
    *out = r;
    return CFX_OK;
}

/* Device buffers: the gradient off the device now, a host copy for the
 * result (op_complete() moves it on). */
static int stage_op(struct cfx_ps *ps, struct ps_op *op)
{
    const enum cfx_memtype mt = ps->params.memtype;
    int rc = cfx__memtype_device(mt, &op->device);
    if (rc == CFX_OK && op->grad) {
        op->hgrad = malloc(op->bytes ? op->bytes : 1);
        rc = op->hgrad ? dev_copy(ps, op->hgrad, CFX_MEMTYPE_HOST, op->grad, mt, op->bytes)
                       : CFX_ERR_NOMEM;
        op->grad = op->hgrad;
    }
    if (rc == CFX_OK && op->out) {
        op->hout = malloc(op->bytes ? op->bytes : 1);
        rc = op->hout ? CFX_OK : CFX_ERR_NOMEM;
        op->dout = op->out;
        op->out = op->hout;
    }
    if (rc != CFX_OK) {
        char why[200];
        snprintf(why, sizeof(why), "%s", rc == CFX_ERR_NOMEM ? "out of memory" : cfx_last_error());
        return cfx__err(rc, "job %s: tensor %d: device buffer staging: %s", ps->job, op->tensor,
                        why);
    }
    return CFX_OK;
}

static int post_data_op(struct cfx_ps *ps, enum ps_op_kind kind, int key, const void *grad,
                        void *out, struct cfx_ps_request **req)
{
    cfx__err_clear();
    if (!ps || ps->role != CFX_PS_WORKER)
        return cfx__err(CFX_ERR_INVALID, "ps: not a worker handle");
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "job %s: NULL request pointer", ps->job);
    if (cfx__ps_forked(ps))
        return cfx__err(CFX_ERR_INVALID, "job %s: the handle was created before this process "
                        "forked: a child creates its own", ps->job);
    if ((kind != PS_OP_PULL && !grad) || (kind != PS_OP_PUSH && kind != PS_OP_INIT && !out))
        return cfx__err(CFX_ERR_INVALID, "ps: NULL buffer");
    int gone = cfx__ps_gone(ps);
    if (gone != CFX_OK)
        return gone;
    struct ps_op *op = calloc(1, sizeof(*op));
    if (!op)
        return cfx__err(CFX_ERR_NOMEM, "ps: out of memory");
    op->kind = kind;
    op->tensor = key;
    op->grad = grad;
    op->out = out;
    pthread_mutex_lock(&ps->lock);
    cfx__ps_check_coord(ps);
    if (ps->lost_status == CFX_ERR_CONNECT) {
        int rc = cfx__ps_lost_err(ps);
        pthread_mutex_unlock(&ps->lock);
        free(op);
        return rc;
    }
    if (key < 0 || (uint32_t)key >= ps->map.ntensors ||
        (kind != PS_OP_INIT && !ps->map.tensors[key].ready)) {
        pthread_mutex_unlock(&ps->lock);
        free(op);
        return cfx__err(CFX_ERR_INVALID, "job %s: no registered tensor with key %d", ps->job, key);
    }
    op->bytes = (size_t)ps->map.tensors[key].count *
                cfx_dtype_size((enum cfx_dtype)ps->map.tensors[key].dtype);
    pthread_mutex_unlock(&ps->lock);
    /* staged before the clock moves: a failure leaves no push half posted */
    if (ps->params.memtype != CFX_MEMTYPE_HOST && kind != PS_OP_INIT) {
        int rc = stage_op(ps, op);
        if (rc != CFX_OK) {
            op_free(op);
            return rc;
        }
    }
    pthread_mutex_lock(&ps->lock);
    uint64_t t = ps->w->clock[key];
    uint64_t s = ps->map.conf.staleness;
    enum cfx_ps_consistency c = ps->map.conf.consistency;
    if (kind == PS_OP_PUSH || kind == PS_OP_PUSHPULL)
        ps->w->clock[key]++;
    if (kind != PS_OP_INIT) {
        op->lost_base = ps->w->unsure_base[key];
        op->lost_mask = ps->w->unsure_mask[key];
    }
    op->clock = t;
    uint64_t want = kind == PS_OP_PUSHPULL ? t + 1 : t;
    op->min_version = c == CFX_PS_BSP ? want : c == CFX_PS_SSP ? (want > s ? want - s : 0) : 0;
    pthread_mutex_unlock(&ps->lock);
    return post(ps, op, req);
}

int cfx_ps_ipush(struct cfx_ps *ps, int key, const void *grad, struct cfx_ps_request **req)
{
    return post_data_op(ps, PS_OP_PUSH, key, grad, NULL, req);
}

int cfx_ps_ipull(struct cfx_ps *ps, int key, void *out, struct cfx_ps_request **req)
{
    return post_data_op(ps, PS_OP_PULL, key, NULL, out, req);
}

int cfx_ps_ipushpull(struct cfx_ps *ps, int key, const void *grad, void *out,
                     struct cfx_ps_request **req)
{
    return post_data_op(ps, PS_OP_PUSHPULL, key, grad, out, req);
}

int cfx_ps_test(struct cfx_ps_request *req)
{
    cfx__err_clear();
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "ps: NULL request");
    int st = __atomic_load_n(&req->status, __ATOMIC_ACQUIRE);
    if (st != CFX_OK && st != CFX_ERR_AGAIN)
        cfx__err(st, "%s", req->err);
    return st;
}

int cfx_ps_wait(struct cfx_ps_request *req, int timeout_ms)
{
    cfx__err_clear();
    if (!req)
        return cfx__err(CFX_ERR_INVALID, "ps: NULL request");
    struct cfx_ps *ps = req->ps;
    int st = __atomic_load_n(&req->status, __ATOMIC_ACQUIRE);
    if (st != CFX_ERR_AGAIN) /* ended: the handle is not touched (it may be gone) */
        return st == CFX_OK ? CFX_OK : cfx__err(st, "%s", req->err);
    uint64_t dl = cfx__deadline_ns(timeout_ms);
    pthread_mutex_lock(&ps->lock);
    while (req->status == CFX_ERR_AGAIN && cfx__cond_wait_until(&ps->cond, &ps->lock, dl))
        ;
    st = req->status;
    pthread_mutex_unlock(&ps->lock);
    if (st == CFX_ERR_AGAIN)
        return cfx__err(CFX_ERR_TIMEOUT, "job %s: request still running after %d ms", ps->job,
                        timeout_ms);
    if (st != CFX_OK)
        return cfx__err(st, "%s", req->err);
    return CFX_OK;
}

void cfx_ps_request_free(struct cfx_ps_request *req)
{
    if (!req)
        return;
    struct cfx_ps *ps = req->ps;
    if (__atomic_load_n(&req->status, __ATOMIC_ACQUIRE) != CFX_ERR_AGAIN) {
        free(req); /* ended: nothing of the handle's refers to it */
        cfx__ps_unref(ps);
        return;
    }
    /* running: the loop cancels it (cancel_ops), and the free returns once
     * its buffers are the caller's again */
    pthread_mutex_lock(&ps->lock);
    if (req->status == CFX_ERR_AGAIN) {
        __atomic_store_n(&req->cancel, true, __ATOMIC_RELEASE);
        __atomic_add_fetch(&ps->cancels, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&ps->lock);
        cfx__ps_kick(ps);
        uint64_t dl = cfx__deadline_ns(PS_FREE_WAIT_MS);
        pthread_mutex_lock(&ps->lock);
        while (req->status == CFX_ERR_AGAIN && cfx__cond_wait_until(&ps->cond, &ps->lock, dl))
            ;
    }
    bool running = req->status == CFX_ERR_AGAIN;
    req->freed = running; /* still: it frees itself when it ends (op_complete) */
    pthread_mutex_unlock(&ps->lock);
    if (running)
        CFX_LOG(WARN, PS, "job %s: a request freed while it ran had not ended %d ms later: "
                "it ends in the background", ps->job, PS_FREE_WAIT_MS);
    else {
        free(req);
        cfx__ps_unref(ps);
    }
}

/* Complete a request just posted (@p rc is the posting's status; *@p reqp is
 * read after it, which is why it comes by address). */
static int run(struct cfx_ps *ps, int rc, struct cfx_ps_request **reqp)
{
    if (rc != CFX_OK)
        return rc;
    struct cfx_ps_request *req = *reqp;
    rc = cfx_ps_wait(req, -1);
    char err[256];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    cfx_ps_request_free(req);
    if (rc != CFX_OK)
        cfx__err(rc, "%s", err);
    (void)ps;
    return rc;
}

int cfx_ps_push(struct cfx_ps *ps, int key, const void *grad)
{
    struct cfx_ps_request *r = NULL;
    return run(ps, cfx_ps_ipush(ps, key, grad, &r), &r);
}

int cfx_ps_pull(struct cfx_ps *ps, int key, void *out)
{
    struct cfx_ps_request *r = NULL;
    return run(ps, cfx_ps_ipull(ps, key, out, &r), &r);
}

int cfx_ps_pushpull(struct cfx_ps *ps, int key, const void *grad, void *out)
{
    struct cfx_ps_request *r = NULL;
    return run(ps, cfx_ps_ipushpull(ps, key, grad, out, &r), &r);
}

bool cfx__ps_worker_said_bye(const struct cfx_ps *ps)
{
    return ps->w && ps->w->bye_answered;
}

/* Wait (ps->lock held) until @p pred holds for the map, the deadline, or
 * the scheduler is lost (ps->lost_status). */
static bool wait_map(struct cfx_ps *ps, uint64_t dl, bool (*pred)(struct cfx_ps *, const void *),
                     const void *arg)
{
    while (!pred(ps, arg) && !ps->lost_status)
        if (!cfx__cond_wait_until(&ps->cond, &ps->lock, dl)) {
            cfx__ps_check_coord(ps); /* the loop thread may be behind */
            return false;
        }
    return pred(ps, arg);
}

/* A map wait that ran out of time while the coordinator (through whose
 * directory the maps come) is unreachable: CFX_ERR_CONNECT naming it. */
static int map_wait_err(struct cfx_ps *ps, const char *name, const char *what)
{
    uint64_t gone = cfx__ctl_lost_ms(ps->ctx->ctl);
    if (!gone)
        return CFX_OK;
    return cfx__err(CFX_ERR_CONNECT,
                    "job %s: worker %d: tensor '%s' %s within %d ms: the coordinator %s (the "
                    "maps come through its directory) has been unreachable for %llu ms",
                    ps->job, ps->index, name, what, ps->timeout_ms, ps->ctx->cfg.coord,
                    (unsigned long long)gone);
}

static bool has_tensor(struct cfx_ps *ps, const void *name)
{
    return cfx__ps_map_find(&ps->map, name) >= 0;
}

static bool tensor_ready(struct cfx_ps *ps, const void *name)
{
    int t = cfx__ps_map_find(&ps->map, name);
    return t >= 0 && ps->map.tensors[t].ready;
}

/* ps->lock held: the first block of tensor @p name (not ready) on a server
 * whose mailbox failed here (the map gave it blocks before the scheduler
 * saw it go): worker 0 cannot store its initial values, and the tensor
 * never gets ready.  UINT32_MAX: none. */
static uint32_t tensor_lost_block(struct cfx_ps *ps, const char *name)
{
    const struct ps_map *m = &ps->map;
    int t = cfx__ps_map_find(m, name);
    if (t < 0 || m->tensors[t].ready)
        return UINT32_MAX;
    for (uint32_t b = m->tensors[t].first_block;
         b < m->tensors[t].first_block + m->tensors[t].nblocks && b < m->nblocks; b++)
        if (m->owner[b] < PS_MAX_SERVERS && ps->w->srv_failed[m->owner[b]])
            return b;
    return UINT32_MAX;
}

static bool tensor_ready_or_lost(struct cfx_ps *ps, const void *name)
{
    return tensor_ready(ps, name) || tensor_lost_block(ps, name) != UINT32_MAX;
}

/* Would the scheduler take the tensor into the map we hold?  It checks
 * the same and only logs a refusal (the worker would wait out its
 * deadline), so worker 0 asks first, with the limits named. */
static int register_fits(struct cfx_ps *ps, const char *name, enum cfx_dtype dtype,
                         size_t count)
{
    struct ps_map probe;
    cfx__ps_map_init(&probe);
    pthread_mutex_lock(&ps->lock);
    int rc = cfx__ps_map_copy(&probe, &ps->map);
    uint32_t ntensors = ps->map.ntensors, nblocks = ps->map.nblocks;
    pthread_mutex_unlock(&ps->lock);
    void *buf = rc == CFX_OK ? malloc(PS_MAP_MAX) : NULL;
    if (rc == CFX_OK)
        rc = buf ? cfx__ps_map_add_tensor(&probe, name, dtype, count, NULL) : CFX_ERR_NOMEM;
    if (rc >= 0 && cfx__ps_map_encode(&probe, buf, PS_MAP_MAX) < 0)
        rc = CFX_ERR_NO_RESOURCE;
    free(buf);
    uint64_t bs = probe.conf.block_size ? probe.conf.block_size : PS_BLOCK_DEFAULT;
    cfx__ps_map_free(&probe);
    if (rc >= 0 || rc == CFX_ERR_EXISTS)
        return CFX_OK; /* a tensor of that name: the map's entry is compared after */
    if (rc == CFX_ERR_INVALID)
        return cfx__err(rc, "ps register '%s': %zu x %s is more bytes than a size can count, or "
                        "the job has no active server", name, count, cfx_dtype_name(dtype));
    if (rc == CFX_ERR_NO_RESOURCE)
        return cfx__err(rc, "job %s: tensor '%s' (%zu x %s) does not fit the shard map: it "
                        "holds %u of %u tensors and %u of %u blocks of %" PRIu64 " B, in at "
                        "most %u B (a larger block_size takes fewer blocks)",
                        ps->job, name, count, cfx_dtype_name(dtype), ntensors, PS_MAX_TENSORS,
                        nblocks, PS_MAX_BLOCKS, bs, (unsigned)PS_MAP_MAX);
    return cfx__err(rc, "ps register '%s': %s", name, cfx_strerror(rc));
}

int cfx_ps_register(struct cfx_ps *ps, const char *name, enum cfx_dtype dtype, size_t count,
                    const void *init, int *key)
{
    cfx__err_clear();
    if (!ps || ps->role != CFX_PS_WORKER || !name || !key)
        return cfx__err(CFX_ERR_INVALID, "ps register: not a worker handle or NULL argument");
    if (cfx__ps_forked(ps))
        return cfx__err(CFX_ERR_INVALID, "job %s: the handle was created before this process "
                        "forked: a child creates its own", ps->job);
    if (!*name || strlen(name) >= PS_TENSOR_NAME_MAX || !count || !cfx_dtype_size(dtype))
        return cfx__err(CFX_ERR_INVALID, "ps register: bad name, dtype or count for '%s'", name);
    int gone = cfx__ps_gone(ps);
    if (gone != CFX_OK)
        return gone;
    if (ps->index == 0 && !init)
        return cfx__err(CFX_ERR_INVALID, "ps register '%s': worker 0 gives the initial values",
                        name);
    uint64_t dl = cfx__deadline_ns(ps->timeout_ms);
    pthread_mutex_lock(&ps->lock);
    enum cfx_ps_optimizer opt = ps->map.conf.optim.type;
    cfx__ps_check_coord(ps);
    int lrc = ps->lost_status == CFX_ERR_CONNECT ? cfx__ps_lost_err(ps) : CFX_OK;
    pthread_mutex_unlock(&ps->lock);
    if (lrc != CFX_OK)
        return lrc;
    if (opt != CFX_PS_OPT_SUM && dtype != CFX_DTYPE_F32 && dtype != CFX_DTYPE_F64)
        return cfx__err(CFX_ERR_UNSUPPORTED,
                        "ps register '%s': the servers' optimizer needs "
                        "float or double, not %s",
                        name, cfx_dtype_name(dtype));
    int rc;
    if (ps->index == 0 && (rc = register_fits(ps, name, dtype, count)) != CFX_OK)
        return rc;
    struct cfx_ps_request *r = NULL;
    if (ps->index == 0) {
        struct ps_op *op = calloc(1, sizeof(*op));
        if (!op)
            return cfx__err(CFX_ERR_NOMEM, "ps: out of memory");
        op->kind = PS_OP_REGISTER;
        snprintf(op->reg.name, sizeof(op->reg.name), "%s", name);
        op->reg.dtype = dtype;
        op->reg.count = count;
        if ((rc = run(ps, post(ps, op, &r), &r)) != CFX_OK)
            return rc;
    }
    pthread_mutex_lock(&ps->lock);
    bool ok = wait_map(ps, dl, has_tensor, name);
    int t = cfx__ps_map_find(&ps->map, name);
    struct ps_tensor info;
    memset(&info, 0, sizeof(info));
    if (t >= 0)
        info = ps->map.tensors[t];
    rc = ok ? CFX_OK : cfx__ps_lost_err(ps);
    pthread_mutex_unlock(&ps->lock);
    if (rc != CFX_OK)
        return rc;
    if (!ok && (rc = map_wait_err(ps, name, "did not appear in the shard map")) != CFX_OK)
        return rc;
    if (!ok)
        return cfx__err(CFX_ERR_TIMEOUT,
                        "job %s: tensor '%s' did not appear in the shard map "
                        "within %d ms (worker 0 registers it with the scheduler, server 0)",
                        ps->job, name, ps->timeout_ms);
    if (info.dtype != (uint32_t)dtype || info.count != count)
        return cfx__err(CFX_ERR_INVALID,
                        "job %s: tensor '%s' is registered as %" PRIu64 " x %s, not %zu x %s",
                        ps->job, name, info.count, cfx_dtype_name((enum cfx_dtype)info.dtype),
                        count, cfx_dtype_name(dtype));
    if (ps->index == 0 && !info.ready) {
        if ((rc = run(ps, post_data_op(ps, PS_OP_INIT, t, init, NULL, &r), &r)) != CFX_OK)
            return rc;
        struct ps_op *op = calloc(1, sizeof(*op));
        if (!op)
            return cfx__err(CFX_ERR_NOMEM, "ps: out of memory");
        op->kind = PS_OP_READY;
        op->tensor = t;
        if ((rc = run(ps, post(ps, op, &r), &r)) != CFX_OK)
            return rc;
    }
    pthread_mutex_lock(&ps->lock);
    ok = wait_map(ps, dl, tensor_ready_or_lost, name) && tensor_ready(ps, name);
    rc = ok ? CFX_OK : cfx__ps_lost_err(ps); /* a lost scheduler first: it is the cause */
    uint32_t lb = ok || rc != CFX_OK ? UINT32_MAX : tensor_lost_block(ps, name);
    if (lb != UINT32_MAX) {
        uint32_t srv = ps->map.owner[lb];
        rc = cfx__err(CFX_ERR_PEER_FAILED, "job %s: tensor '%s' block %u: server %u (node %u) "
                      "failed before the tensor's initial values were stored there: %s",
                      ps->job, name, lb, srv, ps->map.server[srv].node_id,
                      cfx_strerror(ps->w->srv_fail_status[srv]));
    }
    pthread_mutex_unlock(&ps->lock);
    if (rc != CFX_OK)
        return rc;
    if (!ok && (rc = map_wait_err(ps, name, "was not initialized")) != CFX_OK)
        return rc;
    if (!ok)
        return cfx__err(CFX_ERR_TIMEOUT,
                        "job %s: tensor '%s' was not initialized within %d ms "
                        "(worker 0 stores its initial values)",
                        ps->job, name, ps->timeout_ms);
    *key = t;
    return CFX_OK;
}

void cfx__ps_worker_say_bye(struct cfx_ps *ps)
{
    struct ps_op *op = calloc(1, sizeof(*op));
    struct cfx_ps_request *r = NULL;
    if (!op)
        return;
    op->kind = PS_OP_BYE;
    int rc = run(ps, post(ps, op, &r), &r);
    if (rc != CFX_OK)
        CFX_LOG(WARN, PS, "job %s: worker %d: %s", ps->job, ps->index, cfx_last_error());
}

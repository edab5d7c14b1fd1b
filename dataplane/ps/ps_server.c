/*
 * Server role: the blocks this server owns, the update rules, and live
 * migration.
 *
 * Per block the server keeps the value, the optimizer state, `version`
 * (BSP/SSP: rounds every worker has pushed; ASP: pushes applied) and, per
 * worker, the clock of the next push it expects.  A push with a smaller
 * clock is a duplicate (acknowledged, not applied); one with a larger clock,
 * or under BSP one for a round after the current, waits in `deferred`.  So
 * every push is applied exactly once and in clock order, whichever way it
 * arrived.  A pull waits in `parked` until version >= its min_version.
 *
 * Migration (see docs/PARAMETER_SERVER.md).  When a new map gives an owned
 * block to server X, the block's whole state (value, optimizer state, clocks,
 * the BSP accumulator) goes to X in one STATE message, followed by the
 * deferred pushes and parked pulls, forwarded as requests; the block becomes
 * a forwarding entry.  Requests arriving later are forwarded to X (the new
 * owner replies to the worker directly).  X processes a peer's messages in
 * the order they were sent, so the state is installed before anything
 * forwarded behind it.  A request for a block whose state has not arrived
 * yet waits in `orphans`; one for a block this server neither has nor owns
 * is answered with REDIRECT and the worker re-sends it with a newer map.
 * A block whose owner before is FAILED in the map (removed after it failed,
 * or it died handing the block over) is `lost`: no state comes, and every
 * request for it fails naming that server, here and wherever it moves on.
 * The map marks the first kind itself (ps_map.lost), so its owner knows
 * whichever versions it saw; the second is known from the map before.
 */
#include "ps_int.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define PS_MAX_HOPS 8

struct ps_pend {
    struct cfx_list link;
    struct ps_hdr h;   /* the request as received */
    void *payload;     /* owned */
    uint64_t deadline; /* orphans only */
    uint64_t since;    /* received (ns): a deferred push or parked pull held past twice
                          the job's timeout is one its worker gave up on */
    bool told;         /* its worker heard which workers it waits for (PS_MSG_WAITING) */
};

struct ps_block {
    uint32_t id;
    int32_t moved_to; /* -1: owned here; else the server it went to */
    uint32_t from;    /* 1 + the server its state is to come from (0: none known) */
    uint32_t lost;    /* 1 + the failed server its values went with: no state ever comes,
                         and every request for it fails naming that server (0: none) */
    uint32_t dtype;
    uint64_t elems;
    size_t bytes;
    uint8_t *param;
    uint8_t *m;     /* MOMENTUM velocity, ADAM first moment */
    uint8_t *v;     /* ADAM second moment */
    uint8_t *acc;   /* BSP: sum of this round's pushes */
    uint32_t acc_n; /* pushes in acc */
    uint64_t opt_t; /* ADAM steps */
    uint64_t version;
    uint32_t nworkers;
    uint64_t *pushed;         /* [nworkers] next expected clock */
    struct cfx_list deferred; /* struct ps_pend: pushes waiting for their turn */
    struct cfx_list parked;   /* struct ps_pend: pulls waiting for a version */
};

/* Fixed part of a STATE payload; then pushed[], param, m, v, acc. */
struct ps_state_hdr {
    uint64_t version;
    uint64_t opt_t;
    uint32_t acc_n;
    uint32_t nworkers;
    uint32_t dtype;
    uint32_t has_m, has_v, has_acc;
    uint64_t elems;
};

static void pend_free(struct ps_pend *p)
{
    free(p->payload);
    free(p);
}

/* The block's values go (not owned here any more, or never filled). */
static void block_free_arrays(struct ps_block *b)
{
    free(b->param);
    free(b->m);
    free(b->v);
    free(b->acc);
    free(b->pushed);
    b->param = b->m = b->v = b->acc = NULL;
    b->pushed = NULL;
}

static void block_free_data(struct ps_block *b)
{
    block_free_arrays(b);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &b->deferred)
    {
        cfx_list_del(pos);
        pend_free(cfx_list_entry(pos, struct ps_pend, link));
    }
    cfx_list_for_each_safe(pos, tmp, &b->parked)
    {
        cfx_list_del(pos);
        pend_free(cfx_list_entry(pos, struct ps_pend, link));
    }
}

void cfx__ps_server_free(struct cfx_ps *ps)
{
    for (uint32_t i = 0; i < ps->nblocks_cap; i++)
        if (ps->blocks[i]) {
            block_free_data(ps->blocks[i]);
            free(ps->blocks[i]);
        }
    free(ps->blocks);
    ps->blocks = NULL;
    ps->nblocks_cap = 0;
    free(ps->owner_was);
    ps->owner_was = NULL;
    ps->owner_was_n = 0;
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ps->orphans)
    {
        cfx_list_del(pos);
        pend_free(cfx_list_entry(pos, struct ps_pend, link));
    }
}

static struct ps_block *block_slot(struct cfx_ps *ps, uint32_t id, bool create)
{
    if (id >= ps->nblocks_cap) {
        if (!create)
            return NULL;
        uint32_t cap = CFX_MAX(id + 1, ps->nblocks_cap * 2);
        struct ps_block **nb = realloc(ps->blocks, cap * sizeof(*nb));
        if (!nb)
            return NULL;
        memset(nb + ps->nblocks_cap, 0, (cap - ps->nblocks_cap) * sizeof(*nb));
        ps->blocks = nb;
        ps->nblocks_cap = cap;
    }
    if (!ps->blocks[id] && create) {
        struct ps_block *b = calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        b->id = id;
        b->moved_to = -1;
        cfx_list_init(&b->deferred);
        cfx_list_init(&b->parked);
        ps->blocks[id] = b;
    }
    return ps->blocks[id];
}

/* Allocate a block's arrays for the current map and configuration. */
static int block_alloc(struct cfx_ps *ps, struct ps_block *b)
{
    uint32_t t;
    uint64_t off, elems;
    if (cfx__ps_map_block(&ps->map, b->id, &t, &off, &elems) != CFX_OK)
        return CFX_ERR_INVALID;
    b->dtype = ps->map.tensors[t].dtype;
    b->elems = elems;
    b->bytes = elems * cfx_dtype_size((enum cfx_dtype)b->dtype);
    b->nworkers = ps->map.nworkers;
    enum cfx_ps_optimizer o = ps->map.conf.optim.type;
    b->param = calloc(1, b->bytes);
    b->pushed = calloc(b->nworkers, sizeof(uint64_t));
    if (o == CFX_PS_OPT_MOMENTUM || o == CFX_PS_OPT_ADAM)
        b->m = calloc(1, b->bytes);
    if (o == CFX_PS_OPT_ADAM)
        b->v = calloc(1, b->bytes);
    if (ps->map.conf.consistency == CFX_PS_BSP)
        b->acc = calloc(1, b->bytes);
    if (!b->param || !b->pushed || (o >= CFX_PS_OPT_MOMENTUM && !b->m) ||
        (o == CFX_PS_OPT_ADAM && !b->v) || (ps->map.conf.consistency == CFX_PS_BSP && !b->acc))
        return CFX_ERR_NOMEM;
    return CFX_OK;
}

/* ---- the update rules ----------------------------------------------------------- */

/* The library does not link libm: the two functions Adam needs. */
static double ipow(double x, uint64_t n)
{
    double r = 1;
    for (; n; n >>= 1, x *= x)
        if (n & 1)
            r *= x;
    return r;
}

static double root(double x)
{
#if defined(__SSE2__)
    return _mm_cvtsd_f64(_mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(x)));
#else
    if (x <= 0)
        return 0;
    double r = x > 1 ? x : 1;
    for (int i = 0; i < 64; i++) {
        double n = 0.5 * (r + x / r);
        if (n >= r)
            break;
        r = n;
    }
    return r;
#endif
}

#define OPT_LOOP(T)                                                                    \
    do {                                                                               \
        T *p = (T *)b->param, *m = (T *)b->m, *v = (T *)b->v;                          \
        const T *x = (const T *)g;                                                     \
        for (uint64_t i = 0; i < b->elems; i++) {                                      \
            double gi = o->grad_scale * (double)x[i] + o->weight_decay * (double)p[i]; \
            switch (o->type) {                                                         \
            case CFX_PS_OPT_SGD: p[i] = (T)((double)p[i] - o->lr * gi); break;         \
            case CFX_PS_OPT_MOMENTUM:                                                  \
                m[i] = (T)(o->momentum * (double)m[i] + gi);                           \
                p[i] = (T)((double)p[i] - o->lr * (double)m[i]);                       \
                break;                                                                 \
            case CFX_PS_OPT_ADAM: {                                                    \
                m[i] = (T)(o->beta1 * (double)m[i] + (1 - o->beta1) * gi);             \
                v[i] = (T)(o->beta2 * (double)v[i] + (1 - o->beta2) * gi * gi);        \
                double mh = (double)m[i] / bc1, vh = (double)v[i] / bc2;               \
                p[i] = (T)((double)p[i] - o->lr * mh / (root(vh) + o->eps));           \
                break;                                                                 \
            }                                                                          \
            default: break;                                                            \
            }                                                                          \
        }                                                                              \
    } while (0)

static void apply_update(struct cfx_ps *ps, struct ps_block *b, const void *g)
{
    const struct cfx_ps_optim *o = &ps->map.conf.optim;
    if (o->type == CFX_PS_OPT_SUM) {
        cfx_reduce(b->param, g, b->elems, (enum cfx_dtype)b->dtype, CFX_OP_SUM);
        return;
    }
    b->opt_t++;
    double bc1 = 1 - ipow(o->beta1, b->opt_t);
    double bc2 = 1 - ipow(o->beta2, b->opt_t);
    if (b->dtype == CFX_DTYPE_F32)
        OPT_LOOP(float);
    else if (b->dtype == CFX_DTYPE_F64)
        OPT_LOOP(double);
}

/* ---- replies ---------------------------------------------------------------------- */

/* 1 + the server whose hand-over of block @p id this server waits for (0: none). */
static uint32_t awaited_from(const struct cfx_ps *ps, uint32_t id)
{
    const struct ps_block *b = id < ps->nblocks_cap ? ps->blocks[id] : NULL;
    return b && !(b->moved_to < 0 && b->param) ? (b->lost ? b->lost : b->from) : 0;
}

/* Whether block @p id waits for the state of a server that is gone, or
 * lost its values with a failed one (whose mailbox here may not have failed
 * yet: the map said it). */
static bool awaits_the_gone(const struct cfx_ps *ps, uint32_t id)
{
    const struct ps_block *b = id < ps->nblocks_cap ? ps->blocks[id] : NULL;
    if (b && b->lost && b->moved_to < 0)
        return true;
    uint32_t from = awaited_from(ps, id);
    const struct ps_peer *p = from && from <= PS_MAX_SERVERS ? ps->servers[from - 1] : NULL;
    return p && p->closed;
}

static void reply_gone(struct cfx_ps *ps, const struct ps_hdr *req, int status,
                       struct ps_block *b, bool with_data, uint32_t gone);

static void reply(struct cfx_ps *ps, const struct ps_hdr *req, int status, struct ps_block *b,
                  bool with_data)
{
    reply_gone(ps, req, status, b, with_data, 0);
}

/* reply(); a failure that names worker @p gone - 1 as the one whose push
 * the request waited for (0: none). */
static void reply_gone(struct cfx_ps *ps, const struct ps_hdr *req, int status,
                       struct ps_block *b, bool with_data, uint32_t gone)
{
    struct ps_peer *w = req->worker < PS_MAX_WORKERS ? ps->workers[req->worker] : NULL;
    if (!w || w->closed) {
        CFX_LOG(WARN, PS, "job %s: server %d: no worker %u to answer", ps->job, ps->index,
                req->worker);
        return;
    }
    struct ps_hdr h = {
        .type = PS_MSG_REPLY,
        .kind = req->kind,
        .worker = req->worker,
        .block = req->block,
        .status = status,
        .req_id = req->req_id,
        .clock = b ? b->version : 0,
        .min_version = status != CFX_OK ? gone : 0,
        .held_ns = req->held_ns,
    };
    if (status != CFX_OK && !b && req->kind != PS_REQ_INIT)
        h.forwarded = awaited_from(ps, req->block);
    void *copy = NULL;
    size_t len = 0;
    if (with_data && status == CFX_OK && b) {
        /* the value changes with the next push: send a copy */
        copy = malloc(b->bytes);
        if (!copy) {
            h.status = CFX_ERR_NOMEM;
        } else {
            memcpy(copy, b->param, b->bytes);
            len = b->bytes;
        }
    }
    if (h.status == CFX_OK && b && req->kind != PS_REQ_INIT)
        cfx__ps_load_count(ps, req->block, req->len + len); /* served: a counter add */
    cfx__ps_send(ps, w, &h, copy, len, copy);
}

static void redirect(struct cfx_ps *ps, const struct ps_hdr *req)
{
    struct ps_peer *w = req->worker < PS_MAX_WORKERS ? ps->workers[req->worker] : NULL;
    if (!w || w->closed)
        return;
    struct ps_hdr h = {
        .type = PS_MSG_REDIRECT,
        .kind = req->kind,
        .worker = req->worker,
        .block = req->block,
        .req_id = req->req_id,
    };
    cfx__ps_send(ps, w, &h, NULL, 0, NULL);
}

/* ---- requests on an owned block ---------------------------------------------------- */

static struct ps_pend *pend_new(const struct ps_hdr *h, void *payload, bool owned)
{
    struct ps_pend *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->h = *h;
    p->since = cfx__now_ns();
    if (owned || !h->len || !payload) {
        p->payload = payload;
    } else {
        p->payload = malloc(h->len);
        if (!p->payload) {
            free(p);
            return NULL;
        }
        memcpy(p->payload, payload, h->len);
    }
    return p;
}

static uint64_t min_pushed(const struct ps_block *b)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t w = 0; w < b->nworkers; w++)
        m = CFX_MIN(m, b->pushed[w]);
    return b->nworkers ? m : 0;
}

/* Serve parked pulls that the block's version now satisfies. */
static void serve_parked(struct cfx_ps *ps, struct ps_block *b)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &b->parked)
    {
        struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
        if (b->version < p->h.min_version)
            continue;
        cfx_list_del(pos);
        p->h.held_ns += cfx__now_ns() - p->since;
        reply(ps, &p->h, CFX_OK, b, true);
        pend_free(p);
    }
}

/* Try to apply one push; true when it was consumed (applied or duplicate). */
static bool try_push(struct cfx_ps *ps, struct ps_block *b, const struct ps_hdr *h,
                     const void *payload)
{
    uint32_t w = h->worker;
    if (h->clock < b->pushed[w])
        return true; /* a duplicate: already applied */
    if (h->clock > b->pushed[w])
        return false;
    if (ps->map.conf.consistency == CFX_PS_BSP) {
        if (h->clock != b->version)
            return false; /* next round: wait for this one to complete */
        if (b->acc_n == 0)
            memcpy(b->acc, payload, b->bytes);
        else
            cfx_reduce(b->acc, payload, b->elems, (enum cfx_dtype)b->dtype, CFX_OP_SUM);
        b->pushed[w]++;
        if (++b->acc_n == b->nworkers) {
            apply_update(ps, b, b->acc);
            b->acc_n = 0;
            b->version++;
        }
    } else {
        apply_update(ps, b, payload);
        b->pushed[w]++;
        b->version = ps->map.conf.consistency == CFX_PS_ASP ? b->version + 1 : min_pushed(b);
    }
    return true;
}

/* Whether worker w's push of @p step waits in the block's deferred list. */
static bool deferred_has(const struct ps_block *b, uint32_t w, uint64_t step)
{
    const struct cfx_list *pos;
    cfx_list_for_each(pos, &b->deferred)
    {
        const struct ps_pend *p = cfx_list_entry(pos, const struct ps_pend, link);
        if (p->h.worker == w && p->h.clock == step)
            return true;
    }
    return false;
}

/* The steps a request says its worker gave up on with no answer from some
 * block (ps_hdr.lost_base, lost_mask): those this block has not applied
 * count as empty pushes, in step order and (BSP) each in its round, so that
 * the requests behind them do not wait for ever for a push that will never
 * come (dropped in a hand-over slower than the timeout).  A step whose push
 * waits here is applied instead, by run_deferred(); one that arrives after
 * it was counted empty is a duplicate.  True when a step was counted. */
static bool skip_lost(struct cfx_ps *ps, struct ps_block *b, const struct ps_hdr *h)
{
    uint32_t w = h->worker;
    bool bsp = ps->map.conf.consistency == CFX_PS_BSP;
    bool any = false;
    for (;;) {
        uint64_t s = b->pushed[w];
        if (s < h->lost_base || s - h->lost_base >= 64 || !(h->lost_mask >> (s - h->lost_base) & 1))
            break; /* not one its worker gave up on */
        if (s >= h->clock || deferred_has(b, w, s))
            break; /* a step of this request's or after; or its push is here */
        if (bsp && s != b->version)
            break; /* its round has not come: the request behind it waits */
        CFX_LOG(INFO, PS, "job %s: server %d: block %u: worker %u's push of step %" PRIu64
                " never came and its worker gave up on it: counted as empty", ps->job,
                ps->index, b->id, w, s);
        b->pushed[w]++;
        if (bsp) {
            if (b->acc_n == 0)
                memset(b->acc, 0, b->bytes);
            if (++b->acc_n == b->nworkers) {
                apply_update(ps, b, b->acc);
                b->acc_n = 0;
                b->version++;
            }
        } else if (ps->map.conf.consistency == CFX_PS_SSP) {
            b->version = min_pushed(b);
        }
        ps->stats.lost_steps++;
        any = true;
    }
    return any;
}

/* After a push was consumed: acknowledge it or queue its pull part. */
static void push_done(struct cfx_ps *ps, struct ps_block *b, const struct ps_hdr *h)
{
    if (h->kind == PS_REQ_PUSHPULL) {
        if (b->version >= h->min_version) {
            reply(ps, h, CFX_OK, b, true);
        } else {
            struct ps_pend *p = pend_new(h, NULL, true);
            if (!p) {
                reply(ps, h, CFX_ERR_NOMEM, b, false);
                return;
            }
            p->h.len = 0;
            cfx_list_add_tail(&p->link, &b->parked);
        }
    } else {
        reply(ps, h, CFX_OK, b, false);
    }
}

/* Run deferred pushes that became applicable, until none does.  The pulls
 * parked for a version are served as soon as the block reaches it, before a
 * deferred push of a later round is applied: a BSP pull of step t gets the
 * values of round t, also when the pushes of round t + 1 are all here
 * (behind a step counted empty, or forwarded in a hand-over). */
static void run_deferred(struct cfx_ps *ps, struct ps_block *b)
{
    bool progress = true;
    serve_parked(ps, b);
    while (progress) {
        progress = false;
        struct cfx_list *pos, *tmp;
        cfx_list_for_each_safe(pos, tmp, &b->deferred)
        {
            struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
            uint64_t v = b->version;
            if (skip_lost(ps, b, &p->h))
                progress = true;
            if (b->version != v)
                serve_parked(ps, b);
            v = b->version;
            if (!try_push(ps, b, &p->h, p->payload))
                continue;
            cfx_list_del(pos);
            p->h.held_ns += cfx__now_ns() - p->since;
            push_done(ps, b, &p->h);
            pend_free(p);
            if (b->version != v)
                serve_parked(ps, b);
            progress = true;
        }
    }
    serve_parked(ps, b);
}

static void delay(struct cfx_ps *ps)
{
    pthread_mutex_lock(&ps->lock);
    uint32_t us = ps->delay_us;
    pthread_mutex_unlock(&ps->lock);
    if (us)
        usleep(us);
}

static void process(struct cfx_ps *ps, struct ps_block *b, const struct ps_hdr *h, void *payload,
                    bool owned)
{
    if (h->kind == PS_REQ_INIT) {
        reply(ps, h, CFX_OK, b, false);
        goto out;
    }
    delay(ps);
    if (h->worker >= b->nworkers) {
        reply(ps, h, CFX_ERR_INVALID, b, false);
        goto out;
    }
    if (h->kind == PS_REQ_PULL) {
        bool skipped = skip_lost(ps, b, h);
        if (b->version >= h->min_version) {
            reply(ps, h, CFX_OK, b, true);
        } else {
            struct ps_pend *p = pend_new(h, NULL, true);
            if (!p)
                reply(ps, h, CFX_ERR_NOMEM, b, false);
            else
                cfx_list_add_tail(&p->link, &b->parked);
        }
        if (skipped)
            run_deferred(ps, b); /* pushes behind a step counted empty may go now */
        goto out;
    }
    if (h->len != b->bytes || !payload) {
        CFX_LOG(WARN, PS, "job %s: server %d: push of %" PRIu64 " bytes to block %u of %zu",
                ps->job, ps->index, h->len, b->id, b->bytes);
        reply(ps, h, CFX_ERR_INVALID, b, false);
        goto out;
    }
    if (unlikely(ps->drop_at) && h->worker == ps->drop_worker && h->clock == ps->drop_at - 1) {
        CFX_LOG(WARN, PS, "job %s: server %d: block %u: test hook: worker %u's push of step "
                "%" PRIu64 " dropped", ps->job, ps->index, b->id, h->worker, h->clock);
        goto out; /* every block of the step: the hook stays on */
    }
    bool skipped = skip_lost(ps, b, h);
    if (!try_push(ps, b, h, payload)) {
        struct ps_pend *p = pend_new(h, payload, owned);
        if (!p) {
            reply(ps, h, CFX_ERR_NOMEM, b, false);
            goto out;
        }
        cfx_list_add_tail(&p->link, &b->deferred);
        if (skipped)
            run_deferred(ps, b); /* a push behind a step counted empty may go now */
        return; /* payload now belongs to the deferred entry */
    }
    push_done(ps, b, h);
    run_deferred(ps, b);
out:
    if (owned)
        free(payload);
}

/* ---- migration -------------------------------------------------------------------- */

static void forward(struct cfx_ps *ps, uint32_t to, struct ps_hdr *h, void *payload, bool owned)
{
    struct ps_peer *p = to < PS_MAX_SERVERS ? ps->servers[to] : NULL;
    if (!p || p->closed || h->forwarded >= PS_MAX_HOPS) {
        redirect(ps, h);
        if (owned)
            free(payload);
        return;
    }
    struct ps_hdr f = *h;
    f.forwarded++;
    void *copy = payload;
    if (h->len && !owned) {
        copy = malloc(h->len);
        if (!copy) {
            redirect(ps, h);
            return;
        }
        memcpy(copy, payload, h->len);
    }
    ps->stats.forwarded++;
    cfx__ps_send(ps, p, &f, h->len ? copy : NULL, h->len, h->len ? copy : NULL);
}

static void migrate(struct cfx_ps *ps, struct ps_block *b, uint32_t to)
{
    struct ps_peer *p = to < PS_MAX_SERVERS ? ps->servers[to] : NULL;
    if (!p) {
        CFX_LOG(ERR, PS, "job %s: server %d: block %u goes to server %u, which we cannot reach",
                ps->job, ps->index, b->id, to);
        return;
    }
    struct ps_state_hdr sh = {
        .version = b->version,
        .opt_t = b->opt_t,
        .acc_n = b->acc_n,
        .nworkers = b->nworkers,
        .dtype = b->dtype,
        .has_m = !!b->m,
        .has_v = !!b->v,
        .has_acc = !!b->acc,
        .elems = b->elems,
    };
    size_t len = sizeof(sh) + b->nworkers * sizeof(uint64_t) +
                 b->bytes * (1 + sh.has_m + sh.has_v + sh.has_acc);
    uint8_t *buf = malloc(len), *q = buf;
    if (!buf) {
        CFX_LOG(ERR, PS, "job %s: server %d: out of memory migrating block %u", ps->job, ps->index,
                b->id);
        return;
    }
    memcpy(q, &sh, sizeof(sh));
    q += sizeof(sh);
    memcpy(q, b->pushed, b->nworkers * sizeof(uint64_t));
    q += b->nworkers * sizeof(uint64_t);
    memcpy(q, b->param, b->bytes);
    q += b->bytes;
    if (b->m) {
        memcpy(q, b->m, b->bytes);
        q += b->bytes;
    }
    if (b->v) {
        memcpy(q, b->v, b->bytes);
        q += b->bytes;
    }
    if (b->acc)
        memcpy(q, b->acc, b->bytes);
    struct ps_hdr h = { .type = PS_MSG_STATE, .block = b->id, .clock = b->version };
    CFX_LOG(INFO, PS, "job %s: server %d: block %u (version %" PRIu64 ") -> server %u", ps->job,
            ps->index, b->id, b->version, to);
    cfx__ps_send(ps, p, &h, buf, len, buf);
    ps->stats.migrations_out++;
    /* what waited here follows the state, in order */
    b->moved_to = (int32_t)to;
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &b->deferred)
    {
        struct ps_pend *d = cfx_list_entry(pos, struct ps_pend, link);
        cfx_list_del(pos);
        forward(ps, to, &d->h, d->payload, true);
        free(d);
    }
    cfx_list_for_each_safe(pos, tmp, &b->parked)
    {
        struct ps_pend *d = cfx_list_entry(pos, struct ps_pend, link);
        cfx_list_del(pos);
        /* a parked push-pull was applied already: forward only its pull */
        d->h.kind = PS_REQ_PULL;
        d->h.len = 0;
        forward(ps, to, &d->h, NULL, true);
        pend_free(d);
    }
    block_free_data(b);
}

static int install_state(struct cfx_ps *ps, const struct ps_hdr *h, const void *payload)
{
    struct ps_state_hdr sh;
    if (h->len < sizeof(sh) || h->block >= ps->map.nblocks)
        return CFX_ERR_PROTO; /* a block of no map we know */
    memcpy(&sh, payload, sizeof(sh));
    struct ps_block *b = block_slot(ps, h->block, true);
    if (!b)
        return CFX_ERR_NOMEM;
    if (b->moved_to < 0 && b->param) {
        CFX_LOG(ERR, PS, "job %s: server %d: state of block %u arrived, but we own it", ps->job,
                ps->index, h->block);
        return CFX_ERR_PROTO;
    }
    block_free_data(b);
    b->moved_to = -1;
    b->from = 0;
    b->lost = 0;
    int rc = block_alloc(ps, b);
    if (rc != CFX_OK) {
        block_free_arrays(b);
        return rc;
    }
    size_t want = sizeof(sh) + sh.nworkers * sizeof(uint64_t) +
                  b->bytes * (1 + sh.has_m + sh.has_v + sh.has_acc);
    if (sh.nworkers != b->nworkers || sh.elems != b->elems || h->len != want ||
        sh.has_m != !!b->m || sh.has_v != !!b->v || sh.has_acc != !!b->acc) {
        block_free_arrays(b); /* not ours: zeros must not be served as its values */
        return CFX_ERR_PROTO;
    }
    const uint8_t *q = (const uint8_t *)payload + sizeof(sh);
    memcpy(b->pushed, q, b->nworkers * sizeof(uint64_t));
    q += b->nworkers * sizeof(uint64_t);
    memcpy(b->param, q, b->bytes);
    q += b->bytes;
    if (b->m) {
        memcpy(b->m, q, b->bytes);
        q += b->bytes;
    }
    if (b->v) {
        memcpy(b->v, q, b->bytes);
        q += b->bytes;
    }
    if (b->acc)
        memcpy(b->acc, q, b->bytes);
    b->version = sh.version;
    b->opt_t = sh.opt_t;
    b->acc_n = sh.acc_n;
    ps->stats.migrations_in++;
    CFX_LOG(INFO, PS, "job %s: server %d: installed block %u (version %" PRIu64 ")", ps->job,
            ps->index, b->id, b->version);
    return CFX_OK;
}

/*
 * A block whose values were lost with a failed server moves on as what it
 * is: its new owner hears, in a STATE with no payload and status
 * CFX_ERR_PEER_FAILED (forwarded: 1 + that server), that none comes, and
 * fails its requests naming that server, as this one did; without it the
 * new owner would wait for a state this server does not have.
 */
static void hand_lost(struct cfx_ps *ps, struct ps_block *b, uint32_t to)
{
    struct ps_peer *p = to < PS_MAX_SERVERS ? ps->servers[to] : NULL;
    if (!p) {
        CFX_LOG(ERR, PS, "job %s: server %d: lost block %u goes to server %u, which we cannot "
                "reach", ps->job, ps->index, b->id, to);
        return;
    }
    struct ps_hdr h = { .type = PS_MSG_STATE, .block = b->id, .status = CFX_ERR_PEER_FAILED,
                        .forwarded = b->lost };
    CFX_LOG(INFO, PS, "job %s: server %d: block %u (lost with server %u) -> server %u", ps->job,
            ps->index, b->id, b->lost - 1, to);
    cfx__ps_send(ps, p, &h, NULL, 0, NULL);
    b->moved_to = (int32_t)to;
    b->lost = 0;
}

static int install_lost(struct cfx_ps *ps, const struct ps_hdr *h)
{
    if (h->block >= ps->map.nblocks || !h->forwarded || h->forwarded > PS_MAX_SERVERS)
        return CFX_ERR_PROTO;
    struct ps_block *b = block_slot(ps, h->block, true);
    if (!b)
        return CFX_ERR_NOMEM;
    if (b->moved_to < 0 && b->param) {
        CFX_LOG(ERR, PS, "job %s: server %d: block %u said lost, but we own its values",
                ps->job, ps->index, h->block);
        return CFX_ERR_PROTO;
    }
    block_free_data(b);
    b->moved_to = -1;
    b->from = 0;
    b->lost = h->forwarded;
    CFX_LOG(WARN, PS, "job %s: server %d: block %u came without values: they were lost with "
            "failed server %u", ps->job, ps->index, h->block, h->forwarded - 1);
    return CFX_OK;
}

/* ---- handing blocks over before a retirement -------------------------------------- */

bool cfx__ps_server_settled(const struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    for (uint32_t i = 0; i < m->nblocks; i++) {
        if (m->owner[i] != (uint32_t)ps->index)
            continue;
        uint32_t t = 0;
        if (cfx__ps_map_block(m, i, &t, NULL, NULL) != CFX_OK || !m->tensors[t].ready)
            continue; /* pinned where worker 0's init puts it: no state travels */
        const struct ps_block *b = i < ps->nblocks_cap ? ps->blocks[i] : NULL;
        if (b && b->lost && b->moved_to < 0)
            continue; /* its values went with a failed server: no state travels */
        if (!b || b->moved_to >= 0 || !b->param)
            return false; /* its state is still on its way here */
    }
    return true;
}

/*
 * While a server drains, the scheduler retires it only once every owner
 * under the current map holds its blocks' state: only then is no STATE
 * from (or through) the draining server still travelling, and the
 * retirement, which makes every server stop listening to it and lets it
 * end, loses nothing.  Tell the scheduler when that holds here.
 */
static void report_settled(struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    if (ps->sched || ps->settled_sent >= m->version || (m->flags & PS_MAP_SHUTDOWN))
        return; /* the scheduler looks at its own blocks itself */
    bool draining = false;
    for (uint32_t i = 0; i < m->nservers; i++)
        draining |= m->server[i].state == CFX_PS_SERVER_DRAINING;
    struct ps_peer *sch = ps->servers[0];
    if (!draining || !sch || sch->closed || !cfx__ps_server_settled(ps))
        return;
    struct ps_hdr h = { .type = PS_MSG_SETTLED, .clock = m->version };
    if (cfx__ps_send(ps, sch, &h, NULL, 0, NULL) == CFX_OK)
        ps->settled_sent = m->version;
}

/* ---- routing ------------------------------------------------------------------------ */

static uint32_t me(const struct cfx_ps *ps)
{
    return (uint32_t)ps->index;
}

/* Route one request; true when it was consumed (false: keep as orphan). */
static bool route(struct cfx_ps *ps, struct ps_hdr *h, void *payload, bool owned)
{
    struct ps_block *b = block_slot(ps, h->block, false);
    bool owner_here = h->block < ps->map.nblocks && ps->map.owner[h->block] == me(ps);
    if (b && b->moved_to < 0 && b->param) {
        process(ps, b, h, payload, owned);
        return true;
    }
    if (h->map_version > ps->map.version || owner_here)
        return false; /* our map is behind, or the state is on its way here */
    if (b && b->moved_to >= 0) {
        forward(ps, (uint32_t)b->moved_to, h, payload, owned);
        return true;
    }
    redirect(ps, h);
    if (owned)
        free(payload);
    return true;
}

static void orphan(struct cfx_ps *ps, const struct ps_hdr *h, void *payload, bool owned)
{
    if (awaits_the_gone(ps, h->block)) {
        /* its state is not coming: the server that held it went before
         * handing it over (no replication, docs/PARAMETER_SERVER.md) */
        reply(ps, h, CFX_ERR_PEER_FAILED, NULL, false);
        if (owned)
            free(payload);
        return;
    }
    struct ps_pend *p = pend_new(h, payload, owned);
    if (!p) {
        reply(ps, h, CFX_ERR_NOMEM, NULL, false);
        if (owned)
            free(payload);
        return;
    }
    p->deadline = cfx__deadline_ns(ps->timeout_ms);
    cfx_list_add_tail(&p->link, &ps->orphans);
}

static void run_orphans(struct cfx_ps *ps)
{
    struct cfx_list todo;
    cfx_list_init(&todo);
    /* move the list aside: route() may add new orphans */
    if (cfx_list_empty(&ps->orphans))
        return;
    todo = ps->orphans;
    todo.next->prev = &todo;
    todo.prev->next = &todo;
    cfx_list_init(&ps->orphans);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &todo)
    {
        struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
        cfx_list_del(pos);
        if (route(ps, &p->h, p->payload, true)) {
            free(p);
        } else if (awaits_the_gone(ps, p->h.block)) {
            /* held before the map that says so came: fail it now, not
             * at its deadline */
            reply(ps, &p->h, CFX_ERR_PEER_FAILED, NULL, false);
            pend_free(p);
        } else {
            cfx_list_add_tail(&p->link, &ps->orphans);
        }
    }
}

static int create_from_init(struct cfx_ps *ps, const struct ps_hdr *h, const void *payload)
{
    struct ps_block *b = block_slot(ps, h->block, true);
    if (!b)
        return CFX_ERR_NOMEM;
    int rc = block_alloc(ps, b);
    if (rc == CFX_OK && (h->len != b->bytes || !payload))
        rc = CFX_ERR_INVALID;
    if (rc != CFX_OK) {
        block_free_arrays(b); /* not created: a retried INIT creates it */
        return rc;
    }
    memcpy(b->param, payload, b->bytes);
    b->moved_to = -1;
    return CFX_OK;
}

int cfx__ps_server_handle(struct cfx_ps *ps, const struct ps_hdr *hin, void *payload, bool owned)
{
    struct ps_hdr h = *hin;
    h.held_ns = 0; /* ours to count, from here */
    if (h.map_version > ps->map.version)
        cfx__ps_map_fetch(ps, h.map_version); /* the sender saw a newer map: get it now */
    if (h.type == PS_MSG_STATE) {
        bool lost = h.status != CFX_OK;
        int rc = lost ? install_lost(ps, &h) : install_state(ps, &h, payload);
        if (owned)
            free(payload);
        if (rc != CFX_OK) {
            CFX_LOG(ERR, PS, "job %s: server %d: bad state of block %u from server %u: %s", ps->job,
                    ps->index, h.block, h.from & 0xffff, cfx_strerror(rc));
            return rc;
        }
        struct ps_block *b = ps->blocks[h.block];
        if (h.block < ps->map.nblocks && ps->map.owner[h.block] != me(ps)) {
            /* a newer map moved it on */
            if (lost)
                hand_lost(ps, b, ps->map.owner[h.block]);
            else
                migrate(ps, b, ps->map.owner[h.block]);
        }
        run_orphans(ps);
        report_settled(ps);
        return CFX_OK;
    }
    if (h.type != PS_MSG_REQ)
        return CFX_ERR_PROTO;
    if (h.worker >= ps->map.nworkers) {
        if (owned)
            free(payload);
        return CFX_ERR_PROTO;
    }
    struct ps_block *ib = h.kind == PS_REQ_INIT ? block_slot(ps, h.block, false) : NULL;
    if (h.kind == PS_REQ_INIT && (!ib || !ib->param) && h.block < ps->map.nblocks &&
        ps->map.owner[h.block] == me(ps)) {
        int rc = create_from_init(ps, &h, payload);
        reply(ps, &h, rc, NULL, false);
        if (owned)
            free(payload);
        run_orphans(ps);
        return CFX_OK;
    }
    if (!route(ps, &h, payload, owned))
        orphan(ps, &h, payload, owned);
    return CFX_OK;
}

/* Which server the state of each block this map gives us comes from: its
 * owner under the map before (none known after a map that skipped
 * versions). */
static void note_sources(struct cfx_ps *ps)
{
    const struct ps_map *m = &ps->map;
    /* a map that skipped versions: the owner we knew may have handed the
     * block on already, and its death says nothing of the state's way here */
    const bool next = ps->owner_was_version + 1 == m->version;
    for (uint32_t i = 0; i < m->nblocks; i++) {
        struct ps_block *b = i < ps->nblocks_cap ? ps->blocks[i] : NULL;
        if (m->owner[i] != me(ps)) {
            if (b)
                b->from = 0;
            continue;
        }
        /* the map says its values were lost (the scheduler moved it off a
         * failed server): so whichever versions this server saw, where
         * the rule below needs the map before (its owner then) */
        uint32_t mark = cfx__ps_map_lost(m, i);
        if (mark) {
            b = block_slot(ps, i, true);
            if (b && !(b->moved_to < 0 && b->param) && !(b->moved_to < 0 && b->lost)) {
                block_free_data(b);
                b->moved_to = -1;
                b->from = 0;
                b->lost = mark;
                CFX_LOG(WARN, PS, "job %s: server %d: block %u is ours (map %u) without its "
                        "values: the map says they were lost with failed server %u", ps->job,
                        ps->index, i, m->version, mark - 1);
            }
            continue;
        }
        if (i >= ps->owner_was_n)
            continue;
        if (ps->owner_was[i] != me(ps)) {
            b = block_slot(ps, i, true);
            if (b && !(b->moved_to < 0 && b->param))
                b->from = next ? ps->owner_was[i] + 1u : 0;
        }
        /* its state was to come from a server the map says failed (removed
         * since, or it died handing it over): its values went with it, and
         * none ever comes (no replication) */
        uint32_t was = b && !(b->moved_to < 0 && b->param) && !b->lost ? b->from : 0;
        if (was && was <= m->nservers && m->server[was - 1].state == CFX_PS_SERVER_FAILED) {
            b->lost = was;
            CFX_LOG(WARN, PS, "job %s: server %d: block %u is ours (map %u) without its "
                    "values: they were lost with failed server %u", ps->job, ps->index, i,
                    m->version, was - 1);
        }
    }
    if (m->nblocks > ps->owner_was_n) {
        uint16_t *o = realloc(ps->owner_was, m->nblocks * sizeof(*o));
        if (!o)
            return; /* the next map's sources stay unknown (not the next version) */
        ps->owner_was = o;
    }
    if (m->nblocks)
        memcpy(ps->owner_was, m->owner, m->nblocks * sizeof(*m->owner));
    ps->owner_was_version = m->version;
    ps->owner_was_n = m->nblocks;
}

void cfx__ps_server_peer_gone(struct cfx_ps *ps, uint32_t srv)
{
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ps->orphans)
    {
        struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
        if (awaited_from(ps, p->h.block) != srv + 1)
            continue;
        CFX_LOG(WARN, PS, "job %s: server %d: block %u was to come from server %u, which is "
                "gone; failing worker %u's request", ps->job, ps->index, p->h.block, srv,
                p->h.worker);
        cfx_list_del(pos);
        reply(ps, &p->h, CFX_ERR_PEER_FAILED, NULL, false);
        pend_free(p);
    }
}

/* Test hook (CFX_PS_TEST_DIE_TENSOR): a server that dies as the scheduler
 * gives it blocks of a tensor being registered, before the scheduler can
 * have seen it go. */
static void die_on_new_tensor(struct cfx_ps *ps)
{
    int t = ps->die_tensor[0] ? cfx__ps_map_find(&ps->map, ps->die_tensor) : -1;
    if (t < 0 || ps->map.tensors[t].ready)
        return;
    const struct ps_tensor *tt = &ps->map.tensors[t];
    for (uint32_t b = tt->first_block; b < tt->first_block + tt->nblocks && b < ps->map.nblocks;
         b++)
        if (ps->map.owner[b] == me(ps)) {
            CFX_LOG(WARN, PS, "job %s: server %d: test hook: killed by map %u, which gives it "
                    "block %u of tensor '%s' before it is ready", ps->job, ps->index,
                    ps->map.version, b, tt->name);
            raise(SIGKILL);
        }
}

void cfx__ps_server_map_changed(struct cfx_ps *ps)
{
    bool slept = false;
    die_on_new_tensor(ps);
    cfx__ps_load_owned(ps);
    note_sources(ps);
    for (uint32_t i = 0; i < ps->nblocks_cap && i < ps->map.nblocks; i++) {
        struct ps_block *b = ps->blocks[i];
        if (b && b->moved_to < 0 && b->lost && ps->map.owner[i] != me(ps)) {
            hand_lost(ps, b, ps->map.owner[i]);
            continue;
        }
        if (b && b->moved_to < 0 && b->param && ps->map.owner[i] != me(ps)) {
            if (ps->migrate_die) {
                /* test hook: a server that dies while it hands its blocks over */
                CFX_LOG(WARN, PS, "job %s: server %d: test hook: killed before handing block "
                        "%u over (map %u)", ps->job, ps->index, i, ps->map.version);
                raise(SIGKILL);
            }
            if (ps->migrate_delay_ms && !slept) {
                /* test hook: a server slow to hand its blocks over */
                CFX_LOG(WARN, PS, "job %s: server %d: test hook: migrations of map %u wait %u ms",
                        ps->job, ps->index, ps->map.version, ps->migrate_delay_ms);
                usleep(ps->migrate_delay_ms * 1000u);
                slept = true;
            }
            migrate(ps, b, ps->map.owner[i]);
        }
    }
    run_orphans(ps);
    report_settled(ps);
}

/*
 * A request held for half the job's timeout: its worker hears which
 * workers' pushes the version it waits for still lacks, so that the error
 * of a request that runs out of time names the worker that holds the round
 * (under BSP a server answers once every worker pushed the step), not the
 * server that waits for it.  A deferred push waits for the current round; a
 * parked pull for its min_version.
 */
static void tell_waiting(struct cfx_ps *ps, const struct ps_block *b, struct ps_pend *p,
                         bool pull)
{
    uint64_t want = pull ? p->h.min_version : b->version + 1;
    uint32_t first = UINT32_MAX, n = 0;
    for (uint32_t w = 0; w < b->nworkers; w++) {
        if (b->pushed[w] >= want)
            continue;
        if (!n++)
            first = w;
    }
    p->told = true;
    struct ps_peer *to = p->h.worker < PS_MAX_WORKERS ? ps->workers[p->h.worker] : NULL;
    if (!n || !to || to->closed)
        return;
    struct ps_hdr h = {
        .type = PS_MSG_WAITING,
        .kind = p->h.kind,
        .worker = p->h.worker,
        .block = b->id,
        .req_id = p->h.req_id,
        .clock = first,
        .min_version = want,
        .forwarded = n,
    };
    cfx__ps_send(ps, to, &h, NULL, 0, NULL);
}

/* 1 + a gone worker (cfx__ps_server_worker_gone) whose push of a round
 * before version @p want @p b still lacks, or 0. */
static uint32_t gone_lagging(const struct cfx_ps *ps, const struct ps_block *b, uint64_t want)
{
    for (uint32_t w = 0; w < b->nworkers && w < PS_MAX_WORKERS; w++)
        if (ps->worker_gone[w] && b->pushed[w] < want)
            return w + 1;
    return 0;
}

/* Deferred pushes and parked pulls their workers gave up on (held past
 * twice the job's timeout: the worker's request ended at one) go, with
 * their payload copies; a push that never comes (its worker's request
 * failed on another block) no longer holds every later one for ever.  Those
 * held for a round or a version that lacks a gone worker's push fail now,
 * naming it: that push never comes.  (A deferred push waits for the round
 * after the current: every worker's push of the current one.) */
static int expire_waiting(struct cfx_ps *ps, uint64_t now)
{
    uint64_t max_ns = 2ull * (uint64_t)CFX_MAX(ps->timeout_ms, 1) * 1000000ull;
    int n = 0;
    for (uint32_t i = 0; i < ps->nblocks_cap; i++) {
        struct ps_block *b = ps->blocks[i];
        if (!b)
            continue;
        struct cfx_list *lists[] = { &b->deferred, &b->parked };
        for (unsigned l = 0; l < 2; l++) {
            struct cfx_list *pos, *tmp;
            cfx_list_for_each_safe(pos, tmp, lists[l])
            {
                struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
                uint32_t g = ps->any_worker_gone
                                 ? gone_lagging(ps, b, l ? p->h.min_version : b->version + 1)
                                 : 0;
                if (g) {
                    CFX_LOG(INFO, PS, "job %s: server %d: block %u: worker %u's %s of step "
                            "%" PRIu64 " waits for worker %u, which is gone: failed", ps->job,
                            ps->index, b->id, p->h.worker, l ? "pull" : "push", p->h.clock,
                            g - 1);
                    cfx_list_del(pos);
                    reply_gone(ps, &p->h, CFX_ERR_PEER_FAILED, NULL, false, g);
                    pend_free(p);
                    n++;
                    continue;
                }
                if (!p->told && now - p->since >= max_ns / 4)
                    tell_waiting(ps, b, p, l == 1);
                if (now - p->since < max_ns)
                    continue;
                CFX_LOG(WARN, PS, "job %s: server %d: block %u: worker %u's %s of step %" PRIu64
                        " waited %llu ms; dropped (its request has ended)", ps->job, ps->index,
                        b->id, p->h.worker, l ? "pull" : "push", p->h.clock,
                        (unsigned long long)((now - p->since) / 1000000));
                cfx_list_del(pos);
                reply(ps, &p->h, CFX_ERR_TIMEOUT, NULL, false);
                pend_free(p);
                n++;
            }
        }
    }
    return n;
}

void cfx__ps_server_worker_gone(struct cfx_ps *ps, uint32_t w)
{
    if (w >= PS_MAX_WORKERS || ps->worker_gone[w])
        return;
    ps->worker_gone[w] = true;
    ps->any_worker_gone = true;
    expire_waiting(ps, cfx__now_ns()); /* what waits for it fails now, not on a tick */
}

int cfx__ps_server_tick(struct cfx_ps *ps)
{
    int n = 0;
    uint64_t now = cfx__now_ns();
    struct cfx_list *pos, *tmp;
    if (ps->timeout_ms > 0 && now - ps->expire_at < (1ull << 63)) {
        ps->expire_at = now + 100000000ull; /* every 100 ms */
        n += expire_waiting(ps, now);
    }
    cfx_list_for_each_safe(pos, tmp, &ps->orphans)
    {
        struct ps_pend *p = cfx_list_entry(pos, struct ps_pend, link);
        if (now < p->deadline)
            continue;
        CFX_LOG(WARN, PS,
                "job %s: server %d: block %u never arrived here (map %u); failing "
                "worker %u's request",
                ps->job, ps->index, p->h.block, ps->map.version, p->h.worker);
        cfx_list_del(pos);
        reply(ps, &p->h, CFX_ERR_TIMEOUT, NULL, false);
        pend_free(p);
        n++;
    }
    return n;
}

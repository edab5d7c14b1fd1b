/*
 * Collectives: the messages of a running collective (eager pieces, the
 * header in front of a first message), the tuning table and the dispatch of
 * a call to its schedule.  The argument check is coll_check.c.
 */
#include "coll.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"
#include "gpu/memtype.h"

/* ---- tuning table -------------------------------------------------------------
 *
 * The one place where schedules are chosen.  Rows are tried in order; the
 * first whose kind matches, whose message size (bytes of the whole vector of
 * one rank) is at most max_bytes, whose group has at least min_ranks ranks
 * (and a power of two of them, where the row says so) wins.  The numbers
 * come from loopback measurements on a small host (docs/COLLECTIVES.md,
 * "Selection", has them) and the usual shapes (NCCL, Open MPI tuned):
 * latency-bound recursive doubling and binomial trees for small vectors,
 * halving-doubling in between, bandwidth-optimal rings and pipelined chains
 * for large ones.
 */
#define COLL_SMALL_MAX (8u << 10) /* largest "small" vector: latency-bound schedules */

struct coll_tune_row {
    enum coll_kind kind;
    size_t max_bytes;
    int min_ranks;
    bool pow2;                  /* only groups whose size is a power of two */
    enum cfx_algo algo;
};

static const struct coll_tune_row coll_tune[] = {
    /* kind               max_bytes       ranks pow2   algo */
    { COLL_ALLREDUCE,      COLL_SMALL_MAX, 2,    true,  CFX_ALGO_RECDBL },
    { COLL_ALLREDUCE,      COLL_SMALL_MAX, 3,    false, CFX_ALGO_TREE },
    { COLL_ALLREDUCE,      256u << 10,     3,    false, CFX_ALGO_RHD },
    { COLL_ALLREDUCE,      SIZE_MAX,       1,    false, CFX_ALGO_RING },
    { COLL_BROADCAST,      8u << 10,       3,    false, CFX_ALGO_TREE },
    { COLL_BROADCAST,      64u << 10,      9,    false, CFX_ALGO_TREE },
    { COLL_BROADCAST,      SIZE_MAX,       1,    false, CFX_ALGO_CHAIN },
    { COLL_REDUCE,         8u << 10,       3,    false, CFX_ALGO_TREE },
    { COLL_REDUCE,         64u << 10,      9,    false, CFX_ALGO_TREE },
    { COLL_REDUCE,         SIZE_MAX,       1,    false, CFX_ALGO_CHAIN },
    { COLL_ALLGATHER,      SIZE_MAX,       1,    false, CFX_ALGO_RING },
    { COLL_REDUCE_SCATTER, SIZE_MAX,       1,    false, CFX_ALGO_RING },
    { COLL_GATHER,         SIZE_MAX,       1,    false, CFX_ALGO_DIRECT },
    { COLL_SCATTER,        SIZE_MAX,       1,    false, CFX_ALGO_DIRECT },
    { COLL_ALLTOALL,       SIZE_MAX,       1,    false, CFX_ALGO_DIRECT },
    { COLL_BARRIER,        SIZE_MAX,       1,    false, CFX_ALGO_RECDBL },
};

/* Which algorithms each collective has (bit per enum cfx_algo). */
static const unsigned coll_applies[COLL_KIND_LAST] = {
    [COLL_BARRIER] = 1u << CFX_ALGO_RECDBL | 1u << CFX_ALGO_DIRECT,
    [COLL_ALLREDUCE] = 1u << CFX_ALGO_RING | 1u << CFX_ALGO_RHD | 1u << CFX_ALGO_DBTREE |
                       1u << CFX_ALGO_TREE | 1u << CFX_ALGO_CHAIN | 1u << CFX_ALGO_RECDBL,
    [COLL_BROADCAST] = 1u << CFX_ALGO_TREE | 1u << CFX_ALGO_CHAIN,
    [COLL_REDUCE] = 1u << CFX_ALGO_TREE | 1u << CFX_ALGO_CHAIN,
    [COLL_ALLGATHER] = 1u << CFX_ALGO_RING | 1u << CFX_ALGO_DIRECT,
    [COLL_REDUCE_SCATTER] = 1u << CFX_ALGO_RING | 1u << CFX_ALGO_DIRECT,
    [COLL_GATHER] = 1u << CFX_ALGO_DIRECT,
    [COLL_SCATTER] = 1u << CFX_ALGO_DIRECT,
    [COLL_ALLTOALL] = 1u << CFX_ALGO_DIRECT,
};

static const char *const coll_kind_names[COLL_KIND_LAST] = {
    [COLL_BARRIER] = "barrier",         [COLL_ALLREDUCE] = "allreduce",
    [COLL_BROADCAST] = "broadcast",     [COLL_REDUCE] = "reduce",
    [COLL_ALLGATHER] = "allgather",     [COLL_REDUCE_SCATTER] = "reduce_scatter",
    [COLL_GATHER] = "gather",           [COLL_SCATTER] = "scatter",
    [COLL_ALLTOALL] = "alltoall",
};

const char *cfx__coll_kind_name(enum coll_kind kind)
{
    return kind > 0 && kind < COLL_KIND_LAST ? coll_kind_names[kind] : "collective";
}

enum cfx_algo cfx__coll_choose(const struct cfx_group *g, enum coll_kind kind, size_t bytes,
                          enum cfx_algo forced)
{
    enum cfx_algo table = CFX_ALGO_DIRECT;
    /* Under CFX_COLL_CHECK=2 every call of a small group sends its header
     * to every rank: a barrier does too, so that a rank that called
     * something else meets the same pattern and every rank fails alike. */
    if (kind == COLL_BARRIER && g->check == COLL_CHECK_ALL && g->size <= AGREE_ALL_MAX)
        return CFX_ALGO_DIRECT;
    for (size_t i = 0; i < CFX_ARRAY_SIZE(coll_tune); i++) {
        const struct coll_tune_row *t = &coll_tune[i];
        if (t->kind == kind && bytes <= t->max_bytes && g->size >= t->min_ranks &&
            (!t->pow2 || (g->size & (g->size - 1)) == 0)) {
            table = t->algo;
            break;
        }
    }
    if (forced == CFX_ALGO_AUTO)
        forced = g->env_algo;
    if (forced == CFX_ALGO_AUTO || forced == table)
        return table;
    if (forced > CFX_ALGO_AUTO && forced < CFX_ALGO_LAST && (coll_applies[kind] >> forced & 1))
        return forced;
    CFX_LOG(DEBUG, COLL, "group %s: %s has no %s schedule; using %s", g->name,
            cfx__coll_kind_name(kind), cfx_algo_name(forced), cfx_algo_name(table));
    return table;
}

/* ---- the double binary tree ---------------------------------------------------
 *
 * Tree 0 is a binary tree over ranks in which a rank's height is the number
 * of trailing zero bits of its number (as NCCL builds it): odd ranks are
 * leaves, rank 0 is the root with one child.  Tree 1 is tree 0 mirrored
 * (rank -> n-1-rank) for even n and shifted by one for odd n, so that the
 * interior ranks of one tree are leaves of the other and each rank sends
 * and receives about one half of the vector in each direction.
 */
static void btree(int n, int rank, int *parent, int *c0, int *c1)
{
    int bit;
    for (bit = 1; bit < n; bit <<= 1)
        if (bit & rank)
            break;
    if (rank == 0) {
        *parent = -1;
        *c0 = -1;
        *c1 = n > 1 ? bit >> 1 : -1;
        return;
    }
    int up = (rank ^ bit) | (bit << 1);
    if (up >= n)
        up = rank ^ bit;
    *parent = up;
    int low = bit >> 1;
    *c0 = low == 0 ? -1 : rank - low;
    int d1 = low == 0 ? -1 : rank + low;
    while (d1 >= n) {
        low >>= 1;
        d1 = low == 0 ? -1 : rank + low;
    }
    *c1 = d1;
}

void cfx__coll_dtree(int n, int rank, int t, int *parent, int *child0, int *child1)
{
    if (t == 0) {
        btree(n, rank, parent, child0, child1);
        return;
    }
    int u, d0, d1;
    if (n % 2) {
        btree(n, coll_mod(rank - 1, n), &u, &d0, &d1);
        *parent = u < 0 ? -1 : (u + 1) % n;
        *child0 = d0 < 0 ? -1 : (d0 + 1) % n;
        *child1 = d1 < 0 ? -1 : (d1 + 1) % n;
    } else {
        btree(n, n - 1 - rank, &u, &d0, &d1);
        *parent = u < 0 ? -1 : n - 1 - u;
        *child0 = d1 < 0 ? -1 : n - 1 - d1;
        *child1 = d0 < 0 ? -1 : n - 1 - d0;
    }
}

/* ---- messages ------------------------------------------------------------------ */


static int msg_slot(struct coll_exec *x)
{
    if (x->nmsgs == x->cap) {
        int cap = x->cap ? 2 * x->cap : 64;
        struct coll_msg *m = realloc(x->msgs, (size_t)cap * sizeof(*m));
        if (!m)
            return cfx__err(CFX_ERR_NOMEM, "%s #%" PRIu32 ": out of memory", x->what,
                            x->a->seq);
        x->msgs = m;
        x->cap = cap;
    }
    return x->nmsgs++;
}

/*
 * A message of device data travels as a host copy in an arena buffer (the
 * bounce): a send copies its bytes out on x->stream and waits for them (the
 * copy is ordered after the kernels that made them), a receive lands in the
 * bounce and is copied to the device when it is waited for.
 */
static void bounce_free(struct coll_exec *x, void *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&x->g->ctx->lock);
    cfx__arena_free(x->g->ctx, b);
    pthread_mutex_unlock(&x->g->ctx->lock);
}

static int bounce_out(struct coll_exec *x, const void *dev, size_t len, void **out)
{
    int fd;
    uint64_t off;
    int rc = cfx__arena_alloc(x->g->ctx, len, out, &fd, &off);
    if (rc != CFX_OK)
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d: no host memory of %zu bytes to stage "
                        "device data", x->what, x->a->seq, x->g->rank, len);
    if (!dev)
        return CFX_OK;
    rc = cfx__memcpy_typed_wait(*out, CFX_MEMTYPE_HOST, dev, x->mt, len, x->stream);
    if (rc != CFX_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        bounce_free(x, *out);
        *out = NULL;
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d: copy of %zu bytes from the device: %s",
                        x->what, x->a->seq, x->g->rank, len, why);
    }
    return CFX_OK;
}

int cfx__coll_post_on(struct coll_exec *x, uint64_t chan, int peer, bool send, void *buf,
                   size_t len, enum cfx_memtype mt)
{
    struct cfx_group *g = x->g;
    void *bounce = NULL;
    if (mt != CFX_MEMTYPE_HOST && len) {
        int rc = bounce_out(x, send ? buf : NULL, len, &bounce);
        if (rc != CFX_OK)
            return rc;
    }
    int h = msg_slot(x);
    if (h < 0) {
        bounce_free(x, bounce);
        return h;
    }
    struct coll_msg *m = &x->msgs[h];
    m->peer = peer;
    m->send = send;
    m->hdr = false;
    m->req = NULL;
    m->bounce = bounce;
    m->dev = bounce && !send ? buf : NULL;
    m->len = len;
    m->front = false;
    m->pfx = NULL;
    m->user = NULL;
    m->off = 0;
    m->chk = false;
    m->chk_in = false;
    m->prev_h = -1;
    void *wire = bounce ? bounce : buf;
    m->wire = wire;
    if (bounce)
        mt = CFX_MEMTYPE_HOST;
    /* x->more: the next post is another piece to this peer (post_split) */
    /* the check channel's messages (a question, news that the call failed)
     * must pass data the peer will never take (coll_check.c) */
    bool urgent = send && chan == g->chan_chk && mt == CFX_MEMTYPE_HOST;
    int rc = urgent ? cfx__p2p_isend_urgent(g->ctx, &g->nodes[peer], chan, x->tag, wire, len,
                                            &m->req)
             : send && x->more && mt == CFX_MEMTYPE_HOST
                 ? cfx__p2p_isend_more(g->ctx, &g->nodes[peer], chan, x->tag, wire, len, &m->req)
             : send ? cfx__p2p_isend(g->ctx, &g->nodes[peer], chan, x->tag, wire, len, mt, &m->req)
                    : cfx__p2p_irecv(g->ctx, &g->nodes[peer], chan, x->tag, wire, len, mt,
                                     &m->req);
    if (rc != CFX_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        m->req = NULL;
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d cannot post a %s rank %d: %s", x->what,
                        x->a->seq, g->rank, send ? "send to" : "receive from", peer, why);
    }
    return h;
}

static int post(struct coll_exec *x, int peer, bool send, void *buf, size_t len,
                enum cfx_memtype mt)
{
    return cfx__coll_post_on(x, x->g->chan, peer, send, buf, len, mt);
}


/*
 * A message of the call's data.  With the check along the messages, the
 * first one between two ranks in each direction carries the sender's
 * header: in front of the payload (one message, through a copy) up to
 * COLL_HDR_INLINE bytes, else as a message of its own just before it.  Both
 * sides decide from the message's size, so they agree unless the sizes
 * already disagree (which fails the message itself).
 */
/* The header in front of @p len bytes of payload, in one message. */
static int post_front(struct coll_exec *x, int peer, bool send, void *buf, size_t len)
{
    const size_t hl = sizeof(struct coll_hdr);
    const bool dev = x->mt != CFX_MEMTYPE_HOST;
    char *p = NULL;
    int rc;
    if (dev) {
        if ((rc = bounce_out(x, NULL, hl + len, (void **)&p)) != CFX_OK)
            return rc;
    } else if (!(p = malloc(hl + len))) {
        return cfx__err(CFX_ERR_NOMEM, "%s #%" PRIu32 ": out of memory", x->what, x->a->seq);
    }
    if (send) {
        memcpy(p, &x->hdr, hl);
        if (!dev)
            memcpy(p + hl, buf, len);
        else if (len && (rc = cfx__memcpy_typed_wait(p + hl, CFX_MEMTYPE_HOST, buf, x->mt, len,
                                                     x->stream)) != CFX_OK) {
            char why[256];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            bounce_free(x, p);
            return cfx__err(rc, "%s #%" PRIu32 ": rank %d: copy of %zu bytes from the device: "
                            "%s", x->what, x->a->seq, x->g->rank, len, why);
        }
    }
    int h = post(x, peer, send, p, hl + len, CFX_MEMTYPE_HOST);
    if (h < 0) {
        if (dev)
            bounce_free(x, p);
        else
            free(p);
        return h;
    }
    struct coll_msg *m = &x->msgs[h];
    m->front = true;
    m->len = len;
    if (!send)
        x->hrx[peer] = h;
    if (dev) {
        m->bounce = p;
        m->dev = send ? NULL : buf;
        m->off = hl;
    } else {
        m->pfx = p;
        m->user = buf;
    }
    return h;
}

size_t cfx__coll_split_max(const struct cfx_group *g, int peer)
{
    const struct cfx_node_rec *me = &g->ctx->self, *p = &g->nodes[peer];
    return cfx__node_addr(me, "shm") && cfx__node_addr(p, "shm") &&
                   !strncmp(me->host_id, p->host_id, CFX_HOST_ID_MAX)
               ? COLL_SPLIT_MAX_SHM
               : COLL_SPLIT_MAX;
}

/*
 * A message of more than one eager send and at most cfx__coll_split_max()
 * bytes goes as eager pieces of CFX_EAGER_LIMIT bytes (the first with the header
 * in front when it carries one), not by rendezvous: no request to the
 * sender and back before the data moves, which cost a 4 KiB .. 16 KiB
 * message several times an eager one (beyond 16 KiB the pieces cost more
 * than the round trip: a 4-rank 64 KiB allreduce's 32 KiB exchanges took
 * 0.94 ms in pieces, 0.81 ms by rendezvous, at 1 Gbit/s).  Pieces of host memory go straight
 * from and into the caller's buffer.  The handle is the last piece's;
 * waiting for it waits for the pieces before it first (prev_h), so the
 * header is checked before any of the payload is used.
 */
static int post_split(struct coll_exec *x, int peer, bool send, void *buf, size_t len,
                      bool front)
{
    size_t off = 0;
    int prev = -1;
    if (front) {
        x->more = send;
        prev = post_front(x, peer, send, buf, COLL_HDR_INLINE);
        x->more = false;
        if (prev < 0)
            return prev;
        off = COLL_HDR_INLINE;
    }
    while (off < len) {
        size_t n = CFX_MIN(len - off, (size_t)CFX_EAGER_LIMIT);
        x->more = send && off + n < len; /* the pieces of a send leave together */
        int h = post(x, peer, send, (char *)buf + off, n, x->mt);
        x->more = false;
        if (h < 0)
            return h;
        x->msgs[h].prev_h = prev;
        prev = h;
        off += n;
    }
    return prev;
}

/* Whether a message of @p len bytes to or from @p peer may go as pieces:
 * within the call's COLL_SPLIT_BUDGET for that peer and direction.  Both
 * sides count the same messages in the same order, so they decide alike. */
static bool split_budget(struct coll_exec *x, int peer, bool send, size_t len, bool front)
{
    size_t n = front ? 1 + (len - COLL_HDR_INLINE + CFX_EAGER_LIMIT - 1) / CFX_EAGER_LIMIT
                     : (len + CFX_EAGER_LIMIT - 1) / CFX_EAGER_LIMIT;
    uint16_t *used = &x->split_used[2 * peer + send];
    if (*used + n > COLL_SPLIT_BUDGET)
        return false;
    *used = (uint16_t)(*used + n);
    return true;
}

/*
 * A message of the call's data.  With the check along the messages, the
 * first one between two ranks in each direction carries the sender's
 * header: in front of the payload (one message, through a copy) up to
 * COLL_HDR_INLINE bytes, in front of the first piece of a split message,
 * else as a message of its own just before it.  Both sides decide from the
 * message's size, so they agree unless the sizes already disagree (which
 * fails the message itself).
 */
static int post_data(struct coll_exec *x, int peer, bool send, void *buf, size_t len)
{
    const uint8_t bit = send ? EDGE_SENT : EDGE_RECVD;
    const bool front = x->edges && !(x->dir[peer] & bit);
    if (front)
        x->dir[peer] |= bit;
    const size_t hl = front ? sizeof(struct coll_hdr) : 0;
    if (hl + len > CFX_EAGER_LIMIT && len <= cfx__coll_split_max(x->g, peer) &&
        split_budget(x, peer, send, len, front))
        return post_split(x, peer, send, buf, len, front);
    if (!front)
        return post(x, peer, send, buf, len, x->mt);
    if (len <= COLL_HDR_INLINE)
        return post_front(x, peer, send, buf, len);
    int h = post(x, peer, send, send ? (void *)&x->hdr : (void *)&x->hin[peer], hl,
                 CFX_MEMTYPE_HOST);
    if (h < 0)
        return h;
    x->msgs[h].hdr = true;
    if (!send)
        x->hrx[peer] = h;
    int d = post(x, peer, send, buf, len, x->mt);
    if (d >= 0)
        x->msgs[d].prev_h = h; /* the data is used only after its header is checked */
    return d;
}

/* Wait for the device copies queued so far and free the bounces they read. */
static int held_drain(struct coll_exec *x)
{
    int rc = x->nheld ? cfx__memtype_sync(x->mt, x->stream) : CFX_OK;
    char why[256];
    snprintf(why, sizeof(why), "%s", rc != CFX_OK ? cfx_last_error() : "");
    for (int i = 0; i < x->nheld; i++)
        bounce_free(x, x->held[i]);
    x->nheld = 0;
    x->held_bytes = 0;
    if (rc != CFX_OK) {
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d: device copies failed: %s", x->what,
                        x->a->seq, x->g->rank, why);
    }
    return CFX_OK;
}

/* A message of device data is done: a receive's bytes go on to the device
 * (queued; its bounce is kept until a sync says the copy ran), a send's
 * bounce is free at once. */
static int bounce_done(struct coll_exec *x, struct coll_msg *m)
{
    void *b = m->bounce;
    m->bounce = NULL;
    if (m->send) {
        bounce_free(x, b);
        return CFX_OK;
    }
    int rc = cfx__memcpy_typed_async(m->dev, x->mt, (char *)b + m->off, CFX_MEMTYPE_HOST,
                                     m->len, x->stream);
    if (rc != CFX_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        cfx__memtype_sync(x->mt, x->stream); /* nothing of ours may still read b */
        bounce_free(x, b);
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d: copy of %zu bytes to the device: %s",
                        x->what, x->a->seq, x->g->rank, m->len, why);
    }
    if (x->nheld == x->held_cap) {
        int cap = x->held_cap ? 2 * x->held_cap : 16;
        void **n = realloc(x->held, (size_t)cap * sizeof(*n));
        if (!n) {
            cfx__memtype_sync(x->mt, x->stream); /* the copy from b has run */
            bounce_free(x, b);
            return held_drain(x);
        }
        x->held = n;
        x->held_cap = cap;
    }
    x->held[x->nheld++] = b;
    x->held_bytes += (m->len + 4095) & ~(size_t)4095; /* arena segments are whole pages */
    /* each bounce is an arena segment with a descriptor of its own */
    return x->held_bytes >= COLL_BOUNCE_HELD || x->nheld >= COLL_BOUNCE_HELD_N ? held_drain(x)
                                                                               : CFX_OK;
}

int cfx__coll_send(struct coll_exec *x, int peer, const void *buf, size_t len)
{
    return post_data(x, peer, true, (void *)buf, len);
}

int cfx__coll_recv(struct coll_exec *x, int peer, void *buf, size_t len)
{
    return post_data(x, peer, false, buf, len);
}

/* A message is done: check a header that came with it, then hand the
 * payload on (or free what carried it). */
static int msg_done(struct coll_exec *x, struct coll_msg *m)
{
    if (m->chk_in)
        return cfx__coll_chk_check(x, m->peer, &x->cin[m->peer]);
    if (x->edges && !m->send) {
        const void *h = m->front ? (m->pfx ? m->pfx : m->bounce) : m->hdr ? &x->hin[m->peer] : NULL;
        int rc = h ? cfx__coll_hdr_check(x, m->peer, h) : CFX_OK;
        if (rc != CFX_OK)
            return rc; /* the carrier is freed by coll_cleanup() */
    }
    if (m->pfx) {
        if (!m->send && m->len)
            memcpy(m->user, (char *)m->pfx + sizeof(struct coll_hdr), m->len);
        free(m->pfx);
        m->pfx = NULL;
        return CFX_OK;
    }
    return m->bounce ? bounce_done(x, m) : CFX_OK;
}

static int coll_wait_one(struct coll_exec *x, int h);

int cfx__coll_wait(struct coll_exec *x, int h)
{
    if (x->msgs[h].prev_h >= 0) {
        int rc = cfx__coll_wait(x, x->msgs[h].prev_h);
        if (rc != CFX_OK)
            return rc;
    }
    return coll_wait_one(x, h);
}

/* Message @p h, the one before it done. */
static int coll_wait_one(struct coll_exec *x, int h)
{
    struct coll_msg *m = &x->msgs[h];
    if (!m->req)
        return CFX_OK;
    struct cfx_group *g = x->g;
    int dead;
    bool stopped;
    /* checking along the messages, a wait that runs long sends our header
     * to the rank waited for (edge_ask_one): a rank waiting for a message
     * that a rank of another opinion will never send learns of it that way */
    bool ask = x->listen && !(x->dir[m->peer] & EDGE_ASKED);
    uint64_t until = ask ? CFX_MIN(x->ask_at, x->deadline) : x->deadline;
    int rc;
    x->wait_peer = m->peer; /* what this rank waits for, should news stop the wait */
    for (;;) {
        rc = cfx__p2p_wait_stop(m->req, until, g->ids, g->size, &dead, cfx__coll_stop, x,
                                &stopped);
        if (rc != CFX_ERR_TIMEOUT || stopped || until == x->deadline)
            break;
        cfx__coll_ask(x, m->peer); /* may move x->msgs */
        m = &x->msgs[h];
        until = x->deadline;
    }
    if (stopped && x->failed_h && !x->canceled && x->bad_rank < 0 && x->news_rank < 0 &&
        x->gave_rank < 0) {
        /* another message of the call failed: its error (final: this
         * wait returns at once) is the call's */
        int f = x->failed_h - 1;
        x->failed_h = 0;
        return coll_wait_one(x, f);
    }
    if (stopped) /* the headers disagree: this message may never come */
        return cfx__coll_stopped(x);
    if (rc == CFX_OK) {
        cfx__p2p_free(m->req);
        m->req = NULL;
        x->wait_peer = -1;
        return msg_done(x, m);
    }
    /* failed or timed out: left for coll_cleanup() to withdraw */
    if (dead >= 0)
        return cfx__coll_member_gone(x, dead);
    if (rc == CFX_ERR_TIMEOUT && cfx__group_moved(g))
        return cfx__coll_moved_fail(x);
    if (rc == CFX_ERR_TIMEOUT) {
        char why[256];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        x->blame_rank = m->peer;
        x->blame_why = COLL_WHY_TIMEOUT;
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d waited for rank %d (node %u): timed out "
                        "after %d ms (%s)", x->what, x->a->seq, g->rank, m->peer,
                        g->nodes[m->peer].node_id, x->timeout_ms, why);
    }
    /* the peer died, or gave the call up (a failure elsewhere) and withdrew */
    return cfx__coll_msg_failed(x, m->peer, m->send, rc);
}

int cfx__coll_wait_all(struct coll_exec *x)
{
    for (int h = 0; h < x->nmsgs; h++) {
        if (x->msgs[h].chk)
            continue; /* advisory: chk_finish() */
        int rc = cfx__coll_wait(x, h);
        if (rc != CFX_OK)
            return rc;
    }
    return CFX_OK;
}

int cfx__coll_sendrecv(struct coll_exec *x, int to, const void *sbuf, size_t slen, int from,
                  void *rbuf, size_t rlen)
{
    int hs = cfx__coll_send(x, to, sbuf, slen);
    if (hs < 0)
        return hs;
    int hr = cfx__coll_recv(x, from, rbuf, rlen);
    if (hr < 0)
        return hr;
    int rc = cfx__coll_wait(x, hr);
    return rc != CFX_OK ? rc : cfx__coll_wait(x, hs);
}

/* This thread's stack, [stack_lo, stack_hi) (stack_hi 0: not known yet;
 * stack_lo UINTPTR_MAX: not known at all). */
static __thread uintptr_t stack_lo, stack_hi;

/* Is @p p in this thread's stack below @p live, the frame running now: in a
 * frame that has returned?  Only said when @p live is on that stack too (a
 * call run on a coroutine's or a signal's stack is not checked). */
static bool in_returned_frame(const void *p, const void *live)
{
    if (!stack_hi) {
        pthread_attr_t at;
        void *lo = NULL;
        size_t sz = 0;
        if (pthread_getattr_np(pthread_self(), &at) == 0) {
            if (pthread_attr_getstack(&at, &lo, &sz) != 0)
                lo = NULL;
            pthread_attr_destroy(&at);
        }
        stack_lo = lo ? (uintptr_t)lo : UINTPTR_MAX;
        stack_hi = lo ? (uintptr_t)lo + sz : 1;
    }
    uintptr_t here = (uintptr_t)live;
    return here >= stack_lo && here < stack_hi && (uintptr_t)p >= stack_lo &&
           (uintptr_t)p < here;
}

/* A message still running whose buffer was a local of a function that has
 * returned: the transfer would read or write a frame that is gone (a defect
 * of the schedule that posted it; the frame's memory is another's now).
 * Stopped here, as a transport called off the progress lock is. */
static void stale_buffer(const struct coll_exec *x, const struct coll_msg *m)
{
    CFX_LOG(ERR, COLL, "group %s rank %d: %s #%" PRIu32 ": a %s rank %d of %zu bytes is still "
            "posted on a buffer in a stack frame that has returned", x->g->name, x->g->rank,
            x->what, x->a->seq, m->send ? "send to" : "receive from", m->peer, m->len);
    abort();
}

/*
 * After a failure: receives still running are withdrawn at once; sends get
 * a short grace period first, so a peer that is about to take its message
 * (and find the failure itself, e.g. an argument mismatch) still gets it.
 * When the headers showed a disagreement (@p hdr_only), every peer learns
 * it from the headers: only those are worth the wait.  Nothing waits for a
 * rank that takes nothing more of the call (cfx__coll_peer_out).
 */
static void coll_cleanup(struct coll_exec *x, bool hdr_only)
{
    uint64_t grace = CFX_MIN(x->deadline, cfx__deadline_ns(COLL_SEND_GRACE_MS));
    const void *here = __builtin_frame_address(0);
    for (int h = 0; h < x->nmsgs; h++)
        if (x->msgs[h].req && in_returned_frame(x->msgs[h].wire, here))
            stale_buffer(x, &x->msgs[h]);
    for (int h = 0; h < x->nmsgs; h++) {
        struct coll_msg *m = &x->msgs[h];
        if (!m->req || !m->send || (!m->hdr && hdr_only))
            continue;
        /* nobody takes what was sent to a rank known gone, or one that
         * gave this call up (its receives withdrawn): no grace (it cost
         * every call queued behind a death, or a rank's cancel, half a
         * second).  A live rank still in the call keeps it: a send
         * withdrawn under it would fail its receive (NOT_FOUND) before
         * the news of the cause reached it.  A call this rank canceled
         * (its request freed, Ctrl-C) keeps no send its peer has not asked
         * for: the peer learns the cause from the news, and the wait only
         * held up the cancel by the whole grace when the peer was late. */
        if (cfx__coll_peer_out(x, m->peer) || (x->canceled && cfx__p2p_send_unasked(m->req)))
            continue;
        cfx__p2p_wait(m->req, grace);
    }
    /* Withdrawn from the last posted to the first: messages of one peer and
     * tag match in posting order, so while they go one by one what is left
     * is always the head of the sequence.  First to last, the peer could
     * match our message k+1 with its k in between (ours k withdrawn): a
     * size mismatch (CFX_ERR_INVALID) instead of the cause, or with equal
     * sizes the wrong bytes taken as its message k. */
    for (int h = x->nmsgs - 1; h >= 0; h--) {
        struct coll_msg *m = &x->msgs[h];
        if (m->req)
            cfx__p2p_free(m->req);
        m->req = NULL;
        /* withdrawn: no transfer touches the bounce, and no device copy
         * was queued from it (that happens only when a receive is done) */
        bounce_free(x, m->bounce);
        m->bounce = NULL;
        free(m->pfx);
        m->pfx = NULL;
    }
    x->nmsgs = 0;
}

/* ---- scratch, copies and reductions ------------------------------------------ */

/* Device scratch for calls on device buffers, kept by the group. */
static int dev_scratch(struct coll_exec *x, size_t len, void **out)
{
    struct cfx_group *g = x->g;
    if (g->dscratch_len < len) {
        /* a kernel of this call may still read the old one */
        int rc = cfx__memtype_sync(x->mt, x->stream);
        if (rc != CFX_OK)
            return rc;
        cfx__memtype_free(x->mt, g->dscratch);
        g->dscratch = NULL;
        g->dscratch_len = 0;
        size_t want = CFX_MAX(len, (size_t)1 << 20);
        rc = cfx__memtype_alloc(x->mt, want, &g->dscratch);
        if (rc != CFX_OK)
            return cfx__err(rc, "%s #%" PRIu32 ": no device scratch memory of %zu bytes: %s",
                            x->what, x->a->seq, want, cfx_last_error());
        g->dscratch_len = want;
    }
    *out = g->dscratch;
    return CFX_OK;
}

int cfx__coll_scratch(struct coll_exec *x, size_t len, void **out)
{
    struct cfx_group *g = x->g;
    if (len == 0)
        len = 1;
    if (x->mt != CFX_MEMTYPE_HOST)
        return dev_scratch(x, len, out);
    if (g->scratch_len < len) {
        /* arena memory: registered once and mapped by shm peers, so
         * messages into and out of it take the fewest copies */
        cfx_buf_free(g->ctx, g->scratch);
        g->scratch = NULL;
        g->scratch_len = 0;
        size_t want = CFX_MAX(len, (size_t)1 << 20);
        int rc = cfx_buf_alloc(g->ctx, want, &g->scratch);
        if (rc != CFX_OK)
            return cfx__err(rc, "%s #%" PRIu32 ": no scratch memory of %zu bytes", x->what,
                            x->a->seq, want);
        g->scratch_len = want;
    }
    *out = g->scratch;
    return CFX_OK;
}

int cfx__coll_copy(struct coll_exec *x, void *dst, const void *src, size_t len)
{
    if (dst == src || len == 0)
        return CFX_OK;
    if (x->mt == CFX_MEMTYPE_HOST) {
        memmove(dst, src, len);
        return CFX_OK;
    }
    return cfx__memcpy_typed_async(dst, x->mt, src, x->mt, len, x->stream);
}

int cfx__coll_reduce(struct coll_exec *x, void *dst, const void *src, size_t n)
{
    if (x->mt != CFX_MEMTYPE_HOST)
        return cfx__memtype_reduce3(x->mt, dst, dst, src, n, x->a->dtype, x->a->op, x->stream);
    return cfx_reduce(dst, src, n, x->a->dtype, x->a->op);
}

int cfx__coll_reduce3(struct coll_exec *x, void *dst, const void *a, const void *b, size_t n)
{
    if (x->mt != CFX_MEMTYPE_HOST)
        return cfx__memtype_reduce3(x->mt, dst, a, b, n, x->a->dtype, x->a->op, x->stream);
    return cfx_reduce3(dst, a, b, n, x->a->dtype, x->a->op);
}

size_t cfx__coll_seg_elems(const struct coll_exec *x, size_t bytes)
{
    size_t seg = x->g->seg_bytes;
    (void)bytes;
    size_t e = seg / x->esz;
    return e ? e : 1;
}


/* ---- dispatch ------------------------------------------------------------------- */

static int run_schedule(struct coll_exec *x);

/*
 * Agreement, schedule and the wait for every message.  A barrier is the
 * agreement exchange itself (all-to-all in small groups, a dissemination
 * barrier in larger ones); small groups check the other calls alongside
 * their data.  On failure the messages still posted are withdrawn.
 */
static int coll_exec_run(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    const struct coll_args *a = x->a;
    struct coll_agree ag;
    struct coll_hdr in[AGREE_ALL_MAX];
    int rh[AGREE_ALL_MAX];
    const bool all = g->check == COLL_CHECK_ALL || a->kind == COLL_BARRIER;
    /* a barrier exchanges in log2 n rounds unless forced to all-to-all */
    bool alongside = all && g->size > 1 && g->size <= AGREE_ALL_MAX &&
                     !(a->kind == COLL_BARRIER && x->algo != CFX_ALGO_DIRECT);
    int rc = CFX_OK;

    cfx__coll_strays_sweep(x, false);
    if (alongside)
        rc = cfx__coll_agree_post(x, &ag, in, rh);
    else if (all && g->size > 1)
        rc = cfx__coll_agree_all(x);
    bool posted = rc == CFX_OK;
    x->gate = rc == CFX_OK && alongside && cfx__coll_writes_input(x);
    if (x->gate && !cfx__coll_gate_deferred(x))
        rc = cfx__coll_agree_gate(x);
    if (rc == CFX_OK && (a->kind == COLL_BARRIER || a->count > 0))
        rc = run_schedule(x);
    else if (rc == CFX_OK && x->edges)
        rc = cfx__coll_check_empty(x);
    if (rc == CFX_OK)
        rc = cfx__coll_wait_all(x);
    if (alongside && posted)
        rc = cfx__coll_agree_finish(x, rc);
    if (x->listen)
        rc = cfx__coll_check_end(x, rc);
    /* CFX_ERR_INVALID of this rank's own (a device kernel refused a buffer
     * after data came in) is no disagreement: told as one, the others would
     * say that it "got a message of another size" */
    const bool disagree = rc == CFX_ERR_INVALID && x->disagree;
    if (rc != CFX_OK && !disagree && g->size > 1) {
        /* gave up (a rank died, a wait timed out, a failure of its own):
         * the others hear why before anything is withdrawn, and what is
         * left of this call tells nothing of its arguments */
        cfx__coll_gave_up(x, rc);
        pthread_mutex_lock(&g->ctx->lock);
        g->quiet = true;
        g->quiet_seq = a->seq;
        pthread_mutex_unlock(&g->ctx->lock);
    }
    if (g->size > 1)
        cfx__coll_strays_sweep(x, true);
    x->agree = NULL;
    x->gate = false;
    if (rc == CFX_OK)
        cfx__coll_news_forget(x);
    if (rc != CFX_OK) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", cfx_last_error());
        /* without headers (CFX_COLL_CHECK=0) the data is what tells a peer
         * of the disagreement: its sends keep their grace */
        coll_cleanup(x, disagree && (alongside || x->listen));
        cfx__err(rc, "%s", keep);
    }
    return rc;
}

/*
 * Send and receive buffers that overlap other than as the call's in-place
 * form (group.h: the same pointer; allgather and gather: the rank's own
 * block of the receive buffer; reduce-scatter and scatter: the rank's block
 * of the send buffer) would be read after they were written: every rank
 * returned CFX_OK with wrong data.  Refused, as MPI calls it erroneous.
 */
static int overlap_check(const struct cfx_group *g, const struct coll_args *a, const char *what,
                         size_t c)
{
    const size_t cn = c * (size_t)g->size, mine = (size_t)g->rank * c;
    const uintptr_t s = (uintptr_t)a->sbuf, r = (uintptr_t)a->rbuf;
    size_t sb, rb;
    bool in_place;
    switch (a->kind) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE: sb = c, rb = c, in_place = s == r; break;
    case COLL_ALLTOALL: sb = cn, rb = cn, in_place = s == r; break;
    case COLL_ALLGATHER:
    case COLL_GATHER: sb = c, rb = cn, in_place = s == r + mine; break;
    case COLL_REDUCE_SCATTER:
    case COLL_SCATTER: sb = cn, rb = c, in_place = r == s + mine; break;
    default: return CFX_OK;
    }
    if (in_place || !(s < r + rb && r < s + sb))
        return CFX_OK;
    return cfx__err(CFX_ERR_INVALID, "%s: the send and receive buffers overlap, and not as the "
                    "call's in-place form (include/conflux/group.h)", what);
}

/* Bytes of one rank's vector that decide the schedule. */
static size_t vector_bytes(const struct coll_args *a, size_t esz, int size)
{
    if (a->kind == COLL_REDUCE_SCATTER)
        return a->count * esz * (size_t)size;
    return a->count * esz;
}

static int run_schedule(struct coll_exec *x)
{
    const struct coll_args *a = x->a;
    struct cfx_group *g = x->g;
    const void *s = a->sbuf;
    void *r = a->rbuf;
    size_t bytes = a->count * x->esz;

    switch (a->kind) {
    case COLL_BARRIER:
        return CFX_OK; /* the agreement exchange was the barrier */
    case COLL_ALLREDUCE:
        if (g->size == 1)
            return cfx__coll_copy(x, r, s, bytes);
        switch (x->algo) {
        case CFX_ALGO_RECDBL: return cfx__coll_allreduce_recdbl(x, s, r);
        case CFX_ALGO_RHD: return cfx__coll_allreduce_rhd(x, s, r);
        case CFX_ALGO_DBTREE: return cfx__coll_allreduce_dbtree(x, s, r);
        case CFX_ALGO_TREE:
        case CFX_ALGO_CHAIN: {
            int rc = x->algo == CFX_ALGO_TREE ? cfx__coll_reduce_tree(x, s, r, 0)
                                             : cfx__coll_reduce_chain(x, s, r, 0);
            if (rc == CFX_OK)
                rc = x->algo == CFX_ALGO_TREE ? cfx__coll_bcast_tree(x, r, 0)
                                              : cfx__coll_bcast_chain(x, r, 0);
            return rc;
        }
        default: return cfx__coll_allreduce_ring(x, s, r);
        }
    case COLL_BROADCAST:
        if (g->size == 1)
            return CFX_OK;
        return x->algo == CFX_ALGO_TREE ? cfx__coll_bcast_tree(x, r, a->root)
                                        : cfx__coll_bcast_chain(x, r, a->root);
    case COLL_REDUCE:
        if (g->size == 1)
            return cfx__coll_copy(x, r, s, bytes);
        return x->algo == CFX_ALGO_TREE ? cfx__coll_reduce_tree(x, s, r, a->root)
                                        : cfx__coll_reduce_chain(x, s, r, a->root);
    case COLL_ALLGATHER:
        if (g->size == 1)
            return cfx__coll_copy(x, r, s, bytes);
        return x->algo == CFX_ALGO_DIRECT ? cfx__coll_allgather_direct(x, s, r)
                                          : cfx__coll_allgather_ring(x, s, r);
    case COLL_REDUCE_SCATTER:
        if (g->size == 1)
            return cfx__coll_copy(x, r, s, bytes);
        return x->algo == CFX_ALGO_DIRECT ? cfx__coll_reduce_scatter_direct(x, s, r)
                                          : cfx__coll_reduce_scatter_ring(x, s, r);
    case COLL_GATHER:
        return cfx__coll_gather_direct(x, s, r, a->root);
    case COLL_SCATTER:
        return cfx__coll_scatter_direct(x, s, r, a->root);
    case COLL_ALLTOALL:
        return cfx__coll_alltoall_pairwise(x, s, r);
    default:
        return cfx__err(CFX_ERR_INVALID, "unknown collective %d", (int)a->kind);
    }
}

int cfx__coll_check(struct cfx_group *g, const struct coll_args *a, const char *what)
{
    const uint64_t m = a->params.field_mask;
    int rc = cfx__mask_check(m, CFX_COLL_PARAM_ALL, what, "cfx_coll_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    if ((m & CFX_COLL_PARAM_TIMEOUT) && a->params.timeout_ms < 1)
        return cfx__err(CFX_ERR_INVALID, "%s: timeout %d ms: every call has a deadline "
                        "(>= 1 ms)", what, a->params.timeout_ms);
    if (a->kind != COLL_BARRIER) {
        if (cfx_dtype_size(a->dtype) == 0)
            return cfx__err(CFX_ERR_INVALID, "%s: unknown dtype %d", what, (int)a->dtype);
        /* No buffer holds more than PTRDIFF_MAX bytes: a count beyond that is
         * a caller's mistake, and would be copied or sent as if it were not
         * (an in-place call of one rank returned CFX_OK, another wrote past
         * its buffers) */
        if (a->count && a->count > (size_t)PTRDIFF_MAX / cfx_dtype_size(a->dtype) /
                                       (size_t)g->size)
            return cfx__err(CFX_ERR_INVALID, "%s: count %zu overflows: %d rank(s) of %zu-byte "
                            "elements need more than %td bytes", what, a->count, g->size,
                            cfx_dtype_size(a->dtype), PTRDIFF_MAX);
    }
    if (coll_has_op(a->kind) && ((int)a->op < 0 || a->op >= CFX_OP_LAST))
        return cfx__err(CFX_ERR_INVALID, "%s: unknown reduction op %d", what, (int)a->op);
    if (coll_has_root(a->kind) && (a->root < 0 || a->root >= g->size))
        return cfx__err(CFX_ERR_INVALID, "%s: root %d is not a rank of group %s (size %d)",
                        what, a->root, g->name, g->size);
    if ((m & CFX_COLL_PARAM_ALGO) && ((int)a->params.algo < 0 || a->params.algo >= CFX_ALGO_LAST))
        return cfx__err(CFX_ERR_INVALID, "%s: unknown algorithm %d", what, (int)a->params.algo);
    if (m & CFX_COLL_PARAM_MEMTYPE) {
        enum cfx_memtype mt = a->params.memtype;
        if ((int)mt < 0 || mt >= CFX_MEMTYPE_LAST)
            return cfx__err(CFX_ERR_INVALID, "%s: unknown memory type %d", what, (int)mt);
        /* built without CUDA: UNSUPPORTED; no driver or device: NO_DEVICE */
        rc = cfx__memtype_require(mt, what);
        if (rc != CFX_OK)
            return rc;
    }
    /* buffers: NULL only where nothing is read or written */
    size_t bytes = a->count * (a->kind == COLL_BARRIER ? 0 : cfx_dtype_size(a->dtype));
    if (bytes) {
        bool root = g->rank == a->root;
        bool need_s = true, need_r = true;
        switch (a->kind) {
        case COLL_BROADCAST: need_s = false; break;
        case COLL_REDUCE: need_r = root; break;
        case COLL_GATHER: need_r = root; break;
        case COLL_SCATTER: need_s = root; break;
        default: break;
        }
        if ((need_s && !a->sbuf) || (need_r && !a->rbuf))
            return cfx__err(CFX_ERR_INVALID, "%s: NULL buffer", what);
        if (need_s && need_r)
            return overlap_check(g, a, what, bytes);
    }
    return CFX_OK;
}

/* ---- device buffers ------------------------------------------------------------
 *
 * A collective on device memory runs the same schedule with x->mt = the
 * device type: scratch is device memory of the group's, copies and
 * reductions are queued on one stream (the caller's, CFX_COLL_PARAM_STREAM;
 * else the group's own, ordered after the work queued on the default
 * stream), and every message crosses the wire as a host copy (post(),
 * bounce_done()): a send's bytes come off the device when it is posted
 * (ordered after the kernels that made them), a receive's go on to it when
 * it is waited for (ordered before the kernels that read them).  Pipelined
 * schedules so stage segment i+1 while segment i is on the wire, and reduce
 * with the device kernels where the data lives.  The call returns with the
 * result in place (the stream synchronized).  The wire carries host bytes,
 * so ranks may mix device and host buffers in one call.
 */
static int coll_run_dev(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    const struct coll_args *a = x->a;
    int rc = CFX_OK;

    if (a->params.field_mask & CFX_COLL_PARAM_STREAM && a->params.stream) {
        x->stream = a->params.stream;
    } else {
        /* the group's, ordered after the default stream (one call of the
         * group runs at a time: no lock) */
        rc = cfx__memtype_stream_for(x->mt, &g->dstream, NULL, &x->stream);
        if (rc != CFX_OK)
            return cfx__err(rc, "%s #%" PRIu32 ": rank %d: no device stream: %s", x->what,
                            a->seq, g->rank, cfx_last_error());
    }
    rc = coll_exec_run(x);
    /* the result in place and every bounce free, failed or not */
    char keep[512];
    snprintf(keep, sizeof(keep), "%s", rc != CFX_OK ? cfx_last_error() : "");
    int drc = held_drain(x);
    if (drc == CFX_OK)
        drc = cfx__memtype_sync(x->mt, x->stream);
    free(x->held);
    x->held = NULL;
    if (rc != CFX_OK)
        return cfx__err(rc, "%s", keep);
    return drc;
}

/*
 * This rank's own check refused the call (a NULL buffer, a root out of
 * range, ...; a non-blocking one when it was posted, @p a->refused), or its
 * request was canceled before it ran (CFX_ERR_CANCELED: group.c).  The
 * other ranks made theirs: they hear it at once on the check channel, as
 * news of a rank that gave the call up, instead of waiting for this rank's
 * messages until their deadline and blaming each other; and what they sent
 * this rank in the call is dropped without a warning (g->quiet).  Returns
 * @p rc with its text.
 */
/* The schedule the others run for @p a, when this rank's arguments name one
 * (a kind, dtype, count, root and forced algorithm the check passes; a NULL
 * buffer, say, or a cancel): the news of the refusal follows its edges. */
static bool refused_sched(const struct cfx_group *g, const struct coll_args *a,
                          enum cfx_algo *algo)
{
    if (a->kind < COLL_BARRIER || a->kind >= COLL_KIND_LAST)
        return false;
    size_t esz = a->kind == COLL_BARRIER ? 1 : cfx_dtype_size(a->dtype);
    if (!esz || a->count > SIZE_MAX / esz / (size_t)g->size ||
        (coll_has_root(a->kind) && (a->root < 0 || a->root >= g->size)))
        return false;
    enum cfx_algo forced = CFX_ALGO_AUTO;
    if (a->params.field_mask & CFX_COLL_PARAM_ALGO) {
        forced = a->params.algo;
        if ((int)forced < 0 || forced >= CFX_ALGO_LAST)
            return false;
    }
    *algo = cfx__coll_choose(g, a->kind, vector_bytes(a, esz, g->size), forced);
    return true;
}

static int coll_refused(struct cfx_group *g, const struct coll_args *a, const char *what, int rc)
{
    if (g->size < 2 || !g->chan_chk) /* alone, or the joining barrier */
        return rc;
    char keep[512];
    snprintf(keep, sizeof(keep), "%s", cfx_last_error());
    struct coll_exec x = {
        .g = g,
        .a = a,
        .what = what,
        .esz = 1,
        .mt = CFX_MEMTYPE_HOST,
        .tag = a->seq,
        .deadline = cfx__deadline_ns(g->timeout_ms),
        .hdr = { .magic = COLL_HDR_MAGIC, .seq = a->seq, .kind = (uint8_t)a->kind,
                 .dtype = (uint8_t)a->dtype, .op = (uint8_t)a->op, .root = a->root,
                 .count = a->count },
        .bad_rank = -1,
        .news_rank = -1,
        .gave_rank = -1,
        .wait_peer = -1,
        .blame_rank = g->rank,
        .blame_why = rc == CFX_ERR_CANCELED ? COLL_WHY_CANCELED : COLL_WHY_REFUSED,
        .blame_via = -1,
        .blame_status = rc,
    };
    x.sched_unknown = !refused_sched(g, a, &x.algo);
    cfx__coll_gave_up(&x, rc);
    pthread_mutex_lock(&g->ctx->lock);
    g->quiet = true;
    g->quiet_seq = a->seq;
    pthread_mutex_unlock(&g->ctx->lock);
    coll_cleanup(&x, false); /* the news handed over, within a grace */
    free(x.msgs);
    return cfx__err(rc, "%s", keep);
}

int cfx__coll_run(struct cfx_group *g, const struct coll_args *a)
{
    const char *what = cfx__coll_kind_name(a->kind);
    int rc = a->refused ? a->refused : cfx__coll_check(g, a, what);
    bool moved = cfx__group_moved(g); /* nobody to tell: the others dropped this rank */
    if (rc != CFX_OK)
        return moved ? rc : coll_refused(g, a, what, rc);
    if (moved) {
        char call[48];
        snprintf(call, sizeof(call), "%s #%" PRIu32, what, a->seq);
        return cfx__group_moved_err(g, call);
    }
    struct coll_exec x = {
        .g = g,
        .a = a,
        .what = what,
        .esz = a->kind == COLL_BARRIER ? 1 : cfx_dtype_size(a->dtype),
        .mt = (a->params.field_mask & CFX_COLL_PARAM_MEMTYPE) ? a->params.memtype
                                                             : CFX_MEMTYPE_HOST,
        .timeout_ms = (a->params.field_mask & CFX_COLL_PARAM_TIMEOUT) ? a->params.timeout_ms
                                                                     : g->timeout_ms,
        .tag = a->seq,
    };
    x.deadline = cfx__deadline_ns(x.timeout_ms);
    enum cfx_algo forced = (a->params.field_mask & CFX_COLL_PARAM_ALGO) ? a->params.algo
                                                                        : CFX_ALGO_AUTO;
    x.algo = cfx__coll_choose(g, a->kind, vector_bytes(a, x.esz, g->size), forced);

    /* nothing to move: only the argument check talks, so that a rank
     * passing 0 where the others pass more fails like any disagreement
     * (a barrier always talks) */
    bool empty = a->kind != COLL_BARRIER && a->count == 0;
    if (empty && (g->check == COLL_CHECK_OFF || g->size == 1))
        return CFX_OK;
    if (g->size == 1 && a->kind == COLL_BARRIER)
        return CFX_OK;

    /* this rank's header: compared along the messages (or all of them) */
    x.hdr = (struct coll_hdr){
        .magic = COLL_HDR_MAGIC, .seq = a->seq, .kind = (uint8_t)a->kind,
        .dtype = (uint8_t)a->dtype, .op = (uint8_t)a->op, .algo = (uint8_t)x.algo,
        .root = a->root, .count = a->count,
    };
    x.bad_rank = -1;
    x.news_rank = -1;
    x.blame_rank = -1;
    x.blame_via = -1;
    x.gave_rank = -1;
    x.wait_peer = -1;
    x.listen = g->check == COLL_CHECK_EDGES && g->size > 1 && g->chan_chk; /* not while joining */
    x.edges = x.listen && a->kind != COLL_BARRIER;
    if (x.listen) {
        if (!g->edge_dir) {
            g->edge_dir = calloc((size_t)g->size, sizeof(*g->edge_dir));
            g->edge_hin = calloc((size_t)g->size, sizeof(*g->edge_hin));
            g->edge_cin = calloc((size_t)g->size, sizeof(*g->edge_cin));
            g->edge_hrx = calloc((size_t)g->size, sizeof(*g->edge_hrx));
            if (!g->edge_dir || !g->edge_hin || !g->edge_cin || !g->edge_hrx) {
                free(g->edge_dir);
                free(g->edge_hin);
                free(g->edge_cin);
                free(g->edge_hrx);
                g->edge_dir = NULL;
                g->edge_hin = NULL;
                g->edge_cin = NULL;
                g->edge_hrx = NULL;
                return cfx__err(CFX_ERR_NOMEM, "%s #%" PRIu32 ": out of memory", what, a->seq);
            }
        }
        memset(g->edge_dir, 0, (size_t)g->size);
        memset(g->edge_hrx, 0xff, (size_t)g->size * sizeof(*g->edge_hrx)); /* -1 */
        x.dir = g->edge_dir;
        x.hrx = g->edge_hrx;
        x.hin = g->edge_hin;
        x.cin = g->edge_cin;
        x.ask_at = cfx__deadline_ns(COLL_CHECK_ASK_MS);
    }
    if (!g->split_used) {
        g->split_used = calloc(2 * (size_t)g->size, sizeof(*g->split_used));
        if (!g->split_used)
            return cfx__err(CFX_ERR_NOMEM, "%s #%" PRIu32 ": out of memory", what, a->seq);
    }
    memset(g->split_used, 0, 2 * (size_t)g->size * sizeof(*g->split_used));
    x.split_used = g->split_used;

    if (x.mt != CFX_MEMTYPE_HOST && a->kind != COLL_BARRIER && !empty) {
        rc = coll_run_dev(&x); /* device buffers */
        if (rc != CFX_OK)
            CFX_LOG(DEBUG, COLL, "group %s rank %d: %s", g->name, g->rank, cfx_last_error());
        free(x.msgs);
        return rc;
    }
    rc = coll_exec_run(&x);
    if (rc != CFX_OK)
        CFX_LOG(DEBUG, COLL, "group %s rank %d: %s", g->name, g->rank, cfx_last_error());
    free(x.msgs);
    return rc;
}

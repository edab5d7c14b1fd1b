/*
 * Collectives: the argument check, that is, how the ranks find out that
 * they called a collective with different arguments: all ranks' headers
 * exchanged (CFX_COLL_CHECK=2, and every barrier) or the headers riding on
 * the call's own messages (CFX_COLL_CHECK=1, the default), and the
 * messages of failed calls that nobody will receive.
 */
#include "coll.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"

static bool agree_broken(void *arg);
static bool edge_broken(void *arg);
static void edge_ask(struct coll_exec *x, bool failed);
static bool gave_store(struct cfx_group *g, int from, const struct coll_chk_msg *c);
static void gave_record(struct cfx_group *g, const struct cfx_eager_unexp *u);
static bool gave_news(struct coll_exec *x);
static int gave_fail(struct coll_exec *x);

static int post(struct coll_exec *x, int peer, bool send, void *buf, size_t len,
                enum cfx_memtype mt)
{
    return cfx__coll_post_on(x, x->g->chan, peer, send, buf, len, mt);
}

/* ---- argument agreement -------------------------------------------------------
 *
 * Each rank's header goes round in log2 n rounds, carrying the smallest and
 * the largest header seen so far with the ranks they came from: in a group
 * whose size is a power of two, recursive doubling (round k: both ways with
 * rank r ^ 2^k), else a dissemination pattern (round k: to rank r+2^k, from
 * rank r-2^k, ceil(log2 n) rounds).  Afterwards every rank has the minimum
 * and maximum over the whole group; when they differ every rank fails with
 * CFX_ERR_INVALID and can say which two ranks disagree.  This is also the
 * barrier: n log2 n messages, where all-to-all sends n (n - 1), and each
 * costs CPU on both ends (on a host with fewer cores than ranks, or a
 * kernel network path, that is the barrier's time).
 */
static int hdr_cmp(const struct coll_hdr *a, const struct coll_hdr *b)
{
    return memcmp(a, b, sizeof(*a));
}

static void hdr_text(const struct coll_hdr *h, char *buf, size_t len)
{
    const bool op = coll_has_op((enum coll_kind)h->kind);
    snprintf(buf, len, "%s #%" PRIu32 " count %" PRIu64 " %s%s%s root %d algo %s",
             cfx__coll_kind_name((enum coll_kind)h->kind), h->seq, h->count,
             cfx_dtype_name((enum cfx_dtype)h->dtype), op ? " " : "",
             op ? cfx_redop_name((enum cfx_redop)h->op) : "", (int)h->root,
             cfx_algo_name((enum cfx_algo)h->algo));
}

int cfx__coll_agree_all(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    const struct coll_args *a = x->a;
    /* in the call's state, not on this stack: a round that fails leaves its
     * messages to coll_cleanup(), after this returns */
    struct coll_agree_msg *mine = &x->seq_me, *theirs = &x->seq_in;
    struct coll_agree_msg me;
    memset(&me, 0, sizeof(me));
    me.lo.magic = COLL_HDR_MAGIC;
    me.lo.seq = a->seq;
    me.lo.kind = (uint8_t)a->kind;
    me.lo.dtype = (uint8_t)a->dtype;
    me.lo.op = (uint8_t)a->op;
    me.lo.algo = (uint8_t)x->algo;
    me.lo.root = a->root;
    me.lo.count = a->count;
    me.hi = me.lo;
    me.lo_rank = me.hi_rank = g->rank;

    const bool pow2 = (g->size & (g->size - 1)) == 0;
    for (int d = 1; d < g->size; d <<= 1) {
        int to = pow2 ? g->rank ^ d : (g->rank + d) % g->size;
        int from = pow2 ? to : coll_mod(g->rank - d, g->size);
        /* headers live in host memory whatever the buffers are */
        int hr = post(x, from, false, theirs, sizeof(*theirs), CFX_MEMTYPE_HOST);
        if (hr < 0)
            return hr;
        *mine = me;
        int hs = post(x, to, true, mine, sizeof(*mine), CFX_MEMTYPE_HOST);
        if (hs < 0)
            return hs;
        int rc = cfx__coll_wait(x, hr);
        if (rc == CFX_OK)
            rc = cfx__coll_wait(x, hs);
        if (rc != CFX_OK)
            return rc;
        const struct coll_agree_msg in = *theirs;
        if (in.lo.magic != COLL_HDR_MAGIC || in.hi.magic != COLL_HDR_MAGIC)
            return cfx__err(CFX_ERR_PROTO, "%s #%" PRIu32 ": rank %d got a malformed header "
                            "from rank %d", x->what, a->seq, g->rank, from);
        if (hdr_cmp(&in.lo, &me.lo) < 0) {
            me.lo = in.lo;
            me.lo_rank = in.lo_rank;
        }
        if (hdr_cmp(&in.hi, &me.hi) > 0) {
            me.hi = in.hi;
            me.hi_rank = in.hi_rank;
        }
    }
    if (hdr_cmp(&me.lo, &me.hi) == 0)
        return CFX_OK;
    x->disagree = true;
    char t1[160], t2[160];
    hdr_text(&me.lo, t1, sizeof(t1));
    hdr_text(&me.hi, t2, sizeof(t2));
    return cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the ranks disagree on the "
                    "arguments: rank %d called %s, rank %d called %s", x->what, a->seq,
                    g->rank, (int)me.lo_rank, t1, (int)me.hi_rank, t2);
}

/*
 * Small groups exchange the headers all-to-all instead, posted with the
 * data of the call rather than before it: every rank sends its header to
 * every other rank (tag of the call, posted before any data message, so the
 * two sides match them first) and compares all of them once they are in.
 * No round trip is added to the call's critical path.  What the sequential
 * exchange gave for free, this keeps by other means: a rank waiting for a
 * message that a disagreeing peer will never send stops as soon as the
 * headers show the disagreement (agree_broken, checked at every wake-up),
 * and a size disagreement fails the data messages themselves.  Every rank
 * fails with CFX_ERR_INVALID and the same explanation.  An out-of-place
 * call's data may have moved into its receive buffer by then (its content is
 * undefined on error; the send buffer is only read); an in-place call waits
 * for the headers before its first write (agree_gate), so a rejected one
 * leaves the caller's buffer as it was.
 */

/* Lock held: every header is in and two of them differ (or, checking
 * along the messages elsewhere, a rank told us on the check channel). */
static bool agree_broken(void *arg)
{
    struct coll_exec *x = arg;
    if (x->listen && edge_broken(x))
        return true;
    struct coll_agree *ag = x->agree;
    bool differ = false;
    for (int p = 0; p < x->g->size; p++) {
        if (ag->rh[p] < 0)
            continue;
        struct cfx_p2p_req *r = x->msgs[ag->rh[p]].req;
        if (r && cfx__p2p_status_locked(r) != CFX_OK)
            return false;
        if (hdr_cmp(&ag->in[p], &ag->me))
            differ = true;
    }
    return differ;
}

/* The disagreement, from the headers that are in (all of them, or enough to
 * show it), as CFX_ERR_INVALID. */
static int agree_text(struct coll_exec *x, const bool *have)
{
    struct coll_agree *ag = x->agree;
    const struct coll_hdr *lo = &ag->me, *hi = &ag->me;
    int lo_rank = x->g->rank, hi_rank = x->g->rank;
    for (int p = 0; p < x->g->size; p++) {
        if (!have[p])
            continue;
        if (ag->in[p].magic != COLL_HDR_MAGIC)
            return cfx__err(CFX_ERR_PROTO, "%s #%" PRIu32 ": rank %d got a malformed header "
                            "from rank %d", x->what, x->a->seq, x->g->rank, p);
        if (hdr_cmp(&ag->in[p], lo) < 0)
            lo = &ag->in[p], lo_rank = p;
        if (hdr_cmp(&ag->in[p], hi) > 0)
            hi = &ag->in[p], hi_rank = p;
    }
    if (hdr_cmp(lo, hi) == 0)
        return CFX_OK;
    x->disagree = true;
    char t1[160], t2[160];
    hdr_text(lo, t1, sizeof(t1));
    hdr_text(hi, t2, sizeof(t2));
    return cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the ranks disagree on the "
                    "arguments: rank %d called %s, rank %d called %s", x->what, x->a->seq,
                    x->g->rank, lo_rank, t1, hi_rank, t2);
}

/* The headers whose receive completed (the lock taken here). */
static void agree_have(struct coll_exec *x, bool *have)
{
    struct coll_agree *ag = x->agree;
    pthread_mutex_lock(&x->g->ctx->lock);
    for (int p = 0; p < x->g->size; p++) {
        struct cfx_p2p_req *r = ag->rh[p] >= 0 ? x->msgs[ag->rh[p]].req : NULL;
        /* a handle whose request is gone was waited for and completed */
        have[p] = ag->rh[p] >= 0 && (!r || cfx__p2p_status_locked(r) == CFX_OK);
    }
    pthread_mutex_unlock(&x->g->ctx->lock);
}

/* Called when agree_broken() stopped a wait: the headers are in and differ. */
static int agree_fail(struct coll_exec *x)
{
    bool have[AGREE_ALL_MAX];
    agree_have(x, have);
    int rc = agree_text(x, have);
    x->disagree = true; /* agree_broken() saw two headers differ */
    return rc != CFX_OK ? rc : cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the "
                                        "ranks disagree on the arguments", x->what,
                                        x->a->seq, x->g->rank);
}

/* ---- argument check along the messages (CFX_COLL_CHECK=1, the default) ---------
 *
 * The all-ranks exchange above costs every rank a message to and from every
 * other rank per call and makes each call wait for the slowest rank's
 * header: a barrier per call, which keeps a loop of small broadcasts or
 * reduces from overlapping its calls as Open MPI's do.  By default the
 * headers ride on the data instead (post_data(): the first message between
 * two ranks in each direction carries the sender's header) and each
 * receiver compares the header of every rank it hears from in the call:
 *  - a disagreement the messages show (dtype, op, count, root or kind of
 *    a rank one hears from) fails the call with CFX_ERR_INVALID at once on
 *    the rank that sees it, naming both ranks' calls;
 *  - a rank waiting for a message that a rank of another opinion will never
 *    send stops as soon as any first message of the call with another
 *    header reaches it, even one it would not receive (edge_broken() looks
 *    into the unexpected queue), or one on the check channel: a rank that
 *    finds a disagreement sends its header to every rank there (edge_ask()),
 *    once per call; a rank whose wait for a rank has run COLL_CHECK_ASK_MS
 *    sends it to that rank alone (edge_ask_one(), once per rank and call),
 *    which, of another opinion, fails the call and so tells every rank.
 *    Along a chain of waits (a waits for b, b for c) the first pair that
 *    disagrees is found so, while the rank waited for is still in the
 *    call or has not reached it yet; a rank that left the call on another
 *    opinion answers no question (it would not have with every rank
 *    asked), and its waiters end at their deadline, naming it.  Asking
 *    only the rank waited for keeps a long call (a large ring allreduce
 *    waits past COLL_CHECK_ASK_MS on every rank) from connecting every
 *    rank to every other;
 *  - a rank whose part is only sending (a broadcast's root, a reduce's
 *    leaves) returns when its sends are done, unless the disagreement is
 *    already visible then (cfx__coll_check_end()); it has written nothing.
 * So every disagreement fails the call on every rank that waits for data
 * in it, without a message of its own while the ranks agree.  An in-place
 * call may have written its buffer when it fails (CFX_COLL_CHECK=2 keeps
 * it as it was).  Messages of a failed call that nobody will receive are
 * dropped at the end of the next (cfx__coll_check_end()).
 */

static int edge_rank(const struct cfx_group *g, uint32_t node)
{
    for (int q = 0; q < g->size; q++)
        if (g->ids[q] == node)
            return q;
    return -1;
}

/* Another rank's header @p in differs from ours: remember the first. */
static bool edge_differs(struct coll_exec *x, int from, const void *in)
{
    struct coll_hdr h;
    memcpy(&h, in, sizeof(h));
    if (h.magic != COLL_HDR_MAGIC || !memcmp(&h, &x->hdr, sizeof(h)))
        return false;
    if (x->bad_rank < 0) {
        x->bad_rank = from;
        x->bad = h;
    }
    return true;
}

static int edge_fail(struct coll_exec *x)
{
    char t1[160], t2[160];
    int rc;
    const int me = x->g->rank;
    x->disagree = true;
    if (x->bad_rank < 0 && x->news_rank >= 0) {
        /* told by a rank that failed the call */
        const struct coll_chk_msg *c = &x->news;
        hdr_text(&c->me, t1, sizeof(t1));
        if (c->bad_rank >= 0) {
            hdr_text(&c->bad, t2, sizeof(t2));
            rc = cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the ranks disagree on the "
                          "arguments (found by rank %d): rank %d called %s, rank %d called %s",
                          x->what, x->a->seq, me, x->news_rank, x->news_rank, t1,
                          (int)c->bad_rank, t2);
        } else {
            rc = cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the ranks disagree on the "
                          "arguments: rank %d (which called %s) got a message of another size",
                          x->what, x->a->seq, me, x->news_rank, t1);
        }
    } else {
        hdr_text(&x->hdr, t1, sizeof(t1));
        hdr_text(&x->bad, t2, sizeof(t2));
        rc = cfx__err(CFX_ERR_INVALID, "%s #%" PRIu32 ": rank %d: the ranks disagree on the "
                      "arguments: rank %d called %s, rank %d called %s", x->what, x->a->seq,
                      me, me, t1, x->bad_rank, t2);
    }
    edge_ask(x, true); /* the ranks still waiting learn it from us */
    return rc;
}

/* The header that came with a message from rank @p from. */
int cfx__coll_hdr_check(struct coll_exec *x, int from, const void *in)
{
    struct coll_hdr h;
    memcpy(&h, in, sizeof(h));
    if (h.magic != COLL_HDR_MAGIC)
        return cfx__err(CFX_ERR_PROTO, "%s #%" PRIu32 ": rank %d got a malformed header from "
                        "rank %d", x->what, x->a->seq, x->g->rank, from);
    return edge_differs(x, from, &h) ? edge_fail(x) : CFX_OK;
}

/* Unexpected messages of the running call, lock held: a rank's first
 * message of the call (none of its messages posted yet, the first of its
 * in the queue) starts with its header.  Only when that first message is
 * eager here whatever its size (our threshold is the default one or more):
 * else a later message could be taken for it. */
static bool edge_stray(void *arg, const struct cfx_eager_unexp *u)
{
    struct coll_exec *x = arg;
    if (u->tag != x->tag || u->len < sizeof(struct coll_hdr))
        return false;
    int from = edge_rank(x->g, u->node_id);
    if (from < 0 || from == x->g->rank || (x->dir[from] & (EDGE_RECVD | EDGE_SEEN)))
        return false;
    x->dir[from] |= EDGE_SEEN;
    return edge_differs(x, from, u->data);
}

/* A check message from rank @p from: a header of another opinion, or the
 * news that it failed the call.  Remembers the first of each. */
static bool edge_news(struct coll_exec *x, int from, const struct coll_chk_msg *c)
{
    if (c->failed == COLL_CHK_GAVE_UP)
        return false; /* no disagreement: gave_news() */
    if (c->failed) {
        if (c->me.magic != COLL_HDR_MAGIC)
            return false;
        if (x->news_rank < 0) {
            x->news_rank = from;
            x->news = *c;
        }
        return true;
    }
    return edge_differs(x, from, &c->me);
}

/* Messages on the check channel, lock held. */
static bool edge_asked(void *arg, const struct cfx_eager_unexp *u)
{
    struct coll_exec *x = arg;
    if (u->tag != x->tag || u->len != sizeof(struct coll_chk_msg))
        return false;
    int from = edge_rank(x->g, u->node_id);
    if (from < 0 || from == x->g->rank)
        return false;
    struct coll_chk_msg c;
    memcpy(&c, u->data, sizeof(c));
    return edge_news(x, from, &c);
}

/* Receives of the call that are in but not handed on yet (the schedule
 * waits for another rank's message first): their headers count as soon as
 * they land, as a stray's does.  A reduce's root of one algorithm waiting
 * for a child that a rank of another algorithm sends elsewhere had the
 * differing header in hand and waited out its deadline.  Lock held. */
static bool edge_landed(struct coll_exec *x)
{
    for (int q = 0; q < x->g->size; q++) {
        int h = x->hrx[q];
        if (h < 0 || h >= x->nmsgs)
            continue;
        const struct coll_msg *m = &x->msgs[h];
        if (!m->req || cfx__p2p_status_locked(m->req) != CFX_OK)
            continue; /* handed on (and checked), or not in yet */
        const void *in = m->front ? (m->pfx ? m->pfx : m->bounce) : &x->hin[q];
        if (in && edge_differs(x, q, in))
            return true;
    }
    return false;
}

/* Stop predicate of the waits (lock held): a header of another opinion is in. */
static bool edge_broken(void *arg)
{
    struct coll_exec *x = arg;
    struct cfx_context *ctx = x->g->ctx;
    bool bad = x->edges && edge_landed(x);
    if (!bad && x->edges && ctx->cfg.eager_max >= CFX_EAGER_LIMIT) {
        bad = cfx__eager_unexp_scan(ctx, x->g->chan, edge_stray, x);
        for (int q = 0; q < x->g->size; q++)
            x->dir[q] &= (uint8_t)~EDGE_SEEN;
    }
    return bad || cfx__eager_unexp_scan(ctx, x->g->chan_chk, edge_asked, x);
}

static bool rank_gone(struct coll_exec *x, int r);

/* @p c on the check channel to every other rank, or those set in @p only
 * (@p skip_gone: not to the ranks known gone); a post that fails is only
 * logged, as the call is failing or asking anyway. */
static void chk_to_all(struct coll_exec *x, struct coll_chk_msg *c, bool skip_gone,
                       const bool *only)
{
    struct cfx_group *g = x->g;
    for (int d = 1; d < g->size; d++) {
        int to = (g->rank + d) % g->size;
        if (only && !only[to])
            continue;
        if (skip_gone) {
            pthread_mutex_lock(&g->ctx->lock);
            bool gone = rank_gone(x, to);
            pthread_mutex_unlock(&g->ctx->lock);
            if (gone)
                continue;
        }
        int h = cfx__coll_post_on(x, g->chan_chk, to, true, c, sizeof(*c), CFX_MEMTYPE_HOST);
        if (h < 0) {
            CFX_LOG(DEBUG, COLL, "group %s: %s", g->name, cfx_last_error());
            continue;
        }
        x->msgs[h].hdr = true;
        x->msgs[h].chk = true;
    }
}

/* The question this rank asks (edge_ask_one()): its header, set once per
 * call (x is zeroed at the start of a call). */
static struct coll_chk_msg *ask_msg(struct coll_exec *x)
{
    if (x->ask.me.magic != COLL_HDR_MAGIC) {
        memset(&x->ask, 0, sizeof(x->ask));
        x->ask.me = x->hdr;
        x->ask.bad_rank = -1;
    }
    return &x->ask;
}

/* Our header to rank @p to alone, as a question: its wait for that rank ran
 * long (cfx__coll_wait()), or a call of count 0 asks every rank.  Once per
 * rank and call; advisory: a send that fails is dropped, chk_finish() ends
 * the rest. */
static void edge_ask_one(struct coll_exec *x, int to)
{
    if (!x->listen || x->told || to == x->g->rank || (x->dir[to] & EDGE_ASKED))
        return; /* news went to every rank: it says more */
    x->dir[to] |= EDGE_ASKED;
    x->asked = true;
    int h = cfx__coll_post_on(x, x->g->chan_chk, to, true, ask_msg(x), sizeof(x->ask),
                              CFX_MEMTYPE_HOST);
    if (h < 0) {
        CFX_LOG(DEBUG, COLL, "group %s: %s", x->g->name, cfx_last_error());
        return;
    }
    x->msgs[h].hdr = true;
    x->msgs[h].chk = true;
}

/* Our header to every other rank on the check channel: as a question
 * (!@p failed: a call of count 0, each rank once), or once per call as
 * news (@p failed: this rank found a disagreement, or failed on a message
 * whose sizes disagree). */
static void edge_ask(struct coll_exec *x, bool failed)
{
    if (!x->listen)
        return;
    if (!failed) {
        for (int d = 1; d < x->g->size; d++)
            edge_ask_one(x, (x->g->rank + d) % x->g->size);
        return;
    }
    if (x->told)
        return;
    x->told = true;
    x->asked = true;
    struct coll_chk_msg *c = &x->tell;
    memset(c, 0, sizeof(*c));
    c->me = x->hdr;
    c->bad_rank = -1;
    c->failed = COLL_CHK_DISAGREE;
    if (x->bad_rank >= 0) {
        c->bad = x->bad;
        c->bad_rank = x->bad_rank;
    } else if (x->news_rank >= 0) {
        /* pass on what we were told as a pair with us in it (the reader
         * takes c->me for ours): the teller's header where it differs
         * from ours, else the one it found */
        bool teller = memcmp(&x->news.me, &x->hdr, sizeof(x->hdr)) != 0;
        c->bad = teller ? x->news.me : x->news.bad;
        c->bad_rank = teller ? x->news_rank : x->news.bad_rank;
    }
    chk_to_all(x, c, false, NULL);
}

bool cfx__coll_peer_out(struct coll_exec *x, int peer)
{
    struct cfx_group *g = x->g;
    pthread_mutex_lock(&g->ctx->lock);
    const struct coll_gave *n = g->gave ? &g->gave[peer] : NULL;
    bool out = x->gave_rank == peer || rank_gone(x, peer) ||
               (n && n->set && n->seq == x->a->seq) || cfx__group_moved(g);
    pthread_mutex_unlock(&g->ctx->lock);
    return out;
}

/* The advisory sends, given a moment to go (not to a rank that takes
 * nothing more of this call), then freed. */
static void chk_finish(struct coll_exec *x)
{
    if (!x->asked)
        return;
    uint64_t grace = CFX_MIN(x->deadline, cfx__deadline_ns(COLL_SEND_GRACE_MS));
    for (int h = 0; h < x->nmsgs; h++) {
        struct coll_msg *m = &x->msgs[h];
        if (!m->chk || !m->req)
            continue;
        if (!cfx__coll_peer_out(x, m->peer))
            cfx__p2p_wait(m->req, grace);
        cfx__p2p_free(m->req);
        m->req = NULL;
    }
}

/* A call with nothing to move (count 0): its header goes to every rank and
 * it waits for every rank's on the check channel.  Ranks that called with
 * more see ours there and fail, and send theirs. */
int cfx__coll_check_empty(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    edge_ask(x, false);
    for (int d = 1; d < g->size; d++) {
        int from = coll_mod(g->rank - d, g->size);
        int h = cfx__coll_post_on(x, g->chan_chk, from, false, &x->cin[from], sizeof(x->cin[from]),
                        CFX_MEMTYPE_HOST);
        if (h < 0)
            return h;
        x->msgs[h].hdr = true;
        x->msgs[h].chk_in = true;
    }
    return CFX_OK;
}

struct stray_arg {
    struct coll_exec *x;
    bool data;                  /* g->chan, else the check channel */
    bool upto;                  /* this call's too */
};

/* A message of an earlier call (or, @p upto, of this one) that nobody will
 * receive now: one rank runs one call of a group at a time, and by the end
 * of a call every message its schedule expects was received, so what is
 * left belongs to a call that failed or whose ranks disagreed.  One that
 * starts with a header of its call was the first a rank sent in it: nobody
 * took it because nobody expected it, e.g. two ranks that each thought
 * themselves a broadcast's root, so neither waited for anything and neither
 * failed.  That is said as a warning naming the call. */
static bool stray(void *arg, const struct cfx_eager_unexp *u)
{
    struct stray_arg *d = arg;
    struct coll_exec *x = d->x;
    int32_t age = (int32_t)(u->tag - x->tag);
    if (age > 0 || (age == 0 && !d->upto))
        return false;
    if (!d->data) {
        gave_record(x->g, u);
        return true;
    }
    /* left over from a call this rank gave up (a rank died, a wait timed
     * out): its senders' calls may have been alike */
    struct cfx_group *g = x->g;
    if (g->quiet && (int32_t)(u->tag - g->quiet_seq) <= 0)
        return true;
    struct coll_hdr h;
    if (d->data && u->len >= sizeof(h)) {
        memcpy(&h, u->data, sizeof(h));
        if (h.magic == COLL_HDR_MAGIC && h.seq == u->tag && h.kind < COLL_KIND_LAST) {
            char t[160];
            hdr_text(&h, t, sizeof(t));
            CFX_LOG(WARN, COLL, "group %s rank %d: rank %d's message of %s #%" PRIu32 " was "
                    "received by no call: the ranks disagreed on its arguments (rank %d called "
                    "%s); dropped", x->g->name, x->g->rank, edge_rank(x->g, u->node_id),
                    cfx__coll_kind_name((enum coll_kind)h.kind), h.seq,
                    edge_rank(x->g, u->node_id), t);
        }
    }
    return true;
}

/* ctx->lock held: drop the strays of the group's channels, giving their
 * senders the eager credits back (held, they would stall the next calls'
 * messages once a peer's grant is used up). */
static void strays_drop(struct coll_exec *x, bool upto)
{
    struct cfx_group *g = x->g;
    struct stray_arg d = { .x = x, .data = true, .upto = upto };
    x->dropped += cfx__eager_unexp_drop(g->ctx, g->chan, stray, &d);
    if (g->chan_chk) {
        d.data = false;
        x->dropped += cfx__eager_unexp_drop(g->ctx, g->chan_chk, stray, &d);
    }
}

/* A message of the running call that has failed (lock held): 1 + its
 * handle, or 0.  The call fails with it whatever else it waits for, so a
 * wait for another of its messages need not run to the deadline: a send to
 * a rank that will never ask for it (ranks forcing different algorithms,
 * whose receive here already failed on the message sizes, while the news of
 * the other rank's failure waits behind the eager pieces it sent). */
static int msg_failed(const struct coll_exec *x)
{
    for (int h = 0; h < x->nmsgs; h++) {
        const struct coll_msg *m = &x->msgs[h];
        if (!m->req || m->chk)
            continue; /* finished, or advisory */
        int st = cfx__p2p_status_locked(m->req);
        if (st != CFX_OK && st != CFX_ERR_AGAIN)
            return h + 1;
    }
    return 0;
}

/* Stop predicate of every wait of a collective (lock held). */
bool cfx__coll_stop(void *arg)
{
    struct coll_exec *x = arg;
    /* ctx->lock held, as the canceler sets it; or the blocking call's
     * interrupt (on the caller's thread, the only one it stops); or the
     * group's destroy on another thread (group.c "calls in flight") */
    if ((x->a->req && x->a->req->cancel) || (!x->a->req && cfx__intr_fired()) ||
        cfx__group_closing(x->g)) {
        x->canceled = true;
        return true;
    }
    if (cfx__group_moved(x->g))
        return true; /* the others dropped this rank: nothing more comes */
    strays_drop(x, false);
    if (x->agree ? agree_broken(x) : x->listen ? edge_broken(x) : false)
        return true;
    if (gave_news(x))
        return true;
    return (x->failed_h = msg_failed(x)) != 0;
}

/* The strays of earlier calls at the start of a call, and of this one at
 * its end (@p upto). */
void cfx__coll_strays_sweep(struct coll_exec *x, bool upto)
{
    struct cfx_group *g = x->g;
    pthread_mutex_lock(&g->ctx->lock);
    strays_drop(x, upto);
    pthread_mutex_unlock(&g->ctx->lock);
    if (upto && x->dropped)
        CFX_LOG(INFO, COLL, "group %s rank %d: %s #%" PRIu32 ": dropped %d message%s of this "
                "call or earlier ones that no rank will receive", g->name, g->rank, x->what,
                x->a->seq, x->dropped, x->dropped == 1 ? "" : "s");
}

/*
 * End of a call (checking along the messages): a disagreement already
 * visible fails a call that had nothing to wait for; then the messages of
 * this call and older ones still unreceived are dropped (their call failed
 * or their ranks disagreed; every message a rank's schedule expects was
 * received by now), with their senders' credits.
 */
int cfx__coll_check_end(struct coll_exec *x, int rc)
{
    struct cfx_group *g = x->g;
    struct cfx_context *ctx = g->ctx;
    if (rc == CFX_ERR_INVALID && x->disagree) {
        /* e.g. message sizes that disagree: tell the others.  A send to a
         * rank that has left fails meanwhile ("node 2 left the cluster"),
         * which must not become the text of this call's error */
        char why[512];
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        edge_ask(x, true);
        cfx__err(rc, "%s", why);
    }
    pthread_mutex_lock(&ctx->lock);
    bool bad = rc == CFX_OK && edge_broken(x);
    if ((rc == CFX_ERR_CANCELED || rc == CFX_ERR_NOT_FOUND) && !x->canceled) {
        /* a peer withdrew its side of a message (a send withdrawn before we
         * asked for it: NOT_FOUND): if it did so because it found a
         * disagreement, its news is on the way (sent before it withdrew);
         * say that rather than "canceled" or "not found" */
        uint64_t until = CFX_MIN(x->deadline, cfx__deadline_ns(COLL_SEND_GRACE_MS));
        while (!(bad = edge_broken(x)) && cfx__obj_wait(ctx, until))
            ;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (bad) {
        if (rc != CFX_OK)
            CFX_LOG(DEBUG, COLL, "group %s rank %d: %s", g->name, g->rank, cfx_last_error());
        rc = edge_fail(x);
    }
    if (x->asked) {
        /* the check messages' waits must not replace the call's error */
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", rc != CFX_OK ? cfx_last_error() : "");
        chk_finish(x);
        if (rc != CFX_OK)
            cfx__err(rc, "%s", keep);
    }
    return rc;
}

int cfx__coll_agree_post(struct coll_exec *x, struct coll_agree *ag, struct coll_hdr *in,
                         int *rh)
{
    struct cfx_group *g = x->g;
    const struct coll_args *a = x->a;
    memset(ag, 0, sizeof(*ag));
    memset(in, 0, (size_t)g->size * sizeof(*in));
    ag->me.magic = COLL_HDR_MAGIC;
    ag->me.seq = a->seq;
    ag->me.kind = (uint8_t)a->kind;
    ag->me.dtype = (uint8_t)a->dtype;
    ag->me.op = (uint8_t)a->op;
    ag->me.algo = (uint8_t)x->algo;
    ag->me.root = a->root;
    ag->me.count = a->count;
    ag->in = in;
    ag->rh = rh;
    for (int p = 0; p < g->size; p++)
        rh[p] = -1;
    x->agree = ag;
    for (int d = 1; d < g->size; d++) {
        int to = (g->rank + d) % g->size, from = coll_mod(g->rank - d, g->size);
        int h = post(x, to, true, &ag->me, sizeof(ag->me), CFX_MEMTYPE_HOST);
        if (h < 0)
            return h;
        x->msgs[h].hdr = true;
        h = post(x, from, false, &in[from], sizeof(in[from]), CFX_MEMTYPE_HOST);
        if (h < 0)
            return h;
        x->msgs[h].hdr = true;
        rh[from] = h;
    }
    return CFX_OK;
}

/* After the data: the headers decide.  @p rc is how the data went; a
 * disagreement wins over it (it is the reason), anything else keeps it. */
int cfx__coll_agree_finish(struct coll_exec *x, int rc)
{
    struct cfx_group *g = x->g;
    struct coll_agree *ag = x->agree;
    bool have[AGREE_ALL_MAX] = { false };
    int hrc = CFX_OK;
    uint64_t deadline = x->deadline;
    /* the call failed already: the headers say whether a disagreement was
     * the cause; they were posted first, so they are in or nearly in unless
     * their rank is gone or elsewhere (bounded wait).  Their waits set the
     * last error: keep the one that goes with @p rc. */
    char why[512] = "";
    if (rc != CFX_OK) {
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        x->deadline = CFX_MIN(deadline, cfx__deadline_ns(COLL_SEND_GRACE_MS));
    }
    for (int p = 0; p < g->size; p++) {
        if (ag->rh[p] < 0)
            continue;
        int wrc = cfx__coll_wait(x, ag->rh[p]);
        if (wrc == CFX_ERR_INVALID) {
            x->deadline = deadline;
            return wrc; /* another size of header: another collective, or agree_fail */
        }
        if (wrc != CFX_OK) {
            hrc = hrc != CFX_OK ? hrc : wrc;
            continue;
        }
        have[p] = true;
    }
    x->deadline = deadline;
    int arc = agree_text(x, have);
    x->agree = NULL;
    if (arc != CFX_OK)
        return arc;
    if (rc != CFX_OK)
        return cfx__err(rc, "%s", why);
    return hrc;
}

/*
 * Whether the call reads what it writes: its receive range overlaps its send
 * range (in-place, as group.h defines it).  Such a call must not write
 * before the headers agree, or a rejected call would already have changed
 * the caller's input.  A broadcast's buffer is output on every rank but the
 * root, and the root only reads it.
 */
bool cfx__coll_writes_input(const struct coll_exec *x)
{
    const struct coll_args *a = x->a;
    size_t c = a->count * x->esz, cn = c * (size_t)x->g->size, sb, rb;
    switch (a->kind) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE: sb = c, rb = c; break;
    case COLL_ALLGATHER:
    case COLL_GATHER: sb = c, rb = cn; break;
    case COLL_REDUCE_SCATTER:
    case COLL_SCATTER: sb = cn, rb = c; break;
    case COLL_ALLTOALL: sb = cn, rb = cn; break;
    default: return false;
    }
    uintptr_t s = (uintptr_t)a->sbuf, r = (uintptr_t)a->rbuf;
    return s && r && sb && rb && s < r + rb && r < s + sb;
}

/* Before an in-place call writes: wait for every header (posted before
 * any data, so they are in flight already) and fail, having written
 * nothing, when two differ. */
int cfx__coll_agree_gate(struct coll_exec *x)
{
    x->gate = false;
    struct coll_agree *ag = x->agree;
    bool have[AGREE_ALL_MAX] = { false };
    for (int p = 0; p < x->g->size; p++) {
        if (ag->rh[p] < 0)
            continue;
        int rc = cfx__coll_wait(x, ag->rh[p]);
        if (rc != CFX_OK)
            return rc; /* a header of another size is agree_fail's CFX_ERR_INVALID */
        have[p] = true;
    }
    return agree_text(x, have);
}

int cfx__coll_gate(struct coll_exec *x)
{
    return x->gate ? cfx__coll_agree_gate(x) : CFX_OK;
}

/*
 * Schedules that write the caller's buffers only at their end (or never,
 * on some ranks) wait for the headers there (cfx__coll_gate()) instead of
 * before their first message: by then every header has long arrived, since
 * the result depends on every rank, and each sent its header first.  Small
 * in-place calls so pay no wait for the check at all.
 *  - recursive doubling allreduce works in scratch when in place and
 *    copies the result out at the end;
 *  - reduce (tree, chain): only the root writes, its reductions land after
 *    its children's messages, which are received into scratch;
 *  - allreduce as reduce then broadcast (tree, chain): the reduce as above,
 *    and a rank posts the broadcast's receive into recvbuf after the gate
 *    (by then it has sent its part up; the result is a round trip away).
 */
bool cfx__coll_gate_deferred(const struct coll_exec *x)
{
    const struct coll_args *a = x->a;
    if (x->g->size == 1)
        return false;
    if (a->kind == COLL_ALLREDUCE)
        return x->algo == CFX_ALGO_RECDBL || x->algo == CFX_ALGO_TREE ||
               x->algo == CFX_ALGO_CHAIN;
    return a->kind == COLL_REDUCE;
}

int cfx__coll_stopped(struct coll_exec *x)
{
    if (x->canceled) {
        x->blame_rank = x->g->rank;
        x->blame_why = COLL_WHY_CANCELED;
        x->blame_via = -1;
        x->blame_status = CFX_ERR_CANCELED;
        if (cfx__group_closing(x->g))
            return cfx__err(CFX_ERR_CANCELED, "%s #%" PRIu32 ": canceled while it ran: group "
                            "%s was destroyed", x->what, x->a->seq, x->g->name);
        return cfx__err(CFX_ERR_CANCELED, "%s #%" PRIu32 ": canceled while it ran (%s)",
                        x->what, x->a->seq, x->a->req ? "its request was freed, or its group "
                        "destroyed" : "interrupted on its thread");
    }
    if (cfx__group_moved(x->g))
        return cfx__coll_moved_fail(x);
    if (x->bad_rank >= 0 || x->news_rank >= 0)
        return edge_fail(x);
    return x->gave_rank >= 0 ? gave_fail(x) : agree_fail(x);
}

int cfx__coll_moved_fail(struct coll_exec *x)
{
    char call[48];
    snprintf(call, sizeof(call), "%s #%" PRIu32, x->what, x->a->seq);
    x->blame_rank = x->g->rank; /* told to nobody (cfx__coll_gave_up) */
    x->blame_why = COLL_WHY_DIED;
    x->blame_via = -1;
    x->blame_status = 0;
    return cfx__group_moved_err(x->g, call);
}

int cfx__coll_chk_check(struct coll_exec *x, int from, const struct coll_chk_msg *c)
{
    if (c->failed == COLL_CHK_GAVE_UP) {
        /* a call of count 0 took the news as the rank's header */
        struct cfx_group *g = x->g;
        pthread_mutex_lock(&g->ctx->lock);
        bool ok = gave_store(g, from, c);
        pthread_mutex_unlock(&g->ctx->lock);
        if (ok && x->gave_rank < 0)
            x->gave_rank = from;
        return ok ? gave_fail(x)
                  : cfx__err(CFX_ERR_PROTO, "%s #%" PRIu32 ": rank %d got a malformed "
                             "message from rank %d", x->what, x->a->seq, g->rank, from);
    }
    return edge_news(x, from, c) ? edge_fail(x) : CFX_OK;
}

void cfx__coll_ask(struct coll_exec *x, int peer)
{
    edge_ask_one(x, peer);
}

/* ---- failures other than a disagreement ------------------------------------------
 *
 * When a rank dies, the survivors do not all learn it the same way: its
 * neighbours from their connections, the others from the coordinator's death
 * event, which every wait watches.  A survivor that learned it fails the call
 * and withdraws its messages, so a rank whose message with that survivor is
 * still running sees it fail ("peer failed"), possibly before the death event
 * reached it: it would name a living rank.  So a rank that gives a call up
 * for any reason but a disagreement (a rank died or left, a wait timed out,
 * a message failed, an error of its own such as a device kernel that
 * refused a buffer, whatever its code) first tells the ranks of its edges
 * why, on the check channel (struct coll_chk_fail: the rank it blames and
 * how it knows), before it withdraws anything; and a rank whose message
 * with a live-looking peer failed waits briefly (COLL_BLAME_WAIT_MS, woken
 * by every arrival) for that peer's news or a death event before it says
 * what happened:
 *   - a known death (the peer's news, else the coordinator's events, the
 *     earliest first): "rank 2 (node 3) died (...)", whatever message failed;
 *   - the peer's news of another cause: "rank 3 (node 1) gave up the call
 *     because of another failure: rank 3 (node 1) waited for rank 2 (node 3)
 *     until its deadline"; news that the peer waited for this very rank
 *     names what this rank was waiting for itself (gave_fail()), since
 *     this rank is not the one missing;
 *   - the peer's news of an error of its own (refused arguments, a cancel,
 *     a failure of its own): "rank 0 (node 1) gave the call up on an error
 *     of its own (CFX_ERR_INVALID; its own error says which)";
 *   - neither: the message's own failure, saying that the peer is not known
 *     to have died.
 * The news of the call being waited for also stops a wait (a rank waiting
 * for a message that the rank who gave up will never send), like the death
 * watch.  The news is remembered per rank (g->gave) when it arrives after its
 * call ended here, so a rank already in its next call still names the cause;
 * a call that ends well forgets the news of the calls before it.  The
 * leftover messages of a call this rank gave up are dropped without the
 * warning of a disagreement (they show none).
 *
 * The news goes along the call's edges (news_to(), coll_peers.c), not to
 * every rank: told to every rank by every rank that failed, one failure of
 * an n-rank group made up to n (n - 1) messages and connected every rank
 * to every other (a socket, or a queue pair with its receive buffers,
 * each).  A rank that gives up because of news passes it on to its own
 * edges (blame_relay(): still naming the rank that failed first), so it
 * reaches every rank still waiting on it, one hop per rank; coll_peers.c
 * says why for each schedule.  Groups of up to COLL_NEWS_ALL_MAX ranks,
 * and a refusal whose arguments name no schedule, still tell every rank.
 */

static const char *const why_gone[] = { [COLL_WHY_DIED] = "died",
                                        [COLL_WHY_LEFT] = "left the cluster" };

/* ctx->lock held: keep what rank @p from said when it gave up a call. */
static bool gave_store(struct cfx_group *g, int from, const struct coll_chk_msg *c)
{
    const struct coll_chk_fail *f = &c->fail;
    if (c->me.magic != COLL_HDR_MAGIC || f->magic != COLL_FAIL_MAGIC ||
        f->why > COLL_WHY_CANCELED || c->bad_rank < -1 || c->bad_rank >= g->size ||
        f->via < -1 || f->via >= g->size || from < 0 || from >= g->size || from == g->rank)
        return false;
    if (!g->gave)
        return true;
    struct coll_gave *n = &g->gave[from];
    if (n->set && (int32_t)(c->me.seq - n->seq) < 0)
        return true; /* news of a later call is in */
    if (!n->set)
        g->ngave++;
    n->set = true;
    n->seq = c->me.seq;
    n->bad_rank = c->bad_rank;
    n->f = *f;
    if (c->bad_rank < 0 && f->why != COLL_WHY_OTHER)
        n->f.why = COLL_WHY_OTHER;
    return true;
}

/* ctx->lock held: a message on the check channel; gave-up news is kept. */
static bool gave_take(struct cfx_group *g, const struct cfx_eager_unexp *u, int *from)
{
    struct coll_chk_msg c;
    if (u->len != sizeof(c))
        return false;
    memcpy(&c, u->data, sizeof(c));
    if (c.failed != COLL_CHK_GAVE_UP)
        return false;
    *from = edge_rank(g, u->node_id);
    return *from >= 0 && gave_store(g, *from, &c);
}

static void gave_record(struct cfx_group *g, const struct cfx_eager_unexp *u)
{
    int from;
    (void)gave_take(g, u, &from);
}

/* Scan of the check channel (lock held): keep every rank's news, and note
 * the first rank that gave the running call up (x->gave_rank). */
static bool gave_scan(void *arg, const struct cfx_eager_unexp *u)
{
    struct coll_exec *x = arg;
    int from;
    if (!gave_take(x->g, u, &from) || u->tag != x->tag)
        return false;
    if (x->gave_rank < 0)
        x->gave_rank = from;
    return false; /* the rest are kept too */
}

/* Stop predicate (lock held): a rank gave the running call up. */
static bool gave_news(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    if (!g->chan_chk || g->size < 2)
        return false;
    if (x->gave_rank < 0)
        cfx__eager_unexp_scan(g->ctx, g->chan_chk, gave_scan, x);
    return x->gave_rank >= 0;
}

/* Lock held: the group member the coordinator reported gone first (*left:
 * in good order), or -1. */
static int first_gone(struct coll_exec *x, bool *left)
{
    struct cfx_group *g = x->g;
    struct cfx_context *ctx = g->ctx;
    for (unsigned d = 0; d < ctx->ndead; d++) {
        int r = edge_rank(g, ctx->dead[d]);
        if (r >= 0 && r != g->rank) {
            *left = false;
            return r;
        }
    }
    for (unsigned d = 0; d < ctx->nleft; d++) {
        int r = edge_rank(g, ctx->left[d]);
        if (r >= 0 && r != g->rank) {
            *left = true;
            return r;
        }
    }
    return -1;
}

/* Lock held: whether rank @p r is known gone. */
static bool rank_gone(struct coll_exec *x, int r)
{
    return cfx__node_gone(x->g->ctx, x->g->ids[r]) != 0;
}

/* What rank @p teller's news @p n says of the cause. */
static void cause_text(const struct cfx_group *g, int teller, const struct coll_gave *n,
                       char *buf, size_t len)
{
    int w = n->f.via >= 0 ? n->f.via : teller, b = n->bad_rank;
    switch (b < 0 ? COLL_WHY_OTHER : n->f.why) {
    case COLL_WHY_DIED:
    case COLL_WHY_LEFT:
        snprintf(buf, len, "rank %d (node %u) %s", b, g->ids[b], why_gone[n->f.why]);
        break;
    case COLL_WHY_TIMEOUT:
        snprintf(buf, len, "rank %d (node %u) waited for rank %d (node %u) until its deadline",
                 w, g->ids[w], b, g->ids[b]);
        break;
    case COLL_WHY_FAILED:
        snprintf(buf, len, "a message between rank %d (node %u) and rank %d (node %u) failed "
                 "(%s)", w, g->ids[w], b, g->ids[b], cfx_errname(n->f.status));
        break;
    case COLL_WHY_REFUSED:
        snprintf(buf, len, "rank %d (node %u) refused the arguments it was called with (%s; "
                 "its own error says which)", b, g->ids[b], cfx_errname(n->f.status));
        break;
    case COLL_WHY_CANCELED:
        snprintf(buf, len, "rank %d (node %u) canceled the call (its request was freed, its "
                 "group destroyed, or its call interrupted)", b, g->ids[b]);
        break;
    default:
        snprintf(buf, len, "rank %d (node %u) gave the call up on an error of its own (%s; its "
                 "own error says which)", w, g->ids[w], cfx_errname(n->f.status));
        break;
    }
}

static bool news_gone(const struct coll_gave *n)
{
    return n->set && n->bad_rank >= 0 &&
           (n->f.why == COLL_WHY_DIED || n->f.why == COLL_WHY_LEFT);
}

/* Rank @p teller's news @p n is of a failure of its own (it refused its
 * arguments, canceled the call, or failed on an error of its own), not of
 * another rank's. */
static bool news_own(const struct coll_gave *n, int teller)
{
    if (n->bad_rank < 0)
        return n->f.via < 0;
    return n->bad_rank == teller &&
           (n->f.why == COLL_WHY_REFUSED || n->f.why == COLL_WHY_CANCELED);
}

/* Lock held: a rank whose news names a death (not ours), or -1. */
static int news_death(const struct cfx_group *g)
{
    for (int q = 0; g->gave && g->ngave && q < g->size; q++)
        if (news_gone(&g->gave[q]) && g->gave[q].bad_rank != g->rank)
            return q;
    return -1;
}

/* Our failure is blamed on what rank @p teller said (passed on if we tell). */
static void blame_relay(struct coll_exec *x, int teller, const struct coll_gave *n)
{
    x->blame_rank = n->bad_rank;
    x->blame_why = n->bad_rank >= 0 ? n->f.why : (uint8_t)COLL_WHY_OTHER;
    x->blame_via = n->f.via >= 0 ? n->f.via : teller;
    x->blame_status = n->f.status;
}

/* A wait stopped: rank x->gave_rank gave the running call up. */
static int gave_fail(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    const int p = x->gave_rank;
    pthread_mutex_lock(&g->ctx->lock);
    struct coll_gave n = g->gave ? g->gave[p] : (struct coll_gave){ 0 };
    pthread_mutex_unlock(&g->ctx->lock);
    if (!n.set) /* no memory for the news: say what is sure */
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) "
                        "gave up the call", x->what, x->a->seq, g->rank, p, g->ids[p]);
    blame_relay(x, p, &n);
    if (news_gone(&n) && n.bad_rank != g->rank)
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) %s "
                        "(rank %d (node %u) gave up the call because of it)", x->what,
                        x->a->seq, g->rank, n.bad_rank, g->ids[n.bad_rank],
                        why_gone[n.f.why], p, g->ids[p]);
    const int w = x->wait_peer;
    if (n.f.why == COLL_WHY_TIMEOUT && n.bad_rank == g->rank && w >= 0 && w != p) {
        /* "rank p waited for this rank until its deadline": this rank was
         * waiting itself, for rank w, which is the rank to name (it would
         * say that this rank was the one missing); passed on as our wait */
        x->blame_rank = w;
        x->blame_why = COLL_WHY_TIMEOUT;
        x->blame_via = -1;
        x->blame_status = CFX_ERR_TIMEOUT;
        return cfx__err(CFX_ERR_TIMEOUT, "%s #%" PRIu32 ": rank %d waited for rank %d (node %u) "
                        "when rank %d (node %u), which waited for rank %d, gave the call up at "
                        "its deadline", x->what, x->a->seq, g->rank, w, g->ids[w], p,
                        g->ids[p], g->rank);
    }
    char cause[192];
    cause_text(g, p, &n, cause, sizeof(cause));
    if (news_own(&n, p))
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: %s", x->what,
                        x->a->seq, g->rank, cause);
    return cfx__err(n.f.status == CFX_ERR_TIMEOUT ? CFX_ERR_TIMEOUT : CFX_ERR_PEER_FAILED,
                    "%s #%" PRIu32 ": rank %d: rank %d (node %u) gave up the call because of "
                    "another failure: %s", x->what, x->a->seq, g->rank, p, g->ids[p], cause);
}

int cfx__coll_member_gone(struct coll_exec *x, int dead)
{
    struct cfx_group *g = x->g;
    bool left = false;
    pthread_mutex_lock(&g->ctx->lock);
    int first = first_gone(x, &left); /* the cause, not a survivor that quit after it */
    pthread_mutex_unlock(&g->ctx->lock);
    if (first < 0) {
        first = dead;
        left = cfx__p2p_node_left(g->ctx, g->ids[dead]);
    }
    x->blame_rank = first;
    x->blame_why = left ? COLL_WHY_LEFT : COLL_WHY_DIED;
    x->blame_via = -1;
    x->blame_status = 0;
    return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) %s",
                    x->what, x->a->seq, g->rank, first, g->ids[first],
                    why_gone[x->blame_why]);
}

int cfx__coll_msg_failed(struct coll_exec *x, int peer, bool send, int rc)
{
    struct cfx_group *g = x->g;
    struct cfx_context *ctx = g->ctx;
    const char *dir = send ? "sending to" : "receiving from";
    const int me = g->rank;
    char why[256];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    x->blame_rank = peer;
    x->blame_why = COLL_WHY_FAILED;
    x->blame_via = -1;
    x->blame_status = 0;
    /* what the peer's end going (or withdrawing) looks like here; anything
     * else (sizes that disagree, no memory, ...) is the message's own */
    pthread_mutex_lock(&ctx->lock);
    const bool closing = cfx__ctx_closing(ctx);
    pthread_mutex_unlock(&ctx->lock);
    /* NOT_FOUND: a rendezvous send the peer withdrew before we asked for
     * it (it found the ranks disagree, or gave the call up) */
    const bool lost = rc == CFX_ERR_PEER_FAILED || rc == CFX_ERR_CONNECT ||
                      rc == CFX_ERR_CLOSED || rc == CFX_ERR_IO ||
                      ((rc == CFX_ERR_CANCELED || rc == CFX_ERR_NOT_FOUND) && !closing);
    if (cfx__group_moved(g))
        return cfx__coll_moved_fail(x);
    if (!lost) {
        if (rc == CFX_ERR_INVALID)
            x->disagree = true; /* the two sides' message sizes differ */
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d, %s rank %d (node %u): %s", x->what,
                        x->a->seq, me, dir, peer, g->ids[peer], why);
    }

    /* the peer's news, or a death event, is on its way or in */
    uint64_t until = CFX_MIN(x->deadline, cfx__deadline_ns(COLL_BLAME_WAIT_MS));
    struct coll_gave n = { 0 }, o = { 0 };
    bool left = false, disagree, moved;
    int d = -1, t = -1;
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        /* this rank's own node was declared dead: the peer dropped it */
        if ((moved = cfx__group_moved(g)))
            break;
        /* a peer that withdrew because the ranks disagree: that is the
         * error (cfx__coll_check_end(), cfx__coll_agree_finish()) */
        disagree = x->agree ? agree_broken(x) : x->listen && edge_broken(x);
        if (g->chan_chk && g->size > 1)
            cfx__eager_unexp_scan(ctx, g->chan_chk, gave_scan, x);
        /* this call's news: one of an earlier call (a rank that canceled
         * that one, its news read in a later call's sweep) is no cause */
        if (g->gave && g->gave[peer].set && g->gave[peer].seq == x->a->seq)
            n = g->gave[peer];
        d = first_gone(x, &left);
        t = news_death(g); /* another rank's news of a death */
        if (disagree || n.set || d >= 0 || t >= 0 || !cfx__obj_wait(ctx, until))
            break;
    }
    if (!moved && t >= 0)
        o = g->gave[t];
    pthread_mutex_unlock(&ctx->lock);
    if (moved)
        return cfx__coll_moved_fail(x);
    if (disagree)
        return cfx__err(rc, "%s #%" PRIu32 ": rank %d, %s rank %d (node %u): %s", x->what,
                        x->a->seq, me, dir, peer, g->ids[peer], why);

    if (news_gone(&n) && n.bad_rank != me) {
        blame_relay(x, peer, &n);
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) %s "
                        "(rank %d was %s rank %d (node %u), which gave up the call because of "
                        "it: %s)", x->what, x->a->seq, me, n.bad_rank, g->ids[n.bad_rank],
                        why_gone[n.f.why], me, dir, peer, g->ids[peer], why);
    }
    if (d >= 0) {
        x->blame_rank = d;
        x->blame_why = left ? COLL_WHY_LEFT : COLL_WHY_DIED;
        if (d == peer)
            return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) "
                            "%s (%s)", x->what, x->a->seq, me, d, g->ids[d], why_gone[x->blame_why],
                            why);
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) %s "
                        "(rank %d was %s rank %d (node %u), which failed the call too: %s)",
                        x->what, x->a->seq, me, d, g->ids[d], why_gone[x->blame_why], me, dir,
                        peer, g->ids[peer], why);
    }
    if (t >= 0) {
        blame_relay(x, t, &o);
        return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: rank %d (node %u) %s "
                        "(as rank %d told; rank %d was %s rank %d (node %u), which failed the "
                        "call too: %s)", x->what, x->a->seq, me, o.bad_rank, g->ids[o.bad_rank],
                        why_gone[o.f.why], t, me, dir, peer, g->ids[peer], why);
    }
    if (n.set) {
        char cause[192];
        blame_relay(x, peer, &n);
        cause_text(g, peer, &n, cause, sizeof(cause));
        if (news_own(&n, peer)) /* as gave_fail() says it */
            return cfx__err(CFX_ERR_PEER_FAILED, "%s #%" PRIu32 ": rank %d: %s (rank %d was %s "
                            "it: %s)", x->what, x->a->seq, me, cause, me, dir, why);
        /* the code of the cause, as gave_fail() gives it: not the message's
         * own (CFX_ERR_CANCELED when the peer withdrew it on giving up
         * because a third rank canceled the call, as if this rank's own
         * call had been canceled) */
        return cfx__err(n.f.status == CFX_ERR_TIMEOUT ? CFX_ERR_TIMEOUT : CFX_ERR_PEER_FAILED,
                        "%s #%" PRIu32 ": rank %d, %s rank %d (node %u): rank %d gave up "
                        "the call because of another failure: %s (%s)", x->what, x->a->seq, me,
                        dir, peer, g->ids[peer], peer, cause, why);
    }
    /* no news: the cause may be this rank's own death, which its control
     * connection, being made again, tells with its new node id */
    if (cfx__group_moved_wait(g, x->deadline))
        return cfx__coll_moved_fail(x);
    return cfx__err(rc, "%s #%" PRIu32 ": rank %d, %s rank %d (node %u): %s (no rank of the "
                    "group is known to have died, and rank %d did not say why: it gave the "
                    "call up, or died unseen)", x->what, x->a->seq, me, dir, peer,
                    g->ids[peer], why, peer);
}

/* Scan of the check channel (lock held): the ranks that asked this rank a
 * question in the running call (their wait for it ran long). */
struct asked_arg {
    struct coll_exec *x;
    bool *to;
};

static bool asked_us(void *arg, const struct cfx_eager_unexp *u)
{
    struct asked_arg *d = arg;
    struct coll_chk_msg c;
    if (u->tag != d->x->tag || u->len != sizeof(c))
        return false;
    memcpy(&c, u->data, sizeof(c));
    int from = edge_rank(d->x->g, u->node_id);
    if (from >= 0 && !c.failed && c.me.magic == COLL_HDR_MAGIC)
        d->to[from] = true;
    return false; /* all of them */
}

/* Who hears that this rank gave the call up: its edges (coll_peers.c),
 * every rank it posted a message to or from or asked, and every rank that
 * asked it (a rank of another schedule, or a late one, waiting for it),
 * less those that gave the call up themselves.  NULL: every rank (a small
 * group, no schedule, no memory). */
static bool *news_to(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    const struct coll_args *a = x->a;
    if (g->size <= COLL_NEWS_ALL_MAX || x->sched_unknown)
        return NULL;
    bool *to = calloc((size_t)g->size, sizeof(*to));
    if (!to)
        return NULL;
    if (!cfx__coll_peers(g, a->kind, x->algo, a->root, a->count, to)) {
        free(to);
        return NULL;
    }
    for (int q = 0; x->dir && q < g->size; q++)
        if (x->dir[q] & (EDGE_SENT | EDGE_RECVD | EDGE_ASKED))
            to[q] = true;
    struct asked_arg d = { .x = x, .to = to };
    pthread_mutex_lock(&g->ctx->lock);
    cfx__eager_unexp_scan(g->ctx, g->chan_chk, asked_us, &d);
    pthread_mutex_unlock(&g->ctx->lock);
    to[g->rank] = false;
    for (int q = 0; q < g->size; q++)
        if (to[q] && q != g->rank && cfx__coll_peer_out(x, q))
            to[q] = false; /* out of the call already: nothing waits there */
    return to;
}

void cfx__coll_gave_up(struct coll_exec *x, int rc)
{
    struct cfx_group *g = x->g;
    /* a rank the others dropped (cfx__group_moved) has nobody to tell */
    if (x->gave_told || !g->chan_chk || g->size < 2 || cfx__group_moved(g))
        return;
    x->gave_told = true;
    struct coll_chk_msg *c = &x->gave_msg;
    memset(c, 0, sizeof(*c));
    c->me = x->hdr;
    c->failed = COLL_CHK_GAVE_UP;
    c->bad_rank = x->blame_rank;
    c->fail.magic = COLL_FAIL_MAGIC;
    c->fail.status = x->blame_status ? x->blame_status : rc;
    c->fail.via = x->blame_via;
    c->fail.why = x->blame_rank >= 0 ? x->blame_why : (uint8_t)COLL_WHY_OTHER;
    char keep[512];
    snprintf(keep, sizeof(keep), "%s", cfx_last_error());
    bool *to = news_to(x);
    chk_to_all(x, c, true, to);
    free(to);
    cfx__err(rc, "%s", keep);
}

void cfx__coll_news_forget(struct coll_exec *x)
{
    struct cfx_group *g = x->g;
    if (!g->gave || !g->ngave) /* only this group's running call touches them */
        return;
    pthread_mutex_lock(&g->ctx->lock);
    for (int q = 0; g->ngave && q < g->size; q++) {
        struct coll_gave *n = &g->gave[q];
        if (n->set && (int32_t)(n->seq - x->a->seq) < 0) {
            n->set = false;
            g->ngave--;
        }
    }
    pthread_mutex_unlock(&g->ctx->lock);
}

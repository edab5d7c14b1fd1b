/*
 * Ring schedules: allreduce (reduce-scatter then allgather), reduce-scatter
 * and allgather.
 *
 * The vector is cut into one block per rank and each block into segments
 * (CFX_COLL_SEG).  Step g of the ring moves one block to the right
 * neighbour, segment by segment, so the steps pipeline: segment j of step
 * g+1 leaves as soon as segment j of step g has landed and been reduced,
 * while the receives of the next COLL_WINDOW segments are already posted.
 * Reductions run on each segment as it lands, into the receive buffer or a
 * segment-sized scratch slot; nothing copies a whole input.
 */
#include "coll.h"

#include <stdio.h>
#include <stdlib.h>

/* Segments of a ring over blocks of at most @p maxblk elements. */
struct ring_geom {
    size_t segel;   /* elements per segment */
    int nseg;       /* segments per block */
};

static struct ring_geom ring_geom(const struct coll_exec *x, size_t maxblk, int maxseg)
{
    struct ring_geom rg;
    rg.segel = cfx__coll_seg_elems(x, maxblk * x->esz);
    if (maxseg > 0 && (maxblk + rg.segel - 1) / rg.segel > (size_t)maxseg)
        rg.segel = (maxblk + (size_t)maxseg - 1) / (size_t)maxseg;
    if (rg.segel == 0)
        rg.segel = 1;
    rg.nseg = maxblk ? (int)((maxblk + rg.segel - 1) / rg.segel) : 1;
    return rg;
}

/* Element range of segment @p j of a block [off, off+len); *n = 0 when the
 * block has fewer segments (no message then, on both sides). */
static void seg_of(const struct ring_geom *rg, size_t off, size_t len, int j, size_t *soff,
                   size_t *n)
{
    size_t start = (size_t)j * rg->segel;
    *soff = off + start;
    *n = start < len ? CFX_MIN(rg->segel, len - start) : 0;
}

static int *handles(struct coll_exec *x, size_t n)
{
    int *h = malloc(n * sizeof(*h));
    if (!h) {
        cfx__err(CFX_ERR_NOMEM, "%s #%u: out of memory", x->what, x->a->seq);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = -1;
    return h;
}

/* ---- allreduce ----------------------------------------------------------------------
 *
 * Steps g = 0 .. n-2 reduce-scatter: send block r-g, receive block r-g-1
 * into a scratch slot and reduce it with our input into recvbuf (which then
 * holds the partial sum sent on at step g+1).  Steps g = n-1 .. 2n-3
 * allgather: send block r+1-g', receive block r-g' straight into recvbuf
 * (g' = g-(n-1)).  The allgather receive of block r-g' overwrites what the
 * reduce-scatter send of step g' read, so it waits for that send first.
 */
struct ar_ring {
    struct coll_exec *x;
    const char *s;
    char *r;
    struct ring_geom rg;
    int n, me, steps, items;
    int *rh, *sh;      /* receive / send handle per item (g * nseg + j) */
    char *slots;       /* COLL_WINDOW segments */
    size_t segb;
    int next_recv;
};

static void ar_item(const struct ar_ring *ar, int item, bool send, size_t *off, size_t *n)
{
    int g = item / ar->rg.nseg, j = item % ar->rg.nseg, blk;
    const int n_ = ar->n, r = ar->me;
    if (g < n_ - 1)
        blk = send ? coll_mod(r - g, n_) : coll_mod(r - g - 1, n_);
    else
        blk = send ? coll_mod(r + 1 - (g - (n_ - 1)), n_) : coll_mod(r - (g - (n_ - 1)), n_);
    size_t boff, blen;
    coll_block(ar->x->a->count, n_, blk, &boff, &blen);
    seg_of(&ar->rg, boff, blen, j, off, n);
}

static int ar_post_recvs(struct ar_ring *ar, int upto)
{
    struct coll_exec *x = ar->x;
    int left = coll_mod(ar->me - 1, ar->n);
    while (ar->next_recv < ar->items && ar->next_recv < upto) {
        int i = ar->next_recv++;
        int g = i / ar->rg.nseg;
        size_t off, n;
        ar_item(ar, i, false, &off, &n);
        if (!n)
            continue;
        void *dst;
        if (g < ar->n - 1) {
            dst = ar->slots + (size_t)(i % COLL_WINDOW) * ar->segb;
        } else {
            /* the reduce-scatter send of step g' read this segment */
            int clash = (g - (ar->n - 1)) * ar->rg.nseg + i % ar->rg.nseg;
            if (ar->sh[clash] >= 0) {
                int rc = cfx__coll_wait(x, ar->sh[clash]);
                if (rc != CFX_OK)
                    return rc;
            }
            dst = ar->r + off * x->esz;
        }
        int h = cfx__coll_recv(x, left, dst, n * x->esz);
        if (h < 0)
            return h;
        ar->rh[i] = h;
    }
    return CFX_OK;
}

static int ar_send(struct ar_ring *ar, int i)
{
    struct coll_exec *x = ar->x;
    size_t off, n;
    ar_item(ar, i, true, &off, &n);
    if (!n)
        return CFX_OK;
    const char *src = (i < ar->rg.nseg ? ar->s : ar->r) + off * x->esz;
    int h = cfx__coll_send(x, (ar->me + 1) % ar->n, src, n * x->esz);
    if (h < 0)
        return h;
    ar->sh[i] = h;
    return CFX_OK;
}

int cfx__coll_allreduce_ring(struct coll_exec *x, const void *s, void *r)
{
    struct ar_ring ar = { .x = x, .s = s, .r = r, .n = x->g->size, .me = x->g->rank };
    size_t maxblk = (x->a->count + (size_t)ar.n - 1) / (size_t)ar.n;
    ar.rg = ring_geom(x, maxblk, 0);
    ar.steps = 2 * (ar.n - 1);
    ar.items = ar.steps * ar.rg.nseg;
    ar.segb = ar.rg.segel * x->esz;
    int rc = cfx__coll_scratch(x, COLL_WINDOW * ar.segb, (void **)&ar.slots);
    if (rc != CFX_OK)
        return rc;
    ar.rh = handles(x, (size_t)ar.items);
    ar.sh = handles(x, (size_t)ar.items);
    if (!ar.rh || !ar.sh) {
        rc = CFX_ERR_NOMEM;
        goto out;
    }
    for (int j = 0; j < ar.rg.nseg && rc == CFX_OK; j++)
        rc = ar_send(&ar, j);
    if (rc == CFX_OK)
        rc = ar_post_recvs(&ar, COLL_WINDOW);
    for (int i = 0; i < ar.items && rc == CFX_OK; i++) {
        int g = i / ar.rg.nseg;
        size_t off, n;
        ar_item(&ar, i, false, &off, &n);
        if (n) {
            if ((rc = cfx__coll_wait(x, ar.rh[i])) != CFX_OK)
                break;
            if (g < ar.n - 1) {
                char *dst = ar.r + off * x->esz;
                const char *own = ar.s + off * x->esz;
                rc = cfx__coll_reduce3(x, dst, own, ar.slots + (size_t)(i % COLL_WINDOW) * ar.segb,
                                  n);
                if (rc != CFX_OK)
                    break;
            }
        }
        /* post the next receives before the send: the slot of item i is free */
        if ((rc = ar_post_recvs(&ar, i + 1 + COLL_WINDOW)) != CFX_OK)
            break;
        if (g + 1 < ar.steps)
            rc = ar_send(&ar, i + ar.rg.nseg);
    }
out:
    free(ar.rh);
    free(ar.sh);
    return rc;
}

/* ---- reduce-scatter ------------------------------------------------------------------
 *
 * Steps g = 0 .. n-2: send block r-g-1, receive block r-g-2, so that the
 * last block received is our own (r).  Partial sums live in scratch slots
 * (recvbuf holds one block only): a slot takes a segment as it lands, is
 * reduced with our input in place and is sent on from there at step g+1, so
 * a slot is busy until that send completes.  nseg + COLL_WINDOW slots keep
 * the ring moving; segments are made large enough that nseg <= 8.
 */
#define RS_MAXSEG 8

int cfx__coll_reduce_scatter_ring(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, esz = x->esz;
    const char *sb = s;
    char *rb = r;
    struct ring_geom rg = ring_geom(x, count, RS_MAXSEG);
    const int steps = n - 1, items = steps * rg.nseg, nslots = rg.nseg + COLL_WINDOW;
    const size_t segb = rg.segel * esz;
    const int left = coll_mod(me - 1, n), right = (me + 1) % n;
    char *slots;
    int rc = cfx__coll_scratch(x, (size_t)nslots * segb, (void **)&slots);
    if (rc != CFX_OK)
        return rc;
    int *rh = handles(x, (size_t)items), *sh = handles(x, (size_t)items);
    if (!rh || !sh) {
        rc = CFX_ERR_NOMEM;
        goto out;
    }
#define RS_SLOT(i) (slots + (size_t)((i) % nslots) * segb)
#define RS_BLOCK(g, send) ((size_t)coll_mod(me - (g) - ((send) ? 1 : 2), n) * count)
    /* step 0 sends our own input */
    for (int j = 0; j < rg.nseg && rc == CFX_OK; j++) {
        size_t off, len;
        seg_of(&rg, RS_BLOCK(0, true), count, j, &off, &len);
        if (len && (sh[j] = cfx__coll_send(x, right, sb + off * esz, len * esz)) < 0)
            rc = sh[j];
    }
    int next_recv = 0;
    for (int i = 0; i < items && rc == CFX_OK; i++) {
        /* keep COLL_WINDOW receives posted; a slot is reused once the send
         * that read it has completed */
        while (rc == CFX_OK && next_recv < items && next_recv < i + COLL_WINDOW) {
            int k = next_recv++;
            size_t off, len;
            seg_of(&rg, 0, count, k % rg.nseg, &off, &len);
            if (!len)
                continue;
            if (k >= nslots && sh[k - nslots + rg.nseg] >= 0)
                rc = cfx__coll_wait(x, sh[k - nslots + rg.nseg]);
            if (rc == CFX_OK && (rh[k] = cfx__coll_recv(x, left, RS_SLOT(k), len * esz)) < 0)
                rc = rh[k];
        }
        if (rc != CFX_OK)
            break;
        int g = i / rg.nseg, j = i % rg.nseg;
        size_t off, len;
        seg_of(&rg, RS_BLOCK(g, false), count, j, &off, &len);
        if (!len)
            continue;
        if ((rc = cfx__coll_wait(x, rh[i])) != CFX_OK)
            break;
        if (g == steps - 1) {
            /* our block: the result goes to recvbuf */
            rc = cfx__coll_reduce3(x, rb + (size_t)j * rg.segel * esz, sb + off * esz, RS_SLOT(i),
                              len);
            continue;
        }
        if ((rc = cfx__coll_reduce3(x, RS_SLOT(i), sb + off * esz, RS_SLOT(i), len)) != CFX_OK)
            break;
        if ((sh[i + rg.nseg] = cfx__coll_send(x, right, RS_SLOT(i), len * esz)) < 0)
            rc = sh[i + rg.nseg];
    }
#undef RS_SLOT
#undef RS_BLOCK
out:
    free(rh);
    free(sh);
    return rc;
}

/* ---- allgather ------------------------------------------------------------------------
 *
 * Step g: send block r-g, receive block r-g-1 straight into recvbuf; a
 * segment is forwarded as soon as it has landed.
 */
int cfx__coll_allgather_ring(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, esz = x->esz, blk = count * esz;
    char *rb = r;
    int rc = cfx__coll_copy(x, rb + (size_t)me * blk, s, blk);
    if (rc != CFX_OK)
        return rc;
    struct ring_geom rg = ring_geom(x, count, 0);
    const int items = (n - 1) * rg.nseg;
    const int left = coll_mod(me - 1, n), right = (me + 1) % n;
    int *rh = handles(x, (size_t)items);
    if (!rh)
        return CFX_ERR_NOMEM;
    for (int j = 0; j < rg.nseg && rc == CFX_OK; j++) {
        size_t off, len;
        seg_of(&rg, (size_t)me * count, count, j, &off, &len);
        if (len) {
            int h = cfx__coll_send(x, right, rb + off * esz, len * esz);
            rc = h < 0 ? h : CFX_OK;
        }
    }
    int next_recv = 0;
    for (int i = 0; i < items && rc == CFX_OK; i++) {
        while (rc == CFX_OK && next_recv < items && next_recv < i + COLL_WINDOW) {
            int k = next_recv++;
            size_t off, len;
            seg_of(&rg, (size_t)coll_mod(me - k / rg.nseg - 1, n) * count, count,
                   k % rg.nseg, &off, &len);
            if (len && (rh[k] = cfx__coll_recv(x, left, rb + off * esz, len * esz)) < 0)
                rc = rh[k];
        }
        if (rc != CFX_OK)
            break;
        int g = i / rg.nseg, j = i % rg.nseg;
        size_t off, len;
        seg_of(&rg, (size_t)coll_mod(me - g - 1, n) * count, count, j, &off, &len);
        if (!len)
            continue;
        if ((rc = cfx__coll_wait(x, rh[i])) != CFX_OK)
            break;
        if (g + 1 < n - 1) {
            int h = cfx__coll_send(x, right, rb + off * esz, len * esz);
            rc = h < 0 ? h : CFX_OK;
        }
    }
    free(rh);
    return rc;
}

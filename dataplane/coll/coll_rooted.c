/*
 * Rooted schedules: broadcast and reduce down / up a pipelined chain or a
 * binomial tree, gather and scatter.
 *
 * Broadcast and reduce share one shape: a tree given by each rank's parent
 * and children (a chain is a tree with one child per rank).  The vector
 * moves in segments (CFX_COLL_SEG); a rank forwards segment j (broadcast)
 * or reduces segment j of its children with its own and sends it up
 * (reduce) as soon as it is there, with the receives of the next
 * COLL_WINDOW segments already posted.  Small vectors are one segment.
 */
#include "coll.h"

#include <stdlib.h>

#define TREE_MAX_CHILDREN 32

struct tree {
    int parent;                       /* rank, -1 at the root */
    int nchild;
    int child[TREE_MAX_CHILDREN];     /* ranks, largest subtree first */
};

static void tree_chain(int n, int me, int root, struct tree *t)
{
    int vr = coll_mod(me - root, n);
    t->parent = vr > 0 ? coll_mod(me - 1, n) : -1;
    t->nchild = 0;
    if (vr < n - 1)
        t->child[t->nchild++] = (me + 1) % n;
}

static void tree_binomial(int n, int me, int root, struct tree *t)
{
    int vr = coll_mod(me - root, n), mask = 1;
    t->parent = -1;
    while (mask < n) {
        if (vr & mask) {
            t->parent = (vr - mask + root) % n;
            break;
        }
        mask <<= 1;
    }
    t->nchild = 0;
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n && t->nchild < TREE_MAX_CHILDREN)
            t->child[t->nchild++] = (vr + mask + root) % n;
}

void cfx__coll_tree_peers(int n, int me, int root, bool chain, bool *peer)
{
    struct tree t;
    if (chain)
        tree_chain(n, me, root, &t);
    else
        tree_binomial(n, me, root, &t);
    if (t.parent >= 0)
        peer[t.parent] = true;
    for (int c = 0; c < t.nchild; c++)
        peer[t.child[c]] = true;
}

static int *handles(struct coll_exec *x, size_t n)
{
    int *h = malloc((n ? n : 1) * sizeof(*h));
    if (!h) {
        cfx__err(CFX_ERR_NOMEM, "%s #%u: out of memory", x->what, x->a->seq);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = -1;
    return h;
}

/*
 * Segments of a rooted pipeline: CFX_COLL_SEG, and for a vector of less
 * than four of those a quarter of it (at least COLL_SEG_PIPE_MIN), so that
 * a chain of a few ranks overlaps its hops at mid sizes too: a 64 KiB
 * broadcast over 4 ranks moves in 16 KiB segments, and a loop of them runs
 * at the link rate instead of three whole-message hops per call.
 */
static size_t pipe_seg_elems(const struct coll_exec *x, size_t bytes)
{
    size_t seg = x->g->seg_bytes;
    if (bytes / 4 < seg)
        seg = CFX_MIN(CFX_MAX(bytes / 4, (size_t)COLL_SEG_PIPE_MIN), x->g->seg_bytes);
    size_t e = seg / x->esz;
    return e ? e : 1;
}

/* ---- broadcast ------------------------------------------------------------------------ */

static int bcast_pipe(struct coll_exec *x, char *buf, const struct tree *t)
{
    const size_t count = x->a->count, esz = x->esz;
    const size_t segel = pipe_seg_elems(x, count * esz);
    const int nseg = (int)((count + segel - 1) / segel);
    int rc = CFX_OK;
#define SEG_LEN(j) (CFX_MIN(segel, count - (size_t)(j) * segel) * esz)
    if (t->parent < 0) {
        for (int j = 0; j < nseg; j++)
            for (int c = 0; c < t->nchild; c++) {
                int h = cfx__coll_send(x, t->child[c], buf + (size_t)j * segel * esz, SEG_LEN(j));
                if (h < 0)
                    return h;
            }
        return CFX_OK;
    }
    /* an in-place allreduce's broadcast half: recvbuf may be the input */
    if ((rc = cfx__coll_gate(x)) != CFX_OK)
        return rc;
    int *rh = handles(x, (size_t)nseg);
    if (!rh)
        return CFX_ERR_NOMEM;
    int posted = 0;
    for (int j = 0; j < nseg && rc == CFX_OK; j++) {
        while (posted < nseg && posted < j + COLL_WINDOW) {
            rh[posted] = cfx__coll_recv(x, t->parent, buf + (size_t)posted * segel * esz,
                                   SEG_LEN(posted));
            if (rh[posted] < 0) {
                rc = rh[posted];
                break;
            }
            posted++;
        }
        if (rc != CFX_OK || (rc = cfx__coll_wait(x, rh[j])) != CFX_OK)
            break;
        for (int c = 0; c < t->nchild && rc == CFX_OK; c++) {
            int h = cfx__coll_send(x, t->child[c], buf + (size_t)j * segel * esz, SEG_LEN(j));
            rc = h < 0 ? h : CFX_OK;
        }
    }
#undef SEG_LEN
    free(rh);
    return rc;
}

int cfx__coll_bcast_chain(struct coll_exec *x, void *buf, int root)
{
    struct tree t;
    tree_chain(x->g->size, x->g->rank, root, &t);
    return bcast_pipe(x, buf, &t);
}

int cfx__coll_bcast_tree(struct coll_exec *x, void *buf, int root)
{
    struct tree t;
    tree_binomial(x->g->size, x->g->rank, root, &t);
    return bcast_pipe(x, buf, &t);
}

/* ---- reduce ------------------------------------------------------------------------------
 *
 * Segment j of each child lands in a child slot; the rank reduces its own
 * segment with them into recvbuf (root) or an accumulator slot, which is
 * sent up.  A leaf sends its input as it is.  Accumulator slots are reused
 * once their send has completed (2 * COLL_WINDOW of them).
 */
static int reduce_pipe(struct coll_exec *x, const char *s, char *r, const struct tree *t)
{
    const size_t count = x->a->count, esz = x->esz;
    const size_t segel = pipe_seg_elems(x, count * esz), segb = segel * esz;
    const int nseg = (int)((count + segel - 1) / segel), nc = t->nchild;
    const int nacc = t->parent >= 0 && nc ? 2 * COLL_WINDOW : 0;
    char *slots;
    int rc = cfx__coll_scratch(x, ((size_t)nc * COLL_WINDOW + (size_t)nacc) * segb,
                               (void **)&slots);
    if (rc != CFX_OK)
        return rc;
    char *acc = slots + (size_t)nc * COLL_WINDOW * segb;
    int *rh = handles(x, (size_t)nc * (size_t)nseg), *sh = handles(x, (size_t)nseg);
    if (!rh || !sh) {
        rc = CFX_ERR_NOMEM;
        goto out;
    }
#define CSLOT(c, j) (slots + ((size_t)(c) * COLL_WINDOW + (size_t)((j) % COLL_WINDOW)) * segb)
    int posted = 0;
    for (int j = 0; j < nseg && rc == CFX_OK; j++) {
        while (posted < nseg && posted < j + COLL_WINDOW && rc == CFX_OK) {
            size_t len = CFX_MIN(segel, count - (size_t)posted * segel) * esz;
            for (int c = 0; c < nc; c++) {
                int h = cfx__coll_recv(x, t->child[c], CSLOT(c, posted), len);
                if (h < 0) {
                    rc = h;
                    break;
                }
                rh[(size_t)c * (size_t)nseg + (size_t)posted] = h;
            }
            posted++;
        }
        if (rc != CFX_OK)
            break;
        size_t n = CFX_MIN(segel, count - (size_t)j * segel);
        const char *own = s + (size_t)j * segb;
        const char *up = own;
        if (nc) {
            char *dst = t->parent < 0 ? r + (size_t)j * segb : acc + (size_t)(j % nacc) * segb;
            /* the root's first write to recvbuf (maybe its input) */
            if (t->parent < 0 && (rc = cfx__coll_gate(x)) != CFX_OK)
                break;
            if (t->parent >= 0 && j >= nacc && (rc = cfx__coll_wait(x, sh[j - nacc])) != CFX_OK)
                break;
            for (int c = 0; c < nc && rc == CFX_OK; c++) {
                if ((rc = cfx__coll_wait(x, rh[(size_t)c * (size_t)nseg + (size_t)j])) != CFX_OK)
                    break;
                rc = c == 0 ? cfx__coll_reduce3(x, dst, own, CSLOT(0, j), n)
                            : cfx__coll_reduce(x, dst, CSLOT(c, j), n);
            }
            up = dst;
        }
        if (rc == CFX_OK && t->parent >= 0 &&
            (sh[j] = cfx__coll_send(x, t->parent, up, n * esz)) < 0)
            rc = sh[j];
    }
#undef CSLOT
out:
    free(rh);
    free(sh);
    return rc;
}

int cfx__coll_reduce_chain(struct coll_exec *x, const void *s, void *r, int root)
{
    struct tree t;
    tree_chain(x->g->size, x->g->rank, root, &t);
    /* the chain runs towards the root: our child is the rank after us */
    return reduce_pipe(x, s, r, &t);
}

int cfx__coll_reduce_tree(struct coll_exec *x, const void *s, void *r, int root)
{
    struct tree t;
    tree_binomial(x->g->size, x->g->rank, root, &t);
    return reduce_pipe(x, s, r, &t);
}

/* ---- gather / scatter: the root talks to every rank directly ----------------------------- */

int cfx__coll_gather_direct(struct coll_exec *x, const void *s, void *r, int root)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t blk = x->a->count * x->esz;
    if (me != root) {
        int h = cfx__coll_send(x, root, s, blk);
        return h < 0 ? h : CFX_OK;
    }
    char *rb = r;
    for (int q = 0; q < n; q++) {
        if (q == me)
            continue;
        int h = cfx__coll_recv(x, q, rb + (size_t)q * blk, blk);
        if (h < 0)
            return h;
    }
    return cfx__coll_copy(x, rb + (size_t)me * blk, s, blk);
}

int cfx__coll_scatter_direct(struct coll_exec *x, const void *s, void *r, int root)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t blk = x->a->count * x->esz;
    if (me != root) {
        int h = cfx__coll_recv(x, root, r, blk);
        return h < 0 ? h : CFX_OK;
    }
    const char *sb = s;
    for (int q = 0; q < n; q++) {
        if (q == me)
            continue;
        int h = cfx__coll_send(x, q, sb + (size_t)q * blk, blk);
        if (h < 0)
            return h;
    }
    return cfx__coll_copy(x, r, sb + (size_t)me * blk, blk);
}

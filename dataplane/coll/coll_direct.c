/*
 * Direct-exchange schedules: all-to-all (pairwise exchange), allgather and
 * reduce-scatter where every rank talks to every other rank.
 */
#include "coll.h"

/*
 * Pairwise exchange: at step k = 1 .. n-1 rank r sends its block for rank
 * r+k and receives the block of rank r-k, so every step is a permutation
 * and no rank is the target of two senders at once.  All steps are posted
 * at once; the receiver-driven transfers still pair up step by step.  In
 * place (sendbuf == recvbuf) the input is first copied to scratch.
 */
int cfx__coll_alltoall_pairwise(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t blk = x->a->count * x->esz;
    const char *sb = s;
    char *rb = r;
    int rc;
    if (s == r && n > 1) {
        void *tmp;
        if ((rc = cfx__coll_scratch(x, (size_t)n * blk, &tmp)) != CFX_OK)
            return rc;
        if ((rc = cfx__coll_copy(x, tmp, s, (size_t)n * blk)) != CFX_OK)
            return rc;
        sb = tmp;
    }
    if ((rc = cfx__coll_copy(x, rb + (size_t)me * blk, sb + (size_t)me * blk, blk)) != CFX_OK)
        return rc;
    for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = coll_mod(me - k, n);
        int h = cfx__coll_send(x, to, sb + (size_t)to * blk, blk);
        if (h < 0)
            return h;
        if ((h = cfx__coll_recv(x, from, rb + (size_t)from * blk, blk)) < 0)
            return h;
    }
    return CFX_OK;
}

int cfx__coll_allgather_direct(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t blk = x->a->count * x->esz;
    char *rb = r;
    int rc = cfx__coll_copy(x, rb + (size_t)me * blk, s, blk);
    if (rc != CFX_OK)
        return rc;
    for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = coll_mod(me - k, n);
        int h = cfx__coll_send(x, to, rb + (size_t)me * blk, blk);
        if (h < 0)
            return h;
        if ((h = cfx__coll_recv(x, from, rb + (size_t)from * blk, blk)) < 0)
            return h;
    }
    return CFX_OK;
}

/* Every rank sends block q of its input to rank q and reduces the n-1
 * blocks it receives for itself, in rank order, as they land. */
int cfx__coll_reduce_scatter_direct(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, blk = count * x->esz;
    const char *sb = s;
    char *tmp;
    int rc = cfx__coll_scratch(x, (size_t)(n - 1) * blk, (void **)&tmp);
    if (rc != CFX_OK)
        return rc;
    int hr[n];
    for (int k = 1; k < n; k++) {
        int to = (me + k) % n, from = coll_mod(me - k, n);
        int h = cfx__coll_send(x, to, sb + (size_t)to * blk, blk);
        if (h < 0)
            return h;
        if ((hr[k] = cfx__coll_recv(x, from, tmp + (size_t)(k - 1) * blk, blk)) < 0)
            return hr[k];
    }
    for (int k = 1; k < n; k++) {
        if ((rc = cfx__coll_wait(x, hr[k])) != CFX_OK)
            return rc;
        rc = k == 1 ? cfx__coll_reduce3(x, r, sb + (size_t)me * blk, tmp, count)
                    : cfx__coll_reduce(x, r, tmp + (size_t)(k - 1) * blk, count);
        if (rc != CFX_OK)
            return rc;
    }
    return CFX_OK;
}

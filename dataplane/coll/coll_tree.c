/*
 * Latency-oriented allreduce schedules: recursive doubling, recursive
 * halving-doubling (Rabenseifner) and the double binary tree.
 */
#include "coll.h"

/* ---- recursive doubling -------------------------------------------------------------
 *
 * For the smallest vectors, where each message costs its latency and its
 * bytes cost next to nothing: log2(p) rounds, in round k every rank swaps its
 * whole partial result with rank ^ 2^k and combines the two.  Both partners
 * combine the same two values in the same order, the lower rank's first:
 * the ops are commutative for numbers but not for NaNs (a min or max keeps
 * its first NaN operand, a sum on x86 its first NaN's payload), so in
 * either order the partners' bits, and a max's values, could part.  So
 * every rank ends with the same bits.  Sizes that are not powers of two fold as rhd does: of
 * the first 2*rem ranks each even one hands its input to the odd one above
 * it before the rounds and gets the result back after them (2 more steps for
 * those ranks only).
 *
 * The first round sends straight from the send buffer; partial results live
 * in recvbuf, or in scratch when the caller's buffer may only be written
 * once the ranks agree on the arguments (an in-place call whose headers are
 * still travelling, x->gate): then the result is copied out at the end,
 * after cfx__coll_gate(), which by then costs no wait, since every rank has
 * sent its header before the data the result depends on.
 */
int cfx__coll_allreduce_recdbl(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, bytes = count * x->esz;
    const bool stage = x->gate;
    char *tmp, *acc;
    int p = 1, rc, hr = -1;
    while (p * 2 <= n)
        p *= 2;
    const int rem = n - p;
    if ((rc = cfx__coll_scratch(x, (stage ? 2 : 1) * bytes, (void **)&tmp)) != CFX_OK)
        return rc;
    acc = stage ? tmp + bytes : r;
    const char *cur = s; /* this rank's partial result so far */

    int newrank;
    if (me < 2 * rem && me % 2 == 0) {
        /* folded out: the partner does our share; post the result's
         * receive at once so that it is waiting when the result comes */
        int hs = cfx__coll_send(x, me + 1, s, bytes);
        if (hs < 0)
            return hs;
        if ((hr = cfx__coll_recv(x, me + 1, acc, bytes)) < 0)
            return hr;
        if ((rc = cfx__coll_wait(x, hr)) != CFX_OK)
            return rc;
        newrank = -1;
    } else if (me < 2 * rem) {
        int h = cfx__coll_recv(x, me - 1, tmp, bytes);
        if (h < 0)
            return h;
        if ((rc = cfx__coll_wait(x, h)) != CFX_OK ||
            (rc = cfx__coll_reduce3(x, acc, s, tmp, count)) != CFX_OK)
            return rc;
        cur = acc;
        newrank = me / 2;
    } else {
        newrank = me - rem;
    }

    for (int mask = 1; newrank >= 0 && mask < p; mask <<= 1) {
        int nr = newrank ^ mask;
        int peer = nr < rem ? nr * 2 + 1 : nr + rem;
        /* waits for both: our send read cur, which the reduction overwrites */
        rc = cfx__coll_sendrecv(x, peer, cur, bytes, peer, tmp, bytes);
        if (rc == CFX_OK)
            rc = newrank < nr ? cfx__coll_reduce3(x, acc, cur, tmp, count)
                              : cfx__coll_reduce3(x, acc, tmp, cur, count);
        if (rc != CFX_OK)
            return rc;
        cur = acc;
    }
    if (newrank >= 0 && me < 2 * rem) {
        int h = cfx__coll_send(x, me - 1, acc, bytes);
        if (h < 0)
            return h;
    }
    if (!stage)
        return CFX_OK;
    if ((rc = cfx__coll_gate(x)) != CFX_OK)
        return rc;
    return cfx__coll_copy(x, r, acc, bytes);
}

/* ---- recursive halving-doubling -------------------------------------------------
 *
 * With p the largest power of two <= n and rem = n - p, the first 2*rem
 * ranks pair up: each even one hands its whole vector to the odd one above
 * it and sits out (the usual fix-up for sizes that are not powers of two).
 * The p remaining ranks then reduce-scatter by recursive halving (at
 * distance 1, 2, 4, ... each keeps the half that its partner does not) and
 * allgather by recursive doubling in reverse; finally each odd rank of the
 * pairs hands the result back to its even partner.  2*log2(p) (+2) steps,
 * each moving half of what the previous one moved: as many bytes as a ring
 * in far fewer steps.
 */
int cfx__coll_allreduce_rhd(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, esz = x->esz;
    char *rb = r, *tmp;
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    const int rem = n - p;
    int rc = cfx__coll_copy(x, r, s, count * esz);
    if (rc == CFX_OK)
        rc = cfx__coll_scratch(x, count * esz, (void **)&tmp);
    if (rc != CFX_OK)
        return rc;

    int newrank;
    if (me < 2 * rem) {
        if (me % 2 == 0) {
            int h = cfx__coll_send(x, me + 1, rb, count * esz);
            if (h < 0)
                return h;
            if ((rc = cfx__coll_wait(x, h)) != CFX_OK)
                return rc;
            newrank = -1;
        } else {
            int h = cfx__coll_recv(x, me - 1, tmp, count * esz);
            if (h < 0)
                return h;
            if ((rc = cfx__coll_wait(x, h)) != CFX_OK)
                return rc;
            if ((rc = cfx__coll_reduce(x, rb, tmp, count)) != CFX_OK)
                return rc;
            newrank = me / 2;
        }
    } else {
        newrank = me - rem;
    }

    if (newrank >= 0) {
        /* block b of p: offset disp(b), the blocks [i, j) span disp(j) - disp(i) */
#define DISP(b) ((b) >= p ? count : (size_t)(b) * (count / (size_t)p) + \
                 CFX_MIN((size_t)(b), count % (size_t)p))
#define REAL(nr) ((nr) < rem ? (nr) * 2 + 1 : (nr) + rem)
        int mask = 1, send_idx = 0, recv_idx = 0, last_idx = p;
        while (mask < p) {
            int peer = REAL(newrank ^ mask);
            int s0, s1, r0, r1;
            if (newrank < (newrank ^ mask)) {
                send_idx = recv_idx + p / (mask * 2);
                s0 = send_idx, s1 = last_idx, r0 = recv_idx, r1 = send_idx;
            } else {
                recv_idx = send_idx + p / (mask * 2);
                s0 = send_idx, s1 = recv_idx, r0 = recv_idx, r1 = last_idx;
            }
            size_t scnt = DISP(s1) - DISP(s0), rcnt = DISP(r1) - DISP(r0);
            rc = cfx__coll_sendrecv(x, peer, rb + DISP(s0) * esz, scnt * esz, peer, tmp,
                                    rcnt * esz);
            if (rc == CFX_OK)
                rc = cfx__coll_reduce(x, rb + DISP(r0) * esz, tmp, rcnt);
            if (rc != CFX_OK)
                return rc;
            send_idx = recv_idx;
            mask <<= 1;
            if (mask < p)
                last_idx = recv_idx + p / mask;
        }
        mask >>= 1;
        while (mask > 0) {
            int nd = newrank ^ mask, peer = REAL(nd);
            int s0, s1, r0, r1;
            if (newrank < nd) {
                if (mask != p / 2)
                    last_idx = last_idx + p / (mask * 2);
                recv_idx = send_idx + p / (mask * 2);
                s0 = send_idx, s1 = recv_idx, r0 = recv_idx, r1 = last_idx;
            } else {
                recv_idx = send_idx - p / (mask * 2);
                s0 = send_idx, s1 = last_idx, r0 = recv_idx, r1 = send_idx;
            }
            size_t scnt = DISP(s1) - DISP(s0), rcnt = DISP(r1) - DISP(r0);
            rc = cfx__coll_sendrecv(x, peer, rb + DISP(s0) * esz, scnt * esz, peer,
                               rb + DISP(r0) * esz, rcnt * esz);
            if (rc != CFX_OK)
                return rc;
            if (newrank > nd)
                send_idx = recv_idx;
            mask >>= 1;
        }
#undef DISP
#undef REAL
    }

    if (me < 2 * rem) {
        int h = me % 2 ? cfx__coll_send(x, me - 1, rb, count * esz)
                       : cfx__coll_recv(x, me + 1, rb, count * esz);
        if (h < 0)
            return h;
        rc = cfx__coll_wait(x, h);
    }
    return rc;
}

/* ---- double binary tree ------------------------------------------------------------
 *
 * The vector is cut in two halves; half t is reduced up tree t to its root
 * and broadcast back down the same tree (cfx__coll_dtree() builds the trees).  A
 * rank is interior in at most one tree, so the two halves share the work
 * and the links.  Both trees' receives from children are posted first; the
 * messages between two ranks keep one order on both sides: all upward ones
 * (tree 0, then tree 1) before all downward ones.
 */
int cfx__coll_allreduce_dbtree(struct coll_exec *x, const void *s, void *r)
{
    const int n = x->g->size, me = x->g->rank;
    const size_t count = x->a->count, esz = x->esz;
    char *rb = r, *tmp;
    size_t hoff[2], hlen[2];
    int parent[2], child[2][2];
    int rc = cfx__coll_copy(x, r, s, count * esz);
    if (rc != CFX_OK)
        return rc;
    for (int t = 0; t < 2; t++) {
        coll_block(count, 2, t, &hoff[t], &hlen[t]);
        cfx__coll_dtree(n, me, t, &parent[t], &child[t][0], &child[t][1]);
    }
    size_t half = hlen[0];
    if ((rc = cfx__coll_scratch(x, 4 * half * esz + 1, (void **)&tmp)) != CFX_OK)
        return rc;
    int hr[2][2] = { { -1, -1 }, { -1, -1 } }, hu[2] = { -1, -1 };
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 2; c++)
            if (hlen[t] && child[t][c] >= 0 &&
                (hr[t][c] = cfx__coll_recv(x, child[t][c], tmp + (size_t)(2 * t + c) * half * esz,
                                      hlen[t] * esz)) < 0)
                return hr[t][c];
    for (int t = 0; t < 2; t++) {
        if (!hlen[t])
            continue;
        for (int c = 0; c < 2; c++) {
            if (hr[t][c] < 0)
                continue;
            if ((rc = cfx__coll_wait(x, hr[t][c])) != CFX_OK)
                return rc;
            rc = cfx__coll_reduce(x, rb + hoff[t] * esz, tmp + (size_t)(2 * t + c) * half * esz,
                             hlen[t]);
            if (rc != CFX_OK)
                return rc;
        }
        if (parent[t] >= 0 &&
            (hu[t] = cfx__coll_send(x, parent[t], rb + hoff[t] * esz, hlen[t] * esz)) < 0)
            return hu[t];
    }
    int hd[2] = { -1, -1 };
    for (int t = 0; t < 2; t++) {
        if (!hlen[t] || parent[t] < 0)
            continue;
        /* the same memory went up: take the result once it has left */
        if ((rc = cfx__coll_wait(x, hu[t])) != CFX_OK)
            return rc;
        if ((hd[t] = cfx__coll_recv(x, parent[t], rb + hoff[t] * esz, hlen[t] * esz)) < 0)
            return hd[t];
    }
    for (int t = 0; t < 2; t++) {
        if (!hlen[t])
            continue;
        if (hd[t] >= 0 && (rc = cfx__coll_wait(x, hd[t])) != CFX_OK)
            return rc;
        for (int c = 0; c < 2; c++) {
            if (child[t][c] < 0)
                continue;
            int h = cfx__coll_send(x, child[t][c], rb + hoff[t] * esz, hlen[t] * esz);
            if (h < 0)
                return h;
        }
    }
    return CFX_OK;
}

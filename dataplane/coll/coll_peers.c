/*
 * Collectives: the edges of a call, that is, the ranks one rank exchanges
 * messages with in it: its schedule's peers and, where every rank's header
 * is compared (CFX_COLL_CHECK=2, every barrier), the argument exchange's.
 * A rank that gives a call up tells these ranks alone why (coll_check.c
 * "failures"), and each of them that gives the call up because of it
 * tells its own; so the news follows the call's messages.
 *
 * It reaches every rank still waiting in the call: a rank that waits
 * waits for a message of one of its edges, and that rank is either done
 * with its part (then the message comes) or waiting itself, back to the
 * rank that failed; each rank on the way hears it from the next and
 * passes it on.  A rank that finished its part needs no news.  The graph
 * of each schedule is connected:
 *  - ring (allreduce, allgather, reduce-scatter): the cycle rank - 1, rank + 1;
 *  - chain and binomial tree (broadcast, reduce, allreduce as reduce then
 *    broadcast): a spanning tree from the root;
 *  - double binary tree: two spanning trees (one, when the vector has a
 *    single element and the second half is empty);
 *  - recursive doubling and halving-doubling: a hypercube over the p =
 *    2^floor(log2 n) ranks that take part, each rank folded out tied to
 *    the odd rank above it;
 *  - direct, all-to-all and calls of count 0 (every rank's header): every
 *    rank; gather and scatter: the root and every rank;
 *  - the argument exchange: every rank up to AGREE_ALL_MAX ranks (alongside
 *    the data), else recursive doubling (rank ^ 2^k) or dissemination (to
 *    rank + 2^k, from rank - 2^k): each rank reaches rank 0 and back.
 */
#include "coll.h"

static void peers_all(int n, bool *peer)
{
    for (int q = 0; q < n; q++)
        peer[q] = true;
}

/* Recursive doubling and halving-doubling (coll_tree.c): the partner of
 * the fold, for sizes that are not powers of two, and of every round. */
static void peers_hypercube(int n, int me, bool *peer)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    const int rem = n - p;
    int newrank = me - rem;
    if (me < 2 * rem) {
        peer[me % 2 ? me - 1 : me + 1] = true;
        newrank = me % 2 ? me / 2 : -1; /* an even one sits the rounds out */
    }
    for (int mask = 1; newrank >= 0 && mask < p; mask <<= 1) {
        int nr = newrank ^ mask;
        peer[nr < rem ? nr * 2 + 1 : nr + rem] = true;
    }
}

/* The headers of CFX_COLL_CHECK=2 and of a barrier (coll.c coll_exec_run,
 * cfx__coll_agree_all). */
static void peers_agree(const struct cfx_group *g, enum coll_kind kind, enum cfx_algo algo,
                        bool *peer)
{
    const int n = g->size, me = g->rank;
    if (n <= AGREE_ALL_MAX && !(kind == COLL_BARRIER && algo != CFX_ALGO_DIRECT)) {
        peers_all(n, peer);
        return;
    }
    const bool pow2 = (n & (n - 1)) == 0;
    for (int d = 1; d < n; d <<= 1) {
        peer[pow2 ? me ^ d : (me + d) % n] = true;
        peer[pow2 ? me ^ d : coll_mod(me - d, n)] = true;
    }
}

bool cfx__coll_peers(const struct cfx_group *g, enum coll_kind kind, enum cfx_algo algo, int root,
                     size_t count, bool *peer)
{
    const int n = g->size, me = g->rank;
    if (n < 2)
        return true;
    if (coll_has_root(kind) && (root < 0 || root >= n))
        return false;
    if (g->check == COLL_CHECK_ALL || kind == COLL_BARRIER)
        peers_agree(g, kind, algo, peer);
    if (kind == COLL_BARRIER)
        return true; /* the exchange is the barrier */
    if (count == 0) {
        /* only the argument check talks: every rank's header */
        if (g->check == COLL_CHECK_EDGES)
            peers_all(n, peer);
        return true;
    }
    switch (kind) {
    case COLL_ALLREDUCE:
        switch (algo) {
        case CFX_ALGO_RECDBL:
        case CFX_ALGO_RHD:
            peers_hypercube(n, me, peer);
            break;
        case CFX_ALGO_DBTREE:
            for (int t = 0; t < 2; t++) {
                size_t off, len;
                int up, c0, c1;
                coll_block(count, 2, t, &off, &len);
                if (!len)
                    continue; /* this half moves nothing */
                cfx__coll_dtree(n, me, t, &up, &c0, &c1);
                if (up >= 0)
                    peer[up] = true;
                if (c0 >= 0)
                    peer[c0] = true;
                if (c1 >= 0)
                    peer[c1] = true;
            }
            break;
        case CFX_ALGO_TREE:
        case CFX_ALGO_CHAIN:
            cfx__coll_tree_peers(n, me, 0, algo == CFX_ALGO_CHAIN, peer);
            break;
        default:
            peer[(me + 1) % n] = peer[coll_mod(me - 1, n)] = true;
            break;
        }
        return true;
    case COLL_BROADCAST:
    case COLL_REDUCE:
        cfx__coll_tree_peers(n, me, root, algo != CFX_ALGO_TREE, peer);
        return true;
    case COLL_ALLGATHER:
    case COLL_REDUCE_SCATTER:
        if (algo == CFX_ALGO_DIRECT)
            peers_all(n, peer);
        else
            peer[(me + 1) % n] = peer[coll_mod(me - 1, n)] = true;
        return true;
    case COLL_GATHER:
    case COLL_SCATTER:
        if (me == root)
            peers_all(n, peer);
        else
            peer[root] = true;
        return true;
    case COLL_ALLTOALL:
        peers_all(n, peer);
        return true;
    default:
        return false;
    }
}

/*
 * The argument check's question (coll_check.c, "argument check along the
 * messages"): a rank whose wait for another rank runs COLL_CHECK_ASK_MS
 * sends its header to that rank on the check channel.
 *  - Two ranks that wait for each other on different calls (a reduce's root
 *    waits for its children, which wait for it in a broadcast) learn of the
 *    disagreement from the question, not at their deadline.
 *  - The question goes to the rank waited for alone.  It went to every
 *    rank, so any call that ran past 50 ms on some rank (a late rank, a
 *    large ring allreduce) connected every rank to every other: a ring of
 *    4 held connections between ranks two apart, which its schedule never
 *    uses (on verbs each is a queue pair with its receive buffers).
 *  - The news that a rank gave a call up (coll_check.c "failures") goes
 *    along the call's edges and is passed on: every rank whose part
 *    depends on it fails at once naming the cause, and no rank connects
 *    to a rank its schedule never uses.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/coll/coll.h"
#include "dataplane/engine/engine.h"
#define MAX_RANKS 8 /* the ring below */
#include "group_ranks.h"

/* The rank's failure, said in its cfx_last_error() (rank_main keeps that). */
static int fail(struct rank_run *rr, const char *why)
{
    return cfx__err(CFX_ERR_INTERNAL, "rank %d: %s", rr->rank, why);
}

/* After a failed call the group still works: a sum of ones. */
static int still_works(struct rank_run *rr)
{
    int32_t one = 1, sum = 0;
    int rc = cfx_group_allreduce(rr->g, &one, &sum, 1, CFX_DTYPE_I32, CFX_OP_SUM, NULL);
    if (rc != CFX_OK)
        return rc;
    return sum == rr->size ? CFX_OK : fail(rr, "wrong sum after the failed call");
}

/* Rank 0 reduces to itself while the others broadcast from it: rank 0
 * waits for its children and they wait for it, and no message of the call
 * is ever sent.  Every rank fails with CFX_ERR_INVALID well before the
 * 20 s deadline (with it, they would say "timed out"). */
static int body_wait_each_other(struct rank_run *rr)
{
    float v[256];
    for (int i = 0; i < 256; i++)
        v[i] = (float)(rr->rank + i);
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_TIMEOUT, .timeout_ms = 20000 };
    int rc = rr->rank == 0
                 ? cfx_group_reduce(rr->g, v, v, 256, CFX_DTYPE_F32, CFX_OP_SUM, 0, &p)
                 : cfx_group_broadcast(rr->g, v, 256, CFX_DTYPE_F32, 0, &p);
    if (rc != CFX_ERR_INVALID)
        return fail(rr, rc == CFX_OK ? "a call whose ranks disagree returned CFX_OK"
                                     : cfx_last_error());
    if (!strstr(cfx_last_error(), "disagree") || !strstr(cfx_last_error(), "reduce") ||
        !strstr(cfx_last_error(), "broadcast"))
        return fail(rr, cfx_last_error());
    for (int i = 0; rr->rank != 0 && i < 256; i++)
        if (v[i] != (float)(rr->rank + i))
            return fail(rr, "the failed broadcast wrote the buffer");
    return still_works(rr);
}

Test(coll_ask, ranks_that_wait_for_each_other_ask_and_fail, .timeout = 60)
{
    struct rank_run rr[4];
    up("tcp", 4);
    run_ranks(4, "ask_each", 20000, body_wait_each_other, rr);
    all_ok(4, rr);
    down(4);
}

#define RING_COUNT 4096 /* floats */
#define RING_RANKS 8

/* Does @p ctx hold a live data-plane connection with node @p node_id? */
static bool connected(struct cfx_context *ctx, uint32_t node_id)
{
    bool yes = false;
    struct cfx_list *pos;
    pthread_mutex_lock(&ctx->lock);
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->node_id == node_id && c->state != CFX_CONN_FAILED)
            yes = true;
    }
    pthread_mutex_unlock(&ctx->lock);
    return yes;
}

/* The ranks @p me may have talked with: the group's creation ends with a
 * barrier (recursive doubling: me ^ 1, 2, 4), the ring's neighbours. */
static bool schedule_peer(int me, int q, int n)
{
    return q == (me ^ 1) || q == (me ^ 2) || q == (me ^ 4) || q == (me + 1) % n ||
           q == (me + n - 1) % n;
}

static bool any_message(void *arg, const struct cfx_eager_unexp *u)
{
    (void)arg;
    (void)u;
    return true;
}

/* Rank @p rr waits until a question of the call it has not made yet is in
 * (a rank whose wait for it ran COLL_CHECK_ASK_MS asked): it is late by
 * that much, whatever the machine's speed. */
static int wait_asked(struct rank_run *rr)
{
    struct cfx_context *ctx = rr->ctx;
    uint64_t dl = cfx__deadline_ns(15000);
    pthread_mutex_lock(&ctx->lock);
    bool asked;
    while (!(asked = cfx__eager_unexp_scan(ctx, rr->g->chan_chk, any_message, NULL)) &&
           cfx__obj_wait(ctx, dl)) /* an arrival there wakes the context's waiters */
        ;
    pthread_mutex_unlock(&ctx->lock);
    return asked ? CFX_OK : fail(rr, "no rank asked it within 15 s");
}

/* A ring allreduce of 8 ranks that the last joins once a rank waiting for
 * it asked (its wait ran past COLL_CHECK_ASK_MS).  Every value is checked;
 * then no rank holds a connection with a rank neither the creation's
 * barrier nor the ring uses (rank 0: ranks 3, 5 and 6). */
static int body_late_ring(struct rank_run *rr)
{
    static float s[RING_RANKS][RING_COUNT], r[RING_RANKS][RING_COUNT];
    const int me = rr->rank, n = rr->size;
    for (int i = 0; i < RING_COUNT; i++)
        s[me][i] = (float)(me * 1000 + i % 1000);
    if (me == n - 1) {
        int rc = wait_asked(rr);
        if (rc != CFX_OK)
            return rc;
    }
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_ALGO | CFX_COLL_PARAM_TIMEOUT,
                                 .algo = CFX_ALGO_RING, .timeout_ms = 20000 };
    int rc = cfx_group_allreduce(rr->g, s[me], r[me], RING_COUNT, CFX_DTYPE_F32, CFX_OP_SUM, &p);
    if (rc != CFX_OK)
        return rc;
    for (int i = 0; i < RING_COUNT; i++)
        if (r[me][i] != (float)(1000 * n * (n - 1) / 2 + n * (i % 1000)))
            return fail(rr, "wrong sum");
    for (int q = 0; q < n; q++)
        if (q != me && !schedule_peer(me, q, n) && connected(rr->ctx, rr->g->ids[q])) {
            char why[128];
            snprintf(why, sizeof(why), "it holds a connection with rank %d, which neither "
                     "the barrier nor the ring uses", q);
            return fail(rr, why);
        }
    return CFX_OK;
}

Test(coll_ask, a_late_rank_is_asked_by_its_neighbours_alone, .timeout = 60)
{
    struct rank_run rr[RING_RANKS];
    up("tcp", RING_RANKS);
    run_ranks(RING_RANKS, "ask_ring", 20000, body_late_ring, rr);
    all_ok(RING_RANKS, rr);
    down(RING_RANKS);
}

/* ---- the news that a rank gave a call up, along the call's edges ------------------ */

#define NEWS_COUNT 1024 /* floats: every message eager, nothing withdrawn under a peer */

enum news_case {
    NEWS_RING_REFUSED,  /* ring allreduce, rank 5 passes a NULL output */
    NEWS_TREE_REFUSED,  /* tree broadcast from rank 3, the root passes a NULL buffer */
    NEWS_RING_TIMEOUT,  /* ring allreduce, rank 6 never calls, rank 7 times out on it */
};
static enum news_case news_case;
static pthread_barrier_t news_bar;

/* The rank whose failure the others hear of, the broadcast's root. */
#define NEWS_BAD(c) ((c) == NEWS_RING_REFUSED ? 5 : (c) == NEWS_TREE_REFUSED ? 3 : 7)
#define NEWS_ROOT 3
#define NEWS_SILENT 6

/* Adjacent in a binomial tree of @p n ranks from @p root: one is the
 * other's parent (its rank relative to the root less the lowest bit). */
static bool tree_adjacent(int a, int b, int root, int n)
{
    int va = (a - root + n) % n, vb = (b - root + n) % n;
    return (va && (va & (va - 1)) == vb) || (vb && (vb & (vb - 1)) == va);
}

/* The ranks @p me exchanges messages with: the creation's barrier
 * (me ^ 1, 2, 4) and the failing call's schedule. */
static bool news_edge(int me, int q, int n)
{
    bool barrier = q == (me ^ 1) || q == (me ^ 2) || q == (me ^ 4);
    if (news_case == NEWS_TREE_REFUSED)
        return barrier || tree_adjacent(me, q, NEWS_ROOT, n);
    return barrier || q == (me + 1) % n || q == (me + n - 1) % n;
}

/* Rank @p rr's status and error of the failing call, as the case wants. */
static int news_expect(struct rank_run *rr, int rc, const char *why)
{
    const int me = rr->rank, bad = NEWS_BAD(news_case);
    const uint32_t *ids = rr->g->ids;
    char want[200], line[1024];
    int want_rc = CFX_ERR_PEER_FAILED;
    if (news_case == NEWS_RING_TIMEOUT) {
        want_rc = CFX_ERR_TIMEOUT;
        if (me == bad)
            snprintf(want, sizeof(want), "rank %d waited for rank %d (node %u): timed out", me,
                     NEWS_SILENT, ids[NEWS_SILENT]);
        else /* told, not at its own deadline of 20 s */
            snprintf(want, sizeof(want), "rank %d (node %u) waited for rank %d (node %u) until "
                     "its deadline", bad, ids[bad], NEWS_SILENT, ids[NEWS_SILENT]);
    } else if (me == bad) {
        want_rc = CFX_ERR_INVALID;
        snprintf(want, sizeof(want), "NULL buffer");
    } else {
        snprintf(want, sizeof(want), "rank %d (node %u) refused the arguments", bad, ids[bad]);
    }
    if (rc == want_rc && strstr(why, want) && (me == bad || !strstr(why, "timed out")))
        return CFX_OK;
    snprintf(line, sizeof(line), "%s, wanted %s with \"%s\": %s", cfx_errname(rc),
             cfx_errname(want_rc), want, why);
    return fail(rr, line);
}

static int body_news(struct rank_run *rr)
{
    static float buf[MAX_RANKS][NEWS_COUNT], out[MAX_RANKS][NEWS_COUNT];
    const int me = rr->rank, n = rr->size, bad = NEWS_BAD(news_case);
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_ALGO | CFX_COLL_PARAM_TIMEOUT,
                                 .algo = CFX_ALGO_RING, .timeout_ms = 20000 };
    for (int i = 0; i < NEWS_COUNT; i++)
        buf[me][i] = (float)(me + i);
    int rc = CFX_OK;
    switch (news_case) {
    case NEWS_RING_REFUSED:
        rc = cfx_group_allreduce(rr->g, buf[me], me == bad ? NULL : out[me], NEWS_COUNT,
                                 CFX_DTYPE_F32, CFX_OP_SUM, &p);
        break;
    case NEWS_TREE_REFUSED:
        p.algo = CFX_ALGO_TREE;
        rc = cfx_group_broadcast(rr->g, me == bad ? NULL : buf[me], NEWS_COUNT, CFX_DTYPE_F32,
                                 NEWS_ROOT, &p);
        break;
    case NEWS_RING_TIMEOUT:
        if (me == bad)
            p.timeout_ms = 300;
        if (me != NEWS_SILENT)
            rc = cfx_group_allreduce(rr->g, buf[me], out[me], NEWS_COUNT, CFX_DTYPE_F32,
                                     CFX_OP_SUM, &p);
        break;
    }
    char why[512];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    pthread_barrier_wait(&news_bar); /* every rank is out of the call, its news sent */
    for (int q = 0; q < n; q++)
        if (q != me && !news_edge(me, q, n) && connected(rr->ctx, rr->g->ids[q])) {
            char line[160];
            snprintf(line, sizeof(line), "it holds a connection with rank %d, which neither "
                     "the barrier nor the call's schedule uses", q);
            return fail(rr, line);
        }
    if (news_case == NEWS_RING_TIMEOUT && me == NEWS_SILENT)
        return CFX_OK; /* never called: a call behind the others */
    int erc = news_expect(rr, rc, why);
    if (erc != CFX_OK || news_case == NEWS_RING_TIMEOUT)
        return erc;
    return still_works(rr);
}

static void news_run(enum news_case c, const char *name)
{
    struct rank_run rr[RING_RANKS];
    news_case = c;
    pthread_barrier_init(&news_bar, NULL, RING_RANKS);
    up("tcp", RING_RANKS);
    run_ranks(RING_RANKS, name, 20000, body_news, rr);
    pthread_barrier_destroy(&news_bar);
    all_ok(RING_RANKS, rr);
    down(RING_RANKS);
}

/* Rank 5 refuses a ring allreduce of 8 ranks: 4 and 6 hear it from it, the
 * others from their neighbours, each naming rank 5, none at its deadline;
 * rank 5 connects to no rank but its neighbours (and the barrier's). */
Test(coll_ask, a_refusal_travels_along_the_ring, .timeout = 60)
{
    news_run(NEWS_RING_REFUSED, "news_ring");
}

/* The root of a tree broadcast (rank 3 of 8) refuses: its children hear it
 * from it, their children from them. */
Test(coll_ask, a_refusal_travels_down_the_tree, .timeout = 60)
{
    news_run(NEWS_TREE_REFUSED, "news_tree");
}

/* Rank 6 never calls a ring allreduce of 8; rank 7 times out on it after
 * 300 ms, and ranks 0 .. 5 (deadline 20 s) learn it hop by hop round the
 * ring, naming rank 7's wait for rank 6, with CFX_ERR_TIMEOUT. */
Test(coll_ask, a_timeout_travels_round_the_ring, .timeout = 60)
{
    news_run(NEWS_RING_TIMEOUT, "news_timeout");
}

/* ---- news that the rank waiting for this one gave up at its deadline ------------- */

#define BLAME_RANKS 3
static pthread_barrier_t blame_bar;
static size_t blame_count;

/* A chain reduce to rank 0 that rank 2 never calls: rank 0 gives up at its
 * deadline (300 ms) and tells rank 1, the rank it waited for, which was
 * itself waiting for rank 2 (20 s).  Rank 1's error names rank 2, the
 * rank missing, with CFX_ERR_TIMEOUT.  It said "rank 0 waited for rank 1
 * until its deadline", blaming itself, and no rank's error named rank 2. */
static int body_blame(struct rank_run *rr)
{
    static float in[BLAME_RANKS][100000], out[BLAME_RANKS][100000];
    const int me = rr->rank;
    struct cfx_coll_params p = { .field_mask = CFX_COLL_PARAM_ALGO | CFX_COLL_PARAM_TIMEOUT,
                                 .algo = CFX_ALGO_CHAIN, .timeout_ms = me == 0 ? 300 : 20000 };
    int rc = CFX_OK;
    if (me != 2)
        rc = cfx_group_reduce(rr->g, in[me], out[me], blame_count, CFX_DTYPE_F32, CFX_OP_SUM,
                              0, &p);
    char why[512], want[160], line[1024];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    pthread_barrier_wait(&blame_bar); /* rank 2 stays until the others are out */
    if (me == 2)
        return CFX_OK;
    const uint32_t *ids = rr->g->ids;
    if (me == 0)
        snprintf(want, sizeof(want), "rank 0 waited for rank 1 (node %u): timed out", ids[1]);
    else
        snprintf(want, sizeof(want), "rank 1 waited for rank 2 (node %u) when rank 0 (node %u), "
                 "which waited for rank 1, gave the call up", ids[2], ids[0]);
    if (rc == CFX_ERR_TIMEOUT && strstr(why, want))
        return CFX_OK;
    snprintf(line, sizeof(line), "%s, wanted CFX_ERR_TIMEOUT with \"%s\": %s", cfx_errname(rc),
             want, why);
    return fail(rr, line);
}

static void blame_run(const char *tps, size_t count)
{
    struct rank_run rr[BLAME_RANKS];
    blame_count = count;
    pthread_barrier_init(&blame_bar, NULL, BLAME_RANKS);
    up(tps, BLAME_RANKS);
    run_ranks(BLAME_RANKS, "blame", 20000, body_blame, rr);
    pthread_barrier_destroy(&blame_bar);
    all_ok(BLAME_RANKS, rr);
    down(BLAME_RANKS);
}

Test(coll_ask, a_rank_told_it_was_waited_for_names_the_rank_it_waits_for, .timeout = 60)
{
    blame_run("tcp", 16);     /* eager messages */
    blame_run("shm", 100000); /* rendezvous segments */
}

/* The edges the news follows (coll_peers.c), for every schedule, group size
 * 2 .. 40, root and a few counts: symmetric (a rank tells the ranks that
 * wait on it) and connected (passed on, it reaches every rank). */
Test(coll_ask, the_edges_of_every_schedule_are_symmetric_and_connected)
{
    static const struct {
        enum coll_kind kind;
        enum cfx_algo algo;
    } s[] = {
        { COLL_ALLREDUCE, CFX_ALGO_RING },      { COLL_ALLREDUCE, CFX_ALGO_RECDBL },
        { COLL_ALLREDUCE, CFX_ALGO_RHD },       { COLL_ALLREDUCE, CFX_ALGO_DBTREE },
        { COLL_ALLREDUCE, CFX_ALGO_TREE },      { COLL_ALLREDUCE, CFX_ALGO_CHAIN },
        { COLL_BROADCAST, CFX_ALGO_TREE },      { COLL_BROADCAST, CFX_ALGO_CHAIN },
        { COLL_REDUCE, CFX_ALGO_TREE },         { COLL_REDUCE, CFX_ALGO_CHAIN },
        { COLL_ALLGATHER, CFX_ALGO_RING },      { COLL_ALLGATHER, CFX_ALGO_DIRECT },
        { COLL_REDUCE_SCATTER, CFX_ALGO_RING }, { COLL_GATHER, CFX_ALGO_DIRECT },
        { COLL_SCATTER, CFX_ALGO_DIRECT },      { COLL_ALLTOALL, CFX_ALGO_DIRECT },
        { COLL_BARRIER, CFX_ALGO_RECDBL },      { COLL_BARRIER, CFX_ALGO_DIRECT },
    };
    static const size_t counts[] = { 0, 1, 7, 4096 };
    enum { N = 40 };
    static bool adj[N][N];
    for (int check = COLL_CHECK_OFF; check <= COLL_CHECK_ALL; check++)
        for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (int n = 2; n <= N; n++)
                    for (int root = 0; root < n; root += 3) {
                        struct cfx_group g = { .size = n, .check = (enum coll_check)check };
                        memset(adj, 0, sizeof(adj));
                        for (g.rank = 0; g.rank < n; g.rank++)
                            cr_assert(cfx__coll_peers(&g, s[i].kind, s[i].algo, root, counts[c],
                                                      adj[g.rank]));
                        bool seen[N] = { true }, grew = true;
                        while (grew) {
                            grew = false;
                            for (int p = 0; p < n; p++)
                                for (int q = 0; q < n; q++) {
                                    cr_assert_eq(adj[p][q], adj[q][p], "kind %d algo %d check "
                                                 "%d n %d: ranks %d, %d", s[i].kind, s[i].algo,
                                                 check, n, p, q);
                                    if (seen[p] && adj[p][q] && !seen[q])
                                        seen[q] = grew = true;
                                }
                        }
                        for (int q = 0; q < n; q++)
                            cr_assert(seen[q] || (counts[c] == 0 && check == COLL_CHECK_OFF &&
                                                  s[i].kind != COLL_BARRIER),
                                      "kind %d algo %d check %d count %zu n %d: rank %d not "
                                      "reached", s[i].kind, s[i].algo, check, counts[c], n, q);
                    }
}

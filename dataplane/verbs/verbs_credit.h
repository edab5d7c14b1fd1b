/*
 * verbs transport: receive-credit and selective-signaling accounting.
 *
 * Pure bookkeeping with no verbs calls, so that the rules that keep an RC
 * connection free of RNR naks and of stuck send queues are unit tested on a
 * machine without RDMA (test/unit/test_verbs_credit.c).
 *
 * Receive credits (struct cfx__verbs_fc).  Every SEND and every
 * RDMA_WRITE_WITH_IMM consumes one receive WQE at the peer.  The sender holds
 * one credit per receive the peer has posted for it and never posts a
 * message without one, so the responder never runs out of receives (RNR).
 * The receiver counts the receives it has re-posted ("owed") and returns
 * them piggybacked on its next SEND (immediate data), or with a zero-length
 * credit message once owed reaches the threshold.  The last `reserve`
 * credits are kept for credit messages: data can never take them, so two
 * peers that both exhausted their credits can still tell each other about
 * freed receives (no credit deadlock).  A credit message is only sent once
 * `thresh` (> 1) receives are owed, so credit messages answering credit
 * messages die out geometrically instead of ping-ponging.
 *
 * Selective signaling (struct cfx__verbs_sq).  Send WRs complete in order,
 * so one signaled CQE retires every WR posted before it.  A WR is signaled
 * when (a) no signaled WR is outstanding, (b) `interval` WRs went unsignaled,
 * or (c) it takes one of the last two slots of the queue: the queue can then
 * never fill with WRs that no CQE will retire.  WRs posted after the last
 * signaled one are "uncovered"; when the last signaled WR retires and
 * uncovered WRs remain, the endpoint posts a signaled no-op (a zero-length
 * RDMA write) so that their completions are reported.  The last slot is kept
 * for that no-op: ordinary posts stop at depth - 1.  Until the peer's QP
 * takes remote writes (verbs_ep.c: MSG_AUTHZ) every WR is posted with
 * force, so none is uncovered and no no-op is needed.
 *
 * Sequence numbers are free-running uint32_t; differences are taken modulo
 * 2^32.  Threading: owned by one endpoint, driven by one thread.
 */
#ifndef CFX_VERBS_CREDIT_H
#define CFX_VERBS_CREDIT_H

#include <stdbool.h>
#include <stdint.h>

struct cfx__verbs_fc {
    uint32_t rq_depth;    /* receives each side keeps posted for the other */
    uint32_t thresh;      /* owed receives that trigger a credit message */
    uint32_t reserve;     /* credits kept for credit messages */
    uint32_t tx_credits;  /* receives the peer has posted for us */
    uint32_t rx_owed;     /* receives re-posted here, not yet told to the peer */
};

/* Initialise: @p peer_rq receives posted by the peer for us; ours is @p rq. */
void cfx__verbs_fc_init(struct cfx__verbs_fc *fc, uint32_t rq, uint32_t peer_rq);

/* May a data message (SEND or WRITE_WITH_IMM) be posted now? */
static inline bool cfx__verbs_fc_can_data(const struct cfx__verbs_fc *fc)
{
    return fc->tx_credits > fc->reserve;
}

/* May a credit message be posted now? */
static inline bool cfx__verbs_fc_can_ctrl(const struct cfx__verbs_fc *fc)
{
    return fc->tx_credits > 0;
}

/* A message was posted: one peer receive is used. */
static inline void cfx__verbs_fc_consume(struct cfx__verbs_fc *fc)
{
    fc->tx_credits--;
}

/* The peer returned @p n credits.  false: more than it could have owed
 * (protocol error; credits are left unchanged). */
bool cfx__verbs_fc_grant(struct cfx__verbs_fc *fc, uint32_t n, uint32_t peer_rq);

/* @p n receives were re-posted here. */
static inline void cfx__verbs_fc_reposted(struct cfx__verbs_fc *fc, uint32_t n)
{
    fc->rx_owed += n;
}

/* Take the owed credits to piggyback on an outgoing message (at most
 * @p max; the rest stays owed). */
uint32_t cfx__verbs_fc_take(struct cfx__verbs_fc *fc, uint32_t max);

/* Give back credits taken by cfx__verbs_fc_take() for a post that failed. */
static inline void cfx__verbs_fc_untake(struct cfx__verbs_fc *fc, uint32_t n)
{
    fc->rx_owed += n;
}

/* Is a standalone credit message due? */
static inline bool cfx__verbs_fc_need_msg(const struct cfx__verbs_fc *fc)
{
    return fc->rx_owed >= fc->thresh;
}

struct cfx__verbs_sq {
    uint32_t depth;       /* WRs the send queue holds */
    uint32_t interval;    /* signal at least every interval-th WR */
    uint32_t posted;      /* sequence of the next WR to post */
    uint32_t retired;     /* sequence of the oldest WR not retired */
    uint32_t last_sig;    /* sequence of the newest signaled WR */
    uint32_t run;         /* unsignaled WRs posted since the last signaled one */
    bool any_sig;         /* last_sig is valid */
};

/* depth >= 4; interval >= 1 (1: signal everything). */
void cfx__verbs_sq_init(struct cfx__verbs_sq *sq, uint32_t depth, uint32_t interval);

/* WRs posted and not retired. */
static inline uint32_t cfx__verbs_sq_outstanding(const struct cfx__verbs_sq *sq)
{
    return sq->posted - sq->retired;
}

/* Room for an ordinary WR (the last slot is the no-op's). */
static inline bool cfx__verbs_sq_can_post(const struct cfx__verbs_sq *sq)
{
    return cfx__verbs_sq_outstanding(sq) + 1 < sq->depth;
}

/* Is a signaled WR outstanding? */
bool cfx__verbs_sq_sig_outstanding(const struct cfx__verbs_sq *sq);

/* Account for posting one WR; returns whether it must be signaled.
 * @p force: the caller wants it signaled anyway (the no-op). */
bool cfx__verbs_sq_post(struct cfx__verbs_sq *sq, bool force);

/* Undo the last cfx__verbs_sq_post() (ibv_post_send failed).  The state
 * before that post is passed back in @p saved. */
static inline void cfx__verbs_sq_unpost(struct cfx__verbs_sq *sq,
                                        const struct cfx__verbs_sq *saved)
{
    *sq = *saved;
}

/* The signaled WR @p seq completed: it and every WR before it retire.
 * Returns the number retired (0 for a sequence outside the window). */
uint32_t cfx__verbs_sq_retire(struct cfx__verbs_sq *sq, uint32_t seq);

/* Uncovered WRs with no signaled WR outstanding: post a signaled no-op. */
static inline bool cfx__verbs_sq_need_nop(const struct cfx__verbs_sq *sq)
{
    return cfx__verbs_sq_outstanding(sq) > 0 && !cfx__verbs_sq_sig_outstanding(sq);
}

#endif

/*
 * Point-to-point messages between nodes: the primitive the group
 * collectives are built on.
 *
 * Messages up to the receiver's CFX_EAGER_MAX go eager (eager.c): one
 * send carrying the match information and the payload, copied into the
 * first matching posted receive or held in a bounded unexpected queue; the
 * send completes when the transport took the copy (it cannot be withdrawn
 * after that), and a size disagreement fails only the receive
 * (CFX_ERR_INVALID).
 *
 * Larger ones use receiver-driven rendezvous over the same one-sided
 * machinery as object gets: a receive registers its buffer and sends a
 * request (GET_REQ with the P2P flag, a channel and a tag) to the sender;
 * the sender matches it, in posting order, with a send posted for the same
 * (peer, channel, tag) and writes the message with immediates into the
 * receiver's buffer.  Sizes must agree exactly: a mismatch fails both sides
 * with CFX_ERR_INVALID.  Each class matches in posting order on its own.
 *
 * Withdrawal (cfx__p2p_free of a running request) keeps that order, as
 * MPI's cancel does: a receive withdrawn before its message was matched
 * leaves the message to the next receive of its (peer, channel, tag) (one
 * matched but with none of it landed too, for cfx__p2p_isend_reoffer), and
 * a withdrawn send leaves its receive to the next send.  So a caller that
 * withdraws several messages of one key goes from the last posted to the
 * first: what is left is then the head of the sequence on both sides,
 * and no message of it is taken by a receive meant for a later one (the
 * collectives' cleanup, coll.c).
 *
 * Any thread may call these; a request is used by one thread at a time.
 */
#ifndef CFX_ENGINE_P2P_H
#define CFX_ENGINE_P2P_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <conflux/conflux.h>

#include "control/client.h"

struct cfx_p2p_req;

/* Post a send of @p len bytes at @p buf to @p peer.  The buffer must stay
 * unchanged until the request completes. */
int cfx__p2p_isend(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                   uint32_t tag, const void *buf, size_t len, enum cfx_memtype mt,
                   struct cfx_p2p_req **out);

/* As cfx__p2p_isend, for a message whose receiver may withdraw a receive
 * and post another (a group's send): when the receive that matched it is
 * withdrawn before any of it landed there (it may have matched a request the
 * receiver had withdrawn already), the message goes on to the next receive
 * of its key instead of failing.  A collective's send fails so: its call is
 * over on the receiver's side. */
int cfx__p2p_isend_reoffer(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                           uint64_t chan, uint32_t tag, const void *buf, size_t len,
                           enum cfx_memtype mt, struct cfx_p2p_req **out);

/* As cfx__p2p_isend of host memory, when another send to @p peer follows at
 * once: an eager send is queued for that one to send with it (tcp: one
 * sendmsg for both).  The last of such a run is a plain cfx__p2p_isend. */
int cfx__p2p_isend_more(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                        uint32_t tag, const void *buf, size_t len, struct cfx_p2p_req **out);

/* As cfx__p2p_isend_more, for the first of @p n (>= 2) eager sends to
 * @p peer posted next on one queue (the others by cfx__p2p_isend_more, the
 * last by cfx__p2p_isend): they go to the peer together, once the peer's
 * slots take all of them, or not at all (withdrawn or failed while they
 * wait): never some of them.  The pieces of one message. */
int cfx__p2p_isend_batch(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                         uint64_t chan, uint32_t tag, const void *buf, size_t len, int n,
                         struct cfx_p2p_req **out);

/* As cfx__p2p_isend of host memory, for a small control message that must
 * reach @p peer while ordinary eager sends to it wait for credits: it may
 * use the CFX_EAGER_URGENT credits those leave, and waits in a queue of
 * its own that goes first (order is kept among urgent sends, and among the
 * others).  A group's check channel.  (Over the peer's eager threshold it
 * goes by rendezvous as any send.) */
int cfx__p2p_isend_urgent(struct cfx_context *ctx, const struct cfx_node_rec *peer,
                          uint64_t chan, uint32_t tag, const void *buf, size_t len,
                          struct cfx_p2p_req **out);

/* Post a receive of exactly @p len bytes from @p peer into @p buf. */
int cfx__p2p_irecv(struct cfx_context *ctx, const struct cfx_node_rec *peer, uint64_t chan,
                   uint32_t tag, void *buf, size_t len, enum cfx_memtype mt,
                   struct cfx_p2p_req **out);

/* CFX_ERR_AGAIN while running, else the final status. */
int cfx__p2p_test(struct cfx_p2p_req *req);

/* Wait until done or the deadline (CLOCK_MONOTONIC ns; UINT64_MAX = none).
 * CFX_ERR_TIMEOUT leaves the request running; cfx_last_error() names the peer. */
int cfx__p2p_wait(struct cfx_p2p_req *req, uint64_t deadline_ns);

/* Wait for all; returns the first failure (and stops waiting at it) or
 * CFX_ERR_TIMEOUT.  Requests stay owned by the caller. */
int cfx__p2p_waitall(struct cfx_p2p_req **reqs, int n, uint64_t deadline_ns);

/* As cfx__p2p_wait(), in a blocking call whose thread's interrupt check may
 * stop it (within cfx__intr_begin() .. _end()): CFX_ERR_CANCELED once the
 * check fired, the request left running (error text left to the caller,
 * who withdraws it: cfx__p2p_withdraw(), cfx__p2p_cancel()). */
int cfx__p2p_wait_intr(struct cfx_p2p_req *req, uint64_t deadline_ns);

/* As cfx__p2p_wait(), and also fail with CFX_ERR_PEER_FAILED (setting *dead
 * to its index) as soon as any of @p nodes is known dead, or the request's
 * peer left the cluster in good order (cfx__p2p_node_left() tells which) —
 * so every member of a group learns of a death, not only the ones that
 * talk to that node (a member that left in good order may have finished
 * its part of the call: only the peer's leave ends a wait).  *dead is -1
 * otherwise.  What is already on its way may still land first: 300 ms of
 * grace, and while a connection with a node that left is open. */
int cfx__p2p_wait_watch(struct cfx_p2p_req *req, uint64_t deadline_ns, const uint32_t *nodes,
                        int nnodes, int *dead);

/* As cfx__p2p_wait_watch(), and also give up with CFX_ERR_CANCELED and
 * *@p was_stopped set (error text left to the caller) as soon as @p stop
 * returns true (a request that itself ends CANCELED leaves it false); @p
 * stop is called with the context lock held on every wake-up, so it may
 * only look at requests (cfx__p2p_status_locked) and memory they completed
 * into. */
int cfx__p2p_wait_stop(struct cfx_p2p_req *req, uint64_t deadline_ns, const uint32_t *nodes,
                       int nnodes, int *dead, bool (*stop)(void *), void *arg, bool *was_stopped);

/* Whether the coordinator reported @p node gone in good order (takes the
 * context lock). */
bool cfx__p2p_node_left(struct cfx_context *ctx, uint32_t node);
/* ctx->lock held: what the coordinator said of @p node, which does not
 * come back (ids are never reused): CFX_NODE_DEAD, CFX_NODE_LEFT (in good
 * order), or 0 (nothing, or too long ago: the lists are rings). */
enum { CFX_NODE_DEAD = 1, CFX_NODE_LEFT = 2 };
int cfx__node_gone(const struct cfx_context *ctx, uint32_t node);

/* Status of @p req (CFX_ERR_AGAIN while running); the context lock held. */
int cfx__p2p_status_locked(const struct cfx_p2p_req *req);

/* A send its receiver has not asked for yet (ctx->lock not held): freed
 * now, it fails nothing on the receiver's side, whose request, when it
 * comes, waits here for a send that matches it.  Counted when true
 * (ctx->n_sends_unasked: the caller withdraws it without a grace). */
bool cfx__p2p_send_unasked(struct cfx_p2p_req *req);

/* Sends @p reqs[0..n-1] of one peer, posted in that order, are withdrawn
 * together if the first has not left yet (an eager send still queued for
 * the receiver's slots, a rendezvous send not asked for), so the receiver
 * sees none of them; true then (their requests end CFX_ERR_CANCELED, still
 * the caller's to free).  False, and nothing withdrawn, once it left. */
bool cfx__p2p_withdraw_unsent(struct cfx_p2p_req **reqs, int n);

/* cfx__p2p_wait() then cfx__p2p_free(), the request gone either way
 * (cfx_last_error() still names the peer on failure).  An eager message
 * that completed goes back to the free list in the same hold of the
 * context lock as the end of its wait. */
int cfx__p2p_wait_free(struct cfx_p2p_req *req, uint64_t deadline_ns);

/* As cfx__p2p_wait_free(), in a blocking call whose thread's interrupt
 * check may stop it (within cfx__intr_begin() .. _end()): once the check
 * fired, the request is withdrawn as cfx__p2p_withdraw() does and, unless
 * it ended first, freed with CFX_ERR_CANCELED (the caller says why). */
int cfx__p2p_wait_free_intr(struct cfx_p2p_req *req, uint64_t deadline_ns);

/* Withdraw a request still running, as its free would (ctx->lock not
 * held), and return its status after: CFX_ERR_CANCELED when withdrawn,
 * else how it ended first.  A receive not yet matched takes nothing (the
 * message, when it comes, is left for the next receive of its tag); one
 * under way (rendezvous) is cut off, and its sender's send fails
 * CFX_ERR_CANCELED.  A send not yet taken is not sent; one under way
 * drains the writes in flight and stops, and its receive fails
 * CFX_ERR_NOT_FOUND.  The request stays the caller's to free. */
int cfx__p2p_withdraw(struct cfx_p2p_req *req);

/* An eager receive still waiting is withdrawn (it cannot take a message
 * any more); then, as for any request, its status: CFX_ERR_CANCELED when
 * withdrawn here, CFX_ERR_AGAIN for another kind still running, else how it
 * ended (so a message that landed as its wait timed out is not lost).  The
 * request stays the caller's to free. */
int cfx__p2p_cancel(struct cfx_p2p_req *req);

/* A send whose caller takes the buffer back before the send ended (the
 * caller's own call failed at its deadline while the message still waits
 * for credits or for the receiver): from here on the send reads a copy the
 * engine made of the buffer now, freed with the request; its outcome and
 * its place in the order are unchanged.  CFX_OK also when the send no
 * longer reads the buffer (ended; eager and handed over).  CFX_ERR_AGAIN:
 * matched and writing from the buffer (wait for it, or free it to withdraw
 * it); CFX_ERR_NOMEM: no memory for the copy (the same); CFX_ERR_INVALID:
 * not a send. */
int cfx__p2p_send_detach(struct cfx_p2p_req *req);

/* Free a request; one still running is withdrawn first (the peer sees its
 * side fail).  NULL is a no-op. */
void cfx__p2p_free(struct cfx_p2p_req *req);

#endif

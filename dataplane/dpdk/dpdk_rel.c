/*
 * dpdk transport, reliability layer: sessions over a lossy datagram service.
 *
 * Send side: messages queue in a ring (sendq) and go out as packets of
 * mtu_payload bytes with consecutive sequence numbers.  A packet leaves
 * when three windows allow it: the ring of packets in flight (snd_slots),
 * the peer's advertised window (snd_right) and the congestion window
 * (cwnd, counted against `pipe`: packets sent and not yet acked, sacked or
 * found lost).  Losses are found two ways: from the sack bitmap, as RACK
 * does (a packet sent before one that arrived, by more than a quarter of
 * the minimum RTT or three sequence numbers, is lost), and by the
 * retransmission timer (RTO from the smoothed RTT, doubled on each timeout
 * up to rto_max; max_retries timeouts in a row fail the session).  A lost
 * tail, which no later packet reveals, is found by a probe (RACK-TLP,
 * RFC 8985): two smoothed RTTs after the last send with nothing acked, the
 * highest packet in flight goes again once, and the sack it brings back
 * lets RACK find the rest, long before the timer.
 *
 * Congestion control: AIMD on packets, as in TCP Reno with SACK, plus a
 * delay signal after Timely (eRPC's choice), taken on the smallest RTT of
 * each window of data: above t_high it cuts the window in proportion to
 * how far above it is; above t_low it ends slow start.  Loss and delay
 * cuts are multiplicative, at most once per window of data, and growth
 * additive, so flows sharing a bottleneck converge to equal windows.
 *
 * Receive side: a ring of rcv_slots packets indexed by sequence number is
 * the reorder buffer; the advertised window is what is left of it past the
 * cumulative ack, so its right edge (rcv_dlv + rcv_slots) only moves
 * forward.  In-order packets are reassembled into whole messages and
 * handed to deliver(); a refused message holds everything behind it.
 * Copies: a packet that arrives in order with nothing buffered before it
 * never enters the reorder buffer; a message that place() gives an address
 * is copied there from the packet (one copy, the receive's only one), other
 * messages through the reassembly buffer.  Only packets that came out of
 * order, or behind a refused message, pass through the reorder buffer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dpdk_rel.h"

struct cfx__dpdk_msg {
    const uint8_t *buf; /* caller's bytes, valid until sent() */
    uint32_t len;       /* bytes */
    uint32_t msg_id;    /* on the wire */
    uint16_t frag_cnt;  /* packets it takes */
    uint16_t next_frag; /* next fragment to send the first time */
    void *cookie;       /* handed back to sent() */
};

struct cfx__dpdk_tx_slot {
    uint64_t sent_ns;  /* last transmission */
    uint32_t msg;      /* sendq index (unwrapped) of its message */
    uint16_t frag_idx; /* fragment of that message */
    bool last;         /* last fragment: the message completes with its ack */
    bool in_pipe;      /* counted in pipe */
    bool lost;         /* found lost, waits for retransmission */
    bool sacked;       /* the peer has it, out of order */
    bool retx;         /* retransmitted at least once (Karn) */
};

struct cfx__dpdk_rx_slot {
    bool used; /* holds packet seq */
    uint32_t seq;
    uint16_t len;
    uint16_t frag_idx;
    uint16_t frag_cnt;
    uint32_t msg_id;
    uint32_t msg_len;
};

static inline int32_t seq_diff(uint32_t a, uint32_t b)
{
    return (int32_t)(a - b);
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}
static inline uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

__attribute__((format(printf, 3, 4))) static int sess_fail(struct cfx__dpdk_sess *s, int rc,
                                                           const char *fmt, ...)
{
    if (s->error)
        return s->error;
    int n =
        snprintf(s->error_msg, sizeof(s->error_msg), "session %u to %s: ", s->local_id, s->peer);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(s->error_msg))
        vsnprintf(s->error_msg + n, sizeof(s->error_msg) - (size_t)n, fmt, ap);
    va_end(ap);
    s->error = rc;
    CFX_LOG(ERR, DPDK, "%s", s->error_msg);
    return rc;
}

static void params_fill(struct cfx__dpdk_rel_params *p)
{
#define DEF(f, v) \
    if (!p->f)    \
        p->f = (v);
    DEF(mtu_payload, 1024);
    DEF(snd_slots, 256);
    DEF(rcv_slots, 256);
    DEF(sendq_max, 128);
    DEF(msg_max, 1u << 20);
    DEF(max_retries, 8);
    /* eRPC's RTO.  A host-stack timer has to outlast the host's own
     * stalls (a polling thread that lost its core for a few ms) or it
     * resends what is merely not read yet, and the timeout's window of
     * one packet then throttles the flow: docs/PERFORMANCE_DPDK.md, 200 us
     * against 5 ms under load.  Losses with later packets behind them are
     * found from the sack (RACK) and a lost tail by the probe, both
     * without waiting for the timer. */
    DEF(rto_init_ns, 5000000);
    DEF(rto_min_ns, 5000000);
    DEF(rto_max_ns, 100000000);
    DEF(cwnd_init, 16);
    DEF(t_low_ns, 50000); /* Timely's defaults for a datacenter */
    DEF(t_high_ns, 500000);
    DEF(rev_epoch_ns, 2000000000);
#undef DEF
}

int cfx__dpdk_sess_init(struct cfx__dpdk_sess *s, const struct cfx__dpdk_rel_params *p,
                        const struct cfx__dpdk_rel_ops *ops, void *ctx, uint32_t local_id,
                        uint32_t peer_id, const char *peer)
{
    memset(s, 0, sizeof(*s));
    if (p)
        s->p = *p;
    params_fill(&s->p);
    const struct cfx__dpdk_rel_params *q = &s->p;
    if (q->mtu_payload > CFX_DPDK_PAYLOAD_MAX || q->snd_slots > CFX_DPDK_WIN_MAX ||
        q->rcv_slots > CFX_DPDK_WIN_MAX || q->sendq_max > 65536 || q->msg_max > CFX_DPDK_MSG_MAX ||
        (q->msg_max + q->mtu_payload - 1) / q->mtu_payload > CFX_DPDK_FRAG_MAX ||
        q->t_low_ns > q->t_high_ns || q->rto_min_ns > q->rto_max_ns ||
        /* slots are sequence numbers modulo the ring: only a power of two
         * keeps that mapping across the 2^32 wrap */
        (q->snd_slots & (q->snd_slots - 1)) || (q->rcv_slots & (q->rcv_slots - 1)) ||
        (q->sendq_max & (q->sendq_max - 1)))
        return CFX_ERR_INVALID;
    s->ops = ops;
    s->ctx = ctx;
    s->local_id = local_id;
    s->peer_id = peer_id;
    snprintf(s->peer, sizeof(s->peer), "%s", peer ? peer : "?");

    s->sendq = calloc(q->sendq_max, sizeof(*s->sendq));
    s->tx = calloc(q->snd_slots, sizeof(*s->tx));
    s->rx = calloc(q->rcv_slots, sizeof(*s->rx));
    s->rx_buf = malloc((size_t)q->rcv_slots * q->mtu_payload);
    if (!s->sendq || !s->tx || !s->rx || !s->rx_buf) {
        cfx__dpdk_sess_fini(s);
        return CFX_ERR_NOMEM;
    }
    s->snd_una = s->snd_nxt = q->isn;
    s->snd_right = q->isn + q->rcv_slots; /* until the peer says otherwise: its own default */
    s->recover = q->isn;
    s->rack_seq = q->isn;
    s->delay_cut_seq = q->isn;
    s->delay_ok = true;
    s->rev_base_ns[0] = s->rev_base_ns[1] = INT64_MAX;
    s->rcv_nxt = s->rcv_dlv = s->rcv_high = q->isn;
    s->cwnd = q->cwnd_init;
    s->ssthresh = q->snd_slots;
    s->rto_ns = q->rto_init_ns;
    return CFX_OK;
}

void cfx__dpdk_sess_fini(struct cfx__dpdk_sess *s)
{
    if (!s)
        return;
    free(s->sendq);
    free(s->tx);
    free(s->rx);
    free(s->rx_buf);
    free(s->asm_buf);
    s->sendq = NULL;
    s->tx = NULL;
    s->rx = NULL;
    s->rx_buf = NULL;
    s->asm_buf = NULL;
}

static inline struct cfx__dpdk_tx_slot *tx_slot(struct cfx__dpdk_sess *s, uint32_t seq)
{
    return &s->tx[seq % s->p.snd_slots];
}

static inline struct cfx__dpdk_rx_slot *rx_slot(struct cfx__dpdk_sess *s, uint32_t seq)
{
    return &s->rx[seq % s->p.rcv_slots];
}

static inline uint8_t *rx_payload(struct cfx__dpdk_sess *s, uint32_t seq)
{
    return s->rx_buf + (size_t)(seq % s->p.rcv_slots) * s->p.mtu_payload;
}

/* --- acknowledgements we send --------------------------------------------- */

static void fill_ack(struct cfx__dpdk_sess *s, struct cfx__dpdk_hdr *h, uint64_t now)
{
    uint64_t sack = 0;

    h->flags |= CFX_DPDK_F_ACK;
    h->ack = s->rcv_nxt;
    h->window = (uint16_t)(s->p.rcv_slots - (s->rcv_nxt - s->rcv_dlv));
    /* nothing received past the cumulative ack: nothing to sack (the
     * common case, and a scan of 64 slots per ack otherwise) */
    for (uint32_t i = 0; s->rcv_high != s->rcv_nxt && i < CFX_DPDK_SACK_BITS; i++) {
        uint32_t seq = s->rcv_nxt + 1 + i;
        if (seq - s->rcv_dlv >= s->p.rcv_slots)
            break;
        const struct cfx__dpdk_rx_slot *r = rx_slot(s, seq);
        if (r->used && r->seq == seq)
            sack |= 1ull << i;
    }
    h->sack = sack;
    h->ts_echo = s->ts_echo;
    uint64_t held = now > s->echo_since ? now - s->echo_since : 0;
    h->echo_delay = held > UINT32_MAX ? UINT32_MAX : (uint32_t)held;
}

/*
 * Acknowledgements (as TCP's delayed ack, RFC 1122 and 9000's ack
 * frequency): one per ACK_EVERY in-order data packets, or ACK_DELAY_NS
 * after the first one it owes, riding on a data packet when one leaves
 * first (a message of one packet is usually answered within the delay);
 * at once for the last packet of a message of several (its sender
 * completes on it), a packet out of order, seen before, past the
 * window or filling a hole even in part (the sack shows the sender what
 * is missing), a window that opened, and a probe.  One ack per packet
 * takes 5.7% of a 1500-byte link (an 86-byte frame per 1514): in a pipelined
 * chain a forwarding node's link carries its acks upstream beside its
 * data.  The delay an ack waits here is in echo_delay, so the sender's
 * delay signal leaves it out.
 */
#define ACK_EVERY    4
#define ACK_DELAY_NS 50000ull

static void ack_clear(struct cfx__dpdk_sess *s)
{
    s->ack_pending = false;
    s->ack_now = false;
    s->ack_owed = 0;
}

/* An ack is owed at once. */
static void ack_soon(struct cfx__dpdk_sess *s)
{
    s->ack_pending = true;
    s->ack_now = true;
}

/* An ack is owed for an in-order packet that came at `since`. */
static void ack_later(struct cfx__dpdk_sess *s, uint64_t since)
{
    if (!s->ack_pending)
        s->ack_due = since + ACK_DELAY_NS;
    s->ack_pending = true;
    if (++s->ack_owed >= ACK_EVERY)
        s->ack_now = true;
}

static void send_ack(struct cfx__dpdk_sess *s, uint64_t now, uint8_t extra)
{
    struct cfx__dpdk_hdr h = { .flags = extra, .session = s->peer_id, .ts = now };

    fill_ack(s, &h, now);
    if (s->ops->tx(s->ctx, &h, NULL) == CFX_ERR_AGAIN)
        return; /* stays pending: the next poll tries again */
    ack_clear(s);
    s->stats.tx_ack++;
}

/* --- congestion control ---------------------------------------------------- */

static void cc_clamp(struct cfx__dpdk_sess *s)
{
    if (s->cwnd < 1.0)
        s->cwnd = 1.0;
    if (s->cwnd > s->p.snd_slots)
        s->cwnd = s->p.snd_slots;
}

/* A loss of packet seq: one multiplicative cut per window of data. */
static void cc_on_loss(struct cfx__dpdk_sess *s, uint32_t seq)
{
    if (seq_diff(seq, s->recover) < 0)
        return;
    s->ssthresh = s->cwnd / 2 > 2.0 ? s->cwnd / 2 : 2.0;
    s->cwnd = s->ssthresh;
    s->recover = s->snd_nxt;
    s->delay_cut_seq = s->snd_nxt;
    s->stats.cwnd_cut_loss++;
    cc_clamp(s);
}

static void cc_grow(struct cfx__dpdk_sess *s, uint32_t acked)
{
    if (seq_diff(s->snd_una, s->recover) < 0)
        return; /* still recovering from a loss */
    if (s->cwnd < s->ssthresh)
        s->cwnd += acked;
    else
        s->cwnd += (double)acked / s->cwnd;
    cc_clamp(s);
}

/* A delay cut by factor (in (0, 1]). */
static void cc_delay_cut(struct cfx__dpdk_sess *s, double factor)
{
    /* never under the initial window on delay alone (as eRPC's Timely keeps
     * a minimum rate): a host so loaded that every RTT sample is over
     * t_high would otherwise send one packet per RTT for ever; a queue that
     * overflows still cuts further, by loss */
    double floor = s->p.cwnd_init;
    if (s->cwnd <= floor)
        return;
    s->cwnd = s->cwnd * factor < floor ? floor : s->cwnd * factor;
    if (s->ssthresh > s->cwnd)
        s->ssthresh = s->cwnd;
    s->stats.cwnd_cut_delay++;
    cc_clamp(s);
}

/*
 * The delay signal, decided once per window of data and at least
 * DELAY_SAMPLES RTT samples, on the smallest sample among them (as LEDBAT
 * filters its delay): a queue delays every packet that crosses it, but a
 * host whose polling thread lost its core delays only the packets that
 * came meanwhile.  The RTT here is the path's: the poll gaps of both hosts
 * are left out of it (process_ack).
 *   - over t_high: cut by 1 - 0.5 (1 - t_high / rtt) (Timely's cut);
 *   - over t_low: a queue is forming, so slow start ends there (as
 *     HyStart leaves it on a rising RTT) and the window grows by one
 *     packet per window;
 *   - otherwise the window grows as AIMD says.
 * Timely's gradient rule (a cut whenever the RTT between t_low and t_high
 * rises) is not used: on a host that stalls, consecutive samples differ by
 * the stalls, and with it, or with cuts on single samples, the window sat
 * at one packet on the 2-core cluster (docs/PERFORMANCE_DPDK.md).  The
 * thresholds are absolute RTTs: every flow through the same queue sees
 * the same signal and cuts by the same factor, which is what makes AIMD
 * converge to equal shares.  (Against each flow's own minimum RTT a flow
 * that starts behind a standing queue takes that queue for its base and
 * starves the others: the first version here did, 4% to 96%.)
 */
#define DELAY_SAMPLES 8

static void cc_on_ack(struct cfx__dpdk_sess *s, uint32_t acked, uint64_t rtt)
{
    if (rtt) {
        if (!s->win_samples || rtt < s->win_min_rtt_ns)
            s->win_min_rtt_ns = rtt;
        s->win_samples++;
    }
    if (s->win_samples >= DELAY_SAMPLES && seq_diff(s->snd_una, s->delay_cut_seq) >= 0) {
        double m = (double)s->win_min_rtt_ns;
        s->delay_ok = m <= (double)s->p.t_high_ns;
        if (!s->delay_ok)
            cc_delay_cut(s, 1.0 - 0.5 * (1.0 - (double)s->p.t_high_ns / m));
        else if (m > (double)s->p.t_low_ns && s->ssthresh > s->cwnd)
            s->ssthresh = s->cwnd;
        s->win_samples = 0;
        s->delay_cut_seq = s->snd_nxt;
    }
    if (s->delay_ok)
        cc_grow(s, acked);
}

static void rtt_sample(struct cfx__dpdk_sess *s, uint64_t r)
{
    if (!r)
        r = 1;
    if (!s->srtt_ns) {
        s->srtt_ns = r;
        s->rttvar_ns = r / 2;
        s->min_rtt_ns = r;
    } else {
        uint64_t dev = s->srtt_ns > r ? s->srtt_ns - r : r - s->srtt_ns;
        s->rttvar_ns = (3 * s->rttvar_ns + dev) / 4;
        s->srtt_ns = (7 * s->srtt_ns + r) / 8;
        s->min_rtt_ns = min_u64(s->min_rtt_ns, r);
    }
}

static uint64_t rto_base(const struct cfx__dpdk_sess *s)
{
    if (!s->srtt_ns)
        return s->p.rto_init_ns;
    uint64_t rto = s->srtt_ns + 4 * s->rttvar_ns;
    return min_u64(max_u64(rto, s->p.rto_min_ns), s->p.rto_max_ns);
}

/* --- send side ------------------------------------------------------------- */

static void mark_lost(struct cfx__dpdk_sess *s, struct cfx__dpdk_tx_slot *t)
{
    if (t->in_pipe) {
        t->in_pipe = false;
        s->pipe--;
    }
    if (!t->lost) {
        t->lost = true;
        s->nlost++;
    }
}

/* The packet is known to be at the peer (acked or sacked). */
static void slot_delivered(struct cfx__dpdk_sess *s, struct cfx__dpdk_tx_slot *t, uint32_t seq)
{
    if (t->in_pipe) {
        t->in_pipe = false;
        s->pipe--;
    }
    if (t->lost) {
        t->lost = false;
        s->nlost--;
    }
    if (t->sent_ns > s->rack_ts || (t->sent_ns == s->rack_ts && seq_diff(seq, s->rack_seq) > 0)) {
        s->rack_ts = t->sent_ns;
        s->rack_seq = seq;
    }
}

/* RACK: a packet sent before one that arrived is lost once it is older by
 * a quarter of the minimum RTT or three sequence numbers (reordering). */
static void detect_loss(struct cfx__dpdk_sess *s)
{
    uint64_t reo_wnd = s->min_rtt_ns / 4;

    if (seq_diff(s->rack_seq, s->snd_una) <= 0)
        return;
    if (seq_diff(s->rack_seq, s->snd_nxt) >= 0)
        return; /* cannot be: rack_seq is a packet that was sent */
    for (uint32_t seq = s->snd_una; seq_diff(seq, s->rack_seq) < 0; seq++) {
        struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
        if (t->sacked || t->lost || t->sent_ns > s->rack_ts)
            continue;
        if (s->rack_ts - t->sent_ns > reo_wnd || seq_diff(s->rack_seq, seq) >= 3) {
            mark_lost(s, t);
            s->stats.fast_retx++;
            cc_on_loss(s, seq);
        }
    }
}

static int send_data(struct cfx__dpdk_sess *s, uint32_t seq, uint64_t now)
{
    struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
    const struct cfx__dpdk_msg *m = &s->sendq[t->msg % s->p.sendq_max];
    uint32_t off = (uint32_t)t->frag_idx * s->p.mtu_payload;
    uint32_t len = m->len - off < s->p.mtu_payload ? m->len - off : s->p.mtu_payload;
    struct cfx__dpdk_hdr h = {
        .flags = CFX_DPDK_F_DATA,
        .session = s->peer_id,
        .seq = seq,
        .len = (uint16_t)len,
        .msg_id = m->msg_id,
        .frag_idx = t->frag_idx,
        .frag_cnt = m->frag_cnt,
        .msg_len = m->len,
        .ts = now,
    };
    /* the ack rides along when the packet stays within a full data
     * packet's size (the link's MTU); a stream's full packets go without
     * it, and the ack owed goes on its own when due */
    bool ride = len + CFX_DPDK_HDR_ACK <= s->p.mtu_payload;
    if (ride)
        fill_ack(s, &h, now);
    int rc = s->ops->tx(s->ctx, &h, m->buf + off);
    if (rc == CFX_ERR_AGAIN)
        return rc;
    /* any other failure counts as a loss on the wire: the timer recovers it */
    if (ride)
        ack_clear(s);
    t->sent_ns = now;
    s->last_tx_ns = now;
    t->in_pipe = true;
    s->pipe++;
    if (!s->rto_at)
        s->rto_at = now + s->rto_ns;
    return CFX_OK;
}

/* Arm the tail-loss probe: two smoothed RTTs from now, and no sooner than
 * a quarter of rto_min (as Linux keeps a floor under its probe: RTT
 * samples come from moments the host was awake, its stalls are longer, and
 * a probe per stall is a duplicate per stall), while packets are in
 * flight and no probe is out, if that comes before the timer. */
static void tlp_arm(struct cfx__dpdk_sess *s, uint64_t now)
{
    s->tlp_at = 0;
    if (s->tlp_out || s->snd_una == s->snd_nxt || !s->srtt_ns)
        return;
    uint64_t at = now + max_u64(2 * s->srtt_ns, s->p.rto_min_ns / 4);
    if (!s->rto_at || at < s->rto_at)
        s->tlp_at = at;
}

/* The probe: the highest packet in flight that the peer has not sacked
 * goes again, once.  It keeps its first send time, so that the sack it
 * brings back does not make RACK take the packets before it for lost
 * when it was the original that arrived late; and as a retransmission it
 * gives no RTT sample (Karn).  The window is not touched: nothing is
 * known lost yet. */
static void tlp_fire(struct cfx__dpdk_sess *s, uint64_t now)
{
    s->tlp_at = 0;
    uint32_t seq = s->snd_nxt;
    while (seq != s->snd_una && tx_slot(s, seq - 1)->sacked)
        seq--;
    if (seq == s->snd_una)
        return;
    seq--;
    struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
    if (t->lost)
        return; /* already queued for retransmission */
    uint64_t first = t->sent_ns;
    if (t->in_pipe) {
        t->in_pipe = false;
        s->pipe--;
    }
    if (send_data(s, seq, now) == CFX_ERR_AGAIN) {
        t->in_pipe = true; /* as before: try again on the next poll */
        s->pipe++;
        s->tlp_at = now;
        return;
    }
    t->sent_ns = first;
    t->retx = true;
    s->tlp_out = true;
    s->stats.tlp++;
    s->stats.tx_retx++;
}

/* Restart after idle (as TCP's congestion window validation, RFC 7661):
 * a sender that had nothing in flight for idle_restart_ns (and an RTO)
 * starts its next burst from at most the initial window.  What it learnt of
 * the path is stale, and the receiver may not be polling right now (a quiet
 * dpdk port naps a millisecond at a time once it has had no data for as
 * long, CFX_DPDK_QUIET_MS): a whole window sent into its queue meanwhile
 * would overflow it, and the loss would halve the window for the rest of
 * the transfer.  The window grows back in slow start up to 3/4 of what it
 * was. */
static void cc_idle_restart(struct cfx__dpdk_sess *s, uint64_t now)
{
    if (!s->p.idle_restart_ns || s->snd_una != s->snd_nxt || !s->last_tx_ns ||
        now - s->last_tx_ns <= s->p.idle_restart_ns || now - s->last_tx_ns <= s->rto_ns ||
        s->cwnd <= s->p.cwnd_init)
        return;
    if (s->ssthresh < 0.75 * s->cwnd)
        s->ssthresh = 0.75 * s->cwnd;
    s->cwnd = s->p.cwnd_init;
    s->restart_end = s->snd_nxt + s->p.cwnd_init;
    s->restart_burst = true;
    s->stats.cwnd_idle_restarts++;
}

static void transmit(struct cfx__dpdk_sess *s, uint64_t now)
{
    cc_idle_restart(s, now);
    uint32_t limit = s->cwnd < 1.0 ? 1 : (uint32_t)s->cwnd;

    while (s->pipe < limit && !s->error) {
        if (s->nlost) {
            uint32_t seq = s->snd_una;
            while (seq_diff(seq, s->snd_nxt) < 0 && !tx_slot(s, seq)->lost)
                seq++;
            if (seq == s->snd_nxt) { /* cannot happen: nlost counts slots in flight */
                sess_fail(s, CFX_ERR_INTERNAL, "lost-packet count out of step");
                return;
            }
            struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
            if (send_data(s, seq, now) == CFX_ERR_AGAIN)
                return;
            t->lost = false;
            t->retx = true;
            s->nlost--;
            s->stats.tx_retx++;
            continue;
        }
        if (s->sq_next == s->sq_tail || s->snd_nxt - s->snd_una >= s->p.snd_slots)
            return;
        if (seq_diff(s->snd_nxt, s->snd_right) >= 0) {
            /* the peer's window is closed: probe it by the timer */
            if (!s->rto_at)
                s->rto_at = now + s->rto_ns;
            return;
        }
        struct cfx__dpdk_msg *m = &s->sendq[s->sq_next % s->p.sendq_max];
        struct cfx__dpdk_tx_slot *t = tx_slot(s, s->snd_nxt);
        *t = (struct cfx__dpdk_tx_slot){
            .msg = s->sq_next,
            .frag_idx = m->next_frag,
            .last = m->next_frag + 1u == m->frag_cnt,
        };
        if (send_data(s, s->snd_nxt, now) == CFX_ERR_AGAIN)
            return;
        s->snd_nxt++;
        s->stats.tx_data++;
        if (++m->next_frag == m->frag_cnt)
            s->sq_next++;
        tlp_arm(s, now);
    }
}

int cfx__dpdk_sess_send(struct cfx__dpdk_sess *s, const void *buf, size_t len, void *cookie,
                        uint64_t now)
{
    if (s->error)
        return s->error;
    size_t frags = len ? (len + s->p.mtu_payload - 1) / s->p.mtu_payload : 1;
    if (len > s->p.msg_max || frags > CFX_DPDK_FRAG_MAX)
        return CFX_ERR_TOO_BIG;
    if (s->sq_tail - s->sq_head >= s->p.sendq_max)
        return CFX_ERR_AGAIN;
    s->sendq[s->sq_tail % s->p.sendq_max] = (struct cfx__dpdk_msg){
        .buf = buf,
        .len = (uint32_t)len,
        .msg_id = s->next_msg_id++,
        .frag_cnt = (uint16_t)frags,
        .cookie = cookie,
    };
    s->sq_tail++;
    transmit(s, now);
    return s->error;
}

/*
 * How long the ack h took on its way back beyond the least any ack of
 * this session took: the reverse path's queue and the time it then waited
 * unread here.  The ack's ts is the peer's clock when it left, now ours
 * when a poll found it: their difference is the reverse one-way delay,
 * that wait and the clocks' offset, which is constant, so the difference
 * to the smallest one seen is queue and wait alone, whatever the offset
 * (LEDBAT's base delay).  A wait only raises a sample, so a host stall
 * cannot pull the smallest down.  It is kept over two epochs of
 * rev_epoch_ns (2 s): the clocks' drift moves it by at most two epochs'
 * worth (80 us at 20 ppm, a free-running crystal; NTP keeps it smaller),
 * and a reverse path that never drains in that long is taken for its
 * base: its queue then counts as the forward path's, as an RTT counts it.
 */
static uint64_t reverse_queue(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h, uint64_t now)
{
    if (!h->ts)
        return 0;
    int64_t d = (int64_t)(now - h->ts);
    if (now >= s->rev_epoch_end) {
        s->rev_base_ns[1] = s->rev_base_ns[0];
        s->rev_base_ns[0] = INT64_MAX;
        s->rev_epoch_end = now + s->p.rev_epoch_ns;
    }
    if (d < s->rev_base_ns[0])
        s->rev_base_ns[0] = d;
    int64_t base = s->rev_base_ns[0] < s->rev_base_ns[1] ? s->rev_base_ns[0] : s->rev_base_ns[1];
    return (uint64_t)d - (uint64_t)base; /* d >= base: exact, also when a peer's ts is wild */
}

/*
 * A timeout that was spurious (as TCP's Eifel detection, RFC 3522, and
 * Linux's undo of a loss state): every ack after it, until everything then
 * in flight is acknowledged, echoes the timestamp of a packet sent before
 * the timeout and shows no hole.  The packets had arrived and only the
 * acks were late, or lost: a host whose polling thread lost its core for
 * longer than the RTO (rto_min, 5 ms) does that on a loaded machine.  The
 * window, threshold and recovery point then go back to what they were.
 * Before, every such stall left the window at one packet and halved the
 * threshold, so the flow crept back in congestion avoidance.  An ack that
 * echoes a retransmission (sent at or after the timeout: a packet was
 * lost and the resend filled it) or carries a sack ends the check and
 * leaves the cut in place; so does a timeout of an empty window (a probe).
 */
static void undo_check(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h)
{
    if (!h->ts_echo || h->ts_echo >= s->undo_ts || h->sack) {
        s->undo_armed = false;
        return;
    }
    if (seq_diff(h->ack, s->undo_end) < 0)
        return; /* so far so good: the rest in flight then is still to come */
    s->undo_armed = false;
    if (s->cwnd < s->undo_cwnd)
        s->cwnd = s->undo_cwnd;
    if (s->ssthresh < s->undo_ssthresh)
        s->ssthresh = s->undo_ssthresh;
    s->recover = s->undo_recover;
    s->stats.rto_undone++;
}

static int process_ack(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h, uint64_t now,
                       uint64_t waited)
{
    int32_t newly = seq_diff(h->ack, s->snd_una);

    if (seq_diff(h->ack, s->snd_nxt) > 0)
        return sess_fail(s, CFX_ERR_PROTO, "peer acknowledged seq %u, never sent (next %u)", h->ack,
                         s->snd_nxt);
    if (newly < 0)
        return CFX_OK; /* an older ack overtaken by a newer one */
    uint64_t rev_q = reverse_queue(s, h, now);
    uint32_t right = h->ack + h->window;
    if (seq_diff(right, s->snd_right) > 0)
        s->snd_right = right;

    bool karn_ok = true;
    uint32_t done = 0;
    /* The first burst after an idle restart may have waited in a napping
     * receiver's queue (a quiet dpdk port): its delay is the nap's, not the
     * path's, so, as for a retransmission, no RTT sample and no delay cut
     * from its acknowledgements. */
    bool napped = s->restart_burst && seq_diff(s->snd_una, s->restart_end) < 0;
    /* the burst ends at restart_end, or when everything sent is acked (a
     * burst shorter than the initial window: the packets sent after it did
     * not wait for a nap, and their samples count) */
    if (s->restart_burst &&
        (seq_diff(h->ack, s->restart_end) >= 0 || h->ack == s->snd_nxt))
        s->restart_burst = false;
    for (uint32_t seq = s->snd_una; seq != h->ack; seq++) {
        struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
        slot_delivered(s, t, seq);
        if (t->retx)
            karn_ok = false;
        if (t->last)
            done++;
    }
    s->snd_una = h->ack;

    for (uint32_t i = 0; i < CFX_DPDK_SACK_BITS && (h->sack >> i); i++) {
        if (!(h->sack & (1ull << i)))
            continue;
        uint32_t seq = h->ack + 1 + i;
        if (seq_diff(seq, s->snd_nxt) >= 0)
            return sess_fail(s, CFX_ERR_PROTO, "peer sacked seq %u, never sent (next %u)", seq,
                             s->snd_nxt);
        struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
        if (!t->sacked) {
            t->sacked = true;
            slot_delivered(s, t, seq);
        }
    }

    if (newly > 0) {
        uint64_t path = 0;
        if (s->undo_armed)
            undo_check(s, h);
        /* Karn: no sample when an acknowledged packet was retransmitted */
        if (karn_ok && !napped && h->ts_echo && now >= h->ts_echo) {
            uint64_t rtt = now - h->ts_echo;
            /* the timers take the whole RTT, stalls included (they must
             * outlast them); the delay signal the forward path's part:
             * without the time the data waited unread at the peer and this
             * ack here, each bounded by a poll gap, and without the queue
             * the ack waited in on its way back (in a chain, the peer's
             * egress holds the data it forwards: that queue is the next
             * hop's to control, and counting it here cut this hop's
             * window until the chain's links idled) */
            rtt_sample(s, rtt);
            /* rev_q holds this ack's wait here too, which waited bounds */
            uint64_t back = rev_q > waited ? rev_q : waited;
            uint64_t other = (uint64_t)h->echo_delay + (back < rtt ? back : rtt);
            path = rtt > other ? rtt - other : 1;
        }
        s->retries = 0;
        s->rto_ns = rto_base(s);
        s->rto_at = s->snd_una == s->snd_nxt ? 0 : now + s->rto_ns;
        s->tlp_out = false;
        tlp_arm(s, now);
        cc_on_ack(s, (uint32_t)newly, path);
    } else if (s->snd_una == s->snd_nxt) {
        s->retries = 0; /* a window probe answered: the peer is alive */
        s->rto_ns = rto_base(s); /* and the probes' backoff ends with it */
        s->rto_at = 0;
    }
    detect_loss(s);

    for (uint32_t i = 0; i < done; i++) {
        void *cookie = s->sendq[s->sq_head % s->p.sendq_max].cookie;
        s->sq_head++;
        s->stats.msgs_sent++;
        if (s->ops->sent)
            s->ops->sent(s->ctx, cookie);
    }
    return s->error;
}

static void on_timeout(struct cfx__dpdk_sess *s, uint64_t now)
{
    s->stats.rto++;
    if (++s->retries > s->p.max_retries) {
        sess_fail(s, CFX_ERR_TIMEOUT,
                  "no acknowledgement after %u retransmission timeouts "
                  "(last RTO %llu us, seq %u unacknowledged)",
                  s->p.max_retries, (unsigned long long)(s->rto_ns / 1000), s->snd_una);
        return;
    }
    if (s->snd_una != s->snd_nxt) {
        if (!s->undo_armed) { /* the first of a series: what an undo goes back to */
            s->undo_armed = true;
            s->undo_ts = now;
            s->undo_cwnd = s->cwnd;
            s->undo_ssthresh = s->ssthresh;
            s->undo_recover = s->recover;
            s->undo_end = s->snd_nxt;
        }
        for (uint32_t seq = s->snd_una; seq != s->snd_nxt; seq++) {
            struct cfx__dpdk_tx_slot *t = tx_slot(s, seq);
            if (!t->sacked)
                mark_lost(s, t);
        }
        /* the threshold is halved at the first timeout of a series only:
         * at the next ones the window is the one packet the first left, and
         * halving it again would leave the threshold at 2 after any outage
         * longer than two RTOs (RFC 5681, 3.1: held constant once the
         * segment went again by the timer) */
        if (s->retries == 1)
            s->ssthresh = s->cwnd / 2 > 2.0 ? s->cwnd / 2 : 2.0;
        s->cwnd = 1.0;
        s->recover = s->snd_nxt;
    } else {
        send_ack(s, now, CFX_DPDK_F_ACKREQ); /* probe a closed window */
    }
    s->rto_ns = min_u64(s->rto_ns * 2, s->p.rto_max_ns);
    s->rto_at = now + s->rto_ns;
    s->tlp_at = 0; /* the timer has taken over */
}

/* --- receive side ---------------------------------------------------------- */

/*
 * Takes the packet due next (seq rcv_dlv; its fields in r, its bytes at pl)
 * into reassembly.  Returns 1 when taken, 0 when deliver() refused it for
 * now (nothing changed), -1 on a protocol breach (the session failed).
 */
static int take(struct cfx__dpdk_sess *s, const struct cfx__dpdk_rx_slot *r, const uint8_t *pl)
{
    if (r->msg_id != s->rcv_msg_id || r->frag_idx != s->asm_next ||
        (s->asm_next && (r->frag_cnt != s->asm_cnt || r->msg_len != s->asm_total))) {
        sess_fail(s, CFX_ERR_PROTO, "fragment %u/%u of message %u where fragment %u of %u was due",
                  r->frag_idx, r->frag_cnt, r->msg_id, s->asm_next, s->rcv_msg_id);
        return -1;
    }
    uint32_t off = (uint32_t)r->frag_idx * s->p.mtu_payload;
    if (r->frag_idx == 0) {
        uint8_t *dst = s->ops->place ? s->ops->place(s->ctx, r->msg_len, 0, r->len) : NULL;
        s->asm_placed = dst != NULL;
        if (dst) {
            memcpy(dst, pl, r->len);
        } else if (r->frag_cnt == 1) { /* whole already: straight from the packet */
            if (s->ops->deliver(s->ctx, pl, r->len) == CFX_ERR_AGAIN)
                return 0;
            s->stats.msgs_rcvd++;
            s->rcv_msg_id++;
            return 1;
        } else if (s->asm_cap < r->msg_len) {
            uint8_t *nb = realloc(s->asm_buf, r->msg_len);
            if (!nb) {
                sess_fail(s, CFX_ERR_NOMEM, "no memory to reassemble %u bytes", r->msg_len);
                return -1;
            }
            s->asm_buf = nb;
            s->asm_cap = r->msg_len;
        }
        s->asm_len = 0;
        s->asm_total = r->msg_len;
        s->asm_cnt = r->frag_cnt;
    } else if (s->asm_placed) {
        uint8_t *dst = s->ops->place(s->ctx, s->asm_total, off, r->len);
        if (dst)
            memcpy(dst, pl, r->len);
    }
    if (!s->asm_placed)
        memcpy(s->asm_buf + off, pl, r->len);
    s->asm_len += r->len;
    if (++s->asm_next == s->asm_cnt) {
        s->asm_ready = true;
        s->rcv_msg_id++;
    }
    return 1;
}

/* Hands buffered in-order packets to reassembly and whole messages to deliver(). */
static void drain(struct cfx__dpdk_sess *s)
{
    while (!s->error) {
        if (s->asm_ready) {
            int rc = s->ops->deliver(s->ctx, s->asm_placed ? NULL : s->asm_buf, s->asm_len);
            if (rc == CFX_ERR_AGAIN)
                return;
            s->stats.msgs_placed += s->asm_placed;
            s->asm_ready = false;
            s->asm_placed = false;
            s->asm_next = 0;
            s->stats.msgs_rcvd++;
            continue;
        }
        if (s->rcv_dlv == s->rcv_nxt)
            return;
        struct cfx__dpdk_rx_slot *r = rx_slot(s, s->rcv_dlv);
        if (take(s, r, rx_payload(s, s->rcv_dlv)) <= 0)
            return;
        r->used = false;
        s->rcv_dlv++;
        ack_soon(s); /* the window opened */
    }
}

static int process_data(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h,
                        const void *payload, uint64_t since)
{
    uint32_t mtu = s->p.mtu_payload;

    if (h->msg_len > s->p.msg_max)
        return sess_fail(s, CFX_ERR_TOO_BIG, "message %u of %u bytes, over msg_max %u", h->msg_id,
                         h->msg_len, s->p.msg_max);
    uint32_t frags = h->msg_len ? (h->msg_len + mtu - 1) / mtu : 1;
    uint32_t want = h->frag_idx + 1u < frags ? mtu : h->msg_len - (frags - 1) * mtu;
    if (h->frag_cnt != frags || h->len != want)
        return sess_fail(s, CFX_ERR_PROTO,
                         "fragment %u/%u of %u bytes does not fit a %u-byte message "
                         "in %u-byte packets",
                         h->frag_idx, h->frag_cnt, h->len, h->msg_len, mtu);

    /* a packet seen before or past the window is acked at once, and its
     * timestamp is not echoed (RFC 7323, 4.3): a spurious retransmission's
     * later timestamp, echoed on the ack of data sent once, would give the
     * sender an RTT sample too short that Karn's rule cannot catch */
    if (seq_diff(h->seq, s->rcv_nxt) < 0) {
        s->stats.rx_dup++;
        ack_soon(s);
        return CFX_OK;
    }
    if (h->seq - s->rcv_dlv >= s->p.rcv_slots) {
        s->stats.rx_beyond++; /* past the window we advertised */
        ack_soon(s);
        return CFX_OK;
    }
    struct cfx__dpdk_rx_slot *r = rx_slot(s, h->seq);
    if (r->used) {
        s->stats.rx_dup++;
        ack_soon(s);
        return CFX_OK;
    }
    /* the newest timestamp seen, never an older one (as RFC 7323's
     * TS.Recent): a packet overtaken on the way (reordered) that arrives
     * after a retransmission sent at or after a timeout must not make the
     * ack echo a time before it, or the sender takes the timeout for
     * spurious and undoes it though a packet was lost (undo_check) */
    if (h->ts >= s->ts_echo) {
        s->ts_echo = h->ts;
        s->echo_since = since;
    }
    uint32_t nxt = s->rcv_nxt;
    bool next = h->seq == nxt;
    if (seq_diff(h->seq + 1, s->rcv_high) > 0)
        s->rcv_high = h->seq + 1;
    struct cfx__dpdk_rx_slot f = {
        .used = true,
        .seq = h->seq,
        .len = h->len,
        .frag_idx = h->frag_idx,
        .frag_cnt = h->frag_cnt,
        .msg_id = h->msg_id,
        .msg_len = h->msg_len,
    };
    s->stats.rx_data++;
    /* due next with nothing buffered before it: taken straight from the
     * packet; kept only if deliver() refuses it for now */
    int taken = h->seq == s->rcv_dlv && !s->asm_ready ? take(s, &f, payload) : 0;
    if (taken < 0)
        return s->error;
    if (taken) {
        s->stats.rx_direct++;
        s->rcv_dlv++;
        s->rcv_nxt++;
    } else {
        *r = f;
        memcpy(rx_payload(s, h->seq), payload, h->len);
    }
    while (s->rcv_nxt - s->rcv_dlv < s->p.rcv_slots) {
        const struct cfx__dpdk_rx_slot *n = rx_slot(s, s->rcv_nxt);
        if (!n->used || n->seq != s->rcv_nxt)
            break;
        s->rcv_nxt++;
    }
    /* the next packet, no hole behind it, and not the end of a message of
     * several packets: the ack may wait (a hole filled, even in part, is
     * acked at once).  A message of one packet is a request or a reply:
     * the answer to it usually leaves within the delay, and the ack rides
     * on it, where an ack of its own cost the answer a transmit first */
    if (next && s->rcv_nxt - nxt == 1 && s->rcv_nxt == s->rcv_high &&
        (h->frag_idx + 1u < h->frag_cnt || h->frag_cnt == 1))
        ack_later(s, since);
    else
        ack_soon(s);
    drain(s);
    return s->error;
}

int cfx__dpdk_sess_rx(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h, const void *payload,
                      uint64_t now, uint64_t waited_ns)
{
    if (s->error)
        return s->error;
    if (h->session != s->local_id)
        return CFX_ERR_INVALID; /* the caller demultiplexes */
    if (waited_ns > now)
        waited_ns = now;
    if ((h->flags & CFX_DPDK_F_ACK) && process_ack(s, h, now, waited_ns))
        return s->error;
    if ((h->flags & CFX_DPDK_F_DATA) && process_data(s, h, payload, now - waited_ns))
        return s->error;
    if (h->flags & CFX_DPDK_F_ACKREQ)
        ack_soon(s);
    return s->error;
}

int cfx__dpdk_sess_poll(struct cfx__dpdk_sess *s, uint64_t now)
{
    if (s->error)
        return s->error;
    drain(s);
    if (s->rto_at && now >= s->rto_at)
        on_timeout(s, now);
    else if (s->tlp_at && now >= s->tlp_at)
        tlp_fire(s, now);
    if (s->error)
        return s->error;
    transmit(s, now);
    if (s->ack_pending && (s->ack_now || now >= s->ack_due))
        send_ack(s, now, 0);
    return s->error;
}

void cfx__dpdk_sess_ack_flush(struct cfx__dpdk_sess *s, uint64_t now)
{
    if (!s->error && s->ack_pending)
        send_ack(s, now, 0);
}

uint64_t cfx__dpdk_sess_deadline(const struct cfx__dpdk_sess *s)
{
    if (s->error)
        return UINT64_MAX;
    if (s->ack_pending && s->ack_now)
        return 0;
    uint64_t at = s->rto_at ? s->rto_at : UINT64_MAX;
    if (s->tlp_at && s->tlp_at < at)
        at = s->tlp_at;
    return s->ack_pending && s->ack_due < at ? s->ack_due : at;
}

bool cfx__dpdk_sess_idle(const struct cfx__dpdk_sess *s)
{
    return s->sq_head == s->sq_tail;
}

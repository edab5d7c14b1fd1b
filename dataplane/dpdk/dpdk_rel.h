/*
 * dpdk transport, reliability layer: the packet header and the sessions
 * that make a lossy datagram service reliable (in the style of eRPC).
 *
 * Pure C with no DPDK dependency: the caller supplies the time (now_ns) and
 * the packet I/O as callbacks, so the same code runs over a DPDK port
 * (dpdk_io.c) and over the simulated lossy channel of the unit tests.
 *
 * A session is one direction pair between two endpoints: it sends messages
 * (fragmented into packets of at most mtu_payload bytes) and receives the
 * peer's messages, delivering them whole and in order.  Every packet carries
 * a sequence number; every packet also carries the cumulative
 * acknowledgement, a 64-packet selective acknowledgement bitmap, the
 * receive window and a timestamp echo for the reverse direction, with how
 * long the echoed packet may have waited in the receiver's host (so that
 * the sender can tell a host that was slow to poll from a queue).
 *
 * Threads: a session is used by one thread at a time (the progress thread
 * of its context); nothing here locks.
 */
#ifndef CFX_DPDK_REL_H
#define CFX_DPDK_REL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --- wire header ----------------------------------------------------------- */

#define CFX_DPDK_MAGIC       0xCF5Du /* first two bytes of every packet */
#define CFX_DPDK_VERSION     3u
#define CFX_DPDK_HDR_DATA    36u         /* header bytes of a data packet without an ack */
#define CFX_DPDK_HDR_ACK     28u         /* ... that an ack adds */
#define CFX_DPDK_HDR_MAX     64u         /* header bytes at most, before the payload */
#define CFX_DPDK_PAYLOAD_MAX 9000u       /* payload bytes of one packet (jumbo frame) */
#define CFX_DPDK_FRAG_MAX    65535u      /* fragments of one message (16-bit field) */
#define CFX_DPDK_MSG_MAX     (64u << 20) /* bytes of one message, any peer */
#define CFX_DPDK_WIN_MAX     4096u       /* packets in flight or buffered, any peer */
#define CFX_DPDK_SACK_BITS   64u         /* packets after the cumulative ack covered by sack */

enum cfx__dpdk_flag {
    CFX_DPDK_F_DATA = 1u << 0,   /* seq, msg_id, frag_*, msg_len and payload are valid */
    CFX_DPDK_F_ACK = 1u << 1,    /* ack, sack, window and ts_echo are valid */
    CFX_DPDK_F_ACKREQ = 1u << 2, /* sender asks for an ack now (window probe) */
    CFX_DPDK_F_CTL = 1u << 3,    /* a connection control packet (session 0, alone): seq is
                                    its type, ack and msg_id the sessions, sack its argument */
};
#define CFX_DPDK_F_ALL (CFX_DPDK_F_DATA | CFX_DPDK_F_ACK | CFX_DPDK_F_ACKREQ | CFX_DPDK_F_CTL)

/*
 * The header in host order.  On the wire (dpdk_wire.c) it is little
 * endian: a 16-byte common part (magic, version, flags, session, ts), then
 * the DATA fields when that flag is set (20 bytes), then the ACK fields
 * when that one is (28 bytes): 36 bytes for data alone, so that a full
 * data packet of a stream, whose acks go apart, carries more payload.  A
 * CTL packet has the common part and its own 20 bytes, nothing else.
 */
struct cfx__dpdk_hdr {
    uint8_t flags;     /* enum cfx__dpdk_flag */
    uint32_t session;  /* the receiver's session id */
    uint32_t seq;      /* DATA: this packet's sequence number */
    uint32_t ack;      /* ACK: next sequence number the sender of this packet expects */
    uint64_t sack;     /* ACK: bit i set = packet ack + 1 + i was received */
    uint16_t window;   /* ACK: packets the receiver can buffer past ack */
    uint16_t len;      /* payload bytes that follow the header */
    uint32_t msg_id;   /* DATA: message number within the session */
    uint16_t frag_idx; /* DATA: fragment index within the message */
    uint16_t frag_cnt; /* DATA: fragments in the message, >= 1 */
    uint32_t msg_len;  /* DATA: bytes in the whole message */
    uint64_t ts;       /* sender's clock when this packet left, ns */
    uint64_t ts_echo;  /* ACK: newest ts of a new data packet received */
    uint32_t echo_delay; /* ACK: ns that packet may have waited in this host (its poller away,
                          * then until this ack left); saturates at UINT32_MAX */
};

/* Header bytes on the wire for a packet with these flags. */
size_t cfx__dpdk_hdr_len(uint8_t flags);

/* Writes h (payload length h->len) into out, cfx__dpdk_hdr_len(h->flags)
 * bytes (at most CFX_DPDK_HDR_MAX), and returns that length. */
size_t cfx__dpdk_hdr_encode(const struct cfx__dpdk_hdr *h, void *out);

/*
 * Decodes and checks a received packet of len bytes (header + payload; the
 * payload starts cfx__dpdk_hdr_len(out->flags) bytes in).  Refuses
 * (CFX_ERR_PROTO, *why says what) a truncated packet, a wrong magic,
 * version or flag, a reserved field not zero, a payload length that is not
 * the rest of the packet or over CFX_DPDK_PAYLOAD_MAX, a payload without
 * the DATA flag, and data fields out of bounds (frag_idx >=
 * frag_cnt, msg_len over CFX_DPDK_MSG_MAX, a fragment count that cannot
 * carry msg_len).  What needs the session (the peer's fragment size, the
 * window) is checked by cfx__dpdk_sess_rx.
 */
int cfx__dpdk_hdr_decode(const void *buf, size_t len, struct cfx__dpdk_hdr *out, const char **why);

/* --- sessions -------------------------------------------------------------- */

/* Callbacks into the layer below (tx) and above (deliver, sent). */
struct cfx__dpdk_rel_ops {
    /*
     * Sends one packet: the header (encode it with cfx__dpdk_hdr_encode) and
     * h->len payload bytes, which stay valid only during the call.  Returns
     * 0, or CFX_ERR_AGAIN when the device queue is full (the session tries
     * again at its next poll); any other error is taken as a lost packet.
     */
    int (*tx)(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload);
    /*
     * One whole message from the peer, in order; buf is valid during the
     * call only.  Returns 0 when taken, or CFX_ERR_AGAIN to refuse it for
     * now: the session keeps it, stops taking packets from the peer (its
     * advertised window closes) and offers it again at the next poll.
     */
    int (*deliver)(void *ctx, const void *buf, size_t len);
    /* Every byte of the message queued with cookie was acknowledged. */
    void (*sent)(void *ctx, void *cookie);
    /*
     * Optional (NULL: every message is reassembled in the session's buffer).
     * Where the bytes of the message due next go: asked for each of its
     * packets in order (off and len the packet's part of the msg_len-byte
     * message), once deliver() took every earlier message.  An address for
     * the first packet makes the message placed: each packet's bytes are
     * copied there straight from the packet (from the reorder buffer when
     * it came out of order), and deliver() gets buf NULL when the last is
     * in.  NULL for the first packet: reassembled as usual; for a later
     * packet of a placed message: that packet's bytes are dropped (the
     * place went away meanwhile).
     */
    void *(*place)(void *ctx, uint32_t msg_len, uint32_t off, uint32_t len);
};

/* Session parameters; zero fields take the defaults in brackets. */
struct cfx__dpdk_rel_params {
    uint32_t mtu_payload; /* payload bytes per packet, both sides alike [1024]; an ack
                             rides on a data packet only when it keeps the packet within
                             mtu_payload + CFX_DPDK_HDR_DATA bytes */
    uint32_t snd_slots;   /* packets in flight at most [256], <= CFX_DPDK_WIN_MAX */
    uint32_t rcv_slots;   /* reorder buffer, packets: the window advertised [256] */
    uint32_t sendq_max;   /* messages queued and not yet acknowledged [128] */
    uint32_t msg_max;     /* largest message accepted from the peer, bytes [1 MiB] */
    uint32_t max_retries; /* timeouts in a row without progress before failing [8] */
    uint32_t isn;         /* first sequence number, both directions [0] */
    uint64_t rto_init_ns; /* RTO before any RTT sample [5 ms] */
    uint64_t rto_min_ns;  /* lower bound of the RTO [5 ms] */
    uint64_t rto_max_ns;  /* upper bound of the backed-off RTO [100 ms] */
    uint32_t cwnd_init;   /* initial congestion window, packets [16] */
    uint64_t t_low_ns;    /* RTT over which slow start ends [50 us] */
    uint64_t t_high_ns;   /* RTT over which the window shrinks [500 us] */
    uint64_t rev_epoch_ns; /* the reverse path's least delay is kept over two epochs
                              of this [2 s] */
    uint64_t idle_restart_ns; /* nothing sent this long (and more than an RTO): the next
                                 burst starts from cwnd_init [0: never] */
};

struct cfx__dpdk_rel_stats {
    uint64_t tx_data;        /* data packets sent, first transmissions */
    uint64_t tx_retx;        /* data packets retransmitted */
    uint64_t tx_ack;         /* ack-only packets sent */
    uint64_t rx_data;        /* data packets received, new */
    uint64_t rx_dup;         /* data packets received again and dropped */
    uint64_t rx_beyond;      /* data packets past the advertised window, dropped */
    uint64_t rto;            /* retransmission timeouts */
    uint64_t rto_undone;     /* ... found spurious (the data had arrived) and undone */
    uint64_t tlp;            /* tail-loss probes sent */
    uint64_t fast_retx;      /* losses found from the sack before a timeout */
    uint64_t cwnd_cut_loss;  /* window halvings on loss */
    uint64_t cwnd_cut_delay; /* window cuts on delay */
    uint64_t cwnd_idle_restarts; /* windows cut back to the initial one after idle */
    uint64_t msgs_sent;      /* messages fully acknowledged */
    uint64_t msgs_rcvd;      /* messages delivered */
    uint64_t rx_direct;      /* data packets taken in order, never in the reorder buffer */
    uint64_t msgs_placed;    /* messages whose bytes went where place() said */
};

struct cfx__dpdk_tx_slot;
struct cfx__dpdk_rx_slot;
struct cfx__dpdk_msg;

/* One session.  Allocated by the caller; fields are private to dpdk_rel.c. */
struct cfx__dpdk_sess {
    struct cfx__dpdk_rel_params p; /* parameters, defaults filled in */
    const struct cfx__dpdk_rel_ops *ops;
    void *ctx;           /* first argument of every op */
    uint32_t local_id;   /* our session id: packets to us carry it */
    uint32_t peer_id;    /* the peer's: packets we send carry it */
    char peer[64];       /* the peer's name, for errors */
    int error;           /* sticky: 0 or the first failure */
    char error_msg[256]; /* what failed, naming the peer */

    /* send side */
    struct cfx__dpdk_msg *sendq;  /* ring of sendq_max queued messages */
    uint32_t sq_head, sq_tail;    /* oldest unacknowledged, next free */
    uint32_t sq_next;             /* next message with fragments to send */
    uint32_t next_msg_id;         /* msg_id of the next message queued */
    struct cfx__dpdk_tx_slot *tx; /* ring of snd_slots packets in flight */
    uint32_t snd_una;             /* oldest unacknowledged seq */
    uint32_t snd_nxt;             /* next new seq */
    uint32_t snd_right;           /* first seq the peer's window does not allow */
    uint32_t pipe;                /* packets sent, not acked, sacked or lost */
    uint32_t nlost;               /* packets marked lost, to retransmit */
    uint32_t recover;             /* no second cut for losses below this seq */
    uint64_t rack_ts;             /* latest send time of a packet known delivered */
    uint32_t rack_seq;            /* and its seq (ties in time) */
    double cwnd;                  /* congestion window, packets */
    uint64_t last_tx_ns;          /* last data packet sent (restart after idle) */
    uint32_t restart_end;         /* the burst after an idle restart ends before this seq */
    bool restart_burst;           /* ... and is not acknowledged yet (no RTT samples) */
    double ssthresh;              /* slow start below this */
    uint64_t srtt_ns, rttvar_ns;  /* smoothed RTT and its variation; 0: no sample */
    uint64_t min_rtt_ns;          /* lowest RTT seen: the reordering window */
    uint64_t win_min_rtt_ns;      /* smallest RTT sample since the last delay decision */
    uint32_t win_samples;         /* ... of this many samples */
    bool delay_ok;                /* the last delay decision let the window grow */
    uint32_t delay_cut_seq;       /* the next delay decision once this seq is acked */
    int64_t rev_base_ns[2];       /* smallest reverse one-way delay (the peer's clock at an
                                     ack's send to ours at its arrival: the clocks' offset
                                     included) in this epoch and the last; INT64_MAX: none */
    uint64_t rev_epoch_end;       /* when this epoch ends */
    uint64_t rto_ns;              /* current RTO, backed off */
    uint64_t rto_at;              /* when the timer fires; 0: not armed */
    uint32_t retries;             /* timeouts in a row without progress */
    bool undo_armed;              /* a timeout cut the window; the acks that follow tell
                                     whether it was spurious (undo_check) */
    uint64_t undo_ts;             /* when the first timeout of the series fired */
    double undo_cwnd, undo_ssthresh; /* the window before it */
    uint32_t undo_recover;        /* ... and recover */
    uint32_t undo_end;            /* snd_nxt then: acked whole by old echoes, it was spurious */
    uint64_t tlp_at;              /* when the tail-loss probe goes; 0: not armed */
    bool tlp_out;                 /* a probe went and nothing was acked since */

    /* receive side */
    struct cfx__dpdk_rx_slot *rx; /* ring of rcv_slots packets */
    uint8_t *rx_buf;              /* rcv_slots * mtu_payload payload bytes */
    uint32_t rcv_nxt;             /* next seq expected (cumulative ack) */
    uint32_t rcv_dlv;             /* next seq to hand to reassembly */
    uint32_t rcv_msg_id;          /* msg_id expected next */
    uint32_t rcv_high;            /* one past the highest seq received: a hole while
                                     rcv_nxt is short of it */
    uint8_t *asm_buf;             /* reassembly of a multi-packet message */
    uint32_t asm_cap;             /* bytes allocated at asm_buf */
    uint32_t asm_len;             /* bytes reassembled so far */
    uint32_t asm_total;           /* msg_len of the message being reassembled */
    uint16_t asm_cnt;             /* its frag_cnt */
    uint16_t asm_next;            /* next fragment expected; 0: none started */
    bool asm_ready;               /* a whole message waits for deliver() */
    bool asm_placed;              /* ... its bytes are where place() said, not at asm_buf */
    uint64_t ts_echo;             /* newest ts of a new data packet received */
    uint64_t echo_since;          /* ... which may have been here since (our clock) */
    bool ack_pending;             /* data arrived since our last ack: one is owed */
    bool ack_now;                 /* ... and goes at the next poll, not at ack_due */
    uint16_t ack_owed;            /* in-order packets it owes (ACK_EVERY sends it) */
    uint64_t ack_due;             /* when a delayed ack goes at the latest */

    struct cfx__dpdk_rel_stats stats;
};

/*
 * Sets up s (allocating its rings) for the session local_id <-> peer_id with
 * the peer called peer (copied, for errors).  Returns 0, CFX_ERR_INVALID for
 * parameters over their caps, or CFX_ERR_NOMEM.  Undo with
 * cfx__dpdk_sess_fini.
 */
int cfx__dpdk_sess_init(struct cfx__dpdk_sess *s, const struct cfx__dpdk_rel_params *p,
                        const struct cfx__dpdk_rel_ops *ops, void *ctx, uint32_t local_id,
                        uint32_t peer_id, const char *peer);
/* Frees what init allocated; queued messages are dropped without sent(). */
void cfx__dpdk_sess_fini(struct cfx__dpdk_sess *s);

/*
 * Queues len bytes at buf (not copied: they must stay valid until sent()
 * reports cookie) and sends what the windows allow.  Returns 0, the sticky
 * error, CFX_ERR_TOO_BIG over CFX_DPDK_MSG_MAX or the fragment cap, or
 * CFX_ERR_AGAIN when sendq_max messages are queued already.
 */
/* Whether cfx__dpdk_sess_send() would take a message now (not CFX_ERR_AGAIN). */
static inline bool cfx__dpdk_sess_room(const struct cfx__dpdk_sess *s)
{
    return s->sq_tail - s->sq_head < s->p.sendq_max;
}

int cfx__dpdk_sess_send(struct cfx__dpdk_sess *s, const void *buf, size_t len, void *cookie,
                        uint64_t now);

/*
 * Takes one decoded packet addressed to this session (h->session ==
 * local_id): its ack fields, then its data.  waited_ns bounds how long the
 * packet may have waited in this host before now unread (the time since
 * the poll before the one that found it; 0 when unknown): it is no part of
 * the path's delay, and the RTT the delay signal sees leaves it out.
 * Returns 0 (also for a duplicate, which is dropped), or the sticky error
 * when the packet breaks the protocol (an ack of data never sent, a
 * fragment that does not fit its message, a message over msg_max).  A
 * packet for another session is not taken (CFX_ERR_INVALID, the session
 * unchanged): the caller demultiplexes.
 */
int cfx__dpdk_sess_rx(struct cfx__dpdk_sess *s, const struct cfx__dpdk_hdr *h, const void *payload,
                      uint64_t now, uint64_t waited_ns);

/*
 * Runs the timers, offers held messages again, sends new data and
 * retransmissions as the windows allow, and sends the ack owed.  Call after
 * each receive burst and by cfx__dpdk_sess_deadline.  Returns 0 or the
 * sticky error (CFX_ERR_TIMEOUT once max_retries timeouts in a row passed).
 */
int cfx__dpdk_sess_poll(struct cfx__dpdk_sess *s, uint64_t now);

/*
 * Sends the ack owed, if one is, now rather than at its delayed-ack time:
 * for a session that closes, whose peer's sender completes on it and gets
 * no other (a one-packet message's ack waits for an answer to ride on).
 */
void cfx__dpdk_sess_ack_flush(struct cfx__dpdk_sess *s, uint64_t now);

/* The time by which cfx__dpdk_sess_poll must run next; UINT64_MAX: none. */
uint64_t cfx__dpdk_sess_deadline(const struct cfx__dpdk_sess *s);

/* True when every queued message was acknowledged. */
bool cfx__dpdk_sess_idle(const struct cfx__dpdk_sess *s);

#endif

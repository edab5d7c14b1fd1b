/*
 * The dpdk transport's reliability layer (dataplane/dpdk/dpdk_rel.c): its
 * packet header on the wire, what a session refuses, and scripted traces in
 * which a test hands each packet over itself (lost, late or reordered as
 * the trace says).  The simulated channel's tests are in test_dpdk_rel.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/dpdk/dpdk_rel.h"
#include "testutil.h"

/* --- malformed packets ---------------------------------------------------- */

static const struct cfx__dpdk_hdr good_hdr = {
    .flags = CFX_DPDK_F_DATA | CFX_DPDK_F_ACK,
    .session = 7,
    .seq = 0x01020304,
    .ack = 0x05060708,
    .sack = 0x8000000000000001ull,
    .window = 64,
    .len = 100,
    .msg_id = 9,
    .frag_idx = 1,
    .frag_cnt = 3,
    .msg_len = 2148,
    .ts = 0x1122334455667788ull,
    .ts_echo = 0x99AABBCCDDEEFF00ull,
    .echo_delay = 0xA1B2C3D4u,
};

static int decode_mod(struct cfx__dpdk_hdr h, size_t off, uint8_t byte, size_t len,
                      const char **why)
{
    uint8_t buf[CFX_DPDK_HDR_MAX + 200] = { 0 };
    struct cfx__dpdk_hdr out;
    cfx__dpdk_hdr_encode(&h, buf);
    if (off < sizeof(buf))
        buf[off] = byte;
    return cfx__dpdk_hdr_decode(buf, len, &out, why);
}

Test(dpdk_rel, header_round_trip_little_endian)
{
    uint8_t buf[CFX_DPDK_HDR_MAX + 100] = { 0 };
    struct cfx__dpdk_hdr out;
    const char *why;
    cr_assert_eq(cfx__dpdk_hdr_encode(&good_hdr, buf), CFX_DPDK_HDR_MAX);
    /* common part: magic 0xCF5D little endian, version, flags, session, ts */
    cr_assert_eq(buf[0], 0x5D);
    cr_assert_eq(buf[1], 0xCF);
    cr_assert_eq(buf[2], CFX_DPDK_VERSION);
    cr_assert_eq(buf[3], good_hdr.flags);
    cr_assert_eq(buf[4], 7);
    cr_assert_eq(buf[8], 0x88); /* ts, low byte first */
    cr_assert_eq(buf[15], 0x11);
    cr_assert_eq(buf[16], 0x04); /* DATA part: seq */
    cr_assert_eq(buf[28], 100);  /* len */
    cr_assert_eq(buf[44], 0x01); /* ACK part: sack */
    cr_assert_eq(buf[51], 0x80);
    cr_assert_eq(buf[60], 0xD4); /* echo_delay */
    cr_assert_eq(buf[63], 0xA1);
    cr_assert_eq(cfx__dpdk_hdr_decode(buf, CFX_DPDK_HDR_MAX + 100, &out, &why), CFX_OK, "%s", why);
    cr_assert_eq(out.flags, good_hdr.flags);
    cr_assert_eq(out.session, good_hdr.session);
    cr_assert_eq(out.seq, good_hdr.seq);
    cr_assert_eq(out.ack, good_hdr.ack);
    cr_assert_eq(out.sack, good_hdr.sack);
    cr_assert_eq(out.window, good_hdr.window);
    cr_assert_eq(out.len, good_hdr.len);
    cr_assert_eq(out.msg_id, good_hdr.msg_id);
    cr_assert_eq(out.frag_idx, good_hdr.frag_idx);
    cr_assert_eq(out.frag_cnt, good_hdr.frag_cnt);
    cr_assert_eq(out.msg_len, good_hdr.msg_len);
    cr_assert_eq(out.ts, good_hdr.ts);
    cr_assert_eq(out.ts_echo, good_hdr.ts_echo);
    cr_assert_eq(out.echo_delay, good_hdr.echo_delay);

    /* data alone: 36 bytes, no ack fields on the wire or decoded */
    struct cfx__dpdk_hdr d = good_hdr;
    d.flags = CFX_DPDK_F_DATA;
    memset(buf, 0, sizeof(buf));
    cr_assert_eq(cfx__dpdk_hdr_encode(&d, buf), CFX_DPDK_HDR_DATA);
    cr_assert_eq(cfx__dpdk_hdr_len(d.flags), CFX_DPDK_HDR_DATA);
    cr_assert_eq(buf[36], 0, "nothing past the data part");
    cr_assert_eq(cfx__dpdk_hdr_decode(buf, CFX_DPDK_HDR_DATA + 100, &out, &why), CFX_OK, "%s", why);
    cr_assert_eq(out.seq, good_hdr.seq);
    cr_assert_eq(out.msg_len, good_hdr.msg_len);
    cr_assert_eq(out.ts, good_hdr.ts);
    cr_assert_eq(out.ack, 0);
    cr_assert_eq(out.sack, 0);
    cr_assert_eq(out.ts_echo, 0);

    /* an ack alone: 44 bytes, its part right after the common one */
    struct cfx__dpdk_hdr a = good_hdr;
    a.flags = CFX_DPDK_F_ACK;
    a.len = 0;
    cr_assert_eq(cfx__dpdk_hdr_encode(&a, buf), CFX_DPDK_HDR_MAX - 20);
    cr_assert_eq(buf[24], 0x01); /* sack */
    cr_assert_eq(cfx__dpdk_hdr_decode(buf, CFX_DPDK_HDR_MAX - 20, &out, &why), CFX_OK, "%s", why);
    cr_assert_eq(out.ack, good_hdr.ack);
    cr_assert_eq(out.sack, good_hdr.sack);
    cr_assert_eq(out.echo_delay, good_hdr.echo_delay);
    cr_assert_eq(out.seq, 0);

    /* a control packet: 36 bytes, type, sessions and argument */
    struct cfx__dpdk_hdr c = { .flags = CFX_DPDK_F_CTL, .seq = 3, .ack = 0x01020304,
                               .msg_id = 0x0A0B0C0D, .sack = 0xFFFFFFFFFFFFFFF6ull, .ts = 9 };
    cr_assert_eq(cfx__dpdk_hdr_encode(&c, buf), 36);
    cr_assert_eq(buf[16], 3);
    cr_assert_eq(buf[20], 0x04);
    cr_assert_eq(buf[24], 0x0D);
    cr_assert_eq(buf[28], 0xF6);
    cr_assert_eq(cfx__dpdk_hdr_decode(buf, 36, &out, &why), CFX_OK, "%s", why);
    cr_assert_eq(out.flags, CFX_DPDK_F_CTL);
    cr_assert_eq(out.seq, c.seq);
    cr_assert_eq(out.ack, c.ack);
    cr_assert_eq(out.msg_id, c.msg_id);
    cr_assert_eq(out.sack, c.sack);
    cr_assert_eq(cfx__dpdk_hdr_decode(buf, 37, &out, &why), CFX_ERR_PROTO, "payload on control");
}

Test(dpdk_rel, decoder_refuses_malformed_headers)
{
    const size_t full = CFX_DPDK_HDR_MAX + 100;
    struct cfx__dpdk_hdr h;
    const char *why;
    struct {
        const char *what;
        int rc;
    } cases[16];
    int n = 0;
#define CASE(expr)                                                      \
    do {                                                                \
        cases[n].what = #expr;                                          \
        cases[n].rc = (expr);                                           \
        cr_assert_eq(cases[n].rc, CFX_ERR_PROTO, "%s accepted", #expr); \
        cr_assert_not_null(why);                                        \
        n++;                                                            \
    } while (0)
    CASE(decode_mod(good_hdr, 999, 0, CFX_DPDK_HDR_MAX - 1, &why)); /* truncated */
    CASE(decode_mod(good_hdr, 999, 0, 15, &why));                   /* no common part */
    CASE(decode_mod(good_hdr, 0, 0x00, full, &why));                /* magic */
    CASE(decode_mod(good_hdr, 2, CFX_DPDK_VERSION + 1, full, &why)); /* version */
    CASE(decode_mod(good_hdr, 34, 1, full, &why));                  /* reserved, DATA */
    CASE(decode_mod(good_hdr, 42, 1, full, &why));                  /* reserved, ACK */
    CASE(decode_mod(good_hdr, 3, 0x80, full, &why));                /* unknown flag */
    CASE(decode_mod(good_hdr, 3, 0, full, &why));                   /* no flag */
    CASE(decode_mod(good_hdr, 999, 0, full - 1, &why));             /* len not the rest */
    h = good_hdr;
    h.frag_idx = 3;
    CASE(decode_mod(h, 999, 0, full, &why)); /* idx >= cnt */
    h = good_hdr;
    h.frag_cnt = 0;
    h.frag_idx = 0;
    CASE(decode_mod(h, 999, 0, full, &why)); /* no fragments */
    h = good_hdr;
    h.msg_len = CFX_DPDK_MSG_MAX + 1;
    CASE(decode_mod(h, 999, 0, full, &why)); /* message cap */
    h = good_hdr;
    h.msg_len = 50;
    CASE(decode_mod(h, 999, 0, full, &why)); /* fragment > message */
    h = good_hdr;
    h.flags = CFX_DPDK_F_ACK;
    CASE(decode_mod(h, 999, 0, full, &why)); /* payload without DATA */
    h = good_hdr;
    h.window = CFX_DPDK_WIN_MAX + 1;
    CASE(decode_mod(h, 999, 0, full, &why)); /* window cap */
    CASE(decode_mod(good_hdr, 3, CFX_DPDK_F_CTL | CFX_DPDK_F_DATA, full, &why)); /* CTL + DATA */
#undef CASE
    /* a fragment count that cannot carry the message */
    h = good_hdr;
    h.frag_cnt = 2;
    h.frag_idx = 0;
    h.msg_len = 2 * CFX_DPDK_PAYLOAD_MAX + 1;
    cr_assert_eq(decode_mod(h, 999, 0, full, &why), CFX_ERR_PROTO);
    /* a payload over the cap */
    uint8_t *big = calloc(1, CFX_DPDK_HDR_MAX + CFX_DPDK_PAYLOAD_MAX + 1);
    cr_assert_not_null(big);
    h = good_hdr;
    h.len = CFX_DPDK_PAYLOAD_MAX + 1;
    h.frag_cnt = 1;
    h.frag_idx = 0;
    h.msg_len = CFX_DPDK_PAYLOAD_MAX + 1;
    cfx__dpdk_hdr_encode(&h, big);
    cr_assert_eq(cfx__dpdk_hdr_decode(big, CFX_DPDK_HDR_MAX + h.len, &h, &why), CFX_ERR_PROTO);
    free(big);
}

/* Protocol errors past the decoder fail the session, naming the peer. */
static int null_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    return 0;
}
static int null_deliver(void *ctx, const void *buf, size_t len)
{
    return 0;
}
static const struct cfx__dpdk_rel_ops null_ops = { .tx = null_tx, .deliver = null_deliver };

static int sess_one(struct cfx__dpdk_hdr h)
{
    struct cfx__dpdk_sess s;
    static uint8_t payload[CFX_DPDK_PAYLOAD_MAX];
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .msg_max = 4096 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 7, 8, "node-x"), CFX_OK);
    int rc = cfx__dpdk_sess_rx(&s, &h, payload, 1000, 0);
    if (rc)
        cr_assert_not_null(strstr(s.error_msg, "node-x"), "%s", s.error_msg);
    cr_assert_eq(cfx__dpdk_sess_poll(&s, 2000), rc, "the error is sticky");
    cfx__dpdk_sess_fini(&s);
    return rc;
}

Test(dpdk_rel, session_refuses_what_the_protocol_forbids)
{
    struct cfx__dpdk_hdr h = {
        .flags = CFX_DPDK_F_DATA, .session = 7, .len = 1024, .frag_cnt = 3, .msg_len = 2148
    };
    cr_assert_eq(sess_one(h), CFX_OK); /* fragment 0 of 3, 1024 bytes: fine */
    h.len = 1000;
    cr_assert_eq(sess_one(h), CFX_ERR_PROTO); /* short middle fragment */
    h.len = 100;
    h.frag_idx = 2;
    h.seq = 2;                         /* out of order, so it waits in the reorder buffer */
    cr_assert_eq(sess_one(h), CFX_OK); /* the last one is short */
    h.seq = 0;
    cr_assert_eq(sess_one(h), CFX_ERR_PROTO); /* a message starting at fragment 2 */
    h.frag_cnt = 4;
    h.frag_idx = 3;
    cr_assert_eq(sess_one(h), CFX_ERR_PROTO); /* count does not match the length */
    h = (struct cfx__dpdk_hdr){
        .flags = CFX_DPDK_F_DATA, .session = 7, .len = 1024, .frag_cnt = 5, .msg_len = 5000
    };
    cr_assert_eq(sess_one(h), CFX_ERR_TOO_BIG); /* over msg_max */
    h = (struct cfx__dpdk_hdr){ .flags = CFX_DPDK_F_ACK, .session = 7, .ack = 5, .window = 1 };
    cr_assert_eq(sess_one(h), CFX_ERR_PROTO); /* acks data never sent */
    h = (struct cfx__dpdk_hdr){ .flags = CFX_DPDK_F_ACK, .session = 7, .sack = 1, .window = 1 };
    cr_assert_eq(sess_one(h), CFX_ERR_PROTO); /* sacks data never sent */
}

Test(dpdk_rel, parameters_over_their_caps_are_refused)
{
    struct cfx__dpdk_sess s;
    struct cfx__dpdk_rel_params p = { .rcv_slots = CFX_DPDK_WIN_MAX + 1 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    p = (struct cfx__dpdk_rel_params){ .mtu_payload = CFX_DPDK_PAYLOAD_MAX + 1 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    p = (struct cfx__dpdk_rel_params){ .msg_max = CFX_DPDK_MSG_MAX + 1 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    p = (struct cfx__dpdk_rel_params){ .mtu_payload = 64, .msg_max = CFX_DPDK_MSG_MAX };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    /* rings indexed by sequence numbers modulo their size: powers of two
     * only (48 slots would map seq 2^32 - 16 and seq 0 to the same slot) */
    p = (struct cfx__dpdk_rel_params){ .rcv_slots = 48 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    p = (struct cfx__dpdk_rel_params){ .snd_slots = 96 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    p = (struct cfx__dpdk_rel_params){ .sendq_max = 24 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 1, 2, "x"), CFX_ERR_INVALID);
    /* sender side: a message over msg_max */
    cr_assert_eq(cfx__dpdk_sess_init(&s, NULL, &null_ops, NULL, 1, 2, "x"), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_send(&s, "", (1u << 20) + 1, NULL, 0), CFX_ERR_TOO_BIG);
    cfx__dpdk_sess_fini(&s);
}

/* What a receiver echoes: the newest timestamp of a new packet, not of a
 * duplicate (RFC 7323, 4.3).  A spurious retransmission's later timestamp,
 * echoed on the ack of data sent once, gave the sender an RTT sample too
 * short that Karn's rule cannot catch. */
static struct cfx__dpdk_hdr last_ack;
static int ack_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    if (h->flags & CFX_DPDK_F_ACK)
        last_ack = *h;
    return 0;
}
static const struct cfx__dpdk_rel_ops ack_ops = { .tx = ack_tx, .deliver = null_deliver };

static uint8_t payload64[64];

/* A session whose acks land in last_ack, and the first packet to it: a
 * one-packet message of 64 bytes sent at 1000 ns. */
static struct cfx__dpdk_hdr one_packet_session(struct cfx__dpdk_sess *s)
{
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .msg_max = 4096 };
    cr_assert_eq(cfx__dpdk_sess_init(s, &p, &ack_ops, NULL, 7, 8, "node-x"), CFX_OK);
    return (struct cfx__dpdk_hdr){ .flags = CFX_DPDK_F_DATA, .session = 7, .len = 64,
                                   .frag_cnt = 1, .msg_len = 64, .seq = 0, .msg_id = 0,
                                   .ts = 1000 };
}

Test(dpdk_rel, duplicate_timestamp_not_echoed)
{
    struct cfx__dpdk_sess s;
    uint8_t *payload = payload64;
    struct cfx__dpdk_hdr h = one_packet_session(&s);
    cr_assert_eq(cfx__dpdk_sess_rx(&s, &h, payload, 10000, 10000), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_poll(&s, 20000), CFX_OK);
    memset(&last_ack, 0, sizeof(last_ack));
    h.ts = 900000; /* the same packet again, sent much later */
    cr_assert_eq(cfx__dpdk_sess_rx(&s, &h, payload, 950000, 950000), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_poll(&s, 960000), CFX_OK);
    cr_assert(last_ack.flags & CFX_DPDK_F_ACK, "a duplicate is acked at once");
    cr_assert_eq(last_ack.ack, 1);
    cr_assert_eq(last_ack.ts_echo, 1000, "echoed %llu: the duplicate's timestamp",
                 (unsigned long long)last_ack.ts_echo);
    cfx__dpdk_sess_fini(&s);
}

/* A one-packet message's ack waits for an answer to ride on (up to the
 * delayed-ack time); a session that closes sends it at once instead
 * (cfx__dpdk_sess_ack_flush), so that the peer's sender completes. */
Test(dpdk_rel, owed_ack_goes_when_flushed)
{
    struct cfx__dpdk_sess s;
    uint8_t *payload = payload64;
    struct cfx__dpdk_hdr h = one_packet_session(&s);
    memset(&last_ack, 0, sizeof(last_ack));
    cr_assert_eq(cfx__dpdk_sess_rx(&s, &h, payload, 10000, 0), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_poll(&s, 11000), CFX_OK);
    cr_assert_eq(last_ack.flags, 0, "acked at once: nothing to flush, the test tests nothing");
    cr_assert_eq(cfx__dpdk_sess_deadline(&s), 10000 + 50000, "the ack's delay");
    cfx__dpdk_sess_ack_flush(&s, 12000);
    cr_assert(last_ack.flags & CFX_DPDK_F_ACK, "the owed ack did not go");
    cr_assert_eq(last_ack.ack, 1);
    cr_assert_eq(last_ack.ts_echo, 1000);
    cr_assert_eq(cfx__dpdk_sess_deadline(&s), UINT64_MAX, "an ack still owed after the flush");
    memset(&last_ack, 0, sizeof(last_ack));
    cfx__dpdk_sess_ack_flush(&s, 13000);
    cr_assert_eq(last_ack.flags, 0, "a second ack with nothing owed");
    cfx__dpdk_sess_fini(&s);
}

/* --- scripted traces: every packet a session sends is kept, and the test
 * says which arrive, when and in what order ---------------------------------- */

#define WIRE_MAX 32
#define WIRE_SEED 0x77u

struct wire {
    struct cfx__dpdk_hdr h[WIRE_MAX];
    uint8_t pl[WIRE_MAX][256];
    int n;
    uint32_t sent; /* sent() calls */
    uint32_t got;  /* messages delivered, each checked */
};

static int wire_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    struct wire *w = ctx;
    cr_assert_lt(w->n, WIRE_MAX);
    cr_assert_leq(h->len, sizeof(w->pl[0]));
    w->h[w->n] = *h;
    if (h->len)
        memcpy(w->pl[w->n], payload, h->len);
    w->n++;
    return CFX_OK;
}

static int wire_deliver(void *ctx, const void *buf, size_t len)
{
    struct wire *w = ctx;
    cr_assert_eq(len, 100, "message %u: %zu bytes", w->got, len);
    cr_assert_eq(cfx_test_check(buf, len, WIRE_SEED + w->got), (size_t)-1, "message %u differs",
                 w->got);
    w->got++;
    return CFX_OK;
}

static void wire_sent(void *ctx, void *cookie)
{
    (void)cookie;
    ((struct wire *)ctx)->sent++;
}

static const struct cfx__dpdk_rel_ops wire_ops = {
    .tx = wire_tx, .deliver = wire_deliver, .sent = wire_sent
};

/* Packet i that @p from sent arrives at @p to at @p now. */
static void wire_rx(struct wire *from, int i, struct cfx__dpdk_sess *to, uint64_t now)
{
    cr_assert_lt(i, from->n);
    cr_assert_eq(cfx__dpdk_sess_rx(to, &from->h[i], from->pl[i], now, 0), CFX_OK, "%s",
                 to->error_msg);
}

/*
 * Four one-packet messages sent at t0, the receiver's acks of them lost;
 * the timer fires at t0 + 5 ms and the first packet goes again.  When
 * @p lost, the third message's packet was lost and the fourth's overtaken
 * (reordered): the third's retransmission, sent after the timeout,
 * arrives just before the fourth's original, and the ack that covers both
 * is the one that ends the undo check.  *@p st gets the sender's counts,
 * *@p cwnd its window at the end.
 */
static void reorder_trace(bool lost, struct cfx__dpdk_rel_stats *st, double *cwnd)
{
    static struct wire ws, wr; /* the sender's packets, the receiver's */
    struct cfx__dpdk_sess s, r;
    static uint8_t bufs[4][100];
    const uint64_t t0 = 1000000, lat = 10000;
    memset(&ws, 0, sizeof(ws));
    memset(&wr, 0, sizeof(wr));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .msg_max = 4096 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &wire_ops, &ws, 1, 2, "receiver"), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_init(&r, &p, &wire_ops, &wr, 2, 1, "sender"), CFX_OK);
    for (uint32_t i = 0; i < 4; i++) {
        cfx_test_fill(bufs[i], sizeof(bufs[i]), WIRE_SEED + i);
        cr_assert_eq(cfx__dpdk_sess_send(&s, bufs[i], sizeof(bufs[i]), NULL, t0), CFX_OK);
    }
    cr_assert_eq(ws.n, 4, "the window took %d of 4 packets", ws.n);
    double cwnd0 = s.cwnd;

    /* packets 0 and 1 arrive; 2 arrives too unless lost; 3 comes late
     * when 2 was lost, else now; every ack of theirs is lost */
    wire_rx(&ws, 0, &r, t0 + lat);
    wire_rx(&ws, 1, &r, t0 + lat);
    if (!lost) {
        wire_rx(&ws, 2, &r, t0 + lat);
        wire_rx(&ws, 3, &r, t0 + lat);
    }
    cr_assert_eq(cfx__dpdk_sess_poll(&r, t0 + lat + 100000), CFX_OK);
    cr_assert_gt(wr.n, 0, "the receiver sent no ack");
    int lost_acks = wr.n;

    /* the timeout: the window goes to one packet and packet 0 goes again */
    uint64_t t = t0 + 5000000;
    cr_assert_eq(cfx__dpdk_sess_poll(&s, t), CFX_OK);
    cr_assert_eq(s.stats.rto, 1);
    cr_assert_eq(ws.n, 5);
    cr_assert_eq(ws.h[4].seq, 0);
    /* it is a duplicate there: acked at once, echoing packet 1's (or 3's) time */
    t += lat;
    wire_rx(&ws, 4, &r, t);
    cr_assert_eq(cfx__dpdk_sess_poll(&r, t), CFX_OK);
    cr_assert_eq(wr.n, lost_acks + 1);
    t += lat;
    wire_rx(&wr, lost_acks, &s, t);
    cr_assert_eq(cfx__dpdk_sess_poll(&s, t), CFX_OK);
    if (lost) {
        /* packet 2 goes again (after the timeout); it arrives, and then the
         * original of 3, overtaken, in the same burst: one ack for both */
        cr_assert_eq(ws.n, 6);
        cr_assert_eq(ws.h[5].seq, 2);
        t += lat;
        wire_rx(&ws, 5, &r, t);
        wire_rx(&ws, 3, &r, t);
        cr_assert_eq(cfx__dpdk_sess_poll(&r, t + 100000), CFX_OK);
        cr_assert_eq(wr.n, lost_acks + 2);
        t += 100000 + lat;
        wire_rx(&wr, lost_acks + 1, &s, t);
        cr_assert_eq(cfx__dpdk_sess_poll(&s, t), CFX_OK);
    }
    cr_assert_eq(wr.got, 4, "%u of 4 messages delivered", wr.got);
    cr_assert_eq(ws.sent, 4, "%u of 4 messages acknowledged", ws.sent);
    cr_assert(cfx__dpdk_sess_idle(&s));
    cr_assert_eq(s.error, 0, "%s", s.error_msg);
    cr_assert_eq(r.error, 0, "%s", r.error_msg);
    cr_assert_gt(cwnd0, 1.0);
    *st = s.stats;
    *cwnd = s.cwnd;
    cfx__dpdk_sess_fini(&s);
    cfx__dpdk_sess_fini(&r);
}

/*
 * Eifel's test needs echoes that never go back in time: the ack that
 * ended the undo check covered a retransmission sent after the timeout
 * (packet 2 was lost), but echoed the later-arriving original of packet
 * 3, sent before it, and the timeout was undone.  The receiver echoes the
 * newest timestamp it has seen (RFC 7323's TS.Recent), so the loss shows.
 */
Test(dpdk_rel, reordered_original_does_not_undo_a_timeout_after_a_loss)
{
    struct cfx__dpdk_rel_stats st;
    double cwnd;
    reorder_trace(true, &st, &cwnd);
    cr_assert_eq(st.rto_undone, 0, "a timeout after a real loss undone");
    cr_assert_lt(cwnd, 16.0, "the window came back to %.1f after a loss", cwnd);
}

/* ... while the same timeout with nothing lost (only the acks were) is
 * undone: the window comes back whole. */
Test(dpdk_rel, timeout_with_only_acks_lost_is_undone)
{
    struct cfx__dpdk_rel_stats st;
    double cwnd;
    reorder_trace(false, &st, &cwnd);
    cr_assert_eq(st.rto_undone, 1);
    cr_assert_geq(cwnd, 16.0, "the window came back to %.1f of 16", cwnd);
}

/*
 * Sixteen packets in flight and nothing acked: the first timeout halves
 * the threshold and leaves one packet of window; the ones after it, with
 * the same packet still unacknowledged, keep the threshold (RFC 5681,
 * 3.1).  It was halved again from that one-packet window, to 2: after an
 * outage of two RTOs the flow grew back one packet per RTT.
 */
Test(dpdk_rel, repeated_timeouts_keep_the_threshold)
{
    static struct wire ws;
    static uint8_t bufs[16][100];
    struct cfx__dpdk_sess s;
    const uint64_t t0 = 1000000;
    memset(&ws, 0, sizeof(ws));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .msg_max = 4096 };
    cr_assert_eq(cfx__dpdk_sess_init(&s, &p, &wire_ops, &ws, 1, 2, "receiver"), CFX_OK);
    for (uint32_t i = 0; i < 16; i++)
        cr_assert_eq(cfx__dpdk_sess_send(&s, bufs[i], sizeof(bufs[i]), NULL, t0), CFX_OK);
    cr_assert_eq(ws.n, 16);
    uint64_t t = t0;
    for (int i = 1; i <= 3; i++) {
        t = cfx__dpdk_sess_deadline(&s);
        cr_assert_eq(cfx__dpdk_sess_poll(&s, t), CFX_OK);
        cr_assert_eq(s.stats.rto, (uint64_t)i);
        cr_assert_eq(s.cwnd, 1.0);
        cr_assert_eq(s.ssthresh, 8.0, "threshold %.1f after timeout %d", s.ssthresh, i);
    }
    cfx__dpdk_sess_fini(&s);
}

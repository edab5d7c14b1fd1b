/*
 * tcp sealing (CFX_SECURE, ep_seal): after each side's marked last clear
 * frame its bytes travel as AES-256-GCM records.  These tests drive two
 * ifaces directly, some through a relay thread that sees (and alters) the
 * bytes on the wire the way someone on the path could.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "control/seal.h"
#include "tcp_harness.h"

TestSuite(tcp_seal, .init = setup, .fini = teardown, .timeout = 90);

#define LAST_CLEAR "last clear" /* the marked frame's payload */
/* bytes a -> b in clear: a's HELLO frame and its marked frame */
#define CLEAR_AB (2 * sizeof(struct cfx__tcp_hdr) + sizeof(struct cfx__tcp_hello) + \
                  sizeof(LAST_CLEAR) - 1)

static struct cfx_seal_keys test_keys(void)
{
    struct cfx_seal_keys k;
    cr_assert_eq(cfx_test_seal_keys(&k), CFX_OK);
    return k;
}

/* --- a relay on the path a -> b: forwards, captures, alters ------------------ */

enum relay_act { RELAY_PASS, RELAY_FLIP, RELAY_REPLAY, RELAY_DROP };

struct relay {
    int lfd;
    char addr[32];  /* where a connects */
    char dst[32];   /* b's address */
    enum relay_act act;
    pthread_t th;
    atomic_bool stop;
    uint8_t *cap;   /* every byte a sent, as a sent it */
    size_t cap_len;
};

#define CAP_MAX (16u << 20)

static void send_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return; /* the far end failed: the test looks at why */
        p += k;
        n -= (size_t)k;
    }
}

/* Length of a's first sealed record (at CLEAR_AB), once it is all captured. */
static size_t first_record(const struct relay *r)
{
    uint32_t len;
    if (r->cap_len < CLEAR_AB + 4)
        return 0;
    memcpy(&len, r->cap + CLEAR_AB, 4);
    len = le32toh(len);
    size_t whole = 4 + len + CFX_SEAL_TAG_LEN;
    return r->cap_len >= CLEAR_AB + whole ? whole : 0;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    struct sockaddr_in sa;
    int a = -1, b = -1;
    size_t sent = 0; /* of cap, forwarded to b */
    bool done = false;
    uint8_t buf[65536];

    struct pollfd lp = { .fd = r->lfd, .events = POLLIN };
    while (!atomic_load(&r->stop) && poll(&lp, 1, 50) == 0)
        ;
    if (atomic_load(&r->stop) || (a = accept(r->lfd, NULL, NULL)) < 0)
        return NULL;
    b = socket(AF_INET, SOCK_STREAM, 0);
    if (cfx__parse_hostport(r->dst, &sa) != CFX_OK ||
        connect(b, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        goto out;
    while (!atomic_load(&r->stop)) {
        struct pollfd p[2] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN } };
        if (poll(p, 2, 50) <= 0)
            continue;
        if (p[1].revents) { /* b -> a: as it is */
            ssize_t n = recv(b, buf, sizeof(buf), 0);
            if (n <= 0)
                break;
            send_all(a, buf, (size_t)n);
        }
        if (p[0].revents) {
            ssize_t n = recv(a, r->cap + r->cap_len, CFX_MIN(sizeof(buf), CAP_MAX - r->cap_len),
                             0);
            if (n <= 0)
                break;
            r->cap_len += (size_t)n;
            size_t upto = r->cap_len, rec;
            switch (r->act) {
            case RELAY_PASS: break;
            case RELAY_FLIP:
                if (!done && r->cap_len > CLEAR_AB + 100) {
                    r->cap[CLEAR_AB + 100] ^= 0x01; /* one bit inside the first record */
                    done = true;
                }
                upto = done ? r->cap_len : CFX_MIN(r->cap_len, CLEAR_AB);
                break;
            case RELAY_REPLAY:
            case RELAY_DROP:
                if (done)
                    break;
                if (!(rec = first_record(r))) { /* hold it until it is whole */
                    upto = CFX_MIN(r->cap_len, CLEAR_AB);
                    break;
                }
                send_all(b, r->cap + sent, CLEAR_AB - sent);
                if (r->act == RELAY_REPLAY) {
                    send_all(b, r->cap + CLEAR_AB, rec);
                    send_all(b, r->cap + CLEAR_AB, rec); /* the same record again */
                }
                sent = CLEAR_AB + rec; /* RELAY_DROP: it never arrives */
                done = true;
                break;
            }
            if (upto > sent) {
                send_all(b, r->cap + sent, upto - sent);
                sent = upto;
            }
        }
    }
out:
    close(a);
    close(b);
    return NULL;
}

static void relay_start(struct relay *r, enum relay_act act)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    size_t len;

    memset(r, 0, sizeof(*r));
    r->act = act;
    r->cap = malloc(CAP_MAX);
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(r->lfd, 1), 0);
    getsockname(r->lfd, (struct sockaddr *)&sa, &sl);
    snprintf(r->addr, sizeof(r->addr), "127.0.0.1:%u", ntohs(sa.sin_port));
    addr_of(B.iface, r->dst, &len);
    cr_assert_eq(pthread_create(&r->th, NULL, relay_main, r), 0);
}

static void relay_stop(struct relay *r)
{
    atomic_store(&r->stop, true);
    pthread_join(r->th, NULL);
    close(r->lfd);
}

/* --- sealing a pair -------------------------------------------------------------- */

/* a connects to b (through @p via when given) and both seal in @p mode.
 * @p b_first: b has its keys before a's mark arrives (else the mark comes
 * first, with a sealed message right behind it, and b's keys later). */
static struct cfx_tp_ep *seal_pair(int mode, bool b_first, struct relay *via,
                                   struct cfx_tp_ep **accepted)
{
    struct cfx_seal_keys k = test_keys();
    struct cfx_tp_ep *ab, *ba;

    if (via) {
        cr_assert_eq(ops->ep_connect(A.iface, via->addr, strlen(via->addr), 2, &ab), CFX_OK);
        cr_assert_eq(wait_ev(&A, CFX_TP_COMP_CONNECTED, ab)->c.status, CFX_OK);
        ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    } else {
        ab = connect_ab(&ba);
    }
    if (b_first)
        cr_assert_eq(ops->ep_seal(ba, mode, &k, false), CFX_OK);
    cr_assert_eq(ops->ep_seal(ab, mode, &k, true), CFX_OK);
    cr_assert_eq(ops->ep_seal(ab, mode, &k, true), CFX_ERR_INVALID, "sealed twice");
    cr_assert_eq(ops->ep_send(ab, LAST_CLEAR, strlen(LAST_CLEAR), 1), CFX_OK);
    struct ev *e = wait_ev(&B, CFX_TP_COMP_RECV, ba);
    cr_assert_eq(e->c.len, strlen(LAST_CLEAR));
    cr_assert_eq(memcmp(e->data, LAST_CLEAR, e->c.len), 0);
    if (!b_first) {
        cr_assert_eq(ops->ep_send(ab, "first sealed", 12, 2), CFX_OK);
        /* b holds no keys: it must leave the record unread.  An absence
         * can only be watched for a while; a wrong pass, never a wrong
         * failure, comes of a short watch. */
        pump(100);
        cr_assert_null(find_ev(&B, CFX_TP_COMP_RECV, ba), "a record was read before the keys");
        cr_assert_eq(ops->ep_seal(ba, mode, &k, false), CFX_OK);
        e = wait_ev(&B, CFX_TP_COMP_RECV, ba);
        cr_assert_eq(e->c.len, 12);
        cr_assert_eq(memcmp(e->data, "first sealed", 12), 0);
    }
    cr_assert_eq(ops->ep_send(ba, "b clear", 7, 3), CFX_OK); /* b's last clear frame */
    e = wait_ev(&A, CFX_TP_COMP_RECV, ab);
    cr_assert_eq(e->c.len, 7);
    cfx__seal_keys_cleanse(&k);
    *accepted = ba;
    return ab;
}

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u) >> 13 ^ seed);
}

/* Sends both ways and writes a -> b of sizes around the record size, in
 * order, byte for byte. */
static void exchange(struct cfx_tp_ep *ab, struct cfx_tp_ep *ba)
{
    static const struct {
        uint64_t off;
        size_t len;
    } w[] = { { 0, 1 },
              { 7, CFX_TCP_REC_MAX - sizeof(struct cfx__tcp_hdr) },
              { 20000, CFX_TCP_REC_MAX },
              { 40000, CFX_TCP_REC_MAX + 1 },
              { (1u << 20) + 3, 4u << 20 } };
    const size_t total = 6u << 20;
    struct region src, dst;
    uint8_t msg[CFX_TP_SEND_MAX];

    reg(A.iface, &src, total, CFX_TP_ACCESS_LOCAL, 0);
    reg(B.iface, &dst, total, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    fill_pattern(src.buf, total, 5);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        cr_assert_eq(ops->ep_write(ab, src.mr, w[i].off, &dst.rd, w[i].off, w[i].len,
                                   100 + (uint32_t)i, 10 + i),
                     CFX_OK);
        fill_pattern(msg, sizeof(msg), (unsigned)i);
        size_t mlen = i == 0 ? 0 : (i * 997) % sizeof(msg);
        cr_assert_eq(ops->ep_send(ab, msg, mlen, 20 + i), CFX_OK);
        cr_assert_eq(ops->ep_send(ba, msg, mlen, 30 + i), CFX_OK);
    }
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        /* in posting order: the write's immediate, then the message */
        struct ev *e = wait_ev(&B, CFX_TP_COMP_WRITE_IMM, ba);
        cr_assert_eq(e->c.imm, 100 + i);
        cr_assert_eq(e->c.len, w[i].len);
        struct ev *m = wait_ev(&B, CFX_TP_COMP_RECV, ba);
        cr_assert_gt(m - B.evs, e - B.evs, "message %zu overtook its write", i);
        fill_pattern(msg, sizeof(msg), (unsigned)i);
        size_t mlen = i == 0 ? 0 : (i * 997) % sizeof(msg);
        cr_assert_eq(m->c.len, mlen);
        cr_assert_eq(memcmp(m->data, msg, mlen), 0, "message %zu a -> b changed", i);
        m = wait_ev(&A, CFX_TP_COMP_RECV, ab);
        cr_assert_eq(m->c.len, mlen);
        cr_assert_eq(memcmp(m->data, msg, mlen), 0, "message %zu b -> a changed", i);
    }
    /* the written ranges hold the source's bytes, the rest is untouched */
    uint8_t *want = calloc(1, total);
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
        memcpy(want + w[i].off, src.buf + w[i].off, w[i].len);
    for (size_t i = 0; i < total; i++)
        cr_assert_eq(dst.buf[i], want[i], "byte %zu of the destination", i);
    free(want);
    for (size_t i = 0; i < 2 * sizeof(w) / sizeof(w[0]); i++)
        wait_ev(&A, i % 2 ? CFX_TP_COMP_SEND : CFX_TP_COMP_WRITE, ab);
    unreg(&src);
    unreg(&dst);
}

Test(tcp_seal, encrypt_keys_first)
{
    struct cfx_tp_ep *ba, *ab = seal_pair(CFX_SEAL_ENCRYPT, true, NULL, &ba);
    exchange(ab, ba);
}
Test(tcp_seal, encrypt_mark_first)
{
    struct cfx_tp_ep *ba, *ab = seal_pair(CFX_SEAL_ENCRYPT, false, NULL, &ba);
    exchange(ab, ba);
}
Test(tcp_seal, integrity_keys_first)
{
    struct cfx_tp_ep *ba, *ab = seal_pair(CFX_SEAL_INTEGRITY, true, NULL, &ba);
    exchange(ab, ba);
}
Test(tcp_seal, integrity_mark_first)
{
    struct cfx_tp_ep *ba, *ab = seal_pair(CFX_SEAL_INTEGRITY, false, NULL, &ba);
    exchange(ab, ba);
}

/* What the wire shows: in ENCRYPT mode not the written bytes, in INTEGRITY
 * mode the written bytes in clear; the relay on the path passed everything
 * and the destination got it whole. */
static void wire_check(int mode)
{
    static const char secret[] = "conflux-weights-0123456789";
    struct relay r;
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab;

    relay_start(&r, RELAY_PASS);
    ab = seal_pair(mode, true, &r, &ba);
    reg(A.iface, &src, 4096, CFX_TP_ACCESS_LOCAL, 0);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    for (size_t o = 0; o + sizeof(secret) <= 4096; o += sizeof(secret))
        memcpy(src.buf + o, secret, sizeof(secret));
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 4096, 7, 1), CFX_OK);
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_WRITE_IMM, ba)->c.imm, 7);
    cr_assert_eq(memcmp(src.buf, dst.buf, 4096), 0);
    relay_stop(&r);
    bool seen = memmem(r.cap, r.cap_len, secret, sizeof(secret) - 1) != NULL;
    cr_assert_eq(seen, mode == CFX_SEAL_INTEGRITY, "written bytes %s on the wire (mode %s)",
                 seen ? "seen" : "not seen", cfx__seal_mode_name(mode));
    cr_assert(memmem(r.cap, r.cap_len, LAST_CLEAR, strlen(LAST_CLEAR)), "the clear part");
    free(r.cap);
    unreg(&src);
    unreg(&dst);
}

Test(tcp_seal, encrypted_bytes_not_on_the_wire) { wire_check(CFX_SEAL_ENCRYPT); }
Test(tcp_seal, integrity_bytes_in_clear_on_the_wire) { wire_check(CFX_SEAL_INTEGRITY); }

/* One bit flipped, a record replayed, a record dropped on the path: b
 * refuses the record that does not open (CFX_ERR_AUTH, counted), reports
 * nothing of it, and not a byte of it lands. */
static void tampered(enum relay_act act, int mode)
{
    struct relay r;
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab;

    relay_start(&r, act);
    ab = seal_pair(mode, true, &r, &ba);
    reg(A.iface, &src, 8192, CFX_TP_ACCESS_LOCAL, 0);
    reg(B.iface, &dst, 8192, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    fill_pattern(src.buf, 8192, 3);
    /* two records: each write goes out alone (an idle queue sends at once) */
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 1000, 1, 1), CFX_OK);
    wait_ev(&A, CFX_TP_COMP_WRITE, ab);
    cr_assert_eq(ops->ep_write(ab, src.mr, 4096, &dst.rd, 4096, 1000, 2, 2), CFX_OK);

    struct ev *e = wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba);
    cr_assert_eq(e->c.status, CFX_ERR_AUTH, "b failed with %s", cfx_errname(e->c.status));
    cr_assert_eq(ops->iface_seal_refused(B.iface), 1);
    /* a replayed record comes after the original, which was taken */
    size_t landed = act == RELAY_REPLAY;
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_WRITE_IMM, ba), landed);
    for (size_t i = 0; i < 8192; i++)
        cr_assert_eq(dst.buf[i], landed && i < 1000 ? src.buf[i] : 0, "byte %zu", i);
    relay_stop(&r);
    free(r.cap);
    unreg(&src);
    unreg(&dst);
}

Test(tcp_seal, flipped_bit_refused) { tampered(RELAY_FLIP, CFX_SEAL_ENCRYPT); }
Test(tcp_seal, flipped_bit_refused_integrity) { tampered(RELAY_FLIP, CFX_SEAL_INTEGRITY); }
Test(tcp_seal, replayed_record_refused) { tampered(RELAY_REPLAY, CFX_SEAL_ENCRYPT); }
Test(tcp_seal, dropped_record_refused) { tampered(RELAY_DROP, CFX_SEAL_ENCRYPT); }

/* A sealed BYE: the peer reports CLOSED, not a broken record. */
Test(tcp_seal, close_says_bye_sealed)
{
    struct cfx_tp_ep *ba, *ab = seal_pair(CFX_SEAL_ENCRYPT, true, NULL, &ba);
    ops->ep_close(ab);
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_CLOSED);
    cr_assert_eq(ops->iface_seal_refused(B.iface), 0);
}

/* A peer that agreed to seal and then sends in clear is refused. */
Test(tcp_seal, clear_frame_after_agreement_refused)
{
    struct cfx_seal_keys k = test_keys();
    int fd = raw_connect(B.iface);
    raw_hello(fd, 7, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    cr_assert_eq(ops->ep_seal(ba, CFX_SEAL_ENCRYPT, &k, false), CFX_OK);
    raw_send_msg(fd, "no mark");
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_PROTO);
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_RECV, ba), 0);
    close(fd);
}

/* After a peer's mark, its bytes wait for the keys; clear bytes sent as if
 * they were records then fail to open, counted, and never reach the user. */
Test(tcp_seal, clear_bytes_after_the_mark_never_parsed)
{
    struct cfx_seal_keys k = test_keys();
    int fd = raw_connect(B.iface);
    raw_hello(fd, 7, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_SEND, .flags = CFX_TCP_F_LAST_CLEAR,
                              .len = htole32(2) };
    raw_send(fd, &h, sizeof(h));
    raw_send(fd, "m1", 2);
    raw_send_msg(fd, "m2 in clear");
    struct ev *e = wait_ev(&B, CFX_TP_COMP_RECV, ba);
    cr_assert_eq(e->c.len, 2);
    pump(100); /* an absence: see seal_pair */
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_RECV, ba), 1, "bytes after the mark were parsed");
    cr_assert_eq(ops->ep_seal(ba, CFX_SEAL_ENCRYPT, &k, false), CFX_OK);
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_AUTH);
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_RECV, ba), 1);
    cr_assert_eq(ops->iface_seal_refused(B.iface), 1);
    close(fd);
}

/* The mark is for sends only, and comes once. */
Test(tcp_seal, mark_on_a_write_refused)
{
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_WRITE, .flags = CFX_TCP_F_LAST_CLEAR };
    struct cfx__tcp_hdr out;
    const char *why;
    cr_assert_eq(cfx__tcp_hdr_check(&h, sizeof(h), false, &out, &why), CFX_ERR_PROTO);
    h.type = CFX_TCP_FRAME_SEND;
    h.flags = 0x02;
    cr_assert_eq(cfx__tcp_hdr_check(&h, sizeof(h), false, &out, &why), CFX_ERR_PROTO);
    h.flags = CFX_TCP_F_LAST_CLEAR;
    cr_assert_eq(cfx__tcp_hdr_check(&h, sizeof(h), false, &out, &why), CFX_TCP_FRAME_SEND);
}

/*
 * The dpdk transport's packet I/O (dataplane/dpdk/dpdk_io.c) for real: two
 * processes joined by DPDK's net_memif (one the memif server, the other the
 * client, the socket in a temporary directory), the reliability sessions
 * of dpdk_rel.c over it, 1% of the frames dropped on receive on both sides
 * by the port's test hook, every byte checked against the reference.
 *
 * EAL runs without hugepages: --no-huge -m 256 --no-pci and a file prefix
 * of its own per process.  (--in-memory is refused together with --no-huge
 * by DPDK 22.11: "Option --legacy-mem is not compatible with --in-memory";
 * --no-shconf makes net_memif fail: "Failed to register mp action
 * callback: Operation not supported".)
 *
 * Also the frame builder and parser, which need no DPDK.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"
#include "dataplane/dpdk/dpdk_io.h"
#include "dataplane/transport.h"
#include "testutil.h"

/* --- frames (no DPDK needed) ------------------------------------------------- */

static const struct cfx__dpdk_addr addr_a = { { 0x02, 0, 0, 0, 0, 0xA }, 0x0A000001, 4791 };
static const struct cfx__dpdk_addr addr_b = { { 0x02, 0, 0, 0, 0, 0xB }, 0x0A000002, 4792 };

Test(dpdk_frame, build_and_parse_round_trip)
{
    uint8_t frame[2048], payload[1000];
    struct cfx__dpdk_hdr h = { .flags = CFX_DPDK_F_DATA | CFX_DPDK_F_ACK,
                               .session = 3,
                               .seq = 77,
                               .len = sizeof(payload),
                               .frag_cnt = 1,
                               .msg_len = sizeof(payload),
                               .window = 9 };
    cfx_test_fill(payload, sizeof(payload), 5);
    int len = cfx__dpdk_frame_build(frame, sizeof(frame), &addr_a, &addr_b, &h, payload);
    cr_assert_eq(len, CFX_DPDK_FRAME_OVERHEAD + sizeof(payload));
    cr_assert_eq(frame[12], 0x08); /* IPv4 ethertype, big endian */
    cr_assert_eq(frame[13], 0x00);

    struct cfx__dpdk_addr src;
    struct cfx__dpdk_hdr out;
    const void *pl;
    const char *why;
    cr_assert_eq(cfx__dpdk_frame_parse(frame, (size_t)len, &addr_b, &src, &out, &pl, &why), CFX_OK,
                 "%s", why);
    cr_assert_eq(memcmp(src.mac, addr_a.mac, 6), 0);
    cr_assert_eq(src.ip, addr_a.ip);
    cr_assert_eq(src.port, addr_a.port);
    cr_assert_eq(out.seq, 77);
    cr_assert_eq(out.window, 9);
    cr_assert_eq(cfx_test_check(pl, out.len, 5), (size_t)-1);
    /* Ethernet padding after the IP datagram is allowed */
    cr_assert_eq(cfx__dpdk_frame_parse(frame, (size_t)len + 4, &addr_b, &src, &out, &pl, &why),
                 CFX_OK);
    cr_assert_eq(cfx__dpdk_frame_build(frame, (size_t)len - 1, &addr_a, &addr_b, &h, payload),
                 CFX_ERR_TOO_BIG);

    /* data alone: the 36-byte header, the payload right after it */
    h.flags = CFX_DPDK_F_DATA;
    len = cfx__dpdk_frame_build(frame, sizeof(frame), &addr_a, &addr_b, &h, payload);
    cr_assert_eq(len, CFX_DPDK_FRAME_HDRS + CFX_DPDK_HDR_DATA + sizeof(payload));
    cr_assert_eq(cfx__dpdk_frame_parse(frame, (size_t)len, &addr_b, &src, &out, &pl, &why), CFX_OK,
                 "%s", why);
    cr_assert_eq(out.flags, CFX_DPDK_F_DATA);
    cr_assert_eq(out.seq, 77);
    cr_assert_eq(out.window, 0, "no ack fields: none decoded");
    cr_assert_eq((const uint8_t *)pl - frame, CFX_DPDK_FRAME_HDRS + CFX_DPDK_HDR_DATA);
    cr_assert_eq(cfx_test_check(pl, out.len, 5), (size_t)-1);
}

/* RFC 1071 as written: big-endian 16-bit words, an odd byte padded with zero. */
static uint16_t ref_csum(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    uint32_t sum = 0;
    for (size_t i = 0; i < alen + blen; i += 2) {
        uint8_t hi = i < alen ? a[i] : b[i - alen];
        size_t j = i + 1;
        uint8_t lo = j >= alen + blen ? 0 : j < alen ? a[j] : b[j - alen];
        sum += (uint32_t)(hi << 8 | lo);
    }
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    return (uint16_t)~sum;
}

/*
 * The IPv4 and UDP checksums of built frames against the RFC 1071 sum
 * computed here byte by byte, for every payload length of one odd step
 * (odd and even, from none to the largest); the header-only build
 * (zero-copy transmit) writes the same headers.
 */
Test(dpdk_frame, checksums_match_rfc1071_computed_byte_by_byte)
{
    static uint8_t frame[CFX_DPDK_FRAME_OVERHEAD + 9000], hdr[CFX_DPDK_FRAME_OVERHEAD],
        payload[9000];
    for (uint32_t len = 0; len <= sizeof(payload); len += len < 64 ? 1 : 97) {
        /* data alone (36-byte header) and with an ack (64) in turns */
        uint8_t flags = CFX_DPDK_F_DATA | (len % 2 ? CFX_DPDK_F_ACK : 0);
        struct cfx__dpdk_hdr h = { .flags = flags, .session = 9, .seq = len, .sack = len * 3ull,
                                   .len = (uint16_t)len, .frag_cnt = 1, .msg_len = len };
        size_t hdrs = CFX_DPDK_FRAME_HDRS + (len % 2 ? CFX_DPDK_HDR_MAX : CFX_DPDK_HDR_DATA);
        cfx_test_fill(payload, len, len);
        int n = cfx__dpdk_frame_build(frame, sizeof(frame), &addr_a, &addr_b, &h, payload);
        cr_assert_eq(n, (int)(hdrs + len));
        const uint8_t *ip = frame + CFX_DPDK_ETH_LEN, *udp = ip + CFX_DPDK_IP_LEN;
        cr_assert_eq(ref_csum(ip, CFX_DPDK_IP_LEN, NULL, 0), 0, "IPv4 header sum, %u B", len);
        uint16_t udp_len = (uint16_t)(n - CFX_DPDK_ETH_LEN - CFX_DPDK_IP_LEN);
        uint8_t pseudo[12];
        memcpy(pseudo, ip + 12, 8);
        pseudo[8] = 0;
        pseudo[9] = 17;
        pseudo[10] = (uint8_t)(udp_len >> 8);
        pseudo[11] = (uint8_t)udp_len;
        uint16_t got = (uint16_t)(udp[6] << 8 | udp[7]);
        uint8_t zeroed[CFX_DPDK_FRAME_OVERHEAD + 9000];
        memcpy(zeroed, udp, udp_len);
        zeroed[6] = zeroed[7] = 0;
        uint16_t want = ref_csum(pseudo, sizeof(pseudo), zeroed, udp_len);
        cr_assert_eq(got, want ? want : 0xFFFF, "UDP checksum of a %u-byte payload: %04x, not %04x",
                     len, got, want);
        cr_assert_eq(cfx__dpdk_frame_build_hdr(hdr, sizeof(hdr), &addr_a, &addr_b, &h, payload),
                     (int)hdrs);
        cr_assert_eq(memcmp(hdr, frame, hdrs), 0, "header-only build, %u B", len);
    }
}

/*
 * A sound datagram to us whose header is refused (a peer of another wire
 * version) names its sender, so that the port can say who it refuses; a
 * frame not to us leaves the sender as the caller set it.
 */
Test(dpdk_frame, refused_header_names_its_sender)
{
    uint8_t f[256];
    struct cfx__dpdk_hdr h = { .flags = CFX_DPDK_F_ACK, .session = 3 };
    struct cfx__dpdk_addr src;
    struct cfx__dpdk_hdr out;
    const void *pl;
    const char *why;
    int len = cfx__dpdk_frame_build(f, sizeof(f), &addr_a, &addr_b, &h, NULL);
    cr_assert_gt(len, 0);
    f[40] = f[41] = 0; /* no UDP checksum: only the header is wrong */
    f[CFX_DPDK_FRAME_HDRS + 2] = CFX_DPDK_VERSION - 1;
    memset(&src, 0, sizeof(src));
    cr_assert_eq(cfx__dpdk_frame_parse(f, (size_t)len, &addr_b, &src, &out, &pl, &why),
                 CFX_ERR_PROTO);
    cr_assert(why && strstr(why, "version"), "%s", why ? why : "(none)");
    cr_assert_eq(src.ip, addr_a.ip);
    cr_assert_eq(src.port, addr_a.port);
    cr_assert_eq(memcmp(src.mac, addr_a.mac, 6), 0);
    /* to another port of ours: not ours, src untouched */
    memset(&src, 0, sizeof(src));
    struct cfx__dpdk_addr other = addr_b;
    other.port++;
    cr_assert_eq(cfx__dpdk_frame_parse(f, (size_t)len, &other, &src, &out, &pl, &why),
                 CFX_ERR_PROTO);
    cr_assert_eq(src.ip, 0);
}

Test(dpdk_frame, parser_refuses_frames_not_ours)
{
    uint8_t good[256], f[256];
    struct cfx__dpdk_hdr h = { .flags = CFX_DPDK_F_ACK, .session = 3 };
    struct cfx__dpdk_addr src;
    struct cfx__dpdk_hdr out;
    const void *pl;
    const char *why;
    int len = cfx__dpdk_frame_build(good, sizeof(good), &addr_a, &addr_b, &h, NULL);
    cr_assert_gt(len, 0);
    /* offset, new byte, what it breaks */
    static const struct {
        size_t off;
        uint8_t val;
    } bad[] = {
        { 0, 0x04 },  /* destination MAC */
        { 12, 0x81 }, /* ethertype: VLAN */
        { 14, 0x46 }, /* IPv4 options */
        { 14, 0x65 }, /* IPv6 version */
        { 16, 0x7F }, /* IP length */
        { 20, 0x20 }, /* more fragments */
        { 23, 6 },    /* TCP */
        { 24, 0x00 }, /* IPv4 checksum */
        { 33, 0x03 }, /* destination IP (checksum fixed below) */
        { 36, 0x00 }, /* destination port */
        { 38, 0x7F }, /* UDP length */
        { 60, 0xFF }, /* payload byte: UDP checksum */
        { 42, 0x00 }, /* our magic */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memcpy(f, good, (size_t)len);
        f[bad[i].off] ^= bad[i].val ? bad[i].val : 0xFF;
        cr_assert_eq(cfx__dpdk_frame_parse(f, (size_t)len, &addr_b, &src, &out, &pl, &why),
                     CFX_ERR_PROTO, "byte %zu changed, accepted", bad[i].off);
        cr_assert_not_null(why);
    }
    cr_assert_eq(cfx__dpdk_frame_parse(good, 41, &addr_b, &src, &out, &pl, &why), CFX_ERR_PROTO);
    /* zero UDP checksum: none, accepted */
    memcpy(f, good, (size_t)len);
    f[40] = f[41] = 0;
    cr_assert_eq(cfx__dpdk_frame_parse(f, (size_t)len, &addr_b, &src, &out, &pl, &why), CFX_OK);
}

/* --- two processes over net_memif --------------------------------------------- */
#ifdef CFX_HAVE_DPDK

#define NMSG   300
#define MAXMSG 65536
#define MTU    1400
#define SEED   0x5EEDu

struct role {
    bool server;
    struct cfx__dpdk_port *port;
    struct cfx__dpdk_addr peer;
    struct cfx__dpdk_sess s;
    uint32_t got, acked;
    void *bufs[64]; /* buffers of messages acked..queued-1 (sendq_max 32) */
};

static uint32_t msg_size(uint32_t i)
{
    static const uint32_t fixed[] = { 0, 1, MTU - 1, MTU, MTU + 1, MAXMSG };
    if (i < 6)
        return fixed[i];
    return (uint32_t)((i * 2654435761u) % (MAXMSG + 1));
}

static int role_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    struct role *r = ctx;
    return cfx__dpdk_port_tx(r->port, &r->peer, h, payload);
}

static int role_deliver(void *ctx, const void *buf, size_t len)
{
    struct role *r = ctx;
    if (len != msg_size(r->got)) {
        fprintf(stderr, "server: message %u has %zu bytes, %u expected\n", r->got, len,
                msg_size(r->got));
        exit(3);
    }
    size_t bad = cfx_test_check(buf, len, SEED + r->got);
    if (bad != (size_t)-1) {
        fprintf(stderr, "server: message %u: byte %zu differs\n", r->got, bad);
        exit(3);
    }
    r->got++;
    return CFX_OK;
}

static void role_sent(void *ctx, void *cookie)
{
    struct role *r = ctx;
    free(cookie);
    r->acked++;
}

static const struct cfx__dpdk_rel_ops role_ops = { .tx = role_tx,
                                                   .deliver = role_deliver,
                                                   .sent = role_sent };

static void role_rx(void *ctx, const struct cfx__dpdk_addr *src, const struct cfx__dpdk_hdr *h,
                    const void *payload)
{
    struct role *r = ctx;
    if (h->session == r->s.local_id)
        cfx__dpdk_sess_rx(&r->s, h, payload, cfx__now_ns(), 0);
}

#define FAIL(...)                                              \
    do {                                                       \
        fprintf(stderr, "%s: ", server ? "server" : "client"); \
        fprintf(stderr, __VA_ARGS__);                          \
        fprintf(stderr, "\n");                                 \
        return 1;                                              \
    } while (0)

/* How the server leaves after die_after messages. */
enum leave { LEAVE_EXIT, LEAVE_CLOSE };

/* EAL on @p cpu with one net_memif port in @p dir, opened with @p pp, and
 * the MAC exchange with the peer over the pipes.  The server's socket must
 * exist before the client's port starts (a memif client that finds no
 * socket does not try again): the client waits for the server's address
 * before it starts EAL.  0, or 1 after saying what failed. */
static int port_start(bool server, const char *dir, int cpu,
                      const struct cfx__dpdk_port_params *pp, int to_peer, int from_peer,
                      struct cfx__dpdk_port **port, struct cfx__dpdk_addr *peer)
{
    char eal[512];
    struct cfx__dpdk_addr me;
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=cfxt%d -l %d --log-level=*:warning "
             "--no-telemetry --vdev=net_memif0,role=%s,socket=%s/memif.sock,id=0",
             (int)getpid(), cpu, server ? "server" : "client", dir);
    if (!server && read(from_peer, peer, sizeof(*peer)) != sizeof(*peer))
        FAIL("address from the server: %s", strerror(errno));
    if (cfx__dpdk_eal_init(eal) != CFX_OK)
        FAIL("EAL init failed with: %s", eal);
    if (cfx__dpdk_port_open(pp, port) != CFX_OK)
        FAIL("port open failed");
    cfx__dpdk_port_addr(*port, &me);
    if (write(to_peer, &me, sizeof(me)) != sizeof(me))
        FAIL("address to the peer: %s", strerror(errno));
    if (server && read(from_peer, peer, sizeof(*peer)) != sizeof(*peer))
        FAIL("address from the client: %s", strerror(errno));
    return 0;
}

/* memif raises its link when both sides connected; there is no event to
 * wait on without an interrupt thread, so look every millisecond until
 * @p deadline.  0, or 1 after saying so. */
static int link_wait(bool server, struct cfx__dpdk_port *port, uint64_t deadline)
{
    while (!cfx__dpdk_port_link_up(port)) {
        if (cfx__now_ns() > deadline)
            FAIL("memif link never came up");
        usleep(1000);
    }
    return 0;
}

/* One side.  to_peer/from_peer: pipes for the MAC exchange (the handshake's
 * job in the transport) and the client's "all acknowledged". */
static int run_role(bool server, const char *dir, int to_peer, int from_peer, uint32_t die_after,
                    enum leave leave)
{
    static struct role r;
    struct cfx__dpdk_port_params pp = {
        .name = "net_memif0",
        .ip = server ? 0x0A000001 : 0x0A000002,
        .rx_drop_ppm = 10000, /* 1% of received frames */
        .rx_drop_seed = server ? 11 : 12,
    };
    if (port_start(server, dir, 0, &pp, to_peer, from_peer, &r.port, &r.peer))
        return 1;
    uint64_t t0 = cfx__now_ns(), deadline = t0 + 60ull * 1000000000ull;
    if (link_wait(server, r.port, deadline))
        return 1;
    struct cfx__dpdk_rel_params rp = { .mtu_payload = MTU,
                                       .rcv_slots = 256,
                                       .snd_slots = 256,
                                       .sendq_max = 32,
                                       .msg_max = MAXMSG,
                                       .max_retries = 10,
                                       .rto_init_ns = 5000000,
                                       .rto_min_ns = 1000000 };
    if (cfx__dpdk_sess_init(&r.s, &rp, &role_ops, &r, server ? 1 : 2, server ? 2 : 1,
                            server ? "memif-client" : "memif-server") != CFX_OK)
        FAIL("session init");

    uint32_t queued = 0;
    bool done = false;
    while (!done) {
        uint64_t now = cfx__now_ns();
        if (now > deadline)
            FAIL("deadline: got %u, acked %u of %u", r.got, r.acked, NMSG);
        while (!server && queued < NMSG) {
            uint32_t len = msg_size(queued);
            uint8_t *buf = malloc(len ? len : 1);
            cfx_test_fill(buf, len, SEED + queued);
            int rc = cfx__dpdk_sess_send(&r.s, buf, len, buf, now);
            if (rc == CFX_ERR_AGAIN) {
                free(buf);
                break;
            }
            if (rc)
                FAIL("send: %s", r.s.error_msg);
            r.bufs[queued % 64] = buf;
            queued++;
        }
        cfx__dpdk_port_rx(r.port, role_rx, &r);
        if (server && die_after && r.got >= die_after) {
            /* LEAVE_EXIT: a crash, no goodbye, the port and the memif socket
             * just go; LEAVE_CLOSE: the port is closed (memif's disconnect
             * message) while the client polls its own */
            if (leave == LEAVE_CLOSE)
                cfx__dpdk_port_close(r.port);
            _exit(0);
        }
        if (cfx__dpdk_sess_poll(&r.s, now)) {
            if (die_after && r.s.error == CFX_ERR_TIMEOUT &&
                strstr(r.s.error_msg, "memif-server")) {
                fprintf(stderr, "client: the dead server noticed after %.3f s: %s\n",
                        (double)(cfx__now_ns() - t0) / 1e9, r.s.error_msg);
                cfx__dpdk_sess_fini(&r.s);
                for (uint32_t m = r.acked; m != queued; m++)
                    free(r.bufs[m % 64]); /* fini does not call sent(): ours */
                cfx__dpdk_port_close(r.port);
                return 0;
            }
            FAIL("%s", r.s.error_msg);
        }
        cfx__dpdk_port_flush(r.port);
        if (!server && r.acked == NMSG) {
            char d = 'D';
            if (write(to_peer, &d, 1) != 1)
                FAIL("done: %s", strerror(errno));
            done = true;
        }
        if (server && r.got == NMSG) {
            /* keep acking until the client has every ack */
            struct pollfd pfd = { .fd = from_peer, .events = POLLIN };
            if (poll(&pfd, 1, 0) == 1)
                done = true;
        }
    }
    struct cfx__dpdk_port_stats ps;
    uint64_t bytes = 0;
    cfx__dpdk_port_get_stats(r.port, &ps);
    for (uint32_t i = 0; i < NMSG; i++)
        bytes += msg_size(i);
    /* information only, never asserted: a shared 2-core machine says little */
    fprintf(stderr,
            "%s: %llu bytes in %.3f s after link-up; got %u acked %u; frames rx %llu refused %llu "
            "dropped %llu tx %llu full %llu gated %llu; "
            "data %llu retx %llu rto %llu fast %llu dup %llu\n",
            server ? "server" : "client", (unsigned long long)bytes,
            (double)(cfx__now_ns() - t0) / 1e9, r.got, r.acked, (unsigned long long)ps.rx,
            (unsigned long long)ps.rx_refused, (unsigned long long)ps.rx_dropped,
            (unsigned long long)ps.tx, (unsigned long long)ps.tx_full,
            (unsigned long long)ps.gated, (unsigned long long)r.s.stats.tx_data,
            (unsigned long long)r.s.stats.tx_retx,
            (unsigned long long)r.s.stats.rto, (unsigned long long)r.s.stats.fast_retx,
            (unsigned long long)r.s.stats.rx_dup);
    if (ps.rx_dropped == 0)
        FAIL("the drop hook dropped nothing");
    if (!server && r.s.stats.tx_retx == 0)
        FAIL("nothing was retransmitted");
    cfx__dpdk_sess_fini(&r.s);
    cfx__dpdk_port_close(r.port);
    return 0;
}

/* --- a peer that leaves while this side drains a full ring -------------------- */

#define FLOOD_LEN 1000

struct flood {
    uint64_t got;  /* frames received, every byte checked */
    bool bad;      /* a frame differed from its reference */
};

static void flood_rx(void *ctx, const struct cfx__dpdk_addr *src, const struct cfx__dpdk_hdr *h,
                     const void *payload)
{
    struct flood *f = ctx;
    if (h->len != FLOOD_LEN || cfx_test_check(payload, FLOOD_LEN, SEED + h->seq) != (size_t)-1)
        f->bad = true;
    f->got++;
}

/* One side of the flood: the leaver sends 20000 frames as fast as the ring
 * takes them (more, until the survivor said it took one; a frame the port
 * dropped, its batch full while the interrupt thread held the gate, goes
 * again: the test once sent nothing past such a moment) and then closes
 * its port (LEAVE_CLOSE) or exits without a word (LEAVE_EXIT) while the
 * survivor is still draining its ring; the survivor polls until its link
 * goes down and the leaver is gone (its pipe closed).  Exit status 0 when
 * every frame was right and the link went down. */
static int run_flood(bool server, bool leaver, const char *dir, int to_peer, int from_peer,
                     enum leave leave)
{
    struct cfx__dpdk_port *port;
    struct cfx__dpdk_addr peer;
    int cpu = 0;
    if (!leaver) {
        /* the survivor and its EAL interrupt thread on one CPU: the
         * interrupt thread, woken by the peer's leaving, then preempts the
         * polling thread wherever it is, in the middle of a burst too */
        cpu_set_t set, one;
        if (sched_getaffinity(0, sizeof(set), &set) != 0)
            FAIL("sched_getaffinity: %s", strerror(errno));
        while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set))
            cpu++;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0)
            FAIL("sched_setaffinity: %s", strerror(errno));
    }
    struct cfx__dpdk_port_params pp = { .name = "net_memif0",
                                        .ip = server ? 0x0A000001 : 0x0A000002 };
    if (port_start(server, dir, cpu, &pp, to_peer, from_peer, &port, &peer))
        return 1;
    uint64_t deadline = cfx__now_ns() + 60ull * 1000000000ull;
    if (link_wait(server, port, deadline))
        return 1;
    /* the survivor starts draining before the flood starts */
    char go = 'G';
    if (!leaver && write(to_peer, &go, 1) != 1)
        FAIL("go: %s", strerror(errno));
    if (leaver && read(from_peer, &go, 1) != 1)
        FAIL("go: %s", strerror(errno));

    if (leaver) {
        static uint8_t payload[FLOOD_LEN];
        uint64_t sent = 0;
        bool took = false;
        /* 20000 frames at least, and on until the survivor took one: leave
         * only then, as on a loaded machine it may not have polled yet, and
         * frames sent while the ring is not ready (or the interrupt thread
         * holds the port) are lost on the wire; a memif server that goes
         * also takes the rings' unread frames with it (the survivor would
         * then have drained nothing, which is not what this tests) */
        while (sent < 20000 || !took) {
            struct cfx__dpdk_hdr h = { .flags = CFX_DPDK_F_DATA, .session = 7,
                                       .seq = (uint32_t)sent, .len = FLOOD_LEN,
                                       .frag_cnt = 1, .msg_len = FLOOD_LEN };
            cfx_test_fill(payload, FLOOD_LEN, SEED + h.seq);
            /* a frame that finds the batch full (its flush found the
             * interrupt thread about) is dropped as if lost on the wire:
             * flush again and send that seq again; out of mbufs likewise */
            struct cfx__dpdk_port_stats before, after;
            cfx__dpdk_port_get_stats(port, &before);
            int rc = cfx__dpdk_port_tx(port, &peer, &h, payload);
            cfx__dpdk_port_get_stats(port, &after);
            if (rc == CFX_OK && after.tx_full == before.tx_full)
                sent++;
            else
                cfx__dpdk_port_flush(port);
            if (!took && sent % 256 == 0) {
                struct pollfd pfd = { .fd = from_peer, .events = POLLIN };
                if (poll(&pfd, 1, 0) == 1) {
                    if (read(from_peer, &go, 1) != 1)
                        FAIL("the survivor went away before it took a frame");
                    took = true;
                }
            }
            if (cfx__now_ns() > deadline)
                FAIL("the survivor took no frame of %llu by the deadline",
                     (unsigned long long)sent);
        }
        cfx__dpdk_port_flush(port);
        if (leave == LEAVE_CLOSE)
            cfx__dpdk_port_close(port);
        _exit(0);
    }

    struct flood f = { 0 };
    bool down = false, gone = false, told = false;
    while (!down || !gone) {
        if (cfx__now_ns() > deadline)
            FAIL("deadline: link %s, leaver %s, %llu frames", down ? "down" : "up",
                 gone ? "gone" : "still there", (unsigned long long)f.got);
        cfx__dpdk_port_rx(port, flood_rx, &f);
        if (f.got && !told) {
            char r = 'R'; /* the leaver may go now */
            if (write(to_peer, &r, 1) != 1)
                FAIL("took a frame: %s", strerror(errno));
            told = true;
        }
        if (!down && !cfx__dpdk_port_link_up(port))
            down = true;
        if (!gone) {
            char c;
            struct pollfd pfd = { .fd = from_peer, .events = POLLIN };
            gone = poll(&pfd, 1, 0) == 1 && read(from_peer, &c, 1) == 0;
        }
    }
    if (f.bad)
        FAIL("a received frame differed from its reference");
    struct cfx__dpdk_port_stats ps;
    cfx__dpdk_port_get_stats(port, &ps);
    if (!f.got)
        FAIL("no frame arrived before the peer left (rx %llu, refused %llu)",
             (unsigned long long)ps.rx, (unsigned long long)ps.rx_refused);
    fprintf(stderr, "%s: %llu frames checked, then the link went down\n",
            server ? "server" : "client", (unsigned long long)f.got);
    cfx__dpdk_port_close(port);
    return 0;
}

#endif /* CFX_HAVE_DPDK */

#ifdef CFX_HAVE_DPDK
/* A forked side ends with _exit() (a crash, or Criterion's child that must
 * not run the parent's exit handlers), so the runtime directory its EAL made
 * for its file prefix (cfxt<pid>) is removed here, after waitpid: EAL puts
 * it under /var/run/dpdk for root, else under $XDG_RUNTIME_DIR or /tmp. */
static void eal_rundir_reap(pid_t pid)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    char base[256], dir[400], path[700];
    if (geteuid() == 0)
        snprintf(base, sizeof(base), "/var/run/dpdk");
    else
        snprintf(base, sizeof(base), "%s/dpdk", xdg ? xdg : "/tmp");
    snprintf(dir, sizeof(dir), "%s/cfxt%d", base, (int)pid);
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

/* The test's socket directory goes. */
static void memif_dir_remove(const char *dir)
{
    char sock[64];
    snprintf(sock, sizeof(sock), "%s/memif.sock", dir);
    unlink(sock);
    rmdir(dir);
}

/* Both sides of a round have ended: their statuses, their EAL run dirs gone. */
static void pair_wait(pid_t server, pid_t client, int *sst, int *cst)
{
    cr_assert_eq(waitpid(server, sst, 0), server);
    cr_assert_eq(waitpid(client, cst, 0), client);
    eal_rundir_reap(server);
    eal_rundir_reap(client);
}
#endif

Test(dpdk_memif, two_processes_1pct_rx_drop_every_byte_checked, .timeout = 120)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK (CFX_WITH_DPDK=OFF, or libdpdk-dev missing)");
#else
    char dir[] = "/tmp/cfx_memif_XXXXXX";
    int c2s[2], s2c[2];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(pipe(c2s), 0);
    cr_assert_eq(pipe(s2c), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(run_role(false, dir, c2s[1], s2c[0], 0, LEAVE_EXIT));
    int rc = run_role(true, dir, s2c[1], c2s[0], 0, LEAVE_EXIT);
    int status = 0;
    if (rc)
        kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    eal_rundir_reap(pid);
    memif_dir_remove(dir);
    cr_assert_eq(rc, 0, "server side failed");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "client side failed (status %#x)",
              status);
#endif
}

/* The server dies (exits without a word) after 50 of the 300 messages: the
 * client's session fails with CFX_ERR_TIMEOUT naming it, within its retry
 * cap, and does not hang. */
Test(dpdk_memif, a_dead_peer_is_noticed_by_timeout_and_named, .timeout = 120)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK (CFX_WITH_DPDK=OFF, or libdpdk-dev missing)");
#else
    char dir[] = "/tmp/cfx_memif_XXXXXX";
    int c2s[2], s2c[2];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(pipe(c2s), 0);
    cr_assert_eq(pipe(s2c), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(run_role(true, dir, s2c[1], c2s[0], 50, LEAVE_EXIT));
    int rc = run_role(false, dir, c2s[1], s2c[0], 50, LEAVE_EXIT);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    eal_rundir_reap(pid);
    memif_dir_remove(dir);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server side failed (status %#x)",
              status);
    cr_assert_eq(rc, 0, "client did not fail with a timeout naming the server");
#endif
}

/* The peer leaves while this side busy-polls the port with traffic in
 * flight, six times: closing its port (memif's disconnect message), or
 * exiting without a word.  Either way net_memif unmaps the shared regions
 * on this side's EAL interrupt thread (memif_disconnect()); the port's
 * gate keeps rx and tx bursts away from that, so this side does not
 * crash, and its session fails with CFX_ERR_TIMEOUT naming the peer.  (The
 * client runs in a child of its own each round: a fresh EAL per round.) */
Test(dpdk_memif, survivor_polls_through_the_peers_close, .timeout = 240)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK (CFX_WITH_DPDK=OFF, or libdpdk-dev missing)");
#else
    for (int round = 0; round < 6; round++) {
        enum leave leave = round % 2 ? LEAVE_EXIT : LEAVE_CLOSE;
        char dir[] = "/tmp/cfx_memif_XXXXXX";
        int c2s[2], s2c[2];
        cr_assert_not_null(mkdtemp(dir));
        cr_assert_eq(pipe(c2s), 0);
        cr_assert_eq(pipe(s2c), 0);
        pid_t server = fork();
        cr_assert_geq(server, 0);
        if (server == 0)
            _exit(run_role(true, dir, s2c[1], c2s[0], 50 + 20 * (uint32_t)round, leave));
        pid_t client = fork();
        cr_assert_geq(client, 0);
        if (client == 0)
            _exit(run_role(false, dir, c2s[1], s2c[0], 50 + 20 * (uint32_t)round, leave));
        int sst = 0, cst = 0;
        pair_wait(server, client, &sst, &cst);
        close(c2s[0]);
        close(c2s[1]);
        close(s2c[0]);
        close(s2c[1]);
        memif_dir_remove(dir);
        const char *how = leave == LEAVE_CLOSE ? "closed its port" : "exited";
        cr_assert(WIFEXITED(sst) && WEXITSTATUS(sst) == 0,
                  "round %d: the server (which %s) failed (status %#x)", round, how, sst);
        cr_assert(!WIFSIGNALED(cst), "round %d: the client died of signal %d after the server %s",
                  round, WTERMSIG(cst), how);
        cr_assert(WIFEXITED(cst) && WEXITSTATUS(cst) == 0,
                  "round %d: the client did not fail with a timeout naming the server, which %s "
                  "(status %#x)",
                  round, how, cst);
    }
#endif
}

/* The peer sends 20000 frames and leaves at once (closes its port, or exits
 * without a word) while this side is still draining the ring: memif's
 * disconnect unmaps the regions on this side's interrupt thread in the
 * middle of its bursts.  Eight rounds: server and client as the survivor,
 * each way of leaving twice.  The survivor must not crash, every frame it
 * took must match its reference, and it must see its link go down. */
Test(dpdk_memif, survivor_drains_a_full_ring_while_the_peer_leaves, .timeout = 240)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK (CFX_WITH_DPDK=OFF, or libdpdk-dev missing)");
#else
    for (int round = 0; round < 8; round++) {
        bool server_leaves = round % 2;
        enum leave leave = round % 4 < 2 ? LEAVE_CLOSE : LEAVE_EXIT;
        char dir[] = "/tmp/cfx_memif_XXXXXX";
        int c2s[2], s2c[2];
        cr_assert_not_null(mkdtemp(dir));
        cr_assert_eq(pipe(c2s), 0);
        cr_assert_eq(pipe(s2c), 0);
        pid_t server = fork();
        cr_assert_geq(server, 0);
        if (server == 0) {
            close(s2c[0]);
            close(c2s[1]);
            _exit(run_flood(true, server_leaves, dir, s2c[1], c2s[0], leave));
        }
        pid_t client = fork();
        cr_assert_geq(client, 0);
        if (client == 0) {
            close(c2s[0]);
            close(s2c[1]);
            _exit(run_flood(false, !server_leaves, dir, c2s[1], s2c[0], leave));
        }
        /* only the children hold the pipes: the survivor sees the leaver's
         * end close when it is gone */
        close(c2s[0]);
        close(c2s[1]);
        close(s2c[0]);
        close(s2c[1]);
        int sst = 0, cst = 0;
        pair_wait(server, client, &sst, &cst);
        memif_dir_remove(dir);
        int surv = server_leaves ? cst : sst, left = server_leaves ? sst : cst;
        const char *how = leave == LEAVE_CLOSE ? "closed its port" : "exited";
        cr_assert(WIFEXITED(left) && WEXITSTATUS(left) == 0,
                  "round %d: the %s, which %s, failed (status %#x)", round,
                  server_leaves ? "server" : "client", how, left);
        cr_assert(WIFEXITED(surv) && WEXITSTATUS(surv) == 0,
                  "round %d: the surviving %s failed or crashed (status %#x) when its peer %s",
                  round, server_leaves ? "client" : "server", surv, how);
    }
#endif
}

#ifdef CFX_HAVE_DPDK
/* CFX_DPDK_EAL for this test process: one net_memif server port on a socket
 * in the fresh directory @p dir (a mkdtemp template; *@p sock its path),
 * EAL's files under @p prefix and our pid. */
static void memif_server_eal(char *dir, const char *prefix, char *sock, size_t cap)
{
    char eal[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(sock, cap, "%s/m.sock", dir);
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=%s%d -l 0 --log-level=*:warning "
             "--no-telemetry --vdev=net_memif0,role=server,socket=%s,id=0",
             prefix, (int)getpid(), sock);
    setenv("CFX_DPDK_EAL", eal, 1);
}

/* rdmactl devices: the ports EAL was given are listed, text and JSON. */
Test(dpdk_ports, listed_for_rdmactl_devices, .timeout = 60)
{
    char dir[] = "/tmp/cfx_memif_XXXXXX", sock[128], *buf = NULL;
    size_t len = 0;
    memif_server_eal(dir, "cfxl", sock, sizeof(sock));
    char why[600] = "unchanged";
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(cfx__dpdk_ports_print(f, 0, NULL, 0), 1);
    cr_assert_eq(cfx__dpdk_ports_print(f, 1, why, sizeof(why)), 1);
    fclose(f);
    cr_assert_str_eq(why, "", "no reason with a port");
    cr_assert(strstr(buf, "dpdk port net_memif0: mac "), "text: %s", buf);
    cr_assert(strstr(buf, "[{\"name\": \"net_memif0\", \"mac\": \""), "json: %s", buf);
    free(buf);
    unlink(sock);
    rmdir(dir);
}

/* An EAL line of CFX_DPDK_EAL that gives EAL no port: rdmactl devices points
 * at that line, not at CFX_DPDK_VDEV (which it said, though unset). */
Test(dpdk_ports, no_port_in_the_eal_line_names_cfx_dpdk_eal, .timeout = 60)
{
    char eal[256], why[600], *buf = NULL;
    size_t len = 0;
    unsetenv("CFX_DPDK_VDEV");
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=cfxp%d -l 0 --log-level=*:warning "
             "--no-telemetry", (int)getpid());
    setenv("CFX_DPDK_EAL", eal, 1);
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(cfx__dpdk_ports_print(f, 0, why, sizeof(why)), 0);
    fclose(f);
    cr_assert_str_eq(buf, "dpdk: EAL started but found no port (check the --vdev or PCI device "
                          "of CFX_DPDK_EAL)\n");
    cr_assert_str_eq(why, "EAL started but found no port (check the --vdev or PCI device of "
                          "CFX_DPDK_EAL)");
    free(buf);
}

/*
 * A word in CFX_DPDK_EAL that EAL does not take fails its start, naming
 * the word: EAL itself stops at it (or, as glibc reorders the words, leaves
 * it over at the end) and went on without it, and with it whatever option
 * came after it in some callers (rdmactl's "+" getopt).  Every later call
 * learns why too.  (After --no-pci, an option with no value, only EAL's
 * parse tells the word from a value: cfx__dpdk_eal_init finds it after.)
 */
Test(dpdk_ports, eal_refuses_a_word_that_is_not_its_option, .timeout = 60)
{
    char eal[512];
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci junk --file-prefix=cfxj%d -l 0 --log-level=*:warning "
             "--no-telemetry --vdev=net_memif0,role=server,socket=cfxj%d,id=0",
             (int)getpid(), (int)getpid());
    setenv("CFX_DPDK_EAL", eal, 1);
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "EAL did not take \"junk"), "%s", cfx_last_error());
    cfx__err_clear();
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    struct cfx_tp_iface *a = NULL;
    cr_assert_eq(ops->iface_open(NULL, &a), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "dpdk iface_open: CFX_DPDK_EAL") &&
                  strstr(cfx_last_error(), "did not take \"junk"),
              "%s", cfx_last_error());
}

/*
 * A start refused for a word EAL did not take leaves the calling thread on
 * the CPUs it had: rte_eal_init() had pinned it to EAL's main lcore (-l 0)
 * before it returned, and the application thread that asked for the
 * context (which may go on with other transports) would otherwise run on
 * that one CPU for the rest of its life.
 */
Test(dpdk_ports, eal_refused_start_gives_the_thread_its_cpus_back, .timeout = 60)
{
    cpu_set_t before, after;
    cr_assert_eq(sched_getaffinity(0, sizeof(before), &before), 0, "%s", strerror(errno));
    if (CPU_COUNT(&before) < 2)
        cr_skip_test("one CPU here: a pinning could not be told from none");
    char eal[512];
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --file-prefix=cfxa%d -l 0 --no-pci junk --log-level=*:warning "
             "--no-telemetry",
             (int)getpid());
    cr_assert_eq(cfx__dpdk_eal_init(eal), CFX_ERR_INVALID, "%s", cfx_last_error());
    cr_assert_eq(sched_getaffinity(0, sizeof(after), &after), 0, "%s", strerror(errno));
    cr_assert(CPU_EQUAL(&before, &after), "the thread is left on %d CPU(s) of %d",
              CPU_COUNT(&after), CPU_COUNT(&before));
}

/* More words than EAL's argument vector holds: refused as CFX_ERR_INVALID
 * like a word EAL did not take, and said so to the caller (the transport's
 * error, at the first call and every later one), not only in the log. */
Test(dpdk_ports, eal_too_many_words_says_why, .timeout = 60)
{
    char eal[1024];
    int off = snprintf(eal, sizeof(eal), "--no-huge -m 256 --no-pci --file-prefix=cfxn%d -l 0",
                       (int)getpid());
    for (int i = 0; i < 60; i++) /* 67 words in all */
        off += snprintf(eal + off, sizeof(eal) - (size_t)off, " --no-telemetry");
    cr_assert_lt((size_t)off, sizeof(eal));
    setenv("CFX_DPDK_EAL", eal, 1);
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    for (int call = 0; call < 2; call++) {
        struct cfx_tp_iface *a = NULL;
        cfx__err(CFX_ERR_IO, "an earlier failure of something else");
        cr_assert_eq(ops->iface_open(NULL, &a), CFX_ERR_INVALID, "call %d", call);
        cr_assert(strstr(cfx_last_error(), "dpdk iface_open: CFX_DPDK_EAL: more than 62 words"),
                  "call %d: %s", call, cfx_last_error());
    }
}

/*
 * An option EAL does not know (or a bad value of one) in CFX_DPDK_EAL makes
 * EAL refuse its command line itself, with the EINVAL it also gives for a
 * runtime directory it cannot make (no device here, then): so
 * CFX_ERR_NO_DEVICE, but naming the variable and the line, at every call.
 * It was "DPDK's EAL did not start", naming neither.
 */
Test(dpdk_ports, eal_refuses_an_option_it_does_not_know, .timeout = 60)
{
    char eal[512];
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=cfxo%d -l 0 --no-such-option "
             "--log-level=*:warning --no-telemetry",
             (int)getpid());
    setenv("CFX_DPDK_EAL", eal, 1);
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    for (int call = 0; call < 2; call++) {
        struct cfx_tp_iface *a = NULL;
        cr_assert_eq(ops->iface_open(NULL, &a), CFX_ERR_NO_DEVICE, "call %d: %s", call,
                     cfx_last_error());
        cr_assert(strstr(cfx_last_error(), "dpdk iface_open: CFX_DPDK_EAL (--no-huge") &&
                      strstr(cfx_last_error(), "EAL did not start"),
                  "call %d: %s", call, cfx_last_error());
    }
}

/*
 * A word EAL does not take that came in CFX_DPDK_VDEV (a blank inside the
 * device's arguments) is named as CFX_DPDK_VDEV's, the variable the user
 * set: the error named CFX_DPDK_EAL, which was not set.
 */
Test(dpdk_ports, a_word_of_the_vdev_names_cfx_dpdk_vdev, .timeout = 60)
{
    unsetenv("CFX_DPDK_EAL");
    setenv("CFX_DPDK_VDEV", "net_memif0,role=server, socket=cfxv", 1);
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "CFX_DPDK_VDEV, in EAL's default line (--no-huge") &&
                  strstr(cfx_last_error(), "\"socket=cfxv\" is neither an EAL option nor the "
                                           "value of one"),
              "%s", cfx_last_error());
}

/*
 * net_memif devices that DPDK 22.11's driver would not take as meant are
 * refused before EAL starts, CFX_ERR_INVALID naming the variable, the
 * device and the key, at every call.  A key the driver does not know made
 * it start a client on /run/memif.sock with all of its defaults (owner-uid
 * is a later release's key), a key without a value crashed it, a role it
 * did not know left EAL up with no port, and "master" (its old name for
 * server) gave a server the transport took for a client.
 */
struct memif_bad {
    const char *var;  /* the variable set (the other is unset) */
    const char *line; /* its value */
    const char *want; /* in the error */
};

static const struct memif_bad memif_bad[] = {
    { "CFX_DPDK_VDEV", "net_memif0,role=server,socket=cfxk,bogus=1",
      "CFX_DPDK_VDEV (net_memif0,role=server,socket=cfxk,bogus=1): net_memif has no key "
      "\"bogus\": DPDK 22.11's net_memif takes id, role, bsize, rsize, socket, "
      "socket-abstract, mac, zero-copy, secret (with any other key it would start with all of "
      "its defaults, a client on /run/memif.sock)" },
    { "CFX_DPDK_EAL", "--no-huge -m 256 --no-pci -l 0 --vdev net_memif0,socket=cfxk,owner-uid=0",
      "CFX_DPDK_EAL (net_memif0,socket=cfxk,owner-uid=0): net_memif has no key \"owner-uid\"" },
    { "CFX_DPDK_EAL", "--no-huge -m 256 -l 0 --vdev=net_null0 --vdev=net_memif1,Role=client",
      "CFX_DPDK_EAL (net_memif1,Role=client): net_memif has no key \"Role\"" },
    { "CFX_DPDK_EAL", "--no-huge -m 256 --no-pci -l 0 --vd=net_memif0,socket=cfxk,zerocopy=yes",
      "CFX_DPDK_EAL (net_memif0,socket=cfxk,zerocopy=yes): net_memif has no key \"zerocopy\"" },
    { "CFX_DPDK_VDEV", "net_memif0,role=master,socket=cfxk",
      "CFX_DPDK_VDEV (net_memif0,role=master,socket=cfxk): role=master: net_memif's role is "
      "server or client" },
    { "CFX_DPDK_VDEV", "net_memif0,socket=cfxk,role=bogus",
      "CFX_DPDK_VDEV (net_memif0,socket=cfxk,role=bogus): role=bogus: net_memif's role is" },
    { "CFX_DPDK_VDEV", "net_memif0,role=server,socket",
      "CFX_DPDK_VDEV (net_memif0,role=server,socket): net_memif's key \"socket\" has no value "
      "(KEY=VALUE)" },
};

ParameterizedTestParameters(dpdk_ports, memif_device_refused_before_eal)
{
    CFX_TEST_INDEX_PARAMS(memif_bad);
}

ParameterizedTest(size_t *i, dpdk_ports, memif_device_refused_before_eal, .timeout = 60)
{
    const struct memif_bad *c = &memif_bad[*i];
    unsetenv("CFX_DPDK_EAL");
    unsetenv("CFX_DPDK_VDEV");
    setenv(c->var, c->line, 1);
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_ERR_INVALID, "%s=%s: %s", c->var, c->line,
                 cfx_last_error());
    cr_assert(strstr(cfx_last_error(), c->want) == cfx_last_error(), "%s=%s: %s", c->var,
              c->line, cfx_last_error());
    cr_assert_eq(cfx__dpdk_port_name(0, (char[64]){ 0 }, 64), CFX_ERR_NOT_FOUND, "EAL is up");
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    for (int call = 0; call < 2; call++) {
        struct cfx_tp_iface *a = NULL;
        cr_assert_eq(ops->iface_open(NULL, &a), CFX_ERR_INVALID, "call %d", call);
        cr_assert(strstr(cfx_last_error(), "dpdk iface_open: ") == cfx_last_error() &&
                      strstr(cfx_last_error(), c->want),
                  "call %d: %s", call, cfx_last_error());
    }
}

/* Every key of DPDK 22.11's net_memif is taken, and reaches the driver:
 * the port has the MAC given (with a key the driver refused, its default
 * would be there).  Empty pairs (",,"), which rte_kvargs skips, too. */
Test(dpdk_ports, memif_device_with_every_key_starts, .timeout = 60)
{
    char vdev[256], *buf = NULL;
    size_t len = 0;
    snprintf(vdev, sizeof(vdev),
             "net_memif0,id=3,role=client,bsize=2048,rsize=10,socket=cfxk%d,socket-abstract=yes,"
             "mac=02:00:00:00:00:0c,zero-copy=no,,secret=s3,",
             (int)getpid());
    unsetenv("CFX_DPDK_EAL");
    setenv("CFX_DPDK_VDEV", vdev, 1);
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_OK, "%s", cfx_last_error());
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(cfx__dpdk_ports_print(f, 0, NULL, 0), 1);
    fclose(f);
    cr_assert_str_eq(buf, "dpdk port net_memif0: mac 02:00:00:00:00:0c\n");
    free(buf);
}

/*
 * The words of CFX_DPDK_EAL are checked before EAL starts: a quote (the
 * line is split at blanks, no shell quoting), and a word that cannot be
 * the value of the word before it.  '"unterminated' alone was an EAL that
 * went on to hugepages and failed there ("Permission denied", not root:
 * CFX_ERR_NO_DEVICE), naming neither; CFX_ERR_INVALID and the word now.
 */
struct eal_bad {
    const char *line;
    const char *want; /* in the error, after "CFX_DPDK_EAL (LINE): " */
};

static const struct eal_bad eal_bad[] = {
    { "\"unterminated",
      "\"\"unterminated\": a quote, kept as it is (the line is split at blanks, not as a "
      "shell would)" },
    { "--no-huge --vdev='net_memif0,role=server,socket=cfxk'", "\"--vdev='net_memif0," },
    { "junk --no-huge -m 256 --no-pci -l 0",
      "\"junk\" is neither an EAL option nor the value of one" },
    { "--no-huge -m 256 --no-pci -l 0 junk", "\"junk\" is neither" },
    { "--no-huge --file-prefix=cfxk junk -l 0", "\"junk\" is neither" },
    { "--no-huge -l 0 -- junk", "\"junk\" is neither" },
};

ParameterizedTestParameters(dpdk_ports, eal_word_refused_before_eal)
{
    CFX_TEST_INDEX_PARAMS(eal_bad);
}

ParameterizedTest(size_t *i, dpdk_ports, eal_word_refused_before_eal, .timeout = 60)
{
    const struct eal_bad *c = &eal_bad[*i];
    char want[512];
    unsetenv("CFX_DPDK_VDEV");
    setenv("CFX_DPDK_EAL", c->line, 1);
    snprintf(want, sizeof(want), "CFX_DPDK_EAL (%s): %s", c->line, c->want);
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_ERR_INVALID, "%s: %s", c->line,
                 cfx_last_error());
    cr_assert(strstr(cfx_last_error(), want) == cfx_last_error(), "%s: %s", c->line,
              cfx_last_error());
    cfx__err_clear();
    cr_assert_eq(cfx__dpdk_eal_init(NULL), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), want) == cfx_last_error(), "later: %s", cfx_last_error());
}

/* rdmactl devices when EAL did not start: the reason, for the
 * "dpdk_error" member beside its "dpdk": [] and in the text line (which
 * said only "its messages, on stderr, say why"). */
Test(dpdk_ports, ports_say_why_eal_did_not_start, .timeout = 60)
{
    char why[600] = "", *buf = NULL;
    size_t len = 0;
    const char *want = "EAL did not start: CFX_DPDK_VDEV (net_memif0,bogus=1): net_memif has "
                       "no key \"bogus\": ";
    unsetenv("CFX_DPDK_EAL");
    setenv("CFX_DPDK_VDEV", "net_memif0,bogus=1", 1);
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(cfx__dpdk_ports_print(f, 1, why, sizeof(why)), 0);
    cr_assert_eq(fflush(f), 0);
    cr_assert_str_eq(buf, "[]");
    cr_assert(strstr(why, want) == why, "%s", why);
    cr_assert_eq(cfx__dpdk_ports_print(f, 0, NULL, 0), 0);
    fclose(f);
    cr_assert(!strncmp(buf + 2, "dpdk: ", 6) && strstr(buf + 2, want) == buf + 8, "%s", buf);
    free(buf);
}

/* CFX_DPDK_PORT and CFX_DPDK_VDEV set empty are not set: the first free
 * port is taken, and with no port asked for the error says so.  An empty
 * CFX_DPDK_PORT was "no DPDK port  (CFX_DPDK_PORT)". */
Test(dpdk_ports, empty_port_and_vdev_are_unset, .timeout = 60)
{
    char dir[] = "/tmp/cfx_memif_XXXXXX", sock[128];
    memif_server_eal(dir, "cfxe", sock, sizeof(sock));
    setenv("CFX_DPDK_PORT", "", 1);
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    struct cfx_tp_iface *a = NULL, *b = NULL;
    int rc = ops->iface_open(NULL, &a);
    char why[512];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    /* the port it took is the one there is: a second context finds it held */
    int rc2 = rc == CFX_OK ? ops->iface_open(NULL, &b) : rc;
    char why2[512];
    snprintf(why2, sizeof(why2), "%s", cfx_last_error());
    if (rc == CFX_OK)
        ops->iface_close(a);
    unlink(sock);
    rmdir(dir);
    cr_assert_eq(rc, CFX_OK, "CFX_DPDK_PORT='': %s", why);
    cr_assert_eq(rc2, CFX_ERR_BUSY, "%s", why2);
    cr_assert(strstr(why2, "(net_memif0) is held by another context"), "%s", why2);
}

Test(dpdk_ports, empty_vdev_asks_for_no_port, .timeout = 60)
{
    unsetenv("CFX_DPDK_EAL");
    setenv("CFX_DPDK_VDEV", "", 1);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(cfx__dpdk_ports_print(f, 0, NULL, 0), 0);
    fclose(f);
    cr_assert_str_eq(buf, "dpdk: no port asked for (set CFX_DPDK_VDEV, or CFX_DPDK_EAL with "
                          "--vdev)\n");
    free(buf);
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    struct cfx_tp_iface *a = NULL;
    cr_assert_eq(ops->iface_open(NULL, &a), CFX_ERR_NO_DEVICE);
    cr_assert(strstr(cfx_last_error(), "no DPDK port asked for: set CFX_DPDK_VDEV"), "%s",
              cfx_last_error());
}

/* Runs @p cmd with sh; its exit status (-1: not run). */
static int sh(const char *cmd)
{
    int st = system(cmd);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/*
 * net_af_packet on an interface whose MTU is under the 1500 bytes the
 * transport's frames need (1436 payload bytes, a 36-byte header, UDP and
 * IPv4): the kernel would drop every full frame, and the sessions only time
 * out ("no acknowledgement after 20 retransmission timeouts").  The port is
 * refused at open, naming the MTU; at 1500 it opens.  Needs root (a veth
 * pair of its own, removed at the end).
 */
Test(dpdk_ports, af_packet_port_under_the_mtu_is_refused, .timeout = 60)
{
    char a[16], b[16], cmd[256], eal[512];
    snprintf(a, sizeof(a), "cfxm%da", (int)getpid() % 100000);
    snprintf(b, sizeof(b), "cfxm%db", (int)getpid() % 100000);
    snprintf(cmd, sizeof(cmd),
             "ip link add %s mtu 1499 type veth peer name %s mtu 1499 2>/dev/null && "
             "ip link set %s up && ip link set %s up",
             a, b, a, b);
    if (sh(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "ip link del %s 2>/dev/null", a);
        sh(cmd);
        cr_skip_test("cannot make a veth pair here (not root?)");
    }
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=cfxu%d -l 0 --log-level=*:warning "
             "--no-telemetry --vdev=net_af_packet0,iface=%s,qdisc_bypass=0",
             (int)getpid(), a);
    int rc = cfx__dpdk_eal_init(eal);
    struct cfx__dpdk_port *port = NULL;
    struct cfx__dpdk_port_params pp = { .name = "net_af_packet0", .ip = 0x0A000001,
                                        .mtu_need = 1500 };
    int refused = rc == CFX_OK ? cfx__dpdk_port_open(&pp, &port) : rc;
    char why[512];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    snprintf(cmd, sizeof(cmd), "ip link set %s mtu 1500 && ip link set %s mtu 1500", a, b);
    int raised = sh(cmd);
    int opened = rc == CFX_OK && raised == 0 ? cfx__dpdk_port_open(&pp, &port) : -1;
    char why2[512];
    snprintf(why2, sizeof(why2), "%s", cfx_last_error());
    cfx__dpdk_port_close(port);
    snprintf(cmd, sizeof(cmd), "ip link del %s", a);
    sh(cmd);
    cr_assert_eq(rc, CFX_OK, "EAL: %s", why);
    cr_assert_eq(refused, CFX_ERR_INVALID, "a port at MTU 1499: %s", why);
    cr_assert(strstr(why, "MTU 1499, under the 1500 bytes"), "%s", why);
    cr_assert_eq(raised, 0);
    cr_assert_eq(opened, CFX_OK, "the same port at MTU 1500: %s", why2);
}

/* Why a context gets no port, each cause in its own words: a second
 * context while the first holds the process's port, and a context after
 * the first closed it (DPDK cannot open a port again in a process).  All
 * were "no free DPDK port". */
Test(dpdk_ports, why_no_port_is_named, .timeout = 60)
{
    char dir[] = "/tmp/cfx_memif_XXXXXX", sock[128];
    memif_server_eal(dir, "cfxw", sock, sizeof(sock));
    const struct cfx_transport_ops *ops = cfx__transport_find("dpdk");
    cr_assert_not_null(ops);
    struct cfx_tp_iface *a = NULL, *b = NULL;
    cr_assert_eq(ops->iface_open(NULL, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(ops->iface_open(NULL, &b), CFX_ERR_BUSY);
    cr_assert(strstr(cfx_last_error(), "(net_memif0) is held by another context"), "%s",
              cfx_last_error());
    ops->iface_close(a);
    cr_assert_eq(ops->iface_open(NULL, &b), CFX_ERR_NO_DEVICE);
    cr_assert(strstr(cfx_last_error(), "port net_memif0 was closed by an earlier context"), "%s",
              cfx_last_error());
    unlink(sock);
    rmdir(dir);
}
#endif

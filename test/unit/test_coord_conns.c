/*
 * The coordinator's connection caps against peers that push on them:
 * unauthenticated connections per source address and in all (the oldest is
 * closed for a newcomer, so a flood of silent connections does not lock
 * token holders out), the bytes held for all connections together
 * (max_buffered: the connection holding the most is closed), a connection
 * that does not read its replies (its requests wait unread), and a frame
 * whose bytes trickle (a deadline from its first byte; its buffer grows as
 * its bytes come).
 *
 * Loopback has a whole /8: connections bound to 127.0.0.2, .3, ... come
 * from other source addresses.  Each check is by what the peers get (a
 * challenge, an error naming the cap, a close, every reply), never by how
 * soon; waits are on the socket, with limits that end only a hang.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/client.h"
#include "control/coord.h"
#include "control/coord_int.h" /* what the coordinator holds */
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "proto_bytes.h"
#include "testutil.h"

TestSuite(coord_conns, .init = coord_fixture_setup, .fini = coord_fixture_teardown,
          .timeout = 120);

/* A TCP connection to the coordinator from source address @p src. */
static int connect_from(const char *src)
{
    struct sockaddr_in sa, me = { .sin_family = AF_INET };
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    cr_assert_geq(s, 0);
    cr_assert_eq(inet_pton(AF_INET, src, &me.sin_addr), 1);
    cr_assert_eq(bind(s, (struct sockaddr *)&me, sizeof(me)), 0, "bind %s: %s", src,
                 strerror(errno));
    cr_assert_eq(cfx__parse_hostport(addr, &sa), CFX_OK);
    cr_assert_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return s;
}

/* The first frame on @p s: its type, and its status and text if an ERROR. */
static uint8_t first_frame(int s, int *status, char *text, size_t cap)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK, "no frame came");
    if (m.type == CFX_MSG_ERROR) {
        *status = m.u.error.status;
        snprintf(text, cap, "%s", m.u.error.text);
    }
    return m.type;
}

/* True when nothing has come on @p s and it is open (looked at, not waited for). */
static bool quiet_and_open(int s)
{
    struct pollfd p = { .fd = s, .events = POLLIN };
    return poll(&p, 1, 0) == 0;
}

/*
 * Four unauthenticated connections at most, two per source.  A third from
 * one source comes in and the oldest of that source is closed, told so
 * (max_unauth_per_ip); a token holder from another source gets in, and the
 * oldest silent connection of all is closed for it (max_unauth_conns); the
 * others stay.  A token holder behind a flood's own address gets in too.
 * Before, the newcomer was refused while the silent ones stayed: a flood of
 * them locked every token holder out (first of all, one sharing the
 * flood's address).
 */
static void expect_evicted(int s, const char *cap)
{
    char text[CFX_PROTO_TEXT_MAX];
    int st = 0;
    cr_assert_eq(first_frame(s, &st, text, sizeof(text)), CFX_MSG_ERROR);
    cr_assert_eq(st, CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, cap) && strstr(text, "oldest"), "%s", text);
    cr_assert_geq(wait_closed(s, CALL_MS), 0, "the oldest was not closed");
    close(s);
}

static void expect_challenged(int s)
{
    char text[CFX_PROTO_TEXT_MAX];
    int st = 0;
    cr_assert_eq(first_frame(s, &st, text, sizeof(text)), CFX_MSG_CHALLENGE, "%s", text);
}

Test(coord_conns, silent_flood_evicts_oldest_and_token_holder_gets_in)
{
    int u[4];

    cfx__coord_stop(coord);
    caps.max_unauth_conns = 4;
    caps.max_unauth_per_ip = 2;
    start_coord();

    const char *src[4] = { "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3" };
    for (int i = 0; i < 4; i++) { /* in order: each is challenged before the next */
        u[i] = connect_from(src[i]);
        expect_challenged(u[i]);
    }
    /* a third from 127.0.0.2: the oldest of that address goes */
    int x = connect_from("127.0.0.2");
    expect_challenged(x);
    expect_evicted(u[0], "max_unauth_per_ip");
    int order[4] = { u[1], u[2], u[3], x }; /* oldest first */
    for (int i = 0; i < 4; i++)
        cr_assert(quiet_and_open(order[i]), "silent connection %d closed too", i);

    /* a token holder (127.0.0.1) while the cap is full: the oldest of all goes */
    struct cfx_ctl *n = open_node("holder", NULL);
    cr_assert_gt(cfx__ctl_node_id(n), 0);
    expect_evicted(order[0], "max_unauth_conns");
    for (int i = 1; i < 4; i++)
        cr_assert(quiet_and_open(order[i]), "silent connection %d closed too", i);

    /* the token holder authenticated, which freed its place: the next
     * newcomer fits, and the one after closes the next oldest */
    int y = connect_from("127.0.0.4");
    expect_challenged(y);
    for (int i = 1; i < 4; i++)
        cr_assert(quiet_and_open(order[i]), "silent connection %d closed with room left", i);
    int z = connect_from("127.0.0.4");
    expect_challenged(z);
    expect_evicted(order[1], "max_unauth_conns");
    cr_assert(quiet_and_open(order[2]) && quiet_and_open(order[3]) && quiet_and_open(y));

    /* two silent connections from the token holders' own address (the
     * flood's place is full there): a token holder from it still gets in,
     * and the older of the two goes */
    int f0 = connect_from("127.0.0.1");
    expect_challenged(f0);
    int f1 = connect_from("127.0.0.1");
    expect_challenged(f1);
    struct cfx_ctl *n2 = open_node("behind", NULL);
    cr_assert_gt(cfx__ctl_node_id(n2), 0);
    expect_evicted(f0, "max_unauth_per_ip");
    cr_assert(quiet_and_open(f1));

    /* the token holders were not touched */
    struct cfx_ctl_status cs;
    cr_assert_eq(cfx__ctl_status(n, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__ctl_status(n2, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cfx__ctl_close(n2);
    cfx__ctl_close(n);
    for (int i = 2; i < 4; i++)
        close(order[i]);
    close(f1);
    close(y);
    close(z);
}

/* A raw admin connection whose receive buffer is small, so that replies it
 * does not read pile up at the coordinator rather than in our kernel. */
static int raw_admin_small_rcvbuf(void)
{
    int s = raw_auth(), sz = 4096;
    cr_assert_eq(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)), 0);
    return s;
}

/* STATUS requests req0, req0 + 1, ... into @p buf, @p n of them; their bytes. */
static size_t status_burst(uint8_t *buf, size_t cap, uint64_t req0, int n)
{
    size_t off = 0, len;
    for (int i = 0; i < n; i++) {
        struct cfx_msg r = { .type = CFX_MSG_STATUS, .req_id = req0 + (uint64_t)i };
        cr_assert_eq(cfx__msg_encode(&r, buf + off, cap - off, &len), CFX_OK);
        off += len;
    }
    return off;
}

/*
 * max_buffered of 512 KiB: a connection that sends requests and never reads
 * their replies is closed once the coordinator holds more than that, and
 * it is the one closed (it holds the most), while another that left a few
 * replies unread, and a new client, are still served.  Before there was no
 * such budget: each connection could hold 64 MiB (max_conn_outq).  In
 * about one run in six the non-reader's sends stop going through first
 * (for 2 s), with the coordinator holding nothing for it and the
 * connection not paused: not understood yet (docs/SECURITY.md).  What is
 * checked then is what the budget is for: nothing held beyond it.
 */
Test(coord_conns, non_reader_closed_at_the_budget_others_served)
{
    static uint8_t req[64 << 10];

    cfx__coord_stop(coord);
    caps.max_buffered = 512u << 10;
    start_coord();

    int b = raw_auth();
    size_t blen = status_burst(req, sizeof(req), 1, 100);
    cr_assert_eq(send(b, req, blen, MSG_NOSIGNAL), (ssize_t)blen);

    int a = raw_admin_small_rcvbuf();
    size_t alen = status_burst(req, sizeof(req), 1000, 1000);
    uint64_t deadline = cfx__deadline_ns(CALL_MS);
    int closed = 0, blocked = 0;
    long sent = 0;
    while (!closed && cfx__now_ns() < deadline) {
        struct pollfd p = { .fd = a, .events = POLLOUT };
        if (poll(&p, 1, 2000) == 0) {
            blocked = 1; /* not read for 2 s: held, not growing */
            break;
        }
        if (p.revents & (POLLERR | POLLHUP)) {
            closed = 1;
            break;
        }
        ssize_t k = send(a, req, alen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            closed = 1;
        else if (k > 0)
            sent += k;
    }
    uint64_t held = __atomic_load_n(&coord->buffered, __ATOMIC_RELAXED);
    cr_log_info("the non-reader sent %ld request bytes before it was %s (the coordinator "
                "holds %llu bytes)", sent, closed ? "closed" : "no longer read",
                (unsigned long long)held);
    cr_assert(closed || (blocked && held <= caps.max_buffered),
              "a connection that never reads was neither closed at max_buffered nor held "
              "within it (%llu bytes held)", (unsigned long long)held);
    close(a);

    /* the other one: every reply it left, and more */
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    for (uint64_t i = 1; i <= 100; i++) {
        cr_assert_eq(raw_read_frame(b, buf, sizeof(buf), &m), CFX_OK, "reply %llu lost",
                     (unsigned long long)i);
        cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
        cr_assert_eq(m.req_id, i);
    }
    raw_status(b, 101);
    close(b);
    struct cfx_ctl *admin = open_admin();
    struct cfx_ctl_status cs;
    cr_assert_eq(cfx__ctl_status(admin, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cfx__ctl_close(admin);
}

/*
 * A connection that sends requests without reading the replies is not read
 * either, once more than COORD_OUTQ_PAUSE (1 MiB) of them are queued: its
 * sends stop going through.  When it reads again, every reply comes, in
 * order, and it was never closed, though its replies in all are many times
 * max_buffered (4 MiB here): the coordinator held only what fits while it
 * waited.  Before, every reply was queued at once, and a budget would have
 * closed it.
 */
Test(coord_conns, non_reader_is_not_read_until_it_reads)
{
    enum { BURST = 1000, MAXREQ = 400000 };
    static uint8_t req[64 << 10];

    cfx__coord_stop(coord);
    caps.max_buffered = 4u << 20;
    start_coord();

    /* its receive buffer left as it is: a small one (SO_RCVBUF 4096, as
     * for the budget test above) keeps the window it advertises at a few
     * KiB after it is raised, and replies then trickle at a few hundred a
     * second, a test of the kernel's window updates, not of ours */
    int a = raw_auth(), sz = 4096;
    cr_assert_eq(setsockopt(a, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)), 0);
    /* phase 1: send until the coordinator stops taking requests (its
     * buffers and ours fill, nothing drains them) */
    uint64_t next = 1, got = 1;
    size_t len = 0, off = 0;
    int stopped = 0;
    while (next <= MAXREQ) {
        if (off == len) {
            len = status_burst(req, sizeof(req), next, BURST);
            off = 0;
            next += BURST;
        }
        ssize_t k = send(a, req + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        cr_assert(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR),
                  "the coordinator closed a connection that only did not read: %s",
                  strerror(errno));
        /* nobody reads our buffer any more when nothing frees it in 2 s */
        struct pollfd p = { .fd = a, .events = POLLOUT };
        if (poll(&p, 1, 2000) == 0) {
            stopped = 1;
            break;
        }
    }
    cr_log_info("the coordinator stopped reading after about %llu requests",
                (unsigned long long)(next - BURST));
    cr_assert(stopped, "the coordinator read all %d requests of a connection that does not "
              "read its replies", MAXREQ);

    /* phase 2: read every reply (with room to read them at speed: many
     * frames per recv), sending the rest as the coordinator takes it; no
     * deadline but progress (a loaded machine reads slowly, not never) */
    sz = 4 << 20;
    cr_assert_eq(setsockopt(a, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz)), 0);
    uint64_t last = next - 1;
    static uint8_t rx[1 << 20];
    size_t have = 0;
    while (got <= last) {
        struct pollfd p = { .fd = a, .events = POLLIN | (off < len ? POLLOUT : 0) };
        cr_assert_gt(poll(&p, 1, CALL_MS), 0, "no reply %llu in %d ms",
                     (unsigned long long)got, CALL_MS);
        if ((p.revents & POLLOUT) && off < len) {
            ssize_t k = send(a, req + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0)
                off += (size_t)k;
        }
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t k = recv(a, rx + have, sizeof(rx) - have, MSG_DONTWAIT);
        cr_assert_gt(k, 0, "connection closed at reply %llu of %llu", (unsigned long long)got,
                     (unsigned long long)last);
        have += (size_t)k;
        size_t used = 0;
        for (;;) {
            struct cfx_msg_hdr h;
            if (have - used < CFX_PROTO_HDR_LEN)
                break;
            cr_assert_eq(cfx__msg_hdr_decode(rx + used, CFX_PROTO_HDR_LEN, &h), CFX_OK);
            size_t need = CFX_PROTO_HDR_LEN + h.payload_len;
            cr_assert_leq(need, sizeof(rx));
            if (have - used < need)
                break;
            struct cfx_msg m;
            cr_assert_eq(cfx__msg_decode(rx + used, need, &m), CFX_OK);
            cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
            cr_assert_eq(m.req_id, got, "reply %llu where %llu was due",
                         (unsigned long long)m.req_id, (unsigned long long)got);
            got++;
            used += need;
        }
        memmove(rx, rx + used, have - used);
        have -= used;
    }
    cr_assert_eq(got, last + 1, "%llu of %llu replies came", (unsigned long long)(got - 1),
                 (unsigned long long)last);
    raw_status(a, last + 1);
    close(a);
}

/*
 * A frame whose bytes come one at a time, each well within the stall
 * timeout of the last (a third of it), is closed: the frame must be whole
 * within the stall timeout of its first byte.  Before, the timeout counted
 * from the last byte, and a byte every few seconds held a 1 MiB buffer for
 * ever.
 */
Test(coord_conns, trickled_frame_is_closed_at_its_deadline)
{
    enum { PAYLOAD = 4096 };
    uint8_t h[CFX_PROTO_HDR_LEN], one = 0;
    int a = raw_auth();
    hdr_bytes(h, CFX_MSG_NODES, PAYLOAD);
    cr_assert_eq(send(a, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    int bytes = 0, closed = 0;
    uint64_t deadline = cfx__deadline_ns(CALL_MS);
    while (!closed && bytes < PAYLOAD && cfx__now_ns() < deadline) {
        struct pollfd p = { .fd = a, .events = POLLIN };
        if (poll(&p, 1, STALL_MS / 3) > 0) { /* the close, if it comes */
            char sink[64];
            ssize_t n = recv(a, sink, sizeof(sink), 0);
            closed = n == 0 || (n < 0 && errno == ECONNRESET);
            continue;
        }
        if (send(a, &one, 1, MSG_NOSIGNAL) != 1)
            closed = 1;
        else
            bytes++;
    }
    cr_log_info("closed after %d of %d payload bytes", bytes, PAYLOAD);
    cr_assert(closed, "a frame trickled one byte every %d ms was not closed", STALL_MS / 3);
    cr_assert_lt(bytes, PAYLOAD);
    close(a);
    /* the coordinator goes on */
    struct cfx_ctl *admin = open_admin();
    struct cfx_ctl_status cs;
    cr_assert_eq(cfx__ctl_status(admin, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cfx__ctl_close(admin);
}

/*
 * The input buffer grows as a frame's bytes come, not to the length its
 * header announces: eight connections announcing the largest frame (1 MiB)
 * and sending a hundred bytes of it hold no more than their first buffers,
 * so a 1 MiB max_buffered closes none of them (eight megabytes announced);
 * each is closed later by its frame's deadline.
 */
Test(coord_conns, announced_length_is_not_held_up_front)
{
    enum { N = 8 };
    static uint8_t b[1024], buf[1 << 16];
    int s[N];

    cfx__coord_stop(coord);
    caps.max_buffered = 1u << 20;
    start_coord();

    for (int i = 0; i < N; i++) {
        s[i] = raw_auth();
        /* a STATUS, then the start of the big frame, in one segment: the
         * STATUS reply shows the coordinator has read the header too */
        struct cfx_msg r = { .type = CFX_MSG_STATUS, .req_id = 7 };
        size_t len;
        cr_assert_eq(cfx__msg_encode(&r, b, sizeof(b), &len), CFX_OK);
        hdr_bytes(b + len, CFX_MSG_NODES, CFX_PROTO_MAX_PAYLOAD);
        len += CFX_PROTO_HDR_LEN + 100;
        cr_assert_eq(send(s[i], b, len, MSG_NOSIGNAL), (ssize_t)len);
        struct cfx_msg m;
        cr_assert_eq(raw_read_frame(s[i], buf, sizeof(buf), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
    }
    /* another client's round trip: every batch before it has been checked
     * against max_buffered */
    int t = raw_auth();
    raw_status(t, 1);
    close(t);
    for (int i = 0; i < N; i++)
        cr_assert(quiet_and_open(s[i]), "connection %d closed: its announced length was held", i);
    for (int i = 0; i < N; i++) {
        cr_assert_geq(wait_closed(s[i], CALL_MS), 0, "connection %d never closed", i);
        close(s[i]);
    }
}

/*
 * A member whose connection is paused (more than 1 MiB of replies queued)
 * is not read, its heartbeats included: while it takes its replies it is
 * alive.  A member that sent a burst of requests and then read its replies
 * slowly but steadily (32 KiB every 50 ms, heartbeating) was declared dead
 * at dead_after_ms (600 ms here) before; draining counts now, so it is
 * declared dead only when nothing drained for that long.
 */
Test(coord_conns, paused_member_that_reads_is_alive)
{
    static uint8_t req[4 << 20], sink[1 << 15];
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *watcher = open_node("watcher", &d);
    int s = raw_auth_role(CFX_CTL_ROLE_NODE);
    char text[256];
    int64_t id = raw_join(s, 0, 1, text, sizeof(text));
    cr_assert_gt(id, 0, "%s", text);
    /* 200000 requests: about 90 MB of replies, far over the pause mark */
    size_t n = status_burst(req, sizeof(req), 100, 200000), off = 0;
    uint64_t dl = cfx__deadline_ns(CALL_MS);
    while (off < n && cfx__now_ns() < dl) {
        ssize_t k = send(s, req + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        struct pollfd p = { .fd = s, .events = POLLOUT };
        poll(&p, 1, 10);
        (void)recv(s, sink, 4096, MSG_DONTWAIT); /* a little, so sends go on */
    }
    /* read slowly for ten times dead_after_ms */
    uint64_t t0 = cfx__now_ns(), dead = 0;
    long got = 0;
    while (!dead && ms_since(t0) < 10 * DEAD_MS) {
        struct cfx_msg hb = { .type = CFX_MSG_HEARTBEAT };
        raw_send(s, &hb);
        ssize_t k, tot = 0;
        while (tot < (ssize_t)sizeof(sink) &&
               (k = recv(s, sink, sizeof(sink) - (size_t)tot, MSG_DONTWAIT)) > 0)
            tot += k;
        got += tot;
        dead = wait_dead(&d, (uint32_t)id, 50);
    }
    cr_assert_eq(dead, 0, "a member that took %ld bytes of its replies in %llu ms was declared "
                 "dead", got, (unsigned long long)ms_since(t0));
    cr_assert_gt(got, 0);
    close(s);
    cfx__ctl_close(watcher);
}

/*
 * A listing request walks the coordinator's lists (members for NODES and
 * PS_LOADS, tasks for TASKS: up to max_nodes or tens of thousands of
 * tasks) and may answer in a few bytes (a cursor past the end), so its
 * reply never pauses the connection.  One connection's buffer of them
 * (16 KiB: 800) was served in one turn while every other connection
 * waited.  Now a listing ends its connection's turn, as a disk write does:
 * the rest of its frames wait for the next loop iteration.  Checked by the
 * turns the coordinator ended so (coord->turns_ended) and by every reply
 * coming, in order.
 */
Test(coord_conns, listings_end_their_connections_turn)
{
    enum { N = 1000 };
    static uint8_t out[(N + 1) * 64], in[1 << 16];
    size_t len = 0, n;
    int s = raw_auth();
    for (int i = 0; i <= N; i++) {
        struct cfx_msg m = { .type = i < N ? CFX_MSG_PS_LOADS : CFX_MSG_STATUS,
                             .req_id = 10 + (uint64_t)i };
        m.u.ps_cursor = UINT32_MAX; /* past every member: a walk, a few bytes back */
        cr_assert_eq(cfx__msg_encode(&m, out + len, sizeof(out) - len, &n), CFX_OK);
        len += n;
    }
    uint64_t before = __atomic_load_n(&coord->turns_ended, __ATOMIC_RELAXED);
    cr_assert_eq(send(s, out, len, MSG_NOSIGNAL), (ssize_t)len);
    for (int i = 0; i <= N; i++) {
        struct cfx_msg m;
        cr_assert_eq(raw_read_frame(s, in, sizeof(in), &m), CFX_OK);
        cr_assert_eq(m.req_id, 10 + (uint64_t)i);
        cr_assert_eq(m.type, i < N ? CFX_MSG_PS_LOADS_REPLY : CFX_MSG_STATUS_REPLY);
    }
    /* each listing with a frame after it in the buffer ended the turn (a
     * read that ends right after one leaves none after it: a few) */
    uint64_t ended = __atomic_load_n(&coord->turns_ended, __ATOMIC_RELAXED) - before;
    cr_assert_geq(ended, N / 2, "%llu of %d listings ended their turn",
                  (unsigned long long)ended, N);
    close(s);
}

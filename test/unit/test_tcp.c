/*
 * tcp transport specifics: address format, peer names, key checks against
 * forged frames, flow control, queue depth, close semantics.  The contract
 * behaviour shared with every transport is in test_transport.c.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/tcp/tcp.h"
#include "dataplane/transport.h"
#include "tcp_harness.h"
#include "testutil.h"

TestSuite(tcp, .init = setup, .fini = teardown, .timeout = 60);

/* --- tests ------------------------------------------------------------------- */

Test(tcp, addr_format)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t len;
    struct cfx_tp_iface *i;

    addr_of(B.iface, addr, &len);
    cr_assert_eq(len, strlen(addr) + 1, "len %zu must count the NUL", len);
    cr_assert_eq(strncmp(addr, "127.0.0.1:", 10), 0, "address %s", addr);
    cr_assert_gt(atoi(addr + 10), 0);

    size_t small = 5;
    cr_assert_eq(ops->iface_addr(B.iface, addr, &small), CFX_ERR_TRUNCATED);
    cr_assert_eq(small, len);

    struct cfx_tp_iface_params p = { .field_mask = CFX_TP_IFACE_PARAM_BIND_ADDR,
                                     .bind_addr = "not-an-address" };
    cr_assert_eq(ops->iface_open(&p, &i), CFX_ERR_INVALID);
    p.bind_addr = "192.0.2.1"; /* TEST-NET: not ours */
    cr_assert_eq(ops->iface_open(&p, &i), CFX_ERR_NO_DEVICE);
    p.bind_addr = "127.0.0.1";
    cr_assert_eq(ops->iface_open(&p, &i), CFX_OK);
    ops->iface_close(i);
}

Test(tcp, peer_names)
{
    char aaddr[CFX_TP_ADDR_MAX], baddr[CFX_TP_ADDR_MAX], want[CFX_TP_ADDR_MAX + 16];
    size_t len;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);

    addr_of(A.iface, aaddr, &len);
    addr_of(B.iface, baddr, &len);
    snprintf(want, sizeof(want), "node 2 (%s)", baddr);
    cr_assert_str_eq(ab->peer_name, want);
    snprintf(want, sizeof(want), "node 1 (%s)", aaddr);
    cr_assert_str_eq(ba->peer_name, want);
    cr_assert_eq(ba->peer_node, 1);

    /* Without node ids the name is the address alone. */
    struct cfx_tp_iface *anon;
    struct cfx_tp_ep *ep;
    cr_assert_eq(ops->iface_open(NULL, &anon), CFX_OK);
    cr_assert_eq(ops->ep_connect(anon, baddr, strlen(baddr), CFX_TCP_NODE_NONE, &ep), CFX_OK);
    cr_assert_str_eq(ep->peer_name, baddr);
    struct side an = { .iface = anon };
    struct ev *e;
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (!(e = find_ev(&B, CFX_TP_COMP_ACCEPT, NULL))) {
        cr_assert(cfx__now_ns() < end, "no ACCEPT for the anonymous peer");
        poll_side(&an, 64); /* its HELLO goes out from its own progress */
        poll_side(&B, 64);
    }
    char anon_addr[CFX_TP_ADDR_MAX];
    addr_of(anon, anon_addr, &len);
    cr_assert_str_eq(e->c.ep->peer_name, anon_addr);
    free(an.evs);
    ops->iface_close(anon);
}

Test(tcp, connect_refused_names_address)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t salen = sizeof(sa);
    char addr[32];
    struct cfx_tp_ep *ep;

    /* A port that was just ours and is now closed. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &salen), 0);
    close(fd);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(sa.sin_port));

    cr_assert_eq(ops->ep_connect(A.iface, addr, strlen(addr) + 1, 7, &ep), CFX_OK);
    struct ev *e = wait_ev(&A, CFX_TP_COMP_EP_ERROR, ep);
    cr_assert_eq(e->c.status, CFX_ERR_CONNECT);
    cr_assert(strstr(ep->peer_name, addr), "peer name '%s' lacks %s", ep->peer_name, addr);
    cr_assert_eq(ops->ep_send(ep, "x", 1, 0), CFX_ERR_CONNECT);
    ops->ep_close(ep);

    /* Malformed addresses are refused on the spot. */
    cr_assert_eq(ops->ep_connect(A.iface, "nonsense", 9, 7, &ep), CFX_ERR_INVALID);
    cr_assert_eq(ops->ep_connect(A.iface, "127.0.0.1:0", 12, 7, &ep), CFX_ERR_INVALID);
    cr_assert_eq(ops->ep_connect(A.iface, "127.0.0.1:99999", 16, 7, &ep), CFX_ERR_INVALID);
}

Test(tcp, queue_depth)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    reg(A.iface, &src, 4096, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0);

    /* Posted-but-unreported ops are bounded at CFX_TCP_TXQ_DEPTH. */
    for (int i = 0; i < CFX_TCP_TXQ_DEPTH; i++)
        cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 0, (uint32_t)i, (uint64_t)i), CFX_OK,
                     "post %d", i);
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 0, 0, 0), CFX_ERR_AGAIN);
    cr_assert_eq(ops->ep_send(ab, "x", 1, 0), CFX_ERR_AGAIN);
    /* Completions already queued: do not sleep. */
    cr_assert_eq(ops->iface_arm(A.iface), CFX_ERR_AGAIN);

    struct cfx_tp_completion c[8];
    cr_assert_eq(ops->poll(A.iface, c, 8), 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(c[i].wr_id, (uint64_t)i);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(ops->ep_send(ab, "y", 1, 1000 + (uint64_t)i), CFX_OK);
    cr_assert_eq(ops->ep_send(ab, "y", 1, 0), CFX_ERR_AGAIN);

    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (count_ev(&B, CFX_TP_COMP_WRITE_IMM, ba) < CFX_TCP_TXQ_DEPTH ||
           count_ev(&B, CFX_TP_COMP_RECV, ba) < 8) {
        cr_assert(cfx__now_ns() < end);
        poll_side(&A, 64);
        poll_side(&B, 64);
    }
    unreg(&src);
    unreg(&dst);
}

/* The receiver fails with PROTO; the writer hears why (or sees the reset). */
static void expect_proto_failure(struct cfx_tp_ep *ab, struct cfx_tp_ep *ba, struct region *dst)
{
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_PROTO);
    int st = wait_ev(&A, CFX_TP_COMP_EP_ERROR, ab)->c.status;
    cr_assert(st == CFX_ERR_PROTO || st == CFX_ERR_PEER_FAILED, "writer saw %s", cfx_errname(st));
    cr_assert_eq(ba->status, CFX_ERR_PROTO);
    cr_assert_null(find_ev(&B, CFX_TP_COMP_WRITE_IMM, NULL));
    for (int i = 0; i < 4096; i++)
        cr_assert_eq(dst->buf[i], 0xAA);
}

Test(tcp, write_refused_foreign_key)
{
    struct region src, dst, other;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    struct cfx_tp_iface *c = open_node(3);
    reg(A.iface, &src, 4096, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    reg(c, &other, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);

    /* A key of iface c sent to b: no live grant of b's has that key. */
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &other.rd, 0, 16, 1, 1), CFX_OK);
    expect_proto_failure(ab, ba, &dst);
    unreg(&other);
    ops->iface_close(c);
    unreg(&src);
    unreg(&dst);
}

Test(tcp, write_refused_read_only)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    reg(A.iface, &src, 4096, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_LOCAL, 0xAA); /* no REMOTE_WRITE */
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 16, 1, 1), CFX_OK);
    expect_proto_failure(ab, ba, &dst);
    unreg(&src);
    unreg(&dst);
}

Test(tcp, write_refused_out_of_bounds)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    reg(A.iface, &src, 8192, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 1, 4096, 1, 1), CFX_OK);
    expect_proto_failure(ab, ba, &dst);
    /* Sticky. */
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 1, 1, 1), ab->status);
    unreg(&src);
    unreg(&dst);
}

/* Forged frames: an offset that would overflow is caught before any byte lands. */
Test(tcp, forged_offset_overflow)
{
    struct region dst;
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    int fd = raw_connect(B.iface);
    raw_hello(fd, 5, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    cr_assert_eq(ba->peer_node, 5);
    cr_assert_str_eq(ba->peer_name, "node 5 (10.0.0.5:1234)");

    raw_write_hdr(fd, &dst.rd, UINT64_MAX - 5, 10, 1);
    raw_send(fd, "0123456789", 10);
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_PROTO);
    for (int i = 0; i < 4096; i++)
        cr_assert_eq(dst.buf[i], 0xAA);

    /* The ERROR frame reached the forger before the close. */
    struct cfx__tcp_hdr h;
    ssize_t n = recv(fd, &h, sizeof(h), MSG_WAITALL);
    cr_assert_eq(n, (ssize_t)sizeof(h));
    cr_assert_eq(h.type, CFX_TCP_FRAME_ERROR);
    cr_assert_eq((int32_t)le32toh(h.imm), CFX_ERR_PROTO);
    close(fd);
    unreg(&dst);
}

/* Strangers that do not say HELLO are dropped without a word to the user. */
Test(tcp, strangers_dropped)
{
    int fd1 = raw_connect(B.iface);
    raw_send(fd1, "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxx", 38);
    int fd2 = raw_connect(B.iface);
    close(fd2);
    int fd3 = raw_connect(B.iface);
    raw_hello(fd3, 6, CFX_TCP_VERSION + 1); /* wrong version */
    pump(100);
    cr_assert_eq(B.n, 0, "b reported %zu completions", B.n);
    char c;
    cr_assert_eq(recv(fd1, &c, 1, 0), 0, "junk connection not closed");
    cr_assert_eq(recv(fd3, &c, 1, 0), 0, "bad-version connection not closed");
    close(fd1);
    close(fd3);

    /* And the iface still works. */
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    cr_assert_eq(ops->ep_send(ab, "ok", 2, 1), CFX_OK);
    cr_assert_arr_eq(wait_ev(&B, CFX_TP_COMP_RECV, ba)->data, "ok", 2);
}

/* A stranger that connects and says nothing is dropped at the HELLO
 * deadline, without a word to the user; one that says half a header too. */
Test(tcp, silent_strangers_dropped, .timeout = 60)
{
    int fd1 = raw_connect(B.iface);
    int fd2 = raw_connect(B.iface);
    raw_send(fd2, "\x01\x00", 2); /* half a frame header, then silence */
    uint64_t t0 = cfx__now_ns();
    pump(CFX_TCP_HELLO_MS / 2);
    char c;
    cr_assert_eq(recv(fd1, &c, 1, MSG_DONTWAIT), -1, "dropped before the deadline");
    /* then both are closed: waited for as the event, however late it comes */
    uint64_t end = cfx__deadline_ns(CFX_TCP_HELLO_MS / 2 + WAIT_MS);
    bool closed1 = false, closed2 = false;
    while (!(closed1 && closed2) && cfx__now_ns() < end) {
        pump(10);
        closed1 = closed1 || recv(fd1, &c, 1, MSG_DONTWAIT) == 0;
        closed2 = closed2 || recv(fd2, &c, 1, MSG_DONTWAIT) == 0;
    }
    cr_assert(closed1, "silent connection not closed");
    cr_assert(closed2, "half-header connection not closed");
    cr_log_info("silent strangers dropped within %.1f s",
                (double)(cfx__now_ns() - t0) / 1e9);
    cr_assert_eq(B.n, 0, "b reported %zu completions", B.n);
    close(fd1);
    close(fd2);
}

/* A region deregistered while a write streams into it: the rest is dropped,
 * no WRITE_IMM, the connection carries on. */
Test(tcp, dereg_during_write)
{
    struct region dst;
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    int fd = raw_connect(B.iface);
    raw_hello(fd, 5, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;

    uint8_t payload[1000];
    memset(payload, 0x77, sizeof(payload));
    raw_write_hdr(fd, &dst.rd, 100, sizeof(payload), 9);
    raw_send(fd, payload, 500);
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (dst.buf[599] != 0x77) {
        cr_assert(cfx__now_ns() < end, "first half never landed");
        poll_side(&B, 64);
    }
    ops->mem_dereg(dst.mr);
    dst.mr = NULL;
    raw_send(fd, payload + 500, 500);
    raw_send_msg(fd, "after");
    cr_assert_arr_eq(wait_ev(&B, CFX_TP_COMP_RECV, ba)->data, "after", 5);
    cr_assert_null(find_ev(&B, CFX_TP_COMP_WRITE_IMM, NULL));
    cr_assert_eq(ba->status, CFX_OK);
    close(fd);
    unreg(&dst);
}

/* ep_close: the peer learns CLOSED (BYE); the closer hears nothing more. */
Test(tcp, close_says_bye)
{
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    cr_assert_eq(ops->ep_send(ab, "bye", 3, 1), CFX_OK);
    ops->ep_close(ab);
    cr_assert_arr_eq(wait_ev(&B, CFX_TP_COMP_RECV, ba)->data, "bye", 3);
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_CLOSED);
    pump(50);
    for (size_t i = 0; i < A.n; i++)
        cr_assert(A.evs[i].c.ep != ab || A.evs[i].c.type == CFX_TP_COMP_CONNECTED);
}

/* Closing with megabytes queued returns and reports nothing.  Nobody reads
 * b's side while a closes, so a close that waited for its 100 MiB to drain
 * would never return (the test's timeout would say so): no clock needed. */
Test(tcp, close_drops_queued_ops)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    reg(A.iface, &src, 1 << 20, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 1 << 20, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 1 << 20, 0, 0), CFX_OK);
    ops->ep_close(ab);
    pump(100);
    for (size_t i = 0; i < A.n; i++)
        cr_assert(A.evs[i].c.ep != ab || A.evs[i].c.type == CFX_TP_COMP_CONNECTED);
    int st = wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status;
    cr_assert(st == CFX_ERR_PEER_FAILED || st == CFX_ERR_CLOSED);
    unreg(&src);
    unreg(&dst);
}

/* RECV data of one poll() batch stays valid together; slow readers (max 1)
 * get every message in order while the transport throttles its socket reads. */
Test(tcp, recv_batches_and_flow_control)
{
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    enum { N = 300 };
    char msg[32];

    for (int i = 0; i < 10; i++) {
        snprintf(msg, sizeof(msg), "batch %d", i);
        cr_assert_eq(ops->ep_send(ab, msg, strlen(msg) + 1, (uint64_t)i), CFX_OK);
    }
    /* Wait until all ten (32-byte header + payload each) wait in b's socket,
     * so that one poll finds them together. */
    size_t want = 0;
    for (int i = 0; i < 10; i++)
        want += sizeof(struct cfx__tcp_hdr) + (size_t)snprintf(msg, sizeof(msg), "batch %d", i) + 1;
    int bfd = cfx__tcp_ep_of(ba)->fd, queued = 0;
    uint64_t qend = cfx__deadline_ns(WAIT_MS);
    for (;;) {
        cr_assert_eq(ioctl(bfd, FIONREAD, &queued), 0, "FIONREAD: %s", strerror(errno));
        if ((size_t)queued >= want)
            break;
        cr_assert(cfx__now_ns() < qend, "only %d of %zu bytes reached b's socket", queued, want);
        poll_side(&A, 64); /* in case a queued any of them */
    }
    struct cfx_tp_completion c[16];
    int n = ops->poll(B.iface, c, 16);
    cr_assert_eq(n, 10, "one poll returned %d", n);
    for (int i = 0; i < 10; i++) {
        snprintf(msg, sizeof(msg), "batch %d", i);
        cr_assert_eq(c[i].type, CFX_TP_COMP_RECV);
        cr_assert_str_eq(c[i].data, msg);
    }

    for (int i = 0; i < N; i++) {
        snprintf(msg, sizeof(msg), "msg %d", i);
        uint64_t end = cfx__deadline_ns(WAIT_MS);
        int rc;
        while ((rc = ops->ep_send(ab, msg, strlen(msg) + 1, (uint64_t)i)) == CFX_ERR_AGAIN) {
            cr_assert(cfx__now_ns() < end);
            poll_side(&A, 64);
        }
        cr_assert_eq(rc, CFX_OK);
    }
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (count_ev(&B, CFX_TP_COMP_RECV, ba) < N) {
        cr_assert(cfx__now_ns() < end);
        poll_side(&A, 64);
        poll_side(&B, 1);
    }
    int next = 0;
    for (size_t i = 0; i < B.n; i++) {
        if (B.evs[i].c.type != CFX_TP_COMP_RECV)
            continue;
        snprintf(msg, sizeof(msg), "msg %d", next++);
        cr_assert_str_eq((char *)B.evs[i].data, msg);
    }
}

Test(tcp, mem_reg_host_only)
{
    struct cfx_tp_mr *mr;
    uint8_t buf[64];
    struct cfx_tp_mem_desc md = {
        .addr = buf, .len = sizeof(buf), .memtype = CFX_MEMTYPE_CUDA, .file_fd = -1
    };
    cr_assert_eq(ops->mem_reg(A.iface, &md, CFX_TP_ACCESS_LOCAL, &mr), CFX_ERR_UNSUPPORTED);
    md.memtype = CFX_MEMTYPE_HOST;
    cr_assert_eq(ops->mem_reg(A.iface, &md, 0x80, &mr), CFX_ERR_INVALID);

    /* Many registrations: the table grows and keys stay distinct. */
    struct cfx_tp_mr *mrs[100];
    struct cfx_tp_rdesc rd[100];
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(ops->mem_reg(A.iface, &md, CFX_TP_ACCESS_REMOTE_WRITE, &mrs[i]), CFX_OK);
        cr_assert_eq(ops->mr_pack(mrs[i], &rd[i]), CFX_OK);
        for (int j = 0; j < i; j++)
            cr_assert(memcmp(rd[i].data, rd[j].data, rd[i].len), "keys %d and %d equal", i, j);
    }
    for (int i = 0; i < 100; i++)
        ops->mem_dereg(mrs[i]);
}

/* A write posted before CONNECTED waits and goes out once connected. */
Test(tcp, post_before_connected)
{
    struct region src, dst;
    char addr[CFX_TP_ADDR_MAX];
    size_t len;
    struct cfx_tp_ep *ab;

    reg(A.iface, &src, 4096, CFX_TP_ACCESS_LOCAL, 0);
    reg(B.iface, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cfx_test_fill(src.buf, 4096, 3);
    addr_of(B.iface, addr, &len);
    cr_assert_eq(ops->ep_connect(A.iface, addr, len, 2, &ab), CFX_OK);
    cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 4096, 33, 1), CFX_OK);
    cr_assert_eq(ops->ep_send(ab, "after", 5, 2), CFX_OK);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_WRITE_IMM, ba)->c.imm, 33);
    cr_assert_arr_eq(wait_ev(&B, CFX_TP_COMP_RECV, ba)->data, "after", 5);
    cr_assert_eq(cfx_test_check(dst.buf, 4096, 3), (size_t)-1);
    unreg(&src);
    unreg(&dst);
}

/* Deregistering a source with writes still queued fails that ep instead of
 * sending freed memory (run under ASan to see the difference). */
Test(tcp, dereg_source_with_queued_writes)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    reg(A.iface, &src, 1 << 20, CFX_TP_ACCESS_LOCAL, 1);
    reg(B.iface, &dst, 1 << 20, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    for (int i = 0; i < 32; i++)
        cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, 1 << 20, 0, (uint64_t)i), CFX_OK);
    ops->mem_dereg(src.mr);
    src.mr = NULL;
    free(src.buf);
    src.buf = NULL;

    cr_assert_eq(wait_ev(&A, CFX_TP_COMP_EP_ERROR, ab)->c.status, CFX_ERR_CANCELED);
    cr_assert_eq(count_ev(&A, CFX_TP_COMP_WRITE, ab), 32);
    size_t canceled = 0;
    for (size_t i = 0; i < A.n; i++)
        canceled += A.evs[i].c.type == CFX_TP_COMP_WRITE && A.evs[i].c.status == CFX_ERR_CANCELED;
    cr_assert_gt(canceled, 0);
    int st = wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status;
    cr_assert_neq(st, CFX_OK);
    unreg(&dst);
}

/* Sends and writes posted inside an ep_batch wait (at most
 * CFX_TCP_BATCH_MAX frames) and then leave together; every byte arrives, in
 * posting order, small and large (a write bigger than the receive buffer
 * lands straight in its region). */
Test(tcp, batch_holds_then_sends_in_order)
{
    struct region src, dst;
    struct cfx_tp_ep *ba, *ab = connect_ab(&ba);
    enum { NSEND = 40, BIG = 3 * CFX_TCP_RXBUF_SIZE + 5 };
    static uint8_t msg[NSEND][CFX_TP_SEND_MAX];
    static const size_t sizes[] = { 1, 7, 31, 32, 33, 1000, 4095, CFX_TP_SEND_MAX };

    reg(A.iface, &src, BIG, CFX_TP_ACCESS_LOCAL, 0);
    reg(B.iface, &dst, BIG, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cfx_test_fill(src.buf, BIG, 11);
    struct cfx__tcp_ep *a = cfx__tcp_ep_of(ab);

    cr_assert_eq(ops->ep_batch(ab, true), CFX_OK);
    for (int i = 0; i < NSEND; i++) {
        size_t len = sizes[i % 8];
        cfx_test_fill(msg[i], len, (unsigned)i + 100);
        cr_assert_eq(ops->ep_send(ab, msg[i], len, (uint64_t)i), CFX_OK);
        if (i == 10)
            cr_assert_eq(ops->ep_write(ab, src.mr, 0, &dst.rd, 0, BIG, 77, 1000), CFX_OK);
        if (i == 20) {
            /* 22 frames held, none handed to the kernel yet */
            cr_assert_eq(a->tx_held, 22);
            cr_assert_eq((a->txq_head + CFX_TCP_TXQ_SLOTS - a->txq_tail) % CFX_TCP_TXQ_SLOTS, 22);
            cr_assert_eq(count_ev(&A, CFX_TP_COMP_SEND, ab), 0);
        }
    }
    /* The bound: the 32nd frame sent the first 32, 9 wait. */
    cr_assert_eq(a->tx_held, NSEND + 1 - CFX_TCP_BATCH_MAX);
    cr_assert_eq(ops->ep_batch(ab, false), CFX_OK);
    cr_assert_eq(a->tx_held, 0);

    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (count_ev(&B, CFX_TP_COMP_RECV, ba) < NSEND || !count_ev(&B, CFX_TP_COMP_WRITE_IMM, ba) ||
           count_ev(&A, CFX_TP_COMP_SEND, ab) < NSEND || !count_ev(&A, CFX_TP_COMP_WRITE, ab)) {
        cr_assert(cfx__now_ns() < end, "timed out");
        pump(1);
    }
    int next = 0;
    for (size_t i = 0; i < B.n; i++) {
        struct ev *e = &B.evs[i];
        if (e->c.type == CFX_TP_COMP_WRITE_IMM) {
            cr_assert_eq(next, 11, "the write arrived after %d sends", next);
            cr_assert_eq(e->c.imm, 77);
            cr_assert_eq(e->c.len, BIG);
        }
        if (e->c.type != CFX_TP_COMP_RECV)
            continue;
        cr_assert_eq(e->c.len, sizes[next % 8]);
        cr_assert_eq(cfx_test_check(e->data, e->c.len, (unsigned)next + 100), (size_t)-1,
                     "message %d differs", next);
        next++;
    }
    cr_assert_eq(cfx_test_check(dst.buf, BIG, 11), (size_t)-1);
    unreg(&src);
    unreg(&dst);
}

/* Frames split at every kind of place by the sender's writes (inside a
 * header, between header and payload, inside a payload, several frames in
 * one segment) are all parsed, byte for byte, and the key and bounds checks
 * still apply to a header that arrives after buffered frames. */
Test(tcp, recv_parses_frames_split_anywhere)
{
    struct region dst;
    enum { WLEN = 2 * CFX_TCP_RXBUF_SIZE + 3, NMSG = 24 };
    static uint8_t stream[NMSG * (32 + 600) + 32 + WLEN + 64];
    size_t len = 0;

    reg(B.iface, &dst, WLEN + 16, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    int fd = raw_connect(B.iface);
    raw_hello(fd, 9, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;

    /* NMSG sends of 1..576 bytes, then a write of WLEN bytes at offset 16. */
    for (int i = 0; i < NMSG; i++) {
        uint32_t plen = (uint32_t)(1 + i * 25);
        struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_SEND, .len = htole32(plen) };
        memcpy(stream + len, &h, sizeof(h));
        len += sizeof(h);
        cfx_test_fill(stream + len, plen, (unsigned)i + 1);
        len += plen;
    }
    struct cfx__tcp_rkey k;
    memcpy(&k, dst.rd.data, sizeof(k));
    struct cfx__tcp_hdr w = { .type = CFX_TCP_FRAME_WRITE,
                              .len = htole32(WLEN),
                              .imm = htole32(5),
                              .key_lo = k.key_lo,
                              .key_idx = k.idx,
                              .key_hi = k.key_hi,
                              .off = htole64(16) };
    memcpy(stream + len, &w, sizeof(w));
    len += sizeof(w);
    cfx_test_fill(stream + len, WLEN, 99);
    len += WLEN;

    /* Odd-sized pieces, polling between some of them. */
    static const size_t piece[] = { 1, 5, 26, 31, 33, 64, 7, 500, 3, 1024, 17, 4096 };
    for (size_t off = 0, j = 0; off < len; j++) {
        size_t n = CFX_MIN(piece[j % 12], len - off);
        raw_send(fd, stream + off, n);
        off += n;
        if (j % 3 == 0)
            poll_side(&B, 64);
    }
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_WRITE_IMM, ba)->c.imm, 5);
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_RECV, ba), NMSG);
    int next = 0;
    for (size_t i = 0; i < B.n; i++) {
        struct ev *e = &B.evs[i];
        if (e->c.type != CFX_TP_COMP_RECV)
            continue;
        cr_assert_eq(e->c.len, (uint32_t)(1 + next * 25));
        cr_assert_eq(cfx_test_check(e->data, e->c.len, (unsigned)next + 1), (size_t)-1,
                     "message %d differs", next);
        next++;
    }
    cr_assert_eq(cfx_test_check(dst.buf + 16, WLEN, 99), (size_t)-1);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(dst.buf[i], 0, "byte %d before the write's offset changed", i);

    /* A message and an out-of-bounds write in one segment: the message is
     * delivered, the write refused, the connection failed (CFX_ERR_PROTO). */
    uint8_t seg[2 * 32 + 4];
    struct cfx__tcp_hdr s = { .type = CFX_TCP_FRAME_SEND, .len = htole32(4) };
    memcpy(seg, &s, 32);
    memcpy(seg + 32, "last", 4);
    w.len = htole32(32);
    w.off = htole64(WLEN);
    memcpy(seg + 36, &w, 32);
    raw_send(fd, seg, sizeof(seg));
    cr_assert_eq(wait_ev(&B, CFX_TP_COMP_EP_ERROR, ba)->c.status, CFX_ERR_PROTO);
    struct ev *last = NULL;
    for (size_t i = 0; i < B.n; i++)
        if (B.evs[i].c.type == CFX_TP_COMP_RECV)
            last = &B.evs[i];
    cr_assert_eq(count_ev(&B, CFX_TP_COMP_RECV, ba), NMSG + 1);
    cr_assert_arr_eq(last->data, "last", 4);
    close(fd);
    unreg(&dst);
}

/* A frame (or a buffer's worth of frames) right behind a large write's
 * payload comes in the same read as the payload's end (into the receive
 * buffer, after the payload went straight to its destination): the next
 * write, the messages behind it, all byte for byte and in order, whether
 * what follows fills the buffer or not. */
Test(tcp, frames_behind_a_direct_payload)
{
    struct region dst;
    enum { W1 = 2 * CFX_TCP_RXBUF_SIZE + 3, W2 = 3 * CFX_TCP_RXBUF_SIZE, NMSG = 40, MLEN = 600 };
    static uint8_t stream[2 * 32 + W1 + W2 + (NMSG + 1) * (32 + MLEN)];
    size_t len = 0;

    reg(B.iface, &dst, W1 + W2, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    int fd = raw_connect(B.iface);
    raw_hello(fd, 9, CFX_TCP_VERSION);
    struct cfx_tp_ep *ba = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    struct cfx__tcp_rkey k;
    memcpy(&k, dst.rd.data, sizeof(k));

    /* W1, one message, W2, then NMSG messages (more than a buffer's worth) */
    for (int part = 0; part < 2; part++) {
        uint32_t wlen = part ? W2 : W1;
        struct cfx__tcp_hdr w = { .type = CFX_TCP_FRAME_WRITE, .len = htole32(wlen),
                                  .imm = htole32((uint32_t)part + 1), .key_lo = k.key_lo,
                                  .key_idx = k.idx, .key_hi = k.key_hi,
                                  .off = htole64(part ? W1 : 0) };
        memcpy(stream + len, &w, sizeof(w));
        len += sizeof(w);
        cfx_test_fill(stream + len, wlen, (unsigned)part + 50);
        len += wlen;
        for (int i = 0; i < (part ? NMSG : 1); i++) {
            struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_SEND, .len = htole32(MLEN) };
            memcpy(stream + len, &h, sizeof(h));
            len += sizeof(h);
            cfx_test_fill(stream + len, MLEN, (unsigned)(part * 100 + i));
            len += MLEN;
        }
    }
    raw_send(fd, stream, len); /* all of it in the socket before B reads */

    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (count_ev(&B, CFX_TP_COMP_RECV, ba) < NMSG + 1 ||
           count_ev(&B, CFX_TP_COMP_WRITE_IMM, ba) < 2) {
        cr_assert(cfx__now_ns() < end, "timed out");
        poll_side(&B, 64);
    }
    /* in stream order: W1, message 0, W2, messages 100.. */
    int n = 0;
    for (size_t i = 0; i < B.n; i++) {
        struct ev *e = &B.evs[i];
        if (e->c.type == CFX_TP_COMP_WRITE_IMM) {
            cr_assert_eq(e->c.imm, n == 0 ? 1u : 2u, "write %u after %d messages", e->c.imm, n);
            cr_assert_eq(e->c.len, e->c.imm == 1 ? W1 : W2);
        } else if (e->c.type == CFX_TP_COMP_RECV) {
            unsigned seed = n == 0 ? 0 : 100 + (unsigned)(n - 1);
            cr_assert_eq(e->c.len, MLEN);
            cr_assert_eq(cfx_test_check(e->data, MLEN, seed), (size_t)-1, "message %d differs",
                         n);
            n++;
        }
    }
    cr_assert_eq(n, NMSG + 1);
    cr_assert_eq(cfx_test_check(dst.buf, W1, 50), (size_t)-1, "write 1 differs");
    cr_assert_eq(cfx_test_check(dst.buf + W1, W2, 51), (size_t)-1, "write 2 differs");
    close(fd);
    unreg(&dst);
}

/*
 * A peer that dies fails every ep to it (here two, as the engine has one
 * each way): the first failure is a warning naming the node, the second
 * (same peer, same iface, within 2 s) is logged at DEBUG only; both eps
 * report CFX_ERR_PEER_FAILED.
 */
Test(tcp, dead_peer_warned_once_per_iface)
{
    struct cfx_tp_ep *ba1, *ba2;
    struct cfx_tp_ep *ab1 = connect_ab(&ba1), *ab2 = connect_ab(&ba2);
    char path[] = "/tmp/cfx-test-tcpfail-XXXXXX";
    int fd;
    int saved = cfx_test_stderr_to(path, &fd);
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_DEBUG;

    /* B "dies": its sockets end without a goodbye */
    shutdown(((struct cfx__tcp_ep *)ba1)->fd, SHUT_RDWR);
    shutdown(((struct cfx__tcp_ep *)ba2)->fd, SHUT_RDWR);
    int st1 = wait_ev(&A, CFX_TP_COMP_EP_ERROR, ab1)->c.status;
    int st2 = wait_ev(&A, CFX_TP_COMP_EP_ERROR, ab2)->c.status;

    cfx__log_level = level;
    cfx_test_stderr_back(saved);
    char log[8192];
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, log, sizeof(log) - 1);
    close(fd);
    unlink(path);
    log[n > 0 ? n : 0] = '\0';
    cr_assert_eq(st1, CFX_ERR_PEER_FAILED, "%s", cfx_errname(st1));
    cr_assert_eq(st2, CFX_ERR_PEER_FAILED, "%s", cfx_errname(st2));
    int warn = 0, debug = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "ep to node 2 ("))
            continue;
        warn += strstr(line, " WARN ") != NULL;
        debug += strstr(line, " DEBUG ") != NULL;
    }
    cr_assert_eq(warn, 1, "%d warnings for the dead peer (want 1)", warn);
    cr_assert_eq(debug, 1, "%d DEBUG lines for its second ep (want 1)", debug);
}

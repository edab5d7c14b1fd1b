/*
 * verbs transport specifics (the shared contract is test_transport.c).
 *
 * On a host without RDMA these check the "no device" behaviour: iface_open
 * fails with CFX_ERR_NO_DEVICE and a message a user can act on, and the
 * device listing says so.  Tests that need a device skip with the reason;
 * in the Soft-RoCE guest they run for real.  Built without verbs, every
 * test skips.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dataplane/common/util.h"
#include "dataplane/transport.h"
#include "testutil.h"

/* Only present in libconflux when the verbs transport is built; weak so
 * this file links either way (the table entry pulls the object in). */
int cfx__verbs_devices_print(FILE *out, int json) __attribute__((weak));
uint32_t cfx__verbs_rcache_invalidate(struct cfx_tp_iface *iface, const void *addr,
                                      size_t len) __attribute__((weak));
uint32_t cfx__verbs_ep_max_inline(struct cfx_tp_ep *ep) __attribute__((weak));

static const struct cfx_transport_ops *verbs_or_skip(void)
{
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    if (!ops)
        cr_skip_test("built without the verbs transport");
    return ops;
}

static struct cfx_tp_iface *open_or_skip(const struct cfx_transport_ops *ops, uint32_t node)
{
    struct cfx_tp_iface_params p = { .field_mask = CFX_TP_IFACE_PARAM_NODE_ID, .node_id = node };
    struct cfx_tp_iface *iface = NULL;
    int rc = ops->iface_open(&p, &iface);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_skip_test("no RDMA device: %s", cfx_last_error());
    cr_assert_eq(rc, CFX_OK, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    return iface;
}

TestSuite(verbs);

Test(verbs, no_device_is_reported_cleanly)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = NULL;
    int rc = ops->iface_open(NULL, &iface);
    if (rc == CFX_OK) {
        ops->iface_close(iface);
        cr_skip_test("an RDMA device is present: nothing to check here");
    }
    if (rc == CFX_ERR_MEMLOCK) {
        cr_assert(strstr(cfx_last_error(), "ulimit -l"), "%s", cfx_last_error());
        cr_skip_test("locked-memory limit too low here: %s", cfx_last_error());
    }
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(iface);
    cr_assert(strstr(cfx_last_error(), "RDMA"), "message: %s", cfx_last_error());
}

Test(verbs, devices_listing)
{
    verbs_or_skip();
    cr_assert_not_null(cfx__verbs_devices_print);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int rc = cfx__verbs_devices_print(f, 0);
    fclose(f);
    if (rc == CFX_ERR_NO_DEVICE) {
        cr_assert(strstr(buf, "no RDMA devices found: "), "text: %s", buf);
    } else {
        cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
        cr_assert(strstr(buf, "hca_id:"), "text: %s", buf);
        cr_assert(strstr(buf, "active_mtu:"), "text: %s", buf);
    }
    free(buf);

    f = open_memstream(&buf, &len);
    int rc2 = cfx__verbs_devices_print(f, 1);
    fclose(f);
    cr_assert_eq(rc2, rc);
    cr_assert_eq(buf[0], '{', "json: %s", buf);
    cr_assert(strstr(buf, "\"devices\": ["), "json: %s", buf);
    /* Balanced braces and brackets outside strings: a cheap validity check. */
    int depth = 0;
    bool in_str = false;
    for (const char *p = buf; *p; p++) {
        if (in_str) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                in_str = false;
            continue;
        }
        if (*p == '"')
            in_str = true;
        else if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            cr_assert_geq(--depth, 0, "json: %s", buf);
    }
    cr_assert_eq(depth, 0, "json: %s", buf);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_assert(strstr(buf, "\"error\": \"no RDMA devices found: "), "json: %s", buf);
    free(buf);
    cr_assert_eq(cfx__verbs_devices_print(NULL, 0), CFX_ERR_INVALID);
}

Test(verbs, iface_basics)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = open_or_skip(ops, 7);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);

    cr_assert_eq(ops->iface_addr(iface, addr, &len), CFX_OK);
    cr_assert_eq(strlen(addr) + 1, len);
    const char *hp = strncmp(addr, "oob:", 4) ? addr : addr + 4;
    cr_assert(strchr(hp, ':'), "address '%s' is IP:PORT", addr);
    cr_assert_geq(ops->iface_fd(iface), 0);
    int rc;
    for (int i = 0; i < 10 && (rc = ops->iface_arm(iface)) == CFX_ERR_AGAIN; i++)
        ops->poll(iface, NULL, 0);
    cr_assert_eq(rc, CFX_OK);

    /* Registration and descriptor. */
    size_t sz = 3 * 4096 + 100;
    uint8_t *buf = aligned_alloc(4096, 4 * 4096);
    struct cfx_tp_mem_desc md = { .addr = buf + 100, .len = sz - 100,
                                  .memtype = CFX_MEMTYPE_HOST, .file_fd = -1 };
    struct cfx_tp_mr *a, *b;
    struct cfx_tp_rdesc rd;
    cr_assert_eq(ops->mem_reg(iface, &md, CFX_TP_ACCESS_REMOTE_WRITE | CFX_TP_ACCESS_LOCAL, &a),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(ops->mem_reg(iface, &md, CFX_TP_ACCESS_LOCAL, &b), CFX_OK);
    cr_assert_eq(ops->mr_pack(a, &rd), CFX_OK);
    cr_assert(rd.len > 0 && rd.len <= CFX_TP_RDESC_MAX);
    cr_assert_eq(rd.data[0], 'V');
    ops->mem_dereg(b);
    ops->mem_dereg(a);
    cr_assert_eq(cfx__verbs_rcache_invalidate(iface, buf, 4 * 4096), 0,
                 "user memory is not cached after its last dereg");
    free(buf);
    ops->iface_close(iface);
}

Test(verbs, invalidate_ignores_other_transports)
{
    verbs_or_skip();
    const struct cfx_transport_ops *tcp = cfx__transport_find("tcp");
    struct cfx_tp_iface *iface;
    cr_assert_eq(tcp->iface_open(NULL, &iface), CFX_OK);
    cr_assert_eq(cfx__verbs_rcache_invalidate(iface, &iface, 64), 0);
    cr_assert_eq(cfx__verbs_rcache_invalidate(NULL, &iface, 64), 0);
    tcp->iface_close(iface);
}

Test(verbs, connect_mode_mismatch_is_refused)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct cfx_tp_iface *iface = open_or_skip(ops, 1);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);
    cr_assert_eq(ops->iface_addr(iface, addr, &len), CFX_OK);
    char other[CFX_TP_ADDR_MAX + 8];
    if (!strncmp(addr, "oob:", 4))
        snprintf(other, sizeof(other), "%s", addr + 4);
    else
        snprintf(other, sizeof(other), "oob:%s", addr);
    struct cfx_tp_ep *ep = NULL;
    int rc = ops->ep_connect(iface, other, strlen(other) + 1, 2, &ep);
    cr_assert_eq(rc, CFX_ERR_CONNECT, "ep_connect: %s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "CFX_IB_CONNECT"), "%s", cfx_last_error());
    ops->iface_close(iface);
}

/* --- inline boundary ---------------------------------------------------------- */

#define IL_WAIT_MS 60000 /* against hangs only: TCG guests are slow */
#define IL_ROUNDS  40    /* messages per size and direction: more than the credits */

struct il_side {
    struct cfx_tp_iface *iface;
    uint8_t (*msg)[CFX_TP_SEND_MAX]; /* RECV copies, in arrival order */
    uint32_t *len;
    size_t nrecv, nsend, nwrite, nimm;
    int32_t bad_status;
};

static void il_poll(const struct cfx_transport_ops *ops, struct il_side *s, size_t cap)
{
    struct cfx_tp_completion c[32];
    int n = ops->poll(s->iface, c, 32);
    cr_assert_geq(n, 0, "poll: %s", cfx_errname(n));
    for (int i = 0; i < n; i++) {
        if (c[i].status != CFX_OK && !s->bad_status)
            s->bad_status = c[i].status;
        switch (c[i].type) {
        case CFX_TP_COMP_RECV:
            cr_assert_lt(s->nrecv, cap);
            s->len[s->nrecv] = c[i].len;
            memcpy(s->msg[s->nrecv++], c[i].data, c[i].len);
            break;
        case CFX_TP_COMP_SEND: s->nsend++; break;
        case CFX_TP_COMP_WRITE: s->nwrite++; break;
        case CFX_TP_COMP_WRITE_IMM: s->nimm++; break;
        case CFX_TP_COMP_EP_ERROR: cr_assert_fail("EP_ERROR %s", cfx_errname(c[i].status)); break;
        default: break;
        }
    }
}

/* Sends and writes of max_inline - 1, max_inline and max_inline + 1 bytes
 * (inline, inline, through the send buffer / registered memory), more of
 * them than there are credits, both ways: every byte arrives, in order;
 * bytes around a written range stay as they were. */
Test(verbs, inline_boundary_every_byte, .timeout = 240)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    struct il_side A = { .iface = open_or_skip(ops, 1) }, B = { .iface = open_or_skip(ops, 2) };
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    struct cfx_tp_ep *ab, *ba = NULL;
    enum { N = 3 * IL_ROUNDS };

    cr_assert_not_null(cfx__verbs_ep_max_inline);
    cr_assert_eq(ops->iface_addr(B.iface, addr, &alen), CFX_OK);
    cr_assert_eq(ops->ep_connect(A.iface, addr, alen, 2, &ab), CFX_OK, "%s", cfx_last_error());
    struct il_side *sides[2] = { &A, &B };
    for (int i = 0; i < 2; i++) {
        sides[i]->msg = calloc(N, CFX_TP_SEND_MAX);
        sides[i]->len = calloc(N, sizeof(uint32_t));
    }
    /* Connected on both sides: A's CONNECTED and B's ACCEPT. */
    uint64_t end = cfx__deadline_ns(IL_WAIT_MS);
    bool conn = false;
    while (!conn || !ba) {
        cr_assert(cfx__now_ns() < end, "no connection");
        struct cfx_tp_completion c[8];
        int n = ops->poll(A.iface, c, 8);
        for (int i = 0; i < n; i++)
            if (c[i].type == CFX_TP_COMP_CONNECTED) {
                cr_assert_eq(c[i].status, CFX_OK);
                conn = true;
            }
        n = ops->poll(B.iface, c, 8);
        for (int i = 0; i < n; i++)
            if (c[i].type == CFX_TP_COMP_ACCEPT)
                ba = c[i].ep;
    }
    uint32_t mi = cfx__verbs_ep_max_inline(ab);
    cr_assert_gt(mi, 1, "the QP took no inline data (Soft-RoCE supports it)");
    cr_assert_lt(mi + 1, CFX_TP_SEND_MAX);
    cr_assert_eq(cfx__verbs_ep_max_inline(ba), mi);
    cr_log_info("max_inline %u: sizes %u, %u, %u", mi, mi - 1, mi, mi + 1);
    const uint32_t sizes[3] = { mi - 1, mi, mi + 1 };

    /* Sends, both ways, interleaved. */
    uint8_t buf[CFX_TP_SEND_MAX];
    struct cfx_tp_ep *eps[2] = { ab, ba };
    for (int i = 0; i < N; i++) {
        for (int d = 0; d < 2; d++) {
            cfx_test_fill(buf, sizes[i % 3], 1000 * (uint64_t)d + (uint64_t)i);
            int rc;
            while ((rc = ops->ep_send(eps[d], buf, sizes[i % 3], (uint64_t)i)) == CFX_ERR_AGAIN) {
                cr_assert(cfx__now_ns() < end, "send queue stayed full");
                il_poll(ops, &A, N);
                il_poll(ops, &B, N);
            }
            cr_assert_eq(rc, CFX_OK, "ep_send of %u bytes: %s", sizes[i % 3], cfx_errname(rc));
            memset(buf, 0, sizeof(buf)); /* copied (or inlined) before ep_send returned */
        }
    }
    end = cfx__deadline_ns(IL_WAIT_MS);
    while (A.nrecv < N || B.nrecv < N || A.nsend < N || B.nsend < N) {
        cr_assert(cfx__now_ns() < end, "A got %zu, B got %zu of %d", A.nrecv, B.nrecv, N);
        il_poll(ops, &A, N);
        il_poll(ops, &B, N);
    }
    cr_assert_eq(A.bad_status, CFX_OK, "%s", cfx_errname(A.bad_status));
    cr_assert_eq(B.bad_status, CFX_OK, "%s", cfx_errname(B.bad_status));
    for (int d = 0; d < 2; d++) {
        struct il_side *r = sides[!d];
        for (int i = 0; i < N; i++) {
            cr_assert_eq(r->len[i], sizes[i % 3], "message %d: %u bytes, sent %u", i, r->len[i],
                         sizes[i % 3]);
            size_t at = cfx_test_check(r->msg[i], r->len[i], 1000 * (uint64_t)d + (uint64_t)i);
            cr_assert_eq(at, (size_t)-1, "message %d of %u bytes differs at byte %zu", i, r->len[i],
                         at);
        }
    }

    /* Writes A -> B of the same sizes into a region with guard bytes: B's
     * QP takes them once authorized (the engine's handshake would). */
    cr_assert_eq(ops->ep_authorize(ba), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(ops->ep_authorize(ab), CFX_OK, "%s", cfx_last_error());
    enum { GUARD = 64 };
    size_t span = GUARD + (size_t)mi + 1 + GUARD;
    uint8_t *src = aligned_alloc(4096, 4096 * 4), *dst = aligned_alloc(4096, 4096 * 4);
    cr_assert_leq(span, 4096 * 4);
    struct cfx_tp_mem_desc ms = {
        .addr = src, .len = 4096 * 4, .memtype = CFX_MEMTYPE_HOST, .file_fd = -1
    };
    struct cfx_tp_mem_desc md = ms;
    md.addr = dst;
    struct cfx_tp_mr *smr, *dmr;
    struct cfx_tp_rdesc rd;
    cr_assert_eq(ops->mem_reg(A.iface, &ms, CFX_TP_ACCESS_LOCAL, &smr), CFX_OK);
    cr_assert_eq(ops->mem_reg(B.iface, &md, CFX_TP_ACCESS_REMOTE_WRITE | CFX_TP_ACCESS_LOCAL, &dmr),
                 CFX_OK);
    cr_assert_eq(ops->mr_pack(dmr, &rd), CFX_OK);
    for (int k = 0; k < 3; k++) {
        uint32_t len = sizes[k];
        memset(dst, 0xee, span);
        cfx_test_fill(src, len, 77 + (uint64_t)k);
        size_t w0 = A.nwrite, i0 = B.nimm;
        cr_assert_eq(ops->ep_write(ab, smr, 0, &rd, GUARD, len, 500 + (uint32_t)k, 9), CFX_OK);
        end = cfx__deadline_ns(IL_WAIT_MS);
        while (A.nwrite == w0 || B.nimm == i0) {
            cr_assert(cfx__now_ns() < end, "write of %u bytes did not complete", len);
            il_poll(ops, &A, N);
            il_poll(ops, &B, N);
        }
        size_t at = cfx_test_check(dst + GUARD, len, 77 + (uint64_t)k);
        cr_assert_eq(at, (size_t)-1, "write of %u bytes differs at byte %zu", len, at);
        for (size_t j = 0; j < span; j++)
            if (j < GUARD || j >= GUARD + len)
                cr_assert_eq(dst[j], 0xee, "byte %zu outside a write of %u bytes changed", j, len);
    }
    cr_assert_eq(A.bad_status, CFX_OK, "%s", cfx_errname(A.bad_status));

    ops->mem_dereg(smr);
    ops->mem_dereg(dmr);
    free(src);
    free(dst);
    ops->ep_close(ab);
    ops->ep_close(ba);
    ops->iface_close(A.iface);
    ops->iface_close(B.iface);
    for (int i = 0; i < 2; i++) {
        free(sides[i]->msg);
        free(sides[i]->len);
    }
}

/* --- out-of-band strangers ------------------------------------------------------ */

#define OOB_ACCEPT_MS "1000"

/* A TCP connection to the oob listener at "oob:IP:PORT". */
static int oob_raw_connect(const char *addr)
{
    char ip[64];
    unsigned port;
    cr_assert_eq(sscanf(addr, "oob:%63[^:]:%u", ip, &port), 2, "address '%s'", addr);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    cr_assert_eq(inet_pton(AF_INET, ip, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect to %s", addr);
    return fd;
}

/* A peer that does the exchange connects to @p b at @p addr; both ifaces
 * are closed after. */
static void real_peer_connects(const struct cfx_transport_ops *ops, struct cfx_tp_iface *b,
                               const char *addr, size_t len)
{
    struct cfx_tp_iface *a = open_or_skip(ops, 1);
    struct cfx_tp_ep *ab, *ba = NULL;
    bool conn = false;
    cr_assert_eq(ops->ep_connect(a, addr, len, 2, &ab), CFX_OK, "%s", cfx_last_error());
    uint64_t end = cfx__deadline_ns(IL_WAIT_MS);
    while (!conn || !ba) {
        cr_assert(cfx__now_ns() < end, "no connection");
        struct cfx_tp_completion comp[8];
        int n = ops->poll(a, comp, 8);
        for (int i = 0; i < n; i++) {
            cr_assert_eq(comp[i].type, CFX_TP_COMP_CONNECTED, "a: completion type %d (%s)",
                         comp[i].type, cfx_errname(comp[i].status));
            conn = true;
        }
        n = ops->poll(b, comp, 8);
        for (int i = 0; i < n; i++) {
            cr_assert_eq(comp[i].type, CFX_TP_COMP_ACCEPT, "b: completion type %d",
                         comp[i].type);
            ba = comp[i].ep;
        }
    }
    ops->ep_close(ab);
    ops->ep_close(ba);
    ops->iface_close(a);
    ops->iface_close(b);
}

/* Anyone may connect to the oob port, and each accepted socket holds an
 * endpoint (registered buffers, CQ entries): one that stays silent, or
 * stops halfway through the exchange, is closed once CFX_IB_OOB_ACCEPT_MS
 * ran out, and nothing is reported; a real peer still connects. */
Test(verbs, oob_silent_stranger_dropped, .timeout = 120)
{
    const struct cfx_transport_ops *ops = verbs_or_skip();
    setenv("CFX_IB_CONNECT", "oob", 1);
    setenv("CFX_IB_OOB_ACCEPT_MS", OOB_ACCEPT_MS, 1);
    struct cfx_tp_iface *b = open_or_skip(ops, 2);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);
    cr_assert_eq(ops->iface_addr(b, addr, &len), CFX_OK);

    int fd1 = oob_raw_connect(addr);
    int fd2 = oob_raw_connect(addr);
    static const uint8_t half[10] = { 0x56, 0x58, 0x46, 0x43, 1, 0 }; /* magic, version */
    cr_assert_eq(send(fd2, half, sizeof(half), 0), (ssize_t)sizeof(half));
    uint64_t end = cfx__deadline_ns(IL_WAIT_MS);
    bool closed1 = false, closed2 = false;
    size_t reported = 0;
    char c;
    while (!(closed1 && closed2)) {
        cr_assert(cfx__now_ns() < end, "stranger not dropped: silent %s, half an exchange %s",
                  closed1 ? "closed" : "open", closed2 ? "closed" : "open");
        struct cfx_tp_completion comp[8];
        int n = ops->poll(b, comp, 8);
        cr_assert_geq(n, 0, "poll: %s", cfx_errname(n));
        reported += (size_t)n;
        closed1 = closed1 || recv(fd1, &c, 1, MSG_DONTWAIT) == 0;
        closed2 = closed2 || recv(fd2, &c, 1, MSG_DONTWAIT) == 0;
    }
    cr_assert_eq(reported, 0, "%zu completions reported for strangers", reported);
    close(fd1);
    close(fd2);

    /* A peer that does the exchange is accepted as before. */
    real_peer_connects(ops, b, addr, len);
}

/* Silent strangers at the oob port hold at most CFX_IB_MAX_UNAUTH_PER_IP
 * connections of one address: the next closes the oldest, long before
 * their exchange deadline, and a real peer still connects.  (Before, each
 * was kept with its endpoint until CFX_IB_OOB_ACCEPT_MS ran out.) */
Test(verbs, oob_strangers_past_a_cap_close_the_oldest, .timeout = 120)
{
    enum { CAP = 3, N = 7 };
    const struct cfx_transport_ops *ops = verbs_or_skip();
    setenv("CFX_IB_CONNECT", "oob", 1);
    setenv("CFX_IB_OOB_ACCEPT_MS", "600000", 1); /* no deadline within the test */
    setenv("CFX_IB_MAX_UNAUTH_PER_IP", "3", 1);
    struct cfx_tp_iface *b = open_or_skip(ops, 2);
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);
    cr_assert_eq(ops->iface_addr(b, addr, &len), CFX_OK);

    int fd[N];
    bool closed[N] = { false };
    int nclosed = 0;
    char c;
    for (int i = 0; i < N; i++)
        fd[i] = oob_raw_connect(addr);
    uint64_t end = cfx__deadline_ns(IL_WAIT_MS);
    while (nclosed < N - CAP) {
        cr_assert(cfx__now_ns() < end, "%d of %d strangers closed, not %d", nclosed, N,
                  N - CAP);
        struct cfx_tp_completion comp[8];
        int n = ops->poll(b, comp, 8);
        cr_assert_eq(n, 0, "%d completions for strangers", n);
        for (int i = 0; i < N; i++) {
            if (!closed[i] && recv(fd[i], &c, 1, MSG_DONTWAIT) == 0) {
                closed[i] = true;
                nclosed++;
            }
        }
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(closed[i], i < N - CAP, "stranger %d %s", i,
                     closed[i] ? "closed, not one of the oldest" : "kept past the cap");

    /* a real peer connects (and closes the oldest stranger left) */
    real_peer_connects(ops, b, addr, len);
    for (int i = 0; i < N; i++)
        close(fd[i]);
}

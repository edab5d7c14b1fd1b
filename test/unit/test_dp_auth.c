/*
 * Data-plane authentication: a raw peer opens a tcp transport iface of its
 * own (it could not join the coordinator without the token) and connects
 * straight to a node's advertised data-plane address.  Without a valid
 * cluster-token proof it gets no byte of an object and is closed, and the
 * node logs the refusal with the peer's address but never the token.  The
 * same raw peer with the right token is served, so the test is not vacuous.
 * The node proves nothing before the peer did: a stranger gets a nonce and a
 * refusal, no MAC to test token guesses against offline; and a proof made for
 * another node id, or in the acceptor's role, is refused.
 */
#include <criterion/criterion.h>

#include <poll.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/auth.h"
#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "dataplane/tcp/tcp.h"
#include "testutil.h"

#define OBJ_SIZE (1u << 20)
#define CHUNK    (64u * 1024)

static struct cfx_test_coord co;
static char logpath[128];
static struct cfx_context *node;
static struct cfx_object_id oid;
static uint8_t *src;

static void setup(void)
{
    /* the node's log goes to a file the test reads */
    snprintf(logpath, sizeof(logpath), "/tmp/cfx-dpauth-%d.log", (int)getpid());
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    dup2(fd, 2);
    close(fd);
    setenv("CFX_LOG_LEVEL", "DEBUG", 1);

    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr,
        .token = co.token,
        .timeout_ms = 5000,
        .transports = "tcp",
    };
    cr_assert_eq(cfx_context_create(&cp, &node), CFX_OK, "%s", cfx_last_error());
    src = malloc(OBJ_SIZE);
    cfx_test_fill(src, OBJ_SIZE, 7);
    cfx_object_id_generate(node, &oid);
    cr_assert_eq(cfx_put(node, &oid, src, OBJ_SIZE, NULL), CFX_OK, "%s", cfx_last_error());
}

static void teardown(void)
{
    cfx_context_destroy(node);
    cfx_test_coord_down(&co);
    free(src);
    cr_expect(!cfx_test_file_contains(logpath, co.token), "the token appears in the log");
    unlink(logpath);
}

TestSuite(dp_auth, .init = setup, .fini = teardown, .timeout = 60);

static void setup_capped(void)
{
    setenv("CFX_MAX_PEER_CONNS", "2", 1);
    setup();
}

TestSuite(dp_auth_capped, .init = setup_capped, .fini = teardown, .timeout = 60);

static void setup_cap1(void)
{
    setenv("CFX_TCP_MAX_UNAUTH_PER_IP", "1", 1);
    setup();
}

TestSuite(dp_auth_cap1, .init = setup_cap1, .fini = teardown, .timeout = 60);

struct raw {
    const struct cfx_transport_ops *ops;
    struct cfx_tp_iface *iface;
    struct cfx_tp_ep *ep;
    struct cfx_tp_mr *mr;
    uint8_t *dst;
    int writes;          /* WRITE_IMM completions seen */
    int closed;          /* EP_ERROR seen */
    int got_auth;        /* the node's AUTH messages that arrived */
    struct cfx_dp_auth auth;  /* the first (the challenge) */
    struct cfx_dp_auth proof; /* the second (the node's MAC) */
    int got_other;       /* other messages that arrived */
};

#define RAW_NODE 4242u   /* the node id the raw peer claims */

static int log_lines_with(const char *needle);

static void raw_open(struct raw *r)
{
    memset(r, 0, sizeof(*r));
    r->ops = cfx__transport_find("tcp");
    cr_assert(r->ops);
    struct cfx_tp_iface_params ip = { .field_mask = CFX_TP_IFACE_PARAM_BIND_ADDR,
                                      .bind_addr = "127.0.0.1" };
    cr_assert_eq(r->ops->iface_open(&ip, &r->iface), CFX_OK, "%s", cfx_last_error());
    r->dst = calloc(1, OBJ_SIZE);
    struct cfx_tp_mem_desc mem = { .addr = r->dst, .len = OBJ_SIZE, .memtype = CFX_MEMTYPE_HOST,
                                   .file_fd = -1 };
    cr_assert_eq(r->ops->mem_reg(r->iface, &mem, CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE,
                                 &r->mr), CFX_OK);
    /* the node's advertised tcp address, as the directory would give it */
    const struct cfx_node_addr *a = &node->self.addr[0];
    cr_assert_str_eq(a->tp, "tcp");
    cr_assert_eq(r->ops->ep_connect(r->iface, a->addr, a->len, node->node_id, &r->ep), CFX_OK);
}

static void raw_close(struct raw *r)
{
    if (r->ep && !r->closed)
        r->ops->ep_close(r->ep);
    r->ops->mem_dereg(r->mr);
    r->ops->iface_close(r->iface);
    free(r->dst);
}

/* Nothing came: sleep on the transport's fd until something does (at most
 * 10 ms, so the caller's deadline is looked at), as the engine sleeps. */
static void raw_idle(struct raw *r)
{
    int fd = r->ops->iface_fd(r->iface);
    if (fd < 0 || r->ops->iface_arm(r->iface) != CFX_OK)
        return; /* work pending: poll again at once */
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    (void)poll(&pfd, 1, 10);
}

static void raw_poll(struct raw *r, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    struct cfx_tp_completion c[32];
    while (cfx__now_ns() < deadline && !r->closed) {
        int n = r->ops->poll(r->iface, c, 32);
        for (int i = 0; i < n; i++) {
            if (c[i].type == CFX_TP_COMP_WRITE_IMM)
                r->writes++;
            else if (c[i].type == CFX_TP_COMP_EP_ERROR)
                r->closed = 1;
            else if (c[i].type == CFX_TP_COMP_RECV) {
                static union cfx_dp_msg m;
                size_t len;
                if (cfx__dp_msg_decode(c[i].data, c[i].len, &m, &len) == CFX_DP_AUTH) {
                    if (r->got_auth++ == 0)
                        r->auth = m.auth;
                    else
                        r->proof = m.auth;
                } else {
                    r->got_other++;
                }
            }
        }
        if (!n)
            raw_idle(r);
    }
}

/* Send host-form message @p m as the engine does: encoded for the wire. */
static void raw_send(struct raw *r, const void *m, size_t len)
{
    static uint8_t wire[CFX_TP_SEND_MAX];
    int rc = cfx__dp_msg_encode(m, len, wire, sizeof(wire));
    cr_assert_geq(rc, 0, "encode: %s", cfx_strerror(rc));
    size_t n = (size_t)rc;
    while ((rc = r->ops->ep_send(r->ep, wire, n, 0)) == CFX_ERR_AGAIN)
        raw_poll(r, 1);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_strerror(rc));
}

static void send_hello(struct raw *r, uint8_t nonce[CFX_DP_NONCE_LEN])
{
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = RAW_NODE,
    };
    cfx__auth_nonce(nonce, CFX_DP_NONCE_LEN);
    memcpy(h.nonce, nonce, CFX_DP_NONCE_LEN);
    raw_send(r, &h, sizeof(h));
}

/* Our proof as @p side for connector node @p from to the node: the MAC over
 * the node's challenge nonce, ours, and both node ids. */
static void send_auth_as(struct raw *r, const char *tok, const uint8_t nonce[CFX_DP_NONCE_LEN],
                         enum cfx_auth_side side, uint32_t from)
{
    struct cfx_dp_auth a = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_AUTH },
    };
    uint8_t bind[CFX_AUTH_DP_BIND_LEN];
    cfx__auth_dp_bind(from, node->node_id, bind);
    memcpy(a.nonce, r->auth.nonce, sizeof(a.nonce));
    cr_assert_eq(cfx__auth_mac_bound(tok, side, r->auth.nonce, nonce, bind, sizeof(bind), a.mac),
                 CFX_OK);
    raw_send(r, &a, sizeof(a));
}

static void send_auth(struct raw *r, const char *tok, const uint8_t nonce[CFX_DP_NONCE_LEN])
{
    send_auth_as(r, tok, nonce, CFX_AUTH_DP_CONNECT, RAW_NODE);
}

/* HELLO, then wait for the node's challenge. */
static void hello_and_challenge(struct raw *r, uint8_t nonce[CFX_DP_NONCE_LEN])
{
    send_hello(r, nonce);
    for (int i = 0; i < 50 && !r->got_auth; i++)
        raw_poll(r, 100);
    cr_assert_eq(r->got_auth, 1, "the node did not answer HELLO with its challenge");
}

/* Does the node's proof verify for the raw peer's node id? */
static int proof_ok(const struct raw *r, const uint8_t nonce[CFX_DP_NONCE_LEN])
{
    uint8_t bind[CFX_AUTH_DP_BIND_LEN];
    cfx__auth_dp_bind(RAW_NODE, node->node_id, bind);
    return cfx__auth_verify_bound(co.token, CFX_AUTH_DP_ACCEPT, r->auth.nonce, nonce, bind,
                                  sizeof(bind), r->proof.mac) == CFX_OK;
}

static void send_get(struct raw *r)
{
    struct cfx_dp_get_req g;
    memset(&g, 0, sizeof(g));
    g.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ, 1 };
    memcpy(g.id, oid.bytes, sizeof(g.id));
    g.size = OBJ_SIZE;
    g.chunk_size = CHUNK;
    g.credits = OBJ_SIZE / CHUNK;
    cr_assert_eq(r->ops->mr_pack(r->mr, &g.rdesc), CFX_OK);
    raw_send(r, &g, sizeof(g));
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

Test(dp_auth, get_before_authenticating_gets_nothing_and_is_closed)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    send_hello(&r, nonce);
    send_get(&r);
    raw_poll(&r, 3000);
    cr_assert(r.closed, "the unauthenticated connection was not closed");
    cr_assert_eq(r.writes, 0);
    cr_assert(all_zero(r.dst, OBJ_SIZE), "object bytes reached an unauthenticated peer");
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "refused"), "refusal not logged");
    cr_assert(cfx_test_file_contains(logpath, "127.0.0.1:"), "refusal logged without an address");
}

Test(dp_auth, wrong_token_gets_nothing_and_is_closed)
{
    struct raw r;
    char wrong[64];
    uint8_t nonce[CFX_DP_NONCE_LEN];
    cfx_test_token(wrong, sizeof(wrong));
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth(&r, wrong, nonce);
    send_get(&r);
    raw_poll(&r, 3000);
    cr_assert(r.closed, "a peer with the wrong token was not closed");
    cr_assert_eq(r.got_auth, 1, "the node answered a wrong proof with its own");
    cr_assert_eq(r.writes, 0);
    cr_assert(all_zero(r.dst, OBJ_SIZE), "object bytes reached a peer with the wrong token");
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "does not prove the cluster token"),
              "refusal not logged");
    cr_assert(!cfx_test_file_contains(logpath, wrong), "the wrong token appears in the log");
}

/* Wrong proofs as fast as a stranger can make them: the refusals are logged
 * a line a second at most (each was a WARN line: a stranger could fill the
 * node's log). */
Test(dp_auth, wrong_proofs_are_logged_a_line_a_second)
{
    enum { N = 40 };
    char wrong[64];
    cfx_test_token(wrong, sizeof(wrong));
    uint64_t t0 = cfx__now_ns();
    for (int i = 0; i < N; i++) {
        struct raw r;
        uint8_t nonce[CFX_DP_NONCE_LEN];
        raw_open(&r);
        hello_and_challenge(&r, nonce);
        send_auth(&r, wrong, nonce);
        raw_poll(&r, 3000);
        cr_assert(r.closed, "attempt %d: a wrong proof was not refused", i);
        raw_close(&r);
    }
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    int lines = log_lines_with(": refused "); /* the WARN line, not the connection's INFO */
    cr_log_info("%d refusals in %.1f s: %d lines", N, secs, lines);
    cr_assert_geq(lines, 1, "refusals not logged");
    cr_assert_leq(lines, (int)secs + 2, "%d lines for %d refusals in %.1f s", lines, N, secs);
}

Test(dp_auth, replayed_proof_is_refused)
{
    /* A proof recorded on one connection does not open another: the node's
     * nonce is fresh per connection. */
    struct raw r1, r2;
    uint8_t n1[CFX_DP_NONCE_LEN], n2[CFX_DP_NONCE_LEN];
    uint8_t bind[CFX_AUTH_DP_BIND_LEN];
    raw_open(&r1);
    hello_and_challenge(&r1, n1);
    struct cfx_dp_auth proof = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_AUTH },
    };
    memcpy(proof.nonce, r1.auth.nonce, sizeof(proof.nonce));
    cfx__auth_dp_bind(RAW_NODE, node->node_id, bind);
    cfx__auth_mac_bound(co.token, CFX_AUTH_DP_CONNECT, r1.auth.nonce, n1, bind, sizeof(bind),
                        proof.mac);
    raw_close(&r1);

    raw_open(&r2);
    memcpy(n2, n1, sizeof(n2));
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = RAW_NODE,
    };
    memcpy(h.nonce, n2, sizeof(h.nonce)); /* same client nonce as before */
    raw_send(&r2, &h, sizeof(h));
    raw_send(&r2, &proof, sizeof(proof));
    send_get(&r2);
    raw_poll(&r2, 3000);
    cr_assert(r2.closed, "a replayed proof opened a connection");
    cr_assert_eq(r2.writes, 0);
    raw_close(&r2);
}

Test(dp_auth, right_token_is_served)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth(&r, co.token, nonce);
    for (int i = 0; i < 50 && r.got_auth < 2 && !r.closed; i++)
        raw_poll(&r, 100);
    cr_assert_eq(r.got_auth, 2, "the node did not answer a right proof with its own");
    cr_assert(proof_ok(&r, nonce), "the node's proof does not verify");
    send_get(&r);
    for (int i = 0; i < 100 && r.writes < (int)(OBJ_SIZE / CHUNK) && !r.closed; i++)
        raw_poll(&r, 50);
    cr_assert_eq(r.writes, (int)(OBJ_SIZE / CHUNK), "closed %d", r.closed);
    cr_assert_eq(cfx_test_check(r.dst, OBJ_SIZE, 7), (size_t)-1, "bytes differ");
    raw_close(&r);
}

/* An authenticated peer that writes with a key it was never granted (here:
 * the node's first registration slots with made-up keys, after the node
 * served it, so the node holds registrations) is refused by the transport
 * before a byte lands, closed, and counted in cfx_context_stats. */
Test(dp_auth, write_without_a_grant_is_refused_and_counted)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    struct cfx_context_stats st;
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth(&r, co.token, nonce);
    send_get(&r); /* served: the node registered its object with tcp */
    for (int i = 0; i < 100 && r.writes < (int)(OBJ_SIZE / CHUNK) && !r.closed; i++)
        raw_poll(&r, 50);
    cr_assert_eq(r.writes, (int)(OBJ_SIZE / CHUNK));
    cr_assert_eq(cfx_context_stats(node, &st), CFX_OK);
    cr_assert_eq(st.writes_refused, 0);

    struct cfx__tcp_rkey k = { .tag = CFX_TCP_RDESC_TAG, .len = htole64(OBJ_SIZE) };
    k.key_lo = cfx__random_u32();
    k.key_hi = cfx__random_u32();
    struct cfx_tp_rdesc rd = { .len = sizeof(k) };
    memcpy(rd.data, &k, sizeof(k));
    cr_assert_eq(r.ops->ep_write(r.ep, r.mr, 0, &rd, 0, 64, 0, 9), CFX_OK);
    raw_poll(&r, 10000); /* returns once closed */
    cr_assert(r.closed, "the node kept a peer that wrote without a grant");
    uint64_t deadline = cfx__deadline_ns(10000);
    do {
        cr_assert_eq(cfx_context_stats(node, &st), CFX_OK);
    } while (st.writes_refused == 0 && cfx__now_ns() < deadline && !sched_yield());
    cr_assert_eq(st.writes_refused, 1, "refused writes counted: %" PRIu64, st.writes_refused);
    raw_close(&r);
}

/* A receive request (a P2P GET_REQ) that no posted send of the node matches:
 * it is kept until one does. */
static void send_rtr(struct raw *r, uint32_t slot)
{
    struct cfx_dp_get_req g;
    memset(&g, 0, sizeof(g));
    g.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ,
                                 slot % CFX_XFER_SLOTS };
    g.size = 1u << 20;
    g.chunk_size = CHUNK;
    g.credits = 1;
    g.flags = CFX_DP_GET_P2P;
    g.chan = 0x5eed;
    g.tag = 3;
    cr_assert_eq(r->ops->mr_pack(r->mr, &g.rdesc), CFX_OK);
    raw_send(r, &g, sizeof(g));
}

/* An authenticated peer asks for messages nobody sends: a receiver has one
 * transfer slot per receive, so the node keeps CFX_XFER_SLOTS of its
 * requests (the connection still serves), and the next one fails the
 * connection.  Each was kept, without a bound: a peer repeating a slot
 * number made the node allocate for ever. */
Test(dp_auth, receive_requests_past_the_slots_close_the_connection, .timeout = 60)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth(&r, co.token, nonce);
    for (uint32_t i = 0; i < CFX_XFER_SLOTS; i++) {
        send_rtr(&r, i);
        if (i % 256 == 255)
            raw_poll(&r, 1);
    }
    send_get(&r); /* after them, in order: served, so none of them closed it */
    for (int i = 0; i < 100 && r.writes < (int)(OBJ_SIZE / CHUNK) && !r.closed; i++)
        raw_poll(&r, 50);
    cr_assert_eq(r.writes, (int)(OBJ_SIZE / CHUNK), "closed %d", r.closed);
    send_rtr(&r, 0); /* a slot number again: one request more than slots */
    raw_poll(&r, 10000); /* returns once closed */
    cr_assert(r.closed, "the node kept %u receive requests of one peer", CFX_XFER_SLOTS + 1);
    raw_close(&r);
}

/* A peer that says HELLO and then nothing does not keep its connection (and
 * the node's buffers for it) for ever: it is closed after CFX_CONN_AUTH_MS. */
Test(dp_auth, silent_peer_is_closed_after_the_auth_deadline, .timeout = 60)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    send_hello(&r, nonce);
    uint64_t t0 = cfx__now_ns();
    raw_poll(&r, CFX_CONN_AUTH_MS / 2);
    cr_assert(!r.closed, "closed before the deadline");
    raw_poll(&r, CFX_CONN_AUTH_MS + 20000); /* returns once closed; the rest ends a hang */
    cr_assert(r.closed, "a silent peer kept its connection past %d ms", CFX_CONN_AUTH_MS);
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    cr_log_info("silent peer closed after %.1f s", secs);
    cr_assert_geq(secs, CFX_CONN_AUTH_MS / 1000.0 - 0.5);
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "no authentication within"), "not logged");
}

/* --- strangers at the tcp data port ----------------------------------------- */

/* The node's tcp iface (its caps, its counters). */
static struct cfx__tcp_iface *node_tcp(void)
{
    for (int i = 0; i < node->ntp; i++)
        if (!strcmp(node->tp[i].ops->name, "tcp"))
            return cfx__tcp_iface_of(node->tp[i].iface);
    cr_assert_fail("the node has no tcp iface");
    return NULL;
}

/* A plain connection to the node's tcp port that
 * never says anything: a stranger without the token, from @p from_ip
 * (127.0.0.x).  -1 on failure. */
static int stranger_connect(const char *from_ip)
{
    const struct cfx_node_addr *a = &node->self.addr[0];
    struct sockaddr_in from = { .sin_family = AF_INET }, dst;
    char host[64];

    snprintf(host, sizeof(host), "%.*s", (int)strnlen((const char *)a->addr, a->len), a->addr);
    if (cfx__parse_hostport(host, &dst) != CFX_OK ||
        inet_pton(AF_INET, from_ip, &from.sin_addr) != 1)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&from, sizeof(from)) < 0 ||
        (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 && errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Strangers of @p fds whose connection the node closed (they send nothing,
 * so anything readable is the close), waiting up to @p ms on their sockets
 * for at least @p want of them.  Syscalls only (used in a forked child). */
static int strangers_closed(struct pollfd *fds, int n, int want, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    int closed;
    for (;;) {
        closed = 0;
        for (int i = 0; i < n; i++) {
            fds[i].events = POLLIN | POLLRDHUP;
            fds[i].revents = 0;
        }
        (void)poll(fds, (nfds_t)n, 0);
        for (int i = 0; i < n; i++)
            closed += (fds[i].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) != 0;
        uint64_t now = cfx__now_ns();
        if (closed >= want || now >= deadline)
            return closed;
        /* sleep until one of them changes (or 100 ms: count again) */
        for (int i = 0; i < n; i++)
            fds[i].events = fds[i].revents ? 0 : (POLLIN | POLLRDHUP);
        (void)poll(fds, (nfds_t)n, 100);
    }
}

/* Lines of the node's log holding @p needle. */
static int log_lines_with(const char *needle)
{
    int n = cfx_test_lines_with(logpath, needle);
    cr_assert_geq(n, 0, "%s", logpath);
    return n;
}

/* A token holder after a flood: HELLO, the right proof, the node's proof. */
static int raw_authenticate(struct raw *r);

static int token_holder_gets_in(void)
{
    struct raw r;
    raw_open(&r);
    int ok = raw_authenticate(&r);
    raw_close(&r);
    return ok;
}

/* @p r: HELLO and the right proof; whether the node answered with its own
 * (authenticated) and kept the connection. */
static int raw_authenticate(struct raw *r)
{
    uint8_t nonce[CFX_DP_NONCE_LEN];
    hello_and_challenge(r, nonce);
    send_auth(r, co.token, nonce);
    for (int i = 0; i < 50 && r->got_auth < 2 && !r->closed; i++)
        raw_poll(r, 100);
    return r->got_auth == 2 && !r->closed && proof_ok(r, nonce);
}

/* Authenticated connections claiming one node id: a node holds at most 4,
 * the newest closing the oldest (a token holder opened them without end,
 * under one id, each holding buffers and an eager grant). */
Test(dp_auth, a_node_id_holds_at_most_4_connections_here)
{
    enum { N = 5 };
    struct raw r[N];
    for (int i = 0; i < N; i++) {
        raw_open(&r[i]);
        cr_assert(raw_authenticate(&r[i]), "connection %d was not authenticated", i);
    }
    for (int i = 0; i < 30 && !r[0].closed; i++)
        raw_poll(&r[0], 100);
    cr_assert(r[0].closed, "the oldest of 5 connections of one node id was kept");
    for (int i = 1; i < N; i++) {
        raw_poll(&r[i], 0);
        cr_assert(!r[i].closed, "connection %d was closed", i);
    }
    for (int i = 0; i < N; i++)
        raw_close(&r[i]);
    cr_assert(cfx_test_file_contains(logpath, "the oldest of its connections here"),
              "the eviction was not logged");
}

/*
 * Strangers without the token hold at most CFX_TCP_UNAUTH_PER_IP
 * connections of one address and CFX_TCP_UNAUTH_MAX of all: beyond, the
 * oldest of them is closed for the newcomer, long before their HELLO
 * deadline, and a token holder behind the flood's own address still gets
 * in.  Each kind of line is written at most once a second.  (Before, every
 * connection was kept until its 10 s HELLO deadline: none of the strangers
 * was closed early, and one line per stranger was written at that
 * deadline.)
 */
Test(dp_auth, stranger_flood_is_capped_and_token_holder_gets_in, .timeout = 60)
{
    enum { ADDRS = 5, PER_ADDR = CFX_TCP_UNAUTH_PER_IP + 8, N = ADDRS * PER_ADDR };
    struct cfx__tcp_iface *tif = node_tcp();
    static struct pollfd fds[N];
    cr_assert_eq(tif->strangers.max_per_ip, CFX_TCP_UNAUTH_PER_IP);
    cr_assert_eq(tif->strangers.max, CFX_TCP_UNAUTH_MAX);
    cr_assert_lt(CFX_TCP_UNAUTH_MAX, ADDRS * CFX_TCP_UNAUTH_PER_IP, "the total cap is reached");

    uint64_t t0 = cfx__now_ns();
    for (int i = 0; i < N; i++) {
        char ip[16];
        snprintf(ip, sizeof(ip), "127.0.0.%d", 1 + i % ADDRS);
        fds[i].fd = stranger_connect(ip);
        cr_assert_geq(fds[i].fd, 0, "stranger %d: %s", i, strerror(errno));
    }
    /* every address past its cap, then all of them past the total: the
     * node keeps CFX_TCP_UNAUTH_MAX and closes the rest as they come */
    int want = N - CFX_TCP_UNAUTH_MAX;
    int closed = strangers_closed(fds, N, want, CFX_TCP_HELLO_MS - 2000);
    cr_assert_eq(closed, want, "%d of %d strangers closed, not %d (none past a cap before)",
                 closed, N, want);
    cr_assert_eq(atomic_load(&tif->strangers.n_evicted), (uint64_t)want);
    cr_assert(token_holder_gets_in(), "a token holder did not get in after the flood");
    /* the oldest stranger made room for it */
    cr_assert_eq(strangers_closed(fds, N, want + 1, 5000), want + 1);
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    cr_assert_eq(log_lines_with("sent no HELLO"), 0, "closed at the deadline, not for a cap");

    /* one line a second at most: the first at once, then the count */
    int lines = log_lines_with("the oldest not authenticated");
    cr_log_info("%d evictions in %.1f s: %d lines", want + 1, secs, lines);
    cr_assert_geq(lines, 1, "evictions not logged");
    cr_assert_leq(lines, (int)secs + 2, "%d lines for %d evictions in %.1f s", lines, want + 1,
                  secs);
    for (int i = 0; i < N; i++)
        close(fds[i].fd);
}

/*
 * Out of file descriptors: the process may open only a few more, and a
 * child floods the port with strangers that say nothing.  accept() fails
 * with EMFILE: the oldest stranger is closed for the newcomer, so no
 * accept spins on the readable listener, the line saying so is written at
 * most once a second, and a token holder who comes after the flood is
 * answered and gets in.  (Before: the progress thread retried at once,
 * logging "accept: Too many open files" each time, millions of lines, and
 * the token holder got no challenge until the strangers' 10 s deadline.)
 */
Test(dp_auth, out_of_fds_sheds_strangers_and_token_holder_gets_in, .timeout = 60)
{
    enum { ROOM = 24, N = 200 };
    struct cfx__tcp_iface *tif = node_tcp();
    int go[2];
    cr_assert_eq(pipe(go), 0);
    struct rlimit old;

    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* 0: in; 30: no go; 31: a connect failed; 32: strangers kept; 33: refused */
        static struct pollfd fds[N];
        char b;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(go[1]);
        if (read(go[0], &b, 1) != 1)
            _exit(30);
        for (int i = 0; i < N; i++)
            if ((fds[i].fd = stranger_connect("127.0.0.1")) < 0)
                _exit(31);
        /* the node can hold no more than ROOM of them */
        if (strangers_closed(fds, N, N - ROOM, CFX_TCP_HELLO_MS - 3000) < N - ROOM)
            _exit(32);
        _exit(token_holder_gets_in() ? 0 : 33);
    }
    close(go[0]);
    /* this process may open ROOM descriptors more, and no more */
    cr_assert_eq(cfx_test_fds_leave(ROOM, &old), 0, "%s", strerror(errno));
    uint64_t t0 = cfx__now_ns();
    cr_assert_eq(write(go[1], "g", 1), 1);
    close(go[1]);
    int wst;
    cr_assert_eq(waitpid(pid, &wst, 0), pid);
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);

    cr_assert(WIFEXITED(wst), "the child died");
    cr_assert_eq(WEXITSTATUS(wst), 0, "child exit %d: 31 a connect failed, 32 the node kept "
                 "the strangers, 33 the token holder did not get in", WEXITSTATUS(wst));
    cr_assert_eq(log_lines_with("sent no HELLO"), 0, "closed at the deadline, not for room");
    cr_assert_eq(log_lines_with("accept: Too many open files"), 0,
                 "a line per failed accept");
    int lines = log_lines_with("out of file descriptors");
    uint64_t evicted = atomic_load(&tif->strangers.n_evicted);
    cr_log_info("%llu evicted, %llu shed in %.1f s: %d lines", (unsigned long long)evicted,
                (unsigned long long)atomic_load(&tif->strangers.n_shed), secs, lines);
    cr_assert_geq(evicted, (uint64_t)(N - ROOM), "strangers not closed for room");
    cr_assert_geq(lines, 1, "running out of descriptors not logged");
    cr_assert_leq(lines, (int)secs + 2, "%d lines in %.1f s", lines, secs);
}

/* Connections waiting in the node's tcp accept queue (TCP_INFO of a
 * listening socket: tcpi_unacked). */
static unsigned accept_queue(void)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    cr_assert_eq(getsockopt(node_tcp()->listen_fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
    return ti.tcpi_unacked;
}

static void accept_queue_reaches(unsigned n)
{
    uint64_t deadline = cfx__deadline_ns(20000);
    while (accept_queue() < n && cfx__now_ns() < deadline)
        sched_yield();
    cr_assert_geq(accept_queue(), n, "%u connections never waited in the accept queue", n);
}

struct ctx_getter {
    struct cfx_context *ctx;
    uint8_t *buf;
    int rc;
    char err[512];
};

static void *ctx_get_main(void *arg)
{
    struct ctx_getter *g = arg;
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 30000 };
    g->rc = cfx_get(g->ctx, &oid, g->buf, OBJ_SIZE, NULL, &gp);
    snprintf(g->err, sizeof(g->err), "%s", cfx_last_error());
    return NULL;
}

/*
 * A token holder's connection closed at the node's cap on strangers before
 * its handshake ended (here one of an address, CFX_TCP_MAX_UNAUTH_PER_IP=1:
 * a stranger accepted after it takes its place) is dialled again, and the
 * get is served whole.  (Before, the get failed: an alltoall of 100 ranks
 * on one host failed so at the default cap of 32, a burst of token holders
 * closing each other's connections.)
 */
Test(dp_auth_cap1, a_token_holder_closed_at_the_cap_dials_again, .timeout = 60)
{
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr, .token = co.token, .timeout_ms = 30000, .transports = "tcp",
    };
    struct ctx_getter g = { .buf = calloc(1, OBJ_SIZE) };
    cr_assert_not_null(g.buf);
    cr_assert_eq(cfx_context_create(&cp, &g.ctx), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node_tcp()->strangers.max_per_ip, 1);

    /* the node accepts nothing meanwhile: the getter's connection, then a
     * stranger's, wait in its accept queue in that order */
    cr_assert_eq(cfx__progress_pause(node, true), CFX_OK, "%s", cfx_last_error());
    unsigned before = accept_queue();
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, ctx_get_main, &g), 0);
    accept_queue_reaches(before + 1);
    struct pollfd stranger = { .fd = stranger_connect("127.0.0.1") };
    cr_assert_geq(stranger.fd, 0, "%s", strerror(errno));
    accept_queue_reaches(before + 2);
    cr_assert_eq(cfx__progress_pause(node, false), CFX_OK);

    pthread_join(th, NULL);
    cr_assert_eq(g.rc, CFX_OK, "%s: %s", cfx_errname(g.rc), g.err);
    cr_assert_eq(cfx_test_check(g.buf, OBJ_SIZE, 7), (size_t)-1, "the bytes differ");
    cr_assert_eq(strangers_closed(&stranger, 1, 1, 20000), 1,
                 "the stranger kept its place: the token holder's was not closed");
    cr_assert_geq(atomic_load(&node_tcp()->strangers.n_evicted), 2);
    cr_assert(cfx_test_file_contains(logpath, "dialling again (1 of"), "no redial logged");
    close(stranger.fd);
    cfx_context_destroy(g.ctx);
    free(g.buf);
}

/* The acceptor proves nothing before the connector has: its answer to HELLO
 * is a nonce with no MAC, and a stranger that then sends a wrong proof, or
 * garbage, gets only the close.  (Before, the answer to HELLO carried the
 * acceptor's MAC: material for an offline guess of a weak token.) */
Test(dp_auth, stranger_gets_no_mac_before_proving)
{
    struct raw r;
    char wrong[64];
    uint8_t nonce[CFX_DP_NONCE_LEN];
    static const uint8_t zero[CFX_DP_MAC_LEN];
    cfx_test_token(wrong, sizeof(wrong));

    raw_open(&r);
    hello_and_challenge(&r, nonce);
    cr_assert(!memcmp(r.auth.mac, zero, sizeof(zero)), "the challenge carries a MAC");
    send_auth(&r, wrong, nonce);
    raw_poll(&r, 10000); /* returns once closed */
    cr_assert(r.closed, "a wrong proof was not refused");
    cr_assert_eq(r.got_auth, 1, "the node sent its MAC to a peer that proved nothing");
    cr_assert_eq(r.got_other, 0);
    raw_close(&r);

    /* garbage in place of the proof: the same */
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    uint8_t junk[80];
    cfx__auth_nonce(junk, sizeof(junk));
    int rc;
    while ((rc = r.ops->ep_send(r.ep, junk, sizeof(junk), 0)) == CFX_ERR_AGAIN)
        raw_poll(&r, 1);
    cr_assert_eq(rc, CFX_OK);
    raw_poll(&r, 10000);
    cr_assert(r.closed, "garbage was not refused");
    cr_assert_eq(r.got_auth, 1, "the node sent its MAC to a peer that sent garbage");
    cr_assert_eq(r.got_other, 0);
    raw_close(&r);
}

/* A proof is bound to the node ids and the role: a token holder's proof made
 * for another connector id than its HELLO claims, or made in the acceptor's
 * role (a reflected MAC), opens nothing and gets no MAC back.  (Before, the
 * MACs covered the nonces only: any node id's proof served.) */
Test(dp_auth, proof_for_another_node_id_or_role_is_refused)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];

    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth_as(&r, co.token, nonce, CFX_AUTH_DP_CONNECT, RAW_NODE + 1);
    send_get(&r);
    raw_poll(&r, 10000);
    cr_assert(r.closed, "a proof for node %u opened a connection claimed by node %u",
              RAW_NODE + 1, RAW_NODE);
    cr_assert_eq(r.got_auth, 1);
    cr_assert_eq(r.writes, 0);
    raw_close(&r);

    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth_as(&r, co.token, nonce, CFX_AUTH_DP_ACCEPT, RAW_NODE);
    send_get(&r);
    raw_poll(&r, 10000);
    cr_assert(r.closed, "the acceptor's MAC opened a connection as the connector's");
    cr_assert_eq(r.got_auth, 1);
    cr_assert_eq(r.writes, 0);
    cr_assert(all_zero(r.dst, OBJ_SIZE));
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "for the node id it claims"), "not logged");

    /* the same peer with a proof for its own id is served: not vacuous */
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth(&r, co.token, nonce);
    for (int i = 0; i < 50 && r.got_auth < 2 && !r.closed; i++)
        raw_poll(&r, 100);
    cr_assert_eq(r.got_auth, 2);
    cr_assert(proof_ok(&r, nonce));
    raw_close(&r);
}

/* ---- the node as connector: a raw member answers its dial ---------------- */

struct getter {
    struct cfx_object_id id;
    uint8_t *buf;
    int rc;
};

static void *get_thread(void *arg)
{
    struct getter *g = arg;
    size_t got = 0;
    g->rc = cfx_get(node, &g->id, g->buf, OBJ_SIZE, &got, NULL);
    return NULL;
}

/* A raw member joins the directory with a tcp address of its own and
 * announces an object; the node's get dials it.  The raw member answers
 * the node's HELLO with a challenge, takes the node's MAC, and proves the
 * token bound to @p claimed_acceptor as the acceptor's node id.  Returns how
 * many messages other than the handshake the node sent it (GET_REQs). */
static int raw_member_serves(uint32_t id_offset, int *get_rc, int *node_mac_ok)
{
    struct raw r;
    memset(&r, 0, sizeof(r));
    r.ops = cfx__transport_find("tcp");
    struct cfx_tp_iface_params ip = { .field_mask = CFX_TP_IFACE_PARAM_BIND_ADDR,
                                      .bind_addr = "127.0.0.1" };
    cr_assert_eq(r.ops->iface_open(&ip, &r.iface), CFX_OK, "%s", cfx_last_error());

    struct cfx_node_rec self = { .pid = (uint32_t)getpid(), .naddr = 1 };
    snprintf(self.name, sizeof(self.name), "raw-member");
    snprintf(self.host_id, sizeof(self.host_id), "elsewhere");
    snprintf(self.addr[0].tp, sizeof(self.addr[0].tp), "tcp");
    size_t alen = sizeof(self.addr[0].addr);
    cr_assert_eq(r.ops->iface_addr(r.iface, self.addr[0].addr, &alen), CFX_OK);
    self.addr[0].len = (uint8_t)alen;
    struct cfx_ctl_params cp = { .coord = co.addr, .token = co.token,
                                 .role = CFX_CTL_ROLE_NODE, .self = &self, .timeout_ms = 5000 };
    struct cfx_ctl *ctl = NULL;
    cr_assert_eq(cfx__ctl_open(&cp, &ctl), CFX_OK, "%s", cfx_last_error());
    uint32_t me = cfx__ctl_node_id(ctl);

    struct getter g = { .buf = calloc(1, OBJ_SIZE), .rc = 1 };
    cfx_object_id_generate(node, &g.id);
    cr_assert_eq(cfx__ctl_obj_put(ctl, &g.id, OBJ_SIZE, CHUNK, NULL, cfx__deadline_ns(5000)),
                 CFX_OK, "%s", cfx_last_error());
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, get_thread, &g), 0);

    /* accept the node's connection and take its HELLO */
    struct cfx_tp_completion c[32];
    struct cfx_dp_hello hello = { 0 };
    uint8_t na[CFX_DP_NONCE_LEN];
    int stage = 0, others = 0;
    *node_mac_ok = 0;
    uint64_t deadline = cfx__deadline_ns(15000);
    while (cfx__now_ns() < deadline && !r.closed && stage < 3) {
        int n = r.ops->poll(r.iface, c, 32);
        for (int i = 0; i < n; i++) {
            if (c[i].type == CFX_TP_COMP_ACCEPT && !r.ep) {
                r.ep = c[i].ep;
            } else if (c[i].type == CFX_TP_COMP_EP_ERROR && c[i].ep == r.ep) {
                r.closed = 1;
            } else if (c[i].type == CFX_TP_COMP_RECV && c[i].ep == r.ep) {
                static union cfx_dp_msg m;
                size_t len;
                int type = cfx__dp_msg_decode(c[i].data, c[i].len, &m, &len);
                if (type == CFX_DP_HELLO && stage == 0) {
                    hello = m.hello;
                    cr_assert_eq(hello.node_id, node->node_id);
                    struct cfx_dp_auth ch = {
                        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_AUTH, 0 },
                    };
                    cfx__auth_nonce(na, sizeof(na));
                    memcpy(ch.nonce, na, sizeof(na));
                    raw_send(&r, &ch, sizeof(ch));
                    stage = 1;
                } else if (type == CFX_DP_AUTH && stage == 1) {
                    uint8_t bind[CFX_AUTH_DP_BIND_LEN];
                    cfx__auth_dp_bind(node->node_id, me, bind);
                    *node_mac_ok = cfx__auth_verify_bound(co.token, CFX_AUTH_DP_CONNECT, na,
                                                          hello.nonce, bind, sizeof(bind),
                                                          m.auth.mac) == CFX_OK;
                    struct cfx_dp_auth pr = {
                        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_AUTH, 0 },
                        .eager_max = 0,
                        .eager_credits = 0,
                    };
                    memcpy(pr.nonce, na, sizeof(na));
                    cfx__auth_dp_bind(node->node_id, me + id_offset, bind);
                    cfx__auth_mac_bound(co.token, CFX_AUTH_DP_ACCEPT, na, hello.nonce, bind,
                                        sizeof(bind), pr.mac);
                    raw_send(&r, &pr, sizeof(pr));
                    stage = 2;
                } else if (stage == 2 && type > 0) {
                    others++; /* the node asks (GET_REQ): it took our proof */
                    stage = 3;
                }
            }
        }
        if (!n)
            raw_idle(&r);
    }
    /* end the get: the member leaves (the directory drops its object) */
    cfx__ctl_close(ctl);
    if (r.ep && !r.closed)
        r.ops->ep_close(r.ep);
    r.ep = NULL;
    r.ops->iface_close(r.iface);
    pthread_join(t, NULL);
    *get_rc = g.rc;
    free(g.buf);
    return others;
}

/* The node dials the address the directory gave for a member; the answer
 * must prove the token for that member's node id.  A proof bound to another
 * node id (what a node that took over the address would send) is refused:
 * the node sends no request on the connection.  (Before, the MACs covered
 * the nonces only, so any token holder at the address was taken for the
 * member.)  The node proves itself first, bound to both ids. */
Test(dp_auth, connector_refuses_an_acceptor_with_another_node_id)
{
    int get_rc, mac_ok;
    int asked = raw_member_serves(1, &get_rc, &mac_ok);
    cr_assert(mac_ok, "the node's proof is not bound to both node ids");
    cr_assert_eq(asked, 0, "the node asked a peer that proved another node id");
    cr_assert_neq(get_rc, CFX_OK);
    cr_assert(cfx_test_file_contains(logpath, "not node the directory named"), "not logged");

    /* the right binding is taken: the node asks for the object (not vacuous) */
    asked = raw_member_serves(0, &get_rc, &mac_ok);
    cr_assert(mac_ok);
    cr_assert_eq(asked, 1, "the node did not ask a peer that proved the right node id");
}

/* A proof with the right token that says @p claimed for its CFX_SECURE
 * while its MAC covers @p mac_mode (the binding C | A | mode). */
static void send_auth_mode(struct raw *r, const uint8_t nonce[CFX_DP_NONCE_LEN], int claimed,
                           int mac_mode)
{
    uint8_t bind[CFX_AUTH_DP_BIND_LEN + 1];
    struct cfx_dp_auth a = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_AUTH },
        .secure = (uint32_t)claimed,
    };
    cfx__auth_dp_bind(RAW_NODE, node->node_id, bind);
    bind[CFX_AUTH_DP_BIND_LEN] = (uint8_t)mac_mode;
    memcpy(a.nonce, r->auth.nonce, sizeof(a.nonce));
    cfx__auth_mac_bound(co.token, CFX_AUTH_DP_CONNECT, r->auth.nonce, nonce, bind, sizeof(bind),
                        a.mac);
    raw_send(r, &a, sizeof(a));
}

/* CFX_SECURE must agree: a peer that asks for sealing from a node that does
 * not seal (its HELLO and proof say encrypt, its MAC covers that mode) is
 * refused, and the refusal names both settings; the node sends no proof. */
Test(dp_auth, sealing_peer_refused_by_name)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = RAW_NODE,
        .secure = CFX_SEAL_ENCRYPT,
    };
    cfx__auth_nonce(nonce, sizeof(nonce));
    memcpy(h.nonce, nonce, sizeof(nonce));
    raw_send(&r, &h, sizeof(h));
    for (int i = 0; i < 50 && !r.got_auth; i++)
        raw_poll(&r, 100);
    cr_assert_eq(r.got_auth, 1);
    cr_assert_eq(r.auth.secure, CFX_SEAL_OFF, "the challenge does not say the node's mode");
    send_auth_mode(&r, nonce, CFX_SEAL_ENCRYPT, CFX_SEAL_ENCRYPT);
    raw_poll(&r, 10000); /* returns once closed */
    cr_assert(r.closed, "a peer of another CFX_SECURE was kept");
    cr_assert_eq(r.got_auth, 1, "the node answered a peer of another mode with its proof");
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "CFX_SECURE=encrypt, this node with off"),
              "the refusal does not name both settings");
}

/* The mode is under the MAC: a proof made for sealing, sent as if it were a
 * plain one (what a path that rewrote the mode fields would deliver), does
 * not verify. */
Test(dp_auth, proof_for_another_mode_is_refused)
{
    struct raw r;
    uint8_t nonce[CFX_DP_NONCE_LEN];
    raw_open(&r);
    hello_and_challenge(&r, nonce);
    send_auth_mode(&r, nonce, CFX_SEAL_OFF, CFX_SEAL_INTEGRITY);
    send_get(&r);
    raw_poll(&r, 10000); /* returns once closed */
    cr_assert(r.closed);
    cr_assert_eq(r.got_auth, 1, "a proof for another mode was answered");
    cr_assert_eq(r.writes, 0);
    cr_assert(all_zero(r.dst, OBJ_SIZE));
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "does not prove the cluster token"));
}

/*
 * A node of another user on the same host (nobody, holding the token) gets
 * an object from a root node with the default kind of list, shm,tcp.  shm
 * refuses the other user on both ends, as it must, and the connection goes
 * on over tcp, where the token is what counts.  The connector's refusal was
 * CFX_ERR_AUTH, which the engine takes for "would refuse us over any
 * transport": no fallback, and the get failed after its deadline
 * ("authentication failed") although both held the token.
 */
Test(dp_auth_uid, other_user_falls_back_to_tcp, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to fork a child as another uid (nobody)");
    int to_child[2];
    cr_assert_eq(pipe(to_child), 0);
    cfx_object_id_from_name("dp_auth_uid", &oid);
    /* forked before any thread of the library runs here */
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* 0: got the bytes; 20: not nobody; 21: no join; 22: get; 23: bytes */
        char msg[192] = "";
        struct cfx_context *ctx;
        struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 10000 };
        size_t got = 0;
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_child[1]);
        ssize_t n = read(to_child[0], msg, sizeof(msg) - 1);
        if (n <= 0 || setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
            setresuid(65534, 65534, 65534))
            _exit(20);
        char *tok = strchr(msg, ' ');
        uint8_t *dst = calloc(1, OBJ_SIZE);
        if (!tok || !dst)
            _exit(20);
        *tok++ = '\0';
        if (cfx_test_join(msg, tok, "shm,tcp", "other-user", 5000, &ctx) != CFX_OK)
            _exit(21);
        int rc = cfx_get(ctx, &oid, dst, OBJ_SIZE, &got, &gp);
        cfx_context_destroy(ctx);
        if (rc != CFX_OK)
            _exit(22);
        _exit(got == OBJ_SIZE && cfx_test_check(dst, OBJ_SIZE, 7) == (size_t)-1 ? 0 : 23);
    }
    close(to_child[0]);

    char path[] = "/tmp/cfx-test-uid-XXXXXX";
    int logfd;
    int saved = cfx_test_stderr_to(path, &logfd);
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
    cr_assert_eq(cfx_test_join(co.addr, co.token, "shm,tcp", "root", 5000, &node), CFX_OK, "%s",
                 cfx_last_error());
    src = malloc(OBJ_SIZE);
    cfx_test_fill(src, OBJ_SIZE, 7);
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    cr_assert_eq(cfx_put(node, &oid, src, OBJ_SIZE, &pp), CFX_OK, "%s", cfx_last_error());
    char msg[192];
    int len = snprintf(msg, sizeof(msg), "%s %s", co.addr, co.token);
    cr_assert_eq(write(to_child[1], msg, (size_t)len), len);
    close(to_child[1]);
    int wst;
    cr_assert_eq(waitpid(pid, &wst, 0), pid);
    cfx_context_destroy(node);
    cfx_test_coord_down(&co);
    free(src);
    cfx_test_stderr_back(saved);
    close(logfd);
    int refused = cfx_test_file_contains(path, "refused shm peer");
    unlink(path);
    cr_assert(WIFEXITED(wst), "the other user's node died");
    cr_assert_neq(WEXITSTATUS(wst), 20, "the child could not become nobody");
    cr_assert_eq(WEXITSTATUS(wst), 0, "the other user's node did not get the object "
                 "(child exit %d: 21 join, 22 get, 23 bytes)", WEXITSTATUS(wst));
    cr_assert(refused, "shm was not tried, so the test proves nothing");
}

/* CFX_MAX_PEER_CONNS: a node takes that many authenticated peers'
 * connections (of any node ids), and refuses one more, saying so. */
Test(dp_auth_capped, authenticated_connections_are_capped)
{
    struct raw r[3];
    for (int i = 0; i < 2; i++) {
        raw_open(&r[i]);
        cr_assert(raw_authenticate(&r[i]), "connection %d was not authenticated", i);
    }
    raw_open(&r[2]);
    cr_assert(!raw_authenticate(&r[2]), "a connection past CFX_MAX_PEER_CONNS was taken");
    cr_assert(r[2].closed, "a connection past CFX_MAX_PEER_CONNS was kept");
    for (int i = 0; i < 2; i++) {
        raw_poll(&r[i], 0);
        cr_assert(!r[i].closed, "connection %d was closed", i);
    }
    for (int i = 0; i < 3; i++)
        raw_close(&r[i]);
    cr_assert(cfx_test_file_contains(logpath, "the most it takes (CFX_MAX_PEER_CONNS)"),
              "the refusal was not logged");
}

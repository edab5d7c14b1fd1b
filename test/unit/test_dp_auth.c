/*
 * Data-plane authentication: a raw peer opens a tcp transport iface of its
 * own (it could not join the coordinator without the token) and connects
 * straight to a node's advertised data-plane address.  Without a valid
 * cluster-token proof it gets no byte of an object and is closed, and the
 * node logs the refusal with the peer's address but never the token.  The
 * same raw peer with the right token is served, so the test is not vacuous.
 */
#include <criterion/criterion.h>

#include <endian.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/auth.h"
#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "dataplane/tcp/tcp.h"
#include "testutil.h"

#define OBJ_SIZE (1u << 20)
#define CHUNK    (64u * 1024)

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];
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

    cr_assert_eq(cfx_test_coord_start(NULL, &coord, token, sizeof(token), coord_addr,
                                      sizeof(coord_addr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = coord_addr,
        .token = token,
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
    cfx__coord_stop(coord);
    free(src);
    cr_expect(!cfx_test_file_contains(logpath, token), "the token appears in the log");
    unlink(logpath);
}

TestSuite(dp_auth, .init = setup, .fini = teardown, .timeout = 60);

struct raw {
    const struct cfx_transport_ops *ops;
    struct cfx_tp_iface *iface;
    struct cfx_tp_ep *ep;
    struct cfx_tp_mr *mr;
    uint8_t *dst;
    int writes;          /* WRITE_IMM completions seen */
    int closed;          /* EP_ERROR seen */
    int got_auth;        /* the node's AUTH arrived */
    struct cfx_dp_auth auth;
};

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
                                   .shm_fd = -1 };
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
            else if (c[i].type == CFX_TP_COMP_RECV &&
                     cfx__dp_msg_check(c[i].data, c[i].len) == CFX_DP_AUTH) {
                memcpy(&r->auth, c[i].data, sizeof(r->auth));
                r->got_auth = 1;
            }
        }
        if (!n)
            usleep(1000);
    }
}

static void raw_send(struct raw *r, const void *m, size_t len)
{
    int rc;
    while ((rc = r->ops->ep_send(r->ep, m, len, 0)) == CFX_ERR_AGAIN)
        raw_poll(r, 1);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_strerror(rc));
}

static void send_hello(struct raw *r, uint8_t nonce[CFX_DP_NONCE_LEN])
{
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = 4242,
    };
    cfx__auth_nonce(nonce, CFX_DP_NONCE_LEN);
    memcpy(h.nonce, nonce, CFX_DP_NONCE_LEN);
    raw_send(r, &h, sizeof(h));
}

static void send_auth(struct raw *r, const char *tok, const uint8_t nonce[CFX_DP_NONCE_LEN])
{
    struct cfx_dp_auth a = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_AUTH },
    };
    memcpy(a.nonce, r->auth.nonce, sizeof(a.nonce));
    cr_assert_eq(cfx__auth_mac(tok, CFX_AUTH_DP_CONNECT, r->auth.nonce, nonce, a.mac), CFX_OK);
    raw_send(r, &a, sizeof(a));
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
    send_hello(&r, nonce);
    raw_poll(&r, 200);
    for (int i = 0; i < 50 && !r.got_auth; i++)
        raw_poll(&r, 100);
    cr_assert(r.got_auth, "the node did not answer HELLO with its proof");
    /* the node proved the real token; we cannot check it without the token */
    cr_assert_neq(cfx__auth_verify(wrong, CFX_AUTH_DP_ACCEPT, r.auth.nonce, nonce, r.auth.mac),
                  CFX_OK);
    send_auth(&r, wrong, nonce);
    send_get(&r);
    raw_poll(&r, 3000);
    cr_assert(r.closed, "a peer with the wrong token was not closed");
    cr_assert_eq(r.writes, 0);
    cr_assert(all_zero(r.dst, OBJ_SIZE), "object bytes reached a peer with the wrong token");
    raw_close(&r);
    cr_assert(cfx_test_file_contains(logpath, "does not prove the cluster token"),
              "refusal not logged");
    cr_assert(!cfx_test_file_contains(logpath, wrong), "the wrong token appears in the log");
}

Test(dp_auth, replayed_proof_is_refused)
{
    /* A proof recorded on one connection does not open another: the node's
     * nonce is fresh per connection. */
    struct raw r1, r2;
    uint8_t n1[CFX_DP_NONCE_LEN], n2[CFX_DP_NONCE_LEN];
    raw_open(&r1);
    send_hello(&r1, n1);
    for (int i = 0; i < 50 && !r1.got_auth; i++)
        raw_poll(&r1, 100);
    cr_assert(r1.got_auth);
    struct cfx_dp_auth proof = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_AUTH },
    };
    memcpy(proof.nonce, r1.auth.nonce, sizeof(proof.nonce));
    cfx__auth_mac(token, CFX_AUTH_DP_CONNECT, r1.auth.nonce, n1, proof.mac);
    raw_close(&r1);

    raw_open(&r2);
    memcpy(n2, n1, sizeof(n2));
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = 4242,
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
    send_hello(&r, nonce);
    for (int i = 0; i < 50 && !r.got_auth; i++)
        raw_poll(&r, 100);
    cr_assert(r.got_auth);
    cr_assert_eq(cfx__auth_verify(token, CFX_AUTH_DP_ACCEPT, r.auth.nonce, nonce, r.auth.mac),
                 CFX_OK, "the node's proof does not verify");
    send_auth(&r, token, nonce);
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
    send_hello(&r, nonce);
    for (int i = 0; i < 50 && !r.got_auth; i++)
        raw_poll(&r, 100);
    cr_assert(r.got_auth);
    send_auth(&r, token, nonce);
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

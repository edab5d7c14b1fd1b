/*
 * CFX_SECURE on the control plane (control/ctl_seal.h): nodes and admin
 * clients work end to end with integrity and with encrypt, across a
 * coordinator restart; a client and a coordinator of different modes are
 * refused with CFX_ERR_AUTH naming both; a sealed frame tampered with,
 * replayed or sent plain ends the connection with nothing of it acted upon
 * (and is counted); encrypt keeps payloads off the wire; a tampered reply
 * fails the client's pending call with CFX_ERR_AUTH naming the coordinator.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/auth.h"
#include "control/client.h"
#include "control/coord.h"
#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "testutil.h"

TestSuite(coord_seal, .init = coord_fixture_setup, .fini = coord_fixture_teardown,
          .timeout = 90);

/* The coordinator again, in @p coord_mode, its metrics on; open_node() and
 * open_admin() clients in @p client_mode. */
static void restart(int coord_mode, int client_mode)
{
    cfx__coord_stop(coord);
    caps.secure = coord_mode;
    caps.metrics_addr = "127.0.0.1:0";
    client_secure = client_mode;
    start_coord();
}

/* The value of the sample @p name on the coordinator's /metrics. */
static unsigned long long metric(const char *name)
{
    static char resp[1 << 16];
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons(cfx__coord_metrics_port(coord)),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    cr_assert_eq(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(req) - 1);
    size_t n = 0;
    ssize_t k;
    while (n < sizeof(resp) - 1 && (k = recv(fd, resp + n, sizeof(resp) - 1 - n, 0)) > 0)
        n += (size_t)k;
    close(fd);
    resp[n] = '\0';
    char line[128];
    snprintf(line, sizeof(line), "\n%s ", name);
    const char *p = strstr(resp, line);
    cr_assert_not_null(p, "no %s in:\n%s", name, resp);
    return strtoull(p + strlen(line), NULL, 10);
}

/* Metric @p name is @p want.  Called after the coordinator's visible answer
 * to what it counts (a refusal's reply, a connection closed): it counts
 * before it answers, on the loop thread that also answers the scrape, so
 * one scrape after the answer sees the count. */
static void expect_metric(const char *name, unsigned long long want)
{
    unsigned long long v = metric(name);
    cr_assert_eq(v, want, "%s: %llu, want %llu", name, v, want);
}

/* The same for a count with no answer the test can see: a client that finds
 * the coordinator's mode unlike its own sends its AUTH and gives up without
 * waiting for the refusal.  Nothing announces the count, so this scrapes
 * every 10 ms until it is reached (a limit against hangs only), then
 * asserts it exactly. */
static void await_metric(const char *name, unsigned long long want)
{
    uint64_t t0 = cfx__now_ns();
    while (metric(name) < want && ms_since(t0) < CALL_MS)
        usleep(10000);
    expect_metric(name, want);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 7 + (i >> 8));
}

/* ------------------------------------------------------------------------ */
/* Raw sealed frames                                                         */

/* Encode and seal @p m into @p buf; returns the bytes to send. */
static size_t seal_msg(struct cfx_ctl_seal *sl, const struct cfx_msg *m, uint8_t *buf, size_t cap)
{
    size_t len, wire;
    cr_assert_eq(cfx__msg_encode(m, buf, cap - CFX_SEAL_TAG_LEN, &len), CFX_OK);
    cr_assert_eq(cfx__ctl_seal_frame(sl, buf, len, cap, &wire), CFX_OK);
    return wire;
}

static void send_bytes(int s, const uint8_t *b, size_t n)
{
    cr_assert_eq(send(s, b, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Read one sealed frame, open it and decode it into @p m. */
static int sealed_read(int s, struct cfx_ctl_seal *sl, uint8_t *buf, size_t cap,
                       struct cfx_msg *m)
{
    struct cfx_msg_hdr h;
    size_t len;
    int rc = raw_recv_exact(s, buf, CFX_PROTO_HDR_LEN);
    if (rc != CFX_OK)
        return rc;
    cr_assert_eq(cfx__ctl_hdr_decode(sl, buf, CFX_PROTO_HDR_LEN, &h), CFX_OK);
    cr_assert_leq(CFX_PROTO_HDR_LEN + (size_t)h.payload_len, cap);
    if ((rc = raw_recv_exact(s, buf + CFX_PROTO_HDR_LEN, h.payload_len)) != CFX_OK)
        return rc;
    cr_assert_eq(cfx__ctl_open_frame(sl, buf, CFX_PROTO_HDR_LEN + h.payload_len, &len), CFX_OK);
    return cfx__msg_decode(buf, len, m);
}

/* A raw node connection in @p mode that authenticated and joined. */
static int raw_sealed_node(int mode, struct cfx_ctl_seal *sl, const char *name)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    int s = raw_auth_sealed(CFX_CTL_ROLE_NODE, (uint8_t)mode, sl);
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_JOIN;
    m.req_id = 2;
    snprintf(m.u.join.name, sizeof(m.u.join.name), "%s", name);
    snprintf(m.u.join.host_id, sizeof(m.u.join.host_id), "test-host");
    m.u.join.alive = 1;
    send_bytes(s, buf, seal_msg(sl, &m, buf, sizeof(buf)));
    cr_assert_eq(sealed_read(s, sl, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_JOIN_REPLY, "got %s", cfx__msg_type_name(m.type));
    return s;
}

/* A durable inline put of @p k (so that it would outlive its putter). */
static void put_msg(struct cfx_msg *m, uint8_t k, const uint8_t *data, size_t n, uint64_t req)
{
    memset(m, 0, sizeof(*m));
    m->type = CFX_MSG_OBJ_PUT;
    m->req_id = req;
    memset(m->u.put.id.bytes, k, sizeof(m->u.put.id.bytes));
    m->u.put.size = n;
    m->u.put.chunk_size = 4096;
    m->u.put.has_data = 1;
    m->u.put.durable = 1;
    m->u.put.data = data;
}

/* Whether object @p k is in the directory, asked by a sealed admin client. */
static bool listed(uint8_t k)
{
    struct cfx_object_id id;
    struct cfx_ctl_obj_rec *objs = NULL;
    size_t n = 0;
    memset(id.bytes, k, sizeof(id.bytes));
    struct cfx_ctl *c = open_admin();
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    bool found = find_obj(objs, n, &id) != NULL;
    free(objs);
    cfx__ctl_close(c);
    return found;
}

/* ------------------------------------------------------------------------ */
/* A relay between a client and the coordinator that records both ways and
 * can corrupt the tag of the next sealed frame from the coordinator.        */

struct relay {
    int lfd;
    char addr[64];            /* the relay's */
    struct sockaddr_in coord; /* where it relays to */
    pthread_t th;
    pthread_mutex_t mu;
    uint8_t *cap;             /* every byte both ways */
    size_t caplen;
    int tamper;               /* flip the next sealed coordinator frame's tag */
    int stop;
};

static void relay_record(struct relay *r, const uint8_t *b, size_t n)
{
    pthread_mutex_lock(&r->mu);
    uint8_t *p = realloc(r->cap, r->caplen + n);
    cr_assert_not_null(p);
    memcpy(p + r->caplen, b, n);
    r->cap = p;
    r->caplen += n;
    pthread_mutex_unlock(&r->mu);
}

static void *relay_thread(void *arg)
{
    struct relay *r = arg;
    struct pollfd lp = { .fd = r->lfd, .events = POLLIN };
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE) && poll(&lp, 1, 50) == 0)
        ;
    if (__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
        return NULL;
    int cfd = accept(r->lfd, NULL, NULL);
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    if (cfd < 0 || sfd < 0 || connect(sfd, (struct sockaddr *)&r->coord, sizeof(r->coord)) != 0) {
        if (cfd >= 0)
            close(cfd);
        if (sfd >= 0)
            close(sfd);
        return NULL; /* the client's open then fails: the test says so */
    }
    static uint8_t down[1 << 21]; /* coordinator -> client, whole frames forwarded */
    size_t dlen = 0;
    unsigned frames = 0;
    uint8_t b[1 << 16];
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        struct pollfd p[2] = { { .fd = cfd, .events = POLLIN }, { .fd = sfd, .events = POLLIN } };
        if (poll(p, 2, 50) <= 0)
            continue;
        if (p[0].revents) {
            ssize_t n = recv(cfd, b, sizeof(b), 0);
            if (n <= 0)
                break;
            relay_record(r, b, (size_t)n);
            send(sfd, b, (size_t)n, MSG_NOSIGNAL);
        }
        if (p[1].revents) {
            ssize_t n = recv(sfd, down + dlen, sizeof(down) - dlen, 0);
            if (n <= 0)
                break;
            relay_record(r, down + dlen, (size_t)n);
            dlen += (size_t)n;
            for (;;) {
                if (dlen < CFX_PROTO_HDR_LEN)
                    break;
                size_t flen = CFX_PROTO_HDR_LEN + ((size_t)down[4] | ((size_t)down[5] << 8) |
                                                   ((size_t)down[6] << 16) |
                                                   ((size_t)down[7] << 24));
                if (dlen < flen)
                    break;
                /* frames 0 and 1 are CHALLENGE and AUTH_OK (plain) */
                if (frames++ >= 2 && __atomic_exchange_n(&r->tamper, 0, __ATOMIC_ACQ_REL))
                    down[flen - 1] ^= 0x01;
                send(cfd, down, flen, MSG_NOSIGNAL);
                memmove(down, down + flen, dlen - flen);
                dlen -= flen;
            }
        }
    }
    close(cfd);
    close(sfd);
    return NULL;
}

static void relay_start(struct relay *r)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    cr_assert_eq(cfx__parse_hostport(addr, &r->coord), CFX_OK);
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(r->lfd, 1), 0);
    getsockname(r->lfd, (struct sockaddr *)&sa, &sl);
    snprintf(r->addr, sizeof(r->addr), "127.0.0.1:%u", ntohs(sa.sin_port));
    cr_assert_eq(pthread_create(&r->th, NULL, relay_thread, r), 0);
}

static void relay_stop(struct relay *r)
{
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    pthread_join(r->th, NULL);
    close(r->lfd);
}

static bool captured(struct relay *r, const void *needle, size_t n)
{
    pthread_mutex_lock(&r->mu);
    bool found = memmem(r->cap, r->caplen, needle, n) != NULL;
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* ------------------------------------------------------------------------ */
/* End to end                                                                */

/* Two nodes and an admin client in @p mode: join, an inline put looked up
 * by the other node byte for byte, listings and status; then the
 * coordinator restarts on its port and the nodes reconnect (a fresh
 * handshake, fresh keys) and do it again. */
static void end_to_end(int mode)
{
    static uint8_t data[2][CFX_OBJECT_INLINE_MAX];
    restart(mode, mode);
    struct cfx_ctl *a = open_node("seal-a", NULL), *b = open_node("seal-b", NULL);
    struct cfx_ctl *adm = open_admin();

    for (int round = 0; round < 2; round++) {
        struct cfx_object_id id;
        struct cfx_ctl_source src;
        char name[32];
        snprintf(name, sizeof(name), "sealed-%d", round);
        make_id(&id, name);
        fill(data[round], sizeof(data[round]), (uint8_t)(round + 3));
        int rc = cfx__ctl_obj_put(a, &id, sizeof(data[round]), 4096, data[round],
                                  cfx__deadline_ns(CALL_MS));
        cr_assert_eq(rc, CFX_OK, "put: %s", cfx_last_error());
        rc = cfx__ctl_obj_lookup_now(b, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src);
        cr_assert_eq(rc, CFX_OK, "lookup: %s", cfx_last_error());
        cr_assert_eq(src.is_inline, 1);
        cr_assert_eq(src.size, sizeof(data[round]));
        cr_assert_arr_eq(src.data, data[round], sizeof(data[round]));
        free(src.data);
        if (round == 1) {
            /* a node's call waits while its client reconnects, which counts
             * the reconnection before it lets calls through: after the put
             * and the lookup each node has reconnected, once */
            cr_assert_eq(cfx__ctl_reconnects(a), 1);
            cr_assert_eq(cfx__ctl_reconnects(b), 1);
        }

        if (round == 1) /* the admin client does not reconnect: a new one */
            adm = open_admin();
        struct cfx_ctl_obj_rec *objs = NULL;
        struct cfx_node_rec *nodes = NULL;
        size_t nobj = 0, nnode = 0;
        cr_assert_eq(cfx__ctl_objects(adm, &objs, &nobj, cfx__deadline_ns(CALL_MS)), CFX_OK);
        const struct cfx_ctl_obj_rec *o = find_obj(objs, nobj, &id);
        cr_assert_not_null(o);
        cr_assert_eq(o->size, sizeof(data[round]));
        cr_assert_eq(o->is_inline, 1);
        cr_assert_eq(cfx__ctl_nodes(adm, &nodes, &nnode, cfx__deadline_ns(CALL_MS)), CFX_OK);
        int seen = 0;
        for (size_t i = 0; i < nnode; i++)
            seen += nodes[i].alive && (!strcmp(nodes[i].name, "seal-a") ||
                                       !strcmp(nodes[i].name, "seal-b"));
        cr_assert_eq(seen, 2);
        struct cfx_ctl_status st;
        cr_assert_eq(cfx__ctl_status(adm, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
        cr_assert_eq(st.proto_version, CFX_PROTO_VERSION);
        cr_assert_eq(st.nodes_alive, 2);
        free(objs);
        free(nodes);
        cfx__ctl_close(adm);
        cr_assert_eq(metric("conflux_coord_seal_failures_total"), 0);
        cr_assert_eq(metric("conflux_coord_secure_refused_total"), 0);
        if (round == 1)
            break;

        /* restart on the same port: both nodes reconnect and rejoin (the
         * next round's put and lookup wait for that, see below) */
        caps.port = cfx__coord_port(coord);
        cfx__coord_stop(coord);
        start_coord();
    }
    cfx__ctl_close(a);
    cfx__ctl_close(b);
}

Test(coord_seal, end_to_end_integrity) { end_to_end(CFX_SEAL_INTEGRITY); }
Test(coord_seal, end_to_end_encrypt) { end_to_end(CFX_SEAL_ENCRYPT); }

/* ------------------------------------------------------------------------ */
/* Mode negotiation                                                          */

Test(coord_seal, mode_mismatch_is_refused_both_ways)
{
    static const int pairs[][2] = { { CFX_SEAL_ENCRYPT, CFX_SEAL_OFF },
                                    { CFX_SEAL_OFF, CFX_SEAL_INTEGRITY },
                                    { CFX_SEAL_INTEGRITY, CFX_SEAL_ENCRYPT } };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        restart(pairs[i][0], pairs[i][1]);
        char want[160];
        snprintf(want, sizeof(want), "the coordinator %s runs with CFX_SECURE=%s, this client "
                 "with %s", addr, cfx__seal_mode_name(pairs[i][0]),
                 cfx__seal_mode_name(pairs[i][1]));
        struct cfx_ctl *c = NULL;
        int rc = open_node_tok("other-mode", token, NULL, &c);
        cr_assert_eq(rc, CFX_ERR_AUTH, "got %s", cfx_errname(rc));
        cr_assert_null(c);
        cr_assert(strstr(cfx_last_error(), want), "detail: %s", cfx_last_error());
        struct cfx_ctl_params p = { .coord = addr, .token = token, .role = CFX_CTL_ROLE_ADMIN,
                                    .timeout_ms = CALL_MS, .secure = pairs[i][1] };
        rc = cfx__ctl_open(&p, &c);
        cr_assert_eq(rc, CFX_ERR_AUTH, "got %s", cfx_errname(rc));
        cr_assert(strstr(cfx_last_error(), want), "detail: %s", cfx_last_error());
        /* the clients' AUTH (their mode under the MAC) reached the
         * coordinator, which refused them too */
        await_metric("conflux_coord_secure_refused_total", 2);

        /* the coordinator's side: a client that ignores the CHALLENGE's mode */
        static uint8_t buf[1 << 16];
        struct cfx_msg m;
        uint8_t snonce[CFX_AUTH_NONCE_LEN];
        struct cfx_msg r;
        int s = raw_auth_claiming(CFX_CTL_ROLE_NODE, pairs[i][0], pairs[i][1], pairs[i][1],
                                  snonce, &r);
        cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_ERROR);
        cr_assert_eq(m.u.error.status, CFX_ERR_AUTH);
        cr_assert(strstr(m.u.error.text, want), "text: %s", m.u.error.text);
        cr_assert_geq(wait_closed(s, CALL_MS), 0);
        close(s);
        expect_metric("conflux_coord_secure_refused_total", 3);

        /* the mode is under the MAC: a proof made for another mode, sent
         * claiming the coordinator's, is refused as a wrong proof */
        s = raw_auth_claiming(CFX_CTL_ROLE_NODE, pairs[i][0], pairs[i][0], pairs[i][1], snonce, &r);
        cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_ERROR);
        cr_assert_eq(m.u.error.status, CFX_ERR_AUTH);
        cr_assert(strstr(m.u.error.text, "refused the cluster token"), "%s", m.u.error.text);
        close(s);

        /* a client of the coordinator's mode is taken: not vacuous */
        client_secure = pairs[i][0];
        cfx__ctl_close(open_node("same-mode", NULL));
    }
}

/* ------------------------------------------------------------------------ */
/* Tampering                                                                 */

/* The coordinator took a @p what frame on @p s as a seal failure: it closed
 * the connection and counts @p failures in all. */
static void refused(int s, struct cfx_ctl_seal *sl, const char *what, unsigned failures)
{
    cr_assert_geq(wait_closed(s, CALL_MS), 0, "the %s frame was taken", what);
    close(s);
    cfx__ctl_seal_stop(sl);
    expect_metric("conflux_coord_seal_failures_total", failures);
}

static void tampering(int mode)
{
    char dir[] = "/tmp/cfx-coord-seal-XXXXXX";
    static uint8_t buf[1 << 17], copy[1 << 17];
    uint8_t data[1000];
    struct cfx_ctl_seal sl;
    struct cfx_msg m;
    cr_assert_not_null(mkdtemp(dir));
    /* durable puts: one acted upon is a record written to the state
     * directory (and its removal another when its putter dies, which the
     * refusal brings: the listing alone cannot show that nothing was put) */
    caps.state_dir = dir;
    restart(mode, mode);
    fill(data, sizeof(data), 9);
    const char *const writes = "conflux_coord_state_writes_total";

    /* one payload bit flipped */
    int s = raw_sealed_node(mode, &sl, "flipper");
    unsigned long long w0 = metric(writes);
    put_msg(&m, 0x61, data, sizeof(data), 3);
    size_t n = seal_msg(&sl, &m, buf, sizeof(buf));
    buf[CFX_PROTO_HDR_LEN + 30] ^= 0x04;
    send_bytes(s, buf, n);
    refused(s, &sl, "tampered", 1);
    cr_assert_not(listed(0x61));
    expect_metric(writes, w0);

    /* a frame replayed: put, delete, the put's bytes again */
    s = raw_sealed_node(mode, &sl, "replayer");
    put_msg(&m, 0x62, data, sizeof(data), 3);
    n = seal_msg(&sl, &m, buf, sizeof(buf));
    memcpy(copy, buf, n);
    send_bytes(s, buf, n);
    cr_assert_eq(sealed_read(s, &sl, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_OK, "put: %s", m.type == CFX_MSG_ERROR ? m.u.error.text : "");
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_DELETE;
    m.req_id = 4;
    memset(m.u.del.id.bytes, 0x62, sizeof(m.u.del.id.bytes));
    send_bytes(s, buf, seal_msg(&sl, &m, buf, sizeof(buf)));
    cr_assert_eq(sealed_read(s, &sl, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_OK);
    w0 = metric(writes);
    send_bytes(s, copy, n);
    refused(s, &sl, "replayed", 2);
    cr_assert_not(listed(0x62));
    expect_metric(writes, w0);

    /* a plain frame after AUTH_OK, and a plain one too short for a tag */
    for (int k = 0; k < 2; k++) {
        s = raw_sealed_node(mode, &sl, "plain");
        w0 = metric(writes);
        if (k == 0) {
            put_msg(&m, 0x63, data, sizeof(data), 3);
        } else {
            memset(&m, 0, sizeof(m));
            m.type = CFX_MSG_STATUS;
            m.req_id = 3;
        }
        raw_send(s, &m);
        refused(s, &sl, "plain", 3 + (unsigned)k);
        expect_metric(writes, w0);
    }
    cr_assert_not(listed(0x63));

    /* and a well-sealed put is taken (not vacuous): listed and recorded
     * while its putter lives (its death takes it: putter gone for good) */
    s = raw_sealed_node(mode, &sl, "honest");
    w0 = metric(writes);
    put_msg(&m, 0x64, data, sizeof(data), 3);
    send_bytes(s, buf, seal_msg(&sl, &m, buf, sizeof(buf)));
    cr_assert_eq(sealed_read(s, &sl, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_OK);
    cr_assert(listed(0x64));
    cr_assert_gt(metric(writes), w0);
    close(s);
    cfx__ctl_seal_stop(&sl);
    cfx__coord_stop(coord);
    caps.state_dir = NULL;
    rm_state_dir(dir);
    start_coord();
}

Test(coord_seal, tampered_replayed_or_plain_frame_closes_integrity)
{
    tampering(CFX_SEAL_INTEGRITY);
}

Test(coord_seal, tampered_replayed_or_plain_frame_closes_encrypt)
{
    tampering(CFX_SEAL_ENCRYPT);
}

/* A reply tampered with on the way: the pending call fails with
 * CFX_ERR_AUTH naming the coordinator (as the client knows it). */
Test(coord_seal, tampered_reply_fails_the_call)
{
    struct relay r;
    struct cfx_ctl *c = NULL;
    struct cfx_ctl_status st;
    restart(CFX_SEAL_INTEGRITY, CFX_SEAL_INTEGRITY);
    relay_start(&r);
    struct cfx_ctl_params p = { .coord = r.addr, .token = token, .role = CFX_CTL_ROLE_ADMIN,
                                .timeout_ms = CALL_MS, .secure = CFX_SEAL_INTEGRITY };
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_status(c, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    __atomic_store_n(&r.tamper, 1, __ATOMIC_RELEASE);
    int rc = cfx__ctl_status(c, &st, cfx__deadline_ns(CALL_MS));
    cr_assert_eq(rc, CFX_ERR_AUTH, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), r.addr), "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "CFX_SECURE"), "%s", cfx_last_error());
    cfx__ctl_close(c);
    relay_stop(&r);
    free(r.cap);
}

/* ------------------------------------------------------------------------ */
/* Confidentiality                                                           */

/* A node through a recording relay: its name (JOIN, NODE_REPLY) and an
 * inline object's bytes (OBJ_PUT, LOOKUP_REPLY) are on the wire in off and
 * integrity (the capture works), never in encrypt. */
Test(coord_seal, encrypt_keeps_payloads_off_the_wire)
{
    static const char name[] = "node-SECRET-NAME-4711";
    static const char marker[] = "INLINE-SECRET-MARKER-0123456789";
    static const int modes[] = { CFX_SEAL_OFF, CFX_SEAL_INTEGRITY, CFX_SEAL_ENCRYPT };
    uint8_t data[4096];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)marker[i % (sizeof(marker) - 1)];

    for (size_t i = 0; i < 3; i++) {
        struct relay r;
        struct cfx_object_id id;
        struct cfx_ctl_source src;
        char saved[64];
        restart(modes[i], modes[i]);
        relay_start(&r);
        snprintf(saved, sizeof(saved), "%s", addr);
        snprintf(addr, sizeof(addr), "%s", r.addr);
        struct cfx_ctl *c = open_node(name, NULL);
        snprintf(addr, sizeof(addr), "%s", saved);
        make_id(&id, "wire");
        cr_assert_eq(cfx__ctl_obj_put(c, &id, sizeof(data), 4096, data,
                                      cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(cfx__ctl_obj_lookup_now(c, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                     CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(src.is_inline, 1);
        cr_assert_arr_eq(src.data, data, sizeof(data));
        free(src.data);
        struct cfx_node_rec rec;
        cr_assert_eq(cfx__ctl_node_get(c, cfx__ctl_node_id(c), &rec, cfx__deadline_ns(CALL_MS)),
                     CFX_OK);
        cr_assert_str_eq(rec.name, name);
        cfx__ctl_close(c);
        relay_stop(&r);
        bool clear = modes[i] != CFX_SEAL_ENCRYPT;
        cr_assert_eq(captured(&r, name, strlen(name)), clear, "mode %s: name %s on the wire",
                     cfx__seal_mode_name(modes[i]), clear ? "not" : "");
        cr_assert_eq(captured(&r, marker, strlen(marker)), clear,
                     "mode %s: inline bytes %s on the wire", cfx__seal_mode_name(modes[i]),
                     clear ? "not" : "");
        free(r.cap);
    }
}

/* The handshake frames carry the modes; a mode out of range is refused by
 * the codec both ways. */
Test(coord_seal, unknown_mode_is_refused_by_the_codec)
{
    struct cfx_msg m, d;
    uint8_t buf[256];
    size_t len;
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_CHALLENGE;
    m.u.challenge.secure = 3;
    cr_assert_eq(cfx__msg_encode(&m, buf, sizeof(buf), &len), CFX_ERR_INVALID);
    m.u.challenge.secure = CFX_SEAL_ENCRYPT;
    cr_assert_eq(cfx__msg_encode(&m, buf, sizeof(buf), &len), CFX_OK);
    buf[len - 1] = 3; /* the mode is the last byte */
    cr_assert_eq(cfx__msg_decode(buf, len, &d), CFX_ERR_PROTO);
    buf[len - 1] = CFX_SEAL_INTEGRITY;
    cr_assert_eq(cfx__msg_decode(buf, len, &d), CFX_OK);
    cr_assert_eq(d.u.challenge.secure, CFX_SEAL_INTEGRITY);
}

/* The coordinator rank 0 hosts (MASTER_ADDR) takes the context's
 * CFX_SECURE: ranks of that mode put and get an inline object through it
 * byte for byte; a client with another mode is refused naming both. */
Test(coord_seal, rank0_hosted_coordinator_seals)
{
    struct cfx_context *a = NULL, *b = NULL;
    struct cfx_object_id id;
    char port[16], hosted[64];
    uint8_t src[3000], dst[3000];
    size_t got = 0;
    int p = cfx_test_free_port();
    cr_assert_gt(p, 0);
    snprintf(port, sizeof(port), "%d", p);
    snprintf(hosted, sizeof(hosted), "127.0.0.1:%d", p);
    unsetenv("CFX_COORD");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("CFX_COORD_PORT", port, 1);
    setenv("CFX_SECURE", "encrypt", 1);
    setenv("RANK", "0", 1);
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT | CFX_CTX_PARAM_TRANSPORTS,
        .token = token, .timeout_ms = CALL_MS, .transports = "shm",
    };
    cr_assert_eq(cfx_context_create(&cp, &a), CFX_OK, "%s", cfx_last_error());
    setenv("RANK", "1", 1);
    cr_assert_eq(cfx_context_create(&cp, &b), CFX_OK, "%s", cfx_last_error());
    cfx_test_fill(src, sizeof(src), 11);
    cfx_object_id_generate(a, &id);
    cr_assert_eq(cfx_put(a, &id, src, sizeof(src), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &id, dst, sizeof(dst), &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, sizeof(src));
    cr_assert_arr_eq(dst, src, sizeof(src));

    struct cfx_ctl *c = NULL;
    struct cfx_ctl_params ap = { .coord = hosted, .token = token, .role = CFX_CTL_ROLE_ADMIN,
                                 .timeout_ms = CALL_MS, .secure = CFX_SEAL_OFF };
    cr_assert_eq(cfx__ctl_open(&ap, &c), CFX_ERR_AUTH);
    char want[192];
    snprintf(want, sizeof(want), "the coordinator %s runs with CFX_SECURE=encrypt, this client "
             "with off", hosted);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    ap.secure = CFX_SEAL_ENCRYPT;
    cr_assert_eq(cfx__ctl_open(&ap, &c), CFX_OK, "%s", cfx_last_error());
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(c, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_alive, 2);
    cfx__ctl_close(c);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* Both planes sealed end to end, as a user sets it up: contexts given
 * secure = "encrypt" join a coordinator of that mode and move an object
 * over the data plane (tcp, beyond the inline limit) byte for byte, no
 * record refused; the effective configuration says so; a context of
 * another mode is refused by the coordinator, naming both. */
Test(coord_seal, contexts_seal_both_planes)
{
    struct cfx_context *a = NULL, *b = NULL, *c = NULL;
    struct cfx_object_id id;
    struct cfx_context_stats st;
    const size_t n = 2u << 20;
    size_t got = 0;
    char cfg[2048];
    restart(CFX_SEAL_ENCRYPT, CFX_SEAL_ENCRYPT);
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS | CFX_CTX_PARAM_SECURE,
        .coord = addr, .token = token, .timeout_ms = CALL_MS, .transports = "tcp",
        .secure = "encrypt",
    };
    cr_assert_eq(cfx_context_create(&cp, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_context_create(&cp, &b), CFX_OK, "%s", cfx_last_error());
    cr_assert_gt(cfx_context_config(a, cfg, sizeof(cfg)), 0);
    cr_assert(strstr(cfg, "secure = encrypt\n"), "%s", cfg);
    uint8_t *src = malloc(n), *dst = malloc(n);
    cfx_test_fill(src, n, 5);
    cfx_object_id_generate(a, &id);
    cr_assert_eq(cfx_put(a, &id, src, n, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &id, dst, n, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, n);
    cr_assert_eq(cfx_test_check(dst, n, 5), (size_t)-1, "the object changed on the way");
    cr_assert_eq(cfx_context_stats(b, &st), CFX_OK);
    cr_assert_eq(st.gets, 1, "the get did not use the data plane");
    cr_assert_eq(st.records_refused, 0);

    cp.secure = "off";
    cr_assert_eq(cfx_context_create(&cp, &c), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "CFX_SECURE=encrypt, this client with off"), "%s",
              cfx_last_error());
    cp.secure = "bogus";
    cr_assert_eq(cfx_context_create(&cp, &c), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "secure parameter 'bogus': expected 0/off/no, "
                     "1/on/yes/encrypt or integrity"),
              "a bad parameter must be named as the parameter, with every word taken: %s",
              cfx_last_error());
    /* so is the variable (yes and no are taken, as their words say) */
    setenv("CFX_SECURE", "bogus", 1);
    cp.field_mask &= ~CFX_CTX_PARAM_SECURE;
    cr_assert_eq(cfx_context_create(&cp, &c), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "CFX_SECURE=bogus: expected 0/off/no, "
                     "1/on/yes/encrypt or integrity"), "%s", cfx_last_error());
    unsetenv("CFX_SECURE");
    free(src);
    free(dst);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* ---- a coordinator whose timings are out of range ------------------------------- */

/* A coordinator that holds the token (so it passes the client's check of
 * its proof) and answers JOIN with @p hb and @p dead.  A dead-after time of
 * 2^31 ms turned negative in the client's (int) deadline, which means "no
 * deadline": its heartbeat send then blocked for ever under the send lock,
 * and every later call and the close with it. */
struct fake_coord {
    int ls;
    uint32_t hb, dead;
};

static void *fake_coord_run(void *arg)
{
    struct fake_coord *f = arg;
    uint8_t buf[8192];
    struct cfx_msg m, r;
    int s = accept(f->ls, NULL, NULL);
    cr_assert_geq(s, 0);
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_CHALLENGE;
    cr_assert_eq(cfx__auth_nonce(r.u.challenge.nonce, sizeof(r.u.challenge.nonce)), CFX_OK);
    uint8_t snonce[CFX_AUTH_NONCE_LEN], bind[CFX_CTL_BIND_LEN];
    memcpy(snonce, r.u.challenge.nonce, sizeof(snonce));
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_AUTH, "%s", cfx__msg_type_name(m.type));
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_AUTH_OK;
    r.req_id = m.req_id;
    cfx__ctl_auth_bind(m.u.auth.role, m.u.auth.secure, bind);
    cr_assert_eq(cfx__auth_mac_bound(token, CFX_AUTH_COORD, snonce, m.u.auth.nonce, bind,
                                     sizeof(bind), r.u.auth_ok.mac),
                 CFX_OK);
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_JOIN, "%s", cfx__msg_type_name(m.type));
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_JOIN_REPLY;
    r.req_id = m.req_id;
    r.u.join_reply.node_id = 7;
    r.u.join_reply.heartbeat_ms = f->hb;
    r.u.join_reply.dead_after_ms = f->dead;
    raw_send(s, &r);
    /* read nothing more: the client closes once it refused the answer */
    cr_assert_geq(wait_closed(s, CALL_MS), 0, "the client kept the connection");
    close(s);
    return NULL;
}

Test(coord_seal, client_refuses_a_coordinators_timings_out_of_range, .timeout = 60)
{
    static const uint32_t cases[][2] = {
        { 1, 1u << 31 },               /* turned "no deadline" */
        { 0, 1500 },                   /* no heartbeat at all */
        { 4000000000u, 4000000001u },  /* both out of range */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fake_coord f = { .hb = cases[i][0], .dead = cases[i][1] };
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t sl = sizeof(sa);
        f.ls = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(f.ls, 0);
        cr_assert_eq(bind(f.ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
        cr_assert_eq(listen(f.ls, 1), 0);
        cr_assert_eq(getsockname(f.ls, (struct sockaddr *)&sa, &sl), 0);
        char real[64], fake[64];
        snprintf(real, sizeof(real), "%s", addr);
        snprintf(fake, sizeof(fake), "127.0.0.1:%u", ntohs(sa.sin_port));
        snprintf(addr, sizeof(addr), "%s", fake);
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, fake_coord_run, &f), 0);
        struct cfx_ctl *ctl = NULL;
        int rc = open_node_tok("timings", token, NULL, &ctl);
        snprintf(addr, sizeof(addr), "%s", real);
        cr_assert_eq(rc, CFX_ERR_PROTO, "case %zu: got %s: %s", i, cfx_errname(rc),
                     cfx_last_error());
        const char *want = i == 1 ? "heartbeat interval 0"
                                  : "heartbeat or dead-after time above 3600000 ms";
        cr_assert(strstr(cfx_last_error(), want), "case %zu: %s", i, cfx_last_error());
        cr_assert(strstr(cfx_last_error(), fake), "the coordinator is not named: %s",
                  cfx_last_error());
        cr_assert_null(ctl);
        pthread_join(t, NULL);
        close(f.ls);
    }
}

/* A coordinator's own timings are held to the same range. */
Test(coord_seal, coordinator_refuses_timings_out_of_range)
{
    struct cfx_coord *c = NULL;
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token,
                                  .heartbeat_ms = 100, .dead_after_ms = 3600001 };
    cr_assert_eq(cfx__coord_start(&p, &c), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "must be at most 3600000 ms"), "%s", cfx_last_error());
    cr_assert_null(c);
}

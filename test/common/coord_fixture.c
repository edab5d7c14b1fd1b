/* The in-process coordinator fixture of the coordinator tests (test_coord,
 * test_coord_dir): see coord_fixture.h. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/auth.h"
#include "control/client.h"
#include "control/coord.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "testutil.h"

struct cfx_coord *coord;
char token[64];
char addr[64];

static void on_dead(void *arg, uint32_t id)
{
    struct deaths *d = arg;
    pthread_mutex_lock(&d->mu);
    if (d->n < 256) {
        d->ids[d->n] = id;
        d->when_ns[d->n] = cfx__now_ns();
        d->n++;
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void on_left(void *arg, uint32_t id)
{
    struct deaths *d = arg;
    pthread_mutex_lock(&d->mu);
    if (d->nleft < 256)
        d->left[d->nleft++] = id;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void deaths_init(struct deaths *d)
{
    pthread_condattr_t a;
    memset(d, 0, sizeof(*d));
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* cfx__now_ns()'s clock: deadlines */
    pthread_cond_init(&d->cv, &a);
    pthread_condattr_destroy(&a);
}

/* ns timestamp when @p id was reported dead, waiting up to @p ms; 0 if not. */
uint64_t wait_dead(struct deaths *d, uint32_t id, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms), t = 0;
    int seen = 0; /* events already looked at */
    pthread_mutex_lock(&d->mu);
    do {
        for (; seen < d->n && !t; seen++)
            if (d->ids[seen] == id)
                t = d->when_ns[seen];
    } while (!t && cfx__cond_wait_until(&d->cv, &d->mu, deadline));
    pthread_mutex_unlock(&d->mu);
    return t;
}

int wait_heard(struct deaths *d, uint32_t id, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    int heard = 0;
    pthread_mutex_lock(&d->mu);
    do {
        for (int i = 0; i < d->n && !heard; i++)
            if (d->ids[i] == id)
                heard = HEARD_DEAD;
        for (int i = 0; i < d->nleft && !heard; i++)
            if (d->left[i] == id)
                heard = HEARD_LEFT;
    } while (!heard && cfx__cond_wait_until(&d->cv, &d->mu, deadline));
    pthread_mutex_unlock(&d->mu);
    return heard;
}

uint32_t dead_keep_ms;
uint32_t fanout = FANOUT;
uint32_t max_nodes;
struct cfx_coord_params caps;
int client_secure;
const struct cfx_msg_load *node_report;

static void fill_report(void *arg, struct cfx_msg_load *out)
{
    (void)arg;
    *out = *node_report;
}

void start_coord(void)
{
    struct cfx_coord_params p = {
        .bind_addr = "127.0.0.1",
        .port = caps.port, /* 0: any */
        .token = token,
        .heartbeat_ms = HB_MS,
        .dead_after_ms = DEAD_MS,
        .fanout = fanout,
        .auth_timeout_ms = AUTH_MS,
        .stall_timeout_ms = STALL_MS,
        .dead_keep_ms = dead_keep_ms,
        .max_nodes = max_nodes,
        .max_node_objects = caps.max_node_objects,
        .max_node_bytes = caps.max_node_bytes,
        .max_parked = caps.max_parked,
        .max_objects = caps.max_objects,
        .max_unauth_conns = caps.max_unauth_conns,
        .max_unauth_per_ip = caps.max_unauth_per_ip,
        .max_buffered = caps.max_buffered,
        .state_dir = caps.state_dir,
        .test_fsync_delay_ms = caps.test_fsync_delay_ms,
        .secure = caps.secure,
        .metrics_addr = caps.metrics_addr,
    };
    int rc = cfx__coord_start(&p, &coord);
    cr_assert_eq(rc, CFX_OK, "coord start: %s", cfx_last_error());
    cr_assert_neq(cfx__coord_port(coord), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", cfx__coord_port(coord));
    cr_assert_str_eq(cfx__coord_addr(coord), addr);
}

void coord_fixture_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    cfx_test_token(token, sizeof(token));
    start_coord();
}

void coord_fixture_teardown(void)
{
    cfx__coord_stop(coord);
    coord = NULL;
}

int open_node_tok(const char *name, const char *tok, struct deaths *d,
                         struct cfx_ctl **out)
{
    struct cfx_node_rec self;
    memset(&self, 0, sizeof(self));
    snprintf(self.name, sizeof(self.name), "%s", name);
    snprintf(self.host_id, sizeof(self.host_id), "test-host");
    snprintf(self.host, sizeof(self.host), "host-of-%s", name);
    self.pid = (uint32_t)getpid();
    self.naddr = 1;
    snprintf(self.addr[0].tp, sizeof(self.addr[0].tp), "tcp");
    self.addr[0].len = 6;
    memcpy(self.addr[0].addr, "\x7f\x00\x00\x01\x10\x00", 6);
    struct cfx_ctl_params p = {
        .coord = addr,
        .token = tok,
        .role = CFX_CTL_ROLE_NODE,
        .self = &self,
        .timeout_ms = CALL_MS,
        .on_node_dead = d ? on_dead : NULL,
        .on_node_left = d ? on_left : NULL,
        .load_fill = node_report ? fill_report : NULL,
        .arg = d,
        .secure = client_secure,
    };
    return cfx__ctl_open(&p, out);
}

struct cfx_ctl *open_node(const char *name, struct deaths *d)
{
    struct cfx_ctl *c = NULL;
    int rc = open_node_tok(name, token, d, &c);
    cr_assert_eq(rc, CFX_OK, "open %s: %s", name, cfx_last_error());
    cr_assert_neq(cfx__ctl_node_id(c), 0);
    return c;
}

struct cfx_ctl *open_admin(void)
{
    struct cfx_ctl *c = NULL;
    struct cfx_ctl_params p = {
        .coord = addr, .token = token, .role = CFX_CTL_ROLE_ADMIN, .timeout_ms = CALL_MS,
        .secure = client_secure,
    };
    int rc = cfx__ctl_open(&p, &c);
    cr_assert_eq(rc, CFX_OK, "open admin: %s", cfx_last_error());
    cr_assert_eq(cfx__ctl_node_id(c), 0);
    return c;
}

void make_id(struct cfx_object_id *id, const char *name)
{
    memset(id, 0, sizeof(*id));
    snprintf((char *)id->bytes, sizeof(id->bytes), "%s", name);
}

uint64_t ms_since(uint64_t t0)
{
    return (cfx__now_ns() - t0) / 1000000ull;
}

const struct cfx_ctl_obj_rec *find_obj(const struct cfx_ctl_obj_rec *v, size_t n,
                                              const struct cfx_object_id *id)
{
    for (size_t i = 0; i < n; i++)
        if (!memcmp(v[i].id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return &v[i];
    return NULL;
}
void *lookup_thread(void *arg)
{
    struct lookup_job *j = arg;
    if (j->start)
        pthread_barrier_wait(j->start);
    uint64_t t0 = cfx__now_ns();
    j->rc = cfx__ctl_obj_lookup(j->ctl, &j->id, NULL, 0, cfx__deadline_ns(j->timeout_ms),
                                &j->src);
    j->elapsed_ms = ms_since(t0);
    j->end_ns = cfx__now_ns();
    return NULL;
}


int raw_connect(void)
{
    struct sockaddr_in sa;
    cr_assert_eq(cfx__parse_hostport(addr, &sa), CFX_OK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(s, 0);
    cr_assert_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int one = 1; /* a LEAVE then a JOIN: no waiting for the delayed ACK */
    cr_assert_eq(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)), 0);
    return s;
}

/* Read one frame from a raw socket into @p buf (blocking, up to CALL_MS). */
int raw_recv_exact(int s, uint8_t *b, size_t n)
{
    for (size_t have = 0; have < n;) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        if (poll(&p, 1, CALL_MS) <= 0)
            return CFX_ERR_TIMEOUT;
        ssize_t k = recv(s, b + have, n - have, 0);
        if (k <= 0)
            return CFX_ERR_CONNECT;
        have += (size_t)k;
    }
    return CFX_OK;
}

int raw_read_frame(int s, uint8_t *buf, size_t cap, struct cfx_msg *m)
{
    struct cfx_msg_hdr h;
    int rc = raw_recv_exact(s, buf, CFX_PROTO_HDR_LEN);
    if (rc != CFX_OK)
        return rc;
    cr_assert_eq(cfx__msg_hdr_decode(buf, CFX_PROTO_HDR_LEN, &h), CFX_OK);
    cr_assert_leq(CFX_PROTO_HDR_LEN + (size_t)h.payload_len, cap);
    if ((rc = raw_recv_exact(s, buf + CFX_PROTO_HDR_LEN, h.payload_len)) != CFX_OK)
        return rc;
    return cfx__msg_decode(buf, CFX_PROTO_HDR_LEN + h.payload_len, m);
}

void raw_send(int s, const struct cfx_msg *m)
{
    uint8_t buf[4096];
    size_t len;
    cr_assert_eq(cfx__msg_encode(m, buf, sizeof(buf), &len), CFX_OK);
    cr_assert_eq(send(s, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

int raw_auth_claiming(uint8_t role, int coord_mode, int claimed, int mac_mode,
                      uint8_t snonce[CFX_AUTH_NONCE_LEN], struct cfx_msg *auth)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    uint8_t bind[CFX_CTL_BIND_LEN];
    int s = raw_connect();
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    cr_assert_eq(m.u.challenge.secure, coord_mode);
    memcpy(snonce, m.u.challenge.nonce, CFX_AUTH_NONCE_LEN);
    memset(auth, 0, sizeof(*auth));
    auth->type = CFX_MSG_AUTH;
    auth->req_id = 1;
    auth->u.auth.role = role;
    auth->u.auth.secure = (uint8_t)claimed;
    cfx__ctl_auth_bind(role, (uint8_t)mac_mode, bind);
    cfx__auth_nonce(auth->u.auth.nonce, sizeof(auth->u.auth.nonce));
    cfx__auth_mac_bound(token, CFX_AUTH_CLIENT, snonce, auth->u.auth.nonce, bind, sizeof(bind),
                        auth->u.auth.mac);
    raw_send(s, auth);
    return s;
}

/* A raw connection authenticated in @p role with CFX_SECURE @p mode (the
 * coordinator's); @p seal (NULL when off) receives its sealing state. */
int raw_auth_sealed(uint8_t role, uint8_t mode, struct cfx_ctl_seal *seal)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m, r;
    uint8_t snonce[CFX_AUTH_NONCE_LEN], bind[CFX_CTL_BIND_LEN];
    int s = raw_auth_claiming(role, mode, mode, mode, snonce, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_AUTH_OK);
    cr_assert_eq(m.req_id, 1);
    /* Mutual: the coordinator proved it knows the token. */
    cfx__ctl_auth_bind(role, mode, bind);
    cr_assert_eq(cfx__auth_verify_bound(token, CFX_AUTH_COORD, snonce, r.u.auth.nonce, bind,
                                        sizeof(bind), m.u.auth_ok.mac), CFX_OK);
    if (seal) {
        memset(seal, 0, sizeof(*seal));
        cr_assert_eq(cfx__ctl_seal_start(seal, mode, token, snonce, r.u.auth.nonce, role, true),
                     CFX_OK);
    } else {
        cr_assert_eq(mode, CFX_SEAL_OFF);
    }
    return s;
}

int raw_auth_role(uint8_t role)
{
    return raw_auth_sealed(role, CFX_SEAL_OFF, NULL);
}

int raw_auth(void)
{
    return raw_auth_role(CFX_CTL_ROLE_ADMIN);
}

/* JOIN on a raw node connection asking for id @p want (0: none); returns
 * the id given, or the negative status of the ERROR with its text. */
int64_t raw_join(int s, uint32_t want, uint64_t req, char *text, size_t text_len)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m, r;
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_JOIN;
    r.req_id = req;
    r.u.join.node_id = want;
    snprintf(r.u.join.name, sizeof(r.u.join.name), "cycler");
    snprintf(r.u.join.host, sizeof(r.u.join.host), "cycler-host");
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.req_id, req);
    if (m.type == CFX_MSG_ERROR) {
        if (text)
            snprintf(text, text_len, "%s", m.u.error.text);
        return m.u.error.status;
    }
    cr_assert_eq(m.type, CFX_MSG_JOIN_REPLY, "%s", cfx__msg_type_name(m.type));
    return m.u.join_reply.node_id;
}

void raw_leave(int s)
{
    struct cfx_msg r = { .type = CFX_MSG_LEAVE, .req_id = 0 };
    raw_send(s, &r);
}

struct cfx_ctl_status raw_status(int s, uint64_t req)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m, r = { .type = CFX_MSG_STATUS, .req_id = req };
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
    return m.u.status;
}

/* Read the answer to @p req on @p s: 0 for OK, the status of an ERROR (its
 * text into @p text). */
int raw_answer(int s, uint64_t req, char *text, size_t text_len)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.req_id, req, "answer to %llu, not %llu", (unsigned long long)m.req_id,
                 (unsigned long long)req);
    if (m.type == CFX_MSG_ERROR) {
        snprintf(text, text_len, "%s", m.u.error.text);
        return m.u.error.status;
    }
    cr_assert_eq(m.type, CFX_MSG_OK, "%s", cfx__msg_type_name(m.type));
    return 0;
}

/* PUT of object number @p k: inline with @p size bytes, or on the data plane. */
int raw_put(int s, uint8_t k, uint64_t size, bool inl, uint64_t req, char *text,
                   size_t text_len)
{
    static uint8_t data[4096];
    struct cfx_msg r;
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_OBJ_PUT;
    r.req_id = req;
    memset(r.u.put.id.bytes, k, sizeof(r.u.put.id.bytes));
    r.u.put.size = size;
    r.u.put.chunk_size = 65536;
    r.u.put.has_data = inl;
    r.u.put.data = inl ? data : NULL;
    raw_send(s, &r);
    return raw_answer(s, req, text, text_len);
}

void raw_lookup(int s, uint8_t k, uint32_t timeout_ms, uint64_t req)
{
    struct cfx_msg r;
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_OBJ_LOOKUP;
    r.req_id = req;
    memset(r.u.lookup.id.bytes, k, sizeof(r.u.lookup.id.bytes));
    r.u.lookup.timeout_ms = timeout_ms;
    raw_send(s, &r);
}

/* Wait until the peer closes @p s; returns ms waited or -1. */
long wait_closed(int s, int ms)
{
    uint64_t t0 = cfx__now_ns();
    char sink[4096];
    for (;;) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        int left = ms - (int)ms_since(t0);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t n = recv(s, sink, sizeof(sink), 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return (long)ms_since(t0);
    }
}


void rm_state_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    cr_assert_not_null(d);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            cr_assert_eq(unlinkat(dirfd(d), e->d_name, 0), 0, "%s", strerror(errno));
    closedir(d);
    cr_assert_eq(rmdir(dir), 0);
}

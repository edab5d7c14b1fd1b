/* Coordinator + client: an in-process coordinator on 127.0.0.1 and clients. */
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
#include "testutil.h"

#define HB_MS        100
#define DEAD_MS      600
#define FANOUT       2
#define AUTH_MS      2000
#define STALL_MS     1500
#define BIG          (1u << 20)   /* a size that does not travel inline */
#define CALL_MS      20000        /* a call's or a wait's limit: ends only a hang */

static struct cfx_coord *coord;
static char token[64];
static char addr[64];

/* node_dead events seen by one client */
struct deaths {
    pthread_mutex_t mu;
    uint32_t ids[256];
    uint64_t when_ns[256];
    int n;
};

static void on_dead(void *arg, uint32_t id)
{
    struct deaths *d = arg;
    pthread_mutex_lock(&d->mu);
    if (d->n < 256) {
        d->ids[d->n] = id;
        d->when_ns[d->n] = cfx__now_ns();
        d->n++;
    }
    pthread_mutex_unlock(&d->mu);
}

static void deaths_init(struct deaths *d)
{
    memset(d, 0, sizeof(*d));
    pthread_mutex_init(&d->mu, NULL);
}

/* ns timestamp when @p id was reported dead, waiting up to @p ms; 0 if not. */
static uint64_t wait_dead(struct deaths *d, uint32_t id, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        for (int i = 0; i < d->n; i++) {
            if (d->ids[i] == id) {
                uint64_t t = d->when_ns[i];
                pthread_mutex_unlock(&d->mu);
                return t;
            }
        }
        pthread_mutex_unlock(&d->mu);
        if (cfx__now_ns() >= deadline)
            return 0;
        usleep(5000);
    }
}

static uint32_t dead_keep_ms; /* 0: the coordinator's default */
static uint32_t fanout = FANOUT; /* 0: chosen per object */
static uint32_t max_nodes;    /* 0: the coordinator's default */
static struct cfx_coord_params caps; /* max_* fields, 0: the coordinator's defaults */

static void start_coord(void)
{
    struct cfx_coord_params p = {
        .bind_addr = "127.0.0.1",
        .port = 0,
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
        .max_unauth_conns = caps.max_unauth_conns,
        .state_dir = caps.state_dir,
        .test_fsync_delay_ms = caps.test_fsync_delay_ms,
    };
    int rc = cfx__coord_start(&p, &coord);
    cr_assert_eq(rc, CFX_OK, "coord start: %s", cfx_last_error());
    cr_assert_neq(cfx__coord_port(coord), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", cfx__coord_port(coord));
    cr_assert_str_eq(cfx__coord_addr(coord), addr);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    cfx_test_token(token, sizeof(token));
    start_coord();
}

static void teardown(void)
{
    cfx__coord_stop(coord);
    coord = NULL;
}

TestSuite(coord, .init = setup, .fini = teardown, .timeout = 60);

static int open_node_tok(const char *name, const char *tok, struct deaths *d,
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
        .arg = d,
    };
    return cfx__ctl_open(&p, out);
}

static struct cfx_ctl *open_node(const char *name, struct deaths *d)
{
    struct cfx_ctl *c = NULL;
    int rc = open_node_tok(name, token, d, &c);
    cr_assert_eq(rc, CFX_OK, "open %s: %s", name, cfx_last_error());
    cr_assert_neq(cfx__ctl_node_id(c), 0);
    return c;
}

static struct cfx_ctl *open_admin(void)
{
    struct cfx_ctl *c = NULL;
    struct cfx_ctl_params p = {
        .coord = addr, .token = token, .role = CFX_CTL_ROLE_ADMIN, .timeout_ms = CALL_MS,
    };
    int rc = cfx__ctl_open(&p, &c);
    cr_assert_eq(rc, CFX_OK, "open admin: %s", cfx_last_error());
    cr_assert_eq(cfx__ctl_node_id(c), 0);
    return c;
}

static void make_id(struct cfx_object_id *id, const char *name)
{
    memset(id, 0, sizeof(*id));
    snprintf((char *)id->bytes, sizeof(id->bytes), "%s", name);
}

static uint64_t ms_since(uint64_t t0)
{
    return (cfx__now_ns() - t0) / 1000000ull;
}

static const struct cfx_ctl_obj_rec *find_obj(const struct cfx_ctl_obj_rec *v, size_t n,
                                              const struct cfx_object_id *id)
{
    for (size_t i = 0; i < n; i++)
        if (!memcmp(v[i].id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return &v[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */

Test(coord, join_gives_distinct_ids_in_order)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL),
                   *c = open_node("c", NULL);
    cr_assert_eq(cfx__ctl_node_id(a), 1);
    cr_assert_eq(cfx__ctl_node_id(b), 2);
    cr_assert_eq(cfx__ctl_node_id(c), 3);
    cr_assert_eq(cfx__ctl_heartbeat_ms(a), HB_MS);
    cr_assert_eq(cfx__ctl_dead_after_ms(a), DEAD_MS);

    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(a, 2, &rec, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(rec.node_id, 2);
    cr_assert_str_eq(rec.name, "b");
    cr_assert_str_eq(rec.host_id, "test-host");
    cr_assert_eq(rec.alive, 1);
    cr_assert_eq(rec.naddr, 1);
    cr_assert_str_eq(rec.addr[0].tp, "tcp");
    cr_assert(strncmp(rec.ctl_addr, "127.0.0.1:", 10) == 0, "ctl_addr %s", rec.ctl_addr);
    cr_assert_eq(cfx__ctl_node_get(a, 99, &rec, cfx__deadline_ns(CALL_MS)), CFX_ERR_NOT_FOUND);
    cr_assert(strstr(cfx_last_error(), "node 99"), "%s", cfx_last_error());
    cfx__ctl_close(c);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, wrong_token_is_refused)
{
    struct cfx_ctl *c = NULL;
    int rc = open_node_tok("intruder", "not-the-token", NULL, &c);
    cr_assert_eq(rc, CFX_ERR_AUTH, "got %s", cfx_errname(rc));
    cr_assert_null(c);
    char want[128];
    snprintf(want, sizeof(want), "coordinator %s refused the cluster token", addr);
    cr_assert(strstr(cfx_last_error(), want), "detail: %s", cfx_last_error());
    cr_assert_null(strstr(cfx_last_error(), "not-the-token"));
    /* The coordinator is unharmed. */
    struct cfx_ctl *ok = open_node("good", NULL);
    cr_assert_eq(cfx__ctl_node_id(ok), 1);
    cfx__ctl_close(ok);
}

Test(coord, unreachable_coordinator)
{
    struct cfx_ctl *c = NULL;
    char dead[64];
    /* A port nobody listens on: bind, read the port, close. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    getsockname(s, (struct sockaddr *)&sa, &sl);
    close(s);
    snprintf(dead, sizeof(dead), "127.0.0.1:%u", ntohs(sa.sin_port));
    struct cfx_ctl_params p = {
        .coord = dead, .token = token, .role = CFX_CTL_ROLE_ADMIN, .timeout_ms = 2000,
    };
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_CONNECT);
    cr_assert(strstr(cfx_last_error(), dead), "%s", cfx_last_error());
    p.coord = "no-colon";
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_INVALID);
    p.coord = addr;
    p.token = NULL;
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_AUTH);
}

Test(coord, lookup_of_missing_object_times_out_by_its_deadline)
{
    struct cfx_ctl *a = open_node("a", NULL);
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    make_id(&id, "missing");
    uint64_t t0 = cfx__now_ns();
    int rc = cfx__ctl_obj_lookup(a, &id, NULL, 0, cfx__deadline_ns(300), &src);
    uint64_t el = ms_since(t0);
    /* the lookup stays parked until an object comes, so only its own
     * deadline can end it: TIMEOUT, and not before that deadline (how long
     * after it depends on the machine's load and is not checked) */
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s", cfx_errname(rc));
    cr_assert_geq(el, 295, "returned after %llu ms", (unsigned long long)el);
    cr_assert(strstr(cfx_last_error(), "lookup of object 6d697373696e67"), "%s",
              cfx_last_error());
    cr_assert(strstr(cfx_last_error(), addr), "%s", cfx_last_error());

    /* A deadline already past answers TIMEOUT without waiting. */
    rc = cfx__ctl_obj_lookup(a, &id, NULL, 0, cfx__now_ns(), &src);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT);

    /* The connection is still fine afterwards (late replies are dropped). */
    usleep(100000);
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(a, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_alive, 1);
    cfx__ctl_close(a);
}

struct lookup_job {
    struct cfx_ctl *ctl;
    struct cfx_object_id id;
    int timeout_ms;
    int rc;
    uint64_t elapsed_ms;
    struct cfx_ctl_source src;
    pthread_barrier_t *start;
};

static void *lookup_thread(void *arg)
{
    struct lookup_job *j = arg;
    if (j->start)
        pthread_barrier_wait(j->start);
    uint64_t t0 = cfx__now_ns();
    j->rc = cfx__ctl_obj_lookup(j->ctl, &j->id, NULL, 0, cfx__deadline_ns(j->timeout_ms),
                                &j->src);
    j->elapsed_ms = ms_since(t0);
    return NULL;
}

Test(coord, parked_lookup_is_satisfied_by_a_later_put)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct lookup_job j = { .ctl = a, .timeout_ms = CALL_MS };
    pthread_t t;
    make_id(&j.id, "later");
    cr_assert_eq(pthread_create(&t, NULL, lookup_thread, &j), 0);
    usleep(250000);
    cr_assert_eq(cfx__ctl_obj_put(b, &j.id, BIG, 65536, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    pthread_join(t, NULL);
    /* answered by the put (a parked lookup that is not satisfied runs
     * into its CALL_MS deadline), and not before it */
    cr_assert_eq(j.rc, CFX_OK, "lookup: %s", cfx_errname(j.rc));
    cr_assert_geq(j.elapsed_ms, 200);
    cr_assert_eq(j.src.is_inline, 0);
    cr_assert_eq(j.src.size, BIG);
    cr_assert_eq(j.src.chunk_size, 65536);
    cr_assert_eq(j.src.complete, 1);
    cr_assert_eq(j.src.node.node_id, cfx__ctl_node_id(b));
    cr_assert_str_eq(j.src.node.name, "b");
    cr_assert_eq(j.src.node.naddr, 1);

    /* a is now a partial holder pulling from b. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 2);
    cr_assert_eq(objs[0].holders[0].node_id, cfx__ctl_node_id(b));
    cr_assert_eq(objs[0].holders[0].complete, 1);
    cr_assert_eq(objs[0].holders[0].uploads, 1);
    cr_assert_eq(objs[0].holders[1].node_id, cfx__ctl_node_id(a));
    cr_assert_eq(objs[0].holders[1].complete, 0);
    free(objs);

    /* Done: a becomes complete, b's upload slot frees. */
    cr_assert_eq(cfx__ctl_obj_done(a, &j.id, cfx__ctl_node_id(b), 1, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(objs[0].holders[0].uploads, 0);
    cr_assert_eq(objs[0].holders[1].complete, 1);
    free(objs);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, inline_objects_round_trip)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct cfx_object_id big, empty;
    struct cfx_ctl_source src;
    uint8_t *data = malloc(CFX_OBJECT_INLINE_MAX);
    cfx_test_fill(data, CFX_OBJECT_INLINE_MAX, 99);
    make_id(&big, "inline-64k");
    make_id(&empty, "inline-0");

    cr_assert_eq(cfx__ctl_obj_put(a, &big, CFX_OBJECT_INLINE_MAX, 4096, data,
                                  cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(a, &empty, 0, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    free(data);

    cr_assert_eq(cfx__ctl_obj_lookup(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(src.size, CFX_OBJECT_INLINE_MAX);
    cr_assert_eq(src.chunk_size, 4096);
    cr_assert_not_null(src.data);
    cr_assert_eq(cfx_test_check(src.data, CFX_OBJECT_INLINE_MAX, 99), (size_t)-1);
    free(src.data);

    cr_assert_eq(cfx__ctl_obj_lookup(b, &empty, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(src.size, 0);
    cr_assert_null(src.data);

    /* A small object put without its bytes stays on the data plane. */
    struct cfx_object_id small;
    make_id(&small, "small-nodata");
    cr_assert_eq(cfx__ctl_obj_put(a, &small, 10, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_lookup(b, &small, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 0);
    cr_assert_null(src.data);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(a));
    cr_assert_eq(cfx__ctl_obj_done(b, &small, src.node.node_id, 0, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    /* Bytes over the inline limit cannot travel through the coordinator. */
    struct cfx_object_id toobig;
    uint8_t one = 1;
    make_id(&toobig, "too-big-inline");
    cr_assert_eq(cfx__ctl_obj_put(a, &toobig, CFX_OBJECT_INLINE_MAX + 1, 0, &one,
                                  cfx__deadline_ns(CALL_MS)), CFX_ERR_TOO_BIG);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(a, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.objects, 3);
    cr_assert_eq(st.inline_bytes, CFX_OBJECT_INLINE_MAX);

    /* The putter leaves: objects another node got all of stay (b's copies of
     * the inline ones), the one nobody else has goes.  The goodbye travels
     * on a's connection, so wait for it to be handled. */
    cfx__ctl_close(a);
    uint64_t deadline = cfx__deadline_ns(CALL_MS);
    do {
        cr_assert_eq(cfx__ctl_status(b, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    } while (st.objects != 2 && cfx__now_ns() < deadline && !usleep(5000));
    cr_assert_eq(st.objects, 2, "small-nodata outlived its putter, its only holder");
    cr_assert_eq(cfx__ctl_obj_lookup(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(cfx_test_check(src.data, CFX_OBJECT_INLINE_MAX, 99), (size_t)-1);
    free(src.data);
    /* and go with b's copies: inline bytes are no copy of their own */
    cr_assert_eq(cfx__ctl_obj_delete(b, &big, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_delete(b, &empty, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_status(b, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.objects, 0);
    cr_assert_eq(st.inline_bytes, 0);
    cr_assert_eq(cfx__ctl_obj_lookup_now(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                 CFX_ERR_TIMEOUT);
    cfx__ctl_close(b);
}

Test(coord, put_conflicts_and_delete)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL),
                   *c = open_node("c", NULL);
    struct cfx_object_id id;
    make_id(&id, "conflict");
    uint64_t dl = cfx__deadline_ns(CALL_MS);

    char want[64];
    snprintf(want, sizeof(want), "node %u put it", cfx__ctl_node_id(a));
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 1024, NULL, dl), CFX_OK);
    /* An id names one object until its putter deletes it or leaves: a
     * second put fails, whoever sends it and whatever its size. */
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG + 1, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_delete(c, &id, dl), CFX_ERR_NOT_FOUND);

    /* b gets a copy; a lookup with an exclude list skips the excluded holder. */
    struct cfx_ctl_source src;
    cr_assert_eq(cfx__ctl_obj_lookup(b, &id, NULL, 0, dl, &src), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_done(b, &id, src.node.node_id, 1, dl), CFX_OK);
    uint32_t ex = cfx__ctl_node_id(a);
    cr_assert_eq(cfx__ctl_obj_lookup(c, &id, &ex, 1, dl, &src), CFX_OK);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(b));

    /* Another holder's delete withdraws its own copy only. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_obj_delete(b, &id, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 2, "the putter and c's partial copy");
    free(objs);

    /* The putter's delete withdraws the object with every copy's record
     * (c's partial one too): c's transfer ending does not bring it back,
     * and the id is free for a new put at once. */
    cr_assert_eq(cfx__ctl_obj_delete(a, &id, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_delete(a, &id, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_delete(c, &id, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 0, "object deleted by its putter still listed");
    free(objs);
    cr_assert_eq(cfx__ctl_obj_done(c, &id, cfx__ctl_node_id(b), 1, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG + 1, 1024, NULL, dl), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_done(c, &id, ex, 1, dl), CFX_ERR_NOT_FOUND,
                 "a copy of the deleted object counted as a copy of the new one");
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 1);
    cr_assert_eq(objs[0].size, BIG + 1);
    free(objs);
    cfx__ctl_close(c);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, concurrent_lookups_form_a_tree)
{
    enum { N = 8 };
    struct cfx_ctl *p = open_node("putter", NULL), *g[N];
    struct lookup_job jobs[N];
    pthread_t t[N];
    pthread_barrier_t bar;
    struct cfx_object_id id;
    make_id(&id, "broadcast");
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "getter%d", i);
        g[i] = open_node(name, NULL);
    }
    cr_assert_eq(cfx__ctl_obj_put(p, &id, 64ull << 20, 1 << 20, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
        jobs[i] = (struct lookup_job){ .ctl = g[i], .id = id, .timeout_ms = CALL_MS, .start = &bar };
        pthread_create(&t[i], NULL, lookup_thread, &jobs[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);

    /* uploads per node id, and depth of each getter in the tree */
    uint32_t uploads[N + 2] = { 0 };
    for (int i = 0; i < N; i++) {
        cr_assert_eq(jobs[i].rc, CFX_OK, "getter %d: %s", i, cfx_errname(jobs[i].rc));
        uint32_t s = jobs[i].src.node.node_id;
        cr_assert(s >= 1 && s <= N + 1);
        cr_assert_neq(s, cfx__ctl_node_id(g[i]), "a getter was told to pull from itself");
        uploads[s]++;
    }
    /* The directory agrees with what the getters were told. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, N + 1);
    uint32_t max_up = 0, min_up = UINT32_MAX, total = 0;
    for (uint32_t i = 0; i < objs[0].nholders; i++) {
        const struct cfx_obj_holder *h = &objs[0].holders[i];
        cr_assert_eq(h->uploads, uploads[h->node_id], "node %u", h->node_id);
        max_up = CFX_MAX(max_up, h->uploads);
        min_up = CFX_MIN(min_up, h->uploads);
        total += h->uploads;
    }
    free(objs);
    cr_assert_eq(total, N);
    /* No holder above the fanout while another holder is below it. */
    cr_assert(max_up <= FANOUT || min_up >= FANOUT, "max %u min %u", max_up, min_up);
    /* Not everyone hit the putter... */
    cr_assert_eq(uploads[cfx__ctl_node_id(p)], FANOUT);
    /* ...and the shape is a tree, not a chain: depth <= log2(N+1) + 1. */
    uint32_t depth[N + 2] = { 0 };
    for (int round = 0; round < N; round++)
        for (int i = 0; i < N; i++) {
            uint32_t s = jobs[i].src.node.node_id;
            depth[cfx__ctl_node_id(g[i])] = depth[s] + 1;
        }
    for (int i = 0; i < N; i++)
        cr_assert_leq(depth[cfx__ctl_node_id(g[i])], 3, "getter %d at depth %u", i,
                      depth[cfx__ctl_node_id(g[i])]);

    for (int i = 0; i < N; i++)
        cr_assert_eq(cfx__ctl_obj_done(g[i], &id, jobs[i].src.node.node_id, 1,
                                       cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (uint32_t i = 0; i < objs[0].nholders; i++) {
        cr_assert_eq(objs[0].holders[i].uploads, 0);
        cr_assert_eq(objs[0].holders[i].complete, 1);
    }
    free(objs);
    for (int i = 0; i < N; i++)
        cfx__ctl_close(g[i]);
    cfx__ctl_close(p);
}

/* Without --fanout the directory chooses per object: getters of an object of
 * many chunks form a chain (each holder feeds one, a later getter attaches
 * to the newest partial copy), getters of a small one a tree of fan-out 2. */
Test(coord, fanout_follows_the_object)
{
    enum { N = 4 };
    cfx__coord_stop(coord);
    fanout = 0;
    start_coord();
    fanout = FANOUT;
    struct cfx_ctl *p = open_node("putter", NULL), *g[N];
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "getter%d", i);
        g[i] = open_node(name, NULL);
    }
    static const struct {
        const char *name;
        uint64_t size;
        uint32_t chunk;
        int src[N]; /* who feeds getter i: -1 the putter, else a getter */
    } cases[] = {
        { "bandwidth-bound", 64ull << 20, 1u << 20, { -1, 0, 1, 2 } },  /* 64 chunks: a chain */
        { "four chunks", 4u << 20, 1u << 20, { -1, 0, 1, 2 } },
        { "latency-bound", 2u << 20, 1u << 20, { -1, -1, 0, 1 } },     /* 2 chunks: a tree */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct cfx_object_id id;
        make_id(&id, cases[c].name);
        cr_assert_eq(cfx__ctl_obj_put(p, &id, cases[c].size, cases[c].chunk, NULL,
                                      cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
        for (int i = 0; i < N; i++) {
            struct cfx_ctl_source src;
            cr_assert_eq(cfx__ctl_obj_lookup(g[i], &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                         CFX_OK, "%s: getter %d: %s", cases[c].name, i, cfx_last_error());
            int want = cases[c].src[i];
            uint32_t want_id = cfx__ctl_node_id(want < 0 ? p : g[want]);
            cr_assert_eq(src.node.node_id, want_id, "%s: getter %d fed by node %u, want %u",
                         cases[c].name, i, src.node.node_id, want_id);
        }
        /* the listing says who feeds whom (rdmactl objects) */
        struct cfx_ctl_obj_rec *objs;
        size_t n;
        cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
        cr_assert_eq(n, 1);
        cr_assert_eq(objs[0].nholders, N + 1);
        for (uint32_t h = 0; h < objs[0].nholders; h++) {
            uint32_t want = 0; /* the putter: complete, fed by nobody */
            for (int i = 0; i < N; i++)
                if (objs[0].holders[h].node_id == cfx__ctl_node_id(g[i]))
                    want = cfx__ctl_node_id(cases[c].src[i] < 0 ? p : g[cases[c].src[i]]);
            cr_assert_eq(objs[0].holders[h].src, want, "%s: node %u listed as fed by %u, want %u",
                         cases[c].name, objs[0].holders[h].node_id, objs[0].holders[h].src, want);
        }
        free(objs);
        cr_assert_eq(cfx__ctl_obj_delete(p, &id, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    for (int i = 0; i < N; i++)
        cfx__ctl_close(g[i]);
    cfx__ctl_close(p);
}

/*
 * A node in a child process: joins, puts an object, reports its id on a pipe,
 * waits to be killed or stopped.  The child execs a fresh image of this
 * binary (the constructor below runs the node) instead of going on after
 * fork(): this process has threads (the coordinator, clients), and a child
 * that allocates after a fork taken while one of them held an allocator lock
 * (ASan's, for one) deadlocks.
 */
#define CHILD_ENV "CFX_TEST_COORD_CHILD"

__attribute__((constructor)) static void child_node_main(void)
{
    const char *spec = getenv(CHILD_ENV);   /* "FD ADDR TOKEN" */
    int fd;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %63s %63s", &fd, a, tok) != 3)
        return;
    snprintf(addr, sizeof(addr), "%s", a);
    struct cfx_ctl *c = NULL;
    struct cfx_object_id id;
    uint32_t nid = 0;
    if (open_node_tok("child", tok, NULL, &c) == CFX_OK) {
        make_id(&id, "child-object");
        if (cfx__ctl_obj_put(c, &id, BIG, 4096, NULL, cfx__deadline_ns(CALL_MS)) == CFX_OK)
            nid = cfx__ctl_node_id(c);
    }
    if (write(fd, &nid, sizeof(nid)) != sizeof(nid))
        _exit(1);
    for (;;)
        pause();
}

static pid_t spawn_child_node(uint32_t *id_out)
{
    int fds[2];
    char spec[192], exe[512];
    cr_assert_eq(pipe(fds), 0);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    snprintf(spec, sizeof(spec), "%d %s %s", fds[1], addr, token);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        setenv(CHILD_ENV, spec, 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    uint32_t nid = 0;
    struct pollfd pfd = { .fd = fds[0], .events = POLLIN };
    if (poll(&pfd, 1, 10000) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("child node %d did not report within 10 s", (int)pid);
    }
    cr_assert_eq(read(fds[0], &nid, sizeof(nid)), (ssize_t)sizeof(nid));
    close(fds[0]);
    cr_assert_neq(nid, 0, "child could not join");
    *id_out = nid;
    return pid;
}

static void assert_node_dead_and_gone(struct cfx_ctl *c, uint32_t id)
{
    struct cfx_node_rec *nodes;
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_nodes(c, &nodes, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].node_id == id) {
            found = 1;
            cr_assert_eq(nodes[i].alive, 0, "node %u still alive", id);
        }
    cr_assert(found);
    free(nodes);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < objs[i].nholders; j++)
            cr_assert_neq(objs[i].holders[j].node_id, id, "dead node %u still a holder", id);
    struct cfx_object_id cid;
    make_id(&cid, "child-object");
    cr_assert_null(find_obj(objs, n, &cid), "the dead node's object is still listed");
    free(objs);
}

Test(coord, killed_node_is_reported_dead)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d);
    uint32_t child;
    pid_t pid = spawn_child_node(&child);

    /* A lookup parked by the watcher must not be served by the dead node. */
    uint64_t t0 = cfx__now_ns();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t t = wait_dead(&d, child, CALL_MS);
    cr_assert_neq(t, 0, "no node_dead event for node %u within %d ms", child, CALL_MS);
    cr_log_info("killed node reported dead after %llu ms",
                (unsigned long long)((t - t0) / 1000000ull));
    assert_node_dead_and_gone(w, child);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(w, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_alive, 1);
    cr_assert_eq(st.nodes_dead, 1);
    cr_assert_eq(st.objects, 0);
    cfx__ctl_close(w);
}

Test(coord, silent_node_is_reported_dead_after_missed_heartbeats)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d);
    uint32_t child;
    pid_t pid = spawn_child_node(&child);

    /* Stopped, not killed: the socket stays open, only heartbeats stop. */
    uint64_t t0 = cfx__now_ns();
    kill(pid, SIGSTOP);
    uint64_t t = wait_dead(&d, child, CALL_MS);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_neq(t, 0, "no node_dead event for the silent node %u", child);
    uint64_t el = (t - t0) / 1000000ull;
    /* by missed heartbeats: not before dead_after (a loaded machine may be later) */
    cr_assert_geq(el, DEAD_MS - HB_MS - 50, "declared dead after %llu ms", (unsigned long long)el);
    cr_log_info("silent node reported dead after %llu ms", (unsigned long long)el);
    assert_node_dead_and_gone(w, child);
    cfx__ctl_close(w);
}

Test(coord, leaving_node_is_not_a_death_and_calls_fail_after_coordinator_loss)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d), *x = open_node("leaver", NULL);
    uint32_t xid = cfx__ctl_node_id(x);
    cfx__ctl_close(x);
    /* a goodbye is not a failure: members are not told it died (but the
     * coordinator no longer lists it as alive) */
    cr_assert_eq(wait_dead(&d, xid, 700), 0, "a node that left was reported dead");
    struct cfx_node_rec *nodes;
    size_t nn;
    cr_assert_eq(cfx__ctl_nodes(w, &nodes, &nn, cfx__deadline_ns(CALL_MS)), CFX_OK);
    bool alive = false;
    for (size_t i = 0; i < nn; i++)
        if (nodes[i].node_id == xid && nodes[i].alive)
            alive = true;
    free(nodes);
    cr_assert(!alive, "the node that left is still listed alive");

    /* Now the coordinator goes away: the watcher hears node 0 and keeps
     * reconnecting; a call waits for that until its deadline, no longer,
     * and then says the coordinator is unreachable (CFX_ERR_CONNECT, not a
     * plain timeout: callers tell the two apart). */
    cfx__coord_stop(coord);
    coord = NULL;
    cr_assert_neq(wait_dead(&d, 0, CALL_MS), 0, "no coordinator-lost notification");
    struct cfx_ctl_status st;
    uint64_t t0 = cfx__now_ns();
    cr_assert_eq(cfx__ctl_status(w, &st, cfx__deadline_ns(300)), CFX_ERR_CONNECT);
    cr_assert_geq(ms_since(t0), 250);
    cr_assert(strstr(cfx_last_error(), addr), "%s", cfx_last_error());
    cfx__ctl_close(w); /* returns in the middle of reconnecting (the suite's timeout ends a hang) */
}

/* ------------------------------------------------------------------------ */
/* Raw sockets                                                               */

static int raw_connect(void)
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
static int raw_read_frame(int s, uint8_t *buf, size_t cap, struct cfx_msg *m)
{
    size_t have = 0, need = CFX_PROTO_HDR_LEN;
    while (have < need) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        if (poll(&p, 1, CALL_MS) <= 0)
            return CFX_ERR_TIMEOUT;
        ssize_t n = recv(s, buf + have, need - have, 0);
        if (n <= 0)
            return CFX_ERR_CONNECT;
        have += (size_t)n;
        if (have == CFX_PROTO_HDR_LEN) {
            struct cfx_msg_hdr h;
            cr_assert_eq(cfx__msg_hdr_decode(buf, have, &h), CFX_OK);
            need += h.payload_len;
            cr_assert_leq(need, cap);
        }
    }
    return cfx__msg_decode(buf, have, m);
}

static void raw_send(int s, const struct cfx_msg *m)
{
    uint8_t buf[4096];
    size_t len;
    cr_assert_eq(cfx__msg_encode(m, buf, sizeof(buf), &len), CFX_OK);
    cr_assert_eq(send(s, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* A raw connection authenticated in @p role. */
static int raw_auth_role(uint8_t role)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m, r;
    int s = raw_connect();
    uint8_t snonce[CFX_AUTH_NONCE_LEN];
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    memcpy(snonce, m.u.challenge.nonce, sizeof(snonce));
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_AUTH;
    r.req_id = 1;
    r.u.auth.role = role;
    cfx__auth_nonce(r.u.auth.nonce, sizeof(r.u.auth.nonce));
    cfx__auth_mac(token, CFX_AUTH_CLIENT, snonce, r.u.auth.nonce, r.u.auth.mac);
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_AUTH_OK);
    cr_assert_eq(m.req_id, 1);
    /* Mutual: the coordinator proved it knows the token. */
    cr_assert_eq(cfx__auth_verify(token, CFX_AUTH_COORD, snonce, r.u.auth.nonce,
                                  m.u.auth_ok.mac), CFX_OK);
    return s;
}

static int raw_auth(void)
{
    return raw_auth_role(CFX_CTL_ROLE_ADMIN);
}

/* JOIN on a raw node connection asking for id @p want (0: none); returns
 * the id given, or the negative status of the ERROR with its text. */
static int64_t raw_join(int s, uint32_t want, uint64_t req, char *text, size_t text_len)
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

static void raw_leave(int s)
{
    struct cfx_msg r = { .type = CFX_MSG_LEAVE, .req_id = 0 };
    raw_send(s, &r);
}

static struct cfx_ctl_status raw_status(int s, uint64_t req)
{
    static uint8_t buf[1 << 16];
    struct cfx_msg m, r = { .type = CFX_MSG_STATUS, .req_id = req };
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
    return m.u.status;
}

/*
 * 10,000 JOIN/LEAVE cycles on one connection, every other one asking for an
 * id 65535 above the high-water mark: each gets the next fresh id (the
 * coordinator chooses), and the node index stays as small as the records it
 * holds (a thousand dead ones at most), read from STATUS.  Before the fix
 * the wish was granted (id = high-water + 65535) and the index, a flat
 * array by id, grew by 512 KiB per such JOIN: gigabytes within the loop.
 */
Test(coord, join_leave_cycles_keep_the_index_flat)
{
    int s = raw_auth_role(CFX_CTL_ROLE_NODE), adm = raw_auth();
    int64_t prev = raw_join(s, 0, 1, NULL, 0);
    cr_assert_gt(prev, 0);
    raw_leave(s);
    for (uint32_t i = 1; i <= 10000; i++) {
        uint32_t want = i % 2 ? (uint32_t)prev + 65535 : 0;
        int64_t id = raw_join(s, want, 1 + i, NULL, 0);
        cr_assert_eq(id, prev + 1, "cycle %u: asked for %u, got %lld after %lld", i, want,
                     (long long)id, (long long)prev);
        prev = id;
        raw_leave(s);
        if (i % 1000 == 0) {
            struct cfx_ctl_status st = raw_status(adm, i);
            cr_assert_leq(st.node_records, 1024 + 1, "cycle %u: %u records", i, st.node_records);
            cr_assert_leq(st.node_index_slots, 4096, "cycle %u: %u index slots", i,
                          st.node_index_slots);
        }
    }
    close(s);
    close(adm);
}

/* A JOIN beyond --max-nodes members alive gets an error naming the cap. */
Test(coord, join_beyond_max_nodes_is_refused_by_name)
{
    cfx__coord_stop(coord);
    max_nodes = 2;
    start_coord();
    int a = raw_auth_role(CFX_CTL_ROLE_NODE), b = raw_auth_role(CFX_CTL_ROLE_NODE);
    int c = raw_auth_role(CFX_CTL_ROLE_NODE);
    char text[CFX_PROTO_TEXT_MAX];
    cr_assert_gt(raw_join(a, 0, 1, NULL, 0), 0);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);
    cr_assert_eq(raw_join(c, 0, 1, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_nodes"), "%s", text);
    raw_leave(a); /* room again, once a's STATUS answer shows the LEAVE was read */
    raw_status(a, 2);
    cr_assert_gt(raw_join(c, 0, 2, NULL, 0), 0);
    close(a);
    close(b);
    close(c);
    max_nodes = 0;
}

static long wait_closed(int s, int ms);

/* Read the answer to @p req on @p s: 0 for OK, the status of an ERROR (its
 * text into @p text). */
static int raw_answer(int s, uint64_t req, char *text, size_t text_len)
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
static int raw_put(int s, uint8_t k, uint64_t size, bool inl, uint64_t req, char *text,
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

static void raw_lookup(int s, uint8_t k, uint32_t timeout_ms, uint64_t req)
{
    struct cfx_msg r;
    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_OBJ_LOOKUP;
    r.req_id = req;
    memset(r.u.lookup.id.bytes, k, sizeof(r.u.lookup.id.bytes));
    r.u.lookup.timeout_ms = timeout_ms;
    raw_send(s, &r);
}

/*
 * Each coordinator cap, set small, answers the request that hits it with
 * CFX_ERR_NO_RESOURCE and a text naming it: objects per node, inline bytes
 * per node, parked lookups, unauthenticated connections.  Before the fix
 * there were no such caps: the fourth object, the second 60-byte inline
 * object, the third parked lookup and the third silent connection were all
 * taken.
 */
Test(coord, each_cap_hit_is_named)
{
    cfx__coord_stop(coord);
    caps.max_node_objects = 3;
    caps.max_node_bytes = 100;
    caps.max_parked = 2;
    caps.max_unauth_conns = 2;
    start_coord();
    char text[CFX_PROTO_TEXT_MAX];

    /* objects per node */
    int a = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(a, 0, 1, NULL, 0), 0);
    for (uint8_t k = 1; k <= 3; k++)
        cr_assert_eq(raw_put(a, k, BIG, false, 10 + k, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(raw_put(a, 4, BIG, false, 20, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_node_objects"), "%s", text);

    /* inline bytes per node */
    int b = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);
    cr_assert_eq(raw_put(b, 5, 60, true, 2, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(raw_put(b, 6, 60, true, 3, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_node_bytes"), "%s", text);

    /* parked lookups, all connections together */
    raw_lookup(b, 7, 60000, 4);
    int c = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(c, 0, 1, NULL, 0), 0);
    raw_lookup(c, 8, 60000, 2);
    raw_lookup(c, 9, 60000, 3); /* the third: answered at once */
    cr_assert_eq(raw_answer(c, 3, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_parked"), "%s", text);

    /* unauthenticated connections: two wait for their challenge answer (the
     * three authenticated ones above do not count against the cap) */
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    int u1 = raw_connect(), u2 = raw_connect();
    cr_assert_eq(raw_read_frame(u1, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    cr_assert_eq(raw_read_frame(u2, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    int u3 = raw_connect();
    cr_assert_eq(raw_read_frame(u3, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR, "%s", cfx__msg_type_name(m.type));
    cr_assert_eq(m.u.error.status, CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(m.u.error.text, "max_unauth_conns"), "%s", m.u.error.text);
    cr_assert_geq(wait_closed(u3, CALL_MS), 0, "refused connection left open");
    close(u1);
    close(u2);
    close(u3);
    close(a);
    close(b);
    close(c);
}

/* Remove a state directory the test made (records only, no subdirectories). */
static void rm_state_dir(const char *dir)
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

/*
 * Durable zero-byte puts on a slow disk (each fsync made @p delay_ms slower)
 * sent by one client in one write while four members heartbeat: none of
 * them is declared dead, checked by membership (STATUS after the puts: five
 * alive, none dead) and by the node_dead events the members got (none).
 */
static void durable_puts_while_members_beat(uint32_t delay_ms, int puts)
{
    char dir[] = "/tmp/cfx-coord-state-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cfx__coord_stop(coord);
    caps.state_dir = dir;
    caps.test_fsync_delay_ms = delay_ms;
    start_coord();

    struct deaths d[4];
    struct cfx_ctl *n[4];
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof(name), "beater%d", i);
        deaths_init(&d[i]);
        n[i] = open_node(name, &d[i]);
    }
    int s = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(s, 0, 1, NULL, 0), 0);
    static uint8_t frames[16][1024];
    uint8_t all[16 * 1024];
    size_t total = 0;
    cr_assert_leq(puts, 16);
    for (int k = 0; k < puts; k++) {
        struct cfx_msg r;
        size_t len;
        memset(&r, 0, sizeof(r));
        r.type = CFX_MSG_OBJ_PUT;
        r.req_id = 100 + (uint64_t)k;
        memset(r.u.put.id.bytes, 0x40 + k, sizeof(r.u.put.id.bytes));
        r.u.put.has_data = 1;
        r.u.put.durable = 1;
        r.u.put.data = frames[k];
        cr_assert_eq(cfx__msg_encode(&r, frames[k], sizeof(frames[k]), &len), CFX_OK);
        memcpy(all + total, frames[k], len);
        total += len;
    }
    cr_assert_eq(send(s, all, total, MSG_NOSIGNAL), (ssize_t)total);
    char text[CFX_PROTO_TEXT_MAX];
    for (int k = 0; k < puts; k++)
        cr_assert_eq(raw_answer(s, 100 + (uint64_t)k, text, sizeof(text)), 0, "%s", text);
    /* two more round trips: a tick has run since the last put */
    struct cfx_ctl_status st = raw_status(s, 200);
    st = raw_status(s, 201);
    cr_assert_eq(st.nodes_dead, 0, "%u members declared dead", st.nodes_dead);
    cr_assert_eq(st.nodes_alive, 5);
    for (int i = 0; i < 4; i++) {
        pthread_mutex_lock(&d[i].mu);
        cr_assert_eq(d[i].n, 0, "beater%d heard of %d deaths", i, d[i].n);
        pthread_mutex_unlock(&d[i].mu);
        cfx__ctl_close(n[i]);
    }
    close(s);
    cfx__coord_stop(coord);
    coord = NULL;
    rm_state_dir(dir);
}

/*
 * Ten puts at 300 ms each (two fsyncs, 150 ms slower): three seconds of disk
 * work, five times dead_after_ms.  The coordinator takes at most one disk
 * write per connection per loop iteration, so the members' beats are read
 * in between.  Before the fix the ten went back to back and the first tick
 * after declared all four members dead.
 */
Test(coord, durable_puts_on_a_slow_disk_kill_no_member, .timeout = 120)
{
    durable_puts_while_members_beat(150, 10);
}

/*
 * One durable put that holds the loop longer than dead_after_ms (two
 * fsyncs, 500 ms slower each): the tick after it credits the members with
 * the time the loop could not read.  Before the fix all four were declared
 * dead.
 */
Test(coord, one_stall_longer_than_dead_after_kills_no_member, .timeout = 120)
{
    durable_puts_while_members_beat(500, 2);
}

/* A state directory another user could write is refused, and so is a
 * symbolic link to one (before: both were used). */
Test(coord, unsafe_state_dir_is_refused)
{
    char dir[] = "/tmp/cfx-coord-state-XXXXXX", link[64];
    struct cfx_coord *co = NULL;
    cr_assert_not_null(mkdtemp(dir));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token, .state_dir = dir };
    cr_assert_eq(chmod(dir, 0777), 0);
    cr_assert_eq(cfx__coord_start(&p, &co), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "writable by others"), "%s", cfx_last_error());
    cr_assert_eq(chmod(dir, 0700), 0);
    snprintf(link, sizeof(link), "%s.link", dir);
    cr_assert_eq(symlink(dir, link), 0);
    p.state_dir = link;
    cr_assert_neq(cfx__coord_start(&p, &co), CFX_OK);
    cr_assert(strstr(cfx_last_error(), "symbolic link"), "%s", cfx_last_error());
    p.state_dir = dir;
    cr_assert_eq(cfx__coord_start(&p, &co), CFX_OK, "%s", cfx_last_error());
    cfx__coord_stop(co);
    unlink(link);
    rm_state_dir(dir);
}

/* Wait until the peer closes @p s; returns ms waited or -1. */
static long wait_closed(int s, int ms)
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

Test(coord, garbage_and_half_frames_do_not_disturb_good_clients)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    uint8_t junk[4096];
    make_id(&id, "robust");

    /* 1. Garbage instead of AUTH: closed at once. */
    int g = raw_connect();
    cfx_test_fill(junk, sizeof(junk), 5);
    send(g, junk, sizeof(junk), MSG_NOSIGNAL);
    cr_assert_geq(wait_closed(g, CALL_MS), 0, "garbage connection not closed");
    close(g);

    /* 2. Half a header, never authenticated: closed at the auth deadline. */
    int h = raw_connect();
    send(h, junk, 8, MSG_NOSIGNAL);
    /* 3. Authenticated, then half a frame: closed when stalled. */
    int s = raw_auth();
    struct cfx_msg st = { .type = CFX_MSG_STATUS, .req_id = 9 };
    uint8_t fb[64] = { 0 };
    size_t flen;
    cr_assert_eq(cfx__msg_encode(&st, fb, sizeof(fb), &flen), CFX_OK);
    fb[4] = 100; /* announce 100 payload bytes, send 3 */
    send(s, fb, flen + 3, MSG_NOSIGNAL);

    /* Meanwhile good clients are served normally. */
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 4096, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_lookup(b, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(a));

    long th = wait_closed(h, CALL_MS);
    cr_assert_geq(th, 0, "unauthenticated connection not closed");
    long ts = wait_closed(s, CALL_MS);
    cr_assert_geq(ts, 0, "stalled connection not closed");
    close(h);
    close(s);

    /* 4. A bad payload inside a valid frame gets an error reply; the connection lives. */
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    s = raw_auth();
    struct cfx_msg bad = { .type = CFX_MSG_NODE_GET, .req_id = 77 };
    cr_assert_eq(cfx__msg_encode(&bad, fb, sizeof(fb), &flen), CFX_OK);
    fb[4] = 5; /* 5 payload bytes where 4 belong */
    fb[flen] = 0;
    send(s, fb, flen + 1, MSG_NOSIGNAL);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.req_id, 77);
    cr_assert_eq(m.u.error.status, CFX_ERR_PROTO);
    raw_send(s, &st);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
    cr_assert_eq(m.req_id, 9);
    cr_assert_eq(m.u.status.nodes_alive, 2);
    /* Object calls from a non-member are refused with a reason. */
    struct cfx_msg del = { .type = CFX_MSG_OBJ_DELETE, .req_id = 78 };
    raw_send(s, &del);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.u.error.status, CFX_ERR_INVALID);
    cr_assert_gt(strlen(m.u.error.text), 0);
    close(s);

    /* 5. A wrong protocol version is refused with CFX_ERR_VERSION, then closed. */
    s = raw_connect();
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    cr_assert_eq(cfx__msg_encode(&st, fb, sizeof(fb), &flen), CFX_OK);
    fb[2] = CFX_PROTO_VERSION + 1;
    send(s, fb, flen, MSG_NOSIGNAL);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.u.error.status, CFX_ERR_VERSION);
    cr_assert_geq(wait_closed(s, CALL_MS), 0);
    close(s);

    struct cfx_ctl_status cs;
    cr_assert_eq(cfx__ctl_status(a, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cs.nodes_alive, 2);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, admin_queries)
{
    struct cfx_ctl *a = open_node("alpha", NULL), *b = open_node("beta", NULL);
    struct cfx_ctl *adm = open_admin();
    struct cfx_object_id id1, id2;
    uint8_t small[100];
    make_id(&id1, "obj-one");
    make_id(&id2, "obj-two");
    cfx_test_fill(small, sizeof(small), 1);
    cr_assert_eq(cfx__ctl_obj_put(a, &id1, BIG, 8192, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put(b, &id2, sizeof(small), 0, small, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(adm, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.proto_version, CFX_PROTO_VERSION);
    cr_assert_eq(st.nodes_alive, 2);
    cr_assert_eq(st.nodes_dead, 0);
    cr_assert_eq(st.objects, 2);
    cr_assert_eq(st.inline_bytes, sizeof(small));
    cr_assert_eq(st.heartbeat_ms, HB_MS);
    cr_assert_eq(st.dead_after_ms, DEAD_MS);
    cr_assert_gt(strlen(st.version), 0);

    struct cfx_node_rec *nodes;
    size_t n;
    cr_assert_eq(cfx__ctl_nodes(adm, &nodes, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 2, "admin connections are not members");
    cr_assert_str_eq(nodes[0].name, "alpha");
    cr_assert_str_eq(nodes[1].name, "beta");
    cr_assert_eq(nodes[0].alive, 1);
    cr_assert_leq(nodes[0].last_seen_ms, st.uptime_ms); /* an age, not a date */
    free(nodes);

    struct cfx_ctl_obj_rec *objs;
    cr_assert_eq(cfx__ctl_objects(adm, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 2);
    const struct cfx_ctl_obj_rec *o1 = find_obj(objs, n, &id1), *o2 = find_obj(objs, n, &id2);
    cr_assert_not_null(o1);
    cr_assert_not_null(o2);
    cr_assert_eq(o1->size, BIG);
    cr_assert_eq(o1->chunk_size, 8192);
    cr_assert_eq(o1->is_inline, 0);
    cr_assert_eq(o1->nholders, 1);
    cr_assert_eq(o1->holders[0].node_id, cfx__ctl_node_id(a));
    cr_assert_eq(o2->is_inline, 1);
    cr_assert_eq(o2->size, sizeof(small));
    free(objs);

    /* Admin clients cannot use member calls. */
    cr_assert_eq(cfx__ctl_obj_put(adm, &id1, BIG, 0, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_ERR_INVALID);
    cfx__ctl_close(adm);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, listings_paginate)
{
    enum { NOBJ = CFX_PROTO_OBJECTS_PAGE + 100 };
    struct cfx_ctl *a = open_node("a", NULL);
    for (uint32_t i = 0; i < NOBJ; i++) {
        struct cfx_object_id id;
        memset(&id, 0, sizeof(id));
        memcpy(id.bytes, &i, sizeof(i));
        id.bytes[19] = 0xee;
        cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, NOBJ);
    for (uint32_t i = 0; i < NOBJ; i++) {
        uint32_t v;
        memcpy(&v, objs[i].id.bytes, sizeof(v));
        cr_assert_eq(v, i, "object %u out of order", i);
    }
    free(objs);
    cfx__ctl_close(a);
}

/* The record of @p id in a fresh listing, or NULL (*recs to free). */
static const struct cfx_node_rec *listed(struct cfx_ctl *adm, uint32_t id,
                                         struct cfx_node_rec **recs)
{
    size_t n = 0;
    *recs = NULL;
    cr_assert_eq(cfx__ctl_nodes(adm, recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    for (size_t i = 0; i < n; i++)
        if ((*recs)[i].node_id == id)
            return &(*recs)[i];
    return NULL;
}

/* Dead members are listed for dead_keep_ms after death (a node that left
 * says so), then forgotten; live ones stay.  Node records carry the host
 * name and the observer flag the member gave; admin connections are no
 * members at all. */
Test(coord, dead_nodes_are_forgotten_after_dead_keep_ms)
{
    cfx__coord_stop(coord);
    dead_keep_ms = 400;
    start_coord();

    struct cfx_ctl *stays = open_node("stays", NULL), *leaves = open_node("leaves", NULL);
    struct cfx_ctl *adm = open_admin();
    uint32_t id_stays = cfx__ctl_node_id(stays), id_leaves = cfx__ctl_node_id(leaves), id_killed;
    pid_t pid = spawn_child_node(&id_killed);

    /* an observer says so in its record */
    struct cfx_node_rec self;
    memset(&self, 0, sizeof(self));
    snprintf(self.name, sizeof(self.name), "tool");
    snprintf(self.host, sizeof(self.host), "tool-host");
    self.flags = CFX_NODE_F_OBSERVER | CFX_NODE_F_LEFT; /* LEFT is the coordinator's to say */
    struct cfx_ctl_params op = { .coord = addr, .token = token, .role = CFX_CTL_ROLE_NODE,
                                 .self = &self, .timeout_ms = CALL_MS };
    struct cfx_ctl *obs = NULL;
    cr_assert_eq(cfx__ctl_open(&op, &obs), CFX_OK, "%s", cfx_last_error());

    struct cfx_node_rec *recs;
    size_t n = 0;
    cr_assert_eq(cfx__ctl_nodes(adm, &recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 4, "members only, not the admin connection: %zu", n);
    free(recs);
    const struct cfx_node_rec *r = listed(adm, id_stays, &recs);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->host, "host-of-stays");
    cr_assert_eq(r->flags, 0);
    free(recs);
    r = listed(adm, cfx__ctl_node_id(obs), &recs);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->host, "tool-host");
    cr_assert_eq(r->flags, CFX_NODE_F_OBSERVER);
    free(recs);

    /* one leaves in good order, one is killed */
    cfx__ctl_close(leaves);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    /* until both are forgotten: the deadline only ends a hang */
    uint64_t t0 = cfx__now_ns();
    bool left_gone = false, killed_gone = false;
    while (ms_since(t0) < CALL_MS && !(left_gone && killed_gone)) {
        r = listed(adm, id_leaves, &recs);
        if (r && !r->alive)
            cr_assert(r->flags & CFX_NODE_F_LEFT, "a node that left is marked so");
        left_gone = !r;
        free(recs);
        r = listed(adm, id_killed, &recs);
        if (r && !r->alive)
            cr_assert(!(r->flags & CFX_NODE_F_LEFT), "a killed node did not leave");
        killed_gone = !r;
        free(recs);
        poll(NULL, 0, 20);
    }
    cr_assert(left_gone, "node %u is still listed %llu ms after it left (dead_keep_ms %u)",
              id_leaves, (unsigned long long)ms_since(t0), dead_keep_ms);
    cr_assert(killed_gone, "node %u is still listed %llu ms after it was killed",
              id_killed, (unsigned long long)ms_since(t0));
    struct cfx_node_rec one;
    cr_assert_eq(cfx__ctl_node_get(adm, id_leaves, &one, cfx__deadline_ns(CALL_MS)),
                 CFX_ERR_NOT_FOUND);
    r = listed(adm, id_stays, &recs);
    cr_assert(r && r->alive, "a live member is never forgotten");
    free(recs);
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(adm, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_dead, 0, "forgotten nodes are not counted as dead");
    cr_assert_eq(st.nodes_alive, 2);

    cfx__ctl_close(obs);
    cfx__ctl_close(adm);
    cfx__ctl_close(stays);
    dead_keep_ms = 0;
}

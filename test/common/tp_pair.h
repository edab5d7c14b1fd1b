/*
 * The two-iface harness of the transport contract tests (test_transport.c,
 * test_transport_seal.c): a pair of ifaces of one transport in this process
 * (a connects to b), a completion log per side, a driver that polls both
 * until a condition holds or a deadline passes, registered regions and
 * posts that wait for room.  Nothing here waits without a deadline.
 */
#ifndef CFX_TEST_TP_PAIR_H
#define CFX_TEST_TP_PAIR_H

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dataplane/common/util.h"
#include "dataplane/transport.h"
#include "testutil.h"

#define NODE_A  1
#define NODE_B  2
#define WAIT_MS 20000 /* a limit against hangs only: a loaded machine may be slow */

/* --- parameters: one per built transport (names only: no pointers cross
 * into Criterion's test processes) --------------------------------------- */

struct tp_param {
    char name[CFX_TP_NAME_MAX];
};

/* The built transports @p want says yes to (NULL: all). */
static inline size_t tp_params_where(struct tp_param *out, size_t max,
                                     bool (*want)(const struct cfx_transport_ops *))
{
    size_t n = 0;
    for (int i = 0; cfx__transports[i] && n < max; i++) {
        if (want && !want(cfx__transports[i]))
            continue;
        memset(&out[n], 0, sizeof(out[n]));
        strncpy(out[n].name, cfx__transports[i]->name, sizeof(out[n].name) - 1);
        n++;
    }
    return n;
}

/* A test of suite @p suite run once per transport @p want says yes to. */
#define TP_TEST_WHERE(suite, name, want, secs)                             \
    ParameterizedTestParameters(suite, name)                               \
    {                                                                      \
        static struct tp_param params[8];                                  \
        size_t n = tp_params_where(params, CFX_ARRAY_SIZE(params), want);  \
        return cr_make_param_array(struct tp_param, params, n, NULL);      \
    }                                                                      \
    ParameterizedTest(struct tp_param *param, suite, name, .timeout = secs)

#define TP_TEST(name) TP_TEST_WHERE(transport, name, NULL, 60)

/* --- completion log ------------------------------------------------------- */

struct ev {
    uint8_t type;
    int32_t status;
    struct cfx_tp_ep *ep;
    uint64_t wr_id;
    uint32_t imm, len;
    uint8_t *data; /* RECV: copy of the message */
    bool used;     /* consumed by a wait */
};

struct side {
    struct cfx_tp_iface *iface;
    struct ev *evs;
    size_t n, cap;
};

struct pair {
    const struct cfx_transport_ops *ops;
    struct side s[2];     /* [0] = a (connects), [1] = b (accepts) */
    struct cfx_tp_ep *ab; /* a's ep to b */
    struct cfx_tp_ep *ba; /* b's accepted ep */
};

static inline const char *comp_name(int t)
{
    static const char *const names[] = { "?",         "WRITE",     "SEND",   "RECV",
                                         "WRITE_IMM", "CONNECTED", "ACCEPT", "EP_ERROR" };
    return t >= 0 && t < (int)CFX_ARRAY_SIZE(names) ? names[t] : "?";
}

/* Poll one iface once; log what came.  Returns the number of completions. */
static inline int poll_side(const struct cfx_transport_ops *ops, struct side *s)
{
    struct cfx_tp_completion comps[32];
    int n = ops->poll(s->iface, comps, (int)CFX_ARRAY_SIZE(comps));
    cr_assert_geq(n, 0, "poll: %s", cfx_errname(n));
    /* Copies are taken after poll() returned: every RECV of one batch must
     * still be valid (the data lives until the next poll). */
    for (int i = 0; i < n; i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 256;
            s->evs = realloc(s->evs, s->cap * sizeof(*s->evs));
            cr_assert_not_null(s->evs);
        }
        struct ev *e = &s->evs[s->n++];
        memset(e, 0, sizeof(*e));
        e->type = comps[i].type;
        e->status = comps[i].status;
        e->ep = comps[i].ep;
        e->wr_id = comps[i].wr_id;
        e->imm = comps[i].imm;
        e->len = comps[i].len;
        cr_assert_not_null(e->ep, "completion %s without an ep", comp_name(e->type));
        if (e->type == CFX_TP_COMP_RECV && e->len) {
            cr_assert_leq(e->len, CFX_TP_SEND_MAX);
            cr_assert_not_null(comps[i].data);
            e->data = malloc(e->len);
            memcpy(e->data, comps[i].data, e->len);
        }
    }
    return n;
}

typedef bool (*cond_fn)(struct pair *p, void *arg);

/* Poll both sides until @p cond holds; fail the test at the deadline. */
static inline void drive(struct pair *p, cond_fn cond, void *arg, int timeout_ms, const char *what)
{
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    for (;;) {
        if (cond && cond(p, arg))
            return;
        if (cfx__now_ns() >= deadline) {
            if (!cond)
                return;
            cr_assert_fail("timed out after %d ms waiting for %s", timeout_ms, what);
        }
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (p->s[i].iface)
                n += poll_side(p->ops, &p->s[i]);
        if (!n)
            sched_yield();
    }
}

/* Drive for a while without a condition (lets stray completions show up). */
static inline void settle(struct pair *p, int ms)
{
    drive(p, NULL, NULL, ms, "settle");
}

static inline struct ev *find_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    for (size_t i = 0; i < s->n; i++)
        if (!s->evs[i].used && s->evs[i].type == type && (!ep || s->evs[i].ep == ep))
            return &s->evs[i];
    return NULL;
}

static inline size_t count_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->evs[i].type == type && (!ep || s->evs[i].ep == ep))
            n++;
    return n;
}

struct wait_arg {
    int side, type;
    struct cfx_tp_ep *ep;
    size_t count;
};

static inline bool have_ev(struct pair *p, void *arg)
{
    struct wait_arg *w = arg;
    return find_ev(&p->s[w->side], w->type, w->ep) != NULL;
}

static inline bool have_count(struct pair *p, void *arg)
{
    struct wait_arg *w = arg;
    return count_ev(&p->s[w->side], w->type, w->ep) >= w->count;
}

/* Wait for the next unconsumed completion of @p type on @p side; consume it. */
static inline struct ev *wait_ev(struct pair *p, int side, int type, struct cfx_tp_ep *ep,
                                 int timeout_ms)
{
    struct wait_arg w = { side, type, ep, 0 };
    char what[64];
    snprintf(what, sizeof(what), "%s on %c", comp_name(type), side ? 'b' : 'a');
    drive(p, have_ev, &w, timeout_ms, what);
    struct ev *e = find_ev(&p->s[side], type, ep);
    e->used = true;
    return e;
}

static inline void wait_count(struct pair *p, int side, int type, struct cfx_tp_ep *ep,
                              size_t count, int timeout_ms)
{
    struct wait_arg w = { side, type, ep, count };
    char what[80];
    snprintf(what, sizeof(what), "%zu x %s on %c", count, comp_name(type), side ? 'b' : 'a');
    drive(p, have_count, &w, timeout_ms, what);
}

/* --- setup ---------------------------------------------------------------- */

static inline int open_iface(const struct cfx_transport_ops *ops, uint32_t node,
                             struct cfx_tp_iface **out)
{
    struct cfx_tp_iface_params params = {
        .field_mask = CFX_TP_IFACE_PARAM_NODE_ID,
        .node_id = node,
    };
    return ops->iface_open(&params, out);
}

/* dpdk: this test process's EAL gets two net_memif ports joined to each
 * other (server and client on one socket: a opens the first, b the second)
 * and a third with no peer (an iface that is gone); no hugepages. */
static char memif_dir[64];

static inline void dpdk_setup(void)
{
    char eal[768];
    snprintf(memif_dir, sizeof(memif_dir), "/tmp/cfx_tp_memif_XXXXXX");
    cr_assert_not_null(mkdtemp(memif_dir));
    snprintf(eal, sizeof(eal),
             "--no-huge -m 256 --no-pci --file-prefix=cfxtp%d -l 0 --log-level=*:warning "
             "--no-telemetry --vdev=net_memif0,role=server,socket=%s/m.sock,id=0 "
             "--vdev=net_memif1,role=client,socket=%s/m.sock,id=0 "
             "--vdev=net_memif2,role=server,socket=%s/gone.sock,id=0",
             (int)getpid(), memif_dir, memif_dir, memif_dir);
    setenv("CFX_DPDK_EAL", eal, 1);
}

static inline void dpdk_teardown(void)
{
    char path[256];
    if (!memif_dir[0])
        return;
    snprintf(path, sizeof(path), "%s/m.sock", memif_dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/gone.sock", memif_dir);
    unlink(path);
    rmdir(memif_dir);
    memif_dir[0] = 0;
}

static inline void pair_open(struct pair *p, const struct tp_param *param)
{
    memset(p, 0, sizeof(*p));
    if (!strcmp(param->name, "dpdk") && !memif_dir[0])
        dpdk_setup();
    p->ops = cfx__transport_find(param->name);
    cr_assert_not_null(p->ops, "transport %s not found", param->name);
    cr_log_info("transport %s", param->name);
    cr_assert_eq(p->ops->version, CFX_TP_OPS_VERSION);
    int rc = open_iface(p->ops, NODE_A, &p->s[0].iface);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_skip_test("transport %s cannot run here: %s", param->name, cfx_last_error());
    cr_assert_eq(rc, CFX_OK, "%s iface_open: %s %s", param->name, cfx_errname(rc),
                 cfx_last_error());
    rc = open_iface(p->ops, NODE_B, &p->s[1].iface);
    cr_assert_eq(rc, CFX_OK, "%s iface_open: %s", param->name, cfx_errname(rc));
}

static inline void get_addr(struct pair *p, int side, uint8_t *addr, size_t *len)
{
    *len = CFX_TP_ADDR_MAX;
    int rc = p->ops->iface_addr(p->s[side].iface, addr, len);
    cr_assert_eq(rc, CFX_OK, "iface_addr: %s", cfx_errname(rc));
    cr_assert(*len > 0 && *len <= CFX_TP_ADDR_MAX, "address length %zu", *len);
}

/* What the engine does once its handshake authenticated the peer (the
 * transports that check every write against grants themselves have no
 * ep_authorize). */
static inline void authorize(struct pair *p, struct cfx_tp_ep *ep)
{
    int rc = cfx__tp_ep_authorize(p->ops, ep);
    cr_assert_eq(rc, CFX_OK, "ep_authorize: %s %s", cfx_errname(rc), cfx_last_error());
}

/* Connected on both sides, neither authorized yet. */
static inline void pair_connect_unauthorized(struct pair *p)
{
    uint8_t addr[CFX_TP_ADDR_MAX];
    size_t len;

    get_addr(p, 1, addr, &len);
    int rc = p->ops->ep_connect(p->s[0].iface, addr, len, NODE_B, &p->ab);
    cr_assert_eq(rc, CFX_OK, "ep_connect: %s %s", cfx_errname(rc), cfx_last_error());
    cr_assert_not_null(p->ab);

    struct ev *e = wait_ev(p, 0, CFX_TP_COMP_CONNECTED, p->ab, WAIT_MS);
    cr_assert_eq(e->status, CFX_OK);
    e = wait_ev(p, 1, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS);
    cr_assert_eq(e->status, CFX_OK);
    p->ba = e->ep;
    cr_assert_eq(p->ab->status, CFX_OK);
    cr_assert_eq(p->ba->status, CFX_OK);
    cr_assert_eq(p->ab->iface, p->s[0].iface);
    cr_assert_eq(p->ba->iface, p->s[1].iface);
}

static inline void pair_connect(struct pair *p)
{
    pair_connect_unauthorized(p);
    authorize(p, p->ba);
    authorize(p, p->ab);
}

static inline void pair_close(struct pair *p)
{
    if (p->ab)
        p->ops->ep_close(p->ab);
    if (p->ba)
        p->ops->ep_close(p->ba);
    for (int i = 0; i < 2; i++) {
        if (p->s[i].iface)
            p->ops->iface_close(p->s[i].iface);
        for (size_t j = 0; j < p->s[i].n; j++)
            free(p->s[i].evs[j].data);
        free(p->s[i].evs);
    }
    memset(p, 0, sizeof(*p));
    dpdk_teardown();
}

struct region {
    uint8_t *buf;
    size_t len;
    struct cfx_tp_mr *mr;
    struct cfx_tp_rdesc rdesc;
    int fd;       /* arena regions: the sealed memfd, else 0 (unused) */
    uint8_t *map; /* arena regions: the whole file, guard bytes around buf */
    size_t map_len;
};

static inline void region_reg(struct pair *p, int side, struct region *r, size_t len,
                              unsigned access, uint8_t fill)
{
    struct cfx_tp_mem_desc md;

    memset(r, 0, sizeof(*r)); /* no map: region_free() frees buf */
    r->len = len;
    r->buf = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
    cr_assert_not_null(r->buf);
    memset(r->buf, fill, len);
    md = (struct cfx_tp_mem_desc){
        .addr = r->buf, .len = len, .memtype = CFX_MEMTYPE_HOST, .file_fd = -1
    };
    int rc = p->ops->mem_reg(p->s[side].iface, &md, access, &r->mr);
    cr_assert_eq(rc, CFX_OK, "mem_reg: %s %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(r->mr->addr, r->buf);
    cr_assert_eq(r->mr->len, len);
    rc = p->ops->mr_pack(r->mr, &r->rdesc);
    cr_assert_eq(rc, CFX_OK, "mr_pack: %s", cfx_errname(rc));
    cr_assert(r->rdesc.len > 0 && r->rdesc.len <= CFX_TP_RDESC_MAX);
}

/* A window of a sealed memfd, as the engine's arena hands out (which is
 * what the shm one-copy path reads from and writes into): ARENA_OFF bytes
 * before it and a page after it, all filled with @p fill too, so a test can
 * check that no byte outside the window changed. */
enum { ARENA_OFF = 4096 + 64 };

static inline void region_reg_arena(struct pair *p, int side, struct region *r, size_t len,
                                    unsigned access, uint8_t fill)
{
    memset(r, 0, sizeof(*r));
    r->map_len = (ARENA_OFF + len + 4096 + 4095) & ~(size_t)4095;
    r->fd = memfd_create("test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    cr_assert_geq(r->fd, 0);
    cr_assert_eq(ftruncate(r->fd, (off_t)r->map_len), 0);
    cr_assert_eq(fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    cr_assert_neq(r->map, MAP_FAILED);
    memset(r->map, fill, r->map_len);
    r->buf = r->map + ARENA_OFF;
    r->len = len;
    struct cfx_tp_mem_desc md = { .addr = r->buf,
                                  .len = len,
                                  .memtype = CFX_MEMTYPE_HOST,
                                  .file_fd = r->fd,
                                  .file_off = ARENA_OFF };
    int rc = p->ops->mem_reg(p->s[side].iface, &md, access, &r->mr);
    cr_assert_eq(rc, CFX_OK, "mem_reg: %s %s", cfx_errname(rc), cfx_last_error());
    rc = p->ops->mr_pack(r->mr, &r->rdesc);
    cr_assert_eq(rc, CFX_OK, "mr_pack: %s", cfx_errname(rc));
}

static inline void region_free(struct pair *p, struct region *r)
{
    if (r->mr)
        p->ops->mem_dereg(r->mr);
    if (r->map) {
        munmap(r->map, r->map_len);
        close(r->fd);
    } else {
        free(r->buf);
    }
    memset(r, 0, sizeof(*r));
}

/* One try of a post that returned @p rc: true when it was taken; on
 * CFX_ERR_AGAIN (the send queue full) both sides are polled so it drains,
 * at most until @p deadline; any other status fails the test. */
static inline bool posted(struct pair *p, int rc, uint64_t deadline, const char *what)
{
    if (rc == CFX_OK)
        return true;
    cr_assert_eq(rc, CFX_ERR_AGAIN, "%s: %s", what, cfx_errname(rc));
    cr_assert(cfx__now_ns() < deadline, "send queue stayed full for %d ms", WAIT_MS);
    poll_side(p->ops, &p->s[0]);
    poll_side(p->ops, &p->s[1]);
    return false;
}

/* Post a write, polling both sides while the queue is full. */
static inline void post_write(struct pair *p, struct cfx_tp_ep *ep, struct region *src,
                              uint64_t loff, const struct cfx_tp_rdesc *rdesc, uint64_t roff,
                              size_t len, uint32_t imm, uint64_t wr_id)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    while (!posted(p, p->ops->ep_write(ep, src->mr, loff, rdesc, roff, len, imm, wr_id),
                   deadline, "ep_write"))
        ;
}

static inline void post_send(struct pair *p, struct cfx_tp_ep *ep, const void *buf, size_t len,
                             uint64_t wr_id)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    while (!posted(p, p->ops->ep_send(ep, buf, len, wr_id), deadline, "ep_send"))
        ;
}

/* --- strangers (tpbase/tp_strangers.h) ---------------------------------------- */

/* One more connection from a to b, left unauthorized, with a message from a
 * (on dpdk an accepted session counts as a stranger's once its peer is
 * heard: before, it may be a forged address, capped as half open): b's
 * ep, a's in *ab. */
static inline struct cfx_tp_ep *stranger_connect(struct pair *p, struct cfx_tp_ep **ab)
{
    uint8_t addr[CFX_TP_ADDR_MAX];
    size_t len;
    get_addr(p, 1, addr, &len);
    int rc = p->ops->ep_connect(p->s[0].iface, addr, len, NODE_B, ab);
    cr_assert_eq(rc, CFX_OK, "ep_connect: %s %s", cfx_errname(rc), cfx_last_error());
    struct ev *e = wait_ev(p, 0, CFX_TP_COMP_CONNECTED, *ab, WAIT_MS);
    cr_assert_eq(e->status, CFX_OK, "connect: %s", cfx_errname(e->status));
    e = wait_ev(p, 1, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS);
    struct cfx_tp_ep *ba = e->ep;
    post_send(p, *ab, "hello", 5, 1);
    e = wait_ev(p, 1, CFX_TP_COMP_RECV, ba, WAIT_MS);
    cr_assert_eq(e->len, 5);
    cr_assert_eq(memcmp(e->data, "hello", 5), 0);
    wait_ev(p, 0, CFX_TP_COMP_SEND, *ab, WAIT_MS);
    return ba;
}

/* b closed @p ba (and so a's @p ab) for a newer stranger, saying why: at the
 * total cap (@p total) or its address's. */
static inline void expect_evicted(struct pair *p, int i, struct cfx_tp_ep *ab,
                                  struct cfx_tp_ep *ba, bool total)
{
    const char *why = total ? "the oldest connection not authenticated, closed for a newer one"
                            : "the oldest connection of its address not authenticated, closed";
    struct ev *e = wait_ev(p, 1, CFX_TP_COMP_EP_ERROR, ba, WAIT_MS);
    cr_assert_eq(e->status, CFX_ERR_NO_RESOURCE, "stranger %d: %s", i, cfx_errname(e->status));
    cr_assert(ba->why && strstr(ba->why, why), "stranger %d: why '%s'", i,
              ba->why ? ba->why : "(none)");
    e = wait_ev(p, 0, CFX_TP_COMP_EP_ERROR, ab, WAIT_MS);
    cr_assert_neq(e->status, CFX_OK);
    p->ops->ep_close(ba);
    p->ops->ep_close(ab);
}

#endif

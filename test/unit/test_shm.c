/*
 * shm transport specifics (the contract itself is test_transport.c):
 * the direct (one copy: the receiver reads the writer's sealed memfd) and
 * staged (through the ring) write paths byte for byte, ring wrap-around,
 * doorbells, a SIGKILLed peer, refused writes, fd and /dev/shm hygiene, and
 * both paths between two processes.
 *
 * Every wait polls with a deadline.  Forked children report by exit code.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <grp.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control/auth.h"
#include "dataplane/common/util.h"
#include "dataplane/shm/shm.h"
#include "dataplane/transport.h"
#include "testutil.h"

#define WAIT_MS 20000 /* a limit against hangs only: a loaded machine may be slow */

static const struct cfx_transport_ops *ops = &cfx__shm_ops;

/* ---- harness ------------------------------------------------------------------ */

struct ev {
    struct cfx_tp_completion c;
    uint8_t data[CFX_TP_SEND_MAX]; /* RECV: copy */
    bool used;
};

struct side {
    struct cfx_tp_iface *iface;
    struct ev *evs;
    size_t n, cap;
};

struct pair {
    struct side s[2];        /* [0] connects to [1] */
    struct cfx_tp_ep *ab, *ba;
};

static int poll_side(struct side *s)
{
    struct cfx_tp_completion comps[64];
    int n = ops->poll(s->iface, comps, 64);
    cr_assert_geq(n, 0, "poll: %s", cfx_errname(n));
    for (int i = 0; i < n; i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 1024;
            s->evs = realloc(s->evs, s->cap * sizeof(*s->evs));
            cr_assert_not_null(s->evs);
        }
        struct ev *e = &s->evs[s->n++];
        e->c = comps[i];
        e->used = false;
        if (comps[i].type == CFX_TP_COMP_RECV && comps[i].len)
            memcpy(e->data, comps[i].data, comps[i].len);
        e->c.data = NULL;
    }
    return n;
}

static void pump(struct pair *p)
{
    int n = 0;
    for (int i = 0; i < 2; i++)
        if (p->s[i].iface)
            n += poll_side(&p->s[i]);
    if (!n)
        sched_yield();
}

static struct ev *find_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    for (size_t i = 0; i < s->n; i++)
        if (!s->evs[i].used && s->evs[i].c.type == type && (!ep || s->evs[i].c.ep == ep))
            return &s->evs[i];
    return NULL;
}

static size_t count_ev(struct side *s, int type)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->evs[i].c.type == type;
    return n;
}

static struct ev *wait_ev(struct pair *p, int side, int type, struct cfx_tp_ep *ep, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    struct ev *e;
    while (!(e = find_ev(&p->s[side], type, ep))) {
        cr_assert(cfx__now_ns() < deadline, "timed out after %d ms waiting for type %d on %c",
                  ms, type, side ? 'b' : 'a');
        pump(p);
    }
    e->used = true;
    return e;
}

static void wait_count(struct pair *p, int side, int type, size_t count, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    while (count_ev(&p->s[side], type) < count) {
        cr_assert(cfx__now_ns() < deadline, "timed out waiting for %zu x type %d (have %zu)",
                  count, type, count_ev(&p->s[side], type));
        pump(p);
    }
}

#define TEST_TOKEN "shm-test-token-5f1c0a9e4b7d2836"

/* Every iface of these tests proves the same token, as the engine's do. */
static struct cfx_tp_iface_params iface_params(uint32_t node, const char *token)
{
    return (struct cfx_tp_iface_params){
        .field_mask = CFX_TP_IFACE_PARAM_NODE_ID | CFX_TP_IFACE_PARAM_TOKEN,
        .node_id = node,
        .token = token,
    };
}

static struct cfx_tp_iface *open_iface_token(uint32_t node, const char *token)
{
    struct cfx_tp_iface_params prm = iface_params(node, token);
    struct cfx_tp_iface *i = NULL;
    int rc = ops->iface_open(&prm, &i);
    cr_assert_eq(rc, CFX_OK, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    return i;
}

static struct cfx_tp_iface *open_iface(uint32_t node)
{
    struct cfx_tp_iface_params prm = iface_params(node, TEST_TOKEN);
    struct cfx_tp_iface *i = NULL;
    int rc = ops->iface_open(&prm, &i);
    cr_assert_eq(rc, CFX_OK, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    return i;
}

static void pair_open(struct pair *p)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);

    memset(p, 0, sizeof(*p));
    p->s[0].iface = open_iface(1);
    p->s[1].iface = open_iface(2);
    cr_assert_eq(ops->iface_addr(p->s[1].iface, addr, &len), CFX_OK);
    cr_assert_eq(addr[0], '@');
    cr_assert_eq(strlen(addr) + 1, len);
    cr_assert_eq(ops->ep_connect(p->s[0].iface, addr, len, 2, &p->ab), CFX_OK);
    wait_ev(p, 0, CFX_TP_COMP_CONNECTED, p->ab, WAIT_MS);
    p->ba = wait_ev(p, 1, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS)->c.ep;
    cr_assert_eq(p->ba->peer_node, 1);
}

static void pair_close(struct pair *p)
{
    if (p->ab)
        ops->ep_close(p->ab);
    if (p->ba)
        ops->ep_close(p->ba);
    for (int i = 0; i < 2; i++) {
        if (p->s[i].iface)
            ops->iface_close(p->s[i].iface);
        free(p->s[i].evs);
    }
    memset(p, 0, sizeof(*p));
}

static bool unsealed_memfd; /* memfd regions left unsealed (the refusal test) */

/* A region: private memory, or a window of a memfd (like the engine's arena). */
struct region {
    uint8_t *map;            /* whole allocation */
    size_t map_len;
    uint8_t *buf;            /* registered part */
    size_t len;
    int fd;
    struct cfx_tp_mr *mr;
    struct cfx_tp_rdesc rdesc;
};

static void region_reg(struct cfx_tp_iface *iface, struct region *r, size_t len, size_t off,
                       bool memfd, unsigned access, uint8_t fill)
{
    memset(r, 0, sizeof(*r));
    r->map_len = (off + len + 4096 + 4095) & ~(size_t)4095; /* a guard after the region */
    r->fd = -1;
    if (memfd) {
        r->fd = memfd_create("test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        cr_assert_geq(r->fd, 0);
        cr_assert_eq(ftruncate(r->fd, (off_t)r->map_len), 0);
        /* as the engine's arena: one-copy writes read only from sealed files */
        if (!unsealed_memfd)
            cr_assert_eq(fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
        cr_assert_neq(r->map, MAP_FAILED);
    } else {
        r->map = aligned_alloc(4096, r->map_len);
        cr_assert_not_null(r->map);
    }
    memset(r->map, fill, r->map_len);
    r->buf = r->map + off;
    r->len = len;
    struct cfx_tp_mem_desc md = { .addr = r->buf, .len = len, .memtype = CFX_MEMTYPE_HOST,
                                  .file_fd = r->fd, .file_off = off };
    cr_assert_eq(ops->mem_reg(iface, &md, access, &r->mr), CFX_OK);
    cr_assert_eq(ops->mr_pack(r->mr, &r->rdesc), CFX_OK);
}

static void region_free(struct region *r)
{
    if (r->mr)
        ops->mem_dereg(r->mr);
    if (r->fd >= 0) {
        munmap(r->map, r->map_len);
        close(r->fd);
    } else {
        free(r->map);
    }
    memset(r, 0, sizeof(*r));
}

static void post_write(struct pair *p, struct cfx_tp_ep *ep, struct region *src, uint64_t loff,
                       const struct cfx_tp_rdesc *rd, uint64_t roff, size_t len, uint32_t imm,
                       uint64_t wr_id)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    int rc;
    while ((rc = ops->ep_write(ep, src->mr, loff, rd, roff, len, imm, wr_id)) == CFX_ERR_AGAIN) {
        cr_assert(cfx__now_ns() < deadline, "send queue stayed full");
        pump(p);
    }
    cr_assert_eq(rc, CFX_OK, "ep_write: %s", cfx_errname(rc));
}

static void post_send(struct pair *p, struct cfx_tp_ep *ep, const void *buf, size_t len,
                      uint64_t wr_id)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    int rc;
    while ((rc = ops->ep_send(ep, buf, len, wr_id)) == CFX_ERR_AGAIN) {
        cr_assert(cfx__now_ns() < deadline, "send queue stayed full");
        pump(p);
    }
    cr_assert_eq(rc, CFX_OK, "ep_send: %s", cfx_errname(rc));
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    cr_assert_not_null(d);
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the DIR's own fd */
}

/* Files in /dev/shm that this transport could have left (it uses memfds, so
 * none; other programs on the machine may come and go, so only ours count). */
static int count_dev_shm(void)
{
    int n = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *de;
    if (!d)
        return 0;
    while ((de = readdir(d)))
        n += strstr(de->d_name, "conflux") != NULL;
    closedir(d);
    return n;
}

/* ---- byte-for-byte over both paths ------------------------------------------------- */

static void check_paths(bool memfd, bool direct)
{
    static const struct { size_t loff, roff, len; } w[] = {
        { 0, 0, 1 },
        { 7, 4097, 4095 },
        { 3, 1, (1u << 20) + 3 },
        { 1, 12345, 9u << 20 },     /* 9 MiB at an odd offset: > 2 rings */
    };
    struct pair p;
    struct region src, dst;
    const size_t dst_off = 3 * 4096 + 17; /* registration starts mid-page in the file */

    pair_open(&p);
    /* one copy when the SOURCE is in a sealed file (the receiver reads it) */
    region_reg(p.s[0].iface, &src, 10u << 20, 5 * 4096 + 3, memfd, CFX_TP_ACCESS_LOCAL, 0);
    region_reg(p.s[1].iface, &dst, 10u << 20, dst_off, memfd, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);

    for (size_t i = 0; i < CFX_ARRAY_SIZE(w); i++) {
        uint64_t seed = 1000 + i;
        memset(dst.map, 0xAA, dst.map_len);
        cfx_test_fill(src.buf + w[i].loff, w[i].len, seed);
        post_write(&p, p.ab, &src, w[i].loff, &dst.rdesc, w[i].roff, w[i].len, 0xABC0u + (uint32_t)i, i);
        struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
        cr_assert_eq(e->c.imm, 0xABC0u + i);
        cr_assert_eq(e->c.len, w[i].len);
        e = wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);
        cr_assert_eq(e->c.status, CFX_OK);
        cr_assert_eq(e->c.wr_id, i);
        size_t bad = cfx_test_check(dst.buf + w[i].roff, w[i].len, seed);
        cr_assert_eq(bad, (size_t)-1, "write %zu of %zu bytes: byte %zu differs", i, w[i].len, bad);
        /* nothing outside [roff, roff + len) changed */
        for (size_t k = 0; k < dst_off + w[i].roff; k++)
            cr_assert_eq(dst.map[k], 0xAA, "byte %zu before write %zu touched", k, i);
        for (size_t k = dst_off + w[i].roff + w[i].len; k < dst.map_len; k++)
            cr_assert_eq(dst.map[k], 0xAA, "byte %zu after write %zu touched", k, i);
    }
    struct cfx__shm_ep *a = cfx__shm_ep_of(p.ab), *b = cfx__shm_ep_of(p.ba);
    cr_assert_eq(a->n_direct, direct ? CFX_ARRAY_SIZE(w) : 0, "direct writes: %llu",
                 (unsigned long long)a->n_direct);
    cr_assert_eq(a->n_staged, direct ? 0 : CFX_ARRAY_SIZE(w), "staged writes: %llu",
                 (unsigned long long)a->n_staged);
    cr_assert_eq(b->n_rx_direct + b->n_rx_staged, CFX_ARRAY_SIZE(w));
    region_free(&src);
    region_free(&dst);
    pair_close(&p);
}

Test(shm, direct_bytes, .timeout = 60)
{
    check_paths(true, true);
}

Test(shm, staged_bytes, .timeout = 60)
{
    check_paths(false, false);
}

/* A source file its owner could shrink under the receiver's copy (not
 * sealed) is never offered for one copy: every write is staged, bytes
 * intact. */
Test(shm, unsealed_memfd_is_staged, .timeout = 60)
{
    unsealed_memfd = true;
    check_paths(true, false);
}

/* ---- sizes from the environment ------------------------------------------------------ */

/* Ring and fragment sizes beyond their bounds are brought to the nearest one
 * with a warning naming it (a fragment size out of range was replaced by the
 * default without a word). */
static void sizes_from_env(const char *ring, const char *frag, size_t want_ring,
                           size_t want_frag, const char *said)
{
    char path[] = "/tmp/cfx-test-shmenv-XXXXXX";
    int fd;
    setenv("CFX_SHM_RING_SIZE", ring, 1);
    setenv("CFX_SHM_FRAG_SIZE", frag, 1);
    int saved = cfx_test_stderr_to(path, &fd);
    struct cfx_tp_iface *i = open_iface(1);
    cfx_test_stderr_back(saved);
    close(fd);
    unsetenv("CFX_SHM_RING_SIZE");
    unsetenv("CFX_SHM_FRAG_SIZE");
    const struct cfx__shm_iface *si = (const struct cfx__shm_iface *)i;
    size_t got_ring = si->ring_size, got_frag = si->frag_size;
    ops->iface_close(i);
    int found = cfx_test_file_contains(path, said);
    unlink(path);
    cr_assert_eq(got_ring, want_ring, "ring %s: %zu", ring, got_ring);
    cr_assert_eq(got_frag, want_frag, "fragment %s: %zu", frag, got_frag);
    cr_assert(found, "no warning \"%s\"", said);
}

Test(shm, sizes_from_env_brought_into_range, .timeout = 30)
{
    sizes_from_env("100K", "1", 64u << 10, CFX_SHM_FRAG_MIN,
                   "CFX_SHM_FRAG_SIZE=1: using 4096");
    sizes_from_env("100K", "64K", 64u << 10, 16u << 10,
                   "CFX_SHM_RING_SIZE=102400: using 65536");
    sizes_from_env("1G", "64K", CFX_SHM_RING_MAX, 64u << 10,
                   "CFX_SHM_RING_SIZE=1073741824: using 268435456");
    sizes_from_env("4K", "8K", CFX_SHM_RING_MIN, 8u << 10,
                   "CFX_SHM_RING_SIZE=4096: using 65536");
}

/* ---- wrap-around and ordering -------------------------------------------------------- */

Test(shm, wrap_interleaved, .timeout = 60)
{
    enum { N = 3000, SLOT = 48 * 1024 };
    struct pair p;
    struct region src, src_file, dst_direct, dst_staged;
    uint8_t msg[CFX_TP_SEND_MAX];

    setenv("CFX_SHM_RING_SIZE", "64K", 1); /* wraps every few ops */
    pair_open(&p);
    unsetenv("CFX_SHM_RING_SIZE");
    cr_assert_eq(cfx__shm_ep_of(p.ab)->tx.size, 64u * 1024);
    region_reg(p.s[0].iface, &src, (size_t)N * SLOT / 8, 0, false, CFX_TP_ACCESS_LOCAL, 0);
    region_reg(p.s[0].iface, &src_file, (size_t)N * SLOT / 8, 0, true, CFX_TP_ACCESS_LOCAL, 0);
    region_reg(p.s[1].iface, &dst_direct, (size_t)N * SLOT / 8, 0, true,
               CFX_TP_ACCESS_REMOTE_WRITE, 0);
    region_reg(p.s[1].iface, &dst_staged, (size_t)N * SLOT / 8, 0, false,
               CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cfx_test_fill(src.buf, src.len, 77);
    cfx_test_fill(src_file.buf, src_file.len, 77); /* the same bytes: one copy reads this */

    /* op i: send (i % 3 == 0), or a write of 1..SLOT bytes, alternating paths;
     * slots are reused, so each write is checked when it is reported */
    size_t nslots = src.len / SLOT;
    size_t checked = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (i % 3 == 0) {
            size_t len = (i * 131u) % (CFX_TP_SEND_MAX + 1);
            memset(msg, (int)(i & 0xff), len);
            if (len >= 4)
                memcpy(msg, &i, 4);
            post_send(&p, p.ab, msg, len, i);
        } else {
            size_t len = 1 + (i * 7919u) % SLOT;
            size_t slot = i % nslots;
            struct region *d = (i & 1) ? &dst_direct : &dst_staged;
            post_write(&p, p.ab, (i & 1) ? &src_file : &src, slot * SLOT, &d->rdesc, slot * SLOT,
                       len, i, i);
        }
        /* keep the in-flight window under the slot reuse distance */
        while (count_ev(&p.s[1], CFX_TP_COMP_RECV) + count_ev(&p.s[1], CFX_TP_COMP_WRITE_IMM) +
                   nslots / 2 < i + 1)
            pump(&p);
        for (; checked < p.s[1].n; checked++) {
            struct ev *e = &p.s[1].evs[checked];
            if (e->c.type != CFX_TP_COMP_WRITE_IMM)
                continue;
            uint32_t j = e->c.imm;
            size_t len = 1 + (j * 7919u) % SLOT, slot = j % nslots;
            struct region *d = (j & 1) ? &dst_direct : &dst_staged;
            cr_assert_eq(e->c.len, len);
            cr_assert_eq(memcmp(d->buf + slot * SLOT, src.buf + slot * SLOT, len), 0,
                         "write %u differs", j);
        }
    }
    wait_count(&p, 1, CFX_TP_COMP_RECV, (N + 2) / 3, WAIT_MS);
    wait_count(&p, 1, CFX_TP_COMP_WRITE_IMM, N - (N + 2) / 3, WAIT_MS);
    wait_count(&p, 0, CFX_TP_COMP_WRITE, N - (N + 2) / 3, WAIT_MS);
    wait_count(&p, 0, CFX_TP_COMP_SEND, (N + 2) / 3, WAIT_MS);

    /* receiver: one event per op, in posted order */
    uint32_t next = 0;
    for (size_t k = 0; k < p.s[1].n; k++) {
        struct ev *e = &p.s[1].evs[k];
        if (e->c.type == CFX_TP_COMP_RECV) {
            cr_assert_eq(next % 3, 0, "op %u: got a RECV", next);
            size_t len = (next * 131u) % (CFX_TP_SEND_MAX + 1);
            cr_assert_eq(e->c.len, len);
            if (len >= 4) {
                uint32_t v;
                memcpy(&v, e->data, 4);
                cr_assert_eq(v, next);
            }
            next++;
        } else if (e->c.type == CFX_TP_COMP_WRITE_IMM) {
            cr_assert_neq(next % 3, 0, "op %u: got a WRITE_IMM", next);
            cr_assert_eq(e->c.imm, next);
            next++;
        }
    }
    cr_assert_eq(next, N);
    /* sender: completions in posted order per kind */
    uint64_t lw = 0, ls = 0;
    for (size_t k = 0; k < p.s[0].n; k++) {
        struct ev *e = &p.s[0].evs[k];
        if (e->c.type == CFX_TP_COMP_WRITE) {
            cr_assert_geq(e->c.wr_id, lw);
            lw = e->c.wr_id;
        } else if (e->c.type == CFX_TP_COMP_SEND) {
            cr_assert_geq(e->c.wr_id, ls);
            ls = e->c.wr_id;
        }
    }
    struct cfx__shm_ep *a = cfx__shm_ep_of(p.ab);
    cr_assert_gt(a->tx.pos / a->tx.size, 100, "the ring wrapped only %llu times",
                 (unsigned long long)(a->tx.pos / a->tx.size));
    cr_assert_gt(a->n_direct, 0);
    cr_assert_gt(a->n_staged, 0);
    region_free(&src);
    region_free(&src_file);
    region_free(&dst_direct);
    region_free(&dst_staged);
    pair_close(&p);
}

/* ---- doorbells ------------------------------------------------------------------------- */

static bool fd_readable(int fd, int ms)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    return poll(&pfd, 1, ms) == 1;
}

static void arm_until_ok(struct pair *p, int side)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    for (;;) {
        poll_side(&p->s[side]);
        int rc = ops->iface_arm(p->s[side].iface);
        if (rc == CFX_OK)
            return;
        cr_assert_eq(rc, CFX_ERR_AGAIN);
        cr_assert(cfx__now_ns() < deadline, "iface_arm kept saying AGAIN");
    }
}

Test(shm, doorbells, .timeout = 60)
{
    struct pair p;
    struct region src, dst;
    int fa, fb;

    setenv("CFX_SHM_RING_SIZE", "64K", 1);
    pair_open(&p);
    unsetenv("CFX_SHM_RING_SIZE");
    fa = ops->iface_fd(p.s[0].iface);
    fb = ops->iface_fd(p.s[1].iface);
    region_reg(p.s[0].iface, &src, 1u << 20, 0, false, CFX_TP_ACCESS_LOCAL, 0x5A);
    region_reg(p.s[1].iface, &dst, 1u << 20, 0, false, CFX_TP_ACCESS_REMOTE_WRITE, 0);

    /* idle: both may sleep, and nothing wakes them */
    arm_until_ok(&p, 0);
    arm_until_ok(&p, 1);
    cr_assert(!fd_readable(fa, 20) && !fd_readable(fb, 20), "idle iface fd readable");

    /* a write wakes the sleeping receiver */
    cr_assert_eq(ops->ep_write(p.ab, src.mr, 0, &dst.rdesc, 0, 1000, 1, 1), CFX_OK);
    cr_assert(fd_readable(fb, WAIT_MS), "receiver not woken by a write");
    wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
    wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);

    /* a writer blocked on a full ring sleeps until the receiver makes room */
    cr_assert_eq(ops->ep_write(p.ab, src.mr, 0, &dst.rdesc, 0, 1u << 20, 2, 2), CFX_OK);
    for (int i = 0; i < 10; i++)
        poll_side(&p.s[0]);
    cr_assert_eq(cfx__shm_ep_of(p.ab)->txq_count, 1, "1 MiB went through a 64K ring unread");
    arm_until_ok(&p, 0);
    cr_assert(!fd_readable(fa, 20), "blocked writer woken for nothing");
    poll_side(&p.s[1]); /* drains the ring once */
    cr_assert(fd_readable(fa, WAIT_MS), "blocked writer not woken when room came");
    wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
    wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);
    for (size_t i = 0; i < dst.len; i++)
        cr_assert_eq(dst.buf[i], 0x5A);

    /* ... and so does one whose write was posted after its iface was armed
     * (a thread that drives without polling while the progress thread
     * sleeps on the arming): the post itself asks for the doorbell */
    memset(dst.buf, 0, dst.len);
    arm_until_ok(&p, 0);
    cr_assert_eq(ops->ep_write(p.ab, src.mr, 0, &dst.rdesc, 0, 1u << 20, 3, 3), CFX_OK);
    cr_assert_eq(cfx__shm_ep_of(p.ab)->txq_count, 1, "1 MiB went through a 64K ring unread");
    cr_assert(!fd_readable(fa, 20), "blocked writer woken for nothing");
    poll_side(&p.s[1]); /* drains the ring once */
    cr_assert(fd_readable(fa, WAIT_MS), "writer that posted while armed not woken when room came");
    wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
    wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);
    for (size_t i = 0; i < dst.len; i++)
        cr_assert_eq(dst.buf[i], 0x5A);

    /* while sleeping, the peer's death wakes us */
    arm_until_ok(&p, 1);
    ops->ep_close(p.ab);
    p.ab = NULL;
    cr_assert(fd_readable(fb, WAIT_MS), "peer close did not wake us");
    struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    cr_assert_eq(e->c.status, CFX_ERR_CLOSED);
    region_free(&src);
    region_free(&dst);
    pair_close(&p);
}

/* ---- refused writes -------------------------------------------------------------------- */

enum forge { FORGE_LEN, FORGE_KEY, FORGE_NONE_OOB };

static void check_refused(bool memfd, enum forge how)
{
    struct pair p;
    struct region src, dst;
    struct cfx_tp_rdesc rd;
    struct cfx__shm_rdesc r;
    const size_t off = 8192;
    uint64_t roff = 0;
    size_t len = 100;

    pair_open(&p);
    region_reg(p.s[0].iface, &src, 1u << 20, 0, memfd, CFX_TP_ACCESS_LOCAL, 0x11);
    region_reg(p.s[1].iface, &dst, 65536, off, memfd, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    rd = dst.rdesc;
    memcpy(&r, rd.data, sizeof(r));
    switch (how) {
    case FORGE_LEN:           /* the rdesc claims more than was registered */
        r.len = 1u << 20;
        roff = 65536 - 10;
        len = 300000;
        break;
    case FORGE_KEY:           /* a key of another generation */
        r.key ^= 0x10000;
        break;
    case FORGE_NONE_OOB:      /* honest rdesc, write crossing its end */
        roff = 65536 - 10;
        break;
    }
    memcpy(rd.data, &r, sizeof(r));
    post_send(&p, p.ab, "x", 1, 1);
    wait_ev(&p, 1, CFX_TP_COMP_RECV, p.ba, WAIT_MS);
    cr_assert_eq(ops->ep_write(p.ab, src.mr, 0, &rd, roff, len, 7, 2), CFX_OK);
    struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    cr_assert_eq(e->c.status, CFX_ERR_PROTO);
    e = wait_ev(&p, 0, CFX_TP_COMP_EP_ERROR, p.ab, WAIT_MS);
    cr_assert_eq(e->c.status, CFX_ERR_PROTO, "writer told %s", cfx_errname(e->c.status));
    cr_assert_null(find_ev(&p.s[1], CFX_TP_COMP_WRITE_IMM, NULL));
    for (size_t i = 0; i < dst.map_len; i++)
        cr_assert_eq(dst.map[i], 0xAA, "refused write touched byte %zu", i);
    cr_assert_eq(p.ab->status, CFX_ERR_PROTO);
    cr_assert_eq(ops->ep_send(p.ab, "y", 1, 3), CFX_ERR_PROTO);
    region_free(&src);
    region_free(&dst);
    pair_close(&p);
}

Test(shm, refused_forged_len, .timeout = 30)
{
    check_refused(false, FORGE_LEN);
}

Test(shm, refused_bad_key, .timeout = 30)
{
    check_refused(false, FORGE_KEY);
}

Test(shm, refused_out_of_bounds_staged, .timeout = 30)
{
    check_refused(false, FORGE_NONE_OOB);
}

Test(shm, refused_out_of_bounds_memfd, .timeout = 30)
{
    check_refused(true, FORGE_NONE_OOB);
}

/* A reused fd number names another file: the receiver's mapping cache of
 * the writer's sources must notice (inode). */
Test(shm, memfd_fd_reuse, .timeout = 30)
{
    struct pair p;
    struct region s1, s2, dst;

    pair_open(&p);
    region_reg(p.s[0].iface, &s1, 65536, 0, true, CFX_TP_ACCESS_LOCAL, 0x33);
    region_reg(p.s[1].iface, &dst, 65536, 0, true, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    post_write(&p, p.ab, &s1, 0, &dst.rdesc, 0, 65536, 1, 1);
    wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
    wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);
    int old_fd = s1.fd;
    region_free(&s1);
    region_reg(p.s[0].iface, &s2, 65536, 0, true, CFX_TP_ACCESS_LOCAL, 0x44);
    cr_assert_eq(s2.fd, old_fd, "test needs the fd number reused");
    post_write(&p, p.ab, &s2, 0, &dst.rdesc, 0, 65536, 2, 2);
    wait_ev(&p, 1, CFX_TP_COMP_WRITE_IMM, p.ba, WAIT_MS);
    for (size_t i = 0; i < dst.len; i++)
        cr_assert_eq(dst.buf[i], 0x44, "byte %zu not read from the new file", i);
    cr_assert_eq(cfx__shm_ep_of(p.ab)->n_direct, 2);
    cr_assert_eq(cfx__shm_ep_of(p.ba)->n_rx_direct, 2);
    region_free(&s2);
    region_free(&dst);
    pair_close(&p);
}

/* ---- hygiene ------------------------------------------------------------------------------ */

Test(shm, no_leaks, .timeout = 30)
{
    int fds0 = count_fds(), shm0 = count_dev_shm();
    for (int round = 0; round < 3; round++) {
        struct pair p;
        struct region src, sf, d1, d2;
        pair_open(&p);
        region_reg(p.s[0].iface, &src, 1u << 20, 0, false, CFX_TP_ACCESS_LOCAL, 1);
        region_reg(p.s[0].iface, &sf, 1u << 20, 0, true, CFX_TP_ACCESS_LOCAL, 1);
        region_reg(p.s[1].iface, &d1, 1u << 20, 0, true, CFX_TP_ACCESS_REMOTE_WRITE, 0);
        region_reg(p.s[1].iface, &d2, 1u << 20, 0, false, CFX_TP_ACCESS_REMOTE_WRITE, 0);
        post_write(&p, p.ab, &sf, 0, &d1.rdesc, 0, 1u << 20, 1, 1);
        post_write(&p, p.ab, &src, 0, &d2.rdesc, 0, 1u << 20, 2, 2);
        post_send(&p, p.ba, "bye", 3, 3);
        wait_count(&p, 1, CFX_TP_COMP_WRITE_IMM, 2, WAIT_MS);
        wait_ev(&p, 0, CFX_TP_COMP_RECV, p.ab, WAIT_MS);
        /* one side closes with writes in flight, the other notices */
        post_write(&p, p.ab, &sf, 0, &d2.rdesc, 0, 1u << 20, 3, 3);
        ops->ep_close(p.ab);
        p.ab = NULL;
        wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
        region_free(&src);
        region_free(&sf);
        region_free(&d1);
        region_free(&d2);
        pair_close(&p);
    }
    cr_assert_eq(count_fds(), fds0, "fds: %d before, %d after", fds0, count_fds());
    cr_assert_eq(count_dev_shm(), shm0, "conflux files left in /dev/shm");
}

/* ---- a peer killed while it writes straight into our memory ------------------------------- */

Test(shm, peer_killed_direct, .timeout = 30)
{
    struct cfx_tp_iface *iface = open_iface(1);
    struct region dst;
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    enum { SZ = 1 << 20, SLOTS = 8 };

    region_reg(iface, &dst, (size_t)SZ * SLOTS, 0, true, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cr_assert_eq(ops->iface_addr(iface, addr, &alen), CFX_OK);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct cfx_tp_iface_params prm = iface_params(2, TEST_TOKEN);
        struct cfx_tp_iface *ci;
        struct cfx_tp_ep *ep;
        struct cfx_tp_mr *mr;
        struct cfx_tp_completion comps[64];
        /* a source the parent reads straight from (one copy) */
        int sfd = memfd_create("test-src", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (sfd < 0 || ftruncate(sfd, SZ) < 0 ||
            fcntl(sfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
            _exit(2);
        uint8_t *buf = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
        if (buf == MAP_FAILED)
            _exit(2);
        struct cfx_tp_mem_desc md = { .addr = buf, .len = SZ, .memtype = CFX_MEMTYPE_HOST,
                                      .file_fd = sfd };
        uint64_t end = cfx__deadline_ns(20000);
        if (ops->iface_open(&prm, &ci) != CFX_OK ||
            ops->mem_reg(ci, &md, CFX_TP_ACCESS_LOCAL, &mr) != CFX_OK ||
            ops->ep_connect(ci, addr, alen, 1, &ep) != CFX_OK)
            _exit(2);
        for (uint32_t i = 0; cfx__now_ns() < end;) {
            int n = ops->poll(ci, comps, 64);
            for (int k = 0; k < n; k++)
                if (comps[k].type == CFX_TP_COMP_EP_ERROR)
                    _exit(3);
            while (ops->ep_write(ep, mr, 0, &dst.rdesc, (uint64_t)(i % SLOTS) * SZ, SZ, i, i) ==
                   CFX_OK)
                i++;
            if (cfx__shm_ep_of(ep)->n_staged)
                _exit(5); /* must be the direct path */
        }
        _exit(4);
    }
    struct pair p = { .s = { { .iface = iface } } };
    struct ev *e = wait_ev(&p, 0, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS);
    struct cfx_tp_ep *ep = e->c.ep;
    wait_count(&p, 0, CFX_TP_COMP_WRITE_IMM, 20, WAIT_MS);
    cr_assert_gt(cfx__shm_ep_of(ep)->n_rx_direct, 0);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    uint64_t t0 = cfx__now_ns();
    e = wait_ev(&p, 0, CFX_TP_COMP_EP_ERROR, ep, WAIT_MS);
    uint64_t ms = (cfx__now_ns() - t0) / 1000000;
    cr_assert_eq(e->c.status, CFX_ERR_PEER_FAILED, "status %s", cfx_errname(e->c.status));
    cr_log_info("shm: SIGKILLed peer noticed after %llu ms", (unsigned long long)ms);
    int wst;
    cr_assert_eq(waitpid(pid, &wst, 0), pid);
    cr_assert(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "child exited with %d",
              WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    cr_assert_eq(ops->ep_send(ep, "x", 1, 1), CFX_ERR_PEER_FAILED);
    ops->ep_close(ep);
    region_free(&dst);
    ops->iface_close(iface);
    free(p.s[0].evs);
}

/* ---- two processes, both write paths ----------------------------------------------------------- */

/*
 * A writer process moves BW_SIZE from a memfd (arena) source into a memfd
 * destination, and from private memory into a private one, BW_ITERS rounds
 * each, in the engine's chunk size.  Checked: every byte of every round, and
 * the path taken, counted per write by the receiver (direct: one copy, by the
 * receiver from its read-only mapping of the writer's file; staged: through
 * the ring).
 * The GB/s of both paths and of memcpy are logged as METRIC lines, not
 * asserted: scripts/bench-goals.sh holds their goals (docs/PERFORMANCE.md).
 */
#define BW_SIZE  (64u << 20)
#define BW_CHUNK (4u << 20)  /* the engine writes chunks of 64 KiB..4 MiB */
#define BW_ITERS 6
#define BW_SEED  1234

static double memcpy_gbps(void)
{
    uint8_t *a = malloc(BW_SIZE), *b = malloc(BW_SIZE);
    double best = 0;
    cr_assert(a && b);
    memset(a, 1, BW_SIZE);
    memset(b, 2, BW_SIZE);
    for (int i = 0; i < 5; i++) {
        uint64_t t = cfx__now_ns();
        memcpy(b, a, BW_SIZE);
        double g = (double)BW_SIZE / (double)(cfx__now_ns() - t);
        best = g > best ? g : best;
        a[i] = b[i + 1];
    }
    free(a);
    free(b);
    return best;
}

/* Writer process: BW_ITERS rounds of BW_SIZE in BW_CHUNK writes, each round
 * started by a RECV from the parent.  Its deadline only ends a hang. */
static void bw_child(int rfd, bool direct)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t alen;
    struct cfx_tp_rdesc rd;
    struct cfx_tp_iface_params prm = iface_params(2, TEST_TOKEN);
    struct cfx_tp_iface *ci;
    struct cfx_tp_ep *ep;
    struct cfx_tp_mr *mr;
    struct cfx_tp_completion c[64];
    uint64_t end = cfx__deadline_ns(60000);

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (read(rfd, &alen, sizeof(alen)) != sizeof(alen) || alen > sizeof(addr) ||
        read(rfd, addr, alen) != (ssize_t)alen || read(rfd, &rd, sizeof(rd)) != sizeof(rd))
        _exit(2);
    /* direct: the source in a sealed memfd, as the engine's arena (one copy,
     * by the receiver); else private memory (staged) */
    int sfd = -1;
    uint8_t *src;
    if (direct) {
        sfd = memfd_create("test-src", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (sfd < 0 || ftruncate(sfd, BW_SIZE) < 0 ||
            fcntl(sfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
            _exit(2);
        src = mmap(NULL, BW_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
        if (src == MAP_FAILED)
            _exit(2);
    } else if (!(src = malloc(BW_SIZE))) {
        _exit(2);
    }
    cfx_test_fill(src, BW_SIZE, BW_SEED);
    struct cfx_tp_mem_desc md = { .addr = src, .len = BW_SIZE, .memtype = CFX_MEMTYPE_HOST,
                                  .file_fd = sfd };
    if (ops->iface_open(&prm, &ci) != CFX_OK || ops->mem_reg(ci, &md, CFX_TP_ACCESS_LOCAL, &mr) ||
        ops->ep_connect(ci, addr, alen, 1, &ep) != CFX_OK)
        _exit(2);
    int rounds = 0, done = 0, posted = 0;
    size_t off = 0;
    while (cfx__now_ns() < end) {
        int n = ops->poll(ci, c, 64);
        for (int k = 0; k < n; k++) {
            if (c[k].type == CFX_TP_COMP_EP_ERROR)
                _exit(rounds == BW_ITERS ? 0 : 3);
            if (c[k].type == CFX_TP_COMP_RECV)
                rounds++;
            if (c[k].type == CFX_TP_COMP_WRITE)
                done++;
        }
        while (posted < rounds * (int)(BW_SIZE / BW_CHUNK) &&
               ops->ep_write(ep, mr, off, &rd, off, BW_CHUNK, (uint32_t)posted, 0) == CFX_OK) {
            posted++;
            off = (off + BW_CHUNK) % BW_SIZE;
        }
        if (!n)
            sched_yield();
    }
    _exit(4);
}

/* Best GB/s of BW_ITERS rounds (and the first, cold one); every round's
 * bytes checked and every write counted on the path @p direct says. */
static double bw_measure(bool direct, double *first)
{
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(pfd[1]);
        bw_child(pfd[0], direct);
    }
    close(pfd[0]);
    struct pair p;
    memset(&p, 0, sizeof(p));
    p.s[0].iface = open_iface(1);
    struct region dst;
    region_reg(p.s[0].iface, &dst, BW_SIZE, 0, direct, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(ops->iface_addr(p.s[0].iface, addr, &alen), CFX_OK);
    cr_assert(write(pfd[1], &alen, sizeof(alen)) == sizeof(alen) &&
              write(pfd[1], addr, alen) == (ssize_t)alen &&
              write(pfd[1], &dst.rdesc, sizeof(dst.rdesc)) == sizeof(dst.rdesc));
    close(pfd[1]);
    struct cfx_tp_ep *ep = wait_ev(&p, 0, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS)->c.ep;
    double best = 0;
    size_t per_round = BW_SIZE / BW_CHUNK;
    for (int it = 0; it < BW_ITERS; it++) {
        memset(dst.buf, 0, BW_SIZE); /* each round must bring every byte again */
        uint64_t t = cfx__now_ns();
        post_send(&p, ep, "go", 2, 0);
        wait_count(&p, 0, CFX_TP_COMP_WRITE_IMM, per_round * (size_t)(it + 1), WAIT_MS);
        double g = (double)BW_SIZE / (double)(cfx__now_ns() - t);
        if (it == 0)
            *first = g;
        best = g > best ? g : best;
        size_t bad = cfx_test_check(dst.buf, BW_SIZE, BW_SEED);
        cr_assert_eq(bad, (size_t)-1, "%s round %d: byte %zu differs", direct ? "direct" : "staged",
                     it, bad);
    }
    const struct cfx__shm_ep *se = cfx__shm_ep_of(ep);
    uint64_t writes = (uint64_t)per_round * BW_ITERS;
    cr_assert_eq(se->n_rx_direct, direct ? writes : 0, "direct writes landed: %llu of %llu",
                 (unsigned long long)se->n_rx_direct, (unsigned long long)writes);
    cr_assert_eq(se->n_rx_staged, direct ? 0 : writes, "staged writes landed: %llu of %llu",
                 (unsigned long long)se->n_rx_staged, (unsigned long long)writes);
    ops->ep_close(ep);
    int wst;
    cr_assert_eq(waitpid(pid, &wst, 0), pid);
    cr_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "writer exited with %d",
              WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    region_free(&dst);
    ops->iface_close(p.s[0].iface);
    free(p.s[0].evs);
    return best;
}

Test(shm, two_process_paths, .timeout = 120)
{
    double d_first = 0, s_first = 0;
    double m = memcpy_gbps();
    double d = bw_measure(true, &d_first);
    double s = bw_measure(false, &s_first);
    cr_log_info("METRIC shm_memcpy_GBps %.2f", m);
    cr_log_info("METRIC shm_direct_GBps %.2f", d);
    cr_log_info("METRIC shm_staged_GBps %.2f", s);
    cr_log_info("shm, 64 MiB in 4 MiB writes: direct %.2f GB/s (%.2fx memcpy, first round %.2f), "
                "staged %.2f GB/s (%.2fx, first %.2f)",
                d, d / m, d_first, s, s / m, s_first);
}

/* A peer's segment whose rings do not start empty is refused: the
 * acceptor's ring views start from those positions, and one near the end
 * of a ring would make its first write run past the mapping. */
Test(shm, refused_segment_not_empty, .timeout = 30)
{
    const uint64_t ring = CFX_SHM_RING_MIN;
    void *seg = NULL, *mine = NULL;
    size_t len = 0, mlen = 0;
    int fd = cfx__shm_seg_create(ring, &seg, &len);
    cr_assert_geq(fd, 0, "%s", cfx_last_error());
    /* a clean one attaches */
    cr_assert_eq(cfx__shm_seg_attach(fd, ring, &mine, &mlen), CFX_OK, "%s", cfx_last_error());
    munmap(mine, mlen);
    struct cfx__shm_seg_hdr *h = seg;
    for (int r = 0; r < 2; r++) {
        atomic_store(&h->ctl[r].head, ring - 1);
        atomic_store(&h->ctl[r].tail, ring - 1);
        cr_assert_eq(cfx__shm_seg_attach(fd, ring, &mine, &mlen), CFX_ERR_PROTO);
        cr_assert(strstr(cfx_last_error(), "does not start empty"), "%s", cfx_last_error());
        atomic_store(&h->ctl[r].head, 0);
        atomic_store(&h->ctl[r].tail, 0);
    }
    munmap(seg, len);
    close(fd);
}

/* A stranger that connects to the rendezvous socket and says nothing is
 * dropped at the handshake deadline, without a word to the user. */
Test(shm, silent_stranger_dropped, .timeout = 60)
{
    struct cfx_tp_iface *iface = open_iface(1);
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(ops->iface_addr(iface, addr, &alen), CFX_OK);
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    size_t nlen = strlen(addr); /* "@name": abstract, the '@' becomes NUL */
    memcpy(sun.sun_path, addr, nlen);
    sun.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sun,
                         (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nlen)), 0,
                 "%s", strerror(errno));
    struct cfx_tp_completion comps[16];
    int events = 0;
    char c;
    /* waits for the close itself; the 20 s past the deadline only end a hang */
    uint64_t t0 = cfx__now_ns(), end = t0 + (CFX_SHM_CONNECT_NS / 1000000 + 20000) * 1000000ull;
    bool closed = false;
    while (!closed && cfx__now_ns() < end) {
        int n = ops->poll(iface, comps, 16);
        cr_assert_geq(n, 0);
        events += n;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        if (!n)
            usleep(1000);
    }
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    cr_assert(closed, "a silent stranger kept its connection for %.1f s", secs);
    cr_assert_geq(secs, CFX_SHM_CONNECT_NS / 1e9 - 0.5, "dropped too early (%.1f s)", secs);
    cr_assert_eq(events, 0, "the user saw %d completions", events);
    cr_log_info("silent shm stranger dropped after %.1f s", secs);
    close(fd);
    ops->iface_close(iface);
}

/* ---- who may connect ------------------------------------------------------------------------ */

/* Become nobody (uid and gid 65534) in a forked child; false when we cannot. */
static bool become_nobody(void)
{
    return setgroups(0, NULL) == 0 && setresgid(65534, 65534, 65534) == 0 &&
           setresuid(65534, 65534, 65534) == 0;
}

/* Pump @p iface until @p pid exits; its exit code, or -1 when killed. */
static int reap_pumping(struct pair *p, pid_t pid)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    int wst;
    pid_t r;
    while ((r = waitpid(pid, &wst, WNOHANG)) == 0) {
        cr_assert(cfx__now_ns() < deadline, "child %d did not finish", (int)pid);
        pump(p);
    }
    cr_assert_eq(r, pid);
    return WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
}

/*
 * A process of another user (nobody) that even knows the token connects to
 * a node's rendezvous socket and writes one byte into a registration whose
 * descriptor it holds.  It is refused (on both ends: neither hands the other
 * a segment or a doorbell), the node counts it, and the byte never lands.
 * Before the fix the connection was accepted and the byte written.
 */
Test(shm, refused_other_uid, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to fork a child as another uid (nobody)");
    struct pair p = { .s = { { .iface = open_iface(1) } } };
    struct region dst;
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    region_reg(p.s[0].iface, &dst, 4096, 0, false, CFX_TP_ACCESS_REMOTE_WRITE, 0);
    cr_assert_eq(ops->iface_addr(p.s[0].iface, addr, &alen), CFX_OK);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* 10: connected and wrote; 11: refused; 1x: could not even try */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!become_nobody())
            _exit(20);
        struct cfx_tp_iface_params prm = iface_params(2, TEST_TOKEN);
        struct cfx_tp_iface *ci;
        struct cfx_tp_ep *ep;
        struct cfx_tp_mr *mr;
        struct cfx_tp_completion comps[16];
        static uint8_t byte = 0xab;
        struct cfx_tp_mem_desc md = { .addr = &byte, .len = 1, .memtype = CFX_MEMTYPE_HOST,
                                      .file_fd = -1 };
        uint64_t end = cfx__deadline_ns(WAIT_MS);
        bool connected = false;
        if (ops->iface_open(&prm, &ci) != CFX_OK ||
            ops->mem_reg(ci, &md, CFX_TP_ACCESS_LOCAL, &mr) != CFX_OK ||
            ops->ep_connect(ci, addr, alen, 1, &ep) != CFX_OK)
            _exit(21);
        while (cfx__now_ns() < end) {
            int n = ops->poll(ci, comps, 16);
            for (int k = 0; k < n; k++) {
                if (comps[k].type == CFX_TP_COMP_EP_ERROR)
                    _exit(connected ? 12 : 11);
                if (comps[k].type == CFX_TP_COMP_CONNECTED) {
                    connected = true;
                    if (ops->ep_write(ep, mr, 0, &dst.rdesc, 0, 1, 7, 7) != CFX_OK)
                        _exit(13);
                }
                if (comps[k].type == CFX_TP_COMP_WRITE && comps[k].status == CFX_OK)
                    _exit(10);
            }
        }
        _exit(14);
    }
    int code = reap_pumping(&p, pid);
    cr_assert_neq(code, 20, "the child could not become nobody");
    cr_assert_eq(code, 11, "nobody's connection was not refused (child exit %d)", code);
    struct cfx__shm_iface *si = cfx__shm_iface_of(p.s[0].iface);
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    while (si->n_refused == 0) { /* the refused connection waits in the backlog */
        cr_assert(cfx__now_ns() < deadline, "the node never refused the connection");
        pump(&p);
    }
    cr_assert_eq(si->n_refused, 1);
    cr_assert_eq(count_ev(&p.s[0], CFX_TP_COMP_ACCEPT), 0, "a stranger was accepted");
    cr_assert_eq(count_ev(&p.s[0], CFX_TP_COMP_WRITE_IMM), 0, "a stranger wrote");
    cr_assert_eq(dst.buf[0], 0, "a stranger's byte landed");
    cr_assert_eq(si->handshaking, 0);
    region_free(&dst);
    pair_close(&p);
}

/* Lines of the file @p path holding @p needle. */
static int lines_with(const char *path, const char *needle)
{
    int n = cfx_test_lines_with(path, needle);
    cr_assert_geq(n, 0, "%s", path);
    return n;
}

/*
 * Another user connecting to a job's abstract socket again and again is
 * refused each time, and counted each time, but its refusals write at most
 * one line a second to the job's log (the first at once, then one with the
 * count).  Before, each refusal wrote a WARN line: another user drove the
 * job's log to grow without bound.
 */
Test(shm, refusals_of_another_user_are_rate_limited, .timeout = 60)
{
    enum { TRIES = 200 };
    if (geteuid() != 0)
        cr_skip_test("needs root to fork a child as another uid (nobody)");
    char path[] = "/tmp/cfx-test-shmref-XXXXXX";
    int logfd;
    int saved = cfx_test_stderr_to(path, &logfd);
    struct pair p = { .s = { { .iface = open_iface(1) } } };
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(ops->iface_addr(p.s[0].iface, addr, &alen), CFX_OK);
    uint64_t t0 = cfx__now_ns();
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* 0: hung up on every time; 10: answered; 2x: could not try */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!become_nobody())
            _exit(20);
        struct sockaddr_un sun = { .sun_family = AF_UNIX };
        size_t nlen = strlen(addr);
        memcpy(sun.sun_path, addr, nlen);
        sun.sun_path[0] = '\0';
        for (int i = 0; i < TRIES; i++) {
            int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
            if (fd < 0 || connect(fd, (struct sockaddr *)&sun,
                                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nlen)))
                _exit(21);
            /* the blocking read ends with the hang-up; the timeout ends a hang */
            struct timeval tv = { .tv_sec = WAIT_MS / 1000 };
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            char b;
            ssize_t r = recv(fd, &b, 1, 0);
            if (r > 0)
                _exit(10);
            if (r < 0 && errno != ECONNRESET)
                _exit(22);
            close(fd);
        }
        _exit(0);
    }
    int code = reap_pumping(&p, pid);
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    struct cfx__shm_iface *si = cfx__shm_iface_of(p.s[0].iface);
    uint64_t refused = si->n_refused;
    pair_close(&p);
    cfx_test_stderr_back(saved);
    close(logfd);
    int lines = lines_with(path, "refused shm peer");
    unlink(path);
    cr_assert_neq(code, 20, "the child could not become nobody");
    cr_assert_eq(code, 0, "another user's connection was not refused (child exit %d)", code);
    cr_assert_eq(refused, TRIES, "refused %llu", (unsigned long long)refused);
    cr_log_info("%d refusals in %.2f s: %d lines", TRIES, secs, lines);
    cr_assert_geq(lines, 1, "refusals not logged");
    cr_assert_leq(lines, (int)secs + 2, "%d lines for %d refusals in %.2f s", lines, TRIES,
                  secs);
}

/*
 * A hand-made connector: connect to the shm socket at @p addr and send a
 * well-formed HELLO (a ring segment and a doorbell) with a fresh nonce in
 * *@p nonce (may be NULL).  0 with the socket in *@p fd; 11 when the node
 * hung up first; 2x when it could not try (exit codes of the forked tests).
 */
static int raw_hello(const char *addr, int *fd_out, uint8_t *nonce)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    size_t nlen = strlen(addr);
    memcpy(sun.sun_path, addr, nlen);
    sun.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sun,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + nlen)) != 0)
        return 21;
    void *seg;
    size_t seg_len;
    int fds[2];
    fds[0] = cfx__shm_seg_create(CFX_SHM_RING_MIN, &seg, &seg_len);
    fds[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0)
        return 22;
    struct cfx__shm_ctl m = { .magic = CFX_SHM_MAGIC, .version = CFX_SHM_VERSION,
                              .type = CFX_SHM_CTL_HELLO, .node_id = 9,
                              .ring_size = CFX_SHM_RING_MIN, .seg_size = seg_len };
    if (nonce) {
        cfx__auth_nonce(m.nonce, sizeof(m.nonce));
        memcpy(nonce, m.nonce, sizeof(m.nonce));
    }
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(fds))];
    } cbuf;
    memset(&cbuf, 0, sizeof(cbuf));
    struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                          .msg_controllen = sizeof(cbuf.buf) };
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    /* the node may have hung up already: EPIPE/ECONNRESET say so too */
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(m))
        return errno == EPIPE || errno == ECONNRESET ? 11 : 23;
    close(fds[0]);
    close(fds[1]);
    *fd_out = fd;
    return 0;
}

/*
 * The acceptor's own check, without the connector's help: nobody sends a
 * well-formed HELLO (segment and doorbell) by hand.  The node hangs up
 * without an answer.  Before the fix it answered with an ACK and its
 * doorbell, and read the stranger's ring.
 */
Test(shm, refused_other_uid_raw_hello, .timeout = 60)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to fork a child as another uid (nobody)");
    struct pair p = { .s = { { .iface = open_iface(1) } } };
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(ops->iface_addr(p.s[0].iface, addr, &alen), CFX_OK);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* 10: got an answer; 11: hung up on; 2x: could not try */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!become_nobody())
            _exit(20);
        int fd = -1;
        int rc = raw_hello(addr, &fd, NULL);
        if (rc)
            _exit(rc);
        /* the blocking read ends with the answer or the hang-up; the
         * timeout only ends a hang */
        struct timeval tv = { .tv_sec = WAIT_MS / 1000 };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        struct cfx__shm_ctl ack;
        ssize_t r = recv(fd, &ack, sizeof(ack), 0);
        if (r > 0)
            _exit(10);
        _exit(r == 0 || errno == ECONNRESET ? 11 : 24);
    }
    int code = reap_pumping(&p, pid);
    cr_assert_neq(code, 20, "the child could not become nobody");
    cr_assert_eq(code, 11, "nobody's HELLO was not refused (child exit %d)", code);
    struct cfx__shm_iface *si = cfx__shm_iface_of(p.s[0].iface);
    cr_assert_eq(si->n_refused, 1);
    cr_assert_eq(count_ev(&p.s[0], CFX_TP_COMP_ACCEPT), 0, "a stranger was accepted");
    cr_assert_eq(si->handshaking, 0);
    pair_close(&p);
}

/*
 * Same user, another job: a peer that cannot prove the cluster token gets
 * no ring read.  The acceptor refuses the connector's proof and hangs up
 * (it never reports the connection); the connector, hung up on after its
 * proof, fails with CFX_ERR_AUTH.  Before the fix the two connected.
 */
Test(shm, refused_wrong_token, .timeout = 60)
{
    struct pair p;
    char addr[CFX_TP_ADDR_MAX];
    size_t len = sizeof(addr);
    memset(&p, 0, sizeof(p));
    p.s[0].iface = open_iface_token(1, "another-jobs-token-0123456789abcd");
    p.s[1].iface = open_iface(2);
    cr_assert_eq(ops->iface_addr(p.s[1].iface, addr, &len), CFX_OK);
    cr_assert_eq(ops->ep_connect(p.s[0].iface, addr, len, 2, &p.ab), CFX_OK);
    struct ev *e = wait_ev(&p, 0, CFX_TP_COMP_EP_ERROR, p.ab, WAIT_MS);
    cr_assert_eq(e->c.status, CFX_ERR_AUTH, "status %s", cfx_errname(e->c.status));
    cr_assert_eq(cfx__shm_iface_of(p.s[0].iface)->n_refused, 1);
    struct cfx__shm_iface *b = cfx__shm_iface_of(p.s[1].iface);
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    while (b->handshaking) { /* the acceptor drops it when the connector hangs up */
        cr_assert(cfx__now_ns() < deadline, "the acceptor kept the connection");
        pump(&p);
    }
    cr_assert_eq(count_ev(&p.s[0], CFX_TP_COMP_CONNECTED), 0);
    cr_assert_eq(count_ev(&p.s[1], CFX_TP_COMP_ACCEPT), 0, "accepted without the token");
    cr_assert_eq(b->n_refused, 1, "the acceptor did not refuse the proof");
    pair_close(&p);
}

/* The next control message on @p fd, pumping @p p meanwhile: 1 with one in
 * *@p m, 0 when the node hung up. */
static int raw_recv_pumping(struct pair *p, int fd, struct cfx__shm_ctl *m)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    for (;;) {
        ssize_t r = recv(fd, m, sizeof(*m), MSG_DONTWAIT);
        if (r == (ssize_t)sizeof(*m))
            return 1;
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 0;
        cr_assert(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "recv: %zd", r);
        cr_assert(cfx__now_ns() < deadline, "the node neither answered nor hung up");
        pump(p);
    }
}

/*
 * The acceptor proves nothing before the connector has: its answer to a
 * HELLO is its nonce with no MAC; a wrong proof gets the hang-up and no MAC
 * either; the right proof is answered with the acceptor's.  (Before, the ACK
 * carried the acceptor's MAC.)
 */
Test(shm, acceptor_proves_nothing_first, .timeout = 60)
{
    static const uint8_t zero[CFX_SHM_MAC_LEN];
    struct pair p = { .s = { { .iface = open_iface(1) } } };
    struct cfx__shm_iface *si = cfx__shm_iface_of(p.s[0].iface);
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    uint8_t nc[CFX_SHM_NONCE_LEN];
    struct cfx__shm_ctl ack, m;
    cr_assert_eq(ops->iface_addr(p.s[0].iface, addr, &alen), CFX_OK);

    for (int right = 0; right < 2; right++) {
        int fd = -1;
        cr_assert_eq(raw_hello(addr, &fd, nc), 0);
        cr_assert_eq(raw_recv_pumping(&p, fd, &ack), 1, "no answer to HELLO");
        cr_assert_eq(ack.type, CFX_SHM_CTL_ACK);
        cr_assert(!memcmp(ack.mac, zero, sizeof(zero)), "the challenge carries a MAC");
        struct cfx__shm_ctl a = { .magic = CFX_SHM_MAGIC, .version = CFX_SHM_VERSION,
                                  .type = CFX_SHM_CTL_AUTH, .node_id = 9 };
        if (right)
            cr_assert_eq(cfx__auth_mac(TEST_TOKEN, CFX_AUTH_SHM_CONNECT, ack.nonce, nc, a.mac),
                         CFX_OK);
        else
            cfx__auth_nonce(a.mac, sizeof(a.mac)); /* a guess */
        cr_assert_eq(send(fd, &a, sizeof(a), MSG_NOSIGNAL), (ssize_t)sizeof(a));
        int got = raw_recv_pumping(&p, fd, &m);
        if (!right) {
            cr_assert_eq(got, 0, "a wrong proof was answered (type %u)", m.type);
            cr_assert_eq(si->n_refused, 1);
            cr_assert_eq(count_ev(&p.s[0], CFX_TP_COMP_ACCEPT), 0);
        } else {
            cr_assert_eq(got, 1, "the right proof was not answered");
            cr_assert_eq(m.type, CFX_SHM_CTL_PROOF);
            cr_assert_eq(cfx__auth_verify(TEST_TOKEN, CFX_AUTH_SHM_ACCEPT, ack.nonce, nc, m.mac),
                         CFX_OK, "the acceptor's proof does not verify");
            wait_ev(&p, 0, CFX_TP_COMP_ACCEPT, NULL, WAIT_MS);
        }
        close(fd);
    }
    pair_close(&p);
}

/* ---- ring positions written by the peer ----------------------------------------------------- */

/* Fill a's outbound ring without letting b read, then queue @p queued more
 * sends behind it. */
static void fill_ring(struct pair *p, uint32_t queued)
{
    static const uint8_t msg[CFX_TP_SEND_MAX];
    struct cfx__shm_ep *a = cfx__shm_ep_of(p->ab);
    uint64_t i = 0;
    while (a->txq_count < queued) {
        cr_assert_eq(ops->ep_send(p->ab, msg, sizeof(msg), i), CFX_OK);
        cr_assert_lt(++i, 1u << 20, "the ring never filled");
    }
}

/* Poll side @p side alone (the other must not publish positions) until an
 * EP_ERROR for @p ep; returns its status. */
static int wait_ep_error_alone(struct pair *p, int side, struct cfx_tp_ep *ep)
{
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    struct ev *e;
    while (!(e = find_ev(&p->s[side], CFX_TP_COMP_EP_ERROR, ep))) {
        cr_assert(cfx__now_ns() < deadline, "no EP_ERROR on %c", side ? 'b' : 'a');
        if (!poll_side(&p->s[side]))
            sched_yield();
    }
    e->used = true;
    return e->c.status;
}

/*
 * The consumer publishes a tail past everything we published (as a buggy or
 * hostile peer could: it maps the ring read-write) while our ring is full.
 * The producer fails the endpoint with CFX_ERR_PROTO and counts it; nothing
 * is copied out of bounds (the build-asan tree runs this under ASan).
 * Before the fix the producer trusted the tail and wrote over messages the
 * consumer had not read: the queued sends completed with CFX_OK and no
 * EP_ERROR came.
 */
Test(shm, corrupt_tail_fails_producer, .timeout = 60)
{
    struct pair p;
    pair_open(&p);
    struct cfx__shm_ep *a = cfx__shm_ep_of(p.ab);
    fill_ring(&p, 1);
    atomic_store(&a->tx.ctl->tail, a->tx.published + 3 * a->tx.size);
    int st = wait_ep_error_alone(&p, 0, p.ab);
    cr_assert_eq(st, CFX_ERR_PROTO, "status %s", cfx_errname(st));
    cr_assert_eq(cfx__shm_iface_of(p.s[0].iface)->n_ring_errors, 1);
    cr_assert_eq(ops->ep_send(p.ab, "x", 1, 1), CFX_ERR_PROTO, "the failure is sticky");
    /* the peer hears of it */
    wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    pair_close(&p);
}

/* A tail that goes backwards (below one the producer already saw). */
Test(shm, backward_tail_fails_producer, .timeout = 60)
{
    struct pair p;
    pair_open(&p);
    struct cfx__shm_ep *a = cfx__shm_ep_of(p.ab);
    fill_ring(&p, CFX_SHM_SEND_SLOTS - 2); /* more than b reads in one poll */
    poll_side(&p.s[1]); /* b reads some: the tail moves on */
    poll_side(&p.s[0]); /* a sees it and fills the ring again from its queue */
    cr_assert_gt(a->tx.cached, 0);
    cr_assert_gt(a->txq_count, 0, "the ring is no longer full");
    atomic_store(&a->tx.ctl->tail, 0);
    int st = wait_ep_error_alone(&p, 0, p.ab);
    cr_assert_eq(st, CFX_ERR_PROTO, "status %s", cfx_errname(st));
    cr_assert_eq(cfx__shm_iface_of(p.s[0].iface)->n_ring_errors, 1);
    pair_close(&p);
}

/*
 * The producer publishes an impossible head (unaligned, more than a ring
 * ahead): the consumer fails the endpoint with CFX_ERR_PROTO and counts it
 * without reading a byte past the ring.
 */
Test(shm, corrupt_head_fails_consumer, .timeout = 60)
{
    struct pair p;
    pair_open(&p);
    struct cfx__shm_ep *a = cfx__shm_ep_of(p.ab);
    atomic_store(&a->tx.ctl->head, a->tx.published + 5 * a->tx.size + 8);
    struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    cr_assert_eq(e->c.status, CFX_ERR_PROTO, "status %s", cfx_errname(e->c.status));
    cr_assert_eq(cfx__shm_iface_of(p.s[1].iface)->n_ring_errors, 1);
    cr_assert_eq(count_ev(&p.s[1], CFX_TP_COMP_RECV), 0);
    pair_close(&p);
}

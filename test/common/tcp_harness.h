/*
 * A small harness for tcp transport tests (test_tcp.c, test_tcp_seal.c):
 * two ifaces A and B with a completion log each, registered regions, and a
 * raw blocking client that speaks the wire format by hand.
 */
#ifndef CFX_TEST_TCP_HARNESS_H
#define CFX_TEST_TCP_HARNESS_H

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "dataplane/common/util.h"
#include "dataplane/tcp/tcp.h"
#include "dataplane/transport.h"
#include "testutil.h"

#define WAIT_MS 20000 /* a limit against hangs only: a loaded machine may be slow */

static const struct cfx_transport_ops *const ops = &cfx__tcp_ops;

/* --- a small harness: two ifaces, a completion log each ------------------- */

struct ev {
    struct cfx_tp_completion c;
    uint8_t data[CFX_TP_SEND_MAX]; /* RECV copy */
    bool used;
};

struct side {
    struct cfx_tp_iface *iface;
    struct ev *evs;
    size_t n, cap;
};

static struct side A, B;

static inline int poll_side(struct side *s, int max)
{
    struct cfx_tp_completion comps[64];
    int n = ops->poll(s->iface, comps, CFX_MIN(max, 64));
    cr_assert_geq(n, 0);
    for (int i = 0; i < n; i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 128;
            s->evs = realloc(s->evs, s->cap * sizeof(*s->evs));
        }
        struct ev *e = &s->evs[s->n++];
        e->c = comps[i];
        e->used = false;
        if (comps[i].type == CFX_TP_COMP_RECV && comps[i].len)
            memcpy(e->data, comps[i].data, comps[i].len);
    }
    return n;
}

static inline struct ev *find_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    for (size_t i = 0; i < s->n; i++)
        if (!s->evs[i].used && s->evs[i].c.type == type && (!ep || s->evs[i].c.ep == ep))
            return &s->evs[i];
    return NULL;
}

static inline size_t count_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->evs[i].c.type == type && (!ep || s->evs[i].c.ep == ep);
    return n;
}

static inline void pump(int ms)
{
    uint64_t end = cfx__deadline_ns(ms);
    while (cfx__now_ns() < end) {
        int n = 0;
        if (A.iface)
            n += poll_side(&A, 64);
        if (B.iface)
            n += poll_side(&B, 64);
        if (!n)
            sched_yield();
    }
}

static inline struct ev *wait_ev(struct side *s, int type, struct cfx_tp_ep *ep)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    struct ev *e;
    while (!(e = find_ev(s, type, ep))) {
        cr_assert(cfx__now_ns() < end, "timed out waiting for completion type %d", type);
        if (A.iface)
            poll_side(&A, 64);
        if (B.iface)
            poll_side(&B, 64);
    }
    e->used = true;
    return e;
}

static inline struct cfx_tp_iface *open_node(uint32_t node)
{
    struct cfx_tp_iface_params p = { .field_mask = CFX_TP_IFACE_PARAM_NODE_ID, .node_id = node };
    struct cfx_tp_iface *i;
    cr_assert_eq(ops->iface_open(&p, &i), CFX_OK, "%s", cfx_last_error());
    return i;
}

static inline void addr_of(struct cfx_tp_iface *i, char *buf, size_t *len)
{
    *len = CFX_TP_ADDR_MAX;
    cr_assert_eq(ops->iface_addr(i, buf, len), CFX_OK);
}

static inline void setup(void)
{
    memset(&A, 0, sizeof(A));
    memset(&B, 0, sizeof(B));
    A.iface = open_node(1);
    B.iface = open_node(2);
}

static inline void teardown(void)
{
    if (A.iface)
        ops->iface_close(A.iface);
    if (B.iface)
        ops->iface_close(B.iface);
    free(A.evs);
    free(B.evs);
}

/* a connects to b: returns a's ep, *accepted = b's. */
static inline struct cfx_tp_ep *connect_ab(struct cfx_tp_ep **accepted)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t len;
    struct cfx_tp_ep *ep;

    addr_of(B.iface, addr, &len);
    cr_assert_eq(ops->ep_connect(A.iface, addr, len, 2, &ep), CFX_OK);
    cr_assert_eq(wait_ev(&A, CFX_TP_COMP_CONNECTED, ep)->c.status, CFX_OK);
    *accepted = wait_ev(&B, CFX_TP_COMP_ACCEPT, NULL)->c.ep;
    return ep;
}

struct region {
    uint8_t *buf;
    struct cfx_tp_mr *mr;
    struct cfx_tp_rdesc rd;
};

static inline void reg(struct cfx_tp_iface *i, struct region *r, size_t len, unsigned access,
                       int fill)
{
    r->buf = malloc(len);
    memset(r->buf, fill, len);
    struct cfx_tp_mem_desc md = {
        .addr = r->buf, .len = len, .memtype = CFX_MEMTYPE_HOST, .file_fd = -1
    };
    cr_assert_eq(ops->mem_reg(i, &md, access, &r->mr), CFX_OK);
    cr_assert_eq(ops->mr_pack(r->mr, &r->rd), CFX_OK);
}

static inline void unreg(struct region *r)
{
    if (r->mr)
        ops->mem_dereg(r->mr);
    free(r->buf);
}

/* A raw, blocking TCP client that speaks the wire format by hand. */
static inline int raw_connect(struct cfx_tp_iface *to)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t len;
    struct sockaddr_in sa;

    addr_of(to, addr, &len);
    cr_assert_eq(cfx__parse_hostport(addr, &sa), CFX_OK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    return fd;
}

static inline void raw_send(int fd, const void *buf, size_t len)
{
    cr_assert_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
}

static inline void raw_hello(int fd, uint32_t node, uint32_t version)
{
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_HELLO,
                              .len = htole32(sizeof(struct cfx__tcp_hello)) };
    struct cfx__tcp_hello hl = { .magic = htole32(CFX_TCP_MAGIC),
                                 .version = htole32(version),
                                 .node_id = htole32(node) };
    snprintf(hl.addr, sizeof(hl.addr), "10.0.0.%u:1234", node);
    raw_send(fd, &h, sizeof(h));
    raw_send(fd, &hl, sizeof(hl));
}

static inline void raw_write_hdr(int fd, const struct cfx_tp_rdesc *rd, uint64_t off,
                                 uint32_t len, uint32_t imm)
{
    struct cfx__tcp_rkey k;
    memcpy(&k, rd->data, sizeof(k));
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_WRITE,
                              .len = htole32(len),
                              .imm = htole32(imm),
                              .key_lo = k.key_lo,
                              .key_idx = k.idx,
                              .key_hi = k.key_hi,
                              .off = htole64(off) };
    raw_send(fd, &h, sizeof(h));
}

static inline void raw_send_msg(int fd, const char *msg)
{
    struct cfx__tcp_hdr h = { .type = CFX_TCP_FRAME_SEND, .len = htole32((uint32_t)strlen(msg)) };
    raw_send(fd, &h, sizeof(h));
    raw_send(fd, msg, strlen(msg));
}

#endif

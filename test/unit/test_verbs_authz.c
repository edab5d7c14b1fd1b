/*
 * verbs: a peer writes nothing here until the engine authenticated it.
 *
 * A QP comes up with no remote access; ep_authorize (called by the engine's
 * token handshake) grants remote write on it (docs/SECURITY.md).  Checked:
 * a peer that was not authorized is refused when it RDMA-writes the one
 * thing whose rkey it holds from the connection hello, the iface's no-op
 * page, and its connection fails on both sides with no byte changed; sends
 * in bursts longer than the signaling interval all complete while either
 * side is unauthorized (no no-op write is posted to a QP that would refuse
 * it); once authorized, granted writes land byte for byte.
 *
 * A peer refused while connecting over rdma_cm learns why: the acceptor's
 * reject carries a reason (another version, a hello not understood), which
 * the connector reports as that status, not as CFX_ERR_CONNECT; the reject
 * decoder trusts no byte of a reject it does not recognise.  Out of band
 * the acceptor answers a refused hello with a refusal record before it
 * closes, and the connector fails with its reason, not a hang-up's.
 *
 * A token holder's connection that the acceptor closes at its cap on
 * connections not yet authenticated before the engine's handshake ended
 * (tpbase/tp_strangers.h) fails with CFX_ERR_PEER_FAILED, as on tcp, and the
 * engine dials it again: over rdma_cm and over the out-of-band exchange,
 * the get completes byte for byte.
 *
 * The out-of-band port out of descriptors (EMFILE) closes the oldest
 * strangers, then sheds newcomers, without a line per accept, and accepts
 * again once descriptors are free.
 *
 * On a host without RDMA every test skips (no device); the Soft-RoCE guest
 * runs them for real (test/vm/run.sh).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/common/util.h"
#include "dataplane/engine/engine.h"
#include "dataplane/transport.h"
#ifdef CFX_HAVE_VERBS
#include "dataplane/verbs/verbs.h"
#endif
#include "testutil.h"

TestSuite(verbs_authz);

#ifndef CFX_HAVE_VERBS
Test(verbs_authz, built_without_verbs)
{
    cr_skip_test("built without the verbs transport");
}
#else

#define WAIT_MS 60000 /* against hangs only: TCG guests are slow */
#define BURST   200   /* messages per direction: many signaling intervals */
#define MSG_LEN 100

struct side {
    struct cfx_tp_iface *iface;
    struct cfx_tp_ep *ep;
    uint8_t (*msg)[MSG_LEN]; /* RECV copies, in arrival order */
    uint32_t *len;
    size_t nrecv, nsend, nwrite, nimm;
    uint32_t imm[64];
    int32_t bad_status;      /* first non-OK WRITE/SEND status */
    int32_t ep_error;        /* status of EP_ERROR, 0 until one came */
    size_t n_ep_error;
};

struct pair {
    const struct cfx_transport_ops *ops;
    struct side a, b; /* a connects, b accepts */
};

static void side_poll(const struct cfx_transport_ops *ops, struct side *s)
{
    struct cfx_tp_completion c[32];
    int n = ops->poll(s->iface, c, 32);
    cr_assert_geq(n, 0, "poll: %s", cfx_errname(n));
    for (int i = 0; i < n; i++) {
        switch (c[i].type) {
        case CFX_TP_COMP_ACCEPT: s->ep = c[i].ep; break;
        case CFX_TP_COMP_RECV:
            cr_assert_lt(s->nrecv, (size_t)BURST);
            cr_assert_leq(c[i].len, MSG_LEN);
            s->len[s->nrecv] = c[i].len;
            memcpy(s->msg[s->nrecv++], c[i].data, c[i].len);
            break;
        case CFX_TP_COMP_SEND: s->nsend++; break;
        case CFX_TP_COMP_WRITE: s->nwrite++; break;
        case CFX_TP_COMP_WRITE_IMM:
            cr_assert_lt(s->nimm, CFX_ARRAY_SIZE(s->imm));
            s->imm[s->nimm++] = c[i].imm;
            break;
        case CFX_TP_COMP_EP_ERROR:
            s->n_ep_error++;
            s->ep_error = c[i].status;
            break;
        default: break;
        }
        if (c[i].type != CFX_TP_COMP_EP_ERROR && c[i].status != CFX_OK && !s->bad_status)
            s->bad_status = c[i].status;
    }
}

static void poll_both(struct pair *p)
{
    side_poll(p->ops, &p->a);
    side_poll(p->ops, &p->b);
}

static struct cfx_tp_iface *open_or_skip(const struct cfx_transport_ops *ops, uint32_t node)
{
    struct cfx_tp_iface_params prm = { .field_mask = CFX_TP_IFACE_PARAM_NODE_ID,
                                       .node_id = node };
    struct cfx_tp_iface *iface = NULL;
    int rc = ops->iface_open(&prm, &iface);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_skip_test("no RDMA device: %s", cfx_last_error());
    cr_assert_eq(rc, CFX_OK, "iface_open: %s %s", cfx_errname(rc), cfx_last_error());
    return iface;
}

/* Connected both ways; neither side authorized. */
static void pair_open(struct pair *p)
{
    memset(p, 0, sizeof(*p));
    p->ops = cfx__transport_find("verbs");
    cr_assert_not_null(p->ops);
    p->a.iface = open_or_skip(p->ops, 1);
    p->b.iface = open_or_skip(p->ops, 2);
    for (struct side *s = &p->a; s <= &p->b; s++) {
        s->msg = calloc(BURST, MSG_LEN);
        s->len = calloc(BURST, sizeof(uint32_t));
        cr_assert(s->msg && s->len);
    }
}

/* a connects to b: both ends open, neither authorized. */
static void pair_join(struct pair *p)
{
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(p->ops->iface_addr(p->b.iface, addr, &alen), CFX_OK);
    cr_assert_eq(p->ops->ep_connect(p->a.iface, addr, alen, 2, &p->a.ep), CFX_OK, "%s",
                 cfx_last_error());
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (!p->b.ep || cfx__verbs_ep_of(p->a.ep)->state != CFX_VERBS_EP_OPEN) {
        cr_assert(cfx__now_ns() < end, "no connection");
        poll_both(p);
    }
}

static void pair_connect(struct pair *p)
{
    pair_open(p);
    pair_join(p);
}

static void pair_close(struct pair *p)
{
    for (struct side *s = &p->a; s <= &p->b; s++) {
        if (s->ep)
            p->ops->ep_close(s->ep);
        p->ops->iface_close(s->iface);
        free(s->msg);
        free(s->len);
    }
}

/* BURST sends from @p from to @p to without waiting between them: every
 * one completes, and arrives byte for byte and in order. */
static void send_burst(struct pair *p, struct side *from, struct side *to, uint64_t seed)
{
    uint8_t buf[MSG_LEN];
    size_t s0 = from->nsend, r0 = to->nrecv;
    uint64_t end = cfx__deadline_ns(WAIT_MS);

    for (int i = 0; i < BURST; i++) {
        uint32_t len = 1 + (uint32_t)i % MSG_LEN;
        cfx_test_fill(buf, len, seed + (uint64_t)i);
        int rc;
        while ((rc = p->ops->ep_send(from->ep, buf, len, (uint64_t)i)) == CFX_ERR_AGAIN) {
            cr_assert(cfx__now_ns() < end, "send queue stayed full");
            poll_both(p);
        }
        cr_assert_eq(rc, CFX_OK, "ep_send: %s %s", cfx_errname(rc), cfx_last_error());
    }
    while (from->nsend - s0 < BURST || to->nrecv - r0 < BURST) {
        cr_assert(cfx__now_ns() < end, "%zu of %d sends completed, %zu received",
                  from->nsend - s0, BURST, to->nrecv - r0);
        poll_both(p);
    }
    cr_assert_eq(from->bad_status, CFX_OK, "%s", cfx_errname(from->bad_status));
    cr_assert_eq(from->n_ep_error + to->n_ep_error, 0);
    for (int i = 0; i < BURST; i++) {
        uint32_t len = 1 + (uint32_t)i % MSG_LEN;
        cr_assert_eq(to->len[r0 + (size_t)i], len, "message %d: %u bytes", i,
                     to->len[r0 + (size_t)i]);
        cr_assert_eq(cfx_test_check(to->msg[r0 + (size_t)i], len, seed + (uint64_t)i),
                     (size_t)-1, "message %d differs", i);
    }
}

/* The peer's no-op page as @p ep knows it from the hello. */
static struct cfx_tp_rdesc nop_rdesc(struct cfx_tp_ep *ep)
{
    struct cfx__verbs_ep *v = cfx__verbs_ep_of(ep);
    struct cfx__verbs_rkey k = {
        .tag = CFX_VERBS_RDESC_TAG,
        .rkey = htole32(v->peer_nop_rkey),
        .addr = htole64(v->peer_nop_addr),
        .len = htole64(64),
    };
    struct cfx_tp_rdesc rd = { .len = sizeof(k) };
    memcpy(rd.data, &k, sizeof(k));
    return rd;
}

/* @p w RDMA-writes 64 bytes into the no-op page of @p r, which did not
 * authorize it: refused, both ends fail, not a byte of the page changes. */
static void check_nop_write_refused(struct pair *p, struct side *w, struct side *r)
{
    uint8_t src[64];
    memset(src, 0x11, sizeof(src));
    struct cfx_tp_mem_desc md = {
        .addr = src, .len = sizeof(src), .memtype = CFX_MEMTYPE_HOST, .file_fd = -1
    };
    struct cfx_tp_mr *mr;
    cr_assert_eq(p->ops->mem_reg(w->iface, &md, CFX_TP_ACCESS_LOCAL, &mr), CFX_OK);
    const uint8_t *page = cfx__verbs_iface_of(r->iface)->nop_buf;
    struct cfx_tp_rdesc rd = nop_rdesc(w->ep);
    size_t imm0 = r->nimm;

    cr_assert_eq(p->ops->ep_write(w->ep, mr, 0, &rd, 0, sizeof(src), 0xBAD, 7), CFX_OK,
                 "the writer cannot know it is refused: %s", cfx_last_error());
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (!w->n_ep_error || !r->n_ep_error) {
        cr_assert(cfx__now_ns() < end, "the write was not refused (writer failed: %zu, "
                  "target failed: %zu)", w->n_ep_error, r->n_ep_error);
        poll_both(p);
    }
    cr_log_info("writer: %s, target: %s, target's refused writes: %llu",
                cfx_errname(w->ep_error), cfx_errname(r->ep_error),
                (unsigned long long)p->ops->iface_grant_refused(r->iface));
    /* the writer's QP fails on the refusal (CFX_ERR_PROTO), unless the
     * flush of its posted receives, which that failure causes, is polled
     * before the write's own error: then as a peer's failure (seen once
     * under rxe in the guest) */
    const int wrc = w->ep_error;
    cr_assert(wrc == CFX_ERR_PROTO || wrc == CFX_ERR_PEER_FAILED,
              "writer's endpoint failed with %s", cfx_errname(wrc));
    cr_assert_eq(w->ep->status, wrc);
    /* the target sees its QP flushed (rxe: the writer's QP failed; a
     * device that reports the refusal on the target's receive: counted) */
    cr_assert(r->ep_error == CFX_ERR_PEER_FAILED || r->ep_error == CFX_ERR_PROTO,
              "target's endpoint failed with %s", cfx_errname(r->ep_error));
    cr_assert_eq(r->ep->status, r->ep_error);
    cr_assert_eq(w->n_ep_error, 1);
    cr_assert_eq(r->n_ep_error, 1);
    cr_assert_eq(r->nimm, imm0, "the refused write was reported at the target");
    for (size_t i = 0; i < 4096; i++)
        cr_assert_eq(page[i], 0, "the refused write changed byte %zu of the no-op page", i);
    /* sticky on the writer */
    cr_assert_eq(p->ops->ep_send(w->ep, "x", 1, 1), wrc);
    p->ops->mem_dereg(mr);
}

/* Neither side authorized (a peer that has not proved the token yet):
 * sends flow, RDMA writes into the no-op page are refused.  Before QPs came
 * up without remote access, the write landed and both ends stayed up. */
Test(verbs_authz, unauthorized_peer_cannot_write, .timeout = 240)
{
    struct pair p;
    pair_connect(&p);
    cr_assert_not(cfx__verbs_ep_of(p.a.ep)->authorized);

    /* the handshake's messages: bursts both ways, every one completes */
    send_burst(&p, &p.a, &p.b, 100);
    send_burst(&p, &p.b, &p.a, 200);
    check_nop_write_refused(&p, &p.a, &p.b);
    pair_close(&p);
}

/* b authorized a (b's QP takes a's writes); a did not authorize b.  b's
 * sends still all complete (it signals every one, for a's QP would refuse
 * its no-op write); a's granted writes land byte for byte; b's write into
 * a's no-op page is refused. */
Test(verbs_authz, authorized_one_way, .timeout = 240)
{
    enum { LEN = 64 * 1024, N = 16 };
    struct pair p;
    pair_connect(&p);

    cr_assert_eq(p.ops->ep_authorize(p.b.ep), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(p.ops->ep_authorize(p.b.ep), CFX_OK, "twice: %s", cfx_last_error());
    cr_assert(cfx__verbs_ep_of(p.b.ep)->authorized);
    send_burst(&p, &p.b, &p.a, 300);
    send_burst(&p, &p.a, &p.b, 400);
    /* a heard of b's authorization (MSG_AUTHZ, ahead of b's sends) */
    cr_assert(cfx__verbs_ep_of(p.a.ep)->peer_authorized);
    cr_assert_not(cfx__verbs_ep_of(p.b.ep)->peer_authorized);

    uint8_t *src = aligned_alloc(4096, LEN), *dst = aligned_alloc(4096, LEN);
    cr_assert(src && dst);
    cfx_test_fill(src, LEN, 77);
    memset(dst, 0xAA, LEN);
    struct cfx_tp_mem_desc ms = { .addr = src, .len = LEN, .memtype = CFX_MEMTYPE_HOST,
                                  .file_fd = -1 };
    struct cfx_tp_mem_desc md = ms;
    md.addr = dst;
    struct cfx_tp_mr *smr, *dmr;
    struct cfx_tp_rdesc grant;
    cr_assert_eq(p.ops->mem_reg(p.a.iface, &ms, CFX_TP_ACCESS_LOCAL, &smr), CFX_OK);
    cr_assert_eq(p.ops->mem_reg(p.b.iface, &md, CFX_TP_ACCESS_REMOTE_WRITE, &dmr), CFX_OK);
    cr_assert_eq(p.ops->mr_grant(dmr, p.b.ep, &grant), CFX_OK, "%s", cfx_last_error());

    /* N writes posted back to back: more than a signaling interval, so the
     * no-op (an RDMA write into b's page, which b's QP now takes) retires
     * them */
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    for (int i = 0; i < N; i++) {
        int rc;
        while ((rc = p.ops->ep_write(p.a.ep, smr, (uint64_t)i * (LEN / N), &grant,
                                     (uint64_t)i * (LEN / N), LEN / N, 1000 + (uint32_t)i,
                                     (uint64_t)i)) == CFX_ERR_AGAIN) {
            cr_assert(cfx__now_ns() < end, "send queue stayed full");
            poll_both(&p);
        }
        cr_assert_eq(rc, CFX_OK, "ep_write: %s %s", cfx_errname(rc), cfx_last_error());
    }
    while (p.a.nwrite < N || p.b.nimm < N) {
        cr_assert(cfx__now_ns() < end, "%zu writes completed, %zu landed", p.a.nwrite, p.b.nimm);
        poll_both(&p);
    }
    cr_assert_eq(p.a.bad_status, CFX_OK, "%s", cfx_errname(p.a.bad_status));
    for (int i = 0; i < N; i++)
        cr_assert_eq(p.b.imm[i], 1000 + (uint32_t)i);
    cr_assert_eq(cfx_test_check(dst, LEN, 77), (size_t)-1, "granted write differs at byte %zu",
                 cfx_test_check(dst, LEN, 77));
    cr_assert_eq(p.ops->iface_grant_refused(p.b.iface), 0);

    /* the other way round, a never authorized b */
    check_nop_write_refused(&p, &p.b, &p.a);
    p.ops->mr_revoke(dmr);
    p.ops->mem_dereg(smr);
    p.ops->mem_dereg(dmr);
    pair_close(&p);
    free(src);
    free(dst);
}

/* --- why a connection was rejected (rdma_cm) --------------------------------------------- */

/* The reject private data a conflux acceptor sends (verbs.h, struct
 * cfx__verbs_rej), written out byte by byte: the wire format is pinned. */
static void rej_bytes(uint8_t out[8], uint32_t magic, uint16_t version, uint16_t reason)
{
    out[0] = (uint8_t)magic, out[1] = (uint8_t)(magic >> 8);
    out[2] = (uint8_t)(magic >> 16), out[3] = (uint8_t)(magic >> 24);
    out[4] = (uint8_t)version, out[5] = (uint8_t)(version >> 8);
    out[6] = (uint8_t)reason, out[7] = (uint8_t)(reason >> 8);
}

struct raw_ev {
    enum rdma_cm_event_type type;
    int status;
    struct rdma_cm_id *id;
    uint8_t priv[64];
    size_t priv_len;
};

static struct rdma_event_channel *raw_channel(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    cr_assert_not_null(ch, "rdma_create_event_channel: %s", strerror(errno));
    int fl = fcntl(ch->fd, F_GETFL);
    cr_assert(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0);
    return ch;
}

/* The next event on @p ch, which must be @p want; @p s's iface is polled
 * meanwhile (the conflux side of the exchange progresses there). */
static void raw_wait(const struct cfx_transport_ops *ops, struct side *s,
                     struct rdma_event_channel *ch, enum rdma_cm_event_type want,
                     struct raw_ev *ev)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    struct rdma_cm_event *e;

    while (rdma_get_cm_event(ch, &e)) {
        cr_assert(errno == EAGAIN || errno == EINTR, "rdma_get_cm_event: %s", strerror(errno));
        cr_assert(cfx__now_ns() < end, "no rdma_cm %s", rdma_event_str(want));
        side_poll(ops, s);
    }
    memset(ev, 0, sizeof(*ev));
    ev->type = e->event;
    ev->status = e->status;
    ev->id = e->id;
    if (e->param.conn.private_data) {
        ev->priv_len = CFX_MIN((size_t)e->param.conn.private_data_len, sizeof(ev->priv));
        memcpy(ev->priv, e->param.conn.private_data, ev->priv_len);
    }
    rdma_ack_cm_event(e);
    cr_assert_eq(ev->type, want, "rdma_cm %s (status %d), %s expected",
                 rdma_event_str(ev->type), ev->status, rdma_event_str(want));
}

static struct sockaddr_in iface_sockaddr(const struct cfx_transport_ops *ops,
                                         struct cfx_tp_iface *iface)
{
    char addr[CFX_TP_ADDR_MAX], ip[INET_ADDRSTRLEN];
    size_t len = sizeof(addr);
    unsigned port;
    struct sockaddr_in sa = { .sin_family = AF_INET };
    cr_assert_eq(ops->iface_addr(iface, addr, &len), CFX_OK);
    if (strncmp(addr, "oob:", 4) == 0)
        cr_skip_test("CFX_IB_CONNECT=oob: no rdma_cm");
    cr_assert_eq(sscanf(addr, "%15[0-9.]:%u", ip, &port), 2, "address %s", addr);
    cr_assert_eq(inet_pton(AF_INET, ip, &sa.sin_addr), 1);
    sa.sin_port = htons((uint16_t)port);
    return sa;
}

/* A hello the acceptor refuses gets a reject that says why: another
 * protocol version, or a hello it does not understand (too short). */
Test(verbs_authz, refused_hello_rejected_with_reason, .timeout = 240)
{
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    cr_assert_not_null(ops);
    struct side b = { .iface = open_or_skip(ops, 2) };
    struct sockaddr_in dst = iface_sockaddr(ops, b.iface), src = dst;
    src.sin_port = 0;
    struct rdma_event_channel *ch = raw_channel();

    for (int round = 0; round < 2; round++) {
        struct cfx__verbs_hello h = {
            .magic = htole32(CFX_VERBS_MAGIC),
            .version = htole16(round == 0 ? CFX_VERBS_VERSION + 1 : CFX_VERBS_VERSION),
            .rq_depth = htole32(CFX_VERBS_RQ_DEPTH),
        };
        struct rdma_conn_param cp = {
            .private_data = &h,
            .private_data_len = round == 0 ? (uint8_t)sizeof(h) : 8,
            .responder_resources = 1,
            .initiator_depth = 1,
            .retry_count = 7,
            .qp_num = 0x123, /* no QP: the acceptor refuses before it makes its own */
        };
        struct rdma_cm_id *id;
        struct raw_ev ev;
        uint8_t want[8];

        cr_assert_eq(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), 0, "%s", strerror(errno));
        cr_assert_eq(rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst,
                                       CFX_VERBS_RESOLVE_MS), 0, "%s", strerror(errno));
        raw_wait(ops, &b, ch, RDMA_CM_EVENT_ADDR_RESOLVED, &ev);
        cr_assert_eq(rdma_resolve_route(id, CFX_VERBS_RESOLVE_MS), 0, "%s", strerror(errno));
        raw_wait(ops, &b, ch, RDMA_CM_EVENT_ROUTE_RESOLVED, &ev);
        cr_assert_eq(rdma_connect(id, &cp), 0, "rdma_connect: %s", strerror(errno));
        raw_wait(ops, &b, ch, RDMA_CM_EVENT_REJECTED, &ev);
        cr_assert_eq(ev.status, 28, "REJECTED status %d (IB_CM_REJ_CONSUMER_DEFINED expected)",
                     ev.status);
        cr_assert_geq(ev.priv_len, sizeof(want), "%zu bytes of private data", ev.priv_len);
        rej_bytes(want, 0x43465852u, 1, round == 0 ? 1 : 3); /* version; hello */
        cr_assert_arr_eq(ev.priv, want, sizeof(want), "round %d: reject reason differs", round);
        rdma_destroy_id(id);
    }
    cr_assert_null(b.ep, "a refused peer was accepted");
    rdma_destroy_event_channel(ch);
    ops->iface_close(b.iface);
}

/* The connector maps a reject with a reason to the status it names (the
 * engine does not try another transport for those: cfx__conn_fallback);
 * a plain reject, a foreign magic or an unknown reason is CFX_ERR_CONNECT.
 * (A REJ's private data arrives padded to 148 bytes: short data is for the
 * decoder test.) */
Test(verbs_authz, rejected_with_reason_fails_with_it, .timeout = 240)
{
    static const struct {
        uint32_t magic;
        uint16_t version, reason;
        size_t len;
        int status;
        const char *why;
    } rounds[] = {
        { 0x43465852u, 1, 1, 8, CFX_ERR_VERSION, "protocol version" },
        { 0x43465852u, 1, 2, 8, CFX_ERR_AUTH, "credentials" },
        { 0x43465852u, 2, 3, 8, CFX_ERR_PROTO, "malformed" },
        { 0, 0, 0, 0, CFX_ERR_CONNECT, NULL },           /* plain rdma_reject */
        { 0x43465853u, 1, 1, 8, CFX_ERR_CONNECT, NULL }, /* another magic */
        { 0x43465852u, 0, 1, 8, CFX_ERR_CONNECT, NULL }, /* version 0 */
        { 0x43465852u, 1, 77, 8, CFX_ERR_CONNECT, NULL }, /* unknown reason */
    };
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    cr_assert_not_null(ops);
    struct side a = { .iface = open_or_skip(ops, 1) };
    struct sockaddr_in sa = iface_sockaddr(ops, a.iface);
    sa.sin_port = 0;
    struct rdma_event_channel *ch = raw_channel();
    struct rdma_cm_id *lid;
    cr_assert_eq(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP), 0, "%s", strerror(errno));
    cr_assert_eq(rdma_bind_addr(lid, (struct sockaddr *)&sa), 0, "%s", strerror(errno));
    cr_assert_eq(rdma_listen(lid, 8), 0, "%s", strerror(errno));
    char addr[CFX_TP_ADDR_MAX], ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(addr, sizeof(addr), "%s:%u", ip, ntohs(rdma_get_src_port(lid)));

    for (size_t i = 0; i < CFX_ARRAY_SIZE(rounds); i++) {
        struct raw_ev ev;
        uint8_t rej[8];
        a.ep_error = 0;
        a.n_ep_error = 0;
        cr_assert_eq(ops->ep_connect(a.iface, addr, strlen(addr) + 1, 9, &a.ep), CFX_OK, "%s",
                     cfx_last_error());
        raw_wait(ops, &a, ch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev);
        rej_bytes(rej, rounds[i].magic, rounds[i].version, rounds[i].reason);
        cr_assert_eq(rdma_reject(ev.id, rounds[i].len ? rej : NULL, (uint8_t)rounds[i].len), 0,
                     "rdma_reject: %s", strerror(errno));
        rdma_destroy_id(ev.id);
        uint64_t end = cfx__deadline_ns(WAIT_MS);
        while (!a.n_ep_error) {
            cr_assert(cfx__now_ns() < end, "round %zu: no EP_ERROR", i);
            side_poll(ops, &a);
        }
        cr_assert_eq(a.ep_error, rounds[i].status, "round %zu: %s, %s expected", i,
                     cfx_errname(a.ep_error), cfx_errname(rounds[i].status));
        if (rounds[i].why)
            cr_assert(a.ep->why && strstr(a.ep->why, rounds[i].why), "round %zu: why: %s", i,
                      a.ep->why ? a.ep->why : "(none)");
        else
            cr_assert_null(a.ep->why, "round %zu: why: %s", i, a.ep->why);
        ops->ep_close(a.ep);
    }
    rdma_destroy_id(lid);
    rdma_destroy_event_channel(ch);
    ops->iface_close(a.iface);
}

/* The decoder on its own, no device needed: nothing but a well-formed
 * reason from a consumer reject is one. */
Test(verbs_authz, reject_reason_decode)
{
    uint8_t buf[148] = { 0 };
    const char *why;
    struct cfx__verbs_rej r;

    cr_assert_eq(cfx__verbs_rej_fill(&r, CFX_ERR_NOMEM), 0);
    cr_assert_eq(cfx__verbs_rej_fill(&r, CFX_ERR_CONNECT), 0);
    static const int st[] = { CFX_ERR_VERSION, CFX_ERR_AUTH, CFX_ERR_PROTO };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(st); i++) {
        cr_assert_eq(cfx__verbs_rej_fill(&r, st[i]), sizeof(r));
        memcpy(buf, &r, sizeof(r));
        rej_bytes(buf + 100, 0x43465852u, 1, (uint16_t)(i + 1));
        cr_assert_arr_eq(buf, buf + 100, 8, "wire bytes of %s", cfx_errname(st[i]));
        cr_assert_eq(cfx__verbs_rej_decode(28, buf, sizeof(buf), &why), st[i]);
        cr_assert_not_null(why);
        cr_assert_eq(cfx__verbs_rej_decode(28, buf, sizeof(r), &why), st[i]);
        for (size_t n = 0; n < sizeof(r); n++) {
            cr_assert_eq(cfx__verbs_rej_decode(28, buf, n, &why), CFX_ERR_CONNECT);
            cr_assert_null(why);
        }
        cr_assert_eq(cfx__verbs_rej_decode(8, buf, sizeof(buf), &why), CFX_ERR_CONNECT);
        cr_assert_null(why);
        cr_assert_eq(cfx__verbs_rej_decode(28, NULL, sizeof(buf), &why), CFX_ERR_CONNECT);
    }
    for (int b = 0; b < 4; b++) { /* a flipped bit in the magic */
        rej_bytes(buf, 0x43465852u, 1, 1);
        buf[b] ^= 0x10;
        cr_assert_eq(cfx__verbs_rej_decode(28, buf, 8, &why), CFX_ERR_CONNECT, "byte %d", b);
    }
    rej_bytes(buf, 0x43465852u, 0, 1);
    cr_assert_eq(cfx__verbs_rej_decode(28, buf, 8, &why), CFX_ERR_CONNECT);
    rej_bytes(buf, 0x43465852u, 1, 0);
    cr_assert_eq(cfx__verbs_rej_decode(28, buf, 8, &why), CFX_ERR_CONNECT);
    rej_bytes(buf, 0x43465852u, 1, 4);
    cr_assert_eq(cfx__verbs_rej_decode(28, buf, 8, &why), CFX_ERR_CONNECT);
    rej_bytes(buf, 0x43465852u, 9, 2); /* a later version: its first fields still count */
    cr_assert_eq(cfx__verbs_rej_decode(28, buf, 8, &why), CFX_ERR_AUTH);
}

/* --- closed at the acceptor's cap before the handshake ended ------------------------------ */

/* Until the acceptor's REJ reached @p ep, whose REP waits unread: its id
 * left the states that make a connection (rdma_init_qp_attr, a query,
 * refuses).  @p s, when not NULL, is polled meanwhile. */
static void await_rej(struct cfx__verbs_ep *ep, struct side *s)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
    int mask;
    while (rdma_init_qp_attr(ep->cm_id, &qa, &mask) == 0) {
        cr_assert(cfx__now_ns() < end, "the acceptor's REJ never came");
        if (s)
            side_poll(cfx__transport_find("verbs"), s);
        sched_yield();
    }
    cr_assert_eq(errno, EINVAL, "rdma_init_qp_attr: %s", strerror(errno));
}

/*
 * b, at its cap of one connection not authenticated per address, accepts
 * a's request (REP sent), then c's, and closes a's for it before a's RTU
 * (a's REP read only once b's REJ came): a fails with CFX_ERR_PEER_FAILED
 * saying b closed it, which the engine dials again (tcp's status for a
 * connection its acceptor closed).  Before: CFX_ERR_CONNECT (the REP's QP
 * attributes refused), on which the engine moved on to the next transport.
 */
Test(verbs_authz, closed_at_the_cap_after_its_rep_is_peer_failed, .timeout = 240)
{
    setenv("CFX_IB_CONNECT", "cm", 1);
    setenv("CFX_IB_MAX_UNAUTH_PER_IP", "1", 1);
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    cr_assert_not_null(ops);
    struct side a = { .iface = open_or_skip(ops, 1) }, b = { .iface = open_or_skip(ops, 2) },
                c = { .iface = open_or_skip(ops, 3) };
    struct cfx__verbs_iface *bv = cfx__verbs_iface_of(b.iface);
    cr_assert_eq(bv->strangers.max_per_ip, 1);
    char addr[CFX_TP_ADDR_MAX];
    size_t alen = sizeof(addr);
    cr_assert_eq(ops->iface_addr(b.iface, addr, &alen), CFX_OK);

    /* a alone until its REQ is out, b alone until it took it (REP sent) */
    cr_assert_eq(ops->ep_connect(a.iface, addr, alen, 2, &a.ep), CFX_OK, "%s", cfx_last_error());
    struct cfx__verbs_ep *av = cfx__verbs_ep_of(a.ep);
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (av->state == CFX_VERBS_EP_RESOLVING) {
        cr_assert(cfx__now_ns() < end, "a sent no REQ");
        side_poll(ops, &a);
    }
    cr_assert_eq(av->state, CFX_VERBS_EP_CONNECTING);
    while (bv->strangers.n == 0) {
        cr_assert(cfx__now_ns() < end, "b did not accept a's request");
        side_poll(ops, &b);
    }
    /* c connects (a not polled: no RTU from it); b closes a's for c's */
    cr_assert_eq(ops->ep_connect(c.iface, addr, alen, 2, &c.ep), CFX_OK, "%s", cfx_last_error());
    while (!b.ep) {
        cr_assert(cfx__now_ns() < end, "b did not accept c");
        side_poll(ops, &c);
        side_poll(ops, &b);
    }
    cr_assert_eq(atomic_load(&bv->strangers.n_evicted), 1);
    await_rej(av, &b);
    while (!a.n_ep_error) {
        cr_assert(cfx__now_ns() < end, "a's connection did not fail");
        side_poll(ops, &a);
    }
    cr_assert_eq(a.ep_error, CFX_ERR_PEER_FAILED, "a failed with %s: %s", cfx_errname(a.ep_error),
                 a.ep->why ? a.ep->why : "(no reason)");
    cr_assert(a.ep->why && strstr(a.ep->why, "closed the connection"), "why: %s",
              a.ep->why ? a.ep->why : "(none)");
    cr_assert_eq(a.n_ep_error, 1);
    cr_assert_eq(b.n_ep_error + c.n_ep_error, 0, "c's connection failed");
    ops->ep_close(a.ep);
    ops->ep_close(b.ep);
    ops->ep_close(c.ep);
    ops->iface_close(a.iface);
    ops->iface_close(b.iface);
    ops->iface_close(c.iface);
}

/* ---- the engine: a token holder closed at the cap dials again ----------------------------- */

#define OBJ_SIZE (1u << 20)

struct getter {
    struct cfx_context *ctx;
    struct cfx_object_id oid;
    uint8_t *buf;
    int rc;
    char err[512];
};

static void *get_main(void *arg)
{
    struct getter *g = arg;
    struct cfx_obj_params gp = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = WAIT_MS };
    g->rc = cfx_get(g->ctx, &g->oid, g->buf, OBJ_SIZE, NULL, &gp);
    snprintf(g->err, sizeof(g->err), "%s", cfx_last_error());
    return NULL;
}

static struct cfx__verbs_iface *ctx_verbs(struct cfx_context *ctx)
{
    cr_assert_eq(ctx->ntp, 1);
    cr_assert_str_eq(ctx->tp[0].ops->name, "verbs");
    return cfx__verbs_iface_of(ctx->tp[0].iface);
}

/* @p v's endpoint whose REQ is out and whose REP was not read (its
 * progress lock held), or NULL. */
static struct cfx__verbs_ep *connecting_ep(struct cfx__verbs_iface *v)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &v->eps) {
        struct cfx__verbs_ep *ep = cfx_list_entry(pos, struct cfx__verbs_ep, link);
        if (ep->state == CFX_VERBS_EP_CONNECTING)
            return ep;
    }
    return NULL;
}

/* Until an event waits on @p fd (it is not read). */
static void await_readable(int fd, const char *what)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int n;
    while ((n = poll(&p, 1, WAIT_MS)) < 0 && errno == EINTR)
        ;
    cr_assert_eq(n, 1, "%s: nothing came in %d ms", what, WAIT_MS);
}

/* Until @p n connections wait in the accept queue of listener @p fd. */
static void accept_queue_reaches(int fd, unsigned n)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    struct tcp_info ti;
    for (;;) {
        socklen_t len = sizeof(ti);
        cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
        if (ti.tcpi_unacked >= n)
            return;
        cr_assert(cfx__now_ns() < end, "%u connections never waited to be accepted", n);
        sched_yield();
    }
}

/* The stranger: over rdma_cm a transport endpoint of its own iface that
 * connects and never speaks (the engine's handshake); out of band a TCP
 * connection that sends nothing, from the node's address as the getter's. */
struct stranger {
    const struct cfx_transport_ops *ops;
    struct side s;
    int fd;
};

static void stranger_oob_connect(struct stranger *st, const struct cfx__verbs_iface *nv)
{
    struct sockaddr_in from = { .sin_family = AF_INET, .sin_addr = nv->ip };
    struct sockaddr_in to = from;
    to.sin_port = htons(nv->port);
    st->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(st->fd, 0);
    cr_assert_eq(bind(st->fd, (struct sockaddr *)&from, sizeof(from)), 0, "%s", strerror(errno));
    cr_assert_eq(connect(st->fd, (struct sockaddr *)&to, sizeof(to)), 0, "connect to %s: %s",
                 nv->addr, strerror(errno));
}

/* Until the node closed the stranger's connection (for the getter's). */
static void stranger_closed(struct stranger *st)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    if (st->fd >= 0) {
        struct pollfd p = { .fd = st->fd, .events = POLLIN | POLLRDHUP };
        cr_assert_eq(poll(&p, 1, WAIT_MS), 1, "the stranger's connection stayed open");
        return;
    }
    while (!st->s.n_ep_error) {
        cr_assert(cfx__now_ns() < end, "the stranger's connection stayed open");
        side_poll(st->ops, &st->s);
    }
    cr_assert_neq(st->s.ep_error, CFX_OK);
}

/*
 * The node holds one connection not authenticated per address
 * (CFX_IB_MAX_UNAUTH_PER_IP=1).  The getter's connection is accepted, and
 * a stranger's after it closes it before the getter's handshake ended: over
 * rdma_cm between the node's REP and the getter's RTU (the getter held
 * still until the node's REJ came), out of band during the exchange.  The
 * getter dials again (the stranger's connection is closed for it in turn)
 * and gets the object byte for byte.  (Before, the getter's endpoint failed
 * with CFX_ERR_CONNECT, the engine moved on to the next transport, found
 * none, and the get failed; on tcp: test_dp_auth,
 * a_token_holder_closed_at_the_cap_dials_again.)
 */
static void closed_at_the_cap_dials_again(const char *mode)
{
    bool oob = !strcmp(mode, "oob");
    setenv("CFX_IB_CONNECT", mode, 1);
    setenv("CFX_IB_MAX_UNAUTH_PER_IP", "1", 1);
    setenv("CFX_LOG_LEVEL", "INFO", 1);
    struct cfx_coord *coord;
    char token[64], caddr[64];
    cr_assert_eq(cfx_test_coord_start(NULL, &coord, token, sizeof(token), caddr, sizeof(caddr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
    struct cfx_context *node;
    int rc = cfx_test_join(caddr, token, "verbs", NULL, WAIT_MS, &node);
    if (rc == CFX_ERR_NO_DEVICE)
        cr_skip_test("no RDMA device: %s", cfx_last_error());
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    struct getter g = { .buf = calloc(1, OBJ_SIZE) };
    uint8_t *src = malloc(OBJ_SIZE);
    cr_assert(g.buf && src);
    cr_assert_eq(cfx_test_join(caddr, token, "verbs", NULL, WAIT_MS, &g.ctx), CFX_OK, "%s",
                 cfx_last_error());
    cfx_test_fill(src, OBJ_SIZE, 7);
    cfx_object_id_generate(node, &g.oid);
    cr_assert_eq(cfx_put(node, &g.oid, src, OBJ_SIZE, NULL), CFX_OK, "%s", cfx_last_error());
    struct cfx__verbs_iface *nv = ctx_verbs(node), *gv = ctx_verbs(g.ctx);
    cr_assert_eq(nv->strangers.max_per_ip, 1);
    struct stranger st = { .ops = cfx__transport_find("verbs"), .fd = -1 };
    char logpath[] = "/tmp/cfx-test-capdial-XXXXXX";
    int logfd, saved = cfx_test_stderr_to(logpath, &logfd);

    /* the node accepts nothing until both connections wait (oob) or the
     * getter's REQ is out (rdma_cm) */
    cr_assert_eq(cfx__progress_pause(node, true), CFX_OK, "%s", cfx_last_error());
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, get_main, &g), 0);
    if (oob) {
        accept_queue_reaches(nv->listen_fd, 1);
        stranger_oob_connect(&st, nv);
        accept_queue_reaches(nv->listen_fd, 2);
        cr_assert_eq(cfx__progress_pause(node, false), CFX_OK);
    } else {
        /* the getter is held still (its progress lock taken) once its REQ
         * is out, so that it reads the node's REP only when a stranger made
         * the node close its connection and the REJ for it came */
        uint64_t end = cfx__deadline_ns(WAIT_MS);
        struct cfx__verbs_ep *gep;
        for (;;) {
            cfx__progress_lock(g.ctx);
            if ((gep = connecting_ep(gv)))
                break;
            cfx__progress_unlock(g.ctx);
            cr_assert(cfx__now_ns() < end, "the getter sent no connection request");
            sched_yield();
        }
        cr_assert_eq(cfx__progress_pause(node, false), CFX_OK);
        await_readable(gv->cm_ch->fd, "the node's REP");
        st.s.iface = open_or_skip(st.ops, 99);
        cr_assert_eq(st.ops->ep_connect(st.s.iface, nv->addr, strlen(nv->addr) + 1,
                                        node->node_id, &st.s.ep), CFX_OK, "%s",
                     cfx_last_error());
        while (cfx__verbs_ep_of(st.s.ep)->state != CFX_VERBS_EP_OPEN) {
            cr_assert(cfx__now_ns() < end, "the stranger did not connect");
            side_poll(st.ops, &st.s);
        }
        cr_assert_eq(atomic_load(&nv->strangers.n_evicted), 1);
        cr_assert_eq(connecting_ep(gv), gep);
        await_rej(gep, &st.s);
        cfx__progress_unlock(g.ctx);
    }

    pthread_join(th, NULL);
    cr_assert_eq(g.rc, CFX_OK, "%s: %s", cfx_errname(g.rc), g.err);
    cr_assert_eq(cfx_test_check(g.buf, OBJ_SIZE, 7), (size_t)-1, "the bytes differ");
    stranger_closed(&st);
    cr_assert_geq(atomic_load(&nv->strangers.n_evicted), 2);
    cfx_test_stderr_back(saved);
    close(logfd);
    cr_assert(cfx_test_file_contains(logpath, "CFX_IB_MAX_UNAUTH_PER_IP (1) reached"),
              "no eviction logged");
    cr_assert(cfx_test_file_contains(logpath, "dialling again (1 of"), "no redial logged");
    /* the redial's line names the transport's status and reason */
    cr_assert(cfx_test_file_contains(logpath, oob ? "(CFX_ERR_PEER_FAILED; at its cap" :
                                     "(CFX_ERR_PEER_FAILED: it closed the connection after its "
                                     "REP, before our RTU reached it; at its cap"),
              "the redial does not say why");
    unlink(logpath);
    if (st.fd >= 0) {
        close(st.fd);
    } else {
        st.ops->ep_close(st.s.ep);
        st.ops->iface_close(st.s.iface);
    }
    cfx_context_destroy(g.ctx);
    cfx_context_destroy(node);
    cfx__coord_stop(coord);
    free(g.buf);
    free(src);
}

Test(verbs_authz, token_holder_closed_at_the_cap_dials_again_cm, .timeout = 240)
{
    closed_at_the_cap_dials_again("cm");
}

Test(verbs_authz, token_holder_closed_at_the_cap_dials_again_oob, .timeout = 240)
{
    closed_at_the_cap_dials_again("oob");
}

/* ---- the out-of-band port out of descriptors ---------------------------------------------- */

static int lines_with(const char *path, const char *needle)
{
    int n = cfx_test_lines_with(path, needle);
    cr_assert_geq(n, 0, "%s", path);
    return n;
}

/* Until b accepted and closed or kept everything: @p want strangers taken. */
static void strangers_taken(struct side *b, const struct cfx__tp_strangers *s, uint64_t want)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    for (;;) {
        uint64_t got = s->n + atomic_load(&s->n_evicted) + atomic_load(&s->n_shed);
        if (got >= want)
            break;
        cr_assert(cfx__now_ns() < end, "%llu of %llu connections taken (%u kept, %llu "
                  "closed, %llu shed)", (unsigned long long)got, (unsigned long long)want,
                  s->n, (unsigned long long)atomic_load(&s->n_evicted),
                  (unsigned long long)atomic_load(&s->n_shed));
        side_poll(cfx__transport_find("verbs"), b);
    }
    cr_assert_null(b->ep, "a stranger was reported");
}

/* Whether b closed our end @p fd of a connection (waits for it when @p wait). */
static bool hung_up(int fd, bool wait)
{
    struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
    char c;
    if (wait)
        cr_assert_eq(poll(&p, 1, WAIT_MS), 1, "connection %d stayed open", fd);
    return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

/*
 * The out-of-band port runs out of descriptors (the process may open ROOM
 * more; tcp shares the code: test_dp_auth, out_of_fds_sheds_strangers_...).
 * accept() fails with EMFILE and the port neither spins on its readable
 * listener nor stops: with strangers waiting the oldest of them are closed
 * for the newcomers, the newest kept; with none, each newcomer is accepted
 * on the reserve descriptor and closed (shed); each line at most once a
 * second, no line per failed accept; once descriptors are free it accepts
 * again and a real peer connects.
 */
Test(verbs_authz, oob_out_of_fds_closes_the_oldest_then_sheds, .timeout = 240)
{
    enum { ROOM = 4, N = 12, M = 3, DUPS = 64 };
    setenv("CFX_IB_CONNECT", "oob", 1);
    setenv("CFX_IB_OOB_ACCEPT_MS", "600000", 1); /* no deadline within the test */
    setenv("CFX_IB_MAX_UNAUTH", "1000", 1);      /* the caps out of reach */
    setenv("CFX_IB_MAX_UNAUTH_PER_IP", "1000", 1);
    struct pair p;
    pair_open(&p);
    struct cfx__verbs_iface *bv = cfx__verbs_iface_of(p.b.iface);
    struct cfx__tp_strangers *s = &bv->strangers;
    cr_assert_geq(s->spare_fd, 0, "no reserve descriptor");
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr = bv->ip,
                              .sin_port = htons(bv->port) };
    int fd[N + M + 1], dups[DUPS], ndups = 0;
    for (int i = 0; i < N + M + 1; i++) /* ours made before the limit */
        cr_assert_geq(fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0);
    char logpath[] = "/tmp/cfx-test-oobfds-XXXXXX";
    int logfd, saved = cfx_test_stderr_to(logpath, &logfd);
    struct rlimit old;
    cr_assert_eq(cfx_test_fds_leave(ROOM, &old), 0, "%s", strerror(errno));
    uint64_t t0 = cfx__now_ns();

    /* N strangers, room for ROOM: the oldest closed for the newest */
    for (int i = 0; i < N; i++)
        cr_assert_eq(connect(fd[i], (struct sockaddr *)&to, sizeof(to)), 0, "%s",
                     strerror(errno));
    strangers_taken(&p.b, s, N);
    uint32_t kept = s->n;
    cr_assert(kept >= 1 && kept <= ROOM, "%u strangers kept with room for %d", kept, ROOM);
    cr_assert_eq(atomic_load(&s->n_evicted), N - kept);
    cr_assert_eq(atomic_load(&s->n_shed), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(hung_up(fd[i], i < (int)(N - kept)), i < (int)(N - kept), "stranger %d "
                     "of %d %s", i, N, i < (int)(N - kept) ? "kept" : "closed, not the oldest");

    /* none left to close (those kept hang up), no descriptor free: shed */
    for (int i = 0; i < N; i++)
        close(fd[i]);
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    while (s->n) {
        cr_assert(cfx__now_ns() < end, "%u strangers stayed after hanging up", s->n);
        side_poll(p.ops, &p.b);
    }
    while (ndups < DUPS && (dups[ndups] = dup(0)) >= 0)
        ndups++;
    cr_assert_eq(errno, EMFILE, "%d descriptors taken: %s", ndups, strerror(errno));
    for (int i = N; i < N + M; i++)
        cr_assert_eq(connect(fd[i], (struct sockaddr *)&to, sizeof(to)), 0, "%s",
                     strerror(errno));
    strangers_taken(&p.b, s, N - kept + M);
    cr_assert_eq(atomic_load(&s->n_shed), M);
    cr_assert_eq(atomic_load(&s->n_evicted), N - kept);
    for (int i = N; i < N + M; i++)
        cr_assert(hung_up(fd[i], true), "newcomer %d not shed", i - N);

    /* descriptors free again: accepted, and a real peer connects */
    while (ndups)
        close(dups[--ndups]);
    cr_assert_eq(connect(fd[N + M], (struct sockaddr *)&to, sizeof(to)), 0);
    strangers_taken(&p.b, s, N - kept + M + 1);
    cr_assert_eq(s->n, 1, "the last newcomer not kept");
    cr_assert(!hung_up(fd[N + M], false), "the last newcomer closed");
    double secs = (double)(cfx__now_ns() - t0) / 1e9;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    pair_join(&p);
    cr_assert_eq(p.a.n_ep_error + p.b.n_ep_error, 0);
    cfx_test_stderr_back(saved);
    close(logfd);

    int closing = lines_with(logpath, "out of file descriptors (Too many open files), and it "
                             "is the oldest not authenticated");
    int shed = lines_with(logpath, "out of file descriptors (Too many open files, none waiting "
                          "to authenticate): shed a new connection");
    cr_log_info("%d closing and %d shedding lines in %.1f s", closing, shed, secs);
    cr_assert(closing >= 1 && closing <= (int)secs + 2, "%d lines for %d closed in %.1f s",
              closing, (int)(N - kept), secs);
    cr_assert(shed >= 1 && shed <= (int)secs + 2, "%d lines for %d shed in %.1f s", shed, M,
              secs);
    cr_assert_eq(lines_with(logpath, "accept: Too many open files"), 0, "a line per accept");
    unlink(logpath);
    close(fd[N + M]);
    for (int i = N; i < N + M; i++)
        close(fd[i]);
    pair_close(&p);
}

/* ---- the out-of-band exchange refused: the connector learns why --------------------------- */

/* A TCP connection to @p v's out-of-band port. */
static int oob_dial(const struct cfx__verbs_iface *v)
{
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr = v->ip,
                              .sin_port = htons(v->port) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof(to)), 0, "connect to %s: %s",
                 v->addr, strerror(errno));
    return fd;
}

/* Read from non-blocking @p fd into @p buf (@p cap) until the peer closed
 * it, polling @p s meanwhile: the bytes that came. */
static size_t read_to_close(int fd, struct side *s, uint8_t *buf, size_t cap)
{
    uint64_t end = cfx__deadline_ns(WAIT_MS);
    size_t len = 0;
    for (;;) {
        side_poll(cfx__transport_find("verbs"), s);
        ssize_t k = recv(fd, buf + len, cap - len, MSG_DONTWAIT);
        if (k == 0)
            return len;
        if (k > 0)
            len += (size_t)k;
        else
            cr_assert(errno == EAGAIN || errno == EWOULDBLOCK, "recv: %s", strerror(errno));
        cr_assert_lt(len, cap, "more than %zu bytes came", cap);
        cr_assert(cfx__now_ns() < end, "not closed: %zu bytes came", len);
    }
}

/*
 * A hello of another version at the out-of-band port, the whole exchange or
 * its first bytes only (a version whose exchange is shorter), is answered
 * with a refusal record before the acceptor closes: 64 bytes, little
 * endian, its magic and version, reason CFX_VERBS_REJ_R_VERSION, no QP;
 * nothing is reported, and the refusal is logged naming both versions.  A
 * hello of ours that is malformed (1 receive announced) is refused so too,
 * with reason CFX_VERBS_REJ_R_HELLO (its line falls within the log's one
 * a second: flood.h).
 * (Before: the whole one was closed without a word, which the connector
 * took for a cap's and dialled again 8 times; the first bytes alone waited
 * for the acceptor's CFX_IB_OOB_ACCEPT_MS.)
 */
Test(verbs_authz, oob_hello_of_another_version_answered_with_a_refusal, .timeout = 240)
{
    setenv("CFX_IB_CONNECT", "oob", 1);
    setenv("CFX_IB_OOB_ACCEPT_MS", "600000", 1); /* no deadline within the test */
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    cr_assert_not_null(ops);
    struct side b = { .iface = open_or_skip(ops, 2) };
    struct cfx__verbs_iface *bv = cfx__verbs_iface_of(b.iface);
    char logpath[] = "/tmp/cfx-test-oobver-XXXXXX";
    int logfd, saved = cfx_test_stderr_to(logpath, &logfd);

    /* 1, 0: another version's, whole and its head; -1: one of ours that
     * announces 1 receive (at least 4 are needed), refused as malformed */
    for (int whole = 1; whole >= -1; whole--) {
        struct cfx__verbs_oob_info hello = { 0 };
        hello.hello.magic = htole32(CFX_VERBS_MAGIC);
        hello.hello.version = htole16(CFX_VERBS_VERSION + (whole >= 0));
        hello.hello.rq_depth = htole32(whole >= 0 ? 64 : 1);
        size_t n = whole ? sizeof(hello) : CFX_VERBS_OOB_HEAD + 2;
        int fd = oob_dial(bv);
        cr_assert_eq(send(fd, &hello, n, 0), (ssize_t)n);
        uint8_t got[128];
        size_t len = read_to_close(fd, &b, got, sizeof(got));
        close(fd);
        const char *what = whole > 0 ? "whole" : whole ? "malformed" : "head";
        cr_assert_eq(len, 64, "%s hello: %zu bytes of refusal", what, len);
        uint8_t want[64] = { 0x56, 0x58, 0x46, 0x43, CFX_VERBS_VERSION, 0 }; /* magic, ver */
        /* refused, little endian; the rest zero */
        want[62] = whole >= 0 ? CFX_VERBS_REJ_R_VERSION : CFX_VERBS_REJ_R_HELLO;
        for (size_t i = 0; i < sizeof(want); i++)
            cr_assert_eq(got[i], want[i], "%s hello: refusal byte %zu is %#x, not %#x", what,
                         i, got[i], want[i]);
    }
    cr_assert_null(b.ep, "a refused stranger was reported");
    cr_assert_eq(b.n_ep_error, 0);
    cfx_test_stderr_back(saved);
    close(logfd);
    char line[160];
    snprintf(line, sizeof(line), "speaks verbs protocol version %u, we speak %u",
             CFX_VERBS_VERSION + 1, CFX_VERBS_VERSION);
    cr_assert(cfx_test_file_contains(logpath, line), "the refusal not logged: '%s'", line);
    snprintf(line, sizeof(line), "%s: refused ", bv->addr);
    cr_assert(cfx_test_file_contains(logpath, line), "no line '%s'", line);
    unlink(logpath);
    ops->iface_close(b.iface);
}

/*
 * The connector meets an acceptor that refuses its hello: one of another
 * version that sends its magic and version and closes (its exchange of
 * another size), or one of ours whose refusal record says the hello was
 * malformed, or that our credentials were refused.  The connection fails
 * with CFX_ERR_VERSION naming both versions, or CFX_ERR_PROTO or
 * CFX_ERR_AUTH saying so: statuses the engine does not dial again for
 * (cfx__conn_fallback).  (Before: CFX_ERR_PEER_FAILED, dialled
 * again CFX_CONN_REDIALS times, and CFX_ERR_CONNECT.)
 */
Test(verbs_authz, oob_connector_told_why_it_was_refused, .timeout = 240)
{
    setenv("CFX_IB_CONNECT", "oob", 1);
    const struct cfx_transport_ops *ops = cfx__transport_find("verbs");
    cr_assert_not_null(ops);
    struct cfx_tp_iface *ai = open_or_skip(ops, 1);
    const struct cfx__verbs_iface *av = cfx__verbs_iface_of(ai);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = av->ip };
    socklen_t slen = sizeof(sa);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    cr_assert_geq(lfd, 0);
    cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    cr_assert_eq(listen(lfd, 4), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&sa, &slen), 0);
    char addr[CFX_TP_ADDR_MAX], ip[INET_ADDRSTRLEN];
    cr_assert_not_null(inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip)));
    snprintf(addr, sizeof(addr), "oob:%s:%u", ip, ntohs(sa.sin_port));
    char why_version[96];
    snprintf(why_version, sizeof(why_version), "it refused our hello: it speaks verbs protocol "
             "version %u, we speak %u", CFX_VERBS_VERSION + 1, CFX_VERBS_VERSION);
    const struct {
        uint16_t version, refused;
        size_t len;
        int status;
        const char *why;
    } cases[] = {
        { CFX_VERBS_VERSION + 1, 0, CFX_VERBS_OOB_HEAD + 2, CFX_ERR_VERSION, why_version },
        { CFX_VERBS_VERSION, CFX_VERBS_REJ_R_HELLO, 64, CFX_ERR_PROTO,
          "it rejected our hello as malformed" },
        { CFX_VERBS_VERSION, CFX_VERBS_REJ_R_AUTH, 64, CFX_ERR_AUTH,
          "it rejected our credentials" },
    };

    for (size_t c = 0; c < CFX_ARRAY_SIZE(cases); c++) {
        struct side a = { .iface = ai };
        cr_assert_eq(ops->ep_connect(ai, addr, strlen(addr) + 1, 2, &a.ep), CFX_OK, "%s",
                     cfx_last_error());
        /* take the connector's exchange whole (no reset for bytes unread) */
        struct cfx__verbs_oob_info in, out = { 0 };
        uint32_t got = 0;
        int fd = -1;
        uint64_t end = cfx__deadline_ns(WAIT_MS);
        while (got < sizeof(in)) {
            cr_assert(cfx__now_ns() < end, "case %zu: %u bytes of the exchange came", c, got);
            side_poll(ops, &a);
            cr_assert_eq(a.n_ep_error, 0, "case %zu: failed before the refusal", c);
            if (fd < 0 && (fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0)
                continue;
            ssize_t k = recv(fd, (uint8_t *)&in + got, sizeof(in) - got, MSG_DONTWAIT);
            if (k > 0)
                got += (uint32_t)k;
        }
        cr_assert_eq(le16toh(in.hello.version), CFX_VERBS_VERSION);
        out.hello.magic = htole32(CFX_VERBS_MAGIC);
        out.hello.version = htole16(cases[c].version);
        out.refused = htole16(cases[c].refused);
        cr_assert_eq(send(fd, &out, cases[c].len, 0), (ssize_t)cases[c].len);
        close(fd);
        while (!a.n_ep_error) {
            cr_assert(cfx__now_ns() < end, "case %zu: the connection did not fail", c);
            side_poll(ops, &a);
        }
        cr_assert_eq(a.n_ep_error, 1);
        cr_assert_eq(a.ep_error, cases[c].status, "case %zu: %s: %s", c,
                     cfx_errname(a.ep_error), a.ep->why ? a.ep->why : "(no reason)");
        cr_assert(a.ep->why && !strcmp(a.ep->why, cases[c].why), "case %zu: why '%s', not '%s'",
                  c, a.ep->why ? a.ep->why : "(none)", cases[c].why);
        ops->ep_close(a.ep);
    }
    cr_assert_lt(accept4(lfd, NULL, NULL, SOCK_CLOEXEC), 0, "dialled again");
    close(lfd);
    ops->iface_close(ai);
}

#endif

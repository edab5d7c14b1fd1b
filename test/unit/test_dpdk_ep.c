/*
 * The dpdk transport's endpoints (dataplane/dpdk/dpdk_ep.c, dpdk_iface.c)
 * in one process: two net_memif ports joined to each other (tp_pair.h), a
 * connected pair, and what an endpoint does with control packets and write
 * chunks that the contract tests (test_transport.c) do not reach.
 */
#include <criterion/criterion.h>

#include <conflux/status.h>

#ifdef CFX_HAVE_DPDK
#include "dataplane/dpdk/dpdk.h"
#endif
#include "tp_pair.h"

#ifdef CFX_HAVE_DPDK
static const struct tp_param dpdk_param = { .name = "dpdk" };

/* a's endpoint has failed; its keepalive clock is kept fresh meanwhile,
 * so that only a packet can fail it, never the silence */
static bool a_failed_heard_fresh(struct pair *p, void *arg)
{
    (void)arg;
    cfx__dpdk_ep_of(p->ab)->heard = cfx__now_ns();
    return find_ev(&p->s[0], CFX_TP_COMP_EP_ERROR, p->ab) != NULL;
}
#endif

/*
 * b loses its end of the session without a word (a process restarted on
 * the same address), and a, idle, pings it: b answers with a reset, which
 * must fail a's endpoint at once.  It named the pinger's session as the
 * sender (0) where a checks the peer's, so a ignored it and only its
 * silence failed it, 3 s later.
 */
Test(dpdk_ep, a_ping_to_a_session_gone_is_reset, .timeout = 60)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK");
#else
    struct pair p;
    pair_open(&p, &dpdk_param);
    pair_connect(&p);
    cfx__dpdk_ep_of(p.ba)->state = CFX_DPDK_EP_FAILED; /* closed with no reset */
    p.ops->ep_close(p.ba);
    p.ba = NULL;

    struct cfx__dpdk_ep *a = cfx__dpdk_ep_of(p.ab);
    cfx__dpdk_ctl_send(a->iface, &a->peer, CFX_DPDK_CTL_PING, a->sess_id, a->peer_sess, 0);
    cfx__dpdk_port_flush(a->iface->port);
    drive(&p, a_failed_heard_fresh, NULL, WAIT_MS, "a's endpoint reset by b's answer");
    struct ev *e = wait_ev(&p, 0, CFX_TP_COMP_EP_ERROR, p.ab, WAIT_MS);
    cr_assert_eq(e->status, CFX_ERR_PEER_FAILED, "EP_ERROR status %s", cfx_errname(e->status));
    pair_close(&p);
#endif
}

#ifdef CFX_HAVE_DPDK
static bool b_chunk_under_way(struct pair *p, void *arg)
{
    (void)arg;
    return cfx__dpdk_ep_of(p->ba)->rx_expect;
}
#endif

/*
 * A chunk of a write is checked against its grant at its header, and its
 * packets then land one by one as they come, over many polls.  The
 * receiver revokes the grant with a chunk under way (it gave the transfer
 * up; the region may be granted next to another source): no byte of it
 * that comes after lands, nor anything of the chunks after it, and the
 * write reports no WRITE_IMM; the connection lives on.  The rest of the
 * chunk under way used to land all the same, the registration being
 * still there.
 */
Test(dpdk_ep, a_revoked_grant_stops_the_chunk_under_way, .timeout = 60)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK");
#else
    enum { LEN = 4 * CFX_DPDK_CHUNK };
    struct pair p;
    struct region src, dst;
    struct cfx_tp_rdesc grant;
    pair_open(&p, &dpdk_param);
    pair_connect(&p);
    region_reg(&p, 0, &src, LEN, CFX_TP_ACCESS_LOCAL, 0x11);
    region_reg(&p, 1, &dst, LEN, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    int rc = p.ops->mr_grant(dst.mr, p.ba, &grant);
    cr_assert_eq(rc, CFX_OK, "mr_grant: %s", cfx_last_error());

    post_write(&p, p.ab, &src, 0, &grant, 0, LEN, 7, 1);
    /* the first header taken: the window of 16 packets the session
     * starts with holds a few of the chunk's 183 packets at most */
    drive(&p, b_chunk_under_way, NULL, WAIT_MS, "a chunk under way at b");
    struct cfx__dpdk_ep *b = cfx__dpdk_ep_of(p.ba);
    size_t landed = b->rx_off + (size_t)b->sess.asm_next * CFX_DPDK_MTU;
    cr_assert_lt(landed, (size_t)CFX_DPDK_CHUNK);
    p.ops->mr_revoke(dst.mr);

    struct ev *e = wait_ev(&p, 0, CFX_TP_COMP_WRITE, p.ab, WAIT_MS);
    cr_assert_eq(e->status, CFX_OK, "the writer's status %s", cfx_errname(e->status));
    cr_assert_null(find_ev(&p.s[1], CFX_TP_COMP_WRITE_IMM, p.ba), "WRITE_IMM reported");
    cr_assert_null(find_ev(&p.s[1], CFX_TP_COMP_EP_ERROR, p.ba), "the endpoint failed");
    for (size_t i = 0; i < landed; i++)
        cr_assert_eq(dst.buf[i], 0x11, "byte %zu, before the revoke, did not land", i);
    for (size_t i = landed; i < LEN; i++)
        cr_assert_eq(dst.buf[i], 0xAA, "byte %zu landed after the grant was revoked", i);
    cr_assert_geq(b->iface->n_late_dropped, 4);
    region_free(&p, &src);
    region_free(&p, &dst);
    pair_close(&p);
#endif
}

#ifdef CFX_HAVE_DPDK
static struct cfx__dpdk_port_stats port_stats(struct cfx_tp_iface *i)
{
    struct cfx__dpdk_port_stats st;
    cfx__dpdk_port_get_stats(container_of(i, struct cfx__dpdk_iface, super)->port, &st);
    return st;
}

/*
 * n SYNs from a's port to b's, each under a session id of its own that
 * no endpoint of a has (as forged ones are), taken by b.  Only b is
 * polled meanwhile: a polled answers keepalives (an endpoint silent for
 * CFX_DPDK_PING_MS pings), and on a loaded machine the SYNs take longer
 * than that.  A PONG would end the half-open state of b's endpoint of
 * the pair, and a's frames would be counted as SYNs taken.  So b has
 * taken them all once a's port has sent its whole batch (a flush may be
 * put off) and b's has taken every frame a's sent; the pair's
 * keepalive clocks are kept fresh (the field alone: no PING may count as
 * heard), so that neither side fails for the silence.  The ACCEPTs may
 * wait behind other completions (the failures of forged endpoints a
 * reset when they pinged it): b is polled until none is left.
 */
static void forged_syns(struct pair *p, uint32_t first, uint32_t n)
{
    struct cfx__dpdk_iface *a = container_of(p->s[0].iface, struct cfx__dpdk_iface, super);
    struct cfx__dpdk_iface *b = container_of(p->s[1].iface, struct cfx__dpdk_iface, super);
    for (uint32_t i = first; i < first + n; i++) {
        cfx__dpdk_ctl_send(a, &b->local, CFX_DPDK_CTL_SYN, 0x40000000u | i, 0, 99);
        if (i % 16 != 15 && i + 1 != first + n)
            continue;
        uint64_t deadline = cfx__deadline_ns(WAIT_MS);
        for (int got = 1;;) {
            /* a flush the gate put off (stats.gated) leaves the batch */
            uint64_t gated = port_stats(p->s[0].iface).gated;
            cfx__dpdk_port_flush(a->port);
            struct cfx__dpdk_port_stats sa = port_stats(p->s[0].iface);
            struct cfx__dpdk_port_stats sb = port_stats(p->s[1].iface);
            if (sa.gated == gated && sb.rx + sb.rx_refused + sb.rx_dropped >= sa.tx && !got)
                break; /* and a poll found no completion left to report */
            cr_assert(cfx__now_ns() < deadline, "timed out after %d ms waiting for b taking "
                      "the SYNs (%llu of %llu frames)", WAIT_MS,
                      (unsigned long long)sb.rx, (unsigned long long)sa.tx);
            cfx__dpdk_ep_of(p->ab)->heard = cfx__now_ns();
            cfx__dpdk_ep_of(p->ba)->heard = cfx__now_ns();
            got = poll_side(p->ops, &p->s[1]);
            if (!got)
                sched_yield();
        }
    }
}
#endif

/*
 * Every SYN made an endpoint with its session's rings (some 480 KB), kept
 * until its peer had been silent for 3 s: SYNs from addresses that never
 * answer took up to 65534 of them, 30 GB.  Endpoints accepted whose peer
 * has sent nothing on them yet are capped; a SYN past the cap is dropped
 * (its connector repeats it), and one gets in again as soon as an
 * endpoint hears from its peer.
 */
Test(dpdk_ep, connection_requests_past_the_half_open_cap_wait, .timeout = 60)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK");
#else
    struct pair p;
    pair_open(&p, &dpdk_param);
    pair_connect(&p); /* b's endpoint is half open: a sent nothing on it yet */
    struct cfx__dpdk_iface *b = container_of(p.s[1].iface, struct cfx__dpdk_iface, super);
    cr_assert_eq(b->half_open, 1);

    forged_syns(&p, 0, CFX_DPDK_HALF_OPEN_MAX + 16);
    cr_assert_eq(count_ev(&p.s[1], CFX_TP_COMP_ACCEPT, NULL), CFX_DPDK_HALF_OPEN_MAX,
                 "accepted %zu", count_ev(&p.s[1], CFX_TP_COMP_ACCEPT, NULL));
    cr_assert_eq(b->half_open, CFX_DPDK_HALF_OPEN_MAX);

    /* a speaks on its endpoint: b's is open whole, and one more SYN gets in */
    post_send(&p, p.ab, "x", 1, 1);
    wait_ev(&p, 1, CFX_TP_COMP_RECV, p.ba, WAIT_MS);
    cr_assert_eq(b->half_open, CFX_DPDK_HALF_OPEN_MAX - 1);
    forged_syns(&p, CFX_DPDK_HALF_OPEN_MAX + 16, 2);
    cr_assert_eq(count_ev(&p.s[1], CFX_TP_COMP_ACCEPT, NULL), CFX_DPDK_HALF_OPEN_MAX + 1);
    pair_close(&p);
#endif
}

/*
 * The length a write reports (WRITE_IMM) is what its chunks carried: a
 * last chunk whose header says another total than the chunks of its write
 * brought is a protocol breach, the endpoint fails and nothing is
 * reported.  The receiver used to report the total the peer wrote, whatever
 * had landed (tcp reports its frames, shm what it pulled).  a queues, in
 * its session, one write of 8 bytes whose header claims 4096.
 */
Test(dpdk_ep, a_write_reports_what_its_chunks_carried, .timeout = 60)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK");
#else
    struct pair p;
    struct region dst;
    struct cfx_tp_rdesc grant;
    struct cfx__dpdk_rkey k;
    pair_open(&p, &dpdk_param);
    pair_connect(&p);
    region_reg(&p, 1, &dst, 4096, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    int rc = p.ops->mr_grant(dst.mr, p.ba, &grant);
    cr_assert_eq(rc, CFX_OK, "mr_grant: %s", cfx_last_error());
    memcpy(&k, grant.data, sizeof(k));

    struct cfx__dpdk_ep *a = cfx__dpdk_ep_of(p.ab);
    struct cfx__dpdk_op_hdr h = {
        .type = CFX_DPDK_OP_WRITE, .flags = CFX_DPDK_OP_F_LAST, .imm = htole32(5),
        .key_idx = k.idx, .len = htole32(8), .total = htole32(4096), .key = k.key,
    };
    static const uint8_t bytes[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    uint64_t now = cfx__now_ns();
    cr_assert_eq(cfx__dpdk_sess_send(&a->sess, &h, sizeof(h), NULL, now), CFX_OK);
    cr_assert_eq(cfx__dpdk_sess_send(&a->sess, bytes, sizeof(bytes), NULL, now), CFX_OK);
    cfx__dpdk_port_flush(a->iface->port);

    struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    cr_assert_eq(e->status, CFX_ERR_PROTO, "EP_ERROR status %s", cfx_errname(e->status));
    cr_assert_null(find_ev(&p.s[1], CFX_TP_COMP_WRITE_IMM, p.ba), "WRITE_IMM reported");
    for (size_t i = 0; i < 4096; i++)
        cr_assert_eq(dst.buf[i], 0xAA, "byte %zu landed", i);
    region_free(&p, &dst);
    pair_close(&p);
#endif
}

#ifdef CFX_HAVE_DPDK
static struct cfx__dpdk_port *port_of(struct cfx_tp_iface *i)
{
    return container_of(i, struct cfx__dpdk_iface, super)->port;
}
#endif

/*
 * Closing an endpoint drops its writes without completions, and the engine
 * hands their sources back to their owner at once (a failed send's status
 * is set before the close, under the same lock).  With zero-copy transmit,
 * frames of those writes queued in the port's batch point into the
 * sources: the close must leave none there.  a's gate is shut (as when
 * EAL's interrupt thread is not held), so its write's frames wait in the
 * batch; a closes its endpoint, the owner reuses the source, and a's batch
 * goes.  The owner's new bytes are the old 16-bit words, each pair
 * swapped within its packet: the UDP checksum, summed when a frame was
 * built, cannot tell them apart.  b must get none of them: the close used
 * to flush only, which the gate put off, and the frames left in the batch
 * went later, read from the reused source, into b's granted window.
 */
Test(dpdk_ep, a_closed_endpoint_leaves_no_frame_of_its_writes, .timeout = 60)
{
#ifndef CFX_HAVE_DPDK
    cr_skip_test("built without DPDK");
#else
    enum { LEN = 6 * CFX_DPDK_MTU };
    _Static_assert(CFX_DPDK_MTU % 4 == 0, "word pairs within a packet");
    struct pair p;
    struct region src, dst;
    struct cfx_tp_rdesc grant;
    struct cfx__dpdk_port_stats st;
    pair_open(&p, &dpdk_param);
    pair_connect(&p);
    struct cfx__dpdk_port *a = port_of(p.s[0].iface);
    if (!cfx__dpdk_port_zc(a))
        cr_skip_test("no zero-copy transmit (CFX_DPDK_TX_ZC=0)");
    region_reg(&p, 0, &src, LEN, CFX_TP_ACCESS_LOCAL, 0);
    for (size_t i = 0; i < LEN; i++)
        src.buf[i] = (uint8_t)(i * 7 + i / 251 + 1);
    region_reg(&p, 1, &dst, LEN, CFX_TP_ACCESS_REMOTE_WRITE, 0xAA);
    int rc = p.ops->mr_grant(dst.mr, p.ba, &grant);
    cr_assert_eq(rc, CFX_OK, "mr_grant: %s", cfx_last_error());

    cfx__dpdk_port_test_gate_shut(a, true);
    cfx__dpdk_port_get_stats(a, &st);
    uint64_t zc_before = st.tx_zc;
    rc = p.ops->ep_write(p.ab, src.mr, 0, &grant, 0, LEN, 7, 1);
    cr_assert_eq(rc, CFX_OK, "ep_write: %s", cfx_errname(rc));
    cfx__dpdk_port_get_stats(a, &st);
    cr_assert_gt(st.tx_zc, zc_before, "no frame of the write went zero-copy");
    p.ops->ep_close(p.ab);
    p.ab = NULL;
    for (size_t i = 0; i < LEN; i += 4) { /* the owner's again */
        uint8_t w[2];
        memcpy(w, src.buf + i, 2);
        memcpy(src.buf + i, src.buf + i + 2, 2);
        memcpy(src.buf + i + 2, w, 2);
    }
    cfx__dpdk_port_test_gate_shut(a, false);
    /* the batch (the close's reset at least) goes once the gate is held */
    uint64_t deadline = cfx__deadline_ns(WAIT_MS);
    while (cfx__dpdk_port_flush(a) == 0) {
        cr_assert_lt(cfx__now_ns(), deadline, "a's batch did not go");
        sched_yield();
    }

    struct ev *e = wait_ev(&p, 1, CFX_TP_COMP_EP_ERROR, p.ba, WAIT_MS);
    cr_assert_eq(e->status, CFX_ERR_CLOSED, "EP_ERROR status %s", cfx_errname(e->status));
    for (size_t i = 0; i < LEN; i++)
        cr_assert_eq(dst.buf[i], 0xAA, "byte %zu landed (0x%02x) after the close", i,
                     dst.buf[i]);
    cr_assert_null(find_ev(&p.s[1], CFX_TP_COMP_WRITE_IMM, p.ba), "WRITE_IMM reported");
    region_free(&p, &src);
    region_free(&p, &dst);
    pair_close(&p);
#endif
}

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

/*
 * verbs transport: receive-credit and selective-signaling accounting
 * (dataplane/verbs/verbs_credit.h).  Pure logic: runs without a device.
 *
 * The module is compiled into this test directly: libconflux only carries
 * it when the verbs transport is built, and these rules are worth checking
 * in every build.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dataplane/common/util.h"
#include "dataplane/verbs/verbs_credit.c"

TestSuite(verbs_credit);

Test(verbs_credit, data_stops_at_the_reserve)
{
    struct cfx__verbs_fc fc;
    cfx__verbs_fc_init(&fc, 64, 64);
    cr_assert_eq(fc.tx_credits, 64);
    uint32_t sent = 0;
    while (cfx__verbs_fc_can_data(&fc)) {
        cfx__verbs_fc_consume(&fc);
        sent++;
    }
    cr_assert_eq(sent, 64 - fc.reserve, "data used %u credits", sent);
    /* The reserve is for credit messages. */
    cr_assert(cfx__verbs_fc_can_ctrl(&fc));
    for (uint32_t i = 0; i < fc.reserve; i++)
        cfx__verbs_fc_consume(&fc);
    cr_assert_not(cfx__verbs_fc_can_ctrl(&fc));
    cr_assert_not(cfx__verbs_fc_can_data(&fc));
}

Test(verbs_credit, grant_checks_overflow)
{
    struct cfx__verbs_fc fc;
    cfx__verbs_fc_init(&fc, 64, 32);
    cr_assert_not(cfx__verbs_fc_grant(&fc, 1, 32), "more credits than the peer has receives");
    cfx__verbs_fc_consume(&fc);
    cfx__verbs_fc_consume(&fc);
    cr_assert(cfx__verbs_fc_grant(&fc, 2, 32));
    cr_assert_eq(fc.tx_credits, 32);
    cr_assert_not(cfx__verbs_fc_grant(&fc, 100000, 32));
    cr_assert_eq(fc.tx_credits, 32, "a refused grant changes nothing");
}

Test(verbs_credit, owed_credits_threshold_take_untake)
{
    struct cfx__verbs_fc fc;
    cfx__verbs_fc_init(&fc, 64, 64);
    cr_assert_eq(fc.thresh, 16);
    cr_assert_gt(fc.thresh, 1, "credit messages must not answer each other one for one");
    cfx__verbs_fc_reposted(&fc, fc.thresh - 1);
    cr_assert_not(cfx__verbs_fc_need_msg(&fc));
    cfx__verbs_fc_reposted(&fc, 1);
    cr_assert(cfx__verbs_fc_need_msg(&fc));
    uint32_t n = cfx__verbs_fc_take(&fc, 10);
    cr_assert_eq(n, 10);
    cr_assert_eq(fc.rx_owed, fc.thresh - 10);
    cfx__verbs_fc_untake(&fc, n);
    cr_assert_eq(fc.rx_owed, fc.thresh);
    cr_assert_eq(cfx__verbs_fc_take(&fc, 0xffff), fc.thresh);
    cr_assert_eq(fc.rx_owed, 0);

    /* Tiny queues still have a threshold above one. */
    cfx__verbs_fc_init(&fc, 4, 4);
    cr_assert_geq(fc.thresh, 2);
}

Test(verbs_sq, first_and_every_nth_signaled)
{
    struct cfx__verbs_sq sq;
    cfx__verbs_sq_init(&sq, 256, 16);
    cr_assert(cfx__verbs_sq_post(&sq, false), "nothing outstanding: signal");
    int sig = 0;
    for (int i = 1; i < 64; i++)
        sig += cfx__verbs_sq_post(&sq, false);
    cr_assert_eq(sig, 3, "63 more WRs, every 16th signaled: %d", sig);
    cr_assert(cfx__verbs_sq_sig_outstanding(&sq));
    cr_assert_eq(cfx__verbs_sq_outstanding(&sq), 64);

    /* interval 1: everything signaled */
    cfx__verbs_sq_init(&sq, 16, 1);
    for (int i = 0; i < 10; i++)
        cr_assert(cfx__verbs_sq_post(&sq, false));
}

Test(verbs_sq, queue_never_fills_unsignaled)
{
    struct cfx__verbs_sq sq;
    cfx__verbs_sq_init(&sq, 16, 1000); /* interval larger than the queue */
    bool last_sig = false;
    int n = 0;
    while (cfx__verbs_sq_can_post(&sq)) {
        last_sig = cfx__verbs_sq_post(&sq, false);
        n++;
    }
    cr_assert_eq(n, 15, "ordinary posts stop one short of the depth (%d)", n);
    cr_assert(last_sig, "the WR taking the last ordinary slot is signaled");
    /* The last slot is still there for the no-op. */
    cr_assert_lt(cfx__verbs_sq_outstanding(&sq), sq.depth);
}

Test(verbs_sq, retire_and_nop)
{
    struct cfx__verbs_sq sq;
    cfx__verbs_sq_init(&sq, 64, 16);
    cr_assert(cfx__verbs_sq_post(&sq, false));      /* seq 0, signaled */
    cr_assert_not(cfx__verbs_sq_post(&sq, false));  /* seq 1 */
    cr_assert_not(cfx__verbs_sq_post(&sq, false));  /* seq 2 */
    cr_assert_not(cfx__verbs_sq_need_nop(&sq));
    cr_assert_eq(cfx__verbs_sq_retire(&sq, 0), 1);
    /* 1 and 2 are uncovered: a no-op must be posted to report them. */
    cr_assert(cfx__verbs_sq_need_nop(&sq));
    cr_assert(cfx__verbs_sq_post(&sq, true));       /* seq 3: the no-op */
    cr_assert_not(cfx__verbs_sq_need_nop(&sq));
    cr_assert_eq(cfx__verbs_sq_retire(&sq, 3), 3);
    cr_assert_eq(cfx__verbs_sq_outstanding(&sq), 0);
    cr_assert_not(cfx__verbs_sq_need_nop(&sq));
    /* A sequence outside the window retires nothing. */
    cr_assert_eq(cfx__verbs_sq_retire(&sq, 3), 0);
    cr_assert_eq(cfx__verbs_sq_retire(&sq, 100), 0);
}

Test(verbs_sq, unpost_restores)
{
    struct cfx__verbs_sq sq, saved;
    cfx__verbs_sq_init(&sq, 64, 16);
    cfx__verbs_sq_post(&sq, false);
    saved = sq;
    cfx__verbs_sq_post(&sq, false);
    cfx__verbs_sq_unpost(&sq, &saved);
    cr_assert_eq(memcmp(&sq, &saved, sizeof(sq)), 0);
}

Test(verbs_sq, sequence_wraps)
{
    struct cfx__verbs_sq sq;
    cfx__verbs_sq_init(&sq, 64, 4);
    sq.posted = sq.retired = UINT32_MAX - 5;
    uint32_t first = sq.posted, last_sig = 0;
    for (int i = 0; i < 20; i++) {
        uint32_t seq = sq.posted;
        if (cfx__verbs_sq_post(&sq, false))
            last_sig = seq;
    }
    cr_assert_eq(cfx__verbs_sq_outstanding(&sq), 20);
    cr_assert_eq(cfx__verbs_sq_retire(&sq, last_sig), last_sig - first + 1);
    cr_assert(sq.posted < first, "wrapped");
}

/*
 * Model of one direction of an RC connection with random scheduling: the
 * sender posts data when it holds a credit and a send slot, the "NIC"
 * delivers messages in order only into posted receives (asserting no RNR),
 * the receiver's user holds delivered buffers for a while before they are
 * re-posted, credits go back piggybacked on the receiver's own data or by
 * credit messages, and only signaled WRs produce CQEs.  Everything must
 * arrive, and both send queues must drain.
 */
struct side {
    struct cfx__verbs_fc fc;
    struct cfx__verbs_sq sq;
    uint32_t rx_posted;     /* receives posted for the peer */
    uint32_t held;          /* delivered buffers the user still holds */
    uint32_t sent, delivered;
    uint32_t sig_seq[4096]; /* signaled WRs in flight (CQE order) */
    uint32_t nsig, sig_head;
};

struct msg {
    uint8_t from;
    bool data;
    uint32_t credits;
};

#define RQ 16
#define SQD 32
#define TOTAL 20000

static struct msg wire[2 * (RQ + 8)];
static uint32_t wire_n;

static void post(struct side *s, int me, bool data)
{
    uint32_t seq = s->sq.posted;
    uint32_t credits = cfx__verbs_fc_take(&s->fc, 0xffff);
    if (cfx__verbs_sq_post(&s->sq, false))
        s->sig_seq[s->nsig++ % 4096] = seq;
    cfx__verbs_fc_consume(&s->fc);
    cr_assert_lt(wire_n, CFX_ARRAY_SIZE(wire));
    wire[wire_n++] = (struct msg){ (uint8_t)me, data, credits };
}

Test(verbs_credit, two_sided_model_no_rnr_no_deadlock)
{
    struct side s[2];
    srand(1234);
    memset(s, 0, sizeof(s));
    for (int i = 0; i < 2; i++) {
        cfx__verbs_fc_init(&s[i].fc, RQ, RQ);
        cfx__verbs_sq_init(&s[i].sq, SQD, 4);
        s[i].rx_posted = RQ;
    }
    wire_n = 0;
    uint64_t steps = 0;
    while ((s[0].delivered < TOTAL || s[1].delivered < TOTAL) && steps < 10000000) {
        steps++;
        int me = rand() % 2, peer = !me;
        struct side *a = &s[me], *b = &s[peer];
        switch (rand() % 5) {
        case 0: /* post data */
            if (a->sent < TOTAL && cfx__verbs_fc_can_data(&a->fc) &&
                cfx__verbs_sq_can_post(&a->sq)) {
                post(a, me, true);
                a->sent++;
            }
            break;
        case 1: /* the NIC delivers the oldest message on the wire */
            if (wire_n) {
                struct msg m = wire[0];
                memmove(wire, wire + 1, (wire_n - 1) * sizeof(*wire));
                wire_n--;
                struct side *dst = &s[!m.from];
                cr_assert_gt(dst->rx_posted, 0, "RNR: a message found no receive");
                dst->rx_posted--;
                if (m.credits)
                    cr_assert(cfx__verbs_fc_grant(&dst->fc, m.credits, RQ));
                if (m.data) {
                    dst->delivered++;
                    dst->held++;
                } else {
                    dst->rx_posted++; /* credit message: re-posted at once */
                    cfx__verbs_fc_reposted(&dst->fc, 1);
                }
            }
            break;
        case 2: /* the user lets go of what it holds: re-post */
            a->rx_posted += a->held;
            cfx__verbs_fc_reposted(&a->fc, a->held);
            a->held = 0;
            break;
        case 3: /* progress: credit message and no-op when due */
            if (cfx__verbs_fc_need_msg(&a->fc) && cfx__verbs_fc_can_ctrl(&a->fc) &&
                cfx__verbs_sq_can_post(&a->sq))
                post(a, me, false);
            if (cfx__verbs_sq_need_nop(&a->sq) && cfx__verbs_sq_outstanding(&a->sq) < SQD) {
                uint32_t seq = a->sq.posted;
                cr_assert(cfx__verbs_sq_post(&a->sq, true));
                a->sig_seq[a->nsig++ % 4096] = seq;
            }
            break;
        case 4: /* a signaled CQE (in order) */
            if (a->sig_head != a->nsig)
                cfx__verbs_sq_retire(&a->sq, a->sig_seq[a->sig_head++ % 4096]);
            break;
        }
        for (int i = 0; i < 2; i++)
            cr_assert_leq(cfx__verbs_sq_outstanding(&s[i].sq), SQD, "send queue overflow");
        (void)b;
    }
    cr_assert_eq(s[0].delivered, TOTAL, "deadlock: %u of %u delivered to 0", s[0].delivered, TOTAL);
    cr_assert_eq(s[1].delivered, TOTAL, "deadlock: %u of %u delivered to 1", s[1].delivered, TOTAL);
}

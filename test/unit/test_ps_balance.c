/*
 * Load distribution (ps_balance.c): stragglers lose blocks in proportion to
 * their measured capacity, every active server keeps an exploration share,
 * a recovered server wins its blocks back, small gains are ignored, and the
 * blocks of draining servers always move.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "dataplane/ps/ps_int.h"

#define NB 40

static struct cfx_ps_balance knobs;
static uint64_t bytes[NB];
static uint16_t owner[NB];
static uint32_t state[4];
static double npb[4];

static void setup(void)
{
    cfx__ps_balance_defaults(&knobs);
    for (int i = 0; i < NB; i++) {
        bytes[i] = 1000;
        owner[i] = (uint16_t)(i % 2);
    }
    for (int s = 0; s < 4; s++) {
        state[s] = s < 2 ? CFX_PS_SERVER_ACTIVE : CFX_PS_SERVER_STANDBY;
        npb[s] = 1.0;
    }
}

TestSuite(ps_balance, .init = setup);

static struct ps_balance_out run(uint32_t nservers, bool force)
{
    struct ps_balance_in in = {
        .nservers = nservers,
        .state = state,
        .ns_per_byte = npb,
        .nblocks = NB,
        .bytes = bytes,
        .movable = NULL,
        .knobs = &knobs,
        .force = force,
    };
    struct ps_balance_out out;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    return out;
}

static uint32_t count(uint16_t s)
{
    uint32_t n = 0;
    for (int i = 0; i < NB; i++)
        n += owner[i] == s;
    return n;
}

Test(ps_balance, balanced_stays_put)
{
    struct ps_balance_out o = run(2, false);
    cr_assert_eq(o.moves, 0);
    cr_assert_eq(o.stragglers, 0);
    cr_assert_eq(count(0), 20);
}

Test(ps_balance, straggler_loses_blocks_in_proportion)
{
    npb[1] = 4.0; /* server 1 is 4x slower: it should keep ~1/5 of the bytes */
    struct ps_balance_out o = run(2, false);
    cr_assert_eq(o.stragglers, 2u, "server 1 flagged");
    cr_assert_gt(o.moves, 0);
    cr_assert(count(1) == 8, "server 1 keeps %u blocks, want 8", count(1));
    cr_assert_lt(o.new_max, o.cur_max * 0.7);
    /* predicted times are within one block of each other */
    double t0 = count(0) * 1000.0 * 1.0, t1 = count(1) * 1000.0 * 4.0;
    cr_assert_leq(t0 > t1 ? t0 - t1 : t1 - t0, 4000.0 + 1e-9);
}

Test(ps_balance, exploration_share_and_recovery)
{
    npb[1] = 1000.0; /* nearly dead: keeps only the exploration floor */
    run(2, false);
    uint32_t floor = (uint32_t)(knobs.explore * NB / 2 + 0.999);
    cr_assert_eq(count(1), floor < 1 ? 1 : floor, "server 1 keeps %u blocks", count(1));
    /* it recovers: measured as fast as server 0 again */
    npb[1] = 1.0;
    struct ps_balance_out o = run(2, false);
    cr_assert_gt(o.moves, 0);
    cr_assert_eq(count(1), 20, "the recovered server wins its blocks back (has %u)", count(1));
}

Test(ps_balance, hysteresis_ignores_small_gains)
{
    npb[1] = 1.2; /* 20% slower: the best split gains ~9%, under min_gain */
    struct ps_balance_out o = run(2, false);
    cr_assert_eq(o.moves, 0);
    cr_assert_eq(count(1), 20);
    /* forced (admin rebalance) takes it anyway */
    o = run(2, true);
    cr_assert_gt(o.moves, 0);
    cr_assert_lt(count(1), 20);
}

Test(ps_balance, draining_server_empties)
{
    state[1] = CFX_PS_SERVER_DRAINING;
    state[2] = CFX_PS_SERVER_ACTIVE; /* a new server: unknown speed counts as the median */
    npb[2] = 0;
    struct ps_balance_out o = run(3, false);
    cr_assert_eq(count(1), 0);
    cr_assert_eq(count(0) + count(2), NB);
    cr_assert_eq(count(0), 20);
    cr_assert_eq(count(2), 20);
    cr_assert_geq(o.moves, 20);
}

Test(ps_balance, added_server_takes_a_share)
{
    state[2] = CFX_PS_SERVER_ACTIVE;
    npb[2] = 0;
    run(3, true);
    cr_assert(count(2) >= 13 && count(2) <= 14, "new server got %u blocks", count(2));
}

Test(ps_balance, pinned_blocks_stay)
{
    uint8_t movable[NB];
    memset(movable, 0, sizeof(movable));
    npb[1] = 10;
    struct ps_balance_in in = {
        .nservers = 2,
        .state = state,
        .ns_per_byte = npb,
        .nblocks = NB,
        .bytes = bytes,
        .movable = movable,
        .knobs = &knobs,
    };
    struct ps_balance_out out;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    cr_assert_eq(out.moves, 0);
}

Test(ps_balance, no_active_server)
{
    state[0] = state[1] = CFX_PS_SERVER_DRAINING;
    struct ps_balance_in in = {
        .nservers = 2,
        .state = state,
        .ns_per_byte = npb,
        .nblocks = NB,
        .bytes = bytes,
        .knobs = &knobs,
    };
    struct ps_balance_out out;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_ERR_INVALID);
}

Test(ps_balance, unequal_blocks)
{
    for (int i = 0; i < NB; i++)
        bytes[i] = (uint64_t)(i + 1) * 100;
    npb[1] = 2.0;
    run(2, true);
    double l0 = 0, l1 = 0;
    for (int i = 0; i < NB; i++)
        *(owner[i] ? &l1 : &l0) += (double)bytes[i];
    /* server 1 holds about a third of the bytes */
    double share = l1 / (l0 + l1);
    cr_assert(share > 0.28 && share < 0.39, "share %.3f", share);
}

/* A server whose mailbox failed (gone) takes no block: the state handed to
 * it would be lost with it.  A forced decision (another server drained, an
 * admin rebalance) gave a healthy server's blocks to a dead one, whose fast
 * measurement made it the best destination, and so lost their values; a
 * gone standby server admitted got its share the same way.  Its own blocks
 * stay where the workers hear it is gone. */
Test(ps_balance, gone_server_takes_no_block)
{
    uint8_t gone[4] = { 0, 0, 1, 1 };
    for (int i = 0; i < NB; i++)
        owner[i] = (uint16_t)(i % 3);
    state[1] = CFX_PS_SERVER_DRAINING;
    state[2] = state[3] = CFX_PS_SERVER_ACTIVE;
    npb[2] = npb[3] = 0.01; /* measured fastest before they went */
    struct ps_balance_in in = {
        .nservers = 4,
        .state = state,
        .ns_per_byte = npb,
        .nblocks = NB,
        .bytes = bytes,
        .gone = gone,
        .knobs = &knobs,
        .force = true,
    };
    struct ps_balance_out out;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    cr_assert_eq(count(1), 0, "the drained server kept %u blocks", count(1));
    cr_assert_eq(count(2), 13, "the gone server owns %u blocks, not its 13", count(2));
    cr_assert_eq(count(3), 0, "the gone standby server got %u blocks", count(3));
    cr_assert_eq(count(0), NB - 13);
    cr_assert_eq(out.moves, 13);
}

/* A server the map names FAILED keeps its blocks (their states went with
 * it: moved, they would come without values) and takes none, also with no
 * gone[] record (a decision from a map alone); removed, the scheduler
 * passes it as DRAINING and its blocks move.  Before, a FAILED server was
 * one that is not active: its blocks moved at every decision. */
Test(ps_balance, failed_server_keeps_its_blocks_and_takes_none)
{
    for (int i = 0; i < NB; i++)
        owner[i] = (uint16_t)(i % 3);
    state[2] = CFX_PS_SERVER_FAILED;
    npb[2] = 0.01; /* measured fastest before it went */
    struct ps_balance_out out = run(3, true);
    cr_assert_eq(count(2), 13, "the failed server owns %u blocks, not its 13", count(2));
    cr_assert_eq(count(0) + count(1), NB - 13);
    cr_assert_eq(out.moves, 0, "%u blocks moved", out.moves);
    state[2] = CFX_PS_SERVER_DRAINING; /* removed */
    out = run(3, true);
    cr_assert_eq(count(2), 0, "the removed failed server kept %u blocks", count(2));
    cr_assert_eq(out.moves, 13);
}

/* Survivors 0 and 1 own 11 and 9 blocks, failed server 2 its 20.  The best
 * split of the survivors' blocks (10/10) gains 9%, under min_gain: nothing
 * moves.  Before, the failed server's blocks counted in the step's
 * predicted time (20 000 ns, though nobody serves them) and let any small
 * gain pass: a block moved. */
Test(ps_balance, failed_servers_blocks_are_out_of_the_measurement)
{
    for (int i = 0; i < NB; i++)
        owner[i] = (uint16_t)(i < 11 ? 0 : i < 20 ? 1 : 2);
    state[2] = CFX_PS_SERVER_FAILED;
    struct ps_balance_out out = run(3, false);
    cr_assert_eq(out.moves, 0, "%u blocks moved for a 9%% gain", out.moves);
    cr_assert_eq(out.cur_max, 11000.0, "predicted step %.0f ns, want server 0's 11000",
                 out.cur_max);
    cr_assert_eq(count(0), 11);
    cr_assert_eq(count(1), 9);
    cr_assert_eq(count(2), 20);
}

/* Server 1 is 4x slower than server 0; failed server 2 was measured slower
 * still (5 ns/B) before it went.  Among the survivors (median 2.5) server
 * 1 is a straggler and keeps a fifth of their bytes; the failed server's
 * stale time made the median 4 and hid it (not flagged).  Server 2 keeps
 * its 20 blocks. */
Test(ps_balance, straggler_among_survivors_of_a_failed_server)
{
    for (int i = 0; i < NB; i++)
        owner[i] = (uint16_t)(i < 10 ? 0 : i < 20 ? 1 : 2);
    state[2] = CFX_PS_SERVER_FAILED;
    npb[1] = 4.0;
    npb[2] = 5.0;
    struct ps_balance_out out = run(3, false);
    cr_assert_eq(out.stragglers, 2u, "stragglers 0x%llx, want server 1 (0x2)",
                 (unsigned long long)out.stragglers);
    cr_assert_eq(out.cur_max, 40000.0, "predicted step %.0f ns, want server 1's 40000",
                 out.cur_max);
    cr_assert_eq(count(1), 4, "server 1 keeps %u blocks, want 4", count(1));
    cr_assert_eq(count(0), 16);
    cr_assert_eq(count(2), 20);
    cr_assert_eq(out.moves, 6);
}

/* What a decision waits for: traffic to every server that owns blocks and
 * serves them.  A failed server (by its state, or by the scheduler's gone[]
 * record alone) never gets any: waiting for it held every later decision.
 * A draining one still serves its blocks until they moved: waited for. */
Test(ps_balance, decision_waits_for_no_failed_server)
{
    uint16_t own[20];
    for (int i = 0; i < 20; i++)
        own[i] = (uint16_t)(i / 5); /* 5 blocks each */
    double measured[4] = { 100, 100, 0, 0 };
    uint8_t gone[4] = { 0, 0, 0, 1 };
    state[2] = CFX_PS_SERVER_FAILED;
    state[3] = CFX_PS_SERVER_ACTIVE;
    struct ps_balance_in in = { .nservers = 4, .state = state, .gone = gone, .nblocks = 20 };
    cr_assert_eq(cfx__ps_balance_unmeasured(&in, own, measured), -1);
    state[2] = CFX_PS_SERVER_DRAINING;
    cr_assert_eq(cfx__ps_balance_unmeasured(&in, own, measured), 2);
    for (int i = 10; i < 15; i++)
        own[i] = 0; /* drained: nothing to measure */
    cr_assert_eq(cfx__ps_balance_unmeasured(&in, own, measured), -1);
    measured[1] = 0; /* a live active owner not measured yet */
    cr_assert_eq(cfx__ps_balance_unmeasured(&in, own, measured), 1);
    cr_assert(!cfx__ps_balance_serves(CFX_PS_SERVER_FAILED, false));
    cr_assert(!cfx__ps_balance_serves(CFX_PS_SERVER_ACTIVE, true));
    cr_assert(cfx__ps_balance_serves(CFX_PS_SERVER_DRAINING, false));
}

/* Failed server 3 was removed and its blocks moved to live server 2 with
 * their values lost (the map marks them): every request for them fails,
 * and failed requests are not measured, so server 2, which owns nothing
 * else, never is.  A decision waits for no traffic to it; before, it waited
 * for ever and automatic balancing stopped.  One block that is served on
 * server 2 is waited for again. */
Test(ps_balance, lost_blocks_hold_no_decision)
{
    uint16_t own[20];
    uint8_t lost[20] = { 0 };
    for (int i = 0; i < 20; i++)
        own[i] = (uint16_t)(i / 5);
    for (int i = 10; i < 20; i++) {
        own[i] = 2; /* server 3's 5 blocks went to server 2 */
        lost[i] = i >= 15 ? 4 : 0;
    }
    for (int i = 10; i < 15; i++)
        own[i] = (uint16_t)(i % 2); /* server 2's own blocks went elsewhere */
    double measured[4] = { 100, 100, 0, 0 };
    state[2] = CFX_PS_SERVER_ACTIVE;
    state[3] = CFX_PS_SERVER_FAILED;
    struct ps_balance_in in = { .nservers = 4, .state = state, .nblocks = 20, .lost = lost };
    int s = cfx__ps_balance_unmeasured(&in, own, measured);
    cr_assert_eq(s, -1, "a decision waits for server %d, which owns only lost blocks", s);
    lost[15] = 0; /* one of them served */
    cr_assert_eq(cfx__ps_balance_unmeasured(&in, own, measured), 2);
}

/* Survivors 0 and 1 own 11 and 9 blocks that are served; server 1 also
 * owns 20 blocks whose values were lost with failed server 2 (removed).
 * Nobody serves those: they take no time in the prediction, and the best
 * split of the served ones (10/10) gains 9%, under min_gain: nothing moves.
 * Before, they counted in server 1's predicted time (29 000 ns): blocks
 * moved to server 0, lost ones among them.  Drained, server 1's lost
 * blocks move off it with the rest. */
Test(ps_balance, lost_blocks_are_out_of_the_prediction)
{
    uint8_t lost[NB] = { 0 };
    for (int i = 0; i < NB; i++) {
        owner[i] = (uint16_t)(i < 11 ? 0 : 1);
        lost[i] = i >= 20 ? 3 : 0;
    }
    state[2] = CFX_PS_SERVER_FAILED;
    struct ps_balance_in in = {
        .nservers = 3,
        .state = state,
        .ns_per_byte = npb,
        .nblocks = NB,
        .bytes = bytes,
        .lost = lost,
        .knobs = &knobs,
    };
    struct ps_balance_out out;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    cr_assert_eq(out.moves, 0, "%u blocks moved for a 9%% gain", out.moves);
    cr_assert_eq(out.cur_max, 11000.0, "predicted step %.0f ns, want server 0's 11000",
                 out.cur_max);
    cr_assert_eq(count(0), 11);
    cr_assert_eq(count(1), 29);
    /* forced (an admin rebalance): the served blocks split 10/10, and no
     * lost block moves (its move is a hand-over of nothing) */
    in.force = true;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    cr_assert_eq(out.moves, 1, "%u blocks moved, want 1", out.moves);
    for (int i = 20; i < NB; i++)
        cr_assert_eq(owner[i], 1, "lost block %d moved to server %u", i, owner[i]);
    state[1] = CFX_PS_SERVER_DRAINING;
    in.force = false;
    cr_assert_eq(cfx__ps_balance(&in, owner, &out), CFX_OK);
    cr_assert_eq(count(1), 0, "drained server 1 kept %u blocks", count(1));
    cr_assert_eq(out.moves, 30);
}

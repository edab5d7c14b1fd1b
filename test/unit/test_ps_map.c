/*
 * Shard-map math: block splitting, initial assignment, the wire form and
 * its validation.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/ps/ps_int.h"

static struct ps_map m;

static void setup(void)
{
    cfx__ps_map_init(&m);
    m.conf.block_size = 4096;
    m.nworkers = 2;
    m.worker_node[0] = 11;
    m.worker_node[1] = 12;
    m.nservers = 3;
    for (uint32_t s = 0; s < 3; s++) {
        m.server[s].node_id = 20 + s;
        m.server[s].state = CFX_PS_SERVER_ACTIVE;
    }
}

static void teardown(void)
{
    cfx__ps_map_free(&m);
}

TestSuite(ps_map, .init = setup, .fini = teardown);

Test(ps_map, blocks_tile_tensors)
{
    /* 4096-byte blocks: 1024 floats, 512 doubles */
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 2500, NULL), 0);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "b", CFX_DTYPE_F64, 512, NULL), 1);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "c", CFX_DTYPE_U8, 1, NULL), 2);
    cr_assert_eq(m.nblocks, 3 + 1 + 1);
    uint32_t t;
    uint64_t off, n;
    cr_assert_eq(cfx__ps_map_block(&m, 2, &t, &off, &n), CFX_OK);
    cr_assert(t == 0 && off == 2048 && n == 452, "last block of a: t %u off %lu n %lu", t,
              (unsigned long)off, (unsigned long)n);
    cr_assert_eq(cfx__ps_map_block(&m, 3, &t, &off, &n), CFX_OK);
    cr_assert(t == 1 && off == 0 && n == 512);
    cr_assert_eq(cfx__ps_map_block(&m, 4, &t, &off, &n), CFX_OK);
    cr_assert(t == 2 && off == 0 && n == 1);
    cr_assert_eq(cfx__ps_map_block(&m, 5, &t, &off, &n), CFX_ERR_INVALID);
    cr_assert_eq(cfx__ps_map_block_bytes(&m, 2), 452 * 4);
    cr_assert_eq(cfx__ps_map_find(&m, "b"), 1);
    cr_assert_eq(cfx__ps_map_find(&m, "zz"), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 1, NULL), CFX_ERR_EXISTS);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "", CFX_DTYPE_F32, 1, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "z", CFX_DTYPE_F32, 0, NULL), CFX_ERR_INVALID);
}

Test(ps_map, initial_assignment_balances_bytes_over_active_servers)
{
    m.server[1].state = CFX_PS_SERVER_STANDBY;
    cr_assert_geq(cfx__ps_map_add_tensor(&m, "w", CFX_DTYPE_F32, 1024 * 10, NULL), 0);
    uint32_t nb[3];
    uint64_t by[3];
    for (uint32_t s = 0; s < 3; s++)
        cfx__ps_map_load(&m, s, &nb[s], &by[s]);
    cr_assert_eq(nb[1], 0, "a standby server gets no blocks");
    cr_assert_eq(nb[0] + nb[2], 10);
    cr_assert_eq(nb[0], 5);
    cr_assert_eq(by[0], by[2]);
}

/* A server the scheduler has seen go (its mailbox failed, its node died)
 * takes no block of a tensor registered after: the block would never be
 * initialized, and the tensor never ready.  With every active server gone
 * the tensor is refused, CFX_ERR_PEER_FAILED. */
Test(ps_map, a_gone_server_gets_no_new_block)
{
    uint8_t gone[3] = { 0, 1, 0 };
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "w", CFX_DTYPE_F32, 1024 * 10, gone), 0);
    uint32_t nb[3];
    uint64_t by[3];
    for (uint32_t s = 0; s < 3; s++)
        cfx__ps_map_load(&m, s, &nb[s], &by[s]);
    cr_assert_eq(nb[1], 0, "gone server 1 got %u blocks", nb[1]);
    cr_assert(nb[0] == 5 && nb[2] == 5 && by[0] == by[2], "blocks %u and %u", nb[0], nb[2]);
    /* the least loaded is the gone one now: it still gets none */
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "v", CFX_DTYPE_F32, 1024 * 4, gone), 1);
    cfx__ps_map_load(&m, 1, &nb[1], NULL);
    cr_assert_eq(nb[1], 0, "gone server 1 got %u blocks", nb[1]);
    /* a standby server is no live one to fall back on */
    m.server[2].state = CFX_PS_SERVER_STANDBY;
    gone[0] = 1;
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "u", CFX_DTYPE_F32, 1, gone), CFX_ERR_PEER_FAILED);
    cr_assert_eq(m.ntensors, 2);
    cr_assert_eq(m.nblocks, 14);
}

Test(ps_map, encode_decode_round_trip)
{
    m.version = 7;
    m.flags = PS_MAP_SHUTDOWN;
    m.admin_next = 3;
    m.conf.consistency = CFX_PS_SSP;
    m.conf.staleness = 2;
    m.conf.optim.type = CFX_PS_OPT_ADAM;
    m.conf.optim.lr = 0.125;
    m.server[2].ns_per_byte = 3.5;
    cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 5000, NULL);
    cfx__ps_map_add_tensor(&m, "b", CFX_DTYPE_I64, 77, NULL);
    m.tensors[0].ready = 1;
    uint8_t buf[PS_MAP_MAX];
    int len = cfx__ps_map_encode(&m, buf, sizeof(buf));
    cr_assert_gt(len, 0);
    struct ps_map d;
    cfx__ps_map_init(&d);
    cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_OK);
    cr_assert(d.version == 7 && d.flags == PS_MAP_SHUTDOWN && d.admin_next == 3);
    cr_assert(d.conf.consistency == CFX_PS_SSP && d.conf.staleness == 2 &&
              d.conf.optim.type == CFX_PS_OPT_ADAM && d.conf.optim.lr == 0.125);
    cr_assert(d.nworkers == 2 && d.worker_node[1] == 12);
    cr_assert(d.nservers == 3 && d.server[2].ns_per_byte == 3.5 && d.server[1].node_id == 21);
    cr_assert(d.ntensors == 2 && d.tensors[0].ready == 1 && !strcmp(d.tensors[1].name, "b"));
    cr_assert_eq(d.nblocks, m.nblocks);
    cr_assert_eq(memcmp(d.owner, m.owner, m.nblocks * sizeof(*m.owner)), 0);

    /* every truncation is refused, never read past */
    for (int cut = 0; cut < len; cut += 7)
        cr_assert_eq(cfx__ps_map_decode(buf, (size_t)cut, &d), CFX_ERR_PROTO, "cut %d", cut);
    /* an owner out of range */
    m.owner[0] = 9;
    len = cfx__ps_map_encode(&m, buf, sizeof(buf));
    cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_ERR_PROTO);
    /* too small a buffer */
    cr_assert_eq(cfx__ps_map_encode(&m, buf, 16), CFX_ERR_TOO_BIG);
    cfx__ps_map_free(&d);
}

/* A server the map names FAILED travels as such and takes no block of a
 * tensor registered after (no gone[] record needed); a state this build
 * does not know (0, or past FAILED: a newer peer's) is refused with
 * CFX_ERR_PROTO naming the server, its node and the state, never indexed
 * into a reader's table of names. */
Test(ps_map, failed_state_travels_and_unknown_ones_are_refused)
{
    m.server[1].state = CFX_PS_SERVER_FAILED;
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 1024 * 4, NULL), 0);
    uint32_t nb = 0;
    cfx__ps_map_load(&m, 1, &nb, NULL);
    cr_assert_eq(nb, 0, "failed server 1 got %u blocks", nb);
    static uint8_t buf[PS_MAP_MAX];
    int len = cfx__ps_map_encode(&m, buf, sizeof(buf));
    cr_assert_gt(len, 0);
    struct ps_map d;
    cfx__ps_map_init(&d);
    cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(d.server[1].state, CFX_PS_SERVER_FAILED);
    struct cfx_ps_stats st;
    memset(&st, 0, sizeof(st));
    cfx__ps_map_stats(&d, &st);
    cr_assert_eq(st.servers[1].state, CFX_PS_SERVER_FAILED);
    static const uint32_t bad[] = { 0, CFX_PS_SERVER_FAILED + 1, 0xFFFFFFFFu };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        m.server[2].state = bad[i];
        len = cfx__ps_map_encode(&m, buf, sizeof(buf));
        cr_assert_gt(len, 0);
        cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_ERR_PROTO, "state %u",
                     bad[i]);
        char want[128];
        snprintf(want, sizeof(want), "server 2 (node 22) is in state %u, which this build "
                 "does not know (1..5)", bad[i]);
        cr_assert_str_eq(cfx_last_error(), want);
    }
    cr_assert_eq(d.server[1].state, CFX_PS_SERVER_FAILED, "a refused map changed the output");
    cfx__ps_map_free(&d);
}

/* A block whose values were lost with a failed server carries the mark in
 * the map (the high byte of its owner word): it travels, is copied, and
 * stays with the block when tensors are added.  A mark that names a server
 * not in the job, one that has not failed or the block's own owner is
 * refused naming the block and the server. */
Test(ps_map, lost_marks_travel_and_are_checked)
{
    m.server[2].state = CFX_PS_SERVER_FAILED;
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 1024 * 4, NULL), 0);
    m.lost = calloc(m.nblocks, 1);
    cr_assert(m.lost);
    m.lost[1] = 3; /* lost with server 2 */
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "b", CFX_DTYPE_F32, 1024 * 2, NULL), 1);
    cr_assert_eq(m.nblocks, 6);
    static uint8_t buf[PS_MAP_MAX];
    int len = cfx__ps_map_encode(&m, buf, sizeof(buf));
    cr_assert_gt(len, 0);
    struct ps_map d, c;
    cfx__ps_map_init(&d);
    cfx__ps_map_init(&c);
    cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ps_map_copy(&c, &d), CFX_OK);
    for (uint32_t b = 0; b < 6; b++) {
        cr_assert_eq(d.owner[b], m.owner[b], "block %u: owner %u, want %u", b, d.owner[b],
                     m.owner[b]);
        cr_assert_eq(cfx__ps_map_lost(&d, b), b == 1 ? 3u : 0u, "block %u", b);
        cr_assert_eq(cfx__ps_map_lost(&c, b), b == 1 ? 3u : 0u, "copied block %u", b);
    }
    cfx__ps_map_free(&c);
    static const struct {
        uint8_t mark;
        uint16_t owner;
        const char *want;
    } bad[] = {
        { 2, 0, "block 1 is marked lost with server 1, which has not failed" },
        { 9, 0, "block 1 is marked lost with server 8, which is not in the job" },
        { 3, 2, "block 1 is marked lost with server 2, which owns it" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        m.lost[1] = bad[i].mark;
        m.owner[1] = bad[i].owner;
        len = cfx__ps_map_encode(&m, buf, sizeof(buf));
        cr_assert_gt(len, 0);
        cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_ERR_PROTO, "mark %u",
                     bad[i].mark);
        cr_assert_str_eq(cfx_last_error(), bad[i].want);
    }
    cr_assert_eq(cfx__ps_map_lost(&d, 1), 3u, "a refused map changed the output");
    cfx__ps_map_free(&d);
}

Test(ps_map, copy_is_deep)
{
    cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 3000, NULL);
    struct ps_map c;
    cfx__ps_map_init(&c);
    cr_assert_eq(cfx__ps_map_copy(&c, &m), CFX_OK);
    c.owner[0] = 2;
    c.tensors[0].ready = 1;
    cr_assert_neq(m.owner[0], 2u == m.owner[0] ? 99 : 2);
    cr_assert_eq(m.tensors[0].ready, 0);
    cfx__ps_map_free(&c);
}

Test(ps_map, stats)
{
    cfx__ps_map_add_tensor(&m, "a", CFX_DTYPE_F32, 1024 * 6, NULL);
    m.version = 4;
    struct cfx_ps_stats st;
    memset(&st, 0, sizeof(st));
    cfx__ps_map_stats(&m, &st);
    cr_assert(st.map_version == 4 && st.nservers == 3 && st.nblocks == 6 && st.ntensors == 1);
    cr_assert(st.servers[0].blocks == 2 && st.servers[1].blocks == 2 && st.servers[2].blocks == 2);
    cr_assert_eq(st.servers[1].bytes, 8192);
}

/* Sizes whose bytes or blocks do not fit a number are refused, never
 * wrapped into a tensor of 0 blocks that then does nothing. */
Test(ps_map, sizes_that_do_not_fit_are_refused)
{
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "x", CFX_DTYPE_F32, SIZE_MAX, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "x", CFX_DTYPE_F32, UINT64_MAX - 5, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "x", CFX_DTYPE_F32, UINT64_MAX / 4, NULL),
                 CFX_ERR_NO_RESOURCE);
    /* one block past the map's limit (1024 floats a block) */
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "x", CFX_DTYPE_F32,
                                        (uint64_t)PS_MAX_BLOCKS * 1024 + 1, NULL),
                 CFX_ERR_NO_RESOURCE);
    cr_assert_geq(cfx__ps_map_add_tensor(&m, "x", CFX_DTYPE_F32, (uint64_t)PS_MAX_BLOCKS * 1024,
                                         NULL), 0);
    cr_assert_eq(m.nblocks, PS_MAX_BLOCKS);
    cr_assert_eq(cfx__ps_map_add_tensor(&m, "y", CFX_DTYPE_F32, 1, NULL), CFX_ERR_NO_RESOURCE);
    cr_assert_eq(m.ntensors, 1);
}

/* A map whose tensors' block counts add up past 2^32 to the map's count
 * (a wrapped sum) is refused: a push of such a tensor would allocate a
 * request record for each of 2^32 - 1 blocks. */
Test(ps_map, block_counts_that_wrap_are_refused)
{
    struct ps_tensor t[2];
    memset(t, 0, sizeof(t));
    strcpy(t[0].name, "a");
    t[0].dtype = CFX_DTYPE_F32;
    t[0].count = 0xFFFFFFFFull;
    t[0].block_elems = 1;
    t[0].nblocks = 0xFFFFFFFFu;
    strcpy(t[1].name, "b");
    t[1].dtype = CFX_DTYPE_F32;
    t[1].count = 17;
    t[1].block_elems = 1;
    t[1].first_block = 0xFFFFFFFFu;
    t[1].nblocks = 17;
    m.tensors = malloc(sizeof(t));
    cr_assert(m.tensors);
    memcpy(m.tensors, t, sizeof(t));
    m.ntensors = 2;
    m.nblocks = 16; /* 0xFFFFFFFF + 17 = 2^32 + 16 */
    m.owner = calloc(16, sizeof(*m.owner));
    cr_assert(m.owner);
    static uint8_t buf[PS_MAP_MAX];
    int len = cfx__ps_map_encode(&m, buf, sizeof(buf));
    cr_assert_gt(len, 0);
    struct ps_map d;
    cfx__ps_map_init(&d);
    cr_assert_eq(cfx__ps_map_decode(buf, (size_t)len, &d), CFX_ERR_PROTO);
    cfx__ps_map_free(&d);
}

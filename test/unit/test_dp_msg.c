/* Data-plane message validation (cfx__dp_msg_check): the object-reduce
 * messages a peer may send, well-formed and each way of getting them wrong. */
#include <criterion/criterion.h>

#include <endian.h>
#include <stdio.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/engine/engine.h"

static void node(struct cfx_dp_node *n, uint32_t id)
{
    memset(n, 0, sizeof(*n));
    n->node_id = id;
    n->naddr = 1;
    snprintf(n->host_id, sizeof(n->host_id), "host-%u", id);
    snprintf(n->addr[0].tp, sizeof(n->addr[0].tp), "tcp");
    n->addr[0].len = 6;
}

static struct cfx_dp_reduce_task task(void)
{
    struct cfx_dp_reduce_task t;
    memset(&t, 0, sizeof(t));
    t.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_TASK, 0 };
    t.task = 7;
    t.size = 1u << 20;
    t.chunk_size = 131072;
    t.dtype = CFX_DTYPE_F32;
    t.op = CFX_OP_SUM;
    t.final = CFX_RTASK_FINAL | CFX_RTASK_EARLY | CFX_RTASK_REPAIR;
    t.nchildren = 2;
    node(&t.child[0], 2);
    node(&t.child[1], 3);
    return t;
}

static struct cfx_dp_reduce_adopt adopt(unsigned n)
{
    struct cfx_dp_reduce_adopt a;
    memset(&a, 0, sizeof(a));
    a.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_ADOPT, 0 };
    a.task = 7;
    a.n = (uint8_t)n;
    a.last = 1;
    for (unsigned i = 0; i < n && i < CFX_RTASK_MAX_CHILDREN; i++)
        node(&a.child[i], 10 + i);
    return a;
}

/* The wire bytes of host-form @p msg (the encoder must take it). */
static uint8_t wire[CFX_TP_SEND_MAX + 64];
static size_t enc(const void *msg, size_t len)
{
    int n = cfx__dp_msg_encode(msg, len, wire, sizeof(wire));
    cr_assert_geq(n, 0, "the encoder refused a message: %s", cfx_errname(n));
    return (size_t)n;
}

/* Encode, then check as a receiver does. */
static int check(const void *msg, size_t len)
{
    return cfx__dp_msg_check(wire, enc(msg, len));
}

/* Where the first node record of a REDUCE_TASK with @p n children starts. */
static size_t task_node_off(unsigned n)
{
    return CFX_DP_WIRE_REDUCE_TASK + (size_t)n * CFX_OBJECT_ID_LEN;
}

Test(dp_msg, reduce_task_is_accepted_and_its_flags_checked)
{
    struct cfx_dp_reduce_task t = task();
    cr_assert_eq(check(&t, sizeof(t)), CFX_DP_REDUCE_TASK);
    t.final = 16; /* an unknown flag */
    cr_assert_eq(check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    t.child[1].node_id = 0;
    cr_assert_eq(check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    t.size = 6; /* not a whole number of floats */
    cr_assert_eq(check(&t, sizeof(t)), CFX_ERR_PROTO);

    t = task();
    size_t n = enc(&t, sizeof(t));
    cr_assert_eq(cfx__dp_msg_check(wire, n - 1), CFX_ERR_PROTO, "truncated");
    wire[n] = 0;
    cr_assert_eq(cfx__dp_msg_check(wire, n + 1), CFX_ERR_PROTO, "a byte left over");
    wire[74] = CFX_RTASK_MAX_CHILDREN + 1; /* nchildren */
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "too many children");
    /* the encoder does not write what a receiver would refuse */
    t.nchildren = CFX_RTASK_MAX_CHILDREN + 1;
    cr_assert_lt(cfx__dp_msg_encode(&t, sizeof(t), wire, sizeof(wire)), 0);
}

/* A stripe's range and a gather's fields travel, and what a node would
 * misread is refused: a range off the chunk grid, a gather with a range, with
 * fewer stripes than children or more than a task has slots, repair or
 * early flags, or a copy without its putter; stripes on a reduce task. */
Test(dp_msg, stripe_and_gather_fields)
{
    struct cfx_dp_reduce_task t = task();
    union cfx_dp_msg m;
    size_t len;
    t.final = 0;
    t.offset = 3ull * 131072;
    cr_assert_eq(cfx__dp_msg_decode(wire, enc(&t, sizeof(t)), &m, &len), CFX_DP_REDUCE_TASK);
    cr_assert_eq(m.reduce_task.offset, t.offset);
    t.offset += 4;
    cr_assert_eq(check(&t, sizeof(t)), CFX_ERR_PROTO, "a range off the chunk grid");
    t = task();
    t.final = 0;
    t.stripes = 2;
    cr_assert_eq(check(&t, sizeof(t)), CFX_ERR_PROTO, "stripes on a reduce task");

    struct cfx_dp_reduce_task g = task();
    g.final = CFX_RTASK_GATHER;
    g.putter = 9;
    g.stripes = 9; /* two named here, seven to come */
    cr_assert_eq(cfx__dp_msg_decode(wire, enc(&g, sizeof(g)), &m, &len), CFX_DP_REDUCE_TASK);
    cr_assert_eq(m.reduce_task.putter, 9);
    cr_assert_eq(m.reduce_task.stripes, 9);
    cr_assert_eq(m.reduce_task.final, CFX_RTASK_GATHER);
    static const struct {
        uint8_t final, stripes;
        uint32_t putter;
        uint64_t offset;
        const char *what;
    } bad[] = {
        { CFX_RTASK_GATHER, 9, 9, 131072, "a gather with a range" },
        { CFX_RTASK_GATHER, 1, 9, 0, "fewer stripes than children" },
        { CFX_RTASK_GATHER, CFX_RTASK_MAX_SLOTS + 1, 9, 0, "more stripes than slots" },
        { CFX_RTASK_GATHER | CFX_RTASK_REPAIR, 2, 9, 0, "a gather to repair" },
        { CFX_RTASK_GATHER | CFX_RTASK_FINAL | CFX_RTASK_EARLY, 2, 9, 0, "an early gather" },
        { CFX_RTASK_GATHER, 2, 0, 0, "a copy without its putter" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        g.final = bad[i].final;
        g.stripes = bad[i].stripes;
        g.putter = bad[i].putter;
        g.offset = bad[i].offset;
        cr_assert_eq(check(&g, sizeof(g)), CFX_ERR_PROTO, "%s", bad[i].what);
    }
    g.final = CFX_RTASK_GATHER | CFX_RTASK_FINAL; /* the putter's own: no putter needed */
    g.stripes = 2;
    g.putter = 0;
    g.offset = 0;
    cr_assert_eq(check(&g, sizeof(g)), CFX_DP_REDUCE_TASK);
}

/* Every address of a node reaches a reduce task (CFX_NODE_ADDRS_MAX, as in
 * the directory's records; three did before), and a task naming the most
 * children, each with every address, fits one ep_send. */
Test(dp_msg, reduce_task_carries_every_address)
{
    struct cfx_dp_reduce_task t = task();
    static const char *tps[] = { "shm", "verbs", "tcp", "dpdk" };
    _Static_assert(CFX_NODE_ADDRS_MAX == 4, "this test names four transports");
    t.nchildren = CFX_RTASK_MAX_CHILDREN;
    for (unsigned c = 0; c < CFX_RTASK_MAX_CHILDREN; c++) {
        node(&t.child[c], 2 + c);
        t.child[c].naddr = CFX_NODE_ADDRS_MAX;
        snprintf(t.child[c].host_id, sizeof(t.child[c].host_id),
                 "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/net:[4026531840]");
        for (unsigned a = 0; a < CFX_NODE_ADDRS_MAX; a++) {
            struct cfx_node_addr *na = &t.child[c].addr[a];
            snprintf(na->tp, sizeof(na->tp), "%s", tps[a]);
            na->len = (uint8_t)(snprintf((char *)na->addr, sizeof(na->addr),
                                         "@conflux-%s-12345-%08x:%u", tps[a], 0xabcdef01u + c,
                                         4000 + a) + 1);
        }
    }
    size_t n = enc(&t, sizeof(t));
    cr_assert_leq(n, CFX_TP_SEND_MAX);
    union cfx_dp_msg m;
    size_t len;
    cr_assert_eq(cfx__dp_msg_decode(wire, n, &m, &len), CFX_DP_REDUCE_TASK);
    cr_assert_eq(len, sizeof(t));
    for (unsigned c = 0; c < CFX_RTASK_MAX_CHILDREN; c++) {
        cr_assert_eq(m.reduce_task.child[c].naddr, CFX_NODE_ADDRS_MAX);
        for (unsigned a = 0; a < CFX_NODE_ADDRS_MAX; a++) {
            cr_assert_str_eq(m.reduce_task.child[c].addr[a].tp, tps[a]);
            cr_assert_eq(m.reduce_task.child[c].addr[a].len, t.child[c].addr[a].len);
            cr_assert_arr_eq(m.reduce_task.child[c].addr[a].addr, t.child[c].addr[a].addr,
                             t.child[c].addr[a].len);
        }
        cr_assert_str_eq(m.reduce_task.child[c].host_id, t.child[c].host_id);
    }
}

Test(dp_msg, lost_report_has_the_size_of_a_done_report)
{
    struct cfx_dp_reduce_done d = {
        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_LOST, 0 },
        .task = 7, .status = CFX_ERR_PEER_FAILED, .node_id = 3,
    };
    size_t n = enc(&d, sizeof(d));
    cr_assert_eq(n, CFX_DP_WIRE_REDUCE_DONE);
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_DP_REDUCE_LOST);
    cr_assert_eq(cfx__dp_msg_check(wire, n + 4), CFX_ERR_PROTO);
    d.hdr.magic ^= 1;
    cr_assert_eq(check(&d, sizeof(d)), CFX_ERR_PROTO);
}

Test(dp_msg, adopt_names_one_to_seven_well_formed_streams)
{
    for (unsigned n = 1; n <= CFX_RTASK_MAX_CHILDREN; n++) {
        struct cfx_dp_reduce_adopt a = adopt(n);
        cr_assert_eq(check(&a, sizeof(a)), CFX_DP_REDUCE_ADOPT, "n = %u", n);
    }
    struct cfx_dp_reduce_adopt a = adopt(0);
    cr_assert_eq(check(&a, sizeof(a)), CFX_ERR_PROTO, "no entries");
    a = adopt(2);
    size_t n = enc(&a, sizeof(a));
    wire[16] = CFX_RTASK_MAX_CHILDREN + 1; /* n */
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "too many entries");
    a = adopt(2);
    a.last = 2;
    cr_assert_eq(check(&a, sizeof(a)), CFX_ERR_PROTO, "last is 0 or 1");
    a = adopt(2);
    a.child[1].node_id = 0;
    cr_assert_eq(check(&a, sizeof(a)), CFX_ERR_PROTO, "node 0");

    /* the first node record: node_id u32 | naddr u8 | host id length u8 | ... */
    a = adopt(2);
    size_t node0 = CFX_DP_WIRE_REDUCE_ADOPT + 2 * 2 * CFX_OBJECT_ID_LEN;
    n = enc(&a, sizeof(a));
    wire[node0 + 4] = CFX_NODE_ADDRS_MAX + 1;
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "too many addresses");
    n = enc(&a, sizeof(a));
    wire[node0 + 5] = CFX_HOST_ID_MAX;
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "host id too long");
    n = enc(&a, sizeof(a));
    size_t hl = wire[node0 + 5];
    size_t tl = wire[node0 + 6 + hl];
    wire[node0 + 6 + hl + 1 + tl] = CFX_TP_ADDR_MAX + 1;
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "address too long");
    n = enc(&a, sizeof(a));
    wire[node0 + 6] = 0; /* a NUL inside the host id */
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO, "NUL inside the host id");

    /* the encoder does not write a record a receiver would refuse */
    a = adopt(2);
    memset(a.child[1].host_id, 'x', sizeof(a.child[1].host_id));
    cr_assert_lt(cfx__dp_msg_encode(&a, sizeof(a), wire, sizeof(wire)), 0,
                 "unterminated host id");
    a = adopt(2);
    a.child[0].naddr = CFX_NODE_ADDRS_MAX + 1;
    cr_assert_lt(cfx__dp_msg_encode(&a, sizeof(a), wire, sizeof(wire)), 0);
    a = adopt(3);
    a.n = 2; /* the entries past n are not looked at */
    a.child[2].node_id = 0;
    cr_assert_eq(check(&a, sizeof(a)), CFX_DP_REDUCE_ADOPT);
    (void)task_node_off;
}

/* A small object's bytes in one message (GET_DATA): exactly len bytes,
 * 1 .. CFX_DP_GET_SMALL_MAX, a slot in range. */
Test(dp_msg, get_data_length_is_checked)
{
    static union {
        struct cfx_dp_get_data m;
        uint8_t raw[CFX_TP_SEND_MAX + 8];
    } u;
    memset(&u, 0, sizeof(u));
    u.m.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_DATA, 5 };
    u.m.len = 8;
    size_t n = enc(&u, sizeof(u.m) + 8);
    cr_assert_eq(n, CFX_DP_WIRE_GET_DATA + 8);
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_DP_GET_DATA);
    cr_assert_eq(cfx__dp_msg_check(wire, n - 1), CFX_ERR_PROTO);
    cr_assert_eq(cfx__dp_msg_check(wire, n + 1), CFX_ERR_PROTO);
    cr_assert_eq(cfx__dp_msg_check(wire, CFX_DP_WIRE_GET_DATA - 1), CFX_ERR_PROTO);
    wire[28] = 0; /* len 0 */
    cr_assert_eq(cfx__dp_msg_check(wire, CFX_DP_WIRE_GET_DATA), CFX_ERR_PROTO);
    u.m.len = CFX_DP_GET_SMALL_MAX;
    n = enc(&u, sizeof(u.m) + CFX_DP_GET_SMALL_MAX);
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_DP_GET_DATA);
    uint32_t over = htole32(CFX_DP_GET_SMALL_MAX + 1);
    memcpy(wire + 28, &over, 4);
    wire[n] = 0;
    cr_assert_eq(cfx__dp_msg_check(wire, n + 1), CFX_ERR_PROTO);
    u.m.len = 8;
    u.m.hdr.slot = CFX_XFER_SLOTS;
    cr_assert_eq(check(&u, sizeof(u.m) + 8), CFX_ERR_PROTO);
}

/* Every field of a GET_REQ sits at its documented offset, little endian,
 * whatever the host's byte order and padding. */
Test(dp_msg, get_req_wire_layout_is_fixed)
{
    struct cfx_dp_get_req r;
    memset(&r, 0, sizeof(r));
    r.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ, 0x0102 };
    memset(r.id, 0xab, sizeof(r.id));
    r.size = 0x55667788ull;
    r.chunk_size = CFX_CHUNK_MAX;
    r.credits = 2;
    r.chan = 0x0102030405060708ull;
    r.tag = 0xa1a2a3a4;
    r.end_chunk = 21; /* of 22 chunks */
    r.rdesc.len = 3;
    memcpy(r.rdesc.data, "xyz", 3);
    size_t n = enc(&r, sizeof(r));
    cr_assert_eq(n, CFX_DP_WIRE_GET_REQ);
    static const uint8_t hdr[8] = { 0x1d, 0xcf, CFX_DP_VERSION, CFX_DP_GET_REQ, 2, 1, 0, 0 };
    cr_assert_arr_eq(wire, hdr, 8);
    cr_assert_eq(wire[8], 0xab);
    static const uint8_t size_le[8] = { 0x88, 0x77, 0x66, 0x55, 0, 0, 0, 0 };
    cr_assert_arr_eq(wire + 28, size_le, 8);
    static const uint8_t tag_le[4] = { 0xa4, 0xa3, 0xa2, 0xa1 };
    cr_assert_arr_eq(wire + 60, tag_le, 4);
    static const uint8_t end_le[4] = { 21, 0, 0, 0 };
    cr_assert_arr_eq(wire + 68, end_le, 4);
    cr_assert_eq(wire[72], 3);
    cr_assert_arr_eq(wire + 73, "xyz", 3);
    union cfx_dp_msg m;
    size_t len;
    cr_assert_eq(cfx__dp_msg_decode(wire, n, &m, &len), CFX_DP_GET_REQ);
    cr_assert_eq(len, sizeof(r));
    cr_assert_eq(m.get_req.size, r.size);
    cr_assert_eq(m.get_req.chan, r.chan);
    cr_assert_eq(m.get_req.tag, r.tag);
    cr_assert_eq(m.get_req.end_chunk, r.end_chunk);
    cr_assert_eq(m.hdr.slot, r.hdr.slot);
}

/* A striped get's range: past its first chunk, within the object, and only
 * for a chunk write of an object (not a message, not the one-message answer). */
Test(dp_msg, get_req_range_is_checked)
{
    struct cfx_dp_get_req r;
    memset(&r, 0, sizeof(r));
    r.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ, 1 };
    r.size = 4ull * CFX_CHUNK_MIN;
    r.chunk_size = CFX_CHUNK_MIN;
    r.credits = 2;
    r.first_chunk = 1;
    r.end_chunk = 3;
    cr_assert_eq(check(&r, sizeof(r)), CFX_DP_GET_REQ);
    r.end_chunk = 4;
    cr_assert_eq(check(&r, sizeof(r)), CFX_DP_GET_REQ);
    r.end_chunk = 5; /* past the object */
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.end_chunk = 1; /* empty */
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.end_chunk = 3;
    r.flags = CFX_DP_GET_P2P;
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
}

/* A GET_REQ may ask for the one-message answer only for a small object. */
Test(dp_msg, get_req_small_flag_needs_a_small_object)
{
    struct cfx_dp_get_req r;
    memset(&r, 0, sizeof(r));
    r.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ, 1 };
    r.size = 8;
    r.chunk_size = CFX_CHUNK_MIN;
    r.credits = 2;
    r.flags = CFX_DP_GET_SMALL | CFX_DP_GET_CACHED;
    cr_assert_eq(check(&r, sizeof(r)), CFX_DP_GET_REQ);
    r.size = CFX_DP_GET_SMALL_MAX + 1;
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.size = 0;
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.size = 8;
    r.flags = 32; /* unknown */
    cr_assert_eq(check(&r, sizeof(r)), CFX_ERR_PROTO);
}

/* A build of protocol 9 is refused at the handshake: it sends group
 * messages of 16-64 KiB between ranks of one host with shm by rendezvous,
 * where this one sends and waits for eager pieces (cfx__coll_split_max), so
 * a mixed pair would only time out, message after message. */
Test(dp_msg, protocol_9_is_refused)
{
    struct cfx_dp_hello h;
    memset(&h, 0, sizeof(h));
    h.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_HELLO, 0 };
    h.node_id = 7;
    size_t n = enc(&h, sizeof(h));
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_DP_HELLO);
    wire[2] = 9; /* the version byte, after the little-endian magic */
    cr_assert_eq(cfx__dp_msg_check(wire, n), CFX_ERR_PROTO);
}

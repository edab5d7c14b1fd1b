/* Data-plane message validation (cfx__dp_msg_check): the object-reduce
 * messages a peer may send, well-formed and each way of getting them wrong. */
#include <criterion/criterion.h>

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

Test(dp_msg, reduce_task_is_accepted_and_its_flags_checked)
{
    struct cfx_dp_reduce_task t = task();
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t)), CFX_DP_REDUCE_TASK);
    t.final = 8; /* an unknown flag */
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    t.nchildren = CFX_RTASK_MAX_CHILDREN + 1;
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    t.child[1].node_id = 0;
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    t.size = 6; /* not a whole number of floats */
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t)), CFX_ERR_PROTO);
    t = task();
    cr_assert_eq(cfx__dp_msg_check(&t, sizeof(t) - 1), CFX_ERR_PROTO);
}

Test(dp_msg, lost_report_has_the_size_of_a_done_report)
{
    struct cfx_dp_reduce_done d = {
        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_LOST, 0 },
        .task = 7, .status = CFX_ERR_PEER_FAILED, .node_id = 3,
    };
    cr_assert_eq(cfx__dp_msg_check(&d, sizeof(d)), CFX_DP_REDUCE_LOST);
    cr_assert_eq(cfx__dp_msg_check(&d, sizeof(d) + 4), CFX_ERR_PROTO);
    d.hdr.magic ^= 1;
    cr_assert_eq(cfx__dp_msg_check(&d, sizeof(d)), CFX_ERR_PROTO);
}

Test(dp_msg, adopt_names_one_to_seven_well_formed_streams)
{
    for (unsigned n = 1; n <= CFX_RTASK_MAX_CHILDREN; n++) {
        struct cfx_dp_reduce_adopt a = adopt(n);
        cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_DP_REDUCE_ADOPT, "n = %u", n);
    }
    struct cfx_dp_reduce_adopt a = adopt(0);
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "no entries");
    a = adopt(CFX_RTASK_MAX_CHILDREN + 1);
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "too many entries");
    a = adopt(2);
    a.last = 2;
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "last is 0 or 1");
    a = adopt(2);
    a.child[1].node_id = 0;
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "node 0");
    a = adopt(2);
    a.child[0].naddr = CFX_DP_NODE_ADDRS + 1;
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "too many addresses");
    a = adopt(2);
    memset(a.child[1].host_id, 'x', sizeof(a.child[1].host_id));
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "unterminated host id");
    a = adopt(2);
    a.child[0].addr[0].len = CFX_TP_ADDR_MAX + 1;
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_ERR_PROTO, "address too long");
    a = adopt(3);
    a.n = 2; /* the entries past n are not looked at */
    a.child[2].node_id = 0;
    cr_assert_eq(cfx__dp_msg_check(&a, sizeof(a)), CFX_DP_REDUCE_ADOPT);
}

/* A small object's bytes in one message (GET_DATA): exactly len bytes,
 * 1 .. CFX_DP_GET_SMALL_MAX, a slot in range. */
Test(dp_msg, get_data_length_is_checked)
{
    union {
        struct cfx_dp_get_data m;
        uint8_t raw[CFX_TP_SEND_MAX + 8];
    } u;
    memset(&u, 0, sizeof(u));
    u.m.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_DATA, 5 };
    u.m.len = 8;
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + 8), CFX_DP_GET_DATA);
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + 7), CFX_ERR_PROTO);
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + 9), CFX_ERR_PROTO);
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) - 1), CFX_ERR_PROTO);
    u.m.len = 0;
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m)), CFX_ERR_PROTO);
    u.m.len = CFX_DP_GET_SMALL_MAX;
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + CFX_DP_GET_SMALL_MAX), CFX_DP_GET_DATA);
    u.m.len = CFX_DP_GET_SMALL_MAX + 1;
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + CFX_DP_GET_SMALL_MAX + 1), CFX_ERR_PROTO);
    u.m.len = 8;
    u.m.hdr.slot = CFX_XFER_SLOTS;
    cr_assert_eq(cfx__dp_msg_check(&u, sizeof(u.m) + 8), CFX_ERR_PROTO);
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
    cr_assert_eq(cfx__dp_msg_check(&r, sizeof(r)), CFX_DP_GET_REQ);
    r.size = CFX_DP_GET_SMALL_MAX + 1;
    cr_assert_eq(cfx__dp_msg_check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.size = 0;
    cr_assert_eq(cfx__dp_msg_check(&r, sizeof(r)), CFX_ERR_PROTO);
    r.size = 8;
    r.flags = 32; /* unknown */
    cr_assert_eq(cfx__dp_msg_check(&r, sizeof(r)), CFX_ERR_PROTO);
}

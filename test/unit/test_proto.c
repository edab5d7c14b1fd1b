/* Wire protocol: round trips of every message and rejection of bad frames. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "control/proto.h"
#include "testutil.h"

#define FRAME_MAX (CFX_PROTO_HDR_LEN + CFX_PROTO_MAX_PAYLOAD)

static uint8_t *frame;     /* encode buffer */
static uint8_t *frame2;    /* scratch copy */
static uint8_t inline_data[CFX_OBJECT_INLINE_MAX];
static struct cfx_node_rec node_recs[3];
static struct cfx_ctl_task_rec task_recs[2];
static struct cfx_ctl_obj_rec obj_recs[2];

static void sample_node(struct cfx_node_rec *n, uint32_t id)
{
    memset(n, 0, sizeof(*n));
    n->node_id = id;
    n->pid = 4242 + id;
    snprintf(n->name, sizeof(n->name), "host-%u:%u", id, n->pid);
    snprintf(n->host_id, sizeof(n->host_id), "boot-id-%u", id % 2);
    snprintf(n->ctl_addr, sizeof(n->ctl_addr), "127.0.0.1:%u", 40000 + id);
    n->alive = (uint8_t)(id & 1);
    n->last_seen_ms = 17 * id;
    n->naddr = 2;
    snprintf(n->addr[0].tp, sizeof(n->addr[0].tp), "tcp");
    n->addr[0].len = 6;
    memcpy(n->addr[0].addr, "\x7f\x00\x00\x01\x13\x88", 6);
    snprintf(n->addr[1].tp, sizeof(n->addr[1].tp), "shm");
    n->addr[1].len = CFX_TP_ADDR_MAX;
    for (unsigned i = 0; i < CFX_TP_ADDR_MAX; i++)
        n->addr[1].addr[i] = (uint8_t)(i * 7 + id);
    snprintf(n->host, sizeof(n->host), "gpu-node-%u.example", id);
    n->flags = (uint8_t)(id & 1 ? CFX_NODE_F_OBSERVER : CFX_NODE_F_LEFT);
}

/* A heartbeat report with every field set, distinct per seed. */
static void sample_load(struct cfx_msg_load *l, uint32_t seed)
{
    memset(l, 0, sizeof(*l));
    l->load_milli = 1234 + seed;
    l->mem_avail = (5ull << 32) + seed;
    l->arena_used = (1ull << 20) + seed;
    l->tasks_running = 3 + seed;
    l->ntp = 2;
    snprintf(l->tp[0].name, sizeof(l->tp[0].name), "shm");
    l->tp[0].tx_bytes = 0x0102030405060708ull + seed;
    l->tp[0].rx_bytes = 0x1112131415161718ull + seed;
    snprintf(l->tp[1].name, sizeof(l->tp[1].name), "tcp");
    l->tp[1].tx_bytes = 1ull << 40;
    l->tp[1].rx_bytes = (1ull << 41) + seed;
    l->uploads_active = 7 + seed;
    l->xfers_in_active = 9 + seed;
    l->puts = 100 + seed;
    l->gets = 200 + seed;
    l->uploads = 300 + seed;
    l->failovers = 4 + seed;
    l->reduce_reroutes = 5 + seed;
    l->writes_refused = 6 + seed;
    l->link_bw = 117500000ull + seed;
    l->link_lat_ns = 85000 + seed;
}

static void assert_load_eq(const struct cfx_msg_load *a, const struct cfx_msg_load *b)
{
    cr_assert_eq(a->load_milli, b->load_milli);
    cr_assert_eq(a->mem_avail, b->mem_avail);
    cr_assert_eq(a->arena_used, b->arena_used);
    cr_assert_eq(a->tasks_running, b->tasks_running);
    cr_assert_eq(a->ntp, b->ntp);
    for (unsigned t = 0; t < a->ntp; t++) {
        cr_assert_str_eq(a->tp[t].name, b->tp[t].name);
        cr_assert_eq(a->tp[t].tx_bytes, b->tp[t].tx_bytes);
        cr_assert_eq(a->tp[t].rx_bytes, b->tp[t].rx_bytes);
    }
    cr_assert_eq(a->uploads_active, b->uploads_active);
    cr_assert_eq(a->xfers_in_active, b->xfers_in_active);
    cr_assert_eq(a->puts, b->puts);
    cr_assert_eq(a->gets, b->gets);
    cr_assert_eq(a->uploads, b->uploads);
    cr_assert_eq(a->failovers, b->failovers);
    cr_assert_eq(a->reduce_reroutes, b->reduce_reroutes);
    cr_assert_eq(a->writes_refused, b->writes_refused);
    cr_assert_eq(a->link_bw, b->link_bw);
    cr_assert_eq(a->link_lat_ns, b->link_lat_ns);
}

static void sample_id(struct cfx_object_id *id, uint8_t seed)
{
    for (unsigned i = 0; i < CFX_OBJECT_ID_LEN; i++)
        id->bytes[i] = (uint8_t)(seed * 31 + i);
}

static void setup(void)
{
    frame = malloc(FRAME_MAX + 64);
    frame2 = malloc(FRAME_MAX + 64);
    cr_assert(frame && frame2);
    cfx_test_fill(inline_data, sizeof(inline_data), 7);
    for (uint32_t i = 0; i < 2; i++) {
        struct cfx_ctl_task_rec *t = &task_recs[i];
        memset(t, 0, sizeof(*t));
        t->id = 0x100000000ull + i; /* above 32 bits: ids are 64-bit */
        snprintf(t->name, sizeof(t->name), "train_step_%u", i);
        t->state = i ? CFX_CTL_TASK_DONE : CFX_CTL_TASK_PLACED;
        t->node_id = 3 + i;
        t->submitter = 9;
        t->placements = 1 + i;
        t->status = i ? CFX_ERR_PEER_FAILED : 0;
        t->age_ms = 123456 + i;
        t->cores = 4;
        t->gpus = i;
        t->memory = 1ull << 33;
        t->ninputs = 2;
        t->nresults = 1;
        sample_id(&t->result, (uint8_t)(40 + i));
        snprintf(t->text, sizeof(t->text), i ? "node 4 died holding input 0" : "");
    }
    for (uint32_t i = 0; i < 3; i++) {
        sample_node(&node_recs[i], i + 1);
        sample_load(&node_recs[i].load, i); /* carried by NODES_REPLY only */
    }
    for (uint32_t i = 0; i < 2; i++) {
        memset(&obj_recs[i], 0, sizeof(obj_recs[i]));
        sample_id(&obj_recs[i].id, (uint8_t)(i + 9));
        obj_recs[i].size = 1000000ull * (i + 1);
        obj_recs[i].chunk_size = 65536;
        obj_recs[i].is_inline = 0;
        obj_recs[i].nholders = 2 + i;
        snprintf(obj_recs[i].name, sizeof(obj_recs[i].name), "model/weights.%u", i);
        for (uint32_t j = 0; j < obj_recs[i].nholders; j++) {
            obj_recs[i].holders[j].node_id = j + 1;
            obj_recs[i].holders[j].complete = (uint8_t)(j == 0);
            obj_recs[i].holders[j].uploads = j;
            obj_recs[i].holders[j].src = j ? j + 100 : 0;
            /* complete: the size; partial: its report, or none yet (the last) */
            obj_recs[i].holders[j].ready = j == 0 ? obj_recs[i].size
                                           : j == 2 ? CFX_CTL_READY_UNKNOWN
                                                    : 65536ull * j;
        }
    }
}

static void teardown(void)
{
    free(frame);
    free(frame2);
}

TestSuite(proto, .init = setup, .fini = teardown);

/* A representative message of @p type. */
/* Two PS servers ("job-a" 0, "b" 3), two blocks: SAMPLE_PS_WIRE bytes. */
#define SAMPLE_PS_WIRE (1 + CFX_PROTO_PS_SERVER_WIRE(5) + CFX_PROTO_PS_SERVER_WIRE(1) + 1 + \
                        2 * CFX_PROTO_PS_BLOCK_WIRE)
static void sample_ps(struct cfx_ctl_ps_report *ps)
{
    memset(ps, 0, sizeof(*ps));
    ps->nservers = 2;
    ps->servers[0] = (struct cfx_ctl_ps_server){ .job = "job-a", .server = 0, .blocks = 12,
                                                 .requests = 1000, .bytes = 5ull << 33 };
    ps->servers[1] = (struct cfx_ctl_ps_server){ .job = "b", .server = 3, .blocks = 1,
                                                 .requests = 1, .bytes = 64 };
    ps->nblocks = 2;
    ps->blocks[0] = (struct cfx_ctl_ps_block){ .srv = 0, .block = 7, .requests = 600,
                                               .bytes = 3ull << 33 };
    ps->blocks[1] = (struct cfx_ctl_ps_block){ .srv = 1, .block = 16383, .requests = 1,
                                               .bytes = 64 };
}

static void assert_ps_eq(const struct cfx_ctl_ps_report *a, const struct cfx_ctl_ps_report *b)
{
    cr_assert_eq(a->nservers, b->nservers);
    for (uint32_t i = 0; i < a->nservers; i++) {
        cr_assert_str_eq(a->servers[i].job, b->servers[i].job);
        cr_assert_eq(a->servers[i].server, b->servers[i].server);
        cr_assert_eq(a->servers[i].blocks, b->servers[i].blocks);
        cr_assert_eq(a->servers[i].requests, b->servers[i].requests);
        cr_assert_eq(a->servers[i].bytes, b->servers[i].bytes);
    }
    cr_assert_eq(a->nblocks, b->nblocks);
    for (uint32_t i = 0; i < a->nblocks; i++) {
        cr_assert_eq(a->blocks[i].srv, b->blocks[i].srv);
        cr_assert_eq(a->blocks[i].block, b->blocks[i].block);
        cr_assert_eq(a->blocks[i].requests, b->blocks[i].requests);
        cr_assert_eq(a->blocks[i].bytes, b->blocks[i].bytes);
    }
}

static void sample_msg(uint8_t type, struct cfx_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->req_id = 0x0123456789abcdefull ^ type;
    switch (type) {
    case CFX_MSG_ERROR:
        m->u.error.status = CFX_ERR_TIMEOUT;
        snprintf(m->u.error.text, sizeof(m->u.error.text), "no holder of object x appeared");
        break;
    case CFX_MSG_CHALLENGE:
        for (unsigned i = 0; i < CFX_PROTO_NONCE_LEN; i++)
            m->u.challenge.nonce[i] = (uint8_t)(i + 1);
        m->u.challenge.secure = 2; /* encrypt */
        break;
    case CFX_MSG_AUTH:
        m->u.auth.role = CFX_CTL_ROLE_ADMIN;
        m->u.auth.secure = 1; /* integrity */
        for (unsigned i = 0; i < CFX_PROTO_NONCE_LEN; i++) {
            m->u.auth.nonce[i] = (uint8_t)(i * 3);
            m->u.auth.mac[i] = (uint8_t)(255 - i);
        }
        break;
    case CFX_MSG_AUTH_OK:
        for (unsigned i = 0; i < CFX_PROTO_MAC_LEN; i++)
            m->u.auth_ok.mac[i] = (uint8_t)(i ^ 0x5a);
        break;
    case CFX_MSG_JOIN:
    case CFX_MSG_NODE_REPLY:
        sample_node(&m->u.join, 3);
        break;
    case CFX_MSG_JOIN_REPLY:
        m->u.join_reply.node_id = 7;
        m->u.join_reply.heartbeat_ms = 250;
        m->u.join_reply.dead_after_ms = 1500;
        break;
    case CFX_MSG_OBJ_PUT:
        sample_id(&m->u.put.id, 1);
        m->u.put.size = 1000;
        m->u.put.chunk_size = 512;
        m->u.put.has_data = 1;
        m->u.put.data = inline_data;
        break;
    case CFX_MSG_OBJ_LOOKUP:
        sample_id(&m->u.lookup.id, 2);
        m->u.lookup.timeout_ms = 2000;
        m->u.lookup.nexclude = 3;
        m->u.lookup.exclude[0] = 4;
        m->u.lookup.exclude[1] = 9;
        m->u.lookup.exclude[2] = 11;
        m->u.lookup.want = 3;
        break;
    case CFX_MSG_LOOKUP_REPLY:
        sample_id(&m->u.lookup_reply.id, 3);
        m->u.lookup_reply.size = 1ull << 33;
        m->u.lookup_reply.chunk_size = 1u << 20;
        m->u.lookup_reply.complete = 1;
        sample_node(&m->u.lookup_reply.node, 5);
        m->u.lookup_reply.putter = 7;
        m->u.lookup_reply.tag = 99;
        m->u.lookup_reply.nextra = 2;
        m->u.lookup_reply.extra[0] = 12;
        m->u.lookup_reply.extra[1] = 0x01020304;
        break;
    case CFX_MSG_OBJ_DONE:
        sample_id(&m->u.done.id, 4);
        m->u.done.source_node = 3;
        m->u.done.complete = 1;
        break;
    case CFX_MSG_OBJ_DELETE:
        sample_id(&m->u.del.id, 5);
        m->u.del.end = 1;
        m->u.del.put_below = 0x0102030405060708ull;
        break;
    case CFX_MSG_NODE_GET:
        m->u.node_get.node_id = 12;
        break;
    case CFX_MSG_STATUS_REPLY:
        m->u.status.proto_version = CFX_PROTO_VERSION;
        m->u.status.uptime_ms = 123456789ull;
        m->u.status.nodes_alive = 3;
        m->u.status.nodes_dead = 1;
        m->u.status.objects = 44;
        m->u.status.inline_bytes = 99999;
        m->u.status.heartbeat_ms = 250;
        m->u.status.dead_after_ms = 1500;
        snprintf(m->u.status.version, sizeof(m->u.status.version), "0.1.0");
        break;
    case CFX_MSG_NODES:
    case CFX_MSG_OBJECTS:
        m->u.list.cursor = 77;
        break;
    case CFX_MSG_NODES_REPLY:
        m->u.page.count = 3;
        m->u.page.next = 3;
        m->u.page.more = 1;
        m->u.page.recs_in = node_recs;
        break;
    case CFX_MSG_OBJECTS_REPLY:
        m->u.page.count = 2;
        m->u.page.next = 2;
        m->u.page.more = 0;
        m->u.page.recs_in = obj_recs;
        break;
    case CFX_MSG_EV_NODE_DEAD:
        m->u.node_dead.node_id = 6;
        break;
    case CFX_MSG_EV_OBJ_GONE:
    case CFX_MSG_OBJ_GONE_ACK:
        memset(m->u.gone.id.bytes, 0x5a, CFX_OBJECT_ID_LEN);
        m->req_id = 77;
        break;
    case CFX_MSG_HEARTBEAT:
        sample_load(&m->u.hb.load, 0);
        m->u.hb.nprogress = 2;
        for (uint32_t i = 0; i < 2; i++) {
            sample_id(&m->u.hb.progress[i].id, (uint8_t)(60 + i));
            m->u.hb.progress[i].ready = i ? 0 : (12ull << 20); /* nothing landed yet: 0 */
        }
        m->u.hb.npeers = 2;
        for (uint32_t i = 0; i < 2; i++)
            m->u.hb.peers[i] = (struct cfx_ctl_peer_traffic){ .peer = 40 + i, .tp = (uint8_t)i,
                                                              .tx_bytes = (5ull << 40) + i,
                                                              .rx_bytes = i ? 0 : 77 };
        sample_ps(&m->u.hb.ps);
        break;
    case CFX_MSG_PS_LOADS:
        m->u.ps_cursor = 0x01020304u;
        break;
    case CFX_MSG_PS_LOADS_REPLY:
        m->u.ps_loads.node_id = 9;
        m->u.ps_loads.more = 1;
        sample_ps(&m->u.ps_loads.ps);
        break;
    case CFX_MSG_TASK_REG:
        strcpy(m->u.task_reg.name, "square");
        m->u.task_reg.cores = 8;
        m->u.task_reg.gpus = 2;
        m->u.task_reg.memory = 16ull << 30;
        break;
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_ANNOUNCE: {
        static const uint8_t targ[] = "task argument";
        struct cfx_msg_task *t = &m->u.task;
        t->task_id = type == CFX_MSG_EV_TASK_RUN || type == CFX_MSG_TASK_ANNOUNCE ? 42 : 0;
        t->key = type == CFX_MSG_TASK_PLACE ? 0 : 0xfeedface12345678ull;
        t->submitter = type == CFX_MSG_TASK_PLACE ? 0 : 5;
        t->hint_node = type == CFX_MSG_TASK_SUBMIT ? 6 : 0;
        strcpy(t->name, "square");
        t->timeout_ms = 5000;
        t->cores = 2;
        t->gpus = 1;
        t->memory = 1ull << 30;
        t->flags = CFX_PROTO_TASK_PACK | (type == CFX_MSG_TASK_SUBMIT ? CFX_PROTO_TASK_AGAIN : 0);
        t->reserve_ms = 700;
        strcpy(t->group, "shard");
        t->nnodes = 2;
        t->nodes[0] = 3;
        t->nodes[1] = 9;
        t->ninputs = 2;
        memset(t->inputs[0].bytes, 0x11, CFX_OBJECT_ID_LEN);
        memset(t->inputs[1].bytes, 0x22, CFX_OBJECT_ID_LEN);
        t->nresults = 1;
        memset(t->results[0].bytes, 0x33, CFX_OBJECT_ID_LEN);
        t->arg = targ;
        t->arg_len = sizeof(targ);
        break;
    }
    case CFX_MSG_TASKS:
        m->u.task_cursor = 0x1234567890ull;
        break;
    case CFX_MSG_TASKS_REPLY:
        m->u.tpage.count = 2;
        m->u.tpage.next = task_recs[1].id;
        m->u.tpage.more = 1;
        m->u.tpage.recs_in = task_recs;
        break;
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_TASK_DONE:
        m->u.task_st.task_id = 42;
        m->u.task_st.node_id = 7;
        m->u.task_st.status = type == CFX_MSG_TASK_DONE ? CFX_ERR_PEER_FAILED : 0;
        m->u.task_st.timeout_ms = 250;
        strcpy(m->u.task_st.text, type == CFX_MSG_TASK_DONE ? "node 7 died" : "");
        break;
    default:
        break;
    }
}

static void assert_node_eq(const struct cfx_node_rec *a, const struct cfx_node_rec *b)
{
    cr_assert_eq(a->node_id, b->node_id);
    cr_assert_eq(a->pid, b->pid);
    cr_assert_str_eq(a->name, b->name);
    cr_assert_str_eq(a->host_id, b->host_id);
    cr_assert_str_eq(a->ctl_addr, b->ctl_addr);
    cr_assert_eq(a->alive, b->alive);
    cr_assert_eq(a->last_seen_ms, b->last_seen_ms);
    cr_assert_eq(a->naddr, b->naddr);
    cr_assert_str_eq(a->host, b->host);
    cr_assert_eq(a->flags, b->flags);
    for (unsigned i = 0; i < a->naddr; i++) {
        cr_assert_str_eq(a->addr[i].tp, b->addr[i].tp);
        cr_assert_eq(a->addr[i].len, b->addr[i].len);
        cr_assert_arr_eq(a->addr[i].addr, b->addr[i].addr, a->addr[i].len);
    }
}

static void assert_msg_eq(const struct cfx_msg *a, const struct cfx_msg *b)
{
    cr_assert_eq(a->type, b->type);
    cr_assert_eq(a->req_id, b->req_id);
    switch (a->type) {
    case CFX_MSG_ERROR:
        cr_assert_eq(a->u.error.status, b->u.error.status);
        cr_assert_str_eq(a->u.error.text, b->u.error.text);
        break;
    case CFX_MSG_CHALLENGE:
        cr_assert_arr_eq(a->u.challenge.nonce, b->u.challenge.nonce, CFX_PROTO_NONCE_LEN);
        cr_assert_eq(a->u.challenge.secure, b->u.challenge.secure);
        break;
    case CFX_MSG_AUTH:
        cr_assert_eq(a->u.auth.role, b->u.auth.role);
        cr_assert_arr_eq(a->u.auth.nonce, b->u.auth.nonce, CFX_PROTO_NONCE_LEN);
        cr_assert_arr_eq(a->u.auth.mac, b->u.auth.mac, CFX_PROTO_MAC_LEN);
        cr_assert_eq(a->u.auth.secure, b->u.auth.secure);
        break;
    case CFX_MSG_AUTH_OK:
        cr_assert_arr_eq(a->u.auth_ok.mac, b->u.auth_ok.mac, CFX_PROTO_MAC_LEN);
        break;
    case CFX_MSG_JOIN:
    case CFX_MSG_NODE_REPLY:
        assert_node_eq(&a->u.join, &b->u.join);
        break;
    case CFX_MSG_JOIN_REPLY:
        cr_assert_eq(a->u.join_reply.node_id, b->u.join_reply.node_id);
        cr_assert_eq(a->u.join_reply.heartbeat_ms, b->u.join_reply.heartbeat_ms);
        cr_assert_eq(a->u.join_reply.dead_after_ms, b->u.join_reply.dead_after_ms);
        break;
    case CFX_MSG_OBJ_PUT:
        cr_assert_arr_eq(a->u.put.id.bytes, b->u.put.id.bytes, CFX_OBJECT_ID_LEN);
        cr_assert_eq(a->u.put.size, b->u.put.size);
        cr_assert_eq(a->u.put.chunk_size, b->u.put.chunk_size);
        cr_assert_eq(a->u.put.has_data, b->u.put.has_data);
        cr_assert_eq(a->u.put.durable, b->u.put.durable);
        cr_assert_str_eq(a->u.put.name, b->u.put.name);
        cr_assert_eq(a->u.put.tag, b->u.put.tag);
        cr_assert_eq(a->u.put.copy, b->u.put.copy);
        cr_assert_eq(a->u.put.putter, b->u.put.putter);
        if (a->u.put.has_data && a->u.put.size)
            cr_assert_arr_eq(a->u.put.data, b->u.put.data, a->u.put.size);
        break;
    case CFX_MSG_OBJ_LOOKUP:
        cr_assert_arr_eq(a->u.lookup.id.bytes, b->u.lookup.id.bytes, CFX_OBJECT_ID_LEN);
        cr_assert_eq(a->u.lookup.timeout_ms, b->u.lookup.timeout_ms);
        cr_assert_eq(a->u.lookup.nexclude, b->u.lookup.nexclude);
        cr_assert_arr_eq(a->u.lookup.exclude, b->u.lookup.exclude,
                         a->u.lookup.nexclude * sizeof(uint32_t));
        cr_assert_eq(a->u.lookup.want, b->u.lookup.want);
        break;
    case CFX_MSG_LOOKUP_REPLY:
        cr_assert_arr_eq(a->u.lookup_reply.id.bytes, b->u.lookup_reply.id.bytes,
                         CFX_OBJECT_ID_LEN);
        cr_assert_eq(a->u.lookup_reply.size, b->u.lookup_reply.size);
        cr_assert_eq(a->u.lookup_reply.chunk_size, b->u.lookup_reply.chunk_size);
        cr_assert_eq(a->u.lookup_reply.is_inline, b->u.lookup_reply.is_inline);
        cr_assert_eq(a->u.lookup_reply.complete, b->u.lookup_reply.complete);
        cr_assert_eq(a->u.lookup_reply.putter, b->u.lookup_reply.putter);
        cr_assert_eq(a->u.lookup_reply.tag, b->u.lookup_reply.tag);
        cr_assert_eq(a->u.lookup_reply.nextra, b->u.lookup_reply.nextra);
        cr_assert_arr_eq(a->u.lookup_reply.extra, b->u.lookup_reply.extra,
                         a->u.lookup_reply.nextra * sizeof(uint32_t));
        if (a->u.lookup_reply.is_inline && a->u.lookup_reply.size)
            cr_assert_arr_eq(a->u.lookup_reply.data, b->u.lookup_reply.data,
                             a->u.lookup_reply.size);
        else if (!a->u.lookup_reply.is_inline)
            assert_node_eq(&a->u.lookup_reply.node, &b->u.lookup_reply.node);
        break;
    case CFX_MSG_OBJ_DONE:
        cr_assert_arr_eq(a->u.done.id.bytes, b->u.done.id.bytes, CFX_OBJECT_ID_LEN);
        cr_assert_eq(a->u.done.source_node, b->u.done.source_node);
        cr_assert_eq(a->u.done.complete, b->u.done.complete);
        break;
    case CFX_MSG_OBJ_DELETE:
        cr_assert_arr_eq(a->u.del.id.bytes, b->u.del.id.bytes, CFX_OBJECT_ID_LEN);
        cr_assert_eq(a->u.del.end, b->u.del.end);
        cr_assert_eq(a->u.del.put_below, b->u.del.put_below);
        break;
    case CFX_MSG_NODE_GET:
        cr_assert_eq(a->u.node_get.node_id, b->u.node_get.node_id);
        break;
    case CFX_MSG_STATUS_REPLY:
        cr_assert_eq(a->u.status.proto_version, b->u.status.proto_version);
        cr_assert_eq(a->u.status.uptime_ms, b->u.status.uptime_ms);
        cr_assert_eq(a->u.status.nodes_alive, b->u.status.nodes_alive);
        cr_assert_eq(a->u.status.nodes_dead, b->u.status.nodes_dead);
        cr_assert_eq(a->u.status.objects, b->u.status.objects);
        cr_assert_eq(a->u.status.inline_bytes, b->u.status.inline_bytes);
        cr_assert_eq(a->u.status.heartbeat_ms, b->u.status.heartbeat_ms);
        cr_assert_eq(a->u.status.dead_after_ms, b->u.status.dead_after_ms);
        cr_assert_str_eq(a->u.status.version, b->u.status.version);
        break;
    case CFX_MSG_NODES:
    case CFX_MSG_OBJECTS:
        cr_assert_eq(a->u.list.cursor, b->u.list.cursor);
        break;
    case CFX_MSG_NODES_REPLY:
    case CFX_MSG_OBJECTS_REPLY:
        cr_assert_eq(a->u.page.count, b->u.page.count);
        cr_assert_eq(a->u.page.next, b->u.page.next);
        cr_assert_eq(a->u.page.more, b->u.page.more);
        for (uint32_t i = 0; i < b->u.page.count; i++) {
            if (a->type == CFX_MSG_NODES_REPLY) {
                struct cfx_node_rec n;
                cfx__msg_node_at(b, i, &n);
                assert_node_eq(&((const struct cfx_node_rec *)a->u.page.recs_in)[i], &n);
                assert_load_eq(&((const struct cfx_node_rec *)a->u.page.recs_in)[i].load, &n.load);
            } else {
                struct cfx_ctl_obj_rec o;
                const struct cfx_ctl_obj_rec *w = &((const struct cfx_ctl_obj_rec *)a->u.page.recs_in)[i];
                cfx__msg_obj_at(b, i, &o);
                cr_assert_arr_eq(o.id.bytes, w->id.bytes, CFX_OBJECT_ID_LEN);
                cr_assert_eq(o.size, w->size);
                cr_assert_eq(o.chunk_size, w->chunk_size);
                cr_assert_eq(o.nholders, w->nholders);
                cr_assert_str_eq(o.name, w->name);
                for (uint32_t j = 0; j < w->nholders; j++) {
                    cr_assert_eq(o.holders[j].node_id, w->holders[j].node_id);
                    cr_assert_eq(o.holders[j].complete, w->holders[j].complete);
                    cr_assert_eq(o.holders[j].uploads, w->holders[j].uploads);
                    cr_assert_eq(o.holders[j].src, w->holders[j].src);
                    cr_assert_eq(o.holders[j].ready, w->holders[j].ready);
                }
            }
        }
        break;
    case CFX_MSG_EV_NODE_DEAD:
        cr_assert_eq(a->u.node_dead.node_id, b->u.node_dead.node_id);
        break;
    case CFX_MSG_EV_OBJ_GONE:
    case CFX_MSG_OBJ_GONE_ACK:
        cr_assert_arr_eq(a->u.gone.id.bytes, b->u.gone.id.bytes, CFX_OBJECT_ID_LEN);
        break;
    case CFX_MSG_HEARTBEAT:
        assert_load_eq(&a->u.hb.load, &b->u.hb.load);
        cr_assert_eq(a->u.hb.nprogress, b->u.hb.nprogress);
        for (uint32_t i = 0; i < a->u.hb.nprogress; i++) {
            cr_assert_arr_eq(a->u.hb.progress[i].id.bytes, b->u.hb.progress[i].id.bytes,
                             CFX_OBJECT_ID_LEN);
            cr_assert_eq(a->u.hb.progress[i].ready, b->u.hb.progress[i].ready);
        }
        cr_assert_eq(a->u.hb.npeers, b->u.hb.npeers);
        for (uint32_t i = 0; i < a->u.hb.npeers; i++) {
            cr_assert_eq(a->u.hb.peers[i].peer, b->u.hb.peers[i].peer);
            cr_assert_eq(a->u.hb.peers[i].tp, b->u.hb.peers[i].tp);
            cr_assert_eq(a->u.hb.peers[i].tx_bytes, b->u.hb.peers[i].tx_bytes);
            cr_assert_eq(a->u.hb.peers[i].rx_bytes, b->u.hb.peers[i].rx_bytes);
        }
        assert_ps_eq(&a->u.hb.ps, &b->u.hb.ps);
        break;
    case CFX_MSG_PS_LOADS:
        cr_assert_eq(a->u.ps_cursor, b->u.ps_cursor);
        break;
    case CFX_MSG_PS_LOADS_REPLY:
        cr_assert_eq(a->u.ps_loads.node_id, b->u.ps_loads.node_id);
        cr_assert_eq(a->u.ps_loads.more, b->u.ps_loads.more);
        assert_ps_eq(&a->u.ps_loads.ps, &b->u.ps_loads.ps);
        break;
    case CFX_MSG_TASK_REG:
        cr_assert_str_eq(a->u.task_reg.name, b->u.task_reg.name);
        cr_assert_eq(a->u.task_reg.cores, b->u.task_reg.cores);
        cr_assert_eq(a->u.task_reg.gpus, b->u.task_reg.gpus);
        cr_assert_eq(a->u.task_reg.memory, b->u.task_reg.memory);
        break;
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_ANNOUNCE: {
        const struct cfx_msg_task *x = &a->u.task, *y = &b->u.task;
        cr_assert_eq(x->task_id, y->task_id);
        cr_assert_eq(x->key, y->key);
        cr_assert_eq(x->submitter, y->submitter);
        cr_assert_eq(x->hint_node, y->hint_node);
        cr_assert_str_eq(x->name, y->name);
        cr_assert_eq(x->timeout_ms, y->timeout_ms);
        cr_assert_eq(x->cores, y->cores);
        cr_assert_eq(x->gpus, y->gpus);
        cr_assert_eq(x->memory, y->memory);
        cr_assert_eq(x->flags, y->flags);
        cr_assert_eq(x->reserve_ms, y->reserve_ms);
        cr_assert_str_eq(x->group, y->group);
        cr_assert_eq(x->nnodes, y->nnodes);
        cr_assert_arr_eq(x->nodes, y->nodes, x->nnodes * sizeof(uint32_t));
        cr_assert_eq(x->ninputs, y->ninputs);
        cr_assert_arr_eq(x->inputs, y->inputs, x->ninputs * sizeof(x->inputs[0]));
        cr_assert_eq(x->nresults, y->nresults);
        cr_assert_arr_eq(x->results, y->results, x->nresults * sizeof(x->results[0]));
        cr_assert_eq(x->arg_len, y->arg_len);
        cr_assert_arr_eq(x->arg, y->arg, x->arg_len);
        break;
    }
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_TASK_DONE:
        cr_assert_eq(a->u.task_st.task_id, b->u.task_st.task_id);
        cr_assert_eq(a->u.task_st.node_id, b->u.task_st.node_id);
        cr_assert_eq(a->u.task_st.status, b->u.task_st.status);
        cr_assert_eq(a->u.task_st.timeout_ms, b->u.task_st.timeout_ms);
        cr_assert_str_eq(a->u.task_st.text, b->u.task_st.text);
        break;
    case CFX_MSG_TASKS:
        cr_assert_eq(a->u.task_cursor, b->u.task_cursor);
        break;
    case CFX_MSG_TASKS_REPLY:
        cr_assert_eq(a->u.tpage.count, b->u.tpage.count);
        cr_assert_eq(a->u.tpage.next, b->u.tpage.next);
        cr_assert_eq(a->u.tpage.more, b->u.tpage.more);
        for (uint32_t i = 0; i < b->u.tpage.count; i++) {
            struct cfx_ctl_task_rec t;
            const struct cfx_ctl_task_rec *w = &a->u.tpage.recs_in[i];
            cfx__msg_task_at(b, i, &t);
            cr_assert_eq(t.id, w->id);
            cr_assert_str_eq(t.name, w->name);
            cr_assert_eq(t.state, w->state);
            cr_assert_eq(t.node_id, w->node_id);
            cr_assert_eq(t.submitter, w->submitter);
            cr_assert_eq(t.placements, w->placements);
            cr_assert_eq(t.status, w->status);
            cr_assert_eq(t.age_ms, w->age_ms);
            cr_assert_eq(t.cores, w->cores);
            cr_assert_eq(t.gpus, w->gpus);
            cr_assert_eq(t.memory, w->memory);
            cr_assert_eq(t.ninputs, w->ninputs);
            cr_assert_eq(t.nresults, w->nresults);
            cr_assert_arr_eq(t.result.bytes, w->result.bytes, CFX_OBJECT_ID_LEN);
            cr_assert_str_eq(t.text, w->text);
        }
        break;
    default:
        break;
    }
}

static size_t encode_ok(const struct cfx_msg *m)
{
    size_t len = 0;
    int rc = cfx__msg_encode(m, frame, FRAME_MAX, &len);
    cr_assert_eq(rc, CFX_OK, "encode %s: %s", cfx__msg_type_name(m->type), cfx_last_error());
    cr_assert_eq(len, cfx__msg_encoded_len(m));
    cr_assert_geq(len, CFX_PROTO_HDR_LEN);
    return len;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

Test(proto, task_frames_refuse_bad_fields)
{
    struct cfx_msg m;
    size_t len;

    sample_msg(CFX_MSG_TASK_SUBMIT, &m);
    m.u.task.ninputs = CFX_TASK_IO_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    sample_msg(CFX_MSG_TASK_SUBMIT, &m);
    len = encode_ok(&m);
    /* node count byte: after id, key, submitter, hint node, name, timeout,
     * cores, gpus, memory, flags, reserve, group */
    size_t at = CFX_PROTO_HDR_LEN + 8 + 8 + 4 + 4 + (CFX_TASK_NAME_MAX + 1) + 4 + 4 + 4 + 8 +
                1 + 4 + (CFX_TASK_GROUP_MAX + 1);
    cr_assert_eq(frame[at], 2);
    frame[at] = CFX_TASK_NODES_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame, len, &m), CFX_ERR_PROTO);
    frame[at] = 2;
    frame[at - 4 - (CFX_TASK_GROUP_MAX + 1) - 1] = 0x80; /* unknown flag */
    cr_assert_eq(cfx__msg_decode(frame, len, &m), CFX_ERR_PROTO);
    /* data placement is a query's flag, never a task's */
    frame[at - 4 - (CFX_TASK_GROUP_MAX + 1) - 1] = CFX_PROTO_TASK_DATA;
    cr_assert_eq(cfx__msg_decode(frame, len, &m), CFX_ERR_PROTO);
    sample_msg(CFX_MSG_TASK_PLACE, &m);
    m.u.task.flags = CFX_PROTO_TASK_DATA | CFX_PROTO_TASK_PACK;
    len = encode_ok(&m);
    struct cfx_msg d;
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(d.u.task.flags, CFX_PROTO_TASK_DATA | CFX_PROTO_TASK_PACK);
    sample_msg(CFX_MSG_TASK_DONE, &m);
    m.u.task_st.status = 5;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

Test(proto, roundtrip_every_type)
{
    for (uint8_t t = 1; t < CFX_MSG_TYPE_END; t++) {
        struct cfx_msg m, d;
        sample_msg(t, &m);
        size_t len = encode_ok(&m);
        int rc = cfx__msg_decode(frame, len, &d);
        cr_assert_eq(rc, CFX_OK, "decode %s: %s", cfx__msg_type_name(t), cfx_last_error());
        assert_msg_eq(&m, &d);
        cr_assert_str_neq(cfx__msg_type_name(t), "?");
    }
}

Test(proto, roundtrip_inline_limits)
{
    struct cfx_msg m, d;
    size_t len;
    /* 64 KiB exactly, in a put and in a lookup reply. */
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    m.u.put.size = CFX_OBJECT_INLINE_MAX;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    assert_msg_eq(&m, &d);

    sample_msg(CFX_MSG_LOOKUP_REPLY, &m);
    m.u.lookup_reply.is_inline = 1;
    m.u.lookup_reply.size = CFX_OBJECT_INLINE_MAX;
    m.u.lookup_reply.data = inline_data;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    assert_msg_eq(&m, &d);
    cr_assert_eq(cfx_test_check(d.u.lookup_reply.data, CFX_OBJECT_INLINE_MAX, 7), (size_t)-1);

    /* Zero bytes inline. */
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    m.u.put.size = 0;
    m.u.put.data = NULL;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    cr_assert_eq(d.u.put.has_data, 1);
    cr_assert_eq(d.u.put.size, 0);

    /* One byte over the limit cannot be encoded inline. */
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    m.u.put.size = CFX_OBJECT_INLINE_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);

    /* Durable: round trip, one flags byte; only inline objects can be durable. */
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    m.u.put.durable = 1;
    len = encode_ok(&m);
    cr_assert_eq(frame[CFX_PROTO_HDR_LEN + CFX_OBJECT_ID_LEN + 8 + 4],
                 CFX_PROTO_PUT_INLINE | CFX_PROTO_PUT_DURABLE);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    assert_msg_eq(&m, &d);
    m.u.put.has_data = 0;
    m.u.put.data = NULL;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

Test(proto, full_pages_fit_the_frame_limit)
{
    static struct cfx_node_rec nodes[CFX_PROTO_NODES_PAGE];
    static struct cfx_ctl_obj_rec objs[CFX_PROTO_OBJECTS_PAGE];
    struct cfx_msg m, d;
    size_t len;
    for (unsigned i = 0; i < CFX_PROTO_NODES_PAGE; i++)
        sample_node(&nodes[i], i + 1);
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_NODES_REPLY;
    m.u.page.count = CFX_PROTO_NODES_PAGE;
    m.u.page.recs_in = nodes;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    cr_assert_eq(d.u.page.count, CFX_PROTO_NODES_PAGE);
    struct cfx_node_rec last;
    cfx__msg_node_at(&d, CFX_PROTO_NODES_PAGE - 1, &last);
    assert_node_eq(&nodes[CFX_PROTO_NODES_PAGE - 1], &last);

    memset(objs, 0, sizeof(objs));
    m.type = CFX_MSG_OBJECTS_REPLY;
    m.u.page.count = CFX_PROTO_OBJECTS_PAGE;
    m.u.page.recs_in = objs;
    len = encode_ok(&m);
    cr_assert_leq(len, FRAME_MAX);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);

    /* A page over the limit is refused at encode time. */
    m.u.page.count = CFX_PROTO_OBJECTS_PAGE + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

Test(proto, truncated_at_every_length)
{
    for (uint8_t t = 1; t < CFX_MSG_TYPE_END; t++) {
        struct cfx_msg m, d;
        sample_msg(t, &m);
        size_t len = encode_ok(&m);
        for (size_t cut = 0; cut < len; cut++) {
            /* Copy so that reading past the cut would be caught by ASan/valgrind. */
            uint8_t *p = malloc(cut ? cut : 1);
            memcpy(p, frame, cut);
            int rc = cfx__msg_decode(p, cut, &d);
            free(p);
            cr_assert_eq(rc, CFX_ERR_PROTO, "%s cut at %zu of %zu: %s", cfx__msg_type_name(t),
                         cut, len, cfx_errname(rc));
        }
        /* The same cut, but with the header's length telling the truth. */
        if (len > CFX_PROTO_HDR_LEN) {
            for (size_t cut = CFX_PROTO_HDR_LEN; cut < len; cut++) {
                memcpy(frame2, frame, cut);
                put_u32(frame2 + 4, (uint32_t)(cut - CFX_PROTO_HDR_LEN));
                int rc = cfx__msg_decode(frame2, cut, &d);
                cr_assert_neq(rc, CFX_OK, "%s shortened to %zu decoded", cfx__msg_type_name(t),
                              cut);
            }
        }
    }
}

Test(proto, trailing_garbage)
{
    for (uint8_t t = 1; t < CFX_MSG_TYPE_END; t++) {
        struct cfx_msg m, d;
        sample_msg(t, &m);
        size_t len = encode_ok(&m);
        /* Bytes after the frame. */
        frame[len] = 0xAA;
        cr_assert_eq(cfx__msg_decode(frame, len + 1, &d), CFX_ERR_PROTO);
        /* Bytes inside the payload after the last field. */
        uint32_t plen = (uint32_t)(len - CFX_PROTO_HDR_LEN);
        put_u32(frame + 4, plen + 1);
        cr_assert_eq(cfx__msg_decode(frame, len + 1, &d), CFX_ERR_PROTO, "%s",
                     cfx__msg_type_name(t));
    }
}

/* A heartbeat's transport count and names are checked like every other
 * field: a peer cannot make the coordinator read past tp[]. */
Test(proto, heartbeat_report_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_HEARTBEAT, &m);
    size_t len = encode_ok(&m);
    /* ntp sits after load(4) mem(8) arena(8) tasks(4) */
    size_t ntp_at = CFX_PROTO_HDR_LEN + 24;
    cr_assert_eq(frame[ntp_at], 2);
    cr_assert_eq(len, CFX_PROTO_HDR_LEN + CFX_PROTO_LOAD_WIRE + 1 + 2 * CFX_PROTO_PROGRESS_WIRE +
                          1 + 2 * CFX_PROTO_PEER_WIRE + SAMPLE_PS_WIRE);
    memcpy(frame2, frame, len);
    frame2[ntp_at] = CFX_LOAD_TPS_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "transport count"), "%s", cfx_last_error());
    /* the first transport's name without its NUL */
    memcpy(frame2, frame, len);
    memset(frame2 + ntp_at + 1, 'x', CFX_TP_NAME_MAX);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "transport name"), "%s", cfx_last_error());
    /* all CFX_LOAD_TPS_MAX slots used round-trips */
    m.u.hb.load.ntp = CFX_LOAD_TPS_MAX;
    for (unsigned t = 2; t < CFX_LOAD_TPS_MAX; t++) {
        snprintf(m.u.hb.load.tp[t].name, sizeof(m.u.hb.load.tp[t].name), "tp%u", t);
        m.u.hb.load.tp[t].tx_bytes = UINT64_MAX - t;
        m.u.hb.load.tp[t].rx_bytes = t;
    }
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_load_eq(&m.u.hb.load, &d.u.hb.load);
}

/* A two-record count at @p count_at of the heartbeat in frame (@p len
 * bytes), tampered: over @p max (the error names @p what), more records than
 * the payload holds, fewer (one left over) -- each refused. */
static void count_bounds(size_t len, size_t count_at, unsigned max, const char *what)
{
    struct cfx_msg d;
    cr_assert_eq(frame[count_at], 2);
    memcpy(frame2, frame, len);
    frame2[count_at] = (uint8_t)(max + 1);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), what), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[count_at] = 3;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    frame2[count_at] = 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
}

/* The progress reports after a heartbeat's load: the count is capped at
 * CFX_CTL_PROGRESS_MAX and must agree with the payload, and no report
 * carries the "no report" marker.  A full heartbeat round-trips. */
Test(proto, heartbeat_progress_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_HEARTBEAT, &m);
    size_t len = encode_ok(&m);
    size_t count_at = CFX_PROTO_HDR_LEN + CFX_PROTO_LOAD_WIRE;
    size_t ready_at = count_at + 1 + CFX_OBJECT_ID_LEN; /* the first report's bytes */
    count_bounds(len, count_at, CFX_CTL_PROGRESS_MAX, "CFX_CTL_PROGRESS_MAX");
    memcpy(frame2, frame, len);
    memset(frame2 + ready_at, 0xff, 8);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "progress bytes"), "%s", cfx_last_error());

    m.u.hb.nprogress = CFX_CTL_PROGRESS_MAX;
    for (uint32_t i = 0; i < CFX_CTL_PROGRESS_MAX; i++) {
        sample_id(&m.u.hb.progress[i].id, (uint8_t)(100 + i));
        m.u.hb.progress[i].ready = (uint64_t)i << 33;
    }
    len = encode_ok(&m);
    cr_assert_eq(len, CFX_PROTO_HDR_LEN + CFX_PROTO_LOAD_WIRE + 1 +
                          CFX_CTL_PROGRESS_MAX * CFX_PROTO_PROGRESS_WIRE + 1 +
                          2 * CFX_PROTO_PEER_WIRE + SAMPLE_PS_WIRE);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&m, &d);
    /* the sender is held to the same bounds */
    m.u.hb.nprogress = CFX_CTL_PROGRESS_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    m.u.hb.nprogress = 1;
    m.u.hb.progress[0].ready = CFX_CTL_READY_UNKNOWN;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

/* The traffic per peer after the progress reports: the count is capped at
 * CFX_CTL_PEERS_MAX and must agree with the payload, and a record's
 * transport is one of the load's.  A full list round-trips. */
Test(proto, heartbeat_peer_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_HEARTBEAT, &m);
    size_t len = encode_ok(&m);
    size_t count_at = CFX_PROTO_HDR_LEN + CFX_PROTO_LOAD_WIRE + 1 + 2 * CFX_PROTO_PROGRESS_WIRE;
    size_t tp_at = count_at + 1 + 4; /* the first record's transport */
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&m, &d);
    count_bounds(len, count_at, CFX_CTL_PEERS_MAX, "CFX_CTL_PEERS_MAX");
    memcpy(frame2, frame, len);
    frame2[tp_at] = 2; /* the load names two transports */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "peer transport"), "%s", cfx_last_error());

    m.u.hb.npeers = CFX_CTL_PEERS_MAX;
    for (uint32_t i = 0; i < CFX_CTL_PEERS_MAX; i++)
        m.u.hb.peers[i] = (struct cfx_ctl_peer_traffic){ .peer = 1000 + i, .tp = (uint8_t)(i % 2),
                                                         .tx_bytes = UINT64_MAX - i,
                                                         .rx_bytes = (uint64_t)i << 40 };
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&m, &d);
    /* the sender is held to the same bounds */
    m.u.hb.npeers = CFX_CTL_PEERS_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    m.u.hb.npeers = 1;
    m.u.hb.peers[0].tp = 2;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

/* The parameter-server load after the peers: the server and block counts
 * are capped (CFX_CTL_PS_SERVERS_MAX, CFX_CTL_PS_BLOCKS_MAX) and must agree
 * with the payload, a job name is 1..CFX_CTL_PS_JOB_MAX bytes without a NUL,
 * a block names a listed server.  Full lists round-trip; the sender is held
 * to the same bounds. */
Test(proto, heartbeat_ps_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_HEARTBEAT, &m);
    size_t len = encode_ok(&m);
    size_t srv_at = len - SAMPLE_PS_WIRE; /* the server count */
    size_t job_at = srv_at + 1;           /* the first job name's length */
    size_t blk_at = len - 1 - 2 * CFX_PROTO_PS_BLOCK_WIRE; /* the block count */
    cr_assert_eq(frame[job_at], 5);
    count_bounds(len, srv_at, CFX_CTL_PS_SERVERS_MAX, "CFX_CTL_PS_SERVERS_MAX");
    count_bounds(len, blk_at, CFX_CTL_PS_BLOCKS_MAX, "CFX_CTL_PS_BLOCKS_MAX");
    memcpy(frame2, frame, len);
    frame2[job_at] = 0;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "PS job name length"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[job_at] = CFX_CTL_PS_JOB_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "PS job name length"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[job_at + 2] = 0;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "NUL"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[blk_at + 1] = 2; /* the first block's server: two are listed */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "does not list"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[blk_at + 1 + CFX_PROTO_PS_BLOCK_WIRE] = 0; /* the second block: server 0's */
    frame2[blk_at + 2 + CFX_PROTO_PS_BLOCK_WIRE] = 7; /* block 7 again (7 is 0x00000007) */
    frame2[blk_at + 3 + CFX_PROTO_PS_BLOCK_WIRE] = 0;
    frame2[blk_at + 4 + CFX_PROTO_PS_BLOCK_WIRE] = 0;
    frame2[blk_at + 5 + CFX_PROTO_PS_BLOCK_WIRE] = 0;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "PS block listed twice"), "%s", cfx_last_error());
    /* the second server as ("job-a", 0) again: same length, same index */
    struct cfx_msg twice;
    sample_msg(CFX_MSG_HEARTBEAT, &twice);
    twice.u.hb.ps.servers[1] = twice.u.hb.ps.servers[0];
    size_t tlen = encode_ok(&twice);
    cr_assert_eq(cfx__msg_decode(frame, tlen, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "PS server listed twice"), "%s", cfx_last_error());
    len = encode_ok(&m);

    /* full lists, the longest job names */
    struct cfx_ctl_ps_report *ps = &m.u.hb.ps;
    ps->nservers = CFX_CTL_PS_SERVERS_MAX;
    for (uint32_t i = 0; i < CFX_CTL_PS_SERVERS_MAX; i++) {
        memset(ps->servers[i].job, 'a' + (int)i, CFX_CTL_PS_JOB_MAX);
        ps->servers[i].job[CFX_CTL_PS_JOB_MAX] = '\0';
        ps->servers[i].server = 60 + i;
        ps->servers[i].blocks = 16384 - i;
        ps->servers[i].requests = UINT64_MAX - i;
        ps->servers[i].bytes = (uint64_t)i << 50;
    }
    ps->nblocks = CFX_CTL_PS_BLOCKS_MAX;
    for (uint32_t i = 0; i < CFX_CTL_PS_BLOCKS_MAX; i++)
        ps->blocks[i] = (struct cfx_ctl_ps_block){ .srv = (uint8_t)(i % CFX_CTL_PS_SERVERS_MAX),
                                                   .block = 1000 * i, .requests = i,
                                                   .bytes = UINT64_MAX - i };
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&m, &d);
    /* and in a PS_LOADS_REPLY */
    struct cfx_msg r = { .type = CFX_MSG_PS_LOADS_REPLY, .req_id = 5 };
    r.u.ps_loads.node_id = 77;
    r.u.ps_loads.ps = *ps;
    len = encode_ok(&r);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&r, &d);

    ps->nservers = CFX_CTL_PS_SERVERS_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    ps->nservers = CFX_CTL_PS_SERVERS_MAX;
    ps->nblocks = CFX_CTL_PS_BLOCKS_MAX + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    ps->nblocks = 1;
    ps->blocks[0].srv = CFX_CTL_PS_SERVERS_MAX;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
    ps->blocks[0].srv = 0;
    ps->servers[1].job[0] = '\0';
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

/* A listed holder's ready bytes never exceed the object's size (unless
 * "no report yet"), and a complete holder's are the size. */
Test(proto, holder_ready_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_OBJECTS_REPLY, &m);
    size_t len = encode_ok(&m);
    size_t holders_at = CFX_PROTO_HDR_LEN + 4 + 4 + 1 + CFX_OBJECT_ID_LEN + 8 + 4 + 1 + 4;
    size_t ready0 = holders_at + 4 + 1 + 4 + 4, ready1 = ready0 + CFX_PROTO_HOLDER_WIRE;
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    put_u32(frame2 + ready1, 1000001); /* partial, one byte over the size */
    memset(frame2 + ready1 + 4, 0, 4);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "ready bytes over"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    put_u32(frame2 + ready1, 1000000); /* partial with every byte: fine */
    memset(frame2 + ready1 + 4, 0, 4);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_OK, "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    put_u32(frame2 + ready0, 999999); /* complete, short */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "complete holder"), "%s", cfx_last_error());
}

/* A task page's records are checked like every field: state, status and
 * counts in range, the count agreeing with the payload. */
Test(proto, task_page_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_TASKS_REPLY, &m);
    size_t len = encode_ok(&m);
    cr_assert_eq(len, CFX_PROTO_HDR_LEN + 4 + 8 + 1 + 2 * CFX_PROTO_TASKREC_WIRE);
    size_t rec = CFX_PROTO_HDR_LEN + 13; /* the first record */
    size_t state_at = rec + 8 + 64, status_at = state_at + 1 + 12;
    size_t counts_at = status_at + 4 + 4 + 4 + 4 + 8;
    memcpy(frame2, frame, len);
    frame2[state_at] = 3;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "task state"), "%s", cfx_last_error());
    memcpy(frame2, frame, len);
    frame2[status_at] = 1; /* a positive status */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    frame2[counts_at] = CFX_TASK_IO_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "CFX_TASK_IO_MAX"), "%s", cfx_last_error());
    /* a count that disagrees with the payload */
    memcpy(frame2, frame, len);
    frame2[CFX_PROTO_HDR_LEN] = 3;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    /* over the page limit, whatever the payload */
    m.u.tpage.count = CFX_PROTO_TASKS_PAGE + 1;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

Test(proto, bad_header)
{
    struct cfx_msg m, d;
    struct cfx_msg_hdr h;
    sample_msg(CFX_MSG_HEARTBEAT, &m);
    size_t len = encode_ok(&m);
    cr_assert_eq(cfx__msg_hdr_decode(frame, len, &h), CFX_OK);
    cr_assert_eq(h.magic, CFX_PROTO_MAGIC);
    cr_assert_eq(h.type, CFX_MSG_HEARTBEAT);
    cr_assert_eq(h.req_id, m.req_id);

    memcpy(frame2, frame, len);
    frame2[0] ^= 0xff; /* magic */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    cr_assert(strstr(cfx_last_error(), "magic"));

    memcpy(frame2, frame, len);
    frame2[2] = CFX_PROTO_VERSION + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_VERSION);
    frame2[2] = 0;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_VERSION);

    const uint8_t bad_types[] = { 0, CFX_MSG_TYPE_END, 200, 255 };
    for (unsigned i = 0; i < sizeof(bad_types); i++) {
        memcpy(frame2, frame, len);
        frame2[3] = bad_types[i];
        cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
        cr_assert_eq(cfx__msg_hdr_decode(frame2, len, &h), CFX_ERR_PROTO);
    }

    const uint32_t huge[] = { CFX_PROTO_MAX_PAYLOAD + 1, 0x7fffffffu, 0xffffffffu };
    for (unsigned i = 0; i < 3; i++) {
        memcpy(frame2, frame, len);
        put_u32(frame2 + 4, huge[i]);
        cr_assert_eq(cfx__msg_hdr_decode(frame2, len, &h), CFX_ERR_TOO_BIG);
        cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_TOO_BIG);
    }
    cr_assert_eq(cfx__msg_hdr_decode(frame, CFX_PROTO_HDR_LEN - 1, &h), CFX_ERR_PROTO);
    cr_assert_eq(cfx__msg_decode(NULL, 0, &d), CFX_ERR_PROTO);
}

/* Offset of the payload in a frame. */
#define PL(f) ((f) + CFX_PROTO_HDR_LEN)

Test(proto, absurd_counts_and_lengths)
{
    struct cfx_msg m, d;
    size_t len;

    /* Lookup excluding 2^32-1 nodes, and one more than the limit. */
    sample_msg(CFX_MSG_OBJ_LOOKUP, &m);
    len = encode_ok(&m);
    put_u32(PL(frame) + CFX_OBJECT_ID_LEN + 4, 0xffffffffu);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    put_u32(PL(frame) + CFX_OBJECT_ID_LEN + 4, CFX_PROTO_EXCLUDE_MAX + 1);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);

    /* Listing pages with absurd or inconsistent counts. */
    sample_msg(CFX_MSG_NODES_REPLY, &m);
    len = encode_ok(&m);
    const uint32_t counts[] = { 0xffffffffu, CFX_PROTO_NODES_PAGE + 1, 4, 2, 0 };
    for (unsigned i = 0; i < 5; i++) {
        memcpy(frame2, frame, len);
        put_u32(PL(frame2), counts[i]);
        cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO, "count %u", counts[i]);
    }
    sample_msg(CFX_MSG_OBJECTS_REPLY, &m);
    len = encode_ok(&m);
    put_u32(PL(frame), 0x80000000u);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);

    /* Inline length that disagrees with the size, or is over 64 KiB. */
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    len = encode_ok(&m);
    size_t inl = CFX_OBJECT_ID_LEN + 8 + 4 + 1;
    memcpy(frame2, frame, len);
    put_u32(PL(frame2) + inl, 999);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    put_u32(PL(frame2) + inl, 0xffffffffu);
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    /* put flags: durable without inline data (2), unknown bits (4, 0x80) */
    memcpy(frame2, frame, len);
    PL(frame2)[inl - 1] = 2;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[inl - 1] = CFX_PROTO_PUT_INLINE | 4;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[inl - 1] = CFX_PROTO_PUT_INLINE | CFX_PROTO_PUT_DURABLE | 0x80;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[inl - 1] = CFX_PROTO_PUT_INLINE | CFX_PROTO_PUT_DURABLE;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_OK);
    cr_assert_eq(d.u.put.durable, 1);
    cr_assert_eq(d.u.put.has_data, 1);

    /* Node record with a transport address longer than its field / too many addresses. */
    sample_msg(CFX_MSG_JOIN, &m);
    len = encode_ok(&m);
    size_t naddr_off = 4 + 4 + CFX_NODE_NAME_MAX + CFX_HOST_ID_MAX + 48 + 1 + 4;
    memcpy(frame2, frame, len);
    PL(frame2)[naddr_off] = CFX_NODE_ADDRS_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[naddr_off + 1 + CFX_TP_NAME_MAX] = CFX_TP_ADDR_MAX + 1;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[naddr_off - 5] = 7; /* alive flag must be 0 or 1 */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);

    /* Error text length beyond the payload and beyond its limit; bad status. */
    sample_msg(CFX_MSG_ERROR, &m);
    len = encode_ok(&m);
    memcpy(frame2, frame, len);
    PL(frame2)[4] = 0xff;
    PL(frame2)[5] = 0xff;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    put_u32(PL(frame2), 5); /* positive status */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    put_u32(PL(frame2), 0); /* CFX_OK is not an error */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    memcpy(frame2, frame, len);
    PL(frame2)[8] = 0; /* NUL inside the text */
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);

    /* Unknown role; node id 0 where it is forbidden. */
    sample_msg(CFX_MSG_AUTH, &m);
    len = encode_ok(&m);
    PL(frame)[0] = 9;
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    sample_msg(CFX_MSG_EV_NODE_DEAD, &m);
    m.u.node_dead.node_id = 0;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    sample_msg(CFX_MSG_JOIN_REPLY, &m);
    m.u.join_reply.node_id = 0;
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
}

Test(proto, unterminated_strings)
{
    struct cfx_msg m, d;
    size_t len;
    const size_t fields[][2] = {
        { 8, CFX_NODE_NAME_MAX },                                   /* name */
        { 8 + CFX_NODE_NAME_MAX, CFX_HOST_ID_MAX },                 /* host id */
        { 8 + CFX_NODE_NAME_MAX + CFX_HOST_ID_MAX, 48 },            /* ctl addr */
        { 8 + CFX_NODE_NAME_MAX + CFX_HOST_ID_MAX + 48 + 6, CFX_TP_NAME_MAX }, /* tp[0] */
    };
    sample_msg(CFX_MSG_JOIN, &m);
    len = encode_ok(&m);
    for (unsigned i = 0; i < 4; i++) {
        memcpy(frame2, frame, len);
        memset(PL(frame2) + fields[i][0], 'A', fields[i][1]);
        cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO, "field %u", i);
        /* Filling all but the last byte is fine. */
        memcpy(frame2, frame, len);
        memset(PL(frame2) + fields[i][0], 'A', fields[i][1] - 1);
        cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_OK, "field %u: %s", i,
                     cfx_last_error());
    }
    sample_msg(CFX_MSG_STATUS_REPLY, &m);
    len = encode_ok(&m);
    memset(frame + len - 8 - 32, 'v', 32); /* the version, before the two index counts */
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);

    /* Encoding truncates an over-long string instead of overrunning. */
    sample_msg(CFX_MSG_JOIN, &m);
    memset(m.u.join.name, 'n', sizeof(m.u.join.name));
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    cr_assert_eq(strlen(d.u.join.name), CFX_NODE_NAME_MAX - 1);
}

Test(proto, random_bytes_never_decode_wrongly)
{
    /* A small in-test fuzzer: valid headers over random payloads of every
     * type, and fully random buffers.  Nothing may crash; whatever decodes
     * must re-encode to the same length. */
    uint64_t seed = 12345;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t type = (uint8_t)(1 + iter % (CFX_MSG_TYPE_END - 1));
        size_t plen = (size_t)(iter * 37) % 800;
        cfx_test_fill(frame2, CFX_PROTO_HDR_LEN + plen, seed++);
        frame2[0] = CFX_PROTO_MAGIC & 0xff;
        frame2[1] = CFX_PROTO_MAGIC >> 8;
        frame2[2] = CFX_PROTO_VERSION;
        frame2[3] = type;
        put_u32(frame2 + 4, (uint32_t)plen);
        struct cfx_msg d;
        int rc = cfx__msg_decode(frame2, CFX_PROTO_HDR_LEN + plen, &d);
        cr_assert(rc == CFX_OK || rc == CFX_ERR_PROTO, "rc %d", rc);
        if (rc == CFX_OK && type != CFX_MSG_NODES_REPLY && type != CFX_MSG_OBJECTS_REPLY)
            cr_assert_eq(cfx__msg_encoded_len(&d), CFX_PROTO_HDR_LEN + plen, "type %s",
                         cfx__msg_type_name(type));
    }
    for (int iter = 0; iter < 5000; iter++) {
        size_t n = (size_t)iter % 200;
        cfx_test_fill(frame2, n, seed++);
        struct cfx_msg d;
        int rc = cfx__msg_decode(frame2, n, &d);
        cr_assert_neq(rc, CFX_OK);
    }
}

/* Host name and flags travel in node records; unknown flags are refused. */
Test(proto, node_host_and_flags)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_JOIN, &m);
    size_t len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_str_eq(d.u.join.host, "gpu-node-3.example");
    cr_assert_eq(d.u.join.flags, CFX_NODE_F_OBSERVER);
    /* the flags byte ends the record */
    PL(frame)[len - CFX_PROTO_HDR_LEN - 1] = 0x80;
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    /* an unterminated host name */
    len = encode_ok(&m);
    memset(PL(frame) + len - CFX_PROTO_HDR_LEN - 1 - CFX_HOST_NAME_MAX, 'h', CFX_HOST_NAME_MAX);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
}

/* An object's name travels with its put: bounded, without NUL, optional. */
Test(proto, put_name_bounds)
{
    struct cfx_msg m, d;
    sample_msg(CFX_MSG_OBJ_PUT, &m);
    m.u.put.has_data = 0;
    m.u.put.data = NULL;
    snprintf(m.u.put.name, sizeof(m.u.put.name), "run/cfg");
    size_t len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_str_eq(d.u.put.name, "run/cfg");
    size_t name_at = CFX_PROTO_HDR_LEN + CFX_OBJECT_ID_LEN + 8 + 4 + 1; /* length byte */
    cr_assert_eq(frame[name_at], 7);
    /* NUL inside */
    memcpy(frame2, frame, len);
    frame2[name_at + 3] = 0;
    cr_assert_eq(cfx__msg_decode(frame2, len, &d), CFX_ERR_PROTO);
    /* length 0 with the flag, or over the limit */
    memcpy(frame2, frame, len);
    frame2[name_at] = 0;
    cr_assert_neq(cfx__msg_decode(frame2, len, &d), CFX_OK);
    memcpy(frame2, frame, len);
    frame2[name_at] = CFX_OBJ_NAME_MAX + 1;
    cr_assert_neq(cfx__msg_decode(frame2, len, &d), CFX_OK);
    /* a name at the limit round-trips; the encoder cuts a longer one */
    memset(m.u.put.name, 'x', CFX_OBJ_NAME_MAX);
    m.u.put.name[CFX_OBJ_NAME_MAX] = '\0';
    len = encode_ok(&m);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(strlen(d.u.put.name), CFX_OBJ_NAME_MAX);
    /* no name: no flag, no bytes */
    m.u.put.name[0] = '\0';
    len = encode_ok(&m);
    cr_assert_eq(len, name_at);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK);
    cr_assert_str_empty(d.u.put.name);
}

/* A put's tag and a copy's putter (CFX_PROTO_PUT_TAGGED, CFX_PROTO_PUT_COPY)
 * round-trip; a copy is never inline or durable, its putter never 0. */
Test(proto, put_tag_and_copy)
{
    struct cfx_msg m, d;
    size_t len;
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_PUT;
    m.req_id = 5;
    sample_id(&m.u.put.id, 8);
    m.u.put.size = 1u << 20;
    m.u.put.chunk_size = 1u << 18;
    m.u.put.tag = 0x1234567890ull;
    m.u.put.copy = 1;
    m.u.put.putter = 42;
    len = encode_ok(&m);
    cr_assert_eq(frame[CFX_PROTO_HDR_LEN + CFX_OBJECT_ID_LEN + 8 + 4],
                 CFX_PROTO_PUT_TAGGED | CFX_PROTO_PUT_COPY);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_OK, "%s", cfx_last_error());
    assert_msg_eq(&m, &d);
    /* putter 0 on the wire */
    memset(frame + len - 4, 0, 4);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    /* tag 0 on the wire with the flag */
    m.u.put.copy = 0;
    m.u.put.putter = 0;
    len = encode_ok(&m);
    memset(frame + len - 8, 0, 8);
    cr_assert_eq(cfx__msg_decode(frame, len, &d), CFX_ERR_PROTO);
    /* a copy cannot carry inline bytes */
    m.u.put.copy = 1;
    m.u.put.putter = 42;
    m.u.put.has_data = 1;
    m.u.put.size = 0;
    cr_assert_eq(cfx__msg_encode(&m, frame, FRAME_MAX, &len), CFX_ERR_INVALID);
}

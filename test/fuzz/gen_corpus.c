/*
 * Writes the fuzzers' seed corpora from the real encoders and structs:
 *
 *   fuzz_gen_corpus DIR     (DIR/fuzz_proto/, DIR/fuzz_dp_msg/, ...)
 *
 * The files are small and checked in under test/fuzz/corpus/; run this again
 * after a wire format changes.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <conflux/status.h>

#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/dpdk/dpdk_io.h"
#include "dataplane/engine/engine.h"
#include "dataplane/shm/shm.h"
#include "dataplane/tcp/tcp.h"

static const char *root;

static void put(const char *target, const char *name, const void *buf, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static size_t enc(const struct cfx_msg *m, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    if (cfx__msg_encode(m, buf, cap, &len) != CFX_OK) {
        fprintf(stderr, "encode %s: %s\n", cfx__msg_type_name(m->type), cfx_last_error());
        exit(1);
    }
    return len;
}

static void node(struct cfx_node_rec *n, uint32_t id)
{
    memset(n, 0, sizeof(*n));
    n->node_id = id;
    n->pid = 4242;
    snprintf(n->name, sizeof(n->name), "host:%u", id);
    snprintf(n->host_id, sizeof(n->host_id), "boot/net");
    snprintf(n->ctl_addr, sizeof(n->ctl_addr), "127.0.0.1:40000");
    n->alive = 1;
    n->naddr = 2;
    snprintf(n->addr[0].tp, sizeof(n->addr[0].tp), "tcp");
    n->addr[0].len = 16;
    memcpy(n->addr[0].addr, "127.0.0.1:41000", 16);
    snprintf(n->addr[1].tp, sizeof(n->addr[1].tp), "shm");
    n->addr[1].len = 10;
    memcpy(n->addr[1].addr, "@cfx-shm-1", 10);
}

/* An inline put of @p len bytes at @p data under the id of bytes @p idb. */
static void put_inline_msg(struct cfx_msg *m, uint32_t req_id, uint8_t idb, uint8_t *data,
                           size_t len)
{
    memset(m, 0, sizeof(*m));
    m->type = CFX_MSG_OBJ_PUT;
    m->req_id = req_id;
    memset(m->u.put.id.bytes, idb, sizeof(m->u.put.id.bytes));
    m->u.put.size = len;
    m->u.put.chunk_size = 65536;
    m->u.put.has_data = 1;
    m->u.put.data = data;
}

static void proto(void)
{
    static uint8_t buf[1u << 17];
    uint8_t data[100];
    struct cfx_msg m;
    size_t len, l2;

    for (unsigned i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)i;

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_CHALLENGE;
    memset(m.u.challenge.nonce, 0x11, sizeof(m.u.challenge.nonce));
    m.u.challenge.secure = 2; /* CFX_SECURE=encrypt (control protocol 7) */
    put("fuzz_proto", "challenge", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_AUTH;
    m.req_id = 1;
    memset(m.u.auth.nonce, 0x22, sizeof(m.u.auth.nonce));
    memset(m.u.auth.mac, 0x33, sizeof(m.u.auth.mac));
    m.u.auth.secure = 1; /* integrity */
    put("fuzz_proto", "auth", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_JOIN;
    m.req_id = 2;
    node(&m.u.join, 0);
    put("fuzz_proto", "join", buf, enc(&m, buf, sizeof(buf)));

    put_inline_msg(&m, 3, 0xab, data, sizeof(data));
    put("fuzz_proto", "put_inline", buf, enc(&m, buf, sizeof(buf)));
    m.u.put.durable = 1;
    put("fuzz_proto", "put_durable", buf, enc(&m, buf, sizeof(buf)));
    m.u.put.durable = 0;
    snprintf(m.u.put.name, sizeof(m.u.put.name), "model/weights");
    put("fuzz_proto", "put_named", buf, enc(&m, buf, sizeof(buf)));
    m.u.put.has_data = 0;
    m.u.put.data = NULL;
    m.u.put.tag = 0x1234;
    put("fuzz_proto", "put_tagged", buf, enc(&m, buf, sizeof(buf)));
    m.u.put.copy = 1;
    m.u.put.putter = 9;
    put("fuzz_proto", "put_copy", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_LOOKUP;
    m.req_id = 4;
    memset(m.u.lookup.id.bytes, 0xab, sizeof(m.u.lookup.id.bytes));
    m.u.lookup.timeout_ms = 1000;
    m.u.lookup.nexclude = 2;
    m.u.lookup.exclude[0] = 3;
    m.u.lookup.exclude[1] = 7;
    m.u.lookup.want = 3; /* extra sources for a striped get */
    put("fuzz_proto", "lookup", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_LOOKUP_REPLY;
    m.req_id = 4;
    m.u.lookup_reply.size = 1u << 24;
    m.u.lookup_reply.chunk_size = 1u << 20;
    m.u.lookup_reply.complete = 1;
    node(&m.u.lookup_reply.node, 5);
    m.u.lookup_reply.putter = 5;
    m.u.lookup_reply.tag = 77;
    m.u.lookup_reply.nextra = 2;
    m.u.lookup_reply.extra[0] = 6;
    m.u.lookup_reply.extra[1] = 8;
    put("fuzz_proto", "lookup_reply", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_EV_OBJ_GONE;
    m.req_id = 11;
    memset(m.u.gone.id.bytes, 0xab, sizeof(m.u.gone.id.bytes));
    put("fuzz_proto", "ev_obj_gone", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_OBJ_GONE_ACK;
    put("fuzz_proto", "obj_gone_ack", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_DELETE; /* protocol 12: the end flag; 13: put_below */
    m.req_id = 12;
    memset(m.u.del.id.bytes, 0xcd, sizeof(m.u.del.id.bytes));
    m.u.del.end = 1;
    m.u.del.put_below = 77;
    put("fuzz_proto", "obj_delete", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_ERROR;
    m.req_id = 5;
    m.u.error.status = CFX_ERR_NOT_FOUND;
    snprintf(m.u.error.text, sizeof(m.u.error.text), "no such object");
    len = enc(&m, buf, sizeof(buf));
    put("fuzz_proto", "error", buf, len);

    /* two frames back to back: the stream framing */
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_EV_NODE_DEAD;
    m.u.node_dead.node_id = 9;
    l2 = enc(&m, buf + len, sizeof(buf) - len);
    put("fuzz_proto", "stream_error_then_dead", buf, len + l2);

    struct cfx_node_rec nrec[2];
    node(&nrec[0], 1);
    node(&nrec[1], 2);
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_NODES_REPLY;
    m.req_id = 6;
    m.u.page.count = 2;
    m.u.page.next = 2;
    m.u.page.recs_in = nrec;
    put("fuzz_proto", "nodes_reply", buf, enc(&m, buf, sizeof(buf)));

    struct cfx_ctl_obj_rec orec;
    memset(&orec, 0, sizeof(orec));
    orec.size = 1u << 20;
    orec.chunk_size = 1u << 16;
    orec.nholders = 3;
    orec.holders[0].node_id = 1;
    orec.holders[0].complete = 1;
    orec.holders[0].ready = orec.size;
    orec.holders[1].node_id = 2;        /* partial, fed by 1, reported 192 KiB */
    orec.holders[1].src = 1;
    orec.holders[1].ready = 3u << 16;
    orec.holders[2].node_id = 3;        /* partial, no report yet */
    orec.holders[2].src = 2;
    orec.holders[2].ready = CFX_CTL_READY_UNKNOWN;
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJECTS_REPLY;
    m.req_id = 7;
    m.u.page.count = 1;
    m.u.page.recs_in = &orec;
    put("fuzz_proto", "objects_reply", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_STATUS_REPLY;
    m.req_id = 8;
    m.u.status.proto_version = CFX_PROTO_VERSION;
    m.u.status.heartbeat_ms = 250;
    snprintf(m.u.status.version, sizeof(m.u.status.version), "0.1.0");
    put("fuzz_proto", "status_reply", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_HEARTBEAT;
    m.u.hb.load.load_milli = 1500;
    m.u.hb.load.mem_avail = 1ull << 33;
    m.u.hb.load.arena_used = 1ull << 20;
    m.u.hb.load.tasks_running = 2;
    m.u.hb.load.ntp = 2;
    snprintf(m.u.hb.load.tp[0].name, sizeof(m.u.hb.load.tp[0].name), "shm");
    m.u.hb.load.tp[0].tx_bytes = 1ull << 32;
    m.u.hb.load.tp[0].rx_bytes = 12345;
    snprintf(m.u.hb.load.tp[1].name, sizeof(m.u.hb.load.tp[1].name), "tcp");
    m.u.hb.load.tp[1].tx_bytes = 777;
    m.u.hb.load.uploads_active = 1;
    m.u.hb.load.xfers_in_active = 2;
    m.u.hb.load.gets = 40;
    m.u.hb.load.link_bw = 117000000;
    m.u.hb.load.link_lat_ns = 90000;
    m.u.hb.nprogress = 2;
    memset(m.u.hb.progress[0].id.bytes, 0x61, CFX_OBJECT_ID_LEN);
    m.u.hb.progress[0].ready = 12u << 20;
    memset(m.u.hb.progress[1].id.bytes, 0x62, CFX_OBJECT_ID_LEN);
    m.u.hb.progress[1].ready = 0;
    m.u.hb.npeers = 1;
    m.u.hb.peers[0] = (struct cfx_ctl_peer_traffic){ .peer = 3, .tp = 1, .tx_bytes = 4096,
                                                     .rx_bytes = 512 };
    struct cfx_ctl_ps_report *ps = &m.u.hb.ps;
    ps->nservers = 2;
    ps->servers[0] = (struct cfx_ctl_ps_server){ .job = "train", .server = 0, .blocks = 3,
                                                 .requests = 50, .bytes = 3200 };
    ps->servers[1] = (struct cfx_ctl_ps_server){ .job = "eval", .server = 2, .blocks = 1,
                                                 .requests = 1, .bytes = 64 };
    ps->nblocks = 3;
    ps->blocks[0] = (struct cfx_ctl_ps_block){ .srv = 0, .block = 40, .requests = 5,
                                               .bytes = 320 };
    ps->blocks[1] = (struct cfx_ctl_ps_block){ .srv = 0, .block = 0, .requests = 1, .bytes = 64 };
    ps->blocks[2] = (struct cfx_ctl_ps_block){ .srv = 1, .block = 7, .requests = 1, .bytes = 64 };
    put("fuzz_proto", "heartbeat", buf, enc(&m, buf, sizeof(buf)));
    struct cfx_ctl_ps_report rep = *ps;

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_PS_LOADS;
    m.req_id = 14;
    m.u.ps_cursor = 2;
    put("fuzz_proto", "ps_loads", buf, enc(&m, buf, sizeof(buf)));
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_PS_LOADS_REPLY;
    m.req_id = 14;
    m.u.ps_loads.node_id = 3;
    m.u.ps_loads.more = 1;
    m.u.ps_loads.ps = rep;
    put("fuzz_proto", "ps_loads_reply", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_TASKS;
    m.req_id = 13;
    m.u.task_cursor = 5;
    put("fuzz_proto", "tasks", buf, enc(&m, buf, sizeof(buf)));
    static struct cfx_ctl_task_rec trec[2];
    for (int i = 0; i < 2; i++) {
        trec[i].id = 6 + (uint64_t)i;
        snprintf(trec[i].name, sizeof(trec[i].name), "square");
        trec[i].state = (uint8_t)(i ? CFX_CTL_TASK_DONE : CFX_CTL_TASK_PLACED);
        trec[i].node_id = 2;
        trec[i].submitter = 1;
        trec[i].placements = 1;
        trec[i].status = i ? CFX_ERR_PEER_FAILED : 0;
        trec[i].nresults = 1;
        snprintf(trec[i].text, sizeof(trec[i].text), "%s", i ? "node 2 died" : "");
    }
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_TASKS_REPLY;
    m.req_id = 13;
    m.u.tpage.count = 2;
    m.u.tpage.next = 7;
    m.u.tpage.recs_in = trec;
    put("fuzz_proto", "tasks_reply", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_TASK_REG;
    m.req_id = 9;
    snprintf(m.u.task_reg.name, sizeof(m.u.task_reg.name), "square");
    m.u.task_reg.cores = 4;
    m.u.task_reg.memory = 1ull << 30;
    put("fuzz_proto", "task_reg", buf, enc(&m, buf, sizeof(buf)));

    static const uint8_t targ[] = "argument";
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_TASK_SUBMIT;
    m.req_id = 10;
    m.u.task.key = 0x5eed5eed00000001ull;
    snprintf(m.u.task.name, sizeof(m.u.task.name), "square");
    m.u.task.timeout_ms = 5000;
    m.u.task.cores = 1;
    snprintf(m.u.task.group, sizeof(m.u.task.group), "shard");
    m.u.task.nnodes = 2;
    m.u.task.nodes[0] = 1;
    m.u.task.nodes[1] = 2;
    m.u.task.ninputs = 1;
    memset(m.u.task.inputs[0].bytes, 0x11, CFX_OBJECT_ID_LEN);
    m.u.task.nresults = 1;
    memset(m.u.task.results[0].bytes, 0x22, CFX_OBJECT_ID_LEN);
    m.u.task.arg = targ;
    m.u.task.arg_len = sizeof(targ);
    put("fuzz_proto", "task_submit", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_EV_TASK_RUN;
    m.req_id = 0;
    m.u.task.task_id = 3;
    m.u.task.submitter = 4;
    put("fuzz_proto", "ev_task_run", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_TASK_ANNOUNCE;
    m.req_id = 13;
    put("fuzz_proto", "task_announce", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_TASK_SUBMIT;
    m.req_id = 14;
    m.u.task.submitter = 0;
    m.u.task.hint_node = 2;
    m.u.task.flags = CFX_PROTO_TASK_AGAIN;
    put("fuzz_proto", "task_submit_again", buf, enc(&m, buf, sizeof(buf)));
    m.u.task.hint_node = 0;
    m.u.task.flags = 0;
    m.type = CFX_MSG_TASK_PLACE;
    m.req_id = 11;
    m.u.task.task_id = 0;
    m.u.task.key = 0;
    m.u.task.flags = CFX_PROTO_TASK_PACK;
    m.u.task.reserve_ms = 500;
    put("fuzz_proto", "task_place", buf, enc(&m, buf, sizeof(buf)));

    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_TASK_DONE;
    m.req_id = 12;
    m.u.task_st.task_id = 3;
    m.u.task_st.node_id = 2;
    m.u.task_st.status = CFX_ERR_PEER_FAILED;
    snprintf(m.u.task_st.text, sizeof(m.u.task_st.text), "node 2 died");
    put("fuzz_proto", "task_done", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_TASK_REPLY;
    m.u.task_st.status = 0;
    m.u.task_st.text[0] = '\0';
    put("fuzz_proto", "task_reply", buf, enc(&m, buf, sizeof(buf)));
    m.type = CFX_MSG_TASK_WAIT;
    m.u.task_st.timeout_ms = 1000;
    put("fuzz_proto", "task_wait", buf, enc(&m, buf, sizeof(buf)));
}

/* A data-plane seed: the wire bytes of host-form @p msg (dp_msg.c). */
/* Sealed control frames (fuzz_ctl_seal): a mode byte, a u16 tamper, then
 * plain frames an honest sender seals, or the wire bytes themselves. */
static void ctl_seal(void)
{
    /* the keys of fuzz_ctl_seal.c: token, nonces, role */
    static const uint8_t ns[CFX_AUTH_NONCE_LEN] = { 1, 2, 3, 4 }, nc[CFX_AUTH_NONCE_LEN] = { 5, 6 };
    static uint8_t plain[4096], wire[4096], in[4096];
    uint8_t data[40];
    struct cfx_msg m;
    size_t n = 0, w = 0;

    for (unsigned i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_LOOKUP;
    m.req_id = 4;
    memset(m.u.lookup.id.bytes, 0xab, sizeof(m.u.lookup.id.bytes));
    m.u.lookup.timeout_ms = 1000;
    n += enc(&m, plain + n, sizeof(plain) - n);
    put_inline_msg(&m, 5, 0xcd, data, sizeof(data));
    n += enc(&m, plain + n, sizeof(plain) - n);
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_LEAVE;
    n += enc(&m, plain + n, sizeof(plain) - n);

    for (uint8_t mode = 0; mode < 4; mode++) {
        static const char *names[] = { "honest_integrity", "honest_encrypt",
                                       "honest_integrity_coord", "honest_encrypt_coord" };
        in[0] = mode;
        in[1] = in[2] = 0;
        memcpy(in + 3, plain, n);
        put("fuzz_ctl_seal", names[mode], in, 3 + n);
    }
    in[0] = 1;
    in[1] = 8 * 20 + 1; /* bit 0 of the first frame's payload byte 4 */
    in[2] = 0;
    put("fuzz_ctl_seal", "tampered", in, 3 + n);

    /* what the client puts on the wire, sealed with the same keys */
    struct cfx_ctl_seal s = { 0 };
    if (cfx__ctl_seal_start(&s, CFX_SEAL_ENCRYPT, "fuzz-token", ns, nc, 1, true) != CFX_OK) {
        fprintf(stderr, "seal start: %s\n", cfx_last_error());
        exit(1);
    }
    for (size_t off = 0; off < n;) {
        struct cfx_msg_hdr h;
        size_t wl;
        cfx__msg_hdr_decode(plain + off, n - off, &h);
        size_t len = CFX_PROTO_HDR_LEN + h.payload_len;
        memcpy(wire + w, plain + off, len);
        if (cfx__ctl_seal_frame(&s, wire + w, len, len + CFX_SEAL_TAG_LEN, &wl) != CFX_OK) {
            fprintf(stderr, "seal: %s\n", cfx_last_error());
            exit(1);
        }
        off += len;
        w += wl;
    }
    cfx__ctl_seal_stop(&s);
    in[0] = 4 | 1;
    memcpy(in + 3, wire, w);
    put("fuzz_ctl_seal", "wire_encrypt", in, 3 + w);
    /* a sealed header whose payload_len is shorter than the tag */
    memcpy(in + 3, plain, CFX_PROTO_HDR_LEN);
    in[3 + 4] = CFX_SEAL_TAG_LEN - 1;
    in[3 + 5] = in[3 + 6] = in[3 + 7] = 0;
    put("fuzz_ctl_seal", "wire_short", in, 3 + CFX_PROTO_HDR_LEN);
}

/* A state-directory record (fuzz_coord_state): a mode byte, then the file:
 * "CFXSTAT1", u64 version, u32 key_len, u32 val_len, key, value, u64 FNV-1a
 * of all before it (control/coord_state.c). */
static void state_rec(const char *name, uint8_t mode, const char *key, const void *val, size_t vlen)
{
    static uint8_t b[1 + 24 + 64 + 256 + 8];
    size_t klen = strlen(key), n = 1;
    uint64_t h = 0xcbf29ce484222325ull;

    b[0] = mode;
    memcpy(b + n, "CFXSTAT1", 8);
    n += 8;
    for (int i = 0; i < 8; i++)
        b[n++] = (uint8_t)(i == 0 ? 3 : 0); /* version 3 */
    for (int i = 0; i < 4; i++)
        b[n++] = (uint8_t)(klen >> (8 * i));
    for (int i = 0; i < 4; i++)
        b[n++] = (uint8_t)(vlen >> (8 * i));
    memcpy(b + n, key, klen);
    n += klen;
    memcpy(b + n, val, vlen);
    n += vlen;
    for (size_t i = 1; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    for (int i = 0; i < 8; i++)
        b[n++] = (uint8_t)(h >> (8 * i));
    put("fuzz_coord_state", name, b, n);
}

static void coord_state(void)
{
    uint8_t ids[4] = { 0x40, 0x1f, 0, 0 }, obj[1 + 20 + 4 + 8 + 4 + 16] = { 1 };

    state_rec("node_ids", 1, "coord.node_ids", ids, sizeof(ids));
    memset(obj + 1, 0xab, 20);
    obj[21] = 7;  /* putter */
    obj[25] = 16; /* size */
    obj[35] = 1;  /* chunk size 65536 */
    memset(obj + 37, 0x5a, 16);
    state_rec("durable_obj", 1 | 2, "obj.abababababababababababababababababababab", obj,
              sizeof(obj));
    state_rec("other_name", 0, "coord.node_ids", ids, sizeof(ids));
}

/* The metrics endpoint's request head (fuzz_metrics_req): reads, each a
 * length byte and its bytes. */
static void metrics_req(const char *name, const char *const *reads, int n)
{
    uint8_t b[512];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(reads[i]);
        b[len++] = (uint8_t)l;
        memcpy(b + len, reads[i], l);
        len += l;
    }
    put("fuzz_metrics_req", name, b, len);
}

static void metrics(void)
{
    static const char *const get[] = {
        "GET /metrics HTTP/1.1\r\nHost: coord:9464\r\nUser-Agent: Prometheus/2.45.0\r\n"
        "Accept: text/plain\r\n\r\n"
    };
    static const char *const head[] = { "HEAD /metrics?job=conflux HTTP/1.0\r\n\r\n" };
    static const char *const split[] = { "GE", "T /met", "rics HTTP/1.1\r\n", "Host: x\r\n",
                                         "\r\n" };
    static const char *const post[] = { "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n" };
    static const char *const lf[] = { "GET / HTTP/1.1\n\n" };

    metrics_req("get", get, 1);
    metrics_req("head_query", head, 1);
    metrics_req("split", split, 5);
    metrics_req("post", post, 1);
    metrics_req("lf_other_path", lf, 1);
}

static void put_dp(const char *name, const void *msg, size_t len)
{
    static uint8_t wire[CFX_TP_SEND_MAX];
    int n = cfx__dp_msg_encode(msg, len, wire, sizeof(wire));
    if (n < 0) {
        fprintf(stderr, "gen_corpus: seed %s does not encode\n", name);
        exit(1);
    }
    put("fuzz_dp_msg", name, wire, (size_t)n);
}

static void dp(void)
{
    struct cfx_dp_hello h = { .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_HELLO, 0 },
                              .node_id = 3 };
    memset(h.nonce, 0x44, sizeof(h.nonce));
    put_dp("hello", &h, sizeof(h));

    /* the handshake's three AUTHs (conn_auth.c): the acceptor's challenge
     * (nonce, no MAC), the connector's MAC, the acceptor's proof (MAC and
     * its eager threshold and credits) */
    struct cfx_dp_auth a = { .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_AUTH, 0 } };
    memset(a.nonce, 0x55, sizeof(a.nonce));
    put_dp("auth_challenge", &a, sizeof(a));
    memset(a.mac, 0x66, sizeof(a.mac));
    put_dp("auth", &a, sizeof(a));
    a.eager_max = 8192;
    a.eager_credits = 64;
    put_dp("auth_proof", &a, sizeof(a));

    struct cfx_dp_get_req r;
    memset(&r, 0, sizeof(r));
    r.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_REQ, 17 };
    memset(r.id, 0xab, sizeof(r.id));
    r.size = 3u << 20;
    r.chunk_size = 1u << 20;
    r.first_chunk = 1;
    r.credits = 16;
    r.rdesc.len = 24;
    memset(r.rdesc.data, 0x54, 24);
    put_dp("get_req", &r, sizeof(r));
    r.end_chunk = 2; /* a striped get's range: chunk 1 only */
    put_dp("get_req_range", &r, sizeof(r));
    r.end_chunk = 0;
    r.flags = CFX_DP_GET_P2P;
    r.chan = 99;
    r.tag = 5;
    put_dp("get_req_p2p", &r, sizeof(r));

    struct cfx_dp_nack n = { .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_GET_NACK, 17 },
                             .status = CFX_ERR_NOT_FOUND };
    put_dp("nack", &n, sizeof(n));
    struct cfx_dp_credit c = { .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_CREDIT, 17 },
                               .credits = 8 };
    put_dp("credit", &c, sizeof(c));
    struct cfx_dp_hdr x = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_CANCEL, 17 };
    put_dp("cancel", &x, sizeof(x));

    /* object reduce: a task with two children, its report, a lost child
     * and the driver's answer naming two streams in its place */
    static struct cfx_dp_reduce_task t;
    t.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_TASK, 0 };
    t.task = 0x500000001ull;
    memset(t.input, 0x11, sizeof(t.input));
    memset(t.output, 0x22, sizeof(t.output));
    t.size = 1u << 20;
    t.chunk_size = 131072;
    t.timeout_ms = 30000;
    t.dtype = CFX_DTYPE_F32;
    t.op = CFX_OP_SUM;
    t.final = CFX_RTASK_REPAIR;
    t.nchildren = 2;
    for (unsigned k = 0; k < 2; k++) {
        memset(t.child_obj[k], 0x30 + (int)k, CFX_OBJECT_ID_LEN);
        t.child[k].node_id = 2 + k;
        t.child[k].naddr = 1;
        snprintf(t.child[k].host_id, sizeof(t.child[k].host_id), "host-%u", k);
        snprintf(t.child[k].addr[0].tp, sizeof(t.child[k].addr[0].tp), "tcp");
        t.child[k].addr[0].len = 6;
    }
    put_dp("reduce_task", &t, sizeof(t));
    /* a striped allreduce: a chain task over a stripe's range, and a
     * gather of nine stripes (two named here, the rest in ADOPTs) */
    static struct cfx_dp_reduce_task st, ga;
    st = t;
    st.final = 0;
    st.offset = 4ull * 131072;
    st.size = 2u * 131072;
    st.nchildren = 1;
    put_dp("reduce_task_stripe", &st, sizeof(st));
    ga = t;
    ga.final = CFX_RTASK_GATHER;
    ga.putter = 7;
    ga.stripes = 9;
    ga.size = 9u * 131072;
    memcpy(ga.child_obj[1], ga.output, CFX_OBJECT_ID_LEN); /* a range of the next copy */
    put_dp("reduce_task_gather", &ga, sizeof(ga));
    struct cfx_dp_reduce_done d = {
        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_DONE, 0 },
        .task = t.task, .status = CFX_OK, .node_id = 4,
    };
    put_dp("reduce_done", &d, sizeof(d));
    d.hdr.type = CFX_DP_REDUCE_LOST;
    d.status = CFX_ERR_PEER_FAILED;
    put_dp("reduce_lost", &d, sizeof(d));
    static struct cfx_dp_reduce_adopt ad;
    ad.hdr = (struct cfx_dp_hdr){ CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_ADOPT, 0 };
    ad.task = t.task;
    ad.n = 2;
    ad.last = 1;
    for (unsigned k = 0; k < 2; k++) {
        memset(ad.replaces[k], 0x31, CFX_OBJECT_ID_LEN);
        memcpy(ad.child_obj[k], t.child_obj[k], CFX_OBJECT_ID_LEN);
        ad.child[k] = t.child[k];
    }
    put_dp("reduce_adopt", &ad, sizeof(ad));
    struct cfx_dp_reduce_done keep = {
        .hdr = { CFX_DP_MAGIC, CFX_DP_VERSION, CFX_DP_REDUCE_ABORT, 0 },
        .task = t.task, .status = CFX_RTASK_KEEP,
    };
    put_dp("reduce_abort_keep", &keep, sizeof(keep));
}

static void tcp(void)
{
    uint8_t buf[1 + sizeof(struct cfx__tcp_hdr) + 128];
    struct cfx__tcp_hdr h;
    struct cfx__tcp_hello hl;

    memset(&hl, 0, sizeof(hl));
    hl.magic = htole32(CFX_TCP_MAGIC);
    hl.version = htole32(CFX_TCP_VERSION);
    hl.node_id = htole32(4);
    snprintf(hl.addr, sizeof(hl.addr), "127.0.0.1:41000");
    memset(&h, 0, sizeof(h));
    h.type = CFX_TCP_FRAME_HELLO;
    h.len = htole32(sizeof(hl));
    buf[0] = 1;
    memcpy(buf + 1, &h, sizeof(h));
    memcpy(buf + 1 + sizeof(h), &hl, sizeof(hl));
    put("fuzz_tcp_hdr", "hello", buf, 1 + sizeof(h) + sizeof(hl));

    memset(&h, 0, sizeof(h));
    h.type = CFX_TCP_FRAME_SEND;
    h.len = htole32(76);
    buf[0] = 0;
    memcpy(buf + 1, &h, sizeof(h));
    put("fuzz_tcp_hdr", "send", buf, 1 + sizeof(h));

    memset(&h, 0, sizeof(h));
    h.type = CFX_TCP_FRAME_WRITE;
    h.len = htole32(1u << 20);
    h.imm = htole32(17u << 20 | 3);
    h.key_lo = htole32(0x12345678);
    h.key_idx = htole32(2);
    h.key_hi = htole32(0x9abcdef0);
    h.off = htole64(3u << 20);
    memcpy(buf + 1, &h, sizeof(h));
    put("fuzz_tcp_hdr", "write", buf, 1 + sizeof(h));

    memset(&h, 0, sizeof(h));
    h.type = CFX_TCP_FRAME_ERROR;
    h.imm = htole32((uint32_t)CFX_ERR_PROTO);
    memcpy(buf + 1, &h, sizeof(h));
    put("fuzz_tcp_hdr", "error", buf, 1 + sizeof(h));
}

static void shm(void)
{
    /* byte 0: start slot in the fuzzer's 4 KiB ring, then the ring bytes */
    static uint8_t buf[1 + 4096];
    struct cfx__shm_msg m;
    size_t off = 1;

    memset(buf, 0, sizeof(buf));
    buf[0] = 0;
    memset(&m, 0, sizeof(m));
    m.type = CFX_SHM_MSG_SEND;
    m.len = 40;
    memcpy(buf + off, &m, sizeof(m));
    off += cfx__shm_msg_size(m.len);
    memset(&m, 0, sizeof(m));
    m.type = CFX_SHM_MSG_WFRAG;
    m.flags = CFX_SHM_MSG_LAST;
    m.len = 128;
    m.key = 1;
    m.imm = 7;
    m.start = 256;
    m.off = 256;
    m.total = 128;
    memcpy(buf + off, &m, sizeof(m));
    off += cfx__shm_msg_size(m.len);
    memset(&m, 0, sizeof(m));
    m.type = CFX_SHM_MSG_WPULL;
    m.len = sizeof(struct cfx__shm_pull);
    m.key = 1;
    m.off = 0;
    m.total = 4096;
    memcpy(buf + off, &m, sizeof(m));
    struct cfx__shm_pull pl = { .fd = 3, .flen = 8192, .soff = 4096, .seq = 1 };
    memcpy(buf + off + CFX_SHM_MSG_HDR, &pl, sizeof(pl));
    off += cfx__shm_msg_size(sizeof(pl));
    put("fuzz_shm_msg", "send_wfrag_wpull", buf, off);

    /* a WRAP two slots before the end, then a SEND at the start */
    memset(buf, 0, sizeof(buf));
    buf[0] = 62;
    memset(&m, 0, sizeof(m));
    m.type = CFX_SHM_MSG_WRAP;
    memcpy(buf + 1, &m, sizeof(m));
    memset(&m, 0, sizeof(m));
    m.type = CFX_SHM_MSG_SEND;
    m.len = 8;
    memcpy(buf + 1 + 128, &m, sizeof(m));
    put("fuzz_shm_msg", "wrap_then_send", buf, 1 + 128 + 128);
}

static void dpdk(void)
{
    static const struct cfx__dpdk_addr a = {{0x02, 0, 0, 0, 0, 0xA}, 0x0A000001, 4791};
    static const struct cfx__dpdk_addr b = {{0x02, 0, 0, 0, 0, 0xB}, 0x0A000002, 4791};
    uint8_t buf[1 + CFX_DPDK_FRAME_OVERHEAD + 64], payload[64];
    struct cfx__dpdk_hdr h = {.flags = CFX_DPDK_F_DATA | CFX_DPDK_F_ACK, .session = 1, .seq = 5,
                              .ack = 3, .sack = 0x5, .window = 64, .len = sizeof(payload),
                              .msg_id = 2, .frag_idx = 1, .frag_cnt = 2, .msg_len = 1088,
                              .ts = 1000, .ts_echo = 900};

    memset(payload, 0xAB, sizeof(payload));
    buf[0] = 0; /* a bare header */
    size_t hl = cfx__dpdk_hdr_encode(&h, buf + 1);
    memcpy(buf + 1 + hl, payload, sizeof(payload));
    put("fuzz_dpdk_hdr", "data", buf, 1 + hl + sizeof(payload));
    struct cfx__dpdk_hdr alone = h; /* a stream's full packet: data without an ack */
    alone.flags = CFX_DPDK_F_DATA;
    hl = cfx__dpdk_hdr_encode(&alone, buf + 1);
    memcpy(buf + 1 + hl, payload, sizeof(payload));
    put("fuzz_dpdk_hdr", "data_alone", buf, 1 + hl + sizeof(payload));
    struct cfx__dpdk_hdr ack = {.flags = CFX_DPDK_F_ACK | CFX_DPDK_F_ACKREQ, .session = 1,
                                .ack = 9, .sack = 1ull << 63, .window = 0, .ts_echo = 77};
    hl = cfx__dpdk_hdr_encode(&ack, buf + 1);
    put("fuzz_dpdk_hdr", "ack", buf, 1 + hl);
    buf[0] = 1; /* a whole frame a -> b */
    int len = cfx__dpdk_frame_build(buf + 1, sizeof(buf) - 1, &a, &b, &h, payload);
    if (len < 0) {
        fprintf(stderr, "dpdk frame does not fit\n");
        exit(1);
    }
    put("fuzz_dpdk_hdr", "frame_data", buf, 1 + (size_t)len);
    len = cfx__dpdk_frame_build(buf + 1, sizeof(buf) - 1, &a, &b, &ack, NULL);
    put("fuzz_dpdk_hdr", "frame_ack", buf, 1 + (size_t)len);

    /* a session stream: an ack with a sack, then two data packets */
    uint8_t st[1 + 3 * (2 + CFX_DPDK_HDR_MAX + 64)];
    size_t n = 0;
    st[n++] = 2;
    struct cfx__dpdk_hdr sa = {.flags = CFX_DPDK_F_ACK, .session = 7, .ack = 2, .sack = 0x3,
                               .window = 16, .ts_echo = 1000};
    hl = cfx__dpdk_hdr_len(sa.flags);
    st[n++] = (uint8_t)hl;
    st[n++] = 0;
    cfx__dpdk_hdr_encode(&sa, st + n);
    n += hl;
    for (uint32_t i = 0; i < 2; i++) {
        struct cfx__dpdk_hdr d = {.flags = CFX_DPDK_F_DATA | CFX_DPDK_F_ACK, .session = 7,
                                  .seq = 1 - i, .len = 64, .frag_idx = (uint16_t)(1 - i),
                                  .frag_cnt = 2, .msg_len = 128, .window = 16, .ts = 5};
        hl = cfx__dpdk_hdr_len(d.flags);
        st[n++] = (uint8_t)(hl + 64);
        st[n++] = 0;
        cfx__dpdk_hdr_encode(&d, st + n);
        memset(st + n + hl, 0x5A, 64);
        n += hl + 64;
    }
    put("fuzz_dpdk_hdr", "session_stream", st, n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_gen_corpus DIR\n");
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) < 0 && errno != EEXIST) {
        perror(root);
        return 1;
    }
    proto();
    ctl_seal();
    coord_state();
    metrics();
    dp();
    tcp();
    shm();
    dpdk();
    return 0;
}

/* The reduction kernels (dataplane/reduce) are not part of the fuzz build;
 * the element sizes dp_msg.c needs for REDUCE_TASK are these. */
size_t cfx_dtype_size(enum cfx_dtype dtype)
{
    static const size_t sizes[CFX_DTYPE_LAST] = {
        [CFX_DTYPE_F32] = 4, [CFX_DTYPE_F64] = 8, [CFX_DTYPE_F16] = 2, [CFX_DTYPE_BF16] = 2,
        [CFX_DTYPE_I32] = 4, [CFX_DTYPE_I64] = 8, [CFX_DTYPE_U8] = 1,
    };
    return (unsigned)dtype < CFX_DTYPE_LAST ? sizes[dtype] : 0;
}

/* Control-plane wire format: encode and validate-while-decoding. */
#include "control/proto.h"
#include "control/proto_io.h"
#include "control/seal.h"

#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

static const char *const type_names[CFX_MSG_TYPE_END] = {
    [CFX_MSG_ERROR] = "ERROR",
    [CFX_MSG_OK] = "OK",
    [CFX_MSG_CHALLENGE] = "CHALLENGE",
    [CFX_MSG_AUTH] = "AUTH",
    [CFX_MSG_AUTH_OK] = "AUTH_OK",
    [CFX_MSG_JOIN] = "JOIN",
    [CFX_MSG_JOIN_REPLY] = "JOIN_REPLY",
    [CFX_MSG_LEAVE] = "LEAVE",
    [CFX_MSG_HEARTBEAT] = "HEARTBEAT",
    [CFX_MSG_OBJ_PUT] = "OBJ_PUT",
    [CFX_MSG_OBJ_LOOKUP] = "OBJ_LOOKUP",
    [CFX_MSG_LOOKUP_REPLY] = "LOOKUP_REPLY",
    [CFX_MSG_OBJ_DONE] = "OBJ_DONE",
    [CFX_MSG_OBJ_DELETE] = "OBJ_DELETE",
    [CFX_MSG_NODE_GET] = "NODE_GET",
    [CFX_MSG_NODE_REPLY] = "NODE_REPLY",
    [CFX_MSG_STATUS] = "STATUS",
    [CFX_MSG_STATUS_REPLY] = "STATUS_REPLY",
    [CFX_MSG_NODES] = "NODES",
    [CFX_MSG_NODES_REPLY] = "NODES_REPLY",
    [CFX_MSG_OBJECTS] = "OBJECTS",
    [CFX_MSG_OBJECTS_REPLY] = "OBJECTS_REPLY",
    [CFX_MSG_EV_NODE_DEAD] = "EV_NODE_DEAD",
    [CFX_MSG_EV_OBJ_GONE] = "EV_OBJ_GONE",
    [CFX_MSG_OBJ_GONE_ACK] = "OBJ_GONE_ACK",
    [CFX_MSG_TASK_REG] = "TASK_REG",
    [CFX_MSG_TASK_SUBMIT] = "TASK_SUBMIT",
    [CFX_MSG_TASK_PLACE] = "TASK_PLACE",
    [CFX_MSG_TASK_REPLY] = "TASK_REPLY",
    [CFX_MSG_TASK_WAIT] = "TASK_WAIT",
    [CFX_MSG_EV_TASK_RUN] = "EV_TASK_RUN",
    [CFX_MSG_TASK_DONE] = "TASK_DONE",
    [CFX_MSG_TASKS] = "TASKS",
    [CFX_MSG_TASKS_REPLY] = "TASKS_REPLY",
    [CFX_MSG_PS_LOADS] = "PS_LOADS",
    [CFX_MSG_PS_LOADS_REPLY] = "PS_LOADS_REPLY",
    [CFX_MSG_TASK_ANNOUNCE] = "TASK_ANNOUNCE",
    [CFX_MSG_EV_STOPPING] = "EV_STOPPING",
};

const char *cfx__msg_type_name(unsigned type)
{
    if (type == 0 || type >= CFX_MSG_TYPE_END)
        return "?";
    return type_names[type];
}


/* ------------------------------------------------------------------------ */
/* Records                                                                   */

static void wr_node(struct wr *w, const struct cfx_node_rec *n)
{
    unsigned naddr = n->naddr <= CFX_NODE_ADDRS_MAX ? n->naddr : CFX_NODE_ADDRS_MAX;
    wr_u32(w, n->node_id);
    wr_u32(w, n->pid);
    wr_str(w, n->name, sizeof(n->name));
    wr_str(w, n->host_id, sizeof(n->host_id));
    wr_str(w, n->ctl_addr, sizeof(n->ctl_addr));
    wr_u8(w, n->alive ? 1 : 0);
    wr_u32(w, n->last_seen_ms);
    wr_u8(w, (uint8_t)naddr);
    for (unsigned i = 0; i < CFX_NODE_ADDRS_MAX; i++) {
        if (i < naddr) {
            const struct cfx_node_addr *a = &n->addr[i];
            unsigned alen = a->len <= CFX_TP_ADDR_MAX ? a->len : CFX_TP_ADDR_MAX;
            wr_str(w, a->tp, sizeof(a->tp));
            wr_u8(w, (uint8_t)alen);
            wr_bytes(w, a->addr, alen);
            wr_zero(w, CFX_TP_ADDR_MAX - alen);
        } else {
            wr_zero(w, CFX_PROTO_ADDR_WIRE);
        }
    }
    wr_str(w, n->host, sizeof(n->host));
    wr_u8(w, n->flags & CFX_NODE_F_ALL);
}

static void rd_node(struct rd *r, struct cfx_node_rec *n)
{
    memset(n, 0, sizeof(*n));
    n->node_id = rd_u32(r, "node id");
    n->pid = rd_u32(r, "pid");
    rd_str(r, n->name, sizeof(n->name), "node name not terminated");
    rd_str(r, n->host_id, sizeof(n->host_id), "host id not terminated");
    rd_str(r, n->ctl_addr, sizeof(n->ctl_addr), "control address not terminated");
    n->alive = rd_flag(r, "alive flag");
    n->last_seen_ms = rd_u32(r, "last seen");
    n->naddr = rd_u8(r, "address count");
    if (n->naddr > CFX_NODE_ADDRS_MAX)
        rd_fail(r, CFX_ERR_PROTO, "address count over CFX_NODE_ADDRS_MAX");
    for (unsigned i = 0; i < CFX_NODE_ADDRS_MAX; i++) {
        struct cfx_node_addr *a = &n->addr[i];
        rd_str(r, a->tp, sizeof(a->tp), "transport name not terminated");
        a->len = rd_u8(r, "address length");
        if (a->len > CFX_TP_ADDR_MAX)
            rd_fail(r, CFX_ERR_PROTO, "address length over CFX_TP_ADDR_MAX");
        rd_bytes(r, a->addr, CFX_TP_ADDR_MAX, "address");
    }
    rd_str(r, n->host, sizeof(n->host), "host name not terminated");
    n->flags = rd_u8(r, "node flags");
    if (n->flags & ~CFX_NODE_F_ALL)
        rd_fail(r, CFX_ERR_PROTO, "unknown node flags");
    if (r->status != CFX_OK)
        memset(n, 0, sizeof(*n));
}

static void wr_objrec(struct wr *w, const struct cfx_ctl_obj_rec *o)
{
    unsigned nh = o->nholders < CFX_PROTO_HOLDERS_MAX ? o->nholders : CFX_PROTO_HOLDERS_MAX;
    wr_bytes(w, o->id.bytes, CFX_OBJECT_ID_LEN);
    wr_u64(w, o->size);
    wr_u32(w, o->chunk_size);
    wr_u8(w, o->is_inline ? 1 : 0);
    wr_u32(w, o->nholders);
    for (unsigned i = 0; i < CFX_PROTO_HOLDERS_MAX; i++) {
        if (i < nh) {
            wr_u32(w, o->holders[i].node_id);
            wr_u8(w, o->holders[i].complete ? 1 : 0);
            wr_u32(w, o->holders[i].uploads);
            wr_u32(w, o->holders[i].src);
            wr_u64(w, o->holders[i].ready);
        } else {
            wr_zero(w, CFX_PROTO_HOLDER_WIRE);
        }
    }
    wr_str(w, o->name, sizeof(o->name));
}

static void rd_objrec(struct rd *r, struct cfx_ctl_obj_rec *o)
{
    memset(o, 0, sizeof(*o));
    rd_bytes(r, o->id.bytes, CFX_OBJECT_ID_LEN, "object id");
    o->size = rd_u64(r, "object size");
    o->chunk_size = rd_u32(r, "chunk size");
    o->is_inline = rd_flag(r, "inline flag");
    o->nholders = rd_u32(r, "holder count");
    for (unsigned i = 0; i < CFX_PROTO_HOLDERS_MAX; i++) {
        o->holders[i].node_id = rd_u32(r, "holder node id");
        o->holders[i].complete = rd_flag(r, "holder complete flag");
        o->holders[i].uploads = rd_u32(r, "holder uploads");
        o->holders[i].src = rd_u32(r, "holder source");
        o->holders[i].ready = rd_u64(r, "holder ready bytes");
        if (r->status == CFX_OK && i < o->nholders && o->holders[i].ready > o->size &&
            o->holders[i].ready != CFX_CTL_READY_UNKNOWN)
            rd_fail(r, CFX_ERR_PROTO, "holder ready bytes over the object size");
        if (r->status == CFX_OK && o->holders[i].complete && o->holders[i].ready != o->size)
            rd_fail(r, CFX_ERR_PROTO, "complete holder short of the object size");
    }
    rd_str(r, o->name, sizeof(o->name), "object name not terminated");
    if (o->is_inline && o->size > CFX_OBJECT_INLINE_MAX)
        rd_fail(r, CFX_ERR_PROTO, "inline object over CFX_OBJECT_INLINE_MAX");
    if (r->status != CFX_OK)
        memset(o, 0, sizeof(*o));
}

/* ------------------------------------------------------------------------ */
/* Encode                                                                    */

static int encode_payload(const struct cfx_msg *m, struct wr *w)
{
    switch (m->type) {
    case CFX_MSG_ERROR: {
        size_t n = strnlen(m->u.error.text, CFX_PROTO_TEXT_MAX - 1);
        if (m->u.error.status >= 0 || m->u.error.status <= CFX_STATUS_LAST)
            return cfx__err(CFX_ERR_INVALID, "ERROR frame with status %d", m->u.error.status);
        wr_u32(w, (uint32_t)m->u.error.status);
        wr_u16(w, (uint16_t)n);
        wr_bytes(w, m->u.error.text, n);
        break;
    }
    case CFX_MSG_OK:
    case CFX_MSG_LEAVE:
    case CFX_MSG_STATUS:
    case CFX_MSG_EV_STOPPING:
        break;
    case CFX_MSG_HEARTBEAT:
    case CFX_MSG_TASK_REG:
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_DONE:
    case CFX_MSG_TASKS:
    case CFX_MSG_TASKS_REPLY:
    case CFX_MSG_TASK_ANNOUNCE:
        return cfx__msg_task_encode(m, w);
    case CFX_MSG_PS_LOADS:
    case CFX_MSG_PS_LOADS_REPLY:
        return cfx__msg_ps_encode(m, w);
    case CFX_MSG_CHALLENGE:
        if (m->u.challenge.secure > CFX_SEAL_ENCRYPT)
            return cfx__err(CFX_ERR_INVALID, "CHALLENGE frame with mode %u", m->u.challenge.secure);
        wr_bytes(w, m->u.challenge.nonce, CFX_PROTO_NONCE_LEN);
        wr_u8(w, m->u.challenge.secure);
        break;
    case CFX_MSG_AUTH:
        if (m->u.auth.role > CFX_CTL_ROLE_ADMIN)
            return cfx__err(CFX_ERR_INVALID, "AUTH frame with role %u", m->u.auth.role);
        wr_u8(w, m->u.auth.role);
        wr_bytes(w, m->u.auth.nonce, CFX_PROTO_NONCE_LEN);
        if (m->u.auth.secure > CFX_SEAL_ENCRYPT)
            return cfx__err(CFX_ERR_INVALID, "AUTH frame with mode %u", m->u.auth.secure);
        wr_bytes(w, m->u.auth.mac, CFX_PROTO_MAC_LEN);
        wr_u8(w, m->u.auth.secure);
        break;
    case CFX_MSG_AUTH_OK:
        wr_bytes(w, m->u.auth_ok.mac, CFX_PROTO_MAC_LEN);
        break;
    case CFX_MSG_JOIN:
    case CFX_MSG_NODE_REPLY:
        wr_node(w, &m->u.join);
        break;
    case CFX_MSG_JOIN_REPLY:
        wr_u32(w, m->u.join_reply.node_id);
        wr_u32(w, m->u.join_reply.heartbeat_ms);
        wr_u32(w, m->u.join_reply.dead_after_ms);
        break;
    case CFX_MSG_OBJ_PUT:
        if (m->u.put.has_data && (m->u.put.size > CFX_OBJECT_INLINE_MAX ||
                                  (m->u.put.size && !m->u.put.data)))
            return cfx__err(CFX_ERR_INVALID, "OBJ_PUT with %llu inline bytes",
                            (unsigned long long)m->u.put.size);
        if (m->u.put.durable && !m->u.put.has_data)
            return cfx__err(CFX_ERR_INVALID, "durable OBJ_PUT without inline data");
        wr_bytes(w, m->u.put.id.bytes, CFX_OBJECT_ID_LEN);
        wr_u64(w, m->u.put.size);
        wr_u32(w, m->u.put.chunk_size);
        size_t nlen = strnlen(m->u.put.name, CFX_OBJ_NAME_MAX);
        if (m->u.put.copy && (!m->u.put.putter || m->u.put.durable || m->u.put.has_data))
            return cfx__err(CFX_ERR_INVALID, "OBJ_PUT of a copy without its putter, or "
                            "durable or inline");
        wr_u8(w, (m->u.put.has_data ? CFX_PROTO_PUT_INLINE : 0) |
                     (m->u.put.durable ? CFX_PROTO_PUT_DURABLE : 0) |
                     (m->u.put.again ? CFX_PROTO_PUT_AGAIN : 0) |
                     (nlen ? CFX_PROTO_PUT_NAMED : 0) |
                     (m->u.put.tag ? CFX_PROTO_PUT_TAGGED : 0) |
                     (m->u.put.copy ? CFX_PROTO_PUT_COPY : 0));
        if (m->u.put.has_data) {
            wr_u32(w, (uint32_t)m->u.put.size);
            wr_bytes(w, m->u.put.data, (size_t)m->u.put.size);
        }
        if (nlen) {
            wr_u8(w, (uint8_t)nlen);
            wr_bytes(w, m->u.put.name, nlen);
        }
        if (m->u.put.tag)
            wr_u64(w, m->u.put.tag);
        if (m->u.put.copy)
            wr_u32(w, m->u.put.putter);
        break;
    case CFX_MSG_OBJ_LOOKUP:
        if (m->u.lookup.nexclude > CFX_PROTO_EXCLUDE_MAX)
            return cfx__err(CFX_ERR_INVALID, "lookup excludes %u nodes (at most %u)",
                            m->u.lookup.nexclude, CFX_PROTO_EXCLUDE_MAX);
        wr_bytes(w, m->u.lookup.id.bytes, CFX_OBJECT_ID_LEN);
        wr_u32(w, m->u.lookup.timeout_ms);
        wr_u32(w, m->u.lookup.nexclude);
        for (uint32_t i = 0; i < m->u.lookup.nexclude; i++)
            wr_u32(w, m->u.lookup.exclude[i]);
        wr_u8(w, m->u.lookup.want);
        break;
    case CFX_MSG_LOOKUP_REPLY:
        if (m->u.lookup_reply.is_inline &&
            (m->u.lookup_reply.size > CFX_OBJECT_INLINE_MAX ||
             (m->u.lookup_reply.size && !m->u.lookup_reply.data)))
            return cfx__err(CFX_ERR_INVALID, "LOOKUP_REPLY with %llu inline bytes",
                            (unsigned long long)m->u.lookup_reply.size);
        wr_bytes(w, m->u.lookup_reply.id.bytes, CFX_OBJECT_ID_LEN);
        wr_u64(w, m->u.lookup_reply.size);
        wr_u32(w, m->u.lookup_reply.chunk_size);
        wr_u8(w, m->u.lookup_reply.is_inline ? 1 : 0);
        wr_u8(w, m->u.lookup_reply.complete ? 1 : 0);
        if (m->u.lookup_reply.is_inline) {
            wr_u32(w, (uint32_t)m->u.lookup_reply.size);
            wr_bytes(w, m->u.lookup_reply.data, (size_t)m->u.lookup_reply.size);
        } else {
            wr_node(w, &m->u.lookup_reply.node);
        }
        wr_u32(w, m->u.lookup_reply.putter);
        wr_u64(w, m->u.lookup_reply.tag);
        if (m->u.lookup_reply.nextra > CFX_PROTO_EXTRA_MAX)
            return cfx__err(CFX_ERR_INVALID, "LOOKUP_REPLY with %u extra sources (at most %u)",
                            m->u.lookup_reply.nextra, CFX_PROTO_EXTRA_MAX);
        wr_u8(w, m->u.lookup_reply.nextra);
        for (uint32_t i = 0; i < m->u.lookup_reply.nextra; i++)
            wr_u32(w, m->u.lookup_reply.extra[i]);
        break;
    case CFX_MSG_OBJ_DONE:
        wr_bytes(w, m->u.done.id.bytes, CFX_OBJECT_ID_LEN);
        wr_u32(w, m->u.done.source_node);
        wr_u8(w, m->u.done.complete ? 1 : 0);
        break;
    case CFX_MSG_OBJ_DELETE:
        wr_bytes(w, m->u.del.id.bytes, CFX_OBJECT_ID_LEN);
        wr_u8(w, m->u.del.end ? 1 : 0);
        wr_u64(w, m->u.del.put_below);
        break;
    case CFX_MSG_NODE_GET:
        wr_u32(w, m->u.node_get.node_id);
        break;
    case CFX_MSG_STATUS_REPLY: {
        const struct cfx_ctl_status *s = &m->u.status;
        wr_u32(w, s->proto_version);
        wr_u64(w, s->uptime_ms);
        wr_u32(w, s->nodes_alive);
        wr_u32(w, s->nodes_dead);
        wr_u32(w, s->objects);
        wr_u64(w, s->inline_bytes);
        wr_u32(w, s->heartbeat_ms);
        wr_u32(w, s->dead_after_ms);
        wr_str(w, s->version, sizeof(s->version));
        wr_u32(w, s->node_index_slots);
        wr_u32(w, s->node_records);
        break;
    }
    case CFX_MSG_NODES:
    case CFX_MSG_OBJECTS:
        wr_u32(w, m->u.list.cursor);
        break;
    case CFX_MSG_NODES_REPLY:
    case CFX_MSG_OBJECTS_REPLY: {
        const struct cfx_msg_page *pg = &m->u.page;
        int nodes = m->type == CFX_MSG_NODES_REPLY;
        uint32_t max = nodes ? CFX_PROTO_NODES_PAGE : CFX_PROTO_OBJECTS_PAGE;
        if (pg->count > max || (pg->count && !pg->recs_in))
            return cfx__err(CFX_ERR_INVALID, "listing page of %u records (at most %u)",
                            pg->count, max);
        wr_u32(w, pg->count);
        wr_u32(w, pg->next);
        wr_u8(w, pg->more ? 1 : 0);
        for (uint32_t i = 0; i < pg->count; i++) {
            if (nodes) {
                const struct cfx_node_rec *n = &((const struct cfx_node_rec *)pg->recs_in)[i];
                wr_node(w, n);
                cfx__msg_load_wr(w, &n->load);
            } else
                wr_objrec(w, &((const struct cfx_ctl_obj_rec *)pg->recs_in)[i]);
        }
        break;
    }
    case CFX_MSG_EV_NODE_DEAD:
        wr_u32(w, m->u.node_dead.node_id);
        break;
    case CFX_MSG_EV_OBJ_GONE:
    case CFX_MSG_OBJ_GONE_ACK:
        wr_bytes(w, m->u.gone.id.bytes, CFX_OBJECT_ID_LEN);
        break;
    default:
        return cfx__err(CFX_ERR_INVALID, "cannot encode message type %u", m->type);
    }
    return CFX_OK;
}

static int encode(const struct cfx_msg *m, struct wr *w)
{
    wr_u16(w, CFX_PROTO_MAGIC);
    wr_u8(w, CFX_PROTO_VERSION);
    wr_u8(w, m->type);
    wr_u32(w, 0); /* payload_len, patched below */
    wr_u64(w, m->req_id);
    int rc = encode_payload(m, w);
    if (rc != CFX_OK)
        return rc;
    size_t plen = w->off - CFX_PROTO_HDR_LEN;
    if (plen > CFX_PROTO_MAX_PAYLOAD)
        return cfx__err(CFX_ERR_TOO_BIG, "%s payload of %zu bytes over the %u byte limit",
                        cfx__msg_type_name(m->type), plen, CFX_PROTO_MAX_PAYLOAD);
    if (w->p && w->off <= w->cap) {
        for (int i = 0; i < 4; i++)
            w->p[4 + i] = (uint8_t)(plen >> (8 * i));
    }
    return CFX_OK;
}

size_t cfx__msg_encoded_len(const struct cfx_msg *m)
{
    struct wr w = { NULL, 0, 0 };
    encode(m, &w);
    return w.off;
}

int cfx__msg_encode(const struct cfx_msg *m, void *buf, size_t cap, size_t *len)
{
    struct wr w = { buf, cap, 0 };
    int rc = encode(m, &w);
    if (rc != CFX_OK)
        return rc;
    if (w.off > cap)
        return cfx__err(CFX_ERR_TOO_BIG, "%s frame of %zu bytes does not fit %zu",
                        cfx__msg_type_name(m->type), w.off, cap);
    *len = w.off;
    return CFX_OK;
}

int cfx__msg_encode_alloc(const struct cfx_msg *m, uint8_t **buf, size_t *len)
{
    struct wr w = { NULL, 0, 0 };
    int rc = encode(m, &w);
    if (rc != CFX_OK)
        return rc;
    uint8_t *p = malloc(w.off);
    if (!p)
        return cfx__err(CFX_ERR_NOMEM, "no memory for a %zu byte %s frame", w.off,
                        cfx__msg_type_name(m->type));
    rc = cfx__msg_encode(m, p, w.off, len);
    if (rc != CFX_OK) {
        free(p);
        return rc;
    }
    *buf = p;
    return CFX_OK;
}

/* ------------------------------------------------------------------------ */
/* Decode                                                                    */

int cfx__msg_hdr_decode(const void *buf, size_t len, struct cfx_msg_hdr *out)
{
    const uint8_t *p = buf;
    if (len < CFX_PROTO_HDR_LEN)
        return cfx__err(CFX_ERR_PROTO, "truncated frame header (%zu of %u bytes)", len,
                        CFX_PROTO_HDR_LEN);
    struct rd r = { p, len, 0, CFX_OK, "header" };
    out->magic = rd_u16(&r, "magic");
    out->version = rd_u8(&r, "version");
    out->type = rd_u8(&r, "type");
    out->payload_len = rd_u32(&r, "payload length");
    out->req_id = rd_u64(&r, "request id");
    if (out->magic != CFX_PROTO_MAGIC)
        return cfx__err(CFX_ERR_PROTO, "bad frame magic 0x%04x (not a Conflux peer?)",
                        out->magic);
    if (out->version != CFX_PROTO_VERSION)
        return cfx__err(CFX_ERR_VERSION, "peer speaks protocol version %u, this build speaks %u",
                        out->version, CFX_PROTO_VERSION);
    if (out->type == 0 || out->type >= CFX_MSG_TYPE_END)
        return cfx__err(CFX_ERR_PROTO, "unknown message type %u", out->type);
    if (out->payload_len > CFX_PROTO_MAX_PAYLOAD)
        return cfx__err(CFX_ERR_TOO_BIG, "%s frame announces %u payload bytes (limit %u)",
                        cfx__msg_type_name(out->type), out->payload_len,
                        CFX_PROTO_MAX_PAYLOAD);
    return CFX_OK;
}

static void decode_payload(struct rd *r, struct cfx_msg *m)
{
    switch (m->type) {
    case CFX_MSG_ERROR: {
        int32_t st = (int32_t)rd_u32(r, "status");
        uint16_t n = rd_u16(r, "text length");
        m->u.error.status = st;
        m->u.error.text[0] = '\0';
        if (r->status != CFX_OK)
            break;
        if (st >= 0 || st <= CFX_STATUS_LAST) {
            rd_fail(r, CFX_ERR_PROTO, "status is not an error code");
            break;
        }
        if (n >= CFX_PROTO_TEXT_MAX) {
            rd_fail(r, CFX_ERR_PROTO, "text longer than CFX_PROTO_TEXT_MAX");
            break;
        }
        const uint8_t *q = rd_take(r, n, "text");
        if (!q)
            break;
        if (memchr(q, 0, n)) {
            rd_fail(r, CFX_ERR_PROTO, "NUL inside text");
            break;
        }
        memcpy(m->u.error.text, q, n);
        m->u.error.text[n] = '\0';
        break;
    }
    case CFX_MSG_OK:
    case CFX_MSG_LEAVE:
    case CFX_MSG_STATUS:
    case CFX_MSG_EV_STOPPING:
        break;
    case CFX_MSG_HEARTBEAT:
    case CFX_MSG_TASK_REG:
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_DONE:
    case CFX_MSG_TASKS:
    case CFX_MSG_TASKS_REPLY:
    case CFX_MSG_TASK_ANNOUNCE:
        cfx__msg_task_decode(r, m);
        break;
    case CFX_MSG_PS_LOADS:
    case CFX_MSG_PS_LOADS_REPLY:
        cfx__msg_ps_decode(r, m);
        break;
    case CFX_MSG_CHALLENGE:
        rd_bytes(r, m->u.challenge.nonce, CFX_PROTO_NONCE_LEN, "nonce");
        m->u.challenge.secure = rd_u8(r, "mode");
        if (m->u.challenge.secure > CFX_SEAL_ENCRYPT)
            rd_fail(r, CFX_ERR_PROTO, "unknown CFX_SECURE mode");
        break;
    case CFX_MSG_AUTH:
        m->u.auth.role = rd_u8(r, "role");
        if (m->u.auth.role > CFX_CTL_ROLE_ADMIN)
            rd_fail(r, CFX_ERR_PROTO, "unknown role");
        rd_bytes(r, m->u.auth.nonce, CFX_PROTO_NONCE_LEN, "nonce");
        rd_bytes(r, m->u.auth.mac, CFX_PROTO_MAC_LEN, "mac");
        m->u.auth.secure = rd_u8(r, "mode");
        if (m->u.auth.secure > CFX_SEAL_ENCRYPT)
            rd_fail(r, CFX_ERR_PROTO, "unknown CFX_SECURE mode");
        break;
    case CFX_MSG_AUTH_OK:
        rd_bytes(r, m->u.auth_ok.mac, CFX_PROTO_MAC_LEN, "mac");
        break;
    case CFX_MSG_JOIN:
    case CFX_MSG_NODE_REPLY:
        rd_node(r, &m->u.join);
        break;
    case CFX_MSG_JOIN_REPLY:
        m->u.join_reply.node_id = rd_u32(r, "node id");
        m->u.join_reply.heartbeat_ms = rd_u32(r, "heartbeat");
        m->u.join_reply.dead_after_ms = rd_u32(r, "dead after");
        if (r->status == CFX_OK && m->u.join_reply.node_id == 0)
            rd_fail(r, CFX_ERR_PROTO, "node id 0");
        if (r->status == CFX_OK && m->u.join_reply.heartbeat_ms == 0)
            rd_fail(r, CFX_ERR_PROTO, "heartbeat interval 0");
        /* they size every later send's deadline: beyond the range, an (int)
         * of them turned negative, which waits for ever */
        if (r->status == CFX_OK && (m->u.join_reply.heartbeat_ms > CFX_PROTO_TIMING_MAX_MS ||
                                    m->u.join_reply.dead_after_ms > CFX_PROTO_TIMING_MAX_MS))
            rd_fail(r, CFX_ERR_PROTO, "heartbeat or dead-after time above 3600000 ms");
        break;
    case CFX_MSG_OBJ_PUT: {
        rd_bytes(r, m->u.put.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        m->u.put.size = rd_u64(r, "size");
        m->u.put.chunk_size = rd_u32(r, "chunk size");
        uint8_t flags = rd_u8(r, "put flags");
        m->u.put.has_data = (flags & CFX_PROTO_PUT_INLINE) ? 1 : 0;
        m->u.put.durable = (flags & CFX_PROTO_PUT_DURABLE) ? 1 : 0;
        m->u.put.again = (flags & CFX_PROTO_PUT_AGAIN) ? 1 : 0;
        m->u.put.copy = (flags & CFX_PROTO_PUT_COPY) ? 1 : 0;
        m->u.put.putter = 0;
        m->u.put.tag = 0;
        m->u.put.data = NULL;
        if (r->status == CFX_OK && (flags & ~CFX_PROTO_PUT_FLAGS)) {
            rd_fail(r, CFX_ERR_PROTO, "unknown put flags");
            break;
        }
        if (r->status == CFX_OK && m->u.put.durable && !m->u.put.has_data) {
            rd_fail(r, CFX_ERR_PROTO, "durable put without inline data");
            break;
        }
        if (r->status == CFX_OK && m->u.put.copy && (m->u.put.durable || m->u.put.has_data)) {
            rd_fail(r, CFX_ERR_PROTO, "a copy's put is neither durable nor inline");
            break;
        }
        if (r->status == CFX_OK && m->u.put.has_data) {
            uint32_t n = rd_u32(r, "inline length");
            if (r->status != CFX_OK)
                break;
            if (n > CFX_OBJECT_INLINE_MAX || n != m->u.put.size) {
                rd_fail(r, CFX_ERR_PROTO, "inline length does not match size or over 64 KiB");
                break;
            }
            m->u.put.data = rd_take(r, n, "inline data");
        }
        m->u.put.name[0] = '\0';
        if (r->status == CFX_OK && (flags & CFX_PROTO_PUT_NAMED)) {
            /* a peer's bytes: bounded, no NUL inside; printers escape them */
            uint8_t n = rd_u8(r, "name length");
            if (r->status == CFX_OK && (n == 0 || n > CFX_OBJ_NAME_MAX)) {
                rd_fail(r, CFX_ERR_PROTO, "object name length 0 or over CFX_OBJ_NAME_MAX");
                break;
            }
            const uint8_t *q = rd_take(r, n, "object name");
            if (q && memchr(q, 0, n)) {
                rd_fail(r, CFX_ERR_PROTO, "NUL inside an object name");
                break;
            }
            if (q) {
                memcpy(m->u.put.name, q, n);
                m->u.put.name[n] = '\0';
            }
        }
        if (r->status == CFX_OK && (flags & CFX_PROTO_PUT_TAGGED)) {
            m->u.put.tag = rd_u64(r, "put tag");
            if (r->status == CFX_OK && !m->u.put.tag)
                rd_fail(r, CFX_ERR_PROTO, "put tag 0");
        }
        if (r->status == CFX_OK && m->u.put.copy) {
            m->u.put.putter = rd_u32(r, "putter node");
            if (r->status == CFX_OK && !m->u.put.putter)
                rd_fail(r, CFX_ERR_PROTO, "putter node 0");
        }
        break;
    }
    case CFX_MSG_OBJ_LOOKUP:
        rd_bytes(r, m->u.lookup.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        m->u.lookup.timeout_ms = rd_u32(r, "timeout");
        m->u.lookup.nexclude = rd_u32(r, "exclude count");
        if (r->status != CFX_OK)
            break;
        if (m->u.lookup.nexclude > CFX_PROTO_EXCLUDE_MAX) {
            rd_fail(r, CFX_ERR_PROTO, "exclude count over CFX_PROTO_EXCLUDE_MAX");
            m->u.lookup.nexclude = 0;
            break;
        }
        for (uint32_t i = 0; i < m->u.lookup.nexclude; i++)
            m->u.lookup.exclude[i] = rd_u32(r, "excluded node");
        m->u.lookup.want = rd_u8(r, "extra sources wanted");
        if (r->status == CFX_OK && m->u.lookup.want > CFX_PROTO_EXTRA_MAX)
            rd_fail(r, CFX_ERR_PROTO, "extra sources wanted over CFX_PROTO_EXTRA_MAX");
        break;
    case CFX_MSG_LOOKUP_REPLY: {
        rd_bytes(r, m->u.lookup_reply.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        m->u.lookup_reply.size = rd_u64(r, "size");
        m->u.lookup_reply.chunk_size = rd_u32(r, "chunk size");
        m->u.lookup_reply.is_inline = rd_flag(r, "inline flag");
        m->u.lookup_reply.complete = rd_flag(r, "complete flag");
        m->u.lookup_reply.data = NULL;
        memset(&m->u.lookup_reply.node, 0, sizeof(m->u.lookup_reply.node));
        if (r->status != CFX_OK)
            break;
        if (m->u.lookup_reply.is_inline) {
            uint32_t n = rd_u32(r, "inline length");
            if (r->status != CFX_OK)
                break;
            if (n > CFX_OBJECT_INLINE_MAX || n != m->u.lookup_reply.size) {
                rd_fail(r, CFX_ERR_PROTO, "inline length does not match size or over 64 KiB");
                break;
            }
            m->u.lookup_reply.data = rd_take(r, n, "inline data");
        } else {
            rd_node(r, &m->u.lookup_reply.node);
            if (r->status == CFX_OK && m->u.lookup_reply.node.node_id == 0)
                rd_fail(r, CFX_ERR_PROTO, "source node id 0");
        }
        m->u.lookup_reply.putter = rd_u32(r, "putter node");
        m->u.lookup_reply.tag = rd_u64(r, "put tag");
        m->u.lookup_reply.nextra = rd_u8(r, "extra source count");
        if (r->status == CFX_OK && m->u.lookup_reply.nextra > CFX_PROTO_EXTRA_MAX) {
            rd_fail(r, CFX_ERR_PROTO, "extra source count over CFX_PROTO_EXTRA_MAX");
            m->u.lookup_reply.nextra = 0;
            break;
        }
        for (uint32_t i = 0; i < m->u.lookup_reply.nextra; i++) {
            m->u.lookup_reply.extra[i] = rd_u32(r, "extra source node");
            if (r->status == CFX_OK && m->u.lookup_reply.extra[i] == 0)
                rd_fail(r, CFX_ERR_PROTO, "extra source node id 0");
        }
        break;
    }
    case CFX_MSG_OBJ_DONE:
        rd_bytes(r, m->u.done.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        m->u.done.source_node = rd_u32(r, "source node");
        m->u.done.complete = rd_flag(r, "complete flag");
        break;
    case CFX_MSG_OBJ_DELETE:
        rd_bytes(r, m->u.del.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        m->u.del.end = rd_flag(r, "end flag");
        m->u.del.put_below = rd_u64(r, "put tag bound");
        break;
    case CFX_MSG_NODE_GET:
        m->u.node_get.node_id = rd_u32(r, "node id");
        break;
    case CFX_MSG_STATUS_REPLY: {
        struct cfx_ctl_status *s = &m->u.status;
        s->proto_version = rd_u32(r, "protocol version");
        s->uptime_ms = rd_u64(r, "uptime");
        s->nodes_alive = rd_u32(r, "nodes alive");
        s->nodes_dead = rd_u32(r, "nodes dead");
        s->objects = rd_u32(r, "objects");
        s->inline_bytes = rd_u64(r, "inline bytes");
        s->heartbeat_ms = rd_u32(r, "heartbeat");
        s->dead_after_ms = rd_u32(r, "dead after");
        rd_str(r, s->version, sizeof(s->version), "version not terminated");
        s->node_index_slots = rd_u32(r, "node index slots");
        s->node_records = rd_u32(r, "node records");
        break;
    }
    case CFX_MSG_NODES:
    case CFX_MSG_OBJECTS:
        m->u.list.cursor = rd_u32(r, "cursor");
        break;
    case CFX_MSG_NODES_REPLY:
    case CFX_MSG_OBJECTS_REPLY: {
        struct cfx_msg_page *pg = &m->u.page;
        int nodes = m->type == CFX_MSG_NODES_REPLY;
        uint32_t max = nodes ? CFX_PROTO_NODES_PAGE : CFX_PROTO_OBJECTS_PAGE;
        size_t recsz = nodes ? CFX_PROTO_NODE_LIST_WIRE : CFX_PROTO_OBJREC_WIRE;
        pg->count = rd_u32(r, "record count");
        pg->next = rd_u32(r, "next cursor");
        pg->more = rd_flag(r, "more flag");
        pg->recs_in = NULL;
        pg->raw = NULL;
        if (r->status != CFX_OK)
            break;
        if (pg->count > max) {
            rd_fail(r, CFX_ERR_PROTO, "record count over the page limit");
            pg->count = 0;
            break;
        }
        /* The count is bounded, so count * recsz cannot overflow. */
        if ((size_t)pg->count * recsz != r->len - r->off) {
            rd_fail(r, CFX_ERR_PROTO, "record count does not match the payload length");
            pg->count = 0;
            break;
        }
        pg->raw = r->p + r->off;
        for (uint32_t i = 0; i < pg->count && r->status == CFX_OK; i++) {
            if (nodes) {
                struct cfx_node_rec tmp;
                rd_node(r, &tmp);
                cfx__msg_load_rd(r, &tmp.load);
            } else {
                struct cfx_ctl_obj_rec tmp;
                rd_objrec(r, &tmp);
            }
        }
        if (r->status != CFX_OK) {
            pg->count = 0;
            pg->raw = NULL;
        }
        break;
    }
    case CFX_MSG_EV_NODE_DEAD:
        m->u.node_dead.node_id = rd_u32(r, "node id");
        if (r->status == CFX_OK && m->u.node_dead.node_id == 0)
            rd_fail(r, CFX_ERR_PROTO, "node id 0");
        break;
    case CFX_MSG_EV_OBJ_GONE:
    case CFX_MSG_OBJ_GONE_ACK:
        rd_bytes(r, m->u.gone.id.bytes, CFX_OBJECT_ID_LEN, "object id");
        break;
    default:
        rd_fail(r, CFX_ERR_PROTO, "unknown type");
        break;
    }
}

int cfx__msg_decode(const void *buf, size_t len, struct cfx_msg *out)
{
    struct cfx_msg_hdr h;
    int rc = cfx__msg_hdr_decode(buf, len, &h);
    if (rc != CFX_OK)
        return rc;
    if (len - CFX_PROTO_HDR_LEN < h.payload_len)
        return cfx__err(CFX_ERR_PROTO, "truncated %s frame: %zu of %u payload bytes",
                        cfx__msg_type_name(h.type), len - CFX_PROTO_HDR_LEN, h.payload_len);
    if (len - CFX_PROTO_HDR_LEN > h.payload_len)
        return cfx__err(CFX_ERR_PROTO, "%zu bytes after the %s frame",
                        len - CFX_PROTO_HDR_LEN - h.payload_len, cfx__msg_type_name(h.type));

    memset(out, 0, offsetof(struct cfx_msg, u));
    out->type = h.type;
    out->req_id = h.req_id;
    struct rd r = { (const uint8_t *)buf + CFX_PROTO_HDR_LEN, h.payload_len, 0, CFX_OK,
                    cfx__msg_type_name(h.type) };
    decode_payload(&r, out);
    if (r.status != CFX_OK)
        return r.status;
    if (r.off != r.len)
        return cfx__err(CFX_ERR_PROTO, "bad %s frame: %zu trailing bytes",
                        cfx__msg_type_name(h.type), r.len - r.off);
    return CFX_OK;
}

void cfx__msg_node_at(const struct cfx_msg *m, uint32_t i, struct cfx_node_rec *out)
{
    struct rd r = { m->u.page.raw + (size_t)i * CFX_PROTO_NODE_LIST_WIRE,
                    CFX_PROTO_NODE_LIST_WIRE, 0, CFX_OK, "node record" };
    rd_node(&r, out);
    cfx__msg_load_rd(&r, &out->load);
}

void cfx__msg_obj_at(const struct cfx_msg *m, uint32_t i, struct cfx_ctl_obj_rec *out)
{
    struct rd r = { m->u.page.raw + (size_t)i * CFX_PROTO_OBJREC_WIRE, CFX_PROTO_OBJREC_WIRE,
                    0, CFX_OK, "object record" };
    rd_objrec(&r, out);
}

/*
 * The data-plane messages on the wire: their explicit little-endian layout,
 * encoding, decoding and validation (pure: no context, no state), kept on
 * their own so that test/fuzz/fuzz_dp_msg.c can fuzz them without the rest
 * of the engine.  The engine works on the host structs of engine.h; a
 * message is encoded just before ep_send (conn.c, eager.c) and decoded and
 * checked on receipt (xfer.c), so no host layout, padding or byte order
 * reaches a peer.
 *
 * Every field is little endian at a fixed offset, with no padding:
 *
 *   header (8)      magic u16 | version u8 | type u8 | slot u32
 *   HELLO (48)      hdr | node_id u32 | nonce[32] | secure u32
 *   AUTH (84)       hdr | nonce[32] | mac[32] | eager_max u32 | eager_credits u32 |
 *                   secure u32
 *   GET_REQ (121)   hdr | id[20] | size u64 | chunk_size u32 | first_chunk u32 |
 *                   credits u32 | flags u32 | chan u64 | tag u32 | ring u32 |
 *                   end_chunk u32 | rdesc.len u8 | rdesc.data[48]
 *   GET_NACK, CANCEL_DONE (12)  hdr | status i32
 *   CREDIT, EAGER_CREDIT (12)  hdr | credits u32
 *   CANCEL, CANCEL_UNSEEN, CANCEL_ACK (8)  hdr
 *   REDUCE_DONE, _ABORT, _LOST (24)  hdr | task u64 | status i32 | node_id u32
 *   REDUCE_TASK     hdr | task u64 | input[20] | output[20] | size u64 |
 *                   chunk_size u32 | timeout_ms u32 | dtype u8 | op u8 |
 *                   nchildren u8 | final u8 | offset u64 | putter u32 |
 *                   stripes u8  (89),
 *                   then nchildren child_obj[20], then nchildren node records
 *   REDUCE_ADOPT    hdr | task u64 | n u8 | last u8  (18), then n replaces[20],
 *                   n child_obj[20], n node records
 *   P2P_EAGER       hdr | chan u64 | tag u32 | len u32  (24), then len bytes
 *   GET_DATA        hdr | id[20] | len u32  (32), then len bytes
 *
 * A node record is as long as what it says: node_id u32 | naddr u8 |
 * host_id length u8 | host_id bytes, then per address: transport name
 * length u8 | name bytes | address length u8 | address bytes.  So every one
 * of a node's CFX_NODE_ADDRS_MAX addresses fits a reduce task of
 * CFX_RTASK_MAX_CHILDREN children in one CFX_TP_SEND_MAX message (a record
 * naming four addresses of ordinary length takes some 200 bytes; the
 * fixed-size struct took 448 for three).
 */
#include "engine.h"

#include <endian.h>
#include <stddef.h>
#include <string.h>

_Static_assert(CFX_DP_WIRE_HDR == 2 + 1 + 1 + 4, "header layout");
_Static_assert(CFX_DP_WIRE_HELLO == CFX_DP_WIRE_HDR + 4 + CFX_DP_NONCE_LEN + 4, "HELLO layout");
_Static_assert(CFX_DP_WIRE_AUTH == CFX_DP_WIRE_HDR + CFX_DP_NONCE_LEN + CFX_DP_MAC_LEN + 4 + 4 + 4,
               "AUTH layout");
_Static_assert(CFX_DP_WIRE_GET_REQ ==
                   CFX_DP_WIRE_HDR + CFX_OBJECT_ID_LEN + 8 + 4 * 4 + 8 + 4 + 4 + 4 + 1 +
                       CFX_TP_RDESC_MAX,
               "GET_REQ layout");
_Static_assert(CFX_DP_WIRE_NACK == CFX_DP_WIRE_HDR + 4, "NACK layout");
_Static_assert(CFX_DP_WIRE_CREDIT == CFX_DP_WIRE_HDR + 4, "CREDIT layout");
_Static_assert(CFX_DP_WIRE_REDUCE_DONE == CFX_DP_WIRE_HDR + 8 + 4 + 4, "REDUCE_DONE layout");
_Static_assert(CFX_DP_WIRE_REDUCE_TASK ==
                   CFX_DP_WIRE_HDR + 8 + 2 * CFX_OBJECT_ID_LEN + 8 + 4 + 4 + 4 + 8 + 4 + 1,
               "REDUCE_TASK layout");
_Static_assert(CFX_DP_WIRE_REDUCE_ADOPT == CFX_DP_WIRE_HDR + 8 + 2, "REDUCE_ADOPT layout");
_Static_assert(CFX_DP_WIRE_EAGER == CFX_DP_WIRE_HDR + 8 + 4 + 4, "P2P_EAGER layout");
_Static_assert(CFX_DP_WIRE_GET_DATA == CFX_DP_WIRE_HDR + CFX_OBJECT_ID_LEN + 4, "GET_DATA layout");
/* the payload limits are counted from the host structs: the same sizes */
_Static_assert(sizeof(struct cfx_dp_eager) == CFX_DP_WIRE_EAGER &&
                   sizeof(struct cfx_dp_get_data) == CFX_DP_WIRE_GET_DATA,
               "eager and GET_DATA headers are as long on the wire as in memory");
/* the fields the encoder writes at these widths */
_Static_assert(sizeof(((struct cfx_dp_hdr *)0)->magic) == 2 &&
                   sizeof(((struct cfx_dp_hdr *)0)->slot) == 4,
               "header fields");
_Static_assert(sizeof(((struct cfx_dp_get_req *)0)->size) == 8 &&
                   sizeof(((struct cfx_dp_get_req *)0)->chan) == 8 &&
                   sizeof(((struct cfx_dp_get_req *)0)->rdesc.data) == CFX_TP_RDESC_MAX,
               "GET_REQ fields");
_Static_assert(CFX_HOST_ID_MAX <= 256 && CFX_TP_NAME_MAX <= 256 && CFX_TP_ADDR_MAX <= 255,
               "node record lengths fit a byte");
/* the messages of fixed size fit one ep_send */
_Static_assert(CFX_DP_WIRE_GET_REQ <= CFX_TP_SEND_MAX && CFX_DP_WIRE_AUTH <= CFX_TP_SEND_MAX,
               "fixed messages fit an ep_send");

/* ---- cursors ------------------------------------------------------------------- */

struct wr {
    uint8_t *p;
    size_t off, cap;
    bool over; /* a write did not fit */
};

static void w_bytes(struct wr *w, const void *src, size_t n)
{
    if (w->over || n > w->cap - w->off) {
        w->over = true;
        return;
    }
    if (n)
        memcpy(w->p + w->off, src, n);
    w->off += n;
}

static void w_u8(struct wr *w, uint8_t v) { w_bytes(w, &v, 1); }
static void w_u16(struct wr *w, uint16_t v) { v = htole16(v); w_bytes(w, &v, 2); }
static void w_u32(struct wr *w, uint32_t v) { v = htole32(v); w_bytes(w, &v, 4); }
static void w_u64(struct wr *w, uint64_t v) { v = htole64(v); w_bytes(w, &v, 8); }

struct rd {
    const uint8_t *p;
    size_t off, len;
    bool bad; /* a read past the end */
};

static void r_bytes(struct rd *r, void *dst, size_t n)
{
    if (r->bad || n > r->len - r->off) {
        r->bad = true;
        memset(dst, 0, n);
        return;
    }
    if (n)
        memcpy(dst, r->p + r->off, n);
    r->off += n;
}

static uint8_t r_u8(struct rd *r) { uint8_t v; r_bytes(r, &v, 1); return v; }
static uint16_t r_u16(struct rd *r) { uint16_t v; r_bytes(r, &v, 2); return le16toh(v); }
static uint32_t r_u32(struct rd *r) { uint32_t v; r_bytes(r, &v, 4); return le32toh(v); }
static uint64_t r_u64(struct rd *r) { uint64_t v; r_bytes(r, &v, 8); return le64toh(v); }

/* ---- node records ----------------------------------------------------------------- */

static void w_str(struct wr *w, const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    if (n == max) /* not terminated: the host struct is wrong */
        w->over = true;
    w_u8(w, (uint8_t)n);
    w_bytes(w, s, n);
}

static void r_str(struct rd *r, char *dst, size_t max)
{
    size_t n = r_u8(r);
    memset(dst, 0, max);
    if (n >= max) {
        r->bad = true;
        return;
    }
    r_bytes(r, dst, n);
    if (memchr(dst, 0, n)) /* a NUL inside: not what an encoder writes */
        r->bad = true;
}

static void w_node(struct wr *w, const struct cfx_dp_node *n)
{
    if (n->naddr > CFX_NODE_ADDRS_MAX) {
        w->over = true;
        return;
    }
    w_u32(w, n->node_id);
    w_u8(w, n->naddr);
    w_str(w, n->host_id, sizeof(n->host_id));
    for (unsigned a = 0; a < n->naddr; a++) {
        if (n->addr[a].len > CFX_TP_ADDR_MAX)
            w->over = true;
        w_str(w, n->addr[a].tp, sizeof(n->addr[a].tp));
        w_u8(w, n->addr[a].len);
        w_bytes(w, n->addr[a].addr, CFX_MIN((size_t)n->addr[a].len, sizeof(n->addr[a].addr)));
    }
}

static void r_node(struct rd *r, struct cfx_dp_node *n)
{
    memset(n, 0, sizeof(*n));
    n->node_id = r_u32(r);
    n->naddr = r_u8(r);
    r_str(r, n->host_id, sizeof(n->host_id));
    if (n->node_id == 0 || n->naddr > CFX_NODE_ADDRS_MAX) {
        r->bad = true;
        return;
    }
    for (unsigned a = 0; a < n->naddr && !r->bad; a++) {
        r_str(r, n->addr[a].tp, sizeof(n->addr[a].tp));
        n->addr[a].len = r_u8(r);
        if (n->addr[a].len > CFX_TP_ADDR_MAX) {
            r->bad = true;
            return;
        }
        r_bytes(r, n->addr[a].addr, n->addr[a].len);
    }
}

/* ---- encode ------------------------------------------------------------------------- */

int cfx__dp_msg_encode(const void *msg, size_t len, void *out, size_t cap)
{
    const union cfx_dp_msg *m = msg;
    struct wr w = { .p = out, .cap = cap };
    struct cfx_dp_hdr h;

    if (len < sizeof(h))
        return CFX_ERR_INVALID;
    memcpy(&h, msg, sizeof(h));
    w_u16(&w, h.magic);
    w_u8(&w, h.version);
    w_u8(&w, h.type);
    w_u32(&w, h.slot);
    switch (h.type) {
    case CFX_DP_HELLO:
        w_u32(&w, m->hello.node_id);
        w_bytes(&w, m->hello.nonce, sizeof(m->hello.nonce));
        w_u32(&w, m->hello.secure);
        break;
    case CFX_DP_AUTH:
        w_bytes(&w, m->auth.nonce, sizeof(m->auth.nonce));
        w_bytes(&w, m->auth.mac, sizeof(m->auth.mac));
        w_u32(&w, m->auth.eager_max);
        w_u32(&w, m->auth.eager_credits);
        w_u32(&w, m->auth.secure);
        break;
    case CFX_DP_GET_REQ:
        w_bytes(&w, m->get_req.id, sizeof(m->get_req.id));
        w_u64(&w, m->get_req.size);
        w_u32(&w, m->get_req.chunk_size);
        w_u32(&w, m->get_req.first_chunk);
        w_u32(&w, m->get_req.credits);
        w_u32(&w, m->get_req.flags);
        w_u64(&w, m->get_req.chan);
        w_u32(&w, m->get_req.tag);
        w_u32(&w, m->get_req.ring);
        w_u32(&w, m->get_req.end_chunk);
        w_u8(&w, m->get_req.rdesc.len);
        w_bytes(&w, m->get_req.rdesc.data, sizeof(m->get_req.rdesc.data));
        break;
    case CFX_DP_GET_NACK:
    case CFX_DP_CANCEL_DONE:
        w_u32(&w, (uint32_t)m->nack.status);
        break;
    case CFX_DP_CREDIT:
    case CFX_DP_EAGER_CREDIT:
        w_u32(&w, m->credit.credits);
        break;
    case CFX_DP_CANCEL:
    case CFX_DP_CANCEL_UNSEEN:
    case CFX_DP_CANCEL_ACK:
        break;
    case CFX_DP_REDUCE_DONE:
    case CFX_DP_REDUCE_ABORT:
    case CFX_DP_REDUCE_LOST:
        w_u64(&w, m->reduce_done.task);
        w_u32(&w, (uint32_t)m->reduce_done.status);
        w_u32(&w, m->reduce_done.node_id);
        break;
    case CFX_DP_REDUCE_TASK: {
        const struct cfx_dp_reduce_task *t = &m->reduce_task;
        if (t->nchildren > CFX_RTASK_MAX_CHILDREN)
            return CFX_ERR_INVALID;
        w_u64(&w, t->task);
        w_bytes(&w, t->input, sizeof(t->input));
        w_bytes(&w, t->output, sizeof(t->output));
        w_u64(&w, t->size);
        w_u32(&w, t->chunk_size);
        w_u32(&w, t->timeout_ms);
        w_u8(&w, t->dtype);
        w_u8(&w, t->op);
        w_u8(&w, t->nchildren);
        w_u8(&w, t->final);
        w_u64(&w, t->offset);
        w_u32(&w, t->putter);
        w_u8(&w, t->stripes);
        for (unsigned c = 0; c < t->nchildren; c++)
            w_bytes(&w, t->child_obj[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < t->nchildren; c++)
            w_node(&w, &t->child[c]);
        break;
    }
    case CFX_DP_REDUCE_ADOPT: {
        const struct cfx_dp_reduce_adopt *a = &m->reduce_adopt;
        if (a->n > CFX_RTASK_MAX_CHILDREN)
            return CFX_ERR_INVALID;
        w_u64(&w, a->task);
        w_u8(&w, a->n);
        w_u8(&w, a->last);
        for (unsigned c = 0; c < a->n; c++)
            w_bytes(&w, a->replaces[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < a->n; c++)
            w_bytes(&w, a->child_obj[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < a->n; c++)
            w_node(&w, &a->child[c]);
        break;
    }
    case CFX_DP_P2P_EAGER:
        if (len < sizeof(m->eager) || len - sizeof(m->eager) != m->eager.len)
            return CFX_ERR_INVALID;
        w_u64(&w, m->eager.chan);
        w_u32(&w, m->eager.tag);
        w_u32(&w, m->eager.len);
        w_bytes(&w, m->eager.data, m->eager.len);
        break;
    case CFX_DP_GET_DATA:
        if (len < sizeof(m->get_data) || len - sizeof(m->get_data) != m->get_data.len)
            return CFX_ERR_INVALID;
        w_bytes(&w, m->get_data.id, sizeof(m->get_data.id));
        w_u32(&w, m->get_data.len);
        w_bytes(&w, m->get_data.data, m->get_data.len);
        break;
    default:
        return CFX_ERR_INVALID;
    }
    if (w.over)
        return cap >= CFX_TP_SEND_MAX ? CFX_ERR_TOO_BIG : CFX_ERR_INVALID;
    return (int)w.off;
}

/* ---- decode ------------------------------------------------------------------------- */

static bool dp_node_ok(const struct cfx_dp_node *n)
{
    if (n->node_id == 0 || n->naddr > CFX_NODE_ADDRS_MAX || !memchr(n->host_id, 0, sizeof(n->host_id)))
        return false;
    for (unsigned a = 0; a < n->naddr; a++)
        if (n->addr[a].len > CFX_TP_ADDR_MAX || !memchr(n->addr[a].tp, 0, sizeof(n->addr[a].tp)))
            return false;
    return true;
}

/* The host form of the wire bytes @p buf (every field in host order, the
 * rest zero) in @p m, its length in *out_len; the type, or CFX_ERR_PROTO
 * when the bytes are not exactly one message of a known type. */
static int decode(const void *buf, size_t len, union cfx_dp_msg *m, size_t *out_len)
{
    struct rd r = { .p = buf, .len = len };
    struct cfx_dp_hdr h;

    h.magic = r_u16(&r);
    h.version = r_u8(&r);
    h.type = r_u8(&r);
    h.slot = r_u32(&r);
    if (r.bad || h.magic != CFX_DP_MAGIC || h.version != CFX_DP_VERSION || h.type == 0 ||
        h.type >= CFX_DP_TYPE_MAX)
        return CFX_ERR_PROTO;
    size_t host = 0;
    switch (h.type) {
    case CFX_DP_HELLO:
        memset(&m->hello, 0, sizeof(m->hello));
        m->hello.node_id = r_u32(&r);
        r_bytes(&r, m->hello.nonce, sizeof(m->hello.nonce));
        m->hello.secure = r_u32(&r);
        if (m->hello.secure > CFX_SEAL_ENCRYPT)
            r.bad = true;
        host = sizeof(m->hello);
        break;
    case CFX_DP_AUTH:
        memset(&m->auth, 0, sizeof(m->auth));
        r_bytes(&r, m->auth.nonce, sizeof(m->auth.nonce));
        r_bytes(&r, m->auth.mac, sizeof(m->auth.mac));
        m->auth.eager_max = r_u32(&r);
        m->auth.eager_credits = r_u32(&r);
        m->auth.secure = r_u32(&r);
        if (m->auth.secure > CFX_SEAL_ENCRYPT)
            r.bad = true;
        host = sizeof(m->auth);
        break;
    case CFX_DP_GET_REQ:
        memset(&m->get_req, 0, sizeof(m->get_req));
        r_bytes(&r, m->get_req.id, sizeof(m->get_req.id));
        m->get_req.size = r_u64(&r);
        m->get_req.chunk_size = r_u32(&r);
        m->get_req.first_chunk = r_u32(&r);
        m->get_req.credits = r_u32(&r);
        m->get_req.flags = r_u32(&r);
        m->get_req.chan = r_u64(&r);
        m->get_req.tag = r_u32(&r);
        m->get_req.ring = r_u32(&r);
        m->get_req.end_chunk = r_u32(&r);
        m->get_req.rdesc.len = r_u8(&r);
        r_bytes(&r, m->get_req.rdesc.data, sizeof(m->get_req.rdesc.data));
        host = sizeof(m->get_req);
        break;
    case CFX_DP_GET_NACK:
    case CFX_DP_CANCEL_DONE:
        memset(&m->nack, 0, sizeof(m->nack));
        m->nack.status = (int32_t)r_u32(&r);
        host = sizeof(m->nack);
        break;
    case CFX_DP_CREDIT:
    case CFX_DP_EAGER_CREDIT:
        memset(&m->credit, 0, sizeof(m->credit));
        m->credit.credits = r_u32(&r);
        host = sizeof(m->credit);
        break;
    case CFX_DP_CANCEL:
    case CFX_DP_CANCEL_UNSEEN:
    case CFX_DP_CANCEL_ACK:
        memset(&m->hdr, 0, sizeof(m->hdr));
        host = sizeof(m->hdr);
        break;
    case CFX_DP_REDUCE_DONE:
    case CFX_DP_REDUCE_ABORT:
    case CFX_DP_REDUCE_LOST:
        memset(&m->reduce_done, 0, sizeof(m->reduce_done));
        m->reduce_done.task = r_u64(&r);
        m->reduce_done.status = (int32_t)r_u32(&r);
        m->reduce_done.node_id = r_u32(&r);
        host = sizeof(m->reduce_done);
        break;
    case CFX_DP_REDUCE_TASK: {
        struct cfx_dp_reduce_task *t = &m->reduce_task;
        memset(t, 0, sizeof(*t));
        t->task = r_u64(&r);
        r_bytes(&r, t->input, sizeof(t->input));
        r_bytes(&r, t->output, sizeof(t->output));
        t->size = r_u64(&r);
        t->chunk_size = r_u32(&r);
        t->timeout_ms = r_u32(&r);
        t->dtype = r_u8(&r);
        t->op = r_u8(&r);
        t->nchildren = r_u8(&r);
        t->final = r_u8(&r);
        t->offset = r_u64(&r);
        t->putter = r_u32(&r);
        t->stripes = r_u8(&r);
        if (t->nchildren > CFX_RTASK_MAX_CHILDREN)
            return CFX_ERR_PROTO;
        for (unsigned c = 0; c < t->nchildren; c++)
            r_bytes(&r, t->child_obj[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < t->nchildren && !r.bad; c++)
            r_node(&r, &t->child[c]);
        host = sizeof(*t);
        break;
    }
    case CFX_DP_REDUCE_ADOPT: {
        struct cfx_dp_reduce_adopt *a = &m->reduce_adopt;
        memset(a, 0, sizeof(*a));
        a->task = r_u64(&r);
        a->n = r_u8(&r);
        a->last = r_u8(&r);
        if (a->n > CFX_RTASK_MAX_CHILDREN)
            return CFX_ERR_PROTO;
        for (unsigned c = 0; c < a->n; c++)
            r_bytes(&r, a->replaces[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < a->n; c++)
            r_bytes(&r, a->child_obj[c], CFX_OBJECT_ID_LEN);
        for (unsigned c = 0; c < a->n && !r.bad; c++)
            r_node(&r, &a->child[c]);
        host = sizeof(*a);
        break;
    }
    case CFX_DP_P2P_EAGER:
        memset(&m->eager, 0, sizeof(m->eager));
        m->eager.chan = r_u64(&r);
        m->eager.tag = r_u32(&r);
        m->eager.len = r_u32(&r);
        if (r.bad || m->eager.len > CFX_EAGER_LIMIT || m->eager.len != len - r.off)
            return CFX_ERR_PROTO;
        r_bytes(&r, m->eager.data, m->eager.len);
        host = sizeof(m->eager) + m->eager.len;
        break;
    case CFX_DP_GET_DATA:
        memset(&m->get_data, 0, sizeof(m->get_data));
        r_bytes(&r, m->get_data.id, sizeof(m->get_data.id));
        m->get_data.len = r_u32(&r);
        if (r.bad || m->get_data.len == 0 || m->get_data.len > CFX_DP_GET_SMALL_MAX ||
            m->get_data.len != len - r.off)
            return CFX_ERR_PROTO;
        r_bytes(&r, m->get_data.data, m->get_data.len);
        host = sizeof(m->get_data) + m->get_data.len;
        break;
    }
    if (r.bad || r.off != len) /* short, or bytes left over */
        return CFX_ERR_PROTO;
    m->hdr = h;
    *out_len = host;
    return h.type;
}

/* The checks of a decoded message's fields that need no state. */
static int check(const union cfx_dp_msg *msg, size_t len)
{
    const void *buf = msg;
    static const size_t sizes[CFX_DP_TYPE_MAX] = {
        [CFX_DP_HELLO] = sizeof(struct cfx_dp_hello),
        [CFX_DP_GET_REQ] = sizeof(struct cfx_dp_get_req),
        [CFX_DP_GET_NACK] = sizeof(struct cfx_dp_nack),
        [CFX_DP_CREDIT] = sizeof(struct cfx_dp_credit),
        [CFX_DP_CANCEL] = sizeof(struct cfx_dp_hdr),
        [CFX_DP_CANCEL_ACK] = sizeof(struct cfx_dp_hdr),
        [CFX_DP_CANCEL_UNSEEN] = sizeof(struct cfx_dp_hdr),
        [CFX_DP_CANCEL_DONE] = sizeof(struct cfx_dp_nack),
        [CFX_DP_AUTH] = sizeof(struct cfx_dp_auth),
        [CFX_DP_REDUCE_TASK] = sizeof(struct cfx_dp_reduce_task),
        [CFX_DP_REDUCE_DONE] = sizeof(struct cfx_dp_reduce_done),
        [CFX_DP_REDUCE_ABORT] = sizeof(struct cfx_dp_reduce_done),
        [CFX_DP_REDUCE_LOST] = sizeof(struct cfx_dp_reduce_done),
        [CFX_DP_REDUCE_ADOPT] = sizeof(struct cfx_dp_reduce_adopt),
        [CFX_DP_P2P_EAGER] = sizeof(struct cfx_dp_eager), /* + its payload */
        [CFX_DP_EAGER_CREDIT] = sizeof(struct cfx_dp_credit),
        [CFX_DP_GET_DATA] = sizeof(struct cfx_dp_get_data), /* + its payload */
    };
    struct cfx_dp_hdr h;

    if (len < sizeof(h))
        return CFX_ERR_PROTO;
    memcpy(&h, buf, sizeof(h));
    if (h.magic != CFX_DP_MAGIC || h.version != CFX_DP_VERSION || h.type == 0 ||
        h.type >= CFX_DP_TYPE_MAX)
        return CFX_ERR_PROTO;
    if (h.type == CFX_DP_P2P_EAGER) {
        /* the one variable-length message: header, then exactly len bytes */
        uint32_t n;
        if (len < sizeof(struct cfx_dp_eager) || h.slot != 0)
            return CFX_ERR_PROTO;
        memcpy(&n, (const uint8_t *)buf + offsetof(struct cfx_dp_eager, len), sizeof(n));
        if (n > CFX_EAGER_LIMIT || len != sizeof(struct cfx_dp_eager) + n)
            return CFX_ERR_PROTO;
        return h.type;
    }
    if (h.type == CFX_DP_GET_DATA) {
        /* header, then exactly len bytes of one small object */
        uint32_t n;
        if (len < sizeof(struct cfx_dp_get_data) || h.slot >= CFX_XFER_SLOTS)
            return CFX_ERR_PROTO;
        memcpy(&n, (const uint8_t *)buf + offsetof(struct cfx_dp_get_data, len), sizeof(n));
        if (n == 0 || n > CFX_DP_GET_SMALL_MAX || len != sizeof(struct cfx_dp_get_data) + n)
            return CFX_ERR_PROTO;
        return h.type;
    }
    if (len != sizes[h.type])
        return CFX_ERR_PROTO;
    if (h.type != CFX_DP_HELLO && h.type != CFX_DP_AUTH && h.slot >= CFX_XFER_SLOTS)
        return CFX_ERR_PROTO;
    if (h.type == CFX_DP_GET_REQ) {
        const struct cfx_dp_get_req *r = buf;
        if (r->rdesc.len > CFX_TP_RDESC_MAX || (r->flags & ~CFX_DP_GET_FLAGS) ||
            ((r->flags & CFX_DP_GET_RING) && (r->ring == 0 || r->credits > r->ring)) ||
            r->chunk_size < CFX_CHUNK_MIN ||
            r->chunk_size > CFX_CHUNK_MAX || r->credits == 0 ||
            r->size / r->chunk_size >= CFX_MAX_CHUNKS ||
            r->first_chunk > cfx__nchunks(r->size, r->chunk_size) ||
            (r->end_chunk && (r->end_chunk <= r->first_chunk ||
                              r->end_chunk > cfx__nchunks(r->size, r->chunk_size) ||
                              (r->flags & (CFX_DP_GET_SMALL | CFX_DP_GET_P2P)))) ||
            ((r->flags & CFX_DP_GET_SMALL) &&
             (r->size == 0 || r->size > CFX_DP_GET_SMALL_MAX || (r->flags & CFX_DP_GET_P2P))))
            return CFX_ERR_PROTO;
    }
    if (h.type == CFX_DP_REDUCE_TASK) {
        const struct cfx_dp_reduce_task *t = buf;
        if (t->nchildren > CFX_RTASK_MAX_CHILDREN || t->dtype >= CFX_DTYPE_LAST ||
            t->op >= CFX_OP_LAST || (t->final & ~CFX_RTASK_FLAGS) || t->chunk_size < CFX_CHUNK_MIN ||
            t->chunk_size > CFX_CHUNK_MAX || t->size / t->chunk_size >= CFX_MAX_CHUNKS ||
            t->size % cfx_dtype_size((enum cfx_dtype)t->dtype) ||
            t->chunk_size % cfx_dtype_size((enum cfx_dtype)t->dtype) ||
            t->offset % t->chunk_size || t->offset / t->chunk_size >= CFX_MAX_CHUNKS ||
            (!(t->final & CFX_RTASK_GATHER) && t->stripes) ||
            ((t->final & CFX_RTASK_GATHER) &&
             (t->offset || t->nchildren == 0 || t->stripes < t->nchildren ||
              t->stripes > CFX_RTASK_MAX_SLOTS ||
              (t->final & (CFX_RTASK_REPAIR | CFX_RTASK_EARLY)) ||
              (!(t->final & CFX_RTASK_FINAL) && !t->putter))))
            return CFX_ERR_PROTO;
        for (unsigned c = 0; c < t->nchildren; c++)
            if (!dp_node_ok(&t->child[c]))
                return CFX_ERR_PROTO;
    }
    if (h.type == CFX_DP_REDUCE_ADOPT) {
        const struct cfx_dp_reduce_adopt *a = buf;
        if (a->n == 0 || a->n > CFX_RTASK_MAX_CHILDREN || a->last > 1)
            return CFX_ERR_PROTO;
        for (unsigned c = 0; c < a->n; c++)
            if (!dp_node_ok(&a->child[c]))
                return CFX_ERR_PROTO;
    }
    return h.type;
}


int cfx__dp_msg_decode(const void *buf, size_t len, union cfx_dp_msg *out, size_t *out_len)
{
    size_t host;
    int type = decode(buf, len, out, &host);
    if (type < 0)
        return type;
    if ((type = check(out, host)) < 0)
        return type;
    *out_len = host;
    return type;
}

int cfx__dp_msg_check(const void *buf, size_t len)
{
    union cfx_dp_msg m;
    size_t host;
    return cfx__dp_msg_decode(buf, len, &m, &host);
}

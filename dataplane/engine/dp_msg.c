/*
 * Validation of data-plane control messages (pure: no context, no state),
 * kept on its own so that test/fuzz/fuzz_dp_msg.c can fuzz it without the
 * rest of the engine.  Used by xfer.c on every message a peer sends.
 */
#include "engine.h"

#include <stddef.h>
#include <string.h>

static bool dp_node_ok(const struct cfx_dp_node *n)
{
    if (n->node_id == 0 || n->naddr > CFX_DP_NODE_ADDRS || !memchr(n->host_id, 0, sizeof(n->host_id)))
        return false;
    for (unsigned a = 0; a < n->naddr; a++)
        if (n->addr[a].len > CFX_TP_ADDR_MAX || !memchr(n->addr[a].tp, 0, sizeof(n->addr[a].tp)))
            return false;
    return true;
}

int cfx__dp_msg_check(const void *buf, size_t len)
{
    static const size_t sizes[CFX_DP_TYPE_MAX] = {
        [CFX_DP_HELLO] = sizeof(struct cfx_dp_hello),
        [CFX_DP_GET_REQ] = sizeof(struct cfx_dp_get_req),
        [CFX_DP_GET_NACK] = sizeof(struct cfx_dp_nack),
        [CFX_DP_CREDIT] = sizeof(struct cfx_dp_credit),
        [CFX_DP_CANCEL] = sizeof(struct cfx_dp_hdr),
        [CFX_DP_CANCEL_ACK] = sizeof(struct cfx_dp_hdr),
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
            t->chunk_size % cfx_dtype_size((enum cfx_dtype)t->dtype))
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


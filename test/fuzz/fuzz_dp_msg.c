/*
 * libFuzzer target: cfx__dp_msg_decode(), the decoding and validation of
 * every data-plane control message (HELLO, AUTH, GET_REQ, ...) a peer sends
 * with ep_send.
 * What it accepts must be safe for xfer.c to use without further checks of
 * the same fields: chunk counts that fit the 20-bit chunk index, a resume
 * point inside the object, a remote descriptor inside its buffer, a slot
 * inside the slot table.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Transports hand over aligned buffers of exactly the message size. */
    void *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    static union cfx_dp_msg m;
    size_t len = 0;
    int type = cfx__dp_msg_decode(buf, size, &m, &len);
    if (type >= 0) {
        const struct cfx_dp_hdr *h = &m.hdr;
        if (type == 0 || type >= CFX_DP_TYPE_MAX || len < sizeof(*h) || len > sizeof(m) ||
            h->type != type)
            abort();
        if (type != CFX_DP_HELLO && type != CFX_DP_AUTH && h->slot >= CFX_XFER_SLOTS)
            abort();
        if (type == CFX_DP_GET_REQ) {
            const struct cfx_dp_get_req *r = &m.get_req;
            if (len != sizeof(*r) || r->rdesc.len > CFX_TP_RDESC_MAX)
                abort();
            uint32_t n = cfx__nchunks(r->size, r->chunk_size);
            if (n > CFX_MAX_CHUNKS || r->first_chunk > n || r->credits == 0)
                abort();
        }
        if (type == CFX_DP_REDUCE_TASK) {
            for (unsigned c = 0; c < m.reduce_task.nchildren; c++)
                if (m.reduce_task.child[c].naddr > CFX_NODE_ADDRS_MAX ||
                    !memchr(m.reduce_task.child[c].host_id, 0, CFX_HOST_ID_MAX))
                    abort();
        }
        /* what decodes encodes back to the same bytes */
        static uint8_t again[CFX_TP_SEND_MAX + 64];
        int n = cfx__dp_msg_encode(&m, len, again, sizeof(again));
        if (n < 0 || (size_t)n != size || memcmp(again, buf, size) != 0)
            abort();
    } else if (type != CFX_ERR_PROTO) {
        abort();
    }
    free(buf);
    return 0;
}

/* The reduction kernels (dataplane/reduce) are not part of the fuzz build;
 * the element sizes cfx__dp_msg_check() needs for REDUCE_TASK are these. */
size_t cfx_dtype_size(enum cfx_dtype dtype)
{
    static const size_t sizes[CFX_DTYPE_LAST] = {
        [CFX_DTYPE_F32] = 4, [CFX_DTYPE_F64] = 8, [CFX_DTYPE_F16] = 2, [CFX_DTYPE_BF16] = 2,
        [CFX_DTYPE_I32] = 4, [CFX_DTYPE_I64] = 8, [CFX_DTYPE_U8] = 1,
    };
    return (unsigned)dtype < CFX_DTYPE_LAST ? sizes[dtype] : 0;
}

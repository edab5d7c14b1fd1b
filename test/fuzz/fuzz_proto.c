/*
 * libFuzzer target: the control-plane decoders on arbitrary bytes.
 *
 * The input is decoded three ways: as one whole frame (cfx__msg_decode), as
 * a byte stream cut into frames by the header's length field the way the
 * coordinator and the client do, and, for every frame that decodes, encoded
 * again and decoded once more (a decoded message must be encodable: the
 * decoder's bounds are the encoder's).  Every sub-frame is copied into a
 * buffer of exactly its size so that AddressSanitizer sees any read past it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "control/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_frame(const uint8_t *frame, size_t len)
{
    struct cfx_msg m;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, frame, len);
    int rc = cfx__msg_decode(copy, len, &m);
    if (rc != CFX_OK) {
        if (rc != CFX_ERR_PROTO && rc != CFX_ERR_TOO_BIG && rc != CFX_ERR_VERSION)
            abort(); /* the decoder's contract names only these */
        free(copy);
        return;
    }
    (void)cfx__msg_type_name(m.type);
    if (m.type == CFX_MSG_NODES_REPLY || m.type == CFX_MSG_OBJECTS_REPLY) {
        for (uint32_t i = 0; i < m.u.page.count; i++) {
            if (m.type == CFX_MSG_NODES_REPLY) {
                struct cfx_node_rec n;
                cfx__msg_node_at(&m, i, &n);
                if (n.naddr > CFX_NODE_ADDRS_MAX || n.load.ntp > CFX_LOAD_TPS_MAX)
                    abort();
            } else {
                struct cfx_ctl_obj_rec o;
                cfx__msg_obj_at(&m, i, &o);
            }
        }
    } else if (m.type == CFX_MSG_TASKS_REPLY) {
        /* a page decodes to records (its raw bytes), not to an encodable
         * message: every record must hold what the decoder promised */
        for (uint32_t i = 0; i < m.u.tpage.count; i++) {
            struct cfx_ctl_task_rec t;
            cfx__msg_task_at(&m, i, &t);
            if (t.state > CFX_CTL_TASK_DONE || t.status > 0 || t.ninputs > CFX_TASK_IO_MAX ||
                t.nresults > CFX_TASK_IO_MAX || !memchr(t.name, 0, sizeof(t.name)) ||
                !memchr(t.text, 0, sizeof(t.text)))
                abort();
        }
    } else {
        uint8_t *out;
        size_t olen;
        struct cfx_msg again;
        if (cfx__msg_encode_alloc(&m, &out, &olen) != CFX_OK)
            abort(); /* decoded but not encodable: decoder and encoder disagree */
        if (cfx__msg_decode(out, olen, &again) != CFX_OK || again.type != m.type ||
            again.req_id != m.req_id)
            abort();
        free(out);
    }
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx_msg_hdr h;
    size_t off = 0;

    check_frame(data, size);

    /* As a stream: the framing loop of coord.c conn_parse / client.c rbuf_frame. */
    while (size - off >= CFX_PROTO_HDR_LEN) {
        if (cfx__msg_hdr_decode(data + off, size - off, &h) != CFX_OK)
            break;
        if (h.payload_len > CFX_PROTO_MAX_PAYLOAD)
            abort(); /* the header check must bound what a reader allocates */
        size_t need = CFX_PROTO_HDR_LEN + (size_t)h.payload_len;
        if (need > size - off)
            break; /* a reader would wait for more */
        check_frame(data + off, need);
        off += need;
    }
    return 0;
}

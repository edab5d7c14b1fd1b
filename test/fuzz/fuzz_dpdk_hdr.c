/*
 * libFuzzer target: the dpdk transport's decoders of received bytes, the
 * reliability header (cfx__dpdk_hdr_decode) and the UDP/IPv4/Ethernet frame
 * around it (cfx__dpdk_frame_parse).
 *
 * Input: one byte of mode (bit 0: a whole frame, else a bare header and its
 * payload), then the bytes.  What the decoders accept must bound what the
 * sessions then read: a payload inside the input and under
 * CFX_DPDK_PAYLOAD_MAX, fragment and message fields within their caps; and
 * an accepted header encodes back to the same bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/dpdk/dpdk_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_hdr(const struct cfx__dpdk_hdr *h)
{
    if (h->len > CFX_DPDK_PAYLOAD_MAX)
        abort();
    if ((h->flags & CFX_DPDK_F_DATA) &&
        (!h->frag_cnt || h->frag_idx >= h->frag_cnt || h->msg_len > CFX_DPDK_MSG_MAX ||
         h->len > h->msg_len))
        abort();
    if (!(h->flags & CFX_DPDK_F_DATA) && h->len)
        abort();
    if ((h->flags & CFX_DPDK_F_ACK) && h->window > CFX_DPDK_WIN_MAX)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx__dpdk_hdr h;
    const char *why;

    if (size < 1)
        return 0;
    bool frame = data[0] & 1;
    data++;
    size--;
    /* a copy of exactly size bytes, so that ASan sees any read past it */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (frame) {
        static const struct cfx__dpdk_addr local = {{0x02, 0, 0, 0, 0, 0xB}, 0x0A000002, 4791};
        struct cfx__dpdk_addr src;
        const void *payload;
        int rc = cfx__dpdk_frame_parse(buf, size, &local, &src, &h, &payload, &why);
        if (rc == CFX_OK) {
            check_hdr(&h);
            if ((const uint8_t *)payload < buf || (const uint8_t *)payload + h.len > buf + size)
                abort();
        } else if (rc != CFX_ERR_PROTO || !why) {
            abort();
        }
    } else {
        int rc = cfx__dpdk_hdr_decode(buf, size, &h, &why);
        if (rc == CFX_OK) {
            uint8_t again[CFX_DPDK_HDR_LEN];
            check_hdr(&h);
            if (CFX_DPDK_HDR_LEN + (size_t)h.len != size)
                abort();
            cfx__dpdk_hdr_encode(&h, again);
            if (memcmp(again, buf, CFX_DPDK_HDR_LEN) != 0)
                abort();
        } else if (rc != CFX_ERR_PROTO || !why) {
            abort();
        }
    }
    free(buf);
    return 0;
}

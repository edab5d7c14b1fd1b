/*
 * libFuzzer target: the dpdk transport's decoders of received bytes, the
 * reliability header (cfx__dpdk_hdr_decode) and the UDP/IPv4/Ethernet frame
 * around it (cfx__dpdk_frame_parse).
 *
 * Input: one byte of mode (bit 1: a stream of packets into a session, each
 * a little-endian u16 length and its bytes; else bit 0: a whole frame, else
 * a bare header and its payload), then the bytes.  The session has messages
 * of its own in flight, so that acks and sacks meet real state; whatever
 * the peer sends, the session must neither crash nor read out of bounds.  What the decoders accept must bound what the
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
    if ((h->flags & CFX_DPDK_F_DATA) && (!h->frag_cnt || h->frag_idx >= h->frag_cnt ||
                                         h->msg_len > CFX_DPDK_MSG_MAX || h->len > h->msg_len))
        abort();
    if (!(h->flags & CFX_DPDK_F_DATA) && h->len)
        abort();
    if ((h->flags & CFX_DPDK_F_ACK) && h->window > CFX_DPDK_WIN_MAX)
        abort();
    if ((h->flags & CFX_DPDK_F_CTL) && (h->flags & (CFX_DPDK_F_DATA | CFX_DPDK_F_ACK)))
        abort();
}

static int null_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    /* the bytes the session hands out must be readable */
    volatile uint8_t sink = 0;
    for (uint16_t i = 0; i < h->len; i++)
        sink ^= ((const uint8_t *)payload)[i];
    (void)sink;
    return 0;
}

static int null_deliver(void *ctx, const void *buf, size_t len)
{
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < len; i++)
        sink ^= ((const uint8_t *)buf)[i];
    (void)sink;
    return (len & 1) ? CFX_ERR_AGAIN : 0; /* refuse some: held messages */
}

static const struct cfx__dpdk_rel_ops null_ops = { .tx = null_tx, .deliver = null_deliver };

static void session_stream(const uint8_t *data, size_t size)
{
    static uint8_t out[3][200];
    struct cfx__dpdk_sess s;
    struct cfx__dpdk_rel_params p = { .mtu_payload = 64,
                                      .rcv_slots = 16,
                                      .snd_slots = 16,
                                      .sendq_max = 4,
                                      .msg_max = 1024,
                                      .max_retries = 3 };
    uint64_t now = 1000;
    if (cfx__dpdk_sess_init(&s, &p, &null_ops, NULL, 7, 8, "fuzz-peer") != CFX_OK)
        abort();
    for (int i = 0; i < 3; i++)
        cfx__dpdk_sess_send(&s, out[i], sizeof(out[i]), NULL, now);
    while (size >= 2) {
        size_t len = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        uint8_t *pkt = malloc(len ? len : 1);
        struct cfx__dpdk_hdr h;
        const char *why;
        if (!pkt)
            break;
        memcpy(pkt, data, len);
        if (cfx__dpdk_hdr_decode(pkt, len, &h, &why) == CFX_OK) {
            h.session = 7;
            cfx__dpdk_sess_rx(&s, &h, pkt + cfx__dpdk_hdr_len(h.flags), now, 0);
        }
        free(pkt);
        data += len;
        size -= len;
        now += 300000;
        cfx__dpdk_sess_poll(&s, now);
        if (s.error && !s.error_msg[0])
            abort();
    }
    cfx__dpdk_sess_fini(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx__dpdk_hdr h;
    const char *why;

    if (size < 1)
        return 0;
    bool frame = data[0] & 1, session = data[0] & 2;
    data++;
    size--;
    if (session) {
        session_stream(data, size);
        return 0;
    }
    /* a copy of exactly size bytes, so that ASan sees any read past it */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (frame) {
        static const struct cfx__dpdk_addr local = { { 0x02, 0, 0, 0, 0, 0xB }, 0x0A000002, 4791 };
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
            uint8_t again[CFX_DPDK_HDR_MAX];
            check_hdr(&h);
            size_t hlen = cfx__dpdk_hdr_len(h.flags);
            if (hlen + (size_t)h.len != size)
                abort();
            if (cfx__dpdk_hdr_encode(&h, again) != hlen || memcmp(again, buf, hlen) != 0)
                abort();
        } else if (rc != CFX_ERR_PROTO || !why) {
            abort();
        }
    }
    free(buf);
    return 0;
}

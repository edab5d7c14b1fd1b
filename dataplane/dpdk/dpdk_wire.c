/*
 * dpdk transport: encoding and checking of the reliability header.
 *
 * Pure functions over bytes (no session), so that they can be fuzzed on
 * their own (test/fuzz/fuzz_dpdk_hdr.c); dpdk_rel.c applies what needs the
 * session (fragment size, window, message cap) after them.
 */
#include <endian.h>
#include <stddef.h>
#include <string.h>

#include <conflux/status.h>

#include "dpdk_rel.h"

/* The header as it lies on the wire: every field little endian, no padding. */
struct cfx__dpdk_wire {
    uint16_t magic;  /* CFX_DPDK_MAGIC */
    uint8_t version; /* CFX_DPDK_VERSION */
    uint8_t flags;   /* enum cfx__dpdk_flag */
    uint32_t session;
    uint32_t seq;
    uint32_t ack;
    uint64_t sack;
    uint16_t window;
    uint16_t len;
    uint32_t msg_id;
    uint16_t frag_idx;
    uint16_t frag_cnt;
    uint32_t msg_len;
    uint64_t ts;
    uint64_t ts_echo;
    uint32_t echo_delay;
    uint32_t reserved; /* zero */
};
_Static_assert(sizeof(struct cfx__dpdk_wire) == CFX_DPDK_HDR_LEN, "wire header is 64 bytes");
_Static_assert(offsetof(struct cfx__dpdk_wire, sack) == 16, "sack at 16");
_Static_assert(offsetof(struct cfx__dpdk_wire, msg_len) == 36, "msg_len at 36");
_Static_assert(offsetof(struct cfx__dpdk_wire, ts_echo) == 48, "ts_echo at 48");
_Static_assert(offsetof(struct cfx__dpdk_wire, echo_delay) == 56, "echo_delay at 56");
_Static_assert(CFX_DPDK_PAYLOAD_MAX <= UINT16_MAX, "payload length fits its field");
_Static_assert(CFX_DPDK_WIN_MAX <= UINT16_MAX, "window fits its field");

void cfx__dpdk_hdr_encode(const struct cfx__dpdk_hdr *h, void *out)
{
    struct cfx__dpdk_wire w = {
        .magic = htole16(CFX_DPDK_MAGIC),
        .version = CFX_DPDK_VERSION,
        .flags = h->flags,
        .session = htole32(h->session),
        .seq = htole32(h->seq),
        .ack = htole32(h->ack),
        .sack = htole64(h->sack),
        .window = htole16(h->window),
        .len = htole16(h->len),
        .msg_id = htole32(h->msg_id),
        .frag_idx = htole16(h->frag_idx),
        .frag_cnt = htole16(h->frag_cnt),
        .msg_len = htole32(h->msg_len),
        .ts = htole64(h->ts),
        .ts_echo = htole64(h->ts_echo),
        .echo_delay = htole32(h->echo_delay),
    };
    memcpy(out, &w, sizeof(w));
}

int cfx__dpdk_hdr_decode(const void *buf, size_t len, struct cfx__dpdk_hdr *out, const char **why)
{
    struct cfx__dpdk_wire w;

    *why = NULL;
    if (len < sizeof(w)) {
        *why = "truncated header";
        return CFX_ERR_PROTO;
    }
    memcpy(&w, buf, sizeof(w));
    if (le16toh(w.magic) != CFX_DPDK_MAGIC) {
        *why = "bad magic";
        return CFX_ERR_PROTO;
    }
    if (w.version != CFX_DPDK_VERSION) {
        *why = "unknown header version";
        return CFX_ERR_PROTO;
    }
    if ((w.flags & ~CFX_DPDK_F_ALL) || !w.flags) {
        *why = "unknown or no flags";
        return CFX_ERR_PROTO;
    }
    if (w.reserved) {
        *why = "reserved field not zero";
        return CFX_ERR_PROTO;
    }
    struct cfx__dpdk_hdr h = {
        .flags = w.flags,
        .session = le32toh(w.session),
        .seq = le32toh(w.seq),
        .ack = le32toh(w.ack),
        .sack = le64toh(w.sack),
        .window = le16toh(w.window),
        .len = le16toh(w.len),
        .msg_id = le32toh(w.msg_id),
        .frag_idx = le16toh(w.frag_idx),
        .frag_cnt = le16toh(w.frag_cnt),
        .msg_len = le32toh(w.msg_len),
        .ts = le64toh(w.ts),
        .ts_echo = le64toh(w.ts_echo),
        .echo_delay = le32toh(w.echo_delay),
    };
    if ((size_t)h.len != len - sizeof(w)) {
        *why = "payload length is not the rest of the packet";
        return CFX_ERR_PROTO;
    }
    if (h.len > CFX_DPDK_PAYLOAD_MAX) {
        *why = "payload over CFX_DPDK_PAYLOAD_MAX";
        return CFX_ERR_PROTO;
    }
    if (h.flags & CFX_DPDK_F_DATA) {
        if (h.frag_cnt == 0 || h.frag_idx >= h.frag_cnt) {
            *why = "fragment index out of its count";
            return CFX_ERR_PROTO;
        }
        if (h.msg_len > CFX_DPDK_MSG_MAX) {
            *why = "message over CFX_DPDK_MSG_MAX";
            return CFX_ERR_PROTO;
        }
        /* frag_cnt fragments of at most CFX_DPDK_PAYLOAD_MAX bytes each */
        if ((uint64_t)h.frag_cnt * CFX_DPDK_PAYLOAD_MAX < h.msg_len) {
            *why = "fragment count cannot carry the message";
            return CFX_ERR_PROTO;
        }
        if (h.len > h.msg_len) {
            *why = "fragment larger than its message";
            return CFX_ERR_PROTO;
        }
    } else if (h.len) {
        *why = "payload without the DATA flag";
        return CFX_ERR_PROTO;
    }
    if ((h.flags & CFX_DPDK_F_ACK) && h.window > CFX_DPDK_WIN_MAX) {
        *why = "window over CFX_DPDK_WIN_MAX";
        return CFX_ERR_PROTO;
    }
    *out = h;
    return CFX_OK;
}

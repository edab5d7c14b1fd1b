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

/*
 * The header as it lies on the wire, every field little endian: a common
 * part, then the DATA part when the DATA flag is set, then the ACK part
 * when the ACK flag is (offsets below are within each part):
 *
 *   common (16): magic u16 @0, version u8 @2, flags u8 @3, session u32 @4,
 *                ts u64 @8
 *   DATA   (20): seq u32 @0, msg_id u32 @4, msg_len u32 @8, len u16 @12,
 *                frag_idx u16 @14, frag_cnt u16 @16, reserved u16 @18 (zero)
 *   ACK    (28): ack u32 @0, window u16 @4, reserved u16 @6 (zero),
 *                sack u64 @8, ts_echo u64 @16, echo_delay u32 @24
 *   CTL    (20): type u32 @0 (seq), from u32 @4 (ack), to u32 @8 (msg_id),
 *                arg u64 @12 (sack); with neither DATA nor ACK, no payload
 */
#define PART_COMMON 16u
#define PART_DATA   20u
#define PART_ACK    28u
#define PART_CTL    20u
_Static_assert(PART_COMMON + PART_DATA == CFX_DPDK_HDR_DATA, "data header is 36 bytes");
_Static_assert(PART_COMMON + PART_DATA + PART_ACK == CFX_DPDK_HDR_MAX, "full header is 64 bytes");
_Static_assert(CFX_DPDK_PAYLOAD_MAX <= UINT16_MAX, "payload length fits its field");
_Static_assert(CFX_DPDK_WIN_MAX <= UINT16_MAX, "window fits its field");

static inline void put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}

static inline void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static inline uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}

static inline uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

size_t cfx__dpdk_hdr_len(uint8_t flags)
{
    if (flags & CFX_DPDK_F_CTL)
        return PART_COMMON + PART_CTL;
    return PART_COMMON + ((flags & CFX_DPDK_F_DATA) ? PART_DATA : 0) +
           ((flags & CFX_DPDK_F_ACK) ? PART_ACK : 0);
}

size_t cfx__dpdk_hdr_encode(const struct cfx__dpdk_hdr *h, void *out)
{
    uint8_t *p = out;

    put16(p, CFX_DPDK_MAGIC);
    p[2] = CFX_DPDK_VERSION;
    p[3] = h->flags;
    put32(p + 4, h->session);
    put64(p + 8, h->ts);
    p += PART_COMMON;
    if (h->flags & CFX_DPDK_F_CTL) {
        put32(p, h->seq);
        put32(p + 4, h->ack);
        put32(p + 8, h->msg_id);
        put64(p + 12, h->sack);
        return PART_COMMON + PART_CTL;
    }
    if (h->flags & CFX_DPDK_F_DATA) {
        put32(p, h->seq);
        put32(p + 4, h->msg_id);
        put32(p + 8, h->msg_len);
        put16(p + 12, h->len);
        put16(p + 14, h->frag_idx);
        put16(p + 16, h->frag_cnt);
        put16(p + 18, 0);
        p += PART_DATA;
    }
    if (h->flags & CFX_DPDK_F_ACK) {
        put32(p, h->ack);
        put16(p + 4, h->window);
        put16(p + 6, 0);
        put64(p + 8, h->sack);
        put64(p + 16, h->ts_echo);
        put32(p + 24, h->echo_delay);
        p += PART_ACK;
    }
    return (size_t)(p - (uint8_t *)out);
}

int cfx__dpdk_hdr_decode(const void *buf, size_t len, struct cfx__dpdk_hdr *out, const char **why)
{
    const uint8_t *p = buf;

    *why = NULL;
    if (len < PART_COMMON) {
        *why = "truncated header";
        return CFX_ERR_PROTO;
    }
    if (get16(p) != CFX_DPDK_MAGIC) {
        *why = "bad magic";
        return CFX_ERR_PROTO;
    }
    if (p[2] != CFX_DPDK_VERSION) {
        _Static_assert(CFX_DPDK_VERSION == 3, "the message below names the version");
        *why = "a header version other than this build's 3 (a peer of another release?)";
        return CFX_ERR_PROTO;
    }
    uint8_t flags = p[3];
    if ((flags & ~CFX_DPDK_F_ALL) || !flags) {
        *why = "unknown or no flags";
        return CFX_ERR_PROTO;
    }
    if ((flags & CFX_DPDK_F_CTL) && (flags & (CFX_DPDK_F_DATA | CFX_DPDK_F_ACK))) {
        *why = "control packet with data or ack fields";
        return CFX_ERR_PROTO;
    }
    size_t hlen = cfx__dpdk_hdr_len(flags);
    if (len < hlen) {
        *why = "truncated header";
        return CFX_ERR_PROTO;
    }
    struct cfx__dpdk_hdr h = {
        .flags = flags,
        .session = get32(p + 4),
        .ts = get64(p + 8),
    };
    p += PART_COMMON;
    if (flags & CFX_DPDK_F_CTL) {
        h.seq = get32(p);
        h.ack = get32(p + 4);
        h.msg_id = get32(p + 8);
        h.sack = get64(p + 12);
    }
    if (flags & CFX_DPDK_F_DATA) {
        h.seq = get32(p);
        h.msg_id = get32(p + 4);
        h.msg_len = get32(p + 8);
        h.len = get16(p + 12);
        h.frag_idx = get16(p + 14);
        h.frag_cnt = get16(p + 16);
        if (get16(p + 18)) {
            *why = "reserved field not zero";
            return CFX_ERR_PROTO;
        }
        p += PART_DATA;
    }
    if (flags & CFX_DPDK_F_ACK) {
        h.ack = get32(p);
        h.window = get16(p + 4);
        if (get16(p + 6)) {
            *why = "reserved field not zero";
            return CFX_ERR_PROTO;
        }
        h.sack = get64(p + 8);
        h.ts_echo = get64(p + 16);
        h.echo_delay = get32(p + 24);
    }
    if (!(flags & CFX_DPDK_F_DATA) && len > hlen) {
        *why = "payload without the DATA flag";
        return CFX_ERR_PROTO;
    }
    if ((size_t)h.len != len - hlen) {
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
    }
    if ((h.flags & CFX_DPDK_F_ACK) && h.window > CFX_DPDK_WIN_MAX) {
        *why = "window over CFX_DPDK_WIN_MAX";
        return CFX_ERR_PROTO;
    }
    *out = h;
    return CFX_OK;
}

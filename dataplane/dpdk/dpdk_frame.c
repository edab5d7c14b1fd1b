/*
 * dpdk transport: UDP/IPv4/Ethernet framing of the reliability header.
 *
 * Pure functions over bytes (no DPDK), so that they build and are tested
 * everywhere and can be fuzzed (test/fuzz/fuzz_dpdk_hdr.c).  Multi-byte
 * fields of these headers are big endian (network order); the reliability
 * header after them is little endian (dpdk_wire.c).
 */
#include <string.h>

#include <conflux/status.h>

#include "dpdk_io.h"

#define ETHERTYPE_IPV4 0x0800u
#define IPPROTO_UDP_   17u
#define IP_DF          0x4000u /* don't fragment */
#define IP_MF          0x2000u /* more fragments */
#define IP_OFFMASK     0x1FFFu

_Static_assert(CFX_DPDK_FRAME_OVERHEAD == 106, "frame overhead at most: 14 + 20 + 8 + 64");

static inline void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void put32(uint8_t *p, uint32_t v)
{
    put16(p, (uint16_t)(v >> 16));
    put16(p + 2, (uint16_t)v);
}

static inline uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t get32(const uint8_t *p)
{
    return (uint32_t)get16(p) << 16 | get16(p + 2);
}

/*
 * RFC 1071 one's-complement sum of len bytes (big-endian 16-bit words),
 * added to sum.  The sum does not depend on byte order (RFC 1071, 2.B):
 * 32-bit words are added in the host's order into 64 bits, which the
 * compiler vectorises, folded to 16 bits and swapped to network order at
 * the end.  An odd length pads its last byte with a zero after it.
 */
static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t len)
{
    uint64_t acc = 0;
    uint32_t w;
    uint16_t h;

    for (; len >= 4; p += 4, len -= 4) {
        memcpy(&w, p, 4);
        acc += w;
    }
    if (len >= 2) {
        memcpy(&h, p, 2);
        acc += h;
        p += 2;
        len -= 2;
    }
    if (len) {
        uint8_t last[2] = { p[0], 0 };
        memcpy(&h, last, 2);
        acc += h;
    }
    acc = (acc & 0xFFFFFFFFu) + (acc >> 32);
    acc = (acc & 0xFFFFFFFFu) + (acc >> 32);
    acc = (acc & 0xFFFFu) + (acc >> 16);
    acc = (acc & 0xFFFFu) + (acc >> 16);
    acc = (acc & 0xFFFFu) + (acc >> 16);
    uint16_t folded = (uint16_t)acc;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    folded = __builtin_bswap16(folded);
#endif
    return sum + folded;
}

static uint16_t csum_fold(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xFFFF) + (sum >> 16);
    return (uint16_t)~sum;
}

/* UDP checksum over the pseudo header, the UDP header and the first hlen
 * bytes of its data at udp, and the rest (udp_len - 8 - hlen) at rest. */
static uint16_t udp_csum(const uint8_t *ip, const uint8_t *udp, uint16_t udp_len, size_t hlen,
                         const uint8_t *rest)
{
    uint32_t sum = csum_add(0, ip + 12, 8); /* source and destination addresses */
    sum += IPPROTO_UDP_;
    sum += udp_len;
    sum = csum_add(sum, udp, CFX_DPDK_UDP_LEN + hlen);
    sum = csum_add(sum, rest, udp_len - CFX_DPDK_UDP_LEN - hlen);
    return csum_fold(sum);
}

int cfx__dpdk_frame_build(void *buf, size_t cap, const struct cfx__dpdk_addr *src,
                          const struct cfx__dpdk_addr *dst, const struct cfx__dpdk_hdr *h,
                          const void *payload)
{
    size_t hdrs = CFX_DPDK_FRAME_HDRS + cfx__dpdk_hdr_len(h->flags);
    size_t len = hdrs + h->len;
    if (len > cap)
        return CFX_ERR_TOO_BIG;
    int rc = cfx__dpdk_frame_build_hdr(buf, cap, src, dst, h, payload);
    if (rc >= 0 && h->len)
        memcpy((uint8_t *)buf + hdrs, payload, h->len);
    return rc < 0 ? rc : (int)len;
}

int cfx__dpdk_frame_build_hdr(void *buf, size_t cap, const struct cfx__dpdk_addr *src,
                              const struct cfx__dpdk_addr *dst, const struct cfx__dpdk_hdr *h,
                              const void *payload)
{
    size_t rel_len = cfx__dpdk_hdr_len(h->flags);
    size_t len = CFX_DPDK_FRAME_HDRS + rel_len + h->len;
    if (CFX_DPDK_FRAME_HDRS + rel_len > cap)
        return CFX_ERR_TOO_BIG;
    uint8_t *eth = buf, *ip = eth + CFX_DPDK_ETH_LEN, *udp = ip + CFX_DPDK_IP_LEN;
    uint8_t *rel = udp + CFX_DPDK_UDP_LEN;
    uint16_t ip_len = (uint16_t)(len - CFX_DPDK_ETH_LEN);
    uint16_t udp_len = (uint16_t)(ip_len - CFX_DPDK_IP_LEN);

    memcpy(eth, dst->mac, 6);
    memcpy(eth + 6, src->mac, 6);
    put16(eth + 12, ETHERTYPE_IPV4);

    ip[0] = 0x45; /* version 4, 5 words */
    ip[1] = 0;    /* DSCP/ECN */
    put16(ip + 2, ip_len);
    put16(ip + 4, 0); /* identification: never fragmented */
    put16(ip + 6, IP_DF);
    ip[8] = 64; /* TTL */
    ip[9] = IPPROTO_UDP_;
    put16(ip + 10, 0);
    put32(ip + 12, src->ip);
    put32(ip + 16, dst->ip);
    put16(ip + 10, csum_fold(csum_add(0, ip, CFX_DPDK_IP_LEN)));

    put16(udp, src->port);
    put16(udp + 2, dst->port);
    put16(udp + 4, udp_len);
    put16(udp + 6, 0);
    cfx__dpdk_hdr_encode(h, rel);
    /* the header part is even (8 + 16, 36, 44 or 64 bytes), so the
     * payload's words line up wherever it lies */
    uint16_t c = udp_csum(ip, udp, udp_len, rel_len, payload);
    put16(udp + 6, c ? c : 0xFFFF);
    return (int)(CFX_DPDK_FRAME_HDRS + rel_len);
}

#define REFUSE(text)          \
    do {                      \
        *why = (text);        \
        return CFX_ERR_PROTO; \
    } while (0)

int cfx__dpdk_frame_parse(const void *buf, size_t len, const struct cfx__dpdk_addr *local,
                          struct cfx__dpdk_addr *src, struct cfx__dpdk_hdr *h, const void **payload,
                          const char **why)
{
    const uint8_t *eth = buf, *ip = eth + CFX_DPDK_ETH_LEN, *udp = ip + CFX_DPDK_IP_LEN;

    *why = NULL;
    if (len < CFX_DPDK_ETH_LEN + CFX_DPDK_IP_LEN + CFX_DPDK_UDP_LEN)
        REFUSE("frame shorter than its headers");
    if (get16(eth + 12) != ETHERTYPE_IPV4)
        REFUSE("not IPv4 (or VLAN tagged)");
    if (memcmp(eth, local->mac, 6) != 0)
        REFUSE("another destination MAC");
    if (ip[0] != 0x45)
        REFUSE("not IPv4 without options");
    uint16_t ip_len = get16(ip + 2);
    /* Ethernet pads short frames: the IP length may be under the frame's */
    if (ip_len < CFX_DPDK_IP_LEN + CFX_DPDK_UDP_LEN || ip_len > len - CFX_DPDK_ETH_LEN)
        REFUSE("IP length disagrees with the frame");
    if (get16(ip + 6) & (IP_MF | IP_OFFMASK))
        REFUSE("IP fragment");
    if (ip[9] != IPPROTO_UDP_)
        REFUSE("not UDP");
    if (csum_fold(csum_add(0, ip, CFX_DPDK_IP_LEN)) != 0)
        REFUSE("bad IPv4 header checksum");
    if (get32(ip + 16) != local->ip)
        REFUSE("another destination IP");
    if (get16(udp + 2) != local->port)
        REFUSE("another destination UDP port");
    uint16_t udp_len = get16(udp + 4);
    if (udp_len != ip_len - CFX_DPDK_IP_LEN)
        REFUSE("UDP length disagrees with the IP length");
    if (get16(udp + 6) != 0 && udp_csum(ip, udp, udp_len, 0, udp + CFX_DPDK_UDP_LEN) != 0)
        REFUSE("bad UDP checksum");
    /* ours: the sender is known even if its header is refused */
    memcpy(src->mac, eth + 6, 6);
    src->ip = get32(ip + 12);
    src->port = get16(udp);
    int rc = cfx__dpdk_hdr_decode(udp + CFX_DPDK_UDP_LEN, udp_len - CFX_DPDK_UDP_LEN, h, why);
    if (rc)
        return rc;
    *payload = udp + CFX_DPDK_UDP_LEN + cfx__dpdk_hdr_len(h->flags);
    return CFX_OK;
}

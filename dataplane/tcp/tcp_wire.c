/*
 * tcp transport: validation of the frame header and the HELLO payload.
 *
 * Pure functions over received bytes (no endpoint, no registration table),
 * so that they can be fuzzed on their own; tcp_ep.c applies what needs state
 * (the registration key and bounds of a WRITE) after them.
 */
#include <endian.h>
#include <string.h>

#include <conflux/status.h>

#include "tcp.h"

int cfx__tcp_hdr_check(const void *buf, size_t len, bool hello_wait, struct cfx__tcp_hdr *out,
                       const char **why)
{
    struct cfx__tcp_hdr h;

    *why = NULL;
    if (len < sizeof(h)) {
        *why = "truncated frame header";
        return CFX_ERR_PROTO;
    }
    memcpy(&h, buf, sizeof(h));
    h.len = le32toh(h.len);
    h.imm = le32toh(h.imm);
    h.key_lo = le32toh(h.key_lo);
    h.key_idx = le32toh(h.key_idx);
    h.key_hi = le32toh(h.key_hi);
    h.off = le64toh(h.off);
    *out = h;

    if (h.flags & ~CFX_TCP_F_LAST_CLEAR || (h.flags && h.type != CFX_TCP_FRAME_SEND)) {
        *why = "unknown frame flags";
        return CFX_ERR_PROTO;
    }
    if (hello_wait) {
        if (h.type != CFX_TCP_FRAME_HELLO || h.len != sizeof(struct cfx__tcp_hello)) {
            *why = "connection did not start with HELLO";
            return CFX_ERR_PROTO;
        }
        return h.type;
    }
    switch (h.type) {
    case CFX_TCP_FRAME_WRITE:
        /* The key and the region bounds are checked against the table. */
        if (h.len > CFX_TP_WRITE_MAX) {
            *why = "write larger than CFX_TP_WRITE_MAX";
            return CFX_ERR_PROTO;
        }
        return h.type;
    case CFX_TCP_FRAME_SEND:
        if (h.len > CFX_TP_SEND_MAX) {
            *why = "control message over CFX_TP_SEND_MAX";
            return CFX_ERR_PROTO;
        }
        return h.type;
    case CFX_TCP_FRAME_ERROR:
    case CFX_TCP_FRAME_BYE:
        return h.type;
    default:
        *why = "unexpected frame type";
        return CFX_ERR_PROTO;
    }
}

int cfx__tcp_hello_check(const void *buf, size_t len, struct cfx__tcp_hello *out)
{
    if (len != sizeof(*out))
        return CFX_ERR_PROTO;
    memcpy(out, buf, sizeof(*out));
    out->addr[sizeof(out->addr) - 1] = '\0';
    if (le32toh(out->magic) != CFX_TCP_MAGIC)
        return CFX_ERR_PROTO;
    if (le32toh(out->version) != CFX_TCP_VERSION)
        return CFX_ERR_VERSION;
    return CFX_OK;
}

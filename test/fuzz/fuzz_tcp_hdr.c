/*
 * libFuzzer target: the tcp transport's frame header and HELLO payload
 * checks (cfx__tcp_hdr_check, cfx__tcp_hello_check).
 *
 * Input: one byte of mode (bit 0: the endpoint waits for HELLO), then the
 * 32-byte header, then the payload.  What the checks accept must bound what
 * tcp_ep.c then receives: a SEND payload that fits a receive slot, a HELLO
 * payload of exactly its struct, an address string that is terminated.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/tcp/tcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx__tcp_hdr h;
    const char *why;

    if (size < 1)
        return 0;
    bool hello_wait = data[0] & 1;
    data++;
    size--;
    uint8_t *hdr = malloc(size < sizeof(h) ? (size ? size : 1) : sizeof(h));
    if (!hdr)
        return 0;
    size_t hlen = size < sizeof(h) ? size : sizeof(h);
    memcpy(hdr, data, hlen);
    int type = cfx__tcp_hdr_check(hdr, hlen, hello_wait, &h, &why);
    free(hdr);
    if (type < 0) {
        if (type != CFX_ERR_PROTO || !why)
            abort();
        return 0;
    }
    if (hello_wait && (type != CFX_TCP_FRAME_HELLO || h.len != sizeof(struct cfx__tcp_hello)))
        abort();
    if (type == CFX_TCP_FRAME_SEND && h.len > CFX_TP_SEND_MAX)
        abort();
    if (type == CFX_TCP_FRAME_WRITE && h.len > CFX_TP_WRITE_MAX)
        abort();

    if (type == CFX_TCP_FRAME_HELLO) {
        size_t plen = size - hlen;
        uint8_t *p = malloc(plen ? plen : 1);
        struct cfx__tcp_hello hl;
        if (!p)
            return 0;
        memcpy(p, data + hlen, plen);
        int rc = cfx__tcp_hello_check(p, plen, &hl);
        if (rc == CFX_OK && strnlen(hl.addr, sizeof(hl.addr)) >= sizeof(hl.addr))
            abort();
        if (rc != CFX_OK && rc != CFX_ERR_PROTO && rc != CFX_ERR_VERSION)
            abort();
        free(p);
    }
    return 0;
}

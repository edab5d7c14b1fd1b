/*
 * libFuzzer target: sealed control frames (CFX_SECURE=integrity or encrypt),
 * the framing loop of coord.c conn_parse / client.c rbuf_frame over
 * cfx__ctl_hdr_decode, cfx__ctl_open_frame and then cfx__msg_decode.
 *
 * Input: one byte of mode (bit 0: encrypt, else integrity; bit 1: the
 * coordinator sends, else the client; bit 2: the bytes are the wire as the
 * receiver reads it, else plain frames an honest sender seals first), a
 * little-endian u16 tamper (honest sender: 0 none, else flip bit (t-1)&7 of
 * byte (t-1)>>3 of the first sealed frame), then the bytes.  Both ends share
 * fixed keys, so the seed corpus can hold sealed frames that open.
 *
 * A frame opens only as the sender sealed it: an honest stream opens frame
 * by frame to its plain bytes; a tampered frame, or the wire bytes from
 * anyone without the keys, fails with CFX_ERR_AUTH (or its header does not
 * decode) and nothing of it is read.  Every frame is copied into a buffer of
 * exactly its size so that AddressSanitizer sees any read past it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "control/ctl_seal.h"
#include "control/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_TOKEN "fuzz-token"
#define FUZZ_ROLE  1

static const uint8_t ns[CFX_AUTH_NONCE_LEN] = { 1, 2, 3, 4 }, nc[CFX_AUTH_NONCE_LEN] = { 5, 6 };

/* The receiver's loop over @p wire; returns the frames that opened.  @p plain
 * (honest, untampered) holds the frames the sender sealed, in order. */
static size_t receive(struct cfx_ctl_seal *rx, const uint8_t *wire, size_t wlen,
                      const uint8_t *plain)
{
    size_t off = 0, poff = 0, opened = 0;

    while (wlen - off >= CFX_PROTO_HDR_LEN) {
        struct cfx_msg_hdr h;
        int rc = cfx__ctl_hdr_decode(rx, wire + off, wlen - off, &h);
        if (rc != CFX_OK) {
            if (rc != CFX_ERR_PROTO && rc != CFX_ERR_TOO_BIG && rc != CFX_ERR_VERSION)
                abort();
            if (plain)
                abort(); /* a sealed frame's header is the plain one's */
            break;
        }
        if (h.payload_len < CFX_SEAL_TAG_LEN ||
            h.payload_len > CFX_PROTO_MAX_PAYLOAD + CFX_SEAL_TAG_LEN)
            abort(); /* what a reader allocates must stay bounded */
        size_t need = CFX_PROTO_HDR_LEN + (size_t)h.payload_len, len = 0;
        if (need > wlen - off)
            break; /* a reader would wait for more */
        uint8_t *f = malloc(need);
        if (!f)
            break;
        memcpy(f, wire + off, need);
        rc = cfx__ctl_open_frame(rx, f, need, &len);
        if (rc != CFX_OK) {
            if (rc != CFX_ERR_AUTH || plain)
                abort(); /* only tampering fails, and only as CFX_ERR_AUTH */
            free(f);
            break; /* the connection ends */
        }
        if (len != need - CFX_SEAL_TAG_LEN)
            abort();
        if (plain && memcmp(f, plain + poff, len) != 0)
            abort(); /* it opens to what was sealed */
        struct cfx_msg m;
        rc = cfx__msg_decode(f, len, &m);
        if (rc != CFX_OK && rc != CFX_ERR_PROTO && rc != CFX_ERR_TOO_BIG && rc != CFX_ERR_VERSION)
            abort();
        free(f);
        off += need;
        poff += len;
        opened++;
    }
    return opened;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx_ctl_seal tx = { 0 }, rx = { 0 };

    if (size < 3)
        return 0;
    int mode = (data[0] & 1) ? CFX_SEAL_ENCRYPT : CFX_SEAL_INTEGRITY;
    bool coord_sends = data[0] & 2, raw = data[0] & 4;
    unsigned tamper = (unsigned)data[1] | (unsigned)data[2] << 8;
    data += 3;
    size -= 3;
    if (cfx__ctl_seal_start(&tx, mode, FUZZ_TOKEN, ns, nc, FUZZ_ROLE, !coord_sends) != CFX_OK ||
        cfx__ctl_seal_start(&rx, mode, FUZZ_TOKEN, ns, nc, FUZZ_ROLE, coord_sends) != CFX_OK)
        abort();

    if (raw) {
        uint8_t *wire = malloc(size ? size : 1);
        if (wire) {
            memcpy(wire, data, size);
            receive(&rx, wire, size, NULL);
            free(wire);
        }
        goto out;
    }

    /* An honest sender: the plain frames cut by their headers, each sealed. */
    size_t cap = size + CFX_SEAL_TAG_LEN * (size / CFX_PROTO_HDR_LEN + 1);
    uint8_t *wire = malloc(cap), *plain = malloc(size ? size : 1);
    size_t off = 0, woff = 0, nframes = 0, first_len = 0;
    if (!wire || !plain)
        goto out_free;
    while (size - off >= CFX_PROTO_HDR_LEN) {
        struct cfx_msg_hdr h;
        if (cfx__msg_hdr_decode(data + off, size - off, &h) != CFX_OK)
            break;
        size_t len = CFX_PROTO_HDR_LEN + (size_t)h.payload_len, wl = 0;
        if (len > size - off)
            break;
        memcpy(plain + off, data + off, len);
        memcpy(wire + woff, data + off, len);
        if (cfx__ctl_seal_frame(&tx, wire + woff, len, len + CFX_SEAL_TAG_LEN, &wl) != CFX_OK ||
            wl != len + CFX_SEAL_TAG_LEN)
            abort();
        if (!nframes)
            first_len = wl;
        off += len;
        woff += wl;
        nframes++;
    }
    if (tamper && nframes) {
        wire[((tamper - 1) >> 3) % first_len] ^= (uint8_t)(1u << ((tamper - 1) & 7));
        if (receive(&rx, wire, woff, NULL) != 0)
            abort(); /* a flipped bit never opens */
    } else if (receive(&rx, wire, woff, plain) != nframes) {
        abort();
    }
out_free:
    free(wire);
    free(plain);
out:
    cfx__ctl_seal_stop(&tx);
    cfx__ctl_seal_stop(&rx);
    return 0;
}

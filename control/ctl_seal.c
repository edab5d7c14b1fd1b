/* Sealed control frames: the framing around control/seal.c (ctl_seal.h). */
#include "control/ctl_seal.h"

#include <string.h>

#include <conflux/status.h>

#include "control/proto.h"
#include "dataplane/common/util.h"

void cfx__ctl_auth_bind(uint8_t role, uint8_t mode, uint8_t out[CFX_CTL_BIND_LEN])
{
    out[0] = role;
    out[1] = mode;
}

int cfx__ctl_seal_start(struct cfx_ctl_seal *s, int mode, const char *token,
                        const uint8_t ns[CFX_AUTH_NONCE_LEN],
                        const uint8_t nc[CFX_AUTH_NONCE_LEN], uint8_t role, bool connector)
{
    struct cfx_seal_keys keys;
    uint8_t salt[2 * CFX_AUTH_NONCE_LEN], bind[CFX_CTL_BIND_LEN];
    int rc;

    cfx__ctl_seal_stop(s);
    if (mode == CFX_SEAL_OFF)
        return CFX_OK;
    memcpy(salt, ns, CFX_AUTH_NONCE_LEN);
    memcpy(salt + CFX_AUTH_NONCE_LEN, nc, CFX_AUTH_NONCE_LEN);
    cfx__ctl_auth_bind(role, (uint8_t)mode, bind);
    rc = cfx__seal_derive(token, CFX_CTL_SEAL_LABEL, salt, sizeof(salt), bind, sizeof(bind),
                          &keys);
    if (rc != CFX_OK)
        return rc;
    /* the client seals the connector's direction and opens the acceptor's */
    int mine = connector ? CFX_SEAL_DIR_CONNECTOR : CFX_SEAL_DIR_ACCEPTOR;
    int theirs = connector ? CFX_SEAL_DIR_ACCEPTOR : CFX_SEAL_DIR_CONNECTOR;
    rc = cfx__seal_dir_init(&s->tx, mode, &keys, mine, true);
    if (rc == CFX_OK) {
        rc = cfx__seal_dir_init(&s->rx, mode, &keys, theirs, false);
        if (rc != CFX_OK)
            cfx__seal_dir_fini(&s->tx);
    }
    cfx__seal_keys_cleanse(&keys);
    if (rc == CFX_OK)
        s->mode = mode;
    return rc;
}

void cfx__ctl_seal_stop(struct cfx_ctl_seal *s)
{
    if (s->mode != CFX_SEAL_OFF) {
        cfx__seal_dir_fini(&s->tx);
        cfx__seal_dir_fini(&s->rx);
    }
    memset(s, 0, sizeof(*s));
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#define HDR_PLEN_OFF 4 /* u16 magic, u8 version, u8 type, then u32 payload_len */

int cfx__ctl_hdr_decode(const struct cfx_ctl_seal *s, const void *buf, size_t len,
                        struct cfx_msg_hdr *out)
{
    uint8_t h[CFX_PROTO_HDR_LEN];

    if (s->mode == CFX_SEAL_OFF || len < CFX_PROTO_HDR_LEN)
        return cfx__msg_hdr_decode(buf, len, out);
    /* the plain frame's header, for the checks every frame gets */
    memcpy(h, buf, sizeof(h));
    uint32_t wire = le32(h + HDR_PLEN_OFF);
    if (wire < CFX_SEAL_TAG_LEN)
        return cfx__err(CFX_ERR_PROTO, "sealed frame of %u bytes, shorter than its %d byte tag",
                        wire, CFX_SEAL_TAG_LEN);
    put_le32(h + HDR_PLEN_OFF, wire - CFX_SEAL_TAG_LEN);
    int rc = cfx__msg_hdr_decode(h, sizeof(h), out);
    out->payload_len = wire;
    return rc;
}

int cfx__ctl_seal_frame(struct cfx_ctl_seal *s, uint8_t *frame, size_t len, size_t cap,
                        size_t *wire_len)
{
    if (s->mode == CFX_SEAL_OFF) {
        *wire_len = len;
        return CFX_OK;
    }
    if (len < CFX_PROTO_HDR_LEN || cap - len < CFX_SEAL_TAG_LEN || cap < len)
        return cfx__err(CFX_ERR_INTERNAL, "no room to seal a %zu byte frame", len);
    size_t plen = len - CFX_PROTO_HDR_LEN;
    put_le32(frame + HDR_PLEN_OFF, (uint32_t)(plen + CFX_SEAL_TAG_LEN));
    struct iovec iov = { .iov_base = frame + CFX_PROTO_HDR_LEN, .iov_len = plen };
    int rc = cfx__seal(&s->tx, frame, CFX_PROTO_HDR_LEN, &iov, 1, frame + CFX_PROTO_HDR_LEN,
                       frame + len);
    if (rc != CFX_OK)
        return rc;
    *wire_len = len + CFX_SEAL_TAG_LEN;
    return CFX_OK;
}

int cfx__ctl_open_frame(struct cfx_ctl_seal *s, uint8_t *frame, size_t wire_len, size_t *len)
{
    if (s->mode == CFX_SEAL_OFF) {
        *len = wire_len;
        return CFX_OK;
    }
    if (wire_len < CFX_PROTO_HDR_LEN + CFX_SEAL_TAG_LEN)
        return cfx__err(CFX_ERR_AUTH, "a %zu byte frame where a sealed one was due", wire_len);
    size_t plen = wire_len - CFX_PROTO_HDR_LEN - CFX_SEAL_TAG_LEN;
    int rc = cfx__seal_open(&s->rx, frame, CFX_PROTO_HDR_LEN, frame + CFX_PROTO_HDR_LEN, plen,
                            frame + CFX_PROTO_HDR_LEN, frame + CFX_PROTO_HDR_LEN + plen);
    if (rc != CFX_OK)
        return rc;
    put_le32(frame + HDR_PLEN_OFF, (uint32_t)plen);
    *len = CFX_PROTO_HDR_LEN + plen;
    return CFX_OK;
}

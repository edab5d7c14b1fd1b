/*
 * Sealed control frames (CFX_SECURE on the control plane; docs/SECURITY.md).
 *
 * The mode is agreed under the handshake's MACs (control/auth.h): the
 * coordinator names its mode in CHALLENGE, the client its own in AUTH, and
 * both MACs cover role | mode, so neither side can be talked into another
 * mode than its own.  A mismatch is refused with CFX_ERR_AUTH.
 *
 * From the first frame after AUTH_OK on (each way), when the mode is not
 * off, every frame is one AES-256-GCM record (control/seal.h): the 16-byte
 * header travels in clear as associated data, its payload_len counting the
 * payload and the 16-byte tag that follows it; the payload is encrypted
 * (encrypt) or left in clear (integrity).  Keys: HKDF from the token, the
 * two nonces and role | mode (cfx__ctl_seal_start); a fresh handshake (a
 * reconnect) gives fresh keys.  A frame that does not open ends the
 * connection: nothing of it is decoded.
 *
 * A struct cfx_ctl_seal is used by one thread at a time per direction (the
 * coordinator's loop; the client's sender under its send lock, its reader).
 */
#ifndef CFX_CONTROL_CTL_SEAL_H
#define CFX_CONTROL_CTL_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/auth.h"
#include "control/seal.h"

#define CFX_CTL_SEAL_LABEL "conflux-v1 ctl seal"
#define CFX_CTL_BIND_LEN   2 /* role, mode: under both AUTH MACs and in the key info */

struct cfx_msg_hdr;

struct cfx_ctl_seal {
    int mode;                /* enum cfx_seal_mode; OFF: frames travel plain */
    struct cfx_seal_dir tx;  /* frames this side sends */
    struct cfx_seal_dir rx;  /* frames it receives */
};

/* The binding bytes of a control handshake: role, mode. */
void cfx__ctl_auth_bind(uint8_t role, uint8_t mode, uint8_t out[CFX_CTL_BIND_LEN]);

/* Switch @p s on for @p mode (OFF: leaves it off) after a handshake with
 * nonces @p ns (coordinator's) and @p nc (client's) in @p role; @p connector:
 * this side is the client.  CFX_OK, or the status of the key setup. */
int cfx__ctl_seal_start(struct cfx_ctl_seal *s, int mode, const char *token,
                        const uint8_t ns[CFX_AUTH_NONCE_LEN],
                        const uint8_t nc[CFX_AUTH_NONCE_LEN], uint8_t role, bool connector);
/* Back to plain (a new connection), keys wiped. */
void cfx__ctl_seal_stop(struct cfx_ctl_seal *s);

/* Bytes sealing adds to a frame (0 while off). */
static inline size_t cfx__ctl_seal_overhead(const struct cfx_ctl_seal *s)
{
    return s->mode != CFX_SEAL_OFF ? CFX_SEAL_TAG_LEN : 0;
}

/* Header of a frame as it travels: as cfx__msg_hdr_decode(), payload_len
 * being the bytes after the header on the wire (tag included when sealed).
 * CFX_ERR_PROTO also for a sealed frame shorter than its tag. */
int cfx__ctl_hdr_decode(const struct cfx_ctl_seal *s, const void *buf, size_t len,
                        struct cfx_msg_hdr *out);

/* Seal the plain frame of @p len bytes at @p frame in place; @p cap must
 * leave room for the tag.  *wire_len: the bytes to send.  No-op when off. */
int cfx__ctl_seal_frame(struct cfx_ctl_seal *s, uint8_t *frame, size_t len, size_t cap,
                        size_t *wire_len);
/* Open the sealed frame of @p wire_len bytes at @p frame in place; *len:
 * the plain frame's length (header corrected) for cfx__msg_decode().
 * CFX_ERR_AUTH when it was tampered with, replayed, reordered or sent
 * plain.  No-op when off. */
int cfx__ctl_open_frame(struct cfx_ctl_seal *s, uint8_t *frame, size_t wire_len, size_t *len);

#endif

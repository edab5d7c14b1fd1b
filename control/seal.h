/*
 * Sealed records: integrity (and, when asked, confidentiality) of a byte
 * stream after its token handshake (CFX_SECURE, docs/SECURITY.md).
 *
 * Keys.  Each connection derives its own keys from the cluster token and
 * the handshake it just ran: HKDF-SHA256 with the token as input key
 * material, both handshake nonces as salt, and a label plus the binding of
 * that handshake (node ids or role, and the mode) as info.  Out come one
 * AES-256 key and one 96-bit IV base per direction; nothing of them travels.
 *
 * Records.  Every record is sealed with AES-256-GCM under its direction's
 * key, its nonce the IV base XOR a 64-bit record counter (big endian in the
 * last 8 bytes), so a record replayed, dropped, reordered or moved to the
 * other direction fails to open.  The caller's associated data (a length, a
 * frame header) is under the tag.  CFX_SEAL_ENCRYPT encrypts the payload;
 * CFX_SEAL_INTEGRITY leaves it in clear and puts it under the tag as
 * associated data (the same key schedule and counter).  A direction that
 * reached 2^64 - 1 records refuses to seal (the connection must end first).
 *
 * A direction is used by one thread at a time (the connection's owner).
 */
#ifndef CFX_CONTROL_SEAL_H
#define CFX_CONTROL_SEAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define CFX_SEAL_KEY_LEN 32
#define CFX_SEAL_IV_LEN  12
#define CFX_SEAL_TAG_LEN 16
#define CFX_SEAL_INFO_MAX 64 /* binding bytes one derivation may cover */

/* What CFX_SECURE asks for.  The value travels in handshakes (under their
 * MACs): keep the numbers. */
enum cfx_seal_mode {
    CFX_SEAL_OFF = 0,       /* plain: trusted fabric (the default) */
    CFX_SEAL_INTEGRITY = 1, /* every record authenticated, payload in clear */
    CFX_SEAL_ENCRYPT = 2,   /* every record authenticated and encrypted */
};

/* Keys of one connection: the connector's (client's) direction and the
 * acceptor's (server's). */
struct cfx_seal_keys {
    uint8_t key[2][CFX_SEAL_KEY_LEN];
    uint8_t iv[2][CFX_SEAL_IV_LEN];
};
#define CFX_SEAL_DIR_CONNECTOR 0 /* bytes the connector (client) sends */
#define CFX_SEAL_DIR_ACCEPTOR  1 /* bytes the acceptor (server) sends */

/* One direction of a connection (sealing or opening). */
struct cfx_seal_dir {
    void *cipher;   /* EVP_CIPHER_CTX, key set */
    uint8_t iv[CFX_SEAL_IV_LEN];
    uint64_t seq;   /* records sealed / opened so far */
    int mode;       /* enum cfx_seal_mode */
    bool encrypt;   /* sealing (true) or opening */
};

/* Parse a CFX_SECURE value: unset or "", "0", "off", "no" -> OFF; "1",
 * "on", "yes", "encrypt" -> ENCRYPT; "integrity" -> INTEGRITY.  CFX_OK, or
 * CFX_ERR_INVALID naming the value. */
int cfx__seal_mode_parse(const char *s, int *mode);
/* The words cfx__seal_mode_parse takes, for errors that name them. */
#define CFX_SEAL_MODE_WORDS "0/off/no, 1/on/yes/encrypt or integrity"
/* "off", "integrity" or "encrypt". */
const char *cfx__seal_mode_name(int mode);

/* Derive a connection's keys.  @p label names the plane ("conflux-v1 dp
 * seal"); @p salt is both handshake nonces; @p info the binding (at most
 * CFX_SEAL_INFO_MAX bytes).  CFX_OK, CFX_ERR_INVALID (empty token, bad
 * sizes) or CFX_ERR_INTERNAL (libcrypto).  Cleanse the keys once the
 * directions are set up. */
int cfx__seal_derive(const char *token, const char *label, const uint8_t *salt, size_t salt_len,
                     const void *info, size_t info_len, struct cfx_seal_keys *out);
/* Wipe @p k. */
void cfx__seal_keys_cleanse(struct cfx_seal_keys *k);

/* Set up @p d for direction @p dir of @p keys, to seal (@p encrypt) or to
 * open, in @p mode (not OFF).  CFX_OK, CFX_ERR_NOMEM or CFX_ERR_INTERNAL. */
int cfx__seal_dir_init(struct cfx_seal_dir *d, int mode, const struct cfx_seal_keys *keys,
                       int dir, bool encrypt);
void cfx__seal_dir_fini(struct cfx_seal_dir *d);

/* Seal the next record: @p aad, then the @p niov buffers of @p iov, written
 * to @p out (the same number of bytes: ciphertext, or the clear bytes in
 * INTEGRITY mode) and the tag to @p tag.  CFX_OK, CFX_ERR_INTERNAL or
 * CFX_ERR_TOO_BIG (the counter is spent). */
int cfx__seal(struct cfx_seal_dir *d, const void *aad, size_t aad_len, const struct iovec *iov,
              int niov, uint8_t *out, uint8_t tag[CFX_SEAL_TAG_LEN]);
/* Open the next record: @p len bytes of @p in to @p out (may equal @p in).
 * Nothing in @p out may be used unless this returns CFX_OK; CFX_ERR_AUTH
 * when the tag does not verify (tampered, replayed, reordered or another
 * key), CFX_ERR_INTERNAL, CFX_ERR_TOO_BIG. */
int cfx__seal_open(struct cfx_seal_dir *d, const void *aad, size_t aad_len, const uint8_t *in,
                   size_t len, uint8_t *out, const uint8_t tag[CFX_SEAL_TAG_LEN]);

#endif

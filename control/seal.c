/* Sealed records: HKDF-SHA256 keys and AES-256-GCM records (seal.h), OpenSSL libcrypto. */
#include "control/seal.h"

#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

#define SEAL_CHUNK_MAX (1u << 30) /* bytes per EVP call (its lengths are int) */

int cfx__seal_mode_parse(const char *s, int *mode)
{
    if (!s || !*s || !strcmp(s, "0") || !strcasecmp(s, "off") || !strcasecmp(s, "no")) {
        *mode = CFX_SEAL_OFF;
    } else if (!strcmp(s, "1") || !strcasecmp(s, "on") || !strcasecmp(s, "yes") ||
               !strcasecmp(s, "encrypt")) {
        *mode = CFX_SEAL_ENCRYPT;
    } else if (!strcasecmp(s, "integrity")) {
        *mode = CFX_SEAL_INTEGRITY;
    } else {
        return cfx__err(CFX_ERR_INVALID, "CFX_SECURE=%.32s: expected " CFX_SEAL_MODE_WORDS, s);
    }
    return CFX_OK;
}

const char *cfx__seal_mode_name(int mode)
{
    switch (mode) {
    case CFX_SEAL_OFF: return "off";
    case CFX_SEAL_INTEGRITY: return "integrity";
    case CFX_SEAL_ENCRYPT: return "encrypt";
    default: return "unknown";
    }
}

int cfx__seal_derive(const char *token, const char *label, const uint8_t *salt, size_t salt_len,
                     const void *info, size_t info_len, struct cfx_seal_keys *out)
{
    uint8_t inf[32 + CFX_SEAL_INFO_MAX];
    uint8_t okm[sizeof(out->key) + sizeof(out->iv)];
    size_t okm_len = sizeof(okm);
    EVP_PKEY_CTX *pc;
    int ok;

    if (!token || !*token)
        return cfx__err(CFX_ERR_INVALID, "empty cluster token");
    if (!label || strlen(label) > 32 || info_len > CFX_SEAL_INFO_MAX || (info_len && !info) ||
        !salt || !salt_len)
        return cfx__err(CFX_ERR_INVALID, "seal key derivation: bad label, salt or info");
    /* info: the label NUL-padded to 32 bytes, then the binding (fixed per plane) */
    memset(inf, 0, 32);
    memcpy(inf, label, strlen(label));
    if (info_len)
        memcpy(inf + 32, info, info_len);

    pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    ok = pc && EVP_PKEY_derive_init(pc) > 0 && EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
         EVP_PKEY_CTX_set1_hkdf_salt(pc, salt, (int)salt_len) > 0 &&
         EVP_PKEY_CTX_set1_hkdf_key(pc, (const unsigned char *)token, (int)strlen(token)) > 0 &&
         EVP_PKEY_CTX_add1_hkdf_info(pc, inf, (int)(32 + info_len)) > 0 &&
         EVP_PKEY_derive(pc, okm, &okm_len) > 0 && okm_len == sizeof(okm);
    EVP_PKEY_CTX_free(pc);
    if (!ok) {
        OPENSSL_cleanse(okm, sizeof(okm));
        return cfx__err(CFX_ERR_INTERNAL, "HKDF-SHA256 failed in libcrypto");
    }
    memcpy(out->key, okm, sizeof(out->key));
    memcpy(out->iv, okm + sizeof(out->key), sizeof(out->iv));
    OPENSSL_cleanse(okm, sizeof(okm));
    return CFX_OK;
}

void cfx__seal_keys_cleanse(struct cfx_seal_keys *k) { OPENSSL_cleanse(k, sizeof(*k)); }

int cfx__seal_dir_init(struct cfx_seal_dir *d, int mode, const struct cfx_seal_keys *keys,
                       int dir, bool encrypt)
{
    EVP_CIPHER_CTX *c;
    int ok;

    memset(d, 0, sizeof(*d));
    if ((mode != CFX_SEAL_INTEGRITY && mode != CFX_SEAL_ENCRYPT) || (dir != 0 && dir != 1))
        return cfx__err(CFX_ERR_INVALID, "seal: mode %d, direction %d", mode, dir);
    if (!(c = EVP_CIPHER_CTX_new()))
        return cfx__err(CFX_ERR_NOMEM, "seal: out of memory for a cipher context");
    ok = encrypt ? EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, keys->key[dir], NULL)
                 : EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, keys->key[dir], NULL);
    if (ok != 1) {
        EVP_CIPHER_CTX_free(c);
        return cfx__err(CFX_ERR_INTERNAL, "AES-256-GCM key setup failed in libcrypto");
    }
    d->cipher = c;
    memcpy(d->iv, keys->iv[dir], sizeof(d->iv));
    d->mode = mode;
    d->encrypt = encrypt;
    return CFX_OK;
}

void cfx__seal_dir_fini(struct cfx_seal_dir *d)
{
    if (d->cipher)
        EVP_CIPHER_CTX_free(d->cipher); /* cleanses the key schedule */
    OPENSSL_cleanse(d, sizeof(*d));
}

/* The next record's nonce; false when the counter is spent. */
static bool next_nonce(struct cfx_seal_dir *d, uint8_t nonce[CFX_SEAL_IV_LEN])
{
    if (d->seq == UINT64_MAX)
        return false;
    memcpy(nonce, d->iv, CFX_SEAL_IV_LEN);
    for (int i = 0; i < 8; i++)
        nonce[CFX_SEAL_IV_LEN - 1 - i] ^= (uint8_t)(d->seq >> (8 * i));
    d->seq++;
    return true;
}

/* Feed @p len bytes: associated data (@p out NULL) or cipher input. */
static bool feed(EVP_CIPHER_CTX *c, bool encrypt, uint8_t *out, const uint8_t *in, size_t len)
{
    while (len) {
        int n = (int)CFX_MIN(len, (size_t)SEAL_CHUNK_MAX), outl = 0;
        int ok = encrypt ? EVP_EncryptUpdate(c, out, &outl, in, n)
                         : EVP_DecryptUpdate(c, out, &outl, in, n);
        if (ok != 1 || (out && outl != n))
            return false;
        in += n;
        if (out)
            out += n;
        len -= (size_t)n;
    }
    return true;
}

int cfx__seal(struct cfx_seal_dir *d, const void *aad, size_t aad_len, const struct iovec *iov,
              int niov, uint8_t *out, uint8_t tag[CFX_SEAL_TAG_LEN])
{
    EVP_CIPHER_CTX *c = d->cipher;
    uint8_t nonce[CFX_SEAL_IV_LEN];
    int outl = 0;
    bool clear = d->mode == CFX_SEAL_INTEGRITY;

    if (!d->encrypt || !next_nonce(d, nonce))
        return cfx__err(CFX_ERR_TOO_BIG, "seal: this direction's record counter is spent");
    if (EVP_EncryptInit_ex(c, NULL, NULL, NULL, nonce) != 1 ||
        (aad_len && !feed(c, true, NULL, aad, aad_len)))
        goto fail;
    for (int i = 0; i < niov; i++) {
        const uint8_t *p = iov[i].iov_base;
        if (!feed(c, true, clear ? NULL : out, p, iov[i].iov_len))
            goto fail;
        if (clear && out != p)
            memmove(out, p, iov[i].iov_len);
        out += iov[i].iov_len;
    }
    if (EVP_EncryptFinal_ex(c, NULL, &outl) != 1 ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, CFX_SEAL_TAG_LEN, tag) != 1)
        goto fail;
    return CFX_OK;
fail:
    return cfx__err(CFX_ERR_INTERNAL, "AES-256-GCM seal failed in libcrypto");
}

int cfx__seal_open(struct cfx_seal_dir *d, const void *aad, size_t aad_len, const uint8_t *in,
                   size_t len, uint8_t *out, const uint8_t tag[CFX_SEAL_TAG_LEN])
{
    EVP_CIPHER_CTX *c = d->cipher;
    uint8_t nonce[CFX_SEAL_IV_LEN], t[CFX_SEAL_TAG_LEN];
    int outl = 0;
    bool clear = d->mode == CFX_SEAL_INTEGRITY;

    if (d->encrypt || !next_nonce(d, nonce))
        return cfx__err(CFX_ERR_TOO_BIG, "seal: this direction's record counter is spent");
    memcpy(t, tag, sizeof(t));
    if (EVP_DecryptInit_ex(c, NULL, NULL, NULL, nonce) != 1 ||
        (aad_len && !feed(c, false, NULL, aad, aad_len)) ||
        !feed(c, false, clear ? NULL : out, in, len) ||
        EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, CFX_SEAL_TAG_LEN, t) != 1)
        return cfx__err(CFX_ERR_INTERNAL, "AES-256-GCM open failed in libcrypto");
    if (EVP_DecryptFinal_ex(c, NULL, &outl) != 1)
        return cfx__err(CFX_ERR_AUTH, "a sealed record failed its integrity check");
    if (clear && out != in)
        memmove(out, in, len);
    return CFX_OK;
}

/* Cluster-token authentication: HMAC-SHA256 via OpenSSL libcrypto. */
#include "control/auth.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

static const char *const side_label[] = {
    /* v2: the MACs of these sides also cover binding bytes (roles, node ids) */
    [CFX_AUTH_CLIENT] = "conflux-v2 client",
    [CFX_AUTH_COORD] = "conflux-v2 coord",
    [CFX_AUTH_DP_ACCEPT] = "conflux-v2 dp accept",
    [CFX_AUTH_DP_CONNECT] = "conflux-v2 dp connect",
    [CFX_AUTH_SHM_ACCEPT] = "conflux-v1 shm accept",
    [CFX_AUTH_SHM_CONNECT] = "conflux-v1 shm connect",
};

void cfx__crypto_init(void)
{
    /* when the program initialised OpenSSL before, its exit handler is
     * registered already and stays: the program's choice */
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int cfx__auth_nonce(uint8_t *buf, size_t len)
{
    if (RAND_bytes(buf, (int)len) != 1)
        return cfx__err(CFX_ERR_INTERNAL, "RAND_bytes failed: no entropy for an auth nonce");
    return CFX_OK;
}

int cfx__auth_mac_bound(const char *token, enum cfx_auth_side side,
                        const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                        const uint8_t client_nonce[CFX_AUTH_NONCE_LEN], const void *bind,
                        size_t bind_len, uint8_t mac[CFX_AUTH_MAC_LEN])
{
    uint8_t msg[32 + 2 * CFX_AUTH_NONCE_LEN + CFX_AUTH_BIND_MAX];
    unsigned maclen = 0;

    if (!token || !*token)
        return cfx__err(CFX_ERR_INVALID, "empty cluster token");
    if ((unsigned)side >= sizeof(side_label) / sizeof(side_label[0]))
        return cfx__err(CFX_ERR_INVALID, "bad auth side %d", (int)side);
    if (bind_len > CFX_AUTH_BIND_MAX || (bind_len && !bind))
        return cfx__err(CFX_ERR_INVALID, "%zu binding bytes for a MAC (at most %d)", bind_len,
                        CFX_AUTH_BIND_MAX);
    /* Labels are NUL-padded to 32 bytes so the message has a fixed layout;
     * the binding bytes of one side have a fixed length too. */
    memset(msg, 0, 32);
    memcpy(msg, side_label[side], strlen(side_label[side]));
    memcpy(msg + 32, server_nonce, CFX_AUTH_NONCE_LEN);
    memcpy(msg + 32 + CFX_AUTH_NONCE_LEN, client_nonce, CFX_AUTH_NONCE_LEN);
    if (bind_len)
        memcpy(msg + 32 + 2 * CFX_AUTH_NONCE_LEN, bind, bind_len);
    if (!HMAC(EVP_sha256(), token, (int)strlen(token), msg,
              32 + 2 * CFX_AUTH_NONCE_LEN + bind_len, mac, &maclen) ||
        maclen != CFX_AUTH_MAC_LEN)
        return cfx__err(CFX_ERR_INTERNAL, "HMAC-SHA256 failed in libcrypto");
    return CFX_OK;
}

int cfx__auth_verify_bound(const char *token, enum cfx_auth_side side,
                           const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                           const uint8_t client_nonce[CFX_AUTH_NONCE_LEN], const void *bind,
                           size_t bind_len, const uint8_t mac[CFX_AUTH_MAC_LEN])
{
    uint8_t want[CFX_AUTH_MAC_LEN];
    int rc = cfx__auth_mac_bound(token, side, server_nonce, client_nonce, bind, bind_len, want);
    if (rc != CFX_OK)
        return rc;
    rc = CRYPTO_memcmp(want, mac, CFX_AUTH_MAC_LEN) == 0 ? CFX_OK : CFX_ERR_AUTH;
    OPENSSL_cleanse(want, sizeof(want));
    if (rc != CFX_OK)
        return cfx__err(rc, "cluster token mismatch");
    return CFX_OK;
}

int cfx__auth_mac(const char *token, enum cfx_auth_side side,
                  const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                  const uint8_t client_nonce[CFX_AUTH_NONCE_LEN],
                  uint8_t mac[CFX_AUTH_MAC_LEN])
{
    return cfx__auth_mac_bound(token, side, server_nonce, client_nonce, NULL, 0, mac);
}

int cfx__auth_verify(const char *token, enum cfx_auth_side side,
                     const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                     const uint8_t client_nonce[CFX_AUTH_NONCE_LEN],
                     const uint8_t mac[CFX_AUTH_MAC_LEN])
{
    return cfx__auth_verify_bound(token, side, server_nonce, client_nonce, NULL, 0, mac);
}

void cfx__auth_dp_bind(uint32_t connector_node, uint32_t acceptor_node,
                       uint8_t out[CFX_AUTH_DP_BIND_LEN])
{
    /* little-endian, connector first: the roles are the labels' */
    for (int i = 0; i < 4; i++) {
        out[i] = (uint8_t)(connector_node >> (8 * i));
        out[4 + i] = (uint8_t)(acceptor_node >> (8 * i));
    }
}

static int token_copy(const char *src, size_t n, const char *from, char *buf, size_t len)
{
    if (n == 0)
        return cfx__err(CFX_ERR_AUTH, "the cluster token from %s is empty", from);
    if (n >= len || n > CFX_TOKEN_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "the cluster token from %s is longer than %zu bytes",
                        from, CFX_MIN(len ? len - 1 : 0, (size_t)CFX_TOKEN_MAX));
    memcpy(buf, src, n);
    buf[n] = '\0';
    return CFX_OK;
}

int cfx__token_load(const char *explicit_token, char *buf, size_t len)
{
    const char *v;

    if (!buf || len == 0)
        return cfx__err(CFX_ERR_INVALID, "no buffer for the cluster token");
    buf[0] = '\0';
    if (explicit_token && *explicit_token)
        return token_copy(explicit_token, strlen(explicit_token), "the caller", buf, len);
    v = getenv("CFX_TOKEN");
    if (v && *v)
        return token_copy(v, strlen(v), "CFX_TOKEN", buf, len);

    v = getenv("CFX_TOKEN_FILE");
    if (!v || !*v)
        return cfx__err(CFX_ERR_AUTH,
                        "no cluster token: set CFX_TOKEN to the token or CFX_TOKEN_FILE "
                        "to a file holding it");
    char from[512]; /* for the errors: a longer path is cut there */
    snprintf(from, sizeof(from), "CFX_TOKEN_FILE=%s", v);
    return cfx__token_load_file(v, from, buf, len);
}

int cfx__token_load_file(const char *path, const char *from, char *buf, size_t len)
{
    if (!buf || len == 0)
        return cfx__err(CFX_ERR_INVALID, "no buffer for the cluster token");
    buf[0] = '\0';
    char line[CFX_TOKEN_MAX + 2];
    FILE *f = fopen(path, "re");
    if (!f)
        return cfx__err(CFX_ERR_AUTH, "cannot read the cluster token file %s: %s", from,
                        strerror(errno));
    /* Anyone who reads the token joins the cluster and reads and writes
     * its objects (docs/SECURITY.md): a file group or others may read is
     * said so, once a process (every context loads it; a refusal would
     * break a team's shared file all at once, as ssh's would) */
    static atomic_bool warned;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) &&
        (st.st_mode & (S_IRWXG | S_IRWXO)) && !atomic_exchange(&warned, true))
        CFX_LOG(WARN, AUTH, "the cluster token file %s is open to %s (mode %03o): whoever "
                "reads it can join the cluster; chmod 600 it", from,
                (st.st_mode & S_IRWXO) ? "other users" : "its group",
                (unsigned)(st.st_mode & 0777));
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    int ferr = ferror(f) ? errno : 0;
    fclose(f);
    if (ferr) /* a directory opens, and fails its read with EISDIR */
        return cfx__err(CFX_ERR_AUTH, "cannot read the cluster token file %s: %s", from,
                        strerror(ferr));
    line[n] = '\0';
    /* The token is the first line; a trailing newline (or CRLF) is not part of it. */
    char *nl = memchr(line, '\n', n);
    if (nl) {
        *nl = '\0';
        n = (size_t)(nl - line);
    } else if (n > CFX_TOKEN_MAX) {
        OPENSSL_cleanse(line, sizeof(line));
        return cfx__err(CFX_ERR_TOO_BIG, "the cluster token in %s is longer than %d bytes", from,
                        CFX_TOKEN_MAX);
    }
    if (n && line[n - 1] == '\r')
        line[--n] = '\0';
    int rc = token_copy(line, strlen(line), from, buf, len);
    OPENSSL_cleanse(line, sizeof(line));
    return rc;
}

unsigned cfx__token_bits(const char *token)
{
    size_t n = strlen(token), hex = strspn(token, "0123456789abcdefABCDEF");
    size_t bits = n * (hex == n ? 4 : 6);
    return bits > UINT32_MAX ? UINT32_MAX : (unsigned)bits;
}

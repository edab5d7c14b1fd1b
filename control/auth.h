/*
 * Cluster-token authentication (mutual HMAC-SHA256 challenge-response).
 *
 *   coord  -> client  CHALLENGE { server nonce Ns, mode }
 *   client -> coord   AUTH { role, Nc, HMAC(token, "conflux-v2 client" | Ns | Nc | role | mode),
 *                            mode }
 *   coord  -> client  AUTH_OK { HMAC(token, "conflux-v2 coord" | Ns | Nc | role | mode) }
 *                     or ERROR(CFX_ERR_AUTH)
 *
 * (mode: each side's CFX_SECURE, which must agree; control/ctl_seal.h.)
 *
 * The client proves the token first; the coordinator's MAC goes out only
 * once that proof verified, so a stranger collects nothing it could test
 * token guesses against offline.  Distinct labels keep one side's MAC from
 * being replayed as the other's; the role byte under both MACs keeps a
 * node's proof from being turned into an admin's (or back); fresh nonces on
 * both sides keep old exchanges from being replayed.  The
 * token never travels and is never logged.  MACs are compared with
 * CRYPTO_memcmp().  All functions are thread-safe.
 */
#ifndef CFX_CONTROL_AUTH_H
#define CFX_CONTROL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define CFX_AUTH_NONCE_LEN 32
#define CFX_AUTH_MAC_LEN   32
#define CFX_TOKEN_MAX      256  /* longest token accepted, excluding NUL */

enum cfx_auth_side {
    CFX_AUTH_CLIENT = 0,   /* MAC a client sends */
    CFX_AUTH_COORD  = 1,   /* MAC the coordinator sends back */
    /* Data-plane connection handshake (dataplane/engine/conn_auth.c); the
     * server nonce is the acceptor's, the client nonce the connector's. */
    CFX_AUTH_DP_ACCEPT  = 2, /* MAC the accepting node sends */
    CFX_AUTH_DP_CONNECT = 3, /* MAC the connecting node sends */
    /* shm transport handshake (dataplane/shm/shm_conn.c), before the rings
     * carry anything; nonces as for the data-plane handshake. */
    CFX_AUTH_SHM_ACCEPT  = 4, /* MAC the acceptor puts in its ACK */
    CFX_AUTH_SHM_CONNECT = 5, /* MAC the connector puts in its AUTH */
};

/* Fill @p buf with @p len cryptographically random bytes.  CFX_OK / CFX_ERR_INTERNAL. */
/* Before the library's first use of OpenSSL (context or coordinator start):
 * no cleanup of OpenSSL at exit().  Its atexit handler frees the locks the
 * library's threads may be using, so a program that exits with a context
 * still running would crash in OpenSSL instead of exiting. */
void cfx__crypto_init(void);

int cfx__auth_nonce(uint8_t *buf, size_t len);

/* MAC of one side over both nonces.  CFX_OK, CFX_ERR_INVALID (empty token),
 * CFX_ERR_INTERNAL (libcrypto failure). */
int cfx__auth_mac(const char *token, enum cfx_auth_side side,
                  const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                  const uint8_t client_nonce[CFX_AUTH_NONCE_LEN],
                  uint8_t mac[CFX_AUTH_MAC_LEN]);

/* Check a received MAC in constant time.  CFX_OK or CFX_ERR_AUTH. */
int cfx__auth_verify(const char *token, enum cfx_auth_side side,
                     const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                     const uint8_t client_nonce[CFX_AUTH_NONCE_LEN],
                     const uint8_t mac[CFX_AUTH_MAC_LEN]);

#define CFX_AUTH_BIND_MAX    32 /* binding bytes one MAC may cover */
#define CFX_AUTH_DP_BIND_LEN 8  /* data plane: connector and acceptor node ids */

/* As cfx__auth_mac / cfx__auth_verify, the MAC also covering @p bind_len
 * (<= CFX_AUTH_BIND_MAX, fixed per side) bytes that say who talks to whom
 * (control: the role; data plane: both node ids), so a proof made for one
 * pair of peers or one role is refused for any other. */
int cfx__auth_mac_bound(const char *token, enum cfx_auth_side side,
                        const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                        const uint8_t client_nonce[CFX_AUTH_NONCE_LEN], const void *bind,
                        size_t bind_len, uint8_t mac[CFX_AUTH_MAC_LEN]);
int cfx__auth_verify_bound(const char *token, enum cfx_auth_side side,
                           const uint8_t server_nonce[CFX_AUTH_NONCE_LEN],
                           const uint8_t client_nonce[CFX_AUTH_NONCE_LEN], const void *bind,
                           size_t bind_len, const uint8_t mac[CFX_AUTH_MAC_LEN]);

/* The data plane's binding bytes: connector's node id, acceptor's (u32 LE each). */
void cfx__auth_dp_bind(uint32_t connector_node, uint32_t acceptor_node,
                       uint8_t out[CFX_AUTH_DP_BIND_LEN]);

/*
 * Find the cluster token: @p explicit_token if non-NULL and non-empty, else
 * $CFX_TOKEN, else the first line of the file named by $CFX_TOKEN_FILE
 * (trailing newline / CR removed).  Copies it into @p buf of @p len bytes.
 * @return CFX_OK; CFX_ERR_AUTH when none is configured or the file is
 *         unreadable or empty (cfx_last_error() tells the user to set
 *         CFX_TOKEN or CFX_TOKEN_FILE); CFX_ERR_TOO_BIG when it does not fit.
 */
int cfx__token_load(const char *explicit_token, char *buf, size_t len);

/*
 * The first line of the file @p path as the cluster token, as
 * cfx__token_load() reads $CFX_TOKEN_FILE; @p from names where the path
 * came from in the errors ("CFX_TOKEN_FILE=PATH" there; a tool's option
 * gives the path alone and names the option itself).
 */
int cfx__token_load_file(const char *path, const char *from, char *buf, size_t len);

#define CFX_TOKEN_MIN_BITS 128  /* below this, tools warn */

/* At most how many bits of entropy @p token can hold: 4 per character when
 * it is all hex digits, 6 otherwise (printable text).  An upper bound: a
 * word from a dictionary holds far less. */
unsigned cfx__token_bits(const char *token);

#endif

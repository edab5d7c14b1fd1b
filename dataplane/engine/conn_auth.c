/*
 * Data-plane connection authentication: mutual HMAC-SHA256 challenge-response
 * with the cluster token, on every transport (tcp, shm, verbs alike), before
 * any transfer message is served or accepted.
 *
 *   connector -> acceptor  HELLO { node id, Nc }
 *   acceptor  -> connector AUTH  { Na, HMAC(token, "conflux-v1 dp accept"  | Na | Nc) }
 *   connector -> acceptor  AUTH  { Na, HMAC(token, "conflux-v1 dp connect" | Na | Nc) }
 *
 * Both nonces are fresh per connection (32 random bytes each), so a recorded
 * exchange cannot be replayed; the labels differ per direction and from the
 * control plane's, so no MAC can be reflected or reused across protocols.
 * The connector holds its requests until the acceptor proved itself; the
 * acceptor takes nothing but HELLO and AUTH until the connector did
 * (xfer.c).  A refused peer is logged with its address and the connection
 * closed; the token is never logged.
 *
 * Progress-lock holder only (engine.h), ctx->lock held.
 */
#include "engine.h"

#include <string.h>

#include <openssl/crypto.h>

#include "control/auth.h"

_Static_assert(CFX_DP_NONCE_LEN == CFX_AUTH_NONCE_LEN, "nonce sizes");
_Static_assert(CFX_DP_MAC_LEN == CFX_AUTH_MAC_LEN, "MAC sizes");

static void refuse(struct cfx_conn *conn, int status, const char *why)
{
    CFX_LOG(WARN, CONN, "node %u: refused %s: %s", conn->ctx->node_id, conn->name, why);
    cfx__conn_fail(conn, status, why);
}

static void auth_init(struct cfx_dp_auth *a)
{
    memset(a, 0, sizeof(*a));
    a->hdr.magic = CFX_DP_MAGIC;
    a->hdr.version = CFX_DP_VERSION;
    a->hdr.type = CFX_DP_AUTH;
}

int cfx__conn_auth_hello_out(struct cfx_conn *conn)
{
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = conn->ctx->node_id,
    };
    int rc = cfx__auth_nonce(conn->nonce, sizeof(conn->nonce));
    if (rc != CFX_OK) {
        cfx__conn_fail(conn, rc, "no nonce for the handshake");
        return rc;
    }
    memcpy(h.nonce, conn->nonce, sizeof(h.nonce));
    return cfx__conn_send_hs(conn, &h, sizeof(h)); /* a failure ended the connection */
}

void cfx__conn_auth_hello_in(struct cfx_conn *conn, const struct cfx_dp_hello *m)
{
    struct cfx_context *ctx = conn->ctx;
    struct cfx_dp_auth a;

    if (conn->auth_sent) {
        refuse(conn, CFX_ERR_PROTO, "a second HELLO");
        return;
    }
    memcpy(conn->peer_nonce, m->nonce, sizeof(conn->peer_nonce));
    auth_init(&a);
    if (cfx__auth_nonce(conn->nonce, sizeof(conn->nonce)) != CFX_OK ||
        cfx__auth_mac(ctx->token, CFX_AUTH_DP_ACCEPT, conn->nonce, conn->peer_nonce, a.mac) !=
            CFX_OK) {
        CFX_LOG(ERR, CONN, "node %u: cannot answer %s: %s", ctx->node_id, conn->name,
                cfx_last_error());
        cfx__conn_fail(conn, CFX_ERR_INTERNAL, "no MAC");
        return;
    }
    memcpy(a.nonce, conn->nonce, sizeof(a.nonce));
    /* the connector sends eager messages on this connection: our threshold
     * and our grant rule them (eager.c) */
    a.eager_max = ctx->cfg.eager_max;
    a.eager_credits = CFX_EAGER_CREDITS;
    conn->eager_granted = CFX_EAGER_CREDITS;
    conn->auth_sent = true;
    cfx__conn_send_hs(conn, &a, sizeof(a));
}

void cfx__conn_auth_msg(struct cfx_conn *conn, const struct cfx_dp_auth *m)
{
    struct cfx_context *ctx = conn->ctx;

    if (conn->authed) {
        refuse(conn, CFX_ERR_PROTO, "AUTH on an authenticated connection");
        return;
    }
    if (conn->outbound) {
        /* The acceptor proves itself first: requests wait for it. */
        struct cfx_dp_auth a;
        memcpy(conn->peer_nonce, m->nonce, sizeof(conn->peer_nonce));
        if (cfx__auth_verify(ctx->token, CFX_AUTH_DP_ACCEPT, conn->peer_nonce, conn->nonce,
                             m->mac) != CFX_OK) {
            refuse(conn, CFX_ERR_AUTH, "it does not prove the cluster token");
            return;
        }
        if (m->eager_max > CFX_EAGER_LIMIT || m->eager_credits > 4 * CFX_EAGER_CREDITS) {
            refuse(conn, CFX_ERR_PROTO, "an eager threshold or grant out of range");
            return;
        }
        conn->eager_max = m->eager_max;
        conn->eager_credits = conn->eager_granted = m->eager_credits;
        conn->eager_known = true;
        auth_init(&a);
        if (cfx__auth_mac(ctx->token, CFX_AUTH_DP_CONNECT, conn->peer_nonce, conn->nonce,
                          a.mac) != CFX_OK) {
            cfx__conn_fail(conn, CFX_ERR_INTERNAL, "no MAC");
            return;
        }
        memcpy(a.nonce, conn->peer_nonce, sizeof(a.nonce));
        conn->auth_sent = true;
        if (cfx__conn_send_hs(conn, &a, sizeof(a)) != CFX_OK)
            return;
        conn->authed = true;
        CFX_LOG(DEBUG, CONN, "node %u: %s authenticated (eager up to %u B, %u credits)",
                ctx->node_id, conn->name, conn->eager_max, conn->eager_credits);
        if (cfx__conn_flush(conn) < 0)
            return; /* the connection failed and is gone */
        cfx__eager_pump(conn);
        return;
    }
    if (!conn->auth_sent || memcmp(m->nonce, conn->nonce, sizeof(conn->nonce)) ||
        cfx__auth_verify(ctx->token, CFX_AUTH_DP_CONNECT, conn->nonce, conn->peer_nonce,
                         m->mac) != CFX_OK) {
        refuse(conn, CFX_ERR_AUTH, "it does not prove the cluster token");
        return;
    }
    conn->authed = true;
    CFX_LOG(DEBUG, CONN, "node %u: %s authenticated", ctx->node_id, conn->name);
    cfx__conn_flush(conn); /* anything queued for it meanwhile */
}

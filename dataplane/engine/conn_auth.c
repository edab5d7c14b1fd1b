/*
 * Data-plane connection authentication: mutual HMAC-SHA256 challenge-response
 * with the cluster token, on every transport (tcp, shm, verbs alike), before
 * any transfer message is served or accepted.  The connector proves itself
 * first:
 *
 *   connector -> acceptor  HELLO { node id C, Nc }
 *   acceptor  -> connector AUTH  { Na, no MAC }                              (challenge)
 *   connector -> acceptor  AUTH  { Na, HMAC(token, "conflux-v2 dp connect" | Na | Nc | C | A) }
 *   acceptor  -> connector AUTH  { Na, HMAC(token, "conflux-v2 dp accept"  | Na | Nc | C | A),
 *                                  eager threshold and credits }             (proof)
 *
 * The acceptor sends nothing computed from the token until the connector's
 * MAC verified, so a stranger who reaches the port gets a nonce and then a
 * refusal, never a MAC it could test token guesses against offline.  Both
 * MACs cover both node ids: C as the HELLO claims it, A as the connector
 * expects it (the directory's record for the address it dialled) and as the
 * acceptor knows itself; a proof made for another pair of nodes is refused,
 * and a connector that reached another node than it meant (an address
 * reused) refuses the answer.  The labels name the roles, so no MAC can be
 * reflected.  Nonces are fresh per connection (32 random bytes each), so a
 * recorded exchange cannot be replayed.  The connector holds its requests
 * until the acceptor proved itself; the acceptor takes nothing but HELLO and
 * AUTH until the connector did (xfer.c).  A refused peer is logged with its
 * address and the connection closed; the token is never logged.
 *
 * CFX_SECURE.  Both sides say their mode (HELLO, the challenge, both
 * proofs), and the mode is under both MACs (the binding is C | A | mode
 * when sealing, C | A when not), so a node that seals and one that does
 * not refuse each other, naming the two settings, and nobody on the path
 * can turn sealing off.  When sealing, each side derives the connection's
 * keys (control/seal.h: HKDF-SHA256 of the token, salt Na | Nc, info the
 * binding) once the other's MAC verified or its own proof is made, and
 * hands them to a transport that seals (ep_seal) before it posts the frame
 * that is its last in clear: the connector's proof, the acceptor's answer.
 * A transport that cannot seal is used only between processes of one host
 * (shm: same user, docs/SECURITY.md); the context opens no other.
 *
 * Progress-lock holder only (engine.h), ctx->lock held.
 */
#include "engine.h"

#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>

#include "control/auth.h"
#include "dataplane/common/flood.h"

_Static_assert(CFX_DP_NONCE_LEN == CFX_AUTH_NONCE_LEN, "nonce sizes");
_Static_assert(CFX_DP_MAC_LEN == CFX_AUTH_MAC_LEN, "MAC sizes");

void cfx__conn_refuse(struct cfx_conn *conn, int status, const char *why)
{
    /* a stranger drives these as fast as it can connect and send a wrong
     * proof: a line a second at most (per thread: the progress-lock holder
     * of each context writes its own) */
    static __thread struct cfx_ratelog refused;
    CFX_RATELOG(&refused, CONN, cfx__now_ns(), "node %u: refused %s: %s", conn->ctx->node_id,
                conn->name, why);
    cfx__conn_fail(conn, status, why);
}

/* The peer proved the token: let its writes into this side's memory (verbs:
 * the QP takes remote writes from now on; docs/SECURITY.md).  Called where
 * conn->authed is set, before anything tells the peer.  A failure ended the
 * connection. */
static int authorize(struct cfx_conn *conn)
{
    int rc = cfx__tp_ep_authorize(conn->ctx->tp[conn->tp].ops, conn->ep);
    if (rc != CFX_OK) {
        CFX_LOG(WARN, CONN, "node %u: cannot open %s to the peer's writes: %s",
                conn->ctx->node_id, conn->name, cfx_last_error());
        cfx__conn_fail(conn, rc, "the transport did not take the authorization");
    }
    return rc;
}

int cfx__conn_auth_hello_out(struct cfx_conn *conn)
{
    struct cfx_dp_hello h = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = CFX_DP_HELLO },
        .node_id = conn->ctx->node_id,
        .secure = (uint32_t)conn->ctx->cfg.secure,
    };
    int rc = cfx__auth_nonce(conn->nonce, sizeof(conn->nonce));
    if (rc != CFX_OK) {
        cfx__conn_fail(conn, rc, "no nonce for the handshake");
        return rc;
    }
    memcpy(h.nonce, conn->nonce, sizeof(h.nonce));
    return cfx__conn_send_hs(conn, &h, sizeof(h)); /* a failure ended the connection */
}

static void auth_init(const struct cfx_conn *conn, struct cfx_dp_auth *a,
                      const uint8_t nonce[CFX_DP_NONCE_LEN])
{
    memset(a, 0, sizeof(*a));
    a->hdr.magic = CFX_DP_MAGIC;
    a->hdr.version = CFX_DP_VERSION;
    a->hdr.type = CFX_DP_AUTH;
    memcpy(a->nonce, nonce, sizeof(a->nonce));
    a->secure = (uint32_t)conn->ctx->cfg.secure;
}

#define BIND_MAX (CFX_AUTH_DP_BIND_LEN + 1)

/* Both node ids under the MACs, @p conn's connector first, and the mode
 * when sealing.  Returns the binding's length. */
static size_t conn_bind(const struct cfx_conn *conn, uint8_t bind[BIND_MAX])
{
    uint32_t self = conn->ctx->node_id;
    if (conn->outbound)
        cfx__auth_dp_bind(self, conn->node_id, bind);
    else
        cfx__auth_dp_bind(conn->node_id, self, bind);
    if (conn->ctx->cfg.secure == CFX_SEAL_OFF)
        return CFX_AUTH_DP_BIND_LEN;
    bind[CFX_AUTH_DP_BIND_LEN] = (uint8_t)conn->ctx->cfg.secure;
    return BIND_MAX;
}

/* MAC of @p side on @p conn; the acceptor's nonce is the server nonce. */
static int conn_mac(const struct cfx_conn *conn, enum cfx_auth_side side, uint8_t *mac)
{
    uint8_t bind[BIND_MAX];
    const uint8_t *na = conn->outbound ? conn->peer_nonce : conn->nonce;
    const uint8_t *nc = conn->outbound ? conn->nonce : conn->peer_nonce;
    size_t n = conn_bind(conn, bind);
    return cfx__auth_mac_bound(conn->ctx->token, side, na, nc, bind, n, mac);
}

static int conn_verify(const struct cfx_conn *conn, enum cfx_auth_side side, const uint8_t *mac)
{
    uint8_t bind[BIND_MAX];
    const uint8_t *na = conn->outbound ? conn->peer_nonce : conn->nonce;
    const uint8_t *nc = conn->outbound ? conn->nonce : conn->peer_nonce;
    size_t n = conn_bind(conn, bind);
    return cfx__auth_verify_bound(conn->ctx->token, side, na, nc, bind, n, mac);
}

/*
 * Authenticated peers' connections into this node are capped: each holds an
 * endpoint's buffers and up to its eager grant of unreceived messages, and a
 * token holder could open them without end (under any node id it claims).
 * Of one node id at most CONN_IN_PER_NODE live at once: a newer one closes
 * the oldest (an honest node has one, and one more while a connection it
 * lost is still being found dead); of all, CFX_MAX_PEER_CONNS (default
 * 4096, the coordinator's --max-conns): one more is refused.  False when
 * @p conn was refused (it is gone).
 */
#define CONN_IN_PER_NODE 4

static bool inbound_room(struct cfx_conn *conn)
{
    struct cfx_context *ctx = conn->ctx;
    long long max = cfx__env_ll_clamp("CFX_MAX_PEER_CONNS", 4096, 1, 1 << 20);
    struct cfx_conn *oldest = NULL;
    unsigned of_node = 0;
    long long all = 0;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c == conn || c->outbound || !c->authed || c->state == CFX_CONN_FAILED)
            continue;
        all++;
        if (c->node_id == conn->node_id && !of_node++)
            oldest = c;
    }
    if (all >= max) {
        char why[160];
        snprintf(why, sizeof(why), "this node holds %lld connections of authenticated peers, "
                 "the most it takes (CFX_MAX_PEER_CONNS)", all);
        cfx__conn_refuse(conn, CFX_ERR_NO_RESOURCE, why);
        return false;
    }
    if (of_node >= CONN_IN_PER_NODE)
        cfx__conn_refuse(oldest, CFX_ERR_PROTO, "the oldest of its connections here: a newer "
                         "one came, and a node holds at most 4 (CONN_IN_PER_NODE)");
    return true;
}

/* Both sides must seal alike: a mismatch is refused, naming both settings. */
static bool mode_agrees(struct cfx_conn *conn, uint32_t peer)
{
    int self = conn->ctx->cfg.secure;
    if (peer == (uint32_t)self)
        return true;
    char why[128];
    snprintf(why, sizeof(why), "it runs with CFX_SECURE=%s, this node with %s",
             cfx__seal_mode_name((int)peer), cfx__seal_mode_name(self));
    cfx__err(CFX_ERR_AUTH, "%s: %s", conn->name, why);
    cfx__conn_refuse(conn, CFX_ERR_AUTH, why);
    return false;
}

/* Sealing agreed: derive the connection's keys and hand them to the
 * transport; the next frame posted is this side's last in clear.  A
 * failure ended the connection. */
static int conn_seal(struct cfx_conn *conn)
{
    struct cfx_context *ctx = conn->ctx;
    const struct cfx_transport_ops *ops = ctx->tp[conn->tp].ops;
    struct cfx_seal_keys keys;
    uint8_t bind[BIND_MAX], salt[2 * CFX_DP_NONCE_LEN];
    int rc;

    if (ctx->cfg.secure == CFX_SEAL_OFF)
        return CFX_OK;
    if (!ops->ep_seal) {
        if (ops->caps & CFX_TP_CAP_SAME_HOST)
            return CFX_OK; /* one host, one user: docs/SECURITY.md */
        cfx__conn_fail(conn, CFX_ERR_UNSUPPORTED, "the transport cannot seal");
        return CFX_ERR_UNSUPPORTED;
    }
    memcpy(salt, conn->outbound ? conn->peer_nonce : conn->nonce, CFX_DP_NONCE_LEN);
    memcpy(salt + CFX_DP_NONCE_LEN, conn->outbound ? conn->nonce : conn->peer_nonce,
           CFX_DP_NONCE_LEN);
    size_t n = conn_bind(conn, bind);
    rc = cfx__seal_derive(ctx->token, "conflux-v1 dp seal", salt, sizeof(salt), bind, n, &keys);
    if (rc == CFX_OK)
        rc = ops->ep_seal(conn->ep, ctx->cfg.secure, &keys, conn->outbound);
    cfx__seal_keys_cleanse(&keys);
    if (rc != CFX_OK) {
        CFX_LOG(ERR, CONN, "node %u: cannot seal %s: %s", ctx->node_id, conn->name,
                cfx_last_error());
        cfx__conn_fail(conn, rc, "cannot seal the connection");
    }
    return rc;
}

void cfx__conn_auth_hello_in(struct cfx_conn *conn, const struct cfx_dp_hello *m)
{
    struct cfx_context *ctx = conn->ctx;
    struct cfx_dp_auth a;

    if (conn->auth_sent) {
        cfx__conn_refuse(conn, CFX_ERR_PROTO, "a second HELLO");
        return;
    }
    memcpy(conn->peer_nonce, m->nonce, sizeof(conn->peer_nonce));
    if (cfx__auth_nonce(conn->nonce, sizeof(conn->nonce)) != CFX_OK) {
        CFX_LOG(ERR, CONN, "node %u: cannot answer %s: %s", ctx->node_id, conn->name,
                cfx_last_error());
        cfx__conn_fail(conn, CFX_ERR_INTERNAL, "no nonce for the handshake");
        return;
    }
    /* The challenge: our nonce and mode, nothing derived from the token.  A
     * connector of another mode learns it here and refuses, naming both;
     * its proof would be refused here anyway (the mode is under the MAC). */
    auth_init(conn, &a, conn->nonce);
    conn->auth_sent = true;
    cfx__conn_send_hs(conn, &a, sizeof(a));
}

/* Connector: the acceptor's challenge (@p m: its nonce) came; prove the token. */
static void connector_prove(struct cfx_conn *conn, const struct cfx_dp_auth *m)
{
    struct cfx_dp_auth a;

    if (!mode_agrees(conn, m->secure))
        return;
    memcpy(conn->peer_nonce, m->nonce, sizeof(conn->peer_nonce));
    auth_init(conn, &a, conn->peer_nonce);
    if (conn_mac(conn, CFX_AUTH_DP_CONNECT, a.mac) != CFX_OK) {
        cfx__conn_fail(conn, CFX_ERR_INTERNAL, "no MAC");
        return;
    }
    if (conn_seal(conn) != CFX_OK)
        return; /* the connection failed and is gone */
    conn->auth_sent = true;
    cfx__conn_send_hs(conn, &a, sizeof(a)); /* a failure ended the connection */
}

/* Connector: the acceptor's proof (@p m) came. */
static void connector_check(struct cfx_conn *conn, const struct cfx_dp_auth *m)
{
    struct cfx_context *ctx = conn->ctx;

    if (!mode_agrees(conn, m->secure))
        return;
    if (CRYPTO_memcmp(m->nonce, conn->peer_nonce, sizeof(conn->peer_nonce)) ||
        conn_verify(conn, CFX_AUTH_DP_ACCEPT, m->mac) != CFX_OK) {
        cfx__conn_refuse(conn, CFX_ERR_AUTH, "it does not prove the cluster token (or it is "
                                             "not node the directory named for its address)");
        return;
    }
    if (m->eager_max > CFX_EAGER_LIMIT || m->eager_credits > 4 * CFX_EAGER_CREDITS) {
        cfx__conn_refuse(conn, CFX_ERR_PROTO, "an eager threshold or grant out of range");
        return;
    }
    conn->eager_max = m->eager_max;
    conn->eager_credits = conn->eager_granted = m->eager_credits;
    conn->eager_known = true;
    if (authorize(conn) != CFX_OK)
        return; /* the connection failed and is gone */
    conn->authed = true;
    CFX_LOG(DEBUG, CONN, "node %u: %s authenticated (eager up to %u B, %u credits)",
            ctx->node_id, conn->name, conn->eager_max, conn->eager_credits);
    if (cfx__conn_flush(conn) < 0)
        return; /* the connection failed and is gone */
    cfx__eager_pump(conn);
}

void cfx__conn_auth_msg(struct cfx_conn *conn, const struct cfx_dp_auth *m)
{
    struct cfx_context *ctx = conn->ctx;
    struct cfx_dp_auth a;

    if (conn->authed) {
        cfx__conn_refuse(conn, CFX_ERR_PROTO, "AUTH on an authenticated connection");
        return;
    }
    if (conn->outbound) {
        if (!conn->auth_sent)
            connector_prove(conn, m);
        else
            connector_check(conn, m);
        return;
    }
    /* Acceptor: the connector's proof.  A wrong one gets the refusal only. */
    if (conn->auth_sent && !mode_agrees(conn, m->secure))
        return;
    if (!conn->auth_sent || CRYPTO_memcmp(m->nonce, conn->nonce, sizeof(conn->nonce)) ||
        conn_verify(conn, CFX_AUTH_DP_CONNECT, m->mac) != CFX_OK) {
        cfx__conn_refuse(conn, CFX_ERR_AUTH, "it does not prove the cluster token for the "
                                             "node id it claims");
        return;
    }
    if (!inbound_room(conn))
        return; /* refused: it is gone */
    auth_init(conn, &a, conn->nonce);
    if (conn_mac(conn, CFX_AUTH_DP_ACCEPT, a.mac) != CFX_OK) {
        CFX_LOG(ERR, CONN, "node %u: cannot answer %s: %s", ctx->node_id, conn->name,
                cfx_last_error());
        cfx__conn_fail(conn, CFX_ERR_INTERNAL, "no MAC");
        return;
    }
    /* the connector sends eager messages on this connection: our threshold
     * and our grant rule them (eager.c) */
    a.eager_max = ctx->cfg.eager_max;
    a.eager_credits = CFX_EAGER_CREDITS;
    conn->eager_granted = CFX_EAGER_CREDITS;
    if (authorize(conn) != CFX_OK || conn_seal(conn) != CFX_OK)
        return; /* the connection failed and is gone */
    conn->authed = true;
    CFX_LOG(DEBUG, CONN, "node %u: %s authenticated", ctx->node_id, conn->name);
    if (cfx__conn_send_hs(conn, &a, sizeof(a)) != CFX_OK)
        return; /* the connection failed and is gone */
    cfx__conn_flush(conn); /* anything queued for it meanwhile */
}

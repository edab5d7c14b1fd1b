/*
 * Receiver-driven, credit-based chunk transfer.
 *
 * The receiver registers its destination, takes a slot and sends GET_REQ
 * with a remote descriptor and a window of chunk credits.  The source writes
 * chunk i with imm = slot << 20 | i.  The receiver keeps a bitmap and a
 * contiguous prefix (ready_chunks); chunks in the prefix may already be
 * served to further receivers, so a partial copy feeds any number of
 * downstream getters while it is still being received.  Credits flow back as
 * chunks land.
 *
 * Progress-lock holder only (engine.h), ctx->lock held.
 */
#include "engine.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static void id_hex(const struct cfx_object_id *id, char *buf)
{
    cfx_object_id_to_hex(id, buf);
    buf[12] = '\0'; /* a prefix is enough for a log line */
}

/* cfx__dp_msg_decode() is in dp_msg.c (pure; fuzzed by test/fuzz/fuzz_dp_msg.c). */

static void send_hdr(struct cfx_conn *conn, uint8_t type, uint32_t slot)
{
    struct cfx_dp_hdr h = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                            .type = type, .slot = slot };
    cfx__conn_send(conn, &h, sizeof(h));
}

/* The CANCEL of @p in: CANCEL_UNSEEN from a p2p receive none of whose
 * message landed here (a group's send then goes on to the next receive:
 * cfx__p2p_send_reoffer), the plain one otherwise. */
static void send_cancel(struct cfx_xfer_in *in)
{
    const struct cfx_obj *obj = in->obj;
    bool unseen = obj && obj->p2p == CFX_P2P_RECV && obj->bitmap;
    for (uint32_t w = 0; unseen && w < (obj->nchunks + 63) / 64; w++)
        unseen = !obj->bitmap[w];
    in->cancel_sent = true;
    in->verdict = obj && obj->p2p == CFX_P2P_RECV;
    send_hdr(in->conn, unseen ? CFX_DP_CANCEL_UNSEEN : CFX_DP_CANCEL, in->slot);
}

/* A withdrawn p2p receive whose every chunk landed before the CANCEL_ACK
 * (the writes come before it): its send matched it before reading the
 * CANCEL and finished (or wrote its last chunk), and completes; so does the
 * receive, marked complete here, where failing it lost the message. */
static bool p2p_landed_whole(struct cfx_xfer_in *in)
{
    struct cfx_obj *obj = in->obj;
    if (!obj || obj->p2p != CFX_P2P_RECV || !obj->nchunks)
        return false; /* an empty one comes whole as a NACK of CFX_OK */
    for (uint32_t c = 0; c < obj->nchunks; c++)
        if (!((obj->bitmap[c / 64] >> (c % 64)) & 1))
            return false;
    obj->ready_chunks = obj->nchunks;
    obj->complete = true;
    return true;
}

static void send_nack_type(struct cfx_conn *conn, uint8_t type, uint32_t slot, int status)
{
    struct cfx_dp_nack n = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION, .type = type, .slot = slot },
        .status = status,
    };
    cfx__conn_send(conn, &n, sizeof(n));
}

static void send_nack(struct cfx_conn *conn, uint32_t slot, int status)
{
    send_nack_type(conn, CFX_DP_GET_NACK, slot, status);
}

/* ---- receiver side -------------------------------------------------------- */

static int slot_alloc(struct cfx_context *ctx, struct cfx_xfer_in *in);

void cfx__xfer_in_finish(struct cfx_context *ctx, struct cfx_xfer_in *in, int status)
{
    if (in->status != CFX_ERR_AGAIN)
        return;
    if (in->conn) {
        /* the transfer is over: its window takes no more writes */
        struct cfx_tp_mr *mr = in->mr ? in->mr : in->obj ? in->obj->mr[in->conn->tp] : NULL;
        const struct cfx_transport_ops *ops = ctx->tp[in->conn->tp].ops;
        if (mr && ops->mr_revoke)
            ops->mr_revoke(mr);
    }
    if (in->conn && ctx->slots[in->slot] == in)
        ctx->slots[in->slot] = NULL;
    in->conn = NULL;
    cfx__status_set(&in->status, status);
    pthread_cond_broadcast(&ctx->obj_cond);
    if (in->rchild && status != CFX_OK)
        cfx__rtask_child_failed(ctx, in->rchild, status);
}

int cfx__xfer_grant(struct cfx_context *ctx, struct cfx_conn *conn, struct cfx_tp_mr *mr,
                    struct cfx_tp_rdesc *out)
{
    const struct cfx_transport_ops *ops = ctx->tp[conn->tp].ops;
    /* every transport grants per transfer (tcp, shm, dpdk: a random key checked
     * before a byte lands; verbs: a memory window on the peer's QP); mr_pack,
     * a key for the registration's life, only where a transport has none */
    return ops->mr_grant ? ops->mr_grant(mr, conn->ep, out) : ops->mr_pack(mr, out);
}

void cfx__dp_send_credit(struct cfx_conn *conn, uint32_t slot, uint32_t credits)
{
    struct cfx_dp_credit c = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                 .type = CFX_DP_CREDIT, .slot = slot },
        .credits = credits,
    };
    cfx__conn_send(conn, &c, sizeof(c));
}

int cfx__xfer_slot_alloc(struct cfx_context *ctx, struct cfx_xfer_in *in)
{
    return slot_alloc(ctx, in);
}

static int slot_alloc(struct cfx_context *ctx, struct cfx_xfer_in *in)
{
    /* round robin, so a slot is not reused while late writes for it may
     * still be on the wire */
    for (unsigned i = 0; i < CFX_XFER_SLOTS; i++) {
        uint32_t s = (ctx->next_slot + i) % CFX_XFER_SLOTS;
        if (!ctx->slots[s]) {
            ctx->slots[s] = in;
            in->slot = s;
            ctx->next_slot = (s + 1) % CFX_XFER_SLOTS;
            return CFX_OK;
        }
    }
    return CFX_ERR_NO_RESOURCE;
}

/*
 * Size @p in's credit window, grant @p mr (NULL: a small get, nothing
 * registered) to the source on @p conn and send it the GET_REQ for chunks
 * [@p first, @p end) (@p end 0: to the last).  A failure finished @p in.
 */
static void get_req_send(struct cfx_context *ctx, struct cfx_xfer_in *in, struct cfx_conn *conn,
                         struct cfx_tp_mr *mr, uint32_t first, uint32_t end, uint32_t flags)
{
    struct cfx_obj *obj = in->obj;
    char hex[CFX_OBJECT_ID_HEX_LEN];
    uint32_t window = ctx->cfg.window_bytes / obj->chunk_size;

    in->window = CFX_MIN(CFX_MAX(window, 2u), 64u);
    struct cfx_dp_get_req req = {
        .hdr = { .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                 .type = CFX_DP_GET_REQ, .slot = in->slot },
        .size = obj->size,
        .chunk_size = obj->chunk_size,
        .first_chunk = first,
        .end_chunk = end,
        .credits = in->window,
        .flags = flags,
        .chan = obj->chan,
        .tag = obj->tag,
    };
    memcpy(req.id, obj->id.bytes, CFX_OBJECT_ID_LEN);
    int rc = mr ? cfx__xfer_grant(ctx, conn, mr, &req.rdesc) : CFX_OK;
    if (rc == CFX_OK)
        rc = cfx__conn_send(conn, &req, sizeof(req));
    if (rc != CFX_OK) {
        cfx__xfer_in_finish(ctx, in, rc);
        return;
    }
    id_hex(&obj->id, hex);
    CFX_LOG(DEBUG, XFER, "node %u: get %s (%" PRIu64 " B) chunks [%u, %u) of %u from %s slot %u",
            ctx->node_id, hex, obj->size, first, end ? end : obj->nchunks, obj->nchunks,
            conn->name, in->slot);
    /* The directory may have sent others to us, the newest partial holder,
     * before this entry existed (wait_for_entry). */
    if (!cfx_list_empty(&ctx->waiting_gets))
        cfx__xfer_serve_waiting(ctx, obj);
}

void cfx__xfer_get_start(struct cfx_context *ctx, struct cfx_obj *obj,
                         const struct cfx_node_rec *src)
{
    struct cfx_xfer_in *in = obj->in;
    int status = CFX_OK;

    if (!in || in->status != CFX_ERR_AGAIN)
        return;
    if (obj->nchunks && obj->ready_chunks == obj->nchunks) {
        /* every chunk landed, the connection failing as the last one was
         * taken in (before the object was marked complete): a request
         * from the end would get no answer, and the getter would wait to
         * its deadline */
        obj->complete = true;
        cfx__xfer_in_finish(ctx, in, CFX_OK);
        return;
    }
    struct cfx_conn *conn = cfx__conn_get(ctx, src, &status);
    if (!conn) {
        cfx__status_set(&in->status, CFX_ERR_AGAIN);
        cfx__xfer_in_finish(ctx, in, status == CFX_ERR_UNSUPPORTED ? status : CFX_ERR_CONNECT);
        return;
    }
    /* a small object comes back in one GET_DATA message, copied out here:
     * nothing to register for it */
    bool small = in->small && obj->size && obj->size <= CFX_DP_GET_SMALL_MAX &&
                 obj->ready_chunks == 0 && obj->memtype == CFX_MEMTYPE_HOST && !obj->p2p;
    struct cfx_tp_mr *mr = NULL;
    if (obj->nchunks && !small && !(mr = cfx__obj_mr(ctx, obj, conn->tp, &status))) {
        cfx__xfer_in_finish(ctx, in, status);
        return;
    }
    if (slot_alloc(ctx, in) != CFX_OK) {
        cfx__xfer_in_finish(ctx, in, CFX_ERR_NO_RESOURCE);
        return;
    }
    in->conn = conn;
    in->src_node = src->node_id;
    in->small = small;
    get_req_send(ctx, in, conn, mr, obj->ready_chunks, 0,
                 (obj->p2p == CFX_P2P_RECV ? CFX_DP_GET_P2P : 0) |
                     (in->cached ? CFX_DP_GET_CACHED : 0) | (small ? CFX_DP_GET_SMALL : 0) |
                     (in->wait ? CFX_DP_GET_WAIT : 0));
}

int cfx__xfer_stripe_mr(struct cfx_context *ctx, struct cfx_xfer_in *in, int tp)
{
    struct cfx_obj *obj = in->obj;
    struct cfx_tp_mem_desc mem = {
        .addr = obj->buf,
        .len = obj->size,
        .memtype = obj->memtype,
        .file_fd = obj->shm_fd,
        .file_off = obj->shm_off,
    };
    int rc = ctx->tp[tp].ops->mem_reg(ctx->tp[tp].iface, &mem,
                                      CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE, &in->mr);
    if (rc != CFX_OK) {
        in->mr = NULL;
        return cfx__err(rc, "node %u: cannot register %" PRIu64 " bytes with %s: %s",
                        ctx->node_id, obj->size, ctx->tp[tp].ops->name, cfx_strerror(rc));
    }
    return CFX_OK;
}

int cfx__xfer_stripe_start(struct cfx_context *ctx, struct cfx_xfer_in *in,
                           const struct cfx_node_rec *src, uint32_t first, uint32_t end)
{
    int status = CFX_OK;

    cfx__status_set(&in->status, CFX_ERR_AGAIN);
    struct cfx_conn *conn = cfx__conn_get(ctx, src, &status);
    if (!conn) {
        cfx__xfer_in_finish(ctx, in, status == CFX_ERR_UNSUPPORTED ? status : CFX_ERR_CONNECT);
        return in->status;
    }
    if (in->mr && in->mr->iface != ctx->tp[conn->tp].iface) {
        /* the connection to this source changed transport: a new
         * registration on the new one */
        cfx__xfer_stripe_mr_drop(ctx, in);
    }
    if (!in->mr && (status = cfx__xfer_stripe_mr(ctx, in, conn->tp)) != CFX_OK) {
        cfx__xfer_in_finish(ctx, in, status);
        return in->status;
    }
    if (slot_alloc(ctx, in) != CFX_OK) {
        cfx__xfer_in_finish(ctx, in, CFX_ERR_NO_RESOURCE);
        return in->status;
    }
    in->conn = conn;
    in->src_node = src->node_id;
    in->end = end;
    in->left = end - first;
    in->owed = 0;
    in->cancel_sent = false;
    get_req_send(ctx, in, conn, in->mr, first, end, 0);
    return in->status; /* CFX_ERR_AGAIN, or how it ended already */
}

void cfx__xfer_stripe_mr_drop(struct cfx_context *ctx, struct cfx_xfer_in *in)
{
    if (!in->mr)
        return;
    for (int t = 0; t < ctx->ntp; t++)
        if (ctx->tp[t].iface == in->mr->iface) {
            ctx->tp[t].ops->mem_dereg(in->mr);
            break;
        }
    in->mr = NULL;
}

void cfx__xfer_get_cancel(struct cfx_context *ctx, struct cfx_obj *obj)
{
    struct cfx_xfer_in *in = obj->in;
    if (!in || in->status != CFX_ERR_AGAIN || !in->conn) {
        if (in && in->status == CFX_ERR_AGAIN)
            cfx__xfer_in_finish(ctx, in, CFX_ERR_CANCELED);
        return;
    }
    if (!in->cancel_sent) {
        send_cancel(in);
    } else {
        /* second cancel: the source never acked; stop waiting for it.  A
         * direct shm write of its may still land in the buffer, so arena
         * memory behind it is never handed out again. */
        if (obj->shm_fd >= 0)
            cfx__arena_taint(ctx, obj->buf);
        cfx__xfer_in_finish(ctx, in, CFX_ERR_CANCELED);
    }
}

/* An abandoned transfer's slot is released: nothing refers to it any more. */
static void in_drop(struct cfx_context *ctx, struct cfx_xfer_in *in)
{
    if (in->conn && in->conn->abandoned)
        in->conn->abandoned--;
    if (ctx->slots[in->slot] == in)
        ctx->slots[in->slot] = NULL;
    free(in);
    pthread_cond_broadcast(&ctx->obj_cond); /* tests wait for it */
}

bool cfx__xfer_get_abandon(struct cfx_context *ctx, struct cfx_xfer_in *in)
{
    struct cfx_obj *obj = in->obj;
    if (in->status != CFX_ERR_AGAIN)
        return false; /* ended meanwhile: the getter takes its status */
    if (!in->conn) {
        /* not posted (the command has not run): nothing is in flight */
        cfx__xfer_in_finish(ctx, in, CFX_ERR_CANCELED);
        obj->in = NULL;
        return false;
    }
    if (!in->cancel_sent)
        send_cancel(in);
    /* From here a write into the window lands nothing: the transport drops
     * it whole (tcp in clear, shm, dpdk: a grant revoked lately, the
     * connection kept) or refuses it (verbs, or past the last 64 grants
     * revoked: the connection fails); one being received now goes nowhere
     * once the registration is dropped with the entry (cfx__obj_release).
     * A direct shm write cannot be stopped: arena memory behind it is
     * never handed out again. */
    struct cfx_tp_mr *mr = in->mr ? in->mr : obj->mr[in->conn->tp];
    if (mr && ctx->tp[in->conn->tp].ops->mr_revoke)
        ctx->tp[in->conn->tp].ops->mr_revoke(mr);
    if (obj->shm_fd >= 0)
        cfx__arena_taint(ctx, obj->buf);
    /* The slot stays taken until the source answers the cancel (or sends
     * what it had sent before it), so that answer finds nothing to write
     * into instead of failing the connection. */
    in->abandoned = true;
    in->conn->abandoned++; /* capped: cfx__conn_get() */
    in->obj = NULL;
    cfx__status_set(&in->status, CFX_ERR_CANCELED);
    obj->in = NULL;
    return true;
}

bool cfx__xfer_in_abandon(struct cfx_context *ctx, struct cfx_xfer_in *in,
                          struct cfx_xfer_in *spare)
{
    struct cfx_obj *obj = in->obj;
    if (in->status != CFX_ERR_AGAIN || !in->conn)
        return cfx__xfer_get_abandon(ctx, in); /* ended, or never posted */
    if (!spare) {
        /* no memory for the engine's copy: cut the transfer off in place,
         * as a second cancel does (grant revoked, slot freed; a late write
         * is refused and fails the connection) */
        if (!in->cancel_sent)
            send_cancel(in);
        if (obj->shm_fd >= 0)
            cfx__arena_taint(ctx, obj->buf);
        cfx__xfer_in_finish(ctx, in, CFX_ERR_CANCELED);
        return false;
    }
    /* the engine's copy takes the slot; the caller's goes with its owner */
    *spare = *in;
    if (ctx->slots[in->slot] == in)
        ctx->slots[in->slot] = spare;
    obj->in = spare;
    bool gone = cfx__xfer_get_abandon(ctx, spare); /* true: running and posted */
    in->conn = NULL;
    in->obj = NULL;
    cfx__status_set(&in->status, CFX_ERR_CANCELED);
    return gone;
}

static void upload_serve(struct cfx_context *ctx, struct cfx_upload *up);

/* Chunks [ready_chunks, ...) that have landed extend the served prefix
 * (with serve_landed, a chunk landed anywhere may be served). */
static void obj_advance(struct cfx_context *ctx, struct cfx_obj *obj);
void cfx__obj_advance(struct cfx_context *ctx, struct cfx_obj *obj)
{
    obj_advance(ctx, obj);
}

static void obj_advance(struct cfx_context *ctx, struct cfx_obj *obj)
{
    uint32_t before = obj->ready_chunks;
    while (obj->ready_chunks < obj->nchunks &&
           (obj->bitmap[obj->ready_chunks / 64] >> (obj->ready_chunks % 64)) & 1)
        obj->ready_chunks++;
    if (obj->ready_chunks == before && !obj->serve_landed)
        return;
    if (obj->watched)
        pthread_cond_broadcast(&ctx->obj_cond);
    /* Serving an upload may fail its connection, freeing other uploads of
     * this object: after that, start over from the head (uploads that have
     * nothing to send return at once). */
    struct cfx_list *pos;
again:
    cfx_list_for_each(pos, &obj->uploads) {
        uint64_t gen = ctx->conn_gen;
        upload_serve(ctx, cfx_list_entry(pos, struct cfx_upload, obj_link));
        if (ctx->conn_gen != gen)
            goto again;
    }
}

/* Whether @p conn is still one of the context's connections. */
static bool conn_live(struct cfx_context *ctx, const struct cfx_conn *conn)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->conns)
        if (cfx_list_entry(pos, struct cfx_conn, link) == conn)
            return true;
    return false;
}

void cfx__xfer_write_imm(struct cfx_context *ctx, struct cfx_conn *conn, uint32_t imm,
                         uint32_t len)
{
    if (unlikely(!conn->authed)) {
        /* writes answer our requests, which go out only once the peer has
         * proved the token: one before that is an impostor's */
        cfx__conn_fail(conn, CFX_ERR_PROTO, "a write before authentication");
        return;
    }
    uint32_t slot = imm >> CFX_IMM_SLOT_SHIFT;
    uint32_t chunk = imm & CFX_IMM_CHUNK_MASK;
    struct cfx_xfer_in *in = ctx->slots[slot];

    if (unlikely(!in || in->conn != conn)) {
        /* Late write for a transfer we withdrew: harmless only before the
         * CANCEL_ACK; anything else is a peer writing where it was not
         * granted. */
        cfx__conn_fail(conn, CFX_ERR_PROTO, "write into a slot it was not granted");
        return;
    }
    if (in->rchild) {
        cfx__rtask_chunk(ctx, in->rchild, chunk, len);
        return;
    }
    if (unlikely(in->abandoned))
        return; /* its registration is gone: the transport wrote nothing */
    struct cfx_obj *obj = in->obj;
    uint64_t off = (uint64_t)chunk * obj->chunk_size;
    uint64_t want = chunk < obj->nchunks ? CFX_MIN((uint64_t)obj->chunk_size, obj->size - off) : 0;
    if (unlikely(chunk >= obj->nchunks || len != want)) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "write of a chunk outside the object");
        return;
    }
    if (in->cancel_sent) {
        /* withdrawn: the bytes are not ours to use any more, but for a p2p
         * receive's, which its send may have matched before it read the
         * CANCEL: one whose every chunk landed by the CANCEL_ACK was taken
         * (p2p_landed_whole), as its sender was told */
        if (obj->p2p == CFX_P2P_RECV)
            obj->bitmap[chunk / 64] |= 1ull << (chunk % 64);
        return;
    }
    if (in->end) {
        /* a striped get's range: each of its chunks comes once, in order
         * (one connection); the range is done at its last write, also
         * where another source landed some of its chunks before */
        if (unlikely(chunk >= in->end || !in->left)) {
            cfx__conn_fail(conn, CFX_ERR_PROTO, "write of a chunk outside the range asked for");
            return;
        }
        in->left--;
        in->owed++;
    }

    uint64_t bit = 1ull << (chunk % 64);
    /* every write took one of the source's credits, a chunk landed before
     * too (a get that fell back to one source after a striped start: the
     * new source sends from ready_chunks on, the holes' neighbours again):
     * each is owed back, or the source runs dry with the get unfinished */
    in->owed += !in->end;
    if (!(obj->bitmap[chunk / 64] & bit)) {
        obj->bitmap[chunk / 64] |= bit;
        ctx->stats.bytes_received += len;
    }
    /* Serving the object's uploads may fail connections, this one among
     * them (an upload to the same peer): then the transfer was failed with
     * it and nothing below may touch conn. */
    uint64_t gen = ctx->conn_gen;
    obj_advance(ctx, obj);
    if (ctx->conn_gen != gen && !conn_live(ctx, conn))
        return;

    if (obj->ready_chunks == obj->nchunks) {
        obj->complete = true;
        cfx__xfer_in_finish(ctx, in, CFX_OK);
        return;
    }
    if (in->end && !in->left) {
        cfx__xfer_in_finish(ctx, in, CFX_OK); /* the range is in: the getter asks for more */
        return;
    }
    if (in->owed >= CFX_MAX(in->window / 2, 1u)) {
        cfx__dp_send_credit(conn, in->slot, in->owed);
        in->owed = 0;
    }
}

/* A small object whole, in place of its one chunk write (CFX_DP_GET_SMALL). */
static void get_data_recv(struct cfx_context *ctx, struct cfx_conn *conn,
                          const struct cfx_dp_get_data *m)
{
    struct cfx_xfer_in *in = ctx->slots[m->hdr.slot];
    if (unlikely(!in || in->conn != conn || !in->small || in->rchild)) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "object bytes for a slot that did not ask for them");
        return;
    }
    if (in->abandoned) {
        in_drop(ctx, in); /* the answer came after the getter left: dropped */
        return;
    }
    if (in->cancel_sent)
        return; /* withdrawn: the bytes are not ours to use any more */
    struct cfx_obj *obj = in->obj;
    if (unlikely(memcmp(m->id, obj->id.bytes, CFX_OBJECT_ID_LEN) != 0 || m->len != obj->size ||
                 obj->nchunks != 1)) {
        /* checked against what we asked for: never another object's bytes */
        cfx__conn_fail(conn, CFX_ERR_PROTO, "GET_DATA for another object or of another size");
        return;
    }
    memcpy(obj->buf, m->data, m->len);
    obj->bitmap[0] |= 1;
    ctx->stats.bytes_received += m->len;
    uint64_t gen = ctx->conn_gen;
    obj_advance(ctx, obj); /* getters reading our partial copy */
    if (ctx->conn_gen != gen && !conn_live(ctx, conn))
        return;
    obj->complete = true;
    cfx__xfer_in_finish(ctx, in, CFX_OK);
}

/* ---- source side ------------------------------------------------------------ */

/* Answer a GET_REQ flagged CFX_DP_GET_SMALL: the whole object in one
 * message (one ep_send, header and bytes), no upload to track. */
static void get_data_send(struct cfx_context *ctx, struct cfx_conn *conn, struct cfx_obj *obj,
                          const struct cfx_dp_get_req *req)
{
    union {
        struct cfx_dp_get_data m;
        uint8_t raw[CFX_TP_SEND_MAX];
    } u;

    if (!obj->complete || obj->memtype != CFX_MEMTYPE_HOST || obj->nchunks != 1 ||
        obj->size > CFX_DP_GET_SMALL_MAX) {
        /* a partial copy has no bytes to send yet (the getter asks elsewhere) */
        send_nack(conn, req->hdr.slot, CFX_ERR_NOT_FOUND);
        return;
    }
    u.m.hdr = (struct cfx_dp_hdr){ .magic = CFX_DP_MAGIC, .version = CFX_DP_VERSION,
                                   .type = CFX_DP_GET_DATA, .slot = req->hdr.slot };
    memcpy(u.m.id, obj->id.bytes, CFX_OBJECT_ID_LEN);
    u.m.len = (uint32_t)obj->size;
    memcpy(u.m.data, obj->buf, obj->size);
    int rc = cfx__conn_send(conn, &u, sizeof(u.m) + obj->size);
    if (rc != CFX_OK) {
        cfx__conn_fail(conn, rc, "send of a small object failed");
        return;
    }
    ctx->stats.uploads++;
    ctx->stats.bytes_sent += obj->size;
}


/* @p up ends: drained (its writes in flight completed), or not (@p cut: its
 * connection failed).  A p2p send whose every write completed is done;
 * where its receiver withdrew meanwhile, the receiver's CANCEL_DONE says
 * whether the message was taken (cfx__p2p_send_await).  One stopped before
 * its last write fails, or goes on to the next receive when none of it had
 * landed (cfx__p2p_send_reoffer). */
static void upload_free(struct cfx_context *ctx, struct cfx_upload *up, bool cut)
{
    struct cfx_obj *obj = up->obj;
    cfx_list_del(&up->obj_link);
    cfx_list_del(&up->conn_link);
    if (up->busy)
        cfx_list_del(&up->busy_link);
    bool written = !cut && up->next == up->end && !up->aborted;
    bool finished = written && !up->canceled;
    bool canceled = up->canceled || up->aborted;
    /* written whole to a receive that withdrew: its answer to our
     * CANCEL_ACK says whether it took it */
    bool await = written && up->canceled;
    bool reoffer = !written && !cut && up->canceled && up->unseen && !up->aborted &&
                   obj->reoffer;
    uint32_t slot = up->slot;
    bool unseen = up->unseen;
    bool limbo = up->canceled || up->cancel_held; /* requests of its key waited (key_in_limbo) */
    free(up);
    if (obj->p2p == CFX_P2P_SEND && obj->p2p_status == CFX_ERR_AGAIN && await)
        cfx__p2p_send_await(ctx, obj, slot, unseen);
    else if (obj->p2p == CFX_P2P_SEND && obj->p2p_status == CFX_ERR_AGAIN && reoffer)
        cfx__p2p_send_reoffer(ctx, obj);
    else if (obj->p2p == CFX_P2P_SEND && obj->p2p_status == CFX_ERR_AGAIN) {
        cfx__status_set(&obj->p2p_status, finished   ? CFX_OK
                                          : canceled ? CFX_ERR_CANCELED
                                                     : CFX_ERR_PEER_FAILED);
        if (limbo)
            cfx__p2p_limbo_over(ctx, obj);
    }
    if (cfx_list_empty(&obj->uploads)) {
        pthread_cond_broadcast(&ctx->obj_cond);
        /* a reduce intermediate is freed by its task, when the driver says
         * the reduce is over: a parent may adopt it after its reader died
         * (objreduce.c) */
        if (obj->releasing)
            cfx__obj_release(ctx, obj);
    }
}

/* Finished or canceled and drained: say so and free. */
static bool upload_maybe_done(struct cfx_context *ctx, struct cfx_upload *up)
{
    if (up->inflight)
        return false;
    if (up->aborted) {
        send_nack(up->conn, up->slot, CFX_ERR_NOT_FOUND);
        upload_free(ctx, up, false);
        return true;
    }
    if (up->canceled) {
        send_hdr(up->conn, CFX_DP_CANCEL_ACK, up->slot);
        upload_free(ctx, up, false);
        return true;
    }
    if (up->next == up->end) {
        if (unlikely(up->cancel_held)) /* test hook: as a CANCEL finding no upload is */
            send_hdr(up->conn, CFX_DP_CANCEL_ACK, up->slot);
        upload_free(ctx, up, false);
        return true;
    }
    return false;
}

/* Stop an upload: no more writes; it ends (and the receiver hears NACK) once
 * its writes in flight have completed — at once if there are none. */
void cfx__xfer_upload_abort(struct cfx_context *ctx, struct cfx_upload *up)
{
    up->aborted = true;
    upload_maybe_done(ctx, up);
}

/* Post @p up's chunks while it has credits and chunks to send: CFX_OK (the
 * rest waits for credits, room or its pace), or a write's failure. */
static int upload_post(struct cfx_context *ctx, struct cfx_upload *up)
{
    struct cfx_obj *obj = up->obj;
    struct cfx_conn *conn = up->conn;
    const struct cfx_transport_ops *ops = ctx->tp[conn->tp].ops;
    struct cfx_tp_mr *mr = obj->mr[conn->tp];

    while (up->credits && up->next < up->end &&
           (obj->complete || up->next < obj->ready_chunks ||
            (obj->serve_landed && (obj->bitmap[up->next / 64] >> (up->next % 64)) & 1))) {
        if (unlikely(ctx->test_stall) && up->next - up->first >= ctx->test_stall)
            return CFX_OK; /* test hook: a holder that stalls mid-transfer */
        uint64_t off = (uint64_t)up->next * obj->chunk_size;
        size_t len = (size_t)CFX_MIN((uint64_t)obj->chunk_size, obj->size - off);
        if (unlikely(ctx->cfg.upload_rate)) {
            /* CFX_UPLOAD_RATE: pace this upload's chunks */
            uint64_t now = cfx__now_ns();
            if (now < up->next_send_ns) {
                up->busy = up->paced = true;
                cfx_list_add_tail(&up->busy_link, &ctx->paced_uploads);
                return CFX_OK;
            }
            up->next_send_ns = CFX_MAX(now, up->next_send_ns) +
                               (uint64_t)len * 1000000000ull / ctx->cfg.upload_rate;
        }
        uint32_t imm = (up->slot << CFX_IMM_SLOT_SHIFT) | up->next;
        uint64_t roff = up->ring ? (uint64_t)(up->next % up->ring) * obj->chunk_size : off;
        int rc = ops->ep_write(conn->ep, mr, off, &up->rdesc, roff, len, imm,
                               (uint64_t)(uintptr_t)up);
        if (rc == CFX_ERR_AGAIN) {
            up->busy = true;
            cfx_list_add_tail(&up->busy_link, &ctx->busy_uploads);
            return CFX_OK;
        }
        if (unlikely(rc != CFX_OK))
            return rc;
        up->next++;
        up->credits--;
        up->inflight++;
        ctx->stats.bytes_sent += len;
        cfx__conn_count(conn, true, len);
    }
    return CFX_OK;
}

static void upload_serve(struct cfx_context *ctx, struct cfx_upload *up)
{
    struct cfx_conn *conn = up->conn;
    const struct cfx_transport_ops *ops = ctx->tp[conn->tp].ops;

    if (up->busy || up->canceled || up->aborted || conn->state != CFX_CONN_READY)
        return;
    /* the chunks that may go now leave together (tcp: one sendmsg of up to
     * 32 frames; one per chunk cost a 1 MiB message 16 system calls) */
    bool batch = cfx__tp_ep_batch(ops, conn->ep, true) == CFX_OK;
    int rc = upload_post(ctx, up);
    if (batch)
        cfx__tp_ep_batch(ops, conn->ep, false);
    if (unlikely(rc != CFX_OK))
        cfx__conn_fail(conn, rc, "write failed");
}

/*
 * Retry uploads that were blocked (send queue full) or waiting for their
 * pace.  Serving one may fail its connection, which frees every upload on
 * it, including ones still to be retried here: so they are moved to a local
 * list first (an upload being freed unlinks itself from whatever list holds
 * it) and taken one at a time from its head.
 */
int cfx__xfer_pump_busy(struct cfx_context *ctx)
{
    struct cfx_list todo, *pos, *tmp;
    int n = 0;

    cfx_list_init(&todo);
    if (!cfx_list_empty(&ctx->paced_uploads)) {
        uint64_t now = cfx__now_ns();
        cfx_list_for_each_safe(pos, tmp, &ctx->paced_uploads) {
            struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, busy_link);
            if (up->next_send_ns > now)
                continue;
            cfx_list_del(&up->busy_link);
            cfx_list_add_tail(&up->busy_link, &todo);
        }
    }
    cfx_list_for_each_safe(pos, tmp, &ctx->busy_uploads) {
        cfx_list_del(pos);
        cfx_list_add_tail(pos, &todo);
    }
    while (!cfx_list_empty(&todo)) {
        struct cfx_upload *up = cfx_list_entry(todo.next, struct cfx_upload, busy_link);
        cfx_list_del(&up->busy_link);
        up->busy = up->paced = false;
        upload_serve(ctx, up);
        n++;
    }
    return n;
}

void cfx__xfer_write_done(struct cfx_context *ctx, struct cfx_upload *up, int status)
{
    up->inflight--;
    if (status != CFX_OK)
        return; /* the endpoint's EP_ERROR follows and cleans up */
    if (!upload_maybe_done(ctx, up))
        upload_serve(ctx, up);
}

static struct cfx_upload *upload_find(struct cfx_conn *conn, uint32_t slot)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &conn->uploads) {
        struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, conn_link);
        if (up->slot == slot)
            return up;
    }
    return NULL;
}

/*
 * GET_WAIT: the object is about to appear here, so a request that finds no
 * entry waits for it instead of failing.  Two senders: a reduce task's
 * child reading the output of a task here that its driver started at the
 * same time (GET_RING; it waits as long as its reader does, who cancels at
 * its deadline), and a getter the directory sent to a partial holder (us)
 * whose own get has its answer but not yet its entry in the store
 * (get.c).  The second waits WAIT_ENTRY_MS at most, then gets NOT_FOUND
 * and fails over as before: the entry follows the directory's answer by
 * microseconds unless our get failed in between.  A peer holds at most
 * one request per transfer slot of its own (CFX_XFER_SLOTS): more is
 * refused with CFX_ERR_NO_RESOURCE.
 */
#define WAIT_ENTRY_MS 1000

static void handle_get_req(struct cfx_context *ctx, struct cfx_conn *conn,
                           const struct cfx_dp_get_req *req);

static void wait_for_entry(struct cfx_context *ctx, struct cfx_conn *conn,
                           const struct cfx_dp_get_req *req, const char *hex)
{
    unsigned queued = 0;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctx->waiting_gets)
        queued += cfx_list_entry(pos, struct cfx_p2p_rtr, link)->conn == conn;
    if (queued >= CFX_XFER_SLOTS) {
        CFX_LOG(WARN, XFER, "node %u: %s has %u requests waiting for objects to appear "
                "here; refusing one more (for %s)", ctx->node_id, conn->name, queued, hex);
        send_nack(conn, req->hdr.slot, CFX_ERR_NO_RESOURCE);
        return;
    }
    struct cfx_p2p_rtr *w = malloc(sizeof(*w));
    if (!w) {
        send_nack(conn, req->hdr.slot, CFX_ERR_NOMEM);
        return;
    }
    w->conn = conn;
    w->req = *req;
    w->deadline = (req->flags & CFX_DP_GET_RING) ? 0 : cfx__deadline_ns(WAIT_ENTRY_MS);
    cfx_list_add_tail(&w->link, &ctx->waiting_gets);
}

void cfx__xfer_serve_waiting(struct cfx_context *ctx, struct cfx_obj *obj)
{
    /* Serving one may fail its connection, which drops every request
     * queued on it: restart from the head after each one served. */
    struct cfx_list *pos;
again:
    cfx_list_for_each(pos, &ctx->waiting_gets) {
        struct cfx_p2p_rtr *w = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
        if (memcmp(w->req.id, obj->id.bytes, CFX_OBJECT_ID_LEN))
            continue;
        cfx_list_del(&w->link);
        handle_get_req(ctx, w->conn, &w->req);
        free(w);
        goto again;
    }
}

int cfx__xfer_waiting_expire(struct cfx_context *ctx)
{
    if (cfx_list_empty(&ctx->waiting_gets))
        return 0;
    uint64_t now = cfx__now_ns();
    struct cfx_list *pos, *tmp;
    int n = 0;
    cfx_list_for_each_safe(pos, tmp, &ctx->waiting_gets) {
        struct cfx_p2p_rtr *w = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
        if (!w->deadline || now < w->deadline)
            continue;
        struct cfx_object_id id;
        char hex[CFX_OBJECT_ID_HEX_LEN];
        memcpy(id.bytes, w->req.id, CFX_OBJECT_ID_LEN);
        id_hex(&id, hex);
        CFX_LOG(INFO, XFER, "node %u: %s asked for %s, which was to appear here and did not "
                "within %d ms", ctx->node_id, w->conn->name, hex, WAIT_ENTRY_MS);
        cfx_list_del(&w->link);
        send_nack(w->conn, w->req.hdr.slot, CFX_ERR_NOT_FOUND);
        free(w);
        n++;
    }
    return n;
}

static void handle_get_req(struct cfx_context *ctx, struct cfx_conn *conn,
                           const struct cfx_dp_get_req *req)
{
    struct cfx_object_id id;
    char hex[CFX_OBJECT_ID_HEX_LEN];

    if (req->flags & CFX_DP_GET_P2P) {
        cfx__p2p_rtr(ctx, conn, req);
        return;
    }
    if (req->credits > CFX_MAX_CHUNKS) {
        /* a later CREDIT adds to it: bounded as those are, so the sum
         * cannot wrap past the check */
        cfx__conn_fail(conn, CFX_ERR_PROTO, "absurd credit grant in a get request");
        return;
    }
    memcpy(id.bytes, req->id, CFX_OBJECT_ID_LEN);
    id_hex(&id, hex);
    struct cfx_obj *obj = cfx__store_find(&ctx->store, &id);
    if (!obj && (req->flags & CFX_DP_GET_WAIT)) {
        wait_for_entry(ctx, conn, req, hex);
        return;
    }
    if (!obj || obj->deleting) {
        CFX_LOG(INFO, XFER, "node %u: %s asked for %s which we do not hold", ctx->node_id,
                conn->name, hex);
        send_nack(conn, req->hdr.slot, CFX_ERR_NOT_FOUND);
        return;
    }
    if ((req->flags & CFX_DP_GET_CACHED) &&
        (!obj->owned || !obj->announced || !obj->complete || obj->size != req->size ||
         obj->chunk_size != req->chunk_size)) {
        /* The getter remembered us as the holder: only the putter's own copy
         * is surely the object the id names now (loccache.c).  It asks the
         * directory next. */
        CFX_LOG(DEBUG, XFER, "node %u: %s asked for %s from its location cache; we hold %s",
                ctx->node_id, conn->name, hex, obj->owned ? "another shape of it" : "a copy");
        send_nack(conn, req->hdr.slot, CFX_ERR_NOT_FOUND);
        return;
    }
    if (obj->size != req->size || obj->chunk_size != req->chunk_size) {
        /* not the object asked for: it went, and the id names another put
         * of it here now; the getter asks the directory (NOT_FOUND) */
        CFX_LOG(INFO, XFER, "node %u: %s asked for %s as %" PRIu64 " B / %u B chunks; we hold %"
                PRIu64 " B / %u B", ctx->node_id, conn->name, hex, req->size, req->chunk_size,
                obj->size, obj->chunk_size);
        send_nack(conn, req->hdr.slot, CFX_ERR_NOT_FOUND);
        return;
    }
    if (req->flags & CFX_DP_GET_SMALL) {
        get_data_send(ctx, conn, obj, req);
        return;
    }
    cfx__xfer_upload_start(ctx, conn, obj, req);
}

void cfx__xfer_upload_start(struct cfx_context *ctx, struct cfx_conn *conn,
                            struct cfx_obj *obj, const struct cfx_dp_get_req *req)
{
    char hex[CFX_OBJECT_ID_HEX_LEN];
    int status = CFX_OK;

    id_hex(&obj->id, hex);
    if (upload_find(conn, req->hdr.slot)) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "GET_REQ for a slot already being served");
        return;
    }
    if (obj->nchunks && !cfx__obj_mr(ctx, obj, conn->tp, &status)) {
        send_nack(conn, req->hdr.slot, status);
        if (obj->p2p == CFX_P2P_SEND) {
            cfx__status_set(&obj->p2p_status, status);
            pthread_cond_broadcast(&ctx->obj_cond);
        }
        return;
    }
    if (obj->nchunks == 0) {
        /* nothing to write: tell the receiver it is complete */
        send_nack(conn, req->hdr.slot, CFX_OK);
        if (obj->p2p == CFX_P2P_SEND) {
            cfx__status_set(&obj->p2p_status, CFX_OK);
            pthread_cond_broadcast(&ctx->obj_cond);
        }
        return;
    }
    struct cfx_upload *up = calloc(1, sizeof(*up));
    if (!up) {
        send_nack(conn, req->hdr.slot, CFX_ERR_NOMEM);
        return;
    }
    up->obj = obj;
    up->conn = conn;
    up->slot = req->hdr.slot;
    up->first = up->next = req->first_chunk;
    up->end = req->end_chunk ? req->end_chunk : obj->nchunks;
    up->credits = req->credits;
    up->rdesc = req->rdesc;
    up->ring = (req->flags & CFX_DP_GET_RING) ? req->ring : 0;
    cfx_list_add_tail(&up->obj_link, &obj->uploads);
    cfx_list_add_tail(&up->conn_link, &conn->uploads);
    ctx->stats.uploads++;
    ctx->stats.uploads_partial += !obj->complete;
    CFX_LOG(DEBUG, XFER, "node %u: serving %s from chunk %u to %s slot %u (%s copy)",
            ctx->node_id, obj->p2p ? "a message" : hex, up->next, conn->name, up->slot,
            obj->complete ? "complete" : "partial");
    if (!upload_maybe_done(ctx, up))
        upload_serve(ctx, up);
}

void cfx__xfer_recv(struct cfx_context *ctx, struct cfx_conn *conn, const void *wire,
                    size_t wire_len)
{
    union cfx_dp_msg u;
    size_t len;
    int type = cfx__dp_msg_decode(wire, wire_len, &u, &len);
    const void *data = &u;
    struct cfx_dp_hdr h;

    if (type < 0) {
        cfx__conn_fail(conn, CFX_ERR_PROTO, "malformed data-plane message");
        return;
    }
    h = u.hdr;
    if (type != CFX_DP_HELLO && conn->node_id == 0) {
        cfx__conn_refuse(conn, CFX_ERR_PROTO, "message before HELLO");
        return;
    }
    if (type != CFX_DP_HELLO && type != CFX_DP_AUTH && !conn->authed) {
        /* Nothing is served to, or taken from, a peer that has not proved
         * it holds the cluster token (conn_auth.c). */
        cfx__conn_refuse(conn, CFX_ERR_AUTH, "message before authentication");
        return;
    }
    switch (type) {
    case CFX_DP_HELLO: {
        const struct cfx_dp_hello *m = data;
        extern void cfx__conn_hello(struct cfx_conn *, uint32_t);
        if (m->node_id == 0 || (conn->node_id && conn->node_id != m->node_id)) {
            cfx__conn_fail(conn, CFX_ERR_PROTO, "bad HELLO");
            return;
        }
        if (!conn->outbound) {
            cfx__conn_hello(conn, m->node_id);
            cfx__conn_auth_hello_in(conn, m);
        }
        break;
    }
    case CFX_DP_AUTH:
        cfx__conn_auth_msg(conn, data);
        break;
    case CFX_DP_GET_REQ:
        ctx->n_served++; /* a peer waits on our answer (the progress thread's spin) */
        handle_get_req(ctx, conn, data);
        break;
    case CFX_DP_GET_NACK: {
        const struct cfx_dp_nack *m = data;
        struct cfx_xfer_in *in = ctx->slots[h.slot];
        if (in && in->conn == conn && in->abandoned) {
            in_drop(ctx, in);
        } else if (in && in->conn == conn) {
            /* a refusal is a final status: CFX_ERR_AGAIN would leave the
             * transfer "running" with no source, to its deadline */
            int st = (m->status < 0 && m->status > CFX_STATUS_LAST && m->status != CFX_ERR_AGAIN)
                         ? m->status
                         : CFX_ERR_PROTO;
            if (m->status == CFX_OK && in->obj->nchunks == 0) {
                in->obj->complete = true; /* an empty message: nothing to write */
                st = CFX_OK;
            }
            cfx__xfer_in_finish(ctx, in, st);
        }
        break;
    }
    case CFX_DP_CREDIT: {
        const struct cfx_dp_credit *m = data;
        struct cfx_upload *up = upload_find(conn, h.slot);
        if (up) {
            if (m->credits > CFX_MAX_CHUNKS || up->credits + m->credits > CFX_MAX_CHUNKS) {
                cfx__conn_fail(conn, CFX_ERR_PROTO, "absurd credit grant");
                return;
            }
            up->credits += m->credits;
            upload_serve(ctx, up);
        }
        break;
    }
    case CFX_DP_CANCEL:
    case CFX_DP_CANCEL_UNSEEN: {
        struct cfx_upload *up = upload_find(conn, h.slot);
        if (up)
            up->unseen = h.type == CFX_DP_CANCEL_UNSEEN;
        if (unlikely(ctx->test_stall) && up) {
            /* test hook: the stalled holder answers only once it resumes,
             * after the writes it had on their way (cfx__xfer_test_resume);
             * one for no upload is answered at once, as ever */
            up->cancel_held = true;
            break;
        }
        if (!up) {
            /* not being served: forget the request if it is still queued
             * (a receive waiting for its send, or a get waiting for a
             * reduce output), so nothing is ever written into the
             * withdrawn slot */
            cfx__xfer_forget_req(ctx, conn, h.slot);
            send_hdr(conn, CFX_DP_CANCEL_ACK, h.slot);
            break;
        }
        up->canceled = true;
        upload_maybe_done(ctx, up);
        break;
    }
    case CFX_DP_REDUCE_TASK:
    case CFX_DP_REDUCE_DONE:
    case CFX_DP_REDUCE_ABORT:
    case CFX_DP_REDUCE_LOST:
    case CFX_DP_REDUCE_ADOPT:
        cfx__rtask_msg(ctx, conn, data, len);
        break;
    case CFX_DP_P2P_EAGER:
        cfx__eager_msg(ctx, conn, data, len);
        break;
    case CFX_DP_EAGER_CREDIT:
        cfx__eager_credit_msg(conn, ((const struct cfx_dp_credit *)data)->credits);
        break;
    case CFX_DP_GET_DATA:
        get_data_recv(ctx, conn, data);
        break;
    case CFX_DP_CANCEL_ACK: {
        /* a p2p receive's source learns what became of its message, which
         * it may have written whole before it read the CANCEL (a send that
         * took a request withdrawn already): taken, or dropped (abandoned
         * after the grace: its writes landed nowhere) */
        struct cfx_xfer_in *in = ctx->slots[h.slot];
        if (in && in->conn == conn && in->abandoned) {
            if (in->verdict)
                send_nack_type(conn, CFX_DP_CANCEL_DONE, in->slot, CFX_ERR_CANCELED);
            in_drop(ctx, in);
        } else if (in && in->conn == conn && in->cancel_sent) {
            bool whole = p2p_landed_whole(in);
            if (in->verdict)
                send_nack_type(conn, CFX_DP_CANCEL_DONE, in->slot,
                               whole ? CFX_OK : CFX_ERR_CANCELED);
            cfx__xfer_in_finish(ctx, in, whole ? CFX_OK : CFX_ERR_CANCELED);
        }
        break;
    }
    case CFX_DP_CANCEL_DONE:
        cfx__p2p_cancel_done(ctx, conn->node_id, h.slot,
                             ((const struct cfx_dp_nack *)data)->status);
        break;
    }
}

void cfx__xfer_test_resume(struct cfx_context *ctx)
{
    cfx__progress_lock(ctx);
    pthread_mutex_lock(&ctx->lock);
    ctx->test_stall = 0;
    struct cfx_list *cpos;
    /* The writes the holder had on their way go out first (as far as the
     * receiver's credits let them), then it takes the CANCELs that came
     * meanwhile: each answered once its writes completed. */
again:
    cfx_list_for_each(cpos, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(cpos, struct cfx_conn, link);
        struct cfx_list *pos;
        cfx_list_for_each(pos, &conn->uploads) {
            uint64_t gen = ctx->conn_gen;
            upload_serve(ctx, cfx_list_entry(pos, struct cfx_upload, conn_link));
            if (ctx->conn_gen != gen)
                goto again; /* a connection failed under us: start over */
        }
    }
cancels:
    cfx_list_for_each(cpos, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(cpos, struct cfx_conn, link);
        struct cfx_list *pos;
        cfx_list_for_each(pos, &conn->uploads) {
            struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, conn_link);
            if (!up->cancel_held)
                continue;
            up->cancel_held = false;
            up->canceled = true;
            upload_maybe_done(ctx, up); /* may free it: the walk starts over */
            goto cancels;
        }
    }
    cfx__progress_wake(ctx);
    pthread_mutex_unlock(&ctx->lock);
    cfx__progress_unlock(ctx);
}

void cfx__xfer_test_stall(struct cfx_context *ctx, uint32_t n)
{
    cfx__progress_lock(ctx);
    pthread_mutex_lock(&ctx->lock);
    ctx->test_stall = n;
    pthread_mutex_unlock(&ctx->lock);
    cfx__progress_unlock(ctx);
}

/* Drop queued requests of @p conn (all of them when @p slot is UINT32_MAX). */
void cfx__xfer_forget_req(struct cfx_context *ctx, struct cfx_conn *conn, uint32_t slot)
{
    struct cfx_list *lists[] = { &ctx->p2p_rtrs, &ctx->waiting_gets };
    struct cfx_list *pos, *tmp;
    for (unsigned l = 0; l < CFX_ARRAY_SIZE(lists); l++) {
        cfx_list_for_each_safe(pos, tmp, lists[l]) {
            struct cfx_p2p_rtr *w = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
            if (w->conn == conn && (slot == UINT32_MAX || w->req.hdr.slot == slot)) {
                cfx_list_del(&w->link);
                conn->p2p_rtrs -= lists[l] == &ctx->p2p_rtrs;
                free(w);
            }
        }
    }
}

/* A connection died: fail transfers from it and drop uploads on it. */
void cfx__xfer_conn_failed(struct cfx_context *ctx, struct cfx_conn *conn)
{
    cfx__rtask_conn_failed(ctx, conn);
    for (unsigned s = 0; s < CFX_XFER_SLOTS; s++) {
        struct cfx_xfer_in *in = ctx->slots[s];
        if (in && in->conn == conn && in->abandoned) {
            in_drop(ctx, in);
        } else if (in && in->conn == conn) {
            cfx__err(CFX_ERR_PEER_FAILED, "source %s failed", conn->name);
            cfx__xfer_in_finish(ctx, in, CFX_ERR_PEER_FAILED);
        }
    }
    /* its requests go first: an upload ending below may hand a request of
     * its key the next send (cfx__p2p_limbo_over), which must not start an
     * upload on this connection */
    cfx__xfer_forget_req(ctx, conn, UINT32_MAX);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &conn->uploads) {
        struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, conn_link);
        up->inflight = 0; /* the endpoint is closed right after: nothing completes */
        upload_free(ctx, up, true);
    }
    cfx__p2p_cancel_done(ctx, conn->node_id, UINT32_MAX, CFX_ERR_PEER_FAILED);
    cfx__eager_conn_failed(ctx, conn);
}

/*
 * Free an object entry.  Uploads still writing from it must drain first (a
 * transport may be reading its memory): they are told to stop and the
 * release finishes when the last write completes.
 */
void cfx__obj_release(struct cfx_context *ctx, struct cfx_obj *obj)
{
    struct cfx_list *pos, *tmp;
    bool busy = false;

    obj->deleting = true;
    obj->releasing = true;
    cfx_list_for_each_safe(pos, tmp, &obj->uploads) {
        struct cfx_upload *up = cfx_list_entry(pos, struct cfx_upload, obj_link);
        if (up->inflight) {
            up->aborted = true; /* stops posting; NACK once drained */
            busy = true;
            continue;
        }
        send_nack(up->conn, up->slot, CFX_ERR_NOT_FOUND);
        cfx_list_del(&up->obj_link);
        cfx_list_del(&up->conn_link);
        if (up->busy)
            cfx_list_del(&up->busy_link);
        free(up);
    }
    if (busy || (obj->in && obj->in->status == CFX_ERR_AGAIN) || obj->refs)
        return; /* finished from upload_free / by the getter / the last reference */

    for (int t = 0; t < ctx->ntp; t++)
        if (obj->mr[t])
            ctx->tp[t].ops->mem_dereg(obj->mr[t]);
    cfx__store_remove(&ctx->store, obj);
    if (obj->arena && !obj->lent)
        cfx__arena_free(ctx, obj->buf);
    else if (obj->heap)
        free(obj->buf);
    free(obj->bitmap);
    free(obj);
    pthread_cond_broadcast(&ctx->obj_cond);
}

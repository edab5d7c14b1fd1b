/*
 * cfx_group_send/recv of a message of more than one eager send and at most
 * cfx__coll_split_max() bytes (16 KiB, 64 KiB between ranks that share
 * memory): eager pieces instead of the rendezvous.
 *
 * A rendezvous message costs the receiver's request, a registration and a
 * grant of its buffer and the sender's write (p2p.c); below 16 KiB that is
 * most of the message's time (2-rank ping-pong of 4 KiB on shm: 21.6 us
 * against 0.9 us for 1 KiB).  So such a message goes as CFX_EAGER_LIMIT
 * pieces, each an eager message copied into the receiver's slots, as the
 * collectives' messages of that size do (coll.c post_split).
 *
 * Both sides cut a message the same way, and a disagreement on its size
 * neither passes as data nor disturbs the messages after it:
 *  - the pieces travel on a channel of their own (g->chan_split), so a
 *    receive of another size class never takes one of them (it waits for
 *    its own message and times out), and order is kept within each class,
 *    which is all the posting order of one (peer, tag) needs;
 *  - piece 0 starts with the message's size (struct split_hdr), and a
 *    receive posts piece 0 alone, then the rest as the sender cut them: into
 *    the caller's buffer when the sizes agree, or read and dropped, the
 *    receive failing with CFX_ERR_INVALID naming both sizes.  So the next
 *    receive of that (peer, tag) always starts at a message's piece 0.
 *    While one receive is between its piece 0 and the rest, another of the
 *    same (peer, tag) waits (g->split_rx), within its own deadline.  A piece
 *    0 that lands as its receive times out is taken, not lost.
 * The rest arrive while piece 0 is waited for and wait in the unexpected
 * queue: one more copy of at most 60 KiB, the price of never taking a piece
 * of the next message.  Piece 0 travels through a buffer of
 * CFX_EAGER_LIMIT bytes on the caller's stack; the rest are sent from and
 * received into the caller's buffer.  A message's pieces are sent under
 * g->split_lock, so that two threads sending on one peer and tag never
 * interleave their pieces, and as one batch (cfx__p2p_isend_batch): they
 * leave together once the receiver's slots take all of them, so a send
 * that ends before (its deadline, an interrupt, a failed post) withdraws
 * the whole message and the receiver never holds part of one.  Every piece
 * request is waited for and freed, even after one failed.
 */
#include "coll.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dataplane/engine/engine.h"

#define SPLIT_MAGIC 0x74696c70u /* "plit" */

struct split_hdr {
    uint32_t magic;
    uint32_t len; /* the whole message's bytes (<= COLL_SPLIT_MAX_SHM) */
};

#define FIRST_DATA (CFX_EAGER_LIMIT - (uint32_t)sizeof(struct split_hdr))
#define PIECES_MAX \
    (1 + (COLL_SPLIT_MAX_SHM - FIRST_DATA + CFX_EAGER_LIMIT - 1) / CFX_EAGER_LIMIT)

bool cfx__group_split_size(const struct cfx_group *g, int peer, size_t bytes)
{
    return bytes > CFX_EAGER_LIMIT && bytes <= cfx__coll_split_max(g, peer);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}


/* The pieces of a message of @p bytes (> CFX_EAGER_LIMIT): piece 0 is the
 * header and the first FIRST_DATA bytes, piece i >= 1 starts at
 * piece_off(i) and is at most CFX_EAGER_LIMIT long. */
static int pieces(size_t bytes)
{
    return 1 + (int)((bytes - FIRST_DATA + CFX_EAGER_LIMIT - 1) / CFX_EAGER_LIMIT);
}

static size_t piece_off(int i)
{
    return FIRST_DATA + (size_t)(i - 1) * CFX_EAGER_LIMIT;
}

static size_t piece_len(size_t bytes, int i)
{
    return CFX_MIN(bytes - piece_off(i), (size_t)CFX_EAGER_LIMIT);
}

/* Wait for and free @p n requests; @p rc is how their posting went.  A
 * send's failure (or a failed post) withdraws the others at once; with
 * @p hold (the pieces of a message being received) each is waited for
 * until @p deadline all the same: withdrawn early, a piece would be left for
 * the next receive.  The first failure, with its text, is returned. */
static int wait_all(struct cfx_p2p_req **req, int n, int rc, uint64_t deadline, bool hold)
{
    uint64_t dl = rc == CFX_OK || hold ? deadline : 0;
    char why[256] = "";
    if (rc != CFX_OK)
        snprintf(why, sizeof(why), "%s", cfx_last_error());
    for (int i = 0; i < n; i++) {
        int r = cfx__p2p_wait_free(req[i], dl);
        if (r != CFX_OK && rc == CFX_OK) {
            rc = r;
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            dl = hold ? dl : 0;
        }
    }
    return rc == CFX_OK ? CFX_OK : cfx__err(rc, "%s", why);
}

/* Once piece 0 left (or was taken), the rest of its message are waited for
 * at least this long, past the call's deadline if need be: they left with
 * it, so they are a moment behind, and withdrawn they would be left for the
 * next receive of (peer, tag). */
#define SPLIT_REST_GRACE_MS 1000

static int split_send(struct cfx_group *g, const void *buf, size_t bytes, int peer, int tag,
                      uint64_t deadline)
{
    uint8_t first[CFX_EAGER_LIMIT];
    struct cfx_p2p_req *req[PIECES_MAX];
    int n = 0, np = pieces(bytes), rc = CFX_OK;

    put_le32(first, SPLIT_MAGIC);
    put_le32(first + 4, (uint32_t)bytes);
    memcpy(first + sizeof(struct split_hdr), buf, FIRST_DATA);
    pthread_mutex_lock(&g->split_lock);
    for (int i = 0; i < np && rc == CFX_OK; i++) {
        const void *p = i ? (const uint8_t *)buf + piece_off(i) : first;
        size_t len = i ? piece_len(bytes, i) : CFX_EAGER_LIMIT;
        if (i == 0) /* all or none of them go (none: the receiver never sees it) */
            rc = cfx__p2p_isend_batch(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p,
                                      len, np, &req[n]);
        else if (i + 1 < np) /* the others ride with the last */
            rc = cfx__p2p_isend_more(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p,
                                     len, &req[n]);
        else
            rc = cfx__p2p_isend(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p, len,
                                CFX_MEMTYPE_HOST, &req[n]);
        if (rc == CFX_OK)
            n++;
    }
    pthread_mutex_unlock(&g->split_lock);
    if (rc != CFX_OK) /* the others withdrawn: an incomplete batch never goes */
        return wait_all(req, n, rc, 0, false);
    /* The pieces go together once the receiver's slots take them all.
     * Until then an interrupt or the deadline withdraws the message whole,
     * and the receiver sees none of it.  Once piece 0 left, the rest went
     * with it or follow as the transport drains: waited for within a grace
     * past the deadline (withdrawn, they would leave the receiver a message
     * without its end, and it would take the next one's pieces for it). */
    int r0 = cfx__p2p_wait_intr(req[0], deadline);
    if ((r0 == CFX_ERR_TIMEOUT || (r0 == CFX_ERR_CANCELED && cfx__intr_fired())) &&
        cfx__p2p_withdraw_unsent(req, n))
        return wait_all(req, n, r0, 0, false); /* frees them */
    return wait_all(req, n, CFX_OK, CFX_MAX(deadline, cfx__deadline_ns(SPLIT_REST_GRACE_MS)),
                    false);
}

/* A receive between its first piece and the posting of the rest: no other
 * receive of the same (peer, tag) may post meanwhile (g->split_rx). */
struct split_rx {
    int peer;
    uint32_t tag;
    struct cfx_list link;
};

static bool rx_busy(struct cfx_group *g, int peer, uint32_t tag)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &g->split_rx) {
        struct split_rx *r = cfx_list_entry(pos, struct split_rx, link);
        if (r->peer == peer && r->tag == tag)
            return true;
    }
    return false;
}

static void rx_done(struct cfx_group *g, struct split_rx *me)
{
    pthread_mutex_lock(&g->split_lock);
    cfx_list_del(&me->link);
    pthread_cond_broadcast(&g->split_cond);
    pthread_mutex_unlock(&g->split_lock);
}

/* Piece 0 of the next message of (peer, tag) into @p first; CFX_OK when it
 * came, also when it landed as its wait timed out (so that no piece 0 is
 * ever lost: the rest of its message would pass for the next one's). */
static int rx_first(struct cfx_group *g, uint8_t *first, int peer, uint32_t tag,
                    uint64_t deadline)
{
    struct cfx_p2p_req *req;
    int rc = cfx__p2p_irecv(g->ctx, &g->nodes[peer], g->chan_split, tag, first,
                            CFX_EAGER_LIMIT, CFX_MEMTYPE_HOST, &req);
    if (rc != CFX_OK)
        return rc;
    rc = cfx__p2p_wait_intr(req, deadline);
    /* timed out, or interrupted (the call's thread's check: then CFX_ERR_
     * CANCELED, the receive withdrawn here with nothing taken) */
    if ((rc == CFX_ERR_TIMEOUT || (rc == CFX_ERR_CANCELED && cfx__intr_fired())) &&
        cfx__p2p_cancel(req) == CFX_OK)
        rc = CFX_OK;
    char why[256];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    cfx__p2p_free(req);
    return rc == CFX_OK ? CFX_OK : cfx__err(rc, "%s", why);
}

/* The rest of a message of @p len bytes (the sender's size) that this
 * receive of another size cannot take: each piece read and dropped, so the
 * next receive of (peer, tag) starts at the next message's piece 0. */
static int rx_drain(struct cfx_group *g, uint8_t *scratch, size_t len, int peer, uint32_t tag,
                    uint64_t deadline)
{
    int rc = CFX_OK;
    for (int i = 1; i < pieces(len); i++) {
        struct cfx_p2p_req *req;
        int r = cfx__p2p_irecv(g->ctx, &g->nodes[peer], g->chan_split, tag, scratch,
                               piece_len(len, i), CFX_MEMTYPE_HOST, &req);
        if (r == CFX_OK)
            r = cfx__p2p_wait_free(req, deadline);
        rc = rc == CFX_OK ? r : rc; /* on with the others: each is one of them */
    }
    return rc;
}

/* A receive posts piece 0 alone and the rest once piece 0 told the sender's
 * size: the pieces a receive takes are always the ones its message was cut
 * into, whatever size the receive was posted with. */
static int split_recv(struct cfx_group *g, void *buf, size_t bytes, int peer, int tag,
                      uint64_t deadline)
{
    uint8_t first[CFX_EAGER_LIMIT];
    struct cfx_p2p_req *req[PIECES_MAX];
    struct split_rx me = { .peer = peer, .tag = (uint32_t)tag };
    int n = 0, rc = CFX_OK;

    pthread_mutex_lock(&g->split_lock);
    while (rx_busy(g, peer, me.tag)) {
        bool in_time = !cfx__intr_fired() &&
                       cfx__cond_wait_intr(&g->split_cond, &g->split_lock, deadline);
        if (in_time)
            continue;
        pthread_mutex_unlock(&g->split_lock);
        if (cfx__intr_fired())
            return CFX_ERR_CANCELED; /* interrupted: the caller says so */
        return cfx__err(CFX_ERR_TIMEOUT,
                        "group %s: receive of %zu bytes from rank %d (node %u), tag %d: "
                        "timed out behind another thread's receive of that rank and tag",
                        g->name, bytes, peer, g->nodes[peer].node_id, tag);
    }
    cfx_list_add_tail(&me.link, &g->split_rx);
    pthread_mutex_unlock(&g->split_lock);

    uint32_t magic, len;
    for (;;) {
        if ((rc = rx_first(g, first, peer, me.tag, deadline)) != CFX_OK) {
            rx_done(g, &me);
            return rc;
        }
        magic = get_le32(first);
        len = get_le32(first + 4);
        if (magic == SPLIT_MAGIC && cfx__group_split_size(g, peer, len))
            break;
        /* a piece of a message whose receive gave up before it came (a
         * peer stalled past the grace): dropped, and the next piece is
         * tried as this message's first */
        CFX_LOG(WARN, COLL, "group %s: rank %d (node %u), tag %d: a message piece without its "
                "header was dropped (left of a receive that gave up)", g->name, peer,
                g->nodes[peer].node_id, tag);
    }
    /* piece 0 is taken: its message's rest is waited for whatever the
     * deadline, within the grace */
    uint64_t grace = cfx__deadline_ns(SPLIT_REST_GRACE_MS);
    uint64_t rest_dl = deadline > grace ? deadline : grace;
    if (len != bytes) {
        rc = rx_drain(g, first, len, peer, me.tag, rest_dl);
        rx_done(g, &me);
        if (rc != CFX_OK)
            return rc;
        return cfx__err(CFX_ERR_INVALID,
                        "group %s: rank %d (node %u), tag %d: the two sides disagree on the "
                        "message size (it is %" PRIu32 " bytes, the receive %zu); the message "
                        "was dropped",
                        g->name, peer, g->nodes[peer].node_id, tag, len, bytes);
    }
    for (int i = 1; i < pieces(bytes) && rc == CFX_OK; i++) {
        rc = cfx__p2p_irecv(g->ctx, &g->nodes[peer], g->chan_split, me.tag,
                            (uint8_t *)buf + piece_off(i), piece_len(bytes, i),
                            CFX_MEMTYPE_HOST, &req[n]);
        if (rc == CFX_OK)
            n++;
    }
    rx_done(g, &me);
    if ((rc = wait_all(req, n, rc, rest_dl, true)) == CFX_OK)
        memcpy(buf, first + sizeof(struct split_hdr), FIRST_DATA);
    return rc;
}

int cfx__group_split_p2p(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer,
                         int tag, uint64_t deadline)
{
    return send ? split_send(g, buf, bytes, peer, tag, deadline)
                : split_recv(g, buf, bytes, peer, tag, deadline);
}

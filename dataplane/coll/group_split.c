/*
 * cfx_group_send/recv of a message of more than one eager send and at most
 * COLL_SPLIT_MAX bytes: eager pieces instead of the rendezvous.
 *
 * A rendezvous message costs the receiver's request, a registration and a
 * grant of its buffer and the sender's write (p2p.c); below 16 KiB that is
 * most of the message's time (2-rank ping-pong of 4 KiB on shm: 21.6 us
 * against 0.9 us for 1 KiB).  So such a message goes as CFX_EAGER_LIMIT
 * pieces, each an eager message copied into the receiver's slots, as the
 * collectives' messages of that size do (coll.c post_split).
 *
 * Both sides cut a message the same way (its size must agree, group.h), and
 * two rules keep a disagreement from passing as data:
 *  - the pieces travel on a channel of their own (g->chan_split), so a
 *    receive of another size class never takes one of them (it waits for
 *    its own message and times out), and order is kept within each class,
 *    which is all the posting order of one (peer, tag) needs: the i-th
 *    send and the i-th receive have the same size;
 *  - the first piece starts with the message's size (struct split_hdr),
 *    so a receive of another size in the class fails with CFX_ERR_INVALID
 *    naming both sizes.  The first piece travels through a buffer of
 *    CFX_EAGER_LIMIT bytes on the caller's stack; the rest are sent from
 *    and received into the caller's buffer.
 * The pieces of one message are posted under g->split_lock, so that two
 * threads sending (or receiving) on one peer and tag never interleave
 * their pieces.  Every piece request is waited for and freed, even after
 * one failed (the others end at once or at the deadline).
 */
#include "coll.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dataplane/engine/engine.h"

#define SPLIT_MAGIC 0x74696c70u /* "plit" */

struct split_hdr {
    uint32_t magic;
    uint32_t len; /* the whole message's bytes (<= COLL_SPLIT_MAX) */
};

#define FIRST_DATA (CFX_EAGER_LIMIT - (uint32_t)sizeof(struct split_hdr))
#define PIECES_MAX (1 + (COLL_SPLIT_MAX - FIRST_DATA + CFX_EAGER_LIMIT - 1) / CFX_EAGER_LIMIT)

bool cfx__group_split_size(size_t bytes)
{
    return bytes > CFX_EAGER_LIMIT && bytes <= COLL_SPLIT_MAX;
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

int cfx__group_split_p2p(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer,
                         int tag, uint64_t deadline)
{
    uint8_t first[CFX_EAGER_LIMIT];
    struct cfx_p2p_req *req[PIECES_MAX];
    int n = 0, rc = CFX_OK;

    if (send) {
        put_le32(first, SPLIT_MAGIC);
        put_le32(first + 4, (uint32_t)bytes);
        memcpy(first + sizeof(struct split_hdr), buf, FIRST_DATA);
    }
    pthread_mutex_lock(&g->split_lock);
    for (size_t off = 0; off < bytes && rc == CFX_OK;) {
        void *p = off ? (uint8_t *)buf + off : first;
        size_t len = off ? CFX_MIN(bytes - off, (size_t)CFX_EAGER_LIMIT) : CFX_EAGER_LIMIT;
        bool last = (off ? off + len : FIRST_DATA) >= bytes; /* the others ride with it */
        if (send && !last)
            rc = cfx__p2p_isend_more(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p,
                                     len, &req[n]);
        else if (send)
            rc = cfx__p2p_isend(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p, len,
                                CFX_MEMTYPE_HOST, &req[n]);
        else
            rc = cfx__p2p_irecv(g->ctx, &g->nodes[peer], g->chan_split, (uint32_t)tag, p, len,
                                CFX_MEMTYPE_HOST, &req[n]);
        if (rc == CFX_OK)
            n++;
        off += off ? len : FIRST_DATA;
    }
    pthread_mutex_unlock(&g->split_lock);
    /* a failed post leaves the pieces before it: they are withdrawn below
     * at once (the deadline of a call that failed is now) */
    uint64_t dl = rc == CFX_OK ? deadline : 0;
    char why[256] = "";
    if (rc != CFX_OK)
        snprintf(why, sizeof(why), "%s", cfx_last_error());
    for (int i = 0; i < n; i++) {
        int r = cfx__p2p_wait_free(req[i], dl);
        if (r != CFX_OK && rc == CFX_OK) {
            rc = r;
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            dl = 0;
        }
    }
    if (rc != CFX_OK)
        return cfx__err(rc, "%s", why);
    if (send)
        return CFX_OK;
    uint32_t magic = get_le32(first), len = get_le32(first + 4);
    if (magic != SPLIT_MAGIC || len != bytes)
        return cfx__err(CFX_ERR_INVALID,
                        "the two sides disagree on the message size (it is %" PRIu32
                        " bytes, the receive %zu)",
                        magic == SPLIT_MAGIC ? len : 0, bytes);
    memcpy(buf, first + sizeof(struct split_hdr), FIRST_DATA);
    return CFX_OK;
}

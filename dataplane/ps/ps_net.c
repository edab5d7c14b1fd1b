/*
 * Parameter-server messages over point-to-point: peers, mailboxes, sends,
 * and the objects the job publishes (members, shard maps).
 *
 * A mailbox is a ring of PS_HDR_AHEAD header receives posted to one peer.
 * Entries complete in posting order (the sender's headers match them in
 * order), so the ring's head is the peer's oldest undelivered message.  When
 * a header lands, the payload receive of its exact length is posted (in
 * header order, which keeps the payload tag matched in order too); when the
 * head's payload has landed the message is delivered and a new header
 * receive takes its place.
 */
#include "ps_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/engine/engine.h"

void cfx__ps_obj_id(const char *job, const char *what, long a, long b, struct cfx_object_id *id)
{
    char name[PS_JOB_MAX + 96];
    snprintf(name, sizeof(name), "ps/%s/%s/%ld/%ld", job, what, a, b);
    cfx_object_id_from_name(name, id);
}

uint64_t cfx__ps_chan(const char *job, uint32_t id)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *p = job; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    h = (h ^ id) * 0x100000001b3ull;
    return h | (1ull << 63);
}

void cfx__ps_kick(struct cfx_ps *ps)
{
    /* the loop sleeps on the engine's progress condition */
    pthread_mutex_lock(&ps->ctx->lock);
    pthread_cond_broadcast(&ps->ctx->obj_cond);
    pthread_mutex_unlock(&ps->ctx->lock);
}

static const char *role_name(uint32_t id)
{
    return (id >> 16) == CFX_PS_SERVER ? "server" : "worker";
}

struct ps_peer *cfx__ps_peer(struct cfx_ps *ps, uint32_t id, uint32_t node_id)
{
    uint32_t role = id >> 16, idx = id & 0xffff;
    struct ps_peer **slot;
    if (role == CFX_PS_SERVER && idx < PS_MAX_SERVERS)
        slot = &ps->servers[idx];
    else if (role == CFX_PS_WORKER && idx < PS_MAX_WORKERS)
        slot = &ps->workers[idx];
    else
        return NULL;
    if (*slot && (*slot)->rec.node_id == node_id)
        return *slot;
    if (*slot) {
        /* the slot changed hands (a server index reused): start over */
        cfx__ps_peer_down(ps, *slot);
        free(*slot);
        *slot = NULL;
    }
    struct ps_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->id = id;
    int rc = cfx__ctl_node_get(ps->ctx->ctl, node_id, &p->rec, cfx__deadline_ns(ps->timeout_ms));
    if (rc != CFX_OK) {
        CFX_LOG(WARN, PS, "job %s: no record of %s %u (node %u): %s", ps->job, role_name(id), idx,
                node_id, cfx_strerror(rc));
        free(p);
        return NULL;
    }
    *slot = p;
    return p;
}

static int post_hdr(struct cfx_ps *ps, struct ps_peer *p, struct ps_rx *rx)
{
    memset(rx, 0, sizeof(*rx));
    return cfx__p2p_irecv(ps->ctx, &p->rec, cfx__ps_chan(ps->job, ps->self_id), PS_TAG_HDR,
                          &rx->hdr, sizeof(rx->hdr), CFX_MEMTYPE_HOST, &rx->hreq);
}

int cfx__ps_peer_up(struct cfx_ps *ps, struct ps_peer *p)
{
    if (p->up || p->closed)
        return CFX_OK;
    for (unsigned i = 0; i < PS_HDR_AHEAD; i++) {
        int rc = post_hdr(ps, p, &p->rx[i]);
        if (rc != CFX_OK)
            return rc;
    }
    p->rx_head = 0;
    p->up = true;
    return CFX_OK;
}

void cfx__ps_peer_down(struct cfx_ps *ps, struct ps_peer *p)
{
    (void)ps;
    for (unsigned i = 0; i < PS_HDR_AHEAD; i++) {
        struct ps_rx *rx = &p->rx[i];
        cfx__p2p_free(rx->dreq);
        cfx__p2p_free(rx->hreq);
        if (rx->owned)
            free(rx->payload);
        memset(rx, 0, sizeof(*rx));
    }
    p->up = false;
    p->closed = true;
}

int cfx__ps_send(struct cfx_ps *ps, struct ps_peer *to, struct ps_hdr *hdr, const void *payload,
                 size_t len, void *owned)
{
    int rc = CFX_ERR_NOMEM;
    struct ps_tx *tx = calloc(1, sizeof(*tx));
    if (!tx)
        goto err_free;
    hdr->magic = PS_MAGIC;
    hdr->from = ps->self_id;
    hdr->map_version = ps->map.version;
    hdr->len = len;
    tx->hdr = *hdr;
    tx->owned = owned;
    tx->borrowed = owned || !len ? NULL : payload;
    tx->peer = to->id;
    uint64_t chan = cfx__ps_chan(ps->job, to->id);
    rc = cfx__p2p_isend(ps->ctx, &to->rec, chan, PS_TAG_HDR, &tx->hdr, sizeof(tx->hdr),
                        CFX_MEMTYPE_HOST, &tx->hreq);
    if (rc != CFX_OK)
        goto err_tx;
    if (len) {
        rc = cfx__p2p_isend(ps->ctx, &to->rec, chan, PS_TAG_DATA, payload, len, CFX_MEMTYPE_HOST,
                            &tx->dreq);
        if (rc != CFX_OK)
            goto err_tx; /* the receiver will wait for a payload that never comes:
                            the peer's deadline reports it */
    }
    cfx_list_add_tail(&tx->link, &ps->tx);
    return CFX_OK;
err_tx:
    cfx__p2p_free(tx->hreq);
    free(tx);
err_free:
    free(owned);
    CFX_LOG(WARN, PS, "job %s: cannot send to %s %u (node %u): %s", ps->job, role_name(to->id),
            to->id & 0xffff, to->rec.node_id, cfx_strerror(rc));
    return rc;
}

/*
 * Reap sends that finished.  One progress pass for all of them, then their
 * states under one lock: cfx__p2p_test() makes a pass for every request
 * still running, and with a step's thousands of small blocks in flight
 * each sweep made thousands of passes (a step took time in the square of
 * its blocks: 2 MiB in blocks of 1 KiB, 3 s).  Sends finish about in the
 * order they were posted (a connection's eager queue is a FIFO, a peer
 * takes its messages in order), so a sweep stops after PS_TX_AHEAD that
 * have not; every PS_TX_FULL_EVERY-th looks at all (one stuck behind a
 * slow peer holds the others' memory only that long).
 */
#define PS_TX_AHEAD      64
#define PS_TX_FULL_EVERY 64

static int poll_tx(struct cfx_ps *ps)
{
    int n = 0;
    struct cfx_list *pos, *tmp, done;
    if (cfx_list_empty(&ps->tx))
        return 0;
    cfx__progress_test_pass(ps->ctx);
    cfx_list_init(&done);
    bool full = ++ps->tx_sweeps % PS_TX_FULL_EVERY == 0;
    unsigned running = 0;
    pthread_mutex_lock(&ps->ctx->lock);
    cfx_list_for_each_safe(pos, tmp, &ps->tx)
    {
        struct ps_tx *tx = cfx_list_entry(pos, struct ps_tx, link);
        tx->hs = cfx__p2p_status_locked(tx->hreq);
        tx->ds = tx->dreq ? cfx__p2p_status_locked(tx->dreq) : CFX_OK;
        if (tx->hs == CFX_ERR_AGAIN || tx->ds == CFX_ERR_AGAIN) {
            if (++running == PS_TX_AHEAD && !full)
                break;
            continue;
        }
        cfx_list_del(&tx->link);
        cfx_list_add_tail(&tx->link, &done);
    }
    pthread_mutex_unlock(&ps->ctx->lock);
    cfx_list_for_each_safe(pos, tmp, &done)
    {
        struct ps_tx *tx = cfx_list_entry(pos, struct ps_tx, link);
        if (tx->hs != CFX_OK || tx->ds != CFX_OK)
            CFX_LOG(WARN, PS, "job %s: message %u to %s %u failed: %s", ps->job, tx->hdr.type,
                    role_name(tx->peer), tx->peer & 0xffff,
                    cfx_strerror(tx->hs != CFX_OK ? tx->hs : tx->ds));
        cfx_list_del(&tx->link);
        cfx__p2p_free(tx->hreq);
        cfx__p2p_free(tx->dreq);
        free(tx->owned);
        free(tx);
        n++;
    }
    return n;
}

/*
 * A push that failed hands its gradient back to the caller, who may change
 * it at once (with device buffers, its host copy is freed): its payloads
 * still waiting to go (for credits, behind a server that stalls, or for
 * the server to ask) take a copy of their bytes now, so a server that
 * takes them later applies the step that was pushed, never other bytes.
 * One the transport is writing from is waited for; if it is still writing
 * at the deadline it is withdrawn, and the server then sees this worker's
 * mailbox fail.
 */
#define PS_UNBORROW_MS 2000

void cfx__ps_net_unborrow(struct cfx_ps *ps, const void *base, size_t len)
{
    const uint8_t *lo = base, *hi = lo + len;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ps->tx)
    {
        struct ps_tx *tx = cfx_list_entry(pos, struct ps_tx, link);
        const uint8_t *pay = tx->borrowed;
        if (!pay || pay < lo || pay >= hi)
            continue;
        tx->borrowed = NULL;
        if (!tx->dreq || cfx__p2p_send_detach(tx->dreq) == CFX_OK)
            continue;
        int rc = cfx__p2p_wait(tx->dreq, cfx__deadline_ns(CFX_MIN(ps->timeout_ms,
                                                                  PS_UNBORROW_MS)));
        if (rc != CFX_ERR_TIMEOUT)
            continue;
        CFX_LOG(WARN, PS, "job %s: a failed push's payload to %s %u still being written after "
                "%d ms: withdrawn", ps->job, role_name(tx->peer), tx->peer & 0xffff,
                CFX_MIN(ps->timeout_ms, PS_UNBORROW_MS));
        cfx__p2p_free(tx->dreq);
        tx->dreq = NULL;
    }
}

/*
 * Test hook (CFX_PS_TEST_HOLD_END): the scheduler's notice that ends this
 * server's service stays undelivered at the head of the mailbox until a
 * later header from the scheduler has completed (a message, or the
 * mailbox's failure).  It forces the order in which the scheduler is done
 * with everything else, or gone, before this server handles its end.
 */
static bool hold_end_notice(struct cfx_ps *ps, struct ps_peer *p, const struct ps_rx *head)
{
    if (!ps->hold_end || p->id != PS_ID(CFX_PS_SERVER, 0) || head->hdr.type != PS_MSG_MAP ||
        !(head->hdr.clock & PS_NOTICE_END))
        return false;
    for (unsigned k = 1; k < PS_HDR_AHEAD; k++) {
        const struct ps_rx *rx = &p->rx[(p->rx_head + k) % PS_HDR_AHEAD];
        int st = rx->hreq ? cfx__p2p_test(rx->hreq) : CFX_ERR_AGAIN;
        if (st != CFX_ERR_AGAIN) {
            CFX_LOG(WARN, PS, "job %s: server %d: test hook: end notice (map %u) released: %s",
                    ps->job, ps->index, head->hdr.map_version,
                    st == CFX_OK ? "the scheduler sent more" : "the scheduler's mailbox failed");
            return false;
        }
    }
    return true;
}

/* The largest payload a member sends: a block's state (its values, two
 * optimizer moments, the BSP accumulator and a clock per worker) with
 * room to spare.  A header that announces more is the peer's error, not a
 * size to allocate. */
static uint64_t payload_max(const struct cfx_ps *ps)
{
    uint64_t bs = ps->map.conf.block_size ? ps->map.conf.block_size : PS_BLOCK_DEFAULT;
    return 4 * bs + PS_MAX_WORKERS * sizeof(uint64_t) + 4096;
}

static int poll_peer(struct cfx_ps *ps, struct ps_peer *p)
{
    int n = 0;
    if (!p || !p->up)
        return 0;
    /* post payload receives for headers that landed, in order; a failed
     * one is reported when it reaches the head, after the messages that
     * came before it (the last thing a leaving peer said still counts) */
    for (unsigned k = 0; k < PS_HDR_AHEAD; k++) {
        struct ps_rx *rx = &p->rx[(p->rx_head + k) % PS_HDR_AHEAD];
        if (rx->dreq || rx->payload)
            continue;
        int st = cfx__p2p_test(rx->hreq);
        if (st != CFX_OK || rx->hdr.magic != PS_MAGIC)
            break;
        if (!rx->hdr.len)
            continue;
        if (rx->hdr.len > payload_max(ps)) {
            CFX_LOG(WARN, PS, "job %s: %s node %u announced a payload of %" PRIu64 " B, more "
                    "than any message of the job (%" PRIu64 " B)", ps->job,
                    (p->id >> 16) == CFX_PS_WORKER ? "worker" : "server", p->rec.node_id,
                    rx->hdr.len, payload_max(ps));
            cfx__ps_peer_failed(ps, p, CFX_ERR_PROTO);
            return n + 1;
        }
        void *buf = NULL;
        if (rx->hdr.type == PS_MSG_REPLY)
            buf = cfx__ps_worker_reply_buf(ps, &rx->hdr);
        rx->owned = !buf;
        if (!buf && !(buf = malloc(rx->hdr.len))) {
            cfx__ps_peer_failed(ps, p, CFX_ERR_NOMEM);
            return n + 1;
        }
        rx->payload = buf;
        int rc = cfx__p2p_irecv(ps->ctx, &p->rec, cfx__ps_chan(ps->job, ps->self_id), PS_TAG_DATA,
                                buf, rx->hdr.len, CFX_MEMTYPE_HOST, &rx->dreq);
        if (rc != CFX_OK) {
            cfx__ps_peer_failed(ps, p, rc);
            return n + 1;
        }
    }
    /* deliver from the head */
    for (;;) {
        struct ps_rx *rx = &p->rx[p->rx_head];
        int st = cfx__p2p_test(rx->hreq);
        if (st == CFX_ERR_AGAIN)
            break;
        if (st != CFX_OK || rx->hdr.magic != PS_MAGIC) {
            cfx__ps_peer_failed(ps, p, st != CFX_OK ? st : CFX_ERR_PROTO);
            return n + 1;
        }
        if (hold_end_notice(ps, p, rx))
            break;
        if (rx->hdr.len) {
            if (!rx->dreq)
                break;
            st = cfx__p2p_test(rx->dreq);
            if (st == CFX_ERR_AGAIN)
                break;
            if (st != CFX_OK) {
                cfx__ps_peer_failed(ps, p, st);
                return n + 1;
            }
        }
        struct ps_hdr h = rx->hdr;
        void *payload = rx->payload;
        bool owned = rx->owned;
        cfx__p2p_free(rx->dreq);
        cfx__p2p_free(rx->hreq);
        rx->dreq = rx->hreq = NULL;
        rx->payload = NULL;
        rx->owned = false;
        int rc = post_hdr(ps, p, rx);
        p->rx_head = (p->rx_head + 1) % PS_HDR_AHEAD;
        n++;
        cfx__ps_deliver(ps, p, &h, payload, owned);
        if (rc != CFX_OK) {
            cfx__ps_peer_failed(ps, p, rc);
            break;
        }
        if (!p->up)
            break; /* the handler closed it */
    }
    return n;
}

int cfx__ps_net_poll(struct cfx_ps *ps)
{
    int n = poll_tx(ps);
    for (uint32_t i = 0; i < PS_MAX_WORKERS; i++)
        if (ps->workers[i])
            n += poll_peer(ps, ps->workers[i]);
    for (uint32_t i = 0; i < PS_MAX_SERVERS; i++)
        if (ps->servers[i])
            n += poll_peer(ps, ps->servers[i]);
    return n;
}

void cfx__ps_net_close(struct cfx_ps *ps)
{
    /* let sends in flight finish (bounded), then withdraw everything */
    uint64_t dl = cfx__deadline_ns(CFX_MIN(ps->timeout_ms, 2000));
    while (!cfx_list_empty(&ps->tx) && cfx__now_ns() < dl) {
        if (!poll_tx(ps)) {
            struct timespec ts = { 0, 200000 };
            nanosleep(&ts, NULL);
        }
    }
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ps->tx)
    {
        struct ps_tx *tx = cfx_list_entry(pos, struct ps_tx, link);
        cfx_list_del(&tx->link);
        cfx__p2p_free(tx->hreq);
        cfx__p2p_free(tx->dreq);
        free(tx->owned);
        free(tx);
    }
    for (uint32_t i = 0; i < PS_MAX_WORKERS; i++)
        if (ps->workers[i]) {
            cfx__ps_peer_down(ps, ps->workers[i]);
            free(ps->workers[i]);
            ps->workers[i] = NULL;
        }
    for (uint32_t i = 0; i < PS_MAX_SERVERS; i++)
        if (ps->servers[i]) {
            cfx__ps_peer_down(ps, ps->servers[i]);
            free(ps->servers[i]);
            ps->servers[i] = NULL;
        }
}

/* ---- maps in the object directory ------------------------------------------------ */

int cfx__ps_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf, size_t cap,
                size_t *size, int timeout_ms)
{
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = timeout_ms };
    int rc = cfx_get(ctx, id, buf, cap, size, &op);
    if (rc != CFX_OK)
        return rc;
    /* a small object got here stays served from @p buf (object.h): drop that
     * copy before the caller reuses the buffer, unless this node put it */
    pthread_mutex_lock(&ctx->lock);
    struct cfx_obj *obj = cfx__store_find(&ctx->store, id);
    bool ours = obj && obj->buf == buf;
    pthread_mutex_unlock(&ctx->lock);
    if (ours) {
        struct cfx_obj_params dop = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 1000 };
        cfx_delete(ctx, id, &dop);
    }
    return CFX_OK;
}

/* The directory's words when an id's object went before a get began (the
 * get's timeout says so: include/conflux/object.h, cfx_get). */
#define PS_WENT "(the id was put by node "

const char *cfx__ps_went_clause(const char *err)
{
    const char *w = err ? strstr(err, PS_WENT) : NULL;
    return w ? w : "";
}

uint32_t cfx__ps_went_dead(struct cfx_context *ctx, const char *err)
{
    const char *w = cfx__ps_went_clause(err);
    unsigned node = 0;
    if (!*w || sscanf(w + strlen(PS_WENT), "%u", &node) != 1 || !node)
        return 0;
    /* only a death this context heard of: a record that went long ago (a
     * job of the same name that ended so) says nothing of this one */
    pthread_mutex_lock(&ctx->lock);
    int gone = cfx__node_gone(ctx, node);
    pthread_mutex_unlock(&ctx->lock);
    return gone == CFX_NODE_DEAD ? node : 0;
}

int cfx__ps_announce_slice(struct cfx_context *ctx, const struct cfx_object_id *id, void *buf,
                           size_t cap, size_t *size, uint64_t deadline, char *why, uint32_t *dead)
{
    *dead = 0;
    int rc = cfx__ps_get(ctx, id, buf, cap, size,
                         CFX_MAX(CFX_MIN(cfx__ms_left(deadline), PS_JOIN_SLICE_MS), 1));
    if (rc != CFX_ERR_TIMEOUT)
        return rc;
    if (*cfx__ps_went_clause(cfx_last_error())) /* a later slice's may not say it */
        snprintf(why, CFX__ERR_TEXT_MAX, "%s", cfx_last_error());
    *dead = cfx__ps_went_dead(ctx, why);
    return *dead ? CFX_ERR_PEER_FAILED : CFX_ERR_TIMEOUT;
}

int cfx__ps_map_get(struct cfx_context *ctx, const char *job, uint32_t version, int timeout_ms,
                    struct ps_map *m)
{
    struct cfx_object_id id;
    cfx__ps_obj_id(job, "map", version, 0, &id);
    void *buf = malloc(PS_MAP_MAX);
    if (!buf)
        return CFX_ERR_NOMEM;
    size_t size = 0;
    int rc = cfx__ps_get(ctx, &id, buf, PS_MAP_MAX, &size, timeout_ms);
    if (rc == CFX_OK) {
        rc = cfx__ps_map_decode(buf, size, m);
        if (rc == CFX_OK && m->version != version)
            rc = cfx__err(CFX_ERR_PROTO, "it says it is version %u", m->version);
        if (rc != CFX_OK) {
            char why[CFX__ERR_TEXT_MAX];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            cfx__err(rc, "job %s: shard map %u is malformed: %s", job, version, why);
        }
    }
    free(buf);
    return rc;
}

int cfx__ps_probe(struct cfx_context *ctx, const struct cfx_object_id *ids, size_t n,
                  uint64_t deadline, bool *present)
{
    struct cfx_ctl_obj_rec *recs = NULL;
    size_t nrec = 0;
    int rc = cfx__ctl_objects(ctx->ctl, &recs, &nrec, deadline);
    if (rc != CFX_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        present[i] = false;
        for (size_t j = 0; j < nrec && !present[i]; j++)
            present[i] = !memcmp(&recs[j].id, &ids[i], sizeof(ids[i])) && recs[j].nholders;
    }
    free(recs);
    return CFX_OK;
}

int cfx__ps_map_latest(struct cfx_context *ctx, const char *job, int timeout_ms, struct ps_map *m)
{
    /* version 1 may still be coming: wait for it; then probe the directory
     * for the highest version without waiting on any lookup */
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    int rc = cfx__ps_map_get(ctx, job, 1, timeout_ms, m);
    if (rc != CFX_OK)
        return rc == CFX_ERR_TIMEOUT
                   ? cfx__err(rc,
                              "job %s: no shard map published within %d ms (is server 0 "
                              "running?)",
                              job, timeout_ms)
                   : rc;
    enum { PROBE = 64 };
    uint32_t base = 2, last = 1;
    for (;;) {
        struct cfx_object_id ids[PROBE];
        bool present[PROBE];
        for (uint32_t i = 0; i < PROBE; i++)
            cfx__ps_obj_id(job, "map", (long)(base + i), 0, &ids[i]);
        if ((rc = cfx__ps_probe(ctx, ids, PROBE, deadline, present)) != CFX_OK)
            return rc;
        uint32_t i = 0;
        while (i < PROBE && present[i])
            last = base + i++;
        if (i < PROBE)
            break;
        base += PROBE;
    }
    return last == 1 ? CFX_OK : cfx__ps_map_get(ctx, job, last, timeout_ms, m);
}

/*
 * The dpdk transport's reliability layer (dataplane/dpdk/dpdk_rel.c) over a
 * simulated channel: a discrete-event loop in simulated time, seeded PRNGs,
 * so every run is the same.  Every packet goes through the header encoder
 * and decoder; every delivered byte is checked against the reference
 * pattern.  Nothing here measures speed: the fairness test counts packets
 * in simulated time.  The header's wire format, what a session refuses and
 * the scripted traces are in test_dpdk_wire.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/dpdk/dpdk_rel.h"
#include "testutil.h"

#define MAXPKT (CFX_DPDK_HDR_MAX + 2048)

/* --- the simulated network ----------------------------------------------- */

struct impair {
    uint32_t drop_ppm;    /* random loss, per million packets */
    uint32_t burst_ppm;   /* chance a packet starts a loss burst */
    uint64_t burst_ns;    /* a burst loses every packet sent for this long */
    uint32_t dup_ppm;     /* packets delivered twice */
    uint32_t reorder_ppm; /* packets held back by up to reorder_ns */
    uint64_t reorder_ns;
    bool drop_all; /* a dead peer */
    bool drop_tail_once; /* the first send of the last packet of all */
    uint32_t stall_ppm;  /* chance a packet finds its receiver stalled ... */
    uint64_t stall_ns;   /* ... for this long: it and what follows wait, in order */
};

struct pkt {
    uint64_t at;     /* arrival time */
    uint64_t waited; /* ... after its receiver's host was away this long (a stall) */
    uint64_t serial; /* ties in time go in send order */
    int dst;         /* endpoint index */
    struct pkt *next; /* on the spare list */
    uint32_t len;
    uint8_t data[MAXPKT];
};

struct sim;

struct ep {
    struct cfx__dpdk_sess s;
    struct sim *sim;
    int idx;         /* in sim->ep */
    int peer;        /* where its packets go */
    bool bottleneck; /* its packets cross the shared queue */
    /* sender */
    uint32_t to_send; /* messages to send in all */
    uint32_t queued;  /* queued so far */
    uint32_t acked;   /* sent() calls */
    uint32_t max_len; /* message sizes up to this */
    uint64_t seed;    /* reference stream of its messages */
    void *bufs[1024]; /* buffers of messages acked..queued-1 (sendq_max <= 1024) */
    /* receiver */
    uint32_t got;        /* messages delivered */
    uint32_t got_late;   /* delivered after the fairness warm-up */
    uint64_t hold_until; /* refuse deliveries before this time */
    uint32_t refused;    /* deliveries refused */
    uint64_t peer_seed;  /* reference stream of the peer's messages */
    uint32_t peer_max_len;
    uint32_t max_inflight; /* largest snd_nxt - snd_una seen */
    /* chains (sim->egress_ps): the node whose egress link its packets take,
     * and the endpoint whose deliveries it forwards (-1: none) */
    int node;
    int relay_of;
    uint32_t relay_lead; /* messages it may send beyond relay_of's deliveries */
    /* placement (rel_ops.place): odd messages go to place_buf */
    bool placing;
    uint8_t *place_buf;
    uint32_t placed;   /* placed messages delivered, each checked */
    uint32_t hole_msg; /* its second packet is told to go nowhere */
    bool hole_seen;
};

struct sim {
    uint64_t now;
    uint64_t rng;
    uint64_t serial;
    struct impair imp;
    uint64_t latency_ns; /* one way */
    uint64_t burst_end;  /* a loss burst lasts until then */
    struct pkt **heap;   /* min-heap of packets in flight */
    struct pkt *spare;   /* packets delivered, for reuse */
    size_t nheap, capheap;
    struct ep ep[6];
    int nep;
    /* shared bottleneck */
    uint64_t svc_ns;     /* per packet; 0: none */
    uint32_t queue_max;  /* packets */
    uint64_t busy_until; /* when the queue drains */
    uint64_t warmup_ns;  /* count deliveries after this */
    uint64_t drops;      /* dropped by the channel */
    uint64_t stall_until[6]; /* endpoint i's host polls again then */
    uint64_t stall_from[6];  /* ... after its last poll then */
    bool tail_dropped;   /* drop_tail_once happened */
    /* per-node egress links (a chain): ps per wire byte, 0: none; each a
     * FIFO that drops what would wait over egress_limit_ns (tbf's latency) */
    uint64_t egress_ps;
    uint64_t egress_limit_ns;
    uint64_t egress_busy[4];
    uint64_t egress_data_ns[4], egress_ack_ns[4]; /* after the warm-up */
    uint64_t clock_off[6]; /* endpoint i's clock reads the simulated time + this ... */
    int64_t drift_ppm[6];  /* ... running this many millionths fast (slow if negative) */
};

/* Endpoint e's clock. */
static inline uint64_t ep_now(const struct ep *e)
{
    const struct sim *sim = e->sim;
    int64_t drift = (int64_t)((double)sim->now * (double)sim->drift_ppm[e->idx] / 1e6);
    return sim->now + sim->clock_off[e->idx] + (uint64_t)drift;
}

/* The simulated time at which endpoint i's clock reads t (not before now). */
static uint64_t sim_time_of(const struct sim *sim, int i, uint64_t t)
{
    if (t == UINT64_MAX)
        return t;
    t -= sim->clock_off[i];
    if (sim->drift_ppm[i])
        t = (uint64_t)((double)t * 1e6 / (1e6 + (double)sim->drift_ppm[i])) + 2; /* not early */
    return t < sim->now ? sim->now : t;
}

static uint64_t rnd(struct sim *sim)
{
    /* splitmix64 */
    uint64_t z = (sim->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static bool chance(struct sim *sim, uint32_t ppm)
{
    return ppm && rnd(sim) % 1000000 < ppm;
}

static bool pkt_before(const struct pkt *a, const struct pkt *b)
{
    return a->at < b->at || (a->at == b->at && a->serial < b->serial);
}

static void heap_push(struct sim *sim, struct pkt *p)
{
    if (sim->nheap == sim->capheap) {
        sim->capheap = sim->capheap ? 2 * sim->capheap : 256;
        sim->heap = realloc(sim->heap, sim->capheap * sizeof(*sim->heap));
        cr_assert_not_null(sim->heap);
    }
    size_t i = sim->nheap++;
    sim->heap[i] = p;
    while (i && pkt_before(sim->heap[i], sim->heap[(i - 1) / 2])) {
        struct pkt *t = sim->heap[i];
        sim->heap[i] = sim->heap[(i - 1) / 2];
        sim->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static struct pkt *heap_pop(struct sim *sim)
{
    struct pkt *top = sim->heap[0];
    sim->heap[0] = sim->heap[--sim->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < sim->nheap && pkt_before(sim->heap[l], sim->heap[m]))
            m = l;
        if (r < sim->nheap && pkt_before(sim->heap[r], sim->heap[m]))
            m = r;
        if (m == i)
            break;
        struct pkt *t = sim->heap[i];
        sim->heap[i] = sim->heap[m];
        sim->heap[m] = t;
        i = m;
    }
    return top;
}

static void enqueue(struct sim *sim, int dst, const uint8_t *data, uint32_t len, uint64_t at,
                    uint64_t waited)
{
    struct pkt *p = sim->spare;
    if (p)
        sim->spare = p->next;
    else
        p = malloc(sizeof(*p));
    cr_assert_not_null(p);
    p->at = at;
    p->waited = waited;
    p->serial = sim->serial++;
    p->dst = dst;
    p->len = len;
    memcpy(p->data, data, len);
    heap_push(sim, p);
}

static int sim_tx(void *ctx, const struct cfx__dpdk_hdr *h, const void *payload)
{
    struct ep *e = ctx;
    struct sim *sim = e->sim;
    uint8_t buf[MAXPKT];

    cr_assert_leq(h->len, MAXPKT - CFX_DPDK_HDR_MAX);
    size_t hlen = cfx__dpdk_hdr_encode(h, buf);
    if (h->len)
        memcpy(buf + hlen, payload, h->len);
    uint32_t len = (uint32_t)hlen + h->len;
    /* never longer than a full data packet without an ack */
    cr_assert_leq(len, CFX_DPDK_HDR_DATA + e->s.p.mtu_payload);
    uint32_t inflight = e->s.snd_nxt - e->s.snd_una;
    if (inflight > e->max_inflight)
        e->max_inflight = inflight;

    if (sim->imp.drop_all) {
        sim->drops++;
        return CFX_OK;
    }
    if (sim->imp.drop_tail_once && !sim->tail_dropped && (h->flags & CFX_DPDK_F_DATA) &&
        e->queued == e->to_send && h->msg_id + 1 == e->s.next_msg_id &&
        h->frag_idx + 1u == h->frag_cnt) {
        sim->tail_dropped = true;
        sim->drops++;
        return CFX_OK;
    }
    if (sim->now < sim->burst_end) {
        sim->drops++;
        return CFX_OK;
    }
    if (chance(sim, sim->imp.burst_ppm)) {
        sim->burst_end = sim->now + sim->imp.burst_ns;
        sim->drops++;
        return CFX_OK;
    }
    if (chance(sim, sim->imp.drop_ppm)) {
        sim->drops++;
        return CFX_OK;
    }
    uint64_t at = sim->now;
    if (sim->egress_ps) {
        /* the frame as tbf counts it: Ethernet, IP, UDP, then ours */
        uint64_t svc = (uint64_t)(len + 42) * sim->egress_ps / 1000;
        uint64_t start = sim->egress_busy[e->node] > at ? sim->egress_busy[e->node] : at;
        if (start - at > sim->egress_limit_ns) {
            sim->drops++;
            return CFX_OK;
        }
        sim->egress_busy[e->node] = start + svc;
        if (sim->now >= sim->warmup_ns) {
            if (h->len)
                sim->egress_data_ns[e->node] += svc;
            else
                sim->egress_ack_ns[e->node] += svc;
        }
        at = start + svc;
    }
    if (e->bottleneck && sim->svc_ns) {
        uint64_t start = sim->busy_until > at ? sim->busy_until : at;
        if ((start - at) / sim->svc_ns >= sim->queue_max) {
            sim->drops++; /* drop tail */
            return CFX_OK;
        }
        sim->busy_until = start + sim->svc_ns;
        at = sim->busy_until;
    }
    at += sim->latency_ns;
    /* a host stall (its poller off its core): the packet and every later
     * one to that endpoint are read when it polls again, in order */
    if (chance(sim, sim->imp.stall_ppm) && sim->stall_until[e->peer] < at + sim->imp.stall_ns) {
        if (sim->stall_until[e->peer] < at)
            sim->stall_from[e->peer] = at; /* a new stall, not a longer one */
        sim->stall_until[e->peer] = at + sim->imp.stall_ns;
    }
    /* what the host's poll gap tells its receive path (the engine passes
     * the time since the poll before) */
    uint64_t waited = 0;
    if (at < sim->stall_until[e->peer]) {
        at = sim->stall_until[e->peer];
        waited = at - sim->stall_from[e->peer];
    }
    if (chance(sim, sim->imp.reorder_ppm)) {
        at += 1 + rnd(sim) % sim->imp.reorder_ns;
        waited = 0;
    }
    enqueue(sim, e->peer, buf, len, at, waited);
    if (chance(sim, sim->imp.dup_ppm))
        enqueue(sim, e->peer, buf, len, at + 1 + rnd(sim) % (sim->latency_ns + 1), 0);
    return CFX_OK;
}

/* Message i of a stream: its size and its bytes.  A seed with this bit
 * set makes a stream of max_len-byte messages. */
#define FIXED_LEN_STREAM (1ull << 63)
static uint32_t msg_len(uint64_t seed, uint32_t i, uint32_t max_len)
{
    if (seed & FIXED_LEN_STREAM)
        return max_len;
    uint64_t z = (seed ^ (0x5851F42D4C957F2Dull * (i + 1))) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    switch (z % 8) {
    case 0: return 0;
    case 1: return 1 + (uint32_t)(z >> 8) % 64;
    case 2: return max_len; /* the largest */
    default: return (uint32_t)(z >> 8) % (max_len + 1);
    }
}

/* Odd messages (not empty) are placed; place() is asked in order, after
 * every earlier message was delivered, so e->got is the message's index. */
static void *sim_place(void *ctx, uint32_t len, uint32_t off, uint32_t plen)
{
    struct ep *e = ctx;
    if (!e->placing || e->got % 2 == 0 || !len)
        return NULL;
    cr_assert_eq(len, msg_len(e->peer_seed, e->got, e->peer_max_len), "message %u", e->got);
    cr_assert_leq((uint64_t)off + plen, len);
    cr_assert_eq(off % e->s.p.mtu_payload, 0);
    if (!off)
        memset(e->place_buf, 0xEE, len);
    if (e->got == e->hole_msg && off == e->s.p.mtu_payload)
        return NULL;
    return e->place_buf + off;
}

static int sim_deliver(void *ctx, const void *buf, size_t len)
{
    struct ep *e = ctx;
    if (e->sim->now < e->hold_until) {
        e->refused++;
        return CFX_ERR_AGAIN;
    }
    uint32_t want = msg_len(e->peer_seed, e->got, e->peer_max_len);
    cr_assert_eq(len, want, "message %u: %zu bytes, %u expected", e->got, len, want);
    cr_assert_eq(!buf, e->placing && e->got % 2 == 1 && len > 0,
                 "message %u: placed or not against the rule", e->got);
    if (!buf) {
        uint8_t ref[20000];
        uint32_t mtu = e->s.p.mtu_payload;
        cr_assert_leq(len, sizeof(ref));
        cfx_test_fill(ref, len, e->peer_seed + e->got);
        if (e->got == e->hole_msg) { /* the packet told to go nowhere did not land */
            for (uint32_t i = mtu; i < 2 * mtu && i < len; i++)
                cr_assert_eq(e->place_buf[i], 0xEE, "message %u: byte %u landed", e->got, i);
            memset(ref + mtu, 0xEE, len - mtu < mtu ? len - mtu : mtu);
            e->hole_seen = true;
        }
        cr_assert_eq(memcmp(e->place_buf, ref, len), 0, "placed message %u differs", e->got);
        e->placed++;
        e->got++;
        if (e->sim->now >= e->sim->warmup_ns)
            e->got_late++;
        return CFX_OK;
    }
    size_t bad = cfx_test_check(buf, len, e->peer_seed + e->got);
    cr_assert_eq(bad, (size_t)-1, "message %u: byte %zu differs", e->got, bad);
    e->got++;
    if (e->sim->now >= e->sim->warmup_ns)
        e->got_late++;
    return CFX_OK;
}

static void sim_sent(void *ctx, void *cookie)
{
    struct ep *e = ctx;
    free(cookie);
    e->acked++;
}

static const struct cfx__dpdk_rel_ops sim_ops = {
    .tx = sim_tx,
    .deliver = sim_deliver,
    .sent = sim_sent,
    .place = sim_place,
};

static void ep_init(struct sim *sim, int idx, int peer, const struct cfx__dpdk_rel_params *p,
                    uint32_t to_send, uint32_t max_len, uint64_t seed)
{
    struct ep *e = &sim->ep[idx];
    char name[32];
    e->sim = sim;
    e->idx = idx;
    e->peer = peer;
    e->to_send = to_send;
    e->max_len = max_len;
    e->seed = seed;
    e->relay_of = -1;
    snprintf(name, sizeof(name), "sim-node-%d", peer);
    cr_assert_eq(cfx__dpdk_sess_init(&e->s, p, &sim_ops, e, 100 + idx, 100 + peer, name), CFX_OK);
    if (idx >= sim->nep)
        sim->nep = idx + 1;
}

/* A one-way flow: endpoint tx sends to_send messages of up to max_len
 * bytes (the stream of seed) to endpoint rx, which checks them. */
static void flow_init(struct sim *sim, int tx, int rx, const struct cfx__dpdk_rel_params *p,
                      uint32_t to_send, uint32_t max_len, uint64_t seed)
{
    ep_init(sim, tx, rx, p, to_send, max_len, seed);
    ep_init(sim, rx, tx, p, 0, 0, seed + 1);
    sim->ep[rx].peer_seed = seed;
    sim->ep[rx].peer_max_len = max_len;
}

/* Queues what the send queue takes now. */
static void ep_feed(struct ep *e)
{
    while (e->queued < e->to_send) {
        if (e->relay_of >= 0 && e->queued >= e->sim->ep[e->relay_of].got + e->relay_lead)
            return; /* forwards only what arrived */
        if (!cfx__dpdk_sess_room(&e->s))
            return; /* full: no message made only to be refused */
        uint32_t len = msg_len(e->seed, e->queued, e->max_len);
        uint8_t *buf = malloc(len ? len : 1);
        cr_assert_not_null(buf);
        cfx_test_fill(buf, len, e->seed + e->queued);
        int rc = cfx__dpdk_sess_send(&e->s, buf, len, buf, ep_now(e));
        if (rc == CFX_ERR_AGAIN) {
            free(buf);
            return;
        }
        if (rc != CFX_OK) {
            free(buf);
            return; /* the sticky error: the test looks at it */
        }
        e->bufs[e->queued % 1024] = buf;
        e->queued++;
    }
}

static bool sim_done(struct sim *sim)
{
    for (int i = 0; i < sim->nep; i++) {
        struct ep *e = &sim->ep[i];
        if (e->s.error)
            return true;
        if (e->acked < e->to_send)
            return false;
    }
    return true;
}

/* Runs until every message was acknowledged, an error, or until `until`. */
static void sim_run(struct sim *sim, uint64_t until)
{
    uint64_t steps = 0;
    while (!sim_done(sim) && sim->now < until) {
        cr_assert_lt(++steps, 50000000ull, "simulation does not converge");
        for (int i = 0; i < sim->nep; i++)
            ep_feed(&sim->ep[i]);
        uint64_t next = until;
        if (sim->nheap && sim->heap[0]->at < next)
            next = sim->heap[0]->at;
        for (int i = 0; i < sim->nep; i++) {
            uint64_t d = sim_time_of(sim, i, cfx__dpdk_sess_deadline(&sim->ep[i].s));
            if (d < next)
                next = d;
            if (sim->ep[i].hold_until > sim->now && sim->ep[i].hold_until < next)
                next = sim->ep[i].hold_until;
        }
        if (next > sim->now)
            sim->now = next;
        while (sim->nheap && sim->heap[0]->at <= sim->now) {
            struct pkt *p = heap_pop(sim);
            struct cfx__dpdk_hdr h;
            const char *why;
            int rc = cfx__dpdk_hdr_decode(p->data, p->len, &h, &why);
            cr_assert_eq(rc, CFX_OK, "decoder refused our own packet: %s", why);
            cfx__dpdk_sess_rx(&sim->ep[p->dst].s, &h, p->data + cfx__dpdk_hdr_len(h.flags),
                              ep_now(&sim->ep[p->dst]), p->waited);
            p->next = sim->spare; /* kept for the next packet: no malloc per packet */
            sim->spare = p;
        }
        for (int i = 0; i < sim->nep; i++)
            cfx__dpdk_sess_poll(&sim->ep[i].s, ep_now(&sim->ep[i]));
    }
}

static void sim_fini(struct sim *sim)
{
    while (sim->nheap)
        free(heap_pop(sim));
    while (sim->spare) {
        struct pkt *p = sim->spare;
        sim->spare = p->next;
        free(p);
    }
    free(sim->heap);
    for (int i = 0; i < sim->nep; i++) {
        struct ep *e = &sim->ep[i];
        cfx__dpdk_sess_fini(&e->s);
        /* messages still queued: fini does not call sent(), they are ours */
        for (uint32_t m = e->acked; m != e->queued; m++)
            free(e->bufs[m % 1024]);
    }
}

/* --- delivery under impairments -------------------------------------------- */

#define NMSG 400

/* The first odd message over two packets long: its second packet is the hole. */
static uint32_t hole_msg(const struct ep *e, uint32_t mtu)
{
    for (uint32_t i = 1; i < NMSG; i += 2)
        if (msg_len(e->peer_seed, i, e->peer_max_len) > 2 * mtu)
            return i;
    cr_assert_fail("no message long enough for a hole");
    return 0;
}

static void run_pair(const struct impair *imp, uint64_t seed, uint32_t isn, bool placing)
{
    static struct sim sim; /* big: keep it off the stack */
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024,
                                      .rcv_slots = 64,
                                      .snd_slots = 64,
                                      .sendq_max = 16,
                                      .isn = isn,
                                      .max_retries = 12 };
    sim.rng = seed;
    sim.imp = *imp;
    sim.latency_ns = 10000;
    sim.warmup_ns = 0;
    /* both directions at once, sizes up to 20 KiB (20 fragments) */
    ep_init(&sim, 0, 1, &p, NMSG, 20000, seed * 3 + 1);
    ep_init(&sim, 1, 0, &p, NMSG, 20000, seed * 5 + 2);
    sim.ep[0].peer_seed = sim.ep[1].seed;
    sim.ep[0].peer_max_len = sim.ep[1].max_len;
    sim.ep[1].peer_seed = sim.ep[0].seed;
    sim.ep[1].peer_max_len = sim.ep[0].max_len;
    for (int i = 0; i < 2 && placing; i++) {
        struct ep *e = &sim.ep[i];
        e->placing = true;
        e->place_buf = malloc(20000);
        cr_assert_not_null(e->place_buf);
        e->hole_msg = hole_msg(e, p.mtu_payload);
    }

    sim_run(&sim, 60ull * 1000000000ull);
    for (int i = 0; i < 2; i++) {
        struct ep *e = &sim.ep[i];
        cr_assert_eq(e->s.error, 0, "endpoint %d: %s", i, e->s.error_msg);
        cr_assert_eq(e->acked, NMSG, "endpoint %d: %u of %u acknowledged", i, e->acked, NMSG);
        cr_assert_eq(e->got, NMSG, "endpoint %d: %u of %u delivered", i, e->got, NMSG);
        cr_assert_eq(e->s.stats.msgs_rcvd, NMSG);
        cr_assert(cfx__dpdk_sess_idle(&e->s));
        cr_assert_leq(e->max_inflight, p.rcv_slots, "window overrun");
        cr_assert_eq(e->s.stats.rx_beyond, 0);
        /* in order with nothing missing before it: never copied into the
         * reorder buffer; only losses and reordering put packets there */
        if (imp->drop_ppm || imp->burst_ppm || imp->reorder_ppm)
            cr_assert_lt(e->s.stats.rx_direct, e->s.stats.rx_data);
        else
            cr_assert_eq(e->s.stats.rx_direct, e->s.stats.rx_data);
        cr_assert_eq(e->s.stats.msgs_placed, e->placed);
        if (placing) {
            uint32_t want = 0;
            for (uint32_t m = 1; m < NMSG; m += 2)
                want += msg_len(e->peer_seed, m, e->peer_max_len) > 0;
            cr_assert_eq(e->placed, want, "endpoint %d: %u of %u placed", i, e->placed, want);
            cr_assert(e->hole_seen);
        }
        free(e->place_buf);
    }
    for (int i = 0; i < 2; i++)
        cr_log_info("endpoint %d: data %llu retx %llu rto %llu fast %llu dup %llu, %.3f ms", i,
                    (unsigned long long)sim.ep[i].s.stats.tx_data,
                    (unsigned long long)sim.ep[i].s.stats.tx_retx,
                    (unsigned long long)sim.ep[i].s.stats.rto,
                    (unsigned long long)sim.ep[i].s.stats.fast_retx,
                    (unsigned long long)sim.ep[i].s.stats.rx_dup, (double)sim.now / 1e6);
    if (imp->drop_ppm || imp->burst_ppm) {
        cr_assert_gt(sim.drops, 0);
        cr_assert_gt(sim.ep[0].s.stats.tx_retx + sim.ep[1].s.stats.tx_retx, 0);
    }
    if (imp->dup_ppm)
        cr_assert_gt(sim.ep[0].s.stats.rx_dup + sim.ep[1].s.stats.rx_dup, 0);
    sim_fini(&sim);
}

Test(dpdk_rel, clean_channel)
{
    struct impair imp = { 0 };
    run_pair(&imp, 1, 0, false);
}

Test(dpdk_rel, drop_1pct)
{
    struct impair imp = { .drop_ppm = 10000 };
    run_pair(&imp, 2, 0, false);
}

Test(dpdk_rel, drop_bursts)
{
    struct impair imp = { .burst_ppm = 2000, .burst_ns = 200000 };
    run_pair(&imp, 3, 0, false);
}

Test(dpdk_rel, duplicates)
{
    struct impair imp = { .dup_ppm = 50000 };
    run_pair(&imp, 4, 0, false);
}

Test(dpdk_rel, reordering)
{
    struct impair imp = { .reorder_ppm = 100000, .reorder_ns = 50000 };
    run_pair(&imp, 5, 0, false);
}

/* Every impairment at once. */
static const struct impair everything = { .drop_ppm = 10000,
                                          .burst_ppm = 1000,
                                          .burst_ns = 100000,
                                          .dup_ppm = 10000,
                                          .reorder_ppm = 50000,
                                          .reorder_ns = 30000 };

Test(dpdk_rel, everything_at_once_across_seq_wrap)
{
    run_pair(&everything, 6, 0xFFFFFF00u, false);
}

/* Messages placed where the receiver says (rel_ops.place), on a clean channel
 * (every packet straight from the wire) and under every impairment (packets
 * placed from the reorder buffer too); one packet told to go nowhere. */
Test(dpdk_rel, placed_messages_on_a_clean_channel)
{
    struct impair imp = { 0 };
    run_pair(&imp, 7, 0, true);
}

Test(dpdk_rel, placed_messages_under_loss_duplicates_and_reordering)
{
    run_pair(&everything, 8, 0xFFFFFF00u, true);
}

/* --- flow control ------------------------------------------------------------ */

/*
 * A lost tail (the last packet of the last message: nothing sent after it
 * reveals the loss through the sack) is found by the tail-loss probe two
 * RTTs on, not by the retransmission timer (5 ms); every byte arrives.
 */
Test(dpdk_rel, lost_tail_found_by_the_probe)
{
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .rcv_slots = 64, .snd_slots = 64,
                                      .sendq_max = 16 };
    sim.rng = 7;
    sim.latency_ns = 10000;
    sim.imp.drop_tail_once = true;
    flow_init(&sim, 0, 1, &p, 50, 20000, 11);
    sim_run(&sim, 10ull * 1000000000ull);
    struct ep *a = &sim.ep[0], *b = &sim.ep[1];
    cr_assert_eq(a->s.error, 0, "%s", a->s.error_msg);
    cr_assert(sim.tail_dropped, "the last packet was never sent");
    cr_assert_eq(a->acked, 50, "%u of 50 acknowledged", a->acked);
    cr_assert_eq(b->got, 50, "%u of 50 delivered", b->got);
    cr_assert_geq(a->s.stats.tlp, 1);
    cr_assert_eq(a->s.stats.rto, 0, "the timer found the lost tail, not the probe");
    cr_assert_eq(a->s.stats.tx_retx, a->s.stats.tlp, "more than the probe was resent");
    sim_fini(&sim);
}

/*
 * A ping-pong of one-packet messages (a request, its reply, the next
 * request): the ack of each rides on the answer, which leaves within the
 * ack delay, so no frame goes with an ack alone but the last one's.
 * Before, each message's ack went at once on its own frame, before the
 * answer could be sent: a transmit more per hop on the critical path.
 */
Test(dpdk_rel, ping_pong_acks_ride_on_the_answers)
{
    enum { ROUNDS = 200 };
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024 };
    sim.rng = 5;
    sim.latency_ns = 10000;
    ep_init(&sim, 0, 1, &p, ROUNDS, 512, 51);
    ep_init(&sim, 1, 0, &p, ROUNDS, 512, 52);
    struct ep *a = &sim.ep[0], *b = &sim.ep[1];
    a->peer_seed = 52;
    a->peer_max_len = 512;
    b->peer_seed = 51;
    b->peer_max_len = 512;
    a->relay_of = 0; /* the next request once the reply came */
    a->relay_lead = 1;
    b->relay_of = 1; /* a reply per request */
    sim_run(&sim, 10ull * 1000000000ull);
    cr_assert_eq(a->s.error, 0, "%s", a->s.error_msg);
    cr_assert_eq(b->s.error, 0, "%s", b->s.error_msg);
    cr_assert_eq(a->got, ROUNDS, "%u of %d replies", a->got, ROUNDS);
    cr_assert_eq(b->got, ROUNDS, "%u of %d requests", b->got, ROUNDS);
    cr_assert_eq(a->s.stats.tx_retx + b->s.stats.tx_retx, 0);
    cr_log_info("ack-only frames: %llu from the requester, %llu from the replier",
                (unsigned long long)a->s.stats.tx_ack, (unsigned long long)b->s.stats.tx_ack);
    cr_assert_leq(b->s.stats.tx_ack, 1, "%llu acks alone for %d requests",
                  (unsigned long long)b->s.stats.tx_ack, ROUNDS);
    cr_assert_leq(a->s.stats.tx_ack, 1, "%llu acks alone for %d replies",
                  (unsigned long long)a->s.stats.tx_ack, ROUNDS);
    sim_fini(&sim);
}

Test(dpdk_rel, full_window_makes_the_sender_wait)
{
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = {
        .mtu_payload = 1024, .rcv_slots = 32, .snd_slots = 256, .sendq_max = 64
    };
    sim.rng = 7;
    sim.latency_ns = 10000;
    flow_init(&sim, 0, 1, &p, 300, 4096, 11);
    sim.ep[1].hold_until = 5000000; /* the receiver takes nothing for 5 ms */

    sim_run(&sim, 4000000);
    struct ep *a = &sim.ep[0], *b = &sim.ep[1];
    cr_assert_eq(b->got, 0);
    cr_assert_gt(b->refused, 0);
    /* the sender stopped at the window: nothing in flight, window closed */
    cr_assert_eq(a->s.snd_una, a->s.snd_nxt);
    cr_assert_eq(a->s.snd_right, a->s.snd_nxt);
    /* what was sent fits the reorder buffer and the one message held */
    cr_assert_leq(a->s.stats.tx_data, p.rcv_slots + 4);
    cr_assert(!cfx__dpdk_sess_idle(&a->s));

    sim_run(&sim, 10ull * 1000000000ull);
    cr_assert_eq(a->s.error, 0, "%s", a->s.error_msg);
    cr_assert_eq(b->got, 300);
    cr_assert_eq(a->acked, 300);
    cr_assert_eq(sim.drops, 0);
    cr_assert_eq(a->s.stats.tx_retx, 0, "a closed window is not a loss");
    cr_assert_eq(b->s.stats.rx_beyond, 0);
    cr_assert_eq(b->s.stats.rx_dup, 0);
    sim_fini(&sim);
}

/* After a sender was idle for idle_restart_ns its next burst starts from
 * cwnd_init (the receiver's quiet port may be napping); with 0 it goes on
 * with the window it had.  Every message is checked by the receiver. */
/* 300 messages of 4 KiB from endpoint 0 to 1 over a 10 us path, all
 * delivered: the flow whose sender then goes idle. */
static void idle_flow(struct sim *sim, uint64_t idle_restart_ns)
{
    memset(sim, 0, sizeof(*sim));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024, .idle_restart_ns = idle_restart_ns };
    sim->rng = 9;
    sim->latency_ns = 10000;
    flow_init(sim, 0, 1, &p, 300, 4096, 21);
    sim_run(sim, 10ull * 1000000000ull);
    cr_assert_eq(sim->ep[1].got, 300);
}

static void run_idle_restart(uint64_t idle_restart_ns, bool want_restart)
{
    static struct sim sim;
    idle_flow(&sim, idle_restart_ns);
    struct ep *a = &sim.ep[0], *b = &sim.ep[1];
    double grown = a->s.cwnd;
    cr_assert_gt(grown, 2 * 16, "the window grew in the first burst (%.1f)", grown);
    sim.now += 20000000; /* 20 ms with nothing to send */
    a->to_send = 600;
    uint64_t cuts = a->s.stats.cwnd_cut_delay;
    /* the first burst waits 1 ms at the receiver, as in a napping port's
     * queue: past t_high, a delay cut if it were taken for the path's
     * (and before the tail-loss probe, whose resend Karn would skip) */
    sim.latency_ns = 1000000;
    ep_feed(a); /* queues, and sends what the window allows */
    sim.latency_ns = 10000;
    uint32_t inflight = a->s.snd_nxt - a->s.snd_una;
    if (want_restart) {
        cr_assert_leq(inflight, 16, "%u packets in the first burst after idle", inflight);
        cr_assert_eq(a->s.stats.cwnd_idle_restarts, 1);
        sim_run(&sim, sim.now + 10ull * 1000000000ull);
        cr_assert_eq(a->s.stats.cwnd_cut_delay, cuts, "the burst's wait counted as path delay");
    } else {
        cr_assert_gt(inflight, 16, "the window it had: %u packets in flight", inflight);
        cr_assert_eq(a->s.stats.cwnd_idle_restarts, 0);
    }
    sim_run(&sim, sim.now + 10ull * 1000000000ull);
    cr_assert_eq(a->s.error, 0, "%s", a->s.error_msg);
    cr_assert_eq(b->got, 600);
    cr_assert_eq(a->acked, 600);
    sim_fini(&sim);
}

Test(dpdk_rel, window_restarts_after_idle)
{
    run_idle_restart(10000000, true);
}

Test(dpdk_rel, no_restart_when_turned_off)
{
    run_idle_restart(0, false);
}

/* A burst after idle shorter than the initial window ends when it is all
 * acknowledged: the flag that keeps the burst's (napped) RTT samples out
 * lingered until restart_end, over up to cwnd_init later packets that did
 * not wait for a nap. */
Test(dpdk_rel, short_restart_burst_ends_when_acked)
{
    static struct sim sim;
    idle_flow(&sim, 10000000);
    struct ep *a = &sim.ep[0], *b = &sim.ep[1];
    sim.now += 20000000; /* idle */
    a->to_send = 301;    /* one message: 4 packets, under the initial window of 16 */
    ep_feed(a);
    cr_assert_eq(a->s.stats.cwnd_idle_restarts, 1);
    cr_assert(a->s.restart_burst);
    sim_run(&sim, sim.now + 10ull * 1000000000ull);
    cr_assert_eq(b->got, 301);
    cr_assert_not(a->s.restart_burst, "the burst's mark outlived the burst");
    cr_assert_eq(a->s.error, 0, "%s", a->s.error_msg);
    sim_fini(&sim);
}

/* --- a dead peer ------------------------------------------------------------ */

Test(dpdk_rel, dead_peer_fails_with_a_sticky_error_naming_it)
{
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = { .max_retries = 5,
                                      .rto_init_ns = 1000000,
                                      .rto_max_ns = 16000000 };
    sim.rng = 8;
    sim.latency_ns = 10000;
    sim.imp.drop_all = true;
    flow_init(&sim, 0, 1, &p, 3, 3000, 13);

    sim_run(&sim, 10ull * 1000000000ull);
    struct ep *a = &sim.ep[0];
    cr_assert_eq(a->s.error, CFX_ERR_TIMEOUT);
    cr_assert_not_null(strstr(a->s.error_msg, "sim-node-1"), "%s", a->s.error_msg);
    cr_assert_eq(a->s.stats.rto, p.max_retries + 1);
    cr_assert_eq(a->acked, 0);
    /* 1 + 2 + 4 + 8 + 16 + 16 ms of backed-off timeouts, capped */
    cr_assert_leq(sim.now, 48000000ull);
    cr_assert_geq(sim.now, 47000000ull);
    /* sticky: every later call returns it */
    uint8_t x = 0;
    cr_assert_eq(cfx__dpdk_sess_send(&a->s, &x, 1, NULL, sim.now), CFX_ERR_TIMEOUT);
    cr_assert_eq(cfx__dpdk_sess_poll(&a->s, sim.now + 1), CFX_ERR_TIMEOUT);
    sim_fini(&sim);
}

/* --- fairness at a shared bottleneck ------------------------------------------ */

/*
 * 1 packet per us through a 64-packet drop-tail queue, 20 us base RTT (so
 * 20 to 84 us with the queue); flow 2 starts 20 ms after flow 1, into its
 * standing queue.  Delay thresholds t_low/t_high; with both far above any
 * RTT, loss is the only signal.
 */
static void run_bottleneck(uint64_t t_low, uint64_t t_high, bool want_delay_cuts)
{
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1024,
                                      .rcv_slots = 512,
                                      .snd_slots = 512,
                                      .sendq_max = 512,
                                      .t_low_ns = t_low,
                                      .t_high_ns = t_high,
                                      .cwnd_init = 4 };
    sim.rng = 9;
    sim.latency_ns = 10000;
    sim.svc_ns = 1000;
    sim.queue_max = 64;
    sim.warmup_ns = 100000000; /* count from 100 ms */
    flow_init(&sim, 0, 1, &p, UINT32_MAX, 1024, 21);
    flow_init(&sim, 2, 3, &p, 0, 1024, 23); /* starts 20 ms later */
    sim.ep[0].bottleneck = sim.ep[2].bottleneck = true;

    sim_run(&sim, 20000000);
    sim.ep[2].to_send = UINT32_MAX;
    sim_run(&sim, 400000000);

    uint64_t f1 = sim.ep[1].got_late, f2 = sim.ep[3].got_late;
    double share = (double)f1 / (double)(f1 + f2);
    cr_log_info("bottleneck: flow 1 %llu, flow 2 %llu packets after warm-up (%.1f%%); "
                "loss cuts %llu/%llu, delay cuts %llu/%llu",
                (unsigned long long)f1, (unsigned long long)f2, 100 * share,
                (unsigned long long)sim.ep[0].s.stats.cwnd_cut_loss,
                (unsigned long long)sim.ep[2].s.stats.cwnd_cut_loss,
                (unsigned long long)sim.ep[0].s.stats.cwnd_cut_delay,
                (unsigned long long)sim.ep[2].s.stats.cwnd_cut_delay);
    cr_assert_eq(sim.ep[0].s.error, 0, "%s", sim.ep[0].s.error_msg);
    cr_assert_eq(sim.ep[2].s.error, 0, "%s", sim.ep[2].s.error_msg);
    /* the link was used: at least half of its 300000 packet slots */
    cr_assert_gt(f1 + f2, 150000);
    cr_assert(share > 0.3 && share < 0.7, "flow 1 got %.1f%% of the bottleneck", 100 * share);
    if (want_delay_cuts) {
        cr_assert_gt(sim.ep[0].s.stats.cwnd_cut_delay, 0);
        cr_assert_gt(sim.ep[2].s.stats.cwnd_cut_delay, 0);
    } else {
        cr_assert_eq(sim.ep[0].s.stats.cwnd_cut_delay + sim.ep[2].s.stats.cwnd_cut_delay, 0);
        cr_assert_gt(sim.ep[0].s.stats.cwnd_cut_loss, 0);
        cr_assert_gt(sim.ep[2].s.stats.cwnd_cut_loss, 0);
    }
    sim_fini(&sim);
}

/*
 * One flow through a packet-per-us bottleneck, 200 us base RTT (a window
 * of 200 packets fills the link), the default thresholds (50 and 500 us),
 * 200 ms; with stalls, one packet in 10,000 finds its receiver (either
 * end) away for 1 ms, which delays it and all behind it: the RTT samples
 * of those moments are over 1 ms, far over t_high.  Returns the packets
 * delivered after the 20 ms warm-up; *delay_cuts the sender's delay cuts.
 */
/* A path of 100 us one way through a queue of 1024 packets served at one
 * per us (no loss from the queue: delay is its only signal), and windows
 * of 512 packets: the stall tests' network. */
static void stall_sim(struct sim *sim, uint64_t rng, struct cfx__dpdk_rel_params *p)
{
    memset(sim, 0, sizeof(*sim));
    *p = (struct cfx__dpdk_rel_params){ .mtu_payload = 1024,
                                        .rcv_slots = 512,
                                        .snd_slots = 512,
                                        .sendq_max = 512 };
    sim->rng = rng;
    sim->latency_ns = 100000;
    sim->svc_ns = 1000;
    sim->queue_max = 1024;
}

static uint64_t run_stalls(bool stalls, uint64_t *delay_cuts)
{
    static struct sim sim;
    struct cfx__dpdk_rel_params p;
    stall_sim(&sim, 11, &p);
    sim.warmup_ns = 20000000;
    if (stalls)
        sim.imp = (struct impair){ .stall_ppm = 100, .stall_ns = 1000000 };
    flow_init(&sim, 0, 1, &p, UINT32_MAX, 1024, 31);
    sim.ep[0].bottleneck = true;
    sim_run(&sim, 200000000);
    cr_assert_eq(sim.ep[0].s.error, 0, "%s", sim.ep[0].s.error_msg);
    *delay_cuts = sim.ep[0].s.stats.cwnd_cut_delay;
    uint64_t got = sim.ep[1].got_late;
    cr_log_info("%s: %llu packets after warm-up, %llu delay cuts, %llu loss cuts",
                stalls ? "stalls" : "no stalls", (unsigned long long)got,
                (unsigned long long)*delay_cuts,
                (unsigned long long)sim.ep[0].s.stats.cwnd_cut_loss);
    sim_fini(&sim);
    return got;
}

/*
 * A host that stalls now and then (a polling thread off its core) is not
 * a queue.  The receiver tells with every ack how long the echoed packet
 * may have waited in its host (its poll gap), the sender leaves that and
 * its own poll gap out of the RTT its delay signal sees, and that signal
 * looks at the smallest RTT of each window of data: so the stalls cut
 * nothing and the flow keeps most of the link.
 */
Test(dpdk_rel, host_stalls_do_not_collapse_the_window)
{
    uint64_t cuts_clean, cuts_stalled;
    uint64_t clean = run_stalls(false, &cuts_clean);
    uint64_t stalled = run_stalls(true, &cuts_stalled);
    /* 180 ms at a packet per us: 180000 slots */
    cr_assert_gt(clean, 150000, "without stalls: %llu", (unsigned long long)clean);
    /* the stalls themselves take about a tenth of the time (one per
     * 10,000 packets, 1 ms each, at a packet per us): 84 % of the clean
     * run is kept.  Without the poll gaps, a stall longer than a window
     * takes (0.2-0.5 ms here) delayed every sample of that window, so it
     * was a queue to the delay signal and cut: 71 % kept; cutting on
     * single samples kept 31 % */
    cr_assert_gt(stalled, clean * 4 / 5, "with stalls: %llu against %llu without",
                 (unsigned long long)stalled, (unsigned long long)clean);
    /* and the queue still shows: a stall must not blind the delay signal
     * (an ack found after a stall once pulled the reverse path's least
     * delay down by the stall, and nothing was cut on delay after it) */
    cr_assert_gt(cuts_clean, 0);
    cr_assert_gt(cuts_stalled, 0, "no delay cut with stalls");
}

/*
 * One gap longer than the RTO (rto_min, 5 ms) in a stream at a packet per
 * us, after a 30 ms warm-up: the receiver's host away for 12 ms on a
 * channel that loses nothing, or (burst) a channel that loses every packet,
 * both ways, for 12 ms.  Then 50 ms more, every message checked byte for
 * byte by the receiver.  *cw_before gets the window before the first
 * timeout, *cw_undone the window right after an undo (0: none); *st the
 * sender's counters.
 */
static void run_one_gap(bool burst, double *cw_before, double *cw_undone,
                        struct cfx__dpdk_rel_stats *st)
{
    static struct sim sim;
    struct cfx__dpdk_rel_params p;
    stall_sim(&sim, 23, &p);
    flow_init(&sim, 0, 1, &p, UINT32_MAX, 1024, 41);
    sim.ep[0].bottleneck = true;
    struct cfx__dpdk_sess *s = &sim.ep[0].s;
    sim_run(&sim, 30000000);
    if (burst) {
        sim.burst_end = sim.now + 12000000;
    } else {
        sim.stall_from[1] = sim.now;
        sim.stall_until[1] = sim.now + 12000000;
    }
    *cw_before = s->cwnd;
    *cw_undone = 0;
    for (uint64_t t = sim.now + 50000; t <= 80000000; t += 50000) {
        sim_run(&sim, t);
        if (!s->stats.rto)
            *cw_before = s->cwnd;
        if (s->stats.rto_undone && !*cw_undone)
            *cw_undone = s->cwnd;
    }
    cr_assert_eq(s->error, 0, "%s", s->error_msg);
    cr_assert_eq(sim.ep[1].s.error, 0, "%s", sim.ep[1].s.error_msg);
    cr_assert_gt(sim.ep[1].got, 0);
    *st = s->stats;
    cr_log_info("%s: window %.1f before the timeout, %.1f after the undo; %llu timeouts, "
                "%llu undone, %llu resent, %llu dropped",
                burst ? "loss burst" : "host stall", *cw_before, *cw_undone,
                (unsigned long long)st->rto, (unsigned long long)st->rto_undone,
                (unsigned long long)st->tx_retx, (unsigned long long)sim.drops);
    sim_fini(&sim);
}

/*
 * A timeout during a host stall was spurious: the data had arrived and the
 * acks were late.  The acks that end it echo packets sent before it, so
 * the window it cut to one packet comes back whole (and the halved
 * threshold with it).  Without the undo the window stayed cut and grew
 * back from one packet.
 */
Test(dpdk_rel, timeout_in_a_host_stall_is_undone)
{
    struct cfx__dpdk_rel_stats st;
    double before, undone;
    run_one_gap(false, &before, &undone, &st);
    cr_assert_gt(st.rto, 0, "the stall did not outlast the RTO: the test tests nothing");
    /* the backed-off timeouts of one stall are one series: one undo */
    cr_assert_eq(st.rto_undone, 1, "%llu timeouts, %llu undone", (unsigned long long)st.rto,
                 (unsigned long long)st.rto_undone);
    cr_assert_gt(before, 1.0);
    cr_assert_geq(undone, before, "the window came back to %.1f of %.1f", undone, before);
}

/* ... and a timeout after real losses is not undone: the ack that ends it
 * echoes the retransmission that filled the hole. */
Test(dpdk_rel, timeout_after_losses_is_not_undone)
{
    struct cfx__dpdk_rel_stats st;
    double before, undone;
    run_one_gap(true, &before, &undone, &st);
    cr_assert_gt(st.rto, 0, "the loss did not outlast the RTO: the test tests nothing");
    cr_assert_eq(st.rto_undone, 0, "%llu of %llu timeouts after losses undone",
                 (unsigned long long)st.rto_undone, (unsigned long long)st.rto);
}

Test(dpdk_rel, two_flows_share_a_bottleneck_fairly_on_delay)
{
    run_bottleneck(30000, 70000, true);
}

Test(dpdk_rel, two_flows_share_a_bottleneck_fairly_on_loss)
{
    run_bottleneck(1000000000, 1000000000, false);
}

/*
 * A chain of nodes as a pipelined broadcast makes it: node 0 sends 256 KiB
 * messages to node 1, which forwards each one to node 2 as soon as it has
 * it, and so on.  Each node's egress is one link (1 Gbit/s, a FIFO
 * dropping what would wait over 50 ms, as tbf on the emulated cluster),
 * 15 us one way; with skew, every
 * endpoint's clock is days away from the others'.  A middle node's
 * acknowledgements upstream wait in its egress queue behind the data it
 * forwards, which the next hop's delay signal holds near t_high.  Returns
 * the last link's busy share after the warm-up: the wire time of the data
 * packets the last node got over the time elapsed.
 */
static double run_chain(int nodes, bool skew, int64_t drift_ppm, uint64_t epoch_ns)
{
    static struct sim sim;
    memset(&sim, 0, sizeof(sim));
    const uint32_t len = 256u << 10;
    /* the engine's session parameters, but 8 messages queued, not 128: each
     * is 188 packets, far over the window, and each is filled and checked */
    struct cfx__dpdk_rel_params p = { .mtu_payload = 1436, .sendq_max = 8,
                                      .rev_epoch_ns = epoch_ns };
    sim.rng = 13;
    sim.latency_ns = 15000;
    sim.egress_ps = 8000; /* 1 Gbit/s */
    sim.egress_limit_ns = 50000000;
    sim.warmup_ns = 50000000;
    cr_assert_leq(2 * (nodes - 1), 6);
    for (int n = 0; n + 1 < nodes; n++) {
        int tx = 2 * n, rx = 2 * n + 1;
        flow_init(&sim, tx, rx, &p, UINT32_MAX, len, FIXED_LEN_STREAM | (uint64_t)(41 + n));
        sim.ep[tx].node = n;
        sim.ep[rx].node = n + 1;
        sim.ep[tx].relay_of = n ? tx - 1 : -1;
    }
    for (int i = 0; i < sim.nep; i++) {
        if (skew)
            sim.clock_off[i] = (uint64_t)(5 - i) * 86400000000000ull + (uint64_t)i * 123456789;
        sim.drift_ppm[i] = i % 2 ? drift_ppm : -drift_ppm;
    }
    const uint64_t run_ns = 300000000;
    sim_run(&sim, run_ns);
    for (int i = 0; i < sim.nep; i++)
        cr_assert_eq(sim.ep[i].s.error, 0, "endpoint %d: %s", i, sim.ep[i].s.error_msg);
    const struct ep *last = &sim.ep[2 * (nodes - 1) - 1];
    uint64_t frames = (uint64_t)last->got_late * ((len + p.mtu_payload - 1) / p.mtu_payload);
    uint64_t frame_ps = (uint64_t)(p.mtu_payload + CFX_DPDK_HDR_DATA + 42) * sim.egress_ps;
    double busy = (double)frames * (double)frame_ps / 1000.0 / (double)(run_ns - sim.warmup_ns);
    for (int n = 0; n + 1 < nodes; n++) {
        const struct cfx__dpdk_sess *ss = &sim.ep[2 * n].s;
        cr_log_info("chain of %d%s, hop %d: srtt %.0f us, cwnd %.0f, delay cuts %llu, loss cuts "
                    "%llu, retx %llu; its egress: data %.1f%%, acks %.1f%%",
                    nodes, skew ? " (skew)" : "", n, (double)ss->srtt_ns / 1e3, ss->cwnd,
                    (unsigned long long)ss->stats.cwnd_cut_delay,
                    (unsigned long long)ss->stats.cwnd_cut_loss,
                    (unsigned long long)ss->stats.tx_retx,
                    100.0 * (double)sim.egress_data_ns[n] / (double)(run_ns - sim.warmup_ns),
                    100.0 * (double)sim.egress_ack_ns[n] / (double)(run_ns - sim.warmup_ns));
    }
    cr_log_info("chain of %d%s: last link busy %.1f%% after warm-up", nodes, skew ? " (skew)" : "",
                100 * busy);
    sim_fini(&sim);
    return busy;
}

/*
 * Every link of the chain stays busy with data.  Before the delay signal
 * left the reverse path's queue out, the upstream hops cut their windows
 * on the downstream queue and the last link carried 89% (3 nodes) and 85%
 * (4 nodes); with that and an ack per packet (5% of a forwarding node's
 * link), 94%; now 98.4%.
 */
Test(dpdk_rel, chain_keeps_every_link_busy)
{
    for (int nodes = 3; nodes <= 4; nodes++) {
        double busy = run_chain(nodes, false, 0, 0);
        cr_assert_gt(busy, 0.95, "chain of %d: the last link carried data %.1f%% of the time",
                     nodes, 100 * busy);
    }
}

/*
 * The reverse path's delay is measured across two clocks: their offset must
 * not matter, nor their drift, nor the least delay starting over each
 * epoch.  Clocks days apart, every other one 1000 ppm fast and the others
 * 1000 ppm slow, epochs of 20 ms (so the 300 ms run starts the least over
 * 15 times, each time from a reverse path with the downstream queue in it;
 * and the drift moves it by up to 80 us an epoch pair, as 20 ppm would over
 * the default 2 s).
 */
Test(dpdk_rel, chain_keeps_every_link_busy_with_clocks_apart)
{
    double busy = run_chain(4, true, 1000, 20000000);
    cr_assert_gt(busy, 0.95, "the last link carried data %.1f%% of the time", 100 * busy);
}

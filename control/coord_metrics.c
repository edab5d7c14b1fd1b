/*
 * The coordinator's metrics: the Prometheus text exposition format (0.0.4)
 * over HTTP/1.x, GET /metrics, on the coordinator's own event loop.
 *
 * Trust boundary: whoever can connect to the metrics address reads them,
 * unauthenticated (Prometheus scrapes so): member counts, object counts and
 * bytes, node ids, names and hosts.  No object ids, names or data, no token,
 * and nothing can be changed through it.  conflux-coord binds it to
 * loopback unless told otherwise (--metrics ADDR:PORT).
 *
 * A minimal, bounded, read-only responder: a request is one head of at
 * most CFX_METRICS_REQ_MAX bytes (a longer one: 431), only GET (405) of
 * /metrics (404), judged by cfx__coord_metrics_req_parse (coord_metrics_req.c,
 * fuzzed on its own); every answer ends its connection (the endpoint shuts
 * its side, reads what the client still sends until it closes too).  At most
 * METRICS_CONNS_MAX connections at once (more are closed at accept), and
 * each has METRICS_TIMEOUT_MS from accept to its last byte sent.
 */
#include "control/coord_int.h"
#include "control/coord_metrics_req.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <conflux/status.h>
#include <conflux/version.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define METRICS_CONNS_MAX  16   /* scrapers at once */
#define METRICS_TIMEOUT_MS 5000 /* from accept to the last byte of the answer */

struct metrics_conn {
    struct cfx_list link; /* metrics->conns */
    struct coord_metrics *m;
    struct cfx_ev_io io;
    struct cfx_ev_timer timer; /* METRICS_TIMEOUT_MS after accept */
    int fd;
    char peer[48];
    char req[CFX_METRICS_REQ_MAX + 1];
    size_t req_len;
    char *out; /* the answer (malloc'd) once the request is read */
    size_t out_len, out_off;
    int draining; /* answer sent, write side shut: reading to EOF, so that
                                 * unread request bytes do not turn the close into a reset
                                 * that could discard the answer at the client */
    int done;     /* closed; freed in the after-batch hook */
};

struct coord_metrics {
    struct cfx_coord *co;
    int fd; /* listening socket */
    struct cfx_ev_io io;
    char addr[64]; /* "ip:port" bound */
    uint16_t port;
    struct cfx_list conns; /* struct metrics_conn, open */
    struct cfx_list dead;  /* closed, freed after the batch */
    unsigned nconns;
    uint64_t scrapes; /* answers of 200 */
};

/* ---- text ---------------------------------------------------------------- */

struct buf {
    char *p;
    size_t len, cap;
    int oom;
};

static void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        if (b->oom)
            return;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* A label value as the exposition format wants it (\\ and \" escaped).
 * Names and hosts come from peers: a byte outside printable ASCII becomes
 * '?', so that the text stays valid UTF-8 whatever a peer sent. */
static void blabel(struct buf *b, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\' || *p == '"')
            bprintf(b, "\\%c", *p);
        else if (*p < 0x20 || *p > 0x7e)
            bprintf(b, "?");
        else
            bprintf(b, "%c", *p);
    }
}

static void family(struct buf *b, const char *name, const char *type, const char *help)
{
    bprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample without labels under its own family. */
struct scalar {
    const char *name;
    const char *help;
    unsigned long long value;
};

static void scalar(struct buf *b, const char *type, const struct scalar *sc)
{
    family(b, sc->name, type, sc->help);
    bprintf(b, "%s %llu\n", sc->name, sc->value);
}

static unsigned long long node_holdings(const struct coord_node *n)
{
    return n->nholdings;
}

static unsigned long long node_inline_bytes(const struct coord_node *n)
{
    return n->put_bytes;
}

/* A tool's connection (an observer, rdmactl ps) is no member: the per-node
 * families leave it out, as conflux_coord_members does. */
static bool is_member(const struct coord_node *n)
{
    return !(n->rec.flags & CFX_NODE_F_OBSERVER);
}

/* A gauge family with one sample per member, labelled by its node id. */
static void node_gauge(struct buf *b, struct cfx_coord *co, const char *name, const char *help,
                       unsigned long long (*value)(const struct coord_node *))
{
    struct cfx_list *pos;
    family(b, name, "gauge", help);
    cfx_list_for_each(pos, &co->nodes)
    {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (is_member(n))
            bprintf(b, "%s{node=\"%u\"} %llu\n", name, n->rec.node_id, value(n));
    }
}

/* What each live member reported with its last heartbeat (struct cfx_msg_load). */
static void node_reports(struct buf *b, struct cfx_coord *co)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } events[] = {
        { "conflux_coord_node_puts_total", "Objects a member put.",
          offsetof(struct cfx_msg_load, puts) },
        { "conflux_coord_node_gets_total", "Gets a member made that moved data over the data plane.",
          offsetof(struct cfx_msg_load, gets) },
        { "conflux_coord_node_uploads_total", "Transfers a member served to other nodes.",
          offsetof(struct cfx_msg_load, uploads) },
        { "conflux_coord_node_source_failovers_total",
          "Gets a member resumed at another source (a holder died or refused).",
          offsetof(struct cfx_msg_load, failovers) },
        { "conflux_coord_node_reduce_reroutes_total",
          "Object reduces a member drove that routed around a dead node.",
          offsetof(struct cfx_msg_load, reduce_reroutes) },
        { "conflux_coord_node_writes_refused_total",
          "Peers' writes a member refused: outside a live grant (stale key, another peer's, "
          "past the window).",
          offsetof(struct cfx_msg_load, writes_refused) },
    };
    static const struct {
        const char *name, *help;
        int rx;
    } traffic[] = {
        { "conflux_coord_node_transport_sent_bytes_total",
          "Bytes a member handed a transport to send (data-plane messages and chunks).", 0 },
        { "conflux_coord_node_transport_received_bytes_total",
          "Bytes that arrived at a member through a transport.", 1 },
    };
    struct cfx_list *pos;

    for (size_t i = 0; i < sizeof(traffic) / sizeof(traffic[0]); i++) {
        family(b, traffic[i].name, "counter", traffic[i].help);
        cfx_list_for_each(pos, &co->nodes)
        {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            if (!is_member(n))
                continue;
            for (unsigned t = 0; n->rec.alive && t < n->load.ntp && t < CFX_LOAD_TPS_MAX; t++) {
                const struct cfx_load_tp *tp = &n->load.tp[t];
                bprintf(b, "%s{node=\"%u\",transport=\"", traffic[i].name, n->rec.node_id);
                blabel(b, tp->name);
                bprintf(b, "\"} %llu\n",
                        (unsigned long long)(traffic[i].rx ? tp->rx_bytes : tp->tx_bytes));
            }
        }
    }
    /* per peer: the peers each member exchanged the most with (peer="0":
     * the rest of its peers together, beyond its table) */
    for (size_t i = 0; i < sizeof(traffic) / sizeof(traffic[0]); i++) {
        const char *name = traffic[i].rx ? "conflux_coord_node_peer_received_bytes_total"
                                         : "conflux_coord_node_peer_sent_bytes_total";
        family(b, name, "counter", traffic[i].rx
               ? "Bytes that arrived at a member from one peer over one transport (the "
                 "16 peers it exchanged the most with)."
               : "Bytes a member handed a transport for one peer (the 16 peers it exchanged "
                 "the most with).");
        cfx_list_for_each(pos, &co->nodes)
        {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            if (!is_member(n))
                continue;
            for (unsigned k = 0; n->rec.alive && k < n->npeers; k++) {
                const struct cfx_ctl_peer_traffic *p = &n->peers[k];
                if (p->tp >= n->load.ntp || p->tp >= CFX_LOAD_TPS_MAX)
                    continue;
                bprintf(b, "%s{node=\"%u\",peer=\"%u\",transport=\"", name, n->rec.node_id,
                        p->peer);
                blabel(b, n->load.tp[p->tp].name);
                bprintf(b, "\"} %llu\n",
                        (unsigned long long)(traffic[i].rx ? p->rx_bytes : p->tx_bytes));
            }
        }
    }
    family(b, "conflux_coord_node_transfers_active", "gauge",
           "Transfers a member is receiving (in) and serving (out) now.");
    cfx_list_for_each(pos, &co->nodes)
    {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (!n->rec.alive || !is_member(n))
            continue;
        bprintf(b, "conflux_coord_node_transfers_active{node=\"%u\",direction=\"in\"} %u\n",
                n->rec.node_id, n->load.xfers_in_active);
        bprintf(b, "conflux_coord_node_transfers_active{node=\"%u\",direction=\"out\"} %u\n",
                n->rec.node_id, n->load.uploads_active);
    }
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
        family(b, events[i].name, "counter", events[i].help);
        cfx_list_for_each(pos, &co->nodes)
        {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            uint64_t v;
            if (!n->rec.alive || !is_member(n))
                continue;
            memcpy(&v, (const uint8_t *)&n->load + events[i].off, sizeof(v));
            bprintf(b, "%s{node=\"%u\"} %llu\n", events[i].name, n->rec.node_id,
                    (unsigned long long)v);
        }
    }
}

/* The labels of server entry @p srv of @p n's PS report: job, block (when
 * @p block is not negative), server, node. */
static void ps_labels(struct buf *b, const struct coord_node *n, uint32_t srv, int64_t block)
{
    bprintf(b, "{job=\"");
    blabel(b, n->ps.servers[srv].job);
    if (block >= 0)
        bprintf(b, "\",block=\"%lld", (long long)block);
    bprintf(b, "\",server=\"%u\",node=\"%u\"}", n->ps.servers[srv].server, n->rec.node_id);
}

/* Parameter-server load from each live member's last heartbeat: per server,
 * and per block for the CFX_CTL_PS_BLOCKS_MAX blocks with the most bytes. */
static void ps_reports(struct buf *b, struct cfx_coord *co)
{
    static const struct {
        const char *name, *type, *help;
        int what; /* 0 blocks owned, 1 requests, 2 bytes */
    } srv[] = {
        { "conflux_coord_ps_server_blocks", "gauge",
          "Blocks a parameter server's current shard map gives it.", 0 },
        { "conflux_coord_ps_server_requests_total", "counter",
          "Requests (push, pull, push-pull) a parameter server served, all blocks.", 1 },
        { "conflux_coord_ps_server_bytes_total", "counter",
          "Payload bytes (pushed and pulled) of the requests a parameter server served.", 2 },
    };
    struct cfx_list *pos;

    for (size_t i = 0; i < sizeof(srv) / sizeof(srv[0]); i++) {
        family(b, srv[i].name, srv[i].type, srv[i].help);
        cfx_list_for_each(pos, &co->nodes)
        {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            for (uint32_t k = 0; n->rec.alive && k < n->ps.nservers; k++) {
                const struct cfx_ctl_ps_server *s = &n->ps.servers[k];
                bprintf(b, "%s", srv[i].name);
                ps_labels(b, n, k, -1);
                bprintf(b, " %llu\n", srv[i].what == 0   ? (unsigned long long)s->blocks
                                       : srv[i].what == 1 ? (unsigned long long)s->requests
                                                          : (unsigned long long)s->bytes);
            }
        }
    }
    for (int bytes = 0; bytes < 2; bytes++) {
        const char *name = bytes ? "conflux_coord_ps_block_bytes_total"
                                 : "conflux_coord_ps_block_requests_total";
        family(b, name, "counter", bytes
               ? "Payload bytes of the requests a parameter server served on one block (the "
                 "32 blocks with the most bytes on each member)."
               : "Requests a parameter server served on one block (the 32 blocks with the "
                 "most bytes on each member).");
        cfx_list_for_each(pos, &co->nodes)
        {
            struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
            for (uint32_t k = 0; n->rec.alive && k < n->ps.nblocks; k++) {
                const struct cfx_ctl_ps_block *x = &n->ps.blocks[k];
                if (x->srv >= n->ps.nservers)
                    continue;
                bprintf(b, "%s", name);
                ps_labels(b, n, x->srv, x->block);
                bprintf(b, " %llu\n", (unsigned long long)(bytes ? x->bytes : x->requests));
            }
        }
    }
}

/* The exposition of what the coordinator knows now (loop thread). */
static void metrics_text(struct coord_metrics *m, struct buf *b)
{
    struct cfx_coord *co = m->co;
    struct cfx_list *pos;
    uint64_t bytes = 0, inline_n = 0, holders = 0;

    cfx_list_for_each(pos, &co->objects)
    {
        struct coord_obj *o = cfx_list_entry(pos, struct coord_obj, link);
        bytes += o->size;
        inline_n += o->is_inline;
        holders += o->nholders;
    }
    family(b, "conflux_coord_info", "gauge", "Coordinator version and protocol (always 1).");
    bprintf(b, "conflux_coord_info{version=\"%s\",protocol=\"%u\"} 1\n", CFX_VERSION_STRING,
            (unsigned)CFX_PROTO_VERSION);
    family(b, "conflux_coord_uptime_seconds", "gauge", "Seconds since the coordinator started.");
    bprintf(b, "conflux_coord_uptime_seconds %.3f\n", (double)(cfx__now_ns() - co->start_ns) / 1e9);
    /* workers by state, as rdmactl status counts them: a tool's connection
     * (an observer, rdmactl ps) is no member, and is counted apart while
     * it is connected */
    uint32_t alive = 0, dead = 0, left = 0, observers = 0;
    cfx_list_for_each(pos, &co->nodes)
    {
        const struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.flags & CFX_NODE_F_OBSERVER)
            observers += n->rec.alive;
        else if (n->rec.alive)
            alive++;
        else if (n->rec.flags & CFX_NODE_F_LEFT)
            left++;
        else
            dead++;
    }
    family(b, "conflux_coord_members", "gauge",
           "Members by state: alive, dead or left (and still listed); observers apart.");
    bprintf(b, "conflux_coord_members{state=\"alive\"} %u\n", alive);
    bprintf(b, "conflux_coord_members{state=\"dead\"} %u\n", dead);
    bprintf(b, "conflux_coord_members{state=\"left\"} %u\n", left);
    family(b, "conflux_coord_observers", "gauge",
           "Tools' connections joined as observers (rdmactl ps), while connected.");
    bprintf(b, "conflux_coord_observers %u\n", observers);
    const struct scalar gauges[] = {
        { "conflux_coord_objects", "Objects in the directory.", co->nobjects },
        { "conflux_coord_object_bytes", "Sum of the sizes of the objects in the directory.",
          bytes },
        { "conflux_coord_inline_objects", "Objects whose bytes the coordinator holds (inline).",
          inline_n },
        { "conflux_coord_inline_bytes", "Bytes of inline objects the coordinator holds.",
          co->inline_bytes },
        { "conflux_coord_object_holders", "Copies (complete or being received) of all objects.",
          holders },
        { "conflux_coord_lookups_parked", "Lookups waiting for an object to appear.",
          co->nparked },
        { "conflux_coord_buffered_bytes", "Reply bytes queued and input buffer bytes beyond "
          "the first, all connections together (max_buffered).", co->buffered },
    };
    for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
        scalar(b, "gauge", &gauges[i]);
    family(b, "conflux_coord_connections", "gauge",
           "Control connections open, and of those "
           "not yet authenticated.");
    bprintf(b, "conflux_coord_connections{state=\"all\"} %u\n", co->nconns);
    bprintf(b, "conflux_coord_connections{state=\"unauthenticated\"} %u\n", co->nunauth);
    const struct scalar counters[] = {
        { "conflux_coord_state_writes_total",
          "Records written to or removed from the state directory.", co->state_writes },
        { "conflux_coord_metrics_scrapes_total", "Answers of /metrics before this one.",
          m->scrapes },
        { "conflux_coord_secure_refused_total",
          "Clients refused for running with another CFX_SECURE mode.", co->seal_refused },
        { "conflux_coord_seal_failures_total",
          "Connections closed for a frame that failed its CFX_SECURE check (tampered with, "
          "replayed or not sealed).", co->seal_failures },
        { "conflux_coord_conns_refused_total",
          "Connections refused at max_conns.", co->refused_conns },
        { "conflux_coord_conns_evicted_total",
          "Unauthenticated connections closed at max_unauth_conns or max_unauth_per_ip for "
          "a newer one.",
          co->evicted_conns },
        { "conflux_coord_conns_over_budget_total",
          "Connections closed at max_buffered (they held the most bytes).", co->budget_closed },
    };
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
        scalar(b, "counter", &counters[i]);

    uint32_t placed = 0;
    cfx_list_for_each(pos, &co->tasks)
        placed += cfx_list_entry(pos, struct coord_task, link)->state == COORD_TASK_PLACED;
    family(b, "conflux_coord_tasks", "gauge", "Tasks waiting for a node, and placed on one.");
    bprintf(b, "conflux_coord_tasks{state=\"queued\"} %u\n", co->ntasks_queued);
    bprintf(b, "conflux_coord_tasks{state=\"placed\"} %u\n", placed);
    family(b, "conflux_coord_tasks_ended_total", "counter", "Tasks ended, by outcome.");
    bprintf(b, "conflux_coord_tasks_ended_total{status=\"ok\"} %llu\n",
            (unsigned long long)co->tasks_ok);
    bprintf(b, "conflux_coord_tasks_ended_total{status=\"failed\"} %llu\n",
            (unsigned long long)co->tasks_failed);
    family(b, "conflux_coord_node_alive", "gauge", "1 while the member is alive, 0 once dead.");
    cfx_list_for_each(pos, &co->nodes)
    {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (!is_member(n))
            continue;
        bprintf(b, "conflux_coord_node_alive{node=\"%u\",name=\"", n->rec.node_id);
        blabel(b, n->rec.name);
        bprintf(b, "\",host=\"");
        blabel(b, n->rec.host);
        bprintf(b, "\"} %u\n", n->rec.alive ? 1u : 0u);
    }
    node_gauge(b, co, "conflux_coord_node_holdings",
               "Objects a member holds a copy of (or is receiving).", node_holdings);
    node_gauge(b, co, "conflux_coord_node_inline_bytes", "Inline bytes stored for a member's puts.",
               node_inline_bytes);
    /* live members only: a dead one has no load, and its reservations went with it */
    family(b, "conflux_coord_node_load", "gauge",
           "A member's 1-minute load average, from its heartbeats.");
    cfx_list_for_each(pos, &co->nodes)
    {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.alive && is_member(n))
            bprintf(b, "conflux_coord_node_load{node=\"%u\"} %.3f\n", n->rec.node_id,
                    n->load.load_milli / 1000.0);
    }
    node_reports(b, co);
    ps_reports(b, co);
    family(b, "conflux_coord_node_task_reservations", "gauge",
           "Reservations (placed tasks and placement queries) on a member that offers tasks.");
    cfx_list_for_each(pos, &co->nodes)
    {
        struct coord_node *n = cfx_list_entry(pos, struct coord_node, link);
        if (n->rec.alive && n->worker)
            bprintf(b, "conflux_coord_node_task_reservations{node=\"%u\"} %u\n",
                    n->rec.node_id, n->worker->nres);
    }
}

/* ---- HTTP ---------------------------------------------------------------- */

static void conn_close(struct metrics_conn *c)
{
    if (c->done)
        return;
    c->done = 1;
    cfx__ev_io_stop(c->m->co->loop, &c->io);
    cfx__ev_timer_stop(c->m->co->loop, &c->timer);
    close(c->fd);
    c->fd = -1;
    cfx_list_del(&c->link);
    cfx_list_add_tail(&c->link, &c->m->dead);
    c->m->nconns--;
}

/* The answer to a HEAD (@p head) has the GET's Content-Length and no body. */
static void answer_as(struct metrics_conn *c, int code, const char *reason, const char *ctype,
                      const char *body, size_t body_len, bool head)
{
    struct buf b = { 0 };
    bprintf(&b,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: close\r\nCache-Control: no-store\r\n%s\r\n",
            code, reason, ctype, body_len, code == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (!b.oom && body_len && !head) {
        bprintf(&b, "%.*s", (int)body_len, body);
    }
    if (b.oom) {
        free(b.p);
        CFX_LOG(ERR, CTL, "metrics %s: out of memory for the answer", c->peer);
        conn_close(c);
        return;
    }
    c->out = b.p;
    c->out_len = b.len;
    c->out_off = 0;
    cfx__ev_io_set(c->m->co->loop, &c->io, CFX_EV_WRITE);
}

static void answer(struct metrics_conn *c, int code, const char *reason, const char *ctype,
                   const char *body, size_t body_len)
{
    answer_as(c, code, reason, ctype, body, body_len, false);
}

/* Answer the request whose head cfx__coord_metrics_req_parse() judged @p code. */
static void on_request(struct metrics_conn *c, int code, bool head)
{
    static const char text[] = "text/plain; charset=utf-8";
    static const char prom[] = "text/plain; version=0.0.4; charset=utf-8";

    switch (code) {
    case 400: answer(c, 400, "Bad Request", text, "bad request\n", 12); return;
    case 405: answer(c, 405, "Method Not Allowed", text, "only GET and HEAD\n", 18); return;
    case 404: answer(c, 404, "Not Found", text, "only /metrics\n", 14); return;
    case 431:
        answer(c, 431, "Request Header Fields Too Large", text, "request too large\n", 18);
        return;
    }
    struct buf b = { 0 };
    metrics_text(c->m, &b);
    if (b.oom) {
        free(b.p);
        answer(c, 503, "Service Unavailable", text, "out of memory\n", 14);
        return;
    }
    c->m->scrapes++;
    answer_as(c, 200, "OK", prom, b.p, b.len, head);
    free(b.p);
}

static void on_conn_io(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned events)
{
    struct metrics_conn *c = io->arg;
    (void)loop;
    (void)events;
    if (c->done)
        return;
    if (c->draining) {
        char sink[4096];
        ssize_t r = read(c->fd, sink, sizeof(sink));
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            conn_close(c);
        return; /* bounded by the connection's timer */
    }
    if (!c->out) {
        ssize_t r = read(c->fd, c->req + c->req_len, CFX_METRICS_REQ_MAX - c->req_len);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (r <= 0) {
            conn_close(c);
            return;
        }
        c->req_len += (size_t)r;
        c->req[c->req_len] = '\0';
        bool head;
        int code = cfx__coord_metrics_req_parse(c->req, c->req_len, &head);
        if (code)
            on_request(c, code, head);
        return;
    }
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN)
            return;
        if (w <= 0) {
            conn_close(c);
            return;
        }
        c->out_off += (size_t)w;
    }
    shutdown(c->fd, SHUT_WR);
    c->draining = 1;
    cfx__ev_io_set(c->m->co->loop, &c->io, CFX_EV_READ);
}

static void on_conn_timeout(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    struct metrics_conn *c = t->arg;
    (void)loop;
    if (!c->draining)
        CFX_LOG(INFO, CTL, "metrics %s: no complete exchange within %d ms: closed", c->peer,
                METRICS_TIMEOUT_MS);
    conn_close(c);
}

static void on_accept(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned events)
{
    struct coord_metrics *m = io->arg;
    (void)events;
    for (;;) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof(sa);
        int fd = accept4(m->fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR)
                CFX_LOG(WARN, CTL, "metrics %s: accept: %s", m->addr, strerror(errno));
            return;
        }
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
        if (m->nconns >= METRICS_CONNS_MAX) {
            CFX_LOG(WARN, CTL, "metrics %s: %u scrapers connected already: refused %s:%u", m->addr,
                    m->nconns, ip, ntohs(sa.sin_port));
            close(fd);
            continue;
        }
        struct metrics_conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->m = m;
        c->fd = fd;
        snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, ntohs(sa.sin_port));
        cfx_list_add_tail(&c->link, &m->conns);
        m->nconns++;
        cfx__ev_timer_init(&c->timer, on_conn_timeout, c);
        cfx__ev_timer_start(loop, &c->timer,
                            cfx__now_ns() + (uint64_t)METRICS_TIMEOUT_MS * 1000000ull);
        if (cfx__ev_io_start(loop, &c->io, fd, CFX_EV_READ, on_conn_io, c) != CFX_OK)
            conn_close(c);
    }
}

/* ---- life ---------------------------------------------------------------- */

int cfx__coord_metrics_start(struct cfx_coord *co, const char *hostport, struct coord_metrics **out)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    int one = 1, rc;

    *out = NULL;
    rc = cfx__parse_hostport(hostport, &sa);
    if (rc != CFX_OK && strrchr(hostport, ':') && !strcmp(strrchr(hostport, ':'), ":0")) {
        /* port 0: an ephemeral one (tests) */
        char host[64];
        snprintf(host, sizeof(host), "%.*s:1", (int)(strrchr(hostport, ':') - hostport), hostport);
        rc = cfx__parse_hostport(host, &sa);
        sa.sin_port = 0;
    }
    if (rc != CFX_OK)
        return cfx__err(rc, "metrics address '%s': %s", hostport, cfx_last_error());
    struct coord_metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return cfx__err(CFX_ERR_NOMEM, "no memory for the metrics endpoint");
    m->co = co;
    cfx_list_init(&m->conns);
    cfx_list_init(&m->dead);
    m->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (m->fd < 0) {
        rc = cfx__err(cfx__status_from_errno(errno), "metrics socket: %s", strerror(errno));
        goto err_free;
    }
    setsockopt(m->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(m->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(m->fd, 16) < 0 ||
        getsockname(m->fd, (struct sockaddr *)&sa, &sl) < 0) {
        int e = errno;
        rc = cfx__err(cfx__status_from_errno(e), "metrics endpoint cannot listen on %s: %s",
                      hostport, strerror(e));
        goto err_close;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    m->port = ntohs(sa.sin_port);
    snprintf(m->addr, sizeof(m->addr), "%s:%u", ip, m->port);
    rc = cfx__ev_io_start(co->loop, &m->io, m->fd, CFX_EV_READ, on_accept, m);
    if (rc != CFX_OK)
        goto err_close;
    CFX_LOG(INFO, CTL, "metrics on http://%s/metrics (readable by whoever can connect)", m->addr);
    *out = m;
    return CFX_OK;

err_close:
    close(m->fd);
err_free:
    free(m);
    return rc;
}

/* Free the connections closed during the batch (after-batch hook). */
void cfx__coord_metrics_reap(struct coord_metrics *m)
{
    if (!m)
        return;
    while (!cfx_list_empty(&m->dead)) {
        struct metrics_conn *c = cfx_list_entry(m->dead.next, struct metrics_conn, link);
        cfx_list_del(&c->link);
        free(c->out);
        free(c);
    }
}

void cfx__coord_metrics_stop(struct coord_metrics *m)
{
    if (!m)
        return;
    while (!cfx_list_empty(&m->conns))
        conn_close(cfx_list_entry(m->conns.next, struct metrics_conn, link));
    cfx__coord_metrics_reap(m);
    cfx__ev_io_stop(m->co->loop, &m->io);
    close(m->fd);
    free(m);
}

uint16_t cfx__coord_metrics_port(const struct cfx_coord *coord)
{
    return coord && coord->metrics ? coord->metrics->port : 0;
}

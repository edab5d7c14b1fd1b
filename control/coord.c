/*
 * The coordinator: listening socket, connections (non-blocking, one input
 * buffer and one output queue each), authentication and message dispatch.
 * Membership lives in coord_members.c, the object directory in
 * coord_directory.c.  Everything runs on one event-loop thread.
 *
 * Connections are never closed from inside a callback: cfx__coord_conn_fail()
 * moves them to coord->closing and the after-batch hook closes them.  So a
 * reply that fails to send, or a node death that fans out events, cannot
 * free a connection that a caller up the stack is still using.
 */
#include "control/coord_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include <conflux/status.h>
#include <conflux/version.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define IN_BUF_INITIAL (16u * 1024)

/* Bytes @p c holds that count against max_buffered: replies queued, and its
 * input buffer beyond the first size (every connection has that much). */
static uint64_t conn_held(const struct coord_conn *c)
{
    return (uint64_t)c->out_bytes + (c->in_cap > IN_BUF_INITIAL ? c->in_cap - IN_BUF_INITIAL : 0);
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

/* Ask the loop for what @p c waits on: its requests unless paused, and
 * writability while replies are queued. */
static void conn_want(struct coord_conn *c)
{
    unsigned ev = c->out_paused ? 0 : CFX_EV_READ;
    if (!cfx_list_empty(&c->outq))
        ev |= CFX_EV_WRITE;
    cfx__ev_io_set(c->coord->loop, &c->io, ev);
}

static void conn_flush(struct coord_conn *c)
{
    struct cfx_coord *co = c->coord;

    while (!cfx_list_empty(&c->outq)) {
        struct coord_frame *f = cfx_list_entry(c->outq.next, struct coord_frame, link);
        ssize_t n = send(c->fd, f->data + f->off, f->len - f->off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            CFX_LOG(INFO, CTL, "connection %s: send: %s", c->peer, strerror(errno));
            c->send_failed = 1;
            cfx__coord_conn_fail(c);
            return;
        }
        f->off += (size_t)n;
        c->out_bytes -= (size_t)n;
        /* a paused member's heartbeats wait unread behind its requests:
         * while it takes our replies it is alive (it is declared dead only
         * when nothing drained for dead_after_ms) */
        if (c->out_paused && c->node)
            c->node->last_seen_ns = cfx__now_ns();
        if (!c->failing)
            co->buffered -= (uint64_t)n;
        if (f->off == f->len) {
            cfx_list_del(&f->link);
            free(f);
        }
    }
    if (c->out_paused && c->out_bytes <= COORD_OUTQ_PAUSE / 2) {
        /* Its replies drained (half the mark: no flapping on every frame):
         * its requests are read again, first those already in in[] (parsed
         * from the resume timer, not from here: a send to it may come from
         * deep inside another connection's dispatch). */
        c->out_paused = 0;
        if (c->in_len && !c->parse_deferred) {
            c->parse_deferred = 1;
            cfx__ev_timer_start(co->loop, &c->resume, cfx__now_ns());
        }
    }
    conn_want(c);
    if (cfx_list_empty(&c->outq) && c->close_after_flush)
        cfx__coord_conn_fail(c);
}

bool cfx__coord_conn_draining(struct coord_conn *c)
{
    int q = 0;
    if (!c->out_paused || c->failing || ioctl(c->fd, SIOCOUTQ, &q) < 0)
        return false;
    bool took = q < c->outq_seen;
    c->outq_seen = q;
    return took;
}

void cfx__coord_send(struct coord_conn *c, const struct cfx_msg *m)
{
    if (c->failing)
        return;
    size_t len = cfx__msg_encoded_len(m) + cfx__ctl_seal_overhead(&c->seal);
    struct coord_frame *f = malloc(sizeof(*f) + len);
    if (!f) {
        CFX_LOG(ERR, CTL, "connection %s: no memory for a %zu byte %s reply; closing it",
                c->peer, len, cfx__msg_type_name(m->type));
        cfx__coord_conn_fail(c);
        return;
    }
    int rc = cfx__msg_encode(m, f->data, len, &f->len);
    if (rc != CFX_OK) {
        /* Our own message is malformed: a bug, not the peer's fault. */
        CFX_LOG(ERR, CTL, "connection %s: cannot encode %s: %s", c->peer,
                cfx__msg_type_name(m->type), cfx_last_error());
        free(f);
        return;
    }
    /* sealed as queued: the loop's order is the wire's (the record counter) */
    rc = cfx__ctl_seal_frame(&c->seal, f->data, f->len, len, &f->len);
    if (rc != CFX_OK) {
        CFX_LOG(ERR, CTL, "connection %s: cannot seal %s: %s; closing it", c->peer,
                cfx__msg_type_name(m->type), cfx_last_error());
        free(f);
        cfx__coord_conn_fail(c);
        return;
    }
    f->off = 0;
    if (c->out_bytes + f->len > c->coord->max_conn_outq) {
        CFX_LOG(WARN, CTL, "connection %s: %zu reply bytes queued and not read: "
                "max_conn_outq (%llu B) reached; closing it as too slow", c->peer,
                c->out_bytes, (unsigned long long)c->coord->max_conn_outq);
        free(f);
        cfx__coord_conn_fail(c);
        return;
    }
    int was_empty = cfx_list_empty(&c->outq);
    cfx_list_add_tail(&f->link, &c->outq);
    c->out_bytes += f->len;
    c->coord->buffered += f->len; /* max_buffered is checked after the batch (budget_check) */
    if (was_empty)
        conn_flush(c);
}

void cfx__coord_reply_ok(struct coord_conn *c, uint64_t req_id)
{
    struct cfx_msg m = { .type = CFX_MSG_OK, .req_id = req_id };
    cfx__coord_send(c, &m);
}

void cfx__coord_reply_err(struct coord_conn *c, uint64_t req_id, int status, const char *fmt, ...)
{
    struct cfx_msg m = { .type = CFX_MSG_ERROR, .req_id = req_id };
    va_list ap;
    m.u.error.status = status;
    va_start(ap, fmt);
    vsnprintf(m.u.error.text, sizeof(m.u.error.text), fmt, ap);
    va_end(ap);
    CFX_LOG(DEBUG, CTL, "connection %s: request %llu failed: %s: %s", c->peer,
            (unsigned long long)req_id, cfx_errname(status), m.u.error.text);
    cfx__coord_send(c, &m);
}

/* ------------------------------------------------------------------------ */
/* Connection lifetime                                                       */

/* Source-address hash bucket of @p ip, keyed at random at start so that a
 * peer cannot choose addresses that share one. */
static struct cfx_list *ip_bucket(struct cfx_coord *co, uint32_t ip)
{
    uint64_t h = ((uint64_t)ip ^ co->ip_key[0]) * (co->ip_key[1] | 1);
    return &co->unauth_ip[(h >> 32) & (COORD_UNAUTH_BUCKETS - 1)];
}

/* Connections from @p ip not yet authenticated. */
static uint32_t unauth_from(struct cfx_coord *co, uint32_t ip)
{
    struct cfx_list *pos, *b = ip_bucket(co, ip);
    uint32_t n = 0;
    cfx_list_for_each(pos, b)
        n += cfx_list_entry(pos, struct coord_conn, ip_link)->ip == ip;
    return n;
}

static void unauth_add(struct cfx_coord *co, struct coord_conn *c)
{
    c->unauth = 1;
    co->nunauth++;
    cfx_list_add_tail(&c->unauth_link, &co->unauth);
    cfx_list_add_tail(&c->ip_link, ip_bucket(co, c->ip));
}

/* @p c no longer waits to authenticate: it did, or it is going. */
static void unauth_drop(struct cfx_coord *co, struct coord_conn *c)
{
    if (!c->unauth)
        return;
    c->unauth = 0;
    co->nunauth--;
    cfx_list_del(&c->unauth_link);
    cfx_list_del(&c->ip_link);
}

/* A failing connection stops counting against the caps at once, not when
 * the hook closes it: an eviction makes room for the connection accepted
 * next in the same batch, and max_buffered is not met again by bytes that
 * are about to be freed. */
void cfx__coord_conn_fail(struct coord_conn *c)
{
    if (c->failing)
        return;
    c->coord->buffered -= conn_held(c);
    unauth_drop(c->coord, c);
    c->failing = 1;
    cfx_list_del(&c->link);
    cfx_list_add_tail(&c->link, &c->coord->closing);
}

static void conn_free(struct coord_conn *c)
{
    struct cfx_list *pos, *tmp;
    /* its node queries still waiting for a rejoin (a coordinator stopped
     * in the window): their list head goes with it */
    cfx__coord_members_conn_gone(c->coord, c);
    cfx__ev_timer_stop(c->coord->loop, &c->resume);
    cfx_list_for_each_safe(pos, tmp, &c->outq) {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct coord_frame, link));
    }
    if (c->fd >= 0)
        close(c->fd);
    cfx__ctl_seal_stop(&c->seal);
    free(c->in);
    free(c);
}

/*
 * A send to member @p c failed: the peer reset the connection, as a process
 * does that closes its socket with our events unread in it.  What the peer
 * sent before the reset is still readable, and its goodbye may be there,
 * unread only because the send came first.  A member that said goodbye left;
 * it did not die, and its peers must not be told it did.  Only LEAVE is
 * looked for (nothing else can be answered now), within the input buffer.
 */
static void read_goodbye(struct cfx_coord *co, struct coord_conn *c)
{
    size_t off = 0;

    for (;;) {
        while (c->in_len - off >= CFX_PROTO_HDR_LEN) {
            struct cfx_msg_hdr h;
            struct cfx_msg m;
            if (cfx__ctl_hdr_decode(&c->seal, c->in + off, c->in_len - off, &h) != CFX_OK)
                return;
            size_t need = CFX_PROTO_HDR_LEN + (size_t)h.payload_len, len;
            if (need > c->in_cap)
                return;
            if (c->in_len - off < need)
                break;
            if (cfx__ctl_open_frame(&c->seal, c->in + off, need, &len) != CFX_OK ||
                cfx__msg_decode(c->in + off, len, &m) != CFX_OK)
                return;
            off += need;
            if (m.type == CFX_MSG_LEAVE) {
                CFX_LOG(DEBUG, CTL, "connection %s: a goodbye before the reset", c->peer);
                cfx__coord_leave(co, c);
                return;
            }
        }
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
        off = 0;
        if (c->in_len == c->in_cap)
            return;
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (n <= 0)
            return;
        c->in_len += (size_t)n;
    }
}

/* Close a failed connection: its node (if any) dies, its lookups go. */
static void conn_close(struct cfx_coord *co, struct coord_conn *c)
{
    cfx__ev_io_stop(co->loop, &c->io);
    if (c->node && c->send_failed && c->state == COORD_CONN_NODE)
        read_goodbye(co, c);
    cfx__coord_dir_conn_gone(co, c);
    cfx__coord_task_conn_gone(co, c);
    cfx__coord_members_conn_gone(co, c);
    if (c->node) {
        struct coord_node *n = c->node;
        cfx__coord_node_kill(co, n, "its connection closed");
    }
    cfx_list_del(&c->link);
    co->nconns--;
    CFX_LOG(DEBUG, CTL, "connection %s closed", c->peer);
    conn_free(c);
}

/*
 * Over max_buffered: the connection holding the most (replies it does not
 * read, a large frame on its way) is closed, then the next, until under.
 * The one that holds the most is the one that costs the most, whoever queued
 * the last byte.  Checked after the batch, not where bytes are queued: a
 * fan-out may be walking the connections then, and a batch adds at most a
 * few replies per connection (COORD_OUTQ_PAUSE) beyond the budget.
 */
static void budget_check(struct cfx_coord *co)
{
    while (co->buffered > co->max_buffered) {
        struct coord_conn *big = NULL;
        struct cfx_list *pos;
        uint64_t most = 0;
        cfx_list_for_each(pos, &co->conns) {
            struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, link);
            if (conn_held(c) > most) {
                most = conn_held(c);
                big = c;
            }
        }
        if (!big)
            break; /* not reached: what is counted belongs to an open connection */
        CFX_LOG(WARN, CTL, "closing %s: it holds %zu reply bytes it has not read and a %zu byte "
                "input buffer, the most of any connection, and all of them together %llu: "
                "max_buffered (%llu B) reached", big->peer, big->out_bytes, big->in_cap,
                (unsigned long long)co->buffered, (unsigned long long)co->max_buffered);
        co->budget_closed++;
        cfx__coord_conn_fail(big);
    }
}

/* After every batch: enforce max_buffered, close what failed.  Closing may
 * fail more connections (a node_dead event that cannot be sent) and queue
 * more bytes, so go on until nothing is left to close. */
static void after_batch(struct cfx_ev_loop *loop, void *arg)
{
    struct cfx_coord *co = arg;
    (void)loop;
    budget_check(co);
    while (!cfx_list_empty(&co->closing)) {
        while (!cfx_list_empty(&co->closing)) {
            struct coord_conn *c = cfx_list_entry(co->closing.next, struct coord_conn, link);
            conn_close(co, c);
        }
        budget_check(co);
    }
    cfx__coord_metrics_reap(co->metrics);
}

/* Close @p c once what is queued for it (an error reply) has been written. */
static void conn_close_after_flush(struct coord_conn *c)
{
    c->close_after_flush = 1;
    if (cfx_list_empty(&c->outq))
        cfx__coord_conn_fail(c);
}

/* ------------------------------------------------------------------------ */
/* Authentication and dispatch                                               */

static void handle_auth(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_msg r = { .type = CFX_MSG_AUTH_OK, .req_id = m->req_id };
    const uint8_t role = m->u.auth.role;
    uint8_t bind[CFX_CTL_BIND_LEN];

    /* The client proves the token first; nothing derived from it goes back
     * to a peer whose proof failed (only the refusal).  Its MAC covers its
     * role and its CFX_SECURE mode (control/auth.h, ctl_seal.h). */
    cfx__ctl_auth_bind(role, m->u.auth.secure, bind);
    if (cfx__auth_verify_bound(co->token, CFX_AUTH_CLIENT, c->nonce, m->u.auth.nonce, bind,
                               sizeof(bind), m->u.auth.mac) != CFX_OK) {
        CFX_LOG(WARN, CTL, "refused %s: wrong cluster token", c->peer);
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_AUTH,
                             "coordinator %s refused the cluster token", co->addr);
        conn_close_after_flush(c);
        return;
    }
    /* The mode it proved is its own: refused unless it is ours (no side is
     * talked down to a weaker one). */
    if (m->u.auth.secure != co->secure) {
        co->seal_refused++;
        CFX_LOG(WARN, CTL, "refused %s: it runs with CFX_SECURE=%s, this coordinator with %s",
                c->peer, cfx__seal_mode_name(m->u.auth.secure), cfx__seal_mode_name(co->secure));
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_AUTH, "the coordinator %s runs with "
                             "CFX_SECURE=%s, this client with %s", co->addr,
                             cfx__seal_mode_name(co->secure),
                             cfx__seal_mode_name(m->u.auth.secure));
        conn_close_after_flush(c);
        return;
    }
    if (cfx__auth_mac_bound(co->token, CFX_AUTH_COORD, c->nonce, m->u.auth.nonce, bind,
                            sizeof(bind), r.u.auth_ok.mac) != CFX_OK) {
        CFX_LOG(ERR, CTL, "connection %s: %s", c->peer, cfx_last_error());
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_INTERNAL, "coordinator cannot compute its MAC");
        conn_close_after_flush(c);
        return;
    }
    c->state = COORD_CONN_READY;
    unauth_drop(co, c);
    c->role = m->u.auth.role;
    CFX_LOG(DEBUG, CTL, "connection %s authenticated as %s (CFX_SECURE=%s)", c->peer,
            c->role == CFX_CTL_ROLE_ADMIN ? "admin" : "node", cfx__seal_mode_name(co->secure));
    cfx__coord_send(c, &r);
    /* AUTH_OK went plain; every frame after it, both ways, is sealed */
    if (!c->failing &&
        cfx__ctl_seal_start(&c->seal, co->secure, co->token, c->nonce, m->u.auth.nonce, role,
                            false) != CFX_OK) {
        CFX_LOG(ERR, CTL, "closing %s: cannot set up its sealing keys: %s", c->peer,
                cfx_last_error());
        cfx__coord_conn_fail(c);
    }
}

static void handle_status(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    struct cfx_msg r = { .type = CFX_MSG_STATUS_REPLY, .req_id = m->req_id };
    struct cfx_ctl_status *s = &r.u.status;
    s->proto_version = CFX_PROTO_VERSION;
    s->uptime_ms = (cfx__now_ns() - co->start_ns) / 1000000ull;
    s->nodes_alive = co->nodes_alive;
    s->nodes_dead = co->nodes_dead - co->nodes_left; /* a member that left did not die */
    s->objects = co->nobjects;
    s->inline_bytes = co->inline_bytes;
    s->heartbeat_ms = co->heartbeat_ms;
    s->dead_after_ms = co->dead_after_ms;
    s->node_index_slots = co->by_id_cap;
    s->node_records = co->by_id_count;
    snprintf(s->version, sizeof(s->version), "%s", CFX_VERSION_STRING);
    cfx__coord_send(c, &r);
}

/*
 * A JOIN naming an id of before a restart, at a coordinator without a state
 * directory.  Such a coordinator has no record of the ids it gave before,
 * so cfx__coord_join() would grant none and number every node afresh from
 * 1, in the order they reconnect: node 2 of before could come back as 3,
 * and another as 2.  Hints that name a node by its id of before (a task's
 * repeat names the node it ran on) then pointed at the wrong process.  A
 * JOIN naming an id that comes first, before this coordinator gave any id,
 * within the rejoin window after its start, shows that it is a restarted
 * one: from then until the window ends every id below
 * COORD_STATELESS_IDS_MAX counts as one of before, so a node gets its own
 * id back when no record holds it and nobody took it back already
 * (cfx__coord_join), and fresh ids continue above the highest id taken
 * back.  No id given in this life can be taken (none was given before the
 * first), and the cap bounds how far a member can push the ids up; a JOIN
 * that names an id after a fresh one was given gets a fresh one, as with a
 * state directory (a client cannot choose its id).  What cannot be known
 * without the state directory: a node that joins afresh before the first
 * rejoin (restart mode then never opens), or above the highest id taken
 * back so far, may get an id a node of before still holds; that node then
 * gets a new one.  So any JOIN naming an id in the window marks the ids as
 * possibly of before (co->ids_of_before), and task repeats then trust a
 * hint only for a node that took its id back (coord_node.rejoined): a task
 * still never runs twice for a shuffled id.
 */
static void stateless_rejoin(struct cfx_coord *co, const struct cfx_msg *m)
{
    uint64_t window = (uint64_t)cfx__coord_rejoin_ms(co) * 1000000ull;
    uint64_t now = cfx__now_ns();

    if (co->state_dirfd >= 0 || !m->u.join.node_id || now - co->start_ns >= window)
        return;
    co->ids_of_before = 1;
    if (co->restart_mark || co->next_node_id != 1)
        return;
    co->restart_mark = COORD_STATELESS_IDS_MAX;
    co->rejoin_until_ns = co->start_ns + window;
    CFX_LOG(INFO, CTL, "coordinator %s: node %u of before a restart rejoins; without a state "
            "directory, nodes get their ids of before back when free for %llu ms more",
            co->addr, m->u.join.node_id,
            (unsigned long long)((co->rejoin_until_ns - now) / 1000000ull));
}

static void dispatch(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m)
{
    if (c->node)
        c->node->last_seen_ns = cfx__now_ns();

    switch (m->type) {
    case CFX_MSG_JOIN:
        if (c->role != CFX_CTL_ROLE_NODE)
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID,
                                 "an admin connection cannot join the cluster");
        else if (c->state == COORD_CONN_NODE)
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_EXISTS,
                                 "this connection already joined as node %u",
                                 c->node->rec.node_id);
        else {
            stateless_rejoin(co, m);
            cfx__coord_join(co, c, m);
            if (c->node && m->u.join.node_id && c->node->rec.node_id == m->u.join.node_id)
                c->node->rejoined = 1;
        }
        break;
    case CFX_MSG_LEAVE:
        if (c->state == COORD_CONN_NODE)
            cfx__coord_leave(co, c);
        break;
    case CFX_MSG_HEARTBEAT:
        if (c->node) {
            c->node->load = m->u.hb.load;
            c->node->npeers = CFX_MIN(m->u.hb.npeers, CFX_CTL_PEERS_MAX);
            memcpy(c->node->peers, m->u.hb.peers, sizeof(c->node->peers));
            c->node->ps = m->u.hb.ps; /* bounded and checked by the decoder */
            cfx__coord_dir_progress(co, c->node, &m->u.hb);
        }
        break;
    case CFX_MSG_TASK_REG:
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_TASK_DONE:
    case CFX_MSG_TASK_ANNOUNCE:
        if (c->state != COORD_CONN_NODE) {
            if (m->type != CFX_MSG_TASK_DONE)
                cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID,
                                     "%s needs a joined node; this connection is not one",
                                     cfx__msg_type_name(m->type));
        } else if (m->type == CFX_MSG_TASK_REG) {
            cfx__coord_task_reg(co, c, m);
        } else if (m->type == CFX_MSG_TASK_SUBMIT) {
            cfx__coord_task_submit(co, c, m);
        } else if (m->type == CFX_MSG_TASK_PLACE) {
            cfx__coord_task_place(co, c, m);
        } else if (m->type == CFX_MSG_TASK_WAIT) {
            cfx__coord_task_wait(co, c, m);
        } else if (m->type == CFX_MSG_TASK_ANNOUNCE) {
            cfx__coord_task_announce(co, c, m);
        } else {
            cfx__coord_task_done(co, c, m);
        }
        break;
    case CFX_MSG_OBJ_GONE_ACK: /* no reply */
        if (c->state == COORD_CONN_NODE)
            cfx__coord_obj_gone_ack(co, c, m);
        break;
    case CFX_MSG_STATUS:
        handle_status(co, c, m);
        break;
    case CFX_MSG_NODE_GET:
        cfx__coord_node_get(co, c, m);
        break;
    case CFX_MSG_NODES:
        cfx__coord_nodes_list(co, c, m);
        break;
    case CFX_MSG_TASKS:
        cfx__coord_tasks_list(co, c, m);
        break;
    case CFX_MSG_PS_LOADS:
        cfx__coord_ps_loads_list(co, c, m);
        break;
    case CFX_MSG_OBJECTS:
        cfx__coord_objects_list(co, c, m);
        break;
    case CFX_MSG_OBJ_PUT:
    case CFX_MSG_OBJ_LOOKUP:
    case CFX_MSG_OBJ_DONE:
    case CFX_MSG_OBJ_DELETE:
        if (c->state != COORD_CONN_NODE)
            cfx__coord_reply_err(c, m->req_id, CFX_ERR_INVALID,
                                 "%s needs a joined node; this connection is not one",
                                 cfx__msg_type_name(m->type));
        else if (m->type == CFX_MSG_OBJ_PUT)
            cfx__coord_obj_put(co, c, m);
        else if (m->type == CFX_MSG_OBJ_LOOKUP)
            cfx__coord_obj_lookup(co, c, m);
        else if (m->type == CFX_MSG_OBJ_DONE)
            cfx__coord_obj_done(co, c, m);
        else
            cfx__coord_obj_delete(co, c, m);
        break;
    default:
        cfx__coord_reply_err(c, m->req_id, CFX_ERR_PROTO, "a client may not send %s",
                             cfx__msg_type_name(m->type));
        break;
    }
}

/* One whole frame of @p len bytes as it came (opened in place when sealed). */
static void handle_frame(struct cfx_coord *co, struct coord_conn *c, uint8_t *buf, size_t len)
{
    struct cfx_msg m;
    int rc = cfx__ctl_open_frame(&c->seal, buf, len, &len);

    if (rc != CFX_OK) {
        /* tampered, replayed, reordered or plain: nothing of it is read */
        co->seal_failures++;
        CFX_LOG(WARN, CTL, "closing %s: a frame failed its CFX_SECURE=%s check (%s): "
                "tampered with, replayed or not sealed", c->peer,
                cfx__seal_mode_name(c->seal.mode), cfx_errname(rc));
        cfx__coord_conn_fail(c);
        return;
    }
    rc = cfx__msg_decode(buf, len, &m);

    if (c->state == COORD_CONN_AUTH) {
        if (rc != CFX_OK || m.type != CFX_MSG_AUTH) {
            CFX_LOG(WARN, CTL, "closing %s: %s before authenticating", c->peer,
                    rc != CFX_OK ? cfx_last_error() : cfx__msg_type_name(m.type));
            cfx__coord_conn_fail(c);
            return;
        }
        handle_auth(co, c, &m);
        return;
    }
    if (rc != CFX_OK) {
        /* The framing is intact (the header was valid), so say why and go on. */
        CFX_LOG(WARN, CTL, "connection %s: %s", c->peer, cfx_last_error());
        struct cfx_msg_hdr h;
        uint64_t req_id = cfx__msg_hdr_decode(buf, len, &h) == CFX_OK ? h.req_id : 0;
        cfx__coord_reply_err(c, req_id, rc, "coordinator %s: %s", co->addr, cfx_last_error());
        return;
    }
    dispatch(co, c, &m);
}

/* Requests whose answer walks a list as long as the members or the tasks
 * (coord_members.c, coord_task.c); OBJECTS seeks its cursor in an index. */
static bool frame_walks(uint8_t type)
{
    return type == CFX_MSG_NODES || type == CFX_MSG_PS_LOADS || type == CFX_MSG_TASKS;
}

/* Consume every complete frame in the input buffer. */
static void conn_parse(struct cfx_coord *co, struct coord_conn *c)
{
    size_t off = 0;

    c->frame_need = 0;
    while (!c->failing && !c->close_after_flush && c->in_len - off >= CFX_PROTO_HDR_LEN) {
        struct cfx_msg_hdr h;
        if (c->out_bytes > COORD_OUTQ_PAUSE) {
            /* Its replies are not being read: its further requests wait
             * unread (in[], then the socket buffers fill and the peer's
             * sends block) until they drain (conn_flush), so that requests
             * cannot make us queue replies without bound. */
            c->out_paused = 1;
            c->outq_seen = INT_MAX; /* the first look counts as progress */
            conn_want(c);
            break;
        }
        int rc = cfx__ctl_hdr_decode(&c->seal, c->in + off, c->in_len - off, &h);
        if (rc != CFX_OK) {
            /* Framing is lost: nothing after this can be trusted. */
            CFX_LOG(WARN, CTL, "closing %s: %s", c->peer, cfx_last_error());
            if (c->seal.mode != CFX_SEAL_OFF)
                co->seal_failures++; /* a plain frame where a sealed one was due */
            if (rc == CFX_ERR_VERSION && c->state == COORD_CONN_AUTH) {
                cfx__coord_reply_err(c, h.req_id, CFX_ERR_VERSION,
                                     "coordinator %s speaks protocol version %u", co->addr,
                                     CFX_PROTO_VERSION);
                conn_close_after_flush(c);
            } else {
                cfx__coord_conn_fail(c);
            }
            break;
        }
        if (c->state == COORD_CONN_AUTH && h.payload_len > COORD_PREAUTH_MAX) {
            /* Only AUTH may come first, and it is small: an unauthenticated
             * peer must not make us buffer a megabyte. */
            CFX_LOG(WARN, CTL, "closing %s: %u byte %s frame before authenticating", c->peer,
                    h.payload_len, cfx__msg_type_name(h.type));
            cfx__coord_conn_fail(c);
            break;
        }
        size_t need = CFX_PROTO_HDR_LEN + (size_t)h.payload_len;
        if (c->in_len - off < need) {
            c->frame_need = need; /* the buffer grows as its bytes come (below) */
            break;
        }
        uint64_t writes = co->state_writes;
        bool walk = c->state != COORD_CONN_AUTH && frame_walks(h.type);
        handle_frame(co, c, c->in + off, need);
        off += need;
        /*
         * A frame that wrote to the disk (a durable put: two fsyncs), or a
         * listing that walked the members or tasks (its reply may be a few
         * bytes, so the reply pause does not bound them), ends this
         * connection's turn: the rest of its frames wait for the next loop
         * iteration, after every other connection's input, so one client's
         * burst of them cannot keep heartbeats unread (at most one disk
         * write or walk per connection per iteration).
         */
        if ((co->state_writes != writes || walk) && c->in_len - off >= CFX_PROTO_HDR_LEN &&
            !c->failing && !c->close_after_flush) {
            co->turns_ended++;
            c->parse_deferred = 1;
            cfx__ev_timer_start(co->loop, &c->resume, cfx__now_ns());
            break;
        }
    }
    if (off) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    if (c->failing)
        return;
    /* A frame's clock starts with its first byte: it must be whole within
     * stall_timeout_ms of that (on_tick), however its bytes trickle. */
    if (c->in_len == 0)
        c->frame_ns = 0;
    else if (off || !c->frame_ns)
        c->frame_ns = c->last_rx_ns;
    /* A buffer full of an incomplete frame doubles, up to the frame's
     * length: a peer that announces a megabyte holds what it sent, not
     * what it announced. */
    if (c->frame_need > c->in_cap && c->in_len == c->in_cap) {
        size_t cap = CFX_MIN(c->frame_need, 2 * c->in_cap);
        uint8_t *p = realloc(c->in, cap);
        if (!p) {
            CFX_LOG(ERR, CTL, "closing %s: no memory for %zu bytes of a %zu byte frame",
                    c->peer, cap, c->frame_need);
            cfx__coord_conn_fail(c);
            return;
        }
        co->buffered += cap - c->in_cap;
        c->in = p;
        c->in_cap = cap;
    }
    /* Shrink a buffer a large frame grew, once it is idle. */
    if (c->in_len == 0 && c->in_cap > 4 * IN_BUF_INITIAL) {
        uint8_t *p = realloc(c->in, IN_BUF_INITIAL);
        if (p) {
            co->buffered -= c->in_cap - IN_BUF_INITIAL;
            c->in = p;
            c->in_cap = IN_BUF_INITIAL;
        }
    }
}

static void on_conn_resume(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    struct coord_conn *c = t->arg;
    (void)loop;
    c->parse_deferred = 0;
    c->last_rx_ns = cfx__now_ns(); /* its wait was ours: the stall clock restarts */
    if (c->frame_ns)
        c->frame_ns = c->last_rx_ns; /* ... and so does its frame's (nothing was read) */
    if (!c->failing)
        conn_parse(c->coord, c);
}

static void on_conn_io(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned events)
{
    struct coord_conn *c = io->arg;
    struct cfx_coord *co = c->coord;
    (void)loop;

    if (c->failing)
        return;
    if (events & CFX_EV_WRITE)
        conn_flush(c);
    if (!(events & CFX_EV_READ) || c->failing)
        return;
    if (c->close_after_flush) {
        /* Discard input from a refused peer while its error drains. */
        char sink[512];
        ssize_t n = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            cfx__coord_conn_fail(c);
        return;
    }
    if (c->out_paused) {
        /* Not asked for while paused: a hang-up or an error.  The frames
         * it sent wait; a dead peer is seen by recv (a reset) or, failing
         * that, by the next send of its queue. */
        char b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            cfx__coord_conn_fail(c);
        return;
    }
    if (c->parse_deferred)
        return; /* read on once the frames in in[] are parsed (on_conn_resume) */
    if (c->in_len == c->in_cap) {
        /* Only reachable with a header-sized buffer; conn_parse grows it. */
        cfx__coord_conn_fail(c);
        return;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
    if (n == 0) {
        CFX_LOG(DEBUG, CTL, "connection %s: peer closed", c->peer);
        cfx__coord_conn_fail(c);
        return;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        CFX_LOG(INFO, CTL, "connection %s: recv: %s", c->peer, strerror(errno));
        cfx__coord_conn_fail(c);
        return;
    }
    c->in_len += (size_t)n;
    c->last_rx_ns = cfx__now_ns();
    conn_parse(co, c);
}

/* One ERROR frame of @p status saying @p text on @p fd, best effort: the
 * peer has not read yet, and the close says it anyway. */
static void send_error_now(int fd, int status, const char *text)
{
    struct cfx_msg e = { .type = CFX_MSG_ERROR, .req_id = 0 };
    uint8_t buf[CFX_PROTO_HDR_LEN + 64 + CFX_PROTO_TEXT_MAX];
    size_t len;

    e.u.error.status = status;
    snprintf(e.u.error.text, sizeof(e.u.error.text), "%s", text);
    if (cfx__msg_encode(&e, buf, sizeof(buf), &len) == CFX_OK) {
        ssize_t n = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)n;
    }
}

/* A connection over a cap: one ERROR frame naming it, then closed.  Node
 * clients try again until their deadline (client.c connect_first). */
static void refuse_at_cap(struct cfx_coord *co, int fd, const char *peer, const char *cap,
                          uint32_t limit, const char *why)
{
    char text[CFX_PROTO_TEXT_MAX];

    co->refused_conns++;
    snprintf(text, sizeof(text), "coordinator %s refuses the connection: %s (%u) reached (%s)",
             co->addr, cap, limit, why);
    CFX_RATELOG(&co->refuse_log, CTL, cfx__now_ns(), "refusing %s: %s (%u) reached (%s)", peer,
                cap, limit, why);
    send_error_now(fd, CFX_ERR_NO_RESOURCE, text);
    close(fd);
}

/*
 * A cap on connections waiting to authenticate is reached: the oldest of
 * them goes to make room (of the newcomer's address at max_unauth_per_ip,
 * of all at max_unauth_conns), rather than the newcomer being refused.  It
 * has proved nothing for the longest time; refusing newcomers instead let
 * a flood of silent connections lock every token holder out, even one
 * behind the flood's own address.  A token holder's handshake takes one
 * round trip, so a flood must open a whole cap's worth of connections
 * within it to push it out, and a node client whose handshake is cut tries
 * again.
 */
static void evict_unauth(struct cfx_coord *co, struct coord_conn *old, const char *cap,
                         uint32_t limit)
{
    uint64_t now = cfx__now_ns();
    unsigned long long ms = (now - old->accepted_ns) / 1000000ull;
    char text[CFX_PROTO_TEXT_MAX];

    snprintf(text, sizeof(text), "coordinator %s closes this connection: %s (%u) reached, and "
             "it is the oldest not authenticated (%llu ms)", co->addr, cap, limit, ms);
    if (cfx_list_empty(&old->outq)) /* its challenge went out whole */
        send_error_now(old->fd, CFX_ERR_NO_RESOURCE, text);
    CFX_RATELOG(&co->evict_log, CTL, now, "closing %s: %s (%u) reached, and it is the oldest "
                "not authenticated (%llu ms)", old->peer, cap, limit, ms);
    co->evicted_conns++;
    cfx__coord_conn_fail(old);
}

/* The oldest connection of @p ip still waiting to authenticate (the
 * address's bucket keeps them in arrival order). */
static struct coord_conn *oldest_unauth_from(struct cfx_coord *co, uint32_t ip)
{
    struct cfx_list *pos, *b = ip_bucket(co, ip);
    cfx_list_for_each(pos, b)
    {
        struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, ip_link);
        if (c->ip == ip)
            return c;
    }
    return NULL;
}

static void accept_one(struct cfx_coord *co, int fd, const struct sockaddr_in *sa)
{
    struct coord_conn *c;
    char ip[INET_ADDRSTRLEN] = "?", peer[48], why[96];
    uint32_t from;
    int one = 1;

    inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip));
    snprintf(peer, sizeof(peer), "%s:%u", ip, ntohs(sa->sin_port));
    if (co->nconns >= co->max_conns) {
        snprintf(why, sizeof(why), "%u open", co->nconns);
        refuse_at_cap(co, fd, peer, "max_conns", co->max_conns, why);
        return;
    }
    from = unauth_from(co, sa->sin_addr.s_addr);
    struct coord_conn *old = from >= co->max_unauth_per_ip
                                 ? oldest_unauth_from(co, sa->sin_addr.s_addr) : NULL;
    if (old)
        evict_unauth(co, old, "max_unauth_per_ip", co->max_unauth_per_ip);
    else if (co->nunauth >= co->max_unauth_conns)
        evict_unauth(co, cfx_list_entry(co->unauth.next, struct coord_conn, unauth_link),
                     "max_unauth_conns", co->max_unauth_conns);
    c = calloc(1, sizeof(*c));
    if (!c)
        goto err_close;
    c->in = malloc(IN_BUF_INITIAL);
    if (!c->in)
        goto err_free;
    c->in_cap = IN_BUF_INITIAL;
    c->coord = co;
    c->fd = fd;
    c->io.fd = -1;
    c->ip = sa->sin_addr.s_addr;
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    c->accepted_ns = c->last_rx_ns = cfx__now_ns();
    cfx_list_init(&c->outq);
    cfx_list_init(&c->parked);
    cfx_list_init(&c->node_waits);
    cfx__ev_timer_init(&c->resume, on_conn_resume, c);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (cfx__auth_nonce(c->nonce, sizeof(c->nonce)) != CFX_OK)
        goto err_free_in;
    if (cfx__ev_io_start(co->loop, &c->io, fd, CFX_EV_READ, on_conn_io, c) != CFX_OK)
        goto err_free_in;
    cfx_list_add_tail(&c->link, &co->conns);
    co->nconns++;
    unauth_add(co, c);
    CFX_LOG(DEBUG, CTL, "connection %s accepted", c->peer);

    struct cfx_msg ch = { .type = CFX_MSG_CHALLENGE, .req_id = 0 };
    memcpy(ch.u.challenge.nonce, c->nonce, sizeof(c->nonce));
    ch.u.challenge.secure = (uint8_t)co->secure;
    cfx__coord_send(c, &ch);
    return;

err_free_in:
    CFX_LOG(ERR, CTL, "dropping connection %s: %s", peer, cfx_last_error());
    free(c->in);
err_free:
    free(c);
err_close:
    close(fd);
}

/*
 * Out of file descriptors (EMFILE/ENFILE).  The pending connection would
 * keep the level-triggered listening socket readable and the loop would
 * spin, so shed it: give up the reserve fd, accept, close, take the reserve
 * back (cfx__accept_shed).  Without a reserve, stop accepting until the
 * next tick.  Logged at most once a second (CFX_RATELOG).
 */
static int accept_shed(struct cfx_coord *co, int err)
{
    int shed = cfx__accept_shed(co->listen_fd, &co->spare_fd);

    if (!shed && co->spare_fd < 0) {
        cfx__ev_io_set(co->loop, &co->listen_io, 0);
        co->listen_paused = 1;
    }
    CFX_RATELOG(&co->emfile_log, CTL, cfx__now_ns(), "coordinator %s is out of file "
                "descriptors (%s, %u connections open): %s", co->addr, strerror(err),
                co->nconns,
                shed ? "shed a new connection" : "accepting paused until the next tick");
    return shed;
}

static void on_listen(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned events)
{
    struct cfx_coord *co = io->arg;
    (void)loop;
    (void)events;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_in sa;
        socklen_t slen = sizeof(sa);
        int fd = accept4(co->listen_fd, (struct sockaddr *)&sa, &slen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                if (accept_shed(co, errno))
                    continue;
                return;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                CFX_LOG(WARN, CTL, "accept on %s: %s", co->addr, strerror(errno));
            return;
        }
        accept_one(co, fd, &sa);
    }
}

/* Housekeeping: authentication and stall deadlines, heartbeats. */
static void on_tick(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    struct cfx_coord *co = t->arg;
    uint64_t now = cfx__now_ns(), stall = (uint64_t)co->stall_timeout_ms * 1000000ull;
    uint64_t credit = 0;
    struct cfx_list *pos, *tmp;

    /* A loop that stalled (a slow disk) read nobody's bytes meanwhile: that
     * time does not count against a frame's deadline (members_tick does the
     * same for heartbeats; co->last_tick_ns is still the previous tick's). */
    if (co->last_tick_ns && now - co->last_tick_ns > 2ull * COORD_TICK_MS * 1000000ull)
        credit = now - co->last_tick_ns - (uint64_t)COORD_TICK_MS * 1000000ull;
    cfx_list_for_each_safe(pos, tmp, &co->conns) {
        struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, link);
        if (c->frame_ns)
            c->frame_ns = CFX_MIN(c->frame_ns + credit, now);
        if (c->state == COORD_CONN_AUTH &&
            now - c->accepted_ns > (uint64_t)co->auth_timeout_ms * 1000000ull) {
            CFX_LOG(WARN, CTL, "closing %s: not authenticated within %u ms", c->peer,
                    co->auth_timeout_ms);
            cfx__coord_conn_fail(c);
        } else if (c->in_len == 0 || c->parse_deferred || c->out_paused) {
            /* nothing coming, or whole frames waiting on us or on its reading */
        } else if (now - c->last_rx_ns > stall) {
            CFX_LOG(WARN, CTL, "closing %s: stalled for %u ms in the middle of a frame",
                    c->peer, co->stall_timeout_ms);
            cfx__coord_conn_fail(c);
        } else if (c->frame_ns && now - c->frame_ns > stall) {
            /* bytes keep coming, too few to finish the frame in time: a
             * slow sender would hold its buffer for ever */
            char len[32] = "";
            if (c->frame_need)
                snprintf(len, sizeof(len), " of %zu", c->frame_need);
            CFX_LOG(WARN, CTL, "closing %s: a frame is not whole %u ms after its first byte "
                    "(%zu%s bytes came): stall_timeout_ms reached", c->peer,
                    co->stall_timeout_ms, c->in_len, len);
            cfx__coord_conn_fail(c);
        }
    }
    CFX_RATELOG_FLUSH(&co->refuse_log, CTL, now);
    CFX_RATELOG_FLUSH(&co->evict_log, CTL, now);
    CFX_RATELOG_FLUSH(&co->emfile_log, CTL, now);
    cfx__coord_members_tick(co, now);
    cfx__coord_task_tick(co, now);
    if (co->listen_paused) {
        if (co->spare_fd < 0)
            co->spare_fd = cfx__spare_fd_open();
        co->listen_paused = 0;
        cfx__ev_io_set(loop, &co->listen_io, CFX_EV_READ);
    }
    cfx__ev_timer_start(loop, t, now + (uint64_t)COORD_TICK_MS * 1000000ull);
}

/* ------------------------------------------------------------------------ */
/* Start / stop                                                              */

static void *coord_thread(void *arg)
{
    struct cfx_coord *co = arg;
    int rc = cfx__ev_loop_run(co->loop);
    if (rc != CFX_OK)
        CFX_LOG(ERR, CTL, "coordinator %s: event loop failed: %s", co->addr, cfx_last_error());
    return NULL;
}

static int coord_listen(struct cfx_coord *co, const char *bind_addr, uint16_t port)
{
    struct sockaddr_in sa;
    char hp[300];
    int one = 1;

    /* cfx__parse_hostport wants a port in 1..65535; the real one is set below. */
    snprintf(hp, sizeof(hp), "%s:1", bind_addr);
    if (cfx__parse_hostport(hp, &sa) != CFX_OK)
        return cfx__err(CFX_ERR_INVALID, "coordinator bind address '%s' is not an IPv4 "
                        "address or host name", bind_addr);
    sa.sin_port = htons(port);
    co->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (co->listen_fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "socket: %s", strerror(errno));
    setsockopt(co->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(co->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        return cfx__err(cfx__status_from_errno(e), "coordinator cannot bind %s:%u: %s",
                        bind_addr, port, strerror(e));
    }
    if (listen(co->listen_fd, SOMAXCONN) < 0) /* bursts of joins: a short backlog drops SYNs */
        return cfx__err(cfx__status_from_errno(errno), "listen on %s:%u: %s", bind_addr, port,
                        strerror(errno));
    socklen_t slen = sizeof(sa);
    getsockname(co->listen_fd, (struct sockaddr *)&sa, &slen);
    co->port = ntohs(sa.sin_port);
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(co->addr, sizeof(co->addr), "%s:%u", ip, co->port);
    return CFX_OK;
}

/* Free everything; the loop thread must not be running. */
static void coord_free(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;

    /* Directory first: parked lookups are linked into their connections. */
    cfx__coord_dir_fini(co);
    cfx__coord_task_fini(co);
    cfx_list_for_each_safe(pos, tmp, &co->closing) {
        struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, link);
        cfx_list_del(&c->link);
        cfx_list_add_tail(&c->link, &co->conns);
    }
    cfx_list_for_each_safe(pos, tmp, &co->conns) {
        struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, link);
        cfx_list_del(&c->link);
        if (co->loop)
            cfx__ev_io_stop(co->loop, &c->io);
        conn_free(c);
    }
    cfx__coord_members_fini(co);
    cfx__coord_state_close(co);
    if (co->loop && co->listen_fd >= 0)
        cfx__ev_io_stop(co->loop, &co->listen_io);
    if (co->listen_fd >= 0)
        close(co->listen_fd);
    if (co->spare_fd >= 0)
        close(co->spare_fd);
    cfx__coord_metrics_stop(co->metrics); /* the loop's thread is gone (or never ran) */
    cfx__ev_loop_destroy(co->loop);
    OPENSSL_cleanse(co->token, sizeof(co->token));
    pthread_cond_destroy(&co->alive_cond);
    pthread_mutex_destroy(&co->alive_mu);
    free(co);
}

int cfx__coord_start(const struct cfx_coord_params *params, struct cfx_coord **out)
{
    struct cfx_coord *co;
    sigset_t all, old;
    int rc;

    cfx__log_init();
    cfx__crypto_init();
    if (!params || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx__coord_start: NULL params or out");
    if (!params->token || !*params->token)
        return cfx__err(CFX_ERR_AUTH, "the coordinator needs a cluster token: set CFX_TOKEN "
                        "or CFX_TOKEN_FILE");
    if (strlen(params->token) > CFX_TOKEN_MAX)
        return cfx__err(CFX_ERR_TOO_BIG, "cluster token longer than %d bytes", CFX_TOKEN_MAX);

    co = calloc(1, sizeof(*co));
    if (!co)
        return cfx__err(CFX_ERR_NOMEM, "no memory for the coordinator");
    co->listen_fd = -1;
    co->listen_io.fd = -1;
    pthread_mutex_init(&co->alive_mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* cfx__cond_wait_until's clock */
        pthread_cond_init(&co->alive_cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    co->spare_fd = cfx__spare_fd_open();
    co->state_dirfd = -1; /* so that coord_free() before the state opens closes nothing */
    cfx_list_init(&co->records);
    cfx_list_init(&co->conns);
    cfx_list_init(&co->closing);
    cfx_list_init(&co->unauth);
    for (int i = 0; i < COORD_UNAUTH_BUCKETS; i++)
        cfx_list_init(&co->unauth_ip[i]);
    cfx__coord_members_init(co);
    snprintf(co->token, sizeof(co->token), "%s", params->token);
    co->heartbeat_ms = params->heartbeat_ms ? params->heartbeat_ms
                                            : CFX_COORD_HEARTBEAT_MS_DEFAULT;
    co->dead_after_ms = params->dead_after_ms ? params->dead_after_ms
                                              : CFX_COORD_DEAD_AFTER_MS_DEFAULT;
    co->fanout = params->fanout; /* 0: per object */
    co->secure = params->secure;
    co->auth_timeout_ms = params->auth_timeout_ms ? params->auth_timeout_ms : 5000;
    co->stall_timeout_ms = params->stall_timeout_ms ? params->stall_timeout_ms : 10000;
    co->dead_keep_ms = params->dead_keep_ms ? params->dead_keep_ms : COORD_DEAD_KEEP_MS_DEFAULT;
    co->max_nodes = params->max_nodes ? params->max_nodes : COORD_MAX_NODES_DEFAULT;
    co->max_node_objects = params->max_node_objects ? params->max_node_objects
                                                    : COORD_NODE_OBJECTS_MAX;
    co->max_node_bytes = params->max_node_bytes ? params->max_node_bytes : COORD_NODE_BYTES_MAX;
    co->max_parked = params->max_parked ? params->max_parked : COORD_PARKED_MAX;
    co->max_objects = params->max_objects ? params->max_objects : COORD_OBJECTS_MAX;
    co->max_unauth_conns = params->max_unauth_conns ? params->max_unauth_conns
                                                    : COORD_UNAUTH_MAX;
    co->max_unauth_per_ip = params->max_unauth_per_ip ? params->max_unauth_per_ip
                                                      : COORD_UNAUTH_PER_IP;
    co->max_conns = params->max_conns ? params->max_conns : COORD_CONNS_MAX;
    co->max_conn_outq = params->max_conn_outq ? params->max_conn_outq : COORD_OUTQ_MAX;
    co->max_buffered = params->max_buffered ? params->max_buffered : COORD_BUFFERED_MAX;
    co->test_fsync_delay_ms = params->test_fsync_delay_ms;
    co->max_node_tasks = params->max_node_tasks;
    co->max_queued_tasks = params->max_queued_tasks;
    co->task_grace_ms = params->task_grace_ms;
    cfx__coord_task_init(co);
    if (co->secure != CFX_SEAL_OFF && co->secure != CFX_SEAL_INTEGRITY &&
        co->secure != CFX_SEAL_ENCRYPT) {
        rc = cfx__err(CFX_ERR_INVALID, "coordinator CFX_SECURE mode %d is not off, integrity "
                      "or encrypt", co->secure);
        goto err_free;
    }
    if (co->max_nodes > COORD_MAX_NODES_LIMIT) {
        rc = cfx__err(CFX_ERR_INVALID, "max-nodes %u is above the limit of %u", co->max_nodes,
                      COORD_MAX_NODES_LIMIT);
        goto err_free;
    }
    if (co->heartbeat_ms > CFX_PROTO_TIMING_MAX_MS || co->dead_after_ms > CFX_PROTO_TIMING_MAX_MS) {
        rc = cfx__err(CFX_ERR_INVALID, "heartbeat (%u ms) and dead-after (%u ms) must be at most "
                      "%u ms", co->heartbeat_ms, co->dead_after_ms, CFX_PROTO_TIMING_MAX_MS);
        goto err_free;
    }
    if (co->dead_after_ms <= co->heartbeat_ms) {
        rc = cfx__err(CFX_ERR_INVALID, "dead-after (%u ms) must exceed the heartbeat "
                      "interval (%u ms)", co->dead_after_ms, co->heartbeat_ms);
        goto err_free;
    }
    rc = cfx__auth_nonce((uint8_t *)co->ip_key, sizeof(co->ip_key));
    if (rc != CFX_OK)
        goto err_free;
    co->start_ns = cfx__now_ns();
    rc = cfx__coord_state_open(co, params->state_dir);
    if (rc != CFX_OK)
        goto err_free;
    cfx__coord_members_load(co);
    cfx__coord_alive_publish(co);
    rc = cfx__coord_dir_init(co);
    if (rc != CFX_OK)
        goto err_free;
    cfx__coord_dir_load(co);
    rc = coord_listen(co, params->bind_addr ? params->bind_addr : "127.0.0.1", params->port);
    if (rc != CFX_OK)
        goto err_free;
    rc = cfx__ev_loop_create(&co->loop);
    if (rc != CFX_OK)
        goto err_free;
    rc = cfx__ev_io_start(co->loop, &co->listen_io, co->listen_fd, CFX_EV_READ, on_listen, co);
    if (rc != CFX_OK)
        goto err_free;
    if (params->metrics_addr) {
        rc = cfx__coord_metrics_start(co, params->metrics_addr, &co->metrics);
        if (rc != CFX_OK)
            goto err_free;
    }
    cfx__ev_timer_init(&co->tick, on_tick, co);
    cfx__ev_timer_start(co->loop, &co->tick,
                        cfx__now_ns() + (uint64_t)COORD_TICK_MS * 1000000ull);
    cfx__ev_loop_set_hook(co->loop, after_batch, co);

    /* The loop thread takes no signals: they belong to the embedding program. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&co->thread, NULL, coord_thread, co);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        rc = cfx__err(CFX_ERR_NO_RESOURCE, "cannot start the coordinator thread: %s",
                      strerror(rc));
        goto err_free;
    }
    co->thread_started = 1;
    pthread_setname_np(co->thread, "cfx-coord");
    char fanout_txt[16];
    if (co->fanout)
        snprintf(fanout_txt, sizeof(fanout_txt), "%u", co->fanout);
    else
        snprintf(fanout_txt, sizeof(fanout_txt), "per object");
    CFX_LOG(INFO, CTL, "coordinator listening on %s (heartbeat %u ms, dead after %u ms, "
            "fanout %s, CFX_SECURE=%s)", co->addr, co->heartbeat_ms, co->dead_after_ms,
            fanout_txt, cfx__seal_mode_name(co->secure));
    *out = co;
    return CFX_OK;

err_free:
    coord_free(co);
    return rc;
}

uint16_t cfx__coord_port(const struct cfx_coord *coord)
{
    return coord ? coord->port : 0;
}

const char *cfx__coord_addr(const struct cfx_coord *coord)
{
    return coord ? coord->addr : "";
}

void cfx__coord_alive_publish(struct cfx_coord *co)
{
    pthread_mutex_lock(&co->alive_mu);
    co->alive_pub = co->nodes_alive;
    co->joins_pub = co->joins;
    pthread_cond_broadcast(&co->alive_cond);
    pthread_mutex_unlock(&co->alive_mu);
}

void cfx__coord_member_counts(struct cfx_coord *coord, uint32_t *joined, uint32_t *alive)
{
    pthread_mutex_lock(&coord->alive_mu);
    *joined = coord->joins_pub;
    *alive = coord->alive_pub;
    pthread_mutex_unlock(&coord->alive_mu);
}

int cfx__coord_wait_members(struct cfx_coord *coord, uint32_t most, uint64_t deadline)
{
    uint32_t n;
    pthread_mutex_lock(&coord->alive_mu);
    while (coord->alive_pub > most &&
           cfx__cond_wait_until(&coord->alive_cond, &coord->alive_mu, deadline))
        ;
    n = coord->alive_pub;
    pthread_mutex_unlock(&coord->alive_mu);
    if (n > most)
        return cfx__err(CFX_ERR_TIMEOUT,
                        "coordinator %s: %u member(s) still alive at the "
                        "deadline (waited for at most %u)",
                        coord->addr, n, most);
    return CFX_OK;
}

/*
 * Tell every authenticated client that the coordinator stops in order, so
 * that the connection's end is not reported as a failure (a job's orderly
 * end: the driver stops the coordinator before its workers are gone).  The
 * loop's thread is gone: this thread owns the connections now.  Best
 * effort: what a socket does not take at once is dropped with it.
 */
static void say_goodbye(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    struct cfx_msg m = { .type = CFX_MSG_EV_STOPPING, .req_id = 0 };

    cfx_list_for_each_safe(pos, tmp, &co->conns) { /* a failed send moves it to closing */
        struct coord_conn *c = cfx_list_entry(pos, struct coord_conn, link);
        if (c->state != COORD_CONN_AUTH && !c->failing)
            cfx__coord_send(c, &m);
    }
}

void cfx__coord_stop(struct cfx_coord *coord)
{
    if (!coord)
        return;
    if (coord->thread_started) {
        cfx__ev_loop_stop(coord->loop);
        pthread_join(coord->thread, NULL);
    }
    if (coord->loop)
        say_goodbye(coord);
    CFX_LOG(INFO, CTL, "coordinator %s stopped", coord->addr);
    coord_free(coord);
}

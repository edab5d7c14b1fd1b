/*
 * Coordinator client.
 *
 * cfx__ctl_open() connects, authenticates and joins on the caller's thread
 * (blocking, bounded by the caller's timeout), then starts one reader thread
 * that owns the receive side: it reads frames, hands each reply to the call
 * waiting for its req_id, delivers node_dead events, and sends heartbeats.
 * Callers send their own requests (serialised by send_lock) and sleep on
 * their own condition variable until the reply or their deadline.
 *
 * When the connection is lost on_node_dead(arg, 0) runs and a NODE client
 * reconnects on its reader thread with exponential backoff
 * (CTL_BACKOFF_MIN_MS doubling to CTL_BACKOFF_MAX_MS, until
 * cfx__ctl_close()): it authenticates again and rejoins asking for its
 * previous node id, then calls on_reconnected(arg) so the owner re-announces
 * what it holds.  An outage is a pause: calls waiting for a reply when the
 * connection goes, and calls made while it is away, wait for the new
 * connection and are sent (again) on it, all within their own deadline
 * (ctl_call says why every request may be repeated); a call whose deadline
 * passes while the coordinator is unreachable fails with CFX_ERR_CONNECT
 * naming it.  ADMIN clients do not reconnect: their calls fail at once with
 * CFX_ERR_CONNECT.
 */
#include "control/client.h"
#include "control/client_int.h"
#include "dataplane/common/intr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include <conflux/status.h>

#include "control/auth.h"
#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/common/list.h"
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/engine/objname.h"

#define CTL_DEFAULT_TIMEOUT_MS 10000
#define CTL_RBUF_INITIAL       (64u * 1024)
#define CTL_LEAVE_TIMEOUT_MS   250
#define CTL_BACKOFF_MIN_MS     50     /* first reconnect attempt after a loss */
#define CTL_BACKOFF_MAX_MS     ((int)CFX_PROTO_RECONNECT_MAX_MS) /* attempts never further apart */
#define CTL_ATTEMPT_MS         2000   /* one connect + authenticate + rejoin */

const char *cfx__ctl_idhex(const struct cfx_object_id *id, char buf[CFX_OBJECT_ID_HEX_LEN])
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < CFX_OBJECT_ID_LEN; i++) {
        buf[2 * i] = digits[id->bytes[i] >> 4];
        buf[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    buf[2 * CFX_OBJECT_ID_LEN] = '\0';
    return buf;
}

/* Error detail "<what> at coordinator <addr>: <why>". */
int cfx__ctl_err(const struct cfx_ctl *ctl, int status, const char *what, const char *fmt, ...)
{
    char why[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return cfx__err(status, "%s at coordinator %s: %s", what, ctl->coord, why);
}

/* ------------------------------------------------------------------------ */
/* Wire I/O                                                                  */

/* The send on connection @p gen failed: it is broken, unless the reader has
 * replaced it meanwhile (a reconnect under way, or done: then the new one
 * is left alone; told apart by generation, as a new socket may get the old
 * one's number). */
static void mark_broken(struct cfx_ctl *ctl, uint64_t gen)
{
    pthread_mutex_lock(&ctl->lock);
    int current = !ctl->reconnecting && gen == __atomic_load_n(&ctl->conn_gen, __ATOMIC_ACQUIRE);
    if (current) {
        ctl->broken = 1;
        if (!ctl->lost_ns)
            ctl->lost_ns = cfx__now_ns();
    }
    pthread_mutex_unlock(&ctl->lock);
    /* Wakes the reader, which fails the waiting calls. */
    pthread_mutex_lock(&ctl->send_lock);
    if (current && gen == ctl->conn_gen)
        shutdown(ctl->fd, SHUT_RDWR);
    pthread_mutex_unlock(&ctl->send_lock);
}

int cfx__ctl_broken(struct cfx_ctl *ctl)
{
    pthread_mutex_lock(&ctl->lock);
    int b = ctl->broken;
    pthread_mutex_unlock(&ctl->lock);
    return b;
}

/* The send lock by @p deadline (CLOCK_MONOTONIC, as every deadline here). */
static int lock_send(struct cfx_ctl *ctl, uint64_t deadline)
{
    if (deadline == UINT64_MAX) {
        pthread_mutex_lock(&ctl->send_lock);
        return CFX_OK;
    }
    struct timespec ts = { .tv_sec = (time_t)(deadline / 1000000000ull),
                           .tv_nsec = (long)(deadline % 1000000000ull) };
    return pthread_mutex_clocklock(&ctl->send_lock, CLOCK_MONOTONIC, &ts) == 0 ? CFX_OK
                                                                                : CFX_ERR_TIMEOUT;
}

/* Write a whole frame by @p deadline.  A frame cut short would leave the
 * stream unframed, so a partial send that times out breaks the connection. */
static int send_all(struct cfx_ctl *ctl, uint8_t *buf, size_t len, size_t cap,
                    uint64_t deadline, const char *what)
{
    size_t off = 0;
    int rc = lock_send(ctl, deadline);
    if (rc != CFX_OK)
        return cfx__ctl_err(ctl, CFX_ERR_TIMEOUT, what,
                            "another send held the connection to the coordinator past the "
                            "deadline (coordinator not reading)");
    uint64_t gen = ctl->conn_gen; /* the connection this send goes on */
    /* While the reader reconnects only it writes (the handshake). */
    if (__atomic_load_n(&ctl->reconnecting, __ATOMIC_ACQUIRE) &&
        !pthread_equal(pthread_self(), ctl->thread)) {
        pthread_mutex_unlock(&ctl->send_lock);
        return cfx__ctl_err(ctl, CFX_ERR_CONNECT, what, "reconnecting to the coordinator");
    }
    /* Sealed here, under the lock: records go out in their counter's order.
     * A sealed record not sent whole leaves the peer's counter behind, so
     * any failure after this breaks the connection. */
    bool sealed = ctl->seal.mode != CFX_SEAL_OFF;
    rc = cfx__ctl_seal_frame(&ctl->seal, buf, len, cap, &len);
    if (rc != CFX_OK) {
        pthread_mutex_unlock(&ctl->send_lock);
        rc = cfx__ctl_err(ctl, rc, what, "%s", cfx_last_error());
        mark_broken(ctl, gen);
        return rc;
    }
    while (off < len) {
        ssize_t n = send(ctl->fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = { .fd = ctl->fd, .events = POLLOUT };
            int ms = cfx__ms_left(deadline);
            if (ms == 0) {
                rc = cfx__ctl_err(ctl, CFX_ERR_TIMEOUT, what,
                             "could not send the request in time (coordinator not reading)");
                break;
            }
            if (poll(&p, 1, ms) < 0 && errno != EINTR) {
                rc = cfx__ctl_err(ctl, CFX_ERR_IO, what, "poll: %s", strerror(errno));
                break;
            }
            continue;
        }
        rc = cfx__ctl_err(ctl, CFX_ERR_CONNECT, what, "connection lost: %s",
                     n < 0 ? strerror(errno) : "short send");
        break;
    }
    pthread_mutex_unlock(&ctl->send_lock);
    if (rc != CFX_OK && (off > 0 || sealed || rc == CFX_ERR_CONNECT))
        mark_broken(ctl, gen);
    return rc;
}

int cfx__ctl_send(struct cfx_ctl *ctl, const struct cfx_msg *m, uint64_t deadline,
                    const char *what)
{
    /* room for a tag whatever the mode: it may switch on before the lock */
    size_t cap = cfx__msg_encoded_len(m) + CFX_SEAL_TAG_LEN, len;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return cfx__ctl_err(ctl, CFX_ERR_NOMEM, what, "no memory for a %zu byte request", cap);
    int rc = cfx__msg_encode(m, buf, cap, &len);
    if (rc != CFX_OK) {
        free(buf);
        return cfx__ctl_err(ctl, rc, what, "%s", cfx_last_error());
    }
    rc = send_all(ctl, buf, len, cap, deadline, what);
    free(buf);
    return rc;
}

/* Read what the socket has.  CFX_OK (bytes added), CFX_ERR_AGAIN, or
 * CFX_ERR_CONNECT when the connection ended. */
static int rbuf_read(struct cfx_ctl *ctl)
{
    if (ctl->rlen == ctl->rcap)
        return cfx__err(CFX_ERR_INTERNAL, "receive buffer full");
    ssize_t n = recv(ctl->fd, ctl->rbuf + ctl->rlen, ctl->rcap - ctl->rlen, MSG_DONTWAIT);
    if (n > 0) {
        ctl->rlen += (size_t)n;
        return CFX_OK;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return CFX_ERR_AGAIN;
    return cfx__err(CFX_ERR_CONNECT, "coordinator %s closed the connection%s%s", ctl->coord,
                    n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
}

/* 1 and *flen when a whole frame starts the buffer, 0 when more bytes are
 * needed, or a negative status when the stream is not a valid frame. */
static int rbuf_frame(struct cfx_ctl *ctl, size_t *flen)
{
    struct cfx_msg_hdr h;
    if (ctl->rlen < CFX_PROTO_HDR_LEN)
        return 0;
    int rc = cfx__ctl_hdr_decode(&ctl->seal, ctl->rbuf, ctl->rlen, &h);
    if (rc != CFX_OK)
        return cfx__ctl_err(ctl, rc, "reading a reply", "%s", cfx_last_error());
    size_t need = CFX_PROTO_HDR_LEN + (size_t)h.payload_len;
    if (need > ctl->rcap) {
        uint8_t *p = realloc(ctl->rbuf, need);
        if (!p)
            return cfx__err(CFX_ERR_NOMEM, "no memory for a %zu byte frame", need);
        ctl->rbuf = p;
        ctl->rcap = need;
    }
    if (ctl->rlen < need)
        return 0;
    *flen = need;
    return 1;
}

/* Open the sealed frame of @p wlen bytes at @p f in place (no-op while
 * off); *len: its plain length.  CFX_ERR_AUTH naming the coordinator when
 * it fails: nothing of it may be read. */
static int frame_open(struct cfx_ctl *ctl, uint8_t *f, size_t wlen, size_t *len)
{
    int rc = cfx__ctl_open_frame(&ctl->seal, f, wlen, len);
    if (rc == CFX_ERR_AUTH)
        return cfx__err(CFX_ERR_AUTH, "coordinator %s sent a frame that failed its "
                        "CFX_SECURE=%s check (tampered with, replayed or not sealed); the "
                        "connection is closed", ctl->coord, cfx__seal_mode_name(ctl->seal.mode));
    if (rc != CFX_OK)
        return cfx__ctl_err(ctl, rc, "reading a reply", "%s", cfx_last_error());
    return CFX_OK;
}

static void rbuf_consume(struct cfx_ctl *ctl, size_t n)
{
    memmove(ctl->rbuf, ctl->rbuf + n, ctl->rlen - n);
    ctl->rlen -= n;
    if (ctl->rlen == 0 && ctl->rcap > 4 * CTL_RBUF_INITIAL) {
        uint8_t *p = realloc(ctl->rbuf, CTL_RBUF_INITIAL);
        if (p) {
            ctl->rbuf = p;
            ctl->rcap = CTL_RBUF_INITIAL;
        }
    }
}

/* Handshake only (no reader thread yet): next frame, decoded into @p m,
 * pointing into *frame (caller frees). */
static int recv_sync(struct cfx_ctl *ctl, uint64_t deadline, const char *what,
                     struct cfx_msg *m, uint8_t **frame)
{
    for (;;) {
        size_t flen = 0;
        int r = rbuf_frame(ctl, &flen);
        if (r < 0)
            return r;
        if (r == 1) {
            uint8_t *f = malloc(flen);
            if (!f)
                return cfx__err(CFX_ERR_NOMEM, "no memory for a %zu byte frame", flen);
            memcpy(f, ctl->rbuf, flen);
            rbuf_consume(ctl, flen);
            int rc = frame_open(ctl, f, flen, &flen);
            if (rc != CFX_OK) {
                free(f);
                return rc;
            }
            rc = cfx__msg_decode(f, flen, m);
            if (rc != CFX_OK) {
                free(f);
                return cfx__ctl_err(ctl, rc, what, "%s", cfx_last_error());
            }
            *frame = f;
            return CFX_OK;
        }
        struct pollfd p = { .fd = ctl->fd, .events = POLLIN };
        int ms = cfx__ms_left(deadline);
        if (ms == 0)
            return cfx__ctl_err(ctl, CFX_ERR_TIMEOUT, what, "no answer in time");
        int n = poll(&p, 1, ms);
        if (n < 0 && errno != EINTR)
            return cfx__ctl_err(ctl, CFX_ERR_IO, what, "poll: %s", strerror(errno));
        if (n <= 0)
            continue;
        int rc = rbuf_read(ctl);
        if (rc != CFX_OK && rc != CFX_ERR_AGAIN)
            return cfx__ctl_err(ctl, rc, what, "the coordinator closed the connection");
    }
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                     */

/* @p status: CFX_ERR_CONNECT (lost), CFX_ERR_AUTH (a frame failed its
 * CFX_SECURE check: not sent again). */
static void fail_all_calls(struct cfx_ctl *ctl, int status)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &ctl->calls) {
        struct ctl_call *c = cfx_list_entry(pos, struct ctl_call, link);
        if (!c->done) {
            c->done = 1;
            c->status = status;
            pthread_cond_signal(&c->cond);
        }
    }
}

/* Until @p deadline, wait while the connection is lost and a NODE client
 * reconnects (ctl->lock held).  CFX_OK: connected (or closing: the caller
 * checks); else CFX_ERR_CONNECT naming the coordinator and how long it has
 * been gone. */
static int wait_connected(struct cfx_ctl *ctl, uint64_t deadline, uint64_t start,
                          const char *what)
{
    while ((ctl->reconnecting || (ctl->broken && ctl->role == CFX_CTL_ROLE_NODE)) &&
           !ctl->closing && !ctl->interrupted) {
        if (deadline == UINT64_MAX) {
            pthread_cond_wait(&ctl->conn_cond, &ctl->lock);
            continue;
        }
        struct timespec ts = { .tv_sec = (time_t)(deadline / 1000000000ull),
                               .tv_nsec = (long)(deadline % 1000000000ull) };
        if (pthread_cond_timedwait(&ctl->conn_cond, &ctl->lock, &ts) == ETIMEDOUT &&
            (ctl->reconnecting || ctl->broken) && !ctl->closing && !ctl->interrupted) {
            uint64_t now = cfx__now_ns();
            uint64_t gone = ctl->lost_ns && now > ctl->lost_ns ? now - ctl->lost_ns : 0;
            return cfx__ctl_err(ctl, CFX_ERR_CONNECT, what, "the coordinator is unreachable (the "
                           "connection was lost %llu ms ago; reconnecting) and did not come "
                           "back within the call's %llu ms",
                           (unsigned long long)(gone / 1000000ull),
                           /* a deadline already past at the call's start
                            * (a step late in a longer call): 0, not a wrap */
                           (unsigned long long)(deadline > start ? (deadline - start) / 1000000ull
                                                                 : 0));
        }
    }
    return CFX_OK;
}

/* A request sent again on a new connection: a lookup or a task wait waits
 * only for what is left of its deadline (a wait's deadline has
 * CFX_PROTO_WAIT_MARGIN_MS over its timeout), and a put or a task
 * submission says that it may be a repeat. */
static void refresh_request(struct cfx_msg *req, uint64_t deadline, int attempt)
{
    if (req->type == CFX_MSG_OBJ_LOOKUP && req->u.lookup.timeout_ms != 0 &&
        req->u.lookup.timeout_ms != CFX_PROTO_TIMEOUT_NONE) {
        int ms = cfx__ms_left(deadline);
        req->u.lookup.timeout_ms = (uint32_t)(ms <= 0 ? 1 : ms);
    }
    if (req->type == CFX_MSG_TASK_WAIT && attempt > 0 && req->u.task_st.timeout_ms != 0 &&
        req->u.task_st.timeout_ms != CFX_PROTO_TIMEOUT_NONE) {
        int ms = cfx__ms_left(deadline) - (int)CFX_PROTO_WAIT_MARGIN_MS;
        req->u.task_st.timeout_ms = (uint32_t)(ms <= 0 ? 1 : ms);
    }
    if (req->type == CFX_MSG_OBJ_PUT && attempt > 0)
        req->u.put.again = 1;
    if (req->type == CFX_MSG_TASK_SUBMIT && attempt > 0)
        req->u.task.flags |= CFX_PROTO_TASK_AGAIN;
}

/* Until when a call waits for a lost connection to come back: its
 * deadline, but for a task wait, whose deadline has CFX_PROTO_WAIT_MARGIN_MS
 * over its timeout for the answer's round trip (refresh_request): an
 * unreachable coordinator is waited for until the timeout only (task.h:
 * CFX_ERR_CONNECT when it stayed unreachable for the whole wait). */
static uint64_t call_connect_deadline(const struct cfx_msg *req, uint64_t deadline)
{
    uint64_t margin = CFX_PROTO_WAIT_MARGIN_MS * 1000000ull;

    if (req->type != CFX_MSG_TASK_WAIT || deadline == UINT64_MAX)
        return deadline;
    return deadline > margin ? deadline - margin : 0;
}

/*
 * Send @p req and wait for its reply by @p deadline.  On CFX_OK call->reply
 * holds a non-ERROR reply and call->frame must be freed by the caller; an
 * ERROR reply is turned into its status with the coordinator's text.
 *
 * A NODE client's call whose connection is lost before its reply came is
 * sent again once the client has reconnected (every request that goes
 * through here may be repeated: lookups, node queries and listings read;
 * a repeated put carries CFX_PROTO_PUT_AGAIN and is acknowledged when its
 * sender already is the object's putter; a repeated task submission
 * carries CFX_PROTO_TASK_AGAIN and its key; a repeated delete or transfer end
 * finds nothing left to do), all within @p deadline.  When the deadline
 * passes with the coordinator still unreachable the call fails with
 * CFX_ERR_CONNECT naming it.
 */
int cfx__ctl_call(struct cfx_ctl *ctl, struct cfx_msg *req, uint64_t deadline,
                  struct ctl_call *call, const char *what)
{
    pthread_condattr_t attr;
    uint64_t start = cfx__now_ns();
    uint64_t conn_dl = call_connect_deadline(req, deadline);
    /* waits on other processes (an object to be put, a task to end), not
     * on the coordinator: its thread's interrupt may end them */
    const bool intr = req->type == CFX_MSG_OBJ_LOOKUP || req->type == CFX_MSG_TASK_WAIT;
    int rc;

    memset(call, 0, sizeof(*call));
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&call->cond, &attr);
    pthread_condattr_destroy(&attr);

    /* each lost connection costs a reconnect (>= CTL_BACKOFF_MIN_MS), so
     * the deadline bounds this loop; the count bounds a call without one */
    for (int attempt = 0;; attempt++) {
        pthread_mutex_lock(&ctl->lock);
        rc = wait_connected(ctl, conn_dl, start, what);
        if (rc != CFX_OK) {
            pthread_mutex_unlock(&ctl->lock);
            goto out_destroy;
        }
        if (ctl->interrupted) {
            pthread_mutex_unlock(&ctl->lock);
            rc = cfx__ctl_err(ctl, CFX_ERR_CANCELED, what, "interrupted: its context is being "
                         "destroyed");
            goto out_destroy;
        }
        if (ctl->broken || ctl->closing) {
            pthread_mutex_unlock(&ctl->lock);
            rc = cfx__ctl_err(ctl, CFX_ERR_CONNECT, what, "the connection to the coordinator "
                         "was lost%s", ctl->closing ? " (the client is closing)" : "");
            goto out_destroy;
        }
        refresh_request(req, deadline, attempt);
        req->req_id = call->req_id = ++ctl->next_req;
        call->done = 0;
        call->status = CFX_OK;
        cfx_list_add_tail(&call->link, &ctl->calls);
        pthread_mutex_unlock(&ctl->lock);

        rc = cfx__ctl_send(ctl, req, deadline, what);

        pthread_mutex_lock(&ctl->lock);
        while (rc == CFX_OK && !call->done) {
            if (intr && cfx__intr_fired()) { /* here, or earlier in the call making this one */
                rc = cfx__ctl_err(ctl, CFX_ERR_CANCELED, what, "interrupted on its thread");
                break;
            }
            uint64_t until = intr ? cfx__intr_until(deadline) : deadline;
            if (until == UINT64_MAX) {
                pthread_cond_wait(&call->cond, &ctl->lock);
                continue;
            }
            struct timespec ts = { .tv_sec = (time_t)(until / 1000000000ull),
                                   .tv_nsec = (long)(until % 1000000000ull) };
            if (pthread_cond_timedwait(&call->cond, &ctl->lock, &ts) != ETIMEDOUT ||
                call->done)
                continue;
            if (until != deadline) { /* the check is due: one that fires ends it above */
                cfx__intr_poll(&ctl->lock);
                continue;
            }
            rc = cfx__ctl_err(ctl, CFX_ERR_TIMEOUT, what, "timed out after %llu ms",
                              (unsigned long long)(deadline > start ? (deadline - start) /
                                                   1000000ull : 0));
        }
        cfx_list_del(&call->link);
        /* lost before the reply: again on the next connection */
        bool lost = (rc == CFX_ERR_CONNECT || (rc == CFX_OK && call->status == CFX_ERR_CONNECT));
        bool again = lost && ctl->role == CFX_CTL_ROLE_NODE && !ctl->closing &&
                     attempt < 1000;
        pthread_mutex_unlock(&ctl->lock);
        if (again) {
            CFX_LOG(DEBUG, CTL, "%s at coordinator %s: connection lost before the reply; "
                    "sending it again once reconnected", what, ctl->coord);
            continue;
        }
        break;
    }
    if (rc != CFX_OK)
        goto out_free;
    if (call->status == CFX_ERR_CANCELED) {
        rc = cfx__ctl_err(ctl, CFX_ERR_CANCELED, what, "interrupted: its context is being destroyed");
        goto out_free;
    }
    if (call->status == CFX_ERR_AUTH) {
        rc = cfx__ctl_err(ctl, CFX_ERR_AUTH, what, "a frame from the coordinator failed its "
                     "CFX_SECURE check (tampered with, replayed or not sealed); the connection "
                     "was closed");
        goto out_free;
    }
    if (call->status != CFX_OK) {
        rc = cfx__ctl_err(ctl, call->status == CFX_ERR_NOMEM ? CFX_ERR_NOMEM : CFX_ERR_CONNECT, what,
                     "%s", call->status == CFX_ERR_NOMEM ? "no memory for the reply"
                                                         : "the connection to the coordinator "
                                                           "was lost");
        goto out_free;
    }
    if (call->reply.type == CFX_MSG_ERROR) {
        rc = cfx__ctl_err(ctl, call->reply.u.error.status, what, "%s", call->reply.u.error.text);
        goto out_free;
    }
    goto out_destroy;

out_free:
    free(call->frame);
    call->frame = NULL;
out_destroy:
    pthread_cond_destroy(&call->cond);
    return rc;
}

/* The reply has the wrong type: the coordinator is confused or hostile. */
int cfx__ctl_unexpected(struct cfx_ctl *ctl, struct ctl_call *call, const char *what)
{
    int rc = cfx__ctl_err(ctl, CFX_ERR_PROTO, what, "unexpected %s reply",
                     cfx__msg_type_name(call->reply.type));
    free(call->frame);
    call->frame = NULL;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Reader thread                                                             */

/* Remember async put @p req_id of @p id until its answer (ctl->lock held). */
void cfx__ctl_aput_add(struct cfx_ctl *ctl, uint64_t req_id, const struct cfx_object_id *id)
{
    if (ctl->aput_n == CTL_APUT_MAX) { /* forget the oldest */
        ctl->aput_head = (ctl->aput_head + 1) % CTL_APUT_MAX;
        ctl->aput_n--;
    }
    struct ctl_aput *a = &ctl->aput[(ctl->aput_head + ctl->aput_n++) % CTL_APUT_MAX];
    a->req_id = req_id;
    a->id = *id;
}

/* Forget async put @p req_id, which was never sent (ctl->lock held). */
void cfx__ctl_aput_unsent(struct cfx_ctl *ctl, uint64_t req_id)
{
    for (unsigned i = 0; i < ctl->aput_n; i++) {
        unsigned at = (ctl->aput_head + i) % CTL_APUT_MAX;
        if (ctl->aput[at].req_id != req_id)
            continue;
        for (unsigned j = i; j + 1 < ctl->aput_n; j++)
            ctl->aput[(ctl->aput_head + j) % CTL_APUT_MAX] =
                ctl->aput[(ctl->aput_head + j + 1) % CTL_APUT_MAX];
        ctl->aput_n--;
        return;
    }
}

/* The answer to request @p req_id: true when it was an async put's (its
 * owner told), false for any other request.  Older puts still waiting lost
 * their answers with a connection: the owner hears CFX_ERR_CONNECT. */
static bool aput_answered(struct cfx_ctl *ctl, uint64_t req_id, int status, const char *why)
{
    struct ctl_aput lost[8], mine;
    unsigned nlost = 0;
    bool found = false;
    for (;;) {
        pthread_mutex_lock(&ctl->lock);
        while (ctl->aput_n && nlost < CFX_ARRAY_SIZE(lost) &&
               ctl->aput[ctl->aput_head].req_id < req_id) {
            lost[nlost++] = ctl->aput[ctl->aput_head];
            ctl->aput_head = (ctl->aput_head + 1) % CTL_APUT_MAX;
            ctl->aput_n--;
        }
        bool more = ctl->aput_n && ctl->aput[ctl->aput_head].req_id < req_id;
        if (!more && ctl->aput_n && ctl->aput[ctl->aput_head].req_id == req_id) {
            mine = ctl->aput[ctl->aput_head];
            ctl->aput_head = (ctl->aput_head + 1) % CTL_APUT_MAX;
            ctl->aput_n--;
            found = true;
        }
        pthread_mutex_unlock(&ctl->lock);
        for (unsigned i = 0; i < nlost && ctl->on_put_answer; i++)
            ctl->on_put_answer(ctl->arg, &lost[i].id, CFX_ERR_CONNECT, "its answer was lost");
        nlost = 0;
        if (!more)
            break;
    }
    if (!found)
        return false;
    if (status != CFX_OK) {
        char hex[CFX_OBJECT_ID_HEX_LEN];
        CFX_LOG(WARN, CTL, "coordinator %s refused the put of object %s: %s (%s)", ctl->coord,
                cfx__ctl_idhex(&mine.id, hex), why, cfx_errname(status));
    }
    if (ctl->on_put_answer)
        ctl->on_put_answer(ctl->arg, &mine.id, status, why);
    return true;
}

static void deliver(struct cfx_ctl *ctl, const uint8_t *frame, size_t len)
{
    struct cfx_msg m;
    struct cfx_list *pos;
    struct ctl_call *call = NULL;

    if (cfx__msg_decode(frame, len, &m) != CFX_OK) {
        CFX_LOG(WARN, CTL, "coordinator %s sent a bad frame: %s", ctl->coord, cfx_last_error());
        return;
    }
    if (m.type == CFX_MSG_EV_NODE_DEAD && m.req_id == CFX_PROTO_EV_LEFT) {
        /* a goodbye, not a failure: its connections close in order */
        CFX_LOG(DEBUG, CTL, "coordinator %s: node %u left", ctl->coord, m.u.node_dead.node_id);
        if (ctl->on_node_left)
            ctl->on_node_left(ctl->arg, m.u.node_dead.node_id);
        return;
    }
    if (m.type == CFX_MSG_EV_NODE_DEAD) {
        CFX_LOG(INFO, CTL, "coordinator %s: node %u is dead", ctl->coord, m.u.node_dead.node_id);
        if (ctl->on_node_dead)
            ctl->on_node_dead(ctl->arg, m.u.node_dead.node_id);
        return;
    }
    if (m.type == CFX_MSG_EV_STOPPING) {
        /* its end of the connection follows: an orderly stop, not a failure */
        CFX_LOG(INFO, CTL, "coordinator %s is stopping", ctl->coord);
        ctl->coord_stopping = 1;
        return;
    }
    if (m.type == CFX_MSG_EV_TASK_RUN) {
        if (ctl->on_task_run)
            ctl->on_task_run(ctl->arg, &m.u.task);
        else
            CFX_LOG(WARN, CTL, "coordinator %s sent task %llu to a node that runs none",
                    ctl->coord, (unsigned long long)m.u.task.task_id);
        return;
    }
    if (m.type == CFX_MSG_EV_OBJ_GONE) {
        /* handled before the frames after it: a reply read later (to a
         * lookup, say) never finds the withdrawn copy still answering */
        if (ctl->on_obj_gone)
            ctl->on_obj_gone(ctl->arg, &m.u.gone.id);
        if (m.req_id) {
            char hex[CFX_OBJECT_ID_HEX_LEN];
            struct cfx_msg ack = { .type = CFX_MSG_OBJ_GONE_ACK, .req_id = m.req_id };
            ack.u.gone.id = m.u.gone.id;
            /* a lost ack is a lost connection: the coordinator then stops
             * waiting for this node */
            if (cfx__ctl_send(ctl, &ack, cfx__deadline_ns((int)ctl->heartbeat_ms * 4),
                         "drop of a withdrawn object") != CFX_OK)
                CFX_LOG(WARN, CTL, "coordinator %s: cannot acknowledge the withdrawal of "
                        "object %s: %s", ctl->coord, cfx__ctl_idhex(&m.u.gone.id, hex),
                        cfx_last_error());
        }
        return;
    }

    pthread_mutex_lock(&ctl->lock);
    cfx_list_for_each(pos, &ctl->calls) {
        struct ctl_call *c = cfx_list_entry(pos, struct ctl_call, link);
        if (c->req_id == m.req_id && !c->done) {
            call = c;
            break;
        }
    }
    if (call) {
        uint8_t *copy = malloc(len);
        if (copy) {
            memcpy(copy, frame, len);
            cfx__msg_decode(copy, len, &call->reply); /* same bytes: cannot fail now */
            call->frame = copy;
            call->status = CFX_OK;
        } else {
            call->status = CFX_ERR_NOMEM;
        }
        call->done = 1;
        pthread_cond_signal(&call->cond);
    }
    pthread_mutex_unlock(&ctl->lock);

    /* The answer to an async put goes to its owner (and the unanswered
     * older ones, whose answers a lost connection took, are dropped) */
    if (!call && (m.type == CFX_MSG_OK || m.type == CFX_MSG_ERROR) &&
        aput_answered(ctl, m.req_id, m.type == CFX_MSG_OK ? CFX_OK : m.u.error.status,
                      m.type == CFX_MSG_OK ? "" : m.u.error.text))
        return;

    /* Replies to fire-and-forget requests have no waiter: an error among
     * them is still worth a line in the log. */
    if (!call && m.type == CFX_MSG_ERROR && m.u.error.status == CFX_ERR_NOT_FOUND)
        /* a transfer's end or a copy's withdrawal sent without waiting, for
         * an object that went meanwhile (another thread's delete): nothing
         * was left to do */
        CFX_LOG(DEBUG, CTL, "coordinator %s: request %llu found nothing to do: %s", ctl->coord,
                (unsigned long long)m.req_id, m.u.error.text);
    else if (!call && m.type == CFX_MSG_ERROR && m.u.error.status == CFX_ERR_TIMEOUT)
        /* a waiting lookup whose caller's deadline came first: expected */
        CFX_LOG(DEBUG, CTL, "coordinator %s: late answer to request %llu: %s", ctl->coord,
                (unsigned long long)m.req_id, m.u.error.text);
    else if (!call && m.type == CFX_MSG_ERROR)
        CFX_LOG(WARN, CTL, "coordinator %s refused request %llu: %s (%s)", ctl->coord,
                (unsigned long long)m.req_id, m.u.error.text, cfx_errname(m.u.error.status));

    /* A lookup answered after its caller gave up still made this node a
     * receiver of the source; release that slot so it is not leaked. */
    if (!call && m.type == CFX_MSG_LOOKUP_REPLY && !m.u.lookup_reply.is_inline) {
        struct cfx_msg d = { .type = CFX_MSG_OBJ_DONE };
        d.u.done.id = m.u.lookup_reply.id;
        d.u.done.source_node = m.u.lookup_reply.node.node_id;
        d.u.done.complete = 0;
        pthread_mutex_lock(&ctl->lock);
        d.req_id = ++ctl->next_req;
        pthread_mutex_unlock(&ctl->lock);
        cfx__ctl_send(ctl, &d, cfx__deadline_ns((int)ctl->heartbeat_ms), "release of a late lookup");
    }
}

static int ctl_reconnect(struct cfx_ctl *ctl);

static void *reader_thread(void *arg)
{
    struct cfx_ctl *ctl = arg;

    for (;;) {
        uint64_t hb_ns = (uint64_t)ctl->heartbeat_ms * 1000000ull;
        uint64_t next_hb = ctl->role == CFX_CTL_ROLE_NODE ? cfx__now_ns() + hb_ns : UINT64_MAX;
        int lost = 0, closing = 0, lost_status = CFX_ERR_CONNECT;
        char why[256] = "";

        while (!lost) {
            if (next_hb != UINT64_MAX && cfx__now_ns() >= next_hb) {
                struct cfx_msg hb = { .type = CFX_MSG_HEARTBEAT, .req_id = 0 };
                if (ctl->load_fill)
                    ctl->load_fill(ctl->arg, &hb.u.hb.load);
                if (ctl->beat_fill)
                    ctl->beat_fill(ctl->arg, &hb.u.hb);
                int rc = cfx__ctl_send(ctl, &hb, cfx__deadline_ns((int)ctl->dead_after_ms),
                                  "heartbeat");
                if (rc != CFX_OK && rc != CFX_ERR_TIMEOUT) {
                    snprintf(why, sizeof(why), "%s", cfx_last_error());
                    lost = 1;
                    break;
                }
                next_hb = cfx__now_ns() + hb_ns;
            }
            struct pollfd p[2] = { { .fd = ctl->fd, .events = POLLIN },
                                   { .fd = ctl->wake_fd, .events = POLLIN } };
            int n = poll(p, 2, cfx__ms_left(next_hb));
            if (n < 0 && errno != EINTR) {
                snprintf(why, sizeof(why), "poll: %s", strerror(errno));
                lost = 1;
                break;
            }
            if (n > 0 && (p[1].revents & POLLIN)) {
                closing = 1;
                break;
            }
            if (n <= 0 || !(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int rc = rbuf_read(ctl);
            if (rc == CFX_ERR_AGAIN)
                continue;
            if (rc != CFX_OK) {
                snprintf(why, sizeof(why), "%s", cfx_last_error());
                lost = 1;
                break;
            }
            size_t flen = 0, plen = 0;
            while ((rc = rbuf_frame(ctl, &flen)) == 1 &&
                   (rc = frame_open(ctl, ctl->rbuf, flen, &plen)) == CFX_OK) {
                deliver(ctl, ctl->rbuf, plen);
                rbuf_consume(ctl, flen);
            }
            if (rc < 0) {
                snprintf(why, sizeof(why), "%s", cfx_last_error());
                if (rc == CFX_ERR_AUTH)
                    lost_status = CFX_ERR_AUTH;
                lost = 1;
            }
        }

        pthread_mutex_lock(&ctl->lock);
        ctl->broken = 1;
        if (!ctl->lost_ns)
            ctl->lost_ns = cfx__now_ns();
        closing |= ctl->closing;
        int again = lost && !closing && ctl->role == CFX_CTL_ROLE_NODE;
        if (again)
            __atomic_store_n(&ctl->reconnecting, 1, __ATOMIC_RELEASE);
        fail_all_calls(ctl, lost_status);
        pthread_mutex_unlock(&ctl->lock);
        if (lost && !closing) {
            if (ctl->coord_stopping) /* it said so: a job's end, or a restart */
                CFX_LOG(INFO, CTL, "coordinator %s stopped%s", ctl->coord,
                        again ? "; reconnecting" : "");
            else
                CFX_LOG(WARN, CTL, "lost the coordinator %s: %s%s", ctl->coord, why,
                        again ? "; reconnecting" : "");
            ctl->stopped_in_order = ctl->coord_stopping;
            ctl->coord_stopping = 0;
            if (ctl->on_node_dead)
                ctl->on_node_dead(ctl->arg, 0);
        }
        if (!again || ctl_reconnect(ctl) != CFX_OK)
            break;
    }
    pthread_mutex_lock(&ctl->lock);
    __atomic_store_n(&ctl->reconnecting, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&ctl->conn_cond);
    pthread_mutex_unlock(&ctl->lock);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Open / close                                                              */

static int connect_deadline(struct cfx_ctl *ctl, uint64_t deadline)
{
    struct sockaddr_in sa;
    int one = 1, rc;

    rc = cfx__parse_hostport(ctl->coord, &sa);
    if (rc != CFX_OK)
        return rc; /* the detail already names the bad address */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "socket: %s", strerror(errno));
    /* a reconnect runs while callers' sends read ctl->fd under send_lock */
    pthread_mutex_lock(&ctl->send_lock);
    ctl->fd = fd;
    __atomic_store_n(&ctl->conn_gen, ctl->conn_gen + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&ctl->send_lock);
    setsockopt(ctl->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(ctl->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
        return CFX_OK;
    if (errno != EINPROGRESS)
        return cfx__err(CFX_ERR_CONNECT, "cannot connect to coordinator %s: %s", ctl->coord,
                        strerror(errno));
    for (;;) {
        struct pollfd p = { .fd = ctl->fd, .events = POLLOUT };
        int ms = cfx__ms_left(deadline);
        if (ms == 0)
            return cfx__err(CFX_ERR_TIMEOUT, "cannot connect to coordinator %s: timed out",
                            ctl->coord);
        int n = poll(&p, 1, ms);
        if (n < 0 && errno != EINTR)
            return cfx__err(CFX_ERR_IO, "poll: %s", strerror(errno));
        if (n > 0)
            break;
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(ctl->fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err)
        return cfx__err(CFX_ERR_CONNECT, "cannot connect to coordinator %s: %s", ctl->coord,
                        strerror(err));
    return CFX_OK;
}

static int handshake(struct cfx_ctl *ctl, const struct cfx_ctl_params *params, uint64_t deadline);

/*
 * First connection and handshake of cfx__ctl_open().  A NODE client whose
 * coordinator is not listening yet (processes on several hosts started in
 * any order), or closed the connection without a word (it shed us at its
 * file-descriptor or connection limit, or is going down for a restart),
 * tries again with backoff until @p deadline; the last error names the
 * coordinator and how long it was tried.  So does one refused at a
 * connection cap before AUTH_OK (CFX_ERR_NO_RESOURCE naming max_conns,
 * or max_unauth_per_ip / max_unauth_conns when it was closed to make room
 * for a newer one): those are transient,
 * handshakes end within a round trip, and a burst of ranks on one host can
 * meet the per-source cap.  Any other refusal (token, version, mode; a
 * JOIN refused at max_nodes or out of node ids) is final.  ADMIN clients (rdmactl) try once.
 */
/* Sleep @p ms between two attempts to reach the coordinator, running the
 * calling thread's interrupt check when due (within cfx__intr_begin():
 * cfx_context_create()); whether it asked to stop. */
static bool nap_intr(int ms)
{
    uint64_t end = cfx__deadline_ns(ms);
    for (uint64_t now = cfx__now_ns(); now < end; now = cfx__now_ns()) {
        poll(NULL, 0, (int)((cfx__intr_until(end) - now + 999999) / 1000000));
        if (cfx__intr_poll(NULL))
            return true;
    }
    return false;
}

static int connect_first(struct cfx_ctl *ctl, const struct cfx_ctl_params *params,
                         uint64_t deadline)
{
    int backoff = CTL_BACKOFF_MIN_MS, attempts = 0;
    uint64_t t0 = cfx__now_ns();
    int rc;

    char why[CFX_PROTO_TEXT_MAX] = "";
    int why_rc = CFX_ERR_CONNECT; /* the status of the refusal in why */

    for (;;) {
        attempts++;
        ctl->rlen = 0;
        rc = connect_deadline(ctl, deadline);
        if (rc == CFX_OK)
            rc = handshake(ctl, params, deadline);
        if (rc == CFX_OK)
            return CFX_OK;
        /* the deadline ran out in an attempt after refusals: the refusal is
         * the news, not the last attempt's timeout */
        if (rc == CFX_ERR_TIMEOUT && why[0])
            rc = why_rc;
        else if ((rc != CFX_ERR_CONNECT && !(rc == CFX_ERR_NO_RESOURCE && ctl->door_refused)) ||
                 ctl->role != CFX_CTL_ROLE_NODE)
            return rc;
        else {
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            why_rc = rc;
        }
        pthread_mutex_lock(&ctl->send_lock); /* a reconnect's senders read it there */
        if (ctl->fd >= 0)
            close(ctl->fd);
        ctl->fd = -1;
        pthread_mutex_unlock(&ctl->send_lock);
        int left = cfx__ms_left(deadline);
        if (left == 0)
            return cfx__err(why_rc, "%s (tried %d times for %llu ms)", why, attempts,
                            (unsigned long long)((cfx__now_ns() - t0) / 1000000ull));
        if (attempts == 1)
            CFX_LOG(INFO, CTL, "%s; retrying until the deadline (%d ms left)", why, left);
        if (nap_intr(backoff < left ? backoff : left))
            return cfx__err(CFX_ERR_CANCELED, "interrupted while waiting for coordinator %s, "
                            "after %d attempt%s (%s)", ctl->coord, attempts,
                            attempts == 1 ? "" : "s", why);
        backoff = backoff * 2 > CTL_BACKOFF_MAX_MS ? CTL_BACKOFF_MAX_MS : backoff * 2;
    }
}

static int handshake(struct cfx_ctl *ctl, const struct cfx_ctl_params *params, uint64_t deadline)
{
    struct cfx_msg m, r;
    uint8_t *frame = NULL;
    uint8_t snonce[CFX_AUTH_NONCE_LEN], cnonce[CFX_AUTH_NONCE_LEN], bind[CFX_CTL_BIND_LEN];
    int rc, their_mode;

    pthread_mutex_lock(&ctl->send_lock); /* a new connection starts plain */
    cfx__ctl_seal_stop(&ctl->seal);
    pthread_mutex_unlock(&ctl->send_lock);
    /* until AUTH_OK a refusal is the door's: a connection cap, or this
     * connection closed to make room (connect_first tries again) */
    ctl->door_refused = 1;
    rc = recv_sync(ctl, deadline, "authentication", &m, &frame);
    if (rc != CFX_OK)
        return rc;
    if (m.type == CFX_MSG_ERROR) {
        rc = cfx__ctl_err(ctl, m.u.error.status, "authentication", "%s", m.u.error.text);
        goto out_free;
    }
    if (m.type != CFX_MSG_CHALLENGE) {
        rc = cfx__ctl_err(ctl, CFX_ERR_PROTO, "authentication", "expected CHALLENGE, got %s",
                     cfx__msg_type_name(m.type));
        goto out_free;
    }
    memcpy(snonce, m.u.challenge.nonce, sizeof(snonce));
    their_mode = m.u.challenge.secure;
    free(frame);
    frame = NULL;

    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_AUTH;
    pthread_mutex_lock(&ctl->lock);
    r.req_id = ++ctl->next_req;
    pthread_mutex_unlock(&ctl->lock);
    r.u.auth.role = (uint8_t)ctl->role;
    r.u.auth.secure = (uint8_t)ctl->secure;
    /* both MACs cover role and mode: no side can be talked into another mode */
    cfx__ctl_auth_bind(r.u.auth.role, r.u.auth.secure, bind);
    if ((rc = cfx__auth_nonce(cnonce, sizeof(cnonce))) != CFX_OK ||
        (rc = cfx__auth_mac_bound(params->token, CFX_AUTH_CLIENT, snonce, cnonce, bind,
                                  sizeof(bind), r.u.auth.mac)) != CFX_OK)
        return rc;
    memcpy(r.u.auth.nonce, cnonce, sizeof(cnonce));
    rc = cfx__ctl_send(ctl, &r, deadline, "authentication");
    if (rc != CFX_OK)
        return rc;
    if (their_mode != ctl->secure)
        /* refused here; the AUTH (its mode under the MAC) went out first so
         * that the coordinator logs the refusal too */
        return cfx__err(CFX_ERR_AUTH, "the coordinator %s runs with CFX_SECURE=%s, this client "
                        "with %s", ctl->coord, cfx__seal_mode_name(their_mode),
                        cfx__seal_mode_name(ctl->secure));
    rc = recv_sync(ctl, deadline, "authentication", &m, &frame);
    if (rc == CFX_ERR_CONNECT)
        /* A refused token gets an ERROR frame first; a bare close means the
         * coordinator gave up on us (its authentication deadline, overload). */
        return cfx__err(CFX_ERR_CONNECT, "coordinator %s closed the connection during "
                        "authentication without saying why (authentication too slow?)",
                        ctl->coord);
    if (rc != CFX_OK)
        return rc;
    if (m.type == CFX_MSG_ERROR && m.u.error.status == CFX_ERR_AUTH) {
        /* its words: the token, or the CFX_SECURE modes of both sides */
        rc = cfx__err(CFX_ERR_AUTH, "%s", m.u.error.text[0] ? m.u.error.text
                                                            : "the coordinator refused us");
        goto out_free;
    }
    if (m.type == CFX_MSG_ERROR) {
        rc = cfx__ctl_err(ctl, m.u.error.status, "authentication", "%s", m.u.error.text);
        goto out_free;
    }
    if (m.type != CFX_MSG_AUTH_OK) {
        rc = cfx__ctl_err(ctl, CFX_ERR_PROTO, "authentication", "expected AUTH_OK, got %s",
                     cfx__msg_type_name(m.type));
        goto out_free;
    }
    if (cfx__auth_verify_bound(params->token, CFX_AUTH_COORD, snonce, cnonce, bind,
                               sizeof(bind), m.u.auth_ok.mac) != CFX_OK) {
        rc = cfx__err(CFX_ERR_AUTH, "coordinator %s did not prove it knows the cluster token "
                      "(a coordinator of another cluster?)", ctl->coord);
        goto out_free;
    }
    free(frame);
    frame = NULL;
    ctl->door_refused = 0; /* in: what is refused from here on is final */
    /* every frame after AUTH_OK, both ways, is sealed (ctl_seal.h) */
    pthread_mutex_lock(&ctl->send_lock);
    rc = cfx__ctl_seal_start(&ctl->seal, ctl->secure, params->token, snonce, cnonce,
                             r.u.auth.role, true);
    pthread_mutex_unlock(&ctl->send_lock);
    if (rc != CFX_OK)
        return cfx__ctl_err(ctl, rc, "authentication", "cannot set up the sealing keys: %s",
                       cfx_last_error());
    if (ctl->role != CFX_CTL_ROLE_NODE)
        return CFX_OK;

    memset(&r, 0, sizeof(r));
    r.type = CFX_MSG_JOIN;
    pthread_mutex_lock(&ctl->lock);
    r.req_id = ++ctl->next_req;
    pthread_mutex_unlock(&ctl->lock);
    r.u.join = *params->self;
    r.u.join.node_id = ctl->rejoin_id; /* a previous id to keep, or 0 */
    r.u.join.alive = 1;
    rc = cfx__ctl_send(ctl, &r, deadline, "join");
    if (rc != CFX_OK)
        return rc;
    rc = recv_sync(ctl, deadline, "join", &m, &frame);
    if (rc != CFX_OK)
        return rc;
    if (m.type == CFX_MSG_ERROR) {
        rc = cfx__ctl_err(ctl, m.u.error.status, "join", "%s", m.u.error.text);
        goto out_free;
    }
    if (m.type != CFX_MSG_JOIN_REPLY) {
        rc = cfx__ctl_err(ctl, CFX_ERR_PROTO, "join", "expected JOIN_REPLY, got %s",
                     cfx__msg_type_name(m.type));
        goto out_free;
    }
    uint32_t hb = m.u.join_reply.heartbeat_ms, dead = m.u.join_reply.dead_after_ms;
    if (dead < hb)
        dead = 2 * hb;
    /* other threads read these meanwhile (cfx__ctl_node_id(), a send's deadline) */
    __atomic_store_n(&ctl->node_id, m.u.join_reply.node_id, __ATOMIC_RELAXED);
    __atomic_store_n(&ctl->heartbeat_ms, hb, __ATOMIC_RELAXED);
    __atomic_store_n(&ctl->dead_after_ms, dead, __ATOMIC_RELAXED);
    rc = CFX_OK;

out_free:
    free(frame);
    return rc;
}

/*
 * The reader thread, after losing the coordinator: connect, authenticate and
 * rejoin (asking for our node id) with exponential backoff until it works or
 * the client is closed.  Calls wait meanwhile (ctl_call); only this thread
 * writes to the new socket until it is done.
 */
static int ctl_reconnect(struct cfx_ctl *ctl)
{
    int backoff = CTL_BACKOFF_MIN_MS, attempts = 0;
    uint32_t old_id = ctl->node_id;
    uint64_t t0 = cfx__now_ns();
    int rc;

    for (;;) {
        struct pollfd p = { .fd = ctl->wake_fd, .events = POLLIN };
        if (poll(&p, 1, backoff) > 0)
            return CFX_ERR_CLOSED; /* cfx__ctl_close() */
        pthread_mutex_lock(&ctl->lock);
        while (ctl->hold_reconnect && !ctl->closing) /* test hook */
            pthread_cond_wait(&ctl->conn_cond, &ctl->lock);
        pthread_mutex_unlock(&ctl->lock);
        attempts++;
        pthread_mutex_lock(&ctl->send_lock);
        if (ctl->fd >= 0)
            close(ctl->fd);
        ctl->fd = -1;
        pthread_mutex_unlock(&ctl->send_lock);
        ctl->rlen = 0;
        uint64_t deadline = cfx__deadline_ns(CTL_ATTEMPT_MS);
        rc = connect_deadline(ctl, deadline);
        if (rc == CFX_OK) {
            struct cfx_ctl_params cp = { .coord = ctl->coord, .token = ctl->token,
                                         .role = ctl->role, .self = &ctl->self };
            ctl->rejoin_id = old_id;
            rc = handshake(ctl, &cp, deadline);
        }
        if (rc == CFX_OK)
            break;
        if (rc == CFX_ERR_AUTH && (attempts == 1 || attempts % 10 == 0))
            CFX_LOG(ERR, CTL, "reconnecting to coordinator %s: attempt %d: %s", ctl->coord,
                    attempts, cfx_last_error());
        else if (attempts == 1 || attempts % 10 == 0)
            CFX_LOG(INFO, CTL, "reconnecting to coordinator %s: attempt %d failed: %s; "
                    "retrying every %d ms at most", ctl->coord, attempts, cfx_last_error(),
                    CTL_BACKOFF_MAX_MS);
        backoff = backoff * 2 > CTL_BACKOFF_MAX_MS ? CTL_BACKOFF_MAX_MS : backoff * 2;
    }
    /* puts sent on the lost connection will have no answer */
    aput_answered(ctl, UINT64_MAX, CFX_OK, "");
    /* the owner answers to the id it rejoined with before anything it sends
     * from now on can name this node to a peer */
    if (ctl->on_rejoined)
        ctl->on_rejoined(ctl->arg);
    pthread_mutex_lock(&ctl->lock);
    ctl->broken = 0;
    ctl->lost_ns = 0;
    ctl->reconnects++;
    __atomic_store_n(&ctl->reconnecting, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&ctl->conn_cond);
    pthread_mutex_unlock(&ctl->lock);
    /* after a stop in order (a restart), being back is no news worth a
     * warning, unless it cost this node its id */
    if (ctl->stopped_in_order && ctl->node_id == old_id)
        CFX_LOG(INFO, CTL, "reconnected to coordinator %s after %d attempt%s (%.1f s) as node %u",
                ctl->coord, attempts, attempts == 1 ? "" : "s",
                (double)(cfx__now_ns() - t0) / 1e9, ctl->node_id);
    else
        CFX_LOG(WARN, CTL, "reconnected to coordinator %s after %d attempt%s (%.1f s) as node %u%s",
                ctl->coord, attempts, attempts == 1 ? "" : "s",
                (double)(cfx__now_ns() - t0) / 1e9, ctl->node_id,
                ctl->node_id == old_id ? ""
                                       : " (a new id: the old one was taken, or the "
                                         "coordinator's rejoin window had ended)");
    ctl->stopped_in_order = 0;
    if (ctl->on_reconnected)
        ctl->on_reconnected(ctl->arg);
    return CFX_OK;
}

static void ctl_free(struct cfx_ctl *ctl)
{
    if (ctl->fd >= 0)
        close(ctl->fd);
    if (ctl->wake_fd >= 0)
        close(ctl->wake_fd);
    cfx__ctl_seal_stop(&ctl->seal);
    free(ctl->rbuf);
    OPENSSL_cleanse(ctl->token, sizeof(ctl->token));
    pthread_cond_destroy(&ctl->conn_cond);
    pthread_mutex_destroy(&ctl->send_lock);
    pthread_mutex_destroy(&ctl->lock);
    free(ctl);
}

int cfx__ctl_open(const struct cfx_ctl_params *params, struct cfx_ctl **out)
{
    struct cfx_ctl *ctl;
    int rc;

    cfx__log_init();
    if (!params || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx__ctl_open: NULL params or out");
    if (!params->coord || !*params->coord)
        return cfx__err(CFX_ERR_INVALID, "no coordinator address: set CFX_COORD=host:port");
    if (!params->token || !*params->token)
        return cfx__err(CFX_ERR_AUTH, "no cluster token: set CFX_TOKEN or CFX_TOKEN_FILE");
    if (params->role != CFX_CTL_ROLE_NODE && params->role != CFX_CTL_ROLE_ADMIN)
        return cfx__err(CFX_ERR_INVALID, "unknown client role %d", (int)params->role);
    if (params->secure != CFX_SEAL_OFF && params->secure != CFX_SEAL_INTEGRITY &&
        params->secure != CFX_SEAL_ENCRYPT)
        return cfx__err(CFX_ERR_INVALID, "CFX_SECURE mode %d is not off, integrity or encrypt",
                        params->secure);
    if (params->role == CFX_CTL_ROLE_NODE && !params->self)
        return cfx__err(CFX_ERR_INVALID, "joining coordinator %s needs a node record",
                        params->coord);
    uint64_t deadline = cfx__deadline_ns(params->timeout_ms > 0 ? params->timeout_ms
                                                                : CTL_DEFAULT_TIMEOUT_MS);

    ctl = calloc(1, sizeof(*ctl));
    if (!ctl)
        return cfx__err(CFX_ERR_NOMEM, "no memory for a coordinator client");
    ctl->fd = -1;
    ctl->wake_fd = -1;
    snprintf(ctl->coord, sizeof(ctl->coord), "%s", params->coord);
    ctl->role = params->role;
    ctl->secure = params->secure;
    ctl->on_node_dead = params->on_node_dead;
    ctl->on_node_left = params->on_node_left;
    ctl->on_reconnected = params->on_reconnected;
    ctl->on_rejoined = params->on_rejoined;
    ctl->on_obj_gone = params->on_obj_gone;
    ctl->on_put_answer = params->on_put_answer;
    ctl->on_task_run = params->on_task_run;
    ctl->load_fill = params->load_fill;
    ctl->beat_fill = params->beat_fill;
    ctl->arg = params->arg;
    snprintf(ctl->token, sizeof(ctl->token), "%s", params->token);
    if (params->self)
        ctl->self = *params->self;
    ctl->self.node_id = 0;
    cfx_list_init(&ctl->calls);
    pthread_mutex_init(&ctl->lock, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&ctl->conn_cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_mutex_init(&ctl->send_lock, NULL);
    ctl->rbuf = malloc(CTL_RBUF_INITIAL);
    if (!ctl->rbuf) {
        rc = cfx__err(CFX_ERR_NOMEM, "no memory for a coordinator client");
        goto err_free;
    }
    ctl->rcap = CTL_RBUF_INITIAL;
    ctl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctl->wake_fd < 0) {
        rc = cfx__err(CFX_ERR_IO, "eventfd: %s", strerror(errno));
        goto err_free;
    }
    rc = connect_first(ctl, params, deadline);
    if (rc != CFX_OK)
        goto err_free;
    rc = pthread_create(&ctl->thread, NULL, reader_thread, ctl);
    if (rc != 0) {
        rc = cfx__err(CFX_ERR_NO_RESOURCE, "cannot start the coordinator client thread: %s",
                      strerror(rc));
        goto err_free;
    }
    ctl->thread_started = 1;
    pthread_setname_np(ctl->thread, "cfx-ctl");
    CFX_LOG(INFO, CTL, "connected to coordinator %s as %s%s%.0u (CFX_SECURE=%s)", ctl->coord,
            ctl->role == CFX_CTL_ROLE_NODE ? "node" : "admin",
            ctl->role == CFX_CTL_ROLE_NODE ? " " : "", cfx__ctl_node_id(ctl),
            cfx__seal_mode_name(ctl->secure));
    *out = ctl;
    return CFX_OK;

err_free:
    ctl_free(ctl);
    return rc;
}

void cfx__ctl_close(struct cfx_ctl *ctl)
{
    if (!ctl)
        return;
    if (ctl->role == CFX_CTL_ROLE_NODE && !cfx__ctl_broken(ctl)) {
        struct cfx_msg m = { .type = CFX_MSG_LEAVE };
        pthread_mutex_lock(&ctl->lock);
        m.req_id = ++ctl->next_req;
        pthread_mutex_unlock(&ctl->lock);
        cfx__ctl_send(ctl, &m, cfx__deadline_ns(CTL_LEAVE_TIMEOUT_MS), "leave");
    }
    pthread_mutex_lock(&ctl->lock);
    ctl->closing = 1;
    pthread_cond_broadcast(&ctl->conn_cond); /* a reconnect held by the test hook */
    pthread_mutex_unlock(&ctl->lock);
    if (ctl->thread_started) {
        uint64_t one = 1;
        ssize_t n = write(ctl->wake_fd, &one, sizeof(one));
        (void)n;
        pthread_join(ctl->thread, NULL);
    }
    ctl_free(ctl);
}

void cfx__ctl_interrupt(struct cfx_ctl *ctl, bool on)
{
    struct cfx_list *pos;
    if (!ctl)
        return;
    pthread_mutex_lock(&ctl->lock);
    ctl->interrupted = on;
    if (on) {
        /* calls waiting for a reply end now (a late reply finds no call) */
        cfx_list_for_each(pos, &ctl->calls) {
            struct ctl_call *c = cfx_list_entry(pos, struct ctl_call, link);
            if (!c->done) {
                c->done = 1;
                c->status = CFX_ERR_CANCELED;
                pthread_cond_signal(&c->cond);
            }
        }
        pthread_cond_broadcast(&ctl->conn_cond);
    }
    pthread_mutex_unlock(&ctl->lock);
}

void cfx__ctl_test_hold_reconnect(struct cfx_ctl *ctl, bool on)
{
    pthread_mutex_lock(&ctl->lock);
    ctl->hold_reconnect = on;
    pthread_cond_broadcast(&ctl->conn_cond);
    pthread_mutex_unlock(&ctl->lock);
}

uint32_t cfx__ctl_node_id(const struct cfx_ctl *ctl)
{
    return ctl ? __atomic_load_n(&ctl->node_id, __ATOMIC_RELAXED) : 0;
}

uint32_t cfx__ctl_heartbeat_ms(const struct cfx_ctl *ctl)
{
    return ctl ? __atomic_load_n(&ctl->heartbeat_ms, __ATOMIC_RELAXED) : 0;
}

uint32_t cfx__ctl_dead_after_ms(const struct cfx_ctl *ctl)
{
    return ctl ? __atomic_load_n(&ctl->dead_after_ms, __ATOMIC_RELAXED) : 0;
}

const char *cfx__ctl_coord_addr(const struct cfx_ctl *ctl)
{
    return ctl ? ctl->coord : "";
}

uint64_t cfx__ctl_lost_ms(struct cfx_ctl *ctl)
{
    if (!ctl)
        return 0;
    pthread_mutex_lock(&ctl->lock);
    uint64_t t = ctl->lost_ns, now = cfx__now_ns();
    pthread_mutex_unlock(&ctl->lock);
    return t && now > t ? (now - t) / 1000000ull : 0;
}

bool cfx__ctl_reconnecting(const struct cfx_ctl *ctl)
{
    return ctl && __atomic_load_n(&ctl->reconnecting, __ATOMIC_ACQUIRE);
}

uint64_t cfx__ctl_reconnects(struct cfx_ctl *ctl)
{
    if (!ctl)
        return 0;
    pthread_mutex_lock(&ctl->lock);
    uint64_t n = ctl->reconnects;
    pthread_mutex_unlock(&ctl->lock);
    return n;
}

int cfx__ctl_request(struct cfx_ctl *ctl, struct cfx_msg *req, uint64_t deadline_ns,
                     const char *what, uint8_t expect, struct cfx_msg *reply, void **frame)
{
    struct ctl_call call;
    int rc = cfx__ctl_call(ctl, req, deadline_ns, &call, what);
    if (rc != CFX_OK)
        return rc;
    if (call.reply.type != expect)
        return cfx__ctl_unexpected(ctl, &call, what);
    if (reply && frame) {
        *reply = call.reply;
        *frame = call.frame;
    } else {
        free(call.frame);
    }
    return CFX_OK;
}

int cfx__ctl_send_nowait(struct cfx_ctl *ctl, struct cfx_msg *m, const char *what)
{
    pthread_mutex_lock(&ctl->lock);
    m->req_id = ++ctl->next_req;
    pthread_mutex_unlock(&ctl->lock);
    return cfx__ctl_send(ctl, m, cfx__deadline_ns((int)cfx__ctl_dead_after_ms(ctl) + 1000), what);
}

/*
 * shm connection set-up and tear-down on the unix socket: connect, accept,
 * the HELLO/ACK handshake that hands over the ring segment and doorbells,
 * and the hang-up that tells an endpoint its peer is gone.
 *
 * Who may connect (shm.h, "Trust"): a process of our effective uid in our
 * user namespace, checked from SO_PEERCRED on both ends before anything is
 * sent, that then proves the cluster token.  A refused peer is counted in
 * iface->n_refused and logged with its pid and uid.
 *
 * The handshake, connector first (as the engine's, conn_auth.c):
 *
 *   connector -> acceptor  HELLO { Nc }, fds: ring segment, doorbell
 *   acceptor  -> connector ACK   { Na, no MAC }, fd: doorbell       (challenge)
 *   connector -> acceptor  AUTH  { HMAC(token, "... shm connect" | Na | Nc) }
 *   acceptor  -> connector PROOF { HMAC(token, "... shm accept"  | Na | Nc) }
 *
 * The acceptor maps the connector's ring but reads none of it, and sends
 * nothing computed from the token, until the connector's AUTH verified.
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control/auth.h"
#include "dataplane/common/log.h"

_Static_assert(CFX_SHM_NONCE_LEN == CFX_AUTH_NONCE_LEN, "nonce sizes");
_Static_assert(CFX_SHM_MAC_LEN == CFX_AUTH_MAC_LEN, "MAC sizes");

#define CTL_MAX_FDS 2

/* ---- control messages -------------------------------------------------------- */

static int ctl_send(int sock, const struct cfx__shm_ctl *m, const int *fds, int nfds)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * CTL_MAX_FDS)];
    } cbuf;
    struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

    if (nfds) {
        memset(&cbuf, 0, sizeof(cbuf));
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t rc = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (rc == (ssize_t)sizeof(*m))
        return CFX_OK;
    return rc < 0 ? cfx__status_from_errno(errno) : CFX_ERR_IO;
}

/*
 * Receive one control message and the fds that came with it (CLOEXEC).
 * Returns 1 with a message, 0 at end of stream, CFX_ERR_AGAIN when nothing is
 * there, another negative status on error (fds closed).
 */
static int ctl_recv(int sock, struct cfx__shm_ctl *m, int *fds, int *nfds)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * 8)];
    } cbuf;
    struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                          .msg_control = cbuf.buf, .msg_controllen = sizeof(cbuf.buf) };
    ssize_t rc;
    int got = 0;

    *nfds = 0;
    rc = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (rc < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? CFX_ERR_AGAIN
                                                       : cfx__status_from_errno(errno);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (got < CTL_MAX_FDS)
                fds[got++] = fd;
            else
                close(fd);
        }
    }
    if (rc == 0 && got == 0)
        return 0;
    if (rc != (ssize_t)sizeof(*m) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
        m->magic != CFX_SHM_MAGIC || m->version != CFX_SHM_VERSION) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return CFX_ERR_PROTO;
    }
    *nfds = got;
    return 1;
}

static void ctl_init(struct cfx__shm_ctl *m, struct cfx__shm_iface *iface, int type)
{
    memset(m, 0, sizeof(*m));
    m->magic = CFX_SHM_MAGIC;
    m->version = CFX_SHM_VERSION;
    m->type = (uint16_t)type;
    m->node_id = iface->super.node_id;
}

static void send_bye(struct cfx__shm_ep *ep, int status)
{
    struct cfx__shm_ctl m;
    if (ep->sock < 0)
        return;
    ctl_init(&m, ep->iface, CFX_SHM_CTL_BYE);
    m.status = status;
    (void)ctl_send(ep->sock, &m, NULL, 0); /* best effort: the hang-up follows */
}

/* Same user namespace: /proc/<pid>/ns/user names the same inode as ours. */
static bool same_userns(pid_t pid)
{
    char path[64];
    struct stat mine, theirs;

    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
    if (stat("/proc/self/ns/user", &mine) < 0 || stat(path, &theirs) < 0)
        return false;
    return mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino;
}

/*
 * Who is at the other end of @p sock, and may it be trusted with our rings:
 * our effective uid, our user namespace.  Fills ep->peer_pid/peer_uid.
 * Returns NULL when it may, else why not (static).  The pid is 0 when the
 * peer is in a pid namespace we cannot see: its user namespace cannot be
 * checked then, so it is refused.
 */
static const char *peer_check(struct cfx__shm_ep *ep, int sock)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    ep->peer_pid = 0;
    ep->peer_uid = (uid_t)-1;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred))
        return "no peer credentials on the socket";
    ep->peer_pid = cred.pid;
    ep->peer_uid = cred.uid;
    if (cred.uid != geteuid())
        return "another user";
    if (cred.pid <= 0)
        return "a process outside our pid namespace";
    if (!same_userns(cred.pid))
        return "another user namespace";
    return NULL;
}

/*
 * Any local user may connect to the abstract socket as often as it likes,
 * and each refusal wrote a line to the job's log: so at most one a second
 * (the first at once, then one with a count, as the coordinator's refusals;
 * CFX_RATELOG, flushed by sock_check).
 */
static void log_refused(struct cfx__shm_iface *iface, const struct cfx__shm_ep *ep,
                        const char *why)
{
    iface->n_refused++;
    CFX_RATELOG(&iface->refuse_log, SHM, cfx__now_ns(), "node %u: refused shm peer pid %d uid "
                "%d (%s): %s (%llu refused so far)", iface->super.node_id, (int)ep->peer_pid,
                (int)ep->peer_uid, ep->super.peer_name, why,
                (unsigned long long)iface->n_refused);
}

static bool has_token(const struct cfx__shm_iface *iface)
{
    return iface->token[0] != '\0';
}

static int ep_watch(struct cfx__shm_ep *ep)
{
    struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = &ep->ev };
    if (epoll_ctl(ep->iface->epfd, EPOLL_CTL_ADD, ep->sock, &e) < 0)
        return cfx__status_from_errno(errno);
    return CFX_OK;
}

/* ---- connecting side ------------------------------------------------------------ */

static void send_hello(struct cfx__shm_ep *ep)
{
    struct cfx__shm_iface *iface = ep->iface;
    struct cfx__shm_ctl m;
    void *seg;
    size_t seg_len;
    int fds[2], rc;
    const char *why = peer_check(ep, ep->sock);

    if (why) {
        /* nothing of ours (segment, doorbell) goes to a stranger.  Not
         * CFX_ERR_AUTH: the peer proved nothing wrong, shm just cannot
         * reach it, and the engine tries the next transport (tcp asks
         * for the token) */
        log_refused(iface, ep, why);
        ep->super.why = why;
        cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
        return;
    }
    if (cfx__auth_nonce(ep->nonce, sizeof(ep->nonce)) != CFX_OK) {
        CFX_LOG(ERR, SHM, "node %u: no nonce for the handshake with %s: %s",
                iface->super.node_id, ep->super.peer_name, cfx_last_error());
        cfx__shm_ep_fail(ep, CFX_ERR_INTERNAL, false);
        return;
    }
    int memfd = cfx__shm_seg_create(iface->ring_size, &seg, &seg_len);
    if (memfd < 0) {
        cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
        return;
    }
    cfx__shm_ep_set_rings(ep, seg, seg_len, iface->ring_size, true);
    ctl_init(&m, iface, CFX_SHM_CTL_HELLO);
    m.ring_size = iface->ring_size;
    m.seg_size = seg_len;
    memcpy(m.nonce, ep->nonce, sizeof(m.nonce));
    fds[0] = memfd;
    fds[1] = iface->doorbell;
    rc = ctl_send(ep->sock, &m, fds, 2);
    close(memfd); /* the peer got its own reference; the mapping keeps ours */
    if (rc == CFX_OK)
        rc = ep_watch(ep);
    if (rc != CFX_OK) {
        CFX_LOG(WARN, SHM, "node %u: cannot send the handshake to %s: %s",
                iface->super.node_id, ep->super.peer_name, cfx_strerror(rc));
        cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
        return;
    }
    ep->state = CFX_SHM_EP_HELLO_SENT;
}

void cfx__shm_ep_connect_retry(struct cfx__shm_ep *ep)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    memcpy(sun.sun_path, ep->sun_path, ep->sun_len);
    if (connect(ep->sock, (struct sockaddr *)&sun,
                (socklen_t)(offsetof(struct sockaddr_un, sun_path) + ep->sun_len)) == 0) {
        send_hello(ep);
        return;
    }
    if ((errno == EAGAIN || errno == EINPROGRESS) && cfx__now_ns() < ep->connect_deadline)
        return; /* listener's backlog is full: try again from poll() */
    CFX_LOG(DEBUG, SHM, "node %u: cannot connect to %s: %s", ep->iface->super.node_id,
            ep->super.peer_name, strerror(errno));
    cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
}

int cfx__shm_ep_connect(struct cfx_tp_iface *tpi, const void *addr, size_t len,
                        uint32_t peer_node, struct cfx_tp_ep **out)
{
    CFX_TP_THREAD_CHECK(tpi);
    struct cfx__shm_iface *iface = cfx__shm_iface_of(tpi);
    const char *name = addr;
    struct cfx__shm_ep *ep;
    size_t nlen;
    int sock;

    if (!addr || !out)
        return CFX_ERR_INVALID;
    nlen = strnlen(name, len);
    if (nlen < 2 || name[0] != '@' || nlen > sizeof(ep->sun_path))
        return cfx__err(CFX_ERR_INVALID, "shm: '%.*s' is not an shm address (@name)",
                        (int)CFX_MIN(nlen, 64u), name);
    sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return cfx__err(cfx__status_from_errno(errno), "shm: socket: %s", strerror(errno));
    ep = cfx__shm_ep_alloc(iface, sock, CFX_SHM_EP_CONNECTING, peer_node);
    if (!ep) {
        close(sock);
        return cfx__err(CFX_ERR_NOMEM, "shm: out of memory for an endpoint");
    }
    snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "node %u (shm %.*s)",
             peer_node, (int)CFX_MIN(nlen, 40u), name);
    memcpy(ep->sun_path, name, nlen);
    ep->sun_path[0] = '\0';
    ep->sun_len = (uint32_t)nlen;
    ep->connect_deadline = cfx__now_ns() + CFX_SHM_CONNECT_NS;
    cfx__shm_ep_connect_retry(ep);
    *out = &ep->super;
    return CFX_OK;
}

/* ---- accepting side ----------------------------------------------------------------- */

void cfx__shm_accept(struct cfx__shm_iface *iface)
{
    for (;;) {
        int sock = accept4(iface->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (sock < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                CFX_LOG(WARN, SHM, "node %u: accept on %s: %s", iface->super.node_id,
                        iface->addr, strerror(errno));
            if (errno == EINTR)
                continue;
            return;
        }
        struct cfx__shm_ep *ep = cfx__shm_ep_alloc(iface, sock, CFX_SHM_EP_HELLO_WAIT,
                                                   UINT32_MAX);
        if (!ep) {
            CFX_LOG(ERR, SHM, "node %u: out of memory accepting a peer", iface->super.node_id);
            close(sock);
            continue;
        }
        const char *why = peer_check(ep, sock);
        ep->connect_deadline = cfx__now_ns() + CFX_SHM_CONNECT_NS; /* for its HELLO */
        snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "pid %d (shm)",
                 (int)ep->peer_pid);
        if (why) {
            /* closed before a byte of it is read: its HELLO, its fds die here */
            log_refused(iface, ep, why);
            iface->handshaking--;
            cfx_list_del(&ep->link);
            cfx__shm_ep_free(ep);
            continue;
        }
        if (ep_watch(ep) != CFX_OK) {
            iface->handshaking--;
            cfx_list_del(&ep->link);
            cfx__shm_ep_free(ep);
        }
    }
}

/* A peer that never became visible to the user goes away quietly (its
 * refusal said why, rate-limited, when @p why is NULL). */
static void drop_unaccepted(struct cfx__shm_ep *ep, const char *why)
{
    if (why)
        CFX_LOG(WARN, SHM, "node %u: dropping connection from %s: %s",
                ep->iface->super.node_id, ep->super.peer_name, why);
    ep->iface->handshaking--;
    ep->state = CFX_SHM_EP_FAILED;
    cfx_list_del(&ep->link);
    cfx__shm_ep_free(ep);
}

/*
 * A peer's doorbell must be an eventfd: we write to it from the progress
 * thread, and a pipe with no reader would raise SIGPIPE, a full one block.
 * Ours is non-blocking and the write of an eventfd never blocks then.
 */
static bool doorbell_ok(int fd)
{
    char path[64], target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0)
        return false;
    target[n] = '\0';
    int fl = fcntl(fd, F_GETFL);
    return strcmp(target, "anon_inode:[eventfd]") == 0 && fl >= 0 && (fl & O_NONBLOCK);
}

static void on_hello(struct cfx__shm_ep *ep, const struct cfx__shm_ctl *m, int *fds, int nfds)
{
    struct cfx__shm_iface *iface = ep->iface;
    struct cfx__shm_ctl ack;
    void *seg;
    size_t seg_len;
    int rc;

    if (m->type != CFX_SHM_CTL_HELLO || nfds != 2) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        drop_unaccepted(ep, "bad handshake");
        return;
    }
    if (!doorbell_ok(fds[1])) {
        close(fds[0]);
        close(fds[1]);
        drop_unaccepted(ep, "its doorbell is not a non-blocking eventfd");
        return;
    }
    rc = cfx__shm_seg_attach(fds[0], m->ring_size, &seg, &seg_len);
    close(fds[0]);
    if (rc != CFX_OK) {
        close(fds[1]);
        drop_unaccepted(ep, cfx_last_error());
        return;
    }
    cfx__shm_ep_set_rings(ep, seg, seg_len, m->ring_size, false);
    ep->peer_doorbell = fds[1];
    ep->super.peer_node = m->node_id;
    snprintf(ep->super.peer_name, sizeof(ep->super.peer_name), "node %u (shm pid %d)",
             m->node_id, (int)ep->peer_pid);
    ctl_init(&ack, iface, CFX_SHM_CTL_ACK);
    if (has_token(iface)) {
        /* the challenge: our nonce, nothing derived from the token */
        memcpy(ep->peer_nonce, m->nonce, sizeof(ep->peer_nonce));
        if (cfx__auth_nonce(ep->nonce, sizeof(ep->nonce)) != CFX_OK) {
            drop_unaccepted(ep, "no nonce for the handshake");
            return;
        }
        memcpy(ack.nonce, ep->nonce, sizeof(ack.nonce));
    }
    if (ctl_send(ep->sock, &ack, &iface->doorbell, 1) != CFX_OK) {
        drop_unaccepted(ep, "cannot answer the handshake");
        return;
    }
    if (has_token(iface)) {
        /* the ring is mapped but not read until the connector proved the token */
        ep->state = CFX_SHM_EP_AUTH_WAIT;
        return;
    }
    iface->handshaking--;
    ep->state = CFX_SHM_EP_READY;
    CFX_LOG(DEBUG, SHM, "node %u: accepted %s", iface->super.node_id, ep->super.peer_name);
    cfx__shm_cq_push(iface, CFX_TP_COMP_ACCEPT, CFX_OK, ep, 0);
}

static void on_auth(struct cfx__shm_ep *ep, const struct cfx__shm_ctl *m, int *fds, int nfds)
{
    struct cfx__shm_iface *iface = ep->iface;

    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (m->type != CFX_SHM_CTL_AUTH || nfds ||
        cfx__auth_verify(iface->token, CFX_AUTH_SHM_CONNECT, ep->nonce, ep->peer_nonce,
                         m->mac) != CFX_OK) {
        log_refused(iface, ep, "it does not prove the cluster token");
        drop_unaccepted(ep, NULL);
        return;
    }
    struct cfx__shm_ctl proof;
    ctl_init(&proof, iface, CFX_SHM_CTL_PROOF);
    if (cfx__auth_mac(iface->token, CFX_AUTH_SHM_ACCEPT, ep->nonce, ep->peer_nonce,
                      proof.mac) != CFX_OK ||
        ctl_send(ep->sock, &proof, NULL, 0) != CFX_OK) {
        drop_unaccepted(ep, "cannot prove the token back");
        return;
    }
    iface->handshaking--;
    ep->state = CFX_SHM_EP_READY;
    CFX_LOG(DEBUG, SHM, "node %u: accepted %s", iface->super.node_id, ep->super.peer_name);
    cfx__shm_cq_push(iface, CFX_TP_COMP_ACCEPT, CFX_OK, ep, 0);
}

static void ep_connected(struct cfx__shm_ep *ep)
{
    ep->iface->handshaking--;
    ep->state = CFX_SHM_EP_READY;
    CFX_LOG(DEBUG, SHM, "node %u: connected to %s", ep->iface->super.node_id,
            ep->super.peer_name);
    cfx__shm_cq_push(ep->iface, CFX_TP_COMP_CONNECTED, CFX_OK, ep, 0);
}

static void on_ack(struct cfx__shm_ep *ep, const struct cfx__shm_ctl *m, int *fds, int nfds)
{
    if (m->type != CFX_SHM_CTL_ACK || nfds != 1 || !doorbell_ok(fds[0])) {
        if (nfds == 1 && m->type == CFX_SHM_CTL_ACK)
            CFX_LOG(ERR, SHM, "node %u: %s answered with a doorbell that is not a "
                    "non-blocking eventfd", ep->iface->super.node_id, ep->super.peer_name);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
        return;
    }
    ep->peer_doorbell = fds[0];
    if (has_token(ep->iface)) {
        struct cfx__shm_ctl a;
        memcpy(ep->peer_nonce, m->nonce, sizeof(ep->peer_nonce));
        ctl_init(&a, ep->iface, CFX_SHM_CTL_AUTH);
        if (cfx__auth_mac(ep->iface->token, CFX_AUTH_SHM_CONNECT, ep->peer_nonce, ep->nonce,
                          a.mac) != CFX_OK ||
            ctl_send(ep->sock, &a, NULL, 0) != CFX_OK) {
            CFX_LOG(WARN, SHM, "node %u: cannot prove the token to %s: %s",
                    ep->iface->super.node_id, ep->super.peer_name, cfx_last_error());
            cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
            return;
        }
        ep->state = CFX_SHM_EP_PROOF_WAIT; /* nothing of its ring is read before */
        return;
    }
    ep_connected(ep);
}

/* Connector: the acceptor's answer to our proof. */
static void on_proof(struct cfx__shm_ep *ep, const struct cfx__shm_ctl *m, int *fds, int nfds)
{
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (m->type != CFX_SHM_CTL_PROOF || nfds ||
        cfx__auth_verify(ep->iface->token, CFX_AUTH_SHM_ACCEPT, ep->peer_nonce, ep->nonce,
                         m->mac) != CFX_OK) {
        log_refused(ep->iface, ep, "it does not prove the cluster token");
        cfx__shm_ep_fail(ep, CFX_ERR_AUTH, false);
        return;
    }
    ep_connected(ep);
}

/* The socket hung up (or said BYE): drain what the peer left, then fail. */
static void on_hangup(struct cfx__shm_ep *ep)
{
    if (!ep->peer_status)
        ep->peer_status = CFX_ERR_PEER_FAILED;
    CFX_LOG(DEBUG, SHM, "node %u: %s hung up (%s)", ep->iface->super.node_id,
            ep->super.peer_name, cfx_errname(ep->peer_status));
    cfx__shm_ep_sock_close(ep, false, 0);
    ep->state = CFX_SHM_EP_PEER_GONE;
}

bool cfx__shm_ep_handshake_expire(struct cfx__shm_ep *ep, uint64_t now)
{
    if (now <= ep->connect_deadline)
        return false;
    if (ep->state == CFX_SHM_EP_HELLO_WAIT || ep->state == CFX_SHM_EP_AUTH_WAIT) {
        drop_unaccepted(ep, ep->state == CFX_SHM_EP_HELLO_WAIT ? "no HELLO in time"
                                                               : "no AUTH in time");
        return true;
    }
    if (ep->state == CFX_SHM_EP_HELLO_SENT || ep->state == CFX_SHM_EP_PROOF_WAIT) {
        CFX_LOG(WARN, SHM, "node %u: %s did not answer the handshake in time",
                ep->iface->super.node_id, ep->super.peer_name);
        cfx__shm_ep_fail(ep, CFX_ERR_TIMEOUT, false);
    }
    return false;
}

void cfx__shm_ep_sock_event(struct cfx__shm_ep *ep)
{
    struct cfx__shm_ctl m;
    int fds[CTL_MAX_FDS], nfds;

    while (ep->sock >= 0) {
        int rc = ctl_recv(ep->sock, &m, fds, &nfds);
        if (rc == CFX_ERR_AGAIN)
            return;
        switch (ep->state) {
        case CFX_SHM_EP_HELLO_WAIT:
            if (rc <= 0)
                drop_unaccepted(ep, rc == 0 ? "hung up" : cfx_strerror(rc));
            else
                on_hello(ep, &m, fds, nfds);
            return; /* ep may be gone */
        case CFX_SHM_EP_AUTH_WAIT:
            if (rc <= 0)
                drop_unaccepted(ep, rc == 0 ? "hung up" : cfx_strerror(rc));
            else
                on_auth(ep, &m, fds, nfds);
            return; /* ep may be gone */
        case CFX_SHM_EP_HELLO_SENT:
            if (rc <= 0) {
                cfx__shm_ep_fail(ep, CFX_ERR_CONNECT, false);
                return;
            }
            on_ack(ep, &m, fds, nfds);
            break;
        case CFX_SHM_EP_PROOF_WAIT:
            if (rc <= 0) {
                /* an acceptor hangs up on a proof it refused */
                log_refused(ep->iface, ep, "it hung up on our proof of the cluster token "
                                           "(another token?)");
                cfx__shm_ep_fail(ep, CFX_ERR_AUTH, false);
                return;
            }
            on_proof(ep, &m, fds, nfds);
            break;
        case CFX_SHM_EP_READY:
            if (rc > 0) {
                for (int i = 0; i < nfds; i++)
                    close(fds[i]);
                if (m.type == CFX_SHM_CTL_BYE)
                    ep->peer_status = m.status < 0 && m.status > CFX_STATUS_LAST
                                          ? m.status : CFX_ERR_PEER_FAILED;
                continue;
            }
            on_hangup(ep);
            return;
        default:
            if (rc > 0)
                for (int i = 0; i < nfds; i++)
                    close(fds[i]);
            return;
        }
    }
}

void cfx__shm_ep_sock_close(struct cfx__shm_ep *ep, bool bye, int status)
{
    if (ep->sock < 0)
        return;
    if (bye)
        send_bye(ep, status);
    epoll_ctl(ep->iface->epfd, EPOLL_CTL_DEL, ep->sock, NULL);
    close(ep->sock);
    ep->sock = -1;
}

/*
 * The transport base's IPv4 TCP socket setup (tpbase.h): the tcp
 * transport's listener and connections, and the verbs transport's
 * out-of-band exchange, open and tune their sockets here.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tpbase.h"

#define LISTEN_BACKLOG 128
#define KEEPIDLE_S     10
#define KEEPINTVL_S    5
#define KEEPCNT        3

int cfx__tp_sock_listen(const char *who, const struct in_addr *ip, int *fd_out, uint16_t *port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr = *ip };
    socklen_t salen = sizeof(sa);
    char ip_str[INET_ADDRSTRLEN];
    int rc;

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "%s: socket: %s", who, strerror(errno));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, LISTEN_BACKLOG) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) < 0) {
        int err = errno;
        inet_ntop(AF_INET, ip, ip_str, sizeof(ip_str));
        rc = cfx__err(err == EADDRNOTAVAIL ? CFX_ERR_NO_DEVICE : cfx__status_from_errno(err),
                      "%s: cannot listen on %s: %s", who, ip_str, strerror(err));
        close(fd);
        return rc;
    }
    *fd_out = fd;
    *port = ntohs(sa.sin_port);
    return CFX_OK;
}

int cfx__tp_sock_accept(int listen_fd, char *addr, size_t addr_len, uint32_t *ip_out)
{
    struct sockaddr_in sa;
    socklen_t salen = sizeof(sa);
    char ip[INET_ADDRSTRLEN];

    int fd = accept4(listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return -1;
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    snprintf(addr, addr_len, "%s:%u", ip, ntohs(sa.sin_port));
    if (ip_out)
        *ip_out = sa.sin_addr.s_addr;
    return fd;
}

bool cfx__tp_sock_accept_err_notable(int err)
{
    return err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED;
}

int cfx__tp_sock_connect(const char *who, const char *peer, const struct sockaddr_in *dst)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "%s to %s: socket: %s", who, peer,
                        strerror(errno));
    if (connect(fd, (const struct sockaddr *)dst, sizeof(*dst)) < 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return cfx__err(CFX_ERR_CONNECT, "%s to %s: %s", who, peer, strerror(err));
    }
    return fd;
}

int cfx__tp_sock_env_buf(const char *name)
{
    /* a negative one or one past an int was dropped without a word */
    return (int)cfx__env_ll_clamp(name, 0, 0, INT_MAX);
}

/*
 * The buffers every data socket of this process gets, read at its first
 * one: read per socket, a value out of bounds was warned about once per
 * connection, the same line again and again in a job of many connections.
 * Process-wide by nature, as the environment it comes from (and the log
 * level, log.c); a change to the environment after the first socket is
 * not seen.
 */
static pthread_once_t env_bufs_once = PTHREAD_ONCE_INIT;
static int env_sndbuf, env_rcvbuf; /* bytes, 0: kernel autotuning; set once */

static void env_bufs_read(void)
{
    env_sndbuf = cfx__tp_sock_env_buf("CFX_TCP_SNDBUF");
    env_rcvbuf = cfx__tp_sock_env_buf("CFX_TCP_RCVBUF");
}

void cfx__tp_sock_setup(int fd, bool bufs_from_env)
{
    int one = 1, idle = KEEPIDLE_S, intvl = KEEPINTVL_S, cnt = KEEPCNT;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    if (!bufs_from_env)
        return;
    /* Socket buffers are left to kernel autotuning unless asked for: a fixed
     * size turns autotuning off (see tcp(7)). */
    pthread_once(&env_bufs_once, env_bufs_read);
    if (env_sndbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &env_sndbuf, sizeof(env_sndbuf));
    if (env_rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &env_rcvbuf, sizeof(env_rcvbuf));
}

/*
 * Test helpers: run conflux-coord as a child process (stdout parsed for its
 * address, stderr captured to a file for log checks), and a raw control-plane
 * client that speaks the wire protocol byte by byte.  Header-only: included
 * by the integration tests that need it.
 */
#ifndef CFX_TEST_COORD_CHILD_H
#define CFX_TEST_COORD_CHILD_H

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/auth.h"
#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/common/util.h"

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

struct coord_child {
    pid_t pid;
    char addr[64];       /* "127.0.0.1:port" */
    uint16_t port;
    char log[256];       /* its stderr */
};

/* Start conflux-coord with @p args (NULL-terminated, after the program
 * name); @p nofile > 0 caps its RLIMIT_NOFILE (soft and hard). */
static inline void coord_child_start(struct coord_child *cc, const char *log, rlim_t nofile,
                              const char *const *args)
{
    int out[2];
    const char *argv[32];
    char prog[512];
    int n = 0;

    snprintf(prog, sizeof(prog), "%s/conflux-coord", CFX_BIN_DIR);
    argv[n++] = prog;
    for (; args && *args && n < 31; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    snprintf(cc->log, sizeof(cc->log), "%s", log);
    cr_assert_eq(pipe(out), 0);
    cc->pid = fork();
    cr_assert_neq(cc->pid, -1);
    if (cc->pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(out[1], 1);
        if (fd >= 0)
            dup2(fd, 2);
        close(out[0]);
        if (nofile) {
            struct rlimit rl = { nofile, nofile };
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[256] = "";
    cr_assert(f && fgets(line, sizeof(line), f), "conflux-coord printed nothing (log %s)", log);
    fclose(f);
    char *p = strstr(line, "listening on ");
    cr_assert(p, "unexpected banner: %s", line);
    snprintf(cc->addr, sizeof(cc->addr), "%s", p + strlen("listening on "));
    cc->addr[strcspn(cc->addr, "\r\n")] = '\0';
    cc->port = (uint16_t)atoi(strrchr(cc->addr, ':') + 1);
}

static inline void coord_child_kill(struct coord_child *cc, int sig)
{
    if (cc->pid <= 0)
        return;
    kill(cc->pid, sig);
    waitpid(cc->pid, NULL, 0);
    cc->pid = 0;
}

/* Blocking TCP connection to 127.0.0.1:@p port (-1 on failure). */
static inline int raw_connect(uint16_t port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    int one = 1;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static inline void raw_send(int fd, const void *buf, size_t len)
{
    (void)!send(fd, buf, len, MSG_NOSIGNAL);
}

static inline void raw_send_msg(int fd, const struct cfx_msg *m)
{
    uint8_t *buf;
    size_t len;
    cr_assert_eq(cfx__msg_encode_alloc(m, &buf, &len), CFX_OK, "%s", cfx_last_error());
    raw_send(fd, buf, len);
    free(buf);
}

/* Read one frame within @p ms: CFX_OK with *m (frame in *frame, caller
 * frees), CFX_ERR_CLOSED when the peer closed, CFX_ERR_TIMEOUT. */
static inline int raw_recv_msg(int fd, int ms, struct cfx_msg *m, uint8_t **frame)
{
    uint8_t hdr[CFX_PROTO_HDR_LEN];
    size_t got = 0, need = sizeof(hdr);
    uint8_t *buf = hdr;
    uint64_t deadline = cfx__deadline_ns(ms);
    struct cfx_msg_hdr h;

    *frame = NULL;
    for (;;) {
        while (got < need) {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            int left = cfx__ms_left(deadline);
            if (left == 0 || poll(&p, 1, left) <= 0) {
                if (buf != hdr)
                    free(buf);
                return CFX_ERR_TIMEOUT;
            }
            ssize_t n = recv(fd, buf + got, need - got, 0);
            if (n <= 0) {
                if (buf != hdr)
                    free(buf);
                return CFX_ERR_CLOSED;
            }
            got += (size_t)n;
        }
        if (buf != hdr)
            break;
        cr_assert_eq(cfx__msg_hdr_decode(hdr, sizeof(hdr), &h), CFX_OK);
        need = sizeof(hdr) + h.payload_len;
        buf = malloc(need);
        memcpy(buf, hdr, sizeof(hdr));
        if (got == need)
            break;
    }
    cr_assert_eq(cfx__msg_decode(buf, need, m), CFX_OK, "%s", cfx_last_error());
    *frame = buf;
    return CFX_OK;
}

/* 1 when the peer closes @p fd within @p ms (any bytes before are drained). */
static inline int raw_wait_closed(int fd, int ms)
{
    uint64_t deadline = cfx__deadline_ns(ms);
    char sink[4096];
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int left = cfx__ms_left(deadline);
        if (left == 0 || poll(&p, 1, left) <= 0)
            return 0;
        ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
}

/* Connect and authenticate with @p token in @p role; returns the fd. */
static inline int raw_auth(uint16_t port, const char *token, enum cfx_ctl_role role)
{
    struct cfx_msg m, a;
    uint8_t *frame;
    int fd = raw_connect(port);
    cr_assert_geq(fd, 0, "connect: %s", strerror(errno));
    cr_assert_eq(raw_recv_msg(fd, 5000, &m, &frame), CFX_OK, "no CHALLENGE");
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    memset(&a, 0, sizeof(a));
    a.type = CFX_MSG_AUTH;
    a.req_id = 1;
    a.u.auth.role = (uint8_t)role;
    cfx__auth_nonce(a.u.auth.nonce, sizeof(a.u.auth.nonce));
    uint8_t bind[CFX_CTL_BIND_LEN];
    cfx__ctl_auth_bind(a.u.auth.role, CFX_SEAL_OFF, bind);
    cr_assert_eq(cfx__auth_mac_bound(token, CFX_AUTH_CLIENT, m.u.challenge.nonce,
                                     a.u.auth.nonce, bind, sizeof(bind), a.u.auth.mac), CFX_OK);
    free(frame);
    raw_send_msg(fd, &a);
    cr_assert_eq(raw_recv_msg(fd, 5000, &m, &frame), CFX_OK, "no AUTH_OK");
    cr_assert_eq(m.type, CFX_MSG_AUTH_OK);
    free(frame);
    return fd;
}

#endif

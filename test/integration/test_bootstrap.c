/*
 * Starting the way torchrun starts ranks: MASTER_ADDR, MASTER_PORT, RANK,
 * WORLD_SIZE and CFX_TOKEN_FILE, no CFX_COORD.  Rank 0 hosts the
 * coordinator on MASTER_PORT+1; the others retry until it listens.  The
 * ranks are cfx_boottest processes with exactly that environment.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

#define WORLD      3
#define DEADLINE_S 60

static char dir[] = "/tmp/cfx_boot_XXXXXX";
static char token_path[128];

static void setup(void)
{
    char tok[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(token_path, sizeof(token_path), "%s/token", dir);
    cfx_test_token(tok, sizeof(tok));
    int fd = open(token_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert(fd >= 0, "token file: %s", strerror(errno));
    cr_assert_eq(write(fd, tok, strlen(tok)), (ssize_t)strlen(tok));
    close(fd);
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(bootstrap, .init = setup, .fini = teardown, .timeout = 120);

/*
 * Start cfx_boottest as rank @p rank with the torchrun variables only
 * (plus @p extra, NULL or "NAME=value"), its stdout and stderr into a pipe
 * whose read end goes to *rfd.  @p with_token: CFX_TOKEN_FILE is set.
 */
static pid_t spawn(int rank, int master_port, int with_token, const char *extra, int *rfd)
{
    char e_addr[] = "MASTER_ADDR=127.0.0.1", e_port[32], e_rank[32], e_world[32], e_tok[160];
    char *envp[8];
    int n = 0, p[2];

    snprintf(e_port, sizeof(e_port), "MASTER_PORT=%d", master_port);
    snprintf(e_rank, sizeof(e_rank), "RANK=%d", rank);
    snprintf(e_world, sizeof(e_world), "WORLD_SIZE=%d", WORLD);
    snprintf(e_tok, sizeof(e_tok), "CFX_TOKEN_FILE=%s", token_path);
    envp[n++] = e_addr;
    envp[n++] = e_port;
    envp[n++] = e_rank;
    envp[n++] = e_world;
    if (with_token)
        envp[n++] = e_tok;
    if (extra)
        envp[n++] = (char *)extra;
    envp[n] = NULL;
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        char *argv[] = { CFX_BIN_DIR "/cfx_boottest", "262147", NULL };
        execve(argv[0], argv, envp);
        _exit(127);
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

/* Read @p fd into @p buf (NUL terminated) until EOF, or until @p needle
 * (if not NULL) has appeared; fails the test at the deadline. */
static size_t read_until(int fd, char *buf, size_t cap, size_t len, const char *needle)
{
    time_t end = time(NULL) + DEADLINE_S;
    for (;;) {
        buf[len] = '\0';
        if (needle && strstr(buf, needle))
            return len;
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int ms = (int)(end - time(NULL)) * 1000;
        cr_assert(ms > 0, "no %s by the deadline; output so far:\n%s", needle ? needle : "EOF",
                  buf);
        int r = poll(&pfd, 1, ms);
        cr_assert(r >= 0);
        if (r == 0)
            continue;
        ssize_t got = read(fd, buf + len, cap - 1 - len);
        cr_assert(got >= 0 || errno == EINTR);
        if (got == 0) {
            cr_assert_null(needle, "EOF before %s; output:\n%s", needle, buf);
            return len;
        }
        if (got > 0)
            len += (size_t)got;
        cr_assert(len < cap - 1, "output too long:\n%s", buf);
    }
}

static int wait_exit(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Rank 1 starts first and is seen retrying; then ranks 2 and 0.  Every
 * rank checks every element of its allreduce (cfx_boottest). */
Test(bootstrap, torchrun_variables_rank0_late)
{
    static char out[WORLD][1 << 16];
    size_t len[WORLD] = { 0 };
    int fd[WORLD];
    pid_t pid[WORLD];
    /* the coordinator's port is MASTER_PORT+1: a free one */
    int coord_port = cfx_test_free_port();
    cr_assert(coord_port > 1);

    /* rank 1 logs its first refused connection at INFO: the proof that it
     * started before the coordinator listened */
    pid[1] = spawn(1, coord_port - 1, 1, "CFX_LOG_LEVEL=info", &fd[1]);
    len[1] = read_until(fd[1], out[1], sizeof(out[1]), 0, "retrying until the deadline");
    pid[2] = spawn(2, coord_port - 1, 1, NULL, &fd[2]);
    pid[0] = spawn(0, coord_port - 1, 1, NULL, &fd[0]);
    for (int r = 0; r < WORLD; r++) {
        len[r] = read_until(fd[r], out[r], sizeof(out[r]), len[r], NULL);
        close(fd[r]);
        cr_log_info("rank %d:\n%s", r, out[r]);
    }
    /* sum over i < 262147 and the three ranks of val(): computed here the
     * same way cfx_boottest computes it */
    long long total = 0;
    for (size_t i = 0; i < 262147; i++)
        for (int r = 0; r < WORLD; r++)
            total += (long long)((i * 7 + (size_t)r * 13) % 1001) - 500;
    /* rank 1 logged its configuration (INFO, one line of "k = v; "): where
     * its coordinator came from */
    char cfgline[96];
    snprintf(cfgline, sizeof(cfgline), "; coordinator = 127.0.0.1:%d (from MASTER_ADDR); ",
             coord_port);
    cr_expect_not_null(strstr(out[1], cfgline), "rank 1 lacks '%s':\n%s", cfgline + 2, out[1]);
    for (int r = 0; r < WORLD; r++) {
        char want[64];
        snprintf(want, sizeof(want), "rank %d/%d ok: %lld\n", r, WORLD, total);
        cr_expect_eq(wait_exit(pid[r]), 0, "rank %d:\n%s", r, out[r]);
        cr_expect_not_null(strstr(out[r], want), "rank %d lacks '%s':\n%s", r, want, out[r]);
    }
}

/* Rank 0 without a token does not host: CFX_ERR_AUTH, naming the variables. */
Test(bootstrap, rank0_without_token_refuses_to_host)
{
    static char out[1 << 16];
    int fd;
    int port = cfx_test_free_port();
    pid_t pid = spawn(0, port - 1, 0, NULL, &fd);
    read_until(fd, out, sizeof(out), 0, NULL);
    close(fd);
    cr_assert_eq(wait_exit(pid), 1, "%s", out);
    cr_expect_not_null(strstr(out, "-> CFX_ERR_AUTH (rank 0 (RANK) refuses to host the "
                                   "coordinator on 127.0.0.1:"),
                       "%s", out);
    cr_expect_not_null(strstr(out, "CFX_TOKEN_FILE"), "%s", out);
}

/* cfx_boottest with exactly the environment @p envp: its exit status, its
 * output in @p out. */
static int boottest_env(char *const envp[], char *out, size_t len)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        char *argv[] = { CFX_BIN_DIR "/cfx_boottest", "1", NULL };
        execve(argv[0], argv, envp);
        _exit(127);
    }
    close(p[1]);
    read_until(p[0], out, len, 0, NULL);
    close(p[0]);
    return wait_exit(pid);
}

/* MASTER_ADDR without MASTER_PORT (nor CFX_COORD_PORT): CFX_ERR_INVALID
 * naming both. */
Test(bootstrap, master_addr_without_port)
{
    static char out[1 << 16];
    char *envp[] = { "MASTER_ADDR=127.0.0.1", "RANK=1", "WORLD_SIZE=2", NULL };
    cr_assert_eq(boottest_env(envp, out, sizeof(out)), 1, "%s", out);
    cr_expect_not_null(strstr(out, "-> CFX_ERR_INVALID (MASTER_ADDR=127.0.0.1 is set but "
                                   "neither MASTER_PORT nor CFX_COORD_PORT"),
                       "%s", out);
}

/* MASTER_ADDR with CFX_RANK="" (and RANK=""): empty counts as unset, and the
 * error says they are set but empty; it said only "set ... CFX_RANK", to a
 * user who had set it. */
Test(bootstrap, empty_rank_variable_is_named)
{
    static char out[1 << 16];
    char *envp[] = { "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "CFX_RANK=", "RANK=", NULL };
    cr_assert_eq(boottest_env(envp, out, sizeof(out)), 1, "%s", out);
    cr_expect_not_null(strstr(out, "-> CFX_ERR_INVALID (MASTER_ADDR=127.0.0.1 is set but no "
                                   "rank (CFX_RANK, RANK set but empty, which counts as "
                                   "unset): set RANK"),
                       "%s", out);
}

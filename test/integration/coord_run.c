/* A restartable conflux-coord child with a state directory (coord_run.h). */
#include "coord_run.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "testutil.h"

void coord_run_setup(struct coord_run *r, const char *tag, bool debug)
{
    coord_run_setup_with(r, tag, debug, NULL);
}

void coord_run_setup_with(struct coord_run *r, const char *tag, bool debug,
                          const char *const *extra)
{
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < 7 && extra && extra[i]; i++)
        r->extra[i] = extra[i];
    cfx_test_token(r->token, sizeof(r->token));
    snprintf(r->dir, sizeof(r->dir), "/tmp/cfx-%s-%d", tag, (int)getpid());
    cr_assert(mkdir(r->dir, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", r->dir,
              strerror(errno));
    snprintf(r->statedir, sizeof(r->statedir), "%s/state", r->dir);
    snprintf(r->logpath, sizeof(r->logpath), "%s/coord.log", r->dir);
    snprintf(r->port, sizeof(r->port), "0");
    r->dead_after = "1500";
    r->debug = debug;
    coord_run_start(r);
}

void coord_run_start(struct coord_run *r)
{
    const char *a[20] = { "--port", r->port, "--token", r->token, "--state-dir", r->statedir,
                          "--heartbeat-ms", "100", "--dead-after-ms", r->dead_after, NULL };
    for (int i = 0; i < 8 && r->extra[i]; i++)
        a[10 + i] = r->extra[i];
    if (r->debug)
        setenv("CFX_LOG_LEVEL", "DEBUG", 1);
    coord_child_start(&r->cc, r->logpath, 0, a);
    if (r->debug)
        unsetenv("CFX_LOG_LEVEL");
}

void coord_run_kill(struct coord_run *r)
{
    snprintf(r->port, sizeof(r->port), "%u", r->cc.port);
    coord_child_kill(&r->cc, SIGKILL);
}

void coord_run_restart(struct coord_run *r)
{
    coord_run_kill(r);
    coord_run_start(r);
}

void coord_run_teardown(struct coord_run *r)
{
    char cmd[256];
    coord_child_kill(&r->cc, SIGTERM);
    cr_expect(!cfx_test_file_contains(r->logpath, r->token), "the token appears in the log");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
    (void)!system(cmd);
}

struct cfx_context *coord_run_join_at(const char *addr, const char *token, int timeout_ms)
{
    struct cfx_context *ctx = NULL;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = addr,
        .token = token,
        .timeout_ms = timeout_ms,
        .transports = "tcp",
    };
    if (cfx_context_create(&p, &ctx) != CFX_OK)
        return NULL;
    return ctx;
}

void coord_run_task_worker(const char *addr, const char *token, const char *name,
                           int (*fn)(const struct cfx_task_call *, void *), int in, int out,
                           int timeout_ms)
{
    char c = 0;
    struct cfx_context *ctx = coord_run_join_at(addr, token, timeout_ms);
    if (!ctx) {
        fprintf(stderr, "tasks worker: %s\n", cfx_last_error());
        _exit(2);
    }
    if (cfx_task_register(ctx, name, fn, NULL) != CFX_OK) {
        fprintf(stderr, "tasks worker: register: %s\n", cfx_last_error());
        _exit(3);
    }
    uint32_t id = cfx_context_node_id(ctx);
    if (write(out, &id, sizeof(id)) != (ssize_t)sizeof(id))
        _exit(4);
    if (read(in, &c, 1) < 0)
        _exit(5);
    cfx_context_destroy(ctx);
    _exit(0);
}

struct cfx_context *coord_run_join(struct coord_run *r, int timeout_ms)
{
    struct cfx_context *ctx = coord_run_join_at(r->cc.addr, r->token, timeout_ms);
    cr_assert(ctx, "context: %s", cfx_last_error());
    return ctx;
}

void coord_run_worker_start(struct coord_run *r, struct coord_run_worker *w, const char *env,
                            const char *dirs, const char *const *envs, int timeout_ms)
{
    int down[2], up[2], p[COORD_RUN_PIPES_MAX][2], child[COORD_RUN_PIPES_MAX];
    int np = (int)strlen(dirs);
    char spec[256], exe[512];
    size_t at;

    cr_assert_leq(np, COORD_RUN_PIPES_MAX);
    memset(w, 0, sizeof(*w));
    cr_assert_eq(pipe(down), 0);
    cr_assert_eq(pipe(up), 0);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    at = (size_t)snprintf(spec, sizeof(spec), "%d %d", down[0], up[1]);
    for (int i = 0; i < np; i++) {
        cr_assert_eq(pipe(p[i]), 0);
        child[i] = dirs[i] == 'r' ? p[i][0] : p[i][1];
        w->fd[i] = dirs[i] == 'r' ? p[i][1] : p[i][0];
        at += (size_t)snprintf(spec + at, sizeof(spec) - at, " %d", child[i]);
    }
    snprintf(spec + at, sizeof(spec) - at, " %s %s", r->cc.addr, r->token);
    w->pid = fork();
    cr_assert_geq(w->pid, 0);
    if (w->pid == 0) {
        close(down[1]);
        close(up[0]);
        for (int i = 0; i < np; i++)
            close(w->fd[i]);
        setenv(env, spec, 1);
        for (int i = 0; envs && envs[i]; i++)
            putenv((char *)envs[i]); /* exec follows: the strings outlive it */
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    for (int i = 0; i < np; i++)
        close(child[i]);
    w->to = down[1];
    w->from = up[0];
    w->npipes = np;
    struct pollfd pf = { .fd = w->from, .events = POLLIN };
    cr_assert(poll(&pf, 1, timeout_ms) == 1 && read(w->from, &w->node, 4) == 4,
              "worker did not start (log %s)", r->logpath);
}

/* Wait for @p w's exit, at most @p timeout_ms (a pidfd turns readable when
 * the process ends; waitpid has no timeout), then SIGKILL. */
static void worker_reap(struct coord_run_worker *w, int timeout_ms)
{
    int st = 0;
    int pfd = (int)syscall(SYS_pidfd_open, w->pid, 0);
    if (pfd >= 0) {
        struct pollfd p = { .fd = pfd, .events = POLLIN };
        poll(&p, 1, timeout_ms);
        close(pfd);
    }
    if (waitpid(w->pid, &st, WNOHANG) == 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &st, 0);
    }
    w->pid = 0;
}

void coord_run_worker_stop(struct coord_run_worker *w, int timeout_ms)
{
    char c = 'D';
    if (!w->pid)
        return;
    kill(w->pid, SIGCONT);
    if (write(w->to, &c, 1) != 1) { /* gone already */
    }
    worker_reap(w, timeout_ms);
}

void coord_run_worker_kill(struct coord_run_worker *w)
{
    if (!w->pid)
        return;
    kill(w->pid, SIGKILL);
    worker_reap(w, 30000);
}

void coord_run_worker_close(struct coord_run_worker *w)
{
    int *fds[2 + COORD_RUN_PIPES_MAX] = { &w->to, &w->from };
    for (int i = 0; i < w->npipes; i++)
        fds[2 + i] = &w->fd[i];
    for (int i = 0; i < 2 + w->npipes; i++)
        if (*fds[i] > 0) {
            close(*fds[i]);
            *fds[i] = -1;
        }
}

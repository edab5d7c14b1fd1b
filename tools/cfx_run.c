/*
 * cfx_run: start N ranks of a Conflux program on this host, or on several
 * hosts through a remote shell.
 *
 *   cfx_run -n N [--transport LIST] [--timeout SEC] [--token-file F | --token T]
 *           [--coord-port P] [--chunk-size S] [-v] CMD [ARGS...]
 *   cfx_run --hosts H1[:SLOTS],H2,... [-n N] [--rsh CMD] [--coord-addr A]
 *           [--oversubscribe] [-x NAME[=VALUE]]... [same options] CMD [ARGS...]
 *
 * Runs the coordinator inside this process (127.0.0.1, an ephemeral port
 * unless --coord-port), then forks N copies of CMD with the cluster
 * described in their environment:
 *
 *   CFX_RANK, CFX_LOCAL_RANK   0 .. N-1
 *   CFX_WORLD_SIZE             N
 *   CFX_COORD                  127.0.0.1:PORT
 *   CFX_TOKEN_FILE             a file only we can read holding the token
 *                              (--token-file F itself; else a private
 *                              temporary file with --token's value or 32
 *                              fresh random hex digits, removed at the end).
 *                              The token value is never in a rank's
 *                              environment or command line.
 *   CFX_TRANSPORT              with --transport
 *   CFX_CHUNK_SIZE             with --chunk-size
 *
 * Every line a rank writes to stdout or stderr comes out on the same stream
 * of cfx_run, whole, prefixed with "[RANK] ".  When a rank fails (non-zero
 * exit or a signal) the others get SIGTERM, then SIGKILL two seconds later.
 * SIGINT, SIGTERM and SIGHUP sent to cfx_run are forwarded to the ranks; a
 * second one kills them.
 *
 * With --hosts, each rank is `RSH HOST "exec sh -c WRAPPER cfx_run VAR=V...
 * CMD ARGS..."` (run/hosts.c): ranks are placed by slot as mpirun does, the
 * coordinator binds an address the hosts can reach (--coord-addr, else
 * CFX_SOCKET_IFNAME's, else this host's name's), and the token goes down
 * the rsh's stdin into a 0600 file the remote side makes.  That stdin stays
 * open as the rank's lifeline: closing it stops the remote rank even where
 * killing the local rsh does not reach the remote host.
 *
 * Exit status: 0 when every rank exited 0; the status of the first rank
 * that exited non-zero (1 when cfx_run itself failed); 128+SIG when a rank
 * was killed by SIG or cfx_run was interrupted by SIG; 124 when --timeout
 * expired.
 *
 * Single-threaded apart from the coordinator's own thread: one poll() loop
 * over the ranks' pipes and a signalfd.  Options, environment and output
 * are in run/ (run.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/status.h>

#include "args.h"
#include "control/auth.h"
#include "control/coord.h"
#include "control/seal.h"
#include "dataplane/common/util.h"
#include "run/hosts.h"
#include "run/run.h"

/* ---- starting ranks --------------------------------------------------------- */

/* The parts of one line, written with one write(): a line of at most
 * PIPE_BUF bytes reaches the pipe whole, so a rank terminated right after
 * (another rank failed first) leaves the whole reason or none of it (five
 * writes left "cannot execute X: " without its cause).  Async-signal-safe;
 * a part is cut to what is left of the line. */
static void child_say(const char *const *parts, int n)
{
    char line[512];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(parts[i]);
        if (k > sizeof(line) - 1 - len)
            k = sizeof(line) - 1 - len;
        memcpy(line + len, parts[i], k);
        len += k;
    }
    line[len++] = '\n';
    const char *s = line;
    while (len) {
        ssize_t w = write(2, s, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        len -= (size_t)w;
    }
}

/* In the child between fork() and exec: async-signal-safe calls only. */
static void __attribute__((noreturn))
child_exec(struct run *r, struct run_rank *rk, int pipes[3][2], int devnull, pid_t parent,
           const sigset_t *oldmask)
{
    struct sigaction dfl = { .sa_handler = SIG_DFL };

    /* Own process group: a terminal's ^C reaches cfx_run only, which
     * forwards it once; and a signal to the group reaches grandchildren. */
    setpgid(0, 0);
    /* Die with cfx_run, even when it is SIGKILLed. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);

    /* stdin: /dev/null here; a remote rank's rsh reads the token and then
     * holds the lifeline from pipes[2] */
    if (dup2(rk->host ? pipes[2][0] : devnull, 0) < 0 || dup2(pipes[0][1], 1) < 0 ||
        dup2(pipes[1][1], 2) < 0)
        _exit(127);
    /* Leave nothing else open: not the coordinator's sockets, not the
     * other ranks' pipes (those are O_CLOEXEC anyway). */
    close_range(3, ~0u, 0);

    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGHUP, &dfl, NULL);
    sigprocmask(SIG_SETMASK, oldmask, NULL);

    char **argv = rk->argv ? rk->argv : r->opts.argv;
    execvpe(argv[0], argv, rk->envp);

    int err = errno;
    const char *parts[] = { "cfx_run: cannot execute ", argv[0], ": ", strerror(err) };
    child_say(parts, 4);
    _exit(err == ENOENT ? 127 : 126);
}

static int spawn_rank(struct run *r, struct run_rank *rk, int devnull, const sigset_t *oldmask,
                      const char *token)
{
    int pipes[3][2] = { { -1, -1 }, { -1, -1 }, { -1, -1 } };
    pid_t parent = getpid();
    pid_t pid;

    for (int s = 0; s < (rk->host ? 3 : 2); s++) {
        if (pipe2(pipes[s], O_CLOEXEC) < 0) {
            fprintf(stderr, "cfx_run: rank %d: pipe: %s\n", rk->rank, strerror(errno));
            goto err_close_pipes;
        }
    }

    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "cfx_run: rank %d: fork: %s\n", rk->rank, strerror(errno));
        goto err_close_pipes;
    }
    if (pid == 0)
        child_exec(r, rk, pipes, devnull, parent, oldmask);

    /* Also set the group from here so kill(-pid) works even before the
     * child ran (EACCES after its exec is harmless). */
    setpgid(pid, pid);
    rk->pid = pid;
    rk->running = true;
    r->running++;
    for (int s = 0; s < 2; s++) {
        close(pipes[s][1]);
        rk->out[s].fd = pipes[s][0];
        fcntl(rk->out[s].fd, F_SETFL, O_NONBLOCK);
    }
    if (rk->host) {
        /* The token's one line fits the empty pipe's buffer: this write does
         * not block.  The write end stays open as the lifeline. */
        size_t tl = strlen(token);
        close(pipes[2][0]);
        rk->lifeline = pipes[2][1];
        if (write(rk->lifeline, token, tl) != (ssize_t)tl || write(rk->lifeline, "\n", 1) != 1)
            fprintf(stderr, "cfx_run: rank %d on %s: cannot pass the token to its rsh: %s\n",
                    rk->rank, rk->host, strerror(errno));
    }
    return 0;

err_close_pipes:
    for (int s = 0; s < 3; s++) {
        if (pipes[s][0] >= 0)
            close(pipes[s][0]);
        if (pipes[s][1] >= 0)
            close(pipes[s][1]);
    }
    return -1;
}

/* ---- ranks and signals ------------------------------------------------------ */

static const char *signame(int sig, char *buf, size_t len)
{
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, len, "SIG%s", abbrev);
    else
        snprintf(buf, len, "signal %d", sig);
    return buf;
}

static void close_lifeline(struct run_rank *rk)
{
    if (rk->lifeline >= 0) {
        close(rk->lifeline);
        rk->lifeline = -1;
    }
}

static void signal_ranks(struct run *r, int sig)
{
    for (int i = 0; i < r->opts.nranks; i++) {
        struct run_rank *rk = &r->ranks[i];
        /* A remote rank hears its stdin end even when the signal stops at
         * the local rsh (ssh does not pass it on). */
        close_lifeline(rk);
        if (!rk->running)
            continue;
        /* The whole group, so that a wrapper script's children hear it too;
         * the pid itself in case the group was not set up yet. */
        if (kill(-rk->pid, sig) < 0)
            kill(rk->pid, sig);
    }
}

/* Stop every rank still running: SIGTERM now, SIGKILL after the grace. */
static void stop_ranks(struct run *r, int sig)
{
    if (r->running == 0)
        return;
    signal_ranks(r, sig);
    if (r->kill_at_ns == UINT64_MAX)
        r->kill_at_ns = cfx__now_ns() + RUN_KILL_GRACE_MS * 1000000ull;
}

static void rank_exited(struct run *r, struct run_rank *rk, int wstatus)
{
    char sbuf[32];

    rk->running = false;
    rk->wstatus = wstatus;
    r->running--;
    close_lifeline(rk);
    char where[CFX_RUN_HOST_MAX + 8] = "";
    if (rk->host)
        snprintf(where, sizeof(where), " on %s", rk->host);

    bool ok = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
    if (!ok && rk->rank < 64 && (r->opts.may_fail >> rk->rank) & 1) {
        if (WIFSIGNALED(wstatus))
            fprintf(stderr, "cfx_run: rank %d%s (allowed to fail) exited with signal %s\n",
                    rk->rank, where, signame(WTERMSIG(wstatus), sbuf, sizeof(sbuf)));
        else
            fprintf(stderr, "cfx_run: rank %d%s (allowed to fail) exited with status %d\n",
                    rk->rank, where, WEXITSTATUS(wstatus));
        return;
    }
    bool first_failure = !ok && r->state == RUN_RUNNING;
    if (r->opts.verbose && !first_failure) {
        if (WIFEXITED(wstatus))
            fprintf(stderr, "cfx_run: rank %d%s (pid %d) exited with status %d\n", rk->rank,
                    where, (int)rk->pid, WEXITSTATUS(wstatus));
        else if (WIFSIGNALED(wstatus))
            fprintf(stderr, "cfx_run: rank %d%s (pid %d) killed by %s\n", rk->rank, where,
                    (int)rk->pid, signame(WTERMSIG(wstatus), sbuf, sizeof(sbuf)));
    }
    if (!first_failure)
        return;

    /* The first failure decides the exit status and stops the rest. */
    r->state = RUN_FAILED;
    if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        fprintf(stderr, "cfx_run: rank %d%s exited with signal %s (%s)%s\n", rk->rank, where,
                signame(sig, sbuf, sizeof(sbuf)), strsignal(sig),
                WCOREDUMP(wstatus) ? ", core dumped" : "");
        r->exit_code = 128 + sig;
    } else {
        int st = WEXITSTATUS(wstatus);
        /* Through an rsh: 127 is the remote shell's "not found", 255 ssh's
         * own failure (no connection, refused login). */
        const char *hint = !rk->host ? ""
                           : st == 127 ? " (the command was not found there)"
                           : st == 255 ? " (the remote shell's own failure: host unreachable or "
                                         "login refused?)"
                                       : "";
        fprintf(stderr, "cfx_run: rank %d%s exited with status %d%s\n", rk->rank, where, st,
                hint);
        r->exit_code = st;
    }
    if (r->running > 0)
        fprintf(stderr, "cfx_run: terminating the other %d rank%s\n", r->running,
                r->running == 1 ? "" : "s");
    stop_ranks(r, SIGTERM);
}

static void reap(struct run *r)
{
    int wstatus;
    pid_t pid;

    while ((pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
        if (!WIFEXITED(wstatus) && !WIFSIGNALED(wstatus))
            continue;
        for (int i = 0; i < r->opts.nranks; i++) {
            if (r->ranks[i].running && r->ranks[i].pid == pid) {
                rank_exited(r, &r->ranks[i], wstatus);
                break;
            }
        }
    }
}

static void on_signal(struct run *r, int sig)
{
    char sbuf[32], fbuf[32];

    if (sig == SIGCHLD) {
        reap(r);
        return;
    }
    if (r->state == RUN_INTERRUPTED) {
        /* the second may not be the first again (SIGINT, then SIGTERM) */
        fprintf(stderr, "cfx_run: second signal (%s; the first was %s): killing every rank\n",
                signame(sig, sbuf, sizeof(sbuf)), signame(r->first_sig, fbuf, sizeof(fbuf)));
        signal_ranks(r, SIGKILL);
        return;
    }
    if (r->state == RUN_RUNNING || r->state == RUN_FAILED) {
        fprintf(stderr, "cfx_run: got %s: forwarding to %d rank%s\n",
                signame(sig, sbuf, sizeof(sbuf)), r->running, r->running == 1 ? "" : "s");
        if (r->state == RUN_RUNNING)
            r->exit_code = 128 + sig;
        r->state = RUN_INTERRUPTED;
        r->first_sig = sig;
        signal_ranks(r, sig);
        return;
    }
    /* Timed out and already stopping: a signal only hurries things. */
    signal_ranks(r, SIGKILL);
}

static void drain_signals(struct run *r)
{
    struct signalfd_siginfo si;

    for (;;) {
        ssize_t n = read(r->sigfd, &si, sizeof(si));
        if (n != (ssize_t)sizeof(si))
            return; /* EAGAIN */
        on_signal(r, (int)si.ssi_signo);
    }
}

static void check_timers(struct run *r)
{
    uint64_t now = cfx__now_ns();

    if (now >= r->deadline_ns) {
        r->deadline_ns = UINT64_MAX;
        fprintf(stderr, "cfx_run: timed out after %g s; killing %d rank%s\n", r->opts.timeout_s,
                r->running, r->running == 1 ? "" : "s");
        if (r->state == RUN_RUNNING) {
            r->state = RUN_TIMED_OUT;
            r->exit_code = 124;
        }
        stop_ranks(r, SIGTERM);
    }
    if (r->running > 0 && now >= r->kill_at_ns) {
        fprintf(stderr, "cfx_run: %d rank%s still running after %d ms: SIGKILL\n", r->running,
                r->running == 1 ? "" : "s", RUN_KILL_GRACE_MS);
        signal_ranks(r, SIGKILL);
        r->kill_at_ns = UINT64_MAX;
    }
}

static int poll_timeout(const struct run *r)
{
    if (r->running > 0)
        return cfx__ms_left(CFX_MIN(r->deadline_ns, r->kill_at_ns));
    return cfx__ms_left(r->drain_until_ns);
}

/* The event loop: until every rank is reaped and its output drained. */
static void run_loop(struct run *r)
{
    for (;;) {
        size_t nfds = 0;

        r->pfds[nfds++] = (struct pollfd){ .fd = r->sigfd, .events = POLLIN };
        for (int i = 0; i < r->opts.nranks; i++) {
            for (int s = 0; s < 2; s++) {
                struct run_stream *st = &r->ranks[i].out[s];
                if (st->fd < 0)
                    continue;
                r->pstream[nfds] = st;
                r->prank[nfds] = &r->ranks[i];
                r->pfds[nfds++] = (struct pollfd){ .fd = st->fd, .events = POLLIN };
            }
        }
        if (r->running == 0) {
            if (nfds == 1)
                break;
            /* A rank's own child may still hold the pipe open: give it a
             * moment, then stop listening. */
            if (r->drain_until_ns == UINT64_MAX)
                r->drain_until_ns = cfx__now_ns() + RUN_DRAIN_MS * 1000000ull;
            else if (cfx__now_ns() >= r->drain_until_ns)
                break;
        }

        int n = poll(r->pfds, nfds, poll_timeout(r));
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "cfx_run: poll: %s\n", strerror(errno));
            break;
        }
        if (n > 0) {
            for (size_t i = 1; i < nfds; i++)
                if (r->pfds[i].revents)
                    cfx__run_stream_read(r, r->prank[i], r->pstream[i]);
            if (r->pfds[0].revents)
                drain_signals(r);
        }
        check_timers(r);
    }

    /* Flush and close whatever is left open. */
    for (int i = 0; i < r->opts.nranks; i++)
        for (int s = 0; s < 2; s++)
            if (r->ranks[i].out[s].fd >= 0)
                cfx__run_stream_close(r, &r->ranks[i], &r->ranks[i].out[s]);
}

/* --allow-fail names ranks of this job only: a rank past -n (-a 5 with -n 2)
 * is a typo that would otherwise do nothing.  0, or -1 after naming it. */
static int allow_fail_check(const struct run_opts *o)
{
    for (int rk = o->nranks; rk < 64; rk++) {
        if (o->may_fail & (1ull << rk)) {
            fprintf(stderr, "cfx_run: --allow-fail: rank %d is not a rank of this job "
                    "(0..%d with %d rank%s)\n", rk, o->nranks - 1, o->nranks,
                    o->nranks == 1 ? "" : "s");
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct run r = { .state = RUN_RUNNING,
                     .sigfd = -1,
                     .deadline_ns = UINT64_MAX,
                     .kill_at_ns = UINT64_MAX,
                     .drain_until_ns = UINT64_MAX };
    struct cfx_coord *coord = NULL;
    char token_buf[2 * RUN_TOKEN_BYTES + 1];
    char coord_ip[64] = "127.0.0.1", coord_addr[80];
    struct cfx_run_hosts hosts = { 0 };
    int *host_of = NULL, *local_of = NULL;
    char **rsh = NULL;
    sigset_t mask, oldmask;
    int devnull = -1;
    int spawned = 0;
    int rc;

    char token_path[PATH_MAX] = "";     /* file the ranks read; ours to remove when made here */
    bool token_path_ours = false;
    char file_token[CFX_TOKEN_MAX + 1];
    if (cfx__run_parse_opts(argc, argv, &r.opts) < 0 ||
        (!r.opts.hosts && allow_fail_check(&r.opts) < 0))
        return TOOL_EXIT_USAGE;
    if (r.opts.hosts) {
        /* every check of --hosts before anything starts */
        if (cfx__run_hosts_parse(r.opts.hosts, &hosts) < 0)
            return TOOL_EXIT_USAGE;
        if (r.opts.nranks == 0)
            r.opts.nranks = CFX_MIN(hosts.total_slots, RUN_MAX_RANKS);
        if (allow_fail_check(&r.opts) < 0) {
            rc = TOOL_EXIT_USAGE;
            goto out_hosts;
        }
        host_of = calloc((size_t)r.opts.nranks, sizeof(*host_of));
        local_of = calloc((size_t)r.opts.nranks, sizeof(*local_of));
        if (!host_of || !local_of) {
            fprintf(stderr, "cfx_run: out of memory\n");
            rc = 1;
            goto out_hosts;
        }
        rc = TOOL_EXIT_USAGE;
        if (cfx__run_hosts_place(&hosts, r.opts.nranks, r.opts.oversubscribe, host_of,
                                 local_of) < 0 ||
            !(rsh = cfx__run_rsh_split(r.opts.rsh)))
            goto out_hosts;
        for (int x = 0; x < r.opts.nxvars; x++) {
            if (!strchr(r.opts.xvars[x], '=') && !getenv(r.opts.xvars[x])) {
                fprintf(stderr, "cfx_run: -x: '%s' is not set here (give -x NAME=VALUE)\n",
                        r.opts.xvars[x]);
                goto out_hosts;
            }
        }
        rc = 1;
        if (cfx__run_coord_addr(r.opts.coord_host, &hosts, coord_ip, sizeof(coord_ip)) < 0)
            goto out_hosts;
    }
    const char *token = r.opts.token;
    if (r.opts.token_file && token) {
        fprintf(stderr, "cfx_run: give --token-file or --token, not both\n");
        rc = TOOL_EXIT_USAGE;
        goto out_hosts;
    }
    if (r.opts.token_file) {
        /* read it as the ranks will, so that a bad file fails here: a bad
         * value of the option, a usage error (exit 2) as conflux-coord's */
        if (setenv("CFX_TOKEN_FILE", r.opts.token_file, 1) < 0 || unsetenv("CFX_TOKEN") < 0) {
            fprintf(stderr, "cfx_run: --token-file %s: %s\n", r.opts.token_file,
                    strerror(errno));
            rc = 1;
            goto out_hosts;
        }
        if (cfx__token_load_file(r.opts.token_file, r.opts.token_file, file_token,
                                 sizeof(file_token)) != CFX_OK) {
            fprintf(stderr, "cfx_run: --token-file: %s\n", cfx_last_error());
            rc = TOOL_EXIT_USAGE;
            goto out_hosts;
        }
        if (!realpath(r.opts.token_file, token_path)) {
            fprintf(stderr, "cfx_run: --token-file %s: %s\n", r.opts.token_file,
                    strerror(errno));
            rc = 1;
            goto out_hosts;
        }
        token = file_token;
    } else {
        rc = 1;
        if (!token) {
            if (cfx__run_random_token(token_buf, sizeof(token_buf)) < 0)
                goto out_hosts;
            token = token_buf;
        }
        /* remote ranks get their own file on their host, from the lifeline */
        if (!r.opts.hosts) {
            if (cfx__run_token_file_write(token, token_path, sizeof(token_path)) < 0)
                goto out_hosts;
            token_path_ours = true;
        }
    }

    /* Block the signals we handle before any thread exists, so the
     * coordinator's thread inherits the mask and the signalfd sees them. */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    if (sigprocmask(SIG_BLOCK, &mask, &oldmask) < 0) {
        perror("cfx_run: sigprocmask");
        rc = 1;
        goto out_unlink_token;
    }
    signal(SIGPIPE, SIG_IGN);
    r.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (r.sigfd < 0) {
        perror("cfx_run: signalfd");
        rc = 1;
        goto out_unlink_token;
    }
    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) {
        perror("cfx_run: /dev/null");
        rc = 1;
        goto out_close_sigfd;
    }

    struct cfx_coord_params cp = {
        .bind_addr = coord_ip,
        .port = (uint16_t)r.opts.port,
        .token = token,
        .fanout = r.opts.fanout,
        /* its ranks start at once, all from this host: each may wait in
         * the challenge at the same time (the per-address default, 16,
         * is for one host among many; a 48-rank run was cut and retried,
         * with a warning a second) */
        .max_unauth_per_ip = (uint32_t)CFX_MAX(16, 2 * r.opts.nranks),
        .max_unauth_conns = (uint32_t)CFX_MAX(256, 2 * r.opts.nranks),
    };
    /* the ranks inherit CFX_SECURE: their coordinator must run with it */
    if (cfx__seal_mode_parse(getenv("CFX_SECURE"), &cp.secure) != CFX_OK) {
        fprintf(stderr, "cfx_run: %s\n", cfx_last_error());
        rc = 2;
        goto out_close_devnull;
    }
    rc = cfx__coord_start(&cp, &coord);
    if (rc != CFX_OK) {
        fprintf(stderr, "cfx_run: cannot start the coordinator on %s:%u: %s%s%s\n", coord_ip,
                r.opts.port, cfx_strerror(rc), *cfx_last_error() ? ": " : "", cfx_last_error());
        rc = 1;
        goto out_close_devnull;
    }
    snprintf(coord_addr, sizeof(coord_addr), "%s:%u", coord_ip, (unsigned)cfx__coord_port(coord));
    if (r.opts.verbose)
        fprintf(stderr, "cfx_run: coordinator on %s, %d rank%s: %s\n", coord_addr, r.opts.nranks,
                r.opts.nranks == 1 ? "" : "s", r.opts.argv[0]);

    size_t nfds_max = 1 + 2 * (size_t)r.opts.nranks;
    r.ranks = calloc((size_t)r.opts.nranks, sizeof(*r.ranks));
    r.pfds = calloc(nfds_max, sizeof(*r.pfds));
    r.pstream = calloc(nfds_max, sizeof(*r.pstream));
    r.prank = calloc(nfds_max, sizeof(*r.prank));
    if (!r.ranks || !r.pfds || !r.pstream || !r.prank) {
        fprintf(stderr, "cfx_run: out of memory\n");
        rc = 1;
        goto out_free_ranks;
    }
    for (int i = 0; i < r.opts.nranks; i++)
        r.ranks[i].lifeline = -1; /* before any exit through the cleanup below */
    for (int i = 0; i < r.opts.nranks; i++) {
        struct run_rank *rk = &r.ranks[i];
        rk->rank = i;
        rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ", i);
        rk->out[0] = (struct run_stream){ .fd = -1, .out_fd = 1 };
        rk->out[1] = (struct run_stream){ .fd = -1, .out_fd = 2 };
        rk->envp = cfx__run_build_env(&r.opts, i, coord_addr, token_path, &rk->env_own, r.opts.hosts);
        if (rk->envp && r.opts.hosts) {
            char **vars = cfx__run_remote_vars(&r.opts, i, local_of[i], coord_addr);
            rk->host = hosts.v[host_of[i]].name;
            rk->argv = vars ? cfx__run_remote_argv(rsh, rk->host, vars, r.opts.argv) : NULL;
            cfx__run_argv_free(vars);
            if (!rk->argv) {
                fprintf(stderr, "cfx_run: out of memory\n");
                rc = 1;
                goto out_free_ranks;
            }
            if (r.opts.verbose)
                fprintf(stderr, "cfx_run: rank %d on %s (local rank %d)\n", i, rk->host,
                        local_of[i]);
        }
        if (!rk->envp) {
            fprintf(stderr, "cfx_run: out of memory\n");
            rc = 1;
            goto out_free_ranks;
        }
    }

    if (r.opts.timeout_s > 0)
        r.deadline_ns = cfx__now_ns() + (uint64_t)(r.opts.timeout_s * 1e9);
    /* Flush before forking so nothing buffered is written twice. */
    fflush(stdout);
    fflush(stderr);
    for (; spawned < r.opts.nranks; spawned++) {
        if (spawn_rank(&r, &r.ranks[spawned], devnull, &oldmask, token) < 0) {
            r.state = RUN_FAILED;
            r.exit_code = 1;
            stop_ranks(&r, SIGTERM);
            break;
        }
    }

    run_loop(&r);
    rc = r.exit_code;
    if (r.running > 0) {
        /* Only after a poll failure: do not leave ranks behind. */
        signal_ranks(&r, SIGKILL);
        while (r.running > 0 && wait(NULL) > 0)
            r.running--;
        rc = rc ? rc : 1;
    }

out_free_ranks:
    for (int i = 0; r.ranks && i < r.opts.nranks; i++) {
        for (int s = 0; s < 2; s++)
            free(r.ranks[i].out[s].buf);
        cfx__run_free_env(r.ranks[i].envp, r.ranks[i].env_own);
        cfx__run_argv_free(r.ranks[i].argv);
        close_lifeline(&r.ranks[i]);
    }
    free(r.prank);
    free(r.pstream);
    free(r.pfds);
    free(r.ranks);
    free(r.obuf);
    cfx__coord_stop(coord);
out_close_devnull:
    close(devnull);
out_close_sigfd:
    close(r.sigfd);
out_unlink_token:
    if (token_path_ours)
        unlink(token_path);
out_hosts:
    explicit_bzero(token_buf, sizeof(token_buf));
    explicit_bzero(file_token, sizeof(file_token));
    if (r.opts.token) {
        explicit_bzero(r.opts.token, strlen(r.opts.token));
        free(r.opts.token);
    }
    cfx__run_argv_free(rsh);
    free(host_of);
    free(local_of);
    cfx__run_hosts_free(&hosts);
    return rc;
}

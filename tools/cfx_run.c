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
 * over the ranks' pipes and a signalfd.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
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
#include "run/hosts.h"
#include "control/coord.h"
#include "dataplane/common/util.h"

#define RUN_MAX_RANKS     1024
#define RUN_KILL_GRACE_MS 2000        /* SIGTERM -> SIGKILL */
#define RUN_DRAIN_MS      1000        /* pipe output kept open after the last rank exits */
#define RUN_LINE_INIT     (64u << 10) /* initial line buffer */
#define RUN_LINE_MAX      (1u << 20)  /* longer lines are split */
#define RUN_TOKEN_BYTES   16
#define RUN_XVARS_MAX     64          /* -x options */

extern char **environ;

/* One captured stream (stdout or stderr) of one rank. */
struct run_stream {
    int fd;     /* read end of the pipe; -1 once closed */
    int out_fd; /* where its lines go: 1 or 2 */
    char *buf;  /* bytes of the current, unfinished line(s) */
    size_t len; /* bytes in buf */
    size_t cap; /* allocated size of buf */
};

struct run_rank {
    int rank;
    pid_t pid;       /* 0 before fork */
    bool running;    /* forked and not yet reaped */
    int wstatus;     /* from waitpid once reaped */
    char prefix[16]; /* "[3] " */
    size_t prefix_len;
    struct run_stream out[2]; /* [0] stdout, [1] stderr */
    char **envp;              /* environment for exec */
    size_t env_own;           /* envp[env_own..] are ours to free */
    const char *host;         /* --hosts: where it runs; NULL: here */
    char **argv;              /* --hosts: the rsh command line; NULL: opts.argv */
    int lifeline;             /* --hosts: write end of the rsh's stdin; -1 closed */
};

struct run_opts {
    int nranks;
    const char *transport;  /* NULL: inherit */
    const char *chunk_size; /* NULL: inherit */
    char *token;            /* --token (copied; the argv bytes are overwritten), NULL: */
    const char *token_file; /* --token-file, NULL: generate a token */
    double timeout_s;       /* 0: none */
    unsigned port;          /* 0: ephemeral */
    bool verbose;
    unsigned fanout;        /* 0: the coordinator's default */
    uint64_t may_fail;      /* bit r: rank r may fail without stopping the job */
    const char *hosts;      /* --hosts spec, NULL: every rank here */
    const char *rsh;        /* --rsh, NULL: $CFX_RSH or ssh */
    const char *coord_host; /* --coord-addr */
    bool oversubscribe;
    const char *xvars[RUN_XVARS_MAX]; /* -x NAME[=VALUE] */
    int nxvars;
    char **argv; /* CMD ARGS... */
};

enum run_state {
    RUN_RUNNING,     /* waiting for the ranks */
    RUN_FAILED,      /* a rank failed; the rest are being stopped */
    RUN_TIMED_OUT,   /* --timeout expired; every rank is being stopped */
    RUN_INTERRUPTED, /* cfx_run got a signal and forwarded it */
};

struct run {
    struct run_opts opts;
    struct run_rank *ranks;
    int running; /* ranks not yet reaped */
    enum run_state state;
    int exit_code;           /* decided when the state leaves RUNNING */
    uint64_t deadline_ns;    /* --timeout; UINT64_MAX none */
    uint64_t kill_at_ns;     /* SIGKILL stragglers then; UINT64_MAX none */
    uint64_t drain_until_ns; /* stop reading pipes then; UINT64_MAX none */
    int sigfd;
    bool out_dead[3]; /* our stdout/stderr went away (EPIPE) */
    char *obuf;       /* assembly buffer for prefixed lines */
    size_t ocap;
    struct pollfd *pfds;         /* [0] signalfd, then open streams */
    struct run_stream **pstream; /* stream behind pfds[i], i >= 1 */
    struct run_rank **prank;     /* its rank */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cfx_run -n N [options] CMD [ARGS...]\n"
            "       cfx_run --hosts H1[:SLOTS],H2,... [-n N] [options] CMD [ARGS...]\n"
            "\n"
            "Start N ranks of CMD on this host (or on the hosts) around an embedded\n"
            "coordinator.\n"
            "\n"
            "  -n, --np N            number of ranks (1..%d; with --hosts, default: the slots)\n"
            "  -H, --hosts LIST      start the ranks on these hosts through the remote shell,\n"
            "                        by slot as mpirun: fill H1's SLOTS (default 1), then H2's\n"
            "      --rsh CMD         remote shell, called as CMD HOST COMMAND (default:\n"
            "                        $CFX_RSH, else 'ssh -o BatchMode=yes'); split on blanks\n"
            "      --coord-addr A    address the hosts reach this host at; the coordinator\n"
            "                        binds it (default: CFX_SOCKET_IFNAME's, else this\n"
            "                        host's name's)\n"
            "      --oversubscribe   more ranks than slots: go around the hosts again\n"
            "  -x NAME[=VALUE]       with --hosts, also set NAME on the hosts (every CFX_*\n"
            "                        variable but the token's and the ones set here goes)\n"
            "  -t, --transport LIST  set CFX_TRANSPORT for every rank (tcp, shm, or shm,tcp)\n"
            "  -T, --timeout SEC     kill every rank and exit 124 after SEC seconds\n"
            "  -K, --token-file F    file whose first line is the cluster token (default:\n"
            "                        a fresh random token in a private temporary file)\n"
            "  -k, --token T         cluster token on the command line, where ps shows it\n"
            "                        (a warning says so): prefer --token-file\n"
            "  -p, --coord-port P    coordinator port on 127.0.0.1 (default: any free)\n"
            "  -c, --chunk-size S    set CFX_CHUNK_SIZE for every rank (e.g. 1M)\n"
            "  -f, --fanout N        most uploads the directory gives one holder (default: per\n"
            "                        object, as conflux-coord)\n"
            "  -a, --allow-fail R,.. ranks (< 64) whose failure does not stop the job: fault\n"
            "                        tests and elastic jobs; the job still fails if any other\n"
            "                        rank fails\n"
            "  -v, --verbose         print the coordinator address and each rank's exit\n"
            "  -h, --help            this text\n"
            "\n"
            "Exit status: 0 all ranks succeeded, the first failing rank's status, 2 a usage\n"
            "error (the option and its bad value are named on stderr), 128+SIG a rank was\n"
            "killed by SIG (or cfx_run interrupted), 124 timeout.\n",
            RUN_MAX_RANKS);
}

static int parse_opts(int argc, char **argv, struct run_opts *o)
{
    static const struct option longopts[] = {
        { "np", required_argument, NULL, 'n' },
        { "transport", required_argument, NULL, 't' },
        { "timeout", required_argument, NULL, 'T' },
        { "token", required_argument, NULL, 'k' },
        { "token-file", required_argument, NULL, 'K' },
        { "coord-port", required_argument, NULL, 'p' },
        { "chunk-size", required_argument, NULL, 'c' },
        { "verbose", no_argument, NULL, 'v' },
        { "fanout", required_argument, NULL, 'f' },
        { "allow-fail", required_argument, NULL, 'a' },
        { "hosts", required_argument, NULL, 'H' },
        { "rsh", required_argument, NULL, 'R' },
        { "coord-addr", required_argument, NULL, 'A' },
        { "oversubscribe", no_argument, NULL, 'O' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    size_t sz;
    int c;

    memset(o, 0, sizeof(*o));
    /* '+': stop at the first non-option so CMD's own flags pass through. */
    while ((c = getopt_long(argc, argv, "+n:t:T:k:K:p:c:f:a:H:x:vh", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (tool_arg_int("cfx_run", "-n", optarg, 1, RUN_MAX_RANKS, "a number of ranks",
                             &o->nranks))
                return -1;
            break;
        case 't':
            if (!*optarg) {
                fprintf(stderr, "cfx_run: --transport: '' is not a transport list (tcp, shm, "
                        "shm,tcp, ...)\n");
                return -1;
            }
            o->transport = optarg;
            break;
        case 'T':
            if (tool_arg_double("cfx_run", "--timeout", optarg, 0, 1e7, "a time in seconds",
                                &o->timeout_s))
                return -1;
            if (!(o->timeout_s > 0)) { /* 0 would kill the job at once */
                fprintf(stderr, "cfx_run: --timeout: '%s' is not a time in seconds > 0\n",
                        optarg);
                return -1;
            }
            break;
        case 'k':
            if (!*optarg) {
                fprintf(stderr, "cfx_run: --token: '' is not a token (it must not be empty)\n");
                return -1;
            }
            o->token = strdup(optarg);
            if (!o->token) {
                fprintf(stderr, "cfx_run: out of memory\n");
                return -1;
            }
            /* shorten the window in which ps shows it */
            memset(optarg, '*', strlen(optarg));
            fprintf(stderr, "cfx_run: warning: --token puts the cluster token on the command "
                    "line, where ps and /proc/PID/cmdline show it; use --token-file\n");
            break;
        case 'K':
            o->token_file = optarg;
            break;
        case 'p': {
            int p;
            if (tool_arg_int("cfx_run", "--coord-port", optarg, 0, 65535, "a TCP port", &p))
                return -1;
            o->port = (unsigned)p;
            break;
        }
        case 'c':
            if (tool_arg_size("cfx_run", "--chunk-size", optarg, 1, 1u << 30, &sz))
                return -1;
            o->chunk_size = optarg;
            break;
        case 'f': {
            int f;
            if (tool_arg_int("cfx_run", "--fanout", optarg, 1, 1024, "a fan-out", &f))
                return -1;
            o->fanout = (unsigned)f;
            break;
        }
        case 'a': {
            /* each comma-separated rank through the one strict parser */
            char list[256], *save = NULL;
            int rk, n = 0;
            if (strlen(optarg) >= sizeof(list) || !*optarg || optarg[strlen(optarg) - 1] == ',' ||
                strstr(optarg, ",,") || optarg[0] == ',') {
                fprintf(stderr, "cfx_run: --allow-fail: '%s' is not a list of ranks 0..63 "
                        "separated by commas\n", optarg);
                return -1;
            }
            snprintf(list, sizeof(list), "%s", optarg);
            for (char *t = strtok_r(list, ",", &save); t && n < 64; t = strtok_r(NULL, ",", &save), n++) {
                if (tool_arg_int("cfx_run", "--allow-fail", t, 0, 63, "a rank", &rk))
                    return -1;
                o->may_fail |= 1ull << rk;
            }
            break;
        }
        case 'H': o->hosts = optarg; break;
        case 'R': o->rsh = optarg; break;
        case 'A': o->coord_host = optarg; break;
        case 'O': o->oversubscribe = true; break;
        case 'x': {
            size_t nl = strcspn(optarg, "=");
            bool ok = nl > 0 && (isalpha((unsigned char)optarg[0]) || optarg[0] == '_');
            for (size_t i = 0; ok && i < nl; i++)
                ok = isalnum((unsigned char)optarg[i]) || optarg[i] == '_';
            if (!ok) {
                fprintf(stderr, "cfx_run: -x: '%s' is not NAME or NAME=VALUE\n", optarg);
                return -1;
            }
            if (nl == 9 && !strncmp(optarg, "CFX_TOKEN", 9)) {
                fprintf(stderr, "cfx_run: -x: '%s': the token never travels in the "
                        "environment (it goes on the rsh's stdin)\n", optarg);
                return -1;
            }
            if (o->nxvars == RUN_XVARS_MAX) {
                fprintf(stderr, "cfx_run: -x: more than %d variables\n", RUN_XVARS_MAX);
                return -1;
            }
            o->xvars[o->nxvars++] = optarg;
            break;
        }
        case 'v': o->verbose = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (!o->hosts && (o->rsh || o->coord_host || o->oversubscribe || o->nxvars)) {
        fprintf(stderr, "cfx_run: --rsh, --coord-addr, --oversubscribe and -x go with "
                "--hosts\n");
        return -1;
    }
    if (o->nranks == 0 && !o->hosts) {
        fprintf(stderr, "cfx_run: -n N is required\n");
        usage(stderr);
        return -1;
    }
    if (optind >= argc) {
        fprintf(stderr, "cfx_run: no command given\n");
        usage(stderr);
        return -1;
    }
    o->argv = argv + optind;
    return 0;
}

static int random_token(char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[RUN_TOKEN_BYTES];
    size_t got = 0;
    int fd;

    if (len < 2 * sizeof(raw) + 1)
        return -1;
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "cfx_run: cannot open /dev/urandom: %s\n", strerror(errno));
        return -1;
    }
    while (got < sizeof(raw)) {
        ssize_t n = read(fd, raw + got, sizeof(raw) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "cfx_run: cannot read /dev/urandom: %s\n",
                    n < 0 ? strerror(errno) : "end of file");
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    for (size_t i = 0; i < sizeof(raw); i++) {
        buf[2 * i] = hex[raw[i] >> 4];
        buf[2 * i + 1] = hex[raw[i] & 15];
    }
    buf[2 * sizeof(raw)] = '\0';
    return 0;
}

/*
 * Write @p token to a new file only we can read, in $XDG_RUNTIME_DIR (a
 * per-user tmpfs) or else $TMPDIR or /tmp; its path into @p path.  The ranks
 * get the path (CFX_TOKEN_FILE), never the value; main() removes it.
 */
static int token_file_write(const char *token, char *path, size_t len)
{
    const char *dir = getenv("XDG_RUNTIME_DIR");
    if (!dir || !*dir || access(dir, W_OK) != 0)
        dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    if ((size_t)snprintf(path, len, "%s/cfx_run-token-XXXXXX", dir) >= len) {
        fprintf(stderr, "cfx_run: temporary directory name too long: %s\n", dir);
        return -1;
    }
    int fd = mkostemp(path, O_CLOEXEC); /* mode 0600 */
    if (fd < 0) {
        fprintf(stderr, "cfx_run: cannot create a token file in %s: %s\n", dir,
                strerror(errno));
        return -1;
    }
    size_t n = strlen(token);
    if (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || close(fd) != 0) {
        fprintf(stderr, "cfx_run: cannot write the token file %s: %s\n", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}

/* Variables cfx_run sets; inherited values of these are dropped. */
static bool env_overridden(const char *kv, const struct run_opts *o)
{
    static const char *const always[] = {
        "CFX_RANK=",  "CFX_LOCAL_RANK=", "CFX_WORLD_SIZE=",
        "CFX_COORD=", "CFX_TOKEN=",      "CFX_TOKEN_FILE=",
    };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(always); i++)
        if (!strncmp(kv, always[i], strlen(always[i])))
            return true;
    if (o->transport && !strncmp(kv, "CFX_TRANSPORT=", 14))
        return true;
    if (o->chunk_size && !strncmp(kv, "CFX_CHUNK_SIZE=", 15))
        return true;
    return false;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* Free an environment from build_env(): entries from @p own on are ours. */
static void free_env(char **envp, size_t own)
{
    if (!envp)
        return;
    for (size_t i = own; envp[i]; i++)
        free(envp[i]);
    free(envp);
}

/* Build the environment of @p rank before forking: the child then only
 * calls async-signal-safe functions (the coordinator thread may hold locks).
 * *@p own is the index of the first entry allocated here. */
static char **build_env(const struct run_opts *o, int rank, const char *coord,
                        const char *token_file, size_t *own, bool bare)
{
    size_t n = 0, i = 0;
    char **envp;
    char *add[7] = { NULL };
    int nadd = 0;

    while (environ[n])
        n++;
    envp = calloc(n + 9, sizeof(*envp));
    if (!envp)
        return NULL;
    for (size_t j = 0; j < n; j++)
        if (!env_overridden(environ[j], o))
            envp[i++] = environ[j];
    *own = i;
    if (bare) { /* a remote rank's rsh: the cluster's variables go on its command line */
        envp[i] = NULL;
        return envp;
    }
    add[nadd++] = xasprintf("CFX_RANK=%d", rank);
    add[nadd++] = xasprintf("CFX_LOCAL_RANK=%d", rank);
    add[nadd++] = xasprintf("CFX_WORLD_SIZE=%d", o->nranks);
    add[nadd++] = xasprintf("CFX_COORD=%s", coord);
    add[nadd++] = xasprintf("CFX_TOKEN_FILE=%s", token_file);
    if (o->transport)
        add[nadd++] = xasprintf("CFX_TRANSPORT=%s", o->transport);
    if (o->chunk_size)
        add[nadd++] = xasprintf("CFX_CHUNK_SIZE=%s", o->chunk_size);
    for (int k = 0; k < nadd; k++) {
        if (!add[k]) {
            for (int m = 0; m < nadd; m++)
                free(add[m]);
            free(envp);
            return NULL;
        }
        envp[i++] = add[k];
    }
    envp[i] = NULL;
    return envp;
}

/* Variables of this environment a remote rank gets too: CFX_* ones, but not
 * the token's, the rsh's, nor those that name this host's own addresses. */
static bool env_forwarded(const char *kv, const struct run_opts *o)
{
    static const char *const never[] = { "CFX_RSH=", "CFX_BIND_ADDR=", "CFX_COORD_PORT=" };
    if (strncmp(kv, "CFX_", 4) || env_overridden(kv, o))
        return false;
    for (size_t i = 0; i < CFX_ARRAY_SIZE(never); i++)
        if (!strncmp(kv, never[i], strlen(never[i])))
            return false;
    return true;
}

/* The NAME=VALUE words a remote rank is started with (its rsh command line:
 * no secret among them). */
static char **remote_vars(const struct run_opts *o, int rank, int local, const char *coord)
{
    size_t n = 0, i = 0;
    char **v;

    while (environ[n])
        n++;
    v = calloc(n + (size_t)o->nxvars + 8, sizeof(*v));
    if (!v)
        return NULL;
    v[i++] = xasprintf("CFX_RANK=%d", rank);
    v[i++] = xasprintf("CFX_LOCAL_RANK=%d", local);
    v[i++] = xasprintf("CFX_WORLD_SIZE=%d", o->nranks);
    v[i++] = xasprintf("CFX_COORD=%s", coord);
    if (o->transport)
        v[i++] = xasprintf("CFX_TRANSPORT=%s", o->transport);
    if (o->chunk_size)
        v[i++] = xasprintf("CFX_CHUNK_SIZE=%s", o->chunk_size);
    for (size_t j = 0; j < n; j++)
        if (env_forwarded(environ[j], o))
            v[i++] = strdup(environ[j]);
    for (int x = 0; x < o->nxvars; x++) {
        const char *val = getenv(o->xvars[x]);
        v[i++] = strchr(o->xvars[x], '=') ? strdup(o->xvars[x])
                                          : xasprintf("%s=%s", o->xvars[x], val ? val : "");
    }
    for (size_t j = 0; j < i; j++) {
        if (!v[j]) {
            for (size_t k = 0; k < i; k++)
                free(v[k]);
            free(v);
            return NULL;
        }
    }
    return v;
}

static void child_write(const char *s)
{
    size_t len = strlen(s);
    while (len) {
        ssize_t n = write(2, s, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        s += n;
        len -= (size_t)n;
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
    child_write("cfx_run: cannot execute ");
    child_write(argv[0]);
    child_write(": ");
    child_write(strerror(err));
    child_write("\n");
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

/* ---- output ---------------------------------------------------------------- */

static void write_out(struct run *r, int fd, const char *p, size_t len)
{
    while (len && !r->out_dead[fd]) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            /* EPIPE (e.g. `| head`) or worse: keep running, drop output. */
            r->out_dead[fd] = true;
            return;
        }
        p += n;
        len -= (size_t)n;
    }
}

static int obuf_reserve(struct run *r, size_t need)
{
    if (need <= r->ocap)
        return 0;
    size_t cap = r->ocap ? r->ocap : RUN_LINE_INIT;
    while (cap < need)
        cap *= 2;
    char *p = realloc(r->obuf, cap);
    if (!p)
        return -1;
    r->obuf = p;
    r->ocap = cap;
    return 0;
}

/*
 * Emit the complete lines in @p st's buffer, each with the rank's prefix,
 * in one write; keep the unfinished tail.  With @p all, the tail is emitted
 * too (newline added): at end of file, or when one line outgrew RUN_LINE_MAX.
 */
static void emit_lines(struct run *r, struct run_rank *rk, struct run_stream *st, bool all)
{
    size_t start = 0, olen = 0;

    while (start < st->len) {
        char *nl = memchr(st->buf + start, '\n', st->len - start);
        size_t end;
        if (nl)
            end = (size_t)(nl - st->buf) + 1;
        else if (all)
            end = st->len;
        else
            break;
        size_t linelen = end - start;
        if (obuf_reserve(r, olen + rk->prefix_len + linelen + 1) < 0) {
            /* No memory for the prefixed copy: pass the bytes through bare. */
            write_out(r, st->out_fd, r->obuf, olen);
            write_out(r, st->out_fd, st->buf + start, linelen);
            olen = 0;
            start = end;
            continue;
        }
        memcpy(r->obuf + olen, rk->prefix, rk->prefix_len);
        olen += rk->prefix_len;
        memcpy(r->obuf + olen, st->buf + start, linelen);
        olen += linelen;
        if (st->buf[end - 1] != '\n')
            r->obuf[olen++] = '\n';
        start = end;
    }
    write_out(r, st->out_fd, r->obuf, olen);
    memmove(st->buf, st->buf + start, st->len - start);
    st->len -= start;
}

static void stream_close(struct run *r, struct run_rank *rk, struct run_stream *st)
{
    emit_lines(r, rk, st, true);
    close(st->fd);
    st->fd = -1;
}

/* Read what is available on @p st; close it on end of file. */
static void stream_read(struct run *r, struct run_rank *rk, struct run_stream *st)
{
    for (;;) {
        if (st->len == st->cap) {
            if (st->cap >= RUN_LINE_MAX) {
                emit_lines(r, rk, st, true); /* one huge line: split it */
            } else {
                size_t cap = st->cap ? st->cap * 2 : RUN_LINE_INIT;
                char *p = realloc(st->buf, cap);
                if (!p) {
                    emit_lines(r, rk, st, true);
                } else {
                    st->buf = p;
                    st->cap = cap;
                }
            }
            if (st->len == st->cap)
                return; /* nothing freed; try again on the next poll */
        }
        ssize_t n = read(st->fd, st->buf + st->len, st->cap - st->len);
        if (n > 0) {
            st->len += (size_t)n;
            emit_lines(r, rk, st, false);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        stream_close(r, rk, st); /* EOF or error */
        return;
    }
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
        fprintf(stderr, "cfx_run: rank %d%s (allowed to fail) %s\n", rk->rank, where,
                WIFSIGNALED(wstatus) ? signame(WTERMSIG(wstatus), sbuf, sizeof(sbuf))
                                     : "exited non-zero");
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
    char sbuf[32];

    if (sig == SIGCHLD) {
        reap(r);
        return;
    }
    if (r->state == RUN_INTERRUPTED) {
        fprintf(stderr, "cfx_run: %s again: killing every rank\n",
                signame(sig, sbuf, sizeof(sbuf)));
        signal_ranks(r, SIGKILL);
        return;
    }
    if (r->state == RUN_RUNNING || r->state == RUN_FAILED) {
        fprintf(stderr, "cfx_run: got %s: forwarding to %d rank%s\n",
                signame(sig, sbuf, sizeof(sbuf)), r->running, r->running == 1 ? "" : "s");
        if (r->state == RUN_RUNNING)
            r->exit_code = 128 + sig;
        r->state = RUN_INTERRUPTED;
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
                    stream_read(r, r->prank[i], r->pstream[i]);
            if (r->pfds[0].revents)
                drain_signals(r);
        }
        check_timers(r);
    }

    /* Flush and close whatever is left open. */
    for (int i = 0; i < r->opts.nranks; i++)
        for (int s = 0; s < 2; s++)
            if (r->ranks[i].out[s].fd >= 0)
                stream_close(r, &r->ranks[i], &r->ranks[i].out[s]);
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
    if (parse_opts(argc, argv, &r.opts) < 0)
        return TOOL_EXIT_USAGE;
    if (r.opts.hosts) {
        /* every check of --hosts before anything starts */
        if (cfx__run_hosts_parse(r.opts.hosts, &hosts) < 0)
            return TOOL_EXIT_USAGE;
        if (r.opts.nranks == 0)
            r.opts.nranks = CFX_MIN(hosts.total_slots, RUN_MAX_RANKS);
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
        /* read it as the ranks will, so that a bad file fails here */
        if (setenv("CFX_TOKEN_FILE", r.opts.token_file, 1) < 0 || unsetenv("CFX_TOKEN") < 0 ||
            cfx__token_load(NULL, file_token, sizeof(file_token)) != CFX_OK) {
            fprintf(stderr, "cfx_run: --token-file %s: %s\n", r.opts.token_file,
                    cfx_last_error());
            rc = 1;
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
            if (random_token(token_buf, sizeof(token_buf)) < 0)
                goto out_hosts;
            token = token_buf;
        }
        /* remote ranks get their own file on their host, from the lifeline */
        if (!r.opts.hosts) {
            if (token_file_write(token, token_path, sizeof(token_path)) < 0)
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
    };
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
    for (int i = 0; i < r.opts.nranks; i++) {
        struct run_rank *rk = &r.ranks[i];
        rk->rank = i;
        rk->prefix_len = (size_t)snprintf(rk->prefix, sizeof(rk->prefix), "[%d] ", i);
        rk->out[0] = (struct run_stream){ .fd = -1, .out_fd = 1 };
        rk->out[1] = (struct run_stream){ .fd = -1, .out_fd = 2 };
        rk->lifeline = -1;
        rk->envp = build_env(&r.opts, i, coord_addr, token_path, &rk->env_own, r.opts.hosts);
        if (rk->envp && r.opts.hosts) {
            char **vars = remote_vars(&r.opts, i, local_of[i], coord_addr);
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
        free_env(r.ranks[i].envp, r.ranks[i].env_own);
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

/*
 * cfx_run's own state, shared by its files: options (opts.c), token and
 * environment of the ranks (env.c), their output (output.c), and the ranks,
 * signals and event loop (cfx_run.c).  The host list and remote commands
 * are hosts.h's.
 */
#ifndef CFX_TOOLS_RUN_RUN_H
#define CFX_TOOLS_RUN_RUN_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define RUN_MAX_RANKS     1024
#define RUN_KILL_GRACE_MS 2000        /* SIGTERM -> SIGKILL */
#define RUN_DRAIN_MS      1000        /* pipe output kept open after the last rank exits */
#define RUN_LINE_INIT     (64u << 10) /* initial line buffer */
#define RUN_LINE_MAX      (1u << 20)  /* longer lines are split */
#define RUN_TOKEN_BYTES   16
#define RUN_XVARS_MAX     64          /* -x options */

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
    int first_sig;           /* the signal that interrupted the run; 0 none yet */
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

/* Options into @p o; -1 after printing the error (exit TOOL_EXIT_USAGE). */
int cfx__run_parse_opts(int argc, char **argv, struct run_opts *o);

/* 32 fresh random hex digits into @p buf (@p len >= 33). */
int cfx__run_random_token(char *buf, size_t len);
/* @p token into a new file only we can read; its path into @p path. */
int cfx__run_token_file_write(const char *token, char *path, size_t len);
/* The environment of rank @p rank (@p bare: a remote rank's rsh, without
 * the cluster's variables); *@p own: the first entry allocated here. */
char **cfx__run_build_env(const struct run_opts *o, int rank, const char *coord,
                          const char *token_file, size_t *own, bool bare);
void cfx__run_free_env(char **envp, size_t own);
/* The NAME=VALUE words a remote rank is started with. */
char **cfx__run_remote_vars(const struct run_opts *o, int rank, int local,
                            const char *coord);

/* Read what @p st has, emitting whole prefixed lines; close it at EOF. */
void cfx__run_stream_read(struct run *r, struct run_rank *rk, struct run_stream *st);
/* Emit what is left of @p st (newline added) and close it. */
void cfx__run_stream_close(struct run *r, struct run_rank *rk, struct run_stream *st);

#endif

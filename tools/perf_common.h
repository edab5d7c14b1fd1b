/*
 * Shared part of the perftest-style object tools (cfx_get_bw, cfx_get_lat):
 * the same flags on both sides; no host = server (starts an embedded
 * coordinator and puts), host = client (joins it and gets).
 */
#ifndef CFX_TOOLS_PERF_COMMON_H
#define CFX_TOOLS_PERF_COMMON_H

#include <conflux/conflux.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "control/auth.h"
#include "control/coord.h"
#include "control/seal.h"
#include "dataplane/common/util.h"

#define PERF_SIZE_MAX (1ull << 46) /* the largest object there may be (cfx_put) */

struct perf_opts {
    const char *host;        /* NULL: server */
    const char *bind;        /* server: coordinator bind address */
    int port;
    size_t size;
    int all;                 /* sweep sizes */
    long iters;
    long warmup;
    const char *transport;
    size_t chunk;
    int arena;               /* get into an arena buffer */
    int gbits;
    int json;
    int inline_ok;           /* let small objects go through the coordinator */
    int memcpy_ref;
    int repeat;              /* cfx_get_lat: measure the second get of each object */
    int no_keep;             /* cfx_get_lat: the measured gets keep no copy */
    const char *token;       /* token_buf once parsed */
    char token_buf[CFX_TOKEN_MAX + 1];
};

static inline double perf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One of the tools, and what it takes of the options below. */
struct perf_tool {
    const char *prog;           /* its name, in messages */
    const char *what;           /* what the server puts ("objects") */
    size_t size;                /* -s by default */
    long iters;                 /* -n by default */
    size_t sweep_min, sweep_max; /* -a: these sizes and the powers of two between them */
    const char *unused;         /* options it refuses, by letter (G: --report_gbits) */
};

#define PERF_SWEEP_MAX 48 /* sizes of a sweep, at most */

static inline int perf_takes(const struct perf_tool *t, int opt)
{
    return !strchr(t->unused, opt);
}

/* 8, 4K, 64M: a size as -s takes it. */
static inline const char *perf_size_text(size_t v, char *buf, size_t len)
{
    if (v && v % (1u << 20) == 0)
        snprintf(buf, len, "%zuM", v >> 20);
    else if (v && v % 1024 == 0)
        snprintf(buf, len, "%zuK", v >> 10);
    else
        snprintf(buf, len, "%zu", v);
    return buf;
}

static inline void perf_usage(const struct perf_tool *t, FILE *f)
{
    char def[32], lo[32], hi[32];
    fprintf(f,
            "Usage: %s [options]            start a server (embedded coordinator, puts %s)\n"
            "       %s [options] <host>     connect to the server at host and get them\n"
            "Options (give the same ones on both sides):\n"
            "  -p, --port=N         coordinator port, 1..65535 (default 18515)\n"
            "  -b, --bind=ADDR      server: address the coordinator listens on "
            "(default 127.0.0.1)\n"
            "  -s, --size=N         object size, K/M/G suffixes (default %s); at least 1 byte,\n"
            "                       at most this machine's memory (and, over verbs, ulimit -l)\n"
            "  -a, --all            sweep sizes %s .. %s by powers of two, one row each\n"
            "  -n, --iters=N        measured gets per size, 1..1000000 (default %ld)\n"
            "  -w, --warmup=N       unmeasured gets first, 0..1000000 (default 2)\n"
            "  -t, --transport=T    tcp, shm, verbs or dpdk, or a list in order of preference\n"
            "                       (shm,tcp); ^T: the default less those; as cfx_run -t and\n"
            "                       CFX_TRANSPORT (default: shm on the same host, else verbs,\n"
            "                       else tcp; dpdk needs its port in CFX_DPDK_VDEV or\n"
            "                       CFX_DPDK_EAL)\n"
            "  -c, --chunk-size=N   chunk size, 4K..64M (default: follows the object size)\n",
            t->prog, t->what, t->prog, perf_size_text(t->size, def, sizeof(def)),
            perf_size_text(t->sweep_min, lo, sizeof(lo)),
            perf_size_text(t->sweep_max, hi, sizeof(hi)), t->iters);
    if (perf_takes(t, 'u'))
        fputs("  -u, --user-buf       get into malloc'd memory instead of an arena buffer\n", f);
    fputs("  -i, --inline         let objects <= 64 KiB travel through the coordinator\n", f);
    if (perf_takes(t, 'm'))
        fputs("  -m, --memcpy-ref     also measure single-thread memcpy as the reference\n", f);
    if (perf_takes(t, 'r'))
        fputs("  -r, --repeat         get each object, delete the copy, and measure a second\n"
              "                       get of it (its location is known by then)\n", f);
    if (perf_takes(t, 'N'))
        fputs("      --no-keep        the measured gets keep no copy here (CFX_OBJ_FLAG_NO_KEEP,\n"
              "                       as Python's get into a buffer)\n", f);
    fputs("  -k, --token=T        cluster token (default $CFX_TOKEN, else the first line of\n"
          "                       $CFX_TOKEN_FILE); on the command line ps shows it\n", f);
    if (perf_takes(t, 'G'))
        fputs("      --report_gbits   report Gbit/s instead of GB/s\n", f);
    fputs("      --json           JSON on stdout instead of the table\n"
          "  -h, --help\n"
          "A bad value is named on stderr; usage errors exit with status 2.\n", f);
}

#define PERF_SERVER_WAIT_MS (10 * 60 * 1000) /* how long a server waits for its client */
#define PERF_ITERS_MAX 1000000L /* the server keeps one object per get: bound them */

/* Parse the options; 0 or TOOL_EXIT_USAGE (the error already printed).  An
 * option of the other tool that this one has no use for (t->unused) is
 * refused, not ignored. */
static inline int perf_parse(int argc, char **argv, struct perf_opts *o,
                             const struct perf_tool *t)
{
    const char *prog = t->prog;
    static const struct option lopts[] = {
        { "port", required_argument, NULL, 'p' },   { "bind", required_argument, NULL, 'b' },
        { "size", required_argument, NULL, 's' },   { "all", no_argument, NULL, 'a' },
        { "iters", required_argument, NULL, 'n' },  { "warmup", required_argument, NULL, 'w' },
        { "transport", required_argument, NULL, 't' },
        { "chunk-size", required_argument, NULL, 'c' },
        { "user-buf", no_argument, NULL, 'u' },     { "inline", no_argument, NULL, 'i' },
        { "memcpy-ref", no_argument, NULL, 'm' },   { "token", required_argument, NULL, 'k' },
        { "repeat", no_argument, NULL, 'r' },       { "no-keep", no_argument, NULL, 'N' },
        { "report_gbits", no_argument, NULL, 'G' }, { "json", no_argument, NULL, 'J' },
        { "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
    };
    const char *size_arg = NULL;
    int c, li = -1;
    memset(o, 0, sizeof(*o));
    o->port = 18515;
    o->bind = "127.0.0.1";
    o->size = t->size;
    o->iters = t->iters;
    o->warmup = 2;
    o->arena = 1;
    const char *token_arg = NULL;
    while ((c = getopt_long(argc, argv, "p:b:s:an:w:t:c:uimrk:h", lopts, &li)) != -1) {
        int bad = 0;
        if (c != '?' && !perf_takes(t, c)) {
            if (li >= 0)
                fprintf(stderr, "%s: --%s: not an option of %s (see --help)\n", prog,
                        lopts[li].name, prog);
            else
                fprintf(stderr, "%s: -%c: not an option of %s (see --help)\n", prog, c, prog);
            return TOOL_EXIT_USAGE;
        }
        li = -1;
        switch (c) {
        case 'p': bad = tool_arg_int(prog, "-p", optarg, 1, 65535, "a TCP port", &o->port); break;
        case 'b': bad = tool_arg_host(prog, "-b", optarg); o->bind = optarg; break;
        case 's':
            /* the memory check below, once the sweep and -m are known */
            bad = tool_arg_size(prog, "-s", optarg, 1, PERF_SIZE_MAX, &o->size);
            size_arg = optarg;
            break;
        case 'a': o->all = 1; break;
        case 'n':
            bad = tool_arg_long(prog, "-n", optarg, 1, PERF_ITERS_MAX, "an iteration count",
                                &o->iters);
            break;
        case 'w':
            bad = tool_arg_long(prog, "-w", optarg, 0, PERF_ITERS_MAX, "a warm-up count",
                                &o->warmup);
            break;
        case 't':
            bad = tool_arg_transports(prog, "-t", optarg);
            o->transport = optarg;
            break;
        case 'c':
            bad = tool_arg_size(prog, "-c", optarg, CFX_CHUNK_SIZE_MIN, CFX_CHUNK_SIZE_MAX,
                                &o->chunk);
            break;
        case 'u': o->arena = 0; break;
        case 'i': o->inline_ok = 1; break;
        case 'm': o->memcpy_ref = 1; break;
        case 'r': o->repeat = 1; break;
        case 'N': o->no_keep = 1; break;
        case 'k':
            /* '' is refused, not taken as $CFX_TOKEN (as rdmactl --token '') */
            if (tool_arg_nonempty(prog, "-k", optarg, "a token"))
                return TOOL_EXIT_USAGE;
            fprintf(stderr, "%s: warning: --token puts the cluster token on the command line, "
                    "where ps and /proc/PID/cmdline show it; use CFX_TOKEN_FILE\n", prog);
            /* loaded below from this copy; argv's bytes are overwritten */
            snprintf(o->token_buf, sizeof(o->token_buf), "%s", optarg);
            memset(optarg, '*', strlen(optarg));
            token_arg = o->token_buf;
            break;
        case 'G': o->gbits = 1; break;
        case 'J': o->json = 1; break;
        case 'h': perf_usage(t, stdout); exit(0);
        default: perf_usage(t, stderr); return TOOL_EXIT_USAGE;
        }
        if (bad)
            return TOOL_EXIT_USAGE;
    }
    /* an address that does not parse or resolve is named now, as a bad -b
     * is: not a coordinator that cannot be started or joined (exit 1) */
    if (optind < argc && tool_arg_host(prog, "host", argv[optind]))
        return TOOL_EXIT_USAGE;
    if (optind < argc)
        o->host = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (one host at most)\n", prog, argv[optind]);
        return TOOL_EXIT_USAGE;
    }
    /* the buffer is the largest size; -m copies between two more of them */
    if (size_arg && !o->all &&
        tool_arg_mem(prog, "-s", size_arg, o->size * (o->memcpy_ref ? 3 : 1), 0))
        return TOOL_EXIT_USAGE;
    /* as the library takes it: --token, else $CFX_TOKEN, else $CFX_TOKEN_FILE */
    char tok[CFX_TOKEN_MAX + 1];
    if (cfx__token_load(token_arg, tok, sizeof(tok)) != CFX_OK) {
        fprintf(stderr, "%s: %s (the same on both sides)\n", prog, cfx_last_error());
        return TOOL_EXIT_USAGE;
    }
    memcpy(o->token_buf, tok, sizeof(tok));
    explicit_bzero(tok, sizeof(tok));
    o->token = o->token_buf;
    return 0;
}

/* The sizes to run: the sweep's (-a), else -s.  Returns how many. */
static inline int perf_sizes(const struct perf_tool *t, const struct perf_opts *o,
                             size_t sizes[PERF_SWEEP_MAX])
{
    int n = 0;
    if (!o->all)
        sizes[n++] = o->size;
    for (size_t s = t->sweep_min; o->all && s <= t->sweep_max && n < PERF_SWEEP_MAX; s *= 2)
        sizes[n++] = s;
    return n;
}

/*
 * Whether @p ctx pins what it registers: the verbs transport does, and the
 * kernel counts that against RLIMIT_MEMLOCK.
 */
static inline int perf_pins(struct cfx_context *ctx)
{
    char cfg[2048], tps[64] = "";
    cfx_context_config(ctx, cfg, sizeof(cfg));
    const char *tp = strstr(cfg, "transports = ");
    if (tp)
        sscanf(tp, "transports = %63[^ \n]", tps);
    return strstr(tps, "verbs") != NULL;
}

/* Start the server's coordinator (if server) and join.  Returns 0 or exits. */
static inline struct cfx_context *perf_join(const struct perf_opts *o, struct cfx_coord **coord,
                                            const char *prog)
{
    char addr[128];
    struct cfx_context *ctx;
    *coord = NULL;
    if (!o->host) {
        struct cfx_coord_params cp = { .bind_addr = o->bind, .port = (uint16_t)o->port,
                                       .token = o->token };
        /* the same CFX_SECURE as the nodes (their contexts read it) */
        if (cfx__seal_mode_parse(getenv("CFX_SECURE"), &cp.secure) != CFX_OK) {
            fprintf(stderr, "%s: %s\n", prog, cfx_last_error());
            exit(2);
        }
        int rc = cfx__coord_start(&cp, coord);
        if (rc != CFX_OK) {
            fprintf(stderr, "%s: cannot start the coordinator on %s:%d: %s\n", prog, o->bind,
                    o->port, cfx_last_error());
            exit(1);
        }
        snprintf(addr, sizeof(addr), "%s:%d", strcmp(o->bind, "0.0.0.0") ? o->bind : "127.0.0.1",
                 o->port);
    } else {
        snprintf(addr, sizeof(addr), "%s:%d", o->host, o->port);
    }
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN |
                      (o->transport ? CFX_CTX_PARAM_TRANSPORTS : 0) |
                      (o->chunk ? CFX_CTX_PARAM_CHUNK_SIZE : 0),
        .coord = addr,
        .token = o->token,
        .transports = o->transport,
        .chunk_size = o->chunk,
    };
    /* the client may start before the server's coordinator listens: the
     * library retries until its deadline (CFX_TIMEOUT_MS) */
    int rc = cfx_context_create(&p, &ctx);
    if (rc != CFX_OK) {
        fprintf(stderr, "%s: cannot join %s: %s: %s\n", prog, addr, cfx_errname(rc),
                cfx_last_error());
        cfx__coord_stop(*coord);
        exit(1);
    }
    return ctx;
}

static inline void perf_id(struct cfx_object_id *id, const char *tool, size_t size, long i)
{
    char name[128];
    snprintf(name, sizeof(name), "%s/%zu/%ld", tool, size, i);
    cfx_object_id_from_name(name, id);
}

#define PERF_DONE_TEXT_MAX 512   /* a failed client's word to its server, NUL in */
#define PERF_ACK_WAIT_MS   10000 /* a client waits this long for its server to read it */

static inline void perf_ack_id(struct cfx_object_id *id, const char *done_name)
{
    char name[96];
    snprintf(name, sizeof(name), "%s-ack", done_name);
    perf_id(id, name, 0, 0);
}

/*
 * Client, after putting its "done" object @p done_name (either kind): wait
 * until the server has read it.  An object goes with its putter, so a
 * client that left at once could take its word with it before a server
 * not yet waiting for it had looked (a client failing on its first get
 * while the server still put its objects did): the server then said only
 * that the client left.  Bounded: a server that is gone never answers.
 */
static inline void perf_client_ack_wait(struct cfx_context *ctx, const char *done_name)
{
    struct cfx_object_id id;
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT,
                                .timeout_ms = PERF_ACK_WAIT_MS };
    uint8_t ack;
    perf_ack_id(&id, done_name);
    (void)cfx_get(ctx, &id, &ack, 1, NULL, &p);
}

/* Server: the client's "done" @p done_name was read (perf_client_ack_wait).
 * The ack goes with this process, which runs the coordinator too: wait
 * (bounded) for the client to have left with it before going on. */
static inline void perf_server_ack(struct cfx_context *ctx, struct cfx_coord *coord,
                                   const char *done_name)
{
    struct cfx_object_id id;
    uint8_t one = 1;
    perf_ack_id(&id, done_name);
    if (cfx_put(ctx, &id, &one, 1, NULL) != CFX_OK)
        return;
    uint64_t end = cfx__now_ns() + (uint64_t)PERF_ACK_WAIT_MS * 1000000ull;
    for (;;) {
        uint32_t joined, alive;
        cfx__coord_member_counts(coord, &joined, &alive);
        if (alive <= 1 || cfx__now_ns() >= end)
            return;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

/* Client: put the "done" object @p done_name (@p len bytes of @p buf: one
 * byte for a run that succeeded, perf_client_failed's text for one that
 * did not) and wait for the server to have read it.  cfx_put's status. */
static inline int perf_client_done(struct cfx_context *ctx, const char *done_name,
                                   const void *buf, size_t len)
{
    struct cfx_object_id id;
    perf_id(&id, done_name, 0, 0);
    int rc = cfx_put(ctx, &id, buf, len, NULL);
    if (rc == CFX_OK)
        perf_client_ack_wait(ctx, done_name);
    return rc;
}

/*
 * Client: a run that failed on a cause its server should name too (the
 * sizes disagree) says so in its "done" object @p done_name, @p text where
 * a run that succeeded puts one byte.  Not checked: the client fails
 * anyway, and a server that does not get it sees the client leave.
 */
static inline void perf_client_failed(struct cfx_context *ctx, const char *done_name,
                                      const char *text)
{
    size_t len = strnlen(text, PERF_DONE_TEXT_MAX - 1) + 1;
    char buf[PERF_DONE_TEXT_MAX];
    memcpy(buf, text, len - 1);
    buf[len - 1] = '\0';
    (void)perf_client_done(ctx, done_name, buf, len);
}

/* Client: the server put @p put bytes where this client expects @p want. */
static inline void perf_mismatch_tell(struct cfx_context *ctx, const char *done_name, size_t put,
                                      size_t want)
{
    char text[PERF_DONE_TEXT_MAX];
    snprintf(text, sizeof(text), "size mismatch: this server put %zu bytes where the client "
             "expects %zu: give both sides the same -s (and -a)", put, want);
    perf_client_failed(ctx, done_name, text);
}

/*
 * What a server puts: its sizes and the gets of each (-n + -w), published as
 * the object "DONE-shape" so that a client whose -s or -a differs says so
 * before its first get: the names of a sweep's first size and of -s alone
 * are the same, so a get alone sees no mismatch there (server -a, client -s
 * of the sweep's first size passed; client -a waited for a second size).
 */
struct perf_shape {
    uint64_t nsizes, gets, sizes[PERF_SWEEP_MAX];
};

static inline void perf_shape_set(struct perf_shape *sh, const size_t *sizes, int n,
                                  const struct perf_opts *o)
{
    memset(sh, 0, sizeof(*sh));
    sh->nsizes = (uint64_t)n;
    sh->gets = (uint64_t)(o->iters + o->warmup);
    for (int i = 0; i < n; i++)
        sh->sizes[i] = sizes[i];
}

static inline int perf_shape_put(struct cfx_context *ctx, const char *done_name,
                                 const struct perf_shape *sh)
{
    struct cfx_object_id id;
    char name[96];
    snprintf(name, sizeof(name), "%s-shape", done_name);
    perf_id(&id, name, 0, 0);
    return cfx_put(ctx, &id, sh, sizeof(*sh), NULL);
}

/* Client: 0 when the server put what this client gets (as many sizes, at
 * least as many gets of each); else 1, said on stderr and to the server.
 * Sizes of the same count that differ are named by the first get, in the
 * words of a differing -s (perf_mismatch_tell). */
static inline int perf_shape_check(struct cfx_context *ctx, const char *prog,
                                   const char *done_name, const struct perf_shape *mine)
{
    struct cfx_object_id id;
    struct perf_shape srv;
    char name[96], text[PERF_DONE_TEXT_MAX];
    size_t got = 0;
    snprintf(name, sizeof(name), "%s-shape", done_name);
    perf_id(&id, name, 0, 0);
    if (cfx_get(ctx, &id, &srv, sizeof(srv), &got, NULL) != CFX_OK) {
        fprintf(stderr, "%s: cannot read what the server puts: %s\n", prog, cfx_last_error());
        return 1;
    }
    if (got == sizeof(srv) && srv.nsizes == mine->nsizes && srv.gets >= mine->gets)
        return 0;
    snprintf(text, sizeof(text), "size mismatch: the server put %llu size(s) of %llu .. %llu "
             "bytes, %llu of each, where this client gets %llu of %llu .. %llu bytes, %llu of "
             "each: give both sides the same -s (and -a), -n and -w",
             (unsigned long long)srv.nsizes, (unsigned long long)srv.sizes[0],
             (unsigned long long)srv.sizes[srv.nsizes ? (srv.nsizes - 1) % PERF_SWEEP_MAX : 0],
             (unsigned long long)srv.gets, (unsigned long long)mine->nsizes,
             (unsigned long long)mine->sizes[0],
             (unsigned long long)mine->sizes[mine->nsizes - 1], (unsigned long long)mine->gets);
    fprintf(stderr, "%s: %s\n", prog, text);
    perf_client_failed(ctx, done_name, text);
    return 1;
}

/* One look for the client's "done": CFX_OK (one byte), the client's text as
 * a CFX_ERR_INVALID error (perf_client_failed), or the get's error. */
static inline int perf_done_get(struct cfx_context *ctx, const struct cfx_object_id *id,
                                const struct cfx_obj_params *p)
{
    char done[PERF_DONE_TEXT_MAX];
    size_t got = 0;
    int rc = cfx_get(ctx, id, done, sizeof(done), &got, p);
    if (rc != CFX_OK || got <= 1)
        return rc;
    done[got - 1] = '\0';
    return cfx__err(CFX_ERR_INVALID, "the client failed: %s", done);
}

/*
 * Server: waits for the client's "done" (the object @p done_name), for
 * PERF_SERVER_WAIT_MS at most, in slices, and looks at the (in-process)
 * coordinator's members between them:
 * a client that joined and is gone without its "done" (killed, or failed
 * and left) ends the wait at once, as perftest's server does not.  A client
 * that failed and said why (perf_client_failed) ends it with its text.
 */
static inline int perf_server_wait(struct cfx_context *ctx, struct cfx_coord *coord,
                                   const char *done_name)
{
    struct cfx_object_id id;
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 500 };
    uint64_t end = cfx__now_ns() + (uint64_t)PERF_SERVER_WAIT_MS * 1000000ull;

    perf_id(&id, done_name, 0, 0);
    for (;;) {
        int rc = perf_done_get(ctx, &id, &p);
        if (rc == CFX_OK || rc == CFX_ERR_INVALID) {
            char why[PERF_DONE_TEXT_MAX + 64];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            perf_server_ack(ctx, coord, done_name); /* its calls set the last error */
            return rc == CFX_OK ? CFX_OK : cfx__err(rc, "%s", why);
        }
        if (rc != CFX_ERR_TIMEOUT)
            return rc;
        /* someone joined besides this server and no one is left but it:
         * the client came and went (a client may join and leave within a
         * slice, so joins are counted, not seen); its "done" may have
         * landed just after the last look, so one more */
        uint32_t joined, alive;
        cfx__coord_member_counts(coord, &joined, &alive);
        if (joined > 1 && alive <= 1) {
            rc = perf_done_get(ctx, &id, &p);
            if (rc == CFX_OK || rc == CFX_ERR_INVALID)
                return rc; /* its putter has gone: nobody to tell */
            return cfx__err(CFX_ERR_PEER_FAILED, "the client left the cluster (killed, or it "
                            "failed) before it said it was done");
        }
        if (cfx__now_ns() >= end)
            return cfx__err(CFX_ERR_TIMEOUT, "no client finished within %d s",
                            PERF_SERVER_WAIT_MS / 1000);
    }
}

#endif

/*
 * conflux-coord: the Conflux coordinator daemon.
 *
 *   conflux-coord [--bind ADDR] [--port N] [--token T | --token-file F]
 *                 [--heartbeat-ms N] [--dead-after-ms N] [--fanout N]
 *                 [--auth-timeout-ms N] [--stall-timeout-ms N] [--state-dir DIR]
 *                 [--max-nodes N] [--max-node-objects N] [--max-objects N]
 *                 [--max-node-bytes SIZE]
 *                 [--max-parked N] [--max-unauth-conns N] [--max-unauth-per-ip N]
 *                 [--max-conns N] [--max-conn-outq SIZE] [--max-buffered SIZE]
 *                 [--max-node-tasks N] [--max-queued-tasks N]
 *                 [--task-grace-ms N] [--metrics [ADDR:]PORT] [--secure MODE]
 *
 * Prints "conflux-coord listening on ADDR:PORT" once ready, runs until
 * SIGINT, SIGTERM or SIGHUP (its terminal gone), then stops in order
 * (members are told it is stopping) and exits 0.  A bad argument: one line naming the option
 * and the value on stderr, exit 2.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <conflux/status.h>

#include "args.h"
#include "control/auth.h"
#include "control/coord.h"
#include "control/proto.h"
#include "control/seal.h"
#include "dataplane/common/log.h"

#define DEFAULT_PORT 5000
#define PROG "conflux-coord"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: conflux-coord [--bind ADDR] [--port N] [--token T | --token-file F]\n"
            "                     [--heartbeat-ms N] [--dead-after-ms N] [--fanout N]\n"
            "                     [--auth-timeout-ms N] [--stall-timeout-ms N] [--state-dir DIR]\n"
            "                     [--max-nodes N] [--max-node-objects N] [--max-objects N]\n"
            "                     [--max-node-bytes SIZE]\n"
            "                     [--max-parked N] [--max-unauth-conns N]\n"
            "                     [--max-unauth-per-ip N] [--max-conns N]\n"
            "                     [--max-conn-outq SIZE] [--max-buffered SIZE]\n"
            "                     [--max-node-tasks N]\n"
            "                     [--max-queued-tasks N] [--metrics [ADDR:]PORT]\n"
            "                     [--task-grace-ms N] [--secure off|integrity|encrypt]\n"
            "\n"
            "  --bind ADDR         IPv4 address, or a host name that has one, to listen on\n"
            "                      (default 127.0.0.1); one that does not parse or resolve\n"
            "                      is a usage error, one that cannot be bound exits 1\n"
            "  --port N            TCP port, 0 for any free one (default %d)\n"
            "  --token T           cluster token (default $CFX_TOKEN); visible in ps, so\n"
            "                      a warning says so: prefer --token-file\n"
            "  --token-file F      read the cluster token from F (default $CFX_TOKEN_FILE)\n"
            "  --heartbeat-ms N    interval members heartbeat at, 1..3600000 (default 250)\n"
            "  --dead-after-ms N   silence after which a member is dead, more than the\n"
            "                      heartbeat interval, at most 3600000 (default 1500)\n"
            "  --fanout N          uploads one holder is given before others, 1..1024 (default:\n"
            "                      per object: 1, a chain, for objects of 4 chunks or more;\n"
            "                      2 for smaller ones)\n"
            "  --auth-timeout-ms N close connections not authenticated by then (default 5000)\n"
            "  --stall-timeout-ms N close connections stalled mid-frame that long (default 10000)\n"
            "  --state-dir DIR     keep durable state (node ids, durable objects such as group\n"
            "                      bootstrap records) in DIR; it survives a restart, even\n"
            "                      after kill -9 (default: none)\n"
            "  --max-nodes N       members alive at once, 1..16777216 (default 65536); a JOIN\n"
            "                      beyond is refused with an error naming max_nodes.  Node ids\n"
            "                      are chosen by the coordinator, never reused with\n"
            "                      --state-dir; without it a restarted coordinator gives\n"
            "                      reconnecting nodes their ids back when free\n"
            "  --max-node-objects N  directory entries (objects put or held) one node may\n"
            "                      have, 1..2147483647 (default 1048576)\n"
            "  --max-objects N     directory entries of all nodes together, 1..2147483647\n"
            "                      (default 4194304); a put of a new id beyond is refused\n"
            "  --max-node-bytes SIZE inline bytes stored for one node's puts (default 256M)\n"
            "  --max-parked N      lookups waiting for a holder, all nodes together\n"
            "                      (default 65536); one member holds at most 4096, or its\n"
            "                      share among the live members (at least 256); task\n"
            "                      waits are capped alike\n"
            "  --max-unauth-conns N connections not yet authenticated (default 256); a new\n"
            "                      one beyond closes the oldest of them\n"
            "  --max-unauth-per-ip N connections not yet authenticated from one source\n"
            "                      address; a new one beyond closes the oldest (default 16)\n"
            "  --max-conns N       connections in all (default 4096)\n"
            "  --max-conn-outq SIZE reply bytes queued to one connection before it is\n"
            "                      closed as too slow (default 64M); above 1M its requests\n"
            "                      wait unread until its replies drain\n"
            "  --max-buffered SIZE reply and request bytes held for all connections\n"
            "                      together; beyond, the one holding the most is closed\n"
            "                      (default 256M)\n"
            "  --max-node-tasks N  tasks placed on one node at once; more wait queued\n"
            "                      (default 64)\n"
            "  --max-queued-tasks N tasks waiting for a free node (default 4096)\n"
            "  --task-grace-ms N   after a start, tasks submitted again across a restart wait\n"
            "                      this long at most for their workers to re-announce them\n"
            "                      before they are placed (default 5000)\n"
            "  --metrics [ADDR:]PORT serve Prometheus metrics over HTTP (GET /metrics) on\n"
            "                      ADDR (default 127.0.0.1): unauthenticated and read-only,\n"
            "                      so whoever can connect reads member names, hosts and\n"
            "                      counts; bind it beyond loopback only on a trusted network\n"
            "  --secure MODE       control-plane protection after the token handshake\n"
            "                      (default $CFX_SECURE, else off): off (plain frames),\n"
            "                      integrity (every frame authenticated, AES-256-GCM), encrypt\n"
            "                      (authenticated and encrypted; also 1, on, yes).  Every\n"
            "                      node and rdmactl must run with the same CFX_SECURE: a\n"
            "                      client with another is refused (CFX_ERR_AUTH naming both)\n"
            "Every cap, when hit, answers the caller CFX_ERR_NO_RESOURCE with a text naming\n"
            "it (max_nodes, max_node_objects, ...); a refused connection gets that error\n"
            "before the close.  SIZE takes K, M, G suffixes.\n"
            "Other times are whole milliseconds, 1..2147483647.  A bad value is named on\n"
            "stderr; usage errors exit with status 2.\n",
            DEFAULT_PORT);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "bind", required_argument, NULL, 'b' },
        { "port", required_argument, NULL, 'p' },
        { "token", required_argument, NULL, 't' },
        { "token-file", required_argument, NULL, 'f' },
        { "heartbeat-ms", required_argument, NULL, 'H' },
        { "dead-after-ms", required_argument, NULL, 'D' },
        { "fanout", required_argument, NULL, 'F' },
        { "auth-timeout-ms", required_argument, NULL, 'A' },
        { "stall-timeout-ms", required_argument, NULL, 'S' },
        { "state-dir", required_argument, NULL, 'd' },
        { "max-nodes", required_argument, NULL, 'N' },
        { "max-node-objects", required_argument, NULL, 'O' },
        { "max-objects", required_argument, NULL, 'o' },
        { "max-node-bytes", required_argument, NULL, 'B' },
        { "max-parked", required_argument, NULL, 'P' },
        { "max-unauth-conns", required_argument, NULL, 'U' },
        { "max-unauth-per-ip", required_argument, NULL, 'i' },
        { "max-buffered", required_argument, NULL, 'm' },
        { "max-conns", required_argument, NULL, 'C' },
        { "max-conn-outq", required_argument, NULL, 'Q' },
        { "metrics", required_argument, NULL, 'M' },
        { "max-node-tasks", required_argument, NULL, 'T' },
        { "max-queued-tasks", required_argument, NULL, 'q' },
        { "task-grace-ms", required_argument, NULL, 'G' },
        { "secure", required_argument, NULL, 'X' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    struct cfx_coord_params params = { .bind_addr = "127.0.0.1", .port = DEFAULT_PORT };
    char *token_arg = NULL;
    char metrics[300]; /* --metrics: a host name of up to 253 bytes, ':', a port */
    const char *token_file = NULL;
    const char *secure = getenv("CFX_SECURE"), *secure_from = "CFX_SECURE";
    char token[CFX_TOKEN_MAX + 1];
    int c, v, rc;

    while ((c = getopt_long(argc, argv, "b:p:t:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            /* one that does not parse or resolve is a usage error, named
             * before anything starts; one that cannot be bound (in use,
             * not this host's) fails the start: exit 1 */
            if (tool_arg_host(PROG, "--bind", optarg))
                return TOOL_EXIT_USAGE;
            params.bind_addr = optarg;
            break;
        case 'p':
            if (tool_arg_int(PROG, "--port", optarg, 0, 65535, "a TCP port", &v))
                return TOOL_EXIT_USAGE;
            params.port = (uint16_t)v;
            break;
        case 't':
            if (tool_arg_nonempty(PROG, "--token", optarg, "a token"))
                return TOOL_EXIT_USAGE;
            /* copied, and the argv bytes overwritten: ps shows them only until here */
            if (token_arg) { /* given twice: the last one counts */
                explicit_bzero(token_arg, strlen(token_arg));
                free(token_arg);
            }
            token_arg = strdup(optarg);
            if (!token_arg) {
                fprintf(stderr, "conflux-coord: out of memory\n");
                return 1;
            }
            memset(optarg, '*', strlen(optarg));
            fprintf(stderr, "conflux-coord: warning: --token puts the cluster token on the "
                    "command line, where ps and /proc/PID/cmdline show it; use --token-file "
                    "or CFX_TOKEN_FILE\n");
            break;
        case 'f':
            if (tool_arg_nonempty(PROG, "--token-file", optarg, "a file name"))
                return TOOL_EXIT_USAGE;
            token_file = optarg;
            break;
        case 'H':
            if (tool_arg_int(PROG, "--heartbeat-ms", optarg, 1, CFX_PROTO_TIMING_MAX_MS,
                             "an interval in ms", &v))
                return TOOL_EXIT_USAGE;
            params.heartbeat_ms = (uint32_t)v;
            break;
        case 'D':
            if (tool_arg_int(PROG, "--dead-after-ms", optarg, 1, CFX_PROTO_TIMING_MAX_MS,
                             "a time in ms", &v))
                return TOOL_EXIT_USAGE;
            params.dead_after_ms = (uint32_t)v;
            break;
        case 'F':
            if (tool_arg_int(PROG, "--fanout", optarg, 1, 1024, "a fan-out", &v))
                return TOOL_EXIT_USAGE;
            params.fanout = (uint32_t)v;
            break;
        case 'A':
            if (tool_arg_int(PROG, "--auth-timeout-ms", optarg, 1, INT_MAX, "a timeout in ms", &v))
                return TOOL_EXIT_USAGE;
            params.auth_timeout_ms = (uint32_t)v;
            break;
        case 'S':
            if (tool_arg_int(PROG, "--stall-timeout-ms", optarg, 1, INT_MAX, "a timeout in ms",
                             &v))
                return TOOL_EXIT_USAGE;
            params.stall_timeout_ms = (uint32_t)v;
            break;
        case 'd':
            /* no silent fallback to running without durable state */
            if (tool_arg_nonempty(PROG, "--state-dir", optarg, "a directory"))
                return TOOL_EXIT_USAGE;
            params.state_dir = optarg;
            break;
        case 'X':
            /* CFX_SECURE='' is unset; an empty option is a mistake */
            if (tool_arg_nonempty(PROG, "--secure", optarg, "off, integrity or encrypt"))
                return TOOL_EXIT_USAGE;
            secure = optarg;
            secure_from = "--secure";
            break;
        case 'N':
            if (tool_arg_int(PROG, "--max-nodes", optarg, 1, 1 << 24, "a number of members", &v))
                return TOOL_EXIT_USAGE;
            params.max_nodes = (uint32_t)v;
            break;
        case 'O':
            if (tool_arg_int(PROG, "--max-node-objects", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_node_objects = (uint32_t)v;
            break;
        case 'o':
            if (tool_arg_int(PROG, "--max-objects", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_objects = (uint32_t)v;
            break;
        case 'T':
            if (tool_arg_int(PROG, "--max-node-tasks", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_node_tasks = (uint32_t)v;
            break;
        case 'q':
            if (tool_arg_int(PROG, "--max-queued-tasks", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_queued_tasks = (uint32_t)v;
            break;
        case 'G':
            if (tool_arg_int(PROG, "--task-grace-ms", optarg, 1, INT_MAX, "a time in ms", &v))
                return TOOL_EXIT_USAGE;
            params.task_grace_ms = (uint32_t)v;
            break;
        case 'P':
            if (tool_arg_int(PROG, "--max-parked", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_parked = (uint32_t)v;
            break;
        case 'U':
            if (tool_arg_int(PROG, "--max-unauth-conns", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_unauth_conns = (uint32_t)v;
            break;
        case 'i':
            if (tool_arg_int(PROG, "--max-unauth-per-ip", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_unauth_per_ip = (uint32_t)v;
            break;
        case 'C':
            if (tool_arg_int(PROG, "--max-conns", optarg, 1, INT_MAX, "a count", &v))
                return TOOL_EXIT_USAGE;
            params.max_conns = (uint32_t)v;
            break;
        case 'B':
        case 'Q':
        case 'm': {
            size_t sz;
            /* a budget below one largest frame and one connection's pause
             * mark (1 MiB) would close a connection for an ordinary put */
            size_t lo = c == 'm' ? (size_t)CFX_PROTO_MAX_PAYLOAD + (1u << 20) : 1;
            if (tool_arg_size(PROG, c == 'B'   ? "--max-node-bytes"
                                    : c == 'Q' ? "--max-conn-outq"
                                               : "--max-buffered",
                              optarg, lo, SIZE_MAX, &sz))
                return TOOL_EXIT_USAGE;
            if (c == 'B')
                params.max_node_bytes = sz;
            else if (c == 'Q')
                params.max_conn_outq = sz;
            else
                params.max_buffered = sz;
            break;
        }
        case 'M': {
            /* a bare port: on loopback */
            const char *colon = strrchr(optarg, ':');
            if (tool_arg_int(PROG, "--metrics", colon ? colon + 1 : optarg, 0, 65535, "[ADDR:]PORT",
                             &v))
                return TOOL_EXIT_USAGE;
            if (colon && colon != optarg) {
                snprintf(metrics, sizeof(metrics), "%.*s", (int)(colon - optarg), optarg);
                if (tool_arg_host(PROG, "--metrics", metrics))
                    return TOOL_EXIT_USAGE;
                snprintf(metrics + strlen(metrics), sizeof(metrics) - strlen(metrics), ":%d", v);
            } else {
                snprintf(metrics, sizeof(metrics), "127.0.0.1:%d", v);
            }
            params.metrics_addr = metrics;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "conflux-coord: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    /* The pair is checked here too, so that it is a usage error naming the
     * option (the coordinator's own check said "dead-after (100 ms) must
     * exceed the heartbeat interval (250 ms)", exit 1). */
    uint32_t hb = params.heartbeat_ms ? params.heartbeat_ms : CFX_COORD_HEARTBEAT_MS_DEFAULT;
    uint32_t dead = params.dead_after_ms ? params.dead_after_ms : CFX_COORD_DEAD_AFTER_MS_DEFAULT;
    if (dead <= hb) {
        if (params.dead_after_ms)
            fprintf(stderr, "conflux-coord: --dead-after-ms: '%u' is not more than the heartbeat "
                    "interval (%u ms%s)\n", dead, hb,
                    params.heartbeat_ms ? ", --heartbeat-ms" : "");
        else
            fprintf(stderr, "conflux-coord: --heartbeat-ms: '%u' is not less than the dead-after "
                    "time (%u ms by default; raise --dead-after-ms)\n", hb, dead);
        return TOOL_EXIT_USAGE;
    }
    if (cfx__seal_mode_parse(secure, &params.secure) != CFX_OK) {
        fprintf(stderr, "conflux-coord: %s '%s': expected off, integrity or encrypt (or 0, 1, "
                "on, yes, no)\n", secure_from, secure);
        return 2;
    }
    if (token_arg && token_file) {
        fprintf(stderr, "conflux-coord: give --token or --token-file, not both\n");
        usage(stderr);
        return 2;
    }
    if (token_file && setenv("CFX_TOKEN_FILE", token_file, 1) == 0)
        unsetenv("CFX_TOKEN"); /* an explicit file wins over the environment */
    /* a file given on the command line is named as given there, not as the
     * CFX_TOKEN_FILE the library reads otherwise */
    rc = token_file ? cfx__token_load_file(token_file, token_file, token, sizeof(token))
                    : cfx__token_load(token_arg, token, sizeof(token));
    if (token_arg) {
        explicit_bzero(token_arg, strlen(token_arg));
        free(token_arg);
    }
    if (rc != CFX_OK) {
        /* a value of the option or the variable that gives no token: a
         * usage error, as a bad value of any option */
        fprintf(stderr, "conflux-coord: %s%s\n", token_file ? "--token-file: " : "",
                cfx_last_error());
        return TOOL_EXIT_USAGE;
    }
    params.token = token;
    if (cfx__token_bits(token) < CFX_TOKEN_MIN_BITS)
        fprintf(stderr, "conflux-coord: warning: the cluster token holds at most %u bits, under "
                "%u: generate one, e.g. head -c 16 /dev/urandom | xxd -p > token\n",
                cfx__token_bits(token), CFX_TOKEN_MIN_BITS);

    /* One fd per connection: take all the hard limit allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    /* Signals are taken synchronously by this thread; block them before the
     * coordinator thread starts so it inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP); /* the terminal it ran in closed: an orderly stop too */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct cfx_coord *coord;
    cfx__log_set_tag("coord");
    rc = cfx__coord_start(&params, &coord);
    if (rc != CFX_OK) {
        fprintf(stderr, "conflux-coord: %s (%s)\n", cfx_last_error(), cfx_errname(rc));
        return 1;
    }
    printf("conflux-coord listening on %s\n", cfx__coord_addr(coord));
    if (params.metrics_addr)
        printf("conflux-coord metrics on http://%.*s:%u/metrics\n",
               (int)(strrchr(params.metrics_addr, ':') - params.metrics_addr), params.metrics_addr,
               (unsigned)cfx__coord_metrics_port(coord));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&set, &sig) != 0)
        ;
    fprintf(stderr, "conflux-coord: %s, shutting down\n", strsignal(sig));
    cfx__coord_stop(coord);
    return 0;
}

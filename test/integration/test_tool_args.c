/*
 * Every tool turns a bad argument away: one table of argument vectors, each
 * run as a child of its own.  Each must end by itself (a generous limit
 * catches a hang; no speed is asserted), exit with the expected status (2
 * for usage errors) and name the option and the bad value on stderr.  A few
 * good vectors show the parsers still take what is right.  rdmactl ps needs
 * a coordinator: such a case starts one (conflux-coord --port 0).
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "testutil.h"

#ifndef CFX_BIN_DIR
#error "CFX_BIN_DIR must name the bin directory of the build"
#endif

#define HANG_LIMIT_MS 20000 /* anti-hang limit, not a speed target */
#define ARGV_MAX 10

struct args_case {
    const char *tool;
    const char *argv[ARGV_MAX]; /* after the tool's name; NULL-terminated */
    int status;                 /* expected exit status */
    const char *opt;            /* stderr names it (NULL: not checked) */
    const char *val;            /* and it */
    int coord;                  /* needs the suite's coordinator */
};

static const struct args_case cases[] = {
    /* cfx_get_bw (issue 21, part C) */
    { "cfx_get_bw", { "-s", "100G" }, 2, "-s", "'100G'", 0 },
    { "cfx_get_bw", { "-u", "-s", "100G" }, 2, "-s", "'100G'", 0 },
    { "cfx_get_bw", { "-s", "0" }, 2, "-s", "'0'", 0 },
    { "cfx_get_bw", { "-s", "12Q" }, 2, "-s", "'12Q'", 0 },
    { "cfx_get_bw", { "-n", "abc" }, 2, "-n", "'abc'", 0 },
    { "cfx_get_bw", { "-n", "0" }, 2, "-n", "'0'", 0 },
    { "cfx_get_bw", { "-w", "-1" }, 2, "-w", "'-1'", 0 },
    { "cfx_get_bw", { "-t", "carrier-pigeon" }, 2, "-t", "'carrier-pigeon'", 0 },
    { "cfx_get_bw", { "-p", "99999" }, 2, "-p", "'99999'", 0 },
    { "cfx_get_bw", { "-p", "12x" }, 2, "-p", "'12x'", 0 },
    { "cfx_get_bw", { "-c", "0" }, 2, "-c", "'0'", 0 },
    /* -k '' fell back to $CFX_TOKEN_FILE and started a server */
    { "cfx_get_bw", { "-k", "" }, 2, "-k: ''", "must not be empty", 0 },
    { "cfx_get_lat", { "--token=", "127.0.0.1" }, 2, "-k: ''", "must not be empty", 0 },
    /* -t: one spelling for every tool, CFX_TRANSPORT's (lower-case names, a
     * list, ^LIST), refused with status 2 and the choices before the library
     * sees it (it said "CFX_TRANSPORT names 'TCP', which this build does not
     * have", exit 1) */
    { "cfx_get_bw", { "-t", "TCP" }, 2, "-t: 'TCP' is not a transport (tcp, shm, verbs or dpdk",
      "names are lower case", 0 },
    { "cfx_get_lat", { "-t", "TCP" }, 2, "-t: 'TCP' is not a transport (tcp, shm, verbs or dpdk",
      "names are lower case", 0 },
    { "cfx_get_lat", { "-t", "shm,bogus" }, 2, "-t: 'bogus' in 'shm,bogus' is not a transport",
      "(tcp, shm, verbs or dpdk", 0 },
    { "cfx_run", { "-n", "1", "-t", "TCP", "true" }, 2,
      "--transport: 'TCP' is not a transport (tcp, shm, verbs or dpdk", "names are lower case",
      0 },
    { "cfx_get_bw", { "-t", "shm,tcp", "--help" }, 0, NULL, NULL, 0 },
    { "cfx_get_lat", { "-t", "^shm", "--help" }, 0, NULL, NULL, 0 },
    { "cfx_run", { "-n", "1", "-t", "shm,tcp", "true" }, 0, NULL, NULL, 0 },
    /* cfx_get_lat */
    { "cfx_get_lat", { "-s", "100G" }, 2, "-s", "'100G'", 0 },
    /* the other tool's options are refused, not ignored (they were taken and did nothing) */
    { "cfx_get_lat", { "-u" }, 2, "-u: not an option of cfx_get_lat", NULL, 0 },
    { "cfx_get_lat", { "-s", "64", "-m" }, 2, "-m: not an option of cfx_get_lat", NULL, 0 },
    { "cfx_get_lat", { "--memcpy-ref" }, 2, "--memcpy-ref: not an option of cfx_get_lat", NULL,
      0 },
    { "cfx_get_lat", { "--report_gbits" }, 2, "--report_gbits: not an option of cfx_get_lat",
      NULL, 0 },
    { "cfx_get_bw", { "-r" }, 2, "-r: not an option of cfx_get_bw", NULL, 0 },
    { "cfx_get_bw", { "--repeat" }, 2, "--repeat: not an option of cfx_get_bw", NULL, 0 },
    { "cfx_get_lat", { "-n", " 5" }, 2, "-n", "' 5'", 0 },
    { "cfx_get_lat", { "-w", "1e3" }, 2, "-w", "'1e3'", 0 },
    /* cfx_obj_perf */
    { "cfx_obj_perf", { "-e", "100G" }, 2, "-e", "'100G'", 0 },
    { "cfx_obj_perf", { "-o", "scatter" }, 2, "-o", "'scatter'", 0 },
    { "cfx_obj_perf", { "-A", "-5" }, 2, "-A", "'-5'", 0 },
    { "cfx_obj_perf", { "-k", "0" }, 2, "-k", "'0'", 0 },
    { "cfx_obj_perf", { "--kill", "2x" }, 2, "--kill", "'2x'", 0 },
    { "cfx_obj_perf", { "--kill", "1@-3" }, 2, "--kill", "'-3'", 0 },
    { "cfx_obj_perf", { "-o", "reduce", "-b", "2" }, 2, "-b", NULL, 0 },
    /* cfx_coll_perf */
    { "cfx_coll_perf", { "-n", "abc" }, 2, "-n", "'abc'", 0 },
    { "cfx_coll_perf", { "-e", "100G" }, 2, "-e", "'100G'", 0 },
    { "cfx_coll_perf", { "-T", "-1" }, 2, "-T", "'-1'", 0 },
    { "cfx_coll_perf", { "-f", "1" }, 2, "-f", "'1'", 0 },
    { "cfx_coll_perf", { "-o", "nope" }, 2, "-o", "'nope'", 0 },
    /* a word that is none of the choices is named with them */
    { "cfx_coll_perf", { "-o", "bogus" }, 2, "-o: 'bogus' is not one of:",
      "allreduce, broadcast, reduce, allgather, reducescatter", 0 },
    { "cfx_coll_perf", { "-d", "bogus" }, 2, "-d: 'bogus' is not one of:",
      "float, double, half, bfloat16, int32, int64, uint8", 0 },
    { "cfx_coll_perf", { "-R", "bogus" }, 2, "-R: 'bogus' is not one of:", "sum, prod, min, max",
      0 },
    { "cfx_coll_perf", { "-a", "bogus" }, 2, "-a: 'bogus' is not one of:", "auto, ring", 0 },
    /* a sweep with no size of one element gave an empty table and "OK", exit 0 */
    { "cfx_coll_perf", { "-b", "3", "-e", "3", "-d", "float" }, 2, "-b 3 -e 3",
      "no size of the sweep holds one float element (4 bytes)", 0 },
    { "cfx_coll_perf", { "-b", "0", "-e", "0" }, 2, "-b 0 -e 0", "so no row would run", 0 },
    { "cfx_coll_perf", { "-b", "0", "-e", "0", "-d", "uint8" }, 2, "-b 0 -e 0",
      "one uint8 element (1 byte)", 0 },
    { "cfx_run", { "-n", "2", CFX_BIN_DIR "/cfx_coll_perf", "-o", "allgather", "-b", "4", "-e",
                   "4" }, 2, "-b 4 -e 4", "per rank for allgather over 2 ranks", 0 },
    { "cfx_coll_perf", { "-r", "-2" }, 2, "-r", "'-2'", 0 },
    /* cfx_demo_bcast */
    { "cfx_demo_bcast", { "100G" }, 2, "SIZE", "'100G'", 0 },
    { "cfx_demo_bcast", { "lots" }, 2, "SIZE", "'lots'", 0 },
    /* cfx_gpu_bench: checked before it looks for CUDA */
    { "cfx_gpu_bench", { "-n", "abc" }, 2, "-n", "'abc'", 0 },
    { "cfx_gpu_bench", { "-s", "1K" }, 2, "-s", "'1K'", 0 },
    { "cfx_gpu_bench", { "-d", "f99" }, 2, "-d", "'f99'", 0 },
    /* cfx_ps_bench */
    { "cfx_ps_bench", { "-s", "abc" }, 2, "-s", "'abc'", 0 },
    { "cfx_ps_bench", { "-b", "100T" }, 2, "-b", "'100T'", 0 },
    { "cfx_ps_bench", { "--steps", "0" }, 2, "--steps", "'0'", 0 },
    /* cfx_reduce_bench */
    { "cfx_reduce_bench", { "-s", "100G" }, 2, "-s", "'100G'", 0 },
    { "cfx_reduce_bench", { "-s", "8" }, 2, "-s", "'8'", 0 },
    { "cfx_reduce_bench", { "-n", "x" }, 2, "-n", "'x'", 0 },
    { "cfx_reduce_bench", { "-i", "sse9" }, 2, "-i", "'sse9'", 0 },
    { "cfx_reduce_bench", { "-d", "f33" }, 2, "-d", "'f33'", 0 },
    /* cfx_run */
    { "cfx_run", { "-n", "0", "true" }, 2, "-n", "'0'", 0 },
    { "cfx_run", { "-n", "1", "--timeout", "-1", "true" }, 2, "--timeout", "'-1'", 0 },
    { "cfx_run", { "-n", "1", "--timeout", "abc", "true" }, 2, "--timeout", "'abc'", 0 },
    { "cfx_run", { "-n", "1", "--timeout", "0", "true" }, 2, "--timeout", "'0'", 0 },
    { "cfx_run", { "-n", "1", "--allow-fail", "1,x", "true" }, 2, "--allow-fail", "'x'", 0 },
    { "cfx_run", { "-n", "1", "--coord-port", "-5", "true" }, 2, "--coord-port", "'-5'", 0 },
    { "cfx_run", { "-n", "1", "--chunk-size", "lots", "true" }, 2, "--chunk-size", "'lots'", 0 },
    /* cfx_run --hosts: every check before anything starts */
    { "cfx_run", { "--hosts", "", "true" }, 2, "--hosts", "''", 0 },
    { "cfx_run", { "--hosts", "a,,b", "true" }, 2, "empty host name", "'a,,b'", 0 },
    { "cfx_run", { "--hosts", "a,b:", "true" }, 2, "--hosts", "''", 0 },
    { "cfx_run", { "--hosts", "a:0", "true" }, 2, "--hosts", "'0'", 0 },
    { "cfx_run", { "--hosts", "a:2x", "true" }, 2, "--hosts", "'2x'", 0 },
    { "cfx_run", { "--hosts", "-oProxyCommand=x", "true" }, 2, "starts with '-'",
      "'-oProxyCommand=x'", 0 },
    { "cfx_run", { "--hosts", "a;reboot", "true" }, 2, "not a host name", "'a;reboot'", 0 },
    { "cfx_run", { "--hosts", "a,b:2", "-n", "4", "true" }, 2, "--oversubscribe", "'4'", 0 },
    { "cfx_run", { "--hosts", "a", "--rsh", "/nonexistent/rsh", "true" }, 2, "--rsh",
      "'/nonexistent/rsh'", 0 },
    { "cfx_run", { "--hosts", "a", "--rsh", "cfx-no-such-rsh -p 22", "true" }, 2, "--rsh",
      "'cfx-no-such-rsh'", 0 },
    { "cfx_run", { "--hosts", "a", "--rsh", " ", "true" }, 2, "--rsh", "' '", 0 },
    { "cfx_run", { "-n", "1", "--rsh", "ssh", "true" }, 2, "--hosts", NULL, 0 },
    { "cfx_run", { "--hosts", "a", "-x", "1BAD", "true" }, 2, "-x", "'1BAD'", 0 },
    { "cfx_run", { "--hosts", "a", "-x", "CFX_TOKEN=v", "true" }, 2, "-x", "never travels", 0 },
    /* an address that does not parse or resolve is a usage error, named
     * before anything starts (it was exit 1, after the hosts' checks) */
    { "cfx_run", { "--hosts", "a", "--rsh", "true", "--coord-addr", "no-such-host.invalid",
                   "true" }, 2, "--coord-addr", "'no-such-host.invalid'", 0 },
    { "cfx_run", { "--hosts", "a", "--rsh", "true", "--coord-addr", "256.1.1.1", "true" }, 2,
      "--coord-addr: '256.1.1.1' is not an IPv4 address", NULL, 0 },
    /* cfx_train */
    { "cfx_train", { "--epochs", "-3" }, 2, "--epochs", "'-3'", 0 },
    { "cfx_train", { "--batch", "abc" }, 2, "--batch", "'abc'", 0 },
    { "cfx_train", { "--slow-us", "1.5" }, 2, "--slow-us", "'1.5'", 0 },
    /* conflux-coord */
    { "conflux-coord", { "--port", "abc" }, 2, "--port", "'abc'", 0 },
    { "conflux-coord", { "--fanout", "0" }, 2, "--fanout", "'0'", 0 },
    { "conflux-coord", { "--heartbeat-ms", "-1" }, 2, "--heartbeat-ms", "'-1'", 0 },
    { "conflux-coord", { "--dead-after-ms", "10x" }, 2, "--dead-after-ms", "'10x'", 0 },
    { "conflux-coord", { "--metrics", "abc" }, 2, "--metrics", "'abc'", 0 },
    { "conflux-coord", { "--metrics", "127.0.0.1:99999" }, 2, "--metrics", "'99999'", 0 },
    { "conflux-coord", { "--secure", "bogus" }, 2, "--secure", "'bogus'", 0 },
    /* dead-after within its range but not above the heartbeat: the
     * coordinator refused it, exit 1, naming no option */
    { "conflux-coord", { "--dead-after-ms", "100" }, 2, "--dead-after-ms", "'100'", 0 },
    { "conflux-coord", { "--heartbeat-ms", "2000" }, 2, "--heartbeat-ms", "'2000'", 0 },
    { "conflux-coord", { "--heartbeat-ms", "500", "--dead-after-ms", "400" }, 2,
      "--dead-after-ms", "'400'", 0 },
    /* a --bind that does not parse or resolve: exit 2 before anything
     * starts, not the library's error with exit 1 (an address that cannot
     * be bound still exits 1: coord_bind_of_an_address_not_free_exits_1) */
    { "conflux-coord", { "--bind", "256.1.1.1" }, 2, "--bind: '256.1.1.1' is not an IPv4 address",
      NULL, 0 },
    { "conflux-coord", { "--bind", "no-such-host.invalid" }, 2, "--bind",
      "'no-such-host.invalid' is not an IPv4 address or a host name that has one", 0 },
    { "conflux-coord", { "--bind", "::1" }, 2, "--bind: '::1'", "IPv6 is not supported", 0 },
    { "conflux-coord", { "--metrics", "256.1.1.1:9100" }, 2,
      "--metrics: '256.1.1.1' is not an IPv4 address", NULL, 0 },
    { "conflux-coord", { "--metrics", "no-such-host.invalid:9100" }, 2, "--metrics",
      "'no-such-host.invalid'", 0 },
    { "conflux-coord", { "--bind", "127.0.0.1", "--help" }, 0, NULL, NULL, 0 },
    { "conflux-coord", { "--bind", "localhost", "--metrics", "localhost:0", "--help" }, 0,
      NULL, NULL, 0 },
    { "conflux-coord", { "--token", "" }, 2, "--token", "''", 0 },
    { "conflux-coord", { "--token-file", "/dev/null" }, 2, "--token-file: ",
      "the cluster token from /dev/null is empty", 0 },
    /* a token file that cannot be read: named as the option gave it (both
     * said "CFX_TOKEN_FILE=..."), a usage error of both tools (cfx_run
     * exited 1) */
    { "conflux-coord", { "--token-file", "/nonexistent" }, 2,
      "conflux-coord: --token-file: cannot read the cluster token file /nonexistent: ", NULL, 0 },
    { "cfx_run", { "-n", "2", "-K", "/nonexistent", "true" }, 2,
      "cfx_run: --token-file: cannot read the cluster token file /nonexistent: ", NULL, 0 },
    { "cfx_run", { "-n", "2", "--token-file", "/dev/null", "true" }, 2, "--token-file: ",
      "the cluster token from /dev/null is empty", 0 },
    /* an empty value is refused, not taken as the default: --state-dir ''
     * ran without durable state, --secure '' ran off, --bind '' exited 1 and
     * --token-file '' said "set CFX_TOKEN" while it was set */
    { "conflux-coord", { "--state-dir", "" }, 2, "--state-dir: ''", "must not be empty", 0 },
    { "conflux-coord", { "--secure", "" }, 2, "--secure: ''", "must not be empty", 0 },
    { "conflux-coord", { "--bind", "" }, 2, "--bind: ''", "must not be empty", 0 },
    { "conflux-coord", { "--token-file", "" }, 2, "--token-file: ''", "must not be empty", 0 },
    { "cfx_run", { "-n", "2", "--token-file", "", "true" }, 2, "--token-file: ''",
      "must not be empty", 0 },
    /* a rank past -n did nothing, exit 0 */
    { "cfx_run", { "-n", "2", "--allow-fail", "0,5", "true" }, 2, "--allow-fail: rank 5",
      "(0..1 with 2 ranks)", 0 },
    { "cfx_run", { "--hosts", "a,b", "--rsh", "true", "-a", "2", "true" }, 2,
      "--allow-fail: rank 2", "(0..1 with 2 ranks)", 0 },
    /* --token '' fell back to $CFX_TOKEN (exit 0); --coord '' said "set CFX_COORD" */
    { "rdmactl", { "--token", "", "status" }, 2, "--token: ''", "must not be empty", 1 },
    { "rdmactl", { "status", "--token=" }, 2, "--token: ''", "must not be empty", 1 },
    { "rdmactl", { "--coord", "", "status" }, 2, "--coord: ''", "must not be empty", 1 },
    /* --token-file as conflux-coord and cfx_run take it (rdmactl had none) */
    { "rdmactl", { "--token-file", "", "status" }, 2, "--token-file: ''", "must not be empty",
      1 },
    { "rdmactl", { "status", "--token-file", "/nonexistent" }, 2,
      "rdmactl: --token-file: cannot read the cluster token file /nonexistent: ", NULL, 1 },
    { "rdmactl", { "--token", "t", "--token-file", "/nonexistent", "status" }, 2,
      "give --token-file or --token, not both", NULL, 1 },
    { "rdmactl", { "top", "--interval", "5" }, 2, "--interval", "'5'", 1 },
    { "rdmactl", { "tasks", "extra" }, 2, "tasks", "'extra'", 1 },
    /* an address that is none: exit 1, "cannot reach the coordinator" */
    { "rdmactl", { "--coord", "nocolon", "status" }, 2, "--coord", "'nocolon'", 0 },
    /* a second colon is a typo, not IPv6 (it said "IPv6 is not supported") */
    { "rdmactl", { "--coord", "127.0.0.1:5000:1", "status" }, 2,
      "--coord (or CFX_COORD): '127.0.0.1:5000' is not", "(a host has no colon)", 0 },
    { "rdmactl", { "--coord", "127.0.0.1:99999", "status" }, 2, "--coord",
      "'127.0.0.1:99999'", 0 },
    { "rdmactl", { "--coord", "127.0.0.1:", "status" }, 2, "--coord", "'127.0.0.1:'", 0 },
    { "rdmactl", { "--coord", "256.1.1.1:5000", "status" }, 2,
      "--coord (or CFX_COORD): '256.1.1.1' is not an IPv4 address", NULL, 0 },
    { "rdmactl", { "--coord", "no-such-host.invalid:5000", "nodes" }, 2, "--coord",
      "'no-such-host.invalid' is not an IPv4 address or a host name that has one", 0 },
    /* the perf tools: the server's -b and the client's host alike */
    { "cfx_get_bw", { "-b", "256.1.1.1" }, 2, "-b: '256.1.1.1' is not an IPv4 address", NULL,
      0 },
    { "cfx_get_lat", { "-b", "no-such-host.invalid" }, 2, "-b", "'no-such-host.invalid'", 0 },
    { "cfx_get_bw", { "256.1.1.1" }, 2, "host: '256.1.1.1' is not an IPv4 address", NULL, 0 },
    { "cfx_get_lat", { "-n", "1", "no-such-host.invalid" }, 2, "host",
      "'no-such-host.invalid'", 0 },
    /* every command refuses what it does not take, alike: status 2, one line */
    { "rdmactl", { "status", "extra" }, 2, "rdmactl status: unexpected argument", "'extra'", 1 },
    { "rdmactl", { "status", "--bogus" }, 2, "rdmactl status: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "objects", "--bogus" }, 2, "rdmactl objects: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "objects", "-x" }, 2, "rdmactl objects: unknown option", "'-x'", 1 },
    { "rdmactl", { "devices", "extra" }, 2, "rdmactl devices: unexpected argument", "'extra'",
      0 },
    { "rdmactl", { "nodes", "--bogus" }, 2, "rdmactl nodes: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "nodes", "extra" }, 2, "rdmactl nodes: unexpected argument", "'extra'", 1 },
    { "rdmactl", { "nodes", "--all=yes" }, 2, "--all takes no value", "'--all=yes'", 1 },
    { "rdmactl", { "tasks", "--bogus" }, 2, "rdmactl tasks: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "top", "--bogus" }, 2, "rdmactl top: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "top", "--count" }, 2, "rdmactl top: --count", "needs a value", 1 },
    { "rdmactl", { "top", "--once", "--json" }, 2, "rdmactl top", "--json is not supported", 1 },
    { "rdmactl", { "top", "--once", "--count", "2" }, 2, "rdmactl top: --once", "--count 2", 1 },
    { "rdmactl", { "ps", "shards", "--bogus" }, 2, "rdmactl ps: unknown option", "'--bogus'", 1 },
    { "rdmactl", { "ps", "--auto", "shards" }, 2, "ps shards", "--auto goes with add-server", 1 },
    { "rdmactl", { "status", "--", "--json" }, 2, "rdmactl status: unexpected argument",
      "'--json'", 1 },
    /* global options after the command, as before it */
    { "rdmactl", { "objects", "--json" }, 0, NULL, NULL, 1 },
    { "rdmactl", { "status", "--json", "--coord", "127.0.0.1:1" }, 1, "127.0.0.1:1", NULL, 1 },
    { "rdmactl", { "nodes", "--help" }, 0, NULL, NULL, 0 },
    /* rdmactl ps (issue 21, part C): the coordinator is up, the job is not */
    { "rdmactl", { "ps", "--timeout", "-1", "--job", "nosuchjob", "rebalance" }, 2, "--timeout",
      "'-1'", 1 },
    { "rdmactl", { "ps", "--timeout", "-5", "--job", "nosuchjob", "shards" }, 2, "--timeout",
      "'-5'", 1 },
    { "rdmactl", { "ps", "--timeout", "abc", "shards" }, 2, "--timeout", "'abc'", 1 },
    { "rdmactl", { "ps", "remove-server", "abc" }, 2, "remove-server", "'abc'", 1 },
    { "rdmactl", { "ps", "add-server", "-1" }, 2, "add-server", "'-1'", 1 },
    { "rdmactl", { "ps", "auto", "maybe" }, 2, "auto", "'maybe'", 1 },
    { "rdmactl", { "ps", "frobnicate" }, 2, "ps", "'frobnicate'", 1 },
    { "rdmactl", { "ps", "--job", "a/b", "shards" }, 2, "--job", "'a/b' is not a job name", 1 },
    { "rdmactl", { "ps", "--job", "j123456789j123456789j123456789"
                                  "j123456789j123456789j1234567890123", "shards" },
      2, "--job", "is not a job name (1..63 bytes", 1 },
    { "rdmactl", { "ps", "--job", "nosuchjob", "shards" }, 1, "nosuchjob", "no such job", 1 },
    { "rdmactl", { "ps", "--job", "nosuchjob", "rebalance" }, 1, "nosuchjob", "no such job", 1 },
    { "rdmactl", { "ps", "--job", "nosuchjob", "auto", "on" }, 1, "nosuchjob", "no such job", 1 },
    /* a command's own usage error comes first, with no coordinator named
     * (it said "no coordinator: pass --coord HOST:PORT or set CFX_COORD") */
    { "rdmactl", { "ps", "--timeout", "-1", "shards" }, 2,
      "rdmactl: --timeout: '-1' is not a timeout in ms", NULL, 0 },
    { "rdmactl", { "ps", "--job", "a/b", "shards" }, 2, "--job", "'a/b' is not a job name", 0 },
    { "rdmactl", { "ps", "auto", "maybe" }, 2, "auto", "'maybe'", 0 },
    { "rdmactl", { "top", "--interval", "5" }, 2, "--interval", "'5'", 0 },
    /* good vectors still work */
    { "cfx_reduce_bench", { "-s", "4K", "-n", "2", "-w", "0", "-d", "float", "-o", "sum" }, 0,
      NULL, NULL, 0 },
    { "cfx_run", { "-n", "2", "--timeout", "30", "true" }, 0, NULL, NULL, 0 },
    { "cfx_get_bw", { "--help" }, 0, NULL, NULL, 0 },
    { "conflux-coord", { "--help" }, 0, NULL, NULL, 0 },
    { "rdmactl", { "status" }, 0, NULL, NULL, 1 },
};

static pid_t coord_pid = -1;
static char coord_addr[128];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Start conflux-coord on a free port; its address goes to CFX_COORD. */
static void coord_start(void)
{
    int out[2];
    char path[512], line[256];
    cr_assert_eq(pipe(out), 0);
    snprintf(path, sizeof(path), "%s/conflux-coord", CFX_BIN_DIR);
    coord_pid = fork();
    cr_assert_neq(coord_pid, -1);
    if (coord_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlives the test */
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl(path, path, "--port", "0", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    cr_assert_not_null(f);
    /* it prints one line once it listens; EOF if it died */
    cr_assert_not_null(fgets(line, sizeof(line), f), "conflux-coord printed nothing");
    fclose(f);
    cr_assert_eq(sscanf(line, "conflux-coord listening on %127s", coord_addr), 1, "%s", line);
    setenv("CFX_COORD", coord_addr, 1);
}

static void coord_stop(void)
{
    if (coord_pid > 0) {
        kill(coord_pid, SIGTERM);
        waitpid(coord_pid, NULL, 0);
        coord_pid = -1;
    }
}

/*
 * Run @p c's tool; stderr into @p err.  Returns its exit status (128+signal
 * if killed), or -1 if it was still running after HANG_LIMIT_MS (then its
 * process group, which this test made, is killed).
 */
static int run_case(const struct args_case *c, char *err, size_t cap)
{
    const char *argv[ARGV_MAX + 2];
    char path[512];
    int pipefd[2], n = 0;
    size_t len = 0;

    snprintf(path, sizeof(path), "%s/%s", CFX_BIN_DIR, c->tool);
    argv[n++] = path;
    for (int i = 0; i < ARGV_MAX && c->argv[i]; i++)
        argv[n++] = c->argv[i];
    argv[n] = NULL;
    cr_assert_eq(pipe(pipefd), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a hung one is killed with its children */
        int dn = open("/dev/null", O_RDWR);
        dup2(dn, 0);
        dup2(dn, 1);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        execv(path, (char *const *)argv);
        _exit(127);
    }
    setpgid(pid, pid);
    close(pipefd[1]);
    double deadline = now_ms() + HANG_LIMIT_MS;
    int hung = 0;
    for (;;) { /* until EOF on stderr, bounded by the deadline */
        int left = (int)(deadline - now_ms());
        if (left <= 0) {
            hung = 1;
            break;
        }
        struct pollfd p = { .fd = pipefd[0], .events = POLLIN };
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue; /* the deadline check above ends it */
        ssize_t k = read(pipefd[0], err + len, cap - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        if (len == cap - 1)
            len = 0; /* keep reading (the tail is enough); never block the child */
    }
    err[len] = '\0';
    close(pipefd[0]);
    if (hung)
        kill(-pid, SIGKILL);
    int st;
    /* stderr closed: the tool (or a child holding it) is at its end */
    while (!hung && waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() > deadline) {
            hung = 1;
            kill(-pid, SIGKILL);
            break;
        }
        usleep(1000);
    }
    if (hung) {
        waitpid(pid, &st, 0);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void case_init(void)
{
    setenv("CFX_TOKEN", "tool-args-test", 1);
    unsetenv("CFX_TOKEN_FILE");
    unsetenv("CFX_PS_JOB");
}

/* The parameter is an index into cases[] (CFX_TEST_INDEX_PARAMS). */
ParameterizedTestParameters(tool_args, each)
{
    CFX_TEST_INDEX_PARAMS(cases);
}

ParameterizedTest(size_t *ip, tool_args, each, .init = case_init, .fini = coord_stop,
                  .timeout = 60)
{
    const struct args_case *c = &cases[*ip];
    static char err[1 << 16];
    char cmd[256] = "";
    for (int i = 0; i < ARGV_MAX && c->argv[i]; i++)
        snprintf(cmd + strlen(cmd), sizeof(cmd) - strlen(cmd), " %s", c->argv[i]);
    cr_log_info("%s%s", c->tool, cmd);
    if (c->coord)
        coord_start();
    int st = run_case(c, err, sizeof(err));
    cr_assert_neq(st, -1, "%s%s: still running after %d ms (a hang); stderr:\n%s", c->tool, cmd,
                  HANG_LIMIT_MS, err);
    cr_assert_eq(st, c->status, "%s%s: exit %d, want %d; stderr:\n%s", c->tool, cmd, st,
                 c->status, err);
    if (c->opt)
        cr_assert(strstr(err, c->opt), "%s%s: stderr does not name %s:\n%s", c->tool, cmd,
                  c->opt, err);
    if (c->val)
        cr_assert(strstr(err, c->val), "%s%s: stderr does not name %s:\n%s", c->tool, cmd,
                  c->val, err);
}

/* Each perf tool's --help (and rdmactl's) lists the options it takes and none it refuses;
 * cfx_get_lat's sweep is perftest's ib_*_lat -a, 2 bytes .. 8 MiB. */
Test(tool_args, get_tools_help_lists_what_they_take, .timeout = 60)
{
    static char out[1 << 14];
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/cfx_get_lat --help", CFX_BIN_DIR);
    cr_assert_eq(cfx_test_run_output(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "-a, --all            sweep sizes 2 .. 8M by powers of two, one row"),
              "%s", out);
    cr_assert(strstr(out, "--repeat") && strstr(out, "--chunk-size"), "%s", out);
    cr_assert(!strstr(out, "--user-buf") && !strstr(out, "--memcpy-ref") &&
              !strstr(out, "--report_gbits"), "cfx_get_lat --help lists what it refuses:\n%s",
              out);
    snprintf(cmd, sizeof(cmd), "%s/cfx_get_bw --help", CFX_BIN_DIR);
    cr_assert_eq(cfx_test_run_output(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "sweep sizes 4K .. 64M") && strstr(out, "--user-buf") &&
              strstr(out, "--memcpy-ref") && strstr(out, "--report_gbits"), "%s", out);
    cr_assert(!strstr(out, "--repeat"), "cfx_get_bw --help lists --repeat:\n%s", out);
    /* rdmactl's commands take the global --json, but for top */
    snprintf(cmd, sizeof(cmd), "%s/rdmactl top --help", CFX_BIN_DIR);
    cr_assert_eq(cfx_test_run_output(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "top [--once]") && !strstr(out, "[--json]"), "%s", out);
    snprintf(cmd, sizeof(cmd), "%s/rdmactl tasks --help", CFX_BIN_DIR);
    cr_assert_eq(cfx_test_run_output(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "[--json] tasks"), "%s", out);
}

/*
 * cfx_get_lat -a on both sides: one row per size, 2 bytes to 8 MiB by
 * powers of two, in order, each of -n gets, and the server serves every
 * size and exits 0.  (-a was taken and ignored: one row of -s.)  -a on one
 * side only is a mismatch both sides report, as another -s is, also when the
 * other side's -s is the sweep's first size (whose objects have the same
 * names: the server's -a passed, the client's waited for a second size).
 */
Test(tool_args, get_lat_sweeps_sizes, .init = case_init, .timeout = 180)
{
    static char out[1 << 14], srv[1 << 12];
    char cmd[2048], srv_path[128];
    snprintf(srv_path, sizeof(srv_path), "/tmp/cfx-latsweep-%d.srv", (int)getpid());
    static const char *const srv_args[] = { "-a", "-a", "", "-a", "-s 2" };
    static const char *const cli_args[] = { "-a", "", "-a", "-s 2", "-a" };
    for (int k = 0; k < 5; k++) {
        const char *srv_a = srv_args[k], *cli_a = cli_args[k];
        int port = cfx_test_free_port();
        cr_assert_gt(port, 0);
        snprintf(cmd, sizeof(cmd),
                 "CFX_TIMEOUT_MS=60000; export CFX_TIMEOUT_MS; "
                 "timeout 120 %s/cfx_get_lat -p %d -t tcp -n 2 -w 1 %s >/dev/null 2>%s & srv=$!; "
                 "timeout 120 %s/cfx_get_lat -p %d -t tcp -n 2 -w 1 %s 127.0.0.1 2>&1; st=$?; "
                 "wait $srv; echo \"server exit $?\" >>%s; exit $st",
                 CFX_BIN_DIR, port, srv_a, srv_path, CFX_BIN_DIR, port, cli_a, srv_path);
        cr_log_info("%s", cmd);
        int st = cfx_test_run_output(cmd, out, sizeof(out));
        cfx_test_take_file(srv_path, srv, sizeof(srv));
        if (k > 0) { /* -a on one side */
            cr_assert_eq(st, 1, "server %s, client %s: client exit %d:\n%s", srv_a, cli_a, st,
                         out);
            cr_assert(strstr(out, "size mismatch") && strstr(out, "the same -s (and -a)"),
                      "%s", out);
            cr_assert(strstr(srv, "server exit 1"), "%s", srv);
            continue;
        }
        cr_assert_eq(st, 0, "client exit %d:\n%s\nserver:\n%s", st, out, srv);
        cr_assert(strstr(srv, "server exit 0"), "%s", srv);
        size_t want = 2;
        int rows = 0;
        for (const char *l = strstr(out, "#bytes"); l && (l = strchr(l, '\n')); ) {
            size_t bytes;
            long iters;
            l++;
            if (sscanf(l, " %zu %ld ", &bytes, &iters) != 2)
                continue; /* the rules */
            cr_assert_eq(bytes, want, "row %d has %zu bytes, want %zu:\n%s", rows, bytes, want,
                         out);
            cr_assert_eq(iters, 2, "row of %zu bytes: %ld iterations:\n%s", bytes, iters, out);
            want *= 2;
            rows++;
        }
        cr_assert_eq(rows, 23, "%d rows, want 23 (2 bytes .. 8 MiB):\n%s", rows, out);
    }
    unlink(srv_path);
}

/*
 * A --bind that parses but cannot be bound stays a run-time error: exit 1
 * with the library's reason, not a usage error.  The address and port of
 * the suite's coordinator are in use; 192.0.2.1 (TEST-NET-1) is no address
 * of this host, unless the kernel binds any (ip_nonlocal_bind).
 */
Test(tool_args, coord_bind_of_an_address_not_free_exits_1, .init = case_init,
     .fini = coord_stop, .timeout = 60)
{
    static char err[1 << 14];
    char port[16];
    coord_start();
    const char *colon = strrchr(coord_addr, ':');
    cr_assert_not_null(colon, "%s", coord_addr);
    snprintf(port, sizeof(port), "%s", colon + 1);
    struct args_case in_use = { "conflux-coord", { "--bind", "127.0.0.1", "--port", port }, 1,
                                "cannot bind 127.0.0.1:", NULL, 0 };
    int st = run_case(&in_use, err, sizeof(err));
    cr_assert_eq(st, 1, "--bind 127.0.0.1 --port %s (in use): exit %d, want 1; stderr:\n%s",
                 port, st, err);
    cr_assert(strstr(err, in_use.opt) && strstr(err, "CFX_ERR_BUSY"), "%s", err);
    /* the metrics port so too (it said CFX_ERR_IO) */
    char mport[32];
    snprintf(mport, sizeof(mport), "127.0.0.1:%s", port);
    struct args_case m_in_use = { "conflux-coord", { "--port", "0", "--metrics", mport }, 1,
                                  "metrics endpoint cannot listen on 127.0.0.1:", NULL, 0 };
    st = run_case(&m_in_use, err, sizeof(err));
    cr_assert_eq(st, 1, "--metrics %s (in use): exit %d, want 1; stderr:\n%s", mport, st, err);
    cr_assert(strstr(err, m_in_use.opt) && strstr(err, "CFX_ERR_BUSY"), "%s", err);

    FILE *f = fopen("/proc/sys/net/ipv4/ip_nonlocal_bind", "r");
    int nonlocal = 0;
    if (f) {
        cr_assert_eq(fscanf(f, "%d", &nonlocal), 1);
        fclose(f);
    }
    if (nonlocal) {
        cr_log_warn("ip_nonlocal_bind is set: an address not of this host binds; not tried");
        return;
    }
    struct args_case not_local = { "conflux-coord", { "--bind", "192.0.2.1", "--port", "0" },
                                   1, "cannot bind 192.0.2.1:0", NULL, 0 };
    st = run_case(&not_local, err, sizeof(err));
    cr_assert_eq(st, 1, "--bind 192.0.2.1 (not local): exit %d, want 1; stderr:\n%s", st, err);
    cr_assert(strstr(err, not_local.opt), "%s", err);
}

/* conflux-coord --metrics PORT: on loopback, announced on stdout, and it
 * answers GET /metrics. */
Test(tool_args, coord_metrics_bare_port_is_loopback, .init = case_init, .timeout = 60)
{
    int out[2];
    char path[512], line[256], maddr[128];
    unsigned mport = 0;
    cr_assert_eq(pipe(out), 0);
    snprintf(path, sizeof(path), "%s/conflux-coord", CFX_BIN_DIR);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl(path, path, "--port", "0", "--metrics", "0", (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof(line), f), "conflux-coord printed nothing");
    cr_assert_not_null(fgets(line, sizeof(line), f), "no metrics line");
    fclose(f);
    cr_assert_eq(sscanf(line, "conflux-coord metrics on http://%127[^/]/metrics", maddr), 1, "%s",
                 line);
    cr_assert_eq(sscanf(maddr, "127.0.0.1:%u", &mport), 1, "not on loopback: %s", line);

    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)mport),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    static const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    cr_assert_eq(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    static char resp[1 << 16];
    size_t len = 0;
    for (;;) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        cr_assert_eq(poll(&pfd, 1, HANG_LIMIT_MS), 1, "no answer in %d ms", HANG_LIMIT_MS);
        ssize_t n = read(fd, resp + len, sizeof(resp) - 1 - len);
        cr_assert_geq(n, 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    resp[len] = '\0';
    close(fd);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    cr_expect_eq(strncmp(resp, "HTTP/1.1 200 OK\r\n", 17), 0, "%s", resp);
    cr_expect_not_null(strstr(resp, "\nconflux_coord_members{state=\"alive\"} 0\n"), "%s", resp);
}

/* stdout of `timeout 30 rdmactl ARGS` (CFX_COORD from coord_start) into @p out;
 * its exit status. */
static int rdmactl_out(const char *args, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "timeout 30 %s/rdmactl %s 2>&1", CFX_BIN_DIR, args);
    int st = cfx_test_run_output(cmd, out, cap);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    return st;
}

/*
 * rdmactl status and top count members by the state `rdmactl nodes --all`
 * shows: one that left in good order is "left", not dead (status said
 * "0 alive, 1 dead" after a clean exit), and an observer (rdmactl ps's
 * context) is no member, alive or gone.  Global options after the command
 * (status --json) are the same as before it.
 */
Test(tool_args, status_counts_left_members_apart, .init = case_init, .fini = coord_stop,
     .timeout = 120)
{
    static char out[1 << 16];
    struct cfx_context *stays, *leaves;
    coord_start();
    cr_assert_eq(cfx_test_join(coord_addr, "tool-args-test", "tcp", "stays", 10000, &stays),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_join(coord_addr, "tool-args-test", "tcp", "leaves", 10000, &leaves),
                 CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(leaves); /* leaves in good order */
    /* an observer that joins and leaves: its job does not exist (status 1) */
    cr_assert_eq(rdmactl_out("ps --job nosuchjob shards", out, sizeof(out)), 1, "%s", out);

    /* until the coordinator has seen both go (it is told, not asked) */
    int seen = 0;
    for (int i = 0; i < 200 && !seen; i++) {
        cr_assert_eq(rdmactl_out("nodes --all", out, sizeof(out)), 0, "%s", out);
        seen = strstr(out, "left ") && strstr(out, "left*");
        if (!seen)
            poll(NULL, 0, 25);
    }
    cr_assert(seen, "rdmactl nodes --all does not show the member and the observer left:\n%s",
              out);
    cr_assert_eq(rdmactl_out("status", out, sizeof(out)), 0, "%s", out);
    cr_log_info("rdmactl status:\n%s", out);
    cr_assert_not_null(strstr(out, "\nnodes          : 1 alive, 0 dead, 1 left\n"),
                       "a member that left counted as dead, or an observer as a member:\n%s",
                       out);
    cr_assert_null(strstr(out, "observers"), "an observer that left is still counted:\n%s", out);
    cr_assert_eq(rdmactl_out("status --json", out, sizeof(out)), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"nodes_alive\":1,\"nodes_dead\":0,\"nodes_left\":1,"
                                   "\"observers\":0,"),
                       "%s", out);
    cr_assert_eq(rdmactl_out("top --once", out, sizeof(out)), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\nmembers: 1 alive, 0 dead, 1 left   objects: "), "%s", out);
    /* --json after the command: JSON, not the table */
    cr_assert_eq(rdmactl_out("objects --json", out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(strcmp(out, "[]\n"), 0, "rdmactl objects --json printed:\n%s", out);
    cr_assert_eq(rdmactl_out("nodes --json", out, sizeof(out)), 0, "%s", out);
    cr_assert(out[0] == '[' && strstr(out, "\"name\":\"stays\"") &&
              !strstr(out, "\"name\":\"leaves\""), "%s", out);
    cfx_context_destroy(stays);
}

/* A CFX_SECURE that names no mode is a usage error of rdmactl (exit 2, as a
 * CFX_COORD that is no address), not a coordinator it could not reach. */
/* rdmactl --token-file reads the token from the file (its first line), as
 * conflux-coord's and cfx_run's do: with $CFX_TOKEN wrong, the file's token
 * gets the status; the wrong one alone is refused (exit 1). */
Test(tool_args, rdmactl_token_file_is_read, .init = case_init, .fini = coord_stop,
     .timeout = 60)
{
    static char err[1 << 14];
    char path[] = "/tmp/cfx-rdmactl-token-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "tool-args-test\n", 15), 15);
    close(fd);
    coord_start();
    setenv("CFX_TOKEN", "not-the-token", 1);
    struct args_case with_file = { "rdmactl", { "--token-file", path, "status" }, 0, NULL,
                                   NULL, 1 };
    int st = run_case(&with_file, err, sizeof(err));
    struct args_case without = { "rdmactl", { "status" }, 1, NULL, NULL, 1 };
    int st2 = run_case(&without, err + strlen(err), sizeof(err) - strlen(err));
    unlink(path);
    cr_assert_eq(st, 0, "rdmactl --token-file %s status: exit %d; stderr:\n%s", path, st, err);
    cr_assert_eq(st2, 1, "rdmactl status with a wrong token: exit %d; stderr:\n%s", st2, err);
}

Test(tool_args, rdmactl_bad_secure_mode_is_usage, .init = case_init, .fini = coord_stop,
     .timeout = 60)
{
    static char out[1 << 14];
    static const char *const cmds[] = { "status", "nodes", "ps --job j shards" };
    coord_start();
    setenv("CFX_SECURE", "bogus", 1);
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        cr_assert_eq(rdmactl_out(cmds[i], out, sizeof(out)), 2, "rdmactl %s:\n%s", cmds[i], out);
        cr_assert_not_null(strstr(out, "CFX_SECURE=bogus"), "rdmactl %s:\n%s", cmds[i], out);
    }
    unsetenv("CFX_SECURE");
}

/*
 * cfx_obj_perf ranks that fail after their group is made (here: one runs
 * broadcast, the other reduce) still leave in order: the coordinator lists
 * them as left, not dead, and their group's records are gone (they stayed
 * in the directory, and in its state directory, for good).
 */
/* Ranks 0 and 1 of a 2-rank job run tool @p tool with @p args0 and @p args1,
 * which make them fail: both exit 1, and the coordinator lists both as left
 * (each rank's leave is a call it answered before the rank exited). */
static void two_failing_ranks_leave(const char *tool, const char *args0, const char *args1,
                                    char *out, size_t outlen)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "export CFX_WORLD_SIZE=2 CFX_TIMEOUT_MS=10000; "
             "CFX_RANK=0 timeout 60 %s/%s %s >/dev/null 2>&1 & "
             "CFX_RANK=1 timeout 60 %s/%s %s >/dev/null 2>&1; "
             "a=$?; wait $!; echo \"exit $a $?\"", CFX_BIN_DIR, tool, args0, CFX_BIN_DIR, tool,
             args1);
    cr_assert_eq(cfx_test_run_output(cmd, out, outlen), 0, "%s", out);
    cr_assert_not_null(strstr(out, "exit 1 1"), "both ranks fail: %s", out);
    cr_assert_eq(rdmactl_out("status --json", out, outlen), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"nodes_alive\":0,\"nodes_dead\":0,\"nodes_left\":2,"),
                       "%s", out);
}

Test(tool_args, obj_perf_failing_ranks_leave, .init = case_init, .fini = coord_stop,
     .timeout = 120)
{
    static char out[1 << 16];
    coord_start();
    two_failing_ranks_leave("cfx_obj_perf", "-b 1M -e 1M -n 1", "-o reduce -b 1M -e 1M -n 1",
                            out, sizeof(out));
    cr_assert_eq(rdmactl_out("nodes --all", out, sizeof(out)), 0, "%s", out);
    cr_log_info("%s", out);
    cr_assert(!strstr(out, " alive ") && !strstr(out, " dead "), "%s", out);
    cr_assert_eq(rdmactl_out("objects --json", out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(strcmp(out, "[]\n"), 0, "the failed job's objects are still listed:\n%s", out);
}

/*
 * cfx_coll_perf ranks whose collective fails (here: the two ask for other
 * sizes, so their allreduce disagrees) leave the cluster before they exit
 * 1: the coordinator lists them as left, not dead.  They exited at once
 * and it logged each as dead ("its connection closed").
 */
Test(tool_args, coll_perf_failing_ranks_leave, .init = case_init, .fini = coord_stop,
     .timeout = 120)
{
    static char out[1 << 16];
    coord_start();
    two_failing_ranks_leave("cfx_coll_perf", "-b 1K -e 1K -w 1 -n 1", "-b 4K -e 4K -w 1 -n 1",
                            out, sizeof(out));
}

/*
 * A rank tool started with no coordinator listening gives up at its
 * context's deadline (CFX_TIMEOUT_MS), which the library spends retrying
 * already: the tools tried the whole deadline 51 times more (a default
 * deadline of 30 s held them 25 minutes), so here, 1 s, past the limit.
 */
Test(tool_args, rank_tools_give_up_at_the_deadline, .init = case_init, .timeout = 120)
{
    static const struct args_case tools[] = {
        { "cfx_coll_perf", { "-b", "1K", "-e", "1K", "-n", "1" }, 1, NULL, NULL, 0 },
        { "cfx_obj_perf", { "-b", "1K", "-e", "1K", "-n", "1" }, 1, NULL, NULL, 0 },
    };
    static char err[1 << 16];
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    char addr[64];

    /* a port nobody listens on: one the kernel gave us, closed again */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    setenv("CFX_COORD", addr, 1);
    setenv("CFX_TIMEOUT_MS", "1000", 1);
    setenv("CFX_RANK", "0", 1);
    setenv("CFX_WORLD_SIZE", "1", 1);
    for (size_t i = 0; i < sizeof(tools) / sizeof(tools[0]); i++) {
        int st = run_case(&tools[i], err, sizeof(err));
        cr_assert_neq(st, -1, "%s: still trying %s after %d ms with a deadline of 1000 ms; "
                      "stderr:\n%s", tools[i].tool, addr, HANG_LIMIT_MS, err);
        cr_assert_eq(st, 1, "%s: exit %d, want 1; stderr:\n%s", tools[i].tool, st, err);
        cr_assert(strstr(err, "cannot join the cluster") && strstr(err, addr),
                  "%s: stderr does not name the coordinator %s:\n%s", tools[i].tool, addr, err);
    }
}

/* rdmactl devices (with args, e.g. "--json"): what it says of DPDK, and its
 * exit status (0 when it lists a device of either kind, as ibv_devinfo with
 * one). */
static int devices(const char *env, const char *args, char *out, size_t cap)
{
    char path[128], cmd[768];
    snprintf(path, sizeof(path), "/tmp/cfx-devices-%d.out", (int)getpid());
    snprintf(cmd, sizeof(cmd), "env -u CFX_DPDK_EAL -u CFX_DPDK_VDEV %s timeout 60 %s/rdmactl "
             "devices %s >%s 2>/dev/null", env, CFX_BIN_DIR, args, path);
    int st = system(cmd);
    cr_assert(st != -1 && WIFEXITED(st), "%s", cmd);
    cfx_test_take_file(path, out, cap);
    return WEXITSTATUS(st);
}

Test(tool_args, devices_says_what_of_dpdk, .timeout = 120)
{
    char out[4096];
    devices("", "", out, sizeof(out));
#ifdef CFX_HAVE_DPDK
    cr_assert_not_null(strstr(out, "dpdk: no port asked for (set CFX_DPDK_VDEV"), "%s", out);
    char env[256];
    snprintf(env, sizeof(env), "CFX_DPDK_VDEV=net_memif0,role=server,socket=/tmp/cfx-dev-%d.sock",
             (int)getpid());
    int st = devices(env, "", out, sizeof(out));
    cr_assert_not_null(strstr(out, "dpdk port net_memif0: mac "), "%s", out);
    cr_assert_eq(st, 0, "a DPDK port listed, exit %d: %s", st, out);
    st = devices("CFX_DPDK_VDEV=no_such_driver0", "", out, sizeof(out));
    cr_assert_not_null(strstr(out, "dpdk: EAL did not start"), "%s", out);
#else
    cr_assert_not_null(strstr(out, "dpdk: this build has no dpdk transport (configured with "
                              "CFX_WITH_DPDK=OFF, or libdpdk-dev was not found)"), "%s", out);
#endif
}

/*
 * rdmactl devices --json says why "dpdk" is [] in a "dpdk_error" member
 * (the RDMA devices' reason is "error", in the same object), in the words
 * of the text form's "dpdk: ..." line: there was no reason at all, while
 * the text said "EAL did not start (its messages, on stderr, say why)".
 * A net_memif device with a key the driver does not know is refused
 * before EAL starts, and the reason names the key and the variable.
 */
Test(tool_args, devices_json_says_why_dpdk_has_no_port, .timeout = 120)
{
    char out[4096];
    devices("", "--json", out, sizeof(out));
#ifdef CFX_HAVE_DPDK
    char env[256], want[512];
    cr_assert_not_null(strstr(out, "\"dpdk\": [], \"dpdk_error\": \"no port asked for (set "
                                   "CFX_DPDK_VDEV, or CFX_DPDK_EAL with --vdev)\", "),
                       "%s", out);
    snprintf(env, sizeof(env), "CFX_DPDK_VDEV=net_memif0,role=server,socket=cfx-dev-%d,bogus=1",
             (int)getpid());
    devices(env, "--json", out, sizeof(out));
    snprintf(want, sizeof(want), "\"dpdk\": [], \"dpdk_error\": \"EAL did not start: "
             "CFX_DPDK_VDEV (net_memif0,role=server,socket=cfx-dev-%d,bogus=1): net_memif has "
             "no key \\\"bogus\\\": ", (int)getpid());
    cr_assert_not_null(strstr(out, want), "%s", out);
    devices(env, "", out, sizeof(out));
    snprintf(want, sizeof(want), "\ndpdk: EAL did not start: CFX_DPDK_VDEV "
             "(net_memif0,role=server,socket=cfx-dev-%d,bogus=1): net_memif has no key "
             "\"bogus\": ", (int)getpid());
    cr_assert_not_null(strstr(out, want), "%s", out);
    snprintf(env, sizeof(env), "CFX_DPDK_VDEV=net_memif0,role=server,socket=cfx-dev-%d",
             (int)getpid());
    int st = devices(env, "--json", out, sizeof(out));
    cr_assert_not_null(strstr(out, "\"dpdk\": [{\"name\": \"net_memif0\", \"mac\": \""), "%s",
                       out);
    cr_assert_null(strstr(out, "dpdk_error"), "a port listed, and a reason: %s", out);
    cr_assert_eq(st, 0, "a DPDK port listed, exit %d: %s", st, out);
#else
    cr_assert_not_null(strstr(out, "\"dpdk\": [], \"dpdk_error\": \"this build has no dpdk "
                                   "transport"),
                       "%s", out);
#endif
}

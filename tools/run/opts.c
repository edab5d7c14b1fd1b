/*
 * cfx_run's command line: usage text and the strict option parser.
 */
#include <ctype.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/object.h>

#include "../args.h"
#include "run.h"

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
            "  -t, --transport LIST  set CFX_TRANSPORT for every rank: shm, tcp, verbs, dpdk\n"
            "                        or a list in order of preference (shm,tcp); ^LIST\n"
            "                        leaves those out of the default\n"
            "  -T, --timeout SEC     kill every rank and exit 124 after SEC seconds\n"
            "  -K, --token-file F    file whose first line is the cluster token (default:\n"
            "                        a fresh random token in a private temporary file)\n"
            "  -k, --token T         cluster token on the command line, where ps shows it\n"
            "                        (a warning says so): prefer --token-file\n"
            "  -p, --coord-port P    coordinator port (default: any free)\n"
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

int cfx__run_parse_opts(int argc, char **argv, struct run_opts *o)
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
            if (tool_arg_transports("cfx_run", "--transport", optarg))
                return -1;
            o->transport = optarg;
            break;
        case 'T':
            /* 0 would kill the job at once: from a millisecond up */
            if (tool_arg_double("cfx_run", "--timeout", optarg, 0.001, 1e7, "a time in seconds",
                                &o->timeout_s))
                return -1;
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
            /* not "no token: set CFX_TOKEN", which may well be set */
            if (tool_arg_nonempty("cfx_run", "--token-file", optarg, "a file name"))
                return -1;
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
            if (tool_arg_size("cfx_run", "--chunk-size", optarg, CFX_CHUNK_SIZE_MIN,
                              CFX_CHUNK_SIZE_MAX, &sz))
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
        case 'A':
            /* named before anything starts, as every bad value (it was
             * found after the hosts' checks, exit 1) */
            if (tool_arg_host("cfx_run", "--coord-addr", optarg))
                return -1;
            o->coord_host = optarg;
            break;
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

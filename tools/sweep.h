/*
 * The size sweep and iteration options of the nccl-tests-style tools
 * (cfx_coll_perf, cfx_obj_perf), with nccl-tests' letters:
 *
 *   -b/--minbytes, -e/--maxbytes, -f/--stepfactor, -n/--iters,
 *   -w/--warmup_iters, -r/--root, -c/--check, -T/--timeout, --json ('J')
 *
 * Each tool keeps its own getopt table, defaults and usage text, and hands
 * every option getopt returns to sweep_opt() first.  Callable from any
 * thread; no state.
 */
#ifndef CFX_TOOLS_SWEEP_H
#define CFX_TOOLS_SWEEP_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "args.h"

#define SWEEP_BYTES_MAX (1ull << 46) /* the largest object there may be (cfx_put) */

struct sweep_opts {
    size_t min_bytes;    /* -b */
    size_t max_bytes;    /* -e */
    long factor;         /* -f: size multiplier of the sweep */
    long iters;          /* -n */
    long warmup;         /* -w */
    int root;            /* -r */
    int check;           /* -c */
    int timeout_ms;      /* -T: deadline of each call; 0 = the library's default */
    int json;            /* --json */
    const char *min_arg; /* -b as given; NULL: not given */
    const char *max_arg; /* -e as given; NULL: not given */
};

/*
 * Take option @p c with value @p arg (getopt's optarg) when it is a sweep
 * option: sizes from @p min_bytes to SWEEP_BYTES_MAX, iteration and warm-up
 * counts up to @p iters_max.  1 when it was one and is valid; 0 when @p c is
 * no sweep option; -1 after a bad value was named on stderr (exit with
 * TOOL_EXIT_USAGE).
 */
static inline int sweep_opt(const char *prog, int c, const char *arg, size_t min_bytes,
                            long iters_max, struct sweep_opts *s)
{
    switch (c) {
    case 'b':
        s->min_arg = arg;
        return tool_arg_size(prog, "-b", arg, min_bytes, SWEEP_BYTES_MAX, &s->min_bytes) ? -1 : 1;
    case 'e':
        s->max_arg = arg;
        return tool_arg_size(prog, "-e", arg, min_bytes, SWEEP_BYTES_MAX, &s->max_bytes) ? -1 : 1;
    case 'f':
        return tool_arg_long(prog, "-f", arg, 2, 1 << 20, "a step factor", &s->factor) ? -1 : 1;
    case 'n':
        return tool_arg_long(prog, "-n", arg, 1, iters_max, "an iteration count", &s->iters) ? -1
                                                                                             : 1;
    case 'w':
        return tool_arg_long(prog, "-w", arg, 0, iters_max, "a warm-up count", &s->warmup) ? -1 : 1;
    case 'r': return tool_arg_int(prog, "-r", arg, 0, 1 << 20, "a root rank", &s->root) ? -1 : 1;
    case 'c': return tool_arg_int(prog, "-c", arg, 0, 1, "0 or 1", &s->check) ? -1 : 1;
    case 'T':
        /* 0 would be "the default": refused, as the default is had by leaving -T out */
        return tool_arg_int(prog, "-T", arg, 1, INT_MAX, "a timeout in ms", &s->timeout_ms) ? -1
                                                                                            : 1;
    case 'J': s->json = 1; return 1;
    default: return 0;
    }
}

/*
 * After the getopt loop: no operands left (argv[optind..]) and -b no larger
 * than -e.  0, or TOOL_EXIT_USAGE after naming the problem on stderr (and,
 * for a stray operand, printing @p usage there).
 */
static inline int sweep_done(const char *prog, int argc, char **argv, int optind_,
                             const struct sweep_opts *s, void (*usage)(FILE *))
{
    if (optind_ < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind_]);
        usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    if (s->min_bytes > s->max_bytes) {
        fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", prog, s->min_bytes, s->max_bytes);
        return TOOL_EXIT_USAGE;
    }
    return 0;
}

/*
 * The largest size the sweep visits: -b, then -b times -f and so on while
 * that stays within -e (a sweep from 0 goes on at 1).
 */
static inline size_t sweep_last(const struct sweep_opts *s)
{
    size_t size = s->min_bytes;
    while (size ? size <= s->max_bytes / (size_t)s->factor : s->max_bytes >= 1)
        size = size ? size * (size_t)s->factor : 1;
    return size;
}

#endif

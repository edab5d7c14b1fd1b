/*
 * Strict parsing of command-line values, shared by every tool.
 *
 * Each parser takes the whole string (no trailing junk, no sign where none is
 * meant, no overflow), checks the range, and on failure prints one line that
 * names the program, the option and the value:
 *
 *   cfx_get_bw: -s: '100G' is more than this machine's 23.4 GiB of memory
 *   rdmactl: --timeout: '-1' is not a timeout in ms (0..2147483647)
 *
 * They return 0, or -1 after printing; the caller exits with TOOL_EXIT_USAGE,
 * as getopt tools do.  Callable from any thread; no state.
 */
#ifndef CFX_TOOLS_ARGS_H
#define CFX_TOOLS_ARGS_H

#include <stddef.h>

#define TOOL_EXIT_USAGE 2 /* exit status of every usage error */

/* An integer in [min, max]; @p what names it in the error ("an iteration count"). */
int tool_arg_long(const char *prog, const char *opt, const char *s, long min, long max,
                  const char *what, long *out);
int tool_arg_int(const char *prog, const char *opt, const char *s, int min, int max,
                 const char *what, int *out);

/* A timeout in milliseconds: 0..INT_MAX; negative ones are refused. */
int tool_arg_timeout_ms(const char *prog, const char *opt, const char *s, int *out);

/* A decimal number (seconds and the like) in [min, max]. */
int tool_arg_double(const char *prog, const char *opt, const char *s, double min, double max,
                    const char *what, double *out);

/* A value that must not be empty (a path, an address, a token): "$UNSET"
 * would otherwise fall back to a default unsaid.  @p what names what it
 * takes ("a directory"). */
int tool_arg_nonempty(const char *prog, const char *opt, const char *s, const char *what);

/*
 * A host to bind or reach, as the library takes one (cfx__parse_hostport):
 * an IPv4 address, or a host name that resolves to one (looked up now).  A
 * value made of digits and dots is an address and is never looked up, so
 * '256.1.1.1' is refused at once.  The error names the value and why:
 *   conflux-coord: --bind: '256.1.1.1' is not an IPv4 address
 *   rdmactl: --coord: 'nohost' is not an IPv4 address or a host name that
 *   has one (Name or service not known)
 * A usage error: a value that is an address but cannot be bound or reached
 * (in use, not local, nobody listening) is the caller's run-time error.
 */
int tool_arg_host(const char *prog, const char *opt, const char *s);

/* HOST:PORT (CFX_COORD's form): a port of 1..65535 after the last ':' and a
 * host that tool_arg_host() takes before it. */
int tool_arg_hostport(const char *prog, const char *opt, const char *s);

/* A byte count with an optional K/M/G suffix (KiB, MB, ...) in [min, max]. */
int tool_arg_size(const char *prog, const char *opt, const char *s, size_t min, size_t max,
                  size_t *out);

/*
 * The memory an option asks for (@p bytes, from the value @p s) fits this
 * machine: no more than its physical memory (sysconf(_SC_PHYS_PAGES)) and,
 * when @p pinned, no more than RLIMIT_MEMLOCK.  Call before allocating.
 */
int tool_arg_mem(const char *prog, const char *opt, const char *s, size_t bytes, int pinned);

/* One of the NULL-terminated @p words (case-insensitive); *out is its index.
 * A value that is none of them is named with the list of them:
 *   cfx_obj_perf: -o: 'scatter' is not one of: broadcast, reduce, ... */
int tool_arg_word(const char *prog, const char *opt, const char *s, const char *const *words,
                  int *out);

/* The error of tool_arg_word, for a caller that matched @p s itself (a
 * library's parser, aliases): names @p s and the NULL-terminated @p words.
 * Returns -1. */
int tool_arg_not_word(const char *prog, const char *opt, const char *s,
                      const char *const *words);

/*
 * A transport list as CFX_TRANSPORT takes it, the one spelling of every
 * tool's transport option (cfx_run -t, cfx_get_bw -t, cfx_get_lat -t): a
 * name, tcp, shm, verbs or dpdk (lower case, as the library reads them), a
 * comma-separated list of them in order of preference (shm,tcp), or ^LIST,
 * the default less those.  0, or -1 after naming the bad name and the
 * valid ones:
 *   cfx_get_bw: -t: 'TCP' is not a transport (tcp, shm, verbs or dpdk, ...)
 */
int tool_arg_transports(const char *prog, const char *opt, const char *s);

/* on/off, yes/no, true/false, 1/0 -> 1/0. */
int tool_arg_bool(const char *prog, const char *opt, const char *s, int *out);

/* Physical memory of this machine in bytes (0 if unknown). */
size_t tool_phys_mem(void);

#endif

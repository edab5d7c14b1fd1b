/*
 * Strict parsing of command-line values for the tools (see args.h).
 */
#include "args.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

static const char *human(unsigned long long v, char *buf, size_t len)
{
    static const char *const unit[] = { "bytes", "KiB", "MiB", "GiB", "TiB", "PiB" };
    unsigned u = 0;
    double d = (double)v;
    while (d >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu byte%s", v, v == 1 ? "" : "s");
    else if (d == floor(d))
        snprintf(buf, len, "%.0f %s", d, unit[u]);
    else
        snprintf(buf, len, "%.1f %s", d, unit[u]);
    return buf;
}

int tool_arg_long(const char *prog, const char *opt, const char *s, long min, long max,
                  const char *what, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    /* strtol skips leading blanks and takes '+': a number is digits and a '-' */
    if (!s || errno || end == s || *end || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) ||
        v < min || v > max) {
        fprintf(stderr, "%s: %s: '%s' is not %s (%ld..%ld)\n", prog, opt, s ? s : "", what, min,
                max);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_arg_int(const char *prog, const char *opt, const char *s, int min, int max,
                 const char *what, int *out)
{
    long v;
    if (tool_arg_long(prog, opt, s, min, max, what, &v))
        return -1;
    *out = (int)v;
    return 0;
}

int tool_arg_timeout_ms(const char *prog, const char *opt, const char *s, int *out)
{
    return tool_arg_int(prog, opt, s, 0, INT_MAX, "a timeout in ms", out);
}

int tool_arg_double(const char *prog, const char *opt, const char *s, double min, double max,
                    const char *what, double *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    /* digits and one '.': no blanks, hex, inf or nan */
    int ok = s && !errno && end != s && !*end && isfinite(v) && v >= min && v <= max;
    for (const char *p = s; ok && *p; p++)
        ok = (*p >= '0' && *p <= '9') || *p == '.' || (*p == '-' && p == s);
    if (!ok) {
        fprintf(stderr, "%s: %s: '%s' is not %s (%g..%g)\n", prog, opt, s ? s : "", what, min,
                max);
        return -1;
    }
    *out = v;
    return 0;
}

int tool_arg_nonempty(const char *prog, const char *opt, const char *s, const char *what)
{
    if (s && *s)
        return 0;
    fprintf(stderr, "%s: %s: '' is not %s (it must not be empty)\n", prog, opt, what);
    return -1;
}

/* NULL when @p h is a host cfx__parse_hostport() takes; else what follows
 * "is not" in the error (a static string, or written into @p buf). */
static const char *host_why(const char *h, char *buf, size_t len)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    struct in_addr a;
    struct in6_addr a6;

    if (!*h)
        return "an IPv4 address or a host name (it must not be empty)";
    if (h[0] == '[' || inet_pton(AF_INET6, h, &a6) == 1)
        return "an IPv4 address or a host name (IPv6 is not supported)";
    if (strchr(h, ':')) /* a typo ("127.0.0.1:5000:1"), not IPv6 */
        return "an IPv4 address or a host name (a host has no colon)";
    if (strlen(h) > 253) /* the longest DNS name */
        return "an IPv4 address or a host name (too long)";
    if (inet_pton(AF_INET, h, &a) == 1)
        return NULL;
    /* digits and dots are an address (no top-level domain is numeric):
     * parsed as getaddrinfo parses one (127.1 is taken), never looked up */
    if (strspn(h, "0123456789.") == strlen(h))
        hints.ai_flags = AI_NUMERICHOST;
    int rc = getaddrinfo(h, NULL, &hints, &res);
    if (rc == 0 && res) {
        freeaddrinfo(res);
        return NULL;
    }
    if (hints.ai_flags & AI_NUMERICHOST)
        return "an IPv4 address";
    snprintf(buf, len, "an IPv4 address or a host name that has one (%s)", gai_strerror(rc));
    return buf;
}

int tool_arg_host(const char *prog, const char *opt, const char *s)
{
    char buf[160];
    const char *why = host_why(s ? s : "", buf, sizeof(buf));
    if (!why)
        return 0;
    fprintf(stderr, "%s: %s: '%s' is not %s\n", prog, opt, s ? s : "", why);
    return -1;
}

int tool_arg_hostport(const char *prog, const char *opt, const char *s)
{
    const char *colon = s ? strrchr(s, ':') : NULL;
    char host[300];
    char *end = NULL;
    long port = colon && colon != s ? strtol(colon + 1, &end, 10) : 0;
    /* strtol takes blanks and signs: a port is digits only */
    if (!end || end == colon + 1 || *end || colon[1] < '0' || colon[1] > '9' || port <= 0 ||
        port > 65535) {
        fprintf(stderr, "%s: %s: '%s' is not HOST:PORT with a port of 1..65535\n", prog, opt,
                s ? s : "");
        return -1;
    }
    snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
    return tool_arg_host(prog, opt, host);
}

int tool_arg_size(const char *prog, const char *opt, const char *s, size_t min, size_t max,
                  size_t *out)
{
    char a[32], b[32];
    size_t v;
    if (cfx__parse_size(s, &v) != CFX_OK) {
        fprintf(stderr, "%s: %s: '%s' is not a size (bytes, or a number with K, M or G)\n", prog,
                opt, s ? s : "");
        return -1;
    }
    if (v < min) {
        fprintf(stderr, "%s: %s: '%s' is less than the smallest size, %s\n", prog, opt, s,
                human(min, a, sizeof(a)));
        return -1;
    }
    if (v > max) {
        fprintf(stderr, "%s: %s: '%s' is more than the %s this option may have\n", prog, opt, s,
                human(max, b, sizeof(b)));
        return -1;
    }
    *out = v;
    return 0;
}

size_t tool_phys_mem(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0)
        return 0;
    if ((unsigned long long)pages > SIZE_MAX / (unsigned long long)psz)
        return SIZE_MAX;
    return (size_t)pages * (size_t)psz;
}

int tool_arg_mem(const char *prog, const char *opt, const char *s, size_t bytes, int pinned)
{
    char a[32], b[32];
    size_t phys = tool_phys_mem();
    if (phys && bytes > phys) {
        fprintf(stderr, "%s: %s: '%s' needs %s, more than this machine's %s of memory\n", prog,
                opt, s, human(bytes, a, sizeof(a)), human(phys, b, sizeof(b)));
        return -1;
    }
    struct rlimit rl;
    if (pinned && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        bytes > rl.rlim_cur) {
        fprintf(stderr, "%s: %s: '%s' needs %s pinned, more than the locked-memory limit of %s "
                "(ulimit -l)\n", prog, opt, s, human(bytes, a, sizeof(a)),
                human((unsigned long long)rl.rlim_cur, b, sizeof(b)));
        return -1;
    }
    return 0;
}

int tool_arg_not_word(const char *prog, const char *opt, const char *s,
                      const char *const *words)
{
    fprintf(stderr, "%s: %s: '%s' is not one of:", prog, opt, s ? s : "");
    for (int i = 0; words[i]; i++)
        fprintf(stderr, "%s %s", i ? "," : "", words[i]);
    fputc('\n', stderr);
    return -1;
}

int tool_arg_word(const char *prog, const char *opt, const char *s, const char *const *words,
                  int *out)
{
    for (int i = 0; s && words[i]; i++)
        if (!strcasecmp(s, words[i])) {
            *out = i;
            return 0;
        }
    return tool_arg_not_word(prog, opt, s, words);
}

#define TRANSPORT_CHOICES                                                                      \
    "tcp, shm, verbs or dpdk; a list in order of preference, shm,tcp; ^LIST: the default "     \
    "less those"

int tool_arg_transports(const char *prog, const char *opt, const char *s)
{
    /* the names the library knows (dataplane/engine/transport.c); a build
     * without one says so when the context opens its transports */
    static const char *const names[] = { "tcp", "shm", "verbs", "dpdk", NULL };
    const char *p = s && s[0] == '^' ? s + 1 : s;
    if (!p || !*p) {
        fprintf(stderr, "%s: %s: '%s' is not a transport list (" TRANSPORT_CHOICES ")\n", prog,
                opt, s ? s : "");
        return -1;
    }
    for (;;) {
        size_t n = strcspn(p, ",");
        int known = 0, other_case = 0;
        for (int i = 0; names[i] && !known; i++) {
            known = n == strlen(names[i]) && !strncmp(p, names[i], n);
            other_case |= n == strlen(names[i]) && !strncasecmp(p, names[i], n);
        }
        if (!known) {
            if (n == strlen(s) - (size_t)(s[0] == '^'))
                fprintf(stderr, "%s: %s: '%s' is not a transport (" TRANSPORT_CHOICES ")%s\n",
                        prog, opt, s, other_case ? "; names are lower case" : "");
            else
                fprintf(stderr, "%s: %s: '%.*s' in '%s' is not a transport (" TRANSPORT_CHOICES
                        ")%s\n", prog, opt, (int)n, p, s,
                        other_case ? "; names are lower case" : "");
            return -1;
        }
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

int tool_arg_bool(const char *prog, const char *opt, const char *s, int *out)
{
    static const char *const words[] = { "off", "on", "no", "yes", "false", "true", "0", "1",
                                         NULL };
    int i = 0;
    if (tool_arg_word(prog, opt, s, words, &i))
        return -1;
    *out = i & 1;
    return 0;
}

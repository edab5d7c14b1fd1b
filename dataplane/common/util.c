/* Environment and address parsing helpers. */
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <conflux/status.h>
#include <conflux/version.h>

#include "log.h"

unsigned cfx_version(void)
{
    return CFX_VERSION_HEX;
}

int cfx__parse_size(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9') /* strtoull would take space, '+' and '-' */
        return CFX_ERR_INVALID;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return CFX_ERR_INVALID;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: return CFX_ERR_INVALID;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return CFX_ERR_INVALID;
    if (shift && v > (~0ull >> shift))
        return CFX_ERR_INVALID;
    *out = (size_t)(v << shift);
    return CFX_OK;
}

const char *cfx__env_str(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v && *v) ? v : def;
}

static const struct cfx_launcher_vars launchers[] = {
    { "CFX_RANK", "CFX_WORLD_SIZE" },
    { "RANK", "WORLD_SIZE" },
    { "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE" },
    { "SLURM_PROCID", "SLURM_NTASKS" },
    { "PMI_RANK", "PMI_SIZE" },
};

const struct cfx_launcher_vars *cfx__launcher(void)
{
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
        const struct cfx_launcher_vars *l = &launchers[i];
        /* RANK alone is too common a name to mean torchrun ahead of the
         * others: it counts there only with WORLD_SIZE, else last */
        if (cfx__env_str(l->rank, NULL) && (i != 1 || cfx__env_str(l->size, NULL)))
            return l;
    }
    return cfx__env_str("RANK", NULL) ? &launchers[1] : NULL;
}

void cfx__launcher_empty_ranks(char *out, size_t len)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]) && n < len; i++) {
        const char *v = getenv(launchers[i].rank);
        if (v && !*v)
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? ", " : "", launchers[i].rank);
    }
}

/* @p v whole as a decimal integer into @p out */
static bool parse_ll(const char *v, long long *out)
{
    errno = 0;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end != '\0')
        return false;
    *out = n;
    return true;
}

long long cfx__env_ll(const char *name, long long def)
{
    const char *v = getenv(name);
    long long n;
    if (!v || !*v)
        return def;
    if (!parse_ll(v, &n)) {
        CFX_LOG(WARN, CONFIG, "ignoring %s=%s: not an integer", name, v);
        return def;
    }
    return n;
}

int cfx__env_ll_in(const char *name, long long def, long long lo, long long hi, long long *out)
{
    const char *v = getenv(name);
    *out = def;
    if (!v || !*v)
        return CFX_OK;
    if (!parse_ll(v, out) || *out < lo || *out > hi)
        return cfx__err(CFX_ERR_INVALID, "%s=%s: want an integer in [%lld, %lld]", name, v, lo,
                        hi);
    return CFX_OK;
}

long long cfx__env_ll_clamp(const char *name, long long def, long long lo, long long hi)
{
    const char *s = getenv(name);
    char *end;
    long long v;
    errno = 0;
    if (s && *s && (v = strtoll(s, &end, 10), errno == ERANGE) && end != s && !*end) {
        /* a whole integer past what a long long holds is still beyond the
         * bounds, not "not an integer": brought to the nearest one as well */
        v = v < 0 ? LLONG_MIN : LLONG_MAX;
    } else {
        v = cfx__env_ll(name, def);
    }
    if (v >= lo && v <= hi)
        return v;
    long long to = v < lo ? lo : hi;
    CFX_LOG(WARN, CONFIG, "%s=%s is outside [%lld, %lld]: %lld is used", name, s ? s : "",
            lo, hi, to);
    return to;
}

size_t cfx__env_size_clamp(const char *name, size_t def, size_t lo, size_t hi)
{
    const char *s = getenv(name);
    size_t v;
    /* a negative size or count ("-5") is below the bounds, as one past them
     * is above: brought to the lower one, not taken for "not a size" and
     * the default used */
    if (s && s[0] == '-' && cfx__parse_size(s + 1, &v) == CFX_OK) {
        CFX_LOG(WARN, CONFIG, "%s=%s is outside [%zu, %zu]: %zu is used", name, s, lo, hi, lo);
        return lo;
    }
    v = cfx__env_size(name, def);
    if (v >= lo && v <= hi)
        return v;
    size_t to = v < lo ? lo : hi;
    CFX_LOG(WARN, CONFIG, "%s=%zu is outside [%zu, %zu]: %zu is used", name, v, lo, hi, to);
    return to;
}

size_t cfx__env_size(const char *name, size_t def)
{
    const char *v = getenv(name);
    size_t out;
    if (!v || !*v)
        return def;
    if (cfx__parse_size(v, &out) != CFX_OK) {
        CFX_LOG(WARN, CONFIG, "ignoring %s=%s: not a size (e.g. 512K, 4M)", name, v);
        return def;
    }
    return out;
}

int cfx__parse_hostport(const char *s, struct sockaddr_in *out)
{
    char host[256];
    const char *colon;
    char *end;

    if (!s || !(colon = strrchr(s, ':')) || colon == s ||
        (size_t)(colon - s) >= sizeof(host))
        return cfx__err(CFX_ERR_INVALID, "address '%s' is not host:port", s ? s : "(null)");
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    /* IPv6 only when it is one ("127.0.0.1:5000:1" is a typo, not IPv6) */
    struct in6_addr a6;
    if (host[0] == '[' || inet_pton(AF_INET6, host, &a6) == 1)
        return cfx__err(CFX_ERR_INVALID, "address '%s': IPv6 is not supported; give an IPv4 "
                        "address or a host name that has one", s);
    if (strchr(host, ':'))
        return cfx__err(CFX_ERR_INVALID, "address '%s' is not host:port (one colon, before "
                        "the port)", s);
    /* digits only, as the tools take it: no sign, no blank */
    errno = 0;
    long port = colon[1] >= '0' && colon[1] <= '9' ? strtol(colon + 1, &end, 10) : -1;
    if (port < 0 || errno || *end != '\0' || port == 0 || port > 65535)
        return cfx__err(CFX_ERR_INVALID, "address '%s' has a bad port", s);

    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &out->sin_addr) == 1)
        return CFX_OK;

    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return cfx__err(CFX_ERR_INVALID, "cannot resolve host '%s' to an IPv4 address: %s", host,
                        gai_strerror(rc));
    out->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return CFX_OK;
}

void cfx__cond_init_mono(pthread_cond_t *cond)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &a);
    pthread_condattr_destroy(&a);
}

bool cfx__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline)
{
    if (deadline == UINT64_MAX) {
        pthread_cond_wait(cond, mu);
        return true;
    }
    if (cfx__now_ns() >= deadline)
        return false;
    struct timespec ts = { .tv_sec = (time_t)(deadline / 1000000000ull),
                           .tv_nsec = (long)(deadline % 1000000000ull) };
    pthread_cond_timedwait(cond, mu, &ts);
    return true;
}

uint32_t cfx__random_u32(void)
{
    static _Atomic uint32_t calls;
    uint32_t v;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v))
        return v;
    /* early boot: distinct per call, if not unpredictable */
    return (uint32_t)(cfx__now_ns() * 2654435761u) ^ (uint32_t)getpid() ^
           (atomic_fetch_add(&calls, 1) << 16);
}

/* Forks of this process so far, as the child sees it: a keystream filled
 * before a fork is refilled after it (getpid() per key was a syscall, half
 * the cost of a key).  Process-wide by nature, like the fork itself. */
static _Atomic uint32_t fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
    atomic_fetch_add_explicit(&fork_gen, 1, memory_order_relaxed);
}

static void fork_watch(void)
{
    (void)pthread_atfork(NULL, NULL, fork_child);
}

uint32_t cfx__fork_gen(void)
{
    pthread_once(&fork_once, fork_watch);
    return atomic_load_explicit(&fork_gen, memory_order_relaxed);
}

uint64_t cfx__keystream_next(struct cfx__keystream *ks)
{
    if (unlikely(!ks->watching)) {
        pthread_once(&fork_once, fork_watch);
        ks->watching = true;
    }
    uint32_t gen = atomic_load_explicit(&fork_gen, memory_order_relaxed);
    if (unlikely(!ks->left || ks->fork_gen != gen)) {
        if (getrandom(ks->buf, sizeof(ks->buf), GRND_NONBLOCK) != (ssize_t)sizeof(ks->buf)) {
            ks->left = 0;
            return cfx__random_u64(); /* pool not ready: one at a time */
        }
        ks->left = CFX_KEYSTREAM_N;
        ks->fork_gen = gen;
    }
    uint64_t v = ks->buf[--ks->left];
    ks->buf[ks->left] = 0;
    return v ? v : 1;
}

void cfx__keystream_wipe(struct cfx__keystream *ks)
{
    explicit_bzero(ks, sizeof(*ks));
}

uint64_t cfx__random_u64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (uint64_t)cfx__random_u32() << 32 | cfx__random_u32();
    return v ? v : 1;
}

int cfx__mask_check(uint64_t mask, uint64_t known, const char *what, const char *field)
{
    uint64_t unknown = mask & ~known;
    if (likely(!unknown))
        return CFX_OK;
    return cfx__err(CFX_ERR_UNSUPPORTED, "%s: %s has bits %#" PRIx64 " this library does not "
                    "know (conflux %s)", what, field, unknown, CFX_VERSION_STRING);
}

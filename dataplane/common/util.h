/* Small shared helpers: time, deadlines, error detail, container_of. */
#ifndef CFX_COMMON_UTIL_H
#define CFX_COMMON_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifndef container_of
#define container_of(ptr, type, member)                                        \
    ((type *)((char *)(ptr) - offsetof(type, member)))
#endif

#define likely(x)   __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#define CFX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CFX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CFX_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock in nanoseconds / milliseconds. */
static inline uint64_t cfx__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t cfx__now_ms(void) { return cfx__now_ns() / 1000000ull; }

/* A busy-wait hint: the core may save power or lend its pipeline to a
 * sibling hyperthread for a few tens of cycles. */
static inline void cfx__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Deadline in ns from a timeout in ms; timeout < 0 means never (UINT64_MAX). */
static inline uint64_t cfx__deadline_ns(int timeout_ms)
{
    return timeout_ms < 0 ? UINT64_MAX
                          : cfx__now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Milliseconds left until @p deadline (0 when passed, -1 when infinite),
 * in the form poll(2) takes. */
static inline int cfx__ms_left(uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return -1;
    uint64_t now = cfx__now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999ull) / 1000000ull;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* Initialise @p cond to time its waits on CLOCK_MONOTONIC, the clock of
 * every deadline here (cfx__cond_wait_until()). */
void cfx__cond_init_mono(pthread_cond_t *cond);

/* Wait on @p cond (created with CLOCK_MONOTONIC; @p mu held) until it is
 * signalled or @p deadline (UINT64_MAX: none) passes.  Returns false,
 * without waiting, once the deadline has passed; true after a wake-up or a
 * timeout, so callers loop: while (!done && cfx__cond_wait_until(...)). */
bool cfx__cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline);

/* 32 random bits for names, keys and sequence numbers that peers should not
 * guess (getrandom, never blocking; clock bits while the pool is not ready).
 * Not for secrets: those use cfx__auth_nonce(). */
uint32_t cfx__random_u32(void);
/* 64 such bits, never 0 (grant keys: 0 means none). */
uint64_t cfx__random_u64(void);

/* Grant keys drawn from the kernel's CSPRNG in batches: one getrandom per
 * CFX_KEYSTREAM_N keys (a grant is per transfer; 45-65 ns a key against
 * 0.8-1.1 us for a getrandom per key on the shared machine).  Refilled
 * after a fork, so parent and child never hand out the same keys.  Owned
 * by one iface (its thread). */
#define CFX_KEYSTREAM_N 128
struct cfx__keystream {
    uint64_t buf[CFX_KEYSTREAM_N]; /* unused keys, consumed from the end */
    unsigned left;                 /* keys left in buf */
    uint32_t fork_gen;             /* forks seen when buf was filled */
    bool watching;                 /* the fork handler is installed */
};
/* Forks of this process so far, as the process that calls it sees them:
 * a handle that recorded another count is a forked child's copy. */
uint32_t cfx__fork_gen(void);

/* Next key: 64 random bits, never 0. */
uint64_t cfx__keystream_next(struct cfx__keystream *ks);
/* Forget the unused keys (iface close). */
void cfx__keystream_wipe(struct cfx__keystream *ks);

/* Room for one error's detail, its terminating NUL included. */
#define CFX__ERR_TEXT_MAX 512

/*
 * Record the detail of an error on the calling thread (see cfx_last_error())
 * and return @p status so call sites can write `return cfx__err(...)`.
 */
int cfx__err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clear the calling thread's error detail. */
void cfx__err_clear(void);

/* Map an errno value to a status (the one place errno is translated). */
int cfx__status_from_errno(int err);

/* A public params struct's field_mask against the bits this library knows
 * (@p known: the header's CFX_*_ALL): CFX_OK, or CFX_ERR_UNSUPPORTED naming
 * the call @p what, the @p field ("cfx_obj_params.field_mask"), the unknown
 * bits and this library's version, so that a caller built against a newer
 * header that sets a field this library lacks hears so instead of the
 * field being ignored. */
int cfx__mask_check(uint64_t mask, uint64_t known, const char *what, const char *field);

/* Parse "host:port" (IPv4 or name) into a sockaddr_in.  CFX_OK / CFX_ERR_INVALID. */
struct sockaddr_in;
int cfx__parse_hostport(const char *s, struct sockaddr_in *out);

/* Environment helpers: value of @p name parsed, or @p def when unset.
 * A set but malformed value logs a warning and yields @p def. */
long long cfx__env_ll(const char *name, long long def);
/* $name in [lo, hi] into *out (def when unset); else CFX_ERR_INVALID naming
 * it: for values that must not quietly fall back to a default */
int cfx__env_ll_in(const char *name, long long def, long long lo, long long hi, long long *out);
size_t cfx__env_size(const char *name, size_t def); /* accepts K/M/G suffixes */
/* As cfx__env_ll() / cfx__env_size(), a value outside [lo, hi] brought to
 * the nearest bound, with a warning that says which is used. */
long long cfx__env_ll_clamp(const char *name, long long def, long long lo, long long hi);
size_t cfx__env_size_clamp(const char *name, size_t def, size_t lo, size_t hi);
const char *cfx__env_str(const char *name, const char *def);

/* A launcher's rank and world-size variables. */
struct cfx_launcher_vars {
    const char *rank, *size;
};
/* The launcher that started this process: the first of cfx_run
 * (CFX_RANK/CFX_WORLD_SIZE), torchrun (RANK/WORLD_SIZE, both set: it runs
 * inside srun or mpirun, whose variables then name the outer task, one per
 * node), Open MPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID/SLURM_NTASKS)
 * and PMI (PMI_RANK/PMI_SIZE) whose rank variable is set, else RANK alone;
 * NULL when none.
 * The log's rank, the rank that hosts the coordinator and the group's rank
 * and size all come from it, so they agree. */
const struct cfx_launcher_vars *cfx__launcher(void);
/* The launchers' rank variables set to the empty string (which counts as
 * unset), comma-separated into @p out ("" when none), for an error that
 * says why no rank was found. */
void cfx__launcher_empty_ranks(char *out, size_t len);

/* Parse a size with optional K/M/G suffix.  CFX_OK / CFX_ERR_INVALID. */
int cfx__parse_size(const char *s, size_t *out);

#endif

#include "testutil.h"

#include <conflux/conflux.h>
#include <conflux/ps.h>

#include "control/coord.h"
#include "control/seal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Word i of the stream is mix(seed * golden + i): any offset can be checked. */
void cfx_test_fill(void *buf, size_t len, uint64_t seed)
{
    uint8_t *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = mix(seed * 0x9e3779b97f4a7c15ull + i / 8);
        memcpy(p + i, &w, 8);
    }
    if (i < len) {
        uint64_t w = mix(seed * 0x9e3779b97f4a7c15ull + i / 8);
        memcpy(p + i, &w, len - i);
    }
}

size_t cfx_test_check(const void *buf, size_t len, uint64_t seed)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = mix(seed * 0x9e3779b97f4a7c15ull + i / 8);
        size_t n = len - i < 8 ? len - i : 8;
        if (memcmp(p + i, &w, n)) {
            for (size_t j = 0; j < n; j++)
                if (p[i + j] != ((uint8_t *)&w)[j])
                    return i + j;
        }
    }
    return (size_t)-1;
}

void cfx_test_token(char *buf, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(buf, len, "test-token-%d-%ld", (int)getpid(), (long)ts.tv_nsec);
}

void cfx_test_take_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    unlink(path);
}

int cfx_test_stderr_to(char *tmpl, int *fd)
{
    fflush(stderr);
    *fd = mkstemp(tmpl);
    int saved = *fd >= 0 ? dup(2) : -1;
    if (saved < 0 || dup2(*fd, 2) != 2) {
        fprintf(stderr, "cannot send stderr to %s: %s\n", tmpl, strerror(errno));
        abort(); /* a test's harness reports the crash */
    }
    return saved;
}

void cfx_test_stderr_back(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

int cfx_test_file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long len;
    int found = 0;
    if (!f)
        return 0;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) == (size_t)len) {
        buf[len] = '\0';
        found = strstr(buf, needle) != NULL;
    }
    free(buf);
    fclose(f);
    return found;
}

int cfx_test_fds_leave(int room, struct rlimit *old)
{
    if (getrlimit(RLIMIT_NOFILE, old) != 0)
        return -1;
    int probe = dup(0); /* the lowest free descriptor */
    if (probe < 0)
        return -1;
    close(probe);
    struct rlimit low = { .rlim_cur = (rlim_t)probe + (rlim_t)room, .rlim_max = old->rlim_max };
    return setrlimit(RLIMIT_NOFILE, &low);
}

int cfx_test_lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    if (!f)
        return -1;
    while (getline(&line, &cap, f) > 0)
        n += strstr(line, needle) != NULL;
    free(line);
    fclose(f);
    return n;
}

bool cfx_test_await_count(pthread_mutex_t *lock, const unsigned *n, int ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pthread_mutex_lock(lock);
        unsigned v = *n;
        pthread_mutex_unlock(lock);
        if (v)
            return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
            return false;
        sched_yield();
    }
}

int cfx_test_wait_gone(struct cfx_context *ctx, const struct cfx_object_id *id, int ms)
{
    struct timespec t0, t;
    uint8_t one = 1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* a copy this node got is its own to drop (and would answer the put) */
    int rc = cfx_delete(ctx, id, NULL);
    if (rc != CFX_OK && rc != CFX_ERR_NOT_FOUND)
        return rc;
    for (;;) {
        rc = cfx_put(ctx, id, &one, 1, NULL);
        if (rc == CFX_OK)
            return cfx_delete(ctx, id, NULL);
        if (rc != CFX_ERR_EXISTS)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms)
            return CFX_ERR_TIMEOUT;
        usleep(5000); /* the directory has no "tell me when it goes" call */
    }
}

/* The first port of the kernel's ephemeral range (32768 if unreadable). */
static int ephemeral_low(void)
{
    int lo = 32768, hi = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

static int bind_port(int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons((uint16_t)port) };
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &sl) == 0;
    close(fd);
    return ok ? ntohs(sa.sin_port) : -1;
}

int cfx_test_free_port(void)
{
    enum { FIRST = 10000, TRIES = 64 };
    int lo = ephemeral_low();
    if (lo - FIRST >= 1024) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = mix(((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                         ((uint64_t)getpid() << 32));
        for (int i = 0; i < TRIES; i++) {
            x = mix(x + (uint64_t)i);
            int p = bind_port(FIRST + (int)(x % (uint64_t)(lo - FIRST)));
            if (p > 0)
                return p;
        }
    }
    return bind_port(0); /* the kernel's choice */
}

int cfx_test_coord_start(const char *metrics_addr, struct cfx_coord **coord, char *token,
                         size_t token_len, char *addr, size_t addr_len)
{
    cfx_test_token(token, token_len);
    struct cfx_coord_params p = {
        .bind_addr = "127.0.0.1",
        .port = 0,
        .token = token,
        .metrics_addr = metrics_addr,
    };
    int rc = cfx__coord_start(&p, coord);
    if (rc == CFX_OK)
        snprintf(addr, addr_len, "127.0.0.1:%u", cfx__coord_port(*coord));
    return rc;
}

int cfx_test_coord_up(struct cfx_test_coord *c)
{
    return cfx_test_coord_start(NULL, &c->coord, c->token, sizeof(c->token), c->addr,
                                sizeof(c->addr));
}

void cfx_test_coord_down(struct cfx_test_coord *c)
{
    if (c->coord)
        cfx__coord_stop(c->coord);
    c->coord = NULL;
}

int cfx_test_join(const char *addr, const char *tok, const char *tps, const char *name,
                  int timeout_ms, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      (tps ? CFX_CTX_PARAM_TRANSPORTS : 0) | (name ? CFX_CTX_PARAM_NAME : 0),
        .coord = addr,
        .token = tok,
        .timeout_ms = timeout_ms,
        .transports = tps,
        .name = name,
    };
    return cfx_context_create(&p, out);
}

int cfx_test_run_output(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int cfx_test_seal_keys(struct cfx_seal_keys *out)
{
    static const uint8_t salt[64] = { 9, 8, 7 };
    return cfx__seal_derive("0123456789abcdef0123456789abcdef", "conflux-v1 dp seal", salt,
                            sizeof(salt), "ab", 2, out);
}

struct ps_member {
    struct cfx_context *ctx;
    const char *job;
    enum cfx_ps_role role;
    size_t block_size;
    struct cfx_ps *ps;
    int rc;
    char err[512];
};

static void *ps_member_main(void *p)
{
    struct ps_member *m = p;
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_JOB | CFX_PS_PARAM_ROLE | CFX_PS_PARAM_INDEX |
                      CFX_PS_PARAM_NUM_WORKERS | CFX_PS_PARAM_NUM_SERVERS |
                      CFX_PS_PARAM_BLOCK_SIZE | CFX_PS_PARAM_TIMEOUT,
        .job = m->job,
        .role = m->role,
        .index = 0,
        .num_workers = 1,
        .num_servers = 1,
        .block_size = m->block_size,
        .timeout_ms = 20000,
    };
    m->rc = cfx_ps_create(m->ctx, &pp, &m->ps);
    if (m->rc != CFX_OK)
        snprintf(m->err, sizeof(m->err), "%s", cfx_last_error());
    return NULL;
}

/* The worker's steps of cfx_test_ps_load_job. */
static int ps_load_steps(struct cfx_ps *w, size_t block_size, unsigned a_blocks,
                         unsigned b_blocks)
{
    size_t na = a_blocks * block_size / 4, nb = b_blocks * block_size / 4;
    float *a = calloc(na, sizeof(float)), *b = calloc(nb, sizeof(float));
    int ka = -1, kb = -1, rc = CFX_ERR_NOMEM;
    if (!a || !b)
        goto out;
    for (size_t i = 0; i < na; i++)
        a[i] = 1.0f;
    if ((rc = cfx_ps_register(w, "a", CFX_DTYPE_F32, na, a, &ka)) != CFX_OK ||
        (rc = cfx_ps_register(w, "b", CFX_DTYPE_F32, nb, b, &kb)) != CFX_OK ||
        (rc = cfx_ps_push(w, ka, a)) != CFX_OK)
        goto out;
    for (size_t i = 0; i < nb; i++)
        b[i] = 2.0f;
    for (int step = 0; step < 3 && rc == CFX_OK; step++)
        rc = cfx_ps_push(w, kb, b);
    for (int i = 0; i < 2 && rc == CFX_OK; i++)
        rc = cfx_ps_pull(w, kb, b);
    if (rc == CFX_OK && b[0] != 6.0f) /* three pushes of 2 summed into zeros */
        rc = CFX_ERR_INVALID;
out:
    free(a);
    free(b);
    return rc;
}

int cfx_test_ps_load_job(struct cfx_context *sctx, struct cfx_context *wctx, const char *job,
                         size_t block_size, unsigned a_blocks, unsigned b_blocks,
                         struct cfx_ps **server, struct cfx_ps **worker, char *err,
                         size_t err_len)
{
    struct ps_member m[2] = {
        { .ctx = sctx, .job = job, .role = CFX_PS_SERVER, .block_size = block_size },
        { .ctx = wctx, .job = job, .role = CFX_PS_WORKER, .block_size = block_size },
    };
    pthread_t t[2];
    int started = 0, rc = CFX_OK;
    for (; started < 2; started++)
        if (pthread_create(&t[started], NULL, ps_member_main, &m[started]))
            break;
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2 && rc == CFX_OK; i++) {
        rc = i < started ? m[i].rc : CFX_ERR_NOMEM;
        if (rc != CFX_OK)
            snprintf(err, err_len, "ps %s: %s", i ? "worker" : "server",
                     i < started ? m[i].err : "no thread");
    }
    if (rc == CFX_OK && (rc = ps_load_steps(m[1].ps, block_size, a_blocks, b_blocks)) != CFX_OK)
        snprintf(err, err_len, "ps worker: %s", cfx_last_error());
    if (rc != CFX_OK) {
        cfx_ps_destroy(m[1].ps);
        cfx_ps_destroy(m[0].ps);
        return rc;
    }
    *server = m[0].ps;
    *worker = m[1].ps;
    return CFX_OK;
}

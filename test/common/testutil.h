/* Shared helpers for the Criterion tests. */
#ifndef CFX_TEST_UTIL_H
#define CFX_TEST_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>

/* Deterministic pattern: byte i of stream @p seed (xorshift based). */
void cfx_test_fill(void *buf, size_t len, uint64_t seed);

/* Offset of the first byte that differs from the pattern, or (size_t)-1. */
size_t cfx_test_check(const void *buf, size_t len, uint64_t seed);

/* A random cluster token for a test. */
void cfx_test_token(char *buf, size_t len);

/* Reads the file @p path (at most @p cap - 1 bytes, NUL-terminated; ""
 * when it cannot be read) into @p out and removes it: a child's output. */
void cfx_test_take_file(const char *path, char *out, size_t cap);

/* Send this process's stderr (the log) to a new file made from @p tmpl (a
 * mkstemp template, rewritten with its name) until cfx_test_stderr_back();
 * returns the descriptor to give it, and the file's in *fd. */
int cfx_test_stderr_to(char *tmpl, int *fd);
void cfx_test_stderr_back(int saved);

/* 1 when the text @p needle occurs in the file @p path (log checks). */
int cfx_test_file_contains(const char *path, const char *needle);
/* Lower RLIMIT_NOFILE so that this process may open @p room descriptors
 * more, and no more; *@p old: the limits before.  0, or -1 with errno. */
int cfx_test_fds_leave(int room, struct rlimit *old);
/* Lines of the file @p path holding @p needle (-1: the file cannot be read). */
int cfx_test_lines_with(const char *path, const char *needle);

struct cfx_context;
struct cfx_object_id;

/*
 * Wait until object @p id is gone from the directory (its putter deleted it
 * or left: an object goes with its putter) by putting it from @p ctx until
 * that succeeds, then deleting it again.  How a last rank knows the others
 * have left, so that the objects they still had to get stayed served.
 * CFX_OK; CFX_ERR_TIMEOUT after @p ms; another put error as it came.
 */
int cfx_test_wait_gone(struct cfx_context *ctx, const struct cfx_object_id *id, int ms);

/* Yield until *@p n, a count the engine keeps under @p lock (the waiters of
 * a kind: nothing signals that one more has begun to wait), is nonzero, for
 * at most @p ms; whether it became so. */
bool cfx_test_await_count(pthread_mutex_t *lock, const unsigned *n, int ms);

/* A loopback TCP port nothing is bound to now, below the kernel's range of
 * ephemeral ports where it can (so the outgoing connections of tests that
 * run beside this one do not take it before the caller binds it; another
 * caller of this function still may, rarely); -1 if no socket could be
 * bound. */
int cfx_test_free_port(void);

struct cfx_coord;

struct cfx_seal_keys;
/* Sealing keys (control/seal.h) that both ends of a test connection derive
 * alike, as a handshake would give them.  CFX_OK or the derivation's status. */
int cfx_test_seal_keys(struct cfx_seal_keys *out);

/*
 * Start an in-process coordinator on 127.0.0.1 (a port the kernel picks)
 * under a fresh token: the token into @p token, "127.0.0.1:PORT" into
 * @p addr.  @p metrics_addr: where it serves /metrics (NULL: nowhere).
 * The status of cfx__coord_start() (cfx_last_error() says why).
 */
int cfx_test_coord_start(const char *metrics_addr, struct cfx_coord **coord, char *token,
                         size_t token_len, char *addr, size_t addr_len);

/* A suite's in-process coordinator, as cfx_test_coord_start gives it. */
struct cfx_test_coord {
    struct cfx_coord *coord; /* NULL: none */
    char addr[64];           /* "127.0.0.1:PORT" */
    char token[64];
};
/* cfx_test_coord_start into @p c, serving no /metrics. */
int cfx_test_coord_up(struct cfx_test_coord *c);
/* Stop it (none: nothing to do). */
void cfx_test_coord_down(struct cfx_test_coord *c);

/* cfx_context_create() at @p addr with token @p tok, transports @p tps
 * (NULL: the default), node name @p name (NULL: none) and @p timeout_ms. */
int cfx_test_join(const char *addr, const char *tok, const char *tps, const char *name,
                  int timeout_ms, struct cfx_context **out);

/* A parameter-server job of one server (server 0, the scheduler, on @p sctx)
 * and one worker (on @p wctx), BSP, sums, @p block_size bytes per block,
 * made at once (each cfx_ps_create waits for the other).  The job of the
 * load tests (test_coord_metrics, test_rdmactl_top): the worker registers
 * tensor "a" of @p a_blocks blocks and "b" of @p b_blocks (f32), pushes a
 * once, b three times, and pulls b twice, so that the server served a's
 * blocks 1 request each and b's 5 (b's blocks follow a's).  CFX_OK, or the
 * status with the reason in @p err. */
struct cfx_ps;
int cfx_test_ps_load_job(struct cfx_context *sctx, struct cfx_context *wctx, const char *job,
                         size_t block_size, unsigned a_blocks, unsigned b_blocks,
                         struct cfx_ps **server, struct cfx_ps **worker, char *err,
                         size_t err_len);

/* Run the shell command @p cmd; its stdout, up to @p cap - 1 bytes, into
 * @p out (NUL-terminated).  Its exit status; 128 when it did not exit; -1
 * when it could not be started. */
int cfx_test_run_output(const char *cmd, char *out, size_t cap);

/*
 * For the rank programs (test/progs): CHECK_OK(expr) fails the program
 * through the program's own DIE(...) (which says which rank, round, ...)
 * when @p expr is not CFX_OK, naming the call, the status and the detail.
 * CFX_TEST_DIE is a DIE for programs that need no prefix.
 */
/* A ParameterizedTestParameters body whose parameters are the indexes of
 * @p table: a test may run in a fresh process image (ASLR), where pointers
 * copied from this one (a table of structs holding strings) would not hold. */
#define CFX_TEST_INDEX_PARAMS(table)                                           \
    static size_t idx_[sizeof(table) / sizeof((table)[0])];                    \
    for (size_t i_ = 0; i_ < sizeof(idx_) / sizeof(idx_[0]); i_++)             \
        idx_[i_] = i_;                                                         \
    return cr_make_param_array(size_t, idx_, sizeof(idx_) / sizeof(idx_[0]))

#define CHECK_OK(expr)                                                         \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != CFX_OK)                                                     \
            DIE("%s -> %s (%s)", #expr, cfx_errname(rc_), cfx_last_error());   \
    } while (0)

#define CFX_TEST_DIE(...)                                                      \
    do {                                                                       \
        fprintf(stderr, "FAIL: " __VA_ARGS__);                                 \
        fprintf(stderr, "\n");                                                 \
        exit(1);                                                               \
    } while (0)

#endif

/* Shared helpers for the Criterion tests. */
#ifndef CFX_TEST_UTIL_H
#define CFX_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Deterministic pattern: byte i of stream @p seed (xorshift based). */
void cfx_test_fill(void *buf, size_t len, uint64_t seed);

/* Offset of the first byte that differs from the pattern, or (size_t)-1. */
size_t cfx_test_check(const void *buf, size_t len, uint64_t seed);

/* A random cluster token for a test. */
void cfx_test_token(char *buf, size_t len);

/* 1 when the text @p needle occurs in the file @p path (log checks). */
int cfx_test_file_contains(const char *path, const char *needle);

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

/* A loopback TCP port nothing listens on now (bound to 0, read, closed);
 * -1 if no socket could be bound. */
int cfx_test_free_port(void);

/*
 * For the rank programs (test/progs): CHECK_OK(expr) fails the program
 * through the program's own DIE(...) (which says which rank, round, ...)
 * when @p expr is not CFX_OK, naming the call, the status and the detail.
 * CFX_TEST_DIE is a DIE for programs that need no prefix.
 */
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

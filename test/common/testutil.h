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

#endif

/*
 * Count malloc/calloc/free calls of a process (an LD_PRELOAD library for
 * measurements; not part of the build).  Prints one line to stderr at exit.
 *
 *   cc -O2 -shared -fPIC -o /tmp/alloccount.so scripts/probes/alloccount.c
 *   build/bin/cfx_run -n 2 -t shm env LD_PRELOAD=/tmp/alloccount.so \
 *       build/bin/cfx_coll_perf -o sendrecv -b 8 -e 8 -n 1000 -w 10 -c 0
 *
 * Run it with two -n values: the difference of the counts over the
 * difference of the iterations is the allocations per call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static unsigned long n_malloc, n_calloc, n_free;
extern void *__libc_malloc(size_t); extern void *__libc_calloc(size_t, size_t); extern void __libc_free(void *);
void *malloc(size_t n) { __atomic_add_fetch(&n_malloc, 1, __ATOMIC_RELAXED); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { __atomic_add_fetch(&n_calloc, 1, __ATOMIC_RELAXED); return __libc_calloc(a, b); }
void free(void *p) { if (p) __atomic_add_fetch(&n_free, 1, __ATOMIC_RELAXED); __libc_free(p); }
__attribute__((destructor)) static void report(void)
{
    char b[160];
    int k = snprintf(b, sizeof(b), "alloccount pid %d: malloc %lu calloc %lu free %lu\n", getpid(), n_malloc, n_calloc, n_free);
    if (write(2, b, k) < 0) {}
}

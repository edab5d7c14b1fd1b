/*
 * gpu/sim: the simulated device that the device-path tests run on.  These
 * tests pin down the properties those tests rely on: work on a stream runs
 * late and in order (a result read before the sync is stale), the legacy
 * stream is synchronous, reductions match the host reference byte for byte
 * and take device memory only, bad pointers, ranges and streams are refused
 * by their code, the counts say where the work went, and devices are
 * current per thread as on CUDA.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/reduce.h>
#include <conflux/status.h>

#include "gpu/memtype.h"
#include "gpu/sim.h"
#include "testutil.h"

static void install(void)
{
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK); /* idempotent */
}

TestSuite(gpu_sim, .init = install);

Test(gpu_sim, fills_the_cuda_slot)
{
    char line[128];
    void *d = NULL;
    enum cfx_memtype mt = CFX_MEMTYPE_HOST;

    cr_assert_eq(cfx__memtype_available(CFX_MEMTYPE_CUDA), 1);
    cr_assert_eq(cfx__memtype_require(CFX_MEMTYPE_CUDA, "test"), CFX_OK);
    cfx__gpu_describe(line, sizeof(line));
    cr_assert(strstr(line, "simulated"), "%s", line);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 100, &d), CFX_OK);
    cr_assert_eq(cfx__memtype_detect((char *)d + 99, &mt), CFX_OK);
    cr_assert_eq(mt, CFX_MEMTYPE_CUDA);
    cr_assert_eq(cfx__memtype_detect(line, &mt), CFX_OK);
    cr_assert_eq(mt, CFX_MEMTYPE_HOST);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d);
}

/* A copy queued on a stream has not run when the call returns; after the
 * sync it has, with every byte. */
Test(gpu_sim, streams_run_late_and_in_order)
{
    const size_t n = 1 << 20;
    char *src = malloc(n), *back = malloc(n);
    void *d = NULL, *s = NULL;
    struct cfx__gpu_sim_counts c0, c1;

    cr_assert(src && back);
    cfx_test_fill(src, n, 11);
    memset(back, 0, n);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &d), CFX_OK);
    cr_assert_eq(cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &s), CFX_OK);
    cr_assert_not_null(s);
    cr_assert_eq(cfx__gpu_sim_stream_counts(s, &c0), CFX_OK);
    /* h2d then d2h on one stream: ordered */
    cr_assert_eq(cfx__memcpy_typed_async(d, CFX_MEMTYPE_CUDA, src, CFX_MEMTYPE_HOST, n, s), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed_async(back, CFX_MEMTYPE_HOST, d, CFX_MEMTYPE_CUDA, n, s),
                 CFX_OK);
    cr_assert_eq(back[0], 0, "the copy ran before the stream could run it");
    cr_assert_eq(cfx__memtype_sync(CFX_MEMTYPE_CUDA, s), CFX_OK);
    cr_assert_eq(cfx_test_check(back, n, 11), (size_t)-1);
    cr_assert_eq(cfx__gpu_sim_stream_counts(s, &c1), CFX_OK);
    cr_assert_eq(c1.copies - c0.copies, 2);
    cr_assert_eq(c1.h2d_bytes - c0.h2d_bytes, n);
    cr_assert_eq(c1.d2h_bytes - c0.d2h_bytes, n);
    /* the legacy stream (NULL) is synchronous */
    memset(back, 0, n);
    cr_assert_eq(cfx__memcpy_typed(back, CFX_MEMTYPE_HOST, d, CFX_MEMTYPE_CUDA, n), CFX_OK);
    cr_assert_eq(cfx_test_check(back, n, 11), (size_t)-1);
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, s);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d);
    free(src);
    free(back);
}

/* Device reductions give the host reference's bytes, for every dtype and op. */
Test(gpu_sim, reduce_matches_host_reference)
{
    const size_t count = 1001;
    void *s = NULL;
    cr_assert_eq(cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &s), CFX_OK);
    for (int dt = 0; dt < CFX_DTYPE_LAST; dt++)
        for (int op = 0; op < CFX_OP_LAST; op++) {
            size_t esz = cfx_dtype_size((enum cfx_dtype)dt);
            if (!esz)
                continue;
            size_t n = count * esz;
            char *a = malloc(n), *b = malloc(n), *want = malloc(n), *got = malloc(n);
            void *da, *db;
            cr_assert(a && b && want && got);
            cfx_test_fill(a, n, (unsigned)(dt * 31 + op));
            cfx_test_fill(b, n, (unsigned)(dt * 37 + op + 1));
            int wrc = cfx_reduce3(want, a, b, count, (enum cfx_dtype)dt, (enum cfx_redop)op);
            cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &da), CFX_OK);
            cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &db), CFX_OK);
            cr_assert_eq(cfx__memcpy_typed(da, CFX_MEMTYPE_CUDA, a, CFX_MEMTYPE_HOST, n), CFX_OK);
            cr_assert_eq(cfx__memcpy_typed(db, CFX_MEMTYPE_CUDA, b, CFX_MEMTYPE_HOST, n), CFX_OK);
            int rc = cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, da, da, db, count, (enum cfx_dtype)dt,
                                          (enum cfx_redop)op, s);
            cr_assert_eq(rc, wrc, "%s %s: %s", cfx_dtype_name((enum cfx_dtype)dt),
                         cfx_redop_name((enum cfx_redop)op), cfx_last_error());
            if (rc == CFX_OK) {
                cr_assert_eq(cfx__memtype_sync(CFX_MEMTYPE_CUDA, s), CFX_OK);
                cr_assert_eq(cfx__memcpy_typed(got, CFX_MEMTYPE_HOST, da, CFX_MEMTYPE_CUDA, n),
                             CFX_OK);
                cr_assert_eq(memcmp(got, want, n), 0, "%s %s",
                             cfx_dtype_name((enum cfx_dtype)dt),
                             cfx_redop_name((enum cfx_redop)op));
            }
            cfx__memtype_free(CFX_MEMTYPE_CUDA, da);
            cfx__memtype_free(CFX_MEMTYPE_CUDA, db);
            free(a);
            free(b);
            free(want);
            free(got);
        }
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, s);
}

/* What a GPU would refuse (or fault on) is refused, by its code. */
Test(gpu_sim, refuses_what_a_device_would)
{
    char host[256];
    void *d = NULL;
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 128, &d), CFX_OK);
    /* a kernel cannot read pageable host memory */
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d, d, host, 8, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "host memory"), "%s", cfx_last_error());
    /* past the end of the allocation */
    cr_assert_eq(cfx__memcpy_typed(d, CFX_MEMTYPE_CUDA, host, CFX_MEMTYPE_HOST, 129),
                 CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "crosses the end"), "%s", cfx_last_error());
    cr_assert_eq(cfx__memcpy_typed(host, CFX_MEMTYPE_HOST, (char *)d + 64, CFX_MEMTYPE_CUDA, 65),
                 CFX_ERR_INVALID);
    /* a stream that is not one */
    cr_assert_eq(cfx__memcpy_typed_async(d, CFX_MEMTYPE_CUDA, host, CFX_MEMTYPE_HOST, 8, host),
                 CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "not a live stream"), "%s", cfx_last_error());
    cr_assert_eq(cfx__memtype_sync(CFX_MEMTYPE_CUDA, host), CFX_ERR_INVALID);
    /* unknown dtype / op, NULL */
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d, d, d, 8, CFX_DTYPE_LAST, CFX_OP_SUM,
                                      NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d, NULL, d, 8, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL), CFX_ERR_INVALID);
    /* nothing to do is fine */
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d, d, host, 0, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL), CFX_OK);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d);
}

/* Freeing device memory waits for the streams that still use it. */
Test(gpu_sim, free_waits_for_queued_work)
{
    const size_t n = 4 << 20;
    char *src = malloc(n);
    void *d = NULL, *s = NULL;
    struct cfx__gpu_sim_counts c;
    cr_assert_not_null(src);
    cfx_test_fill(src, n, 5);
    cr_assert_eq(cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &s), CFX_OK);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &d), CFX_OK);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(cfx__memcpy_typed_async(d, CFX_MEMTYPE_CUDA, src, CFX_MEMTYPE_HOST, n, s),
                     CFX_OK);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d); /* must not pull the pages from under them */
    cr_assert_eq(cfx__gpu_sim_stream_counts(s, &c), CFX_OK);
    cr_assert_eq(c.copies, 8);
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, s);
    free(src);
}

/* The CPU cannot touch device memory, so a path that passes on the
 * simulator never reads or writes device bytes on the host.  (A child
 * touches it: the fault kills it by SIGSEGV.  The child puts the default
 * action back first, since a sanitizer's handler would otherwise turn the
 * fault into an exit or an abort depending on its options.) */
Test(gpu_sim, device_memory_is_not_cpu_memory)
{
    void *d = NULL;
    int status = 0;
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 4096, &d), CFX_OK);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        *(volatile char *)d = 1;
        _exit(0);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) &&
                  (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS),
              "a host write to device memory did not fault (status %#x)", status);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d);
}

static void *current_device(void *arg)
{
    cfx__memtype_device(CFX_MEMTYPE_CUDA, arg);
    return NULL;
}

/* Devices, current per thread as cudaSetDevice keeps them: a kernel goes
 * only into a stream of the current device, on memory of that device; a
 * copy may use any stream; a new thread starts on device 0; the devices
 * worked on are told. */
Test(gpu_sim, devices_are_current_per_thread)
{
    void *d1 = NULL, *d2 = NULL, *s1 = NULL;
    int dev = -1, other = -1;
    pthread_t th;

    cr_assert_eq(cfx__memtype_device(CFX_MEMTYPE_CUDA, &dev), CFX_OK);
    cr_assert_eq(dev, 0);
    cr_assert_eq(cfx__gpu_sim_devices_used(), 0u);
    cr_assert_eq(cfx__memtype_set_device(CFX_MEMTYPE_CUDA, CFX__GPU_SIM_NDEV),
                 CFX_ERR_NO_DEVICE);
    cr_assert_eq(cfx__memtype_set_device(CFX_MEMTYPE_CUDA, 1), CFX_OK);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 4096, &d1), CFX_OK);
    cr_assert_eq(cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &s1), CFX_OK);
    cr_assert_eq(pthread_create(&th, NULL, current_device, &other), 0);
    pthread_join(th, NULL);
    cr_assert_eq(other, 0, "a new thread's current device is %d", other);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d1, d1, d1, 1024, CFX_DTYPE_F32,
                                      CFX_OP_SUM, s1), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__memtype_set_device(CFX_MEMTYPE_CUDA, 2), CFX_OK);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 4096, &d2), CFX_OK);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d2, d2, d2, 1024, CFX_DTYPE_F32,
                                      CFX_OP_SUM, s1), CFX_ERR_INVALID); /* s1 is device 1's */
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, d2, d2, d1, 1024, CFX_DTYPE_F32,
                                      CFX_OP_SUM, NULL), CFX_ERR_INVALID); /* d1 too */
    cr_assert(strstr(cfx_last_error(), "device 1"), "%s", cfx_last_error());
    cr_assert_eq(cfx__memcpy_typed_wait(d2, CFX_MEMTYPE_CUDA, d1, CFX_MEMTYPE_CUDA, 4096, s1),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__gpu_sim_devices_used(), (1u << 1) | (1u << 2));
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, s1);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d1);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, d2);
}

/*
 * gpu/cuda: the CUDA memory type, pinned staging buffers and chunked
 * staging with streams and events.
 *
 * Tests that need a GPU skip with the reason ("no CUDA device: ...") where
 * there is none; the no-driver / no-device behaviour is tested for real on
 * such hosts, and the built-without-CUDA behaviour in CPU-only builds.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/mem.h>
#include <conflux/status.h>

#include "dataplane/common/util.h"
#include "gpu/memtype.h"
#include "testutil.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

static void clear_error(void)
{
    cfx__err_clear();
}

TestSuite(cuda_memtype, .init = clear_error, .timeout = 120);

/* Skip unless a CUDA device is usable, saying why not. */
static void need_gpu(void)
{
#ifndef CFX_HAVE_CUDA
    cr_skip_test("no CUDA device: conflux was built without CUDA");
#else
    const char *why = "";
    if (cfx__cuda_probe(NULL, &why) != CFX__CUDA_READY)
        cr_skip_test("no CUDA device: %s", why);
#endif
}

/* ---- on every host ---------------------------------------------------------- */

Test(cuda_memtype, describe_is_one_consistent_line)
{
    char line[512];
    int n = cfx__gpu_describe(line, sizeof(line));

    cr_assert_gt(n, 0);
    cr_assert_null(strchr(line, '\n'), "one line: '%s'", line);
    if (cfx__memtype_available(CFX_MEMTYPE_CUDA))
        cr_assert(strncmp(line, "cuda: ", 6) == 0, "'%s'", line);
    else
        cr_assert(strncmp(line, "absent (", 8) == 0, "'%s'", line);
#ifndef CFX_HAVE_CUDA
    cr_assert_str_eq(line, "absent (built without CUDA)");
#endif
    /* truncation still terminates */
    char small[8];
    cfx__gpu_describe(small, sizeof(small));
    cr_assert_eq(strlen(small), sizeof(small) - 1);
    cr_assert_eq(cfx__gpu_describe(NULL, 0), 0);
}

/* With CUDA built in but no usable device (this CI host: no driver), the
 * library works and every CUDA request fails cleanly, naming why. */
Test(cuda_memtype, no_device_fails_cleanly)
{
#ifndef CFX_HAVE_CUDA
    cr_skip_test("built without CUDA: test_memtype covers the stub");
#else
    const char *why = "";
    if (cfx__cuda_probe(NULL, &why) == CFX__CUDA_READY)
        cr_skip_test("a CUDA device is present: this test covers hosts without one");
    cr_assert_neq(why[0], '\0');
    char line[256];
    cfx__gpu_describe(line, sizeof(line));
    cr_assert(strstr(line, why), "'%s' names '%s'", line, why);

    cr_assert_not_null(cfx__memtype_ops(CFX_MEMTYPE_CUDA));
    cr_assert_eq(cfx__memtype_available(CFX_MEMTYPE_CUDA), 0);

    void *p = (void *)1;
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 4096, &p), CFX_ERR_NO_DEVICE);
    cr_assert(strstr(cfx_last_error(), why), "detail: '%s'", cfx_last_error());
    cr_assert_eq(cfx__cuda_host_alloc(4096, &p), CFX_ERR_NO_DEVICE);

    char a[64] = "x", b[64];
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_HOST, a, CFX_MEMTYPE_CUDA, sizeof(a)),
                 CFX_ERR_NO_DEVICE);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_CUDA, b, a, a, 4, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL),
                 CFX_ERR_NO_DEVICE);

    /* host memory is still host memory */
    enum cfx_memtype t = CFX_MEMTYPE_CUDA;
    cr_assert_eq(cfx__memtype_detect(a, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);

    struct cfx__cuda_stager *st = NULL;
    cr_assert_eq(cfx__cuda_stager_create(-1, &st), CFX_ERR_NO_DEVICE);
    cr_assert_null(st);
    cfx__cuda_stager_destroy(NULL);
    int fd = -1;
    uint64_t off = 0;
    cr_assert_neq(cfx__cuda_dmabuf_fd(a, sizeof(a), &fd, &off), CFX_OK);
#endif
}

Test(cuda_memtype, host_entry_reduces)
{
    float a[5] = { 1, 2, 3, 4, 5 }, b[5] = { 10, 20, 30, 40, 50 }, d[5];

    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_HOST, d, a, b, 5, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL),
                 CFX_OK);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(d[i], a[i] + b[i]);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_HOST, d, a, b, 5, CFX_DTYPE_LAST, CFX_OP_SUM,
                                      NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__memtype_reduce3(CFX_MEMTYPE_LAST, d, a, b, 5, CFX_DTYPE_F32, CFX_OP_SUM,
                                      NULL),
                 CFX_ERR_INVALID);
}

#ifdef CFX_HAVE_CUDA
/* ---- with a GPU ------------------------------------------------------------------ */

Test(cuda_memtype, detect_device_pinned_and_host)
{
    need_gpu();
    void *dev = NULL, *pinned = NULL, *heap = malloc(4096);
    enum cfx_memtype t;
    int is_dev = -1, ord = -1;

    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 1 << 20, &dev), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__cuda_host_alloc(1 << 20, &pinned), CFX_OK, "%s", cfx_last_error());

    cr_assert_eq(cfx__memtype_detect(dev, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_CUDA);
    cr_assert_eq(cfx__memtype_detect((char *)dev + 12345, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_CUDA, "an interior pointer is device memory too");
    cr_assert_eq(cfx__cuda_ptr_is_device(dev, &is_dev, &ord), CFX_OK);
    cr_assert_eq(is_dev, 1);
    cr_assert_geq(ord, 0);
    /* pinned staging memory is host memory to the data plane */
    cr_assert_eq(cfx__memtype_detect(pinned, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);
    cr_assert_eq(cfx__memtype_detect(heap, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);

    char line[512];
    cfx__gpu_describe(line, sizeof(line));
    cr_assert(strncmp(line, "cuda: ", 6) == 0, "'%s'", line);

    cfx__memtype_free(CFX_MEMTYPE_CUDA, dev);
    cfx__cuda_host_free(pinned);
    free(heap);
}

Test(cuda_memtype, copies_both_ways_sync_and_stream)
{
    need_gpu();
    const size_t n = (8u << 20) + 13;
    char *src = malloc(n), *dst = malloc(n);
    void *dev = NULL, *pinned = NULL;
    struct cfx__cuda_stager *st = NULL;

    cfx_test_fill(src, n, 7);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &dev), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(dev, CFX_MEMTYPE_CUDA, src, CFX_MEMTYPE_HOST, n), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(dst, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, n), CFX_OK);
    cr_assert_eq(cfx_test_check(dst, n, 7), (size_t)-1);

    /* on a stream, through pinned memory */
    cr_assert_eq(cfx__cuda_host_alloc(n, &pinned), CFX_OK);
    cr_assert_eq(cfx__cuda_stager_create(-1, &st), CFX_OK, "%s", cfx_last_error());
    memset(pinned, 0, n);
    cr_assert_eq(cfx__cuda_copy(pinned, dev, n, cfx__cuda_stager_stream(st)), CFX_OK);
    cr_assert_eq(cfx__cuda_stager_wait(st), CFX_OK);
    cr_assert_eq(cfx_test_check(pinned, n, 7), (size_t)-1);
    cr_assert_eq(cfx__cuda_stager_query(st), CFX_OK);

    /* the table's streams: a kernel-free round trip on a stream of the
     * data plane's own, ordered after the default stream */
    void *ms = NULL;
    cr_assert_eq(cfx__memtype_stream_create(CFX_MEMTYPE_CUDA, &ms), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_not_null(ms);
    cfx_test_fill(pinned, n, 8);
    cr_assert_eq(cfx__memcpy_typed_async(dev, CFX_MEMTYPE_CUDA, pinned, CFX_MEMTYPE_HOST, n, NULL),
                 CFX_OK);
    cr_assert_eq(cfx__memtype_wait_default(CFX_MEMTYPE_CUDA, ms), CFX_OK, "%s", cfx_last_error());
    memset(dst, 0, n);
    cr_assert_eq(cfx__memcpy_typed_async(dst, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, n, ms),
                 CFX_OK);
    cr_assert_eq(cfx__memtype_sync(CFX_MEMTYPE_CUDA, ms), CFX_OK);
    cr_assert_eq(cfx_test_check(dst, n, 8), (size_t)-1);
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, ms);

    cfx__cuda_stager_destroy(st);
    cfx__cuda_host_free(pinned);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dev);
    free(src);
    free(dst);
}

struct seen {
    size_t next_off;    /* chunks must come in order */
    size_t calls;
    const char *expect; /* the device's bytes, as a host copy */
    char *out;          /* reassembled here */
    size_t fail_at;     /* call index that fails, or SIZE_MAX */
};

static int on_chunk(void *arg, void *host, size_t off, size_t len)
{
    struct seen *s = arg;

    cr_assert_eq(off, s->next_off, "chunk at %zu, expected %zu", off, s->next_off);
    if (s->calls++ == s->fail_at)
        return CFX_ERR_PEER_FAILED;
    cr_assert(memcmp(host, s->expect + off, len) == 0, "chunk at %zu differs", off);
    memcpy(s->out + off, host, len);
    s->next_off = off + len;
    return CFX_OK;
}

Test(cuda_memtype, stage_to_host_linear_and_ring)
{
    need_gpu();
    const size_t n = (5u << 20) + 4097, chunk = 1u << 20;
    char *src = malloc(n), *out = malloc(n);
    void *dev = NULL, *pinned = NULL;
    struct cfx__cuda_stager *st = NULL;

    cfx_test_fill(src, n, 21);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &dev), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(dev, CFX_MEMTYPE_CUDA, src, CFX_MEMTYPE_HOST, n), CFX_OK);
    cr_assert_eq(cfx__cuda_host_alloc(n, &pinned), CFX_OK);
    cr_assert_eq(cfx__cuda_stager_create(-1, &st), CFX_OK);

    /* linear: every chunk lands in place and stays */
    struct seen s = { .expect = src, .out = out, .fail_at = SIZE_MAX };
    memset(out, 0, n);
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, n, dev, n, chunk, on_chunk, &s), CFX_OK);
    cr_assert_eq(s.calls, (n + chunk - 1) / chunk);
    cr_assert_eq(s.next_off, n);
    cr_assert_eq(cfx_test_check(out, n, 21), (size_t)-1);
    cr_assert_eq(cfx_test_check(pinned, n, 21), (size_t)-1);

    /* ring of two slots: double buffering */
    s = (struct seen){ .expect = src, .out = out, .fail_at = SIZE_MAX };
    memset(out, 0, n);
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, 2 * chunk, dev, n, chunk, on_chunk, &s),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(out, n, 21), (size_t)-1);

    /* ring of three */
    s = (struct seen){ .expect = src, .out = out, .fail_at = SIZE_MAX };
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, 3 * chunk, dev, n, chunk, on_chunk, &s),
                 CFX_OK);
    cr_assert_eq(cfx_test_check(out, n, 21), (size_t)-1);

    /* a failing callback stops the staging with its status */
    s = (struct seen){ .expect = src, .out = out, .fail_at = 2 };
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, 2 * chunk, dev, n, chunk, on_chunk, &s),
                 CFX_ERR_PEER_FAILED);
    cr_assert_eq(s.calls, 3);
    cr_assert_eq(cfx__cuda_stager_query(st), CFX_OK, "nothing left in flight");

    /* a ring of one slot, or a ring without a callback, is refused */
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, chunk, dev, n, chunk, on_chunk, &s),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, 2 * chunk, dev, n, chunk, NULL, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, n, dev, n, 0, NULL, NULL), CFX_ERR_INVALID);
    /* no callback, linear: a plain copy */
    memset(pinned, 0, n);
    cr_assert_eq(cfx__cuda_stage_to_host(st, pinned, n, dev, n, chunk, NULL, NULL), CFX_OK);
    cr_assert_eq(cfx_test_check(pinned, n, 21), (size_t)-1);

    cfx__cuda_stager_destroy(st);
    cfx__cuda_host_free(pinned);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dev);
    free(src);
    free(out);
}

/* Get into device memory: chunks land in pinned memory out of order and are
 * queued to the device as they land; one wait at the end. */
Test(cuda_memtype, h2d_chunks_as_they_land)
{
    need_gpu();
    const size_t n = (6u << 20) + 100, chunk = 512u << 10;
    const size_t nch = (n + chunk - 1) / chunk;
    char *src = malloc(n), *back = malloc(n);
    void *dev = NULL, *pinned = NULL;
    struct cfx__cuda_stager *st = NULL;

    cfx_test_fill(src, n, 33);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &dev), CFX_OK);
    cr_assert_eq(cfx__cuda_host_alloc(n, &pinned), CFX_OK);
    cr_assert_eq(cfx__cuda_stager_create(-1, &st), CFX_OK);
    for (size_t k = 0; k < nch; k++) {
        size_t i = (k * 7) % nch; /* 7 is prime to nch for these sizes: a permutation */
        size_t off = i * chunk, len = CFX_MIN(chunk, n - off);
        memcpy((char *)pinned + off, src + off, len); /* the chunk "lands" */
        cr_assert_eq(cfx__cuda_stager_h2d(st, (char *)dev + off, (char *)pinned + off, len),
                     CFX_OK);
    }
    int q = cfx__cuda_stager_query(st);
    cr_assert(q == CFX_OK || q == CFX_ERR_AGAIN);
    cr_assert_eq(cfx__cuda_stager_wait(st), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(back, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, n), CFX_OK);
    cr_assert_eq(cfx_test_check(back, n, 33), (size_t)-1);

    cfx__cuda_stager_destroy(st);
    cfx__cuda_host_free(pinned);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dev);
    free(src);
    free(back);
}
#else
/* CPU-only build: the device tests exist, and say why they do not run. */
Test(cuda_memtype, device_memory_and_staging)
{
    need_gpu();
}
#endif

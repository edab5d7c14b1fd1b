/* gpu/memtype: the memory-type table, host copies, CUDA stubs. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/mem.h>
#include <conflux/status.h>

#include "dataplane/common/util.h"
#include "gpu/memtype.h"
#include "testutil.h"

static void clear_error(void)
{
    cfx__err_clear();
}

TestSuite(memtype, .init = clear_error);

Test(memtype, names)
{
    cr_assert_str_eq(cfx_memtype_name(CFX_MEMTYPE_HOST), "host");
    cr_assert_str_eq(cfx_memtype_name(CFX_MEMTYPE_CUDA), "cuda");
    cr_assert_str_eq(cfx_memtype_name(CFX_MEMTYPE_LAST), "unknown");
    cr_assert_str_eq(cfx_memtype_name((enum cfx_memtype) - 1), "unknown");
    cr_assert_str_eq(cfx_memtype_name((enum cfx_memtype)1000), "unknown");
}

Test(memtype, table_entries_match_their_slots)
{
    for (int t = 0; t < CFX_MEMTYPE_LAST; t++) {
        const struct cfx_memtype_ops *ops = cfx__memtype_ops((enum cfx_memtype)t);
        if (!ops)
            continue;
        cr_assert_eq((int)ops->type, t);
        cr_assert_str_eq(ops->name, cfx_memtype_name((enum cfx_memtype)t));
        cr_assert_not_null(ops->available);
        cr_assert_not_null(ops->copy);
    }
    cr_assert_null(cfx__memtype_ops(CFX_MEMTYPE_LAST));
    cr_assert_null(cfx__memtype_ops((enum cfx_memtype) - 1));
}

Test(memtype, host_always_available)
{
    cr_assert_not_null(cfx__memtype_ops(CFX_MEMTYPE_HOST));
    cr_assert_eq(cfx__memtype_available(CFX_MEMTYPE_HOST), 1);
    cr_assert_eq(cfx__memtype_available(CFX_MEMTYPE_LAST), 0);
    cr_assert_eq(cfx__memtype_available((enum cfx_memtype) - 3), 0);
}

static int static_buf[16];

Test(memtype, detect_host_memory)
{
    int stack_buf[4];
    void *heap = malloc(1 << 20);
    enum cfx_memtype t = CFX_MEMTYPE_LAST;

    cr_assert_not_null(heap);
    cr_assert_eq(cfx__memtype_detect(heap, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);
    t = CFX_MEMTYPE_LAST;
    cr_assert_eq(cfx__memtype_detect(stack_buf, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);
    t = CFX_MEMTYPE_LAST;
    cr_assert_eq(cfx__memtype_detect(static_buf, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_HOST);
    free(heap);
}

Test(memtype, detect_rejects_null)
{
    enum cfx_memtype t;
    int x;

    cr_assert_eq(cfx__memtype_detect(NULL, &t), CFX_ERR_INVALID);
    cr_assert_neq(cfx_last_error()[0], '\0');
    cr_assert_eq(cfx__memtype_detect(&x, NULL), CFX_ERR_INVALID);
}

Test(memtype, host_copy_sizes)
{
    static const size_t sizes[] = { 1, 7, 8, 4095, 4096, 65537, 3u << 20 };

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        uint8_t *src = malloc(n), *dst = malloc(n + 1);
        cr_assert(src && dst);
        cfx_test_fill(src, n, 42 + i);
        dst[n] = 0xa5; /* guard byte */
        cr_assert_eq(cfx__memcpy_typed(dst, CFX_MEMTYPE_HOST, src, CFX_MEMTYPE_HOST, n), CFX_OK);
        cr_assert_eq(cfx_test_check(dst, n, 42 + i), (size_t)-1, "size %zu", n);
        cr_assert_eq(dst[n], 0xa5, "copy of %zu bytes overran", n);
        free(src);
        free(dst);
    }
}

Test(memtype, copy_argument_errors)
{
    char a[8] = "abcdefg", b[8] = { 0 };

    /* Zero bytes: nothing to do, NULL is fine. */
    cr_assert_eq(cfx__memcpy_typed(NULL, CFX_MEMTYPE_HOST, NULL, CFX_MEMTYPE_HOST, 0), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(NULL, CFX_MEMTYPE_HOST, a, CFX_MEMTYPE_HOST, 8),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_HOST, NULL, CFX_MEMTYPE_HOST, 8),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_LAST, a, CFX_MEMTYPE_HOST, 8), CFX_ERR_INVALID);
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_HOST, a, (enum cfx_memtype) - 1, 8),
                 CFX_ERR_INVALID);
    cr_assert_eq(b[0], 0, "a failed copy wrote to its destination");
}

Test(memtype, host_alloc_is_page_aligned)
{
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);

    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_HOST, 12345, &p), CFX_OK);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % (uintptr_t)page, 0);
    memset(p, 0x5a, 12345);
    cfx__memtype_free(CFX_MEMTYPE_HOST, p);
    cfx__memtype_free(CFX_MEMTYPE_HOST, NULL); /* no-op */
    cfx__memtype_free(CFX_MEMTYPE_LAST, NULL);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_HOST, 1, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_LAST, 1, &p), CFX_ERR_INVALID);
}

/* Without CUDA built in, every CUDA request fails cleanly and says why. */
Test(memtype, cuda_stub_when_not_built)
{
    char a[16] = "0123456789abcde", b[16];
    void *p = NULL;

    if (cfx__memtype_ops(CFX_MEMTYPE_CUDA))
        cr_skip_test("this build has CUDA; the stub is not in use");

    cr_assert_eq(cfx__memtype_available(CFX_MEMTYPE_CUDA), 0);
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_CUDA, a, CFX_MEMTYPE_HOST, sizeof(a)),
                 CFX_ERR_UNSUPPORTED);
    cr_assert(strstr(cfx_last_error(), "built without CUDA"), "detail: '%s'", cfx_last_error());
    cfx__err_clear();
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_HOST, a, CFX_MEMTYPE_CUDA, sizeof(a)),
                 CFX_ERR_UNSUPPORTED);
    cr_assert(strstr(cfx_last_error(), "built without CUDA"), "detail: '%s'", cfx_last_error());
    cr_assert_eq(cfx__memcpy_typed(b, CFX_MEMTYPE_CUDA, a, CFX_MEMTYPE_CUDA, sizeof(a)),
                 CFX_ERR_UNSUPPORTED);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, 4096, &p), CFX_ERR_UNSUPPORTED);
    cr_assert_null(p);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, NULL);
}

/* With CUDA built in and a device present: a round trip through the device. */
Test(memtype, cuda_round_trip)
{
    const size_t n = (1u << 20) + 3;
    void *dev = NULL;

    if (!cfx__memtype_ops(CFX_MEMTYPE_CUDA))
        cr_skip_test("built without CUDA");
    if (!cfx__memtype_available(CFX_MEMTYPE_CUDA))
        cr_skip_test("no usable CUDA device");

    uint8_t *src = malloc(n), *dst = calloc(1, n);
    enum cfx_memtype t = CFX_MEMTYPE_HOST;
    cr_assert(src && dst);
    cfx_test_fill(src, n, 7);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &dev), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__memtype_detect(dev, &t), CFX_OK);
    cr_assert_eq(t, CFX_MEMTYPE_CUDA);
    cr_assert_eq(cfx__memcpy_typed(dev, CFX_MEMTYPE_CUDA, src, CFX_MEMTYPE_HOST, n), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(dst, CFX_MEMTYPE_HOST, dev, CFX_MEMTYPE_CUDA, n), CFX_OK);
    cr_assert_eq(cfx_test_check(dst, n, 7), (size_t)-1);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, dev);
    free(src);
    free(dst);
}

/* The memory-type table: host always, CUDA when built with it. */
#include "memtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

/* Names exist for every type, built in or not, so messages can name them. */
static const char *const memtype_names[CFX_MEMTYPE_LAST] = {
    [CFX_MEMTYPE_HOST] = "host",
    [CFX_MEMTYPE_CUDA] = "cuda",
};

const char *cfx_memtype_name(enum cfx_memtype type)
{
    if ((unsigned)type >= CFX_MEMTYPE_LAST || !memtype_names[type])
        return "unknown";
    return memtype_names[type];
}

/* ---- host ------------------------------------------------------------------- */

static int host_available(void)
{
    return 1;
}

static int host_copy(void *dst, const void *src, size_t len, void *stream)
{
    memcpy(dst, src, len);
    return CFX_OK;
}

static int host_alloc(size_t len, void **out)
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = NULL;

    if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, len ? len : 1) != 0)
        return cfx__err(CFX_ERR_NOMEM, "host memory: cannot allocate %zu bytes", len);
    *out = p;
    return CFX_OK;
}

static void host_free(void *ptr)
{
    free(ptr);
}

static int host_reduce(void *dst, const void *a, const void *b, size_t count,
                       enum cfx_dtype dtype, enum cfx_redop op, void *stream)
{
    return cfx_reduce3(dst, a, b, count, dtype, op);
}

static const struct cfx_memtype_ops host_ops = {
    .type = CFX_MEMTYPE_HOST,
    .name = "host",
    .available = host_available,
    .detect = NULL, /* host is what no other entry claims */
    .copy = host_copy,
    .alloc = host_alloc,
    .free_buf = host_free,
    .reduce = host_reduce,
};

/* ---- the table ---------------------------------------------------------------- */

static const struct cfx_memtype_ops *memtypes[CFX_MEMTYPE_LAST] = {
    [CFX_MEMTYPE_HOST] = &host_ops,
#ifdef CFX_HAVE_CUDA
    [CFX_MEMTYPE_CUDA] = &cfx__memtype_cuda_ops,
#endif
};

void cfx__memtype_replace(const struct cfx_memtype_ops *ops)
{
    if (ops && (unsigned)ops->type < CFX_MEMTYPE_LAST && ops->type != CFX_MEMTYPE_HOST)
        memtypes[ops->type] = ops;
}

const struct cfx_memtype_ops *cfx__memtype_ops(enum cfx_memtype type)
{
    if ((unsigned)type >= CFX_MEMTYPE_LAST)
        return NULL;
    return memtypes[type];
}

/* The entry of @p type, or an error naming why there is none. */
static int memtype_get(enum cfx_memtype type, const struct cfx_memtype_ops **out)
{
    if ((unsigned)type >= CFX_MEMTYPE_LAST)
        return cfx__err(CFX_ERR_INVALID, "memory type %d does not exist", (int)type);
    if (!memtypes[type]) {
        if (type == CFX_MEMTYPE_CUDA)
            return cfx__err(CFX_ERR_UNSUPPORTED,
                            "memory type cuda: conflux was built without CUDA");
        return cfx__err(CFX_ERR_UNSUPPORTED, "memory type %s is not built in",
                        cfx_memtype_name(type));
    }
    *out = memtypes[type];
    return CFX_OK;
}

int cfx__memtype_available(enum cfx_memtype type)
{
    const struct cfx_memtype_ops *ops = cfx__memtype_ops(type);

    return ops && ops->available && ops->available() ? 1 : 0;
}

int cfx__memtype_detect(const void *ptr, enum cfx_memtype *out)
{
    if (!ptr || !out)
        return cfx__err(CFX_ERR_INVALID, "memory type detection: NULL %s",
                        ptr ? "result" : "pointer");
    for (unsigned t = 0; t < CFX_MEMTYPE_LAST; t++) {
        const struct cfx_memtype_ops *ops = memtypes[t];
        int mine = 0;

        if (!ops || !ops->detect || !ops->available || !ops->available())
            continue;
        /* A type that cannot tell is not a reason to fail: a pointer no
         * device knows is host memory. */
        if (ops->detect(ptr, 1, &mine) == CFX_OK && mine) {
            *out = (enum cfx_memtype)t;
            return CFX_OK;
        }
    }
    *out = CFX_MEMTYPE_HOST;
    return CFX_OK;
}

/* One body for both copies: checks, then the device side's entry copies
 * (host to host is host's), on @p stream when there is one. */
static int memcpy_typed(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                        size_t len, void *stream)
{
    const struct cfx_memtype_ops *ops = NULL;
    int rc;

    if ((unsigned)dt >= CFX_MEMTYPE_LAST || (unsigned)st >= CFX_MEMTYPE_LAST)
        return cfx__err(CFX_ERR_INVALID, "copy between memory types %d and %d: no such type",
                        (int)st, (int)dt);
    if (len == 0)
        return CFX_OK;
    if (!dst || !src)
        return cfx__err(CFX_ERR_INVALID, "copy of %zu bytes from %s to %s: NULL %s", len,
                        cfx_memtype_name(st), cfx_memtype_name(dt), dst ? "source" : "destination");
    if (dt != CFX_MEMTYPE_HOST && st != CFX_MEMTYPE_HOST && dt != st)
        return cfx__err(CFX_ERR_UNSUPPORTED, "copy from %s to %s memory is not supported",
                        cfx_memtype_name(st), cfx_memtype_name(dt));
    rc = memtype_get(dt != CFX_MEMTYPE_HOST ? dt : st, &ops);
    if (rc != CFX_OK)
        return rc;
    return ops->copy(dst, src, len, stream);
}

int cfx__memcpy_typed(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                      size_t len)
{
    return memcpy_typed(dst, dt, src, st, len, NULL);
}

int cfx__memcpy_typed_async(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                            size_t len, void *stream)
{
    if (dt == CFX_MEMTYPE_HOST && st == CFX_MEMTYPE_HOST)
        stream = NULL;
    return memcpy_typed(dst, dt, src, st, len, stream);
}

/* The entry of @p type for stream work; *ops stays NULL for host, whose
 * work never queues. */
static int queue_ops(enum cfx_memtype type, const struct cfx_memtype_ops **ops)
{
    *ops = NULL;
    return type == CFX_MEMTYPE_HOST ? CFX_OK : memtype_get(type, ops);
}

int cfx__memtype_sync(enum cfx_memtype type, void *stream)
{
    const struct cfx_memtype_ops *ops;
    int rc = queue_ops(type, &ops);

    return rc != CFX_OK || !ops || !ops->sync ? rc : ops->sync(stream);
}

int cfx__memtype_require(enum cfx_memtype type, const char *what)
{
    const struct cfx_memtype_ops *ops = NULL;
    char why[160];

    if (type == CFX_MEMTYPE_HOST)
        return CFX_OK;
    if ((unsigned)type >= CFX_MEMTYPE_LAST)
        return cfx__err(CFX_ERR_INVALID, "%s: unknown memory type %d", what, (int)type);
    if (!memtypes[type]) {
        memtype_get(type, &ops); /* the reason, for the message */
        snprintf(why, sizeof(why), "%s", cfx_last_error());
        return cfx__err(CFX_ERR_UNSUPPORTED, "%s: %s", what, why);
    }
    if (cfx__memtype_available(type))
        return CFX_OK;
    if (type == CFX_MEMTYPE_CUDA)
        cfx__gpu_describe(why, sizeof(why));
    else
        snprintf(why, sizeof(why), "absent");
    return cfx__err(CFX_ERR_NO_DEVICE, "%s: %s memory: no usable device here: gpu %s", what,
                    cfx_memtype_name(type), why);
}

int cfx__memtype_alloc(enum cfx_memtype type, size_t len, void **out)
{
    const struct cfx_memtype_ops *ops = NULL;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "memory allocation: NULL result");
    rc = memtype_get(type, &ops);
    if (rc != CFX_OK)
        return rc;
    if (!ops->alloc)
        return cfx__err(CFX_ERR_UNSUPPORTED, "memory type %s cannot allocate", ops->name);
    return ops->alloc(len, out);
}

int cfx__memtype_stream_create(enum cfx_memtype type, void **out)
{
    const struct cfx_memtype_ops *ops;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "stream creation: NULL result");
    *out = NULL;
    rc = queue_ops(type, &ops);
    return rc != CFX_OK || !ops || !ops->stream_create ? rc : ops->stream_create(out);
}

int cfx__memtype_wait_default(enum cfx_memtype type, void *stream)
{
    const struct cfx_memtype_ops *ops;
    int rc = queue_ops(type, &ops);

    return rc != CFX_OK || !ops || !ops->wait_default ? rc : ops->wait_default(stream);
}

int cfx__memtype_stream_for(enum cfx_memtype type, void **slot, pthread_mutex_t *lock,
                            void **out)
{
    void *s, *made = NULL, *extra = NULL;
    int rc;

    if (lock)
        pthread_mutex_lock(lock);
    s = *slot;
    if (lock)
        pthread_mutex_unlock(lock);
    if (!s) {
        if ((rc = cfx__memtype_stream_create(type, &made)) != CFX_OK)
            return rc;
        if (lock)
            pthread_mutex_lock(lock);
        if (!*slot)
            *slot = made;
        else
            extra = made; /* another thread was first */
        s = *slot;
        if (lock)
            pthread_mutex_unlock(lock);
        cfx__memtype_stream_destroy(type, extra);
    }
    *out = s;
    return cfx__memtype_wait_default(type, s);
}

int cfx__memtype_device(enum cfx_memtype type, int *out)
{
    const struct cfx_memtype_ops *ops;
    int rc = queue_ops(type, &ops);

    *out = -1;
    return rc != CFX_OK || !ops || !ops->get_device ? rc : ops->get_device(out);
}

int cfx__memtype_set_device(enum cfx_memtype type, int dev)
{
    const struct cfx_memtype_ops *ops;
    int rc;

    if (dev < 0)
        return CFX_OK;
    rc = queue_ops(type, &ops);
    return rc != CFX_OK || !ops || !ops->set_device ? rc : ops->set_device(dev);
}

int cfx__memcpy_typed_wait(void *dst, enum cfx_memtype dt, const void *src, enum cfx_memtype st,
                           size_t len, void *stream)
{
    int rc = cfx__memcpy_typed_async(dst, dt, src, st, len, stream);
    return rc == CFX_OK ? cfx__memtype_sync(dt != CFX_MEMTYPE_HOST ? dt : st, stream) : rc;
}

void cfx__memtype_stream_destroy(enum cfx_memtype type, void *stream)
{
    const struct cfx_memtype_ops *ops = cfx__memtype_ops(type);

    if (stream && ops && ops->stream_destroy)
        ops->stream_destroy(stream);
}

void cfx__memtype_free(enum cfx_memtype type, void *ptr)
{
    const struct cfx_memtype_ops *ops = cfx__memtype_ops(type);

    if (ptr && ops && ops->free_buf)
        ops->free_buf(ptr);
}

int cfx__memtype_reduce3(enum cfx_memtype dt, void *dst, const void *a, const void *b,
                         size_t count, enum cfx_dtype dtype, enum cfx_redop op, void *stream)
{
    const struct cfx_memtype_ops *ops = NULL;
    int rc = memtype_get(dt, &ops);

    if (rc != CFX_OK)
        return rc;
    if (!ops->reduce)
        return cfx__err(CFX_ERR_UNSUPPORTED, "memory type %s cannot reduce", ops->name);
    return ops->reduce(dst, a, b, count, dtype, op, stream);
}

int cfx__gpu_describe(char *buf, size_t len)
{
    const struct cfx_memtype_ops *ops = memtypes[CFX_MEMTYPE_CUDA];

    if (ops && ops->describe)
        return ops->describe(buf, len);
    return buf && len ? snprintf(buf, len, "absent (built without CUDA)") : 0;
}

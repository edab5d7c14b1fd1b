/*
 * The simulated device (gpu/sim.h): device memory as pages this process
 * cannot touch through the addresses it hands out, streams as threads that
 * run queued copies and reductions late and in order.
 */
#include "sim.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <conflux/reduce.h>
#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "memtype.h"

#define SIM_DELAY_NS  20000 /* a queued operation starts this long after it could */
#define SIM_GARBAGE   0xa5  /* fresh device memory holds this, as cudaMalloc's holds garbage */
#define SIM_NDEV      CFX__GPU_SIM_NDEV

/* One device allocation: the address handed out (PROT_NONE here) and the
 * mapping of the same pages that the streams work on. */
struct sim_alloc {
    char *dev;
    char *back;
    size_t len;    /* as asked */
    size_t maplen; /* page multiple */
    int device;    /* the device current when it was allocated */
};

enum sim_dir { SIM_H2H, SIM_H2D, SIM_D2H, SIM_D2D };

struct sim_op {
    struct sim_op *next;
    bool reduce;          /* else a copy */
    void *dst;            /* translated: pointers the stream thread can use */
    const void *a, *b;    /* copy: a is the source */
    size_t n;             /* copy: bytes; reduce: elements */
    enum cfx_dtype dtype; /* reduce only */
    enum cfx_redop op;
    enum sim_dir dir;     /* copy only, for the counts */
};

struct sim_stream {
    struct sim_stream *next; /* sim.streams */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* work queued, work done, stop */
    struct sim_op *head, *tail;
    unsigned pending;        /* queued or running */
    bool stop;
    int device;              /* current when it was made; -1: the legacy stream, every device's */
    struct cfx__gpu_sim_counts counts;
};

static struct {
    pthread_mutex_t lock;           /* everything below */
    bool installed;
    struct sim_alloc *allocs;
    size_t nallocs, cap;
    struct sim_stream *streams;     /* live streams, the legacy one among them */
    struct sim_stream *legacy;      /* the NULL stream */
    struct cfx__gpu_sim_counts gone; /* counts of destroyed streams */
    unsigned used;                  /* devices some thread worked on (atomic) */
} sim = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* The calling thread's current device, as cudaSetDevice keeps it: a new
 * thread starts on device 0. */
static __thread int sim_cur;

/* The current device, which the caller is about to work on (as a CUDA call
 * that makes or uses the current device's context). */
static int sim_here(void)
{
    __atomic_fetch_or(&sim.used, 1u << sim_cur, __ATOMIC_RELAXED);
    return sim_cur;
}

/* ---- memory ---------------------------------------------------------------- */

/* sim.lock held: the allocation holding @p p, or NULL. */
static struct sim_alloc *alloc_find(const void *p)
{
    for (size_t i = 0; i < sim.nallocs; i++) {
        struct sim_alloc *a = &sim.allocs[i];
        if ((const char *)p >= a->dev && (const char *)p < a->dev + a->maplen)
            return a;
    }
    return NULL;
}

/*
 * Where the stream thread reaches [p, p + len): the second mapping for
 * device memory, @p p itself for host memory.  Refuses a device range that
 * runs past its allocation.
 */
static int translate(const void *p, size_t len, const char *which, const void **out, bool *is_dev,
                     int *device)
{
    pthread_mutex_lock(&sim.lock);
    struct sim_alloc *a = alloc_find(p);
    size_t off = a ? (size_t)((const char *)p - a->dev) : 0;
    bool fits = a && off <= a->len && len <= a->len - off;
    const void *q = a ? a->back + off : p;
    size_t alen = a ? a->len : 0;
    int dev = a ? a->device : -1;
    pthread_mutex_unlock(&sim.lock);
    if (a && !fits)
        return cfx__err(CFX_ERR_INVALID, "simulated device: %s [%p, +%zu) crosses the end of "
                        "its allocation (%zu bytes at offset %zu)", which, p, len, alen, off);
    *out = q;
    *is_dev = a != NULL;
    if (device)
        *device = dev;
    return CFX_OK;
}

static int sim_alloc(size_t len, void **out)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t maplen = ((len ? len : 1) + page - 1) & ~(page - 1);
    char *back = MAP_FAILED, *dev = MAP_FAILED;
    int fd = memfd_create("cfx-simdev", MFD_CLOEXEC);

    if (fd < 0 || ftruncate(fd, (off_t)maplen) != 0)
        goto err_close;
    back = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    dev = mmap(NULL, maplen, PROT_NONE, MAP_SHARED, fd, 0);
    if (back == MAP_FAILED || dev == MAP_FAILED)
        goto err_unmap;
    close(fd);
    memset(back, SIM_GARBAGE, maplen);

    pthread_mutex_lock(&sim.lock);
    if (sim.nallocs == sim.cap) {
        size_t cap = sim.cap ? 2 * sim.cap : 64;
        struct sim_alloc *na = realloc(sim.allocs, cap * sizeof(*na));
        if (!na) {
            pthread_mutex_unlock(&sim.lock);
            munmap(back, maplen);
            munmap(dev, maplen);
            return cfx__err(CFX_ERR_NOMEM, "simulated device: out of memory");
        }
        sim.allocs = na;
        sim.cap = cap;
    }
    sim.allocs[sim.nallocs++] = (struct sim_alloc){ dev, back, len ? len : 1, maplen, sim_here() };
    pthread_mutex_unlock(&sim.lock);
    *out = dev;
    return CFX_OK;

err_unmap:
    if (back != MAP_FAILED)
        munmap(back, maplen);
    if (dev != MAP_FAILED)
        munmap(dev, maplen);
err_close:
    if (fd >= 0)
        close(fd);
    return cfx__err(CFX_ERR_NOMEM, "simulated device: cannot allocate %zu bytes", len);
}

static void stream_drain(struct sim_stream *s)
{
    pthread_mutex_lock(&s->lock);
    while (s->pending)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void sim_free(void *ptr)
{
    /* as cudaFree: every stream's queued work first */
    pthread_mutex_lock(&sim.lock);
    for (struct sim_stream *s = sim.streams; s; s = s->next)
        stream_drain(s);
    struct sim_alloc *a = alloc_find(ptr);
    if (!a || a->dev != (char *)ptr) {
        pthread_mutex_unlock(&sim.lock);
        CFX_LOG(WARN, GPU, "simulated device: free of %p, which it did not allocate", ptr);
        return;
    }
    munmap(a->dev, a->maplen);
    munmap(a->back, a->maplen);
    *a = sim.allocs[--sim.nallocs];
    pthread_mutex_unlock(&sim.lock);
}

static int sim_detect(const void *ptr, size_t len, int *is_mine)
{
    pthread_mutex_lock(&sim.lock);
    *is_mine = alloc_find(ptr) != NULL;
    pthread_mutex_unlock(&sim.lock);
    return CFX_OK;
}

/* ---- streams ----------------------------------------------------------------- */

static void op_run(const struct sim_op *op)
{
    const struct timespec delay = { 0, SIM_DELAY_NS };
    nanosleep(&delay, NULL);
    if (op->reduce)
        cfx_reduce3(op->dst, op->a, op->b, op->n, op->dtype, op->op); /* checked when queued */
    else
        memmove(op->dst, op->a, op->n);
}

static void op_count(struct cfx__gpu_sim_counts *c, const struct sim_op *op)
{
    if (op->reduce) {
        c->reduces++;
        return;
    }
    c->copies++;
    if (op->dir == SIM_H2D)
        c->h2d_bytes += op->n;
    else if (op->dir == SIM_D2H)
        c->d2h_bytes += op->n;
    else if (op->dir == SIM_D2D)
        c->d2d_bytes += op->n;
}

static void *stream_main(void *arg)
{
    struct sim_stream *s = arg;

    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        struct sim_op *op = s->head;
        if (!op)
            break; /* stopped and drained */
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        op_run(op);
        pthread_mutex_lock(&s->lock);
        op_count(&s->counts, op);
        s->pending--;
        free(op);
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static int stream_start(struct sim_stream **out)
{
    struct sim_stream *s = calloc(1, sizeof(*s));

    if (!s)
        return cfx__err(CFX_ERR_NOMEM, "simulated device: out of memory for a stream");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return cfx__err(CFX_ERR_IO, "simulated device: cannot start a stream thread");
    }
    *out = s;
    return CFX_OK;
}

/* The live stream @p stream names (NULL: the legacy one), or an error. */
static int stream_get(void *stream, const char *what, struct sim_stream **out)
{
    pthread_mutex_lock(&sim.lock);
    struct sim_stream *s = stream ? sim.streams : sim.legacy;
    while (stream && s && s != stream)
        s = s->next;
    pthread_mutex_unlock(&sim.lock);
    if (!s)
        return cfx__err(CFX_ERR_INVALID, "simulated device: %s on %p, which is not a live "
                        "stream of the simulated device", what, stream);
    *out = s;
    return CFX_OK;
}

/* Queue @p tmpl on @p stream; NULL stream: the legacy one, and wait. */
static int enqueue(void *stream, const struct sim_op *tmpl, const char *what)
{
    struct sim_stream *s = NULL;
    int rc = stream_get(stream, what, &s);
    if (rc != CFX_OK)
        return rc;
    if (!stream)
        sim_here();
    struct sim_op *op = malloc(sizeof(*op));
    if (!op)
        return cfx__err(CFX_ERR_NOMEM, "simulated device: out of memory queueing a %s", what);
    *op = *tmpl;
    op->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->pending++;
    pthread_cond_broadcast(&s->cond);
    while (!stream && s->pending)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return CFX_OK;
}

static int sim_copy(void *dst, const void *src, size_t len, void *stream)
{
    struct sim_op op = { .n = len };
    const void *d, *sp;
    bool ddev, sdev;
    int rc;

    if (!len)
        return CFX_OK;
    if (!dst || !src)
        return cfx__err(CFX_ERR_INVALID, "simulated device: copy with a NULL %s",
                        dst ? "source" : "destination");
    if ((rc = translate(dst, len, "copy destination", &d, &ddev, NULL)) != CFX_OK ||
        (rc = translate(src, len, "copy source", &sp, &sdev, NULL)) != CFX_OK)
        return rc;
    op.dst = (void *)d;
    op.a = sp;
    op.dir = ddev ? (sdev ? SIM_D2D : SIM_H2D) : (sdev ? SIM_D2H : SIM_H2H);
    return enqueue(stream, &op, "copy");
}

static int sim_reduce(void *dst, const void *a, const void *b, size_t count,
                      enum cfx_dtype dtype, enum cfx_redop op, void *stream)
{
    const size_t esz = cfx_dtype_size(dtype);
    const void *const in[3] = { dst, a, b };
    static const char *const names[3] = { "dst", "a", "b" };
    const void *out[3];
    struct sim_stream *s = NULL;
    int rc, dev;

    if (!esz || (unsigned)op >= CFX_OP_LAST)
        return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: unknown dtype %d or op %d",
                        (int)dtype, (int)op);
    if (!count)
        return CFX_OK;
    if (count > SIZE_MAX / esz)
        return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: count %zu overflows", count);
    /* a kernel runs on the current device, launched only into its streams */
    if ((rc = stream_get(stream, "reduce", &s)) != CFX_OK)
        return rc;
    if (s->device >= 0 && s->device != sim_cur)
        return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: kernel launch into a stream "
                        "of device %d from a thread whose current device is %d", s->device,
                        sim_cur);
    for (int i = 0; i < 3; i++) {
        bool is_dev;
        if (!in[i])
            return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: NULL %s", names[i]);
        if ((rc = translate(in[i], count * esz, names[i], &out[i], &is_dev, &dev)) != CFX_OK)
            return rc;
        if (!is_dev)
            return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: %s %p is host memory "
                            "the device cannot reach", names[i], in[i]);
        if (dev != sim_cur)
            return cfx__err(CFX_ERR_INVALID, "simulated device: reduce: %s %p is memory of "
                            "device %d, the kernel runs on device %d", names[i], in[i], dev,
                            sim_cur);
    }
    sim_here();
    struct sim_op o = {
        .reduce = true, .dst = (void *)out[0], .a = out[1], .b = out[2], .n = count,
        .dtype = dtype, .op = op,
    };
    return enqueue(stream, &o, "reduce");
}

static int sim_sync(void *stream)
{
    struct sim_stream *s = NULL;
    if (!stream)
        sim_here();
    int rc = stream_get(stream, "synchronize", &s);
    if (rc == CFX_OK)
        stream_drain(s);
    return rc;
}

/* The simulated legacy stream orders nothing else, so waiting for it is
 * waiting for what was queued there. */
static int sim_wait_default(void *stream)
{
    struct sim_stream *s = NULL;
    int rc = stream_get(stream, "wait for the default stream", &s);
    return rc == CFX_OK ? sim_sync(NULL) : rc; /* the current device's legacy stream */
}

static int sim_stream_create(void **out)
{
    struct sim_stream *s = NULL;
    int rc = stream_start(&s);
    if (rc != CFX_OK)
        return rc;
    s->device = sim_here();
    pthread_mutex_lock(&sim.lock);
    s->next = sim.streams;
    sim.streams = s;
    pthread_mutex_unlock(&sim.lock);
    *out = s;
    return CFX_OK;
}

static void counts_add(struct cfx__gpu_sim_counts *to, const struct cfx__gpu_sim_counts *c)
{
    to->copies += c->copies;
    to->reduces += c->reduces;
    to->h2d_bytes += c->h2d_bytes;
    to->d2h_bytes += c->d2h_bytes;
    to->d2d_bytes += c->d2d_bytes;
}

static void sim_stream_destroy(void *stream)
{
    pthread_mutex_lock(&sim.lock);
    struct sim_stream **pp = &sim.streams;
    while (*pp && *pp != stream)
        pp = &(*pp)->next;
    struct sim_stream *s = *pp;
    if (s && s != sim.legacy)
        *pp = s->next;
    pthread_mutex_unlock(&sim.lock);
    if (!s || s == sim.legacy) {
        CFX_LOG(WARN, GPU, "simulated device: destroy of %p, which is not a stream of its own",
                stream);
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = true; /* the thread runs what is queued, then ends */
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&sim.lock);
    counts_add(&sim.gone, &s->counts);
    pthread_mutex_unlock(&sim.lock);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int sim_available(void)
{
    return 1; /* in the table only once installed */
}

static int sim_describe(char *buf, size_t len)
{
    return buf && len ? snprintf(buf, len, "cuda: simulated device (tests; no GPU)") : 0;
}

static int sim_get_device(int *out)
{
    *out = sim_cur;
    return CFX_OK;
}

static int sim_set_device(int dev)
{
    if (dev < 0 || dev >= SIM_NDEV)
        return cfx__err(CFX_ERR_NO_DEVICE, "simulated device: no device %d (it has %d)", dev,
                        SIM_NDEV);
    sim_cur = dev;
    sim_here(); /* as cudaSetDevice, which makes the device's context */
    return CFX_OK;
}

static const struct cfx_memtype_ops sim_ops = {
    .type = CFX_MEMTYPE_CUDA,
    .name = "cuda",
    .available = sim_available,
    .detect = sim_detect,
    .copy = sim_copy,
    .alloc = sim_alloc,
    .free_buf = sim_free,
    .reduce = sim_reduce,
    .sync = sim_sync,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .wait_default = sim_wait_default,
    .describe = sim_describe,
    .get_device = sim_get_device,
    .set_device = sim_set_device,
};

/* ---- installation and counts --------------------------------------------------- */

int cfx__gpu_sim_install(void)
{
    pthread_mutex_lock(&sim.lock);
    if (sim.installed) {
        pthread_mutex_unlock(&sim.lock);
        return CFX_OK;
    }
    struct sim_stream *s = NULL;
    int rc = stream_start(&s);
    if (rc == CFX_OK) {
        s->device = -1;
        s->next = sim.streams;
        sim.streams = s;
        sim.legacy = s;
        sim.installed = true;
        cfx__memtype_replace(&sim_ops);
    }
    pthread_mutex_unlock(&sim.lock);
    return rc;
}

int cfx__gpu_sim_stream_counts(void *stream, struct cfx__gpu_sim_counts *out)
{
    struct sim_stream *s = NULL;
    int rc = stream_get(stream, "counts", &s);
    if (rc != CFX_OK)
        return rc;
    pthread_mutex_lock(&s->lock);
    *out = s->counts;
    pthread_mutex_unlock(&s->lock);
    return CFX_OK;
}

void cfx__gpu_sim_counts(struct cfx__gpu_sim_counts *out)
{
    pthread_mutex_lock(&sim.lock);
    *out = sim.gone;
    for (struct sim_stream *s = sim.streams; s; s = s->next) {
        pthread_mutex_lock(&s->lock);
        counts_add(out, &s->counts);
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&sim.lock);
}

unsigned cfx__gpu_sim_devices_used(void)
{
    return __atomic_load_n(&sim.used, __ATOMIC_RELAXED);
}

/*
 * Objects in CUDA device memory between two contexts in one process, over
 * tcp and over shm (the staging path: dataplane/engine/gpu_stage.c): put
 * from device memory, get into device memory, sizes around the inline
 * limit and the chunk size, a local get, and truncation.
 *
 * Without a GPU the transfer tests skip with the reason and run on the
 * simulated device instead (cuda_xfer_sim); the refusal of device memory on
 * such a host is tested for real.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "gpu/memtype.h"
#include "gpu/sim.h"
#include "testutil.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

static struct cfx_coord *coord;
static char coord_addr[64], token[64];
static struct cfx_context *a, *b;

static void join(const char *tps, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS,
        .coord = coord_addr, .token = token, .transports = tps,
    };
    cr_assert_eq(cfx_context_create(&p, out), CFX_OK, "%s", cfx_last_error());
}

static void up(const char *tps)
{
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK);
    snprintf(coord_addr, sizeof(coord_addr), "127.0.0.1:%u", cfx__coord_port(coord));
    join(tps, &a);
    join(tps, &b);
}

static void down(void)
{
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    cfx__coord_stop(coord);
}

static const struct cfx_obj_params dev_params = {
    .field_mask = CFX_OBJ_PARAM_MEMTYPE | CFX_OBJ_PARAM_TIMEOUT,
    .memtype = CFX_MEMTYPE_CUDA,
    .timeout_ms = 20000,
};

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

/* On a host without a usable GPU, device memory is refused up front with
 * a reason, and host objects keep working. */
Test(cuda_xfer, refused_without_device, .timeout = 60)
{
    if (cfx__memtype_available(CFX_MEMTYPE_CUDA))
        cr_skip_test("a CUDA device is present: this test covers hosts without one");
    up("tcp");
    struct cfx_object_id id;
    char buf[256];
    cr_assert_eq(cfx_object_id_from_name("cuda-refused", &id), CFX_OK);
    int rc = cfx_put(a, &id, buf, sizeof(buf), &dev_params);
#ifdef CFX_HAVE_CUDA
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "%s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "absent ("), "%s", cfx_last_error());
#else
    cr_assert_eq(rc, CFX_ERR_UNSUPPORTED, "%s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "without CUDA"), "%s", cfx_last_error());
#endif
    cr_assert_neq(cfx_get(b, &id, buf, sizeof(buf), NULL, &dev_params), CFX_OK);
    /* a parameter-server worker on device buffers is refused up front too */
    struct cfx_ps_params pp = {
        .field_mask = CFX_PS_PARAM_ROLE | CFX_PS_PARAM_MEMTYPE,
        .role = CFX_PS_WORKER,
        .memtype = CFX_MEMTYPE_CUDA,
    };
    struct cfx_ps *ps = NULL;
    int prc = cfx_ps_create(a, &pp, &ps);
    cr_assert_eq(prc, rc, "ps worker on device memory: %s", cfx_errname(prc));
    cr_assert(strstr(cfx_last_error(), "ps worker"), "%s", cfx_last_error());
    cr_assert_null(ps);
    /* the context is fine for host memory */
    cfx_test_fill(buf, sizeof(buf), 3);
    cr_assert_eq(cfx_put(a, &id, buf, sizeof(buf), NULL), CFX_OK, "%s", cfx_last_error());
    char got[256];
    cr_assert_eq(cfx_get(b, &id, got, sizeof(got), NULL, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(got, sizeof(got), 3), (size_t)-1);
    down();
}

struct tp_param {
    char tp[8];
};
static struct tp_param tps[] = { { "tcp" }, { "shm" } };

/* An object's bytes: host source and read-back buffers, a device copy of
 * the source and a device destination. */
struct dev_obj {
    char *src, *back;
    void *dsrc, *ddst;
};

static void dev_obj_setup(struct dev_obj *o, size_t n, unsigned seed)
{
    o->src = malloc(n);
    o->back = malloc(n);
    cr_assert(o->src && o->back);
    cfx_test_fill(o->src, n, seed);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &o->dsrc), CFX_OK);
    cr_assert_eq(cfx__memtype_alloc(CFX_MEMTYPE_CUDA, n, &o->ddst), CFX_OK);
    cr_assert_eq(cfx__memcpy_typed(o->dsrc, CFX_MEMTYPE_CUDA, o->src, CFX_MEMTYPE_HOST, n),
                 CFX_OK);
}

/* @p o set up (n bytes, pattern @p seed) and put from device memory on a
 * as the object named @p name (its id in @p id). */
static void dev_obj_put(struct dev_obj *o, size_t n, unsigned seed, const char *name,
                        struct cfx_object_id *id)
{
    dev_obj_setup(o, n, seed);
    cr_assert_eq(cfx_object_id_from_name(name, id), CFX_OK);
    cr_assert_eq(cfx_put(a, id, o->dsrc, n, &dev_params), CFX_OK, "%s", cfx_last_error());
}

static void dev_obj_free(struct dev_obj *o)
{
    cfx__memtype_free(CFX_MEMTYPE_CUDA, o->dsrc);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, o->ddst);
    free(o->src);
    free(o->back);
}

/* Put from device memory on a, get into device memory on b, for sizes
 * around the inline limit and the chunk size; then b serves its copy. */
static void device_to_device(const char *tp)
{
    static const size_t sizes[] = { 1, 4096, 65536, 65537, (9u << 20) + 13 };
    up(tp);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i], got_n = 0;
        char name[64];
        struct cfx_object_id id;
        struct dev_obj o;

        snprintf(name, sizeof(name), "cuda-%s-%zu", tp, n);
        cr_assert_eq(cfx_object_id_from_name(name, &id), CFX_OK);
        dev_obj_setup(&o, n, 100 + (unsigned)i);
        char *back = o.back;
        void *dsrc = o.dsrc, *ddst = o.ddst;

        cr_assert_eq(cfx_put(a, &id, dsrc, n, &dev_params), CFX_OK, "%s", cfx_last_error());
        /* a put is a snapshot of the device buffer */
        cr_assert_eq(cfx__memcpy_typed(dsrc, CFX_MEMTYPE_CUDA, back, CFX_MEMTYPE_HOST, n), CFX_OK);
        cr_assert_eq(cfx_get(b, &id, ddst, n, &got_n, &dev_params), CFX_OK, "%zu B over %s: %s",
                     n, tp, cfx_last_error());
        cr_assert_eq(got_n, n);
        memset(back, 0, n);
        cr_assert_eq(cfx__memcpy_typed(back, CFX_MEMTYPE_HOST, ddst, CFX_MEMTYPE_CUDA, n), CFX_OK);
        cr_assert_eq(cfx_test_check(back, n, 100 + i), (size_t)-1, "%zu B over %s", n, tp);

        /* b now serves it too: a host get from b's copy, then a local
         * device get on b */
        memset(back, 0, n);
        cr_assert_eq(cfx_get(b, &id, back, n, NULL, NULL), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(cfx_test_check(back, n, 100 + i), (size_t)-1);
        /* too small a device buffer: the size is still said, as on the host */
        if (n > 1) {
            size_t said = 0;
            cr_assert_eq(cfx_get(b, &id, ddst, n - 1, &said, &dev_params), CFX_ERR_TRUNCATED);
            cr_assert_eq(said, n, "a truncated device get said %zu bytes", said);
        }

        cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
        cfx_delete(b, &id, NULL);
        dev_obj_free(&o);
    }
    down();
}

ParameterizedTestParameters(cuda_xfer, device_to_device)
{
    return cr_make_param_array(struct tp_param, tps, 2);
}

ParameterizedTest(struct tp_param *p, cuda_xfer, device_to_device, .timeout = 120)
{
    need_gpu();
    device_to_device(p->tp);
}

/* The same on the simulated device (gpu/sim.h), which runs everywhere. */
ParameterizedTestParameters(cuda_xfer_sim, device_to_device)
{
    return cr_make_param_array(struct tp_param, tps, 2);
}

ParameterizedTest(struct tp_param *p, cuda_xfer_sim, device_to_device, .timeout = 120)
{
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    device_to_device(p->tp);
}

/*
 * A get into device memory copies each part as it lands: with the upload
 * paced (64 KiB chunks at 16 MB/s, so 2 MiB take about 130 ms), the
 * getter's stream sees many partial copies, which together are the object
 * exactly once, before the get returns.
 */
Test(cuda_xfer_sim, get_copies_parts_as_they_land, .timeout = 60)
{
    const size_t n = 2u << 20;
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    setenv("CFX_CHUNK_SIZE", "64K", 1);
    setenv("CFX_UPLOAD_RATE", "16M", 1);
    up("tcp");
    struct cfx_object_id id;
    struct dev_obj o;
    dev_obj_put(&o, n, 77, "cuda-sim-paced", &id);

    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, o.ddst, n, &got, &dev_params), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, n);
    struct cfx__gpu_sim_counts c;
    cr_assert_eq(cfx__gpu_sim_stream_counts(b->dev_stream, &c), CFX_OK);
    cr_log_info("2 MiB paced get: %" PRIu64 " copies to the device", c.copies);
    cr_assert_eq(c.h2d_bytes, n, "%" PRIu64 " bytes copied to the device", c.h2d_bytes);
    cr_assert_geq(c.copies, 4, "only %" PRIu64 " copies: the parts were not copied as they "
                  "landed", c.copies);
    cr_assert_eq(cfx__memcpy_typed(o.back, CFX_MEMTYPE_HOST, o.ddst, CFX_MEMTYPE_CUDA, n),
                 CFX_OK);
    cr_assert_eq(cfx_test_check(o.back, n, 77), (size_t)-1);

    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK);
    cfx_delete(b, &id, NULL);
    dev_obj_free(&o);
    down();
}

/*
 * A get into a device buffer too small for a remote object fails with
 * CFX_ERR_TRUNCATED and says the object's size, as a host get does (it
 * left size_out unset); a get with room afterwards has every byte.
 */
Test(cuda_xfer_sim, truncated_get_says_the_size, .timeout = 60)
{
    const size_t n = (1u << 20) + 3;
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    up("tcp");
    struct cfx_object_id id;
    struct dev_obj o;
    dev_obj_put(&o, n, 91, "cuda-sim-truncated", &id);
    size_t said = 0;
    cr_assert_eq(cfx_get(b, &id, o.ddst, n - 1, &said, &dev_params), CFX_ERR_TRUNCATED, "%s",
                 cfx_last_error());
    cr_assert_eq(said, n, "a truncated device get said %zu bytes", said);
    said = 0;
    cr_assert_eq(cfx_get(b, &id, o.ddst, n, &said, &dev_params), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(said, n);
    cr_assert_eq(cfx__memcpy_typed(o.back, CFX_MEMTYPE_HOST, o.ddst, CFX_MEMTYPE_CUDA, n),
                 CFX_OK);
    cr_assert_eq(cfx_test_check(o.back, n, 91), (size_t)-1);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK);
    cfx_delete(b, &id, NULL);
    dev_obj_free(&o);
    down();
}

/*
 * cfx_put_nb / cfx_get_nb of device memory on device 2, posted from the
 * thread that made it current: the worker thread that runs them must work
 * on device 2 too (its stream, and the default stream the copies are
 * ordered after, are the current device's), never on device 0, its own
 * thread's default, which the application never chose.
 */
Test(cuda_xfer_sim, nb_calls_on_the_posters_device, .timeout = 60)
{
    const size_t n = (1u << 20) + 7;
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    up("tcp");
    cr_assert_eq(cfx__memtype_set_device(CFX_MEMTYPE_CUDA, 2), CFX_OK, "%s", cfx_last_error());
    struct cfx_object_id id;
    struct dev_obj o;
    struct cfx_request *req = NULL;
    dev_obj_setup(&o, n, 23);
    cr_assert_eq(cfx_object_id_from_name("cuda-sim-nb-dev2", &id), CFX_OK);
    cr_assert_eq(cfx_put_nb(a, &id, o.dsrc, n, &dev_params, &req), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cfx_request_free(req);
    cr_assert_eq(cfx_get_nb(b, &id, o.ddst, n, &dev_params, &req), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx_request_wait(req, 20000), CFX_OK, "%s", cfx_last_error());
    cfx_request_free(req);
    cr_assert_eq(cfx__memcpy_typed(o.back, CFX_MEMTYPE_HOST, o.ddst, CFX_MEMTYPE_CUDA, n),
                 CFX_OK);
    cr_assert_eq(cfx_test_check(o.back, n, 23), (size_t)-1);
    cr_assert_eq(cfx__gpu_sim_devices_used(), 1u << 2, "devices used: %#x, want only 2",
                 cfx__gpu_sim_devices_used());
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK);
    cfx_delete(b, &id, NULL);
    dev_obj_free(&o);
    down();
}

/*
 * A get into device memory stages the object in an arena buffer, which
 * stays as this node's copy to serve other getters: the copy's delete frees
 * it.  The buffer was kept as lent to a caller (there is none), so the
 * delete's release left it allocated: every device get of an object, then
 * deleted, kept its size of the arena in use for the context's life.
 */
Test(cuda_xfer_sim, device_get_copy_goes_with_its_delete, .timeout = 60)
{
    const size_t n = 3u << 20;
    cr_assert_eq(cfx__gpu_sim_install(), CFX_OK, "%s", cfx_last_error());
    up("tcp");
    struct cfx_object_id id;
    struct dev_obj o;
    dev_obj_put(&o, n, 81, "cuda-sim-copy-freed", &id);
    uint64_t before = __atomic_load_n(&b->arena.used_bytes, __ATOMIC_RELAXED);
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, o.ddst, n, &got, &dev_params), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, n);
    cr_assert_gt(__atomic_load_n(&b->arena.used_bytes, __ATOMIC_RELAXED), before,
                 "the copy is in no arena buffer: the case was not made");
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&b->lock);
    while (cfx__store_find(&b->store, &id) && cfx__obj_wait(b, dl))
        ;
    bool gone = !cfx__store_find(&b->store, &id);
    pthread_mutex_unlock(&b->lock);
    cr_assert(gone, "b's copy never left its store");
    cr_assert_eq(__atomic_load_n(&b->arena.used_bytes, __ATOMIC_RELAXED), before,
                 "the copy's arena buffer stayed in use after its delete");
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK);
    dev_obj_free(&o);
    down();
}

/*
 * verbs transport: memory registration through the registration cache.
 *
 * mem_reg takes a reference on a cached region covering the memory
 * (verbs_rcache.h) and describes it to peers as (rkey, address, length).
 * The rdesc's address and length are the caller's, not the page-aligned
 * region's: ep_write checks a write against them before posting, and the
 * responder's NIC checks the rkey's region.
 *
 * What is cached after its last mem_dereg: only registrations of memory
 * whose owner reports frees, that is the engine's arena (file_fd >= 0), and
 * only local-only ones unless CFX_IB_RCACHE_REMOTE=1.  A remotely writable
 * registration is deregistered with its last user so that its rkey dies
 * with it: a peer holding a stale descriptor then gets a remote access
 * error instead of writing into memory that was handed out again.
 * The arena calls cfx__verbs_rcache_invalidate() before it unmaps a segment.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "verbs.h"
#include "verbs_gdr.h"

static int reg_cb(void *arg, void *addr, size_t len, unsigned access,
                  struct cfx__verbs_reg_info *out)
{
    struct cfx__verbs_iface *iface = arg;
    int flags = 0;

    if (access & CFX_TP_ACCESS_REMOTE_WRITE)
        flags |= IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (access & CFX__VERBS_ACCESS_CUDA) { /* GPUDirect RDMA: verbs_gdr.c */
        struct ibv_mr *gmr = NULL;
        int rc = cfx__verbs_gdr_reg(iface->pd, iface->dev_name, addr, len, flags, &gmr);
        if (rc != CFX_OK)
            return rc;
        out->handle = gmr;
        out->lkey = gmr->lkey;
        out->rkey = gmr->rkey;
        return CFX_OK;
    }
    struct ibv_mr *mr = ibv_reg_mr(iface->pd, addr, len, flags);
    if (!mr) {
        int err = errno;
        return cfx__err(cfx__verbs_status(err),
                        "verbs: cannot register %zu bytes at %p on %s: %s%s", len, addr,
                        iface->dev_name, strerror(err),
                        err == ENOMEM || err == EPERM
                            ? " (locked-memory limit reached? see 'ulimit -l' and "
                              "CFX_IB_MEMLOCK_MIN)"
                            : "");
    }
    out->handle = mr;
    out->lkey = mr->lkey;
    out->rkey = mr->rkey;
    return CFX_OK;
}

static void dereg_cb(void *arg, void *handle)
{
    struct cfx__verbs_iface *iface = arg;
    int err = ibv_dereg_mr(handle);
    if (err)
        CFX_LOG(WARN, VERBS, "iface %s: ibv_dereg_mr: %s", iface->addr, strerror(err));
}

static const struct cfx__verbs_rcache_ops rcache_ops = {
    .reg = reg_cb,
    .dereg = dereg_cb,
};

int cfx__verbs_rcache_open(struct cfx__verbs_iface *iface)
{
    long page = sysconf(_SC_PAGESIZE);
    struct cfx__verbs_rcache_params p = {
        .page_size = page > 0 ? (size_t)page : 4096,
        .max_idle = (uint32_t)CFX_MAX(0, cfx__env_ll("CFX_IB_RCACHE_MAX", CFX_VERBS_IDLE_MAX)),
        .max_idle_bytes = cfx__env_size("CFX_IB_RCACHE_BYTES", CFX_VERBS_IDLE_BYTES),
        .ops = &rcache_ops,
        .arg = iface,
        .name = iface->addr,
    };
    return cfx__verbs_rcache_create(&p, &iface->rcache);
}

int cfx__verbs_mem_reg(struct cfx_tp_iface *tp_iface, const struct cfx_tp_mem_desc *mem,
                       unsigned access, struct cfx_tp_mr **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__verbs_iface *iface;
    struct cfx__verbs_mr *mr;
    int rc;

    if (!tp_iface || !mem || !out || !mem->addr || !mem->len)
        return cfx__err(CFX_ERR_INVALID, "verbs mem_reg: NULL argument or empty region");
    if (access & ~(unsigned)(CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "verbs mem_reg: unknown access bits 0x%x", access);
    if (mem->memtype != CFX_MEMTYPE_HOST && mem->memtype != CFX_MEMTYPE_CUDA)
        return cfx__err(CFX_ERR_UNSUPPORTED, "verbs mem_reg: memory type %d", (int)mem->memtype);
    iface = cfx__verbs_iface_of(tp_iface);

    /* Cached past its last user only when someone reports the memory's
     * end (see above).  CUDA memory: GPUDirect RDMA by dma-buf or the
     * peer-memory module (verbs_gdr.c); never cached. */
    bool cacheable = mem->file_fd >= 0 && mem->memtype == CFX_MEMTYPE_HOST &&
                     (!(access & CFX_TP_ACCESS_REMOTE_WRITE) ||
                      cfx__env_ll("CFX_IB_RCACHE_REMOTE", 0) == 1);

    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "verbs mem_reg: out of memory");
    rc = cfx__verbs_rcache_get(iface->rcache, mem->addr, mem->len,
                               access | (mem->memtype == CFX_MEMTYPE_CUDA ? CFX__VERBS_ACCESS_CUDA
                                                                          : 0u),
                               cacheable, &mr->region);
    if (rc != CFX_OK) {
        free(mr);
        return rc; /* CUDA memory: CFX_ERR_UNSUPPORTED says why (verbs_gdr.c) */
    }
    mr->super.iface = tp_iface;
    mr->super.addr = mem->addr;
    mr->super.len = mem->len;
    mr->super.memtype = mem->memtype;
    mr->access = access;
    *out = &mr->super;
    return CFX_OK;
}

void cfx__verbs_mem_dereg(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_mr->iface);
    cfx__verbs_rcache_put(iface->rcache, mr->region);
    free(mr);
}

int cfx__verbs_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    struct cfx__verbs_rkey k;

    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "verbs mr_pack: NULL argument");
    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);

    memset(&k, 0, sizeof(k));
    k.tag = CFX_VERBS_RDESC_TAG;
    k.rkey = htole32(mr->region->reg.rkey);
    k.addr = htole64((uint64_t)(uintptr_t)tp_mr->addr);
    k.len = htole64((uint64_t)tp_mr->len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
    return CFX_OK;
}

uint32_t cfx__verbs_rcache_invalidate(struct cfx_tp_iface *tp_iface, const void *addr, size_t len)
{
    CFX_TP_THREAD_CHECK(tp_iface && tp_iface->ops == &cfx__verbs_ops ? tp_iface : NULL);
    if (!tp_iface || tp_iface->ops != &cfx__verbs_ops)
        return 0;
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_iface);
    uint32_t n = cfx__verbs_rcache_invalidate_range(iface->rcache, addr, len);
    if (n)
        CFX_LOG(DEBUG, VERBS, "iface %s: %u cached registration(s) of [%p, +%zu) dropped",
                iface->addr, n, addr, len);
    return n;
}

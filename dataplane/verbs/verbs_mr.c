/*
 * verbs transport: memory registration through the registration cache.
 *
 * mem_reg takes a reference on a cached region covering the memory
 * (verbs_rcache.h) and describes it to peers as (rkey, address, length).
 * The rdesc's address and length are the caller's, not the page-aligned
 * region's: ep_write checks a write against them before posting, and the
 * responder's NIC checks the rkey's region.
 *
 * A remotely writable registration's region is exactly its bytes and has
 * no remote access of its own; peers write through grants (mr_grant, see
 * verbs.h), each revoked by mr_revoke, the next grant or mem_dereg.
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
#include <sys/random.h>
#include <unistd.h>

#include "verbs.h"
#include "verbs_gdr.h"

static int reg_cb(void *arg, void *addr, size_t len, unsigned access,
                  struct cfx__verbs_reg_info *out)
{
    struct cfx__verbs_iface *iface = arg;
    int flags = 0;

    /* No remote access on the region itself: peers write only through a
     * grant (a memory window bound over it, or a per-grant registration). */
    if (access & CFX_TP_ACCESS_REMOTE_WRITE)
        flags |= IBV_ACCESS_LOCAL_WRITE | (iface->has_mw2 ? IBV_ACCESS_MW_BIND : 0);
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
        .max_idle = (uint32_t)cfx__env_ll_clamp("CFX_IB_RCACHE_MAX", CFX_VERBS_IDLE_MAX, 0,
                                                UINT32_MAX),
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
    mr->super.access = access;
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
    cfx__verbs_mr_revoke(tp_mr);
    cfx__verbs_rcache_put(iface->rcache, mr->region);
    free(mr);
}

/* --- grants ------------------------------------------------------------------------ */

/* A registration of exactly the granted bytes with remote write: a grant
 * to any peer of the protection domain, and to an endpoint where the
 * device has no type-2 windows. */
static int grant_by_reg(struct cfx__verbs_iface *iface, struct cfx__verbs_mr *mr)
{
    int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *gmr = NULL;

    if (mr->super.memtype == CFX_MEMTYPE_CUDA) {
        int rc = cfx__verbs_gdr_reg(iface->pd, iface->dev_name, mr->super.addr, mr->super.len,
                                    flags, &gmr);
        if (rc != CFX_OK)
            return rc;
    } else {
        gmr = ibv_reg_mr(iface->pd, mr->super.addr, mr->super.len, flags);
        if (!gmr) {
            int err = errno;
            return cfx__err(cfx__verbs_status(err), "verbs: cannot register %zu bytes at %p "
                            "on %s for a write grant: %s", mr->super.len, mr->super.addr,
                            iface->dev_name, strerror(err));
        }
    }
    if (gmr->rkey == iface->last_reg_rkey) {
        /* The device handed out the previous grant's rkey again (it reuses
         * the index, and 1 in 256 times the key byte): take another while
         * holding this one, so that a stale key never comes back at once. */
        struct ibv_mr *again = mr->super.memtype == CFX_MEMTYPE_CUDA
                                   ? NULL
                                   : ibv_reg_mr(iface->pd, mr->super.addr, mr->super.len, flags);
        if (again) {
            ibv_dereg_mr(gmr);
            gmr = again;
        }
    }
    iface->last_reg_rkey = gmr->rkey;
    mr->grant_mr = gmr;
    mr->grant_rkey = gmr->rkey;
    return CFX_OK;
}

/* A type-2 window over exactly the registration's bytes, bound on @p ep's
 * QP: the HCA honours its rkey on that QP only.  The low byte of an rkey is
 * the consumer's key: random, so a peer cannot tell the next one. */
static int grant_by_mw(struct cfx__verbs_iface *iface, struct cfx__verbs_mr *mr,
                       struct cfx__verbs_ep *ep)
{
    uint8_t key;
    uint32_t seq;
    int rc;

    struct ibv_mw *mw = ibv_alloc_mw(iface->pd, IBV_MW_TYPE_2);
    if (!mw) {
        int err = errno;
        return cfx__err(cfx__verbs_status(err), "verbs: cannot allocate a memory window on %s "
                        "for a write grant to %s: %s", iface->dev_name, ep->super.peer_name,
                        strerror(err));
    }
    do {
        if (getrandom(&key, 1, 0) != 1) {
            rc = cfx__err(CFX_ERR_IO, "verbs: getrandom: %s", strerror(errno));
            goto err_dealloc;
        }
    } while (key == (mw->rkey & 0xffu) || key == iface->last_grant_key);
    /* Not the key byte of the grant before either: a window index the
     * device hands out again never carries the previous grant's rkey. */
    iface->last_grant_key = key;
    uint32_t rkey = (mw->rkey & ~0xffu) | key;
    rc = cfx__verbs_ep_bind_mw(ep, mw, mr->region->reg.handle,
                               (uint64_t)(uintptr_t)mr->super.addr, mr->super.len, rkey, &seq);
    if (rc != CFX_OK)
        goto err_dealloc;
    mr->grant_mw = mw;
    mr->grant_rkey = rkey;
    mr->bind_slot = ep->slot;
    mr->bind_gen = ep->gen;
    mr->bind_seq = seq;
    return CFX_OK;

err_dealloc:
    ibv_dealloc_mw(mw);
    return rc;
}

static void pack(struct cfx__verbs_mr *mr, uint32_t rkey, struct cfx_tp_rdesc *out)
{
    struct cfx__verbs_rkey k;

    memset(&k, 0, sizeof(k));
    k.tag = CFX_VERBS_RDESC_TAG;
    k.rkey = htole32(rkey);
    k.addr = htole64((uint64_t)(uintptr_t)mr->super.addr);
    k.len = htole64((uint64_t)mr->super.len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
}

int cfx__verbs_mr_grant(struct cfx_tp_mr *tp_mr, struct cfx_tp_ep *tp_ep,
                        struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    int rc = cfx__tp_grant_args("verbs", tp_mr, tp_ep, out);
    if (rc != CFX_OK)
        return rc;
    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_mr->iface);

    cfx__verbs_mr_revoke(tp_mr); /* one live grant per registration */
    rc = tp_ep && iface->has_mw2 ? grant_by_mw(iface, mr, cfx__verbs_ep_of(tp_ep))
                                 : grant_by_reg(iface, mr);
    if (rc == CFX_ERR_AGAIN) {
        /* The endpoint's send queue has no room for the bind (credits keep
         * it far from full, so this is rare): exact bytes and the
         * transfer's life still hold, only the scope to one QP is lost.
         * Callers treat a failed grant as a failed transfer, not a retry. */
        CFX_LOG(DEBUG, VERBS, "iface %s: %s; granting by registration", iface->addr,
                cfx_last_error());
        rc = grant_by_reg(iface, mr);
    }
    if (rc != CFX_OK)
        return rc;
    pack(mr, mr->grant_rkey, out);
    return CFX_OK;
}

void cfx__verbs_mr_revoke(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);
    struct cfx__verbs_iface *iface = cfx__verbs_iface_of(tp_mr->iface);

    if (mr->grant_mr) {
        int err = ibv_dereg_mr(mr->grant_mr); /* its rkey is dead when this returns */
        if (err)
            CFX_LOG(WARN, VERBS, "iface %s: ibv_dereg_mr (grant): %s", iface->addr,
                    strerror(err));
        mr->grant_mr = NULL;
    }
    if (mr->grant_mw) {
        /* Deallocating a window invalidates it at once, but a bind still in
         * the send queue would then fail and take the connection with it:
         * wait (bounded) for the bind to retire while its QP works. */
        uint64_t deadline = cfx__deadline_ns(CFX_VERBS_BIND_WAIT_MS);
        for (;;) {
            struct cfx__verbs_ep *ep = cfx__tp_table_get(&iface->ep_tab, mr->bind_slot,
                                                         mr->bind_gen);
            if (!ep || ep->state != CFX_VERBS_EP_OPEN ||
                (int32_t)(ep->sq.retired - mr->bind_seq) > 0)
                break;
            if (cfx__now_ns() >= deadline) {
                CFX_LOG(WARN, VERBS, "iface %s: ep to %s: bind of a write grant not retired "
                        "after %d ms; revoking it anyway", iface->addr, ep->super.peer_name,
                        CFX_VERBS_BIND_WAIT_MS);
                break;
            }
            cfx__verbs_cq_pass(iface);
        }
        int err = ibv_dealloc_mw(mr->grant_mw);
        if (err)
            CFX_LOG(WARN, VERBS, "iface %s: ibv_dealloc_mw: %s", iface->addr, strerror(err));
        mr->grant_mw = NULL;
    }
}

int cfx__verbs_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    struct cfx__verbs_rkey k;

    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "verbs mr_pack: NULL argument");
    struct cfx__verbs_mr *mr = cfx__verbs_mr_of(tp_mr);
    /* Remotely writable: a grant to any peer (transport.h); local-only:
     * the region's rkey, which writes nothing. */
    if (mr->super.access & CFX_TP_ACCESS_REMOTE_WRITE)
        return cfx__verbs_mr_grant(tp_mr, NULL, out);

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

/*
 * dpdk transport: memory registration and write grants, as in tcp
 * (tcp_mr.c): a registration takes no remote write until it is granted; a
 * grant draws 64 fresh random bits as its key and may name the one endpoint
 * allowed to write.  The receive path checks key, writer and bounds on a
 * chunk's header, before a byte of the chunk is placed.
 */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"
#include "dpdk.h"

int cfx__dpdk_mem_reg(struct cfx_tp_iface *tp_iface, const struct cfx_tp_mem_desc *mem,
                      unsigned access, struct cfx_tp_mr **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__dpdk_mr *mr;
    int rc;

    if (!tp_iface || !mem || !out || !mem->addr || !mem->len)
        return cfx__err(CFX_ERR_INVALID, "dpdk mem_reg: NULL argument or empty region");
    if (access & ~(unsigned)(CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "dpdk mem_reg: unknown access bits 0x%x", access);
    if (mem->memtype != CFX_MEMTYPE_HOST)
        return cfx__err(CFX_ERR_UNSUPPORTED, "dpdk mem_reg: memory type %d is not host memory",
                        (int)mem->memtype);
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_iface);

    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "dpdk mem_reg: out of memory");
    if ((rc = cfx__tp_table_add(&iface->mrs, mr, &mr->idx, &mr->gen)) != CFX_OK) {
        free(mr);
        return rc;
    }
    mr->super.iface = tp_iface;
    mr->super.addr = mem->addr;
    mr->super.len = mem->len;
    mr->super.memtype = mem->memtype;
    mr->access = access;
    *out = &mr->super;
    return CFX_OK;
}

void cfx__dpdk_mem_dereg(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__dpdk_mr *mr = cfx__dpdk_mr_of(tp_mr);
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_mr->iface);
    struct cfx_list *pos, *n;

    /* A chunk being received into it now goes nowhere (the slot's generation
     * moves on); writes from it still queued cannot be sent: their eps fail;
     * no frame sent from it is left in the port's batch. */
    cfx__dpdk_port_settle(iface->port);
    cfx_list_for_each_safe(pos, n, &iface->eps)
        cfx__dpdk_ep_mr_gone(cfx_list_entry(pos, struct cfx__dpdk_ep, link), mr);
    cfx__tp_revoked_add(&iface->revoked, mr->grant_key, mr->grant_ep);
    cfx__tp_table_remove(&iface->mrs, mr->idx);
    free(mr);
}

static void rkey_pack(const struct cfx__dpdk_mr *mr, uint64_t key, struct cfx_tp_rdesc *out)
{
    struct cfx__dpdk_rkey k;
    memset(&k, 0, sizeof(k));
    k.tag = CFX_DPDK_RDESC_TAG;
    k.idx = htole32(mr->idx);
    k.key = htole64(key);
    k.len = htole64((uint64_t)mr->super.len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
}

int cfx__dpdk_mr_grant(struct cfx_tp_mr *tp_mr, struct cfx_tp_ep *tp_ep, struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr || !out || (tp_ep && tp_ep->iface != tp_mr->iface))
        return cfx__err(CFX_ERR_INVALID, "dpdk mr_grant: NULL argument or another iface's ep");
    struct cfx__dpdk_mr *mr = cfx__dpdk_mr_of(tp_mr);
    if (!(mr->access & CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "dpdk mr_grant: region %p is not remote-writable",
                        tp_mr->addr);
    cfx__tp_revoked_add(&cfx__dpdk_iface_of(tp_mr->iface)->revoked, mr->grant_key,
                        mr->grant_ep); /* a grant again ends the one before */
    mr->grant_key = cfx__keystream_next(&cfx__dpdk_iface_of(tp_mr->iface)->keys);
    mr->grant_ep = tp_ep ? cfx__dpdk_ep_of(tp_ep)->serial : 0;
    rkey_pack(mr, mr->grant_key, out);
    return CFX_OK;
}

void cfx__dpdk_mr_revoke(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__dpdk_mr *mr = cfx__dpdk_mr_of(tp_mr);
    cfx__tp_revoked_add(&cfx__dpdk_iface_of(tp_mr->iface)->revoked, mr->grant_key, mr->grant_ep);
    mr->grant_key = 0;
    mr->grant_ep = 0;
}

int cfx__dpdk_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "dpdk mr_pack: NULL argument");
    /* a registration that takes no remote write is described all the same
     * (its key, 0, matches nothing) */
    if (!(cfx__dpdk_mr_of(tp_mr)->access & CFX_TP_ACCESS_REMOTE_WRITE)) {
        rkey_pack(cfx__dpdk_mr_of(tp_mr), 0, out);
        return CFX_OK;
    }
    return cfx__dpdk_mr_grant(tp_mr, NULL, out);
}

struct cfx__dpdk_mr *cfx__dpdk_mr_lookup(struct cfx__dpdk_iface *iface,
                                         const struct cfx__dpdk_ep *ep, uint32_t idx, uint64_t key,
                                         uint64_t off, uint64_t len, const char **why)
{
    struct cfx__dpdk_mr *mr = cfx__tp_table_at(&iface->mrs, idx);

    if (unlikely(!mr || !mr->grant_key || mr->grant_key != key)) {
        *why = "no live grant with that key";
        return NULL;
    }
    if (unlikely(mr->grant_ep && mr->grant_ep != ep->serial)) {
        *why = "granted to another peer";
        return NULL;
    }
    if (unlikely(off > mr->super.len || len > mr->super.len - off)) {
        *why = "outside the granted bytes";
        return NULL;
    }
    return mr;
}

void cfx__dpdk_mr_table_free(struct cfx__dpdk_iface *iface)
{
    for (uint32_t i = 0; i < iface->mrs.cap; i++) {
        struct cfx__dpdk_mr *mr = cfx__tp_table_at(&iface->mrs, i);
        if (mr) {
            CFX_LOG(WARN, DPDK, "iface %s: region %p (%zu bytes) still registered at close",
                    iface->name, mr->super.addr, mr->super.len);
            free(mr);
        }
    }
    cfx__tp_table_fini(&iface->mrs);
}

/*
 * dpdk transport: memory registration and write grants, as in tcp
 * (tpbase.h, "registrations and write grants checked in software"): a
 * registration takes no remote write until it is granted.  The receive path
 * checks key, writer and bounds on a chunk's header, before a byte of the
 * chunk is placed.
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
    struct cfx_tp_mr base;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "dpdk mem_reg: NULL argument");
    if ((rc = cfx__tp_host_reg("dpdk", tp_iface, mem, access, &base)) != CFX_OK)
        return rc;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "dpdk mem_reg: out of memory");
    mr->super = base;
    if ((rc = cfx__tp_table_add(&cfx__dpdk_iface_of(tp_iface)->mrs, mr, &mr->idx, &mr->gen)) !=
        CFX_OK) {
        free(mr);
        return rc;
    }
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
    cfx__tp_grant_end(&mr->grant, &iface->revoked);
    cfx__tp_table_remove(&iface->mrs, mr->idx);
    free(mr);
}

/* @p mr's remote key under its grant (none: a key that matches nothing). */
static void rkey_pack(const struct cfx__dpdk_mr *mr, struct cfx_tp_rdesc *out)
{
    struct cfx__dpdk_rkey k;
    memset(&k, 0, sizeof(k));
    k.tag = CFX_DPDK_RDESC_TAG;
    k.idx = htole32(mr->idx);
    k.key = htole64(mr->grant.key);
    k.len = htole64((uint64_t)mr->super.len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
}

int cfx__dpdk_mr_grant(struct cfx_tp_mr *tp_mr, struct cfx_tp_ep *tp_ep, struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    int rc = cfx__tp_grant_args("dpdk", tp_mr, tp_ep, out);
    if (rc != CFX_OK)
        return rc;
    struct cfx__dpdk_mr *mr = cfx__dpdk_mr_of(tp_mr);
    struct cfx__dpdk_iface *iface = cfx__dpdk_iface_of(tp_mr->iface);
    cfx__tp_grant_new(&mr->grant, &iface->revoked, &iface->keys,
                      tp_ep ? cfx__dpdk_ep_of(tp_ep)->serial : 0);
    rkey_pack(mr, out);
    return CFX_OK;
}

void cfx__dpdk_mr_revoke(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    cfx__tp_grant_end(&cfx__dpdk_mr_of(tp_mr)->grant, &cfx__dpdk_iface_of(tp_mr->iface)->revoked);
}

int cfx__dpdk_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "dpdk mr_pack: NULL argument");
    /* a registration that takes no remote write is described all the same
     * (its key, 0: never granted, matches nothing) */
    if (!(tp_mr->access & CFX_TP_ACCESS_REMOTE_WRITE)) {
        rkey_pack(cfx__dpdk_mr_of(tp_mr), out);
        return CFX_OK;
    }
    return cfx__dpdk_mr_grant(tp_mr, NULL, out);
}

struct cfx__dpdk_mr *cfx__dpdk_mr_lookup(struct cfx__dpdk_iface *iface,
                                         const struct cfx__dpdk_ep *ep, uint32_t idx, uint64_t key,
                                         uint64_t off, uint64_t len, const char **why)
{
    struct cfx__dpdk_mr *mr = cfx__tp_table_at(&iface->mrs, idx);
    const char *no = cfx__tp_grant_refuses(mr ? &mr->grant : NULL, mr ? mr->super.len : 0, key,
                                           ep->serial, off, len);
    if (unlikely(no)) {
        *why = no;
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

/*
 * tcp transport: memory registration.
 *
 * Registrations live in a per-iface table.  A registration takes no remote
 * write until it is granted (tpbase.h, "registrations and write grants
 * checked in software"): a remote key is (table index, grant key), and the
 * receive path checks key, writer and bounds before reading a byte of
 * payload.
 */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"
#include "tcp.h"

int cfx__tcp_mem_reg(struct cfx_tp_iface *tp_iface, const struct cfx_tp_mem_desc *mem,
                     unsigned access, struct cfx_tp_mr **out)
{
    CFX_TP_THREAD_CHECK(tp_iface);
    struct cfx__tcp_mr *mr;
    struct cfx_tp_mr base;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "tcp mem_reg: NULL argument");
    if ((rc = cfx__tp_host_reg("tcp", tp_iface, mem, access, &base)) != CFX_OK)
        return rc;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "tcp mem_reg: out of memory");
    mr->super = base;
    if ((rc = cfx__tp_table_add(&cfx__tcp_iface_of(tp_iface)->mrs, mr, &mr->idx, NULL)) !=
        CFX_OK) {
        free(mr);
        return rc;
    }
    *out = &mr->super;
    return CFX_OK;
}

void cfx__tcp_mem_dereg(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__tcp_mr *mr = cfx__tcp_mr_of(tp_mr);
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_mr->iface);

    /* A peer may be in the middle of writing into it: those bytes now go
     * nowhere, and that write reports nothing.  Writes from it that are still
     * queued cannot be sent any more: their endpoints fail. */
    if (mr->rx_busy || mr->tx_busy) {
        struct cfx_list *pos;
        cfx_list_for_each(pos, &iface->eps)
            cfx__tcp_ep_mr_gone(cfx_list_entry(pos, struct cfx__tcp_ep, link), mr);
    }
    cfx__tp_grant_end(&mr->grant, &iface->revoked);
    cfx__tp_table_remove(&iface->mrs, mr->idx);
    free(mr);
}

/* @p mr's remote key under its grant (none: a key that matches nothing). */
static void rkey_pack(const struct cfx__tcp_mr *mr, struct cfx_tp_rdesc *out)
{
    struct cfx__tcp_rkey k;
    memset(&k, 0, sizeof(k));
    k.tag = CFX_TCP_RDESC_TAG;
    k.key_lo = htole32((uint32_t)mr->grant.key);
    k.idx = htole32(mr->idx);
    k.key_hi = htole32((uint32_t)(mr->grant.key >> 32));
    k.len = htole64((uint64_t)mr->super.len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
}

int cfx__tcp_mr_grant(struct cfx_tp_mr *tp_mr, struct cfx_tp_ep *tp_ep, struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    int rc = cfx__tp_grant_args("tcp", tp_mr, tp_ep, out);
    if (rc != CFX_OK)
        return rc;
    struct cfx__tcp_mr *mr = cfx__tcp_mr_of(tp_mr);
    struct cfx__tcp_iface *iface = cfx__tcp_iface_of(tp_mr->iface);
    cfx__tp_grant_new(&mr->grant, &iface->revoked, &iface->keys,
                      tp_ep ? cfx__tcp_ep_of(tp_ep)->serial : 0);
    rkey_pack(mr, out);
    return CFX_OK;
}

void cfx__tcp_mr_revoke(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    cfx__tp_grant_end(&cfx__tcp_mr_of(tp_mr)->grant, &cfx__tcp_iface_of(tp_mr->iface)->revoked);
    /* A write of it already being received keeps landing (its header was
     * checked against the grant it had); the next header is refused. */
}

int cfx__tcp_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "tcp mr_pack: NULL argument");
    /* a registration that takes no remote write is described all the same
     * (its key, 0: never granted, matches nothing) */
    if (!(tp_mr->access & CFX_TP_ACCESS_REMOTE_WRITE)) {
        rkey_pack(cfx__tcp_mr_of(tp_mr), out);
        return CFX_OK;
    }
    return cfx__tcp_mr_grant(tp_mr, NULL, out);
}

struct cfx__tcp_mr *cfx__tcp_mr_lookup(struct cfx__tcp_iface *iface, const struct cfx__tcp_ep *ep,
                                       const struct cfx__tcp_hdr *h, const char **why)
{
    uint64_t key = (uint64_t)h->key_hi << 32 | h->key_lo;
    struct cfx__tcp_mr *mr = cfx__tp_table_at(&iface->mrs, h->key_idx);
    const char *no = cfx__tp_grant_refuses(mr ? &mr->grant : NULL, mr ? mr->super.len : 0, key,
                                           ep->serial, h->off, h->len);
    if (unlikely(no)) {
        *why = no;
        return NULL;
    }
    return mr;
}

void cfx__tcp_mr_table_free(struct cfx__tcp_iface *iface)
{
    for (uint32_t i = 0; i < iface->mrs.cap; i++) {
        struct cfx__tcp_mr *mr = cfx__tp_table_at(&iface->mrs, i);
        if (mr) {
            CFX_LOG(WARN, TCP, "iface %s: region %p (%zu bytes) still registered at close",
                    iface->addr, mr->super.addr, mr->super.len);
            free(mr);
        }
    }
    cfx__tp_table_fini(&iface->mrs);
}

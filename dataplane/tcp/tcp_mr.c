/*
 * tcp transport: memory registration.
 *
 * Registrations live in a per-iface table.  A registration takes no
 * remote write until it is granted (mr_grant): a grant draws 64 fresh random
 * bits (the iface's keystream, getrandom in batches) as its key and may name the one endpoint allowed to
 * write.  A remote key is (table index, grant key); the receive path checks
 * key, writer and bounds before reading a byte of payload.  Revoking (or
 * deregistering, or granting again) clears the key, so a key that outlived
 * its transfer, or one learned from an earlier grant, matches nothing.
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
    struct cfx__tcp_iface *iface;
    struct cfx__tcp_mr *mr;
    int rc;

    if (!tp_iface || !mem || !out || !mem->addr || !mem->len)
        return cfx__err(CFX_ERR_INVALID, "tcp mem_reg: NULL argument or empty region");
    if (access & ~(unsigned)(CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "tcp mem_reg: unknown access bits 0x%x", access);
    if (mem->memtype != CFX_MEMTYPE_HOST)
        return cfx__err(CFX_ERR_UNSUPPORTED, "tcp mem_reg: memory type %d is not host memory",
                        (int)mem->memtype);
    iface = cfx__tcp_iface_of(tp_iface);

    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "tcp mem_reg: out of memory");
    uint32_t idx;
    if ((rc = cfx__tp_table_add(&iface->mrs, mr, &idx, NULL)) != CFX_OK) {
        free(mr);
        return rc;
    }

    mr->super.iface = tp_iface;
    mr->super.addr = mem->addr;
    mr->super.len = mem->len;
    mr->super.memtype = mem->memtype;
    mr->access = access;
    mr->idx = idx;
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
    cfx__tp_revoked_add(&iface->revoked, mr->grant_key, mr->grant_ep);
    cfx__tp_table_remove(&iface->mrs, mr->idx);
    free(mr);
}

int cfx__tcp_mr_grant(struct cfx_tp_mr *tp_mr, struct cfx_tp_ep *tp_ep, struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    struct cfx__tcp_rkey k;

    if (!tp_mr || !out || (tp_ep && tp_ep->iface != tp_mr->iface))
        return cfx__err(CFX_ERR_INVALID, "tcp mr_grant: NULL argument or another iface's ep");
    struct cfx__tcp_mr *mr = cfx__tcp_mr_of(tp_mr);
    if (!(mr->access & CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "tcp mr_grant: region %p is not remote-writable",
                        tp_mr->addr);
    cfx__tp_revoked_add(&cfx__tcp_iface_of(tp_mr->iface)->revoked, mr->grant_key,
                        mr->grant_ep); /* a grant again ends the one before */
    mr->grant_key = cfx__keystream_next(&cfx__tcp_iface_of(tp_mr->iface)->keys);
    mr->grant_ep = tp_ep ? cfx__tcp_ep_of(tp_ep)->serial : 0;

    memset(&k, 0, sizeof(k));
    k.tag = CFX_TCP_RDESC_TAG;
    k.key_lo = htole32((uint32_t)mr->grant_key);
    k.idx = htole32(mr->idx);
    k.key_hi = htole32((uint32_t)(mr->grant_key >> 32));
    k.len = htole64((uint64_t)tp_mr->len);
    memset(out, 0, sizeof(*out));
    memcpy(out->data, &k, sizeof(k));
    out->len = (uint8_t)sizeof(k);
    return CFX_OK;
}

void cfx__tcp_mr_revoke(struct cfx_tp_mr *tp_mr)
{
    CFX_TP_THREAD_CHECK(tp_mr ? tp_mr->iface : NULL);
    if (!tp_mr)
        return;
    struct cfx__tcp_mr *mr = cfx__tcp_mr_of(tp_mr);
    cfx__tp_revoked_add(&cfx__tcp_iface_of(tp_mr->iface)->revoked, mr->grant_key, mr->grant_ep);
    mr->grant_key = 0;
    mr->grant_ep = 0;
    /* A write of it already being received keeps landing (its header was
     * checked against the grant it had); the next header is refused. */
}

int cfx__tcp_mr_pack(struct cfx_tp_mr *tp_mr, struct cfx_tp_rdesc *out)
{
    if (!tp_mr || !out)
        return cfx__err(CFX_ERR_INVALID, "tcp mr_pack: NULL argument");
    /* a registration that takes no remote write is described all the same
     * (its key matches nothing) */
    if (!(cfx__tcp_mr_of(tp_mr)->access & CFX_TP_ACCESS_REMOTE_WRITE)) {
        struct cfx__tcp_rkey k = { .tag = CFX_TCP_RDESC_TAG,
                                   .idx = htole32(cfx__tcp_mr_of(tp_mr)->idx),
                                   .len = htole64((uint64_t)tp_mr->len) };
        memset(out, 0, sizeof(*out));
        memcpy(out->data, &k, sizeof(k));
        out->len = (uint8_t)sizeof(k);
        return CFX_OK;
    }
    return cfx__tcp_mr_grant(tp_mr, NULL, out);
}

struct cfx__tcp_mr *cfx__tcp_mr_lookup(struct cfx__tcp_iface *iface, const struct cfx__tcp_ep *ep,
                                       const struct cfx__tcp_hdr *h, const char **why)
{
    uint64_t key = (uint64_t)h->key_hi << 32 | h->key_lo;
    struct cfx__tcp_mr *mr = cfx__tp_table_at(&iface->mrs, h->key_idx);

    if (unlikely(!mr || !mr->grant_key || mr->grant_key != key)) {
        *why = "no live grant with that key";
        return NULL;
    }
    if (unlikely(mr->grant_ep && mr->grant_ep != ep->serial)) {
        *why = "granted to another peer";
        return NULL;
    }
    if (unlikely(h->off > mr->super.len || h->len > mr->super.len - h->off)) {
        *why = "outside the granted bytes";
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

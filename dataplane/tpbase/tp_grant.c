/*
 * Registrations and write grants checked in software: the argument checks
 * shm, tcp and dpdk share (tpbase.h).
 */
#include "tpbase.h"

int cfx__tp_host_reg(const char *who, struct cfx_tp_iface *iface,
                     const struct cfx_tp_mem_desc *mem, unsigned access, struct cfx_tp_mr *mr)
{
    if (!iface || !mem || !mr || !mem->addr || !mem->len)
        return cfx__err(CFX_ERR_INVALID, "%s mem_reg: NULL argument or empty region", who);
    if (access & ~(unsigned)(CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "%s mem_reg: unknown access bits 0x%x", who, access);
    if (mem->memtype != CFX_MEMTYPE_HOST)
        return cfx__err(CFX_ERR_UNSUPPORTED, "%s mem_reg: cannot register %s memory", who,
                        cfx_memtype_name(mem->memtype));
    mr->iface = iface;
    mr->addr = mem->addr;
    mr->len = mem->len;
    mr->memtype = mem->memtype;
    mr->access = access;
    return CFX_OK;
}

int cfx__tp_grant_args(const char *who, const struct cfx_tp_mr *mr, const struct cfx_tp_ep *ep,
                       const struct cfx_tp_rdesc *out)
{
    if (!mr || !out || (ep && ep->iface != mr->iface))
        return cfx__err(CFX_ERR_INVALID, "%s mr_grant: NULL argument or another iface's ep",
                        who);
    if (!(mr->access & CFX_TP_ACCESS_REMOTE_WRITE))
        return cfx__err(CFX_ERR_INVALID, "%s mr_grant: region %p is not remote-writable", who,
                        mr->addr);
    return CFX_OK;
}

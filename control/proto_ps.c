/*
 * Wire form of a node's parameter-server load (struct cfx_ctl_ps_report):
 * the tail of HEARTBEAT and the body of PS_LOADS_REPLY.  Every count a
 * peer sends is bounded before anything is read under it, a block names
 * one of the servers listed before it, and no server or block comes twice
 * (each would be a metric series twice over).
 */
#include <string.h>

#include <conflux/status.h>

#include "control/proto.h"
#include "control/proto_io.h"

int cfx__msg_ps_wr(struct wr *w, const struct cfx_ctl_ps_report *ps)
{
    if (ps->nservers > CFX_CTL_PS_SERVERS_MAX || ps->nblocks > CFX_CTL_PS_BLOCKS_MAX)
        return cfx__err(CFX_ERR_INVALID,
                        "PS report of %u servers and %u blocks (at most %u "
                        "and %u)",
                        ps->nservers, ps->nblocks, CFX_CTL_PS_SERVERS_MAX, CFX_CTL_PS_BLOCKS_MAX);
    wr_u8(w, (uint8_t)ps->nservers);
    for (uint32_t i = 0; i < ps->nservers; i++) {
        const struct cfx_ctl_ps_server *s = &ps->servers[i];
        size_t n = strnlen(s->job, sizeof(s->job));
        if (n == 0 || n > CFX_CTL_PS_JOB_MAX)
            return cfx__err(CFX_ERR_INVALID,
                            "PS report: server %u's job name is empty or "
                            "longer than %u bytes",
                            i, CFX_CTL_PS_JOB_MAX);
        wr_u8(w, (uint8_t)n);
        wr_bytes(w, s->job, n);
        wr_u32(w, s->server);
        wr_u32(w, s->blocks);
        wr_u64(w, s->requests);
        wr_u64(w, s->bytes);
    }
    wr_u8(w, (uint8_t)ps->nblocks);
    for (uint32_t i = 0; i < ps->nblocks; i++) {
        const struct cfx_ctl_ps_block *b = &ps->blocks[i];
        if (b->srv >= ps->nservers)
            return cfx__err(CFX_ERR_INVALID, "PS report: block %u of server %u of %u", i, b->srv,
                            ps->nservers);
        wr_u8(w, b->srv);
        wr_u32(w, b->block);
        wr_u64(w, b->requests);
        wr_u64(w, b->bytes);
    }
    return CFX_OK;
}

void cfx__msg_ps_rd(struct rd *r, struct cfx_ctl_ps_report *ps)
{
    ps->nservers = rd_u8(r, "PS server count");
    if (r->status == CFX_OK && ps->nservers > CFX_CTL_PS_SERVERS_MAX)
        rd_fail(r, CFX_ERR_PROTO, "PS server count over CFX_CTL_PS_SERVERS_MAX");
    for (uint32_t i = 0; i < ps->nservers && r->status == CFX_OK; i++) {
        struct cfx_ctl_ps_server *s = &ps->servers[i];
        uint8_t n = rd_u8(r, "PS job name length");
        if (r->status == CFX_OK && (n == 0 || n > CFX_CTL_PS_JOB_MAX)) {
            rd_fail(r, CFX_ERR_PROTO, "PS job name length 0 or over CFX_CTL_PS_JOB_MAX");
            break;
        }
        rd_bytes(r, s->job, n, "PS job name");
        s->job[n] = '\0';
        if (r->status == CFX_OK && memchr(s->job, 0, n))
            rd_fail(r, CFX_ERR_PROTO, "PS job name with a NUL byte");
        s->server = rd_u32(r, "PS server index");
        s->blocks = rd_u32(r, "PS server blocks");
        s->requests = rd_u64(r, "PS server requests");
        s->bytes = rd_u64(r, "PS server bytes");
        for (uint32_t k = 0; k < i && r->status == CFX_OK; k++)
            if (ps->servers[k].server == s->server && !strcmp(ps->servers[k].job, s->job))
                rd_fail(r, CFX_ERR_PROTO, "PS server listed twice");
    }
    ps->nblocks = rd_u8(r, "PS block count");
    if (r->status == CFX_OK && ps->nblocks > CFX_CTL_PS_BLOCKS_MAX)
        rd_fail(r, CFX_ERR_PROTO, "PS block count over CFX_CTL_PS_BLOCKS_MAX");
    for (uint32_t i = 0; i < ps->nblocks && r->status == CFX_OK; i++) {
        struct cfx_ctl_ps_block *b = &ps->blocks[i];
        b->srv = rd_u8(r, "PS block server");
        b->block = rd_u32(r, "PS block number");
        b->requests = rd_u64(r, "PS block requests");
        b->bytes = rd_u64(r, "PS block bytes");
        if (r->status == CFX_OK && b->srv >= ps->nservers)
            rd_fail(r, CFX_ERR_PROTO, "PS block of a server the report does not list");
        for (uint32_t k = 0; k < i && r->status == CFX_OK; k++)
            if (ps->blocks[k].srv == b->srv && ps->blocks[k].block == b->block)
                rd_fail(r, CFX_ERR_PROTO, "PS block listed twice");
    }
    if (r->status != CFX_OK)
        ps->nservers = ps->nblocks = 0;
}

int cfx__msg_ps_encode(const struct cfx_msg *m, struct wr *w)
{
    if (m->type == CFX_MSG_PS_LOADS) {
        wr_u32(w, m->u.ps_cursor);
        return CFX_OK;
    }
    wr_u32(w, m->u.ps_loads.node_id);
    wr_u8(w, m->u.ps_loads.more ? 1 : 0);
    return cfx__msg_ps_wr(w, &m->u.ps_loads.ps);
}

void cfx__msg_ps_decode(struct rd *r, struct cfx_msg *m)
{
    if (m->type == CFX_MSG_PS_LOADS) {
        m->u.ps_cursor = rd_u32(r, "cursor");
        return;
    }
    m->u.ps_loads.node_id = rd_u32(r, "node");
    m->u.ps_loads.more = rd_flag(r, "more flag");
    cfx__msg_ps_rd(r, &m->u.ps_loads.ps);
}

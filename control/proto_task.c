/* Control-plane wire format of tasks and of the heartbeat's load report. */
#include "control/proto.h"
#include "control/proto_io.h"

/* A task's body: TASK_SUBMIT, TASK_PLACE, EV_TASK_RUN, TASK_ANNOUNCE.
 *   u64 task id, u64 key, u32 submitter, u32 hint node (protocol 10),
 *   name[64], u32 timeout_ms, u32 cores, u32 gpus, u64 memory, u8 flags,
 *   u32 reserve_ms, group[32], u8 nnodes + u32 each, u8 ninputs + ids,
 *   u8 nresults + ids, u16 arg_len + bytes */
static int wr_task(struct wr *w, const struct cfx_msg_task *t)
{
    if (t->nnodes > CFX_TASK_NODES_MAX || t->ninputs > CFX_TASK_IO_MAX ||
        t->nresults > CFX_TASK_IO_MAX || t->arg_len > CFX_TASK_ARG_MAX ||
        (t->arg_len && !t->arg) || (t->flags & ~CFX_PROTO_TASK_FLAGS))
        return cfx__err(CFX_ERR_INVALID, "task frame with %u nodes, %u inputs, %u results, "
                        "%u argument bytes, flags 0x%x", t->nnodes, t->ninputs, t->nresults,
                        t->arg_len, t->flags);
    wr_u64(w, t->task_id);
    wr_u64(w, t->key);
    wr_u32(w, t->submitter);
    wr_u32(w, t->hint_node);
    wr_str(w, t->name, sizeof(t->name));
    wr_u32(w, t->timeout_ms);
    wr_u32(w, t->cores);
    wr_u32(w, t->gpus);
    wr_u64(w, t->memory);
    wr_u8(w, t->flags);
    wr_u32(w, t->reserve_ms);
    wr_str(w, t->group, sizeof(t->group));
    wr_u8(w, t->nnodes);
    for (unsigned i = 0; i < t->nnodes; i++)
        wr_u32(w, t->nodes[i]);
    wr_u8(w, t->ninputs);
    for (unsigned i = 0; i < t->ninputs; i++)
        wr_bytes(w, t->inputs[i].bytes, CFX_OBJECT_ID_LEN);
    wr_u8(w, t->nresults);
    for (unsigned i = 0; i < t->nresults; i++)
        wr_bytes(w, t->results[i].bytes, CFX_OBJECT_ID_LEN);
    wr_u16(w, t->arg_len);
    wr_bytes(w, t->arg, t->arg_len);
    return CFX_OK;
}

static void rd_task(struct rd *r, struct cfx_msg_task *t)
{
    t->task_id = rd_u64(r, "task id");
    t->key = rd_u64(r, "task key");
    t->submitter = rd_u32(r, "submitter");
    t->hint_node = rd_u32(r, "hint node");
    rd_str(r, t->name, sizeof(t->name), "function name");
    t->timeout_ms = rd_u32(r, "timeout");
    t->cores = rd_u32(r, "cores");
    t->gpus = rd_u32(r, "gpus");
    t->memory = rd_u64(r, "memory");
    t->flags = rd_u8(r, "flags");
    if (t->flags & ~CFX_PROTO_TASK_FLAGS)
        rd_fail(r, CFX_ERR_PROTO, "unknown task flags");
    t->reserve_ms = rd_u32(r, "reserve");
    rd_str(r, t->group, sizeof(t->group), "group");
    t->nnodes = rd_u8(r, "node count");
    if (t->nnodes > CFX_TASK_NODES_MAX)
        rd_fail(r, CFX_ERR_PROTO, "node count");
    for (unsigned i = 0; i < t->nnodes && r->status == CFX_OK; i++)
        t->nodes[i] = rd_u32(r, "node");
    t->ninputs = rd_u8(r, "input count");
    if (t->ninputs > CFX_TASK_IO_MAX)
        rd_fail(r, CFX_ERR_PROTO, "input count");
    for (unsigned i = 0; i < t->ninputs && r->status == CFX_OK; i++)
        rd_bytes(r, t->inputs[i].bytes, CFX_OBJECT_ID_LEN, "input");
    t->nresults = rd_u8(r, "result count");
    if (t->nresults > CFX_TASK_IO_MAX)
        rd_fail(r, CFX_ERR_PROTO, "result count");
    for (unsigned i = 0; i < t->nresults && r->status == CFX_OK; i++)
        rd_bytes(r, t->results[i].bytes, CFX_OBJECT_ID_LEN, "result");
    t->arg_len = rd_u16(r, "argument length");
    if (t->arg_len > CFX_TASK_ARG_MAX)
        rd_fail(r, CFX_ERR_PROTO, "argument length");
    t->arg = t->arg_len ? rd_take(r, t->arg_len, "argument") : NULL;
    if (r->status != CFX_OK) {
        t->nnodes = t->ninputs = t->nresults = 0;
        t->arg_len = 0;
        t->arg = NULL;
    }
}

void cfx__msg_load_wr(struct wr *w, const struct cfx_msg_load *l)
{
    unsigned ntp = l->ntp <= CFX_LOAD_TPS_MAX ? l->ntp : CFX_LOAD_TPS_MAX;
    wr_u32(w, l->load_milli);
    wr_u64(w, l->mem_avail);
    wr_u64(w, l->arena_used);
    wr_u32(w, l->tasks_running);
    wr_u8(w, (uint8_t)ntp);
    for (unsigned i = 0; i < CFX_LOAD_TPS_MAX; i++) {
        if (i < ntp) {
            wr_str(w, l->tp[i].name, sizeof(l->tp[i].name));
            wr_u64(w, l->tp[i].tx_bytes);
            wr_u64(w, l->tp[i].rx_bytes);
        } else {
            wr_zero(w, CFX_TP_NAME_MAX + 16);
        }
    }
    wr_u32(w, l->uploads_active);
    wr_u32(w, l->xfers_in_active);
    wr_u64(w, l->puts);
    wr_u64(w, l->gets);
    wr_u64(w, l->uploads);
    wr_u64(w, l->failovers);
    wr_u64(w, l->reduce_reroutes);
    wr_u64(w, l->writes_refused);
    wr_u64(w, l->link_bw);
    wr_u64(w, l->link_lat_ns);
}

void cfx__msg_load_rd(struct rd *r, struct cfx_msg_load *l)
{
    memset(l, 0, sizeof(*l));
    l->load_milli = rd_u32(r, "load");
    l->mem_avail = rd_u64(r, "available memory");
    l->arena_used = rd_u64(r, "arena in use");
    l->tasks_running = rd_u32(r, "tasks running");
    l->ntp = rd_u8(r, "transport count");
    if (l->ntp > CFX_LOAD_TPS_MAX)
        rd_fail(r, CFX_ERR_PROTO, "transport count over CFX_LOAD_TPS_MAX");
    for (unsigned i = 0; i < CFX_LOAD_TPS_MAX; i++) {
        rd_str(r, l->tp[i].name, sizeof(l->tp[i].name), "transport name not terminated");
        l->tp[i].tx_bytes = rd_u64(r, "bytes sent");
        l->tp[i].rx_bytes = rd_u64(r, "bytes received");
    }
    l->uploads_active = rd_u32(r, "uploads active");
    l->xfers_in_active = rd_u32(r, "transfers in active");
    l->puts = rd_u64(r, "puts");
    l->gets = rd_u64(r, "gets");
    l->uploads = rd_u64(r, "uploads");
    l->failovers = rd_u64(r, "failovers");
    l->reduce_reroutes = rd_u64(r, "reduce reroutes");
    l->writes_refused = rd_u64(r, "writes refused");
    l->link_bw = rd_u64(r, "link bandwidth");
    l->link_lat_ns = rd_u64(r, "link latency");
}

static void wr_taskrec(struct wr *w, const struct cfx_ctl_task_rec *t)
{
    wr_u64(w, t->id);
    wr_str(w, t->name, sizeof(t->name));
    wr_u8(w, t->state);
    wr_u32(w, t->node_id);
    wr_u32(w, t->submitter);
    wr_u32(w, t->placements);
    wr_u32(w, (uint32_t)t->status);
    wr_u32(w, t->age_ms);
    wr_u32(w, t->cores);
    wr_u32(w, t->gpus);
    wr_u64(w, t->memory);
    wr_u8(w, t->ninputs);
    wr_u8(w, t->nresults);
    wr_bytes(w, t->result.bytes, CFX_OBJECT_ID_LEN);
    wr_str(w, t->text, sizeof(t->text));
}

static void rd_taskrec(struct rd *r, struct cfx_ctl_task_rec *t)
{
    memset(t, 0, sizeof(*t));
    t->id = rd_u64(r, "task id");
    rd_str(r, t->name, sizeof(t->name), "function name not terminated");
    t->state = rd_u8(r, "task state");
    if (t->state > CFX_CTL_TASK_DONE)
        rd_fail(r, CFX_ERR_PROTO, "unknown task state");
    t->node_id = rd_u32(r, "node");
    t->submitter = rd_u32(r, "submitter");
    t->placements = rd_u32(r, "placements");
    t->status = (int32_t)rd_u32(r, "status");
    if (t->status > 0 || t->status <= CFX_STATUS_LAST)
        rd_fail(r, CFX_ERR_PROTO, "task status out of range");
    t->age_ms = rd_u32(r, "age");
    t->cores = rd_u32(r, "cores");
    t->gpus = rd_u32(r, "gpus");
    t->memory = rd_u64(r, "memory");
    t->ninputs = rd_u8(r, "input count");
    t->nresults = rd_u8(r, "result count");
    if (t->ninputs > CFX_TASK_IO_MAX || t->nresults > CFX_TASK_IO_MAX)
        rd_fail(r, CFX_ERR_PROTO, "input or result count over CFX_TASK_IO_MAX");
    rd_bytes(r, t->result.bytes, CFX_OBJECT_ID_LEN, "result id");
    rd_str(r, t->text, sizeof(t->text), "task text not terminated");
}

void cfx__msg_task_at(const struct cfx_msg *m, uint32_t i, struct cfx_ctl_task_rec *out)
{
    struct rd r = { m->u.tpage.raw + (size_t)i * CFX_PROTO_TASKREC_WIRE, CFX_PROTO_TASKREC_WIRE,
                    0, CFX_OK, "task record" };
    rd_taskrec(&r, out);
}

int cfx__msg_task_encode(const struct cfx_msg *m, struct wr *w)
{
    switch (m->type) {
    case CFX_MSG_HEARTBEAT: {
        const struct cfx_msg_heartbeat *hb = &m->u.hb;
        if (hb->nprogress > CFX_CTL_PROGRESS_MAX)
            return cfx__err(CFX_ERR_INVALID, "heartbeat with %u progress reports (at most %u)",
                            hb->nprogress, CFX_CTL_PROGRESS_MAX);
        cfx__msg_load_wr(w, &hb->load);
        wr_u8(w, (uint8_t)hb->nprogress);
        for (uint32_t i = 0; i < hb->nprogress; i++) {
            if (hb->progress[i].ready == CFX_CTL_READY_UNKNOWN)
                return cfx__err(CFX_ERR_INVALID, "heartbeat progress report %u without a "
                                "byte count", i);
            wr_bytes(w, hb->progress[i].id.bytes, CFX_OBJECT_ID_LEN);
            wr_u64(w, hb->progress[i].ready);
        }
        if (hb->npeers > CFX_CTL_PEERS_MAX)
            return cfx__err(CFX_ERR_INVALID, "heartbeat with %u peers (at most %u)", hb->npeers,
                            CFX_CTL_PEERS_MAX);
        wr_u8(w, (uint8_t)hb->npeers);
        for (uint32_t i = 0; i < hb->npeers; i++) {
            if (hb->peers[i].tp >= hb->load.ntp)
                return cfx__err(CFX_ERR_INVALID, "heartbeat peer %u on transport %u of %u", i,
                                hb->peers[i].tp, hb->load.ntp);
            wr_u32(w, hb->peers[i].peer);
            wr_u8(w, hb->peers[i].tp);
            wr_u64(w, hb->peers[i].tx_bytes);
            wr_u64(w, hb->peers[i].rx_bytes);
        }
        return cfx__msg_ps_wr(w, &hb->ps);
    }
    case CFX_MSG_TASKS:
        wr_u64(w, m->u.task_cursor);
        return CFX_OK;
    case CFX_MSG_TASKS_REPLY: {
        const struct cfx_msg_tpage *pg = &m->u.tpage;
        if (pg->count > CFX_PROTO_TASKS_PAGE || (pg->count && !pg->recs_in))
            return cfx__err(CFX_ERR_INVALID, "task page of %u records (at most %u)", pg->count,
                            CFX_PROTO_TASKS_PAGE);
        wr_u32(w, pg->count);
        wr_u64(w, pg->next);
        wr_u8(w, pg->more ? 1 : 0);
        for (uint32_t i = 0; i < pg->count; i++)
            wr_taskrec(w, &pg->recs_in[i]);
        return CFX_OK;
    }
    case CFX_MSG_TASK_REG:
        if (!m->u.task_reg.name[0])
            return cfx__err(CFX_ERR_INVALID, "TASK_REG without a function name");
        wr_str(w, m->u.task_reg.name, sizeof(m->u.task_reg.name));
        wr_u32(w, m->u.task_reg.cores);
        wr_u32(w, m->u.task_reg.gpus);
        wr_u64(w, m->u.task_reg.memory);
        return CFX_OK;
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_ANNOUNCE:
        return wr_task(w, &m->u.task);
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_TASK_DONE: {
        const struct cfx_msg_task_st *st = &m->u.task_st;
        size_t n = strnlen(st->text, CFX_PROTO_TEXT_MAX - 1);
        if (st->status > 0 || st->status <= CFX_STATUS_LAST)
            return cfx__err(CFX_ERR_INVALID, "%s frame with status %d",
                            cfx__msg_type_name(m->type), st->status);
        wr_u64(w, st->task_id);
        wr_u32(w, st->node_id);
        wr_u32(w, (uint32_t)st->status);
        wr_u32(w, st->timeout_ms);
        wr_u16(w, (uint16_t)n);
        wr_bytes(w, st->text, n);
        return CFX_OK;
    }
    default:
        return cfx__err(CFX_ERR_INVALID, "cannot encode message type %u", m->type);
    }
}

void cfx__msg_task_decode(struct rd *r, struct cfx_msg *m)
{
    switch (m->type) {
    case CFX_MSG_HEARTBEAT: {
        struct cfx_msg_heartbeat *hb = &m->u.hb;
        cfx__msg_load_rd(r, &hb->load);
        hb->nprogress = rd_u8(r, "progress count");
        if (r->status == CFX_OK && hb->nprogress > CFX_CTL_PROGRESS_MAX) {
            rd_fail(r, CFX_ERR_PROTO, "progress count over CFX_CTL_PROGRESS_MAX");
            hb->nprogress = 0;
            break;
        }
        for (uint32_t i = 0; i < hb->nprogress && r->status == CFX_OK; i++) {
            rd_bytes(r, hb->progress[i].id.bytes, CFX_OBJECT_ID_LEN, "progress object id");
            hb->progress[i].ready = rd_u64(r, "progress bytes");
            if (r->status == CFX_OK && hb->progress[i].ready == CFX_CTL_READY_UNKNOWN)
                rd_fail(r, CFX_ERR_PROTO, "progress bytes of UINT64_MAX");
        }
        hb->npeers = rd_u8(r, "peer count");
        if (r->status == CFX_OK && hb->npeers > CFX_CTL_PEERS_MAX)
            rd_fail(r, CFX_ERR_PROTO, "peer count over CFX_CTL_PEERS_MAX");
        for (uint32_t i = 0; i < hb->npeers && r->status == CFX_OK; i++) {
            hb->peers[i].peer = rd_u32(r, "peer node");
            hb->peers[i].tp = rd_u8(r, "peer transport");
            hb->peers[i].tx_bytes = rd_u64(r, "peer bytes sent");
            hb->peers[i].rx_bytes = rd_u64(r, "peer bytes received");
            if (r->status == CFX_OK && hb->peers[i].tp >= hb->load.ntp)
                rd_fail(r, CFX_ERR_PROTO, "peer transport beyond the load's transports");
        }
        cfx__msg_ps_rd(r, &hb->ps);
        if (r->status != CFX_OK)
            hb->nprogress = hb->npeers = hb->ps.nservers = hb->ps.nblocks = 0;
        break;
    }
    case CFX_MSG_TASKS:
        m->u.task_cursor = rd_u64(r, "cursor");
        break;
    case CFX_MSG_TASKS_REPLY: {
        struct cfx_msg_tpage *pg = &m->u.tpage;
        pg->count = rd_u32(r, "record count");
        pg->next = rd_u64(r, "next cursor");
        pg->more = rd_flag(r, "more flag");
        pg->recs_in = NULL;
        pg->raw = NULL;
        if (r->status != CFX_OK)
            break;
        /* bounded count, so count * size cannot overflow */
        if (pg->count > CFX_PROTO_TASKS_PAGE ||
            (size_t)pg->count * CFX_PROTO_TASKREC_WIRE != r->len - r->off) {
            rd_fail(r, CFX_ERR_PROTO, pg->count > CFX_PROTO_TASKS_PAGE
                                          ? "record count over the page limit"
                                          : "record count does not match the payload length");
            pg->count = 0;
            break;
        }
        pg->raw = r->p + r->off;
        for (uint32_t i = 0; i < pg->count && r->status == CFX_OK; i++) {
            struct cfx_ctl_task_rec tmp;
            rd_taskrec(r, &tmp);
        }
        if (r->status != CFX_OK) {
            pg->count = 0;
            pg->raw = NULL;
        }
        break;
    }
    case CFX_MSG_TASK_REG:
        rd_str(r, m->u.task_reg.name, sizeof(m->u.task_reg.name), "function name");
        if (r->status == CFX_OK && !m->u.task_reg.name[0])
            rd_fail(r, CFX_ERR_PROTO, "empty function name");
        m->u.task_reg.cores = rd_u32(r, "cores");
        m->u.task_reg.gpus = rd_u32(r, "gpus");
        m->u.task_reg.memory = rd_u64(r, "memory");
        break;
    case CFX_MSG_TASK_SUBMIT:
    case CFX_MSG_TASK_PLACE:
    case CFX_MSG_EV_TASK_RUN:
    case CFX_MSG_TASK_ANNOUNCE:
        rd_task(r, &m->u.task);
        if (m->type != CFX_MSG_TASK_PLACE && (m->u.task.flags & CFX_PROTO_TASK_DATA))
            rd_fail(r, CFX_ERR_PROTO, "data placement flag on a task");
        break;
    case CFX_MSG_TASK_REPLY:
    case CFX_MSG_TASK_WAIT:
    case CFX_MSG_TASK_DONE: {
        struct cfx_msg_task_st *st = &m->u.task_st;
        st->task_id = rd_u64(r, "task id");
        st->node_id = rd_u32(r, "node id");
        st->status = (int32_t)rd_u32(r, "status");
        if (r->status == CFX_OK && (st->status > 0 || st->status <= CFX_STATUS_LAST))
            rd_fail(r, CFX_ERR_PROTO, "status");
        st->timeout_ms = rd_u32(r, "timeout");
        uint16_t n = rd_u16(r, "text length");
        if (n >= CFX_PROTO_TEXT_MAX)
            rd_fail(r, CFX_ERR_TOO_BIG, "text length");
        const uint8_t *q = rd_take(r, n, "text");
        if (q && memchr(q, 0, n))
            rd_fail(r, CFX_ERR_PROTO, "NUL inside the text");
        if (q && r->status == CFX_OK) {
            memcpy(st->text, q, n);
            st->text[n] = '\0';
        } else {
            st->text[0] = '\0';
        }
        break;
    }
    default:
        rd_fail(r, CFX_ERR_PROTO, "unknown type");
        break;
    }
}

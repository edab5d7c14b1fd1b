/*
 * The control client's admin queries (rdmactl and tests): the coordinator's
 * status and the listings of nodes, objects and tasks, page by page.  Built
 * on cfx__ctl_request() (client.c), so any thread may call them.
 */
#include "control/client.h"

#include <stdio.h>
#include <stdlib.h>

#include <conflux/status.h>

#include "control/proto.h"
#include "dataplane/common/util.h"

int cfx__ctl_node_get(struct cfx_ctl *ctl, uint32_t node_id, struct cfx_node_rec *out,
                      uint64_t deadline_ns)
{
    char what[64];
    struct cfx_msg m = { .type = CFX_MSG_NODE_GET }, reply;
    void *frame;

    if (!ctl || !out)
        return cfx__err(CFX_ERR_INVALID, "node_get: NULL argument");
    snprintf(what, sizeof(what), "query of node %u", node_id);
    m.u.node_get.node_id = node_id;
    int rc = cfx__ctl_request(ctl, &m, deadline_ns, what, CFX_MSG_NODE_REPLY, &reply, &frame);
    if (rc != CFX_OK)
        return rc;
    *out = reply.u.join;
    free(frame);
    return CFX_OK;
}

int cfx__ctl_status(struct cfx_ctl *ctl, struct cfx_ctl_status *out, uint64_t deadline_ns)
{
    struct cfx_msg m = { .type = CFX_MSG_STATUS }, reply;
    void *frame;

    if (!ctl || !out)
        return cfx__err(CFX_ERR_INVALID, "status: NULL argument");
    int rc = cfx__ctl_request(ctl, &m, deadline_ns, "status query", CFX_MSG_STATUS_REPLY, &reply,
                              &frame);
    if (rc != CFX_OK)
        return rc;
    *out = reply.u.status;
    free(frame);
    return CFX_OK;
}

enum list_kind { LIST_NODES, LIST_OBJECTS, LIST_TASKS };

/* Every page of a listing, by cursor, into one malloc'd array.  Nodes and
 * objects page by a 32-bit cursor (cfx_msg_page), tasks by their 64-bit id
 * (cfx_msg_tpage). */
static int list_all(struct cfx_ctl *ctl, enum list_kind kind, void **out, size_t *n,
                    uint64_t deadline)
{
    static const struct {
        const char *what;
        size_t recsz;
        uint8_t req, reply;
    } k[] = {
        [LIST_NODES] = { "node listing", sizeof(struct cfx_node_rec), CFX_MSG_NODES,
                         CFX_MSG_NODES_REPLY },
        [LIST_OBJECTS] = { "object listing", sizeof(struct cfx_ctl_obj_rec), CFX_MSG_OBJECTS,
                           CFX_MSG_OBJECTS_REPLY },
        [LIST_TASKS] = { "task listing", sizeof(struct cfx_ctl_task_rec), CFX_MSG_TASKS,
                         CFX_MSG_TASKS_REPLY },
    };
    const char *what = k[kind].what;
    size_t recsz = k[kind].recsz;
    uint8_t *all = NULL;
    size_t count = 0;
    uint64_t cursor = 0;
    int rc;

    if (!ctl || !out || !n)
        return cfx__err(CFX_ERR_INVALID, "%s: NULL argument", what);
    for (;;) {
        struct cfx_msg m = { .type = k[kind].req }, reply;
        void *frame;
        if (kind == LIST_TASKS)
            m.u.task_cursor = cursor;
        else
            m.u.list.cursor = (uint32_t)cursor;
        rc = cfx__ctl_request(ctl, &m, deadline, what, k[kind].reply, &reply, &frame);
        if (rc != CFX_OK)
            goto err_free;
        int tasks = kind == LIST_TASKS;
        uint32_t pc = tasks ? reply.u.tpage.count : reply.u.page.count;
        uint64_t next = tasks ? reply.u.tpage.next : reply.u.page.next;
        int more = tasks ? reply.u.tpage.more : reply.u.page.more;
        /* a page that says more must make progress, or a peer could keep us here */
        if (more && (pc == 0 || (tasks && next <= cursor))) {
            free(frame);
            rc = cfx__err(CFX_ERR_PROTO, "%s from coordinator %s: a page of %u records says "
                          "more follow but does not advance", what, cfx__ctl_coord_addr(ctl), pc);
            goto err_free;
        }
        uint8_t *p = realloc(all, (count + pc + 1) * recsz);
        if (!p) {
            free(frame);
            rc = cfx__err(CFX_ERR_NOMEM, "%s: no memory for %zu records", what, count + pc);
            goto err_free;
        }
        all = p;
        for (uint32_t i = 0; i < pc; i++) {
            void *rec = all + (count + i) * recsz;
            if (kind == LIST_NODES)
                cfx__msg_node_at(&reply, i, rec);
            else if (kind == LIST_OBJECTS)
                cfx__msg_obj_at(&reply, i, rec);
            else
                cfx__msg_task_at(&reply, i, rec);
        }
        count += pc;
        cursor = next;
        free(frame);
        if (!more)
            break;
    }
    *out = all;
    *n = count;
    return CFX_OK;

err_free:
    free(all);
    return rc;
}

int cfx__ctl_tasks(struct cfx_ctl *ctl, struct cfx_ctl_task_rec **out, size_t *n,
                   uint64_t deadline_ns)
{
    return list_all(ctl, LIST_TASKS, (void **)out, n, deadline_ns);
}

int cfx__ctl_nodes(struct cfx_ctl *ctl, struct cfx_node_rec **out, size_t *n,
                   uint64_t deadline_ns)
{
    return list_all(ctl, LIST_NODES, (void **)out, n, deadline_ns);
}

int cfx__ctl_objects(struct cfx_ctl *ctl, struct cfx_ctl_obj_rec **out, size_t *n,
                     uint64_t deadline_ns)
{
    return list_all(ctl, LIST_OBJECTS, (void **)out, n, deadline_ns);
}

int cfx__ctl_ps_loads(struct cfx_ctl *ctl, struct cfx_ctl_ps_node **out, size_t *n,
                      uint64_t deadline_ns)
{
    struct cfx_ctl_ps_node *all = NULL;
    size_t count = 0;
    uint32_t cursor = 0;
    int rc = CFX_OK;

    if (!ctl || !out || !n)
        return cfx__err(CFX_ERR_INVALID, "PS load listing: NULL argument");
    for (;;) {
        struct cfx_msg m = { .type = CFX_MSG_PS_LOADS, .u.ps_cursor = cursor }, reply;
        void *frame;
        rc = cfx__ctl_request(ctl, &m, deadline_ns, "PS load listing", CFX_MSG_PS_LOADS_REPLY,
                              &reply, &frame);
        if (rc != CFX_OK)
            goto err_free;
        const struct cfx_msg_ps_loads *pl = &reply.u.ps_loads;
        if (!pl->node_id) {
            free(frame);
            break;
        }
        /* the cursor must advance, or a peer could keep us here */
        if (pl->node_id <= cursor) {
            free(frame);
            rc = cfx__err(CFX_ERR_PROTO, "PS load listing from coordinator %s: node %u after "
                          "cursor %u", cfx__ctl_coord_addr(ctl), pl->node_id, cursor);
            goto err_free;
        }
        struct cfx_ctl_ps_node *p = realloc(all, (count + 1) * sizeof(*all));
        if (!p) {
            free(frame);
            rc = cfx__err(CFX_ERR_NOMEM, "PS load listing: no memory for %zu nodes", count + 1);
            goto err_free;
        }
        all = p;
        all[count++] = (struct cfx_ctl_ps_node){ .node_id = pl->node_id, .ps = pl->ps };
        cursor = pl->node_id;
        int more = pl->more;
        free(frame);
        if (!more)
            break;
    }
    *out = all;
    *n = count;
    return CFX_OK;

err_free:
    free(all);
    return rc;
}

/*
 * The coordinator client's object-directory requests: puts (own, copies,
 * durable, fire-and-forget), lookups, transfer ends and deletes.  The
 * connection, its reader and the answers to fire-and-forget puts are
 * client.c's.
 */
#include "control/client.h"
#include "control/client_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"
#include "dataplane/engine/objname.h"

/* ------------------------------------------------------------------------ */
/* Requests                                                                  */

/* A request whose answer is a plain OK. */
static int expect_ok(struct cfx_ctl *ctl, struct cfx_msg *req, uint64_t deadline,
                     const char *what)
{
    return cfx__ctl_request(ctl, req, deadline, what, CFX_MSG_OK, NULL, NULL);
}

/* A fire-and-forget request (its refusal, if any, comes back unasked for):
 * a fresh request id, sent within four heartbeats. */
static int send_async(struct cfx_ctl *ctl, struct cfx_msg *m, const char *what)
{
    pthread_mutex_lock(&ctl->lock);
    m->req_id = ++ctl->next_req;
    pthread_mutex_unlock(&ctl->lock);
    return cfx__ctl_send(ctl, m, cfx__deadline_ns((int)cfx__ctl_heartbeat_ms(ctl) * 4), what);
}

static int obj_put(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                   uint32_t chunk_size, const void *data, bool durable, bool again,
                   uint32_t copy_of, uint64_t tag, uint64_t deadline_ns)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_PUT };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "put: NULL client or object id");
    snprintf(what, sizeof(what), "%sput of object %s", durable ? "durable " : "",
             cfx__ctl_idhex(id, hex));
    if (data && size > CFX_OBJECT_INLINE_MAX)
        return cfx__ctl_err(ctl, CFX_ERR_TOO_BIG, what, "only objects up to %u bytes go inline",
                       CFX_OBJECT_INLINE_MAX);
    if (durable && !data && size)
        return cfx__ctl_err(ctl, CFX_ERR_INVALID, what, "only inline objects can be durable");
    m.u.put.id = *id;
    m.u.put.size = size;
    m.u.put.chunk_size = chunk_size;
    m.u.put.has_data = data != NULL || size == 0;
    m.u.put.durable = durable ? 1 : 0;
    m.u.put.again = again ? 1 : 0;
    m.u.put.data = m.u.put.has_data ? data : NULL;
    m.u.put.tag = tag;
    if (copy_of) {
        m.u.put.copy = 1;
        m.u.put.putter = copy_of;
        m.u.put.has_data = 0;
        m.u.put.data = NULL;
    }
    cfx__objname_lookup(id, m.u.put.name, sizeof(m.u.put.name));
    return expect_ok(ctl, &m, deadline_ns, what);
}

int cfx__ctl_obj_put(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                     uint32_t chunk_size, const void *data, uint64_t deadline_ns)
{
    return obj_put(ctl, id, size, chunk_size, data, false, false, 0, 0, deadline_ns);
}

int cfx__ctl_obj_put_own(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                            uint32_t chunk_size, const void *data, uint64_t tag,
                            uint64_t deadline_ns)
{
    return obj_put(ctl, id, size, chunk_size, data, false, true, 0, tag, deadline_ns);
}

int cfx__ctl_obj_put_copy(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                          uint32_t chunk_size, uint32_t putter, uint64_t tag,
                          uint64_t deadline_ns)
{
    if (!putter)
        return cfx__err(CFX_ERR_INVALID, "put of a copy: putter node 0");
    return obj_put(ctl, id, size, chunk_size, NULL, false, true, putter, tag, deadline_ns);
}

int cfx__ctl_obj_put_durable(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                             uint64_t size, uint32_t chunk_size, const void *data,
                             uint64_t deadline_ns)
{
    return obj_put(ctl, id, size, chunk_size, data, true, false, 0, 0, deadline_ns);
}

static int obj_lookup(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                      const uint32_t *exclude, unsigned nexclude, unsigned want,
                      uint64_t deadline_ns, bool no_wait, struct cfx_ctl_source *out);

int cfx__ctl_obj_lookup(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                        const uint32_t *exclude, unsigned nexclude, uint64_t deadline_ns,
                        struct cfx_ctl_source *out)
{
    return obj_lookup(ctl, id, exclude, nexclude, 0, deadline_ns, false, out);
}

int cfx__ctl_obj_lookup_sources(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                                const uint32_t *exclude, unsigned nexclude, unsigned want,
                                uint64_t deadline_ns, struct cfx_ctl_source *out)
{
    return obj_lookup(ctl, id, exclude, nexclude, CFX_MIN(want, CFX_PROTO_EXTRA_MAX),
                      deadline_ns, false, out);
}

int cfx__ctl_obj_lookup_now(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                            const uint32_t *exclude, unsigned nexclude, uint64_t deadline_ns,
                            struct cfx_ctl_source *out)
{
    return obj_lookup(ctl, id, exclude, nexclude, 0, deadline_ns, true, out);
}

static int obj_lookup(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                      const uint32_t *exclude, unsigned nexclude, unsigned want,
                      uint64_t deadline_ns, bool no_wait, struct cfx_ctl_source *out)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_LOOKUP };
    struct ctl_call call;
    int rc;

    if (!ctl || !id || !out || (nexclude && !exclude))
        return cfx__err(CFX_ERR_INVALID, "lookup: NULL argument");
    snprintf(what, sizeof(what), "lookup of object %s", cfx__ctl_idhex(id, hex));
    if (nexclude > CFX_PROTO_EXCLUDE_MAX)
        return cfx__ctl_err(ctl, CFX_ERR_INVALID, what, "%u nodes excluded (at most %u)", nexclude,
                       CFX_PROTO_EXCLUDE_MAX);
    memset(out, 0, sizeof(*out));
    m.u.lookup.id = *id;
    if (no_wait) {
        m.u.lookup.timeout_ms = 0; /* answer now: a holder or CFX_ERR_TIMEOUT */
    } else if (deadline_ns == UINT64_MAX) {
        m.u.lookup.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    } else {
        int ms = cfx__ms_left(deadline_ns);
        m.u.lookup.timeout_ms = (uint32_t)(ms < 0 ? 0 : ms);
    }
    m.u.lookup.nexclude = nexclude;
    if (nexclude)
        memcpy(m.u.lookup.exclude, exclude, nexclude * sizeof(*exclude));
    m.u.lookup.want = (uint8_t)want;

    rc = cfx__ctl_call(ctl, &m, deadline_ns, &call, what);
    if (rc != CFX_OK)
        return rc;
    if (call.reply.type != CFX_MSG_LOOKUP_REPLY ||
        memcmp(call.reply.u.lookup_reply.id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
        return cfx__ctl_unexpected(ctl, &call, what);
    out->size = call.reply.u.lookup_reply.size;
    out->chunk_size = call.reply.u.lookup_reply.chunk_size;
    out->is_inline = call.reply.u.lookup_reply.is_inline;
    out->complete = call.reply.u.lookup_reply.complete;
    out->putter = call.reply.u.lookup_reply.putter;
    out->tag = call.reply.u.lookup_reply.tag;
    if (out->is_inline) {
        if (out->size) {
            out->data = malloc((size_t)out->size);
            if (!out->data) {
                free(call.frame);
                return cfx__ctl_err(ctl, CFX_ERR_NOMEM, what, "no memory for %llu inline bytes",
                               (unsigned long long)out->size);
            }
            memcpy(out->data, call.reply.u.lookup_reply.data, (size_t)out->size);
        }
    } else {
        out->node = call.reply.u.lookup_reply.node;
        out->nextra = call.reply.u.lookup_reply.nextra;
        memcpy(out->extra, call.reply.u.lookup_reply.extra, out->nextra * sizeof(out->extra[0]));
    }
    free(call.frame);
    return CFX_OK;
}

int cfx__ctl_obj_done(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint32_t source_node,
                      int complete, uint64_t deadline_ns)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_DONE };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "done: NULL client or object id");
    snprintf(what, sizeof(what), "transfer end of object %s", cfx__ctl_idhex(id, hex));
    m.u.done.id = *id;
    m.u.done.source_node = source_node;
    m.u.done.complete = complete ? 1 : 0;
    return expect_ok(ctl, &m, deadline_ns, what);
}

int cfx__ctl_obj_done_async(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                            uint32_t source_node, int complete)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_DONE };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "done: NULL client or object id");
    if (cfx__ctl_broken(ctl))
        return cfx__ctl_err(ctl, CFX_ERR_CONNECT, "transfer end", "connection lost");
    snprintf(what, sizeof(what), "transfer end of object %s", cfx__ctl_idhex(id, hex));
    m.u.done.id = *id;
    m.u.done.source_node = source_node;
    m.u.done.complete = complete ? 1 : 0;
    return send_async(ctl, &m, what);
}

int cfx__ctl_obj_put_async(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                           uint32_t chunk_size, uint32_t copy_of)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_PUT };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "put: NULL client or object id");
    if (cfx__ctl_broken(ctl))
        return cfx__ctl_err(ctl, CFX_ERR_CONNECT, "put", "connection lost");
    snprintf(what, sizeof(what), "put of %sobject %s", copy_of ? "a copy of " : "",
             cfx__ctl_idhex(id, hex));
    m.u.put.id = *id;
    m.u.put.size = size;
    m.u.put.chunk_size = chunk_size;
    m.u.put.has_data = size == 0 && !copy_of;
    m.u.put.copy = copy_of != 0;
    m.u.put.again = copy_of != 0;
    m.u.put.putter = copy_of;
    cfx__objname_lookup(id, m.u.put.name, sizeof(m.u.put.name));
    pthread_mutex_lock(&ctl->lock);
    m.req_id = ++ctl->next_req;
    cfx__ctl_aput_add(ctl, m.req_id, id); /* before the answer can come */
    pthread_mutex_unlock(&ctl->lock);
    int rc = cfx__ctl_send(ctl, &m, cfx__deadline_ns((int)cfx__ctl_heartbeat_ms(ctl) * 4), what);
    if (rc != CFX_OK) {
        pthread_mutex_lock(&ctl->lock);
        cfx__ctl_aput_unsent(ctl, m.req_id);
        pthread_mutex_unlock(&ctl->lock);
    }
    return rc;
}

int cfx__ctl_obj_delete_async(struct cfx_ctl *ctl, const struct cfx_object_id *id)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_DELETE };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "delete: NULL client or object id");
    if (cfx__ctl_broken(ctl))
        return cfx__ctl_err(ctl, CFX_ERR_CONNECT, "delete", "connection lost");
    snprintf(what, sizeof(what), "delete of object %s", cfx__ctl_idhex(id, hex));
    m.u.del.id = *id;
    m.u.del.end = 1;
    return send_async(ctl, &m, what);
}

static int obj_delete(struct cfx_ctl *ctl, const struct cfx_object_id *id, bool end,
                      uint64_t put_below, uint64_t deadline_ns, const char *verb)
{
    char what[96], hex[CFX_OBJECT_ID_HEX_LEN];
    struct cfx_msg m = { .type = CFX_MSG_OBJ_DELETE };

    if (!ctl || !id)
        return cfx__err(CFX_ERR_INVALID, "delete: NULL client or object id");
    snprintf(what, sizeof(what), "%s of object %s", verb, cfx__ctl_idhex(id, hex));
    m.u.del.id = *id;
    m.u.del.end = end;
    m.u.del.put_below = put_below;
    return expect_ok(ctl, &m, deadline_ns, what);
}

int cfx__ctl_obj_delete(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                        uint64_t deadline_ns)
{
    return obj_delete(ctl, id, true, 0, deadline_ns, "delete");
}

int cfx__ctl_obj_delete_before(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                               uint64_t put_below, uint64_t deadline_ns)
{
    return obj_delete(ctl, id, true, put_below, deadline_ns, "delete");
}

int cfx__ctl_obj_put_withdraw(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                              uint64_t tag, uint64_t deadline_ns)
{
    /* a drop takes no object its submitter may end: only this node's put,
     * and of its puts none begun after this one */
    return obj_delete(ctl, id, false, tag + 1, deadline_ns, "withdrawal of the failed put");
}

int cfx__ctl_obj_drop(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                      uint64_t deadline_ns)
{
    return obj_delete(ctl, id, false, 0, deadline_ns, "drop of the copy");
}


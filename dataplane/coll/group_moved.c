/*
 * Groups: a rank that came back as another node (coll.h cfx__group_moved()).
 */
#include "coll.h"

#include "dataplane/engine/engine.h"

/*
 * A rank whose process was stopped (SIGSTOP, a stalled machine) or cut off
 * past the coordinator's heartbeat deadline is declared dead: the other
 * ranks hear it (their calls fail naming it, coll_check.c), drop its
 * connections and go on without it.  Once it runs again its control client
 * rejoins under a new node id, since an id declared dead is never given
 * back (engine/reannounce.c adopt_node_id).  None of the group's ranks knows
 * that id, so the group is unusable from this rank: its calls fail at once
 * with CFX_ERR_PEER_FAILED saying so (a running one at its next wait, or
 * once its failed message's cause is known), not at their deadline nor
 * blaming a live rank that "did not say why".  The way on is a new group,
 * with the same name or another: epochs are counted under the id the
 * context joined with.  A coordinator that restarted and did not give the
 * id back leaves the group the same way; it never knew the old id and sends
 * no event, but each other rank, having kept its id, asks it about its
 * peers as it rejoins (engine/reannounce.c) and is told the old id is gone
 * once the rank's rejoin window ended: their calls with the rank fail then.
 */
bool cfx__group_moved(const struct cfx_group *g)
{
    uint32_t now = cfx__ctl_node_id(g->ctx->ctl);
    return g->size > 1 && g->ids && now && now != g->ids[g->rank];
}

int cfx__group_moved_err(const struct cfx_group *g, const char *what)
{
    const uint32_t was = g->ids[g->rank];
    return cfx__err(CFX_ERR_PEER_FAILED, "%s: group %s: rank %d: coordinator %s declared this "
                    "rank's node %u dead while it was stopped or cut off, or restarted and did "
                    "not give the id back, and it rejoined as node %u; the other ranks know "
                    "rank %d only as node %u (they were told it died, after such a restart "
                    "once its rejoin window ended, and their calls with it fail): the group "
                    "is unusable from this rank (destroy it and create a new group)", what,
                    g->name, g->rank, g->ctx->cfg.coord, was,
                    cfx__ctl_node_id(g->ctx->ctl), g->rank, was);
}

bool cfx__group_moved_wait(struct cfx_group *g, uint64_t deadline)
{
    struct cfx_context *ctx = g->ctx;
    uint64_t until = CFX_MIN(deadline, cfx__deadline_ns(COLL_REJOIN_WAIT_MS));
    /* woken when the loss is seen (context.c on_node_dead), by the new id
     * (reannounce.c adopt_node_id) and at the re-announce's end */
    pthread_mutex_lock(&ctx->lock);
    while (!cfx__group_moved(g) && cfx__ctl_reconnecting(ctx->ctl) && cfx__obj_wait(ctx, until))
        ;
    pthread_mutex_unlock(&ctx->lock);
    return cfx__group_moved(g);
}

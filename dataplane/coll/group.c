/*
 * Groups: creation (rank and size, bootstrap through the object directory),
 * the order in which a group's calls run, and the public entry points.
 *
 * Bootstrap.  Rank r publishes a small inline object named after
 * (group name, creation epoch, r, slot) that holds its node id, and reads the
 * object of every other rank (one directory lookup each, within the group's
 * deadline).  The epoch counts how often this context created a group of the
 * same name before, so a group re-created under an old name never reads the
 * old group's objects, even while slow ranks still hold them; like the group
 * counter of torch.distributed it assumes every rank creates a name the same
 * number of times.  A slot's object can be stale (its node died without
 * withdrawing it, and another node still holds a copy, or the coordinator
 * has not seen the death yet): then
 * the next slot is used, by the owner and the readers alike (after a
 * coordinator restart the coordinator answers about a node that has not
 * rejoined yet only once it has, or its rejoin window ended: so a live rank
 * slow to reconnect is not taken for a dead one).  Once the group has
 * formed, each rank withdraws the stale objects in its own slots
 * (boot_sweep()), so killed jobs do not use the slots up.  An object whose
 * node is alive but is not ours, in this rank's slot or in one above (a
 * sweep frees the slots below a live rank's), means another process joined
 * as this rank: CFX_ERR_EXISTS.  The objects are put durable: a coordinator
 * with a state directory keeps them across a restart (kill -9 included), so
 * ranks that create the group after it still find the ranks that published
 * before.  A bootstrap call cut off by the coordinator's loss is made again
 * on the new connection until the deadline (each may be repeated: a put
 * that landed before the loss is accepted again as this node's).
 *
 * Channel.  Collectives travel on a p2p channel hashed from the name, the
 * epoch and rank 0's node id, so no message of an earlier group of the same
 * name can match.
 */
#include "coll.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dataplane/engine/engine.h"
#include "gpu/memtype.h"

#define BOOT_MAGIC     0xCF6B0071u
#define BOOT_SLOTS     8        /* stale objects skipped per rank at most */
#define BOOT_TAKEN_MS  2000     /* reading a taken slot (it exists: answered at once) */
#define BOOT_PROBE_MS  20       /* lookups after the deadline, to list who is missing */
#define BOOT_RETRY_MS  10       /* pause before repeating a call the coordinator's loss cut off */

struct boot_rec {
    uint32_t magic;
    uint32_t node_id;
    int32_t rank;
    int32_t size;
    uint64_t nonce;             /* tells our object from a stale one of the same node */
};

static const char *const algo_names[CFX_ALGO_LAST] = {
    [CFX_ALGO_AUTO] = "auto",     [CFX_ALGO_RING] = "ring",   [CFX_ALGO_TREE] = "tree",
    [CFX_ALGO_CHAIN] = "chain",   [CFX_ALGO_DBTREE] = "dbtree", [CFX_ALGO_RHD] = "rhd",
    [CFX_ALGO_DIRECT] = "direct", [CFX_ALGO_RECDBL] = "recdbl",
};

const char *cfx_algo_name(enum cfx_algo algo)
{
    return (int)algo >= 0 && algo < CFX_ALGO_LAST ? algo_names[algo] : "unknown";
}

static enum cfx_algo algo_from_env(void)
{
    const char *s = cfx__env_str("CFX_ALGO", NULL);
    if (!s || !*s)
        return CFX_ALGO_AUTO;
    for (int a = 0; a < CFX_ALGO_LAST; a++)
        if (!strcasecmp(s, algo_names[a]))
            return (enum cfx_algo)a;
    CFX_LOG(WARN, COLL, "CFX_ALGO=%s is not one of auto, ring, tree, chain, dbtree, rhd, "
            "direct, recdbl; ignored", s);
    return CFX_ALGO_AUTO;
}

/* ---- creation epochs ------------------------------------------------------------
 *
 * Process-wide because the count belongs to (context, name) and outlives the
 * groups; struct cfx_context is the engine's, so the table lives here, keyed
 * by the node id the context joined with (unique per context, and kept when
 * a rejoin gives it another: a rank that came back as another node destroys
 * its old group and creates the name again at the same epoch as the others,
 * not at 0 under the new id, where it never met them).
 */
struct epoch_ent {
    struct epoch_ent *next;
    uint32_t node_id;
    uint32_t count;
    bool live;                 /* a group of this name exists on this context */
    char name[COLL_NAME_MAX];
    /* our own bootstrap objects of a creation that failed on a size
     * disagreement, left for the other ranks to read (boot_keep()) until
     * the next creation of the name */
    struct cfx_object_id kept[BOOT_SLOTS];
    int nkept;
};

static pthread_mutex_t epoch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct epoch_ent *epochs;

/* Take the next epoch of (@p node_id, @p name) and mark the name live: a
 * second group of the same name on one context would share its channels,
 * so it is CFX_ERR_EXISTS until the first is destroyed (epoch_release()). */
static int epoch_take(uint32_t node_id, const char *name, uint32_t *out)
{
    int rc = CFX_OK;
    pthread_mutex_lock(&epoch_lock);
    struct epoch_ent *e;
    for (e = epochs; e; e = e->next)
        if (e->node_id == node_id && !strcmp(e->name, name))
            break;
    if (e && e->live) {
        rc = CFX_ERR_EXISTS;
        goto out;
    }
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e) {
            rc = CFX_ERR_NOMEM;
            goto out;
        }
        e->node_id = node_id;
        snprintf(e->name, sizeof(e->name), "%s", name);
        e->next = epochs;
        epochs = e;
    }
    *out = e->count++;
    e->live = true;
out:
    pthread_mutex_unlock(&epoch_lock);
    return rc;
}

/* The objects a failed creation of (@p node_id, @p name) left behind
 * (at most BOOT_SLOTS), handed to the caller to withdraw. */
static int epoch_kept_take(uint32_t node_id, const char *name, struct cfx_object_id *out)
{
    int n = 0;
    pthread_mutex_lock(&epoch_lock);
    for (struct epoch_ent *e = epochs; e; e = e->next)
        if (e->node_id == node_id && !strcmp(e->name, name)) {
            n = e->nkept;
            memcpy(out, e->kept, (size_t)n * sizeof(*out));
            e->nkept = 0;
        }
    pthread_mutex_unlock(&epoch_lock);
    return n;
}

static void epoch_kept_add(uint32_t node_id, const char *name, const struct cfx_object_id *id)
{
    pthread_mutex_lock(&epoch_lock);
    for (struct epoch_ent *e = epochs; e; e = e->next)
        if (e->node_id == node_id && !strcmp(e->name, name) && e->nkept < BOOT_SLOTS)
            e->kept[e->nkept++] = *id;
    pthread_mutex_unlock(&epoch_lock);
}

/*
 * A creation at @p epoch failed before its ranks had found each other (not
 * on a size disagreement): the name is free again and the next creation
 * takes the same epoch.  A rank that timed out waiting for a late one and
 * tries again must meet it there: counted on, each try went one epoch past
 * the late rank's and they never met.  Nothing of the failed try can
 * confuse the next: its bootstrap objects were withdrawn (one whose delete
 * failed is skipped for the next slot, boot_publish), and no rank sent on
 * its channels (that starts once every rank was found).  A creation that
 * failed later, or on sizes that disagree (whose objects stay for the other
 * ranks to read), goes on to the next epoch (epoch_release()).
 */
static void epoch_unwind(uint32_t node_id, const char *name, uint32_t epoch)
{
    pthread_mutex_lock(&epoch_lock);
    for (struct epoch_ent *e = epochs; e; e = e->next)
        if (e->node_id == node_id && !strcmp(e->name, name)) {
            e->live = false;
            if (e->count == epoch + 1)
                e->count = epoch;
        }
    pthread_mutex_unlock(&epoch_lock);
}

static void epoch_release(uint32_t node_id, const char *name)
{
    pthread_mutex_lock(&epoch_lock);
    for (struct epoch_ent *e = epochs; e; e = e->next)
        if (e->node_id == node_id && !strcmp(e->name, name))
            e->live = false;
    pthread_mutex_unlock(&epoch_lock);
}

/* ---- rank and size -------------------------------------------------------------- */

/* $name as a rank or size into *@p out: 1; 0 when unset; -1 when not a
 * number, -2 when a number out of 0..INT32_MAX. */
static int env_int(const char *name, int *out)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end)
        return -1;
    if (errno || v < 0 || v > INT32_MAX)
        return -2;
    *out = (int)v;
    return 1;
}

/* Rank and size not given in @p p come from the launcher's pair of
 * variables (cfx__launcher: one launcher for both, so that srun + torchrun
 * takes torchrun's rank with torchrun's size, not Slurm's task of the node
 * with torchrun's count); CFX_ERR_INVALID when one is malformed or none is
 * set. */
static int rank_size(const struct cfx_group_params *p, int *rank, int *size)
{
    uint64_t m = p ? p->field_mask : 0;
    const struct cfx_launcher_vars *l = NULL;
    if (!(m & CFX_GROUP_PARAM_RANK) || !(m & CFX_GROUP_PARAM_SIZE)) {
        l = cfx__launcher();
        if (!l)
            return cfx__err(CFX_ERR_INVALID, "group: %s given and no launcher's are set "
                            "(CFX_RANK/CFX_WORLD_SIZE, RANK/WORLD_SIZE, "
                            "OMPI_COMM_WORLD_RANK/_SIZE, SLURM_PROCID/SLURM_NTASKS, "
                            "PMI_RANK/PMI_SIZE)",
                            (m & CFX_GROUP_PARAM_RANK) ? "a rank but no size"
                            : (m & CFX_GROUP_PARAM_SIZE) ? "a size but no rank"
                                                         : "no rank and size");
    }
    const char *names[2] = { l ? l->rank : NULL, l ? l->size : NULL };
    int *outs[2] = { rank, size };
    bool given[2] = { (m & CFX_GROUP_PARAM_RANK) != 0, (m & CFX_GROUP_PARAM_SIZE) != 0 };
    if (given[0])
        *rank = p->rank;
    if (given[1])
        *size = p->size;
    for (int i = 0; i < 2; i++) {
        if (given[i])
            continue;
        int got = env_int(names[i], outs[i]);
        if (got < 0)
            return cfx__err(CFX_ERR_INVALID, "group: %s=%s is %s", names[i], getenv(names[i]),
                            got == -1 ? "not a number" : "out of range (0..2147483647)");
        if (got == 0)
            return cfx__err(CFX_ERR_INVALID, "group: %s is set but not %s", names[1 - i],
                            names[i]);
    }
    if (*size < 1)
        return cfx__err(CFX_ERR_INVALID, "group: size %d", *size);
    if (*rank < 0 || *rank >= *size)
        return cfx__err(CFX_ERR_INVALID, "group: rank %d out of range for size %d", *rank,
                        *size);
    return CFX_OK;
}

/* ---- bootstrap ------------------------------------------------------------------- */

static void boot_id(const struct cfx_group *g, int rank, int slot, struct cfx_object_id *id)
{
    char name[COLL_NAME_MAX + 64];
    snprintf(name, sizeof(name), "cfx.group/%s/%" PRIu32 "/%d/%d", g->name, g->epoch, rank,
             slot);
    cfx_object_id_from_name(name, id);
}

static int hold(struct cfx_group *g, const struct cfx_object_id *id)
{
    struct cfx_object_id *h = realloc(g->held, (size_t)(g->nheld + 1) * sizeof(*h));
    if (!h)
        return cfx__err(CFX_ERR_NOMEM, "group %s: out of memory", g->name);
    g->held = h;
    g->held[g->nheld++] = *id;
    return CFX_OK;
}

/* Repeat a call that failed because the connection to the coordinator was
 * lost (the client waits for its reconnection), until @p deadline. */
static bool boot_retry(int rc, uint64_t deadline)
{
    if (rc != CFX_ERR_CONNECT || cfx__now_ns() >= deadline)
        return false;
    usleep(BOOT_RETRY_MS * 1000); /* a client that gave up fails at once: no spinning */
    return true;
}

static bool node_alive(struct cfx_group *g, uint32_t node_id, uint64_t deadline)
{
    struct cfx_node_rec rec;
    int rc;
    if (node_id == g->ctx->node_id)
        return true;
    do
        rc = cfx__ctl_node_get(g->ctx->ctl, node_id, &rec, deadline);
    while (boot_retry(rc, deadline));
    if (rc != CFX_OK)
        return false;
    return rec.alive != 0;
}

/* Read the object of @p slot; CFX_OK with *rec filled. */
static int boot_read(struct cfx_group *g, const struct cfx_object_id *id, uint64_t deadline,
                     struct boot_rec *rec)
{
    struct cfx_ctl_source src;
    int rc;
    do {
        memset(&src, 0, sizeof(src));
        rc = cfx__ctl_obj_lookup(g->ctx->ctl, id, NULL, 0, deadline, &src);
    } while (boot_retry(rc, deadline));
    if (rc != CFX_OK)
        return rc;
    if (!src.is_inline || src.size != sizeof(*rec) || !src.data) {
        free(src.data);
        return cfx__err(CFX_ERR_PROTO, "group %s: a bootstrap object is not what this "
                        "library publishes", g->name);
    }
    memcpy(rec, src.data, sizeof(*rec));
    free(src.data);
    if (rec->magic != BOOT_MAGIC)
        return cfx__err(CFX_ERR_PROTO, "group %s: a bootstrap object has a bad magic",
                        g->name);
    return CFX_OK;
}

/*
 * This rank's object went in @p slot: look at the slots above it.  The
 * sweep (boot_sweep()) frees the slots below a live rank's own, so a second
 * process joining as that rank may find a lower slot free: a live node's
 * object above ours means the rank is joined already (CFX_ERR_EXISTS).  A
 * gone node's is marked for the sweep.  A slot that cannot be read, or
 * whose node's state is unknown, is left alone.
 */
static int boot_check_above(struct cfx_group *g, int slot, uint64_t deadline)
{
    for (int s = slot + 1; s < BOOT_SLOTS; s++) {
        struct cfx_object_id id;
        struct cfx_ctl_source src;
        struct boot_rec rec;
        struct cfx_node_rec node;
        int rc;
        boot_id(g, g->rank, s, &id);
        do {
            memset(&src, 0, sizeof(src));
            rc = cfx__ctl_obj_lookup_now(g->ctx->ctl, &id, NULL, 0, deadline, &src);
        } while (boot_retry(rc, deadline));
        if (rc != CFX_OK)
            continue; /* nothing there (answered at once) */
        bool ours = src.is_inline && src.size == sizeof(rec) && src.data;
        if (ours)
            memcpy(&rec, src.data, sizeof(rec));
        free(src.data);
        if ((rc = hold(g, &id)) != CFX_OK) /* a holder now: withdrawn with ours */
            return rc;
        if (!ours || rec.magic != BOOT_MAGIC || rec.node_id == g->ctx->node_id)
            continue;
        do
            rc = cfx__ctl_node_get(g->ctx->ctl, rec.node_id, &node, deadline);
        while (boot_retry(rc, deadline));
        if (rc != CFX_OK)
            continue;
        if (node.alive)
            return cfx__err(CFX_ERR_EXISTS, "group %s: rank %d already joined by node %u",
                            g->name, g->rank, rec.node_id);
        g->stale |= (uint8_t)(1u << s);
    }
    return CFX_OK;
}

static int boot_publish(struct cfx_group *g, uint64_t deadline)
{
    struct cfx_ctl *ctl = g->ctx->ctl;
    struct boot_rec me = {
        .magic = BOOT_MAGIC, .node_id = g->ctx->node_id, .rank = g->rank, .size = g->size,
        .nonce = cfx__now_ns() ^ ((uint64_t)g->ctx->node_id << 32) ^ (uint64_t)(uintptr_t)g,
    };
    for (int slot = 0; slot < BOOT_SLOTS; slot++) {
        struct cfx_object_id id;
        boot_id(g, g->rank, slot, &id);
        int rc;
        do
            rc = cfx__ctl_obj_put_durable(ctl, &id, sizeof(me), sizeof(me), &me, deadline);
        while (boot_retry(rc, deadline));
        struct boot_rec got;
        if (rc == CFX_ERR_EXISTS) {
            /* the slot is taken (an id names one object until its putter
             * deletes it or leaves): by a live node, the rank is claimed;
             * by a gone one (durable records outlive it), try the next */
            if (boot_read(g, &id, cfx__deadline_ns(BOOT_TAKEN_MS), &got) != CFX_OK)
                continue; /* gone meanwhile, or not a bootstrap object */
            if ((rc = hold(g, &id)) != CFX_OK)
                return rc;
            if (got.node_id != me.node_id && node_alive(g, got.node_id, deadline))
                return cfx__err(CFX_ERR_EXISTS, "group %s: rank %d already joined by node %u",
                                g->name, g->rank, got.node_id);
            if (got.node_id != me.node_id)
                g->stale |= (uint8_t)(1u << slot);
            continue;
        }
        if (rc == CFX_ERR_INVALID)
            continue; /* some other object: not ours to use */
        if (rc != CFX_OK)
            return cfx__err(rc, "group %s: rank %d cannot publish itself: %s", g->name,
                            g->rank, cfx_last_error());
        if ((rc = hold(g, &id)) != CFX_OK)
            return rc;
        if ((rc = boot_read(g, &id, deadline, &got)) != CFX_OK)
            return rc;
        if (got.node_id == me.node_id && got.nonce == me.nonce) {
            g->slot = slot;
            return boot_check_above(g, slot, deadline);
        }
        if (node_alive(g, got.node_id, deadline))
            return cfx__err(CFX_ERR_EXISTS, "group %s: rank %d already joined by node %u",
                            g->name, g->rank, got.node_id);
        CFX_LOG(DEBUG, COLL, "group %s: rank %d slot %d is stale (node %u is gone)", g->name,
                g->rank, slot, got.node_id);
        g->stale |= (uint8_t)(1u << slot);
    }
    return cfx__err(CFX_ERR_NO_RESOURCE, "group %s: rank %d found %d stale bootstrap objects",
                    g->name, g->rank, BOOT_SLOTS);
}

/* Node id of @p rank; CFX_ERR_TIMEOUT when it did not join by @p deadline. */
static int boot_lookup(struct cfx_group *g, int rank, uint64_t deadline, uint32_t *node)
{
    for (int slot = 0; slot < BOOT_SLOTS; slot++) {
        struct cfx_object_id id;
        struct boot_rec rec;
        boot_id(g, rank, slot, &id);
        int rc = boot_read(g, &id, deadline, &rec);
        if (rc != CFX_OK)
            return rc;
        if ((rc = hold(g, &id)) != CFX_OK)
            return rc;
        if (rec.rank != rank)
            return cfx__err(CFX_ERR_PROTO, "group %s: rank %d's object names rank %d",
                            g->name, rank, (int)rec.rank);
        if (!node_alive(g, rec.node_id, deadline))
            continue; /* stale: its owner moves on to the next slot too */
        if (rec.size != g->size) {
            g->size_clash = true;
            return cfx__err(CFX_ERR_INVALID, "group %s: rank %d (node %u) says the group has "
                            "%d ranks, rank %d says %d", g->name, rank, rec.node_id,
                            (int)rec.size, g->rank, g->size);
        }
        *node = rec.node_id;
        return CFX_OK;
    }
    return cfx__err(CFX_ERR_NO_RESOURCE, "group %s: rank %d has %d stale bootstrap objects",
                    g->name, rank, BOOT_SLOTS);
}

static int boot_join(struct cfx_group *g)
{
    uint64_t deadline = cfx__deadline_ns(g->timeout_ms);
    int rc = boot_publish(g, deadline);
    if (rc != CFX_OK)
        return rc;

    uint32_t *ids = calloc((size_t)g->size, sizeof(*ids));
    if (!ids)
        return cfx__err(CFX_ERR_NOMEM, "group %s: out of memory", g->name);
    char missing[256] = "";
    size_t mlen = 0;
    int nmissing = 0;
    for (int q = 0; q < g->size && rc == CFX_OK; q++) {
        if (q == g->rank) {
            ids[q] = g->ctx->node_id;
            continue;
        }
        uint64_t dl = nmissing ? cfx__deadline_ns(BOOT_PROBE_MS) : deadline;
        int st = boot_lookup(g, q, dl, &ids[q]);
        if (st == CFX_ERR_TIMEOUT) {
            nmissing++;
            if (mlen < sizeof(missing) - 16)
                mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%d",
                                         nmissing > 1 ? ", " : "", q);
            else if (missing[mlen - 1] != '.')
                mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, ", ...");
            continue;
        }
        rc = st;
    }
    /* A rank that asked for another size fails at once and leaves its
     * object for us to read (boot_keep()), unless its context went first. */
    if (rc == CFX_OK && nmissing)
        rc = cfx__err(CFX_ERR_TIMEOUT, "group %s: rank %d waited %d ms; %d rank(s) never "
                      "joined: %s (or joined with a group size other than %d and left before "
                      "this rank saw it)", g->name, g->rank,
                      g->timeout_ms, nmissing, missing, g->size);
    for (int q = 0; q < g->size && rc == CFX_OK; q++) {
        do
            rc = cfx__ctl_node_get(g->ctx->ctl, ids[q], &g->nodes[q], deadline);
        while (boot_retry(rc, deadline));
        if (rc != CFX_OK)
            rc = cfx__err(rc, "group %s: no record of rank %d (node %u): %s", g->name, q,
                          ids[q], cfx_last_error());
    }
    free(ids);
    return rc;
}

/*
 * A creation that failed because another rank's object says another group
 * size leaves its own objects in the directory (withdrawn at the next
 * creation of the name on this context, or when the context goes): a rank
 * of the other size that has not read them yet would otherwise wait out its
 * deadline for a rank that never joined, where with them it fails at once
 * with CFX_ERR_INVALID naming both sizes.  Other failures withdraw them.
 */
static bool boot_keep(struct cfx_group *g, const struct cfx_object_id *id)
{
    if (!g->size_clash)
        return false;
    for (int slot = 0; slot < BOOT_SLOTS; slot++) {
        struct cfx_object_id own;
        boot_id(g, g->rank, slot, &own);
        if (!memcmp(&own, id, sizeof(own))) {
            epoch_kept_add(g->ctx->joined_id, g->name, id);
            return true;
        }
    }
    return false;
}

/*
 * Once every rank has joined (the joining barrier: nobody reads a slot any
 * more), withdraw the objects that gone nodes left in this rank's slots (a
 * job killed before it destroyed its groups), below its own and above
 * (boot_publish(), boot_check_above()).  Kept, they pile up: each killed
 * run of a job pushes the next one a slot further, and after BOOT_SLOTS of
 * them the name could not be joined again on that coordinator.  This rank
 * read each, so it holds them, and their putters are gone: its delete
 * takes them, state-directory records included.  A delete that fails
 * leaves a slot the next creation skips again.
 */
static void boot_sweep(struct cfx_group *g)
{
    for (int slot = 0; g->stale && slot < BOOT_SLOTS; slot++) {
        struct cfx_object_id id;
        if (slot == g->slot || !(g->stale & (1u << slot)))
            continue;
        boot_id(g, g->rank, slot, &id);
        int rc = cfx__ctl_obj_delete(g->ctx->ctl, &id, cfx__deadline_ns(1000));
        if (rc != CFX_OK)
            CFX_LOG(INFO, COLL, "group %s: rank %d: the object a gone node left in slot %d "
                    "stays: %s", g->name, g->rank, slot, cfx_last_error());
        for (int i = 0; i < g->nheld; i++)
            if (!memcmp(&g->held[i], &id, sizeof(id))) {
                g->held[i] = g->held[--g->nheld]; /* destroy need not delete it again */
                break;
            }
    }
    g->stale = 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---- the group's thread: non-blocking calls in posting order ------------------- */

static void *group_thread(void *arg)
{
    struct cfx_group *g = arg;
    pthread_mutex_lock(&g->lock);
    for (;;) {
        while (cfx_list_empty(&g->queue) && !g->stop)
            pthread_cond_wait(&g->cond, &g->lock);
        if (cfx_list_empty(&g->queue))
            break;
        /* stays queued while it runs: blocking calls wait behind it */
        struct coll_args *a = cfx_list_entry(g->queue.next, struct coll_args, link);
        pthread_mutex_unlock(&g->lock);
        bool canceled = false;
        if (a->req) {
            /* from here a cancel (cfx_request_free, the group's destroy)
             * waits for the call, which stops at its next wait */
            pthread_mutex_lock(&g->ctx->lock);
            canceled = a->req->cancel;
            a->req->started = true;
            pthread_mutex_unlock(&g->ctx->lock);
        }
        if (canceled && !a->refused) {
            /* canceled while queued: it never runs, and touches neither
             * buffer; the others hear it in its turn (coll_refused) */
            a->refused = cfx__err(CFX_ERR_CANCELED, "i%s #%" PRIu32 ": canceled before it "
                                  "ran (its request was freed, or its group destroyed)",
                                  cfx__coll_kind_name(a->kind), a->seq);
        }
        /* device buffers: on the device the poster had current (its
         * streams, scratch and kernels are that device's), not this
         * thread's */
        int rc = a->refused ? CFX_OK : cfx__memtype_set_device(CFX_MEMTYPE_CUDA, a->device);
        if (rc != CFX_OK)
            a->refused = cfx__err(rc, "i%s #%" PRIu32 ": device %d on the group's thread: %s",
                                  cfx__coll_kind_name(a->kind), a->seq, a->device,
                                  cfx_last_error());
        rc = cfx__coll_run(g, a);
        /* done before it leaves the queue: a blocking call waiting for its
         * turn must not return while this request still reads as running */
        size_t bytes = a->kind == COLL_BARRIER ? 0 : a->count * cfx_dtype_size(a->dtype);
        /* off the entry first: once complete, the caller may free it while
         * the entry is still queued (a destroy walks the queue) */
        pthread_mutex_lock(&g->lock);
        struct cfx_request *req = a->req;
        a->req = NULL;
        pthread_mutex_unlock(&g->lock);
        if (req) /* none: a refused call (run_nb) */
            cfx__request_complete(req, rc, bytes);
        pthread_mutex_lock(&g->lock);
        cfx_list_del(&a->link);
        pthread_cond_broadcast(&g->cond);
        pthread_mutex_unlock(&g->lock);
        free(a);
        pthread_mutex_lock(&g->lock);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

/* Take the next sequence number for @p a and wait until the calls queued
 * before have run (each within its deadline).  The thread's interrupt check
 * runs meanwhile: one that fires (or the group's destroy on another thread)
 * cancels the call as a freed request of a queued call is canceled.  It
 * cannot simply leave, since it holds its place in the sequence the other
 * ranks run (the next call would pair with their this one), nor tell them
 * now, ahead of the calls before it: a copy of its arguments, refused, goes
 * to the queue's end, and the group's thread tells the others in its turn
 * (coll.c coll_refused), touching no buffer.  With no memory for the copy
 * the wait goes on, uninterrupted (a destroy cancels the calls before it,
 * and the call then stops at its first wait). */
static int wait_turn(struct cfx_group *g, struct coll_args *a)
{
    const char *what = cfx__coll_kind_name(a->kind);
    int rc = CFX_OK;
    pthread_mutex_lock(&g->lock);
    a->seq = g->next_seq++;
    size_t before = 0;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &g->queue)
        before++;
    bool give_up = true;
    while (!cfx_list_empty(&g->queue)) {
        if (!give_up || !cfx__intr_fired()) {
            cfx__cond_wait_intr(&g->cond, &g->lock, UINT64_MAX);
            continue;
        }
        struct coll_args *c = malloc(sizeof(*c));
        if (!c) {
            give_up = false;
            continue;
        }
        *c = *a;
        c->sbuf = NULL; /* refused: read by nothing */
        c->rbuf = NULL;
        c->req = NULL;
        c->device = -1;
        c->refused = cfx__err(CFX_ERR_CANCELED, "group %s %s #%" PRIu32 ": %s while it "
                              "waited for %zu call%s queued before it (a non-blocking call, or "
                              "one given up as this one; it never ran, and the other ranks are "
                              "told in its turn)", g->name, what, a->seq,
                              cfx__group_closing(g) ? "the group was destroyed"
                                                    : "interrupted on its thread",
                              before, before == 1 ? "" : "s");
        rc = c->refused;
        cfx_list_add_tail(&c->link, &g->queue); /* the thread runs: the queue is not empty */
        pthread_cond_broadcast(&g->cond);
        break;
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/*
 * Calls in flight.  A call on the group counts as a call on its context
 * (cfx__ctx_enter()), so that the context's destroy waits for it to leave,
 * and as one of the group's own (g->calls), so that the group's destroy on
 * another thread does: it marks the group closing, which fails new calls
 * at once and stops the running ones at their next wake-up as their
 * thread's interrupt check would (cfx__intr_flag(): the waits of
 * wait_turn(), of cfx_group_send/recv and of a collective, whose stop
 * predicate cfx__coll_stop() looks at it too), wakes what they sleep on,
 * and waits for them to leave before it frees anything (group_close()).
 * The other ranks hear of a stopped collective as of an interrupted one.
 * Entered under g->lock: the context's destroy marks the group an orphan
 * under that lock before it frees the context, so g->ctx is alive here
 * unless g->orphan.
 */
static int group_enter_locked(struct cfx_group *g, const char *what)
{
    int rc = cfx__group_closing(g) ? cfx__err(CFX_ERR_CANCELED, "%s: group %s was destroyed",
                                              what, g->name)
             : g->orphan ? cfx__err(CFX_ERR_CANCELED, "%s: group %s: its context was "
                                    "destroyed", what, g->name)
                         : cfx__ctx_enter(g->ctx, what);
    if (rc == CFX_OK)
        g->calls++;
    return rc;
}

static int group_enter(struct cfx_group *g, const char *what)
{
    if (cfx__fork_gen() != g->fork_gen) /* before any lock: a parent's thread may hold it */
        return cfx__err(CFX_ERR_INVALID, "%s: group %s was created before this process "
                        "forked: a child creates its own context and groups", what, g->name);
    pthread_mutex_lock(&g->lock);
    int rc = group_enter_locked(g, what);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* The call leaves with @p rc; the group may be freed once it returns. */
static int group_leave(struct cfx_group *g, int rc)
{
    rc = cfx__ctx_leave(g->ctx, rc);
    pthread_mutex_lock(&g->lock);
    if (--g->calls == 0 && cfx__group_closing(g))
        pthread_cond_broadcast(&g->calls_cond);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int run_blocking(struct cfx_group *g, struct coll_args *a)
{
    cfx__err_clear();
    if (!g)
        return cfx__err(CFX_ERR_INVALID, "%s: NULL group", cfx__coll_kind_name(a->kind));
    int rc = group_enter(g, cfx__coll_kind_name(a->kind));
    if (rc != CFX_OK)
        return rc;
    cfx__intr_begin();
    const bool *was = cfx__intr_flag(&g->closing);
    rc = wait_turn(g, a);
    if (rc == CFX_OK)
        rc = cfx__coll_run(g, a);
    cfx__intr_flag(was);
    cfx__intr_end();
    if (rc == CFX_OK)
        cfx__err_clear(); /* a wait that ran long and then succeeded left its text */
    return group_leave(g, rc);
}

static int run_nb(struct cfx_group *g, const struct coll_args *tmpl, struct cfx_request **req)
{
    cfx__err_clear();
    const char *what = cfx__coll_kind_name(tmpl->kind);
    int rc;
    if (!g)
        return cfx__err(CFX_ERR_INVALID, "i%s: NULL group", what);
    /* A call that fails returns no request, but it is a call of the group's
     * sequence all the same, as a blocking call that fails its checks is:
     * the other ranks made theirs, and the next call must pair with their
     * next one (left out, this rank's calls paired one behind the others'
     * for good, and those of the same arguments passed the check with the
     * wrong data).  So it is queued, without a request, for the group's
     * thread to tell the others in its turn (coll.c coll_refused); with no
     * memory for that, it only takes its number. */
    int refused = req ? cfx__coll_check(g, tmpl, what)
                      : cfx__err(CFX_ERR_INVALID, "i%s: NULL request pointer", what);
    /* device buffers: the group's thread works on the device current here */
    int device = -1;
    if (refused == CFX_OK && (tmpl->params.field_mask & CFX_COLL_PARAM_MEMTYPE) &&
        tmpl->params.memtype == CFX_MEMTYPE_CUDA &&
        (rc = cfx__memtype_device(CFX_MEMTYPE_CUDA, &device)) != CFX_OK)
        refused = cfx__err(rc, "i%s: the current device: %s", what, cfx_last_error());
    char why[512] = "";
    if (refused != CFX_OK)
        snprintf(why, sizeof(why), "%s", cfx_last_error());
    /* posting only: the group's thread runs it, and the context's destroy
     * stops that thread before it frees anything.  Entered on the context
     * until the call is queued: a destroy meanwhile waits for this post,
     * and one that came first fails it (CFX_ERR_CANCELED), instead of the
     * post starting a group thread on a freed context. */
    rc = group_enter(g, what);
    if (rc != CFX_OK)
        return refused != CFX_OK ? cfx__err(refused, "%s", why) : rc;
    struct cfx_context *ctx = g->ctx;
    if (cfx__group_moved(g)) { /* nobody to tell: fails here, queued nowhere */
        char call[32];
        snprintf(call, sizeof(call), "i%s", what);
        return group_leave(g, refused != CFX_OK ? cfx__err(refused, "%s", why)
                                                : cfx__group_moved_err(g, call));
    }
    struct coll_args *a = malloc(sizeof(*a));
    if (a) {
        *a = *tmpl;
        a->refused = refused;
        a->req = refused == CFX_OK ? cfx__request_new(ctx) : NULL;
        a->device = device;
    }
    if (!a || (refused == CFX_OK && !a->req)) {
        free(a);
        if (refused == CFX_OK)
            return group_leave(g, cfx__err(CFX_ERR_NOMEM, "i%s: out of memory", what));
        pthread_mutex_lock(&g->lock);
        g->next_seq++;
        pthread_mutex_unlock(&g->lock);
        return group_leave(g, cfx__err(refused, "%s", why));
    }
    pthread_mutex_lock(&g->lock);
    if (!g->thread_started) {
        if (pthread_create(&g->thread, NULL, group_thread, g)) {
            if (refused != CFX_OK)
                g->next_seq++;
            pthread_mutex_unlock(&g->lock);
            struct cfx_request *r = a->req;
            free(a);
            if (refused != CFX_OK)
                return group_leave(g, cfx__err(refused, "%s", why));
            cfx__request_complete(r, CFX_ERR_NO_RESOURCE, 0);
            cfx_request_free(r);
            return group_leave(g, cfx__err(CFX_ERR_NO_RESOURCE,
                                           "i%s: cannot start the group's thread", what));
        }
        g->thread_started = true;
        pthread_setname_np(g->thread, "cfx-group");
    }
    a->seq = g->next_seq++;
    /* once queued, @a belongs to the group's thread, which may run and
     * free it before this thread reads it again */
    if (refused == CFX_OK)
        *req = a->req;
    cfx_list_add_tail(&a->link, &g->queue);
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
    return group_leave(g, refused == CFX_OK ? CFX_OK : cfx__err(refused, "%s", why));
}

/* ---- create / destroy -------------------------------------------------------------- */

static int group_create(struct cfx_context *ctx, const struct cfx_group_params *params,
                        struct cfx_group **out);
static void group_detach(struct cfx_ctx_user *u);

int cfx_group_create(struct cfx_context *ctx, const struct cfx_group_params *params,
                     struct cfx_group **out)
{
    cfx__err_clear();
    if (!ctx || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_group_create: NULL argument");
    *out = NULL;
    int rc = cfx__mask_check(params ? params->field_mask : 0, CFX_GROUP_PARAM_ALL,
                             "cfx_group_create", "cfx_group_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    rc = cfx__ctx_enter(ctx, "cfx_group_create");
    if (rc != CFX_OK)
        return rc;
    cfx__intr_begin(); /* the wait for the other ranks may be interrupted */
    rc = group_create(ctx, params, out);
    if (rc == CFX_ERR_CANCELED && cfx__intr_fired())
        rc = cfx__err(rc, "cfx_group_create: interrupted on its thread while the ranks "
                      "joined (%s)", cfx_last_error());
    cfx__intr_end();
    /* attached before the leave, while the context is sure to be alive; a
     * destroy that began meanwhile detaches it like any other group */
    if (rc == CFX_OK)
        cfx__ctx_user_attach(ctx, &(*out)->user, group_detach);
    return cfx__ctx_leave(ctx, rc);
}

static int group_create(struct cfx_context *ctx, const struct cfx_group_params *params,
                        struct cfx_group **out)
{
    uint64_t m = params ? params->field_mask : 0;
    const char *name = (m & CFX_GROUP_PARAM_NAME) && params->name ? params->name : "world";
    if (!*name || strlen(name) >= COLL_NAME_MAX)
        return cfx__err(CFX_ERR_INVALID, "group name must have 1 to %d characters",
                        COLL_NAME_MAX - 1);
    if ((m & CFX_GROUP_PARAM_TIMEOUT) && params->timeout_ms < 1)
        return cfx__err(CFX_ERR_INVALID, "group %s: timeout %d ms: every call of a group has a "
                        "deadline (>= 1 ms)", name, params->timeout_ms);
    int rank = -1, size = 0; /* set by rank_size() on success */
    bool found = false;      /* the ranks found each other (boot_join) */
    int rc = rank_size(params, &rank, &size);
    if (rc != CFX_OK)
        return rc;

    struct cfx_group *g = calloc(1, sizeof(*g));
    if (!g)
        return cfx__err(CFX_ERR_NOMEM, "group %s: out of memory", name);
    g->nodes = calloc((size_t)size, sizeof(*g->nodes));
    if (!g->nodes) {
        rc = cfx__err(CFX_ERR_NOMEM, "group %s: out of memory", name);
        goto err_free_group;
    }
    g->ctx = ctx;
    g->fork_gen = cfx__fork_gen();
    snprintf(g->name, sizeof(g->name), "%s", name);
    g->rank = rank;
    g->size = size;
    g->timeout_ms = (m & CFX_GROUP_PARAM_TIMEOUT) ? params->timeout_ms : ctx->cfg.timeout_ms;
    g->env_algo = algo_from_env();
    /* a segment past COLL_SEG_MAX (CFX_COLL_SEG=2^63) made scratch sizes
     * wrap: a reduce_scatter asked for 2^63 bytes and failed */
    g->seg_bytes = cfx__env_size_clamp("CFX_COLL_SEG", COLL_SEG_DEFAULT, COLL_SEG_MIN,
                                       COLL_SEG_MAX);
    long long chk = cfx__env_ll_clamp("CFX_COLL_CHECK", COLL_CHECK_EDGES, 0, 2);
    g->check = chk <= 0 ? COLL_CHECK_OFF : chk == 1 ? COLL_CHECK_EDGES : COLL_CHECK_ALL;
    if (g->check == COLL_CHECK_OFF)
        CFX_LOG(WARN, COLL, "group %s: CFX_COLL_CHECK=0: the ranks' arguments are not "
                "compared; a call whose ranks disagree may return CFX_OK with wrong data",
                name);
    cfx_list_init(&g->queue);
    pthread_mutex_init(&g->lock, NULL);
    pthread_mutex_init(&g->split_lock, NULL);
    cfx__cond_init_mono(&g->split_cond);
    cfx_list_init(&g->split_rx);
    pthread_cond_init(&g->cond, NULL);
    cfx__cond_init_mono(&g->calls_cond);
    if ((rc = epoch_take(ctx->joined_id, g->name, &g->epoch)) != CFX_OK) {
        rc = rc == CFX_ERR_EXISTS
                 ? cfx__err(rc, "group %s already exists on node %u: destroy it before "
                            "creating it again", name, ctx->node_id)
                 : cfx__err(rc, "group %s: out of memory", name);
        goto err_destroy_sync;
    }
    {
        /* what a creation that disagreed on the size left for the others */
        struct cfx_object_id kept[BOOT_SLOTS];
        int nkept = epoch_kept_take(ctx->joined_id, g->name, kept);
        for (int i = 0; i < nkept; i++)
            cfx__ctl_obj_delete(ctx->ctl, &kept[i], cfx__deadline_ns(1000));
    }

    if (size > 1 && (rc = boot_join(g)) != CFX_OK)
        goto err_withdraw;
    found = true;
    if (size == 1)
        g->nodes[0] = ctx->self;

    g->ids = calloc((size_t)size, sizeof(*g->ids));
    g->gave = calloc((size_t)size, sizeof(*g->gave));
    if (!g->ids || !g->gave) {
        rc = cfx__err(CFX_ERR_NOMEM, "group %s: out of memory", name);
        goto err_withdraw;
    }
    for (int q = 0; q < size; q++)
        g->ids[q] = g->nodes[q].node_id;

    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, g->name, strlen(g->name) + 1);
    h = fnv1a(h, &g->epoch, sizeof(g->epoch));
    h = fnv1a(h, &g->nodes[0].node_id, sizeof(g->nodes[0].node_id));
    g->chan = h & ~1ull;
    g->chan_user = h | 1ull;
    g->chan_split = (h ^ 0x73706c74ull) | 1ull;
    /* Nobody may withdraw its bootstrap object (cfx_group_destroy) before
     * every rank has read it: end creation with a barrier. */
    if (size > 1) {
        /* on a channel of its own, so that the user's first call is #0 */
        g->chan = (h ^ 0x6a6f696eull) & ~1ull;
        rc = cfx_group_barrier(g, NULL);
        g->chan = h & ~1ull;
        g->next_seq = 0;
        /* the joining barrier has no check channel: its call #0 is not the user's */
        g->chan_chk = (h ^ 0x63686b73ull) & ~1ull;
        if (rc != CFX_OK) {
            rc = cfx__err(rc, "group %s: rank %d: the ranks did not all finish joining: %s",
                          g->name, rank, cfx_last_error());
            goto err_withdraw;
        }
        boot_sweep(g);
    }
    CFX_LOG(INFO, COLL, "group %s: rank %d of %d (node %u), epoch %" PRIu32 ", algo %s, "
            "segment %zu B, agreement check %s", g->name, rank, size, ctx->node_id, g->epoch,
            cfx_algo_name(g->env_algo), g->seg_bytes,
            g->check == COLL_CHECK_EDGES ? "along the messages"
            : g->check == COLL_CHECK_ALL ? "all ranks" : "off");
    *out = g;
    return CFX_OK;

err_withdraw: {
    /* A record read from another rank may be gone already (its putter
     * withdrew it): that delete's error must not replace the reason. */
    char why[512];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    for (int i = 0; i < g->nheld; i++)
        if (!boot_keep(g, &g->held[i]))
            cfx__ctl_obj_delete(ctx->ctl, &g->held[i], cfx__deadline_ns(1000));
    cfx__err(rc, "%s", why);
    free(g->held);
    if (!found && !g->size_clash)
        epoch_unwind(ctx->joined_id, g->name, g->epoch);
    else
        epoch_release(ctx->joined_id, g->name);
}
err_destroy_sync:
    pthread_cond_destroy(&g->cond);
    pthread_cond_destroy(&g->calls_cond);
    pthread_cond_destroy(&g->split_cond);
    pthread_mutex_destroy(&g->split_lock);
    pthread_mutex_destroy(&g->lock);
    free(g->gave);
    free(g->ids);
    free(g->nodes);
err_free_group:
    free(g);
    return rc;
}

/* What the group holds in its context: its thread (which runs what was
 * queued first), its bootstrap records, its scratch buffer, its epoch. */
static void group_release_ctx(struct cfx_group *g)
{
    pthread_mutex_lock(&g->lock);
    g->stop = true;
    /* what is queued is canceled, the running call too (it stops at its
     * next wait): their requests end with CFX_ERR_CANCELED, the others
     * told; run, each took up to its deadline with a peer that never came */
    struct cfx_list *pos;
    pthread_mutex_lock(&g->ctx->lock);
    cfx_list_for_each(pos, &g->queue) {
        struct coll_args *a = cfx_list_entry(pos, struct coll_args, link);
        if (a->req)
            a->req->cancel = true;
    }
    pthread_cond_broadcast(&g->ctx->obj_cond);
    pthread_mutex_unlock(&g->ctx->lock);
    pthread_cond_broadcast(&g->cond);
    bool joined = g->thread_started;
    g->thread_started = false;
    pthread_mutex_unlock(&g->lock);
    if (joined)
        pthread_join(g->thread, NULL);
    uint64_t dl = cfx__deadline_ns(g->timeout_ms < 0 ? 5000 : CFX_MIN(g->timeout_ms, 5000));
    if (g->nheld && cfx__ctl_lost_ms(g->ctx->ctl) > 0) {
        /* the coordinator is gone for now: a destroy does not wait for it
         * (it did, 5 s, in every rank at a job's end); the records stay,
         * stale once this node is gone, and readers skip them */
        CFX_LOG(INFO, COLL, "group %s: the coordinator is unreachable: %d bootstrap "
                "record(s) of this rank stay in the directory (stale once this node is "
                "gone: readers skip them)", g->name, g->nheld);
        g->nheld = 0;
    }
    for (int i = 0; i < g->nheld; i++)
        cfx__ctl_obj_delete(g->ctx->ctl, &g->held[i], dl);
    g->nheld = 0;
    /* what the other ranks sent that nobody here received (a failed call's
     * leftovers, an unmatched send) held their eager credits for good */
    const uint64_t chans[] = { g->chan, g->chan_user, g->chan_split, g->chan_chk };
    int dropped = 0;
    pthread_mutex_lock(&g->ctx->lock);
    for (size_t i = 0; i < CFX_ARRAY_SIZE(chans); i++)
        if (chans[i])
            dropped += cfx__eager_chan_close(g->ctx, chans[i]);
    pthread_mutex_unlock(&g->ctx->lock);
    if (dropped)
        CFX_LOG(INFO, COLL, "group %s: rank %d: %d message(s) that no call received were "
                "dropped at its destroy", g->name, g->rank, dropped);
    cfx_buf_free(g->ctx, g->scratch);
    g->scratch = NULL;
    epoch_release(g->ctx->joined_id, g->name);
}

/* The context is being destroyed before the group: its side goes now (all
 * calls have left it); the group's own destroy frees the rest. */
static void group_detach(struct cfx_ctx_user *u)
{
    struct cfx_group *g = container_of(u, struct cfx_group, user);
    pthread_mutex_lock(&g->lock);
    g->orphan = true;
    pthread_mutex_unlock(&g->lock);
    CFX_LOG(INFO, COLL, "group %s: rank %d: the context is destroyed before the group: "
            "its calls fail with CFX_ERR_CANCELED", g->name, g->rank);
    group_release_ctx(g);
}

/* The destroy begins ("calls in flight"): calls of the group on other
 * threads stop and leave.  False when some did not within
 * CFX_DESTROY_DRAIN_MS (stuck outside every wait it can end): the group is
 * then left allocated, as a context is, so that they touch no freed memory. */
static bool group_close(struct cfx_group *g)
{
    pthread_mutex_lock(&g->lock);
    __atomic_store_n(&g->closing, true, __ATOMIC_RELEASE); /* before the wake-ups */
    unsigned n = g->calls;
    if (!g->orphan) { /* the context is alive: its destroy's detach takes g->lock */
        pthread_mutex_lock(&g->ctx->lock);
        struct cfx_list *pos;
        cfx_list_for_each(pos, &g->queue) { /* run, each would wait for its deadline */
            struct coll_args *a = cfx_list_entry(pos, struct coll_args, link);
            if (a->req)
                a->req->cancel = true;
        }
        pthread_cond_broadcast(&g->ctx->obj_cond); /* p2p and collective waits */
        pthread_mutex_unlock(&g->ctx->lock);
    }
    pthread_cond_broadcast(&g->cond); /* wait_turn(), p2p()'s wait for the queue */
    pthread_mutex_unlock(&g->lock);
    pthread_mutex_lock(&g->split_lock); /* a receive behind another (group_split.c) */
    pthread_cond_broadcast(&g->split_cond);
    pthread_mutex_unlock(&g->split_lock);
    if (n)
        CFX_LOG(INFO, COLL, "group %s: rank %d: destroy: %u call(s) in flight on other threads "
                "end with CFX_ERR_CANCELED", g->name, g->rank, n);
    uint64_t dl = cfx__deadline_ns(CFX_DESTROY_DRAIN_MS);
    pthread_mutex_lock(&g->lock);
    while (g->calls && cfx__cond_wait_until(&g->calls_cond, &g->lock, dl))
        ;
    n = g->calls;
    pthread_mutex_unlock(&g->lock);
    if (n)
        CFX_LOG(ERR, COLL, "group %s: rank %d: destroy: %u call(s) still in flight after %d "
                "ms; the group is left allocated (not freed) so that they do not touch freed "
                "memory", g->name, g->rank, n, CFX_DESTROY_DRAIN_MS);
    return n == 0;
}

void cfx_group_destroy(struct cfx_group *g)
{
    if (!g || cfx__fork_gen() != g->fork_gen) /* a forked child's copy: see the context's */
        return;
    if (!group_close(g))
        return;
    struct cfx_context *ctx = g->ctx;
    int r = cfx__ctx_user_release(ctx, &g->user);
    if (r < 0) {
        CFX_LOG(ERR, COLL, "group %s: rank %d: its context's destroy gave up on calls still "
                "in flight: the group is left allocated", g->name, g->rank);
        return;
    }
    if (r > 0) {
        group_release_ctx(g);
        cfx__ctx_leave(ctx, CFX_OK);
    }
    free(g->held);
    cfx__memtype_free(CFX_MEMTYPE_CUDA, g->dscratch); /* waits for the device, as cudaFree */
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, g->dstream);
    pthread_cond_destroy(&g->cond);
    pthread_cond_destroy(&g->calls_cond);
    pthread_cond_destroy(&g->split_cond);
    pthread_mutex_destroy(&g->split_lock);
    pthread_mutex_destroy(&g->lock);
    free(g->edge_dir);
    free(g->edge_hin);
    free(g->edge_cin);
    free(g->edge_hrx);
    free(g->split_used);
    free(g->gave);
    free(g->ids);
    free(g->nodes);
    free(g);
}

int cfx_group_rank(const struct cfx_group *g)
{
    return g ? g->rank : CFX_ERR_INVALID;
}

int cfx_group_size(const struct cfx_group *g)
{
    return g ? g->size : CFX_ERR_INVALID;
}

/* ---- point to point ------------------------------------------------------------------ */

static int p2p_call(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer, int tag,
                    const struct cfx_coll_params *params, enum cfx_memtype mt, int timeout);

static int p2p(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer, int tag,
               const struct cfx_coll_params *params)
{
    const char *what = send ? "send" : "recv";
    cfx__err_clear();
    if (!g || (!buf && bytes))
        return cfx__err(CFX_ERR_INVALID, "group %s: NULL argument", what);
    if (peer < 0 || peer >= g->size || peer == g->rank)
        return cfx__err(CFX_ERR_INVALID, "group %s %s: peer %d is not another rank of %d",
                        g->name, what, peer, g->size);
    uint64_t m = params ? params->field_mask : 0;
    int rc = cfx__mask_check(m, CFX_COLL_PARAM_ALL, send ? "cfx_group_send" : "cfx_group_recv",
                             "cfx_coll_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    enum cfx_memtype mt = (m & CFX_COLL_PARAM_MEMTYPE) ? params->memtype : CFX_MEMTYPE_HOST;
    int timeout = (m & CFX_COLL_PARAM_TIMEOUT) ? params->timeout_ms : g->timeout_ms;
    if (cfx__fork_gen() != g->fork_gen)
        return cfx__err(CFX_ERR_INVALID, "group %s %s: the group was created before this "
                        "process forked: a child creates its own context and groups", g->name,
                        what);
    /* group_enter and the wait for queued collectives in one hold; the
     * wait for those (bounded by their deadlines) and for the peer may be
     * interrupted, or stopped by the group's destroy ("calls in flight") */
    cfx__intr_begin();
    const bool *was = cfx__intr_flag(&g->closing);
    pthread_mutex_lock(&g->lock);
    rc = group_enter_locked(g, what);
    bool entered = rc == CFX_OK;
    while (rc == CFX_OK && !cfx_list_empty(&g->queue)) {
        if (cfx__intr_fired())
            rc = cfx__err(CFX_ERR_CANCELED, "group %s %s: %s while it waited for the group's "
                          "non-blocking calls before it", g->name, what,
                          cfx__group_closing(g) ? "the group was destroyed"
                                                : "interrupted on its thread");
        else
            cfx__cond_wait_intr(&g->cond, &g->lock, UINT64_MAX);
    }
    pthread_mutex_unlock(&g->lock);
    if (rc == CFX_OK && cfx__group_moved(g)) {
        char call[COLL_NAME_MAX + 16];
        snprintf(call, sizeof(call), "group %s %s", g->name, what);
        rc = cfx__group_moved_err(g, call);
    } else if (rc == CFX_OK) {
        rc = p2p_call(g, send, buf, bytes, peer, tag, params, mt, timeout);
    }
    cfx__intr_flag(was);
    cfx__intr_end();
    return entered ? group_leave(g, rc) : rc;
}

static int p2p_call(struct cfx_group *g, bool send, void *buf, size_t bytes, int peer, int tag,
                    const struct cfx_coll_params *params, enum cfx_memtype mt, int timeout)
{
    const char *what = send ? "send" : "recv";
    uint64_t m = params ? params->field_mask : 0;

    /* device memory travels through a host copy, as in collectives
     * (cfx__coll_run): the transports move host memory */
    void *stream = (m & CFX_COLL_PARAM_STREAM) ? params->stream : NULL;
    void *dev = NULL;
    const enum cfx_memtype dmt = mt; /* the caller's buffer's type */
    int rc = cfx__memtype_require(mt, send ? "group send" : "group recv");
    if (rc != CFX_OK)
        return rc;
    if (mt != CFX_MEMTYPE_HOST && bytes) {
        dev = buf;
        if ((rc = cfx_buf_alloc(g->ctx, bytes, &buf)) != CFX_OK)
            return rc;
        if (send) {
            rc = cfx__memcpy_typed_async(buf, CFX_MEMTYPE_HOST, dev, mt, bytes, stream);
            if (rc == CFX_OK && stream)
                rc = cfx__memtype_sync(mt, stream);
            if (rc != CFX_OK) {
                cfx_buf_free(g->ctx, buf);
                return rc;
            }
        }
    }
    if (dev)
        mt = CFX_MEMTYPE_HOST;

    const uint64_t deadline = cfx__deadline_ns(timeout);
    if (mt == CFX_MEMTYPE_HOST && cfx__group_split_size(g, peer, bytes)) {
        rc = cfx__group_split_p2p(g, send, buf, bytes, peer, tag, deadline);
    } else {
        struct cfx_p2p_req *req;
        rc = send ? cfx__p2p_isend_reoffer(g->ctx, &g->nodes[peer], g->chan_user,
                                           (uint32_t)tag, buf, bytes, mt, &req)
                  : cfx__p2p_irecv(g->ctx, &g->nodes[peer], g->chan_user, (uint32_t)tag, buf,
                                   bytes, mt, &req);
        if (rc != CFX_OK) {
            if (dev)
                cfx_buf_free(g->ctx, buf);
            return rc;
        }
        rc = cfx__p2p_wait_free_intr(req, deadline);
    }
    const bool intr = rc == CFX_ERR_CANCELED && cfx__intr_fired();
    /* a lost peer may be this node's own death: the peers dropped it */
    const bool lost = rc == CFX_ERR_PEER_FAILED || rc == CFX_ERR_CONNECT ||
                      rc == CFX_ERR_CLOSED || rc == CFX_ERR_IO || rc == CFX_ERR_TIMEOUT;
    if (lost && cfx__group_moved_wait(g, deadline)) {
        /* the peer dropped this node (it was declared dead meanwhile) */
        char call[COLL_NAME_MAX + 16];
        snprintf(call, sizeof(call), "group %s %s", g->name, what);
        rc = cfx__group_moved_err(g, call);
    } else if (rc != CFX_OK) {
        char why[256];
        if (intr)
            snprintf(why, sizeof(why), "%s: %s",
                     cfx__group_closing(g) ? "the group was destroyed meanwhile"
                                           : "interrupted on its thread",
                     send ? "the message was withdrawn (not sent, or its receive fails)"
                          : "the receive was withdrawn (a message not under way yet is left "
                            "for the next receive of the tag)");
        else
            snprintf(why, sizeof(why), "%s", cfx_last_error());
        rc = cfx__err(rc, "group %s %s: rank %d %s rank %d (node %u), tag %d: %s", g->name,
                      what, g->rank, send ? "sending to" : "receiving from", peer,
                      g->nodes[peer].node_id, tag, why);
    }
    if (rc == CFX_OK && dev && !send) {
        rc = cfx__memcpy_typed_async(dev, dmt, buf, CFX_MEMTYPE_HOST, bytes, stream);
        if (rc == CFX_OK)
            rc = cfx__memtype_sync(dmt, stream);
    }
    if (dev)
        cfx_buf_free(g->ctx, buf);
    return rc;
}

int cfx_group_send(struct cfx_group *g, const void *buf, size_t bytes, int peer, int tag,
                   const struct cfx_coll_params *params)
{
    return p2p(g, true, (void *)buf, bytes, peer, tag, params);
}

int cfx_group_recv(struct cfx_group *g, void *buf, size_t bytes, int peer, int tag,
                   const struct cfx_coll_params *params)
{
    return p2p(g, false, buf, bytes, peer, tag, params);
}

/* ---- collectives ---------------------------------------------------------------------- */

static struct coll_args args(enum coll_kind kind, const void *s, void *r, size_t count,
                             enum cfx_dtype dtype, enum cfx_redop op, int root,
                             const struct cfx_coll_params *params)
{
    struct coll_args a = {
        .kind = kind, .sbuf = s, .rbuf = r, .count = count, .dtype = dtype, .op = op,
        .root = root,
    };
    if (params) {
        uint64_t m = params->field_mask;
        a.params.field_mask = m;
        if (m & CFX_COLL_PARAM_TIMEOUT)
            a.params.timeout_ms = params->timeout_ms;
        if (m & CFX_COLL_PARAM_ALGO)
            a.params.algo = params->algo;
        if (m & CFX_COLL_PARAM_MEMTYPE)
            a.params.memtype = params->memtype;
        if (m & CFX_COLL_PARAM_STREAM)
            a.params.stream = params->stream;
    }
    return a;
}

int cfx_group_barrier(struct cfx_group *g, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_BARRIER, NULL, NULL, 0, CFX_DTYPE_U8, 0, 0, params);
    return run_blocking(g, &a);
}

int cfx_group_allreduce(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum cfx_dtype dtype, enum cfx_redop op,
                        const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0, params);
    return run_blocking(g, &a);
}

int cfx_group_broadcast(struct cfx_group *g, void *buf, size_t count, enum cfx_dtype dtype,
                        int root, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_BROADCAST, buf, buf, count, dtype, 0, root, params);
    return run_blocking(g, &a);
}

int cfx_group_reduce(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                     enum cfx_dtype dtype, enum cfx_redop op, int root,
                     const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, params);
    return run_blocking(g, &a);
}

int cfx_group_allgather(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum cfx_dtype dtype, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, 0, 0, params);
    return run_blocking(g, &a);
}

int cfx_group_reduce_scatter(struct cfx_group *g, const void *sendbuf, void *recvbuf,
                             size_t count, enum cfx_dtype dtype, enum cfx_redop op,
                             const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_REDUCE_SCATTER, sendbuf, recvbuf, count, dtype, op, 0,
                              params);
    return run_blocking(g, &a);
}

int cfx_group_gather(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                     enum cfx_dtype dtype, int root, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_GATHER, sendbuf, recvbuf, count, dtype, 0, root, params);
    return run_blocking(g, &a);
}

int cfx_group_scatter(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                      enum cfx_dtype dtype, int root, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_SCATTER, sendbuf, recvbuf, count, dtype, 0, root, params);
    return run_blocking(g, &a);
}

int cfx_group_alltoall(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                       enum cfx_dtype dtype, const struct cfx_coll_params *params)
{
    struct coll_args a = args(COLL_ALLTOALL, sendbuf, recvbuf, count, dtype, 0, 0, params);
    return run_blocking(g, &a);
}

int cfx_group_iallreduce(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                         enum cfx_dtype dtype, enum cfx_redop op,
                         const struct cfx_coll_params *params, struct cfx_request **req)
{
    struct coll_args a = args(COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0, params);
    return run_nb(g, &a, req);
}

int cfx_group_ibroadcast(struct cfx_group *g, void *buf, size_t count, enum cfx_dtype dtype,
                         int root, const struct cfx_coll_params *params,
                         struct cfx_request **req)
{
    struct coll_args a = args(COLL_BROADCAST, buf, buf, count, dtype, 0, root, params);
    return run_nb(g, &a, req);
}

int cfx_group_ireduce(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                      enum cfx_dtype dtype, enum cfx_redop op, int root,
                      const struct cfx_coll_params *params, struct cfx_request **req)
{
    struct coll_args a = args(COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root, params);
    return run_nb(g, &a, req);
}

int cfx_group_iallgather(struct cfx_group *g, const void *sendbuf, void *recvbuf, size_t count,
                         enum cfx_dtype dtype, const struct cfx_coll_params *params,
                         struct cfx_request **req)
{
    struct coll_args a = args(COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, 0, 0,
                              params);
    return run_nb(g, &a, req);
}

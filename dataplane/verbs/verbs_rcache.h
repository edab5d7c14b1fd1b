/*
 * verbs transport: registration cache.
 *
 * Registering memory with an RDMA device pins pages and programs the NIC's
 * translation tables: tens of microseconds for small regions, milliseconds
 * for large ones.  The cache turns repeated and overlapping registrations of
 * the same memory into a refcount bump.
 *
 *   - Local-only regions are page aligned: a request for [addr, addr + len)
 *     registers the pages that hold it.  Remotely writable regions are
 *     exactly [addr, addr + len) (the device pins whole pages, but the
 *     registration's bounds are the caller's bytes) and serve only requests
 *     for exactly those bytes.
 *   - A request that lies inside a registered region with at least the
 *     requested access takes a reference on it (a hit).  A local-only
 *     request that overlaps local-only regions without fitting in one
 *     registers their union once; the overlapped regions leave the index and
 *     are deregistered when their last user lets go (as UCX's rcache does).
 *     Remotely writable regions are never widened by merging: that would
 *     expose memory nobody asked to expose.
 *   - When its last reference goes, a region registered for memory whose
 *     owner reports frees (a "cacheable" request: the engine's arena, which
 *     calls cfx__verbs_rcache_invalidate() before it unmaps a segment) stays
 *     registered on an LRU list of idle regions, bounded in count and bytes.
 *     Any other region is deregistered at once: nothing tells us when user
 *     memory is freed, and a registration that outlives its memory would pin
 *     the old pages while a new mapping at the same address reads different
 *     ones.
 *   - Invalidation removes every region overlapping a range from the index:
 *     idle ones are deregistered now, referenced ones when released.
 *
 * The device calls go through struct cfx__verbs_rcache_ops, so the
 * bookkeeping is tested without a device (test/unit/test_verbs_rcache.c).
 * Lookups scan a list: registration is off the data path, and the number of
 * regions is bounded by live registrations plus the idle bound.
 *
 * Threading: a cache belongs to one iface and is driven by its thread.
 */
#ifndef CFX_VERBS_RCACHE_H
#define CFX_VERBS_RCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/common/list.h"

/* What the device side returns for one registration. */
struct cfx__verbs_reg_info {
    void *handle;          /* struct ibv_mr * (opaque here) */
    uint32_t lkey;
    uint32_t rkey;
};

struct cfx__verbs_rcache_ops {
    /* Register [addr, addr + len) with CFX_TP_ACCESS_* @p access.
     * Returns CFX_OK or a negative status (with cfx__err detail). */
    int (*reg)(void *arg, void *addr, size_t len, unsigned access,
               struct cfx__verbs_reg_info *out);
    /* Undo one successful reg(). */
    void (*dereg)(void *arg, void *handle);
};

struct cfx__verbs_rcache_params {
    size_t page_size;                       /* power of two */
    uint32_t max_idle;                      /* idle regions kept registered */
    size_t max_idle_bytes;                  /* bytes of idle regions kept */
    const struct cfx__verbs_rcache_ops *ops;
    void *arg;                              /* passed to ops */
    const char *name;                       /* for log messages */
};

struct cfx__verbs_region {
    struct cfx_list link;      /* rcache->regions while indexed */
    struct cfx_list lru;       /* rcache->lru while idle and indexed */
    uintptr_t start, end;      /* end exclusive; page aligned unless remotely writable */
    unsigned access;           /* CFX_TP_ACCESS_* it was registered with */
    uint32_t refcount;         /* registrations using it */
    bool indexed;              /* found by lookups */
    bool cacheable;            /* may stay registered while unused */
    struct cfx__verbs_reg_info reg;
};

struct cfx__verbs_rcache_stats {
    uint32_t indexed;          /* regions found by lookups */
    uint32_t idle;             /* of those, unreferenced */
    uint32_t live;             /* registered regions, indexed or not */
    size_t idle_bytes;
    uint64_t hits, misses, merges, evictions, invalidated;
};

struct cfx__verbs_rcache;

int cfx__verbs_rcache_create(const struct cfx__verbs_rcache_params *params,
                             struct cfx__verbs_rcache **out);

/* Deregister everything (regions still referenced are logged); NULL: no-op. */
void cfx__verbs_rcache_destroy(struct cfx__verbs_rcache *rc);

/*
 * A registered region covering [addr, addr + len) with @p access, one
 * reference taken.  @p cacheable: the memory's owner reports frees through
 * cfx__verbs_rcache_invalidate_range().  Release with cfx__verbs_rcache_put().
 */
int cfx__verbs_rcache_get(struct cfx__verbs_rcache *rc, void *addr, size_t len,
                          unsigned access, bool cacheable,
                          struct cfx__verbs_region **out);

/* Drop one reference. */
void cfx__verbs_rcache_put(struct cfx__verbs_rcache *rc, struct cfx__verbs_region *r);

/* Memory in [addr, addr + len) is going away: forget it.  Returns the number
 * of regions taken out of the index. */
uint32_t cfx__verbs_rcache_invalidate_range(struct cfx__verbs_rcache *rc, const void *addr,
                                            size_t len);

void cfx__verbs_rcache_get_stats(const struct cfx__verbs_rcache *rc,
                                 struct cfx__verbs_rcache_stats *out);

#endif

/* verbs transport: registration cache (see verbs_rcache.h). */
#include "verbs_rcache.h"

#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>
#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dataplane/transport.h"

struct cfx__verbs_rcache {
    struct cfx__verbs_rcache_params p;
    struct cfx_list regions;   /* indexed regions */
    struct cfx_list lru;       /* idle indexed regions, oldest first */
    uint32_t live;             /* registered regions (indexed or detached) */
    uint32_t indexed, idle;
    size_t idle_bytes;
    uint64_t hits, misses, merges, evictions, invalidated;
};

int cfx__verbs_rcache_create(const struct cfx__verbs_rcache_params *params,
                             struct cfx__verbs_rcache **out)
{
    if (!params || !out || !params->ops || !params->ops->reg || !params->ops->dereg ||
        !params->page_size || (params->page_size & (params->page_size - 1)))
        return cfx__err(CFX_ERR_INVALID, "verbs rcache: bad parameters");
    struct cfx__verbs_rcache *rc = calloc(1, sizeof(*rc));
    if (!rc)
        return cfx__err(CFX_ERR_NOMEM, "verbs rcache: out of memory");
    rc->p = *params;
    if (!rc->p.name)
        rc->p.name = "verbs";
    cfx_list_init(&rc->regions);
    cfx_list_init(&rc->lru);
    *out = rc;
    return CFX_OK;
}

static void region_free(struct cfx__verbs_rcache *rc, struct cfx__verbs_region *r)
{
    rc->p.ops->dereg(rc->p.arg, r->reg.handle);
    rc->live--;
    free(r);
}

/* Take @p r out of the index; deregister it now if nobody uses it. */
static void region_unindex(struct cfx__verbs_rcache *rc, struct cfx__verbs_region *r)
{
    cfx_list_del(&r->link);
    r->indexed = false;
    rc->indexed--;
    if (r->refcount == 0) {
        cfx_list_del(&r->lru);
        rc->idle--;
        rc->idle_bytes -= r->end - r->start;
        region_free(rc, r);
    }
}

void cfx__verbs_rcache_destroy(struct cfx__verbs_rcache *rc)
{
    if (!rc)
        return;
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &rc->regions) {
        struct cfx__verbs_region *r = cfx_list_entry(pos, struct cfx__verbs_region, link);
        if (r->refcount) {
            CFX_LOG(WARN, VERBS, "%s: region [%#lx, %#lx) still has %u registration(s) at close",
                    rc->p.name, (unsigned long)r->start, (unsigned long)r->end, r->refcount);
            r->refcount = 0;
            cfx_list_init(&r->lru);
            rc->idle++;
            rc->idle_bytes += r->end - r->start;
        }
        region_unindex(rc, r);
    }
    if (rc->live)
        CFX_LOG(WARN, VERBS, "%s: %u detached region(s) still referenced at close", rc->p.name,
                rc->live);
    free(rc);
}

static void evict(struct cfx__verbs_rcache *rc)
{
    while (rc->idle && (rc->idle > rc->p.max_idle || rc->idle_bytes > rc->p.max_idle_bytes)) {
        struct cfx__verbs_region *r =
            cfx_list_entry(rc->lru.next, struct cfx__verbs_region, lru);
        rc->evictions++;
        region_unindex(rc, r);
    }
}

static void region_ref(struct cfx__verbs_rcache *rc, struct cfx__verbs_region *r)
{
    if (r->refcount++ == 0) {
        cfx_list_del(&r->lru);
        rc->idle--;
        rc->idle_bytes -= r->end - r->start;
    }
}

int cfx__verbs_rcache_get(struct cfx__verbs_rcache *rc, void *addr, size_t len,
                          unsigned access, bool cacheable, struct cfx__verbs_region **out)
{
    uintptr_t mask = (uintptr_t)rc->p.page_size - 1;
    uintptr_t start, end;
    struct cfx_list *pos, *tmp;
    struct cfx__verbs_region *r;
    bool merge = !(access & CFX_TP_ACCESS_REMOTE_WRITE);
    int rc_status;

    if (!addr || !len || (uintptr_t)addr + len < (uintptr_t)addr)
        return cfx__err(CFX_ERR_INVALID, "%s: cannot register %zu bytes at %p", rc->p.name,
                        len, addr);
    if (merge) {
        start = (uintptr_t)addr & ~mask;
        end = ((uintptr_t)addr + len + mask) & ~mask;
    } else {
        /* Remotely writable: exactly the caller's bytes, so that no
         * registration of it reaches the memory around it, and only a
         * region of exactly these bytes serves it. */
        start = (uintptr_t)addr;
        end = (uintptr_t)addr + len;
    }
    if (end == 0) /* the last page of the address space */
        return cfx__err(CFX_ERR_INVALID, "%s: region at %p wraps", rc->p.name, addr);

    cfx_list_for_each(pos, &rc->regions) {
        r = cfx_list_entry(pos, struct cfx__verbs_region, link);
        bool fits = merge ? r->start <= start && r->end >= end
                          : r->start == start && r->end == end;
        if (fits && (r->access & access) == access) {
            region_ref(rc, r);
            rc->hits++;
            *out = r;
            return CFX_OK;
        }
    }
    rc->misses++;

    /* Local-only: cover the overlapping local-only regions too, so that one
     * registration serves all of them from now on. */
    if (merge) {
        cfx_list_for_each(pos, &rc->regions) {
            r = cfx_list_entry(pos, struct cfx__verbs_region, link);
            if (r->access == access && r->start < end && r->end > start) {
                start = CFX_MIN(start, r->start);
                end = CFX_MAX(end, r->end);
                cacheable = cacheable && r->cacheable;
            }
        }
    }

    r = calloc(1, sizeof(*r));
    if (!r)
        return cfx__err(CFX_ERR_NOMEM, "%s: out of memory for a region", rc->p.name);
    rc_status = rc->p.ops->reg(rc->p.arg, (void *)start, end - start, access, &r->reg);
    if (rc_status != CFX_OK) {
        free(r);
        return rc_status;
    }
    rc->live++;

    if (merge) {
        cfx_list_for_each_safe(pos, tmp, &rc->regions) {
            struct cfx__verbs_region *o = cfx_list_entry(pos, struct cfx__verbs_region, link);
            if (o->access == access && o->start >= start && o->end <= end) {
                rc->merges++;
                region_unindex(rc, o);
            }
        }
    }

    r->start = start;
    r->end = end;
    r->access = access;
    r->refcount = 1;
    r->cacheable = cacheable;
    r->indexed = true;
    cfx_list_init(&r->lru);
    cfx_list_add_head(&r->link, &rc->regions);
    rc->indexed++;
    CFX_LOG(TRACE, VERBS, "%s: registered [%#lx, %#lx) access %#x lkey %#x rkey %#x",
            rc->p.name, (unsigned long)start, (unsigned long)end, access, r->reg.lkey,
            r->reg.rkey);
    *out = r;
    return CFX_OK;
}

void cfx__verbs_rcache_put(struct cfx__verbs_rcache *rc, struct cfx__verbs_region *r)
{
    if (!r || r->refcount == 0)
        return;
    if (--r->refcount)
        return;
    if (!r->indexed) {
        region_free(rc, r);
        return;
    }
    if (!r->cacheable || rc->p.max_idle == 0) {
        cfx_list_del(&r->link);
        r->indexed = false;
        rc->indexed--;
        region_free(rc, r);
        return;
    }
    cfx_list_add_tail(&r->lru, &rc->lru);
    rc->idle++;
    rc->idle_bytes += r->end - r->start;
    evict(rc);
}

uint32_t cfx__verbs_rcache_invalidate_range(struct cfx__verbs_rcache *rc, const void *addr,
                                            size_t len)
{
    uintptr_t start = (uintptr_t)addr, end = (uintptr_t)addr + len;
    struct cfx_list *pos, *tmp;
    uint32_t n = 0;

    if (!rc || !len)
        return 0;
    if (end < start)
        end = UINTPTR_MAX;
    cfx_list_for_each_safe(pos, tmp, &rc->regions) {
        struct cfx__verbs_region *r = cfx_list_entry(pos, struct cfx__verbs_region, link);
        if (r->start < end && r->end > start) {
            region_unindex(rc, r);
            n++;
        }
    }
    rc->invalidated += n;
    return n;
}

void cfx__verbs_rcache_get_stats(const struct cfx__verbs_rcache *rc,
                                 struct cfx__verbs_rcache_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->indexed = rc->indexed;
    out->idle = rc->idle;
    out->live = rc->live;
    out->idle_bytes = rc->idle_bytes;
    out->hits = rc->hits;
    out->misses = rc->misses;
    out->merges = rc->merges;
    out->evictions = rc->evictions;
    out->invalidated = rc->invalidated;
}

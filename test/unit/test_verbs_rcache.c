/*
 * verbs transport: registration cache bookkeeping
 * (dataplane/verbs/verbs_rcache.h) with a fake device: page alignment,
 * reuse and refcounts, merging, idle caching with its LRU bounds,
 * invalidation, and failures.
 *
 * The module is compiled into this test directly: libconflux only carries
 * it when the verbs transport is built.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dataplane/verbs/verbs_rcache.c"

#define PAGE 4096u
#define MAXH 64

struct fake {
    int regs, deregs, fail_next;
    struct { uintptr_t addr; size_t len; unsigned access; bool live; } h[MAXH];
};

static struct fake F;

static int fake_reg(void *arg, void *addr, size_t len, unsigned access,
                    struct cfx__verbs_reg_info *out)
{
    struct fake *f = arg;
    if (f->fail_next) {
        f->fail_next = 0;
        return cfx__err(CFX_ERR_MEMLOCK, "fake: registration refused");
    }
    cr_assert_lt(f->regs, MAXH);
    int i = f->regs++;
    f->h[i].addr = (uintptr_t)addr;
    f->h[i].len = len;
    f->h[i].access = access;
    f->h[i].live = true;
    out->handle = &f->h[i];
    out->lkey = 0x100u + (uint32_t)i;
    out->rkey = 0x200u + (uint32_t)i;
    return CFX_OK;
}

static void fake_dereg(void *arg, void *handle)
{
    struct fake *f = arg;
    typeof(&f->h[0]) h = handle;
    cr_assert(h->live, "double deregistration");
    h->live = false;
    f->deregs++;
}

static const struct cfx__verbs_rcache_ops fake_ops = { fake_reg, fake_dereg };

static struct cfx__verbs_rcache *mk(uint32_t max_idle, size_t max_bytes)
{
    struct cfx__verbs_rcache *rc = NULL;
    memset(&F, 0, sizeof(F));
    struct cfx__verbs_rcache_params p = {
        .page_size = PAGE, .max_idle = max_idle, .max_idle_bytes = max_bytes,
        .ops = &fake_ops, .arg = &F, .name = "test",
    };
    cr_assert_eq(cfx__verbs_rcache_create(&p, &rc), CFX_OK);
    return rc;
}

/* Addresses are never dereferenced: a fake arena of page numbers. */
#define AT(page, off) ((void *)(uintptr_t)(0x10000000u + (page) * PAGE + (off)))
#define LOC CFX_TP_ACCESS_LOCAL
#define RW  (CFX_TP_ACCESS_LOCAL | CFX_TP_ACCESS_REMOTE_WRITE)

static struct cfx__verbs_region *get(struct cfx__verbs_rcache *rc, void *a, size_t len,
                                     unsigned acc, bool cacheable)
{
    struct cfx__verbs_region *r = NULL;
    int st = cfx__verbs_rcache_get(rc, a, len, acc, cacheable, &r);
    cr_assert_eq(st, CFX_OK, "get: %s", cfx_last_error());
    cr_assert_not_null(r);
    return r;
}

TestSuite(verbs_rcache);

Test(verbs_rcache, page_aligned)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *r = get(rc, AT(3, 100), 10, LOC, false);
    cr_assert_eq(r->start, (uintptr_t)AT(3, 0));
    cr_assert_eq(r->end, (uintptr_t)AT(4, 0));
    cr_assert_eq(F.h[0].addr, (uintptr_t)AT(3, 0), "the device sees whole pages");
    cr_assert_eq(F.h[0].len, PAGE);

    /* A remotely writable region is exactly the caller's bytes: the device
     * is asked for 2 bytes across a page boundary, not for both pages. */
    struct cfx__verbs_region *r2 = get(rc, AT(10, PAGE - 1), 2, RW, false);
    cr_assert_eq(r2->start, (uintptr_t)AT(10, PAGE - 1));
    cr_assert_eq(r2->end, (uintptr_t)AT(11, 1));
    cr_assert_eq(F.h[1].addr, (uintptr_t)AT(10, PAGE - 1), "no page rounding for remote writes");
    cr_assert_eq(F.h[1].len, 2);
    cfx__verbs_rcache_put(rc, r);
    cfx__verbs_rcache_put(rc, r2);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.regs, F.deregs);
}

Test(verbs_rcache, reuse_and_refcount)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *a = get(rc, AT(0, 0), 4 * PAGE, RW, false);
    struct cfx__verbs_region *b = get(rc, AT(1, 17), 100, RW, false);
    struct cfx__verbs_region *c = get(rc, AT(2, 0), PAGE, LOC, false);
    struct cfx__verbs_region *d = get(rc, AT(0, 0), 4 * PAGE, RW, false);
    cr_assert_neq(a, b, "remote writes inside a larger region get a region of their own bytes");
    cr_assert_eq(b->start, (uintptr_t)AT(1, 17));
    cr_assert_eq(b->end, (uintptr_t)AT(1, 117));
    cr_assert_eq(a, c, "local use of a remotely writable region reuses it");
    cr_assert_eq(a, d, "the same remotely writable bytes reuse it");
    cr_assert_eq(a->refcount, 3);
    cr_assert_eq(F.regs, 2);

    /* Remote access is not granted by a local-only region. */
    struct cfx__verbs_region *l = get(rc, AT(20, 0), 2 * PAGE, LOC, false);
    struct cfx__verbs_region *w = get(rc, AT(20, 0), PAGE, RW, false);
    cr_assert_neq(l, w);
    cr_assert_eq(F.regs, 4);

    cfx__verbs_rcache_put(rc, a);
    cfx__verbs_rcache_put(rc, d);
    cr_assert_eq(F.deregs, 0, "still referenced");
    cfx__verbs_rcache_put(rc, c);
    cr_assert_eq(F.deregs, 1, "user memory is deregistered with its last user");
    cfx__verbs_rcache_put(rc, b);
    cfx__verbs_rcache_put(rc, l);
    cfx__verbs_rcache_put(rc, w);
    cr_assert_eq(F.deregs, 4);
    struct cfx__verbs_rcache_stats st;
    cfx__verbs_rcache_get_stats(rc, &st);
    cr_assert_eq(st.live, 0);
    cr_assert_eq(st.hits, 2);
    cfx__verbs_rcache_destroy(rc);
}

Test(verbs_rcache, local_regions_merge_remote_do_not)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *a = get(rc, AT(0, 0), 2 * PAGE, LOC, false);
    struct cfx__verbs_region *b = get(rc, AT(1, 0), 2 * PAGE, LOC, false);
    cr_assert_neq(a, b);
    cr_assert_eq(b->start, (uintptr_t)AT(0, 0), "the union of overlapping local regions");
    cr_assert_eq(b->end, (uintptr_t)AT(3, 0));
    cr_assert_not(a->indexed, "the merged region left the index");
    cr_assert_eq(F.deregs, 0, "but stays registered while used");
    struct cfx__verbs_region *c = get(rc, AT(0, 0), PAGE, LOC, false);
    cr_assert_eq(c, b, "lookups find the union");
    cfx__verbs_rcache_put(rc, a);
    cr_assert_eq(F.deregs, 1);
    cfx__verbs_rcache_put(rc, b);
    cfx__verbs_rcache_put(rc, c);
    cr_assert_eq(F.deregs, 2);

    /* Remotely writable regions are never widened. */
    struct cfx__verbs_region *x = get(rc, AT(30, 0), 2 * PAGE, RW, false);
    struct cfx__verbs_region *y = get(rc, AT(31, 0), 2 * PAGE, RW, false);
    cr_assert_eq(y->start, (uintptr_t)AT(31, 0));
    cr_assert_eq(y->end, (uintptr_t)AT(33, 0));
    cr_assert(x->indexed && y->indexed);
    cfx__verbs_rcache_put(rc, x);
    cfx__verbs_rcache_put(rc, y);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.regs, F.deregs);
}

Test(verbs_rcache, idle_cacheable_reused)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *a = get(rc, AT(0, 0), PAGE, LOC, true);
    cfx__verbs_rcache_put(rc, a);
    cr_assert_eq(F.deregs, 0, "arena memory stays registered while idle");
    struct cfx__verbs_rcache_stats st;
    cfx__verbs_rcache_get_stats(rc, &st);
    cr_assert_eq(st.idle, 1);
    cr_assert_eq(st.idle_bytes, PAGE);
    struct cfx__verbs_region *b = get(rc, AT(0, 8), 8, LOC, true);
    cr_assert_eq(a, b);
    cr_assert_eq(F.regs, 1, "no second registration");
    cfx__verbs_rcache_get_stats(rc, &st);
    cr_assert_eq(st.idle, 0);
    cfx__verbs_rcache_put(rc, b);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.deregs, 1, "destroy deregisters idle regions");
}

Test(verbs_rcache, lru_bound_by_count)
{
    struct cfx__verbs_rcache *rc = mk(2, 1 << 30);
    struct cfx__verbs_region *r[3];
    for (int i = 0; i < 3; i++)
        r[i] = get(rc, AT(10 * i, 0), PAGE, LOC, true);
    cfx__verbs_rcache_put(rc, r[0]);
    cfx__verbs_rcache_put(rc, r[1]);
    /* Touch region 0: now region 1 is the least recently used. */
    struct cfx__verbs_region *again = get(rc, AT(0, 0), PAGE, LOC, true);
    cr_assert_eq(again, r[0]);
    cfx__verbs_rcache_put(rc, again);
    cr_assert_eq(F.deregs, 0);
    cfx__verbs_rcache_put(rc, r[2]);
    cr_assert_eq(F.deregs, 1, "a third idle region evicts one");
    cr_assert_not(F.h[1].live, "the least recently used one");
    cr_assert(F.h[0].live && F.h[2].live);
    struct cfx__verbs_rcache_stats st;
    cfx__verbs_rcache_get_stats(rc, &st);
    cr_assert_eq(st.idle, 2);
    cr_assert_eq(st.evictions, 1);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.regs, F.deregs);
}

Test(verbs_rcache, lru_bound_by_bytes)
{
    struct cfx__verbs_rcache *rc = mk(100, 3 * PAGE);
    struct cfx__verbs_region *a = get(rc, AT(0, 0), 2 * PAGE, LOC, true);
    struct cfx__verbs_region *b = get(rc, AT(10, 0), 2 * PAGE, LOC, true);
    cfx__verbs_rcache_put(rc, a);
    cr_assert_eq(F.deregs, 0);
    cfx__verbs_rcache_put(rc, b);
    cr_assert_eq(F.deregs, 1, "4 idle pages > 3 allowed");
    cr_assert_not(F.h[0].live);
    cfx__verbs_rcache_destroy(rc);
}

Test(verbs_rcache, no_idle_cache_when_bound_is_zero)
{
    struct cfx__verbs_rcache *rc = mk(0, 1 << 30);
    struct cfx__verbs_region *a = get(rc, AT(0, 0), PAGE, LOC, true);
    cfx__verbs_rcache_put(rc, a);
    cr_assert_eq(F.deregs, 1);
    cfx__verbs_rcache_destroy(rc);
}

Test(verbs_rcache, invalidation)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *idle = get(rc, AT(0, 0), 2 * PAGE, LOC, true);
    struct cfx__verbs_region *busy = get(rc, AT(10, 0), 2 * PAGE, RW, true);
    struct cfx__verbs_region *other = get(rc, AT(20, 0), PAGE, LOC, true);
    cfx__verbs_rcache_put(rc, idle);

    /* A range that touches one byte of each of the first two. */
    cr_assert_eq(cfx__verbs_rcache_invalidate_range(rc, AT(1, PAGE - 1), 9 * PAGE + 2), 2);
    cr_assert_not(F.h[0].live, "an idle region goes at once");
    cr_assert(F.h[1].live, "a used region stays until released");
    cr_assert_not(busy->indexed);

    /* New registrations of the range do not find the stale region. */
    struct cfx__verbs_region *fresh = get(rc, AT(10, 0), PAGE, RW, true);
    cr_assert_neq(fresh, busy);
    cfx__verbs_rcache_put(rc, busy);
    cr_assert_not(F.h[1].live, "released after invalidation: deregistered, not cached");
    cr_assert(F.h[2].live, "memory outside the range is untouched");
    cr_assert_eq(cfx__verbs_rcache_invalidate_range(rc, AT(50, 0), PAGE), 0);
    cfx__verbs_rcache_put(rc, fresh);
    cfx__verbs_rcache_put(rc, other);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.regs, F.deregs);
}

Test(verbs_rcache, failures)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    struct cfx__verbs_region *r = NULL;
    F.fail_next = 1;
    cr_assert_eq(cfx__verbs_rcache_get(rc, AT(0, 0), PAGE, LOC, false, &r), CFX_ERR_MEMLOCK);
    cr_assert_null(r);
    cr_assert_eq(cfx__verbs_rcache_get(rc, NULL, PAGE, LOC, false, &r), CFX_ERR_INVALID);
    cr_assert_eq(cfx__verbs_rcache_get(rc, AT(0, 0), 0, LOC, false, &r), CFX_ERR_INVALID);
    struct cfx__verbs_rcache_stats st;
    cfx__verbs_rcache_get_stats(rc, &st);
    cr_assert_eq(st.live, 0);
    cr_assert_eq(st.indexed, 0);
    /* Works again afterwards. */
    r = get(rc, AT(0, 0), PAGE, LOC, false);
    cfx__verbs_rcache_put(rc, r);
    cfx__verbs_rcache_put(rc, NULL);
    cfx__verbs_rcache_destroy(rc);
    cfx__verbs_rcache_destroy(NULL);
    cr_assert_eq(F.regs, F.deregs);

    struct cfx__verbs_rcache_params bad = { .page_size = 3000, .ops = &fake_ops };
    cr_assert_eq(cfx__verbs_rcache_create(&bad, &rc), CFX_ERR_INVALID);
}

Test(verbs_rcache, destroy_with_live_registrations)
{
    struct cfx__verbs_rcache *rc = mk(8, 1 << 30);
    get(rc, AT(0, 0), PAGE, LOC, false);
    get(rc, AT(5, 0), PAGE, RW, true);
    cfx__verbs_rcache_destroy(rc);
    cr_assert_eq(F.regs, 2);
    cr_assert_eq(F.deregs, 2, "nothing stays pinned after the iface closes");
}

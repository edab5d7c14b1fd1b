/*
 * The transport base's slot table and graveyard (tpbase.h).
 */
#include <stdlib.h>

#include "tpbase.h"

void cfx__tp_table_init(struct cfx__tp_table *t, uint32_t first, uint32_t max,
                        unsigned gen_bits, const char *what)
{
    t->slots = NULL;
    t->cap = 0;
    t->free = UINT32_MAX;
    t->first = first ? first : 16;
    t->max = max;
    t->gen_mask = gen_bits >= 32 ? UINT32_MAX : (1u << gen_bits) - 1;
    t->gen_first = 1 & t->gen_mask;
    t->what = what;
}

void cfx__tp_table_seed_gen(struct cfx__tp_table *t, uint32_t seed)
{
    t->gen_first = seed & t->gen_mask;
}

void cfx__tp_table_fini(struct cfx__tp_table *t)
{
    free(t->slots);
    t->slots = NULL;
    t->cap = 0;
    t->free = UINT32_MAX;
}

static int table_grow(struct cfx__tp_table *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : t->first;
    if (cap > t->max || cap < t->cap)
        cap = t->max;
    if (cap <= t->cap)
        return cfx__err(CFX_ERR_NO_RESOURCE, "%s table full (%u)", t->what, t->cap);
    struct cfx__tp_slot *s = realloc(t->slots, (size_t)cap * sizeof(*s));
    if (!s)
        return cfx__err(CFX_ERR_NOMEM, "cannot grow the %s table to %u", t->what, cap);
    /* new slots go on the free list, lowest index first */
    for (uint32_t i = cap; i-- > t->cap;) {
        s[i].obj = NULL;
        s[i].gen = t->gen_first;
        s[i].next_free = t->free;
        t->free = i;
    }
    t->slots = s;
    t->cap = cap;
    return CFX_OK;
}

int cfx__tp_table_add(struct cfx__tp_table *t, void *obj, uint32_t *idx, uint32_t *gen)
{
    int rc;
    if (t->free == UINT32_MAX && (rc = table_grow(t)) != CFX_OK)
        return rc;
    uint32_t i = t->free;
    struct cfx__tp_slot *s = &t->slots[i];
    t->free = s->next_free;
    s->obj = obj;
    s->next_free = UINT32_MAX;
    if (idx)
        *idx = i;
    if (gen)
        *gen = s->gen;
    return CFX_OK;
}

void cfx__tp_table_remove(struct cfx__tp_table *t, uint32_t idx)
{
    struct cfx__tp_slot *s = &t->slots[idx];
    s->obj = NULL;
    s->gen = (s->gen + 1) & t->gen_mask;
    s->next_free = t->free;
    t->free = idx;
}

void cfx__tp_graveyard_free(struct cfx__tp_graveyard *g)
{
    while (!cfx_list_empty(&g->list)) {
        struct cfx_list *link = g->list.next;
        cfx_list_del(link);
        g->destroy(link);
    }
}

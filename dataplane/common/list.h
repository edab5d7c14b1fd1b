/* Intrusive doubly linked list, kernel style. */
#ifndef CFX_COMMON_LIST_H
#define CFX_COMMON_LIST_H

#include <stdbool.h>
#include "util.h"

struct cfx_list {
    struct cfx_list *next, *prev;
};

#define CFX_LIST_INIT(name) { &(name), &(name) }

static inline void cfx_list_init(struct cfx_list *h) { h->next = h->prev = h; }
static inline bool cfx_list_empty(const struct cfx_list *h) { return h->next == h; }

static inline void cfx__list_insert(struct cfx_list *n, struct cfx_list *prev,
                                    struct cfx_list *next)
{
    next->prev = n;
    n->next = next;
    n->prev = prev;
    prev->next = n;
}

static inline void cfx_list_add_head(struct cfx_list *n, struct cfx_list *h)
{
    cfx__list_insert(n, h, h->next);
}

static inline void cfx_list_add_tail(struct cfx_list *n, struct cfx_list *h)
{
    cfx__list_insert(n, h->prev, h);
}

static inline void cfx_list_del(struct cfx_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = n;
}

#define cfx_list_entry(ptr, type, member) container_of(ptr, type, member)

#define cfx_list_for_each_safe(pos, tmp, head)                                 \
    for (pos = (head)->next, tmp = pos->next; pos != (head);                   \
         pos = tmp, tmp = pos->next)

#define cfx_list_for_each(pos, head)                                           \
    for (pos = (head)->next; pos != (head); pos = pos->next)

#endif

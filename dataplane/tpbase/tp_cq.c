/*
 * The transport base's completion queue: a ring sized by per-endpoint
 * reservations, and behind it an overflow list that keeps whatever does
 * not fit, in order (tpbase.h says the rule).
 */
#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"
#include "tpbase.h"

#define CQ_DEFAULT 64

static int ring_resize(struct cfx__tp_cq *cq, uint32_t cap)
{
    struct cfx_tp_completion *ring = malloc((size_t)cap * sizeof(*ring));
    if (!ring)
        return CFX_ERR_NOMEM;
    for (uint32_t i = 0; i < cq->count; i++)
        ring[i] = cq->ring[(cq->head + i) % cq->cap];
    free(cq->ring);
    cq->ring = ring;
    cq->cap = cap;
    cq->head = 0;
    return CFX_OK;
}

int cfx__tp_cq_init(struct cfx__tp_cq *cq, uint32_t cap, const char *who)
{
    memset(cq, 0, sizeof(*cq));
    cfx_list_init(&cq->overflow);
    cq->overflow_max = CFX_TP_CQ_OVERFLOW_MAX;
    cq->who = who ? who : "?";
    return ring_resize(cq, cap ? cap : CQ_DEFAULT);
}

void cfx__tp_cq_fini(struct cfx__tp_cq *cq)
{
    struct cfx_list *pos, *tmp;
    if (!cq->overflow.next)
        return; /* never initialised (zeroed) */
    cfx_list_for_each_safe(pos, tmp, &cq->overflow)
        free(cfx_list_entry(pos, struct cfx__tp_cq_chunk, link));
    cfx_list_init(&cq->overflow);
    free(cq->spare);
    free(cq->ring);
    cq->spare = NULL;
    cq->ring = NULL;
    cq->cap = cq->count = cq->n_overflow = 0;
}

int cfx__tp_cq_reserve(struct cfx__tp_cq *cq, uint32_t n)
{
    uint32_t need = cq->reserved + n;
    if (need > cq->cap) {
        uint32_t cap = CFX_MAX(need, cq->cap * 2);
        if (ring_resize(cq, cap) != CFX_OK)
            return cfx__err(CFX_ERR_NOMEM, "%s: cannot grow the completion queue to %u",
                            cq->who, cap);
        /* room for what waited in the overflow */
        cfx__tp_cq_refill(cq);
    }
    cq->reserved = need;
    return CFX_OK;
}

void cfx__tp_cq_unreserve(struct cfx__tp_cq *cq, uint32_t n)
{
    cq->reserved -= n;
}

static struct cfx__tp_cq_chunk *chunk_new(struct cfx__tp_cq *cq)
{
    struct cfx__tp_cq_chunk *ch = cq->spare;
    if (ch)
        cq->spare = NULL;
    else if (!(ch = malloc(sizeof(*ch))))
        return NULL;
    ch->head = ch->tail = 0;
    cfx_list_add_tail(&ch->link, &cq->overflow);
    return ch;
}

static void chunk_done(struct cfx__tp_cq *cq, struct cfx__tp_cq_chunk *ch)
{
    cfx_list_del(&ch->link);
    if (!cq->spare)
        cq->spare = ch;
    else
        free(ch);
}

struct cfx_tp_completion *cfx__tp_cq_push_slow(struct cfx__tp_cq *cq)
{
    struct cfx__tp_cq_chunk *ch = NULL;

    if (cq->count < cq->cap && !cq->n_overflow) {
        /* not full after all (the fast path's test is conservative) */
        uint32_t i = (cq->head + cq->count++) % cq->cap;
        cq->ring[i] = (struct cfx_tp_completion){ 0 };
        return &cq->ring[i];
    }
    if (!cfx_list_empty(&cq->overflow))
        ch = cfx_list_entry(cq->overflow.prev, struct cfx__tp_cq_chunk, link);
    if (unlikely(cq->n_overflow >= cq->overflow_max) ||
        ((!ch || ch->tail == CFX_TP_CQ_CHUNK) && !(ch = chunk_new(cq)))) {
        if (!cq->n_lost++)
            CFX_LOG(ERR, TP, "%s: completion queue overflow past %u completions (%s): "
                    "a completion is lost; poll() reports CFX_ERR_NO_RESOURCE",
                    cq->who, cq->n_overflow,
                    cq->n_overflow >= cq->overflow_max ? "cap" : "out of memory");
        cq->status = CFX_ERR_NO_RESOURCE;
        cq->sink = (struct cfx_tp_completion){ 0 };
        return &cq->sink;
    }
    if (!cq->n_overflowed++)
        CFX_LOG(DEBUG, TP, "%s: completion queue full (%u): overflow in use", cq->who,
                cq->cap);
    cq->n_overflow++;
    struct cfx_tp_completion *c = &ch->c[ch->tail++];
    *c = (struct cfx_tp_completion){ 0 };
    return c;
}

/* Move overflow entries into the ring while it has room: the ring always
 * holds the oldest entries. */
void cfx__tp_cq_refill(struct cfx__tp_cq *cq)
{
    while (cq->n_overflow && cq->count < cq->cap) {
        struct cfx__tp_cq_chunk *ch =
            cfx_list_entry(cq->overflow.next, struct cfx__tp_cq_chunk, link);
        while (ch->head < ch->tail && cq->count < cq->cap) {
            cq->ring[(cq->head + cq->count++) % cq->cap] = ch->c[ch->head++];
            cq->n_overflow--;
        }
        if (ch->head == ch->tail)
            chunk_done(cq, ch);
    }
}

void cfx__tp_cq_drop_ep(struct cfx__tp_cq *cq, const struct cfx_tp_ep *ep)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < cq->count; i++) {
        struct cfx_tp_completion *c = &cq->ring[(cq->head + i) % cq->cap];
        if (c->ep != ep)
            cq->ring[(cq->head + kept++) % cq->cap] = *c;
    }
    cq->count = kept;

    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &cq->overflow) {
        struct cfx__tp_cq_chunk *ch = cfx_list_entry(pos, struct cfx__tp_cq_chunk, link);
        uint32_t k = ch->head;
        for (uint32_t i = ch->head; i < ch->tail; i++) {
            if (ch->c[i].ep != ep)
                ch->c[k++] = ch->c[i];
            else
                cq->n_overflow--;
        }
        ch->tail = k;
        if (ch->head == ch->tail)
            chunk_done(cq, ch);
    }
    cfx__tp_cq_refill(cq);
}

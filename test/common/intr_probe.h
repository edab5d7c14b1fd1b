/*
 * An interrupt check for tests of cfx_set_interrupt_check(): counts its
 * calls, takes the context's and its client's locks (a check run under
 * either would never get it: the test's timeout), and asks to stop at
 * once, or once a chunk of object @p id landed on @p ctx.  Engine-internal:
 * include after dataplane/engine/engine.h and control/client_int.h.
 */
#ifndef CFX_TEST_INTR_PROBE_H
#define CFX_TEST_INTR_PROBE_H

#include <pthread.h>
#include <stdbool.h>

struct intr_probe {
    struct cfx_context *ctx;
    const struct cfx_object_id *id; /* stop once a chunk of it landed; NULL: at once */
    int calls;
};

static inline int intr_check(void *arg)
{
    struct intr_probe *p = arg;
    p->calls++;
    pthread_mutex_lock(&p->ctx->ctl->lock);
    pthread_mutex_unlock(&p->ctx->ctl->lock);
    pthread_mutex_lock(&p->ctx->lock);
    const struct cfx_obj *o = p->id ? cfx__store_find(&p->ctx->store, p->id) : NULL;
    bool stop = !p->id || (o && o->ready_chunks > 0);
    pthread_mutex_unlock(&p->ctx->lock);
    return stop;
}

#endif

/* The table of built transports. */
#include "transport.h"

#include <stdlib.h>
#include <string.h>

#include "dataplane/common/log.h"

__thread const void *cfx__tp_driver;

void cfx__tp_thread_violation(const struct cfx_tp_iface *iface, const char *fn)
{
    CFX_LOG(ERR, PROGRESS,
            "node %u: %s %s() called by a thread that does not hold the "
            "progress lock (engine.h: API threads never call a transport)",
            iface->node_id, iface->ops ? iface->ops->name : "?", fn);
    abort();
}

const struct cfx_transport_ops *const cfx__transports[] = {
    &cfx__shm_ops,
#ifdef CFX_HAVE_VERBS
    &cfx__verbs_ops,
#endif
    &cfx__tcp_ops,
#ifdef CFX_HAVE_DPDK
    &cfx__dpdk_ops, /* last: chosen only when asked for (--transport dpdk) */
#endif
    NULL,
};

const struct cfx_transport_ops *cfx__transport_find(const char *name)
{
    for (int i = 0; cfx__transports[i]; i++)
        if (!strcmp(cfx__transports[i]->name, name))
            return cfx__transports[i];
    return NULL;
}

/* The table of built transports. */
#include "transport.h"

#include <string.h>

const struct cfx_transport_ops *const cfx__transports[] = {
    &cfx__shm_ops,
#ifdef CFX_HAVE_VERBS
    &cfx__verbs_ops,
#endif
    &cfx__tcp_ops,
    NULL,
};

const struct cfx_transport_ops *cfx__transport_find(const char *name)
{
    for (int i = 0; cfx__transports[i]; i++)
        if (!strcmp(cfx__transports[i]->name, name))
            return cfx__transports[i];
    return NULL;
}

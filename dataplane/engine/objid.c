/* Object ids: named (SHA-1 of a name), generated.  Their hex form is in
 * dataplane/common/objid_hex.c, which the coordinator links too. */
#include "engine.h"
#include "objname.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

int cfx_object_id_from_name(const char *name, struct cfx_object_id *out)
{
    cfx__err_clear();
    if (!name || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_object_id_from_name: NULL argument");
    SHA1((const unsigned char *)name, strlen(name), out->bytes);
    cfx__objname_remember(out, name); /* a put of this id will name it */
    return CFX_OK;
}

int cfx_object_id_generate(struct cfx_context *ctx, struct cfx_object_id *out)
{
    cfx__err_clear();
    if (!ctx || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_object_id_generate: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    uint64_t n = ++ctx->id_counter;
    pthread_mutex_unlock(&ctx->lock);
    /* node id + counter make it unique in the cluster; random bits make it
     * unique across coordinator lifetimes */
    memcpy(out->bytes, &n, 8);
    memcpy(out->bytes + 8, &ctx->node_id, 4);
    if (getrandom(out->bytes + 12, 8, 0) != 8)
        memset(out->bytes + 12, 0x5a, 8);
    return CFX_OK;
}

/* Object ids: named (SHA-1 of a name), generated, hex. */
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

void cfx_object_id_to_hex(const struct cfx_object_id *id, char *buf)
{
    static const char digits[] = "0123456789abcdef";
    if (!buf)
        return;
    if (!id) {
        buf[0] = '\0';
        return;
    }
    for (int i = 0; i < CFX_OBJECT_ID_LEN; i++) {
        buf[2 * i] = digits[id->bytes[i] >> 4];
        buf[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    buf[2 * CFX_OBJECT_ID_LEN] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int cfx_object_id_from_hex(const char *hex, struct cfx_object_id *out)
{
    cfx__err_clear();
    if (!hex || !out || strlen(hex) != 2 * CFX_OBJECT_ID_LEN)
        return cfx__err(CFX_ERR_INVALID, "object id must be %d hex digits", 2 * CFX_OBJECT_ID_LEN);
    for (int i = 0; i < CFX_OBJECT_ID_LEN; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return cfx__err(CFX_ERR_INVALID, "object id '%s' is not hex", hex);
        out->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return CFX_OK;
}

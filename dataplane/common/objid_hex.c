/* Object ids as hex text, both ways: shared by the library and the
 * coordinator (which names objects in its errors and links no engine). */
#include "util.h"

#include <conflux/object.h>
#include <conflux/status.h>
#include <string.h>

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

/*
 * Object names by id: a small direct-mapped memo filled by
 * cfx_object_id_from_name().
 *
 * Process-wide, not per context, because cfx_object_id_from_name() takes
 * no context (an id is a pure function of its name).  It is a bounded cache,
 * not state: a lost entry only means a put announces no name, so slots are
 * overwritten freely.  SHA-1 ids are uniform, so the first bytes index it.
 */
#include "objname.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "control/client.h"

#define OBJNAME_SLOTS 1024 /* power of two */

struct objname_slot {
    struct cfx_object_id id;
    char name[CFX_OBJ_NAME_MAX + 1]; /* "" when the slot is empty */
};

static pthread_mutex_t objname_lock = PTHREAD_MUTEX_INITIALIZER;
static struct objname_slot objname_slots[OBJNAME_SLOTS];

static struct objname_slot *slot_of(const struct cfx_object_id *id)
{
    uint32_t h = (uint32_t)id->bytes[0] | (uint32_t)id->bytes[1] << 8 |
                 (uint32_t)id->bytes[2] << 16 | (uint32_t)id->bytes[3] << 24;
    return &objname_slots[h & (OBJNAME_SLOTS - 1)];
}

void cfx__objname_remember(const struct cfx_object_id *id, const char *name)
{
    if (!id || !name || !*name)
        return;
    struct objname_slot *s = slot_of(id);
    pthread_mutex_lock(&objname_lock);
    s->id = *id;
    snprintf(s->name, sizeof(s->name), "%.*s", CFX_OBJ_NAME_MAX, name);
    pthread_mutex_unlock(&objname_lock);
}

bool cfx__objname_lookup(const struct cfx_object_id *id, char *buf, size_t len)
{
    bool found = false;
    if (!len)
        return false;
    buf[0] = '\0';
    if (!id)
        return false;
    struct objname_slot *s = slot_of(id);
    pthread_mutex_lock(&objname_lock);
    if (s->name[0] && !memcmp(s->id.bytes, id->bytes, CFX_OBJECT_ID_LEN)) {
        snprintf(buf, len, "%s", s->name);
        found = true;
    }
    pthread_mutex_unlock(&objname_lock);
    return found;
}

/*
 * Names of object ids made with cfx_object_id_from_name(), remembered so
 * that a put can tell the directory which name an id came from (rdmactl
 * objects shows it).  Display only: nothing behaves differently with or
 * without a name.  Any thread.
 */
#ifndef CFX_ENGINE_OBJNAME_H
#define CFX_ENGINE_OBJNAME_H

#include <stdbool.h>
#include <stddef.h>
#include <conflux/object.h>

/* Remember that @p id was made from @p name (cut to CFX_OBJ_NAME_MAX bytes). */
void cfx__objname_remember(const struct cfx_object_id *id, const char *name);

/* The name @p id was made from in this process into @p buf (@p len bytes,
 * NUL-terminated); "" and false when it is not known (a generated id, or one
 * whose slot another name took since). */
bool cfx__objname_lookup(const struct cfx_object_id *id, char *buf, size_t len);

#endif

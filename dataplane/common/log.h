/*
 * Logging: per-subsystem macros, level from CFX_LOG_LEVEL (ERR, WARN, INFO,
 * DEBUG, TRACE; default WARN).  Output goes to stderr, or is appended to
 * CFX_LOG_FILE (created 0600; an existing one only if it is a regular file
 * of the effective uid that group and others cannot read or write; never
 * through a symlink), one line per call:
 *
 *   2026-12-02T06:30:01.123456Z conflux[PID] node=3 rank=1 INFO CTL client.c:994: text
 *
 * time in ISO 8601 UTC with microseconds; node: the tag set by
 * cfx__log_set_tag() (a context's node id once it joined, "coord" in
 * conflux-coord, "-" before); rank: CFX_RANK, OMPI_COMM_WORLD_RANK,
 * SLURM_PROCID or RANK, "-" if none.  The library never writes to stdout.
 * Safe from any thread.
 */
#ifndef CFX_COMMON_LOG_H
#define CFX_COMMON_LOG_H

#include <stdarg.h>

enum cfx_log_level {
    CFX_LOG_LEVEL_ERR = 0,
    CFX_LOG_LEVEL_WARN,
    CFX_LOG_LEVEL_INFO,
    CFX_LOG_LEVEL_DEBUG,
    CFX_LOG_LEVEL_TRACE,
};

extern int cfx__log_level; /* process-wide, set once from the environment */

void cfx__log_init(void);
void cfx__log_set_tag(const char *tag);
/* Set the tag to @p tag only while it is @p old (a context whose node id
 * changed: the tag another context of the process wrote since stays). */
void cfx__log_retag(const char *old, const char *tag);
void cfx__log(int level, const char *subsys, const char *file, int line,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
const char *cfx__log_level_name(int level);

#define CFX_LOG(lvl, subsys, ...)                                              \
    do {                                                                       \
        if (__builtin_expect(CFX_LOG_LEVEL_##lvl <= cfx__log_level, 0))        \
            cfx__log(CFX_LOG_LEVEL_##lvl, #subsys, __FILE__, __LINE__,         \
                     __VA_ARGS__);                                             \
    } while (0)

#endif

/*
 * Logging: per-subsystem macros, level from CFX_LOG_LEVEL (ERR, WARN, INFO,
 * DEBUG, TRACE; default WARN).  Output goes to stderr, one line per call,
 * prefixed with the node tag set by cfx__log_set_tag().  The library never
 * writes to stdout.  Safe from any thread.
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

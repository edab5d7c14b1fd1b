/* Logging to stderr with level, subsystem and node tag. */
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int cfx__log_level = CFX_LOG_LEVEL_WARN;

/*
 * The tag is written by every context that starts (cfx__log_set_tag(), any
 * thread) while other threads log: a plain char array read by one and
 * rewritten by another tears ("node 1" half over "node 12").  A mutex, not
 * an atomic pointer: the writer would have to keep every old string alive
 * for readers still printing it.  Both sides hold it only to copy 64 bytes,
 * and cfx__log() is never on a hot path (it runs only at an enabled level).
 */
static pthread_mutex_t log_tag_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_tag[64];                 /* e.g. "node 3"; under log_tag_lock */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static const char *const level_names[] = { "ERR", "WARN", "INFO", "DEBUG", "TRACE" };

const char *cfx__log_level_name(int level)
{
    if (level < 0 || level > CFX_LOG_LEVEL_TRACE)
        return "?";
    return level_names[level];
}

static void log_init_once(void)
{
    const char *v = getenv("CFX_LOG_LEVEL");
    if (!v || !*v)
        return;
    for (int i = 0; i <= CFX_LOG_LEVEL_TRACE; i++) {
        if (!strcasecmp(v, level_names[i]) ||
            (i == CFX_LOG_LEVEL_ERR && !strcasecmp(v, "ERROR")) ||
            (i == CFX_LOG_LEVEL_WARN && !strcasecmp(v, "WARNING"))) {
            cfx__log_level = i;
            return;
        }
    }
    char *end;
    long n = strtol(v, &end, 10);
    if (*end == '\0' && n >= 0 && n <= CFX_LOG_LEVEL_TRACE)
        cfx__log_level = (int)n;
    else
        fprintf(stderr, "conflux: ignoring CFX_LOG_LEVEL=%s (use ERR, WARN, INFO, DEBUG or TRACE)\n", v);
}

void cfx__log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void cfx__log_set_tag(const char *tag)
{
    pthread_mutex_lock(&log_tag_lock);
    snprintf(log_tag, sizeof(log_tag), "%s", tag ? tag : "");
    pthread_mutex_unlock(&log_tag_lock);
}

void cfx__log(int level, const char *subsys, const char *file, int line,
              const char *fmt, ...)
{
    char msg[1024], tag[sizeof(log_tag)];
    va_list ap;
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_tag_lock);
    memcpy(tag, log_tag, sizeof(tag));
    pthread_mutex_unlock(&log_tag_lock);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    /* One fprintf call: stdio locks the stream, so lines do not interleave. */
    fprintf(stderr, "%ld.%06ld conflux[%d]%s%s %s %s %s:%d: %s\n",
            (long)ts.tv_sec, ts.tv_nsec / 1000, (int)getpid(),
            tag[0] ? " " : "", tag, cfx__log_level_name(level), subsys,
            base, line, msg);
}

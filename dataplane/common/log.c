/* Logging to stderr or CFX_LOG_FILE with time, node, rank, level, subsystem. */
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
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

/* Where lines go and the rank they carry: set once, at the first line or
 * cfx__log_init(), whichever comes first (sink_once). */
static pthread_once_t sink_once = PTHREAD_ONCE_INIT;
static int log_fd = 2;          /* stderr, or CFX_LOG_FILE */
static char log_rank[16] = "-"; /* the launcher's rank, "-" if none */

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

/*
 * CFX_LOG_FILE: lines are appended to it (O_APPEND: one write per line, so
 * the lines of several threads and processes sharing it stay whole).  Lines
 * name peers, addresses and objects, so the file must be the user's alone:
 * a file it creates is 0600; one that exists already is taken only if it
 * is a regular file owned by the effective uid that neither group nor
 * others may read or write (another user could have made it 0666 in /tmp
 * to read the job's lines); a symlink is never followed (O_NOFOLLOW: one
 * planted there would send the lines where its maker chose).  A file that
 * cannot be opened, or is refused, leaves the lines on stderr, after one
 * line saying why.
 */
static int sink_open(const char *path, const char **why)
{
    const int flags = O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW;
    struct stat st;

    *why = NULL;
    int fd = open(path, flags | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 || errno != EEXIST)
        return fd; /* created: ours, 0600 (whatever the umask adds, it only takes away) */
    fd = open(path, flags);
    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        *why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        *why = "it is not a regular file";
    } else if (st.st_uid != geteuid()) {
        *why = "it belongs to another user";
    } else if (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
        *why = "group or others may read or write it (chmod 600 it)";
    }
    if (*why) {
        close(fd);
        return -1;
    }
    return fd;
}

static void sink_init_once(void)
{
    const struct cfx_launcher_vars *l = cfx__launcher(); /* the group's rank's */
    const char *v = l ? getenv(l->rank) : NULL;
    if (v && *v && strlen(v) < sizeof(log_rank) && strspn(v, "0123456789") == strlen(v))
        snprintf(log_rank, sizeof(log_rank), "%s", v);
    const char *path = getenv("CFX_LOG_FILE");
    if (!path || !*path)
        return;
    const char *why;
    int fd = sink_open(path, &why);
    if (fd < 0)
        fprintf(stderr, "conflux: cannot use CFX_LOG_FILE=%s: %s; logging to stderr\n", path,
                why ? why : errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    else
        log_fd = fd;
}

void cfx__log_init(void)
{
    pthread_once(&log_once, log_init_once);
    pthread_once(&sink_once, sink_init_once);
}

void cfx__log_set_tag(const char *tag)
{
    pthread_mutex_lock(&log_tag_lock);
    snprintf(log_tag, sizeof(log_tag), "%s", tag ? tag : "");
    pthread_mutex_unlock(&log_tag_lock);
}

void cfx__log_retag(const char *old, const char *tag)
{
    pthread_mutex_lock(&log_tag_lock);
    if (!strcmp(log_tag, old ? old : ""))
        snprintf(log_tag, sizeof(log_tag), "%s", tag ? tag : "");
    pthread_mutex_unlock(&log_tag_lock);
}

void cfx__log(int level, const char *subsys, const char *file, int line,
              const char *fmt, ...)
{
    char msg[1024], tag[sizeof(log_tag)], out[1400], when[40];
    va_list ap;
    struct timespec ts;
    struct tm tm;

    pthread_once(&sink_once, sink_init_once);
    clock_gettime(CLOCK_REALTIME, &ts);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_tag_lock);
    memcpy(tag, log_tag, sizeof(tag));
    pthread_mutex_unlock(&log_tag_lock);

    /* ISO 8601, UTC, microseconds: 2026-12-02T06:30:01.123456Z */
    gmtime_r(&ts.tv_sec, &tm);
    size_t w = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + w, sizeof(when) - w, ".%06ldZ", ts.tv_nsec / 1000);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(out, sizeof(out), "%s conflux[%d] node=%s rank=%s %s %s %s:%d: %s\n", when,
                     (int)getpid(), tag[0] ? tag : "-", log_rank, cfx__log_level_name(level),
                     subsys, base, line, msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(out)) { /* cut: still one line */
        n = (int)sizeof(out) - 1;
        out[n - 1] = '\n';
    }
    /* One write per line: lines of threads and processes do not interleave. */
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t k = write(log_fd, out + off, (size_t)n - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        off += (size_t)k;
    }
}

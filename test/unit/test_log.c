/*
 * Logging: the node tag is set by every context that starts, from any
 * thread, while other threads log.  Several threads rewrite it between two
 * full-length tags while others log; every line must carry one whole tag,
 * never a mix of the two.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataplane/common/log.h"

#define SETTERS  2
#define LOGGERS  3
#define LINES    20000     /* per logger */
#define SETS     200000    /* per setter */
#define TAG_LEN  63        /* the longest tag the log keeps */

static char tag_a[TAG_LEN + 1], tag_b[TAG_LEN + 1];

static void *setter_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < SETS; i++)
        cfx__log_set_tag(i & 1 ? tag_b : tag_a);
    return NULL;
}

static void *logger_main(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < LINES; i++)
        CFX_LOG(DEBUG, TEST, "logger %d line %d", id, i);
    return NULL;
}

Test(log, tag_set_while_logging, .timeout = 120)
{
    memset(tag_a, 'A', TAG_LEN);
    memset(tag_b, 'B', TAG_LEN);
    char path[] = "/tmp/cfx-test-log-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    cr_assert_geq(saved, 0);
    cr_assert_eq(dup2(fd, 2), 2);
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_DEBUG;
    cfx__log_set_tag(tag_a);

    pthread_t th[SETTERS + LOGGERS];
    for (int i = 0; i < SETTERS + LOGGERS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, i < SETTERS ? setter_main : logger_main,
                                    (void *)(intptr_t)i), 0);
    for (int i = 0; i < SETTERS + LOGGERS; i++)
        pthread_join(th[i], NULL);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    cfx__log_level = level;
    cfx__log_set_tag(NULL);

    /* every line: "TIME conflux[pid] node=<tag> rank=- DEBUG TEST test_log.c:N: logger I line J" */
    FILE *f = fdopen(fd, "r");
    cr_assert(f);
    rewind(f);
    char line[2048];
    int lines = 0, a = 0, b = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "] node=");
        cr_assert(p, "line %d has no tag: %s", lines, line);
        p += strlen("] node=");
        size_t n = strcspn(p, " ");
        cr_assert(n == TAG_LEN && (!strncmp(p, tag_a, n) || !strncmp(p, tag_b, n)),
                  "line %d carries a torn tag '%.*s'", lines, (int)n, p);
        a += p[0] == 'A';
        b += p[0] == 'B';
        cr_assert(strstr(p, " DEBUG TEST ") && strstr(p, " line "), "line %d: %s", lines, line);
        lines++;
    }
    fclose(f);
    unlink(path);
    cr_assert_eq(lines, LOGGERS * LINES, "%d lines logged, %d written", LOGGERS * LINES, lines);
    cr_assert_eq(a + b, lines);
}

static time_t realtime_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

/* Read all of @p path into @p buf (NUL terminated); bytes read. */
static size_t slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return n;
}

/*
 * CFX_LOG_FILE: created 0600 and appended to; every line starts with an
 * ISO 8601 UTC time with microseconds, then the pid, node and rank.
 */
Test(log, file_iso_time_node_rank, .timeout = 30)
{
    char dir[] = "/tmp/cfx-test-logf-XXXXXX", path[128], buf[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/conflux.log", dir);
    cr_assert_eq(setenv("CFX_LOG_FILE", path, 1), 0);
    cr_assert_eq(setenv("RANK", "7", 1), 0);
    unsetenv("CFX_RANK");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("SLURM_PROCID");
    mode_t old = umask(0); /* the mode is the log's, not the umask's */
    cfx__log_init();
    umask(old);
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_INFO;

    /* the logger's clock (time() reads a coarser one, a tick behind:
     * 16:26:43.002 was logged while time() still said :42) */
    time_t t0 = realtime_s();
    cfx__log_set_tag(NULL);
    CFX_LOG(INFO, TEST, "first %d", 1);
    cfx__log_set_tag("12");
    CFX_LOG(WARN, TEST, "second");
    CFX_LOG(DEBUG, TEST, "not at this level");
    time_t t1 = realtime_s();
    cfx__log_level = level;
    cfx__log_set_tag(NULL);

    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    slurp(path, buf, sizeof(buf));
    char *l2 = strchr(buf, '\n');
    cr_assert_not_null(l2, "%s", buf);
    *l2++ = '\0';
    char want[256];
    snprintf(want, sizeof(want), " conflux[%d] node=- rank=7 INFO TEST test_log.c:", (int)getpid());
    cr_expect_not_null(strstr(buf, want), "line 1: %s", buf);
    cr_expect_not_null(strstr(buf, ": first 1"), "line 1: %s", buf);
    snprintf(want, sizeof(want),
             " conflux[%d] node=12 rank=7 WARN TEST test_log.c:", (int)getpid());
    cr_expect_not_null(strstr(l2, want), "line 2: %s", l2);
    cr_expect_null(strstr(l2, "not at this level"), "%s", l2);
    cr_expect_eq(strchr(l2, '\n') - l2 + 1, (long)strlen(l2), "two lines only: %s", l2);

    /* 2026-12-02T06:30:01.123456Z: parse it back, within [t0, t1] */
    for (char *l = buf; l; l = l == buf ? l2 : NULL) {
        struct tm tm = { 0 };
        char *end = strptime(l, "%Y-%m-%dT%H:%M:%S", &tm);
        cr_assert_not_null(end, "no ISO 8601 time: %s", l);
        cr_expect_eq(strspn(end, "."), 1u, "%s", l);
        cr_expect_eq(strspn(end + 1, "0123456789"), 6u, "microseconds: %s", l);
        cr_expect_eq(strncmp(end + 7, "Z conflux[", 10), 0, "%s", l);
        time_t t = timegm(&tm);
        cr_expect(t >= t0 && t <= t1, "time %lld not in [%lld, %lld]: %s", (long long)t,
                  (long long)t0, (long long)t1, l);
    }
    unlink(path);
    rmdir(dir);
}

/* An existing CFX_LOG_FILE is appended to, never truncated; its mode stays. */
Test(log, file_appended, .timeout = 30)
{
    char path[] = "/tmp/cfx-test-loga-XXXXXX", buf[4096];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "before\n", 7), 7);
    close(fd);
    cr_assert_eq(setenv("CFX_LOG_FILE", path, 1), 0);
    cfx__log_init();
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_WARN;
    CFX_LOG(ERR, TEST, "after");
    cfx__log_level = level;
    slurp(path, buf, sizeof(buf));
    cr_expect_eq(strncmp(buf, "before\n", 7), 0, "%s", buf);
    cr_expect_not_null(strstr(buf + 7, " ERR TEST test_log.c:"), "%s", buf);
    cr_expect_eq(strcmp(buf + strlen(buf) - 8, ": after\n"), 0, "%s", buf);
    unlink(path);
}

/*
 * Open CFX_LOG_FILE=@p path with stderr in a file of its own, log one WARN
 * line, and return what reached stderr in @p err (NUL terminated).
 */
static void log_once_to(const char *path, char *err, size_t cap)
{
    char errpath[] = "/tmp/cfx-test-logerr-XXXXXX";
    int efd = mkstemp(errpath);
    cr_assert_geq(efd, 0);
    fflush(stderr);
    int saved = dup(2);
    cr_assert_geq(saved, 0);
    cr_assert_eq(dup2(efd, 2), 2);
    cr_assert_eq(setenv("CFX_LOG_FILE", path, 1), 0);
    cfx__log_init();
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_WARN;
    CFX_LOG(WARN, TEST, "a line naming peer 10.0.0.7:4242");
    cfx__log_level = level;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(efd);
    slurp(errpath, err, cap);
    unlink(errpath);
}

/*
 * An existing CFX_LOG_FILE another user could read is not used: a file
 * pre-created 0666 (as anyone can in /tmp) gets no line; the lines stay on
 * stderr after one line saying why.  Before, the job's lines were appended
 * to it for its maker to read.
 */
Test(log, existing_file_others_can_read_is_refused, .timeout = 30)
{
    char path[] = "/tmp/cfx-test-log0666-XXXXXX", err[4096], buf[4096];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchmod(fd, 0666), 0);
    close(fd);
    log_once_to(path, err, sizeof(err));
    cr_expect_eq(slurp(path, buf, sizeof(buf)), 0u, "the 0666 file got lines: %s", buf);
    cr_expect_not_null(strstr(err, "cannot use CFX_LOG_FILE="), "%s", err);
    cr_expect_not_null(strstr(err, "group or others may read or write it"), "%s", err);
    cr_expect_not_null(strstr(err, "a line naming peer 10.0.0.7:4242"), "lines lost: %s", err);
    unlink(path);
}

/*
 * A symlink at CFX_LOG_FILE is not followed, even to a file of ours that
 * is 0600: whoever planted it chose where the lines go.  Before, the lines
 * were appended to its target.
 */
Test(log, symlink_is_not_followed, .timeout = 30)
{
    char target[] = "/tmp/cfx-test-logtgt-XXXXXX", link[64], err[4096], buf[4096];
    int fd = mkstemp(target); /* 0600, ours: only the link is wrong */
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(link, sizeof(link), "%s.lnk", target);
    cr_assert_eq(symlink(target, link), 0);
    log_once_to(link, err, sizeof(err));
    cr_expect_eq(slurp(target, buf, sizeof(buf)), 0u, "the link was followed: %s", buf);
    cr_expect_not_null(strstr(err, "it is a symbolic link"), "%s", err);
    cr_expect_not_null(strstr(err, "a line naming peer"), "lines lost: %s", err);
    unlink(link);
    unlink(target);
}

/* A file of another user is refused even when it is 0600 (it can read it). */
Test(log, existing_file_of_another_user_is_refused, .timeout = 30)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to give a file to another uid (nobody)");
    char path[] = "/tmp/cfx-test-logown-XXXXXX", err[4096], buf[4096];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fchown(fd, 65534, 65534), 0);
    close(fd);
    log_once_to(path, err, sizeof(err));
    cr_expect_eq(slurp(path, buf, sizeof(buf)), 0u, "another user's file got lines: %s", buf);
    cr_expect_not_null(strstr(err, "it belongs to another user"), "%s", err);
    unlink(path);
}

/* A new file is still made, 0600, whatever the umask. */
Test(log, new_file_created_0600, .timeout = 30)
{
    char dir[] = "/tmp/cfx-test-lognew-XXXXXX", path[128], err[4096], buf[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/conflux.log", dir);
    mode_t old = umask(0);
    log_once_to(path, err, sizeof(err));
    umask(old);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
    slurp(path, buf, sizeof(buf));
    cr_expect_not_null(strstr(buf, "a line naming peer"), "%s", buf);
    cr_expect_null(strstr(err, "CFX_LOG_FILE"), "%s", err);
    unlink(path);
    rmdir(dir);
}

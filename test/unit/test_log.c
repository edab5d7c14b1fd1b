/*
 * Logging: the node tag is set by every context that starts, from any
 * thread, while other threads log.  Several threads rewrite it between two
 * full-length tags while others log; every line must carry one whole tag,
 * never a mix of the two.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
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

    /* every line: "... conflux[pid] <tag> DEBUG TEST test_log.c:N: logger I line J" */
    FILE *f = fdopen(fd, "r");
    cr_assert(f);
    rewind(f);
    char line[2048];
    int lines = 0, a = 0, b = 0;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, "] ");
        cr_assert(p, "line %d has no tag: %s", lines, line);
        p += 2;
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

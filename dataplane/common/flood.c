/* Defences of a listener against floods: rate-limited lines, fd shedding (flood.h). */
#include "flood.h"
#include "log.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * One line per refused connection filled the disk (the coordinator: 45 MB
 * in 21 s of a flood; the tcp data port: 459 MB in 20 s), so a flood's lines
 * are one a second, each saying how many events it stands for.
 */
void cfx__ratelog(struct cfx_ratelog *rl, const char *subsys, const char *file, int line,
                  uint64_t now, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rl->last, sizeof(rl->last), fmt, ap);
    va_end(ap);
    if (rl->logged_ns && now - rl->logged_ns < CFX_RATELOG_NS) {
        rl->held++;
        return;
    }
    if (CFX_LOG_LEVEL_WARN <= cfx__log_level) {
        if (rl->held)
            cfx__log(CFX_LOG_LEVEL_WARN, subsys, file, line,
                     "%s (and %llu more like it since the last such line)", rl->last,
                     (unsigned long long)rl->held);
        else
            cfx__log(CFX_LOG_LEVEL_WARN, subsys, file, line, "%s", rl->last);
    }
    rl->logged_ns = now;
    rl->held = 0;
}

void cfx__ratelog_flush(struct cfx_ratelog *rl, const char *subsys, const char *file, int line,
                        uint64_t now)
{
    if (!rl->held || now - rl->logged_ns < CFX_RATELOG_NS)
        return;
    if (CFX_LOG_LEVEL_WARN <= cfx__log_level)
        cfx__log(CFX_LOG_LEVEL_WARN, subsys, file, line,
                 "%llu more like this in the last second, the latest: %s",
                 (unsigned long long)rl->held, rl->last);
    rl->logged_ns = now;
    rl->held = 0;
}

int cfx__spare_fd_open(void)
{
    return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int cfx__accept_shed(int listen_fd, int *spare)
{
    int shed = 0;

    if (*spare < 0)
        return 0;
    close(*spare);
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        shed = 1;
    }
    *spare = cfx__spare_fd_open();
    return shed;
}

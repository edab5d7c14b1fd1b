/*
 * What a listening socket that strangers may reach needs against a flood
 * (the coordinator's port, the tcp data port; shm's refusals):
 *
 *   cfx__ratelog*    a WARN line for an event a flood repeats (a refusal,
 *                    an eviction, an fd shed): the first at once, then at
 *                    most one a second saying how many it stands for;
 *   cfx__accept_shed out of file descriptors (EMFILE/ENFILE): accept the
 *                    pending connection with a reserve fd and close it, so
 *                    the level-triggered listener does not spin.
 *
 * A struct cfx_ratelog belongs to its owner's thread; the functions keep no
 * state of their own.
 */
#ifndef CFX_COMMON_FLOOD_H
#define CFX_COMMON_FLOOD_H

#include <stdint.h>

#define CFX_RATELOG_NS 1000000000ull /* at most one line a second per ratelog */

struct cfx_ratelog {
    uint64_t logged_ns; /* when the last line was written; 0: never */
    uint64_t held;      /* events since, in no line yet */
    char last[160];     /* the latest of those */
};

/* One event at @p now: a WARN line now, or counted into the next one. */
void cfx__ratelog(struct cfx_ratelog *rl, const char *subsys, const char *file, int line,
                  uint64_t now, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The events a quiet second left over, in one line (call it on a tick). */
void cfx__ratelog_flush(struct cfx_ratelog *rl, const char *subsys, const char *file, int line,
                        uint64_t now);

#define CFX_RATELOG(rl, subsys, now, ...) \
    cfx__ratelog((rl), #subsys, __FILE__, __LINE__, (now), __VA_ARGS__)
#define CFX_RATELOG_FLUSH(rl, subsys, now) \
    cfx__ratelog_flush((rl), #subsys, __FILE__, __LINE__, (now))

/* A reserve fd for cfx__accept_shed (/dev/null); -1 if none could be had. */
int cfx__spare_fd_open(void);

/*
 * accept() on @p listen_fd failed with EMFILE/ENFILE: give up the reserve fd
 * *@p spare, accept the pending connection, close it, take the reserve back
 * (the libev/libuv trick).  Returns 1 when a connection was shed, 0 when
 * none was (no reserve, nothing pending, or still out of fds): the caller
 * then stops accepting for a while rather than spin.
 */
int cfx__accept_shed(int listen_fd, int *spare);

#endif

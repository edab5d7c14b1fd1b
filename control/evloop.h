/*
 * A small event loop of fd and timer callbacks (after Redis ae.c), on epoll.
 *
 * Watchers are embedded in the caller's structures (no allocation, no ids):
 * a struct cfx_ev_io per fd, a struct cfx_ev_timer per deadline.  Callbacks
 * run on the loop thread.  A callback may stop any watcher, including its
 * own, but an io watcher's memory must stay valid until the current batch
 * ends: free it from the after-batch hook (cfx__ev_loop_set_hook).
 *
 * Threading: everything runs on the thread in cfx__ev_loop_run(), except
 * cfx__ev_loop_stop(), which any thread (or a signal handler) may call.
 */
#ifndef CFX_CONTROL_EVLOOP_H
#define CFX_CONTROL_EVLOOP_H

#include <stdint.h>
#include "dataplane/common/list.h"

struct cfx_ev_loop;
struct cfx_ev_io;
struct cfx_ev_timer;

enum {
    CFX_EV_READ  = 1u << 0,  /* fd readable (or hung up / in error) */
    CFX_EV_WRITE = 1u << 1,  /* fd writable */
};

typedef void cfx_ev_io_cb(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned events);
typedef void cfx_ev_timer_cb(struct cfx_ev_loop *loop, struct cfx_ev_timer *t);
typedef void cfx_ev_hook_cb(struct cfx_ev_loop *loop, void *arg);

struct cfx_ev_io {
    int fd;               /* watched fd, -1 when stopped */
    unsigned mask;        /* CFX_EV_* currently watched */
    cfx_ev_io_cb *cb;     /* called with the ready CFX_EV_* bits */
    void *arg;            /* owner's pointer (or use container_of) */
};

struct cfx_ev_timer {
    struct cfx_list link; /* in the loop's deadline-sorted list while armed */
    uint64_t when_ns;     /* CLOCK_MONOTONIC deadline */
    cfx_ev_timer_cb *cb;
    void *arg;
    int armed;            /* 1 while in the list */
};

/* Create a loop.  CFX_OK, CFX_ERR_NOMEM, CFX_ERR_IO. */
int cfx__ev_loop_create(struct cfx_ev_loop **out);

/* Free a loop (watchers must be stopped first).  NULL is a no-op. */
void cfx__ev_loop_destroy(struct cfx_ev_loop *loop);

/* Run until cfx__ev_loop_stop().  CFX_OK, or CFX_ERR_IO if epoll fails. */
int cfx__ev_loop_run(struct cfx_ev_loop *loop);

/* Ask the loop to return from cfx__ev_loop_run(); async-signal-safe. */
void cfx__ev_loop_stop(struct cfx_ev_loop *loop);

/* Called once after every batch of events and timers. */
void cfx__ev_loop_set_hook(struct cfx_ev_loop *loop, cfx_ev_hook_cb *cb, void *arg);

/* Watch @p fd for @p mask.  CFX_OK or CFX_ERR_IO. */
int cfx__ev_io_start(struct cfx_ev_loop *loop, struct cfx_ev_io *io, int fd, unsigned mask,
                     cfx_ev_io_cb *cb, void *arg);
/* Change the watched events of a started watcher. */
int cfx__ev_io_set(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned mask);
/* Stop watching (the fd is not closed).  No-op when not started. */
void cfx__ev_io_stop(struct cfx_ev_loop *loop, struct cfx_ev_io *io);

/* Initialise a timer once before use. */
void cfx__ev_timer_init(struct cfx_ev_timer *t, cfx_ev_timer_cb *cb, void *arg);
/* Arm (or re-arm) @p t for the absolute deadline @p when_ns. */
void cfx__ev_timer_start(struct cfx_ev_loop *loop, struct cfx_ev_timer *t, uint64_t when_ns);
/* Disarm; no-op when not armed. */
void cfx__ev_timer_stop(struct cfx_ev_loop *loop, struct cfx_ev_timer *t);

#endif

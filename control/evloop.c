/* Event loop backend: epoll, an eventfd for cross-thread stop, sorted timers. */
#include "control/evloop.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define EV_BATCH 64

struct cfx_ev_loop {
    int epfd;
    int wakefd;                 /* eventfd written by cfx__ev_loop_stop() */
    int stop;                   /* set by cfx__ev_loop_stop(); atomic access */
    struct cfx_list timers;     /* armed timers, earliest first */
    cfx_ev_hook_cb *hook;
    void *hook_arg;
};

int cfx__ev_loop_create(struct cfx_ev_loop **out)
{
    int rc;
    struct cfx_ev_loop *loop = calloc(1, sizeof(*loop));
    if (!loop)
        return cfx__err(CFX_ERR_NOMEM, "no memory for an event loop");
    cfx_list_init(&loop->timers);
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (loop->epfd < 0) {
        rc = cfx__err(CFX_ERR_IO, "epoll_create1: %s", strerror(errno));
        goto err_free;
    }
    loop->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (loop->wakefd < 0) {
        rc = cfx__err(CFX_ERR_IO, "eventfd: %s", strerror(errno));
        goto err_close_ep;
    }
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, loop->wakefd, &ev) < 0) {
        rc = cfx__err(CFX_ERR_IO, "epoll_ctl(eventfd): %s", strerror(errno));
        goto err_close_wake;
    }
    *out = loop;
    return CFX_OK;

err_close_wake:
    close(loop->wakefd);
err_close_ep:
    close(loop->epfd);
err_free:
    free(loop);
    return rc;
}

void cfx__ev_loop_destroy(struct cfx_ev_loop *loop)
{
    if (!loop)
        return;
    close(loop->wakefd);
    close(loop->epfd);
    free(loop);
}

void cfx__ev_loop_stop(struct cfx_ev_loop *loop)
{
    uint64_t one = 1;
    __atomic_store_n(&loop->stop, 1, __ATOMIC_RELEASE);
    /* Async-signal-safe: a plain write; EAGAIN means a wakeup is pending. */
    ssize_t n = write(loop->wakefd, &one, sizeof(one));
    (void)n;
}

void cfx__ev_loop_set_hook(struct cfx_ev_loop *loop, cfx_ev_hook_cb *cb, void *arg)
{
    loop->hook = cb;
    loop->hook_arg = arg;
}

static int stopped(struct cfx_ev_loop *loop)
{
    return __atomic_load_n(&loop->stop, __ATOMIC_ACQUIRE);
}

static uint32_t to_epoll(unsigned mask)
{
    return ((mask & CFX_EV_READ) ? EPOLLIN : 0) | ((mask & CFX_EV_WRITE) ? EPOLLOUT : 0);
}

int cfx__ev_io_start(struct cfx_ev_loop *loop, struct cfx_ev_io *io, int fd, unsigned mask,
                     cfx_ev_io_cb *cb, void *arg)
{
    struct epoll_event ev = { .events = to_epoll(mask), .data.ptr = io };
    io->fd = fd;
    io->mask = mask;
    io->cb = cb;
    io->arg = arg;
    if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        io->fd = -1;
        return cfx__err(CFX_ERR_IO, "epoll_ctl(ADD fd %d): %s", fd, strerror(errno));
    }
    return CFX_OK;
}

int cfx__ev_io_set(struct cfx_ev_loop *loop, struct cfx_ev_io *io, unsigned mask)
{
    if (io->fd < 0)
        return CFX_ERR_INVALID;
    if (io->mask == mask)
        return CFX_OK;
    struct epoll_event ev = { .events = to_epoll(mask), .data.ptr = io };
    if (epoll_ctl(loop->epfd, EPOLL_CTL_MOD, io->fd, &ev) < 0)
        return cfx__err(CFX_ERR_IO, "epoll_ctl(MOD fd %d): %s", io->fd, strerror(errno));
    io->mask = mask;
    return CFX_OK;
}

void cfx__ev_io_stop(struct cfx_ev_loop *loop, struct cfx_ev_io *io)
{
    if (io->fd < 0)
        return;
    epoll_ctl(loop->epfd, EPOLL_CTL_DEL, io->fd, NULL);
    io->fd = -1;
    io->mask = 0;
}

void cfx__ev_timer_init(struct cfx_ev_timer *t, cfx_ev_timer_cb *cb, void *arg)
{
    cfx_list_init(&t->link);
    t->when_ns = 0;
    t->cb = cb;
    t->arg = arg;
    t->armed = 0;
}

void cfx__ev_timer_start(struct cfx_ev_loop *loop, struct cfx_ev_timer *t, uint64_t when_ns)
{
    struct cfx_list *pos;

    cfx__ev_timer_stop(loop, t);
    t->when_ns = when_ns;
    /* Insert sorted; timers are few (one per parked lookup plus one tick). */
    for (pos = loop->timers.prev; pos != &loop->timers; pos = pos->prev) {
        struct cfx_ev_timer *o = cfx_list_entry(pos, struct cfx_ev_timer, link);
        if (o->when_ns <= when_ns)
            break;
    }
    cfx__list_insert(&t->link, pos, pos->next);
    t->armed = 1;
}

void cfx__ev_timer_stop(struct cfx_ev_loop *loop, struct cfx_ev_timer *t)
{
    (void)loop;
    if (!t->armed)
        return;
    cfx_list_del(&t->link);
    t->armed = 0;
}

static int next_timeout_ms(struct cfx_ev_loop *loop)
{
    if (cfx_list_empty(&loop->timers))
        return -1;
    struct cfx_ev_timer *t = cfx_list_entry(loop->timers.next, struct cfx_ev_timer, link);
    return cfx__ms_left(t->when_ns);
}

static void run_timers(struct cfx_ev_loop *loop)
{
    uint64_t now = cfx__now_ns();
    /* Fire only what is due now; a callback re-arming itself for "now" runs
     * in the next iteration, so a zero-interval timer cannot starve fds. */
    while (!cfx_list_empty(&loop->timers) && !stopped(loop)) {
        struct cfx_ev_timer *t = cfx_list_entry(loop->timers.next, struct cfx_ev_timer, link);
        if (t->when_ns > now)
            break;
        cfx__ev_timer_stop(loop, t);
        t->cb(loop, t);
    }
}

int cfx__ev_loop_run(struct cfx_ev_loop *loop)
{
    struct epoll_event evs[EV_BATCH];

    while (!stopped(loop)) {
        int n = epoll_wait(loop->epfd, evs, EV_BATCH, next_timeout_ms(loop));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            CFX_LOG(ERR, CTL, "epoll_wait: %s", strerror(errno));
            return cfx__err(CFX_ERR_IO, "epoll_wait: %s", strerror(errno));
        }
        for (int i = 0; i < n && !stopped(loop); i++) {
            struct cfx_ev_io *io = evs[i].data.ptr;
            if (!io) {
                uint64_t v;
                ssize_t r = read(loop->wakefd, &v, sizeof(v));
                (void)r;
                continue;
            }
            /* Stopped earlier in this batch: its memory is still valid (the
             * owner frees from the hook), but it must not fire. */
            if (io->fd < 0)
                continue;
            unsigned ready = 0;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
                ready |= CFX_EV_READ;
            if (evs[i].events & (EPOLLOUT | EPOLLERR))
                ready |= CFX_EV_WRITE;
            ready &= io->mask | CFX_EV_READ;
            if (ready)
                io->cb(loop, io, ready);
        }
        run_timers(loop);
        if (loop->hook)
            loop->hook(loop, loop->hook_arg);
    }
    return CFX_OK;
}

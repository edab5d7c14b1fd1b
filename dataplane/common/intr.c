/* Interrupt checks of blocking calls: see intr.h. */
#include "intr.h"

#include <conflux/context.h>

#include "util.h"

static _Thread_local int (*intr_check)(void *arg);
static _Thread_local void *intr_arg;
static _Thread_local bool intr_fired;
static _Thread_local unsigned intr_depth; /* interruptible calls this thread is in */
static _Thread_local uint64_t intr_next; /* the next check due (CLOCK_MONOTONIC ns) */
static _Thread_local const bool *intr_flag; /* cfx__intr_flag() */

void cfx_set_interrupt_check(int (*check)(void *arg), void *arg)
{
    intr_check = check;
    intr_arg = arg;
    intr_fired = false;
    intr_next = cfx__deadline_ns(CFX__INTR_PERIOD_MS);
}

void cfx__intr_begin(void)
{
    if (intr_depth++)
        return; /* within another: its interrupt ends both */
    intr_fired = false;
    if (intr_check)
        intr_next = cfx__deadline_ns(CFX__INTR_PERIOD_MS);
}

void cfx__intr_end(void)
{
    if (intr_depth && !--intr_depth)
        intr_fired = false;
}

uint64_t cfx__intr_until(uint64_t deadline)
{
    return intr_check && intr_depth && !intr_fired && intr_next < deadline ? intr_next
                                                                           : deadline;
}

bool cfx__intr_poll(pthread_mutex_t *held)
{
    if (!intr_check || !intr_depth || intr_fired || cfx__now_ns() < intr_next)
        return intr_fired;
    int (*check)(void *) = intr_check;
    if (held)
        pthread_mutex_unlock(held);
    bool stop = check(intr_arg) != 0;
    if (held)
        pthread_mutex_lock(held);
    intr_fired = stop;
    intr_next = cfx__deadline_ns(CFX__INTR_PERIOD_MS);
    return stop;
}

bool cfx__cond_wait_intr(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline)
{
    uint64_t until = cfx__intr_until(deadline);
    if (until == deadline)
        return cfx__cond_wait_until(cond, mu, deadline);
    if (!cfx__cond_wait_until(cond, mu, until)) /* the check is due */
        cfx__intr_poll(mu);
    return true;
}

bool cfx__intr_fired(void)
{
    return intr_fired || (intr_flag && __atomic_load_n(intr_flag, __ATOMIC_ACQUIRE));
}

const bool *cfx__intr_flag(const bool *flag)
{
    const bool *was = intr_flag;
    intr_flag = flag;
    return was;
}

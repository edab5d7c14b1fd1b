/*
 * Interrupt checks of blocking calls (cfx_set_interrupt_check(),
 * conflux/context.h): per thread.  A wait of a blocking call that may run
 * long sleeps at most to cfx__intr_until() and then calls cfx__intr_poll()
 * with the one lock it holds; once the check asked to stop, the call ends
 * as a canceled request would (cfx__intr_fired(), until the call ends:
 * cfx__intr_end()).  Only waits within cfx__intr_begin() .. _end() run it.
 */
#ifndef CFX_COMMON_INTR_H
#define CFX_COMMON_INTR_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* How often a waiting call runs its thread's check (a Ctrl-C ends it within
 * about this long). */
#define CFX__INTR_PERIOD_MS 100

/* An interruptible call begins on this thread: nothing fired, the first
 * check a period from now; and ends (what fired is forgotten: the
 * thread's other calls are not interrupted).  They nest. */
void cfx__intr_begin(void);
void cfx__intr_end(void);
/* The time a wait of this thread sleeps to: @p deadline, or the next check
 * when one is set and due earlier. */
uint64_t cfx__intr_until(uint64_t deadline);
/* @p held (locked, may be NULL) is the one lock of the library the caller
 * holds: the check runs without it when due.  True once a check asked to
 * stop (then no check runs again in this call). */
bool cfx__intr_poll(pthread_mutex_t *held);
bool cfx__intr_fired(void);
/* A flag that, once set (atomically, before its setter wakes the waits),
 * stops this thread's interruptible waits as a check that fired does, and
 * reads as fired (a group destroyed on another thread while a call of it
 * waits here: coll/group.c).  NULL: none.  Returns the flag it replaces, to
 * put back when the call ends. */
const bool *cfx__intr_flag(const bool *flag);
/* Wait on @p cond (@p mu held) until woken or @p deadline, running the
 * check when due: false once the deadline passed (as cfx__cond_wait_until),
 * true also when the check ran, so that the caller looks at
 * cfx__intr_fired(). */
bool cfx__cond_wait_intr(pthread_cond_t *cond, pthread_mutex_t *mu, uint64_t deadline);

#endif

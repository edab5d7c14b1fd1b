/*
 * The transport base's caps on strangers (tp_strangers.h): the tcp data
 * port's and the verbs transport's accepted connections that have not
 * proven the token yet.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "tp_strangers.h"

#define PAUSE_TEXT "100 ms" /* CFX_TP_ACCEPT_PAUSE_MS, in the line */

#define SLOG(s, rl, now, ...) cfx__ratelog((rl), (s)->p.subsys, __FILE__, __LINE__, (now), \
                                           __VA_ARGS__)

void cfx__tp_strangers_init(struct cfx__tp_strangers *s,
                            const struct cfx__tp_strangers_params *p, bool reserve)
{
    memset(s, 0, sizeof(*s));
    s->p = *p;
    cfx_list_init(&s->list);
    s->max = (uint32_t)cfx__env_ll_clamp(p->env_max, p->def_max, 1, 1 << 20);
    s->max_per_ip = (uint32_t)cfx__env_ll_clamp(p->env_per_ip, p->def_per_ip, 1, 1 << 20);
    s->spare_fd = reserve ? cfx__spare_fd_open() : -1; /* none: shedding pauses instead */
}

void cfx__tp_strangers_fini(struct cfx__tp_strangers *s)
{
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    s->spare_fd = -1;
}

void cfx__tp_stranger_add(struct cfx__tp_strangers *s, struct cfx__tp_stranger *st, uint32_t ip,
                          const char *addr, uint64_t now)
{
    if (st->on)
        return;
    st->ip = ip;
    st->addr = addr;
    st->since_ns = now;
    st->on = true;
    cfx_list_add_tail(&st->link, &s->list);
    s->n++;
}

void cfx__tp_stranger_del(struct cfx__tp_strangers *s, struct cfx__tp_stranger *st)
{
    if (!st->on)
        return;
    st->on = false;
    cfx_list_del(&st->link);
    s->n--;
}

static unsigned long long age_ms(const struct cfx__tp_stranger *st, uint64_t now)
{
    return (unsigned long long)((now - st->since_ns) / 1000000ull);
}

void cfx__tp_strangers_admit(struct cfx__tp_strangers *s, uint32_t ip, uint64_t now)
{
    struct cfx__tp_stranger *oldest_ip = NULL, *old = NULL;
    const char *cap = NULL, *why;
    uint32_t from = 0, limit = 0;
    struct cfx_list *pos;

    cfx_list_for_each(pos, &s->list) {
        struct cfx__tp_stranger *st = cfx_list_entry(pos, struct cfx__tp_stranger, link);
        if (ip && st->ip == ip && from++ == 0)
            oldest_ip = st;
    }
    if (ip && from >= s->max_per_ip) {
        old = oldest_ip;
        cap = s->p.env_per_ip;
        limit = s->max_per_ip;
        why = "the oldest connection of its address not authenticated, closed for a newer one";
    } else if (s->n >= s->max) {
        old = cfx_list_entry(s->list.next, struct cfx__tp_stranger, link);
        cap = s->p.env_max;
        limit = s->max;
        why = "the oldest connection not authenticated, closed for a newer one";
    }
    if (!old)
        return;
    SLOG(s, &s->evict_log, now, "iface %s: closing %s: %s (%u) reached, and it is the oldest "
         "not authenticated (%llu ms)", s->p.who, old->addr, cap, limit, age_ms(old, now));
    atomic_fetch_add_explicit(&s->n_evicted, 1, memory_order_relaxed);
    s->p.evict(old, why);
}

bool cfx__tp_strangers_out_of_fds(struct cfx__tp_strangers *s, int listen_fd, int err,
                                  uint64_t now)
{
    if (s->n) {
        struct cfx__tp_stranger *old = cfx_list_entry(s->list.next, struct cfx__tp_stranger, link);
        SLOG(s, &s->evict_log, now, "iface %s: closing %s: out of file descriptors (%s), and "
             "it is the oldest not authenticated (%llu ms)", s->p.who, old->addr, strerror(err),
             age_ms(old, now));
        atomic_fetch_add_explicit(&s->n_evicted, 1, memory_order_relaxed);
        s->p.evict(old, "the oldest connection not authenticated, closed for a newer one: out "
                        "of file descriptors");
        return true;
    }
    bool shed = cfx__accept_shed(listen_fd, &s->spare_fd);
    if (shed) {
        atomic_fetch_add_explicit(&s->n_shed, 1, memory_order_relaxed);
    } else {
        s->p.listen(s, false);
        s->accept_resume = now + CFX_TP_ACCEPT_PAUSE_MS * 1000000ull;
    }
    SLOG(s, &s->emfile_log, now, "iface %s is out of file descriptors (%s, none waiting to "
         "authenticate): %s", s->p.who, strerror(err),
         shed ? "shed a new connection" : "accepting paused for " PAUSE_TEXT);
    return shed;
}

void cfx__tp_strangers_tick(struct cfx__tp_strangers *s, uint64_t now)
{
    if (s->accept_resume && now >= s->accept_resume) {
        if (s->spare_fd < 0)
            s->spare_fd = cfx__spare_fd_open();
        s->accept_resume = 0;
        s->p.listen(s, true);
    }
    cfx__ratelog_flush(&s->evict_log, s->p.subsys, __FILE__, __LINE__, now);
    cfx__ratelog_flush(&s->emfile_log, s->p.subsys, __FILE__, __LINE__, now);
}

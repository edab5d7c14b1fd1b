/*
 * Strangers: connections a transport accepted whose peer has proven nothing
 * yet (from accept until the engine's token handshake ends in ep_authorize,
 * or the connection goes).  Anyone may open one, and each holds a
 * descriptor and an endpoint's buffers (on verbs a QP and registered
 * memory too) until its deadline, so, as the coordinator does for its port
 * (control/coord.c):
 *
 *  - they are capped, of all sources (max) and of one address
 *    (max_per_ip); at a cap the oldest of them (of the newcomer's address
 *    at the second) is closed for the newcomer rather than the newcomer
 *    refused: it proved nothing for the longest time, while a refusal would
 *    let a flood lock every token holder out until its connections'
 *    deadlines.  A token holder's handshake takes a round trip or two, so a
 *    flood must open a whole cap's worth within it to push it out;
 *  - out of descriptors (EMFILE/ENFILE) the pending connection keeps the
 *    level-triggered listener readable, and the progress thread would spin
 *    (it logged 3.4 million lines in 20 s): the oldest stranger is closed
 *    for it as at a cap; with none, it is accepted on the reserve fd and
 *    closed (cfx__accept_shed); with no reserve either, accepting pauses
 *    for CFX_TP_ACCEPT_PAUSE_MS;
 *  - each of these lines is written at most once a second (flood.h).
 *
 * The caps are small, so the oldest of an address is found by walking the
 * list (no hash of addresses as the coordinator's thousands need).  A
 * transport embeds one struct cfx__tp_strangers in its iface and one
 * struct cfx__tp_stranger in each endpoint it accepts; the iface's thread
 * (the progress lock) owns both, except the counters.
 */
#ifndef CFX_TPBASE_TP_STRANGERS_H
#define CFX_TPBASE_TP_STRANGERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dataplane/common/flood.h"
#include "dataplane/common/list.h"

#define CFX_TP_ACCEPT_PAUSE_MS 100

struct cfx__tp_stranger {
    struct cfx_list link; /* strangers->list, oldest first */
    uint32_t ip;          /* source IPv4 address (network order); 0: unknown, no per-address cap */
    uint64_t since_ns;    /* accepted: when */
    const char *addr;     /* the peer's "ip:port", in lines (the endpoint's) */
    bool on;              /* on the list */
};

struct cfx__tp_strangers;

struct cfx__tp_strangers_params {
    const char *who;        /* the iface's address, in lines (outlives the set) */
    const char *subsys;     /* log subsystem: "TCP", "VERBS" */
    const char *env_max;    /* name of the total cap's variable, its default: */
    uint32_t def_max;
    const char *env_per_ip; /* the same for one address */
    uint32_t def_per_ip;
    /* Close @p st's endpoint (it leaves the list through cfx__tp_stranger_del)
     * with CFX_ERR_NO_RESOURCE; @p why says so to the user. */
    void (*evict)(struct cfx__tp_stranger *st, const char *why);
    /* Turn the listener's readiness events on or off (a pause). */
    void (*listen)(struct cfx__tp_strangers *s, bool on);
};

struct cfx__tp_strangers {
    struct cfx__tp_strangers_params p;
    struct cfx_list list;       /* struct cfx__tp_stranger, oldest first */
    uint32_t n;                 /* on it */
    uint32_t max;               /* cap of all of them (p.env_max) */
    uint32_t max_per_ip;        /* cap of one source address (p.env_per_ip) */
    int spare_fd;               /* reserve fd, freed to shed a connection at EMFILE; -1 */
    uint64_t accept_resume;     /* accepting paused until then (ns); 0: on */
    struct cfx_ratelog evict_log;  /* strangers closed for a newcomer */
    struct cfx_ratelog emfile_log; /* out of descriptors at accept */
    _Atomic uint64_t n_evicted; /* closed at a cap or out of fds (any thread reads) */
    _Atomic uint64_t n_shed;    /* accepted and closed at once, out of fds with none to close */
};

/* The caps from the environment (1..1048576, else the defaults) and a
 * reserve fd when @p reserve (a listener of its own: the caller accepts). */
void cfx__tp_strangers_init(struct cfx__tp_strangers *s,
                            const struct cfx__tp_strangers_params *p, bool reserve);
void cfx__tp_strangers_fini(struct cfx__tp_strangers *s);

/* A newcomer from @p ip is about to be accepted: close what a cap says to. */
void cfx__tp_strangers_admit(struct cfx__tp_strangers *s, uint32_t ip, uint64_t now);
/* @p st's endpoint was accepted from @p ip ("ip:port" @p addr, which
 * lives as long as it) at @p now: one more stranger. */
void cfx__tp_stranger_add(struct cfx__tp_strangers *s, struct cfx__tp_stranger *st, uint32_t ip,
                          const char *addr, uint64_t now);
/* @p st proved the token, or its endpoint goes: no stranger (any number of
 * times; a never-added stranger is zeroed memory and not on the list). */
void cfx__tp_stranger_del(struct cfx__tp_strangers *s, struct cfx__tp_stranger *st);

/* accept() on @p listen_fd failed with EMFILE or ENFILE (@p err): free a
 * descriptor as the header says.  Returns whether to accept again. */
bool cfx__tp_strangers_out_of_fds(struct cfx__tp_strangers *s, int listen_fd, int err,
                                  uint64_t now);
/* Whether accepting is paused (stop accepting in this pass). */
static inline bool cfx__tp_strangers_paused(const struct cfx__tp_strangers *s)
{
    return s->accept_resume != 0;
}
/* On the poll's tick: accept again after a pause; write what a quiet second
 * left of the lines. */
void cfx__tp_strangers_tick(struct cfx__tp_strangers *s, uint64_t now);

#endif

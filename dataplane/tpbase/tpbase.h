/*
 * The transport base: what every transport (tcp, shm, verbs, dpdk) needs
 * and none should write again, after UCX's uct_base.  A transport embeds
 * these objects in its iface and drives them from its own code; nothing here
 * knows a transport.
 *
 *   struct cfx__tp_cq         the software completion queue poll() drains,
 *                             with the one overflow rule (below);
 *   struct cfx__tp_table      a table of slots named by index and generation
 *                             (registrations, endpoints named in wr_ids);
 *   struct cfx__tp_graveyard  closed endpoints, freed at the next poll();
 *   cfx__tp_sock_*            non-blocking IPv4 TCP sockets: listen, connect.
 *
 * The overflow rule.  A transport reserves room in its queue for what each
 * endpoint may have outstanding (cfx__tp_cq_reserve at endpoint creation:
 * an allocation that fails there is an error the caller sees), so a push
 * normally lands in the ring.  Should a push find the ring full anyway (a
 * transport that does not reserve, or reserves too little), the completion
 * goes to an overflow list of chunks behind the ring, and every later push
 * follows it there until poll() has drained the ring and moved the overflow
 * back: nothing is lost and the order stays the order of the pushes.  The
 * overflow is capped (CFX_TP_CQ_OVERFLOW_MAX entries, or memory): a push
 * past the cap cannot be kept; the queue then logs an error naming its iface
 * and poll() returns CFX_ERR_NO_RESOURCE once, so the loss is never silent.
 * cfx__tp_cq_backlogged() is true while anything sits in the overflow, so a
 * transport may refuse new posts (CFX_ERR_AGAIN) until it drains.
 *
 * Threading: like the iface that holds them (transport.h): one thread at a
 * time, under the context's progress lock.
 */
#ifndef CFX_TPBASE_TPBASE_H
#define CFX_TPBASE_TPBASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dataplane/common/list.h"
#include "dataplane/common/util.h"
#include "dataplane/transport.h"

/* ---- completion queue ------------------------------------------------------- */

#define CFX_TP_CQ_CHUNK        256          /* completions per overflow chunk */
#define CFX_TP_CQ_OVERFLOW_MAX (1u << 20)   /* completions the overflow may hold */

struct cfx__tp_cq_chunk {
    struct cfx_list link;                         /* cq->overflow, oldest first */
    uint32_t head;                                /* next entry to pop */
    uint32_t tail;                                /* next entry to fill */
    struct cfx_tp_completion c[CFX_TP_CQ_CHUNK];
};

struct cfx__tp_cq {
    struct cfx_tp_completion *ring; /* FIFO, cap entries */
    uint32_t cap;                   /* ring capacity: at least the reservations */
    uint32_t head;                  /* next ring entry to pop */
    uint32_t count;                 /* entries in the ring */
    uint32_t reserved;              /* sum of the reservations */
    struct cfx_list overflow;       /* chunks behind the ring (struct cfx__tp_cq_chunk) */
    uint32_t n_overflow;            /* entries in the overflow */
    uint32_t overflow_max;          /* cap on n_overflow (CFX_TP_CQ_OVERFLOW_MAX) */
    struct cfx__tp_cq_chunk *spare; /* an empty chunk kept for the next overflow */
    int status;                     /* CFX_ERR_NO_RESOURCE after a push past the cap,
                                       until poll() reported it */
    uint64_t n_overflowed;          /* pushes that went to the overflow (stats, tests) */
    uint64_t n_lost;                /* pushes past the cap */
    const char *who;                /* names the iface in messages (owned by it) */
    struct cfx_tp_completion sink;  /* what a push past the cap fills */
};

/* Empty queue with a ring of @p cap entries (0: a default).  @p who names
 * the owner in messages and must outlive the queue.  CFX_OK or
 * CFX_ERR_NOMEM. */
int cfx__tp_cq_init(struct cfx__tp_cq *cq, uint32_t cap, const char *who);
/* Free what the queue holds (its completions are dropped). */
void cfx__tp_cq_fini(struct cfx__tp_cq *cq);
/* Reserve @p n entries (one endpoint's worst case): the ring grows to hold
 * every reservation.  CFX_OK, or CFX_ERR_NOMEM with the detail set. */
int cfx__tp_cq_reserve(struct cfx__tp_cq *cq, uint32_t n);
void cfx__tp_cq_unreserve(struct cfx__tp_cq *cq, uint32_t n);

struct cfx_tp_completion *cfx__tp_cq_push_slow(struct cfx__tp_cq *cq);

/* Queue one completion: returns it zeroed for the caller to fill.  Never
 * NULL (past the overflow cap: a sink, and the loss is reported). */
static inline struct cfx_tp_completion *cfx__tp_cq_push(struct cfx__tp_cq *cq)
{
    if (unlikely(cq->count == cq->cap || cq->n_overflow))
        return cfx__tp_cq_push_slow(cq);
    uint32_t i = cq->head + cq->count++;
    struct cfx_tp_completion *c = &cq->ring[i >= cq->cap ? i - cq->cap : i];
    *c = (struct cfx_tp_completion){ 0 };
    return c;
}

/* Oldest queued completion, or NULL when empty. */
static inline struct cfx_tp_completion *cfx__tp_cq_head(struct cfx__tp_cq *cq)
{
    return cq->count ? &cq->ring[cq->head] : NULL;
}

void cfx__tp_cq_refill(struct cfx__tp_cq *cq);

/* Drop the oldest completion (the one cfx__tp_cq_head returned). */
static inline void cfx__tp_cq_pop(struct cfx__tp_cq *cq)
{
    cq->head = cq->head + 1 == cq->cap ? 0 : cq->head + 1;
    cq->count--;
    if (unlikely(cq->n_overflow))
        cfx__tp_cq_refill(cq);
}

/* Completions queued (ring and overflow). */
static inline uint32_t cfx__tp_cq_count(const struct cfx__tp_cq *cq)
{
    return cq->count + cq->n_overflow;
}

/* True while completions wait in the overflow: new posts may say AGAIN. */
static inline bool cfx__tp_cq_backlogged(const struct cfx__tp_cq *cq)
{
    return cq->n_overflow != 0;
}

/* Forget every queued completion of @p ep (being closed); the others keep
 * their order. */
void cfx__tp_cq_drop_ep(struct cfx__tp_cq *cq, const struct cfx_tp_ep *ep);

/* What poll() returns when it has no completion to give: 0, or the status
 * of a loss not yet reported (reported once). */
static inline int cfx__tp_cq_take_status(struct cfx__tp_cq *cq)
{
    int s = cq->status;
    cq->status = 0;
    return s;
}

/* ---- slot table -------------------------------------------------------------- */

/*
 * Objects named by a small index, so that a peer or a work request can name
 * them in a few bits, and by a generation bumped each time a slot is freed,
 * so that a stale name (a completion for an endpoint already destroyed) is
 * recognised instead of touching another object.  Free slots are reused
 * lowest index first after growth, most recently freed first after that.
 */
struct cfx__tp_slot {
    void *obj;          /* NULL when free */
    uint32_t gen;       /* bumped (within gen_mask) when freed */
    uint32_t next_free; /* free list link, UINT32_MAX ends */
};

struct cfx__tp_table {
    struct cfx__tp_slot *slots;
    uint32_t cap;       /* slots allocated */
    uint32_t free;      /* free list head, UINT32_MAX: none */
    uint32_t first;     /* capacity of the first allocation */
    uint32_t max;       /* most slots the table may have */
    uint32_t gen_mask;  /* generations wrap within it */
    uint32_t gen_first; /* generation of a slot when first allocated (1 unless seeded) */
    const char *what;   /* "tcp registration": names the objects in messages */
};

/* Empty table growing from @p first slots to at most @p max, generations in
 * @p gen_bits bits (1..32). */
void cfx__tp_table_init(struct cfx__tp_table *t, uint32_t first, uint32_t max,
                        unsigned gen_bits, const char *what);
/* Start new slots' generations at @p seed (within the mask) instead of 1: ids
 * made of (index, generation) then differ between a process and its
 * restarted self (dpdk sessions). */
void cfx__tp_table_seed_gen(struct cfx__tp_table *t, uint32_t seed);
/* Free the slots (not the objects: the caller walks them first). */
void cfx__tp_table_fini(struct cfx__tp_table *t);
/* Put @p obj in a free slot: its index in *idx, its generation in *gen
 * (either may be NULL).  CFX_ERR_NO_RESOURCE (table at max) or
 * CFX_ERR_NOMEM, with the detail set. */
int cfx__tp_table_add(struct cfx__tp_table *t, void *obj, uint32_t *idx, uint32_t *gen);
/* Free slot @p idx; its generation moves on. */
void cfx__tp_table_remove(struct cfx__tp_table *t, uint32_t idx);

/* Object in slot @p idx, or NULL (free or out of range). */
static inline void *cfx__tp_table_at(const struct cfx__tp_table *t, uint32_t idx)
{
    return likely(idx < t->cap) ? t->slots[idx].obj : NULL;
}

/* Object in slot @p idx if its generation is still @p gen, else NULL. */
static inline void *cfx__tp_table_get(const struct cfx__tp_table *t, uint32_t idx, uint32_t gen)
{
    if (unlikely(idx >= t->cap) || unlikely(t->slots[idx].gen != (gen & t->gen_mask)))
        return NULL;
    return t->slots[idx].obj;
}

/* ---- graveyard ------------------------------------------------------------------ */

/*
 * A closed endpoint is not freed at once: the data of a RECV that poll()
 * returned stays valid until the next poll(), and a transport may still hold
 * completions or hardware work naming it.  ep_close moves it here; poll()
 * and iface_close free what lies here through the transport's destroy.
 */
struct cfx__tp_graveyard {
    struct cfx_list list;                    /* closed endpoints (their link) */
    void (*destroy)(struct cfx_list *link);  /* the transport's: frees one */
};

static inline void cfx__tp_graveyard_init(struct cfx__tp_graveyard *g,
                                          void (*destroy)(struct cfx_list *link))
{
    cfx_list_init(&g->list);
    g->destroy = destroy;
}

/* Move the endpoint whose list link is @p link (on a live list or on none)
 * to the graveyard. */
static inline void cfx__tp_graveyard_add(struct cfx__tp_graveyard *g, struct cfx_list *link)
{
    cfx_list_del(link);
    cfx_list_add_tail(link, &g->list);
}

static inline bool cfx__tp_graveyard_empty(const struct cfx__tp_graveyard *g)
{
    return cfx_list_empty(&g->list);
}

/* Destroy every endpoint in the graveyard, oldest first. */
void cfx__tp_graveyard_free(struct cfx__tp_graveyard *g);

/* ---- IPv4 TCP sockets (tcp's connections, verbs' out-of-band exchange) ------------ */

struct in_addr;
struct sockaddr_in;

/* Non-blocking listening socket on @p ip, port chosen by the kernel: the
 * fd in *fd, the port (host order) in *port.  An address that is not ours
 * is CFX_ERR_NO_DEVICE.  @p who prefixes the error detail. */
int cfx__tp_sock_listen(const char *who, const struct in_addr *ip, int *fd, uint16_t *port);
/* Accept one connection (non-blocking, close-on-exec) and name its peer
 * "ip:port" in @p addr, its IPv4 address (network order) in *@p ip unless
 * NULL.  The fd, or -1 with errno set (EAGAIN: none). */
int cfx__tp_sock_accept(int listen_fd, char *addr, size_t addr_len, uint32_t *ip);
/* True when an accept4 errno is worth a warning (not "none left"; EMFILE
 * and ENFILE are, and need more than a warning: the listener stays
 * readable, so the caller sheds or pauses, tcp_iface.c). */
bool cfx__tp_sock_accept_err_notable(int err);
/* Non-blocking socket connecting to @p dst (EINPROGRESS is success): the fd,
 * or a negative status with the detail "<who> to <peer>: ...". */
int cfx__tp_sock_connect(const char *who, const char *peer, const struct sockaddr_in *dst);
/* Options of a data or control connection: no Nagle, keepalive that notices
 * a silent peer in about 25 s (idle 10 s, then 3 probes 5 s apart), and
 * CFX_TCP_SNDBUF / CFX_TCP_RCVBUF when @p bufs_from_env (they turn kernel
 * autotuning off, see tcp(7)), read once per process, at its first such
 * socket (a bound's warning is said once).  Any thread. */
void cfx__tp_sock_setup(int fd, bool bufs_from_env);
/* $CFX_TCP_SNDBUF / $CFX_TCP_RCVBUF (@p name) in bytes, 0 (kernel autotuning)
 * when unset; a value outside [0, INT_MAX] is brought to the nearest bound
 * with a warning naming it.  Reads the environment at each call. */
int cfx__tp_sock_env_buf(const char *name);

/* ---- grants revoked lately --------------------------------------------------
 *
 * A receiver revokes a grant (mr_revoke, or the registration goes) when it
 * gives up a transfer (a deadline, a canceled get) without waiting for the
 * writer: the writer's frames already on their way then arrive under a key
 * that no longer names a grant.  Those are not a peer's fault, and failing
 * the endpoint for them would fail every other transfer and message on it.
 * So the last CFX_TP_REVOKED_KEEP grants revoked are remembered (key and
 * the endpoint they were granted to): a write under one of them is dropped
 * whole, nothing of it landing, and counted; any other unknown key is still
 * refused and fails the endpoint.  The keys are 64 random bits: a stranger
 * cannot hit one.
 */
#define CFX_TP_REVOKED_KEEP 64

struct cfx__tp_revoked {
    uint64_t key[CFX_TP_REVOKED_KEEP];
    uint64_t ep[CFX_TP_REVOKED_KEEP];   /* endpoint serial granted to; 0: any */
    unsigned next;
};

/* Remember grant @p key (0: none, ignored) given to endpoint @p ep. */
static inline void cfx__tp_revoked_add(struct cfx__tp_revoked *r, uint64_t key, uint64_t ep)
{
    if (!key)
        return;
    unsigned i = r->next++ % CFX_TP_REVOKED_KEEP;
    r->key[i] = key;
    r->ep[i] = ep;
}

/* Whether @p key was a grant revoked lately to endpoint @p ep (or to any). */
static inline bool cfx__tp_revoked_has(const struct cfx__tp_revoked *r, uint64_t key, uint64_t ep)
{
    for (unsigned i = 0; key && i < CFX_TP_REVOKED_KEEP; i++)
        if (r->key[i] == key && (!r->ep[i] || r->ep[i] == ep))
            return true;
    return false;
}

/* ---- registrations and write grants checked in software (shm, tcp, dpdk) --------
 *
 * A registration of these transports takes no remote write until it is
 * granted (mr_grant): a grant draws 64 fresh random bits (the iface's
 * keystream) as its key and may name the one endpoint allowed to write.
 * Their receive paths check key, writer and bounds (cfx__tp_grant_refuses)
 * before a byte of a write lands.  Revoking, granting again or
 * deregistering ends the grant, remembered among the revoked ones above, so
 * a key that outlived its transfer, or one learned from an earlier grant,
 * matches nothing.  (verbs grants are the NIC's: memory windows, verbs_mr.c.)
 */
struct cfx__tp_grant {
    uint64_t key;   /* the live grant's random key; 0: none (no write accepted) */
    uint64_t ep;    /* serial of the only endpoint that may write; 0: any */
};

/* mem_reg of host memory: the arguments checked (CFX_ERR_INVALID, or
 * CFX_ERR_UNSUPPORTED for memory that is not host memory; the detail
 * begins "<who> mem_reg: "), then @p mr's common part filled in for
 * @p iface. */
int cfx__tp_host_reg(const char *who, struct cfx_tp_iface *iface,
                     const struct cfx_tp_mem_desc *mem, unsigned access, struct cfx_tp_mr *mr);

/* mr_grant's arguments: CFX_OK, or CFX_ERR_INVALID (NULL, another iface's
 * endpoint, a region not registered for remote writes) with the detail
 * "<who> mr_grant: ...". */
int cfx__tp_grant_args(const char *who, const struct cfx_tp_mr *mr, const struct cfx_tp_ep *ep,
                       const struct cfx_tp_rdesc *out);

/* A new grant for endpoint serial @p ep (0: any) under a fresh key from
 * @p ks; the one before ends. */
static inline void cfx__tp_grant_new(struct cfx__tp_grant *g, struct cfx__tp_revoked *r,
                                     struct cfx__keystream *ks, uint64_t ep)
{
    cfx__tp_revoked_add(r, g->key, g->ep);
    g->key = cfx__keystream_next(ks);
    g->ep = ep;
}

/* The grant ends (mr_revoke, mem_dereg): no write is accepted under it. */
static inline void cfx__tp_grant_end(struct cfx__tp_grant *g, struct cfx__tp_revoked *r)
{
    cfx__tp_revoked_add(r, g->key, g->ep);
    g->key = 0;
    g->ep = 0;
}

/* Why a write of @p len bytes at @p off under @p key from endpoint serial
 * @p ep is refused by grant @p g of a region of @p size bytes (@p g NULL: no
 * such registration), or NULL: it may land. */
static inline const char *cfx__tp_grant_refuses(const struct cfx__tp_grant *g, size_t size,
                                                uint64_t key, uint64_t ep, uint64_t off,
                                                uint64_t len)
{
    if (unlikely(!g || !g->key || g->key != key))
        return "no live grant with that key";
    if (unlikely(g->ep && g->ep != ep))
        return "granted to another peer";
    if (unlikely(off > size || len > size - off))
        return "outside the granted bytes";
    return NULL;
}

#endif

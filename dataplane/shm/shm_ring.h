/*
 * Single-producer/single-consumer byte ring in a shared segment.
 *
 * Positions are free-running 64-bit byte counters; the offset in the ring is
 * pos & mask.  Messages are 64-byte aligned and never straddle the end: a
 * WRAP message pads up to it.  The producer writes a message, then publishes
 * head with a release store; the consumer loads head with acquire, uses the
 * message, then publishes tail with a release store so the producer may
 * reuse the space.  head, tail and the two wake-up flags sit on separate
 * cache lines.
 *
 * The peer maps the segment read-write, so head and tail as read from it
 * are claims, not facts: every position read is checked against what the
 * peer could have published (a tail between the last one seen and our
 * published head, a head between the last one seen and one ring past our
 * read position, both message aligned) before it is used.  A bad one makes
 * the accessor return -1 and the endpoint fails (CFX_ERR_PROTO).
 *
 * Segment layout: one page holding struct cfx__shm_seg_hdr (the control
 * blocks of both rings), then ring 0 (connector -> acceptor), then ring 1.
 */
#ifndef CFX_SHM_RING_H
#define CFX_SHM_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CFX_SHM_CACHELINE 64
#define CFX_SHM_SEG_HDR   4096  /* bytes before ring 0 */
#define CFX_SHM_MSG_ALIGN 64
#define CFX_SHM_MSG_HDR   64    /* header bytes; payload is cache-line aligned */

enum cfx__shm_msg_type {
    CFX_SHM_MSG_WRAP = 0x5701,
    CFX_SHM_MSG_SEND,
    CFX_SHM_MSG_WFRAG,
    CFX_SHM_MSG_WDONE,     /* no longer sent (protocol 2 only): refused as unknown */
    CFX_SHM_MSG_WPULL,
};

#define CFX_SHM_MSG_LAST 1u  /* WFRAG: last fragment of the write */

/* WPULL payload: where the receiver finds the source of a one-copy write,
 * a region of a sealed file the writer holds open (its arena memfd). */
struct cfx__shm_pull {
    int32_t fd;            /* writer's fd of the file (/proc/<writer pid>/fd/<fd>) */
    uint32_t rsv;
    uint64_t ino;          /* inode of that file: a reused fd number won't match */
    uint64_t foff;         /* offset in the file of the writer's registration */
    uint64_t flen;         /* bytes of that registration */
    uint64_t soff;         /* where the source starts in it */
    uint64_t seq;          /* 1, 2, ... per endpoint: answered in ctl->pulled */
};

struct cfx__shm_msg {
    uint16_t type;         /* enum cfx__shm_msg_type */
    uint16_t flags;        /* CFX_SHM_MSG_LAST */
    uint32_t len;          /* payload bytes after the header */
    uint32_t key;          /* WFRAG, WPULL: receiver's registration key */
    uint32_t imm;          /* WFRAG(LAST), WPULL */
    uint64_t off;          /* WFRAG: where this payload goes; WPULL: write start */
    uint64_t start;        /* WFRAG: where the whole write starts */
    uint64_t total;        /* WFRAG, WPULL: bytes of the whole write */
    uint64_t grant;        /* WFRAG, WPULL: random key of the receiver's live grant */
};

struct cfx__shm_ring_ctl {
    _Alignas(CFX_SHM_CACHELINE) _Atomic uint64_t head; /* producer */
    _Alignas(CFX_SHM_CACHELINE) _Atomic uint64_t tail; /* consumer */
    _Alignas(CFX_SHM_CACHELINE) _Atomic uint32_t consumer_sleeping;
    _Alignas(CFX_SHM_CACHELINE) _Atomic uint32_t producer_waiting;
    /* consumer: WPULLs answered, (seq << 1) | 1 when it could not read the
     * source (the producer stages that write instead) */
    _Alignas(CFX_SHM_CACHELINE) _Atomic uint64_t pulled;
};

struct cfx__shm_seg_hdr {
    uint32_t magic;        /* CFX_SHM_MAGIC */
    uint32_t version;
    uint64_t ring_size;
    _Alignas(CFX_SHM_CACHELINE) struct cfx__shm_ring_ctl ctl[2];
};

_Static_assert(sizeof(struct cfx__shm_seg_hdr) <= CFX_SHM_SEG_HDR, "segment header");
_Static_assert(sizeof(struct cfx__shm_msg) <= CFX_SHM_MSG_HDR, "message header");

/* One side's view of a ring. */
struct cfx__shm_ring {
    struct cfx__shm_ring_ctl *ctl;
    uint8_t *data;
    uint64_t size;         /* power of two */
    uint64_t mask;
    uint64_t pos;          /* producer: next write (unpublished); consumer: next read */
    uint64_t cached;       /* producer: last tail seen; consumer: last head seen */
    uint64_t published;    /* producer: head as published; consumer: tail as published */
};

static inline uint64_t cfx__shm_msg_size(uint64_t payload)
{
    return CFX_SHM_MSG_HDR + ((payload + CFX_SHM_MSG_ALIGN - 1) & ~(uint64_t)(CFX_SHM_MSG_ALIGN - 1));
}

/* ---- positions ---------------------------------------------------------- */

/* A tail the consumer may have published: in [last seen, our published
 * head], message aligned.  Modular arithmetic, so counters may wrap. */
static inline int cfx__shm_ring_tail_ok(const struct cfx__shm_ring *r, uint64_t tail)
{
    return tail - r->cached <= r->published - r->cached &&
           !(tail & (CFX_SHM_MSG_ALIGN - 1));
}

/* A head the producer may have published: in [last seen, read position +
 * ring size], message aligned. */
static inline int cfx__shm_ring_head_ok(const struct cfx__shm_ring *r, uint64_t head)
{
    return head - r->cached <= r->pos + r->size - r->cached &&
           !(head & (CFX_SHM_MSG_ALIGN - 1));
}

/* ---- producer ----------------------------------------------------------- */

/*
 * Room for one message with a payload of at most @p want bytes and at least
 * min(@p want, @p min) bytes.  Returns 0 when none, 1 when it fits at pos,
 * 2 when it must start after a WRAP; *payload is the size that fits.
 * @p tail must have passed cfx__shm_ring_tail_ok().
 */
static inline int cfx__shm_ring_fit_at(const struct cfx__shm_ring *r, uint64_t tail,
                                       uint64_t want, uint64_t min, uint64_t *payload)
{
    uint64_t need_min = cfx__shm_msg_size(want < min ? want : min);
    uint64_t want_size = cfx__shm_msg_size(want);
    uint64_t free_ = r->size - (r->pos - tail);
    uint64_t contig = r->size - (r->pos & r->mask);
    uint64_t here = free_ < contig ? free_ : contig;
    uint64_t room;
    int where;

    if (here >= need_min) {
        room = here;
        where = 1;
    } else if (free_ > contig && free_ - contig >= need_min) {
        room = free_ - contig;
        where = 2;
    } else {
        return 0;
    }
    *payload = room >= want_size ? want : room - CFX_SHM_MSG_HDR;
    return where;
}

/* As cfx__shm_ring_fit_at() with the consumer's tail; -1 when the tail it
 * published cannot be (the endpoint must fail). */
static inline int cfx__shm_ring_fit(struct cfx__shm_ring *r, uint64_t want, uint64_t min,
                                    uint64_t *payload)
{
    /* the cached tail first: reading the consumer's line costs a transfer */
    if (r->size - (r->pos - r->cached) >= cfx__shm_msg_size(want) + (r->size - (r->pos & r->mask)))
        return cfx__shm_ring_fit_at(r, r->cached, want, min, payload);
    uint64_t tail = atomic_load_explicit(&r->ctl->tail, memory_order_acquire);
    if (__builtin_expect(!cfx__shm_ring_tail_ok(r, tail), 0))
        return -1;
    r->cached = tail;
    return cfx__shm_ring_fit_at(r, r->cached, want, min, payload);
}

/* Start a message where cfx__shm_ring_fit() said; returns its header. */
static inline struct cfx__shm_msg *cfx__shm_ring_begin(struct cfx__shm_ring *r, int where)
{
    if (where == 2) {
        struct cfx__shm_msg *w = (struct cfx__shm_msg *)(r->data + (r->pos & r->mask));
        w->type = CFX_SHM_MSG_WRAP;
        w->len = 0;
        r->pos += r->size - (r->pos & r->mask);
    }
    return (struct cfx__shm_msg *)(r->data + (r->pos & r->mask));
}

static inline void cfx__shm_ring_commit(struct cfx__shm_ring *r, uint64_t payload)
{
    r->pos += cfx__shm_msg_size(payload);
}

/* Make committed messages visible to the consumer. */
static inline void cfx__shm_ring_publish(struct cfx__shm_ring *r)
{
    atomic_store_explicit(&r->ctl->head, r->pos, memory_order_release);
    r->published = r->pos;
}

/* ---- consumer ----------------------------------------------------------- */

/* Bytes readable at pos into *avail (refreshing the cached head when none
 * are known).  0, or -1 when the head the producer published cannot be (the
 * endpoint must fail). */
static inline int cfx__shm_ring_avail(struct cfx__shm_ring *r, uint64_t *avail)
{
    if (r->cached == r->pos) {
        uint64_t head = atomic_load_explicit(&r->ctl->head, memory_order_acquire);
        if (__builtin_expect(!cfx__shm_ring_head_ok(r, head), 0))
            return -1;
        r->cached = head;
    }
    *avail = r->cached - r->pos;
    return 0;
}

static inline void cfx__shm_ring_release(struct cfx__shm_ring *r)
{
    atomic_store_explicit(&r->ctl->tail, r->pos, memory_order_release);
    r->published = r->pos;
}

/*
 * Check the message header a consumer sees at its read position: @p avail
 * bytes are published, @p contig bytes remain before the end of a ring of
 * @p ring_size bytes; @p buf holds at least CFX_SHM_MSG_HDR bytes of it
 * (@p len says how many).  Copies the header to @p out (the peer may change
 * the ring under us: use the copy) and checks what needs no registration
 * table: a known type, a WRAP that reaches the end, a message inside the
 * published and contiguous bytes, a SEND under CFX_TP_SEND_MAX, a write
 * under CFX_TP_WRITE_MAX whose fragment lies inside it.  Pure: fuzzed by
 * test/fuzz/fuzz_shm_msg.c.  Returns the type, or CFX_ERR_PROTO with a
 * static reason in *why.
 */
int cfx__shm_msg_check(const void *buf, size_t len, uint64_t avail, uint64_t contig,
                       uint64_t ring_size, struct cfx__shm_msg *out, const char **why);

/* Set up a view; @p ctl and @p data live in a mapped segment. */
void cfx__shm_ring_view(struct cfx__shm_ring *r, struct cfx__shm_ring_ctl *ctl,
                        uint8_t *data, uint64_t size, int producer);

/* Create a memfd segment for two rings of @p ring_size bytes, sealed against
 * resizing, mapped and initialised.  Returns the fd; *seg and *seg_len set. */
int cfx__shm_seg_create(uint64_t ring_size, void **seg, size_t *seg_len);

/* Map a segment received from a peer after checking its size and seals. */
int cfx__shm_seg_attach(int fd, uint64_t ring_size, void **seg, size_t *seg_len);

/* Store fence that also orders non-temporal stores of a large memcpy. */
static inline void cfx__shm_wmb(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_sfence();
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}

#endif

/*
 * libFuzzer target: ring positions a hostile peer publishes
 * (cfx__shm_ring_tail_ok, cfx__shm_ring_head_ok and the producer's
 * cfx__shm_ring_fit), driven as the shm endpoint drives them.
 *
 * Input: a sequence of 9-byte steps { op, u64 value }.  op & 3 == 0: the
 * peer (consumer of our ring) stores value as its tail; 1: we produce a
 * message of value % 8192 payload bytes where the ring says it fits; 2: the
 * peer (producer of the other ring) stores value as its head and we read
 * what it says is available; 3: the peer consumes honestly up to our head.
 * The ring is exactly RING bytes of heap, so AddressSanitizer sees any
 * message the checks let us write past its end; a position accepted that
 * claims more than a ring aborts.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/shm/shm_ring.h"

#define RING 4096u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx__shm_ring_ctl *ctl = aligned_alloc(CFX_SHM_CACHELINE, 2 * sizeof(*ctl));
    uint8_t *ring = malloc(RING), *rx = malloc(RING);
    static const uint8_t payload[8192];
    struct cfx__shm_ring tx, in;

    if (!ctl || !ring || !rx)
        goto out;
    memset(ctl, 0, 2 * sizeof(*ctl));
    cfx__shm_ring_view(&tx, &ctl[0], ring, RING, 1);
    cfx__shm_ring_view(&in, &ctl[1], rx, RING, 0);
    for (size_t off = 0; off + 9 <= size; off += 9) {
        uint64_t v;
        memcpy(&v, data + off + 1, sizeof(v));
        switch (data[off] & 3) {
        case 0:
            atomic_store(&ctl[0].tail, v);
            break;
        case 1: {
            uint64_t want = v % sizeof(payload), p;
            int where = cfx__shm_ring_fit(&tx, want, want < 4096 ? want : 4096, &p);
            if (where < 0)
                goto out; /* the endpoint fails here */
            if (where == 0)
                break;
            struct cfx__shm_msg *m = cfx__shm_ring_begin(&tx, where);
            memcpy((uint8_t *)m + CFX_SHM_MSG_HDR, payload, p);
            m->type = CFX_SHM_MSG_SEND;
            m->len = (uint32_t)p;
            cfx__shm_ring_commit(&tx, p);
            cfx__shm_ring_publish(&tx);
            break;
        }
        case 2: {
            uint64_t avail;
            atomic_store(&ctl[1].head, v);
            if (cfx__shm_ring_avail(&in, &avail) < 0)
                goto out; /* the endpoint fails here */
            if (avail > RING)
                abort();
            /* consume it all, as if every message were checked and taken */
            in.pos += avail;
            cfx__shm_ring_release(&in);
            break;
        }
        case 3:
            atomic_store(&ctl[0].tail, tx.published);
            break;
        }
    }
out:
    free(ctl);
    free(ring);
    free(rx);
    return 0;
}

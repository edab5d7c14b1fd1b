/*
 * libFuzzer target: the shm ring consumer's message checks
 * (cfx__shm_msg_check), driven the way cfx__shm_ep_rx_progress drives them.
 *
 * Input: byte 0 picks where the read position starts in a 4 KiB ring, the
 * rest is what the (hostile) peer published from there on, wrapping.  The
 * walk consumes messages as the endpoint does and copies accepted write
 * fragments into an 8 KiB "registration" after the same key-less bounds
 * lookup the registration table applies, so AddressSanitizer sees any
 * message the check lets through that would read outside the ring or write
 * outside the region.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/shm/shm.h"

#define RING   4096u
#define REGION 8192u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *ring = malloc(RING);
    uint8_t *region = malloc(REGION);
    if (!ring || !region)
        goto out;
    if (size < 1)
        goto out;
    uint64_t pos = (uint64_t)(data[0] % (RING / CFX_SHM_MSG_ALIGN)) * CFX_SHM_MSG_ALIGN;
    size_t n = size - 1 < RING ? size - 1 : RING;
    memset(ring, 0, RING);
    for (size_t i = 0; i < n; i++)
        ring[(pos + i) % RING] = data[1 + i];
    uint64_t head = pos + (n & ~(size_t)(CFX_SHM_MSG_ALIGN - 1));

    while (pos < head) {
        struct cfx__shm_msg h;
        const char *why;
        uint64_t avail = head - pos;
        uint64_t contig = RING - (pos % RING);
        const uint8_t *msg = ring + pos % RING;
        int type = cfx__shm_msg_check(msg, CFX_SHM_MSG_HDR, avail, contig, RING, &h, &why);
        if (type < 0) {
            if (type != CFX_ERR_PROTO || !why)
                abort();
            break;
        }
        if (type == CFX_SHM_MSG_WRAP) {
            pos += contig;
            continue;
        }
        uint64_t sz = cfx__shm_msg_size(h.len);
        if (sz > avail || sz > contig)
            abort();
        const uint8_t *payload = msg + CFX_SHM_MSG_HDR;
        volatile uint8_t sink = 0;
        switch (type) {
        case CFX_SHM_MSG_SEND:
            for (uint32_t i = 0; i < h.len; i++)
                sink ^= payload[i];
            break;
        case CFX_SHM_MSG_WFRAG:
            /* cfx__shm_mr_lookup(key, start, total) on a REGION-byte registration */
            if (h.start > REGION || h.total > REGION - h.start)
                goto out;
            memcpy(region + h.off, payload, h.len);
            break;
        case CFX_SHM_MSG_WPULL: {
            /* cfx__shm_mr_lookup(key, off, total) first, then the source
             * bounds rx_pull_start checks (a REGION-byte source) */
            struct cfx__shm_pull pl;
            if (h.len != sizeof(pl))
                abort();
            memcpy(&pl, payload, sizeof(pl));
            if (h.off > REGION || h.total > REGION - h.off)
                goto out;
            if (pl.soff > REGION || h.total > REGION - pl.soff)
                goto out;
            memmove(region + h.off, region + pl.soff, h.total);
            break;
        }
        default:
            abort();
        }
        (void)sink;
        pos += sz;
    }
out:
    free(ring);
    free(region);
    return 0;
}

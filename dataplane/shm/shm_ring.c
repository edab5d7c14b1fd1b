/* The shared segment that holds an endpoint's two rings. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataplane/common/log.h"

int cfx__shm_msg_check(const void *buf, size_t len, uint64_t avail, uint64_t contig,
                       uint64_t ring_size, struct cfx__shm_msg *out, const char **why)
{
    struct cfx__shm_msg h;

    memset(out, 0, sizeof(*out));
    *why = NULL;
    if (avail < CFX_SHM_MSG_HDR || avail > ring_size || len < sizeof(h) ||
        contig < CFX_SHM_MSG_HDR || contig > ring_size) {
        *why = "a torn ring";
        return CFX_ERR_PROTO;
    }
    memcpy(&h, buf, sizeof(h));
    *out = h;
    switch (h.type) {
    case CFX_SHM_MSG_WRAP:
        if (avail < contig) {
            *why = "a short wrap";
            return CFX_ERR_PROTO;
        }
        return h.type;
    case CFX_SHM_MSG_SEND:
    case CFX_SHM_MSG_WFRAG:
    case CFX_SHM_MSG_WPULL:
        break;
    default:
        *why = "an unknown message";
        return CFX_ERR_PROTO;
    }
    uint64_t sz = cfx__shm_msg_size(h.len);
    if (sz > avail || sz > contig) {
        *why = "an overlong message";
        return CFX_ERR_PROTO;
    }
    if (h.type == CFX_SHM_MSG_SEND && h.len > CFX_TP_SEND_MAX) {
        *why = "an overlong send";
        return CFX_ERR_PROTO;
    }
    if (h.type == CFX_SHM_MSG_WFRAG &&
        (h.total > CFX_TP_WRITE_MAX || h.off < h.start || h.off - h.start > h.total ||
         h.len > h.total - (h.off - h.start))) {
        *why = "a write fragment outside any registration";
        return CFX_ERR_PROTO;
    }
    if (h.type == CFX_SHM_MSG_WPULL &&
        (h.len != sizeof(struct cfx__shm_pull) || !h.total || h.total > CFX_TP_WRITE_MAX)) {
        *why = "a one-copy write outside any registration";
        return CFX_ERR_PROTO;
    }
    return h.type;
}

void cfx__shm_ring_view(struct cfx__shm_ring *r, struct cfx__shm_ring_ctl *ctl,
                        uint8_t *data, uint64_t size, int producer)
{
    r->ctl = ctl;
    r->data = data;
    r->size = size;
    r->mask = size - 1;
    if (producer) {
        r->pos = atomic_load_explicit(&ctl->head, memory_order_relaxed);
        r->cached = atomic_load_explicit(&ctl->tail, memory_order_acquire);
    } else {
        r->pos = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
        r->cached = r->pos;
    }
    r->published = r->pos;
}

static size_t seg_size(uint64_t ring_size)
{
    return CFX_SHM_SEG_HDR + 2 * (size_t)ring_size;
}

int cfx__shm_seg_create(uint64_t ring_size, void **seg, size_t *seg_len)
{
    size_t len = seg_size(ring_size);
    void *p;
    int fd, status;

    fd = memfd_create("conflux-shm-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return cfx__err(cfx__status_from_errno(errno), "shm: memfd_create: %s",
                        strerror(errno));
    if (ftruncate(fd, (off_t)len) < 0) {
        status = cfx__err(CFX_ERR_NOMEM, "shm: cannot size a %zu-byte ring segment: %s",
                          len, strerror(errno));
        goto err_close_fd;
    }
    /* The acceptor maps it too: nobody may shrink it under a mapping (SIGBUS). */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        status = cfx__err(cfx__status_from_errno(errno), "shm: cannot seal the ring segment: %s",
                          strerror(errno));
        goto err_close_fd;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        status = cfx__err(CFX_ERR_NOMEM, "shm: cannot map a %zu-byte ring segment: %s",
                          len, strerror(errno));
        goto err_close_fd;
    }
    struct cfx__shm_seg_hdr *h = p;
    h->magic = CFX_SHM_MAGIC;
    h->version = CFX_SHM_VERSION;
    h->ring_size = ring_size;
    for (int i = 0; i < 2; i++) {
        atomic_init(&h->ctl[i].head, 0);
        atomic_init(&h->ctl[i].tail, 0);
        atomic_init(&h->ctl[i].consumer_sleeping, 0);
        atomic_init(&h->ctl[i].producer_waiting, 0);
    }
    *seg = p;
    *seg_len = len;
    return fd;

err_close_fd:
    close(fd);
    return status;
}

int cfx__shm_seg_attach(int fd, uint64_t ring_size, void **seg, size_t *seg_len)
{
    size_t len;
    struct stat st;
    void *p;
    int seals;

    if (ring_size < CFX_SHM_RING_MIN || ring_size > CFX_SHM_RING_MAX ||
        (ring_size & (ring_size - 1)))
        return cfx__err(CFX_ERR_PROTO, "shm: peer offered a ring of %llu bytes",
                        (unsigned long long)ring_size);
    len = seg_size(ring_size);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != len)
        return cfx__err(CFX_ERR_PROTO, "shm: peer's ring segment is not %zu bytes", len);
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return cfx__err(CFX_ERR_PROTO, "shm: peer's ring segment is not sealed");
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED)
        return cfx__err(CFX_ERR_NOMEM, "shm: cannot map the peer's ring segment: %s",
                        strerror(errno));
    struct cfx__shm_seg_hdr *h = p;
    if (h->magic != CFX_SHM_MAGIC || h->version != CFX_SHM_VERSION ||
        h->ring_size != ring_size) {
        munmap(p, len);
        return cfx__err(CFX_ERR_PROTO, "shm: peer's ring segment has a bad header");
    }
    /* Both rings start empty at position 0: our ring views take their
     * starting positions from here, and a position the peer chose (near
     * the end, unaligned) would make our first write run past the ring. */
    for (int r = 0; r < 2; r++) {
        uint64_t head = atomic_load_explicit(&h->ctl[r].head, memory_order_acquire);
        uint64_t tail = atomic_load_explicit(&h->ctl[r].tail, memory_order_acquire);
        if (head != 0 || tail != 0) {
            munmap(p, len);
            return cfx__err(CFX_ERR_PROTO, "shm: peer's ring segment does not start empty "
                            "(ring %d at %llu/%llu)", r, (unsigned long long)head,
                            (unsigned long long)tail);
        }
    }
    *seg = p;
    *seg_len = len;
    return CFX_OK;
}

/*
 * shm registrations and the receiver's cache of mapped peer source regions.
 *
 * A registration is a slot in the iface table.  It takes no remote write
 * until it is granted (tpbase.h, "registrations and write grants checked in
 * software").  Every write, staged or one-copy, is
 * checked against the grant (key, writer, bounds) before its first byte
 * lands, and by the receiver: its memory is written by no one else.
 *
 * One copy, read by the receiver.  When a write's SOURCE sits in a file
 * the writer registered (mem->file_fd: the engine's memfd arena, sealed
 * against shrinking), the writer sends a WPULL naming that file as it sees
 * it (fd number, inode, offset) with the destination key, grant, offset and
 * length.  The receiver checks the grant, opens /proc/<writer pid>/fd/<fd>
 * read-only, checks inode and seals, maps the region PROT_READ (cached
 * here, per endpoint), copies into the granted registration in steps
 * budgeted per progress call, and answers in the ring's control block;
 * only then does the writer's write complete and its source become
 * reusable.  The opposite direction (the writer mapping the receiver's
 * arena writable and copying into it, then reporting) was what this
 * replaced: it let bytes land before the grant was checked.  Costs are the
 * same: one memcpy, the file mapped once per endpoint; the copy now runs
 * on the receiver's thread, and the writer waits one ring round trip per
 * write.  A grant therefore names no file: a peer never learns where the
 * granted memory lives, and no peer opens an arena file writable (same user
 * only: such a process could still write /proc/<pid>/mem).  Anything that
 * stops the receiver from mapping the source (another pid namespace,
 * permissions, a closed fd) is answered "no" to the first pull and the
 * writer stages that write and every later one on the endpoint; a "no"
 * after the peer read sources of ours fails the endpoint (the writer has
 * pulls in flight behind it by then, which must not land out of order).
 * A source file not sealed against shrinking is never offered.
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataplane/common/log.h"

/* A file its owner cannot shrink under a reader's copy (SIGBUS). */
static bool file_sealed(int fd)
{
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & F_SEAL_SHRINK);
}

int cfx__shm_mem_reg(struct cfx_tp_iface *tpi, const struct cfx_tp_mem_desc *mem,
                     unsigned access, struct cfx_tp_mr **out)
{
    CFX_TP_THREAD_CHECK(tpi);
    struct cfx__shm_mr *mr;
    struct cfx_tp_mr base;
    struct stat st;
    uint32_t idx;
    int rc;

    if (!out)
        return cfx__err(CFX_ERR_INVALID, "shm mem_reg: NULL argument");
    if ((rc = cfx__tp_host_reg("shm", tpi, mem, access, &base)) != CFX_OK)
        return rc;
    mr = calloc(1, sizeof(*mr));
    if (!mr)
        return cfx__err(CFX_ERR_NOMEM, "shm mem_reg: out of memory for a registration");
    mr->super = base;
    mr->shm_fd = -1;
    /* a source the receiver may read from (one copy): only a file sealed
     * against shrinking (the receiver checks too), else its writes stage */
    if (mem->file_fd >= 0 && fstat(mem->file_fd, &st) == 0 && S_ISREG(st.st_mode) &&
        mem->file_off <= (uint64_t)st.st_size && mem->len <= (uint64_t)st.st_size - mem->file_off &&
        file_sealed(mem->file_fd)) {
        mr->shm_fd = mem->file_fd;
        mr->shm_off = mem->file_off;
        mr->ino = st.st_ino;
    }
    if ((rc = cfx__tp_table_add(&cfx__shm_iface_of(tpi)->mrs, mr, &idx, NULL)) != CFX_OK) {
        free(mr);
        return rc;
    }
    mr->key = idx;
    *out = &mr->super;
    return CFX_OK;
}

void cfx__shm_mem_dereg(struct cfx_tp_mr *tpm)
{
    CFX_TP_THREAD_CHECK(tpm ? tpm->iface : NULL);
    struct cfx__shm_iface *iface;
    struct cfx__shm_mr *mr;
    uint32_t idx;

    if (!tpm)
        return;
    mr = cfx__shm_mr_of(tpm);
    iface = cfx__shm_iface_of(tpm->iface);
    idx = mr->key & 0xffffu;
    cfx__tp_grant_end(&mr->grant, &iface->revoked);
    cfx__tp_table_remove(&iface->mrs, idx);
    free(mr);
}

int cfx__shm_mr_grant(struct cfx_tp_mr *tpm, struct cfx_tp_ep *tpe, struct cfx_tp_rdesc *out)
{
    CFX_TP_THREAD_CHECK(tpm ? tpm->iface : NULL);
    struct cfx__shm_rdesc rd;
    int rc = cfx__tp_grant_args("shm", tpm, tpe, out);
    if (rc != CFX_OK)
        return rc;
    struct cfx__shm_mr *mr = cfx__shm_mr_of(tpm);
    struct cfx__shm_iface *iface = cfx__shm_iface_of(tpm->iface);
    cfx__tp_grant_new(&mr->grant, &iface->revoked, &iface->keys,
                      tpe ? cfx__shm_ep_of(tpe)->serial : 0);
    memset(&rd, 0, sizeof(rd));
    rd.grant = mr->grant.key;
    rd.tag = CFX_SHM_RDESC_TAG;
    rd.key = mr->key;
    rd.len = mr->super.len;
    rd.pid = iface->pid;
    rd.fd = -1; /* the receiver copies: a writer needs no way to its file */
    memset(out, 0, sizeof(*out));
    out->len = sizeof(rd);
    memcpy(out->data, &rd, sizeof(rd));
    return CFX_OK;
}

void cfx__shm_mr_revoke(struct cfx_tp_mr *tpm)
{
    CFX_TP_THREAD_CHECK(tpm ? tpm->iface : NULL);
    if (!tpm)
        return;
    cfx__tp_grant_end(&cfx__shm_mr_of(tpm)->grant, &cfx__shm_iface_of(tpm->iface)->revoked);
}

int cfx__shm_mr_pack(struct cfx_tp_mr *tpm, struct cfx_tp_rdesc *out)
{
    if (!tpm || !out)
        return cfx__err(CFX_ERR_INVALID, "shm mr_pack: NULL argument");
    if (!(tpm->access & CFX_TP_ACCESS_REMOTE_WRITE)) {
        /* described all the same; its key matches nothing */
        struct cfx__shm_rdesc rd = {
            .tag = CFX_SHM_RDESC_TAG, .key = cfx__shm_mr_of(tpm)->key, .len = tpm->len, .fd = -1
        };
        memset(out, 0, sizeof(*out));
        out->len = sizeof(rd);
        memcpy(out->data, &rd, sizeof(rd));
        return CFX_OK;
    }
    return cfx__shm_mr_grant(tpm, NULL, out);
}

struct cfx__shm_mr *cfx__shm_mr_lookup(struct cfx__shm_iface *iface, const struct cfx__shm_ep *ep,
                                       uint32_t key, uint64_t grant, uint64_t off, uint64_t len,
                                       const char **why)
{
    struct cfx__shm_mr *mr = cfx__tp_table_at(&iface->mrs, key);
    const char *no = cfx__tp_grant_refuses(mr ? &mr->grant : NULL, mr ? mr->super.len : 0,
                                           grant, ep->serial, off, len);
    if (unlikely(no)) {
        *why = no;
        return NULL;
    }
    return mr;
}

void cfx__shm_mr_table_free(struct cfx__shm_iface *iface)
{
    for (uint32_t i = 0; i < iface->mrs.cap; i++)
        free(cfx__tp_table_at(&iface->mrs, i));
    cfx__tp_table_fini(&iface->mrs);
}

/* ---- mapped peer source regions ------------------------------------------------------ */

static void map_drop(struct cfx__shm_ep *ep, struct cfx__shm_map *m)
{
    if (m->base) {
        munmap(m->base, m->map_len);
        ep->map_bytes -= m->map_len;
    }
    memset(m, 0, sizeof(*m));
}

/* A mapping keeps the peer's pages alive even after the peer let them go:
 * drop idle ones, oldest first, until @p more bytes fit under the bound. */
static void map_trim(struct cfx__shm_ep *ep, uint64_t more)
{
    while (ep->map_bytes + more > CFX_SHM_MAP_BYTES) {
        struct cfx__shm_map *old = NULL;
        for (int i = 0; i < CFX_SHM_MAP_CACHE; i++) {
            struct cfx__shm_map *m = &ep->maps[i];
            if (m->base && !m->refs && (!old || m->last_use < old->last_use))
                old = m;
        }
        if (!old)
            return;
        map_drop(ep, old);
    }
}

static int map_open(struct cfx__shm_ep *ep, const struct cfx__shm_rdesc *rd,
                    struct cfx__shm_map *m)
{
    char path[64];
    struct stat st;
    long page = sysconf(_SC_PAGESIZE);
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)rd->pid, (int)rd->fd);
    /* read-only: the writer's memory is the writer's, ours is ours */
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == EACCES || errno == EPERM) {
            /* cannot reach this peer's files at all: refuse its pulls from now on */
            ep->direct_off = true;
            CFX_LOG(INFO, SHM, "node %u: cannot open %s of %s (%s): its writes are staged",
                    ep->iface->super.node_id, path, ep->super.peer_name, strerror(errno));
        }
        return CFX_ERR_NOT_FOUND;
    }
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_ino != rd->ino || !S_ISREG(st.st_mode) ||
        rd->off > (uint64_t)st.st_size || rd->len > (uint64_t)st.st_size - rd->off) {
        close(fd);
        return CFX_ERR_NOT_FOUND;
    }
    /* a file its owner can shrink under our copy would fault it (SIGBUS):
     * we read only from files sealed against shrinking */
    if (!file_sealed(fd)) {
        close(fd);
        return CFX_ERR_NOT_FOUND; /* staged instead */
    }
    uint64_t moff = rd->off & ~(uint64_t)(page - 1);
    size_t mlen = (size_t)((rd->off - moff + rd->len + (uint64_t)page - 1) & ~(uint64_t)(page - 1));
    /* MAP_POPULATE: no page faults in the copy that follows */
    map_trim(ep, mlen);
    void *p = mmap(NULL, mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)moff);
    close(fd);
    if (p == MAP_FAILED)
        return CFX_ERR_NOMEM;
    m->ino = rd->ino;
    m->off = rd->off;
    m->len = rd->len;
    m->base = p;
    m->map_len = mlen;
    ep->map_bytes += mlen;
    m->region = (uint8_t *)p + (rd->off - moff);
    m->refs = 0;
    return CFX_OK;
}

struct cfx__shm_map *cfx__shm_map_get(struct cfx__shm_ep *ep, const struct cfx__shm_rdesc *rd)
{
    struct cfx__shm_map *victim = NULL;

    if (!rd->direct || ep->direct_off || rd->pid <= 0 || rd->pid != ep->peer_pid)
        return NULL;
    for (int i = 0; i < CFX_SHM_MAP_CACHE; i++) {
        struct cfx__shm_map *m = &ep->maps[i];
        if (m->ino == rd->ino && m->off == rd->off && m->len >= rd->len && m->base) {
            m->last_use = ++ep->map_clock;
            m->refs++;
            return m;
        }
        if (!m->base) {
            if (!victim || victim->base)
                victim = m;
        } else if (!m->refs && (!victim || (victim->base && m->last_use < victim->last_use))) {
            victim = m;
        }
    }
    if (!victim)
        return NULL; /* every mapping is busy: stage this one */
    map_drop(ep, victim);
    if (map_open(ep, rd, victim) != CFX_OK)
        return NULL;
    victim->last_use = ++ep->map_clock;
    victim->refs = 1;
    return victim;
}

void cfx__shm_map_put(struct cfx__shm_map *map)
{
    map->refs--;
}

void cfx__shm_map_flush(struct cfx__shm_ep *ep)
{
    for (int i = 0; i < CFX_SHM_MAP_CACHE; i++)
        map_drop(ep, &ep->maps[i]);
}

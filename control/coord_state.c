/*
 * Coordinator durable state: a small versioned key-value record store in a
 * state directory (--state-dir), for what must survive a coordinator restart
 * (kill -9 included): the node id high-water mark, durable inline objects
 * (group bootstrap records, coord_directory.c), shard maps as they arrive.
 * Soft state (members, the rest of the object directory) is not kept:
 * clients re-announce it when they reconnect.
 *
 * One file per record, DIR/<key>.rec:
 *
 *   "CFXSTAT1"  u64 version  u32 key_len  u32 val_len  key  value  u64 FNV-1a
 *
 * (little endian; the checksum covers everything before it).  A put writes
 * DIR/<key>.tmp, fsyncs it, renames it over the record and fsyncs the
 * directory, so a crash leaves the old record or the new one, never a torn
 * one.  Records are loaded into memory at start; reads never touch the disk.
 * Every fsync is checked: a put or delete whose fsync failed fails (the
 * caller answers an error, never OK).  The directory must belong to the
 * coordinator's user and be writable by nobody else (whoever can write it
 * can change cluster state); records are opened with O_NOFOLLOW.
 * Loop thread only (like everything in coord_int.h).
 */
#include "control/coord_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"

#define STATE_MAGIC   "CFXSTAT1"
#define STATE_HDR_LEN (8 + 8 + 4 + 4)

struct coord_record {
    struct cfx_list link;        /* co->records */
    char key[COORD_STATE_KEY_MAX + 1];
    uint64_t version;            /* bumped by every put, starts at 1 */
    size_t len;
    uint8_t *val;
};

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int key_ok(const char *key)
{
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > COORD_STATE_KEY_MAX || key[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = key[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static struct coord_record *rec_find(struct cfx_coord *co, const char *key)
{
    struct cfx_list *pos;
    cfx_list_for_each(pos, &co->records) {
        struct coord_record *r = cfx_list_entry(pos, struct coord_record, link);
        if (!strcmp(r->key, key))
            return r;
    }
    return NULL;
}

/* Parse one record file's bytes; CFX_OK with *out allocated. */
static int rec_parse(const char *name, const uint8_t *buf, size_t len, struct coord_record **out)
{
    if (len < STATE_HDR_LEN + 8 || memcmp(buf, STATE_MAGIC, 8))
        return CFX_ERR_PROTO;
    uint64_t version = cfx__coord_get_le(buf + 8, 8);
    uint32_t klen = (uint32_t)cfx__coord_get_le(buf + 16, 4);
    uint32_t vlen = (uint32_t)cfx__coord_get_le(buf + 20, 4);
    if (klen == 0 || klen > COORD_STATE_KEY_MAX || vlen > COORD_STATE_VAL_MAX ||
        (uint64_t)STATE_HDR_LEN + klen + vlen + 8 != len)
        return CFX_ERR_PROTO;
    if (fnv1a(buf, len - 8) != cfx__coord_get_le(buf + len - 8, 8))
        return CFX_ERR_PROTO;
    struct coord_record *r = calloc(1, sizeof(*r));
    if (!r)
        return CFX_ERR_NOMEM;
    memcpy(r->key, buf + STATE_HDR_LEN, klen);
    r->key[klen] = '\0';
    size_t nlen = strlen(name);
    if (!key_ok(r->key) || nlen != klen + 4 || strncmp(name, r->key, klen)) {
        free(r);
        return CFX_ERR_PROTO;
    }
    r->version = version;
    r->len = vlen;
    r->val = malloc(vlen ? vlen : 1);
    if (!r->val) {
        free(r);
        return CFX_ERR_NOMEM;
    }
    memcpy(r->val, buf + STATE_HDR_LEN + klen, vlen);
    *out = r;
    return CFX_OK;
}

/* fsync, slowed by the test hook that emulates a slow disk. */
static int state_fsync(struct cfx_coord *co, int fd)
{
    int rc = fsync(fd);
    if (co->test_fsync_delay_ms) {
        int e = errno;
        struct timespec ts = { .tv_sec = co->test_fsync_delay_ms / 1000,
                               .tv_nsec = (long)(co->test_fsync_delay_ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        errno = e;
    }
    return rc;
}

static int read_file(int dirfd, const char *name, uint8_t **buf, size_t *len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0)
        return cfx__status_from_errno(errno);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)COORD_STATE_VAL_MAX + 4096) {
        close(fd);
        return CFX_ERR_PROTO;
    }
    uint8_t *p = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    if (!p) {
        close(fd);
        return CFX_ERR_NOMEM;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, p + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    *buf = p;
    *len = got;
    return CFX_OK;
}

int cfx__coord_state_open(struct cfx_coord *co, const char *dir)
{
    cfx_list_init(&co->records);
    co->state_dirfd = -1;
    if (!dir || !*dir)
        return CFX_OK;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return cfx__err(cfx__status_from_errno(errno), "coordinator state directory %s: %s",
                        dir, strerror(errno));
    co->state_dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (co->state_dirfd < 0) {
        int e = errno;
        /* ENOTDIR: a file, or a symbolic link (O_NOFOLLOW) */
        bool link = e == ELOOP || (e == ENOTDIR && lstat(dir, &st) == 0 && S_ISLNK(st.st_mode));
        return cfx__err(cfx__status_from_errno(e), "coordinator state directory %s: %s",
                        dir, link ? "a symbolic link is refused" : strerror(e));
    }
    if (fstat(co->state_dirfd, &st) < 0)
        return cfx__err(cfx__status_from_errno(errno), "coordinator state directory %s: %s",
                        dir, strerror(errno));
    if (st.st_uid != geteuid())
        return cfx__err(CFX_ERR_AUTH, "coordinator state directory %s belongs to uid %u, not "
                        "to us (uid %u): refusing it", dir, (unsigned)st.st_uid,
                        (unsigned)geteuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return cfx__err(CFX_ERR_AUTH, "coordinator state directory %s is writable by others "
                        "(mode %03o): refusing it (chmod go-w)", dir,
                        (unsigned)(st.st_mode & 0777));
    /* one coordinator per directory: two would hand out the same node ids
     * and overwrite each other's records.  The lock is the open directory's
     * own, so it goes with the process, however it ends (a kill -9 leaves
     * nothing to clean up before a restart) */
    if (flock(co->state_dirfd, LOCK_EX | LOCK_NB) < 0)
        return errno == EWOULDBLOCK
                   ? cfx__err(CFX_ERR_BUSY, "coordinator state directory %s is in use by "
                              "another coordinator: refusing it", dir)
                   : cfx__err(cfx__status_from_errno(errno), "cannot lock the coordinator "
                              "state directory %s: %s", dir, strerror(errno));
    snprintf(co->state_dir, sizeof(co->state_dir), "%s", dir);

    int dfd = dup(co->state_dirfd);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return cfx__err(CFX_ERR_IO, "cannot list the state directory %s: %s", dir,
                        strerror(errno));
    }
    unsigned loaded = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".tmp")) {
            unlinkat(co->state_dirfd, e->d_name, 0); /* a put cut short by a crash */
            continue;
        }
        if (n <= 4 || strcmp(e->d_name + n - 4, ".rec"))
            continue;
        uint8_t *buf = NULL;
        size_t len = 0;
        struct coord_record *r = NULL;
        int rc = read_file(co->state_dirfd, e->d_name, &buf, &len);
        if (rc == CFX_OK)
            rc = rec_parse(e->d_name, buf, len, &r);
        free(buf);
        if (rc != CFX_OK) {
            CFX_LOG(ERR, CTL, "state %s/%s is unreadable or corrupt (%s); ignoring it", dir,
                    e->d_name, cfx_errname(rc));
            continue;
        }
        cfx_list_add_tail(&r->link, &co->records);
        loaded++;
    }
    closedir(d);
    CFX_LOG(INFO, CTL, "coordinator state: %u record%s loaded from %s", loaded,
            loaded == 1 ? "" : "s", dir);
    return CFX_OK;
}

void cfx__coord_state_close(struct cfx_coord *co)
{
    struct cfx_list *pos, *tmp;
    if (!co->records.next)
        return;
    cfx_list_for_each_safe(pos, tmp, &co->records) {
        struct coord_record *r = cfx_list_entry(pos, struct coord_record, link);
        cfx_list_del(&r->link);
        free(r->val);
        free(r);
    }
    if (co->state_dirfd >= 0)
        close(co->state_dirfd);
    co->state_dirfd = -1;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write @p r to DIR/<key>.rec atomically and durably. */
static int rec_store(struct cfx_coord *co, const char *key, uint64_t version, const void *val,
                     size_t len)
{
    char tmp[COORD_STATE_KEY_MAX + 8], name[COORD_STATE_KEY_MAX + 8];
    size_t klen = strlen(key), total = STATE_HDR_LEN + klen + len + 8;
    uint8_t *buf = malloc(total);
    int fd = -1, rc;

    if (!buf)
        return cfx__err(CFX_ERR_NOMEM, "no memory to store state record %s", key);
    memcpy(buf, STATE_MAGIC, 8);
    cfx__coord_put_le(buf + 8, version, 8);
    cfx__coord_put_le(buf + 16, klen, 4);
    cfx__coord_put_le(buf + 20, len, 4);
    memcpy(buf + STATE_HDR_LEN, key, klen);
    if (len)
        memcpy(buf + STATE_HDR_LEN + klen, val, len);
    cfx__coord_put_le(buf + total - 8, fnv1a(buf, total - 8), 8);

    snprintf(tmp, sizeof(tmp), "%s.tmp", key);
    snprintf(name, sizeof(name), "%s.rec", key);
    fd = openat(co->state_dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                0600);
    if (fd < 0 || write_all(fd, buf, total) < 0 || state_fsync(co, fd) < 0) {
        rc = cfx__err(CFX_ERR_IO, "cannot write state record %s/%s: %s", co->state_dir, tmp,
                      strerror(errno));
        goto err;
    }
    if (close(fd) < 0) {
        fd = -1;
        rc = cfx__err(CFX_ERR_IO, "cannot write state record %s/%s: %s", co->state_dir, tmp,
                      strerror(errno));
        goto err;
    }
    fd = -1;
    if (renameat(co->state_dirfd, tmp, co->state_dirfd, name) < 0) {
        rc = cfx__err(CFX_ERR_IO, "cannot rename state record %s/%s: %s", co->state_dir, tmp,
                      strerror(errno));
        goto err;
    }
    /* the rename itself must survive a crash: not acknowledged before */
    if (state_fsync(co, co->state_dirfd) < 0) {
        rc = cfx__err(CFX_ERR_IO, "cannot sync state directory %s after writing %s: %s",
                      co->state_dir, name, strerror(errno));
        free(buf);
        CFX_LOG(ERR, CTL, "%s", cfx_last_error());
        return rc;
    }
    free(buf);
    co->state_writes++;
    return CFX_OK;

err:
    if (fd >= 0)
        close(fd);
    unlinkat(co->state_dirfd, tmp, 0);
    free(buf);
    CFX_LOG(ERR, CTL, "%s", cfx_last_error());
    return rc;
}

int cfx__coord_state_put(struct cfx_coord *co, const char *key, const void *val, size_t len,
                         uint64_t *version)
{
    if (!key_ok(key))
        return cfx__err(CFX_ERR_INVALID, "bad state record key (1..%d of [A-Za-z0-9._-])",
                        COORD_STATE_KEY_MAX);
    if (len > COORD_STATE_VAL_MAX || (len && !val))
        return cfx__err(CFX_ERR_TOO_BIG, "state record %s of %zu bytes (at most %u)", key, len,
                        COORD_STATE_VAL_MAX);
    struct coord_record *r = rec_find(co, key);
    uint64_t v = r ? r->version + 1 : 1;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return cfx__err(CFX_ERR_NOMEM, "no memory for state record %s", key);
    if (len)
        memcpy(copy, val, len);
    if (co->state_dirfd >= 0) {
        int rc = rec_store(co, key, v, val, len);
        if (rc != CFX_OK) {
            free(copy);
            return rc;
        }
    }
    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r) {
            free(copy);
            return cfx__err(CFX_ERR_NOMEM, "no memory for state record %s", key);
        }
        snprintf(r->key, sizeof(r->key), "%s", key);
        cfx_list_add_tail(&r->link, &co->records);
    }
    free(r->val);
    r->val = copy;
    r->len = len;
    r->version = v;
    if (version)
        *version = v;
    return CFX_OK;
}

int cfx__coord_state_get(struct cfx_coord *co, const char *key, void **val, size_t *len,
                         uint64_t *version)
{
    struct coord_record *r = key_ok(key) ? rec_find(co, key) : NULL;
    if (!r)
        return CFX_ERR_NOT_FOUND;
    if (val) {
        *val = malloc(r->len ? r->len : 1);
        if (!*val)
            return cfx__err(CFX_ERR_NOMEM, "no memory for state record %s", key);
        memcpy(*val, r->val, r->len);
    }
    if (len)
        *len = r->len;
    if (version)
        *version = r->version;
    return CFX_OK;
}

int cfx__coord_state_del(struct cfx_coord *co, const char *key, bool sync)
{
    char name[COORD_STATE_KEY_MAX + 8];
    struct coord_record *r = key_ok(key) ? rec_find(co, key) : NULL;
    if (!r)
        return CFX_ERR_NOT_FOUND;
    if (co->state_dirfd >= 0) {
        snprintf(name, sizeof(name), "%s.rec", key);
        if (unlinkat(co->state_dirfd, name, 0) < 0 && errno != ENOENT)
            return cfx__err(CFX_ERR_IO, "cannot remove state record %s/%s: %s", co->state_dir,
                            name, strerror(errno));
        co->state_writes++;
        if (sync && state_fsync(co, co->state_dirfd) < 0)
            return cfx__err(CFX_ERR_IO, "cannot sync state directory %s after removing %s: %s",
                            co->state_dir, name, strerror(errno));
    }
    cfx_list_del(&r->link);
    free(r->val);
    free(r);
    return CFX_OK;
}

void cfx__coord_state_foreach(struct cfx_coord *co, const char *prefix,
                              void (*fn)(void *arg, const char *key, const void *val,
                                         size_t len),
                              void *arg)
{
    struct cfx_list *pos;
    size_t n = strlen(prefix);
    if (!co->records.next)
        return;
    cfx_list_for_each(pos, &co->records) {
        struct coord_record *r = cfx_list_entry(pos, struct coord_record, link);
        if (!strncmp(r->key, prefix, n))
            fn(arg, r->key, r->val, r->len);
    }
}

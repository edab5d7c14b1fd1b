/*
 * libFuzzer target: the coordinator's state-directory loader
 * (cfx__coord_state_open), which reads back every DIR/<key>.rec a restart
 * finds: "CFXSTAT1", u64 version, u32 key_len, u32 val_len, key, value,
 * u64 FNV-1a (coord_state.c).  The directory is the coordinator's own, but a
 * record may be torn, corrupt or from another version: whatever its bytes,
 * loading must not crash, and a record that loads has a valid key that its
 * file name names and exactly the value its header says.
 *
 * Input: one byte of mode (bit 0: the file is named after the record's own
 * key bytes, else "fuzz.rec"; bit 1: a stale "fuzz.tmp" lies beside it, as a
 * put cut short by a crash leaves), then the file's bytes.  Each input is
 * written to a directory of the fuzzer's own and loaded from there.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/coord_int.h"
#include "dataplane/common/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REC_KEY_OFF 24 /* "CFXSTAT1", u64 version, u32 key_len, u32 val_len */

static char dir[64];

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void remove_dir(void)
{
    rmdir(dir); /* every input's files are gone already */
}

static void write_file(const char *name, const uint8_t *data, size_t size)
{
    char path[sizeof(dir) + 128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        abort();
    while (size) {
        ssize_t w = write(fd, data, size);
        if (w <= 0)
            abort();
        data += w;
        size -= (size_t)w;
    }
    close(fd);
}

struct seen {
    size_t n;     /* records met */
    uint64_t sum; /* of their bytes: every one is read */
};

static void each(void *arg, const char *key, const void *val, size_t len)
{
    struct seen *s = arg;
    if (!key[0] || strlen(key) > COORD_STATE_KEY_MAX)
        abort();
    for (size_t i = 0; i < len; i++)
        s->sum += ((const uint8_t *)val)[i];
    s->n++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char name[128] = "fuzz.rec";
    struct cfx_coord *co;

    if (!dir[0]) {
        cfx__log_level = -1; /* a corrupt record is logged: not a finding */
        snprintf(dir, sizeof(dir), "/tmp/cfx-fuzz-state-XXXXXX");
        if (!mkdtemp(dir))
            abort();
        atexit(remove_dir);
    }
    if (size < 1)
        return 0;
    bool own_name = data[0] & 1, stale = data[0] & 2;
    data++;
    size--;
    if (own_name && size > REC_KEY_OFF) {
        /* the record's key_len key bytes as a file name (not a path, no NUL) */
        size_t n = size - REC_KEY_OFF, klen = le32(data + REC_KEY_OFF - 8), i;
        n = n < klen ? n : klen;
        n = n < sizeof(name) - 5 ? n : sizeof(name) - 5;
        for (i = 0; i < n; i++) {
            char c = (char)data[REC_KEY_OFF + i];
            name[i] = c == '/' || c == '\0' ? '_' : c;
        }
        memcpy(name + i, ".rec", 5);
    }
    write_file(name, data, size);
    if (stale)
        write_file("fuzz.tmp", data, size);

    co = calloc(1, sizeof(*co));
    if (!co)
        abort();
    int rc = cfx__coord_state_open(co, dir);
    if (rc != CFX_OK)
        abort(); /* the directory is fine: only records may be bad */
    struct seen s = { 0 };
    cfx__coord_state_foreach(co, "", each, &s);
    if (s.n > 1)
        abort(); /* one file, at most one record */
    if (s.n == 1) {
        /* it loaded: its key is the file name without ".rec" */
        size_t nl = strlen(name);
        void *val = NULL;
        size_t len = 0;
        uint64_t version = 0;
        name[nl - 4] = '\0';
        if (cfx__coord_state_get(co, name, &val, &len, &version) != CFX_OK)
            abort();
        if (len != le32(data + REC_KEY_OFF - 4) || version != le64(data + 8))
            abort(); /* the value and version its header says */
        free(val);
        name[nl - 4] = '.';
    }
    cfx__coord_state_close(co);
    free(co);

    char path[sizeof(dir) + 128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    unlink(path);
    snprintf(path, sizeof(path), "%s/fuzz.tmp", dir);
    if (stale && access(path, F_OK) == 0)
        abort(); /* the loader removes a put cut short */
    return 0;
}

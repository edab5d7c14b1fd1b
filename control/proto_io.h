/*
 * Bounds-checked little-endian writer and reader shared by the control-plane
 * codecs (proto.c, proto_task.c).  The writer counts always and stores only
 * while there is room; the reader's first failure sticks.
 */
#ifndef CFX_CONTROL_PROTO_IO_H
#define CFX_CONTROL_PROTO_IO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <conflux/status.h>

#include "dataplane/common/util.h"

/* ------------------------------------------------------------------------ */
/* Writer: counts always, stores only while there is room.                  */

struct wr {
    uint8_t *p;     /* NULL: count only */
    size_t cap;
    size_t off;
};

static inline void wr_bytes(struct wr *w, const void *src, size_t n)
{
    if (w->p && w->off + n <= w->cap && n)
        memcpy(w->p + w->off, src, n);
    w->off += n;
}

static inline void wr_zero(struct wr *w, size_t n)
{
    if (w->p && w->off + n <= w->cap && n)
        memset(w->p + w->off, 0, n);
    w->off += n;
}

static inline void wr_u8(struct wr *w, uint8_t v) { wr_bytes(w, &v, 1); }

static inline void wr_u16(struct wr *w, uint16_t v)
{
    uint8_t b[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
    wr_bytes(w, b, 2);
}

static inline void wr_u32(struct wr *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    wr_bytes(w, b, 4);
}

static inline void wr_u64(struct wr *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    wr_bytes(w, b, 8);
}

/* A string into a fixed field: truncated if needed, always terminated. */
static inline void wr_str(struct wr *w, const char *s, size_t field)
{
    size_t n = strnlen(s, field - 1);
    wr_bytes(w, s, n);
    wr_zero(w, field - n);
}

/* ------------------------------------------------------------------------ */
/* Reader: every get is bounds-checked; the first failure sticks.           */

struct rd {
    const uint8_t *p;
    size_t len;
    size_t off;
    int status;          /* CFX_OK until a field fails */
    const char *what;    /* message type, for error text */
};

static inline int rd_fail(struct rd *r, int status, const char *field)
{
    if (r->status == CFX_OK)
        r->status = cfx__err(status, "bad %s frame: %s", r->what, field);
    return r->status;
}

static inline const uint8_t *rd_take(struct rd *r, size_t n, const char *field)
{
    if (r->status != CFX_OK)
        return NULL;
    if (n > r->len - r->off) {
        rd_fail(r, CFX_ERR_PROTO, field);
        return NULL;
    }
    const uint8_t *q = r->p + r->off;
    r->off += n;
    return q;
}

static inline uint8_t rd_u8(struct rd *r, const char *field)
{
    const uint8_t *q = rd_take(r, 1, field);
    return q ? q[0] : 0;
}

static inline uint16_t rd_u16(struct rd *r, const char *field)
{
    const uint8_t *q = rd_take(r, 2, field);
    return q ? (uint16_t)(q[0] | (q[1] << 8)) : 0;
}

static inline uint32_t rd_u32(struct rd *r, const char *field)
{
    const uint8_t *q = rd_take(r, 4, field);
    if (!q)
        return 0;
    return (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) |
           ((uint32_t)q[3] << 24);
}

static inline uint64_t rd_u64(struct rd *r, const char *field)
{
    const uint8_t *q = rd_take(r, 8, field);
    uint64_t v = 0;
    if (!q)
        return 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | q[i];
    return v;
}

static inline uint8_t rd_flag(struct rd *r, const char *field)
{
    uint8_t v = rd_u8(r, field);
    if (v > 1)
        rd_fail(r, CFX_ERR_PROTO, field);
    return v;
}

static inline void rd_bytes(struct rd *r, void *dst, size_t n, const char *field)
{
    const uint8_t *q = rd_take(r, n, field);
    if (q)
        memcpy(dst, q, n);
    else
        memset(dst, 0, n);
}

/* A fixed string field; it must hold a NUL. */
static inline void rd_str(struct rd *r, char *dst, size_t field, const char *name)
{
    const uint8_t *q = rd_take(r, field, name);
    if (!q) {
        dst[0] = '\0';
        return;
    }
    if (!memchr(q, 0, field)) {
        rd_fail(r, CFX_ERR_PROTO, name);
        dst[0] = '\0';
        return;
    }
    memcpy(dst, q, field);
}

#endif

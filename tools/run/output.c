/*
 * cfx_run: the ranks' output, line by line, each line prefixed with its
 * rank and written whole.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

static void write_out(struct run *r, int fd, const char *p, size_t len)
{
    while (len && !r->out_dead[fd]) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            /* EPIPE (e.g. `| head`) or worse: keep running, drop output. */
            r->out_dead[fd] = true;
            return;
        }
        p += n;
        len -= (size_t)n;
    }
}

static int obuf_reserve(struct run *r, size_t need)
{
    if (need <= r->ocap)
        return 0;
    size_t cap = r->ocap ? r->ocap : RUN_LINE_INIT;
    while (cap < need)
        cap *= 2;
    char *p = realloc(r->obuf, cap);
    if (!p)
        return -1;
    r->obuf = p;
    r->ocap = cap;
    return 0;
}

/*
 * Emit the complete lines in @p st's buffer, each with the rank's prefix,
 * in one write; keep the unfinished tail.  With @p all, the tail is emitted
 * too (newline added): at end of file, or when one line outgrew RUN_LINE_MAX.
 */
static void emit_lines(struct run *r, struct run_rank *rk, struct run_stream *st, bool all)
{
    size_t start = 0, olen = 0;

    while (start < st->len) {
        char *nl = memchr(st->buf + start, '\n', st->len - start);
        size_t end;
        if (nl)
            end = (size_t)(nl - st->buf) + 1;
        else if (all)
            end = st->len;
        else
            break;
        size_t linelen = end - start;
        if (obuf_reserve(r, olen + rk->prefix_len + linelen + 1) < 0) {
            /* No memory for the prefixed copy: pass the bytes through bare. */
            write_out(r, st->out_fd, r->obuf, olen);
            write_out(r, st->out_fd, st->buf + start, linelen);
            olen = 0;
            start = end;
            continue;
        }
        memcpy(r->obuf + olen, rk->prefix, rk->prefix_len);
        olen += rk->prefix_len;
        memcpy(r->obuf + olen, st->buf + start, linelen);
        olen += linelen;
        if (st->buf[end - 1] != '\n')
            r->obuf[olen++] = '\n';
        start = end;
    }
    write_out(r, st->out_fd, r->obuf, olen);
    if (start) { /* else nothing was taken (and buf may be NULL: no memmove of it) */
        memmove(st->buf, st->buf + start, st->len - start);
        st->len -= start;
    }
}

void cfx__run_stream_close(struct run *r, struct run_rank *rk, struct run_stream *st)
{
    emit_lines(r, rk, st, true);
    close(st->fd);
    st->fd = -1;
}

/* Read what is available on @p st; close it on end of file. */
void cfx__run_stream_read(struct run *r, struct run_rank *rk, struct run_stream *st)
{
    for (;;) {
        if (st->len == st->cap) {
            if (st->cap >= RUN_LINE_MAX) {
                emit_lines(r, rk, st, true); /* one huge line: split it */
            } else {
                size_t cap = st->cap ? st->cap * 2 : RUN_LINE_INIT;
                char *p = realloc(st->buf, cap);
                if (!p) {
                    emit_lines(r, rk, st, true);
                } else {
                    st->buf = p;
                    st->cap = cap;
                }
            }
            if (st->len == st->cap)
                return; /* nothing freed; try again on the next poll */
        }
        ssize_t n = read(st->fd, st->buf + st->len, st->cap - st->len);
        if (n > 0) {
            st->len += (size_t)n;
            emit_lines(r, rk, st, false);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        cfx__run_stream_close(r, rk, st); /* EOF or error */
        return;
    }
}

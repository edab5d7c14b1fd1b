/* Status strings, per-thread error detail, errno translation. */
#include <conflux/status.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

const char *cfx_strerror(int status)
{
    switch (status) {
#define CFX_STATUS_STR_(name, value, text) case (value): return text;
    CFX_STATUS_MAP(CFX_STATUS_STR_)
#undef CFX_STATUS_STR_
    default:
        return "unknown status";
    }
}

const char *cfx_errname(int status)
{
    switch (status) {
#define CFX_STATUS_NAME_(name, value, text) case (value): return "CFX_" #name;
    CFX_STATUS_MAP(CFX_STATUS_NAME_)
#undef CFX_STATUS_NAME_
    default:
        return "CFX_UNKNOWN";
    }
}

static __thread char last_error[CFX__ERR_TEXT_MAX];

const char *cfx_last_error(void)
{
    return last_error;
}

int cfx__err(int status, const char *fmt, ...)
{
    /* formatted aside first: an argument may be cfx_last_error() itself
     * (an error that wraps the one before it) */
    char buf[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    memcpy(last_error, buf, sizeof(buf));
    return status;
}

void cfx__err_clear(void)
{
    last_error[0] = '\0';
}

int cfx__status_from_errno(int err)
{
    switch (err) {
    case 0:            return CFX_OK;
    case EINVAL:       return CFX_ERR_INVALID;
    case ENOMEM:       return CFX_ERR_NOMEM;
    case ETIMEDOUT:    return CFX_ERR_TIMEOUT;
    case EADDRINUSE:   return CFX_ERR_BUSY; /* a port another process holds */
    case EAGAIN:       return CFX_ERR_AGAIN;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:  return CFX_ERR_CONNECT;
    case ECONNRESET:
    case EPIPE:        return CFX_ERR_PEER_FAILED;
    case ENOENT:       return CFX_ERR_NOT_FOUND;
    case EEXIST:       return CFX_ERR_EXISTS;
    case ENOSYS:
    case EOPNOTSUPP:   return CFX_ERR_UNSUPPORTED;
    case ENODEV:       return CFX_ERR_NO_DEVICE;
    case EBUSY:        return CFX_ERR_BUSY;
    case EMSGSIZE:
    case E2BIG:        return CFX_ERR_TOO_BIG;
    case EACCES:
    case EPERM:        return CFX_ERR_AUTH;
    case ECANCELED:    return CFX_ERR_CANCELED;
    default:           return CFX_ERR_IO;
    }
}

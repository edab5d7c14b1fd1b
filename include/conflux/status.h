/*
 * Conflux status codes.
 *
 * Every fallible call returns an int that is either CFX_OK (0) or one of the
 * negative codes below.  The table is the single source for the enum, for
 * cfx_strerror() and for cfx_errname().
 */
#ifndef CONFLUX_STATUS_H
#define CONFLUX_STATUS_H

#include <conflux/visibility.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CFX_STATUS_MAP(XX)                                                    \
    XX(OK,            0,   "success")                                         \
    XX(ERR_INVALID,   -1,  "invalid argument")                                \
    XX(ERR_NOMEM,     -2,  "out of memory")                                   \
    XX(ERR_TIMEOUT,   -3,  "timed out")                                       \
    XX(ERR_PEER_FAILED, -4, "peer failed")                                    \
    XX(ERR_NOT_FOUND, -5,  "not found")                                       \
    XX(ERR_EXISTS,    -6,  "already exists")                                  \
    XX(ERR_UNSUPPORTED, -7, "operation not supported")                        \
    XX(ERR_AUTH,      -8,  "authentication failed")                           \
    XX(ERR_PROTO,     -9,  "protocol error")                                  \
    XX(ERR_IO,        -10, "input/output error")                              \
    XX(ERR_AGAIN,     -11, "operation in progress")                           \
    XX(ERR_CONNECT,   -12, "connection failed")                               \
    XX(ERR_TOO_BIG,   -13, "message or object too large")                     \
    XX(ERR_CLOSED,    -14, "endpoint or context closed")                      \
    XX(ERR_NO_DEVICE, -15, "no such device")                                  \
    XX(ERR_BUSY,      -16, "resource busy")                                   \
    XX(ERR_TRUNCATED, -17, "buffer too small for the object")                 \
    XX(ERR_VERSION,   -18, "protocol version mismatch")                       \
    XX(ERR_MEMLOCK,   -19, "locked-memory limit too low")                     \
    XX(ERR_CANCELED,  -20, "operation canceled")                              \
    XX(ERR_NO_RESOURCE, -21, "out of a bounded resource")                     \
    XX(ERR_INTERNAL,  -22, "internal error")

enum cfx_status {
#define CFX_STATUS_ENUM_(name, value, text) CFX_##name = (value),
    CFX_STATUS_MAP(CFX_STATUS_ENUM_)
#undef CFX_STATUS_ENUM_
    CFX_STATUS_LAST = -23 /* one past the most negative code */
};

/** Human-readable text for a status; never NULL ("unknown status" if foreign). */
CFX_API const char *cfx_strerror(int status);

/** Symbolic name of a status ("CFX_ERR_TIMEOUT"); never NULL. */
CFX_API const char *cfx_errname(int status);

/**
 * Detail of the last error raised by the library on the calling thread: what
 * was waited for, on which node, and why.  Valid until the next library call
 * on this thread: every call that returns a status clears it first, so after
 * one that returned CFX_OK it is the empty string.  A non-blocking
 * operation's failure is given here by the cfx_request_test() or
 * cfx_request_wait() that returns it, on whichever thread calls it.
 */
CFX_API const char *cfx_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

/*
 * The request head of the coordinator's metrics endpoint (coord_metrics.c),
 * read from whoever connects to it: a pure function over the bytes read so
 * far, so that it can be fuzzed on its own (test/fuzz/fuzz_metrics_req.c).
 *
 * Thread safety: reentrant.
 */
#ifndef CFX_CONTROL_COORD_METRICS_REQ_H
#define CFX_CONTROL_COORD_METRICS_REQ_H

#include <stdbool.h>
#include <stddef.h>

#define CFX_METRICS_REQ_MAX 4096 /* bytes of one request head */

/* What to answer the head read so far: @p len bytes at @p req, with a NUL
 * at req[len] (a NUL inside ends what is looked at).  0 while it is not
 * complete (no blank line yet: read more), else the HTTP status: 200 for
 * GET or HEAD of /metrics (a query allowed; *head: true for HEAD), 400 for
 * a request line that does not parse, 405 for another method, 404 for
 * another path, 431 once CFX_METRICS_REQ_MAX bytes came without an end. */
int cfx__coord_metrics_req_parse(const char *req, size_t len, bool *head);

#endif

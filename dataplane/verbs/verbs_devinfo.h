/*
 * verbs transport: device listing for `rdmactl devices`.
 *
 * Only built with the verbs transport (CFX_HAVE_VERBS); callers guard their
 * use of it with that macro.
 */
#ifndef CFX_VERBS_DEVINFO_H
#define CFX_VERBS_DEVINFO_H

#include <stdio.h>

/**
 * Print every RDMA device, its ports (state, MTUs, link layer, LID) and the
 * valid GIDs of each port with their type (IB, RoCE v1, RoCE v2) and network
 * device, in the manner of `ibv_devinfo -v`; with @p json, one JSON document
 * instead.  Never writes to stdout unless @p out is stdout.
 *
 * @return CFX_OK; CFX_ERR_NO_DEVICE when there is no device (a line
 *         "no RDMA devices found: ..." is printed, or {"devices": [],
 *         "error": "..."} with @p json, and cfx_last_error() says why);
 *         CFX_ERR_INVALID for a NULL @p out.
 */
int cfx__verbs_devices_print(FILE *out, int json);

#endif

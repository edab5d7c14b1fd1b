/*
 * A control-protocol frame header written byte by byte, for tests that
 * send frames the client library would never build (truncated, absurd
 * lengths, trickled).
 */
#ifndef CFX_TEST_PROTO_BYTES_H
#define CFX_TEST_PROTO_BYTES_H

#include <stdint.h>
#include <string.h>

#include "control/proto.h"

/* The CFX_PROTO_HDR_LEN bytes of a header of @p type announcing @p len
 * payload bytes (request id 0). */
static inline void hdr_bytes(uint8_t *b, uint8_t type, uint32_t len)
{
    memset(b, 0, CFX_PROTO_HDR_LEN);
    b[0] = (uint8_t)CFX_PROTO_MAGIC;
    b[1] = (uint8_t)(CFX_PROTO_MAGIC >> 8);
    b[2] = CFX_PROTO_VERSION;
    b[3] = type;
    for (int i = 0; i < 4; i++)
        b[4 + i] = (uint8_t)(len >> (8 * i));
}

#endif

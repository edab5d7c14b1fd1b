/*
 * libFuzzer target: the request head of the coordinator's metrics endpoint
 * (cfx__coord_metrics_req_parse), which anyone who can connect to the
 * metrics address sends, unauthenticated.
 *
 * Input: the bytes the peer sends, cut into reads the way on_conn_io reads
 * them: each read is a length byte and that many bytes, into a buffer of
 * CFX_METRICS_REQ_MAX bytes and a NUL, looked at after every read until it
 * is judged.  The head must be judged by the time the buffer is full, with
 * one of the statuses the endpoint answers; 200 only for GET or HEAD of
 * /metrics (the separators of the request line are sscanf's whitespace).
 * The buffer is a heap copy of exactly what was read (and its NUL), so
 * that AddressSanitizer sees any read past it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "control/coord_metrics_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char req[CFX_METRICS_REQ_MAX + 1];
    size_t len = 0;

    while (size >= 1 && len < CFX_METRICS_REQ_MAX) {
        size_t n = data[0] ? data[0] : 1;
        data++;
        size--;
        n = n < size ? n : size;
        n = n < CFX_METRICS_REQ_MAX - len ? n : CFX_METRICS_REQ_MAX - len;
        memcpy(req + len, data, n);
        data += n;
        size -= n;
        len += n;
        req[len] = '\0';

        char *copy = malloc(len + 1);
        bool head = true;
        if (!copy)
            return 0;
        memcpy(copy, req, len + 1);
        int code = cfx__coord_metrics_req_parse(copy, len, &head);
        if (code == 200 &&
            (strncmp(copy, head ? "HEAD" : "GET", head ? 4 : 3) != 0 || !strstr(copy, "/metrics")))
            abort(); /* only GET or HEAD of /metrics is answered with them */
        if (code != 200 && head)
            abort();
        free(copy);
        if (code == 0) {
            if (len >= CFX_METRICS_REQ_MAX)
                abort(); /* a full buffer must be answered (431) */
            continue;
        }
        if (code != 200 && code != 400 && code != 404 && code != 405 && code != 431)
            abort();
        break;
    }
    return 0;
}

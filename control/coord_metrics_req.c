/* The metrics endpoint's request head (coord_metrics_req.h). */
#include "control/coord_metrics_req.h"

#include <stdio.h>
#include <string.h>

int cfx__coord_metrics_req_parse(const char *req, size_t len, bool *head)
{
    char method[8] = "", path[64] = "";

    *head = false;
    if (!strstr(req, "\r\n\r\n") && !strstr(req, "\n\n"))
        return len >= CFX_METRICS_REQ_MAX ? 431 : 0;
    /* "GET /metrics HTTP/1.1": the request line is all we read */
    if (sscanf(req, "%7[A-Z] %63[^ \r\n] HTTP/1.%*1[01]", method, path) != 2)
        return 400;
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return 405;
    /* a query (a scrape config's params) does not change the answer */
    if (strcspn(path, "?") != 8 || strncmp(path, "/metrics", 8))
        return 404;
    *head = !strcmp(method, "HEAD");
    return 200;
}

/*
 * The coordinator's Prometheus endpoint (control/coord_metrics.c): scraped
 * over a socket, checked by promtool and for exact values after two nodes
 * join and put three objects; the bounds of its HTTP responder (methods,
 * paths, request size, slow clients).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client.h"
#include "control/coord.h"
#include "control/coord_metrics_req.h"
#include "dataplane/engine/engine.h"
#include "testutil.h"

#define DEADLINE_S 20

static struct cfx_coord *coord;
static char coord_addr[64];
static char token[64];
static uint16_t mport;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_start("127.0.0.1:0", &coord, token, sizeof(token), coord_addr,
                                      sizeof(coord_addr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
    mport = cfx__coord_metrics_port(coord);
    cr_assert_neq(mport, 0);
}

static void teardown(void)
{
    cfx__coord_stop(coord);
    coord = NULL;
}

TestSuite(coord_metrics, .init = setup, .fini = teardown, .timeout = 60);

static int connect_metrics(void)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_port = htons(mport),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "%s", strerror(errno));
    return fd;
}

/* Read @p fd until the peer closes (by the deadline) into a malloc'd string. */
static char *read_all(int fd)
{
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    time_t end = time(NULL) + DEADLINE_S;
    cr_assert_not_null(buf);
    for (;;) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int ms = (int)(end - time(NULL)) * 1000;
        cr_assert_gt(ms, 0, "the endpoint did not close by the deadline");
        int r = poll(&pfd, 1, ms);
        cr_assert_geq(r, 0);
        if (r == 0)
            continue;
        if (cap - len < 4096) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == ECONNRESET)
            n = 0;
        cr_assert_geq(n, 0, "%s", strerror(errno));
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

/* Send @p req whole and return the whole answer. */
static char *exchange(const char *req, size_t len)
{
    int fd = connect_metrics();
    cr_assert_eq(send(fd, req, len, MSG_NOSIGNAL), (ssize_t)len);
    return read_all(fd);
}

static char *scrape(void)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    return exchange(req, sizeof(req) - 1);
}

/* The body of an answer of 200 (fails on any other status). */
static const char *body_of(const char *resp)
{
    cr_assert_eq(strncmp(resp, "HTTP/1.1 200 OK\r\n", 17), 0, "%s", resp);
    cr_assert_not_null(strstr(resp, "\r\nContent-Type: text/plain; version=0.0.4; "
                                    "charset=utf-8\r\n"),
                       "%s", resp);
    const char *b = strstr(resp, "\r\n\r\n");
    cr_assert_not_null(b);
    b += 4;
    char want[64];
    snprintf(want, sizeof(want), "\r\nContent-Length: %zu\r\n", strlen(b));
    cr_assert_not_null(strstr(resp, want), "length of a body of %zu bytes: %s", strlen(b), resp);
    return b;
}

/* The sample line "@p name value" (labels in @p name) exactly once. */
static void expect_sample(const char *body, const char *name, unsigned long long value)
{
    char line[256];
    snprintf(line, sizeof(line), "\n%s %llu\n", name, value);
    const char *p = strstr(body, line);
    cr_expect_not_null(p, "no line '%s %llu' in:\n%s", name, value, body);
    if (p)
        cr_expect_null(strstr(p + 1, line), "'%s' twice", name);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The value of the sample "@p name" (labels in @p name), or -1 without one. */
static long long sample_of(const char *body, const char *name)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "\n%s ", name);
    cr_assert(n > 0 && (size_t)n < sizeof(line), "sample name too long: %s", name);
    const char *p = strstr(body, line);
    return p ? strtoll(p + strlen(line), NULL, 10) : -1;
}

/* A sample a scrape must show: exactly @p value, or at least it (@p at_least). */
struct want {
    const char *name;
    long long value;
    bool at_least;
};

/*
 * Scrape until every sample of @p w (@p n of them) holds, by DEADLINE_S; the
 * response (free it) and *@p body its body.  For counts that reach the
 * coordinator with the nodes' heartbeats (every 250 ms): no answer of the
 * coordinator waits for a heartbeat, so there is no event to wait on, and
 * the test polls.
 */
static char *scrape_until(const struct want *w, size_t n, const char *what, const char **body)
{
    uint64_t deadline = now_ns() + DEADLINE_S * 1000000000ull;
    for (;;) {
        char *r = scrape();
        *body = body_of(r);
        size_t ok = 0;
        for (size_t i = 0; i < n; i++) {
            long long v = sample_of(*body, w[i].name);
            ok += w[i].at_least ? v >= w[i].value : v == w[i].value;
        }
        if (ok == n)
            return r;
        cr_assert(now_ns() < deadline, "no report of %s:\n%s", what, *body);
        free(r);
        usleep(50 * 1000);
    }
}

/* promtool check metrics, reading @p body: its exit status and output. */
static int promtool(const char *body, char *out, size_t cap)
{
    char path[] = "/tmp/cfx-metrics-XXXXXX", cmd[256];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    close(fd);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
    int st = cfx_test_run_output(cmd, out, cap);
    cr_assert_neq(st, -1, "cannot run %s", cmd);
    unlink(path);
    return st;
}

static int join(struct cfx_context **out)
{
    return cfx_test_join(coord_addr, token, "tcp", NULL, 10000, out);
}

Test(coord_metrics, two_nodes_three_objects)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id[3];
    static const size_t size[3] = { 100, 1000, 200000 }; /* two inline, one not */
    static uint8_t data[200000];
    char out[4096], line[128];

    if (system("command -v promtool >/dev/null 2>&1") != 0)
        cr_skip_test("promtool is not installed (Debian package prometheus; scripts/deps.sh)");
    /* empty directory */
    char *r0 = scrape();
    const char *b0 = body_of(r0);
    expect_sample(b0, "conflux_coord_members{state=\"alive\"}", 0);
    expect_sample(b0, "conflux_coord_objects", 0);
    expect_sample(b0, "conflux_coord_metrics_scrapes_total", 0);
    cr_assert_eq(promtool(b0, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, b0);
    free(r0);

    cr_assert_eq(join(&a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(&b), CFX_OK, "%s", cfx_last_error());
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof(name), "metrics-%d", i);
        cfx_object_id_from_name(name, &id[i]);
        cr_assert_eq(cfx_put(i < 2 ? a : b, &id[i], data, size[i], NULL), CFX_OK, "%s",
                     cfx_last_error());
    }
    char *r1 = scrape();
    const char *b1 = body_of(r1);
    cr_log_info("%s", b1);
    expect_sample(b1, "conflux_coord_members{state=\"alive\"}", 2);
    expect_sample(b1, "conflux_coord_members{state=\"dead\"}", 0);
    expect_sample(b1, "conflux_coord_members{state=\"left\"}", 0);
    expect_sample(b1, "conflux_coord_objects", 3);
    expect_sample(b1, "conflux_coord_object_bytes", 201100);
    expect_sample(b1, "conflux_coord_inline_objects", 2);
    expect_sample(b1, "conflux_coord_inline_bytes", 1100);
    expect_sample(b1, "conflux_coord_object_holders", 3);
    expect_sample(b1, "conflux_coord_lookups_parked", 0);
    expect_sample(b1, "conflux_coord_tasks{state=\"queued\"}", 0);
    expect_sample(b1, "conflux_coord_tasks_ended_total{status=\"ok\"}", 0);
    expect_sample(b1, "conflux_coord_metrics_scrapes_total", 1);
    snprintf(line, sizeof(line), "conflux_coord_node_holdings{node=\"%u\"}",
             cfx_context_node_id(a));
    expect_sample(b1, line, 2);
    snprintf(line, sizeof(line), "conflux_coord_node_holdings{node=\"%u\"}",
             cfx_context_node_id(b));
    expect_sample(b1, line, 1);
    snprintf(line, sizeof(line), "conflux_coord_node_inline_bytes{node=\"%u\"}",
             cfx_context_node_id(a));
    expect_sample(b1, line, 1100);
    cr_assert_eq(promtool(b1, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, b1);
    free(r1);

    /* b leaves: its object goes with it, and it is listed as gone in good
     * order, not as dead (a leave is no death) */
    cfx_context_destroy(b);
    /* the leave is a call the coordinator answered: scrape after it */
    char *r2 = scrape();
    const char *b2 = body_of(r2);
    expect_sample(b2, "conflux_coord_members{state=\"alive\"}", 1);
    expect_sample(b2, "conflux_coord_members{state=\"dead\"}", 0);
    expect_sample(b2, "conflux_coord_members{state=\"left\"}", 1);
    expect_sample(b2, "conflux_coord_objects", 2);
    expect_sample(b2, "conflux_coord_object_bytes", 1100);
    cr_assert_eq(promtool(b2, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, b2);
    free(r2);
    cfx_context_destroy(a);
}

/*
 * A tool's connection (rdmactl ps joins as an observer) is no member: the
 * member counts are those rdmactl status shows, with observers counted
 * apart while connected, and one that has gone is not counted as left.
 */
Test(coord_metrics, observers_counted_apart)
{
    struct cfx_context *a, *t;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_NAME,
        .coord = coord_addr, .token = token, .name = "a-tool",
    };

    cr_assert_eq(join(&a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__context_create_flags(&p, CFX_NODE_F_OBSERVER, &t), CFX_OK, "%s",
                 cfx_last_error());
    char *r1 = scrape();
    const char *b1 = body_of(r1);
    expect_sample(b1, "conflux_coord_members{state=\"alive\"}", 1);
    expect_sample(b1, "conflux_coord_observers", 1);
    /* nor in the per-node families, which list members */
    char tool[64];
    snprintf(tool, sizeof(tool), "{node=\"%u\"", cfx_context_node_id(t));
    cr_assert(!strstr(b1, "name=\"a-tool\""), "the observer has a node_alive sample:\n%s", b1);
    cr_assert(!strstr(b1, tool), "the observer has a per-node sample:\n%s", b1);
    free(r1);

    /* the tool is done: gone, and no member left */
    cfx_context_destroy(t);
    char *r2 = scrape();
    const char *b2 = body_of(r2);
    expect_sample(b2, "conflux_coord_members{state=\"alive\"}", 1);
    expect_sample(b2, "conflux_coord_members{state=\"left\"}", 0);
    expect_sample(b2, "conflux_coord_members{state=\"dead\"}", 0);
    expect_sample(b2, "conflux_coord_observers", 0);
    free(r2);
    cfx_context_destroy(a);
}

/*
 * Each member's heartbeat reports its traffic: b gets a's 300,000-byte
 * object over tcp; the next reports show a's upload and bytes sent, b's get
 * and bytes received, per transport, and the counts of puts exactly.
 */
Test(coord_metrics, heartbeats_report_traffic)
{
    struct cfx_context *a, *b;
    struct cfx_object_id id;
    static uint8_t data[300000], got[300000];
    char out[4096], la[160], lb[160];
    size_t gsz = 0;

    cr_assert_eq(join(&a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(&b), CFX_OK, "%s", cfx_last_error());
    uint32_t na = cfx_context_node_id(a), nb = cfx_context_node_id(b);
    cfx_test_fill(data, sizeof(data), 3);
    cfx_object_id_from_name("metrics-traffic", &id);
    cr_assert_eq(cfx_put(a, &id, data, sizeof(data), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &id, got, sizeof(got), &gsz, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(gsz, sizeof(data));
    cr_assert_eq(cfx_test_check(got, gsz, 3), (size_t)-1);

    /* reports come with each node's own heartbeats (every 250 ms by
     * default), so b's report of its get can come before a's of the upload:
     * scrape until both show the transfer whole, then check every value of
     * that scrape */
    snprintf(lb, sizeof(lb), "conflux_coord_node_gets_total{node=\"%u\"}", nb);
    char ua[160], sa[160];
    snprintf(ua, sizeof(ua), "conflux_coord_node_uploads_total{node=\"%u\"}", na);
    snprintf(sa, sizeof(sa),
             "conflux_coord_node_transport_sent_bytes_total{node=\"%u\",transport=\"tcp\"}", na);
    char pa[160], pb[160];
    snprintf(pa, sizeof(pa),
             "conflux_coord_node_peer_sent_bytes_total{node=\"%u\",peer=\"%u\",transport=\"tcp\"}",
             na, nb);
    snprintf(pb, sizeof(pb),
             "conflux_coord_node_peer_received_bytes_total{node=\"%u\",peer=\"%u\","
             "transport=\"tcp\"}", nb, na);
    const long long whole = (long long)sizeof(data);
    const struct want traffic[] = { { lb, 1, false }, { ua, 1, false }, { sa, whole, true },
                                    { pa, whole, true }, { pb, whole, true } };
    const char *body = NULL;
    char *r = scrape_until(traffic, sizeof(traffic) / sizeof(traffic[0]), "b's get and a's upload",
                           &body);
    cr_log_info("%s", body);
    expect_sample(body, lb, 1);
    snprintf(la, sizeof(la), "conflux_coord_node_puts_total{node=\"%u\"}", na);
    expect_sample(body, la, 1);
    snprintf(la, sizeof(la), "conflux_coord_node_uploads_total{node=\"%u\"}", na);
    expect_sample(body, la, 1);
    snprintf(la, sizeof(la), "conflux_coord_node_gets_total{node=\"%u\"}", na);
    expect_sample(body, la, 0);
    snprintf(la, sizeof(la), "conflux_coord_node_writes_refused_total{node=\"%u\"}", nb);
    expect_sample(body, la, 0);
    snprintf(la, sizeof(la), "conflux_coord_node_source_failovers_total{node=\"%u\"}", nb);
    expect_sample(body, la, 0);
    /* the object's bytes crossed tcp from a to b, with a few messages around
     * them (requests, grants, handshakes: well under 64 KiB) */
    snprintf(la, sizeof(la),
             "conflux_coord_node_transport_sent_bytes_total{node=\"%u\",transport=\"tcp\"}", na);
    snprintf(lb, sizeof(lb),
             "conflux_coord_node_transport_received_bytes_total{node=\"%u\",transport=\"tcp\"}",
             nb);
    long long sent = sample_of(body, la), recvd = sample_of(body, lb);
    cr_expect(sent >= (long long)sizeof(data) && sent < (long long)sizeof(data) + 65536,
              "a sent %lld bytes for a %zu-byte object", sent, sizeof(data));
    cr_expect(recvd >= (long long)sizeof(data) && recvd < (long long)sizeof(data) + 65536,
              "b received %lld bytes for a %zu-byte object", recvd, sizeof(data));
    /* and per peer: a's traffic was with b alone (b's handshake bytes before
     * its HELLO are the transport's only), and the other way round */
    long long psent = sample_of(body, pa), precvd = sample_of(body, pb);
    cr_expect(psent >= (long long)sizeof(data) && psent <= sent,
              "a sent %lld bytes to b of %lld in all", psent, sent);
    cr_expect(precvd >= (long long)sizeof(data) && precvd <= recvd,
              "b received %lld bytes from a of %lld in all", precvd, recvd);
    snprintf(la, sizeof(la), "conflux_coord_node_transfers_active{node=\"%u\",direction=\"in\"}",
             nb);
    expect_sample(body, la, 0);
    if (system("command -v promtool >/dev/null 2>&1") == 0)
        cr_expect_eq(promtool(body, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, body);
    free(r);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

#define PS_JOB "met\"ps\\1" /* a quote and a backslash: escaped in the labels */
#define PS_JOB_LABEL "met\\\"ps\\\\1"
#define PS_BLOCK 64u        /* bytes per block: 16 floats */
#define PS_A_BLOCKS 40u     /* tensor a: more blocks than one heartbeat reports */
#define PS_B_BLOCKS 2u      /* tensor b, blocks 40 and 41: the heaviest */

/* The load a parameter server reports per block: a worker pushes tensor a
 * (40 blocks) once, and tensor b (2 blocks) three times and pulls it twice;
 * the server's requests and bytes per block, in all and per block, are
 * exact in a scrape, the 32 heaviest blocks listed (b's two, then a's
 * lowest 30: equal loads go by block number) and no other. */
Test(coord_metrics, ps_load_per_block)
{
    struct cfx_context *ctx[2];
    struct cfx_ps *srv, *w;
    char name[256], out[4096];

    for (int i = 0; i < 2; i++)
        cr_assert_eq(join(&ctx[i]), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_ps_load_job(ctx[0], ctx[1], PS_JOB, PS_BLOCK, PS_A_BLOCKS, PS_B_BLOCKS,
                                      &srv, &w, out, sizeof(out)),
                 CFX_OK, "%s", out);
    uint32_t node = cfx_context_node_id(ctx[0]);

    /* every request is answered by now, but the server's node reports with
     * its heartbeats (every 250 ms): no event says the coordinator has the
     * report, so scrape until it does, by a deadline */
    const unsigned requests = PS_A_BLOCKS + PS_B_BLOCKS * 5;
    char total[256];
    snprintf(total, sizeof(total),
             "conflux_coord_ps_server_requests_total{job=\"%s\",server=\"0\",node=\"%u\"}",
             PS_JOB_LABEL, node);
    const struct want served = { total, requests, false };
    const char *body = NULL;
    char *r = scrape_until(&served, 1, "the server's requests", &body);
    cr_log_info("%s", body);
    snprintf(name, sizeof(name),
             "conflux_coord_ps_server_bytes_total{job=\"%s\",server=\"0\",node=\"%u\"}",
             PS_JOB_LABEL, node);
    expect_sample(body, name, (unsigned long long)requests * PS_BLOCK);
    snprintf(name, sizeof(name),
             "conflux_coord_ps_server_blocks{job=\"%s\",server=\"0\",node=\"%u\"}", PS_JOB_LABEL,
             node);
    expect_sample(body, name, PS_A_BLOCKS + PS_B_BLOCKS);
    for (unsigned blk = 0; blk < PS_A_BLOCKS + PS_B_BLOCKS; blk++) {
        int listed = blk >= PS_A_BLOCKS || blk < 30;
        unsigned long long reqs = blk >= PS_A_BLOCKS ? 5 : 1;
        snprintf(name, sizeof(name),
                 "conflux_coord_ps_block_requests_total{job=\"%s\",block=\"%u\",server=\"0\","
                 "node=\"%u\"}", PS_JOB_LABEL, blk, node);
        if (listed)
            expect_sample(body, name, reqs);
        else
            cr_expect_eq(sample_of(body, name), -1, "block %u listed beyond the 32", blk);
        snprintf(name, sizeof(name),
                 "conflux_coord_ps_block_bytes_total{job=\"%s\",block=\"%u\",server=\"0\","
                 "node=\"%u\"}", PS_JOB_LABEL, blk, node);
        if (listed)
            expect_sample(body, name, reqs * PS_BLOCK);
        else
            cr_expect_eq(sample_of(body, name), -1, "block %u listed beyond the 32", blk);
    }
    /* the worker's node serves no blocks: no PS series of its own */
    snprintf(name, sizeof(name), "node=\"%u\"}", cfx_context_node_id(ctx[1]));
    for (const char *p = strstr(body, "\nconflux_coord_ps_"); p; p = strstr(p + 1,
                                                                         "\nconflux_coord_ps_"))
        cr_expect(!strstr(p, name) || strchr(p + 1, '\n') < strstr(p, name),
                  "a PS series of the worker's node: %.120s", p + 1);
    if (system("command -v promtool >/dev/null 2>&1") == 0)
        cr_expect_eq(promtool(body, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, body);
    free(r);
    cfx_ps_destroy(w);
    cfx_ps_destroy(srv);
    for (int i = 1; i >= 0; i--)
        cfx_context_destroy(ctx[i]);
}

Test(coord_metrics, only_get_of_metrics)
{
    static const char post[] = "POST /metrics HTTP/1.1\r\n\r\n";
    static const char other[] = "GET / HTTP/1.1\r\n\r\n";
    static const char junk[] = "hello\r\n\r\n";
    static const char head[] = "HEAD /metrics HTTP/1.0\r\n\r\n";
    static const char query[] = "GET /metrics?format=prometheus HTTP/1.1\r\n\r\n";
    static const char longer[] = "GET /metricsx HTTP/1.1\r\n\r\n";
    char *r;

    r = exchange(post, sizeof(post) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 405 Method Not Allowed\r\n", 33), 0, "%s", r);
    cr_expect_not_null(strstr(r, "\r\nAllow: GET, HEAD\r\n"), "%s", r);
    free(r);
    r = exchange(other, sizeof(other) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 404 Not Found\r\n", 24), 0, "%s", r);
    free(r);
    r = exchange(junk, sizeof(junk) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 400 Bad Request\r\n", 26), 0, "%s", r);
    free(r);
    r = exchange(head, sizeof(head) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 200 OK\r\n", 17), 0, "%s", r);
    cr_expect_eq(strcmp(strstr(r, "\r\n\r\n"), "\r\n\r\n"), 0, "a HEAD has no body: %s", r);
    /* its Content-Length is the GET's (RFC 9110, 8.6), not 0; the GET after
     * it differs only in a few digits (uptime, scrapes) */
    const char *cl = strstr(r, "\r\nContent-Length: ");
    cr_assert_not_null(cl, "%s", r);
    long head_len = strtol(cl + 18, NULL, 10);
    free(r);
    r = scrape();
    long get_len = (long)strlen(body_of(r));
    cr_expect(head_len > get_len - 16 && head_len < get_len + 16,
              "HEAD says %ld bytes, the GET has %ld", head_len, get_len);
    free(r);
    /* a query string (Prometheus sends a scrape config's params so) is
     * still /metrics; another path is not */
    r = exchange(query, sizeof(query) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 200 OK\r\n", 17), 0, "%s", r);
    cr_expect_not_null(strstr(r, "\nconflux_coord_objects 0\n"), "%s", r);
    free(r);
    r = exchange(longer, sizeof(longer) - 1);
    cr_expect_eq(strncmp(r, "HTTP/1.1 404 Not Found\r\n", 24), 0, "%s", r);
    free(r);
}

/* The head alone (cfx__coord_metrics_req_parse): nothing until it ends,
 * then the status; a full buffer that never ends is 431. */
static int judge(const char *req, bool *head)
{
    return cfx__coord_metrics_req_parse(req, strlen(req), head);
}

Test(coord_metrics, request_head_judged)
{
    static char big[CFX_METRICS_REQ_MAX + 1];
    bool head = true;

    cr_expect_eq(judge("GET /metrics HTTP/1.1\r\nHost: x\r\n", &head), 0);
    cr_expect_eq(judge("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &head), 200);
    cr_expect_not(head);
    cr_expect_eq(judge("HEAD /metrics?job=c HTTP/1.0\n\n", &head), 200);
    cr_expect(head);
    cr_expect_eq(judge("POST /metrics HTTP/1.1\r\n\r\n", &head), 405);
    cr_expect_not(head);
    cr_expect_eq(judge("GET /metricsx HTTP/1.1\r\n\r\n", &head), 404);
    cr_expect_eq(judge("hello\r\n\r\n", &head), 400);
    memset(big, 'a', CFX_METRICS_REQ_MAX - 1);
    cr_expect_eq(cfx__coord_metrics_req_parse(big, CFX_METRICS_REQ_MAX - 1, &head), 0);
    big[CFX_METRICS_REQ_MAX - 1] = 'a';
    cr_expect_eq(cfx__coord_metrics_req_parse(big, CFX_METRICS_REQ_MAX, &head), 431);
}

/* A head past 4096 bytes: 431, and the connection closed. */
Test(coord_metrics, oversized_request)
{
    char req[8192];
    memset(req, 'a', sizeof(req));
    memcpy(req, "GET /metrics HTTP/1.1\r\nX-Pad: ", 30);
    int fd = connect_metrics();
    /* the endpoint may answer and close before it has read all of it */
    ssize_t n = send(fd, req, sizeof(req), MSG_NOSIGNAL);
    cr_assert(n > 0 || errno == EPIPE || errno == ECONNRESET, "%s", strerror(errno));
    char *r = read_all(fd);
    cr_expect_eq(strncmp(r, "HTTP/1.1 431 Request Header Fields Too Large\r\n", 46), 0, "%s", r);
    free(r);
}

/* A client that never sends its request is closed (5 s after it connected);
 * meanwhile the endpoint answers others. */
Test(coord_metrics, slow_client_is_closed)
{
    int idle = connect_metrics();
    char *r = scrape();
    body_of(r);
    free(r);
    char *rest = read_all(idle); /* fails at the deadline if never closed */
    cr_expect_str_empty(rest, "no answer to no request: %s", rest);
    free(rest);
}

/* Past 16 connections at once, the next ones are closed at accept, and the
 * endpoint serves again once they go. */
Test(coord_metrics, connection_cap)
{
    int fds[16];
    for (int i = 0; i < 16; i++)
        fds[i] = connect_metrics();
    /* the 17th: closed without an answer (once the 16 are accepted) */
    char *r = scrape();
    cr_expect_str_empty(r, "answered past the cap: %s", r);
    free(r);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    /* closed connections are noticed on their next event: the cap frees up
     * as the endpoint reads their EOF; a scrape then is answered */
    char *ok = NULL;
    for (int tries = 0; tries < 100; tries++) {
        ok = scrape();
        if (ok[0])
            break;
        free(ok);
        ok = NULL;
    }
    cr_assert_not_null(ok, "never answered again after the 16 closed");
    body_of(ok);
    free(ok);
}

/* A peer's name with quotes, a backslash and bytes that are not UTF-8:
 * escaped or replaced, and promtool still accepts the text. */
Test(coord_metrics, peer_names_escaped)
{
    struct cfx_context *a;
    char out[4096], want[128];
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        cr_skip_test("promtool is not installed (Debian package prometheus; scripts/deps.sh)");
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS | CFX_CTX_PARAM_NAME,
        .coord = coord_addr,
        .token = token,
        .timeout_ms = 10000,
        .transports = "tcp",
        .name = "we\"ird\\\xff\x01",
    };
    cr_assert_eq(cfx_context_create(&p, &a), CFX_OK, "%s", cfx_last_error());
    char *r = scrape();
    const char *body = body_of(r);
    snprintf(want, sizeof(want), "conflux_coord_node_alive{node=\"%u\",name=\"we\\\"ird\\\\??\",",
             cfx_context_node_id(a));
    cr_expect_not_null(strstr(body, want), "no '%s' in:\n%s", want, body);
    cr_assert_eq(promtool(body, out, sizeof(out)), 0, "promtool:\n%s\non:\n%s", out, body);
    free(r);
    cfx_context_destroy(a);
}

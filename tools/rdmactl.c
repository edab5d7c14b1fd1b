/*
 * rdmactl: inspect a Conflux cluster through its coordinator.
 *
 *   rdmactl [--coord HOST:PORT] [--token-file F | --token T] [--json] COMMAND
 *           [COMMAND OPTIONS]
 *
 * The global options may also follow the command (rdmactl objects --json),
 * as kubectl's do.  Every command refuses an option or argument it does not
 * take (exit 2, one line naming it).
 *
 * Names, host names and object names come from peers: they are printed
 * escaped (bytes outside printable ASCII as \xNN in tables, \u00NN in JSON).
 *
 * Commands live in one table below ({name, fn, help}); adding one is adding
 * a function and a row.  Exit status: 0 ok, 1 the coordinator could not be
 * reached or answered an error, 2 usage errors.
 */
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <conflux/context.h>
#include <conflux/object.h>
#include <conflux/ps.h>
#include <conflux/status.h>

#include "args.h"
#include "control/auth.h"
#include "control/client.h"
#include "control/seal.h"
#ifdef CFX_HAVE_VERBS
#include "dataplane/verbs/verbs_devinfo.h"
#endif
#include "dataplane/common/util.h"
#include "dataplane/dpdk/dpdk_io.h"
#include "dataplane/engine/engine.h"
#include "gpu/memtype.h"

#define RDMACTL_TIMEOUT_MS 5000     /* coordinator requests */
#define RDMACTL_PS_TIMEOUT_MS 20000 /* ps requests: the scheduler answers between steps */

struct rdmactl {
    const char *coord;      /* "host:port" */
    char token[CFX_TOKEN_MAX + 1];
    const char *token_file; /* --token-file */
    int json;               /* --json */
    struct cfx_ctl *ctl;    /* opened lazily by ctl_get() */
    int open_ms;            /* ctl_get()'s deadline (0: RDMACTL_TIMEOUT_MS) */
    int check_only;         /* main's first pass: check the command's arguments only */
    int checked;            /* ... and they passed: the command got as far as ctl_get() */
};

/* A command's own options, one bit each (struct rdmactl_cmd.opts). */
enum {
    OPT_ALL = 1 << 0,      /* nodes --all */
    OPT_ONCE = 1 << 1,     /* top --once */
    OPT_INTERVAL = 1 << 2, /* top --interval MS */
    OPT_COUNT = 1 << 3,    /* top --count N */
    OPT_JOB = 1 << 4,      /* ps --job J */
    OPT_TIMEOUT = 1 << 5,  /* ps --timeout MS */
    OPT_AUTO = 1 << 6,     /* ps add-server --auto */
};

/* A command's options and operands, as the scan of its arguments found them. */
struct cmd_args {
    const char *name;     /* the command */
    int all, once, autosel;
    const char *interval; /* values as given; each command checks its own */
    const char *count;
    const char *job;
    const char *timeout;
    int nargs;            /* operands, in order */
    char **args;
};

struct rdmactl_cmd {
    const char *name;
    int (*fn)(struct rdmactl *r, const struct cmd_args *a);  /* returns the exit status */
    const char *help;
    int local;          /* runs on this host alone: no coordinator needed */
    unsigned opts;      /* OPT_* it takes */
    int max_args;       /* operands it takes, at most */
    const char *usage;  /* after "rdmactl [global options] " */
};

/* ------------------------------------------------------------------------ */
/* Output helpers                                                            */

/* A JSON string.  Bytes outside printable ASCII are escaped one by one
 * (\u00NN), so a peer's invalid UTF-8 never makes the document invalid. */
static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", stdout); break;
        case '\\': fputs("\\\\", stdout); break;
        case '\n': fputs("\\n", stdout); break;
        case '\r': fputs("\\r", stdout); break;
        case '\t': fputs("\\t", stdout); break;
        default:
            if (*p < 0x20 || *p >= 0x7f)
                printf("\\u%04x", *p);
            else
                putchar(*p);
        }
    }
    putchar('"');
}

/* A peer's string for a table: printable ASCII as is, a backslash doubled,
 * any other byte as \xNN (no terminal escapes, no column breaks; a space
 * too, but in the last column with @p last).  @p out holds 4 * strlen(s) + 1
 * bytes at most; cut to @p len. */
static const char *esc_col(const char *s, char *out, size_t len, bool last)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < len; p++) {
        if (*p == '\\') {
            out[o++] = '\\';
            out[o++] = '\\';
        } else if ((*p > 0x20 || (last && *p == 0x20)) && *p < 0x7f) {
            out[o++] = (char)*p;
        } else {
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", *p);
        }
    }
    out[o] = '\0';
    return out;
}

static const char *esc(const char *s, char *out, size_t len)
{
    return esc_col(s, out, len, false);
}

static void id_hex(const struct cfx_object_id *id, char *buf)
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned i = 0; i < CFX_OBJECT_ID_LEN; i++) {
        buf[2 * i] = digits[id->bytes[i] >> 4];
        buf[2 * i + 1] = digits[id->bytes[i] & 15];
    }
    buf[2 * CFX_OBJECT_ID_LEN] = '\0';
}

static const char *human_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    unsigned u = 0;
    double d = (double)v;
    while (d >= 1024 && u + 1 < CFX_ARRAY_SIZE(unit)) {
        d /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, len, "%.1f %s", d, unit[u]);
    return buf;
}

/* Printable form of a node's transports: "tcp,shm". */
static void node_tps(const struct cfx_node_rec *n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < n->naddr && i < CFX_NODE_ADDRS_MAX && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? "," : "", n->addr[i].tp);
    if (!buf[0])
        snprintf(buf, len, "-");
}

/* ------------------------------------------------------------------------ */
/* Connection                                                                */

static struct cfx_ctl *ctl_get(struct rdmactl *r)
{
    if (r->check_only) { /* every argument was checked before this: reach nothing */
        r->checked = 1;
        return NULL;
    }
    if (r->ctl)
        return r->ctl;
    struct cfx_ctl_params p = {
        .coord = r->coord,
        .token = r->token,
        .role = CFX_CTL_ROLE_ADMIN,
        .timeout_ms = r->open_ms ? r->open_ms : RDMACTL_TIMEOUT_MS,
    };
    /* the coordinator's mode: nodes and tools share CFX_SECURE */
    int rc = cfx__seal_mode_parse(getenv("CFX_SECURE"), &p.secure);
    if (rc != CFX_OK) {
        fprintf(stderr, "rdmactl: %s\n", cfx_last_error());
        return NULL;
    }
    rc = cfx__ctl_open(&p, &r->ctl);
    if (rc != CFX_OK) {
        fprintf(stderr, "rdmactl: cannot reach the coordinator at %s: %s\n", r->coord,
                cfx_last_error());
        r->ctl = NULL;
    }
    return r->ctl;
}

static int fail(const char *what)
{
    fprintf(stderr, "rdmactl: %s failed: %s\n", what, cfx_last_error());
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Commands                                                                  */

/* "alive", "dead" or "left" (dead after saying goodbye). */
static const char *node_state(const struct cfx_node_rec *x)
{
    return x->alive ? "alive" : (x->flags & CFX_NODE_F_LEFT) ? "left" : "dead";
}

/*
 * Members by state, from the node listing: the coordinator's STATUS counts
 * observers (tools' contexts, such as rdmactl ps) among the members and a
 * member that left in good order among the dead.  Here the three states are
 * those `rdmactl nodes --all` shows, for workers; observers are counted
 * apart, and only while connected.
 */
struct member_counts {
    uint32_t alive, dead, left; /* workers */
    uint32_t observers;         /* observers alive */
};

static void member_count(const struct cfx_node_rec *nodes, size_t n, struct member_counts *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < n; i++) {
        const struct cfx_node_rec *x = &nodes[i];
        if (x->flags & CFX_NODE_F_OBSERVER)
            c->observers += x->alive ? 1 : 0;
        else if (x->alive)
            c->alive++;
        else if (x->flags & CFX_NODE_F_LEFT)
            c->left++;
        else
            c->dead++;
    }
}

static int cmd_status(struct rdmactl *r, const struct cmd_args *a)
{
    struct cfx_ctl_status s;
    struct cfx_node_rec *nodes = NULL;
    struct member_counts m;
    size_t nn = 0;
    char b[32];
    (void)a;
    if (!ctl_get(r))
        return 1;
    if (cfx__ctl_status(r->ctl, &s, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("status");
    if (cfx__ctl_nodes(r->ctl, &nodes, &nn, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("node listing");
    member_count(nodes, nn, &m);
    free(nodes);
    if (r->json) {
        printf("{\"coordinator\":");
        json_str(r->coord);
        printf(",\"version\":");
        json_str(s.version);
        printf(",\"protocol\":%u,\"uptime_ms\":%llu,\"nodes_alive\":%u,\"nodes_dead\":%u,"
               "\"nodes_left\":%u,\"observers\":%u,"
               "\"objects\":%u,\"inline_bytes\":%llu,\"heartbeat_ms\":%u,"
               "\"dead_after_ms\":%u}\n",
               s.proto_version, (unsigned long long)s.uptime_ms, m.alive, m.dead, m.left,
               m.observers, s.objects, (unsigned long long)s.inline_bytes, s.heartbeat_ms,
               s.dead_after_ms);
        return 0;
    }
    printf("%-14s : %s\n", "coordinator", r->coord);
    printf("%-14s : %s (protocol %u)\n", "version", s.version, s.proto_version);
    printf("%-14s : %llu.%03llu s\n", "uptime", (unsigned long long)(s.uptime_ms / 1000),
           (unsigned long long)(s.uptime_ms % 1000));
    printf("%-14s : %u alive, %u dead, %u left\n", "nodes", m.alive, m.dead, m.left);
    if (m.observers)
        printf("%-14s : %u (tools' connections: rdmactl nodes --all)\n", "observers",
               m.observers);
    printf("%-14s : %u\n", "objects", s.objects);
    printf("%-14s : %s\n", "inline bytes", human_bytes(s.inline_bytes, b, sizeof(b)));
    printf("%-14s : %u ms (dead after %u ms)\n", "heartbeat", s.heartbeat_ms, s.dead_after_ms);
    return 0;
}

/* Listed by default: alive members.  --all adds the recently dead (the
 * coordinator forgets them after a while) and observers (tools' contexts). */
static int node_listed(const struct cfx_node_rec *x, int all)
{
    return all || (x->alive && !(x->flags & CFX_NODE_F_OBSERVER));
}

/* A node's last heartbeat report (struct cfx_msg_load) as a JSON object. */
static void json_load(const struct cfx_msg_load *l)
{
    printf("{\"load\":%.3f,\"mem_avail\":%llu,\"arena_used\":%llu,\"tasks_running\":%u,"
           "\"transfers_in\":%u,\"transfers_out\":%u,\"puts\":%llu,\"gets\":%llu,"
           "\"uploads\":%llu,\"source_failovers\":%llu,\"reduce_reroutes\":%llu,"
           "\"writes_refused\":%llu,\"transports\":{",
           l->load_milli / 1000.0, (unsigned long long)l->mem_avail,
           (unsigned long long)l->arena_used, l->tasks_running, l->xfers_in_active,
           l->uploads_active, (unsigned long long)l->puts, (unsigned long long)l->gets,
           (unsigned long long)l->uploads, (unsigned long long)l->failovers,
           (unsigned long long)l->reduce_reroutes, (unsigned long long)l->writes_refused);
    for (unsigned t = 0; t < l->ntp && t < CFX_LOAD_TPS_MAX; t++) {
        printf("%s", t ? "," : "");
        json_str(l->tp[t].name);
        printf(":{\"sent_bytes\":%llu,\"received_bytes\":%llu}",
               (unsigned long long)l->tp[t].tx_bytes, (unsigned long long)l->tp[t].rx_bytes);
    }
    printf("}}");
}

static int cmd_nodes(struct rdmactl *r, const struct cmd_args *a)
{
    struct cfx_node_rec *nodes = NULL;
    size_t n = 0;
    char tps[96];
    int all = a->all;
    if (!ctl_get(r))
        return 1;
    if (cfx__ctl_nodes(r->ctl, &nodes, &n, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("node listing");
    if (r->json) {
        printf("[");
        int first = 1;
        for (size_t i = 0; i < n; i++) {
            const struct cfx_node_rec *x = &nodes[i];
            if (!node_listed(x, all))
                continue;
            printf("%s{\"id\":%u,\"name\":", first ? "" : ",", x->node_id);
            first = 0;
            json_str(x->name);
            printf(",\"host\":");
            json_str(x->host);
            printf(",\"host_id\":");
            json_str(x->host_id);
            printf(",\"pid\":%u,\"ctl_addr\":", x->pid);
            json_str(x->ctl_addr);
            printf(",\"alive\":%s,\"state\":\"%s\",\"observer\":%s,\"last_seen_ms\":%u,"
                   "\"transports\":[",
                   x->alive ? "true" : "false", node_state(x),
                   (x->flags & CFX_NODE_F_OBSERVER) ? "true" : "false", x->last_seen_ms);
            for (unsigned j = 0; j < x->naddr && j < CFX_NODE_ADDRS_MAX; j++) {
                if (j)
                    putchar(',');
                json_str(x->addr[j].tp);
            }
            printf("],\"report\":");
            json_load(&x->load);
            printf("}");
        }
        printf("]\n");
        free(nodes);
        return 0;
    }
    /* Column widths follow the longest value so the table stays aligned. */
    char name[4 * CFX_NODE_NAME_MAX + 1], host[4 * CFX_HOST_NAME_MAX + 1];
    int wname = 4, whost = 4, waddr = 8;
    for (size_t i = 0; i < n; i++) {
        if (!node_listed(&nodes[i], all))
            continue;
        wname = CFX_MAX(wname, (int)strlen(esc(nodes[i].name, name, sizeof(name))));
        whost = CFX_MAX(whost, (int)strlen(esc(nodes[i].host, host, sizeof(host))));
        waddr = CFX_MAX(waddr, (int)strlen(nodes[i].ctl_addr));
    }
    printf("%6s  %-8s  %-*s  %-*s  %8s  %-*s  %10s  %s\n", "ID", "STATE", wname, "NAME", whost,
           "HOST", "PID", waddr, "CTL ADDR", "LAST SEEN", "TRANSPORTS");
    for (size_t i = 0; i < n; i++) {
        const struct cfx_node_rec *x = &nodes[i];
        char seen[24], state[16];
        if (!node_listed(x, all))
            continue;
        node_tps(x, tps, sizeof(tps));
        snprintf(seen, sizeof(seen), "%u ms", x->last_seen_ms);
        snprintf(state, sizeof(state), "%s%s", node_state(x),
                 (x->flags & CFX_NODE_F_OBSERVER) ? "*" : "");
        printf("%6u  %-8s  %-*s  %-*s  %8u  %-*s  %10s  %s\n", x->node_id, state, wname,
               esc(x->name, name, sizeof(name)), whost, esc(x->host, host, sizeof(host)),
               x->pid, waddr, x->ctl_addr, seen, tps);
    }
    if (all)
        printf("(* observer: a tool's connection, not a worker)\n");
    free(nodes);
    return 0;
}

static int cmd_objects(struct rdmactl *r, const struct cmd_args *a)
{
    struct cfx_ctl_obj_rec *objs = NULL;
    size_t n = 0;
    char hex[CFX_OBJECT_ID_HEX_LEN], b[32];
    (void)a;
    if (!ctl_get(r))
        return 1;
    if (cfx__ctl_objects(r->ctl, &objs, &n, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("object listing");
    if (r->json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            const struct cfx_ctl_obj_rec *o = &objs[i];
            id_hex(&o->id, hex);
            printf("%s{\"id\":\"%s\",\"name\":", i ? "," : "", hex);
            json_str(o->name);
            printf(",\"size\":%llu,\"chunk_size\":%u,\"inline\":%s,"
                   "\"nholders\":%u,\"holders\":[",
                   (unsigned long long)o->size, o->chunk_size,
                   o->is_inline ? "true" : "false", o->nholders);
            for (uint32_t j = 0; j < o->nholders && j < CFX_ARRAY_SIZE(o->holders); j++) {
                const struct cfx_obj_holder *h = &o->holders[j];
                printf("%s{\"node\":%u,\"complete\":%s,\"uploads\":%u,\"fed_by\":%u,"
                       "\"ready_bytes\":",
                       j ? "," : "", h->node_id, h->complete ? "true" : "false", h->uploads,
                       h->src);
                if (h->ready == CFX_CTL_READY_UNKNOWN)
                    printf("null}"); /* a partial copy that has not reported yet */
                else
                    printf("%llu}", (unsigned long long)h->ready);
            }
            printf("]}");
        }
        printf("]\n");
        free(objs);
        return 0;
    }
    char name[4 * CFX_OBJ_NAME_MAX + 1];
    int wname = 4;
    for (size_t i = 0; i < n; i++)
        wname = CFX_MAX(wname, (int)strlen(esc(objs[i].name, name, sizeof(name))));
    printf("%-40s  %-*s  %12s  %10s  %-6s  %s\n", "ID", wname, "NAME", "SIZE", "CHUNK",
           "INLINE", "HOLDERS (node:c=complete/p=partial+uploads[(landed/size)][<feeder])");
    for (size_t i = 0; i < n; i++) {
        const struct cfx_ctl_obj_rec *o = &objs[i];
        char holders[1024], rb[32];
        size_t off = 0;
        holders[0] = '\0';
        for (uint32_t j = 0; j < o->nholders && j < CFX_ARRAY_SIZE(o->holders) &&
                             off < sizeof(holders); j++)
        {
            off += (size_t)snprintf(holders + off, sizeof(holders) - off, "%s%u:%c%u",
                                    j ? " " : "", o->holders[j].node_id,
                                    o->holders[j].complete ? 'c' : 'p', o->holders[j].uploads);
            /* a partial copy: how far it got, as of its node's last report */
            if (!o->holders[j].complete && off < sizeof(holders))
                off += (size_t)snprintf(holders + off, sizeof(holders) - off, "(%s/%s)",
                                        o->holders[j].ready == CFX_CTL_READY_UNKNOWN
                                            ? "?"
                                            : human_bytes(o->holders[j].ready, rb, sizeof(rb)),
                                        human_bytes(o->size, b, sizeof(b)));
            if (o->holders[j].src && off < sizeof(holders))
                off += (size_t)snprintf(holders + off, sizeof(holders) - off, "<%u",
                                        o->holders[j].src);
        }
        if (o->nholders > CFX_ARRAY_SIZE(o->holders) && off < sizeof(holders))
            snprintf(holders + off, sizeof(holders) - off, " (+%u more)",
                     o->nholders - (uint32_t)CFX_ARRAY_SIZE(o->holders));
        id_hex(&o->id, hex);
        printf("%-40s  %-*s  %12s  %10u  %-6s  %s\n", hex, wname,
               o->name[0] ? esc(o->name, name, sizeof(name)) : "-",
               human_bytes(o->size, b, sizeof(b)), o->chunk_size, o->is_inline ? "yes" : "no",
               holders[0] ? holders : "-");
    }
    free(objs);
    return 0;
}

/* Prints the DPDK ports (when CFX_DPDK_VDEV or CFX_DPDK_EAL names some):
 * text lines, or (json) a "dpdk": [...] member and, with no port, a
 * "dpdk_error" member saying why (the text form's "dpdk: ..." line; not
 * "error", which is the RDMA devices' in the same object), followed by
 * ", ".  Returns how many. */
static int dpdk_ports(int json)
{
    char why[600] = "";
    int n = 0;
    if (json)
        printf("\"dpdk\": ");
#ifdef CFX_HAVE_DPDK
    n = cfx__dpdk_ports_print(stdout, json, why, sizeof(why));
#else
    snprintf(why, sizeof(why), "this build has no dpdk transport (configured with "
             "CFX_WITH_DPDK=OFF, or libdpdk-dev was not found)");
    if (json)
        printf("[]");
    else
        printf("dpdk: %s\n", why);
#endif
    if (json && !n && why[0]) {
        printf(", \"dpdk_error\": ");
        json_str(why);
    }
    if (json)
        printf(", ");
    return n;
}

/* Local RDMA devices and DPDK ports (and GPU support), in the manner of
 * ibv_devinfo. */
static int cmd_devices(struct rdmactl *r, const struct cmd_args *a)
{
    (void)a;
    char gpu[160];
    cfx__gpu_describe(gpu, sizeof(gpu));
#ifdef CFX_HAVE_VERBS
    if (r->json) {
        /* {"devices": [...]} from the verbs side, then our GPU line */
        char *txt = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&txt, &len);
        if (!mem)
            return fail("devices");
        int rc = cfx__verbs_devices_print(mem, 1);
        fclose(mem);
        while (len && (txt[len - 1] == '\n' || txt[len - 1] == ' '))
            txt[--len] = '\0';
        if (len && txt[len - 1] == '}') {
            txt[len - 1] = '\0';
            printf("%s, ", txt);
        } else {
            printf("{\"devices\": [], ");
        }
        int ports = dpdk_ports(1);
        printf("\"gpu\": ");
        json_str(gpu);
        printf("}\n");
        free(txt);
        return rc == CFX_OK || ports ? 0 : 1;
    }
    int rc = cfx__verbs_devices_print(stdout, 0);
    int ports = dpdk_ports(0);
    printf("gpu: %s\n", gpu);
    /* 0 when a device of either kind is there, as ibv_devinfo with one */
    return rc == CFX_OK || ports ? 0 : 1;
#else
    if (r->json) {
        printf("{\"devices\": [], \"error\": \"built without RDMA verbs support\", ");
        int ports = dpdk_ports(1);
        printf("\"gpu\": ");
        json_str(gpu);
        printf("}\n");
        return ports ? 0 : 1;
    }
    printf("no RDMA devices: this build has no verbs transport (configure with "
           "-DCFX_WITH_VERBS=ON and libibverbs-dev/librdmacm-dev installed)\n");
    int ports = dpdk_ports(0);
    printf("gpu: %s\n", gpu);
    return ports ? 0 : 1;
#endif
}

/* A shard map's server state by name; "?" for one past the table. */
static const char *ps_state(const char *const *states, int state)
{
    return state >= CFX_PS_SERVER_ACTIVE && state <= CFX_PS_SERVER_FAILED ? states[state] : "?";
}

/* ps: administer a parameter-server job.  Joins the cluster as a member for
 * the duration of the command (the scheduler answers through small objects). */
static int cmd_ps(struct rdmactl *r, const struct cmd_args *a)
{
    static const char *const states[] = { "?", "active", "standby", "draining", "retired",
                                          "failed" };
    static const char *const subs[] = { "add-server", "remove-server", "rebalance", "auto",
                                        "shards", NULL };
    enum { PS_ADD, PS_REMOVE, PS_REBALANCE, PS_AUTO, PS_SHARDS };
    const char *job = a->job ? a->job : getenv("CFX_PS_JOB") ? getenv("CFX_PS_JOB") : "ps";
    int timeout = RDMACTL_PS_TIMEOUT_MS, which, server = 0, on = 0;
    if (a->timeout && tool_arg_timeout_ms("rdmactl", "--timeout", a->timeout, &timeout))
        return TOOL_EXIT_USAGE;
    if (!*job || strlen(job) > CFX_CTL_PS_JOB_MAX || strchr(job, '/')) {
        /* as cfx_ps_create() takes it: a usage error, not the library's */
        fprintf(stderr, "rdmactl: --job: '%s' is not a job name (1..%u bytes, no '/')\n", job,
                CFX_CTL_PS_JOB_MAX);
        return TOOL_EXIT_USAGE;
    }
    if (a->nargs < 1) {
        fprintf(stderr, "rdmactl: ps: no subcommand given\n");
        goto usage;
    }
    if (tool_arg_word("rdmactl", "ps", a->args[0], subs, &which))
        goto usage;
    const char *sub = subs[which];
    /* add-server --auto: the standby server that task placement chooses */
    int add_auto = a->autosel;
    if (add_auto && which != PS_ADD) {
        fprintf(stderr, "rdmactl: ps %s: --auto goes with add-server only\n", sub);
        goto usage;
    }
    int nargs = (which == PS_ADD && !add_auto) || which == PS_REMOVE || which == PS_AUTO;
    if (a->nargs - 1 != nargs) {
        if (a->nargs - 1 > nargs)
            fprintf(stderr, "rdmactl: ps %s: unexpected argument '%s' (it takes %s)\n", sub,
                    a->args[1 + nargs],
                    which == PS_AUTO ? "one word, on or off"
                    : which == PS_ADD ? "one server index or --auto"
                    : nargs         ? "one server index"
                                    : "no argument");
        else
            fprintf(stderr, "rdmactl: ps %s takes %s\n", sub,
                    which == PS_AUTO ? "one word, on or off"
                    : which == PS_ADD ? "one server index or --auto"
                                      : "one server index");
        goto usage;
    }
    if ((which == PS_ADD || which == PS_REMOVE) && !add_auto &&
        tool_arg_int("rdmactl", sub, a->args[1], 0, INT_MAX, "a server index", &server))
        return TOOL_EXIT_USAGE;
    if (which == PS_AUTO && tool_arg_bool("rdmactl", "auto", a->args[1], &on))
        return TOOL_EXIT_USAGE;
    /* reached as every other command reaches it first (RDMACTL_TIMEOUT_MS): a
     * context's join waits for a coordinator that is not up yet, 30 s; with
     * --timeout the command's deadline bounds all three steps */
    const uint64_t dl = cfx__deadline_ns(timeout);
    if (a->timeout)
        r->open_ms = timeout > 0 ? timeout : 1;
    if (!ctl_get(r))
        return 1;
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_NAME,
        .coord = r->coord, .token = r->token, .name = "rdmactl",
    };
    if (a->timeout) {
        cp.field_mask |= CFX_CTX_PARAM_TIMEOUT;
        cp.timeout_ms = cfx__ms_left(dl) > 0 ? cfx__ms_left(dl) : 1;
    }
    struct cfx_context *ctx;
    /* an observer: rdmactl nodes does not list it as a worker */
    if (cfx__context_create_flags(&cp, CFX_NODE_F_OBSERVER, &ctx) != CFX_OK) {
        fprintf(stderr, "rdmactl: cannot join the cluster at %s: %s\n", r->coord,
                cfx_last_error());
        return 1;
    }
    int rc;
    uint32_t v = 0;
    struct cfx_ps_stats st;
    if (a->timeout)
        timeout = cfx__ms_left(dl) > 0 ? cfx__ms_left(dl) : 0;
    switch (which) {
    case PS_ADD:
        rc = add_auto ? cfx_ps_add_server_auto(ctx, job, timeout, &server, &v)
                      : cfx_ps_add_server(ctx, job, server, timeout, &v);
        break;
    case PS_REMOVE: rc = cfx_ps_remove_server(ctx, job, server, timeout, &v); break;
    case PS_REBALANCE: rc = cfx_ps_rebalance(ctx, job, timeout, &v); break;
    case PS_AUTO: rc = cfx_ps_set_auto(ctx, job, on, timeout); break;
    default: rc = cfx_ps_shards(ctx, job, timeout, &st); break;
    }
    if (rc != CFX_OK) {
        fprintf(stderr, "rdmactl: ps %s: %s\n", sub, cfx_last_error());
    } else if (add_auto) {
        if (r->json)
            printf("{\"job\":\"%s\",\"command\":\"%s\",\"server\":%d,\"map_version\":%u}\n",
                   job, sub, server, v);
        else
            printf("job %s: %s done: server %d (shard map %u)\n", job, sub, server, v);
    } else if (which == PS_AUTO) { /* no map is made: say what was set */
        if (r->json)
            printf("{\"job\":\"%s\",\"command\":\"auto\",\"auto\":%s}\n", job,
                   on ? "true" : "false");
        else
            printf("job %s: automatic rebalancing %s\n", job, on ? "on" : "off");
    } else if (strcmp(sub, "shards")) {
        if (r->json)
            printf("{\"job\":\"%s\",\"command\":\"%s\",\"map_version\":%u}\n", job, sub, v);
        else
            printf("job %s: %s done (shard map %u)\n", job, sub, v);
    } else if (r->json) {
        printf("{\"job\":\"%s\",\"map_version\":%u,\"tensors\":%u,\"blocks\":%u,\"servers\":[",
               job, st.map_version, st.ntensors, st.nblocks);
        for (uint32_t s = 0; s < st.nservers; s++)
            printf("%s{\"index\":%d,\"node\":%u,\"state\":\"%s\",\"blocks\":%u,\"bytes\":%llu,"
                   "\"ns_per_byte\":%.4f,\"straggler\":%s}", s ? "," : "", st.servers[s].index,
                   st.servers[s].node_id, ps_state(states, st.servers[s].state),
                   st.servers[s].blocks, (unsigned long long)st.servers[s].bytes,
                   st.servers[s].ns_per_byte, st.servers[s].straggler ? "true" : "false");
        printf("]}\n");
    } else {
        printf("%-14s : %s\n%-14s : %u\n%-14s : %u tensors, %u blocks\n\n", "job", job,
               "shard map", st.map_version, "tensors", st.ntensors, st.nblocks);
        printf("%6s %6s %-9s %7s %12s %12s %s\n", "server", "node", "state", "blocks", "bytes",
               "ns/byte", "");
        for (uint32_t s = 0; s < st.nservers; s++) {
            const struct cfx_ps_server_info *x = &st.servers[s];
            char b[32];
            printf("%6d %6u %-9s %7u %12s %12.4f %s\n", x->index, x->node_id,
                   ps_state(states, x->state), x->blocks, human_bytes(x->bytes, b, sizeof(b)),
                   x->ns_per_byte, x->straggler ? "straggler" : "");
        }
        /* what a failed server's blocks are now: the map still lists them
         * as its own, and nothing serves them (no replication) */
        for (uint32_t s = 0; s < st.nservers; s++) {
            const struct cfx_ps_server_info *x = &st.servers[s];
            char b[32];
            if (x->state != CFX_PS_SERVER_FAILED)
                continue;
            if (x->blocks)
                printf("\nserver %d (node %u) failed: its %u blocks (%s) are not served; "
                       "requests for them fail naming it\n", x->index, x->node_id, x->blocks,
                       human_bytes(x->bytes, b, sizeof(b)));
            else
                printf("\nserver %d (node %u) failed: it owned no blocks\n", x->index,
                       x->node_id);
        }
    }
    cfx_context_destroy(ctx);
    return rc == CFX_OK ? 0 : 1;
usage:
    fprintf(stderr, "usage: rdmactl ps [--job J] [--timeout MS] add-server N|--auto | remove-server N"
                    " | rebalance | auto on|off | shards\n"
                    "  (options before or after the subcommand)\n"
                    "  --job J       the job (default $CFX_PS_JOB or 'ps'); one that does not\n"
                    "                exist is reported as soon as the coordinator answers\n"
                    "  --timeout MS  deadline of the command (reaching the coordinator, joining,\n"
                    "                the request), 0..2147483647 (default: the request's %d)\n"
                    "  N             a server index (0, 1, ...); auto takes on or off (yes/no)\n",
            RDMACTL_PS_TIMEOUT_MS);
    return TOOL_EXIT_USAGE;
}

static const char *task_state(const struct cfx_ctl_task_rec *t)
{
    if (t->state == CFX_CTL_TASK_QUEUED)
        return "queued";
    if (t->state == CFX_CTL_TASK_PLACED)
        return "running";
    return t->status == CFX_OK ? "ok" : "failed";
}

/*
 * tasks: what the coordinator holds of tasks, live ones and those that ended
 * lately (it remembers the last 1,024), by id: state, the node it runs or
 * ran on, who submitted it, its age, how often it was placed, and for a
 * failed one the status and why.
 */
static int cmd_tasks(struct rdmactl *r, const struct cmd_args *a)
{
    struct cfx_ctl_task_rec *tasks = NULL;
    size_t n = 0;
    char hex[CFX_OBJECT_ID_HEX_LEN], name[4 * 64 + 1], text[4 * CFX_CTL_TASK_TEXT_MAX + 1];
    (void)a;
    if (!ctl_get(r))
        return 1;
    if (cfx__ctl_tasks(r->ctl, &tasks, &n, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("task listing");
    if (r->json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            const struct cfx_ctl_task_rec *t = &tasks[i];
            id_hex(&t->result, hex);
            printf("%s{\"id\":%llu,\"function\":", i ? "," : "", (unsigned long long)t->id);
            json_str(t->name);
            printf(",\"state\":\"%s\",\"node\":%u,\"submitter\":%u,\"placements\":%u,"
                   "\"age_ms\":%u,\"cores\":%u,\"gpus\":%u,\"memory\":%llu,\"inputs\":%u,"
                   "\"results\":%u,\"result\":\"%s\",\"status\":",
                   task_state(t), t->node_id, t->submitter, t->placements, t->age_ms, t->cores,
                   t->gpus, (unsigned long long)t->memory, t->ninputs, t->nresults, hex);
            /* a queued or running task has no status yet (the table's "-") */
            if (t->state == CFX_CTL_TASK_DONE)
                printf("\"%s\"", cfx_errname(t->status));
            else
                printf("null");
            printf(",\"error\":");
            json_str(t->text);
            printf("}");
        }
        printf("]\n");
        free(tasks);
        return 0;
    }
    int wname = 8;
    for (size_t i = 0; i < n; i++)
        wname = CFX_MAX(wname, (int)strlen(esc(tasks[i].name, name, sizeof(name))));
    /* ids count microseconds from the coordinator's start (coord_task.c): 16 digits */
    printf("%16s  %-*s  %-7s  %6s  %9s  %10s  %5s  %s\n", "ID", wname, "FUNCTION", "STATE", "NODE",
           "SUBMITTER", "AGE", "MOVES", "STATUS");
    for (size_t i = 0; i < n; i++) {
        const struct cfx_ctl_task_rec *t = &tasks[i];
        char node[16], age[24];
        if (t->node_id)
            snprintf(node, sizeof(node), "%u", t->node_id);
        else
            snprintf(node, sizeof(node), "-");
        snprintf(age, sizeof(age), "%u.%01u s", t->age_ms / 1000, t->age_ms % 1000 / 100);
        printf("%16llu  %-*s  %-7s  %6s  %9u  %10s  %5u  %s%s%s\n", (unsigned long long)t->id,
               wname, esc(t->name, name, sizeof(name)), task_state(t), node, t->submitter, age,
               t->placements > 1 ? t->placements - 1 : 0,
               t->state == CFX_CTL_TASK_DONE ? cfx_errname(t->status) : "-",
               t->text[0] ? ": " : "", esc_col(t->text, text, sizeof(text), true));
    }
    free(tasks);
    return 0;
}

/*
 * top: a refreshing per-node view.  Each frame asks the coordinator for its
 * status, members and objects, and shows per member the copies it holds
 * (complete, partial: being received) and the uploads it is serving.  On a
 * terminal the screen is redrawn; otherwise (a pipe, a file) or with
 * --once, frames are printed one after another, without escapes.
 */
struct top_row {
    uint32_t complete, partial, uploads;
};

/* Totals of the frame before, per node, for rates (bytes/s between frames). */
struct top_prev {
    uint32_t node_id;
    uint64_t tx, rx;     /* all transports */
    uint64_t at_ns;      /* when the frame was taken */
};

static void load_totals(const struct cfx_msg_load *l, uint64_t *tx, uint64_t *rx)
{
    *tx = *rx = 0;
    for (unsigned t = 0; t < l->ntp && t < CFX_LOAD_TPS_MAX; t++) {
        *tx += l->tp[t].tx_bytes;
        *rx += l->tp[t].rx_bytes;
    }
}

/* "12.3 MB/s" from two totals, "-" without a frame before or when the
 * counters went back (the node restarted under the same id: it cannot). */
static const char *top_rate(const struct top_prev *prev, size_t nprev, uint32_t node_id,
                            uint64_t now_ns, uint64_t total, int rx, char *buf, size_t len)
{
    for (size_t i = 0; i < nprev; i++) {
        const struct top_prev *p = &prev[i];
        uint64_t before = rx ? p->rx : p->tx;
        if (p->node_id != node_id || now_ns <= p->at_ns || total < before)
            continue;
        char b[24]; /* "1023.9 KiB": with "/s" it fits the callers' 32 bytes */
        double rate = (double)(total - before) * 1e9 / (double)(now_ns - p->at_ns);
        snprintf(buf, len, "%s/s", human_bytes((uint64_t)rate, b, sizeof(b)));
        return buf;
    }
    return "-";
}

/* Bytes a PS server (node, job, server) had served at the frame before. */
struct top_ps_prev {
    uint32_t node_id, server;           /* where it runs, its index in the job */
    char job[CFX_CTL_PS_JOB_MAX + 1];   /* its job */
    uint64_t bytes, at_ns;              /* bytes it had served, when the frame was taken */
};

/* One server's row of the PS section: its report and where it came from. */
struct top_ps_row {
    uint32_t node_id;
    const struct cfx_ctl_ps_report *ps;
    uint32_t srv;             /* index into ps->servers */
};

#define TOP_PS_BLOCKS 5 /* heaviest blocks shown per job */

static int top_ps_cmp(const void *a, const void *b)
{
    const struct top_ps_row *x = a, *y = b;
    int c = strcmp(x->ps->servers[x->srv].job, y->ps->servers[y->srv].job);
    if (c)
        return c;
    uint32_t sx = x->ps->servers[x->srv].server, sy = y->ps->servers[y->srv].server;
    if (sx != sy)
        return sx < sy ? -1 : 1;
    return x->node_id < y->node_id ? -1 : x->node_id > y->node_id;
}

/* The heaviest blocks of the job of rows [first, end) (its servers), as
 * their nodes last reported them: up to TOP_PS_BLOCKS, the most bytes first. */
static void top_ps_blocks(const struct top_ps_row *rows, size_t first, size_t end)
{
    const struct top_ps_row *src[TOP_PS_BLOCKS];
    const struct cfx_ctl_ps_block *top[TOP_PS_BLOCKS];
    size_t n = 0;
    for (size_t i = first; i < end; i++) {
        const struct cfx_ctl_ps_report *ps = rows[i].ps;
        for (uint32_t k = 0; k < ps->nblocks; k++) {
            const struct cfx_ctl_ps_block *b = &ps->blocks[k];
            if (b->srv != rows[i].srv || (n == TOP_PS_BLOCKS && b->bytes <= top[n - 1]->bytes))
                continue;
            size_t j = n < TOP_PS_BLOCKS ? n++ : n - 1;
            for (; j > 0 && top[j - 1]->bytes < b->bytes; j--) {
                top[j] = top[j - 1];
                src[j] = src[j - 1];
            }
            top[j] = b;
            src[j] = &rows[i];
        }
    }
    if (!n)
        return;
    printf("  %-6s  %6s  %8s  %10s  %12s\n", "BLOCK", "SERVER", "NODE", "REQUESTS", "BYTES");
    for (size_t j = 0; j < n; j++) {
        char b[32];
        printf("  %-6u  %6u  %8u  %10llu  %12s\n", top[j]->block,
               src[j]->ps->servers[src[j]->srv].server, src[j]->node_id,
               (unsigned long long)top[j]->requests, human_bytes(top[j]->bytes, b, sizeof(b)));
    }
}

/*
 * The parameter-server section of a frame: per job, per server its node,
 * the blocks its map gives it, the requests and bytes it served and its
 * bytes/s since the frame before; then the job's heaviest blocks.  Nothing
 * when no node reports a PS server.  @p prev is replaced by this frame's
 * totals.
 */
static int top_ps(struct rdmactl *r, uint64_t now_ns, struct top_ps_prev **prev, size_t *nprev)
{
    struct cfx_ctl_ps_node *nodes = NULL;
    size_t nn = 0, nrows = 0;
    char job[4 * CFX_CTL_PS_JOB_MAX + 1], b[32], rate[40];

    if (cfx__ctl_ps_loads(r->ctl, &nodes, &nn, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("PS load listing");
    struct top_ps_row *rows = calloc(nn * CFX_CTL_PS_SERVERS_MAX + 1, sizeof(*rows));
    struct top_ps_prev *next = calloc(nn * CFX_CTL_PS_SERVERS_MAX + 1, sizeof(*next));
    if (!rows || !next) {
        free(rows);
        free(next);
        free(nodes);
        fprintf(stderr, "rdmactl: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nn; i++)
        for (uint32_t k = 0; k < nodes[i].ps.nservers; k++)
            rows[nrows++] = (struct top_ps_row){ nodes[i].node_id, &nodes[i].ps, k };
    qsort(rows, nrows, sizeof(*rows), top_ps_cmp);
    for (size_t i = 0, first = 0; i < nrows; i++) {
        const struct cfx_ctl_ps_server *s = &rows[i].ps->servers[rows[i].srv];
        if (i == first)
            printf("\nPS job %s\n  %6s  %8s  %8s  %10s  %12s  %12s\n",
                   esc(s->job, job, sizeof(job)), "SERVER", "NODE", "BLOCKS", "REQUESTS",
                   "BYTES", "BYTES/s");
        snprintf(rate, sizeof(rate), "-");
        for (size_t k = 0; k < *nprev; k++) {
            const struct top_ps_prev *p = &(*prev)[k];
            if (p->node_id == rows[i].node_id && p->server == s->server &&
                !strcmp(p->job, s->job) && now_ns > p->at_ns && s->bytes >= p->bytes) {
                double v = (double)(s->bytes - p->bytes) * 1e9 / (double)(now_ns - p->at_ns);
                snprintf(rate, sizeof(rate), "%s/s", human_bytes((uint64_t)v, b, sizeof(b)));
            }
        }
        printf("  %6u  %8u  %8u  %10llu  %12s  %12s\n", s->server, rows[i].node_id, s->blocks,
               (unsigned long long)s->requests, human_bytes(s->bytes, b, sizeof(b)), rate);
        next[i] = (struct top_ps_prev){ .node_id = rows[i].node_id, .server = s->server,
                                        .bytes = s->bytes, .at_ns = now_ns };
        snprintf(next[i].job, sizeof(next[i].job), "%s", s->job);
        if (i + 1 == nrows || strcmp(s->job, rows[i + 1].ps->servers[rows[i + 1].srv].job)) {
            top_ps_blocks(rows, first, i + 1);
            first = i + 1;
        }
    }
    free(*prev);
    *prev = next;
    *nprev = nrows;
    free(rows);
    free(nodes);
    return 0;
}

static int top_frame(struct rdmactl *r, int tty, struct top_prev **prev, size_t *nprev,
                     struct top_ps_prev **psprev, size_t *npsprev)
{
    struct cfx_ctl_status s;
    struct cfx_node_rec *nodes = NULL;
    struct cfx_ctl_obj_rec *objs = NULL;
    size_t nn = 0, no = 0;
    char b[32], when[40], name[4 * CFX_NODE_NAME_MAX + 1], host[4 * CFX_HOST_NAME_MAX + 1];
    uint32_t partial = 0, uploads = 0, truncated = 0;

    if (cfx__ctl_status(r->ctl, &s, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("status");
    if (cfx__ctl_nodes(r->ctl, &nodes, &nn, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK)
        return fail("node listing");
    if (cfx__ctl_objects(r->ctl, &objs, &no, cfx__deadline_ns(RDMACTL_TIMEOUT_MS)) != CFX_OK) {
        free(nodes);
        return fail("object listing");
    }
    struct top_row *rows = calloc(nn ? nn : 1, sizeof(*rows));
    if (!rows) {
        free(nodes);
        free(objs);
        fprintf(stderr, "rdmactl: out of memory\n");
        return 1;
    }
    uint64_t obytes = 0;
    for (size_t i = 0; i < no; i++) {
        const struct cfx_ctl_obj_rec *o = &objs[i];
        obytes += o->size;
        if (o->nholders > CFX_ARRAY_SIZE(o->holders))
            truncated++;
        for (uint32_t j = 0; j < o->nholders && j < CFX_ARRAY_SIZE(o->holders); j++) {
            const struct cfx_obj_holder *h = &o->holders[j];
            partial += !h->complete;
            uploads += h->uploads;
            for (size_t k = 0; k < nn; k++)
                if (nodes[k].node_id == h->node_id) {
                    rows[k].complete += h->complete ? 1 : 0;
                    rows[k].partial += h->complete ? 0 : 1;
                    rows[k].uploads += h->uploads;
                }
        }
    }
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (tty)
        fputs("\033[H\033[2J", stdout);
    printf("conflux top  %s  coordinator %s  up %llu s\n", when, r->coord,
           (unsigned long long)(s.uptime_ms / 1000));
    /* workers by state, as in status (from the listing: the STATUS counts
     * take observers for members and members that left for dead) */
    struct member_counts m;
    char left[32] = "";
    member_count(nodes, nn, &m);
    if (m.left)
        snprintf(left, sizeof(left), ", %u left", m.left);
    printf("members: %u alive, %u dead%s   objects: %u (%s)   inline: %s\n", m.alive, m.dead,
           left, s.objects, human_bytes(obytes, b, sizeof(b)),
           human_bytes(s.inline_bytes, when, sizeof(when)));
    printf("transfers: %u copies being received, %u uploads%s\n\n", partial, uploads,
           truncated ? " (objects of more than 16 holders counted by their first 16)" : "");
    int wname = 4, whost = 4;
    for (size_t i = 0; i < nn; i++) {
        if (!node_listed(&nodes[i], 0))
            continue;
        wname = CFX_MAX(wname, (int)strlen(esc(nodes[i].name, name, sizeof(name))));
        whost = CFX_MAX(whost, (int)strlen(esc(nodes[i].host, host, sizeof(host))));
    }
    /* SENT/s and RECV/s: all transports, between this frame and the one before;
     * IN/OUT: transfers the node reported receiving and serving */
    printf("%6s  %-*s  %-*s  %10s  %8s  %8s  %8s  %12s  %12s  %4s  %4s\n", "ID", wname, "NAME",
           whost, "HOST", "LAST SEEN", "COMPLETE", "PARTIAL", "UPLOADS", "SENT/s", "RECV/s", "IN",
           "OUT");
    uint64_t now_ns = cfx__now_ns();
    struct top_prev *next = calloc(nn ? nn : 1, sizeof(*next));
    size_t nnext = 0;
    for (size_t i = 0; i < nn; i++) {
        const struct cfx_node_rec *x = &nodes[i];
        char seen[24], txr[32], rxr[32];
        uint64_t tx, rx;
        if (!node_listed(x, 0))
            continue;
        load_totals(&x->load, &tx, &rx);
        snprintf(seen, sizeof(seen), "%u ms", x->last_seen_ms);
        printf("%6u  %-*s  %-*s  %10s  %8u  %8u  %8u  %12s  %12s  %4u  %4u\n", x->node_id, wname,
               esc(x->name, name, sizeof(name)), whost, esc(x->host, host, sizeof(host)), seen,
               rows[i].complete, rows[i].partial, rows[i].uploads,
               top_rate(*prev, *nprev, x->node_id, now_ns, tx, 0, txr, sizeof(txr)),
               top_rate(*prev, *nprev, x->node_id, now_ns, rx, 1, rxr, sizeof(rxr)),
               x->load.xfers_in_active, x->load.uploads_active);
        if (next)
            next[nnext++] = (struct top_prev){ x->node_id, tx, rx, now_ns };
    }
    int rc = top_ps(r, now_ns, psprev, npsprev);
    fflush(stdout);
    if (next) { /* else the next frame shows no rates: nothing else lost */
        free(*prev);
        *prev = next;
        *nprev = nnext;
    }
    free(rows);
    free(nodes);
    free(objs);
    return rc;
}

static int cmd_top(struct rdmactl *r, const struct cmd_args *a)
{
    int once = a->once, interval = 1000, count = 0;
    if (a->interval && tool_arg_int("rdmactl top", "--interval", a->interval, 100, 3600000,
                                    "milliseconds", &interval))
        return TOOL_EXIT_USAGE;
    if (a->count &&
        tool_arg_int("rdmactl top", "--count", a->count, 1, INT_MAX, "a frame count", &count))
        return TOOL_EXIT_USAGE;
    if (r->json) {
        fprintf(stderr, "rdmactl top: --json is not supported: use status, nodes and objects "
                "for machines\n");
        return TOOL_EXIT_USAGE;
    }
    if (once && a->count && count != 1) {
        fprintf(stderr, "rdmactl top: --once prints one frame, --count %d asks for %d: drop "
                "one (without a terminal, frames follow each other without escapes)\n", count,
                count);
        return TOOL_EXIT_USAGE;
    }
    if (once)
        count = 1;
    if (!ctl_get(r))
        return 1;
    int tty = !once && isatty(STDOUT_FILENO);
    struct top_prev *prev = NULL; /* the frame before: rates from the second frame on */
    struct top_ps_prev *psprev = NULL;
    size_t nprev = 0, npsprev = 0;
    int rc = 0;
    for (int i = 0; !count || i < count; i++) {
        if (i && !tty)
            putchar('\n');
        rc = top_frame(r, tty, &prev, &nprev, &psprev, &npsprev);
        if (rc || (count && i + 1 == count))
            break;
        poll(NULL, 0, interval); /* the refresh period, not a wait for anything */
    }
    free(prev);
    free(psprev);
    return rc;
}

static const struct rdmactl_cmd commands[] = {
    { "status", cmd_status, "coordinator summary: version, uptime, members by state, objects",
      0, 0, 0, "status" },
    { "nodes", cmd_nodes, "alive cluster members; --all: also observers and the recently dead "
      "or gone", 0, OPT_ALL, 0, "nodes [--all]" },
    { "objects", cmd_objects, "object directory: names, sizes and holders", 0, 0, 0, "objects" },
    { "tasks", cmd_tasks, "tasks: queued, running and lately ended, where, and how they ended",
      0, 0, 0, "tasks" },
    { "top", cmd_top, "live per-node view: members, copies held, transfers; --once for scripts",
      0, OPT_ONCE | OPT_INTERVAL | OPT_COUNT, 0, "top [--once] [--interval MS] [--count N]" },
    { "devices", cmd_devices, "local RDMA devices, ports, GIDs, MTU; DPDK ports; GPU support", 1,
      0, 0, "devices" },
    { "ps", cmd_ps, "parameter server: add-server N|--auto | remove-server | rebalance | auto | "
      "shards", 0, OPT_JOB | OPT_TIMEOUT | OPT_AUTO, INT_MAX, /* cmd_ps checks them */
      "ps [--job J] [--timeout MS] add-server N|--auto | remove-server N | rebalance | "
      "auto on|off | shards" },
};

#define GLOBAL_USAGE "rdmactl [--coord HOST:PORT] [--token-file F | --token T] [--json]"

static void usage(FILE *f)
{
    fprintf(f, "usage: " GLOBAL_USAGE " COMMAND [OPTIONS] [ARGS]\n\n"
               "  --coord HOST:PORT  coordinator (default $CFX_COORD)\n"
               "  --token-file F     read the cluster token from F (default $CFX_TOKEN_FILE)\n"
               "  --token T          cluster token (default $CFX_TOKEN or $CFX_TOKEN_FILE);\n"
               "                     visible in ps: prefer --token-file\n"
               "  --json             machine-readable output (every command but top)\n"
               "These global options may also follow the command, as kubectl's do:\n"
               "'rdmactl objects --json' is 'rdmactl --json objects'.  A command refuses an\n"
               "option or argument it does not take (exit 2); 'rdmactl COMMAND --help' shows\n"
               "its own.\n\ncommands:\n");
    for (size_t i = 0; i < CFX_ARRAY_SIZE(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nExit status: 0 ok, 1 the coordinator could not be reached or answered an\n"
               "error (devices: no device found), 2 a usage error.\n");
}

/* rdmactl COMMAND --help */
static void cmd_usage(const struct rdmactl_cmd *cmd)
{
    if (cmd->fn == cmd_top) /* the one command without --json */
        printf("usage: rdmactl [--coord HOST:PORT] [--token-file F | --token T] %s\n\n%s\n",
               cmd->usage, cmd->help);
    else
        printf("usage: " GLOBAL_USAGE " %s\n\n%s\n", cmd->usage, cmd->help);
    if (cmd->fn == cmd_status)
        printf("  nodes: workers alive, dead (lost) and left (in good order), the states\n"
               "  'rdmactl nodes --all' shows; the coordinator lists the dead and gone for a\n"
               "  while (60 s by default).  Observers (tools' connections) are counted apart,\n"
               "  while connected.  --json: nodes_alive, nodes_dead, nodes_left, observers.\n");
    if (cmd->opts & OPT_ALL)
        printf("  --all          also observers (tools' connections, marked *) and the members\n"
               "                 that died or left lately (the coordinator forgets them)\n");
    if (cmd->opts & OPT_ONCE)
        printf("  --once         one frame, no terminal escapes (for scripts)\n"
               "  --interval MS  refresh period, 100..3600000 (default 1000)\n"
               "  --count N      stop after N frames (default: until interrupted)\n"
               "  (no --json: use status, nodes and objects for machines)\n");
    if (cmd->opts & OPT_JOB)
        printf("  --job J        the job (default $CFX_PS_JOB or 'ps'); one that does not\n"
               "                 exist is reported as soon as the coordinator answers\n"
               "  --timeout MS   deadline of the command (reaching the coordinator, joining,\n"
               "                 the request), 0..2147483647 (default: the request's %d)\n"
               "  N              a server index (0, 1, ...); auto takes on or off (yes/no)\n",
               RDMACTL_PS_TIMEOUT_MS);
    printf("The global options (--coord, --token-file, --token, --json) may come before or "
           "after the\n"
           "command; options and arguments may come in any order; '--' ends the options.\n");
}

static void token_drop(char *copy)
{
    if (copy) {
        explicit_bzero(copy, strlen(copy));
        free(copy);
    }
}

/* --token's value: copied, and the argv bytes overwritten (ps shows them
 * only until here).  0, or -1 out of memory. */
/* --token's value: copied, and the argv bytes overwritten.  0; 2 (usage)
 * for an empty one, which would fall back to $CFX_TOKEN unsaid; -1 out of
 * memory. */
static int take_token(char *val, char **copy)
{
    if (tool_arg_nonempty("rdmactl", "--token", val, "a token"))
        return TOOL_EXIT_USAGE;
    fprintf(stderr, "rdmactl: warning: --token puts the cluster token on the command "
            "line, where ps and /proc/PID/cmdline show it; use --token-file\n");
    token_drop(*copy); /* a second --token: the first one's bytes go too */
    *copy = strdup(val);
    if (!*copy) {
        fprintf(stderr, "rdmactl: out of memory\n");
        return -1;
    }
    memset(val, '*', strlen(val));
    return 0;
}

/* An option after the command: the global ones (also before it) and the
 * command's own. */
static const struct {
    const char *name;
    char short_name; /* 0: none */
    int has_arg;
    unsigned bit;    /* OPT_*; 0 for a global option */
} cmd_opts[] = {
    { "coord", 'c', 1, 0 },          { "token", 't', 1, 0 },       { "json", 'j', 0, 0 },
    { "token-file", 'f', 1, 0 },
    { "help", 'h', 0, 0 },           { "all", 0, 0, OPT_ALL },     { "once", 0, 0, OPT_ONCE },
    { "interval", 0, 1, OPT_INTERVAL }, { "count", 0, 1, OPT_COUNT }, { "job", 0, 1, OPT_JOB },
    { "timeout", 0, 1, OPT_TIMEOUT }, { "auto", 0, 0, OPT_AUTO },
};

/*
 * Scan the arguments after @p cmd's name (argv[1..argc)): its options, the
 * global ones, and its operands, in any order ("--" ends the options; an
 * argument '-' followed by a digit is an operand: a negative number, which
 * the command then refuses by name).  0; 1 after --help was printed (exit
 * 0); TOOL_EXIT_USAGE after one line naming what was refused; -1 out of
 * memory.
 */
static int cmd_scan(struct rdmactl *r, const struct rdmactl_cmd *cmd, int argc, char **argv,
                    struct cmd_args *a, char **token_copy)
{
    int help = 0, ends = 0;
    memset(a, 0, sizeof(*a));
    a->name = cmd->name;
    a->args = calloc((size_t)argc + 1, sizeof(*a->args));
    if (!a->args) {
        fprintf(stderr, "rdmactl: out of memory\n");
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (ends || arg[0] != '-' || !arg[1] || (arg[1] >= '0' && arg[1] <= '9')) {
            if (a->nargs >= cmd->max_args) {
                fprintf(stderr, "rdmactl %s: unexpected argument '%s' (%s takes %s; see "
                        "rdmactl %s --help)\n", cmd->name, arg, cmd->name,
                        cmd->opts ? "options only" : "no argument", cmd->name);
                return TOOL_EXIT_USAGE;
            }
            a->args[a->nargs++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            ends = 1;
            continue;
        }
        /* --name, --name=value, -x, -xVALUE */
        const char *name = arg[1] == '-' ? arg + 2 : NULL;
        size_t nlen = name ? strcspn(name, "=") : 0;
        int k = -1;
        for (size_t j = 0; j < CFX_ARRAY_SIZE(cmd_opts) && k < 0; j++) {
            if (cmd_opts[j].bit && !(cmd->opts & cmd_opts[j].bit))
                continue;
            if (name ? nlen == strlen(cmd_opts[j].name) && !strncmp(name, cmd_opts[j].name, nlen)
                     : cmd_opts[j].short_name && arg[1] == cmd_opts[j].short_name &&
                           (!arg[2] || cmd_opts[j].has_arg))
                k = (int)j;
        }
        if (k < 0) {
            fprintf(stderr, "rdmactl %s: unknown option '%s' (see rdmactl %s --help)\n",
                    cmd->name, arg, cmd->name);
            return TOOL_EXIT_USAGE;
        }
        char *val = NULL;
        if (name && name[nlen] == '=') {
            if (!cmd_opts[k].has_arg) {
                fprintf(stderr, "rdmactl %s: --%s takes no value ('%s')\n", cmd->name,
                        cmd_opts[k].name, arg);
                return TOOL_EXIT_USAGE;
            }
            val = (char *)name + nlen + 1;
        } else if (cmd_opts[k].has_arg) {
            if (!name && arg[2]) {
                val = arg + 2;
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                fprintf(stderr, "rdmactl %s: %s needs a value\n", cmd->name, arg);
                return TOOL_EXIT_USAGE;
            }
        }
        switch (cmd_opts[k].short_name ? cmd_opts[k].short_name : (int)cmd_opts[k].bit) {
        case 'c':
            /* named as given, not "no coordinator: set CFX_COORD" */
            if (tool_arg_nonempty("rdmactl", "--coord", val, "HOST:PORT"))
                return TOOL_EXIT_USAGE;
            r->coord = val;
            break;
        case 't': {
            int t = take_token(val, token_copy);
            if (t)
                return t;
            break;
        }
        case 'f':
            if (tool_arg_nonempty("rdmactl", "--token-file", val, "a file name"))
                return TOOL_EXIT_USAGE;
            r->token_file = val;
            break;
        case 'j': r->json = 1; break;
        case 'h': help = 1; break;
        case OPT_ALL: a->all = 1; break;
        case OPT_ONCE: a->once = 1; break;
        case OPT_INTERVAL: a->interval = val; break;
        case OPT_COUNT: a->count = val; break;
        case OPT_JOB: a->job = val; break;
        case OPT_TIMEOUT: a->timeout = val; break;
        case OPT_AUTO: a->autosel = 1; break;
        default: break;
        }
    }
    if (help) {
        cmd_usage(cmd);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "coord", required_argument, NULL, 'c' },
        { "token", required_argument, NULL, 't' },
        { "token-file", required_argument, NULL, 'f' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    struct rdmactl r = { .coord = NULL };
    char *token_copy = NULL; /* --token's value, freed once loaded */
    struct cmd_args a;
    int c;

    /* "+": stop at the command; what follows it is scanned with its own options. */
    while ((c = getopt_long(argc, argv, "+c:t:f:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            /* named as given, not "no coordinator: set CFX_COORD" */
            if (tool_arg_nonempty("rdmactl", "--coord", optarg, "HOST:PORT"))
                return TOOL_EXIT_USAGE;
            r.coord = optarg;
            break;
        case 't': {
            int t = take_token(optarg, &token_copy);
            if (t)
                return t < 0 ? 1 : t;
            break;
        }
        case 'f':
            if (tool_arg_nonempty("rdmactl", "--token-file", optarg, "a file name"))
                return TOOL_EXIT_USAGE;
            r.token_file = optarg;
            break;
        case 'j': r.json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "rdmactl: no command given\n");
        usage(stderr);
        return 2;
    }
    const struct rdmactl_cmd *cmd = NULL;
    for (size_t i = 0; i < CFX_ARRAY_SIZE(commands); i++)
        if (!strcmp(argv[optind], commands[i].name))
            cmd = &commands[i];
    if (!cmd) {
        fprintf(stderr, "rdmactl: unknown command '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    int status = cmd_scan(&r, cmd, argc - optind, argv + optind, &a, &token_copy);
    if (status) {
        free(a.args);
        token_drop(token_copy);
        return status == 1 ? 0 : status < 0 ? 1 : status;
    }
    if (cmd->local) {
        token_drop(token_copy);
        status = cmd->fn(&r, &a);
        free(a.args);
        return status;
    }
    /* A command's own usage errors (ps --timeout -1, top --interval 5) come
     * first, as with getopt tools, not after "no coordinator" or "no cluster
     * token": a first pass runs the command up to where it would reach the
     * coordinator (ctl_get() answers NULL then, having noted it). */
    r.check_only = 1;
    status = cmd->fn(&r, &a);
    r.check_only = 0;
    if (!r.checked) {
        free(a.args);
        token_drop(token_copy);
        return status;
    }
    if (!r.coord)
        r.coord = getenv("CFX_COORD");
    if (!r.coord || !*r.coord) {
        fprintf(stderr, "rdmactl: no coordinator: pass --coord HOST:PORT or set CFX_COORD\n");
        free(a.args);
        token_drop(token_copy);
        return 2;
    }
    /* a value that is no address at all (no port, a host that does not
     * parse or resolve) is a usage error, not a coordinator that cannot be
     * reached (exit 1 said so) */
    if (tool_arg_hostport("rdmactl", "--coord (or CFX_COORD)", r.coord)) {
        free(a.args);
        token_drop(token_copy);
        return 2;
    }
    /* so is a CFX_SECURE that names no mode (every command but devices
     * reads it: ctl_get, and rdmactl ps's context) */
    int smode;
    if (cfx__seal_mode_parse(getenv("CFX_SECURE"), &smode) != CFX_OK) {
        fprintf(stderr, "rdmactl: %s\n", cfx_last_error());
        free(a.args);
        token_drop(token_copy);
        return 2;
    }
    if (r.token_file && token_copy) {
        fprintf(stderr, "rdmactl: give --token-file or --token, not both\n");
        free(a.args);
        token_drop(token_copy);
        return 2;
    }
    /* --token-file as conflux-coord and cfx_run take it: the file's first line */
    int lrc = r.token_file ? cfx__token_load_file(r.token_file, r.token_file, r.token,
                                                  sizeof(r.token))
                           : cfx__token_load(token_copy, r.token, sizeof(r.token));
    token_drop(token_copy);
    if (lrc != CFX_OK) {
        fprintf(stderr, "rdmactl: %s%s\n", r.token_file ? "--token-file: " : "",
                cfx_last_error());
        free(a.args);
        return 2;
    }
    status = cmd->fn(&r, &a);
    cfx__ctl_close(r.ctl);
    free(a.args);
    return status;
}

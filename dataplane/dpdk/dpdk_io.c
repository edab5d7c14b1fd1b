/*
 * dpdk transport: EAL, one port with one rx/tx queue pair and its mbuf
 * pool, burst receive and batched transmit of the frames of dpdk_frame.c.
 *
 * Built only with DPDK (CFX_HAVE_DPDK).  Frames are built by copying into
 * an mbuf; zero-copy transmit from registered memory (external mbufs)
 * belongs to the transport above, which knows the registrations.
 */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dpdk_io.h"

#define BURST        32
#define EAL_ARGV_MAX 64

struct cfx__dpdk_port {
    uint16_t port_id;            /* ethdev port */
    struct rte_mempool *pool;    /* mbufs of both queues */
    struct cfx__dpdk_addr local; /* our MAC, IP and UDP port */
    struct rte_mbuf *txb[BURST]; /* frames built, not yet sent */
    unsigned ntx;                /* in txb */
    uint32_t rx_drop_ppm;        /* test hook */
    uint64_t rng;                /* its PRNG state */
    char name[RTE_ETH_NAME_MAX_LEN];
    struct cfx__dpdk_port_stats stats;
};

/* EAL is process-wide: one initialisation, whose result every caller gets. */
static pthread_mutex_t eal_lock = PTHREAD_MUTEX_INITIALIZER;
static int eal_state;       /* 0: not tried; 1: up; negative: the failure */
static char *eal_args_kept; /* EAL keeps pointers into its argv: ours lives on */

/* The runtime directory EAL made for a file prefix of our own (ending in
 * our pid: no other process shares it) goes at exit instead of piling up
 * under /var/run/dpdk. */
static char eal_rundir[512];

static void eal_rundir_remove(void)
{
    DIR *d = opendir(eal_rundir);
    struct dirent *e;
    char path[800];
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof(path), "%s/%s", eal_rundir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(eal_rundir);
}

int cfx__dpdk_eal_init(const char *args)
{
    bool own_prefix = false;
    char defaults[512];
    char *copy = NULL;
    char *argv[EAL_ARGV_MAX];
    int argc = 0, rc;
    cpu_set_t cpus;

    pthread_mutex_lock(&eal_lock);
    if (eal_state) {
        rc = eal_state > 0 ? CFX_OK : eal_state;
        goto out_unlock;
    }
    if (!args)
        args = getenv("CFX_DPDK_EAL");
    if (!args) {
        const char *vdev = getenv("CFX_DPDK_VDEV");
        snprintf(defaults, sizeof(defaults),
                 "--no-huge -m 512 --no-pci --file-prefix=cfx%d -l 0 --log-level=*:warning "
                 "--no-telemetry%s%s",
                 (int)getpid(), vdev ? " --vdev=" : "", vdev ? vdev : "");
        args = defaults;
    }
    /* a file prefix that ends in our pid is ours alone (the default one, and
     * the tests'): its runtime directory is removed at exit */
    const char *fp = strstr(args, "--file-prefix=");
    if (fp) {
        char pid[16];
        size_t n = strcspn(fp, " \t");
        int pl = snprintf(pid, sizeof(pid), "%d", (int)getpid());
        own_prefix = n > (size_t)pl && !strncmp(fp + n - (size_t)pl, pid, (size_t)pl);
    }
    copy = strdup(args);
    if (!copy) {
        rc = CFX_ERR_NOMEM;
        goto out_unlock;
    }
    argv[argc++] = "conflux";
    for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok;
         tok = strtok_r(NULL, " \t", &save)) {
        if (argc == EAL_ARGV_MAX - 1) {
            CFX_LOG(ERR, DPDK, "CFX_DPDK_EAL: more than %d arguments", EAL_ARGV_MAX - 2);
            rc = eal_state = CFX_ERR_INVALID;
            goto out_free;
        }
        argv[argc++] = tok;
    }
    argv[argc] = NULL;

    /* EAL pins the calling thread to its main lcore: give it its CPUs back */
    bool have_cpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0;
    if (rte_eal_init(argc, argv) < 0) {
        CFX_LOG(ERR, DPDK, "rte_eal_init(%s) failed: %s", args, rte_strerror(rte_errno));
        rc = eal_state = CFX_ERR_NO_DEVICE;
        goto out_free;
    }
    if (have_cpus)
        sched_setaffinity(0, sizeof(cpus), &cpus);
    eal_state = 1;
    rc = CFX_OK;
    if (own_prefix) {
        snprintf(eal_rundir, sizeof(eal_rundir), "%s", rte_eal_get_runtime_dir());
        atexit(eal_rundir_remove);
    }
    CFX_LOG(INFO, DPDK, "EAL up (%s), %u ports", args, rte_eth_dev_count_avail());
out_free:
    if (rc)
        free(copy);
    else
        eal_args_kept = copy;
out_unlock:
    pthread_mutex_unlock(&eal_lock);
    return rc;
}

int cfx__dpdk_ports_print(FILE *out, int json)
{
    uint16_t pid;
    int n = 0;

    if (json)
        fputc('[', out);
    if ((getenv("CFX_DPDK_EAL") || getenv("CFX_DPDK_VDEV")) && cfx__dpdk_eal_init(NULL) == CFX_OK) {
        RTE_ETH_FOREACH_DEV(pid) {
            char name[RTE_ETH_NAME_MAX_LEN];
            struct rte_ether_addr mac;
            struct rte_eth_link link;
            if (rte_eth_dev_get_name_by_port(pid, name) != 0 ||
                rte_eth_macaddr_get(pid, &mac) != 0)
                continue;
            bool up = rte_eth_link_get_nowait(pid, &link) == 0 &&
                      link.link_status == RTE_ETH_LINK_UP;
            char m[18];
            snprintf(m, sizeof(m), "%02x:%02x:%02x:%02x:%02x:%02x", mac.addr_bytes[0],
                     mac.addr_bytes[1], mac.addr_bytes[2], mac.addr_bytes[3], mac.addr_bytes[4],
                     mac.addr_bytes[5]);
            if (json)
                fprintf(out, "%s{\"name\": \"%s\", \"mac\": \"%s\", \"link\": %s}",
                        n ? ", " : "", name, m, up ? "true" : "false");
            else
                fprintf(out, "dpdk port %s: mac %s, link %s\n", name, m, up ? "up" : "down");
            n++;
        }
    }
    if (json)
        fputc(']', out);
    return n;
}

int cfx__dpdk_port_name(unsigned n, char *name, size_t len)
{
    uint16_t pid;
    char buf[RTE_ETH_NAME_MAX_LEN];

    if (eal_state <= 0)
        return CFX_ERR_NOT_FOUND;
    RTE_ETH_FOREACH_DEV(pid) {
        if (n--)
            continue;
        if (rte_eth_dev_get_name_by_port(pid, buf) != 0)
            return CFX_ERR_NOT_FOUND;
        snprintf(name, len, "%s", buf);
        return CFX_OK;
    }
    return CFX_ERR_NOT_FOUND;
}

int cfx__dpdk_port_open(const struct cfx__dpdk_port_params *p, struct cfx__dpdk_port **out)
{
    struct cfx__dpdk_port *port;
    struct rte_eth_conf conf;
    struct rte_ether_addr mac;
    char pool_name[RTE_MEMPOOL_NAMESIZE];
    uint16_t pid = 0, nb_desc = p->nb_desc ? p->nb_desc : 512;
    int rc;

    *out = NULL;
    if (eal_state <= 0)
        return CFX_ERR_NO_DEVICE;
    if (p->name) {
        if (rte_eth_dev_get_port_by_name(p->name, &pid) != 0) {
            CFX_LOG(ERR, DPDK, "no DPDK port %s", p->name);
            return CFX_ERR_NO_DEVICE;
        }
    } else {
        RTE_ETH_FOREACH_DEV(pid) break;
        if (pid >= RTE_MAX_ETHPORTS || !rte_eth_dev_is_valid_port(pid)) {
            CFX_LOG(ERR, DPDK, "no DPDK port (give one with --vdev in CFX_DPDK_EAL)");
            return CFX_ERR_NO_DEVICE;
        }
    }
    port = calloc(1, sizeof(*port));
    if (!port)
        return CFX_ERR_NOMEM;
    port->port_id = pid;
    port->rx_drop_ppm = p->rx_drop_ppm;
    port->rng = p->rx_drop_seed ? p->rx_drop_seed : 1;
    rte_eth_dev_get_name_by_port(pid, port->name);

    snprintf(pool_name, sizeof(pool_name), "cfx_mb%u", pid);
    port->pool = rte_pktmbuf_pool_create(
        pool_name, p->nb_mbufs ? p->nb_mbufs : 4095, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
        (int)rte_eth_dev_socket_id(pid) < 0 ? (int)rte_socket_id() : rte_eth_dev_socket_id(pid));
    if (!port->pool) {
        CFX_LOG(ERR, DPDK, "port %s: mbuf pool: %s", port->name, rte_strerror(rte_errno));
        rc = CFX_ERR_NOMEM;
        goto err_free;
    }
    memset(&conf, 0, sizeof(conf));
    if ((rc = rte_eth_dev_configure(pid, 1, 1, &conf)) != 0 ||
        (rc = rte_eth_rx_queue_setup(pid, 0, nb_desc, rte_eth_dev_socket_id(pid), NULL,
                                     port->pool)) != 0 ||
        (rc = rte_eth_tx_queue_setup(pid, 0, nb_desc, rte_eth_dev_socket_id(pid), NULL)) != 0) {
        CFX_LOG(ERR, DPDK, "port %s: queue setup: %s", port->name, rte_strerror(-rc));
        rc = CFX_ERR_IO;
        goto err_pool;
    }
    uint64_t start_until = cfx__deadline_ns(p->start_wait_ms);
    while ((rc = rte_eth_dev_start(pid)) != 0 && cfx__now_ns() < start_until)
        usleep(10000);
    if (rc != 0) {
        CFX_LOG(ERR, DPDK, "port %s: start: %s", port->name, rte_strerror(-rc));
        rc = CFX_ERR_IO;
        goto err_pool;
    }
    rte_eth_macaddr_get(pid, &mac);
    memcpy(port->local.mac, mac.addr_bytes, 6);
    port->local.ip = p->ip;
    port->local.port = p->udp_port ? p->udp_port : CFX_DPDK_UDP_PORT;
    *out = port;
    return CFX_OK;

err_pool:
    rte_mempool_free(port->pool);
err_free:
    free(port);
    return rc;
}

void cfx__dpdk_port_close(struct cfx__dpdk_port *port)
{
    if (!port)
        return;
    rte_pktmbuf_free_bulk(port->txb, port->ntx);
    rte_eth_dev_stop(port->port_id);
    rte_eth_dev_close(port->port_id);
    rte_mempool_free(port->pool);
    free(port);
}

void cfx__dpdk_port_addr(const struct cfx__dpdk_port *port, struct cfx__dpdk_addr *out)
{
    *out = port->local;
}

int cfx__dpdk_port_restart(struct cfx__dpdk_port *port)
{
    cfx__dpdk_port_flush(port);
    rte_eth_dev_stop(port->port_id);
    int rc = rte_eth_dev_start(port->port_id);
    if (rc != 0) {
        CFX_LOG(WARN, DPDK, "port %s: restart: %s", port->name, rte_strerror(-rc));
        return CFX_ERR_IO;
    }
    return CFX_OK;
}

int cfx__dpdk_port_link_up(struct cfx__dpdk_port *port)
{
    struct rte_eth_link link;
    if (rte_eth_link_get_nowait(port->port_id, &link) != 0)
        return 0;
    return link.link_status == RTE_ETH_LINK_UP;
}

int cfx__dpdk_port_flush(struct cfx__dpdk_port *port)
{
    unsigned n = port->ntx;
    if (!n)
        return 0;
    uint16_t sent = rte_eth_tx_burst(port->port_id, 0, port->txb, (uint16_t)n);
    if (sent < n) {
        /* a full ring loses them: to the layer above, packets lost on the wire */
        rte_pktmbuf_free_bulk(port->txb + sent, n - sent);
        port->stats.tx_full += n - sent;
    }
    port->stats.tx += sent;
    port->ntx = 0;
    return sent;
}

int cfx__dpdk_port_tx(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *dst,
                      const struct cfx__dpdk_hdr *h, const void *payload)
{
    struct rte_mbuf *m = rte_pktmbuf_alloc(port->pool);
    if (unlikely(!m))
        return CFX_ERR_AGAIN;
    size_t cap = rte_pktmbuf_tailroom(m);
    int len =
        cfx__dpdk_frame_build(rte_pktmbuf_mtod(m, void *), cap, &port->local, dst, h, payload);
    if (unlikely(len < 0)) {
        rte_pktmbuf_free(m);
        return len;
    }
    m->data_len = (uint16_t)len;
    m->pkt_len = (uint32_t)len;
    port->txb[port->ntx++] = m;
    if (port->ntx == BURST)
        cfx__dpdk_port_flush(port);
    return CFX_OK;
}

static bool rx_drop(struct cfx__dpdk_port *port)
{
    if (!port->rx_drop_ppm)
        return false;
    /* xorshift64 */
    uint64_t x = port->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    port->rng = x;
    return x % 1000000 < port->rx_drop_ppm;
}

int cfx__dpdk_port_rx(struct cfx__dpdk_port *port, cfx__dpdk_rx_cb cb, void *ctx)
{
    struct rte_mbuf *rxb[BURST];
    uint16_t n = rte_eth_rx_burst(port->port_id, 0, rxb, BURST);
    int taken = 0;

    for (uint16_t i = 0; i < n; i++) {
        struct rte_mbuf *m = rxb[i];
        struct cfx__dpdk_addr src;
        struct cfx__dpdk_hdr h;
        const void *payload;
        const char *why;

        if (rx_drop(port)) {
            port->stats.rx_dropped++;
            continue;
        }
        if (unlikely(m->nb_segs != 1) ||
            cfx__dpdk_frame_parse(rte_pktmbuf_mtod(m, const void *), m->data_len, &port->local,
                                  &src, &h, &payload, &why) != CFX_OK) {
            port->stats.rx_refused++;
            continue;
        }
        port->stats.rx++;
        taken++;
        cb(ctx, &src, &h, payload);
    }
    rte_pktmbuf_free_bulk(rxb, n);
    return taken;
}

void cfx__dpdk_port_get_stats(const struct cfx__dpdk_port *port, struct cfx__dpdk_port_stats *out)
{
    *out = port->stats;
}

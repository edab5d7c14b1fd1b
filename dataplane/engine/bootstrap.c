/*
 * The coordinator from a launcher's environment: torchrun (MASTER_ADDR,
 * MASTER_PORT, RANK), Slurm (SLURM_PROCID) or Open MPI
 * (OMPI_COMM_WORLD_RANK) with MASTER_ADDR, and no CFX_COORD.  Rank 0 hosts
 * an embedded coordinator in its own process (as cfx_run does); the other
 * ranks connect to it, retrying until their deadline (client.c
 * connect_first), so the ranks may start in any order.
 *
 * Port: CFX_COORD_PORT, else MASTER_PORT + 1 (torchrun's own rendezvous
 * holds MASTER_PORT itself).  The coordinator binds MASTER_ADDR (resolved):
 * whoever can reach that address may connect, and learns nothing before it
 * proves the cluster token (control/auth.c), which rank 0 must have from
 * CFX_TOKEN or CFX_TOKEN_FILE: without one it refuses to host.
 */
#include "engine.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/coord.h"


static int env_port(const char *name, long add, uint16_t *out)
{
    const char *v = getenv(name);
    char *end;
    errno = 0;
    long p = strtol(v, &end, 10);
    if (errno || end == v || *end || p <= 0 || p + add > 65535)
        return cfx__err(CFX_ERR_INVALID, "%s=%s is not a port%s", name, v,
                        add ? " below 65535 (the coordinator takes MASTER_PORT+1)" : "");
    *out = (uint16_t)(p + add);
    return CFX_OK;
}

int cfx__boot_resolve(struct cfx_boot *b, char *coord, size_t len)
{
    const char *master = getenv("MASTER_ADDR");
    const char *cport = getenv("CFX_COORD_PORT");
    const char *mport = getenv("MASTER_PORT");
    int rc;

    memset(b, 0, sizeof(*b));
    b->rank = -1;
    if (!master || !*master)
        return cfx__err(CFX_ERR_INVALID,
                        "no coordinator configured: set CFX_COORD=host:port, "
                        "or MASTER_ADDR and MASTER_PORT as torchrun does (rank 0 then hosts "
                        "it; under Slurm or Open MPI set MASTER_ADDR to the first host), or "
                        "run under cfx_run, which starts one");
    if (strlen(master) >= sizeof(b->master))
        return cfx__err(CFX_ERR_INVALID, "MASTER_ADDR=%s is too long", master);
    snprintf(b->master, sizeof(b->master), "%s", master);
    if (cport && *cport)
        rc = env_port("CFX_COORD_PORT", 0, &b->port);
    else if (mport && *mport)
        rc = env_port("MASTER_PORT", 1, &b->port);
    else
        rc = cfx__err(CFX_ERR_INVALID,
                      "MASTER_ADDR=%s is set but neither MASTER_PORT nor "
                      "CFX_COORD_PORT: the coordinator's port is CFX_COORD_PORT, else "
                      "MASTER_PORT+1",
                      master);
    if (rc != CFX_OK)
        return rc;
    /* the launcher the group takes its rank from (cfx__launcher), so that
     * the rank that hosts is the group's rank 0 */
    const struct cfx_launcher_vars *l = cfx__launcher();
    if (l) {
        const char *v = getenv(l->rank);
        char *end;
        errno = 0;
        long r = strtol(v, &end, 10);
        if (errno || *end || r < 0 || r > 0x7fffffff)
            return cfx__err(CFX_ERR_INVALID, "%s=%s is not a rank", l->rank, v);
        b->rank = (int)r;
        b->rank_var = l->rank;
    }
    if (b->rank < 0) {
        /* CFX_RANK="" counts as unset, as every variable: say so, or a user
         * who did set it reads "set CFX_RANK" */
        char empty[128];
        cfx__launcher_empty_ranks(empty, sizeof(empty));
        return cfx__err(CFX_ERR_INVALID,
                        "MASTER_ADDR=%s is set but no rank%s%s%s: set RANK (torchrun), "
                        "SLURM_PROCID, OMPI_COMM_WORLD_RANK or CFX_RANK; rank 0 hosts the "
                        "coordinator",
                        master, *empty ? " (" : "", empty,
                        *empty ? " set but empty, which counts as unset)" : "");
    }
    b->used = true;
    b->host = b->rank == 0;
    snprintf(coord, len, "%s:%u", b->master, (unsigned)b->port);
    return CFX_OK;
}

int cfx__boot_host(const struct cfx_boot *b, const char *token, int secure,
                   struct cfx_coord **out)
{
    struct sockaddr_in sa;
    char hp[sizeof(b->master) + 8], ip[INET_ADDRSTRLEN];
    int rc;

    *out = NULL;
    if (!token || !*token)
        return cfx__err(CFX_ERR_AUTH,
                        "rank 0 (%s) refuses to host the coordinator on %s:%u "
                        "without a cluster token: set CFX_TOKEN or CFX_TOKEN_FILE on every rank",
                        b->rank_var, b->master, (unsigned)b->port);
    snprintf(hp, sizeof(hp), "%s:%u", b->master, (unsigned)b->port);
    rc = cfx__parse_hostport(hp, &sa);
    if (rc != CFX_OK)
        return cfx__err(rc, "MASTER_ADDR=%s: %s", b->master, cfx_last_error());
    inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    struct cfx_coord_params cp = {
        .bind_addr = ip,
        .port = b->port,
        .token = token,
        .secure = secure, /* the ranks' own CFX_SECURE: they must match it */
    };
    rc = cfx__coord_start(&cp, out);
    if (rc != CFX_OK)
        return cfx__err(rc,
                        "rank 0 (%s) cannot host the coordinator on MASTER_ADDR=%s "
                        "(%s) port %u (CFX_COORD_PORT, else MASTER_PORT+1): %s",
                        b->rank_var, b->master, ip, (unsigned)b->port, cfx_last_error());
    CFX_LOG(INFO, CTL, "rank 0 hosts the coordinator on %s (from MASTER_ADDR)",
            cfx__coord_addr(*out));
    if ((ntohl(sa.sin_addr.s_addr) >> 24) == 127 && strcmp(b->master, ip) &&
        strcmp(b->master, "localhost"))
        CFX_LOG(WARN, CTL,
                "MASTER_ADDR=%s resolves to %s here, a loopback address: ranks "
                "on other hosts cannot reach the coordinator (give MASTER_ADDR as an IP "
                "address of a network they share)",
                b->master, ip);
    return CFX_OK;
}

void cfx__boot_unhost(struct cfx_coord *coord, int timeout_ms)
{
    if (!coord)
        return;
    /* the other ranks may still be finishing (a group's destroy talks to the
     * coordinator): they get until the deadline to leave */
    if (cfx__coord_wait_members(coord, 0, cfx__deadline_ns(timeout_ms)) != CFX_OK)
        CFX_LOG(WARN, CTL, "rank 0 stops the coordinator it hosts: %s", cfx_last_error());
    cfx__coord_stop(coord);
}

/*
 * The coordinator: membership, heartbeats and dead-node detection, the
 * object directory (complete and partial holders, inline objects).  One epoll
 * event loop in one thread.  Used by conflux-coord (foreground) and embedded
 * by cfx_run and the tests (background thread).
 */
#ifndef CFX_CONTROL_COORD_H
#define CFX_CONTROL_COORD_H

#include <stdint.h>

struct cfx_coord;

/* Defaults of the member timing; dead-after must exceed the heartbeat. */
#define CFX_COORD_HEARTBEAT_MS_DEFAULT 250
#define CFX_COORD_DEAD_AFTER_MS_DEFAULT 1500

struct cfx_coord_params {
    const char *bind_addr;   /* default "127.0.0.1" */
    uint16_t port;           /* 0 = ephemeral */
    const char *token;       /* required */
    uint32_t heartbeat_ms;   /* interval clients beat at (default 250) */
    uint32_t dead_after_ms;  /* silence after which a node is dead (default 1500) */
    uint32_t fanout;         /* most uploads the directory gives one holder; 0 = chosen per
                              * object (coord_directory.c "Fan-out") */
    /* Added by the control plane (0 = default); fields only ever appended. */
    uint32_t auth_timeout_ms;  /* close connections not authenticated by then (default 5000) */
    uint32_t stall_timeout_ms; /* close connections stalled mid-frame that long (default 10000) */
    const char *state_dir;     /* durable state (coord_state.c); NULL: none, nothing survives */
    uint32_t dead_keep_ms;     /* dead members stay listed that long, then are forgotten
                                * (default COORD_DEAD_KEEP_MS_DEFAULT, 60000) */
    uint32_t max_nodes;        /* members alive at once; a JOIN beyond gets
                                * CFX_ERR_NO_RESOURCE naming max_nodes (default 65536) */
    /* Caps (0 = default).  Each one hit answers CFX_ERR_NO_RESOURCE with a
     * text naming it (conflux-coord --help lists the options). */
    uint32_t max_node_objects; /* directory entries one node holds (default 1048576) */
    uint64_t max_node_bytes;   /* inline bytes stored for one node's puts (default 256 MiB) */
    uint32_t max_parked;       /* lookups parked in all (default 65536) */
    uint32_t max_unauth_conns; /* connections not yet authenticated (default 256); a new one
                                * beyond closes the oldest of them */
    uint32_t max_conns;        /* connections in all (default 4096) */
    uint64_t max_conn_outq;    /* reply bytes queued to one connection (default 64 MiB) */
    uint32_t test_fsync_delay_ms; /* tests only: every fsync of the state directory takes
                                   * this much longer (a slow disk); 0 in production */
    uint32_t max_node_tasks;      /* tasks placed on one node at once; beyond, tasks queue
                                   * (default 64) */
    uint32_t max_queued_tasks;    /* tasks waiting for a slot; a submit beyond gets
                                   * CFX_ERR_NO_RESOURCE naming it (default 4096) */
    const char *metrics_addr;     /* "ip:port" of the Prometheus endpoint (coord_metrics.c);
                                * NULL: none.  Unauthenticated: bind it to loopback
                                * unless scrapers elsewhere must reach it */
    int secure;                   /* enum cfx_seal_mode (control/seal.h): clients must run
                                   * with the same CFX_SECURE; frames after the handshake
                                   * are sealed unless off (the default) */
    uint32_t task_grace_ms;       /* after its start, the coordinator holds submissions
                                   * repeated across a restart this long at most, so that
                                   * workers re-announce what they run first (default
                                   * 5000; coord_task.c) */
    uint32_t max_objects;         /* directory entries in all, of every node together; a
                                   * put of a new id beyond gets CFX_ERR_NO_RESOURCE naming
                                   * max_objects (default 4194304) */
    uint32_t max_unauth_per_ip;   /* connections not yet authenticated from one source
                                   * address; a newer one closes the oldest (default 16) */
    uint64_t max_buffered;        /* reply and request bytes held for all connections
                                   * together; beyond, the connection holding the most
                                   * is closed (default 256 MiB) */
};

/* Bind, listen and start the event loop in a background thread. */
int cfx__coord_start(const struct cfx_coord_params *params, struct cfx_coord **out);

/* Port actually bound (useful with port 0). */
uint16_t cfx__coord_port(const struct cfx_coord *coord);

/* Address actually bound, "ip:port" (for banners and log lines). */
const char *cfx__coord_addr(const struct cfx_coord *coord);

/* Port of the metrics endpoint (0: none). */
uint16_t cfx__coord_metrics_port(const struct cfx_coord *coord);

/* Wait until at most @p most members are alive (joined, not yet left or
 * dead), or until @p deadline (CLOCK_MONOTONIC ns).  Any thread.
 * CFX_OK, or CFX_ERR_TIMEOUT saying how many are left. */
int cfx__coord_wait_members(struct cfx_coord *coord, uint32_t most, uint64_t deadline);

/* Members that joined so far (every join and rejoin counts) and that are
 * alive now (joined, not yet left or dead).  Any thread. */
void cfx__coord_member_counts(struct cfx_coord *coord, uint32_t *joined, uint32_t *alive);

/* Stop the loop, close every connection, free.  NULL is a no-op. */
void cfx__coord_stop(struct cfx_coord *coord);

#endif

/*
 * Coordinator client: the library's side of the control plane.
 *
 * One client is one authenticated TCP connection to conflux-coord, owned by
 * a background thread that sends heartbeats, reads replies and events, and
 * hands each reply to the caller waiting for it (matched by request id).
 * Every function here may be called from any thread concurrently; each
 * blocking call takes an absolute deadline (CLOCK_MONOTONIC ns, UINT64_MAX =
 * none) and fails with CFX_ERR_TIMEOUT after it, naming the coordinator in
 * cfx_last_error().
 */
#ifndef CFX_CONTROL_CLIENT_H
#define CFX_CONTROL_CLIENT_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <conflux/object.h>
#include "dataplane/transport.h"

#define CFX_NODE_NAME_MAX    64
#define CFX_HOST_ID_MAX      64
#define CFX_HOST_NAME_MAX    64   /* host name field, NUL included */
#define CFX_NODE_ADDRS_MAX   4
#define CFX_OBJ_NAME_MAX     63   /* bytes of an object's name a put carries (longer: cut) */

/* cfx_node_rec.flags */
#define CFX_NODE_F_OBSERVER 0x01u /* a tool's context (rdmactl ps): not listed by default */
#define CFX_NODE_F_LEFT     0x02u /* dead because it left in good order (set by the coordinator) */
#define CFX_NODE_F_ALL      0x03u /* every flag known */

/* One transport address a node listens on. */
struct cfx_node_addr {
    char tp[CFX_TP_NAME_MAX];      /* transport name */
    uint8_t len;                   /* bytes in addr */
    uint8_t addr[CFX_TP_ADDR_MAX]; /* opaque, from iface_addr() */
};

/*
 * A node's load and traffic, reported with every heartbeat (HEARTBEAT) and
 * listed with its record (NODES_REPLY).  Byte and event counters count from
 * the node's start; a reader takes rates from two reports.
 */
#define CFX_LOAD_TPS_MAX 4u /* transports reported per node */
struct cfx_load_tp {
    char name[CFX_TP_NAME_MAX];  /* "tcp", "shm", ...; "" for an unused slot */
    uint64_t tx_bytes;           /* bytes this node handed the transport to send */
    uint64_t rx_bytes;           /* bytes that arrived through it */
};
struct cfx_msg_load {
    uint32_t load_milli;         /* 1-minute load average x 1000 */
    uint64_t mem_avail;          /* bytes of memory available */
    uint64_t arena_used;         /* bytes of its arena in use */
    uint32_t tasks_running;      /* tasks its runners are running */
    uint8_t ntp;                 /* entries of tp[] used */
    struct cfx_load_tp tp[CFX_LOAD_TPS_MAX];
    uint32_t uploads_active;     /* transfers it is serving now */
    uint32_t xfers_in_active;    /* transfers it is receiving now (gets, large messages) */
    uint64_t puts;               /* objects put */
    uint64_t gets;               /* gets that moved data over the data plane */
    uint64_t uploads;            /* transfers served to other nodes */
    uint64_t failovers;          /* gets resumed at another source */
    uint64_t reduce_reroutes;    /* reduces routed around a dead node */
    uint64_t writes_refused;     /* peers' writes outside a live grant */
    uint64_t link_bw;            /* its gets' measured bandwidth, bytes/s (0: none yet) */
    uint64_t link_lat_ns;        /* its small gets' measured latency (0: none yet) */
};

/* A member node as the coordinator knows it. */
struct cfx_node_rec {
    uint32_t node_id;                  /* assigned by the coordinator, never 0 */
    uint32_t pid;                      /* process id on its host */
    char name[CFX_NODE_NAME_MAX];      /* "host:pid" or user-given */
    char host_id[CFX_HOST_ID_MAX];     /* equal for nodes that can use shm (boot id/netns):
                                        * an identity for reachability, not for people */
    char ctl_addr[48];                 /* "ip:port" the coordinator saw it from */
    uint8_t alive;                     /* 1 alive, 0 dead */
    uint32_t last_seen_ms;             /* ms since the last heartbeat */
    uint8_t naddr;
    struct cfx_node_addr addr[CFX_NODE_ADDRS_MAX];
    char host[CFX_HOST_NAME_MAX];      /* host name, as the node reports it (display only) */
    uint8_t flags;                     /* CFX_NODE_F_* */
    struct cfx_msg_load load;          /* its last heartbeat's report: node listings
                                        * (NODES_REPLY) only, zero elsewhere */
};

/*
 * How far a copy being received on a node has got, reported with its
 * heartbeats (HEARTBEAT): at most CFX_CTL_PROGRESS_MAX copies a heartbeat,
 * the next ones in the following heartbeats, so each of N copies is
 * reported at least every ceil(N / CFX_CTL_PROGRESS_MAX) beats.
 */
#define CFX_CTL_PROGRESS_MAX  32u
#define CFX_CTL_READY_UNKNOWN UINT64_MAX /* cfx_obj_holder.ready: no report yet */
struct cfx_ctl_progress {
    struct cfx_object_id id;
    uint64_t ready;     /* bytes landed in order (whole chunks): what it can serve on */
};

/*
 * A node's data-plane traffic with one peer over one transport, reported
 * with heartbeats (HEARTBEAT): the CFX_CTL_PEERS_MAX peers it exchanged the
 * most bytes with, counted since the node started (reconnections add up).
 */
#define CFX_CTL_PEERS_MAX 16u
struct cfx_msg_heartbeat;
struct cfx_ctl_peer_traffic {
    uint32_t peer;      /* node id; 0: the peers beyond the node's table, together */
    uint8_t tp;         /* index into the load's tp[] (its transport) */
    uint64_t tx_bytes;  /* bytes this node handed the transport for that peer */
    uint64_t rx_bytes;  /* bytes that arrived from it */
};

/*
 * Parameter-server load on a node, reported with heartbeats (HEARTBEAT) and
 * listed by PS_LOADS: the PS servers the node runs (at most
 * CFX_CTL_PS_SERVERS_MAX), and of the blocks they served the
 * CFX_CTL_PS_BLOCKS_MAX with the most bytes, counted since each server
 * started.  A block a server handed on keeps its counts there.
 */
#define CFX_CTL_PS_SERVERS_MAX 4u  /* PS servers one node reports */
#define CFX_CTL_PS_BLOCKS_MAX  32u /* blocks one heartbeat reports */
#define CFX_CTL_PS_JOB_MAX     63u /* job name bytes (dataplane/ps: PS_JOB_MAX - 1) */
struct cfx_ctl_ps_server {
    char job[CFX_CTL_PS_JOB_MAX + 1]; /* NUL-terminated, not empty */
    uint32_t server;    /* its index in the job */
    uint32_t blocks;    /* blocks its current shard map gives it */
    uint64_t requests;  /* requests it served (push, pull, push-pull), all blocks */
    uint64_t bytes;     /* their payload bytes: pushed and pulled */
};
struct cfx_ctl_ps_block {
    uint8_t srv;        /* index into the report's servers[] */
    uint32_t block;     /* global block number in the job */
    uint64_t requests;  /* requests that server served on it */
    uint64_t bytes;     /* their payload bytes */
};
struct cfx_ctl_ps_report {
    uint32_t nservers;  /* servers[] used */
    struct cfx_ctl_ps_server servers[CFX_CTL_PS_SERVERS_MAX];
    uint32_t nblocks;   /* blocks[] used, the most bytes first */
    struct cfx_ctl_ps_block blocks[CFX_CTL_PS_BLOCKS_MAX];
};

/* A holder of an object, as listed by the directory. */
struct cfx_obj_holder {
    uint32_t node_id;
    uint8_t complete;   /* 1 complete copy, 0 partial (being received) */
    uint32_t uploads;   /* transfers it is currently serving */
    uint32_t src;       /* a partial copy: the holder feeding it (0: none, or complete) */
    uint64_t ready;     /* bytes it holds in order: the size when complete; a partial
                         * copy's last report, CFX_CTL_READY_UNKNOWN before the first */
};

#define CFX_CTL_SOURCES_MAX 8u /* sources one lookup may name (striping) */

/* Answer to a lookup: where to get an object from. */
struct cfx_ctl_source {
    uint64_t size;             /* object size */
    uint32_t chunk_size;       /* chunk size chosen by the putter */
    uint8_t is_inline;         /* 1: data holds the object; no source node */
    uint8_t complete;          /* source holds a complete copy */
    void *data;                /* inline bytes (malloc'd, caller frees) */
    struct cfx_node_rec node;  /* source node when !is_inline */
    uint32_t putter;           /* the node that put it (0 unknown) */
    uint64_t tag;              /* its mark of that put (0 none) */
    uint32_t nextra;           /* extra complete holders the directory offered (striping;
                                  not counted as their uploads, nothing to release) */
    uint32_t extra[CFX_CTL_SOURCES_MAX - 1]; /* their node ids */
};

/* Directory listing entry (rdmactl objects). */
struct cfx_ctl_obj_rec {
    struct cfx_object_id id;
    uint64_t size;
    uint32_t chunk_size;
    uint8_t is_inline;
    uint32_t nholders;
    struct cfx_obj_holder holders[16]; /* first 16 holders */
    /* the name the id was made from (cfx_object_id_from_name), as the first
     * putter sent it; "" when unknown.  Peer-supplied bytes: escape them
     * before printing. */
    char name[CFX_OBJ_NAME_MAX + 1];
};

/* Task listing entry (rdmactl tasks). */
#define CFX_CTL_TASK_QUEUED 0u /* waiting for a slot on a capable node */
#define CFX_CTL_TASK_PLACED 1u /* sent to its node, running there */
#define CFX_CTL_TASK_DONE   2u /* ended: status says how */
#define CFX_CTL_TASK_TEXT_MAX 256u
struct cfx_ctl_task_rec {
    uint64_t id;                       /* the coordinator's task id (from the wall clock
                                        * in microseconds at its start: coord_task.c) */
    char name[64];                     /* function (CFX_TASK_NAME_MAX + 1) */
    uint8_t state;                     /* CFX_CTL_TASK_* */
    uint32_t node_id;                  /* placed on / ran on (0: none) */
    uint32_t submitter;                /* node that submitted it */
    uint32_t placements;               /* times placed (more than 1: moved after a death) */
    int32_t status;                    /* DONE: 0 or a negative cfx_status */
    uint32_t age_ms;                   /* since it was submitted */
    uint32_t cores, gpus;              /* its needs */
    uint64_t memory;
    uint8_t ninputs, nresults;
    struct cfx_object_id result;       /* its first result */
    char text[CFX_CTL_TASK_TEXT_MAX];  /* DONE with an error: why (truncated) */
};

/* Coordinator summary (rdmactl status). */
struct cfx_ctl_status {
    uint32_t proto_version;
    uint64_t uptime_ms;
    uint32_t nodes_alive;
    uint32_t nodes_dead;
    uint32_t objects;
    uint64_t inline_bytes;
    uint32_t heartbeat_ms;
    uint32_t dead_after_ms;
    char version[32];
    uint32_t node_index_slots; /* slots of the node id index (its memory) */
    uint32_t node_records;     /* member records held, alive and dead */
};

enum cfx_ctl_role {
    CFX_CTL_ROLE_NODE  = 0,  /* a member: gets a node id, heartbeats */
    CFX_CTL_ROLE_ADMIN = 1,  /* rdmactl: queries only, not a member */
};

struct cfx_ctl;
struct cfx_msg;
struct cfx_msg_task;

struct cfx_ctl_params {
    const char *coord;                 /* "host:port" */
    const char *token;                 /* cluster token (required) */
    enum cfx_ctl_role role;
    const struct cfx_node_rec *self;   /* NODE: name, pid, host_id, addrs */
    int timeout_ms;                    /* connect + authenticate + join */
    /* Called from the client thread when the coordinator reports a node dead
     * (or this client loses the coordinator: node_id 0).  May be NULL.
     * It runs on the thread that receives replies, so it must not wait for
     * a reply itself (no cfx__ctl_* request calls from inside it): hand the
     * event to another thread (e.g. the progress engine) instead. */
    void (*on_node_dead)(void *arg, uint32_t node_id);
    void *arg;
    /* Added later: called as on_node_dead, with the same rules, when the
     * coordinator reports that a node left in good order (its goodbye).  It
     * will send nothing more, but what it sent may still be on its way.
     * May be NULL. */
    void (*on_node_left)(void *arg, uint32_t node_id);
    /* Added by the control plane: called from the client thread after a NODE
     * client reconnected to a restarted coordinator and rejoined (with its
     * previous node id when the coordinator allowed it: compare
     * cfx__ctl_node_id()).  The coordinator lost its soft state, so the owner
     * re-announces what it holds, but not from this thread (the replies are
     * read here): hand off to another thread.  May be NULL. */
    void (*on_reconnected)(void *arg);
    /* Called from the client thread as a NODE client's rejoin succeeded,
     * before the calls that waited for the reconnection go on (and before
     * on_reconnected): the owner takes cfx__ctl_node_id() as its id now (a
     * new one when the coordinator did not give the old back), so that a
     * peer that learns the new id from what this node sends next does not
     * find it still answering to the old one.  Same rules as on_node_dead.
     * May be NULL. */
    void (*on_rejoined)(void *arg);
    /* Called from the client thread when the directory withdrew object @p id
     * that this node holds (a copy, or part of one): its putter deleted it or
     * it went with its last complete copy.  The client acknowledges the
     * event once this returns, and a putter's delete returns only after
     * every holder's acknowledgement, so whatever this does (under the
     * owner's lock) is done before that delete returns.  Same rules as
     * on_node_dead: no request calls from inside it.  May be NULL. */
    void (*on_obj_gone)(void *arg, const struct cfx_object_id *id);
    /* Called from the client thread when the coordinator sends this node a
     * task to run (EV_TASK_RUN).  @p task (its argument bytes included) is
     * valid during the call only: copy it and hand it to another thread.
     * Same rules as on_node_dead.  May be NULL. */
    void (*on_task_run)(void *arg, const struct cfx_msg_task *task);
    /* Called from the client thread before each heartbeat to fill in this
     * node's load; must not block.  May be NULL (zeros are sent). */
    void (*load_fill)(void *arg, struct cfx_msg_load *out);
    /* Called from the client thread before each heartbeat, after load_fill,
     * to fill in what follows the load (struct cfx_msg_heartbeat in
     * control/proto.h): the copies being received here and how far each
     * got, and the traffic per peer.  Must not block.  May be NULL (none
     * are reported). */
    void (*beat_fill)(void *arg, struct cfx_msg_heartbeat *hb);
    /* Called from the client thread with the coordinator's answer to each
     * cfx__ctl_obj_put_async() of this client: @p status CFX_OK, its
     * refusal (CFX_ERR_EXISTS: the id names another object) with @p why,
     * or CFX_ERR_CONNECT when the connection it was sent on was lost first
     * (the owner re-announces what it holds after the reconnect).  Same
     * rules as on_node_dead.  May be NULL (refusals are logged). */
    void (*on_put_answer)(void *arg, const struct cfx_object_id *id, int status,
                          const char *why);
    /* CFX_SECURE (enum cfx_seal_mode, control/seal.h): must be the
     * coordinator's (else CFX_ERR_AUTH naming both); frames after the
     * handshake are sealed unless off (0, the default). */
    int secure;
};

/* Every blocking request below is sent again after a reconnect when the
 * connection was lost before its reply, within its deadline; when the
 * deadline passes with the coordinator unreachable it fails with
 * CFX_ERR_CONNECT naming the coordinator (control/client.c, cfx__ctl_call). */

/* Connect, authenticate (HMAC challenge-response) and join.
 * CFX_ERR_AUTH when the token is refused or the coordinator runs with another
 * CFX_SECURE mode; CFX_ERR_CONNECT; CFX_ERR_TIMEOUT.  With CFX_SECURE on, a
 * frame from the coordinator that fails its check ends the connection and
 * the calls waiting on it with CFX_ERR_AUTH naming the coordinator. */
int cfx__ctl_open(const struct cfx_ctl_params *params, struct cfx_ctl **out);

/* Leave (best effort) and free; NULL is a no-op. */
void cfx__ctl_close(struct cfx_ctl *ctl);
/* While @p on, calls end (and new ones fail) with CFX_ERR_CANCELED: a
 * context being destroyed ends the calls of its other threads.  Any thread. */
void cfx__ctl_interrupt(struct cfx_ctl *ctl, bool on);

uint32_t cfx__ctl_node_id(const struct cfx_ctl *ctl);
/* Times this client reconnected to the coordinator (any thread). */
uint64_t cfx__ctl_reconnects(struct cfx_ctl *ctl);
/* How long the connection has been lost, in ms (0 while connected; any
 * thread).  A NODE client is reconnecting meanwhile. */
uint64_t cfx__ctl_lost_ms(struct cfx_ctl *ctl);
/* Whether a NODE client has found its connection lost and is making a new
 * one (any thread, no lock taken: callable under the owner's locks).  Its
 * node id (cfx__ctl_node_id) is the new connection's once this is false
 * again. */
bool cfx__ctl_reconnecting(const struct cfx_ctl *ctl);
/* Heartbeat interval and death timeout the coordinator announced. */
uint32_t cfx__ctl_heartbeat_ms(const struct cfx_ctl *ctl);
/* Added by the control plane: silence after which the coordinator declares a
 * node dead (from the join reply; 0 for ADMIN clients), and the coordinator
 * address as given to cfx__ctl_open() (for messages). */
uint32_t cfx__ctl_dead_after_ms(const struct cfx_ctl *ctl);
const char *cfx__ctl_coord_addr(const struct cfx_ctl *ctl);

/* Announce that this node holds a complete object.  @p data carries the
 * bytes when size <= CFX_OBJECT_INLINE_MAX (they are stored by the
 * coordinator), else NULL; this node becomes the object's putter.
 * CFX_ERR_EXISTS when the id exists, put by any node (only the putter itself
 * may announce its object again, to a restarted coordinator).
 * (Control plane note: data == NULL with 0 < size <= CFX_OBJECT_INLINE_MAX
 * announces a small object served from the data plane, as
 * CFX_OBJ_FLAG_NO_INLINE wants; size 0 is always inline; data with size over
 * CFX_OBJECT_INLINE_MAX is CFX_ERR_TOO_BIG.  Lookups of inline objects record
 * the getter as a complete holder, so it may cfx__ctl_obj_delete() them; no
 * obj_done needed.) */
int cfx__ctl_obj_put(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                     uint64_t size, uint32_t chunk_size, const void *data,
                     uint64_t deadline_ns);

/* As cfx__ctl_obj_put() for an object this node holds as its putter and
 * may have announced already (cfx_put, whose request may be sent again
 * after a reconnect and race the re-announce; the re-announce itself): the
 * coordinator acknowledges it when it already records this node as the
 * object's putter and a complete holder, with the same size and chunk size
 * (CFX_PROTO_PUT_AGAIN).  Other answers as cfx__ctl_obj_put().  The
 * caller's store holds one object per id, so such a record is this very
 * object. */
int cfx__ctl_obj_put_own(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                            uint32_t chunk_size, const void *data, uint64_t tag,
                            uint64_t deadline_ns);

/* Announce again (after a coordinator restart) a complete copy this node got
 * of node @p putter's put @p tag (CFX_PROTO_PUT_COPY): the directory records
 * this node as a complete holder of that object, creating the record when
 * nobody announced it yet, or answers CFX_ERR_EXISTS when the id names
 * another object (another put, size or chunk size) by now. */
int cfx__ctl_obj_put_copy(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                          uint32_t chunk_size, uint32_t putter, uint64_t tag,
                          uint64_t deadline_ns);

/* As cfx__ctl_obj_put() for an inline object (@p data holds all @p size
 * bytes, or size is 0) that the coordinator also keeps in its state
 * directory: it survives a coordinator restart, kill -9 included, until it
 * is deleted.  Without a state directory it is an ordinary inline put.
 * CFX_ERR_INVALID for a non-inline object; CFX_ERR_IO when the coordinator
 * cannot write the record (nothing is put then).  A coordinator older than
 * the durable flag refuses the put with CFX_ERR_PROTO. */
int cfx__ctl_obj_put_durable(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                             uint64_t size, uint32_t chunk_size, const void *data,
                             uint64_t deadline_ns);

/* Find a source for @p id, waiting until one exists or the deadline.  The
 * caller is recorded as a partial holder and the source's upload count is
 * raised until cfx__ctl_obj_done().  Nodes in @p exclude are not chosen.
 * CFX_ERR_TIMEOUT when no holder appeared in time. */
int cfx__ctl_obj_lookup(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                        const uint32_t *exclude, unsigned nexclude,
                        uint64_t deadline_ns, struct cfx_ctl_source *out);

/* As cfx__ctl_obj_lookup(), asking also for up to @p want extra sources:
 * complete holders that serve no upload now (out->extra; the directory
 * offers them only with a complete source, and does not count them). */
int cfx__ctl_obj_lookup_sources(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                                const uint32_t *exclude, unsigned nexclude, unsigned want,
                                uint64_t deadline_ns, struct cfx_ctl_source *out);

/* As cfx__ctl_obj_lookup(), but the coordinator answers at once: a source
 * (with the same side effects) or CFX_ERR_TIMEOUT when there is no holder
 * yet.  @p deadline_ns bounds the round trip. */
int cfx__ctl_obj_lookup_now(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                            const uint32_t *exclude, unsigned nexclude, uint64_t deadline_ns,
                            struct cfx_ctl_source *out);

/* Announce a complete, non-inline object without waiting for the answer
 * (usable from threads that must not block; the answer, refusal or not,
 * reaches on_put_answer, and a refusal is logged): this
 * node's put, or with @p copy_of a copy of node copy_of's untagged put (as
 * cfx__ctl_obj_put_copy() with tag 0; a reduce's result is put so). */
int cfx__ctl_obj_put_async(struct cfx_ctl *ctl, const struct cfx_object_id *id, uint64_t size,
                           uint32_t chunk_size, uint32_t copy_of);

/* Withdraw this node's copy without waiting for the answer. */
int cfx__ctl_obj_delete_async(struct cfx_ctl *ctl, const struct cfx_object_id *id);

/* A transfer from @p source_node ended: the source's upload count drops and
 * this node becomes a complete holder (@p complete = 1) or stops being a
 * partial holder (0). */
int cfx__ctl_obj_done(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                      uint32_t source_node, int complete, uint64_t deadline_ns);

/* As cfx__ctl_obj_done() without waiting for the coordinator's answer (it
 * is processed in order with this client's later requests; a refusal is
 * logged).  Only sending can fail. */
int cfx__ctl_obj_done_async(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                            uint32_t source_node, int complete);

/* Withdraw this node's copy; the putter's delete withdraws the object with
 * every copy, and so does the delete of the node that submitted the task
 * that put it.  CFX_ERR_NOT_FOUND if it held none and may not end it. */
int cfx__ctl_obj_delete(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                        uint64_t deadline_ns);
/* As cfx__ctl_obj_delete(), from a node that holds no copy of @p id: a put
 * of it by this node withdraws only if its tag is below @p put_below (the
 * node's next store sequence when it found no copy; a put begun after that
 * is not this delete's to take: CFX_ERR_NOT_FOUND). */
int cfx__ctl_obj_delete_before(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                               uint64_t put_below, uint64_t deadline_ns);
/* Withdraw the put of @p id this node sent with @p tag, which failed on this
 * side (its answer late, or lost with the connection) and which the
 * directory may have taken all the same; a later put of the id here stays.
 * CFX_ERR_NOT_FOUND: the directory holds no such put. */
int cfx__ctl_obj_put_withdraw(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                              uint64_t tag, uint64_t deadline_ns);
/* As cfx__ctl_obj_delete(), but a task's submitter only drops its own copy
 * (a cfx_get_alloc buffer freed is no decision to end the result). */
int cfx__ctl_obj_drop(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                      uint64_t deadline_ns);

/* Node record of @p node_id. CFX_ERR_NOT_FOUND if unknown.  After a
 * coordinator restart, a node of before that has not rejoined yet is waited
 * for (until it rejoins, its rejoin window ends, or @p deadline_ns). */
int cfx__ctl_node_get(struct cfx_ctl *ctl, uint32_t node_id,
                      struct cfx_node_rec *out, uint64_t deadline_ns);

/* Admin queries; arrays are malloc'd, caller frees. */
int cfx__ctl_status(struct cfx_ctl *ctl, struct cfx_ctl_status *out, uint64_t deadline_ns);
int cfx__ctl_nodes(struct cfx_ctl *ctl, struct cfx_node_rec **out, size_t *n,
                   uint64_t deadline_ns);
int cfx__ctl_objects(struct cfx_ctl *ctl, struct cfx_ctl_obj_rec **out, size_t *n,
                     uint64_t deadline_ns);
/* Tasks the coordinator holds, live and recently ended, by id. */
int cfx__ctl_tasks(struct cfx_ctl *ctl, struct cfx_ctl_task_rec **out, size_t *n,
                   uint64_t deadline_ns);

/* A live node's last parameter-server load report (PS_LOADS). */
struct cfx_ctl_ps_node {
    uint32_t node_id;
    struct cfx_ctl_ps_report ps;
};
/* The live nodes that reported PS load, by id. */
int cfx__ctl_ps_loads(struct cfx_ctl *ctl, struct cfx_ctl_ps_node **out, size_t *n,
                      uint64_t deadline_ns);

/* Send @p req (any request type; its req_id is set here) and wait for a
 * reply of type @p expect by the deadline, as the requests above do (an
 * ERROR reply becomes its status).  With @p reply and @p frame, the reply
 * is decoded into *reply, pointing into *frame, which the caller frees;
 * without, it is dropped. */
int cfx__ctl_request(struct cfx_ctl *ctl, struct cfx_msg *req, uint64_t deadline_ns,
                     const char *what, uint8_t expect, struct cfx_msg *reply, void **frame);

/* Send @p m (req_id set here) without waiting for any reply. */
int cfx__ctl_send_nowait(struct cfx_ctl *ctl, struct cfx_msg *m, const char *what);

#endif

/*
 * Coordinator internals shared by coord.c (event loop, connections, auth,
 * dispatch), coord_members.c (membership, heartbeats, death) and
 * coord_directory.c (objects, holders, lookups).  Everything here runs on
 * the coordinator's loop thread only.
 */
#ifndef CFX_CONTROL_COORD_INT_H
#define CFX_CONTROL_COORD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "control/auth.h"
#include "control/client.h"
#include "control/coord.h"
#include "control/ctl_seal.h"
#include "control/evloop.h"
#include "control/proto.h"
#include "dataplane/common/flood.h"
#include "dataplane/common/list.h"

#define COORD_PARKED_PER_CONN 4096          /* parked lookups one connection (one member)
                                             * may hold; task waits alike */
#define COORD_PARKED_SHARE_MIN 256          /* ... and at least this of its share of
                                             * max_parked (coord_waits.c) */
#define COORD_DEL_WAITS_PER_CONN 1024       /* deletes one connection may have waiting
                                             * for holders' acknowledgements */
#define COORD_DEL_WAIT_MARGIN_MS 1000       /* a waiting delete is answered at the latest
                                             * dead_after_ms plus this after it began */
#define COORD_DEL_WAIT_BUCKETS 1024         /* index of waiting deletes by token */
#define COORD_OUTQ_MAX        (64u << 20)   /* default max_conn_outq: queued reply bytes
                                             * before a reader is "too slow" */
#define COORD_CONNS_MAX       4096          /* default max_conns: open connections */
#define COORD_UNAUTH_MAX      256           /* default max_unauth_conns */
#define COORD_UNAUTH_PER_IP   16            /* default max_unauth_per_ip */
#define COORD_UNAUTH_BUCKETS  1024          /* hash of unauthenticated connections by
                                             * source address (power of two) */
#define COORD_BUFFERED_MAX    (256ull << 20) /* default max_buffered: reply and request
                                             * bytes held for all connections */
#define COORD_OUTQ_PAUSE      (1u << 20)    /* replies queued to one connection above
                                             * which its requests wait unread */
#define COORD_NODE_OBJECTS_MAX (1u << 20)   /* default max_node_objects */
#define COORD_OBJECTS_MAX     (1u << 22)    /* default max_objects: directory entries in all */
#define COORD_NODE_BYTES_MAX  (256ull << 20) /* default max_node_bytes */
#define COORD_PARKED_MAX      65536         /* default max_parked */
#define COORD_DEAD_KEEP       1024          /* dead node records kept for listings, at most */
#define COORD_DEAD_KEEP_MS_DEFAULT 60000    /* ... and for at most this long after death */
#define COORD_INLINE_TOTAL_MAX (1ull << 30) /* inline bytes stored in all */
#define COORD_TICK_MS         100           /* housekeeping period */
#define COORD_PREAUTH_MAX     256           /* largest frame payload before authentication */
#define COORD_STATE_KEY_MAX   64            /* durable record key: [A-Za-z0-9._-] */
#define COORD_STATE_VAL_MAX   (16u << 20)   /* durable record value bytes */
#define COORD_IDS_KEY         "coord.node_ids" /* record: u32 LE, ids below are taken */
#define COORD_IDS_BATCH       64            /* node ids reserved per state write */
#define COORD_MAX_NODES_DEFAULT 65536       /* members alive at once (--max-nodes) */
#define COORD_MAX_NODES_LIMIT (1u << 24)    /* largest --max-nodes accepted */
#define COORD_REJOIN_MAX      65536         /* ids reclaimed after one restart, at most */
#define COORD_NODE_WAIT_BUCKETS 1024        /* NODE_GETs waiting for a rejoin, by node id */
#define COORD_STATELESS_IDS_MAX (1u << 24) /* without a state directory: the highest
                                               id a rejoining node may take back */
#define COORD_NODE_TASKS_MAX  64            /* default max_node_tasks: live tasks per node */
#define COORD_QUEUED_TASKS_MAX 4096         /* default max_queued_tasks: waiting for a slot */
#define COORD_NODE_FUNCS_MAX  64            /* functions one node may register */
#define COORD_TASKS_DONE_KEEP 1024          /* ended tasks remembered for late waits */
#define COORD_TASK_DONE_KEEP_MS 60000       /* ... and for at most this long */
#define COORD_TASK_FENCED_MAX 8             /* fenced nodes a task keeps (the latest) */
#define COORD_TASK_GRACE_MS   5000          /* default task_grace_ms: after a start,
                                             * repeated submissions wait this long at
                                             * most for workers to re-announce */
#define COORD_PLACE_RESERVE_MS 2000         /* a placement query's reservation, by default */
#define COORD_PLACE_RESERVE_MAX_MS CFX_TASK_RESERVE_MAX_MS /* ... and at most (longer: refused) */
#define COORD_NODE_QUERIES_MAX 128          /* placement queries' reservations one node
                                             * holds at once */
#define COORD_OBJ_KEY_PREFIX  "obj."          /* record: a durable inline object (coord_directory.c) */

enum coord_conn_state {
    COORD_CONN_AUTH = 0,  /* challenge sent, waiting for AUTH */
    COORD_CONN_READY,     /* authenticated (admin, or node before JOIN / after LEAVE) */
    COORD_CONN_NODE,      /* joined: conn->node is set */
};

struct coord_frame {
    struct cfx_list link;  /* in conn->outq */
    size_t len;            /* frame bytes */
    size_t off;            /* bytes already written */
    uint8_t data[];
};

struct coord_conn {
    struct cfx_list link;       /* coord->conns, then coord->closing */
    struct cfx_coord *coord;
    struct cfx_ev_io io;
    int fd;
    char peer[48];              /* "ip:port" of the peer */
    enum coord_conn_state state;
    uint8_t role;               /* enum cfx_ctl_role, once authenticated */
    uint8_t nonce[CFX_AUTH_NONCE_LEN]; /* our challenge */
    int failing;                /* scheduled for closing in the after-batch hook */
    int close_after_flush;      /* close once outq drains (after an auth refusal) */
    int send_failed;            /* failing because a send failed (the peer reset it) */
    uint64_t accepted_ns;
    uint64_t last_rx_ns;        /* last byte received */
    uint32_t ip;                /* the peer's IPv4 address, network order */
    int unauth;                 /* counted in coord->nunauth, linked in coord->unauth and
                                 * coord->unauth_ip (until authenticated or failing) */
    struct cfx_list unauth_link; /* coord->unauth, oldest first */
    struct cfx_list ip_link;    /* coord->unauth_ip[bucket of ip] */
    uint8_t *in;                /* input buffer: grows as a frame's bytes come, up to the
                                 * frame's length */
    size_t in_len;              /* bytes in it */
    size_t in_cap;
    uint64_t frame_ns;          /* when the first byte of the incomplete frame at the head
                                 * of in[] came (0: none); it must be whole within
                                 * stall_timeout_ms of that */
    size_t frame_need;          /* that frame's length, once its header came (0: not yet) */
    int out_paused;             /* more than COORD_OUTQ_PAUSE replies queued: its requests
                                 * wait unread until they drain */
    int outq_seen;              /* paused: its socket's unsent bytes at the last tick */
    struct cfx_list outq;       /* struct coord_frame, oldest first */
    size_t out_bytes;           /* bytes queued in outq */
    struct coord_node *node;    /* member record once joined */
    struct cfx_list parked;     /* struct coord_parked.conn_link */
    uint32_t nparked;
    uint32_t ntask_waits;       /* struct coord_task_wait of it (coord->task_waits) */
    uint32_t ndel_waits;        /* struct coord_del_wait of it (coord->del_waits) */
    struct cfx_list node_waits; /* struct coord_node_wait.conn_link */
    uint32_t nnode_waits;
    struct cfx_ev_timer resume; /* parses the rest of in[] after a disk write */
    int parse_deferred;         /* resume is armed: frames wait in in[] */
    struct cfx_ctl_seal seal;   /* CFX_SECURE: on from the frame after AUTH_OK */
};

struct coord_node {
    struct cfx_list link;       /* coord->nodes, in id order */
    struct cfx_node_rec rec;    /* rec.alive tracks liveness */
    uint64_t last_seen_ns;      /* last frame from it, or (its connection paused: coord.c)
                                 * the last of our replies it took */
    struct coord_conn *conn;    /* NULL once dead */
    uint64_t dead_ns;           /* when it died (0 while alive) */
    struct cfx_list holdings;   /* struct coord_holder.node_link */
    uint32_t nholdings;         /* entries in holdings (max_node_objects) */
    uint64_t put_bytes;         /* inline bytes stored for its puts (max_node_bytes) */
    struct cfx_msg_load load;   /* from its last heartbeat */
    uint32_t npeers;            /* ... and its traffic per peer (peers[] used) */
    struct cfx_ctl_peer_traffic peers[CFX_CTL_PEERS_MAX];
    struct cfx_ctl_ps_report ps; /* ... and its parameter-server load */
    struct coord_worker *worker; /* functions it registered (coord_task.c), or NULL */
    uint8_t rejoined;           /* took back its id of before the restart: the process that
                                 * held that id then (a hint naming the id means it) */
    uint8_t stale_runs;         /* rejoined under a new id while tasks that moved off its
                                 * old one may still run here: its puts are checked against
                                 * their fences (coord_task.c, "Fences") */
    uint32_t was_id;            /* the id it asked for at its join and did not get back
                                 * (its id before it was declared dead), or 0 */
    uint32_t nqueries;          /* placement queries' reservations it asked for, live
                                 * (COORD_NODE_QUERIES_MAX) */
};

/* What a node that registered task functions offers, and what is reserved
 * of it (coord_place.c). */
struct coord_worker {
    char funcs[COORD_NODE_FUNCS_MAX][CFX_TASK_NAME_MAX + 1];
    uint32_t nfuncs;
    uint32_t cores;             /* offered */
    uint32_t gpus;
    uint64_t memory;
    uint64_t res_cores;         /* reserved by live reservations (64 bits: a sum of u32s
                                 * never wraps) */
    uint64_t res_gpus;
    uint64_t res_memory;        /* ... a re-announced run may push it past memory */
    uint32_t nres;              /* live reservations on it (max_node_tasks) */
    uint8_t announced;          /* it said it re-announced every task it holds */
};

/* A reservation: what one placement holds on its node until its task ends
 * or, for a placement query or a task past its deadline, it expires. */
struct coord_resv {
    struct cfx_list link;       /* coord->resvs */
    uint32_t node_id;
    uint32_t cores;
    uint32_t gpus;
    uint64_t memory;
    char group[CFX_TASK_GROUP_MAX + 1]; /* anti-affinity group; "" none */
    uint64_t expires_ns;        /* UINT64_MAX: held by a task until it ends */
    struct coord_task *task;    /* the task holding it, or NULL (a query's, or a run's) */
    uint64_t run_id;            /* task NULL: a run its node goes on with after the task
                                 * ended for its waiter (deadline) or moved; held until the
                                 * node reports that run's end or dies (0: a query's) */
    uint32_t asker;             /* a query's: the node that asked (freed when it dies or
                                 * leaves); 0 otherwise */
};

enum coord_task_state {
    COORD_TASK_QUEUED = 0,      /* waiting for a slot on a capable node */
    COORD_TASK_PLACED,          /* sent to its node, running there */
    COORD_TASK_DONE,            /* ended: status says how */
    COORD_TASK_HELD,            /* submitted again after a restart: waits for its
                                 * worker's re-announcement or the grace's end */
};

struct coord_task {
    struct cfx_list link;       /* coord->tasks (live ones), then coord->tasks_done */
    uint64_t id;
    uint64_t key;               /* the submitter's idempotency key (t.key) */
    uint64_t run_id;            /* id its worker runs it under (TASK_DONE names it):
                                 * id, or the one a re-announcement adopted */
    uint32_t hint_node;         /* HELD: node it ran on before the restart (0: unknown) */
    struct cfx_msg_task t;      /* as submitted (t.arg points to arg) */
    uint8_t *arg;               /* malloc'd copy of the argument */
    enum coord_task_state state;
    uint32_t node_id;           /* placed on (0 while queued) */
    uint32_t submitter;         /* node that submitted it */
    uint32_t placements;        /* times placed (more than 1: moved after a death) */
    uint64_t submit_ns;
    uint64_t deadline_ns;
    uint64_t done_ns;
    int32_t status;
    char text[CFX_PROTO_TEXT_MAX];
    struct coord_resv *resv;    /* while placed */
    uint8_t adopted;            /* its node announced the run (TASK_ANNOUNCE); 0: this
                                 * coordinator sent it (EV_TASK_RUN) */
    uint8_t nfenced;
    struct coord_fence {
        uint32_t node;          /* a node whose run of it is not the task's: it moved off
                                 * the node when it was declared dead, or the id that node
                                 * rejoined under (coord_task.c, "Fences") */
        uint8_t ended;          /* that run reported its end: a later re-announcement of it
                                 * holds no cores */
        uint64_t run_id;        /* the id that run goes by (its TASK_DONE names it): the
                                 * task's, or one a re-announcement merged into it */
    } fenced[COORD_TASK_FENCED_MAX];
};

/* A TASK_WAIT parked until its task ends or its timeout. */
struct coord_task_wait {
    struct cfx_list link;       /* coord->task_waits */
    struct coord_conn *conn;    /* conn->ntask_waits counts it */
    uint64_t req_id;
    uint64_t task_id;
    uint64_t deadline_ns;       /* UINT64_MAX: none */
};

struct coord_obj {
    struct cfx_list hash_link;  /* bucket */
    struct cfx_list link;       /* coord->objects, insertion order */
    uint64_t seq;               /* insertion order: the listing cursor (coord->obj_index) */
    uint32_t index_at;          /* its slot in coord->obj_index */
    struct cfx_object_id id;
    uint64_t size;
    uint32_t chunk_size;
    uint8_t is_inline;          /* data holds the object */
    uint8_t durable;            /* recorded in the state directory (COORD_OBJ_KEY_PREFIX) */
    uint32_t putter;            /* node that put it first (may be dead, or not rejoined yet) */
    uint64_t tag;               /* the putter's mark of this put (0 none): a copy announced
                                   after a restart must carry the same */
    uint32_t submitter;         /* a task's result: the node that submitted the task, which
                                   may withdraw it as its putter may (0: none) */
    char name[CFX_OBJ_NAME_MAX + 1]; /* name the putter made the id from; "" unknown */
    uint8_t *data;              /* inline bytes (malloc'd), NULL for size 0 */
    struct cfx_list holders;    /* struct coord_holder.obj_link */
    uint32_t nholders;
};

struct coord_holder {
    struct cfx_list obj_link;   /* obj->holders */
    struct cfx_list node_link;  /* node->holdings */
    struct coord_obj *obj;
    struct coord_node *node;
    uint8_t complete;           /* 1 complete copy, 0 being received */
    uint32_t uploads;           /* receivers currently pulling from it */
    uint32_t depth;             /* hops from a complete copy (0 when complete) */
    uint32_t src;               /* node it is pulling from while partial, 0 none */
    uint64_t ready;             /* partial: bytes it last reported landed in order
                                   (CFX_CTL_READY_UNKNOWN: no report yet) */
};

struct coord_parked {
    struct cfx_list link;       /* bucket of coord->parked by id, oldest first */
    struct cfx_list conn_link;  /* conn->parked */
    struct cfx_ev_timer timer;  /* the lookup's deadline */
    struct coord_conn *conn;    /* requester (a joined node) */
    uint64_t req_id;
    uint64_t start_ns;
    uint32_t timeout_ms;
    struct cfx_object_id id;
    uint32_t nexclude;
    uint32_t exclude[CFX_PROTO_EXCLUDE_MAX];
};

/* A NODE_GET for a node known before a restart that has not rejoined yet
 * (coord_members.c): answered when it rejoins or its rejoin window ends. */
/* A putter's delete whose reply waits until every live holder of the
 * object said it dropped its copy (EV_OBJ_GONE -> OBJ_GONE_ACK), or died. */
struct coord_del_wait {
    struct cfx_list link;       /* bucket of coord->del_waits by token */
    struct cfx_list id_link;    /* bucket of coord->del_ids by object id */
    struct cfx_ev_timer timer;  /* the deadline: dead_after_ms + COORD_DEL_WAIT_MARGIN_MS */
    struct coord_conn *conn;    /* the putter's connection, to reply on */
    uint64_t req_id;            /* its OBJ_DELETE */
    uint64_t token;             /* the events' req_id, echoed by the acks */
    struct cfx_object_id id;    /* the object withdrawn (for the deadline's answer) */
    uint32_t nwait;             /* holders still to answer */
    uint32_t *wait;             /* their node ids (nwait of them) */
};

/* An object withdrawn lately, and why: a getter that resumes after its
 * source failed is told that instead of waiting for a new put. */
#define COORD_GONE_KEEP 256
struct coord_gone {
    struct cfx_object_id id;
    uint32_t putter;
    uint8_t used;
    char why[96];
};

struct coord_node_wait {
    struct cfx_list link;       /* bucket of coord->node_waits by node_id, oldest first */
    struct cfx_list conn_link;  /* conn->node_waits */
    struct coord_conn *conn;    /* requester */
    uint64_t req_id;
    uint32_t node_id;           /* the node asked about */
};

struct cfx_coord {
    struct cfx_ev_loop *loop;
    pthread_t thread;
    int thread_started;
    int listen_fd;
    struct cfx_ev_io listen_io;
    struct cfx_ev_timer tick;
    char token[CFX_TOKEN_MAX + 1];
    char addr[64];              /* "ip:port" bound */
    uint16_t port;
    uint32_t heartbeat_ms;
    uint32_t dead_after_ms;
    uint32_t dead_keep_ms;      /* dead records are forgotten this long after death */
    uint32_t fanout;
    int secure;                 /* enum cfx_seal_mode clients must speak */
    uint64_t seal_refused;      /* handshakes refused for another CFX_SECURE mode */
    uint64_t seal_failures;     /* connections ended by a frame that did not open */
    /* the members' links as their heartbeats report them (medians over live
     * members with an estimate; 0: none), refreshed at most once a second
     * when a fan-out is chosen (coord_directory.c) */
    double link_bw;             /* bytes/s */
    double link_lat;            /* s */
    uint32_t link_getters;      /* live members but one: the getters a broadcast has */
    uint64_t link_at_ns;        /* when they were computed */
    uint32_t auth_timeout_ms;
    uint32_t stall_timeout_ms;
    uint64_t start_ns;
    int spare_fd;               /* reserve fd: freed to shed a connection at EMFILE */
    /* durable state (coord_state.c) */
    struct cfx_list records;    /* struct coord_record, loaded at start */
    int state_dirfd;            /* -1: no state directory, nothing survives a restart */
    char state_dir[256];
    uint32_t ids_reserved;      /* node ids below this are recorded as taken */
    int listen_paused;          /* no fd even to shed with: accept resumes on a tick */
    struct cfx_ratelog emfile_log; /* "out of fds": connections shed */
    struct cfx_ratelog refuse_log; /* connections refused at max_conns or
                                      * max_unauth_per_ip */
    struct cfx_ratelog evict_log;  /* unauthenticated connections closed at
                                      * max_unauth_conns for a newer one */
    uint64_t refused_conns;     /* connections refused at a cap (metrics) */
    uint64_t evicted_conns;     /* unauthenticated connections closed for a newer one */
    uint64_t budget_closed;     /* connections closed at max_buffered */

    struct cfx_list conns;      /* open connections */
    struct cfx_list closing;    /* failed connections, closed in the hook */
    uint32_t nconns;
    uint32_t nunauth;           /* of those, not authenticated yet (nor failing) */
    struct cfx_list unauth;     /* those, oldest first (coord_conn.unauth_link) */
    struct cfx_list unauth_ip[COORD_UNAUTH_BUCKETS]; /* ... by source address */
    uint64_t ip_key[2];         /* random key of that hash (no chosen collisions) */
    uint64_t buffered;          /* reply bytes queued plus input buffers grown beyond
                                 * their first size, of connections not failing */
    /* caps (struct cfx_coord_params) */
    uint32_t max_node_objects;
    uint64_t max_node_bytes;
    uint32_t max_parked;
    uint32_t max_objects;       /* directory entries in all */
    uint32_t max_unauth_conns;
    uint32_t max_unauth_per_ip;
    uint32_t max_conns;
    uint64_t max_conn_outq;
    uint64_t max_buffered;
    uint32_t nparked;           /* lookups parked in all */
    uint32_t test_fsync_delay_ms; /* fault injection: each state fsync takes this longer */
    uint64_t last_tick_ns;      /* members_tick: when the last one ran (stall credit) */
    uint64_t state_writes;      /* records written or removed on disk (coord_state.c) */
    uint64_t turns_ended;       /* connection turns ended early, with frames left to parse:
                                 * after a disk write or a listing (coord.c conn_parse) */

    /* membership */
    struct cfx_list nodes;      /* struct coord_node, by id */
    struct coord_node **by_id;  /* open-addressing index by node id of every record
                                 * (alive or dead): slots follow the record count,
                                 * never the id values */
    uint32_t by_id_cap;         /* slots, power of two (0: none yet) */
    uint32_t by_id_count;       /* records in it */
    uint32_t max_nodes;         /* cap on members alive at once */
    uint32_t *reclaimed;        /* ids of before the restart taken back (sorted) */
    uint32_t nreclaimed;
    uint32_t next_node_id;      /* next id to assign; starts at 1 */
    uint32_t nodes_alive;
    uint32_t nodes_dead;        /* records of members gone, kept a while: died or left */
    uint32_t nodes_left;        /* ... of which left in good order (CFX_NODE_F_LEFT) */
    /* nodes_alive as other threads may read it (cfx__coord_wait_members):
     * the loop thread writes it under alive_mu and signals alive_cond */
    pthread_mutex_t alive_mu;
    pthread_cond_t alive_cond;
    uint32_t alive_pub;
    uint32_t joins;      /* joins and rejoins so far (loop thread) */
    uint32_t joins_pub;  /* ... as other threads may read it, as alive_pub */
    struct coord_metrics *metrics; /* the HTTP metrics endpoint (coord_metrics.c), or NULL */
    uint32_t restart_mark;      /* ids below it may belong to nodes of before the restart */
    uint64_t rejoin_until_ns;   /* until then such a node may still rejoin (0: no restart) */
    uint8_t ids_of_before;      /* no state directory, and a node of before a restart
                                 * rejoined, or a state directory without its id
                                 * record: a node that joined afresh may hold an id
                                 * that another process held before (coord.c) */
    struct cfx_list node_waits[COORD_NODE_WAIT_BUCKETS]; /* struct coord_node_wait, parked
                                 * NODE_GETs by a keyed hash of the node id: a rejoin walks
                                 * the waits of its own bucket only */
    uint64_t node_wait_key;     /* keys that hash (ids are the peers' to choose) */
    uint32_t nnode_waits;       /* of them, in all (capped by max_parked) */

    /* directory */
    struct cfx_list *buckets;
    uint32_t nbuckets;          /* power of two */
    uint32_t nobjects;
    struct cfx_list objects;
    uint64_t inline_bytes;
    /* entries in insertion order (seq), so that a listing's cursor is
     * found by a binary search; a dropped object leaves a hole (o NULL)
     * until the holes are compacted away (coord_dir_index.c) */
    struct coord_obj_slot {
        uint64_t seq;
        struct coord_obj *o;
    } *obj_index;
    uint32_t obj_index_len;     /* slots used, holes included */
    uint32_t obj_index_cap;
    uint32_t obj_index_holes;
    uint64_t obj_seq;           /* last seq handed out */
    struct cfx_list *parked;    /* struct coord_parked by id hash (coord_waits.c) */
    uint32_t nparked_buckets;   /* power of two */
    uint64_t parked_seed;       /* keys the hash: ids are the peers' to choose */
    struct cfx_list *del_waits; /* struct coord_del_wait by token, COORD_DEL_WAIT_BUCKETS */
    struct cfx_list *del_ids;   /* the same by object id (id_link), COORD_DEL_WAIT_BUCKETS */
    uint64_t next_token;        /* last EV_OBJ_GONE token handed out */
    struct coord_gone gone[COORD_GONE_KEEP]; /* ring of recent withdrawals */
    uint32_t gone_next;         /* next slot of the ring */

    /* tasks (coord_task.c) and placement (coord_place.c) */
    struct cfx_list tasks;      /* struct coord_task, live (queued or placed), oldest first */
    struct cfx_list tasks_done; /* ended, oldest first (COORD_TASKS_DONE_KEEP) */
    uint32_t ntasks_queued;
    uint32_t ntasks_done;
    uint64_t next_task_id;
    struct cfx_list resvs;      /* struct coord_resv */
    struct cfx_list task_waits; /* struct coord_task_wait */
    uint32_t ntask_waits;       /* of them (capped by max_parked) */
    uint32_t max_node_tasks;    /* cap: live reservations per node */
    uint32_t max_queued_tasks;  /* cap: tasks waiting for a slot (held ones too) */
    uint32_t task_grace_ms;     /* repeated submissions held this long after start */
    uint64_t first_task_id;     /* ids below were handed out by earlier incarnations */
    uint64_t tasks_ok;          /* tasks ended with CFX_OK (metrics) */
    uint64_t tasks_failed;      /* ... with an error */
};

/* coord_metrics.c: the metrics endpoint on the loop (params->metrics_addr);
 * reap frees the connections a batch closed (after-batch hook). */
struct coord_metrics;
int cfx__coord_metrics_start(struct cfx_coord *co, const char *hostport,
                             struct coord_metrics **out);
void cfx__coord_metrics_reap(struct coord_metrics *m);
void cfx__coord_metrics_stop(struct coord_metrics *m);

/* coord.c: publish nodes_alive to cfx__coord_wait_members() (loop thread). */
void cfx__coord_alive_publish(struct cfx_coord *co);

/* coord.c: replies and connection failure. */
void cfx__coord_send(struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_reply_ok(struct coord_conn *c, uint64_t req_id);
void cfx__coord_reply_err(struct coord_conn *c, uint64_t req_id, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void cfx__coord_conn_fail(struct coord_conn *c);
/* A paused connection whose peer took bytes since the last look (its
 * socket's send queue shrank): alive though its frames wait unread. */
bool cfx__coord_conn_draining(struct coord_conn *c);

/* coord_members.c */
void cfx__coord_members_init(struct cfx_coord *co);
void cfx__coord_members_fini(struct cfx_coord *co);
/* Resume node ids after the recorded high-water mark (state loaded). */
void cfx__coord_members_load(struct cfx_coord *co);
/* The rejoin window after a restart, ms: a node of before reconnects within
 * CFX_PROTO_RECONNECT_MAX_MS, and one that does not is dead by then. */
static inline uint32_t cfx__coord_rejoin_ms(const struct cfx_coord *co)
{
    return CFX_PROTO_RECONNECT_MAX_MS + co->dead_after_ms;
}

/* Ids below @p mark were given before this start (durable objects loaded
 * from the state directory name them as putters), whatever the id record
 * says: a mark above the recorded one is taken as if recorded, and opens
 * the rejoin window (see cfx__coord_dir_load). */
void cfx__coord_members_of_before(struct cfx_coord *co, uint32_t mark);
struct coord_node *cfx__coord_node_find(struct cfx_coord *co, uint32_t node_id);
void cfx__coord_join(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_leave(struct cfx_coord *co, struct coord_conn *c);
/* Mark @p n dead: drop its holdings and lookups, tell every live member,
 * close its connection (unless it left politely). */
void cfx__coord_node_kill(struct cfx_coord *co, struct coord_node *n, const char *why);
void cfx__coord_members_tick(struct cfx_coord *co, uint64_t now);
/* Answer NODE_GET; about a node of before a restart that has not rejoined
 * yet, once it rejoins or its rejoin window ends. */
void cfx__coord_node_get(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
/* Drop what @p c waits for in membership (it is closing). */
void cfx__coord_members_conn_gone(struct cfx_coord *co, struct coord_conn *c);
void cfx__coord_nodes_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
/* PS_LOADS: the next live node after the cursor that reported PS load. */
void cfx__coord_ps_loads_list(struct cfx_coord *co, struct coord_conn *c,
                              const struct cfx_msg *m);
void cfx__coord_node_fill(struct cfx_coord *co, const struct coord_node *n,
                          struct cfx_node_rec *out);

/* Little-endian fields of state records: @p n bytes of @p v at @p p. */
static inline void cfx__coord_put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t cfx__coord_get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* coord_state.c: durable versioned records (see there).  Keys are 1..64 of
 * [A-Za-z0-9._-]; values up to COORD_STATE_VAL_MAX bytes.  Without a state
 * directory the records live in memory only. */
int cfx__coord_state_open(struct cfx_coord *co, const char *dir);
void cfx__coord_state_close(struct cfx_coord *co);
/* Store @p val (copied) under @p key, durably before returning; *version
 * (may be NULL) receives the record's new version (1, 2, ...). */
int cfx__coord_state_put(struct cfx_coord *co, const char *key, const void *val, size_t len,
                         uint64_t *version);
/* A malloc'd copy of the record (caller frees *val); CFX_ERR_NOT_FOUND. */
int cfx__coord_state_get(struct cfx_coord *co, const char *key, void **val, size_t *len,
                         uint64_t *version);
/* @p sync: the removal is on disk when this returns (else it may come back
 * after a crash: for a record whose removal is made again then). */
int cfx__coord_state_del(struct cfx_coord *co, const char *key, bool sync);
/* Call @p fn for each record whose key starts with @p prefix, in load/put
 * order.  @p fn sees the stored bytes and must not put or delete records. */
void cfx__coord_state_foreach(struct cfx_coord *co, const char *prefix,
                              void (*fn)(void *arg, const char *key, const void *val,
                                         size_t len),
                              void *arg);

/* coord_directory.c */
int cfx__coord_dir_init(struct cfx_coord *co);
/* Put the durable inline objects of the state store back into the directory
 * (after cfx__coord_state_open(), cfx__coord_members_load() and
 * cfx__coord_dir_init()).  A record that does not parse is logged and
 * skipped.  Their putters' ids count as of before the restart even when
 * the id record is lost (cfx__coord_members_of_before). */
void cfx__coord_dir_load(struct cfx_coord *co);
/* Free the directory; durable records stay in the state directory. */
void cfx__coord_dir_fini(struct cfx_coord *co);
void cfx__coord_obj_put(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_obj_lookup(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_obj_done(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_obj_delete(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_obj_gone_ack(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_objects_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
/* A heartbeat of node @p n told how far its copies being received got. */
void cfx__coord_dir_progress(struct cfx_coord *co, struct coord_node *n,
                             const struct cfx_msg_heartbeat *hb);
/* A node died or left: drop its holdings. */
void cfx__coord_dir_node_gone(struct cfx_coord *co, struct coord_node *n);
/* The rejoin window after a restart ended: durable objects whose putter did
 * not come back lose their record and go as ordinary objects. */
void cfx__coord_dir_rejoin_over(struct cfx_coord *co);
/* A connection closes or stops being a member: drop its parked lookups. */
void cfx__coord_dir_conn_gone(struct cfx_coord *co, struct coord_conn *c);

/* coord_waits.c: what the directory parks, indexed so that an event
 * touches its own waiters only: lookups waiting for a holder of an id (by
 * id, keyed hash) and deletes waiting for holders' acknowledgements (by
 * token).  Each has a deadline and caps per connection and in all. */
int cfx__coord_waits_init(struct cfx_coord *co);
void cfx__coord_waits_fini(struct cfx_coord *co);
/* The most parked lookups, or task waits, one connection may hold now:
 * COORD_PARKED_PER_CONN, or less, its share of max_parked among the live
 * members (at least COORD_PARKED_SHARE_MIN), so that a few members cannot
 * take the whole budget. */
uint32_t cfx__coord_wait_share(struct cfx_coord *co);
/* Park @p m (an OBJ_LOOKUP with a timeout) of @p c; when a cap refuses it
 * (or memory runs out) @p c is answered and NULL returned. */
struct coord_parked *cfx__coord_parked_add(struct cfx_coord *co, struct coord_conn *c,
                                           const struct cfx_msg *m);
void cfx__coord_parked_free(struct cfx_coord *co, struct coord_parked *p);
/* The latest withdrawal of @p id still remembered (COORD_GONE_KEEP), or NULL. */
const struct coord_gone *cfx__coord_gone_find(struct cfx_coord *co,
                                              const struct cfx_object_id *id);
/* The bucket that holds the lookups parked for @p id (others too: compare). */
struct cfx_list *cfx__coord_parked_bucket(struct cfx_coord *co, const struct cfx_object_id *id);
/* True (and @p c answered) when @p c may not have one more delete waiting. */
bool cfx__coord_del_waits_full(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                               const struct cfx_object_id *id);
/* True (and @p c answered CFX_ERR_EXISTS) when a delete of @p id waits for
 * holders other than @p c's node: the id is not free yet.  A plain put from
 * a holder it waits for counts as that holder's acknowledgement (its store
 * let the put through, so its copy left); a copy re-announced (@p copy) is
 * one still held, and does not. */
bool cfx__coord_del_waits_put(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                              const struct cfx_object_id *id, bool copy);
/* A waiting delete for up to @p nholders acknowledgements, or NULL (no memory). */
struct coord_del_wait *cfx__coord_del_wait_new(struct cfx_coord *co, struct coord_conn *c,
                                               uint64_t req_id, const struct cfx_object_id *id,
                                               uint32_t nholders);
/* The events are sent: wait (deadline armed) when some holder is to
 * answer, else answer the delete now. */
void cfx__coord_del_wait_start(struct cfx_coord *co, struct coord_del_wait *w);
/* Node @p node died or left: deletes stop waiting for it. */
void cfx__coord_del_waits_node_gone(struct cfx_coord *co, uint32_t node);
/* Drop @p c's parked lookups and waiting deletes (it closes or stops
 * being a member). */
void cfx__coord_waits_conn_gone(struct cfx_coord *co, struct coord_conn *c);

/* coord_dir_index.c: the directory's entries in insertion order, for the
 * OBJECTS listing (cursor found in O(log n)). */
int cfx__coord_dir_index_add(struct cfx_coord *co, struct coord_obj *o);
void cfx__coord_dir_index_del(struct cfx_coord *co, struct coord_obj *o);
void cfx__coord_dir_index_fini(struct cfx_coord *co);

/* coord_task.c */
void cfx__coord_task_init(struct cfx_coord *co);
void cfx__coord_task_fini(struct cfx_coord *co);
void cfx__coord_task_reg(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_task_submit(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
/* TASKS: a page of the task listing, live and ended tasks by id (rdmactl tasks). */
void cfx__coord_tasks_list(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_task_place(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_task_wait(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
void cfx__coord_task_done(struct cfx_coord *co, struct coord_conn *c, const struct cfx_msg *m);
/* TASK_ANNOUNCE: a worker re-announces a task it runs (for itself only). */
void cfx__coord_task_announce(struct cfx_coord *co, struct coord_conn *c,
                              const struct cfx_msg *m);
/* Deadlines, expired reservations, queued tasks that fit now. */
void cfx__coord_task_tick(struct cfx_coord *co, uint64_t now);
/* Node @p n died or left (its holdings are dropped already): its tasks are
 * placed again or fail naming it; its reservations and functions go. */
void cfx__coord_task_node_gone(struct cfx_coord *co, struct coord_node *n);
/* Node @p n joined asking for id @p was and got another: the tasks that
 * moved off @p was when it was declared dead fence @p n too. */
void cfx__coord_task_rejoined(struct cfx_coord *co, struct coord_node *n, uint32_t was);
/* A put of @p id by the node of @p c that is a result of a task fenced
 * against it: refused here (CFX_ERR_CANCELED, answered) and true. */
bool cfx__coord_task_put_fenced(struct cfx_coord *co, struct coord_conn *c, uint64_t req_id,
                                const struct cfx_object_id *id);
void cfx__coord_task_conn_gone(struct cfx_coord *co, struct coord_conn *c);

/* coord_place.c: choose a node for @p t.  CFX_OK with *out; CFX_ERR_NOT_FOUND
 * when no live node registered the function; CFX_ERR_NO_RESOURCE when none
 * could ever meet the needs (or is under the per-node cap... see there);
 * CFX_ERR_BUSY when capable nodes exist but none has room now.  @p why
 * receives the reason of a failure.  Nodes in @p avoid are skipped. */
int cfx__coord_place(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t avoid,
                     struct coord_node **out, char *why, size_t why_len);
/* Where data goes (CFX_PROTO_TASK_DATA): any live member, @p asker first
 * among equally local ones, no reservation (coord_place.c). */
int cfx__coord_place_data(struct cfx_coord *co, const struct cfx_msg_task *t, uint32_t asker,
                          struct coord_node **out, char *why, size_t why_len);
/* Hold what @p t needs on @p n until @p expires_ns (UINT64_MAX: until freed). */
struct coord_resv *cfx__coord_resv_take(struct cfx_coord *co, struct coord_node *n,
                                        const struct cfx_msg_task *t, uint64_t expires_ns);
void cfx__coord_resv_free(struct cfx_coord *co, struct coord_resv *r);

/* coord_directory.c: bytes of object @p id that node @p node_id holds (a
 * complete copy counts its size, a partial one half: the directory does not
 * know how far it got); whether a live node other than @p dead holds a
 * complete copy (or the coordinator holds it inline). */
uint64_t cfx__coord_dir_held_bytes(struct cfx_coord *co, const struct cfx_object_id *id,
                                   uint32_t node_id);
int cfx__coord_dir_held_elsewhere(struct cfx_coord *co, const struct cfx_object_id *id,
                                  uint32_t dead);
/* coord_directory.c: object @p id, put by node @p putter, is a result of a task
 * that node @p submitter submitted: that node may withdraw it from now on as
 * the putter may (cfx__coord_obj_delete).  No-op when the object is not
 * there or another node put it. */
void cfx__coord_dir_task_result(struct cfx_coord *co, const struct cfx_object_id *id,
                                uint32_t putter, uint32_t submitter);

#endif

/*
 * Control-plane wire protocol.
 *
 * Every message is one frame: a 16-byte header followed by payload_len bytes
 * of payload.  All integers are little-endian.
 *
 *   u16 magic (CFX_PROTO_MAGIC)   u8 version   u8 type
 *   u32 payload_len               u64 req_id
 *
 * Requests carry a caller-chosen req_id that the reply echoes; events and
 * the challenge use req_id 0.  Strings travel in fixed-size fields and must
 * be NUL-terminated inside them; the error text travels as u16 length +
 * bytes (no NUL inside).  Listings are paginated (CFX_PROTO_NODES_PAGE,
 * CFX_PROTO_OBJECTS_PAGE records per reply) so that no frame exceeds
 * CFX_PROTO_MAX_PAYLOAD.
 *
 * Decoders are pure functions over (buf, len): they never allocate, never
 * read outside [buf, buf+len), and validate every field (type known, lengths
 * inside the frame and inside their bounds, strings terminated, counts
 * bounded, flags 0/1 or known bits only, no trailing bytes).  Decoded
 * messages may point into the frame (inline data, listing records): keep the
 * frame alive while the message is used.  On failure they return CFX_ERR_PROTO, CFX_ERR_TOO_BIG or
 * CFX_ERR_VERSION and set cfx_last_error().
 *
 * Sealed frames (CFX_SECURE=integrity or encrypt, control/ctl_seal.h): the
 * handshake frames (CHALLENGE, AUTH, AUTH_OK and a refusal) travel plain;
 * every frame after AUTH_OK, each way, is one AES-256-GCM record: the header
 * in clear as associated data, its payload_len counting the payload plus the
 * CFX_SEAL_TAG_LEN (16) byte tag that follows the payload; the payload is
 * encrypted (encrypt) or in clear (integrity).  The decoders here see only
 * opened frames (payload_len without the tag).
 *
 * Thread safety: all functions are reentrant.
 */
#ifndef CFX_CONTROL_PROTO_H
#define CFX_CONTROL_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <conflux/object.h>
#include <conflux/task.h>
#include "control/client.h"

#define CFX_PROTO_MAGIC        0xCF1Cu
#define CFX_PROTO_VERSION      13u /* 2: host name and flags in node records, object names;
                                    * 3: EV_OBJ_GONE / OBJ_GONE_ACK, put tags and copies,
                                    * the putter in LOOKUP_REPLY;
                                    * 4: tasks (TASK_*), load in HEARTBEAT;
                                    * 5: the role under both AUTH MACs, traffic in
                                    *    HEARTBEAT, each node's last report in
                                    *    NODES_REPLY, the TASKS listing;
                                    * 6: partial copies' progress in HEARTBEAT,
                                    *    each holder's ready bytes in OBJECTS_REPLY;
                                    * 7: CFX_SECURE: the mode in CHALLENGE and AUTH,
                                    *    role | mode under both AUTH MACs, and sealed
                                    *    frames after AUTH_OK (below): a v6 peer
                                    *    would read sealed frames as garbage;
                                    * 8: extra sources wanted in OBJ_LOOKUP, extra
                                    *    complete holders in LOOKUP_REPLY (striping);
                                    * 9: traffic per peer in HEARTBEAT;
                                    * 10: parameter-server load per block in
                                    *     HEARTBEAT, the PS_LOADS listing; data
                                    *     placement (TASK_PLACE flag); tasks survive
                                    *     a coordinator restart: an idempotency key,
                                    *     the submitter and a node hint in every task
                                    *     body, the AGAIN flag of a repeated
                                    *     TASK_SUBMIT, TASK_ANNOUNCE;
                                    * 11: EV_STOPPING, the coordinator's goodbye;
                                    * 12: OBJ_DELETE's end flag (a task's submitter
                                    *     withdraws its results);
                                    * 13: OBJ_DELETE's put_below (a delete that
                                    *     found no copy takes no later put) */
#define CFX_PROTO_HDR_LEN      16u
#define CFX_PROTO_MAX_PAYLOAD  (1u << 20)  /* 1 MiB; fits a 64 KiB inline object and a listing page */
#define CFX_PROTO_NONCE_LEN    32u
#define CFX_PROTO_MAC_LEN      32u          /* HMAC-SHA256 */
#define CFX_PROTO_TEXT_MAX     512u         /* error text incl. NUL */
#define CFX_PROTO_EXCLUDE_MAX  64u          /* nodes one lookup may exclude */
#define CFX_PROTO_EXTRA_MAX    (CFX_CTL_SOURCES_MAX - 1u) /* extra sources in one LOOKUP_REPLY */
#define CFX_PROTO_NODES_PAGE   256u         /* node records per NODES_REPLY */
#define CFX_PROTO_OBJECTS_PAGE 1024u        /* object records per OBJECTS_REPLY */
#define CFX_PROTO_HOLDERS_MAX  16u          /* holders per listed object (see cfx_ctl_obj_rec) */
#define CFX_PROTO_TIMEOUT_NONE 0xFFFFFFFFu  /* lookup timeout_ms: wait forever */
#define CFX_PROTO_WAIT_MARGIN_MS 10000u    /* a TASK_WAIT's call waits this much past its
                                            * timeout (the reply's round trip) */
/* Heartbeat interval and dead-after time: at most an hour.  A client refuses
 * a coordinator's larger one (proto.c's error text says the number). */
#define CFX_PROTO_TIMING_MAX_MS 3600000u
#define CFX_PROTO_RECONNECT_MAX_MS 2000u    /* a client that lost the coordinator tries again at least this often */

/* Fixed wire sizes of the records that listings carry. */
#define CFX_PROTO_ADDR_WIRE     (CFX_TP_NAME_MAX + 1 + CFX_TP_ADDR_MAX)
#define CFX_PROTO_NODE_WIRE     (4 + 4 + CFX_NODE_NAME_MAX + CFX_HOST_ID_MAX + 48 + 1 + 4 + 1 + \
                                 CFX_NODE_ADDRS_MAX * CFX_PROTO_ADDR_WIRE + CFX_HOST_NAME_MAX + 1)
#define CFX_PROTO_LOAD_WIRE     (4 + 8 + 8 + 4 + 1 + \
                                 CFX_LOAD_TPS_MAX * (CFX_TP_NAME_MAX + 8 + 8) + 4 + 4 + 8 * 8)
#define CFX_PROTO_NODE_LIST_WIRE (CFX_PROTO_NODE_WIRE + CFX_PROTO_LOAD_WIRE) /* NODES_REPLY */
#define CFX_PROTO_TASKS_PAGE    256u         /* task records per TASKS_REPLY */
#define CFX_PROTO_TASKREC_WIRE  (8 + 64 + 1 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 8 + 1 + 1 + \
                                 CFX_OBJECT_ID_LEN + CFX_CTL_TASK_TEXT_MAX)
#define CFX_PROTO_HOLDER_WIRE   (4 + 1 + 4 + 4 + 8)
#define CFX_PROTO_PROGRESS_WIRE (CFX_OBJECT_ID_LEN + 8) /* one cfx_ctl_progress in HEARTBEAT */
#define CFX_PROTO_PEER_WIRE     (4 + 1 + 8 + 8) /* one cfx_ctl_peer_traffic in HEARTBEAT */
#define CFX_PROTO_PS_BLOCK_WIRE (1 + 4 + 8 + 8) /* one cfx_ctl_ps_block */
#define CFX_PROTO_PS_SERVER_WIRE(joblen) (1 + (joblen) + 4 + 4 + 8 + 8) /* cfx_ctl_ps_server */
#define CFX_PROTO_OBJREC_WIRE   (CFX_OBJECT_ID_LEN + 8 + 4 + 1 + 4 + \
                                 CFX_PROTO_HOLDERS_MAX * CFX_PROTO_HOLDER_WIRE + \
                                 CFX_OBJ_NAME_MAX + 1)

/* OBJ_PUT flags byte. */
#define CFX_PROTO_PUT_INLINE  0x01u /* the frame carries all size bytes */
#define CFX_PROTO_PUT_DURABLE 0x02u /* keep it in the state directory (needs INLINE) */
#define CFX_PROTO_PUT_NAMED   0x04u /* u8 length (1..CFX_OBJ_NAME_MAX), name bytes (no NUL) */
#define CFX_PROTO_PUT_AGAIN   0x08u /* a repeat (sent again after a reconnect, or a
                                     * re-announce): acknowledged when the sender
                                     * already holds it as its putter, same size and
                                     * chunk size */
#define CFX_PROTO_PUT_TAGGED  0x10u /* u64 tag after the name: the putter's mark of this
                                     * put, told apart from other puts of the id */
#define CFX_PROTO_PUT_COPY    0x20u /* u32 putter node after that: the sender holds a
                                     * complete copy of that node's put (announced again
                                     * after a restart), not a put of its own */
#define CFX_PROTO_PUT_FLAGS   0x3fu /* every flag known; other bits are refused */

/* Request id of a node_dead event: why the node is gone. */
#define CFX_PROTO_EV_DIED 0 /* connection lost or heartbeats missed */
#define CFX_PROTO_EV_LEFT 1 /* it left the cluster in good order */

enum cfx_msg_type {
    CFX_MSG_ERROR = 1,      /* reply: status + text */
    CFX_MSG_OK,             /* reply: success, no body */
    CFX_MSG_CHALLENGE,      /* coord -> client on accept: server nonce */
    CFX_MSG_AUTH,           /* client -> coord: role, client nonce, client MAC */
    CFX_MSG_AUTH_OK,        /* coord -> client: coordinator MAC (mutual auth) */
    CFX_MSG_JOIN,           /* node record -> JOIN_REPLY */
    CFX_MSG_JOIN_REPLY,     /* node id, heartbeat_ms, dead_after_ms */
    CFX_MSG_LEAVE,          /* no body, no reply */
    CFX_MSG_HEARTBEAT,      /* load and copies' progress, no reply */
    CFX_MSG_OBJ_PUT,        /* id, size, chunk size, flags, inline data -> OK */
    CFX_MSG_OBJ_LOOKUP,     /* id, timeout, exclude list -> LOOKUP_REPLY */
    CFX_MSG_LOOKUP_REPLY,   /* id, size, chunk size, source node or inline data */
    CFX_MSG_OBJ_DONE,       /* id, source node, complete -> OK */
    CFX_MSG_OBJ_DELETE,     /* id -> OK */
    CFX_MSG_NODE_GET,       /* node id -> NODE_REPLY */
    CFX_MSG_NODE_REPLY,     /* node record */
    CFX_MSG_STATUS,         /* no body -> STATUS_REPLY */
    CFX_MSG_STATUS_REPLY,   /* coordinator summary */
    CFX_MSG_NODES,          /* cursor -> NODES_REPLY */
    CFX_MSG_NODES_REPLY,    /* page of node records */
    CFX_MSG_OBJECTS,        /* cursor -> OBJECTS_REPLY */
    CFX_MSG_OBJECTS_REPLY,  /* page of object records */
    CFX_MSG_EV_NODE_DEAD,   /* event, coord -> members: node id; req_id says why */
    CFX_MSG_EV_OBJ_GONE,    /* event, coord -> holders: id withdrawn; req_id != 0 asks
                             * for an OBJ_GONE_ACK with that req_id */
    CFX_MSG_OBJ_GONE_ACK,   /* id: this node dropped its copy; no reply */
    CFX_MSG_TASK_REG,       /* function name, node's cores, GPUs, memory -> OK */
    CFX_MSG_TASK_SUBMIT,    /* task -> TASK_REPLY (task id, node placed on or 0: queued) */
    CFX_MSG_TASK_PLACE,     /* task (no id) -> TASK_REPLY (node), reserves for reserve_ms */
    CFX_MSG_TASK_REPLY,     /* task id, node, status, text */
    CFX_MSG_TASK_WAIT,      /* task id, timeout -> TASK_REPLY once it ended (status
                             * CFX_ERR_AGAIN when the timeout came first) */
    CFX_MSG_EV_TASK_RUN,    /* event, coord -> worker: run this task */
    CFX_MSG_TASK_DONE,      /* worker -> coord: task id, status, text; no reply */
    CFX_MSG_TASKS,          /* cursor (task id) -> TASKS_REPLY */
    CFX_MSG_TASKS_REPLY,    /* page of task records, by id */
    CFX_MSG_PS_LOADS,       /* node id cursor -> PS_LOADS_REPLY */
    CFX_MSG_PS_LOADS_REPLY, /* the PS load last reported by the first live node after
                             * the cursor that reported some (node 0: none) */
    CFX_MSG_TASK_ANNOUNCE,  /* worker -> coord after a reconnect: a task it runs (or ran
                             * and may not have reported) -> OK; name "": all announced */
    CFX_MSG_EV_STOPPING,    /* event, coord -> every client as it stops in order: no body;
                             * the connection's end that follows is not a failure */
    CFX_MSG_TYPE_END        /* one past the last type */
};

struct cfx_msg_hdr {
    uint16_t magic;
    uint8_t version;
    uint8_t type;           /* enum cfx_msg_type */
    uint32_t payload_len;   /* bytes after the header */
    uint64_t req_id;        /* 0 for events */
};

/* A heartbeat: the node's load, how far its copies being received got
 * (after the load: u8 count, then count records of CFX_PROTO_PROGRESS_WIRE
 * bytes; count at most CFX_CTL_PROGRESS_MAX, ready never
 * CFX_CTL_READY_UNKNOWN), and its traffic per peer (u8 count, at most
 * CFX_CTL_PEERS_MAX, then count records of CFX_PROTO_PEER_WIRE bytes: u32
 * peer, u8 tp below the load's ntp, u64 tx, u64 rx), then its parameter-server
 * load (cfx__msg_ps_wr below). */
struct cfx_msg_heartbeat {
    struct cfx_msg_load load;
    uint32_t nprogress;                     /* entries of progress used */
    struct cfx_ctl_progress progress[CFX_CTL_PROGRESS_MAX];
    uint32_t npeers;                        /* entries of peers used */
    struct cfx_ctl_peer_traffic peers[CFX_CTL_PEERS_MAX];
    struct cfx_ctl_ps_report ps;            /* PS servers and their heaviest blocks */
};

/* PS_LOADS_REPLY: u32 node, u8 more, then the node's report as in HEARTBEAT. */
struct cfx_msg_ps_loads {
    uint32_t node_id;                       /* 0: no such node after the cursor */
    uint8_t more;                           /* 1: a node after it reported some too */
    struct cfx_ctl_ps_report ps;
};

/* A listing page.  Encode: set recs_in (count entries).  Decode: raw points
 * into the frame; read records with cfx__msg_node_at()/cfx__msg_obj_at(). */
struct cfx_msg_page {
    uint32_t count;         /* records in this page */
    uint32_t next;          /* cursor for the next request */
    uint8_t more;           /* 1: another page follows */
    const void *recs_in;    /* encode: struct cfx_node_rec[] or struct cfx_ctl_obj_rec[] */
    const uint8_t *raw;     /* decode: count fixed-size wire records */
};

/* A task: TASK_SUBMIT, TASK_PLACE, EV_TASK_RUN, TASK_ANNOUNCE. */
#define CFX_PROTO_TASK_PACK  0x01u /* policy: pack, not spread */
#define CFX_PROTO_TASK_AGAIN 0x02u /* SUBMIT: a repeat (its reply may have been lost, or
                                    * the coordinator restarted since): deduplicated on
                                    * key; held back while workers re-announce */
/* TASK_PLACE only: where data goes (an object reduce's result), not a task:
 * every live member is a candidate, the asker ranks first among nodes that
 * hold as many input bytes, and no reservation is taken */
#define CFX_PROTO_TASK_DATA  0x04u
#define CFX_PROTO_TASK_FLAGS 0x07u /* every flag known; other bits are refused */
struct cfx_msg_task {
    uint64_t task_id;                       /* EV_TASK_RUN, ANNOUNCE: the coordinator's id;
                                             * SUBMIT with AGAIN: the id it had, or 0 */
    uint64_t key;                           /* idempotency key chosen by the submitter
                                             * (SUBMIT, RUN, ANNOUNCE: never 0); PLACE: 0 */
    uint32_t submitter;                     /* RUN, ANNOUNCE: node that submitted it */
    uint32_t hint_node;                     /* SUBMIT with AGAIN: node it was placed on
                                             * (0: unknown) */
    char name[CFX_TASK_NAME_MAX + 1];       /* function; "" (PLACE only): any */
    uint32_t timeout_ms;                    /* deadline from submission */
    uint32_t cores;                         /* needs */
    uint32_t gpus;
    uint64_t memory;
    uint8_t flags;                          /* CFX_PROTO_TASK_* */
    uint32_t reserve_ms;                    /* PLACE: how long the reservation holds */
    char group[CFX_TASK_GROUP_MAX + 1];     /* anti-affinity group; "" none */
    uint8_t nnodes;                         /* node set (0: any) */
    uint32_t nodes[CFX_TASK_NODES_MAX];
    uint8_t ninputs;
    struct cfx_object_id inputs[CFX_TASK_IO_MAX];
    uint8_t nresults;
    struct cfx_object_id results[CFX_TASK_IO_MAX];
    uint16_t arg_len;                       /* <= CFX_TASK_ARG_MAX */
    const uint8_t *arg;                     /* decode: points into the frame */
};

/* A page of the task listing (TASKS_REPLY). */
struct cfx_msg_tpage {
    uint32_t count;         /* records in this page */
    uint64_t next;          /* cursor for the next request: the last id listed */
    uint8_t more;           /* 1: another page follows */
    const struct cfx_ctl_task_rec *recs_in; /* encode */
    const uint8_t *raw;     /* decode: count records of CFX_PROTO_TASKREC_WIRE bytes */
};

/* A task's state: TASK_REPLY, TASK_WAIT, TASK_DONE. */
struct cfx_msg_task_st {
    uint64_t task_id;
    uint32_t node_id;                       /* placed on / ran on (0: queued, none) */
    int32_t status;                         /* 0 or a negative cfx_status */
    uint32_t timeout_ms;                    /* WAIT: how long to wait; CFX_PROTO_TIMEOUT_NONE */
    char text[CFX_PROTO_TEXT_MAX];          /* why it failed; "" */
};

struct cfx_msg {
    uint8_t type;           /* enum cfx_msg_type */
    uint64_t req_id;
    union {
        struct {
            int32_t status;                 /* negative cfx_status */
            char text[CFX_PROTO_TEXT_MAX];  /* NUL-terminated */
        } error;
        struct {
            uint8_t nonce[CFX_PROTO_NONCE_LEN];
            uint8_t secure;                 /* the coordinator's enum cfx_seal_mode */
        } challenge;
        struct {
            uint8_t role;                   /* enum cfx_ctl_role */
            uint8_t nonce[CFX_PROTO_NONCE_LEN];
            uint8_t mac[CFX_PROTO_MAC_LEN];
            uint8_t secure;                 /* the client's enum cfx_seal_mode (under the MAC) */
        } auth;
        struct {
            uint8_t mac[CFX_PROTO_MAC_LEN];
        } auth_ok;
        struct cfx_node_rec join;           /* JOIN and NODE_REPLY */
        struct {
            uint32_t node_id;
            uint32_t heartbeat_ms;
            uint32_t dead_after_ms;
        } join_reply;
        struct {
            struct cfx_object_id id;
            uint64_t size;
            uint32_t chunk_size;
            uint8_t has_data;               /* 1: data holds all size bytes */
            uint8_t durable;                /* 1: survives a coordinator restart (has_data) */
            uint8_t again;                  /* 1: may repeat a put already processed */
            uint8_t copy;                   /* 1: a copy of @p putter's put (PUT_COPY) */
            uint32_t putter;                /* copy: the node that put it */
            uint64_t tag;                   /* the putter's mark of this put; 0 none */
            const uint8_t *data;
            char name[CFX_OBJ_NAME_MAX + 1]; /* name the id was made from; "" none */
        } put;
        struct {
            struct cfx_object_id id;
            uint32_t timeout_ms;            /* CFX_PROTO_TIMEOUT_NONE = forever */
            uint32_t nexclude;
            uint32_t exclude[CFX_PROTO_EXCLUDE_MAX];
            uint8_t want;                   /* extra complete holders wanted (striping),
                                             * at most CFX_PROTO_EXTRA_MAX */
        } lookup;
        struct {
            struct cfx_object_id id;
            uint64_t size;
            uint32_t chunk_size;
            uint8_t is_inline;              /* 1: data, else node */
            uint8_t complete;               /* source holds a complete copy */
            const uint8_t *data;            /* size bytes when is_inline */
            struct cfx_node_rec node;       /* source when !is_inline */
            uint32_t putter;                /* the node that put it (0 unknown) */
            uint64_t tag;                   /* its mark of the put (0 none) */
            uint8_t nextra;                 /* extra complete holders (striping) */
            uint32_t extra[CFX_PROTO_EXTRA_MAX]; /* their node ids */
        } lookup_reply;
        struct {
            struct cfx_object_id id;
            uint32_t source_node;
            uint8_t complete;
        } done;
        struct {
            struct cfx_object_id id;
            uint8_t end;        /* withdraw the object when this node may (its
                                 * putter always does; the submitter of the task
                                 * that put it only with this); 0: drop this
                                 * node's copy (a cfx_get_alloc buffer freed) */
            uint64_t put_below; /* 0: any put of this node's goes; else only
                                 * one with a tag below it (sent by a delete
                                 * that found no copy on its node: a put
                                 * there begun after it is not its to take;
                                 * with end 0, a failed put's withdrawal,
                                 * which takes no other node's object) */
        } del;
        struct {
            uint32_t node_id;
        } node_get;
        struct cfx_ctl_status status;       /* STATUS_REPLY */
        struct {
            uint32_t cursor;                /* NODES: after this node id; OBJECTS: index */
        } list;
        struct cfx_msg_page page;           /* NODES_REPLY, OBJECTS_REPLY */
        uint64_t task_cursor;               /* TASKS: list ids above this */
        struct cfx_msg_tpage tpage;         /* TASKS_REPLY */
        struct {
            uint32_t node_id;
        } node_dead;
        struct {
            struct cfx_object_id id;
        } gone;                             /* EV_OBJ_GONE, OBJ_GONE_ACK */
        struct {
            char name[CFX_TASK_NAME_MAX + 1];
            uint32_t cores;                 /* what the node offers */
            uint32_t gpus;
            uint64_t memory;
        } task_reg;
        struct cfx_msg_task task;           /* TASK_SUBMIT, TASK_PLACE, EV_TASK_RUN */
        struct cfx_msg_task_st task_st;     /* TASK_REPLY, TASK_WAIT, TASK_DONE */
        struct cfx_msg_heartbeat hb;        /* HEARTBEAT */
        uint32_t ps_cursor;                 /* PS_LOADS: list the nodes after this id */
        struct cfx_msg_ps_loads ps_loads;   /* PS_LOADS_REPLY */
    } u;
};

/* Name of a message type ("OBJ_LOOKUP"), "?" when unknown. */
const char *cfx__msg_type_name(unsigned type);

/* Validate and decode the 16-byte header at @p buf (@p len bytes available).
 * CFX_ERR_PROTO (short, bad magic, unknown type), CFX_ERR_VERSION,
 * CFX_ERR_TOO_BIG (payload_len over CFX_PROTO_MAX_PAYLOAD). */
int cfx__msg_hdr_decode(const void *buf, size_t len, struct cfx_msg_hdr *out);

/* Decode exactly one whole frame of @p len bytes (header + payload). */
int cfx__msg_decode(const void *buf, size_t len, struct cfx_msg *out);

/* Bytes the encoded frame of @p m takes (header included). */
size_t cfx__msg_encoded_len(const struct cfx_msg *m);

/* Encode @p m into @p buf of @p cap bytes; *len receives the frame size.
 * CFX_ERR_TOO_BIG when it does not fit or the payload would exceed
 * CFX_PROTO_MAX_PAYLOAD; CFX_ERR_INVALID for an unknown type or a field out
 * of range (for example inline data over CFX_OBJECT_INLINE_MAX). */
int cfx__msg_encode(const struct cfx_msg *m, void *buf, size_t cap, size_t *len);

/* As cfx__msg_encode() into a malloc'd buffer the caller frees. */
int cfx__msg_encode_alloc(const struct cfx_msg *m, uint8_t **buf, size_t *len);

/* proto_task.c: payloads of the task messages and the heartbeat (types
 * TASK_* and HEARTBEAT), called by the codec in proto.c. */
struct wr;
struct rd;
int cfx__msg_task_encode(const struct cfx_msg *m, struct wr *w);
/* A node's load and traffic: CFX_PROTO_LOAD_WIRE bytes (HEARTBEAT, NODES_REPLY). */
void cfx__msg_load_wr(struct wr *w, const struct cfx_msg_load *l);
void cfx__msg_load_rd(struct rd *r, struct cfx_msg_load *l);
/* Record @p i of a decoded TASKS_REPLY. */
void cfx__msg_task_at(const struct cfx_msg *m, uint32_t i, struct cfx_ctl_task_rec *out);
void cfx__msg_task_decode(struct rd *r, struct cfx_msg *m);

/* proto_ps.c: a parameter-server load report (HEARTBEAT, PS_LOADS_REPLY):
 * u8 nservers (at most CFX_CTL_PS_SERVERS_MAX), each u8 job length (1..
 * CFX_CTL_PS_JOB_MAX), job, u32 server, u32 blocks, u64 requests, u64 bytes;
 * u8 nblocks (at most CFX_CTL_PS_BLOCKS_MAX), each u8 srv (below nservers),
 * u32 block, u64 requests, u64 bytes.  The reader also refuses a (job,
 * server) or (srv, block) listed twice.  The writer returns CFX_ERR_INVALID
 * for a report out of these bounds. */
int cfx__msg_ps_wr(struct wr *w, const struct cfx_ctl_ps_report *ps);
void cfx__msg_ps_rd(struct rd *r, struct cfx_ctl_ps_report *ps);
/* PS_LOADS and PS_LOADS_REPLY payloads. */
int cfx__msg_ps_encode(const struct cfx_msg *m, struct wr *w);
void cfx__msg_ps_decode(struct rd *r, struct cfx_msg *m);

/* Record @p i of a decoded NODES_REPLY / OBJECTS_REPLY page (i < count). */
void cfx__msg_node_at(const struct cfx_msg *m, uint32_t i, struct cfx_node_rec *out);
void cfx__msg_obj_at(const struct cfx_msg *m, uint32_t i, struct cfx_ctl_obj_rec *out);

#endif

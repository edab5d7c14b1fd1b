/*
 * The in-process coordinator fixture of the coordinator tests (test_coord,
 * test_coord_dir): a coordinator on 127.0.0.1 with short heartbeats, control
 * clients on it, and raw sockets that write and read frames by hand.
 * coord_fixture_setup/teardown are a TestSuite's .init and .fini; a test that
 * needs other coordinator settings stops it, sets fanout, max_nodes, caps or
 * dead_keep_ms, and calls start_coord() (and puts the setting back).
 */
#ifndef CFX_TEST_COORD_FIXTURE_H
#define CFX_TEST_COORD_FIXTURE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/client.h"
#include "control/coord.h"
#include "control/ctl_seal.h"
#include "control/proto.h"

#define HB_MS    100
#define DEAD_MS  600
#define FANOUT   2
#define AUTH_MS  2000
#define STALL_MS 1500
#define BIG      (1u << 20) /* a size that does not travel inline */
#define CALL_MS  20000      /* a call's or a wait's limit: ends only a hang */

extern struct cfx_coord *coord;      /* the running coordinator */
extern char token[64];               /* its cluster token */
extern char addr[64];                /* its "127.0.0.1:port" */
extern uint32_t dead_keep_ms;        /* 0: the coordinator's default */
extern uint32_t fanout;              /* FANOUT; 0: chosen per object */
extern uint32_t max_nodes;           /* 0: the coordinator's default */
extern struct cfx_coord_params caps; /* max_* fields, 0: the coordinator's defaults;
                                     * secure: the coordinator's CFX_SECURE */
extern int client_secure;            /* CFX_SECURE of open_node()/open_admin() clients */
extern const struct cfx_msg_load *node_report; /* what open_node()'s heartbeats report
                                                * (NULL: nothing, all zero); read until
                                                * those clients close */

/* node_dead events seen by one client, and the goodbyes (nodes that left) */
struct deaths {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every event */
    uint32_t ids[256];
    uint64_t when_ns[256];
    int n;
    uint32_t left[256];
    int nleft;
};

/* One lookup_thread() run: what to look up (ctl, id, timeout_ms, start) and
 * what came back (rc, elapsed_ms, src). */
struct lookup_job {
    struct cfx_ctl *ctl;
    struct cfx_object_id id;
    int timeout_ms;
    int rc;
    uint64_t elapsed_ms;
    uint64_t end_ns; /* when the lookup returned (cfx__now_ns) */
    struct cfx_ctl_source src;
    pthread_barrier_t *start;
};

/* Empty, with its mutex ready; pass it to open_node() for node_dead events. */
void deaths_init(struct deaths *d);

/* ns timestamp when @p id was reported dead, waiting up to @p ms for the
 * event (not polling); 0 if it did not come. */
uint64_t wait_dead(struct deaths *d, uint32_t id, int ms);

/* What @p d heard of node @p id within @p ms, waiting for the event:
 * HEARD_DEAD, HEARD_LEFT, or 0 for nothing. */
enum { HEARD_DEAD = 1, HEARD_LEFT = 2 };
int wait_heard(struct deaths *d, uint32_t id, int ms);

/* Start the coordinator with the settings above into coord and addr. */
void start_coord(void);

/* A TestSuite's .init: a fresh token and a started coordinator. */
void coord_fixture_setup(void);

/* A TestSuite's .fini: stops the coordinator. */
void coord_fixture_teardown(void);

/* Join as node @p name with token @p tok; its status as it came. */
int open_node_tok(const char *name, const char *tok, struct deaths *d, struct cfx_ctl **out);

/* Join as node @p name (asserts success and a node id). */
struct cfx_ctl *open_node(const char *name, struct deaths *d);

/* An admin client (asserts success; node id 0). */
struct cfx_ctl *open_admin(void);

/* An object id spelling @p name, zero-padded. */
void make_id(struct cfx_object_id *id, const char *name);

/* Remove a state directory a test made (records only, no subdirectories). */
void rm_state_dir(const char *dir);

/* Milliseconds since cfx__now_ns() gave @p t0. */
uint64_t ms_since(uint64_t t0);

/* The record of @p id in a listing of @p n, or NULL. */
const struct cfx_ctl_obj_rec *find_obj(const struct cfx_ctl_obj_rec *v, size_t n,
                                       const struct cfx_object_id *id);

/* pthread body: a lookup of j->id (after j->start, when set) into @p arg. */
void *lookup_thread(void *arg);

/* A TCP connection to the coordinator, not yet authenticated. */
int raw_connect(void);

/* Read one frame from a raw socket into @p buf (blocking, up to CALL_MS). */
int raw_read_frame(int s, uint8_t *buf, size_t cap, struct cfx_msg *m);
/* Exactly @p n bytes from @p s, each wait bounded by CALL_MS:
 * CFX_ERR_TIMEOUT, or CFX_ERR_CONNECT when the peer closed. */
int raw_recv_exact(int s, uint8_t *b, size_t n);

/* Encode and send @p m whole (asserts). */
void raw_send(int s, const struct cfx_msg *m);

/* A raw connection authenticated in @p role. */
int raw_auth_role(uint8_t role);

int raw_auth_sealed(uint8_t role, uint8_t mode, struct cfx_ctl_seal *seal);
/* A raw connection in @p role that reads the CHALLENGE (checked to say
 * @p coord_mode) and sends an AUTH with the right token claiming @p claimed
 * for its CFX_SECURE while its MAC covers @p mac_mode; the coordinator's
 * nonce goes to @p snonce, the AUTH sent to @p auth.  Returns the socket. */
int raw_auth_claiming(uint8_t role, int coord_mode, int claimed, int mac_mode,
                      uint8_t snonce[CFX_AUTH_NONCE_LEN], struct cfx_msg *auth);

/* A raw connection authenticated as admin. */
int raw_auth(void);

/* JOIN on a raw node connection asking for id @p want (0: none); returns
 * the id given, or the negative status of the ERROR with its text. */
int64_t raw_join(int s, uint32_t want, uint64_t req, char *text, size_t text_len);

/* LEAVE on a raw node connection (no answer comes). */
void raw_leave(int s);

/* STATUS on a raw connection: the reply to @p req. */
struct cfx_ctl_status raw_status(int s, uint64_t req);

/* Read the answer to @p req on @p s: 0 for OK, the status of an ERROR (its
 * text into @p text). */
int raw_answer(int s, uint64_t req, char *text, size_t text_len);

/* PUT of object number @p k: inline with @p size bytes, or on the data plane. */
int raw_put(int s, uint8_t k, uint64_t size, bool inl, uint64_t req, char *text, size_t text_len);

/* LOOKUP of object number @p k; the answer is read with raw_answer(). */
void raw_lookup(int s, uint8_t k, uint32_t timeout_ms, uint64_t req);

/* Wait until the peer closes @p s; returns ms waited or -1. */
long wait_closed(int s, int ms);

#endif

/*
 * The coordinator client's inside, shared by its files: the connection and
 * its reader (client.c) and the object directory's requests (client_obj.c).
 * Nothing outside control/client*.c includes it.
 */
#ifndef CFX_CONTROL_CLIENT_INT_H
#define CFX_CONTROL_CLIENT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "control/client.h"
#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/common/list.h"

/* One request waiting for its reply. */
struct ctl_call {
    struct cfx_list link;    /* ctl->calls */
    uint64_t req_id;
    pthread_cond_t cond;
    int done;                /* reply arrived or connection lost */
    int status;              /* CFX_OK: reply holds the answer */
    uint8_t *frame;          /* reply frame (owned); reply points into it */
    struct cfx_msg reply;
};

/* The async puts awaiting their answer (oldest first), at most this many:
 * replies come in the order of the requests, and a put is answered at once,
 * so the oldest is answered first; past the cap the oldest is forgotten
 * (its refusal only logged). */
#define CTL_APUT_MAX 256

struct ctl_aput {
    uint64_t req_id;
    struct cfx_object_id id;
};

struct cfx_ctl {
    int fd;                          /* once the reader runs only it sets this, under
                                      * send_lock; other threads read it there only */
    uint64_t conn_gen;               /* bumped with each new socket in fd (under
                                      * send_lock, atomic): a number the kernel gives
                                      * again does not make an old connection current */
    int wake_fd;                     /* eventfd: wakes the reader for close */
    char coord[128];                 /* "host:port" as given, for messages */
    enum cfx_ctl_role role;
    /* From the join reply; a rejoin sets them again on the reader thread while
     * other threads read them: atomic (relaxed) stores and, off the reader, loads */
    uint32_t node_id;
    uint32_t heartbeat_ms;
    uint32_t dead_after_ms;
    void (*on_node_dead)(void *arg, uint32_t node_id);
    void (*on_node_left)(void *arg, uint32_t node_id);
    void (*on_reconnected)(void *arg);
    void (*on_rejoined)(void *arg);
    void (*on_obj_gone)(void *arg, const struct cfx_object_id *id);
    void (*on_put_answer)(void *arg, const struct cfx_object_id *id, int status,
                          const char *why);
    void (*on_task_run)(void *arg, const struct cfx_msg_task *task);
    void (*load_fill)(void *arg, struct cfx_msg_load *out);
    void (*beat_fill)(void *arg, struct cfx_msg_heartbeat *hb);
    void *arg;
    char token[CFX_TOKEN_MAX + 1];   /* kept to authenticate again (NODE) */
    struct cfx_node_rec self;        /* kept to rejoin (NODE) */
    uint32_t rejoin_id;              /* JOIN asks for this id (0: any) */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;            /* calls, next_req, broken, closing */
    pthread_mutex_t send_lock;       /* one frame on the wire at a time */
    struct cfx_list calls;
    uint64_t next_req;
    int broken;                      /* connection lost: calls fail fast */
    int closing;
    int interrupted;                 /* cfx__ctl_interrupt(): calls end CFX_ERR_CANCELED */
    int reconnecting;                /* broken, and the reader is reconnecting */
    int door_refused;                /* the last handshake ended before AUTH_OK (a connection
                                      * cap or an eviction: connect_first tries again) */
    pthread_cond_t conn_cond;        /* broadcast when reconnecting ends */
    uint64_t lost_ns;                /* when the connection was lost; 0 while connected */
    uint64_t reconnects;             /* successful reconnections */
    int coord_stopping;              /* reader only: EV_STOPPING came on this connection */
    int stopped_in_order;            /* reader only: ... on the one lost (while reconnecting) */
    int hold_reconnect;              /* test hook (cfx__ctl_test_hold_reconnect), under lock */
    struct ctl_aput aput[CTL_APUT_MAX]; /* async puts unanswered: a ring, under lock */
    unsigned aput_head, aput_n;

    uint8_t *rbuf;                   /* receive buffer: handshake, then reader only */
    size_t rlen;
    size_t rcap;

    int secure;                      /* enum cfx_seal_mode asked for (CFX_SECURE) */
    /* on from the frame after AUTH_OK: tx under send_lock, rx by the reader
     * (or the handshake); set and reset under send_lock */
    struct cfx_ctl_seal seal;
};

/* Hex text of @p id into @p buf; returns @p buf. */
const char *cfx__ctl_idhex(const struct cfx_object_id *id, char buf[CFX_OBJECT_ID_HEX_LEN]);
/* Error detail "<what> at coordinator <addr>: <why>"; returns @p status. */
int cfx__ctl_err(const struct cfx_ctl *ctl, int status, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The connection is lost (calls fail fast, or wait for the reconnection). */
int cfx__ctl_broken(struct cfx_ctl *ctl);
/* Send one frame by @p deadline; @p what names it in errors. */
int cfx__ctl_send(struct cfx_ctl *ctl, const struct cfx_msg *m, uint64_t deadline,
                  const char *what);
/* Send @p req and wait for its reply into @p call (sent again after a
 * reconnect, within @p deadline). */
int cfx__ctl_call(struct cfx_ctl *ctl, struct cfx_msg *req, uint64_t deadline,
                  struct ctl_call *call, const char *what);
/* The coordinator's error reply in @p call, or a reply of an unexpected type. */
int cfx__ctl_unexpected(struct cfx_ctl *ctl, struct ctl_call *call, const char *what);
/* Remember async put @p req_id of @p id until its answer (ctl->lock held);
 * forget one never sent. */
void cfx__ctl_aput_add(struct cfx_ctl *ctl, uint64_t req_id, const struct cfx_object_id *id);
void cfx__ctl_aput_unsent(struct cfx_ctl *ctl, uint64_t req_id);
/* Test hook: while on, a NODE client that lost its coordinator does not try
 * to reconnect (a node cut off from it, its data plane still up); off lets
 * it go on.  Set it before the connection is lost. */
void cfx__ctl_test_hold_reconnect(struct cfx_ctl *ctl, bool on);

#endif

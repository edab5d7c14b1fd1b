/* Task placement at the coordinator (control/coord_place.c, coord_task.c):
 * the scoring (input bytes held, complete and partial; load; spread and
 * pack), the caps, the queue, tasks of a node that goes, and what keeps
 * tasks across a restart (keys, held repeats, re-announcements, their caps).  Workers are
 * coordinator clients that register a function and report a chosen load. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/client.h"
#include "control/client_int.h"
#include "control/coord.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "testutil.h"

#define HB_MS   50
#define DEAD_MS 2000
#define CALL_MS 20000
#define MiB     (1u << 20)

static struct cfx_coord *coord;
static char token[64];
static char addr[64];

struct worker {
    struct cfx_ctl *c;
    uint32_t id;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    uint32_t load_milli;        /* what its heartbeats report */
    uint64_t mem_avail;
    unsigned fills;             /* heartbeats filled */
    uint64_t runs[16];          /* EV_TASK_RUN task ids, in order */
    unsigned nruns;
    unsigned backs;             /* reconnections */
    char last_name[CFX_TASK_NAME_MAX + 1];
};

static struct worker W[3];

static void on_run(void *arg, const struct cfx_msg_task *t)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->mu);
    if (w->nruns < 16)
        w->runs[w->nruns++] = t->task_id;
    snprintf(w->last_name, sizeof(w->last_name), "%s", t->name);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static void on_fill(void *arg, struct cfx_msg_load *out)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->mu);
    out->load_milli = w->load_milli;
    out->mem_avail = w->mem_avail;
    w->fills++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static void on_back(void *arg)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->mu);
    w->backs++;
    pthread_mutex_unlock(&w->mu);
}

/* A member with no function: a data-plane node, or an observer's tool. */
static void member_open(struct worker *w, const char *name, uint8_t flags)
{
    struct cfx_node_rec self;
    memset(&self, 0, sizeof(self));
    self.flags = flags;
    snprintf(self.name, sizeof(self.name), "%s", name);
    snprintf(self.host_id, sizeof(self.host_id), "test-host");
    self.pid = (uint32_t)getpid();
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    struct cfx_ctl_params p = {
        .coord = addr, .token = token, .role = CFX_CTL_ROLE_NODE, .self = &self,
        .timeout_ms = CALL_MS, .on_task_run = on_run, .load_fill = on_fill,
        .on_reconnected = on_back, .arg = w,
    };
    cr_assert_eq(cfx__ctl_open(&p, &w->c), CFX_OK, "open %s: %s", name, cfx_last_error());
    w->id = cfx__ctl_node_id(w->c);
}

/* @p w offers "f" (4 cores, 1 GPU, 1 GiB). */
static void worker_reg(struct worker *w)
{
    struct cfx_msg m = { .type = CFX_MSG_TASK_REG };
    snprintf(m.u.task_reg.name, sizeof(m.u.task_reg.name), "f");
    m.u.task_reg.cores = 4;
    m.u.task_reg.gpus = 1;
    m.u.task_reg.memory = 1ull << 30;
    cr_assert_eq(cfx__ctl_request(w->c, &m, cfx__deadline_ns(CALL_MS), "reg", CFX_MSG_OK, NULL,
                                  NULL), CFX_OK, "%s", cfx_last_error());
}

static void worker_open(struct worker *w, const char *name)
{
    member_open(w, name, 0);
    worker_reg(w);
}

static void worker_close(struct worker *w)
{
    if (!w->c)
        return;
    cfx__ctl_close(w->c);
    w->c = NULL;
}

/* Wait until @p w filled @p n more heartbeats (so its load was sent). */
static void beats(struct worker *w, unsigned n)
{
    uint64_t dl = cfx__deadline_ns(CALL_MS);
    pthread_mutex_lock(&w->mu);
    unsigned want = w->fills + n;
    while (w->fills < want && cfx__now_ns() < dl) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&w->cond, &w->mu, &ts);
    }
    cr_assert_geq(w->fills, want);
    pthread_mutex_unlock(&w->mu);
}

/* Wait until @p w was sent its @p n-th task; returns that task's id. */
static uint64_t nth_run(struct worker *w, unsigned n)
{
    uint64_t dl = cfx__deadline_ns(CALL_MS), id;
    pthread_mutex_lock(&w->mu);
    while (w->nruns < n && cfx__now_ns() < dl) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&w->cond, &w->mu, &ts);
    }
    cr_assert_geq(w->nruns, n, "node %u was sent %u tasks, want %u", w->id, w->nruns, n);
    id = w->runs[n - 1];
    pthread_mutex_unlock(&w->mu);
    return id;
}

static void start(uint32_t max_node_tasks, uint32_t max_queued_tasks)
{
    signal(SIGPIPE, SIG_IGN);
    cfx_test_token(token, sizeof(token));
    struct cfx_coord_params p = {
        .bind_addr = "127.0.0.1", .token = token, .heartbeat_ms = HB_MS,
        .dead_after_ms = DEAD_MS, .max_node_tasks = max_node_tasks,
        .max_queued_tasks = max_queued_tasks,
        .task_grace_ms = 60000, /* repeats stay held however slow the setup was */
    };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "%s", cfx_last_error());
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", cfx__coord_port(coord));
    memset(W, 0, sizeof(W));
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "w%d", i);
        worker_open(&W[i], name);
    }
}

static void teardown(void)
{
    for (int i = 0; i < 3; i++)
        worker_close(&W[i]);
    cfx__coord_stop(coord);
}

static void setup(void)
{
    start(0, 0);
}

/* max_node_tasks 2, max_queued_tasks 1 */
static void setup_caps(void)
{
    start(2, 1);
}

/* Every query below holds its reservation for the whole test, so the
 * reservation counts they leave are known. */
TestSuite(place, .init = setup, .fini = teardown, .timeout = 60);
TestSuite(placecap, .init = setup_caps, .fini = teardown, .timeout = 60);

static void task_init(struct cfx_msg *m, uint8_t type, const struct cfx_object_id *in, int nin,
                      const uint32_t *nodes, int nn)
{
    static uint64_t keys;
    memset(m, 0, sizeof(*m));
    m->type = type;
    if (type == CFX_MSG_TASK_SUBMIT)
        m->u.task.key = ++keys; /* each submission its own idempotency key */
    snprintf(m->u.task.name, sizeof(m->u.task.name), "f");
    m->u.task.cores = 1;
    m->u.task.timeout_ms = CALL_MS;
    m->u.task.reserve_ms = CALL_MS;
    m->u.task.ninputs = (uint8_t)nin;
    for (int i = 0; i < nin; i++)
        m->u.task.inputs[i] = in[i];
    m->u.task.nnodes = (uint8_t)nn;
    for (int i = 0; i < nn; i++)
        m->u.task.nodes[i] = nodes[i];
    m->u.task.nresults = 1;
    memset(m->u.task.results[0].bytes, 0xee, CFX_OBJECT_ID_LEN);
}

/* Send @p m from @p c; the reply's status (request failures as their code). */
static int ask(struct cfx_ctl *c, struct cfx_msg *m, struct cfx_msg_task_st *st)
{
    struct cfx_msg reply;
    void *frame = NULL;
    int rc = cfx__ctl_request(c, m, cfx__deadline_ns(CALL_MS), "task request",
                              CFX_MSG_TASK_REPLY, &reply, &frame);
    if (rc == CFX_OK) {
        *st = reply.u.task_st;
        rc = st->status;
    }
    free(frame);
    return rc;
}

static uint32_t place(const struct cfx_object_id *in, int nin, const uint32_t *nodes, int nn,
                      uint8_t flags)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st = { 0 };
    task_init(&m, CFX_MSG_TASK_PLACE, in, nin, nodes, nn);
    m.u.task.flags = flags;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_OK, "place: %s", cfx_last_error());
    return st.node_id;
}

static void obj(const char *name, struct cfx_object_id *id)
{
    memset(id, 0, sizeof(*id));
    snprintf((char *)id->bytes, sizeof(id->bytes), "%s", name);
}

Test(place, input_bytes_rank_first_partial_copies_half)
{
    struct cfx_object_id x, x2, y;
    struct cfx_ctl_source src;
    obj("x", &x);
    obj("x2", &x2);
    obj("y", &y);
    /* x, x2: 1 MiB each on w0; y: 3 MiB on w1, and a partial copy on w2 */
    cr_assert_eq(cfx__ctl_obj_put(W[0].c, &x, MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put(W[0].c, &x2, MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put(W[1].c, &y, 3 * MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    cr_assert_eq(cfx__ctl_obj_lookup_now(W[2].c, &y, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                 CFX_OK);
    cr_assert_eq(src.node.node_id, W[1].id);

    cr_assert_eq(place(&x, 1, NULL, 0, 0), W[0].id);
    cr_assert_eq(place(&y, 1, NULL, 0, 0), W[1].id);
    struct cfx_object_id all[3] = { x, x2, y };
    cr_assert_eq(place(all, 3, NULL, 0, 0), W[1].id);       /* 3 MiB > 2 MiB > 1.5 MiB */
    uint32_t not_w1[2] = { W[0].id, W[2].id };
    cr_assert_eq(place(&y, 1, not_w1, 2, 0), W[2].id);      /* a partial copy beats none */
    cr_assert_eq(place(all, 3, not_w1, 2, 0), W[0].id);     /* 2 MiB > half of 3 MiB */
    /* the partial copy completes: now it counts whole */
    cr_assert_eq(cfx__ctl_obj_done(W[2].c, &y, W[1].id, 1, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(place(all, 3, not_w1, 2, 0), W[2].id);     /* 3 MiB > 2 MiB */
}

Test(place, load_then_spread_or_pack)
{
    /* no inputs: spread takes the fewest reservations, then the least
     * loaded per core; pack the most reservations that still fit */
    uint32_t load[3] = { 3000, 100, 2000 };
    for (int i = 0; i < 3; i++) {
        pthread_mutex_lock(&W[i].mu);
        W[i].load_milli = load[i];
        pthread_mutex_unlock(&W[i].mu);
    }
    for (int i = 0; i < 3; i++)
        beats(&W[i], 2);
    cr_assert_eq(place(NULL, 0, NULL, 0, 0), W[1].id);       /* all 0 reservations: load */
    cr_assert_eq(place(NULL, 0, NULL, 0, 0), W[2].id);       /* w0 and w2 have 0: load */
    cr_assert_eq(place(NULL, 0, NULL, 0, 0), W[0].id);       /* the only one with 0 */
    cr_assert_eq(place(NULL, 0, NULL, 0, CFX_PROTO_TASK_PACK), W[0].id); /* tie: lowest id */
    cr_assert_eq(place(NULL, 0, NULL, 0, CFX_PROTO_TASK_PACK), W[0].id); /* 2 there now */
    cr_assert_eq(place(NULL, 0, NULL, 0, 0), W[1].id);       /* 1 and 1 vs 3: load */

    struct cfx_msg m;
    struct cfx_msg_task_st st;
    /* needs nobody meets */
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.cores = 5;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_ERR_NO_RESOURCE);
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.gpus = 2;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_ERR_NO_RESOURCE);
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    snprintf(m.u.task.name, sizeof(m.u.task.name), "g");
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_ERR_NOT_FOUND);
}

/* A data placement (where a reduce's result goes) asked by @p asker. */
static int data_place_rc(struct worker *asker, const struct cfx_object_id *in, int nin,
                         const uint32_t *nodes, int nn, uint64_t memory, uint32_t gpus,
                         uint32_t *node)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st = { 0 };
    task_init(&m, CFX_MSG_TASK_PLACE, in, nin, nodes, nn);
    m.u.task.name[0] = '\0';
    m.u.task.cores = 0;
    m.u.task.nresults = 0;
    m.u.task.flags = CFX_PROTO_TASK_DATA;
    m.u.task.memory = memory;
    m.u.task.gpus = gpus;
    int rc = ask(asker->c, &m, &st);
    *node = st.node_id;
    return rc;
}

static uint32_t data_place(struct worker *asker, const struct cfx_object_id *in, int nin,
                           const uint32_t *nodes, int nn, uint64_t memory, uint32_t gpus)
{
    uint32_t node = 0;
    cr_assert_eq(data_place_rc(asker, in, nin, nodes, nn, memory, gpus, &node), CFX_OK,
                 "data placement: %s", cfx_last_error());
    return node;
}

Test(place, data_goes_to_any_member_asker_first_without_reservation)
{
    struct worker P, O;
    struct cfx_object_id x, y;
    uint32_t node;
    memset(&P, 0, sizeof(P));
    memset(&O, 0, sizeof(O));
    member_open(&P, "plain", 0);
    member_open(&O, "observer", CFX_NODE_F_OBSERVER);
    pthread_mutex_lock(&P.mu);
    P.mem_avail = 1ull << 30;
    pthread_mutex_unlock(&P.mu);
    beats(&P, 2);
    obj("dx", &x);
    obj("dy", &y);
    cr_assert_eq(cfx__ctl_obj_put(P.c, &x, MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put(W[1].c, &y, MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    struct cfx_object_id both[2] = { x, y };
    uint32_t holders[2] = { P.id, W[1].id };

    /* as many input bytes on either: the asker (it reads the result next) */
    cr_assert_eq(data_place(&W[1], both, 2, holders, 2, MiB, 0), W[1].id);
    cr_assert_eq(data_place(&P, both, 2, holders, 2, MiB, 0), P.id);
    /* input bytes first; a member that offers no function is a candidate */
    cr_assert_eq(data_place(&W[0], &x, 1, NULL, 0, MiB, 0), P.id);
    /* the memory its last heartbeat reported free */
    cr_assert_eq(data_place_rc(&W[0], &x, 1, &P.id, 1, 2ull << 30, 0, &node),
                 CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "live member(s) is in the node set"), "%s",
              cfx_last_error());
    /* GPUs only where a worker offers them */
    cr_assert_eq(data_place(&P, both, 2, holders, 2, MiB, 1), W[1].id);
    /* an observer is never chosen, not even when it asks */
    cr_assert_neq(data_place(&O, NULL, 0, NULL, 0, 0, 0), O.id);
    cr_assert_eq(data_place_rc(&W[0], NULL, 0, &O.id, 1, 0, 0, &node), CFX_ERR_NO_RESOURCE);
    /* no reservation: after data placements on w1, a task query that packs
     * finds no node with more reservations than another (the lowest id) */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(data_place(&W[1], NULL, 0, NULL, 0, 0, 0), W[1].id);
    cr_assert_eq(place(NULL, 0, NULL, 0, CFX_PROTO_TASK_PACK), W[0].id);
    worker_close(&O);
    worker_close(&P);
}

Test(placecap, caps_queue_and_done)
{
    /* max_node_tasks 2, max_queued_tasks 1: two tasks fill w0, a third queues,
     * a fourth is refused naming the cap */
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    uint64_t ids[3];
    for (int i = 0; i < 3; i++) {
        task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &W[0].id, 1);
        cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "%s", cfx_last_error());
        ids[i] = st.task_id;
        cr_assert_eq(st.node_id, i < 2 ? W[0].id : 0u);
    }
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &W[0].id, 1);
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "max_queued_tasks"), "%s", cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "max_node_tasks"), "%s", cfx_last_error());
    cr_assert_eq(nth_run(&W[0], 1), ids[0]);
    cr_assert_eq(nth_run(&W[0], 2), ids[1]);
    cr_assert_str_eq(W[0].last_name, "f");

    /* w0 ends the first with an error: it travels to the waiter, and the
     * queued one takes the freed slot */
    struct cfx_msg d = { .type = CFX_MSG_TASK_DONE };
    d.u.task_st.task_id = ids[0];
    d.u.task_st.status = CFX_ERR_INVALID;
    snprintf(d.u.task_st.text, sizeof(d.u.task_st.text), "bad input on node %u", W[0].id);
    cr_assert_eq(cfx__ctl_send_nowait(W[0].c, &d, "done"), CFX_OK);
    cr_assert_eq(nth_run(&W[0], 3), ids[2]);
    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = ids[0];
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_INVALID);
    cr_assert(strstr(st.text, "bad input"), "%s", st.text);
    /* a wait that times out first says so, and the task goes on */
    w.u.task_st.task_id = ids[1];
    w.u.task_st.timeout_ms = 50;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_AGAIN);
    d.u.task_st.task_id = ids[1];
    d.u.task_st.status = CFX_OK;
    d.u.task_st.text[0] = '\0';
    cr_assert_eq(cfx__ctl_send_nowait(W[0].c, &d, "done"), CFX_OK);
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_OK);
    cr_assert_eq(st.node_id, W[0].id);

    /* the listing (rdmactl tasks): by id, the two ended ones with how they
     * ended, the third running on w0; the refused one was never a task */
    struct cfx_ctl_task_rec *tl;
    size_t nt;
    cr_assert_eq(cfx__ctl_tasks(W[1].c, &tl, &nt, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(nt, 3);
    for (size_t i = 0; i < nt; i++) {
        cr_assert_eq(tl[i].id, ids[i]);
        cr_assert_str_eq(tl[i].name, "f");
        cr_assert_eq(tl[i].node_id, W[0].id);
        cr_assert_eq(tl[i].submitter, W[1].id);
        cr_assert_eq(tl[i].placements, 1);
        cr_assert_eq(tl[i].nresults, 1);
    }
    cr_assert_eq(tl[0].state, CFX_CTL_TASK_DONE);
    cr_assert_eq(tl[0].status, CFX_ERR_INVALID);
    cr_assert(strstr(tl[0].text, "bad input on node"), "%s", tl[0].text);
    cr_assert_eq(tl[1].state, CFX_CTL_TASK_DONE);
    cr_assert_eq(tl[1].status, CFX_OK);
    cr_assert_str_eq(tl[1].text, "");
    cr_assert_eq(tl[2].state, CFX_CTL_TASK_PLACED);
    cr_assert_eq(tl[2].status, CFX_OK);
    free(tl);
}

Test(place, tasks_of_a_node_that_goes)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    struct cfx_object_id x;
    obj("only-on-w0", &x);
    cr_assert_eq(cfx__ctl_obj_put(W[0].c, &x, MiB, 65536, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    /* one reads x, held only by w0 (placed there); one has no input, on w0 too */
    task_init(&m, CFX_MSG_TASK_SUBMIT, &x, 1, NULL, 0);
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK);
    uint64_t lost = st.task_id;
    cr_assert_eq(st.node_id, W[0].id);
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
    m.u.task.flags = CFX_PROTO_TASK_PACK; /* next to the first */
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK);
    uint64_t moved = st.task_id;
    cr_assert_eq(st.node_id, W[0].id);
    uint32_t gone = W[0].id;
    worker_close(&W[0]);

    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = lost;
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_PEER_FAILED);
    char want[32];
    snprintf(want, sizeof(want), "node %u", gone);
    cr_assert(strstr(st.text, want), "%s", st.text);

    /* the other runs again on w1 (lower id than w2, equal otherwise) */
    uint32_t to = W[1].id < W[2].id ? 1 : 2;
    cr_assert_eq(nth_run(&W[to], 1), moved);
    struct cfx_msg d = { .type = CFX_MSG_TASK_DONE };
    d.u.task_st.task_id = moved;
    cr_assert_eq(cfx__ctl_send_nowait(W[to].c, &d, "done"), CFX_OK);
    w.u.task_st.task_id = moved;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_OK);
    cr_assert_eq(st.node_id, W[to].id);
}

/* A task that may run only on a node that goes cannot be placed again: it
 * fails naming that node, and its waiters are told that node as the one
 * that last held it (task.h, cfx_task_wait's node_out), not node 0. */
Test(place, a_task_that_cannot_move_names_its_node)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    uint32_t only = W[0].id;
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &only, 1);
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK);
    uint64_t id = st.task_id;
    cr_assert_eq(st.node_id, only);
    worker_close(&W[0]);

    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = id;
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_PEER_FAILED);
    cr_assert(strstr(st.text, "cannot be placed again"), "%s", st.text);
    cr_assert_eq(st.node_id, only, "node %u, want %u", st.node_id, only);
}

/* Refusals name what was asked for: all capable nodes busy for a task of
 * no anti-affinity group, a task whose only worker left, a query for any
 * function with no worker left.  They said "anti-affinity group ''", "the
 * function 'f' (besides the dead one)" of a node that left in good order,
 * and "no live node registered the function '(any)'" (a new user's trial). */
Test(place, refusals_name_what_was_asked)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    struct worker asker = { 0 };
    uint32_t only = W[0].id;
    char want[96];

    /* w0 offers 4 cores: four queries take them all */
    for (int i = 0; i < 4; i++) {
        task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, &only, 1);
        cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "query %d: %s", i, cfx_last_error());
    }
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, &only, 1);
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_ERR_BUSY);
    cr_assert(strstr(cfx_last_error(), "all 1 capable node(s) are busy (cores, GPUs or memory "
                     "taken)"), "%s", cfx_last_error());
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, &only, 1);
    snprintf(m.u.task.group, sizeof(m.u.task.group), "g");
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_ERR_BUSY);
    cr_assert(strstr(cfx_last_error(), "(cores, GPUs, anti-affinity group 'g' or memory "
                     "taken)"), "%s", cfx_last_error());

    /* w0 is the last worker (the queries went with w1); a task runs there
     * and w0 leaves */
    member_open(&asker, "asker", 0);
    worker_close(&W[1]);
    worker_close(&W[2]);
    cr_assert_eq(cfx__coord_wait_members(coord, 2, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
    cr_assert_eq(ask(asker.c, &m, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, only);
    uint64_t id = st.task_id;
    worker_close(&W[0]);
    cr_assert_eq(cfx__coord_wait_members(coord, 1, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = id;
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(asker.c, &w, &st), CFX_ERR_PEER_FAILED);
    snprintf(want, sizeof(want), "no live node registered the function 'f' besides node %u",
             only);
    cr_assert(strstr(st.text, want), "%s", st.text);
    cr_assert(!strstr(st.text, "dead one"), "%s", st.text);

    /* a query for any function, with no worker left */
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.name[0] = '\0';
    cr_assert_eq(ask(asker.c, &m, &st), CFX_ERR_NOT_FOUND);
    cr_assert(strstr(cfx_last_error(), "no live node registered any function"), "%s",
              cfx_last_error());
    worker_close(&asker);
}

/* More tasks than one page of the listing (CFX_PROTO_TASKS_PAGE): the
 * client asks page after page and gets every task once, by id. */
Test(place, listing_pages_through_every_task)
{
    enum { N = CFX_PROTO_TASKS_PAGE + 44 };
    static uint64_t ids[N];
    struct cfx_msg m;
    struct cfx_msg_task_st st = { 0 }; /* ask() fills it on CFX_OK */
    for (int i = 0; i < N; i++) {
        task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &W[0].id, 1);
        cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "task %d: %s", i, cfx_last_error());
        ids[i] = st.task_id;
    }
    struct cfx_ctl_task_rec *tl;
    size_t nt;
    cr_assert_eq(cfx__ctl_tasks(W[2].c, &tl, &nt, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(nt, N);
    uint32_t placed = 0, queued = 0;
    for (size_t i = 0; i < nt; i++) {
        cr_assert_eq(tl[i].id, ids[i], "record %zu", i);
        cr_assert_eq(tl[i].submitter, W[1].id);
        placed += tl[i].state == CFX_CTL_TASK_PLACED && tl[i].node_id == W[0].id;
        queued += tl[i].state == CFX_CTL_TASK_QUEUED && tl[i].node_id == 0;
    }
    cr_assert_eq(placed + queued, N, "%u placed, %u queued", placed, queued);
    cr_assert_gt(placed, 0);
    free(tl);
}

/* ---- across a restart (coord_task.c "Restarts") ------------------------------------- */

/* @p w re-announces a task of key @p key under @p id ("" name: the end of
 * its list); the reply's status. */
static int announce(struct worker *w, uint64_t key, uint64_t id, const char *name)
{
    struct cfx_msg m;
    task_init(&m, CFX_MSG_TASK_ANNOUNCE, NULL, 0, NULL, 0);
    snprintf(m.u.task.name, sizeof(m.u.task.name), "%s", name);
    m.u.task.key = key;
    m.u.task.task_id = id;
    m.u.task.submitter = W[1].id;
    return cfx__ctl_request(w->c, &m, cfx__deadline_ns(CALL_MS), "announce", CFX_MSG_OK, NULL,
                            NULL);
}

/* A repeated submission (CFX_PROTO_TASK_AGAIN) of key @p key from w1. */
static int repeat(uint64_t key, uint64_t id, uint32_t hint, struct cfx_msg_task_st *st)
{
    struct cfx_msg m;
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
    m.u.task.key = key;
    m.u.task.flags = CFX_PROTO_TASK_AGAIN;
    m.u.task.task_id = id;
    m.u.task.hint_node = hint;
    return ask(W[1].c, &m, st);
}

Test(place, a_key_submitted_twice_is_one_task)
{
    struct cfx_msg m;
    struct cfx_msg_task_st s1 = { 0 }, s2 = { 0 }; /* ask() fills them on CFX_OK */
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &W[0].id, 1);
    cr_assert_eq(ask(W[1].c, &m, &s1), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(ask(W[1].c, &m, &s2), CFX_OK, "%s", cfx_last_error()); /* the same key */
    cr_assert_eq(s2.task_id, s1.task_id);
    cr_assert_eq(s2.node_id, W[0].id);
    m.u.task.flags = CFX_PROTO_TASK_AGAIN;
    cr_assert_eq(ask(W[1].c, &m, &s2), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(s2.task_id, s1.task_id);
    cr_assert_eq(nth_run(&W[0], 1), s1.task_id);
    /* a second task was never sent: its EV_TASK_RUN would have come to w0
     * before the reply to this query of w0's, on the same connection */
    cr_assert_neq(place(NULL, 0, NULL, 0, 0), 0u);
    pthread_mutex_lock(&W[0].mu);
    cr_assert_eq(W[0].nruns, 1, "node %u was sent %u tasks", W[0].id, W[0].nruns);
    pthread_mutex_unlock(&W[0].mu);

    /* a submission needs a key; a repeat of an id this coordinator handed
     * out and no longer knows ended long ago: not run again */
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
    m.u.task.key = 0;
    cr_assert_eq(ask(W[1].c, &m, &s2), CFX_ERR_INVALID);
    cr_assert_eq(repeat(0x5e5e5e5eull, s1.task_id + 100000, 0, &s2), CFX_ERR_NOT_FOUND);
    cr_assert(strstr(cfx_last_error(), "not run again"), "%s", cfx_last_error());
}

Test(place, a_held_repeat_merges_with_its_reannouncement)
{
    /* w1's repeat comes first (held: w0 has not closed its list), then w0
     * re-announces the key it runs under its old id: one task, on w0, and
     * w0's report under the old id ends it */
    struct cfx_msg_task_st st = { 0 };
    const uint64_t key = 0xabcdef01ull, old_id = 77;
    cr_assert_eq(repeat(key, old_id, W[0].id, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, 0u, "a held repeat placed on node %u", st.node_id);
    cr_assert_eq(st.task_id, old_id, "the repeat did not keep its id");
    cr_assert_eq(announce(&W[0], key, old_id, "f"), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(announce(&W[0], 0, 0, ""), CFX_OK, "%s", cfx_last_error());
    pthread_mutex_lock(&W[0].mu);
    cr_assert_eq(W[0].nruns, 0, "the re-announced task was sent to run again");
    pthread_mutex_unlock(&W[0].mu);
    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = old_id;
    w.u.task_st.timeout_ms = 0;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_AGAIN);
    cr_assert_eq(st.node_id, W[0].id);
    struct cfx_msg d = { .type = CFX_MSG_TASK_DONE };
    d.u.task_st.task_id = old_id;
    cr_assert_eq(cfx__ctl_send_nowait(W[0].c, &d, "done"), CFX_OK);
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, W[0].id);

    /* a repeat held for w2 goes to the queue when w2 closes its list
     * without it, and is placed (on w2, which asked for it first) */
    uint32_t only = W[2].id;
    struct cfx_msg m;
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &only, 1);
    m.u.task.key = key + 1;
    m.u.task.flags = CFX_PROTO_TASK_AGAIN;
    m.u.task.hint_node = only;
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, 0u);
    cr_assert_eq(announce(&W[2], 0, 0, ""), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(nth_run(&W[2], 1), st.task_id);
}

Test(placecap, reannouncements_and_held_repeats_are_capped)
{
    /* max_node_tasks 2: w0 re-announces two tasks, the third is refused;
     * max_queued_tasks 1: one repeat is held, the second refused */
    struct cfx_msg_task_st st = { 0 };
    cr_assert_eq(announce(&W[0], 1001, 501, "f"), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(announce(&W[0], 1002, 502, "f"), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(announce(&W[0], 1003, 503, "f"), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "max_node_tasks"), "%s", cfx_last_error());
    cr_assert_eq(repeat(2001, 601, W[2].id, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(repeat(2002, 602, W[2].id, &st), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "max_queued_tasks"), "%s", cfx_last_error());

    /* a re-announcement needs a key and an id; an id that is another
     * task's is refused; a node that offers nothing re-announces nothing */
    cr_assert_eq(announce(&W[1], 0, 504, "f"), CFX_ERR_INVALID);
    cr_assert_eq(announce(&W[1], 1004, 0, "f"), CFX_ERR_INVALID);
    cr_assert_eq(announce(&W[1], 1005, 501, "f"), CFX_ERR_EXISTS);
    struct worker idle = { 0 };
    struct cfx_node_rec self;
    memset(&self, 0, sizeof(self));
    snprintf(self.name, sizeof(self.name), "idle");
    struct cfx_ctl_params p = { .coord = addr, .token = token, .role = CFX_CTL_ROLE_NODE,
                                .self = &self, .timeout_ms = CALL_MS };
    cr_assert_eq(cfx__ctl_open(&p, &idle.c), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(announce(&idle, 1006, 506, "f"), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "registered no function"), "%s", cfx_last_error());
    cfx__ctl_close(idle.c);
}

/*
 * A fenced run's end that the coordinator hears before the run's
 * re-announcement (coord_task.c, "Fences"): the worker that was taken for
 * dead reported the end of its run as it came back, and its re-announcement
 * list, taken while the run was still on its running list, named it after.
 * The refused re-announcement holds no cores then: before, it took a
 * reservation for a run that had already ended, and nothing ever freed it,
 * so a task pinned to that node waited for ever (a flaky tasks_moved).
 * With @p merged the run goes by an id of its own: the worker re-announced
 * it after a restart under its id of before (88), merged into the repeat
 * its submitter sent under the id it knew (77); its end names 88.
 */
static void fenced_run_ended_then_announced(bool merged)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st = { 0 };
    uint64_t key = 0xfe11ced, id = 77, run = 88;
    unsigned sent = 0; /* EV_TASK_RUNs the worker was sent */
    int k = 0;
    if (merged) {
        cr_assert_eq(repeat(key, id, W[0].id, &st), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(announce(&W[0], key, run, "f"), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(announce(&W[0], 0, 0, ""), CFX_OK, "%s", cfx_last_error());
    } else {
        task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
        cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "%s", cfx_last_error());
        key = m.u.task.key;
        id = run = st.task_id;
        while (k < 3 && W[k].id != st.node_id)
            k++;
        cr_assert_lt(k, 3, "placed on node %u, not a worker", st.node_id);
        cr_assert_eq(nth_run(&W[k], ++sent), id);
    }
    struct worker *w = &W[k], *other = &W[(k + 1) % 3];
    const uint32_t was = w->id;

    /* its connection cut: declared dead, the task moves; it rejoins anew */
    shutdown(w->c->fd, SHUT_RDWR);
    cr_assert(cfx_test_await_count(&w->mu, &w->backs, CALL_MS), "node %u did not come back",
              was);
    w->id = cfx__ctl_node_id(w->c);
    cr_assert_neq(w->id, was, "node %u rejoined under its old id", was);
    worker_reg(w);
    struct cfx_msg wt = { .type = CFX_MSG_TASK_WAIT };
    wt.u.task_st.task_id = id;
    cr_assert_eq(ask(other->c, &wt, &st), CFX_ERR_AGAIN, "%s", cfx_last_error());
    cr_assert_neq(st.node_id, was);
    cr_assert_neq(st.node_id, 0u, "the task did not move");

    /* the run's end, then its re-announcement: refused, naming the move */
    struct cfx_msg d = { .type = CFX_MSG_TASK_DONE };
    d.u.task_st.task_id = run;
    cr_assert_eq(cfx__ctl_send_nowait(w->c, &d, "done"), CFX_OK);
    cr_assert_eq(announce(w, key, run, "f"), CFX_ERR_CANCELED, "%s", cfx_last_error());
    char want[64];
    snprintf(want, sizeof(want), "moved to node %u", st.node_id);
    cr_assert(strstr(cfx_last_error(), want), "'%s' missing: %s", want, cfx_last_error());

    /* all four of its cores are free: a task that takes them runs there now */
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, &w->id, 1);
    m.u.task.cores = 4;
    cr_assert_eq(ask(other->c, &m, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, w->id, "a 4-core task pinned to node %u was queued (node %u): a "
                 "core is held for the run that ended", w->id, st.node_id);
    cr_assert_eq(nth_run(w, ++sent), st.task_id);
}

Test(place, a_fenced_run_that_ended_holds_no_cores_when_announced_after)
{
    fenced_run_ended_then_announced(false);
}

Test(place, a_fenced_run_under_a_merged_id_that_ended_holds_no_cores)
{
    fenced_run_ended_then_announced(true);
}

/*
 * A placement query's reservation holds a worker's capacity away from
 * every other member, so it is bounded: a reserve_ms above
 * COORD_PLACE_RESERVE_MAX_MS is refused (CFX_ERR_INVALID naming the cap),
 * and the reservations go with the member that asked when it leaves.
 * Before, a member could reserve every core for 49 days and leave, and
 * every other placement was CFX_ERR_BUSY for that long.
 */
Test(place, query_reservations_are_bounded_and_go_with_their_asker)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    struct worker asker = { 0 };
    member_open(&asker, "asker", 0);

    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.reserve_ms = 0xffffffffu;
    cr_assert_eq(ask(asker.c, &m, &st), CFX_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof(want), "cap of %u ms", 300000u);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());

    /* the asker takes every core of the three workers (4 each), for the
     * longest time allowed */
    for (int i = 0; i < 12; i++) {
        task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
        m.u.task.reserve_ms = 300000;
        cr_assert_eq(ask(asker.c, &m, &st), CFX_OK, "query %d: %s", i, cfx_last_error());
    }
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_ERR_BUSY);

    /* it leaves: its reservations go with it */
    worker_close(&asker);
    cr_assert_eq(cfx__coord_wait_members(coord, 3, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    for (int i = 0; i < 12; i++) {
        task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
        cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "query %d: %s", i, cfx_last_error());
    }
}

/* One member holds so many live query reservations at once
 * (COORD_NODE_QUERIES_MAX, 128): queries asking for nothing but a slot
 * fill 128 of the 192 slots, and the next is refused naming the cap. */
Test(place, query_reservations_per_member_are_capped)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    for (int i = 0; i < 128; i++) {
        task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
        m.u.task.cores = 0;
        cr_assert_eq(ask(W[2].c, &m, &st), CFX_OK, "query %d: %s", i, cfx_last_error());
    }
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.cores = 0;
    cr_assert_eq(ask(W[2].c, &m, &st), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(cfx_last_error(), "128 placement reservations"), "%s", cfx_last_error());
    /* another member still places */
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    m.u.task.cores = 0;
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "%s", cfx_last_error());
}

/*
 * Task waits per connection: one member parks its share of max_parked
 * (here COORD_PARKED_PER_CONN, 4096: 3 members of 65536) and its next wait
 * is refused naming it; another member's wait still parks (it times out
 * with CFX_ERR_AGAIN, as a parked wait does).  Before, one connection
 * could park all 65536 and every other member's wait was refused.
 */
Test(place, task_waits_per_connection_are_capped)
{
    struct cfx_msg m;
    struct cfx_msg_task_st st = { 0 };
    task_init(&m, CFX_MSG_TASK_SUBMIT, NULL, 0, NULL, 0);
    m.u.task.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[1].c, &m, &st), CFX_OK, "%s", cfx_last_error());
    uint64_t task = st.task_id;
    for (int i = 0; i < 4096; i++) {
        struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
        w.u.task_st.task_id = task;
        w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
        cr_assert_eq(cfx__ctl_send_nowait(W[2].c, &w, "wait"), CFX_OK, "%s", cfx_last_error());
    }
    struct cfx_msg w = { .type = CFX_MSG_TASK_WAIT };
    w.u.task_st.task_id = task;
    w.u.task_st.timeout_ms = CFX_PROTO_TIMEOUT_NONE;
    cr_assert_eq(ask(W[2].c, &w, &st), CFX_ERR_NO_RESOURCE);
    char want[64];
    snprintf(want, sizeof(want), "node %u already waits for 4096 tasks", W[2].id);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    w.u.task_st.timeout_ms = 1;
    cr_assert_eq(ask(W[1].c, &w, &st), CFX_ERR_AGAIN, "%s", cfx_last_error());
}

/* A worker offering UINT32_MAX cores took reservations without end: what
 * was reserved plus what a task asks wrapped and always fitted.  Now
 * 64 cores asked of a worker with UINT32_MAX - 10 reserved do not fit. */
Test(place, reserved_plus_asked_does_not_wrap)
{
    struct worker big = { 0 };
    member_open(&big, "big", 0);
    struct cfx_msg r = { .type = CFX_MSG_TASK_REG };
    snprintf(r.u.task_reg.name, sizeof(r.u.task_reg.name), "g");
    r.u.task_reg.cores = 0xffffffffu;
    r.u.task_reg.memory = UINT64_MAX;
    cr_assert_eq(cfx__ctl_request(big.c, &r, cfx__deadline_ns(CALL_MS), "reg", CFX_MSG_OK, NULL,
                                  NULL), CFX_OK, "%s", cfx_last_error());
    struct cfx_msg m;
    struct cfx_msg_task_st st;
    task_init(&m, CFX_MSG_TASK_PLACE, NULL, 0, NULL, 0);
    snprintf(m.u.task.name, sizeof(m.u.task.name), "g");
    m.u.task.cores = 0xffffffffu - 10;
    m.u.task.memory = UINT64_MAX - 10;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(st.node_id, big.id);
    m.u.task.cores = 64;
    m.u.task.memory = 0;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_ERR_BUSY, "%s", cfx_last_error());
    m.u.task.cores = 0;
    m.u.task.memory = 64;
    cr_assert_eq(ask(W[0].c, &m, &st), CFX_ERR_BUSY, "%s", cfx_last_error());
    worker_close(&big);
}

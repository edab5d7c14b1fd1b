/*
 * Freeing a pending rendezvous receive while its sender stalls mid-message
 * (test hook CFX_XFER_TEST_STALL on the sender): the free returns without
 * the sender's answer, the receive buffer's grant is withdrawn at once so
 * the sender's late writes are refused and the caller's buffer keeps the
 * bytes it had, and the same pair exchanges messages afterwards.  Over tcp
 * and shm; two contexts and an embedded coordinator in one process.  And
 * the order withdrawn messages leave behind (p2p.h, "Withdrawal"), over
 * tcp.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
#include "dataplane/engine/p2p.h"
#include "testutil.h"

#define CHUNK    4096u
#define NCHUNKS  64u /* far above the eager limit: a rendezvous message */
#define STALL_AT 4u  /* the sender writes chunks [0, STALL_AT) and stalls */

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    unsetenv("CFX_XFER_TEST_STALL");
    cfx_test_coord_down(&co);
}

static void join(const char *tps, bool stall, struct cfx_context **out)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS |
                      CFX_CTX_PARAM_CHUNK_SIZE,
        .coord = co.addr, .token = co.token, .transports = tps, .chunk_size = CHUNK,
    };
    char at[16];
    snprintf(at, sizeof(at), "%u", STALL_AT);
    if (stall)
        setenv("CFX_XFER_TEST_STALL", at, 1);
    int rc = cfx_context_create(&p, out);
    unsetenv("CFX_XFER_TEST_STALL");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
}

/* Whether @p c holds a transfer withdrawn before its source answered. */
static bool has_abandoned(struct cfx_context *c)
{
    pthread_mutex_lock(&c->lock);
    bool any = false;
    for (unsigned s = 0; s < CFX_XFER_SLOTS; s++)
        any |= c->slots[s] && c->slots[s]->abandoned;
    pthread_mutex_unlock(&c->lock);
    return any;
}

/* Wait (generously) until @p c holds no withdrawn transfer any more. */
static bool wait_abandoned_gone(struct cfx_context *c)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&c->lock);
    bool any = true;
    while (any) {
        any = false;
        for (unsigned s = 0; s < CFX_XFER_SLOTS; s++)
            any |= c->slots[s] && c->slots[s]->abandoned;
        if (any && !cfx__obj_wait(c, dl))
            break;
    }
    pthread_mutex_unlock(&c->lock);
    return !any;
}

/* a (stalling) sends NCHUNKS chunks to b on tag @p tag; b's receive into
 * @p dst is left pending and freed.  Returns the pending send. */
static struct cfx_p2p_req *free_pending_recv(struct cfx_context *a, struct cfx_context *b,
                                             const struct cfx_node_rec *ra,
                                             const struct cfx_node_rec *rb, uint32_t tag,
                                             const uint8_t *src, uint8_t *dst)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_p2p_req *s, *r;
    struct cfx_context_stats st0, st;
    cr_assert_eq(cfx_context_stats(b, &st0), CFX_OK);
    memset(dst, 0xA5, size);
    cr_assert_eq(cfx__p2p_irecv(b, ra, 1, tag, dst, size, CFX_MEMTYPE_HOST, &r), CFX_OK);
    cr_assert_eq(cfx__p2p_isend(a, rb, 1, tag, src, size, CFX_MEMTYPE_HOST, &s), CFX_OK);
    /* the sender stalls after STALL_AT chunks: the receive cannot finish.
     * Wait (in waits of the request, 50 ms each) until those chunks have
     * landed, however long the connection took on a loaded machine */
    uint64_t dl = cfx__deadline_ns(10000);
    do {
        cr_assert_eq(cfx__p2p_wait(r, cfx__deadline_ns(50)), CFX_ERR_TIMEOUT, "%s",
                     cfx_last_error());
        cr_assert_eq(cfx_context_stats(b, &st), CFX_OK);
    } while (st.bytes_received - st0.bytes_received < (uint64_t)STALL_AT * CHUNK &&
             cfx__now_ns() < dl);
    cr_assert_eq(st.bytes_received - st0.bytes_received, (uint64_t)STALL_AT * CHUNK,
                 "the stalled sender's first chunks never landed");
    cr_assert(!has_abandoned(b));
    cfx__p2p_free(r);
    /* it returned while the sender (which drops CANCELs while stalled)
     * had not answered: the transfer is still the engine's */
    cr_assert(has_abandoned(b), "the free waited for a sender that never answered");
    return s;
}

static void up2(const char *tps, struct cfx_context **a, struct cfx_context **b,
                struct cfx_node_rec *ra, struct cfx_node_rec *rb)
{
    join(tps, true, a);
    join(tps, false, b);
    uint64_t dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__ctl_node_get((*b)->ctl, (*a)->node_id, ra, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_node_get((*a)->ctl, (*b)->node_id, rb, dl), CFX_OK);
}

struct tp_param {
    char tp[8];
    bool nomem; /* commands that must not be lost run inline (cfx__cmd_must) */
};
static struct tp_param tps[] = { { "tcp", false }, { "shm", false }, { "tcp", true } };

ParameterizedTestParameters(p2p_cancel, stalled_sender_resumes)
{
    return cr_make_param_array(struct tp_param, tps, 3);
}

/* An object put on @p a, got by @p b, deleted on both: every byte checked
 * (the deletes' releases go through cfx__cmd_must). */
static void put_get_delete(struct cfx_context *a, struct cfx_context *b, const uint8_t *src,
                           uint8_t *dst, size_t size)
{
    struct cfx_obj_params pp = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_INLINE };
    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    cr_assert_eq(cfx_put(a, &id, src, size, &pp), CFX_OK, "%s", cfx_last_error());
    memset(dst, 0, size);
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, dst, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(memcmp(dst, src, size), 0, "wrong bytes");
    cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
}

/* The sender resumes after the receive was freed: its late writes are
 * dropped (the connection kept), then it answers the cancel; the caller's
 * buffer is untouched byte for byte, and a later
 * message between the same pair arrives whole.  With nomem, the cancel
 * and the releases run inline on the freeing thread, as they do when no
 * memory is left for their commands. */
ParameterizedTest(struct tp_param *p, p2p_cancel, stalled_sender_resumes, .init = setup,
                  .fini = teardown, .timeout = 60)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_node_rec ra, rb;
    uint8_t *src = malloc(size), *dst = malloc(size), *seen = malloc(size);
    cr_assert(src && dst && seen);
    cfx_test_fill(src, size, 3);
    up2(p->tp, &a, &b, &ra, &rb);
    a->test_cmd_nomem = b->test_cmd_nomem = p->nomem; /* before any command is posted */

    struct cfx_context_stats before, after;
    cr_assert_eq(cfx_context_stats(b, &before), CFX_OK);
    struct cfx_p2p_req *s = free_pending_recv(a, b, &ra, &rb, 7, src, dst);
    memcpy(seen, dst, size);

    cfx__xfer_test_resume(a); /* the rest of the chunks go out now */
    cr_assert(wait_abandoned_gone(b), "%s: the sender never answered the cancel", p->tp);
    cr_assert_eq(cfx_context_stats(b, &after), CFX_OK);
    cr_expect_gt(after.writes_late, before.writes_late,
                 "%s: the sender's late writes were not dropped as late", p->tp);
    cr_expect_eq(after.writes_refused, before.writes_refused,
                 "%s: the sender's late writes were refused", p->tp);
    cr_assert_eq(memcmp(dst, seen, size), 0, "%s: the buffer was written after the free",
                 p->tp);
    /* the send ends (canceled, or done if its last writes went out before
     * it took the cancel) */
    int st = cfx__p2p_wait(s, cfx__deadline_ns(10000));
    cr_expect_neq(st, CFX_ERR_TIMEOUT, "%s: the send never ended", p->tp);
    cfx__p2p_free(s);

    /* the pair works afterwards, both ways */
    struct cfx_p2p_req *s2, *r2;
    memset(dst, 0, size);
    cr_assert_eq(cfx__p2p_irecv(b, &ra, 1, 8, dst, size, CFX_MEMTYPE_HOST, &r2), CFX_OK);
    cr_assert_eq(cfx__p2p_isend(a, &rb, 1, 8, src, size, CFX_MEMTYPE_HOST, &s2), CFX_OK);
    uint64_t dl = cfx__deadline_ns(10000);
    cr_assert_eq(cfx__p2p_wait(r2, dl), CFX_OK, "%s: %s", p->tp, cfx_last_error());
    cr_assert_eq(cfx__p2p_wait(s2, dl), CFX_OK, "%s: %s", p->tp, cfx_last_error());
    cr_assert_eq(cfx_test_check(dst, size, 3), (size_t)-1, "%s: wrong bytes", p->tp);
    cfx__p2p_free(s2);
    cfx__p2p_free(r2);
    memset(seen, 0, size);
    cr_assert_eq(cfx__p2p_irecv(a, &rb, 1, 9, seen, size, CFX_MEMTYPE_HOST, &r2), CFX_OK);
    cr_assert_eq(cfx__p2p_isend(b, &ra, 1, 9, dst, size, CFX_MEMTYPE_HOST, &s2), CFX_OK);
    cr_assert_eq(cfx__p2p_wait(r2, dl), CFX_OK, "%s: %s", p->tp, cfx_last_error());
    cr_assert_eq(cfx__p2p_wait(s2, dl), CFX_OK, "%s: %s", p->tp, cfx_last_error());
    cr_assert_eq(cfx_test_check(seen, size, 3), (size_t)-1, "%s: wrong bytes back", p->tp);
    cfx__p2p_free(s2);
    cfx__p2p_free(r2);
    put_get_delete(a, b, src, dst, size);

    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
    free(dst);
    free(seen);
}

/* The sender never answers: the freed receive's buffer is the caller's at
 * once (freed here), and the transfer the engine kept is freed with the
 * context (ASan's leak check). */
Test(p2p_cancel, stalled_sender_never_answers, .init = setup, .fini = teardown, .timeout = 60)
{
    const size_t size = (size_t)NCHUNKS * CHUNK;
    struct cfx_context *a, *b;
    struct cfx_node_rec ra, rb;
    uint8_t *src = malloc(size), *dst = malloc(size);
    cr_assert(src && dst);
    cfx_test_fill(src, size, 5);
    up2("tcp", &a, &b, &ra, &rb);
    struct cfx_p2p_req *s = free_pending_recv(a, b, &ra, &rb, 7, src, dst);
    free(dst);
    cfx_context_destroy(b);
    cfx__p2p_free(s); /* the receiver is gone: ends at once or after the grace */
    cfx_context_destroy(a);
    free(src);
}

/* Receive requests of @p from on (chan 1, @p tag) waiting at @p c. */
static int rtrs_of(struct cfx_context *c, uint32_t from, uint32_t tag)
{
    int n = 0;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &c->p2p_rtrs) {
        const struct cfx_p2p_rtr *r = cfx_list_entry(pos, struct cfx_p2p_rtr, link);
        n += r->conn->node_id == from && r->req.chan == 1 && r->req.tag == tag;
    }
    return n;
}

/* Wait (generously) until exactly @p n receive requests of @p from on @p tag
 * wait at @p c (the receives asked, or withdrew, and no send took them);
 * how many there were at the end. */
static int wait_rtrs(struct cfx_context *c, uint32_t from, uint32_t tag, int n)
{
    uint64_t dl = cfx__deadline_ns(10000);
    pthread_mutex_lock(&c->lock);
    int have = rtrs_of(c, from, tag);
    while (have != n) {
        /* a request's arrival or withdrawal signals nothing: look every 10 ms */
        uint64_t look = cfx__deadline_ns(10);
        if (!cfx__obj_wait(c, CFX_MIN(look, dl)) && cfx__now_ns() >= dl)
            break;
        have = rtrs_of(c, from, tag);
    }
    pthread_mutex_unlock(&c->lock);
    return have;
}

#define MSG 262144u /* a rendezvous message (a ring allreduce's segment) */

struct pair {
    struct cfx_context *a, *b; /* a sends, b receives */
    struct cfx_node_rec ra, rb;
    uint8_t *src[2], *dst[3];
};

static void pair_up(struct pair *p)
{
    join("tcp", false, &p->a);
    join("tcp", false, &p->b);
    uint64_t dl = cfx__deadline_ns(5000);
    cr_assert_eq(cfx__ctl_node_get(p->b->ctl, p->a->node_id, &p->ra, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_node_get(p->a->ctl, p->b->node_id, &p->rb, dl), CFX_OK);
    for (int i = 0; i < 2; i++) {
        cr_assert_not_null(p->src[i] = malloc(MSG));
        cfx_test_fill(p->src[i], MSG, 31 + (uint64_t)i);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert_not_null(p->dst[i] = malloc(MSG));
        memset(p->dst[i], 0xA5, MSG);
    }
}

static void pair_down(struct pair *p)
{
    cfx_context_destroy(p->b);
    cfx_context_destroy(p->a);
    for (int i = 0; i < 2; i++)
        free(p->src[i]);
    for (int i = 0; i < 3; i++)
        free(p->dst[i]);
}

/* b receives into dst[@p d] and a sends src[@p s] on @p tag: both complete
 * and the bytes are src[s]'s. */
static void exchange(struct pair *p, uint32_t tag, int d, struct cfx_p2p_req *r, int s,
                     struct cfx_p2p_req *sq)
{
    uint64_t dl = cfx__deadline_ns(10000);
    cr_assert_eq(cfx__p2p_wait(r, dl), CFX_OK, "receive %d: %s", d, cfx_last_error());
    cr_assert_eq(cfx__p2p_wait(sq, dl), CFX_OK, "send %d: %s", s, cfx_last_error());
    cr_assert_eq(cfx_test_check(p->dst[d], MSG, 31 + (uint64_t)s), (size_t)-1,
                 "receive %d on tag %u does not hold message %d", d, tag, s);
    cfx__p2p_free(r);
    cfx__p2p_free(sq);
}

/*
 * A receive withdrawn while its request waited at the sender leaves its
 * message to the next receive of the key (MPI's cancel): b posts receives
 * 0 and 1, both requests reach a, b withdraws 0; a's message 0 then lands
 * in receive 1 and message 1 in the receive b posts next.
 */
Test(p2p_cancel, a_withdrawn_recv_leaves_its_message_to_the_next, .init = setup,
     .fini = teardown, .timeout = 60)
{
    struct pair p = { 0 };
    pair_up(&p);
    struct cfx_p2p_req *r[3], *s[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx__p2p_irecv(p.b, &p.ra, 1, 11, p.dst[i], MSG, CFX_MEMTYPE_HOST, &r[i]),
                     CFX_OK);
    cr_assert_eq(wait_rtrs(p.a, p.b->node_id, 11, 2), 2, "the requests never reached a");
    cfx__p2p_free(r[0]);
    cr_assert_eq(wait_rtrs(p.a, p.b->node_id, 11, 1), 1, "the withdrawal never reached a");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx__p2p_isend(p.a, &p.rb, 1, 11, p.src[i], MSG, CFX_MEMTYPE_HOST, &s[i]),
                     CFX_OK);
    exchange(&p, 11, 1, r[1], 0, s[0]);
    cr_assert_eq(cfx__p2p_irecv(p.b, &p.ra, 1, 11, p.dst[2], MSG, CFX_MEMTYPE_HOST, &r[2]),
                 CFX_OK);
    exchange(&p, 11, 2, r[2], 1, s[1]);
    for (size_t i = 0; i < MSG; i++)
        cr_assert_eq(p.dst[0][i], 0xA5, "the withdrawn receive's buffer was written at %zu", i);
    pair_down(&p);
}

/*
 * Withdrawn from the last to the first (as a failed collective withdraws
 * its messages, coll.c), two receives of one key leave what is left the
 * head of the sequence at each step, and nothing once both went: messages
 * 0 and 1, sent after, land in the next two receives in order.  (First to
 * last, a send of a's posted between the two withdrawals took receive 1's
 * request for message 0: with a ring allreduce's segments of unequal
 * sizes both sides failed CFX_ERR_INVALID, with equal sizes receive 1 took
 * the wrong bytes.)
 */
Test(p2p_cancel, recvs_withdrawn_last_to_first_leave_the_sequence_whole, .init = setup,
     .fini = teardown, .timeout = 60)
{
    struct pair p = { 0 };
    pair_up(&p);
    struct cfx_p2p_req *r[2], *s[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx__p2p_irecv(p.b, &p.ra, 1, 12, p.dst[i], MSG, CFX_MEMTYPE_HOST, &r[i]),
                     CFX_OK);
    cr_assert_eq(wait_rtrs(p.a, p.b->node_id, 12, 2), 2, "the requests never reached a");
    cfx__p2p_free(r[1]);
    int left = wait_rtrs(p.a, p.b->node_id, 12, 1);
    cr_assert_eq(left, 1, "a holds %d requests after the last was withdrawn", left);
    cfx__p2p_free(r[0]);
    left = wait_rtrs(p.a, p.b->node_id, 12, 0);
    cr_assert_eq(left, 0, "a holds %d requests after both were withdrawn", left);
    /* the pair goes on in step on that tag */
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx__p2p_isend(p.a, &p.rb, 1, 12, p.src[i], MSG, CFX_MEMTYPE_HOST, &s[i]),
                     CFX_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(cfx__p2p_irecv(p.b, &p.ra, 1, 12, p.dst[i], MSG, CFX_MEMTYPE_HOST, &r[i]),
                     CFX_OK);
    exchange(&p, 12, 0, r[0], 0, s[0]);
    exchange(&p, 12, 1, r[1], 1, s[1]);
    pair_down(&p);
}

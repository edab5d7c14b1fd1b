/* What the coordinator's directory parks (coord_waits.c) and how its
 * listing pages (coord_dir_index.c), under members that push against the
 * caps: deletes held by a holder that never acknowledges, waiting deletes
 * and parked lookups per member, the global object cap, listings with far
 * cursors and holes.  Everything is checked by error codes and counts. */
#include <criterion/criterion.h>

#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/client.h"
#include "control/coord.h"
#include "control/coord_int.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "testutil.h"

TestSuite(coord_waits, .init = coord_fixture_setup, .fini = coord_fixture_teardown,
          .timeout = 90);

static uint8_t frame[1 << 16];

/* Object id number @p k (distinct for every k). */
static struct cfx_object_id nid(uint32_t k)
{
    struct cfx_object_id id;
    memset(&id, 0x5a, sizeof(id));
    memcpy(id.bytes, &k, sizeof(k));
    return id;
}

static void send_put(int s, uint32_t k, uint64_t req)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJ_PUT, .req_id = req };
    r.u.put.id = nid(k);
    r.u.put.size = BIG;
    r.u.put.chunk_size = 65536;
    raw_send(s, &r);
}

static void send_lookup(int s, uint32_t k, uint32_t timeout_ms, uint64_t req)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJ_LOOKUP, .req_id = req };
    r.u.lookup.id = nid(k);
    r.u.lookup.timeout_ms = timeout_ms;
    raw_send(s, &r);
}

static void send_delete(int s, uint32_t k, uint64_t req)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJ_DELETE, .req_id = req };
    r.u.del.id = nid(k);
    r.u.del.end = 1;
    raw_send(s, &r);
}

/* The next answer on @p s (events passed by); while none comes, every
 * socket of @p beat sends a heartbeat each HB_MS, so that silent members
 * stay alive.  Its status (0: OK or a reply), *type, text. */
static int answer(int s, const int *beat, int nbeat, uint64_t *req, uint8_t *type, char *text,
                  size_t text_len)
{
    uint64_t dl = cfx__deadline_ns(CALL_MS);
    struct cfx_msg m;
    for (;;) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        if (poll(&p, 1, HB_MS) == 0) {
            cr_assert_lt(cfx__now_ns(), dl, "no answer within %d ms", CALL_MS);
            for (int i = 0; i < nbeat; i++) {
                struct cfx_msg hb = { .type = CFX_MSG_HEARTBEAT };
                raw_send(beat[i], &hb);
            }
            continue;
        }
        cr_assert_eq(raw_read_frame(s, frame, sizeof(frame), &m), CFX_OK);
        if (m.type == CFX_MSG_EV_OBJ_GONE || m.type == CFX_MSG_EV_NODE_DEAD)
            continue;
        break;
    }
    if (req)
        *req = m.req_id;
    if (type)
        *type = m.type;
    if (m.type == CFX_MSG_ERROR) {
        if (text)
            snprintf(text, text_len, "%s", m.u.error.text);
        return m.u.error.status;
    }
    return 0;
}

/* A raw member's socket; @p id (may be NULL) receives its node id. */
static int node_id(uint32_t *id)
{
    int s = raw_auth_role(CFX_CTL_ROLE_NODE);
    int64_t got = raw_join(s, 0, 1, NULL, 0);
    cr_assert_gt(got, 0);
    if (id)
        *id = (uint32_t)got;
    return s;
}

static int node(void)
{
    return node_id(NULL);
}

/*
 * A holder that goes on beating but never acknowledges a withdrawal held
 * the putter's delete for ever.  Now each waiting delete is answered at
 * its deadline (dead_after_ms plus a margin) with CFX_ERR_PEER_FAILED
 * naming the silent holder, the id free for a new put; and one connection
 * may have COORD_DEL_WAITS_PER_CONN deletes waiting: the next is refused
 * at once with CFX_ERR_NO_RESOURCE and withdraws nothing.
 */
Test(coord_waits, a_silent_holder_holds_a_delete_until_its_deadline_only)
{
    enum { N = COORD_DEL_WAITS_PER_CONN + 1 };
    uint32_t bid;
    int a = node(), b = node_id(&bid), both[2];
    char text[CFX_PROTO_TEXT_MAX];
    uint64_t req;
    uint8_t type;
    both[0] = a;
    both[1] = b;
    /* a puts N objects; b looks each up (a holder of each, partial) */
    for (uint32_t k = 0; k < N; k++) {
        send_put(a, k, 10 + k);
        cr_assert_eq(answer(a, both, 2, &req, &type, text, sizeof(text)), 0, "%s", text);
        send_lookup(b, k, 0, 10 + k);
        cr_assert_eq(answer(b, both, 2, &req, &type, text, sizeof(text)), 0, "%s", text);
        cr_assert_eq(type, CFX_MSG_LOOKUP_REPLY);
    }
    /* every delete at once; b never acknowledges */
    for (uint32_t k = 0; k < N; k++)
        send_delete(a, k, 5000 + k);
    /* the last one is refused at once: a has N - 1 deletes waiting */
    cr_assert_eq(answer(a, both, 2, &req, &type, text, sizeof(text)), CFX_ERR_NO_RESOURCE,
                 "%s", text);
    cr_assert_eq(req, 5000 + N - 1);
    cr_assert(strstr(text, "deletes waiting"), "%s", text);
    /* the others at their deadline, naming b */
    char want[32];
    snprintf(want, sizeof(want), "node %u", bid);
    for (uint32_t i = 0; i < N - 1; i++) {
        cr_assert_eq(answer(a, both, 2, &req, &type, text, sizeof(text)), CFX_ERR_PEER_FAILED,
                     "delete %u: %s", i, text);
        cr_assert(req >= 5000 && req < 5000 + N - 1, "answer to %llu", (unsigned long long)req);
        cr_assert(strstr(text, want) && strstr(text, "did not acknowledge"), "%s", text);
    }
    /* those ids are free; the refused one is still a's */
    send_put(b, 0, 20);
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    send_put(b, N - 1, 21);
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), CFX_ERR_EXISTS, "%s", text);
    close(b);
    close(a);
}

/* The token of the next EV_OBJ_GONE on @p s (other frames passed by). */
static uint64_t gone_token(int s)
{
    struct cfx_msg m;
    do
        cr_assert_eq(raw_read_frame(s, frame, sizeof(frame), &m), CFX_OK);
    while (m.type != CFX_MSG_EV_OBJ_GONE);
    cr_assert_neq(m.req_id, 0, "a putter's delete asks for an acknowledgement");
    return m.req_id;
}

static void send_gone_ack(int s, uint32_t k, uint64_t tok)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJ_GONE_ACK, .req_id = tok };
    r.u.gone.id = nid(k);
    raw_send(s, &r);
}

/*
 * The id of a putter's delete that waits for a holder is not free: a put of
 * it from a third node succeeded there, while the holder that had not yet
 * taken the event still answered its own gets with the withdrawn bytes.
 * Such a put is refused CFX_ERR_EXISTS naming the holder, and succeeds
 * once the delete is answered.  A plain put from the holder waited for is
 * its acknowledgement (its store let it through once its copy left); a
 * copy it re-announces is one it still holds, refused and not counted.
 */
Test(coord_waits, an_id_stays_taken_while_its_delete_waits_for_a_holder)
{
    uint32_t aid, bid;
    int a = node_id(&aid), b = node_id(&bid), c = node(), all[3];
    char text[CFX_PROTO_TEXT_MAX], want[32];
    uint64_t req;
    uint8_t type;
    all[0] = a;
    all[1] = b;
    all[2] = c;
    snprintf(want, sizeof(want), "node %u", bid);
    for (uint32_t k = 0; k < 2; k++) {
        send_put(a, k, 10 + k);
        cr_assert_eq(answer(a, all, 3, NULL, NULL, text, sizeof(text)), 0, "%s", text);
        send_lookup(b, k, 0, 10 + k);
        cr_assert_eq(answer(b, all, 3, NULL, &type, text, sizeof(text)), 0, "%s", text);
        cr_assert_eq(type, CFX_MSG_LOOKUP_REPLY);
    }

    /* object 0: a third node's put waits for b's acknowledgement */
    send_delete(a, 0, 100);
    uint64_t tok = gone_token(b);
    send_put(c, 0, 30);
    cr_assert_eq(answer(c, all, 3, NULL, NULL, text, sizeof(text)), CFX_ERR_EXISTS, "%s", text);
    cr_assert(strstr(text, "being deleted") && strstr(text, want), "%s", text);
    send_lookup(c, 0, 0, 31); /* gone from the directory all the same: no wait */
    cr_assert_eq(answer(c, all, 3, NULL, NULL, text, sizeof(text)), CFX_ERR_TIMEOUT, "%s",
                 text);
    send_gone_ack(b, 0, tok);
    cr_assert_eq(answer(a, all, 3, &req, NULL, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(req, 100);
    send_put(c, 0, 32);
    cr_assert_eq(answer(c, all, 3, NULL, NULL, text, sizeof(text)), 0, "%s", text);

    /* object 1: b re-announcing its copy is refused and answers nothing;
     * b's own put of the id answers the delete (its ack comes after) */
    send_delete(a, 1, 101);
    tok = gone_token(b);
    struct cfx_msg r = { .type = CFX_MSG_OBJ_PUT, .req_id = 40 };
    r.u.put.id = nid(1);
    r.u.put.size = BIG;
    r.u.put.chunk_size = 65536;
    r.u.put.copy = 1;
    r.u.put.putter = aid;
    raw_send(b, &r);
    cr_assert_eq(answer(b, all, 3, NULL, NULL, text, sizeof(text)), CFX_ERR_EXISTS, "%s", text);
    send_put(b, 1, 41);
    cr_assert_eq(answer(b, all, 3, &req, NULL, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(req, 41);
    cr_assert_eq(answer(a, all, 3, &req, NULL, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(req, 101);
    send_gone_ack(b, 1, tok); /* late: nothing waits for it */
    send_put(c, 1, 42); /* b's object now */
    cr_assert_eq(answer(c, all, 3, NULL, NULL, text, sizeof(text)), CFX_ERR_EXISTS, "%s", text);
    cr_assert(strstr(text, "already exists"), "%s", text);
    close(c);
    close(b);
    close(a);
}

/*
 * Parked lookups: a member may hold its share of max_parked (at least
 * COORD_PARKED_SHARE_MIN), so one member cannot take the whole budget;
 * the budget of all still caps them.  A put wakes the lookups of its own
 * id, and only those (the next frame after each put is its waiter's
 * answer).
 */
Test(coord_waits, parked_lookups_capped_per_member_and_woken_by_id)
{
    cfx__coord_stop(coord);
    caps.max_parked = 600; /* 3 members: a share of 200, so the minimum, 256 */
    start_coord();
    caps.max_parked = 0;
    uint32_t bid;
    int a = node(), b = node_id(&bid), c = node(), all[3] = { a, b, c };
    char want[64];
    snprintf(want, sizeof(want), "node %u already waits for %u objects", bid,
             COORD_PARKED_SHARE_MIN);
    char text[CFX_PROTO_TEXT_MAX];
    uint64_t req;
    uint8_t type;

    for (uint32_t k = 0; k < COORD_PARKED_SHARE_MIN; k++)
        send_lookup(b, 1000 + k, CFX_PROTO_TIMEOUT_NONE, 100 + k);
    send_lookup(b, 999, CFX_PROTO_TIMEOUT_NONE, 99);
    cr_assert_eq(answer(b, all, 3, &req, NULL, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert_eq(req, 99);
    cr_assert(strstr(text, want), "%s", text);
    /* c takes its share too; a then reaches the budget of all */
    for (uint32_t k = 0; k < COORD_PARKED_SHARE_MIN; k++)
        send_lookup(c, 2000 + k, CFX_PROTO_TIMEOUT_NONE, 100 + k);
    for (uint32_t k = 0; k < 600 - 2 * COORD_PARKED_SHARE_MIN; k++)
        send_lookup(a, 3000 + k, CFX_PROTO_TIMEOUT_NONE, 100 + k);
    send_lookup(a, 2999, CFX_PROTO_TIMEOUT_NONE, 98);
    cr_assert_eq(answer(a, all, 3, &req, NULL, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert_eq(req, 98);
    cr_assert(strstr(text, "max_parked"), "%s", text);

    /* puts of three of b's ids, one of c's: each wakes its own lookup */
    static const uint32_t ks[3] = { 1000 + 7, 1000 + 200, 1000 + 3 };
    for (int i = 0; i < 3; i++) {
        send_put(a, ks[i], 50 + (uint64_t)i);
        cr_assert_eq(answer(a, all, 3, NULL, NULL, text, sizeof(text)), 0, "%s", text);
        cr_assert_eq(answer(b, all, 3, &req, &type, text, sizeof(text)), 0, "%s", text);
        cr_assert_eq(type, CFX_MSG_LOOKUP_REPLY);
        cr_assert_eq(req, 100 + (uint64_t)(ks[i] - 1000));
    }
    send_put(a, 2000 + 17, 60);
    cr_assert_eq(answer(a, all, 3, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(answer(c, all, 3, &req, &type, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(req, 117);
    /* b's share has room again: one more parks (its answer comes with the put) */
    send_lookup(b, 999, CFX_PROTO_TIMEOUT_NONE, 97);
    send_put(a, 999, 61);
    cr_assert_eq(answer(a, all, 3, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(answer(b, all, 3, &req, &type, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(req, 97);
    cr_assert_eq(type, CFX_MSG_LOOKUP_REPLY);
    close(c);
    close(b);
    close(a);
}

/* max_objects caps the directory's entries of all members together: a put
 * of a new id beyond is refused naming it, a lookup of one there still
 * served; a delete makes room. */
Test(coord_waits, max_objects_caps_every_member_together)
{
    cfx__coord_stop(coord);
    caps.max_objects = 3;
    start_coord();
    caps.max_objects = 0;
    int a = node(), b = node(), both[2] = { a, b };
    char text[CFX_PROTO_TEXT_MAX];
    uint8_t type;
    for (uint32_t k = 0; k < 2; k++) {
        send_put(a, k, 10 + k);
        cr_assert_eq(answer(a, both, 2, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    }
    send_put(b, 2, 10);
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    send_put(b, 3, 11);
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_objects"), "%s", text);
    send_lookup(b, 0, 0, 12);
    cr_assert_eq(answer(b, both, 2, NULL, &type, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(type, CFX_MSG_LOOKUP_REPLY);
    send_delete(b, 2, 13); /* its own put: nobody else holds it */
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    send_put(b, 3, 14);
    cr_assert_eq(answer(b, both, 2, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    close(b);
    close(a);
}

/* One OBJECTS page from cursor @p cursor: its record count, next and more. */
static uint32_t objects_page(int s, uint32_t cursor, uint32_t *next, int *more)
{
    struct cfx_msg r = { .type = CFX_MSG_OBJECTS, .req_id = 77 }, m;
    r.u.list.cursor = cursor;
    static uint8_t page[16 << 20]; /* a full page of records */
    raw_send(s, &r);
    cr_assert_eq(raw_read_frame(s, page, sizeof(page), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_OBJECTS_REPLY, "%s", cfx__msg_type_name(m.type));
    *next = m.u.page.next;
    *more = m.u.page.more;
    return m.u.page.count;
}

/*
 * The listing's cursor is a position in insertion order found by search:
 * objects deleted before and during a listing leave no duplicate and no
 * gap among the others, a page resumes after the last object it listed,
 * and a cursor naming no object (far ahead) gets an empty last page.
 */
Test(coord_waits, listing_pages_resume_after_holes_and_far_cursors)
{
    enum { N = 3 * CFX_PROTO_OBJECTS_PAGE + 100 };
    int a = node(), both[1] = { a };
    char text[CFX_PROTO_TEXT_MAX];
    for (uint32_t k = 0; k < N; k++) {
        send_put(a, k, 10);
        cr_assert_eq(answer(a, both, 1, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    }
    /* every third one goes (a holds them alone: answered at once) */
    uint32_t live = N;
    for (uint32_t k = 0; k < N; k += 3, live--) {
        send_delete(a, k, 11);
        cr_assert_eq(answer(a, both, 1, NULL, NULL, text, sizeof(text)), 0, "%s", text);
    }
    /* the first page; then a run of holes right after it, then the rest */
    uint32_t next, cursor;
    int more;
    uint32_t got = objects_page(a, 0, &next, &more);
    cr_assert_eq(got, CFX_PROTO_OBJECTS_PAGE);
    cr_assert(more);
    uint32_t gone = 0;
    for (uint32_t k = 0; k < N && gone < 200; k++) {
        if (k % 3 == 0 || k < 3 * CFX_PROTO_OBJECTS_PAGE / 2 + 10)
            continue; /* deleted already, or listed on the first page */
        send_delete(a, k, 12);
        cr_assert_eq(answer(a, both, 1, NULL, NULL, text, sizeof(text)), 0, "%s", text);
        gone++;
    }
    for (cursor = next; more; cursor = next)
        got += objects_page(a, cursor, &next, &more);
    cr_assert_eq(got, live - gone, "listed %u of %u", got, live - gone);

    /* the whole listing through the client: each live object once */
    struct cfx_ctl *adm = open_admin();
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(adm, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(n, live - gone);
    uint8_t *seen = calloc(N, 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t k;
        memcpy(&k, objs[i].id.bytes, sizeof(k));
        cr_assert_lt(k, N);
        cr_assert_eq(seen[k], 0, "object %u listed twice", k);
        cr_assert_neq(k % 3, 0, "deleted object %u listed", k);
        seen[k] = 1;
    }
    free(seen);
    free(objs);
    cfx__ctl_close(adm);

    /* all but the last five go: the holes outnumber the entries and are
     * squeezed out; the listing still finds exactly the five */
    uint32_t left = 0;
    for (uint32_t k = 0; k < N - 5; k++) {
        if (k % 3 == 0)
            continue;
        send_delete(a, k, 13);
        int rc = answer(a, both, 1, NULL, NULL, text, sizeof(text));
        cr_assert(rc == 0 || rc == CFX_ERR_NOT_FOUND, "%s", text); /* deleted above */
    }
    for (uint32_t k = N - 5; k < N; k++)
        left += k % 3 != 0;
    cursor = 0;
    got = 0;
    do {
        got += objects_page(a, cursor, &next, &more);
        cursor = next;
    } while (more);
    cr_assert_eq(got, left);

    /* a far cursor: an empty last page, not an error */
    cr_assert_eq(objects_page(a, 0xffffffffu, &next, &more), 0);
    cr_assert_eq(more, 0);
    close(a);
}

/* ---- NODE_GETs waiting for nodes of before a restart ----------------------- */

/* The coordinator on state directory @p dir, with a rejoin window of a
 * minute (dead_after_ms) so that the window is not what is tested. */
static void coord_on_state(const char *dir)
{
    struct cfx_coord_params p = {
        .bind_addr = "127.0.0.1",
        .token = token,
        .heartbeat_ms = HB_MS,
        .dead_after_ms = 60000,
        .auth_timeout_ms = AUTH_MS,
        .stall_timeout_ms = STALL_MS,
        .state_dir = dir,
        .max_parked = 600,
    };
    cr_assert_eq(cfx__coord_start(&p, &coord), CFX_OK, "%s", cfx_last_error());
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", cfx__coord_port(coord));
}

static void send_node_get(int s, uint32_t id, uint64_t req)
{
    struct cfx_msg r = { .type = CFX_MSG_NODE_GET, .req_id = req };
    r.u.node_get.node_id = id;
    raw_send(s, &r);
}

/* The first frame on @p s after a NODE_GET and a STATUS: ERROR (its status
 * and text) when the NODE_GET was refused, 0 when the STATUS came first
 * (the query parked). */
static int refused_or_parked(int s, uint64_t req, char *text, size_t len)
{
    struct cfx_msg m, st = { .type = CFX_MSG_STATUS, .req_id = req + 1 };
    raw_send(s, &st);
    cr_assert_eq(raw_read_frame(s, frame, sizeof(frame), &m), CFX_OK);
    if (m.type == CFX_MSG_STATUS_REPLY)
        return 0;
    cr_assert_eq(m.type, CFX_MSG_ERROR, "%s", cfx__msg_type_name(m.type));
    cr_assert_eq(m.req_id, req);
    snprintf(text, len, "%s", m.u.error.text);
    struct cfx_msg m2;
    cr_assert_eq(raw_read_frame(s, frame, sizeof(frame), &m2), CFX_OK);
    cr_assert_eq(m2.type, CFX_MSG_STATUS_REPLY);
    return m.u.error.status;
}

/*
 * After a restart, a NODE_GET about a node of before that has not rejoined
 * waits.  Those waits were capped per connection only (4096), not in all
 * and not by max_parked: connections up to max_conns could park 16 million
 * of them (a gigabyte), and every join walked them all.  Now they count
 * against the share and max_parked as parked lookups do; a refusal names
 * the cap and the peer; a rejoin answers the waits of its id.
 */
Test(coord_waits, node_queries_before_rejoin_capped_per_connection_and_in_all)
{
    char dir[] = "/tmp/cfx-nodewait-XXXXXX", text[CFX_PROTO_TEXT_MAX];
    cr_assert_not_null(mkdtemp(dir));
    cfx__coord_stop(coord);
    coord_on_state(dir);
    int s = raw_auth_role(CFX_CTL_ROLE_NODE);
    int64_t id = raw_join(s, 0, 1, NULL, 0);
    cr_assert_gt(id, 0);
    close(s);
    cfx__coord_stop(coord);
    coord_on_state(dir); /* restarted: node id is one of before now */

    int a = raw_auth(), b = raw_auth();
    for (uint32_t k = 0; k < 600; k++)
        send_node_get(a, (uint32_t)id, 100 + k);
    send_node_get(a, (uint32_t)id, 99);
    cr_assert_eq(refused_or_parked(a, 99, text, sizeof(text)), CFX_ERR_NO_RESOURCE,
                 "a connection's 601st query parked");
    cr_assert(strstr(text, "127.0.0.1:") && strstr(text, "600"), "%s", text);
    send_node_get(b, (uint32_t)id, 99);
    cr_assert_eq(refused_or_parked(b, 99, text, sizeof(text)), CFX_ERR_NO_RESOURCE,
                 "a query beyond max_parked in all parked");
    cr_assert(strstr(text, "max_parked"), "%s", text);

    /* the node rejoins: each of a's queries is answered with its record */
    s = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_eq(raw_join(s, (uint32_t)id, 2, NULL, 0), id);
    for (uint32_t k = 0; k < 600; k++) {
        struct cfx_msg m;
        cr_assert_eq(raw_read_frame(a, frame, sizeof(frame), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_NODE_REPLY, "%s", cfx__msg_type_name(m.type));
        cr_assert_eq(m.req_id, 100 + k);
        cr_assert_eq(m.u.join.node_id, id);
    }
    /* room again: a query of another node of before parks */
    send_node_get(b, (uint32_t)id + 1, 98);
    cr_assert_eq(refused_or_parked(b, 98, text, sizeof(text)), 0, "%s", text);
    close(s);
    close(b);
    close(a);
    cfx__coord_stop(coord);
    coord = NULL;
    rm_state_dir(dir);
}

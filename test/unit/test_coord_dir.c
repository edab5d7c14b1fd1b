/* The coordinator's directory: node ids given at JOIN, the fan-out of the
 * trees and chains getters form, and the caps on what one node may hold. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <conflux/status.h>

#include "control/auth.h"
#include "control/client.h"
#include "control/coord.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "testutil.h"

TestSuite(coord_dir, .init = coord_fixture_setup, .fini = coord_fixture_teardown, .timeout = 60);

Test(coord_dir, join_gives_distinct_ids_in_order)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL),
                   *c = open_node("c", NULL);
    cr_assert_eq(cfx__ctl_node_id(a), 1);
    cr_assert_eq(cfx__ctl_node_id(b), 2);
    cr_assert_eq(cfx__ctl_node_id(c), 3);
    cr_assert_eq(cfx__ctl_heartbeat_ms(a), HB_MS);
    cr_assert_eq(cfx__ctl_dead_after_ms(a), DEAD_MS);

    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(a, 2, &rec, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(rec.node_id, 2);
    cr_assert_str_eq(rec.name, "b");
    cr_assert_str_eq(rec.host_id, "test-host");
    cr_assert_eq(rec.alive, 1);
    cr_assert_eq(rec.naddr, 1);
    cr_assert_str_eq(rec.addr[0].tp, "tcp");
    cr_assert(strncmp(rec.ctl_addr, "127.0.0.1:", 10) == 0, "ctl_addr %s", rec.ctl_addr);
    cr_assert_eq(cfx__ctl_node_get(a, 99, &rec, cfx__deadline_ns(CALL_MS)), CFX_ERR_NOT_FOUND);
    cr_assert(strstr(cfx_last_error(), "node 99"), "%s", cfx_last_error());
    cfx__ctl_close(c);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord_dir, concurrent_lookups_form_a_tree)
{
    enum { N = 8 };
    struct cfx_ctl *p = open_node("putter", NULL), *g[N];
    struct lookup_job jobs[N];
    pthread_t t[N];
    pthread_barrier_t bar;
    struct cfx_object_id id;
    make_id(&id, "broadcast");
    for (int i = 0; i < N; i++) {
        char name[24];
        snprintf(name, sizeof(name), "getter%d", i);
        g[i] = open_node(name, NULL);
    }
    cr_assert_eq(cfx__ctl_obj_put(p, &id, 64ull << 20, 1 << 20, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
        jobs[i] = (struct lookup_job){ .ctl = g[i], .id = id, .timeout_ms = CALL_MS, .start = &bar };
        pthread_create(&t[i], NULL, lookup_thread, &jobs[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);

    /* uploads per node id, and depth of each getter in the tree */
    uint32_t uploads[N + 2] = { 0 };
    for (int i = 0; i < N; i++) {
        cr_assert_eq(jobs[i].rc, CFX_OK, "getter %d: %s", i, cfx_errname(jobs[i].rc));
        uint32_t s = jobs[i].src.node.node_id;
        cr_assert(s >= 1 && s <= N + 1);
        cr_assert_neq(s, cfx__ctl_node_id(g[i]), "a getter was told to pull from itself");
        uploads[s]++;
    }
    /* The directory agrees with what the getters were told. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, N + 1);
    uint32_t max_up = 0, min_up = UINT32_MAX, total = 0;
    for (uint32_t i = 0; i < objs[0].nholders; i++) {
        const struct cfx_obj_holder *h = &objs[0].holders[i];
        cr_assert_eq(h->uploads, uploads[h->node_id], "node %u", h->node_id);
        max_up = CFX_MAX(max_up, h->uploads);
        min_up = CFX_MIN(min_up, h->uploads);
        total += h->uploads;
    }
    free(objs);
    cr_assert_eq(total, N);
    /* No holder above the fanout while another holder is below it. */
    cr_assert(max_up <= FANOUT || min_up >= FANOUT, "max %u min %u", max_up, min_up);
    /* Not everyone hit the putter... */
    cr_assert_eq(uploads[cfx__ctl_node_id(p)], FANOUT);
    /* ...and the shape is a tree, not a chain: depth <= log2(N+1) + 1. */
    uint32_t depth[N + 2] = { 0 };
    for (int round = 0; round < N; round++)
        for (int i = 0; i < N; i++) {
            uint32_t s = jobs[i].src.node.node_id;
            depth[cfx__ctl_node_id(g[i])] = depth[s] + 1;
        }
    for (int i = 0; i < N; i++)
        cr_assert_leq(depth[cfx__ctl_node_id(g[i])], 3, "getter %d at depth %u", i,
                      depth[cfx__ctl_node_id(g[i])]);

    for (int i = 0; i < N; i++)
        cr_assert_eq(cfx__ctl_obj_done(g[i], &id, jobs[i].src.node.node_id, 1,
                                       cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (uint32_t i = 0; i < objs[0].nholders; i++) {
        cr_assert_eq(objs[0].holders[i].uploads, 0);
        cr_assert_eq(objs[0].holders[i].complete, 1);
    }
    free(objs);
    for (int i = 0; i < N; i++)
        cfx__ctl_close(g[i]);
    cfx__ctl_close(p);
}

/* Without --fanout the directory chooses per object: getters of an object of
 * many chunks form a chain (each holder feeds one, a later getter attaches
 * to the newest partial copy), getters of a small one a tree of fan-out 2. */
Test(coord_dir, fanout_follows_the_object)
{
    enum { N = 4 };
    cfx__coord_stop(coord);
    fanout = 0;
    start_coord();
    fanout = FANOUT;
    struct cfx_ctl *p = open_node("putter", NULL), *g[N];
    for (int i = 0; i < N; i++) {
        char name[24];
        snprintf(name, sizeof(name), "getter%d", i);
        g[i] = open_node(name, NULL);
    }
    static const struct {
        const char *name;
        uint64_t size;
        uint32_t chunk;
        int src[N]; /* who feeds getter i: -1 the putter, else a getter */
    } cases[] = {
        { "bandwidth-bound", 64ull << 20, 1u << 20, { -1, 0, 1, 2 } },  /* 64 chunks: a chain */
        { "four chunks", 4u << 20, 1u << 20, { -1, 0, 1, 2 } },
        { "latency-bound", 2u << 20, 1u << 20, { -1, -1, 0, 1 } },     /* 2 chunks: a tree */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct cfx_object_id id;
        make_id(&id, cases[c].name);
        cr_assert_eq(cfx__ctl_obj_put(p, &id, cases[c].size, cases[c].chunk, NULL,
                                      cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
        for (int i = 0; i < N; i++) {
            struct cfx_ctl_source src;
            cr_assert_eq(cfx__ctl_obj_lookup(g[i], &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                         CFX_OK, "%s: getter %d: %s", cases[c].name, i, cfx_last_error());
            int want = cases[c].src[i];
            uint32_t want_id = cfx__ctl_node_id(want < 0 ? p : g[want]);
            cr_assert_eq(src.node.node_id, want_id, "%s: getter %d fed by node %u, want %u",
                         cases[c].name, i, src.node.node_id, want_id);
        }
        /* the listing says who feeds whom (rdmactl objects) */
        struct cfx_ctl_obj_rec *objs;
        size_t n;
        cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
        cr_assert_eq(n, 1);
        cr_assert_eq(objs[0].nholders, N + 1);
        for (uint32_t h = 0; h < objs[0].nholders; h++) {
            uint32_t want = 0; /* the putter: complete, fed by nobody */
            for (int i = 0; i < N; i++)
                if (objs[0].holders[h].node_id == cfx__ctl_node_id(g[i]))
                    want = cfx__ctl_node_id(cases[c].src[i] < 0 ? p : g[cases[c].src[i]]);
            cr_assert_eq(objs[0].holders[h].src, want, "%s: node %u listed as fed by %u, want %u",
                         cases[c].name, objs[0].holders[h].node_id, objs[0].holders[h].src, want);
        }
        free(objs);
        cr_assert_eq(cfx__ctl_obj_delete(p, &id, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    for (int i = 0; i < N; i++)
        cfx__ctl_close(g[i]);
    cfx__ctl_close(p);
}

/*
 * Once members report their links, the fan-out comes from them ("Fan-out" in
 * coord_directory.c): 7 getters on links of 100 MB/s and 10 ms.  A 64 MiB
 * object still gets a chain; 4 MiB in 4 chunks (a chain by its shape alone)
 * a tree of fan-out 2, and a one-chunk 64 KiB object a tree of fan-out 4,
 * since there the hops' latency is what costs.
 */
Test(coord_dir, fanout_follows_reported_links)
{
    enum { N = 7 };
    static const struct cfx_msg_load rep = { .link_bw = 100000000, .link_lat_ns = 10000000 };
    cfx__coord_stop(coord);
    fanout = 0;
    start_coord();
    fanout = FANOUT;
    node_report = &rep;
    struct cfx_ctl *p = open_node("putter", NULL), *g[N];
    for (int i = 0; i < N; i++) {
        char name[24];
        snprintf(name, sizeof(name), "getter%d", i);
        g[i] = open_node(name, NULL);
    }
    /* every member's report is in before the first lookup, which is when the
     * directory reads them: each sends one heartbeat itself, then a status
     * query on the same connection, answered after the heartbeat was taken */
    struct cfx_ctl *all[N + 1];
    all[0] = p;
    for (int i = 0; i < N; i++)
        all[i + 1] = g[i];
    for (int i = 0; i <= N; i++) {
        struct cfx_msg hb = { .type = CFX_MSG_HEARTBEAT };
        struct cfx_ctl_status cs;
        hb.u.hb.load = rep;
        cr_assert_eq(cfx__ctl_send_nowait(all[i], &hb, "heartbeat"), CFX_OK, "%s",
                     cfx_last_error());
        cr_assert_eq(cfx__ctl_status(all[i], &cs, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    struct cfx_node_rec *nodes;
    size_t nn, with = 0;
    cr_assert_eq(cfx__ctl_nodes(p, &nodes, &nn, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (size_t i = 0; i < nn; i++)
        with += nodes[i].alive && nodes[i].load.link_bw == rep.link_bw &&
                nodes[i].load.link_lat_ns == rep.link_lat_ns;
    free(nodes);
    cr_assert_eq(with, N + 1, "only %zu of %d reports are in", with, N + 1);
    static const struct {
        const char *name;
        uint64_t size;
        uint32_t chunk;
        uint32_t fanout; /* what the putter serves; no holder serves more */
    } cases[] = {
        { "bandwidth-bound", 64ull << 20, 1u << 20, 1 },
        { "four chunks", 4u << 20, 1u << 20, 2 },
        { "one chunk", 64u << 10, 1u << 20, 4 },
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct cfx_object_id id;
        make_id(&id, cases[c].name);
        cr_assert_eq(cfx__ctl_obj_put(p, &id, cases[c].size, cases[c].chunk, NULL,
                                      cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
        for (int i = 0; i < N; i++) {
            struct cfx_ctl_source src;
            cr_assert_eq(cfx__ctl_obj_lookup(g[i], &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                         CFX_OK, "%s: getter %d: %s", cases[c].name, i, cfx_last_error());
        }
        struct cfx_ctl_obj_rec *objs;
        size_t n;
        uint32_t max_up = 0, putter_up = 0;
        cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
        cr_assert_eq(n, 1);
        cr_assert_eq(objs[0].nholders, N + 1);
        for (uint32_t h = 0; h < objs[0].nholders; h++) {
            max_up = CFX_MAX(max_up, objs[0].holders[h].uploads);
            if (objs[0].holders[h].node_id == cfx__ctl_node_id(p))
                putter_up = objs[0].holders[h].uploads;
        }
        free(objs);
        cr_assert_eq(putter_up, cases[c].fanout, "%s: the putter serves %u getters, want %u",
                     cases[c].name, putter_up, cases[c].fanout);
        cr_assert_eq(max_up, cases[c].fanout, "%s: a holder serves %u getters, want at most %u",
                     cases[c].name, max_up, cases[c].fanout);
        cr_assert_eq(cfx__ctl_obj_delete(p, &id, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    for (int i = 0; i < N; i++)
        cfx__ctl_close(g[i]);
    cfx__ctl_close(p);
    node_report = NULL; /* read by their heartbeats until they closed */
}

/*
 * 10,000 JOIN/LEAVE cycles on one connection, every other one asking for an
 * id 65535 above the high-water mark: each gets the next fresh id (the
 * coordinator chooses), and the node index stays as small as the records it
 * holds (a thousand dead ones at most), read from STATUS.  Before the fix
 * the wish was granted (id = high-water + 65535) and the index, a flat
 * array by id, grew by 512 KiB per such JOIN: gigabytes within the loop.
 */
Test(coord_dir, join_leave_cycles_keep_the_index_flat)
{
    int s = raw_auth_role(CFX_CTL_ROLE_NODE), adm = raw_auth();
    int64_t prev = raw_join(s, 0, 1, NULL, 0);
    cr_assert_gt(prev, 0);
    raw_leave(s);
    for (uint32_t i = 1; i <= 10000; i++) {
        uint32_t want = i % 2 ? (uint32_t)prev + 65535 : 0;
        int64_t id = raw_join(s, want, 1 + i, NULL, 0);
        cr_assert_eq(id, prev + 1, "cycle %u: asked for %u, got %lld after %lld", i, want,
                     (long long)id, (long long)prev);
        prev = id;
        raw_leave(s);
        if (i % 1000 == 0) {
            struct cfx_ctl_status st = raw_status(adm, i);
            cr_assert_leq(st.node_records, 1024 + 1, "cycle %u: %u records", i, st.node_records);
            cr_assert_leq(st.node_index_slots, 4096, "cycle %u: %u index slots", i,
                          st.node_index_slots);
        }
    }
    close(s);
    close(adm);
}

/* A JOIN beyond --max-nodes members alive gets an error naming the cap. */
Test(coord_dir, join_beyond_max_nodes_is_refused_by_name)
{
    cfx__coord_stop(coord);
    max_nodes = 2;
    start_coord();
    int a = raw_auth_role(CFX_CTL_ROLE_NODE), b = raw_auth_role(CFX_CTL_ROLE_NODE);
    int c = raw_auth_role(CFX_CTL_ROLE_NODE);
    char text[CFX_PROTO_TEXT_MAX];
    cr_assert_gt(raw_join(a, 0, 1, NULL, 0), 0);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);
    cr_assert_eq(raw_join(c, 0, 1, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_nodes"), "%s", text);
    raw_leave(a); /* room again, once a's STATUS answer shows the LEAVE was read */
    raw_status(a, 2);
    cr_assert_gt(raw_join(c, 0, 2, NULL, 0), 0);
    close(a);
    close(b);
    close(c);
    max_nodes = 0;
}

/*
 * Each coordinator cap, set small, answers the request that hits it with
 * CFX_ERR_NO_RESOURCE and a text naming it: objects per node, inline bytes
 * per node, parked lookups, unauthenticated connections.  Before the fix
 * there were no such caps: the fourth object, the second 60-byte inline
 * object, the third parked lookup and the third silent connection were all
 * taken.
 */
Test(coord_dir, each_cap_hit_is_named)
{
    cfx__coord_stop(coord);
    caps.max_node_objects = 3;
    caps.max_node_bytes = 100;
    caps.max_parked = 2;
    caps.max_unauth_conns = 2;
    start_coord();
    char text[CFX_PROTO_TEXT_MAX];

    /* objects per node */
    int a = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(a, 0, 1, NULL, 0), 0);
    for (uint8_t k = 1; k <= 3; k++)
        cr_assert_eq(raw_put(a, k, BIG, false, 10 + k, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(raw_put(a, 4, BIG, false, 20, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_node_objects"), "%s", text);

    /* inline bytes per node */
    int b = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);
    cr_assert_eq(raw_put(b, 5, 60, true, 2, text, sizeof(text)), 0, "%s", text);
    cr_assert_eq(raw_put(b, 6, 60, true, 3, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_node_bytes"), "%s", text);

    /* parked lookups, all connections together */
    raw_lookup(b, 7, 60000, 4);
    int c = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(c, 0, 1, NULL, 0), 0);
    raw_lookup(c, 8, 60000, 2);
    raw_lookup(c, 9, 60000, 3); /* the third: answered at once */
    cr_assert_eq(raw_answer(c, 3, text, sizeof(text)), CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(text, "max_parked"), "%s", text);

    /* unauthenticated connections: two wait for their challenge answer (the
     * three authenticated ones above do not count against the cap); a third
     * makes room by closing the oldest, which is told so (test_coord_conns
     * has the per-source cap) */
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    int u1 = raw_connect(), u2 = raw_connect();
    cr_assert_eq(raw_read_frame(u1, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    cr_assert_eq(raw_read_frame(u2, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    int u3 = raw_connect();
    cr_assert_eq(raw_read_frame(u3, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE, "%s", cfx__msg_type_name(m.type));
    cr_assert_eq(raw_read_frame(u1, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR, "%s", cfx__msg_type_name(m.type));
    cr_assert_eq(m.u.error.status, CFX_ERR_NO_RESOURCE);
    cr_assert(strstr(m.u.error.text, "max_unauth_conns"), "%s", m.u.error.text);
    cr_assert_geq(wait_closed(u1, CALL_MS), 0, "evicted connection left open");
    close(u1);
    close(u2);
    close(u3);
    close(a);
    close(b);
    close(c);
}


/* Send @p ctl's heartbeat reporting @p n copies' progress, then a status
 * query on the same connection: its answer comes after the heartbeat was
 * taken, so a listing made after sees it. */
static void report_progress(struct cfx_ctl *ctl, const struct cfx_ctl_progress *rep, uint32_t n)
{
    struct cfx_msg hb = { .type = CFX_MSG_HEARTBEAT };
    struct cfx_ctl_status cs;
    hb.u.hb.nprogress = n;
    memcpy(hb.u.hb.progress, rep, n * sizeof(*rep));
    cr_assert_eq(cfx__ctl_send_nowait(ctl, &hb, "heartbeat"), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_status(ctl, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK);
}

/* The holder record of @p node for @p id in a fresh listing (asserts it is there). */
static struct cfx_obj_holder listed_holder(struct cfx_ctl *ctl, const struct cfx_object_id *id,
                                           uint32_t node)
{
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    struct cfx_obj_holder h = { 0 };
    bool found = false;
    cr_assert_eq(cfx__ctl_objects(ctl, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    const struct cfx_ctl_obj_rec *o = find_obj(objs, n, id);
    cr_assert_not_null(o, "the object is not listed");
    for (uint32_t i = 0; i < o->nholders && i < CFX_PROTO_HOLDERS_MAX; i++) {
        if (o->holders[i].node_id == node) {
            h = o->holders[i];
            found = true;
        }
    }
    free(objs);
    cr_assert(found, "node %u is not listed as a holder", node);
    return h;
}

/*
 * A partial holder's heartbeats tell the directory how far its copy got,
 * and the listing carries it: no report yet (CFX_CTL_READY_UNKNOWN), then
 * the reported bytes; reports of copies it does not hold, over the size, or
 * of a complete copy change nothing; once complete it lists the size.
 */
Test(coord_dir, heartbeats_report_partial_copies)
{
    struct cfx_ctl *p = open_node("putter", NULL), *g = open_node("getter", NULL);
    const uint32_t pid = cfx__ctl_node_id(p), gid = cfx__ctl_node_id(g);
    const uint64_t size = 4ull << 20;
    struct cfx_object_id id, other, nowhere;
    struct cfx_ctl_source src;
    make_id(&id, "progress");
    make_id(&other, "progress-other");
    make_id(&nowhere, "progress-nowhere");
    cr_assert_eq(cfx__ctl_obj_put(p, &id, size, 1u << 20, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(p, &other, size, 1u << 20, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_lookup(g, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(src.node.node_id, pid);

    struct cfx_obj_holder h = listed_holder(p, &id, gid);
    cr_assert_eq(h.complete, 0);
    cr_assert_eq(h.src, pid, "fed by %u, want the putter %u", h.src, pid);
    cr_assert_eq(h.ready, CFX_CTL_READY_UNKNOWN, "ready %llu before any report",
                 (unsigned long long)h.ready);
    cr_assert_eq(listed_holder(p, &id, pid).ready, size, "the putter's copy is complete");

    /* its report, with reports of copies it does not hold around it */
    struct cfx_ctl_progress rep[3] = {
        { .id = nowhere, .ready = 1 },
        { .id = id, .ready = 3ull << 19 },
        { .id = other, .ready = 7 },
    };
    report_progress(g, rep, 3);
    cr_assert_eq(listed_holder(p, &id, gid).ready, 3ull << 19);
    cr_assert_eq(listed_holder(p, &other, pid).ready, size, "a non-holder's report was taken");

    /* over the size: ignored; the last good count stays */
    rep[0] = (struct cfx_ctl_progress){ .id = id, .ready = size + 1 };
    report_progress(g, rep, 1);
    cr_assert_eq(listed_holder(p, &id, gid).ready, 3ull << 19);
    /* the putter's complete copy is not moved by a report */
    rep[0] = (struct cfx_ctl_progress){ .id = id, .ready = 5 };
    report_progress(p, rep, 1);
    cr_assert_eq(listed_holder(p, &id, pid).ready, size);
    /* every byte, then complete: the size either way */
    rep[0] = (struct cfx_ctl_progress){ .id = id, .ready = size };
    report_progress(g, rep, 1);
    cr_assert_eq(listed_holder(p, &id, gid).ready, size);
    cr_assert_eq(cfx__ctl_obj_done(g, &id, pid, 1, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    h = listed_holder(p, &id, gid);
    cr_assert_eq(h.complete, 1);
    cr_assert_eq(h.ready, size);
    cfx__ctl_close(g);
    cfx__ctl_close(p);
}

/* Extra sources for a striped get: named only with a complete source, and
 * only complete holders that serve no upload; a partial source comes
 * alone, and the extras are not counted as uploads. */
Test(coord_dir, extra_sources_are_complete_idle_holders)
{
    struct cfx_ctl *p = open_node("putter", NULL), *c1 = open_node("copy1", NULL),
                   *c2 = open_node("copy2", NULL), *part = open_node("partial", NULL),
                   *g = open_node("getter", NULL), *g2 = open_node("getter2", NULL);
    struct cfx_ctl_source src;
    struct cfx_object_id id;
    make_id(&id, "striped");
    cr_assert_eq(cfx__ctl_obj_put(p, &id, 64ull << 20, 1 << 19, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    /* two complete copies besides the putter's */
    struct cfx_ctl *copies[2] = { c1, c2 };
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(cfx__ctl_obj_lookup(copies[i], &id, NULL, 0, cfx__deadline_ns(CALL_MS),
                                         &src), CFX_OK);
        cr_assert_eq(src.nextra, 0, "a plain lookup asks for no extra source");
        cr_assert_eq(cfx__ctl_obj_done(copies[i], &id, src.node.node_id, 1,
                                       cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    /* a partial holder, fed by the putter: the putter is busy now */
    cr_assert_eq(cfx__ctl_obj_lookup(part, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                 CFX_OK);
    uint32_t busy = src.node.node_id;
    cr_assert(src.complete);

    cr_assert_eq(cfx__ctl_obj_lookup_sources(g, &id, NULL, 0, 7, cfx__deadline_ns(CALL_MS), &src),
                 CFX_OK);
    cr_assert(src.complete);
    uint32_t ids[3] = { cfx__ctl_node_id(p), cfx__ctl_node_id(c1), cfx__ctl_node_id(c2) };
    /* the primary and its extras: the three complete holders but the busy
     * one, each once; never the partial holder or the getter */
    cr_assert_eq(src.nextra, 1, "%u extras", src.nextra);
    cr_assert_neq(src.extra[0], src.node.node_id);
    cr_assert_neq(src.extra[0], busy, "a holder that uploads is no extra source");
    cr_assert_neq(src.extra[0], cfx__ctl_node_id(part));
    int named = 0;
    for (int i = 0; i < 3; i++)
        named += ids[i] == src.extra[0] || ids[i] == src.node.node_id;
    cr_assert_eq(named, 2);

    /* the directory counted the primary source's upload only */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(p, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 1);
    for (uint32_t i = 0; i < objs[0].nholders; i++) {
        const struct cfx_obj_holder *h = &objs[0].holders[i];
        uint32_t want = h->node_id == busy || h->node_id == src.node.node_id;
        cr_assert_eq(h->uploads, want, "node %u serves %u uploads", h->node_id, h->uploads);
    }
    free(objs);

    /* every complete holder busy now but the one extra: a getter sent to a
     * partial holder (fan-out reached) gets it alone */
    struct cfx_ctl_source src2;
    uint32_t ex[3] = { ids[0], ids[1], ids[2] };
    cr_assert_eq(cfx__ctl_obj_lookup_sources(g2, &id, ex, 3, 7, cfx__deadline_ns(CALL_MS), &src2),
                 CFX_OK);
    cr_assert(!src2.complete);
    cr_assert_eq(src2.nextra, 0, "a partial source comes alone");

    cfx__ctl_close(g2);
    cfx__ctl_close(g);
    cfx__ctl_close(part);
    cfx__ctl_close(c2);
    cfx__ctl_close(c1);
    cfx__ctl_close(p);
}

/*
 * A put sent again (CFX_PROTO_PUT_AGAIN) that replaces a stale record of
 * the putter's id (another member announced a copy of an earlier put under
 * it) is a new inline object: it counts against max_node_bytes as any put.
 * Before, the cap was looked at only while the stale record still stood,
 * so such a put stored any number of inline bytes.
 */
Test(coord_dir, put_again_over_a_stale_copy_counts_against_max_node_bytes)
{
    cfx__coord_stop(coord);
    caps.max_node_bytes = 100;
    start_coord();
    char text[CFX_PROTO_TEXT_MAX];
    static uint8_t data[4000];
    int a = raw_auth_role(CFX_CTL_ROLE_NODE), b = raw_auth_role(CFX_CTL_ROLE_NODE);
    int64_t aid = raw_join(a, 0, 1, NULL, 0);
    cr_assert_gt(aid, 0);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);

    struct cfx_msg m;
    memset(&m, 0, sizeof(m));
    m.type = CFX_MSG_OBJ_PUT;
    m.req_id = 2;
    memset(m.u.put.id.bytes, 0x77, sizeof(m.u.put.id.bytes));
    m.u.put.size = sizeof(data);
    m.u.put.chunk_size = 65536;
    m.u.put.copy = 1;
    m.u.put.putter = (uint32_t)aid;
    m.u.put.tag = 1;
    raw_send(b, &m);
    cr_assert_eq(raw_answer(b, 2, text, sizeof(text)), 0, "%s", text);

    m.req_id = 3;
    m.u.put.copy = 0;
    m.u.put.putter = 0;
    m.u.put.again = 1;
    m.u.put.tag = 2;
    m.u.put.has_data = 1;
    m.u.put.data = data;
    raw_send(a, &m);
    cr_assert_eq(raw_answer(a, 3, text, sizeof(text)), CFX_ERR_NO_RESOURCE,
                 "a put of %zu inline bytes over a stale copy was taken (max_node_bytes 100)",
                 sizeof(data));
    cr_assert(strstr(text, "max_node_bytes"), "%s", text);
    close(a);
    close(b);
}

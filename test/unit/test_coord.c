/* Coordinator + client: an in-process coordinator on 127.0.0.1 and clients. */
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
#include "control/ctl_seal.h"
#include "control/proto.h"
#include "dataplane/common/util.h"
#include "coord_fixture.h"
#include "testutil.h"

TestSuite(coord, .init = coord_fixture_setup, .fini = coord_fixture_teardown, .timeout = 60);

Test(coord, wrong_token_is_refused)
{
    struct cfx_ctl *c = NULL;
    int rc = open_node_tok("intruder", "not-the-token", NULL, &c);
    cr_assert_eq(rc, CFX_ERR_AUTH, "got %s", cfx_errname(rc));
    cr_assert_null(c);
    char want[128];
    snprintf(want, sizeof(want), "coordinator %s refused the cluster token", addr);
    cr_assert(strstr(cfx_last_error(), want), "detail: %s", cfx_last_error());
    cr_assert_null(strstr(cfx_last_error(), "not-the-token"));
    /* The coordinator is unharmed. */
    struct cfx_ctl *ok = open_node("good", NULL);
    cr_assert_eq(cfx__ctl_node_id(ok), 1);
    cfx__ctl_close(ok);
}

/* The role is under the client's MAC: a node's proof presented with the
 * admin role (or an admin's as a node) is refused, and the coordinator sends
 * no MAC of its own to a client whose proof failed, only the refusal.
 * (Before, the MAC covered the nonces only: the role byte could be changed
 * on the way.) */
Test(coord, proof_for_another_role_is_refused)
{
    static uint8_t buf[1 << 16];
    static const uint8_t roles[][2] = { { CFX_CTL_ROLE_NODE, CFX_CTL_ROLE_ADMIN },
                                        { CFX_CTL_ROLE_ADMIN, CFX_CTL_ROLE_NODE } };
    for (size_t i = 0; i < 2; i++) {
        struct cfx_msg m, r;
        uint8_t snonce[CFX_AUTH_NONCE_LEN];
        uint8_t made_for = roles[i][0];
        int s = raw_connect();
        cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
        memcpy(snonce, m.u.challenge.nonce, sizeof(snonce));
        memset(&r, 0, sizeof(r));
        r.type = CFX_MSG_AUTH;
        r.req_id = 1;
        r.u.auth.role = roles[i][1];
        cfx__auth_nonce(r.u.auth.nonce, sizeof(r.u.auth.nonce));
        uint8_t bind[CFX_CTL_BIND_LEN];
        cfx__ctl_auth_bind(made_for, CFX_SEAL_OFF, bind);
        cfx__auth_mac_bound(token, CFX_AUTH_CLIENT, snonce, r.u.auth.nonce, bind, sizeof(bind),
                            r.u.auth.mac);
        raw_send(s, &r);
        cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
        cr_assert_eq(m.type, CFX_MSG_ERROR, "role %u accepted with a proof for role %u",
                     roles[i][1], made_for);
        cr_assert_eq(m.u.error.status, CFX_ERR_AUTH);
        /* nothing after the refusal: the connection ends */
        cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_ERR_CONNECT);
        close(s);
    }
    /* the same proof for its own role is taken: not vacuous */
    close(raw_auth_role(CFX_CTL_ROLE_ADMIN));
    close(raw_auth_role(CFX_CTL_ROLE_NODE));
}

Test(coord, unreachable_coordinator)
{
    struct cfx_ctl *c = NULL;
    char dead[64];
    /* A port nobody listens on: bind, read the port, close. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    getsockname(s, (struct sockaddr *)&sa, &sl);
    close(s);
    snprintf(dead, sizeof(dead), "127.0.0.1:%u", ntohs(sa.sin_port));
    struct cfx_ctl_params p = {
        .coord = dead, .token = token, .role = CFX_CTL_ROLE_ADMIN, .timeout_ms = 2000,
    };
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_CONNECT);
    cr_assert(strstr(cfx_last_error(), dead), "%s", cfx_last_error());
    p.coord = "no-colon";
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_INVALID);
    p.coord = addr;
    p.token = NULL;
    cr_assert_eq(cfx__ctl_open(&p, &c), CFX_ERR_AUTH);
}

/* A call whose deadline had passed when it was made (rdmactl ps --timeout 0)
 * says it timed out after 0 ms, not after a wrapped-around number. */
Test(coord, call_with_a_past_deadline_says_0_ms)
{
    struct cfx_ctl *a = open_node("a", NULL);
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    make_id(&id, "missing");
    /* the coordinator answers a lookup with no time left at once (TIMEOUT,
     * "has no holder"); the client's own wait usually ends first: until it
     * does */
    bool mine = false;
    for (int i = 0; i < 1000 && !mine; i++) {
        int rc = cfx__ctl_obj_lookup(a, &id, NULL, 0, cfx__now_ns() - 1000000, &src);
        cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s: %s", cfx_errname(rc), cfx_last_error());
        mine = strstr(cfx_last_error(), "timed out after") != NULL;
    }
    cr_assert(mine, "the coordinator answered first 1000 times");
    cr_assert(strstr(cfx_last_error(), "timed out after 0 ms"), "%s", cfx_last_error());
    cfx__ctl_close(a);
}

Test(coord, lookup_of_missing_object_times_out_by_its_deadline)
{
    struct cfx_ctl *a = open_node("a", NULL);
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    make_id(&id, "missing");
    uint64_t t0 = cfx__now_ns();
    int rc = cfx__ctl_obj_lookup(a, &id, NULL, 0, cfx__deadline_ns(300), &src);
    uint64_t el = ms_since(t0);
    /* the lookup stays parked until an object comes, so only its own
     * deadline can end it: TIMEOUT, and not before that deadline (how long
     * after it depends on the machine's load and is not checked) */
    cr_assert_eq(rc, CFX_ERR_TIMEOUT, "got %s", cfx_errname(rc));
    cr_assert_geq(el, 295, "returned after %llu ms", (unsigned long long)el);
    cr_assert(strstr(cfx_last_error(), "lookup of object 6d697373696e67"), "%s",
              cfx_last_error());
    cr_assert(strstr(cfx_last_error(), addr), "%s", cfx_last_error());

    /* A deadline already past answers TIMEOUT without waiting. */
    rc = cfx__ctl_obj_lookup(a, &id, NULL, 0, cfx__now_ns(), &src);
    cr_assert_eq(rc, CFX_ERR_TIMEOUT);

    /* The connection is still fine afterwards (late replies are dropped). */
    usleep(100000);
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(a, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_alive, 1);
    cfx__ctl_close(a);
}

Test(coord, parked_lookup_is_satisfied_by_a_later_put)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct lookup_job j = { .ctl = a, .timeout_ms = CALL_MS };
    pthread_t t;
    make_id(&j.id, "later");
    cr_assert_eq(pthread_create(&t, NULL, lookup_thread, &j), 0);
    usleep(250000); /* time for the lookup to park first (not asserted: see below) */
    uint64_t put_ns = cfx__now_ns();
    cr_assert_eq(cfx__ctl_obj_put(b, &j.id, BIG, 65536, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    pthread_join(t, NULL);
    /* answered by the put (a parked lookup that is not satisfied runs
     * into its CALL_MS deadline), and not before it began: measured from
     * the put, since the lookup's thread may start late on a loaded host */
    cr_assert_eq(j.rc, CFX_OK, "lookup: %s", cfx_errname(j.rc));
    cr_assert_geq(j.end_ns, put_ns, "the lookup returned before the put");
    cr_assert_eq(j.src.is_inline, 0);
    cr_assert_eq(j.src.size, BIG);
    cr_assert_eq(j.src.chunk_size, 65536);
    cr_assert_eq(j.src.complete, 1);
    cr_assert_eq(j.src.node.node_id, cfx__ctl_node_id(b));
    cr_assert_str_eq(j.src.node.name, "b");
    cr_assert_eq(j.src.node.naddr, 1);

    /* a is now a partial holder pulling from b. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 2);
    cr_assert_eq(objs[0].holders[0].node_id, cfx__ctl_node_id(b));
    cr_assert_eq(objs[0].holders[0].complete, 1);
    cr_assert_eq(objs[0].holders[0].uploads, 1);
    cr_assert_eq(objs[0].holders[1].node_id, cfx__ctl_node_id(a));
    cr_assert_eq(objs[0].holders[1].complete, 0);
    free(objs);

    /* Done: a becomes complete, b's upload slot frees. */
    cr_assert_eq(cfx__ctl_obj_done(a, &j.id, cfx__ctl_node_id(b), 1, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(objs[0].holders[0].uploads, 0);
    cr_assert_eq(objs[0].holders[1].complete, 1);
    free(objs);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, inline_objects_round_trip)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct cfx_object_id big, empty;
    struct cfx_ctl_source src;
    uint8_t *data = malloc(CFX_OBJECT_INLINE_MAX);
    cfx_test_fill(data, CFX_OBJECT_INLINE_MAX, 99);
    make_id(&big, "inline-64k");
    make_id(&empty, "inline-0");

    cr_assert_eq(cfx__ctl_obj_put(a, &big, CFX_OBJECT_INLINE_MAX, 4096, data,
                                  cfx__deadline_ns(CALL_MS)), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(a, &empty, 0, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    free(data);

    cr_assert_eq(cfx__ctl_obj_lookup(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(src.size, CFX_OBJECT_INLINE_MAX);
    cr_assert_eq(src.chunk_size, 4096);
    cr_assert_not_null(src.data);
    cr_assert_eq(cfx_test_check(src.data, CFX_OBJECT_INLINE_MAX, 99), (size_t)-1);
    free(src.data);

    cr_assert_eq(cfx__ctl_obj_lookup(b, &empty, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(src.size, 0);
    cr_assert_null(src.data);

    /* A small object put without its bytes stays on the data plane. */
    struct cfx_object_id small;
    make_id(&small, "small-nodata");
    cr_assert_eq(cfx__ctl_obj_put(a, &small, 10, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK,
                 "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_lookup(b, &small, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 0);
    cr_assert_null(src.data);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(a));
    cr_assert_eq(cfx__ctl_obj_done(b, &small, src.node.node_id, 0, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);
    /* Bytes over the inline limit cannot travel through the coordinator. */
    struct cfx_object_id toobig;
    uint8_t one = 1;
    make_id(&toobig, "too-big-inline");
    cr_assert_eq(cfx__ctl_obj_put(a, &toobig, CFX_OBJECT_INLINE_MAX + 1, 0, &one,
                                  cfx__deadline_ns(CALL_MS)), CFX_ERR_TOO_BIG);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(a, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.objects, 3);
    cr_assert_eq(st.inline_bytes, CFX_OBJECT_INLINE_MAX);

    /* The putter leaves: objects another node got all of stay (b's copies of
     * the inline ones), the one nobody else has goes.  The goodbye travels
     * on a's connection, so wait for it to be handled. */
    cfx__ctl_close(a);
    uint64_t deadline = cfx__deadline_ns(CALL_MS);
    do {
        cr_assert_eq(cfx__ctl_status(b, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    } while (st.objects != 2 && cfx__now_ns() < deadline && !usleep(5000));
    cr_assert_eq(st.objects, 2, "small-nodata outlived its putter, its only holder");
    cr_assert_eq(cfx__ctl_obj_lookup(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.is_inline, 1);
    cr_assert_eq(cfx_test_check(src.data, CFX_OBJECT_INLINE_MAX, 99), (size_t)-1);
    free(src.data);
    /* and go with b's copies: inline bytes are no copy of their own */
    cr_assert_eq(cfx__ctl_obj_delete(b, &big, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_delete(b, &empty, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_status(b, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.objects, 0);
    cr_assert_eq(st.inline_bytes, 0);
    cr_assert_eq(cfx__ctl_obj_lookup_now(b, &big, NULL, 0, cfx__deadline_ns(CALL_MS), &src),
                 CFX_ERR_TIMEOUT);
    cfx__ctl_close(b);
}

Test(coord, put_conflicts_and_delete)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL),
                   *c = open_node("c", NULL);
    struct cfx_object_id id;
    make_id(&id, "conflict");
    uint64_t dl = cfx__deadline_ns(CALL_MS);

    char want[64];
    snprintf(want, sizeof(want), "node %u put it", cfx__ctl_node_id(a));
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 1024, NULL, dl), CFX_OK);
    /* An id names one object until its putter deletes it or leaves: a
     * second put fails, whoever sends it and whatever its size. */
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG + 1, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG, 1024, NULL, dl), CFX_ERR_EXISTS);
    cr_assert(strstr(cfx_last_error(), want), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_delete(c, &id, dl), CFX_ERR_NOT_FOUND);

    /* b gets a copy; a lookup with an exclude list skips the excluded holder. */
    struct cfx_ctl_source src;
    cr_assert_eq(cfx__ctl_obj_lookup(b, &id, NULL, 0, dl, &src), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_done(b, &id, src.node.node_id, 1, dl), CFX_OK);
    uint32_t ex = cfx__ctl_node_id(a);
    cr_assert_eq(cfx__ctl_obj_lookup(c, &id, &ex, 1, dl, &src), CFX_OK);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(b));

    /* Another holder's delete withdraws its own copy only. */
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_obj_delete(b, &id, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 2, "the putter and c's partial copy");
    free(objs);

    /* The putter's delete withdraws the object with every copy's record
     * (c's partial one too): c's transfer ending does not bring it back,
     * and the id is free for a new put at once. */
    cr_assert_eq(cfx__ctl_obj_delete(a, &id, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_delete(a, &id, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_delete(c, &id, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 0, "object deleted by its putter still listed");
    free(objs);
    cr_assert_eq(cfx__ctl_obj_done(c, &id, cfx__ctl_node_id(b), 1, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG + 1, 1024, NULL, dl), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_done(c, &id, ex, 1, dl), CFX_ERR_NOT_FOUND,
                 "a copy of the deleted object counted as a copy of the new one");
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, dl), CFX_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(objs[0].nholders, 1);
    cr_assert_eq(objs[0].size, BIG + 1);
    free(objs);
    cfx__ctl_close(c);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

/*
 * A delete from a node that found no copy of the id in its store carries
 * its next store sequence: a put of the id by that node tagged at or after
 * it began after the delete looked, and is not the delete's to take.  (It
 * took it: the put's entry stayed on its node answering that node's gets
 * with the old bytes after the directory let another node put the id.)
 * Without the bound, or below it, the putter's delete withdraws as ever.
 */
Test(coord, delete_without_a_copy_takes_no_later_put)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct cfx_object_id id;
    make_id(&id, "later-put");
    uint64_t dl = cfx__deadline_ns(CALL_MS);

    cr_assert_eq(cfx__ctl_obj_put_own(a, &id, BIG, 1024, NULL, 7, dl), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_delete_before(a, &id, 7, dl), CFX_ERR_NOT_FOUND);
    cr_assert(strstr(cfx_last_error(), "began after"), "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG, 1024, NULL, dl), CFX_ERR_EXISTS,
                 "the later put stays");
    cr_assert_eq(cfx__ctl_obj_delete_before(a, &id, 8, dl), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx__ctl_obj_put(b, &id, BIG, 1024, NULL, dl), CFX_OK, "%s",
                 cfx_last_error());
    /* a bound concerns the sender's own puts only */
    cr_assert_eq(cfx__ctl_obj_delete_before(a, &id, 1, dl), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx__ctl_obj_delete_before(b, &id, 1, dl), CFX_OK, "%s", cfx_last_error());
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

/*
 * A node in a child process: joins, puts an object, reports its id on a pipe,
 * waits to be killed or stopped.  The child execs a fresh image of this
 * binary (the constructor below runs the node) instead of going on after
 * fork(): this process has threads (the coordinator, clients), and a child
 * that allocates after a fork taken while one of them held an allocator lock
 * (ASan's, for one) deadlocks.
 */
#define CHILD_ENV "CFX_TEST_COORD_CHILD"

__attribute__((constructor)) static void child_node_main(void)
{
    const char *spec = getenv(CHILD_ENV);   /* "FD ADDR TOKEN" */
    int fd;
    char a[64], tok[64];
    if (!spec || sscanf(spec, "%d %63s %63s", &fd, a, tok) != 3)
        return;
    snprintf(addr, sizeof(addr), "%s", a);
    struct cfx_ctl *c = NULL;
    struct cfx_object_id id;
    uint32_t nid = 0;
    if (open_node_tok("child", tok, NULL, &c) == CFX_OK) {
        make_id(&id, "child-object");
        if (cfx__ctl_obj_put(c, &id, BIG, 4096, NULL, cfx__deadline_ns(CALL_MS)) == CFX_OK)
            nid = cfx__ctl_node_id(c);
    }
    if (write(fd, &nid, sizeof(nid)) != sizeof(nid))
        _exit(1);
    for (;;)
        pause();
}

static pid_t spawn_child_node(uint32_t *id_out)
{
    int fds[2];
    char spec[192], exe[512];
    cr_assert_eq(pipe(fds), 0);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert_gt(n, 0);
    exe[n] = '\0';
    snprintf(spec, sizeof(spec), "%d %s %s", fds[1], addr, token);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        setenv(CHILD_ENV, spec, 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    uint32_t nid = 0;
    struct pollfd pfd = { .fd = fds[0], .events = POLLIN };
    if (poll(&pfd, 1, 10000) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("child node %d did not report within 10 s", (int)pid);
    }
    cr_assert_eq(read(fds[0], &nid, sizeof(nid)), (ssize_t)sizeof(nid));
    close(fds[0]);
    cr_assert_neq(nid, 0, "child could not join");
    *id_out = nid;
    return pid;
}

static void assert_node_dead_and_gone(struct cfx_ctl *c, uint32_t id)
{
    struct cfx_node_rec *nodes;
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_nodes(c, &nodes, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].node_id == id) {
            found = 1;
            cr_assert_eq(nodes[i].alive, 0, "node %u still alive", id);
        }
    cr_assert(found);
    free(nodes);
    cr_assert_eq(cfx__ctl_objects(c, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (size_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < objs[i].nholders; j++)
            cr_assert_neq(objs[i].holders[j].node_id, id, "dead node %u still a holder", id);
    struct cfx_object_id cid;
    make_id(&cid, "child-object");
    cr_assert_null(find_obj(objs, n, &cid), "the dead node's object is still listed");
    free(objs);
}

Test(coord, killed_node_is_reported_dead)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d);
    uint32_t child;
    pid_t pid = spawn_child_node(&child);

    /* A lookup parked by the watcher must not be served by the dead node. */
    uint64_t t0 = cfx__now_ns();
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t t = wait_dead(&d, child, CALL_MS);
    cr_assert_neq(t, 0, "no node_dead event for node %u within %d ms", child, CALL_MS);
    cr_log_info("killed node reported dead after %llu ms",
                (unsigned long long)((t - t0) / 1000000ull));
    assert_node_dead_and_gone(w, child);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(w, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_alive, 1);
    cr_assert_eq(st.nodes_dead, 1);
    cr_assert_eq(st.objects, 0);
    cfx__ctl_close(w);
}

Test(coord, silent_node_is_reported_dead_after_missed_heartbeats)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d);
    uint32_t child;
    pid_t pid = spawn_child_node(&child);

    /* Stopped, not killed: the socket stays open, only heartbeats stop.
     * How long ago the coordinator last heard from it is read first (its
     * heartbeats may have come late on a loaded machine): it is dead no
     * sooner than dead_after past that, so no sooner than DEAD_MS - seen
     * after t0 (a ms of each figure's rounding aside). */
    uint64_t t0 = cfx__now_ns();
    struct cfx_node_rec *nodes;
    size_t n;
    uint32_t seen = UINT32_MAX;
    cr_assert_eq(cfx__ctl_nodes(w, &nodes, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    for (size_t i = 0; i < n; i++)
        if (nodes[i].node_id == child)
            seen = nodes[i].last_seen_ms;
    free(nodes);
    cr_assert_neq(seen, UINT32_MAX, "node %u is not listed", child);
    kill(pid, SIGSTOP);
    uint64_t t = wait_dead(&d, child, CALL_MS);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_neq(t, 0, "no node_dead event for the silent node %u", child);
    uint64_t el = (t - t0) / 1000000ull;
    /* by missed heartbeats: not before dead_after (a loaded machine may be later) */
    cr_assert_geq(el + seen + 2, DEAD_MS, "declared dead %llu ms after a stop %u ms into "
                  "its silence", (unsigned long long)el, seen);
    cr_log_info("silent node reported dead after %llu ms", (unsigned long long)el);
    assert_node_dead_and_gone(w, child);
    cfx__ctl_close(w);
}

Test(coord, leaving_node_is_not_a_death_and_calls_fail_after_coordinator_loss)
{
    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d), *x = open_node("leaver", NULL);
    uint32_t xid = cfx__ctl_node_id(x);
    cfx__ctl_close(x);
    /* a goodbye is not a failure: members are not told it died (but the
     * coordinator no longer lists it as alive) */
    cr_assert_eq(wait_dead(&d, xid, 700), 0, "a node that left was reported dead");
    struct cfx_node_rec *nodes;
    size_t nn;
    cr_assert_eq(cfx__ctl_nodes(w, &nodes, &nn, cfx__deadline_ns(CALL_MS)), CFX_OK);
    bool alive = false;
    for (size_t i = 0; i < nn; i++)
        if (nodes[i].node_id == xid && nodes[i].alive)
            alive = true;
    free(nodes);
    cr_assert(!alive, "the node that left is still listed alive");

    /* Now the coordinator goes away: the watcher hears node 0 and keeps
     * reconnecting; a call waits for that until its deadline, no longer,
     * and then says the coordinator is unreachable (CFX_ERR_CONNECT, not a
     * plain timeout: callers tell the two apart). */
    cfx__coord_stop(coord);
    coord = NULL;
    cr_assert_neq(wait_dead(&d, 0, CALL_MS), 0, "no coordinator-lost notification");
    struct cfx_ctl_status st;
    uint64_t t0 = cfx__now_ns();
    cr_assert_eq(cfx__ctl_status(w, &st, cfx__deadline_ns(300)), CFX_ERR_CONNECT);
    cr_assert_geq(ms_since(t0), 250);
    cr_assert(strstr(cfx_last_error(), addr), "%s", cfx_last_error());
    /* a deadline already past when the call starts (a late step of a
     * longer call): the error says 0 ms, not 2^64 ns in ms */
    cr_assert_eq(cfx__ctl_status(w, &st, cfx__now_ns() - 1000000), CFX_ERR_CONNECT);
    cr_assert(strstr(cfx_last_error(), "within the call's 0 ms"), "%s", cfx_last_error());
    cfx__ctl_close(w); /* returns in the middle of reconnecting (the suite's timeout ends a hang) */
}

/* ------------------------------------------------------------------------ */
/* Raw sockets                                                               */

/* The coordinator again, with a state directory in @p dir (a mkdtemp
 * template) on a disk whose every fsync is @p delay_ms slower. */
static void coord_on_slow_disk(char *dir, uint32_t delay_ms)
{
    cr_assert_not_null(mkdtemp(dir));
    cfx__coord_stop(coord);
    caps.state_dir = dir;
    caps.test_fsync_delay_ms = delay_ms;
    start_coord();
}

static void coord_off_slow_disk(const char *dir)
{
    cfx__coord_stop(coord);
    coord = NULL;
    rm_state_dir(dir);
}

/* A durable put of zero bytes, object @p fill repeated. */
static void durable_put_msg(struct cfx_msg *r, uint64_t req, uint8_t fill)
{
    memset(r, 0, sizeof(*r));
    r->type = CFX_MSG_OBJ_PUT;
    r->req_id = req;
    memset(r->u.put.id.bytes, fill, sizeof(r->u.put.id.bytes));
    r->u.put.has_data = 1;
    r->u.put.durable = 1;
}

/*
 * Durable zero-byte puts on a slow disk (each fsync made @p delay_ms slower)
 * sent by one client in one write while four members heartbeat: none of
 * them is declared dead, checked by membership (STATUS after the puts: five
 * alive, none dead) and by the node_dead events the members got (none).
 */
static void durable_puts_while_members_beat(uint32_t delay_ms, int puts)
{
    char dir[] = "/tmp/cfx-coord-state-XXXXXX";
    coord_on_slow_disk(dir, delay_ms);

    struct deaths d[4];
    struct cfx_ctl *n[4];
    for (int i = 0; i < 4; i++) {
        char name[24];
        snprintf(name, sizeof(name), "beater%d", i);
        deaths_init(&d[i]);
        n[i] = open_node(name, &d[i]);
    }
    int s = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(s, 0, 1, NULL, 0), 0);
    static uint8_t frames[16][1024];
    uint8_t all[16 * 1024];
    size_t total = 0;
    cr_assert_leq(puts, 16);
    for (int k = 0; k < puts; k++) {
        struct cfx_msg r;
        size_t len;
        durable_put_msg(&r, 100 + (uint64_t)k, (uint8_t)(0x40 + k));
        r.u.put.data = frames[k];
        cr_assert_eq(cfx__msg_encode(&r, frames[k], sizeof(frames[k]), &len), CFX_OK);
        memcpy(all + total, frames[k], len);
        total += len;
    }
    cr_assert_eq(send(s, all, total, MSG_NOSIGNAL), (ssize_t)total);
    char text[CFX_PROTO_TEXT_MAX];
    for (int k = 0; k < puts; k++)
        cr_assert_eq(raw_answer(s, 100 + (uint64_t)k, text, sizeof(text)), 0, "%s", text);
    /* two more round trips: a tick has run since the last put */
    struct cfx_ctl_status st = raw_status(s, 200);
    st = raw_status(s, 201);
    cr_assert_eq(st.nodes_dead, 0, "%u members declared dead", st.nodes_dead);
    cr_assert_eq(st.nodes_alive, 5);
    for (int i = 0; i < 4; i++) {
        pthread_mutex_lock(&d[i].mu);
        cr_assert_eq(d[i].n, 0, "beater%d heard of %d deaths", i, d[i].n);
        pthread_mutex_unlock(&d[i].mu);
        cfx__ctl_close(n[i]);
    }
    close(s);
    coord_off_slow_disk(dir);
}

/*
 * Ten puts at 300 ms each (two fsyncs, 150 ms slower): three seconds of disk
 * work, five times dead_after_ms.  The coordinator takes at most one disk
 * write per connection per loop iteration, so the members' beats are read
 * in between.  Before the fix the ten went back to back and the first tick
 * after declared all four members dead.
 */
Test(coord, durable_puts_on_a_slow_disk_kill_no_member, .timeout = 120)
{
    durable_puts_while_members_beat(150, 10);
}

/*
 * One durable put that holds the loop longer than dead_after_ms (two
 * fsyncs, 500 ms slower each): the tick after it credits the members with
 * the time the loop could not read.  Before the fix all four were declared
 * dead.
 */
Test(coord, one_stall_longer_than_dead_after_kills_no_member, .timeout = 120)
{
    durable_puts_while_members_beat(500, 2);
}

/*
 * A member that says goodbye and then resets its connection left; it did not
 * die.  (A process that closes a socket with unread events in it sends a
 * reset, not a FIN: the client library does so whenever an event reaches it
 * as it closes.)  A durable put on a slow disk holds the loop while member B
 * says goodbye and then member A says goodbye and resets: the loop takes B's
 * goodbye first and sends A the event for it, and that send fails on the
 * reset.  Before, the failed send closed A's connection with its goodbye
 * unread, and every member was told that A had died.
 */
Test(coord, goodbye_then_reset_is_not_a_death)
{
    char dir[] = "/tmp/cfx-coord-state-XXXXXX";
    coord_on_slow_disk(dir, 100);

    struct deaths d;
    deaths_init(&d);
    struct cfx_ctl *w = open_node("watcher", &d);
    int p = raw_auth_role(CFX_CTL_ROLE_NODE), b = raw_auth_role(CFX_CTL_ROLE_NODE),
        a = raw_auth_role(CFX_CTL_ROLE_NODE);
    cr_assert_gt(raw_join(b, 0, 1, NULL, 0), 0);
    int64_t aid = raw_join(a, 0, 1, NULL, 0);
    cr_assert_gt(aid, 0);
    cr_assert_gt(raw_join(p, 0, 1, NULL, 0), 0); /* last: no event about the others' joins */

    struct cfx_msg put;
    durable_put_msg(&put, 7, 0x5a);
    raw_send(p, &put);
    raw_leave(b);
    raw_leave(a);
    struct linger reset = { .l_onoff = 1, .l_linger = 0 };
    cr_assert_eq(setsockopt(a, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)), 0);
    close(a);
    char text[CFX_PROTO_TEXT_MAX];
    cr_assert_eq(raw_answer(p, 7, text, sizeof(text)), 0, "%s", text);

    int heard = wait_heard(&d, (uint32_t)aid, CALL_MS);
    cr_assert_eq(heard, HEARD_LEFT, "the watcher heard %s of node %lld",
                 heard == HEARD_DEAD ? "the death" : "nothing", (long long)aid);
    pthread_mutex_lock(&d.mu);
    cr_assert_eq(d.n, 0, "the watcher was told of %d deaths", d.n);
    pthread_mutex_unlock(&d.mu);

    cfx__ctl_close(w);
    close(b);
    close(p);
    coord_off_slow_disk(dir);
}

/* A state directory another user could write is refused, and so is a
 * symbolic link to one (before: both were used). */
Test(coord, unsafe_state_dir_is_refused)
{
    char dir[] = "/tmp/cfx-coord-state-XXXXXX", link[64];
    struct cfx_coord *co = NULL;
    cr_assert_not_null(mkdtemp(dir));
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .token = token, .state_dir = dir };
    cr_assert_eq(chmod(dir, 0777), 0);
    cr_assert_eq(cfx__coord_start(&p, &co), CFX_ERR_AUTH);
    cr_assert(strstr(cfx_last_error(), "writable by others"), "%s", cfx_last_error());
    cr_assert_eq(chmod(dir, 0700), 0);
    snprintf(link, sizeof(link), "%s.link", dir);
    cr_assert_eq(symlink(dir, link), 0);
    p.state_dir = link;
    cr_assert_neq(cfx__coord_start(&p, &co), CFX_OK);
    cr_assert(strstr(cfx_last_error(), "symbolic link"), "%s", cfx_last_error());
    /* a file is no directory, and no link either */
    char file[80];
    snprintf(file, sizeof(file), "%s/file", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    p.state_dir = file;
    cr_assert_neq(cfx__coord_start(&p, &co), CFX_OK);
    cr_assert(strstr(cfx_last_error(), "Not a directory") &&
              !strstr(cfx_last_error(), "symbolic link"), "%s", cfx_last_error());
    unlink(file);
    p.state_dir = dir;
    cr_assert_eq(cfx__coord_start(&p, &co), CFX_OK, "%s", cfx_last_error());
    cfx__coord_stop(co);
    unlink(link);
    rm_state_dir(dir);
}

Test(coord, garbage_and_half_frames_do_not_disturb_good_clients)
{
    struct cfx_ctl *a = open_node("a", NULL), *b = open_node("b", NULL);
    struct cfx_object_id id;
    struct cfx_ctl_source src;
    uint8_t junk[4096];
    make_id(&id, "robust");

    /* 1. Garbage instead of AUTH: closed at once. */
    int g = raw_connect();
    cfx_test_fill(junk, sizeof(junk), 5);
    send(g, junk, sizeof(junk), MSG_NOSIGNAL);
    cr_assert_geq(wait_closed(g, CALL_MS), 0, "garbage connection not closed");
    close(g);

    /* 2. Half a header, never authenticated: closed at the auth deadline. */
    int h = raw_connect();
    send(h, junk, 8, MSG_NOSIGNAL);
    /* 3. Authenticated, then half a frame: closed when stalled. */
    int s = raw_auth();
    struct cfx_msg st = { .type = CFX_MSG_STATUS, .req_id = 9 };
    uint8_t fb[64] = { 0 };
    size_t flen;
    cr_assert_eq(cfx__msg_encode(&st, fb, sizeof(fb), &flen), CFX_OK);
    fb[4] = 100; /* announce 100 payload bytes, send 3 */
    send(s, fb, flen + 3, MSG_NOSIGNAL);

    /* Meanwhile good clients are served normally. */
    cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 4096, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_lookup(b, &id, NULL, 0, cfx__deadline_ns(CALL_MS), &src), CFX_OK);
    cr_assert_eq(src.node.node_id, cfx__ctl_node_id(a));

    long th = wait_closed(h, CALL_MS);
    cr_assert_geq(th, 0, "unauthenticated connection not closed");
    long ts = wait_closed(s, CALL_MS);
    cr_assert_geq(ts, 0, "stalled connection not closed");
    close(h);
    close(s);

    /* 4. A bad payload inside a valid frame gets an error reply; the connection lives. */
    static uint8_t buf[1 << 16];
    struct cfx_msg m;
    s = raw_auth();
    struct cfx_msg bad = { .type = CFX_MSG_NODE_GET, .req_id = 77 };
    cr_assert_eq(cfx__msg_encode(&bad, fb, sizeof(fb), &flen), CFX_OK);
    fb[4] = 5; /* 5 payload bytes where 4 belong */
    fb[flen] = 0;
    send(s, fb, flen + 1, MSG_NOSIGNAL);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.req_id, 77);
    cr_assert_eq(m.u.error.status, CFX_ERR_PROTO);
    raw_send(s, &st);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_STATUS_REPLY);
    cr_assert_eq(m.req_id, 9);
    cr_assert_eq(m.u.status.nodes_alive, 2);
    /* Object calls from a non-member are refused with a reason. */
    struct cfx_msg del = { .type = CFX_MSG_OBJ_DELETE, .req_id = 78 };
    raw_send(s, &del);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.u.error.status, CFX_ERR_INVALID);
    cr_assert_gt(strlen(m.u.error.text), 0);
    close(s);

    /* 5. A wrong protocol version is refused with CFX_ERR_VERSION, then closed. */
    s = raw_connect();
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_CHALLENGE);
    cr_assert_eq(cfx__msg_encode(&st, fb, sizeof(fb), &flen), CFX_OK);
    fb[2] = CFX_PROTO_VERSION + 1;
    send(s, fb, flen, MSG_NOSIGNAL);
    cr_assert_eq(raw_read_frame(s, buf, sizeof(buf), &m), CFX_OK);
    cr_assert_eq(m.type, CFX_MSG_ERROR);
    cr_assert_eq(m.u.error.status, CFX_ERR_VERSION);
    cr_assert_geq(wait_closed(s, CALL_MS), 0);
    close(s);

    struct cfx_ctl_status cs;
    cr_assert_eq(cfx__ctl_status(a, &cs, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cs.nodes_alive, 2);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, admin_queries)
{
    struct cfx_ctl *a = open_node("alpha", NULL), *b = open_node("beta", NULL);
    struct cfx_ctl *adm = open_admin();
    struct cfx_object_id id1, id2;
    uint8_t small[100];
    make_id(&id1, "obj-one");
    make_id(&id2, "obj-two");
    cfx_test_fill(small, sizeof(small), 1);
    cr_assert_eq(cfx__ctl_obj_put(a, &id1, BIG, 8192, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(cfx__ctl_obj_put(b, &id2, sizeof(small), 0, small, cfx__deadline_ns(CALL_MS)),
                 CFX_OK);

    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(adm, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.proto_version, CFX_PROTO_VERSION);
    cr_assert_eq(st.nodes_alive, 2);
    cr_assert_eq(st.nodes_dead, 0);
    cr_assert_eq(st.objects, 2);
    cr_assert_eq(st.inline_bytes, sizeof(small));
    cr_assert_eq(st.heartbeat_ms, HB_MS);
    cr_assert_eq(st.dead_after_ms, DEAD_MS);
    cr_assert_gt(strlen(st.version), 0);

    struct cfx_node_rec *nodes;
    size_t n;
    cr_assert_eq(cfx__ctl_nodes(adm, &nodes, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 2, "admin connections are not members");
    cr_assert_str_eq(nodes[0].name, "alpha");
    cr_assert_str_eq(nodes[1].name, "beta");
    cr_assert_eq(nodes[0].alive, 1);
    /* an age, not a date: at most the coordinator's uptime when asked after
     * it (the status above was taken before: on a loaded machine a node
     * silent since it joined was older than that uptime by now) */
    struct cfx_ctl_status later;
    cr_assert_eq(cfx__ctl_status(adm, &later, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_leq(nodes[0].last_seen_ms, later.uptime_ms);
    free(nodes);

    struct cfx_ctl_obj_rec *objs;
    cr_assert_eq(cfx__ctl_objects(adm, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 2);
    const struct cfx_ctl_obj_rec *o1 = find_obj(objs, n, &id1), *o2 = find_obj(objs, n, &id2);
    cr_assert_not_null(o1);
    cr_assert_not_null(o2);
    cr_assert_eq(o1->size, BIG);
    cr_assert_eq(o1->chunk_size, 8192);
    cr_assert_eq(o1->is_inline, 0);
    cr_assert_eq(o1->nholders, 1);
    cr_assert_eq(o1->holders[0].node_id, cfx__ctl_node_id(a));
    cr_assert_eq(o2->is_inline, 1);
    cr_assert_eq(o2->size, sizeof(small));
    free(objs);

    /* Admin clients cannot use member calls. */
    cr_assert_eq(cfx__ctl_obj_put(adm, &id1, BIG, 0, NULL, cfx__deadline_ns(CALL_MS)),
                 CFX_ERR_INVALID);
    cfx__ctl_close(adm);
    cfx__ctl_close(b);
    cfx__ctl_close(a);
}

Test(coord, listings_paginate)
{
    enum { NOBJ = CFX_PROTO_OBJECTS_PAGE + 100 };
    struct cfx_ctl *a = open_node("a", NULL);
    for (uint32_t i = 0; i < NOBJ; i++) {
        struct cfx_object_id id;
        memset(&id, 0, sizeof(id));
        memcpy(id.bytes, &i, sizeof(i));
        id.bytes[19] = 0xee;
        cr_assert_eq(cfx__ctl_obj_put(a, &id, BIG, 0, NULL, cfx__deadline_ns(CALL_MS)), CFX_OK);
    }
    struct cfx_ctl_obj_rec *objs;
    size_t n;
    cr_assert_eq(cfx__ctl_objects(a, &objs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, NOBJ);
    for (uint32_t i = 0; i < NOBJ; i++) {
        uint32_t v;
        memcpy(&v, objs[i].id.bytes, sizeof(v));
        cr_assert_eq(v, i, "object %u out of order", i);
    }
    free(objs);
    cfx__ctl_close(a);
}

/* The record of @p id in a fresh listing, or NULL (*recs to free). */
static const struct cfx_node_rec *listed(struct cfx_ctl *adm, uint32_t id,
                                         struct cfx_node_rec **recs)
{
    size_t n = 0;
    *recs = NULL;
    cr_assert_eq(cfx__ctl_nodes(adm, recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK, "%s",
                 cfx_last_error());
    for (size_t i = 0; i < n; i++)
        if ((*recs)[i].node_id == id)
            return &(*recs)[i];
    return NULL;
}

/* Dead members are listed for dead_keep_ms after death (a node that left
 * says so), then forgotten; live ones stay.  Node records carry the host
 * name and the observer flag the member gave; admin connections are no
 * members at all. */
Test(coord, dead_nodes_are_forgotten_after_dead_keep_ms)
{
    cfx__coord_stop(coord);
    dead_keep_ms = 400;
    start_coord();

    struct cfx_ctl *stays = open_node("stays", NULL), *leaves = open_node("leaves", NULL);
    struct cfx_ctl *adm = open_admin();
    uint32_t id_stays = cfx__ctl_node_id(stays), id_leaves = cfx__ctl_node_id(leaves), id_killed;
    pid_t pid = spawn_child_node(&id_killed);

    /* an observer says so in its record */
    struct cfx_node_rec self;
    memset(&self, 0, sizeof(self));
    snprintf(self.name, sizeof(self.name), "tool");
    snprintf(self.host, sizeof(self.host), "tool-host");
    self.flags = CFX_NODE_F_OBSERVER | CFX_NODE_F_LEFT; /* LEFT is the coordinator's to say */
    struct cfx_ctl_params op = { .coord = addr, .token = token, .role = CFX_CTL_ROLE_NODE,
                                 .self = &self, .timeout_ms = CALL_MS };
    struct cfx_ctl *obs = NULL;
    cr_assert_eq(cfx__ctl_open(&op, &obs), CFX_OK, "%s", cfx_last_error());

    struct cfx_node_rec *recs;
    size_t n = 0;
    cr_assert_eq(cfx__ctl_nodes(adm, &recs, &n, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(n, 4, "members only, not the admin connection: %zu", n);
    free(recs);
    const struct cfx_node_rec *r = listed(adm, id_stays, &recs);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->host, "host-of-stays");
    cr_assert_eq(r->flags, 0);
    free(recs);
    r = listed(adm, cfx__ctl_node_id(obs), &recs);
    cr_assert_not_null(r);
    cr_assert_str_eq(r->host, "tool-host");
    cr_assert_eq(r->flags, CFX_NODE_F_OBSERVER);
    free(recs);

    /* one leaves in good order, one is killed */
    cfx__ctl_close(leaves);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    /* until both are forgotten: the deadline only ends a hang */
    uint64_t t0 = cfx__now_ns();
    bool left_gone = false, killed_gone = false;
    while (ms_since(t0) < CALL_MS && !(left_gone && killed_gone)) {
        r = listed(adm, id_leaves, &recs);
        if (r && !r->alive)
            cr_assert(r->flags & CFX_NODE_F_LEFT, "a node that left is marked so");
        left_gone = !r;
        free(recs);
        r = listed(adm, id_killed, &recs);
        if (r && !r->alive)
            cr_assert(!(r->flags & CFX_NODE_F_LEFT), "a killed node did not leave");
        killed_gone = !r;
        free(recs);
        poll(NULL, 0, 20);
    }
    cr_assert(left_gone, "node %u is still listed %llu ms after it left (dead_keep_ms %u)",
              id_leaves, (unsigned long long)ms_since(t0), dead_keep_ms);
    cr_assert(killed_gone, "node %u is still listed %llu ms after it was killed",
              id_killed, (unsigned long long)ms_since(t0));
    struct cfx_node_rec one;
    cr_assert_eq(cfx__ctl_node_get(adm, id_leaves, &one, cfx__deadline_ns(CALL_MS)),
                 CFX_ERR_NOT_FOUND);
    r = listed(adm, id_stays, &recs);
    cr_assert(r && r->alive, "a live member is never forgotten");
    free(recs);
    struct cfx_ctl_status st;
    cr_assert_eq(cfx__ctl_status(adm, &st, cfx__deadline_ns(CALL_MS)), CFX_OK);
    cr_assert_eq(st.nodes_dead, 0, "forgotten nodes are not counted as dead");
    cr_assert_eq(st.nodes_alive, 2);

    cfx__ctl_close(obs);
    cfx__ctl_close(adm);
    cfx__ctl_close(stays);
    dead_keep_ms = 0;
}


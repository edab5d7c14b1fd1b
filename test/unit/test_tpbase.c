/*
 * The transport base (dataplane/tpbase): the completion queue's overflow
 * rule (nothing lost, order kept, a loss past the cap reported), the slot
 * table's generations and the graveyard, and the socket buffers taken from
 * the environment.  Pure logic and one unconnected socket: no transport.
 */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dataplane/common/log.h"
#include "dataplane/tpbase/tpbase.h"

TestSuite(tp_cq);
TestSuite(tp_table);
TestSuite(tp_graveyard);

static struct cfx_tp_ep ep_a, ep_b;

static void push_seq(struct cfx__tp_cq *cq, const struct cfx_tp_ep *ep, uint64_t seq)
{
    struct cfx_tp_completion *c = cfx__tp_cq_push(cq);
    cr_assert_eq(c->type, 0, "a pushed completion comes zeroed");
    c->type = CFX_TP_COMP_SEND;
    c->ep = (struct cfx_tp_ep *)ep;
    c->wr_id = seq;
}

static int pop_into(struct cfx__tp_cq *cq, uint64_t *out, int max)
{
    struct cfx_tp_completion *c;
    int n = 0;
    while (n < max && (c = cfx__tp_cq_head(cq))) {
        out[n++] = c->wr_id;
        cfx__tp_cq_pop(cq);
    }
    return n;
}

Test(tp_cq, overflow_loses_nothing_and_keeps_order)
{
    struct cfx__tp_cq cq;
    cr_assert_eq(cfx__tp_cq_init(&cq, 4, "test iface"), CFX_OK);

    /* Far more than the ring holds, drained in uneven bites between
     * bursts of pushes: every completion comes out once, in push order. */
    uint64_t next_push = 0, next_pop = 0, got[64];
    bool saw_backlog = false;
    for (int round = 0; round < 200; round++) {
        int burst = 1 + (round * 7) % 37;
        for (int i = 0; i < burst; i++)
            push_seq(&cq, &ep_a, next_push++);
        saw_backlog |= cfx__tp_cq_backlogged(&cq);
        cr_assert_eq(cfx__tp_cq_count(&cq), next_push - next_pop);
        int n = pop_into(&cq, got, 1 + (round * 5) % 29);
        for (int i = 0; i < n; i++)
            cr_assert_eq(got[i], next_pop + (uint64_t)i, "completion %llu came out as %llu",
                         (unsigned long long)(next_pop + (uint64_t)i),
                         (unsigned long long)got[i]);
        next_pop += (uint64_t)n;
    }
    int n;
    while ((n = pop_into(&cq, got, 64)) > 0) {
        for (int i = 0; i < n; i++)
            cr_assert_eq(got[i], next_pop + (uint64_t)i);
        next_pop += (uint64_t)n;
    }
    cr_assert_eq(next_pop, next_push, "%llu pushed, %llu popped",
                 (unsigned long long)next_push, (unsigned long long)next_pop);
    cr_assert(saw_backlog, "the test never reached the overflow");
    cr_assert_gt(cq.n_overflowed, 0);
    cr_assert_eq(cq.n_lost, 0);
    cr_assert_not(cfx__tp_cq_backlogged(&cq));
    cr_assert_eq(cfx__tp_cq_take_status(&cq), 0);
    cfx__tp_cq_fini(&cq);
}

Test(tp_cq, reservations_fill_the_ring_first)
{
    struct cfx__tp_cq cq;
    cr_assert_eq(cfx__tp_cq_init(&cq, 4, "test iface"), CFX_OK);
    cr_assert_eq(cfx__tp_cq_reserve(&cq, 100), CFX_OK);
    for (uint64_t i = 0; i < 100; i++)
        push_seq(&cq, &ep_a, i);
    cr_assert_eq(cq.n_overflowed, 0, "reserved room must hold every push");
    /* Past the reservations: overflow, then a reservation grows the ring
     * and takes the overflow in without reordering. */
    for (uint64_t i = 100; i < 1000; i++)
        push_seq(&cq, &ep_a, i);
    cr_assert(cfx__tp_cq_backlogged(&cq));
    cr_assert_eq(cfx__tp_cq_reserve(&cq, 2000), CFX_OK);
    cr_assert_not(cfx__tp_cq_backlogged(&cq));
    uint64_t got[1000];
    cr_assert_eq(pop_into(&cq, got, 1000), 1000);
    for (uint64_t i = 0; i < 1000; i++)
        cr_assert_eq(got[i], i);
    cfx__tp_cq_unreserve(&cq, 2100);
    cr_assert_eq(cq.reserved, 0);
    cfx__tp_cq_fini(&cq);
}

Test(tp_cq, drop_ep_reaches_the_overflow)
{
    struct cfx__tp_cq cq;
    cr_assert_eq(cfx__tp_cq_init(&cq, 8, "test iface"), CFX_OK);
    for (uint64_t i = 0; i < 2000; i++)
        push_seq(&cq, i % 3 ? &ep_a : &ep_b, i);
    cr_assert(cfx__tp_cq_backlogged(&cq));
    cfx__tp_cq_drop_ep(&cq, &ep_b);
    uint64_t expect = 0, n = 0;
    struct cfx_tp_completion *c;
    while ((c = cfx__tp_cq_head(&cq))) {
        while (expect % 3 == 0)
            expect++;
        cr_assert_eq(c->ep, &ep_a, "a dropped endpoint's completion came out");
        cr_assert_eq(c->wr_id, expect);
        expect++;
        n++;
        cfx__tp_cq_pop(&cq);
    }
    cr_assert_eq(n, 2000 - 667);
    cfx__tp_cq_fini(&cq);
}

Test(tp_cq, past_the_cap_is_reported_once)
{
    struct cfx__tp_cq cq;
    cr_assert_eq(cfx__tp_cq_init(&cq, 4, "test iface"), CFX_OK);
    cq.overflow_max = 10; /* what CFX_TP_CQ_OVERFLOW_MAX is in production */
    for (uint64_t i = 0; i < 14; i++)
        push_seq(&cq, &ep_a, i);
    cr_assert_eq(cq.n_lost, 0);
    cr_assert_eq(cfx__tp_cq_take_status(&cq), 0);
    push_seq(&cq, &ep_a, 14); /* one too many */
    cr_assert_eq(cq.n_lost, 1);
    cr_assert_eq(cfx__tp_cq_count(&cq), 14);
    cr_assert_eq(cfx__tp_cq_take_status(&cq), CFX_ERR_NO_RESOURCE);
    cr_assert_eq(cfx__tp_cq_take_status(&cq), 0, "the loss is reported once");
    /* what was kept comes out whole and in order */
    uint64_t got[32];
    cr_assert_eq(pop_into(&cq, got, 32), 14);
    for (uint64_t i = 0; i < 14; i++)
        cr_assert_eq(got[i], i);
    cfx__tp_cq_fini(&cq);
}

Test(tp_table, generations_name_stale_slots)
{
    struct cfx__tp_table t;
    int objs[40];
    uint32_t idx[40], gen[40];

    cfx__tp_table_init(&t, 4, 32, 15, "test object");
    for (int i = 0; i < 32; i++) {
        cr_assert_eq(cfx__tp_table_add(&t, &objs[i], &idx[i], &gen[i]), CFX_OK);
        cr_assert_eq(idx[i], (uint32_t)i, "fresh slots go lowest index first");
        cr_assert_eq(cfx__tp_table_get(&t, idx[i], gen[i]), &objs[i]);
    }
    cr_assert_eq(cfx__tp_table_add(&t, &objs[32], NULL, NULL), CFX_ERR_NO_RESOURCE);

    cfx__tp_table_remove(&t, idx[5]);
    cr_assert_null(cfx__tp_table_at(&t, 5));
    cr_assert_null(cfx__tp_table_get(&t, 5, gen[5]));
    cr_assert_eq(cfx__tp_table_add(&t, &objs[33], &idx[33], &gen[33]), CFX_OK);
    cr_assert_eq(idx[33], 5, "a freed slot is reused");
    cr_assert_neq(gen[33], gen[5], "with a new generation");
    cr_assert_null(cfx__tp_table_get(&t, 5, gen[5]), "the old name finds nothing");
    cr_assert_eq(cfx__tp_table_get(&t, 5, gen[33]), &objs[33]);
    cr_assert_null(cfx__tp_table_at(&t, 1000));
    cr_assert_null(cfx__tp_table_get(&t, 1000, 1));

    /* generations wrap inside their bits */
    for (int i = 0; i < 70000; i++) {
        cfx__tp_table_remove(&t, 7);
        cr_assert_eq(cfx__tp_table_add(&t, &objs[7], &idx[7], &gen[7]), CFX_OK);
        cr_assert_leq(gen[7], 0x7fffu);
    }
    cfx__tp_table_fini(&t);
}

/* A seeded table starts its slots' generations at the seed (within the
 * mask), so (index, generation) ids differ from an unseeded table's, as a
 * restarted dpdk process's session ids must differ from its former self's. */
Test(tp_table, seeded_generations_start_at_the_seed)
{
    struct cfx__tp_table t, u;
    int obj;
    uint32_t idx, gen;

    cfx__tp_table_init(&t, 4, 32, 15, "test object");
    cr_assert_eq(cfx__tp_table_add(&t, &obj, &idx, &gen), CFX_OK);
    cr_assert_eq(gen, 1, "unseeded: generation 1");
    cfx__tp_table_init(&u, 4, 32, 15, "test object");
    cfx__tp_table_seed_gen(&u, 0xABCD1234u);
    for (int i = 0; i < 6; i++) { /* past the first allocation: grown slots too */
        cr_assert_eq(cfx__tp_table_add(&u, &obj, &idx, &gen), CFX_OK);
        cr_assert_eq(gen, 0xABCD1234u & 0x7fffu, "slot %u: generation %#x", idx, gen);
        cr_assert_eq(cfx__tp_table_get(&u, idx, gen), &obj);
    }
    cfx__tp_table_fini(&t);
    cfx__tp_table_fini(&u);
}

struct buried {
    struct cfx_list link;
    int id;
};

static int bury_order[8], n_buried;

static void bury(struct cfx_list *link)
{
    bury_order[n_buried++] = cfx_list_entry(link, struct buried, link)->id;
}

Test(tp_graveyard, frees_oldest_first)
{
    struct cfx__tp_graveyard g;
    struct cfx_list live;
    struct buried b[3] = { { .id = 0 }, { .id = 1 }, { .id = 2 } };

    cfx_list_init(&live);
    cfx__tp_graveyard_init(&g, bury);
    for (int i = 0; i < 3; i++)
        cfx_list_add_tail(&b[i].link, &live);
    cr_assert(cfx__tp_graveyard_empty(&g));
    cfx__tp_graveyard_add(&g, &b[2].link);
    cfx__tp_graveyard_add(&g, &b[0].link);
    cr_assert_not(cfx__tp_graveyard_empty(&g));
    cr_assert_eq(live.next, &b[1].link, "buried endpoints leave the live list");
    cfx__tp_graveyard_free(&g);
    cr_assert_eq(n_buried, 2);
    cr_assert_eq(bury_order[0], 2);
    cr_assert_eq(bury_order[1], 0);
    cr_assert(cfx__tp_graveyard_empty(&g));
}

TestSuite(tp_ops);

/* The engine asks every transport to forget memory it is about to unmap
 * (arena.c) through ops->mem_invalidate; a transport that keeps nothing of
 * a region past mem_dereg has no such op, and asking it is a no-op. */
Test(tp_ops, mem_invalidate_is_optional)
{
    char region[64];
    for (int i = 0; cfx__transports[i]; i++) {
        const struct cfx_transport_ops *ops = cfx__transports[i];
        if (!strcmp(ops->name, "verbs"))
            cr_assert_not_null(ops->mem_invalidate, "verbs caches registrations");
        else if (!strcmp(ops->name, "tcp") || !strcmp(ops->name, "shm"))
            cr_assert_null(ops->mem_invalidate, "%s keeps nothing past mem_dereg", ops->name);
        if (!ops->mem_invalidate)
            cr_assert_eq(cfx__tp_mem_invalidate(ops, NULL, region, sizeof(region)), 0);
    }
}

static int so_buf(int fd, int opt)
{
    int v = 0;
    socklen_t len = sizeof(v);
    cr_assert_eq(getsockopt(fd, SOL_SOCKET, opt, &v, &len), 0);
    return v;
}

/* The most SO_SNDBUF the kernel gives: twice the net.core.wmem_max a
 * request is cut to (socket(7)), whatever the host's default is. */
static int sndbuf_max(void)
{
    FILE *f = fopen("/proc/sys/net/core/wmem_max", "r");
    long wmem_max = 0;
    cr_assert(f && fscanf(f, "%ld", &wmem_max) == 1, "net.core.wmem_max unreadable");
    fclose(f);
    return (int)(2 * wmem_max);
}

/* Lines of the file @p path that hold @p needle. */
static int lines_with(const char *path, const char *needle)
{
    char line[2048];
    int n = 0;
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* CFX_TCP_SNDBUF / CFX_TCP_RCVBUF outside [0, INT_MAX] are brought to the
 * nearest bound, as README says of every variable: a negative one and one
 * past an int were dropped without a word (and 2^63 was "not an integer"). */
Test(tp_sock, socket_buffers_from_the_environment_are_brought_to_their_bounds)
{
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "-1", 1), 0);
    cr_assert_eq(cfx__tp_sock_env_buf("CFX_TCP_SNDBUF"), 0);
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "9223372036854775808", 1), 0);
    cr_assert_eq(cfx__tp_sock_env_buf("CFX_TCP_SNDBUF"), INT_MAX);
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "4294967296", 1), 0);
    cr_assert_eq(cfx__tp_sock_env_buf("CFX_TCP_SNDBUF"), INT_MAX);
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "65536", 1), 0);
    cr_assert_eq(cfx__tp_sock_env_buf("CFX_TCP_SNDBUF"), 65536);
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "", 1), 0);
    cr_assert_eq(cfx__tp_sock_env_buf("CFX_TCP_SNDBUF"), 0);

    /* and the socket gets it: the most the kernel allows */
    int big = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(big >= 0);
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "9223372036854775808", 1), 0);
    cfx__tp_sock_setup(big, true);
    unsetenv("CFX_TCP_SNDBUF");
    cr_expect_eq(so_buf(big, SO_SNDBUF), sndbuf_max(), "SO_SNDBUF %d", so_buf(big, SO_SNDBUF));
    close(big);
}

/*
 * A job of many connections logged the same clamping warning once per
 * socket.  The variables are read once per process, at its first socket:
 * each bound is warned about once, and every socket gets the same buffers
 * (the environment changed after the first is not seen).
 */
Test(tp_sock, socket_buffers_are_read_once_per_process)
{
    enum { SOCKETS = 16 };
    char path[] = "/tmp/cfx-test-sockbuf-XXXXXX";
    int lfd = mkstemp(path);
    cr_assert_geq(lfd, 0);
    close(lfd);
    /* this process's lines go to the file from its first (read once) */
    cr_assert_eq(setenv("CFX_LOG_FILE", path, 1), 0);
    cfx__log_init();
    cfx__log_level = CFX_LOG_LEVEL_WARN;
    cr_assert_eq(setenv("CFX_TCP_SNDBUF", "9223372036854775808", 1), 0);
    cr_assert_eq(setenv("CFX_TCP_RCVBUF", "-1", 1), 0);

    int plain = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(plain >= 0);
    int rcv_default = so_buf(plain, SO_RCVBUF);
    close(plain);
    for (int i = 0; i <= SOCKETS; i++) {
        if (i == SOCKETS) /* too late: the first socket's reading holds */
            cr_assert_eq(setenv("CFX_TCP_SNDBUF", "4096", 1), 0);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(fd >= 0);
        cfx__tp_sock_setup(fd, true);
        cr_assert_eq(so_buf(fd, SO_SNDBUF), sndbuf_max(), "socket %d: SO_SNDBUF %d", i,
                     so_buf(fd, SO_SNDBUF));
        /* -1 is brought to 0: autotuning, the buffer left as it comes */
        cr_assert_eq(so_buf(fd, SO_RCVBUF), rcv_default, "socket %d: SO_RCVBUF %d, not %d", i,
                     so_buf(fd, SO_RCVBUF), rcv_default);
        close(fd);
    }
    unsetenv("CFX_TCP_SNDBUF");
    unsetenv("CFX_TCP_RCVBUF");
    cr_assert_eq(lines_with(path, "CFX_TCP_SNDBUF=9223372036854775808 is outside "
                                  "[0, 2147483647]: 2147483647 is used"), 1);
    cr_assert_eq(lines_with(path, "CFX_TCP_RCVBUF=-1 is outside [0, 2147483647]: 0 is used"),
                 1);
    cr_assert_eq(lines_with(path, "CFX_TCP_"), 2, "other lines name the variables");
    unlink(path);
}

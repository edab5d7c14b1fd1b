/*
 * Context and object API in one process: an embedded coordinator and one or
 * two contexts.  (Multi-process transfers are in test/integration.)
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/client_int.h"
#include "control/coord.h"
#include "dataplane/common/log.h"
#include "dataplane/engine/engine.h"
#include "dataplane/engine/task_int.h"
#include "dataplane/shm/shm.h"
#include "dataplane/tcp/tcp.h"
#include "testutil.h"

static struct cfx_test_coord co;

static void setup(void)
{
    cr_assert_eq(cfx_test_coord_up(&co), CFX_OK, "coordinator: %s", cfx_last_error());
}

static void teardown(void)
{
    cfx_test_coord_down(&co);
}

TestSuite(context, .init = setup, .fini = teardown, .timeout = 60);

static int join(const char *tok, const char *tps, struct cfx_context **out)
{
    return cfx_test_join(co.addr, tok, tps, NULL, 5000, out);
}

/*
 * A token taken from $CFX_TOKEN is removed from the environment by the
 * first context (children do not inherit it, /proc/PID/environ stops
 * showing it); a later context of the process still finds it, and two
 * contexts of the token join the same cluster.  Before the fix the variable
 * stayed in the environment.
 */
Test(context, token_from_environment_is_removed_from_it)
{
    struct cfx_context *a, *b;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TIMEOUT,
        .coord = co.addr,
        .timeout_ms = 5000,
    };
    unsetenv("CFX_TOKEN_FILE");
    cr_assert_eq(setenv("CFX_TOKEN", co.token, 1), 0);
    cr_assert_eq(cfx_context_create(&p, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_null(getenv("CFX_TOKEN"), "CFX_TOKEN is still in the environment");
    cr_assert_eq(cfx_context_create(&p, &b), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(cfx_context_node_id(a), cfx_context_node_id(b));
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

Test(context, join_and_config)
{
    struct cfx_context *a, *b;
    cr_assert_eq(join(co.token, NULL, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, NULL, &b), CFX_OK, "%s", cfx_last_error());
    cr_assert_neq(cfx_context_node_id(a), 0u);
    cr_assert_neq(cfx_context_node_id(a), cfx_context_node_id(b));

    char buf[2048];
    int n = cfx_context_config(a, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_lt(n, (int)sizeof(buf));
    cr_assert(strstr(buf, "coordinator = 127.0.0.1:"), "%s", buf);
    /* shm first; verbs too where a device exists; tcp always */
    cr_assert(strstr(buf, "transports = shm,"), "%s", buf);
    cr_assert(strstr(buf, "tcp (requested shm,verbs,tcp)"), "%s", buf);
    cr_assert_eq(cfx_context_config(NULL, buf, sizeof(buf)), CFX_ERR_INVALID);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    cfx_context_destroy(NULL);
}

Test(context, wrong_token_refused)
{
    struct cfx_context *a = NULL;
    int rc = join("not-the-token", NULL, &a);
    cr_assert_eq(rc, CFX_ERR_AUTH, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(a);
    cr_assert(strstr(cfx_last_error(), "127.0.0.1"), "error does not name the coordinator: %s",
              cfx_last_error());
}

/* A field_mask bit this library does not know (a field of a newer header)
 * is refused with CFX_ERR_UNSUPPORTED naming the bits, before anything is
 * done: no node joins.  It was ignored, and the context joined. */
Test(context, unknown_field_bit_is_refused)
{
    uint32_t joined0, joined, alive;
    cfx__coord_member_counts(co.coord, &joined0, &alive);
    struct cfx_context *c = NULL;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | (1ull << 40),
        .coord = co.addr, .token = co.token,
    };
    int rc = cfx_context_create(&p, &c);
    cr_assert_eq(rc, CFX_ERR_UNSUPPORTED, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(c);
    cr_assert(strstr(cfx_last_error(), "cfx_context_create: cfx_context_params.field_mask has "
                     "bits 0x10000000000 this library does not know (conflux "
                     CFX_VERSION_STRING ")"), "%s", cfx_last_error());
    cfx__coord_member_counts(co.coord, &joined, &alive);
    cr_assert_eq(joined, joined0, "a node joined");
    p.field_mask &= CFX_CTX_PARAM_ALL;
    cr_assert_eq(cfx_context_create(&p, &c), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(c);
}

Test(context, no_coordinator)
{
    struct cfx_context *a = NULL;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT,
        .coord = "127.0.0.1:1", .token = co.token, .timeout_ms = 2000,
    };
    int rc = cfx_context_create(&p, &a);
    cr_assert_eq(rc, CFX_ERR_CONNECT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "127.0.0.1:1"), "error does not name the coordinator: %s",
              cfx_last_error());
    cr_assert_null(a);
    cr_assert_eq(cfx_context_create(NULL, NULL), CFX_ERR_INVALID);
    /* a name longer than the address kept is refused, not cut short (the
     * cut named another host, or none) */
    char longname[200];
    memset(longname, 'a', sizeof(longname));
    memcpy(longname + sizeof(longname) - 7, ":29500", 7);
    p.coord = longname;
    rc = cfx_context_create(&p, &a);
    cr_assert_eq(rc, CFX_ERR_INVALID, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "(the coord parameter) is longer than 127 bytes"), "%s",
              cfx_last_error());
    cr_assert_null(a);
    /* so is a node name longer than the record keeps (it was cut to 63
     * bytes without a word, and rdmactl showed the cut name) */
    char longnode[65];
    memset(longnode, 'n', 64);
    longnode[64] = '\0';
    p.coord = "127.0.0.1:1";
    p.field_mask |= CFX_CTX_PARAM_NAME;
    p.name = longnode;
    rc = cfx_context_create(&p, &a);
    cr_assert_eq(rc, CFX_ERR_INVALID, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "(the name parameter) is longer than 63 bytes"), "%s",
              cfx_last_error());
    cr_assert_null(a);
    longnode[63] = '\0'; /* 63 bytes are taken: the create gets as far as the coordinator */
    rc = cfx_context_create(&p, &a);
    cr_assert_eq(rc, CFX_ERR_CONNECT, "got %s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(a);
}

struct late_coord {
    uint16_t port;
    struct cfx_coord *coord;
    int rc;
};

static void *late_coord_main(void *arg)
{
    struct late_coord *lc = arg;
    /* the joiner below is already being refused by now */
    poll(NULL, 0, 300);
    struct cfx_coord_params p = { .bind_addr = "127.0.0.1", .port = lc->port, .token = co.token };
    lc->rc = cfx__coord_start(&p, &lc->coord);
    return NULL;
}

/* A process started before its coordinator waits for it (until its
 * deadline) instead of failing on the first refused connection. */
Test(context, coordinator_started_late)
{
    int port = cfx_test_free_port(); /* nothing listens on it until the thread starts */
    cr_assert_gt(port, 0);
    struct late_coord lc = { .port = port };
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", lc.port);

    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, late_coord_main, &lc), 0);
    struct cfx_context *a = NULL;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT,
        .coord = addr, .token = co.token, .timeout_ms = 30000,
    };
    int rc = cfx_context_create(&p, &a);
    pthread_join(th, NULL);
    cr_assert_eq(lc.rc, CFX_OK, "late coordinator on port %u did not start", lc.port);
    cr_assert_eq(rc, CFX_OK, "joining a coordinator that came up late: %s: %s",
                 cfx_errname(rc), cfx_last_error());
    cr_assert_str_empty(cfx_last_error(), "a successful create leaves no error behind");
    cfx_context_destroy(a);
    cfx__coord_stop(lc.coord);
}

static int stop_at_the_second_check(void *arg)
{
    int *n = arg;
    return ++*n >= 2;
}

/* A join that waits for a coordinator nobody runs ends when the thread's
 * interrupt check says stop (Ctrl-C in Python), with CFX_ERR_CANCELED
 * naming the coordinator, not at its deadline: before, the check never ran
 * there, and an interpreter ignored Ctrl-C for the whole deadline. */
Test(context, a_join_waiting_for_its_coordinator_is_interrupted)
{
    int port = cfx_test_free_port(); /* nothing listens on it */
    cr_assert_gt(port, 0);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    struct cfx_context *a = NULL;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT,
        .coord = addr, .token = co.token, .timeout_ms = 45000, /* past the suite's 60 s */
    };
    int checks = 0;
    cfx_set_interrupt_check(stop_at_the_second_check, &checks);
    int rc = cfx_context_create(&p, &a);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_null(a);
    cr_assert_eq(checks, 2);
    char want[128];
    snprintf(want, sizeof(want), "interrupted while waiting for coordinator %s", addr);
    cr_assert(strstr(cfx_last_error(), want), "'%s' missing: %s", want, cfx_last_error());
}

/* The bind address a context resolved, from its configuration text. */
static void config_bind_addr(struct cfx_context *c, char *out, size_t len)
{
    char buf[2048];
    cr_assert_gt(cfx_context_config(c, buf, sizeof(buf)), 0);
    const char *p = strstr(buf, "bind_addr = ");
    cr_assert_not_null(p, "%s", buf);
    p += strlen("bind_addr = ");
    snprintf(out, len, "%.*s", (int)strcspn(p, "\n"), p);
}

/* Join with CFX_SOCKET_IFNAME or CFX_BIND_ADDR (@p var) set to @p val;
 * the bind address into @p addr on success. */
static int join_if(const char *var, const char *val, char *addr, size_t len)
{
    struct cfx_context *c = NULL;
    cr_assert_eq(setenv(var, val, 1), 0);
    int rc = join(co.token, "tcp", &c);
    unsetenv(var);
    if (rc == CFX_OK) {
        config_bind_addr(c, addr, len);
        cfx_context_destroy(c);
    } else {
        cr_assert_null(c);
    }
    return rc;
}

/* First interface that is up, not loopback, with an IPv4 address ("" if none). */
static void first_non_loopback(char *out, size_t len)
{
    struct ifaddrs *all;
    out[0] = '\0';
    cr_assert_eq(getifaddrs(&all), 0);
    for (struct ifaddrs *i = all; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK)) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)len);
            break;
        }
    freeifaddrs(all);
}

/* CFX_SOCKET_IFNAME as NCCL_SOCKET_IFNAME: a prefix, '=' exact, '^' exclude. */
Test(context, socket_ifname_selects_the_interface)
{
    char addr[64], want[64];
    int rc;
    cr_assert_eq(rc = join_if("CFX_SOCKET_IFNAME", "lo", addr, sizeof(addr)), CFX_OK, "%s: %s",
                 cfx_errname(rc), cfx_last_error());
    cr_expect_str_eq(addr, "127.0.0.1");
    cr_assert_eq(rc = join_if("CFX_SOCKET_IFNAME", "nosuch,l", addr, sizeof(addr)), CFX_OK,
                 "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect_str_eq(addr, "127.0.0.1");
    cr_assert_eq(rc = join_if("CFX_SOCKET_IFNAME", "=lo", addr, sizeof(addr)), CFX_OK, "%s: %s",
                 cfx_errname(rc), cfx_last_error());
    cr_expect_str_eq(addr, "127.0.0.1");
    /* an interface name in CFX_BIND_ADDR is taken whole */
    cr_assert_eq(rc = join_if("CFX_BIND_ADDR", "lo", addr, sizeof(addr)), CFX_OK, "%s: %s",
                 cfx_errname(rc), cfx_last_error());
    cr_expect_str_eq(addr, "127.0.0.1");
    /* an exclusion never takes loopback */
    first_non_loopback(want, sizeof(want));
    rc = join_if("CFX_SOCKET_IFNAME", "^docker,virbr", addr, sizeof(addr));
    if (want[0]) {
        cr_assert_eq(rc, CFX_OK, "%s: %s", cfx_errname(rc), cfx_last_error());
        cr_expect_str_eq(addr, want);
    } else {
        cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    }
}

/* A name that selects nothing: CFX_ERR_INVALID naming the variable and
 * listing the interfaces there are (lo among them). */
Test(context, socket_ifname_bad_name)
{
    char addr[64];
    int rc = join_if("CFX_SOCKET_IFNAME", "=l", addr, sizeof(addr));
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "CFX_SOCKET_IFNAME==l selects no interface that is up "
                                       "with an IPv4 address; there are: "),
              "%s", cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "lo (127.0.0.1)"), "%s", cfx_last_error());
    rc = join_if("CFX_SOCKET_IFNAME", "nosuch0", addr, sizeof(addr));
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "CFX_SOCKET_IFNAME=nosuch0 selects no interface"), "%s",
              cfx_last_error());
    /* CFX_BIND_ADDR=eth0 where there is no eth0: the variable is named, not verbs */
    rc = join_if("CFX_BIND_ADDR", "nosuch0", addr, sizeof(addr));
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "CFX_BIND_ADDR=nosuch0 selects no interface"), "%s",
              cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "lo (127.0.0.1)"), "%s", cfx_last_error());
    /* an address no interface here has (TEST-NET-1): refused, not tcp left
     * out quietly with shm alone */
    rc = join_if("CFX_BIND_ADDR", "192.0.2.77", addr, sizeof(addr));
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "CFX_BIND_ADDR=192.0.2.77: no interface of this host"),
              "%s", cfx_last_error());
    rc = join_if("CFX_SOCKET_IFNAME", "", addr, sizeof(addr));
    cr_assert_eq(rc, CFX_ERR_INVALID, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_expect(strstr(cfx_last_error(), "CFX_SOCKET_IFNAME is empty"), "%s", cfx_last_error());
}

/* MASTER_ADDR, CFX_COORD_PORT and RANK=0, no CFX_COORD: this context hosts
 * the coordinator on that port, says so in its configuration, and its
 * destroy (no other member) stops it at once. */
Test(context, rank0_hosts_coordinator_on_cfx_coord_port)
{
    struct cfx_context *a = NULL, *b = NULL;
    char port[16], buf[2048], want[96];
    int p = cfx_test_free_port();
    cr_assert_gt(p, 0);
    snprintf(port, sizeof(port), "%d", p);
    unsetenv("CFX_COORD");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1); /* CFX_COORD_PORT wins over MASTER_PORT+1 */
    setenv("CFX_COORD_PORT", port, 1);
    setenv("RANK", "0", 1);
    struct cfx_context_params cp = {
        .field_mask = CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT | CFX_CTX_PARAM_TRANSPORTS,
        .token = co.token, .timeout_ms = 5000, .transports = "tcp",
    };
    cr_assert_eq(cfx_context_create(&cp, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_gt(cfx_context_config(a, buf, sizeof(buf)), 0);
    snprintf(want, sizeof(want), "\ncoordinator = 127.0.0.1:%d (from MASTER_ADDR; hosted here, "
             "rank 0)\n", p);
    cr_expect_not_null(strstr(buf, want), "%s", buf);
    /* rank 1 of the same environment joins it */
    setenv("RANK", "1", 1);
    cr_assert_eq(cfx_context_create(&cp, &b), CFX_OK, "%s", cfx_last_error());
    cr_assert_gt(cfx_context_config(b, buf, sizeof(buf)), 0);
    snprintf(want, sizeof(want), "\ncoordinator = 127.0.0.1:%d (from MASTER_ADDR)\n", p);
    cr_expect_not_null(strstr(buf, want), "%s", buf);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    /* the port is free again: the coordinator stopped with rank 0 */
    setenv("RANK", "0", 1);
    cr_assert_eq(cfx_context_create(&cp, &a), CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(a);
}

Test(context, unknown_transport)
{
    struct cfx_context *a = NULL;
    int rc = join(co.token, "carrier-pigeon", &a);
    cr_assert_eq(rc, CFX_ERR_INVALID, "got %s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "carrier-pigeon"), "%s", cfx_last_error());
}

/* A transport this build lacks, named in CFX_TRANSPORT: refused, naming the
 * transport and the one build option that leaves it out (the text named
 * both CFX_WITH_VERBS and CFX_WITH_DPDK whichever was asked for). */
Test(context, transport_the_build_lacks_names_its_option)
{
#if defined(CFX_HAVE_DPDK) && defined(CFX_HAVE_VERBS)
    cr_skip_test("this build has every transport: none to find missing");
#else
#ifndef CFX_HAVE_DPDK
    const char *tp = "dpdk,tcp", *opt = "CFX_WITH_DPDK=OFF", *other = "CFX_WITH_VERBS";
#else
    const char *tp = "verbs,tcp", *opt = "CFX_WITH_VERBS=OFF", *other = "CFX_WITH_DPDK";
#endif
    struct cfx_context *a = NULL;
    int rc = join(co.token, tp, &a);
    cr_assert_eq(rc, CFX_ERR_INVALID, "got %s", cfx_errname(rc));
    cr_assert(strstr(cfx_last_error(), "which this build was made without") &&
                  strstr(cfx_last_error(), opt) && !strstr(cfx_last_error(), other),
              "%s", cfx_last_error());
#endif
}

/* No transport of the list can open: the error says why each was not
 * available (it was logged at INFO only, and the error said just "no
 * usable transport"). */
Test(context, no_usable_transport_says_why)
{
#ifdef CFX_HAVE_DPDK
    struct cfx_context *a = NULL;
    unsetenv("CFX_DPDK_VDEV");
    unsetenv("CFX_DPDK_EAL");
    int rc = join(co.token, "dpdk", &a);
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "got %s", cfx_errname(rc));
    /* the reason itself depends on the host (no port given; EAL unable to
     * start): it is there, after the transport's name */
    const char *why = strstr(cfx_last_error(), "no usable transport among 'dpdk' (dpdk: dpdk ");
    cr_assert(why, "%s", cfx_last_error());
    cr_assert_gt(strlen(why), strlen("no usable transport among 'dpdk' (dpdk: dpdk )"), "%s",
                 cfx_last_error());
    cr_assert_eq(why[strlen(why) - 1], ')', "%s", cfx_last_error());
#else
    cr_skip_test("this build has no dpdk transport: no transport to find missing");
#endif
}

/* A default deadline or spin from the environment that would wait or spin
 * for ever, wrap or mean nothing is refused by name (a negative
 * CFX_TIMEOUT_MS made every call wait for ever, 0 made every get fail at
 * once, CFX_SPIN_US=-1 a spin of 71 minutes); in range, it is taken. */
Test(context, deadline_and_spin_from_the_environment_are_checked)
{
    static const struct {
        const char *var, *val;
    } bad[] = {
        { "CFX_TIMEOUT_MS", "-1" },   { "CFX_TIMEOUT_MS", "0" },
        { "CFX_TIMEOUT_MS", "99999999999" }, { "CFX_TIMEOUT_MS", "30s" },
        { "CFX_SPIN_US", "-1" },      { "CFX_SPIN_US", "1000001" },
    };
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr,
        .token = co.token,
        .transports = "tcp",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct cfx_context *c = NULL;
        cr_assert_eq(setenv(bad[i].var, bad[i].val, 1), 0);
        int rc = cfx_context_create(&p, &c);
        unsetenv(bad[i].var);
        cr_assert_eq(rc, CFX_ERR_INVALID, "%s=%s: %s", bad[i].var, bad[i].val, cfx_errname(rc));
        cr_assert_null(c);
        cr_assert(strstr(cfx_last_error(), bad[i].var), "%s", cfx_last_error());
    }
    struct cfx_context *c = NULL;
    setenv("CFX_TIMEOUT_MS", "4321", 1);
    setenv("CFX_SPIN_US", "0", 1);
    int rc = cfx_context_create(&p, &c);
    unsetenv("CFX_TIMEOUT_MS");
    unsetenv("CFX_SPIN_US");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(c->cfg.timeout_ms, 4321);
    cr_assert_eq(c->cfg.spin_us, 0);
    cfx_context_destroy(c);

    /* tuning values past their documented bounds are brought to them (with
     * a warning), never taken as they are */
    static const struct {
        const char *var, *val;
    } clamp[] = {
        { "CFX_GET_SOURCES", "9" }, { "CFX_EAGER_MAX", "5000" }, { "CFX_WAITER_NAP_MS", "1001" },
        { "CFX_INLINE_MAX", "1G" }, { "CFX_SPIN_YIELD", "0" }, { "CFX_CHUNK_SIZE", "128M" },
        /* past 32 bits: it wrapped to 0, silently; past a long long: "not an
         * integer", and the default taken; a negative count: 4 billion */
        { "CFX_WINDOW", "4G" }, { "CFX_SPIN_ADAPT_US", "9223372036854775808" },
        { "CFX_TASK_CORES", "-1" }, { "CFX_TASK_GPUS", "-99999999999999999999" },
        /* a count, not a size: -5 was "not a size", the default taken */
        { "CFX_LOC_CACHE", "-5" },
    };
    for (size_t i = 0; i < sizeof(clamp) / sizeof(clamp[0]); i++)
        cr_assert_eq(setenv(clamp[i].var, clamp[i].val, 1), 0);
    rc = cfx_context_create(&p, &c);
    for (size_t i = 0; i < sizeof(clamp) / sizeof(clamp[0]); i++)
        unsetenv(clamp[i].var);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(c->cfg.get_sources, CFX_GET_SOURCES_MAX);
    cr_assert_eq(c->cfg.eager_max, CFX_EAGER_LIMIT);
    cr_assert_eq(c->cfg.waiter_nap_ms, 1000);
    cr_assert_eq(c->cfg.inline_max, CFX_OBJECT_INLINE_MAX);
    cr_assert_eq(c->cfg.spin_yield, 1);
    cr_assert_eq(c->cfg.chunk_size, CFX_CHUNK_MAX);
    cr_assert_eq(c->cfg.window_bytes, CFX_WINDOW_MAX);
    cr_assert_eq(c->cfg.spin_adapt_us, 10000);
    cr_assert_eq(c->tasks->cores, 0);
    cr_assert_eq(c->tasks->gpus, 0);
    cr_assert_eq(c->cfg.loc_cache, 0);
    cfx_context_destroy(c);
    /* below the bounds, and a negative one too (it was "not a size", and
     * chunks were chosen per object as if it were unset) */
    static const char *const low[] = { "1K", "-4K" };
    for (size_t i = 0; i < sizeof(low) / sizeof(low[0]); i++) {
        cr_assert_eq(setenv("CFX_CHUNK_SIZE", low[i], 1), 0);
        rc = cfx_context_create(&p, &c);
        unsetenv("CFX_CHUNK_SIZE");
        cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(c->cfg.chunk_size, CFX_CHUNK_MIN, "CFX_CHUNK_SIZE=%s: %zu", low[i],
                     c->cfg.chunk_size);
        cfx_context_destroy(c);
    }
}

/* After a get returned, the destination it granted to its source takes no
 * more writes: its registration holds no live grant, whichever transport.
 * Returns the number of registrations checked; -1 when the node kept no
 * copy (a cfx_get() into the caller's buffer: entry and registrations went
 * before it returned). */
static int check_no_live_grant(struct cfx_context *c, const struct cfx_object_id *id)
{
    int checked = 0;
    pthread_mutex_lock(&c->lock);
    struct cfx_obj *o = cfx__store_find(&c->store, id);
    if (!o) {
        pthread_mutex_unlock(&c->lock);
        return -1;
    }
    for (int t = 0; t < c->ntp; t++) {
        struct cfx_tp_mr *mr = o->mr[t];
        uint64_t key;
        if (!mr)
            continue;
        if (c->tp[t].ops == &cfx__tcp_ops)
            key = container_of(mr, struct cfx__tcp_mr, super)->grant.key;
        else if (c->tp[t].ops == &cfx__shm_ops)
            key = container_of(mr, struct cfx__shm_mr, super)->grant.key;
        else
            continue;
        cr_assert_eq(key, 0, "%s: the destination is still granted after the get returned",
                     c->tp[t].ops->name);
        checked++;
    }
    pthread_mutex_unlock(&c->lock);
    return checked;
}

static void two_context_roundtrip(const char *tps, size_t size, int use_arena)
{
    struct cfx_context *a, *b;
    cr_assert_eq(join(co.token, tps, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, tps, &b), CFX_OK, "%s", cfx_last_error());

    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size), *dst = NULL;
    cfx_test_fill(src, size, size);
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_ERR_EXISTS);

    size_t got = 0;
    if (use_arena) {
        cr_assert_eq(cfx_get_alloc(b, &id, (void **)&dst, &got, NULL), CFX_OK, "%s",
                     cfx_last_error());
    } else {
        dst = malloc(size);
        cr_assert_eq(cfx_get(b, &id, dst, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    }
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(dst, size, size), (size_t)-1, "bytes differ");
    if (tps)
        cr_assert_gt(check_no_live_grant(b, &id), 0, "the get registered nothing");

    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_ERR_NOT_FOUND);
    if (use_arena)
        cfx_buf_free(b, dst);
    else {
        cr_assert_eq(cfx_delete(b, &id, NULL), CFX_OK);
        free(dst);
    }
    free(src);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/*
 * A forked child's copy of a context is neither usable nor torn down: its
 * calls fail with CFX_ERR_INVALID saying why, and its destroy (a Python
 * child's normal exit runs it) leaves the parent's connections, segments
 * and membership alone.  Before, the child's destroy left the cluster on
 * the parent's control connection: the parent's next put failed and its
 * objects were gone from the directory.
 */
Test(context, forked_child_leaves_the_parents_context_alone)
{
    struct cfx_context *a, *b;
    cr_assert_eq(join(co.token, "shm", &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, "shm", &b), CFX_OK, "%s", cfx_last_error());
    enum { N = 100000 };
    static uint8_t src[N], dst[N];
    struct cfx_object_id before, after;
    cfx_object_id_generate(a, &before);
    cfx_object_id_generate(a, &after);
    cfx_test_fill(src, N, 41);
    cr_assert_eq(cfx_put(a, &before, src, N, NULL), CFX_OK, "%s", cfx_last_error());

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int rc = cfx_put(a, &after, src, N, NULL);
        bool told = rc == CFX_ERR_INVALID && strstr(cfx_last_error(), "forked");
        cfx_context_destroy(b);
        cfx_context_destroy(a);
        _exit(told ? 0 : 1);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the child's put was not refused as a forked copy's (status %#x)", st);

    size_t got = 0;
    cr_assert_eq(cfx_get(b, &before, dst, N, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(dst, N, 41), (size_t)-1, "bytes differ");
    cfx_test_fill(src, N, 42);
    cr_assert_eq(cfx_put(a, &after, src, N, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_get(b, &after, dst, N, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(dst, N, 42), (size_t)-1, "bytes differ");
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/*
 * A get over shm from a node of another user: the source's transport
 * refuses the peer (shm.h, "Trust"), and the get's error says so through
 * the connection's failure, where it said only that the source "failed"
 * (it had not: the reason was in a WARN line of the log alone).  The getter
 * is this binary exec'd afresh as nobody (nobody_get() below: a fork of
 * this threaded process may not use the library); skipped where this
 * process cannot become nobody.
 */
#define NOBODY_ENV "CFX_TEST_NOBODY_GET"

__attribute__((constructor)) static void nobody_get(void)
{
    const char *hex = getenv(NOBODY_ENV);
    if (!hex)
        return;
    struct cfx_object_id id;
    struct cfx_context *b = NULL;
    static uint8_t dst[1 << 20];
    size_t got = 0;
    int rc = cfx_object_id_from_hex(hex, &id);
    if (rc == CFX_OK)
        rc = cfx_context_create(NULL, &b); /* CFX_COORD, CFX_TOKEN, CFX_TRANSPORT */
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = 3000 };
    if (rc == CFX_OK)
        rc = cfx_get(b, &id, dst, sizeof(dst), &got, &p);
    printf("%s: %s\n", cfx_errname(rc), cfx_last_error());
    fflush(stdout);
    cfx_context_destroy(b);
    _exit(0);
}

Test(context, a_refused_shm_peer_is_named_in_the_get_error)
{
    struct cfx_context *a;
    cr_assert_eq(join(co.token, "shm", &a), CFX_OK, "%s", cfx_last_error());
    enum { N = 1 << 20 };
    static uint8_t src[N];
    struct cfx_object_id id;
    char hex[CFX_OBJECT_ID_HEX_LEN], self[512], env_id[128], env_coord[128], env_tok[128];
    cfx_object_id_generate(a, &id);
    cfx_object_id_to_hex(&id, hex);
    cfx_test_fill(src, N, 43);
    cr_assert_eq(cfx_put(a, &id, src, N, NULL), CFX_OK, "%s", cfx_last_error());
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    cr_assert_gt(sl, 0);
    self[sl] = '\0';
    snprintf(env_id, sizeof(env_id), "%s=%s", NOBODY_ENV, hex);
    snprintf(env_coord, sizeof(env_coord), "CFX_COORD=%s", co.addr);
    snprintf(env_tok, sizeof(env_tok), "CFX_TOKEN=%s", co.token);
    char *const argv[] = { self, NULL };
    char *const envp[] = { env_id, env_coord, env_tok, "CFX_TRANSPORT=shm", NULL };
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* only system calls until the exec */
        dup2(pfd[1], 1);
        if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) ||
            setresuid(65534, 65534, 65534))
            _exit(77);
        execve(self, argv, envp);
        _exit(78);
    }
    close(pfd[1]);
    char msg[600] = "";
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof(msg) - 1 &&
           (r = read(pfd[0], msg + n, sizeof(msg) - 1 - (size_t)n)) > 0)
        n += r;
    close(pfd[0]);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cfx_context_destroy(a);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        cr_skip_test("cannot become nobody here");
    if (WIFEXITED(st) && WEXITSTATUS(st) == 78)
        cr_skip_test("nobody cannot run %s here", self);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the getter ended with %#x: %s", st, msg);
    cr_assert(strstr(msg, "CFX_ERR_PEER_FAILED") &&
                  strstr(msg, "the shm transport refused the peer: another user"),
              "the get from another user's node: %s", msg);
}

/*
 * A cfx_get() with CFX_OBJ_FLAG_NO_KEEP leaves the buffer the caller's once
 * it returns: overwritten or freed right after, no later get anywhere sees
 * it, and nothing of it stays registered.  An inline object got with a
 * plain cfx_get() into a stack buffer is kept in the engine's own copy,
 * which later gets on the node answer from.
 */
static void callers_buffer(const char *tps)
{
    struct cfx_context *a, *b, *c;
    cr_assert_eq(join(co.token, tps, &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, tps, &b), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, tps, &c), CFX_OK, "%s", cfx_last_error());
    const size_t big = (1u << 20) + 13, small = 100;
    struct cfx_object_id ib, is;
    cfx_object_id_generate(a, &ib);
    cfx_object_id_generate(a, &is);
    uint8_t *src = malloc(big), *dst = malloc(big), *again = malloc(big);
    cr_assert(src && dst && again);
    cfx_test_fill(src, big, 7);
    cr_assert_eq(cfx_put(a, &ib, src, big, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &is, src, small, NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_obj_params nk = { .field_mask = CFX_OBJ_PARAM_FLAGS,
                                 .flags = CFX_OBJ_FLAG_NO_KEEP };
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &ib, dst, big, &got, &nk), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, big);
    cr_assert_eq(cfx_test_check(dst, big, 7), (size_t)-1, "bytes differ");
    cr_assert_eq(check_no_live_grant(b, &ib), -1, "node b still holds the caller's buffer");
    memset(dst, 0xee, big);
    free(dst);
    cr_assert_eq(cfx_delete(b, &ib, NULL), CFX_ERR_NOT_FOUND, "node b kept a copy");

    uint8_t sb[128];
    cr_assert_eq(cfx_get(b, &is, sb, sizeof(sb), &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, small);
    cr_assert_eq(cfx_test_check(sb, small, 7), (size_t)-1, "bytes differ");
    memset(sb, 0xee, sizeof(sb));

    /* another node, and the getter again */
    cr_assert_eq(cfx_get(c, &ib, again, big, &got, &nk), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(again, big, 7), (size_t)-1, "node c got other bytes");
    memset(again, 0, big);
    cr_assert_eq(cfx_get(b, &ib, again, big, &got, &nk), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(again, big, 7), (size_t)-1, "node b got other bytes again");
    struct cfx_context_stats st0, st1;
    cr_assert_eq(cfx_context_stats(b, &st0), CFX_OK);
    uint8_t sb2[128] = { 0 };
    cr_assert_eq(cfx_get(b, &is, sb2, sizeof(sb2), &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(sb2, small, 7), (size_t)-1, "the small copy changed");
    cr_assert_eq(cfx_context_stats(b, &st1), CFX_OK);
    cr_assert_eq(st1.gets_local, st0.gets_local + 1, "the inline object was not kept");
    memset(sb2, 0, sizeof(sb2));
    cr_assert_eq(cfx_get(c, &is, sb2, sizeof(sb2), &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_test_check(sb2, small, 7), (size_t)-1, "node c got other bytes");

    free(again);
    cfx_context_destroy(c);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
    free(src);
}

Test(context, callers_buffer_tcp) { callers_buffer("tcp"); }
Test(context, callers_buffer_shm) { callers_buffer("shm"); }

Test(context, roundtrip_tcp) { two_context_roundtrip("tcp", (3u << 20) + 7, 0); }
Test(context, roundtrip_shm) { two_context_roundtrip("shm", (3u << 20) + 7, 0); }
Test(context, roundtrip_shm_arena) { two_context_roundtrip("shm", (3u << 20) + 7, 1); }
Test(context, roundtrip_inline) { two_context_roundtrip(NULL, 1000, 0); }

Test(context, api_misuse)
{
    struct cfx_context *a;
    struct cfx_object_id id;
    uint8_t b[8];
    cr_assert_eq(join(co.token, NULL, &a), CFX_OK, "%s", cfx_last_error());
    cfx_object_id_from_name("misuse", &id);
    cr_assert_eq(cfx_put(NULL, &id, b, 8, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_put(a, NULL, b, 8, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_put(a, &id, NULL, 8, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_get(a, &id, NULL, 8, NULL, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_get_alloc(a, &id, NULL, NULL, NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_delete(a, &id, NULL), CFX_ERR_NOT_FOUND);
    cr_assert_eq(cfx_buf_alloc(a, 0, (void **)&b), CFX_ERR_INVALID);
    /* sizes whose rounding to the arena's 4 KiB wraps (they returned a
     * 4 KiB buffer and CFX_OK), one that merely cannot be had, and ones
     * that map but more than memory and swap could back (the mapping
     * overcommits: 1 TiB and 32 TiB came back CFX_OK) */
    struct sysinfo si;
    cr_assert_eq(sysinfo(&si), 0);
    size_t backable = ((size_t)si.totalram + si.totalswap) * si.mem_unit;
    const size_t huge[] = { SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 4094, SIZE_MAX - 4095,
                            (size_t)1 << 62, (size_t)1 << 45, 2 * backable };
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        void *hb = b;
        cr_assert_eq(cfx_buf_alloc(a, huge[i], &hb), CFX_ERR_NOMEM, "size %zu: %s", huge[i],
                     cfx_last_error());
        cr_assert_eq(hb, b, "a refused allocation wrote its out pointer");
    }
    void *hb = NULL;
    cr_assert_eq(cfx_buf_alloc(a, (size_t)1 << 45, &hb), CFX_ERR_NOMEM);
    cr_assert(strstr(cfx_last_error(), "more than this machine's memory"), "%s",
              cfx_last_error());
    /* the default deadline must be one: 0 and negative ones are refused
     * (a negative one left every call without a deadline) */
    for (int t = -5; t <= 0; t += 5) {
        struct cfx_context *c = NULL;
        struct cfx_context_params tp = {
            .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT,
            .coord = co.addr, .token = co.token, .timeout_ms = t,
        };
        cr_assert_eq(cfx_context_create(&tp, &c), CFX_ERR_INVALID, "timeout_ms %d", t);
        cr_assert(strstr(cfx_last_error(), "timeout_ms"), "%s", cfx_last_error());
        cr_assert_null(c);
    }
    struct cfx_obj_params p = { .field_mask = CFX_OBJ_PARAM_CHUNK_SIZE, .chunk_size = 1 };
    cr_assert_eq(cfx_put(a, &id, b, 8, &p), CFX_ERR_INVALID);
    struct cfx_obj_params m = { .field_mask = CFX_OBJ_PARAM_MEMTYPE, .memtype = 99 };
    cr_assert_eq(cfx_put(a, &id, b, 8, &m), CFX_ERR_INVALID);
    /* a flag this library does not know is an error, not ignored (a put
     * with flags 1 << 30 returned CFX_OK) */
    struct cfx_obj_params f = { .field_mask = CFX_OBJ_PARAM_FLAGS, .flags = 1ull << 30 };
    cr_assert_eq(cfx_put(a, &id, b, 8, &f), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "unknown flags 0x40000000"), "%s", cfx_last_error());
    cr_assert_eq(cfx_get(a, &id, b, 8, NULL, &f), CFX_ERR_INVALID);
    void *ab = NULL;
    cr_assert_eq(cfx_get_alloc(a, &id, &ab, NULL, &f), CFX_ERR_INVALID);
    cr_assert_eq(cfx_reduce_objects(a, &id, 1, 1, CFX_DTYPE_F32, CFX_OP_SUM, &id, &f, NULL),
                 CFX_ERR_INVALID);
    cr_assert_eq(cfx_request_test(NULL), CFX_ERR_INVALID);
    cr_assert_eq(cfx_request_wait(NULL, 0), CFX_ERR_INVALID);
    cfx_request_free(NULL);
    cfx_buf_free(a, NULL);
    cfx_context_destroy(a);
}

Test(context, object_ids)
{
    struct cfx_object_id a, b;
    char hex[CFX_OBJECT_ID_HEX_LEN];
    cr_assert_eq(cfx_object_id_from_name("weights", &a), CFX_OK);
    cfx_object_id_to_hex(&a, hex);
    /* SHA-1("weights") */
    cr_assert_eq(cfx_object_id_from_hex(hex, &b), CFX_OK);
    cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0);
    cr_assert_eq(cfx_object_id_from_hex("xyz", &b), CFX_ERR_INVALID);
    cr_assert_eq(cfx_object_id_from_hex("zz00000000000000000000000000000000000000", &b),
                 CFX_ERR_INVALID);
}

/* A call that succeeds leaves no stale error text from an earlier failure
 * (status.h: every call that returns a status clears it). */
Test(context, last_error_cleared_by_success)
{
    struct cfx_context *a;
    struct cfx_object_id id;
    enum cfx_dtype dt;
    enum cfx_redop op;
    char buf[2048];
    struct cfx_context_stats st;
    int32_t x = 1, y = 2;
    cr_assert_eq(join(co.token, NULL, &a), CFX_OK, "%s", cfx_last_error());
#define FAIL_THEN(call)                                                                      \
    do {                                                                                     \
        cr_assert_eq(cfx_object_id_from_hex("xyz", &id), CFX_ERR_INVALID);                   \
        cr_assert_str_not_empty(cfx_last_error());                                           \
        cr_assert_geq((call), 0, "%s", #call);                                               \
        cr_assert_str_empty(cfx_last_error(), "%s left '%s'", #call, cfx_last_error());      \
    } while (0)
    FAIL_THEN(cfx_object_id_from_name("fine", &id));
    FAIL_THEN(cfx_object_id_generate(a, &id));
    FAIL_THEN(cfx_object_id_from_hex("00112233445566778899aabbccddeeff00112233", &id));
    FAIL_THEN(cfx_dtype_from_name("f32", &dt));
    FAIL_THEN(cfx_redop_from_name("sum", &op));
    FAIL_THEN(cfx_reduce(&x, &y, 1, CFX_DTYPE_I32, CFX_OP_SUM));
    FAIL_THEN(cfx_context_config(a, buf, sizeof(buf)));
    FAIL_THEN(cfx_context_stats(a, &st));
    uint8_t v[16] = { 1 };
    cfx_object_id_from_name("last-error", &id);
    FAIL_THEN(cfx_put(a, &id, v, sizeof(v), NULL));
    struct cfx_request *req = NULL;
    cr_assert_eq(cfx_get_nb(a, &id, buf, sizeof(buf), NULL, &req), CFX_OK, "%s",
                 cfx_last_error());
    FAIL_THEN(cfx_request_wait(req, 10000));
    FAIL_THEN(cfx_request_test(req));
    cfx_request_free(req);
    FAIL_THEN(cfx_delete(a, &id, NULL));
#undef FAIL_THEN
    /* a step inside a call that failed without mattering (a get's
     * transfer-end notice for an object deleted meanwhile said "not in the
     * directory") leaves nothing once the call returns CFX_OK */
    cr_assert_eq(cfx__ctx_enter(a, "test"), CFX_OK);
    cfx__err(CFX_ERR_NOT_FOUND, "a step that did not matter");
    cr_assert_eq(cfx__api_done(a, CFX_OK), CFX_OK); /* how cfx_get & co. end */
    cr_assert_str_empty(cfx_last_error());
    cfx_context_destroy(a);
}

static struct cfx_ctl *admin_open(void)
{
    struct cfx_ctl *adm = NULL;
    struct cfx_ctl_params p = { .coord = co.addr, .token = co.token,
                                .role = CFX_CTL_ROLE_ADMIN, .timeout_ms = 5000 };
    cr_assert_eq(cfx__ctl_open(&p, &adm), CFX_OK, "%s", cfx_last_error());
    return adm;
}

static const struct cfx_ctl_obj_rec *obj_listed(const struct cfx_ctl_obj_rec *v, size_t n,
                                                const struct cfx_object_id *id)
{
    for (size_t i = 0; i < n; i++)
        if (!memcmp(v[i].id.bytes, id->bytes, CFX_OBJECT_ID_LEN))
            return &v[i];
    return NULL;
}

/* The directory knows the name an object id was made from
 * (cfx_object_id_from_name), capped in length, byte for byte; a generated
 * id has none.  Small and data-plane objects alike. */
Test(context, objects_carry_their_names)
{
    struct cfx_context *a;
    cr_assert_eq(join(co.token, NULL, &a), CFX_OK, "%s", cfx_last_error());
    static uint8_t big[200000], small[100];
    memset(big, 'B', sizeof(big));
    memset(small, 'A', sizeof(small));
    char longname[200], oddname[] = "run/\x1b[31mred\x07";
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    struct cfx_object_id cfg, weights, lng, odd, gen;
    cr_assert_eq(cfx_object_id_from_name("run/cfg", &cfg), CFX_OK);
    cr_assert_eq(cfx_object_id_from_name("model/weights", &weights), CFX_OK);
    cr_assert_eq(cfx_object_id_from_name(longname, &lng), CFX_OK);
    cr_assert_eq(cfx_object_id_from_name(oddname, &odd), CFX_OK);
    cr_assert_eq(cfx_object_id_generate(a, &gen), CFX_OK);
    cr_assert_eq(cfx_put(a, &cfg, small, sizeof(small), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &weights, big, sizeof(big), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &lng, small, sizeof(small), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &odd, small, sizeof(small), NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(cfx_put(a, &gen, small, sizeof(small), NULL), CFX_OK, "%s", cfx_last_error());

    struct cfx_ctl *adm = admin_open();
    struct cfx_ctl_obj_rec *objs = NULL;
    size_t n = 0;
    const struct cfx_ctl_obj_rec *o;
    /* the put of the large object is announced from the progress thread */
    uint64_t t0 = cfx__now_ns();
    do {
        free(objs);
        cr_assert_eq(cfx__ctl_objects(adm, &objs, &n, cfx__deadline_ns(5000)), CFX_OK, "%s",
                     cfx_last_error());
    } while (!obj_listed(objs, n, &weights) && cfx__now_ns() - t0 < 20000000000ull &&
             poll(NULL, 0, 10) == 0);
    cr_assert_not_null(o = obj_listed(objs, n, &cfg));
    cr_assert_str_eq(o->name, "run/cfg");
    cr_assert_not_null(o = obj_listed(objs, n, &weights));
    cr_assert_str_eq(o->name, "model/weights");
    cr_assert_eq(o->is_inline, 0);
    cr_assert_not_null(o = obj_listed(objs, n, &lng));
    cr_assert_eq(strlen(o->name), CFX_OBJ_NAME_MAX, "a long name is cut");
    cr_assert(!strncmp(o->name, longname, CFX_OBJ_NAME_MAX));
    cr_assert_not_null(o = obj_listed(objs, n, &odd));
    cr_assert_str_eq(o->name, oddname, "the bytes are kept; printers escape them");
    cr_assert_not_null(o = obj_listed(objs, n, &gen));
    cr_assert_str_empty(o->name);
    free(objs);

    /* the member record: the host name for people, the host id for shm */
    struct cfx_node_rec rec;
    char host[CFX_HOST_NAME_MAX] = "";
    gethostname(host, sizeof(host) - 1);
    cr_assert_eq(cfx__ctl_node_get(adm, cfx_context_node_id(a), &rec, cfx__deadline_ns(5000)),
                 CFX_OK);
    cr_assert_str_eq(rec.host, host);
    cr_assert_str_eq(rec.host_id, a->self.host_id);
    cr_assert_eq(rec.flags, 0);
    cfx__ctl_close(adm);
    cfx_context_destroy(a);
}

/* A tool's context (rdmactl ps) joins as an observer. */
Test(context, observer_context_is_marked)
{
    struct cfx_context *t;
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_NAME,
        .coord = co.addr, .token = co.token, .name = "a-tool",
    };
    cr_assert_eq(cfx__context_create_flags(&p, CFX_NODE_F_OBSERVER, &t), CFX_OK, "%s",
                 cfx_last_error());
    struct cfx_ctl *adm = admin_open();
    struct cfx_node_rec rec;
    cr_assert_eq(cfx__ctl_node_get(adm, cfx_context_node_id(t), &rec, cfx__deadline_ns(5000)),
                 CFX_OK);
    cr_assert_str_eq(rec.name, "a-tool");
    cr_assert_eq(rec.flags, CFX_NODE_F_OBSERVER);
    cfx__ctl_close(adm);
    cfx_context_destroy(t);
}

/* An arena buffer and the inode of the memfd behind it. */
static ino_t arena_take(struct cfx_context *ctx, size_t len, void **p)
{
    int fd;
    uint64_t off;
    struct stat st;
    cr_assert_eq(cfx__arena_alloc(ctx, len, p, &fd, &off), CFX_OK);
    cr_assert_eq(fstat(fd, &st), 0);
    return st.st_ino;
}

static void arena_give(struct cfx_context *ctx, void *p, bool taint)
{
    pthread_mutex_lock(&ctx->lock);
    if (taint)
        cfx__arena_taint(ctx, (char *)p + 100);
    cfx__arena_free(ctx, p);
    pthread_mutex_unlock(&ctx->lock);
}

/* Arena memory a peer may still write into (a get cut off without the
 * source's acknowledgement) is never handed out again: freed, its segment
 * is closed, not cached, so a new buffer shares neither pages nor memfd. */
Test(context, tainted_arena_segment_is_not_reused)
{
    struct cfx_context *a;
    cr_assert_eq(join(co.token, "shm", &a), CFX_OK, "%s", cfx_last_error());
    const size_t len = 1u << 20;
    void *p;

    /* untainted: freed and reused (the same segment comes back) */
    ino_t first = arena_take(a, len, &p);
    arena_give(a, p, false);
    ino_t again = arena_take(a, len, &p);
    cr_assert_eq(first, again, "a clean segment should be reused");

    /* tainted: a fresh memfd */
    arena_give(a, p, true);
    cr_assert_neq(arena_take(a, len, &p), again, "a tainted segment was handed out again");
    arena_give(a, p, false);
    cfx_context_destroy(a);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Freed segments of many sizes are cached up to a count, not only up to
 * 1 GiB, the oldest making room: each keeps its memfd open.  300 buffers of growing sizes, each
 * freed before the next (none fits the next: a cached segment is reused
 * only up to twice the size asked), kept 300 descriptors open before (a
 * worker putting task results ran out of them at its limit of 128). */
Test(context, freed_arena_segments_are_cached_up_to_a_count)
{
    struct cfx_context *a;
    cr_assert_eq(join(co.token, "shm", &a), CFX_OK, "%s", cfx_last_error());
    int before = open_fds();
    ino_t last = 0;
    void *p;
    for (size_t i = 1; i <= 300; i++) {
        last = arena_take(a, i * 4096, &p);
        arena_give(a, p, false);
    }
    int grew = open_fds() - before;
    cr_assert_leq(grew, 64, "%d more descriptors open after 300 freed buffers", grew);
    /* the cache keeps the latest: the last size comes back from it */
    cr_assert_eq(arena_take(a, 300 * 4096, &p), last, "the segment freed last was not kept");
    arena_give(a, p, false);
    cfx_context_destroy(a);
}

/* ---- destroy while other threads are blocked in calls ---------------------------- */

#define INFLIGHT_MS 60000 /* the blocked calls' own deadline: far past the destroy */

struct inflight {
    pthread_t th;
    int kind;                   /* 0 get, 1 group recv, 2 allreduce */
    struct cfx_context *ctx;
    struct cfx_group *g;
    int rc;
    double secs;                /* how long the call took */
    char err[512];
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *inflight_main(void *arg)
{
    struct inflight *f = arg;
    static uint8_t buf[3][4096];
    struct cfx_obj_params op = { .field_mask = CFX_OBJ_PARAM_TIMEOUT, .timeout_ms = INFLIGHT_MS };
    struct cfx_coll_params cp = { .field_mask = CFX_COLL_PARAM_TIMEOUT,
                                  .timeout_ms = INFLIGHT_MS };
    struct cfx_object_id id;
    cfx_object_id_from_name("inflight/nobody-puts-this", &id);
    double t0 = mono_s();
    switch (f->kind) {
    case 0:
        f->rc = cfx_get(f->ctx, &id, buf[0], sizeof(buf[0]), NULL, &op);
        break;
    case 1:
        f->rc = cfx_group_recv(f->g, buf[1], 64, 1, 5, &cp);
        break;
    default:
        f->rc = cfx_group_allreduce(f->g, buf[2], buf[2] + 2048, 16, CFX_DTYPE_F32, CFX_OP_SUM,
                                    &cp);
        break;
    }
    f->secs = mono_s() - t0;
    snprintf(f->err, sizeof(f->err), "%s", cfx_last_error());
    return NULL;
}

struct group_mk {
    struct cfx_context *ctx;
    const char *name;
    int rank;
    struct cfx_group *g;
    int rc;
};

static void *group_mk_main(void *arg)
{
    struct group_mk *m = arg;
    struct cfx_group_params gp = {
        .field_mask = CFX_GROUP_PARAM_NAME | CFX_GROUP_PARAM_RANK | CFX_GROUP_PARAM_SIZE |
                      CFX_GROUP_PARAM_TIMEOUT,
        .name = m->name, .rank = m->rank, .size = 2, .timeout_ms = INFLIGHT_MS,
    };
    m->rc = cfx_group_create(m->ctx, &gp, &m->g);
    return NULL;
}

/* Groups of two ranks: rank 0 on @p a, rank 1 on @p b. */
static void make_group(struct cfx_context *a, struct cfx_context *b, const char *name,
                       struct cfx_group **ga, struct cfx_group **gb)
{
    struct group_mk m[2] = { { .ctx = a, .name = name, .rank = 0 },
                             { .ctx = b, .name = name, .rank = 1 } };
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, group_mk_main, &m[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(m[i].rc, CFX_OK, "group %s rank %d: %s", name, i, cfx_errname(m[i].rc));
    }
    *ga = m[0].g;
    *gb = m[1].g;
}

static unsigned calls_in_flight(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    unsigned n = ctx->calls;
    pthread_mutex_unlock(&ctx->lock);
    return n;
}

/*
 * Three threads of node A are blocked: a get of an object nobody put (a
 * lookup parked in the coordinator), a group receive whose sender never
 * sends, an allreduce whose peer never calls; all with a 60 s deadline.
 * The main thread destroys A's context: each call returns
 * CFX_ERR_CANCELED saying the context is being destroyed (long before its
 * deadline), the destroy returns, and the groups of the destroyed context
 * refuse calls and can still be destroyed (no use of the freed context:
 * run under ASan).  Before, the destroy freed the coordinator connection
 * under the get (use after free) and the others waited out their deadline
 * on freed memory.
 */
Test(context, destroy_with_calls_in_flight)
{
    struct cfx_context *a = NULL, *b = NULL;
    cr_assert_eq(join(co.token, "tcp", &a), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, "tcp", &b), CFX_OK, "%s", cfx_last_error());
    struct cfx_group *ga_p2p, *gb_p2p, *ga_coll, *gb_coll;
    make_group(a, b, "inflight-p2p", &ga_p2p, &gb_p2p);
    make_group(a, b, "inflight-coll", &ga_coll, &gb_coll);

    static struct inflight f[3];
    for (int i = 0; i < 3; i++) {
        f[i] = (struct inflight){ .kind = i, .ctx = a, .g = i == 1 ? ga_p2p : ga_coll };
        cr_assert_eq(pthread_create(&f[i].th, NULL, inflight_main, &f[i]), 0);
    }
    /* all three inside their calls */
    uint64_t dl = cfx__deadline_ns(20000);
    while (calls_in_flight(a) < 3 && cfx__now_ns() < dl)
        usleep(1000);
    cr_assert_eq(calls_in_flight(a), 3, "the calls did not start");

    double t0 = mono_s();
    cfx_context_destroy(a);
    double td = mono_s() - t0;
    cr_log_info("destroy with 3 calls in flight: %.3f s", td);
    const char *names[3] = { "get", "group recv", "allreduce" };
    for (int i = 0; i < 3; i++) {
        pthread_join(f[i].th, NULL);
        cr_expect_eq(f[i].rc, CFX_ERR_CANCELED, "%s: %s (%s)", names[i], cfx_errname(f[i].rc),
                     f[i].err);
        cr_expect(strstr(f[i].err, "being destroyed"), "%s: the error does not say why: %s",
                  names[i], f[i].err);
        cr_expect_lt(f[i].secs, INFLIGHT_MS / 1000.0, "%s ran to its deadline", names[i]);
    }
    cr_expect_lt(td, INFLIGHT_MS / 1000.0, "the destroy waited for the calls' deadline");

    /* the groups outlive their context: calls refused, destroy frees them */
    float v[4] = { 0 };
    int rc = cfx_group_allreduce(ga_coll, v, v, 4, CFX_DTYPE_F32, CFX_OP_SUM, NULL);
    cr_expect_eq(rc, CFX_ERR_CANCELED, "allreduce on a group of a destroyed context: %s",
                 cfx_errname(rc));
    cr_expect(strstr(cfx_last_error(), "context was destroyed"), "%s", cfx_last_error());
    struct cfx_request *req = NULL;
    rc = cfx_group_iallreduce(ga_coll, v, v, 4, CFX_DTYPE_F32, CFX_OP_SUM, NULL, &req);
    cr_expect_eq(rc, CFX_ERR_CANCELED, "iallreduce: %s", cfx_errname(rc));
    cr_expect_null(req);
    cfx_group_destroy(ga_p2p);
    cfx_group_destroy(ga_coll);

    cfx_group_destroy(gb_p2p);
    cfx_group_destroy(gb_coll);
    cfx_context_destroy(b);
}

static void *group_destroy_main(void *g)
{
    cfx_group_destroy(g);
    return NULL;
}

/* A group destroyed on one thread while its context is destroyed on
 * another, both at once, many times: whichever comes first tears the
 * group's context side down, the other waits for it; nothing is freed
 * twice or used after (ASan). */
Test(context, group_and_context_destroyed_at_once)
{
    for (int round = 0; round < 8; round++) {
        struct cfx_context *a = NULL, *b = NULL;
        cr_assert_eq(join(co.token, "tcp", &a), CFX_OK, "%s", cfx_last_error());
        cr_assert_eq(join(co.token, "tcp", &b), CFX_OK, "%s", cfx_last_error());
        struct cfx_group *ga, *gb;
        make_group(a, b, "both-at-once", &ga, &gb);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, group_destroy_main, ga), 0);
        cfx_context_destroy(a);
        pthread_join(th, NULL);
        cfx_group_destroy(gb);
        cfx_context_destroy(b);
    }
}

/*
 * The destroy's bound: a call that never leaves (entered by hand here, as
 * a call stuck outside every wait the destroy can end) makes the destroy
 * give up after CFX_DESTROY_DRAIN_MS and leave the context allocated, never
 * freed under the call; the context's group is left too, and its destroy
 * returns instead of waiting for a detach that will not come.  The context
 * refuses new calls; the stuck call can still leave.  (Both stay allocated
 * on purpose: static pointers keep them reachable for the leak check.)
 */
static struct cfx_context *abandoned_ctx;
static struct cfx_group *abandoned_group;

Test(context, destroy_gives_up_on_a_stuck_call)
{
    struct cfx_context *b = NULL;
    cr_assert_eq(join(co.token, "tcp", &abandoned_ctx), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(join(co.token, "tcp", &b), CFX_OK, "%s", cfx_last_error());
    struct cfx_group *gb;
    make_group(abandoned_ctx, b, "stuck", &abandoned_group, &gb);
    cr_assert_eq(cfx__ctx_enter(abandoned_ctx, "a stuck call"), CFX_OK);

    cfx_context_destroy(abandoned_ctx); /* returns after the bound */
    pthread_mutex_lock(&abandoned_ctx->lock);
    cr_expect(abandoned_ctx->closing && abandoned_ctx->calls == 1,
              "the context was not left as it was");
    pthread_mutex_unlock(&abandoned_ctx->lock);
    cfx_group_destroy(abandoned_group); /* returns; the group stays allocated */
    struct cfx_object_id id;
    uint8_t byte;
    cfx_object_id_from_name("stuck/nobody", &id);
    int rc = cfx_get(abandoned_ctx, &id, &byte, 1, NULL, NULL);
    cr_expect_eq(rc, CFX_ERR_CANCELED, "a call after the destroy gave up: %s", cfx_errname(rc));
    cr_expect_eq(cfx__ctx_leave(abandoned_ctx, CFX_OK), CFX_OK);

    cfx_group_destroy(gb);
    cfx_context_destroy(b);
}

/* The first WARN line in log file @p path that a coordinator's own files
 * (coord*.c) did not write, or NULL (malloc'd). */
static char *client_warning(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char line[1024], *found = NULL;
    while (!found && fgets(line, sizeof(line), f))
        if (strstr(line, " WARN ") && !strstr(line, " coord.c:") && !strstr(line, " coord_"))
            found = strdup(line);
    fclose(f);
    return found;
}

/*
 * A coordinator that stops in order says so (EV_STOPPING) before its end
 * of the connection closes: its clients log that at INFO and reconnect,
 * and print no "lost the coordinator" warning (a Ray job's end printed one
 * in every actor).  A connection that ends without that goodbye is still a
 * warning.
 */
Test(context, orderly_coordinator_stop_is_not_a_failure)
{
    char path[] = "/tmp/cfx-test-stop-XXXXXX";
    int fd;
    int saved = cfx_test_stderr_to(path, &fd);
    int level = cfx__log_level;
    cfx__log_level = CFX_LOG_LEVEL_INFO;

    /* a connection cut without a goodbye: a warning */
    struct cfx_context *a = NULL;
    cr_assert_eq(join(co.token, "tcp", &a), CFX_OK, "%s", cfx_last_error());
    shutdown(a->ctl->fd, SHUT_RDWR);
    uint64_t end = cfx__deadline_ns(10000);
    while (cfx__ctl_lost_ms(a->ctl) == 0 && cfx__now_ns() < end)
        poll(NULL, 0, 5);
    int cut_seen = cfx__ctl_lost_ms(a->ctl) > 0;
    cfx_context_destroy(a);
    fflush(stderr);
    int warned = cfx_test_file_contains(path, "lost the coordinator");

    /* the coordinator stops in order: no warning */
    struct cfx_coord *own = NULL;
    char own_addr[64], own_token[64];
    cr_assert_eq(cfx_test_coord_start(NULL, &own, own_token, sizeof(own_token), own_addr,
                                      sizeof(own_addr)),
                 CFX_OK, "coordinator: %s", cfx_last_error());
    struct cfx_context *b = NULL;
    cr_assert_eq(cfx_test_join(own_addr, own_token, "tcp", NULL, 5000, &b), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(ftruncate(fd, 0), 0);
    lseek(fd, 0, SEEK_SET);
    cfx__coord_stop(own);
    end = cfx__deadline_ns(10000);
    while (cfx__ctl_lost_ms(b->ctl) == 0 && cfx__now_ns() < end)
        poll(NULL, 0, 5);
    int stop_seen = cfx__ctl_lost_ms(b->ctl) > 0;
    /* restarted on its port: the client is back, and says so at INFO */
    const char *colon = strrchr(own_addr, ':');
    struct cfx_coord_params rp = { .bind_addr = "127.0.0.1",
                                   .port = (uint16_t)atoi(colon ? colon + 1 : "0"),
                                   .token = own_token };
    cr_assert_eq(cfx__coord_start(&rp, &own), CFX_OK, "restart: %s", cfx_last_error());
    end = cfx__deadline_ns(20000);
    while (cfx__ctl_lost_ms(b->ctl) != 0 && cfx__now_ns() < end)
        poll(NULL, 0, 10);
    int back = cfx__ctl_lost_ms(b->ctl) == 0;
    cfx_context_destroy(b);
    cfx__coord_stop(own);
    cfx__log_level = level;
    cfx_test_stderr_back(saved);
    close(fd);
    cr_assert(cut_seen, "the client did not notice its cut connection");
    cr_assert(warned, "a cut connection was not reported as lost");
    cr_assert(stop_seen, "the client did not notice its coordinator stop");
    char what[128];
    snprintf(what, sizeof(what), "coordinator %s is stopping", own_addr);
    cr_assert(cfx_test_file_contains(path, what), "no goodbye logged: '%s' missing", what);
    snprintf(what, sizeof(what), "coordinator %s stopped; reconnecting", own_addr);
    cr_assert(cfx_test_file_contains(path, what), "no orderly stop logged: '%s' missing", what);
    cr_assert(!cfx_test_file_contains(path, "lost the coordinator"),
              "an orderly stop was reported as a lost coordinator");
    cr_assert(back, "the client did not reconnect to the restarted coordinator");
    cr_assert(cfx_test_file_contains(path, "reconnected to coordinator"), "no reconnect logged");
    /* the client's warnings; the two in-process coordinators' own (a loop
     * woken late on a paused machine says so at WARN) are not the client's */
    char *warn = client_warning(path);
    cr_assert(!warn, "a warning after a stop in order: %s", warn ? warn : "");
    unlink(path);
}

/*
 * The context's transports: which it opens and which it says it does not
 * (a port or transport asked for that goes unused is a warning; the only
 * one named failing is the error), and a connect that fails falling back
 * to the next transport both sides share.  (Split from test_context.c.)
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/conflux.h>

#include "control/coord.h"
#include "dataplane/engine/engine.h"
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
 * A connect that fails falls back to the next transport both sides share:
 * with CFX_TEST_CONNECT_BREAK=shm the getter's shm connection goes where
 * nobody listens (and fails as one to an unreachable peer does), and the
 * get still returns every byte, over tcp.  Before, the connection failed and
 * the get with it (the one holder shares tcp as well).
 */
Test(context, failed_connect_falls_back_to_the_next_transport)
{
    const size_t size = (1u << 20) + 13;
    struct cfx_context *a, *b;
    cr_assert_eq(join(co.token, "shm,tcp", &a), CFX_OK, "%s", cfx_last_error());
    setenv("CFX_TEST_CONNECT_BREAK", "shm", 1);
    int rc = join(co.token, "shm,tcp", &b);
    unsetenv("CFX_TEST_CONNECT_BREAK");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());

    struct cfx_object_id id;
    cfx_object_id_generate(a, &id);
    uint8_t *src = malloc(size), *dst = malloc(size);
    cfx_test_fill(src, size, 7);
    cr_assert_eq(cfx_put(a, &id, src, size, NULL), CFX_OK, "%s", cfx_last_error());
    size_t got = 0;
    cr_assert_eq(cfx_get(b, &id, dst, size, &got, NULL), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(got, size);
    cr_assert_eq(cfx_test_check(dst, size, 7), (size_t)-1, "bytes differ");

    /* the connection that carried it is b's outbound one to a, over tcp */
    pthread_mutex_lock(&b->lock);
    const struct cfx_transport_ops *used = NULL;
    struct cfx_list *pos;
    cfx_list_for_each(pos, &b->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->outbound && c->node_id == a->node_id && c->state == CFX_CONN_READY)
            used = b->tp[c->tp].ops;
    }
    pthread_mutex_unlock(&b->lock);
    cr_assert_not_null(used, "no connection from b to a");
    cr_assert_str_eq(used->name, "tcp");

    free(src);
    free(dst);
    cfx_context_destroy(b);
    cfx_context_destroy(a);
}

/* join() over @p tps with stderr captured: the context into *@p a, its
 * status returned (its text kept in cfx_last_error()); the lines of what it
 * logged that hold @p needle into *@p lines. */
static int join_logged(const char *tps, struct cfx_context **a, const char *needle, int *lines)
{
    char path[] = "/tmp/cfx-test-tplog-XXXXXX", err[1024];
    int fd;
    int saved = cfx_test_stderr_to(path, &fd);
    int rc = join(co.token, tps, a);
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    fflush(stderr);
    *lines = cfx_test_lines_with(path, needle);
    cfx_test_stderr_back(saved);
    close(fd);
    unlink(path);
    if (rc != CFX_OK)
        cfx__err(rc, "%s", err); /* what the join said, not what the capture did */
    return rc;
}

/* A DPDK port asked for (CFX_DPDK_VDEV) while dpdk is not among the
 * transports, as after a misspelt CFX_TRANSPORT: a warning says so and how
 * to ask for dpdk.  Before, the context came up over tcp without a word. */
Test(context, dpdk_port_without_dpdk_transport_warns)
{
    setenv("CFX_DPDK_VDEV", "net_memif0,role=server,socket=cfx-test-unused", 1);
    struct cfx_context *a = NULL;
    int warned;
    int rc = join_logged("tcp", &a, "CFX_DPDK_VDEV is set, but the transports are 'tcp'", &warned);
    unsetenv("CFX_DPDK_VDEV");
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    cfx_context_destroy(a);
    cr_assert(warned, "no warning that CFX_DPDK_VDEV goes unused");
}

/* A transport the user named (not the default list) that is not available
 * here is a warning naming it: with CFX_TRANSPORT=dpdk,tcp and a port that
 * would not open, the job ran over tcp with the reason at INFO alone.
 * verbs stands for it: built here, with no RDMA device on the test host. */
Test(context, named_transport_not_available_warns)
{
    if (!cfx__transport_find("verbs"))
        cr_skip_test("built without verbs");
    struct cfx_context *a = NULL;
    int warned;
    int rc = join_logged("verbs,tcp", &a, "transport verbs (CFX_TRANSPORT=verbs,tcp) not "
                         "available here, the others are used", &warned);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    char buf[2048];
    cr_assert_gt(cfx_context_config(a, buf, sizeof(buf)), 0);
    cfx_context_destroy(a);
    if (strstr(buf, "transports = verbs"))
        cr_skip_test("an RDMA device is here: verbs opened");
    cr_assert(warned, "no warning that verbs, named, is not used");
}

/* "^LIST" is the default list (shm,verbs,tcp) less those: "^shm" opens tcp
 * (and verbs where a device is), never dpdk, and warns of nothing (a
 * transport of the default that is missing here is no news); excluding
 * all of the default leaves none.  Before, "^shm" took every transport
 * built but shm: each process started DPDK's EAL and warned that verbs and
 * dpdk were not available here. */
Test(context, an_exclusion_is_the_default_less_those)
{
    struct cfx_context *a = NULL;
    int warned;
    int rc = join_logged("^shm", &a, " WARN ", &warned);
    cr_assert_eq(rc, CFX_OK, "%s", cfx_last_error());
    char buf[2048];
    cr_assert_gt(cfx_context_config(a, buf, sizeof(buf)), 0);
    cfx_context_destroy(a);
    const char *line = strstr(buf, "transports = ");
    char got[96] = "";
    cr_assert(line && sscanf(line, "%95[^\n]", got) == 1, "%s", buf);
    cr_assert(!strcmp(got, "transports = tcp (requested ^shm)") ||
              !strcmp(got, "transports = verbs,tcp (requested ^shm)"), "%s", got);
    cr_assert_eq(warned, 0, "%d warnings", warned);

    rc = join(co.token, "^shm,verbs,tcp", &a);
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert(strstr(cfx_last_error(), "no usable transport among '^shm,verbs,tcp'"), "%s",
              cfx_last_error());
}

/* The only transport named, not available: no warning that "the others are
 * used" (there are none); the context's error names the transport and why. */
Test(context, only_named_transport_not_available_is_the_error)
{
    if (!cfx__transport_find("verbs"))
        cr_skip_test("built without verbs");
    struct cfx_context *a = NULL;
    int warned;
    int rc = join_logged("verbs", &a, "the others are used", &warned);
    char err[1024];
    snprintf(err, sizeof(err), "%s", cfx_last_error());
    if (rc == CFX_OK) {
        cfx_context_destroy(a);
        cr_skip_test("an RDMA device is here: verbs opened");
    }
    cr_assert_eq(rc, CFX_ERR_NO_DEVICE, "%s: %s", cfx_errname(rc), err);
    cr_assert(strstr(err, "no usable transport among 'verbs' (verbs: "), "%s", err);
    cr_assert(!warned, "a warning said other transports are used, with none named");
}

/*
 * cfx_task_wait()'s node_out when the wait ends with no answer from the
 * coordinator (the thread's interrupt check, here): the node the task was
 * placed on, as cfx_task_node() says.  It was left unwritten, so a caller
 * printed whatever its variable held (a new user's trial: "ran on node 0"
 * after a wait that failed with the coordinator gone, the task placed on
 * node 1).  An answer still gives the node that ran it.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define MAX_RANKS 2
#include "cluster_up.h"
#include "dataplane/common/util.h"

static atomic_int release_task;

/* Runs until the test lets it go (bounded), then puts its result. */
static int held_task(const struct cfx_task_call *call, void *arg)
{
    (void)arg;
    uint64_t dl = cfx__deadline_ns(30000);
    while (!atomic_load(&release_task) && cfx__now_ns() < dl)
        poll(NULL, 0, 5);
    static const uint8_t out[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    return cfx_task_result_put(call, 0, out, sizeof(out));
}

static int interrupt_now(void *arg)
{
    (void)arg;
    return 1;
}

Test(task_wait, node_out_when_no_answer_came, .timeout = 60)
{
    up("tcp", 2);
    cr_assert_eq(cfx_task_register(ctxs[0], "held", held_task, NULL), CFX_OK, "%s",
                 cfx_last_error());
    struct cfx_object_id res;
    memset(&res, 0xE5, sizeof(res));
    struct cfx_task *t = NULL;
    cr_assert_eq(cfx_task_submit(ctxs[1], "held", NULL, 0, &res, 1, NULL, NULL, &t), CFX_OK,
                 "%s", cfx_last_error());
    uint32_t placed = cfx_task_node(t);
    cr_assert_eq(placed, cfx_context_node_id(ctxs[0]));

    /* interrupted: no answer came */
    uint32_t node = 0xdeadbeef;
    cfx_set_interrupt_check(interrupt_now, NULL);
    int rc = cfx_task_wait(t, 20000, &node);
    cfx_set_interrupt_check(NULL, NULL);
    cr_assert_eq(rc, CFX_ERR_CANCELED, "%s: %s", cfx_errname(rc), cfx_last_error());
    cr_assert_eq(node, placed, "node_out %#x, want %u", node, placed);

    /* answered: the node that ran it */
    atomic_store(&release_task, 1);
    node = 0xdeadbeef;
    cr_assert_eq(cfx_task_wait(t, 20000, &node), CFX_OK, "%s", cfx_last_error());
    cr_assert_eq(node, placed, "node_out %#x, want %u", node, placed);
    uint8_t got[8];
    size_t n = 0;
    cr_assert_eq(cfx_get(ctxs[1], &res, got, sizeof(got), &n, NULL), CFX_OK, "%s",
                 cfx_last_error());
    cr_assert_eq(n, sizeof(got));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], i + 1, "byte %zu", i);
    cfx_task_free(t);
    down(2);
}

/*
 * A parameter-server member checks what a peer's header says before it
 * acts on it: a block's state for a block of no map is refused without a
 * table grown to the block's id (0xFFFFFFFF wrapped the size to 0 and read
 * far past the table; 1e8 kept 800 MB).  A server handle built by hand around a map, no network: the messages go
 * straight to its handler.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dataplane/ps/ps_int.h"

static struct cfx_ps *ps;

static void setup(void)
{
    ps = calloc(1, sizeof(*ps));
    cr_assert(ps);
    ps->role = CFX_PS_SERVER;
    ps->index = 1;
    strcpy(ps->job, "input");
    pthread_mutex_init(&ps->lock, NULL);
    pthread_cond_init(&ps->cond, NULL);
    cfx_list_init(&ps->tx);
    cfx_list_init(&ps->orphans);
    cfx__ps_map_init(&ps->map);
    ps->map.version = 1;
    ps->map.conf.block_size = 4096;
    ps->map.nworkers = 1;
    ps->map.nservers = 2;
    ps->map.server[0].state = ps->map.server[1].state = CFX_PS_SERVER_ACTIVE;
    /* 4 blocks of 1024 floats */
    cr_assert_geq(cfx__ps_map_add_tensor(&ps->map, "w", CFX_DTYPE_F32, 4096, NULL), 0);
}

static void teardown(void)
{
    cfx__ps_server_free(ps);
    cfx__ps_map_free(&ps->map);
    pthread_cond_destroy(&ps->cond);
    pthread_mutex_destroy(&ps->lock);
    free(ps);
}

TestSuite(ps_input, .init = setup, .fini = teardown);

static int state_msg(uint32_t block, size_t len)
{
    void *payload = calloc(1, len);
    cr_assert(payload);
    struct ps_hdr h = { .magic = PS_MAGIC, .type = PS_MSG_STATE,
                        .from = PS_ID(CFX_PS_SERVER, 0), .block = block, .len = len,
                        .map_version = 1 };
    return cfx__ps_server_handle(ps, &h, payload, true);
}

Test(ps_input, state_of_a_block_of_no_map_is_refused)
{
    cr_assert_eq(state_msg(0xFFFFFFFFu, 256), CFX_ERR_PROTO);
    cr_assert_eq(state_msg(100000000u, 256), CFX_ERR_PROTO);
    cr_assert_eq(state_msg(ps->map.nblocks, 256), CFX_ERR_PROTO);
    cr_assert_eq(ps->nblocks_cap, 0, "the block table grew to %u slots", ps->nblocks_cap);
}

/* A worker's non-blocking call given no place for its request is refused
 * as such; it said "not a worker handle", of a worker's handle. */
Test(ps_input, null_request_pointer_is_named)
{
    const float g[4] = { 0 };
    float out[4];
    struct cfx_ps_request *req = NULL;
    ps->role = CFX_PS_WORKER;
    int rc[3] = { cfx_ps_ipush(ps, 0, g, NULL), cfx_ps_ipull(ps, 0, out, NULL),
                  cfx_ps_ipushpull(ps, 0, g, out, NULL) };
    for (int i = 0; i < 3; i++)
        cr_assert_eq(rc[i], CFX_ERR_INVALID, "call %d: %s", i, cfx_errname(rc[i]));
    cr_assert(strstr(cfx_last_error(), "job input: NULL request pointer"), "%s",
              cfx_last_error());
    ps->role = CFX_PS_SERVER;
    cr_assert_eq(cfx_ps_ipull(ps, 0, out, &req), CFX_ERR_INVALID);
    cr_assert(strstr(cfx_last_error(), "not a worker handle"), "%s", cfx_last_error());
    cr_assert_null(req);
}

/* The scheduler's word that the job did not start (PS_MSG_ABORT) is a
 * peer's: its status must be a failure (else CFX_ERR_PROTO), its text is
 * read up to the message's length, and a byte outside printable ASCII
 * reaches the error and the log as '?'. */
Test(ps_input, a_start_abort_is_taken_as_a_peer_text)
{
    ps->role = CFX_PS_WORKER;
    ps->index = 2;
    static const char why[] = "server 1 \x1b[31mdied\n\x7f\xff;rest unread";
    cfx__ps_start_aborted(ps, CFX_ERR_PEER_FAILED, why, strlen(why) - strlen(";rest unread"));
    cr_assert_eq(cfx__ps_lost_err(ps), CFX_ERR_PEER_FAILED);
    cr_assert_str_eq(cfx_last_error(),
                     "job input: worker 2: the job did not start: server 1 ?[31mdied???");
    ps->lost_status = 0; /* another job's handle, as it were */
    cfx__ps_start_aborted(ps, 7, NULL, 0);
    cr_assert_eq(cfx__ps_lost_err(ps), CFX_ERR_PROTO);
    cr_assert_str_eq(cfx_last_error(), "job input: worker 2: the job did not start: the scheduler "
                     "(server 0) gave up");
    ps->role = CFX_PS_SERVER; /* teardown frees a server's state */
    ps->index = 1;
}

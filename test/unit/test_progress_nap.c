/*
 * The progress thread's sleep decision (dataplane/engine/progress.c): a
 * transport that packets reach with no fd turning readable
 * (CFX_TP_CAP_BUSY_POLL, or no wait fd at all) is polled without a nap
 * while it has a live connection.  Checked on a context assembled by hand
 * with stand-in transports: no thread, no timing.
 */
#include <criterion/criterion.h>

#include <stdlib.h>

#include "dataplane/engine/engine.h"

TestSuite(progress_nap);

static const struct cfx_transport_ops fd_ops = { .version = CFX_TP_OPS_VERSION,
                                                 .name = "fake-fd" };
static const struct cfx_transport_ops busy_ops = { .version = CFX_TP_OPS_VERSION,
                                                   .name = "fake-busy",
                                                   .caps = CFX_TP_CAP_BUSY_POLL };

static struct cfx_context *ctx_new(void)
{
    struct cfx_context *ctx = calloc(1, sizeof(*ctx));
    cr_assert_not_null(ctx);
    cfx_list_init(&ctx->conns);
    cfx_list_init(&ctx->paced_uploads);
    ctx->tp[0] = (struct cfx_tp_slot){ .ops = &fd_ops, .fd = 5 };
    ctx->ntp = 1;
    return ctx;
}

static void conn_add(struct cfx_context *ctx, struct cfx_conn *c, int tp,
                     enum cfx_conn_state state)
{
    *c = (struct cfx_conn){ .ctx = ctx, .tp = tp, .state = state };
    cfx_list_add_tail(&c->link, &ctx->conns);
}

Test(progress_nap, fd_transports_sleep_long)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c;
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_MS);
    conn_add(ctx, &c, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_MS,
                 "an fd wakes the thread for this one's packets");
    free(ctx);
}

Test(progress_nap, busy_poll_transport_with_a_connection_never_naps)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c0, c1;
    ctx->tp[1] = (struct cfx_tp_slot){ .ops = &busy_ops, .fd = 7 };
    ctx->ntp = 2;

    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS,
                 "an idle busy-polled iface is looked at often (new peers)");
    conn_add(ctx, &c0, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS);
    conn_add(ctx, &c1, 1, CFX_CONN_CONNECTING);
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0, "packets may arrive: no nap");
    c1.state = CFX_CONN_READY;
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0);
    c1.state = CFX_CONN_FAILED;
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS,
                 "a failed connection receives nothing");
    free(ctx);
}

Test(progress_nap, transport_without_a_wait_fd_is_busy_polled)
{
    struct cfx_context *ctx = ctx_new();
    struct cfx_conn c;
    ctx->tp[0].fd = -1; /* iface_fd said -1 */
    conn_add(ctx, &c, 0, CFX_CONN_READY);
    cr_assert_eq(cfx__progress_nap_ms(ctx), 0);
    cfx_list_del(&c.link);
    cr_assert_eq(cfx__progress_nap_ms(ctx), CFX_PROGRESS_NAP_SHORT_MS);
    free(ctx);
}

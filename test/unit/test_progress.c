/*
 * The engine's thread rule (engine.h, transport.h): only the thread that
 * holds a context's progress lock calls its transports.  Builds with
 * CFX_THREAD_CHECKS (the default where tests are built) abort on a call
 * from any other thread; every other suite runs with that check on, and
 * this one shows that it fires.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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

TestSuite(progress, .init = setup, .fini = teardown, .timeout = 60);

static struct cfx_context *join(const char *tps)
{
    struct cfx_context_params p = {
        .field_mask = CFX_CTX_PARAM_COORD | CFX_CTX_PARAM_TOKEN | CFX_CTX_PARAM_TIMEOUT |
                      CFX_CTX_PARAM_TRANSPORTS,
        .coord = co.addr,
        .token = co.token,
        .timeout_ms = 5000,
        .transports = tps,
    };
    struct cfx_context *ctx = NULL;
    cr_assert_eq(cfx_context_create(&p, &ctx), CFX_OK, "%s", cfx_last_error());
    return ctx;
}

/* The progress-lock holder may call a transport; this thread, once it
 * holds the lock, may too. */
Test(progress, holder_may_call_a_transport)
{
    struct cfx_context *ctx = join("tcp");
    cfx__progress_lock(ctx);
    int rc = ctx->tp[0].ops->iface_arm(ctx->tp[0].iface);
    cr_expect(rc == CFX_OK || rc == CFX_ERR_AGAIN, "iface_arm: %s", cfx_errname(rc));
    pthread_mutex_lock(&ctx->lock);
    cfx__progress_wake(ctx); /* it re-arms after our arm */
    pthread_mutex_unlock(&ctx->lock);
    cfx__progress_unlock(ctx);
    cfx_context_destroy(ctx);
}

#ifdef CFX_THREAD_CHECKS
/* An API thread that calls a transport without the progress lock is
 * stopped at the transport's door. */
Test(progress, api_thread_transport_call_aborts, .signal = SIGABRT)
{
    struct cfx_context *ctx = join("tcp");
    ctx->tp[0].ops->iface_arm(ctx->tp[0].iface);
    cr_assert_fail("a transport call from an API thread went through");
}
#else
Test(progress, api_thread_transport_call_aborts)
{
    cr_skip_test("built without CFX_THREAD_CHECKS: transports do not check the calling thread");
}
#endif

/* The library's threads carry names (top -H, ps -L, gdb, perf show them):
 * a context's progress thread and coordinator client thread, and the
 * embedded coordinator's thread, are among this process's threads. */
static bool thread_named(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char path[300], comm[32] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        if (fgets(comm, sizeof(comm), f))
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        found = strcmp(comm, name) == 0;
    }
    closedir(d);
    return found;
}

Test(progress, the_library_threads_are_named)
{
    struct cfx_context *ctx = join("tcp");
    static const char *const names[] = { "cfx-progress", "cfx-ctl", "cfx-coord" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        cr_expect(thread_named(names[i]), "no thread named %s", names[i]);
    cfx_context_destroy(ctx);
}

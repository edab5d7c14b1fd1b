/*
 * cfx_pstest: rdmactl's view of a job (pstest.h).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "pstest.h"
#include "test/common/testutil.h"

/* The output of "@p rdmactl [--json] ps --job @p job shards" (rc: its exit status). */
static char *rdmactl_shards(const char *rdmactl, const char *job, bool json, int *rc)
{
    static char out[16384];
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s%s ps --job %s shards 2>&1", rdmactl, json ? " --json" : "",
             job);
    FILE *f = popen(cmd, "r");
    if (!f)
        CFX_TEST_DIE("popen(%s): %s", cmd, strerror(errno));
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    return out;
}

void pstest_rdmactl_says_failed(const char *rdmactl, const char *job, int k,
                                const struct cfx_ps_server_info *x)
{
    char row[128], note[256], bytes[32], json[160];
    int rc;
    snprintf(row, sizeof(row), "\n%6d %6u %-9s %7u ", k, x->node_id, "failed", x->blocks);
    static const char *const unit[] = { "B", "KiB", "MiB", "GiB" }; /* as rdmactl's */
    double d = (double)x->bytes;
    unsigned u = 0;
    for (; d >= 1024 && u < 3; u++)
        d /= 1024;
    if (u)
        snprintf(bytes, sizeof(bytes), "%.1f %s", d, unit[u]);
    else
        snprintf(bytes, sizeof(bytes), "%llu B", (unsigned long long)x->bytes);
    snprintf(note, sizeof(note), "\nserver %d (node %u) failed: its %u blocks (%s) are not "
             "served; requests for them fail naming it\n", k, x->node_id, x->blocks, bytes);
    const char *text = rdmactl_shards(rdmactl, job, false, &rc);
    if (rc || !strstr(text, row) || !strstr(text, note))
        CFX_TEST_DIE("rdmactl ps shards (exit %d) does not say '%s' and '%s':\n%s", rc, row + 1,
            note + 1, text);
    printf("worker 0: rdmactl ps shards says: %s", note + 1);
    snprintf(json, sizeof(json), "{\"index\":%d,\"node\":%u,\"state\":\"failed\",\"blocks\":%u,"
             "\"bytes\":%llu,", k, x->node_id, x->blocks, (unsigned long long)x->bytes);
    text = rdmactl_shards(rdmactl, job, true, &rc);
    if (rc || !strstr(text, json))
        CFX_TEST_DIE("rdmactl --json ps shards (exit %d) does not say '%s':\n%s", rc, json, text);
}

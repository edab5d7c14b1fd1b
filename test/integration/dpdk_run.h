/* The integration tests' way to run a program on two ranks over dpdk
 * (CFX_BIN_DIR: the build's bin directory, from the test's compile line). */
#ifndef CFX_TEST_DPDK_RUN_H
#define CFX_TEST_DPDK_RUN_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef CFX_HAVE_DPDK
/*
 * dpdk between two processes: each rank its own EAL and one net_memif port
 * (CFX_DPDK_VDEV), rank 0 the memif server, rank 1 the client, on a socket
 * in a fresh directory (memif joins two ports, so two ranks).  cfx_run
 * starts the program through sh, which picks the role from CFX_RANK.
 */
/* A rank's EAL start (256 MB of memory mapped and touched, no huge pages)
 * can take tens of seconds on a loaded machine while the other rank already
 * waits on it: the ranks' deadlines (CFX_TIMEOUT_MS, default 30 s) are
 * raised to 150 s here, under cfx_run's 200 s, so they end only a hang. */
static inline int run_dpdk(const char *env, const char *prog, const char *args)
{
    char dir[] = "/tmp/cfx_memif_XXXXXX", cmd[1536], sock[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/m.sock", dir);
    snprintf(cmd, sizeof(cmd),
             "CFX_TIMEOUT_MS=150000 %s %s/cfx_run -n 2 --transport dpdk --timeout 200 /bin/sh -c "
             "'if [ \"$CFX_RANK\" "
             "= 0 ]; then r=server; else r=client; fi; "
             "CFX_DPDK_VDEV=net_memif0,role=$r,socket=%s,id=0 exec %s/%s %s'",
             env, CFX_BIN_DIR, sock, CFX_BIN_DIR, prog, args);
    cr_log_info("%s", cmd);
    int st = system(cmd);
    unlink(sock);
    rmdir(dir);
    cr_assert(st != -1, "cannot run %s", cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
#endif

#endif /* CFX_TEST_DPDK_RUN_H */

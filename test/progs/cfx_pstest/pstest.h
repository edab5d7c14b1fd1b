/*
 * cfx_pstest's parts kept outside cfx_pstest.c (the program passed 1,500
 * lines): what checks rdmactl's view of a job.
 */
#ifndef CFX_TEST_PSTEST_H
#define CFX_TEST_PSTEST_H

#include <conflux/ps.h>

/* --rdmactl: "@p rdmactl ps --job @p job shards" names server @p k failed,
 * with its node and the blocks it held (@p x), which it says are not
 * served; so does its JSON.  Exits the program with a message otherwise. */
void pstest_rdmactl_says_failed(const char *rdmactl, const char *job, int k,
                                const struct cfx_ps_server_info *x);

#endif

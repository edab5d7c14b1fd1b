/*
 * CPU used by an idle rank: a context and a group, one allreduce to bring
 * the connections up, then 10 s of nothing; prints utime + stime from
 * /proc/self/stat over those 10 s (measurements; not part of the build).
 *
 *   cc -O2 -I include -I build/include -o /tmp/idle-cpu scripts/probes/idle-cpu.c \
 *       -L build/lib -lconflux -Wl,-rpath,$PWD/build/lib
 *   build/bin/cfx_run -n 2 -t shm /tmp/idle-cpu
 */
#include <conflux/conflux.h>
#include <stdio.h>
#include <unistd.h>
static unsigned long long cpu_ticks(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    unsigned long long ut = 0, st = 0;
    if (!f) return 0;
    if (fscanf(f, "%*d %*s %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) ut = st = 0;
    fclose(f);
    return ut + st;
}
int main(void)
{
    struct cfx_context *ctx;
    struct cfx_group *g;
    if (cfx_context_create(NULL, &ctx) || cfx_group_create(ctx, NULL, &g)) { fprintf(stderr, "%s\n", cfx_last_error()); return 1; }
    float x = 1, y;
    cfx_group_allreduce(g, &x, &y, 1, CFX_DTYPE_F32, CFX_OP_SUM, NULL);   /* the connections are up */
    sleep(1);
    unsigned long long t0 = cpu_ticks();
    sleep(10);
    unsigned long long t1 = cpu_ticks();
    long hz = sysconf(_SC_CLK_TCK);
    printf("idle 10 s: %llu ticks = %.2f%% of a core\n", t1 - t0, 100.0 * (double)(t1 - t0) / (double)hz / 10.0);
    cfx_group_destroy(g);
    cfx_context_destroy(ctx);
    return 0;
}

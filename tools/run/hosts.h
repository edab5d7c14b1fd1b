/*
 * cfx_run --hosts: the host list, where each rank goes, the remote shell and
 * the command line a remote rank is started with (hosts.c).  Every function
 * prints its own error, naming the option and the value, and returns -1.
 */
#ifndef CFX_TOOLS_RUN_HOSTS_H
#define CFX_TOOLS_RUN_HOSTS_H

#include <stdbool.h>
#include <stddef.h>

#define CFX_RUN_HOST_MAX  255  /* longest host name (ssh's user@host included) */
#define CFX_RUN_SLOTS_MAX 1024 /* most slots one host may declare */

struct cfx_run_host {
    char name[CFX_RUN_HOST_MAX + 1];
    int slots;  /* declared (1 without :SLOTS); repeats of a name add up */
    int nranks; /* placed on it */
};

struct cfx_run_hosts {
    struct cfx_run_host *v;
    int n;
    int total_slots;
};

/* "H1[:SLOTS],H2,...": no empty name, none starting with '-' (ssh would take
 * it for an option), SLOTS 1..CFX_RUN_SLOTS_MAX. */
int cfx__run_hosts_parse(const char *spec, struct cfx_run_hosts *out);
void cfx__run_hosts_free(struct cfx_run_hosts *h);

/* Place @p nranks by slot, as mpirun does by default: fill the first host's
 * slots, then the next host's...; with @p oversubscribe, ranks beyond the
 * slots go around the hosts again the same way.  host_of[r] and local_of[r]
 * (rank r's index among the ranks of its host). */
int cfx__run_hosts_place(struct cfx_run_hosts *h, int nranks, bool oversubscribe, int *host_of,
                         int *local_of);

/* The remote shell command (--rsh, $CFX_RSH, else "ssh -o BatchMode=yes")
 * split on blanks into a NULL-terminated vector; its program must be found
 * (in PATH, or the path given) and executable. */
char **cfx__run_rsh_split(const char *rsh);

/* The IPv4 address the coordinator binds and the hosts reach it at:
 * @p given (--coord-addr, a name or an address), else the address of the
 * interface CFX_SOCKET_IFNAME selects, else 127.0.0.1 when every host is
 * this one by name (localhost, 127.x), else the first non-loopback address
 * this host's name resolves to. */
int cfx__run_coord_addr(const char *given, const struct cfx_run_hosts *h, char *ip, size_t len);

/* The argv that starts one remote rank:
 *   RSH... HOST "exec sh -c 'WRAPPER' cfx_run 'VAR=VALUE'... 'CMD' 'ARG'..."
 * every word quoted for the remote shell.  WRAPPER reads the token's one
 * line from stdin into a new 0600 file, runs CMD with CFX_TOKEN_FILE naming
 * it, stops CMD when stdin ends (cfx_run gone or stopping the job), and
 * removes the file when CMD ends; it exits with CMD's status. */
char **cfx__run_remote_argv(char *const *rsh, const char *host, char *const *vars,
                            char *const *cmd);
void cfx__run_argv_free(char **v);

#endif

/*
 * cfx_run --hosts: parsing the host list, placing ranks, the remote shell
 * and the command a remote rank is started with.  See hosts.h.
 */
#include "hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <conflux/status.h>

#include "../args.h"
#include "dataplane/engine/engine.h"

#define RSH_DEFAULT "ssh -o BatchMode=yes" /* never waits for a password prompt */
#define RSH_WORDS_MAX 32

/*
 * Runs on the remote host under sh, as `sh -c WRAPPER cfx_run VAR=V... CMD ARG...`.
 * The token arrives as the first line on stdin (the rsh's stdin, a pipe from
 * cfx_run) and goes into a new 0600 file: it is never on a command line or
 * in an environment there.  stdin then stays open as a lifeline: when it
 * ends (cfx_run closed it to stop the job, or cfx_run or the connection
 * died) CMD gets SIGTERM, and SIGKILL 2 s later.  The shell waits for CMD,
 * removes the file and exits with CMD's status (128+SIG for a signal).
 * No single quote inside: the whole text is single-quoted for the remote
 * shell.
 */
static const char wrapper[] =
    "umask 077; d=${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}; [ -d \"$d\" ] && [ -w \"$d\" ] || d=/tmp; "
    "f=$(mktemp \"$d/cfx_run-token-XXXXXX\") || exit 126; "
    "if ! IFS= read -r t; then rm -f \"$f\"; echo \"cfx_run: no token on stdin\" >&2; "
    "exit 126; fi; "
    "printf \"%s\\n\" \"$t\" >\"$f\"; t=; "
    "exec 3<&0 0</dev/null; "
    "env CFX_TOKEN_FILE=\"$f\" \"$@\" 3<&- & p=$!; "
    "(while read -r l <&3; do :; done; kill -TERM $p; sleep 2; kill -KILL $p) "
    ">/dev/null 2>&1 & w=$!; "
    "exec 3<&-; "
    "trap \"kill -TERM $p 2>/dev/null\" HUP INT TERM; "
    "while :; do wait $p; rc=$?; kill -0 $p 2>/dev/null || break; done; "
    "kill $w 2>/dev/null; rm -f \"$f\"; exit $rc";

static bool host_char_ok(char c)
{
    return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_' || c == '@';
}

int cfx__run_hosts_parse(const char *spec, struct cfx_run_hosts *out)
{
    const char *p = spec;

    memset(out, 0, sizeof(*out));
    if (!*spec) {
        fprintf(stderr, "cfx_run: --hosts: '' is not a host list (H1[:SLOTS],H2,...)\n");
        return -1;
    }
    for (;;) {
        const char *end = strchr(p, ','), *colon;
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[CFX_RUN_HOST_MAX + 16];
        int slots = 1;

        if (len == 0) {
            fprintf(stderr, "cfx_run: --hosts: '%s' has an empty host name\n", spec);
            goto err;
        }
        if (len >= sizeof(item)) {
            fprintf(stderr, "cfx_run: --hosts: '%.*s' is longer than %d characters\n", (int)len,
                    p, CFX_RUN_HOST_MAX);
            goto err;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        colon = strchr(item, ':');
        if (colon) {
            item[colon - item] = '\0';
            if (tool_arg_int("cfx_run", "--hosts", colon + 1, 1, CFX_RUN_SLOTS_MAX,
                             "a number of slots", &slots))
                goto err;
        }
        if (!item[0]) {
            fprintf(stderr, "cfx_run: --hosts: '%s' has an empty host name\n", spec);
            goto err;
        }
        if (strlen(item) > CFX_RUN_HOST_MAX) {
            fprintf(stderr, "cfx_run: --hosts: '%s' is longer than %d characters\n", item,
                    CFX_RUN_HOST_MAX);
            goto err;
        }
        if (item[0] == '-') {
            fprintf(stderr, "cfx_run: --hosts: '%s' starts with '-' (the remote shell would "
                    "take it for an option)\n", item);
            goto err;
        }
        for (const char *c = item; *c; c++) {
            if (!host_char_ok(*c)) {
                fprintf(stderr, "cfx_run: --hosts: '%s' is not a host name (letters, digits, "
                        "'.', '-', '_', user@host)\n", item);
                goto err;
            }
        }
        int i;
        for (i = 0; i < out->n; i++)
            if (!strcmp(out->v[i].name, item))
                break;
        if (i == out->n) {
            struct cfx_run_host *v = realloc(out->v, (size_t)(out->n + 1) * sizeof(*v));
            if (!v) {
                fprintf(stderr, "cfx_run: out of memory\n");
                goto err;
            }
            out->v = v;
            memset(&v[i], 0, sizeof(v[i]));
            /* checked above: at most CFX_RUN_HOST_MAX, which fits */
            snprintf(v[i].name, sizeof(v[i].name), "%.*s", (int)sizeof(v[i].name) - 1, item);
            out->n++;
        }
        if (out->v[i].slots + slots > CFX_RUN_SLOTS_MAX) {
            fprintf(stderr, "cfx_run: --hosts: host '%s' has more than %d slots\n", item,
                    CFX_RUN_SLOTS_MAX);
            goto err;
        }
        out->v[i].slots += slots;
        out->total_slots += slots;
        if (!end)
            return 0;
        p = end + 1;
    }
err:
    cfx__run_hosts_free(out);
    return -1;
}

void cfx__run_hosts_free(struct cfx_run_hosts *h)
{
    free(h->v);
    memset(h, 0, sizeof(*h));
}

int cfx__run_hosts_place(struct cfx_run_hosts *h, int nranks, bool oversubscribe, int *host_of,
                         int *local_of)
{
    if (nranks > h->total_slots && !oversubscribe) {
        fprintf(stderr, "cfx_run: -n: '%d' ranks, but the hosts have %d slot%s (a host "
                "without :SLOTS has one): give more slots or --oversubscribe\n", nranks,
                h->total_slots, h->total_slots == 1 ? "" : "s");
        return -1;
    }
    int r = 0;
    while (r < nranks) {
        for (int i = 0; i < h->n && r < nranks; i++) {
            for (int s = 0; s < h->v[i].slots && r < nranks; s++, r++) {
                host_of[r] = i;
                local_of[r] = h->v[i].nranks++;
            }
        }
    }
    return 0;
}

void cfx__run_argv_free(char **v)
{
    if (!v)
        return;
    for (size_t i = 0; v[i]; i++)
        free(v[i]);
    free(v);
}

/* Is @p prog an executable file, by path or found in PATH? */
static bool find_program(const char *prog)
{
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/bin:/bin";
    while (*path) {
        const char *end = strchrnul(path, ':');
        char full[4096];
        int n = snprintf(full, sizeof(full), "%.*s/%s", (int)(end - path),
                         end == path ? "." : path, prog);
        if (n > 0 && (size_t)n < sizeof(full) && access(full, X_OK) == 0)
            return true;
        path = *end ? end + 1 : end;
    }
    return false;
}

char **cfx__run_rsh_split(const char *rsh)
{
    const char *src = rsh;
    char **v = calloc(RSH_WORDS_MAX + 1, sizeof(*v));
    int n = 0;

    if (!rsh) {
        src = getenv("CFX_RSH");
        if (!src || !*src)
            src = RSH_DEFAULT;
    }
    if (!v) {
        fprintf(stderr, "cfx_run: out of memory\n");
        return NULL;
    }
    for (const char *p = src; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, " \t");
        if (n == RSH_WORDS_MAX) {
            fprintf(stderr, "cfx_run: --rsh: '%s' has more than %d words\n", src,
                    RSH_WORDS_MAX);
            goto err;
        }
        v[n] = strndup(p, len);
        if (!v[n]) {
            fprintf(stderr, "cfx_run: out of memory\n");
            goto err;
        }
        n++;
        p += len;
    }
    if (n == 0) {
        fprintf(stderr, "cfx_run: --rsh: '%s' is not a command\n", src);
        goto err;
    }
    if (!find_program(v[0])) {
        fprintf(stderr, "cfx_run: --rsh: '%s' is not an executable program%s%s\n", v[0],
                strchr(v[0], '/') ? "" : " in PATH", rsh ? "" : " (from $CFX_RSH or the default)");
        goto err;
    }
    return v;
err:
    cfx__run_argv_free(v);
    return NULL;
}

static bool is_local_name(const char *h)
{
    const char *at = strchr(h, '@');
    if (at)
        h = at + 1;
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4);
}

/* The first IPv4 address of @p name into @p ip; loopback ones only when
 * @p loopback_ok.  1 found, 0 none, -1 name unknown. */
static int resolve4(const char *name, bool loopback_ok, char *ip, size_t len)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    int found = 0;

    if (getaddrinfo(name, NULL, &hints, &res) != 0 || !res)
        return -1;
    for (struct addrinfo *a = res; a && !found; a = a->ai_next) {
        struct in_addr in = ((struct sockaddr_in *)a->ai_addr)->sin_addr;
        if (!loopback_ok && (ntohl(in.s_addr) >> 24) == 127)
            continue;
        found = inet_ntop(AF_INET, &in, ip, (socklen_t)len) != NULL;
    }
    freeaddrinfo(res);
    return found;
}

int cfx__run_coord_addr(const char *given, const struct cfx_run_hosts *h, char *ip, size_t len)
{
    const char *ifn = getenv("CFX_SOCKET_IFNAME");
    char name[256];
    bool all_local = true;

    if (given) {
        if (resolve4(given, true, ip, len) != 1) {
            fprintf(stderr, "cfx_run: --coord-addr: '%s' is not an IPv4 address or a name "
                    "that resolves to one\n", given);
            return -1;
        }
        return 0;
    }
    if (ifn && *ifn) {
        if (cfx__netif_pick("CFX_SOCKET_IFNAME", ifn, false, ip, len) != CFX_OK) {
            fprintf(stderr, "cfx_run: the coordinator's address: %s\n", cfx_last_error());
            return -1;
        }
        return 0;
    }
    for (int i = 0; i < h->n; i++)
        all_local = all_local && is_local_name(h->v[i].name);
    if (all_local) {
        snprintf(ip, len, "127.0.0.1");
        return 0;
    }
    if (gethostname(name, sizeof(name)) != 0)
        name[0] = '\0';
    name[sizeof(name) - 1] = '\0';
    if (!name[0] || resolve4(name, false, ip, len) != 1) {
        fprintf(stderr, "cfx_run: this host's name '%s' resolves to no address other hosts "
                "can reach (only loopback, or none): give --coord-addr ADDR or "
                "CFX_SOCKET_IFNAME\n", name);
        return -1;
    }
    return 0;
}

/* @p s single-quoted for a POSIX shell, appended to *@p buf (realloc'd). */
static int append_quoted(char **buf, size_t *len, size_t *cap, const char *s, bool quote)
{
    size_t need = *len + 4 * strlen(s) + 4;
    if (need > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < need)
            c *= 2;
        char *p = realloc(*buf, c);
        if (!p)
            return -1;
        *buf = p;
        *cap = c;
    }
    char *o = *buf + *len;
    if (*len)
        *o++ = ' ';
    if (quote)
        *o++ = '\'';
    for (; *s; s++) {
        if (quote && *s == '\'') {
            memcpy(o, "'\\''", 4); /* end the quote, an escaped ', start again */
            o += 4;
        } else {
            *o++ = *s;
        }
    }
    if (quote)
        *o++ = '\'';
    *o = '\0';
    *len = (size_t)(o - *buf);
    return 0;
}

char **cfx__run_remote_argv(char *const *rsh, const char *host, char *const *vars,
                            char *const *cmd)
{
    size_t nrsh = 0, len = 0, cap = 0;
    char *line = NULL, **v = NULL;
    int bad = 0;

    while (rsh[nrsh])
        nrsh++;
    bad |= append_quoted(&line, &len, &cap, "exec sh -c", false);
    bad |= append_quoted(&line, &len, &cap, wrapper, true);
    bad |= append_quoted(&line, &len, &cap, "cfx_run", false);
    for (size_t i = 0; vars[i]; i++)
        bad |= append_quoted(&line, &len, &cap, vars[i], true);
    for (size_t i = 0; cmd[i]; i++)
        bad |= append_quoted(&line, &len, &cap, cmd[i], true);
    v = calloc(nrsh + 3, sizeof(*v));
    if (bad || !v)
        goto err;
    for (size_t i = 0; i < nrsh; i++)
        if (!(v[i] = strdup(rsh[i])))
            goto err;
    if (!(v[nrsh] = strdup(host)))
        goto err;
    v[nrsh + 1] = line;
    return v;
err:
    fprintf(stderr, "cfx_run: out of memory\n");
    cfx__run_argv_free(v);
    free(line);
    return NULL;
}

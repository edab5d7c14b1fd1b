/*
 * cfx_run: the cluster token's file and the environment of each rank (local:
 * the variables in its environment; remote: the words on its command line).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataplane/common/util.h"
#include "run.h"

extern char **environ;

int cfx__run_random_token(char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[RUN_TOKEN_BYTES];
    size_t got = 0;
    int fd;

    if (len < 2 * sizeof(raw) + 1)
        return -1;
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "cfx_run: cannot open /dev/urandom: %s\n", strerror(errno));
        return -1;
    }
    while (got < sizeof(raw)) {
        ssize_t n = read(fd, raw + got, sizeof(raw) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "cfx_run: cannot read /dev/urandom: %s\n",
                    n < 0 ? strerror(errno) : "end of file");
            close(fd);
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    for (size_t i = 0; i < sizeof(raw); i++) {
        buf[2 * i] = hex[raw[i] >> 4];
        buf[2 * i + 1] = hex[raw[i] & 15];
    }
    buf[2 * sizeof(raw)] = '\0';
    return 0;
}

/*
 * Write @p token to a new file only we can read, in $XDG_RUNTIME_DIR (a
 * per-user tmpfs) or else $TMPDIR or /tmp; its path into @p path.  The ranks
 * get the path (CFX_TOKEN_FILE), never the value; main() removes it.
 */
int cfx__run_token_file_write(const char *token, char *path, size_t len)
{
    const char *dir = getenv("XDG_RUNTIME_DIR");
    if (!dir || !*dir || access(dir, W_OK) != 0)
        dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    if ((size_t)snprintf(path, len, "%s/cfx_run-token-XXXXXX", dir) >= len) {
        fprintf(stderr, "cfx_run: temporary directory name too long: %s\n", dir);
        return -1;
    }
    int fd = mkostemp(path, O_CLOEXEC); /* mode 0600 */
    if (fd < 0) {
        fprintf(stderr, "cfx_run: cannot create a token file in %s: %s\n", dir,
                strerror(errno));
        return -1;
    }
    size_t n = strlen(token);
    if (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || close(fd) != 0) {
        fprintf(stderr, "cfx_run: cannot write the token file %s: %s\n", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}

/* Variables cfx_run sets; inherited values of these are dropped. */
static bool env_overridden(const char *kv, const struct run_opts *o)
{
    static const char *const always[] = {
        "CFX_RANK=",  "CFX_LOCAL_RANK=", "CFX_WORLD_SIZE=",
        "CFX_COORD=", "CFX_TOKEN=",      "CFX_TOKEN_FILE=",
    };
    for (size_t i = 0; i < CFX_ARRAY_SIZE(always); i++)
        if (!strncmp(kv, always[i], strlen(always[i])))
            return true;
    if (o->transport && !strncmp(kv, "CFX_TRANSPORT=", 14))
        return true;
    if (o->chunk_size && !strncmp(kv, "CFX_CHUNK_SIZE=", 15))
        return true;
    return false;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : s;
}

/* Free an environment from build_env(): entries from @p own on are ours. */
void cfx__run_free_env(char **envp, size_t own)
{
    if (!envp)
        return;
    for (size_t i = own; envp[i]; i++)
        free(envp[i]);
    free(envp);
}

/* Build the environment of @p rank before forking: the child then only
 * calls async-signal-safe functions (the coordinator thread may hold locks).
 * *@p own is the index of the first entry allocated here. */
char **cfx__run_build_env(const struct run_opts *o, int rank, const char *coord,
                          const char *token_file, size_t *own, bool bare)
{
    size_t n = 0, i = 0;
    char **envp;
    char *add[7] = { NULL };
    int nadd = 0;

    while (environ[n])
        n++;
    envp = calloc(n + 9, sizeof(*envp));
    if (!envp)
        return NULL;
    for (size_t j = 0; j < n; j++)
        if (!env_overridden(environ[j], o))
            envp[i++] = environ[j];
    *own = i;
    if (bare) { /* a remote rank's rsh: the cluster's variables go on its command line */
        envp[i] = NULL;
        return envp;
    }
    add[nadd++] = xasprintf("CFX_RANK=%d", rank);
    add[nadd++] = xasprintf("CFX_LOCAL_RANK=%d", rank);
    add[nadd++] = xasprintf("CFX_WORLD_SIZE=%d", o->nranks);
    add[nadd++] = xasprintf("CFX_COORD=%s", coord);
    add[nadd++] = xasprintf("CFX_TOKEN_FILE=%s", token_file);
    if (o->transport)
        add[nadd++] = xasprintf("CFX_TRANSPORT=%s", o->transport);
    if (o->chunk_size)
        add[nadd++] = xasprintf("CFX_CHUNK_SIZE=%s", o->chunk_size);
    for (int k = 0; k < nadd; k++) {
        if (!add[k]) {
            for (int m = 0; m < nadd; m++)
                free(add[m]);
            free(envp);
            return NULL;
        }
        envp[i++] = add[k];
    }
    envp[i] = NULL;
    return envp;
}

/* Variables of this environment a remote rank gets too: CFX_* ones, but not
 * the token's, the rsh's, nor those that name this host's own addresses. */
static bool env_forwarded(const char *kv, const struct run_opts *o)
{
    static const char *const never[] = { "CFX_RSH=", "CFX_BIND_ADDR=", "CFX_COORD_PORT=" };
    if (strncmp(kv, "CFX_", 4) || env_overridden(kv, o))
        return false;
    for (size_t i = 0; i < CFX_ARRAY_SIZE(never); i++)
        if (!strncmp(kv, never[i], strlen(never[i])))
            return false;
    return true;
}

/* The NAME=VALUE words a remote rank is started with (its rsh command line:
 * no secret among them). */
char **cfx__run_remote_vars(const struct run_opts *o, int rank, int local,
                            const char *coord)
{
    size_t n = 0, i = 0;
    char **v;

    while (environ[n])
        n++;
    v = calloc(n + (size_t)o->nxvars + 8, sizeof(*v));
    if (!v)
        return NULL;
    v[i++] = xasprintf("CFX_RANK=%d", rank);
    v[i++] = xasprintf("CFX_LOCAL_RANK=%d", local);
    v[i++] = xasprintf("CFX_WORLD_SIZE=%d", o->nranks);
    v[i++] = xasprintf("CFX_COORD=%s", coord);
    if (o->transport)
        v[i++] = xasprintf("CFX_TRANSPORT=%s", o->transport);
    if (o->chunk_size)
        v[i++] = xasprintf("CFX_CHUNK_SIZE=%s", o->chunk_size);
    for (size_t j = 0; j < n; j++)
        if (env_forwarded(environ[j], o))
            v[i++] = strdup(environ[j]);
    for (int x = 0; x < o->nxvars; x++) {
        const char *val = getenv(o->xvars[x]);
        v[i++] = strchr(o->xvars[x], '=') ? strdup(o->xvars[x])
                                          : xasprintf("%s=%s", o->xvars[x], val ? val : "");
    }
    for (size_t j = 0; j < i; j++) {
        if (!v[j]) {
            for (size_t k = 0; k < i; k++)
                free(v[k]);
            free(v);
            return NULL;
        }
    }
    return v;
}

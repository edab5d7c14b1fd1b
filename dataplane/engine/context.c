/* The context: configuration, transports, coordinator membership. */
#include "engine.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control/auth.h"
#include "control/coord.h"
#include "control/seal.h"
#include "gpu/memtype.h"

#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_TRANSPORTS "shm,verbs,tcp" /* preference order */
#define DEFAULT_EAGER_MAX  CFX_EAGER_LIMIT  /* bytes; see docs/PERFORMANCE_LATENCY.md */
#define DEFAULT_LOC_CACHE  4096u            /* location cache entries (loccache.c) */
#define DEFAULT_SPIN_ADAPT_US 250          /* see progress_main() */
#define DEFAULT_WAITER_NAP_MS 10           /* see cfx__progress_poll_wait() */
#define DEFAULT_SPIN_YIELD 8u               /* see poll_wait() in p2p.c */
#define LOC_CACHE_MAX      (1u << 20)

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

/* host id: equal for processes that can reach each other through shm (same
 * boot of the same machine and the same network namespace, since the shm
 * transport rendezvous on abstract unix sockets). */
static void host_id_read(char *buf, size_t len)
{
    char boot[64] = "unknown", ns[64] = "net";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof(boot), f))
            boot[strcspn(boot, "\n")] = '\0';
        fclose(f);
    }
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
    ns[n > 0 ? n : 0] = '\0';
    snprintf(buf, len, "%.36s/%.24s", boot, ns);
}

/* Local IP that routes to the coordinator (no packet is sent). */
static void bind_addr_for(const char *coord, char *buf, size_t len)
{
    struct sockaddr_in sa, local;
    socklen_t sl = sizeof(local);
    copy_str(buf, len, "127.0.0.1");
    if (cfx__parse_hostport(coord, &sa) != CFX_OK)
        return;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &sl) == 0)
        inet_ntop(AF_INET, &local.sin_addr, buf, (socklen_t)len);
    close(fd);
}

static bool tp_selected(const char *list, const char *name, int *rank);

/* Can a socket be bound to IPv4 address @p ip here?  False only when the
 * kernel says no interface has it (EADDRNOTAVAIL); a bad string is caught
 * by the transport's own check. */
static bool addr_is_local(const char *ip)
{
    struct sockaddr_in sa = { .sin_family = AF_INET };
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
        return true;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return true;
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno != EADDRNOTAVAIL;
    close(fd);
    return ok;
}

static int config_resolve(struct cfx_config *cfg, const struct cfx_context_params *p)
{
    uint64_t m = p ? p->field_mask : 0;
    char host[64];

    const char *coord =
        (m & CFX_CTX_PARAM_COORD) && p->coord ? p->coord : cfx__env_str("CFX_COORD", NULL);
    if (coord && strlen(coord) >= sizeof(cfg->coord)) /* cut short, it named another host */
        return cfx__err(CFX_ERR_INVALID, "coordinator address '%s' (%s) is longer than %zu bytes",
                        coord, (m & CFX_CTX_PARAM_COORD) && p->coord ? "the coord parameter"
                                                                     : "CFX_COORD",
                        sizeof(cfg->coord) - 1);
    copy_str(cfg->coord, sizeof(cfg->coord), coord);
    if (!cfg->coord[0]) {
        int rc = cfx__boot_resolve(&cfg->boot, cfg->coord, sizeof(cfg->coord));
        if (rc != CFX_OK)
            return rc;
    }
    copy_str(cfg->transports, sizeof(cfg->transports),
             (m & CFX_CTX_PARAM_TRANSPORTS) && p->transports
                 ? p->transports : cfx__env_str("CFX_TRANSPORT", DEFAULT_TRANSPORTS));
    if (m & CFX_CTX_PARAM_CHUNK_SIZE) {
        cfg->chunk_size = p->chunk_size;
        if (cfg->chunk_size && (cfg->chunk_size < CFX_CHUNK_MIN || cfg->chunk_size > CFX_CHUNK_MAX))
            return cfx__err(CFX_ERR_INVALID, "chunk_size parameter %zu out of range [%u, %u]",
                            cfg->chunk_size, CFX_CHUNK_MIN, CFX_CHUNK_MAX);
    } else {
        /* a tuning variable out of range is brought to the nearest bound
         * (README, "Environment") */
        /* (0, or unset: chosen per object; a negative one is below the
         * bounds, not "not a size") */
        const char *cs = getenv("CFX_CHUNK_SIZE");
        size_t mag;
        bool neg = cs && cs[0] == '-' && cfx__parse_size(cs + 1, &mag) == CFX_OK;
        size_t want = neg ? 0 : cfx__env_size("CFX_CHUNK_SIZE", 0);
        cfg->chunk_size = want;
        if (neg || (want && want < CFX_CHUNK_MIN))
            cfg->chunk_size = CFX_CHUNK_MIN;
        else if (want > CFX_CHUNK_MAX)
            cfg->chunk_size = CFX_CHUNK_MAX;
        if (neg || cfg->chunk_size != want)
            CFX_LOG(WARN, INIT, "CFX_CHUNK_SIZE=%s is outside %u..%u: using %zu", cs,
                    CFX_CHUNK_MIN, CFX_CHUNK_MAX, cfg->chunk_size);
    }
    /* read where each reduce is planned (objreduce_plan.c, objstripe.c):
     * a word of neither is said here, once per context, not ignored */
    const char *shape = getenv("CFX_REDUCE_SHAPE");
    if (shape && strcmp(shape, "chain") && strcmp(shape, "tree") && strcmp(shape, "striped"))
        CFX_LOG(WARN, INIT, "CFX_REDUCE_SHAPE='%s' is not chain, tree or striped: ignored",
                shape);
    long long v;
    if (m & CFX_CTX_PARAM_TIMEOUT) {
        /* as $CFX_TIMEOUT_MS: every blocking call has a deadline */
        if (p->timeout_ms < 1)
            return cfx__err(CFX_ERR_INVALID, "timeout_ms %d: the default deadline must be 1 ms "
                            "or more", p->timeout_ms);
        cfg->timeout_ms = p->timeout_ms;
    } else if (cfx__env_ll_in("CFX_TIMEOUT_MS", DEFAULT_TIMEOUT_MS, 1, INT_MAX, &v) != CFX_OK)
        return CFX_ERR_INVALID;
    else
        cfg->timeout_ms = (int)v;
    cfg->inline_max = cfx__env_size_clamp("CFX_INLINE_MAX", CFX_OBJECT_INLINE_MAX, 0,
                                          CFX_OBJECT_INLINE_MAX);
    /* window_bytes is 32 bits: 4G wrapped to 0 (the least window, silently) */
    cfg->window_bytes = (uint32_t)cfx__env_size_clamp("CFX_WINDOW", 16u << 20, 0, CFX_WINDOW_MAX);
    if (cfx__env_ll_in("CFX_SPIN_US", 20, 0, 1000000, &v) != CFX_OK)
        return CFX_ERR_INVALID;
    cfg->spin_us = (uint32_t)v;
    /* clamped as documented, with a warning that says to what */
    cfg->spin_yield = (uint32_t)cfx__env_ll_clamp("CFX_SPIN_YIELD", DEFAULT_SPIN_YIELD, 1, 1 << 20);
    cfg->spin_adapt_us =
        (uint32_t)cfx__env_ll_clamp("CFX_SPIN_ADAPT_US", DEFAULT_SPIN_ADAPT_US, 0, 10000);
    cfg->waiter_nap_ms =
        (uint32_t)cfx__env_ll_clamp("CFX_WAITER_NAP_MS", DEFAULT_WAITER_NAP_MS, 0, 1000);
    cfg->eager_max =
        (uint32_t)cfx__env_size_clamp("CFX_EAGER_MAX", DEFAULT_EAGER_MAX, 0, CFX_EAGER_LIMIT);
    cfg->upload_rate = cfx__env_size("CFX_UPLOAD_RATE", 0);
    cfg->get_sources = (uint32_t)cfx__env_ll_clamp("CFX_GET_SOURCES", CFX_GET_SOURCES_DEFAULT, 1,
                                                   CFX_GET_SOURCES_MAX);
    cfg->loc_cache =
        (uint32_t)cfx__env_size_clamp("CFX_LOC_CACHE", DEFAULT_LOC_CACHE, 0, LOC_CACHE_MAX);
    if (cfx__seal_mode_parse((m & CFX_CTX_PARAM_SECURE) ? p->secure : getenv("CFX_SECURE"),
                             &cfg->secure) != CFX_OK)
        /* name what was wrong where it was given: the parameter, or the
         * variable (the parser's text) */
        return (m & CFX_CTX_PARAM_SECURE)
                   ? cfx__err(CFX_ERR_INVALID, "secure parameter '%.32s': expected "
                              CFX_SEAL_MODE_WORDS, p->secure)
                   : CFX_ERR_INVALID;
    const char *ba = getenv("CFX_BIND_ADDR"), *ifn = getenv("CFX_SOCKET_IFNAME");
    struct in_addr probe;
    if ((m & CFX_CTX_PARAM_BIND_ADDR) && p->bind_addr) {
        copy_str(cfg->bind_addr, sizeof(cfg->bind_addr), p->bind_addr);
    } else if (ba && *ba && inet_pton(AF_INET, ba, &probe) == 1) {
        copy_str(cfg->bind_addr, sizeof(cfg->bind_addr), ba);
    } else if (ba && *ba) {
        /* not an address: an interface name, exactly */
        if (strlen(ba) >= IF_NAMESIZE || strchr(ba, ','))
            return cfx__err(CFX_ERR_INVALID,
                            "CFX_BIND_ADDR=%s is neither an IPv4 address nor "
                            "an interface name",
                            ba);
        int rc = cfx__netif_pick("CFX_BIND_ADDR", ba, true, cfg->bind_addr, sizeof(cfg->bind_addr));
        if (rc != CFX_OK)
            return rc;
    } else if (ifn) {
        int rc = cfx__netif_pick("CFX_SOCKET_IFNAME", ifn, false, cfg->bind_addr,
                                 sizeof(cfg->bind_addr));
        if (rc != CFX_OK)
            return rc;
    } else {
        bind_addr_for(cfg->coord, cfg->bind_addr, sizeof(cfg->bind_addr));
    }
    /* an address asked for must be one of this host's when tcp may listen
     * on it: tcp would otherwise be left out quietly, and peers on other
     * hosts could not reach us (dpdk alone may take an address the kernel
     * does not have) */
    const char *asked = (m & CFX_CTX_PARAM_BIND_ADDR) && p->bind_addr ? "bind_addr"
                        : ba && *ba && inet_pton(AF_INET, ba, &probe) == 1 ? "CFX_BIND_ADDR"
                                                                            : NULL;
    int tcp_rank;
    if (asked && tp_selected(cfg->transports, "tcp", &tcp_rank) && !addr_is_local(cfg->bind_addr))
        return cfx__err(CFX_ERR_INVALID, "%s=%s: no interface of this host has that address",
                        asked, cfg->bind_addr);
    if (gethostname(host, sizeof(host)) != 0)
        copy_str(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    if ((m & CFX_CTX_PARAM_NAME) && p->name && strlen(p->name) >= sizeof(cfg->name))
        /* refused, not cut short, as the coordinator's address is */
        return cfx__err(CFX_ERR_INVALID, "node name '%.32s...' (the name parameter) is longer "
                        "than %zu bytes", p->name, sizeof(cfg->name) - 1);
    if ((m & CFX_CTX_PARAM_NAME) && p->name)
        copy_str(cfg->name, sizeof(cfg->name), p->name);
    else
        snprintf(cfg->name, sizeof(cfg->name), "%.40s:%d", host, (int)getpid());
    return CFX_OK;
}

/* Whether the comma-separated @p list names @p name; its place in *@p rank. */
static bool tp_listed(const char *list, const char *name, int *rank)
{
    const char *p = list;
    for (int i = 0; *p; i++) {
        size_t n = strcspn(p, ",");
        if (n == strlen(name) && !strncmp(p, name, n)) {
            *rank = i;
            return true;
        }
        p += n + (p[n] == ',');
    }
    *rank = 100;
    return false;
}

/* Is @p name selected by the transport list: "tcp,shm" (those, in that
 * order of preference) or "^shm" (the default list less those)?  Its
 * place in the order in *@p rank. */
static bool tp_selected(const char *list, const char *name, int *rank)
{
    if (list[0] != '^')
        return tp_listed(list, name, rank);
    return !tp_listed(list + 1, name, rank) && tp_listed(DEFAULT_TRANSPORTS, name, rank);
}

/* Whether the user named the transports to use (not the default list, nor
 * the default less some): one of those missing here is worth a warning. */
static bool tp_named(const char *list)
{
    return list[0] != '^' && strcmp(list, DEFAULT_TRANSPORTS);
}

/*
 * $CFX_TOKEN, taken out of the environment.  The environment is the
 * process's, so this copy is too: the one process-wide state of the
 * library, kept so that every context of the process finds the token.
 */
static pthread_mutex_t env_token_mu = PTHREAD_MUTEX_INITIALIZER;
static char env_token[CFX_TOKEN_MAX + 1];

/* Load the token (explicit, else $CFX_TOKEN, else $CFX_TOKEN_FILE) and
 * scrub $CFX_TOKEN: its bytes overwritten where the environment keeps them
 * (which is what /proc/PID/environ reads), then the variable removed. */
static int token_load_scrub(const char *explicit_token, char *buf, size_t len)
{
    int rc;
    if (explicit_token && *explicit_token)
        return cfx__token_load(explicit_token, buf, len);
    pthread_mutex_lock(&env_token_mu);
    char *v = getenv("CFX_TOKEN");
    if (v && *v) {
        rc = cfx__token_load(v, env_token, sizeof(env_token));
        explicit_bzero(v, strlen(v));
        unsetenv("CFX_TOKEN");
        if (rc != CFX_OK) {
            env_token[0] = '\0';
            pthread_mutex_unlock(&env_token_mu);
            return rc;
        }
    }
    rc = cfx__token_load(env_token[0] ? env_token : NULL, buf, len);
    pthread_mutex_unlock(&env_token_mu);
    return rc;
}

static int transports_open(struct cfx_context *ctx)
{
    struct cfx_tp_iface_params ip = {
        .field_mask = CFX_TP_IFACE_PARAM_BIND_ADDR | CFX_TP_IFACE_PARAM_NODE_ID |
                      CFX_TP_IFACE_PARAM_TOKEN,
        .bind_addr = ctx->cfg.bind_addr,
        .node_id = 0,
        .token = ctx->token, /* loaded before the transports open */
    };
    const struct cfx_transport_ops *order[8];
    int ranks[8], n = 0;

    /* validate names the user gave */
    const char *p = ctx->cfg.transports + (ctx->cfg.transports[0] == '^');
    while (*p) {
        size_t len = strcspn(p, ",");
        char name[CFX_TP_NAME_MAX];
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        if (len && !cfx__transport_find(name)) {
            bool verbs = !strcmp(name, "verbs"), dpdk = !strcmp(name, "dpdk");
            if (!verbs && !dpdk)
                return cfx__err(CFX_ERR_INVALID, "CFX_TRANSPORT names '%s', which is not a "
                                "transport (tcp, shm, verbs, dpdk)", name);
            /* the default list names transports a build may lack, and one
             * left out of it need not be there */
            if (tp_named(ctx->cfg.transports))
                return cfx__err(CFX_ERR_INVALID, "CFX_TRANSPORT names '%s', which this build "
                                "was made without (configured with %s=OFF, or %s not found "
                                "then)", name, verbs ? "CFX_WITH_VERBS" : "CFX_WITH_DPDK",
                                verbs ? "libibverbs-dev and librdmacm-dev" : "libdpdk-dev");
        }
        p += len + (p[len] == ',');
    }
    /* a DPDK port asked for while dpdk is not among the transports: the
     * user meant it (a misspelt CFX_TRANSPORT leaves the default list) */
    int dr;
    const char *dpdk_env = getenv("CFX_DPDK_VDEV") ? "CFX_DPDK_VDEV"
                           : getenv("CFX_DPDK_EAL") ? "CFX_DPDK_EAL"
                                                    : NULL;
    if (dpdk_env && !tp_selected(ctx->cfg.transports, "dpdk", &dr))
        CFX_LOG(WARN, INIT, "%s is set, but the transports are '%s', without dpdk: "
                "CFX_TRANSPORT=dpdk (or --transport dpdk) uses it", dpdk_env,
                ctx->cfg.transports);
    for (int i = 0; cfx__transports[i] && n < 8; i++) {
        int r;
        if (tp_selected(ctx->cfg.transports, cfx__transports[i]->name, &r)) {
            int j = n++;
            while (j > 0 && ranks[j - 1] > r) {
                order[j] = order[j - 1];
                ranks[j] = ranks[j - 1];
                j--;
            }
            order[j] = cfx__transports[i];
            ranks[j] = r;
        }
    }
    char skipped[512] = ""; /* why each transport was not available, for the error below */
    size_t sk = 0;
    for (int i = 0; i < n && ctx->ntp < CFX_MAX_TPS; i++) {
        struct cfx_tp_slot *s = &ctx->tp[ctx->ntp];
        if (ctx->cfg.secure != CFX_SEAL_OFF &&
            !(order[i]->caps & (CFX_TP_CAP_SEAL | CFX_TP_CAP_SAME_HOST))) {
            /* its traffic could not be sealed: not opened at all, so no
             * peer can reach this node through it (docs/SECURITY.md) */
            if (tp_named(ctx->cfg.transports))
                return cfx__err(CFX_ERR_INVALID, "CFX_TRANSPORT names %s, which cannot seal its "
                                "traffic, and CFX_SECURE=%s asks for sealing",
                                order[i]->name, cfx__seal_mode_name(ctx->cfg.secure));
            CFX_LOG(INFO, INIT, "transport %s not used: it cannot seal its traffic "
                    "(CFX_SECURE=%s)", order[i]->name, cfx__seal_mode_name(ctx->cfg.secure));
            continue;
        }
        int rc = order[i]->iface_open(&ip, &s->iface);
        if (rc == CFX_ERR_NO_DEVICE || rc == CFX_ERR_UNSUPPORTED) {
            /* named by the user (not the default list): the job runs on
             * without it, which the user must be told; when no transport
             * opened and none is left to try, the error below says it all */
            if (tp_named(ctx->cfg.transports) && (ctx->ntp > 0 || i + 1 < n))
                CFX_LOG(WARN, INIT, "transport %s (CFX_TRANSPORT=%s) not available here, the "
                        "others are used: %s", order[i]->name, ctx->cfg.transports,
                        cfx_last_error());
            else
                CFX_LOG(INFO, INIT, "transport %s not available here: %s", order[i]->name,
                        cfx_last_error());
            if (sk < sizeof(skipped)) {
                int w = snprintf(skipped + sk, sizeof(skipped) - sk, "%s%s: %s", sk ? "; " : "",
                                 order[i]->name, cfx_last_error());
                sk = w < 0 ? sizeof(skipped) : sk + (size_t)w;
            }
            /* a transport skipped is no failure: its text must not stand as
             * the cause of a later one (cfx_last_error() of a call that set
             * none, e.g. after a malloc in the application) */
            cfx__err_clear();
            continue;
        }
        if (rc != CFX_OK)
            return cfx__err(rc, "cannot open transport %s: %s", order[i]->name,
                            cfx_last_error());
        s->ops = order[i];
        s->addr_len = sizeof(s->addr);
        rc = s->ops->iface_addr(s->iface, s->addr, &s->addr_len);
        if (rc != CFX_OK) {
            s->ops->iface_close(s->iface);
            return cfx__err(rc, "transport %s has no address", order[i]->name);
        }
        ctx->ntp++;
    }
    if (!ctx->ntp)
        return cfx__err(CFX_ERR_NO_DEVICE, "no usable transport among '%s'%s%s%s",
                        ctx->cfg.transports, sk ? " (" : "", skipped, sk ? ")" : "");
    return CFX_OK;
}

static void on_node_dead(void *arg, uint32_t node_id)
{
    struct cfx_context *ctx = arg;
    if (node_id == 0) {
        /* the client said so at WARN, with why and whether it reconnects;
         * a second line, at ERR, made a job's orderly end (a Ray driver's
         * shutdown() before its actors are gone) look like a failure */
        CFX_LOG(DEBUG, CTL, "node %u: lost the coordinator %s", ctx->node_id, ctx->cfg.coord);
        /* a group call whose message failed meanwhile waits for the
         * reconnection's node id: the cause may be this node's own death
         * (coll_check.c cfx__coll_msg_failed) */
        pthread_mutex_lock(&ctx->lock);
        pthread_cond_broadcast(&ctx->obj_cond);
        pthread_mutex_unlock(&ctx->lock);
        return;
    }
    /* its locations go at once (memory only): a get after this event asks
     * the directory instead of trying the dead holder */
    pthread_mutex_lock(&ctx->lock);
    cfx__loc_forget_node(&ctx->loc, node_id);
    pthread_mutex_unlock(&ctx->lock);
    struct cfx_cmd *cmd = calloc(1, sizeof(*cmd));
    if (!cmd)
        return;
    cmd->type = CFX_CMD_NODE_DEAD;
    cmd->node_id = node_id;
    pthread_mutex_lock(&ctx->lock);
    cfx__cmd_post(ctx, cmd);
    pthread_mutex_unlock(&ctx->lock);
    CFX_LOG(INFO, CTL, "node %u: coordinator reports node %u dead", ctx->node_id, node_id);
}

/* A goodbye: only the waits that watch a group's members care (a member
 * that left will send nothing more); its connections close in order. */
static void on_node_left(void *arg, uint32_t node_id)
{
    struct cfx_context *ctx = arg;
    struct cfx_cmd *cmd = calloc(1, sizeof(*cmd));
    if (!cmd)
        return;
    cmd->type = CFX_CMD_NODE_LEFT;
    cmd->node_id = node_id;
    pthread_mutex_lock(&ctx->lock);
    cfx__cmd_post(ctx, cmd);
    pthread_mutex_unlock(&ctx->lock);
}

/*
 * The directory withdrew object @p id, of which this node holds a copy or
 * part of one (client thread; see on_obj_gone in control/client.h): the copy
 * stops answering gets here at once, and leaves the store
 * (cfx__copy_withdrawn).  Its buffer is the getter's (cfx_get) or the
 * caller's arena buffer (cfx_get_alloc, freed by cfx_buf_free), never ours
 * to free; but for a task result this node put (cfx_task_result_put): its
 * buffer is the library's copy, which nobody else frees, and the object's
 * submitter's delete withdrew it.  A putter's other objects are its own
 * (only its delete ends them).  A copy still being got is dropped by its
 * get when the transfer ends.
 */
void cfx__copy_withdrawn(struct cfx_context *ctx, struct cfx_obj *o)
{
    const bool ours = o->owned && o->arena && !o->lent;
    if ((o->owned && !ours) || o->ephemeral || o->deleting || o->p2p)
        return;
    o->withdrawn = true;
    o->announced = false;
    cfx__withdrawn_add(ctx, &o->id);
    if (o->complete && !o->in) {
        o->deleting = true; /* new gets and GET_REQs pass it by from now on */
        o->arena = ours;
        if (cfx__cmd_new(ctx, CFX_CMD_OBJ_RELEASE, o, NULL) != CFX_OK)
            CFX_LOG(ERR, OBJ, "node %u: out of memory releasing a withdrawn copy",
                    ctx->node_id);
    }
}

/* Client thread, after a coordinator restart: objects are announced again,
 * task functions registered again (each on a thread of its own). */
static void on_reconnected(void *arg)
{
    struct cfx_context *ctx = arg;
    /* a group call that waits to learn whether this node came back as
     * another (coll/group.c cfx__group_moved_wait) looks again */
    pthread_mutex_lock(&ctx->lock);
    pthread_cond_broadcast(&ctx->obj_cond);
    pthread_mutex_unlock(&ctx->lock);
    cfx__reannounce_on_reconnected(arg);
    cfx__task_on_reconnected(arg);
}

/* Client thread: the directory's answer to a reduce result's announcement,
 * handed to the progress thread (the task it ends sends on a connection). */
static void on_put_answer(void *arg, const struct cfx_object_id *id, int status, const char *why)
{
    struct cfx_context *ctx = arg;
    struct cfx_put_answer *a = malloc(sizeof(*a));
    struct cfx_cmd *cmd = a ? calloc(1, sizeof(*cmd)) : NULL;
    if (!cmd) {
        free(a);
        CFX_LOG(ERR, OBJ, "node %u: out of memory for the directory's answer to a put",
                ctx->node_id);
        return;
    }
    a->id = *id;
    a->status = status;
    snprintf(a->why, sizeof(a->why), "%s", why ? why : "");
    cmd->type = CFX_CMD_PUT_ANSWER;
    cmd->msg = a;
    pthread_mutex_lock(&ctx->lock);
    cfx__cmd_post(ctx, cmd);
    pthread_mutex_unlock(&ctx->lock);
}

static void on_obj_gone(void *arg, const struct cfx_object_id *id)
{
    struct cfx_context *ctx = arg;
    char hex[CFX_OBJECT_ID_HEX_LEN];

    pthread_mutex_lock(&ctx->lock);
    cfx__gone_note(ctx, id);
    struct cfx_obj *o = cfx__store_find(&ctx->store, id);
    if (o)
        cfx__copy_withdrawn(ctx, o);
    pthread_mutex_unlock(&ctx->lock);
    cfx_object_id_to_hex(id, hex);
    CFX_LOG(DEBUG, OBJ, "node %u: object %s was withdrawn: its copy here is dropped",
            ctx->node_id, hex);
}

void cfx__worker_stop(struct cfx_context *ctx);

static void transports_close(struct cfx_context *ctx)
{
    for (int t = 0; t < ctx->ntp; t++)
        ctx->tp[t].ops->iface_close(ctx->tp[t].iface);
    ctx->ntp = 0;
}

int cfx_context_create(const struct cfx_context_params *params, struct cfx_context **out)
{
    return cfx__context_create_flags(params, 0, out);
}

int cfx__context_create_flags(const struct cfx_context_params *params, uint8_t node_flags,
                              struct cfx_context **out)
{
    struct cfx_context *ctx;
    int rc;

    cfx__log_init();
    cfx__crypto_init();
    cfx__err_clear();
    if (!out)
        return cfx__err(CFX_ERR_INVALID, "cfx_context_create: out is NULL");
    rc = cfx__mask_check(params ? params->field_mask : 0, CFX_CTX_PARAM_ALL, "cfx_context_create",
                         "cfx_context_params.field_mask");
    if (rc != CFX_OK)
        return rc;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return cfx__err(CFX_ERR_NOMEM, "cfx_context_create: out of memory");
    ctx->fork_gen = cfx__fork_gen();
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->progress_lock, NULL);
    pthread_mutex_init(&ctx->ps_load_lock, NULL);
    cfx__cond_init_mono(&ctx->progress_cond);
    cfx__cond_init_mono(&ctx->cmd_done);
    cfx__cond_init_mono(&ctx->obj_cond);
    cfx__cond_init_mono(&ctx->async_cond);
    cfx__cond_init_mono(&ctx->calls_cond);
    cfx_list_init(&ctx->users);
    cfx_list_init(&ctx->conns);
    cfx_list_init(&ctx->busy_uploads);
    cfx_list_init(&ctx->paced_uploads);
    cfx_list_init(&ctx->p2p_sends);
    cfx_list_init(&ctx->p2p_rtrs);
    cfx_list_init(&ctx->p2p_awaits);
    cfx_list_init(&ctx->eager_posted);
    cfx_list_init(&ctx->eager_unexp);
    cfx_list_init(&ctx->rtasks);
    cfx_list_init(&ctx->rwaits);
    cfx_list_init(&ctx->waiting_gets);
    cfx_list_init(&ctx->cmds);
    cfx_list_init(&ctx->cmd_cache);
    cfx_list_init(&ctx->p2p_cache);
    cfx_list_init(&ctx->unexp_cache);
    cfx_list_init(&ctx->async_q);
    cfx_list_init(&ctx->reqs);
    cfx_list_init(&ctx->arena.segs);
    cfx_list_init(&ctx->arena.doomed);
    ctx->epfd = ctx->cmd_fd = -1;

    rc = config_resolve(&ctx->cfg, params);
    if (rc != CFX_OK)
        goto err_free;
    rc = token_load_scrub(params && (params->field_mask & CFX_CTX_PARAM_TOKEN) ? params->token
                                                                                : NULL,
                          ctx->token, sizeof(ctx->token));
    if (rc != CFX_OK) {
        if (ctx->cfg.boot.host) {
            char why[256];
            snprintf(why, sizeof(why), "%s", cfx_last_error());
            rc = cfx__err(rc, "rank 0 (%s) refuses to host the coordinator on %s: %s",
                          ctx->cfg.boot.rank_var, ctx->cfg.coord, why);
        }
        goto err_free;
    }
    if (ctx->cfg.boot.host) {
        rc = cfx__boot_host(&ctx->cfg.boot, ctx->token, ctx->cfg.secure, &ctx->hosted);
        if (rc != CFX_OK)
            goto err_free;
    }
    rc = cfx__loc_init(&ctx->loc, ctx->cfg.loc_cache);
    if (rc != CFX_OK) {
        rc = cfx__err(rc, "no memory for a location cache of %u entries", ctx->cfg.loc_cache);
        goto err_free;
    }
    rc = transports_open(ctx);
    if (rc != CFX_OK)
        goto err_close_tps;

    /* who we are, for the directory */
    ctx->self.pid = (uint32_t)getpid();
    copy_str(ctx->self.name, sizeof(ctx->self.name), ctx->cfg.name);
    host_id_read(ctx->self.host_id, sizeof(ctx->self.host_id));
    if (gethostname(ctx->self.host, sizeof(ctx->self.host) - 1) != 0)
        copy_str(ctx->self.host, sizeof(ctx->self.host), "localhost");
    ctx->self.flags = node_flags & CFX_NODE_F_OBSERVER;
    for (int t = 0; t < ctx->ntp && t < CFX_NODE_ADDRS_MAX; t++) {
        struct cfx_node_addr *a = &ctx->self.addr[ctx->self.naddr++];
        copy_str(a->tp, sizeof(a->tp), ctx->tp[t].ops->name);
        a->len = (uint8_t)ctx->tp[t].addr_len;
        memcpy(a->addr, ctx->tp[t].addr, ctx->tp[t].addr_len);
    }

    long long stall = cfx__env_ll("CFX_XFER_TEST_STALL", 0);
    if (stall > 0) {
        ctx->test_stall = (uint32_t)CFX_MIN(stall, (long long)CFX_MAX_CHUNKS);
        CFX_LOG(WARN, CTL,
                "test-only: uploads from here stop after chunk %u and hold "
                "cancels until resumed",
                ctx->test_stall);
    }
    const char *brk = cfx__env_str("CFX_TEST_CONNECT_BREAK", NULL);
    if (brk && *brk) {
        snprintf(ctx->test_connect_break, sizeof(ctx->test_connect_break), "%s", brk);
        CFX_LOG(WARN, CTL, "test-only: connections over %s go where nobody listens",
                ctx->test_connect_break);
    }
    if (cfx__env_ll("CFX_REANNOUNCE_TEST_HOLD", 0) > 0) {
        ctx->reannounce_hold = true;
        CFX_LOG(WARN, CTL, "test-only: a re-announce waits for a cfx_delete here once it "
                "has its list, and a cfx_delete waits for such a list");
    }
    /* from here the transports are the progress-lock holder's (checked in
     * CFX_THREAD_CHECKS builds, transport.h) */
    for (int t = 0; t < ctx->ntp; t++)
        ctx->tp[t].iface->owner = ctx;
    rc = cfx__progress_start(ctx);
    if (rc != CFX_OK)
        goto err_close_tps;
    rc = cfx__task_init(ctx);
    if (rc != CFX_OK)
        goto err_stop_progress;

    struct cfx_ctl_params cp = {
        .coord = ctx->cfg.coord,
        .token = ctx->token,
        .role = CFX_CTL_ROLE_NODE,
        .self = &ctx->self,
        .timeout_ms = ctx->cfg.timeout_ms < 0 ? DEFAULT_TIMEOUT_MS : ctx->cfg.timeout_ms,
        .on_node_dead = on_node_dead,
        .on_node_left = on_node_left,
        .on_reconnected = on_reconnected,
        .on_rejoined = cfx__reannounce_on_rejoined,
        .on_put_answer = on_put_answer,
        .on_obj_gone = on_obj_gone,
        .on_task_run = cfx__task_on_run,
        .load_fill = cfx__task_load_fill,
        .beat_fill = cfx__task_beat_fill,
        .arg = ctx,
        .secure = ctx->cfg.secure,
    };
    /* a coordinator not up yet is waited for until the deadline, unless the
     * thread's interrupt check (cfx_set_interrupt_check) says stop */
    cfx__intr_begin();
    rc = cfx__ctl_open(&cp, &ctx->ctl);
    cfx__intr_end();
    if (rc != CFX_OK)
        goto err_stop_progress;
    ctx->node_id = cfx__ctl_node_id(ctx->ctl);
    ctx->joined_id = ctx->node_id;
    ctx->self.node_id = ctx->node_id;
    for (int t = 0; t < ctx->ntp; t++)
        ctx->tp[t].iface->node_id = ctx->node_id;

    char tag[32];
    snprintf(tag, sizeof(tag), "%u", ctx->node_id);
    cfx__log_set_tag(tag);
    if (cfx__log_level >= CFX_LOG_LEVEL_INFO) {
        /* one line, as every log line is (docs/OPERATING.md): "k = v; k = v" */
        char cfgtxt[1024], line[1536];
        size_t o = 0;
        cfx_context_config(ctx, cfgtxt, sizeof(cfgtxt));
        for (const char *c = cfgtxt; *c && o + 3 < sizeof(line); c++) {
            if (*c != '\n')
                line[o++] = *c;
            else if (c[1]) {
                line[o++] = ';';
                line[o++] = ' ';
            }
        }
        line[o] = '\0';
        CFX_LOG(INFO, INIT, "joined %s as node %u; effective configuration: %s", ctx->cfg.coord,
                ctx->node_id, line);
    }
    cfx__err_clear(); /* transports skipped or coordinator retries on the way */
    *out = ctx;
    return CFX_OK;

err_stop_progress:
    cfx__task_fini(ctx);
    cfx__progress_stop(ctx);
err_close_tps:
    transports_close(ctx);
err_free:
    cfx__coord_stop(ctx->hosted); /* nobody joined it: nothing to wait for */
    cfx__loc_fini(&ctx->loc);
    pthread_cond_destroy(&ctx->progress_cond);
    pthread_cond_destroy(&ctx->calls_cond);
    pthread_mutex_destroy(&ctx->ps_load_lock);
    pthread_mutex_destroy(&ctx->progress_lock);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return rc;
}

/* Is anything of ours still on its way to a peer (ctx->lock held)? */
static bool sending(struct cfx_context *ctx)
{
    struct cfx_list *pos;
    if (!cfx_list_empty(&ctx->busy_uploads) || !cfx_list_empty(&ctx->paced_uploads) ||
        !cfx_list_empty(&ctx->cmds))
        return true;
    cfx_list_for_each(pos, &ctx->conns) {
        struct cfx_conn *c = cfx_list_entry(pos, struct cfx_conn, link);
        if (c->state != CFX_CONN_FAILED &&
            (c->sends_out || !cfx_list_empty(&c->pending) || !cfx_list_empty(&c->uploads) ||
             cfx__eager_queued(c)))
            return true;
    }
    return false;
}

/*
 * Before the endpoints close, let what was already handed to them go out
 * (queued control messages, uploads being written, eager messages waiting
 * for credits, and every ep_send the transport took but has not reported
 * with CFX_TP_COMP_SEND: tcp keeps those in its user-space send queue, shm
 * behind a full ring, and ep_close drops them), for at most QUIESCE_MS: a
 * message whose send completed must not be lost because its sender left
 * right after.  A peer that reads nothing for that long loses the rest.
 */
#define QUIESCE_MS 1000
static void quiesce(struct cfx_context *ctx)
{
    uint64_t deadline = cfx__deadline_ns(QUIESCE_MS);
    pthread_mutex_lock(&ctx->lock);
    while (sending(ctx) && cfx__now_ns() < deadline) {
        uint64_t nap = cfx__deadline_ns(10); /* nothing signals "all sent" */
        cfx__obj_wait(ctx, nap < deadline ? nap : deadline);
    }
    pthread_mutex_unlock(&ctx->lock);
}

/* ---- calls in flight and handles ---------------------------------------------- */

/*
 * Handles (groups) live in their owners' memory, and their destroy may run
 * on one thread while the context's runs on another: the list and each
 * handle's state are under one process-wide lock, so that whichever comes
 * first decides who tears the handle's context side down, and the other
 * waits for it.  Taken rarely (create, destroy), never with ctx->lock held.
 */
static pthread_mutex_t users_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t users_cond = PTHREAD_COND_INITIALIZER;

enum { USER_ATTACHED = 1, USER_DETACHING, USER_DETACHED, USER_RELEASED, USER_ABANDONED };

bool cfx__ctx_forked(const struct cfx_context *ctx)
{
    return unlikely(cfx__fork_gen() != ctx->fork_gen);
}

int cfx__ctx_enter(struct cfx_context *ctx, const char *what)
{
    if (cfx__ctx_forked(ctx))
        return cfx__err(CFX_ERR_INVALID, "%s: the context of node %u was created before this "
                        "process forked: a child creates its own (its copy shares the "
                        "parent's connections and threads it does not have)", what,
                        ctx->node_id);
    pthread_mutex_lock(&ctx->lock);
    bool closing = ctx->closing;
    if (!closing)
        ctx->calls++;
    pthread_mutex_unlock(&ctx->lock);
    if (closing)
        return cfx__err(CFX_ERR_CANCELED, "%s: the context of node %u is being destroyed", what,
                        ctx->node_id);
    return CFX_OK;
}

int cfx__api_done(struct cfx_context *ctx, int rc)
{
    rc = cfx__ctx_leave(ctx, rc);
    /* status.h: empty after a call that returned CFX_OK, whatever a step
     * of it that did not matter said (a get's transfer-end notice for an
     * object deleted meanwhile: "not in the directory") */
    if (rc == CFX_OK)
        cfx__err_clear();
    return rc;
}

int cfx__ctx_leave(struct cfx_context *ctx, int rc)
{
    pthread_mutex_lock(&ctx->lock);
    bool closing = ctx->closing;
    uint32_t node = ctx->node_id;
    if (--ctx->calls == 0 && closing)
        pthread_cond_broadcast(&ctx->calls_cond);
    pthread_mutex_unlock(&ctx->lock);
    /* ctx may be gone from here on */
    if (rc == CFX_OK || !closing || rc == CFX_ERR_CANCELED)
        return rc;
    char why[384];
    snprintf(why, sizeof(why), "%s", cfx_last_error());
    return cfx__err(CFX_ERR_CANCELED, "the context of node %u is being destroyed: %s", node, why);
}

void cfx__ctx_user_attach(struct cfx_context *ctx, struct cfx_ctx_user *u,
                          void (*detach)(struct cfx_ctx_user *u))
{
    u->detach = detach;
    pthread_mutex_lock(&users_lock);
    u->state = USER_ATTACHED;
    cfx_list_add_tail(&u->link, &ctx->users);
    pthread_mutex_unlock(&users_lock);
}

int cfx__ctx_user_release(struct cfx_context *ctx, struct cfx_ctx_user *u)
{
    pthread_mutex_lock(&users_lock);
    /* attached: the context is alive (its destroy takes every handle off
     * the list before it frees anything) */
    if (u->state == USER_ATTACHED && cfx__ctx_enter(ctx, "destroy") == CFX_OK) {
        cfx_list_del(&u->link);
        u->state = USER_RELEASED;
        pthread_mutex_unlock(&users_lock);
        return 1;
    }
    cfx__err_clear();
    while (u->state != USER_DETACHED && u->state != USER_ABANDONED)
        pthread_cond_wait(&users_cond, &users_lock);
    int r = u->state == USER_DETACHED ? 0 : -1;
    pthread_mutex_unlock(&users_lock);
    return r;
}

/* The destroy gave up (calls still in flight): the handles stay as they
 * are, and so does the context; their owners' destroys return at once. */
static void abandon_users(struct cfx_context *ctx)
{
    pthread_mutex_lock(&users_lock);
    while (!cfx_list_empty(&ctx->users)) {
        struct cfx_ctx_user *u = cfx_list_entry(ctx->users.next, struct cfx_ctx_user, link);
        cfx_list_del(&u->link);
        u->state = USER_ABANDONED;
    }
    pthread_cond_broadcast(&users_cond);
    pthread_mutex_unlock(&users_lock);
}

/* Every handle still attached: its context side goes now. */
static void detach_users(struct cfx_context *ctx)
{
    pthread_mutex_lock(&users_lock);
    while (!cfx_list_empty(&ctx->users)) {
        struct cfx_ctx_user *u = cfx_list_entry(ctx->users.next, struct cfx_ctx_user, link);
        cfx_list_del(&u->link);
        u->state = USER_DETACHING;
        pthread_mutex_unlock(&users_lock);
        u->detach(u);
        pthread_mutex_lock(&users_lock);
        u->state = USER_DETACHED;
        pthread_cond_broadcast(&users_cond);
    }
    pthread_mutex_unlock(&users_lock);
}

/*
 * Calls blocked on other threads end now: waits that watch ctx->closing
 * give up, and so do the coordinator calls; then wait (bounded) for every
 * call to leave.  false: some call did not leave in time.
 */
static bool drain_calls(struct cfx_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    ctx->closing = true;
    pthread_cond_broadcast(&ctx->obj_cond);
    unsigned n = ctx->calls;
    pthread_mutex_unlock(&ctx->lock);
    if (n)
        CFX_LOG(INFO, INIT, "node %u: destroy: %u call(s) in flight on other threads end "
                "with CFX_ERR_CANCELED", ctx->node_id, n);
    cfx__ctl_interrupt(ctx->ctl, true);
    uint64_t dl = cfx__deadline_ns(CFX_DESTROY_DRAIN_MS);
    pthread_mutex_lock(&ctx->lock);
    while (ctx->calls && cfx__cond_wait_until(&ctx->calls_cond, &ctx->lock, dl))
        ;
    n = ctx->calls;
    pthread_mutex_unlock(&ctx->lock);
    /* the destroy's own coordinator calls (group records) go through */
    cfx__ctl_interrupt(ctx->ctl, false);
    if (n)
        CFX_LOG(ERR, INIT, "node %u: destroy: %u call(s) still in flight after %d ms; the "
                "context is left allocated (not freed) so that they do not touch freed "
                "memory", ctx->node_id, n, CFX_DESTROY_DRAIN_MS);
    return n == 0;
}

void cfx_context_destroy(struct cfx_context *ctx)
{
    if (!ctx)
        return;
    if (cfx__ctx_forked(ctx)) {
        /* a forked child's copy: the connections, segments and directory
         * records are the parent's, and its threads are not here; touching
         * them would end the parent's membership.  The copy goes with this
         * process. */
        CFX_LOG(DEBUG, INIT, "node %u: destroy of the context in a forked child: left to the "
                "process's exit", ctx->node_id);
        return;
    }
    if (!drain_calls(ctx)) {
        abandon_users(ctx);
        return;
    }
    detach_users(ctx);
    cfx__task_stop(ctx);
    cfx__worker_stop(ctx);
    cfx__request_detach_all(ctx);
    /* leave first, so no new getter is sent our way */
    cfx__reannounce_stop(ctx);
    cfx__ctl_close(ctx->ctl);
    ctx->ctl = NULL;
    cfx__task_fini(ctx);
    quiesce(ctx);
    cfx__progress_stop(ctx);

    /* the progress thread is gone: tear down on this thread, which drives
     * the transports from now on */
    cfx__progress_lock(ctx);
    struct cfx_list *pos, *tmp;
    cfx_list_for_each_safe(pos, tmp, &ctx->conns) {
        struct cfx_conn *conn = cfx_list_entry(pos, struct cfx_conn, link);
        cfx__xfer_conn_failed(ctx, conn);
        cfx__conn_destroy(conn);
    }
    /* commands the progress thread did not get to: releases still free
     * their objects (nothing is in flight any more), the rest is dropped */
    cfx_list_for_each_safe(pos, tmp, &ctx->cmds) {
        struct cfx_cmd *cmd = cfx_list_entry(pos, struct cfx_cmd, link);
        cfx_list_del(pos);
        if (cmd->type == CFX_CMD_OBJ_RELEASE)
            cfx__obj_release(ctx, cmd->obj);
        free(cmd->msg);
        free(cmd);
    }
    /* sends nobody asked for: their requests were freed by their owners */
    cfx_list_for_each_safe(pos, tmp, &ctx->p2p_sends)
        cfx_list_del(pos);
    cfx__eager_destroy_all(ctx);
    cfx__p2p_cache_destroy(ctx);
    cfx_list_for_each_safe(pos, tmp, &ctx->cmd_cache)
    {
        cfx_list_del(pos);
        free(cfx_list_entry(pos, struct cfx_cmd, link));
    }
    ctx->cmd_ncached = 0;
    cfx__rtask_destroy_all(ctx);
    for (unsigned sl = 0; sl < CFX_XFER_SLOTS; sl++)
        if (ctx->slots[sl] && ctx->slots[sl]->abandoned) { /* no getter left to free it */
            free(ctx->slots[sl]);
            ctx->slots[sl] = NULL;
        }
    for (unsigned b = 0; b < CFX_STORE_BUCKETS; b++) {
        while (ctx->store.buckets[b]) {
            struct cfx_obj *obj = ctx->store.buckets[b];
            if (obj->in) {
                cfx__status_set(&obj->in->status, CFX_ERR_CLOSED);
                obj->in = NULL;
            }
            cfx__obj_release(ctx, obj);
            if (ctx->store.buckets[b] == obj) { /* could not release: drop */
                cfx__store_remove(&ctx->store, obj);
            }
        }
    }
    transports_close(ctx);
    cfx__memtype_stream_destroy(CFX_MEMTYPE_CUDA, ctx->dev_stream);
    cfx__arena_destroy(ctx);
    cfx__progress_unlock(ctx);
    cfx__loc_fini(&ctx->loc);
    pthread_cond_destroy(&ctx->cmd_done);
    pthread_cond_destroy(&ctx->obj_cond);
    pthread_cond_destroy(&ctx->async_cond);
    pthread_cond_destroy(&ctx->progress_cond);
    pthread_cond_destroy(&ctx->calls_cond);
    pthread_mutex_destroy(&ctx->ps_load_lock);
    pthread_mutex_destroy(&ctx->progress_lock);
    pthread_mutex_destroy(&ctx->lock);
    cfx__boot_unhost(ctx->hosted,
                     ctx->cfg.timeout_ms < 0 ? DEFAULT_TIMEOUT_MS : ctx->cfg.timeout_ms);
    free(ctx);
}

uint32_t cfx_context_node_id(const struct cfx_context *ctx)
{
    return ctx ? ctx->node_id : 0;
}

int cfx_context_stats(struct cfx_context *ctx, struct cfx_context_stats *out)
{
    cfx__err_clear();
    if (!ctx || !out)
        return cfx__err(CFX_ERR_INVALID, "cfx_context_stats: NULL argument");
    pthread_mutex_lock(&ctx->lock);
    *out = ctx->stats;
    pthread_mutex_unlock(&ctx->lock);
    out->writes_refused = out->records_refused = out->writes_late = 0;
    for (int t = 0; t < ctx->ntp; t++) {
        if (ctx->tp[t].ops->iface_grant_refused)
            out->writes_refused += ctx->tp[t].ops->iface_grant_refused(ctx->tp[t].iface);
        if (ctx->tp[t].ops->iface_late_dropped)
            out->writes_late += ctx->tp[t].ops->iface_late_dropped(ctx->tp[t].iface);
        if (ctx->tp[t].ops->iface_seal_refused)
            out->records_refused += ctx->tp[t].ops->iface_seal_refused(ctx->tp[t].iface);
    }
    return CFX_OK;
}

int cfx_context_config(const struct cfx_context *ctx, char *buf, size_t len)
{
    cfx__err_clear();
    if (!ctx || (!buf && len))
        return cfx__err(CFX_ERR_INVALID, "cfx_context_config: NULL argument");
    char tps[64] = "";
    for (int t = 0; t < ctx->ntp; t++)
        snprintf(tps + strlen(tps), sizeof(tps) - strlen(tps), "%s%s", t ? "," : "",
                 ctx->tp[t].ops->name);
    char gpu[160];
    cfx__gpu_describe(gpu, sizeof(gpu)); /* probes CUDA once, on first use */
    int n = snprintf(buf, len,
                     "version = %s\n"
                     "node_id = %u\n"
                     "name = %s\n"
                     "coordinator = %s%s\n"
                     "transports = %s (requested %s)\n"
                     "bind_addr = %s\n"
                     "chunk_size = %s%zu\n"
                     "inline_max = %zu\n"
                     "window_bytes = %u\n"
                     "timeout_ms = %d\n"
                     "spin_us = %u\n"
                     "spin_yield = %u\n"
                     "spin_adapt_us = %u\n"
                     "waiter_nap_ms = %u\n"
                     "eager_max = %u\n"
                     "upload_rate = %llu\n"
                     "get_sources = %u\n"
                     "loc_cache = %u\n"
                     "secure = %s\n"
                     "host_id = %s\n"
                     "gpu = %s\n",
                     CFX_VERSION_STRING, ctx->node_id, ctx->cfg.name, ctx->cfg.coord,
                     !ctx->cfg.boot.used ? ""
                     : ctx->hosted       ? " (from MASTER_ADDR; hosted here, rank 0)"
                                         : " (from MASTER_ADDR)",
                     tps,
                     ctx->cfg.transports, ctx->cfg.bind_addr,
                     ctx->cfg.chunk_size ? "" : "auto, ", ctx->cfg.chunk_size,
                     ctx->cfg.inline_max, ctx->cfg.window_bytes, ctx->cfg.timeout_ms,
                     ctx->cfg.spin_us, ctx->cfg.spin_yield, ctx->cfg.spin_adapt_us,
                     ctx->cfg.waiter_nap_ms, ctx->cfg.eager_max,
                     (unsigned long long)ctx->cfg.upload_rate, ctx->cfg.get_sources,
                     ctx->cfg.loc_cache,
                     cfx__seal_mode_name(ctx->cfg.secure), ctx->self.host_id, gpu);
    return n;
}

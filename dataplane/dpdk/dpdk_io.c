/*
 * dpdk transport: EAL, one port with one rx/tx queue pair and its mbuf
 * pool, burst receive and batched transmit of the frames of dpdk_frame.c.
 *
 * Built only with DPDK (CFX_HAVE_DPDK).  Frames are built by copying into
 * an mbuf; zero-copy transmit from registered memory (external mbufs)
 * belongs to the transport above, which knows the registrations.
 *
 * net_memif and EAL's interrupt thread.  net_memif runs its control channel
 * on EAL's interrupt thread: when the peer closes its port, or dies and the
 * kernel closes its end of the control socket, memif_disconnect() there
 * unmaps the shared regions and frees their descriptors (DPDK 22.11,
 * drivers/net/memif/memif_socket.c), with nothing in the driver that keeps
 * out a thread inside rte_eth_rx_burst() or rte_eth_tx_burst() on the same
 * queue, which then reads unmapped rings (SEGV).  Looking at the link first
 * does not help: the link goes down in the same unsynchronised step.  So
 * the data path of a net_memif port runs only while it holds the interrupt
 * thread itself: the gate below parks that thread in a callback of ours
 * (an eventfd of ours registered with EAL, readable while a net_memif port
 * is open) for GATE_HOLD_NS at a time, and a burst is made only while it is
 * parked; between holds the thread runs whatever came in meanwhile
 * (connects, disconnects: every fd epoll reports ready in that round) and
 * parks again.  A burst that finds the gate open is skipped: to the layers
 * above, a moment without packets.  Closing and restarting a port happen
 * inside the gate too, so they never run beside a connect or disconnect
 * that the interrupt thread is in the middle of, and so do the callbacks
 * of an rx burst (with memif's zero-copy=yes received mbufs point into the
 * shared regions; only copy mode, memif's default, is tested).
 */
#define ALLOW_EXPERIMENTAL_API 1 /* rte_intr_instance_alloc() and its setters */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_log.h>
#include <rte_interrupts.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_version.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#include "dpdk_io.h"

#define BURST        32
#define EAL_ARGV_MAX 64
#define GATE_HOLD_NS 5000000ull /* the interrupt thread is parked this long at a time */
#define GATE_WAIT_MS 1000       /* close and restart wait this long for the gate */

struct cfx__dpdk_port {
    uint16_t port_id;            /* ethdev port */
    struct rte_mempool *pool;    /* mbufs of both queues */
    struct cfx__dpdk_addr local; /* our MAC, IP and UDP port */
    struct rte_mbuf *txb[BURST]; /* frames built, not yet sent */
    unsigned ntx;                /* in txb */
    bool gated;                  /* net_memif: bursts only inside the gate */
    bool kernel_shared;          /* net_af_packet: the kernel's stack sees our frames too */
    bool memif_server;           /* net_memif, role=server: never restarted */
    bool stopped;                /* a restart failed to start it again: no bursts on it
                                  * (a stopped port's burst functions must not be called)
                                  * until a restart succeeds */
    unsigned restart_fails;      /* restarts failed in a row */
    uint32_t rx_drop_ppm;        /* test hook */
    bool test_gate_shut;         /* test hook: every burst finds the gate open */
    uint64_t rng;                /* its PRNG state */
    char name[RTE_ETH_NAME_MAX_LEN];
    struct cfx__dpdk_port_stats stats;
    uint64_t refuse_log_at;  /* a sender's refused header is logged again from then */
    uint64_t refused_quiet;  /* ... and these were refused meanwhile, unlogged */
    /* zero-copy transmit: a frame of a large payload is a header mbuf and a
     * data-less mbuf of zc_pool attached to the payload as an external
     * buffer; every attached one holds a count on zc_shinfo (ours is the
     * first, so its free callback never runs) */
    bool zc;
    struct rte_mempool *zc_pool;
    struct rte_mbuf_ext_shared_info zc_shinfo;
};

/* EAL is process-wide: one initialisation, whose result every caller gets. */
static pthread_mutex_t eal_lock = PTHREAD_MUTEX_INITIALIZER;
static int eal_state;       /* 0: not tried; 1: up; negative: the failure */
static char eal_why[512];   /* the failure's text, when it has one of its own */
/* EAL keeps pointers into its argv: ours lives on.  volatile: never read, a
 * plain static's store is dropped at -O1 and up, and the leak checker then
 * takes the block for lost */
static char *volatile eal_args_kept;

/* The runtime directory EAL made for a file prefix of our own (ending in
 * our pid: no other process shares it) goes at exit instead of piling up
 * under /var/run/dpdk (root; else $XDG_RUNTIME_DIR/dpdk or /tmp/dpdk). */
static char eal_rundir[512];

static void rundir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[800];
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void eal_rundir_remove(void)
{
    rundir_remove(eal_rundir);
}

/* The runtime directories of our default prefix (cfx<pid>) whose process is
 * gone (killed, so its exit handler never ran) go too, beside ours; one of
 * a process that still runs, or of another prefix, is left alone. */
static void eal_rundirs_reap(const char *ours)
{
    char parent[512], dir[800];
    snprintf(parent, sizeof(parent), "%s", ours);
    char *slash = strrchr(parent, '/');
    if (!slash)
        return;
    *slash = '\0';
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "cfx", 3) || !isdigit((unsigned char)e->d_name[3]))
            continue;
        long pid = strtol(e->d_name + 3, &end, 10);
        if (*end || pid <= 0 || pid > INT_MAX || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to ask about */
        snprintf(dir, sizeof(dir), "%s/%s", parent, e->d_name);
        rundir_remove(dir);
    }
    closedir(d);
}

/* The interrupt-thread gate (see the top of the file); process-wide, like
 * EAL.  lock guards holders and the waits; parked and inside are read
 * without it on the data path. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* parked set, holders changed (CLOCK_MONOTONIC) */
    bool ready;            /* efd, cond and the EAL callback are set up */
    int efd;               /* readable while the interrupt thread should park */
    struct rte_intr_handle *ih; /* efd as EAL sees it */
    unsigned holders;      /* open net_memif ports */
    atomic_bool parked;    /* the interrupt thread waits in gate_park() */
    atomic_uint inside;    /* data-path sections in progress, all threads */
} gate = { .lock = PTHREAD_MUTEX_INITIALIZER, .efd = -1 };

static void gate_kick(void)
{
    uint64_t one = 1;
    if (write(gate.efd, &one, sizeof(one)) != sizeof(one))
        CFX_LOG(WARN, DPDK, "interrupt-thread gate: eventfd write: %s", strerror(errno));
}

/* On EAL's interrupt thread: hold it while net_memif ports are open. */
static void gate_park(void *arg)
{
    uint64_t v;
    struct timespec until;
    (void)arg;

    if (read(gate.efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        CFX_LOG(WARN, DPDK, "interrupt-thread gate: eventfd read: %s", strerror(errno));
    pthread_mutex_lock(&gate.lock);
    if (!gate.holders) {
        pthread_mutex_unlock(&gate.lock);
        return;
    }
    atomic_store(&gate.parked, true);
    pthread_cond_broadcast(&gate.cond);
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += (long)GATE_HOLD_NS;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (gate.holders && pthread_cond_timedwait(&gate.cond, &gate.lock, &until) != ETIMEDOUT)
        ;
    atomic_store(&gate.parked, false);
    bool again = gate.holders > 0;
    pthread_mutex_unlock(&gate.lock);
    /* a section that began before it saw the gate open is still in its
     * burst: the thread goes back to EAL (and its disconnects) after it */
    while (atomic_load(&gate.inside))
        sched_yield();
    if (again)
        gate_kick(); /* park again after the fds ready now were served */
}

/* A net_memif port opens: the interrupt thread is held from now on. */
static int gate_hold(void)
{
    int rc = CFX_OK;
    pthread_mutex_lock(&gate.lock);
    if (!gate.ready) {
        cfx__cond_init_mono(&gate.cond);
        gate.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        gate.ih = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
        if (gate.efd < 0 || !gate.ih || rte_intr_fd_set(gate.ih, gate.efd) != 0 ||
            rte_intr_type_set(gate.ih, RTE_INTR_HANDLE_EXT) != 0 ||
            rte_intr_callback_register(gate.ih, gate_park, NULL) != 0) {
            CFX_LOG(ERR, DPDK, "interrupt-thread gate: no eventfd or EAL callback: %s",
                    gate.efd < 0 ? strerror(errno) : rte_strerror(rte_errno));
            rte_intr_instance_free(gate.ih);
            gate.ih = NULL;
            if (gate.efd >= 0)
                close(gate.efd);
            gate.efd = -1;
            pthread_cond_destroy(&gate.cond);
            rc = CFX_ERR_IO;
            goto out;
        }
        gate.ready = true;
    }
    if (gate.holders++ == 0)
        gate_kick();
out:
    pthread_mutex_unlock(&gate.lock);
    return rc;
}

/* A net_memif port closed: the last one lets the interrupt thread go. */
static void gate_drop(void)
{
    pthread_mutex_lock(&gate.lock);
    gate.holders--;
    pthread_cond_broadcast(&gate.cond);
    pthread_mutex_unlock(&gate.lock);
}

/* Enters a data-path section of port if the interrupt thread is parked. */
static inline bool gate_try(const struct cfx__dpdk_port *port)
{
    if (unlikely(port->test_gate_shut))
        return false;
    if (!port->gated)
        return true;
    /* seq_cst both ways: gate_park stores parked then loads inside, we add
     * to inside then load parked, so one of us sees the other */
    atomic_fetch_add(&gate.inside, 1);
    if (likely(atomic_load(&gate.parked)))
        return true;
    atomic_fetch_sub(&gate.inside, 1);
    return false;
}

static inline void gate_leave(const struct cfx__dpdk_port *port)
{
    if (port->gated)
        atomic_fetch_sub(&gate.inside, 1);
}

/* gate_try, waiting up to timeout_ms for the interrupt thread to park. */
static bool gate_enter_wait(const struct cfx__dpdk_port *port, int timeout_ms)
{
    uint64_t deadline = cfx__deadline_ns(timeout_ms);
    struct timespec until = { .tv_sec = (time_t)(deadline / 1000000000ull),
                              .tv_nsec = (long)(deadline % 1000000000ull) };
    for (;;) {
        if (gate_try(port))
            return true;
        int rc = 0;
        pthread_mutex_lock(&gate.lock);
        while (!atomic_load(&gate.parked) && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&gate.cond, &gate.lock, &until);
        pthread_mutex_unlock(&gate.lock);
        if (rc == ETIMEDOUT)
            return gate_try(port);
    }
}

const char *cfx__dpdk_env(const char *name)
{
    const char *v = getenv(name);
    return v && v[strspn(v, " \t")] ? v : NULL;
}

const char *cfx__dpdk_eal_why(void)
{
    return eal_why[0] ? eal_why : NULL;
}

/* CFX_DPDK_EAL when set to something (set but empty means the defaults). */
static const char *eal_env(void)
{
    return cfx__dpdk_env("CFX_DPDK_EAL");
}

/*
 * The words of an EAL line, looked at before EAL runs: EAL skips a word
 * that is not one of its options (cfx__dpdk_eal_init refuses the start
 * then), but only after it set itself up, and a failure there (hugepages,
 * where the word was meant to be --no-huge) would be told instead of the
 * word.  A word with a quote in it is refused: the line is split at
 * blanks, not as a shell would, so its quotes would reach EAL.  So is a
 * word that cannot be the value of the word before it: the first word, one
 * after a word that is not an option (itself a value, or stray), after
 * "--", or after an option given its value with '='.  A word after an
 * option that takes none (--no-pci junk) is told from a value only by
 * EAL's own option table: EAL's parse finds it.  Returns the word, or NULL.
 */
static const char *eal_word_stray(int argc, char *const argv[], bool *quote)
{
    bool may_be_value = false; /* the word before may take the next as its value */
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        *quote = strpbrk(w, "\"'") != NULL;
        if (*quote)
            return w;
        bool option = w[0] == '-' && w[1];
        if (!option && !may_be_value)
            return w;
        may_be_value = option && strcmp(w, "--") && !strchr(w, '=');
    }
    return NULL;
}

/*
 * The keys of DPDK 22.11's net_memif: valid_arguments[] of
 * drivers/net/memif/rte_eth_memif.c, as librte_net_memif.so.23 (22.11.11)
 * has them.  The driver hands them to rte_kvargs_parse(), which fails on a
 * key not among them, and then goes on with every default: a client on
 * /run/memif.sock, whatever role and socket were given.  (owner-uid and
 * owner-gid came in a later release.)  Another release's list is not known
 * here: built against one, the keys are not checked.
 */
#if RTE_VER_YEAR == 22 && RTE_VER_MONTH == 11
#define MEMIF_KEYS_OF "DPDK 22.11's net_memif takes "
static const char *const memif_keys[] = {
    "id", "role", "bsize", "rsize", "socket", "socket-abstract", "mac", "zero-copy", "secret", NULL
};
#else
#define MEMIF_KEYS_OF ""
static const char *const memif_keys[] = { NULL };
#endif

/*
 * A net_memif device of the EAL line (NAME,KEY=VALUE,...; from names the
 * variable it came from): CFX_ERR_INVALID for a key the driver does not
 * know (above), a key without a value (22.11's driver reads the value
 * that is not there: SEGV, with role, socket and id), or a role other than
 * server or client (the driver
 * refuses most others only when it probes the device, leaving EAL up with
 * no port, and takes "master", "slave" and any value containing "server"
 * or "client": the transport tells a server by role=server).  Other
 * devices: CFX_OK.
 */
static int memif_args_check(const char *dev, const char *from)
{
    if (strncmp(dev, "net_memif", strlen("net_memif")))
        return CFX_OK;
    for (const char *p = strchr(dev, ','); p && *p;) {
        const char *key = ++p;
        bool list = false; /* inside a [a,b] value (rte_kvargs): its commas are the value's */
        while (*p && (list || *p != ',')) {
            list = *p == '[' ? true : *p == ']' ? false : list;
            p++;
        }
        int n = (int)(p - key), kn = (int)strcspn(key, "=");
        if (n == 0)
            continue; /* an empty pair, which rte_kvargs skips */
        kn = kn < n ? kn : n;
        bool known = !memif_keys[0];
        for (const char *const *k = memif_keys; *k && !known; k++)
            known = (int)strlen(*k) == kn && !strncmp(key, *k, (size_t)kn);
        if (!known) {
            char keys[160] = "";
            for (int i = 0, off = 0; memif_keys[i] && off < (int)sizeof(keys); i++)
                off += snprintf(keys + off, sizeof(keys) - (size_t)off, "%s%s", i ? ", " : "",
                                memif_keys[i]);
            return cfx__err(CFX_ERR_INVALID, "%s (%s): net_memif has no key \"%.*s\": %s%s "
                            "(with any other key it would start with all of its defaults, a "
                            "client on /run/memif.sock)", from, dev, kn, key, MEMIF_KEYS_OF,
                            keys);
        }
        if (kn == n)
            return cfx__err(CFX_ERR_INVALID, "%s (%s): net_memif's key \"%.*s\" has no value "
                            "(KEY=VALUE)", from, dev, kn, key);
        const char *v = key + kn + 1;
        int vn = n - kn - 1;
        if (kn == 4 && !strncmp(key, "role", 4) &&
            !(vn == 6 && (!strncmp(v, "server", 6) || !strncmp(v, "client", 6))))
            return cfx__err(CFX_ERR_INVALID, "%s (%s): role=%.*s: net_memif's role is server "
                            "or client", from, dev, vn, v);
    }
    return CFX_OK;
}

/* The net_memif devices of an EAL line (--vdev DEV, --vdev=DEV, or an
 * abbreviation getopt takes, --vd=DEV) through memif_args_check(). */
static int eal_vdevs_check(int argc, char *const argv[], const char *from)
{
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        size_t on = strcspn(w, "=");
        if (on < strlen("--vd") || on > strlen("--vdev") || strncmp(w, "--vdev", on))
            continue;
        const char *dev = w[on] ? w + on + 1 : i + 1 < argc ? argv[++i] : NULL;
        int rc = dev ? memif_args_check(dev, from) : CFX_OK;
        if (rc != CFX_OK)
            return rc;
    }
    return CFX_OK;
}

int cfx__dpdk_eal_init(const char *args)
{
    bool own_prefix = false;
    char defaults[512];
    char *copy = NULL;
    char *argv[EAL_ARGV_MAX];
    int argc = 0, rc;
    cpu_set_t cpus;

    pthread_mutex_lock(&eal_lock);
    if (eal_state) {
        rc = eal_state > 0 ? CFX_OK : eal_state;
        if (rc != CFX_OK && eal_why[0])
            cfx__err(rc, "%s", eal_why); /* every caller learns why, not only the first */
        goto out_unlock;
    }
    /* what the user set, for the errors: a default line is CFX_DPDK_VDEV's */
    const char *from = "CFX_DPDK_EAL";
    bool from_vdev = false; /* the line is the default one, with CFX_DPDK_VDEV's device */
    if (!args)
        args = eal_env();
    if (!args) {
        const char *vdev = cfx__dpdk_env("CFX_DPDK_VDEV");
        from = vdev ? "CFX_DPDK_VDEV, in EAL's default line" : "EAL's default line";
        from_vdev = vdev != NULL;
        snprintf(defaults, sizeof(defaults),
                 "--no-huge -m 512 --no-pci --file-prefix=cfx%d -l 0 --log-level=*:warning "
                 "--no-telemetry%s%s",
                 (int)getpid(), vdev ? " --vdev=" : "", vdev ? vdev : "");
        args = defaults;
    }
    /* a file prefix that ends in our pid is ours alone (the default one, and
     * the tests'): its runtime directory is removed at exit */
    const char *fp = strstr(args, "--file-prefix=");
    if (fp) {
        char pid[16];
        size_t n = strcspn(fp, " \t");
        int pl = snprintf(pid, sizeof(pid), "%d", (int)getpid());
        own_prefix = n > (size_t)pl && !strncmp(fp + n - (size_t)pl, pid, (size_t)pl);
    }
    copy = strdup(args);
    if (!copy) {
        rc = CFX_ERR_NOMEM;
        goto out_unlock;
    }
    argv[argc++] = "conflux";
    for (char *save = NULL, *tok = strtok_r(copy, " \t", &save); tok;
         tok = strtok_r(NULL, " \t", &save)) {
        if (argc == EAL_ARGV_MAX - 1) {
            /* told to the caller, now and at every later call, as a word
             * EAL did not take is: the transport's error carries it */
            rc = eal_state = cfx__err(CFX_ERR_INVALID, "%s: more than %d words", from,
                                      EAL_ARGV_MAX - 2);
            snprintf(eal_why, sizeof(eal_why), "%s", cfx_last_error());
            CFX_LOG(ERR, DPDK, "%s", eal_why);
            goto out_free;
        }
        argv[argc++] = tok;
    }
    argv[argc] = NULL;

    /* before EAL: a mistake it would skip, or its driver take as no mistake */
    bool quote;
    const char *stray = eal_word_stray(argc, argv, &quote);
    if (stray) {
        rc = eal_state = cfx__err(CFX_ERR_INVALID,
                                  quote ? "%s (%s): \"%s\": a quote, kept as it is (the line is "
                                          "split at blanks, not as a shell would)"
                                        : "%s (%s): \"%s\" is neither an EAL option nor the "
                                          "value of one",
                                  from, args, stray);
    } else {
        rc = eal_vdevs_check(argc, argv, from_vdev ? "CFX_DPDK_VDEV" : "CFX_DPDK_EAL");
        if (rc != CFX_OK)
            eal_state = rc;
    }
    if (rc != CFX_OK) {
        snprintf(eal_why, sizeof(eal_why), "%s", cfx_last_error());
        CFX_LOG(ERR, DPDK, "%s", eal_why);
        goto out_free;
    }

    /* EAL pins the calling thread to its main lcore: give it its CPUs back */
    bool have_cpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0;
    int took = rte_eal_init(argc, argv);
    /* at once, whatever the outcome: a start refused below (or one EAL
     * failed after its pinning) must not leave the caller's thread, which
     * may go on without dpdk, on one CPU */
    if (have_cpus)
        sched_setaffinity(0, sizeof(cpus), &cpus);
    if (took >= 0 && took + 1 < argc) {
        /* EAL stops at the first word that is not one of its options (or,
         * as glibc's getopt reorders the words, takes all options and
         * leaves the others at the end): every word here is meant for it,
         * so one it did not take is a mistake, and what came after it may
         * have been skipped too */
        char left[256] = "";
        for (int i = took + 1, off = 0; i < argc && off < (int)sizeof(left); i++)
            off += snprintf(left + off, sizeof(left) - (size_t)off, "%s%s", off ? " " : "",
                            argv[i]);
        rc = eal_state = cfx__err(CFX_ERR_INVALID, "%s (%s): EAL did not take \"%s\": "
                                  "not an EAL option, or a value where none belongs", from, args,
                                  left);
        snprintf(eal_why, sizeof(eal_why), "%s", cfx_last_error());
        CFX_LOG(ERR, DPDK, "%s", eal_why);
        rte_eal_cleanup();
        const char *dir = rte_eal_get_runtime_dir();
        if (own_prefix && dir && *dir) {
            snprintf(eal_rundir, sizeof(eal_rundir), "%s", dir);
            eal_rundir_remove();
        }
        goto out_free;
    }
    if (took < 0) {
        /* rte_errno is not set for every failure ("Success"): EAL's own
         * lines above say why then */
        CFX_LOG(ERR, DPDK, "rte_eal_init(%s) failed: %s", args,
                rte_errno ? rte_strerror(rte_errno) : "see EAL's messages before this one");
        /* EAL says EINVAL ("Invalid 'command line' arguments") for an
         * option it does not know and a bad value, but also when it cannot
         * make its runtime directory (an unwritable $XDG_RUNTIME_DIR): no
         * device here, which a list such as dpdk,tcp goes on without; the
         * error names the variable and the line, EAL's own lines say which */
        rc = eal_state = cfx__err(CFX_ERR_NO_DEVICE, "%s (%s): EAL did not start (%s): it "
                                  "refused an option or a value, or could not set itself up; "
                                  "EAL's messages before this one say which", from, args,
                                  rte_errno ? rte_strerror(rte_errno) : "no reason given");
        snprintf(eal_why, sizeof(eal_why), "%s", cfx_last_error());
        /* what it made of its runtime directory goes at once */
        const char *dir = rte_eal_get_runtime_dir();
        if (own_prefix && dir && *dir) {
            snprintf(eal_rundir, sizeof(eal_rundir), "%s", dir);
            eal_rundir_remove();
        }
        goto out_free;
    }
    eal_state = 1;
    rc = CFX_OK;
    if (own_prefix) {
        snprintf(eal_rundir, sizeof(eal_rundir), "%s", rte_eal_get_runtime_dir());
        atexit(eal_rundir_remove);
        eal_rundirs_reap(eal_rundir);
    }
    CFX_LOG(INFO, DPDK, "EAL up (%s), %u ports", args, rte_eth_dev_count_avail());
out_free:
    if (rc)
        free(copy);
    else
        eal_args_kept = copy;
out_unlock:
    pthread_mutex_unlock(&eal_lock);
    return rc;
}

int cfx__dpdk_ports_print(FILE *out, int json, char *why, size_t cap)
{
    char none[600] = ""; /* why there is no port */
    uint16_t pid;
    int n = 0;

    if (json)
        fputc('[', out);
    bool asked = eal_env() || cfx__dpdk_env("CFX_DPDK_VDEV");
    bool eal_up = asked && cfx__dpdk_eal_init(NULL) == CFX_OK;
    if (!asked)
        snprintf(none, sizeof(none), "no port asked for (set CFX_DPDK_VDEV, or CFX_DPDK_EAL with "
                 "--vdev)");
    else if (!eal_up && eal_why[0])
        snprintf(none, sizeof(none), "EAL did not start: %s", eal_why);
    else if (!eal_up)
        snprintf(none, sizeof(none), "EAL did not start (its messages, on stderr, say why)");
    if (eal_up) {
        RTE_ETH_FOREACH_DEV(pid) {
            char name[RTE_ETH_NAME_MAX_LEN];
            struct rte_ether_addr mac;
            if (rte_eth_dev_get_name_by_port(pid, name) != 0 ||
                rte_eth_macaddr_get(pid, &mac) != 0)
                continue;
            /* no link state: it is the link of a started port, and this
             * lists ports it does not start (net_af_packet says "down" for
             * an interface that is up, net_memif until a peer connects) */
            char m[18];
            snprintf(m, sizeof(m), "%02x:%02x:%02x:%02x:%02x:%02x", mac.addr_bytes[0],
                     mac.addr_bytes[1], mac.addr_bytes[2], mac.addr_bytes[3], mac.addr_bytes[4],
                     mac.addr_bytes[5]);
            if (json)
                fprintf(out, "%s{\"name\": \"%s\", \"mac\": \"%s\"}", n ? ", " : "", name, m);
            else
                fprintf(out, "dpdk port %s: mac %s\n", name, m);
            n++;
        }
        /* the variable the user set: CFX_DPDK_EAL rules when both are */
        if (!n)
            snprintf(none, sizeof(none), "EAL started but found no port (check %s)",
                     eal_env() ? "the --vdev or PCI device of CFX_DPDK_EAL" : "CFX_DPDK_VDEV");
    }
    if (json)
        fputc(']', out);
    else if (!n)
        fprintf(out, "dpdk: %s\n", none);
    if (why && cap)
        snprintf(why, cap, "%s", n ? "" : none);
    return n;
}

int cfx__dpdk_port_name(unsigned n, char *name, size_t len)
{
    uint16_t pid;
    char buf[RTE_ETH_NAME_MAX_LEN];

    if (eal_state <= 0)
        return CFX_ERR_NOT_FOUND;
    RTE_ETH_FOREACH_DEV(pid) {
        if (n--)
            continue;
        if (rte_eth_dev_get_name_by_port(pid, buf) != 0)
            return CFX_ERR_NOT_FOUND;
        snprintf(name, len, "%s", buf);
        return CFX_OK;
    }
    return CFX_ERR_NOT_FOUND;
}

static void zc_free_cb(void *addr, void *opaque)
{
    (void)addr; /* the payload is the session's: nothing to free */
    (void)opaque;
}

/*
 * Zero-copy transmit where the device is done with a frame when its burst
 * returns: net_memif (in its default copy mode) and net_af_packet copy
 * each frame into their ring inside rte_eth_tx_burst, so a payload is
 * referred to only until the batch goes.  A device that sends later (a
 * NIC by DMA, net_memif with zero-copy=yes, net_ring) would need the
 * payloads' memory mapped for it and their release tied to its
 * completions: such ports copy.
 */
static bool zc_allowed(const struct rte_eth_dev_info *info)
{
    if (!info->driver_name || !(info->tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS))
        return false;
    if (!strcmp(info->driver_name, "net_af_packet"))
        return true;
    if (strcmp(info->driver_name, "net_memif"))
        return false;
    const struct rte_devargs *da = rte_dev_devargs(info->device);
    return !(da && da->args && strstr(da->args, "zero-copy=yes"));
}

/*
 * The port's MTU: for net_af_packet the kernel interface's (the PMD's own
 * number is its default until set, whatever the interface has; a frame
 * over the interface's MTU is dropped by the kernel, so sessions over it
 * only time out), else the ethdev's.  0 when it cannot be told.
 */
static unsigned port_mtu(uint16_t pid, const struct rte_eth_dev_info *info)
{
    if (info->driver_name && !strcmp(info->driver_name, "net_af_packet")) {
        const struct rte_devargs *da = rte_dev_devargs(info->device);
        const char *at = da && da->args ? strstr(da->args, "iface=") : NULL;
        if (!at)
            return 0;
        struct ifreq ifr = { 0 };
        at += strlen("iface=");
        size_t n = strcspn(at, ",");
        if (n == 0 || n >= sizeof(ifr.ifr_name))
            return 0;
        memcpy(ifr.ifr_name, at, n);
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        int ok = fd >= 0 && ioctl(fd, SIOCGIFMTU, &ifr) == 0;
        if (fd >= 0)
            close(fd);
        return ok && ifr.ifr_mtu > 0 ? (unsigned)ifr.ifr_mtu : 0;
    }
    uint16_t mtu = 0;
    return rte_eth_dev_get_mtu(pid, &mtu) == 0 ? mtu : 0;
}

int cfx__dpdk_port_open(const struct cfx__dpdk_port_params *p, struct cfx__dpdk_port **out)
{
    struct cfx__dpdk_port *port;
    struct rte_eth_conf conf;
    struct rte_ether_addr mac;
    char pool_name[RTE_MEMPOOL_NAMESIZE];
    uint16_t pid = 0, nb_desc = p->nb_desc ? p->nb_desc : 512;
    int rc;

    *out = NULL;
    if (eal_state <= 0)
        return CFX_ERR_NO_DEVICE;
    if (p->name) {
        if (rte_eth_dev_get_port_by_name(p->name, &pid) != 0) {
            CFX_LOG(ERR, DPDK, "no DPDK port %s", p->name);
            return CFX_ERR_NO_DEVICE;
        }
    } else {
        RTE_ETH_FOREACH_DEV(pid) break;
        if (pid >= RTE_MAX_ETHPORTS || !rte_eth_dev_is_valid_port(pid)) {
            CFX_LOG(ERR, DPDK, "no DPDK port (give one with --vdev in CFX_DPDK_EAL)");
            return CFX_ERR_NO_DEVICE;
        }
    }
    port = calloc(1, sizeof(*port));
    if (!port)
        return CFX_ERR_NOMEM;
    port->port_id = pid;
    port->rx_drop_ppm = p->rx_drop_ppm;
    port->rng = p->rx_drop_seed ? p->rx_drop_seed : 1;
    rte_eth_dev_get_name_by_port(pid, port->name);

    snprintf(pool_name, sizeof(pool_name), "cfx_mb%u", pid);
    port->pool = rte_pktmbuf_pool_create(
        pool_name, p->nb_mbufs ? p->nb_mbufs : 4095, 256, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
        (int)rte_eth_dev_socket_id(pid) < 0 ? (int)rte_socket_id() : rte_eth_dev_socket_id(pid));
    if (!port->pool) {
        CFX_LOG(ERR, DPDK, "port %s: mbuf pool: %s", port->name, rte_strerror(rte_errno));
        rc = CFX_ERR_NOMEM;
        goto err_free;
    }
    struct rte_eth_dev_info info;
    if ((rc = rte_eth_dev_info_get(pid, &info)) != 0) {
        CFX_LOG(ERR, DPDK, "port %s: device info: %s", port->name, rte_strerror(-rc));
        rc = CFX_ERR_IO;
        goto err_pool;
    }
    unsigned mtu = port_mtu(pid, &info);
    if (p->mtu_need && mtu && mtu < p->mtu_need) {
        rc = cfx__err(CFX_ERR_INVALID, "port %s: MTU %u, under the %u bytes the frames of this "
                      "transport need (their IP packets); raise it on both ends (for "
                      "net_af_packet: ip link set IFACE mtu %u)", port->name, mtu, p->mtu_need,
                      p->mtu_need);
        CFX_LOG(ERR, DPDK, "%s", cfx_last_error());
        goto err_pool;
    }
    memset(&conf, 0, sizeof(conf));
    port->zc = !p->tx_copy && zc_allowed(&info);
    if (port->zc) {
        snprintf(pool_name, sizeof(pool_name), "cfx_zc%u", pid);
        port->zc_pool = rte_pktmbuf_pool_create(
            pool_name, p->nb_mbufs ? p->nb_mbufs : 4095, 256, 0, 0,
            (int)rte_eth_dev_socket_id(pid) < 0 ? (int)rte_socket_id()
                                                : rte_eth_dev_socket_id(pid));
        if (!port->zc_pool) {
            CFX_LOG(WARN, DPDK, "port %s: no pool for zero-copy transmit (%s): copying",
                    port->name, rte_strerror(rte_errno));
            port->zc = false;
        }
    }
    if (port->zc) {
        conf.txmode.offloads = RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
        port->zc_shinfo.free_cb = zc_free_cb;
        rte_mbuf_ext_refcnt_set(&port->zc_shinfo, 1);
    }
    if ((rc = rte_eth_dev_configure(pid, 1, 1, &conf)) != 0 ||
        (rc = rte_eth_rx_queue_setup(pid, 0, nb_desc, rte_eth_dev_socket_id(pid), NULL,
                                     port->pool)) != 0 ||
        (rc = rte_eth_tx_queue_setup(pid, 0, nb_desc, rte_eth_dev_socket_id(pid), NULL)) != 0) {
        CFX_LOG(ERR, DPDK, "port %s: queue setup: %s", port->name, rte_strerror(-rc));
        rc = CFX_ERR_IO;
        goto err_pool;
    }
    uint64_t start_until = cfx__deadline_ns(p->start_wait_ms);
    /* a memif client before its server: the driver logs each try's failure
     * (a hundred lines a second); the first stays, the tries after it are
     * quiet, and the driver's level is given back after */
    bool is_memif = info.driver_name && !strcmp(info.driver_name, "net_memif");
    int memif_log = -1, memif_level = 0;
    while ((rc = rte_eth_dev_start(pid)) != 0 && cfx__now_ns() < start_until) {
        if (is_memif && memif_log < 0 && (memif_log = rte_log_register("pmd.net.memif")) >= 0) {
            memif_level = rte_log_get_level((uint32_t)memif_log);
            rte_log_set_level((uint32_t)memif_log, RTE_LOG_CRIT);
        }
        usleep(10000);
    }
    if (memif_log >= 0 && memif_level >= 0)
        rte_log_set_level((uint32_t)memif_log, (uint32_t)memif_level);
    if (rc != 0) {
        /* a memif client finds no server on its socket as "not permitted" */
        bool memif = info.driver_name && !strcmp(info.driver_name, "net_memif");
        rc = cfx__err(CFX_ERR_IO, "port %s: start: %s%s", port->name, rte_strerror(-rc),
                      memif ? " (a net_memif client: is a role=server port up on the same "
                              "socket=?)"
                            : "");
        CFX_LOG(ERR, DPDK, "%s", cfx_last_error());
        goto err_pool;
    }
    port->gated = info.driver_name && !strcmp(info.driver_name, "net_memif");
    port->kernel_shared = info.driver_name && !strcmp(info.driver_name, "net_af_packet");
    if (port->gated) {
        const struct rte_devargs *da = rte_dev_devargs(info.device);
        port->memif_server = da && da->args && strstr(da->args, "role=server");
    }
    if (port->gated && gate_hold() != CFX_OK) {
        rte_eth_dev_stop(pid);
        rc = CFX_ERR_IO;
        goto err_pool;
    }
    if (port->gated)
        CFX_LOG(INFO, DPDK, "port %s: net_memif %s, bursts inside the interrupt-thread gate",
                port->name, port->memif_server ? "server" : "client");
    CFX_LOG(INFO, DPDK, "port %s (%s): transmit %s", port->name,
            info.driver_name ? info.driver_name : "?",
            port->zc ? "zero-copy from the payload" : "copies each frame");
    rte_eth_macaddr_get(pid, &mac);
    memcpy(port->local.mac, mac.addr_bytes, 6);
    port->local.ip = p->ip;
    port->local.port = p->udp_port ? p->udp_port : CFX_DPDK_UDP_PORT;
    *out = port;
    return CFX_OK;

err_pool:
    rte_mempool_free(port->zc_pool);
    rte_mempool_free(port->pool);
err_free:
    free(port);
    return rc;
}

/* Hands the batch to the device; inside the gate. */
static unsigned tx_batch(struct cfx__dpdk_port *port)
{
    unsigned n = port->ntx;
    uint16_t sent = unlikely(port->stopped) ? 0
                                            : rte_eth_tx_burst(port->port_id, 0, port->txb,
                                                               (uint16_t)n);
    if (sent < n) {
        /* a full ring loses them: to the layer above, packets lost on the wire */
        rte_pktmbuf_free_bulk(port->txb + sent, n - sent);
        port->stats.tx_full += n - sent;
    }
    port->stats.tx += sent;
    port->ntx = 0;
    return sent;
}

void cfx__dpdk_port_close(struct cfx__dpdk_port *port)
{
    if (!port)
        return;
    /* stop and close disconnect net_memif from this thread: not beside a
     * connect or disconnect on the interrupt thread */
    bool in = gate_enter_wait(port, GATE_WAIT_MS);
    if (!in)
        CFX_LOG(WARN, DPDK, "port %s: EAL's interrupt thread not held after %d ms; closing anyway",
                port->name, GATE_WAIT_MS);
    if (in && port->ntx)
        tx_batch(port); /* what the owner queued last (resets to its peers) */
    rte_pktmbuf_free_bulk(port->txb, port->ntx);
    rte_eth_dev_stop(port->port_id);
    rte_eth_dev_close(port->port_id);
    if (in)
        gate_leave(port);
    if (port->gated)
        gate_drop();
    rte_mempool_free(port->zc_pool);
    rte_mempool_free(port->pool);
    free(port);
}

void cfx__dpdk_port_addr(const struct cfx__dpdk_port *port, struct cfx__dpdk_addr *out)
{
    *out = port->local;
}

int cfx__dpdk_port_restart(struct cfx__dpdk_port *port)
{
    /* a memif server waits for its client to connect again: restarting it
     * cuts a handshake in progress (a client that restarts at the same time
     * is then turned away again) */
    if (port->memif_server)
        return 1;
    if (!gate_enter_wait(port, GATE_WAIT_MS)) {
        CFX_LOG(WARN, DPDK, "port %s: restart: EAL's interrupt thread not held after %d ms",
                port->name, GATE_WAIT_MS);
        return CFX_ERR_IO;
    }
    if (port->ntx)
        tx_batch(port);
    rte_eth_dev_stop(port->port_id);
    int rc = rte_eth_dev_start(port->port_id);
    port->stopped = rc != 0;
    gate_leave(port);
    if (rc != 0) {
        /* said at the first failure and then at every doubling, not at
         * every try: a peer that is gone for good makes them fail alike */
        unsigned n = ++port->restart_fails;
        if ((n & (n - 1)) == 0)
            CFX_LOG(WARN, DPDK, "port %s: restart failed %u time%s in a row: %s%s", port->name,
                    n, n == 1 ? "" : "s", rte_strerror(-rc),
                    port->gated && !port->memif_server ? " (its memif server is not there)"
                                                       : "");
        return CFX_ERR_IO;
    }
    port->restart_fails = 0;
    return CFX_OK;
}

bool cfx__dpdk_port_is_memif_client(const struct cfx__dpdk_port *port)
{
    return port->gated && !port->memif_server;
}

int cfx__dpdk_port_link_up(struct cfx__dpdk_port *port)
{
    struct rte_eth_link link;
    if (rte_eth_link_get_nowait(port->port_id, &link) != 0)
        return 0;
    return link.link_status == RTE_ETH_LINK_UP;
}

int cfx__dpdk_port_flush(struct cfx__dpdk_port *port)
{
    if (!port->ntx)
        return 0;
    if (unlikely(!gate_try(port))) {
        port->stats.gated++; /* the batch waits for the next flush */
        return 0;
    }
    unsigned sent = tx_batch(port);
    gate_leave(port);
    return (int)sent;
}

int cfx__dpdk_port_tx(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *dst,
                      const struct cfx__dpdk_hdr *h, const void *payload)
{
    if (unlikely(port->ntx == BURST)) {
        /* the batch could not go (gate open): this frame is lost on the wire */
        port->stats.tx_full++;
        return CFX_OK;
    }
    struct rte_mbuf *m = rte_pktmbuf_alloc(port->pool);
    if (unlikely(!m))
        return CFX_ERR_AGAIN;
    size_t cap = rte_pktmbuf_tailroom(m);
    int len =
        cfx__dpdk_frame_build(rte_pktmbuf_mtod(m, void *), cap, &port->local, dst, h, payload);
    if (unlikely(len < 0)) {
        rte_pktmbuf_free(m);
        return len;
    }
    m->data_len = (uint16_t)len;
    m->pkt_len = (uint32_t)len;
    port->txb[port->ntx++] = m;
    if (port->ntx == BURST)
        cfx__dpdk_port_flush(port);
    return CFX_OK;
}

void cfx__dpdk_port_test_gate_shut(struct cfx__dpdk_port *port, bool shut)
{
    port->test_gate_shut = shut;
}

bool cfx__dpdk_port_zc(const struct cfx__dpdk_port *port)
{
    return port->zc;
}

bool cfx__dpdk_port_kernel_shared(const struct cfx__dpdk_port *port)
{
    return port->kernel_shared;
}

int cfx__dpdk_port_tx_zc(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *dst,
                         const struct cfx__dpdk_hdr *h, const void *payload)
{
    if (!port->zc || h->len < CFX_DPDK_ZC_MIN)
        return cfx__dpdk_port_tx(port, dst, h, payload);
    if (unlikely(port->ntx == BURST)) {
        port->stats.tx_full++; /* as cfx__dpdk_port_tx */
        return CFX_OK;
    }
    struct rte_mbuf *m = rte_pktmbuf_alloc(port->pool);
    if (unlikely(!m))
        return CFX_ERR_AGAIN;
    struct rte_mbuf *d = rte_pktmbuf_alloc(port->zc_pool);
    if (unlikely(!d)) {
        rte_pktmbuf_free(m);
        return CFX_ERR_AGAIN;
    }
    int len = cfx__dpdk_frame_build_hdr(rte_pktmbuf_mtod(m, void *), rte_pktmbuf_tailroom(m),
                                        &port->local, dst, h, payload);
    if (unlikely(len < 0)) {
        rte_pktmbuf_free(m);
        rte_pktmbuf_free(d);
        return len;
    }
    m->data_len = (uint16_t)len;
    /* software devices only (zc_allowed): they read the payload by its
     * address and never by an IO address */
    rte_mbuf_ext_refcnt_update(&port->zc_shinfo, 1);
    rte_pktmbuf_attach_extbuf(d, (void *)(uintptr_t)payload, RTE_BAD_IOVA, h->len,
                              &port->zc_shinfo);
    d->data_len = h->len;
    d->pkt_len = h->len;
    m->next = d;
    m->nb_segs = 2;
    m->pkt_len = (uint32_t)len + h->len;
    port->stats.tx_zc++;
    port->txb[port->ntx++] = m;
    if (port->ntx == BURST)
        cfx__dpdk_port_flush(port);
    return CFX_OK;
}

void cfx__dpdk_port_settle(struct cfx__dpdk_port *port)
{
    if (!port->zc)
        return;
    if (port->ntx && gate_try(port)) {
        tx_batch(port);
        gate_leave(port);
    }
    if (port->ntx) {
        /* the gate is open: the frames sent from payloads are lost (their
         * memory may go as soon as this returns); copied ones (a reset, an
         * ack) wait for the next flush */
        unsigned kept = 0;
        for (unsigned i = 0; i < port->ntx; i++) {
            struct rte_mbuf *m = port->txb[i];
            if (m->nb_segs == 1) {
                port->txb[kept++] = m;
                continue;
            }
            rte_pktmbuf_free(m);
            port->stats.tx_full++;
        }
        port->ntx = kept;
    }
    uint16_t held = rte_mbuf_ext_refcnt_read(&port->zc_shinfo) - 1;
    if (likely(!held))
        return;
    /* a device that keeps frames after their burst: ask it for them back
     * for a while, then stop sending from payloads */
    uint64_t until = cfx__deadline_ns(100);
    while (held && cfx__now_ns() < until) {
        rte_eth_tx_done_cleanup(port->port_id, 0, 0);
        held = rte_mbuf_ext_refcnt_read(&port->zc_shinfo) - 1;
    }
    port->stats.zc_held = held;
    if (held) {
        CFX_LOG(ERR, DPDK, "port %s: the device still holds %u frames sent from payloads: "
                "copying from now on", port->name, held);
        port->zc = false;
    }
}

static bool rx_drop(struct cfx__dpdk_port *port)
{
    if (!port->rx_drop_ppm)
        return false;
    /* xorshift64 */
    uint64_t x = port->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    port->rng = x;
    return x % 1000000 < port->rx_drop_ppm;
}

/*
 * A frame to our address whose reliability header was refused: a peer of
 * another release (another wire version), a broken or hostile one.  Frames
 * not to our address (on net_af_packet, everything else on the link) are
 * only counted.  Logged once per REFUSE_LOG_NS at most, whoever sends
 * them, with the count refused in between.
 */
#define REFUSE_LOG_NS 10000000000ull

static void refused_log(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *src,
                        const char *why)
{
    uint64_t now = cfx__now_ns();
    if (now < port->refuse_log_at) {
        port->refused_quiet++;
        return;
    }
    CFX_LOG(WARN, DPDK,
            "port %s: refused a frame from %u.%u.%u.%u:%u: %s (%" PRIu64
            " more refused since the last report)",
            port->name, src->ip >> 24, src->ip >> 16 & 0xFF, src->ip >> 8 & 0xFF, src->ip & 0xFF,
            src->port, why ? why : "?", port->refused_quiet);
    port->refused_quiet = 0;
    port->refuse_log_at = now + REFUSE_LOG_NS;
}

int cfx__dpdk_port_rx(struct cfx__dpdk_port *port, cfx__dpdk_rx_cb cb, void *ctx)
{
    struct rte_mbuf *rxb[BURST];
    if (unlikely(port->stopped))
        return 0;
    if (unlikely(!gate_try(port))) {
        port->stats.gated++;
        return 0;
    }
    uint16_t n = rte_eth_rx_burst(port->port_id, 0, rxb, BURST);
    int taken = 0;

    for (uint16_t i = 0; i < n; i++) {
        struct rte_mbuf *m = rxb[i];
        struct cfx__dpdk_addr src;
        struct cfx__dpdk_hdr h;
        const void *payload;
        const char *why;

        if (rx_drop(port)) {
            port->stats.rx_dropped++;
            continue;
        }
        src.ip = 0;
        if (unlikely(m->nb_segs != 1) ||
            cfx__dpdk_frame_parse(rte_pktmbuf_mtod(m, const void *), m->data_len, &port->local,
                                  &src, &h, &payload, &why) != CFX_OK) {
            port->stats.rx_refused++;
            if (src.ip)
                refused_log(port, &src, m->nb_segs != 1 ? "a frame in segments" : why);
            continue;
        }
        port->stats.rx++;
        taken++;
        cb(ctx, &src, &h, payload);
    }
    rte_pktmbuf_free_bulk(rxb, n);
    gate_leave(port); /* after the callbacks: zero-copy mbufs point into the regions */
    return taken;
}

void cfx__dpdk_port_get_stats(const struct cfx__dpdk_port *port, struct cfx__dpdk_port_stats *out)
{
    *out = port->stats;
}

/*
 * dpdk transport, packet I/O: UDP/IPv4/Ethernet frames carrying the
 * reliability header (dpdk_rel.h), and one DPDK port with one rx/tx queue
 * pair to send and receive them.
 *
 * The frame functions (dpdk_frame.c) are pure C over bytes and build
 * everywhere; the port (dpdk_io.c) exists only when DPDK was found
 * (CFX_HAVE_DPDK).  No DPDK type appears here, so callers and tests need no
 * DPDK headers.
 *
 * Threads: EAL initialisation is process-wide and may be called from any
 * thread (once wins); a port is used by one thread at a time.
 */
#ifndef CFX_DPDK_IO_H
#define CFX_DPDK_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dpdk_rel.h"

#define CFX_DPDK_ETH_LEN 14u /* Ethernet II header, no VLAN tag */
#define CFX_DPDK_IP_LEN  20u /* IPv4 header, no options */
#define CFX_DPDK_UDP_LEN 8u
#define CFX_DPDK_FRAME_HDRS     (CFX_DPDK_ETH_LEN + CFX_DPDK_IP_LEN + CFX_DPDK_UDP_LEN)
#define CFX_DPDK_FRAME_OVERHEAD (CFX_DPDK_FRAME_HDRS + CFX_DPDK_HDR_MAX) /* at most */
#define CFX_DPDK_UDP_PORT 4791u /* default UDP port (any free port does) */

/* One end of a flow: where a frame comes from or goes to. */
struct cfx__dpdk_addr {
    uint8_t mac[6]; /* Ethernet address */
    uint32_t ip;    /* IPv4 address, host order */
    uint16_t port;  /* UDP port, host order */
};

/*
 * Writes the frame src -> dst carrying h and its h->len payload bytes into
 * buf (cap bytes), with the IPv4 header and UDP checksums filled in.
 * Returns the frame length, or CFX_ERR_TOO_BIG when it does not fit cap.
 */
int cfx__dpdk_frame_build(void *buf, size_t cap, const struct cfx__dpdk_addr *src,
                          const struct cfx__dpdk_addr *dst, const struct cfx__dpdk_hdr *h,
                          const void *payload);

/*
 * The same frame's headers only (at most CFX_DPDK_FRAME_OVERHEAD bytes
 * into buf; their length is returned), for a payload sent from where it lies: the UDP checksum
 * covers the h->len bytes read at payload, which are not copied.
 * CFX_ERR_TOO_BIG when the headers do not fit cap.
 */
int cfx__dpdk_frame_build_hdr(void *buf, size_t cap, const struct cfx__dpdk_addr *src,
                              const struct cfx__dpdk_addr *dst, const struct cfx__dpdk_hdr *h,
                              const void *payload);

/*
 * Checks a received frame of len bytes against the local address: refuses
 * (CFX_ERR_PROTO, *why says why) another ethertype or VLAN tag, another
 * destination MAC, IP or UDP port, IPv4 options or fragments, a protocol
 * other than UDP, lengths that disagree with the frame, a bad IPv4 or UDP
 * checksum (a zero UDP checksum means none, as IPv4 allows), and whatever
 * cfx__dpdk_hdr_decode refuses.  On success fills *src, *h and *payload
 * (pointing into buf).  *src is filled as soon as the frame is found to be
 * a sound UDP datagram to local, before its reliability header is
 * decoded: after a refusal, a *src changed from what the caller left there
 * names a sender whose header was refused (another wire version, say).
 */
int cfx__dpdk_frame_parse(const void *buf, size_t len, const struct cfx__dpdk_addr *local,
                          struct cfx__dpdk_addr *src, struct cfx__dpdk_hdr *h, const void **payload,
                          const char **why);

/* --- the DPDK port (CFX_HAVE_DPDK only) ----------------------------------- */

struct cfx__dpdk_port;

/* Port parameters; zero fields take the defaults in brackets. */
struct cfx__dpdk_port_params {
    const char *name;      /* ethdev name (e.g. "net_memif0"); NULL: the first port */
    uint32_t ip;           /* our IPv4 address, host order (required) */
    uint16_t udp_port;     /* our UDP port [CFX_DPDK_UDP_PORT] */
    uint32_t nb_mbufs;     /* mbuf pool size [4095] */
    uint16_t nb_desc;      /* descriptors per queue [512] */
    uint32_t rx_drop_ppm;  /* test hook: drop this many received frames per million */
    uint64_t rx_drop_seed; /* and the seed of that choice */
    uint32_t start_wait_ms; /* a port that does not start (a net_memif client whose
                               server is not up yet) is tried again every 10 ms
                               for this long [0: once] */
    bool tx_copy;           /* copy every payload into its mbuf (no zero-copy transmit) */
    uint32_t mtu_need;      /* IP MTU the frames sent need: a port whose MTU is less is
                               refused (CFX_ERR_INVALID) [0: not checked] */
};

struct cfx__dpdk_port_stats {
    uint64_t rx;         /* frames taken */
    uint64_t rx_refused; /* frames refused by cfx__dpdk_frame_parse */
    uint64_t rx_dropped; /* frames dropped by the rx_drop_ppm hook */
    uint64_t tx;         /* frames handed to the device */
    uint64_t tx_full;    /* frames the device queue did not take */
    uint64_t tx_zc;      /* frames whose payload went from where it lies (zero-copy) */
    uint64_t zc_held;    /* payloads the device still held after the last settle */
    uint64_t gated;      /* bursts put off: EAL's interrupt thread was not held
                            (net_memif, dpdk_io.c) */
};

/* The environment variable @p name when set to something other than blanks,
 * else NULL: a variable set empty is one not set. */
const char *cfx__dpdk_env(const char *name);

/*
 * Initialises DPDK's EAL once per process.  args: the EAL command line, or
 * NULL for $CFX_DPDK_EAL, or when that is unset the default
 *   --no-huge -m 512 --no-pci --file-prefix=cfx<pid> -l 0 --log-level=*:warning
 * (and --no-telemetry) plus --vdev=$CFX_DPDK_VDEV when set.  (--in-memory is refused with
 * --no-huge in DPDK 22.11, and --no-shconf breaks net_memif.)  The calling
 * thread keeps its CPU affinity.  Returns 0 (also on later calls), or, now
 * or on the first call: CFX_ERR_INVALID for a word EAL would not take as
 * an option (the error names CFX_DPDK_EAL, or CFX_DPDK_VDEV in the default
 * line) or one with a quote, and for a net_memif device with a key its
 * driver does not know, a key without a value or a role other than server
 * or client (these are found before EAL starts, and so are the stray words
 * that need no knowledge of EAL's options), CFX_ERR_NO_DEVICE when EAL
 * failed (an option or value it refused included: it says EINVAL for those
 * and for a runtime directory it cannot make alike); the error names the
 * variable and the line (or the device).
 */
int cfx__dpdk_eal_init(const char *args);

/* Why EAL did not start, when that failure has a text of its own (else
 * NULL): what cfx__dpdk_eal_init() said, for later callers to repeat. */
const char *cfx__dpdk_eal_why(void);

/*
 * Lists the DPDK ports (rdmactl devices) on out: text lines
 * "dpdk port NAME: mac M", or with json a JSON array of {"name", "mac"}
 * objects.  EAL is started only when CFX_DPDK_EAL or CFX_DPDK_VDEV asks
 * for it (no port exists otherwise).  With no port, why (cap bytes, when
 * not NULL) says why: nothing asked for, EAL did not start (and the error
 * it failed with), none found; the text form prints it too, as a line
 * "dpdk: WHY", and json prints [] (the caller puts why beside it); with
 * ports why is "".  Returns the number of ports.
 */
int cfx__dpdk_ports_print(FILE *out, int json, char *why, size_t cap);

/* Name of the n-th available port (0, 1, ...) in name (len bytes).
 * CFX_ERR_NOT_FOUND past the last port or before EAL is up. */
int cfx__dpdk_port_name(unsigned n, char *name, size_t len);

/* Opens and starts the port; *out on success.  CFX_ERR_NO_DEVICE when no
 * such port, CFX_ERR_NOMEM for the pool, CFX_ERR_IO when it did not start. */
int cfx__dpdk_port_open(const struct cfx__dpdk_port_params *p, struct cfx__dpdk_port **out);
/* Stops and frees the port; NULL is a no-op. */
void cfx__dpdk_port_close(struct cfx__dpdk_port *port);
/* Our address (MAC of the port, IP and UDP port of the parameters). */
void cfx__dpdk_port_addr(const struct cfx__dpdk_port *port, struct cfx__dpdk_addr *out);
/* Stops and starts the port again (a net_memif client whose server turned
 * it away before it was ready connects anew).  A net_memif server is left
 * as it is (its client comes back to it; a restart would cut the handshake
 * of a client restarting at the same moment): 1.  Otherwise 0, or
 * CFX_ERR_IO when it did not start again (its peer gone): the port then
 * sends and receives nothing (its frames count as lost) until a later
 * restart succeeds. */
int cfx__dpdk_port_restart(struct cfx__dpdk_port *port);
/* 1 when the link is up, 0 when not. */
int cfx__dpdk_port_link_up(struct cfx__dpdk_port *port);
/* A net_memif port in the client role (its link waits for a server). */
bool cfx__dpdk_port_is_memif_client(const struct cfx__dpdk_port *port);

/*
 * Builds one frame to dst into an mbuf of the batch; the batch goes out
 * when full or at cfx__dpdk_port_flush.  Returns 0, CFX_ERR_AGAIN when no
 * mbuf is free, CFX_ERR_TOO_BIG when the frame does not fit one mbuf.
 * (Fits cfx__dpdk_rel_ops.tx through a small adapter holding dst.)
 */
int cfx__dpdk_port_tx(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *dst,
                      const struct cfx__dpdk_hdr *h, const void *payload);
/*
 * The same, but a payload of at least CFX_DPDK_ZC_MIN bytes is not copied
 * (zero-copy transmit: a second mbuf segment attached to it as an external
 * buffer) where the port allows it (cfx__dpdk_port_zc).  The payload must
 * then stay valid until the next cfx__dpdk_port_settle: call it before
 * freeing or deregistering memory that payloads were sent from.
 */
int cfx__dpdk_port_tx_zc(struct cfx__dpdk_port *port, const struct cfx__dpdk_addr *dst,
                         const struct cfx__dpdk_hdr *h, const void *payload);
#define CFX_DPDK_ZC_MIN 512u
/* Test hook: while shut, every burst of the port is put off as when EAL's
 * interrupt thread is not held (the gate of dpdk_io.c), whatever the
 * device: frames wait in the batch, nothing is received.  Open it again
 * before closing the port. */
void cfx__dpdk_port_test_gate_shut(struct cfx__dpdk_port *port, bool shut);
/* Whether cfx__dpdk_port_tx_zc sends from the payload where it lies. */
bool cfx__dpdk_port_zc(const struct cfx__dpdk_port *port);
/* Whether the kernel's network stack also gets the frames this port
 * receives (net_af_packet on an interface the kernel runs). */
bool cfx__dpdk_port_kernel_shared(const struct cfx__dpdk_port *port);
/* Sends the batch; frames the device does not take are freed and counted
 * (the reliability layer retransmits them).  Returns frames sent. */
int cfx__dpdk_port_flush(struct cfx__dpdk_port *port);
/*
 * After it, no frame refers to a payload given to cfx__dpdk_port_tx_zc:
 * the batch is sent (or, when it cannot go now, its frames sent from
 * payloads are dropped: lost on the wire, to the layer above; copied ones
 * wait for the next flush), and the device holds none of them.
 */
void cfx__dpdk_port_settle(struct cfx__dpdk_port *port);

/* Called for each frame received for us; payload is valid during the call. */
typedef void (*cfx__dpdk_rx_cb)(void *ctx, const struct cfx__dpdk_addr *src,
                                const struct cfx__dpdk_hdr *h, const void *payload);
/* Receives one burst, hands each frame of ours to cb and frees them all.
 * Returns the frames taken (refused and dropped ones not counted). */
int cfx__dpdk_port_rx(struct cfx__dpdk_port *port, cfx__dpdk_rx_cb cb, void *ctx);

void cfx__dpdk_port_get_stats(const struct cfx__dpdk_port *port, struct cfx__dpdk_port_stats *out);

#endif

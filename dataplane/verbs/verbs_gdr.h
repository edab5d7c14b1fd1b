/*
 * verbs transport: GPUDirect RDMA registration of CUDA device memory.
 *
 * Tried in this order, the first that works is used and named once in the
 * log (INFO):
 *   1. dma-buf: the buffer's dma-buf fd from the CUDA driver
 *      (cuMemGetHandleForAddressRange) registered with ibv_reg_dmabuf_mr()
 *      (Linux 5.12+, rdma-core 34+, an NVIDIA open kernel module);
 *   2. peer memory: ibv_reg_mr() on the device pointer, which works when
 *      the nvidia-peermem (or older nv_peer_mem) module is loaded;
 *   3. neither: registration fails with CFX_ERR_UNSUPPORTED and the engine
 *      stages the object through pinned host memory (gpu/cuda).
 * CFX_GPUDIRECT=auto (default) does exactly that; =off skips 1 and 2
 * (always stage); =on makes 3 a loud error (logged at ERR) instead of a
 * silent fallback.
 *
 * Called from the rcache's registration callback (verbs_mr.c), on whichever
 * thread registers; thread safe.
 */
#ifndef CFX_VERBS_GDR_H
#define CFX_VERBS_GDR_H

#include <stddef.h>

#include <infiniband/verbs.h>

/* Internal rcache access bit: the range is CUDA device memory.  Never seen
 * by the NIC; keeps device regions apart from host ones in the cache. */
#define CFX__VERBS_ACCESS_CUDA (1u << 30)

enum cfx__gdr_mode {
    CFX__GDR_AUTO = 0, /* dma-buf, then peer memory, else staging */
    CFX__GDR_ON,       /* as auto, but failing to register is an error */
    CFX__GDR_OFF,      /* never register device memory: always stage */
};

/* CFX_GPUDIRECT, parsed once (a bad value warns and means auto). */
enum cfx__gdr_mode cfx__verbs_gdr_mode(void);

/*
 * Register CUDA device memory [addr, addr + len) in @p pd with IBV_ACCESS_*
 * @p ibv_access, by dma-buf or peer memory (see above).
 * @param dev_name  the HCA, for messages
 * @return CFX_OK with *out set; CFX_ERR_UNSUPPORTED when neither path works
 *         (or CFX_GPUDIRECT=off, or no CUDA in this build), the detail
 *         naming why each path failed.
 */
int cfx__verbs_gdr_reg(struct ibv_pd *pd, const char *dev_name, void *addr, size_t len,
                       int ibv_access, struct ibv_mr **out);

#endif

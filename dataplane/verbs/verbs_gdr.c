/* verbs transport: GPUDirect RDMA registration (see verbs_gdr.h). */
#include "verbs_gdr.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <conflux/status.h>

#include "dataplane/common/log.h"
#include "dataplane/common/util.h"
#ifdef CFX_HAVE_CUDA
#include "gpu/cuda/cfx_cuda.h"
#endif

static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
static enum cfx__gdr_mode mode;

static void mode_parse(void)
{
    const char *v = cfx__env_str("CFX_GPUDIRECT", "auto");

    if (!strcasecmp(v, "auto") || !*v)
        mode = CFX__GDR_AUTO;
    else if (!strcasecmp(v, "on") || !strcmp(v, "1"))
        mode = CFX__GDR_ON;
    else if (!strcasecmp(v, "off") || !strcmp(v, "0"))
        mode = CFX__GDR_OFF;
    else {
        CFX_LOG(WARN, VERBS, "CFX_GPUDIRECT=%s: expected auto, on or off; using auto", v);
        mode = CFX__GDR_AUTO;
    }
}

enum cfx__gdr_mode cfx__verbs_gdr_mode(void)
{
    pthread_once(&mode_once, mode_parse);
    return mode;
}

#ifdef CFX_HAVE_CUDA
enum { PATH_DMABUF = 1, PATH_PEERMEM = 2, PATH_STAGING = 4 };
static unsigned logged; /* paths already named in the log */

/* Name the path taken, once per path and process. */
static void log_path_once(unsigned path, const char *dev_name, const char *detail)
{
    if (__atomic_fetch_or(&logged, path, __ATOMIC_RELAXED) & path)
        return;
    if (path == PATH_STAGING)
        CFX_LOG(INFO, VERBS, "%s: GPUDirect RDMA unavailable, CUDA memory is staged through "
                "pinned host memory (%s)", dev_name, detail);
    else
        CFX_LOG(INFO, VERBS, "%s: GPUDirect RDMA by %s", dev_name, detail);
}

static int peermem_loaded(void)
{
    return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
           access("/sys/module/nv_peer_mem", F_OK) == 0;
}

int cfx__verbs_gdr_reg(struct ibv_pd *pd, const char *dev_name, void *addr, size_t len,
                       int ibv_access, struct ibv_mr **out)
{
    char why_dmabuf[160] = "", why_peer[96] = "";
    enum cfx__gdr_mode m = cfx__verbs_gdr_mode();
    uint64_t off = 0;
    int fd = -1;

    if (m == CFX__GDR_OFF)
        return cfx__err(CFX_ERR_UNSUPPORTED, "%s: GPUDirect RDMA is off (CFX_GPUDIRECT=off): CUDA "
                        "memory is staged through host memory", dev_name);
    /* NIC writes must be ordered with the application's copies. */
    if (cfx__cuda_set_sync_memops(addr) != CFX_OK)
        CFX_LOG(DEBUG, VERBS, "%s: %s", dev_name, cfx_last_error());

    /* 1. dma-buf */
    int rc = cfx__cuda_dmabuf_fd(addr, len, &fd, &off);
    if (rc == CFX_OK) {
        struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, off, len, (uint64_t)(uintptr_t)addr, fd,
                                              ibv_access);
        int err = errno;
        close(fd); /* the registration holds its own reference to the dma-buf */
        if (mr) {
            log_path_once(PATH_DMABUF, dev_name, "dma-buf (ibv_reg_dmabuf_mr)");
            *out = mr;
            return CFX_OK;
        }
        snprintf(why_dmabuf, sizeof(why_dmabuf), "ibv_reg_dmabuf_mr: %s", strerror(err));
    } else {
        snprintf(why_dmabuf, sizeof(why_dmabuf), "%s", cfx_last_error());
    }

    /* 2. peer memory */
    if (peermem_loaded()) {
        struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, ibv_access);
        if (mr) {
            log_path_once(PATH_PEERMEM, dev_name, "peer memory (nvidia-peermem, ibv_reg_mr)");
            *out = mr;
            return CFX_OK;
        }
        snprintf(why_peer, sizeof(why_peer), "ibv_reg_mr: %s", strerror(errno));
    } else {
        snprintf(why_peer, sizeof(why_peer), "the nvidia-peermem module is not loaded");
    }

    /* 3. neither */
    if (m == CFX__GDR_ON) {
        CFX_LOG(ERR, VERBS, "%s: CFX_GPUDIRECT=on but CUDA memory at %p cannot be registered: "
                "dma-buf: %s; peer memory: %s", dev_name, addr, why_dmabuf, why_peer);
        return cfx__err(CFX_ERR_UNSUPPORTED, "%s: CFX_GPUDIRECT=on but GPUDirect RDMA is "
                        "unavailable (dma-buf: %s; peer memory: %s)", dev_name, why_dmabuf,
                        why_peer);
    }
    char detail[300];
    snprintf(detail, sizeof(detail), "dma-buf: %s; peer memory: %s", why_dmabuf, why_peer);
    log_path_once(PATH_STAGING, dev_name, detail);
    return cfx__err(CFX_ERR_UNSUPPORTED, "%s: no GPUDirect RDMA (%s): stage through host memory",
                    dev_name, detail);
}
#else
int cfx__verbs_gdr_reg(struct ibv_pd *pd, const char *dev_name, void *addr, size_t len,
                       int ibv_access, struct ibv_mr **out)
{
    return cfx__err(CFX_ERR_UNSUPPORTED, "%s: CUDA memory: conflux was built without CUDA",
                    dev_name);
}
#endif

/*
 * A simulated device for testing the device paths of the data plane on
 * machines without a GPU.  Installed, it fills the CUDA slot of the
 * memory-type table (gpu/memtype.h), so every call that takes
 * CFX_MEMTYPE_CUDA buffers runs its device code path against it: staging,
 * per-message bounces, device reductions on the caller's stream, stream
 * ordering and synchronization.
 *
 * It is strict where a real device is, so that a path that passes here is
 * wrong on a GPU only in what the CUDA calls themselves do:
 *  - device memory is not CPU memory: its addresses are mapped PROT_NONE in
 *    this process (the device works on a second mapping of the same pages),
 *    so a host-side read or write of a device buffer faults, as it does on
 *    a GPU;
 *  - work queued on a stream runs later, on the stream's own thread, after
 *    a delay: reading a result before the stream is synchronized reads
 *    stale bytes, and freeing a host buffer a queued copy still reads is a
 *    use after free (which the sanitizers see);
 *  - reductions take device memory only (pageable host memory would fault
 *    a kernel); an unknown stream, a range that crosses the end of its
 *    allocation, or a NULL pointer is refused with CFX_ERR_INVALID.
 * Freeing device memory waits for every stream first (as cudaFree does).
 * It has CFX__GPU_SIM_NDEV devices, current per thread (set_device of the
 * table, as cudaSetDevice; a new thread's is device 0): memory and streams
 * belong to the device current when they are made, and a reduction is
 * refused when launched into a stream of another device than the current
 * one, or on memory of another device (no peer access), as on CUDA.
 * The simulated "legacy default stream" (NULL) is one more stream; it does
 * not implicitly order other streams, which is stricter than CUDA.
 *
 * Process-wide state, like a device driver's.  Only test programs install
 * it; the library never does.
 */
#ifndef CFX_GPU_SIM_H
#define CFX_GPU_SIM_H

#include <stdint.h>

/*
 * Install the simulated device in the CUDA slot of the memory-type table,
 * for the rest of the process.  Call before other threads use memory types.
 * Idempotent.  CFX_OK, or CFX_ERR_NOMEM / CFX_ERR_IO when its default
 * stream cannot start.
 */
int cfx__gpu_sim_install(void);

/* Work a stream has run (counted when done). */
struct cfx__gpu_sim_counts {
    uint64_t copies;    /* copies of any direction */
    uint64_t reduces;   /* reductions ("kernels") */
    uint64_t h2d_bytes; /* host -> device */
    uint64_t d2h_bytes; /* device -> host */
    uint64_t d2d_bytes; /* device -> device */
};

/*
 * Counts of @p stream (NULL: the default stream) since it was created.
 * CFX_OK; CFX_ERR_INVALID when @p stream is not a live simulated stream or
 * the simulator is not installed.
 */
int cfx__gpu_sim_stream_counts(void *stream, struct cfx__gpu_sim_counts *out);

/* Counts of every stream, live or destroyed, since installation. */
void cfx__gpu_sim_counts(struct cfx__gpu_sim_counts *out);

#define CFX__GPU_SIM_NDEV 4 /* devices of the simulated machine */

/* Bit d set: some thread made memory, a stream or work on device d, or
 * made it current (what makes a CUDA context on a GPU). */
unsigned cfx__gpu_sim_devices_used(void);

#endif

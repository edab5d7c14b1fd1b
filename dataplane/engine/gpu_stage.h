/*
 * Objects in device memory through the staging path (gpu_stage.c).
 * Called by cfx_put() / cfx_get() for params->memtype == CFX_MEMTYPE_CUDA
 * after their argument checks (which refuse a type that is not built in or
 * has no device); same contracts and returns as those calls.
 * Thread safety: as cfx_put() / cfx_get().
 */
#ifndef CFX_ENGINE_GPU_STAGE_H
#define CFX_ENGINE_GPU_STAGE_H

#include <stddef.h>

#include <conflux/object.h>

int cfx__gpu_stage_put(struct cfx_context *ctx, const struct cfx_object_id *id, const void *dev,
                       size_t size, const struct cfx_obj_params *params);
int cfx__gpu_stage_get(struct cfx_context *ctx, const struct cfx_object_id *id, void *dev,
                       size_t capacity, size_t *size_out, const struct cfx_obj_params *params);

#endif

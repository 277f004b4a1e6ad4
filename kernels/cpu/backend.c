/*
 * backend.c — the CPU backend's table (kernels/backend.h): host memory
 * (64-byte aligned, zero-filled), copies by memcpy, no streams (every op
 * has finished when it returns), and the op bodies of the other files in
 * kernels/cpu/.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"

/* One CPU: the process itself. */
static int cpu_device_count(void) { return 1; }

/* A CPU context has nothing to create: no stream, no library handles. */
static ts_status cpu_context_init(ts_kctx *ctx, int index) { return TS_OK; }
static void cpu_context_destroy(ts_kctx *ctx) {}

/* Ops finish before they return. */
static ts_status cpu_synchronize(const ts_kctx *ctx) { return TS_OK; }

/* nbytes of host memory, 64-byte aligned (aligned_alloc needs a multiple of
 * the alignment) and zero-filled. */
static ts_status cpu_alloc(size_t nbytes, void **out) {
  size_t total = (nbytes + 63) & ~(size_t)63;
  void *p = total >= nbytes ? aligned_alloc(64, total) : NULL;
  if (!p)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %zu bytes of host memory",
                        nbytes);
  memset(p, 0, total);
  *out = p;
  return TS_OK;
}

/* Frees a block of cpu_alloc. */
static void cpu_free(void *p) { free(p); }

/* Host to host: one memcpy serves all three directions. */
static ts_status cpu_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes) {
  memcpy(dst, src, nbytes);
  return TS_OK;
}

const ts_k_backend ts_k_cpu_backend = {
    .name = "cpu",
    .device = TS_DEVICE_CPU,
    .device_count = cpu_device_count,
    .context_init = cpu_context_init,
    .context_destroy = cpu_context_destroy,
    .synchronize = cpu_synchronize,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .linear_workspace_bytes = ts_cpu_linear_workspace_bytes,
    .linear_bias_workspace_bytes = ts_cpu_linear_workspace_bytes, /* the bias needs no more */
    .embedding_workspace_bytes = ts_cpu_embedding_workspace_bytes,
    .attention_workspace_bytes = ts_cpu_attention_workspace_bytes,
    .attention_state_bytes = ts_cpu_attention_state_bytes,
    .layernorm_workspace_bytes = ts_cpu_layernorm_workspace_bytes,
    .bias_workspace_bytes = ts_cpu_bias_workspace_bytes,
    .linear_fp8_workspace_bytes = ts_cpu_linear_fp8_workspace_bytes,
/* the ops of kernels/ops.h */
#define TS_CPU_ENTRY(name, params) .name = ts_cpu_##name,
    TS_K_OPS(TS_CPU_ENTRY)
#undef TS_CPU_ENTRY
};

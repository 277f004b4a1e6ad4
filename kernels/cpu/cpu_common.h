/*
 * cpu_common.h — private helpers of the CPU kernels (the .c files in kernels/cpu/):
 * dtype-generic element load/store, the per-dtype specialisation idiom, the
 * device check and argument checks. Not part of the public API.
 *
 * Specialisation idiom: a hot loop body lives in a TS_AI (always-inline)
 * function whose last parameter is the storage dtype; the caller invokes it
 * through TS_DT_CALL inside its OpenMP loop, so each call site sees a
 * compile-time constant dtype, ld()/st() fold to a plain load/store, and the
 * fp32 path vectorises as if it were written for fp32 alone.
 */
#ifndef TS_KERNELS_CPU_CPU_COMMON_H
#define TS_KERNELS_CPU_CPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/base.h"
#include "kernels/elementwise.h"
#include "kernels/kernels.h"

#define TS_AI static inline __attribute__((always_inline))

/* Element i of p (storage dtype dt), widened exactly to fp32. */
TS_AI float ld(const void *p, size_t i, ts_dtype dt) {
  if (dt == TS_FP32) return ((const float *)p)[i];
  if (dt == TS_BF16) return ts_bf16_to_f32(((const uint16_t *)p)[i]);
  return ts_f16_to_f32(((const uint16_t *)p)[i]);
}

/* Stores x into element i of p (storage dtype dt), rounding to nearest even. */
TS_AI void st(void *p, size_t i, ts_dtype dt, float x) {
  if (dt == TS_FP32)
    ((float *)p)[i] = x;
  else if (dt == TS_BF16)
    ((uint16_t *)p)[i] = ts_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = ts_f32_to_f16(x);
}

/* Calls fn(args..., DT) with DT a compile-time constant equal to dt. */
#define TS_DT_CALL(dt, fn, ...) \
  do {                          \
    if ((dt) == TS_FP32)        \
      fn(__VA_ARGS__, TS_FP32); \
    else if ((dt) == TS_BF16)   \
      fn(__VA_ARGS__, TS_BF16); \
    else                        \
      fn(__VA_ARGS__, TS_FP16); \
  } while (0)

/* Returns TS_ERR_UNSUPPORTED from a CPU-only op called on a CUDA context,
 * and TS_ERR_INVALID_ARGUMENT for a NULL context or an unknown device. */
#define TS_CPU_ONLY(ctx, op)                                                                     \
  do {                                                                                           \
    if ((ctx) == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", (op));    \
    if ((ctx)->device == TS_DEVICE_CUDA)                                                         \
      return ts_set_error(TS_ERR_UNSUPPORTED, "%s: op has no CUDA implementation yet", (op));    \
    if ((ctx)->device != TS_DEVICE_CPU)                                                          \
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx->device = %d is not a device", (op), \
                          (int)(ctx)->device);                                                   \
  } while (0)

/* Returns TS_ERR_INVALID_ARGUMENT unless dt is fp32, bf16 or fp16. */
#define TS_CHECK_DTYPE(dt, op)                                                                    \
  do {                                                                                            \
    if ((dt) != TS_FP32 && (dt) != TS_BF16 && (dt) != TS_FP16)                                    \
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,                                                \
                          "%s: dtype %d: expected TS_FP32, TS_BF16 or TS_FP16", (op), (int)(dt)); \
  } while (0)

/* Returns TS_ERR_INVALID_ARGUMENT if pointer p is NULL while the op has work. */
#define TS_CHECK_PTR(p, op)                                                                    \
  do {                                                                                         \
    if ((p) == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s is NULL", (op), #p); \
  } while (0)

/* n rounded up to a multiple of 64 (workspace sub-buffers stay 64-byte aligned). */
static inline size_t ts_align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Returns TS_ERR_OUT_OF_MEMORY, naming the op and both sizes, if the context's
 * workspace holds fewer than `need` bytes (or is NULL while need > 0). */
static inline ts_status ts_check_workspace(const ts_kctx *ctx, size_t need, const char *op) {
  if (need == 0) return TS_OK;
  if (ctx->workspace == NULL || ctx->workspace_bytes < need)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s: workspace has %zu bytes, needs %zu (see the op's "
                        "*_workspace_bytes query)",
                        op, ctx->workspace == NULL ? (size_t)0 : ctx->workspace_bytes, need);
  return TS_OK;
}

/* Widens n elements of src (dtype dt) into dst (fp32), in parallel. */
void ts_cpu_widen(float *dst, const void *src, size_t n, ts_dtype dt);
/* Rounds n fp32 elements of src into dst (dtype dt), RNE, in parallel. */
void ts_cpu_narrow(void *dst, const float *src, size_t n, ts_dtype dt);

#endif /* TS_KERNELS_CPU_CPU_COMMON_H */

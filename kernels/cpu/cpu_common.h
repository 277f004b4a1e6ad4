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
 *
 * fp16 conversions use the x86 F16C instructions when the CPU has them (and
 * AVX2, for the bulk loops in cast.c), chosen at run time through
 * ts_cpu_f16c, so the binary does not depend on the build host. They give
 * the bits of kernels/elementwise.h's software conversions for every input:
 * VCVTPS2PH with an immediate round-to-nearest-even narrows exactly like
 * ts_f32_to_f16 (NaN included: both set the quiet bit and keep the sign and
 * the top payload bits); VCVTPH2PS widens exactly except that it quiets a
 * signalling NaN, which ts_f16_to_f32 keeps as is, so inf/NaN inputs take the
 * software path. kernels_convert_test checks both directions bit for bit.
 */
#ifndef TS_KERNELS_CPU_CPU_COMMON_H
#define TS_KERNELS_CPU_CPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/elementwise.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_AI static inline __attribute__((always_inline))

/* 1 where the F16C paths can be compiled in (x86-64 with GCC or Clang). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TS_CPU_X86 1
#else
#define TS_CPU_X86 0
#endif

/* Nonzero when this CPU (and OS) supports F16C and AVX2: fp16 conversions
 * then use F16C, giving the same bits. Set once at load time (cast.c); tests
 * clear it to run the software path. Always 0 where TS_CPU_X86 is 0. */
extern int ts_cpu_f16c;

/* ts_f16_to_f32(h), through VCVTPH2PS when ts_cpu_f16c. Inline asm rather
 * than an intrinsic: an intrinsic needs the caller compiled for F16C, and
 * these loops are compiled for baseline x86-64. The asm also keeps the loops
 * unvectorised, as the software branches do, so omp simd reductions keep
 * their order. */
TS_AI float f16_to_f32(uint16_t h) {
#if TS_CPU_X86
  if (ts_cpu_f16c && (h & 0x7c00u) != 0x7c00u) { /* inf/NaN: software keeps an sNaN */
    float f;
    __asm__("vmovd %k1, %0\n\tvcvtph2ps %0, %0" : "=x"(f) : "r"((uint32_t)h));
    return f;
  }
#endif
  return ts_f16_to_f32(h);
}

/* ts_f32_to_f16(x), through VCVTPS2PH (immediate RNE, whatever MXCSR says)
 * when ts_cpu_f16c. */
TS_AI uint16_t f32_to_f16(float x) {
#if TS_CPU_X86
  if (ts_cpu_f16c) {
    uint32_t r;
    __asm__("vcvtps2ph $0, %1, %1\n\tvmovd %1, %0" : "=r"(r), "+x"(x));
    return (uint16_t)r; /* lane 0; the other lanes held whatever x's register did */
  }
#endif
  return ts_f32_to_f16(x);
}

/* Element i of p (storage dtype dt), widened exactly to fp32. */
TS_AI float ld(const void *p, size_t i, ts_dtype dt) {
  if (dt == TS_FP32) return ((const float *)p)[i];
  if (dt == TS_BF16) return ts_bf16_to_f32(((const uint16_t *)p)[i]);
  return f16_to_f32(((const uint16_t *)p)[i]);
}

/* Stores x into element i of p (storage dtype dt), rounding to nearest even. */
TS_AI void st(void *p, size_t i, ts_dtype dt, float x) {
  if (dt == TS_FP32)
    ((float *)p)[i] = x;
  else if (dt == TS_BF16)
    ((uint16_t *)p)[i] = ts_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = f32_to_f16(x);
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

/* dst[k] = src[i0 + k] widened (src of dtype dt), k < n; one thread, for use
 * inside a parallel loop. Same bits as ld(). */
void ts_cpu_widen_at(float *dst, const void *src, size_t i0, size_t n, ts_dtype dt);
/* dst[i0 + k] = src[k] rounded to dtype dt (RNE), k < n; one thread. Same
 * bits as st(). */
void ts_cpu_narrow_at(void *dst, size_t i0, const float *src, size_t n, ts_dtype dt);

/* Elements per fp32 scratch piece of the ops that run half storage through
 * ts_cpu_widen_at / ts_cpu_narrow_at (4 KiB of stack per buffer). */
enum { TS_CPU_PIECE = 1024 };

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CPU_CPU_COMMON_H */

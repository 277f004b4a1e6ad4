/*
 * cast.c — ts_k_cast (storage conversions between fp32, bf16 and fp16) and
 * the widen/narrow helpers the half-precision paths of other ops use.
 *
 * Invariants: conversions are the bit-exact ones of kernels/elementwise.h
 * (RNE narrowing, exact widening), so CPU and CUDA give the same bits.
 * Work is split in fixed 4096-element chunks; each element is converted
 * independently, so the result does not depend on the thread count.
 */
#include <string.h>

#include "kernels/cpu/cpu_common.h"

#ifdef TS_WITH_CUDA
#include "kernels/cuda/kernels_cuda.h"
#endif

enum { CHUNK = 4096 };

/* Converts elements [lo, hi) from in (IDT) to out (ODT). */
TS_AI void cast_range(void *out, const void *in, size_t lo, size_t hi, ts_dtype idt, ts_dtype odt) {
  for (size_t i = lo; i < hi; i++) st(out, i, odt, ld(in, i, idt));
}

/* cast_range with both dtypes turned into compile-time constants. */
static void cast_range_any(void *out, ts_dtype odt, const void *in, ts_dtype idt, size_t lo,
                           size_t hi) {
  if (odt == idt) {
    if (out != in) {
      size_t es = ts_dtype_size(odt);
      memcpy((char *)out + lo * es, (const char *)in + lo * es, (hi - lo) * es);
    }
    return;
  }
  if (idt == TS_FP32)
    TS_DT_CALL(odt, cast_range, out, in, lo, hi, TS_FP32);
  else if (idt == TS_BF16)
    TS_DT_CALL(odt, cast_range, out, in, lo, hi, TS_BF16);
  else
    TS_DT_CALL(odt, cast_range, out, in, lo, hi, TS_FP16);
}

static void cast_cpu(void *out, ts_dtype odt, const void *in, ts_dtype idt, size_t n) {
  ptrdiff_t nchunks = (ptrdiff_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t c = 0; c < nchunks; c++) {
    size_t lo = (size_t)c * CHUNK;
    size_t hi = lo + CHUNK < n ? lo + CHUNK : n;
    cast_range_any(out, odt, in, idt, lo, hi);
  }
}

void ts_cpu_widen(float *dst, const void *src, size_t n, ts_dtype dt) {
  cast_cpu(dst, TS_FP32, src, dt, n);
}

void ts_cpu_narrow(void *dst, const float *src, size_t n, ts_dtype dt) {
  cast_cpu(dst, dt, src, TS_FP32, n);
}

ts_status ts_k_cast(const ts_kctx *ctx, void *out, ts_dtype out_dt, const void *in, ts_dtype in_dt,
                    size_t n) {
  static const char op[] = "ts_k_cast";
  if (ctx == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", op);
  TS_CHECK_DTYPE(out_dt, op);
  TS_CHECK_DTYPE(in_dt, op);
  if (n == 0) return TS_OK;
  TS_CHECK_PTR(out, op);
  TS_CHECK_PTR(in, op);
  if (out == in && ts_dtype_size(out_dt) != ts_dtype_size(in_dt))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: in == out needs dtypes of equal size, got %s -> %s", op,
                        ts_dtype_name(in_dt), ts_dtype_name(out_dt));
  if (ctx->device == TS_DEVICE_CUDA) {
#ifdef TS_WITH_CUDA
    return ts_k_cast_cuda(ctx, out, out_dt, in, in_dt, n);
#else
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s: ctx->device is CUDA but this build has no CUDA kernels "
                        "(link //kernels:kernels_with_cuda)",
                        op);
#endif
  }
  if (ctx->device != TS_DEVICE_CPU)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx->device = %d is not a device", op,
                        (int)ctx->device);
  cast_cpu(out, out_dt, in, in_dt, n);
  return TS_OK;
}

ts_status ts_k_zero(const ts_kctx *ctx, void *x, size_t nbytes) {
  static const char op[] = "ts_k_zero";
  if (ctx == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", op);
  if (nbytes == 0) return TS_OK;
  TS_CHECK_PTR(x, op);
  if (ctx->device == TS_DEVICE_CUDA) {
#ifdef TS_WITH_CUDA
    return ts_k_zero_cuda(ctx, x, nbytes);
#else
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s: ctx->device is CUDA but this build has no CUDA kernels "
                        "(link //kernels:kernels_with_cuda)",
                        op);
#endif
  }
  if (ctx->device != TS_DEVICE_CPU)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx->device = %d is not a device", op,
                        (int)ctx->device);
  memset(x, 0, nbytes);
  return TS_OK;
}

/*
 * adamw.c — the AdamW optimizer step (Loshchilov & Hutter 2019, Algorithm 2;
 * torch.optim.AdamW's single-tensor path) on fp32 master weights and
 * moments, with an optional rounded copy into the compute parameters.
 *
 * Invariants: the per-element math is ts_adamw_element of
 * kernels/elementwise.h, which the CUDA kernel shares, so CPU and CUDA give
 * the same bits; elements are independent, so results do not depend on the
 * thread count.
 */
#include <math.h>

#include "kernels/cpu/cpu_common.h"

#ifdef TS_WITH_CUDA
#include "kernels/cuda/kernels_cuda.h"
#endif

enum { CHUNK = 4096 };

/* Elements [lo, hi): update master/m/v; store param_out (PDT) if non-NULL. */
TS_AI void adamw_range(float *master, void *param_out, float *m, float *v, const void *grad,
                       size_t lo, size_t hi, ts_adamw_coeffs c, ts_dtype gdt, ts_dtype pdt) {
  for (size_t i = lo; i < hi; i++) {
    float p = ts_adamw_element(master[i], ld(grad, i, gdt), &m[i], &v[i], c);
    master[i] = p;
    if (param_out) st(param_out, i, pdt, p);
  }
}

/* adamw_range with the gradient dtype turned into a compile-time constant. */
TS_AI void adamw_range_g(float *master, void *param_out, float *m, float *v, const void *grad,
                         size_t lo, size_t hi, ts_adamw_coeffs c, ts_dtype pdt, ts_dtype gdt) {
  TS_DT_CALL(pdt, adamw_range, master, param_out, m, v, grad, lo, hi, c, gdt);
}

ts_status ts_k_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                     float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                     const ts_adamw_hparams *hp) {
  static const char op[] = "ts_k_adamw";
  if (ctx == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", op);
  TS_CHECK_PTR(hp, op);
  TS_CHECK_DTYPE(param_dt, op);
  TS_CHECK_DTYPE(grad_dt, op);
  if (hp->step < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: hp->step = %d: expected >= 1 (1-based)", op,
                        hp->step);
  if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f) || !(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: hp->beta1 = %g, hp->beta2 = %g: expected each in [0, 1)", op,
                        (double)hp->beta1, (double)hp->beta2);
  if (n == 0) return TS_OK;
  TS_CHECK_PTR(master, op);
  TS_CHECK_PTR(m, op);
  TS_CHECK_PTR(v, op);
  TS_CHECK_PTR(grad, op);
  if (param_out == (void *)master && param_dt != TS_FP32)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: param_out aliases master but param_dt is %s (needs fp32)", op,
                        ts_dtype_name(param_dt));
  if (ctx->device == TS_DEVICE_CUDA) {
#ifdef TS_WITH_CUDA
    return ts_k_adamw_cuda(ctx, master, param_out, param_dt, m, v, grad, grad_dt, n, hp);
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
  ts_adamw_coeffs c = ts_adamw_make_coeffs(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                           hp->step, hp->grad_scale);
  ptrdiff_t nchunks = (ptrdiff_t)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (ptrdiff_t k = 0; k < nchunks; k++) {
    size_t lo = (size_t)k * CHUNK;
    size_t hi = lo + CHUNK < n ? lo + CHUNK : n;
    TS_DT_CALL(grad_dt, adamw_range_g, master, param_out, m, v, grad, lo, hi, c, param_dt);
  }
  return TS_OK;
}

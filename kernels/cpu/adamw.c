/*
 * adamw.c — the CPU body of ts_k_adamw: the AdamW optimizer step
 * (Loshchilov & Hutter 2019, Algorithm 2;
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

/* ts_k_adamw's arguments, and one chunk of it. */
typedef struct adamw_args {
  float *master, *m, *v;
  void *param_out;
  const void *grad;
  ts_dtype param_dt, grad_dt;
  ts_adamw_coeffs c;
} adamw_args;

static void adamw_chunk(void *arg, size_t lo, size_t hi) {
  const adamw_args *x = arg;
  TS_DT_CALL(x->grad_dt, adamw_range_g, x->master, x->param_out, x->m, x->v, x->grad, lo, hi, x->c,
             x->param_dt);
}

ts_status ts_cpu_adamw(const ts_kctx *ctx, float *master, void *param_out, ts_dtype param_dt,
                       float *m, float *v, const void *grad, ts_dtype grad_dt, size_t n,
                       const ts_adamw_hparams *hp) {
  adamw_args x = {master,
                  m,
                  v,
                  param_out,
                  grad,
                  param_dt,
                  grad_dt,
                  ts_adamw_make_coeffs(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay,
                                       hp->step, hp->grad_scale)};
  ts_cpu_for_chunks(n, adamw_chunk, &x);
  return TS_OK;
}

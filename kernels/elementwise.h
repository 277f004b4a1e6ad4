/*
 * elementwise.h — per-element math shared by the CPU loops (kernels/cpu/)
 * and the CUDA kernels (kernels/cuda/): SiLU and the AdamW element update,
 * on top of base/floats.h (storage conversions and IEEE-rounded fp32
 * arithmetic, which this header re-exports).
 *
 * Every function is TS_HD (base/floats.h): host and device compile the same
 * source, and arithmetic both must agree on bit for bit goes through
 * ts_fmul/ts_fadd/ts_fsub/ts_fdiv/ts_fsqrt.
 */
#ifndef TS_KERNELS_ELEMENTWISE_H
#define TS_KERNELS_ELEMENTWISE_H

#include <math.h>
#include <stdint.h>

#include "base/floats.h"

/* ---- activations ------------------------------------------------------------ */

/* SiLU (Elfwing et al. 2018; Shazeer 2020 eq. 6): x * sigmoid(x) = x / (1 + e^-x).
 * For x -> -inf, e^-x overflows to inf and the result is -0, as in PyTorch. */
TS_HD float ts_silu(float x) { return x / (1.0f + expf(-x)); }

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x). */
TS_HD float ts_silu_grad(float x) {
  float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

/* Both of the above from one exponential: *silu gets ts_silu(x)'s bits,
 * *grad gets ts_silu_grad(x)'s bits. */
TS_HD void ts_silu_and_grad(float x, float *silu, float *grad) {
  float d = 1.0f + expf(-x);
  float s = 1.0f / d;
  *silu = x / d;
  *grad = s * (1.0f + x * (1.0f - s));
}

/* ---- AdamW (Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW) ---- */

/* Per-step constants of the AdamW update, computed once on the host. */
typedef struct ts_adamw_coeffs {
  float beta1;      /* first-moment decay */
  float beta2;      /* second-moment decay */
  float eps;        /* added to the bias-corrected sqrt(v) */
  float decay;      /* 1 - lr * weight_decay (decoupled weight decay) */
  float step_size;  /* lr / (1 - beta1^t) */
  float bc2_sqrt;   /* sqrt(1 - beta2^t) */
  float grad_scale; /* multiplies the raw gradient first */
} ts_adamw_coeffs;

/* Host-side: the constants of step t >= 1. Bias corrections are computed in
 * double, as torch.optim.AdamW does with Python floats, then rounded. */
static inline ts_adamw_coeffs ts_adamw_make_coeffs(float lr, float beta1, float beta2, float eps,
                                                   float weight_decay, int step, float grad_scale) {
  ts_adamw_coeffs c;
  double bc1 = 1.0 - pow((double)beta1, (double)step);
  double bc2 = 1.0 - pow((double)beta2, (double)step);
  c.beta1 = beta1;
  c.beta2 = beta2;
  c.eps = eps;
  c.decay = (float)(1.0 - (double)lr * (double)weight_decay);
  c.step_size = (float)((double)lr / bc1);
  c.bc2_sqrt = (float)sqrt(bc2);
  c.grad_scale = grad_scale;
  return c;
}

/* One element of AdamW, in the order of torch's _single_tensor_adam:
 *   g = grad_scale * grad
 *   m = m + (1 - b1) (g - m)            (torch's lerp; = b1 m + (1-b1) g)
 *   v = b2 v + (1 - b2) g^2
 *   p = p * (1 - lr wd)
 *   p = p - step_size * (m / (sqrt(v) / sqrt(1 - b2^t) + eps))
 * m and v are updated in place; returns the new master value p. Every
 * operation is one IEEE-rounded fp32 operation on CPU and CUDA alike. */
TS_HD float ts_adamw_element(float p, float grad, float *m, float *v, ts_adamw_coeffs c) {
  float g = ts_fmul(c.grad_scale, grad);
  float mi = ts_fadd(*m, ts_fmul(ts_fsub(1.0f, c.beta1), ts_fsub(g, *m)));
  float vi = ts_fadd(ts_fmul(c.beta2, *v), ts_fmul(ts_fmul(ts_fsub(1.0f, c.beta2), g), g));
  float denom = ts_fadd(ts_fdiv(ts_fsqrt(vi), c.bc2_sqrt), c.eps);
  p = ts_fmul(p, c.decay);
  p = ts_fsub(p, ts_fmul(c.step_size, ts_fdiv(mi, denom))); /* addcdiv: value * (m / denom) */
  *m = mi;
  *v = vi;
  return p;
}

#endif /* TS_KERNELS_ELEMENTWISE_H */

/*
 * swiglu.c — the CPU body of the SwiGLU gate of LLaMA's MLP (Shazeer 2020, eq. 6):
 * h = silu(gate) * up, and its backward.
 *
 * Invariants: purely per element (cpu_common.h's ts_cpu_silu and
 * ts_cpu_silu_and_grad: kernels/elementwise.h's formulas on the vectorised
 * ts_cpu_exp, so the loops run in SIMD lanes with the bits of one element
 * at a time), computed in fp32 and rounded to storage once per output; so
 * results do not depend on the thread count. Half storage is widened and
 * rounded in bulk, a piece at a time, around the fp32 loops (same bits as
 * converting per element).
 */
#include "kernels/cpu/cpu_common.h"

TS_AI void swiglu_fwd_range(void *h, const void *gate, const void *up, size_t lo, size_t hi,
                            ts_dtype dt) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) st(h, i, dt, ts_cpu_silu(ld(gate, i, dt)) * ld(up, i, dt));
}

/* dgate = dh * up * silu'(gate); dup = dh * silu(gate). All inputs are read
 * before either output is written, so dgate/dup may alias dh. */
TS_AI void swiglu_bwd_range(void *dgate, void *dup, const void *dh, const void *gate,
                            const void *up, size_t lo, size_t hi, ts_dtype dt) {
#pragma omp simd
  for (size_t i = lo; i < hi; i++) {
    float g = ld(gate, i, dt), u = ld(up, i, dt), d = ld(dh, i, dt);
    float sg, dsg;
    ts_cpu_silu_and_grad(g, &sg, &dsg);
    float dg = d * u * dsg, du = d * sg;
    st(dgate, i, dt, dg);
    st(dup, i, dt, du);
  }
}

/* swiglu_fwd_range for half storage through fp32 pieces. */
TS_AI void swiglu_fwd_half(void *h, const void *gate, const void *up, size_t lo, size_t hi,
                           ts_dtype dt) {
  float g[TS_CPU_PIECE], u[TS_CPU_PIECE];
  for (size_t i = lo; i < hi; i += TS_CPU_PIECE) {
    size_t k = hi - i < TS_CPU_PIECE ? hi - i : TS_CPU_PIECE;
    ts_cpu_widen_at(g, gate, i, k, dt);
    ts_cpu_widen_at(u, up, i, k, dt);
    swiglu_fwd_range(g, g, u, 0, k, TS_FP32); /* h overwrites g element by element */
    ts_cpu_narrow_at(h, i, g, k, dt);
  }
}

/* swiglu_bwd_range for half storage through fp32 pieces: every input piece
 * is read before an output piece is written, so dgate/dup may alias dh. */
TS_AI void swiglu_bwd_half(void *dgate, void *dup, const void *dh, const void *gate,
                           const void *up, size_t lo, size_t hi, ts_dtype dt) {
  float g[TS_CPU_PIECE], u[TS_CPU_PIECE], d[TS_CPU_PIECE];
  for (size_t i = lo; i < hi; i += TS_CPU_PIECE) {
    size_t k = hi - i < TS_CPU_PIECE ? hi - i : TS_CPU_PIECE;
    ts_cpu_widen_at(g, gate, i, k, dt);
    ts_cpu_widen_at(u, up, i, k, dt);
    ts_cpu_widen_at(d, dh, i, k, dt);
    swiglu_bwd_range(g, u, d, g, u, 0, k, TS_FP32); /* dgate -> g, dup -> u */
    ts_cpu_narrow_at(dgate, i, g, k, dt);
    ts_cpu_narrow_at(dup, i, u, k, dt);
  }
}

/* Either pass's arguments (forward: h, gate, up), and one chunk of each. */
typedef struct swiglu_args {
  void *h_or_dgate, *dup;
  const void *dh, *gate, *up;
  ts_dtype dt;
} swiglu_args;

TS_AI void swiglu_fwd_chunk_body(void *arg, size_t lo, size_t hi) {
  const swiglu_args *x = arg;
  if (x->dt == TS_FP32)
    swiglu_fwd_range(x->h_or_dgate, x->gate, x->up, lo, hi, TS_FP32);
  else
    swiglu_fwd_half(x->h_or_dgate, x->gate, x->up, lo, hi, x->dt);
}
TS_CPU_CLONES(swiglu_fwd_chunk, (void *arg, size_t lo, size_t hi), (arg, lo, hi))

TS_AI void swiglu_bwd_chunk_body(void *arg, size_t lo, size_t hi) {
  const swiglu_args *x = arg;
  if (x->dt == TS_FP32)
    swiglu_bwd_range(x->h_or_dgate, x->dup, x->dh, x->gate, x->up, lo, hi, TS_FP32);
  else
    swiglu_bwd_half(x->h_or_dgate, x->dup, x->dh, x->gate, x->up, lo, hi, x->dt);
}
TS_CPU_CLONES(swiglu_bwd_chunk, (void *arg, size_t lo, size_t hi), (arg, lo, hi))

ts_status ts_cpu_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate, const void *up,
                                size_t n, ts_dtype dt) {
  swiglu_args x = {h, NULL, NULL, gate, up, dt};
  ts_cpu_for_chunks(n, swiglu_fwd_chunk, &x);
  return TS_OK;
}

ts_status ts_cpu_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup, const void *dh,
                                 const void *gate, const void *up, size_t n, ts_dtype dt) {
  swiglu_args x = {dgate, dup, dh, gate, up, dt};
  ts_cpu_for_chunks(n, swiglu_bwd_chunk, &x);
  return TS_OK;
}

/*
 * gelu.c — the CPU body of GELU (Hendrycks & Gimpel 2016; torch GELU(),
 * erf or tanh form), forward and backward, and of the token type ids that
 * feed a BERT-class encoder's token type embedding (ts_k_token_types).
 *
 * Invariants: GELU is purely per element, in PyTorch's operation order
 * (kernels/elementwise.h): the erf form on the vectorised ts_cpu_erf and
 * ts_cpu_exp (cpu_common.h ts_cpu_gelu_erf, _grad: the same bits at every
 * vector width), the tanh form on libm's tanhf (ts_gelu_tanh, _grad),
 * computed in fp32 and rounded to storage once per output, so results do
 * not depend on the thread count. Half storage is widened and rounded in
 * bulk, a piece at a time, around the fp32 loop (same bits as converting
 * per element); each piece's inputs are read before its output is
 * written, so out may alias inp and dinp may alias dout or inp.
 */
#include "kernels/cpu/cpu_common.h"

/* out[i] = gelu(inp[i]) for i in [lo, hi). */
TS_AI void gelu_fwd_range(void *out, const void *inp, int tanh_form, size_t lo, size_t hi,
                          ts_dtype dt) {
  if (tanh_form) {
    for (size_t i = lo; i < hi; i++) st(out, i, dt, ts_gelu_tanh(ld(inp, i, dt)));
    return;
  }
#pragma omp simd
  for (size_t i = lo; i < hi; i++) st(out, i, dt, ts_cpu_gelu_erf(ld(inp, i, dt)));
}

/* dinp[i] = dout[i] * gelu'(inp[i]) for i in [lo, hi); dinp may alias either input. */
TS_AI void gelu_bwd_range(void *dinp, const void *dout, const void *inp, int tanh_form, size_t lo,
                          size_t hi, ts_dtype dt) {
  if (tanh_form) {
    for (size_t i = lo; i < hi; i++)
      st(dinp, i, dt, ld(dout, i, dt) * ts_gelu_tanh_grad(ld(inp, i, dt)));
    return;
  }
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    st(dinp, i, dt, ld(dout, i, dt) * ts_cpu_gelu_erf_grad(ld(inp, i, dt)));
}

/* One chunk [lo, hi) of either direction (dout NULL: forward), half
 * storage through fp32 pieces. */
TS_AI void gelu_half(void *y, const void *dout, const void *inp, int tanh_form, size_t lo,
                     size_t hi, ts_dtype dt) {
  float x[TS_CPU_PIECE], d[TS_CPU_PIECE];
  for (size_t i = lo; i < hi; i += TS_CPU_PIECE) {
    size_t k = hi - i < TS_CPU_PIECE ? hi - i : TS_CPU_PIECE;
    ts_cpu_widen_at(x, inp, i, k, dt);
    if (dout) {
      ts_cpu_widen_at(d, dout, i, k, dt);
      gelu_bwd_range(x, d, x, tanh_form, 0, k, TS_FP32); /* dinp overwrites x element by element */
    } else {
      gelu_fwd_range(x, x, tanh_form, 0, k, TS_FP32);
    }
    ts_cpu_narrow_at(y, i, x, k, dt);
  }
}

/* Either direction's arguments (dout NULL: forward), and one chunk. */
typedef struct gelu_args {
  void *y;
  const void *dout, *inp;
  int tanh_form;
  ts_dtype dt;
} gelu_args;

TS_AI void gelu_chunk_body(void *arg, size_t lo, size_t hi) {
  const gelu_args *x = arg;
  if (x->dt != TS_FP32)
    gelu_half(x->y, x->dout, x->inp, x->tanh_form, lo, hi, x->dt);
  else if (x->dout)
    gelu_bwd_range(x->y, x->dout, x->inp, x->tanh_form, lo, hi, TS_FP32);
  else
    gelu_fwd_range(x->y, x->inp, x->tanh_form, lo, hi, TS_FP32);
}
TS_CPU_CLONES(gelu_chunk, (void *arg, size_t lo, size_t hi), (arg, lo, hi))

/* Either direction over n elements, in fixed chunks. */
static void gelu_run(void *y, const void *dout, const void *inp, size_t n, ts_gelu_kind kind,
                     ts_dtype dt) {
  gelu_args x = {y, dout, inp, kind == TS_GELU_TANH, dt};
  ts_cpu_for_chunks(n, gelu_chunk, &x);
}

ts_status ts_cpu_gelu_forward(const ts_kctx *ctx, void *out, const void *inp, size_t n,
                              ts_gelu_kind kind, ts_dtype dt) {
  gelu_run(out, NULL, inp, n, kind, dt);
  return TS_OK;
}

ts_status ts_cpu_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout, const void *inp,
                               size_t n, ts_gelu_kind kind, ts_dtype dt) {
  gelu_run(dinp, dout, inp, n, kind, dt);
  return TS_OK;
}

/* ---- token types ---------------------------------------------------------------- */

ts_status ts_cpu_token_types(const ts_kctx *ctx, int32_t *types, const int32_t *tokens, size_t B,
                             size_t T, int32_t sep_id, size_t n_types) {
  const int32_t cap = (int32_t)(n_types - 1); /* the front checked n_types <= INT32_MAX */
#pragma omp parallel for schedule(static) if (B * T > 65536)
  for (ptrdiff_t b = 0; b < (ptrdiff_t)B; b++) {
    int32_t seen = 0; /* sep_id tokens before position t, capped */
    for (size_t t = 0; t < T; t++) {
      size_t i = (size_t)b * T + t;
      types[i] = seen;
      if (sep_id >= 0 && tokens[i] == sep_id && seen < cap) seen++;
    }
  }
  return TS_OK;
}

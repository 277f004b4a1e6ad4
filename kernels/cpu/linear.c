/*
 * linear.c — the CPU body of the linear layer y = x W^T (Hugging Face nn.Linear
 * weight layout (N, K)), forward and backward, and its forward with the bias,
 * y = x W^T + b, rounded once; through OpenBLAS sgemm or oneDNN.
 *
 * Invariants:
 * - Every dtype where oneDNN has a native kernel for it on this CPU
 *   (ts_cpu_dnnl_impl: fp32 any JIT kernel, bf16/fp16 AMX or
 *   AVX512-BF16/FP16): oneDNN's matmul on the caller's buffers, products
 *   summed in fp32 and rounded once to the dtype (dW's accumulation too);
 *   no workspace. oneDNN's fp32 ran 1.01-1.12x OpenBLAS's own
 *   sgemm on every llama-small product here (kernels/bench_matmul, docs/BENCHMARKS.md).
 * - fp32 elsewhere (or with TESSERA_CPU_MATMUL=openblas) runs ts_cpu_sgemm
 *   on the caller's buffers (no workspace).
 * - bf16/fp16 elsewhere, where AVX2 or AVX-512 is the widest tier within
 *   oneDNN's cap (ts_cpu_isa 1 or 2) and the CPU has FMA and F16C (and
 *   without TESSERA_CPU_MATMUL=openblas): ts_cpu_gemm_half (gemm_half.c),
 *   which widens the operands while it packs them, sums in fp32 by the
 *   tier's FMA micro-kernel and rounds once, the bias and dW's accumulation
 *   in its fp32 sums as oneDNN's are; no workspace (ts_k_matmul_impl:
 *   "tessera avx2 gemm" or "tessera avx512 gemm").
 * - bf16/fp16 elsewhere still (below AVX2; TESSERA_CPU_MATMUL=openblas)
 *   widen the operands into ctx->workspace, run the fp32 sgemm, and round
 *   the results back once (RNE). The workspace is three 64-byte-aligned
 *   fp32 buffers of M*K, N*K and M*N elements; the query
 *   ts_cpu_linear_workspace_bytes returns exactly what the path this
 *   process takes needs.
 * - fp32 products go through ts_cpu_sgemm (sgemm.c): fixed output tiles,
 *   one single-threaded sgemm each over the whole K, so results are the
 *   same bits at any thread count.
 * - The bias (forward with bias) joins each output's fp32 sum before the
 *   one rounding to the dtype: in oneDNN's accumulator, or added to the
 *   fp32 product (sgemm's output for fp32, its fp32 copy for bf16/fp16)
 *   by ts_cpu_bias_add's fp32 body. No workspace beyond the product's.
 */
#include <limits.h>
#include <string.h>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/dnnl_matmul.h"
#include "kernels/cpu/gemm_half.h"

int ts_cpu_linear_half_packed(ts_dtype dt) {
  return !ts_cpu_matmul_openblas() && !ts_cpu_dnnl_impl(dt) && ts_cpu_gemm_half_ok(dt);
}

size_t ts_cpu_linear_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt) {
  /* fp32: either path needs none; nor does gemm_half.c */
  if (dt == TS_FP32 || ts_cpu_dnnl_impl(dt) || ts_cpu_linear_half_packed(dt)) return 0;
  return ts_align64(M * K * sizeof(float)) + ts_align64(N * K * sizeof(float)) +
         ts_align64(M * N * sizeof(float));
}

/* Checks that every dimension fits BLAS's int. */
static ts_status check_dims(size_t M, size_t N, size_t K, const char *op) {
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: M=%zu N=%zu K=%zu: each must be at most %d (BLAS int)", op, M, N, K,
                        INT_MAX);
  return TS_OK;
}

/* The three fp32 sub-buffers of a half-precision call's workspace. */
typedef struct {
  float *mk, *nk, *mn;
} ws_bufs;

static ws_bufs split_ws(const ts_kctx *ctx, size_t M, size_t N, size_t K) {
  ws_bufs w;
  char *p = (char *)ctx->workspace;
  w.mk = (float *)p;
  p += ts_align64(M * K * sizeof(float));
  w.nk = (float *)p;
  p += ts_align64(N * K * sizeof(float));
  w.mn = (float *)p;
  return w;
}

/* out (M, N) = inp (M, K) @ W^T (+ bias (N) on every row, added in fp32
 * before the one rounding to dt; NULL: none), W (N, K). */
static ts_status forward(const ts_kctx *ctx, void *out, const void *inp, const void *weight,
                         const void *bias, size_t M, size_t N, size_t K, ts_dtype dt,
                         const char *op) {
  TS_CHECK(check_dims(M, N, K, op));
  if (ts_cpu_dnnl_impl(dt)) /* the bias in oneDNN's fp32 accumulator */
    return ts_cpu_dnnl_matmul(out, inp, weight, bias, M, N, K, 0, 1, 0, dt);
  if (dt == TS_FP32) { /* the fp32 sum, then one fp32 addition: ts_k_bias_add's */
    ts_cpu_sgemm(0, 1, M, N, K, (const float *)inp, K, (const float *)weight, K, 0.0f, (float *)out,
                 N);
    return bias ? ts_cpu_bias_add(ctx, out, bias, M, N, TS_FP32) : TS_OK;
  }
  if (ts_cpu_linear_half_packed(dt)) /* the bias in its fp32 sums */
    return ts_cpu_gemm_half(0, 1, M, N, K, inp, K, weight, K, bias, 0, out, N, dt);
  ws_bufs w = split_ws(ctx, M, N, K);
  ts_cpu_widen(w.mk, inp, M * K, dt);
  ts_cpu_widen(w.nk, weight, N * K, dt);
  ts_cpu_sgemm(0, 1, M, N, K, w.mk, K, w.nk, K, 0.0f, w.mn, N);
  if (bias) { /* widened into the weight's copy (N <= N K), done with */
    ts_cpu_widen(w.nk, bias, N, dt);
    TS_CHECK(ts_cpu_bias_add(ctx, w.mn, w.nk, M, N, TS_FP32));
  }
  ts_cpu_narrow(out, w.mn, M * N, dt);
  return TS_OK;
}

ts_status ts_cpu_linear_forward(const ts_kctx *ctx, void *out, const void *inp,
                                const void *weight, size_t M, size_t N, size_t K, ts_dtype dt) {
  return forward(ctx, out, inp, weight, NULL, M, N, K, dt, "ts_k_linear_forward");
}

ts_status ts_cpu_linear_bias_forward(const ts_kctx *ctx, void *out, const void *inp,
                                     const void *weight, const void *bias, size_t M, size_t N,
                                     size_t K, ts_dtype dt) {
  return forward(ctx, out, inp, weight, bias, M, N, K, dt, "ts_k_linear_bias_forward");
}

ts_status ts_cpu_linear_backward(const ts_kctx *ctx, void *dinp, void *dweight, const void *dout,
                                 const void *inp, const void *weight, size_t M, size_t N,
                                 size_t K, ts_dtype dt) {
  TS_CHECK(check_dims(M, N, K, "ts_k_linear_backward"));
  if (ts_cpu_dnnl_impl(dt)) {
    if (dinp) /* dinp (M, K) = dout (M, N) @ W (N, K) */
      TS_CHECK(ts_cpu_dnnl_matmul(dinp, dout, weight, NULL, M, K, N, 0, 0, 0, dt));
    if (dweight) /* dW (N, K) += dout^T (N, M) @ inp (M, K) */
      TS_CHECK(ts_cpu_dnnl_matmul(dweight, dout, inp, NULL, N, K, M, 1, 0, 1, dt));
    return TS_OK;
  }
  if (dt == TS_FP32) {
    if (dinp) /* dinp (M, K) = dout (M, N) @ W (N, K) */
      ts_cpu_sgemm(0, 0, M, K, N, (const float *)dout, N, (const float *)weight, K, 0.0f,
                   (float *)dinp, K);
    if (dweight) /* dW (N, K) += dout^T (N, M) @ inp (M, K) */
      ts_cpu_sgemm(1, 0, N, K, M, (const float *)dout, N, (const float *)inp, K, 1.0f,
                   (float *)dweight, K);
    return TS_OK;
  }
  if (ts_cpu_linear_half_packed(dt)) {
    if (dinp) /* dinp (M, K) = dout (M, N) @ W (N, K) */
      TS_CHECK(ts_cpu_gemm_half(0, 0, M, K, N, dout, N, weight, K, NULL, 0, dinp, K, dt));
    if (dweight) /* dW (N, K) += dout^T (N, M) @ inp (M, K) */
      TS_CHECK(ts_cpu_gemm_half(1, 0, N, K, M, dout, N, inp, K, NULL, 1, dweight, K, dt));
    return TS_OK;
  }
  ws_bufs w = split_ws(ctx, M, N, K);
  ts_cpu_widen(w.mn, dout, M * N, dt);
  if (dinp) {
    ts_cpu_widen(w.nk, weight, N * K, dt);
    ts_cpu_sgemm(0, 0, M, K, N, w.mn, N, w.nk, K, 0.0f, w.mk, K);
    ts_cpu_narrow(dinp, w.mk, M * K, dt);
  }
  if (dweight) {
    ts_cpu_widen(w.mk, inp, M * K, dt);
    ts_cpu_widen(w.nk, dweight, N * K, dt);
    ts_cpu_sgemm(1, 0, N, K, M, w.mn, N, w.mk, K, 1.0f, w.nk, K);
    ts_cpu_narrow(dweight, w.nk, N * K, dt);
  }
  return TS_OK;
}

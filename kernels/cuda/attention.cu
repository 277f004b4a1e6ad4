/*
 * attention.cu — CUDA bodies of causal grouped-query attention
 * (ts_k_attention_forward and _backward, kernels/kernels.h; Vaswani et al.
 * 2017 eq. 1, GQA: Ainslie et al. 2023), of decoding with a key/value
 * cache (ts_k_attention_cached), and the attention queries (state and
 * workspace bytes, the dtype of P) that the bidirectional op shares.
 *
 * bf16/fp16: cuDNN's fused flash attention (attention_cudnn.h; Dao et al.
 * 2022, cuDNN's deterministic backward). The saved state is each softmax
 * row's log-sum-exp (B, NH, T) fp32. When cuDNN answers that it cannot run
 * a shape, or the context asks for it (TS_K_PLAIN_ATTENTION), the plain
 * kernels (attention_plain.cuh) run instead with the same state: forward
 * writes out and the log-sum-exp, backward recomputes each probability
 * from q, k and it.
 *
 * fp32: the plain kernels with the probabilities (B, NH, T, T) as the
 * state (parity and debugging, not speed; the CPU's fused kernel keeps the
 * log-sum-exp in every dtype).
 *
 * Bidirectional attention (ts_k_attention_bidir_*): attention_bidir.cu.
 * The plain kernels, the state's layout and the table of shapes cuDNN
 * refused, which both files use: attention_plain.cuh.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_plain.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

/* lse state: the log-sum-exp (B, NH, T) fp32, then the bidirectional op's
 * key flags (B, T) uint8. */
extern "C" size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                size_t HS, ts_dtype dt) {
  (void)NKV;
  (void)HS;
  if (lse_state(dt)) return B * NH * T * sizeof(float) + B * T;
  return B * NH * T * T * sizeof(float);
}

static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

/* fp32: one batch row's dS (every kv group at once). bf16/fp16 (one bound
 * serves both ops): the lengths path's head, then the larger of cuDNN's
 * bound and one kv group's plain scratch (so the fallback always runs, and
 * the redo of a bidirectional batch row, 2 T^2 fp32, fits beside the
 * head); T beyond the plain kernels' limit: the bias path, cuDNN's bound
 * plus the (B, 1, T, T) bias at the start. */
extern "C" size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                    size_t HS, ts_dtype dt) {
  if (!lse_state(dt)) return NKV * plain_group_bytes(T, NH, NKV, dt);
  size_t cudnn = ts_cudnn_attention_workspace_bytes(B, T, NH, NKV, HS, dt);
  if (T > ATT_MAX_T) return add_sat(cudnn, bias_bytes(B, T));
  size_t group = plain_group_bytes(T, NH, NKV, dt);
  return add_sat(lengths_bytes(B), cudnn > group ? cudnn : group);
}

/* ---- causal attention --------------------------------------------------------- */

/* cuDNN's fused forward rounds P to dt for its P V product, causal or
 * bidirectional; the plain kernels keep P in fp32 (kernels.h,
 * ts_k_attention_probs_dtype). */
extern "C" ts_dtype ts_cuda_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt,
                                                  int bidirectional) {
  (void)bidirectional;
  return cudnn_first(ctx, dt) ? dt : TS_FP32;
}

extern "C" ts_status ts_cuda_attention_forward(const ts_kctx *ctx, void *out, void *state,
                                               const void *q, const void *k, const void *v,
                                               size_t B, size_t T, size_t NH, size_t NKV,
                                               size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_forward";
  shape_key key = key_of(ctx, B, T, NH, NKV, HS, dt, 0, 0);
  if (try_cudnn(ctx, dt, &key)) {
    ts_status st = ts_cudnn_attention_forward(ctx, out, (float *)state, q, k, v, nullptr, B, T, NH,
                                              NKV, HS, dt);
    if (st != TS_ERR_UNSUPPORTED) return st; /* else: the plain kernels, same state */
    remember_refusal(&key);
  }
  TS_CHECK(check_plain(B, T, NH, op));
  TS_CUDA_DT_CALL(dt, plain_forward, ctx, out, state, q, k, v, B, T, NH, NKV, HS, CAUSAL);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                                const void *dout, const void *out,
                                                const void *q, const void *k, const void *v,
                                                const void *state, size_t B, size_t T, size_t NH,
                                                size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_backward";
  shape_key key = key_of(ctx, B, T, NH, NKV, HS, dt, 1, 0);
  if (try_cudnn(ctx, dt, &key)) {
    ts_status st = ts_cudnn_attention_backward(
        ctx, dq, dk, dv, dout, out, q, k, v, (const float *)state, nullptr, B, T, NH, NKV, HS, dt);
    if (st != TS_ERR_UNSUPPORTED) return st;
    remember_refusal(&key);
  }
  TS_CHECK(check_plain(B, T, NH, op));
  TS_CHECK(plain_backward_dt(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, dt, CAUSAL,
                             op));
  return ts_cuda_launched(op);
}

/* ---- decoding with a key/value cache ------------------------------------- */

/* One block per (t, h) of the T new queries: the row's n = pos0 + t + 1
 * scores over the cached keys in shared memory, its max m and sum z of
 * e^(s_j - m), then out[t, h, d] = sum_j e^(s_j - m) / z * v[j, g, d]
 * (kernels/cpu/attention_cached.c's math, sums in another order). */
template <ts_dtype DT>
__global__ void att_cached_kernel(void *out, const void *q, const void *k, const void *v,
                                  size_t pos0, size_t NH, size_t NKV, size_t HS, float scale) {
  extern __shared__ float srow[];
  __shared__ float sh[32];
  size_t t = blockIdx.x / NH, h = blockIdx.x % NH, g = h / (NH / NKV);
  size_t qo = (t * NH + h) * HS, n = pos0 + t + 1;
  float m = -INFINITY;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    size_t ko = (j * NKV + g) * HS;
    float s = 0.0f;
    for (size_t d = 0; d < HS; d++) s += ts_ld<DT>(q, qo + d) * ts_ld<DT>(k, ko + d);
    s *= scale;
    srow[j] = s;
    m = fmaxf(m, s);
  }
  float inv = 1.0f / exp_row(srow, n, m, sh);
  for (size_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (size_t j = 0; j < n; j++) acc += srow[j] * ts_ld<DT>(v, (j * NKV + g) * HS + d);
    ts_st<DT>(out, qo + d, acc * inv);
  }
}

template <ts_dtype DT>
static void launch_att_cached(void *out, const void *q, const void *k, const void *v, size_t T,
                              size_t pos0, size_t NH, size_t NKV, size_t HS, cudaStream_t s) {
  att_cached_kernel<DT><<<(unsigned)(T * NH), ATT_THREADS, (pos0 + T) * sizeof(float), s>>>(
      out, q, k, v, pos0, NH, NKV, HS, 1.0f / sqrtf((float)HS));
}

extern "C" ts_status ts_cuda_attention_cached(const ts_kctx *ctx, void *out, const void *q,
                                              const void *k, const void *v, size_t T, size_t pos0,
                                              size_t NH, size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_cached";
  if (pos0 + T > ATT_MAX_T)
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s (cuda): pos0 + T = %zu keys: at most %d", op,
                        pos0 + T, ATT_MAX_T);
  TS_CUDA_DT_CALL(dt, launch_att_cached, out, q, k, v, T, pos0, NH, NKV, HS,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

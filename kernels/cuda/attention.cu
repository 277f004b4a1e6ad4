/*
 * attention.cu — CUDA bodies of causal grouped-query attention
 * (ts_k_attention_forward and _backward, kernels/kernels.h; Vaswani et al.
 * 2017 eq. 1, GQA: Ainslie et al. 2023).
 *
 * bf16/fp16 go to cuDNN's fused flash attention (attention_cudnn.h; Dao et
 * al. 2022): the saved state is each softmax row's log-sum-exp (B, NH, T)
 * fp32 and backward uses cuDNN's deterministic algorithm.
 *
 * fp32 takes the plain path here, for parity with the CPU and for
 * debugging, not speed: it keeps the probabilities (B, NH, T, T) as the
 * state, like the CPU, and computes every output element by one thread
 * summing over keys (or queries) in index order, so results repeat bit for
 * bit. Backward runs one batch row at a time with that row's
 * dS = P * (dP - rowsum(P * dP)) / sqrt(HS), (NH, T, T) fp32, in the
 * workspace.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { ATT_THREADS = 128 };

static bool fused(ts_dtype dt) { return dt != TS_FP32; }

extern "C" size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                size_t HS, ts_dtype dt) {
  (void)NKV;
  (void)HS;
  if (fused(dt)) return B * NH * T * sizeof(float);
  return B * NH * T * T * sizeof(float);
}

extern "C" size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                    size_t HS, ts_dtype dt) {
  if (fused(dt)) return ts_cudnn_attention_workspace_bytes(B, T, NH, NKV, HS, dt);
  return NH * T * T * sizeof(float);
}

/* One block per (b, h, t): probs[b, h, t, j] = softmax_j(q_t . k_j * scale)
 * for j <= t, 0 after. */
__global__ void att_probs_kernel(float *probs, const float *q, const float *k, size_t T, size_t NH,
                                 size_t NKV, size_t HS, float scale) {
  __shared__ float sh[32];
  size_t row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
  size_t g = h / (NH / NKV);
  const float *qt = q + ((b * T + t) * NH + h) * HS;
  float *p = probs + row * T;
  float m = -INFINITY;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float *kj = k + ((b * T + j) * NKV + g) * HS;
    float s = 0.0f;
    for (size_t d = 0; d < HS; d++) s += qt[d] * kj[d];
    s *= scale;
    p[j] = s;
    m = fmaxf(m, s);
  }
  m = ts_block_max(m, sh);
  float sum = 0.0f;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    float e = expf(p[j] - m);
    p[j] = e;
    sum += e;
  }
  sum = ts_block_sum(sum, sh);
  float inv = 1.0f / sum;
  for (size_t j = threadIdx.x; j < T; j += blockDim.x) p[j] = j <= t ? p[j] * inv : 0.0f;
}

/* out[b, t, h, d] = sum_{j <= t} probs[b, h, t, j] v[b, j, g, d]. */
__global__ void att_out_kernel(float *out, const float *probs, const float *v, size_t B, size_t T,
                               size_t NH, size_t NKV, size_t HS) {
  size_t total = B * T * NH * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, h = (i / HS) % NH, t = (i / (HS * NH)) % T, b = i / (HS * NH * T);
    size_t g = h / (NH / NKV);
    const float *p = probs + ((b * NH + h) * T + t) * T;
    float acc = 0.0f;
    for (size_t j = 0; j <= t; j++) acc += p[j] * v[((b * T + j) * NKV + g) * HS + d];
    out[i] = acc;
  }
}

/* Batch row b, one block per (h, t): dS[h, t, j] for j <= t. */
__global__ void att_ds_kernel(float *ds, const float *probs, const float *dout, const float *v,
                              size_t b, size_t T, size_t NH, size_t NKV, size_t HS, float scale) {
  __shared__ float sh[32];
  size_t row = blockIdx.x, t = row % T, h = row / T, g = h / (NH / NKV);
  const float *p = probs + ((b * NH + h) * T + t) * T;
  const float *dot_ = dout + ((b * T + t) * NH + h) * HS;
  float *r = ds + row * T;
  float dot = 0.0f;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    const float *vj = v + ((b * T + j) * NKV + g) * HS;
    float dp = 0.0f;
    for (size_t d = 0; d < HS; d++) dp += dot_[d] * vj[d];
    r[j] = dp;
    dot += p[j] * dp;
  }
  dot = ts_block_sum(dot, sh);
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) r[j] = scale * (p[j] * (r[j] - dot));
}

/* Batch row b: dq[b, t, h, d] = sum_{j <= t} dS[h, t, j] k[b, j, g, d]. */
__global__ void att_dq_kernel(float *dq, const float *ds, const float *k, size_t b, size_t T,
                              size_t NH, size_t NKV, size_t HS) {
  size_t total = T * NH * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, h = (i / HS) % NH, t = i / (HS * NH), g = h / (NH / NKV);
    const float *r = ds + (h * T + t) * T;
    float acc = 0.0f;
    for (size_t j = 0; j <= t; j++) acc += r[j] * k[((b * T + j) * NKV + g) * HS + d];
    dq[(b * T + t) * NH * HS + h * HS + d] = acc;
  }
}

/* Batch row b: for key s of kv head g, over the group's heads in order and
 * queries t >= s in order:
 *   dk[b, s, g, d] = sum dS[h, t, s] q[b, t, h, d]
 *   dv[b, s, g, d] = sum P[b, h, t, s] dout[b, t, h, d]. */
__global__ void att_dkv_kernel(float *dk, float *dv, const float *ds, const float *probs,
                               const float *q, const float *dout, size_t b, size_t T, size_t NH,
                               size_t NKV, size_t HS) {
  size_t total = T * NKV * HS, rep = NH / NKV;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, g = (i / HS) % NKV, s = i / (HS * NKV);
    float ak = 0.0f, av = 0.0f;
    for (size_t h = g * rep; h < (g + 1) * rep; h++)
      for (size_t t = s; t < T; t++) {
        size_t qi = ((b * T + t) * NH + h) * HS + d;
        ak += ds[(h * T + t) * T + s] * q[qi];
        av += probs[((b * NH + h) * T + t) * T + s] * dout[qi];
      }
    size_t o = ((b * T + s) * NKV + g) * HS + d;
    dk[o] = ak;
    dv[o] = av;
  }
}

static ts_status check_grid(size_t rows, const char *op) {
  if (rows <= 0x7fffffffu) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): B * NH * T = %zu rows: at most 2^31 - 1",
                      op, rows);
}

extern "C" ts_status ts_cuda_attention_forward(const ts_kctx *ctx, void *out, void *state,
                                               const void *q, const void *k, const void *v,
                                               size_t B, size_t T, size_t NH, size_t NKV,
                                               size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_forward";
  if (fused(dt))
    return ts_cudnn_attention_forward(ctx, out, (float *)state, q, k, v, B, T, NH, NKV, HS, dt);
  TS_CHECK(check_grid(B * NH * T, op));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  att_probs_kernel<<<(unsigned)(B * NH * T), ATT_THREADS, 0, s>>>(
      (float *)state, (const float *)q, (const float *)k, T, NH, NKV, HS, scale);
  att_out_kernel<<<ts_cuda_grid(B * T * NH * HS), TS_CUDA_BLOCK, 0, s>>>(
      (float *)out, (const float *)state, (const float *)v, B, T, NH, NKV, HS);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                                const void *dout, const void *out,
                                                const void *q, const void *k, const void *v,
                                                const void *state, size_t B, size_t T, size_t NH,
                                                size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_backward";
  if (fused(dt))
    return ts_cudnn_attention_backward(ctx, dq, dk, dv, dout, out, q, k, v, (const float *)state,
                                       B, T, NH, NKV, HS, dt);
  TS_CHECK(check_grid(B * NH * T, op));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  float *ds = (float *)ctx->workspace;
  const float *p = (const float *)state;
  for (size_t b = 0; b < B; b++) {
    att_ds_kernel<<<(unsigned)(NH * T), ATT_THREADS, 0, s>>>(ds, p, (const float *)dout,
                                                             (const float *)v, b, T, NH, NKV, HS,
                                                             scale);
    att_dq_kernel<<<ts_cuda_grid(T * NH * HS), TS_CUDA_BLOCK, 0, s>>>(
        (float *)dq, ds, (const float *)k, b, T, NH, NKV, HS);
    att_dkv_kernel<<<ts_cuda_grid(T * NKV * HS), TS_CUDA_BLOCK, 0, s>>>(
        (float *)dk, (float *)dv, ds, p, (const float *)q, (const float *)dout, b, T, NH, NKV,
        HS);
  }
  return ts_cuda_launched(op);
}

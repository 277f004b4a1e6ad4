/*
 * attention.cu — CUDA bodies of causal grouped-query attention
 * (ts_k_attention_forward and _backward, kernels/kernels.h; Vaswani et al.
 * 2017 eq. 1, GQA: Ainslie et al. 2023).
 *
 * bf16/fp16: cuDNN's fused flash attention (attention_cudnn.h; Dao et al.
 * 2022, cuDNN's deterministic backward). The saved state is each softmax
 * row's log-sum-exp (B, NH, T) fp32. When cuDNN answers that it cannot run
 * a shape, or the context asks for it (TS_K_PLAIN_ATTENTION), the plain
 * kernels below run instead with the same state: forward writes out and
 * the log-sum-exp, backward recomputes each probability from q, k and it.
 *
 * fp32: the plain kernels with the probabilities (B, NH, T, T) as the
 * state, like the CPU (parity and debugging, not speed).
 *
 * The plain kernels compute every output element by one thread summing over
 * keys (or queries) in index order, and each row's statistics by a fixed
 * block tree, so results repeat bit for bit. Backward runs one batch row at
 * a time with that row's dS = P * (dP - D) / sqrt(HS), (NH, T, T) fp32, in
 * the workspace (D: rowsum(P * dP), = rowsum(dO * O)), and for the
 * log-sum-exp state that row's P too.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { ATT_THREADS = 128, ATT_MAX_T = 8192 /* the plain forward's row in shared memory */ };

/* Does dt keep the log-sum-exp (else the probabilities)? */
static bool lse_state(ts_dtype dt) { return dt != TS_FP32; }

extern "C" size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                size_t HS, ts_dtype dt) {
  (void)NKV;
  (void)HS;
  if (lse_state(dt)) return B * NH * T * sizeof(float);
  return B * NH * T * T * sizeof(float);
}

/* fp32: one batch row's dS. bf16/fp16: the larger of cuDNN's bound and the
 * plain backward's dS and P of one batch row. */
extern "C" size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                    size_t HS, ts_dtype dt) {
  size_t row = NH * T * T * sizeof(float);
  if (!lse_state(dt)) return row;
  size_t cudnn = ts_cudnn_attention_workspace_bytes(B, T, NH, NKV, HS, dt);
  return cudnn > 2 * row ? cudnn : 2 * row;
}

/* ---- forward -------------------------------------------------------------- */

/* One block per (b, h, t), the row's scores s_j = q_t . k_j * scale (j <= t)
 * in shared memory (T floats): its max m and sum z of e^(s_j - m); then
 *   probs state: P[b, h, t, j] = e^(s_j - m) / z for j <= t, 0 after;
 *   lse state:   lse[b, h, t] = m + log z, and out[b, t, h, d] =
 *                sum_{j <= t} e^(s_j - m) / z * v[b, j, g, d].
 * (The probs state's out comes from att_out_kernel.) */
template <ts_dtype DT>
__global__ void att_row_kernel(void *out, float *probs, float *lse, const void *q, const void *k,
                               const void *v, size_t T, size_t NH, size_t NKV, size_t HS,
                               float scale) {
  extern __shared__ float srow[];
  __shared__ float sh[32];
  size_t row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
  size_t g = h / (NH / NKV);
  size_t qo = ((b * T + t) * NH + h) * HS;
  float m = -INFINITY;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    size_t ko = ((b * T + j) * NKV + g) * HS;
    float s = 0.0f;
    for (size_t d = 0; d < HS; d++) s += ts_ld<DT>(q, qo + d) * ts_ld<DT>(k, ko + d);
    s *= scale;
    srow[j] = s;
    m = fmaxf(m, s);
  }
  m = ts_block_max(m, sh);
  float z = 0.0f;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    float e = expf(srow[j] - m);
    srow[j] = e;
    z += e;
  }
  z = ts_block_sum(z, sh); /* its barriers make every srow[j] visible to all */
  float inv = 1.0f / z;
  if (probs) {
    float *p = probs + row * T;
    for (size_t j = threadIdx.x; j < T; j += blockDim.x) p[j] = j <= t ? srow[j] * inv : 0.0f;
    return;
  }
  if (threadIdx.x == 0) lse[row] = m + logf(z);
  for (size_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (size_t j = 0; j <= t; j++) acc += srow[j] * inv * ts_ld<DT>(v, ((b * T + j) * NKV + g) * HS + d);
    ts_st<DT>(out, qo + d, acc);
  }
}

/* Probs state: out[b, t, h, d] = sum_{j <= t} probs[b, h, t, j] v[b, j, g, d]. */
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

/* ---- backward ------------------------------------------------------------- */

/* Batch row b, one block per (h, t): dS[h, t, j] for j <= t, from the row's
 * probabilities: the probs state's (p_state, row (b, h, t)), or, for the
 * lse state, recomputed as e^(q_t . k_j * scale - lse) and also written to
 * p_out[h, t, j] for dv. D is rowsum(P * dP). */
template <ts_dtype DT>
__global__ void att_ds_kernel(float *ds, float *p_out, const float *p_state, const float *lse,
                              const void *q, const void *k, const void *dout, const void *v,
                              size_t b, size_t T, size_t NH, size_t NKV, size_t HS, float scale) {
  __shared__ float sh[32];
  size_t row = blockIdx.x, t = row % T, h = row / T, g = h / (NH / NKV);
  size_t qo = ((b * T + t) * NH + h) * HS;
  float *r = ds + row * T;
  float *pr = p_out ? p_out + row * T : NULL;
  const float *ps = p_state ? p_state + ((b * NH + h) * T + t) * T : NULL;
  float l = lse ? lse[(b * NH + h) * T + t] : 0.0f;
  float dot = 0.0f;
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    size_t ko = ((b * T + j) * NKV + g) * HS;
    float dp = 0.0f, p;
    for (size_t d = 0; d < HS; d++) dp += ts_ld<DT>(dout, qo + d) * ts_ld<DT>(v, ko + d);
    if (ps) {
      p = ps[j];
    } else {
      float s = 0.0f;
      for (size_t d = 0; d < HS; d++) s += ts_ld<DT>(q, qo + d) * ts_ld<DT>(k, ko + d);
      p = expf(s * scale - l);
      pr[j] = p;
    }
    r[j] = dp;
    dot += p * dp;
  }
  dot = ts_block_sum(dot, sh);
  for (size_t j = threadIdx.x; j <= t; j += blockDim.x) {
    float p = ps ? ps[j] : pr[j]; /* this thread's own earlier write */
    r[j] = scale * (p * (r[j] - dot));
  }
}

/* Batch row b: dq[b, t, h, d] = sum_{j <= t} dS[h, t, j] k[b, j, g, d]. */
template <ts_dtype DT>
__global__ void att_dq_kernel(void *dq, const float *ds, const void *k, size_t b, size_t T,
                              size_t NH, size_t NKV, size_t HS) {
  size_t total = T * NH * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, h = (i / HS) % NH, t = i / (HS * NH), g = h / (NH / NKV);
    const float *r = ds + (h * T + t) * T;
    float acc = 0.0f;
    for (size_t j = 0; j <= t; j++) acc += r[j] * ts_ld<DT>(k, ((b * T + j) * NKV + g) * HS + d);
    ts_st<DT>(dq, (b * T + t) * NH * HS + h * HS + d, acc);
  }
}

/* Batch row b, P its (NH, T, T) probabilities: for key s of kv head g, over
 * the group's heads in order and queries t >= s in order,
 *   dk[b, s, g, d] = sum dS[h, t, s] q[b, t, h, d]
 *   dv[b, s, g, d] = sum P[h, t, s] dout[b, t, h, d]. */
template <ts_dtype DT>
__global__ void att_dkv_kernel(void *dk, void *dv, const float *ds, const float *P, const void *q,
                               const void *dout, size_t b, size_t T, size_t NH, size_t NKV,
                               size_t HS) {
  size_t total = T * NKV * HS, rep = NH / NKV;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, g = (i / HS) % NKV, s = i / (HS * NKV);
    float ak = 0.0f, av = 0.0f;
    for (size_t h = g * rep; h < (g + 1) * rep; h++)
      for (size_t t = s; t < T; t++) {
        size_t qi = ((b * T + t) * NH + h) * HS + d;
        ak += ds[(h * T + t) * T + s] * ts_ld<DT>(q, qi);
        av += P[(h * T + t) * T + s] * ts_ld<DT>(dout, qi);
      }
    size_t o = ((b * T + s) * NKV + g) * HS + d;
    ts_st<DT>(dk, o, ak);
    ts_st<DT>(dv, o, av);
  }
}

/* ---- the plain path ------------------------------------------------------- */

static ts_status check_plain(size_t B, size_t T, size_t NH, const char *op) {
  if (B * NH * T > 0x7fffffffu)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s (cuda): B * NH * T = %zu rows: at most 2^31 - 1", op, B * NH * T);
  if (T > ATT_MAX_T)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s (cuda): T = %zu: the plain attention kernels take at most %d", op, T,
                        ATT_MAX_T);
  return TS_OK;
}

template <ts_dtype DT>
static void plain_forward(const ts_kctx *ctx, void *out, void *state, const void *q, const void *k,
                          const void *v, size_t B, size_t T, size_t NH, size_t NKV, size_t HS) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  bool lse = lse_state(DT);
  att_row_kernel<DT><<<(unsigned)(B * NH * T), ATT_THREADS, T * sizeof(float), s>>>(
      out, lse ? nullptr : (float *)state, lse ? (float *)state : nullptr, q, k, v, T, NH, NKV,
      HS, scale);
  if (!lse)
    att_out_kernel<<<ts_cuda_grid(B * T * NH * HS), TS_CUDA_BLOCK, 0, s>>>(
        (float *)out, (const float *)state, (const float *)v, B, T, NH, NKV, HS);
}

template <ts_dtype DT>
static void plain_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv, const void *dout,
                           const void *q, const void *k, const void *v, const void *state,
                           size_t B, size_t T, size_t NH, size_t NKV, size_t HS) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  bool lse = lse_state(DT);
  float *ds = (float *)ctx->workspace;
  float *p_row = lse ? ds + NH * T * T : nullptr; /* the lse state's recomputed P */
  for (size_t b = 0; b < B; b++) {
    const float *P = lse ? p_row : (const float *)state + b * NH * T * T;
    att_ds_kernel<DT><<<(unsigned)(NH * T), ATT_THREADS, 0, s>>>(
        ds, p_row, lse ? nullptr : (const float *)state, lse ? (const float *)state : nullptr, q,
        k, dout, v, b, T, NH, NKV, HS, scale);
    att_dq_kernel<DT><<<ts_cuda_grid(T * NH * HS), TS_CUDA_BLOCK, 0, s>>>(dq, ds, k, b, T, NH,
                                                                         NKV, HS);
    att_dkv_kernel<DT><<<ts_cuda_grid(T * NKV * HS), TS_CUDA_BLOCK, 0, s>>>(
        dk, dv, ds, P, q, dout, b, T, NH, NKV, HS);
  }
}

/* ---- entry points ------------------------------------------------------------ */

/* Does this call go to cuDNN first? */
static bool try_cudnn(const ts_kctx *ctx, ts_dtype dt) {
  return lse_state(dt) && !(ctx->flags & TS_K_PLAIN_ATTENTION);
}

extern "C" ts_status ts_cuda_attention_forward(const ts_kctx *ctx, void *out, void *state,
                                               const void *q, const void *k, const void *v,
                                               size_t B, size_t T, size_t NH, size_t NKV,
                                               size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_forward";
  if (try_cudnn(ctx, dt)) {
    ts_status st =
        ts_cudnn_attention_forward(ctx, out, (float *)state, q, k, v, B, T, NH, NKV, HS, dt);
    if (st != TS_ERR_UNSUPPORTED) return st; /* else: the plain kernels, same state */
  }
  TS_CHECK(check_plain(B, T, NH, op));
  if (dt == TS_FP32)
    plain_forward<TS_FP32>(ctx, out, state, q, k, v, B, T, NH, NKV, HS);
  else if (dt == TS_BF16)
    plain_forward<TS_BF16>(ctx, out, state, q, k, v, B, T, NH, NKV, HS);
  else
    plain_forward<TS_FP16>(ctx, out, state, q, k, v, B, T, NH, NKV, HS);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                                const void *dout, const void *out,
                                                const void *q, const void *k, const void *v,
                                                const void *state, size_t B, size_t T, size_t NH,
                                                size_t NKV, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_backward";
  if (try_cudnn(ctx, dt)) {
    ts_status st = ts_cudnn_attention_backward(ctx, dq, dk, dv, dout, out, q, k, v,
                                               (const float *)state, B, T, NH, NKV, HS, dt);
    if (st != TS_ERR_UNSUPPORTED) return st;
  }
  TS_CHECK(check_plain(B, T, NH, op));
  if (dt == TS_FP32)
    plain_backward<TS_FP32>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS);
  else if (dt == TS_BF16)
    plain_backward<TS_BF16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS);
  else
    plain_backward<TS_FP16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS);
  return ts_cuda_launched(op);
}

/*
 * layers.cu — CUDA bodies of RMSNorm (Zhang & Sennrich 2019, eq. 4;
 * Hugging Face LlamaRMSNorm), rotary position embedding (Su et al. 2021,
 * Hugging Face rotate-half layout) and SwiGLU (Shazeer 2020, eq. 6), and of
 * the BERT-class encoder's LayerNorm (Ba et al. 2016), bias, GELU
 * (Hendrycks & Gimpel 2016) and token types, with the contracts of
 * kernels/kernels.h; and the residual add fused with either norm's forward
 * (ts_k_add_rmsnorm_forward, ts_k_add_layernorm_forward).
 *
 * Every element is read in its storage dtype, computed in fp32 and rounded
 * once (RNE) to storage, as on the CPU. Reductions (a row's sum of squares,
 * dweight's column sums) use fixed trees and fixed row partitions, so
 * results repeat bit for bit; their order is not the CPU's, so the backends
 * agree within the parity test's bounds. SiLU and GELU come from
 * kernels/elementwise.h, the same code as the CPU's.
 *
 * A fused add runs the norm's own forward kernel with ADD set: its first
 * pass forms each element of the sum with ts_k_add's arithmetic and stores
 * it, and every statistic is taken from the stored (rounded) sum in the
 * same threads, order and launch shape as the unfused kernel, so fused and
 * unfused give the same bits on the GPU.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { ROW_THREADS = 256, DW_COLS = 32, DW_LANES = 16 };

/* TS_ERR_INVALID_ARGUMENT if N rows do not fit one grid dimension. */
static ts_status check_rows(size_t N, const char *op) {
  if (N <= 0x7fffffffu) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): N = %zu rows: at most 2^31 - 1", op,
                      N);
}

/* Element i of a norm forward's input in the kernel's first pass: inp[i];
 * with ADD, first inp[i] = a[i] + b[i] rounded once to DT (ts_k_add's
 * arithmetic, vecops.cu), then the stored value. Later passes read inp[i]
 * in the same thread, which sees its own store. Without ADD, inp is only
 * read. */
template <ts_dtype DT, bool ADD>
__device__ __forceinline__ float norm_in(void *inp, const void *a, const void *b, size_t i) {
  if constexpr (ADD) ts_st<DT>(inp, i, ts_ld<DT>(a, i) + ts_ld<DT>(b, i));
  return ts_ld<DT>(inp, i);
}

/* ---- RMSNorm ------------------------------------------------------------- */

/* One block per row: rstd = 1 / sqrt(mean(x^2) + eps); out = w * (x * rstd);
 * x = inp, or with ADD inp = a + b first (norm_in). */
template <ts_dtype DT, bool ADD>
__global__ void rmsnorm_fwd_kernel(void *out, float *rstd, void *inp, const void *a,
                                   const void *b, const void *weight, size_t C, float eps) {
  __shared__ float sh[32];
  size_t o = (size_t)blockIdx.x * C;
  float ss = 0.0f;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float x = norm_in<DT, ADD>(inp, a, b, o + c);
    ss += x * x;
  }
  ss = ts_block_sum(ss, sh);
  float r = 1.0f / sqrtf(ss / (float)C + eps);
  for (size_t c = threadIdx.x; c < C; c += blockDim.x)
    ts_st<DT>(out, o + c, ts_ld<DT>(weight, c) * (ts_ld<DT>(inp, o + c) * r));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

/* a NULL: RMSNorm of inp; else inp = a + b first (the fused op). */
template <ts_dtype DT>
static void launch_rmsnorm_fwd(void *out, float *rstd, void *inp, const void *a, const void *b,
                               const void *weight, size_t N, size_t C, float eps,
                               cudaStream_t s) {
  if (a)
    rmsnorm_fwd_kernel<DT, true>
        <<<(unsigned)N, ROW_THREADS, 0, s>>>(out, rstd, inp, a, b, weight, C, eps);
  else
    rmsnorm_fwd_kernel<DT, false>
        <<<(unsigned)N, ROW_THREADS, 0, s>>>(out, rstd, inp, a, b, weight, C, eps);
}

extern "C" ts_status ts_cuda_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd,
                                             const void *inp, const void *weight, size_t N,
                                             size_t C, float eps, ts_dtype dt) {
  TS_CHECK(check_rows(N, "ts_k_rmsnorm_forward"));
  /* inp is only read without ADD */
  TS_CUDA_DT_CALL(dt, launch_rmsnorm_fwd, out, rstd, (void *)inp, nullptr, nullptr, weight, N, C,
                  eps, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_rmsnorm_forward");
}

extern "C" ts_status ts_cuda_add_rmsnorm_forward(const ts_kctx *ctx, void *out, float *rstd,
                                                 void *res, const void *a, const void *b,
                                                 const void *weight, size_t N, size_t C,
                                                 float eps, ts_dtype dt) {
  static const char op[] = "ts_k_add_rmsnorm_forward";
  TS_CHECK(check_rows(N, op));
  TS_CUDA_DT_CALL(dt, launch_rmsnorm_fwd, out, rstd, res, a, b, weight, N, C, eps,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

/* One block per row: dinp += r g - (r^3 (g . x) / C) x, g = w * dout. */
template <ts_dtype DT>
__global__ void rmsnorm_bwd_kernel(void *dinp, const void *dout, const void *inp,
                                   const void *weight, const float *rstd, size_t C) {
  __shared__ float sh[32];
  size_t o = (size_t)blockIdx.x * C;
  float r = rstd[blockIdx.x];
  float dot = 0.0f;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += ts_ld<DT>(weight, c) * ts_ld<DT>(dout, o + c) * ts_ld<DT>(inp, o + c);
  dot = ts_block_sum(dot, sh);
  float k = r * r * r * dot / (float)C;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float g = ts_ld<DT>(weight, c) * ts_ld<DT>(dout, o + c);
    ts_st<DT>(dinp, o + c, ts_ld<DT>(dinp, o + c) + (r * g - k * ts_ld<DT>(inp, o + c)));
  }
}

/* Column sums over rows (RMSNorm's and LayerNorm's dweight, LayerNorm's
 * and the bias's dbias), in two passes. Rows are cut into R = dw_blocks(N)
 * fixed blocks of consecutive rows; pass 1, one thread block per (32
 * columns, row block): lane l of DW_LANES sums rows l, l + DW_LANES, ... of
 * the row block, the lanes' sums are added in lane order into
 * partial[r * stride + c] (fp32, the workspace); pass 2 adds partial[0..R)
 * in order to the gradient (one rounding to dt). Every order is fixed by N
 * and C alone: results repeat. */
enum { DW_MAX_BLOCKS = 128, DW_MIN_ROWS = 64 };

static size_t dw_blocks(size_t N) {
  size_t r = (N + DW_MIN_ROWS - 1) / DW_MIN_ROWS;
  return r < 1 ? 1 : r > DW_MAX_BLOCKS ? DW_MAX_BLOCKS : r;
}

/* Bytes of `rows` fp32 partial rows of C per row block, 64-byte multiple. */
static size_t colsum_bytes(size_t N, size_t C, size_t rows) {
  return N == 0 || C == 0 ? 0 : (dw_blocks(N) * rows * C * sizeof(float) + 63) & ~(size_t)63;
}

extern "C" size_t ts_cuda_rmsnorm_workspace_bytes(size_t N, size_t C, ts_dtype dt) {
  (void)dt;
  return colsum_bytes(N, C, 1);
}

/* Pass 1: partial[r * stride + c] = the sum over row block r of
 *   dout[n, c] * ((inp[n, c] - mean[n]) * rstd[n])  (inp given; mean NULL:
 *                                                    inp[n, c] * rstd[n])
 *   dout[n, c]                                      (inp NULL). */
template <ts_dtype DT>
__global__ void colsum_partial_kernel(float *partial, const void *dout, const void *inp,
                                      const float *mean, const float *rstd, size_t N, size_t C,
                                      size_t R, size_t stride) {
  __shared__ float part[DW_LANES][DW_COLS];
  unsigned col = threadIdx.x % DW_COLS, lane = threadIdx.x / DW_COLS;
  size_t c = (size_t)blockIdx.x * DW_COLS + col, r = blockIdx.y;
  size_t n0 = r * N / R, n1 = (r + 1) * N / R;
  float acc = 0.0f;
  if (c < C)
    for (size_t n = n0 + lane; n < n1; n += DW_LANES) {
      if (!inp) {
        acc += ts_ld<DT>(dout, n * C + c);
        continue;
      }
      float x = ts_ld<DT>(inp, n * C + c);
      if (mean) x -= mean[n];
      acc += ts_ld<DT>(dout, n * C + c) * (x * rstd[n]);
    }
  part[lane][col] = acc;
  __syncthreads();
  if (lane == 0 && c < C) {
    float sum = 0.0f;
    for (unsigned l = 0; l < DW_LANES; l++) sum += part[l][col];
    partial[r * stride + c] = sum;
  }
}

/* Pass 2: d[c] = round(d[c] + sum_r partial[r * stride + c]), r in order. */
template <ts_dtype DT>
__global__ void colsum_sum_kernel(void *d, const float *partial, size_t C, size_t R,
                                  size_t stride) {
  for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < C;
       c += (size_t)gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (size_t r = 0; r < R; r++) sum += partial[r * stride + c];
    ts_st<DT>(d, c, ts_ld<DT>(d, c) + sum);
  }
}

/* Both passes of one column sum into d, with partial rows `stride` apart. */
template <ts_dtype DT>
static void colsum(void *d, float *partial, size_t stride, const void *dout, const void *inp,
                   const float *mean, const float *rstd, size_t N, size_t C, cudaStream_t s) {
  size_t R = dw_blocks(N);
  dim3 grid((unsigned)((C + DW_COLS - 1) / DW_COLS), (unsigned)R);
  colsum_partial_kernel<DT><<<grid, DW_COLS * DW_LANES, 0, s>>>(partial, dout, inp, mean, rstd, N,
                                                                C, R, stride);
  colsum_sum_kernel<DT><<<ts_cuda_grid(C), TS_CUDA_BLOCK, 0, s>>>(d, partial, C, R, stride);
}

template <ts_dtype DT>
static void launch_rmsnorm_bwd(void *dinp, void *dweight, float *partial, const void *dout,
                               const void *inp, const void *weight, const float *rstd, size_t N,
                               size_t C, cudaStream_t s) {
  if (dinp) rmsnorm_bwd_kernel<DT><<<(unsigned)N, ROW_THREADS, 0, s>>>(dinp, dout, inp, weight, rstd, C);
  if (dweight) colsum<DT>(dweight, partial, C, dout, inp, nullptr, rstd, N, C, s);
}

extern "C" ts_status ts_cuda_rmsnorm_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                              const void *dout, const void *inp,
                                              const void *weight, const float *rstd, size_t N,
                                              size_t C, ts_dtype dt) {
  TS_CHECK(check_rows(N, "ts_k_rmsnorm_backward"));
  TS_CUDA_DT_CALL(dt, launch_rmsnorm_bwd, dinp, dweight, (float *)ctx->workspace, dout, inp,
                  weight, rstd, N, C, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_rmsnorm_backward");
}

/* ---- RoPE ------------------------------------------------------------------ */

/* The rotation frequencies f_i = theta^(-2i/HS), i < HS/2, computed on the
 * host with the CPU's expression (kernels/cpu/rope.c), so both backends
 * rotate by the same angles: the device's powf is not correctly rounded, and
 * an ulp in f_i is t ulps in the angle at position t. Passed by value:
 * every head size the front accepts (TS_K_ROPE_MAX_HS), 4 KiB, which with
 * the other arguments passes the classic 4 KiB kernel-parameter limit;
 * CUDA 12.1+ allows 32764 bytes on Volta and newer (every architecture
 * third_party/cuda.bzl builds for), and nvcc refuses a kernel over it. */
enum { ROPE_MAX_HALF = TS_K_ROPE_MAX_HS / 2 };
struct rope_freqs {
  float f[ROPE_MAX_HALF];
};
static_assert(sizeof(rope_freqs) + 7 * sizeof(size_t) + sizeof(float) + 2 * sizeof(void *) <= 32764,
              "rope_kernel's parameters exceed CUDA's 32764-byte limit");

/* One thread per (row, head, i < HS/2): rotates the pair (i, i + HS/2) of
 * position t = pos0 + row % T (pos0 = 0 but for ts_k_rope_forward_at) by
 * a = t * f_i (sign -1: the inverse). The pair is
 * read before it is written, so out == x is fine. */
template <ts_dtype DT>
__global__ void rope_kernel(void *out, const void *x, size_t rows, size_t T, size_t pos0,
                            size_t H, size_t HS, rope_freqs fr, float sign) {
  size_t half = HS / 2, total = rows * H * half;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    size_t i = idx % half, rh = idx / half, row = rh / H;
    float a = (float)(pos0 + row % T) * fr.f[i];
    float c = cosf(a), sn = sign * sinf(a);
    size_t o = rh * HS;
    float x1 = ts_ld<DT>(x, o + i), x2 = ts_ld<DT>(x, o + i + half);
    ts_st<DT>(out, o + i, x1 * c - x2 * sn);
    ts_st<DT>(out, o + i + half, x2 * c + x1 * sn);
  }
}

template <ts_dtype DT>
static void launch_rope(void *out, const void *x, size_t B, size_t T, size_t pos0, size_t H,
                        size_t HS, const rope_freqs &fr, float sign, cudaStream_t s) {
  size_t n = B * T * H * (HS / 2);
  rope_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(out, x, B * T, T, pos0, H, HS, fr,
                                                            sign);
}

static ts_status rope_apply(const ts_kctx *ctx, void *out, const void *x, size_t B, size_t T,
                            size_t pos0, size_t H, size_t HS, float theta, float sign, ts_dtype dt,
                            const char *op) {
  size_t half = HS / 2;
  if (half > ROPE_MAX_HALF)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): HS = %zu: at most %d", op, HS,
                        2 * ROPE_MAX_HALF);
  rope_freqs fr;
  for (size_t i = 0; i < half; i++) fr.f[i] = 1.0f / powf(theta, (float)(2 * i) / (float)HS);
  TS_CUDA_DT_CALL(dt, launch_rope, out, x, B, T, pos0, H, HS, fr, sign,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_rope_forward(const ts_kctx *ctx, void *out, const void *x, size_t B,
                                          size_t T, size_t H, size_t HS, float theta,
                                          ts_dtype dt) {
  return rope_apply(ctx, out, x, B, T, 0, H, HS, theta, 1.0f, dt, "ts_k_rope_forward");
}

extern "C" ts_status ts_cuda_rope_backward(const ts_kctx *ctx, void *dx, const void *dout,
                                           size_t B, size_t T, size_t H, size_t HS, float theta,
                                           ts_dtype dt) {
  return rope_apply(ctx, dx, dout, B, T, 0, H, HS, theta, -1.0f, dt, "ts_k_rope_backward");
}

extern "C" ts_status ts_cuda_rope_forward_at(const ts_kctx *ctx, void *out, const void *x,
                                             size_t T, size_t pos0, size_t H, size_t HS,
                                             float theta, ts_dtype dt) {
  return rope_apply(ctx, out, x, 1, T, pos0, H, HS, theta, 1.0f, dt, "ts_k_rope_forward_at");
}

/* ---- SwiGLU ------------------------------------------------------------------ */

template <ts_dtype DT>
__global__ void swiglu_fwd_kernel(void *h, const void *gate, const void *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    ts_st<DT>(h, i, ts_silu(ts_ld<DT>(gate, i)) * ts_ld<DT>(up, i));
}

template <ts_dtype DT>
__global__ void swiglu_bwd_kernel(void *dgate, void *dup, const void *dh, const void *gate,
                                  const void *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = ts_ld<DT>(gate, i), u = ts_ld<DT>(up, i), d = ts_ld<DT>(dh, i);
    float sg, dsg;
    ts_silu_and_grad(g, &sg, &dsg);
    ts_st<DT>(dgate, i, d * u * dsg);
    ts_st<DT>(dup, i, d * sg);
  }
}

template <ts_dtype DT>
static void launch_swiglu_fwd(void *h, const void *gate, const void *up, size_t n,
                              cudaStream_t s) {
  swiglu_fwd_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(h, gate, up, n);
}

template <ts_dtype DT>
static void launch_swiglu_bwd(void *dgate, void *dup, const void *dh, const void *gate,
                              const void *up, size_t n, cudaStream_t s) {
  swiglu_bwd_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(dgate, dup, dh, gate, up, n);
}

extern "C" ts_status ts_cuda_swiglu_forward(const ts_kctx *ctx, void *h, const void *gate,
                                            const void *up, size_t n, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_swiglu_fwd, h, gate, up, n, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_swiglu_forward");
}

extern "C" ts_status ts_cuda_swiglu_backward(const ts_kctx *ctx, void *dgate, void *dup,
                                             const void *dh, const void *gate, const void *up,
                                             size_t n, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_swiglu_bwd, dgate, dup, dh, gate, up, n, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_swiglu_backward");
}

/* ---- LayerNorm (Ba et al. 2016, eq. 4; torch.nn.LayerNorm) ---------------------- */

/* One block per row: m = mean(x); r = 1 / sqrt(mean((x - m)^2) + eps);
 * out = (x - m) * r * w + b; x = inp, or with ADD inp = a + b first
 * (norm_in). */
template <ts_dtype DT, bool ADD>
__global__ void layernorm_fwd_kernel(void *out, float *mean, float *rstd, void *inp,
                                     const void *a, const void *b, const void *weight,
                                     const void *bias, size_t C, float eps) {
  __shared__ float sh[32];
  size_t o = (size_t)blockIdx.x * C;
  float s = 0.0f;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) s += norm_in<DT, ADD>(inp, a, b, o + c);
  float m = ts_block_sum(s, sh) / (float)C;
  float ss = 0.0f;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float d = ts_ld<DT>(inp, o + c) - m;
    ss += d * d;
  }
  ss = ts_block_sum(ss, sh);
  float r = 1.0f / sqrtf(ss / (float)C + eps);
  for (size_t c = threadIdx.x; c < C; c += blockDim.x)
    ts_st<DT>(out, o + c,
              (ts_ld<DT>(inp, o + c) - m) * r * ts_ld<DT>(weight, c) + ts_ld<DT>(bias, c));
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = r;
  }
}

/* One block per row: dinp += r (g - mean(g) - xhat mean(g xhat)), g = dout w. */
template <ts_dtype DT>
__global__ void layernorm_bwd_kernel(void *dinp, const void *dout, const void *inp,
                                     const void *weight, const float *mean, const float *rstd,
                                     size_t C) {
  __shared__ float sh[32];
  size_t o = (size_t)blockIdx.x * C;
  float m = mean[blockIdx.x], r = rstd[blockIdx.x];
  float sg = 0.0f, sgx = 0.0f;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float g = ts_ld<DT>(dout, o + c) * ts_ld<DT>(weight, c);
    sg += g;
    sgx += g * ((ts_ld<DT>(inp, o + c) - m) * r);
  }
  float mg = ts_block_sum(sg, sh) / (float)C;
  float mgx = ts_block_sum(sgx, sh) / (float)C;
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float g = ts_ld<DT>(dout, o + c) * ts_ld<DT>(weight, c);
    float xhat = (ts_ld<DT>(inp, o + c) - m) * r;
    ts_st<DT>(dinp, o + c, ts_ld<DT>(dinp, o + c) + r * (g - mg - xhat * mgx));
  }
}

extern "C" size_t ts_cuda_layernorm_workspace_bytes(size_t N, size_t C, ts_dtype dt) {
  (void)dt;
  return colsum_bytes(N, C, 2); /* (R, 2, C): dweight's partial rows, then dbias's */
}

/* a NULL: LayerNorm of inp; else inp = a + b first (the fused op). */
template <ts_dtype DT>
static void launch_layernorm_fwd(void *out, float *mean, float *rstd, void *inp, const void *a,
                                 const void *b, const void *weight, const void *bias, size_t N,
                                 size_t C, float eps, cudaStream_t s) {
  if (a)
    layernorm_fwd_kernel<DT, true><<<(unsigned)N, ROW_THREADS, 0, s>>>(out, mean, rstd, inp, a, b,
                                                                       weight, bias, C, eps);
  else
    layernorm_fwd_kernel<DT, false><<<(unsigned)N, ROW_THREADS, 0, s>>>(out, mean, rstd, inp, a, b,
                                                                        weight, bias, C, eps);
}

template <ts_dtype DT>
static void launch_layernorm_bwd(void *dinp, void *dweight, void *dbias, float *partial,
                                 const void *dout, const void *inp, const void *weight,
                                 const float *mean, const float *rstd, size_t N, size_t C,
                                 cudaStream_t s) {
  if (dinp)
    layernorm_bwd_kernel<DT><<<(unsigned)N, ROW_THREADS, 0, s>>>(dinp, dout, inp, weight, mean,
                                                                 rstd, C);
  if (dweight) colsum<DT>(dweight, partial, 2 * C, dout, inp, mean, rstd, N, C, s);
  if (dbias) colsum<DT>(dbias, partial + C, 2 * C, dout, nullptr, nullptr, nullptr, N, C, s);
}

extern "C" ts_status ts_cuda_layernorm_forward(const ts_kctx *ctx, void *out, float *mean,
                                               float *rstd, const void *inp, const void *weight,
                                               const void *bias, size_t N, size_t C, float eps,
                                               ts_dtype dt) {
  static const char op[] = "ts_k_layernorm_forward";
  TS_CHECK(check_rows(N, op));
  /* inp is only read without ADD */
  TS_CUDA_DT_CALL(dt, launch_layernorm_fwd, out, mean, rstd, (void *)inp, nullptr, nullptr, weight,
                  bias, N, C, eps, (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_add_layernorm_forward(const ts_kctx *ctx, void *out, float *mean,
                                                   float *rstd, void *res, const void *a,
                                                   const void *b, const void *weight,
                                                   const void *bias, size_t N, size_t C,
                                                   float eps, ts_dtype dt) {
  static const char op[] = "ts_k_add_layernorm_forward";
  TS_CHECK(check_rows(N, op));
  TS_CUDA_DT_CALL(dt, launch_layernorm_fwd, out, mean, rstd, res, a, b, weight, bias, N, C, eps,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_layernorm_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                                void *dbias, const void *dout, const void *inp,
                                                const void *weight, const float *mean,
                                                const float *rstd, size_t N, size_t C,
                                                ts_dtype dt) {
  static const char op[] = "ts_k_layernorm_backward";
  TS_CHECK(check_rows(N, op));
  TS_CUDA_DT_CALL(dt, launch_layernorm_bwd, dinp, dweight, dbias, (float *)ctx->workspace, dout,
                  inp, weight, mean, rstd, N, C, (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

/* ---- bias ------------------------------------------------------------------------- */

template <ts_dtype DT>
__global__ void bias_add_kernel(void *out, const void *bias, size_t n, size_t C) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    ts_st<DT>(out, i, ts_ld<DT>(out, i) + ts_ld<DT>(bias, i % C));
}

template <ts_dtype DT>
static void launch_bias_add(void *out, const void *bias, size_t N, size_t C, cudaStream_t s) {
  bias_add_kernel<DT><<<ts_cuda_grid(N * C), TS_CUDA_BLOCK, 0, s>>>(out, bias, N * C, C);
}

extern "C" size_t ts_cuda_bias_workspace_bytes(size_t N, size_t C, ts_dtype dt) {
  (void)dt;
  return colsum_bytes(N, C, 1);
}

extern "C" ts_status ts_cuda_bias_add(const ts_kctx *ctx, void *out, const void *bias, size_t N,
                                      size_t C, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_bias_add, out, bias, N, C, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_bias_add");
}

extern "C" ts_status ts_cuda_bias_backward(const ts_kctx *ctx, void *dbias, const void *dout,
                                           size_t N, size_t C, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, colsum, dbias, (float *)ctx->workspace, C, dout, nullptr, nullptr, nullptr,
                  N, C, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_bias_backward");
}

/* ---- GELU (kernels/elementwise.h: ts_gelu, ts_gelu_grad) ---------------------------- */

/* y[i] = gelu(inp[i]), or with dout: dout[i] * gelu'(inp[i]). */
template <ts_dtype DT>
__global__ void gelu_kernel(void *y, const void *dout, const void *inp, size_t n, int tanh_form) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = ts_ld<DT>(inp, i);
    ts_st<DT>(y, i, dout ? ts_ld<DT>(dout, i) * ts_gelu_grad(x, tanh_form) : ts_gelu(x, tanh_form));
  }
}

template <ts_dtype DT>
static void launch_gelu(void *y, const void *dout, const void *inp, size_t n, int tanh_form,
                        cudaStream_t s) {
  gelu_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(y, dout, inp, n, tanh_form);
}

extern "C" ts_status ts_cuda_gelu_forward(const ts_kctx *ctx, void *out, const void *inp,
                                          size_t n, ts_gelu_kind kind, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_gelu, out, nullptr, inp, n, kind == TS_GELU_TANH,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_gelu_forward");
}

extern "C" ts_status ts_cuda_gelu_backward(const ts_kctx *ctx, void *dinp, const void *dout,
                                           const void *inp, size_t n, ts_gelu_kind kind,
                                           ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_gelu, dinp, dout, inp, n, kind == TS_GELU_TANH,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_gelu_backward");
}

/* ---- token types ------------------------------------------------------------------------ */

/* One thread per batch row, positions in order: the sep_id tokens before
 * each, capped at cap. */
__global__ void token_types_kernel(int32_t *types, const int32_t *tokens, size_t B, size_t T,
                                   int32_t sep_id, int32_t cap) {
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < B;
       b += (size_t)gridDim.x * blockDim.x) {
    int32_t seen = 0;
    for (size_t t = 0; t < T; t++) {
      size_t i = b * T + t;
      types[i] = seen;
      if (sep_id >= 0 && tokens[i] == sep_id && seen < cap) seen++;
    }
  }
}

extern "C" ts_status ts_cuda_token_types(const ts_kctx *ctx, int32_t *types,
                                         const int32_t *tokens, size_t B, size_t T,
                                         int32_t sep_id, size_t n_types) {
  token_types_kernel<<<ts_cuda_grid(B), TS_CUDA_BLOCK, 0, (cudaStream_t)ctx->stream>>>(
      types, tokens, B, T, sep_id, (int32_t)(n_types - 1));
  return ts_cuda_launched("ts_k_token_types");
}

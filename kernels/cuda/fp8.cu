/*
 * fp8.cu — CUDA bodies of the fp8 ops (kernels/kernels.h, "fp8 linear
 * layer"): the casts to fp8 and the linear layer whose products run on
 * cuBLASLt's fp8 matmul (linear.cu, ts_cuda_matmul_fp8).
 *
 * Casts: kernels/fp8.h's element functions, so the codes and scales are
 * the CPU reference's bit for bit. An absolute maximum is the largest |x|
 * bit pattern as an unsigned integer (warp __reduce_max_sync, then
 * atomicMax across blocks: max is exact in any order, so the result does
 * not depend on the schedule; a NaN's pattern is above infinity's and
 * wins, as on the CPU).
 *   not transposed, rowwise:    one block per row: its maximum, its scale,
 *                               its codes (1 launch);
 *   not transposed, tensorwise: the maximum (memset + 1 launch), then one
 *                               block per row casting with the one scale;
 *   transposed:                 per-column maxima of inp (rowwise) or the
 *                               maximum (memset + 1 launch), then 32 x 32
 *                               tiles through shared memory so both the
 *                               reads and the writes are coalesced.
 * Workspace (ts_cuda_fp8_quantize_workspace_bytes): the maxima, C uint32
 * (one per column of inp) rounded up to 256 bytes, plus 256.
 *
 * The linear layer's workspace (ts_cuda_linear_fp8_workspace_bytes):
 * cuBLASLt's own first (where ts_cuda_matmul_fp8 takes it, at the start of
 * ctx->workspace), then the codes of both operands, their inverse scales
 * and the cast's maxima, each 256-byte aligned (cuBLASLt's fp8 operands
 * need 16); rowwise also the largest product in fp32.
 *
 * Products: tensorwise, cuBLASLt's fp8 matmul with its scalar scales and
 * a bf16 D. Rowwise: cuBLASLt 13.1 answered the outer-vector scale mode
 * with status 7 on an H200 (docs/BENCHMARKS.md, 2026-11-28), so the
 * product runs unscaled into fp32 and one kernel (scale_rows_kernel)
 * applies the two scale vectors, adds dweight's old value and rounds to
 * bf16 once, in the CPU reference's order (kernels/cpu/fp8.c, product()).
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/fp8.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

extern "C" size_t ts_cuda_fp8_quantize_workspace_bytes(size_t R, size_t C) {
  (void)R;
  return align256(C * sizeof(uint32_t)) + 256;
}

/* Max of v over the block (blockDim.x a multiple of 32). */
__device__ static uint32_t block_max_u32(uint32_t v, uint32_t *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = __reduce_max_sync(0xffffffffu, v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0u;
  return __reduce_max_sync(0xffffffffu, v);
}

template <ts_dtype DT>
__device__ static uint32_t abs_bits(const void *p, size_t i) {
  return ts_f32_bits(ts_ld<DT>(p, i)) & 0x7fffffffu;
}

/* *amax = max |inp[i]| over n elements (as bits), *amax zeroed before. */
template <ts_dtype DT>
__global__ static void amax_kernel(uint32_t *amax, const void *inp, size_t n) {
  __shared__ uint32_t sh[32];
  uint32_t m = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    m = max(m, abs_bits<DT>(inp, i));
  m = block_max_u32(m, sh);
  if (threadIdx.x == 0) atomicMax(amax, m);
}

/* col[c] = max over rows of |inp[r, c]|, inp (R, C), col zeroed before:
 * blockIdx.y takes a slice of rows, threads the columns. */
template <ts_dtype DT>
__global__ static void col_amax_kernel(uint32_t *col, const void *inp, size_t R, size_t C,
                                       size_t rows_per) {
  size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (c >= C) return;
  size_t r0 = blockIdx.y * rows_per, r1 = r0 + rows_per < R ? r0 + rows_per : R;
  uint32_t m = 0;
  for (size_t r = r0; r < r1; r++) m = max(m, abs_bits<DT>(inp, r * C + c));
  atomicMax(&col[c], m);
}

/* Rows of out (R, C) = inp cast: one block per row. amax != NULL: one
 * scale for all (tensorwise; block 0 writes scale_inv[0]); else each
 * row's own. */
template <ts_dtype DT>
__global__ static void rows_cast_kernel(uint8_t *out, float *scale_inv, const void *inp,
                                        size_t C, ts_fp8_format fmt, int pow2,
                                        const uint32_t *amax) {
  __shared__ uint32_t sh[32];
  size_t r = blockIdx.x;
  float s;
  if (amax) {
    s = ts_fp8_scale(ts_bits_f32(*amax), fmt, pow2);
    if (r == 0 && threadIdx.x == 0) scale_inv[0] = ts_fp8_scale_inv(s);
  } else {
    uint32_t m = 0;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) m = max(m, abs_bits<DT>(inp, r * C + c));
    m = block_max_u32(m, sh);
    s = ts_fp8_scale(ts_bits_f32(m), fmt, pow2);
    if (threadIdx.x == 0) scale_inv[r] = ts_fp8_scale_inv(s);
  }
  for (size_t c = threadIdx.x; c < C; c += blockDim.x)
    out[r * C + c] = ts_fp8_cast(ts_ld<DT>(inp, r * C + c), s, fmt);
}

enum { TILE = 32, TILE_ROWS = 8 };

/* out (C, R) = inp (R, C)^T cast, by 32 x 32 tiles (block 32 x 8). The
 * scale of out row c: from col[c] (rowwise; the first row of tiles writes
 * scale_inv[c]) or from *amax (tensorwise; block (0, 0) writes
 * scale_inv[0]). */
template <ts_dtype DT>
__global__ static void transpose_cast_kernel(uint8_t *out, float *scale_inv, const void *inp,
                                             size_t R, size_t C, ts_fp8_format fmt, int pow2,
                                             const uint32_t *col, const uint32_t *amax) {
  __shared__ float tile[TILE][TILE + 1];
  size_t c0 = blockIdx.x * (size_t)TILE, r0 = blockIdx.y * (size_t)TILE;
  for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) { /* read rows r0 + j, coalesced */
    size_t r = r0 + j, c = c0 + threadIdx.x;
    tile[j][threadIdx.x] = r < R && c < C ? ts_ld<DT>(inp, r * C + c) : 0.0f;
  }
  __syncthreads();
  for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) { /* write out rows c0 + j */
    size_t c = c0 + j, r = r0 + threadIdx.x;
    if (c >= C) continue;
    float s = ts_fp8_scale(ts_bits_f32(amax ? *amax : col[c]), fmt, pow2);
    if (r < R) out[c * R + r] = ts_fp8_cast(tile[threadIdx.x][j], s, fmt);
    if (threadIdx.x == 0 && blockIdx.y == 0 && (!amax || (blockIdx.x == 0 && j == 0)))
      scale_inv[amax ? 0 : c] = ts_fp8_scale_inv(s);
  }
}

template <ts_dtype DT>
static void quantize(cudaStream_t s, uint8_t *out, float *scale_inv, const void *inp, size_t R,
                     size_t C, int transpose, ts_fp8_format fmt, ts_fp8_scaling scaling,
                     uint32_t *maxima) {
  int pow2 = scaling == TS_FP8_ROWWISE;
  uint32_t *amax = maxima; /* tensorwise: the first; rowwise transposed: C of them */
  if (scaling == TS_FP8_TENSORWISE || transpose)
    cudaMemsetAsync(maxima, 0, (scaling == TS_FP8_TENSORWISE ? 1 : C) * sizeof(uint32_t), s);
  if (scaling == TS_FP8_TENSORWISE)
    amax_kernel<DT><<<ts_cuda_grid(R * C), TS_CUDA_BLOCK, 0, s>>>(amax, inp, R * C);
  if (!transpose) {
    rows_cast_kernel<DT><<<(unsigned)R, TS_CUDA_BLOCK, 0, s>>>(
        out, scale_inv, inp, C, fmt, pow2, scaling == TS_FP8_TENSORWISE ? amax : nullptr);
    return;
  }
  if (scaling == TS_FP8_ROWWISE) {
    size_t rows_per = 256, slices = (R + rows_per - 1) / rows_per;
    dim3 grid((unsigned)((C + TS_CUDA_BLOCK - 1) / TS_CUDA_BLOCK), (unsigned)slices);
    col_amax_kernel<DT><<<grid, TS_CUDA_BLOCK, 0, s>>>(maxima, inp, R, C, rows_per);
  }
  dim3 grid((unsigned)((C + TILE - 1) / TILE), (unsigned)((R + TILE - 1) / TILE));
  transpose_cast_kernel<DT><<<grid, dim3(TILE, TILE_ROWS), 0, s>>>(
      out, scale_inv, inp, R, C, fmt, pow2, scaling == TS_FP8_ROWWISE ? maxima : nullptr,
      scaling == TS_FP8_TENSORWISE ? amax : nullptr);
}

/* The maxima's place in a workspace (after 256 bytes kept free). */
static uint32_t *maxima_at(void *ws) {
  return (uint32_t *)(((uintptr_t)ws + 255) & ~(uintptr_t)255);
}

static ts_status quantize_call(const ts_kctx *ctx, uint8_t *out, float *scale_inv,
                               const void *inp, size_t R, size_t C, int transpose,
                               ts_fp8_format fmt, ts_fp8_scaling scaling, ts_dtype dt,
                               uint32_t *maxima, const char *op) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  TS_CUDA_DT_CALL(dt, quantize, s, out, scale_inv, inp, R, C, transpose, fmt, scaling, maxima);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_fp8_quantize(const ts_kctx *ctx, uint8_t *out, float *scale_inv,
                                          const void *inp, size_t R, size_t C, int transpose,
                                          ts_fp8_format fmt, ts_fp8_scaling scaling,
                                          ts_dtype dt) {
  return quantize_call(ctx, out, scale_inv, inp, R, C, transpose, fmt, scaling, dt,
                       maxima_at(ctx->workspace), "ts_k_fp8_quantize");
}

/* ---- the linear layer ------------------------------------------------------------ */

/* The parts of the linear layer's workspace after cuBLASLt's. */
typedef struct {
  uint8_t *a8, *b8;
  float *sa, *sb;
  uint32_t *maxima;
  float *d32; /* rowwise: the unscaled fp32 product */
} fp8_ws;

/* Sizes of the parts, in the order fp8_ws lists them; the last (d32) only
 * rowwise. */
static void part_sizes(size_t M, size_t N, size_t K, ts_fp8_scaling scaling, size_t sz[6]) {
  sz[0] = align256(M * (K > N ? K : N));
  sz[1] = align256(K * (N > M ? N : M));
  sz[2] = align256((M > N ? M : N) * sizeof(float));
  sz[3] = align256((N > K ? N : K) * sizeof(float));
  sz[4] = align256((K > N ? K : N) * sizeof(uint32_t)); /* columns of x, W or dout */
  size_t most = M * N > M * K ? M * N : M * K;            /* out, dinp, dweight */
  if (N * K > most) most = N * K;
  sz[5] = scaling == TS_FP8_ROWWISE ? align256(most * sizeof(float)) : 0;
}

extern "C" size_t ts_cuda_linear_fp8_workspace_bytes(size_t M, size_t N, size_t K,
                                                     ts_fp8_scaling scaling) {
  size_t sz[6], total = ts_cuda_linear_workspace_bytes(M, N, K, TS_BF16) + 256;
  part_sizes(M, N, K, scaling, sz);
  for (int i = 0; i < 6; i++) total += sz[i];
  return total;
}

static fp8_ws carve(const ts_kctx *ctx, size_t M, size_t N, size_t K, ts_fp8_scaling scaling) {
  size_t sz[6];
  part_sizes(M, N, K, scaling, sz);
  char *p = (char *)ctx->workspace + ts_cuda_linear_workspace_bytes(M, N, K, TS_BF16);
  p = (char *)(((uintptr_t)p + 255) & ~(uintptr_t)255);
  fp8_ws w;
  w.a8 = (uint8_t *)p, p += sz[0];
  w.b8 = (uint8_t *)p, p += sz[1];
  w.sa = (float *)p, p += sz[2];
  w.sb = (float *)p, p += sz[3];
  w.maxima = (uint32_t *)p, p += sz[4];
  w.d32 = (float *)p;
  return w;
}

/* out (P, S) bf16 = d32 x sa[p] x sb[s] (+ out when accumulate), each step
 * rounded to fp32 (ts_fmul, ts_fadd) and the result once to bf16: the CPU
 * reference's order. */
__global__ static void scale_rows_kernel(void *out, const float *d32, const float *sa,
                                         const float *sb, size_t P, size_t S, int accumulate) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P * S;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = ts_fmul(ts_fmul(d32[i], sa[i / S]), sb[i % S]);
    if (accumulate) v = ts_fadd(v, ts_ld<TS_BF16>(out, i));
    ts_st<TS_BF16>(out, i, v);
  }
}

/* out (P, S) bf16 (+)= (A (P, Q) @ B (S, Q)^T) x sa x sb: tensorwise in
 * cuBLASLt's epilogue, rowwise through w's fp32 product (header). */
static ts_status product(const ts_kctx *ctx, const char *op, size_t P, size_t S, size_t Q,
                         const fp8_ws *w, ts_fp8_format fa, ts_fp8_format fb, void *out,
                         int accumulate, ts_fp8_scaling scaling, int fast_accum) {
  if (scaling != TS_FP8_ROWWISE)
    return ts_cuda_matmul_fp8(ctx, op, P, S, Q, w->a8, fa, w->sa, w->b8, fb, w->sb, out, TS_BF16,
                              accumulate, fast_accum);
  TS_CHECK(ts_cuda_matmul_fp8(ctx, op, P, S, Q, w->a8, fa, nullptr, w->b8, fb, nullptr, w->d32,
                              TS_FP32, 0, fast_accum));
  scale_rows_kernel<<<ts_cuda_grid(P * S), TS_CUDA_BLOCK, 0, (cudaStream_t)ctx->stream>>>(
      out, w->d32, w->sa, w->sb, P, S, accumulate);
  return ts_cuda_launched(op);
}

/* TS_ERR_UNSUPPORTED unless ctx's GPU has fp8 tensor cores (8.9+). */
static ts_status check_fp8_gpu(const ts_kctx *ctx, const char *op) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device_index) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx->device_index) !=
          cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "%s (cuda): cannot read GPU %d's compute capability", op,
                        ctx->device_index);
  if (major * 10 + minor >= 89) return TS_OK;
  return ts_set_error(TS_ERR_UNSUPPORTED,
                      "%s (cuda): GPU %d has compute capability %d.%d: fp8 products need 8.9 or "
                      "newer (Ada, Hopper)",
                      op, ctx->device_index, major, minor);
}

extern "C" ts_status ts_cuda_linear_fp8_forward(const ts_kctx *ctx, void *out, const void *inp,
                                                const void *weight, size_t M, size_t N, size_t K,
                                                ts_fp8_scaling scaling, ts_dtype dt) {
  static const char op[] = "ts_k_linear_fp8_forward";
  TS_CHECK(check_fp8_gpu(ctx, op));
  fp8_ws w = carve(ctx, M, N, K, scaling);
  TS_CHECK(quantize_call(ctx, w.a8, w.sa, inp, M, K, 0, TS_FP8_E4M3, scaling, dt, w.maxima, op));
  TS_CHECK(quantize_call(ctx, w.b8, w.sb, weight, N, K, 0, TS_FP8_E4M3, scaling, dt, w.maxima, op));
  return product(ctx, op, M, N, K, &w, TS_FP8_E4M3, TS_FP8_E4M3, out, 0, scaling, 1);
}

extern "C" ts_status ts_cuda_linear_fp8_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                                 const void *dout, const void *inp,
                                                 const void *weight, size_t M, size_t N, size_t K,
                                                 ts_fp8_scaling scaling, ts_dtype dt) {
  static const char op[] = "ts_k_linear_fp8_backward";
  TS_CHECK(check_fp8_gpu(ctx, op));
  fp8_ws w = carve(ctx, M, N, K, scaling);
  if (dinp) { /* (M, K) = dout (M, N) @ (W^T (K, N))^T */
    TS_CHECK(quantize_call(ctx, w.a8, w.sa, dout, M, N, 0, TS_FP8_E5M2, scaling, dt, w.maxima, op));
    TS_CHECK(quantize_call(ctx, w.b8, w.sb, weight, N, K, 1, TS_FP8_E4M3, scaling, dt, w.maxima,
                           op));
    TS_CHECK(product(ctx, op, M, K, N, &w, TS_FP8_E5M2, TS_FP8_E4M3, dinp, 0, scaling, 0));
  }
  if (dweight) { /* (N, K) += dout^T (N, M) @ (inp^T (K, M))^T */
    TS_CHECK(quantize_call(ctx, w.a8, w.sa, dout, M, N, 1, TS_FP8_E5M2, scaling, dt, w.maxima, op));
    TS_CHECK(quantize_call(ctx, w.b8, w.sb, inp, M, K, 1, TS_FP8_E4M3, scaling, dt, w.maxima, op));
    TS_CHECK(product(ctx, op, N, K, M, &w, TS_FP8_E5M2, TS_FP8_E4M3, dweight, 1, scaling, 0));
  }
  return TS_OK;
}

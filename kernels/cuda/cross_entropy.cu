/*
 * cross_entropy.cu — CUDA bodies of the softmax cross-entropy
 * (ts_k_cross_entropy_forward and _backward, kernels/kernels.h; PyTorch's
 * F.cross_entropy with ignore_index -100).
 *
 * One block per row: the row's max, then sum of e^(x - max), by fixed block
 * trees (deterministic; not the CPU's sequential order, so the backends
 * agree within the parity test's bounds):
 *   forward:  loss = log(sum) + max - x[target];
 *   backward: dlogits[j] = dloss * (e^(x_j - max) / sum - [j == target]),
 *             each element read before the same thread writes it, so
 *             dlogits == logits is fine.
 *   fused:    both from one read of the row's statistics (one kernel serves
 *             all three, so the fused pass gives the two's bits).
 * Targets outside [0, V) and not -100 are an error (synchronous check)
 * unless the caller checked them (TS_K_INDICES_CHECKED); then such a row
 * is treated as ignored.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { CE_THREADS = 512 };

/* The row's max and sum of e^(x - max), on every thread of the block. */
template <ts_dtype DT>
__device__ void row_stats(const void *logits, size_t o, size_t V, float *m_out, float *s_out,
                          float *sh) {
  float m = -INFINITY;
  for (size_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, ts_ld<DT>(logits, o + j));
  m = ts_block_max(m, sh);
  float s = 0.0f;
  for (size_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(ts_ld<DT>(logits, o + j) - m);
  s = ts_block_sum(s, sh);
  *m_out = m;
  *s_out = s;
}

static __device__ bool has_target(int32_t y, size_t V) {
  return y != TS_IGNORE_INDEX && y >= 0 && (size_t)y < V;
}

/* One kernel for the three entries: loss_rows (forward) and/or dlogits
 * (backward), both for the fused pass. x[y] is read by every thread and
 * the statistics end in barriers before any element is overwritten. */
template <ts_dtype DT>
__global__ void ce_kernel(float *loss_rows, void *dlogits, const void *logits,
                          const int32_t *targets, size_t V, float dloss) {
  __shared__ float sh[32];
  size_t n = blockIdx.x, o = n * V;
  int32_t y = targets[n];
  if (!has_target(y, V)) {
    if (loss_rows && threadIdx.x == 0) loss_rows[n] = 0.0f;
    if (dlogits)
      for (size_t j = threadIdx.x; j < V; j += blockDim.x) ts_st<DT>(dlogits, o + j, 0.0f);
    return;
  }
  float m, s;
  row_stats<DT>(logits, o, V, &m, &s, sh);
  float xy = ts_ld<DT>(logits, o + (size_t)y);
  __syncthreads(); /* every thread has read x[y] before any overwrites it */
  if (loss_rows && threadIdx.x == 0) loss_rows[n] = (logf(s) + m) - xy;
  if (!dlogits) return;
  float inv = 1.0f / s;
  for (size_t j = threadIdx.x; j < V; j += blockDim.x) {
    float p = expf(ts_ld<DT>(logits, o + j) - m) * inv;
    ts_st<DT>(dlogits, o + j, dloss * (p - (j == (size_t)y ? 1.0f : 0.0f)));
  }
}

template <ts_dtype DT>
static void launch_ce(float *loss_rows, void *dlogits, const void *logits, const int32_t *targets,
                      size_t N, size_t V, float dloss, cudaStream_t s) {
  ce_kernel<DT><<<(unsigned)N, CE_THREADS, 0, s>>>(loss_rows, dlogits, logits, targets, V, dloss);
}

static ts_status check_rows(size_t N, const char *op) {
  if (N <= 0x7fffffffu) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): N = %zu rows: at most 2^31 - 1", op, N);
}

/* The checks and the launch of every entry. */
static ts_status cross_entropy(const ts_kctx *ctx, float *loss_rows, void *dlogits,
                               const void *logits, const int32_t *targets, size_t N, size_t V,
                               float dloss, ts_dtype dt, const char *op) {
  TS_CHECK(check_rows(N, op));
  TS_CHECK(ts_cuda_check_indices(ctx, targets, N, V, 1, op, "targets"));
  TS_CUDA_DT_CALL(dt, launch_ce, loss_rows, dlogits, logits, targets, N, V, dloss,
                  (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_cross_entropy_forward(const ts_kctx *ctx, float *loss_rows,
                                                   const void *logits, const int32_t *targets,
                                                   size_t N, size_t V, ts_dtype dt) {
  return cross_entropy(ctx, loss_rows, NULL, logits, targets, N, V, 0.0f, dt,
                       "ts_k_cross_entropy_forward");
}

extern "C" ts_status ts_cuda_cross_entropy_backward(const ts_kctx *ctx, void *dlogits,
                                                    const void *logits, const int32_t *targets,
                                                    size_t N, size_t V, float dloss,
                                                    ts_dtype dt) {
  return cross_entropy(ctx, NULL, dlogits, logits, targets, N, V, dloss, dt,
                       "ts_k_cross_entropy_backward");
}

extern "C" ts_status ts_cuda_cross_entropy_fused(const ts_kctx *ctx, float *loss_rows,
                                                 void *dlogits, const void *logits,
                                                 const int32_t *targets, size_t N, size_t V,
                                                 float dloss, ts_dtype dt) {
  return cross_entropy(ctx, loss_rows, dlogits, logits, targets, N, V, dloss, dt,
                       "ts_k_cross_entropy_fused");
}

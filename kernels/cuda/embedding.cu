/*
 * embedding.cu — CUDA bodies of the token embedding (ts_k_embedding_forward
 * and _backward, kernels/kernels.h; torch.nn.functional.embedding).
 *
 * Backward without order-dependent atomics: the positions are sorted by
 * token in the workspace (keys token << 32 | position, all distinct, so the
 * order is total and ties keep position order), by a bitonic sort over the
 * next power of two (Batcher 1968); then each run of equal tokens adds
 * its dout rows into dwte[token]:
 *   - a run shorter than EMB_LONG (64) positions, by one block, channel by
 *     channel in position order:
 *       fp32:      dwte[v, c] += dout[n, c] one addition at a time (the
 *                  CPU's order, so the result equals the CPU's bit for bit);
 *       bf16/fp16: sum in fp32 in position order, then one rounding of
 *                  dwte[v, c] + sum (the CPU's rule);
 *   - a longer run (a frequent token: BERT's token type 0 at every
 *     position, its [MASK]), by ceil(C / 32) blocks of 32 channels x 32
 *     slices: slice w sums positions [start + L*w/32, start + L*(w+1)/32)
 *     of the run in order in fp32, then the 32 slice sums are added in
 *     slice order and dwte[v, c] = dwte[v, c] + total, rounded once to
 *     dt. A fixed partition, so the bits repeat run after run, but not the
 *     CPU's order (a bound of (L + 1) fp32 roundings of the magnitudes
 *     covers both). One block summing a run of L positions serially took
 *     L dependent loads per channel: 16 ms of a 109 ms bert-base step on
 *     an H200 at 256 x 128 (all 32768 positions have token type 0).
 * Workspace: ts_cuda_embedding_workspace_bytes = next_pow2(N) uint64 keys.
 * Tokens outside [0, V) are an error (synchronous check) unless the caller
 * checked them (TS_K_INDICES_CHECKED); then their rows are skipped (forward
 * writes zeros).
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

static size_t next_pow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

extern "C" size_t ts_cuda_embedding_workspace_bytes(size_t N, ts_dtype dt) {
  (void)dt;
  return N == 0 ? 0 : ((next_pow2(N) * sizeof(uint64_t) + 63) & ~(size_t)63);
}

/* out[n, c] = wte[tokens[n], c], the stored bits copied (as the CPU's
 * memcpy: a signalling NaN stays one), 0 for a token out of range. */
template <ts_dtype DT>
__global__ void embedding_fwd_kernel(void *out, const int32_t *tokens, const void *wte, size_t N,
                                     size_t C, size_t V) {
  typedef typename ts_storage<DT>::type S;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * C;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / C, c = i % C;
    int32_t t = tokens[n];
    ((S *)out)[i] = (t >= 0 && (size_t)t < V) ? ((const S *)wte)[(size_t)t * C + c] : (S)0;
  }
}

template <ts_dtype DT>
static void launch_embedding_fwd(void *out, const int32_t *tokens, const void *wte, size_t N,
                                 size_t C, size_t V, cudaStream_t s) {
  embedding_fwd_kernel<DT><<<ts_cuda_grid(N * C), TS_CUDA_BLOCK, 0, s>>>(out, tokens, wte, N, C, V);
}

extern "C" ts_status ts_cuda_embedding_forward(const ts_kctx *ctx, void *out,
                                               const int32_t *tokens, const void *wte, size_t N,
                                               size_t C, size_t V, ts_dtype dt) {
  static const char op[] = "ts_k_embedding_forward";
  TS_CHECK(ts_cuda_check_indices(ctx, tokens, N, V, 0, op, "tokens"));
  if (C == 0) return TS_OK;
  TS_CUDA_DT_CALL(dt, launch_embedding_fwd, out, tokens, wte, N, C, V, (cudaStream_t)ctx->stream);
  return ts_cuda_launched(op);
}

/* keys[i] = token << 32 | i for i < N (a token out of range sorts last and
 * is skipped), UINT64_MAX for the padding up to P. */
__global__ void embedding_keys_kernel(uint64_t *keys, const int32_t *tokens, size_t N, size_t P,
                                      size_t V) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < P;
       i += (size_t)gridDim.x * blockDim.x) {
    if (i >= N) {
      keys[i] = ~(uint64_t)0;
      continue;
    }
    int32_t t = tokens[i];
    uint64_t tok = (t >= 0 && (size_t)t < V) ? (uint64_t)t : (uint64_t)V;
    keys[i] = tok << 32 | (uint64_t)i;
  }
}

/* One compare-exchange step (k, j) of the bitonic sort, ascending overall. */
__global__ void bitonic_step_kernel(uint64_t *keys, size_t P, size_t j, size_t k) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < P;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t l = i ^ j;
    if (l <= i) continue;
    uint64_t a = keys[i], b = keys[l];
    bool up = (i & k) == 0;
    if (up ? a > b : a < b) {
      keys[i] = b;
      keys[l] = a;
    }
  }
}

enum { EMB_LONG = 64, EMB_LANES = 32, EMB_SLICES = 32 };

/* One block per sorted entry; the block of an entry that starts a run of
 * equal (valid) tokens shorter than EMB_LONG adds the run's dout rows into
 * dwte[token], one channel per thread, the run's positions in order
 * (longer runs: embedding_bwd_long_kernel). */
template <ts_dtype DT>
__global__ void embedding_bwd_runs_kernel(void *dwte, const void *dout, const uint64_t *keys,
                                          size_t N, size_t C, size_t V) {
  size_t first = blockIdx.x;
  uint64_t tok = keys[first] >> 32;
  if (tok >= V) return;
  if (first > 0 && (keys[first - 1] >> 32) == tok) return; /* not the first of its run */
  size_t end = first + 1;
  while (end < N && end - first < EMB_LONG && (keys[end] >> 32) == tok) end++;
  if (end - first >= EMB_LONG) return; /* a long run */
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    size_t o = (size_t)tok * C + c;
    if (DT == TS_FP32) {
      float acc = ts_ld<DT>(dwte, o);
      for (size_t j = first; j < end; j++) acc += ts_ld<DT>(dout, (keys[j] & 0xffffffffu) * C + c);
      ts_st<DT>(dwte, o, acc);
    } else {
      float sum = 0.0f;
      for (size_t j = first; j < end; j++) sum += ts_ld<DT>(dout, (keys[j] & 0xffffffffu) * C + c);
      ts_st<DT>(dwte, o, ts_ld<DT>(dwte, o) + sum);
    }
  }
}

/* The first index i in [0, N) with keys[i] >= x (N if none): keys sorted
 * ascending. */
__device__ size_t lower_bound_key(const uint64_t *keys, size_t N, uint64_t x) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Runs of at least EMB_LONG positions. Block (x, y): probe entry e =
 * x * EMB_LONG; the run holding e (found by binary search) is this block's
 * if it is long and e is the first multiple of EMB_LONG in it (every run
 * of EMB_LONG or more entries holds one), for channels [32 y, 32 y + 32).
 * Thread (lane, w) sums slice w of the run for channel 32 y + lane; the
 * slice sums meet in shared memory and lane's thread w = 0 adds them in
 * slice order. */
template <ts_dtype DT>
__global__ void embedding_bwd_long_kernel(void *dwte, const void *dout, const uint64_t *keys,
                                          size_t N, size_t C, size_t V) {
  __shared__ float part[EMB_SLICES][EMB_LANES + 1];
  size_t e = (size_t)blockIdx.x * EMB_LONG;
  if (e >= N) return;
  uint64_t tok = keys[e] >> 32;
  if (tok >= V) return;
  size_t start = lower_bound_key(keys, N, tok << 32);
  size_t end = lower_bound_key(keys, N, (tok + 1) << 32);
  size_t len = end - start;
  if (len < EMB_LONG || (start + EMB_LONG - 1) / EMB_LONG * EMB_LONG != e) return;
  unsigned lane = threadIdx.x, w = threadIdx.y;
  size_t c = (size_t)blockIdx.y * EMB_LANES + lane;
  float sum = 0.0f;
  if (c < C) {
    size_t lo = start + len * w / EMB_SLICES, hi = start + len * (w + 1) / EMB_SLICES;
    for (size_t j = lo; j < hi; j++) sum += ts_ld<DT>(dout, (keys[j] & 0xffffffffu) * C + c);
  }
  part[w][lane] = sum;
  __syncthreads();
  if (w == 0 && c < C) {
    float total = 0.0f;
    for (int i = 0; i < EMB_SLICES; i++) total += part[i][lane];
    size_t o = (size_t)tok * C + c;
    ts_st<DT>(dwte, o, ts_ld<DT>(dwte, o) + total);
  }
}

template <ts_dtype DT>
static void launch_embedding_bwd_runs(void *dwte, const void *dout, const uint64_t *keys,
                                      size_t N, size_t C, size_t V, cudaStream_t s) {
  embedding_bwd_runs_kernel<DT><<<(unsigned)N, TS_CUDA_BLOCK, 0, s>>>(dwte, dout, keys, N, C, V);
  dim3 grid((unsigned)((N + EMB_LONG - 1) / EMB_LONG), (unsigned)((C + EMB_LANES - 1) / EMB_LANES));
  embedding_bwd_long_kernel<DT>
      <<<grid, dim3(EMB_LANES, EMB_SLICES), 0, s>>>(dwte, dout, keys, N, C, V);
}

extern "C" ts_status ts_cuda_embedding_backward(const ts_kctx *ctx, void *dwte, const void *dout,
                                                const int32_t *tokens, size_t N, size_t C,
                                                size_t V, ts_dtype dt) {
  static const char op[] = "ts_k_embedding_backward";
  TS_CHECK(ts_cuda_check_indices(ctx, tokens, N, V, 0, op, "tokens"));
  if (C == 0 || N == 0) return TS_OK;
  if (N > 0x7fffffffu || V > 0x7fffffffu)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): N = %zu, V = %zu: each at most 2^31 - 1",
                        op, N, V);
  if ((C + EMB_LANES - 1) / EMB_LANES > 65535) /* the long runs' grid.y */
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s (cuda): C = %zu: at most %d", op, C,
                        65535 * EMB_LANES);
  cudaStream_t s = (cudaStream_t)ctx->stream;
  uint64_t *keys = (uint64_t *)ctx->workspace;
  size_t P = next_pow2(N);
  unsigned grid = ts_cuda_grid(P);
  embedding_keys_kernel<<<grid, TS_CUDA_BLOCK, 0, s>>>(keys, tokens, N, P, V);
  for (size_t k = 2; k <= P; k <<= 1)
    for (size_t j = k >> 1; j > 0; j >>= 1)
      bitonic_step_kernel<<<grid, TS_CUDA_BLOCK, 0, s>>>(keys, P, j, k);
  TS_CUDA_DT_CALL(dt, launch_embedding_bwd_runs, dwte, dout, keys, N, C, V, s);
  return ts_cuda_launched(op);
}

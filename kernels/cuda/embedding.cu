/*
 * embedding.cu — CUDA bodies of the token embedding (ts_k_embedding_forward
 * and _backward, kernels/kernels.h; torch.nn.functional.embedding).
 *
 * Backward without order-dependent atomics: the positions are sorted by
 * token in the workspace — keys token << pb | position (pb = the bits of
 * N - 1), all distinct, so the order is total and ties keep position order
 * — by CUB's radix sort (cub::DispatchRadixSort, the engine of
 * cub::DeviceRadixSort::SortKeys: a histogram, an exclusive sum and one
 * onesweep pass per 8 key bits, over bits [0, pb + bits(V)) only); the
 * sorted keys are the same whatever sort makes them, so the sums below
 * are too. Then each run of equal tokens adds its dout rows into
 * dwte[token]:
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
 * Launches for N positions and key bits K = pb + bits(V) (N = 32768,
 * BERT's V = 30522: K = 30): the keys, CUB's histogram and exclusive sum,
 * ceil(K / 8) onesweep passes (each after a memset of its look-back
 * counters) and the two run kernels: 9 kernels and 6 memsets, where the
 * bitonic sort this replaces took log2(P) (log2(P) + 1) / 2 = 120
 * compare-exchange launches for P = next_pow2(N) = 32768 (123 in all).
 * Workspace: ts_cuda_embedding_workspace_bytes = two buffers of N uint64
 * keys (the sort's double buffer) and CUB's scratch, each rounded up to
 * 64 bytes; CUB's scratch is sized for 64 key bits on the most demanding
 * GPU architecture this file is compiled for (__CUDA_ARCH_LIST__), a pure
 * function of N, so planning needs no GPU and no V.
 * Tokens outside [0, V) are an error (synchronous check) unless the caller
 * checked them (TS_K_INDICES_CHECKED); then their rows are skipped (forward
 * writes zeros).
 */
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

/* CUB's radix sort of uint64 keys, no values, int offsets (N < 2^31). */
typedef cub::DispatchRadixSort<cub::SortOrder::Ascending, unsigned long long, cub::NullType, int>
    key_sort;

/* The bits of x: 0 for 0, else floor(log2 x) + 1. */
static unsigned bits_of(size_t x) {
  unsigned b = 0;
  while (x >> b) b++;
  return b;
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* CUB's scratch bytes for sorting N keys over bits [0, end_bit) with the
 * policy of PTX version ptx (no work, no device call: the size only). */
static size_t sort_scratch(int ptx, size_t N, int end_bit) {
  size_t bytes = 0;
  cub::DoubleBuffer<unsigned long long> keys(nullptr, nullptr);
  cub::DoubleBuffer<cub::NullType> none;
  key_sort sort(nullptr, bytes, keys, none, (int)N, 0, end_bit, true, nullptr, ptx);
  return key_sort::max_policy_t::Invoke(ptx, sort) == cudaSuccess ? bytes : SIZE_MAX;
}

/* The largest of sort_scratch over the architectures compiled in. */
template <int... Arch>
static size_t sort_scratch_most(size_t N) {
  size_t most = 0;
  for (size_t b : {sort_scratch(Arch, N, 64)...}) most = b > most ? b : most;
  return most;
}

extern "C" size_t ts_cuda_embedding_workspace_bytes(size_t N, ts_dtype dt) {
  (void)dt;
  if (N == 0) return 0;
  if (N > 0x7fffffffu) return SIZE_MAX; /* refused by the op */
  size_t scratch = sort_scratch_most<__CUDA_ARCH_LIST__>(N);
  if (scratch == SIZE_MAX) return SIZE_MAX;
  return 2 * round64(N * sizeof(uint64_t)) + round64(scratch);
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

/* keys[i] = token << pb | i for i < N (a token out of range is V: it sorts
 * last and is skipped). */
__global__ void embedding_keys_kernel(uint64_t *keys, const int32_t *tokens, size_t N, size_t V,
                                      unsigned pb) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < N;
       i += (size_t)gridDim.x * blockDim.x) {
    int32_t t = tokens[i];
    uint64_t tok = (t >= 0 && (size_t)t < V) ? (uint64_t)t : (uint64_t)V;
    keys[i] = tok << pb | (uint64_t)i;
  }
}

enum { EMB_LONG = 64, EMB_LANES = 32, EMB_SLICES = 32 };

/* One block per sorted entry; the block of an entry that starts a run of
 * equal (valid) tokens shorter than EMB_LONG adds the run's dout rows into
 * dwte[token], one channel per thread, the run's positions in order
 * (longer runs: embedding_bwd_long_kernel). Keys: token << pb | position. */
template <ts_dtype DT>
__global__ void embedding_bwd_runs_kernel(void *dwte, const void *dout, const uint64_t *keys,
                                          size_t N, size_t C, size_t V, unsigned pb) {
  const uint64_t pos = ((uint64_t)1 << pb) - 1;
  size_t first = blockIdx.x;
  uint64_t tok = keys[first] >> pb;
  if (tok >= V) return;
  if (first > 0 && (keys[first - 1] >> pb) == tok) return; /* not the first of its run */
  size_t end = first + 1;
  while (end < N && end - first < EMB_LONG && (keys[end] >> pb) == tok) end++;
  if (end - first >= EMB_LONG) return; /* a long run */
  for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
    size_t o = (size_t)tok * C + c;
    if (DT == TS_FP32) {
      float acc = ts_ld<DT>(dwte, o);
      for (size_t j = first; j < end; j++) acc += ts_ld<DT>(dout, (keys[j] & pos) * C + c);
      ts_st<DT>(dwte, o, acc);
    } else {
      float sum = 0.0f;
      for (size_t j = first; j < end; j++) sum += ts_ld<DT>(dout, (keys[j] & pos) * C + c);
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
                                          size_t N, size_t C, size_t V, unsigned pb) {
  __shared__ float part[EMB_SLICES][EMB_LANES + 1];
  const uint64_t pos = ((uint64_t)1 << pb) - 1;
  size_t e = (size_t)blockIdx.x * EMB_LONG;
  if (e >= N) return;
  uint64_t tok = keys[e] >> pb;
  if (tok >= V) return;
  size_t start = lower_bound_key(keys, N, tok << pb);
  size_t end = lower_bound_key(keys, N, (tok + 1) << pb);
  size_t len = end - start;
  if (len < EMB_LONG || (start + EMB_LONG - 1) / EMB_LONG * EMB_LONG != e) return;
  unsigned lane = threadIdx.x, w = threadIdx.y;
  size_t c = (size_t)blockIdx.y * EMB_LANES + lane;
  float sum = 0.0f;
  if (c < C) {
    size_t lo = start + len * w / EMB_SLICES, hi = start + len * (w + 1) / EMB_SLICES;
    for (size_t j = lo; j < hi; j++) sum += ts_ld<DT>(dout, (keys[j] & pos) * C + c);
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
                                      size_t N, size_t C, size_t V, unsigned pb, cudaStream_t s) {
  embedding_bwd_runs_kernel<DT><<<(unsigned)N, TS_CUDA_BLOCK, 0, s>>>(dwte, dout, keys, N, C, V,
                                                                      pb);
  dim3 grid((unsigned)((N + EMB_LONG - 1) / EMB_LONG), (unsigned)((C + EMB_LANES - 1) / EMB_LANES));
  embedding_bwd_long_kernel<DT>
      <<<grid, dim3(EMB_LANES, EMB_SLICES), 0, s>>>(dwte, dout, keys, N, C, V, pb);
}

/* Sorts the N keys at keys[0] (alt: a second buffer of N) over bits
 * [0, end_bit) with CUB, scratch bytes at scratch, on stream s; *sorted
 * gets the buffer that holds them sorted. Queues work only. */
static ts_status sort_keys(uint64_t *keys, uint64_t *alt, void *scratch, size_t scratch_bytes,
                           size_t N, int end_bit, cudaStream_t s, const uint64_t **sorted,
                           const char *op) {
  int ptx = 0;
  cudaError_t e = cub::PtxVersion(ptx);
  cub::DoubleBuffer<unsigned long long> db((unsigned long long *)keys, (unsigned long long *)alt);
  cub::DoubleBuffer<cub::NullType> none;
  size_t bytes = scratch_bytes;
  if (e == cudaSuccess) {
    key_sort sort(scratch, bytes, db, none, (int)N, 0, end_bit, true, s, ptx);
    e = key_sort::max_policy_t::Invoke(ptx, sort);
  }
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "%s (cuda): sorting %zu positions by token (CUB): %s", op, N,
                        cudaGetErrorString(e));
  *sorted = (const uint64_t *)db.Current();
  return TS_OK;
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
  /* the workspace: keys, the sort's second buffer, CUB's scratch (the rest) */
  size_t kb = round64(N * sizeof(uint64_t));
  uint64_t *keys = (uint64_t *)ctx->workspace, *alt = (uint64_t *)((char *)ctx->workspace + kb);
  unsigned pb = bits_of(N - 1); /* positions 0 .. N - 1; tokens 0 .. V (V: out of range) */
  embedding_keys_kernel<<<ts_cuda_grid(N), TS_CUDA_BLOCK, 0, s>>>(keys, tokens, N, V, pb);
  TS_CHECK(ts_cuda_launched(op));
  const uint64_t *sorted;
  TS_CHECK(sort_keys(keys, alt, (char *)ctx->workspace + 2 * kb, ctx->workspace_bytes - 2 * kb, N,
                     (int)(pb + bits_of(V)), s, &sorted, op));
  TS_CUDA_DT_CALL(dt, launch_embedding_bwd_runs, dwte, dout, sorted, N, C, V, pb, s);
  return ts_cuda_launched(op);
}

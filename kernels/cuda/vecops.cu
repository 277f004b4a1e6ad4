/*
 * vecops.cu — CUDA bodies of ts_k_add, ts_k_sum_ranks, ts_k_sumsq, ts_k_nonfinite and
 * ts_k_loss_sum (kernels/kernels.h).
 *
 * Reductions are deterministic: a fixed number of blocks that depends on n
 * only, each summing a fixed strided subset in fp64 and reducing it with a
 * fixed tree (ts_block_sum), then one block summing the partials in a fixed
 * tree. So a result repeats bit for bit; it is not the CPU's order, so CPU
 * and CUDA agree within the bound of a sum of n fp64 terms, not bitwise.
 * The partials live in the context's scratch (ts_cuda_state); the results
 * stay on the device (one read per step by the engine).
 */
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { RED_THREADS = 256 };

template <ts_dtype DT>
__global__ void add_kernel(void *out, const void *a, const void *b, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    ts_st<DT>(out, i, ts_ld<DT>(a, i) + ts_ld<DT>(b, i));
}

template <ts_dtype DT>
static void launch_add(void *out, const void *a, const void *b, size_t n, cudaStream_t s) {
  add_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(out, a, b, n);
}

extern "C" ts_status ts_cuda_add(const ts_kctx *ctx, void *out, const void *a, const void *b,
                                 size_t n, ts_dtype dt) {
  TS_CUDA_DT_CALL(dt, launch_add, out, a, b, n, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_add");
}

/* ts_k_sum_ranks's part addresses, passed by value (kernel parameters). */
struct sum_ranks_parts {
  const void *p[TS_K_SUM_RANKS_MAX];
};

/* One thread per element (grid-strided): the parts in index order, one
 * __fadd_rn each, the previous out last, one rounding to DT — the host's
 * order (comm/sum.c), so the bits are the host's. */
template <ts_dtype DT>
__global__ void sum_ranks_kernel(void *out, sum_ranks_parts parts, int n, size_t count,
                                 int accumulate) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = ts_ld<DT>(parts.p[0], i);
    for (int k = 1; k < n; k++) acc = ts_fadd(acc, ts_ld<DT>(parts.p[k], i));
    if (accumulate) acc = ts_fadd(acc, ts_ld<DT>(out, i));
    ts_st<DT>(out, i, acc);
  }
}

template <ts_dtype DT>
static void launch_sum_ranks(void *out, const sum_ranks_parts &parts, int n, size_t count,
                             int accumulate, cudaStream_t s) {
  sum_ranks_kernel<DT>
      <<<ts_cuda_grid(count), TS_CUDA_BLOCK, 0, s>>>(out, parts, n, count, accumulate);
}

extern "C" ts_status ts_cuda_sum_ranks(const ts_kctx *ctx, void *out, const void *const *parts,
                                       int n, size_t count, ts_dtype dt, int accumulate) {
  sum_ranks_parts p = {};
  for (int k = 0; k < n; k++) p.p[k] = parts[k];
  TS_CUDA_DT_CALL(dt, launch_sum_ranks, out, p, n, count, accumulate, (cudaStream_t)ctx->stream);
  return ts_cuda_launched("ts_k_sum_ranks");
}

/* Blocks of the first pass for n elements: one per 8 * RED_THREADS
 * elements, at most TS_CUDA_PARTIALS — a function of n only. */
static unsigned partial_blocks(size_t n) {
  size_t b = (n + 8 * RED_THREADS - 1) / (8 * RED_THREADS);
  return (unsigned)(b < 1 ? 1 : b > TS_CUDA_PARTIALS ? TS_CUDA_PARTIALS : b);
}

template <ts_dtype DT>
__global__ void sumsq_partials(double *partials, const void *x, size_t n) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    double y = ts_ld<DT>(x, i);
    acc += y * y; /* exact: a float squared fits in a double */
  }
  acc = ts_block_sum(acc, sh);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

/* out[0] = sum of partials[0..k), one block, fixed tree. */
__global__ void sum_partials(double *out, const double *partials, unsigned k) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < k; i += blockDim.x) acc += partials[i];
  acc = ts_block_sum(acc, sh);
  if (threadIdx.x == 0) out[0] = acc;
}

template <ts_dtype DT>
static void launch_sumsq(double *out, double *partials, const void *x, size_t n, cudaStream_t s) {
  unsigned k = partial_blocks(n);
  sumsq_partials<DT><<<k, RED_THREADS, 0, s>>>(partials, x, n);
  sum_partials<<<1, RED_THREADS, 0, s>>>(out, partials, k);
}

extern "C" ts_status ts_cuda_sumsq(const ts_kctx *ctx, double *out, const void *x, size_t n,
                                   ts_dtype dt) {
  TS_CHECK(ts_cuda_need_state(ctx, "ts_k_sumsq"));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  if (n == 0) {
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s);
    if (e != cudaSuccess)
      return ts_set_error(TS_ERR_CUDA, "ts_k_sumsq (cuda): cudaMemsetAsync: %s",
                          cudaGetErrorString(e));
    return TS_OK;
  }
  TS_CUDA_DT_CALL(dt, launch_sumsq, out, ts_cuda_state_of(ctx)->partials, x, n, s);
  return ts_cuda_launched("ts_k_sumsq");
}

/* flag[0] = 1 if some element's exponent bits are all ones. Every writer
 * stores the same 1, so the result does not depend on the order. */
template <ts_dtype DT>
__global__ void nonfinite_kernel(int32_t *flag, const void *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int bad;
    if (DT == TS_FP32)
      bad = (((const uint32_t *)x)[i] & 0x7f800000u) == 0x7f800000u;
    else {
      uint16_t e = DT == TS_BF16 ? 0x7f80u : 0x7c00u;
      bad = (((const uint16_t *)x)[i] & e) == e;
    }
    if (bad) *flag = 1;
  }
}

template <ts_dtype DT>
static void launch_nonfinite(int32_t *flag, const void *x, size_t n, cudaStream_t s) {
  nonfinite_kernel<DT><<<ts_cuda_grid(n), TS_CUDA_BLOCK, 0, s>>>(flag, x, n);
}

extern "C" ts_status ts_cuda_nonfinite(const ts_kctx *ctx, int32_t *flag, const void *x, size_t n,
                                       ts_dtype dt) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int32_t), s);
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "ts_k_nonfinite (cuda): cudaMemsetAsync: %s",
                        cudaGetErrorString(e));
  if (n > 0) TS_CUDA_DT_CALL(dt, launch_nonfinite, flag, x, n, s);
  return ts_cuda_launched("ts_k_nonfinite");
}

/* out = (sum of loss_rows over rows with a target, their count), one
 * block, fixed tree. */
__global__ void loss_sum_kernel(double *out, const float *loss_rows, const int32_t *targets,
                                size_t N) {
  __shared__ double sh[32];
  double acc = 0.0, cnt = 0.0;
  for (size_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (targets[n] == TS_IGNORE_INDEX) continue;
    acc += loss_rows[n];
    cnt += 1.0;
  }
  acc = ts_block_sum(acc, sh);
  cnt = ts_block_sum(cnt, sh);
  if (threadIdx.x == 0) {
    out[0] = acc;
    out[1] = cnt;
  }
}

extern "C" ts_status ts_cuda_loss_sum(const ts_kctx *ctx, double *out, const float *loss_rows,
                                      const int32_t *targets, size_t N) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  if (N == 0) {
    cudaError_t e = cudaMemsetAsync(out, 0, 2 * sizeof(double), s);
    if (e != cudaSuccess)
      return ts_set_error(TS_ERR_CUDA, "ts_k_loss_sum (cuda): cudaMemsetAsync: %s",
                          cudaGetErrorString(e));
    return TS_OK;
  }
  loss_sum_kernel<<<1, 1024, 0, s>>>(out, loss_rows, targets, N);
  return ts_cuda_launched("ts_k_loss_sum");
}

/* ---- data checks ------------------------------------------------------------ */

/* check[0] = min over the bad positions n (idx[n] outside [0, V), and not
 * -100 when allow_ignore), or stays INT32_MAX. atomicMin on integers: the
 * result does not depend on the order. */
__global__ void check_indices_kernel(int32_t *check, const int32_t *idx, size_t N, size_t V,
                                     int allow_ignore) {
  for (size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x; n < N;
       n += (size_t)gridDim.x * blockDim.x) {
    int32_t y = idx[n];
    if (allow_ignore && y == TS_IGNORE_INDEX) continue;
    if (y < 0 || (size_t)y >= V) atomicMin(check, (int32_t)(n < 0x7fffffff ? n : 0x7ffffffe));
  }
}

ts_status ts_cuda_first_bad(const ts_kctx *ctx, ts_cuda_check_launch launch, const void *arg,
                            int32_t *pos, const char *op, const char *what) {
  *pos = TS_CUDA_NONE_BAD;
  TS_CHECK(ts_cuda_need_state(ctx, op));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  int32_t *check = ts_cuda_state_of(ctx)->check;
  const int32_t none = TS_CUDA_NONE_BAD;
  cudaError_t e = cudaMemcpyAsync(check, &none, sizeof none, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) {
    launch(check, arg, s);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(pos, check, sizeof *pos, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "%s (cuda): checking %s: %s", op, what,
                        cudaGetErrorString(e));
  return TS_OK;
}

/* check_indices_kernel's arguments, through ts_cuda_first_bad. */
struct index_check {
  const int32_t *idx;
  size_t N, V;
  int allow_ignore;
};

static void launch_index_check(int32_t *check, const void *arg, cudaStream_t s) {
  const index_check *a = (const index_check *)arg;
  check_indices_kernel<<<ts_cuda_grid(a->N), TS_CUDA_BLOCK, 0, s>>>(check, a->idx, a->N, a->V,
                                                                    a->allow_ignore);
}

extern "C" ts_status ts_cuda_check_indices(const ts_kctx *ctx, const int32_t *idx, size_t N,
                                           size_t V, int allow_ignore, const char *op,
                                           const char *what) {
  if (ctx->flags & TS_K_INDICES_CHECKED || N == 0) return TS_OK;
  index_check a = {idx, N, V, allow_ignore};
  int32_t pos, val = 0;
  TS_CHECK(ts_cuda_first_bad(ctx, launch_index_check, &a, &pos, op, what));
  if (pos == TS_CUDA_NONE_BAD) return TS_OK;
  cudaStream_t s = (cudaStream_t)ctx->stream;
  cudaError_t e = cudaMemcpyAsync(&val, idx + pos, sizeof val, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess)
    return ts_set_error(TS_ERR_CUDA, "%s (cuda): checking %s: %s", op, what,
                        cudaGetErrorString(e));
  if (allow_ignore)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: %s[%d] = %d: expected a class in [0, %zu) or %d (ignore)", op, what,
                        (int)pos, (int)val, V, TS_IGNORE_INDEX);
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: %s[%d] = %d is outside the vocabulary [0, %zu)",
                      op, what, (int)pos, (int)val, V);
}

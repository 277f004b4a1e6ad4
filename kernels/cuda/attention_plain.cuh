/*
 * attention_plain.cuh — private to kernels/cuda/attention.cu (causal
 * attention) and attention_bidir.cu (bidirectional): what both share. The
 * attention state's layout; the plain kernels (forward and backward, with
 * the key mask att_mask: causal, or key flags or ids), which run fp32,
 * where cuDNN refuses a shape, under TS_K_PLAIN_ATTENTION, and the
 * bidirectional op's rows that cuDNN's key lengths cannot mask; the
 * workspace pieces; and the table of shapes cuDNN refused.
 *
 * The plain kernels compute every output element by one thread summing over
 * keys (or queries) in index order, and each row's statistics by a fixed
 * block tree, so results repeat bit for bit. Backward runs one batch row
 * and a chunk of kv groups at a time (as many as the workspace holds; all
 * of them for fp32) with their dS = P * (dP - D) / sqrt(HS), fp32, in the
 * workspace (D: rowsum(P * dP)), and for the log-sum-exp state their P
 * too. The chunking changes no sum's order.
 *
 * With the causal mask the plain kernels perform exactly the operations
 * they did before the bidirectional op joined them.
 *
 * Everything here is a template or has internal linkage: each .cu
 * compiles alone (no relocatable device code), so each has its own copy.
 */
#ifndef TS_KERNELS_CUDA_ATTENTION_PLAIN_CUH
#define TS_KERNELS_CUDA_ATTENTION_PLAIN_CUH

#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { ATT_THREADS = 128, ATT_MAX_T = 8192 /* the plain forward's row in shared memory */ };

/* Does dt keep the log-sum-exp (else the probabilities)? */
static inline bool lse_state(ts_dtype dt) { return dt != TS_FP32; }

/* The key flags of an lse state (B, NH, T) of B batch rows. */
static inline uint8_t *state_keep(void *state, size_t B, size_t T, size_t NH) {
  return (uint8_t *)((float *)state + B * NH * T);
}

/* Which keys query t of batch row b sees: keys [0, key_end) (causal: 0..t;
 * else all T), less those masked: ids[b, j] == pad when ids is given,
 * keep[b, j] == 0 when keep is given. */
struct att_mask {
  int causal;           /* 1: causal (ids and keep NULL) */
  const int32_t *ids;   /* (B, T) ids, or NULL */
  int32_t pad;          /* the masked id */
  const uint8_t *keep;  /* (B, T) key flags, or NULL */
};

static const att_mask CAUSAL = {1, nullptr, 0, nullptr};

static __device__ __forceinline__ size_t key_end(const att_mask &mk, size_t t, size_t T) {
  return mk.causal ? t + 1 : T;
}

static __device__ __forceinline__ bool sees(const att_mask &mk, size_t b, size_t T, size_t j) {
  if (mk.ids) return mk.ids[b * T + j] != mk.pad;
  if (mk.keep) return mk.keep[b * T + j] != 0;
  return true;
}

/* The plain backward's scratch per kv group (its rep = NH / NKV heads):
 * dS, and for the log-sum-exp state P too, (rep, T, T) fp32 each. It works
 * through a batch row a chunk of kv groups at a time, as many as the
 * workspace holds. */
static inline size_t plain_group_bytes(size_t T, size_t NH, size_t NKV, ts_dtype dt) {
  return (dt == TS_FP32 ? 1 : 2) * (NH / NKV) * T * T * sizeof(float);
}

/* Bytes of the bidirectional op's cuDNN bias, (B, 1, T, T) 2-byte, at
 * the start of the workspace, rounded up to 256 (cuDNN's workspace
 * alignment); SIZE_MAX on overflow. */
static inline size_t bias_bytes(size_t B, size_t T) {
  size_t n;
  if (__builtin_mul_overflow(B, T, &n) || __builtin_mul_overflow(n, T, &n) ||
      __builtin_mul_overflow(n, (size_t)2, &n) || n > SIZE_MAX - 255)
    return SIZE_MAX;
  return (n + 255) / 256 * 256;
}

/* Bytes of the head of the workspace that the bidirectional op's lengths
 * path keeps (key_lengths_kernel's output): seq (2, B) int32, cuDNN's
 * query and key lengths, then redo (B) uint8, rounded up to 256 (cuDNN's
 * workspace alignment). */
static inline size_t lengths_bytes(size_t B) { return (B * 9 + 255) / 256 * 256; }

/* ---- forward -------------------------------------------------------------- */

/* The softmax numerators of the block's row of n scores in srow, this
 * thread's running maximum m: m becomes the row's maximum (every thread
 * gets it), srow[j] = e^(s_j - m), and the return value is their sum z,
 * a block tree (sh: 32 floats), whose barriers make every srow[j] visible
 * to all. */
static __device__ __forceinline__ float exp_row(float *srow, size_t n, float &m, float *sh) {
  const float mx = m = ts_block_max(m, sh);
  float z = 0.0f;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    float e = expf(srow[j] - mx);
    srow[j] = e;
    z += e;
  }
  return ts_block_sum(z, sh);
}

/* The block's row (b, h, t), row = (b * NH + h) * T + t: its scores s_j =
 * q_t . k_j * scale (j < n = key_end; -inf at masked keys) in shared
 * memory (srow: T floats; sh: 32): its max m
 * and sum z of e^(s_j - m); then
 *   probs state: P[b, h, t, j] = e^(s_j - m) / z for j < n, 0 after;
 *   lse state:   lse[b, h, t] = m + log z, and out[b, t, h, d] =
 *                sum_{j < n} e^(s_j - m) / z * v[b, j, g, d].
 * (The probs state's out comes from att_out_kernel.) */
template <ts_dtype DT>
__device__ void att_row(void *out, float *probs, float *lse, const void *q, const void *k,
                        const void *v, size_t row, size_t T, size_t NH, size_t NKV, size_t HS,
                        float scale, const att_mask &mk, float *srow, float *sh) {
  size_t t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
  size_t g = h / (NH / NKV);
  size_t qo = ((b * T + t) * NH + h) * HS, n = key_end(mk, t, T);
  float m = -INFINITY;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    if (!sees(mk, b, T, j)) { /* e^(-inf - m) = 0 below */
      srow[j] = -INFINITY;
      continue;
    }
    size_t ko = ((b * T + j) * NKV + g) * HS;
    float s = 0.0f;
    for (size_t d = 0; d < HS; d++) s += ts_ld<DT>(q, qo + d) * ts_ld<DT>(k, ko + d);
    s *= scale;
    srow[j] = s;
    m = fmaxf(m, s);
  }
  float z = exp_row(srow, n, m, sh);
  float inv = 1.0f / z;
  if (probs) {
    float *p = probs + row * T;
    for (size_t j = threadIdx.x; j < T; j += blockDim.x) p[j] = j < n ? srow[j] * inv : 0.0f;
    return;
  }
  if (threadIdx.x == 0) lse[row] = m + logf(z);
  for (size_t d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (size_t j = 0; j < n; j++) acc += srow[j] * inv * ts_ld<DT>(v, ((b * T + j) * NKV + g) * HS + d);
    ts_st<DT>(out, qo + d, acc);
  }
}

/* One block per row (b, h, t) = blockIdx.x: att_row. */
template <ts_dtype DT>
__global__ void att_row_kernel(void *out, float *probs, float *lse, const void *q, const void *k,
                               const void *v, size_t T, size_t NH, size_t NKV, size_t HS,
                               float scale, att_mask mk) {
  extern __shared__ float srow[];
  __shared__ float sh[32];
  att_row<DT>(out, probs, lse, q, k, v, blockIdx.x, T, NH, NKV, HS, scale, mk, srow, sh);
}

/* Probs state: out[b, t, h, d] = sum_{j < key_end} probs[b, h, t, j] v[b, j, g, d]. */
static __global__ void att_out_kernel(float *out, const float *probs, const float *v, size_t B,
                                      size_t T, size_t NH, size_t NKV, size_t HS, att_mask mk) {
  size_t total = B * T * NH * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, h = (i / HS) % NH, t = (i / (HS * NH)) % T, b = i / (HS * NH * T);
    size_t g = h / (NH / NKV);
    const float *p = probs + ((b * NH + h) * T + t) * T;
    float acc = 0.0f;
    for (size_t j = 0; j < key_end(mk, t, T); j++) acc += p[j] * v[((b * T + j) * NKV + g) * HS + d];
    out[i] = acc;
  }
}

/* ---- backward ------------------------------------------------------------- */

/* The kv groups [g0, g0 + gc) of batch row b and their heads h =
 * g0 * rep + hl, hl < gc * rep; dS and P are (gc * rep, T, T) indexed by hl. */

/* The block's row (b, h, t) of dS: r[j] = dS[t, j] for j < key_end, from
 * the row's probabilities: the probs state's row ps, or, for the lse
 * state (ps NULL), recomputed as e^(q_t . k_j * scale - l) (0 at masked
 * keys, l the row's log-sum-exp) and also written to pr[j] for dv. D is
 * rowsum(P * dP), a block tree (sh: 32 floats). */
template <ts_dtype DT>
__device__ void att_ds_row(float *r, float *pr, const float *ps, float l, const void *q,
                           const void *k, const void *dout, const void *v, size_t b, size_t h,
                           size_t t, size_t T, size_t NH, size_t NKV, size_t HS, float scale,
                           const att_mask &mk, float *sh) {
  size_t g = h / (NH / NKV);
  size_t qo = ((b * T + t) * NH + h) * HS, n = key_end(mk, t, T);
  float dot = 0.0f;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    size_t ko = ((b * T + j) * NKV + g) * HS;
    float dp = 0.0f, p;
    for (size_t d = 0; d < HS; d++) dp += ts_ld<DT>(dout, qo + d) * ts_ld<DT>(v, ko + d);
    if (ps) {
      p = ps[j];
    } else if (!sees(mk, b, T, j)) {
      p = 0.0f;
      pr[j] = p;
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
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    float p = ps ? ps[j] : pr[j]; /* this thread's own earlier write */
    r[j] = scale * (p * (r[j] - dot));
  }
}

/* One block per (hl, t): att_ds_row into ds (and p_out) row hl * T + t. */
template <ts_dtype DT>
__global__ void att_ds_kernel(float *ds, float *p_out, const float *p_state, const float *lse,
                              const void *q, const void *k, const void *dout, const void *v,
                              size_t b, size_t g0, size_t T, size_t NH, size_t NKV, size_t HS,
                              float scale, att_mask mk) {
  __shared__ float sh[32];
  size_t rep = NH / NKV, row = blockIdx.x, t = row % T, hl = row / T, h = g0 * rep + hl;
  att_ds_row<DT>(ds + row * T, p_out ? p_out + row * T : NULL,
                 p_state ? p_state + ((b * NH + h) * T + t) * T : NULL,
                 lse ? lse[(b * NH + h) * T + t] : 0.0f, q, k, dout, v, b, h, t, T, NH, NKV, HS,
                 scale, mk, sh);
}

/* sum_{j < n} r[j] k[b, j, g, d], in order: dq's element (r: a dS row). */
template <ts_dtype DT>
__device__ __forceinline__ float att_dq_sum(const float *r, const void *k, size_t b, size_t g,
                                            size_t d, size_t n, size_t T, size_t NKV, size_t HS) {
  float acc = 0.0f;
  for (size_t j = 0; j < n; j++) acc += r[j] * ts_ld<DT>(k, ((b * T + j) * NKV + g) * HS + d);
  return acc;
}

/* dq[b, t, h, d] = sum_{j < key_end} dS[hl, t, j] k[b, j, g, d] for the chunk's heads. */
template <ts_dtype DT>
__global__ void att_dq_kernel(void *dq, const float *ds, const void *k, size_t b, size_t g0,
                              size_t gc, size_t T, size_t NH, size_t NKV, size_t HS,
                              att_mask mk) {
  size_t rep = NH / NKV, heads = gc * rep, total = T * heads * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, hl = (i / HS) % heads, t = i / (HS * heads);
    size_t h = g0 * rep + hl, g = h / rep;
    ts_st<DT>(dq, (b * T + t) * NH * HS + h * HS + d,
              att_dq_sum<DT>(ds + (hl * T + t) * T, k, b, g, d, key_end(mk, t, T), T, NKV, HS));
  }
}

/* Key s, channel d, over heads hl = hl0 .. hl1 - 1 in order (query head
 * h0 + hl) and queries t = t0 .. T - 1 in order, dS and P (T, T) per head:
 *   *ak = sum dS[hl, t, s] q[b, t, h0 + hl, d]
 *   *av = sum P[hl, t, s] dout[b, t, h0 + hl, d]. */
template <ts_dtype DT>
__device__ __forceinline__ void att_dkv_sums(float *ak, float *av, const float *ds,
                                             const float *P, const void *q, const void *dout,
                                             size_t b, size_t s, size_t d, size_t hl0,
                                             size_t hl1, size_t h0, size_t t0, size_t T,
                                             size_t NH, size_t HS) {
  float k_ = 0.0f, v_ = 0.0f;
  for (size_t hl = hl0; hl < hl1; hl++)
    for (size_t t = t0; t < T; t++) {
      size_t qi = ((b * T + t) * NH + h0 + hl) * HS + d;
      k_ += ds[(hl * T + t) * T + s] * ts_ld<DT>(q, qi);
      v_ += P[(hl * T + t) * T + s] * ts_ld<DT>(dout, qi);
    }
  *ak = k_;
  *av = v_;
}

/* For key s of kv group g of the chunk, over its heads in order and the
 * queries that see it in order (causal: t >= s; else all; P: the chunk's
 * probabilities, as dS, 0 where a query does not see the key):
 *   dk[b, s, g, d] = sum dS[hl, t, s] q[b, t, h, d]
 *   dv[b, s, g, d] = sum P[hl, t, s] dout[b, t, h, d]. */
template <ts_dtype DT>
__global__ void att_dkv_kernel(void *dk, void *dv, const float *ds, const float *P, const void *q,
                               const void *dout, size_t b, size_t g0, size_t gc, size_t T,
                               size_t NH, size_t NKV, size_t HS, att_mask mk) {
  size_t rep = NH / NKV, total = T * gc * HS;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t d = i % HS, gl = (i / HS) % gc, s = i / (HS * gc), g = g0 + gl;
    float ak, av;
    att_dkv_sums<DT>(&ak, &av, ds, P, q, dout, b, s, d, gl * rep, (gl + 1) * rep, g0 * rep,
                     mk.causal ? s : 0, T, NH, HS);
    size_t o = ((b * T + s) * NKV + g) * HS + d;
    ts_st<DT>(dk, o, ak);
    ts_st<DT>(dv, o, av);
  }
}

/* ---- the plain path ------------------------------------------------------- */

static inline ts_status check_plain(size_t B, size_t T, size_t NH, const char *op) {
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
                          const void *v, size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                          const att_mask &mk) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  bool lse = lse_state(DT);
  att_row_kernel<DT><<<(unsigned)(B * NH * T), ATT_THREADS, T * sizeof(float), s>>>(
      out, lse ? nullptr : (float *)state, lse ? (float *)state : nullptr, q, k, v, T, NH, NKV,
      HS, scale, mk);
  if (!lse)
    att_out_kernel<<<ts_cuda_grid(B * T * NH * HS), TS_CUDA_BLOCK, 0, s>>>(
        (float *)out, (const float *)state, (const float *)v, B, T, NH, NKV, HS, mk);
}

template <ts_dtype DT>
static ts_status plain_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *state, size_t B, size_t T, size_t NH, size_t NKV,
                                size_t HS, const att_mask &mk, const char *op) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  float scale = 1.0f / sqrtf((float)HS);
  bool lse = lse_state(DT);
  size_t rep = NH / NKV, per_group = plain_group_bytes(T, NH, NKV, DT);
  size_t chunk = ctx->workspace_bytes / per_group; /* kv groups per pass */
  if (chunk == 0)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                        "%s (cuda): the plain backward needs %zu bytes of workspace per kv "
                        "group, has %zu",
                        op, per_group, ctx->workspace_bytes);
  if (chunk > NKV) chunk = NKV;
  float *ds = (float *)ctx->workspace;
  float *p_chunk = lse ? ds + chunk * rep * T * T : nullptr; /* the lse state's P */
  for (size_t b = 0; b < B; b++)
    for (size_t g0 = 0; g0 < NKV; g0 += chunk) {
      size_t gc = NKV - g0 < chunk ? NKV - g0 : chunk;
      /* the probs state's P of these heads: the state itself */
      const float *P = lse ? p_chunk : (const float *)state + (b * NH + g0 * rep) * T * T;
      att_ds_kernel<DT><<<(unsigned)(gc * rep * T), ATT_THREADS, 0, s>>>(
          ds, p_chunk, lse ? nullptr : (const float *)state,
          lse ? (const float *)state : nullptr, q, k, dout, v, b, g0, T, NH, NKV, HS, scale, mk);
      att_dq_kernel<DT><<<ts_cuda_grid(T * gc * rep * HS), TS_CUDA_BLOCK, 0, s>>>(
          dq, ds, k, b, g0, gc, T, NH, NKV, HS, mk);
      att_dkv_kernel<DT><<<ts_cuda_grid(T * gc * HS), TS_CUDA_BLOCK, 0, s>>>(
          dk, dv, ds, P, q, dout, b, g0, gc, T, NH, NKV, HS, mk);
    }
  return TS_OK;
}

/* plain_backward for the runtime dtype dt. */
static inline ts_status plain_backward_dt(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                   const void *dout, const void *q, const void *k, const void *v,
                                   const void *state, size_t B, size_t T, size_t NH, size_t NKV,
                                   size_t HS, ts_dtype dt, const att_mask &mk, const char *op) {
  if (dt == TS_FP32)
    return plain_backward<TS_FP32>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
  if (dt == TS_BF16)
    return plain_backward<TS_BF16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
  return plain_backward<TS_FP16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
}

/* Shapes cuDNN said it cannot run, per pass, so that later calls go to the
 * plain kernels at once instead of asking cuDNN again (a graph build and a
 * heuristics query each time). A full table only costs the asking. Each
 * file that includes this header has its own table (static): the causal
 * op's in attention.cu, the bidirectional op's in attention_bidir.cu,
 * whose keys differ in `bidirectional` anyway. */
typedef struct {
  size_t B, T, NH, NKV, HS;
  int dt, backward, device;
  int bidirectional; /* 0: causal; the bidirectional op's 1: key lengths, 2: bias */
} shape_key;
enum { REFUSED_MAX = 64 };
static shape_key refused[REFUSED_MAX];
static int n_refused;
static pthread_mutex_t refused_lock = PTHREAD_MUTEX_INITIALIZER;

static inline bool was_refused(const shape_key *k) {
  bool found = false;
  pthread_mutex_lock(&refused_lock);
  for (int i = 0; i < n_refused && !found; i++) found = memcmp(&refused[i], k, sizeof *k) == 0;
  pthread_mutex_unlock(&refused_lock);
  return found;
}

static inline void remember_refusal(const shape_key *k) {
  pthread_mutex_lock(&refused_lock);
  if (n_refused < REFUSED_MAX) refused[n_refused++] = *k;
  pthread_mutex_unlock(&refused_lock);
}

static inline shape_key key_of(const ts_kctx *ctx, size_t B, size_t T, size_t NH, size_t NKV,
                               size_t HS, ts_dtype dt, int backward, int bidirectional) {
  shape_key k;
  memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
  k.B = B, k.T = T, k.NH = NH, k.NKV = NKV, k.HS = HS;
  k.dt = (int)dt, k.backward = backward, k.device = ctx->device_index;
  k.bidirectional = bidirectional;
  return k;
}

/* Does a call on ctx in dt go to cuDNN, shape permitting? */
static inline bool cudnn_first(const ts_kctx *ctx, ts_dtype dt) {
  return lse_state(dt) && !(ctx->flags & TS_K_PLAIN_ATTENTION);
}

/* Does this call go to cuDNN first? */
static inline bool try_cudnn(const ts_kctx *ctx, ts_dtype dt, const shape_key *k) {
  return cudnn_first(ctx, dt) && !was_refused(k);
}

#endif /* TS_KERNELS_CUDA_ATTENTION_PLAIN_CUH */

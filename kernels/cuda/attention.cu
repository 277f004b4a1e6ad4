/*
 * attention.cu — CUDA bodies of causal grouped-query attention
 * (ts_k_attention_forward and _backward, kernels/kernels.h; Vaswani et al.
 * 2017 eq. 1, GQA: Ainslie et al. 2023) and of bidirectional multi-head
 * attention with a key padding mask (ts_k_attention_bidir_*; Hugging Face
 * BertSelfAttention).
 *
 * bf16/fp16: cuDNN's fused flash attention (attention_cudnn.h; Dao et al.
 * 2022, cuDNN's deterministic backward). The saved state is each softmax
 * row's log-sum-exp (B, NH, T) fp32. When cuDNN answers that it cannot run
 * a shape, or the context asks for it (TS_K_PLAIN_ATTENTION), the plain
 * kernels below run instead with the same state: forward writes out and
 * the log-sum-exp, backward recomputes each probability from q, k and it.
 *
 * fp32: the plain kernels with the probabilities (B, NH, T, T) as the
 * state (parity and debugging, not speed; the CPU's fused kernel keeps the
 * log-sum-exp in every dtype).
 *
 * Bidirectional attention: query t sees every key whose id is not the pad
 * id. Its bf16/fp16 state is the log-sum-exp followed by (B, T) uint8 key
 * flags (1: a key to attend to). In bf16/fp16 it runs on cuDNN's fused
 * kernels too, with an additive (B, 1, T, T) bias in place of the causal
 * mask: 0 at a key to attend to, MASKED_BIAS (-65504 in fp16, -65536 in
 * bf16) at a padding key, whose score is then so far below the row's
 * largest that e^(s - m) underflows to exactly 0 in fp32, as a -inf score
 * gives (finite, so that a tile of masked keys never makes the online
 * softmax compute -inf - -inf; HF's BERT adds the dtype's minimum the same
 * way). The bias is built from the key flags at the start of
 * ctx->workspace, before each pass; cuDNN gets the rest. The plain
 * kernels, the fallback and the fp32 path, take the mask (att_mask)
 * instead: a masked key's score is -inf; backward recomputes P with the
 * key flags, and the fp32 state's P is 0 at masked keys already. With the
 * causal mask the plain kernels perform exactly the operations they did
 * before the bidirectional one joined them.
 *
 * The plain kernels compute every output element by one thread summing over
 * keys (or queries) in index order, and each row's statistics by a fixed
 * block tree, so results repeat bit for bit. Backward runs one batch row
 * and a chunk of kv groups at a time (as many as the workspace holds; all
 * of them for fp32) with their dS = P * (dP - D) / sqrt(HS), fp32, in the
 * workspace (D: rowsum(P * dP)), and for the log-sum-exp state their P
 * too. The chunking changes no sum's order.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <string.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

enum { ATT_THREADS = 128, ATT_MAX_T = 8192 /* the plain forward's row in shared memory */ };

/* Does dt keep the log-sum-exp (else the probabilities)? */
static bool lse_state(ts_dtype dt) { return dt != TS_FP32; }

/* lse state: the log-sum-exp (B, NH, T) fp32, then the bidirectional op's
 * key flags (B, T) uint8. */
extern "C" size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                size_t HS, ts_dtype dt) {
  (void)NKV;
  (void)HS;
  if (lse_state(dt)) return B * NH * T * sizeof(float) + B * T;
  return B * NH * T * T * sizeof(float);
}

/* The key flags of an lse state (B, NH, T) of B batch rows. */
static uint8_t *state_keep(void *state, size_t B, size_t T, size_t NH) {
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

__device__ __forceinline__ size_t key_end(const att_mask &mk, size_t t, size_t T) {
  return mk.causal ? t + 1 : T;
}

__device__ __forceinline__ bool sees(const att_mask &mk, size_t b, size_t T, size_t j) {
  if (mk.ids) return mk.ids[b * T + j] != mk.pad;
  if (mk.keep) return mk.keep[b * T + j] != 0;
  return true;
}

/* The plain backward's scratch per kv group (its rep = NH / NKV heads):
 * dS, and for the log-sum-exp state P too, (rep, T, T) fp32 each. It works
 * through a batch row a chunk of kv groups at a time, as many as the
 * workspace holds. */
static size_t plain_group_bytes(size_t T, size_t NH, size_t NKV, ts_dtype dt) {
  return (dt == TS_FP32 ? 1 : 2) * (NH / NKV) * T * T * sizeof(float);
}

/* Bytes of the bidirectional op's cuDNN bias, (B, 1, T, T) 2-byte, at
 * the start of the workspace, rounded up to 256 (cuDNN's workspace
 * alignment); SIZE_MAX on overflow. */
static size_t bias_bytes(size_t B, size_t T) {
  size_t n;
  if (__builtin_mul_overflow(B, T, &n) || __builtin_mul_overflow(n, T, &n) ||
      __builtin_mul_overflow(n, (size_t)2, &n) || n > SIZE_MAX - 255)
    return SIZE_MAX;
  return (n + 255) / 256 * 256;
}

/* fp32: one batch row's dS (every kv group at once). bf16/fp16: cuDNN's
 * bound plus the bidirectional op's bias (one bound serves both ops: the
 * causal one leaves those B*T*T*2 bytes unused, 1/NH of cuDNN's own dP
 * term), or one kv group's plain scratch if that is larger (so the
 * fallback always runs; T beyond the plain kernels' limit: cuDNN's). */
extern "C" size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV,
                                                    size_t HS, ts_dtype dt) {
  if (!lse_state(dt)) return NKV * plain_group_bytes(T, NH, NKV, dt);
  size_t cudnn = ts_cudnn_attention_workspace_bytes(B, T, NH, NKV, HS, dt), bias = bias_bytes(B, T);
  cudnn = cudnn > SIZE_MAX - bias ? SIZE_MAX : cudnn + bias;
  size_t group = T > ATT_MAX_T ? 0 : plain_group_bytes(T, NH, NKV, dt);
  return cudnn > group ? cudnn : group;
}

/* ---- forward -------------------------------------------------------------- */

/* One block per (b, h, t), the row's scores s_j = q_t . k_j * scale (j <
 * n = key_end; -inf at masked keys) in shared memory (T floats): its max m
 * and sum z of e^(s_j - m); then
 *   probs state: P[b, h, t, j] = e^(s_j - m) / z for j < n, 0 after;
 *   lse state:   lse[b, h, t] = m + log z, and out[b, t, h, d] =
 *                sum_{j < n} e^(s_j - m) / z * v[b, j, g, d].
 * (The probs state's out comes from att_out_kernel.) */
template <ts_dtype DT>
__global__ void att_row_kernel(void *out, float *probs, float *lse, const void *q, const void *k,
                               const void *v, size_t T, size_t NH, size_t NKV, size_t HS,
                               float scale, att_mask mk) {
  extern __shared__ float srow[];
  __shared__ float sh[32];
  size_t row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
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
  m = ts_block_max(m, sh);
  float z = 0.0f;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    float e = expf(srow[j] - m);
    srow[j] = e;
    z += e;
  }
  z = ts_block_sum(z, sh); /* its barriers make every srow[j] visible to all */
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

/* Probs state: out[b, t, h, d] = sum_{j < key_end} probs[b, h, t, j] v[b, j, g, d]. */
__global__ void att_out_kernel(float *out, const float *probs, const float *v, size_t B, size_t T,
                               size_t NH, size_t NKV, size_t HS, att_mask mk) {
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

/* One block per (hl, t): dS[hl, t, j] for j < key_end, from the row's
 * probabilities: the probs state's (p_state, row (b, h, t)), or, for the
 * lse state, recomputed as e^(q_t . k_j * scale - lse) (0 at masked keys)
 * and also written to p_out[hl, t, j] for dv. D is rowsum(P * dP). */
template <ts_dtype DT>
__global__ void att_ds_kernel(float *ds, float *p_out, const float *p_state, const float *lse,
                              const void *q, const void *k, const void *dout, const void *v,
                              size_t b, size_t g0, size_t T, size_t NH, size_t NKV, size_t HS,
                              float scale, att_mask mk) {
  __shared__ float sh[32];
  size_t rep = NH / NKV, row = blockIdx.x, t = row % T, hl = row / T, h = g0 * rep + hl;
  size_t g = h / rep;
  size_t qo = ((b * T + t) * NH + h) * HS, n = key_end(mk, t, T);
  float *r = ds + row * T;
  float *pr = p_out ? p_out + row * T : NULL;
  const float *ps = p_state ? p_state + ((b * NH + h) * T + t) * T : NULL;
  float l = lse ? lse[(b * NH + h) * T + t] : 0.0f;
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
    const float *r = ds + (hl * T + t) * T;
    float acc = 0.0f;
    for (size_t j = 0; j < key_end(mk, t, T); j++)
      acc += r[j] * ts_ld<DT>(k, ((b * T + j) * NKV + g) * HS + d);
    ts_st<DT>(dq, (b * T + t) * NH * HS + h * HS + d, acc);
  }
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
    float ak = 0.0f, av = 0.0f;
    for (size_t hl = gl * rep; hl < (gl + 1) * rep; hl++)
      for (size_t t = mk.causal ? s : 0; t < T; t++) {
        size_t qi = ((b * T + t) * NH + g0 * rep + hl) * HS + d;
        ak += ds[(hl * T + t) * T + s] * ts_ld<DT>(q, qi);
        av += P[(hl * T + t) * T + s] * ts_ld<DT>(dout, qi);
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
static ts_status plain_backward_dt(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                   const void *dout, const void *q, const void *k, const void *v,
                                   const void *state, size_t B, size_t T, size_t NH, size_t NKV,
                                   size_t HS, ts_dtype dt, const att_mask &mk, const char *op) {
  if (dt == TS_FP32)
    return plain_backward<TS_FP32>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
  if (dt == TS_BF16)
    return plain_backward<TS_BF16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
  return plain_backward<TS_FP16>(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NKV, HS, mk, op);
}

/* ---- entry points ------------------------------------------------------------ */

/* Shapes cuDNN said it cannot run, per pass, so that later calls go to the
 * plain kernels at once instead of asking cuDNN again (a graph build and a
 * heuristics query each time). A full table only costs the asking. */
typedef struct {
  size_t B, T, NH, NKV, HS;
  int dt, backward, device, bidirectional;
} shape_key;
enum { REFUSED_MAX = 64 };
static shape_key refused[REFUSED_MAX];
static int n_refused;
static pthread_mutex_t refused_lock = PTHREAD_MUTEX_INITIALIZER;

static bool was_refused(const shape_key *k) {
  bool found = false;
  pthread_mutex_lock(&refused_lock);
  for (int i = 0; i < n_refused && !found; i++) found = memcmp(&refused[i], k, sizeof *k) == 0;
  pthread_mutex_unlock(&refused_lock);
  return found;
}

static void remember_refusal(const shape_key *k) {
  pthread_mutex_lock(&refused_lock);
  if (n_refused < REFUSED_MAX) refused[n_refused++] = *k;
  pthread_mutex_unlock(&refused_lock);
}

static shape_key key_of(const ts_kctx *ctx, size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                        ts_dtype dt, int backward, int bidirectional) {
  shape_key k;
  memset(&k, 0, sizeof k); /* padding too: keys compare with memcmp */
  k.B = B, k.T = T, k.NH = NH, k.NKV = NKV, k.HS = HS;
  k.dt = (int)dt, k.backward = backward, k.device = ctx->device_index;
  k.bidirectional = bidirectional;
  return k;
}

/* Does a call on ctx in dt go to cuDNN, shape permitting? */
static bool cudnn_first(const ts_kctx *ctx, ts_dtype dt) {
  return lse_state(dt) && !(ctx->flags & TS_K_PLAIN_ATTENTION);
}

/* Does this call go to cuDNN first? */
static bool try_cudnn(const ts_kctx *ctx, ts_dtype dt, const shape_key *k) {
  return cudnn_first(ctx, dt) && !was_refused(k);
}

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

/* ---- bidirectional attention ---------------------------------------------------- */

/* check[0] = min over batch rows b whose keys are all padding (ids == pad). */
__global__ void all_padding_kernel(int32_t *check, const int32_t *ids, int32_t pad, size_t B,
                                   size_t T) {
  for (size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x; b < B;
       b += (size_t)gridDim.x * blockDim.x) {
    size_t j = 0;
    while (j < T && ids[b * T + j] == pad) j++;
    if (j == T) atomicMin(check, (int32_t)(b < 0x7fffffff ? b : 0x7ffffffe)); /* min: order-free */
  }
}

/* all_padding_kernel's arguments, through ts_cuda_first_bad. */
struct padding_check {
  const int32_t *ids;
  int32_t pad;
  size_t B, T;
};

static void launch_padding_check(int32_t *check, const void *arg, cudaStream_t s) {
  const padding_check *a = (const padding_check *)arg;
  all_padding_kernel<<<ts_cuda_grid(a->B), TS_CUDA_BLOCK, 0, s>>>(check, a->ids, a->pad, a->B,
                                                                  a->T);
}

/* TS_ERR_INVALID_ARGUMENT naming the first batch row whose keys are all
 * padding (synchronous: a flag read back), unless ids is NULL (nothing
 * masked) or the caller checked them (TS_K_INDICES_CHECKED). */
static ts_status check_padding(const ts_kctx *ctx, const int32_t *ids, int32_t pad, size_t B,
                               size_t T, const char *op) {
  if (ids == nullptr || ctx->flags & TS_K_INDICES_CHECKED) return TS_OK;
  padding_check a = {ids, pad, B, T};
  int32_t row;
  TS_CHECK(ts_cuda_first_bad(ctx, launch_padding_check, &a, &row, op, "ids"));
  if (row == TS_CUDA_NONE_BAD) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: batch row %d: all %zu keys are padding (ids == pad_id = %d): no key "
                      "to attend to",
                      op, (int)row, T, (int)pad);
}

/* keep[b, j] = 1 if key j of batch row b is attended to (ids NULL: all). */
__global__ void key_flags_kernel(uint8_t *keep, const int32_t *ids, int32_t pad, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    keep[i] = ids == nullptr || ids[i] != pad;
}

/* bias[b, i, j] = 0 where keep[b, j], else the masked value (2-byte
 * patterns: MASKED_BIAS_BF16 or _FP16), for i < T. */
enum : uint16_t { MASKED_BIAS_BF16 = 0xC780 /* -65536 */, MASKED_BIAS_FP16 = 0xFBFF /* -65504 */ };

__global__ void key_bias_kernel(uint16_t *bias, const uint8_t *keep, uint16_t masked, size_t B,
                                size_t T) {
  size_t n = B * T * T;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t j = i % T, b = i / (T * T);
    bias[i] = keep[b * T + j] ? (uint16_t)0 : masked;
  }
}

/* The bidirectional op on cuDNN: writes the bias for the key flags `keep`
 * (B, T) at the start of ctx->workspace and runs the pass with the rest of
 * the workspace. TS_ERR_UNSUPPORTED (nothing queued but the bias) where
 * cuDNN cannot build the graph or the workspace cannot hold the bias. */
static ts_status cudnn_bidir(const ts_kctx *ctx, const uint8_t *keep, size_t B, size_t T,
                             ts_dtype dt, int backward, void *out_or_dq, void *dk, void *dv,
                             const void *dout, const void *out, const void *q, const void *k,
                             const void *v, float *stats, size_t NH, size_t HS) {
  size_t nb = bias_bytes(B, T);
  if (nb == SIZE_MAX || nb > ctx->workspace_bytes)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "cudnn attention: the bias (%zu bytes) does not fit the workspace (%zu)",
                        nb, ctx->workspace_bytes);
  ts_kctx rest = *ctx;
  rest.workspace = (char *)ctx->workspace + nb;
  rest.workspace_bytes = ctx->workspace_bytes - nb;
  uint16_t *bias = (uint16_t *)ctx->workspace;
  key_bias_kernel<<<ts_cuda_grid(B * T * T), TS_CUDA_BLOCK, 0, (cudaStream_t)ctx->stream>>>(
      bias, keep, dt == TS_BF16 ? MASKED_BIAS_BF16 : MASKED_BIAS_FP16, B, T);
  if (backward)
    return ts_cudnn_attention_backward(&rest, out_or_dq, dk, dv, dout, out, q, k, v, stats, bias, B,
                                       T, NH, NH, HS, dt);
  return ts_cudnn_attention_forward(&rest, out_or_dq, stats, q, k, v, bias, B, T, NH, NH, HS, dt);
}

extern "C" ts_status ts_cuda_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state,
                                                     const void *q, const void *k, const void *v,
                                                     const int32_t *ids, int32_t pad_id, size_t B,
                                                     size_t T, size_t NH, size_t HS,
                                                     ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_forward";
  TS_CHECK(check_padding(ctx, ids, pad_id, B, T, op));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  if (lse_state(dt)) /* the flags backward recomputes P with, and cuDNN's bias */
    key_flags_kernel<<<ts_cuda_grid(B * T), TS_CUDA_BLOCK, 0, s>>>(state_keep(state, B, T, NH),
                                                                  ids, pad_id, B * T);
  shape_key key = key_of(ctx, B, T, NH, NH, HS, dt, 0, 1);
  if (try_cudnn(ctx, dt, &key)) {
    ts_status st = cudnn_bidir(ctx, state_keep(state, B, T, NH), B, T, dt, 0, out, nullptr, nullptr,
                               nullptr, nullptr, q, k, v, (float *)state, NH, HS);
    if (st != TS_ERR_UNSUPPORTED) return st; /* else: the plain kernels, same state */
    remember_refusal(&key);
  }
  TS_CHECK(check_plain(B, T, NH, op));
  att_mask mk = {0, ids, pad_id, nullptr};
  TS_CUDA_DT_CALL(dt, plain_forward, ctx, out, state, q, k, v, B, T, NH, NH, HS, mk);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_attention_bidir_backward(const ts_kctx *ctx, void *dq, void *dk,
                                                      void *dv, const void *dout, const void *out,
                                                      const void *q, const void *k, const void *v,
                                                      const void *state, size_t B, size_t T,
                                                      size_t NH, size_t HS, ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_backward";
  shape_key key = key_of(ctx, B, T, NH, NH, HS, dt, 1, 1);
  if (try_cudnn(ctx, dt, &key)) {
    ts_status st = cudnn_bidir(ctx, state_keep((void *)state, B, T, NH), B, T, dt, 1, dq, dk, dv,
                               dout, out, q, k, v, (float *)state, NH, HS);
    if (st != TS_ERR_UNSUPPORTED) return st;
    remember_refusal(&key);
  }
  TS_CHECK(check_plain(B, T, NH, op));
  att_mask mk = {0, nullptr, 0, nullptr};
  if (lse_state(dt)) mk.keep = state_keep((void *)state, B, T, NH);
  TS_CHECK(plain_backward_dt(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NH, HS, dt, mk, op));
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
  m = ts_block_max(m, sh);
  float z = 0.0f;
  for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
    float e = expf(srow[j] - m);
    srow[j] = e;
    z += e;
  }
  z = ts_block_sum(z, sh); /* its barriers make every srow[j] visible to all */
  float inv = 1.0f / z;
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

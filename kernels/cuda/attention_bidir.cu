/*
 * attention_bidir.cu — CUDA bodies of bidirectional multi-head attention
 * with a key padding mask (ts_k_attention_bidir_forward and _backward,
 * kernels/kernels.h; Vaswani et al. 2017 eq. 1, Hugging Face
 * BertSelfAttention). The causal op, the state's layout and the plain
 * kernels: attention.cu and attention_plain.cuh.
 *
 * Query t sees every key whose id is not the pad id. Its bf16/fp16 state is
 * the log-sum-exp followed by (B, T) uint8 key flags (1: a key to attend to).
 * In bf16/fp16 it runs on cuDNN's fused kernels, with the key padding given
 * as per-row key lengths (cuDNN's padding mask; the lengths path):
 * key_lengths_kernel makes, on the device and from the key flags, seq_q[b] =
 * T (every query row is computed, padded ones too, as on the CPU: cuDNN's
 * mask would give a row past seq_q no key at all) and seq_kv[b] = n where the
 * row's kept keys are exactly 0 .. n - 1 — its padding a suffix, as a
 * tokenizer pads: then the lengths mask the same keys as the flags. A row
 * whose padding is not a suffix (a pad id inside the text) gets seq_kv = T
 * and redo[b] = 1, and after cuDNN's pass the plain kernels compute that row
 * again over it (att_redo_*_kernel: the same functions as the plain path, so
 * its bits): the choice is the device's, with no host sync, and it is the
 * same for a given batch whatever runs before it. A batch without such rows
 * pays two launches that skip its rows (a few microseconds; backward's also
 * writes dk = dv = 0 at each padded key, the contract, whatever cuDNN leaves
 * there), instead of the bias this path replaced: a (B, 1, T, T) bf16/fp16
 * tensor written before each pass and read by every head (B*T*T*2 bytes of
 * workspace; at bert-base's B 256, T 128, NH 12: 8 MiB written and up to 96
 * MiB read per pass).
 *
 * The bias remains the path for T above the plain kernels' limit (no redo
 * there) and under TS_K_BIAS_ATTENTION (a check of the lengths): 0 at a
 * key to attend to, MASKED_BIAS (-65504 in fp16, -65536 in bf16) at a
 * padding key, whose score is then so far below the row's largest that
 * e^(s - m) underflows to exactly 0 in fp32, as a -inf score gives
 * (finite, so that a tile of masked keys never makes the online softmax
 * compute -inf - -inf; HF's BERT adds the dtype's minimum the same way),
 * built from the key flags at the start of ctx->workspace before each
 * pass; cuDNN gets the rest. The plain kernels, the fallback and the fp32
 * path, take the mask (att_mask) instead: a masked key's score is -inf;
 * backward recomputes P with the key flags, and the fp32 state's P is 0 at
 * masked keys already.
 */
#include <cuda_runtime.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_plain.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

/* Does the bidirectional op on ctx give cuDNN its key padding as key
 * lengths (else as the bias)? Lengths need the plain kernels' redo of
 * rows whose padding is not a suffix, so T within their limit. */
static bool lengths_path(const ts_kctx *ctx, size_t T) {
  return T <= ATT_MAX_T && !(ctx->flags & TS_K_BIAS_ATTENTION);
}

/* ---- the checks, the key flags and the bias path --------------------------- */

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

/* The bidirectional op on cuDNN with the bias: writes the bias for the key
 * flags `keep` (B, T) at the start of ctx->workspace and runs the pass
 * with the rest of the workspace. TS_ERR_UNSUPPORTED (nothing queued but
 * the bias) where cuDNN cannot build the graph or the workspace cannot
 * hold the bias. */
static ts_status cudnn_bias(const ts_kctx *ctx, const uint8_t *keep, size_t B, size_t T,
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
  ts_cudnn_mask mask = {bias, nullptr, nullptr};
  if (backward)
    return ts_cudnn_attention_backward(&rest, out_or_dq, dk, dv, dout, out, q, k, v, stats, &mask,
                                       B, T, NH, NH, HS, dt);
  return ts_cudnn_attention_forward(&rest, out_or_dq, stats, q, k, v, &mask, B, T, NH, NH, HS, dt);
}

/* ---- the lengths path: cuDNN's padding mask, and the plain kernels' redo ---- */

/* One block per batch row b: its key flags (1: a key to attend to, from
 * keep_in, else ids[b, j] != pad, every key when ids is NULL) into
 * keep_out (NULL: not written), and, for cuDNN's padding mask, seq[b] = T
 * (every query row) and seq[B + b] = n, redo[b] = 0 when the row's kept
 * keys are exactly 0 .. n - 1 with n >= 1 (its padding a suffix: the
 * lengths mask the same keys as the flags); else seq[B + b] = T and
 * redo[b] = 1 (the plain kernels redo the row after cuDNN). */
__global__ void key_lengths_kernel(uint8_t *keep_out, int32_t *seq, uint8_t *redo,
                                   const int32_t *ids, int32_t pad, const uint8_t *keep_in,
                                   size_t B, size_t T) {
  __shared__ int32_t shc[32];
  __shared__ float she[32];
  size_t b = blockIdx.x;
  int32_t count = 0; /* keys kept */
  float end = 0.0f;  /* 1 + the last key kept (exact: T <= ATT_MAX_T) */
  for (size_t j = threadIdx.x; j < T; j += blockDim.x) {
    bool kept = keep_in ? keep_in[b * T + j] != 0 : ids == nullptr || ids[b * T + j] != pad;
    if (keep_out) keep_out[b * T + j] = kept;
    if (kept) {
      count++;
      end = (float)(j + 1);
    }
  }
  count = ts_block_sum(count, shc);
  end = ts_block_max(end, she);
  if (threadIdx.x == 0) {
    bool suffix = count > 0 && (float)count == end;
    seq[b] = (int32_t)T;
    seq[B + b] = suffix ? count : (int32_t)T;
    redo[b] = !suffix;
  }
}

/* Blocks of a redo kernel: enough for a few rows, few to skip a batch of none. */
enum { REDO_BLOCKS = 1024 };

/* The plain forward (att_row, the plain kernels' bits) of every row of the
 * batch rows with redo[b], lse state, NKV = NH; the others are skipped. */
template <ts_dtype DT>
__global__ void att_redo_forward_kernel(void *out, float *lse, const void *q, const void *k,
                                        const void *v, const uint8_t *redo, size_t B, size_t T,
                                        size_t NH, size_t HS, float scale, att_mask mk) {
  extern __shared__ float srow[];
  __shared__ float sh[32];
  for (size_t row = blockIdx.x; row < B * NH * T; row += gridDim.x) {
    if (!redo[row / (NH * T)]) continue; /* the same for the whole block */
    att_row<DT>(out, nullptr, lse, q, k, v, row, T, NH, NH, HS, scale, mk, srow, sh);
    __syncthreads(); /* srow is read to the end of the row before the next one is written */
  }
}

/* The plain backward of every head (b, h) of the batch rows with
 * redo[b], lse state, NKV = NH, one head per block at a time: its dS and
 * P, (T, T) fp32 each, in the block's slot of scratch (2 T^2 floats per
 * block), row by row as att_ds_kernel makes them, then dq, dk and dv as
 * att_dq_kernel and att_dkv_kernel sum them (the same functions in the
 * same order, so the plain kernels' bits). The other rows' keys past
 * their length seq_kv[b] get dk = dv = 0, the contract (kernels.h), which
 * does not then rest on what cuDNN writes at keys its mask removed. */
template <ts_dtype DT>
__global__ void att_redo_backward_kernel(void *dq, void *dk, void *dv, float *scratch,
                                         const uint8_t *redo, const int32_t *seq_kv,
                                         const float *lse, const void *q, const void *k,
                                         const void *v, const void *dout, size_t B, size_t T,
                                         size_t NH, size_t HS, float scale, att_mask mk) {
  __shared__ float sh[32];
  float *ds = scratch + (size_t)blockIdx.x * 2 * T * T, *P = ds + T * T;
  for (size_t bh = blockIdx.x; bh < B * NH; bh += gridDim.x) {
    size_t b = bh / NH, h = bh % NH;
    if (!redo[b]) { /* the same for the whole block */
      for (size_t i = (size_t)seq_kv[b] * HS + threadIdx.x; i < T * HS; i += blockDim.x) {
        size_t o = ((b * T + i / HS) * NH + h) * HS + i % HS;
        ts_st<DT>(dk, o, 0.0f);
        ts_st<DT>(dv, o, 0.0f);
      }
      continue;
    }
    for (size_t t = 0; t < T; t++)
      att_ds_row<DT>(ds + t * T, P + t * T, nullptr, lse[bh * T + t], q, k, dout, v, b, h, t, T,
                     NH, NH, HS, scale, mk, sh);
    __syncthreads(); /* every row of dS and P written before any is read */
    for (size_t i = threadIdx.x; i < T * HS; i += blockDim.x) {
      size_t d = i % HS, t = i / HS; /* query t for dq, key t for dk and dv */
      size_t o = ((b * T + t) * NH + h) * HS + d;
      ts_st<DT>(dq, o, att_dq_sum<DT>(ds + t * T, k, b, h, d, T, T, NH, HS));
      float ak, av;
      att_dkv_sums<DT>(&ak, &av, ds, P, q, dout, b, t, d, 0, 1, h, 0, T, NH, HS);
      ts_st<DT>(dk, o, ak);
      ts_st<DT>(dv, o, av);
    }
    __syncthreads(); /* read to the end before the next head overwrites them */
  }
}

/* The lengths path's workspace: its head (key_lengths_kernel's seq and
 * redo) and the rest, for cuDNN and then the backward redo's scratch. */
struct lengths_ws {
  int32_t *seq;  /* (2, B): query lengths, key lengths */
  uint8_t *redo; /* (B) */
  ts_kctx rest;  /* ctx with the workspace after the head */
};

static lengths_ws lengths_workspace(const ts_kctx *ctx, size_t B) {
  lengths_ws w;
  size_t nb = lengths_bytes(B); /* ctx->workspace_bytes >= the query >= nb (the front) */
  w.seq = (int32_t *)ctx->workspace;
  w.redo = (uint8_t *)(w.seq + 2 * B);
  w.rest = *ctx;
  w.rest.workspace = (char *)ctx->workspace + nb;
  w.rest.workspace_bytes = ctx->workspace_bytes - nb;
  return w;
}

template <ts_dtype DT>
static void launch_redo_forward(cudaStream_t s, void *out, float *lse, const void *q,
                                const void *k, const void *v, const uint8_t *redo,
                                const uint8_t *keep, size_t B, size_t T, size_t NH, size_t HS) {
  size_t rows = B * NH * T, blocks = rows < (size_t)REDO_BLOCKS ? rows : (size_t)REDO_BLOCKS;
  att_mask mk = {0, nullptr, 0, keep};
  att_redo_forward_kernel<DT><<<(unsigned)blocks, ATT_THREADS, T * sizeof(float), s>>>(
      out, lse, q, k, v, redo, B, T, NH, HS, 1.0f / sqrtf((float)HS), mk);
}

template <ts_dtype DT>
static void launch_redo_backward(cudaStream_t s, size_t blocks, float *scratch, void *dq,
                                 void *dk, void *dv, const void *dout, const float *lse,
                                 const void *q, const void *k, const void *v, const uint8_t *redo,
                                 const int32_t *seq_kv, const uint8_t *keep, size_t B, size_t T,
                                 size_t NH, size_t HS) {
  att_mask mk = {0, nullptr, 0, keep};
  att_redo_backward_kernel<DT><<<(unsigned)blocks, ATT_THREADS, 0, s>>>(
      dq, dk, dv, scratch, redo, seq_kv, lse, q, k, v, dout, B, T, NH, HS,
      1.0f / sqrtf((float)HS), mk);
}

/* The bidirectional op on cuDNN with key lengths (w's head written by
 * key_lengths_kernel from the key flags `keep`), then the plain kernels'
 * redo of the batch rows whose padding is not a suffix (and backward's
 * zeros at padded keys). The redo reads only the flags, redo[b] and the
 * lengths, on the device: no host decision. TS_ERR_UNSUPPORTED (nothing
 * queued but the lengths) where cuDNN cannot build the graph. */
static ts_status cudnn_lengths(const lengths_ws &w, const uint8_t *keep, size_t B, size_t T,
                               ts_dtype dt, int backward, void *out_or_dq, void *dk, void *dv,
                               const void *dout, const void *out, const void *q, const void *k,
                               const void *v, float *stats, size_t NH, size_t HS, const char *op) {
  ts_cudnn_mask mask = {nullptr, w.seq, w.seq + B};
  cudaStream_t s = (cudaStream_t)w.rest.stream;
  if (!backward) {
    TS_CHECK(ts_cudnn_attention_forward(&w.rest, out_or_dq, stats, q, k, v, &mask, B, T, NH, NH,
                                        HS, dt));
    TS_CUDA_DT_CALL(dt, launch_redo_forward, s, out_or_dq, stats, q, k, v, w.redo, keep, B, T, NH,
                    HS);
    return ts_cuda_launched(op);
  }
  size_t slot = 2 * T * T * sizeof(float), blocks = w.rest.workspace_bytes / slot;
  if (blocks > B * NH) blocks = B * NH;
  if (blocks > (size_t)REDO_BLOCKS) blocks = REDO_BLOCKS;
  if (blocks == 0) /* not with the query's workspace (kernels.h) */
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s (cuda): the redo of a batch row needs %zu bytes of workspace, has %zu",
                        op, slot, w.rest.workspace_bytes);
  TS_CHECK(ts_cudnn_attention_backward(&w.rest, out_or_dq, dk, dv, dout, out, q, k, v, stats,
                                       &mask, B, T, NH, NH, HS, dt));
  TS_CUDA_DT_CALL(dt, launch_redo_backward, s, blocks, (float *)w.rest.workspace, out_or_dq, dk,
                  dv, dout, stats, q, k, v, w.redo, w.seq + B, keep, B, T, NH, HS);
  return ts_cuda_launched(op);
}

extern "C" ts_status ts_cuda_attention_bidir_forward(const ts_kctx *ctx, void *out, void *state,
                                                     const void *q, const void *k, const void *v,
                                                     const int32_t *ids, int32_t pad_id, size_t B,
                                                     size_t T, size_t NH, size_t HS,
                                                     ts_dtype dt) {
  static const char op[] = "ts_k_attention_bidir_forward";
  TS_CHECK(check_padding(ctx, ids, pad_id, B, T, op));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  bool lengths = lengths_path(ctx, T);
  shape_key key = key_of(ctx, B, T, NH, NH, HS, dt, 0, lengths ? 1 : 2);
  bool cudnn = try_cudnn(ctx, dt, &key);
  uint8_t *keep = lse_state(dt) ? state_keep(state, B, T, NH) : nullptr;
  lengths_ws w = {};
  /* the flags backward recomputes P with (and the bias or lengths are made from) */
  if (cudnn && lengths) {
    w = lengths_workspace(ctx, B);
    key_lengths_kernel<<<(unsigned)B, ATT_THREADS, 0, s>>>(keep, w.seq, w.redo, ids, pad_id,
                                                           nullptr, B, T);
  } else if (keep) {
    key_flags_kernel<<<ts_cuda_grid(B * T), TS_CUDA_BLOCK, 0, s>>>(keep, ids, pad_id, B * T);
  }
  if (cudnn) {
    ts_status st = lengths ? cudnn_lengths(w, keep, B, T, dt, 0, out, nullptr, nullptr, nullptr,
                                           nullptr, q, k, v, (float *)state, NH, HS, op)
                           : cudnn_bias(ctx, keep, B, T, dt, 0, out, nullptr, nullptr, nullptr,
                                        nullptr, q, k, v, (float *)state, NH, HS);
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
  bool lengths = lengths_path(ctx, T);
  shape_key key = key_of(ctx, B, T, NH, NH, HS, dt, 1, lengths ? 1 : 2);
  if (try_cudnn(ctx, dt, &key)) {
    const uint8_t *keep = state_keep((void *)state, B, T, NH);
    ts_status st;
    if (lengths) {
      lengths_ws w = lengths_workspace(ctx, B);
      key_lengths_kernel<<<(unsigned)B, ATT_THREADS, 0, (cudaStream_t)ctx->stream>>>(
          nullptr, w.seq, w.redo, nullptr, 0, keep, B, T);
      st = cudnn_lengths(w, keep, B, T, dt, 1, dq, dk, dv, dout, out, q, k, v, (float *)state, NH,
                         HS, op);
    } else {
      st = cudnn_bias(ctx, keep, B, T, dt, 1, dq, dk, dv, dout, out, q, k, v, (float *)state, NH,
                      HS);
    }
    if (st != TS_ERR_UNSUPPORTED) return st;
    remember_refusal(&key);
  }
  TS_CHECK(check_plain(B, T, NH, op));
  att_mask mk = {0, nullptr, 0, nullptr};
  if (lse_state(dt)) mk.keep = state_keep((void *)state, B, T, NH);
  TS_CHECK(plain_backward_dt(ctx, dq, dk, dv, dout, q, k, v, state, B, T, NH, NH, HS, dt, mk, op));
  return ts_cuda_launched(op);
}


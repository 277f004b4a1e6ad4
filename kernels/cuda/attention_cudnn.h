/*
 * attention_cudnn.h — private to the CUDA backend: causal grouped-query
 * attention, and attention under a key padding mask given as per-sequence
 * lengths or as an additive bias (the bidirectional op's), in bf16/fp16
 * through cuDNN's fused flash attention (cuDNN's
 * "scaled dot product attention", SDPA, forward and backward; the algorithm
 * of Dao et al. 2022, FlashAttention, which never stores the (T, T)
 * probabilities and recomputes them in backward from the row log-sum-exp).
 *
 * A small C interface over NVIDIA's cudnn-frontend graph API (C++, kept
 * inside attention_cudnn.cpp): the GPU's cuDNN handle, and the two passes with the
 * shapes and argument order of ts_k_attention_forward/backward
 * (kernels/kernels.h). Callers are C; nothing C++ crosses this header.
 *
 * Invariants:
 *   - every pointer argument except h_ ones is device memory on the GPU
 *     the handle was created on; work is queued on (cudaStream_t)
 *     ctx->stream (the handle is re-bound to it on every call) and is
 *     asynchronous: errors during execution show at the next
 *     synchronisation;
 *   - one handle per GPU and process, shared by every context on it;
 *     a cuDNN graph is built once per (GPU, B, T, NH, NKV, HS, dt,
 *     direction, mask kind), on the first call with that key, and kept for the
 *     process: the first call is slow (heuristics and plan compilation,
 *     runtime compilation for some kernels), later ones, from any context
 *     or engine on that GPU, only execute. One mutex guards the handles,
 *     the cache and each call's bind-and-enqueue, so calls from several
 *     threads are safe;
 *   - a graph cuDNN cannot build (any cudnn-frontend failure while
 *     building) is TS_ERR_UNSUPPORTED with cuDNN's reason; the caller then
 *     runs another implementation. Only a failure while executing a built
 *     graph is TS_ERR_CUDA;
 *   - scratch comes only from ctx->workspace; a graph needing more than
 *     ctx->workspace_bytes fails before anything is queued;
 *   - the backward pass uses cuDNN's deterministic algorithm: the same
 *     inputs on the same GPU give the same bits, run after run.
 *
 * Status values: TS_OK; TS_ERR_INVALID_ARGUMENT for a NULL ctx or pointer,
 * a mask with both a bias and lengths or with one length array only, a
 * zero dimension, NH % NKV != 0, a dimension past cuDNN's int64 range or
 * an unknown dtype; TS_ERR_INVALID_USAGE for a context without a cuDNN
 * handle (ctx->dnn) or not on TS_DEVICE_CUDA; TS_ERR_UNSUPPORTED for fp32
 * or a graph cuDNN cannot build on this GPU (a shape its SDPA does not
 * support, e.g. HS not a multiple of 8 or above its head-size limit; no
 * engine config; a plan that fails to compile, e.g. without NVRTC), with
 * cuDNN's message; TS_ERR_OUT_OF_MEMORY for a workspace below the graph's
 * need (both numbers in the message) or a failed host allocation;
 * TS_ERR_CUDA for a failure while executing, with its message.
 */
#ifndef TS_KERNELS_CUDA_ATTENTION_CUDNN_H
#define TS_KERNELS_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>

#include "base/base.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *handle = the process's cuDNN handle (cudnnHandle_t) of CUDA device
 * `device`, for ts_kctx.dnn: created on the first call for that device,
 * which must then be the current device (cudaSetDevice), and shared by
 * every later caller. Never destroyed: it and its graphs live until the
 * process ends (a context drops its pointer, nothing more). Thread-safe.
 * TS_ERR_INVALID_ARGUMENT for a NULL handle; TS_ERR_CUDA naming cudnnCreate
 * and cudnnGetErrorString's text, e.g. on a machine without a GPU or
 * driver; TS_ERR_OUT_OF_MEMORY; *handle is untouched on failure. */
ts_status ts_cudnn_device_handle(int device, void **handle);

/* What masks the scores of a call, in place of the causal mask (a NULL
 * ts_cudnn_mask, or every field NULL, is causal). At most one of the two
 * kinds; device memory. */
typedef struct ts_cudnn_mask {
  /* (B, 1, T, T) dt, contiguous, shared by a row's heads, added to the
   * scaled scores: the bidirectional op passes 0 for a key to attend to and
   * a large negative finite value for a padding key, whose probability then
   * underflows to exactly 0 */
  const void *bias;
  /* (B) int32 each, 1 .. T: cuDNN's padding mask (SDPA_attributes::
   * set_padding_mask with set_seq_len_q / set_seq_len_kv). Query i of batch
   * row b sees key j iff i < seq_q[b] and j < seq_kv[b]: a row past
   * seq_q[b] sees no key at all, so its output is not softmax over the
   * keys (cuDNN writes zeros or leaves it; the CPU computes such rows like
   * any other), which is why the bidirectional op passes seq_q[b] = T and
   * masks keys only, through seq_kv[b] = the row's key count. */
  const int32_t *seq_q;
  const int32_t *seq_kv;
} ts_cudnn_mask;

/* Causal grouped-query attention, forward, cuDNN SDPA (flash attention):
 *   S = q k^T * scale (scale = 1/sqrt(HS)), causal mask aligned top-left
 *   (query t sees keys 0..t), P = softmax(S) over keys, out = P v;
 *   with a mask instead (ts_cudnn_mask: a bias, S = q k^T * scale + bias,
 *   or sequence lengths, S = -inf outside them), no causal mask;
 *   query head h reads key/value head h / (NH / NKV) (GQA, Ainslie et al.
 *   2023; MQA when NKV == 1).
 * q, out: (B, T, NH, HS); k, v: (B, T, NKV, HS); all dt (TS_BF16 or
 *   TS_FP16), device memory, row-major (as cuDNN tensors of dims
 *   (B, H, T, HS): strides (T*H*HS, HS, H*HS, 1)). out written (=); it may
 *   not alias the inputs.
 * stats: (B, NH, T) fp32, device, written (=): the natural log-sum-exp of
 *   each row of S after masking (cuDNN's Stats output, training mode),
 *   which ts_cudnn_attention_backward reads.
 * Accumulation and softmax in fp32 (cuDNN's intermediate and compute
 * types); out rounded to dt once. Workspace: up to
 * ts_cudnn_attention_workspace_bytes(...) bytes of ctx->workspace.
 * Statuses: see the top of this file. */
ts_status ts_cudnn_attention_forward(const ts_kctx *ctx, void *out, float *stats, const void *q,
                                     const void *k, const void *v, const ts_cudnn_mask *mask,
                                     size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                     ts_dtype dt);

/* Backward of ts_cudnn_attention_forward (cuDNN SDPA backward, Dao et al.
 * 2022 Algorithm 4 without dropout): with dS = P * (dP - rowsum(dout * out)),
 * dP = dout v^T,
 *   dq = dS k * scale, dk = dS^T q * scale, dv = P^T dout,
 * dk and dv summed over the NH / NKV query heads that share a kv head.
 * dq: (B, T, NH, HS); dk, dv: (B, T, NKV, HS); all written (=), dt, device,
 *   row-major as in forward; no output may alias an input or another output.
 * dout, out, q: (B, T, NH, HS); k, v: (B, T, NKV, HS); dt, device.
 * stats: (B, NH, T) fp32, device: the forward's, for these q, k, v.
 * mask: the forward's (NULL: causal); no gradient of a bias is formed.
 * Deterministic: cuDNN's deterministic algorithm
 * (SDPA_backward_attributes::set_deterministic_algorithm), so two runs on
 * the same GPU give the same bits; cuDNN supports it on Ampere and Hopper,
 * not on Blackwell (TS_ERR_UNSUPPORTED there). Workspace: up to
 * ts_cudnn_attention_workspace_bytes(...) bytes of ctx->workspace.
 * Statuses: see the top of this file. */
ts_status ts_cudnn_attention_backward(const ts_kctx *ctx, void *dq, void *dk, void *dv,
                                      const void *dout, const void *out, const void *q,
                                      const void *k, const void *v, const float *stats,
                                      const ts_cudnn_mask *mask, size_t B, size_t T, size_t NH,
                                      size_t NKV, size_t HS, ts_dtype dt);

/* Bytes of ctx->workspace either pass above may need: an upper bound, not
 * the exact need (that is known only once cuDNN has built the graph on a
 * GPU), so that memory can be planned on a machine without one. A pure
 * function of its arguments; SIZE_MAX if the bound overflows size_t, 0 for
 * a zero dimension. With Tp = T rounded up to 128 (cuDNN's largest
 * attention tile) and sizes in bytes, it is the backward's need (the
 * forward needs no more):
 *     B*NH*Tp*Tp*2          dP/dS in dt, the scratch of the deterministic
 *                           backward (cudnn-frontend forces its "dP
 *                           workspace" decomposition when determinism is
 *                           asked for: b*h*s_q*s_kv*2 bytes, padded)
 *   + B*NH*Tp*HS*4          an fp32 dQ accumulator (the other backward
 *                           decomposition, should cuDNN pick it)
 *   + 2*B*NH*Tp*HS*4        fp32 full-head dK, dV before the sum over
 *                           query heads (GQA/MQA only: NH != NKV)
 *   + 2*B*NH*Tp*4           the fp32 softmax sums rowsum(dout * out) the
 *                           frontend keeps in the workspace (B*NH*T*4),
 *                           and as much again for a backend copy
 *   + 16 MiB                headroom: semaphores, alignment, small buffers.
 * The passes check the built graph's real need against
 * ctx->workspace_bytes and fail with TS_ERR_OUT_OF_MEMORY if this bound
 * ever proves low. dt is accepted for symmetry (both storage types are
 * 2 bytes). */
size_t ts_cudnn_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                          ts_dtype dt);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CUDA_ATTENTION_CUDNN_H */

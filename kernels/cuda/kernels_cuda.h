/*
 * kernels_cuda.h — private: the CUDA backend's bodies, which
 * kernels/cuda/backend.c lists in its table (kernels/backend.h). Arguments
 * have been validated by the kernels front; contracts are those of the
 * public functions of kernels/kernels.h with the same name after ts_k_.
 *
 * Every pointer is device memory unless named h_; kernels are launched on
 * (cudaStream_t)ctx->stream and are asynchronous: a launch failure returns
 * TS_ERR_CUDA with cudaGetErrorString's text, errors during execution show
 * up at the caller's next synchronisation.
 */
#ifndef TS_KERNELS_CUDA_KERNELS_CUDA_H
#define TS_KERNELS_CUDA_KERNELS_CUDA_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices, contexts, memory (memory.cu) ----------------------------- */

int ts_cuda_device_count(void);
ts_status ts_cuda_context_init(ts_kctx *ctx, int index);
void ts_cuda_context_destroy(ts_kctx *ctx);
ts_status ts_cuda_synchronize(const ts_kctx *ctx);
ts_status ts_cuda_alloc(size_t nbytes, void **out);
void ts_cuda_free(void *p);
ts_status ts_cuda_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes);
ts_status ts_cuda_to_host(const ts_kctx *ctx, void *h_dst, const void *src, size_t nbytes);
ts_status ts_cuda_from_host(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
ts_status ts_cuda_host_register(void *h, size_t nbytes);
void ts_cuda_host_unregister(void *h);
ts_status ts_cuda_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src, size_t nbytes);
ts_status ts_cuda_host_wait(const ts_kctx *ctx);
ts_status ts_cuda_memory_info(int index, size_t *free_bytes, size_t *total_bytes, char *name,
                              size_t name_len);

/* linear.cu: the context's cuBLASLt handle. */
ts_status ts_cuda_blas_create(void **handle);
void ts_cuda_blas_destroy(void *handle);

/* linear.cu: D (P, S) row-major of d_dt (bf16 or fp32) = (A (P, Q) @
 * B (S, Q)^T) x sa x sb (+ D when accumulate), A and B fp8 codes of
 * formats fa and fb, rows of Q (K-major, cuBLASLt's fp8 "TN" layout); sa,
 * sb one fp32 inverse scale each on the device (cuBLASLt's scalar scale
 * mode; NULL: 1). Rowwise scales are applied by the caller (fp8.cu) to an
 * fp32 D: cuBLASLt 13.1 refused its outer-vector mode on an H200.
 * fast_accum: cuBLASLt's FP8 fast accumulation. cuBLASLt's workspace is
 * the start of ctx->workspace (ts_cuda_linear_workspace_bytes). The scale
 * pointers are set on the kept descriptor at each call, under a lock held
 * until the product is queued. */
ts_status ts_cuda_matmul_fp8(const ts_kctx *ctx, const char *op, size_t P, size_t S, size_t Q,
                             const uint8_t *A, ts_fp8_format fa, const float *sa,
                             const uint8_t *B, ts_fp8_format fb, const float *sb, void *D,
                             ts_dtype d_dt, int accumulate, int fast_accum);

/* vecops.cu: the synchronous data check of the ops that take indices:
 * TS_ERR_INVALID_ARGUMENT naming op, what[position] and its value if some
 * idx[n] is outside [0, V) (and not -100 when allow_ignore); TS_OK at once
 * when ctx->flags has TS_K_INDICES_CHECKED. */
ts_status ts_cuda_check_indices(const ts_kctx *ctx, const int32_t *idx, size_t N, size_t V,
                                int allow_ignore, const char *op, const char *what);

/* Workspace and state queries (kernels/backend.h). */
size_t ts_cuda_linear_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt);
size_t ts_cuda_linear_bias_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt);
size_t ts_cuda_embedding_workspace_bytes(size_t N, ts_dtype dt);
size_t ts_cuda_rmsnorm_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cuda_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                         ts_dtype dt);
size_t ts_cuda_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                     ts_dtype dt);
ts_dtype ts_cuda_attention_probs_dtype(const ts_kctx *ctx, ts_dtype dt, int bidirectional);
size_t ts_cuda_layernorm_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cuda_bias_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cuda_fp8_quantize_workspace_bytes(size_t R, size_t C);
size_t ts_cuda_linear_fp8_workspace_bytes(size_t M, size_t N, size_t K, ts_fp8_scaling scaling);

/* ---- ops -------------------------------------------------------------------- */

/* The ops of kernels/ops.h, ts_cuda_NAME, contracts of kernels/kernels.h:
 * cast.cu (casts, zero: cudaMemsetAsync), adamw.cu (master, m, v fp32
 * updated, param_out written if non-NULL, hp host), vecops.cu, linear.cu,
 * embedding.cu, layers.cu (RMSNorm, RoPE, SwiGLU; the encoder's LayerNorm,
 * bias, GELU, token types; the residual add fused with either norm's
 * forward), attention.cu (causal), attention_bidir.cu (bidirectional),
 * cross_entropy.cu. */
#define TS_CUDA_DECLARE(name, params) ts_status ts_cuda_##name params;
TS_K_OPS(TS_CUDA_DECLARE)
#undef TS_CUDA_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CUDA_KERNELS_CUDA_H */

/*
 * backend.c — the CUDA backend's table (kernels/backend.h): memory,
 * streams, copies and handles (memory.cu), casts and zeroing (cast.cu),
 * vector ops and reductions (vecops.cu), the linear layer through cuBLASLt
 * (linear.cu), embedding (embedding.cu), RMSNorm, RoPE, SwiGLU and the
 * encoder's LayerNorm, bias, GELU and token types (layers.cu), causal and
 * bidirectional attention (attention.cu; cuDNN for both in bf16/fp16
 * through attention_cudnn.cpp), cross-entropy (cross_entropy.cu) and AdamW
 * (adamw.cu). Compiled by the host compiler: the bodies are extern "C"
 * functions of the .cu files.
 */
#include "kernels/backend.h"
#include "kernels/cuda/kernels_cuda.h"

const ts_k_backend ts_k_cuda_backend = {
    .name = "cuda",
    .device = TS_DEVICE_CUDA,
    .device_count = ts_cuda_device_count,
    .context_init = ts_cuda_context_init,
    .context_destroy = ts_cuda_context_destroy,
    .synchronize = ts_cuda_synchronize,
    .memory_info = ts_cuda_memory_info,
    .alloc = ts_cuda_alloc,
    .free = ts_cuda_free,
    .copy = ts_cuda_copy,
    .to_host = ts_cuda_to_host,
    .from_host = ts_cuda_from_host,
    .host_register = ts_cuda_host_register,
    .host_unregister = ts_cuda_host_unregister,
    .from_host_async = ts_cuda_from_host_async,
    .host_wait = ts_cuda_host_wait,
    .linear_workspace_bytes = ts_cuda_linear_workspace_bytes,
    .linear_bias_workspace_bytes = ts_cuda_linear_bias_workspace_bytes,
    .embedding_workspace_bytes = ts_cuda_embedding_workspace_bytes,
    .rmsnorm_workspace_bytes = ts_cuda_rmsnorm_workspace_bytes,
    .attention_workspace_bytes = ts_cuda_attention_workspace_bytes,
    .attention_state_bytes = ts_cuda_attention_state_bytes,
    .attention_probs_dtype = ts_cuda_attention_probs_dtype,
    .layernorm_workspace_bytes = ts_cuda_layernorm_workspace_bytes,
    .bias_workspace_bytes = ts_cuda_bias_workspace_bytes,
    .fp8_quantize_workspace_bytes = ts_cuda_fp8_quantize_workspace_bytes,
    .linear_fp8_workspace_bytes = ts_cuda_linear_fp8_workspace_bytes,
/* the ops of kernels/ops.h */
#define TS_CUDA_ENTRY(name, params) .name = ts_cuda_##name,
    TS_K_OPS(TS_CUDA_ENTRY)
#undef TS_CUDA_ENTRY
};

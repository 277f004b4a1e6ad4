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
    .embedding_workspace_bytes = ts_cuda_embedding_workspace_bytes,
    .rmsnorm_workspace_bytes = ts_cuda_rmsnorm_workspace_bytes,
    .attention_workspace_bytes = ts_cuda_attention_workspace_bytes,
    .attention_state_bytes = ts_cuda_attention_state_bytes,
    .attention_probs_dtype = ts_cuda_attention_probs_dtype,
    .layernorm_workspace_bytes = ts_cuda_layernorm_workspace_bytes,
    .bias_workspace_bytes = ts_cuda_bias_workspace_bytes,
    .cast = ts_cuda_cast,
    .zero = ts_cuda_zero,
    .add = ts_cuda_add,
    .sumsq = ts_cuda_sumsq,
    .nonfinite = ts_cuda_nonfinite,
    .sum_ranks = ts_cuda_sum_ranks,
    .linear_forward = ts_cuda_linear_forward,
    .linear_backward = ts_cuda_linear_backward,
    .embedding_forward = ts_cuda_embedding_forward,
    .embedding_backward = ts_cuda_embedding_backward,
    .rmsnorm_forward = ts_cuda_rmsnorm_forward,
    .rmsnorm_backward = ts_cuda_rmsnorm_backward,
    .rope_forward = ts_cuda_rope_forward,
    .rope_backward = ts_cuda_rope_backward,
    .rope_forward_at = ts_cuda_rope_forward_at,
    .attention_cached = ts_cuda_attention_cached,
    .attention_forward = ts_cuda_attention_forward,
    .attention_backward = ts_cuda_attention_backward,
    .swiglu_forward = ts_cuda_swiglu_forward,
    .swiglu_backward = ts_cuda_swiglu_backward,
    .cross_entropy_forward = ts_cuda_cross_entropy_forward,
    .loss_sum = ts_cuda_loss_sum,
    .cross_entropy_backward = ts_cuda_cross_entropy_backward,
    .cross_entropy_fused = ts_cuda_cross_entropy_fused,
    .layernorm_forward = ts_cuda_layernorm_forward,
    .layernorm_backward = ts_cuda_layernorm_backward,
    .gelu_forward = ts_cuda_gelu_forward,
    .gelu_backward = ts_cuda_gelu_backward,
    .bias_add = ts_cuda_bias_add,
    .bias_backward = ts_cuda_bias_backward,
    .token_types = ts_cuda_token_types,
    .attention_bidir_forward = ts_cuda_attention_bidir_forward,
    .attention_bidir_backward = ts_cuda_attention_bidir_backward,
    .adamw = ts_cuda_adamw,
};

/*
 * backend.c — the CUDA backend's table (kernels/backend.h): memory,
 * streams and copies (memory.cu), casts and zeroing (cast.cu), AdamW
 * (adamw.cu). Every other op is NULL until the GPU issue gives it a body,
 * so the front answers TS_ERR_UNSUPPORTED for it; the workspace queries are
 * NULL too (those ops need none yet). Compiled by the host compiler: the
 * bodies are extern "C" functions of the .cu files.
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
    .alloc = ts_cuda_alloc,
    .free = ts_cuda_free,
    .copy = ts_cuda_copy,
    .to_host = ts_cuda_to_host,
    .from_host = ts_cuda_from_host,
    .cast = ts_cuda_cast,
    .zero = ts_cuda_zero,
    .adamw = ts_cuda_adamw,
};

/*
 * memory.cu — the CUDA backend's devices, contexts and memory: device
 * count, one non-blocking stream per context, cudaMalloc'ed and zeroed
 * buffers, and copies queued on the context's stream (kernels/backend.h).
 *
 * Invariants: every CUDA runtime error becomes TS_ERR_CUDA with the call and
 * cudaGetErrorString's text; nothing here synchronises the device except
 * ts_cuda_synchronize and the copies with the host, which wait for the
 * stream so the host may read (to_host) or reuse (from_host) its buffer.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kernels_cuda.h"

/* TS_ERR_CUDA naming the call and CUDA's message, or TS_OK. */
static ts_status cuda_status(cudaError_t e, const char *what, size_t nbytes) {
  if (e == cudaSuccess) return TS_OK;
  cudaGetLastError(); /* clear it, or the next launch check would report it again */
  return ts_set_error(TS_ERR_CUDA, "cuda: %s (%zu bytes): %s", what, nbytes,
                      cudaGetErrorString(e));
}

extern "C" int ts_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no driver" error */
    return 0;
  }
  return n;
}

/* The context's scratch: TS_CUDA_PARTIALS doubles, then the 2 check words. */
static const size_t STATE_BYTES = TS_CUDA_PARTIALS * sizeof(double) + 2 * sizeof(int32_t);

extern "C" ts_status ts_cuda_context_init(ts_kctx *ctx, int index) {
  TS_CHECK(cuda_status(cudaSetDevice(index), "cudaSetDevice", 0));
  cudaStream_t s = nullptr;
  TS_CHECK(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags", 0));
  ctx->stream = s;
  /* Everything made so far is reachable from ctx, so one destroy undoes a
   * failure at any point. */
  ts_status st = ts_cuda_blas_create(&ctx->blas);
  if (st == TS_OK) st = ts_cudnn_device_handle(index, &ctx->dnn); /* shared: not ctx's own */
  ts_cuda_state *state = NULL;
  if (st == TS_OK) {
    state = (ts_cuda_state *)calloc(1, sizeof *state);
    if (!state)
      st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "ts_k_context_init (cuda): cannot allocate its state");
    ctx->backend_state = state;
  }
  void *scratch = nullptr;
  if (st == TS_OK) st = cuda_status(cudaMalloc(&scratch, STATE_BYTES), "cudaMalloc", STATE_BYTES);
  if (st == TS_OK) {
    state->partials = (double *)scratch;
    state->check = (int32_t *)((char *)scratch + TS_CUDA_PARTIALS * sizeof(double));
    st = cuda_status(cudaEventCreateWithFlags(&state->copied, cudaEventDisableTiming),
                     "cudaEventCreateWithFlags", 0);
  }
  if (st != TS_OK) ts_cuda_context_destroy(ctx);
  return st;
}

extern "C" void ts_cuda_context_destroy(ts_kctx *ctx) {
  ts_cuda_state *state = (ts_cuda_state *)ctx->backend_state;
  if (state) {
    if (state->copied) cudaEventDestroy(state->copied);
    cudaFree(state->partials);
    free(state);
  }
  ctx->backend_state = nullptr;
  ctx->dnn = nullptr; /* the GPU's shared handle (ts_cudnn_device_handle) stays */
  ts_cuda_blas_destroy(ctx->blas);
  ctx->blas = nullptr;
  if (ctx->stream) cudaStreamDestroy((cudaStream_t)ctx->stream);
  ctx->stream = nullptr;
}

extern "C" ts_status ts_cuda_memory_info(int index, size_t *free_bytes, size_t *total_bytes,
                                         char *name, size_t name_len) {
  TS_CHECK(cuda_status(cudaSetDevice(index), "cudaSetDevice", 0));
  TS_CHECK(cuda_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo", 0));
  if (name && name_len) {
    cudaDeviceProp prop;
    TS_CHECK(cuda_status(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties", 0));
    snprintf(name, name_len, "%s", prop.name);
  }
  return TS_OK;
}

extern "C" ts_status ts_cuda_synchronize(const ts_kctx *ctx) {
  return cuda_status(cudaStreamSynchronize((cudaStream_t)ctx->stream), "cudaStreamSynchronize", 0);
}

extern "C" ts_status ts_cuda_alloc(size_t nbytes, void **out) {
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, nbytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes of device memory",
                        nbytes);
  }
  TS_CHECK(cuda_status(e, "cudaMalloc", nbytes));
  /* Zeroed before anything can use it: a plain cudaMemset runs on the
   * legacy stream, which the contexts' non-blocking streams do not wait
   * for, so wait here (allocation is never on a step's path: the engine
   * allocates at create and reuses its transients, shard/ledger.h). */
  ts_status st = cuda_status(cudaMemsetAsync(p, 0, nbytes, cudaStreamLegacy), "cudaMemsetAsync",
                             nbytes);
  if (st == TS_OK)
    st = cuda_status(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize", nbytes);
  if (st != TS_OK) {
    cudaFree(p);
    return st;
  }
  *out = p;
  return TS_OK;
}

/* cudaFree waits for the device to finish what it queued (CUDA runtime
 * API: an implicit device synchronisation), so a buffer freed right after
 * queuing a kernel that reads it is still safe. */
extern "C" void ts_cuda_free(void *p) {
  if (cudaFree(p) != cudaSuccess) cudaGetLastError();
}

extern "C" ts_status ts_cuda_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes) {
  return cuda_status(
      cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, (cudaStream_t)ctx->stream),
      "cudaMemcpyAsync device to device", nbytes);
}

/* A copy between the host and the device on ctx's stream, then a wait for
 * it: the host may read what came (to_host) or reuse what left (from_host,
 * kernels.h) at once. */
static ts_status copy_and_wait(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes,
                               cudaMemcpyKind kind, const char *what) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  TS_CHECK(cuda_status(cudaMemcpyAsync(dst, src, nbytes, kind, s), what, nbytes));
  return cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize", nbytes);
}

extern "C" ts_status ts_cuda_to_host(const ts_kctx *ctx, void *h_dst, const void *src,
                                     size_t nbytes) {
  return copy_and_wait(ctx, h_dst, src, nbytes, cudaMemcpyDeviceToHost,
                       "cudaMemcpyAsync device to host");
}

extern "C" ts_status ts_cuda_from_host(const ts_kctx *ctx, void *dst, const void *h_src,
                                       size_t nbytes) {
  return copy_and_wait(ctx, dst, h_src, nbytes, cudaMemcpyHostToDevice,
                       "cudaMemcpyAsync host to device");
}

extern "C" ts_status ts_cuda_host_register(void *h, size_t nbytes) {
  return cuda_status(cudaHostRegister(h, nbytes, cudaHostRegisterDefault), "cudaHostRegister",
                     nbytes);
}

extern "C" void ts_cuda_host_unregister(void *h) {
  if (cudaHostUnregister(h) != cudaSuccess) cudaGetLastError();
}

extern "C" ts_status ts_cuda_from_host_async(const ts_kctx *ctx, void *dst, const void *h_src,
                                             size_t nbytes) {
  TS_CHECK(ts_cuda_need_state(ctx, "ts_k_from_host_async"));
  cudaStream_t s = (cudaStream_t)ctx->stream;
  TS_CHECK(cuda_status(cudaMemcpyAsync(dst, h_src, nbytes, cudaMemcpyHostToDevice, s),
                       "cudaMemcpyAsync host to device", nbytes));
  return cuda_status(cudaEventRecord(ts_cuda_state_of(ctx)->copied, s), "cudaEventRecord", 0);
}

extern "C" ts_status ts_cuda_host_wait(const ts_kctx *ctx) {
  TS_CHECK(ts_cuda_need_state(ctx, "ts_k_host_wait"));
  return cuda_status(cudaEventSynchronize(ts_cuda_state_of(ctx)->copied), "cudaEventSynchronize",
                     0);
}

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

#include "kernels/cuda/kernels_cuda.h"

/* TS_ERR_CUDA naming the call and CUDA's message, or TS_OK. */
static ts_status cuda_status(cudaError_t e, const char *what, size_t nbytes) {
  if (e == cudaSuccess) return TS_OK;
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

extern "C" ts_status ts_cuda_context_init(ts_kctx *ctx, int index) {
  TS_CHECK(cuda_status(cudaSetDevice(index), "cudaSetDevice", 0));
  cudaStream_t s = nullptr;
  TS_CHECK(cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags", 0));
  ctx->stream = s;
  return TS_OK;
}

extern "C" void ts_cuda_context_destroy(ts_kctx *ctx) {
  if (ctx->stream) cudaStreamDestroy((cudaStream_t)ctx->stream);
  ctx->stream = nullptr;
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
  ts_status st = cuda_status(cudaMemset(p, 0, nbytes), "cudaMemset", nbytes);
  if (st != TS_OK) {
    cudaFree(p);
    return st;
  }
  *out = p;
  return TS_OK;
}

extern "C" void ts_cuda_free(void *p) { cudaFree(p); }

extern "C" ts_status ts_cuda_copy(const ts_kctx *ctx, void *dst, const void *src, size_t nbytes) {
  return cuda_status(
      cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, (cudaStream_t)ctx->stream),
      "cudaMemcpyAsync device to device", nbytes);
}

extern "C" ts_status ts_cuda_to_host(const ts_kctx *ctx, void *h_dst, const void *src,
                                     size_t nbytes) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  TS_CHECK(cuda_status(cudaMemcpyAsync(h_dst, src, nbytes, cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync device to host", nbytes));
  return cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize", nbytes);
}

extern "C" ts_status ts_cuda_from_host(const ts_kctx *ctx, void *dst, const void *h_src,
                                       size_t nbytes) {
  cudaStream_t s = (cudaStream_t)ctx->stream;
  TS_CHECK(cuda_status(cudaMemcpyAsync(dst, h_src, nbytes, cudaMemcpyHostToDevice, s),
                       "cudaMemcpyAsync host to device", nbytes));
  /* the caller may reuse h_src at once (kernels.h): wait for the copy */
  return cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize", nbytes);
}

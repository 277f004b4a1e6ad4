// Smoke test source for ts_cuda_library: one trivial kernel and two host
// functions with C linkage (declared in cuda_smoke.h).
#include "third_party/smoke/cuda_smoke.h"

#include <cuda_runtime.h>

namespace {

__global__ void saxpy_kernel(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

extern "C" int ts_smoke_cuda_device_count(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return -1;
  return count;
}

extern "C" int ts_smoke_cuda_saxpy(int n, float a, const float *x, float *y) {
  float *dx = nullptr, *dy = nullptr;
  size_t bytes = (size_t)n * sizeof(float);
  int rc = -1;
  if (cudaMalloc(&dx, bytes) != cudaSuccess) goto done;
  if (cudaMalloc(&dy, bytes) != cudaSuccess) goto done;
  if (cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice) != cudaSuccess) goto done;
  if (cudaMemcpy(dy, y, bytes, cudaMemcpyHostToDevice) != cudaSuccess) goto done;
  saxpy_kernel<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
  if (cudaGetLastError() != cudaSuccess) goto done;
  if (cudaMemcpy(y, dy, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) goto done;
  rc = 0;
done:
  cudaFree(dx);
  cudaFree(dy);
  return rc;
}

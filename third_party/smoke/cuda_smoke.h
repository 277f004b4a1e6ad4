/* Host API of third_party/smoke/cuda_smoke.cu: proves ts_cuda_library builds,
 * links against cudart, and (on a GPU machine) runs a kernel. */
#ifndef TESSERA_THIRD_PARTY_SMOKE_CUDA_SMOKE_H_
#define TESSERA_THIRD_PARTY_SMOKE_CUDA_SMOKE_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices visible, or -1 if the runtime reports an error
 * (no driver, no device). */
int ts_smoke_cuda_device_count(void);

/* y[i] = a * x[i] + y[i] for i < n, computed on device 0 (host buffers in,
 * host buffers out). Returns 0 on success, -1 on any CUDA error. */
int ts_smoke_cuda_saxpy(int n, float a, const float *x, float *y);

#ifdef __cplusplus
}
#endif

#endif  /* TESSERA_THIRD_PARTY_SMOKE_CUDA_SMOKE_H_ */

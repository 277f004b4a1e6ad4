/*
 * dnnl_matmul.h — matrix products of the CPU backend through oneDNN's
 * matmul primitive (kernels/cpu/dnnl_matmul.cc, C++ behind a C interface),
 * used by linear.c where oneDNN has a native kernel for the dtype on this
 * CPU (fp32: any JIT kernel; bf16/fp16: AMX, AVX512-BF16/FP16); elsewhere
 * linear.c calls OpenBLAS's sgemm (fp32), tessera's own AVX2/AVX-512
 * product (gemm_half.h: bf16/fp16) or sgemm on fp32 copies (bf16/fp16 below
 * AVX2).
 * All cut the output into the fixed tiles of tiles.h. Private to the CPU backend.
 */
#ifndef TS_KERNELS_CPU_DNNL_MATMUL_H
#define TS_KERNELS_CPU_DNNL_MATMUL_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The oneDNN implementation a dt product runs on here ("brg:avx512_core",
 * "brg:avx512_core_bf16", "brg:avx512_core_amx"...), or NULL when tessera
 * does not use oneDNN for dt: no native kernel (oneDNN would fall back to
 * its reference or, for bf16/fp16, fp32-emulating code), or
 * TESSERA_CPU_MATMUL=openblas in the environment (OpenBLAS's sgemm, for
 * comparison). Decided once per process and dtype (a probe primitive of
 * 64 x 64 x 64). */
const char *ts_cpu_dnnl_impl(ts_dtype dt);

/* Nonzero when TESSERA_CPU_MATMUL=openblas is in the environment (read
 * once): every dtype's products on OpenBLAS's sgemm, bf16/fp16 on fp32
 * copies, for comparison. */
int ts_cpu_matmul_openblas(void);

/* C (M, N) = op(A) op(B) [+ bias on every row] [+ C when accumulate],
 * every matrix row-major in dt (fp32, bf16 or fp16), products summed in
 * fp32 by oneDNN and rounded once to dt: bias (N, dt; NULL: none) is
 * widened and added to the fp32 sum (oneDNN's matmul bias), and the sum
 * post-op adds the previous C in fp32, both before that rounding. The
 * output is cut into tiles of TS_CPU_TILE_M rows by
 * TS_CPU_TILE_N columns (twice that many columns when M >= 8 TS_CPU_TILE_M),
 * each computed whole by a primitive made for one thread, tiles spread over
 * OpenMP's threads: the same bits at any thread count.
 * op(A) is (M, K): A itself (M, K) when !trans_a, else A is (K, M); op(B)
 * is (K, N): B itself (K, N) when !trans_b, else B is (N, K). Host memory;
 * C does not overlap A, B or bias. The primitive for each (shape, layout,
 * dtype, bias or not, accumulate) is made once and kept for the process; oneDNN's scratchpad is
 * one growing buffer per thread (outside the ledger, as OpenBLAS's packing
 * buffers are). Call only where ts_cpu_dnnl_impl(dt) is not NULL.
 * TS_ERR_INTERNAL with oneDNN's message when it fails (it does not for
 * valid shapes). */
ts_status ts_cpu_dnnl_matmul(void *C, const void *A, const void *B, const void *bias, size_t M,
                             size_t N, size_t K, int trans_a, int trans_b, int accumulate,
                             ts_dtype dt);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CPU_DNNL_MATMUL_H */

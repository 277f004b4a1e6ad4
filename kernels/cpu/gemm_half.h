/*
 * gemm_half.h — bf16 and fp16 matrix products packed straight to fp32
 * (kernels/cpu/gemm_half.c), used by linear.c where oneDNN has no native
 * kernel for the dtype and the CPU has AVX2, FMA and F16C (AVX-512 where
 * the cap allows it). Private to the CPU backend.
 */
#ifndef TS_KERNELS_CPU_GEMM_HALF_H
#define TS_KERNELS_CPU_GEMM_HALF_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nonzero where ts_cpu_gemm_half can run dt here: dt bf16 or fp16, and a
 * CPU (and OS) with AVX2, FMA and F16C, AVX2 within oneDNN's instruction-set
 * cap (ONEDNN_MAX_CPU_ISA; ts_cpu_isa >= 1). */
int ts_cpu_gemm_half_ok(ts_dtype dt);

/* Nonzero where linear.c runs dt's products through ts_cpu_gemm_half:
 * ts_cpu_gemm_half_ok(dt) (AVX2 or AVX-512 the widest tier within the
 * cap), no native oneDNN kernel for dt (ts_cpu_dnnl_impl) and no
 * TESSERA_CPU_MATMUL=openblas (which keeps the fp32 copies, for
 * comparison). Decided once per process (the
 * environment read on first use). */
int ts_cpu_linear_half_packed(ts_dtype dt);

/* The micro-kernel ts_cpu_gemm_half runs here, for ts_k_matmul_impl:
 * "tessera avx512 gemm" where AVX-512 is the widest tier within the cap
 * (ts_cpu_isa 2; its 8 x 32 zmm micro-tile), else "tessera avx2 gemm"
 * (6 x 16, ymm). Both give the same bits. A static string. */
const char *ts_cpu_gemm_half_name(void);

/* Bytes each OpenMP thread allocates (and frees) during one
 * ts_cpu_gemm_half call: op(B)'s packed block, op(A)'s packed rows and the
 * fp32 sums of one output tile. About 0.6 MiB. */
size_t ts_cpu_gemm_half_thread_bytes(void);

/* C (M, N) = op(A) op(B) [+ bias on every row] [+ C when accumulate],
 * every matrix row-major in dt (bf16 or fp16), host memory: op(A) is
 * (M, K), A itself (leading dimension lda) when !trans_a, else A is (K, M);
 * op(B) is (K, N), B itself (ldb) when !trans_b, else B is (N, K); C has
 * leading dimension ldc; bias (N, dt) or NULL. Products summed in fp32
 * (fused multiply-adds in k order within blocks of 256, the blocks' sums
 * added in order), then bias or the old C added in fp32, then one rounding
 * to dt (RNE): the contract of oneDNN's matmul with its bias and sum
 * post-op (dnnl_matmul.h), computed here. Output tiles of tiles.h, each
 * whole on one thread: the same bits at any thread count, and with either
 * micro-kernel (ts_cpu_gemm_half_name). C must not
 * overlap A, B or bias; K = 0 gives C = bias, old C or 0. Never call it from
 * inside an OpenMP region. TS_ERR_INVALID_ARGUMENT where
 * !ts_cpu_gemm_half_ok(dt); TS_ERR_OUT_OF_MEMORY when a thread's buffers
 * (ts_cpu_gemm_half_thread_bytes) cannot be had, C then untouched. */
ts_status ts_cpu_gemm_half(int trans_a, int trans_b, size_t M, size_t N, size_t K, const void *A,
                           size_t lda, const void *B, size_t ldb, const void *bias, int accumulate,
                           void *C, size_t ldc, ts_dtype dt);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CPU_GEMM_HALF_H */

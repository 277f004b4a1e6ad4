/*
 * kernels_fp8.h — the fp8 linear layer of the device API (kernels/kernels.h
 * includes it): fp8 casts with dynamic scales and the products of
 * ts_k_linear_* on them, on the GPU through cuBLASLt and on the CPU as the
 * reference (kernels/cpu/fp8.c, kernels/cuda/fp8.cu; the casts themselves
 * are kernels/fp8.h, shared by both). Shapes, dtypes, units and errors as
 * in kernels.h's conventions: row-major, host or device pointers of
 * ctx->device.
 */
#ifndef TS_KERNELS_KERNELS_FP8_H
#define TS_KERNELS_KERNELS_FP8_H

#include "kernels/fp8.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fp8 linear layer (Hopper's fp8 tensor cores; a CPU reference) ---------
 * The products of ts_k_linear_* with both operands cast to fp8 by dynamic
 * scales (kernels/fp8.h: torchao's float8 training): forward operands E4M3,
 * the output gradient E5M2; each product's sum in fp32 times the two
 * operands' inverse scales, rounded once to dt (dweight: plus its old value,
 * then rounded). Every operand is cast along its product's reduction axis:
 * dinp's weight and dweight's dout and inp are cast transposed, so the
 * backward casts W, dout and inp again rather than keeping the forward's.
 * CUDA: cuBLASLt's fp8 matmul (compute capability 8.9 or newer; older GPUs
 * return TS_ERR_UNSUPPORTED), the forward with fast accumulation and the
 * backward without, as torchao configures _scaled_mm. Rowwise: cuBLASLt
 * 13.1 refused its outer-vector scale mode on an H200 (status 7;
 * docs/BENCHMARKS.md, 2026-11-28), so the product runs unscaled into fp32
 * workspace and one kernel applies both scale vectors in the CPU's order
 * (not yet run on a GPU). CPU: the same casts
 * (bitwise those of the GPU), the cast values' products through the fp32
 * sgemm, the reference the GPU's parity test holds it to. */

/* How the operands of an fp8 product are scaled. */
typedef enum ts_fp8_scaling {
  TS_FP8_OFF = 0,        /* no fp8: the linear layers of dt */
  TS_FP8_TENSORWISE = 1, /* one scale per operand, from its absolute maximum */
  TS_FP8_ROWWISE = 2,    /* one scale per row of an operand along the reduction axis, rounded
                            down to a power of two (torchao's "rowwise" recipe) */
} ts_fp8_scaling;

/* "off", "tensorwise", "rowwise"; NULL for another value. */
const char *ts_fp8_scaling_name(ts_fp8_scaling s);

/* out = inp cast to fp8 format fmt with the scales of `scaling`
 * (kernels/fp8.h ts_fp8_scale, ts_fp8_cast). inp (R, C) of dt. transpose 0:
 * out (R, C), its rows those of inp; 1: out (C, R) = inp^T. Rowwise: one
 * scale per row of out, from that row's absolute maximum (R scales, or C
 * when transposed); tensorwise: one, from the whole tensor's. scale_inv
 * (fp32, on the device) receives 1 / scale for each (rowwise: R or C
 * entries; tensorwise: 1; a NaN scale as TS_FP8_NAN_BITS on every device,
 * ts_fp8_scale_inv). out is uint8 codes (kernels/fp8.h), and may not
 * overlap inp. Workspace: ts_k_fp8_quantize_workspace_bytes. Bits: the same
 * on every device and thread count (max is exact, each element one product
 * and one rounding). TS_ERR_INVALID_ARGUMENT: scaling off or unknown, fmt
 * unknown, transpose not 0 or 1, out overlapping inp. */
ts_status ts_k_fp8_quantize(const ts_kctx *ctx, uint8_t *out, float *scale_inv, const void *inp,
                            size_t R, size_t C, int transpose, ts_fp8_format fmt,
                            ts_fp8_scaling scaling, ts_dtype dt);
size_t ts_k_fp8_quantize_workspace_bytes(ts_device dev, size_t R, size_t C);

/* ts_k_linear_forward with fp8 products: out (M, N) = inp (M, K) @
 * weight (N, K)^T. dt must be bf16 (TS_ERR_INVALID_ARGUMENT otherwise),
 * scaling tensorwise or rowwise, M, N and K multiples of 16 (cuBLASLt's fp8
 * layout; TS_ERR_INVALID_ARGUMENT otherwise, on every device). */
ts_status ts_k_linear_fp8_forward(const ts_kctx *ctx, void *out, const void *inp,
                                  const void *weight, size_t M, size_t N, size_t K,
                                  ts_fp8_scaling scaling, ts_dtype dt);
/* ts_k_linear_backward with fp8 products: dinp (M, K) = dout (M, N) @
 * weight (N, K) (=; NULL skips), dweight (N, K) += dout^T @ inp (NULL skips).
 * A context deferring weight gradients (ctx->wgrad) is refused with
 * TS_ERR_UNSUPPORTED. */
ts_status ts_k_linear_fp8_backward(const ts_kctx *ctx, void *dinp, void *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   size_t M, size_t N, size_t K, ts_fp8_scaling scaling,
                                   ts_dtype dt);
/* Exact bytes of ctx->workspace either fp8 linear pass needs on dev: the
 * cast operands and their scales (CPU: also their fp32 values and the fp32
 * product; CUDA: also cuBLASLt's workspace, and rowwise the largest of the
 * three products in fp32). */
size_t ts_k_linear_fp8_workspace_bytes(ts_device dev, size_t M, size_t N, size_t K,
                                       ts_fp8_scaling scaling);

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_KERNELS_FP8_H */

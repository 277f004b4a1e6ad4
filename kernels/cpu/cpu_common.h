/*
 * cpu_common.h — private to the CPU backend (the .c files in kernels/cpu/):
 * the op bodies its table (cpu/backend.c) points at, dtype-generic element
 * load/store and the per-dtype specialisation idiom. Not part of the public
 * API: callers go through kernels/kernels.h, whose front (kernels.c) has
 * validated every argument before an op here runs (kernels/backend.h).
 *
 * Specialisation idiom: a hot loop body lives in a TS_AI (always-inline)
 * function whose last parameter is the storage dtype; the caller invokes it
 * through TS_DT_CALL inside its OpenMP loop, so each call site sees a
 * compile-time constant dtype, ld()/st() fold to a plain load/store, and the
 * fp32 path vectorises as if it were written for fp32 alone.
 *
 * fp16 conversions use the x86 F16C instructions when the CPU has them (and
 * AVX2, for the bulk loops in cast.c), chosen at run time through
 * ts_cpu_f16c, so the binary does not depend on the build host. They give
 * the bits of kernels/elementwise.h's software conversions for every input:
 * VCVTPS2PH with an immediate round-to-nearest-even narrows exactly like
 * ts_f32_to_f16 (NaN included: both set the quiet bit and keep the sign and
 * the top payload bits); VCVTPH2PS widens exactly except that it quiets a
 * signalling NaN, which ts_f16_to_f32 keeps as is, so inf/NaN inputs take the
 * software path. kernels_convert_test checks both directions bit for bit.
 */
#ifndef TS_KERNELS_CPU_CPU_COMMON_H
#define TS_KERNELS_CPU_CPU_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "kernels/backend.h"
#include "kernels/elementwise.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_AI static inline __attribute__((always_inline))

/* 1 where the F16C paths can be compiled in (x86-64 with GCC or Clang). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define TS_CPU_X86 1
#else
#define TS_CPU_X86 0
#endif

/* Nonzero when this CPU (and OS) supports F16C and AVX2: fp16 conversions
 * then use F16C, giving the same bits. Set once at load time (cast.c); tests
 * clear it to run the software path. Always 0 where TS_CPU_X86 is 0. */
extern int ts_cpu_f16c;

/* The body ts_k_adamw's CPU op runs (adamw.c): 2 AVX-512, 1 AVX2, 0
 * scalar; ts_cpu_adamw_isa_max the widest this CPU has within oneDNN's
 * ISA cap when one is set (ONEDNN_MAX_CPU_ISA), ts_cpu_adamw_isa the
 * faster body within it, measured at load time. Every body gives the same
 * bits; tests set ts_cpu_adamw_isa to compare them. */
extern int ts_cpu_adamw_isa, ts_cpu_adamw_isa_max;

/* The vector instructions of the CPU backend's own elementwise loops
 * (the bodies TS_CPU_CLONES dispatches to) and of gemm_half.c's
 * micro-kernel (with AVX2, FMA and F16C): 2 AVX-512 (F, BW, VL, DQ),
 * 1 AVX2, 0 baseline x86-64 (SSE2). Set before main to
 * ts_cpu_isa_widest(); tests change it to compare the bodies, which give
 * the same bits: each is the same source compiled for another target, with
 * no fused multiply-add (-ffp-contract=off) and no reassociation, and every
 * sum across elements kept in TS_CPU_LANES partial sums (ts_cpu_lanes_sum),
 * whatever the vector width. */
extern int ts_cpu_isa;

/* The widest of those this CPU (and OS) has, capped as oneDNN's own cap
 * says (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA: AVX2... keeps AVX2,
 * SSE41 or AVX baseline), so that one setting runs the whole CPU backend
 * at one tier (tools/test_suite.sh --isa). Always 0 off x86-64. */
int ts_cpu_isa_widest(void);

#if TS_CPU_X86
#define TS_TARGET_AVX2 __attribute__((target("avx2")))
#define TS_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
/* Defines `static void name params`, which runs name##_body (a TS_AI
 * function of the same parameters) compiled three times, for AVX-512,
 * AVX2 and baseline x86-64, as ts_cpu_isa says. The body is inlined into
 * each clone, so its loops vectorise at that clone's width. Call it from
 * inside a parallel loop (a parallel region in the body would be outlined
 * without the clone's target). */
#define TS_CPU_CLONES(name, params, args)                                   \
  TS_TARGET_AVX512 static void name##_avx512 params { name##_body args; } \
  TS_TARGET_AVX2 static void name##_avx2 params { name##_body args; }     \
  static void name##_base params { name##_body args; }                    \
  static void name params {                                               \
    if (ts_cpu_isa >= 2)                                                  \
      name##_avx512 args;                                                 \
    else if (ts_cpu_isa == 1)                                             \
      name##_avx2 args;                                                   \
    else                                                                  \
      name##_base args;                                                   \
  }
#else
#define TS_CPU_CLONES(name, params, args) \
  static void name params { name##_body args; }
#endif

/* Partial sums of every CPU sum across elements (norms' statistics,
 * cross-entropy's exponentials): element j joins partial sum j mod 16 in
 * index order, and ts_cpu_lanes_sum adds the 16 in a fixed tree. Sixteen
 * lanes fill one AVX-512 register, two AVX2 ones or four SSE2 ones: the
 * same bits at every width. */
enum { TS_CPU_LANES = 16 };

/* The 16 partial sums a in a fixed tree: b_i = a_i + a_(i+8),
 * c_i = b_i + b_(i+4), then (c_0 + c_2) + (c_1 + c_3). */
TS_AI float ts_cpu_lanes_sum(const float *a) {
  float b[8], c[4];
  for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; i++) c[i] = b[i] + b[i + 4];
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/* out = the sum of EXPR (an fp32 expression of the size_t element index
 * J) over J in [0, n): element J joins partial sum J mod TS_CPU_LANES, in
 * index order, and the partial sums are added by ts_cpu_lanes_sum. The
 * lanes vectorise at any width with the same bits. */
#define TS_CPU_LANE_SUM(out, n, J, EXPR)                                  \
  do {                                                                    \
    float lanes_[TS_CPU_LANES] = {0};                                     \
    size_t base_ = 0, n_ = (n);                                           \
    for (; base_ + TS_CPU_LANES <= n_; base_ += TS_CPU_LANES) {           \
      _Pragma("omp simd") for (size_t l_ = 0; l_ < TS_CPU_LANES; l_++) {  \
        size_t J = base_ + l_;                                            \
        lanes_[l_] += (EXPR);                                             \
      }                                                                   \
    }                                                                     \
    for (size_t l_ = 0; base_ + l_ < n_; l_++) {                          \
      size_t J = base_ + l_;                                              \
      lanes_[l_] += (EXPR);                                               \
    }                                                                     \
    (out) = ts_cpu_lanes_sum(lanes_);                                     \
  } while (0)

/* ts_f16_to_f32(h), through VCVTPH2PS when ts_cpu_f16c. Inline asm rather
 * than an intrinsic: an intrinsic needs the caller compiled for F16C, and
 * these loops are compiled for baseline x86-64. The asm also keeps the loops
 * unvectorised, as the software branches do, so omp simd reductions keep
 * their order. */
TS_AI float f16_to_f32(uint16_t h) {
#if TS_CPU_X86
  if (ts_cpu_f16c && (h & 0x7c00u) != 0x7c00u) { /* inf/NaN: software keeps an sNaN */
    float f;
    __asm__("vmovd %k1, %0\n\tvcvtph2ps %0, %0" : "=x"(f) : "r"((uint32_t)h));
    return f;
  }
#endif
  return ts_f16_to_f32(h);
}

/* ts_f32_to_f16(x), through VCVTPS2PH (immediate RNE, whatever MXCSR says)
 * when ts_cpu_f16c. */
TS_AI uint16_t f32_to_f16(float x) {
#if TS_CPU_X86
  if (ts_cpu_f16c) {
    uint32_t r;
    __asm__("vcvtps2ph $0, %1, %1\n\tvmovd %1, %0" : "=r"(r), "+x"(x));
    return (uint16_t)r; /* lane 0; the other lanes held whatever x's register did */
  }
#endif
  return ts_f32_to_f16(x);
}

/* Element i of p (storage dtype dt), widened exactly to fp32. */
TS_AI float ld(const void *p, size_t i, ts_dtype dt) {
  if (dt == TS_FP32) return ((const float *)p)[i];
  if (dt == TS_BF16) return ts_bf16_to_f32(((const uint16_t *)p)[i]);
  return f16_to_f32(((const uint16_t *)p)[i]);
}

/* Stores x into element i of p (storage dtype dt), rounding to nearest even. */
TS_AI void st(void *p, size_t i, ts_dtype dt, float x) {
  if (dt == TS_FP32)
    ((float *)p)[i] = x;
  else if (dt == TS_BF16)
    ((uint16_t *)p)[i] = ts_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = f32_to_f16(x);
}

/* Calls fn(args..., DT) with DT a compile-time constant equal to dt. */
#define TS_DT_CALL(dt, fn, ...) \
  do {                          \
    if ((dt) == TS_FP32)        \
      fn(__VA_ARGS__, TS_FP32); \
    else if ((dt) == TS_BF16)   \
      fn(__VA_ARGS__, TS_BF16); \
    else                        \
      fn(__VA_ARGS__, TS_FP16); \
  } while (0)

/* n rounded up to a multiple of 64 (workspace sub-buffers stay 64-byte aligned). */
static inline size_t ts_align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Widens n elements of src (dtype dt) into dst (fp32), in parallel. */
void ts_cpu_widen(float *dst, const void *src, size_t n, ts_dtype dt);
/* Rounds n fp32 elements of src into dst (dtype dt), RNE, in parallel. */
void ts_cpu_narrow(void *dst, const float *src, size_t n, ts_dtype dt);

/* dst[k] = src[i0 + k] widened (src of dtype dt), k < n; one thread, for use
 * inside a parallel loop. Same bits as ld(). */
void ts_cpu_widen_at(float *dst, const void *src, size_t i0, size_t n, ts_dtype dt);
/* dst[i0 + k] = src[k] rounded to dtype dt (RNE), k < n; one thread. Same
 * bits as st(). */
void ts_cpu_narrow_at(void *dst, size_t i0, const float *src, size_t n, ts_dtype dt);

/* e^x in fp32 from plain fp32 arithmetic, for loops the compiler
 * vectorises (`#pragma omp simd`): the same bits at every vector width,
 * on every x86-64 CPU, since each lane does the same IEEE operations
 * (-ffp-contract=off keeps them unfused). Cephes' expf (Moshier 1992):
 * x = n ln 2 + r, n = round(x log2 e) (by the 1.5 * 2^23 addition),
 * r = x - n C1 - n C2 with ln 2 = C1 + C2 (C1 exact in 9 bits), e^r from
 * Cephes' degree-6 polynomial, then the product with 2^n as two exact
 * powers 2^a 2^(n-a), so results below 2^-126 round once into fp32's
 * subnormals. Error below 1 ulp over [-104, 88.72283] (kernels_convert_test
 * measures it; glibc's expf: 0.5); 0 below -104 and at -inf, inf above
 * 88.72283 (expf's overflow threshold) and at inf, NaN for NaN. */
TS_AI float ts_cpu_exp(float x) {
  const float hi = 0x1.62e42ep+6f; /* 88.72283: expf's overflow threshold */
  float xc = x < -104.0f ? -104.0f : (x > hi ? hi : x);
  float fn = xc * 1.44269504088896341f + 12582912.0f;
  fn = fn - 12582912.0f; /* n in [-150, 128] */
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t n = (int32_t)fn, a = n / 2; /* a and n - a in [-75, 64] */
  union {
    uint32_t u;
    float f;
  } two_a = {(uint32_t)(a + 127) << 23}, two_b = {(uint32_t)(n - a + 127) << 23};
  float y = p * two_a.f * two_b.f;
  return x < -104.0f ? 0.0f : (x > hi ? INFINITY : y);
}

/* c7 t^7 + ... + c0 by Horner's rule in fp32, highest degree first (each
 * step one multiply and one add, unfused). */
TS_AI float ts_cpu_horner8(float t, float c7, float c6, float c5, float c4, float c3, float c2,
                           float c1, float c0) {
  return ((((((c7 * t + c6) * t + c5) * t + c4) * t + c3) * t + c2) * t + c1) * t + c0;
}

/* erf(x) in fp32 from plain fp32 arithmetic and ts_cpu_exp, for loops the
 * compiler vectorises: the same bits at every vector width. Coefficients
 * fitted for this function (least squares reweighted toward minimax, in
 * double, then rounded to fp32):
 *   |x| < 1:      erf = a + a Q(a^2), a = |x|, Q of degree 7 (Q(0) =
 *                 2/sqrt(pi) - 1): the exact leading term keeps the small
 *                 arguments' relative error at rounding level;
 *   1 <= |x| < 4: erf = 1 - e^(-a^2) G(1/a), G of degree 7 fitting
 *                 erfc(a) e^(a^2), which varies slowly (0.43 to 0.14);
 *   |x| >= 4:     1 (erfc(4) = 1.5e-8 is below half of fp32's spacing
 *                 under 1);
 * the sign of x put back (erf is odd; -0 stays -0), NaN for NaN.
 * kernels_convert_test measures the error against double erf: within
 * 2 ulp everywhere (1.27 at worst, near 0.98). */
TS_AI float ts_cpu_erf(float x) {
  float a = fabsf(x), s = a * a;
  float q = ts_cpu_horner8(s, -1.0049423508462496e-05f, 1.138769366662018e-04f,
                           -8.499114774167538e-04f, 5.221940111368895e-03f,
                           -2.6865709573030472e-02f, 1.1283786594867706e-01f,
                           -3.7612637877464294e-01f, 1.2837916612625122e-01f);
  float small = a + a * q;
  float u = 1.0f / a; /* inf at 0, where the small branch is taken */
  float g = ts_cpu_horner8(u, -1.8572213128209114e-02f, 1.2385668605566025e-01f,
                           -3.599533140659332e-01f, 5.812746286392212e-01f,
                           -5.088982582092285e-01f, 5.192451551556587e-02f,
                           5.5759197473526e-01f, 3.5953090991824865e-04f);
  float big = 1.0f - ts_cpu_exp(-s) * g;
  float r = a < 1.0f ? small : (a >= 4.0f ? 1.0f : big); /* NaN: big is NaN */
  return copysignf(r, x);
}

/* kernels/elementwise.h's ts_gelu_erf and ts_gelu_erf_grad, in the same
 * operation order, on ts_cpu_erf and ts_cpu_exp: the CPU's vectorised
 * GELU (cpu/gelu.c). */
TS_AI float ts_cpu_gelu_erf(float x) { return x * 0.5f * (1.0f + ts_cpu_erf(x * TS_GELU_SQRT1_2)); }
TS_AI float ts_cpu_gelu_erf_grad(float x) {
  float cdf = 0.5f * (1.0f + ts_cpu_erf(x * TS_GELU_SQRT1_2));
  float pdf = ts_cpu_exp(-0.5f * x * x) * TS_GELU_INV_SQRT_2PI;
  return cdf + x * pdf;
}

/* SiLU and its derivative (kernels/elementwise.h's formulas) on
 * ts_cpu_exp, for the CPU's vectorised SwiGLU loops. */
TS_AI float ts_cpu_silu(float x) { return x / (1.0f + ts_cpu_exp(-x)); }
TS_AI void ts_cpu_silu_and_grad(float x, float *silu, float *grad) {
  ts_silu_and_grad_of(x, ts_cpu_exp(-x), silu, grad);
}

/* Elements per chunk of the CPU's elementwise loops and reductions: fixed,
 * so the partition of a loop does not depend on the thread count. */
enum { TS_CPU_CHUNK = 4096 };

/* One chunk of an elementwise loop: elements [lo, hi) of the op whose
 * arguments arg points to. */
typedef void (*ts_cpu_chunk_fn)(void *arg, size_t lo, size_t hi);

/* Runs fn(arg, lo, hi) over the chunks [c C, min((c + 1) C, n)) of [0, n),
 * C = TS_CPU_CHUNK, spread over the OpenMP threads (static schedule; the
 * calling thread alone when there is one chunk). The one chunked loop of
 * the CPU's elementwise ops (vecops.c): each element's result depends on
 * its chunk's call alone, so the bits do not depend on the thread count. */
void ts_cpu_for_chunks(size_t n, ts_cpu_chunk_fn fn, void *arg);

/* Elements per fp32 scratch piece of the ops that run half storage through
 * ts_cpu_widen_at / ts_cpu_narrow_at (4 KiB of stack per buffer). */
enum { TS_CPU_PIECE = 1024 };

/* ---- the CPU backend's ops (contracts: kernels/backend.h) ---------------- */

/* C (M, N) = op(A) op(B) + beta C, fp32, host, row-major, alpha 1: op(A)
 * is A (M, K) with leading dimension lda, or A^T for A (K, M) when trans_a;
 * op(B) is B (K, N), or B^T for B (N, K) when trans_b. Cut into fixed
 * TS_CPU_TILE_M x TS_CPU_TILE_N tiles (tiles.h), each one single-threaded
 * OpenBLAS sgemm over the whole K, tiles spread over OpenMP's threads:
 * the same bits at any thread count (kernels/cpu/sgemm.c). C must not
 * overlap A or B; every dimension and leading dimension at most INT_MAX
 * (the caller checks). Never call it from inside an OpenMP region. */
void ts_cpu_sgemm(int trans_a, int trans_b, size_t M, size_t N, size_t K, const float *A,
                  size_t lda, const float *B, size_t ldb, float beta, float *C, size_t ldc);

size_t ts_cpu_linear_workspace_bytes(size_t M, size_t N, size_t K, ts_dtype dt);
size_t ts_cpu_embedding_workspace_bytes(size_t N, ts_dtype dt);
size_t ts_cpu_attention_workspace_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                        ts_dtype dt);
size_t ts_cpu_attention_state_bytes(size_t B, size_t T, size_t NH, size_t NKV, size_t HS,
                                    ts_dtype dt);
size_t ts_cpu_layernorm_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cpu_bias_workspace_bytes(size_t N, size_t C, ts_dtype dt);
size_t ts_cpu_linear_fp8_workspace_bytes(size_t M, size_t N, size_t K, ts_fp8_scaling scaling);

/* The ops of kernels/ops.h, ts_cpu_NAME, one body each in this folder. */
#define TS_CPU_DECLARE(name, params) ts_status ts_cpu_##name params;
TS_K_OPS(TS_CPU_DECLARE)
#undef TS_CPU_DECLARE

#ifdef __cplusplus
}
#endif

#endif /* TS_KERNELS_CPU_CPU_COMMON_H */

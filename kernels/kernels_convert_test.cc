// The CPU kernels' fast storage conversions against the software ones of
// kernels/elementwise.h, bit for bit. On an x86-64 CPU with F16C and AVX2
// the kernels convert fp16 with F16C (bulk: ts_k_cast, and through it
// ts_cpu_widen/ts_cpu_narrow, 8 lanes at a time; per element: ld/st of
// cpu_common.h) and bf16 with AVX2 integer lanes (bulk only); elsewhere they
// use the software path and these tests compare it with itself.
//
// Inputs: every 16-bit pattern (widening); for narrowing, every rounding
// boundary of the target format (each midpoint between neighbours, the
// overflow threshold included) +-0..3 ulps of fp32 with both signs, every
// NaN payload of both signs, and a strided sweep of all 2^32 fp32 patterns
// (hitting fp32 subnormals, normals, infs). Lengths that are not a multiple
// of 8 exercise the scalar tails. TS_TEST_EXHAUSTIVE=1 adds all 2^32 fp32
// patterns for fp16 and bf16 narrowing (about a minute on 2 cores).
// Last, the ops that widen half storage in bulk pieces around fp32 loops
// (add, swiglu, cross-entropy) are checked against their per-element
// formulas bit for bit, and ts_cpu_exp (the attention's exponential)
// against exp in double and against itself at every vector width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/elementwise.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;

namespace {

// Runs f once with the fast path as detected and once forced off, restoring
// the flag afterwards.
template <typename F>
void for_each_path(F f) {
  const int detected = ts_cpu_f16c;
  for (int fast : {detected, 0}) {
    ts_cpu_f16c = fast;
    SCOPED_TRACE(fast ? "F16C/AVX2 path" : "software path");
    f();
  }
  ts_cpu_f16c = detected;
}

std::vector<uint16_t> all_halves() {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  return h;
}

// fp32 patterns around every rounding boundary of a 16-bit format whose
// value k (0 <= k <= max_finite) is val(k): the midpoint between k and k + 1
// (for k = max_finite, k + 1 is the first value past the largest finite one,
// so the midpoint is the overflow threshold), +-3 ulps of fp32, both signs;
// plus the values themselves.
template <typename Val>
std::vector<float> boundaries(uint32_t max_finite, Val val) {
  std::vector<float> x;
  for (uint32_t k = 0; k <= max_finite; k++) {
    /* exact: a midpoint needs one bit more than the 16-bit format has */
    uint32_t mid = ts_f32_bits((float)((val(k) + val(k + 1)) / 2));
    for (int d = -3; d <= 3; d++)
      for (uint32_t sign : {0u, 0x80000000u}) x.push_back(ts_bits_f32(sign | (mid + d)));
    x.push_back((float)val(k));
    x.push_back(-(float)val(k));
  }
  return x;
}

// Every NaN (both signs), infinities, and every 4099th fp32 pattern (about
// a million: fp32 subnormals, normals and infs of both signs).
std::vector<float> nans_and_sweep() {
  std::vector<float> x;
  for (uint32_t m = 1; m < (1u << 23); m++) {
    x.push_back(ts_bits_f32(0x7f800000u | m));
    x.push_back(ts_bits_f32(0xff800000u | m));
  }
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  for (uint64_t u = 7; u < (1ull << 32); u += 4099) x.push_back(ts_bits_f32((uint32_t)u));
  return x;
}

// Value of the k-th non-negative fp16 / bf16 pattern; the pattern of inf
// reads as the next binade (2^16, 2^128), the first value past the largest.
double f16_val(uint32_t k) { return k == 0x7c00u ? 65536.0 : ts_f16_to_f32((uint16_t)k); }
double bf16_val(uint32_t k) {
  return k == 0x7f80u ? std::ldexp(1.0, 128) : ts_bf16_to_f32((uint16_t)k);
}

// Narrows x with ts_k_cast to dt, checking every element against `ref`. The
// cast covers x[1..n) so the length is odd and the start unaligned.
template <typename Ref>
void expect_narrow_matches(const std::vector<float> &x, ts_dtype dt, Ref ref) {
  CpuCtx c;
  std::vector<uint16_t> out(x.size(), 0xdead);
  ASSERT_EQ(ts_k_cast(c.get(), out.data() + 1, dt, x.data() + 1, TS_FP32, x.size() - 1), TS_OK);
  for (size_t i = 1; i < x.size(); i++)
    ASSERT_EQ(out[i], ref(x[i])) << ts_dtype_name(dt) << " of fp32 0x" << std::hex
                                 << ts_f32_bits(x[i]);
}

TEST(Convert, FastPathFollowsTheCpu) {
#if TS_CPU_X86
  __builtin_cpu_init();
  EXPECT_EQ(ts_cpu_f16c != 0, __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2"));
#else
  EXPECT_EQ(ts_cpu_f16c, 0);
#endif
  if (!ts_cpu_f16c) std::printf("note: no F16C/AVX2 here; only the software path is tested\n");
}

TEST(Convert, F16WidenMatchesSoftwareOnAllPatterns) {
  auto h = all_halves();
  for_each_path([&] {
    CpuCtx c;
    std::vector<float> out(h.size(), -1.0f);
    ASSERT_EQ(ts_k_cast(c.get(), out.data() + 3, TS_FP32, h.data() + 3, TS_FP16, h.size() - 3),
              TS_OK);
    for (uint32_t i = 3; i < 65536; i++)
      ASSERT_EQ(ts_f32_bits(out[i]), ts_f32_bits(ts_f16_to_f32(h[i])))
          << "fp16 0x" << std::hex << i;
    for (uint32_t i = 0; i < 65536; i++) /* per element, as the other ops load */
      ASSERT_EQ(ts_f32_bits(f16_to_f32(h[i])), ts_f32_bits(ts_f16_to_f32(h[i])))
          << "fp16 0x" << std::hex << i;
  });
}

TEST(Convert, Bf16WidenMatchesSoftwareOnAllPatterns) {
  auto h = all_halves();
  for_each_path([&] {
    CpuCtx c;
    std::vector<float> out(h.size(), -1.0f);
    ASSERT_EQ(ts_k_cast(c.get(), out.data() + 5, TS_FP32, h.data() + 5, TS_BF16, h.size() - 5),
              TS_OK);
    for (uint32_t i = 5; i < 65536; i++)
      ASSERT_EQ(ts_f32_bits(out[i]), ts_f32_bits(ts_bf16_to_f32(h[i])))
          << "bf16 0x" << std::hex << i;
  });
}

TEST(Convert, F16NarrowMatchesSoftwareAtBoundariesNansAndSweep) {
  auto b = boundaries(0x7bffu, f16_val), s = nans_and_sweep();
  // The boundary set holds the overflow threshold 65520 and the smallest
  // subnormal's half 2^-25; check the ends are there.
  ASSERT_NE(std::find(b.begin(), b.end(), 65520.0f), b.end());
  ASSERT_NE(std::find(b.begin(), b.end(), std::ldexp(1.0f, -25)), b.end());
  for_each_path([&] {
    for (const auto *x : {&b, &s}) {
      expect_narrow_matches(*x, TS_FP16, ts_f32_to_f16);
      for (float v : *x) /* per element, as the other ops store */
        ASSERT_EQ(f32_to_f16(v), ts_f32_to_f16(v)) << "fp32 0x" << std::hex << ts_f32_bits(v);
    }
  });
}

TEST(Convert, Bf16NarrowMatchesSoftwareAtBoundariesNansAndSweep) {
  auto b = boundaries(0x7f7fu, bf16_val), s = nans_and_sweep();
  ASSERT_NE(std::find(b.begin(), b.end(), ts_bits_f32(0x7f7f8000u)), b.end()); /* overflow tie */
  for_each_path([&] {
    expect_narrow_matches(b, TS_BF16, ts_f32_to_bf16);
    expect_narrow_matches(s, TS_BF16, ts_f32_to_bf16);
  });
}

// The per-element path inside an op: out = a + (-0) is a exactly for every
// non-NaN fp16 a (NaNs: quiet, same payload on both paths).
TEST(Convert, AddUsesTheSameF16Conversions) {
  auto a = all_halves();
  std::vector<uint16_t> mz(a.size(), 0x8000);
  for_each_path([&] {
    CpuCtx c;
    std::vector<uint16_t> out(a.size());
    ASSERT_EQ(ts_k_add(c.get(), out.data(), a.data(), mz.data(), a.size(), TS_FP16), TS_OK);
    for (uint32_t i = 0; i < 65536; i++)
      ASSERT_EQ(out[i], ts_f32_to_f16(ts_f16_to_f32(a[i]) + -0.0f)) << "fp16 0x" << std::hex << i;
  });
}

// Ops that run half storage through bulk-converted fp32 pieces give the
// bits of the per-element formula (software conversions, same fp32 math).
// Lengths cover several 1024-element pieces plus a partial one.
TEST(Convert, HalfPiecesMatchPerElementFormulas) {
  const size_t n = 5000, N = 3, V = 2500;
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {
    auto narrow = dt == TS_FP16 ? ts_f32_to_f16 : ts_f32_to_bf16;
    auto widen = dt == TS_FP16 ? ts_f16_to_f32 : ts_bf16_to_f32;
    auto half = [&](std::vector<float> v) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); i++) h[i] = narrow(v[i]);
      return h;
    };
    ts_test::Rng rng(7);
    auto g = half(rng.vec(n, -9, 9)), u = half(rng.vec(n)), d = half(rng.vec(n, -1e-4f, 1e-4f));
    auto x = half(rng.vec(N * V, -12, 12));
    std::vector<int32_t> y = {17, (int32_t)V - 1, 1500};
    for_each_path([&] {
      SCOPED_TRACE(ts_dtype_name(dt));
      CpuCtx c;
      std::vector<uint16_t> h(n), sum(n), dg(n), du(n), dx(N * V);
      ASSERT_EQ(ts_k_swiglu_forward(c.get(), h.data(), g.data(), u.data(), n, dt), TS_OK);
      ASSERT_EQ(ts_k_add(c.get(), sum.data(), g.data(), u.data(), n, dt), TS_OK);
      ASSERT_EQ(
          ts_k_swiglu_backward(c.get(), dg.data(), du.data(), d.data(), g.data(), u.data(), n, dt),
          TS_OK);
      for (size_t i = 0; i < n; i++) {
        float gi = widen(g[i]), ui = widen(u[i]), di = widen(d[i]), s, ds;
        ts_cpu_silu_and_grad(gi, &s, &ds);
        ASSERT_EQ(h[i], narrow(ts_cpu_silu(gi) * ui)) << i;
        ASSERT_EQ(sum[i], narrow(gi + ui)) << i;
        ASSERT_EQ(dg[i], narrow(di * ui * ds)) << i;
        ASSERT_EQ(du[i], narrow(di * s)) << i;
      }
      std::vector<float> loss(N);
      const float dloss = 0.37f;
      ASSERT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), x.data(), y.data(), N, V, dt),
                TS_OK);
      ASSERT_EQ(
          ts_k_cross_entropy_backward(c.get(), dx.data(), x.data(), y.data(), N, V, dloss, dt),
          TS_OK);
      for (size_t r = 0; r < N; r++) {
        const uint16_t *xr = x.data() + r * V;
        float m = -INFINITY, s = 0.0f;
        for (size_t j = 0; j < V; j++) m = widen(xr[j]) > m ? widen(xr[j]) : m;
        // cross_entropy.c's order: per 1024-element piece, element j into
        // partial sum j mod 16, the 16 added in their fixed tree, the
        // pieces' sums in order.
        for (size_t j0 = 0; j0 < V; j0 += TS_CPU_PIECE) {
          float a[16] = {0}, b[8], c4[4];
          for (size_t j = j0; j < V && j < j0 + TS_CPU_PIECE; j++)
            a[(j - j0) % 16] += ts_cpu_exp(widen(xr[j]) - m);
          for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
          for (int i = 0; i < 4; i++) c4[i] = b[i] + b[i + 4];
          s += (c4[0] + c4[2]) + (c4[1] + c4[3]);
        }
        ASSERT_EQ(ts_f32_bits(loss[r]), ts_f32_bits((logf(s) + m) - widen(xr[y[r]]))) << r;
        float inv = 1.0f / s;
        for (size_t j = 0; j < V; j++) {
          float p = ts_cpu_exp(widen(xr[j]) - m) * inv;
          ASSERT_EQ(dx[r * V + j], narrow(dloss * (p - (j == (size_t)y[r] ? 1.0f : 0.0f))))
              << r << "," << j;
        }
      }
    });
  }
}

// Every fp32 in [-104, 88.72283] (about 2.1e9 patterns: a stride of 97
// keeps 22 million of them, all exponents and mantissa patterns), within
// 1 ulp of e^x (fp32's subnormal spacing 2^-149 below 2^-126); the special
// inputs and the overflow threshold against expf; and a vectorised loop
// (omp simd) giving the scalar call's bits.
TEST(Exp, WithinOneUlpEverywhereAndTheSameBitsVectorised) {
  const float hi = 0x1.62e42ep+6f;  // the largest x whose e^x is finite in fp32
  std::vector<float> x;
  for (uint32_t b = 0; b <= ts_f32_bits(hi); b += 97) x.push_back(ts_bits_f32(b));
  for (uint32_t b = 0x80000000u; b <= ts_f32_bits(-104.0f); b += 97) x.push_back(ts_bits_f32(b));
  x.push_back(hi);
  std::vector<float> vec(x.size()), scalar(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); i++) vec[i] = ts_cpu_exp(x[i]);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); i++) {
    volatile float xi = x[i];  // one call at a time, not vectorised
    scalar[i] = ts_cpu_exp(xi);
    ASSERT_EQ(ts_f32_bits(vec[i]), ts_f32_bits(scalar[i])) << "x = " << x[i];
    double ref = std::exp((double)x[i]);
    double ulp = std::ldexp(1.0, std::max(std::ilogb(ref), -126) - 23);  // fp32's at ref
    double err = std::fabs(scalar[i] - ref) / ulp;
    if (err > worst) worst = err, worst_x = x[i];
  }
  EXPECT_LT(worst, 1.0) << "at x = " << worst_x;
  std::printf("ts_cpu_exp: %zu inputs, worst %.3f ulp at x = %.9g\n", x.size(), worst, worst_x);
  EXPECT_EQ(ts_cpu_exp(0.0f), 1.0f);
  EXPECT_EQ(ts_cpu_exp(-0.0f), 1.0f);
  EXPECT_EQ(ts_cpu_exp(-INFINITY), 0.0f);
  EXPECT_EQ(ts_cpu_exp(-104.5f), 0.0f);
  EXPECT_EQ(ts_cpu_exp(-1e30f), 0.0f);
  EXPECT_TRUE(std::isfinite(ts_cpu_exp(hi)));
  EXPECT_EQ(ts_cpu_exp(std::nextafter(hi, INFINITY)), INFINITY);
  EXPECT_EQ(::expf(std::nextafter(hi, INFINITY)), INFINITY);  // the same threshold as expf
  EXPECT_TRUE(std::isfinite(::expf(hi)));
  EXPECT_EQ(ts_cpu_exp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(ts_cpu_exp(NAN)));
}

// Every 61st positive fp32 up to 4.5 (past erf's rounding to 1 at 3.92;
// about 18 million inputs, every exponent, both branches and their seam
// at 1), within 2 ulp of erf (fp32's spacing at the result, subnormal
// spacing for the smallest), a vectorised loop giving the scalar call's
// bits, oddness bit for bit, and the special inputs.
TEST(Erf, WithinTwoUlpEverywhereAndTheSameBitsVectorised) {
  std::vector<float> x;
  for (uint32_t b = 1; b <= ts_f32_bits(4.5f); b += 61) x.push_back(ts_bits_f32(b));
  x.push_back(1.0f), x.push_back(std::nextafter(1.0f, 0.0f)), x.push_back(4.0f);
  std::vector<float> vec(x.size()), neg(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); i++) vec[i] = ts_cpu_erf(x[i]);
#pragma omp simd
  for (size_t i = 0; i < x.size(); i++) neg[i] = ts_cpu_erf(-x[i]);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); i++) {
    volatile float xi = x[i];  // one call at a time, not vectorised
    float scalar = ts_cpu_erf(xi);
    ASSERT_EQ(ts_f32_bits(vec[i]), ts_f32_bits(scalar)) << "x = " << x[i];
    ASSERT_EQ(ts_f32_bits(neg[i]), ts_f32_bits(-scalar)) << "x = " << x[i];
    double ref = std::erf((double)x[i]);
    double ulp = std::ldexp(1.0, std::max(std::ilogb(ref), -126) - 23);
    double err = std::fabs(scalar - ref) / ulp;
    if (err > worst) worst = err, worst_x = x[i];
  }
  EXPECT_LT(worst, 2.0) << "at x = " << worst_x;
  std::printf("ts_cpu_erf: %zu inputs, worst %.3f ulp at x = %.9g\n", x.size(), worst, worst_x);
  EXPECT_EQ(ts_f32_bits(ts_cpu_erf(0.0f)), ts_f32_bits(0.0f));
  EXPECT_EQ(ts_f32_bits(ts_cpu_erf(-0.0f)), ts_f32_bits(-0.0f));
  EXPECT_EQ(ts_cpu_erf(INFINITY), 1.0f);
  EXPECT_EQ(ts_cpu_erf(-INFINITY), -1.0f);
  EXPECT_EQ(ts_cpu_erf(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(ts_cpu_erf(NAN)));
}

// The CPU's GELU (erf form) is elementwise.h's expression order on
// ts_cpu_erf and ts_cpu_exp, and within a few ulp of libm's.
TEST(Erf, CpuGeluFollowsTheSharedFormula) {
  for (float x : {-6.0f, -2.5f, -1.0f, -0.3f, 0.0f, 0.7f, 1.0f, 3.0f, 8.0f}) {
    EXPECT_EQ(ts_f32_bits(ts_cpu_gelu_erf(x)),
              ts_f32_bits(x * 0.5f * (1.0f + ts_cpu_erf(x * TS_GELU_SQRT1_2))));
    float cdf = 0.5f * (1.0f + ts_cpu_erf(x * TS_GELU_SQRT1_2));
    EXPECT_EQ(ts_f32_bits(ts_cpu_gelu_erf_grad(x)),
              ts_f32_bits(cdf + x * (ts_cpu_exp(-0.5f * x * x) * TS_GELU_INV_SQRT_2PI)));
    EXPECT_NEAR(ts_cpu_gelu_erf(x), ts_gelu_erf(x), 1e-6f * (1.0f + std::fabs(x)));
    EXPECT_NEAR(ts_cpu_gelu_erf_grad(x), ts_gelu_erf_grad(x), 1e-6f * (1.0f + x * x));
  }
}

// The CPU's SiLU on ts_cpu_exp keeps elementwise.h's overflow behaviour
// (e^-x overflows to inf: silu -0, gradient 0) and stays within a few ulp
// of it (the exponentials differ by at most 1.5 ulp, the divisions and the
// gradient's products add 4 roundings in both; the gradient's 1 + x (1 - s)
// cancels near x = -1.28, so its bound is relative to |s| (1 + |x|), the
// size of its terms).
TEST(Exp, CpuSiluFollowsTheSharedFormula) {
  for (float x = -120.0f; x <= 120.0f; x += 0.0137f) {
    float s, g, rs, rg;
    ts_cpu_silu_and_grad(x, &s, &g);
    ts_silu_and_grad(x, &rs, &rg);
    ASSERT_EQ(ts_f32_bits(s), ts_f32_bits(ts_cpu_silu(x))) << x;
    ASSERT_NEAR(s, rs, 4 * 0x1p-24 * std::fabs(rs)) << x;
    ASSERT_NEAR(g, rg, 8 * 0x1p-24 * std::fabs(rs / x) * (1 + std::fabs(x)) + 1e-30) << x;
  }
  EXPECT_EQ(ts_f32_bits(ts_cpu_silu(-200.0f)), ts_f32_bits(ts_silu(-200.0f)));  // -0
  EXPECT_EQ(ts_cpu_silu(100.0f), 100.0f);
}

TEST(Convert, ExhaustiveNarrowing) {
  const char *env = std::getenv("TS_TEST_EXHAUSTIVE");
  if (!env || std::strcmp(env, "1") != 0) GTEST_SKIP() << "set TS_TEST_EXHAUSTIVE=1";
  if (!ts_cpu_f16c) GTEST_SKIP() << "no F16C/AVX2: nothing to compare";
  const size_t block = size_t(1) << 24;
  std::vector<float> x(block);
  for (uint64_t base = 0; base < (1ull << 32); base += block) {
    for (size_t i = 0; i < block; i++) x[i] = ts_bits_f32((uint32_t)(base + i));
    CpuCtx c;
    std::vector<uint16_t> f16(block), bf16(block);
    ASSERT_EQ(ts_k_cast(c.get(), f16.data(), TS_FP16, x.data(), TS_FP32, block), TS_OK);
    ASSERT_EQ(ts_k_cast(c.get(), bf16.data(), TS_BF16, x.data(), TS_FP32, block), TS_OK);
    int bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (ptrdiff_t i = 0; i < (ptrdiff_t)block; i++)
      bad += (f16[i] != ts_f32_to_f16(x[i])) + (bf16[i] != ts_f32_to_bf16(x[i])) +
             (f32_to_f16(x[i]) != ts_f32_to_f16(x[i]));
    ASSERT_EQ(bad, 0) << "in fp32 patterns [0x" << std::hex << base << ", +2^24)";
  }
}

}  // namespace

// ts_cpu_gemm_half (kernels/cpu/gemm_half.c): the bf16 and fp16 product
// that linear.c runs where oneDNN has no native kernel for the dtype.
//
// Every output is compared bit for bit with a scalar reference that spells
// out the documented order: per block of 256 along the reduction, the
// products added in k order from 0 (a product of two bf16 or two fp16
// values is exact in fp32, 16 or 22 significant bits, so a fused
// multiply-add and a multiply then add give the same sum), the blocks'
// sums added in order, then the bias or the old output, then one rounding
// to the dtype. The reference itself is held to the error bound of that
// order against double sums. Shapes cross every edge: a 256-row or
// 256-column output tile (300, 270), the micro-tiles of both tiers (AVX2's
// 6 x 16, AVX-512's 8 x 32: 1, 7, 17, 63, 101, 263), the 8-wide packing
// loads (K = 9, 13) and a reduction block (K = 257, 264, 600), all four
// transpositions, at 1 and 3 threads. The test runs at the widest tier
// within the cap, and again under the AVX2 cap (kernels_gemm_half_test_avx2);
// where AVX-512 is there, the two tiers' outputs are also compared byte for
// byte.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/floats.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/gemm_half.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

namespace {

using ts_test::Rng;

float Widen(uint16_t h, ts_dtype dt) { return dt == TS_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h); }
uint16_t Round(float x, ts_dtype dt) { return dt == TS_BF16 ? ts_f32_to_bf16(x) : ts_f32_to_f16(x); }

struct Case {
  size_t M, N, K;
  int ta, tb;
  bool bias, accumulate;
};

// The documented result of one case (gemm_half.h), scalar; and the bound
// check of that order against double sums.
std::vector<uint16_t> Reference(const Case &c, const std::vector<uint16_t> &A,
                                const std::vector<uint16_t> &B, const std::vector<uint16_t> &bias,
                                const std::vector<uint16_t> &C0, ts_dtype dt) {
  const size_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
  auto a = [&](size_t i, size_t k) { return Widen(c.ta ? A[k * lda + i] : A[i * lda + k], dt); };
  auto b = [&](size_t k, size_t j) { return Widen(c.tb ? B[j * ldb + k] : B[k * ldb + j], dt); };
  const double u = std::ldexp(1.0, -24);
  std::vector<uint16_t> out(c.M * c.N);
  for (size_t i = 0; i < c.M; i++)
    for (size_t j = 0; j < c.N; j++) {
      float total = 0.0f;
      double exact = 0.0, mag = 0.0;
      for (size_t k0 = 0; k0 < c.K; k0 += 256) {
        float s = 0.0f;
        for (size_t k = k0; k < c.K && k < k0 + 256; k++) {
          float p = a(i, k) * b(k, j);  // exact: at most 22 significant bits
          s = s + p;
          exact += (double)a(i, k) * b(k, j);
          mag += std::fabs((double)a(i, k) * b(k, j));
        }
        total = k0 == 0 ? s : total + s;
      }
      float add = c.bias ? Widen(bias[j], dt) : c.accumulate ? Widen(C0[i * c.N + j], dt) : 0.0f;
      if (c.bias || c.accumulate) total = total + add;
      exact += add;
      mag += std::fabs(add);
      // fp32 sums: at most K + K/256 + 1 additions in a row, each off by at
      // most u of what it sums (first order; the factor 1.01 covers the rest)
      double depth = (double)c.K + (double)(c.K / 256) + 1.0;
      EXPECT_LE(std::fabs(total - exact), 1.01 * depth * u * mag + 1e-30)
          << i << "," << j << " K=" << c.K;
      out[i * c.N + j] = Round(total, dt);
    }
  return out;
}

std::vector<uint16_t> Random(Rng &rng, size_t n, ts_dtype dt) {
  std::vector<uint16_t> v(n);
  for (auto &x : v) x = Round(rng.uniform(-2.0f, 2.0f), dt);
  return v;
}

std::vector<uint16_t> Multiply(const Case &c, const std::vector<uint16_t> &A,
                          const std::vector<uint16_t> &B, const std::vector<uint16_t> &bias,
                          const std::vector<uint16_t> &C0, ts_dtype dt, int threads) {
  std::vector<uint16_t> C = C0;
  int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  ts_status st = ts_cpu_gemm_half(c.ta, c.tb, c.M, c.N, c.K, A.data(), c.ta ? c.M : c.K, B.data(),
                                  c.tb ? c.K : c.N, c.bias ? bias.data() : nullptr, c.accumulate,
                                  C.data(), c.N, dt);
  omp_set_num_threads(before);
  EXPECT_EQ(st, TS_OK) << ts_last_error();
  return C;
}

class GemmHalf : public ::testing::TestWithParam<ts_dtype> {
 protected:
  void SetUp() override {
    if (!ts_cpu_gemm_half_ok(GetParam()))
      GTEST_SKIP() << "no AVX2, FMA and F16C within the instruction-set cap here";
  }
};

TEST_P(GemmHalf, EveryOutputHasTheDocumentedBitsAtAnyThreadCount) {
  const ts_dtype dt = GetParam();
  const Case cases[] = {
      {300, 270, 600, 0, 1, false, false},  // forward: x W^T, two tiles each way, three blocks
      {300, 270, 257, 0, 1, true, false},   // with the bias
      {101, 17, 600, 0, 0, false, false},   // dinp: dout W
      {270, 101, 300, 1, 0, false, true},   // dW += dout^T x
      {7, 300, 13, 1, 1, false, true},      // both transposed
      {263, 63, 264, 1, 0, false, true},    // 8-row slivers read transposed, 32-column edge
      {263, 63, 40, 0, 1, true, false},     // 8-row slivers transposed while packed
      {1, 1, 1, 0, 0, true, false},
      {17, 7, 9, 1, 0, true, false},
      {6, 16, 0, 0, 1, true, false},  // K = 0: the bias alone
      {6, 16, 0, 1, 0, false, true},  // K = 0: the old output kept
  };
  Rng rng(47);
  for (const Case &c : cases) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K
                                    << " ta=" << c.ta << " tb=" << c.tb << " bias=" << c.bias
                                    << " acc=" << c.accumulate);
    auto A = Random(rng, c.M * c.K, dt), B = Random(rng, c.K * c.N, dt),
         bias = Random(rng, c.N, dt), C0 = Random(rng, c.M * c.N, dt);
    auto want = Reference(c, A, B, bias, C0, dt);
    auto one = Multiply(c, A, B, bias, C0, dt, 1);
    auto three = Multiply(c, A, B, bias, C0, dt, 3);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++)
      if (one[i] != want[i] && differ++ == 0) first = i;
    EXPECT_EQ(differ, 0u) << "first at " << first << ": got " << Widen(one[first], dt)
                          << ", the documented order gives " << Widen(want[first], dt);
    EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * 2), 0) << "3 threads differ";
  }
}

// The AVX-512 micro-kernel (8 x 32) and the AVX2 one (6 x 16) give the
// same bits: each output's sum is the same fused multiply-adds in the same
// order, lane by lane. Compared byte for byte where this CPU has AVX-512
// within the cap (ts_cpu_isa 2), with the name each tier reports.
TEST_P(GemmHalf, BothTiersGiveTheSameBits) {
  const ts_dtype dt = GetParam();
  if (ts_cpu_isa < 2) GTEST_SKIP() << "no AVX-512 within the instruction-set cap here";
  const Case cases[] = {
      {300, 270, 600, 0, 1, true, false},
      {263, 63, 264, 1, 0, false, true},
      {101, 17, 600, 0, 0, false, false},
  };
  Rng rng(512);
  const int widest = ts_cpu_isa;
  for (const Case &c : cases) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " N=" << c.N << " K=" << c.K);
    auto A = Random(rng, c.M * c.K, dt), B = Random(rng, c.K * c.N, dt),
         bias = Random(rng, c.N, dt), C0 = Random(rng, c.M * c.N, dt);
    auto wide = Multiply(c, A, B, bias, C0, dt, 2);
    EXPECT_STREQ(ts_cpu_gemm_half_name(), "tessera avx512 gemm");
    ts_cpu_isa = 1;
    auto narrow = Multiply(c, A, B, bias, C0, dt, 2);
    EXPECT_STREQ(ts_cpu_gemm_half_name(), "tessera avx2 gemm");
    ts_cpu_isa = widest;
    EXPECT_EQ(std::memcmp(wide.data(), narrow.data(), wide.size() * 2), 0);
    EXPECT_NE(std::memcmp(wide.data(), C0.data(), wide.size() * 2), 0);  // both wrote C
  }
}

// Infinities and NaNs go through the packing and the sums as IEEE says: a
// NaN input gives NaN wherever it is summed in, an infinity its sign.
TEST_P(GemmHalf, InfinitiesAndNansPropagate) {
  const ts_dtype dt = GetParam();
  const Case c = {8, 20, 40, 0, 1, false, false};
  Rng rng(9);
  auto A = Random(rng, c.M * c.K, dt), B = Random(rng, c.N * c.K, dt);
  std::vector<uint16_t> none, C0(c.M * c.N);
  for (auto &x : A) x = Round(std::fabs(Widen(x, dt)), dt);  // all products >= 0
  for (auto &x : B) x = Round(std::fabs(Widen(x, dt)), dt);
  A[2 * c.K + 5] = Round(INFINITY, dt);  // row 2: +inf where B's columns are > 0
  A[3 * c.K + 7] = Round(NAN, dt);       // row 3: NaN everywhere
  auto C = Multiply(c, A, B, none, C0, dt, 2);
  for (size_t j = 0; j < c.N; j++) {
    float b = Widen(B[j * c.K + 5], dt);
    if (b > 0) EXPECT_EQ(Widen(C[2 * c.N + j], dt), INFINITY) << j;
    EXPECT_TRUE(std::isnan(Widen(C[3 * c.N + j], dt))) << j;
    EXPECT_TRUE(std::isfinite(Widen(C[4 * c.N + j], dt))) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemmHalf, ::testing::Values(TS_BF16, TS_FP16),
                         [](const testing::TestParamInfo<ts_dtype> &i) {
                           return std::string(ts_dtype_name(i.param));
                         });

// fp32 is not its dtype: refused with the reason, C untouched.
TEST(GemmHalfArgs, Fp32IsRefusedAndNothingWritten) {
  float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {7, 7, 7, 7};
  EXPECT_EQ(ts_cpu_gemm_half(0, 0, 2, 2, 2, A, 2, B, 2, nullptr, 0, C, 2, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("ts_cpu_gemm_half: fp32 products need bf16 or fp16"),
            std::string::npos)
      << ts_last_error();
  for (float x : C) EXPECT_EQ(x, 7.0f);
}

}  // namespace

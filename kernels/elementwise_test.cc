// Tests of kernels/elementwise.h: the bit-exact storage conversions (known
// patterns, ties, overflow, subnormals, NaN, exhaustive round trips, and
// agreement with an independent RNE reference), SiLU and its derivative.
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

float from_bits(uint32_t u) { return ts_bits_f32(u); }

// Independent reference: x rounded to a binary format with p significant
// bits, minimum normal exponent emin and largest finite value maxf, by
// scaling to an integer in double (exact: power-of-two scales) and rounding
// with nearbyint (IEEE round-to-nearest-even under the default mode).
double round_ref(double x, int p, int emin, double maxf) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  int e = std::ilogb(x);
  if (e < emin) e = emin;
  double q = std::ldexp(std::nearbyint(std::ldexp(x, p - 1 - e)), e - (p - 1));
  if (std::fabs(q) > maxf) return std::copysign(INFINITY, x);
  return q;
}
double bf16_ref(float x) { return round_ref(x, 8, -126, std::ldexp(255.0, 120)); }
double f16_ref(float x) { return round_ref(x, 11, -14, 65504.0); }

TEST(Bf16, KnownBitPatterns) {
  EXPECT_EQ(ts_f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(ts_f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(ts_f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(ts_f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(ts_f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(ts_f32_to_bf16(-INFINITY), 0xFF80);
  // Ties to even: 1 + 2^-8 lies halfway between 0x3F80 and 0x3F81.
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  // Largest finite bf16 is 0x7F7F; the tie above it rounds (to even) to inf.
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(ts_f32_to_bf16(FLT_MAX), 0x7F80);
  // fp32 subnormals keep their top bits.
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(ts_bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(ts_bf16_to_f32(0x0001), from_bits(0x00010000u));
}

TEST(Bf16, NanStaysQuietNan) {
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0xFFC00000u)), 0xFFC0);
  // A NaN whose payload lives only in the dropped bits must not become inf.
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(ts_f32_to_bf16(from_bits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_TRUE(std::isnan(ts_bf16_to_f32(0x7F81)));
}

TEST(Bf16, AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ts_bf16_to_f32((uint16_t)h);
    ASSERT_EQ(ts_f32_bits(f), h << 16);
    uint16_t back = ts_f32_to_bf16(f);
    if (std::isnan(f))
      ASSERT_EQ(back, h | 0x0040u) << "NaN " << h << " must come back quiet, payload kept";
    else
      ASSERT_EQ(back, h) << "bf16 " << h;
  }
}

TEST(Bf16, MatchesIndependentRounding) {
  // Random bit patterns over the whole fp32 range plus a dense sweep near 1.
  uint64_t s = 12345;
  for (int i = 0; i < (1 << 20); i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(s >> 32);
    if (i % 2) u = 0x3F000000u + (uint32_t)i; /* dense around [0.5, 1) */
    float x = from_bits(u);
    if (std::isnan(x)) continue;
    double want = bf16_ref(x);
    double got = ts_bf16_to_f32(ts_f32_to_bf16(x));
    ASSERT_TRUE(got == want && std::signbit(got) == std::signbit(want))
        << std::hex << "x bits 0x" << u << " got " << got << " want " << want;
  }
}

TEST(Fp16, KnownBitPatterns) {
  EXPECT_EQ(ts_f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(ts_f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(ts_f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(ts_f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(ts_f32_to_f16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(ts_f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(ts_f32_to_f16(65520.0f), 0x7C00);  // tie with 65536 -> even -> inf
  EXPECT_EQ(ts_f32_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(ts_f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(ts_f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(ts_f32_to_f16(-INFINITY), 0xFC00);
  // Ties to even at 1: 1 + 2^-11 -> 1; 1 + 3 * 2^-11 -> 1 + 2^-9 (0x3C02).
  EXPECT_EQ(ts_f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(ts_f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  // Subnormals: smallest 2^-24, largest 1023 * 2^-24, smallest normal 2^-14.
  EXPECT_EQ(ts_f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(ts_f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even 0
  EXPECT_EQ(ts_f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(ts_f32_to_f16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(ts_f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie 1|2 -> 2
  EXPECT_EQ(ts_f32_to_f16(5 * std::ldexp(1.0f, -25)), 0x0002);  // tie 2|3 -> 2
  EXPECT_EQ(ts_f32_to_f16(1023 * std::ldexp(1.0f, -24)), 0x03FF);
  EXPECT_EQ(ts_f32_to_f16(1023.5f * std::ldexp(1.0f, -24)), 0x0400);  // tie -> even
  EXPECT_EQ(ts_f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(ts_f32_to_f16(1e-30f), 0x0000);
  EXPECT_EQ(ts_f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(ts_f16_to_f32(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(ts_f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(ts_f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(ts_f16_to_f32(0xFC00), -INFINITY);
  EXPECT_EQ(ts_f32_bits(ts_f16_to_f32(0x8000)), 0x80000000u);
}

TEST(Fp16, NanStaysQuietNan) {
  EXPECT_EQ(ts_f32_to_f16(from_bits(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(ts_f32_to_f16(from_bits(0xFFC00000u)), 0xFE00);
  EXPECT_EQ(ts_f32_to_f16(from_bits(0x7F800001u)), 0x7E00);  // payload below 10 bits
  EXPECT_TRUE(std::isnan(ts_f16_to_f32(0x7C01)));
  EXPECT_TRUE(std::isnan(ts_f16_to_f32(0x7E00)));
}

TEST(Fp16, AllValuesRoundTripAndDecodeExactly) {
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ts_f16_to_f32((uint16_t)h);
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exp == 31) {
      ASSERT_TRUE(mant ? std::isnan(f) : std::isinf(f)) << h;
    } else {
      double want = exp == 0 ? sign * std::ldexp((double)mant, -24)
                             : sign * std::ldexp(1024.0 + mant, (int)exp - 25);
      ASSERT_EQ((double)f, want) << "fp16 " << h;
    }
    uint16_t back = ts_f32_to_f16(f);
    if (std::isnan(f))
      ASSERT_EQ(back, h | 0x0200u) << "NaN " << h << " must come back quiet, payload kept";
    else
      ASSERT_EQ(back, h) << "fp16 " << h;
  }
}

TEST(Fp16, MatchesIndependentRounding) {
  uint64_t s = 777;
  for (int i = 0; i < (1 << 20); i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(s >> 32);
    // Every other sample lands in fp16's range (2^-26 .. 2^17), the rest anywhere.
    if (i % 2) u = (u & 0x807FFFFFu) | ((uint32_t)(101 + (i >> 1) % 43) << 23);
    float x = from_bits(u);
    if (std::isnan(x)) continue;
    double want = f16_ref(x);
    double got = ts_f16_to_f32(ts_f32_to_f16(x));
    ASSERT_TRUE(got == want && std::signbit(got) == std::signbit(want))
        << std::hex << "x bits 0x" << u << " got " << got << " want " << want;
  }
}

TEST(Silu, ValuesAndLimits) {
  EXPECT_EQ(ts_silu(0.0f), 0.0f);
  // |error| <= 2 ulp: one expf (<= 1 ulp in glibc), one add, one division.
  for (float x : {-3.0f, -0.5f, 0.25f, 1.0f, 4.0f}) {
    double want = x / (1.0 + std::exp(-(double)x));
    EXPECT_NEAR(ts_silu(x), want, 4e-7 * std::fabs(want)) << x;
  }
  EXPECT_EQ(ts_silu(100.0f), 100.0f);
  EXPECT_EQ(ts_silu(-200.0f), 0.0f);  // e^200 overflows to inf: -200 / inf = -0
  EXPECT_FALSE(std::isnan(ts_silu_grad(-200.0f)));
}

TEST(Silu, GradientMatchesFiniteDifferences) {
  for (float x : {-6.0f, -2.0f, -0.3f, 0.0f, 0.7f, 3.0f}) {
    double h = 1e-4;
    auto f = [](double z) { return z / (1.0 + std::exp(-z)); };
    double want = (f(x + h) - f(x - h)) / (2 * h);  // double FD: error ~h^2 ~1e-8
    // Tolerance: a handful of fp32 roundings of an O(1) value (~1e-7 each).
    EXPECT_NEAR(ts_silu_grad(x), want, 1e-6) << x;
  }
}

}  // namespace

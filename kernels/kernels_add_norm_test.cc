// The residual add fused with the norm after it (ts_k_add_rmsnorm_forward,
// ts_k_add_layernorm_forward) on the CPU: every output bit for bit ts_k_add
// followed by the norm's forward (kernels.h's contract, which the models'
// bitwise tests rely on), in fp32, bf16 and fp16, on odd shapes below and
// above the OpenMP thresholds, with res apart from a and b or aliasing
// either; and the front's argument rules. (CUDA against CUDA's unfused ops
// and against the CPU: the parity test's add_*norm_forward cases.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;
using ts_test::Rng;

namespace {

const float kEps = 1e-5f;

enum Alias { kApart, kResIsA, kResIsB };

// The bytes of x stored as dt.
std::vector<unsigned char> Store(const std::vector<float> &x, ts_dtype dt) {
  ts_test::Buf b(x, dt);
  const unsigned char *p = static_cast<const unsigned char *>(b.data());
  return std::vector<unsigned char>(p, p + x.size() * ts_dtype_size(dt));
}

// The bytes of n floats.
std::vector<unsigned char> Bits(const std::vector<float> &x) {
  const unsigned char *p = reinterpret_cast<const unsigned char *>(x.data());
  return std::vector<unsigned char>(p, p + x.size() * sizeof(float));
}

// The index of the first byte where got and want differ; want.size() if none.
size_t FirstDiff(const std::vector<unsigned char> &got, const std::vector<unsigned char> &want) {
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); i++)
    if (got[i] != want[i]) return i;
  return want.size();
}

// One problem: a, b (N, C), weight and bias (C), stored as dt.
struct Problem {
  size_t N, C;
  ts_dtype dt;
  std::vector<unsigned char> a, b, w, bias;
  Problem(size_t n, size_t c, ts_dtype d, Rng &rng) : N(n), C(c), dt(d) {
    a = Store(rng.vec(N * C, -2, 3), dt);
    b = Store(rng.vec(N * C, -1, 1), dt);
    w = Store(rng.vec(C, 0.5f, 1.5f), dt);
    bias = Store(rng.vec(C), dt);
  }
};

// The outputs of one run, every byte poisoned (0xFF: NaN) before it.
struct Outputs {
  std::vector<unsigned char> out, res, mean, rstd;
};

// The fused op (LayerNorm or RMSNorm) on p, res apart or aliasing a or b.
Outputs Fused(const Problem &p, bool layernorm, Alias alias) {
  CpuCtx c;
  std::vector<unsigned char> a = p.a, b = p.b;
  std::vector<float> mean(p.N, NAN), rstd(p.N, NAN);
  Outputs o;
  o.out.assign(a.size(), 0xFF);
  o.res.assign(a.size(), 0xFF);
  void *res = alias == kResIsA ? a.data() : alias == kResIsB ? b.data() : o.res.data();
  ts_status st =
      layernorm
          ? ts_k_add_layernorm_forward(c.get(), o.out.data(), mean.data(), rstd.data(), res,
                                       a.data(), b.data(), p.w.data(), p.bias.data(), p.N, p.C,
                                       kEps, p.dt)
          : ts_k_add_rmsnorm_forward(c.get(), o.out.data(), rstd.data(), res, a.data(), b.data(),
                                     p.w.data(), p.N, p.C, kEps, p.dt);
  EXPECT_EQ(st, TS_OK) << ts_last_error();
  if (alias != kApart) o.res = alias == kResIsA ? a : b;
  o.mean = Bits(mean);
  o.rstd = Bits(rstd);
  return o;
}

// ts_k_add, then the norm's forward, on p.
Outputs Unfused(const Problem &p, bool layernorm) {
  CpuCtx c;
  std::vector<float> mean(p.N, NAN), rstd(p.N, NAN);
  Outputs o;
  o.out.assign(p.a.size(), 0xFF);
  o.res.assign(p.a.size(), 0xFF);
  EXPECT_EQ(ts_k_add(c.get(), o.res.data(), p.a.data(), p.b.data(), p.N * p.C, p.dt), TS_OK);
  ts_status st = layernorm ? ts_k_layernorm_forward(c.get(), o.out.data(), mean.data(),
                                                    rstd.data(), o.res.data(), p.w.data(),
                                                    p.bias.data(), p.N, p.C, kEps, p.dt)
                           : ts_k_rmsnorm_forward(c.get(), o.out.data(), rstd.data(),
                                                  o.res.data(), p.w.data(), p.N, p.C, kEps, p.dt);
  EXPECT_EQ(st, TS_OK) << ts_last_error();
  o.mean = Bits(mean);
  o.rstd = Bits(rstd);
  return o;
}

// Shapes: odd rows and channels, below and above the OpenMP thresholds
// (N * C > 16384) and ts_k_add's 4096-element chunks.
TEST(AddNorm, FusedIsAddThenNormBitForBit) {
  const size_t shapes[][2] = {{7, 37}, {1, 5}, {129, 131}};
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (const auto &shape : shapes)
      for (bool layernorm : {false, true}) {
        Rng rng(shape[0] * 1000 + shape[1] + 7 * (size_t)dt);
        Problem p(shape[0], shape[1], dt, rng);
        Outputs want = Unfused(p, layernorm);
        for (Alias alias : {kApart, kResIsA, kResIsB}) {
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + (layernorm ? " LayerNorm" : " RMSNorm") +
                       " N " + std::to_string(p.N) + " C " + std::to_string(p.C) + " alias " +
                       std::to_string((int)alias));
          Outputs got = Fused(p, layernorm, alias);
          EXPECT_EQ(FirstDiff(got.res, want.res), want.res.size()) << "res";
          EXPECT_EQ(FirstDiff(got.out, want.out), want.out.size()) << "out";
          EXPECT_EQ(FirstDiff(got.rstd, want.rstd), want.rstd.size()) << "rstd";
          // RMSNorm has no mean: both stay poisoned
          EXPECT_EQ(FirstDiff(got.mean, want.mean), want.mean.size()) << "mean";
        }
      }
}

// The norm sees the sum rounded to dt: in bf16, (1 + 2^-7) - 2^-8 = 1 +
// 2^-8 is a tie that rounds to 1 (even), so rows of ones with those two
// at their first element sum to rows of ones, whose LayerNorm is exactly
// the bias (0) and mean exactly 1; normalising the unrounded sum, or a,
// would give about +-1 at the first element.
TEST(AddNorm, TheNormSeesTheRoundedSum) {
  const size_t N = 3, C = 9;
  Rng rng(1);
  Problem p(N, C, TS_BF16, rng);
  std::vector<float> ones(N * C, 1.0f), a = ones, b(N * C, 0.0f);
  for (size_t n = 0; n < N; n++) {
    a[n * C] = 1.0f + std::ldexp(1.0f, -7);
    b[n * C] = -std::ldexp(1.0f, -8);
  }
  p.a = Store(a, TS_BF16);
  p.b = Store(b, TS_BF16);
  p.w = Store(std::vector<float>(C, 1.0f), TS_BF16);
  p.bias = Store(std::vector<float>(C, 0.0f), TS_BF16);
  for (Alias alias : {kApart, kResIsA}) {
    Outputs o = Fused(p, true, alias);
    EXPECT_EQ(FirstDiff(o.res, Store(ones, TS_BF16)), N * C * 2) << "res";
    EXPECT_EQ(FirstDiff(o.out, Store(std::vector<float>(N * C, 0.0f), TS_BF16)), N * C * 2)
        << "out";
    EXPECT_EQ(FirstDiff(o.mean, Bits(std::vector<float>(N, 1.0f))), N * 4) << "mean";
  }
}

void ExpectError(ts_status got, const char *needle) {
  EXPECT_EQ(got, TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find(needle), std::string::npos) << ts_last_error();
}

// res may alias a or b; out none of res, a and b; every pointer is needed;
// a row needs a channel; nothing is written by a rejected call; N == 0
// does nothing.
TEST(AddNorm, ArgumentsAreChecked) {
  CpuCtx c;
  const size_t N = 2, C = 4;
  float a[N * C], b[N * C], out[N * C], res[N * C], w[C], bias[C], m[N], r[N];
  for (size_t i = 0; i < N * C; i++) a[i] = 1.0f + i, b[i] = 0.5f, out[i] = res[i] = -7.0f;
  for (size_t i = 0; i < C; i++) w[i] = 1.0f, bias[i] = 0.0f;
  const ts_dtype f = TS_FP32;
  ExpectError(ts_k_add_rmsnorm_forward(c.get(), res, r, res, a, b, w, N, C, kEps, f),
              "ts_k_add_rmsnorm_forward: out aliases res");
  ExpectError(ts_k_add_rmsnorm_forward(c.get(), a, r, res, a, b, w, N, C, kEps, f),
              "out aliases a");
  ExpectError(ts_k_add_layernorm_forward(c.get(), b, m, r, res, a, b, w, bias, N, C, kEps, f),
              "ts_k_add_layernorm_forward: out aliases b");
  ExpectError(ts_k_add_layernorm_forward(c.get(), out, m, r, res, a, b, w, nullptr, N, C, kEps, f),
              "bias is NULL");
  ExpectError(ts_k_add_rmsnorm_forward(c.get(), out, nullptr, res, a, b, w, N, C, kEps, f),
              "rstd is NULL");
  ExpectError(ts_k_add_layernorm_forward(c.get(), out, m, r, nullptr, a, b, w, bias, N, C, kEps,
                                         f),
              "res is NULL");
  ExpectError(ts_k_add_rmsnorm_forward(c.get(), out, r, res, a, b, w, N, 0, kEps, f), "C = 0");
  ExpectError(ts_k_add_rmsnorm_forward(c.get(), out, r, res, a, b, w, N, C, kEps, (ts_dtype)9),
              "dtype 9");
  for (size_t i = 0; i < N * C; i++) ASSERT_EQ(out[i], -7.0f) << "written by a rejected call";
  for (size_t i = 0; i < N * C; i++) ASSERT_EQ(res[i], -7.0f) << "written by a rejected call";
  EXPECT_EQ(ts_k_add_rmsnorm_forward(c.get(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     0, C, kEps, f),
            TS_OK);
  EXPECT_EQ(ts_k_add_layernorm_forward(c.get(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                       nullptr, nullptr, nullptr, 0, 0, kEps, f),
            TS_OK);
  // in place: res == a, and res == b
  EXPECT_EQ(ts_k_add_rmsnorm_forward(c.get(), out, r, a, a, b, w, N, C, kEps, f), TS_OK);
  EXPECT_EQ(a[N * C - 1], 8.5f);
  EXPECT_EQ(ts_k_add_layernorm_forward(c.get(), out, m, r, b, a, b, w, bias, N, C, kEps, f),
            TS_OK);
  EXPECT_EQ(b[0], 2.0f);
}

// Both ops have a CUDA body: without a GPU they fail in one line with
// TS_ERR_CUDA (not TS_ERR_UNSUPPORTED), after the front's checks.
TEST(AddNorm, CudaBodiesFailCleanlyWithoutAGpu) {
  if (ts_k_device_count(TS_DEVICE_CUDA) > 0) GTEST_SKIP() << "this machine has a GPU";
  ts_kctx cuda;
  std::memset(&cuda, 0, sizeof cuda);
  cuda.device = TS_DEVICE_CUDA;
  float x[8] = {0}, y[8] = {0}, out[8], res[8], w[4] = {1, 1, 1, 1}, m[2], r[2];
  EXPECT_EQ(ts_k_add_rmsnorm_forward(&cuda, out, r, res, x, y, w, 2, 4, kEps, TS_FP32),
            TS_ERR_CUDA);
  EXPECT_NE(std::string(ts_last_error()).find("ts_k_add_rmsnorm_forward (cuda)"),
            std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_add_layernorm_forward(&cuda, out, m, r, res, x, y, w, w, 2, 4, kEps, TS_BF16),
            TS_ERR_CUDA);
  EXPECT_NE(std::string(ts_last_error()).find("ts_k_add_layernorm_forward (cuda)"),
            std::string::npos)
      << ts_last_error();
  ExpectError(ts_k_add_rmsnorm_forward(&cuda, x, r, res, x, y, w, 2, 4, kEps, TS_FP32),
              "out aliases a");
}

}  // namespace

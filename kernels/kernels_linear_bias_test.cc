// ts_k_linear_bias_forward on the CPU (kernels.h, "linear layer"): fp32
// bit for bit ts_k_linear_forward then ts_k_bias_add; bf16 and fp16
// rounded once (exactly, on inputs whose fp32 sums are exact; within half
// an ulp plus the fp32 sum's error on random ones), where the two ops
// apart round twice and fail both checks; the same bits at any thread
// count; and the front's rules. Its _openblas twin runs the fp32 copies'
// path where this CPU has oneDNN for bf16. (CPU vs CUDA: the parity case
// linear_bias_forward.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::Buf;
using ts_test::Rng;
using ts_test::round_to;

namespace {

const ts_dtype kHalf[] = {TS_BF16, TS_FP16};

// The stored bytes of h.
std::vector<unsigned char> Bytes(Buf &h) {
  const unsigned char *p = static_cast<const unsigned char *>(h.data());
  return std::vector<unsigned char>(p, p + h.size() * ts_dtype_size(h.dt));
}

// The outputs of one product with its bias, fused or as the two ops apart.
struct Outs {
  Buf fused, apart;
};

// x (M, K), w (N, K), b (N), stored as dt, through both paths.
Outs Both(const std::vector<float> &x, const std::vector<float> &w, const std::vector<float> &b,
          size_t M, size_t N, size_t K, ts_dtype dt) {
  Buf hx(x, dt), hw(w, dt), hb(b, dt);
  Outs o{Buf(std::vector<float>(M * N, NAN), dt), Buf(std::vector<float>(M * N, NAN), dt)};
  ts_test::CpuCtx c(ts_k_linear_bias_workspace_bytes(TS_DEVICE_CPU, M, N, K, dt));
  EXPECT_EQ(ts_k_linear_bias_workspace_bytes(TS_DEVICE_CPU, M, N, K, dt),
            ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, dt));
  EXPECT_EQ(ts_k_linear_bias_forward(c.get(), o.fused.data(), hx.data(), hw.data(), hb.data(), M,
                                     N, K, dt),
            TS_OK)
      << ts_last_error();
  EXPECT_EQ(ts_k_linear_forward(c.get(), o.apart.data(), hx.data(), hw.data(), M, N, K, dt), TS_OK);
  EXPECT_EQ(ts_k_bias_add(c.get(), o.apart.data(), hb.data(), M, N, dt), TS_OK);
  return o;
}

// fp32: the fp32 sum of the products, then one fp32 addition of the bias,
// either way. Shapes: one tile; several tiles with edges (256 x 256); and
// M >= 2048, where oneDNN's tiles are 512 columns wide.
TEST(LinearBias, Fp32IsLinearThenBiasAddBitForBit) {
  const size_t shapes[][3] = {{7, 5, 19}, {300, 530, 70}, {2100, 600, 16}};
  Rng rng(461);
  for (const auto &s : shapes) {
    const size_t M = s[0], N = s[1], K = s[2];
    auto x = rng.vec(M * K), w = rng.vec(N * K), b = rng.vec(N, -4, 4);
    Outs r = Both(x, w, b, M, N, K, TS_FP32);
    EXPECT_EQ(Bytes(r.fused), Bytes(r.apart)) << M << " x " << N << " x " << K << ": "
                                << ts_k_matmul_impl(TS_DEVICE_CPU, TS_FP32);
  }
}

// Inputs k/8 (|k| < 128), weights integers in [-15, 15], biases k/64
// (|k| < 128), all exact in bf16 and fp16: every product, partial sum (a
// multiple of 1/8 below 96 * 16 * 15 < 2^15) and S + b (a multiple of 1/64
// below 2^15: 21 bits) is exact in fp32 whatever the order, so rounding
// once gives exactly round_dt(S + b), and rounding twice
// round_dt(round_dt(S) + b), which differs wherever S needs more bits than
// dt has and the first rounding moves the second's result.
TEST(LinearBias, HalfIsRoundedOnceExactly) {
  const size_t M = 37, N = 53, K = 96;
  for (ts_dtype dt : kHalf) {
    SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " " + ts_k_matmul_impl(TS_DEVICE_CPU, dt));
    Rng rng(462);
    std::vector<float> x(M * K), w(N * K), b(N);
    for (auto &v : x) v = (float)(rng.below(255) - 127) / 8;
    for (auto &v : w) v = (float)(rng.below(31) - 15);
    for (auto &v : b) v = (float)(rng.below(255) - 127) / 64;
    Outs r = Both(x, w, b, M, N, K, dt);
    std::vector<float> once(M * N), twice(M * N);
    for (size_t m = 0; m < M; m++)
      for (size_t n = 0; n < N; n++) {
        double s = 0;
        for (size_t k = 0; k < K; k++) s += (double)x[m * K + k] * w[n * K + k];
        once[m * N + n] = (float)(s + b[n]);  // exact: the rounding is round_to's
        twice[m * N + n] = round_to({(float)s}, dt)[0] + b[n];
      }
    Buf want(once, dt), old(twice, dt);
    EXPECT_EQ(Bytes(r.fused), Bytes(want));
    EXPECT_EQ(Bytes(r.apart), Bytes(old));  // the two ops apart: the model of two roundings holds
    size_t differ = 0;
    for (size_t i = 0; i < M * N; i++) differ += want.h[i] != old.h[i];
    EXPECT_GT(differ, M * N / 20) << "the inputs must tell one rounding from two";
    std::printf("%s: %zu of %zu outputs differ between one rounding and two\n",
                ts_dtype_name(dt), differ, M * N);
  }
}

// Random inputs: each output within half an ulp of dt at the exact
// x W^T + b (in double), widened by the fp32 error e of the sum of K
// products and the bias' addition: |got - r| <= half_ulp(|r| + e) + e
// (ts_test::linear_bias_bound). Two roundings err up to about an ulp and
// leave it on some outputs.
TEST(LinearBias, HalfIsWithinHalfAnUlpOfTheExactValue) {
  const size_t M = 74, N = 50, K = 96;
  for (ts_dtype dt : kHalf) {
    SCOPED_TRACE(ts_dtype_name(dt));
    Rng rng(463);
    auto x = round_to(rng.vec(M * K), dt), w = round_to(rng.vec(N * K), dt),
         b = round_to(rng.vec(N), dt);
    Outs r = Both(x, w, b, M, N, K, dt);
    std::vector<float> fused = r.fused.get(), apart = r.apart.get();
    std::vector<double> ref, tol;
    ts_test::linear_bias_bound(ref, tol, x, w, b, M, N, K, dt);
    size_t bad = 0, apart_out = 0;
    for (size_t i = 0; i < M * N; i++) {
      if (!(std::fabs(fused[i] - ref[i]) <= tol[i]) && bad++ < 5)
        ADD_FAILURE() << i << ": " << fused[i] << ", exact " << ref[i] << ", bound " << tol[i];
      apart_out += !(std::fabs(apart[i] - ref[i]) <= tol[i]);
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_GT(apart_out, 0u) << "the bound must tell one rounding from two";
  }
}

// Fixed tiles: 1 and 3 threads give the same bits, on every path (600
// rows: three rows of tiles, split unevenly by 3 threads).
TEST(LinearBias, ThreadCountDoesNotChangeTheBits) {
  const size_t M = 600, N = 300, K = 40;
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
    Rng rng(464);
    auto x = rng.vec(M * K), w = rng.vec(N * K), b = rng.vec(N);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    Outs one = Both(x, w, b, M, N, K, dt);
    omp_set_num_threads(3);
    Outs three = Both(x, w, b, M, N, K, dt);
    omp_set_num_threads(saved);
    EXPECT_EQ(Bytes(one.fused), Bytes(three.fused)) << ts_dtype_name(dt);
  }
}

void expect_error(ts_status got, ts_status want, const char *text) {
  EXPECT_EQ(got, want) << ts_last_error();
  EXPECT_NE(std::string(ts_last_error()).find(text), std::string::npos) << ts_last_error();
}

// The front: pointers, aliasing, the workspace and the empty cases, each
// refused call writing nothing; K == 0 gives the bias on every row; the
// CUDA query is linear's plus the bias slot (a pure function: no GPU).
TEST(LinearBias, TheFrontChecksEverythingBeforeWriting) {
  const size_t M = 3, N = 4, K = 5;
  const ts_status bad = TS_ERR_INVALID_ARGUMENT;
  Rng rng(465);
  auto x = rng.vec(M * K), w = rng.vec(N * K), b = rng.vec(N);
  std::vector<float> out(M * N, 7.0f), big(64, 0.0f);
  ts_test::CpuCtx c;
  expect_error(ts_k_linear_bias_forward(c.get(), out.data(), x.data(), w.data(), nullptr, M, N, K,
                                        TS_FP32),
               bad, "ts_k_linear_bias_forward: bias is NULL");
  expect_error(ts_k_linear_bias_forward(c.get(), big.data(), x.data(), w.data(), big.data(), M, N,
                                        K, TS_FP32),
               bad, "out aliases bias");
  expect_error(ts_k_linear_bias_forward(c.get(), big.data(), big.data(), w.data(), b.data(), M, N,
                                        K, TS_FP32),
               bad, "out aliases inp");
  expect_error(ts_k_linear_bias_forward(c.get(), big.data(), x.data(), big.data(), b.data(), M, N,
                                        K, TS_FP32),
               bad, "out aliases weight");
  expect_error(ts_k_linear_bias_forward(nullptr, out.data(), x.data(), w.data(), b.data(), M, N, K,
                                        TS_FP32),
               bad, "ctx is NULL");
  for (float v : out) ASSERT_EQ(v, 7.0f);
  for (float v : big) ASSERT_EQ(v, 0.0f);
  // nothing to do: no pointer needed
  EXPECT_EQ(ts_k_linear_bias_forward(c.get(), nullptr, nullptr, nullptr, nullptr, 0, N, K,
                                     TS_BF16),
            TS_OK);
  // K == 0: 0 + bias on every row, inp and weight not read
  ASSERT_EQ(ts_k_linear_bias_forward(c.get(), out.data(), nullptr, nullptr, b.data(), M, N, 0,
                                     TS_FP32),
            TS_OK)
      << ts_last_error();
  for (size_t i = 0; i < M * N; i++) EXPECT_EQ(out[i], 0.0f + b[i % N]) << i;
  // bf16 on the fp32 copies needs their workspace; oneDNN none
  Buf hx(x, TS_BF16), hw(w, TS_BF16), hb(b, TS_BF16);
  std::vector<uint16_t> hy(M * N, 0x1234);
  size_t need = ts_k_linear_bias_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_BF16);
  ts_test::CpuCtx small(need ? need - 1 : 0);
  ts_status st =
      ts_k_linear_bias_forward(small.get(), hy.data(), hx.data(), hw.data(), hb.data(), M, N, K,
                               TS_BF16);
  if (need) {
    expect_error(st, TS_ERR_OUT_OF_MEMORY, "ts_k_linear_bias_forward: workspace has");
    for (uint16_t h : hy) ASSERT_EQ(h, 0x1234);
  } else {
    EXPECT_EQ(st, TS_OK) << ts_last_error();
  }
  // a plan context checks and writes nothing
  ts_kctx plan = c.ctx;
  plan.flags = TS_K_PLAN;
  std::vector<float> untouched(M * N, 3.0f);
  EXPECT_EQ(ts_k_linear_bias_forward(&plan, untouched.data(), x.data(), w.data(), b.data(), M, N,
                                     K, TS_FP32),
            TS_OK);
  for (float v : untouched) ASSERT_EQ(v, 3.0f);
  // CUDA: cuBLASLt's share plus N elements of dt for a misaligned bias
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    EXPECT_EQ(ts_k_linear_bias_workspace_bytes(TS_DEVICE_CUDA, 8, 768, 3072, dt),
              ts_k_linear_workspace_bytes(TS_DEVICE_CUDA, 8, 768, 3072, dt) +
                  768 * ts_dtype_size(dt));
}

}  // namespace

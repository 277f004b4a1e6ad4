// Every backward of the CPU kernels against central finite differences of
// its forward, in fp32 (the decoder's ops, then the BERT-class encoder's).
//
// Method: the scalar loss is L = sum_i out[i] * w[i] in double, with fixed
// random weights w (so every output element matters, with a different
// weight); backward is fed dout = w. Each input element x is perturbed by
// +-h (h = 1e-2 on O(1) inputs) and dL/dx ~ (L(x+h) - L(x-h)) / (2h).
// Error budget of the estimate: truncation h^2 |L'''| / 6 ~ 2e-5 for O(1)
// third derivatives, plus the fp32 rounding noise of the forward outputs
// (~6e-8 relative each, summed over O(100) outputs -> ~1e-6 in L) divided by
// 2h -> ~5e-5. Hence the checks use |fd - analytic| <= 1e-3 + 1e-3 |analytic|,
// ~10x above that budget, while a wrong term in a backward formula shows up
// as an O(0.1..1) error.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;
using ts_test::dot;
using ts_test::Rng;

namespace {

const float kH = 1e-2f;
const double kAbs = 1e-3, kRel = 1e-3;

// Compares analytic gradient `grad` of input `x` against central differences
// of `loss` (which reads x). `stride` > 1 checks every stride-th element
// (large tensors). Failures name the element; the worst error goes to the test XML.
void check_grad(const char *what, std::vector<float> &x, const std::vector<float> &grad,
                const std::function<double()> &loss, size_t stride = 1) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    float x0 = x[i];
    x[i] = x0 + kH;
    double lp = loss();
    x[i] = x0 - kH;
    double lm = loss();
    x[i] = x0;
    double fd = (lp - lm) / ((double)(x0 + kH) - (double)(x0 - kH));
    double err = std::fabs(fd - grad[i]);
    worst = std::fmax(worst, err);
    EXPECT_LE(err, kAbs + kRel * std::fabs(grad[i]))
        << what << "[" << i << "]: finite difference " << fd << ", backward " << grad[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

// Analytic parameter gradient of an accumulating (+=) backward: runs it on a
// buffer prefilled with `base` and returns the difference.
std::vector<float> accumulated(const std::vector<float> &after, const std::vector<float> &base) {
  std::vector<float> d(after.size());
  for (size_t i = 0; i < d.size(); i++) d[i] = after[i] - base[i];
  return d;
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const size_t M = 6, N = 5, K = 7;
  Rng rng(11);
  auto x = rng.vec(M * K), w = rng.vec(N * K), wl = rng.vec(M * N);
  CpuCtx c;
  std::vector<float> out(M * N);
  auto loss = [&] {
    EXPECT_EQ(ts_k_linear_forward(c.get(), out.data(), x.data(), w.data(), M, N, K, TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  auto dw0 = rng.vec(N * K);  // accumulation target starts non-zero
  std::vector<float> dx(M * K, 123.0f), dw = dw0;
  ASSERT_EQ(ts_k_linear_backward(c.get(), dx.data(), dw.data(), wl.data(), x.data(), w.data(), M, N,
                                 K, TS_FP32),
            TS_OK);
  check_grad("dinp", x, dx, loss);
  check_grad("dweight", w, accumulated(dw, dw0), loss);
  // NULL skips: dweight alone leaves dinp alone.
  std::vector<float> dw2 = dw0;
  ASSERT_EQ(ts_k_linear_backward(c.get(), nullptr, dw2.data(), wl.data(), x.data(), w.data(), M, N,
                                 K, TS_FP32),
            TS_OK);
  EXPECT_EQ(dw2, dw);
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const size_t N = 9, C = 6, V = 5;
  Rng rng(12);
  auto wte = rng.vec(V * C), wl = rng.vec(N * C);
  std::vector<int32_t> tok = {4, 1, 1, 0, 4, 4, 2, 1, 0};  // repeats; token 3 unused
  CpuCtx c;
  std::vector<float> out(N * C);
  auto loss = [&] {
    EXPECT_EQ(ts_k_embedding_forward(c.get(), out.data(), tok.data(), wte.data(), N, C, V, TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  auto d0 = rng.vec(V * C);
  std::vector<float> d = d0;
  ASSERT_EQ(ts_k_embedding_backward(c.get(), d.data(), wl.data(), tok.data(), N, C, V, TS_FP32),
            TS_OK);
  check_grad("dwte", wte, accumulated(d, d0), loss);
  for (size_t j = 0; j < C; j++) EXPECT_EQ(d[3 * C + j], d0[3 * C + j]) << "unused row changed";
}

TEST(Rmsnorm, BackwardMatchesFiniteDifferences) {
  const size_t N = 4, C = 11;
  const float eps = 1e-5f;
  Rng rng(13);
  auto x = rng.vec(N * C), w = rng.vec(C, 0.5f, 1.5f), wl = rng.vec(N * C);
  CpuCtx c;
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    EXPECT_EQ(ts_k_rmsnorm_forward(c.get(), out.data(), rstd.data(), x.data(), w.data(), N, C, eps,
                                   TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  loss();                                       // fills rstd for the backward
  auto dx0 = rng.vec(N * C), dw0 = rng.vec(C);  // both accumulate (+=)
  std::vector<float> dx = dx0, dw = dw0;
  ASSERT_EQ(ts_k_rmsnorm_backward(c.get(), dx.data(), dw.data(), wl.data(), x.data(), w.data(),
                                  rstd.data(), N, C, TS_FP32),
            TS_OK);
  check_grad("dinp", x, accumulated(dx, dx0), loss);
  check_grad("dweight", w, accumulated(dw, dw0), loss);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  const size_t B = 2, T = 5, H = 3, HS = 6;
  const float theta = 500.0f;
  Rng rng(14);
  auto x = rng.vec(B * T * H * HS), wl = rng.vec(x.size());
  CpuCtx c;
  std::vector<float> out(x.size());
  auto loss = [&] {
    EXPECT_EQ(ts_k_rope_forward(c.get(), out.data(), x.data(), B, T, H, HS, theta, TS_FP32), TS_OK);
    return dot(out, wl);
  };
  std::vector<float> dx(x.size());
  ASSERT_EQ(ts_k_rope_backward(c.get(), dx.data(), wl.data(), B, T, H, HS, theta, TS_FP32), TS_OK);
  check_grad("dx", x, dx, loss);
  std::vector<float> inplace = wl;  // in place gives the same bits
  ASSERT_EQ(
      ts_k_rope_backward(c.get(), inplace.data(), inplace.data(), B, T, H, HS, theta, TS_FP32),
      TS_OK);
  EXPECT_EQ(inplace, dx);
}

void check_attention_backward(size_t B, size_t T, size_t NH, size_t NKV, size_t HS, uint64_t seed,
                              size_t stride) {
  Rng rng(seed);
  auto q = rng.vec(B * T * NH * HS), k = rng.vec(B * T * NKV * HS), v = rng.vec(B * T * NKV * HS);
  auto wl = rng.vec(q.size());
  CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
  std::vector<float> out(q.size());
  std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
  auto loss = [&] {
    EXPECT_EQ(ts_k_attention_forward(c.get(), out.data(), state.data(), q.data(), k.data(),
                                     v.data(), B, T, NH, NKV, HS, TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  loss();
  std::vector<float> dq(q.size(), 5.0f), dk(k.size(), 5.0f), dv(v.size(), 5.0f);  // written (=)
  ASSERT_EQ(ts_k_attention_backward(c.get(), dq.data(), dk.data(), dv.data(), wl.data(), out.data(),
                                    q.data(), k.data(), v.data(), state.data(), B, T, NH, NKV, HS,
                                    TS_FP32),
            TS_OK);
  check_grad("dq", q, dq, loss, stride);
  check_grad("dk", k, dk, loss, stride);
  check_grad("dv", v, dv, loss, stride);
}

TEST(Attention, BackwardMatchesFiniteDifferencesGqa) {
  check_attention_backward(2, 5, 4, 2, 6, 15, 1);  // NH = 4 query heads share NKV = 2
}
TEST(Attention, BackwardMatchesFiniteDifferencesSingleKvHead) {
  check_attention_backward(1, 7, 3, 1, 4, 16, 1);
}
TEST(Attention, BackwardMatchesFiniteDifferencesAcrossRowBlocks) {
  check_attention_backward(1, 131, 2, 1, 4, 17, 7);  // T > one 128-row block; every 7th element
}

TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  const size_t n = 300;
  Rng rng(18);
  auto g = rng.vec(n, -4, 4), u = rng.vec(n), wl = rng.vec(n);
  CpuCtx c;
  std::vector<float> h(n);
  auto loss = [&] {
    EXPECT_EQ(ts_k_swiglu_forward(c.get(), h.data(), g.data(), u.data(), n, TS_FP32), TS_OK);
    return dot(h, wl);
  };
  std::vector<float> dg(n), du(n);
  ASSERT_EQ(ts_k_swiglu_backward(c.get(), dg.data(), du.data(), wl.data(), g.data(), u.data(), n,
                                 TS_FP32),
            TS_OK);
  check_grad("dgate", g, dg, loss);
  check_grad("dup", u, du, loss);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const size_t N = 5, V = 13;
  const float dloss = 0.37f;
  Rng rng(19);
  auto x = rng.vec(N * V, -3, 3);
  std::vector<int32_t> y = {2, TS_IGNORE_INDEX, 12, 0, 5};
  CpuCtx c;
  std::vector<float> lr(N);
  auto loss = [&] {  // backward's contract: every row's loss weighs dloss
    EXPECT_EQ(ts_k_cross_entropy_forward(c.get(), lr.data(), x.data(), y.data(), N, V, TS_FP32),
              TS_OK);
    double s = 0;
    for (float l : lr) s += (double)dloss * l;
    return s;
  };
  std::vector<float> dx(N * V, 9.0f);
  ASSERT_EQ(
      ts_k_cross_entropy_backward(c.get(), dx.data(), x.data(), y.data(), N, V, dloss, TS_FP32),
      TS_OK);
  check_grad("dlogits", x, dx, loss);
  for (size_t j = 0; j < V; j++) EXPECT_EQ(dx[1 * V + j], 0.0f) << "ignored row";
  std::vector<float> inplace = x;  // dlogits == logits gives the same bits
  ASSERT_EQ(ts_k_cross_entropy_backward(c.get(), inplace.data(), inplace.data(), y.data(), N, V,
                                        dloss, TS_FP32),
            TS_OK);
  EXPECT_EQ(inplace, dx);
}

// ---- BERT-class encoder ops ----------------------------------------------------

TEST(Layernorm, BackwardMatchesFiniteDifferences) {
  const size_t N = 4, C = 11;
  const float eps = 1e-5f;
  Rng rng(41);
  auto x = rng.vec(N * C, -2, 2), w = rng.vec(C, 0.5f, 1.5f), bias = rng.vec(C),
       wl = rng.vec(N * C);
  CpuCtx c(ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32));
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    EXPECT_EQ(ts_k_layernorm_forward(c.get(), out.data(), mean.data(), rstd.data(), x.data(),
                                     w.data(), bias.data(), N, C, eps, TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  loss();  // fills mean and rstd for the backward
  auto dx0 = rng.vec(N * C), dw0 = rng.vec(C), db0 = rng.vec(C);  // all accumulate (+=)
  std::vector<float> dx = dx0, dw = dw0, db = db0;
  ASSERT_EQ(ts_k_layernorm_backward(c.get(), dx.data(), dw.data(), db.data(), wl.data(), x.data(),
                                    w.data(), mean.data(), rstd.data(), N, C, TS_FP32),
            TS_OK);
  check_grad("dinp", x, accumulated(dx, dx0), loss);
  check_grad("dweight", w, accumulated(dw, dw0), loss);
  check_grad("dbias", bias, accumulated(db, db0), loss);
  // NULL skips each output alone, with the same bits for the others.
  std::vector<float> dx2 = dx0, db2 = db0;
  ASSERT_EQ(ts_k_layernorm_backward(c.get(), dx2.data(), nullptr, nullptr, wl.data(), x.data(),
                                    w.data(), mean.data(), rstd.data(), N, C, TS_FP32),
            TS_OK);
  ASSERT_EQ(ts_k_layernorm_backward(c.get(), nullptr, nullptr, db2.data(), wl.data(), nullptr,
                                    nullptr, nullptr, nullptr, N, C, TS_FP32),
            TS_OK);  // dbias reads dout only
  EXPECT_EQ(dx2, dx);
  EXPECT_EQ(db2, db);
}

TEST(Gelu, BackwardMatchesFiniteDifferencesBothForms) {
  const size_t n = 300;
  for (ts_gelu_kind kind : {TS_GELU_ERF, TS_GELU_TANH}) {
    Rng rng(42);
    auto x = rng.vec(n, -5, 5), wl = rng.vec(n);
    CpuCtx c;
    std::vector<float> y(n);
    auto loss = [&] {
      EXPECT_EQ(ts_k_gelu_forward(c.get(), y.data(), x.data(), n, kind, TS_FP32), TS_OK);
      return dot(y, wl);
    };
    std::vector<float> dx(n, 7.0f);  // written (=)
    ASSERT_EQ(ts_k_gelu_backward(c.get(), dx.data(), wl.data(), x.data(), n, kind, TS_FP32), TS_OK);
    check_grad(kind == TS_GELU_ERF ? "dinp (erf)" : "dinp (tanh)", x, dx, loss);
    std::vector<float> inplace = wl;  // dinp == dout gives the same bits
    ASSERT_EQ(ts_k_gelu_backward(c.get(), inplace.data(), inplace.data(), x.data(), n, kind,
                                 TS_FP32),
              TS_OK);
    EXPECT_EQ(inplace, dx);
  }
}

TEST(Bias, BackwardMatchesFiniteDifferences) {
  const size_t N = 70, C = 9;  // 70 rows: three row blocks of the column sums
  Rng rng(43);
  auto y0 = rng.vec(N * C), bias = rng.vec(C), wl = rng.vec(N * C);
  CpuCtx c(ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32));
  std::vector<float> y;
  auto loss = [&] {
    y = y0;  // the op adds in place
    EXPECT_EQ(ts_k_bias_add(c.get(), y.data(), bias.data(), N, C, TS_FP32), TS_OK);
    return dot(y, wl);
  };
  auto db0 = rng.vec(C);
  std::vector<float> db = db0;
  ASSERT_EQ(ts_k_bias_backward(c.get(), db.data(), wl.data(), N, C, TS_FP32), TS_OK);
  check_grad("dbias", bias, accumulated(db, db0), loss);
}

// Batch row 0 pads keys 2, 4 and 5 (id 0); row 1 pads nothing.
void check_attention_bidir_backward(size_t T, size_t NH, size_t HS, uint64_t seed,
                                    size_t stride) {
  const size_t B = 2;
  const int32_t pad = 0;
  Rng rng(seed);
  std::vector<int32_t> ids(B * T);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = 1 + rng.below(50);
  for (size_t j : {2, 4, 5}) ids[j] = pad;
  auto masked = [&](size_t b, size_t j) { return ids[b * T + j] == pad; };
  auto q = rng.vec(B * T * NH * HS), k = rng.vec(q.size()), v = rng.vec(q.size()),
       wl = rng.vec(q.size());
  CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
  std::vector<float> out(q.size());
  std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
  auto loss = [&] {
    EXPECT_EQ(ts_k_attention_bidir_forward(c.get(), out.data(), state.data(), q.data(), k.data(),
                                           v.data(), ids.data(), pad, B, T, NH, HS, TS_FP32),
              TS_OK);
    return dot(out, wl);
  };
  loss();
  std::vector<float> dq(q.size(), 5.0f), dk(k.size(), 5.0f), dv(v.size(), 5.0f);  // written (=)
  ASSERT_EQ(ts_k_attention_bidir_backward(c.get(), dq.data(), dk.data(), dv.data(), wl.data(),
                                          out.data(), q.data(), k.data(), v.data(), state.data(), B,
                                          T, NH, HS, TS_FP32),
            TS_OK);
  check_grad("dq", q, dq, loss, stride);
  check_grad("dk", k, dk, loss, stride);
  check_grad("dv", v, dv, loss, stride);
  // Masked keys: no gradient at all, from any query (exactly 0, not small).
  for (size_t b = 0; b < B; b++)
    for (size_t j = 0; j < T; j++)
      for (size_t i = 0; i < NH * HS; i++) {
        size_t o = (b * T + j) * NH * HS + i;
        if (masked(b, j)) {
          ASSERT_EQ(dk[o], 0.0f) << "masked key " << j << " of row " << b;
          ASSERT_EQ(dv[o], 0.0f) << "masked key " << j << " of row " << b;
        }
      }
  // ... and their k and v values change neither out nor any gradient
  // (P is exactly 0 there, so their terms are exact zeros).
  loss();  // out of the unperturbed inputs (check_grad left the last perturbed one)
  auto out1 = out, dq1 = dq, dk1 = dk, dv1 = dv;
  for (size_t b = 0; b < B; b++)
    for (size_t j = 0; j < T; j++)
      for (size_t i = 0; masked(b, j) && i < NH * HS; i++) {
        k[(b * T + j) * NH * HS + i] = rng.uniform(-9, 9);
        v[(b * T + j) * NH * HS + i] = rng.uniform(-9, 9);
      }
  loss();
  ASSERT_EQ(ts_k_attention_bidir_backward(c.get(), dq.data(), dk.data(), dv.data(), wl.data(),
                                          out.data(), q.data(), k.data(), v.data(), state.data(), B,
                                          T, NH, HS, TS_FP32),
            TS_OK);
  EXPECT_EQ(out, out1);
  EXPECT_EQ(dq, dq1);
  EXPECT_EQ(dk, dk1);
  EXPECT_EQ(dv, dv1);
}

TEST(AttentionBidir, BackwardMatchesFiniteDifferencesWithPaddedKeys) {
  check_attention_bidir_backward(7, 3, 4, 44, 1);
}
TEST(AttentionBidir, BackwardMatchesFiniteDifferencesAcrossRowBlocks) {
  check_attention_bidir_backward(131, 2, 4, 45, 7);  // T > one 128-row block; every 7th element
}

}  // namespace

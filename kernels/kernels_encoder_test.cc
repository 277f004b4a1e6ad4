// Forward tests of the CPU BERT-class encoder ops (LayerNorm, GELU, bias,
// token types, bidirectional attention) against naive double-precision
// loops and known values, and their error contract: NULL pointers, bad
// shapes and kinds, aliasing, workspace too small, an all-padding batch row.
// (Backward: kernels_grad_test; half storage: kernels_half_test; thread
// counts: kernels_adamw_test; CPU vs CUDA: kernels_parity_test.)
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;
using ts_test::Rng;

namespace {

const double kU = std::ldexp(1.0, -24);  // fp32 unit roundoff

// Expects status `want` and a last error containing `text`.
void expect_error(ts_status got, ts_status want, const char *text) {
  EXPECT_EQ(got, want) << ts_last_error();
  EXPECT_NE(std::string(ts_last_error()).find(text), std::string::npos) << ts_last_error();
}

// ---- LayerNorm ------------------------------------------------------------------

TEST(Layernorm, ForwardMatchesNaive) {
  const size_t N = 5, C = 300;
  const float eps = 1e-5f;
  Rng rng(51);
  auto x = rng.vec(N * C, -3, 3), w = rng.vec(C, 0.5f, 1.5f), b = rng.vec(C);
  for (size_t c = 0; c < C; c++) x[4 * C + c] = 0.75f;  // a constant row: var 0
  for (size_t c = 0; c < C; c++) x[3 * C + c] += 100.0f;  // a far-off mean
  CpuCtx ctx;
  std::vector<float> out(N * C), mean(N), rstd(N);
  ASSERT_EQ(ts_k_layernorm_forward(ctx.get(), out.data(), mean.data(), rstd.data(), x.data(),
                                   w.data(), b.data(), N, C, eps, TS_FP32),
            TS_OK);
  for (size_t n = 0; n < N; n++) {
    double m = 0, var = 0;
    for (size_t c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (size_t c = 0; c < C; c++) var += (x[n * C + c] - m) * (x[n * C + c] - m);
    var /= C;  // biased, as torch.nn.LayerNorm
    double r = 1 / std::sqrt(var + eps), sd = std::sqrt(var + eps);
    // Error budget (recursive fp32 sums of C terms, Higham): the mean is off
    // by at most dm = C u (|m| + 3) (terms of size <= |m| + 3); the centred
    // values by dm + u |x|, so the variance by 2 (dm + u |x|) / sd plus
    // C u of itself, relative: rstd by half that. out adds those times
    // |x - m| |w| and a few roundings of its own. A biased/unbiased mix-up
    // is C / (C - 1) = 3e-3 relative in var; it would fail by 100x.
    double mag = std::fabs(m) + 3, dm = C * kU * mag;
    double drel = (dm + kU * mag) / sd + C * kU;
    EXPECT_NEAR(mean[n], m, dm) << n;
    EXPECT_NEAR(rstd[n], r, drel * r) << n;
    for (size_t c = 0; c < C; c++) {
      double xc = x[n * C + c] - m, ref = xc * r * w[c] + b[c];
      double tol = ((dm + kU * mag) * r + drel * r * std::fabs(xc)) * std::fabs(w[c]) +
                   4 * kU * (std::fabs(ref) + std::fabs(b[c]));
      ASSERT_NEAR(out[n * C + c], ref, tol) << n << ", " << c;
    }
  }
  EXPECT_EQ(mean[4], 0.75f);  // constant row: exact mean, centred values 0,
  EXPECT_FLOAT_EQ(rstd[4], 1 / std::sqrt(eps));
  for (size_t c = 0; c < C; c++) EXPECT_EQ(out[4 * C + c], b[c]);  // out = bias exactly
}

// ---- GELU -------------------------------------------------------------------------

double gelu_ref(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  double k = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad_ref(double x, bool tanh_form) {
  if (!tanh_form)
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
  double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

TEST(Gelu, KnownValues) {
  // torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64)) and with
  // approximate="tanh"; fp32 holds them to half an ulp (2^-25 relative).
  EXPECT_NEAR(ts_gelu_erf(1.0f), 0.8413447460685429, 1e-7);
  EXPECT_NEAR(ts_gelu_tanh(1.0f), 0.8411919906082768, 1e-7);
  EXPECT_EQ(ts_gelu_erf(0.0f), 0.0f);
  EXPECT_EQ(ts_gelu_tanh(0.0f), 0.0f);
  EXPECT_EQ(ts_gelu_erf_grad(0.0f), 0.5f);
  EXPECT_EQ(ts_gelu_tanh_grad(0.0f), 0.5f);
  EXPECT_NEAR(ts_gelu_erf(-1.0f), -0.15865525393145707, 1e-7);
  EXPECT_EQ(ts_gelu_erf(-20.0f), -0.0f);  // 1 + erf -> 0: PyTorch gives -0 too
  EXPECT_EQ(ts_gelu_erf(20.0f), 20.0f);
  // Through the op, both kinds (the tanh form differs from erf's value by 1.5e-4).
  CpuCtx c;
  float x = 1.0f, y = 0;
  ASSERT_EQ(ts_k_gelu_forward(c.get(), &y, &x, 1, TS_GELU_ERF, TS_FP32), TS_OK);
  EXPECT_NEAR(y, 0.8413447460685429, 1e-7);
  ASSERT_EQ(ts_k_gelu_forward(c.get(), &y, &x, 1, TS_GELU_TANH, TS_FP32), TS_OK);
  EXPECT_NEAR(y, 0.8411919906082768, 1e-7);
}

TEST(Gelu, ForwardAndGradientMatchNaiveOverARange) {
  const size_t n = 5000;  // more than one 4096-element chunk
  Rng rng(52);
  auto x = rng.vec(n, -8, 8);
  for (bool tanh_form : {false, true}) {
    ts_gelu_kind kind = tanh_form ? TS_GELU_TANH : TS_GELU_ERF;
    CpuCtx c;
    std::vector<float> y(n), ones(n, 1.0f), g(n);
    ASSERT_EQ(ts_k_gelu_forward(c.get(), y.data(), x.data(), n, kind, TS_FP32), TS_OK);
    ASSERT_EQ(ts_k_gelu_backward(c.get(), g.data(), ones.data(), x.data(), n, kind, TS_FP32),
              TS_OK);
    for (size_t i = 0; i < n; i++) {
      double xi = x[i];
      // A few roundings of |value| plus the fp32 cancellation in 1 + erf
      // (or 1 + tanh, 1 - tanh^2) for large |x|: absolute ~u, multiplied by
      // the factors in front (x/2; the tanh gradient's x (1 + 3 k x^2)).
      double ty = 8 * kU * (std::fabs(gelu_ref(xi, tanh_form)) + std::fabs(xi));
      double tg = 8 * kU * (1 + std::fabs(xi) * (1 + xi * xi));
      ASSERT_NEAR(y[i], gelu_ref(xi, tanh_form), ty) << "x = " << xi;
      ASSERT_NEAR(g[i], gelu_grad_ref(xi, tanh_form), tg) << "x = " << xi;
    }
    std::vector<float> inplace = x;  // out == inp gives the same bits
    ASSERT_EQ(ts_k_gelu_forward(c.get(), inplace.data(), inplace.data(), n, kind, TS_FP32), TS_OK);
    EXPECT_EQ(inplace, y);
  }
}

// ---- bias ---------------------------------------------------------------------------

TEST(Bias, AddIsOneRoundingAndBackwardSumsRows) {
  const size_t N = 333, C = 7;  // 333 rows: 11 row blocks of the column sums
  Rng rng(53);
  auto y0 = rng.vec(N * C), b = rng.vec(C), dy = rng.vec(N * C), db0 = rng.vec(C);
  CpuCtx c(ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32));
  auto y = y0;
  ASSERT_EQ(ts_k_bias_add(c.get(), y.data(), b.data(), N, C, TS_FP32), TS_OK);
  for (size_t i = 0; i < y.size(); i++) ASSERT_EQ(y[i], y0[i] + b[i % C]) << i;  // fp32 add
  auto db = db0;
  ASSERT_EQ(ts_k_bias_backward(c.get(), db.data(), dy.data(), N, C, TS_FP32), TS_OK);
  for (size_t j = 0; j < C; j++) {
    double s = db0[j];
    for (size_t n = 0; n < N; n++) s += dy[n * C + j];
    // fp32: each term passes through at most 31 additions inside its
    // block (<= 32 rows), then 11 block sums and db0: <= (31 + 12) roundings
    // of partial sums bounded by sum |terms| (Higham's recursive-sum bound).
    double mag = std::fabs(db0[j]);
    for (size_t n = 0; n < N; n++) mag += std::fabs(dy[n * C + j]);
    EXPECT_NEAR(db[j], s, 43 * kU * mag) << j;
  }
}

// ---- token types ---------------------------------------------------------------------

TEST(TokenTypes, CountSeparatorsBeforeEachPositionCapped) {
  const int32_t cls = 101, sep = 102, pad = 0;
  std::vector<int32_t> tok = {cls, 5, sep, 7, 8, sep, pad, pad,   // a pair
                              cls, 9, 9, sep, pad, pad, pad, pad,  // one sentence
                              sep, sep, sep, sep, 1, 2, 3, sep};   // more [SEP] than types
  const size_t B = 3, T = 8;
  CpuCtx c;
  std::vector<int32_t> ty(B * T, -7);
  ASSERT_EQ(ts_k_token_types(c.get(), ty.data(), tok.data(), B, T, sep, 2), TS_OK);
  std::vector<int32_t> want2 = {0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1,
                                0, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(ty, want2);
  ASSERT_EQ(ts_k_token_types(c.get(), ty.data(), tok.data(), B, T, sep, 3), TS_OK);
  std::vector<int32_t> want3 = {0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1,
                                0, 1, 2, 2, 2, 2, 2, 2};
  EXPECT_EQ(ty, want3);
  // No separator id, or a single type: all zeros.
  ASSERT_EQ(ts_k_token_types(c.get(), ty.data(), tok.data(), B, T, -1, 2), TS_OK);
  EXPECT_EQ(ty, std::vector<int32_t>(B * T, 0));
  std::fill(ty.begin(), ty.end(), -7);
  ASSERT_EQ(ts_k_token_types(c.get(), ty.data(), tok.data(), B, T, sep, 1), TS_OK);
  EXPECT_EQ(ty, std::vector<int32_t>(B * T, 0));
}

// ---- bidirectional attention -------------------------------------------------------------

// softmax(q k^T / sqrt(HS)) over the keys j with ids[b, j] != pad (all if
// pad < 0), in double: out, and each softmax row's log-sum-exp lse
// (B, NH, T) of the scaled scores of the keys it sees.
void attention_bidir_ref(std::vector<double> &out, std::vector<double> &lse,
                         const std::vector<float> &q, const std::vector<float> &k,
                         const std::vector<float> &v, const std::vector<int32_t> &ids, int32_t pad,
                         size_t B, size_t T, size_t NH, size_t HS) {
  out.assign(B * T * NH * HS, 0);
  lse.assign(B * NH * T, 0);
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < NH; h++)
      for (size_t t = 0; t < T; t++) {
        std::vector<double> s(T, 0);
        double mx = -INFINITY, sum = 0;
        for (size_t j = 0; j < T; j++) {
          if (pad >= 0 && ids[b * T + j] == pad) continue;
          double d = 0;
          for (size_t i = 0; i < HS; i++)
            d += (double)q[((b * T + t) * NH + h) * HS + i] * k[((b * T + j) * NH + h) * HS + i];
          s[j] = d / std::sqrt((double)HS);
          mx = std::fmax(mx, s[j]);
        }
        for (size_t j = 0; j < T; j++)
          if (!(pad >= 0 && ids[b * T + j] == pad)) sum += (s[j] = std::exp(s[j] - mx));
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
        for (size_t j = 0; j < T; j++) {
          if (pad >= 0 && ids[b * T + j] == pad) continue;
          double p = s[j] / sum;
          for (size_t i = 0; i < HS; i++)
            out[((b * T + t) * NH + h) * HS + i] += p * v[((b * T + j) * NH + h) * HS + i];
        }
      }
}

void check_attention_bidir_forward(size_t B, size_t T, size_t NH, size_t HS, int32_t pad,
                                   uint64_t seed) {
  Rng rng(seed);
  auto q = rng.vec(B * T * NH * HS, -2, 2), k = rng.vec(q.size(), -2, 2), v = rng.vec(q.size());
  std::vector<int32_t> ids(B * T);
  for (auto &id : ids) id = rng.below(4);  // ~1/4 of the keys are id 0 (the pad id below)
  for (size_t b = 0; b < B; b++) ids[b * T + b % T] = 7;  // every row keeps a key
  std::vector<float> out(q.size());
  std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32),
                             0xA5);
  ASSERT_EQ(state.size(), B * NH * T * sizeof(float) + B * T);
  CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
  ASSERT_EQ(ts_k_attention_bidir_forward(c.get(), out.data(), state.data(), q.data(), k.data(),
                                         v.data(), ids.data(), pad, B, T, NH, HS, TS_FP32),
            TS_OK)
      << ts_last_error();
  std::vector<double> rout, rlse;
  attention_bidir_ref(rout, rlse, q, k, v, ids, pad, B, T, NH, HS);
  // As the causal test (kernels_test): scores |s| <= 4 sqrt(HS), fp32 dot
  // error ~HS u |s|, the log of a sum over <= T keys adds T u.
  std::vector<float> lse(B * NH * T);
  std::memcpy(lse.data(), state.data(), lse.size() * sizeof(float));
  const double u = 0x1p-24, lse_tol = (HS * 4 * std::sqrt((double)HS) + T + 4) * u;
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], rlse[i], lse_tol) << i;
  // the key flags after them: 1 where the key is seen
  const uint8_t *keep = state.data() + lse.size() * sizeof(float);
  for (size_t i = 0; i < B * T; i++) ASSERT_EQ(keep[i], pad < 0 || ids[i] != pad ? 1 : 0) << i;
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], rout[i], 4e-6) << i;
}

TEST(AttentionBidir, ForwardMatchesNaiveMaskedSoftmax) {
  check_attention_bidir_forward(3, 7, 4, 8, 0, 61);
}
TEST(AttentionBidir, ForwardWithoutPadIdMasksNothing) {
  check_attention_bidir_forward(2, 5, 2, 4, -1, 62);
}
TEST(AttentionBidir, ForwardMatchesNaiveLongerThanOneBlock) {
  check_attention_bidir_forward(1, 300, 2, 16, 0, 63);  // 300 > 2 row blocks of 128
}

TEST(AttentionBidir, AllPaddingRowIsRejectedByNameAndNothingIsWritten) {
  const size_t B = 3, T = 4, NH = 2, HS = 4;
  Rng rng(64);
  auto q = rng.vec(B * T * NH * HS);
  std::vector<int32_t> ids = {5, 0, 6, 0, 0, 0, 0, 0, 1, 1, 1, 1};  // row 1: all padding
  std::vector<float> out(q.size(), 3.0f);
  std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32),
                             0xA5);
  CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
  expect_error(ts_k_attention_bidir_forward(c.get(), out.data(), state.data(), q.data(), q.data(),
                                            q.data(), ids.data(), 0, B, T, NH, HS, TS_FP32),
               TS_ERR_INVALID_ARGUMENT, "batch row 1");
  for (float x : out) ASSERT_EQ(x, 3.0f);
  for (uint8_t x : state) ASSERT_EQ(x, 0xA5);
  // pad_id < 0 masks nothing: the same ids are fine, and ids may be NULL.
  EXPECT_EQ(ts_k_attention_bidir_forward(c.get(), out.data(), state.data(), q.data(), q.data(),
                                         q.data(), nullptr, -1, B, T, NH, HS, TS_FP32),
            TS_OK);
}

// ---- the error contract -------------------------------------------------------------------

TEST(EncoderArgs, BadPointersShapesAndAliasingAreRejected) {
  CpuCtx c(1 << 16);
  float a[64] = {0}, b[64] = {0}, d[64] = {0}, m[8], r[8];
  const ts_status bad = TS_ERR_INVALID_ARGUMENT;
  // LayerNorm
  expect_error(ts_k_layernorm_forward(nullptr, a, m, r, b, d, d, 2, 4, 1e-5f, TS_FP32), bad,
               "ctx is NULL");
  expect_error(ts_k_layernorm_forward(c.get(), a, m, r, b, d, d, 2, 4, 1e-5f, (ts_dtype)9), bad,
               "dtype 9");
  expect_error(ts_k_layernorm_forward(c.get(), a, m, r, b, d, nullptr, 2, 4, 1e-5f, TS_FP32), bad,
               "bias is NULL");
  expect_error(ts_k_layernorm_forward(c.get(), a, m, r, a, d, d, 2, 4, 1e-5f, TS_FP32), bad,
               "out aliases inp");
  expect_error(ts_k_layernorm_forward(c.get(), a, m, r, b, d, d, 2, 0, 1e-5f, TS_FP32), bad,
               "C = 0");
  expect_error(ts_k_layernorm_backward(c.get(), a, d, d + 8, a, b, d, m, r, 2, 4, TS_FP32), bad,
               "dinp aliases dout");
  expect_error(ts_k_layernorm_backward(c.get(), nullptr, d, d, a, b, d, m, r, 2, 4, TS_FP32), bad,
               "dweight aliases dbias");
  expect_error(ts_k_layernorm_backward(c.get(), a, nullptr, nullptr, b, d, nullptr, m, r, 2, 4,
                                       TS_FP32),
               bad, "weight is NULL");
  expect_error(ts_k_layernorm_backward(c.get(), nullptr, d, nullptr, b, d, nullptr, nullptr, r, 2,
                                       4, TS_FP32),
               bad, "mean is NULL");
  // GELU
  expect_error(ts_k_gelu_forward(c.get(), a, b, 4, (ts_gelu_kind)2, TS_FP32), bad, "kind = 2");
  expect_error(ts_k_gelu_backward(c.get(), a, b, nullptr, 4, TS_GELU_ERF, TS_FP32), bad,
               "inp is NULL");
  EXPECT_EQ(ts_k_gelu_backward(c.get(), a, b, a, 4, TS_GELU_TANH, TS_FP32), TS_OK);  // dinp == inp
  // bias
  expect_error(ts_k_bias_add(c.get(), a, a, 2, 4, TS_FP32), bad, "out aliases bias");
  expect_error(ts_k_bias_backward(c.get(), a, a, 2, 4, TS_FP32), bad, "dbias aliases dout");
  expect_error(ts_k_bias_backward(c.get(), nullptr, a, 2, 4, TS_FP32), bad, "dbias is NULL");
  // token types
  int32_t t32[8] = {0}, ty[8];
  expect_error(ts_k_token_types(c.get(), ty, t32, 2, 4, 3, 0), bad, "n_types = 0");
  expect_error(ts_k_token_types(c.get(), t32, t32, 2, 4, 3, 2), bad, "types aliases tokens");
  expect_error(ts_k_token_types(c.get(), ty, nullptr, 2, 4, 3, 2), bad, "tokens is NULL");
  // bidirectional attention
  expect_error(ts_k_attention_bidir_forward(c.get(), a, d, a, b, b, t32, 0, 1, 2, 2, 4, TS_FP32),
               bad, "out aliases q");
  expect_error(ts_k_attention_bidir_forward(c.get(), a, d, b, b, b, nullptr, 0, 1, 2, 2, 4,
                                            TS_FP32),
               bad, "ids is NULL");
  expect_error(ts_k_attention_bidir_forward(c.get(), a, d, b, b, b, t32, 0, 1, 2, 2, 0, TS_FP32),
               bad, "HS = 0");
  expect_error(ts_k_attention_bidir_backward(c.get(), a, a + 16, a + 16, b, b, b, b, b, d, 1, 2,
                                             2, 4, TS_FP32),
               bad, "dk aliases dv");
  expect_error(ts_k_attention_bidir_backward(c.get(), a, a + 16, a + 32, b, b, a, b, b, d, 1, 2,
                                             2, 4, TS_FP32),
               bad, "dq aliases q");
  expect_error(ts_k_attention_bidir_backward(c.get(), a, a + 16, a + 32, b, b, b, b, b, nullptr,
                                             1, 2, 2, 4, TS_FP32),
               bad, "state is NULL");
  // Empty calls do nothing and need nothing.
  EXPECT_EQ(ts_k_layernorm_forward(c.get(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   0, 4, 1e-5f, TS_FP32),
            TS_OK);
  EXPECT_EQ(ts_k_layernorm_backward(c.get(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    nullptr, nullptr, 3, 0, TS_FP32),
            TS_OK);
  EXPECT_EQ(ts_k_gelu_forward(c.get(), nullptr, nullptr, 0, TS_GELU_ERF, TS_FP32), TS_OK);
  EXPECT_EQ(ts_k_bias_add(c.get(), nullptr, nullptr, 0, 4, TS_FP32), TS_OK);
  EXPECT_EQ(ts_k_bias_backward(c.get(), nullptr, nullptr, 3, 0, TS_FP32), TS_OK);
  EXPECT_EQ(ts_k_token_types(c.get(), nullptr, nullptr, 0, 4, 3, 2), TS_OK);
  EXPECT_EQ(ts_k_attention_bidir_forward(c.get(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                         nullptr, 0, 0, 2, 2, 4, TS_FP32),
            TS_OK);
}

TEST(EncoderArgs, SmallWorkspaceReturnsOutOfMemoryAndTouchesNothing) {
  const size_t N = 100, C = 6;  // 4 row blocks of 25 rows
  // Queries: fp32 partial sums, one (2, C) row (LayerNorm) or (C) row (bias)
  // per block of >= 32 rows; nothing for an empty call.
  size_t ln = ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32);
  size_t bias = ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, TS_BF16);
  EXPECT_EQ(ln, 4u * 2 * C * sizeof(float));
  EXPECT_EQ(bias, 4u * C * sizeof(float));
  EXPECT_EQ(ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, 0, C, TS_FP32), 0u);
  EXPECT_EQ(ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, 0, TS_FP32), 0u);
  Rng rng(65);
  auto x = rng.vec(N * C), dy = rng.vec(N * C), w = rng.vec(C);
  std::vector<float> mean(N, 0.0f), rstd(N, 1.0f), dx(N * C, 2.0f), dw(C, 2.0f), db(C, 2.0f);
  CpuCtx small(ln - 1), none(0);
  for (CpuCtx *c : {&small, &none})
    expect_error(ts_k_layernorm_backward(c->get(), dx.data(), dw.data(), db.data(), dy.data(),
                                         x.data(), w.data(), mean.data(), rstd.data(), N, C,
                                         TS_FP32),
                 TS_ERR_OUT_OF_MEMORY, "ts_k_layernorm_backward: workspace has");
  for (float v : dx) ASSERT_EQ(v, 2.0f);
  for (float v : dw) ASSERT_EQ(v, 2.0f);
  for (float v : db) ASSERT_EQ(v, 2.0f);
  ts_test::Buf hdy(dy, TS_BF16);
  std::vector<uint16_t> hdb(C, 0x1234);
  CpuCtx tiny(bias - 1);
  expect_error(ts_k_bias_backward(tiny.get(), hdb.data(), hdy.data(), N, C, TS_BF16),
               TS_ERR_OUT_OF_MEMORY, "needs 96");
  for (uint16_t h : hdb) ASSERT_EQ(h, 0x1234);
  // Bidirectional attention checks the causal op's query.
  const size_t B = 1, T = 6, NH = 2, HS = 4;
  auto q = rng.vec(B * T * NH * HS);
  std::vector<int32_t> ids(B * T, 3);
  std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_BF16));
  ts_test::Buf hq(q, TS_BF16);
  std::vector<uint16_t> hout(q.size(), 0x1234), hdk(q.size()), hdv(q.size());
  CpuCtx att(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_BF16) - 1);
  expect_error(ts_k_attention_bidir_backward(att.get(), hout.data(), hdk.data(), hdv.data(),
                                             hq.data(), hq.data(), hq.data(), hq.data(), hq.data(),
                                             state.data(), B, T, NH, HS, TS_BF16),
               TS_ERR_OUT_OF_MEMORY, "workspace");
  for (uint16_t v : hout) ASSERT_EQ(v, 0x1234);
}

// The CUDA table has bodies for the encoder ops: without a GPU they fail
// cleanly in one line after the front's checks (never TS_ERR_UNSUPPORTED).
TEST(EncoderArgs, CudaBodiesFailCleanlyWithoutAGpu) {
  if (ts_k_device_count(TS_DEVICE_CUDA) > 0) GTEST_SKIP() << "this machine has a GPU";
  ts_kctx cuda;
  std::memset(&cuda, 0, sizeof cuda);
  cuda.device = TS_DEVICE_CUDA;
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
  int32_t tok[8] = {0}, ty[8];
  EXPECT_EQ(ts_k_gelu_forward(&cuda, y, x, 8, TS_GELU_TANH, TS_FP32), TS_ERR_CUDA);
  EXPECT_NE(std::string(ts_last_error()).find("ts_k_gelu_forward (cuda)"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_bias_add(&cuda, y, x, 2, 4, TS_BF16), TS_ERR_CUDA);
  EXPECT_EQ(ts_k_token_types(&cuda, ty, tok, 2, 4, 1, 2), TS_ERR_CUDA);
}

}  // namespace

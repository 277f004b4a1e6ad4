// bf16 and fp16 paths of every CPU op against the fp32 path.
//
// Method: inputs are drawn, rounded to the storage dtype once, and the SAME
// rounded values are fed to the half path and (widened) to the fp32 path, so
// input rounding cancels out and the comparison isolates what the kernel's
// half path adds. By the kernel contract that path widens exactly, computes
// in fp32 and rounds each output to storage once (RNE), so each output may
// differ from fp32 by one rounding: |half - fp32| <= u |fp32|, with unit
// roundoff u = 2^-8 for bf16 (8 significant bits) and 2^-11 for fp16
// (11 bits). Checks allow u |fp32| + 1e-5 max|fp32|: the absolute term covers
// fp32-level differences between the two compiled paths (e.g. a different
// vectorised summation order, ~C 2^-24 relative) — far below u, so a missing
// or doubled rounding, or a wrong widening, still fails.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::Buf;
using ts_test::CpuCtx;
using ts_test::Rng;
using ts_test::round_to;

namespace {

const ts_dtype kHalf[] = {TS_BF16, TS_FP16};

void expect_one_rounding(const char *what, const std::vector<float> &half,
                         const std::vector<float> &ref, ts_dtype dt) {
  ASSERT_EQ(half.size(), ref.size()) << what;
  double u = ts_test::unit_roundoff(dt), scale = ts_test::max_abs(ref);
  for (size_t i = 0; i < ref.size(); i++)
    ASSERT_LE(std::fabs((double)half[i] - ref[i]), u * std::fabs(ref[i]) + 1e-5 * scale)
        << what << "[" << i << "] " << ts_dtype_name(dt) << ": half " << half[i] << ", fp32 "
        << ref[i];
}

TEST(Half, LinearForwardAndBackward) {
  const size_t M = 9, N = 6, K = 13;
  for (ts_dtype dt : kHalf) {
    Rng rng(21);
    auto x = round_to(rng.vec(M * K), dt), w = round_to(rng.vec(N * K), dt),
         dy = round_to(rng.vec(M * N), dt), dw0 = round_to(rng.vec(N * K), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c(ts_k_linear_workspace_bytes(M, N, K, d));
      Buf bx(x, d), bw(w, d), bdy(dy, d), by(std::vector<float>(M * N), d),
          bdx(std::vector<float>(M * K), d), bdw(dw0, d);
      ASSERT_EQ(ts_k_linear_forward(c.get(), by.data(), bx.data(), bw.data(), M, N, K, d), TS_OK);
      ASSERT_EQ(ts_k_linear_backward(c.get(), bdx.data(), bdw.data(), bdy.data(), bx.data(),
                                     bw.data(), M, N, K, d),
                TS_OK);
      res[pass] = {by.get(), bdx.get(), bdw.get()};
    }
    expect_one_rounding("out", res[1][0], res[0][0], dt);
    expect_one_rounding("dinp", res[1][1], res[0][1], dt);
    expect_one_rounding("dweight", res[1][2], res[0][2], dt);
  }
}

TEST(Half, EmbeddingForwardAndBackward) {
  const size_t N = 8, C = 70, V = 6;
  std::vector<int32_t> tok = {5, 0, 5, 2, 5, 1, 0, 3};  // token 5 three times
  for (ts_dtype dt : kHalf) {
    Rng rng(22);
    auto wte = round_to(rng.vec(V * C), dt), dy = round_to(rng.vec(N * C), dt),
         d0 = round_to(rng.vec(V * C), dt);
    CpuCtx c;
    std::vector<float> out32(N * C), d32 = d0;
    ASSERT_EQ(
        ts_k_embedding_forward(c.get(), out32.data(), tok.data(), wte.data(), N, C, V, TS_FP32),
        TS_OK);
    ASSERT_EQ(ts_k_embedding_backward(c.get(), d32.data(), dy.data(), tok.data(), N, C, V, TS_FP32),
              TS_OK);
    Buf bw(wte, dt), bout(std::vector<float>(N * C), dt), bdy(dy, dt), bd(d0, dt);
    ASSERT_EQ(ts_k_embedding_forward(c.get(), bout.data(), tok.data(), bw.data(), N, C, V, dt),
              TS_OK);
    EXPECT_EQ(bout.get(), out32);  // a copy: exact
    ASSERT_EQ(ts_k_embedding_backward(c.get(), bd.data(), bdy.data(), tok.data(), N, C, V, dt),
              TS_OK);
    // Each of a row's k additions rounds to storage (no fp32 scratch): error
    // <= k u sum of |terms| <= k u (|d0| + k max|dy|); k <= 3 here, |.| <= 1.
    auto d = bd.get();
    double u = ts_test::unit_roundoff(dt);
    for (size_t i = 0; i < d.size(); i++)
      ASSERT_LE(std::fabs((double)d[i] - d32[i]), 3 * u * (1 + 3)) << i;
  }
}

TEST(Half, RmsnormForwardAndBackward) {
  const size_t N = 5, C = 40;
  for (ts_dtype dt : kHalf) {
    Rng rng(23);
    auto x = round_to(rng.vec(N * C, -2, 2), dt), w = round_to(rng.vec(C, 0.5f, 1.5f), dt),
         dy = round_to(rng.vec(N * C), dt), dx0 = round_to(rng.vec(N * C), dt),
         dw0 = round_to(rng.vec(C), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c;
      Buf bx(x, d), bw(w, d), bdy(dy, d), by(std::vector<float>(N * C), d), bdx(dx0, d),
          bdw(dw0, d);
      std::vector<float> rstd(N);
      ASSERT_EQ(ts_k_rmsnorm_forward(c.get(), by.data(), rstd.data(), bx.data(), bw.data(), N, C,
                                     1e-5f, d),
                TS_OK);
      ASSERT_EQ(ts_k_rmsnorm_backward(c.get(), bdx.data(), bdw.data(), bdy.data(), bx.data(),
                                      bw.data(), rstd.data(), N, C, d),
                TS_OK);
      res[pass] = {by.get(), bdx.get(), bdw.get(), rstd};
    }
    expect_one_rounding("out", res[1][0], res[0][0], dt);
    expect_one_rounding("dinp", res[1][1], res[0][1], dt);
    expect_one_rounding("dweight", res[1][2], res[0][2], dt);
    // rstd is fp32 in both paths, computed from identical values.
    for (size_t n = 0; n < N; n++) EXPECT_NEAR(res[1][3][n], res[0][3][n], 1e-6 * res[0][3][n]);
  }
}

TEST(Half, RopeForwardAndBackward) {
  const size_t B = 2, T = 6, H = 2, HS = 8;
  for (ts_dtype dt : kHalf) {
    Rng rng(24);
    auto x = round_to(rng.vec(B * T * H * HS), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c;
      Buf bx(x, d), by(x, d), bdx(x, d);
      ASSERT_EQ(ts_k_rope_forward(c.get(), by.data(), bx.data(), B, T, H, HS, 10000.0f, d), TS_OK);
      ASSERT_EQ(ts_k_rope_backward(c.get(), bdx.data(), bx.data(), B, T, H, HS, 10000.0f, d),
                TS_OK);
      res[pass] = {by.get(), bdx.get()};
    }
    expect_one_rounding("out", res[1][0], res[0][0], dt);
    expect_one_rounding("dx", res[1][1], res[0][1], dt);
  }
}

TEST(Half, AttentionForwardAndBackward) {
  const size_t B = 2, T = 7, NH = 4, NKV = 2, HS = 8;
  for (ts_dtype dt : kHalf) {
    Rng rng(25);
    auto q = round_to(rng.vec(B * T * NH * HS), dt), k = round_to(rng.vec(B * T * NKV * HS), dt),
         v = round_to(rng.vec(B * T * NKV * HS), dt), dy = round_to(rng.vec(q.size()), dt);
    // Half forward first: its rounded probs feed both backwards.
    CpuCtx c(ts_k_attention_workspace_bytes(B, T, NH, NKV, HS, dt));
    Buf hq(q, dt), hk(k, dt), hv(v, dt), hout(std::vector<float>(q.size()), dt),
        hp(std::vector<float>(B * NH * T * T), dt), hdy(dy, dt);
    ASSERT_EQ(ts_k_attention_forward(c.get(), hout.data(), hp.data(), hq.data(), hk.data(),
                                     hv.data(), B, T, NH, NKV, HS, dt),
              TS_OK);
    CpuCtx c32(ts_k_attention_workspace_bytes(B, T, NH, NKV, HS, TS_FP32));
    std::vector<float> out(q.size()), p(B * NH * T * T);
    ASSERT_EQ(ts_k_attention_forward(c32.get(), out.data(), p.data(), q.data(), k.data(), v.data(),
                                     B, T, NH, NKV, HS, TS_FP32),
              TS_OK);
    expect_one_rounding("out", hout.get(), out, dt);
    expect_one_rounding("probs", hp.get(), p, dt);
    auto p_half = hp.get();
    Buf hdq(q, dt), hdk(k, dt), hdv(v, dt);
    ASSERT_EQ(
        ts_k_attention_backward(c.get(), hdq.data(), hdk.data(), hdv.data(), hdy.data(), hq.data(),
                                hk.data(), hv.data(), hp.data(), B, T, NH, NKV, HS, dt),
        TS_OK);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    ASSERT_EQ(
        ts_k_attention_backward(c32.get(), dq.data(), dk.data(), dv.data(), dy.data(), q.data(),
                                k.data(), v.data(), p_half.data(), B, T, NH, NKV, HS, TS_FP32),
        TS_OK);
    expect_one_rounding("dq", hdq.get(), dq, dt);
    expect_one_rounding("dk", hdk.get(), dk, dt);
    expect_one_rounding("dv", hdv.get(), dv, dt);
  }
}

TEST(Half, SwigluForwardAndBackward) {
  const size_t n = 5000;  // more than one 4096-element chunk
  for (ts_dtype dt : kHalf) {
    Rng rng(26);
    auto g = round_to(rng.vec(n, -6, 6), dt), u = round_to(rng.vec(n), dt),
         dh = round_to(rng.vec(n), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c;
      Buf bg(g, d), bu(u, d), bdh(dh, d), bh(g, d), bdg(g, d), bdu(g, d);
      ASSERT_EQ(ts_k_swiglu_forward(c.get(), bh.data(), bg.data(), bu.data(), n, d), TS_OK);
      ASSERT_EQ(ts_k_swiglu_backward(c.get(), bdg.data(), bdu.data(), bdh.data(), bg.data(),
                                     bu.data(), n, d),
                TS_OK);
      res[pass] = {bh.get(), bdg.get(), bdu.get()};
    }
    expect_one_rounding("h", res[1][0], res[0][0], dt);
    expect_one_rounding("dgate", res[1][1], res[0][1], dt);
    expect_one_rounding("dup", res[1][2], res[0][2], dt);
  }
}

TEST(Half, CrossEntropyForwardAndBackward) {
  const size_t N = 4, V = 300;
  std::vector<int32_t> y = {7, TS_IGNORE_INDEX, 299, 0};
  for (ts_dtype dt : kHalf) {
    Rng rng(27);
    auto x = round_to(rng.vec(N * V, -5, 5), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c;
      Buf bx(x, d), bdx(x, d);
      std::vector<float> loss(N);
      ASSERT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), bx.data(), y.data(), N, V, d),
                TS_OK);
      ASSERT_EQ(
          ts_k_cross_entropy_backward(c.get(), bdx.data(), bx.data(), y.data(), N, V, 0.25f, d),
          TS_OK);
      res[pass] = {loss, bdx.get()};
    }
    // Losses are fp32 in both paths, from identical logits: fp32-level only
    // (a V-term sum, ~V 2^-24 relative of the log-sum-exp).
    for (size_t n = 0; n < N; n++)
      EXPECT_NEAR(res[1][0][n], res[0][0][n], 1e-5 * (1 + res[0][0][n]));
    expect_one_rounding("dlogits", res[1][1], res[0][1], dt);
  }
}

TEST(Half, AddAndSumsq) {
  const size_t n = 10000;
  for (ts_dtype dt : kHalf) {
    Rng rng(28);
    auto a = round_to(rng.vec(n), dt), b = round_to(rng.vec(n), dt);
    CpuCtx c;
    Buf ba(a, dt), bb(b, dt), bo(a, dt);
    ASSERT_EQ(ts_k_add(c.get(), bo.data(), ba.data(), bb.data(), n, dt), TS_OK);
    auto o = bo.get();
    for (size_t i = 0; i < n; i++) {
      // The kernel adds the widened values in fp32 and rounds once: exactly
      // what this reference computes.
      ASSERT_EQ(o[i], round_to({a[i] + b[i]}, dt)[0]) << i;
    }
    double s_half = 0, s32 = 0;
    ASSERT_EQ(ts_k_sumsq(c.get(), &s_half, ba.data(), n, dt), TS_OK);
    ASSERT_EQ(ts_k_sumsq(c.get(), &s32, a.data(), n, TS_FP32), TS_OK);
    EXPECT_EQ(s_half, s32);  // identical widened values, identical double sums
  }
}

TEST(Half, AdamwGradientsAndParamCopy) {
  const size_t n = 6000;
  for (ts_dtype dt : kHalf) {
    Rng rng(29);
    auto master = rng.vec(n), g = round_to(rng.vec(n), dt);
    std::vector<float> m(n, 0.0f), v(n, 0.0f), m32 = m, v32 = v, master32 = master;
    ts_adamw_hparams hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f};
    CpuCtx c;
    Buf bg(g, dt), bp(master, dt);
    for (int step = 1; step <= 3; step++) {
      hp.step = step;
      ASSERT_EQ(ts_k_adamw(c.get(), master.data(), bp.data(), dt, m.data(), v.data(), bg.data(), dt,
                           n, &hp),
                TS_OK);
      ASSERT_EQ(ts_k_adamw(c.get(), master32.data(), master32.data(), TS_FP32, m32.data(),
                           v32.data(), g.data(), TS_FP32, n, &hp),
                TS_OK);
    }
    // Same widened gradients, same fp32 element math: identical bits.
    EXPECT_EQ(master, master32);
    EXPECT_EQ(m, m32);
    EXPECT_EQ(v, v32);
    EXPECT_EQ(bp.get(), round_to(master, dt));  // param_out is master rounded once
  }
}

}  // namespace

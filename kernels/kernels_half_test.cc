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
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
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
      CpuCtx c(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, d));
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
    CpuCtx c(ts_k_embedding_workspace_bytes(TS_DEVICE_CPU, N, dt));
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
    // A row's additions are summed in fp32 and rounded to storage once.
    expect_one_rounding("dwte", bd.get(), d32, dt);
  }
}

// The bf16/fp16 embedding backward contract (kernels.h), computed in the
// test: per row v and channel c, sum dout[n, c] over the positions n with
// tokens[n] == v in fp32 in position order, then round(d0[v, c] + sum) once.
// Inputs d0 and dy are storage-exact, so the kernel must match bit for bit.
std::vector<float> embedding_backward_ref(const std::vector<float> &d0,
                                          const std::vector<float> &dy,
                                          const std::vector<int32_t> &tok, size_t C, ts_dtype dt) {
  size_t V = d0.size() / C;
  std::vector<float> sum(V * C, 0.0f);
  std::vector<bool> hit(V, false);
  for (size_t n = 0; n < tok.size(); n++) {
    hit[(size_t)tok[n]] = true;
    for (size_t c = 0; c < C; c++) sum[(size_t)tok[n] * C + c] += dy[n * C + c];
  }
  std::vector<float> out = d0;
  for (size_t v = 0; v < V; v++)
    if (hit[v])
      for (size_t c = 0; c < C; c++) out[v * C + c] = d0[v * C + c] + sum[v * C + c];
  return round_to(out, dt);  // rows never hit stay as stored (already exact)
}

// Runs the half embedding backward from d0 and returns dwte widened (exact).
std::vector<float> embedding_backward_half(const std::vector<float> &d0,
                                           const std::vector<float> &dy,
                                           const std::vector<int32_t> &tok, size_t C,
                                           ts_dtype dt) {
  size_t N = tok.size(), V = d0.size() / C;
  CpuCtx c(ts_k_embedding_workspace_bytes(TS_DEVICE_CPU, N, dt));
  Buf bdy(dy, dt), bd(d0, dt);
  EXPECT_EQ(ts_k_embedding_backward(c.get(), bd.data(), bdy.data(), tok.data(), N, C, V, dt),
            TS_OK)
      << ts_last_error();
  return bd.get();
}

TEST(Half, EmbeddingBackwardSumsEachRowInFp32AndRoundsOnce) {
  // 4096 positions over 4 of 5 tokens (~1000 additions per row; row 4 is
  // never hit); C = 70 covers a full and a partial block of 64 channels.
  const size_t N = 4096, C = 70, V = 5;
  for (ts_dtype dt : kHalf) {
    Rng rng(23);
    auto dy = round_to(rng.vec(N * C), dt), d0 = round_to(rng.vec(V * C, -4, 4), dt);
    std::vector<int32_t> tok(N);
    for (auto &t : tok) t = rng.below(4);
    auto got = embedding_backward_half(d0, dy, tok, C, dt);
    auto ref = embedding_backward_ref(d0, dy, tok, C, dt);
    for (size_t i = 0; i < ref.size(); i++)
      ASSERT_EQ(got[i], ref[i]) << "dwte[" << i << "] " << ts_dtype_name(dt);
  }
}

TEST(Half, EmbeddingBackwardSmallAdditionsDoNotVanish) {
  // 256 additions of u/4 into a row holding 1.0 (u = unit roundoff): each
  // alone is below half an ulp of 1 (= u), so rounding after every addition
  // (the old per-addition behaviour, torch's index_add_ on a half tensor)
  // leaves 1.0, while one rounding of the fp32 sum gives 1 + 64u exactly.
  const size_t N = 256, C = 3, V = 2;
  for (ts_dtype dt : kHalf) {
    float u = (float)ts_test::unit_roundoff(dt);
    std::vector<float> d0(V * C, 1.0f), dy(N * C, u / 4);
    std::vector<int32_t> tok(N, 1);
    float per_addition = 1.0f;  // what the old kernel computed
    for (size_t n = 0; n < N; n++) per_addition = round_to({per_addition + u / 4}, dt)[0];
    ASSERT_EQ(per_addition, 1.0f) << ts_dtype_name(dt);
    auto got = embedding_backward_half(d0, dy, tok, C, dt);
    for (size_t c = 0; c < C; c++) {
      EXPECT_EQ(got[c], 1.0f) << "row 0 has no positions";
      EXPECT_EQ(got[C + c], 1.0f + 64 * u) << ts_dtype_name(dt);
      EXPECT_NE(got[C + c], per_addition);
    }
    EXPECT_EQ(got, embedding_backward_ref(d0, dy, tok, C, dt));
  }
}

TEST(Half, EmbeddingBackwardIsThreadIndependent) {
  // Big enough that the sort (N > 65536) and the channel blocks (3 blocks,
  // N C > 65536) both run in parallel; 3 threads split both unevenly.
  const size_t N = 70001, C = 150, V = 37;
  for (ts_dtype dt : kHalf) {
    Rng rng(24);
    auto dy = round_to(rng.vec(N * C), dt), d0 = round_to(rng.vec(V * C), dt);
    std::vector<int32_t> tok(N);
    for (auto &t : tok) t = rng.below((int32_t)V);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    auto one = embedding_backward_half(d0, dy, tok, C, dt);
    omp_set_num_threads(3);
    auto three = embedding_backward_half(d0, dy, tok, C, dt);
    omp_set_num_threads(saved);
    ASSERT_EQ(one.size(), three.size());
    EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)))
        << ts_dtype_name(dt);
    EXPECT_EQ(one, embedding_backward_ref(d0, dy, tok, C, dt)) << ts_dtype_name(dt);
  }
}

TEST(Half, EmbeddingBackwardWorkspaceTooSmall) {
  const size_t N = 10, C = 4, V = 3;
  for (ts_dtype dt : kHalf) {
    std::vector<int32_t> tok(N, 2);
    Buf bdy(std::vector<float>(N * C, 1.0f), dt), bd(std::vector<float>(V * C, 0.5f), dt);
    size_t need = ts_k_embedding_workspace_bytes(TS_DEVICE_CPU, N, dt);
    ASSERT_EQ(need, 2u * 64u);  // two 64-byte-aligned buffers of 10 int32
    auto before = bd.get();
    CpuCtx small(need - 1), none(0);
    for (CpuCtx *c : {&small, &none}) {
      EXPECT_EQ(ts_k_embedding_backward(c->get(), bd.data(), bdy.data(), tok.data(), N, C, V, dt),
                TS_ERR_OUT_OF_MEMORY);
      EXPECT_NE(std::string(ts_last_error()).find("needs 128"), std::string::npos)
          << ts_last_error();
      EXPECT_EQ(bd.get(), before);  // untouched
    }
    CpuCtx exact(need);
    EXPECT_EQ(ts_k_embedding_backward(exact.get(), bd.data(), bdy.data(), tok.data(), N, C, V, dt),
              TS_OK);
    EXPECT_EQ(bd.get()[2 * C], 10.5f);
  }
  // fp32 needs no workspace.
  EXPECT_EQ(ts_k_embedding_workspace_bytes(TS_DEVICE_CPU, N, TS_FP32), 0u);
  std::vector<int32_t> tok(N, 0);
  std::vector<float> dy(N * C, 1.0f), d(V * C, 0.0f);
  CpuCtx none(0);
  EXPECT_EQ(ts_k_embedding_backward(none.get(), d.data(), dy.data(), tok.data(), N, C, V, TS_FP32),
            TS_OK);
  EXPECT_EQ(d[0], 10.0f);
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
    // Half forward first: its rounded output and its state feed both
    // backwards (the state is fp32 log-sum-exps in every dtype).
    size_t state_bytes = ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, dt);
    ASSERT_EQ(state_bytes, ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
    CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, dt));
    Buf hq(q, dt), hk(k, dt), hv(v, dt), hout(std::vector<float>(q.size()), dt), hdy(dy, dt);
    std::vector<uint8_t> hs(state_bytes), s32(state_bytes);
    ASSERT_EQ(ts_k_attention_forward(c.get(), hout.data(), hs.data(), hq.data(), hk.data(),
                                     hv.data(), B, T, NH, NKV, HS, dt),
              TS_OK);
    CpuCtx c32(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
    std::vector<float> out(q.size());
    ASSERT_EQ(ts_k_attention_forward(c32.get(), out.data(), s32.data(), q.data(), k.data(),
                                     v.data(), B, T, NH, NKV, HS, TS_FP32),
              TS_OK);
    expect_one_rounding("out", hout.get(), out, dt);
    // the half path runs the fp32 path on the widened inputs: the same
    // log-sum-exps, bit for bit
    ASSERT_EQ(0, std::memcmp(hs.data(), s32.data(), B * NH * T * sizeof(float)));
    Buf hdq(q, dt), hdk(k, dt), hdv(v, dt);
    ASSERT_EQ(ts_k_attention_backward(c.get(), hdq.data(), hdk.data(), hdv.data(), hdy.data(),
                                      hout.data(), hq.data(), hk.data(), hv.data(), hs.data(), B, T,
                                      NH, NKV, HS, dt),
              TS_OK);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), out_half = hout.get();
    ASSERT_EQ(ts_k_attention_backward(c32.get(), dq.data(), dk.data(), dv.data(), dy.data(),
                                      out_half.data(), q.data(), k.data(), v.data(), hs.data(), B,
                                      T, NH, NKV, HS, TS_FP32),
              TS_OK);
    expect_one_rounding("dq", hdq.get(), dq, dt);
    expect_one_rounding("dk", hdk.get(), dk, dt);
    expect_one_rounding("dv", hdv.get(), dv, dt);
  }
}

// Half attention widens a chunk of batch rows at a time (as many as fit 8
// MiB). At T 256, NH 8, NKV 4, HS 64 a backward row is 3 MiB and a
// forward one 1.5: B 7 runs as chunks 5 + 2 forward and 2 + 2 + 2 + 1
// backward. Every output, the state included, must equal seven one-row
// calls bit for bit (each row's work is the same in any chunk), causal and
// bidirectional (a padded key in row 5).
TEST(Half, AttentionChunksOfRowsEqualRowByRow) {
  const size_t B = 7, T = 256, NH = 8, NKV = 4, HS = 64;
  ASSERT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_BF16),
            (size_t)15 << 19);  // the forward's five rows of 1.5 MiB, not seven
  const ts_dtype dt = TS_BF16;
  Rng rng(41);
  const size_t nq = T * NH * HS, nk = T * NKV * HS;
  auto q = round_to(rng.vec(B * nq), dt), k = round_to(rng.vec(B * nk), dt),
       v = round_to(rng.vec(B * nk), dt), dy = round_to(rng.vec(B * nq), dt);
  std::vector<int32_t> ids(B * T, 3);
  ids[5 * T + 17] = 0;  // the pad id
  for (int bidir : {0, 1}) {
    SCOPED_TRACE(bidir ? "bidirectional" : "causal");
    const size_t kv = bidir ? NH : NKV;  // the bidirectional op is multi-head
    const size_t nkv = T * kv * HS;
    auto kk = bidir ? round_to(rng.vec(B * nkv), dt) : k;
    auto vv = bidir ? round_to(rng.vec(B * nkv), dt) : v;
    auto bytes = [](Buf &x) { return static_cast<const unsigned char *>(x.data()); };
    auto run = [&](size_t b0, size_t nb, std::vector<unsigned char> *res) {
      size_t sb = ts_k_attention_state_bytes(TS_DEVICE_CPU, nb, T, NH, kv, HS, dt);
      CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, nb, T, NH, kv, HS, dt));
      auto part = [&](const std::vector<float> &x, size_t n) {
        return std::vector<float>(x.begin() + b0 * n, x.begin() + (b0 + nb) * n);
      };
      Buf bq(part(q, nq), dt), bk(part(kk, nkv), dt), bv(part(vv, nkv), dt), bdy(part(dy, nq), dt);
      Buf out(std::vector<float>(nb * nq), dt), dq(std::vector<float>(nb * nq), dt),
          dk(std::vector<float>(nb * nkv), dt), dv(std::vector<float>(nb * nkv), dt);
      std::vector<unsigned char> st(sb);
      if (bidir) {
        ASSERT_EQ(ts_k_attention_bidir_forward(c.get(), out.data(), st.data(), bq.data(), bk.data(),
                                               bv.data(), ids.data() + b0 * T, 0, nb, T, NH, HS,
                                               dt),
                  TS_OK);
        ASSERT_EQ(ts_k_attention_bidir_backward(c.get(), dq.data(), dk.data(), dv.data(),
                                                bdy.data(), out.data(), bq.data(), bk.data(),
                                                bv.data(), st.data(), nb, T, NH, HS, dt),
                  TS_OK);
      } else {
        ASSERT_EQ(ts_k_attention_forward(c.get(), out.data(), st.data(), bq.data(), bk.data(),
                                         bv.data(), nb, T, NH, NKV, HS, dt),
                  TS_OK);
        ASSERT_EQ(ts_k_attention_backward(c.get(), dq.data(), dk.data(), dv.data(), bdy.data(),
                                          out.data(), bq.data(), bk.data(), bv.data(), st.data(),
                                          nb, T, NH, NKV, HS, dt),
                  TS_OK);
      }
      // per output: its bytes appended, the log-sum-exps (B NH T fp32) of the state
      res[0].insert(res[0].end(), bytes(out), bytes(out) + nb * nq * 2);
      res[1].insert(res[1].end(), st.begin(), st.begin() + nb * NH * T * 4);
      res[2].insert(res[2].end(), bytes(dq), bytes(dq) + nb * nq * 2);
      res[3].insert(res[3].end(), bytes(dk), bytes(dk) + nb * nkv * 2);
      res[4].insert(res[4].end(), bytes(dv), bytes(dv) + nb * nkv * 2);
    };
    std::vector<unsigned char> all[5], rows[5];
    run(0, B, all);
    for (size_t b = 0; b < B; b++) run(b, 1, rows);
    const char *names[5] = {"out", "log-sum-exps", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) EXPECT_TRUE(all[i] == rows[i]) << names[i];
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

// ---- BERT-class encoder ops ------------------------------------------------------

TEST(Half, LayernormForwardAndBackward) {
  const size_t N = 70, C = 40;  // 70 rows: three row blocks of the column sums
  for (ts_dtype dt : kHalf) {
    Rng rng(71);
    auto x = round_to(rng.vec(N * C, -2, 2), dt), w = round_to(rng.vec(C, 0.5f, 1.5f), dt),
         b = round_to(rng.vec(C), dt), dy = round_to(rng.vec(N * C), dt),
         dx0 = round_to(rng.vec(N * C), dt), dw0 = round_to(rng.vec(C), dt),
         db0 = round_to(rng.vec(C), dt);
    std::vector<std::vector<float>> res[2];
    for (int pass = 0; pass < 2; pass++) {
      ts_dtype d = pass == 0 ? TS_FP32 : dt;
      CpuCtx c(ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, N, C, d));
      Buf bx(x, d), bw(w, d), bb(b, d), bdy(dy, d), by(std::vector<float>(N * C), d), bdx(dx0, d),
          bdw(dw0, d), bdb(db0, d);
      std::vector<float> mean(N), rstd(N);
      ASSERT_EQ(ts_k_layernorm_forward(c.get(), by.data(), mean.data(), rstd.data(), bx.data(),
                                       bw.data(), bb.data(), N, C, 1e-5f, d),
                TS_OK);
      ASSERT_EQ(ts_k_layernorm_backward(c.get(), bdx.data(), bdw.data(), bdb.data(), bdy.data(),
                                        bx.data(), bw.data(), mean.data(), rstd.data(), N, C, d),
                TS_OK);
      res[pass] = {by.get(), bdx.get(), bdw.get(), bdb.get(), mean, rstd};
    }
    expect_one_rounding("out", res[1][0], res[0][0], dt);
    expect_one_rounding("dinp", res[1][1], res[0][1], dt);
    // Column sums: the same fp32 partial sums in the same order from the
    // same widened values, then one rounding: exactly fp32's result rounded.
    EXPECT_EQ(res[1][2], round_to(res[0][2], dt)) << "dweight " << ts_dtype_name(dt);
    EXPECT_EQ(res[1][3], round_to(res[0][3], dt)) << "dbias " << ts_dtype_name(dt);
    // mean and rstd are fp32 in both paths, from identical values.
    for (size_t n = 0; n < N; n++) {
      EXPECT_NEAR(res[1][4][n], res[0][4][n], 1e-6);
      EXPECT_NEAR(res[1][5][n], res[0][5][n], 1e-6 * res[0][5][n]);
    }
  }
}

TEST(Half, GeluAndBiasAreFp32RoundedOnce) {
  const size_t n = 5000, N = 100, C = 50;  // GELU: more than one chunk
  for (ts_dtype dt : kHalf) {
    Rng rng(72);
    auto x = round_to(rng.vec(n, -6, 6), dt), dy = round_to(rng.vec(n), dt);
    for (ts_gelu_kind kind : {TS_GELU_ERF, TS_GELU_TANH}) {
      // Per element, the same fp32 math on the same widened values, then
      // one RNE rounding: the fp32 result rounded, bit for bit.
      CpuCtx c;
      std::vector<float> y32(n), dx32(n);
      ASSERT_EQ(ts_k_gelu_forward(c.get(), y32.data(), x.data(), n, kind, TS_FP32), TS_OK);
      ASSERT_EQ(ts_k_gelu_backward(c.get(), dx32.data(), dy.data(), x.data(), n, kind, TS_FP32),
                TS_OK);
      Buf bx(x, dt), bdy(dy, dt), by(x, dt);
      ASSERT_EQ(ts_k_gelu_forward(c.get(), by.data(), bx.data(), n, kind, dt), TS_OK);
      ASSERT_EQ(ts_k_gelu_backward(c.get(), bdy.data(), bdy.data(), bx.data(), n, kind, dt),
                TS_OK);  // in place over dout
      EXPECT_EQ(by.get(), round_to(y32, dt)) << ts_dtype_name(dt) << " kind " << kind;
      EXPECT_EQ(bdy.get(), round_to(dx32, dt)) << ts_dtype_name(dt) << " kind " << kind;
    }
    auto y0 = round_to(rng.vec(N * C), dt), b = round_to(rng.vec(C), dt),
         g = round_to(rng.vec(N * C), dt), db0 = round_to(rng.vec(C), dt);
    CpuCtx c(ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, dt));
    Buf by(y0, dt), bb(b, dt), bg(g, dt), bdb(db0, dt);
    ASSERT_EQ(ts_k_bias_add(c.get(), by.data(), bb.data(), N, C, dt), TS_OK);
    auto y = by.get();
    for (size_t i = 0; i < y.size(); i++)
      ASSERT_EQ(y[i], round_to({y0[i] + b[i % C]}, dt)[0]) << i;
    std::vector<float> db32 = db0;
    ASSERT_EQ(ts_k_bias_backward(c.get(), db32.data(), g.data(), N, C, TS_FP32), TS_OK);
    ASSERT_EQ(ts_k_bias_backward(c.get(), bdb.data(), bg.data(), N, C, dt), TS_OK);
    EXPECT_EQ(bdb.get(), round_to(db32, dt)) << ts_dtype_name(dt);
  }
}

TEST(Half, AttentionBidirForwardAndBackward) {
  const size_t B = 2, T = 7, NH = 3, HS = 8;
  std::vector<int32_t> ids = {4, 0, 5, 0, 6, 6, 0, 1, 2, 3, 4, 5, 6, 7};  // row 0 pads 3 keys
  for (ts_dtype dt : kHalf) {
    Rng rng(73);
    auto q = round_to(rng.vec(B * T * NH * HS), dt), k = round_to(rng.vec(q.size()), dt),
         v = round_to(rng.vec(q.size()), dt), dy = round_to(rng.vec(q.size()), dt);
    // Half forward first: its rounded output and its state feed both backwards.
    size_t state_bytes = ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, dt);
    CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, dt));
    Buf hq(q, dt), hk(k, dt), hv(v, dt), hout(std::vector<float>(q.size()), dt), hdy(dy, dt);
    std::vector<uint8_t> hs(state_bytes), s32(state_bytes);
    ASSERT_EQ(ts_k_attention_bidir_forward(c.get(), hout.data(), hs.data(), hq.data(), hk.data(),
                                           hv.data(), ids.data(), 0, B, T, NH, HS, dt),
              TS_OK);
    CpuCtx c32(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
    std::vector<float> out(q.size());
    ASSERT_EQ(ts_k_attention_bidir_forward(c32.get(), out.data(), s32.data(), q.data(), k.data(),
                                           v.data(), ids.data(), 0, B, T, NH, HS, TS_FP32),
              TS_OK);
    expect_one_rounding("out", hout.get(), out, dt);
    // the same log-sum-exps and key flags, bit for bit
    ASSERT_EQ(hs, s32);
    Buf hdq(q, dt), hdk(k, dt), hdv(v, dt);
    ASSERT_EQ(ts_k_attention_bidir_backward(c.get(), hdq.data(), hdk.data(), hdv.data(), hdy.data(),
                                            hout.data(), hq.data(), hk.data(), hv.data(), hs.data(),
                                            B, T, NH, HS, dt),
              TS_OK);
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), out_half = hout.get();
    ASSERT_EQ(ts_k_attention_bidir_backward(c32.get(), dq.data(), dk.data(), dv.data(), dy.data(),
                                            out_half.data(), q.data(), k.data(), v.data(),
                                            hs.data(), B, T, NH, HS, TS_FP32),
              TS_OK);
    expect_one_rounding("dq", hdq.get(), dq, dt);
    expect_one_rounding("dk", hdk.get(), dk, dt);
    expect_one_rounding("dv", hdv.get(), dv, dt);
    auto dk_half = hdk.get(), dv_half = hdv.get();
    for (size_t i = 0; i < T * NH * HS; i++)  // batch row 0's masked keys: exactly 0
      if (ids[i / (NH * HS)] == 0) {
        ASSERT_EQ(dk_half[i], 0.0f) << i;
        ASSERT_EQ(dv_half[i], 0.0f) << i;
      }
  }
}

}  // namespace

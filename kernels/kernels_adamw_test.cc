// AdamW against a double-precision transcription of torch.optim.AdamW, and
// the determinism contract: results bitwise independent of the OpenMP
// thread count (sumsq and the ops that reduce across rows or positions);
// the rank-order sum of the device transports (ts_k_sum_ranks).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;
using ts_test::Rng;

namespace {

// torch.optim.AdamW (_single_tensor_adam, maximize=False, amsgrad=False),
// one step, in double.
void adamw_ref(std::vector<double> &p, std::vector<double> &m, std::vector<double> &v,
               const std::vector<float> &grad, const ts_adamw_hparams &hp) {
  double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
  double bc1 = 1 - std::pow(b1, hp.step), bc2 = 1 - std::pow(b2, hp.step);
  for (size_t i = 0; i < p.size(); i++) {
    double g = (double)hp.grad_scale * grad[i];
    p[i] *= 1 - lr * wd;                  // param.mul_(1 - lr * weight_decay)
    m[i] += (1 - b1) * (g - m[i]);        // exp_avg.lerp_(grad, 1 - beta1)
    v[i] = b2 * v[i] + (1 - b2) * g * g;  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
    double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    p[i] -= lr / bc1 * (m[i] / denom);  // param.addcdiv_(exp_avg, denom, -step_size)
  }
}

TEST(Adamw, MatchesTorchTranscriptionOverSeveralSteps) {
  const size_t n = 5000;
  const int steps = 5;
  Rng rng(31);
  auto p0 = rng.vec(n, -2, 2);
  std::vector<float> master = p0, m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p0.begin(), p0.end()), rm(n, 0.0), rv(n, 0.0);
  ts_adamw_hparams hp = {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 0.5f};
  CpuCtx c;
  for (int t = 1; t <= steps; t++) {
    hp.step = t;
    hp.lr = 3e-3f * (float)t / steps;  // a warm-up schedule: lr changes every step
    auto g = rng.vec(n, -3, 3);
    ASSERT_EQ(ts_k_adamw(c.get(), master.data(), nullptr, TS_FP32, m.data(), v.data(), g.data(),
                         TS_FP32, n, &hp),
              TS_OK);
    adamw_ref(rp, rm, rv, g, hp);
  }
  // fp32 vs double: each step rounds p (~2 u |p|) and the update (~10 u of
  // its size, which is <= ~lr / (1 - b1) = 0.03); m and v take ~4 roundings
  // per step of terms as large as |g| <= 1.5 (m can cancel, so its bound is
  // absolute in |g|; v is a sum of squares, so relative). u = 2^-24; bounds
  // summed over the steps, x2 slack.
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < n; i++) {
    ASSERT_NEAR(master[i], rp[i], 2 * steps * (2 * u * std::fabs(rp[i]) + 10 * u * 0.03)) << i;
    ASSERT_NEAR(m[i], rm[i], 2 * steps * 4 * u * (std::fabs(rm[i]) + 1.5)) << i;
    ASSERT_NEAR(v[i], rv[i], 2 * steps * 4 * u * std::fabs(rv[i]) + 1e-12) << i;
  }
  // The update moved the weights (a no-op kernel would fail the checks above
  // only through weight decay; make the size of the step explicit too).
  double moved = 0;
  for (size_t i = 0; i < n; i++) moved = std::fmax(moved, std::fabs((double)master[i] - p0[i]));
  EXPECT_GT(moved, 1e-3);
}

TEST(Adamw, ParamCopyAndAliasing) {
  const size_t n = 100;
  Rng rng(32);
  auto p0 = rng.vec(n), g = rng.vec(n);
  ts_adamw_hparams hp = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f};
  CpuCtx c;
  std::vector<float> a = p0, ma(n, 0), va(n, 0), b = p0, mb(n, 0), vb(n, 0), out(n);
  ASSERT_EQ(ts_k_adamw(c.get(), a.data(), out.data(), TS_FP32, ma.data(), va.data(), g.data(),
                       TS_FP32, n, &hp),
            TS_OK);
  ASSERT_EQ(ts_k_adamw(c.get(), b.data(), b.data(), TS_FP32, mb.data(), vb.data(), g.data(),
                       TS_FP32, n, &hp),
            TS_OK);
  EXPECT_EQ(out, a);
  EXPECT_EQ(b, a);
  // Step 1 of Adam without decay moves each weight by ~lr against its gradient sign.
  for (size_t i = 0; i < n; i++) {
    if (std::fabs(g[i]) > 1e-3f) {
      EXPECT_NEAR(a[i] - p0[i], g[i] > 0 ? -1e-2 : 1e-2, 1e-4) << i;
    }
  }
  EXPECT_EQ(ts_k_adamw(c.get(), a.data(), a.data(), TS_BF16, ma.data(), va.data(), g.data(),
                       TS_FP32, n, &hp),
            TS_ERR_INVALID_ARGUMENT);  // bf16 copy onto the fp32 master
}

// The CPU's AVX2 and AVX-512 bodies (cpu/adamw.c) give the scalar body's
// bits for every pair of gradient and parameter dtypes, with and without
// the parameters' copy, at unaligned starts and lengths that leave tails,
// over three steps, with values that reach the edges: zeros, subnormal and
// huge gradients (v overflows to inf), inf and NaN masters (the bf16 and
// fp16 copies' NaN rule: payloads that plain rounding would carry into the
// exponent), a NaN gradient; and at 1 and 3 threads.
TEST(Adamw, VectorBodiesGiveTheScalarBits) {
  const size_t n = 1061, off = 3;  // 1061 = 66 x 16 + 5: both tails
  const ts_dtype dts[] = {TS_FP32, TS_BF16, TS_FP16};
  int best = ts_cpu_adamw_isa_max, chosen = ts_cpu_adamw_isa, saved_threads = omp_get_max_threads();
  if (best == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  Rng rng(47);
  std::vector<float> p0 = rng.vec(n + off, -2.0f, 2.0f), g0 = rng.vec(n + off, -3.0f, 3.0f);
  for (size_t i = 0; i < n + off; i += 13) g0[i] = 0.0f;
  for (size_t i = 5; i < n + off; i += 31) g0[i] = 1e-40f;  // subnormal
  for (size_t i = 7; i < n + off; i += 37) g0[i] = 3e30f;   // g^2 overflows: v = inf
  g0[100] = NAN;
  p0[200] = INFINITY;
  p0[201] = -INFINITY;
  p0[202] = NAN;
  p0[203] = ts_bits_f32(0xffffffffu);  // NaNs whose low bits would carry in plain RNE
  p0[205] = ts_bits_f32(0x7fc0ffffu);
  p0[204] = 3.3e38f;
  struct Out {
    std::vector<float> master, m, v;
    std::vector<uint8_t> param;
  };
  auto run = [&](int isa, ts_dtype gdt, ts_dtype pdt, bool copy, int threads) {
    ts_cpu_adamw_isa = isa;
    omp_set_num_threads(threads);
    Out o{p0, std::vector<float>(n + off, 0.0f), std::vector<float>(n + off, 0.0f),
          std::vector<uint8_t>((n + off) * 4, 0)};
    std::vector<uint8_t> grad((n + off) * 4);
    for (size_t i = 0; i < n + off; i++) {
      if (gdt == TS_FP32) std::memcpy(&grad[4 * i], &g0[i], 4);
      uint16_t h = gdt == TS_BF16 ? ts_f32_to_bf16(g0[i]) : ts_f32_to_f16(g0[i]);
      if (gdt != TS_FP32) std::memcpy(&grad[2 * i], &h, 2);
    }
    size_t ge = ts_dtype_size(gdt), pe = ts_dtype_size(pdt);
    CpuCtx c;
    for (int step = 1; step <= 3; step++) {
      ts_adamw_hparams hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, step == 2 ? 0.5f : 1.0f};
      EXPECT_EQ(ts_k_adamw(c.get(), o.master.data() + off, copy ? o.param.data() + off * pe : nullptr,
                           pdt, o.m.data() + off, o.v.data() + off, grad.data() + off * ge, gdt, n,
                           &hp),
                TS_OK);
    }
    ts_cpu_adamw_isa = chosen;
    omp_set_num_threads(saved_threads);
    return o;
  };
  auto same = [](const Out &a, const Out &b) {
    return a.master.size() == b.master.size() &&
           std::memcmp(a.master.data(), b.master.data(), a.master.size() * 4) == 0 &&
           std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4) == 0 &&
           std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4) == 0 && a.param == b.param;
  };
  for (ts_dtype gdt : dts)
    for (ts_dtype pdt : dts)
      for (bool copy : {false, true}) {
        if (!copy && pdt != TS_FP32) continue;  // no copy: the masters are the parameters
        SCOPED_TRACE("grad " + std::to_string(gdt) + " param " + std::to_string(pdt) + " copy " +
                     std::to_string(copy));
        Out scalar = run(0, gdt, pdt, copy, 1);
        bool changed = false;
        for (size_t i = off; i < n + off && !changed; i++) changed = scalar.master[i] != p0[i];
        EXPECT_TRUE(changed);
        for (int isa = 1; isa <= best; isa++) {
          EXPECT_TRUE(same(scalar, run(isa, gdt, pdt, copy, 1))) << "isa " << isa << ", 1 thread";
          EXPECT_TRUE(same(scalar, run(isa, gdt, pdt, copy, 3))) << "isa " << isa << ", 3 threads";
        }
      }
}

// Runs fn with 1 thread and with 3 threads and expects identical bytes.
void expect_thread_independent(const char *what, const std::function<std::vector<float>()> &fn) {
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = fn();
  omp_set_num_threads(3);  // uneven split of every loop
  auto three = fn();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), three.size());
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float))) << what;
}

TEST(Determinism, SumsqIsBitwiseEqualAcrossThreadCounts) {
  const size_t n = 3 * 1000 * 1000 + 7;  // 733 chunks: 256 groups of uneven size
  Rng rng(33);
  auto x = rng.vec(n);
  CpuCtx c;
  double s1 = 0, s2 = 0;
  omp_set_num_threads(1);
  ASSERT_EQ(ts_k_sumsq(c.get(), &s1, x.data(), n, TS_FP32), TS_OK);
  omp_set_num_threads(2);
  ASSERT_EQ(ts_k_sumsq(c.get(), &s2, x.data(), n, TS_FP32), TS_OK);
  EXPECT_EQ(0, std::memcmp(&s1, &s2, sizeof s1));
  long double ref = 0;
  for (float v : x) ref += (long double)v * v;
  // double partial sums of exact squares: relative error ~ (chunk depth) 2^-53.
  EXPECT_NEAR(s1, (double)ref, 1e-12 * (double)ref);
}

TEST(Determinism, ReductionsAreBitwiseEqualAcrossThreadCounts) {
  Rng rng(34);
  {
    const size_t N = 300, C = 200, V = 17;  // embedding backward: repeated tokens
    auto dy = rng.vec(N * C);
    std::vector<int32_t> tok(N);
    for (auto &t : tok) t = rng.below((int32_t)V);
    expect_thread_independent("embedding backward", [&] {
      std::vector<float> d(V * C, 0.0f);
      CpuCtx c;
      EXPECT_EQ(ts_k_embedding_backward(c.get(), d.data(), dy.data(), tok.data(), N, C, V, TS_FP32),
                TS_OK);
      return d;
    });
  }
  {
    const size_t N = 257, C = 300;  // rmsnorm backward: dweight reduces over rows
    auto x = rng.vec(N * C), w = rng.vec(C), dy = rng.vec(N * C);
    expect_thread_independent("rmsnorm backward", [&] {
      CpuCtx c;
      std::vector<float> y(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
      EXPECT_EQ(ts_k_rmsnorm_forward(c.get(), y.data(), rstd.data(), x.data(), w.data(), N, C,
                                     1e-6f, TS_FP32),
                TS_OK);
      EXPECT_EQ(ts_k_rmsnorm_backward(c.get(), dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                      rstd.data(), N, C, TS_FP32),
                TS_OK);
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), dw.begin(), dw.end());
      return y;
    });
  }
  {
    const size_t B = 2, T = 150, NH = 4, NKV = 2, HS = 16;  // attention: GQA heads accumulate
    auto q = rng.vec(B * T * NH * HS), k = rng.vec(B * T * NKV * HS), v = rng.vec(k.size()),
         dy = rng.vec(q.size());
    expect_thread_independent("attention", [&] {
      CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
      std::vector<float> out(q.size()), p(B * NH * T * T), dq(q.size()), dk(k.size()), dv(k.size());
      EXPECT_EQ(ts_k_attention_forward(c.get(), out.data(), p.data(), q.data(), k.data(), v.data(),
                                       B, T, NH, NKV, HS, TS_FP32),
                TS_OK);
      EXPECT_EQ(
          ts_k_attention_backward(c.get(), dq.data(), dk.data(), dv.data(), dy.data(), out.data(), q.data(),
                                  k.data(), v.data(), p.data(), B, T, NH, NKV, HS, TS_FP32),
          TS_OK);
      for (auto *t : {&p, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
      return out;
    });
  }
  {
    const size_t N = 1000, C = 300;  // LayerNorm backward: 32 row blocks, split unevenly
    auto x = rng.vec(N * C, -2, 2), w = rng.vec(C), bias = rng.vec(C), dy = rng.vec(N * C);
    expect_thread_independent("layernorm backward", [&] {
      CpuCtx c(ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32));
      std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
      EXPECT_EQ(ts_k_layernorm_forward(c.get(), y.data(), mean.data(), rstd.data(), x.data(),
                                       w.data(), bias.data(), N, C, 1e-5f, TS_FP32),
                TS_OK);
      EXPECT_EQ(ts_k_layernorm_backward(c.get(), dx.data(), dw.data(), db.data(), dy.data(),
                                        x.data(), w.data(), mean.data(), rstd.data(), N, C,
                                        TS_FP32),
                TS_OK);
      for (auto *t : {&mean, &rstd, &dx, &dw, &db}) y.insert(y.end(), t->begin(), t->end());
      return y;
    });
    expect_thread_independent("bias backward", [&] {
      CpuCtx c(ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, TS_FP32));
      std::vector<float> db(C, 0.5f);
      EXPECT_EQ(ts_k_bias_backward(c.get(), db.data(), dy.data(), N, C, TS_FP32), TS_OK);
      return db;
    });
  }
  {
    // Bidirectional attention, keys padded. Every product here stays at or
    // below M N K = 2^18 multiply-adds, where OpenBLAS runs it on one
    // thread: above that, its multi-threaded partitioning changes the bits
    // on some CPUs (kernels.h, "Determinism"), which is OpenBLAS's, not this
    // op's. (The causal case above: 128 x 128 x 16 = 2^18.)
    const size_t B = 2, T = 100, NH = 4, HS = 16;
    auto q = rng.vec(B * T * NH * HS), k = rng.vec(q.size()), v = rng.vec(q.size()),
         dy = rng.vec(q.size());
    std::vector<int32_t> ids(B * T);
    for (auto &id : ids) id = rng.below(3);  // pad id 0: ~1/3 of the keys
    ids[0] = ids[T] = 1;
    expect_thread_independent("bidirectional attention", [&] {
      CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NH, HS, TS_FP32));
      std::vector<float> out(q.size()), p(B * NH * T * T), dq(q.size()), dk(q.size()),
          dv(q.size());
      EXPECT_EQ(ts_k_attention_bidir_forward(c.get(), out.data(), p.data(), q.data(), k.data(),
                                             v.data(), ids.data(), 0, B, T, NH, HS, TS_FP32),
                TS_OK);
      EXPECT_EQ(ts_k_attention_bidir_backward(c.get(), dq.data(), dk.data(), dv.data(), dy.data(),
                                              out.data(), q.data(), k.data(), v.data(), p.data(),
                                              B, T, NH, HS, TS_FP32),
                TS_OK);
      for (auto *t : {&p, &dq, &dk, &dv}) out.insert(out.end(), t->begin(), t->end());
      return out;
    });
  }
  {
    const size_t N = 64, V = 1000;  // cross-entropy rows
    auto x = rng.vec(N * V, -4, 4);
    std::vector<int32_t> y(N);
    for (auto &t : y) t = rng.below((int32_t)V);
    expect_thread_independent("cross-entropy", [&] {
      CpuCtx c;
      std::vector<float> loss(N), dx(N * V);
      EXPECT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), x.data(), y.data(), N, V, TS_FP32),
                TS_OK);
      EXPECT_EQ(ts_k_cross_entropy_backward(c.get(), dx.data(), x.data(), y.data(), N, V, 1.0f / N,
                                            TS_FP32),
                TS_OK);
      loss.insert(loss.end(), dx.begin(), dx.end());
      return loss;
    });
  }
}

// out = ((p0 + p1) + ... + p_{n-1}) [+ out], one fp32 rounding per addition
// in index order and one narrowing at the end (comm/sum.h's order), written
// element by element here; volatile keeps each addition a separate IEEE
// rounding.
std::vector<float> sum_ranks_ref(const std::vector<std::vector<float>> &parts,
                                 const std::vector<float> &prev, int accumulate, ts_dtype dt) {
  std::vector<float> out(parts[0].size());
  for (size_t i = 0; i < out.size(); i++) {
    volatile float acc = parts[0][i];
    for (size_t k = 1; k < parts.size(); k++) acc = acc + parts[k][i];
    if (accumulate) acc = acc + prev[i];
    out[i] = ts_test::round_to({acc}, dt)[0];
  }
  return out;
}

// The rank-order sum on the CPU: the reference's bits for 1, 2, 3 and 5
// parts, with and without the previous out, out aliasing a part, every
// dtype, at 1 and 3 threads. Values span 2^-10 .. 2^10 with both signs, so
// another order or a rounding per addition in bf16 would change bits (the
// chained ts_k_add of the last block shows one that does).
TEST(SumRanks, RankOrderInFp32RoundedOnceAtAnyThreadCount) {
  const size_t count = 3 * 4096 + 77;
  Rng rng(7);
  const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (ts_dtype dt : all)
    for (int n : {1, 2, 3, 5})
      for (int accumulate : {0, 1})
        for (int alias : {0, 1}) {
          if (alias && n < 2) continue;
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " n=" + std::to_string(n) + " accumulate=" +
                       std::to_string(accumulate) + " alias=" + std::to_string(alias));
          std::vector<std::vector<float>> parts(n);
          for (auto &p : parts) {
            p = rng.vec(count, -1, 1);
            for (auto &x : p) x = std::ldexp(x, (int)rng.below(21) - 10);
            if (dt == TS_FP16)
              for (auto &x : p) x = std::fmax(-60000.0f, std::fmin(60000.0f, x));
            p = ts_test::round_to(p, dt);
          }
          std::vector<float> prev = ts_test::round_to(rng.vec(count, -4, 4), dt);
          // the previous out is parts[1] when aliased
          std::vector<float> want = sum_ranks_ref(parts, alias ? parts[1] : prev, accumulate, dt);
          expect_thread_independent("sum_ranks", [&] {
            std::vector<ts_test::Buf> bufs;
            for (auto &p : parts) bufs.emplace_back(p, dt);
            ts_test::Buf out(prev, dt);
            std::vector<const void *> ptrs;
            for (auto &b : bufs) ptrs.push_back(b.data());
            void *dst = alias ? bufs[1].data() : out.data();
            CpuCtx c;
            EXPECT_EQ(ts_k_sum_ranks(c.get(), dst, ptrs.data(), n, count, dt, accumulate), TS_OK)
                << ts_last_error();
            std::vector<float> got = alias ? bufs[1].get() : out.get();
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), count * sizeof(float)));
            return got;
          });
        }
  // bf16: three parts summed by chained pairwise adds (a rounding per
  // addition, as a ring of bf16 additions does) differ from the one rounding
  std::vector<std::vector<float>> parts = {{1.0f}, {0x1p-8f}, {0x1p-8f}};
  for (auto &p : parts) p = ts_test::round_to(p, TS_BF16);
  std::vector<ts_test::Buf> b;
  for (auto &p : parts) b.emplace_back(p, TS_BF16);
  const void *ptrs[] = {b[0].data(), b[1].data(), b[2].data()};
  ts_test::Buf once({0.0f}, TS_BF16), chained({0.0f}, TS_BF16);
  CpuCtx c;
  ASSERT_EQ(ts_k_sum_ranks(c.get(), once.data(), ptrs, 3, 1, TS_BF16, 0), TS_OK);
  ASSERT_EQ(ts_k_add(c.get(), chained.data(), ptrs[0], ptrs[1], 1, TS_BF16), TS_OK);
  ASSERT_EQ(ts_k_add(c.get(), chained.data(), chained.data(), ptrs[2], 1, TS_BF16), TS_OK);
  EXPECT_EQ(once.get()[0], 1.0f + 0x1p-7f);  // 1 + 2^-7 is a bf16 value
  EXPECT_EQ(chained.get()[0], 1.0f);         // 1 + 2^-8 rounds to even (1) twice
  // the refusals
  float x = 0;
  const void *one[] = {&x};
  const void *with_null[] = {&x, nullptr};
  EXPECT_EQ(ts_k_sum_ranks(c.get(), &x, one, 0, 1, TS_FP32, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_k_sum_ranks(c.get(), &x, one, TS_K_SUM_RANKS_MAX + 1, 1, TS_FP32, 0),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_k_sum_ranks(c.get(), &x, with_null, 2, 1, TS_FP32, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("parts[1] is NULL"), std::string::npos);
  EXPECT_EQ(ts_k_sum_ranks(c.get(), &x, nullptr, 1, 1, TS_FP32, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_k_sum_ranks(c.get(), nullptr, nullptr, 1, 0, TS_FP32, 0), TS_OK);  // empty
}

}  // namespace

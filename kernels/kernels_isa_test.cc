// The CPU backend's elementwise bodies, compiled for AVX-512, AVX2 and
// baseline x86-64 (cpu_common.h TS_CPU_CLONES, chosen by ts_cpu_isa), give
// the same bits: every op that dispatches on ts_cpu_isa runs at each tier
// this CPU has and at 1 and 3 threads, in fp32, bf16 and fp16, and every
// output is compared byte for byte with the baseline body's at 1 thread.
// Lengths leave tails past the 16 partial sums (C = 200 = 12 x 16 + 8),
// cross a widening piece (V = 1100 > 1024) and a key block (T = 150 > 128),
// so a body that summed in its own vector width, or fused a multiply-add,
// would differ here.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

namespace {

using ts_test::CpuCtx;
using ts_test::Rng;

// x's values stored in dt (ts_test::Buf's rounding), as bytes.
std::vector<uint8_t> Store(const std::vector<float> &x, ts_dtype dt) {
  ts_test::Buf b(x, dt);
  const uint8_t *p = static_cast<const uint8_t *>(b.data());
  return std::vector<uint8_t>(p, p + b.size() * ts_dtype_size(dt));
}

// Every output of the cloned ops, from one run, as named byte strings.
using Outputs = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T> &v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Outputs RunOps(ts_dtype dt) {
  const size_t es = ts_dtype_size(dt);
  Rng rng(2026);
  Outputs out;
  auto keep = [&](const char *name, std::vector<uint8_t> v) {
    out.emplace_back(name, std::move(v));
  };
  {  // elementwise: swiglu, add
    const size_t n = 3 * 4096 + 77;
    auto g = Store(rng.vec(n, -9, 9), dt), u = Store(rng.vec(n), dt),
         d = Store(rng.vec(n, -1e-3f, 1e-3f), dt);
    std::vector<uint8_t> h(n * es), dg(n * es), du(n * es), s(n * es);
    CpuCtx c;
    EXPECT_EQ(ts_k_swiglu_forward(c.get(), h.data(), g.data(), u.data(), n, dt), TS_OK);
    EXPECT_EQ(
        ts_k_swiglu_backward(c.get(), dg.data(), du.data(), d.data(), g.data(), u.data(), n, dt),
        TS_OK);
    EXPECT_EQ(ts_k_add(c.get(), s.data(), g.data(), u.data(), n, dt), TS_OK);
    keep("swiglu h", h), keep("swiglu dgate", dg), keep("swiglu dup", du), keep("add", s);
    for (ts_gelu_kind kind : {TS_GELU_ERF, TS_GELU_TANH}) {
      EXPECT_EQ(ts_k_gelu_forward(c.get(), h.data(), g.data(), n, kind, dt), TS_OK);
      EXPECT_EQ(ts_k_gelu_backward(c.get(), dg.data(), d.data(), g.data(), n, kind, dt), TS_OK);
      keep(kind == TS_GELU_ERF ? "gelu erf out" : "gelu tanh out", h);
      keep(kind == TS_GELU_ERF ? "gelu erf dinp" : "gelu tanh dinp", dg);
    }
  }
  {  // norms, bias, RoPE over N rows of C channels
    const size_t N = 37, C = 200, B = 1, T = 37, H = 5, HS = 40;  // H * HS = C
    auto x = Store(rng.vec(N * C, -3, 3), dt), w = Store(rng.vec(C, 0.5f, 1.5f), dt),
         bias = Store(rng.vec(C), dt), dy = Store(rng.vec(N * C), dt);
    std::vector<uint8_t> y(N * C * es), dx = Store(rng.vec(N * C), dt), dw = Store(rng.vec(C), dt),
                                        db = Store(rng.vec(C), dt);
    std::vector<float> mean(N), rstd(N);
    CpuCtx c(ts_k_layernorm_workspace_bytes(TS_DEVICE_CPU, N, C, dt) +
             ts_k_bias_workspace_bytes(TS_DEVICE_CPU, N, C, dt));
    EXPECT_EQ(
        ts_k_rmsnorm_forward(c.get(), y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, dt),
        TS_OK);
    keep("rmsnorm out", y), keep("rmsnorm rstd", Bytes(rstd));
    EXPECT_EQ(ts_k_rmsnorm_backward(c.get(), dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                    rstd.data(), N, C, dt),
              TS_OK);
    keep("rmsnorm dinp", dx), keep("rmsnorm dweight", dw);
    EXPECT_EQ(ts_k_layernorm_forward(c.get(), y.data(), mean.data(), rstd.data(), x.data(),
                                     w.data(), bias.data(), N, C, 1e-5f, dt),
              TS_OK);
    keep("layernorm out", y), keep("layernorm mean", Bytes(mean)),
        keep("layernorm rstd", Bytes(rstd));
    EXPECT_EQ(ts_k_layernorm_backward(c.get(), dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                      w.data(), mean.data(), rstd.data(), N, C, dt),
              TS_OK);
    keep("layernorm dinp", dx), keep("layernorm dweight", dw), keep("layernorm dbias", db);
    EXPECT_EQ(ts_k_bias_add(c.get(), y.data(), bias.data(), N, C, dt), TS_OK);
    EXPECT_EQ(ts_k_bias_backward(c.get(), db.data(), dy.data(), N, C, dt), TS_OK);
    keep("bias out", y), keep("bias dbias", db);
    EXPECT_EQ(ts_k_rope_forward(c.get(), y.data(), x.data(), B, T, H, HS, 10000.0f, dt), TS_OK);
    keep("rope out", y);
    EXPECT_EQ(ts_k_rope_backward(c.get(), y.data(), dy.data(), B, T, H, HS, 10000.0f, dt), TS_OK);
    keep("rope dx", y);
  }
  {  // cross-entropy, one ignored row
    const size_t N = 5, V = 1100;
    auto logits = Store(rng.vec(N * V, -12, 12), dt);
    std::vector<int32_t> y = {17, (int32_t)V - 1, TS_IGNORE_INDEX, 1050, 0};
    std::vector<float> loss(N), loss2(N);
    std::vector<uint8_t> dl(N * V * es), dl2(N * V * es);
    CpuCtx c;
    EXPECT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), logits.data(), y.data(), N, V, dt),
              TS_OK);
    EXPECT_EQ(
        ts_k_cross_entropy_backward(c.get(), dl.data(), logits.data(), y.data(), N, V, 0.37f, dt),
        TS_OK);
    EXPECT_EQ(ts_k_cross_entropy_fused(c.get(), loss2.data(), dl2.data(), logits.data(), y.data(),
                                       N, V, 0.37f, dt),
              TS_OK);
    keep("ce loss", Bytes(loss)), keep("ce dlogits", dl), keep("ce fused loss", Bytes(loss2)),
        keep("ce fused dlogits", dl2);
  }
  {  // causal GQA attention, two key blocks
    const size_t B = 2, T = 150, NH = 4, NKV = 2, HS = 16;
    auto q = Store(rng.vec(B * T * NH * HS, -2, 2), dt),
         k = Store(rng.vec(B * T * NKV * HS, -2, 2), dt), v = Store(rng.vec(B * T * NKV * HS), dt),
         dout = Store(rng.vec(B * T * NH * HS), dt);
    std::vector<uint8_t> o(B * T * NH * HS * es), dq(o.size()), dk(B * T * NKV * HS * es),
        dv(dk.size());
    std::vector<uint8_t> state(ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, dt));
    CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, dt));
    EXPECT_EQ(ts_k_attention_forward(c.get(), o.data(), state.data(), q.data(), k.data(), v.data(),
                                     B, T, NH, NKV, HS, dt),
              TS_OK);
    EXPECT_EQ(
        ts_k_attention_backward(c.get(), dq.data(), dk.data(), dv.data(), dout.data(), o.data(),
                                q.data(), k.data(), v.data(), state.data(), B, T, NH, NKV, HS, dt),
        TS_OK);
    keep("attention out", o), keep("attention state", state), keep("attention dq", dq),
        keep("attention dk", dk), keep("attention dv", dv);
  }
  return out;
}

TEST(CpuIsa, EveryBodyGivesTheBaselineBits) {
  const int widest = ts_cpu_isa_widest(), saved = ts_cpu_isa, threads = omp_get_max_threads();
  if (widest == 0)
    GTEST_SKIP() << "this CPU (or ONEDNN_MAX_CPU_ISA) allows neither AVX2 nor AVX-512";
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
    SCOPED_TRACE(ts_dtype_name(dt));
    ts_cpu_isa = 0;
    omp_set_num_threads(1);
    Outputs base = RunOps(dt);
    for (int isa = 0; isa <= widest; isa++)
      for (int nt : {1, 3}) {
        if (isa == 0 && nt == 1) continue;
        SCOPED_TRACE("ts_cpu_isa " + std::to_string(isa) + ", threads " + std::to_string(nt));
        ts_cpu_isa = isa;
        omp_set_num_threads(nt);
        Outputs got = RunOps(dt);
        ASSERT_EQ(got.size(), base.size());
        for (size_t i = 0; i < got.size(); i++) {
          ASSERT_EQ(got[i].first, base[i].first);
          EXPECT_TRUE(got[i].second == base[i].second) << got[i].first << " differs";
        }
      }
  }
  ts_cpu_isa = saved;
  omp_set_num_threads(threads);
}

// The bodies ts_cpu_isa picks: the widest within the cap, which follows
// oneDNN's (tools/test_suite.sh --isa, tools/bench_cpu.sh ISA=).
TEST(CpuIsa, FollowsOneDnnsCap) {
  const char *cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  EXPECT_EQ(ts_cpu_isa, ts_cpu_isa_widest());
  if (cap && std::string(cap) == "AVX2") EXPECT_LE(ts_cpu_isa, 1);
  if (cap && std::string(cap).rfind("SSE", 0) == 0) EXPECT_EQ(ts_cpu_isa, 0);
}

}  // namespace

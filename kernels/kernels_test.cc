// Forward tests of the CPU kernels against naive double-precision reference
// loops, plus the error contract: invalid tokens/targets, workspace too
// small, contexts on a device without the op, and the workspace queries.
#include "kernels/kernels.h"

#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels_test_util.h"

using ts_test::CpuCtx;
using ts_test::Rng;

namespace {

const double kU = std::ldexp(1.0, -24);  // fp32 unit roundoff

TEST(Linear, ForwardMatchesNaive) {
  const size_t M = 7, N = 5, K = 19;
  Rng rng(1);
  auto x = rng.vec(M * K), w = rng.vec(N * K);
  std::vector<float> out(M * N);
  CpuCtx c;
  ASSERT_EQ(ts_k_linear_forward(c.get(), out.data(), x.data(), w.data(), M, N, K, TS_FP32), TS_OK);
  for (size_t m = 0; m < M; m++)
    for (size_t n = 0; n < N; n++) {
      double s = 0, sa = 0;
      for (size_t k = 0; k < K; k++) {
        s += (double)x[m * K + k] * w[n * K + k];
        sa += std::fabs((double)x[m * K + k] * w[n * K + k]);
      }
      // Standard dot-product bound: |fl(s) - s| <= K u sum|x w| (Higham 3.1); x2 slack.
      EXPECT_NEAR(out[m * N + n], s, 2 * K * kU * sa) << m << "," << n;
    }
}

TEST(Embedding, ForwardCopiesRows) {
  const size_t N = 6, C = 5, V = 4;
  Rng rng(2);
  auto wte = rng.vec(V * C);
  std::vector<int32_t> tok = {3, 0, 3, 1, 2, 0};
  std::vector<float> out(N * C);
  CpuCtx c;
  ASSERT_EQ(ts_k_embedding_forward(c.get(), out.data(), tok.data(), wte.data(), N, C, V, TS_FP32),
            TS_OK);
  for (size_t n = 0; n < N; n++)
    for (size_t j = 0; j < C; j++) EXPECT_EQ(out[n * C + j], wte[tok[n] * C + j]);
}

TEST(Rmsnorm, ForwardMatchesNaive) {
  const size_t N = 5, C = 37;
  const float eps = 1e-5f;
  Rng rng(3);
  auto x = rng.vec(N * C, -2, 2), w = rng.vec(C, 0.5f, 1.5f);
  std::vector<float> out(N * C), rstd(N);
  CpuCtx c;
  ASSERT_EQ(ts_k_rmsnorm_forward(c.get(), out.data(), rstd.data(), x.data(), w.data(), N, C, eps,
                                 TS_FP32),
            TS_OK);
  for (size_t n = 0; n < N; n++) {
    double ss = 0;
    for (size_t j = 0; j < C; j++) ss += (double)x[n * C + j] * x[n * C + j];
    double r = 1.0 / std::sqrt(ss / C + eps);
    // fp32 sum of C squares (C u relative) then rsqrt: well below 1e-5 relative.
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
    for (size_t j = 0; j < C; j++)
      EXPECT_NEAR(out[n * C + j], w[j] * x[n * C + j] * r, 1e-5 * r * 3) << n << "," << j;
  }
}

TEST(Rope, ForwardMatchesNaiveAndIsIdentityAtPositionZero) {
  const size_t B = 2, T = 9, H = 3, HS = 8;
  const float theta = 10000.0f;
  Rng rng(4);
  auto x = rng.vec(B * T * H * HS);
  std::vector<float> out(x.size());
  CpuCtx c;
  ASSERT_EQ(ts_k_rope_forward(c.get(), out.data(), x.data(), B, T, H, HS, theta, TS_FP32), TS_OK);
  std::vector<double> ref;
  ts_test::rope_ref(ref, x, B, T, H, HS, theta, 1);
  // cosf/sinf are within 1 ulp; two products and a sum of |x| <= 1: < 1e-6.
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(out[i], ref[i], 1e-6) << i;
  for (size_t b = 0; b < B; b++)
    for (size_t i = 0; i < H * HS; i++)  // t = 0: cos 0 = 1, sin 0 = 0 exactly
      EXPECT_EQ(out[b * T * H * HS + i], x[b * T * H * HS + i]);
  // In place gives the same bits.
  std::vector<float> inplace = x;
  ASSERT_EQ(ts_k_rope_forward(c.get(), inplace.data(), inplace.data(), B, T, H, HS, theta, TS_FP32),
            TS_OK);
  EXPECT_EQ(inplace, out);
  // Backward is the inverse rotation: R^T R x = x up to fp32 rounding.
  std::vector<float> back(x.size());
  ASSERT_EQ(ts_k_rope_backward(c.get(), back.data(), out.data(), B, T, H, HS, theta, TS_FP32),
            TS_OK);
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(back[i], x[i], 1e-6) << i;
}

// Causal GQA attention in double: out, and each softmax row's log-sum-exp
// lse (B, NH, T) of the scaled scores.
void attention_ref(std::vector<double> &out, std::vector<double> &lse, const std::vector<float> &q,
                   const std::vector<float> &k, const std::vector<float> &v, size_t B, size_t T,
                   size_t NH, size_t NKV, size_t HS) {
  out.assign(B * T * NH * HS, 0);
  lse.assign(B * NH * T, 0);
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < NH; h++) {
      size_t g = h / (NH / NKV);
      for (size_t t = 0; t < T; t++) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY, sum = 0;
        for (size_t j = 0; j <= t; j++) {
          double d = 0;
          for (size_t i = 0; i < HS; i++)
            d += (double)q[((b * T + t) * NH + h) * HS + i] * k[((b * T + j) * NKV + g) * HS + i];
          s[j] = d / std::sqrt((double)HS);
          mx = std::fmax(mx, s[j]);
        }
        for (size_t j = 0; j <= t; j++) sum += (s[j] = std::exp(s[j] - mx));
        lse[(b * NH + h) * T + t] = mx + std::log(sum);
        for (size_t j = 0; j <= t; j++) {
          double p = s[j] / sum;
          for (size_t i = 0; i < HS; i++)
            out[((b * T + t) * NH + h) * HS + i] += p * v[((b * T + j) * NKV + g) * HS + i];
        }
      }
    }
}

void check_attention_forward(size_t B, size_t T, size_t NH, size_t NKV, size_t HS, uint64_t seed) {
  Rng rng(seed);
  auto q = rng.vec(B * T * NH * HS, -2, 2), k = rng.vec(B * T * NKV * HS, -2, 2),
       v = rng.vec(B * T * NKV * HS);
  size_t state_bytes = ts_k_attention_state_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32);
  // The state: each row's log-sum-exp (B, NH, T) fp32, then (B, T) key
  // flags that only the bidirectional op writes.
  ASSERT_EQ(state_bytes, B * NH * T * sizeof(float) + B * T);
  std::vector<float> out(q.size());
  std::vector<uint8_t> state(state_bytes, 0xA5);
  CpuCtx c(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_FP32));
  ASSERT_EQ(ts_k_attention_forward(c.get(), out.data(), state.data(), q.data(), k.data(), v.data(),
                                   B, T, NH, NKV, HS, TS_FP32),
            TS_OK);
  std::vector<double> rout, rlse;
  attention_ref(rout, rlse, q, k, v, B, T, NH, NKV, HS);
  std::vector<float> lse(B * NH * T);
  std::memcpy(lse.data(), state.data(), lse.size() * sizeof(float));
  // Scores |s| <= 4 sqrt(HS): fp32 dot error ~HS u |s| (< 2e-6 typical at
  // these sizes, 1.5e-5 at worst for HS = 16), the log of a sum over <= T
  // keys adds T u: lse within (HS 4 sqrt(HS) + T + 4) u; out within 4e-6
  // (the probabilities' errors, 2e-6, times |v| <= 1, plus the sum's).
  const double u = 0x1p-24, lse_tol = (HS * 4 * std::sqrt((double)HS) + T + 4) * u;
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], rlse[i], lse_tol) << i;
  for (size_t i = lse.size() * sizeof(float); i < state.size(); i++)
    ASSERT_EQ(state[i], 0xA5) << "causal attention wrote key flag byte " << i;
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], rout[i], 4e-6) << i;
}

TEST(Attention, ForwardMatchesNaiveGqa) { check_attention_forward(2, 7, 4, 2, 8, 5); }
TEST(Attention, ForwardMatchesNaiveSingleKvHead) { check_attention_forward(1, 5, 3, 1, 4, 6); }
TEST(Attention, ForwardMatchesNaiveMultiHeadAndLongerThanOneBlock) {
  check_attention_forward(1, 300, 2, 2, 16, 7);  // 300 > 2 row blocks of 128
}

TEST(Swiglu, ForwardMatchesNaive) {
  const size_t n = 1000;
  Rng rng(8);
  auto g = rng.vec(n, -8, 8), u = rng.vec(n, -2, 2);
  std::vector<float> h(n);
  CpuCtx c;
  ASSERT_EQ(ts_k_swiglu_forward(c.get(), h.data(), g.data(), u.data(), n, TS_FP32), TS_OK);
  for (size_t i = 0; i < n; i++) {
    double want = g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
    // expf (1 ulp) + 3 roundings: < 4 u relative, x2 slack.
    EXPECT_NEAR(h[i], want, 8 * kU * std::fabs(want) + 1e-30) << i;
  }
}

TEST(CrossEntropy, ForwardMatchesNaiveAndIgnoresRows) {
  const size_t N = 6, V = 50;
  Rng rng(9);
  auto x = rng.vec(N * V, -4, 4);
  for (size_t j = 0; j < V; j++) x[3 * V + j] += 1000.0f;  // large logits stay finite
  std::vector<int32_t> y = {3, TS_IGNORE_INDEX, 49, 0, 17, TS_IGNORE_INDEX};
  std::vector<float> loss(N, -1.0f);
  CpuCtx c;
  ASSERT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), x.data(), y.data(), N, V, TS_FP32),
            TS_OK);
  for (size_t n = 0; n < N; n++) {
    if (y[n] == TS_IGNORE_INDEX) {
      EXPECT_EQ(loss[n], 0.0f);
      continue;
    }
    double mx = -INFINITY, s = 0;
    for (size_t j = 0; j < V; j++) mx = std::fmax(mx, (double)x[n * V + j]);
    for (size_t j = 0; j < V; j++) s += std::exp(x[n * V + j] - mx);
    double want = std::log(s) + mx - x[n * V + y[n]];
    // Shifted logits are exact; V-term fp32 sum + logf: ~V u relative of the
    // log-sum-exp, which is O(|x|) (|x| ~ 1000 for row 3): 1e-6 * (1+|max|).
    EXPECT_NEAR(loss[n], want, 1e-6 * (1 + std::fabs(mx))) << n;
  }
}

// ---- error contract ----------------------------------------------------------

TEST(Embedding, InvalidTokenIsRejectedByName) {
  const size_t N = 5, C = 2, V = 50;
  std::vector<float> wte(V * C, 1.0f), out(N * C, 7.0f);
  std::vector<int32_t> tok = {1, 2, 3, 50, 4};
  CpuCtx c;
  EXPECT_EQ(ts_k_embedding_forward(c.get(), out.data(), tok.data(), wte.data(), N, C, V, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("tokens[3] = 50"), std::string::npos)
      << ts_last_error();
  for (float o : out) EXPECT_EQ(o, 7.0f);  // nothing written
  tok[3] = -1;
  std::vector<float> dwte(V * C, 0.0f), dout(N * C, 1.0f);
  EXPECT_EQ(
      ts_k_embedding_backward(c.get(), dwte.data(), dout.data(), tok.data(), N, C, V, TS_FP32),
      TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("tokens[3] = -1"), std::string::npos)
      << ts_last_error();
  for (float d : dwte) EXPECT_EQ(d, 0.0f);
}

TEST(CrossEntropy, InvalidTargetIsRejectedByName) {
  const size_t N = 4, V = 7;
  std::vector<float> x(N * V, 0.5f), loss(N, 3.0f);
  std::vector<int32_t> y = {0, TS_IGNORE_INDEX, 7, 1};
  CpuCtx c;
  EXPECT_EQ(ts_k_cross_entropy_forward(c.get(), loss.data(), x.data(), y.data(), N, V, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("targets[2] = 7"), std::string::npos)
      << ts_last_error();
  for (float l : loss) EXPECT_EQ(l, 3.0f);
  y[2] = -5;
  std::vector<float> dx(N * V, 3.0f);
  EXPECT_EQ(
      ts_k_cross_entropy_backward(c.get(), dx.data(), x.data(), y.data(), N, V, 1.0f, TS_FP32),
      TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("targets[2] = -5"), std::string::npos)
      << ts_last_error();
  for (float d : dx) EXPECT_EQ(d, 3.0f);
}

// The one line a run says about its products names the path taken: oneDNN
// for bf16 wherever the CPU has AVX512-BF16 (or AMX), else tessera's own
// product (cpu/gemm_half.c: its AVX-512 or AVX2 micro-kernel, the widest
// within the cap) where the cap includes AVX2, else the fp32 copies;
// TESSERA_CPU_MATMUL=openblas (the _openblas twin of this test) keeps the
// fp32 copies; fp16 on oneDNN only with a native fp16 kernel.
TEST(Matmul, ImplNamesThePathTaken) {
  EXPECT_STREQ(ts_k_matmul_impl(TS_DEVICE_CUDA, TS_BF16), "cublasLt");
  const char *env = getenv("TESSERA_CPU_MATMUL");
  std::string fp32 = ts_k_matmul_impl(TS_DEVICE_CPU, TS_FP32);
  std::string bf16 = ts_k_matmul_impl(TS_DEVICE_CPU, TS_BF16);
  std::string fp16 = ts_k_matmul_impl(TS_DEVICE_CPU, TS_FP16);
  printf("fp32: %s; bf16: %s; fp16: %s\n", fp32.c_str(), bf16.c_str(), fp16.c_str());
  if (env && std::string(env) == "openblas") {
    EXPECT_EQ(fp32, "openblas sgemm");
    EXPECT_EQ(bf16, "openblas sgemm on fp32 copies");
    EXPECT_EQ(fp16, "openblas sgemm on fp32 copies");
  } else {
    // oneDNN runs fp32 where the instructions it may use (the CPU's, or
    // fewer under ONEDNN_MAX_CPU_ISA) include AVX-512 (its brgemm kernels;
    // below that its "gemm:jit" is left to OpenBLAS), and bf16 where they
    // include AVX512-BF16; each ISA's value includes the bits of those below.
    auto isa_has = [](dnnl_cpu_isa_t want) { return (dnnl_get_effective_cpu_isa() & want) == want; };
    if (isa_has(dnnl_cpu_isa_avx512_core)) EXPECT_EQ(fp32.rfind("onednn ", 0), 0u) << fp32;
    if (!isa_has(dnnl_cpu_isa_avx512_core)) EXPECT_EQ(fp32, "openblas sgemm");
    if (isa_has(dnnl_cpu_isa_avx512_core_bf16)) EXPECT_EQ(bf16.rfind("onednn ", 0), 0u) << bf16;
    // Without a native kernel, bf16/fp16 run on tessera's own product where
    // the cap includes AVX2 (each tier's value includes the bits of those
    // below) and the CPU has FMA and F16C: its AVX-512 micro-kernel where
    // the cap includes AVX-512, else its AVX2 one; else the fp32 copies
    const bool fma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const char *own = !fma || !isa_has(dnnl_cpu_isa_avx2)   ? "openblas sgemm on fp32 copies"
                      : isa_has(dnnl_cpu_isa_avx512_core) ? "tessera avx512 gemm"
                                                           : "tessera avx2 gemm";
    if (!isa_has(dnnl_cpu_isa_avx512_core_bf16)) EXPECT_EQ(bf16, own);
    if (fp16.rfind("onednn ", 0) != 0) EXPECT_EQ(fp16, own);
  }
  EXPECT_TRUE(fp32 == "openblas sgemm" || fp32.rfind("onednn ", 0) == 0) << fp32;
  for (const std::string &s : {bf16, fp16})
    EXPECT_TRUE(s == "openblas sgemm on fp32 copies" || s == "tessera avx2 gemm" ||
                s == "tessera avx512 gemm" || s.rfind("onednn ", 0) == 0)
        << s;
}

TEST(Workspace, QueriesAreExact) {
  EXPECT_EQ(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, 8, 16, 32, TS_FP32), 0u);
  // on the fp32 copies: three fp32 buffers (M K, N K, M N), each rounded up
  // to 64 bytes; oneDNN's products and tessera's own need none
  const std::string impl = ts_k_matmul_impl(TS_DEVICE_CPU, TS_BF16);
  const bool none = impl.rfind("onednn", 0) == 0 || impl.rfind("tessera ", 0) == 0;
  EXPECT_EQ(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, 3, 5, 7, TS_BF16),
            none ? 0u : 128u + 192u + 64u)
      << ts_k_matmul_impl(TS_DEVICE_CPU, TS_BF16);
  // fp32 attention keeps its blocks on the stack (kernels/cpu/attention.c);
  // bf16/fp16 widen a chunk of batch rows, as many as fit 8 MiB: per row,
  // the backward's q, out, dout, dq (T NH HS fp32 each: 1280 bytes) and k,
  // v, dk, dv (T NKV HS: 640) is the larger; both rows fit
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, 2, 10, 4, 2, 8, TS_FP32), 0u);
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, 2, 10, 4, 2, 8, TS_BF16),
            2 * (4 * 1280u + 4 * 640u));
  // llama-small (T 128, NH 8, NKV 4, HS 64): 1.5 MiB a row backward, 0.75
  // forward: chunks of 5 and 10 rows, 7.5 MiB either way at B 16; at B 3
  // all three rows; at T 1024 and 16 heads one row is 32 MiB, the chunk one
  const size_t MiB = 1u << 20;
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, 16, 128, 8, 4, 64, TS_BF16),
            15 * MiB / 2);
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, 3, 128, 8, 4, 64, TS_FP16), 9 * MiB / 2);
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CPU, 4, 1024, 16, 16, 64, TS_BF16),
            32 * MiB);
  // the state: B NH T fp32 log-sum-exps and B T key flags, in every dtype
  EXPECT_EQ(ts_k_attention_state_bytes(TS_DEVICE_CPU, 2, 10, 4, 2, 8, TS_FP16), 340u);
}

// The CUDA queries are pure functions, answered on a machine without a GPU
// (a GPU run is planned anywhere). bf16 attention at bert-base's shape (B
// 256, T 128, NH 12, HS 64): the bidirectional op's key lengths, 9 B bytes
// rounded to 256, beside cuDNN's bound (kernels/cuda/attention_cudnn.h:
// B NH Tp^2 2 + B NH Tp HS 4 + 2 B NH Tp 4 + 16 MiB = 221249536), and no
// longer its (B, 1, T, T) bias (8 MiB more). The embedding backward's
// sort: two buffers of N uint64 keys and CUB's scratch (a few KiB at
// these sizes), the same in every dtype and never less for more positions.
TEST(Workspace, CudaQueriesNeedNoGpu) {
  EXPECT_EQ(ts_k_attention_workspace_bytes(TS_DEVICE_CUDA, 256, 128, 12, 12, 64, TS_BF16),
            2304u + 221249536u);
  size_t last = 0;
  for (size_t N : {1, 74, 601, 5000, 32768, 32769}) {
    size_t keys = 2 * ((N * 8 + 63) / 64 * 64);
    size_t w = ts_k_embedding_workspace_bytes(TS_DEVICE_CUDA, N, TS_FP32);
    EXPECT_GE(w, keys) << N;
    EXPECT_LE(w, keys + (64u << 10)) << N;
    EXPECT_GE(w, last) << N;
    EXPECT_EQ(w, ts_k_embedding_workspace_bytes(TS_DEVICE_CUDA, N, TS_BF16)) << N;
    last = w;
  }
  EXPECT_EQ(ts_k_embedding_workspace_bytes(TS_DEVICE_CUDA, 0, TS_FP16), 0u);
  // fp8 rowwise on CUDA: tensorwise's parts plus the largest of the three
  // products (out M N, dinp M K, dweight N K) in fp32, rounded up to 256
  // bytes (kernels/cuda/fp8.cu: the scales are applied after the product)
  for (auto [M, N, K] : {std::array<size_t, 3>{2048, 5632, 2048}, {16, 48, 32}, {64, 16, 400}}) {
    size_t most = std::max({M * N, M * K, N * K}) * sizeof(float);
    EXPECT_EQ(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CUDA, M, N, K, TS_FP8_ROWWISE),
              ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CUDA, M, N, K, TS_FP8_TENSORWISE) +
                  (most + 255) / 256 * 256)
        << M << " " << N << " " << K;
  }
}

TEST(Workspace, TooSmallReturnsOutOfMemoryAndTouchesNothing) {
  const size_t B = 1, T = 6, NH = 2, NKV = 1, HS = 4;
  Rng rng(10);
  auto q = rng.vec(B * T * NH * HS), k = rng.vec(B * T * NKV * HS), v = rng.vec(B * T * NKV * HS);
  std::vector<float> state(B * NH * T + B, 0.1f), dout = rng.vec(q.size());
  // Half-precision backward widens one batch row of its operands.
  ts_test::Buf hq(q, TS_BF16), hk(k, TS_BF16), hv(v, TS_BF16), hdo(dout, TS_BF16);
  std::vector<uint16_t> hdq(q.size(), 0x1234), hdk(k.size(), 0x1234), hdv(v.size(), 0x1234);
  size_t need = ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_BF16);
  ASSERT_GT(need, 0u);
  CpuCtx small(need - 1);
  EXPECT_EQ(ts_k_attention_backward(small.get(), hdq.data(), hdk.data(), hdv.data(), hdo.data(),
                                    /*out=*/hdo.data(), hq.data(), hk.data(), hv.data(),
                                    state.data(), B, T, NH, NKV, HS, TS_BF16),
            TS_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ts_last_error()).find("workspace"), std::string::npos);
  for (uint16_t x : hdq) EXPECT_EQ(x, 0x1234);
  for (uint16_t x : hdk) EXPECT_EQ(x, 0x1234);
  CpuCtx none(0);
  EXPECT_EQ(ts_k_attention_backward(none.get(), hdq.data(), hdk.data(), hdv.data(), hdo.data(),
                                    hdo.data(), hq.data(), hk.data(), hv.data(), state.data(), B, T,
                                    NH, NKV, HS, TS_BF16),
            TS_ERR_OUT_OF_MEMORY);
  // Half-precision forward needs its widened buffers too.
  std::vector<uint16_t> hout(q.size(), 0x1234);
  // (The query covers backward, which needs more; 64 bytes fits neither.)
  CpuCtx small16(64);
  EXPECT_EQ(ts_k_attention_forward(small16.get(), hout.data(), state.data(), hq.data(), hk.data(),
                                   hv.data(), B, T, NH, NKV, HS, TS_BF16),
            TS_ERR_OUT_OF_MEMORY);
  for (uint16_t x : hout) EXPECT_EQ(x, 0x1234);
  // Linear in bf16.
  const size_t M = 4, N = 3, K = 5;
  ts_test::Buf hx(rng.vec(M * K), TS_BF16), hw(rng.vec(N * K), TS_BF16);
  std::vector<uint16_t> hy(M * N, 0x1234);
  if (ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_BF16) > 0) {  // fp32 copies
    CpuCtx small_lin(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_BF16) - 1);
    EXPECT_EQ(
        ts_k_linear_forward(small_lin.get(), hy.data(), hx.data(), hw.data(), M, N, K, TS_BF16),
        TS_ERR_OUT_OF_MEMORY);
    for (uint16_t x : hy) EXPECT_EQ(x, 0x1234);
  } else {  // oneDNN: no workspace at all
    EXPECT_EQ(ts_k_linear_forward(none.get(), hy.data(), hx.data(), hw.data(), M, N, K, TS_BF16),
              TS_OK)
        << ts_last_error();
  }
  // fp32 attention needs no workspace at all.
  std::vector<float> out32(q.size()), dq32(q.size()), dk32(k.size()), dv32(v.size());
  EXPECT_EQ(ts_k_attention_forward(none.get(), out32.data(), state.data(), q.data(), k.data(),
                                   v.data(), B, T, NH, NKV, HS, TS_FP32),
            TS_OK);
  EXPECT_EQ(ts_k_attention_backward(none.get(), dq32.data(), dk32.data(), dv32.data(), dout.data(),
                                    out32.data(), q.data(), k.data(), v.data(), state.data(), B, T,
                                    NH, NKV, HS, TS_FP32),
            TS_OK);
  // fp32 linear needs no workspace at all.
  std::vector<float> y(M * N);
  auto x32 = rng.vec(M * K), w32 = rng.vec(N * K);
  EXPECT_EQ(ts_k_linear_forward(none.get(), y.data(), x32.data(), w32.data(), M, N, K, TS_FP32),
            TS_OK);
}

// Without a GPU, CUDA ops fail cleanly in one line (the launch reports no
// driver or device; ops that need the context's state refuse a context not
// made by ts_k_context_init), and the front refuses, before any backend
// runs, a device that does not exist and a missing context.
TEST(Device, CudaOpsFailCleanlyWithoutAGpuAndBadContextsAreInvalid) {
  ts_kctx cuda;
  std::memset(&cuda, 0, sizeof cuda);
  cuda.device = TS_DEVICE_CUDA;
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 1, 1}, out[4] = {7, 7, 7, 7}, rstd[1];
  if (ts_k_device_count(TS_DEVICE_CUDA) == 0) {
    EXPECT_EQ(ts_k_rmsnorm_forward(&cuda, out, rstd, x, w, 1, 4, 1e-5f, TS_FP32), TS_ERR_CUDA);
    EXPECT_NE(std::string(ts_last_error()).find("ts_k_rmsnorm_forward (cuda)"), std::string::npos)
        << ts_last_error();
    EXPECT_EQ(ts_k_add(&cuda, out, x, w, 4, TS_FP32), TS_ERR_CUDA);
    EXPECT_EQ(ts_k_swiglu_forward(&cuda, out, x, w, 4, TS_BF16), TS_ERR_CUDA);
  }
  double sq;
  EXPECT_EQ(ts_k_sumsq(&cuda, &sq, x, 4, TS_FP32), TS_ERR_INVALID_USAGE);
  EXPECT_NE(std::string(ts_last_error()).find("ts_k_context_init"), std::string::npos)
      << ts_last_error();
  for (float o : out) EXPECT_EQ(o, 7.0f);
  // Arguments are checked before the device's lack of a body is reported.
  EXPECT_EQ(ts_k_add(&cuda, nullptr, x, w, 4, TS_FP32), TS_ERR_INVALID_ARGUMENT);
  ts_kctx bad = cuda;
  bad.device = (ts_device)7;
  EXPECT_EQ(ts_k_add(&bad, out, x, w, 4, TS_FP32), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("ctx->device = 7 is not a device"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_cast(nullptr, out, TS_FP32, x, TS_FP32, 4), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("ctx is NULL"), std::string::npos);
}

// On a machine without a GPU the ops that do have a CUDA body fail with one
// line, TS_ERR_CUDA, and no crash; no CUDA device is counted and none can
// be opened. (A GPU machine runs them for real: kernels_parity_gpu_test.)
TEST(Device, CudaBodiesFailCleanlyWithoutAGpu) {
  if (ts_k_device_count(TS_DEVICE_CUDA) > 0) GTEST_SKIP() << "this machine has a GPU";
  ts_kctx cuda;
  std::memset(&cuda, 0, sizeof cuda);
  cuda.device = TS_DEVICE_CUDA;
  float x[4] = {1, 2, 3, 4}, m[4] = {0}, v[4] = {0};
  uint16_t h[4];
  EXPECT_EQ(ts_k_cast(&cuda, h, TS_BF16, x, TS_FP32, 4), TS_ERR_CUDA);
  EXPECT_NE(std::string(ts_last_error()).find("ts_k_cast (cuda)"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_zero(&cuda, x, sizeof x), TS_ERR_CUDA);
  ts_adamw_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f};
  EXPECT_EQ(ts_k_adamw(&cuda, x, nullptr, TS_FP32, m, v, x, TS_FP32, 4, &hp), TS_ERR_CUDA);
  void *p = nullptr;
  EXPECT_NE(ts_k_alloc(TS_DEVICE_CUDA, 64, &p), TS_OK);
  EXPECT_EQ(p, nullptr);
  ts_kctx ctx;
  EXPECT_EQ(ts_k_context_init(&ctx, TS_DEVICE_CUDA, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("cuda device 0: this process sees 0"),
            std::string::npos)
      << ts_last_error();
}

TEST(Zero, ClearsExactlyTheGivenBytes) {
  CpuCtx c;
  unsigned char b[100];
  std::memset(b, 0xab, sizeof b);
  ASSERT_EQ(ts_k_zero(&c.ctx, b + 3, 90), TS_OK);
  for (size_t i = 0; i < sizeof b; i++) EXPECT_EQ(b[i], i >= 3 && i < 93 ? 0 : 0xab) << i;
  EXPECT_EQ(ts_k_zero(&c.ctx, nullptr, 0), TS_OK);
  EXPECT_EQ(ts_k_zero(&c.ctx, nullptr, 4), TS_ERR_INVALID_ARGUMENT);
}

TEST(Shapes, BadArgumentsAreRejected) {
  CpuCtx c;
  float buf[64] = {0};
  EXPECT_EQ(ts_k_rope_forward(c.get(), buf, buf, 1, 2, 1, 5, 10000.0f, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);  // odd HS
  EXPECT_EQ(ts_k_attention_forward(c.get(), buf, buf, buf, buf, buf, 1, 2, 3, 2, 4, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);  // NH % NKV != 0
  EXPECT_EQ(ts_k_add(c.get(), buf, buf, buf, 4, (ts_dtype)7), TS_ERR_INVALID_ARGUMENT);
  ts_adamw_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 0, 1.0f};
  EXPECT_EQ(
      ts_k_adamw(c.get(), buf, nullptr, TS_FP32, buf + 8, buf + 16, buf + 24, TS_FP32, 4, &hp),
      TS_ERR_INVALID_ARGUMENT);  // step 0
}

// The non-finite flag: 0 for finite data (the largest finite values
// included), 1 for one inf or NaN anywhere, chunk boundaries and the last
// element included, in every storage dtype.
TEST(Nonfinite, FlagsAnyInfOrNanAndNothingElse) {
  CpuCtx c;
  const size_t n = 3 * 4096 + 5;
  const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (ts_dtype dt : all) {
    std::vector<float> x(n, 1.5f);
    x[7] = dt == TS_FP16 ? 65504.0f : 3.0e38f;  // largest finite of the format (about)
    ts_test::Buf b(x, dt);
    int32_t flag = -1;
    ASSERT_EQ(ts_k_nonfinite(c.get(), &flag, b.data(), n, dt), TS_OK);
    EXPECT_EQ(flag, 0) << ts_dtype_name(dt);
    const size_t where[] = {0, 4095, 4096, n - 1};
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (size_t i : where)
      for (float v : bad) {
        std::vector<float> y = x;
        y[i] = v;
        ts_test::Buf by(y, dt);
        flag = -1;
        ASSERT_EQ(ts_k_nonfinite(c.get(), &flag, by.data(), n, dt), TS_OK);
        EXPECT_EQ(flag, 1) << ts_dtype_name(dt) << " at " << i << " = " << v;
      }
  }
  int32_t flag = -1;
  ASSERT_EQ(ts_k_nonfinite(c.get(), &flag, nullptr, 0, TS_FP32), TS_OK);
  EXPECT_EQ(flag, 0);
}

// The loss sum adds the rows with a target in row order in double and
// counts them; ignored rows (-100) add nothing whatever their value.
TEST(LossSum, SumsTheRowsWithATargetInOrder) {
  CpuCtx c;
  std::vector<float> rows = {0.5f, 1e30f, 0.25f, 3.0f, 1e-8f};
  std::vector<int32_t> y = {1, TS_IGNORE_INDEX, 0, 2, 9};
  double out[2] = {-1, -1};
  ASSERT_EQ(ts_k_loss_sum(c.get(), out, rows.data(), y.data(), rows.size()), TS_OK);
  double want = 0;
  for (size_t i = 0; i < rows.size(); i++)
    if (y[i] != TS_IGNORE_INDEX) want += rows[i];
  EXPECT_EQ(out[0], want);
  EXPECT_EQ(out[1], 4.0);
  ASSERT_EQ(ts_k_loss_sum(c.get(), out, nullptr, nullptr, 0), TS_OK);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
}

// Memory through the front on the CPU: zero-filled 64-byte-aligned blocks,
// copies in each direction, and the overlap a copy refuses.
TEST(Memory, AllocCopyAndTransfersOnTheCpu) {
  EXPECT_EQ(ts_k_device_count(TS_DEVICE_CPU), 1);
  void *p = nullptr;
  ASSERT_EQ(ts_k_alloc(TS_DEVICE_CPU, 100, &p), TS_OK);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((uintptr_t)p % 64, 0u);
  const unsigned char *b = static_cast<const unsigned char *>(p);
  for (int i = 0; i < 100; i++) EXPECT_EQ(b[i], 0) << i;
  ts_kctx ctx;
  ASSERT_EQ(ts_k_context_init(&ctx, TS_DEVICE_CPU, 0), TS_OK);
  unsigned char h[100], back[100];
  for (int i = 0; i < 100; i++) h[i] = (unsigned char)(3 * i + 1);
  ASSERT_EQ(ts_k_from_host(&ctx, p, h, 100), TS_OK);
  ASSERT_EQ(ts_k_copy(&ctx, static_cast<char *>(p) + 50, p, 50), TS_OK);
  ASSERT_EQ(ts_k_to_host(&ctx, back, p, 100), TS_OK);
  for (int i = 0; i < 100; i++) EXPECT_EQ(back[i], h[i % 50]) << i;
  EXPECT_EQ(ts_k_copy(&ctx, static_cast<char *>(p) + 10, p, 50), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_k_synchronize(&ctx), TS_OK);
  EXPECT_EQ(ts_k_context_init(&ctx, TS_DEVICE_CPU, 1), TS_ERR_INVALID_ARGUMENT);
  ts_k_context_destroy(&ctx);
  ts_k_free(TS_DEVICE_CPU, p);
  ASSERT_EQ(ts_k_alloc(TS_DEVICE_CPU, 0, &p), TS_OK);
  EXPECT_EQ(p, nullptr);
}

// A plan context (TS_K_PLAN) checks every call as its device would and
// then touches nothing: its buffers here are addresses without memory
// (reading or writing one would crash the test), yet every op returns
// TS_OK; a bad shape, a NULL pointer or a small workspace still fails with
// the device's message; queries answer as for the device.
// A fork is a context on the parent's device with the parent's flags and
// no workspace; a plan context forks into a plan context (no stream, no
// backend: a CUDA plan forks on a machine without a GPU) whose ops check
// and do nothing, and destroying it is a no-op.
TEST(Context, ForkKeepsDeviceAndFlagsAndAPlanForksWithoutABackend) {
  ts_kctx cpu;
  ASSERT_EQ(ts_k_context_init(&cpu, TS_DEVICE_CPU, 0), TS_OK);
  cpu.flags = TS_K_INDICES_CHECKED;
  ts_kctx f;
  std::memset(&f, 0xab, sizeof f);
  ASSERT_EQ(ts_k_context_fork(&f, &cpu), TS_OK) << ts_last_error();
  EXPECT_EQ(f.device, TS_DEVICE_CPU);
  EXPECT_EQ(f.flags, TS_K_INDICES_CHECKED);
  EXPECT_EQ(f.workspace, nullptr);
  ts_k_context_destroy(&f);
  ts_kctx plan;
  std::memset(&plan, 0, sizeof plan);
  plan.device = TS_DEVICE_CUDA;
  plan.device_index = 3;  // beyond what this machine sees: a plan needs none
  plan.flags = TS_K_PLAN;
  ASSERT_EQ(ts_k_context_fork(&f, &plan), TS_OK) << ts_last_error();
  EXPECT_EQ(f.device, TS_DEVICE_CUDA);
  EXPECT_EQ(f.device_index, 3);
  EXPECT_EQ(f.flags, TS_K_PLAN);
  EXPECT_EQ(f.stream, nullptr);
  void *fake = reinterpret_cast<void *>(uintptr_t{64});
  const void *parts[] = {fake, fake};
  EXPECT_EQ(ts_k_sum_ranks(&f, fake, parts, 2, 1000, TS_BF16, 1), TS_OK);  // checked, not run
  EXPECT_EQ(ts_k_sum_ranks(&f, fake, parts, 0, 1000, TS_BF16, 1), TS_ERR_INVALID_ARGUMENT);
  ts_k_context_destroy(&f);
  // a CUDA fork where no GPU is seen fails as ts_k_context_init does
  if (ts_k_device_count(TS_DEVICE_CUDA) == 0) {
    plan.flags = 0;
    EXPECT_EQ(ts_k_context_fork(&f, &plan), TS_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(ts_k_context_fork(nullptr, &plan), TS_ERR_INVALID_ARGUMENT);
}

TEST(Plan, ChecksEveryCallAndTouchesNothing) {
  ts_kctx ctx;
  std::memset(&ctx, 0, sizeof ctx);
  ctx.device = TS_DEVICE_CPU;
  ctx.flags = TS_K_PLAN;
  void *fake = reinterpret_cast<void *>(uintptr_t{64});  // no memory behind it
  void *fake2 = reinterpret_cast<void *>(uintptr_t{1 << 20});
  int32_t *ids = static_cast<int32_t *>(fake2);
  const size_t B = 2, T = 5, NH = 4, NKV = 2, HS = 8, V = 11;
  size_t ws = ts_k_attention_workspace_bytes(TS_DEVICE_CPU, B, T, NH, NKV, HS, TS_BF16);
  ctx.workspace = fake;
  ctx.workspace_bytes = ws;
  EXPECT_EQ(ts_k_add(&ctx, fake, fake2, fake, 1000, TS_FP32), TS_OK);
  EXPECT_EQ(ts_k_cast(&ctx, fake, TS_BF16, fake2, TS_FP32, 1000), TS_OK);
  EXPECT_EQ(ts_k_zero(&ctx, fake, 1000), TS_OK);
  EXPECT_EQ(
      ts_k_attention_forward(&ctx, fake, fake, fake2, fake2, fake2, B, T, NH, NKV, HS, TS_BF16),
      TS_OK);
  EXPECT_EQ(ts_k_embedding_forward(&ctx, fake, ids, fake2, B * T, 16, V, TS_FP32), TS_OK);
  EXPECT_EQ(ts_k_from_host(&ctx, fake, fake2, 100), TS_OK);
  EXPECT_EQ(ts_k_to_host(&ctx, fake, fake2, 100), TS_OK);
  EXPECT_EQ(ts_k_host_copy(&ctx, fake, fake2, 100), TS_OK);
  EXPECT_EQ(ts_k_check_indices(&ctx, ids, ids, B * T, V), TS_OK);
  size_t count = 99;
  EXPECT_EQ(ts_k_count_targets(&ctx, &count, ids, B * T), TS_OK);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(ts_k_synchronize(&ctx), TS_OK);
  // Still checked: shapes, pointers, workspace.
  EXPECT_EQ(ts_k_attention_forward(&ctx, fake, fake, fake2, fake2, fake2, B, T, NH, 3, HS, TS_BF16),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("expected NKV >= 1 dividing NH"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_add(&ctx, nullptr, fake, fake, 10, TS_FP32), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(), "ts_k_add: out is NULL");
  ctx.workspace_bytes = ws - 1;
  EXPECT_EQ(
      ts_k_attention_forward(&ctx, fake, fake, fake2, fake2, fake2, B, T, NH, NKV, HS, TS_BF16),
      TS_ERR_OUT_OF_MEMORY);
  // The same calls on the CPU itself would have read and written.
  CpuCtx real;
  std::vector<float> a(4, 1.0f), b(4, 2.0f), out(4, 0.0f);
  ASSERT_EQ(ts_k_add(real.get(), out.data(), a.data(), b.data(), 4, TS_FP32), TS_OK);
  EXPECT_EQ(out[3], 3.0f);
}

// The host's side of a batch: the targets a loss averages over, and
// tokens and targets checked before a device reads them.
TEST(Batch, CountsTargetsAndChecksIndicesOnTheHost) {
  CpuCtx c;
  const int32_t tokens[5] = {0, 3, 10, 2, 7}, targets[5] = {3, -100, 10, -100, 0};
  size_t count = 0;
  ASSERT_EQ(ts_k_count_targets(c.get(), &count, targets, 5), TS_OK);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(ts_k_check_indices(c.get(), tokens, targets, 5, 11), TS_OK);
  EXPECT_EQ(ts_k_check_indices(c.get(), tokens, targets, 5, 10), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "ts_k_check_indices: tokens[2] = 10 is outside the vocabulary [0, 10)");
  const int32_t bad_targets[5] = {3, -100, -1, 0, 0};
  EXPECT_EQ(ts_k_check_indices(c.get(), tokens, bad_targets, 5, 11), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "ts_k_check_indices: targets[2] = -1: expected a class in [0, 11) or -100 (ignore)");
}

}  // namespace

// ts_k_check_host_blocks: on the CPU, where host and device memory are one,
// a registered host block is refused as a device pointer (a copy in the
// wrong direction, a kernel on host memory) and accepted where the op names
// host memory (h_ arguments) or the context does host work
// (TS_K_HOST_SIDE); unregistering forgets the range; off, nothing is
// checked.
TEST(HostBlocks, ARegisteredHostBlockIsRefusedAsDeviceMemory) {
  CpuCtx c;
  std::vector<float> host(64, 1.0f), dev(64, 2.0f);
  ts_k_check_host_blocks(1);
  ASSERT_EQ(ts_k_host_register(c.get(), host.data(), host.size() * 4), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_k_copy(c.get(), host.data() + 8, dev.data(), 16), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "ts_k_copy: dst is host memory (a ts_k_host_register block): expected memory of "
               "the context's device");
  EXPECT_EQ(ts_k_from_host(c.get(), host.data(), dev.data(), 16), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_k_to_host(c.get(), dev.data(), host.data() + 63, 4), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(host[8], 1.0f);  // a refused call wrote nothing
  // the right directions, and host work
  EXPECT_EQ(ts_k_to_host(c.get(), host.data(), dev.data(), 16), TS_OK) << ts_last_error();
  EXPECT_EQ(host[0], 2.0f);
  EXPECT_EQ(ts_k_from_host(c.get(), dev.data(), host.data() + 32, 16), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_k_host_copy(c.get(), host.data() + 4, host.data(), 16), TS_OK) << ts_last_error();
  ts_kctx side = c.ctx;
  side.flags |= TS_K_HOST_SIDE;
  EXPECT_EQ(ts_k_copy(&side, host.data() + 8, dev.data(), 16), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_k_copy(c.get(), dev.data() + 8, dev.data(), 16), TS_OK) << ts_last_error();
  // unregistered, it is device memory again
  ts_k_host_unregister(c.get(), host.data());
  EXPECT_EQ(ts_k_copy(c.get(), host.data(), dev.data(), 16), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_k_host_register(c.get(), host.data(), host.size() * 4), TS_OK);
  ts_k_check_host_blocks(0);  // off: forgotten, nothing checked
  EXPECT_EQ(ts_k_copy(c.get(), host.data(), dev.data(), 16), TS_OK) << ts_last_error();
  ts_k_check_host_blocks(1);
  EXPECT_EQ(ts_k_copy(c.get(), host.data(), dev.data(), 16), TS_OK) << "the range was forgotten";
  ts_k_check_host_blocks(0);
}

// The optional outputs are checked too: AdamW's rounded copy of the
// parameters (param_out: where an offloaded update writes) into a host
// block on a device context is refused; on the host's side it is the
// offloaded update itself.
TEST(HostBlocks, AdamWsParameterCopyIntoAHostBlockIsRefused) {
  CpuCtx c;
  std::vector<float> master(32, 0.5f), m(32, 0.0f), v(32, 0.0f), grad(32, 0.01f);
  std::vector<uint16_t> param(32, 0);
  ts_adamw_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
  ts_k_check_host_blocks(1);
  ASSERT_EQ(ts_k_host_register(c.get(), param.data(), param.size() * 2), TS_OK);
  EXPECT_EQ(ts_k_adamw(c.get(), master.data(), param.data(), TS_BF16, m.data(), v.data(),
                       grad.data(), TS_FP32, 32, &hp),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "ts_k_adamw: param_out is host memory (a ts_k_host_register block): expected "
               "memory of the context's device");
  EXPECT_EQ(master[0], 0.5f);  // refused before anything ran
  ts_kctx side = c.ctx;
  side.flags |= TS_K_HOST_SIDE;
  EXPECT_EQ(ts_k_adamw(&side, master.data(), param.data(), TS_BF16, m.data(), v.data(),
                       grad.data(), TS_FP32, 32, &hp),
            TS_OK)
      << ts_last_error();
  EXPECT_NE(param[0], 0u);
  ts_k_check_host_blocks(0);
}

// ts_k_op_times: each op's time goes to its kind only while on; a reset
// empties every kind; a plan context runs nothing and adds nothing.
TEST(OpTimes, EachOpCountsUnderItsKindOnlyWhileOn) {
  const size_t M = 64, N = 64, K = 256, n = 1 << 16;
  std::vector<float> x(M * K, 0.5f), w(N * K, 0.25f), y(M * N);
  std::vector<float> master(n, 1.0f), m(n), v(n), g(n, 0.1f);
  ts_adamw_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
  CpuCtx ctx;
  auto run = [&](const ts_kctx *c) {
    for (int i = 0; i < 20; i++) {
      ASSERT_EQ(ts_k_linear_forward(c, y.data(), x.data(), w.data(), M, N, K, TS_FP32), TS_OK);
      ASSERT_EQ(ts_k_adamw(c, master.data(), nullptr, TS_FP32, m.data(), v.data(), g.data(),
                           TS_FP32, n, &hp),
                TS_OK);
    }
  };
  double t[TS_K_OPS_KINDS];
  ts_k_op_times_reset();
  run(ctx.get());  // off: nothing added
  ts_k_op_times(t);
  for (int k = 0; k < TS_K_OPS_KINDS; k++) EXPECT_EQ(t[k], 0.0) << ts_k_op_kind_name((ts_k_op_kind)k);
  ts_k_op_times_enable(1);
  EXPECT_EQ(ts_k_op_timing(), 1);
  ts_kctx plan = ctx.ctx;
  plan.flags |= TS_K_PLAN;
  run(&plan);  // a plan runs nothing
  ts_k_op_times(t);
  EXPECT_EQ(t[TS_K_OPS_PRODUCTS], 0.0);
  run(ctx.get());
  ts_k_op_times(t);
  ts_k_op_times_enable(0);
  EXPECT_GT(t[TS_K_OPS_PRODUCTS], 0.0);
  EXPECT_GT(t[TS_K_OPS_OPTIMIZER], 0.0);
  EXPECT_EQ(t[TS_K_OPS_ATTENTION], 0.0);
  EXPECT_EQ(t[TS_K_OPS_ELEMENTWISE], 0.0);
  EXPECT_EQ(t[TS_K_OPS_COPIES], 0.0);
  ts_k_op_times_reset();
  ts_k_op_times(t);
  EXPECT_EQ(t[TS_K_OPS_PRODUCTS], 0.0);
  EXPECT_EQ(t[TS_K_OPS_OPTIMIZER], 0.0);
  EXPECT_STREQ(ts_k_op_kind_name(TS_K_OPS_ELEMENTWISE), "elementwise");
  EXPECT_EQ(ts_k_op_kind_name(TS_K_OPS_KINDS), nullptr);
}

// fp32 never runs on oneDNN's older "gemm:jit" (AVX2 and below): OpenBLAS's
// sgemm takes it (cpu/dnnl_matmul.cc), so under the AVX2 cap (the _avx2
// test) the products say "openblas sgemm". Either way dW += dout^T inp
// holds (the accumulation kept) within fp32's bound for 300 terms.
TEST(Linear, Fp32LeavesGemmJitToOpenblasAndAccumulates) {
  const char *impl = ts_k_matmul_impl(TS_DEVICE_CPU, TS_FP32);
  EXPECT_EQ(strstr(impl, "gemm:jit"), nullptr) << impl;
  const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && !strcmp(cap, "AVX2")) EXPECT_STREQ(impl, "openblas sgemm");
  const size_t M = 300, N = 37, K = 53;
  Rng rng(71);
  std::vector<float> dout = rng.vec(M * N), inp = rng.vec(M * K), dw0 = rng.vec(N * K);
  std::vector<float> dw = dw0, w(N * K, 0.0f);
  CpuCtx ctx(ts_k_linear_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_FP32));
  ASSERT_EQ(ts_k_linear_backward(ctx.get(), nullptr, dw.data(), dout.data(), inp.data(), w.data(),
                                 M, N, K, TS_FP32),
            TS_OK);
  for (size_t n = 0; n < N; n++)
    for (size_t k = 0; k < K; k++) {
      double want = dw0[n * K + k], mag = std::fabs(want);
      for (size_t m = 0; m < M; m++) {
        want += (double)dout[m * N + n] * inp[m * K + k];
        mag += std::fabs((double)dout[m * N + n] * inp[m * K + k]);
      }
      ASSERT_NEAR(dw[n * K + k], want, 2.0 * (M + 1) * std::ldexp(mag, -24)) << n << ", " << k;
    }
}

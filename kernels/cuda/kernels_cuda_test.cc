// CPU-vs-CUDA parity of the ops with a CUDA body (ts_k_cast, ts_k_adamw):
// both share kernels/elementwise.h's bit-exact conversions and IEEE-rounded
// AdamW element math, so results must agree bit for bit; and the fused
// residual add + norm against CUDA's own unfused ops, bit for bit. Needs a GPU
// (tag "gpu"); fails when the CUDA runtime finds no device.
#include <cuda_runtime.h>
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

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Device buffer of `bytes`, freed on scope exit.
struct DevBuf {
  void *p = nullptr;
  size_t bytes;
  explicit DevBuf(size_t b) : bytes(b) { EXPECT_EQ(cudaMalloc(&p, b ? b : 1), cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  void put(const void *h) {
    EXPECT_EQ(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<unsigned char> get() const {
    std::vector<unsigned char> h(bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

struct CudaCtx {
  ts_kctx ctx;
  cudaStream_t stream = nullptr;
  CudaCtx() {
    std::memset(&ctx, 0, sizeof ctx);
    ctx.device = TS_DEVICE_CUDA;
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ctx.stream = stream;
  }
  ~CudaCtx() { cudaStreamDestroy(stream); }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); }
};

std::vector<unsigned char> bytes_of(const void *p, size_t n) {
  const unsigned char *b = static_cast<const unsigned char *>(p);
  return std::vector<unsigned char>(b, b + n);
}

TEST(CudaParity, ZeroClearsDeviceBytes) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  std::vector<unsigned char> h(1000, 0xab);
  DevBuf d(h.size());
  d.put(h.data());
  CudaCtx c;
  ASSERT_EQ(ts_k_zero(&c.ctx, static_cast<unsigned char *>(d.p) + 10, 900), TS_OK);
  c.sync();
  std::vector<unsigned char> got = d.get();
  for (size_t i = 0; i < h.size(); i++)
    ASSERT_EQ(got[i], i >= 10 && i < 910 ? 0 : 0xab) << i;
}

TEST(CudaParity, CastMatchesCpuBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  // fp32 inputs: random bit patterns (NaNs, infs, subnormals included) plus
  // rounding ties and fp16 boundaries; 16-bit inputs: all 65536 patterns.
  const size_t n32 = (1 << 20) + 3;
  std::vector<uint32_t> in32(n32);
  Rng rng(41);
  for (auto &u : in32) u = (uint32_t)rng.next();
  const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x7F7F8000u, 0x477FF000u, 0x477FEFFFu,
                              0x33000000u, 0x33000001u, 0x38800000u, 0x387FC000u, 0x7F800001u,
                              0xFFC00000u, 0x80000000u, 0x00000001u, 0x7F800000u};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) in32[i] = special[i];
  std::vector<uint16_t> in16(65536);
  for (size_t i = 0; i < in16.size(); i++) in16[i] = (uint16_t)i;

  CpuCtx cpu;
  CudaCtx gpu;
  const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (ts_dtype idt : all) {
    for (ts_dtype odt : all) {
      SCOPED_TRACE(std::string(ts_dtype_name(idt)) + " -> " + ts_dtype_name(odt));
      const void *in = idt == TS_FP32 ? (const void *)in32.data() : (const void *)in16.data();
      size_t n = idt == TS_FP32 ? n32 : in16.size();
      size_t ib = n * ts_dtype_size(idt), ob = n * ts_dtype_size(odt);
      std::vector<unsigned char> want(ob);
      ASSERT_EQ(ts_k_cast(cpu.get(), want.data(), odt, in, idt, n), TS_OK);
      DevBuf din(ib), dout(ob);
      din.put(in);
      ASSERT_EQ(ts_k_cast(&gpu.ctx, dout.p, odt, din.p, idt, n), TS_OK) << ts_last_error();
      gpu.sync();
      EXPECT_TRUE(dout.get() == want);
    }
  }
}

// The rank-order sum of the device transports (comm/nccl.c's
// reduce-scatter): the CPU's bits for 1, 2, 4 and 7 parts, with and without
// the previous out, in every dtype (both sides add in fp32 with one IEEE
// rounding per addition in index order and narrow once).
TEST(CudaParity, SumRanksMatchesCpuBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t count = (1 << 18) + 13;
  Rng rng(43);
  CpuCtx cpu;
  CudaCtx gpu;
  const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (ts_dtype dt : all)
    for (int n : {1, 2, 4, 7})
      for (int accumulate : {0, 1}) {
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " n=" + std::to_string(n) +
                     " accumulate=" + std::to_string(accumulate));
        const size_t bytes = count * ts_dtype_size(dt);
        std::vector<std::vector<unsigned char>> host(n + 1);
        for (auto &h : host) {
          ts_test::Buf b(rng.vec(count, -8, 8), dt);
          h = bytes_of(b.data(), bytes);
        }
        std::vector<const void *> hp;
        for (int k = 0; k < n; k++) hp.push_back(host[k].data());
        std::vector<unsigned char> want = host[n];
        ASSERT_EQ(ts_k_sum_ranks(cpu.get(), want.data(), hp.data(), n, count, dt, accumulate),
                  TS_OK);
        std::vector<DevBuf> dev;
        dev.reserve(n + 1);
        for (int k = 0; k <= n; k++) {
          dev.emplace_back(bytes);
          dev.back().put(host[k].data());
        }
        std::vector<const void *> dp;
        for (int k = 0; k < n; k++) dp.push_back(dev[k].p);
        ASSERT_EQ(ts_k_sum_ranks(&gpu.ctx, dev[n].p, dp.data(), n, count, dt, accumulate), TS_OK)
            << ts_last_error();
        gpu.sync();
        EXPECT_TRUE(dev[n].get() == want);
      }
}

// The residual add fused with the norm after it (ts_k_add_rmsnorm_forward,
// ts_k_add_layernorm_forward): CUDA's one kernel gives every bit of CUDA's
// ts_k_add then the norm's forward, with res apart and aliasing a, on rows
// narrower and wider than a block (C 96, 1000, 4099: up to 17 elements a
// thread), in every dtype; and res is the CPU's ts_k_add bit for bit (one
// fp32 addition rounded once on both). The norms of the two devices sum
// in different orders: the parity test's add_*norm_forward cases bound
// them.
TEST(CudaParity, AddNormMatchesUnfusedBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t N = 33;
  const float eps = 1e-5f;
  const char *names[] = {"res", "out", "mean", "rstd"};
  CpuCtx cpu;
  CudaCtx gpu;
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (size_t C : {96, 1000, 4099})
      for (int ln : {0, 1}) {
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " C=" + std::to_string(C) +
                     (ln ? " LayerNorm" : " RMSNorm"));
        const size_t nb = N * C * ts_dtype_size(dt), cb = C * ts_dtype_size(dt);
        Rng rng(C * 3 + (uint64_t)dt * 7 + ln);
        ts_test::Buf a(rng.vec(N * C, -2, 3), dt), b(rng.vec(N * C, -1, 1), dt),
            w(rng.vec(C, 0.5f, 1.5f), dt), bias(rng.vec(C), dt);
        DevBuf da(nb), db(nb), dw(cb), dbias(cb);
        da.put(a.data());
        db.put(b.data());
        dw.put(w.data());
        dbias.put(bias.data());
        const std::vector<unsigned char> poison(nb, 0xFF);  // NaN; mean stays so for RMSNorm
        // res, out, mean, rstd of: 0 the fused op, 1 it with res == a, 2 ts_k_add then the norm
        auto run = [&](int mode) {
          DevBuf res(nb), out(nb), mean(N * 4), rstd(N * 4);
          res.put(mode == 1 ? a.data() : poison.data());
          out.put(poison.data());
          mean.put(poison.data());
          rstd.put(poison.data());
          const void *in_a = mode == 1 ? res.p : da.p;
          float *m = (float *)mean.p, *r = (float *)rstd.p;
          ts_status st = TS_OK;
          if (mode == 2) {
            st = ts_k_add(&gpu.ctx, res.p, da.p, db.p, N * C, dt);
            if (st == TS_OK)
              st = ln ? ts_k_layernorm_forward(&gpu.ctx, out.p, m, r, res.p, dw.p, dbias.p, N, C,
                                               eps, dt)
                      : ts_k_rmsnorm_forward(&gpu.ctx, out.p, r, res.p, dw.p, N, C, eps, dt);
          } else {
            st = ln ? ts_k_add_layernorm_forward(&gpu.ctx, out.p, m, r, res.p, in_a, db.p, dw.p,
                                                 dbias.p, N, C, eps, dt)
                    : ts_k_add_rmsnorm_forward(&gpu.ctx, out.p, r, res.p, in_a, db.p, dw.p, N, C,
                                               eps, dt);
          }
          EXPECT_EQ(st, TS_OK) << ts_last_error();
          gpu.sync();
          return std::vector<std::vector<unsigned char>>{res.get(), out.get(), mean.get(),
                                                         rstd.get()};
        };
        auto fused = run(0), in_place = run(1), unfused = run(2);
        for (int i = 0; i < 4; i++) {
          EXPECT_TRUE(fused[i] == unfused[i]) << names[i] << ": fused and unfused differ";
          EXPECT_TRUE(in_place[i] == unfused[i]) << names[i] << ": in place and unfused differ";
        }
        std::vector<unsigned char> cpu_res(nb);
        ASSERT_EQ(ts_k_add(cpu.get(), cpu_res.data(), a.data(), b.data(), N * C, dt), TS_OK);
        EXPECT_TRUE(fused[0] == cpu_res) << "res differs from the CPU's ts_k_add";
      }
}

TEST(CudaParity, AdamwMatchesCpuBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t n = 100003;
  const ts_dtype all[] = {TS_FP32, TS_BF16, TS_FP16};
  for (ts_dtype pdt : all) {
    for (ts_dtype gdt : all) {
      SCOPED_TRACE(std::string("param ") + ts_dtype_name(pdt) + ", grad " + ts_dtype_name(gdt));
      Rng rng(42);
      auto master = rng.vec(n, -2, 2);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      size_t pb = n * ts_dtype_size(pdt), gb = n * ts_dtype_size(gdt);
      DevBuf dmaster(n * 4), dm(n * 4), dv(n * 4), dparam(pb), dgrad(gb);
      dmaster.put(master.data());
      dm.put(m.data());
      dv.put(v.data());
      std::vector<unsigned char> param(pb);
      CpuCtx cpu;
      CudaCtx gpu;
      for (int step = 1; step <= 3; step++) {
        ts_adamw_hparams hp = {1e-3f * step, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f};
        ts_test::Buf g(rng.vec(n, -3, 3), gdt);
        dgrad.put(g.data());
        ASSERT_EQ(ts_k_adamw(cpu.get(), master.data(), param.data(), pdt, m.data(), v.data(),
                             g.data(), gdt, n, &hp),
                  TS_OK);
        ASSERT_EQ(ts_k_adamw(&gpu.ctx, (float *)dmaster.p, dparam.p, pdt, (float *)dm.p,
                             (float *)dv.p, dgrad.p, gdt, n, &hp),
                  TS_OK)
            << ts_last_error();
        gpu.sync();
      }
      EXPECT_TRUE(dmaster.get() == bytes_of(master.data(), n * 4));
      EXPECT_TRUE(dm.get() == bytes_of(m.data(), n * 4));
      EXPECT_TRUE(dv.get() == bytes_of(v.data(), n * 4));
      EXPECT_TRUE(dparam.get() == param);
    }
  }
}


// ---- fp8 (kernels/fp8.h, kernels/cuda/fp8.cu) ------------------------------
// The casts share kernels/fp8.h with the CPU, so codes and inverse scales
// must be the CPU's bit for bit, in every scaling, format and layout. The
// products differ from the CPU's only in the fp32 summation: cuBLASLt's fp8
// kernels on Hopper accumulate in the tensor cores with about 14 bits kept
// (DeepSeek-V3 report §3.3.2) before fp32 promotion, and the forward uses
// fast accumulation (no promotion). Bound per element: 2^-7 |cpu| (both
// sides round to bf16 once: 2 half ulps) + 2^-10 S, S = sum_k |a_k b_k| x
// the scales (a 2^-13 accumulator error, 8x over), + the old value's
// share for dweight (in |cpu|).

struct GpuFp8 {
  ts_kctx ctx;
  void *ws = nullptr;
  explicit GpuFp8(size_t bytes) {
    EXPECT_EQ(ts_k_context_init(&ctx, TS_DEVICE_CUDA, 0), TS_OK);
    EXPECT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
    ctx.workspace = ws;
    ctx.workspace_bytes = bytes;
  }
  ~GpuFp8() {
    cudaFree(ws);
    ts_k_context_destroy(&ctx);
  }
};

TEST(CudaFp8, QuantizeMatchesCpuBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t R = 300, C = 77;  // neither a multiple of the 32 x 32 tiles
  Rng rng(17);
  std::vector<float> x = rng.vec(R * C, -2.0f, 2.0f);
  for (size_t c = 0; c < C; c++) x[11 * C + c] *= 3000.0f;
  for (size_t r = 0; r < R; r++) x[r * C + 5] *= 1e-5f;
  x[42] = NAN;  // only in the NaN pass below
  for (int with_nan : {0, 1}) {
    std::vector<float> xin = x;
    if (!with_nan) xin[42] = 0.5f;
    for (ts_dtype dt : {TS_FP32, TS_BF16})
      for (ts_fp8_format f : {TS_FP8_E4M3, TS_FP8_E5M2})
        for (ts_fp8_scaling sc : {TS_FP8_TENSORWISE, TS_FP8_ROWWISE})
          for (int tr : {0, 1}) {
            SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " format " + std::to_string(f) +
                         " scaling " + ts_fp8_scaling_name(sc) + " transpose " +
                         std::to_string(tr) + " nan " + std::to_string(with_nan));
            ts_test::Buf in(xin, dt);
            size_t rows = tr ? C : R, ib = R * C * ts_dtype_size(dt);
            std::vector<uint8_t> want(R * C);
            std::vector<float> want_s(rows);
            CpuCtx cpu;
            ASSERT_EQ(ts_k_fp8_quantize(cpu.get(), want.data(), want_s.data(), in.data(), R, C,
                                        tr, f, sc, dt),
                      TS_OK);
            GpuFp8 g(ts_k_fp8_quantize_workspace_bytes(TS_DEVICE_CUDA, R, C));
            DevBuf din(ib), dout(R * C), ds(rows * sizeof(float));
            din.put(in.data());
            ASSERT_EQ(ts_k_fp8_quantize(&g.ctx, (uint8_t *)dout.p, (float *)ds.p, din.p, R, C, tr,
                                        f, sc, dt),
                      TS_OK);
            ASSERT_EQ(ts_k_synchronize(&g.ctx), TS_OK);
            EXPECT_EQ(dout.get(), std::vector<unsigned char>(want.begin(), want.end()));
            size_t ns = sc == TS_FP8_TENSORWISE ? 1 : rows;
            std::vector<unsigned char> gs = ds.get();
            EXPECT_EQ(0, std::memcmp(gs.data(), want_s.data(), ns * sizeof(float)));
          }
  }
}

TEST(CudaFp8, LinearMatchesCpuWithinTheAccumulationBound) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const size_t M = 256, N = 192, K = 320;
  Rng rng(23);
  std::vector<float> x = ts_test::round_to(rng.vec(M * K), TS_BF16);
  std::vector<float> w = ts_test::round_to(rng.vec(N * K, -0.1f, 0.1f), TS_BF16);
  std::vector<float> dy = ts_test::round_to(rng.vec(M * N, -1e-3f, 1e-3f), TS_BF16);
  std::vector<float> dw0 = ts_test::round_to(rng.vec(N * K, -1e-2f, 1e-2f), TS_BF16);
  for (ts_fp8_scaling sc : {TS_FP8_TENSORWISE, TS_FP8_ROWWISE}) {
    SCOPED_TRACE(ts_fp8_scaling_name(sc));
    CpuCtx cpu(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N, K, sc));
    ts_test::Buf bx(x, TS_BF16), bw(w, TS_BF16), bdy(dy, TS_BF16), bdw(dw0, TS_BF16);
    ts_test::Buf y(std::vector<float>(M * N), TS_BF16), dx(std::vector<float>(M * K), TS_BF16);
    ASSERT_EQ(ts_k_linear_fp8_forward(cpu.get(), y.data(), bx.data(), bw.data(), M, N, K, sc,
                                      TS_BF16),
              TS_OK);
    ASSERT_EQ(ts_k_linear_fp8_backward(cpu.get(), dx.data(), bdw.data(), bdy.data(), bx.data(),
                                       bw.data(), M, N, K, sc, TS_BF16),
              TS_OK);
    GpuFp8 g(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CUDA, M, N, K, sc));
    DevBuf gx(M * K * 2), gw(N * K * 2), gdy(M * N * 2), gdw(N * K * 2), gy(M * N * 2),
        gdx(M * K * 2);
    ts_test::Buf dw_start(dw0, TS_BF16);
    gx.put(ts_test::Buf(x, TS_BF16).data());
    gw.put(ts_test::Buf(w, TS_BF16).data());
    gdy.put(ts_test::Buf(dy, TS_BF16).data());
    gdw.put(dw_start.data());
    ts_status st = ts_k_linear_fp8_forward(&g.ctx, gy.p, gx.p, gw.p, M, N, K, sc, TS_BF16);
    if (major * 10 + minor < 89) {  // the refusal instead
      EXPECT_EQ(st, TS_ERR_UNSUPPORTED) << ts_last_error();
      return;
    }
    ASSERT_EQ(st, TS_OK) << ts_last_error();
    ASSERT_EQ(ts_k_linear_fp8_backward(&g.ctx, gdx.p, gdw.p, gdy.p, gx.p, gw.p, M, N, K, sc,
                                       TS_BF16),
              TS_OK)
        << ts_last_error();
    ASSERT_EQ(ts_k_synchronize(&g.ctx), TS_OK);
    auto widen = [](const std::vector<unsigned char> &b) {
      std::vector<float> f(b.size() / 2);
      for (size_t i = 0; i < f.size(); i++) {
        uint16_t h;
        std::memcpy(&h, &b[2 * i], 2);
        f[i] = ts_bf16_to_f32(h);
      }
      return f;
    };
    // S per element from the unquantised operands (the casts change each
    // term by at most 2^-3 relative: folded into the 2^-10's margin)
    auto check = [](const char *what, const std::vector<float> &gpu, const std::vector<float> &cpu,
                    const std::vector<float> &a, const std::vector<float> &b, size_t P, size_t S,
                    size_t Q, bool a_t, bool b_t) {
      int bad = 0;
      for (size_t p = 0; p < P; p++)
        for (size_t s = 0; s < S; s++) {
          double mag = 0;
          for (size_t q = 0; q < Q; q++) {
            double av = a_t ? a[q * P + p] : a[p * Q + q], bv = b_t ? b[q * S + s] : b[s * Q + q];
            mag += std::fabs(av * bv);
          }
          double c = cpu[p * S + s], d = std::fabs(gpu[p * S + s] - c);
          double bound = std::ldexp(std::fabs(c), -7) + std::ldexp(mag, -10);
          if (!(d <= bound) && bad++ < 5)
            ADD_FAILURE() << what << "[" << p << ", " << s << "] gpu " << gpu[p * S + s]
                          << " cpu " << c << " bound " << bound;
        }
    };
    // y (M, N) = x (M, K) w (N, K)^T; dx (M, K) = dy (M, N) w (N, K);
    // dw (N, K) += dy^T (N, M) x (M, K)
    check("y", widen(gy.get()), y.get(), x, w, M, N, K, false, false);
    check("dinp", widen(gdx.get()), dx.get(), dy, w, M, K, N, false, true);
    check("dweight", widen(gdw.get()), bdw.get(), dy, x, N, K, M, true, true);
    // run to run: the same bits
    std::vector<unsigned char> y1 = gy.get();
    ASSERT_EQ(ts_k_linear_fp8_forward(&g.ctx, gy.p, gx.p, gw.p, M, N, K, sc, TS_BF16), TS_OK);
    ASSERT_EQ(ts_k_synchronize(&g.ctx), TS_OK);
    EXPECT_EQ(gy.get(), y1);
  }
}

}  // namespace

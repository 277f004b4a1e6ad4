// CPU-vs-CUDA parity of the ops with a CUDA body (ts_k_cast, ts_k_adamw):
// both share kernels/elementwise.h's bit-exact conversions and IEEE-rounded
// AdamW element math, so results must agree bit for bit. Needs a GPU
// (tag "gpu"); fails when the CUDA runtime finds no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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

}  // namespace

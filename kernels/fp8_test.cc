// The fp8 reference (kernels/fp8.h and the CPU's fp8 ops): conversions
// against NVIDIA's own (cuda_fp8.h's host implementation of
// __nv_cvt_float_to_fp8 with __NV_SATFINITE, an independent source), the
// scale against torchao's formula computed here in double, the cast op
// against an element-by-element reference, and the fp8 linear layer against
// the unquantised product within the bound the casts' roundings give.
#include <cuda_fp8.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

using ts_test::Buf;
using ts_test::CpuCtx;
using ts_test::Rng;

namespace {

const ts_fp8_format kFormats[] = {TS_FP8_E4M3, TS_FP8_E5M2};

uint8_t nv_encode(float x, ts_fp8_format f) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == TS_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}

float nv_decode(uint8_t b, ts_fp8_format f) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(b, f == TS_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST(Fp8, DecodeMatchesNvidiaForEveryCode) {
  for (ts_fp8_format f : kFormats)
    for (int c = 0; c < 256; c++) {
      float mine = ts_fp8_to_f32((uint8_t)c, f), nv = nv_decode((uint8_t)c, f);
      if (std::isnan(nv)) {
        EXPECT_TRUE(std::isnan(mine)) << "format " << f << " code " << c;
      } else {
        EXPECT_EQ(bits(mine), bits(nv)) << "format " << f << " code " << c;
      }
    }
  EXPECT_EQ(ts_fp8_to_f32(0x7e, TS_FP8_E4M3), 448.0f);
  EXPECT_EQ(ts_fp8_to_f32(0x7b, TS_FP8_E5M2), 57344.0f);
  EXPECT_EQ(ts_fp8_to_f32(0x01, TS_FP8_E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(ts_fp8_to_f32(0x01, TS_FP8_E5M2), std::ldexp(1.0f, -16));
}

// Every 31st fp32 bit pattern (139 million, all exponents and signs), and
// around every midpoint of two neighbouring codes (the ties and the values
// one ulp either side), the saturating cases and NaN. Measured here: all
// 2^32 patterns agree in both formats (28 s, too slow for every run).
TEST(Fp8, EncodeMatchesNvidia) {
  long bad = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 31) {
    float x;
    uint32_t v = (uint32_t)u;
    std::memcpy(&x, &v, 4);
    for (ts_fp8_format f : kFormats)
      if (ts_f32_to_fp8(x, f) != nv_encode(x, f) && bad++ < 5)
        ADD_FAILURE() << "x bits 0x" << std::hex << v << " format " << f;
  }
  for (ts_fp8_format f : kFormats)
    for (int c = 0; c < 0x7f; c++) {
      float lo = ts_fp8_to_f32((uint8_t)c, f), hi = ts_fp8_to_f32((uint8_t)(c + 1), f);
      if (std::isnan(hi) || std::isinf(hi)) continue;
      float mid = (float)(((double)lo + (double)hi) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid, hi * 1.5f})
        if (ts_f32_to_fp8(x, f) != nv_encode(x, f) && bad++ < 10)
          ADD_FAILURE() << "x " << x << " between codes " << c << ", " << c + 1 << " format " << f;
    }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(ts_f32_to_fp8(1e9f, TS_FP8_E4M3), 0x7e);  // saturates to 448
  EXPECT_EQ(ts_f32_to_fp8(-INFINITY, TS_FP8_E5M2), 0xfb);
  EXPECT_EQ(ts_f32_to_fp8(NAN, TS_FP8_E4M3), 0x7f);
}

// torchao's amax_to_scale: max / clamp(amax, 1e-12) in fp64, to fp32; the
// rowwise recipe then exp2(floor(log2(scale))).
TEST(Fp8, ScaleIsTorchaosFormula) {
  Rng rng(7);
  std::vector<float> amaxes = {0.0f, 1e-13f, 1e-12f, 3e-7f, 0.1f, 1.0f, 3.0f, 448.0f, 1e30f,
                               3.4e38f};
  for (int i = 0; i < 1000; i++) amaxes.push_back(std::ldexp(rng.uniform(0.5f, 1.0f), rng.below(80) - 40));
  for (ts_fp8_format f : kFormats)
    for (float a : amaxes) {
      double maxf = f == TS_FP8_E4M3 ? 448.0 : 57344.0;
      float want = (float)(maxf / std::fmax((double)a, 1e-12));
      EXPECT_EQ(bits(ts_fp8_scale(a, f, 0)), bits(want)) << a;
      float want2 = (float)std::exp2(std::floor(std::log2((double)want)));
      EXPECT_EQ(bits(ts_fp8_scale(a, f, 1)), bits(want2)) << a;
    }
  EXPECT_EQ(ts_fp8_scale(INFINITY, TS_FP8_E4M3, 1), 0.0f);
  EXPECT_TRUE(std::isnan(ts_fp8_scale(NAN, TS_FP8_E4M3, 0)));
  // Every NaN, whatever its payload, gives the one pattern both devices
  // store (x86 keeps a payload through a division, CUDA does not).
  for (uint32_t nan : {0x7fc00000u, 0x7fc12345u, 0xffc00001u, 0x7f800001u, 0x7fffffffu}) {
    float x;
    std::memcpy(&x, &nan, 4);
    EXPECT_EQ(bits(ts_fp8_scale(x, TS_FP8_E5M2, 1)), TS_FP8_NAN_BITS) << std::hex << nan;
    EXPECT_EQ(bits(ts_fp8_scale_inv(x)), TS_FP8_NAN_BITS) << std::hex << nan;
  }
  EXPECT_EQ(bits(ts_fp8_scale_inv(0.25f)), bits(4.0f));
}

// A NaN in the tensor: the codes of its scale are NaN (0x7f) and the stored
// inverse scale is TS_FP8_NAN_BITS, not the input's payload.
TEST(Fp8, QuantizeStoresOneNanPattern) {
  const size_t R = 4, C = 8;
  std::vector<float> x(R * C, 1.5f);
  uint32_t payload = 0x7fc12345u;
  std::memcpy(&x[2 * C + 3], &payload, 4);
  for (ts_fp8_scaling sc : {TS_FP8_TENSORWISE, TS_FP8_ROWWISE}) {
    std::vector<uint8_t> got(R * C);
    std::vector<float> sinv(R);
    CpuCtx ctx(ts_k_fp8_quantize_workspace_bytes(TS_DEVICE_CPU, R, C));
    ASSERT_EQ(ts_k_fp8_quantize(ctx.get(), got.data(), sinv.data(), x.data(), R, C, 0,
                                TS_FP8_E4M3, sc, TS_FP32),
              TS_OK);
    EXPECT_EQ(bits(sinv[sc == TS_FP8_TENSORWISE ? 0 : 2]), TS_FP8_NAN_BITS) << sc;
    EXPECT_EQ(got[2 * C], 0x7f) << sc;  // 1.5 times a NaN scale
    if (sc == TS_FP8_ROWWISE)  // the other rows keep their own scales
      EXPECT_EQ(bits(sinv[1]), bits(ts_fp8_scale_inv(ts_fp8_scale(1.5f, TS_FP8_E4M3, 1))));
  }
}

// The scale and codes of one row (or the whole tensor), computed here.
void reference_cast(const std::vector<float> &x, float scale, ts_fp8_format f, uint8_t *out) {
  double mx = f == TS_FP8_E4M3 ? 448.0 : 57344.0;
  for (size_t i = 0; i < x.size(); i++) {
    float v = x[i] * scale;
    v = (float)std::fmin(std::fmax((double)v, -mx), mx);
    out[i] = nv_encode(v, f);
  }
}

float reference_scale(const std::vector<float> &x, ts_fp8_format f, int pow2) {
  double a = 0;
  for (float v : x) a = std::fmax(a, std::fabs((double)v));
  double mx = f == TS_FP8_E4M3 ? 448.0 : 57344.0;
  float s = (float)(mx / std::fmax(a, 1e-12));
  return pow2 ? (float)std::exp2(std::floor(std::log2((double)s))) : s;
}

TEST(Fp8, QuantizeMatchesElementReference) {
  const size_t R = 37, C = 53;
  Rng rng(11);
  std::vector<float> x = rng.vec(R * C, -3.0f, 3.0f);
  for (size_t c = 0; c < C; c++) x[5 * C + c] *= 1000.0f;  // one loud row
  for (size_t r = 0; r < R; r++) x[r * C + 7] *= 1e-4f;    // one quiet column
  for (size_t c = 0; c < C; c++) x[9 * C + c] = 0.0f;       // an all-zero row
  for (ts_dtype dt : {TS_FP32, TS_BF16})
    for (ts_fp8_format f : kFormats)
      for (ts_fp8_scaling sc : {TS_FP8_TENSORWISE, TS_FP8_ROWWISE})
        for (int tr : {0, 1}) {
          Buf in(x, dt);
          std::vector<float> xs = in.get();  // what the tensor holds
          size_t rows = tr ? C : R, cols = tr ? R : C;
          std::vector<uint8_t> got(R * C), want(R * C);
          std::vector<float> sinv(rows), want_sinv(rows);
          CpuCtx ctx(ts_k_fp8_quantize_workspace_bytes(TS_DEVICE_CPU, R, C));
          ASSERT_EQ(ts_k_fp8_quantize(ctx.get(), got.data(), sinv.data(), in.data(), R, C, tr, f,
                                      sc, dt),
                    TS_OK);
          std::vector<std::vector<float>> out_rows(rows, std::vector<float>(cols));
          for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) out_rows[r][c] = tr ? xs[c * C + r] : xs[r * C + c];
          float ts = reference_scale(xs, f, 0);
          for (size_t r = 0; r < rows; r++) {
            float s = sc == TS_FP8_TENSORWISE ? ts : reference_scale(out_rows[r], f, 1);
            reference_cast(out_rows[r], s, f, &want[r * cols]);
            want_sinv[r] = 1.0f / s;
          }
          EXPECT_EQ(got, want) << "dt " << dt << " format " << f << " scaling " << sc
                               << " transpose " << tr;
          size_t ns = sc == TS_FP8_TENSORWISE ? 1 : rows;
          for (size_t r = 0; r < ns; r++) EXPECT_EQ(bits(sinv[r]), bits(want_sinv[r])) << r;
        }
}

// Bound on |fp8(x)/scale - x| for an element of format f: half a unit in the
// last place, 2^-(M+1) relative, or half the smallest subnormal step in
// absolute terms (undone by 1/scale).
double cast_error(double x, double scale_inv, ts_fp8_format f) {
  int M = f == TS_FP8_E4M3 ? 3 : 2;
  double sub = f == TS_FP8_E4M3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  return std::ldexp(std::fabs(x), -(M + 1)) + sub * scale_inv;
}

struct LinearCase {
  size_t M = 32, N = 48, K = 64;
  std::vector<float> x, w, dy, dw0;
  explicit LinearCase(uint64_t seed) {
    Rng rng(seed);
    x = ts_test::round_to(rng.vec(M * K), TS_BF16);
    w = ts_test::round_to(rng.vec(N * K, -0.2f, 0.2f), TS_BF16);
    dy = ts_test::round_to(rng.vec(M * N, -1e-3f, 1e-3f), TS_BF16);
    dw0 = ts_test::round_to(rng.vec(N * K, -0.01f, 0.01f), TS_BF16);
    for (size_t k = 0; k < K; k++) x[3 * K + k] *= 64.0f;  // rows of other magnitudes
    for (size_t n = 0; n < N; n++) dy[4 * N + n] *= 1e-3f;
  }
};

// out (P, S) vs sum_q a[p, q] b[s, q] in double, within the cast errors of
// both operands (ea, eb per element, from the largest scale_inv any
// scaling could give: |amax| / max * 2 for powers of two), plus bf16's
// rounding of the result and fp32's of the sum.
void expect_near_product(const std::vector<float> &out, const std::vector<float> &a,
                         const std::vector<float> &b, size_t P, size_t S, size_t Q,
                         ts_fp8_format fa, ts_fp8_format fb, const std::vector<float> *base,
                         const char *what) {
  auto amax_inv = [](const std::vector<float> &v, ts_fp8_format f) {
    double m = 0;
    for (float x : v) m = std::fmax(m, std::fabs((double)x));
    return 2 * m / (f == TS_FP8_E4M3 ? 448.0 : 57344.0);
  };
  double ia = amax_inv(a, fa), ib = amax_inv(b, fb);
  int bad = 0;
  for (size_t p = 0; p < P; p++)
    for (size_t s = 0; s < S; s++) {
      double ref = base ? (*base)[p * S + s] : 0.0, bound = 0, mag = 0;
      for (size_t q = 0; q < Q; q++) {
        double av = a[p * Q + q], bv = b[s * Q + q];
        double e1 = cast_error(av, ia, fa), e2 = cast_error(bv, ib, fb);
        ref += av * bv;
        bound += e1 * std::fabs(bv) + std::fabs(av) * e2 + e1 * e2;
        mag += std::fabs(av * bv);
      }
      bound += std::ldexp(std::fabs(ref), -8) + std::ldexp(mag, -20);
      if (std::fabs(out[p * S + s] - ref) > bound && bad++ < 5)
        ADD_FAILURE() << what << " [" << p << ", " << s << "] = " << out[p * S + s] << ", want "
                      << ref << " +- " << bound;
    }
}

std::vector<float> transpose(const std::vector<float> &v, size_t R, size_t C) {
  std::vector<float> t(v.size());
  for (size_t r = 0; r < R; r++)
    for (size_t c = 0; c < C; c++) t[c * R + r] = v[r * C + c];
  return t;
}

TEST(Fp8, LinearIsTheProductWithinTheCastErrors) {
  LinearCase t(3);
  const size_t M = t.M, N = t.N, K = t.K;
  for (ts_fp8_scaling sc : {TS_FP8_TENSORWISE, TS_FP8_ROWWISE}) {
    SCOPED_TRACE(ts_fp8_scaling_name(sc));
    CpuCtx ctx(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N, K, sc));
    Buf x(t.x, TS_BF16), w(t.w, TS_BF16), dy(t.dy, TS_BF16), dw(t.dw0, TS_BF16);
    Buf y(std::vector<float>(M * N), TS_BF16), dx(std::vector<float>(M * K), TS_BF16);
    ASSERT_EQ(ts_k_linear_fp8_forward(ctx.get(), y.data(), x.data(), w.data(), M, N, K, sc,
                                      TS_BF16),
              TS_OK);
    expect_near_product(y.get(), t.x, t.w, M, N, K, TS_FP8_E4M3, TS_FP8_E4M3, nullptr, "y");
    ASSERT_EQ(ts_k_linear_fp8_backward(ctx.get(), dx.data(), dw.data(), dy.data(), x.data(),
                                       w.data(), M, N, K, sc, TS_BF16),
              TS_OK);
    expect_near_product(dx.get(), t.dy, transpose(t.w, N, K), M, K, N, TS_FP8_E5M2, TS_FP8_E4M3,
                        nullptr, "dinp");
    expect_near_product(dw.get(), transpose(t.dy, M, N), transpose(t.x, M, K), N, K, M,
                        TS_FP8_E5M2, TS_FP8_E4M3, &t.dw0, "dweight");
  }
}

// The rowwise casts must use each row's own scale. A format with an
// exponent loses nothing to a shared scale while the scaled values stay
// normal, so the loud row is 10^5 times the others: tensorwise pushes the
// quiet rows below E4M3's smallest normal (2^-6), where its steps are
// 2^-9 absolute, and their error must grow; rowwise keeps 3 mantissa bits.
TEST(Fp8, RowwiseKeepsQuietRowsPrecise) {
  const size_t M = 16, N = 16, K = 32;
  Rng rng(5);
  std::vector<float> x = ts_test::round_to(rng.vec(M * K), TS_BF16), w(N * K, 0.0f);
  for (size_t k = 0; k < K; k++) x[k] = 1e5f;  // row 0 loud
  for (size_t n = 0; n < N; n++) w[n * K + n] = 1.0f;  // y[:, n] = x[:, n]: the cast values
  double err[2] = {0, 0};
  ts_fp8_scaling s[2] = {TS_FP8_TENSORWISE, TS_FP8_ROWWISE};
  for (int i = 0; i < 2; i++) {
    CpuCtx ctx(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N, K, s[i]));
    Buf bx(x, TS_BF16), bw(w, TS_BF16), y(std::vector<float>(M * N), TS_BF16);
    ASSERT_EQ(ts_k_linear_fp8_forward(ctx.get(), y.data(), bx.data(), bw.data(), M, N, K, s[i],
                                      TS_BF16),
              TS_OK);
    std::vector<float> out = y.get();
    for (size_t m = 1; m < M; m++)
      for (size_t n = 0; n < N; n++)
        err[i] = std::fmax(err[i], std::fabs(out[m * N + n] - x[m * K + n]));
  }
  EXPECT_LT(err[1], 0.07) << "rowwise: 3 mantissa bits on values up to 1";
  EXPECT_GT(err[0], 4 * err[1]) << "tensorwise shares the loud row's scale";
}

TEST(Fp8, LinearBitsDoNotDependOnThreadCount) {
  LinearCase t(9);
  const size_t M = t.M, N = t.N, K = t.K;
  std::vector<uint16_t> out[2];
  int saved = omp_get_max_threads();
  for (int i = 0; i < 2; i++) {
    omp_set_num_threads(i ? 3 : 1);
    CpuCtx ctx(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_FP8_ROWWISE));
    Buf x(t.x, TS_BF16), w(t.w, TS_BF16), dy(t.dy, TS_BF16), dw(t.dw0, TS_BF16);
    Buf y(std::vector<float>(M * N), TS_BF16), dx(std::vector<float>(M * K), TS_BF16);
    ASSERT_EQ(ts_k_linear_fp8_forward(ctx.get(), y.data(), x.data(), w.data(), M, N, K,
                                      TS_FP8_ROWWISE, TS_BF16),
              TS_OK);
    ASSERT_EQ(ts_k_linear_fp8_backward(ctx.get(), dx.data(), dw.data(), dy.data(), x.data(),
                                       w.data(), M, N, K, TS_FP8_ROWWISE, TS_BF16),
              TS_OK);
    out[i] = y.h;
    out[i].insert(out[i].end(), dx.h.begin(), dx.h.end());
    out[i].insert(out[i].end(), dw.h.begin(), dw.h.end());
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(out[0], out[1]);
}

TEST(Fp8, LinearRefusesWhatTheGpuCannotRun) {
  const size_t M = 32, N = 32, K = 32;
  CpuCtx ctx(ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N + 8, K, TS_FP8_ROWWISE));
  std::vector<float> buf(4 * 64 * 64);
  void *p = buf.data();
  EXPECT_EQ(ts_k_linear_fp8_forward(ctx.get(), p, p, p, M, N, K, TS_FP8_ROWWISE, TS_FP32),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("expected bf16"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_linear_fp8_forward(ctx.get(), p, p, p, M, N + 8, K, TS_FP8_ROWWISE, TS_BF16),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("multiple of 16"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_k_linear_fp8_forward(ctx.get(), p, p, p, M, N, K, TS_FP8_OFF, TS_BF16),
            TS_ERR_INVALID_ARGUMENT);
  ts_kctx deferred = ctx.ctx;
  deferred.wgrad = (struct ts_k_wgrad *)p;  // never read: refused first
  EXPECT_EQ(ts_k_linear_fp8_backward(&deferred, nullptr, p, p, p, p, M, N, K, TS_FP8_ROWWISE,
                                     TS_BF16),
            TS_ERR_UNSUPPORTED);
  ts_kctx small = ctx.ctx;
  small.workspace_bytes = ts_k_linear_fp8_workspace_bytes(TS_DEVICE_CPU, M, N, K, TS_FP8_ROWWISE) - 1;
  EXPECT_EQ(ts_k_linear_fp8_forward(&small, p, p, p, M, N, K, TS_FP8_ROWWISE, TS_BF16),
            TS_ERR_OUT_OF_MEMORY);
}

}  // namespace

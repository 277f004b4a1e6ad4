/*
 * kernels_test_util.h — shared helpers of the kernels tests: a seeded RNG,
 * a CPU kernel context owning an aligned workspace, dtype conversion of
 * whole vectors, and tolerance helpers. Test-only (C++17).
 */
#ifndef TS_KERNELS_KERNELS_TEST_UTIL_H
#define TS_KERNELS_KERNELS_TEST_UTIL_H

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/rng.h"
#include "kernels/elementwise.h"
#include "kernels/kernels.h"

namespace ts_test {

/* A seeded generator of test inputs (splitmix64, base/rng.h): the same
 * stream on every host. */
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() { return ts_splitmix64(&s); }
  /* uniform in [lo, hi) */
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return lo + (hi - lo) * (float)((next() >> 40) * (1.0 / 16777216.0));
  }
  std::vector<float> vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto &x : v) x = uniform(lo, hi);
    return v;
  }
  int32_t below(int32_t n) { return (int32_t)(next() % (uint64_t)n); }
};

/* A CPU ts_kctx with an owned, 64-byte-aligned workspace of `bytes` bytes. */
struct CpuCtx {
  ts_kctx ctx;
  void *mem = nullptr;
  explicit CpuCtx(size_t bytes = 0) {
    std::memset(&ctx, 0, sizeof ctx);
    ctx.device = TS_DEVICE_CPU;
    resize(bytes);
  }
  void resize(size_t bytes) {
    std::free(mem);
    mem = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
    ctx.workspace = mem;
    ctx.workspace_bytes = bytes;
  }
  ~CpuCtx() { std::free(mem); }
  CpuCtx(const CpuCtx &) = delete;
  CpuCtx &operator=(const CpuCtx &) = delete;
  const ts_kctx *get() const { return &ctx; }
};

/* Storage of a vector in dtype dt: fp32 values or 16-bit patterns. */
struct Buf {
  ts_dtype dt;
  std::vector<float> f;
  std::vector<uint16_t> h;
  Buf(const std::vector<float> &x, ts_dtype d) : dt(d) {
    if (d == TS_FP32) {
      f = x;
    } else {
      h.resize(x.size());
      for (size_t i = 0; i < x.size(); i++)
        h[i] = d == TS_BF16 ? ts_f32_to_bf16(x[i]) : ts_f32_to_f16(x[i]);
    }
  }
  void *data() { return dt == TS_FP32 ? (void *)f.data() : (void *)h.data(); }
  size_t size() const { return dt == TS_FP32 ? f.size() : h.size(); }
  std::vector<float> get() const {
    if (dt == TS_FP32) return f;
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); i++)
      out[i] = dt == TS_BF16 ? ts_bf16_to_f32(h[i]) : ts_f16_to_f32(h[i]);
    return out;
  }
};

/* x rounded to dtype dt and widened back (what a half tensor holds). */
inline std::vector<float> round_to(const std::vector<float> &x, ts_dtype dt) {
  return Buf(x, dt).get();
}

/* Unit roundoff of a storage dtype: 2^-p for p significant bits. */
inline double unit_roundoff(ts_dtype dt) {
  return dt == TS_FP32   ? std::ldexp(1.0, -24)
         : dt == TS_BF16 ? std::ldexp(1.0, -8)
                         : std::ldexp(1.0, -11);
}

/* Half the spacing of dtype dt's values at magnitude |x| (its binade's,
 * subnormals' below the smallest normal): the most one round-to-nearest
 * to dt moves a value of that magnitude. */
inline double half_ulp(ts_dtype dt, double x) {
  const int p = dt == TS_FP32 ? 24 : dt == TS_BF16 ? 8 : 11;  // significant bits
  const int emin = dt == TS_FP16 ? -14 : -126;                 // smallest normal's exponent
  int e = emin + 1;
  if (x != 0) std::frexp(std::fabs(x), &e);  // |x| = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, (e - 1 > emin ? e - 1 : emin) - p);
}

/* ts_k_linear_bias_forward's bound: out (M, N) = x (M, K) @ w (N, K)^T +
 * b (N) rounded once to dt lies within tol of ref, the exact value (in
 * double): half an ulp of dt at |ref| + e, plus e, where e = 2.1 (K + 1)
 * u32 times the terms' magnitudes sum |x w| + |b| bounds the fp32 error
 * of the K products' sum and the bias' addition (Higham 3.1; 2.1: twice
 * that, as the linear's parity bound). Two roundings (the product rounded
 * to dt first) err up to about an ulp and leave it. */
inline void linear_bias_bound(std::vector<double> &ref, std::vector<double> &tol,
                              const std::vector<float> &x, const std::vector<float> &w,
                              const std::vector<float> &b, size_t M, size_t N, size_t K,
                              ts_dtype dt) {
  ref.assign(M * N, 0);
  tol.assign(M * N, 0);
  for (size_t m = 0; m < M; m++)
    for (size_t n = 0; n < N; n++) {
      double s = b[n], mag = std::fabs(b[n]);
      for (size_t k = 0; k < K; k++) {
        s += (double)x[m * K + k] * w[n * K + k];
        mag += std::fabs((double)x[m * K + k] * w[n * K + k]);
      }
      double e = 2.1 * (K + 1) * std::ldexp(1.0, -24) * mag;
      ref[m * N + n] = s;
      tol[m * N + n] = half_ulp(dt, std::fabs(s) + e) + e;
    }
}

/* sum_i a[i] * w[i] in double. */
inline double dot(const std::vector<float> &a, const std::vector<float> &w) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * (double)w[i];
  return s;
}

inline double max_abs(const std::vector<float> &a) {
  double m = 0;
  for (float x : a) m = std::fmax(m, std::fabs((double)x));
  return m;
}

/* Reference RoPE rotation of x (B, T, H, HS), sign +1 forward, -1 back: the fp32 angle of Hugging Face (powf, fp32 product),
* then cos/sin and the rotation in double. */
inline void rope_ref(std::vector<double> &out, const std::vector<float> &x, size_t B, size_t T,
                     size_t H, size_t HS, float theta, int sign) {
  size_t half = HS / 2;
  out.assign(x.size(), 0);
  for (size_t b = 0; b < B; b++)
    for (size_t t = 0; t < T; t++)
      for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < half; i++) {
          float inv = 1.0f / std::pow(theta, (float)(2 * i) / (float)HS);
          float a = (float)t * inv;
          double cs = std::cos((double)a), sn = sign * std::sin((double)a);
          size_t o = ((b * T + t) * H + h) * HS;
          double x1 = x[o + i], x2 = x[o + i + half];
          out[o + i] = x1 * cs - x2 * sn;
          out[o + i + half] = x2 * cs + x1 * sn;
        }
}

}  // namespace ts_test

#endif /* TS_KERNELS_KERNELS_TEST_UTIL_H */

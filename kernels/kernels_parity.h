// kernels_parity.h — the harness of the backend parity test
// (kernels_parity_test.cc has the method; kernels_parity_layers.cc the
// cases of the model's layers): device buffers, moves to and from a
// backend, bound checks, the shapes, and the case table's entry type.
// Test-only (C++17).
#ifndef TS_KERNELS_KERNELS_PARITY_H
#define TS_KERNELS_KERNELS_PARITY_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_test_util.h"

namespace ts_parity {

using ts_test::Rng;

const double kU32 = std::ldexp(1.0, -24);

inline double U(ts_dtype dt) { return ts_test::unit_roundoff(dt); }

// The absolute part of one rounding to dt: half the smallest subnormal
// (fp16's 2^-24 spacing below 2^-14 matters; bf16 and fp32 reach 2^-133).
inline double Eta(ts_dtype dt) {
  return dt == TS_FP16 ? std::ldexp(1.0, -25) : dt == TS_BF16 ? std::ldexp(1.0, -134)
                                                               : std::ldexp(1.0, -150);
}

// ---- buffers on a backend -----------------------------------------------------

// Bytes of n elements of dt.
inline size_t Bytes(size_t n, ts_dtype dt) { return n * ts_dtype_size(dt); }

// A buffer on one device, freed with the test.
struct Dev {
  ts_device dev;
  void *p = nullptr;
  size_t bytes;
  Dev(ts_device d, size_t b) : dev(d), bytes(b) {
    EXPECT_EQ(ts_k_alloc(d, b ? b : 1, &p), TS_OK) << ts_last_error();
  }
  ~Dev() { ts_k_free(dev, p); }
  template <typename T>
  T *as() const {
    return static_cast<T *>(p);
  }
};
using DevPtr = std::unique_ptr<Dev>;

// One backend: its context with a workspace, and moves between host and it.
class Backend {
 public:
  explicit Backend(ts_device dev) : dev_(dev) {
    EXPECT_EQ(ts_k_context_init(&ctx_, dev, 0), TS_OK) << ts_last_error();
  }
  ~Backend() { ts_k_context_destroy(&ctx_); }
  ts_device device() const { return dev_; }
  const ts_kctx *ctx() const { return &ctx_; }
  // Sets ctx->flags (TS_K_*), returning the old ones.
  unsigned SetFlags(unsigned f) {
    unsigned old = ctx_.flags;
    ctx_.flags = f;
    return old;
  }
  // Gives the context at least `bytes` of workspace.
  void Workspace(size_t bytes) {
    if (ws_ && ws_->bytes >= bytes) return;
    ws_.reset(new Dev(dev_, bytes));
    ctx_.workspace = ws_->p;
    ctx_.workspace_bytes = bytes;
  }
  // x (already rounded to dt) stored as dt on the device.
  DevPtr Up(const std::vector<float> &x, ts_dtype dt) {
    ts_test::Buf h(x, dt);
    return UpBytes(h.data(), Bytes(x.size(), dt));
  }
  DevPtr UpInts(const std::vector<int32_t> &x) { return UpBytes(x.data(), x.size() * 4); }
  DevPtr UpBytes(const void *h, size_t n) {
    DevPtr d(new Dev(dev_, n));
    EXPECT_EQ(ts_k_from_host(&ctx_, d->p, h, n), TS_OK) << ts_last_error();
    EXPECT_EQ(ts_k_synchronize(&ctx_), TS_OK);
    return d;
  }
  // n elements of dt, every byte 0xFF (NaN in each float format).
  DevPtr Poisoned(size_t n, ts_dtype dt) { return PoisonedBytes(Bytes(n, dt)); }
  DevPtr PoisonedBytes(size_t n) {
    std::vector<unsigned char> h(n, 0xFF);
    return UpBytes(h.data(), h.size());
  }
  std::vector<unsigned char> DownBytes(const Dev &d, size_t n) {
    std::vector<unsigned char> h(n);
    EXPECT_EQ(ts_k_to_host(&ctx_, h.data(), d.p, n), TS_OK) << ts_last_error();
    return h;
  }
  // n elements of dt widened to fp32.
  std::vector<float> Down(const Dev &d, size_t n, ts_dtype dt) {
    std::vector<unsigned char> b = DownBytes(d, Bytes(n, dt));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) {
      if (dt == TS_FP32) {
        std::memcpy(&out[i], &b[4 * i], 4);
      } else {
        uint16_t h;
        std::memcpy(&h, &b[2 * i], 2);
        out[i] = dt == TS_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
      }
    }
    return out;
  }

 private:
  ts_device dev_;
  ts_kctx ctx_{};
  std::unique_ptr<Dev> ws_;
};

// Adds TS_K_* flags to b's context for its lifetime.
class WithFlags {
 public:
  WithFlags(Backend &b, unsigned add) : b_(b), old_(b.SetFlags(b.ctx()->flags | add)) {}
  ~WithFlags() { b_.SetFlags(old_); }

 private:
  Backend &b_;
  unsigned old_;
};

// Uniform in [lo, hi), rounded to dt (what a dt tensor can hold).
inline std::vector<float> Input(Rng &rng, size_t n, ts_dtype dt, float lo = -1.0f, float hi = 1.0f) {
  return ts_test::round_to(rng.vec(n, lo, hi), dt);
}

// Every got[i] finite and within tol[i] of ref[i]; failures name the
// element, the worst excess goes to the log.
inline void Expect(const char *what, const std::vector<float> &got, const std::vector<double> &ref,
            const std::vector<double> &tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double err = std::fabs((double)got[i] - ref[i]);
    if (!std::isfinite(got[i]) || !(err <= tol[i])) {
      if (bad++ < 5)
        ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << ref[i]
                      << ", bound " << tol[i] << (std::isfinite(got[i]) ? "" : " (not written?)");
    } else if (tol[i] > 0) {
      worst = std::fmax(worst, err / tol[i]);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of bounds";
  ::testing::Test::RecordProperty(std::string(what) + "_worst_error_over_bound", std::to_string(worst));
}

// Bitwise equality of two byte strings.
inline void ExpectBits(const char *what, const std::vector<unsigned char> &got,
                const std::vector<unsigned char> &want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t first = got.size();
  for (size_t i = 0; i < got.size() && first == got.size(); i++)
    if (got[i] != want[i]) first = i;
  EXPECT_EQ(first, got.size()) << what << ": first differing byte " << first;
}

// Bytes of x stored as dt on the host.
inline std::vector<unsigned char> HostBytes(const std::vector<float> &x, ts_dtype dt) {
  ts_test::Buf b(x, dt);
  const unsigned char *p = static_cast<const unsigned char *>(b.data());
  return std::vector<unsigned char>(p, p + Bytes(x.size(), dt));
}

// ---- the shapes ----------------------------------------------------------------

const size_t kB = 2, kT = 37, kN = kB * kT;  // odd sequence length
const size_t kC = 96, kNH = 6, kHS = 16, kI = 150, kV = 777;

// ---- the table ---------------------------------------------------------------

struct Case {
  const char *op;
  // Runs the op on backend b in dt and checks it; returns the op's status
  // (TS_ERR_UNSUPPORTED: the backend has no body, nothing was checked).
  std::function<ts_status(Backend &b, ts_dtype dt, Rng &rng)> run;
};

// Runs an op; a status other than TS_OK ends the case with it (only
// TS_ERR_UNSUPPORTED is expected: a backend without a body).
#define RUN_OR_RETURN(call)                        \
  do {                                             \
    ts_status s_ = (call);                         \
    if (s_ != TS_OK) {                             \
      EXPECT_EQ(s_, TS_ERR_UNSUPPORTED) << ts_last_error(); \
      return s_;                                   \
    }                                              \
  } while (0)

// Attention of kernels.h in double, causal GQA (ids empty) or
// bidirectional with key padding mask ids (NKV = NH): probs (B, NH, T, T)
// and out (B, T, NH, HS), with their bounds for storage dtype dt when the
// op holds P in pv_dt for the product P v (ts_k_attention_probs_dtype).
// q (B, T, NH, HS), k and v (B, T, NKV, HS) on the host, kB x kT x kNH x kHS.
struct AttnRef {
  std::vector<double> p, tp, o, to;
};
// The ids of the bidirectional cases (pad id 0), kB x kT.
std::vector<int32_t> PadIds();
AttnRef AttentionRef(const std::vector<float> &q, const std::vector<float> &k,
                     const std::vector<float> &v, size_t NKV, ts_dtype dt,
                     const std::vector<int32_t> &ids, ts_dtype pv_dt);

// The outputs of one run of a residual add and a norm, fused or not, on
// kN x kC, poisoned: out and res (kN, kC) of dt; n_stats fp32 (kN)
// statistics (RMSNorm: rstd; LayerNorm: mean, rstd).
struct AddNormRun {
  DevPtr out, res, stat[2];
  int n_stats;
  AddNormRun(Backend &b, ts_dtype dt, int n)
      : out(b.Poisoned(kN * kC, dt)), res(b.Poisoned(kN * kC, dt)), n_stats(n) {
    for (int i = 0; i < n; i++) stat[i] = b.Poisoned(kN, TS_FP32);
  }
};
// Checks res (kN x kC of dt on b) bit for bit against ts_k_add's
// arithmetic on the host (each a[i] + c[i] in fp32, rounded once to dt)
// and returns that sum: the norm's input.
std::vector<float> ExpectAddRes(Backend &b, ts_dtype dt, const std::vector<float> &a,
                                const std::vector<float> &c, const Dev &res);
// Every output of run got bit for bit run want's.
void ExpectSameBits(Backend &b, ts_dtype dt, const AddNormRun &got, const AddNormRun &want,
                    const char *what);

// The cases of the model's layers (kernels_parity_layers.cc).
ts_status RmsnormForward(Backend &b, ts_dtype dt, Rng &rng);
// ts_k_add_rmsnorm_forward: res bit for bit ts_k_add's, out and rstd
// within RMSNorm's bounds of res, and every output bit for bit the same
// op with res aliasing a and ts_k_add then ts_k_rmsnorm_forward on b.
ts_status AddRmsnormForward(Backend &b, ts_dtype dt, Rng &rng);
ts_status RmsnormBackward(Backend &b, ts_dtype dt, Rng &rng);
// HS: kHS on the parity shapes, or another head size on a short batch.
ts_status Rope(Backend &b, ts_dtype dt, Rng &rng, int backward, size_t HS = kHS);
// flags: TS_K_* added to the context for the call (TS_K_PLAIN_ATTENTION).
// bidir: the bidirectional op (NKV = NH) with padded keys instead of the
// causal one.
ts_status AttentionForward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, unsigned flags = 0,
                           bool bidir = false);
ts_status AttentionBackward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, unsigned flags = 0,
                            bool bidir = false);
// Decoding: RoPE of 5 rows at positions 7.. (ts_k_rope_forward_at); causal
// attention of batch row 0's last Tq queries over a cache of its kT keys
// (ts_k_attention_cached), against the whole sequence's reference rows.
ts_status RopeAt(Backend &b, ts_dtype dt, Rng &rng);
ts_status AttentionCached(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, size_t Tq);
ts_status SwigluForward(Backend &b, ts_dtype dt, Rng &rng);
ts_status SwigluBackward(Backend &b, ts_dtype dt, Rng &rng);
ts_status CrossEntropyForward(Backend &b, ts_dtype dt, Rng &rng);
ts_status CrossEntropyBackward(Backend &b, ts_dtype dt, Rng &rng);
ts_status CrossEntropyFused(Backend &b, ts_dtype dt, Rng &rng);

// The cases of the BERT-class encoder ops (kernels_parity_encoder.cc).
ts_status LayernormForward(Backend &b, ts_dtype dt, Rng &rng);
// ts_k_add_layernorm_forward, checked as AddRmsnormForward.
ts_status AddLayernormForward(Backend &b, ts_dtype dt, Rng &rng);
ts_status LayernormBackward(Backend &b, ts_dtype dt, Rng &rng);
ts_status Gelu(Backend &b, ts_dtype dt, Rng &rng, ts_gelu_kind kind, int backward);
ts_status BiasAdd(Backend &b, ts_dtype dt, Rng &rng);
ts_status BiasBackward(Backend &b, ts_dtype dt, Rng &rng);
ts_status TokenTypes(Backend &b, ts_dtype dt, Rng &rng);

}  // namespace ts_parity

#endif  // TS_KERNELS_KERNELS_PARITY_H

// The backend parity test (DESIGN.md "Devices"): one table of every op of
// kernels/kernels.h, each run on every backend this machine has
// (ts_k_device_count > 0: the CPU here; CUDA too on a GPU machine), in
// fp32, bf16 and fp16, on fresh random inputs of odd sizes (T 37, C 96,
// vocabulary 777, GQA and MQA), forward and backward, against one
// double-precision reference written in this file.
//
// Method: inputs are drawn and rounded to the storage dtype first, so the
// reference and the backend see the same values; outputs are poisoned
// (every byte 0xFF: NaN in fp32, bf16 and fp16) before the call, so an
// element a backend forgets to write fails; accumulated (+=) outputs are
// prefilled with random values instead. Each output element must lie
// within a bound built from the number of roundings it takes (Higham,
// "Accuracy and Stability of Numerical Algorithms", §3.1: a sum of K terms
// in fp32 errs by at most K u32 times the sum of their magnitudes, u32 =
// 2^-24) plus one rounding to the storage dtype (u = 2^-24, 2^-8, 2^-11 for
// fp32, bf16, fp16). The magnitudes come from the reference run on absolute
// values (subtractions become additions), so a bound is never relative to
// a sum that cancelled. Exact ops (casts, copies, zeroing, the embedding
// lookup, flags) are compared bit for bit.
//
// A backend other than the CPU may answer TS_ERR_UNSUPPORTED for an op it
// has no body for yet (CUDA before the GPU issue); the test lists those. The
// CPU must run every op. The gpu-tagged build of this file
// (kernels_parity_gpu_test, in tools/gpu_bundle.sh's bundle) also fails
// when the machine has no CUDA device.
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

namespace {

using ts_test::Rng;

const double kU32 = std::ldexp(1.0, -24);

double U(ts_dtype dt) { return ts_test::unit_roundoff(dt); }

// The absolute part of one rounding to dt: half the smallest subnormal
// (fp16's 2^-24 spacing below 2^-14 matters; bf16 and fp32 reach 2^-133).
double Eta(ts_dtype dt) {
  return dt == TS_FP16 ? std::ldexp(1.0, -25) : dt == TS_BF16 ? std::ldexp(1.0, -134)
                                                               : std::ldexp(1.0, -150);
}

// ---- buffers on a backend -----------------------------------------------------

// Bytes of n elements of dt.
size_t Bytes(size_t n, ts_dtype dt) { return n * ts_dtype_size(dt); }

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
  DevPtr Poisoned(size_t n, ts_dtype dt) {
    std::vector<unsigned char> h(Bytes(n, dt), 0xFF);
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

// Uniform in [lo, hi), rounded to dt (what a dt tensor can hold).
std::vector<float> Input(Rng &rng, size_t n, ts_dtype dt, float lo = -1.0f, float hi = 1.0f) {
  return ts_test::round_to(rng.vec(n, lo, hi), dt);
}

// Every got[i] finite and within tol[i] of ref[i]; failures name the
// element, the worst excess goes to the log.
void Expect(const char *what, const std::vector<float> &got, const std::vector<double> &ref,
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
void ExpectBits(const char *what, const std::vector<unsigned char> &got,
                const std::vector<unsigned char> &want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t first = got.size();
  for (size_t i = 0; i < got.size() && first == got.size(); i++)
    if (got[i] != want[i]) first = i;
  EXPECT_EQ(first, got.size()) << what << ": first differing byte " << first;
}

// Bytes of x stored as dt on the host.
std::vector<unsigned char> HostBytes(const std::vector<float> &x, ts_dtype dt) {
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

#define RUN_OR_RETURN(call)                        \
  do {                                             \
    ts_status s_ = (call);                         \
    if (s_ != TS_OK) {                             \
      EXPECT_EQ(s_, TS_ERR_UNSUPPORTED) << ts_last_error(); \
      return s_;                                   \
    }                                              \
  } while (0)

ts_status Cast(Backend &b, ts_dtype in_dt, Rng &rng) {
  // Random bit patterns (NaN, inf, subnormals included) read as in_dt.
  const size_t n = 1001;
  std::vector<unsigned char> in(Bytes(n, in_dt));
  for (auto &c : in) c = (unsigned char)rng.next();
  DevPtr din = b.UpBytes(in.data(), in.size());
  for (ts_dtype out_dt : {TS_FP32, TS_BF16, TS_FP16}) {
    DevPtr dout = b.Poisoned(n, out_dt);
    RUN_OR_RETURN(ts_k_cast(b.ctx(), dout->p, out_dt, din->p, in_dt, n));
    std::vector<unsigned char> want(Bytes(n, out_dt));
    if (out_dt == in_dt) want = in;  // a copy: every payload kept, signalling NaNs too
    for (size_t i = 0; i < n && out_dt != in_dt; i++) {  // base/floats.h's conversions
      float x;
      if (in_dt == TS_FP32) {
        std::memcpy(&x, &in[4 * i], 4);
      } else {
        uint16_t h;
        std::memcpy(&h, &in[2 * i], 2);
        x = in_dt == TS_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
      }
      if (out_dt == TS_FP32) {
        std::memcpy(&want[4 * i], &x, 4);
      } else {
        uint16_t h = out_dt == TS_BF16 ? ts_f32_to_bf16(x) : ts_f32_to_f16(x);
        std::memcpy(&want[2 * i], &h, 2);
      }
    }
    ExpectBits(ts_dtype_name(out_dt), b.DownBytes(*dout, want.size()), want);
  }
  return TS_OK;
}

ts_status Zero(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, 301, dt, 1.0f, 2.0f);  // no zeros in it
  DevPtr d = b.Up(x, dt);
  const size_t es = ts_dtype_size(dt);
  RUN_OR_RETURN(ts_k_zero(b.ctx(), d->as<char>() + 7 * es, 280 * es));
  std::vector<unsigned char> want = HostBytes(x, dt);
  std::memset(&want[7 * es], 0, 280 * es);
  ExpectBits("zeroed bytes only", b.DownBytes(*d, want.size()), want);
  return TS_OK;
}

ts_status Add(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = 4097 + 1001;  // a chunk and a partial one
  std::vector<float> a = Input(rng, n, dt, -4, 4), c = Input(rng, n, dt, -4, 4);
  DevPtr da = b.Up(a, dt), dc = b.Up(c, dt), dout = b.Poisoned(n, dt);
  RUN_OR_RETURN(ts_k_add(b.ctx(), dout->p, da->p, dc->p, n, dt));
  std::vector<double> ref(n), tol(n);
  for (size_t i = 0; i < n; i++) {
    ref[i] = (double)a[i] + c[i];
    tol[i] = Eta(dt) + 2 * (U(dt) + kU32) * std::fabs(ref[i]);  // an fp32 add, one rounding to dt
  }
  Expect("out", b.Down(*dout, n, dt), ref, tol);
  return TS_OK;
}

ts_status Sumsq(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = 3 * 4096 + 777;
  std::vector<float> x = Input(rng, n, dt, -3, 3);
  DevPtr dx = b.Up(x, dt), dout = b.Poisoned(1, TS_FP32);
  DevPtr d8(new Dev(b.device(), 8));
  RUN_OR_RETURN(ts_k_sumsq(b.ctx(), d8->as<double>(), dx->p, n, dt));
  double got;
  std::vector<unsigned char> h = b.DownBytes(*d8, 8);
  std::memcpy(&got, h.data(), 8);
  double ref = 0;
  for (float v : x) ref += (double)v * v;
  // squares exact in double; n additions in another order: n 2^-53 of the sum
  EXPECT_NEAR(got, ref, (double)n * std::ldexp(1.0, -53) * ref);
  return TS_OK;
}

ts_status Nonfinite(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = 2 * 4096 + 33;
  std::vector<float> x = Input(rng, n, dt);
  DevPtr dflag(new Dev(b.device(), 4));
  for (int planted = 0; planted < 3; planted++) {
    std::vector<float> y = x;
    if (planted == 1) y[4096] = INFINITY;
    if (planted == 2) y[n - 1] = NAN;
    DevPtr dx = b.Up(y, dt);
    RUN_OR_RETURN(ts_k_nonfinite(b.ctx(), dflag->as<int32_t>(), dx->p, n, dt));
    std::vector<unsigned char> h = b.DownBytes(*dflag, 4);
    int32_t flag;
    std::memcpy(&flag, h.data(), 4);
    EXPECT_EQ(flag, planted ? 1 : 0) << "planted " << planted;
  }
  return TS_OK;
}

ts_status LossSum(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> rows = rng.vec(kN, 0, 9);
  std::vector<int32_t> y(kN);
  for (size_t i = 0; i < kN; i++) y[i] = i % 7 == 3 ? TS_IGNORE_INDEX : (int32_t)(i % kV);
  DevPtr dr = b.Up(rows, TS_FP32), dy = b.UpInts(y), dout = b.Poisoned(2, TS_FP32);
  DevPtr d16(new Dev(b.device(), 16));
  RUN_OR_RETURN(ts_k_loss_sum(b.ctx(), d16->as<double>(), dr->as<float>(), dy->as<int32_t>(), kN));
  double got[2];
  std::vector<unsigned char> h = b.DownBytes(*d16, 16);
  std::memcpy(got, h.data(), 16);
  double sum = 0, count = 0, mag = 0;
  for (size_t i = 0; i < kN; i++)
    if (y[i] != TS_IGNORE_INDEX) sum += rows[i], count += 1, mag += std::fabs(rows[i]);
  EXPECT_NEAR(got[0], sum, (double)kN * std::ldexp(1.0, -53) * mag);  // double sums, any order
  EXPECT_EQ(got[1], count);
  return TS_OK;
}

// ---- linear -------------------------------------------------------------------------

const size_t kM = kN, kOut = 50, kIn = kC;  // y (M, Out) = x (M, In) W (Out, In)^T

ts_status LinearForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kM * kIn, dt), w = Input(rng, kOut * kIn, dt);
  b.Workspace(ts_k_linear_workspace_bytes(b.device(), kM, kOut, kIn, dt));
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), dy = b.Poisoned(kM * kOut, dt);
  RUN_OR_RETURN(ts_k_linear_forward(b.ctx(), dy->p, dx->p, dw->p, kM, kOut, kIn, dt));
  std::vector<double> ref(kM * kOut), tol(kM * kOut);
  for (size_t m = 0; m < kM; m++)
    for (size_t o = 0; o < kOut; o++) {
      double s = 0, mag = 0;
      for (size_t k = 0; k < kIn; k++) {
        s += (double)x[m * kIn + k] * w[o * kIn + k];
        mag += std::fabs((double)x[m * kIn + k] * w[o * kIn + k]);
      }
      ref[m * kOut + o] = s;
      tol[m * kOut + o] = Eta(dt) + U(dt) * std::fabs(s) + 2.1 * kIn * kU32 * mag;
    }
  Expect("out", b.Down(*dy, kM * kOut, dt), ref, tol);
  return TS_OK;
}

ts_status LinearBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kM * kIn, dt), w = Input(rng, kOut * kIn, dt);
  std::vector<float> dy = Input(rng, kM * kOut, dt), dw0 = Input(rng, kOut * kIn, dt);
  b.Workspace(ts_k_linear_workspace_bytes(b.device(), kM, kOut, kIn, dt));
  DevPtr ddy = b.Up(dy, dt), dx_in = b.Up(x, dt), dwt = b.Up(w, dt);
  DevPtr ddx = b.Poisoned(kM * kIn, dt), ddw = b.Up(dw0, dt);
  RUN_OR_RETURN(ts_k_linear_backward(b.ctx(), ddx->p, ddw->p, ddy->p, dx_in->p, dwt->p, kM, kOut,
                                     kIn, dt));
  std::vector<double> rx(kM * kIn), tx(kM * kIn), rw(kOut * kIn), tw(kOut * kIn);
  for (size_t m = 0; m < kM; m++)
    for (size_t k = 0; k < kIn; k++) {  // dx = dy W
      double s = 0, mag = 0;
      for (size_t o = 0; o < kOut; o++) {
        s += (double)dy[m * kOut + o] * w[o * kIn + k];
        mag += std::fabs((double)dy[m * kOut + o] * w[o * kIn + k]);
      }
      rx[m * kIn + k] = s;
      tx[m * kIn + k] = Eta(dt) + U(dt) * std::fabs(s) + 2.1 * kOut * kU32 * mag;
    }
  for (size_t o = 0; o < kOut; o++)
    for (size_t k = 0; k < kIn; k++) {  // dW += dy^T x
      double s = dw0[o * kIn + k], mag = std::fabs(s);
      for (size_t m = 0; m < kM; m++) {
        s += (double)dy[m * kOut + o] * x[m * kIn + k];
        mag += std::fabs((double)dy[m * kOut + o] * x[m * kIn + k]);
      }
      rw[o * kIn + k] = s;
      tw[o * kIn + k] = Eta(dt) + U(dt) * std::fabs(s) + 2.1 * (kM + 1) * kU32 * mag;
    }
  Expect("dinp", b.Down(*ddx, kM * kIn, dt), rx, tx);
  Expect("dweight", b.Down(*ddw, kOut * kIn, dt), rw, tw);
  return TS_OK;
}

// ---- embedding ------------------------------------------------------------------------

// Tokens with repeats (rows that gather several additions) and rows never used.
std::vector<int32_t> Tokens(Rng &rng) {
  std::vector<int32_t> t(kN);
  for (size_t i = 0; i < kN; i++) t[i] = i % 5 == 0 ? 11 : (int32_t)(rng.next() % (kV / 2));
  return t;
}

ts_status EmbeddingForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> wte = Input(rng, kV * kC, dt);
  std::vector<int32_t> tok = Tokens(rng);
  DevPtr dw = b.Up(wte, dt), dt_ = b.UpInts(tok), dout = b.Poisoned(kN * kC, dt);
  RUN_OR_RETURN(
      ts_k_embedding_forward(b.ctx(), dout->p, dt_->as<int32_t>(), dw->p, kN, kC, kV, dt));
  std::vector<float> want(kN * kC);
  for (size_t n = 0; n < kN; n++)
    for (size_t c = 0; c < kC; c++) want[n * kC + c] = wte[(size_t)tok[n] * kC + c];
  ExpectBits("rows copied", b.DownBytes(*dout, Bytes(kN * kC, dt)), HostBytes(want, dt));
  return TS_OK;
}

ts_status EmbeddingBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> dw0 = Input(rng, kV * kC, dt), dout = Input(rng, kN * kC, dt);
  std::vector<int32_t> tok = Tokens(rng);
  b.Workspace(ts_k_embedding_workspace_bytes(b.device(), kN, dt));
  DevPtr ddw = b.Up(dw0, dt), ddo = b.Up(dout, dt), dtok = b.UpInts(tok);
  RUN_OR_RETURN(
      ts_k_embedding_backward(b.ctx(), ddw->p, ddo->p, dtok->as<int32_t>(), kN, kC, kV, dt));
  std::vector<double> ref(dw0.begin(), dw0.end()), mag(kV * kC), tol(kV * kC);
  std::vector<size_t> count(kV, 0);
  for (size_t i = 0; i < kV * kC; i++) mag[i] = std::fabs(ref[i]);
  for (size_t n = 0; n < kN; n++) {
    count[tok[n]]++;
    for (size_t c = 0; c < kC; c++) {
      ref[(size_t)tok[n] * kC + c] += dout[n * kC + c];
      mag[(size_t)tok[n] * kC + c] += std::fabs(dout[n * kC + c]);
    }
  }
  for (size_t v = 0; v < kV; v++)  // untouched rows: exactly as they were
    for (size_t c = 0; c < kC; c++)
      tol[v * kC + c] =
          count[v] ? Eta(dt) + U(dt) * std::fabs(ref[v * kC + c]) + 2.1 * (count[v] + 1) * kU32 * mag[v * kC + c]
                   : 0.0;
  Expect("dwte", b.Down(*ddw, kV * kC, dt), ref, tol);
  return TS_OK;
}

// ---- RMSNorm --------------------------------------------------------------------------

const float kEps = 1e-5f;

// rstd of each row of x (N, C), in double.
std::vector<double> Rstd(const std::vector<float> &x) {
  std::vector<double> r(kN);
  for (size_t n = 0; n < kN; n++) {
    double ss = 0;
    for (size_t c = 0; c < kC; c++) ss += (double)x[n * kC + c] * x[n * kC + c];
    r[n] = 1.0 / std::sqrt(ss / kC + (double)kEps);
  }
  return r;
}

ts_status RmsnormForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -2, 2), w = Input(rng, kC, dt, 0.5f, 1.5f);
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), dy = b.Poisoned(kN * kC, dt);
  DevPtr dr = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_rmsnorm_forward(b.ctx(), dy->p, dr->as<float>(), dx->p, dw->p, kN, kC, kEps,
                                     dt));
  std::vector<double> r = Rstd(x), ref(kN * kC), tol(kN * kC), tr(kN);
  for (size_t n = 0; n < kN; n++) {
    tr[n] = (kC + 8) * kU32 * r[n];  // C squares summed, then / + sqrt and 1/
    for (size_t c = 0; c < kC; c++) {
      double o = (double)w[c] * x[n * kC + c] * r[n];
      ref[n * kC + c] = o;
      tol[n * kC + c] = Eta(dt) + (U(dt) + (kC + 12) * kU32) * std::fabs(o);  // a product: relative
    }
  }
  Expect("out", b.Down(*dy, kN * kC, dt), ref, tol);
  Expect("rstd", b.Down(*dr, kN, TS_FP32), r, tr);
  return TS_OK;
}

ts_status RmsnormBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -2, 2), w = Input(rng, kC, dt, 0.5f, 1.5f);
  std::vector<float> dy = Input(rng, kN * kC, dt), dx0 = Input(rng, kN * kC, dt);
  std::vector<float> dw0 = Input(rng, kC, dt);
  std::vector<double> r64 = Rstd(x);
  std::vector<float> r(kN);
  for (size_t n = 0; n < kN; n++) r[n] = (float)r64[n];  // an fp32 input like forward's
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), ddy = b.Up(dy, dt), dr = b.Up(r, TS_FP32);
  DevPtr ddx = b.Up(dx0, dt), ddw = b.Up(dw0, dt);
  RUN_OR_RETURN(ts_k_rmsnorm_backward(b.ctx(), ddx->p, ddw->p, ddy->p, dx->p, dw->p,
                                      dr->as<float>(), kN, kC, dt));
  std::vector<double> rx(kN * kC), tx(kN * kC), rw(kC), tw(kC), mw(kC);
  for (size_t c = 0; c < kC; c++) rw[c] = dw0[c], mw[c] = std::fabs(dw0[c]);
  for (size_t n = 0; n < kN; n++) {
    double rn = r[n], dot = 0, adot = 0;
    for (size_t c = 0; c < kC; c++) {
      double g = (double)w[c] * dy[n * kC + c];
      dot += g * x[n * kC + c];
      adot += std::fabs(g * x[n * kC + c]);
    }
    for (size_t c = 0; c < kC; c++) {
      size_t i = n * kC + c;
      double g = (double)w[c] * dy[i], k = rn * rn * rn * dot / kC;
      rx[i] = dx0[i] + (rn * g - k * x[i]);
      double mag = std::fabs(dx0[i]) + std::fabs(rn * g) + rn * rn * rn * adot / kC * std::fabs(x[i]);
      tx[i] = Eta(dt) + U(dt) * std::fabs(rx[i]) + (kC + 16) * kU32 * mag;
      rw[c] += (double)dy[i] * x[i] * rn;
      mw[c] += std::fabs((double)dy[i] * x[i] * rn);
    }
  }
  for (size_t c = 0; c < kC; c++) tw[c] = Eta(dt) + U(dt) * std::fabs(rw[c]) + (kN + 8) * kU32 * mw[c];
  Expect("dinp (accumulated)", b.Down(*ddx, kN * kC, dt), rx, tx);
  Expect("dweight (accumulated)", b.Down(*ddw, kC, dt), rw, tw);
  return TS_OK;
}

// ---- RoPE ---------------------------------------------------------------------------------

// The bounds of RoPE's outputs: cosf/sinf within 2 ulp and three roundings
// of terms as large as |x1| + |x2|, then one rounding to dt.
std::vector<double> RopeTol(const std::vector<float> &x, const std::vector<double> &ref,
                            ts_dtype dt) {
  std::vector<double> tol(x.size());
  size_t half = kHS / 2;
  for (size_t o = 0; o < x.size(); o += kHS)
    for (size_t i = 0; i < half; i++) {
      double mag = std::fabs(x[o + i]) + std::fabs(x[o + i + half]);
      for (size_t j : {o + i, o + i + half})
        tol[j] = Eta(dt) + U(dt) * std::fabs(ref[j]) + 8 * kU32 * mag;
    }
  return tol;
}

ts_status Rope(Backend &b, ts_dtype dt, Rng &rng, int backward) {
  const size_t H = kNH;
  const float theta = 10000.0f;
  std::vector<float> x = Input(rng, kB * kT * H * kHS, dt);
  DevPtr dx = b.Up(x, dt), dout = b.Poisoned(x.size(), dt);
  RUN_OR_RETURN(backward ? ts_k_rope_backward(b.ctx(), dout->p, dx->p, kB, kT, H, kHS, theta, dt)
                         : ts_k_rope_forward(b.ctx(), dout->p, dx->p, kB, kT, H, kHS, theta, dt));
  std::vector<double> ref;
  ts_test::rope_ref(ref, x, kB, kT, H, kHS, theta, backward ? -1 : 1);
  Expect(backward ? "dx" : "out", b.Down(*dout, x.size(), dt), ref, RopeTol(x, ref, dt));
  return TS_OK;
}

// ---- attention ----------------------------------------------------------------------------

// Causal GQA attention of kernels.h in double: probs (B, NH, T, T) and out
// (B, T, NH, HS), with their bounds.
struct AttnRef {
  std::vector<double> p, tp, o, to;
};

AttnRef AttentionRef(const std::vector<float> &q, const std::vector<float> &k,
                     const std::vector<float> &v, size_t NKV, ts_dtype dt) {
  AttnRef r;
  size_t rep = kNH / NKV;
  double scale = 1.0 / std::sqrt((double)kHS);
  r.p.assign(kB * kNH * kT * kT, 0);
  r.tp.assign(r.p.size(), 0);
  r.o.assign(kB * kT * kNH * kHS, 0);
  r.to.assign(r.o.size(), 0);
  for (size_t b = 0; b < kB; b++)
    for (size_t h = 0; h < kNH; h++) {
      size_t g = h / rep;
      for (size_t i = 0; i < kT; i++) {
        const float *qi = &q[((b * kT + i) * kNH + h) * kHS];
        std::vector<double> s(i + 1);
        double mx = -INFINITY, smag = 0;
        for (size_t j = 0; j <= i; j++) {
          const float *kj = &k[((b * kT + j) * NKV + g) * kHS];
          double d = 0, ad = 0;
          for (size_t e = 0; e < kHS; e++) d += (double)qi[e] * kj[e], ad += std::fabs((double)qi[e] * kj[e]);
          s[j] = scale * d;
          mx = std::fmax(mx, s[j]);
          smag = std::fmax(smag, scale * ad);
        }
        double z = 0;
        for (size_t j = 0; j <= i; j++) z += std::exp(s[j] - mx);
        // relative error of each p: the logits' (HS products each, twice:
        // s_j and the max) plus the exponentials and the sum of i + 1 terms
        double rel = 2 * (kHS + 2) * kU32 * smag + (kT + 8) * kU32;
        double *prow = &r.p[((b * kNH + h) * kT + i) * kT];
        for (size_t j = 0; j <= i; j++) {
          prow[j] = std::exp(s[j] - mx) / z;
          r.tp[((b * kNH + h) * kT + i) * kT + j] = Eta(dt) + (U(dt) + rel) * prow[j];
        }
        for (size_t e = 0; e < kHS; e++) {
          double o = 0, mag = 0;
          for (size_t j = 0; j <= i; j++) {
            double vj = v[((b * kT + j) * NKV + g) * kHS + e];
            o += prow[j] * vj;
            mag += prow[j] * std::fabs(vj);
          }
          size_t oi = ((b * kT + i) * kNH + h) * kHS + e;
          r.o[oi] = o;
          r.to[oi] = Eta(dt) + U(dt) * std::fabs(o) + (rel + (kT + 4) * kU32) * mag;
        }
      }
    }
  return r;
}

ts_status AttentionForward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV) {
  std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                     v = Input(rng, kN * NKV * kHS, dt);
  b.Workspace(ts_k_attention_workspace_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt));
  DevPtr dq = b.Up(q, dt), dk = b.Up(k, dt), dv = b.Up(v, dt);
  DevPtr dout = b.Poisoned(q.size(), dt), dp = b.Poisoned(kB * kNH * kT * kT, dt);
  RUN_OR_RETURN(ts_k_attention_forward(b.ctx(), dout->p, dp->p, dq->p, dk->p, dv->p, kB, kT, kNH,
                                       NKV, kHS, dt));
  AttnRef r = AttentionRef(q, k, v, NKV, dt);
  Expect("out", b.Down(*dout, q.size(), dt), r.o, r.to);
  Expect("probs (0 above the diagonal)", b.Down(*dp, r.p.size(), dt), r.p, r.tp);
  return TS_OK;
}

ts_status AttentionBackward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV) {
  std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                     v = Input(rng, kN * NKV * kHS, dt), dout = Input(rng, q.size(), dt);
  // The saved probabilities as forward stores them: rounded to dt.
  AttnRef fwd = AttentionRef(q, k, v, NKV, TS_FP32);
  std::vector<float> p(fwd.p.begin(), fwd.p.end());
  p = ts_test::round_to(p, dt);
  b.Workspace(ts_k_attention_workspace_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt));
  DevPtr dq_in = b.Up(q, dt), dk_in = b.Up(k, dt), dv_in = b.Up(v, dt), ddo = b.Up(dout, dt);
  DevPtr dp = b.Up(p, dt);
  DevPtr ddq = b.Poisoned(q.size(), dt), ddk = b.Poisoned(k.size(), dt),
         ddv = b.Poisoned(v.size(), dt);
  RUN_OR_RETURN(ts_k_attention_backward(b.ctx(), ddq->p, ddk->p, ddv->p, ddo->p, dq_in->p,
                                        dk_in->p, dv_in->p, dp->p, kB, kT, kNH, NKV, kHS, dt));
  size_t rep = kNH / NKV;
  double scale = 1.0 / std::sqrt((double)kHS);
  std::vector<double> rq(q.size(), 0), mq(q.size(), 0), rk(k.size(), 0), mk(k.size(), 0),
      rv(v.size(), 0), mv(v.size(), 0);
  for (size_t b_ = 0; b_ < kB; b_++)
    for (size_t h = 0; h < kNH; h++) {
      size_t g = h / rep;
      for (size_t i = 0; i < kT; i++) {
        const float *pr = &p[((b_ * kNH + h) * kT + i) * kT];
        const float *doi = &dout[((b_ * kT + i) * kNH + h) * kHS];
        std::vector<double> dP(i + 1), aP(i + 1);
        double dot = 0, adot = 0;
        for (size_t j = 0; j <= i; j++) {
          const float *vj = &v[((b_ * kT + j) * NKV + g) * kHS];
          double s = 0, as = 0;
          for (size_t e = 0; e < kHS; e++) s += (double)doi[e] * vj[e], as += std::fabs((double)doi[e] * vj[e]);
          dP[j] = s;
          aP[j] = as;
          dot += pr[j] * s;
          adot += pr[j] * as;
          for (size_t e = 0; e < kHS; e++) {  // dV += P^T dO
            rv[((b_ * kT + j) * NKV + g) * kHS + e] += pr[j] * doi[e];
            mv[((b_ * kT + j) * NKV + g) * kHS + e] += std::fabs(pr[j] * doi[e]);
          }
        }
        for (size_t j = 0; j <= i; j++) {
          double ds = scale * pr[j] * (dP[j] - dot), ads = scale * pr[j] * (aP[j] + adot);
          const float *kj = &k[((b_ * kT + j) * NKV + g) * kHS];
          const float *qi = &q[((b_ * kT + i) * kNH + h) * kHS];
          for (size_t e = 0; e < kHS; e++) {
            size_t qo = ((b_ * kT + i) * kNH + h) * kHS + e, ko = ((b_ * kT + j) * NKV + g) * kHS + e;
            rq[qo] += ds * kj[e];  // dQ = dS K
            mq[qo] += ads * std::fabs(kj[e]);
            rk[ko] += ds * qi[e];  // dK += dS^T Q
            mk[ko] += ads * std::fabs(qi[e]);
          }
        }
      }
    }
  // Each output is two reductions deep (HS, then up to rep T terms).
  const double depth = 4 * (kHS + rep * kT + 8) * kU32;
  auto tol = [&](const std::vector<double> &r, const std::vector<double> &m) {
    std::vector<double> t(r.size());
    for (size_t i = 0; i < r.size(); i++) t[i] = Eta(dt) + U(dt) * std::fabs(r[i]) + depth * m[i];
    return t;
  };
  Expect("dq", b.Down(*ddq, q.size(), dt), rq, tol(rq, mq));
  Expect("dk", b.Down(*ddk, k.size(), dt), rk, tol(rk, mk));
  Expect("dv", b.Down(*ddv, v.size(), dt), rv, tol(rv, mv));
  return TS_OK;
}

// ---- SwiGLU ----------------------------------------------------------------------------

ts_status SwigluForward(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = kN * kI;
  std::vector<float> g = Input(rng, n, dt, -3, 3), u = Input(rng, n, dt, -3, 3);
  DevPtr dg = b.Up(g, dt), du = b.Up(u, dt), dh = b.Poisoned(n, dt);
  RUN_OR_RETURN(ts_k_swiglu_forward(b.ctx(), dh->p, dg->p, du->p, n, dt));
  std::vector<double> ref(n), tol(n);
  for (size_t i = 0; i < n; i++) {
    double s = g[i] / (1 + std::exp(-(double)g[i]));
    ref[i] = s * u[i];
    tol[i] = Eta(dt) + (U(dt) + 8 * kU32) * std::fabs(ref[i]);  // expf, +, /, *: relative
  }
  Expect("h", b.Down(*dh, n, dt), ref, tol);
  return TS_OK;
}

ts_status SwigluBackward(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = kN * kI;
  std::vector<float> g = Input(rng, n, dt, -3, 3), u = Input(rng, n, dt, -3, 3),
                     dh = Input(rng, n, dt);
  DevPtr dg = b.Up(g, dt), du = b.Up(u, dt), ddh = b.Up(dh, dt);
  DevPtr ddg = b.Poisoned(n, dt), ddu = b.Poisoned(n, dt);
  RUN_OR_RETURN(ts_k_swiglu_backward(b.ctx(), ddg->p, ddu->p, ddh->p, dg->p, du->p, n, dt));
  std::vector<double> rg(n), tg(n), ru(n), tu(n);
  for (size_t i = 0; i < n; i++) {
    double x = g[i], s = 1 / (1 + std::exp(-x));
    double grad = s * (1 + x * (1 - s)), agrad = s * (1 + std::fabs(x) * (1 - s));
    rg[i] = (double)dh[i] * u[i] * grad;
    tg[i] = Eta(dt) + U(dt) * std::fabs(rg[i]) + 16 * kU32 * std::fabs((double)dh[i] * u[i]) * agrad;
    ru[i] = (double)dh[i] * x * s;
    tu[i] = Eta(dt) + (U(dt) + 8 * kU32) * std::fabs(ru[i]);
  }
  Expect("dgate", b.Down(*ddg, n, dt), rg, tg);
  Expect("dup", b.Down(*ddu, n, dt), ru, tu);
  return TS_OK;
}

// ---- cross-entropy -------------------------------------------------------------------------

std::vector<int32_t> Targets() {
  std::vector<int32_t> y(kN);
  for (size_t i = 0; i < kN; i++) y[i] = i % 9 == 4 ? TS_IGNORE_INDEX : (int32_t)((i * 101) % kV);
  return y;
}

ts_status CrossEntropyForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kV, dt, -4, 4);
  std::vector<int32_t> y = Targets();
  DevPtr dx = b.Up(x, dt), dy = b.UpInts(y), dl = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_cross_entropy_forward(b.ctx(), dl->as<float>(), dx->p, dy->as<int32_t>(), kN,
                                           kV, dt));
  std::vector<double> ref(kN, 0), tol(kN, 0);
  for (size_t n = 0; n < kN; n++) {
    if (y[n] == TS_IGNORE_INDEX) continue;  // exactly 0
    double mx = -INFINITY, z = 0;
    for (size_t j = 0; j < kV; j++) mx = std::fmax(mx, (double)x[n * kV + j]);
    for (size_t j = 0; j < kV; j++) z += std::exp(x[n * kV + j] - mx);
    double lse = std::log(z) + mx, xy = x[n * kV + y[n]];
    ref[n] = lse - xy;
    tol[n] = (kV + 8) * kU32 + 4 * kU32 * (std::fabs(lse) + std::fabs(xy));  // fp32 rows
  }
  Expect("loss_rows", b.Down(*dl, kN, TS_FP32), ref, tol);
  return TS_OK;
}

ts_status CrossEntropyBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kV, dt, -4, 4);
  std::vector<int32_t> y = Targets();
  const float dloss = 1.0f / 61;
  DevPtr dx = b.Up(x, dt), dy = b.UpInts(y), dd = b.Poisoned(kN * kV, dt);
  RUN_OR_RETURN(ts_k_cross_entropy_backward(b.ctx(), dd->p, dx->p, dy->as<int32_t>(), kN, kV,
                                            dloss, dt));
  std::vector<double> ref(kN * kV, 0), tol(kN * kV, 0);
  for (size_t n = 0; n < kN; n++) {
    if (y[n] == TS_IGNORE_INDEX) continue;  // exactly 0
    double mx = -INFINITY, z = 0;
    for (size_t j = 0; j < kV; j++) mx = std::fmax(mx, (double)x[n * kV + j]);
    for (size_t j = 0; j < kV; j++) z += std::exp(x[n * kV + j] - mx);
    for (size_t j = 0; j < kV; j++) {
      double p = std::exp(x[n * kV + j] - mx) / z, one = (int32_t)j == y[n] ? 1.0 : 0.0;
      ref[n * kV + j] = dloss * (p - one);
      tol[n * kV + j] = Eta(dt) + U(dt) * std::fabs(ref[n * kV + j]) + dloss * ((kV + 8) * kU32 * p + 2 * kU32 * one);
    }
  }
  Expect("dlogits", b.Down(*dd, kN * kV, dt), ref, tol);
  return TS_OK;
}

// ---- AdamW -------------------------------------------------------------------------------

ts_status Adamw(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t n = 4096 + 1234;
  std::vector<float> p = rng.vec(n, -2, 2), m = rng.vec(n, -0.5f, 0.5f), v = rng.vec(n, 0, 1);
  std::vector<float> g = Input(rng, n, dt, -3, 3);
  ts_adamw_hparams hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  DevPtr dp = b.Up(p, TS_FP32), dm = b.Up(m, TS_FP32), dv = b.Up(v, TS_FP32), dg = b.Up(g, dt);
  DevPtr dout = b.Poisoned(n, dt);
  RUN_OR_RETURN(ts_k_adamw(b.ctx(), dp->as<float>(), dout->p, dt, dm->as<float>(), dv->as<float>(),
                           dg->p, dt, n, &hp));
  // torch.optim.AdamW's single-tensor step in double (kernels_adamw_test's
  // transcription); fp32 rounds p about twice, the update ~10 times, m and
  // v about 4 times each.
  double bc1 = 1 - std::pow((double)hp.beta1, hp.step), bc2 = 1 - std::pow((double)hp.beta2, hp.step);
  std::vector<double> rp(n), tp(n), rm(n), tm(n), rv(n), tv(n), ro(n), to(n);
  for (size_t i = 0; i < n; i++) {
    double gi = (double)hp.grad_scale * g[i];
    rm[i] = m[i] + (1 - (double)hp.beta1) * (gi - m[i]);
    rv[i] = (double)hp.beta2 * v[i] + (1 - (double)hp.beta2) * gi * gi;
    double denom = std::sqrt(rv[i]) / std::sqrt(bc2) + (double)hp.eps;
    double upd = (double)hp.lr / bc1 * (rm[i] / denom);
    rp[i] = p[i] * (1 - (double)hp.lr * hp.weight_decay) - upd;
    tp[i] = 4 * kU32 * std::fabs(rp[i]) + 20 * kU32 * std::fabs(upd) + 1e-30;
    tm[i] = 8 * kU32 * (std::fabs(rm[i]) + std::fabs(gi) + std::fabs(m[i]));
    tv[i] = 8 * kU32 * std::fabs(rv[i]) + 1e-30;
    ro[i] = rp[i];
    to[i] = Eta(dt) + U(dt) * std::fabs(rp[i]) + tp[i];
  }
  Expect("master", b.Down(*dp, n, TS_FP32), rp, tp);
  Expect("m", b.Down(*dm, n, TS_FP32), rm, tm);
  Expect("v", b.Down(*dv, n, TS_FP32), rv, tv);
  Expect("param_out", b.Down(*dout, n, dt), ro, to);
  return TS_OK;
}

#undef RUN_OR_RETURN

// ---- every op on every backend -----------------------------------------------------------

const std::vector<Case> &Cases() {
  static const std::vector<Case> cases = {
      {"cast", Cast},
      {"zero", Zero},
      {"add", Add},
      {"sumsq", Sumsq},
      {"nonfinite", Nonfinite},
      {"loss_sum", LossSum},
      {"linear_forward", LinearForward},
      {"linear_backward", LinearBackward},
      {"embedding_forward", EmbeddingForward},
      {"embedding_backward", EmbeddingBackward},
      {"rmsnorm_forward", RmsnormForward},
      {"rmsnorm_backward", RmsnormBackward},
      {"rope_forward", [](Backend &b, ts_dtype dt, Rng &r) { return Rope(b, dt, r, 0); }},
      {"rope_backward", [](Backend &b, ts_dtype dt, Rng &r) { return Rope(b, dt, r, 1); }},
      {"attention_forward_gqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionForward(b, dt, r, 2); }},
      {"attention_forward_mqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionForward(b, dt, r, 1); }},
      {"attention_backward_gqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionBackward(b, dt, r, 2); }},
      {"attention_backward_mqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionBackward(b, dt, r, 1); }},
      {"swiglu_forward", SwigluForward},
      {"swiglu_backward", SwigluBackward},
      {"cross_entropy_forward", CrossEntropyForward},
      {"cross_entropy_backward", CrossEntropyBackward},
      {"adamw", Adamw},
  };
  return cases;
}

TEST(BackendParity, EveryOpOnEveryBackendMatchesTheReference) {
  int backends = 0;
  std::vector<std::string> unsupported;
  for (ts_device dev : {TS_DEVICE_CPU, TS_DEVICE_CUDA}) {
    if (ts_k_device_count(dev) == 0) {
      std::printf("[ backend  ] %s: not present on this machine\n", ts_device_name(dev));
      continue;
    }
    backends++;
    Backend b(dev);
    for (const Case &c : Cases())
      for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
        SCOPED_TRACE(std::string(ts_device_name(dev)) + " " + c.op + " " + ts_dtype_name(dt));
        Rng rng(std::hash<std::string>{}(c.op) ^ (uint64_t)dt);  // fresh inputs per case
        ts_status st = c.run(b, dt, rng);
        if (st == TS_ERR_UNSUPPORTED) {
          EXPECT_NE(dev, TS_DEVICE_CPU) << c.op << ": the CPU must run every op";
          unsupported.push_back(std::string(ts_device_name(dev)) + ":" + c.op);
        }
      }
  }
  EXPECT_GE(backends, 1);
#ifdef TS_PARITY_REQUIRE_CUDA  // the gpu-tagged build: a GPU machine must run CUDA
  EXPECT_GT(ts_k_device_count(TS_DEVICE_CUDA), 0) << "no CUDA device: tests tagged gpu need one";
#endif
  for (const std::string &u : unsupported) std::printf("[ unsupported ] %s\n", u.c_str());
}

// The poison works: a backend that forgot an element would fail. (A copy of
// the check Expect makes, on a buffer nobody wrote.)
TEST(BackendParity, AnUnwrittenOutputFailsTheCheck) {
  Backend b(TS_DEVICE_CPU);
  DevPtr d = b.Poisoned(3, TS_BF16);
  std::vector<float> got = b.Down(*d, 3, TS_BF16);
  for (float x : got) EXPECT_TRUE(std::isnan(x));
}

}  // namespace

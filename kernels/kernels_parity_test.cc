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
// A backend may answer TS_ERR_UNSUPPORTED for an op it has no body for (a
// future backend while it grows); the test lists those. The CPU and CUDA
// must run every op. The gpu-tagged build of this file
// (kernels_parity_gpu_test, in tools/gpu_bundle.sh's bundle) also fails
// when the machine has no CUDA device.
#include "kernels/kernels_parity.h"

#include <gtest/gtest-spi.h>

#include <algorithm>

namespace ts_parity {

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

// out = x W^T + b rounded once to dt: within half an ulp of dt of the exact
// value, widened by the fp32 error e of the K products' sum and the bias'
// addition (2.1 (K + 1) u32 of their magnitudes, as the linear's bound):
// |out - r| <= half_ulp(|r| + e) + e (ts_test::linear_bias_bound; its
// half ulp is the subnormals' below the smallest normal). bf16/fp16: the
// two ops apart (the product rounded to dt, then the sum again) must leave
// that bound on some output, so it tells one rounding from two. fp32 on
// the CPU: bit for bit the two ops apart (the CUDA epilogue's algorithm
// may differ from the bias-free product's). Again with the bias at a 2- or
// 4-byte offset (a tensor inside a flat buffer; CUDA copies it to an
// aligned slot first): the same bits.
ts_status LinearBiasForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kM * kIn, dt), w = Input(rng, kOut * kIn, dt),
                     bias = Input(rng, kOut, dt, -2, 2);
  b.Workspace(std::max(ts_k_linear_bias_workspace_bytes(b.device(), kM, kOut, kIn, dt),
                       ts_k_linear_workspace_bytes(b.device(), kM, kOut, kIn, dt)));
  std::vector<float> shifted(kOut + 1, 0.0f);
  std::copy(bias.begin(), bias.end(), shifted.begin() + 1);
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), db = b.Up(bias, dt), dbs = b.Up(shifted, dt);
  DevPtr dy = b.Poisoned(kM * kOut, dt), dys = b.Poisoned(kM * kOut, dt),
         dyu = b.Poisoned(kM * kOut, dt);
  RUN_OR_RETURN(
      ts_k_linear_bias_forward(b.ctx(), dy->p, dx->p, dw->p, db->p, kM, kOut, kIn, dt));
  const void *misaligned = dbs->as<char>() + ts_dtype_size(dt);
  RUN_OR_RETURN(
      ts_k_linear_bias_forward(b.ctx(), dys->p, dx->p, dw->p, misaligned, kM, kOut, kIn, dt));
  RUN_OR_RETURN(ts_k_linear_forward(b.ctx(), dyu->p, dx->p, dw->p, kM, kOut, kIn, dt));
  RUN_OR_RETURN(ts_k_bias_add(b.ctx(), dyu->p, db->p, kM, kOut, dt));
  std::vector<double> ref, tol;
  ts_test::linear_bias_bound(ref, tol, x, w, bias, kM, kOut, kIn, dt);
  Expect("out", b.Down(*dy, kM * kOut, dt), ref, tol);
  const size_t bytes = Bytes(kM * kOut, dt);
  ExpectBits("out with a misaligned bias", b.DownBytes(*dys, bytes), b.DownBytes(*dy, bytes));
  if (dt == TS_FP32 && b.device() == TS_DEVICE_CPU)
    ExpectBits("out against the two ops apart", b.DownBytes(*dy, bytes), b.DownBytes(*dyu, bytes));
  if (dt != TS_FP32) {
    std::vector<float> apart = b.Down(*dyu, kM * kOut, dt);
    size_t over = 0;
    for (size_t i = 0; i < apart.size(); i++) over += !(std::fabs(apart[i] - ref[i]) <= tol[i]);
    EXPECT_GT(over, 0u) << "the bound must tell one rounding from two";
  }
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

// dwte += the scatter of dout by tok (N = tok.size() positions).
ts_status EmbeddingBackwardOf(Backend &b, ts_dtype dt, Rng &rng, const std::vector<int32_t> &tok) {
  const size_t N = tok.size();
  std::vector<float> dw0 = Input(rng, kV * kC, dt), dout = Input(rng, N * kC, dt);
  b.Workspace(ts_k_embedding_workspace_bytes(b.device(), N, dt));
  DevPtr ddw = b.Up(dw0, dt), ddo = b.Up(dout, dt), dtok = b.UpInts(tok);
  RUN_OR_RETURN(
      ts_k_embedding_backward(b.ctx(), ddw->p, ddo->p, dtok->as<int32_t>(), N, kC, kV, dt));
  std::vector<double> ref(dw0.begin(), dw0.end()), mag(kV * kC), tol(kV * kC);
  std::vector<size_t> count(kV, 0);
  for (size_t i = 0; i < kV * kC; i++) mag[i] = std::fabs(ref[i]);
  for (size_t n = 0; n < N; n++) {
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

ts_status EmbeddingBackward(Backend &b, ts_dtype dt, Rng &rng) {
  return EmbeddingBackwardOf(b, dt, rng, Tokens(rng));
}

// Frequent tokens, as BERT's token type 0 (every position) and its [MASK]:
// 601 positions, token 11 at 301 of them and token 40 at 100, the rest
// (short runs) random; the CUDA backend sums runs of 64 or more positions
// in 32 slices (kernels.h), which the same (L + 1)-rounding bound covers.
ts_status EmbeddingBackwardLongRuns(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<int32_t> tok(601);
  for (size_t i = 0; i < tok.size(); i++)
    tok[i] = i % 2 == 0 ? 11 : i % 6 == 1 ? 40 : (int32_t)(100 + rng.next() % (kV - 100));
  return EmbeddingBackwardOf(b, dt, rng, tok);
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

}  // namespace ts_parity

namespace {

using namespace ts_parity;

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
      {"linear_bias_forward", LinearBiasForward},
      {"embedding_forward", EmbeddingForward},
      {"embedding_backward", EmbeddingBackward},
      {"embedding_backward_long_runs", EmbeddingBackwardLongRuns},
      {"rmsnorm_forward", RmsnormForward},
      {"rmsnorm_backward", RmsnormBackward},
      {"add_rmsnorm_forward", AddRmsnormForward},
      {"rope_forward", [](Backend &b, ts_dtype dt, Rng &r) { return Rope(b, dt, r, 0); }},
      {"rope_backward", [](Backend &b, ts_dtype dt, Rng &r) { return Rope(b, dt, r, 1); }},
      // The largest head size the front accepts, on every backend.
      {"rope_forward_max_hs",
       [](Backend &b, ts_dtype dt, Rng &r) { return Rope(b, dt, r, 0, TS_K_ROPE_MAX_HS); }},
      {"attention_forward_gqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionForward(b, dt, r, 2); }},
      {"attention_forward_mqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionForward(b, dt, r, 1); }},
      {"attention_backward_gqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionBackward(b, dt, r, 2); }},
      {"attention_backward_mqa",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionBackward(b, dt, r, 1); }},
      // CUDA's plain kernels where cuDNN would run (bf16/fp16; elsewhere the
      // flag changes nothing): its fallback and the check of cuDNN.
      {"attention_forward_gqa_plain",
       [](Backend &b, ts_dtype dt, Rng &r) {
         return AttentionForward(b, dt, r, 2, TS_K_PLAIN_ATTENTION);
       }},
      {"attention_backward_gqa_plain",
       [](Backend &b, ts_dtype dt, Rng &r) {
         return AttentionBackward(b, dt, r, 2, TS_K_PLAIN_ATTENTION);
       }},
      {"rope_forward_at", RopeAt},
      {"attention_cached_prefill",  // the prompt: every query at once from position 0
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionCached(b, dt, r, 2, kT); }},
      {"attention_cached_gqa",  // three new tokens after a cache of kT - 3
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionCached(b, dt, r, 2, 3); }},
      {"attention_cached_mqa",  // one new token: a decoding step
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionCached(b, dt, r, 1, 1); }},
      {"swiglu_forward", SwigluForward},
      {"swiglu_backward", SwigluBackward},
      {"cross_entropy_forward", CrossEntropyForward},
      {"cross_entropy_backward", CrossEntropyBackward},
      {"cross_entropy_fused", CrossEntropyFused},
      {"adamw", Adamw},
      // The BERT-class encoder ops.
      {"layernorm_forward", LayernormForward},
      {"layernorm_backward", LayernormBackward},
      {"add_layernorm_forward", AddLayernormForward},
      {"gelu_erf_forward",
       [](Backend &b, ts_dtype dt, Rng &r) { return Gelu(b, dt, r, TS_GELU_ERF, 0); }},
      {"gelu_erf_backward",
       [](Backend &b, ts_dtype dt, Rng &r) { return Gelu(b, dt, r, TS_GELU_ERF, 1); }},
      {"gelu_tanh_forward",
       [](Backend &b, ts_dtype dt, Rng &r) { return Gelu(b, dt, r, TS_GELU_TANH, 0); }},
      {"gelu_tanh_backward",
       [](Backend &b, ts_dtype dt, Rng &r) { return Gelu(b, dt, r, TS_GELU_TANH, 1); }},
      {"bias_add", BiasAdd},
      {"bias_backward", BiasBackward},
      {"token_types", TokenTypes},
      {"attention_bidir_forward",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionForward(b, dt, r, kNH, 0, true); }},
      {"attention_bidir_backward",
       [](Backend &b, ts_dtype dt, Rng &r) { return AttentionBackward(b, dt, r, kNH, 0, true); }},
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
          ADD_FAILURE() << c.op << ": " << ts_device_name(dev) << " must run every op";
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

// The GPU's attention-forward bound, checked here: a model of cuDNN's
// fused kernel (P rounded to dt before P v, the sum exact, out rounded to
// dt) lies inside the bound for P held in dt (what
// ts_k_attention_probs_dtype reports there), on the parity cases' shapes
// and inputs, GQA and MQA causal and the bidirectional op with its padded
// keys (cuDNN runs both); and outside the bound for P held in fp32 (what
// the CPU reports), so the extra term is needed, not slack.
TEST(BackendParity, TheAttentionBoundCoversProbabilitiesRoundedBeforePV) {
  for (ts_dtype dt : {TS_BF16, TS_FP16})
    for (int bidir : {0, 1})
      for (size_t NKV : bidir ? std::vector<size_t>{kNH} : std::vector<size_t>{2, 1}) {
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " NKV " + std::to_string(NKV) +
                     (bidir ? " bidirectional" : " causal"));
        Rng rng(std::hash<std::string>{}(bidir      ? "attention_bidir_forward"
                                         : NKV == 2 ? "attention_forward_gqa"
                                                    : "attention_forward_mqa") ^
                (uint64_t)dt);
        std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                           v = Input(rng, kN * NKV * kHS, dt);
        const std::vector<int32_t> ids = bidir ? PadIds() : std::vector<int32_t>();
        AttnRef held = AttentionRef(q, k, v, NKV, dt, ids, dt),
                f32 = AttentionRef(q, k, v, NKV, dt, ids, TS_FP32);
        std::vector<float> p =
            ts_test::round_to(std::vector<float>(held.p.begin(), held.p.end()), dt);
        std::vector<float> model(held.o.size());
        const size_t rep = kNH / NKV;
        for (size_t b = 0; b < kB; b++)
          for (size_t i = 0; i < kT; i++)
            for (size_t h = 0; h < kNH; h++)
              for (size_t e = 0; e < kHS; e++) {
                double o = 0;
                for (size_t j = 0; j < kT; j++)  // P is 0 where the key is not seen
                  o += (double)p[((b * kNH + h) * kT + i) * kT + j] *
                       v[((b * kT + j) * NKV + h / rep) * kHS + e];
                model[((b * kT + i) * kNH + h) * kHS + e] = (float)o;
              }
        model = ts_test::round_to(model, dt);
        Expect("model of the fused kernel", model, held.o, held.to);
        size_t over = 0;
        for (size_t i = 0; i < model.size(); i++)
          over += std::fabs((double)model[i] - f32.o[i]) > f32.to[i];
        EXPECT_GT(over, 0u) << "the fp32-P bound already covers P rounded to " << ts_dtype_name(dt);
        std::printf("[ bound    ] %s NKV %zu %s: %zu of %zu outputs need the rounded-P term\n",
                    ts_dtype_name(dt), NKV, bidir ? "bidirectional" : "causal", over, model.size());
      }
}

// The poison works: a buffer nobody wrote reads as NaN in every format and
// fails the bound check however generous the bound.
TEST(BackendParity, AnUnwrittenOutputFailsTheCheck) {
  Backend b(TS_DEVICE_CPU);
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
    DevPtr d = b.Poisoned(3, dt);
    std::vector<float> got = b.Down(*d, 3, dt);
    for (float x : got) EXPECT_TRUE(std::isnan(x)) << ts_dtype_name(dt);
    ::testing::TestPartResultArray failures;  // the check's failures, intercepted
    {
      ::testing::ScopedFakeTestPartResultReporter catcher(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
      Expect("poisoned", got, {0, 0, 0}, {1e30, 1e30, 1e30});
    }
    ASSERT_EQ(failures.size(), 4) << "one per element and the count";
    for (int i = 0; i < 3; i++)
      EXPECT_NE(std::string(failures.GetTestPartResult(i).message()).find("(not written?)"),
                std::string::npos);
    EXPECT_NE(std::string(failures.GetTestPartResult(3).message()).find("3 of 3 elements"),
              std::string::npos);
  }
}

}  // namespace

// kernels_parity_encoder.cc — the parity cases of the BERT-class encoder
// ops: LayerNorm (and the residual add fused with it), GELU (erf and
// tanh), bias, token types (bidirectional attention shares the attention
// cases of kernels_parity_layers.cc).
// Method and bounds: kernels_parity_test.cc.
#include "kernels/kernels_parity.h"

#include <algorithm>

namespace ts_parity {

// ---- LayerNorm ----------------------------------------------------------------------

const float kLnEps = 1e-5f;

// Each row's mean, rstd and sum of |x| / C of x (N, C), in double.
struct LnStats {
  std::vector<double> mean, rstd, mabs;
};

static LnStats Stats(const std::vector<float> &x) {
  LnStats s{std::vector<double>(kN), std::vector<double>(kN), std::vector<double>(kN)};
  for (size_t n = 0; n < kN; n++) {
    double m = 0, a = 0, var = 0;
    for (size_t c = 0; c < kC; c++) m += x[n * kC + c], a += std::fabs(x[n * kC + c]);
    m /= kC;
    for (size_t c = 0; c < kC; c++) var += (x[n * kC + c] - m) * (x[n * kC + c] - m);
    s.mean[n] = m;
    s.rstd[n] = 1.0 / std::sqrt(var / kC + (double)kLnEps);
    s.mabs[n] = a / kC;
  }
  return s;
}

// LayerNorm forward's out (dy), mean (dm) and rstd (dr) of input x,
// weight w and bias on b against the double reference.
static void ExpectLayernorm(Backend &b, ts_dtype dt, const std::vector<float> &x,
                            const std::vector<float> &w, const std::vector<float> &bias,
                            const Dev &dy, const Dev &dm, const Dev &dr) {
  LnStats s = Stats(x);
  std::vector<double> ref(kN * kC), tol(kN * kC), tm(kN), tr(kN);
  for (size_t n = 0; n < kN; n++) {
    // mean: C terms summed, then / C. The centred values carry its error
    // dm (the variance's first-order term cancels: they sum to 0) and one
    // rounding each; their squares' sum C more; then +, sqrt, 1/.
    double dm_ = (kC + 2) * kU32 * s.mabs[n];
    tm[n] = dm_;
    tr[n] = (kC + 16) * kU32 * s.rstd[n];
    for (size_t c = 0; c < kC; c++) {
      size_t i = n * kC + c;
      double xc = x[i] - s.mean[n], o = xc * s.rstd[n] * w[c] + bias[c];
      double mag = std::fabs(xc) * s.rstd[n] * std::fabs(w[c]) + std::fabs(bias[c]);
      ref[i] = o;
      tol[i] = Eta(dt) + U(dt) * std::fabs(o) + (kC + 24) * kU32 * mag +
               dm_ * s.rstd[n] * std::fabs(w[c]);
    }
  }
  Expect("out", b.Down(dy, kN * kC, dt), ref, tol);
  Expect("mean", b.Down(dm, kN, TS_FP32), s.mean, tm);
  Expect("rstd", b.Down(dr, kN, TS_FP32), s.rstd, tr);
}

ts_status LayernormForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -2, 3), w = Input(rng, kC, dt, 0.5f, 1.5f),
                     bias = Input(rng, kC, dt);
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), db = b.Up(bias, dt), dy = b.Poisoned(kN * kC, dt);
  DevPtr dm = b.Poisoned(kN, TS_FP32), dr = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_layernorm_forward(b.ctx(), dy->p, dm->as<float>(), dr->as<float>(), dx->p,
                                       dw->p, db->p, kN, kC, kLnEps, dt));
  ExpectLayernorm(b, dt, x, w, bias, *dy, *dm, *dr);
  return TS_OK;
}

// A run of ts_k_add_layernorm_forward on b: r's outputs from a + c, r's
// res (aliasing a when a is r's res).
static ts_status AddLayernorm(Backend &b, ts_dtype dt, const AddNormRun &r, const Dev &a,
                              const Dev &c, const Dev &w, const Dev &bias) {
  return ts_k_add_layernorm_forward(b.ctx(), r.out->p, r.stat[0]->as<float>(),
                                    r.stat[1]->as<float>(), r.res->p, a.p, c.p, w.p, bias.p, kN,
                                    kC, kLnEps, dt);
}

ts_status AddLayernormForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -1, 2), y = Input(rng, kN * kC, dt),
                     w = Input(rng, kC, dt, 0.5f, 1.5f), bias = Input(rng, kC, dt);
  DevPtr dx = b.Up(x, dt), dy = b.Up(y, dt), dw = b.Up(w, dt), db = b.Up(bias, dt);
  AddNormRun fused(b, dt, 2), in_place(b, dt, 2), unfused(b, dt, 2);
  RUN_OR_RETURN(AddLayernorm(b, dt, fused, *dx, *dy, *dw, *db));
  ExpectLayernorm(b, dt, ExpectAddRes(b, dt, x, y, *fused.res), w, bias, *fused.out,
                  *fused.stat[0], *fused.stat[1]);
  // res aliasing a (a residual stream updated in place), and the two ops apart
  in_place.res = b.Up(x, dt);
  RUN_OR_RETURN(AddLayernorm(b, dt, in_place, *in_place.res, *dy, *dw, *db));
  RUN_OR_RETURN(ts_k_add(b.ctx(), unfused.res->p, dx->p, dy->p, kN * kC, dt));
  RUN_OR_RETURN(ts_k_layernorm_forward(b.ctx(), unfused.out->p, unfused.stat[0]->as<float>(),
                                       unfused.stat[1]->as<float>(), unfused.res->p, dw->p, db->p,
                                       kN, kC, kLnEps, dt));
  ExpectSameBits(b, dt, fused, in_place, "res aliasing a");
  ExpectSameBits(b, dt, fused, unfused, "ts_k_add then the norm");
  return TS_OK;
}

ts_status LayernormBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -2, 3), w = Input(rng, kC, dt, 0.5f, 1.5f);
  std::vector<float> dy = Input(rng, kN * kC, dt), dx0 = Input(rng, kN * kC, dt);
  std::vector<float> dw0 = Input(rng, kC, dt), db0 = Input(rng, kC, dt);
  LnStats s = Stats(x);
  std::vector<float> m(kN), r(kN);  // fp32 inputs like forward's
  for (size_t n = 0; n < kN; n++) m[n] = (float)s.mean[n], r[n] = (float)s.rstd[n];
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), ddy = b.Up(dy, dt), dm = b.Up(m, TS_FP32),
         dr = b.Up(r, TS_FP32);
  DevPtr ddx = b.Up(dx0, dt), ddw = b.Up(dw0, dt), ddb = b.Up(db0, dt);
  b.Workspace(ts_k_layernorm_workspace_bytes(b.device(), kN, kC, dt));
  RUN_OR_RETURN(ts_k_layernorm_backward(b.ctx(), ddx->p, ddw->p, ddb->p, ddy->p, dx->p, dw->p,
                                        dm->as<float>(), dr->as<float>(), kN, kC, dt));
  std::vector<double> rx(kN * kC), tx(kN * kC), rw(kC), mw(kC), rb(kC), mb(kC), tw(kC), tb(kC);
  for (size_t c = 0; c < kC; c++) {
    rw[c] = dw0[c], mw[c] = std::fabs(dw0[c]);
    rb[c] = db0[c], mb[c] = std::fabs(db0[c]);
  }
  for (size_t n = 0; n < kN; n++) {
    double sg = 0, sgx = 0, ag = 0, agx = 0;
    for (size_t c = 0; c < kC; c++) {
      size_t i = n * kC + c;
      double g = (double)dy[i] * w[c], xhat = ((double)x[i] - m[n]) * r[n];
      sg += g, sgx += g * xhat, ag += std::fabs(g), agx += std::fabs(g * xhat);
    }
    for (size_t c = 0; c < kC; c++) {
      size_t i = n * kC + c;
      double g = (double)dy[i] * w[c], xhat = ((double)x[i] - m[n]) * r[n];
      rx[i] = dx0[i] + r[n] * (g - sg / kC - xhat * sgx / kC);
      double mag = std::fabs(dx0[i]) +
                   r[n] * (std::fabs(g) + ag / kC + std::fabs(xhat) * agx / kC);
      tx[i] = Eta(dt) + U(dt) * std::fabs(rx[i]) + (kC + 16) * kU32 * mag;
      rw[c] += dy[i] * xhat, mw[c] += std::fabs(dy[i] * xhat);
      rb[c] += dy[i], mb[c] += std::fabs(dy[i]);
    }
  }
  // Column sums of N terms (xhat: 3 roundings of its own), one rounding to dt.
  for (size_t c = 0; c < kC; c++) {
    tw[c] = Eta(dt) + U(dt) * std::fabs(rw[c]) + (kN + 8) * kU32 * mw[c];
    tb[c] = Eta(dt) + U(dt) * std::fabs(rb[c]) + (kN + 8) * kU32 * mb[c];
  }
  Expect("dinp (accumulated)", b.Down(*ddx, kN * kC, dt), rx, tx);
  Expect("dweight (accumulated)", b.Down(*ddw, kC, dt), rw, tw);
  Expect("dbias (accumulated)", b.Down(*ddb, kC, dt), rb, tb);
  return TS_OK;
}

// ---- GELU ----------------------------------------------------------------------------

// gelu(x) or gelu'(x) of the given form, in double (torch's formulas).
static double GeluRef(double x, ts_gelu_kind kind, int grad) {
  const double k = std::sqrt(2 / M_PI), kappa = 0.044715;
  if (kind == TS_GELU_ERF) {
    double cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
    return grad ? cdf + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI) : x * cdf;
  }
  double t = std::tanh(k * (x + kappa * x * x * x));
  return grad ? 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * kappa * x * x)
              : 0.5 * x * (1 + t);
}

ts_status Gelu(Backend &b, ts_dtype dt, Rng &rng, ts_gelu_kind kind, int backward) {
  const size_t n = kN * kI;
  std::vector<float> x = Input(rng, n, dt, -5, 5), dy = Input(rng, n, dt);
  DevPtr dx = b.Up(x, dt), ddy = b.Up(dy, dt), dout = b.Poisoned(n, dt);
  RUN_OR_RETURN(backward ? ts_k_gelu_backward(b.ctx(), dout->p, ddy->p, dx->p, n, kind, dt)
                         : ts_k_gelu_forward(b.ctx(), dout->p, dx->p, n, kind, dt));
  std::vector<double> ref(n), tol(n);
  for (size_t i = 0; i < n; i++) {
    double xi = x[i], v = GeluRef(xi, kind, backward);
    // libm's and CUDA's erff/expf/tanhf: <= 2 ulp; a few roundings of the
    // value; and the fp32 cancellation in 1 + erf, 1 + tanh, 1 - tanh^2
    // (absolute ~u) times the factors in front of them (x/2; the tanh
    // gradient's x (1 + 3 kappa x^2)).
    double scale = backward ? std::fabs(dy[i]) : 1.0;
    ref[i] = backward ? dy[i] * v : v;
    tol[i] = Eta(dt) + U(dt) * std::fabs(ref[i]) +
             16 * kU32 * scale * (std::fabs(v) + std::fabs(xi) * (1 + xi * xi));
  }
  Expect(backward ? "dinp" : "out", b.Down(*dout, n, dt), ref, tol);
  return TS_OK;
}

// ---- bias -----------------------------------------------------------------------------

// out += bias: one fp32 addition of two stored values and one rounding: exact.
ts_status BiasAdd(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> y = Input(rng, kN * kC, dt, -4, 4), bias = Input(rng, kC, dt);
  DevPtr dy = b.Up(y, dt), db = b.Up(bias, dt);
  RUN_OR_RETURN(ts_k_bias_add(b.ctx(), dy->p, db->p, kN, kC, dt));
  std::vector<float> want(y.size());
  for (size_t i = 0; i < y.size(); i++) want[i] = y[i] + bias[i % kC];
  ExpectBits("out", b.DownBytes(*dy, Bytes(y.size(), dt)), HostBytes(want, dt));
  return TS_OK;
}

ts_status BiasBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> g = Input(rng, kN * kC, dt), db0 = Input(rng, kC, dt);
  DevPtr dg = b.Up(g, dt), ddb = b.Up(db0, dt);
  b.Workspace(ts_k_bias_workspace_bytes(b.device(), kN, kC, dt));
  RUN_OR_RETURN(ts_k_bias_backward(b.ctx(), ddb->p, dg->p, kN, kC, dt));
  std::vector<double> ref(kC), tol(kC);
  for (size_t c = 0; c < kC; c++) {
    double s = db0[c], mag = std::fabs(db0[c]);
    for (size_t n = 0; n < kN; n++) s += g[n * kC + c], mag += std::fabs(g[n * kC + c]);
    ref[c] = s;
    tol[c] = Eta(dt) + U(dt) * std::fabs(s) + (kN + 4) * kU32 * mag;
  }
  Expect("dbias (accumulated)", b.Down(*ddb, kC, dt), ref, tol);
  return TS_OK;
}

// ---- token types ------------------------------------------------------------------------

// Integer counts: exact, whatever dt (the op has none; each dtype reruns it).
ts_status TokenTypes(Backend &b, ts_dtype dt, Rng &rng) {
  const int32_t sep = 3;
  std::vector<int32_t> tok(kB * kT);
  for (auto &t : tok) t = rng.below(12);  // [SEP] about every 12th token
  DevPtr dtok = b.UpInts(tok), dty = b.PoisonedBytes(tok.size() * 4);
  const size_t n_types = 2 + (size_t)dt;  // 2, 3, 4 types over the three runs
  RUN_OR_RETURN(ts_k_token_types(b.ctx(), dty->as<int32_t>(), dtok->as<int32_t>(), kB, kT, sep,
                                 n_types));
  std::vector<int32_t> want(tok.size());
  for (size_t r = 0; r < kB; r++) {
    int32_t seen = 0;
    for (size_t t = 0; t < kT; t++) {
      want[r * kT + t] = std::min<int32_t>(seen, (int32_t)n_types - 1);
      seen += tok[r * kT + t] == sep;
    }
  }
  std::vector<unsigned char> wb(want.size() * 4);
  std::memcpy(wb.data(), want.data(), wb.size());
  ExpectBits("types", b.DownBytes(*dty, wb.size()), wb);
  return TS_OK;
}

}  // namespace ts_parity

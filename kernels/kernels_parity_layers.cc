// kernels_parity_layers.cc — the parity cases of the model's layers:
// RMSNorm (and the residual add fused with it), RoPE, attention (causal
// GQA and MQA; bidirectional with padded keys), SwiGLU, cross-entropy
// (method and bounds: kernels_parity_test.cc).
#include "kernels/kernels_parity.h"

namespace ts_parity {

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

// RMSNorm forward's out (dy) and rstd (dr) of input x, weight w on b
// against the double reference.
static void ExpectRmsnorm(Backend &b, ts_dtype dt, const std::vector<float> &x,
                          const std::vector<float> &w, const Dev &dy, const Dev &dr) {
  std::vector<double> r = Rstd(x), ref(kN * kC), tol(kN * kC), tr(kN);
  for (size_t n = 0; n < kN; n++) {
    tr[n] = (kC + 8) * kU32 * r[n];  // C squares summed, then / + sqrt and 1/
    for (size_t c = 0; c < kC; c++) {
      double o = (double)w[c] * x[n * kC + c] * r[n];
      ref[n * kC + c] = o;
      tol[n * kC + c] = Eta(dt) + (U(dt) + (kC + 12) * kU32) * std::fabs(o);  // a product: relative
    }
  }
  Expect("out", b.Down(dy, kN * kC, dt), ref, tol);
  Expect("rstd", b.Down(dr, kN, TS_FP32), r, tr);
}

ts_status RmsnormForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt, -2, 2), w = Input(rng, kC, dt, 0.5f, 1.5f);
  DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), dy = b.Poisoned(kN * kC, dt);
  DevPtr dr = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_rmsnorm_forward(b.ctx(), dy->p, dr->as<float>(), dx->p, dw->p, kN, kC, kEps,
                                     dt));
  ExpectRmsnorm(b, dt, x, w, *dy, *dr);
  return TS_OK;
}

std::vector<float> ExpectAddRes(Backend &b, ts_dtype dt, const std::vector<float> &a,
                                const std::vector<float> &c, const Dev &res) {
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); i++) sum[i] = a[i] + c[i];  // fp32
  sum = ts_test::round_to(sum, dt);
  ExpectBits("res", b.DownBytes(res, Bytes(sum.size(), dt)), HostBytes(sum, dt));
  return sum;
}

void ExpectSameBits(Backend &b, ts_dtype dt, const AddNormRun &got, const AddNormRun &want,
                    const char *what) {
  SCOPED_TRACE(what);
  ExpectBits("out", b.DownBytes(*got.out, Bytes(kN * kC, dt)),
             b.DownBytes(*want.out, Bytes(kN * kC, dt)));
  ExpectBits("res", b.DownBytes(*got.res, Bytes(kN * kC, dt)),
             b.DownBytes(*want.res, Bytes(kN * kC, dt)));
  for (int i = 0; i < got.n_stats; i++)
    ExpectBits(i + 1 < got.n_stats ? "mean" : "rstd", b.DownBytes(*got.stat[i], kN * 4),
               b.DownBytes(*want.stat[i], kN * 4));
}

// A run of ts_k_add_rmsnorm_forward on b: r's outputs from a + c, r's res
// (aliasing a when a is r's res).
static ts_status AddRmsnorm(Backend &b, ts_dtype dt, const AddNormRun &r, const Dev &a,
                            const Dev &c, const Dev &w) {
  return ts_k_add_rmsnorm_forward(b.ctx(), r.out->p, r.stat[0]->as<float>(), r.res->p, a.p, c.p,
                                  w.p, kN, kC, kEps, dt);
}

ts_status AddRmsnormForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kC, dt), y = Input(rng, kN * kC, dt),
                     w = Input(rng, kC, dt, 0.5f, 1.5f);
  DevPtr dx = b.Up(x, dt), dy = b.Up(y, dt), dw = b.Up(w, dt);
  AddNormRun fused(b, dt, 1), in_place(b, dt, 1), unfused(b, dt, 1);
  RUN_OR_RETURN(AddRmsnorm(b, dt, fused, *dx, *dy, *dw));
  ExpectRmsnorm(b, dt, ExpectAddRes(b, dt, x, y, *fused.res), w, *fused.out, *fused.stat[0]);
  // res aliasing a (a residual stream updated in place), and the two ops apart
  in_place.res = b.Up(x, dt);
  RUN_OR_RETURN(AddRmsnorm(b, dt, in_place, *in_place.res, *dy, *dw));
  RUN_OR_RETURN(ts_k_add(b.ctx(), unfused.res->p, dx->p, dy->p, kN * kC, dt));
  RUN_OR_RETURN(ts_k_rmsnorm_forward(b.ctx(), unfused.out->p, unfused.stat[0]->as<float>(),
                                     unfused.res->p, dw->p, kN, kC, kEps, dt));
  ExpectSameBits(b, dt, fused, in_place, "res aliasing a");
  ExpectSameBits(b, dt, fused, unfused, "ts_k_add then the norm");
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
  b.Workspace(ts_k_rmsnorm_workspace_bytes(b.device(), kN, kC, dt));
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
                            size_t HS, ts_dtype dt) {
  std::vector<double> tol(x.size());
  size_t half = HS / 2;
  for (size_t o = 0; o < x.size(); o += HS)
    for (size_t i = 0; i < half; i++) {
      double mag = std::fabs(x[o + i]) + std::fabs(x[o + i + half]);
      for (size_t j : {o + i, o + i + half})
        tol[j] = Eta(dt) + U(dt) * std::fabs(ref[j]) + 8 * kU32 * mag;
    }
  return tol;
}

ts_status Rope(Backend &b, ts_dtype dt, Rng &rng, int backward, size_t HS) {
  // The parity shapes; at another head size (the largest one) a short batch.
  const size_t B = HS == kHS ? kB : 1, T = HS == kHS ? kT : 5, H = HS == kHS ? kNH : 2;
  const float theta = 10000.0f;
  std::vector<float> x = Input(rng, B * T * H * HS, dt);
  DevPtr dx = b.Up(x, dt), dout = b.Poisoned(x.size(), dt);
  RUN_OR_RETURN(backward ? ts_k_rope_backward(b.ctx(), dout->p, dx->p, B, T, H, HS, theta, dt)
                         : ts_k_rope_forward(b.ctx(), dout->p, dx->p, B, T, H, HS, theta, dt));
  std::vector<double> ref;
  ts_test::rope_ref(ref, x, B, T, H, HS, theta, backward ? -1 : 1);
  Expect(backward ? "dx" : "out", b.Down(*dout, x.size(), dt), ref, RopeTol(x, ref, HS, dt));
  return TS_OK;
}

ts_status RopeAt(Backend &b, ts_dtype dt, Rng &rng) {
  const size_t pos0 = 7, T = 5, H = kNH, row = H * kHS;
  const float theta = 10000.0f;
  std::vector<float> full = Input(rng, (pos0 + T) * row, dt);
  std::vector<float> x(full.begin() + pos0 * row, full.end());
  DevPtr dx = b.Up(x, dt), dout = b.Poisoned(x.size(), dt);
  RUN_OR_RETURN(ts_k_rope_forward_at(b.ctx(), dout->p, dx->p, T, pos0, H, kHS, theta, dt));
  std::vector<double> ref;
  ts_test::rope_ref(ref, full, 1, pos0 + T, H, kHS, theta, 1);
  std::vector<double> tail(ref.begin() + pos0 * row, ref.end());
  Expect("out", b.Down(*dout, x.size(), dt), tail, RopeTol(x, tail, kHS, dt));
  return TS_OK;
}

// ---- attention ----------------------------------------------------------------------------

// The ids of the bidirectional cases (pad id 0): batch row 0 pads every
// fifth key and its last six; batch row 1 pads none.
std::vector<int32_t> PadIds() {
  std::vector<int32_t> ids(kB * kT);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = 1 + (int32_t)(i % 50);
  for (size_t j = 0; j < kT; j++)
    if (j % 5 == 3 || j + 6 >= kT) ids[j] = 0;
  return ids;
}

// Does query i of batch row b see key j? Causal (ids empty): j <= i; else
// every key whose id is not 0.
static bool Sees(const std::vector<int32_t> &ids, size_t b, size_t i, size_t j) {
  return ids.empty() ? j <= i : ids[b * kT + j] != 0;
}

AttnRef AttentionRef(const std::vector<float> &q, const std::vector<float> &k,
                     const std::vector<float> &v, size_t NKV, ts_dtype dt,
                     const std::vector<int32_t> &ids, ts_dtype pv_dt) {
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
        std::vector<double> s(kT);
        double mx = -INFINITY, smag = 0;
        for (size_t j = 0; j < kT; j++) {
          if (!Sees(ids, b, i, j)) continue;
          const float *kj = &k[((b * kT + j) * NKV + g) * kHS];
          double d = 0, ad = 0;
          for (size_t e = 0; e < kHS; e++) d += (double)qi[e] * kj[e], ad += std::fabs((double)qi[e] * kj[e]);
          s[j] = scale * d;
          mx = std::fmax(mx, s[j]);
          smag = std::fmax(smag, scale * ad);
        }
        double z = 0;
        for (size_t j = 0; j < kT; j++)
          if (Sees(ids, b, i, j)) z += std::exp(s[j] - mx);
        // relative error of each p: the logits' (HS products each, twice:
        // s_j and the max) plus the exponentials and the sum of i + 1 terms
        double rel = 2 * (kHS + 2) * kU32 * smag + (kT + 8) * kU32;
        double *prow = &r.p[((b * kNH + h) * kT + i) * kT];
        for (size_t j = 0; j < kT; j++) {
          if (!Sees(ids, b, i, j)) continue;  // exactly 0
          prow[j] = std::exp(s[j] - mx) / z;
          r.tp[((b * kNH + h) * kT + i) * kT + j] = Eta(dt) + (U(dt) + rel) * prow[j];
        }
        // P held in pv_dt for P v (a fused kernel's tensor-core product):
        // one more rounding of each p_j, U(pv_dt) p_j |v_j| (Eta(pv_dt)
        // |v_j| where p_j is subnormal in fp16).
        const double pv_u = pv_dt == TS_FP32 ? 0 : U(pv_dt), pv_eta = pv_dt == TS_FP32 ? 0 : Eta(pv_dt);
        for (size_t e = 0; e < kHS; e++) {
          double o = 0, mag = 0, vmag = 0;
          for (size_t j = 0; j < kT; j++) {
            if (!Sees(ids, b, i, j)) continue;
            double vj = v[((b * kT + j) * NKV + g) * kHS + e];
            o += prow[j] * vj;
            mag += prow[j] * std::fabs(vj);
            vmag += std::fabs(vj);
          }
          size_t oi = ((b * kT + i) * kNH + h) * kHS + e;
          r.o[oi] = o;
          r.to[oi] = Eta(dt) + U(dt) * std::fabs(o) + (rel + pv_u + (kT + 4) * kU32) * mag +
                     pv_eta * vmag;
        }
      }
    }
  return r;
}

// Bytes of the probabilities (B, NH, T, T) in dt: the attention state of
// CUDA fp32 (kernels.h); the fused kernels (the CPU's, cuDNN's for CUDA
// bf16/fp16) keep the rows' log-sum-exp instead.
static size_t ProbsBytes(size_t B, ts_dtype dt) { return Bytes(B * kNH * kT * kT, dt); }

// The forward of the op under test: causal (ids empty) or bidirectional.
static ts_status Forward(Backend &b, const std::vector<int32_t> &ids, const DevPtr &dids,
                         void *out, void *state, const void *q, const void *k, const void *v,
                         size_t NKV, ts_dtype dt) {
  if (ids.empty())
    return ts_k_attention_forward(b.ctx(), out, state, q, k, v, kB, kT, kNH, NKV, kHS, dt);
  return ts_k_attention_bidir_forward(b.ctx(), out, state, q, k, v, dids->as<int32_t>(), 0, kB,
                                      kT, kNH, kHS, dt);
}

ts_status AttentionForward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, unsigned flags,
                           bool bidir) {
  WithFlags with(b, flags);
  std::vector<int32_t> ids = bidir ? PadIds() : std::vector<int32_t>();
  DevPtr dids = b.UpInts(bidir ? ids : std::vector<int32_t>(1));
  std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                     v = Input(rng, kN * NKV * kHS, dt);
  b.Workspace(ts_k_attention_workspace_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt));
  size_t state_bytes = ts_k_attention_state_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt);
  DevPtr dq = b.Up(q, dt), dk = b.Up(k, dt), dv = b.Up(v, dt);
  DevPtr dout = b.Poisoned(q.size(), dt), dp = b.PoisonedBytes(state_bytes);
  RUN_OR_RETURN(Forward(b, ids, dids, dout->p, dp->p, dq->p, dk->p, dv->p, NKV, dt));
  // The bound follows the backend's algorithm: one more rounding of each
  // probability where it holds P in dt for P v (cuDNN's fused kernel).
  ts_dtype pv_dt;
  EXPECT_EQ(ts_k_attention_probs_dtype(b.ctx(), dt, bidir, &pv_dt), TS_OK) << ts_last_error();
  AttnRef r = AttentionRef(q, k, v, NKV, dt, ids, pv_dt);
  Expect("out", b.Down(*dout, q.size(), dt), r.o, r.to);
  if (state_bytes == ProbsBytes(kB, dt))
    Expect("probs (0 where not seen)", b.Down(*dp, r.p.size(), dt), r.p, r.tp);
  return TS_OK;
}

ts_status AttentionCached(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, size_t Tq) {
  std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                     v = Input(rng, kN * NKV * kHS, dt);
  // batch row 0: its last Tq queries, and its kT keys and values as the cache
  size_t pos0 = kT - Tq, qrow = kNH * kHS;
  std::vector<float> qn(q.begin() + pos0 * qrow, q.begin() + kT * qrow);
  std::vector<float> kc(k.begin(), k.begin() + kT * NKV * kHS),
      vc(v.begin(), v.begin() + kT * NKV * kHS);
  DevPtr dq = b.Up(qn, dt), dk = b.Up(kc, dt), dv = b.Up(vc, dt), dout = b.Poisoned(qn.size(), dt);
  RUN_OR_RETURN(ts_k_attention_cached(b.ctx(), dout->p, dq->p, dk->p, dv->p, Tq, pos0, kNH, NKV,
                                      kHS, dt));
  AttnRef r = AttentionRef(q, k, v, NKV, dt, std::vector<int32_t>(), TS_FP32);  // P in fp32
  std::vector<double> o(r.o.begin() + pos0 * qrow, r.o.begin() + kT * qrow),
      to(r.to.begin() + pos0 * qrow, r.to.begin() + kT * qrow);
  Expect("out", b.Down(*dout, qn.size(), dt), o, to);
  return TS_OK;
}

ts_status AttentionBackward(Backend &b, ts_dtype dt, Rng &rng, size_t NKV, unsigned flags,
                            bool bidir) {
  WithFlags with(b, flags);
  std::vector<int32_t> ids = bidir ? PadIds() : std::vector<int32_t>();
  DevPtr dids = b.UpInts(bidir ? ids : std::vector<int32_t>(1));
  std::vector<float> q = Input(rng, kN * kNH * kHS, dt), k = Input(rng, kN * NKV * kHS, dt),
                     v = Input(rng, kN * NKV * kHS, dt), dout = Input(rng, q.size(), dt);
  // The saved state as this backend's own forward stores it (the
  // probabilities rounded to dt, or the rows' log-sum-exp) and its output.
  b.Workspace(ts_k_attention_workspace_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt));
  size_t state_bytes = ts_k_attention_state_bytes(b.device(), kB, kT, kNH, NKV, kHS, dt);
  DevPtr dq_in = b.Up(q, dt), dk_in = b.Up(k, dt), dv_in = b.Up(v, dt), ddo = b.Up(dout, dt);
  DevPtr dp = b.PoisonedBytes(state_bytes), dfo = b.Poisoned(q.size(), dt);
  RUN_OR_RETURN(Forward(b, ids, dids, dfo->p, dp->p, dq_in->p, dk_in->p, dv_in->p, NKV, dt));
  DevPtr ddq = b.Poisoned(q.size(), dt), ddk = b.Poisoned(k.size(), dt),
         ddv = b.Poisoned(v.size(), dt);
  RUN_OR_RETURN(bidir ? ts_k_attention_bidir_backward(b.ctx(), ddq->p, ddk->p, ddv->p, ddo->p,
                                                      dfo->p, dq_in->p, dk_in->p, dv_in->p, dp->p,
                                                      kB, kT, kNH, kHS, dt)
                      : ts_k_attention_backward(b.ctx(), ddq->p, ddk->p, ddv->p, ddo->p, dfo->p,
                                                dq_in->p, dk_in->p, dv_in->p, dp->p, kB, kT, kNH,
                                                NKV, kHS, dt));
  // The reference reads the exact probabilities rounded to dt. The backend
  // reads its own forward's state instead: probabilities it computed in
  // fp32 and rounded to dt (which may land one rounding away from the
  // reference's), or, from the log-sum-exp, probabilities recomputed and,
  // in a fused (flash) kernel, P and dS rounded to dt for its tensor-core
  // products. Either way each term carries up to two more roundings of
  // dt: 2 U(dt) of the magnitude sum.
  AttnRef fwd = AttentionRef(q, k, v, NKV, TS_FP32, ids, TS_FP32);
  std::vector<float> p = ts_test::round_to(std::vector<float>(fwd.p.begin(), fwd.p.end()), dt);
  const double fused = 2 * U(dt);
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
        std::vector<double> dP(kT), aP(kT);
        double dot = 0, adot = 0;
        for (size_t j = 0; j < kT; j++) {
          if (!Sees(ids, b_, i, j)) continue;
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
        for (size_t j = 0; j < kT; j++) {
          if (!Sees(ids, b_, i, j)) continue;
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
  const double depth = 4 * (kHS + rep * kT + 8) * kU32 + fused;
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

// The double reference of the cross-entropy of logits x (N, V) and targets
// y: each row's loss and the gradient dloss * (softmax - onehot) of its
// logits, with bounds. The losses are fp32 rows: (V + 8) u32 from the sum
// of exponentials plus 4 u32 of each term; the gradient: one rounding to dt
// plus the probability's (V + 8) u32.
struct CeRef {
  std::vector<double> loss, loss_tol, grad, grad_tol;
};

static CeRef CrossEntropyRef(const std::vector<float> &x, const std::vector<int32_t> &y, float dloss,
                             ts_dtype dt) {
  CeRef r{std::vector<double>(kN, 0), std::vector<double>(kN, 0), std::vector<double>(kN * kV, 0),
          std::vector<double>(kN * kV, 0)};
  for (size_t n = 0; n < kN; n++) {
    if (y[n] == TS_IGNORE_INDEX) continue;  // exactly 0, loss and gradient
    double mx = -INFINITY, z = 0;
    for (size_t j = 0; j < kV; j++) mx = std::fmax(mx, (double)x[n * kV + j]);
    for (size_t j = 0; j < kV; j++) z += std::exp(x[n * kV + j] - mx);
    double lse = std::log(z) + mx, xy = x[n * kV + y[n]];
    r.loss[n] = lse - xy;
    r.loss_tol[n] = (kV + 8) * kU32 + 4 * kU32 * (std::fabs(lse) + std::fabs(xy));
    for (size_t j = 0; j < kV; j++) {
      double p = std::exp(x[n * kV + j] - mx) / z, one = (int32_t)j == y[n] ? 1.0 : 0.0;
      double g = dloss * (p - one);
      r.grad[n * kV + j] = g;
      r.grad_tol[n * kV + j] =
          Eta(dt) + U(dt) * std::fabs(g) + dloss * ((kV + 8) * kU32 * p + 2 * kU32 * one);
    }
  }
  return r;
}

ts_status CrossEntropyForward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kV, dt, -4, 4);
  std::vector<int32_t> y = Targets();
  DevPtr dx = b.Up(x, dt), dy = b.UpInts(y), dl = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_cross_entropy_forward(b.ctx(), dl->as<float>(), dx->p, dy->as<int32_t>(), kN,
                                           kV, dt));
  CeRef r = CrossEntropyRef(x, y, 1.0f, dt);
  Expect("loss_rows", b.Down(*dl, kN, TS_FP32), r.loss, r.loss_tol);
  return TS_OK;
}

ts_status CrossEntropyBackward(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kV, dt, -4, 4);
  std::vector<int32_t> y = Targets();
  const float dloss = 1.0f / 61;
  DevPtr dx = b.Up(x, dt), dy = b.UpInts(y), dd = b.Poisoned(kN * kV, dt);
  RUN_OR_RETURN(ts_k_cross_entropy_backward(b.ctx(), dd->p, dx->p, dy->as<int32_t>(), kN, kV,
                                            dloss, dt));
  CeRef r = CrossEntropyRef(x, y, dloss, dt);
  Expect("dlogits", b.Down(*dd, kN * kV, dt), r.grad, r.grad_tol);
  return TS_OK;
}

// The fused pass, in place (dlogits == logits, as the LM head runs it): both
// outputs within the references' bounds, and bit for bit those of the two
// separate calls on the same backend.
ts_status CrossEntropyFused(Backend &b, ts_dtype dt, Rng &rng) {
  std::vector<float> x = Input(rng, kN * kV, dt, -4, 4);
  std::vector<int32_t> y = Targets();
  const float dloss = 1.0f / 61;
  DevPtr dx = b.Up(x, dt), dy = b.UpInts(y), dl = b.Poisoned(kN, TS_FP32);
  RUN_OR_RETURN(ts_k_cross_entropy_fused(b.ctx(), dl->as<float>(), dx->p, dx->p,
                                         dy->as<int32_t>(), kN, kV, dloss, dt));
  CeRef r = CrossEntropyRef(x, y, dloss, dt);
  Expect("loss_rows", b.Down(*dl, kN, TS_FP32), r.loss, r.loss_tol);
  Expect("dlogits", b.Down(*dx, kN * kV, dt), r.grad, r.grad_tol);
  DevPtr sx = b.Up(x, dt), sl = b.Poisoned(kN, TS_FP32), sd = b.Poisoned(kN * kV, dt);
  RUN_OR_RETURN(ts_k_cross_entropy_forward(b.ctx(), sl->as<float>(), sx->p, dy->as<int32_t>(), kN,
                                           kV, dt));
  RUN_OR_RETURN(ts_k_cross_entropy_backward(b.ctx(), sd->p, sx->p, dy->as<int32_t>(), kN, kV,
                                            dloss, dt));
  ExpectBits("fused loss_rows == forward's", b.DownBytes(*dl, kN * 4), b.DownBytes(*sl, kN * 4));
  ExpectBits("fused dlogits == backward's", b.DownBytes(*dx, Bytes(kN * kV, dt)),
             b.DownBytes(*sd, Bytes(kN * kV, dt)));
  return TS_OK;
}

}  // namespace ts_parity

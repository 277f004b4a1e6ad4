// kernels_cuda_paths_test.cc — the CUDA backend's faster paths against the
// paths they replaced and against the CPU. Needs a GPU (tag gpu); every
// test fails when the CUDA runtime finds no device.
//
// Bidirectional attention (bf16/fp16, kernels/cuda/attention.cu): cuDNN
// with per-row key lengths (its padding mask) against cuDNN with the
// (B, 1, T, T) bias (TS_K_BIAS_ATTENTION) and a double reference, every
// query row included (padded ones too); run to run bit for bit; rows whose
// padding is not a suffix redone by the plain kernels, bit for bit the
// plain path's (TS_K_PLAIN_ATTENTION) and within bounds of the CPU's.
//
// Embedding backward (kernels/cuda/embedding.cu): positions sorted by
// CUB's radix sort, then summed per token; bit for bit the CPU's result
// where every token has fewer than 64 positions (the same sums in the same
// order, every dtype), and bit for bit a host model of the slice sums of
// longer runs (what the bitonic sort before it gave: the sorted order is
// total, so any sort gives the same sums).
//
// The linear layer's bias epilogue (kernels/cuda/linear.cu): products
// with and without it on the same shapes, interleaved, each keeping its
// own plan; one rounding; a misaligned bias the aligned one's bits.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/kernels_parity.h"
#include "kernels/kernels_test_util.h"

namespace {

using ts_parity::Backend;
using ts_parity::DevPtr;
using ts_parity::Eta;
using ts_parity::kU32;
using ts_parity::U;
using ts_test::Rng;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The elements `which` of x (all of x when empty), each times factor.
template <typename T>
std::vector<T> Pick(const std::vector<T> &x, const std::vector<size_t> &which, double factor = 1) {
  std::vector<T> out;
  for (size_t w = 0; w < (which.empty() ? x.size() : which.size()); w++)
    out.push_back((T)(factor * x[which.empty() ? w : which[w]]));
  return out;
}

// got within factor * tol of want on the elements `which` (all if empty):
// ts_parity::Expect on those.
void ExpectWithin(const std::string &what, const std::vector<float> &got,
                  const std::vector<double> &want, const std::vector<double> &tol, double factor,
                  const std::vector<size_t> &which = {}) {
  ts_parity::Expect(what.c_str(), Pick(got, which), Pick(want, which), Pick(tol, which, factor));
}

// ---- bidirectional attention --------------------------------------------------------------

struct Shape {
  size_t B, T, NH, HS;
  size_t n() const { return B * T * NH * HS; }
  size_t at(size_t b, size_t t, size_t h, size_t e) const {
    return ((b * T + t) * NH + h) * HS + e;
  }
};

// The inputs of one case, rounded to dt: q, k, v and the gradient of out.
struct Inputs {
  std::vector<float> q, k, v, dout;
  Inputs(const Shape &s, ts_dtype dt, uint64_t seed) {
    Rng rng(seed);
    for (auto *x : {&q, &k, &v, &dout}) *x = ts_test::round_to(rng.vec(s.n()), dt);
  }
};

// ids with pad id 0: row b keeps keys [0, lens[b]) and pads the rest (a
// suffix), and also pads the keys in holes[b] (then not a suffix).
std::vector<int32_t> Ids(const Shape &s, const std::vector<size_t> &lens,
                         const std::vector<std::vector<size_t>> &holes = {}) {
  std::vector<int32_t> ids(s.B * s.T);
  for (size_t b = 0; b < s.B; b++)
    for (size_t j = 0; j < s.T; j++) ids[b * s.T + j] = j < lens[b] ? 1 + (int32_t)(j % 97) : 0;
  for (size_t b = 0; b < holes.size(); b++)
    for (size_t j : holes[b]) ids[b * s.T + j] = 0;
  return ids;
}

// The double reference of the op for key flags ids != 0, with the bound
// of each output for a pass that holds P in dt for P v and P, dS in dt for
// its backward products (cuDNN's fused kernels; it covers fp32 P too):
// the parity test's bounds (kernels_parity_test.cc: HS products and T
// terms in fp32, Higham §3.1, plus the roundings to dt).
struct Ref {
  std::vector<double> out, tout, lse, tlse, dq, tdq, dk, tdk, dv, tdv;
};

Ref Reference(const Shape &s, const Inputs &in, const std::vector<int32_t> &ids, ts_dtype dt) {
  const size_t n = s.n(), T = s.T, HS = s.HS;
  const double sc = 1.0 / std::sqrt((double)HS), u = U(dt), eta = Eta(dt);
  Ref r;
  for (auto *x : {&r.out, &r.tout, &r.dq, &r.tdq, &r.dk, &r.tdk, &r.dv, &r.tdv}) x->assign(n, 0);
  r.lse.assign(s.B * s.NH * T, 0);
  r.tlse.assign(r.lse.size(), 0);
  std::vector<double> mo(n, 0), vm(n, 0), mq(n, 0), mk(n, 0), mv(n, 0);
  std::vector<double> p(T), dp(T), adp(T);
  for (size_t b = 0; b < s.B; b++)
    for (size_t h = 0; h < s.NH; h++)
      for (size_t i = 0; i < T; i++) {
        double mx = -INFINITY, smag = 0, z = 0, D = 0, aD = 0;
        for (size_t j = 0; j < T; j++) {
          p[j] = 0;
          if (!ids[b * T + j]) continue;
          double dot = 0, adot = 0, g = 0, ag = 0;
          for (size_t e = 0; e < HS; e++) {
            double qk = (double)in.q[s.at(b, i, h, e)] * in.k[s.at(b, j, h, e)];
            double gv = (double)in.dout[s.at(b, i, h, e)] * in.v[s.at(b, j, h, e)];
            dot += qk, adot += std::fabs(qk), g += gv, ag += std::fabs(gv);
          }
          p[j] = sc * dot, dp[j] = g, adp[j] = ag;
          mx = std::max(mx, p[j]);
          smag = std::max(smag, sc * adot);
        }
        for (size_t j = 0; j < T; j++)
          if (ids[b * T + j]) z += std::exp(p[j] - mx);
        for (size_t j = 0; j < T; j++) {
          if (!ids[b * T + j]) continue;
          p[j] = std::exp(p[j] - mx) / z;
          D += p[j] * dp[j], aD += p[j] * adp[j];
        }
        const size_t row = (b * s.NH + h) * T + i;
        r.lse[row] = mx + std::log(z);
        r.tlse[row] = (HS + 2) * kU32 * smag + (T + 8) * kU32 * (1 + std::fabs(r.lse[row]));
        const double rel = 2 * (HS + 2) * kU32 * smag + (T + 8) * kU32;
        for (size_t j = 0; j < T; j++) {
          if (!ids[b * T + j]) continue;
          double ds = sc * p[j] * (dp[j] - D), ads = sc * p[j] * (adp[j] + aD);
          for (size_t e = 0; e < HS; e++) {
            size_t qi = s.at(b, i, h, e), kj = s.at(b, j, h, e);
            r.out[qi] += p[j] * in.v[kj];
            mo[qi] += p[j] * std::fabs(in.v[kj]);
            vm[qi] += std::fabs(in.v[kj]);
            r.dq[qi] += ds * in.k[kj], mq[qi] += ads * std::fabs(in.k[kj]);
            r.dk[kj] += ds * in.q[qi], mk[kj] += ads * std::fabs(in.q[qi]);
            r.dv[kj] += p[j] * in.dout[qi], mv[kj] += p[j] * std::fabs(in.dout[qi]);
          }
        }
        for (size_t e = 0; e < HS; e++) {
          size_t qi = s.at(b, i, h, e);
          r.tout[qi] = eta + u * std::fabs(r.out[qi]) + (rel + u + (T + 4) * kU32) * mo[qi] +
                       eta * vm[qi];
        }
      }
  const double depth = 4 * (HS + T + 8) * kU32 + 2 * u;  // two reductions deep, P and dS in dt
  for (size_t x = 0; x < n; x++) {
    r.tdq[x] = eta + u * std::fabs(r.dq[x]) + depth * mq[x];
    r.tdk[x] = eta + u * std::fabs(r.dk[x]) + depth * mk[x];
    r.tdv[x] = eta + u * std::fabs(r.dv[x]) + depth * mv[x];
  }
  return r;
}

// One output of a run: its stored bytes and their values widened to fp32.
struct Out {
  std::vector<unsigned char> bits;
  std::vector<float> val;
};

// What one run of both passes gives: out, the state's log-sum-exps
// (B, NH, T) fp32 and key flags (B, T), dq, dk, dv.
struct Passes {
  Out out, lse, dq, dk, dv;
  std::vector<unsigned char> keep;
};

// Both passes of the op on device dev, a fresh context with `flags` added
// and exactly ts_k_attention_workspace_bytes's workspace (plus `extra`
// bytes); every output poisoned before.
Passes RunOn(ts_device dev, const Shape &s, const Inputs &in, const std::vector<int32_t> &ids,
             ts_dtype dt, unsigned flags, size_t extra = 0) {
  Backend b(dev);
  b.SetFlags(b.ctx()->flags | flags);
  b.Workspace(ts_k_attention_workspace_bytes(dev, s.B, s.T, s.NH, s.NH, s.HS, dt) + extra);
  const size_t n = s.n(), rows = s.B * s.NH * s.T;
  const size_t sb = ts_k_attention_state_bytes(dev, s.B, s.T, s.NH, s.NH, s.HS, dt);
  DevPtr q = b.Up(in.q, dt), k = b.Up(in.k, dt), v = b.Up(in.v, dt), g = b.Up(in.dout, dt);
  DevPtr dids = b.UpInts(ids), out = b.Poisoned(n, dt), state = b.PoisonedBytes(sb);
  DevPtr dq = b.Poisoned(n, dt), dk = b.Poisoned(n, dt), dv = b.Poisoned(n, dt);
  EXPECT_EQ(ts_k_attention_bidir_forward(b.ctx(), out->p, state->p, q->p, k->p, v->p,
                                         dids->as<int32_t>(), 0, s.B, s.T, s.NH, s.HS, dt),
            TS_OK)
      << ts_last_error();
  EXPECT_EQ(ts_k_attention_bidir_backward(b.ctx(), dq->p, dk->p, dv->p, g->p, out->p, q->p, k->p,
                                          v->p, state->p, s.B, s.T, s.NH, s.HS, dt),
            TS_OK)
      << ts_last_error();
  auto take = [&](const DevPtr &d, size_t count, ts_dtype t) {
    return Out{b.DownBytes(*d, count * ts_dtype_size(t)), b.Down(*d, count, t)};
  };
  Passes p{take(out, n, dt), take(state, rows, TS_FP32), take(dq, n, dt), take(dk, n, dt),
           take(dv, n, dt), {}};
  std::vector<unsigned char> all = b.DownBytes(*state, sb);
  p.keep.assign(all.begin() + rows * 4, all.end());
  return p;
}

// The bias path's extra workspace (kernels.h, TS_K_BIAS_ATTENTION).
size_t BiasBytes(const Shape &s) { return (s.B * s.T * s.T * 2 + 255) / 256 * 256; }

// Elements of (B, T, NH, HS) tensors (or, lse, of (B, NH, T)) in batch rows `rows`.
std::vector<size_t> InRows(const Shape &s, const std::vector<size_t> &rows, bool lse = false) {
  std::vector<size_t> idx;
  size_t per = lse ? s.NH * s.T : s.T * s.NH * s.HS;
  for (size_t b : rows)
    for (size_t i = 0; i < per; i++) idx.push_back(b * per + i);
  return idx;
}

// Each of got's outputs within its bound of the reference (factor 1), and
// of other's (factor 2: both within theirs), over `rows` (all if empty).
void ExpectPaths(const std::string &what, const Passes &got, const Passes &other, const Ref &r,
                 const Shape &s, const std::vector<size_t> &rows = {}) {
  const std::vector<size_t> x = rows.empty() ? rows : InRows(s, rows),
                            l = rows.empty() ? rows : InRows(s, rows, true);
  struct {
    const char *name;
    const Out &a, &b;
    const std::vector<double> &ref, &tol;
    const std::vector<size_t> &which;
  } outs[] = {{"out", got.out, other.out, r.out, r.tout, x},
              {"lse", got.lse, other.lse, r.lse, r.tlse, l},
              {"dq", got.dq, other.dq, r.dq, r.tdq, x},
              {"dk", got.dk, other.dk, r.dk, r.tdk, x},
              {"dv", got.dv, other.dv, r.dv, r.tdv, x}};
  for (const auto &o : outs) {
    ExpectWithin(what + " " + o.name + " vs reference", o.a.val, o.ref, o.tol, 1, o.which);
    ExpectWithin(what + " " + o.name + " vs the other path", o.a.val,
                 std::vector<double>(o.b.val.begin(), o.b.val.end()), o.tol, 2, o.which);
  }
}

// Batch rows `rows` of two outputs (B, ...) equal byte for byte.
void ExpectRowBits(const std::string &what, const Out &a, const Out &b, size_t B,
                   const std::vector<size_t> &rows) {
  ASSERT_EQ(a.bits.size(), b.bits.size()) << what;
  size_t per = a.bits.size() / B;
  for (size_t r : rows)
    EXPECT_TRUE(std::equal(a.bits.begin() + r * per, a.bits.begin() + (r + 1) * per,
                           b.bits.begin() + r * per))
        << what << ": batch row " << r << " differs";
}

// Every output of two runs equal byte for byte.
bool SameBits(const Passes &a, const Passes &b) {
  return a.out.bits == b.out.bits && a.lse.bits == b.lse.bits && a.keep == b.keep &&
         a.dq.bits == b.dq.bits && a.dk.bits == b.dk.bits && a.dv.bits == b.dv.bits;
}

// dk and dv are exactly 0 at every padded key (kernels.h: a masked key
// gets dk = dv = 0 from every query).
void ExpectZeroAtPadding(const std::string &what, const Passes &r, const Shape &s,
                         const std::vector<int32_t> &ids) {
  size_t bad = 0;
  for (size_t b = 0; b < s.B; b++)
    for (size_t j = 0; j < s.T; j++)
      for (size_t x = 0; x < s.NH * s.HS && !ids[b * s.T + j]; x++) {
        size_t i = (b * s.T + j) * s.NH * s.HS + x;
        bad += r.dk.val[i] != 0.0f || r.dv.val[i] != 0.0f;
      }
  EXPECT_EQ(bad, 0u) << what << ": dk or dv not 0 at padded keys";
}

const Shape kShapes[] = {{4, 77, 4, 64}, {2, 128, 2, 128}};

// Suffix padding only: the lengths path (the default) against the bias
// path, each within its bound of the reference on every row, padded query
// rows included, and against each other within the two bounds; both ran on
// cuDNN (not the plain kernels' bits); both passes repeat bit for bit.
TEST(CudaPaths, BidirKeyLengthsMatchTheBiasPath) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  for (ts_dtype dt : {TS_BF16, TS_FP16})
    for (const Shape &s : kShapes) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " T " + std::to_string(s.T));
      // no padding, a long and a one-key row, one padded key
      std::vector<size_t> lens = {s.T, s.T * 2 / 3, 1, s.T - 1};
      lens.resize(s.B);
      std::vector<int32_t> ids = Ids(s, lens);
      Inputs in(s, dt, 700 + s.T + (uint64_t)dt);
      Ref ref = Reference(s, in, ids, dt);
      const ts_device gpu = TS_DEVICE_CUDA;
      Passes lengths = RunOn(gpu, s, in, ids, dt, 0), again = RunOn(gpu, s, in, ids, dt, 0);
      Passes bias = RunOn(gpu, s, in, ids, dt, TS_K_BIAS_ATTENTION, BiasBytes(s));
      Passes plain = RunOn(gpu, s, in, ids, dt, TS_K_PLAIN_ATTENTION);
      // cuDNN rounds P to dt, the plain kernels keep it in fp32: a graph
      // cuDNN refused would leave the plain kernels' bits
      EXPECT_TRUE(lengths.out.bits != plain.out.bits && lengths.dq.bits != plain.dq.bits)
          << "the lengths path did not run on cuDNN";
      EXPECT_TRUE(bias.out.bits != plain.out.bits && bias.dq.bits != plain.dq.bits)
          << "the bias path did not run on cuDNN";
      ExpectPaths("lengths", lengths, bias, ref, s);
      ExpectPaths("bias", bias, lengths, ref, s);
      ExpectZeroAtPadding("lengths", lengths, s, ids);
      ExpectZeroAtPadding("bias", bias, s, ids);
      EXPECT_TRUE(SameBits(lengths, again)) << "the lengths path does not repeat";
      EXPECT_TRUE(lengths.keep == bias.keep) << "key flags";
    }
}

// Padding inside a row (not a suffix): that row is redone by the plain
// kernels (bit for bit the plain path's, TS_K_PLAIN_ATTENTION) and lies
// within the bounds of the CPU's result; the suffix rows beside it stay
// on cuDNN's lengths (within the bounds of the bias path's, not the plain
// kernels' bits); all of it repeats.
TEST(CudaPaths, BidirPaddingInsideARowTakesThePlainKernels) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  for (ts_dtype dt : {TS_BF16, TS_FP16})
    for (const Shape &s : kShapes) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " T " + std::to_string(s.T));
      std::vector<size_t> lens = {s.T, s.T - 9, s.T / 2, s.T};
      lens.resize(s.B);
      // row 1: holes at 0, 5 and 6 before its padded end (not a suffix)
      std::vector<int32_t> ids = Ids(s, lens, {{}, {0, 5, 6}});
      const std::vector<size_t> redo = {1},
                                suffix = s.B == 4 ? std::vector<size_t>{0, 2, 3}
                                                  : std::vector<size_t>{0};
      Inputs in(s, dt, 900 + s.T + (uint64_t)dt);
      Ref ref = Reference(s, in, ids, dt);
      const ts_device gpu = TS_DEVICE_CUDA;
      Passes lengths = RunOn(gpu, s, in, ids, dt, 0), again = RunOn(gpu, s, in, ids, dt, 0);
      Passes plain = RunOn(gpu, s, in, ids, dt, TS_K_PLAIN_ATTENTION);
      Passes bias = RunOn(gpu, s, in, ids, dt, TS_K_BIAS_ATTENTION, BiasBytes(s));
      Passes cpu = RunOn(TS_DEVICE_CPU, s, in, ids, dt, 0);  // P in fp32, the same bounds
      ExpectPaths("lengths", lengths, bias, ref, s);
      ExpectZeroAtPadding("lengths", lengths, s, ids);
      ExpectRowBits("out == the plain path's", lengths.out, plain.out, s.B, redo);
      ExpectRowBits("lse == the plain path's", lengths.lse, plain.lse, s.B, redo);
      ExpectRowBits("dq == the plain path's", lengths.dq, plain.dq, s.B, redo);
      ExpectRowBits("dk == the plain path's", lengths.dk, plain.dk, s.B, redo);
      ExpectRowBits("dv == the plain path's", lengths.dv, plain.dv, s.B, redo);
      ExpectPaths("the redone row vs the CPU", lengths, cpu, ref, s, redo);
      ExpectPaths("the suffix rows vs the bias path", lengths, bias, ref, s, suffix);
      bool cudnn = false;  // the suffix rows are not the plain kernels' bits
      size_t per = lengths.out.bits.size() / s.B;
      for (size_t b : suffix)
        cudnn |= !std::equal(lengths.out.bits.begin() + b * per,
                             lengths.out.bits.begin() + (b + 1) * per,
                             plain.out.bits.begin() + b * per);
      EXPECT_TRUE(cudnn) << "the suffix rows did not run on cuDNN";
      EXPECT_TRUE(SameBits(lengths, again)) << "the lengths path does not repeat";
    }
}

// ---- embedding backward -------------------------------------------------------------------

// dwte after the CUDA algorithm (kernels/cuda/embedding.cu), on the host:
// the positions of each token in order; a run of L < 64 positions summed
// in order (fp32: into dwte one addition at a time; bf16/fp16: in fp32
// from 0, then dwte + sum rounded once: the CPU's rule); a longer one as 32
// slices [L w / 32, L (w + 1) / 32), each summed in order in fp32, the
// slice sums added in order from 0, then dwte + total rounded once.
// Tokens outside [0, V) are skipped.
std::vector<float> SliceSums(std::vector<float> dw, const std::vector<float> &dout,
                             const std::vector<int32_t> &tok, size_t C, size_t V, ts_dtype dt) {
  std::vector<std::vector<size_t>> at(V);
  for (size_t n = 0; n < tok.size(); n++)
    if (tok[n] >= 0 && (size_t)tok[n] < V) at[tok[n]].push_back(n);
  for (size_t t = 0; t < V; t++) {
    const std::vector<size_t> &pos = at[t];
    size_t L = pos.size();
    for (size_t c = 0; c < C && L; c++) {
      float &w = dw[t * C + c];
      float sum = 0.0f;
      if (L < 64 && dt == TS_FP32) {
        for (size_t n : pos) w += dout[n * C + c];
        continue;
      }
      if (L < 64) {
        for (size_t n : pos) sum += dout[n * C + c];
      } else {
        for (size_t s = 0; s < 32; s++) {
          float part = 0.0f;
          for (size_t j = L * s / 32; j < L * (s + 1) / 32; j++) part += dout[pos[j] * C + c];
          sum += part;
        }
      }
      w = ts_test::round_to({w + sum}, dt)[0];
    }
  }
  return dw;
}

// ts_k_embedding_backward on device dev (a fresh context with `flags`
// added and exactly the query's workspace) into dwte = dw0: its bytes.
std::vector<unsigned char> EmbeddingBackwardOn(ts_device dev, const std::vector<float> &dw0,
                                               const std::vector<float> &dout,
                                               const std::vector<int32_t> &tok, size_t C,
                                               size_t V, ts_dtype dt, unsigned flags) {
  Backend b(dev);
  b.SetFlags(b.ctx()->flags | flags);
  b.Workspace(ts_k_embedding_workspace_bytes(dev, tok.size(), dt));
  DevPtr dw = b.Up(dw0, dt), dd = b.Up(dout, dt), dtok = b.UpInts(tok);
  EXPECT_EQ(ts_k_embedding_backward(b.ctx(), dw->p, dd->p, dtok->as<int32_t>(), tok.size(), C, V,
                                    dt),
            TS_OK)
      << ts_last_error();
  return b.DownBytes(*dw, dw0.size() * ts_dtype_size(dt));
}

// Every token at fewer than 64 positions (BERT's words in a 256 x 128
// batch, one at 63): the CPU's bits in every dtype, at N a power of two,
// not one, and 1; twice the same.
TEST(CudaPaths, EmbeddingBackwardMatchesTheCpuBitwise) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t C = 72, V = 30522;
  for (size_t N : {(size_t)32768, (size_t)5000, (size_t)1})
    for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " N " + std::to_string(N));
      Rng rng(31 + N + (uint64_t)dt);
      std::vector<int32_t> tok(N);
      // token 7 at 63 positions; the others drawn from the rest of the vocabulary
      for (size_t n = 0; n < N; n++) {
        int32_t t = (int32_t)rng.below(V - 1);
        tok[n] = n % 500 == 7 && n < 63 * 500 ? 7 : t + (t >= 7);
      }
      std::vector<size_t> count(V, 0);
      for (int32_t t : tok) count[t]++;
      ASSERT_LT(*std::max_element(count.begin(), count.end()), 64u)
          << "a long run: not the CPU's order";
      std::vector<float> dw0 = ts_test::round_to(rng.vec(V * C), dt),
                         dout = ts_test::round_to(rng.vec(N * C), dt);
      std::vector<unsigned char> got =
          EmbeddingBackwardOn(TS_DEVICE_CUDA, dw0, dout, tok, C, V, dt, 0);
      EXPECT_TRUE(got == EmbeddingBackwardOn(TS_DEVICE_CPU, dw0, dout, tok, C, V, dt, 0))
          << "differs from the CPU";
      EXPECT_TRUE(got == EmbeddingBackwardOn(TS_DEVICE_CUDA, dw0, dout, tok, C, V, dt, 0))
          << "run to run";
    }
}

// Long runs (type ids: one token at every position; a frequent word; runs
// of exactly 64 and 63), tokens out of range skipped (TS_K_INDICES_CHECKED):
// bit for bit the host model of the slice sums, which is what the bitonic
// sort gave (the sorted keys are the same).
TEST(CudaPaths, EmbeddingBackwardLongRunsMatchTheSliceSums) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t C = 40, N = 32768;
  for (size_t V : {(size_t)2, (size_t)30522})
    for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " V " + std::to_string(V));
      Rng rng(77 + V + (uint64_t)dt);
      std::vector<int32_t> tok(N);
      for (size_t n = 0; n < N; n++)  // V 2: two long runs; else short ones to begin with
        tok[n] = V == 2 ? n >= 20000 : 5 + rng.below((int32_t)V - 5);
      for (size_t n = 0; n < N && V > 2; n++)  // and runs of 16384, 5461, 64, 63, 65
        tok[n] = n % 2 == 0 ? 0 : n % 6 == 1 ? 1 : tok[n];
      for (size_t i = 0; i < 65 && V > 2; i++) {
        if (i < 64) tok[3 + 18 * i] = 2;
        if (i < 63) tok[5 + 18 * i] = 3;
        tok[9 + 18 * i] = 4;
      }
      tok[12345] = -1, tok[20001] = (int32_t)V;  // skipped
      std::vector<float> dw0 = ts_test::round_to(rng.vec(V * C), dt),
                         dout = ts_test::round_to(rng.vec(N * C), dt);
      std::vector<unsigned char> got =
          EmbeddingBackwardOn(TS_DEVICE_CUDA, dw0, dout, tok, C, V, dt, TS_K_INDICES_CHECKED);
      EXPECT_TRUE(got == ts_parity::HostBytes(SliceSums(dw0, dout, tok, C, V, dt), dt))
          << "differs from the slice sums";
    }
}

// ---- the linear layer's bias epilogue ------------------------------------------------------

// BERT-base's products (N 3072, K 768: the intermediate dense; N 768, K
// 3072: the output dense) on 130 rows, in the order plain (A), with the
// bias (B), plain (C), with the bias (D), with the bias at a 2- or 4-byte
// offset (E: copied to an aligned slot first), so each call finds the
// other kind's plan of its shape kept: A and C the same bits, within one
// rounding of the bias-free product (the plain plan never adds a bias);
// B, D and E the same bits, within one rounding of the product plus the
// bias (ts_test::linear_bias_bound; the epilogue plan never drops it).
TEST(CudaPaths, LinearBiasEpilogueKeepsItsPlanAndRoundsOnce) {
  ASSERT_TRUE(have_gpu()) << "no CUDA device: tests tagged gpu need one";
  const size_t M = 130, shapes[][2] = {{3072, 768}, {768, 3072}};
  for (const auto &s : shapes)
    for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
      const size_t N = s[0], K = s[1], es = ts_dtype_size(dt), bytes = M * N * es;
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + " N " + std::to_string(N));
      Rng rng(46 + N + (uint64_t)dt);
      std::vector<float> x = ts_test::round_to(rng.vec(M * K), dt),
                         w = ts_test::round_to(rng.vec(N * K), dt),
                         bias = ts_test::round_to(rng.vec(N, -2, 2), dt), shifted(N + 1, 0.0f);
      std::copy(bias.begin(), bias.end(), shifted.begin() + 1);
      Backend b(TS_DEVICE_CUDA);
      b.Workspace(ts_k_linear_bias_workspace_bytes(TS_DEVICE_CUDA, M, N, K, dt));
      DevPtr dx = b.Up(x, dt), dw = b.Up(w, dt), db = b.Up(bias, dt), dbs = b.Up(shifted, dt);
      DevPtr out[5];
      for (auto &o : out) o = b.Poisoned(M * N, dt);
      const void *biases[5] = {nullptr, db->p, nullptr, db->p, dbs->as<char>() + es};
      for (int i = 0; i < 5; i++)
        ASSERT_EQ(biases[i] ? ts_k_linear_bias_forward(b.ctx(), out[i]->p, dx->p, dw->p,
                                                       biases[i], M, N, K, dt)
                            : ts_k_linear_forward(b.ctx(), out[i]->p, dx->p, dw->p, M, N, K, dt),
                  TS_OK)
            << i << ": " << ts_last_error();
      std::vector<unsigned char> got[5];
      for (int i = 0; i < 5; i++) got[i] = b.DownBytes(*out[i], bytes);
      EXPECT_TRUE(got[0] == got[2]) << "the plain product changed after an epilogue call";
      EXPECT_TRUE(got[1] == got[3]) << "the epilogue product changed after a plain call";
      EXPECT_TRUE(got[1] == got[4]) << "the misaligned bias changed the bits";
      std::vector<double> ref, tol;
      ts_test::linear_bias_bound(ref, tol, x, w, std::vector<float>(N, 0.0f), M, N, K, dt);
      ts_parity::Expect("without the bias", b.Down(*out[0], M * N, dt), ref, tol);
      ts_test::linear_bias_bound(ref, tol, x, w, bias, M, N, K, dt);
      ts_parity::Expect("with the bias", b.Down(*out[1], M * N, dt), ref, tol);
    }
}

}  // namespace

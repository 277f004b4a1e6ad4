// llama_half_test.cc — every unit's forward and backward in bf16 and fp16
// against the same unit in fp32.
//
// Method: one set of fp32 parameters, inputs x, output gradients dy, tokens
// and targets per unit. The fp32 run takes them as they are; a half run
// takes them cast to the half dtype with ts_k_cast (RNE) and its results
// are cast back to fp32. Each result tensor is compared by the scale-free
// error ||half - fp32|| / ||fp32|| (2-norm over the tensor, in double).
//
// Bounds are multiples of the unit roundoff u = 2^-p of the storage format
// (p significant bits: u = 2^-8 for bf16, 2^-11 for fp16). One RNE rounding
// moves a value by at most u relative, and by ~0.4 u RMS over a tensor of
// random values (the embedding's y, a single rounding, measures 0.41-0.44 u).
// Count as k the roundings a result goes through: the casts of the inputs
// and parameters it reads and every intermediate stored in the half dtype on
// the way (kernels widen, compute in fp32 and round each output once; rstd
// and the loss stay fp32). With fp32 math in between that does not amplify
// errors (inputs keep every activation O(1), see MakeInputs) the result is
// off by at most k u (every rounding at its maximum, all one way) and
// typically by 0.4 sqrt(k) u (independent roundings add in quadrature).
// Where k is small the bound is that worst case, k u; for long chains it is
// 3-5 times the typical value, because k u would then leave an O(1) bug
// only a few times away. A kernel that reads the wrong dtype or a wrong
// tensor, or drops a term, gives an error ~1: 2^5 times the largest bound
// (8 u) in bf16, 2^8 times in fp16 (WrongDtypeReadIsCaught: 168 u, 201 u).
//
// k, the bound, and the errors measured when this test was written
// (bf16 / fp16, in u):
//  embedding  y = wte[tokens]: k = 1, the parameter cast; |err| <= u |ref|
//             per element, so bound 1 u (0.44 / 0.41).
//             dwte: the dy cast, then the scatter: a token at 3 positions
//             adds 2 roundings while the kernel rounds each addition to
//             storage, 1 once it sums in fp32 within the call; k <= 3,
//             bound 3 u, over the whole table (0.46 / 0.45) and on that
//             token's row alone (0.70 / 0.60).
//  block      y: the casts of x and the 9 weights, then xn1, q, k, v, rope q
//             and k, probs, att, o, + x, xn2, gate, up, h, down, + xmid:
//             k ~ 25, typical 2 u (1.34 / 1.38, lower because the residual
//             x carries much of y). dx and each parameter gradient: those
//             saved tensors, the dy cast, d_h, d_gate, d_up, d_xn and its
//             add, d_xmid, d_att, dq, dk, dv, rope, the adds into d_xn, the
//             result: k ~ 40, typical 2.5 u (1.7-2.9 / 1.7-2.6). Bound 8 u.
//  head       logits: the casts of x, the norm weight and the lm_head
//             weight, xn, the logits: k = 5, typical 0.9 u (0.91-0.92 /
//             0.89-0.95), bound 5 u. loss: each row's loss moves by its
//             logits' errors weighted by p - onehot (~0.5 u of a row loss
//             ~ln V), and the sum over 23 rows averages them (0.03-0.04 /
//             0.006-0.03): bound 1 u. Backward: dlogits, then d_xn, the
//             lm_head or tied gradient, the norm-weight gradient and dx on
//             top of the forward's roundings: k ~ 10, typical 1.3 u
//             (0.54-0.97 / 0.54-1.00), bound 6 u.
//
// fp16 range: fp16 is normal in [2^-14 ~ 6.1e-5, 65504]. Inputs and output
// gradients are N(0, 1), matrices N(0, 1/fan_in) and norm weights
// 1 + 0.1 N(0, 1), so every activation and gradient here is at most ~20 in
// magnitude (measured max 18.7, a block's gradient), far below overflow.
// The head's dloss is 1 (the row sum rather than the mean, as a loss scale
// would make it): dlogits = p - onehot with logits within +-3.4 stays above
// ~4e-4 instead of sinking toward fp16's subnormals. What remains below
// 2^-14 is the occasional near-zero element of a random sum (smallest
// measured 4.5e-5); its subnormal rounding (absolute error <= 2^-25) is
// nothing next to the tensor's norm.
#include "models/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "models/llama_config.h"

namespace {

// GQA (4 query heads, 2 kv heads of 8), small enough to run in milliseconds
// and big enough that every tensor has dozens of elements.
const char *kConfig = R"({
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 40,
  "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false })";

const size_t kB = 2, kT = 12;

double UnitRoundoff(ts_dtype dt) { return std::ldexp(1.0, dt == TS_BF16 ? -8 : -11); }

ts_kctx CpuCtx() {
  ts_kctx c{};
  c.device = TS_DEVICE_CPU;
  return c;
}

// n fp32 values cast to dt (RNE): the bytes of a dt tensor.
std::vector<unsigned char> ToDtype(const std::vector<float> &v, ts_dtype dt) {
  std::vector<unsigned char> out(v.size() * ts_dtype_size(dt));
  ts_kctx c = CpuCtx();
  EXPECT_EQ(ts_k_cast(&c, out.data(), dt, v.data(), TS_FP32, v.size()), TS_OK);
  return out;
}

// A dt tensor of n elements widened to fp32.
std::vector<float> ToFloat(const void *p, size_t n, ts_dtype dt) {
  std::vector<float> out(n);
  ts_kctx c = CpuCtx();
  EXPECT_EQ(ts_k_cast(&c, out.data(), TS_FP32, p, dt, n), TS_OK);
  return out;
}

// ||a - b|| / ||b||: the scale-free error of a against the reference b.
double RelErr(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

double RelErr(const std::vector<float> &a, const std::vector<float> &b) {
  EXPECT_EQ(a.size(), b.size());
  return RelErr(a.data(), b.data(), a.size());
}

// The fp32 values every run of one unit starts from.
struct Inputs {
  std::vector<float> params, tied_w;  // unit's flat parameters; (V, C) when tied
  std::vector<float> x, dy;           // (B, T, C)
  std::vector<int32_t> tokens, targets;
  int32_t repeated;                   // the token at three positions
};

// Matrices N(0, 1/fan_in) keep each product O(1); norm weights near 1.
// One token appears three times so the embedding scatter accumulates.
Inputs MakeInputs(const ts_model &m, int u, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  const ts_unit &un = m.units[u];
  size_t C = m.hidden_size, V = m.vocab_size, N = kB * kT;
  Inputs in;
  in.params.resize(un.numel);
  for (int i = 0; i < un.n_tensors; i++) {
    const ts_tensor_spec &t = un.tensors[i];
    float sd = t.ndim == 1 ? 0.1f : 1.0f / std::sqrt((float)t.shape[1]);
    for (size_t j = 0; j < t.numel; j++)
      in.params[t.offset + j] = (t.ndim == 1 ? 1.0f : 0.0f) + sd * n(g);
  }
  if (un.tied_unit >= 0) {
    in.tied_w.resize(V * C);
    for (auto &v : in.tied_w) v = n(g) / std::sqrt((float)C);
  }
  in.x.resize(N * C);
  in.dy.resize(N * C);
  for (auto &v : in.x) v = n(g);
  for (auto &v : in.dy) v = n(g);
  in.tokens.resize(N);
  in.targets.resize(N);
  for (size_t i = 0; i < N; i++) {
    in.tokens[i] = (int32_t)((i * 13) % V);  // distinct for i < V (13 is prime to V = 40)
    in.targets[i] = (int32_t)(g() % V);
  }
  in.repeated = in.tokens[3] = in.tokens[11] = in.tokens[19];  // token 7 three times
  in.targets[5] = TS_IGNORE_INDEX;
  return in;
}

// What one run of a unit produces, widened to fp32.
struct Result {
  std::vector<float> y;       // (B, T, C) output; the head's logits (B, T, V)
  std::vector<float> dx;      // (B, T, C); empty for the embedding
  std::vector<float> grads;   // the unit's flat gradient
  std::vector<float> tied_g;  // (V, C) the tied embedding's gradient, or empty
  double loss_sum = 0;        // head: sum of row losses (nats)
  size_t loss_count = 0;      // head: rows with a target
};

// Forward then backward of unit u in dtype dt, from `in` cast to dt. The
// parameters are stored as param_dt (a deliberate mismatch when it differs).
Result RunUnit(const ts_model &m, int u, const Inputs &in, ts_dtype dt, ts_dtype param_dt) {
  const ts_unit &un = m.units[u];
  size_t C = m.hidden_size, V = m.vocab_size, N = kB * kT, es = ts_dtype_size(dt);
  std::vector<unsigned char> params = ToDtype(in.params, param_dt), x = ToDtype(in.x, dt),
                             dy = ToDtype(in.dy, dt), tied_w = ToDtype(in.tied_w, dt);
  std::vector<unsigned char> grads(un.numel * es, 0), tied_g(in.tied_w.size() * es, 0);
  std::vector<unsigned char> y(N * C * es), dx(N * C * es);
  std::vector<float> saved_mem(ts_unit_saved_bytes(&m, u, kB, kT, dt, TS_DEVICE_CPU) / 4 + 1);
  size_t ws_bytes = ts_unit_workspace_bytes(&m, u, kB, kT, dt, TS_DEVICE_CPU);
  std::vector<unsigned char> ws(ws_bytes + 64);
  ts_kctx ctx = CpuCtx();
  ctx.workspace = (void *)(((uintptr_t)ws.data() + 63) & ~(uintptr_t)63);
  ctx.workspace_bytes = ws_bytes;

  ts_unit_args a{};
  a.B = kB;
  a.T = kT;
  a.dt = dt;
  a.tokens = in.tokens.data();
  a.targets = in.targets.data();
  a.x = x.data();
  a.y = y.data();
  a.saved = saved_mem.data();
  double loss[2] = {0, 0};
  a.loss = loss;
  if (!in.tied_w.empty()) {
    a.tied_weight = tied_w.data();
    a.tied_grad = tied_g.data();
  }
  Result r;
  EXPECT_EQ(ts_unit_forward(&m, u, &ctx, params.data(), &a), TS_OK) << ts_last_error();
  r.loss_sum = loss[0];
  r.loss_count = (size_t)loss[1];
  if (un.role == TS_UNIT_HEAD)  // the logits, before backward overwrites them
    r.y = ToFloat(ts_unit_logits(&m, u, a.saved, kB, kT, dt), N * V, dt);
  a.dy = dy.data();
  a.dx = un.role == TS_UNIT_EMBEDDING ? nullptr : dx.data();
  a.dloss = 1.0f;  // see the fp16 range note above
  EXPECT_EQ(ts_unit_backward(&m, u, &ctx, params.data(), grads.data(), &a), TS_OK)
      << ts_last_error();
  if (un.role != TS_UNIT_HEAD) r.y = ToFloat(y.data(), N * C, dt);
  if (un.role != TS_UNIT_EMBEDDING) r.dx = ToFloat(dx.data(), N * C, dt);
  r.grads = ToFloat(grads.data(), un.numel, dt);
  r.tied_g = ToFloat(tied_g.data(), in.tied_w.size(), dt);
  return r;
}

// Bounds in units of u (see the file comment for the rounding counts).
struct Bounds {
  double y, loss, dx, grad;  // y: the head's logits
};

const Bounds kEmbedding = {1, 0, 0, 3};
const Bounds kBlock = {8, 0, 8, 8};
const Bounds kHead = {5, 1, 6, 6};

// Runs unit u of cfg in fp32, bf16 and fp16 and checks every result of the
// half runs against fp32 within the bounds (in units of u).
void CheckUnit(const ts_llama_config &cfg, int u, const Bounds &b, unsigned seed) {
  ts_model m{};
  ASSERT_EQ(ts_llama_model_init(&m, &cfg), TS_OK) << ts_last_error();
  const ts_unit &un = m.units[u];
  Inputs in = MakeInputs(m, u, seed);
  Result ref = RunUnit(m, u, in, TS_FP32, TS_FP32);
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {
    double uu = UnitRoundoff(dt);
    Result h = RunUnit(m, u, in, dt, dt);
    std::string tag = std::string(ts_dtype_name(dt)) + " unit " + std::to_string(u) + " ";
    auto check = [&](const std::string &what, double err, double bound) {
      std::printf("%-60s err %.3g u (bound %g u)\n", (tag + what).c_str(), err / uu, bound);
      EXPECT_LE(err, bound * uu) << tag << what << ": " << err / uu << " u";
    };
    check(un.role == TS_UNIT_HEAD ? "logits" : "y", RelErr(h.y, ref.y), b.y);
    if (un.role == TS_UNIT_HEAD) {
      ASSERT_EQ(h.loss_count, ref.loss_count);
      check("loss", std::fabs(h.loss_sum - ref.loss_sum) / ref.loss_sum, b.loss);
    }
    if (!ref.dx.empty()) check("dx", RelErr(h.dx, ref.dx), b.dx);
    for (int i = 0; i < un.n_tensors; i++) {
      const ts_tensor_spec &t = un.tensors[i];
      check(std::string("grad ") + t.name,
            RelErr(h.grads.data() + t.offset, ref.grads.data() + t.offset, t.numel), b.grad);
    }
    if (!ref.tied_g.empty()) check("grad tied embedding", RelErr(h.tied_g, ref.tied_g), b.grad);
    if (un.role == TS_UNIT_EMBEDDING) {
      size_t C = m.hidden_size, o = (size_t)in.repeated * C;
      check("grad row of the repeated token", RelErr(h.grads.data() + o, ref.grads.data() + o, C),
            b.grad);
    }
  }
  ts_model_free(&m);
}

ts_llama_config Config(bool tied) {
  ts_llama_config c;
  EXPECT_EQ(ts_llama_config_parse(kConfig, "half_test.json", &c), TS_OK) << ts_last_error();
  c.tie_word_embeddings = tied;
  return c;
}

TEST(LlamaHalf, EmbeddingMatchesFp32WithinRounding) { CheckUnit(Config(false), 0, kEmbedding, 1); }
TEST(LlamaHalf, BlockMatchesFp32WithinRounding) { CheckUnit(Config(false), 1, kBlock, 2); }
TEST(LlamaHalf, HeadMatchesFp32WithinRounding) { CheckUnit(Config(false), 2, kHead, 3); }
TEST(LlamaHalf, TiedHeadMatchesFp32WithinRounding) { CheckUnit(Config(true), 2, kHead, 4); }

// The bounds are tight enough to see an O(1) bug: the block run as bf16 on
// parameters stored as fp16 (every weight read with the wrong format) must
// be far outside them.
TEST(LlamaHalf, WrongDtypeReadIsCaught) {
  ts_llama_config cfg = Config(false);
  ts_model m{};
  ASSERT_EQ(ts_llama_model_init(&m, &cfg), TS_OK) << ts_last_error();
  Inputs in = MakeInputs(m, 1, 2);
  Result ref = RunUnit(m, 1, in, TS_FP32, TS_FP32);
  Result bad = RunUnit(m, 1, in, TS_BF16, TS_FP16);
  double u = UnitRoundoff(TS_BF16), ey = RelErr(bad.y, ref.y), edx = RelErr(bad.dx, ref.dx);
  std::printf("wrong dtype read: y err %.3g u, dx err %.3g u\n", ey / u, edx / u);
  EXPECT_GT(ey, 4 * kBlock.y * u);
  EXPECT_GT(edx, 4 * kBlock.dx * u);
  ts_model_free(&m);
}

}  // namespace

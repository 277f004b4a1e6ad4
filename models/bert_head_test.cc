// bert_head_test.cc — BERT's masked-LM head on the masked rows only
// (models/bert.c, "the head on the masked rows only"; NVIDIA's BERT
// --dense_seq_output) against the same head on every row, on one device.
// Built twice: as bert_head_test on the CPU (every CI run) and, with
// -DTS_TEST_DEVICE=TS_DEVICE_CUDA, as bert_head_gpu_test on one GPU (tag
// gpu: built everywhere, run on a GPU machine by the bundle of
// tools/gpu_bundle.sh; without a GPU its tests fail).
//
// The head's training call (fused loss gradient) given its targets in host
// memory too (ts_unit_args.host_targets) runs the R rows that have a
// target; given none it runs all N. Both must give the same loss, the same
// parameter gradients and the same input gradient, exactly zero on the
// rows without a target; and the first must leave the logits' last N - R
// rows alone (the proof that it ran on R rows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "models/model.h"

namespace {

#ifndef TS_TEST_DEVICE
#define TS_TEST_DEVICE TS_DEVICE_CPU
#endif
const ts_device kDevice = TS_TEST_DEVICE;

// An odd vocabulary (V = 301) so that no kernel may assume a round one;
// HS 16; one layer (only the head runs).
std::string Config(bool tied) {
  return std::string(R"({"model_type": "bert", "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 301,
  "max_position_embeddings": 2048, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
  "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
  "pad_token_id": 0, "sep_token_id": 3, "tie_word_embeddings": )") +
         (tied ? "true" : "false") + "}";
}
// A batch's shape: B x T = N rows.
struct Shape {
  size_t B, T;
  size_t N() const { return B * T; }
};
// Odd, N = 87 rows; and N = 4200, past the 4096 int32 that the head moves to
// the device at a time (models/bert.c, ROWS_PIECE), so its uploads take
// several pieces.
const Shape kSmall = {3, 29}, kLarge = {3, 1400};

// N targets: an id where a row is masked (probability p), else -100.
std::vector<int32_t> Targets(size_t N, double p, unsigned seed, size_t V) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> t(N);
  for (auto &v : t) v = u(g) < p ? (int32_t)(g() % V) : -100;
  return t;
}

size_t Masked(const std::vector<int32_t> &t) {
  size_t r = 0;
  for (int32_t v : t) r += v != -100;
  return r;
}

// What one forward and backward of the head gave, widened to fp32.
struct Result {
  double loss[2] = {0, 0};            // (sum of row losses, rows with a target)
  std::vector<float> dx, grads, tied;  // (N, C); the unit's flat gradient; the tied one's
  std::vector<unsigned char> logits;   // the saved logits' bytes after forward, (N, V) of dt
};

// The last unit of a one-layer BERT on kDevice for batches of shape sh:
// random parameters, input and tied word embeddings in dt, its saved
// bytes, workspace and outputs.
class Head {
 public:
  Head(bool tied, ts_dtype dt, Shape sh)
      : dt_(dt), es_(ts_dtype_size(dt)), B_(sh.B), T_(sh.T), N_(sh.N()) {
    EXPECT_EQ(ts_model_parse(Config(tied).c_str(), "head.json", &model_), TS_OK)
        << ts_last_error();
    u_ = model_.n_units - 1;
    EXPECT_EQ(ts_k_context_init(&ctx_, kDevice, 0), TS_OK) << ts_last_error();
    const ts_unit &un = model_.units[u_];
    C_ = model_.hidden_size;
    V_ = model_.vocab_size;
    std::mt19937 g(5);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> p(un.numel), x(N_ * C_), w(tied ? V_ * C_ : 0);
    for (int i = 0; i < un.n_tensors; i++) {
      const ts_tensor_spec &t = un.tensors[i];
      for (size_t j = 0; j < t.numel; j++)
        p[t.offset + j] = t.ndim == 1 ? 1.0f + 0.2f * n(g) : 0.3f * n(g);
    }
    for (auto &v : x) v = n(g);
    for (auto &v : w) v = 0.3f * n(g);
    params_ = Upload(p);
    x_ = Upload(x);
    tied_w_ = tied ? Upload(w) : nullptr;
    saved_bytes_ = ts_unit_saved_bytes(&model_, u_, B_, T_, dt, kDevice);
    ctx_.workspace_bytes = ts_unit_workspace_bytes(&model_, u_, B_, T_, dt, kDevice);
    saved_ = Alloc(saved_bytes_);
    ctx_.workspace = Alloc(ctx_.workspace_bytes);
    grads_ = Alloc(un.numel * es_);
    tied_g_ = tied ? Alloc(V_ * C_ * es_) : nullptr;
    dx_ = Alloc(N_ * C_ * es_);
    targets_ = Alloc(N_ * sizeof(int32_t));
    loss_ = Alloc(2 * sizeof(double));
  }
  ~Head() {
    for (void *p : owned_) ts_k_free(kDevice, p);
    ts_k_context_destroy(&ctx_);
    ts_model_free(&model_);
  }
  size_t C() const { return C_; }
  size_t V() const { return V_; }

  // Forward then backward of `targets` (training: fused loss gradient,
  // dloss 1 / rows with a target), the targets also in host memory when
  // `host`; the saved bytes start as 0xFF (NaN in every dtype).
  Result Run(const std::vector<int32_t> &targets, bool host, int fused = 1) {
    Result r;
    size_t R = Masked(targets);
    Put(targets_, targets.data(), N_ * sizeof(int32_t));
    std::vector<unsigned char> fill(saved_bytes_, 0xFF);
    Put(saved_, fill.data(), fill.size());
    EXPECT_EQ(ts_k_zero(&ctx_, grads_, model_.units[u_].numel * es_), TS_OK);
    if (tied_g_) {
      EXPECT_EQ(ts_k_zero(&ctx_, tied_g_, V_ * C_ * es_), TS_OK);
    }
    ts_unit_args a{};
    a.B = B_;
    a.T = T_;
    a.dt = dt_;
    a.targets = (const int32_t *)targets_;
    a.host_targets = host ? targets.data() : nullptr;
    a.x = x_;
    a.saved = saved_;
    a.tied_weight = tied_w_;
    a.tied_grad = tied_g_;
    a.dx = dx_;
    a.dloss = R ? 1.0f / (float)R : 0.0f;
    a.fused_loss_grad = fused;
    a.loss = (double *)loss_;
    EXPECT_EQ(ts_unit_forward(&model_, u_, &ctx_, params_, &a), TS_OK) << ts_last_error();
    EXPECT_EQ(ts_k_to_host(&ctx_, r.loss, loss_, sizeof r.loss), TS_OK) << ts_last_error();
    r.logits.resize(N_ * V_ * es_);
    Get(r.logits.data(), ts_unit_logits(&model_, u_, saved_, B_, T_, dt_), r.logits.size());
    if (!fused) return r;
    EXPECT_EQ(ts_unit_backward(&model_, u_, &ctx_, params_, grads_, &a), TS_OK)
        << ts_last_error();
    r.dx = Download(dx_, N_ * C_);
    r.grads = Download(grads_, model_.units[u_].numel);
    if (tied_g_) r.tied = Download(tied_g_, V_ * C_);
    return r;
  }

 private:
  void *Alloc(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(ts_k_alloc(kDevice, bytes, &p), TS_OK) << ts_last_error();
    owned_.push_back(p);
    return p;
  }
  void Put(void *d, const void *h, size_t bytes) {
    EXPECT_EQ(ts_k_from_host(&ctx_, d, h, bytes), TS_OK) << ts_last_error();
  }
  void Get(void *h, const void *d, size_t bytes) {
    EXPECT_EQ(ts_k_to_host(&ctx_, h, d, bytes), TS_OK) << ts_last_error();
  }
  // fp32 host values -> a new device buffer of dt (rounded on the host).
  void *Upload(const std::vector<float> &h) {
    ts_kctx cpu{};
    cpu.device = TS_DEVICE_CPU;
    std::vector<unsigned char> b(h.size() * es_);
    EXPECT_EQ(ts_k_cast(&cpu, b.data(), dt_, h.data(), TS_FP32, h.size()), TS_OK);
    void *d = Alloc(b.size());
    Put(d, b.data(), b.size());
    return d;
  }
  std::vector<float> Download(const void *d, size_t n) {
    ts_kctx cpu{};
    cpu.device = TS_DEVICE_CPU;
    std::vector<unsigned char> b(n * es_);
    Get(b.data(), d, b.size());
    std::vector<float> out(n);
    EXPECT_EQ(ts_k_cast(&cpu, out.data(), TS_FP32, b.data(), dt_, n), TS_OK);
    return out;
  }

  ts_model model_{};
  int u_ = 0;
  ts_dtype dt_;
  size_t es_, B_, T_, N_, C_ = 0, V_ = 0, saved_bytes_ = 0;
  ts_kctx ctx_{};
  std::vector<void *> owned_;
  void *params_ = nullptr, *x_ = nullptr, *tied_w_ = nullptr, *saved_ = nullptr;
  void *grads_ = nullptr, *tied_g_ = nullptr, *dx_ = nullptr, *targets_ = nullptr;
  void *loss_ = nullptr;
};

// max |a - b| over max |b|: scale-free, and an O(1) wrong term cannot pass.
double RelMaxErr(const std::vector<float> &a, const std::vector<float> &b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) {
    err = std::fmax(err, std::fabs((double)a[i] - b[i]));
    scale = std::fmax(scale, std::fabs((double)b[i]));
  }
  return err / (scale > 0 ? scale : 1);
}

bool SameBits(const Result &a, const Result &b) {
  return a.loss[0] == b.loss[0] && a.loss[1] == b.loss[1] && a.dx == b.dx && a.grads == b.grads &&
         a.tied == b.tied && a.logits == b.logits;
}

// Whether bytes [from, to) of the logits all kept the 0xFF fill.
bool Untouched(const std::vector<unsigned char> &bytes, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (bytes[i] != 0xFF) return false;
  return true;
}

// Two batches: 87 rows with about 15% masked, as a masked LM's; 4200 rows
// with all but about 8 masked, so that every upload (targets, indices,
// places) takes more than one piece. The two paths run the same per-row
// arithmetic; they differ only in how many rows the matrix products and
// the row sums (bias, LayerNorm weight, decoder gradients) take, R or N,
// the other N - R contributing exact zeros. So the products may block
// their sums differently (BLAS and cuBLASLt choose kernels by shape) and
// the row sums split their fixed row blocks elsewhere: a reordering of
// fp32 sums, ~1e-7 relative per rounding. Measured on the CPU: fp32
// tensors up to 5e-7 of their largest entry, the loss up to 2e-8
// relative; bf16 tensors up to 2e-5 (0.006u), the loss equal. Bounds:
// fp32 1e-4 of each tensor's largest entry (200 times that), the loss
// 1e-5. bf16 (unit roundoff u = 2^-8): on a GPU a reordered fp32 sum may
// round an element of a stored activation or gradient to the
// neighbouring bf16 value (2u relative), which the ops downstream carry:
// 8u of each tensor's largest entry, the loss 2u. Where the bounds cannot see one row among
// thousands, exact checks do: every row without a target has an input
// gradient of exactly zero on both paths, every row with one a nonzero
// one; a misplaced row moves dx by O(1) of its scale.
TEST(BertHead, MaskedRowsOnlyAgreeWithEveryRow) {
  ASSERT_GT(ts_k_device_count(kDevice), 0)
      << "this test needs a " << ts_device_name(kDevice) << " device";
  const struct {
    Shape sh;
    double p;
  } batches[2] = {{kSmall, 0.15}, {kLarge, 0.998}};
  for (const auto &bt : batches)
    for (ts_dtype dt : {TS_FP32, TS_BF16})
      for (bool tied : {true, false}) {
        size_t N = bt.sh.N();
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + (tied ? " tied, " : " untied, ") +
                     std::to_string(N) + " rows");
        Head h(tied, dt, bt.sh);
        std::vector<int32_t> targets = Targets(N, bt.p, 11, h.V());
        size_t R = Masked(targets), C = h.C(), V = h.V(), es = ts_dtype_size(dt);
        ASSERT_GT(R, 0u);
        ASSERT_LT(R, N);
        if (N > 4096) ASSERT_GT(R, 4096u);  // each upload in more than one piece
        Result rows = h.Run(targets, true), all = h.Run(targets, false);
        // the first ran on R rows: the logits' last N - R rows kept the
        // fill; the second wrote every row (zeros where there is no target)
        EXPECT_TRUE(Untouched(rows.logits, R * V * es, N * V * es));
        EXPECT_FALSE(Untouched(all.logits, R * V * es, N * V * es));
        EXPECT_EQ(rows.loss[1], (double)R);
        EXPECT_EQ(all.loss[1], (double)R);
        double loss_tol = dt == TS_FP32 ? 1e-5 : 2.0 / 256;
        EXPECT_NEAR(rows.loss[0], all.loss[0], loss_tol * std::fabs(all.loss[0]));
        double tol = dt == TS_FP32 ? 1e-4 : 8.0 / 256;
        EXPECT_LT(RelMaxErr(rows.dx, all.dx), tol) << "dx";
        EXPECT_LT(RelMaxErr(rows.grads, all.grads), tol) << "the head's gradient";
        if (tied) {
          EXPECT_LT(RelMaxErr(rows.tied, all.tied), tol) << "the tied gradient";
        }
        EXPECT_GT(RelMaxErr(rows.grads, std::vector<float>(rows.grads.size())), 0.0)
            << "a gradient of zeros";
        // the input gradient: exactly zero on the rows without a target
        // (both paths), nonzero on every row with one
        size_t zero_rows = 0, live_rows = 0;
        for (size_t n = 0; n < N; n++) {
          bool masked = targets[n] != -100, zero = true;
          for (size_t c = 0; c < C; c++) {
            zero = zero && rows.dx[n * C + c] == 0.0f;
            if (!masked) ASSERT_EQ(all.dx[n * C + c], 0.0f) << "row " << n;
          }
          zero_rows += !masked && zero;
          live_rows += masked && !zero;
        }
        EXPECT_EQ(zero_rows, N - R);
        EXPECT_EQ(live_rows, R);
      }
}

// Nothing masked, everything masked, evaluation (no fused loss gradient):
// the head runs every row whether host targets are given or not, the same
// calls, so the same bits.
TEST(BertHead, EveryRowRunsWhenNoneOrAllAreMaskedOrInEvaluation) {
  ASSERT_GT(ts_k_device_count(kDevice), 0)
      << "this test needs a " << ts_device_name(kDevice) << " device";
  size_t N = kSmall.N();
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    SCOPED_TRACE(ts_dtype_name(dt));
    Head h(true, dt, kSmall);
    size_t V = h.V(), es = ts_dtype_size(dt);
    std::vector<int32_t> none = Targets(N, 0.0, 3, V), every = Targets(N, 1.1, 4, V),
                         some = Targets(N, 0.15, 5, V);
    ASSERT_EQ(Masked(none), 0u);
    ASSERT_EQ(Masked(every), N);
    Result a = h.Run(none, true), b = h.Run(none, false);
    EXPECT_TRUE(SameBits(a, b)) << "nothing masked";
    EXPECT_EQ(a.loss[1], 0.0);
    for (float v : a.dx) ASSERT_EQ(v, 0.0f);
    a = h.Run(every, true);
    b = h.Run(every, false);
    EXPECT_TRUE(SameBits(a, b)) << "everything masked";
    EXPECT_EQ(a.loss[1], (double)N);
    // evaluation: every row's logits written (the last rows too), as
    // without host targets
    a = h.Run(some, true, 0);
    b = h.Run(some, false, 0);
    EXPECT_TRUE(SameBits(a, b)) << "evaluation";
    EXPECT_FALSE(Untouched(a.logits, (N - 1) * V * es, N * V * es));
  }
}

}  // namespace

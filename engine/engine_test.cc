// engine_test.cc — the one-rank training step: loss at initialisation,
// overfitting one batch, gradient accumulation, the ledger, the schedule.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_testing.h"
#include "engine/observer.h"
#include "engine/step_testing.h"
#include "engine/trainer.h"
#include "models/llama.h"

namespace {

ts_llama_config SmallConfig(size_t V) {
  ts_llama_config c{};
  snprintf(c.name, sizeof c.name, "test");
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = V;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  return c;
}

struct Batch {
  std::vector<int32_t> in, tgt;
  Batch(size_t B, size_t T, size_t V, unsigned seed) : in(B * T), tgt(B * T) {
    std::mt19937 g(seed);
    for (size_t i = 0; i < B * T; i++) {
      in[i] = (int32_t)(g() % V);
      tgt[i] = (int32_t)(g() % V);
    }
  }
};

struct EngineFixture {
  ts_model model{};
  ts_engine *e = nullptr;
  EngineFixture(const ts_llama_config &c, const ts_engine_opts &o) {
    EXPECT_EQ(ts_llama_model_init(&model, &c), TS_OK);
    EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_OK) << ts_last_error();
  }
  ~EngineFixture() {
    ts_engine_free(e);
    ts_model_free(&model);
  }
};

ts_engine_opts Opts(size_t B, size_t T) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = B;
  o.seq = T;
  return o;
}

TEST(Engine, InitialLossIsNearLogVocab) {
  const size_t V = 512;
  EngineFixture f(SmallConfig(V), Opts(4, 16));
  Batch b(4, 16, V, 1);
  double sum;
  size_t count;
  ASSERT_EQ(ts_engine_eval(f.e, b.in.data(), b.tgt.data(), &sum, &count), TS_OK);
  EXPECT_EQ(count, 64u);
  // Weights ~ N(0, 0.02^2) give near-uniform predictions: the issue asks for
  // |loss - ln V| < 0.1.
  EXPECT_NEAR(sum / count, std::log((double)V), 0.1);
}

TEST(Engine, OverfitsOneBatch) {
  const size_t V = 64;
  ts_engine_opts o = Opts(2, 16);
  o.weight_decay = 0;
  EngineFixture f(SmallConfig(V), o);
  Batch b(2, 16, V, 2);
  double loss = 0;
  ts_step_stats st{};
  for (int s = 0; s < 150; s++) {
    ASSERT_EQ(ts_testing::Step(f.e, b.in.data(), b.tgt.data(), 1e-2f, &st), TS_OK);
    loss = st.loss;  // the step's batch before its update
  }
  EXPECT_EQ(st.step, 150);
  EXPECT_LT(loss, 0.1) << "the model failed to memorise 32 random tokens";
}

TEST(Engine, GradientAccumulationMatchesOneBigBatch) {
  // Two micro-batches of 2 accumulate the same gradient as one batch of 4
  // split the same way, when every row has a target: the mean of the two
  // micro-batch means equals the mean over all rows.
  const size_t V = 64, T = 8;
  ts_engine_opts oa = Opts(2, T);
  oa.grad_accum = 2;
  ts_engine_opts ob = Opts(4, T);
  EngineFixture fa(SmallConfig(V), oa), fb(SmallConfig(V), ob);
  Batch b(4, T, V, 3);
  const char *name = "model.layers.1.mlp.down_proj.weight";
  std::vector<float> ga(32 * 64), gb(32 * 64);
  ts_testing::MicroBatches two;
  two.Add(b.in.data(), b.tgt.data());
  two.Add(b.in.data() + 2 * T, b.tgt.data() + 2 * T);
  ts_step_stats st;
  ts_status inner = TS_OK;
  ASSERT_EQ(ts_testing::Step(fa.e, two, 1e-3f, &st,
                             [&](ts_engine *e) {
                               ASSERT_EQ(ts_engine_get_grad(e, name, ga.data(), ga.size()), TS_OK);
                               // a step from inside a step is refused
                               inner = ts_testing::Step(e, b.in.data(), b.tgt.data(), 1e-3f, &st);
                             }),
            TS_OK);
  EXPECT_EQ(inner, TS_ERR_INVALID_USAGE);
  ASSERT_EQ(ts_testing::Step(fb.e, b.in.data(), b.tgt.data(), 1e-3f, &st,
                             [&](ts_engine *e) {
                               ASSERT_EQ(ts_engine_get_grad(e, name, gb.data(), gb.size()), TS_OK);
                             }),
            TS_OK);
  double num = 0, den = 0;
  for (size_t i = 0; i < ga.size(); i++) {
    num += (ga[i] - gb[i]) * (double)(ga[i] - gb[i]);
    den += (double)gb[i] * gb[i];
  }
  // Same math, different summation order (two GEMMs of M=16 vs one of M=32):
  // fp32 rounding differs at ~1e-7 relative per element.
  EXPECT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

// Reads model.norm.weight's gradient as micro-batch 0's BACKWARD ends.
struct GradAfterFirstBackward {
  std::vector<float> g = std::vector<float>(32);
  ts_status read = TS_ERR_INTERNAL;
  static ts_status Action(void *user, ts_engine *e, const ts_action *a, int end, ts_status) {
    auto *self = static_cast<GradAfterFirstBackward *>(user);
    if (end && a->kind == TS_ACT_BACKWARD && a->mb == 0)
      self->read = ts_engine_get_grad(e, "model.norm.weight", self->g.data(), self->g.size());
    return TS_OK;
  }
};

TEST(Engine, AFailedMicroBatchDiscardsTheStep) {
  const size_t V = 64, T = 8;
  ts_engine_opts o = Opts(2, T);
  o.grad_accum = 2;
  EngineFixture f(SmallConfig(V), o);
  Batch good(2, T, V, 4), bad(2, T, V, 5);
  bad.tgt[5] = (int32_t)V;  // out of range: refused at the batch's load
  GradAfterFirstBackward look;
  ts_step_observer obs{};
  obs.action = GradAfterFirstBackward::Action;
  obs.user = &look;
  ASSERT_EQ(ts_engine_add_observer(f.e, &obs), TS_OK);
  ts_testing::MicroBatches failing;
  failing.Add(good.in.data(), good.tgt.data());
  failing.Add(bad.in.data(), bad.tgt.data());
  ts_step_stats st;
  EXPECT_EQ(ts_testing::Step(f.e, failing, 1e-3f, &st), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("64"), std::string::npos) << ts_last_error();
  ts_engine_remove_observer(f.e, &obs);
  ASSERT_EQ(look.read, TS_OK);
  EXPECT_NE(look.g, std::vector<float>(32, 0.f)) << "micro-batch 0's backward left a gradient";
  std::vector<float> g(32);
  ASSERT_EQ(ts_engine_get_grad(f.e, "model.norm.weight", g.data(), g.size()), TS_OK);
  EXPECT_EQ(g, std::vector<float>(32, 0.f)) << "the failed step's gradient was discarded";
  // the next step starts over and is a fresh engine's step
  ts_testing::MicroBatches both;
  both.Add(good.in.data(), good.tgt.data());
  both.Add(good.in.data(), good.tgt.data());
  EngineFixture fresh(SmallConfig(V), o);
  ts_step_stats sf;
  ASSERT_EQ(ts_testing::Step(f.e, both, 1e-3f, &st), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_testing::Step(fresh.e, both, 1e-3f, &sf), TS_OK) << ts_last_error();
  EXPECT_EQ(st.loss, sf.loss);
  EXPECT_EQ(st.grad_norm, sf.grad_norm);
}

// A batch source failing at micro-batch `fail` (-1: never), else copying
// the same batch.
struct Source {
  const Batch *batch;
  int fail;
};
ts_status Fill(void *user, int mb, int32_t *in, int32_t *tgt) {
  const Source *s = static_cast<const Source *>(user);
  if (mb == s->fail) return ts_set_error(TS_ERR_IO, "source: micro-batch %d unreadable", mb);
  std::copy(s->batch->in.begin(), s->batch->in.end(), in);
  std::copy(s->batch->tgt.begin(), s->batch->tgt.end(), tgt);
  return TS_OK;
}

TEST(Engine, AFailedSourceDiscardsTheStep) {
  const size_t V = 64, T = 8;
  ts_engine_opts o = Opts(2, T);
  o.grad_accum = 3;
  EngineFixture a(SmallConfig(V), o), b(SmallConfig(V), o);
  Batch batch(2, T, V, 6);
  ts_step_stats sa, sb;
  Source never{&batch, -1};
  ASSERT_EQ(ts_engine_step(a.e, Fill, &never, 1e-3f, &sa), TS_OK) << ts_last_error();
  Source fails{&batch, 1};
  EXPECT_EQ(ts_engine_step(b.e, Fill, &fails, 1e-3f, &sb), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("micro-batch 1"), std::string::npos);
  // the failed step left nothing behind: the next whole step is a's step
  Source good{&batch, -1};
  ASSERT_EQ(ts_engine_step(b.e, Fill, &good, 1e-3f, &sb), TS_OK) << ts_last_error();
  EXPECT_EQ(sa.loss, sb.loss);
  EXPECT_EQ(sa.grad_norm, sb.grad_norm);
  std::vector<float> pa(32), pb(32);
  ASSERT_EQ(ts_engine_get_tensor(a.e, "model.norm.weight", pa.data(), pa.size()), TS_OK);
  ASSERT_EQ(ts_engine_get_tensor(b.e, "model.norm.weight", pb.data(), pb.size()), TS_OK);
  EXPECT_EQ(pa, pb);
}

// fp32 and bf16 have no loss scale, but a non-finite gradient is still
// never applied: the step is skipped, the tensor named, every parameter
// (and the step count) as before; the next clean step trains again.
TEST(Engine, ANonFiniteGradientInFp32OrBf16IsSkippedAndNamed) {
  const size_t V = 64, T = 8;
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    SCOPED_TRACE(ts_dtype_name(dt));
    ts_engine_opts o = Opts(2, T);
    o.dtype = dt;
    EngineFixture f(SmallConfig(V), o);
    Batch batch(2, T, V, 9);
    Source good{&batch, -1};
    ts_engine_inject inj = {2, 1, 3, NAN};  // step 2, the first block's 4th tensor
    ts_engine_inject_nonfinite(f.e, &inj);
    ts_step_stats st;
    ASSERT_EQ(ts_engine_step(f.e, Fill, &good, 1e-2f, &st), TS_OK) << ts_last_error();
    EXPECT_EQ(st.skipped, 0);
    std::vector<float> before(32 * 32), after(32 * 32);
    const char *q = "model.layers.0.self_attn.q_proj.weight";
    ASSERT_EQ(ts_engine_get_tensor(f.e, q, before.data(), before.size()), TS_OK);
    ASSERT_EQ(ts_engine_step(f.e, Fill, &good, 1e-2f, &st), TS_OK) << ts_last_error();
    EXPECT_EQ(st.skipped, 1);
    EXPECT_EQ(st.step, 1) << "a skipped step is not an update";
    EXPECT_EQ(st.overflow_unit, 1);
    EXPECT_STREQ(st.overflow_tensor, f.model.units[1].tensors[3].name);
    EXPECT_FALSE(std::isfinite(st.grad_norm));
    ASSERT_EQ(ts_engine_get_tensor(f.e, q, after.data(), after.size()), TS_OK);
    EXPECT_EQ(before, after);
    ASSERT_EQ(ts_engine_step(f.e, Fill, &good, 1e-2f, &st), TS_OK) << ts_last_error();
    EXPECT_EQ(st.skipped, 0);
    EXPECT_EQ(st.step, 2);
    ASSERT_EQ(ts_engine_get_tensor(f.e, q, after.data(), after.size()), TS_OK);
    EXPECT_NE(before, after);
    for (float x : after) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(Engine, LedgerChargesModelStatesExactly) {
  const size_t V = 100;
  ts_llama_config c = SmallConfig(V);
  EngineFixture f(c, Opts(2, 8));
  const ts_mem_account *l = ts_engine_memory(f.e);
  size_t padded = 0;
  for (int u = 0; u < f.model.n_units; u++) {
    const ts_flat_layout *lay = ts_engine_layout(f.e, u);
    EXPECT_EQ(lay->padded % 16, 0u);
    EXPECT_LT(lay->padded - lay->total, 16u);
    EXPECT_EQ(lay->total, f.model.units[u].numel);
    padded += lay->padded;
  }
  // fp32, one rank: params 4Ψ, grads 4Ψ, Adam 8Ψ, no master copy (Ψ padded).
  EXPECT_EQ(l->current[TS_MEM_PARAMS], 4 * padded);
  EXPECT_EQ(l->current[TS_MEM_GRADS], 4 * padded);
  EXPECT_EQ(l->current[TS_MEM_OPTIM], 8 * padded);
  EXPECT_EQ(l->current[TS_MEM_MASTER], 0u);
  size_t saved = 0;
  for (int u = 0; u < f.model.n_units; u++)
    saved += ts_unit_saved_bytes(&f.model, u, 2, 8, TS_FP32, TS_DEVICE_CPU);
  // unit inputs (L+1) x (B,T,C), tokens and targets, two gradient buffers
  size_t BT = 16, C = 32;
  EXPECT_EQ(l->current[TS_MEM_ACTIVATIONS],
            saved + (c.num_hidden_layers + 1) * BT * C * 4 + 2 * BT * 4 + 2 * BT * C * 4);
  EXPECT_GT(l->current[TS_MEM_WORKSPACE], 0u);
  EXPECT_EQ(l->peak_total, l->current_total);
}

TEST(Engine, TensorsRoundTripByHuggingFaceName) {
  EngineFixture f(SmallConfig(64), Opts(1, 4));
  std::vector<float> w(32), r(32);
  for (size_t i = 0; i < w.size(); i++) w[i] = 0.5f + (float)i;
  ASSERT_EQ(ts_engine_set_tensor(f.e, "model.norm.weight", w.data(), w.size()), TS_OK);
  ASSERT_EQ(ts_engine_get_tensor(f.e, "model.norm.weight", r.data(), r.size()), TS_OK);
  EXPECT_EQ(w, r);
  EXPECT_EQ(ts_engine_set_tensor(f.e, "model.norm.weight", w.data(), 31), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_engine_set_tensor(f.e, "model.nope", w.data(), 32), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("model.nope"), std::string::npos);
}

TEST(Engine, RejectsBadOptions) {
  ts_model model{};
  ts_llama_config c = SmallConfig(64);
  ASSERT_EQ(ts_llama_model_init(&model, &c), TS_OK);
  ts_engine *e = nullptr;
  ts_engine_opts o = Opts(1, 33);  // max_position_embeddings is 32
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`seq` 33"), std::string::npos);
  EXPECT_EQ(e, nullptr);
  o = Opts(0, 8);
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
  o = Opts(1, 8);
  o.zero_stage = 4;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(), "`zero_stage` 4: expected a ZeRO stage 0, 1, 2 or 3");
  o.zero_stage = 0;
  o.device = (ts_device)9;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(), "device 9: expected cpu or cuda");
  // On a machine without a GPU, any GPU engine is refused at its context.
  o.device = TS_DEVICE_CUDA;
  if (ts_k_device_count(TS_DEVICE_CUDA) == 0) {
    EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ts_last_error()).find("cuda device 0: this process sees 0"),
              std::string::npos)
        << ts_last_error();
  }
  EXPECT_EQ(e, nullptr);
  ts_model_free(&model);
}

// The plan of a device engine charges what its create would: the same model
// states, activations and comm as on the CPU, and a workspace of the
// kernels' (sized for that device) plus the step's scalar block, which on
// the CPU is host bookkeeping. Plans allocate nothing, so no GPU is needed.
TEST(Engine, ThePlanOfADeviceChargesItsStepScalars) {
  ts_model model{};
  ts_llama_config c = SmallConfig(64);
  ASSERT_EQ(ts_llama_model_init(&model, &c), TS_OK);
  ts_engine_opts o = Opts(2, 8);
  o.grad_accum = 3;
  o.dtype = TS_BF16;
  ts_mem_account cpu, cuda;
  ASSERT_EQ(ts_engine_plan(&model, &o, 2, &cpu), TS_OK) << ts_last_error();
  o.device = TS_DEVICE_CUDA;
  ASSERT_EQ(ts_engine_plan(&model, &o, 2, &cuda), TS_OK) << ts_last_error();
  for (int k : {TS_MEM_PARAMS, TS_MEM_GRADS, TS_MEM_MASTER, TS_MEM_OPTIM, TS_MEM_COMM}) {
    EXPECT_EQ(cuda.peak[k], cpu.peak[k]) << ts_mem_category_name((ts_mem_category)k);
    EXPECT_EQ(cuda.current[k], cpu.current[k]) << ts_mem_category_name((ts_mem_category)k);
  }
  // Activations differ by the units' saved state alone: in bf16 both
  // devices' blocks keep the attention rows' log-sum-exp (B, NH, T) fp32
  // (fused attention); in fp32 a GPU block keeps the probabilities (B, NH,
  // T, T) where the CPU keeps the log-sum-exp.
  size_t saved_cpu = 0, saved_cuda = 0;
  for (int u = 0; u < model.n_units; u++) {
    size_t a = ts_unit_saved_bytes(&model, u, 2, 8, TS_BF16, TS_DEVICE_CPU),
           b = ts_unit_saved_bytes(&model, u, 2, 8, TS_BF16, TS_DEVICE_CUDA);
    EXPECT_EQ(b, a) << "unit " << u;
    if (model.units[u].role == TS_UNIT_BLOCK) {
      EXPECT_GT(ts_unit_saved_bytes(&model, u, 2, 8, TS_FP32, TS_DEVICE_CUDA),
                ts_unit_saved_bytes(&model, u, 2, 8, TS_FP32, TS_DEVICE_CPU))
          << "unit " << u;
    }
    saved_cpu += a;
    saved_cuda += b;
  }
  EXPECT_EQ(cuda.peak[TS_MEM_ACTIVATIONS] - saved_cuda, cpu.peak[TS_MEM_ACTIVATIONS] - saved_cpu);
  size_t ws_cpu = 0, ws_cuda = 0, U = (size_t)model.n_units;
  for (int u = 0; u < model.n_units; u++) {
    ws_cpu = std::max(ws_cpu, ts_unit_workspace_bytes(&model, u, 2, 8, TS_BF16, TS_DEVICE_CPU));
    ws_cuda = std::max(ws_cuda, ts_unit_workspace_bytes(&model, u, 2, 8, TS_BF16, TS_DEVICE_CUDA));
  }
  // (loss sum, rows) per micro-batch, a squared norm per unit, the
  // evaluation's pair, then an int32 flag per (unit, tensor)
  size_t scalars = (2 * 3 + U + 2) * sizeof(double) + U * TS_UNIT_MAX_TENSORS * sizeof(int32_t);
  EXPECT_EQ(cpu.current[TS_MEM_WORKSPACE], ws_cpu);
  EXPECT_EQ(cuda.current[TS_MEM_WORKSPACE], ws_cuda + scalars);
  ts_model_free(&model);
}

TEST(Engine, EveryZeroStageOnOneRankTrainsIdentically) {
  // On one rank the stages differ only in which code path holds each
  // buffer (full or shard, gathered or not): the gradients after a
  // step's backward and the parameters after three steps must be bitwise equal.
  const size_t V = 64, T = 8;
  const char *w = "model.layers.0.self_attn.q_proj.weight";
  std::vector<std::vector<float>> grads, params;
  for (int stage = 0; stage <= 3; stage++) {
    for (bool tied : {false, true}) {
      ts_llama_config c = SmallConfig(V);
      c.tie_word_embeddings = tied;
      ts_engine_opts o = Opts(2, T);
      o.zero_stage = stage;
      EngineFixture f(c, o);
      std::vector<float> g(32 * 32), p(32 * 32), emb(V * 32);
      ts_step_stats st;
      for (int s = 0; s < 3; s++) {
        Batch b(2, T, V, 10 + s);
        ASSERT_EQ(ts_testing::Step(f.e, b.in.data(), b.tgt.data(), 1e-2f, &st,
                                   [&](ts_engine *e) {
                                     if (s == 0)
                                       ASSERT_EQ(ts_engine_get_grad(e, w, g.data(), g.size()),
                                                 TS_OK);
                                   }),
                  TS_OK);
      }
      ASSERT_EQ(ts_engine_get_tensor(f.e, w, p.data(), p.size()), TS_OK);
      ASSERT_EQ(ts_engine_get_tensor(f.e, "model.embed_tokens.weight", emb.data(), emb.size()),
                TS_OK);
      if (stage > 0) {
        size_t k = 2 * tied;  // the stage-0 run of the same model
        EXPECT_EQ(g, grads[k]) << "stage " << stage << " tied " << tied;
        EXPECT_EQ(p, params[k]) << "stage " << stage << " tied " << tied;
        EXPECT_EQ(emb, params[k + 1]) << "stage " << stage << " tied " << tied;
      } else {
        grads.push_back(g);
        grads.push_back({});
        params.push_back(p);
        params.push_back(emb);
      }
    }
  }
}

// The executor's list (step.c's lowering of the one-stage schedule), as an
// observer sees it begin: each micro-batch's FORWARD, its units' backward
// in reverse, each followed by its reduce-scatter where the ZeRO stage
// reduces then (stages 2/3 every micro-batch; 0/1 with overlap in the
// last, their bucket), the micro-batch's closing BACKWARD, then REDUCE,
// OPTIMIZER, each unit's OPTIMIZER_UNIT and OPTIMIZER_END.
struct ActionLog {
  std::string seen;
  static ts_status Action(void *user, ts_engine *, const ts_action *a, int end, ts_status) {
    if (end) return TS_OK;
    auto *self = static_cast<ActionLog *>(user);
    char buf[48];
    snprintf(buf, sizeof buf, "%s%s", self->seen.empty() ? "" : " ", ts_action_kind_name(a->kind));
    self->seen += buf;
    if (a->mb >= 0 || a->unit >= 0) {
      self->seen += "(";
      if (a->mb >= 0) self->seen += std::to_string(a->mb) + (a->unit >= 0 ? "," : "");
      if (a->unit >= 0) self->seen += std::to_string(a->unit);
      self->seen += ")";
    }
    return TS_OK;
  }
};

TEST(Engine, TheStepIsTheLoweredScheduleWithReductionsAsActions) {
  const size_t V = 64, T = 8;
  Batch b(2, T, V, 21);
  struct Case {
    int stage;
    bool overlap;
    const char *want;
  } cases[] = {
      {0, false,
       "forward(0) backward_unit(0,3) backward_unit(0,2) backward_unit(0,1) backward_unit(0,0) "
       "backward(0) forward(1) backward_unit(1,3) backward_unit(1,2) backward_unit(1,1) "
       "backward_unit(1,0) backward(1) reduce optimizer optimizer_unit(0) optimizer_unit(1) optimizer_unit(2) "
       "optimizer_unit(3) optimizer_end"},
      {1, true,
       "forward(0) backward_unit(0,3) backward_unit(0,2) backward_unit(0,1) backward_unit(0,0) "
       "backward(0) forward(1) backward_unit(1,3) reduce_unit(1,3) backward_unit(1,2) "
       "reduce_unit(1,2) backward_unit(1,1) reduce_unit(1,1) backward_unit(1,0) "
       "reduce_unit(1,0) backward(1) reduce optimizer optimizer_unit(0) optimizer_unit(1) optimizer_unit(2) "
       "optimizer_unit(3) optimizer_end"},
      {3, false,
       "forward(0) backward_unit(0,3) reduce_unit(0,3) backward_unit(0,2) reduce_unit(0,2) "
       "backward_unit(0,1) reduce_unit(0,1) backward_unit(0,0) reduce_unit(0,0) backward(0) "
       "forward(1) backward_unit(1,3) reduce_unit(1,3) backward_unit(1,2) reduce_unit(1,2) "
       "backward_unit(1,1) reduce_unit(1,1) backward_unit(1,0) reduce_unit(1,0) backward(1) "
       "reduce optimizer optimizer_unit(0) optimizer_unit(1) optimizer_unit(2) "
       "optimizer_unit(3) optimizer_end"},
  };
  for (const Case &c : cases) {
    ts_engine_opts o = Opts(2, T);
    o.grad_accum = 2;
    o.zero_stage = c.stage;
    o.overlap = c.overlap;
    EngineFixture f(SmallConfig(V), o);
    ActionLog log;
    ts_step_observer obs{};
    obs.action = ActionLog::Action;
    obs.user = &log;
    ASSERT_EQ(ts_engine_add_observer(f.e, &obs), TS_OK);
    ts_testing::MicroBatches two;
    two.Add(b.in.data(), b.tgt.data());
    two.Add(b.in.data(), b.tgt.data());
    ts_step_stats st;
    ASSERT_EQ(ts_testing::Step(f.e, two, 1e-3f, &st), TS_OK) << ts_last_error();
    EXPECT_EQ(log.seen, c.want) << "ZeRO-" << c.stage << " overlap " << c.overlap;
  }
}

// Observers: up to TS_ENGINE_MAX_OBSERVERS, each once, between steps; a
// refusal says which rule, and a removed one is told nothing more.
TEST(Engine, ObserversAreRegisteredOnceBetweenStepsUpToTheLimit) {
  const size_t V = 64, T = 8;
  EngineFixture f(SmallConfig(V), Opts(2, T));
  ActionLog logs[TS_ENGINE_MAX_OBSERVERS + 1];
  ts_step_observer obs[TS_ENGINE_MAX_OBSERVERS + 1] = {};
  for (int i = 0; i <= TS_ENGINE_MAX_OBSERVERS; i++) {
    obs[i].action = ActionLog::Action;
    obs[i].user = &logs[i];
  }
  for (int i = 0; i < TS_ENGINE_MAX_OBSERVERS - 1; i++)
    ASSERT_EQ(ts_engine_add_observer(f.e, &obs[i]), TS_OK);
  EXPECT_EQ(ts_engine_add_observer(f.e, &obs[0]), TS_ERR_INVALID_USAGE);
  EXPECT_NE(std::string(ts_last_error()).find("registered twice"), std::string::npos);
  // the last free place is ts_testing::Step's: a fifth is refused inside it
  Batch b(2, T, V, 22);
  ts_step_stats st;
  ts_status inside = TS_OK;
  ASSERT_EQ(ts_testing::Step(f.e, b.in.data(), b.tgt.data(), 1e-3f, &st,
                             [&](ts_engine *e) { inside = ts_engine_add_observer(e, &obs[4]); }),
            TS_OK);
  EXPECT_EQ(inside, TS_ERR_INVALID_USAGE);
  ASSERT_EQ(ts_engine_add_observer(f.e, &obs[TS_ENGINE_MAX_OBSERVERS - 1]), TS_OK);
  EXPECT_EQ(ts_engine_add_observer(f.e, &obs[TS_ENGINE_MAX_OBSERVERS]), TS_ERR_INVALID_USAGE);
  EXPECT_NE(std::string(ts_last_error()).find("expected at most"), std::string::npos);
  EXPECT_FALSE(logs[0].seen.empty());
  EXPECT_TRUE(logs[TS_ENGINE_MAX_OBSERVERS].seen.empty());
  ts_engine_remove_observer(f.e, &obs[0]);
  std::string before = logs[0].seen;
  for (int i = 1; i < TS_ENGINE_MAX_OBSERVERS; i++) ts_engine_remove_observer(f.e, &obs[i]);
  ASSERT_EQ(ts_testing::Step(f.e, b.in.data(), b.tgt.data(), 1e-3f, &st), TS_OK);
  EXPECT_EQ(logs[0].seen, before) << "a removed observer is told nothing";
}

TEST(Schedule, WarmupThenCosineToFloor) {
  EXPECT_FLOAT_EQ(ts_train_lr(1, 100, 10, 1.0f, 0.1f), 0.1f);
  EXPECT_FLOAT_EQ(ts_train_lr(10, 100, 10, 1.0f, 0.1f), 1.0f);
  EXPECT_NEAR(ts_train_lr(55, 100, 10, 1.0f, 0.1f), 0.55f, 1e-6);  // half way: mid point
  EXPECT_NEAR(ts_train_lr(100, 100, 10, 1.0f, 0.1f), 0.1f, 1e-6);
  for (size_t s = 11; s < 100; s++)
    EXPECT_LE(ts_train_lr(s + 1, 100, 10, 1.0f, 0.1f), ts_train_lr(s, 100, 10, 1.0f, 0.1f));
}

}  // namespace

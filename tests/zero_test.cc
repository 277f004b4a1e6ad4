// zero_test.cc — ZeRO stages 0–3 on the ranks mpirun gives (1, 2 or 4):
// the determinism contract (bitwise-identical parameters across stages at
// gradient accumulation 1), agreement with accumulation and across world
// sizes, the ledger against the ZeRO formulas to the byte, the bytes sent
// per step against theory, and global-norm clipping; the same in bf16 and
// fp16 with the mixed-precision formulas, activation checkpointing, and
// fp16 loss scaling with an injected overflow. Every test here is
// collective: all ranks run the same engines in the same order, and
// assertions that could stop one rank early come after the collectives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/comm_testing.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/step_testing.h"
#include "engine/simulate.h"
#include "kernels/kernels.h"
#include "models/llama.h"
#include "tests/tiny_model.h"

namespace {

constexpr size_t kT = 8;    // sequence length
constexpr size_t kV = tiny::kV;
constexpr float kLr = 1e-2f;

ts_llama_config Config(bool tied, size_t layers = 2) {
  return tiny::Config("zero-test", tied, layers);
}

using tiny::World;

// One global batch of `global` sequences for optimizer step `step`, the
// same on every rank whatever the world size.
// bert: masked-LM batches instead: [CLS] text [SEP] with a second segment
// and padding in odd sequences, about a quarter of the text as targets.
void GlobalBatch(size_t step, size_t global, std::vector<int32_t> *in, std::vector<int32_t> *tgt,
                 bool bert = false) {
  std::mt19937 g(1000 + (unsigned)step);
  in->resize(global * kT);
  tgt->resize(global * kT);
  for (size_t i = 0; i < global * kT; i++) {
    (*in)[i] = (int32_t)(g() % kV);
    (*tgt)[i] = (int32_t)(g() % kV);
  }
  if (bert) tiny::MaskedLmBatch(g, in->data(), tgt->data(), global, kT);
}

struct TrainRun {
  std::vector<std::vector<float>> params;  // every tensor after the last step
  std::vector<std::vector<float>> grads;   // one-rank runs: every tensor's gradient of step 1
  std::vector<std::vector<float>> state;   // per unit: this rank's shard of m, v, master
  std::vector<double> losses, norms;       // per step
  std::vector<ts_step_stats> stats;        // per step
  std::vector<uint64_t> allocations;       // per step: ts_comm_allocations() after it
  ts_mem_account after_create{}, at_end{};
  ts_mem_account disk{};                   // the ledger's disk account at the end
  std::vector<size_t> padded;              // P of each unit
};

// This rank's shard [r S, (r+1) S) of every unit's Adam m, v and (mixed
// precision) master weights, whatever the stage (stage 0 holds them whole).
std::vector<std::vector<float>> OptimizerState(const ts_engine *e, size_t r) {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < ts_engine_num_units(e); u++) {
    const ts_flat_layout *l = ts_engine_layout(e, u);
    std::vector<float> v;
    for (int which = 0; which < 3; which++) {
      size_t n;
      const float *p = ts_engine_optimizer_state(e, u, which, &n);
      if (!p) continue;
      size_t first = n == l->padded ? ts_flat_shard_begin(l, r) : 0;
      v.insert(v.end(), p + first, p + first + l->shard);
    }
    out.push_back(v);
  }
  return out;
}

// Every tensor of the model in layout order, read by get (the engine's
// parameters or, on one rank, its gradients) as fp32.
template <typename Get>
std::vector<std::vector<float>> EveryTensor(const ts_model &model, ts_engine *e, Get get) {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < model.n_units; u++)
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = model.units[u].tensors[i];
      std::vector<float> v(t.numel);
      EXPECT_EQ(get(e, t.name, v.data(), v.size()), TS_OK) << t.name;
      out.push_back(v);
    }
  return out;
}

struct TrainSetup {
  bool tied = false;
  int stage = 0;
  size_t global = 8;  // sequences per step over all ranks
  size_t accum = 1;
  size_t steps = 3;
  float clip = 1.0f;
  ts_dtype dtype = TS_FP32;
  size_t recompute_every = 0;
  size_t layers = 2;
  bool bert = false;          // the tiny BERT and masked-LM batches
  ts_engine_inject inject{};  // armed on the last rank when inject.step > 0,
  ts_engine_inject inject2{}; // and this one too when inject2.step > 0
  float loss_scale_init = 65536.0f;
  size_t loss_scale_window = 2000;
  float min_loss_scale = 1.0f;
  bool async_save = false;  // the engine's checkpoint staging (ledger category staging)
  bool keep_gathered = false;  // ZeRO-3 gathers each unit once per step
  bool overlap = true;         // the engine's default: collectives started ahead
  int comm = TS_ENGINE_COMM_AUTO;  // staged: the GPU path's host staging, on the CPU
  size_t comm_chunk = 0;           // staged: bytes per rank's part of a chunk (0: 1 MiB)
  int shard_group = 0;             // hybrid sharding: ZeRO within groups of S ranks
  bool offload = false;            // the optimizer state in a file under OffloadDir()
  size_t offload_piece = 0;        // its pieces' elements (0: the default)
  bool offload_optimizer = false;  // the GPU's host path: AdamW on host copies
  bool offload_params = false;     // ZeRO-3: the parameter shards in host memory too
};

// The offload folder of this test process ($TEST_TMPDIR, or /tmp).
const char *OffloadDir() {
  const char *t = getenv("TEST_TMPDIR");
  return t && *t ? t : "/tmp";
}

// The model of a setup: the tiny LLaMA or the tiny BERT.
ts_model MakeModel(const TrainSetup &s) {
  if (s.bert) return tiny::BertModel(s.tied, s.layers);
  ts_llama_config cfg = Config(s.tied, s.layers);
  ts_model model{};
  EXPECT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  return model;
}

// The engine options of setup s on N data-parallel ranks (B = global /
// (N accum) sequences per micro-batch).
ts_engine_opts OptsOf(const TrainSetup &s, size_t N) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = s.global / (N * s.accum);
  o.seq = kT;
  o.grad_accum = s.accum;
  o.seed = 7;
  o.grad_clip = s.clip;
  o.zero_stage = s.stage;
  o.dtype = s.dtype;
  o.async_save = s.async_save;
  o.keep_gathered = s.keep_gathered;
  o.overlap = s.overlap;
  o.comm = s.comm;
  o.comm_chunk_bytes = s.comm_chunk;
  o.shard_group = s.shard_group;
  o.recompute_every = s.recompute_every;
  o.loss_scale_init = s.loss_scale_init;
  o.loss_scale_window = s.loss_scale_window;
  o.min_loss_scale = s.min_loss_scale;
  o.offload_dir = s.offload ? OffloadDir() : nullptr;
  o.offload_piece = s.offload_piece;
  o.offload_optimizer = s.offload_optimizer || s.offload_params;
  o.offload_params = s.offload_params;
  return o;
}

// Trains `s.steps` steps on group dp. Rank r's micro-batch a of a step is
// samples [a*N*B + r*B, a*N*B + (r+1)*B) of the global batch, the layout of
// ts_loader_sample_index.
TrainRun Train(ts_comm *dp, const TrainSetup &s) {
  TrainRun run;
  size_t N = (size_t)ts_comm_size(dp), r = (size_t)ts_comm_rank(dp);
  size_t B = s.global / (N * s.accum);
  EXPECT_EQ(B * N * s.accum, s.global) << "test setup: global batch not divisible";
  ts_model model = MakeModel(s);
  ts_engine_opts o = OptsOf(s, N);
  ts_engine *e = nullptr;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, dp), TS_OK) << ts_last_error();
  // overlap on two or more ranks: the group's communication thread runs
  // (hybrid sharding: the engine's shard group of S ranks, cut from dp)
  size_t sharded = s.shard_group > 0 ? (size_t)s.shard_group : N;
  EXPECT_EQ(ts_comm_thread_active(ts_engine_comm(e)), s.overlap && sharded > 1);
  EXPECT_EQ(ts_comm_size(ts_engine_comm(e)), (int)sharded);
  if (!s.overlap && !s.shard_group)  // (hybrid: the engine's own groups are cut from dp)
    EXPECT_STREQ(ts_comm_transport(dp), N == 1                            ? "self"
                                        : s.comm == TS_ENGINE_COMM_STAGED ? "staged"
                                                                          : "mpi");
  if (s.inject.step > 0 && r == N - 1) ts_engine_inject_nonfinite(e, &s.inject);
  if (s.inject2.step > 0 && r == N - 1) ts_engine_inject_nonfinite(e, &s.inject2);
  run.after_create = *ts_engine_memory(e);
  for (int u = 0; u < model.n_units; u++) run.padded.push_back(ts_engine_layout(e, u)->padded);
  std::vector<int32_t> in, tgt;
  for (size_t step = 0; step < s.steps; step++) {
    GlobalBatch(step, s.global, &in, &tgt, s.bert);
    ts_testing::MicroBatches mb;
    for (size_t a = 0; a < s.accum; a++) {
      size_t first = (a * N + r) * B;
      mb.Add(in.data() + first * kT, tgt.data() + first * kT);
    }
    ts_step_stats st{};
    EXPECT_EQ(ts_testing::Step(e, mb, kLr, &st,
                               [&](ts_engine *at) {
                                 if (step == 0 && N == 1)
                                   run.grads = EveryTensor(model, at, ts_engine_get_grad);
                               }),
              TS_OK)
        << ts_last_error();
    run.losses.push_back(st.loss);
    run.norms.push_back(st.grad_norm);
    run.stats.push_back(st);
    run.allocations.push_back(ts_comm_allocations());
  }
  run.params = EveryTensor(model, e, ts_engine_get_tensor);
  run.state =
      OptimizerState(e, (size_t)ts_comm_rank(ts_engine_comm(e)));  // its place in the shards
  run.at_end = *ts_engine_memory(e);
  run.disk = *ts_engine_disk(e);
  ts_engine_free(e);
  ts_model_free(&model);
  return run;
}

// Two steps at `stage` on the world, accumulation 1.
TrainRun TwoSteps(bool tied, int stage, bool overlap) {
  TrainSetup s;
  s.tied = tied;
  s.stage = stage;
  s.steps = 2;
  s.overlap = overlap;
  return Train(World(), s);
}

bool BitwiseEqual(const std::vector<std::vector<float>> &a,
                  const std::vector<std::vector<float>> &b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (a[i].size() != b[i].size() || memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0)
      return false;
  return true;
}

// Parameters and this rank's optimizer state (m, v, master) bitwise equal.
bool BitwiseEqual(const TrainRun &a, const TrainRun &b) {
  return BitwiseEqual(a.params, b.params) && BitwiseEqual(a.state, b.state);
}

// Largest |a - b| over every parameter.
double MaxAbsDiff(const TrainRun &a, const TrainRun &b) {
  double d = 0;
  for (size_t i = 0; i < a.params.size(); i++)
    for (size_t j = 0; j < a.params[i].size(); j++)
      d = std::max(d, (double)std::fabs(a.params[i][j] - b.params[i][j]));
  return d;
}

// ZeRO stages 0-3 on the world in dtype dt (hybrid sharding over groups
// of shard_group ranks when > 0), three steps each: parameters, optimizer
// state, losses and norms bitwise equal to stage 0's. Returns the runs.
std::vector<TrainRun> ExpectStagesBitwise(bool tied, int shard_group, ts_dtype dt = TS_FP32) {
  std::vector<TrainRun> runs;
  for (int stage = 0; stage <= 3; stage++) {
    TrainSetup s;
    s.tied = tied;
    s.stage = stage;
    s.dtype = dt;
    s.shard_group = shard_group;
    runs.push_back(Train(World(), s));
  }
  for (int stage = 1; stage <= 3; stage++) {
    SCOPED_TRACE("tied " + std::to_string(tied) + ", stage " + std::to_string(stage));
    EXPECT_TRUE(BitwiseEqual(runs[0], runs[stage]))
        << "max |diff| " << MaxAbsDiff(runs[0], runs[stage]);
    for (size_t k = 0; k < runs[0].losses.size(); k++) {
      EXPECT_EQ(runs[0].losses[k], runs[stage].losses[k]) << "step " << k + 1;
      EXPECT_EQ(runs[0].norms[k], runs[stage].norms[k]) << "step " << k + 1;
    }
  }
  return runs;
}

TEST(ZeroStages, BitwiseIdenticalParametersAcrossStages) {
  for (bool tied : {false, true}) {
    std::vector<TrainRun> runs = ExpectStagesBitwise(tied, 0);
    // The run really trained: parameters moved from their initial values.
    TrainSetup s0;
    s0.tied = tied;
    s0.steps = 0;
    EXPECT_GT(MaxAbsDiff(runs[0], Train(World(), s0)), 1e-3);
  }
}

// Stages 0-3, a global batch of 16 in `accum` micro-batches per step
// (hybrid sharding over groups of shard_group ranks when > 0).
std::vector<TrainRun> AccumulatedRuns(size_t accum, int shard_group) {
  std::vector<TrainRun> runs;
  for (int stage = 0; stage <= 3; stage++) {
    TrainSetup s;
    s.stage = stage;
    s.global = 16;
    s.accum = accum;
    s.shard_group = shard_group;
    runs.push_back(Train(World(), s));
  }
  return runs;
}

TEST(ZeroStages, GradientAccumulationAgreesAcrossStages) {
  // K = 4 micro-batches of 16 / (4 N) sequences. Stage 1 accumulates full
  // gradients as stage 0 does and reduces once: bitwise equal. Stages 2-3
  // reduce every micro-batch into the shard, so each gradient element is a
  // sum in another order, ~1e-7 relative apart. Adam divides each element by
  // its own running RMS, so an element whose gradient is near zero can move
  // by up to lr per step on a rounding-level change: parameters are held to
  // 1e-4, 1% of one step's largest update (measured 1.3e-6 on 2 ranks,
  // 4.2e-7 on 4). Losses, which see no such amplification, to 1e-6 relative.
  std::vector<TrainRun> runs = AccumulatedRuns(4, 0);
  EXPECT_TRUE(BitwiseEqual(runs[0], runs[1])) << "max |diff| " << MaxAbsDiff(runs[0], runs[1]);
  // Stage 3 reduces every micro-batch into the shard as stage 2 does: the
  // same sums in the same order, bitwise (the README's claim).
  EXPECT_TRUE(BitwiseEqual(runs[2], runs[3])) << "max |diff| " << MaxAbsDiff(runs[2], runs[3]);
  for (int stage = 2; stage <= 3; stage++) {
    EXPECT_LT(MaxAbsDiff(runs[0], runs[stage]), 1e-4) << "stage " << stage;
    for (size_t k = 0; k < runs[0].losses.size(); k++)
      EXPECT_NEAR(runs[stage].losses[k], runs[0].losses[k], 1e-6 * runs[0].losses[k]);
  }
}

TEST(ZeroStages, WorldSizesAgreeWithOneRank) {
  // The same global batch of 8 on N ranks (B = 8 / N) and on one rank
  // (B = 8) in this process: the gradients differ only by summation order
  // (GEMMs over M = B*T rows, the rank-order sum), ~1e-7 relative, so losses
  // agree to 1e-6 relative and norms to 1e-5 relative (measured ~1e-8 for
  // both), parameters to 1e-4 as in the accumulation test (measured 5.6e-6
  // on 2 ranks, 4.8e-6 on 4). A gradient scaled wrongly by N would leave
  // Adam's parameters nearly unchanged but moves the loss and norm.
  ts_comm *self = nullptr;
  ASSERT_EQ(ts_comm_self(&self), TS_OK);
  for (int stage : {0, 3}) {
    TrainSetup s;
    s.stage = stage;
    TrainRun many = Train(World(), s), one = Train(self, s);
    EXPECT_LT(MaxAbsDiff(many, one), 1e-4) << "stage " << stage;
    for (size_t k = 0; k < one.losses.size(); k++) {
      EXPECT_NEAR(many.losses[k], one.losses[k], 1e-6 * one.losses[k]) << "step " << k + 1;
      EXPECT_NEAR(many.norms[k], one.norms[k], 1e-5 * one.norms[k]) << "step " << k + 1;
    }
  }
  ts_comm_free(self);
}

// P of each unit computed from the tensor sizes alone (not the engine's
// layout): the sum rounded up to a multiple of N * 16 elements.
std::vector<size_t> FormulaPadded(bool tied, size_t N) {
  ts_llama_config cfg = Config(tied);
  ts_model model{};
  EXPECT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  std::vector<size_t> P;
  for (int u = 0; u < model.n_units; u++) {
    size_t n = 0;
    for (int i = 0; i < model.units[u].n_tensors; i++) n += model.units[u].tensors[i].numel;
    size_t g = 16 * N;
    P.push_back((n + g - 1) / g * g);
  }
  ts_model_free(&model);
  return P;
}

// Ψ (padded total) and the transient elements the ledger tests expect.
// Without overlap: stage 3 holds one gathered unit at a time (two for a
// tied head: head + embedding); stages 2-3 one full gradient (two from a
// tied head's backward to the embedding's: the embedding's and the
// current unit's). With overlap (prefetch depth 1): stage 3 holds two
// neighbouring units (computing one, gathering the next; the tied head's
// prefetch brings the embedding too: units n-2, n-1 and 0); stages 2-3
// two neighbouring full gradients (the one being reduce-scattered and the
// one being computed; plus the embedding's from a tied head's backward).
struct Elements {
  size_t psi = 0, max_unit = 0, params_transient = 0, grads_transient = 0;
};

Elements FormulaElements(bool tied, size_t N, bool overlap) {
  std::vector<size_t> P = FormulaPadded(tied, N);
  Elements x;
  size_t n = P.size(), max_after_embedding = 0, max_pair = 0, max_pair_after_embedding = 0;
  for (size_t u = 0; u < n; u++) {
    x.psi += P[u];
    x.max_unit = std::max(x.max_unit, P[u]);
    if (u > 0) max_after_embedding = std::max(max_after_embedding, P[u]);
    if (u + 1 < n) max_pair = std::max(max_pair, P[u] + P[u + 1]);
    if (u > 0 && u + 1 < n)
      max_pair_after_embedding = std::max(max_pair_after_embedding, P[u] + P[u + 1]);
  }
  if (!overlap) {
    x.params_transient = tied ? std::max(x.max_unit, P.back() + P[0]) : x.max_unit;
    x.grads_transient = tied ? P[0] + max_after_embedding : x.max_unit;
  } else {
    x.params_transient = tied ? std::max(max_pair, P[n - 2] + P[n - 1] + P[0]) : max_pair;
    x.grads_transient = tied ? P[0] + max_pair_after_embedding : max_pair;
  }
  return x;
}

TEST(ZeroStages, LedgerMatchesTheZeroFormulasExactly) {
  // fp32, no master copy: params 4Ψ, grads 4Ψ, Adam 8Ψ, each over N where
  // the stage shards it (Ψ = the padded total), and the transients of
  // FormulaElements.
  size_t N = (size_t)ts_comm_size(World());
  for (bool overlap : {false, true})
    for (bool tied : {false, true}) {
      std::vector<size_t> P = FormulaPadded(tied, N);
      Elements x = FormulaElements(tied, N, overlap);
      size_t psi = x.psi, max_unit = x.max_unit, params_transient = x.params_transient,
             grads_transient = x.grads_transient;
      for (int stage = 0; stage <= 3; stage++) {
        SCOPED_TRACE("overlap " + std::to_string(overlap) + ", tied " + std::to_string(tied) +
                     ", stage " + std::to_string(stage));
        TrainRun run = TwoSteps(tied, stage, overlap);
        EXPECT_EQ(run.padded, P);
        size_t params = stage == 3 ? 4 * psi / N : 4 * psi;
        size_t grads = stage >= 2 ? 4 * psi / N : 4 * psi;
        size_t optim = stage >= 1 ? 8 * psi / N : 8 * psi;
        for (const ts_mem_account *l : {&run.after_create, &run.at_end}) {
          EXPECT_EQ(l->current[TS_MEM_PARAMS], params);
          EXPECT_EQ(l->current[TS_MEM_GRADS], grads);
          EXPECT_EQ(l->current[TS_MEM_OPTIM], optim);
          EXPECT_EQ(l->current[TS_MEM_MASTER], 0u);
        }
        EXPECT_EQ(run.at_end.peak[TS_MEM_PARAMS], params + (stage == 3 ? 4 * params_transient : 0));
        EXPECT_EQ(run.at_end.peak[TS_MEM_GRADS], grads + (stage >= 2 ? 4 * grads_transient : 0));
        EXPECT_EQ(run.at_end.peak[TS_MEM_OPTIM], optim);
        EXPECT_EQ(run.at_end.peak[TS_MEM_MASTER], 0u);
        // The reduce-scatter scratch: (N-1) shards of the largest unit.
        EXPECT_EQ(run.at_end.current[TS_MEM_COMM], 4 * (N - 1) * (max_unit / N));
      }
    }
}

TEST(ZeroStages, BytesSentPerStepMatchTheory) {
  // ZeRO paper §7: stages 0-2 move 2Ψ(N-1)/N elements per rank per step
  // (reduce-scatter + all-gather), stage 3 3Ψ(N-1)/N (an all-gather before
  // forward and before backward, a reduce-scatter); padding included. A
  // tied head gathers the embedding again for its forward and backward.
  // With overlap the last unit stays gathered from its forward into its
  // backward (its backward follows at once), so stage 3 gathers it once
  // per micro-batch, not twice (FSDP keeps its root unit likewise).
  // Besides: one all-reduce of two doubles (loss sum, squared norm).
  size_t N = (size_t)ts_comm_size(World());
  for (bool overlap : {false, true})
    for (bool tied : {false, true}) {
      std::vector<size_t> P = FormulaPadded(tied, N);
      size_t moved = 0;  // Ψ (N-1)/N
      for (size_t p : P) moved += p - p / N;
      size_t embedding = P[0] - P[0] / N, last = overlap ? P.back() - P.back() / N : 0;
      for (int stage = 0; stage <= 3; stage++) {
        SCOPED_TRACE("overlap " + std::to_string(overlap) + ", tied " + std::to_string(tied) +
                     ", stage " + std::to_string(stage));
        TrainRun run = TwoSteps(tied, stage, overlap);
        for (const ts_step_stats &st : run.stats) {
          uint64_t rs = st.comm.bytes[TS_COMM_REDUCE_SCATTER],
                   ag = st.comm.bytes[TS_COMM_ALL_GATHER];
          EXPECT_EQ(rs, 4 * moved);
          uint64_t gathers = stage == 3 ? 2 * moved - last + (tied ? 2 * embedding : 0) : moved;
          EXPECT_EQ(ag, 4 * gathers);
          EXPECT_EQ(rs + ag, 4 * (stage == 3 ? 3 * moved - last : 2 * moved) +
                                 (stage == 3 && tied ? 8 * embedding : 0));
          EXPECT_EQ(st.comm.bytes[TS_COMM_ALL_REDUCE], 16 * (N - 1));
          EXPECT_EQ(st.comm.bytes[TS_COMM_BROADCAST] + st.comm.bytes[TS_COMM_SEND], 0u);
          EXPECT_EQ(st.comm_bytes, rs + ag + 16 * (N - 1));
        }
      }
    }
}

TEST(ZeroStages, GatherOncePerStepIsBitwiseAndGathersEachUnitOnce) {
  // keep_gathered (FSDP2's reshard_after_forward=False): ZeRO-3 keeps each
  // unit's gathered parameters from its first forward to its backward in the
  // step's last micro-batch. A gather copies the shards, so parameters and
  // optimizer state are bitwise those of gathering for every forward and
  // backward; the step's all-gathers fall from 2K Ψ(N-1)/N (and the tied
  // head's 2K embeddings) to one Ψ(N-1)/N; the gathered units held at once
  // raise the peak of the params category.
  size_t N = (size_t)ts_comm_size(World());
  for (bool tied : {false, true})
    for (size_t accum : {1, 2})
      for (ts_dtype dt : {TS_FP32, TS_BF16}) {
        size_t every = dt == TS_BF16;  // recompute (a backward's forward again) in bf16
        SCOPED_TRACE("tied " + std::to_string(tied) + ", accum " + std::to_string(accum) + ", " +
                     ts_dtype_name(dt) + ", every " + std::to_string(every));
        TrainSetup s;
        s.stage = 3;
        s.tied = tied;
        s.accum = accum;
        s.dtype = dt;
        s.recompute_every = every;
        s.steps = 2;
        TrainRun each = Train(World(), s);
        s.keep_gathered = true;
        TrainRun once = Train(World(), s);
        EXPECT_EQ(once.losses, each.losses);
        EXPECT_TRUE(BitwiseEqual(once, each));
        std::vector<size_t> P = FormulaPadded(tied, N);
        size_t moved = 0, es = ts_dtype_size(dt);
        for (size_t p : P) moved += p - p / N;
        size_t embedding = P[0] - P[0] / N, last = P.back() - P.back() / N;
        for (size_t k = 0; k < once.stats.size(); k++) {
          EXPECT_EQ(once.stats[k].comm.bytes[TS_COMM_ALL_GATHER], es * moved);
          // overlap (the default) keeps the last unit from forward to backward
          EXPECT_EQ(each.stats[k].comm.bytes[TS_COMM_ALL_GATHER],
                    es * accum * (2 * moved - last + (tied ? 2 * embedding : 0)));
          EXPECT_EQ(once.stats[k].comm.bytes[TS_COMM_REDUCE_SCATTER],
                    each.stats[k].comm.bytes[TS_COMM_REDUCE_SCATTER]);
        }
        EXPECT_GT(once.at_end.peak[TS_MEM_PARAMS], each.at_end.peak[TS_MEM_PARAMS]);
      }
}

TEST(ZeroStages, OverlapIsBitwiseEqualToNoneUnderRandomDelays) {
  // Overlap starts every collective ahead and waits for it where its
  // result is needed; on two or more ranks the data-parallel group's
  // communication thread runs them, here sleeping a random 0-300 us before
  // each (the test hook), so completions land at other points of the step
  // on every run. No sum changes order (the transport's rank order), so
  // parameters, optimizer state, losses and norms are bitwise those without
  // overlap: stages 0-3 x fp32/bf16/fp16 x recompute x accumulation 1 and
  // 2 x gather-once (stage 3). The reduce-scatters move the same bytes;
  // stage 3's all-gathers one last unit less per micro-batch (kept). The
  // host-staged transport (the GPU path's, here staging host memory in
  // chunks of 256 bytes per rank, under the thread with overlap and on the
  // step's thread without) gives the same bits and bytes again.
  ts_comm_testing_set_thread_delay(300, 11);
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (int stage = 0; stage <= 3; stage++)
      for (size_t every : {0, 1}) {
        size_t accum = 1 + (size_t)((stage + every) % 2);
        for (bool once : {false, true}) {
          if (once && stage != 3) continue;
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", stage " + std::to_string(stage) +
                       ", every " + std::to_string(every) + ", accum " + std::to_string(accum) +
                       ", gather-once " + std::to_string(once));
          TrainSetup s;
          s.stage = stage;
          s.dtype = dt;
          s.recompute_every = every;
          s.accum = accum;
          s.tied = stage % 2 == 0;
          s.keep_gathered = once;
          s.steps = 2;
          s.overlap = false;
          TrainRun off = Train(World(), s);
          s.overlap = true;
          TrainRun on = Train(World(), s);
          s.comm = TS_ENGINE_COMM_STAGED;
          s.comm_chunk = 256;
          s.overlap = (stage + every) % 2 == 0;
          TrainRun staged = Train(World(), s);
          for (const TrainRun *other : {&on, &staged}) {
            EXPECT_TRUE(BitwiseEqual(off, *other)) << "max |diff| " << MaxAbsDiff(off, *other);
            EXPECT_EQ(off.losses, other->losses);
            EXPECT_EQ(off.norms, other->norms);
            for (size_t k = 0; k < off.stats.size(); k++)
              EXPECT_EQ(off.stats[k].comm.bytes[TS_COMM_REDUCE_SCATTER],
                        other->stats[k].comm.bytes[TS_COMM_REDUCE_SCATTER]);
          }
        }
      }
  ts_comm_testing_set_thread_delay(0, 1);
}

// No transport allocates inside a step after the first (requests, their
// arrays, queue items, host copies come from each group's pool): comm's
// allocation count stays put over steps 2-5, at every ZeRO stage, on MPI
// and the staged transport, with and without the communication thread,
// and with hybrid sharding's replica all-reduce (its uneven halves) where
// the world has 4 ranks; one rank: the one-rank transport.
TEST(ZeroStages, NoTransportAllocatesInsideAStepAfterTheFirst) {
  size_t N = (size_t)ts_comm_size(World());
  for (int comm : {TS_ENGINE_COMM_MPI, TS_ENGINE_COMM_STAGED})
    for (bool overlap : {false, true})
      for (int shard_group : {0, 2})
        for (int stage = 0; stage <= 3; stage++) {
          if (shard_group && N != 4) continue;
          TrainSetup s;
          s.stage = stage;
          s.steps = 5;
          s.accum = 2;
          s.tied = true;
          s.comm = comm;
          s.overlap = overlap;
          s.shard_group = shard_group;
          s.dtype = stage % 2 ? TS_BF16 : TS_FP32;
          TrainRun run = Train(World(), s);
          ASSERT_EQ(run.allocations.size(), 5u);
          EXPECT_EQ(run.allocations[4], run.allocations[0])
              << "comm allocated inside steps 2-5: ZeRO-" << stage << " comm " << comm
              << " overlap " << overlap << " shard group " << shard_group;
        }
}

// An observer with call/call_wait (observer.h) is told every counted call
// of the engine's group as comm's counters count it (kinds, bytes), each
// with the next number, and every wait for a started call with a number it
// was told; once removed it is told nothing (the watcher is off the group).
struct CallLog {
  ts_comm_counters told{};
  std::vector<int64_t> ids, waits;
  int blocking = 0;
};

// Offload to a disk (opts.offload_dir): the optimizer state streamed in
// pieces through a scratch file gives the bits of the state in memory —
// parameters, the losses of every step, and the optimizer state — at ZeRO
// 0-3, in fp32, bf16 and fp16 (loss scaling, an overflow skipping a step
// on every rank), with accumulation 2 and the tied head, with checkpointing
// of every block, and with hybrid sharding on 4 ranks; with whole units as
// pieces (the default's 4 Mi elements exceed these units) and with pieces
// of 1024 elements, which cut units and tensors. Memory holds three pieces'
// state, and the disk the whole of it. The GPU's host path
// (opts.offload_optimizer: each unit's gradient copied to a host piece,
// AdamW there, the parameters copied back; on the CPU a twin of it) gives
// the same bits, alone with pieces of 1024 elements and with the disk.
TEST(Offload, ToHostOrDiskGivesTheBitsOfTheStateInMemory) {
  size_t N = (size_t)ts_comm_size(World());
  ts_k_check_host_blocks(1);  // host and device memory told apart, as on a GPU
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (int stage = 0; stage <= 3; stage++) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", stage " + std::to_string(stage));
      TrainSetup s;
      s.stage = stage;
      s.dtype = dt;
      s.accum = 2;
      s.steps = 3;
      s.tied = stage % 2 == 1;
      s.recompute_every = stage == 2 ? 1 : 0;
      if (dt == TS_FP16) {  // step 2 overflows on the last rank: skipped everywhere
        s.inject = {2, 1, 0, INFINITY};
        s.loss_scale_window = 1;
      }
      TrainRun mem = Train(World(), s);
      s.offload = true;
      TrainRun disk = Train(World(), s);
      EXPECT_TRUE(BitwiseEqual(mem.params, disk.params));
      EXPECT_TRUE(BitwiseEqual(mem.state, disk.state));
      EXPECT_EQ(mem.losses, disk.losses);
      if (dt == TS_FP16) {
        EXPECT_EQ(disk.stats[1].skipped, 1);
      }
      s.offload_piece = 1024;
      TrainRun small = Train(World(), s);
      s.offload_piece = 0;
      EXPECT_TRUE(BitwiseEqual(mem.params, small.params)) << "pieces of 1024";
      EXPECT_TRUE(BitwiseEqual(mem.state, small.state)) << "pieces of 1024";
      EXPECT_EQ(mem.losses, small.losses);
      // three pieces of 1024 elements per array in memory: less than whole units
      EXPECT_LT(small.at_end.current[TS_MEM_OPTIM], disk.at_end.current[TS_MEM_OPTIM]);
      // the state left memory for the disk: master (bf16/fp16) and optim
      size_t in_memory = mem.at_end.current[TS_MEM_OPTIM] + mem.at_end.current[TS_MEM_MASTER];
      EXPECT_EQ(disk.disk.current[TS_MEM_MASTER] > 0, dt != TS_FP32);
      EXPECT_GE(disk.disk.current[TS_MEM_OPTIM] + disk.disk.current[TS_MEM_MASTER], in_memory);
      EXPECT_EQ(mem.disk.current_total, 0u);
      // the host path, through copies of 1024 elements, alone and with the disk
      s.offload = false;
      s.offload_optimizer = true;
      s.offload_piece = 1024;
      TrainRun host = Train(World(), s);
      EXPECT_TRUE(BitwiseEqual(mem.params, host.params)) << "offload_optimizer";
      EXPECT_TRUE(BitwiseEqual(mem.state, host.state)) << "offload_optimizer";
      EXPECT_EQ(mem.losses, host.losses);
      EXPECT_GT(host.at_end.current[TS_MEM_STAGING], 0u);  // the gradient and parameter pieces
      if (stage == 3) {  // the parameter shards in host memory too
        s.offload_params = true;
        TrainRun params = Train(World(), s);
        s.offload_params = false;
        EXPECT_TRUE(BitwiseEqual(mem.params, params.params)) << "offload_params";
        EXPECT_TRUE(BitwiseEqual(mem.state, params.state)) << "offload_params";
        EXPECT_EQ(mem.losses, params.losses);
      }
      if (dt == TS_BF16) {
        s.offload = true;
        TrainRun both = Train(World(), s);
        EXPECT_TRUE(BitwiseEqual(mem.params, both.params)) << "offload_optimizer + disk";
        EXPECT_TRUE(BitwiseEqual(mem.state, both.state)) << "offload_optimizer + disk";
        EXPECT_EQ(mem.losses, both.losses);
      }
    }
  if (N == 4) {  // hybrid sharding: ZeRO-3 within pairs, the replicas summed
    TrainSetup s;
    s.stage = 3;
    s.shard_group = 2;
    s.dtype = TS_BF16;
    TrainRun mem = Train(World(), s);
    s.offload = true;
    TrainRun disk = Train(World(), s);
    EXPECT_TRUE(BitwiseEqual(mem.params, disk.params));
    EXPECT_TRUE(BitwiseEqual(mem.state, disk.state));
    s.offload = false;
    s.offload_optimizer = true;
    TrainRun host = Train(World(), s);
    EXPECT_TRUE(BitwiseEqual(mem.params, host.params));
    EXPECT_TRUE(BitwiseEqual(mem.state, host.state));
  }
  ts_k_check_host_blocks(0);
}

TEST(ZeroStages, AnObserverIsToldEveryCallOfTheGroupAndEveryWait) {
  size_t N = (size_t)ts_comm_size(World());
  if (N == 1) GTEST_SKIP() << "a one-rank group counts no calls";
  for (bool overlap : {false, true})
    for (int stage : {0, 3}) {
      SCOPED_TRACE("ZeRO-" + std::to_string(stage) + " overlap " + std::to_string(overlap));
      TrainSetup s;
      s.stage = stage;
      s.overlap = overlap;
      s.accum = 2;
      ts_model model = MakeModel(s);
      ts_engine_opts o = OptsOf(s, N);
      ts_engine *e = nullptr;
      ASSERT_EQ(ts_engine_create(&e, &model, &o, World()), TS_OK) << ts_last_error();
      CallLog log;
      ts_step_observer obs{};
      obs.call = [](void *user, ts_engine *, const ts_comm *, const ts_comm_call_info *k,
                    int blocking, int64_t id) {
        CallLog *l = (CallLog *)user;
        l->ids.push_back(id);
        l->blocking += blocking;
        if (k->kind >= 0) {
          l->told.calls[k->kind] += 1;
          l->told.bytes[k->kind] += k->bytes;
        }
      };
      obs.call_wait = [](void *user, ts_engine *, int64_t id) {
        ((CallLog *)user)->waits.push_back(id);
      };
      obs.user = &log;
      size_t B = s.global / (N * s.accum), r = (size_t)ts_comm_rank(World());
      auto step = [&](size_t k) {
        std::vector<int32_t> in, tgt;
        GlobalBatch(k, s.global, &in, &tgt, false);
        ts_testing::MicroBatches mb;
        for (size_t a = 0; a < s.accum; a++)
          mb.Add(in.data() + (a * N + r) * B * kT, tgt.data() + (a * N + r) * B * kT);
        ts_step_stats st{};
        EXPECT_EQ(ts_testing::Step(e, mb, kLr, &st), TS_OK) << ts_last_error();
      };
      ts_comm *g = ts_engine_comm(e);
      step(0);
      ASSERT_EQ(ts_engine_add_observer(e, &obs), TS_OK);
      ts_comm_counters before = *ts_comm_get_counters(g);
      step(1);
      ts_comm_counters after = *ts_comm_get_counters(g);
      uint64_t calls = 0;
      for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
        EXPECT_EQ(log.told.calls[k], after.calls[k] - before.calls[k]) << "kind " << k;
        EXPECT_EQ(log.told.bytes[k], after.bytes[k] - before.bytes[k]) << "kind " << k;
        calls += log.told.calls[k];
      }
      EXPECT_GT(calls, 0u);
      ASSERT_EQ(log.ids.size(), (size_t)calls);  // no pipeline: no receive
      for (size_t i = 0; i < log.ids.size(); i++) EXPECT_EQ(log.ids[i], (int64_t)i);
      // every call but the blocking ones is waited for, once
      std::vector<int64_t> w = log.waits;
      std::sort(w.begin(), w.end());
      EXPECT_EQ(std::adjacent_find(w.begin(), w.end()), w.end());
      EXPECT_EQ(w.size() + (size_t)log.blocking, log.ids.size());
      if (!w.empty()) {
        EXPECT_TRUE(w.front() >= 0 && w.back() < (int64_t)calls);
      }
      ts_engine_remove_observer(e, &obs);
      size_t told = log.ids.size();
      step(2);
      EXPECT_EQ(log.ids.size(), told) << "told after removal";
      ts_engine_free(e);
      ts_model_free(&model);
    }
}

TEST(ZeroStages, ClippingUsesTheGlobalNormInEveryStage) {
  // Step 1's norm on N ranks is the one-rank norm (to summation order,
  // 1e-5 relative). A threshold above the norm changes nothing (bitwise
  // equal to no clipping); one below it engages and changes the parameters
  // (measured 3.3e-3 against a threshold of 1e-4), identically in every
  // stage.
  ts_comm *self = nullptr;
  ASSERT_EQ(ts_comm_self(&self), TS_OK);
  TrainSetup probe;
  probe.steps = 1;
  probe.clip = 0;
  double norm = Train(self, probe).norms[0];
  ts_comm_free(self);
  ASSERT_GT(norm, 0);
  std::vector<TrainRun> off, high, low;
  for (int stage = 0; stage <= 3; stage++) {
    TrainSetup s;
    s.stage = stage;
    s.steps = 2;
    s.clip = 0;
    off.push_back(Train(World(), s));
    s.clip = (float)(norm * 10);
    high.push_back(Train(World(), s));
    s.clip = (float)(norm * 0.25);
    low.push_back(Train(World(), s));
  }
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_NEAR(off[stage].norms[0], norm, 1e-5 * norm);
    EXPECT_EQ(off[stage].norms[0], off[0].norms[0]);
    EXPECT_TRUE(BitwiseEqual(off[stage], high[stage]));
    EXPECT_GT(MaxAbsDiff(off[stage], low[stage]), 1e-4);
    EXPECT_TRUE(BitwiseEqual(low[0], low[stage]));
    EXPECT_EQ(low[stage].norms[0], off[stage].norms[0]) << "the norm is reported before clipping";
  }
}

TEST(ZeroStages, HalfPrecisionIsBitwiseIdenticalAcrossStages) {
  // The determinism contract holds in bf16 and fp16 too: the half-precision
  // gradients are reduced by the same reduce-scatter (summed in fp32, one
  // rounding, rank order) and AdamW updates the same fp32 master elements.
  // Compared: compute parameters, Adam m, v and the fp32 master shard.
  for (ts_dtype dt : {TS_BF16, TS_FP16})
    for (bool tied : {false, true}) {
      SCOPED_TRACE(ts_dtype_name(dt));
      std::vector<TrainRun> runs = ExpectStagesBitwise(tied, 0, dt);
      for (const TrainRun &run : runs)
        for (const ts_step_stats &st : run.stats) EXPECT_EQ(st.skipped, 0);
      // Trained, and in its own precision: within 5e-2 of the fp32 run
      // (three steps of lr 1e-2 move weights by ~3e-2; half-precision
      // gradients change the Adam direction only where they round to a
      // different sign or vanish) but not bitwise equal to it.
      TrainSetup f;
      f.tied = tied;
      TrainRun fp32 = Train(World(), f);
      EXPECT_LT(MaxAbsDiff(runs[0], fp32), 5e-2) << ts_dtype_name(dt);
      EXPECT_FALSE(BitwiseEqual(runs[0].params, fp32.params)) << ts_dtype_name(dt);
    }
}

TEST(ZeroStages, LedgerMatchesTheMixedPrecisionFormulasExactly) {
  // ZeRO paper §5 with a 2-byte compute dtype and K = 12 (fp32 master 4 +
  // Adam m 4 + v 4), Ψ the padded total: stage 0 16Ψ, stage 1 4Ψ + 12Ψ/N,
  // stage 2 2Ψ + 14Ψ/N, stage 3 16Ψ/N, per category: params 2Ψ (2Ψ/N in
  // stage 3), grads 2Ψ (2Ψ/N from stage 2), master 4Ψ and optimizer state
  // 8Ψ (each / N from stage 1). The transients of the fp32 test, at 2 bytes.
  size_t N = (size_t)ts_comm_size(World());
  for (bool overlap : {false, true})
    for (ts_dtype dt : {TS_BF16, TS_FP16})
      for (bool tied : {false, true}) {
        Elements x = FormulaElements(tied, N, overlap);
        size_t psi = x.psi;
        const size_t formula[4] = {16 * psi, 4 * psi + 12 * psi / N, 2 * psi + 14 * psi / N,
                                   16 * psi / N};
        for (int stage = 0; stage <= 3; stage++) {
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", tied " + std::to_string(tied) +
                       ", stage " + std::to_string(stage) + ", overlap " + std::to_string(overlap));
          TrainSetup s;
          s.tied = tied;
          s.stage = stage;
          s.dtype = dt;
          s.steps = 2;
          s.overlap = overlap;
          TrainRun run = Train(World(), s);
          size_t params = stage == 3 ? 2 * psi / N : 2 * psi;
          size_t grads = stage >= 2 ? 2 * psi / N : 2 * psi;
          size_t master = stage >= 1 ? 4 * psi / N : 4 * psi;
          size_t optim = stage >= 1 ? 8 * psi / N : 8 * psi;
          for (const ts_mem_account *l : {&run.after_create, &run.at_end}) {
            EXPECT_EQ(l->current[TS_MEM_PARAMS], params);
            EXPECT_EQ(l->current[TS_MEM_GRADS], grads);
            EXPECT_EQ(l->current[TS_MEM_MASTER], master);
            EXPECT_EQ(l->current[TS_MEM_OPTIM], optim);
            EXPECT_EQ(l->current[TS_MEM_PARAMS] + l->current[TS_MEM_GRADS] +
                          l->current[TS_MEM_MASTER] + l->current[TS_MEM_OPTIM],
                      formula[stage]);
          }
          EXPECT_EQ(run.at_end.peak[TS_MEM_PARAMS],
                    params + (stage == 3 ? 2 * x.params_transient : 0));
          EXPECT_EQ(run.at_end.peak[TS_MEM_GRADS],
                    grads + (stage >= 2 ? 2 * x.grads_transient : 0));
          EXPECT_EQ(run.at_end.peak[TS_MEM_MASTER], master);
          EXPECT_EQ(run.at_end.peak[TS_MEM_OPTIM], optim);
          EXPECT_EQ(run.at_end.current[TS_MEM_COMM], 2 * (N - 1) * (x.max_unit / N));
        }
      }
}

TEST(ActivationCheckpointing, GradientsAreBitwiseIdenticalInEveryStage) {
  // A checkpointed block runs the same forward again on the same input and
  // parameters before its backward, so every gradient has the same bits.
  // On one rank the gradients are read directly; on the world the step-1
  // norms, losses and everything after three steps (parameters, m, v,
  // master) are compared. The activation ledger shows the saving (4
  // blocks: every:2 checkpoints blocks 0 and 2 and keeps one recompute
  // buffer, so it frees one block's saved bytes; all frees three).
  ts_comm *self = nullptr;
  ASSERT_EQ(ts_comm_self(&self), TS_OK);
  for (ts_dtype dt : {TS_FP32, TS_BF16})
    for (int stage = 0; stage <= 3; stage++) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", stage " + std::to_string(stage));
      for (ts_comm *dp : {self, World()}) {
        TrainSetup s;
        s.stage = stage;
        s.dtype = dt;
        s.tied = stage % 2 == 1;
        s.layers = 4;
        TrainRun none = Train(dp, s);
        s.recompute_every = 1;
        TrainRun all = Train(dp, s);
        s.recompute_every = 2;
        TrainRun every2 = Train(dp, s);
        for (const TrainRun *r : {&all, &every2}) {
          EXPECT_TRUE(BitwiseEqual(none.grads, r->grads));
          EXPECT_TRUE(BitwiseEqual(none, *r)) << "max |diff| " << MaxAbsDiff(none, *r);
          EXPECT_EQ(none.norms, r->norms);
          EXPECT_EQ(none.losses, r->losses);
        }
        if (dp == self) {
          EXPECT_FALSE(none.grads.empty());
        }
        EXPECT_LT(all.at_end.peak[TS_MEM_ACTIVATIONS], every2.at_end.peak[TS_MEM_ACTIVATIONS]);
        EXPECT_LT(every2.at_end.peak[TS_MEM_ACTIVATIONS], none.at_end.peak[TS_MEM_ACTIVATIONS]);
      }
    }
  ts_comm_free(self);
}

TEST(ActivationCheckpointing, PredictedActivationBytesMatchTheLedger) {
  // ts_engine_activation_bytes sums the units' declared saved bytes; the
  // engine allocates activations once at create, so the measured peak of
  // the category must equal the prediction (the issue asks for 5%; the
  // plan is exact), with and without checkpointing, in every dtype.
  ts_llama_config cfg = Config(false);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (size_t every : {0, 1, 2}) {
      SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", every " + std::to_string(every));
      TrainSetup s;
      s.stage = 3;
      s.dtype = dt;
      s.recompute_every = every;
      s.steps = 1;
      TrainRun run = Train(World(), s);
      ts_engine_opts o = ts_engine_default_opts();
      o.micro_batch = s.global / (size_t)ts_comm_size(World());
      o.seq = kT;
      o.dtype = dt;
      o.recompute_every = every;
      size_t predicted = ts_engine_activation_bytes(&model, &o);
      EXPECT_EQ(run.at_end.peak[TS_MEM_ACTIVATIONS], predicted);
      EXPECT_EQ(run.at_end.current[TS_MEM_ACTIVATIONS], predicted);
    }
  ts_model_free(&model);
}

// Trains setup s on the world and checks ts_engine_plan against its ledger:
// every category's peak, what stays allocated after create and at the end,
// and the peak total, to the byte.
void ExpectPlanMatchesRun(const TrainSetup &s) {
  size_t N = (size_t)ts_comm_size(World());
  TrainRun run = Train(World(), s);
  ts_model model = MakeModel(s);
  ts_engine_opts o = OptsOf(s, N);
  ts_mem_account plan;
  ASSERT_EQ(ts_engine_plan(&model, &o, N, &plan), TS_OK) << ts_last_error();
  ts_model_free(&model);
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++) {
    SCOPED_TRACE(ts_mem_category_name((ts_mem_category)c));
    EXPECT_EQ(plan.peak[c], run.at_end.peak[c]);
    EXPECT_EQ(plan.current[c], run.at_end.current[c]);
    EXPECT_EQ(plan.current[c], run.after_create.current[c]);
  }
  EXPECT_EQ(plan.peak_total, run.at_end.peak_total);
  ts_mem_account host, disk;  // the disk's account too (offload)
  ts_model disk_model = MakeModel(s);
  ASSERT_EQ(ts_engine_plan_stage_host(&disk_model, &o, N, 0, &plan, &host, &disk), TS_OK);
  ts_model_free(&disk_model);
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++) EXPECT_EQ(disk.current[c], run.disk.current[c]);
  EXPECT_EQ(disk.current_total > 0, s.offload);
  EXPECT_GT(plan.peak[TS_MEM_PARAMS], 0u);
  EXPECT_EQ(plan.peak[TS_MEM_STAGING] > 0,
            s.async_save || s.offload_optimizer || s.offload_params);
  if (s.comm == TS_ENGINE_COMM_STAGED && N > 1)  // the staging: two slots of 2N pieces
    EXPECT_GE(plan.current[TS_MEM_COMM], ts_comm_staging_bytes((int)N, s.comm_chunk));
}

TEST(MemoryPlan, EqualsTheLedgerOfARealRunToTheByte) {
  // ts_engine_plan replays the engine's allocations on a plan ledger, so
  // every category's peak, the peak total and what stays allocated between
  // steps must equal a real run's ledger on this world size exactly: stages
  // 0-3 x fp32/bf16/fp16 x tied or not x checkpointing off or every block,
  // and gradient accumulation 2 (stages 2-3 reduce every micro-batch); the
  // staging of asynchronous saves with the tied model.
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (int stage = 0; stage <= 3; stage++)
      for (bool tied : {false, true})
        for (size_t every : {0, 1}) {
          TrainSetup s;
          s.stage = stage;
          s.dtype = dt;
          s.tied = tied;
          s.recompute_every = every;
          s.steps = 2;
          s.accum = dt == TS_BF16 ? 2 : 1;
          s.async_save = tied;  // the checkpoint staging, in half the cases
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", stage " + std::to_string(stage) +
                       ", tied " + std::to_string(tied) + ", every " + std::to_string(every) +
                       ", accum " + std::to_string(s.accum) + ", async_save " +
                       std::to_string(s.async_save));
          ExpectPlanMatchesRun(s);
          if (every == 0 && dt != TS_BF16) {  // without overlap (one gathered unit)
            s.overlap = false;
            SCOPED_TRACE("overlap off");
            ExpectPlanMatchesRun(s);
            s.overlap = true;
          }
          if (every == 1 && !tied) {  // the staged transport's host staging (CPU: device)
            s.comm = TS_ENGINE_COMM_STAGED;
            s.comm_chunk = 100 + (size_t)stage;
            SCOPED_TRACE("staged");
            ExpectPlanMatchesRun(s);
            s.comm = TS_ENGINE_COMM_AUTO;
            s.comm_chunk = 0;
          }
          if (stage == 3 && dt != TS_FP16) {  // gather-once's holds, planned too
            s.keep_gathered = true;
            SCOPED_TRACE("keep_gathered");
            ExpectPlanMatchesRun(s);
            s.keep_gathered = false;
          }
          if (every == 0 && !tied) {  // offload: the slots in memory, the file on the disk
            s.offload = true;
            SCOPED_TRACE("offload");
            ExpectPlanMatchesRun(s);
            s.offload_piece = 2048;
            ExpectPlanMatchesRun(s);
            s.offload_piece = 0;
            s.offload = false;
            s.offload_optimizer = true;  // the host path's staging
            SCOPED_TRACE("offload_optimizer");
            ExpectPlanMatchesRun(s);
            s.offload_piece = 3072;
            ExpectPlanMatchesRun(s);
            s.offload_piece = 0;
            s.offload_optimizer = false;
            if (stage == 3) {
              s.offload_params = true;
              SCOPED_TRACE("offload_params");
              ExpectPlanMatchesRun(s);
              s.offload_params = false;
            }
          }
        }
}

TEST(MemoryPlan, RejectsBadArgumentsWithTheFlag) {
  ts_llama_config cfg = Config(false);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  ts_engine_opts o = ts_engine_default_opts();
  o.seq = kT;
  ts_mem_account plan;
  EXPECT_EQ(ts_engine_plan(&model, &o, 0, &plan), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("-n 0"), std::string::npos) << ts_last_error();
  o.zero_stage = 4;
  EXPECT_EQ(ts_engine_plan(&model, &o, 2, &plan), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`zero_stage` 4"), std::string::npos)
      << ts_last_error();
  ts_model_free(&model);
}

// Unit 1 (block 0), tensor 4 (its o_proj weight): where the planted inf goes.
constexpr int kInjectUnit = 1, kInjectTensor = 4;

// ---- hybrid sharding ----------------------------------------------------------------

// Hybrid sharding on N ranks: ZeRO within groups of S = N / 2 (two
// replicas; one rank per group on two ranks), none on one rank.
int HybridS() { return ts_comm_size(World()) / 2; }

// Chunk j of count elements over n ranks, as comm.h's all-reduce cuts them.
size_t ChunkLoOf(size_t count, size_t n, size_t j) { return j * count / n; }

TEST(HybridSharding, StagesAreBitwiseIdenticalAtAFixedShardGroup) {
  // Every stage sums a gradient element in the same order: within the
  // group (rank order), then across the replicas (group order) once per
  // step, so parameters, optimizer state, losses and norms are bitwise the
  // same in stages 0-3. Against plain ZeRO on the same N the sums run in
  // another order (two rank-order sums instead of one), ~1e-7 relative:
  // parameters to 1e-4 and losses to 1e-6 relative, as in
  // WorldSizesAgreeWithOneRank.
  if (HybridS() < 1) GTEST_SKIP() << "one rank: no replicas";
  for (bool tied : {false, true}) {
    std::vector<TrainRun> runs = ExpectStagesBitwise(tied, HybridS());
    TrainSetup plain;
    plain.tied = tied;
    plain.stage = 3;
    TrainRun z3 = Train(World(), plain);
    EXPECT_LT(MaxAbsDiff(runs[3], z3), 1e-4);
    for (size_t k = 0; k < z3.losses.size(); k++) {
      EXPECT_NEAR(runs[3].losses[k], z3.losses[k], 1e-6 * z3.losses[k]) << "step " << k + 1;
      EXPECT_NEAR(runs[3].norms[k], z3.norms[k], 1e-5 * z3.norms[k]) << "step " << k + 1;
    }
  }
  // Accumulation: as in plain ZeRO, stage 1 reduces once as stage 0 does
  // (bitwise) and stage 3 reduces every micro-batch as stage 2 does.
  std::vector<TrainRun> acc = AccumulatedRuns(2, HybridS());
  EXPECT_TRUE(BitwiseEqual(acc[0], acc[1])) << "max |diff| " << MaxAbsDiff(acc[0], acc[1]);
  EXPECT_TRUE(BitwiseEqual(acc[2], acc[3])) << "max |diff| " << MaxAbsDiff(acc[2], acc[3]);
}

TEST(HybridSharding, LedgerIsTheZeroFormulasWithNEqualToSAndThePlan) {
  // Model states follow the ZeRO formulas over the group's S ranks, not N;
  // the scratch is the larger of the group's reduce-scatter ((S-1) shards
  // of the largest unit) and the replicas' all-reduce of a shard ((G-1)
  // chunks of ceil(shard / G)). The plan equals the run to the byte.
  int S = HybridS();
  if (S < 1) GTEST_SKIP() << "one rank: no replicas";
  size_t N = (size_t)ts_comm_size(World()), G = N / (size_t)S, s_ = (size_t)S;
  for (bool tied : {false, true}) {
    std::vector<size_t> P = FormulaPadded(tied, s_);
    Elements x = FormulaElements(tied, s_, true);
    size_t scratch = 4 * (s_ - 1) * (x.max_unit / s_);
    for (size_t p : P) scratch = std::max(scratch, 4 * (G - 1) * ((p / s_ + G - 1) / G));
    for (int stage = 0; stage <= 3; stage++) {
      SCOPED_TRACE("tied " + std::to_string(tied) + ", stage " + std::to_string(stage));
      TrainSetup s;
      s.tied = tied;
      s.stage = stage;
      s.steps = 2;
      s.shard_group = S;
      TrainRun run = Train(World(), s);
      EXPECT_EQ(run.padded, P);
      size_t params = stage == 3 ? 4 * x.psi / s_ : 4 * x.psi;
      size_t grads = stage >= 2 ? 4 * x.psi / s_ : 4 * x.psi;
      size_t optim = stage >= 1 ? 8 * x.psi / s_ : 8 * x.psi;
      EXPECT_EQ(run.at_end.current[TS_MEM_PARAMS], params);
      EXPECT_EQ(run.at_end.current[TS_MEM_GRADS], grads);
      EXPECT_EQ(run.at_end.current[TS_MEM_OPTIM], optim);
      EXPECT_EQ(run.at_end.current[TS_MEM_COMM], scratch);
      ExpectPlanMatchesRun(s);
    }
  }
}

TEST(HybridSharding, BytesPerStepMatchTheFormulas) {
  // Within the group: the ZeRO bytes over S ranks (reduce-scatter
  // Ψ(S-1)/S, all-gathers as the stage gathers); across the replicas: one
  // all-reduce per unit of its shard p/S (comm.h: every chunk but the own
  // one, then the own chunk to G-1 ranks) and one of the loss sum (a
  // double to G-1 ranks); the group's all-reduce of two doubles.
  int S = HybridS();
  if (S < 1) GTEST_SKIP() << "one rank: no replicas";
  size_t N = (size_t)ts_comm_size(World()), G = N / (size_t)S, s_ = (size_t)S;
  size_t g = (size_t)ts_comm_rank(World()) / s_;  // this rank's group: its place in the replicas
  std::vector<size_t> P = FormulaPadded(false, s_);
  size_t moved = 0, replicas = 0;
  for (size_t p : P) {
    moved += p - p / s_;
    size_t shard = p / s_, own = ChunkLoOf(shard, G, g + 1) - ChunkLoOf(shard, G, g);
    replicas += shard - own + (G - 1) * own;
  }
  size_t last = P.back() - P.back() / s_;
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSetup s;
    s.stage = stage;
    s.steps = 2;
    s.shard_group = S;
    TrainRun run = Train(World(), s);
    for (const ts_step_stats &st : run.stats) {
      EXPECT_EQ(st.comm.bytes[TS_COMM_REDUCE_SCATTER], 4 * moved);
      EXPECT_EQ(st.comm.bytes[TS_COMM_ALL_GATHER], 4 * (stage == 3 ? 2 * moved - last : moved));
      EXPECT_EQ(st.comm.bytes[TS_COMM_ALL_REDUCE], 4 * replicas + 8 * (G - 1) + 16 * (s_ - 1));
      EXPECT_EQ(st.comm_remote_bytes, 0u);  // one host: every rank on this node
    }
  }
}

// ---- the simulator (engine/simulate.h) ---------------------------------------------

using tiny::SimCluster;
using tiny::SimCompute;

TEST(Simulator, BytesAndCallsAreTheEnginesAndItReplaysTheEnginesSchedule) {
  // The simulator replays the engine's own step on the plan device: rank
  // 0's bytes and calls in its timed (second) step equal a real run's
  // second step, for stages 0-3 plain and hybrid; its unit ops are the
  // schedule's (forward and backward of every unit per micro-batch, a
  // recompute of each checkpointed one, AdamW per unit); and its clock is
  // the compute plus the waits.
  size_t N = (size_t)ts_comm_size(World());
  ts_sim_cluster cl = SimCluster(1e9, 1e-5);
  ts_sim_compute cp = SimCompute();
  std::vector<int> groups = {0};
  if (HybridS() >= 1) groups.push_back(HybridS());
  for (int S : groups)
    for (size_t recompute : {0, 1})
      for (int stage = 0; stage <= 3; stage++) {
        if (S != 0 && recompute) continue;
        SCOPED_TRACE("S " + std::to_string(S) + ", recompute " + std::to_string(recompute) +
                     ", stage " + std::to_string(stage));
        TrainSetup s;
        s.stage = stage;
        s.steps = 2;
        s.accum = 2;
        s.global = 16;
        s.shard_group = S;
        s.recompute_every = recompute;
        TrainRun run = Train(World(), s);
        ts_model model = MakeModel(s);
        ts_engine_opts o = OptsOf(s, N);
        ts_sim_result r{};
        ASSERT_EQ(ts_simulate(&model, &o, N, &cl, &cp, &r), TS_OK) << ts_last_error();
        int blocks = model.n_units - 2;
        ts_model_free(&model);
        uint64_t calls = 0;
        for (int k = 0; k < TS_COMM_NUM_KINDS; k++) calls += run.stats[1].comm.calls[k];
        if (ts_comm_rank(World()) == 0) {
          EXPECT_EQ(r.bytes, run.stats[1].comm_bytes);
          EXPECT_EQ(r.remote_bytes, 0u);
          EXPECT_EQ((uint64_t)r.calls, calls);
        }
        int units = blocks + 2;
        EXPECT_EQ(r.ops, 2 * (2 * units + (recompute ? blocks : 0)) + units);
        EXPECT_NEAR(r.step_s, r.compute_s + r.exposed_comm_s, 1e-12 * r.step_s);
        EXPECT_GT(r.compute_s, 0);
        EXPECT_GT(r.tokens_per_s, 0);
      }
}

TEST(Simulator, FastLinksLeaveTheComputeAndOverlapHidesSlowOnes) {
  size_t N = (size_t)ts_comm_size(World());
  if (N < 2) GTEST_SKIP() << "one rank: no communication";
  ts_model model = MakeModel(TrainSetup{});
  ts_sim_compute cp = SimCompute();
  ts_sim_cluster fast = SimCluster(1e30, 0.0), slow = SimCluster(1e8, 1e-4);
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSetup s;
    s.stage = stage;
    ts_engine_opts on = OptsOf(s, N), off = on;
    off.overlap = 0;
    ts_sim_result f{}, a{}, b{};
    ASSERT_EQ(ts_simulate(&model, &on, N, &fast, &cp, &f), TS_OK) << ts_last_error();
    // links without cost: the step is its compute (each call's 1e-30 s per byte aside)
    EXPECT_NEAR(f.step_s, f.compute_s, 1e-9 * f.step_s);
    ASSERT_EQ(ts_simulate(&model, &on, N, &slow, &cp, &a), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_simulate(&model, &off, N, &slow, &cp, &b), TS_OK) << ts_last_error();
    EXPECT_EQ(a.compute_s, f.compute_s);  // the same ops at the same rate
    // overlap moves the same bytes, but ZeRO-3 keeps the last unit gathered
    // from its forward into its backward (BytesSentPerStepMatchTheory)
    if (stage < 3)
      EXPECT_EQ(a.bytes, b.bytes);
    else
      EXPECT_LT(a.bytes, b.bytes);
    // without overlap every call is waited for whole: exposed = busy
    EXPECT_NEAR(b.exposed_comm_s, b.comm_busy_s, 1e-9 * b.comm_busy_s);
    EXPECT_LE(a.exposed_comm_s, b.exposed_comm_s);
    EXPECT_GE(a.step_s, a.compute_s);
  }
  // ZeRO-3 has a next unit's gather to hide behind each unit's compute
  TrainSetup z3;
  z3.stage = 3;
  ts_engine_opts on = OptsOf(z3, N), off = on;
  off.overlap = 0;
  ts_sim_cluster mid = SimCluster(1e9, 1e-5);
  ts_sim_result a{}, b{};
  ASSERT_EQ(ts_simulate(&model, &on, N, &mid, &cp, &a), TS_OK);
  ASSERT_EQ(ts_simulate(&model, &off, N, &mid, &cp, &b), TS_OK);
  EXPECT_LT(a.exposed_comm_s, b.exposed_comm_s);
  ts_model_free(&model);
}

// Offload (opts.offload_dir): the disk is one channel of its own. A disk
// without cost leaves the step it was without offload; a slow one is busy
// for the state's bytes at its rates — every unit's state written back
// once, read at most once (the units still in the three slots from the
// step before are not read) — and the step waits for its reads, as the
// replay's channel rule says: exposed = step - compute on one rank.
TEST(Simulator, OffloadWaitsForItsDisk) {
  size_t N = (size_t)ts_comm_size(World());
  if (N != 1) GTEST_SKIP() << "one rank: no communication beside the disk";
  ts_sim_compute cp = SimCompute();
  ts_sim_cluster cl = SimCluster(1e9, 1e-5);
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    SCOPED_TRACE(ts_dtype_name(dt));
    TrainSetup s;
    s.dtype = dt;
    ts_model model = MakeModel(s);
    ts_engine_opts plain = OptsOf(s, N);
    s.offload = true;
    ts_engine_opts off = OptsOf(s, N);
    ts_mem_account dev, host, disk;
    ASSERT_EQ(ts_engine_plan_stage_host(&model, &off, N, 0, &dev, &host, &disk), TS_OK);
    double D = (double)disk.current_total;
    ASSERT_GT(D, 0);
    ts_sim_result p{}, fast{}, slow{};
    ASSERT_EQ(ts_simulate(&model, &plain, N, &cl, &cp, &p), TS_OK) << ts_last_error();
    cp.disk_read = cp.disk_write = 1e30;
    ASSERT_EQ(ts_simulate(&model, &off, N, &cl, &cp, &fast), TS_OK) << ts_last_error();
    EXPECT_NEAR(fast.step_s, p.step_s, 1e-9 * p.step_s);
    EXPECT_EQ(fast.compute_s, p.compute_s);
    EXPECT_EQ(p.exposed_io_s, 0.0);
    EXPECT_EQ(p.io_busy_s, 0.0);
    cp.disk_read = 1e6;  // bytes/s: far slower than the compute
    cp.disk_write = 2e6;
    ASSERT_EQ(ts_simulate(&model, &off, N, &cl, &cp, &slow), TS_OK) << ts_last_error();
    EXPECT_EQ(slow.compute_s, p.compute_s);
    EXPECT_LE(slow.io_busy_s, D / cp.disk_read + D / cp.disk_write + 1e-9);
    EXPECT_GT(slow.io_busy_s, D / cp.disk_write);  // every write-back, and some reads
    EXPECT_GT(slow.exposed_io_s, 0.5 * (slow.io_busy_s - D / cp.disk_write));
    EXPECT_NEAR(slow.step_s, slow.compute_s + slow.exposed_io_s, 1e-9 * slow.step_s);
    cp.disk_read = cp.disk_write = 0;
    ts_sim_result bad{};
    EXPECT_EQ(ts_simulate(&model, &off, N, &cl, &cp, &bad), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ts_last_error()).find("expected both > 0 with `offload_dir`"),
              std::string::npos)
        << ts_last_error();
    ts_model_free(&model);
  }
}

// The optimizer state in host memory (opts.offload_optimizer): each unit's
// update is its gradient to the host and its parameters back over the
// host link (fp32: its parameters out too), AdamW at the host's memory
// rate, in place of AdamW at the device's: the step grows by exactly the
// difference summed over the units, the compute by the same, and the
// device's peak loses the state (master, optim) it no longer holds.
TEST(Simulator, OffloadedOptimizerCrossesTheHostLink) {
  size_t N = (size_t)ts_comm_size(World());
  if (N != 1) GTEST_SKIP() << "one rank: the update alone on the critical path";
  ts_sim_compute cp = SimCompute();
  ts_sim_cluster cl = SimCluster(1e9, 1e-5);
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    SCOPED_TRACE(ts_dtype_name(dt));
    TrainSetup s;
    s.dtype = dt;
    ts_model model = MakeModel(s);
    ts_engine_opts plain = OptsOf(s, N);
    s.offload_optimizer = true;
    ts_engine_opts off = OptsOf(s, N);
    cp.host_link = 2e9;
    cp.host_mem_bandwidth = 5e9;
    ts_sim_result p{}, o{};
    ASSERT_EQ(ts_simulate(&model, &plain, N, &cl, &cp, &p), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_simulate(&model, &off, N, &cl, &cp, &o), TS_OK) << ts_last_error();
    double es = (double)ts_dtype_size(dt), extra = 0.0;
    for (int u = 0; u < model.n_units; u++) {
      ts_flat_layout l;
      ASSERT_EQ(ts_engine_unit_layout(&model, u, N, &l), TS_OK);
      double n = (double)l.padded;  // stage 0: the whole unit
      extra += (dt == TS_FP32 ? 3.0 : 2.0) * es * n / cp.host_link +
               32.0 * n / cp.host_mem_bandwidth - 32.0 * n / cp.mem_bandwidth;
    }
    EXPECT_NEAR(o.step_s - p.step_s, extra, 1e-9 * o.step_s);
    EXPECT_NEAR(o.compute_s - p.compute_s, extra, 1e-9 * o.step_s);
    ts_mem_account dev;
    ASSERT_EQ(ts_engine_plan(&model, &plain, N, &dev), TS_OK);
    EXPECT_EQ(p.peak_bytes, dev.peak_total);
    EXPECT_EQ(o.peak_bytes, dev.peak_total - dev.current[TS_MEM_MASTER] - dev.current[TS_MEM_OPTIM]);
    cp.host_link = 0;
    ts_sim_result bad{};
    EXPECT_EQ(ts_simulate(&model, &off, N, &cl, &cp, &bad), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ts_last_error()).find("expected both > 0 with `offload_optimizer`"),
              std::string::npos)
        << ts_last_error();
    ts_model_free(&model);
  }
}

TEST(Simulator, AlphaBetaFormulasAsDocumented) {
  // simulate.h's formulas, p = 8, n = 8 MB, alpha 1 us, 1 GB/s within a
  // node, 2 GB/s per node across (all the arithmetic below is the header's)
  ts_sim_cluster cl = SimCluster(1e9, 1e-6);
  cl.inter = {2e9, 5e-6};
  double n = 8e6, a = 1e-6, w = 1e9;
  cl.algorithm = TS_SIM_RING;
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_GATHER, 7e6, 0, 8e6, 8, 8, 8),
                   7 * (a + n / 8 / w));
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_REDUCE, 14e6, 0, 8e6, 8, 8, 8),
                   2 * 7 * (a + n / 8 / w));
  // spanning two nodes of 4: the latency across, the slower of the intra
  // link and the group's share of the node's (all 4 ranks in it: 2 GB/s)
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_REDUCE_SCATTER, 7e6, 4e6, 8e6, 8, 4, 4),
                   7 * (5e-6 + n / 8 / w));
  // a replica group (one rank per node) of a node's 8: a share of 2/8 GB/s
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_GATHER, 7e6, 7e6, 8e6, 8, 1, 8),
                   7 * (5e-6 + n / 8 / (2e9 / 8)));
  cl.algorithm = TS_SIM_TREE;
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_REDUCE, 14e6, 0, 8e6, 8, 8, 8),
                   2 * 3 * a + 2 * n / w);
  cl.algorithm = TS_SIM_BEST;
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_REDUCE, 14e6, 0, 8e6, 8, 8, 8),
                   std::min(2 * 7 * (a + n / 8 / w), 2 * 3 * a + 2 * n / w));
  cl.algorithm =
      TS_SIM_DIRECT;  // 3 MB within at 1 GB/s, the node's 4 ranks x 4 MB across at 2 GB/s
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_GATHER, 7e6, 4e6, 8e6, 8, 4, 4),
                   5e-6 + std::max(3e6 / 1e9, 4 * 4e6 / 2e9));
  // a replica group: 1 of its ranks here, but the node's 2 send at once
  EXPECT_DOUBLE_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_REDUCE, 4e6, 4e6, 4e6, 2, 1, 2),
                   5e-6 + 2 * 4e6 / 2e9);
  EXPECT_EQ(ts_sim_call_seconds(&cl, TS_COMM_ALL_GATHER, 0, 0, 0, 1, 1, 1), 0.0);  // one rank
}

TEST(Simulator, RefusesBadInputNamingIt) {
  ts_model model = MakeModel(TrainSetup{});
  ts_engine_opts o = OptsOf(TrainSetup{}, 1);
  ts_sim_cluster cl = SimCluster(1e9, 1e-6);
  ts_sim_compute cp = SimCompute();
  ts_sim_result r{};
  cl.inter.bandwidth = 0;
  EXPECT_EQ(ts_simulate(&model, &o, 1, &cl, &cp, &r), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`inter` link 0 bytes/s"), std::string::npos)
      << ts_last_error();
  cl = SimCluster(1e9, 1e-6);
  cp.efficiency = 1.5;
  EXPECT_EQ(ts_simulate(&model, &o, 1, &cl, &cp, &r), TS_ERR_INVALID_ARGUMENT);
  cp = SimCompute();
  o.pipeline_stages = 2;
  o.pipeline_split = "5,1";  // 4 units (2 blocks), not 6
  EXPECT_EQ(ts_simulate(&model, &o, 1, &cl, &cp, &r), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("pipeline_split"), std::string::npos)
      << ts_last_error();
  ts_model_free(&model);
}

// A measured profile of equal units: forward tf, backward 2 tf per unit
// and micro-batch, no optimizer cost.
struct UniformProfile {
  std::vector<double> fwd, bwd;
  ts_sim_compute cp;
  UniformProfile(int units, double tf) : fwd(units, tf), bwd(units, 2 * tf), cp(SimCompute()) {
    cp.forward = fwd.data();
    cp.backward = bwd.data();
    cp.optimizer = 0.0;
  }
};

TEST(Simulator, SharedCoresSlowTheRanksThatHoldThem) {
  // All ranks on one machine of C cores, free links, compute tf per unit
  // and micro-batch forward, 2 tf backward. N data-parallel ranks hold
  // their cores all step (computing, or waiting together), so the step is
  // N / C times one rank's. A pipeline's stages leave their cores while
  // they wait for another stage: with P stages of equal units and M
  // micro-batches each holds a core M of its M + P - 1 slots, and the step
  // is the larger of the critical path, (M + P - 1) x a stage's
  // micro-batch, and the work over the cores, P M x a stage's micro-batch
  // / C (processors shared in time: k jobs on C < k processors each run
  // at C / k).
  TrainSetup s;
  s.layers = 6;  // 8 units: 4 + 4 or 2 x 4
  ts_model model = MakeModel(s);
  ts_sim_cluster cl = SimCluster(1e30, 0.0);
  const double tf = 1e-3;
  UniformProfile prof(model.n_units, tf);
  ts_sim_compute cp = prof.cp;
  ts_sim_result one{}, four{};
  TrainSetup t = s;
  t.global = 4;
  ts_engine_opts o1 = OptsOf(t, 1), o4 = OptsOf(t, 4);
  ASSERT_EQ(ts_simulate(&model, &o1, 1, &cl, &cp, &one), TS_OK) << ts_last_error();
  cp.shared_cores = 2;
  ASSERT_EQ(ts_simulate(&model, &o4, 4, &cl, &cp, &four), TS_OK) << ts_last_error();
  EXPECT_NEAR(four.step_s, 2.0 * one.step_s, 1e-6 * one.step_s);  // 4 ranks on 2 cores
  cp.shared_cores = 8;  // more cores than ranks: no slowdown
  ASSERT_EQ(ts_simulate(&model, &o4, 4, &cl, &cp, &four), TS_OK) << ts_last_error();
  EXPECT_NEAR(four.step_s, one.step_s, 1e-6 * one.step_s);
  for (int P : {2, 4})
    for (double C : {1.0, 2.0, 3.0}) {
      SCOPED_TRACE("P " + std::to_string(P) + ", cores " + std::to_string(C));
      const size_t M = 8;
      TrainSetup p = s;
      p.accum = M;
      p.global = M;
      ts_engine_opts o = OptsOf(p, 1);
      o.pipeline_stages = P;
      o.pipeline_split = P == 2 ? "4,4" : "2,2,2,2";
      cp.shared_cores = C;
      ts_sim_result r{};
      ASSERT_EQ(ts_simulate(&model, &o, 1, &cl, &cp, &r), TS_OK) << ts_last_error();
      double mb = (8.0 / P) * 3 * tf;  // a stage's forward and backward of a micro-batch
      double want = std::max(((double)M + P - 1) * mb, P * (double)M * mb / C);
      EXPECT_NEAR(r.step_s, want, 1e-6 * want);
    }
  cp.shared_cores = -1;
  EXPECT_EQ(ts_simulate(&model, &o1, 1, &cl, &cp, &one), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`shared_cores` -1"), std::string::npos)
      << ts_last_error();
  ts_model_free(&model);
}

TEST(Simulator, PipelineBubbleIsGPipesFormula) {
  // P stages of equal units, each unit's forward tf and backward 2 tf
  // (a profile), free links, no optimizer cost: GPipe and 1F1B both take
  // (M + P - 1)(tf + tb) per step with M micro-batches (Huang et al.,
  // "GPipe", NeurIPS 2019, §2.2: the bubble (P - 1) of M + P - 1 slots;
  // Narayanan et al., "Efficient Large-Scale Language Model Training on
  // GPU Clusters Using Megatron-LM", SC 2021, §2.2.1: 1F1B's is the same),
  // and the first stage waits (P - 1)(tf + tb) of it. The stages meet
  // only through their sends, receives and the pipeline group's
  // collectives, so the formula holds only if the replay pairs them right.
  TrainSetup s;
  s.layers = 6;  // 8 units: 4 + 4 or 2 x 4
  ts_model model = MakeModel(s);
  ts_sim_cluster cl = SimCluster(1e30, 0.0);
  const double tf = 1e-3;
  UniformProfile prof(model.n_units, tf);
  ts_sim_compute cp = prof.cp;
  for (int P : {2, 4})
    for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B})
      for (size_t M : {1, 4, 8}) {
        SCOPED_TRACE("P " + std::to_string(P) + " " + ts_schedule_kind_name(k) + " M " +
                     std::to_string(M));
        TrainSetup t = s;
        t.accum = M;
        t.global = M;
        ts_engine_opts o = OptsOf(t, 1);
        o.pipeline_stages = P;
        o.schedule = k;
        o.pipeline_split = P == 2 ? "4,4" : "2,2,2,2";
        std::vector<ts_sim_result> st(P);
        ts_sim_result r{};
        ASSERT_EQ(ts_simulate_stages(&model, &o, 1, &cl, &cp, &r, st.data()), TS_OK)
            << ts_last_error();
        double unit = (8.0 / P) * (tf + 2 * tf);  // a micro-batch's forward and backward
        EXPECT_NEAR(r.step_s, ((double)M + P - 1) * unit, 1e-9 * r.step_s);
        EXPECT_NEAR(st[0].pipeline_wait_s, (P - 1) * unit, 1e-9 * r.step_s);
        for (int q = 0; q < P; q++) {
          EXPECT_NEAR(st[q].compute_s, (double)M * unit, 1e-9 * r.step_s) << "stage " << q;
          EXPECT_NEAR(st[q].step_s, st[q].compute_s + st[q].exposed_comm_s + st[q].pipeline_wait_s,
                      1e-12 * r.step_s)
              << "stage " << q;
        }
        EXPECT_EQ(r.ops, 2 * 8 * (int)M + 8);  // forward, backward per unit and micro-batch; AdamW
        EXPECT_NEAR(r.tokens_per_s, (double)(M * o.micro_batch * o.seq) / r.step_s / P,
                    1e-9 * r.tokens_per_s);
      }
  ts_model_free(&model);
}

TEST(LossScaling, InjectedOverflowSkipsTheStepOnEveryRank) {
  // fp16, dynamic scale, window 2. The last rank plants inf in one gradient
  // element at step 2, and NaN in the embedding's. Every rank must skip
  // step 2 (parameters, m, v and master bitwise as after step 1), name the
  // tensor where backward met the overflow first (block 0's, not the
  // embedding's), halve the scale; steps 3-4 are clean and the scale
  // doubles after the second of them.
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TrainSetup s;
    s.stage = stage;
    s.dtype = TS_FP16;
    s.loss_scale_window = 2;
    s.steps = 1;
    TrainRun after1 = Train(World(), s);
    s.steps = 2;
    s.inject = {2, kInjectUnit, kInjectTensor, INFINITY};
    s.inject2 = {2, 0, 0, NAN};
    TrainRun after2 = Train(World(), s);
    s.steps = 4;
    TrainRun after4 = Train(World(), s);
    EXPECT_TRUE(BitwiseEqual(after1, after2)) << "max |diff| " << MaxAbsDiff(after1, after2);
    const ts_step_stats &skip = after4.stats[1];
    EXPECT_EQ(skip.skipped, 1);
    EXPECT_EQ(skip.overflow_unit, kInjectUnit);
    ts_llama_config cfg = Config(false);
    ts_model model{};
    ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
    EXPECT_STREQ(skip.overflow_tensor, model.units[kInjectUnit].tensors[kInjectTensor].name);
    ts_model_free(&model);
    EXPECT_FALSE(std::isfinite(skip.grad_norm));
    EXPECT_EQ(skip.step, 1) << "a skipped step does not advance AdamW's t";
    const float scales[4][2] = {{65536, 65536}, {65536, 32768}, {32768, 32768}, {32768, 65536}};
    for (int k = 0; k < 4; k++) {
      EXPECT_EQ(after4.stats[k].skipped, k == 1) << "step " << k + 1;
      EXPECT_EQ(after4.stats[k].loss_scale, scales[k][0]) << "step " << k + 1;
      EXPECT_EQ(after4.stats[k].next_loss_scale, scales[k][1]) << "step " << k + 1;
    }
    EXPECT_EQ(after4.stats[3].step, 3);
    // The same run without the inf never skips: the hook caused the skip.
    s.inject = {};
    s.inject2 = {};
    TrainRun clean = Train(World(), s);
    for (const ts_step_stats &st : clean.stats) EXPECT_EQ(st.skipped, 0);
    EXPECT_FALSE(BitwiseEqual(clean, after4));
  }
}

TEST(LossScaling, OverflowAtTheMinimumScaleStopsWithTheTensorAndHistory) {
  // Scale 4, minimum 2: the overflow at step 2 halves it to 2; the one at
  // step 3 finds it at the minimum and stops training (TS_ERR_NUMERIC on
  // every rank), naming the tensor and the scale history.
  size_t N = (size_t)ts_comm_size(World()), r = (size_t)ts_comm_rank(World());
  ts_llama_config cfg = Config(false);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = 8 / N;
  o.seq = kT;
  o.dtype = TS_FP16;
  o.loss_scale_init = 4;
  o.min_loss_scale = 2;
  o.zero_stage = 2;
  ts_engine *e = nullptr;
  ASSERT_EQ(ts_engine_create(&e, &model, &o, World()), TS_OK) << ts_last_error();
  std::vector<int32_t> in, tgt;
  std::vector<ts_status> status;
  std::vector<ts_step_stats> stats;
  std::string message;
  for (int step = 1; step <= 3; step++) {
    ts_engine_inject inj = {step, kInjectUnit, kInjectTensor, NAN};
    if (step >= 2 && r == N - 1) ts_engine_inject_nonfinite(e, &inj);
    GlobalBatch((size_t)step, 8, &in, &tgt);
    size_t first = r * o.micro_batch;
    ts_step_stats st{};
    status.push_back(
        ts_testing::Step(e, in.data() + first * kT, tgt.data() + first * kT, kLr, &st));
    stats.push_back(st);
    if (status.back() != TS_OK) message = ts_last_error();
  }
  EXPECT_EQ(status[0], TS_OK);
  EXPECT_EQ(status[1], TS_OK);
  EXPECT_EQ(stats[1].next_loss_scale, 2.0f);
  EXPECT_EQ(status[2], TS_ERR_NUMERIC);
  EXPECT_EQ(stats[2].skipped, 1);
  const char *name = model.units[kInjectUnit].tensors[kInjectTensor].name;
  EXPECT_NE(message.find(name), std::string::npos) << message;
  EXPECT_NE(message.find("minimum 2"), std::string::npos) << message;
  EXPECT_NE(message.find("step 0: 4, step 2: 2"), std::string::npos) << message;
  EXPECT_EQ(ts_engine_loss_scale(e), 2.0f);
  ts_engine_free(e);
  ts_model_free(&model);
}

}  // namespace

namespace {

// ---- BERT: the same contracts for the encoder ---------------------------------

TEST(ZeroStagesBert, BitwiseIdenticalAcrossStagesWithAndWithoutRecompute) {
  // Masked-LM batches (padding, two segments, a quarter of the text as
  // targets); every dtype, tied and untied decoder: stages 1-3 and
  // recompute of every block give the bits of stage 0 without it.
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (bool tied : {true, false}) {
      TrainSetup s;
      s.bert = true;
      s.tied = tied;
      s.dtype = dt;
      TrainRun base = Train(World(), s);
      for (int stage = 0; stage <= 3; stage++)
        for (size_t every : {0, 1}) {
          if (stage == 0 && every == 0) continue;
          SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", tied " + std::to_string(tied) +
                       ", stage " + std::to_string(stage) + ", recompute " +
                       std::to_string(every));
          s.stage = stage;
          s.recompute_every = every;
          TrainRun r = Train(World(), s);
          EXPECT_TRUE(BitwiseEqual(base, r)) << "max |diff| " << MaxAbsDiff(base, r);
          EXPECT_EQ(base.losses, r.losses);
          EXPECT_EQ(base.norms, r.norms);
        }
      // It trained: the parameters moved.
      TrainSetup s0 = s;
      s0.steps = 0;
      EXPECT_GT(MaxAbsDiff(base, Train(World(), s0)), 1e-3) << ts_dtype_name(dt);
    }
}

TEST(MemoryPlanBert, EqualsTheLedgerOfARealRunToTheByte) {
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (int stage = 0; stage <= 3; stage++)
      for (size_t every : {0, 1}) {
        TrainSetup s;
        s.bert = true;
        s.tied = true;
        s.stage = stage;
        s.dtype = dt;
        s.recompute_every = every;
        s.steps = 2;
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", stage " + std::to_string(stage) +
                     ", every " + std::to_string(every));
        ExpectPlanMatchesRun(s);
      }
}

}  // namespace

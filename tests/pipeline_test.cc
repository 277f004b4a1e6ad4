// pipeline_test.cc — pipeline stages under mpirun (2 and 4 ranks): for
// every P > 1 dividing the world, P stages x dp ranks give bitwise the
// losses, gradient norms, parameters, Adam moments and master weights of
// dp ranks without pipelining on the same micro-batches (the reference
// runs on the same process's dp group: the grid's dp groups are the
// world's consecutive blocks), for ZeRO stages 0-3, GPipe, 1F1B,
// interleaved 1F1B (v model chunks per rank) and ZB-H1 (each backward
// split into B and a deferred W), tied
// and untied, fp32 and bf16, recompute none and all, m below and above P;
// fp16 with an injected overflow skips the step on every rank of the grid;
// evaluation agrees; every rank's plan equals its ledger to the byte; bad
// splits are refused before any work. Every test is collective.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/comm_testing.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/grid.h"
#include "models/llama.h"
#include "tests/tiny_model.h"

namespace {

constexpr size_t kB = 2, kT = 8, kV = tiny::kV;

ts_llama_config Config(bool tied, size_t layers) {
  return tiny::Config("pipeline-test", tied, layers);
}

using tiny::World;

// Micro-batch mb of optimizer step `step` for dp rank r: random tokens,
// the same whatever the layout (a pure function of step, r and mb).
struct Feed {
  size_t step = 0;
  int dp_rank = 0;
  bool bert = false;  // masked-LM batches (tiny::MaskedLmBatch)
};

ts_status Fill(void *user, int mb, int32_t *in, int32_t *tgt) {
  const Feed *f = static_cast<const Feed *>(user);
  std::mt19937 g(7919u * (unsigned)f->step + 131u * (unsigned)f->dp_rank + (unsigned)mb);
  for (size_t i = 0; i < kB * kT; i++) {
    in[i] = (int32_t)(g() % kV);
    tgt[i] = i % 7 == 3 ? -100 : (int32_t)(g() % kV);  // some ignored targets
  }
  if (f->bert) tiny::MaskedLmBatch(g, in, tgt, kB, kT);
  return TS_OK;
}

struct Layout {
  int zero = 0;
  ts_schedule_kind schedule = TS_SCHEDULE_1F1B;
  bool tied = false;
  ts_dtype dtype = TS_FP32;
  size_t recompute_every = 0;
  bool keep_gathered = false;  // ZeRO-3: gather each unit once per step
  bool overlap = true;         // the pipeline's engine: collectives started ahead
  bool ref_overlap = true;     // the data-parallel reference's
  bool staged = false;         // the pipeline's engine on the host-staged transport
  size_t m = 3;  // micro-batches per step
  size_t layers = 3;
  size_t steps = 3;
  bool bert = false;  // the tiny BERT instead of the tiny LLaMA
  ts_engine_inject inject{};  // armed on the last dp rank when inject.step > 0
  const char *split = nullptr;
  int v = 1;  // model chunks per rank (the interleaved schedule)

  std::string Name(int P) const {
    char buf[160];
    snprintf(buf, sizeof buf, "%sP=%d v=%d zero=%d %s %s %s recompute=%zu m=%zu%s overlap=%d/%d",
             bert ? "bert " : "", P, v, zero, ts_schedule_kind_name(schedule),
             tied ? "tied" : "untied", ts_dtype_name(dtype), recompute_every, m,
             keep_gathered ? " gather-once" : "", (int)overlap, (int)ref_overlap);
    if (staged) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " staged");
    return buf;
  }
};

ts_engine_opts Opts(const Layout &s, int P) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = kB;
  o.seq = kT;
  o.grad_accum = s.m;
  o.dtype = s.dtype;
  o.zero_stage = s.zero;
  o.recompute_every = s.recompute_every;
  o.keep_gathered = s.keep_gathered;
  o.overlap = P > 1 ? s.overlap : s.ref_overlap;
  o.pipeline_stages = P;
  o.schedule = P > 1 ? s.schedule : TS_SCHEDULE_1F1B;
  o.virtual_stages = P > 1 ? s.v : 1;
  o.pipeline_split = P > 1 ? s.split : nullptr;
  if (P > 1 && s.staged) {
    o.comm = TS_ENGINE_COMM_STAGED;
    o.comm_chunk_bytes = 128;
  }
  return o;
}

// What a run leaves: per step loss, norm, skip; at the end this rank's
// parameters and optimizer state of the units it computes (its chunks').
struct Result {
  std::vector<double> losses, norms;
  std::vector<int> skipped;
  std::vector<std::vector<float>> params, state;
  std::vector<double> eval;  // loss sum and count of one evaluation batch
  std::vector<uint64_t> allocations;  // ts_comm_allocations() after each step
};

Result Train(const Layout &s, ts_engine *e, const ts_model &model, int dp_rank, int dp,
             const std::vector<int> &units) {
  Result r;
  if (s.inject.step > 0 && dp_rank == dp - 1) ts_engine_inject_nonfinite(e, &s.inject);
  for (size_t step = 1; step <= s.steps; step++) {
    Feed f{step, dp_rank, s.bert};
    ts_step_stats st;
    ts_status rc = ts_engine_step(e, Fill, &f, 1e-2f, &st);
    EXPECT_EQ(rc, TS_OK) << ts_last_error();
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
    r.skipped.push_back(st.skipped);
    r.allocations.push_back(ts_comm_allocations());
  }
  for (int u : units) {
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = model.units[u].tensors[i];
      std::vector<float> v(t.numel);
      EXPECT_EQ(ts_engine_get_tensor(e, t.name, v.data(), v.size()), TS_OK) << ts_last_error();
      r.params.push_back(v);
    }
    for (int which = 0; which < 3; which++) {
      size_t n;
      const float *p = ts_engine_optimizer_state(e, u, which, &n);
      if (p) r.state.emplace_back(p, p + n);
    }
  }
  std::vector<int32_t> in(kB * kT), tgt(kB * kT);
  Feed f{1000, dp_rank, s.bert};
  Fill(&f, 0, in.data(), tgt.data());
  double sum = 0;
  size_t count = 0;
  EXPECT_EQ(ts_engine_eval(e, in.data(), tgt.data(), &sum, &count), TS_OK) << ts_last_error();
  r.eval = {sum, (double)count};
  return r;
}

template <typename T>
bool Same(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && (a.empty() || memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The pipelined run on P stages against dp ranks alone, and this rank's
// plan against its ledger.
void ExpectSameAsDataParallel(const Layout &s, int P) {
  SCOPED_TRACE(s.Name(P));
  ts_model model{};
  if (s.bert) {
    model = tiny::BertModel(s.tied, s.layers);
  } else {
    ts_llama_config cfg = Config(s.tied, s.layers);
    ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK) << ts_last_error();
  }
  ts_grid grid;
  ASSERT_EQ(ts_grid_make(World(), P, &grid), TS_OK) << ts_last_error();
  int dp = grid.dp;

  ts_engine *ref = nullptr;
  ts_engine_opts ro = Opts(s, 1);
  // a staged pipeline lends its memory to its dp group: the reference then
  // needs a group of its own (one group, one owner of its buffers)
  ts_comm *ref_dp = grid.dp_group;
  if (s.staged)
    ASSERT_EQ(ts_comm_split(grid.dp_group, 0, grid.dp_rank, "ref", &ref_dp), TS_OK)
        << ts_last_error();
  ASSERT_EQ(ts_engine_create(&ref, &model, &ro, ref_dp), TS_OK) << ts_last_error();
  ts_engine *pipe = nullptr;
  ts_engine_opts po = Opts(s, P);
  ASSERT_EQ(ts_engine_create_pipeline(&pipe, &model, &po, &grid), TS_OK) << ts_last_error();
  int begin, end;
  EXPECT_EQ(ts_engine_stage_units(pipe, &begin, &end), grid.stage);
  ASSERT_EQ(ts_engine_chunks(pipe), s.v);
  std::vector<int> units;  // chunk c: virtual stage c P + s, in model order
  for (int c = 0; c < s.v; c++) {
    int b, e;
    ts_engine_chunk_units(pipe, c, &b, &e);
    ASSERT_LT(b, e);
    if (c == 0) EXPECT_EQ(b, begin);
    if (c > 0) EXPECT_GT(b, units.back());
    for (int u = b; u < e; u++) {
      EXPECT_TRUE(ts_engine_computes_unit(pipe, u));
      units.push_back(u);
    }
  }
  Result a = Train(s, ref, model, grid.dp_rank, dp, units);
  Result b = Train(s, pipe, model, grid.dp_rank, dp, units);
  EXPECT_TRUE(Same(a.losses, b.losses)) << "losses " << a.losses[0] << " vs " << b.losses[0];
  EXPECT_TRUE(Same(a.norms, b.norms)) << "norms " << a.norms[0] << " vs " << b.norms[0];
  EXPECT_EQ(a.skipped, b.skipped);
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); i++) EXPECT_TRUE(Same(a.params[i], b.params[i])) << i;
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t i = 0; i < a.state.size(); i++) EXPECT_TRUE(Same(a.state[i], b.state[i])) << i;
  EXPECT_TRUE(Same(a.eval, b.eval)) << a.eval[0] << " vs " << b.eval[0];
  if (s.inject.step > 0) {
    EXPECT_EQ(b.skipped[s.inject.step - 1], 1);
  }
  // No transport allocates inside a step after the first: sends and
  // receives between stages and the dp group's collectives take their
  // requests and host copies from their groups' pools.
  if (b.allocations.size() >= 5)
    EXPECT_EQ(b.allocations.back(), b.allocations[0]) << "comm allocated inside steps 2-5";

  ts_mem_account plan;
  ASSERT_EQ(ts_engine_plan_stage(&model, &po, (size_t)dp, grid.stage, &plan), TS_OK)
      << ts_last_error();
  const ts_mem_account *real = ts_engine_memory(pipe);
  for (int c = 0; c < TS_MEM_NUM_CATEGORIES; c++) {
    EXPECT_EQ(plan.peak[c], real->peak[c]) << "stage " << grid.stage << " category " << c;
    EXPECT_EQ(plan.current[c], real->current[c]) << "stage " << grid.stage << " category " << c;
  }
  EXPECT_EQ(plan.peak_total, real->peak_total) << "stage " << grid.stage;
  // the slots the units declare; ZB-H1's and ZB-V's W stores copy what B leaves in
  // reused buffers on top (transients the plan charges: above)
  size_t declared = ts_engine_activation_bytes_stage(&model, &po, grid.stage);
  bool splits = false;  // a unit here whose W is deferred (BERT's head and embeddings keep it)
  for (int u : units) splits |= ts_unit_splits_backward(&model, u) != 0;
  bool split = s.schedule == TS_SCHEDULE_ZB_H1 || s.schedule == TS_SCHEDULE_ZBV;
  if (split && splits)
    EXPECT_GT(real->peak[TS_MEM_ACTIVATIONS], declared) << "stage " << grid.stage;
  else
    EXPECT_EQ(declared, real->peak[TS_MEM_ACTIVATIONS]) << "stage " << grid.stage;

  ts_engine_free(pipe);
  ts_engine_free(ref);
  if (ref_dp != grid.dp_group) ts_comm_free(ref_dp);
  ts_grid_free(&grid);
  ts_model_free(&model);
}

// Every P > 1 that divides the world.
std::vector<int> Stages() {
  std::vector<int> out;
  int W = ts_comm_size(World());
  for (int P = 2; P <= W; P++)
    if (W % P == 0) out.push_back(P);
  return out;
}

TEST(Pipeline, BitwiseEqualToDataParallelForEveryZeroStageAndSchedule) {
  for (int P : Stages())
    for (int zero = 0; zero <= 3; zero++)
      for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_ZB_H1})
        for (bool tied : {false, true}) {
          Layout s;
          s.zero = zero;
          s.schedule = k;
          s.tied = tied;
          s.steps = 5;  // and no allocation inside steps 2-5
          ExpectSameAsDataParallel(s, P);
        }
}

TEST(Pipeline, Bf16AndRecomputeAndMicroBatchCounts) {
  for (int P : Stages())
    for (int zero : {0, 3})
      for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_ZB_H1}) {
        Layout s;
        s.zero = zero;
        s.schedule = k;
        s.tied = true;
        s.dtype = TS_BF16;
        s.recompute_every = 1;
        ExpectSameAsDataParallel(s, P);
        Layout one = s;  // one micro-batch: the largest bubble
        one.m = 1;
        one.dtype = TS_FP32;
        one.recompute_every = 0;
        ExpectSameAsDataParallel(one, P);
        Layout many = s;  // m > P in 1F1B's steady state, fp32, stage 2
        many.m = 6;
        many.zero = 2;
        many.dtype = TS_FP32;
        ExpectSameAsDataParallel(many, P);
      }
}

TEST(Pipeline, GatherOncePerStepThroughTheSchedules) {
  // ZeRO-3 with keep_gathered: a unit's gathered parameters held from its
  // first forward to its backward in the last micro-batch, which the
  // schedules interleave with other micro-batches' forwards (1F1B) or run
  // after all of them (GPipe); a tied head's replica on the last stage is
  // held likewise. Bitwise the data-parallel run (itself bitwise without
  // gather-once: zero_test), and the stage's plan equals its ledger.
  for (int P : Stages())
    for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_ZB_H1})
      for (bool tied : {false, true}) {
        Layout s;
        s.zero = 3;
        s.schedule = k;
        s.tied = tied;
        s.keep_gathered = true;
        s.dtype = tied ? TS_BF16 : TS_FP32;
        s.recompute_every = tied ? 1 : 0;
        ExpectSameAsDataParallel(s, P);
      }
}

TEST(Pipeline, OverlapOnAndOffAreBitwiseEqualUnderRandomDelays) {
  // The pipeline with overlap against data parallel without, and the other
  // way round, with the communication threads sleeping a random 0-300 us
  // before each call (test hook): every ZeRO stage and both schedules, fp32
  // and bf16 with recompute, tied (the head's replica) or not.
  ts_comm_testing_set_thread_delay(300, 5);
  for (int P : Stages())
    for (int zero = 0; zero <= 3; zero++)
      for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_ZB_H1}) {
        Layout s;
        s.zero = zero;
        s.schedule = k;
        s.tied = zero % 2 == 1;
        s.dtype = k == TS_SCHEDULE_GPIPE ? TS_BF16 : TS_FP32;
        s.recompute_every = k == TS_SCHEDULE_GPIPE;
        s.steps = 2;
        s.ref_overlap = false;
        ExpectSameAsDataParallel(s, P);
        s.overlap = false;
        s.ref_overlap = true;
        ExpectSameAsDataParallel(s, P);
      }
  ts_comm_testing_set_thread_delay(0, 1);
}

TEST(Pipeline, StagedTransportIsBitwiseEqualToDataParallel) {
  // The GPU path's transport on the CPU: activations, their gradients, the
  // tied head's gradient and the replica's parameters between stages, and
  // the data-parallel collectives, all staged through host copies (chunks
  // of 128 bytes per rank). Sums stay MPI's, so the pipeline equals data
  // parallel on plain MPI bit for bit, every ZeRO stage, both schedules.
  for (int P : Stages())
    for (int zero = 0; zero <= 3; zero++) {
      Layout s;
      s.zero = zero;
      s.schedule = zero % 2 ? TS_SCHEDULE_GPIPE : TS_SCHEDULE_1F1B;
      s.tied = zero >= 2;
      s.dtype = zero == 1 ? TS_BF16 : TS_FP32;
      s.overlap = zero != 3;
      s.steps = 5;  // and no allocation inside steps 2-5 (ExpectSameAsDataParallel)
      s.staged = true;
      ExpectSameAsDataParallel(s, P);
      s.schedule = TS_SCHEDULE_ZB_H1;  // and with W deferred
      ExpectSameAsDataParallel(s, P);
    }
}

TEST(Pipeline, BertBitwiseEqualToDataParallel) {
  // The encoder through the pipeline: padding and token types from the ids
  // on every stage, the tied decoder's replica on the last stage.
  for (int P : Stages())
    for (int zero : {0, 1, 2, 3})
      for (ts_dtype dt : {TS_FP32, TS_BF16}) {
        Layout s;
        s.bert = true;
        s.zero = zero;
        s.tied = zero % 2 == 0;
        s.dtype = dt;
        s.recompute_every = zero == 3 ? 1 : 0;
        ExpectSameAsDataParallel(s, P);
        s.schedule = TS_SCHEDULE_ZB_H1;  // the blocks' W deferred, the others' whole
        ExpectSameAsDataParallel(s, P);
      }
}

TEST(Pipeline, Fp16InjectedOverflowSkipsTheStepOnEveryRankOfTheGrid) {
  for (int P : Stages())
    for (int zero : {1, 3}) {
      Layout s;
      s.zero = zero;
      s.tied = true;
      s.dtype = TS_FP16;
      s.inject = {2, 1, 4, INFINITY};  // step 2, the first block's 5th tensor
      ExpectSameAsDataParallel(s, P);
      s.schedule = TS_SCHEDULE_ZB_H1;  // the seam after the block's W
      ExpectSameAsDataParallel(s, P);
    }
}

// The interleaved schedule (Narayanan et al. 2021, §2.2.2): v model
// chunks per rank, virtual stage j on rank j % P, each chunk's micro-batches
// in order, the last rank's chunk feeding rank 0's next. Every ZeRO stage,
// tied (the embedding on rank 0's first chunk, the head on the last rank's
// last) and untied, m = P and 2 P, v = 2 (and 3 on two stages): bitwise
// the data-parallel run, and each rank's plan equals its ledger (the
// slots of each chunk's micro-batches in flight).
TEST(Pipeline, InterleavedBitwiseEqualToDataParallel) {
  for (int P : Stages())
    for (int v : {2, 3}) {
      if (v == 3 && P > 2) continue;
      for (int zero = 0; zero <= 3; zero++)
        for (bool tied : {false, true}) {
          Layout s;
          s.schedule = TS_SCHEDULE_INTERLEAVED;
          s.v = v;
          s.layers = (size_t)(P * v);  // P v + 2 units: a virtual stage gets one or two
          s.zero = zero;
          s.tied = tied;
          s.m = (size_t)(zero % 2 ? 2 * P : P);
          s.steps = 5;  // and no allocation inside steps 2-5
          ExpectSameAsDataParallel(s, P);
        }
    }
}

// A chunked schedule's base layout (tied, m = 2P) with bf16 and every
// block recomputed (ZeRO 0 and 3), fp16 with an injected overflow (the
// step skipped on every rank of the grid), ZeRO-3 gathering each unit once
// per step across chunks, the host-staged transport (the GPU's) with
// overlap off, and the encoder.
void ExpectVariantsSameAsDataParallel(const Layout &s, int P) {
  for (int zero : {0, 3}) {
    Layout b = s;
    b.zero = zero;
    b.dtype = TS_BF16;
    b.recompute_every = 1;
    ExpectSameAsDataParallel(b, P);
  }
  Layout h = s;
  h.zero = 1;
  h.dtype = TS_FP16;
  h.inject = {2, 1, 4, INFINITY};
  ExpectSameAsDataParallel(h, P);
  Layout g = s;
  g.zero = 3;
  g.keep_gathered = true;
  ExpectSameAsDataParallel(g, P);
  Layout t = s;
  t.zero = 2;
  t.staged = true;
  t.overlap = false;
  ExpectSameAsDataParallel(t, P);
  Layout e = s;
  e.bert = true;
  e.zero = 2;
  ExpectSameAsDataParallel(e, P);
}

TEST(Pipeline, InterleavedWithBf16Fp16RecomputeGatherOnceStagedAndBert) {
  for (int P : Stages()) {
    Layout s;
    s.schedule = TS_SCHEDULE_INTERLEAVED;
    s.v = 2;
    s.layers = (size_t)(2 * P);
    s.m = (size_t)(2 * P);
    s.tied = true;
    ExpectVariantsSameAsDataParallel(s, P);
  }
}

// ZB-V: two chunks per rank in a V (virtual stages s and 2P - 1 - s; the
// last rank passes its first chunk's output to its second itself, rank 0
// holds the embedding and the head, so a tied head has no replica), B and
// W split. Every ZeRO stage, tied and untied, m = P and 2P, bf16 with
// recompute, fp16 with an injected overflow, gather-once, the staged
// transport, BERT: bitwise the data-parallel run, plan = ledger.
TEST(Pipeline, ZbvBitwiseEqualToDataParallel) {
  for (int P : Stages()) {
    Layout base;
    base.schedule = TS_SCHEDULE_ZBV;
    base.v = 2;
    base.layers = (size_t)(2 * P);  // 2P + 2 units: every virtual stage gets one
    for (int zero = 0; zero <= 3; zero++)
      for (bool tied : {false, true}) {
        Layout s = base;
        s.zero = zero;
        s.tied = tied;
        s.m = (size_t)(zero % 2 ? 2 * P : P);
        s.steps = zero == 0 ? 5 : 3;  // and no allocation inside steps 2-5
        ExpectSameAsDataParallel(s, P);
      }
    Layout v = base;  // bf16 and recompute, fp16, gather-once, staged, BERT
    v.tied = true;
    v.m = 3;  // not a multiple of P (ZB-V needs none)
    ExpectVariantsSameAsDataParallel(v, P);
  }
}

TEST(Pipeline, InterleavedRefusalsNameTheValues) {
  ts_llama_config cfg = Config(false, 2);  // 4 units
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK) << ts_last_error();
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = kB;
  o.seq = kT;
  o.pipeline_stages = 2;
  o.schedule = TS_SCHEDULE_INTERLEAVED;
  o.virtual_stages = 2;
  o.grad_accum = 4;
  ts_mem_account plan;
  ASSERT_EQ(ts_engine_plan_stage(&model, &o, 1, 1, &plan), TS_OK) << ts_last_error();
  struct Case {
    int P, v;
    size_t m;
    ts_schedule_kind k;
    const char *line;
  } cases[] = {
      {2, 3, 4, TS_SCHEDULE_INTERLEAVED,
       "`pipeline_stages` 2 x `virtual_stages` 3 = 6 virtual stages: expected at most 4 (the "
       "units of pipeline-test"},
      {2, 2, 3, TS_SCHEDULE_INTERLEAVED,
       "schedule interleaved: `grad_accum` 3 micro-batches on 2 pipeline stages: expected a "
       "multiple of 2"},
      {2, 1, 4, TS_SCHEDULE_INTERLEAVED,
       "schedule interleaved with `virtual_stages` 1: expected 2 to 16 model chunks per rank (1 "
       "is 1f1b)"},
      {1, 2, 4, TS_SCHEDULE_INTERLEAVED,
       "schedule interleaved with 1 pipeline stage: expected 2 or more"},
      {2, 2, 4, TS_SCHEDULE_1F1B,
       "`virtual_stages` 2 with schedule 1f1b: expected 1 (more model chunks per rank need the "
       "interleaved schedule)"},
      {2, 17, 4, TS_SCHEDULE_INTERLEAVED, "`virtual_stages` 17: expected 1 to 16"},
      {2, 3, 4, TS_SCHEDULE_ZBV,
       "schedule zbv with `virtual_stages` 3: expected 2 (ZB-V places two model chunks per rank "
       "in a V)"},
      {1, 2, 4, TS_SCHEDULE_ZBV, "schedule zbv with 1 pipeline stage: expected 2 or more"},
      {3, 2, 4, TS_SCHEDULE_ZBV,
       "`pipeline_stages` 3 with schedule zbv = 6 virtual stages (two per stage): expected at "
       "most 4"},
      {1, 1, 4, TS_SCHEDULE_ZB_H1, "schedule zb-h1 with 1 pipeline stage: expected 2 or more"},
  };
  for (const Case &c : cases) {
    o.pipeline_stages = c.P;
    o.virtual_stages = c.v;
    o.grad_accum = c.m;
    o.schedule = c.k;
    EXPECT_EQ(ts_engine_plan_stage(&model, &o, 1, 0, &plan), TS_ERR_INVALID_ARGUMENT) << c.line;
    EXPECT_NE(std::string(ts_last_error()).find(c.line), std::string::npos) << ts_last_error();
    EXPECT_EQ(std::string(ts_last_error()).find('\n'), std::string::npos);
  }
  ts_model_free(&model);
}

TEST(Pipeline, ExplicitSplit) {
  int W = ts_comm_size(World());
  if (W % 2) return;
  Layout s;
  s.zero = 2;
  s.tied = true;
  s.layers = 3;
  s.split = "1,4";  // the embedding alone, then the blocks and the head
  ExpectSameAsDataParallel(s, 2);
  s.split = "4,1";  // the head alone on the last stage (a replica of the embedding)
  ExpectSameAsDataParallel(s, 2);
}

// The simulator (engine/simulate.h) replays each pipeline stage's own step:
// its per-stage bytes and calls equal a real pipelined run's second step on
// every stage's data-parallel rank 0, for ZeRO stages 0-3, GPipe, 1F1B
// and interleaved, tied and untied (the tied head's sends of the embedding and its
// gradient); its ops are every unit's forward and backward per micro-batch
// and one AdamW per unit over all stages; each stage's clock is its
// compute plus its waits.
TEST(Pipeline, SimulatorReplaysEveryStageWithTheEnginesBytes) {
  ts_sim_cluster cl = tiny::SimCluster(1e9, 1e-5);
  ts_sim_compute cp = tiny::SimCompute();
  for (int P : Stages())
    for (bool tied : {false, true})
      for (int zero = 0; zero <= 3; zero++)
        for (ts_schedule_kind k : {TS_SCHEDULE_GPIPE, TS_SCHEDULE_1F1B, TS_SCHEDULE_INTERLEAVED,
                                   TS_SCHEDULE_ZB_H1, TS_SCHEDULE_ZBV}) {
          Layout s;
          s.zero = zero;
          s.schedule = k;
          s.tied = tied;
          s.m = 4;
          s.steps = 2;
          if (k == TS_SCHEDULE_INTERLEAVED || k == TS_SCHEDULE_ZBV) {  // two chunks per stage
            s.v = 2;
            s.layers = (size_t)(2 * P);
          }
          SCOPED_TRACE(s.Name(P));
          ts_llama_config cfg = Config(s.tied, s.layers);
          ts_model model{};
          ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK) << ts_last_error();
          ts_grid grid;
          ASSERT_EQ(ts_grid_make(World(), P, &grid), TS_OK) << ts_last_error();
          ts_engine_opts po = Opts(s, P);
          ts_engine *pipe = nullptr;
          ASSERT_EQ(ts_engine_create_pipeline(&pipe, &model, &po, &grid), TS_OK) << ts_last_error();
          ts_step_stats st{};
          for (size_t step = 1; step <= s.steps; step++) {
            Feed f{step, grid.dp_rank, false};
            ASSERT_EQ(ts_engine_step(pipe, Fill, &f, 1e-2f, &st), TS_OK) << ts_last_error();
          }
          ts_engine_free(pipe);
          std::vector<ts_sim_result> stages(P);
          ts_sim_result r{};
          ASSERT_EQ(ts_simulate_stages(&model, &po, (size_t)grid.dp, &cl, &cp, &r, stages.data()),
                    TS_OK)
              << ts_last_error();
          const ts_sim_result &mine = stages[grid.stage];
          if (grid.dp_rank == 0) {
            uint64_t calls = 0;
            for (int c = 0; c < TS_COMM_NUM_KINDS; c++) calls += st.comm.calls[c];
            EXPECT_EQ(mine.bytes, st.comm_bytes) << "stage " << grid.stage;
            EXPECT_EQ((uint64_t)mine.calls, calls) << "stage " << grid.stage;
          }
          int units = model.n_units;  // ZB-H1: a W of every unit too (LLaMA's all split)
          bool split = k == TS_SCHEDULE_ZB_H1 || k == TS_SCHEDULE_ZBV;
          EXPECT_EQ(r.ops, (split ? 3 : 2) * units * (int)s.m + units);
          for (int q = 0; q < P; q++)
            EXPECT_NEAR(stages[q].step_s,
                        stages[q].compute_s + stages[q].exposed_comm_s + stages[q].pipeline_wait_s,
                        1e-12 * stages[q].step_s)
                << "stage " << q;
          EXPECT_GT(r.pipeline_wait_s, 0);  // the bubble
          ts_grid_free(&grid);
          ts_model_free(&model);
        }
}

TEST(Pipeline, BadSplitsAreRefusedWithOneLine) {
  ts_llama_config cfg = Config(false, 2);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK) << ts_last_error();
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = kB;
  o.seq = kT;
  std::vector<int> first(8);
  o.pipeline_stages = 5;  // 4 units
  EXPECT_EQ(ts_engine_pipeline_split(&model, &o, first.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`pipeline_stages` 5: expected 1 to 4"),
            std::string::npos)
      << ts_last_error();
  o.pipeline_stages = 2;
  o.pipeline_split = "1,2";  // covers 3 of 4
  EXPECT_EQ(ts_engine_pipeline_split(&model, &o, first.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(ts_last_error()).find('\n'), std::string::npos);
  o.pipeline_split = "0,4";
  EXPECT_EQ(ts_engine_pipeline_split(&model, &o, first.data()), TS_ERR_INVALID_ARGUMENT);
  o.pipeline_split = "2,2";
  EXPECT_EQ(ts_engine_pipeline_split(&model, &o, first.data()), TS_OK) << ts_last_error();
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(first[1], 2);
  // A plan engine for stage 0 of a 2-stage pipeline holds half the units:
  // less model state than one holding them all.
  o.pipeline_split = nullptr;
  ts_mem_account all, half;
  ts_engine_opts one = o;
  one.pipeline_stages = 1;
  ASSERT_EQ(ts_engine_plan(&model, &one, 1, &all), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_engine_plan_stage(&model, &o, 1, 0, &half), TS_OK) << ts_last_error();
  EXPECT_LT(half.peak[TS_MEM_PARAMS], all.peak[TS_MEM_PARAMS]);
  // create refuses a pipeline without its grid
  ts_engine *e = nullptr;
  EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(e, nullptr);
  ts_model_free(&model);
}

}  // namespace

// checkpoint_test.cc — checkpoints under mpirun (1, 2 and 4 ranks):
//  - resume is bitwise: N steps, save, a new engine loads and runs N more,
//    against 2N steps uninterrupted: the losses, gradient norms, every
//    parameter, master weight and Adam moment, the loss scale; for ZeRO
//    stages 0-3, fp32/bf16/fp16 (a loss scale that moves every step), with
//    and without pipelining;
//  - the reshard matrix: saved at (ZeRO stage, P) on the world, loaded at
//    every (dp in 1, 2, 4 that the world holds; ZeRO stage 0-3; P 1 or 2)
//    and saved again: the consolidated fp32 master weights and both
//    moments of every tensor are byte-identical, and a step trains on.
// Every test is collective; the folders live under $TEST_TMPDIR.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/grid.h"
#include "models/llama.h"
#include "tests/tiny_model.h"

namespace {

constexpr size_t kB = 2, kT = 8, kV = tiny::kV;
using tiny::World;

std::string TmpDir(const std::string &name) {
  const char *t = getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

struct Feed {
  size_t step = 0;
  int dp_rank = 0, dp = 1;
};

// Micro-batch mb of step `step` of dp rank r of dp: a pure function of the
// global sample, so every dp size sees the same global batch.
ts_status Fill(void *user, int mb, int32_t *in, int32_t *tgt) {
  const Feed *f = static_cast<const Feed *>(user);
  (void)mb;
  for (size_t b = 0; b < kB; b++) {
    size_t sample = (size_t)f->dp_rank * kB + b;  // one micro-batch per rank here
    std::mt19937 g(7919u * (unsigned)f->step + 131u * (unsigned)sample + (unsigned)mb * 17u);
    for (size_t t = 0; t < kT; t++) {
      in[b * kT + t] = (int32_t)(g() % kV);
      tgt[b * kT + t] = t % 7 == 3 ? -100 : (int32_t)(g() % kV);
    }
  }
  return TS_OK;
}

struct Layout {
  int zero = 0;
  ts_dtype dtype = TS_FP32;
  int P = 1;
  size_t m = 2;  // micro-batches per step
  int shard_group = 0;  // hybrid sharding: ZeRO within groups of S ranks (0: all)
  int v = 1;            // model chunks per stage (> 1: the interleaved schedule)
};

std::string Name(const Layout &l) {
  char b[96];
  snprintf(b, sizeof b, "zero%d-%s-P%d-v%d-m%zu-S%d", l.zero, ts_dtype_name(l.dtype), l.P, l.v,
           l.m, l.shard_group);
  return b;
}

ts_engine_opts Opts(const Layout &l) {
  ts_engine_opts o = ts_engine_default_opts();
  o.micro_batch = kB;
  o.seq = kT;
  o.grad_accum = l.m;
  o.dtype = l.dtype;
  o.zero_stage = l.zero;
  o.pipeline_stages = l.P;
  if (l.v > 1) {
    o.schedule = TS_SCHEDULE_INTERLEAVED;
    o.virtual_stages = l.v;
  }
  o.shard_group = l.shard_group;
  o.loss_scale_window = 1;  // fp16: the scale doubles every clean step: state that must survive
  o.loss_scale_init = 256;
  return o;
}

// An engine of layout l on a group of the world: dp ranks of P stages.
struct Trainer {
  ts_grid grid{};
  ts_comm *group = nullptr;  // the world of this layout (owned when split off)
  ts_engine *e = nullptr;
  int dp_rank = 0, dp = 1, stage = 0;
  bool own_group = false;

  Trainer(const ts_model &model, const Layout &l, ts_comm *world) {
    ts_engine_opts o = Opts(l);
    group = world;
    if (l.P > 1) {
      EXPECT_EQ(ts_grid_make(world, l.P, &grid), TS_OK) << ts_last_error();
      dp_rank = grid.dp_rank;
      dp = grid.dp;
      stage = grid.stage;
      EXPECT_EQ(ts_engine_create_pipeline(&e, &model, &o, &grid), TS_OK) << ts_last_error();
    } else {
      dp_rank = world ? ts_comm_rank(world) : 0;
      dp = world ? ts_comm_size(world) : 1;
      EXPECT_EQ(ts_engine_create(&e, &model, &o, world), TS_OK) << ts_last_error();
    }
  }
  ~Trainer() {
    ts_engine_free(e);
    if (grid.dp_group) ts_grid_free(&grid);
  }
  std::vector<double> Steps(size_t from, size_t to) {
    std::vector<double> out;
    for (size_t s = from; s <= to; s++) {
      Feed f{s, dp_rank, dp};
      ts_step_stats st;
      EXPECT_EQ(ts_engine_step(e, Fill, &f, 1e-2f, &st), TS_OK) << ts_last_error();
      out.push_back(st.loss);
      out.push_back(st.grad_norm);
      out.push_back(st.next_loss_scale);
    }
    return out;
  }
};

// Everything this rank holds of its units: parameters (get_tensor), the
// optimizer state (master, m, v), the loss scale.
std::vector<std::vector<float>> State(ts_engine *e, const ts_model &model) {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < model.n_units; u++) {
    if (!ts_engine_computes_unit(e, u)) continue;  // another stage's (or chunk's)
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = model.units[u].tensors[i];
      std::vector<float> v(t.numel);
      EXPECT_EQ(ts_engine_get_tensor(e, t.name, v.data(), v.size()), TS_OK) << ts_last_error();
      out.push_back(v);
    }
    for (int which = 0; which < 3; which++) {
      size_t n;
      const float *p = ts_engine_optimizer_state(e, u, which, &n);
      if (p) out.emplace_back(p, p + n);
    }
  }
  out.push_back({ts_engine_loss_scale(e)});
  return out;
}

bool SameBits(const std::vector<double> &a, const std::vector<double> &b) {
  return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Collective: opens, verifies (files shared over the group's ranks) and
// loads dir into e.
void Load(const std::string &dir, const ts_model &model, ts_engine *e, ts_comm *group) {
  ts_checkpoint *ck = nullptr;
  ASSERT_EQ(ts_checkpoint_open(&ck, dir.c_str(), &model), TS_OK) << ts_last_error();
  int r = group ? ts_comm_rank(group) : 0, n = group ? ts_comm_size(group) : 1;
  EXPECT_EQ(ts_checkpoint_verify(ck, r, n), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_checkpoint_load(ck, e), TS_OK) << ts_last_error();
  ts_checkpoint_close(ck);
}

void ExpectResumeBitwise(const Layout &l, bool tied) {
  SCOPED_TRACE(Name(l) + (tied ? " tied" : ""));
  ts_llama_config cfg = tiny::Config("ckpt-test", tied, 3);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  const size_t N = 2;
  std::vector<double> whole, first, second;
  std::vector<std::vector<float>> a, b;
  {
    Trainer r(model, l, World());
    whole = r.Steps(1, 2 * N);
    a = State(r.e, model);
  }
  std::string dir = TmpDir("resume-" + Name(l) + (tied ? "-tied" : ""));
  {
    Trainer r(model, l, World());
    first = r.Steps(1, N);
    ASSERT_EQ(ts_checkpoint_save(r.e, World(), dir.c_str(), nullptr, 0), TS_OK) << ts_last_error();
  }
  {
    Trainer r(model, l, World());
    Load(dir, model, r.e, World());
    second = r.Steps(N + 1, 2 * N);
    b = State(r.e, model);
  }
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_TRUE(SameBits(whole, first)) << "loss " << whole.back() << " vs " << first.back();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++)
    EXPECT_TRUE(a[i].size() == b[i].size() &&
                memcmp(a[i].data(), b[i].data(), a[i].size() * 4) == 0)
        << "state " << i;
  ts_model_free(&model);
}

TEST(Checkpoint, ResumeIsBitwiseForEveryZeroStageDtypeAndPipeline) {
  int W = ts_comm_size(World());
  for (int P : {1, 2}) {
    if (W % P) continue;
    for (int zero = 0; zero <= 3; zero++)
      for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16}) {
        Layout l;
        l.zero = zero;
        l.dtype = dt;
        l.P = P;
        ExpectResumeBitwise(l, P == 2 && zero % 2 == 1);  // tied on some pipelined ones
      }
  }
  if (W % 2 == 0)  // the interleaved schedule, two chunks per stage
    for (int zero = 0; zero <= 3; zero++) {
      Layout l;
      l.zero = zero;
      l.dtype = zero == 2 ? TS_BF16 : TS_FP32;
      l.P = 2;
      l.v = 2;
      ExpectResumeBitwise(l, zero % 2 == 0);
    }
}

// The consolidated fp32 master weights (or fp32 parameters) and moments
// of every tensor of two checkpoints, byte for byte.
void ExpectSameConsolidated(const std::string &x, const std::string &y, const ts_model &model) {
  ts_checkpoint *a = nullptr, *b = nullptr;
  ASSERT_EQ(ts_checkpoint_open(&a, x.c_str(), &model), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_checkpoint_open(&b, y.c_str(), &model), TS_OK) << ts_last_error();
  ts_checkpoint_info ia, ib;
  ts_checkpoint_get_info(a, &ia);
  ts_checkpoint_get_info(b, &ib);
  for (int u = 0; u < model.n_units; u++)
    for (int i = 0; i < model.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = model.units[u].tensors[i];
      for (ts_checkpoint_kind k :
           {TS_CHECKPOINT_MASTER, TS_CHECKPOINT_EXP_AVG, TS_CHECKPOINT_EXP_AVG_SQ}) {
        std::vector<float> va(t.numel), vb(t.numel);
        ts_checkpoint_kind ka =
            k == TS_CHECKPOINT_MASTER && !strcmp(ia.dtype, "fp32") ? TS_CHECKPOINT_PARAM : k;
        ts_checkpoint_kind kb =
            k == TS_CHECKPOINT_MASTER && !strcmp(ib.dtype, "fp32") ? TS_CHECKPOINT_PARAM : k;
        ASSERT_EQ(ts_checkpoint_read_tensor(a, t.name, ka, va.data(), va.size()), TS_OK)
            << ts_last_error();
        ASSERT_EQ(ts_checkpoint_read_tensor(b, t.name, kb, vb.data(), vb.size()), TS_OK)
            << ts_last_error();
        EXPECT_EQ(memcmp(va.data(), vb.data(), va.size() * 4), 0)
            << t.name << " " << ts_checkpoint_kind_name(k);
      }
    }
  ts_checkpoint_close(a);
  ts_checkpoint_close(b);
}

TEST(Checkpoint, HybridShardingResumesBitwiseAndReshardsToAndFromPlainZero) {
  // Hybrid sharding saves what plain ZeRO over its S ranks would (the first
  // shard group writes; the replicas hold the same bits): it resumes
  // bitwise, and loads into plain ZeRO and other S (and back), the
  // consolidated master weights and moments byte-identical after a re-save.
  int W = ts_comm_size(World());
  if (W < 2) GTEST_SKIP() << "one rank: no replicas";
  for (int zero : {1, 3}) {
    Layout l;
    l.zero = zero;
    l.shard_group = W / 2;
    ExpectResumeBitwise(l, true);
  }
  ts_llama_config cfg = tiny::Config("ckpt-hybrid", true, 3);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  // (saved S, loaded S) over the world: 0 is plain ZeRO over all W ranks.
  std::vector<std::pair<int, int>> moves = {{W / 2, 0}, {0, W / 2}, {W / 2, W}, {W / 2, 1}};
  if (W >= 4) moves.push_back({1, 2});
  for (auto [from, to] : moves) {
    SCOPED_TRACE("S " + std::to_string(from) + " -> " + std::to_string(to));
    Layout a, b;
    a.zero = 3;
    a.shard_group = from;
    b.zero = 2;
    b.shard_group = to;
    std::string src = TmpDir("hybrid-src"), out = TmpDir("hybrid-out");
    {
      Trainer r(model, a, World());
      r.Steps(1, 2);
      ASSERT_EQ(ts_checkpoint_save(r.e, World(), src.c_str(), nullptr, 0), TS_OK)
          << ts_last_error();
    }
    {
      Trainer r(model, b, World());
      Load(src, model, r.e, World());
      ASSERT_EQ(ts_checkpoint_save(r.e, World(), out.c_str(), nullptr, 0), TS_OK)
          << ts_last_error();
      std::vector<double> more = r.Steps(3, 3);  // and it trains on
      EXPECT_TRUE(std::isfinite(more[0]) && more[0] > 0 && more[0] < 2 * std::log(kV));
    }
    if (ts_comm_rank(World()) == 0) ExpectSameConsolidated(src, out, model);
    ASSERT_EQ(ts_comm_barrier(World()), TS_OK);
  }
  ts_model_free(&model);
}

TEST(Checkpoint, ReshardsAcrossDataParallelSizesZeroStagesAndPipelines) {
  int W = ts_comm_size(World()), rank = ts_comm_rank(World());
  ts_llama_config cfg = tiny::Config("ckpt-reshard", true, 3);
  ts_model model{};
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  for (int P : {1, 2, 3}) {  // 3: two stages of two model chunks (interleaved)
    if (W % (P == 3 ? 2 : P)) continue;
    for (int zero = 0; zero <= 3; zero++) {
      Layout saved;
      saved.zero = zero;
      saved.P = P == 3 ? 2 : P;
      saved.v = P == 3 ? 2 : 1;
      saved.dtype = zero == 1 ? TS_BF16 : TS_FP32;
      std::string src = TmpDir("reshard-src-" + Name(saved));
      {
        Trainer r(model, saved, World());
        r.Steps(1, 2);
        ASSERT_EQ(ts_checkpoint_save(r.e, World(), src.c_str(), nullptr, 0), TS_OK)
            << ts_last_error();
      }
      // Every target: dp in {1, 2, 4} inside the world (groups of dp ranks
      // split off), every ZeRO stage, P 1 or 2 (or 2 interleaved: P2 = 3)
      // on the whole world.
      for (int dp : {1, 2, 4})
        for (int P2 : {1, 2, 3})
          for (int z2 = 0; z2 <= 3; z2++) {
            int group_size = dp * (P2 == 3 ? 2 : P2);
            if (group_size > W || W % group_size) continue;
            if (P2 == 3 && z2 % 2) continue;  // ZeRO 0 and 2 into the interleaved layout
            Layout to;
            to.zero = z2;
            to.P = P2 == 3 ? 2 : P2;
            to.v = P2 == 3 ? 2 : 1;
            to.dtype = z2 == 2 ? TS_BF16 : TS_FP32;  // a dtype change on the way too
            SCOPED_TRACE(Name(saved) + " -> dp" + std::to_string(dp) + " " + Name(to));
            ts_comm *group = nullptr;
            ASSERT_EQ(ts_comm_split(World(), rank / group_size, rank, "reshard", &group), TS_OK);
            std::string out = TmpDir("reshard-out-" + std::to_string(rank / group_size));
            {
              Trainer r(model, to, group);
              Load(src, model, r.e, group);
              ASSERT_EQ(ts_checkpoint_save(r.e, group, out.c_str(), nullptr, 0), TS_OK)
                  << ts_last_error();
              std::vector<double> more = r.Steps(3, 3);  // and it trains on
              EXPECT_TRUE(std::isfinite(more[0]) && more[0] > 0 && more[0] < 2 * std::log(kV));
            }
            if (ts_comm_rank(group) == 0) ExpectSameConsolidated(src, out, model);
            ts_comm_free(group);
            ASSERT_EQ(ts_comm_barrier(World()), TS_OK);
          }
    }
  }
  ts_model_free(&model);
}

}  // namespace

// trainer_test.cc — a whole training run on generated shards: the metrics
// file, the falling loss, evaluation records, and bad input before any work.
#include "engine/trainer.h"

#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cmath>
#include <dirent.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <algorithm>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "engine/tensorboard_testing.h"
#include "engine/token_file.h"
#include "engine/train_fixture.h"
#include "models/model.h"

namespace {

using ts_test::MakeConfig;
using ts_test::MakeData;
using ts_test::Num;
using ts_test::ReadLines;
using ts_test::TestTmpDir;

TEST(Trainer, RunWritesMetricsAndLearns) {
  const size_t V = 64;
  std::string data = MakeData(V), model = MakeConfig(V, 64);
  std::string metrics = TestTmpDir() + "/metrics.jsonl";
  ts_train_config c = ts_train_default_config();
  c.model = model.c_str();
  c.data_dir = data.c_str();
  c.steps = 60;
  c.warmup = 5;
  c.lr = 1e-2f;
  c.engine.micro_batch = 4;
  c.engine.seq = 32;
  c.engine.grad_accum = 2;
  c.eval_every = 20;
  c.eval_batches = 4;
  c.metrics_path = metrics.c_str();
  ts_train_result r;
  ASSERT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_OK) << ts_last_error();
  std::vector<cJSON *> lines = ReadLines(metrics);
  // 60 step records + evaluations at steps 20, 40 and the end (60) + the
  // summary.
  ASSERT_EQ(lines.size(), 64u);
  int steps = 0, evals = 0;
  const cJSON *summary = cJSON_GetObjectItemCaseSensitive(lines.back(), "summary");
  ASSERT_TRUE(cJSON_IsObject(summary));
  EXPECT_EQ(Num(summary, "world_size"), 1);
  EXPECT_EQ(Num(summary, "zero_stage"), 0);
  EXPECT_EQ(Num(summary, "global_batch"), 8);
  EXPECT_EQ(Num(summary, "comm_bytes_per_step"), 0) << "one rank sends nothing";
  EXPECT_EQ(Num(cJSON_GetObjectItemCaseSensitive(summary, "params"), "unpadded"),
            (double)r.num_params);
  const cJSON *mem = cJSON_GetObjectItemCaseSensitive(summary, "mem_by_rank");
  ASSERT_EQ(cJSON_GetArraySize(mem), 1);
  EXPECT_EQ(Num(cJSON_GetArrayItem(mem, 0), "total"), (double)r.memory.peak_total);
  EXPECT_EQ(Num(cJSON_GetArrayItem(mem, 0), "optim"), (double)r.memory.peak[TS_MEM_OPTIM]);
  // The ledger zero-fills what it allocates, so those pages were resident
  // together at its peak: the process's peak RSS cannot be smaller.
  EXPECT_GE(Num(cJSON_GetArrayItem(mem, 0), "peak_rss"), (double)r.memory.peak_total);
  EXPECT_EQ(Num(cJSON_GetArrayItem(mem, 0), "model_states"),
            (double)(r.memory.current[TS_MEM_PARAMS] + r.memory.current[TS_MEM_GRADS] +
                     r.memory.current[TS_MEM_MASTER] + r.memory.current[TS_MEM_OPTIM]));
  cJSON_Delete(lines.back());
  lines.pop_back();
  for (cJSON *o : lines) {
    if (cJSON_GetObjectItemCaseSensitive(o, "val_loss")) {
      evals++;
      EXPECT_EQ((int)Num(o, "step") % 20, 0);
    } else {
      steps++;
      EXPECT_EQ(Num(o, "step"), steps);
      EXPECT_GT(Num(o, "loss"), 0);
      EXPECT_GE(Num(o, "lr"), 0);
      EXPECT_GT(Num(o, "grad_norm"), 0);
      EXPECT_GT(Num(o, "tokens_per_s"), 0);
    }
    cJSON_Delete(o);
  }
  EXPECT_EQ(steps, 60);
  EXPECT_EQ(evals, 3);
  EXPECT_NEAR(r.first_loss, std::log(64.0), 0.1);
  // The successor pattern is learnable: the loss must fall far below ln V.
  EXPECT_LT(r.final_loss, 0.5 * r.first_loss);
  EXPECT_LT(r.final_val_loss, 0.5 * r.first_loss);
}

// train --tensorboard: one event file, every step's scalars equal the
// metrics file's (float32: relative 2^-24), the evaluations, the ledger per
// category at every step, MFU against the given peak.
TEST(Trainer, TensorBoardHasEveryScalarOfEveryStep) {
  const size_t V = 64;
  std::string data = MakeData(V), model = MakeConfig(V, 64);
  std::string dir = TestTmpDir() + "/tb", metrics = TestTmpDir() + "/tb_metrics.jsonl";
  ts_train_config c = ts_train_default_config();
  c.model = model.c_str();
  c.data_dir = data.c_str();
  c.steps = 6;
  c.engine.micro_batch = 2;
  c.engine.seq = 16;
  c.eval_every = 3;
  c.eval_batches = 2;
  c.metrics_path = metrics.c_str();
  c.tensorboard_dir = dir.c_str();
  c.peak_flops = 1e12;
  ts_train_result r;
  ASSERT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_OK) << ts_last_error();
  std::vector<std::string> files;
  DIR *d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr);
  for (dirent *e; (e = readdir(d));)
    if (std::string(e->d_name).rfind("events.out.tfevents.", 0) == 0) files.push_back(e->d_name);
  closedir(d);
  ASSERT_EQ(files.size(), 1u);
  auto sc = ts_test::Scalars(dir + "/" + files[0]);
  std::vector<cJSON *> lines = ReadLines(metrics);
  int steps = 0, evals = 0;
  for (cJSON *o : lines) {
    if (cJSON_GetObjectItemCaseSensitive(o, "summary")) {
    } else if (cJSON_GetObjectItemCaseSensitive(o, "val_loss")) {
      evals++;
      EXPECT_FLOAT_EQ(sc["val/loss"][(int64_t)Num(o, "step")], (float)Num(o, "val_loss"));
    } else {
      int64_t s = (int64_t)Num(o, "step");
      steps++;
      const char *keys[][2] = {{"train/loss", "loss"},          {"train/lr", "lr"},
                               {"train/grad_norm", "grad_norm"}, {"train/loss_scale", "loss_scale"},
                               {"perf/tokens_per_s", "tokens_per_s"}, {"perf/gflops", "gflops"}};
      for (auto &k : keys) {
        ASSERT_EQ(sc[k[0]].count(s), 1u) << k[0] << " step " << s;
        EXPECT_FLOAT_EQ(sc[k[0]][s], (float)Num(o, k[1])) << k[0] << " step " << s;
      }
      EXPECT_FLOAT_EQ(sc["perf/mfu"][s], (float)(Num(o, "gflops") * 1e9 / 1e12));
      for (int m = 0; m < TS_MEM_NUM_CATEGORIES; m++)
        EXPECT_EQ(sc[std::string("memory/") + ts_mem_category_name((ts_mem_category)m) + "_MiB"]
                      .count(s),
                  1u)
            << m << " step " << s;
    }
    cJSON_Delete(o);
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evals, 2);
  EXPECT_EQ(sc["val/loss"].size(), 2u);
  EXPECT_FLOAT_EQ(sc["memory/params_MiB"][6], (float)(r.memory.current[TS_MEM_PARAMS] / 1048576.0));
  EXPECT_FLOAT_EQ(sc["memory/peak_MiB"][6], (float)(r.memory.peak_total / 1048576.0));
}

TEST(Trainer, Fp16WithCheckpointingTracksFp32AndLogsTheLossScale) {
  // The same run in fp32 and in fp16 with dynamic loss scaling and every
  // block checkpointed. fp16 keeps 11 significant bits (u = 2^-11 = 4.9e-4):
  // activations and gradients differ from fp32 by a few u relative, and
  // over 40 steps the losses drift apart (measured max |Δloss| 3.3e-4
  // nats); 1e-2 leaves a 30x margin and still catches a wrong recompute or
  // a lost update. Adam hardly notices a gradient off by a constant factor,
  // so the loss scale is checked through the reported gradient norm, which
  // must be the unscaled one: within 2% of fp32's (measured 0.11%)
  // rather than 2^16 times larger.
  const size_t V = 64;
  std::string data = MakeData(V), model = MakeConfig(V, 64);
  std::vector<double> losses[2], norms[2];
  std::vector<double> scales;
  for (int half = 0; half < 2; half++) {
    std::string metrics = TestTmpDir() + "/metrics_fp16_" + std::to_string(half) + ".jsonl";
    ts_train_config c = ts_train_default_config();
    c.model = model.c_str();
    c.data_dir = data.c_str();
    c.steps = 40;
    c.warmup = 5;
    c.lr = 1e-2f;
    c.engine.micro_batch = 4;
    c.engine.seq = 32;
    c.eval_batches = 2;
    c.metrics_path = metrics.c_str();
    if (half) {
      c.engine.dtype = TS_FP16;
      c.engine.recompute_every = 1;
      c.engine.loss_scale_window = 10;
    }
    ts_train_result r;
    ASSERT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_OK) << ts_last_error();
    std::vector<cJSON *> lines = ReadLines(metrics);
    ASSERT_FALSE(lines.empty());
    const cJSON *summary = cJSON_GetObjectItemCaseSensitive(lines.back(), "summary");
    ASSERT_TRUE(cJSON_IsObject(summary));
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(summary, "activation_checkpointing");
    EXPECT_STREQ(cJSON_GetStringValue(ck), half ? "all" : "none");
    EXPECT_EQ(Num(summary, "activation_bytes_predicted"), (double)r.memory.peak[TS_MEM_ACTIVATIONS]);
    EXPECT_EQ(Num(summary, "skipped_steps"), (double)r.skipped_steps);
    for (cJSON *o : lines) {
      if (cJSON_GetObjectItemCaseSensitive(o, "loss_scale")) {
        losses[half].push_back(Num(o, "loss"));
        norms[half].push_back(Num(o, "grad_norm"));
        EXPECT_EQ(Num(o, "skipped"), 0);
        if (half) scales.push_back(Num(o, "loss_scale"));
        else EXPECT_EQ(Num(o, "loss_scale"), 1);
      }
      cJSON_Delete(o);
    }
  }
  ASSERT_EQ(losses[0].size(), 40u);
  ASSERT_EQ(losses[1].size(), 40u);
  double worst = 0;
  for (size_t k = 0; k < 40; k++) worst = std::fmax(worst, std::fabs(losses[0][k] - losses[1][k]));
  EXPECT_LT(worst, 1e-2);
  for (size_t k = 0; k < 40; k++)
    EXPECT_NEAR(norms[1][k], norms[0][k], 0.02 * norms[0][k]) << "step " << k + 1;
  EXPECT_GT(worst, 0) << "fp16 cannot match fp32 bitwise: the run was not in fp16";
  // Window 10, no overflow: 2^16 for steps 1-10, then doubling every 10.
  EXPECT_EQ(scales.front(), 65536);
  EXPECT_EQ(scales[10], 131072);
  EXPECT_EQ(scales.back(), 65536.0 * 8);
}

TEST(Trainer, GlobalBatchIsRanksTimesMicroBatchTimesAccumulation) {
  ts_engine_opts o = ts_engine_default_opts();
  size_t G = 0;
  o.micro_batch = 4;
  o.grad_accum = 3;
  ASSERT_EQ(ts_train_resolve_batch(2, &G, &o), TS_OK);
  EXPECT_EQ(G, 24u);
  G = 32;
  o.grad_accum = 0;  // derived
  ASSERT_EQ(ts_train_resolve_batch(4, &G, &o), TS_OK);
  EXPECT_EQ(o.grad_accum, 2u);
  G = 30;
  o.grad_accum = 0;
  EXPECT_EQ(ts_train_resolve_batch(2, &G, &o), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "`global_batch` 30: not divisible by 2 ranks x `micro_batch` 4 = 8 (it would need "
               "`grad_accum` 3.75)");
  G = 32;
  o.grad_accum = 3;
  EXPECT_EQ(ts_train_resolve_batch(2, &G, &o), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(ts_last_error(),
               "`global_batch` 32: expected 2 ranks x `micro_batch` 4 x `grad_accum` 3 = 24");
}

TEST(Trainer, BadInputFailsBeforeAnyWork) {
  const size_t V = 64;
  std::string data = MakeData(V);
  std::string metrics = TestTmpDir() + "/never.jsonl";
  std::remove(metrics.c_str());
  ts_train_config c = ts_train_default_config();
  c.data_dir = data.c_str();
  c.metrics_path = metrics.c_str();
  c.engine.micro_batch = 2;
  ts_train_result r;
  // --seq above max_position_embeddings
  std::string model = MakeConfig(V, 16);
  c.model = model.c_str();
  c.engine.seq = 32;
  EXPECT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("max_position_embeddings = 16"), std::string::npos)
      << ts_last_error();
  // a vocabulary smaller than the shard's tokens
  model = MakeConfig(32, 64);
  c.model = model.c_str();
  EXPECT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("train.bin"), std::string::npos) << ts_last_error();
  // a missing data directory
  model = MakeConfig(V, 64);
  c.model = model.c_str();
  c.data_dir = "/nonexistent-dir";
  EXPECT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("/nonexistent-dir/train.bin"), std::string::npos);
  // none of these wrote a metrics file
  EXPECT_EQ(std::fopen(metrics.c_str(), "r"), nullptr);
}

// train --trace: one complete event per span on rank 0's track. With ZeRO-3,
// recompute of every block and 2 micro-batches per step over 3 steps, each
// micro-batch has a forward and a backward of every unit, a recompute of
// every block, an all-gather before each forward and backward and a
// reduce-scatter after each backward; each step one optimizer span; spans
// on the track nest or follow each other, never overlap partly.
TEST(Trainer, TraceHasEverySpan) {
  const size_t V = 64;
  std::string data = MakeData(V), model = MakeConfig(V, 64);
  std::string trace = TestTmpDir() + "/trace.json";
  ts_train_config c = ts_train_default_config();
  c.model = model.c_str();
  c.data_dir = data.c_str();
  c.steps = 3;
  c.warmup = 1;
  c.engine.micro_batch = 2;
  c.engine.seq = 16;
  c.engine.grad_accum = 2;
  c.engine.zero_stage = 3;
  c.engine.recompute_every = 1;
  c.engine.overlap = 0; /* every collective on the step's thread, once per use */
  c.eval_batches = 1;
  c.trace_path = trace.c_str();
  ts_train_result r;
  ASSERT_EQ(ts_train_run(&c, nullptr, nullptr, &r), TS_OK) << ts_last_error();
  std::ifstream in(trace);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  cJSON *root = cJSON_Parse(text.c_str());
  ASSERT_NE(root, nullptr) << "not JSON";
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  ASSERT_TRUE(cJSON_IsArray(events));
  ts_model m{};
  ASSERT_EQ(ts_model_load(model.c_str(), &m), TS_OK);
  int units = m.n_units, blocks = 0;
  for (int u = 0; u < units; u++) blocks += m.units[u].role == TS_UNIT_BLOCK;
  ts_model_free(&m);
  std::map<std::string, int> count;
  std::map<std::string, int> per_mb[2];
  std::vector<std::pair<double, double>> spans;  // (start, end)
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    std::string ph = cJSON_GetObjectItemCaseSensitive(e, "ph")->valuestring;
    if (ph != "X") continue;
    std::string name = cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring;
    count[name]++;
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"), "mb");
    if (mb) per_mb[(int)mb->valuedouble][name]++;
    double ts = Num(e, "ts"), dur = Num(e, "dur");
    EXPECT_GE(dur, 0) << name;
    spans.emplace_back(ts, ts + dur);
  }
  const int steps = 3;
  EXPECT_EQ(count["optimizer_step"], steps);
  for (int mb = 0; mb < 2; mb++) {
    EXPECT_EQ(per_mb[mb]["forward"], steps * units) << "mb " << mb;
    EXPECT_EQ(per_mb[mb]["backward"], steps * units) << "mb " << mb;
    EXPECT_EQ(per_mb[mb]["recompute"], steps * blocks) << "mb " << mb;
    EXPECT_EQ(per_mb[mb]["reduce_scatter"], steps * units) << "mb " << mb;
    EXPECT_GE(per_mb[mb]["all_gather"], 2 * steps * units) << "mb " << mb;
  }
  // nesting: sorted by start, every span ends before the next one starts
  // or contains it whole (1 us of slack: times are whole microseconds)
  std::sort(spans.begin(), spans.end());
  std::vector<double> open_ends;
  for (const auto &s : spans) {
    while (!open_ends.empty() && open_ends.back() <= s.first) open_ends.pop_back();
    if (!open_ends.empty()) {
      EXPECT_LE(s.second, open_ends.back() + 1) << "partial overlap";
    }
    open_ends.push_back(s.second);
  }
  cJSON_Delete(root);
}

}  // namespace

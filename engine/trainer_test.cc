// trainer_test.cc — a whole training run on generated shards: the metrics
// file, the falling loss, evaluation records, and bad input before any work.
#include "engine/trainer.h"

#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/data.h"

namespace {

std::string TmpDir() {
  const char *t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// A corpus with structure a small model learns quickly: token i+1 follows
// token i (mod V), with a random restart every 17 tokens.
std::string MakeData(size_t V) {
  std::string dir = TmpDir() + "/trainer_data";
  std::string mk = "mkdir -p " + dir;
  EXPECT_EQ(std::system(mk.c_str()), 0);
  unsigned s = 7;
  auto make = [&](size_t n) {
    std::vector<uint32_t> t(n);
    for (size_t i = 0; i < n; i++) {
      s = s * 1103515245u + 12345u;
      t[i] = i % 17 == 0 ? (s >> 16) % V : (t[i - 1] + 1) % V;
    }
    return t;
  };
  std::vector<uint32_t> train = make(20000), val = make(3000);
  EXPECT_EQ(ts_shard_write((dir + "/train.bin").c_str(), train.data(), train.size(), V), TS_OK);
  EXPECT_EQ(ts_shard_write((dir + "/val.bin").c_str(), val.data(), val.size(), V), TS_OK);
  return dir;
}

std::string MakeConfig(size_t V, size_t max_pos) {
  std::string path = TmpDir() + "/trainer_config.json";
  std::ofstream f(path);
  f << "{\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
       " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": "
    << V << ", \"max_position_embeddings\": " << max_pos << ", \"rms_norm_eps\": 1e-5}";
  return path;
}

std::vector<cJSON *> ReadLines(const std::string &path) {
  std::vector<cJSON *> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    cJSON *o = cJSON_Parse(line.c_str());
    EXPECT_NE(o, nullptr) << "not JSON: " << line;
    if (o) out.push_back(o);
  }
  return out;
}

double Num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  EXPECT_TRUE(cJSON_IsNumber(v)) << k;
  return v ? v->valuedouble : -1;
}

TEST(Trainer, RunWritesMetricsAndLearns) {
  const size_t V = 64;
  std::string data = MakeData(V), model = MakeConfig(V, 64);
  std::string metrics = TmpDir() + "/metrics.jsonl";
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
  // 60 step records + evaluations at steps 20, 40 and the end (60).
  ASSERT_EQ(lines.size(), 63u);
  int steps = 0, evals = 0;
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

TEST(Trainer, BadInputFailsBeforeAnyWork) {
  const size_t V = 64;
  std::string data = MakeData(V);
  std::string metrics = TmpDir() + "/never.jsonl";
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

}  // namespace

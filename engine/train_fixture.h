// train_fixture.h — generated token shards and configs for training-run
// tests, and reading their JSON Lines metrics (test-only).
#ifndef TS_ENGINE_TRAIN_FIXTURE_H
#define TS_ENGINE_TRAIN_FIXTURE_H

#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/testing.h"
#include "engine/token_file.h"

namespace ts_test {

using ts_test::TestTmpDir;

// A corpus with structure a small model learns quickly: token i+1 follows
// token i (mod V), with a random restart every 17 tokens.
inline std::string MakeData(size_t V) {
  std::string dir = TestTmpDir() + "/trainer_data";
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
  EXPECT_EQ(ts_token_file_write((dir + "/train.bin").c_str(), train.data(), train.size(), V), TS_OK);
  EXPECT_EQ(ts_token_file_write((dir + "/val.bin").c_str(), val.data(), val.size(), V), TS_OK);
  return dir;
}

inline std::string MakeConfig(size_t V, size_t max_pos) {
  std::string path = TestTmpDir() + "/trainer_config.json";
  std::ofstream f(path);
  f << "{\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
       " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": "
    << V << ", \"max_position_embeddings\": " << max_pos << ", \"rms_norm_eps\": 1e-5}";
  return path;
}

inline std::vector<cJSON *> ReadLines(const std::string &path) {
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

inline double Num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  EXPECT_TRUE(cJSON_IsNumber(v)) << k;
  return v ? v->valuedouble : -1;
}

}  // namespace ts_test

#endif  // TS_ENGINE_TRAIN_FIXTURE_H

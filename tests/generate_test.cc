// generate_test.cc — autoregressive generation (models/generate.h) against
// transformers and against itself.
//
// - Greedy generation from the Hugging Face parity fixtures' LLaMA models
//   (untied and tied) equals LlamaForCausalLM.generate(do_sample=False)
//   token for token (fixtures/generate.json, tests/hf_parity/
//   make_generate_fixtures.py); the smallest top-2 logit gap there is
//   2.5e-3, far above fp32's differences between two implementations.
// - The key/value cache path gives the logits of recomputing the whole
//   prefix at every step (ts_generator_opts.recompute).
// - Sampling: a seed repeats, top-k and top-p cut what
//   transformers' warpers cut, draws follow the softmax.
// Built with -DTS_TEST_DEVICE=TS_DEVICE_CUDA (generate_gpu_test, tag gpu)
// the same expectations hold on the GPU.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "models/generate.h"
#include "models/model.h"
#include "models/safetensors.h"

namespace {

#ifndef TS_TEST_DEVICE
#define TS_TEST_DEVICE TS_DEVICE_CPU
#endif
const ts_device kDevice = TS_TEST_DEVICE;
const char *kDir = "tests/hf_parity/fixtures/";

std::string ReadFile(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ts_status ReadTensor(void *user, const char *name, float *dst, size_t numel) {
  ts_safetensors_tensor t{};
  TS_CHECK(ts_safetensors_find((ts_safetensors *)user, name, &t));
  if (t.numel != numel || strcmp(t.dtype, "F32"))
    return ts_set_error(TS_ERR_FORMAT, "%s: %zu %s, expected %zu F32", name, t.numel, t.dtype,
                        numel);
  memcpy(dst, t.data, numel * sizeof(float));
  return TS_OK;
}

// One fixture model and a generator over it.
struct Model {
  ts_model model{};
  ts_safetensors *st = nullptr;
  ts_generator *gen = nullptr;
  Model(const std::string &variant, size_t max_T, int recompute = 0, ts_dtype dt = TS_FP32) {
    std::string base = std::string(kDir) + "llama_" + variant;
    EXPECT_EQ(ts_model_load((base + ".config.json").c_str(), &model), TS_OK) << ts_last_error();
    EXPECT_EQ(ts_safetensors_open(&st, (base + ".safetensors").c_str()), TS_OK)
        << ts_last_error();
    ts_generator_opts o{kDevice, dt, max_T, recompute};
    EXPECT_EQ(ts_generator_create(&gen, &model, &o, ReadTensor, st), TS_OK) << ts_last_error();
  }
  ~Model() {
    ts_generator_free(gen);
    ts_safetensors_close(st);
    ts_model_free(&model);
  }
};

std::vector<int32_t> Ints(const cJSON *a) {
  std::vector<int32_t> v;
  const cJSON *x;
  cJSON_ArrayForEach(x, a) v.push_back((int32_t)x->valuedouble);
  return v;
}

class Greedy : public ::testing::TestWithParam<const char *> {};

TEST_P(Greedy, EqualsTransformersGenerate) {
  std::string text = ReadFile(std::string(kDir) + "generate.json");
  cJSON *root = cJSON_Parse(text.c_str());
  ASSERT_NE(root, nullptr) << "fixtures/generate.json";
  const cJSON *v = cJSON_GetObjectItem(root, GetParam());
  std::vector<int32_t> prompt = Ints(cJSON_GetObjectItem(v, "prompt"));
  std::vector<int32_t> want = Ints(cJSON_GetObjectItem(v, "tokens"));
  cJSON_Delete(root);
  ASSERT_EQ(prompt.size(), 8u);
  ASSERT_EQ(want.size(), 40u);
  for (int recompute = 0; recompute < 2; recompute++) {
    Model m(GetParam(), prompt.size() + want.size(), recompute);
    ASSERT_NE(m.gen, nullptr);
    ts_sampling s{0.0f, 0, 1.0f, 7};
    std::vector<int32_t> got(want.size());
    size_t n = 0;
    ASSERT_EQ(ts_generate(m.gen, prompt.data(), prompt.size(), want.size(), &s, nullptr, 0,
                          got.data(), &n, nullptr, nullptr),
              TS_OK)
        << ts_last_error();
    ASSERT_EQ(n, want.size());
    EXPECT_EQ(got, want) << (recompute ? "recomputing" : "with the cache");
  }
}

// Each step's logits with the cache equal those of the whole prefix
// recomputed: the same fp32 math, only the order of the attention and
// matrix sums differs (each logit is a sum of C = 64 products of O(1)
// terms after O(10) such layers: 1e-5 absolute is ~100 ulps of 1).
TEST_P(Greedy, CacheEqualsRecomputing) {
  const size_t T = 24;
  Model cached(GetParam(), T, 0), full(GetParam(), T, 1);
  ASSERT_NE(cached.gen, nullptr);
  ASSERT_NE(full.gen, nullptr);
  size_t V = cached.model.vocab_size;
  std::vector<float> a(V), b(V);
  std::vector<int32_t> prompt = {5, 17, 42, 3, 88};
  ASSERT_EQ(ts_generator_append(cached.gen, prompt.data(), prompt.size(), a.data()), TS_OK)
      << ts_last_error();
  ASSERT_EQ(ts_generator_append(full.gen, prompt.data(), prompt.size(), b.data()), TS_OK)
      << ts_last_error();
  for (size_t step = prompt.size(); step < T; step++) {
    float worst = 0;
    for (size_t i = 0; i < V; i++) worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LT(worst, 1e-5f) << "position " << step;
    int32_t next = (int32_t)((step * 37) % V);  // not the argmax: any ids must agree
    ASSERT_EQ(ts_generator_append(cached.gen, &next, 1, a.data()), TS_OK) << ts_last_error();
    ASSERT_EQ(ts_generator_append(full.gen, &next, 1, b.data()), TS_OK) << ts_last_error();
  }
  EXPECT_EQ(ts_generator_length(cached.gen), T);
  // Appending in pieces equals appending at once.
  Model whole(GetParam(), T, 0);
  std::vector<int32_t> seq = {5, 17, 42, 3, 88, 9, 9, 60};
  ASSERT_EQ(ts_generator_append(whole.gen, seq.data(), seq.size(), b.data()), TS_OK);
  ts_generator_reset(cached.gen);
  for (int32_t t : seq) ASSERT_EQ(ts_generator_append(cached.gen, &t, 1, a.data()), TS_OK);
  for (size_t i = 0; i < V; i++) EXPECT_NEAR(a[i], b[i], 1e-5f) << i;
}

// bf16 weights, activations and cache: the cache path against bf16
// recomputation, within bf16's rounding (2^-8 relative per stored value;
// logits O(3) after a dozen rounded layers: 0.1 absolute).
TEST_P(Greedy, Bf16CacheEqualsRecomputing) {
  const size_t T = 16;
  Model cached(GetParam(), T, 0, TS_BF16), full(GetParam(), T, 1, TS_BF16);
  ASSERT_NE(cached.gen, nullptr);
  ASSERT_NE(full.gen, nullptr);
  size_t V = cached.model.vocab_size;
  std::vector<float> a(V), b(V);
  std::vector<int32_t> seq = {5, 17, 42, 3, 88, 9, 9, 60, 1, 2, 3, 4};
  ASSERT_EQ(ts_generator_append(full.gen, seq.data(), seq.size(), b.data()), TS_OK)
      << ts_last_error();
  for (int32_t t : seq) ASSERT_EQ(ts_generator_append(cached.gen, &t, 1, a.data()), TS_OK);
  for (size_t i = 0; i < V; i++) EXPECT_NEAR(a[i], b[i], 0.1f) << i;
}

// A cache of 2 positions in bf16: the (V) logits are widened in a buffer of
// their own, not in the (max_T, C) activations, which are smaller here
// (2 x 64 x 2 bytes < 96 x 4; ASan's pass would see the overflow).
TEST_P(Greedy, Bf16ShortCacheHoldsTheLogits) {
  Model m(GetParam(), 2, 0, TS_BF16), full(GetParam(), 2, 1, TS_BF16);
  ASSERT_NE(m.gen, nullptr);
  ASSERT_NE(full.gen, nullptr);
  size_t V = m.model.vocab_size;
  std::vector<float> a(V), b(V);
  int32_t t = 7;
  ASSERT_EQ(ts_generator_append(m.gen, &t, 1, a.data()), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_generator_append(m.gen, &t, 1, a.data()), TS_OK) << ts_last_error();
  int32_t two[2] = {7, 7};
  ASSERT_EQ(ts_generator_append(full.gen, two, 2, b.data()), TS_OK) << ts_last_error();
  for (size_t i = 0; i < V; i++) EXPECT_NEAR(a[i], b[i], 0.1f) << i;  // bf16: as above
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Greedy, ::testing::Values("untied", "tied"));

TEST(Generate, SeedRepeatsAndSeedsDiffer) {
  Model m("untied", 40);
  ASSERT_NE(m.gen, nullptr);
  std::vector<int32_t> prompt = {43, 34, 66};
  auto run = [&](uint64_t seed) {
    ts_sampling s{1.0f, 0, 1.0f, seed};
    std::vector<int32_t> out(30);
    size_t n = 0;
    EXPECT_EQ(ts_generate(m.gen, prompt.data(), prompt.size(), out.size(), &s, nullptr, 0,
                          out.data(), &n, nullptr, nullptr),
              TS_OK)
        << ts_last_error();
    out.resize(n);
    return out;
  };
  std::vector<int32_t> a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);  // 30 draws from ~96 ids: equal by chance with odds ~0
}

TEST(Generate, StopsAtAStopIdAndRefusesPastTheCache) {
  Model m("tied", 20);
  ASSERT_NE(m.gen, nullptr);
  std::string text = ReadFile(std::string(kDir) + "generate.json");
  cJSON *root = cJSON_Parse(text.c_str());
  ASSERT_NE(root, nullptr);
  std::vector<int32_t> prompt = Ints(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tied"), "prompt"));
  std::vector<int32_t> want = Ints(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tied"), "tokens"));
  cJSON_Delete(root);
  ts_sampling s{0.0f, 0, 1.0f, 0};
  std::vector<int32_t> out(12);
  size_t n = 0;
  int32_t stop = want[3];  // the first position where it appears ends the run there
  size_t first = 0;
  while (want[first] != stop) first++;
  ASSERT_EQ(ts_generate(m.gen, prompt.data(), prompt.size(), out.size(), &s, &stop, 1,
                        out.data(), &n, nullptr, nullptr),
            TS_OK);
  EXPECT_EQ(n, first + 1);
  EXPECT_EQ(out[n - 1], stop);
  // 8 + 13 > 20 positions: refused before anything runs
  EXPECT_EQ(ts_generate(m.gen, prompt.data(), prompt.size(), 13, &s, nullptr, 0, out.data(), &n,
                        nullptr, nullptr),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("at most 20 positions"), std::string::npos)
      << ts_last_error();
  std::vector<float> logits(m.model.vocab_size);
  int32_t bad = 96;
  ts_generator_reset(m.gen);
  EXPECT_EQ(ts_generator_append(m.gen, &bad, 1, logits.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("token 96: expected 0..95"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(ts_generator_length(m.gen), 0u);
}

// BERT through ts_generator_forward (what `generate --fill-mask` runs):
// the logits of the fixture's row 1 alone (padded) equal transformers'
// (logits_row1_alone) within hf_parity's fp32 bound for logits, 1e-5 of
// the largest |logit|.
TEST(Generate, BertForwardEqualsTransformersLogits) {
  ts_model bert{};
  std::string base = std::string(kDir) + "bert_gelu";
  ASSERT_EQ(ts_model_load((base + ".config.json").c_str(), &bert), TS_OK) << ts_last_error();
  ts_safetensors *st = nullptr;
  ASSERT_EQ(ts_safetensors_open(&st, (base + ".safetensors").c_str()), TS_OK) << ts_last_error();
  ts_safetensors_tensor ids{}, want{};
  ASSERT_EQ(ts_safetensors_find(st, "input_ids", &ids), TS_OK);
  ASSERT_EQ(ts_safetensors_find(st, "logits_row1_alone", &want), TS_OK);
  size_t T = ids.shape[1], V = bert.vocab_size;
  std::vector<int32_t> row((const int32_t *)ids.data + T, (const int32_t *)ids.data + 2 * T);
  ts_generator *g = nullptr;
  ts_generator_opts o{kDevice, TS_FP32, T, 1};
  ASSERT_EQ(ts_generator_create(&g, &bert, &o, ReadTensor, st), TS_OK) << ts_last_error();
  std::vector<size_t> rows(T);
  for (size_t t = 0; t < T; t++) rows[t] = t;
  std::vector<float> got(T * V);
  ASSERT_EQ(ts_generator_forward(g, row.data(), T, rows.data(), T, got.data()), TS_OK)
      << ts_last_error();
  const float *ref = (const float *)want.data;
  float big = 0, worst = 0;
  for (size_t i = 0; i < T * V; i++) {
    big = std::max(big, std::fabs(ref[i]));
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
  }
  EXPECT_LT(worst, 1e-5f * big);
  size_t bad = T;
  EXPECT_EQ(ts_generator_forward(g, row.data(), T, &bad, 1, got.data()), TS_ERR_INVALID_ARGUMENT);
  ts_generator_free(g);
  ts_safetensors_close(st);
  ts_model_free(&bert);
}

TEST(Generate, AnEncoderCannotGenerate) {
  ts_model bert{};
  ASSERT_EQ(ts_model_load((std::string(kDir) + "bert_gelu.config.json").c_str(), &bert), TS_OK)
      << ts_last_error();
  ts_generator *g = nullptr;
  ts_generator_opts o{kDevice, TS_FP32, 8, 0};
  EXPECT_EQ(ts_generator_create(&g, &bert, &o, ReadTensor, nullptr), TS_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(ts_last_error()).find("needs a causal LM"), std::string::npos)
      << ts_last_error();
  EXPECT_EQ(g, nullptr);
  ts_model_free(&bert);
}

// ---- ts_sample against transformers' warpers ---------------------------------

TEST(Sample, GreedyTakesTheFirstLargest) {
  std::vector<float> x = {1, 3, 3, 2};
  uint64_t rng = 1;
  ts_sampling s{0.0f, 0, 1.0f, 0};
  EXPECT_EQ(ts_sample(x.data(), x.size(), &s, &rng), 1);
  EXPECT_EQ(rng, 1u);  // greedy draws nothing
}

// Draws follow softmax(logits / T): p(1) = 3/4 for logits {0, ln 3} at
// T = 1, and 9/10 at T = 0.5. 20000 draws: binomial sd <= 0.0031, bound 0.02.
TEST(Sample, DrawsFollowTheSoftmax) {
  for (float temp : {1.0f, 0.5f}) {
    ts_sampling s{temp, 0, 1.0f, 0};
    uint64_t rng = 42;
    int ones = 0, n = 20000;
    for (int i = 0; i < n; i++) {
      std::vector<float> x = {0.0f, std::log(3.0f)};
      ones += ts_sample(x.data(), 2, &s, &rng) == 1;
    }
    double want = temp == 1.0f ? 0.75 : 0.9;
    EXPECT_NEAR((double)ones / n, want, 0.02) << "temperature " << temp;
  }
}

TEST(Sample, TopKAndTopPCutWhatTransformersCuts) {
  // top-k = 2 of {1, 2, 3, 2}: ids 1, 2, 3 tie or beat the 2nd largest (2) and stay
  uint64_t rng = 3;
  int seen[4] = {0, 0, 0, 0};
  ts_sampling k2{1.0f, 2, 1.0f, 0};
  for (int i = 0; i < 3000; i++) {
    std::vector<float> x = {1, 2, 3, 2};
    seen[ts_sample(x.data(), 4, &k2, &rng)]++;
  }
  EXPECT_EQ(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[3], 0);
  // top-p on probabilities {0.1, 0.2, 0.7}: p = 0.75 cuts the ascending
  // cumulative 0.1 <= 0.25 (id 0), keeps 0.3 (id 1) and id 2; p = 0.5 keeps id 2 alone
  std::vector<float> base = {std::log(0.1f), std::log(0.2f), std::log(0.7f)};
  int p75[3] = {0, 0, 0}, p50[3] = {0, 0, 0};
  ts_sampling s75{1.0f, 0, 0.75f, 0}, s50{1.0f, 0, 0.5f, 0};
  for (int i = 0; i < 3000; i++) {
    std::vector<float> x = base, y = base;
    p75[ts_sample(x.data(), 3, &s75, &rng)]++;
    p50[ts_sample(y.data(), 3, &s50, &rng)]++;
  }
  EXPECT_EQ(p75[0], 0);
  EXPECT_GT(p75[1], 0);
  EXPECT_EQ(p50[0] + p50[1], 0);
}

}  // namespace

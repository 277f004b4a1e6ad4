// llama_test.cc — unit layout, init, config validation, and every unit's
// backward against central finite differences of its forward.
#include "models/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "models/llama_config.h"
#include "models/unit_testing.h"

namespace {

const char *kSmallGqa = R"({
  "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
  "max_position_embeddings": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false })";

ts_llama_config Parse(const char *json) {
  ts_llama_config c;
  EXPECT_EQ(ts_llama_config_parse(json, "test.json", &c), TS_OK) << ts_last_error();
  return c;
}

// A LLaMA model of cfg for UnitHarness.
ts_model Build(const ts_llama_config &cfg) {
  ts_model m{};
  EXPECT_EQ(ts_llama_model_init(&m, &cfg), TS_OK) << ts_last_error();
  return m;
}

void CheckUnit(const ts_llama_config &cfg, int u, unsigned seed) {
  UnitHarness h(Build(cfg), u, seed);
  std::vector<float> dx = h.Backward();
  std::vector<float> dparams = h.grads, dtied = h.tied_g;
  ExpectGradMatches(h, h.params, dparams, std::string("params of unit ") + std::to_string(u));
  if (h.model.units[u].role != TS_UNIT_EMBEDDING) ExpectGradMatches(h, h.x, dx, "dx");
  if (h.model.units[u].role == TS_UNIT_HEAD && cfg.tie_word_embeddings)
    ExpectGradMatches(h, h.tied_w, dtied, "tied embedding");
}

TEST(LlamaUnits, EmbeddingBackwardMatchesFiniteDifferences) {
  CheckUnit(Parse(kSmallGqa), 0, 1);
}

TEST(LlamaUnits, GqaBlockBackwardMatchesFiniteDifferences) { CheckUnit(Parse(kSmallGqa), 1, 2); }

TEST(LlamaUnits, MultiQueryBlockBackwardMatchesFiniteDifferences) {
  ts_llama_config c = Parse(kSmallGqa);
  c.num_key_value_heads = 1;
  CheckUnit(c, 1, 3);
}

TEST(LlamaUnits, HeadBackwardMatchesFiniteDifferences) { CheckUnit(Parse(kSmallGqa), 2, 4); }

// Zero-bubble pipelines' split (ts_unit_splits_backward): every unit's B
// under a ctx->wgrad store, then W, gives the undivided backward's dx and
// gradients bit for bit, tied head included; a store that drops its
// records leaves the gradients as B found them.
TEST(LlamaUnits, SplitBackwardIsBitwiseTheWholeBackward) {
  for (int tied = 0; tied <= 1; tied++)
    for (int u = 0; u < 3; u++) {
      SCOPED_TRACE("unit " + std::to_string(u) + (tied ? " tied" : ""));
      ts_llama_config c = Parse(kSmallGqa);
      c.tie_word_embeddings = tied;
      UnitHarness h(Build(c), u, 21 + u);
      ASSERT_TRUE(ts_unit_splits_backward(&h.model, u));
      EXPECT_GE(ExpectSplitBackwardBitwise(h), u == 1 ? 9u : 1u);  // a block: 7 linears, 2 norms
    }
}

TEST(LlamaUnits, TiedHeadBackwardMatchesFiniteDifferences) {
  ts_llama_config c = Parse(kSmallGqa);
  c.tie_word_embeddings = 1;
  CheckUnit(c, 2, 5);
}

// The bytes of the saved buffer that unit u's forward in dt really writes:
// the buffer (declared size + a guard of 256 bytes) is filled with 0xA5 and
// then with 0x5A before two identical forwards; a byte that either run
// changed was written. Returns the offset one past the last written byte
// (the high-water mark) and sets *guard_touched if the guard was written.
size_t SavedHighWater(const ts_llama_config &cfg, int u, ts_dtype dt, bool *guard_touched) {
  UnitHarness h(Build(cfg), u, 11);
  size_t es = ts_dtype_size(dt), declared = ts_unit_saved_bytes(&h.model, u, h.B, h.T, dt, TS_DEVICE_CPU);
  auto cast = [&](const std::vector<float> &v) {
    std::vector<unsigned char> out(v.size() * es + 1);
    EXPECT_EQ(ts_k_cast(&h.ctx, out.data(), dt, v.data(), TS_FP32, v.size()), TS_OK);
    return out;
  };
  std::vector<unsigned char> params = cast(h.params), x = cast(h.x), tied = cast(h.tied_w);
  std::vector<unsigned char> y(h.x.size() * es),
      ws(ts_unit_workspace_bytes(&h.model, u, h.B, h.T, dt, TS_DEVICE_CPU) + 64);
  h.ctx.workspace = (void *)(((uintptr_t)ws.data() + 63) & ~(uintptr_t)63);
  h.ctx.workspace_bytes = ws.size() - 64;
  const size_t guard = 256;
  std::vector<unsigned char> runs[2];
  const unsigned char fills[2] = {0xA5, 0x5A};
  for (int k = 0; k < 2; k++) {
    runs[k].assign(declared + guard, fills[k]);
    ts_unit_args a = h.Args(nullptr);
    a.dt = dt;
    a.x = x.data();
    a.y = y.data();
    a.saved = runs[k].data();
    if (!h.tied_w.empty()) a.tied_weight = tied.data();
    EXPECT_EQ(ts_unit_forward(&h.model, u, &h.ctx, params.data(), &a), TS_OK) << ts_last_error();
  }
  size_t high = 0;
  *guard_touched = false;
  for (size_t i = 0; i < declared + guard; i++)
    if (runs[0][i] != fills[0] || runs[1][i] != fills[1]) {
      high = i + 1;
      if (i >= declared) *guard_touched = true;
    }
  return high;
}

TEST(LlamaUnits, DeclaredSavedBytesAreWhatForwardWrites) {
  // The engine predicts activation memory from ts_unit_saved_bytes, so the
  // declaration must be what forward uses: it never writes past it, and its
  // high-water mark is within 5% of it (the only slack allowed is the
  // 64-byte alignment between the saved regions). Measured: the high-water
  // mark equals the declaration to the byte for blocks and heads in every
  // dtype (the last region, the fp32 rstd vectors, is written in full).
  for (ts_dtype dt : {TS_FP32, TS_BF16, TS_FP16})
    for (bool tied : {false, true}) {
      ts_llama_config cfg = Parse(kSmallGqa);
      cfg.tie_word_embeddings = tied;
      for (int u = 1; u <= 2; u++) {
        SCOPED_TRACE(std::string(ts_dtype_name(dt)) + ", unit " + std::to_string(u) +
                     (tied ? ", tied" : ""));
        ts_model model{};
        ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
        size_t declared = ts_unit_saved_bytes(&model, u, 2, 5, dt, TS_DEVICE_CPU);
        ts_model_free(&model);
        bool guard_touched;
        size_t high = SavedHighWater(cfg, u, dt, &guard_touched);
        EXPECT_FALSE(guard_touched) << "forward wrote past the declared " << declared << " bytes";
        EXPECT_GE((double)high, 0.95 * (double)declared) << "declared " << declared;
      }
    }
}

TEST(LlamaUnits, LayoutUsesHuggingFaceNamesInOrder) {
  ts_model m{};
  ts_llama_config c = Parse(kSmallGqa);
  ASSERT_EQ(ts_llama_model_init(&m, &c), TS_OK);
  ASSERT_EQ(m.n_units, 3);
  EXPECT_STREQ(m.units[0].tensors[0].name, "model.embed_tokens.weight");
  EXPECT_STREQ(m.units[1].tensors[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(m.units[1].tensors[2].shape[0], 8u);  // NKV * HS = 2 * 4
  EXPECT_STREQ(m.units[2].tensors[1].name, "lm_head.weight");
  size_t total = 0;
  for (int u = 0; u < m.n_units; u++) {
    size_t off = 0;
    for (int i = 0; i < m.units[u].n_tensors; i++) {
      EXPECT_EQ(m.units[u].tensors[i].offset, off);
      off += m.units[u].tensors[i].numel;
    }
    total += m.units[u].numel;
  }
  EXPECT_EQ(total, ts_llama_num_params(&c));
  ts_model_free(&m);
}

TEST(LlamaUnits, InitIsDeterministicFromSeedAndName) {
  ts_model m{};
  ts_llama_config c = Parse(kSmallGqa);
  c.num_hidden_layers = 2;
  ASSERT_EQ(ts_llama_model_init(&m, &c), TS_OK);
  std::vector<float> a(m.units[1].numel), b(m.units[1].numel), l2(m.units[2].numel);
  ts_kctx cpu{};
  cpu.device = TS_DEVICE_CPU;
  ASSERT_EQ(ts_model_init_unit(&m, 1, &cpu, a.data(), 7), TS_OK);
  ASSERT_EQ(ts_model_init_unit(&m, 1, &cpu, b.data(), 7), TS_OK);
  EXPECT_EQ(a, b);
  ASSERT_EQ(ts_model_init_unit(&m, 2, &cpu, l2.data(), 7), TS_OK);
  EXPECT_NE(std::vector<float>(a.begin() + 16, a.begin() + 32),
            std::vector<float>(l2.begin() + 16, l2.begin() + 32));  // other layer, other name
  ASSERT_EQ(ts_model_init_unit(&m, 1, &cpu, b.data(), 8), TS_OK);
  EXPECT_NE(a, b);
  EXPECT_EQ(a[0], 1.0f);  // input_layernorm starts at 1
  double s2 = 0;
  const ts_tensor_spec &q = m.units[1].tensors[1];
  for (size_t i = 0; i < q.numel; i++) s2 += (double)a[q.offset + i] * a[q.offset + i];
  // 256 samples of N(0, 0.02^2): the sample std is within ~15% of 0.02 at 3 sigma.
  EXPECT_NEAR(std::sqrt(s2 / q.numel), 0.02, 0.003);
  ts_model_free(&m);
}

TEST(LlamaUnits, SequenceLongerThanMaxPositionsIsRejected) {
  UnitHarness h(Build(Parse(kSmallGqa)), 1, 6);
  std::vector<float> y(h.x.size());
  ts_unit_args a = h.Args(&y);
  a.T = 9;  // max_position_embeddings is 8
  EXPECT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("max_position_embeddings = 8"), std::string::npos)
      << ts_last_error();
}

TEST(LlamaUnits, SmallWorkspaceIsRejected) {
  // Both passes ask for ts_unit_workspace_bytes() (the larger of the two).
  UnitHarness h(Build(Parse(kSmallGqa)), 1, 6);
  std::vector<float> y(h.x.size()), dx(h.x.size());
  ts_unit_args a = h.Args(&y);
  ASSERT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_OK);
  a.dy = h.r.data();
  a.dx = dx.data();
  h.ctx.workspace_bytes -= 1;
  EXPECT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(ts_unit_backward(&h.model, 1, &h.ctx, h.params.data(), h.grads.data(), &a),
            TS_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ts_last_error()).find("workspace"), std::string::npos);
}

TEST(LlamaUnits, EmbeddingWorkspaceCoversHalfBackward) {
  // bf16/fp16 embedding backward sorts positions in the workspace; the
  // unit's query must cover it (the unit hands the kernel all of ctx).
  ts_model model{};
  ts_llama_config cfg = Parse(kSmallGqa);
  ASSERT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
  const size_t B = 2, T = 5, N = B * T, C = cfg.hidden_size, V = cfg.vocab_size;
  EXPECT_EQ(ts_unit_workspace_bytes(&model, 0, B, T, TS_FP32, TS_DEVICE_CPU), 0u);
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {
    size_t need = ts_unit_workspace_bytes(&model, 0, B, T, dt, TS_DEVICE_CPU);
    EXPECT_EQ(need, ts_k_embedding_workspace_bytes(TS_DEVICE_CPU, N, dt));
    ASSERT_GT(need, 0u);
    std::vector<int32_t> tokens(N);
    for (size_t i = 0; i < N; i++) tokens[i] = (int32_t)(i % 3);
    std::vector<uint16_t> params(V * C, 0), grads(V * C, 0), dy(N * C, 0x3c00);  // 1.0 in fp16
    std::vector<unsigned char> ws(need + 64);
    ts_kctx ctx{};
    ctx.device = TS_DEVICE_CPU;
    ctx.workspace = (void *)(((uintptr_t)ws.data() + 63) & ~(uintptr_t)63);
    ctx.workspace_bytes = need;
    ts_unit_args a{};
    a.B = B;
    a.T = T;
    a.dt = dt;
    a.tokens = tokens.data();
    a.dy = dy.data();
    EXPECT_EQ(ts_unit_backward(&model, 0, &ctx, params.data(), grads.data(), &a), TS_OK)
        << ts_last_error();
    ctx.workspace_bytes = need - 1;
    EXPECT_EQ(ts_unit_backward(&model, 0, &ctx, params.data(), grads.data(), &a),
              TS_ERR_OUT_OF_MEMORY);
  }
  ts_model_free(&model);
}

// ---- config.json validation -------------------------------------------------

std::string ErrorOf(const char *json) {
  ts_llama_config c;
  EXPECT_NE(ts_llama_config_parse(json, "bad/config.json", &c), TS_OK);
  return ts_last_error();
}

TEST(LlamaConfig, ParsesRequiredAndDefaults) {
  ts_llama_config c = Parse(R"({"hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "max_position_embeddings": 32, "rms_norm_eps": 1e-6})");
  EXPECT_EQ(c.num_key_value_heads, 4u);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.tie_word_embeddings, 0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
}

TEST(LlamaConfig, MalformedOrIncompleteConfigsNameFileAndField) {
  EXPECT_NE(ErrorOf("{not json").find("bad/config.json: not a JSON object"), std::string::npos);
  std::string e = ErrorOf(R"({"hidden_size": 64})");
  EXPECT_NE(e.find("bad/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("\"intermediate_size\""), std::string::npos) << e;
  e = ErrorOf(R"({"hidden_size": "64", "intermediate_size": 1})");
  EXPECT_NE(e.find("\"hidden_size\" = \"64\": expected a positive integer"), std::string::npos) << e;
  e = ErrorOf(R"({"hidden_size": 60, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 8, "vocab_size": 10, "max_position_embeddings": 4,
    "rms_norm_eps": 1e-5})");
  EXPECT_NE(e.find("multiple of num_attention_heads = 8"), std::string::npos) << e;
  e = ErrorOf(R"({"hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 8, "num_key_value_heads": 3, "vocab_size": 10,
    "max_position_embeddings": 4, "rms_norm_eps": 1e-5})");
  EXPECT_NE(e.find("\"num_key_value_heads\" = 3: expected a divisor"), std::string::npos) << e;
  e = ErrorOf(R"({"hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
    "num_attention_heads": 8, "vocab_size": 10, "max_position_embeddings": 4,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": 1})");
  EXPECT_NE(e.find("expected true or false"), std::string::npos) << e;
}

TEST(LlamaConfig, SizesWhoseProductsWouldWrapAreRejected) {
  // Each size is accepted alone (up to 1e15), but V x C = 2.4e21 elements
  // would wrap size_t byte counts: one line naming the sizes, not a crash.
  std::string e = ErrorOf(R"({"hidden_size": 2400000, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 8, "vocab_size": 1000000000000000,
    "max_position_embeddings": 4, "rms_norm_eps": 1e-5})");
  EXPECT_NE(e.find("bad/config.json: hidden_size 2400000"), std::string::npos) << e;
  EXPECT_NE(e.find("expected at most 2^48"), std::string::npos) << e;
  // LLaMA-2 70B's sizes pass.
  Parse(R"({"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5})");
}

TEST(LlamaConfig, ArchitectureVariantsTesseraDoesNotComputeAreRejected) {
  const std::string base = R"({"hidden_size": 64, "intermediate_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 8, "vocab_size": 10,
    "max_position_embeddings": 4, "rms_norm_eps": 1e-5, )";
  std::string e = ErrorOf((base + R"("hidden_act": "gelu"})").c_str());
  EXPECT_NE(e.find("\"hidden_act\" = \"gelu\": expected \"silu\""), std::string::npos) << e;
  e = ErrorOf((base + R"("attention_bias": true})").c_str());
  EXPECT_NE(e.find("\"attention_bias\" = true: expected false"), std::string::npos) << e;
  e = ErrorOf((base + R"("mlp_bias": true})").c_str());
  EXPECT_NE(e.find("\"mlp_bias\""), std::string::npos) << e;
  e = ErrorOf((base + R"("pretraining_tp": 2})").c_str());
  EXPECT_NE(e.find("\"pretraining_tp\" = 2: expected 1"), std::string::npos) << e;
  e = ErrorOf((base + R"("head_dim": 16})").c_str());
  EXPECT_NE(e.find("\"head_dim\" = 16: expected hidden_size / num_attention_heads = 8"),
            std::string::npos) << e;
  e = ErrorOf((base + R"("rope_scaling": {"type": "linear", "factor": 2.0}})").c_str());
  EXPECT_NE(e.find("\"rope_scaling\""), std::string::npos) << e;
  // the supported values, and transformers 5's nested rope_parameters, load
  ts_llama_config c = Parse((base + R"("hidden_act": "silu", "attention_bias": false,
    "pretraining_tp": 1, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})")
                                .c_str());
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.0f);
}

TEST(LlamaConfig, InitRejectsAnInvalidHandBuiltConfig) {
  ts_llama_config c = Parse(kSmallGqa);
  c.num_attention_heads = 0;
  ts_model m{};
  EXPECT_EQ(ts_llama_model_init(&m, &c), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("\"num_attention_heads\" = 0"), std::string::npos)
      << ts_last_error();
}

TEST(LlamaConfig, MissingFileAndUnknownPreset) {
  ts_model m{};
  EXPECT_EQ(ts_model_load("/nonexistent/config.json", &m), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("/nonexistent/config.json"), std::string::npos);
  char path[256];
  EXPECT_EQ(ts_model_resolve("llama-nope", path, sizeof path), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("unknown preset"), std::string::npos);
  // The message names the directory it searched (TESSERA_HOME restored after).
  const char *was = getenv("TESSERA_HOME");
  std::string saved = was ? was : "";
  setenv("TESSERA_HOME", "/opt/somewhere", 1);
  EXPECT_EQ(ts_model_resolve("llama-nope", path, sizeof path), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("/opt/somewhere/models/configs/"), std::string::npos)
      << ts_last_error();
  unsetenv("TESSERA_HOME");
  EXPECT_EQ(ts_model_resolve("llama-nope", path, sizeof path), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("TESSERA_HOME is unset"), std::string::npos)
      << ts_last_error();
  if (was) setenv("TESSERA_HOME", saved.c_str(), 1);
}

TEST(LlamaConfig, PresetsLoadWithExpectedSizes) {
  // Bazel runs tests in the runfiles tree, where models/configs is a data dep.
  struct {
    const char *name;
    double min_params, max_params;
  } presets[] = {{"llama-tiny", 1e6, 6e6},        {"llama-small", 20e6, 30e6},
                 {"llama-124m", 133e6, 135e6},    {"llama-1.1b", 1.09e9, 1.11e9},
                 {"llama-2-7b", 6.6e9, 6.8e9},    {"llama-2-13b", 12.9e9, 13.1e9},
                 {"llama-2-70b", 68.9e9, 69.1e9}};
  for (const auto &p : presets) {
    char path[256];
    ASSERT_EQ(ts_model_resolve(p.name, path, sizeof path), TS_OK) << ts_last_error();
    ts_model m{};
    ASSERT_EQ(ts_model_load(path, &m), TS_OK) << ts_last_error();
    double n = (double)ts_llama_num_params(ts_llama_config_of(&m));
    EXPECT_EQ(n, (double)m.num_params) << p.name;
    EXPECT_GE(n, p.min_params) << p.name;
    EXPECT_LE(n, p.max_params) << p.name;
    ts_model_free(&m);
  }
}

}  // namespace

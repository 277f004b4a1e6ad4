// bert_test.cc — the BERT family: config.json checks (one line naming the
// file and field), the layout of Hugging Face names, every unit's backward
// against central finite differences of its forward (padding and token
// types in the batch), and the saved bytes forward really writes.
#include "models/bert.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "models/unit_testing.h"

namespace {

// Small enough for finite differences of every parameter; pad 0, sep 3.
std::string SmallConfig(const std::string &extra = "", const std::string &act = "gelu") {
  return R"({"model_type": "bert", "hidden_size": 16, "intermediate_size": 24,
  "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 13,
  "max_position_embeddings": 8, "type_vocab_size": 2, "layer_norm_eps": 1e-5,
  "hidden_act": ")" + act + R"(", "hidden_dropout_prob": 0.0,
  "attention_probs_dropout_prob": 0.0, "pad_token_id": 0, "sep_token_id": 3)" +
         extra + "}";
}

ts_model Parse(const std::string &json) {
  ts_model m{};
  EXPECT_EQ(ts_model_parse(json.c_str(), "bert.json", &m), TS_OK) << ts_last_error();
  return m;
}

// Row 0: [CLS] a a [SEP] b [SEP] (two segments); row 1: [CLS] c c [SEP]
// [PAD] [PAD] — padding whose keys attention must mask. Targets at a few
// text positions only, as masked LM gives them.
void SetBatch(UnitHarness &h) {
  ASSERT_EQ(h.B, 2u);
  ASSERT_EQ(h.T, 5u);
  h.T = 6;
  h.x.resize(h.B * h.T * h.model.hidden_size);
  h.r.resize(h.x.size());
  std::mt19937 g(7);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto &v : h.x) v = n(g);
  for (auto &v : h.r) v = n(g);
  h.tokens = {2, 7, 9, 3, 11, 3, 2, 5, 12, 3, 0, 0};
  h.targets = {-100, 8, -100, -100, 11, -100, -100, 6, 12, -100, -100, -100};
  size_t u = (size_t)h.u;
  h.saved.assign(ts_unit_saved_bytes(&h.model, (int)u, h.B, h.T, TS_FP32, TS_DEVICE_CPU) + 1, 0);
  size_t need = ts_unit_workspace_bytes(&h.model, (int)u, h.B, h.T, TS_FP32, TS_DEVICE_CPU);
  h.ws.assign(need + 64, 0);
  h.ctx.workspace = (void *)(((uintptr_t)h.ws.data() + 63) & ~(uintptr_t)63);
  h.ctx.workspace_bytes = need;
}

void CheckUnit(const std::string &json, int u, unsigned seed) {
  UnitHarness h(Parse(json), u, seed);
  SetBatch(h);
  std::vector<float> dx = h.Backward();
  std::vector<float> dparams = h.grads, dtied = h.tied_g;
  const ts_unit &un = h.model.units[u];
  if (un.role == TS_UNIT_EMBEDDING) {
    // nn.Embedding(padding_idx=0): the [PAD] row gets no gradient from the
    // lookup although row 1 reads it; every other element is checked.
    size_t C = h.model.hidden_size;
    for (size_t c = 0; c < C; c++) EXPECT_EQ(dparams[c], 0.0f) << "[PAD] row, column " << c;
    // The pad row's numeric derivative is not zero (the forward reads it):
    // HF's padding_idx rule is not the forward's derivative, so only the
    // other entries are perturbed.
    ExpectGradMatches(h, h.params, dparams, "embeddings", C);
    return;
  }
  ExpectGradMatches(h, h.params, dparams, std::string("params of unit ") + std::to_string(u));
  ExpectGradMatches(h, h.x, dx, "dx");
  if (un.tied_unit >= 0) ExpectGradMatches(h, h.tied_w, dtied, "tied word embeddings");
}

TEST(BertUnits, EmbeddingsBackwardMatchesFiniteDifferences) { CheckUnit(SmallConfig(), 0, 1); }
TEST(BertUnits, BlockBackwardMatchesFiniteDifferencesGelu) { CheckUnit(SmallConfig(), 1, 2); }
TEST(BertUnits, BlockBackwardMatchesFiniteDifferencesGeluNew) {
  CheckUnit(SmallConfig("", "gelu_new"), 1, 3);
}
TEST(BertUnits, TiedHeadBackwardMatchesFiniteDifferences) { CheckUnit(SmallConfig(), 2, 4); }

// Zero-bubble pipelines' split: a block's B under a ctx->wgrad store, then
// W, is the undivided backward bit for bit (6 linears with their biases,
// 2 LayerNorms); the embeddings and the head keep their backward whole,
// and a store given to them is refused in one line.
TEST(BertUnits, BlockSplitBackwardIsBitwiseTheWholeBackward) {
  UnitHarness h(Parse(SmallConfig()), 1, 31);
  SetBatch(h);
  ASSERT_TRUE(ts_unit_splits_backward(&h.model, 1));
  EXPECT_EQ(ExpectSplitBackwardBitwise(h), 14u);  // 6 x (bias, weight) + 2 LayerNorms
  for (int u : {0, 2}) {
    UnitHarness o(Parse(SmallConfig()), u, 32);
    SetBatch(o);
    EXPECT_FALSE(ts_unit_splits_backward(&o.model, u));
    ts_k_wgrad_mem mem{};
    mem.alloc = WgradAlloc;
    mem.release = WgradRelease;
    ts_k_wgrad *w = nullptr;
    ASSERT_EQ(ts_k_wgrad_new(&mem, &w), TS_OK);
    std::vector<float> y(o.x.size()), dx(o.x.size());
    ts_unit_args a = o.Args(&y);
    ASSERT_EQ(ts_unit_forward(&o.model, u, &o.ctx, o.params.data(), &a), TS_OK);
    a.dy = o.r.data();
    a.dx = u ? dx.data() : nullptr;
    a.dloss = 1.0f;
    o.ctx.wgrad = w;
    EXPECT_EQ(ts_unit_backward(&o.model, u, &o.ctx, o.params.data(), o.grads.data(), &a),
              TS_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(ts_last_error()).find("cannot defer its weight gradients"),
              std::string::npos)
        << ts_last_error();
    o.ctx.wgrad = nullptr;
    ts_k_wgrad_free(w);
  }
}
TEST(BertUnits, UntiedHeadBackwardMatchesFiniteDifferences) {
  CheckUnit(SmallConfig(R"(, "tie_word_embeddings": false)", "gelu_new"), 2, 5);
}

TEST(BertUnits, PaddedKeysDoNotChangeOtherPositions) {
  // The block's output at row 1's real positions must not depend on what
  // the padded positions hold (their keys are masked).
  UnitHarness h(Parse(SmallConfig()), 1, 8);
  SetBatch(h);
  std::vector<float> y1(h.x.size()), y2(h.x.size());
  ts_unit_args a = h.Args(&y1);
  ASSERT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_OK) << ts_last_error();
  size_t C = h.model.hidden_size, T = h.T;
  for (size_t t = 4; t < 6; t++)
    for (size_t c = 0; c < C; c++) h.x[(T + t) * C + c] += 3.0f;
  a = h.Args(&y2);
  ASSERT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_OK);
  for (size_t t = 0; t < 4; t++)
    for (size_t c = 0; c < C; c++)
      EXPECT_EQ(y1[(T + t) * C + c], y2[(T + t) * C + c]) << "position " << t << " channel " << c;
  // And the same change at an unpadded position does change row 1.
  h.x[(T + 2) * C] += 3.0f;
  a = h.Args(&y2);
  ASSERT_EQ(ts_unit_forward(&h.model, 1, &h.ctx, h.params.data(), &a), TS_OK);
  EXPECT_NE(y1[T * C], y2[T * C]);
}

TEST(BertUnits, LayoutUsesHuggingFaceNames) {
  ts_model m = Parse(SmallConfig());
  ASSERT_EQ(m.n_units, 3);
  EXPECT_EQ(m.objective, TS_OBJECTIVE_MASKED_LM);
  EXPECT_EQ(m.pad_token_id, 0);
  EXPECT_EQ(m.sep_token_id, 3);
  EXPECT_STREQ(m.units[0].tensors[0].name, "bert.embeddings.word_embeddings.weight");
  EXPECT_STREQ(m.units[0].tensors[4].name, "bert.embeddings.LayerNorm.bias");
  EXPECT_STREQ(m.units[1].tensors[0].name, "bert.encoder.layer.0.attention.self.query.weight");
  EXPECT_STREQ(m.units[1].tensors[15].name, "bert.encoder.layer.0.output.LayerNorm.bias");
  EXPECT_EQ(m.units[1].n_tensors, 16);
  EXPECT_STREQ(m.units[2].tensors[4].name, "cls.predictions.bias");
  EXPECT_EQ(m.units[2].tied_unit, 0);
  EXPECT_EQ(m.units[2].tied_tensor, 0);
  size_t sum = 0;
  for (int u = 0; u < m.n_units; u++) sum += m.units[u].numel;
  EXPECT_EQ(sum, m.num_params);
  // The per-unit FLOP model adds up to PaLM's closed form for BERT: 6 x
  // (L (4 C^2 + 2 I C) + the head's transform C^2 + the tied decoder V C)
  // + 12 L C T; the embeddings' tables are gathers.
  const ts_bert_config *c = ts_bert_config_of(&m);
  double C = (double)c->hidden_size, I = (double)c->intermediate_size, L = c->num_hidden_layers;
  EXPECT_EQ(ts_model_flops_per_token(&m, 8),
            6.0 * (L * (4 * C * C + 2 * I * C) + C * C + (double)c->vocab_size * C) +
                12.0 * L * C * 8.0);
  // initial values: matrices normal, LayerNorm weights 1, biases 0; weight
  // decay on matrices only
  const ts_tensor_spec &q = m.units[1].tensors[0], &qb = m.units[1].tensors[1];
  EXPECT_EQ(q.init, TS_INIT_NORMAL);
  EXPECT_EQ(q.decay, 1);
  EXPECT_EQ(qb.init, TS_INIT_ZEROS);
  EXPECT_EQ(qb.decay, 0);
  EXPECT_EQ(m.units[1].tensors[8].init, TS_INIT_ONES);
  ts_model_free(&m);
}

TEST(BertUnits, DeclaredSavedBytesCoverWhatForwardWrites) {
  // Forward must never write past the declared saved bytes: a guard after
  // them keeps its fill through two forwards of every unit.
  for (int u = 0; u < 3; u++) {
    UnitHarness h(Parse(SmallConfig()), u, 9);
    SetBatch(h);
    size_t declared = ts_unit_saved_bytes(&h.model, u, h.B, h.T, TS_FP32, TS_DEVICE_CPU);
    std::vector<unsigned char> saved(declared + 256, 0xA5);
    std::vector<float> y(h.x.size());
    ts_unit_args a = h.Args(&y);
    a.saved = saved.data();
    ASSERT_EQ(ts_unit_forward(&h.model, u, &h.ctx, h.params.data(), &a), TS_OK) << ts_last_error();
    size_t high = 0;
    for (size_t i = 0; i < saved.size(); i++)
      if (saved[i] != 0xA5) high = i + 1;
    EXPECT_LE(high, declared) << "unit " << u;
    EXPECT_GT(high, declared * 9 / 10) << "unit " << u << ": declared bytes mostly unused";
  }
}

// ---- config.json validation -------------------------------------------------

std::string ErrorOf(const std::string &json) {
  ts_model m{};
  EXPECT_NE(ts_model_parse(json.c_str(), "bad/config.json", &m), TS_OK) << json;
  std::string e = ts_last_error();
  EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  EXPECT_EQ(e.rfind("bad/config.json", 0), 0u) << "names the file: " << e;
  return e;
}

// SmallConfig with `field`'s line replaced (or removed when value is empty).
std::string With(const char *field, const char *value) {
  std::string j = SmallConfig(), key = std::string("\"") + field + "\": ";
  size_t at = j.find(key);
  EXPECT_NE(at, std::string::npos) << field;
  size_t end = j.find_first_of(",}", at + key.size());
  if (*value) return j.substr(0, at + key.size()) + value + j.substr(end);
  if (j[end] == ',') end++;
  return j.substr(0, at) + j.substr(end);
}

TEST(BertConfig, EveryRequiredFieldIsNamedWhenMissing) {
  for (const char *f : {"hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "vocab_size", "max_position_embeddings",
                        "type_vocab_size", "layer_norm_eps", "hidden_act",
                        "hidden_dropout_prob", "attention_probs_dropout_prob"}) {
    std::string e = ErrorOf(With(f, ""));
    EXPECT_NE(e.find(std::string("missing field \"") + f + "\""), std::string::npos) << e;
  }
}

TEST(BertConfig, UnsupportedValuesAreRefusedInOneLine) {
  const struct {
    const char *field, *value, *expect;
  } cases[] = {
      {"hidden_dropout_prob", "0.1", "tessera has no dropout"},
      {"attention_probs_dropout_prob", "0.1", "tessera has no dropout"},
      {"hidden_act", "\"relu\"", "\"gelu\""},
      {"num_attention_heads", "5", "multiple of num_attention_heads"},
      {"pad_token_id", "13", "token id in [0, vocab_size = 13)"},
      {"sep_token_id", "-1", "token id"},
      {"layer_norm_eps", "0", "positive number"},
      {"hidden_size", "1000000000", "parameters: expected at most 2^48"},
  };
  for (const auto &c : cases) {
    std::string e = ErrorOf(With(c.field, c.value));
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.field << ": " << e;
  }
  for (const char *extra :
       {R"(, "position_embedding_type": "relative_key")", R"(, "is_decoder": true)",
        R"(, "architectures": ["BertForSequenceClassification"])",
        R"(, "tie_word_embeddings": 1)"}) {
    std::string e = ErrorOf(SmallConfig(extra));
    EXPECT_NE(e.find("expected"), std::string::npos) << e;
  }
  EXPECT_NE(ErrorOf(SmallConfig(R"(, "position_embedding_type": "relative_key")"))
                .find("position_embedding_type"),
            std::string::npos);
}

TEST(BertConfig, PresetsLoadWithHuggingFaceShapes) {
  setenv("TESSERA_HOME", ".", 1);
  const struct {
    const char *name;
    size_t params;  // BertForMaskedLM's parameter count (tied decoder)
  } presets[] = {{"bert-base", 109514298}, {"bert-large", 335174458}};
  for (const auto &p : presets) {
    char path[512];
    ASSERT_EQ(ts_model_resolve(p.name, path, sizeof path), TS_OK) << ts_last_error();
    ts_model m{};
    ASSERT_EQ(ts_model_load(path, &m), TS_OK) << ts_last_error();
    EXPECT_EQ(m.num_params, p.params) << p.name;
    EXPECT_EQ(m.objective, TS_OBJECTIVE_MASKED_LM);
    ts_model_free(&m);
  }
}

}  // namespace

// The model interface (models/model.h) on its own: loading picks the family
// by model_type, refuses the ones no family computes, and builds the same
// units a family builds by hand; tensors are found by Hugging Face name;
// the shared initialisation fills every kind of tensor, identically on every
// call.
#include "models/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/llama.h"

namespace {

const char *kTiny = R"({"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
  "max_position_embeddings": 8, "rms_norm_eps": 1e-5, "tie_word_embeddings": true)";

std::string With(const char *extra) { return std::string(kTiny) + extra + "}"; }

TEST(ModelLoad, ModelTypePicksTheFamilyAndAbsentMeansLlama) {
  for (const char *extra : {"", R"(, "model_type": "llama")"}) {
    ts_model m{};
    ASSERT_EQ(ts_model_parse(With(extra).c_str(), "dir/tiny.json", &m), TS_OK) << ts_last_error();
    EXPECT_EQ(m.family, &ts_llama_family);
    EXPECT_STREQ(m.name, "tiny");
    EXPECT_STREQ(ts_model_origin(&m), "dir/tiny.json");
    EXPECT_EQ(m.n_units, 4);
    EXPECT_EQ(m.hidden_size, 16u);
    EXPECT_EQ(m.vocab_size, 11u);
    EXPECT_EQ(m.max_seq, 8u);
    EXPECT_EQ(m.num_params, ts_llama_num_params(ts_llama_config_of(&m)));
    EXPECT_EQ(m.units[0].role, TS_UNIT_EMBEDDING);
    EXPECT_EQ(m.units[1].role, TS_UNIT_BLOCK);
    EXPECT_EQ(m.units[2].layer, 1);
    EXPECT_EQ(m.units[3].role, TS_UNIT_HEAD);
    // Tied: the head borrows the embedding's tensor and holds only its norm.
    EXPECT_EQ(m.units[3].tied_unit, 0);
    EXPECT_EQ(m.units[3].tied_tensor, 0);
    EXPECT_EQ(m.units[3].n_tensors, 1);
    // The per-unit FLOP model adds up to PaLM's closed form for LLaMA:
    // 6 (matmul parameters, the head's included) + 12 L C T.
    const ts_llama_config *c = ts_llama_config_of(&m);
    size_t C = c->hidden_size, HS = ts_llama_head_size(c);
    size_t QD = c->num_attention_heads * HS, KVD = c->num_key_value_heads * HS;
    double block = (double)(QD * C + 2 * KVD * C + C * QD + 3 * c->intermediate_size * C);
    double matmul = (double)c->num_hidden_layers * block + (double)c->vocab_size * C;
    EXPECT_EQ(ts_model_flops_per_token(&m, 8),
              6.0 * matmul + 12.0 * (double)c->num_hidden_layers * (double)C * 8.0);
    ts_model_free(&m);
    EXPECT_EQ(m.units, nullptr);
  }
}

TEST(ModelLoad, AModelTypeNoFamilyComputesIsRefusedNamingTheFile) {
  ts_model m{};
  EXPECT_EQ(ts_model_parse(With(R"(, "model_type": "gpt2")").c_str(), "cfg/gpt2.json", &m),
            TS_ERR_FORMAT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("cfg/gpt2.json: field \"model_type\" = \"gpt2\": expected one of "
                     "\"llama\", \"bert\""),
            std::string::npos)
      << msg;
  // "bert" is a family now: a LLaMA config that says bert gets BERT's checks.
  EXPECT_EQ(ts_model_parse(With(R"(, "model_type": "bert")").c_str(), "cfg/bert.json", &m),
            TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("cfg/bert.json: missing field \"type_vocab_size\""),
            std::string::npos)
      << ts_last_error();
  EXPECT_EQ(m.units, nullptr);
  EXPECT_EQ(ts_model_parse(With(R"(, "model_type": 7)").c_str(), "x.json", &m), TS_ERR_FORMAT);
  EXPECT_EQ(ts_model_parse("[1, 2]", "x.json", &m), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("not a JSON object"), std::string::npos);
  // The family's own checks run through the same call, naming the file.
  EXPECT_EQ(ts_model_parse(R"({"hidden_size": 16})", "cfg/half.json", &m), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("cfg/half.json: missing field"), std::string::npos)
      << ts_last_error();
}

TEST(ModelTensors, FindByHuggingFaceName) {
  ts_model m{};
  ASSERT_EQ(ts_model_parse(With("").c_str(), "tiny.json", &m), TS_OK);
  int u = -1, i = -1;
  ASSERT_EQ(ts_model_find_tensor(&m, "model.layers.1.mlp.up_proj.weight", &u, &i), TS_OK);
  EXPECT_EQ(u, 2);
  EXPECT_EQ(i, 7);
  EXPECT_EQ(ts_model_find_tensor(&m, "lm_head.weight", &u, &i), TS_ERR_INVALID_ARGUMENT)
      << "tied: the head has no lm_head of its own";
  EXPECT_NE(std::string(ts_last_error()).find("not a parameter of model tiny"), std::string::npos);
  ts_model_free(&m);
}

// The shared init by kind: normal with the tensor's std, ones, zeros; the
// same values on every call and through the unit's flat offsets.
TEST(ModelInit, EveryKindFromTheSeedAndTheName) {
  ts_model m{};
  ASSERT_EQ(ts_model_parse(With("").c_str(), "tiny.json", &m), TS_OK);
  ts_unit &blk = m.units[1];
  blk.tensors[5].init = TS_INIT_ZEROS;  // post_attention_layernorm, as a bias would be
  ts_kctx cpu{};
  cpu.device = TS_DEVICE_CPU;
  std::vector<float> a(blk.numel, 7.0f), b(blk.numel, 9.0f);
  ASSERT_EQ(ts_model_init_unit(&m, 1, &cpu, a.data(), 11), TS_OK);
  ASSERT_EQ(ts_model_init_unit(&m, 1, &cpu, b.data(), 11), TS_OK);
  EXPECT_EQ(a, b);
  for (int i = 0; i < blk.n_tensors; i++) {
    const ts_tensor_spec &t = blk.tensors[i];
    double s2 = 0;
    for (size_t j = 0; j < t.numel; j++) {
      float x = a[t.offset + j];
      if (t.init == TS_INIT_ONES) {
        EXPECT_EQ(x, 1.0f) << t.name;
      }
      if (t.init == TS_INIT_ZEROS) {
        EXPECT_EQ(x, 0.0f) << t.name;
      }
      s2 += (double)x * x;
    }
    if (t.init == TS_INIT_NORMAL && t.numel >= 256) {  // sample std within 20% of 0.02 (3 sigma)
      EXPECT_NEAR(std::sqrt(s2 / t.numel), t.init_std, 0.2 * t.init_std) << t.name;
    }
  }
  ts_model_free(&m);
}

}  // namespace

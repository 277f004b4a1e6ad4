// hf_roundtrip_test.cc — Hugging Face folders in and out, against the
// parity fixtures (tests/hf_parity): each fixture's weights as a Hugging
// Face folder import into the engine (train --init-from's path), whose
// logits then match transformers' (the parity tolerance); saved as a
// checkpoint and exported (tessera export's path) they come back bitwise,
// in one file and sharded, fp32, and bf16 and fp16 (each element the
// round-to-nearest-even of the fp32 one), and import again bitwise. A
// folder of another model, or with a tensor of a wrong shape, is refused
// in one line. Untied and tied (no lm_head.weight written).
#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/floats.h"
#include "base/testing.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "models/hf_folder.h"
#include "models/safetensors.h"

namespace {

using ts_test::TempDir;
const std::string kDir = "tests/hf_parity/fixtures/";

std::string Slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The fixture of `variant`: its model, its weights as a Hugging Face folder
// (config.json + model.safetensors with the model's tensors only).
struct Fixture {
  ts_safetensors *st = nullptr;
  ts_model model{};
  std::string folder;
  Fixture(const std::string &variant, const TempDir &d) {
    EXPECT_EQ(ts_safetensors_open(&st, (kDir + variant + ".safetensors").c_str()), TS_OK);
    std::string config = Slurp(kDir + variant + ".config.json");
    EXPECT_EQ(ts_model_parse(config.c_str(), "fixture", &model), TS_OK) << ts_last_error();
    folder = d.path("hf-" + variant);
    EXPECT_EQ(system(("mkdir -p '" + folder + "'").c_str()), 0);
    std::ofstream(folder + "/config.json") << config;
    std::vector<ts_safetensors_tensor> ws;
    for (int u = 0; u < model.n_units; u++)
      for (int i = 0; i < model.units[u].n_tensors; i++) ws.push_back(Get(model.units[u].tensors[i].name));
    EXPECT_EQ(ts_safetensors_write((folder + "/model.safetensors").c_str(), ws.data(), ws.size(),
                                   nullptr),
              TS_OK);
  }
  ~Fixture() {
    ts_model_free(&model);
    ts_safetensors_close(st);
  }
  ts_safetensors_tensor Get(const std::string &name) {
    ts_safetensors_tensor t{};
    EXPECT_EQ(ts_safetensors_find(st, name.c_str(), &t), TS_OK) << name;
    return t;
  }
  ts_engine *Engine() {
    ts_safetensors_tensor ids = Get("input_ids");
    ts_engine_opts o = ts_engine_default_opts();
    o.micro_batch = ids.shape[0];
    o.seq = ids.shape[1];
    ts_engine *e = nullptr;
    EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_OK) << ts_last_error();
    return e;
  }
};

// Every tensor of the model in folder `dir` as fp32.
std::vector<std::vector<float>> Weights(const std::string &dir, const ts_model &m) {
  ts_hf_folder *f = nullptr;
  EXPECT_EQ(ts_hf_folder_open(&f, dir.c_str()), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_hf_folder_check(f, &m), TS_OK) << ts_last_error();
  std::vector<std::vector<float>> out;
  for (int u = 0; u < m.n_units; u++)
    for (int i = 0; i < m.units[u].n_tensors; i++) {
      const ts_tensor_spec &t = m.units[u].tensors[i];
      std::vector<float> v(t.numel);
      EXPECT_EQ(ts_hf_folder_read(f, t.name, v.data(), v.size()), TS_OK) << ts_last_error();
      out.push_back(v);
    }
  ts_hf_folder_close(f);
  return out;
}

ts_status FromCheckpoint(void *user, const char *name, float *dst, size_t numel) {
  return ts_checkpoint_read_tensor(static_cast<ts_checkpoint *>(user), name, TS_CHECKPOINT_PARAM,
                                   dst, numel);
}

void RoundTrip(const std::string &variant) {
  SCOPED_TRACE(variant);
  TempDir d;
  Fixture fx(variant, d);
  ts_engine *e = fx.Engine();
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(ts_checkpoint_import_hf(e, fx.folder.c_str()), TS_OK) << ts_last_error();
  // transformers' logits on the fixture's batch (hf_parity_test's tolerance:
  // OpenBLAS vs PyTorch rounding, ~1e-6 per op over 2 layers, 5x margin)
  ts_safetensors_tensor ids = fx.Get("input_ids"), tg = fx.Get("targets"), ref = fx.Get("logits");
  double sum;
  size_t count;
  ASSERT_EQ(ts_engine_eval(e, (const int32_t *)ids.data, (const int32_t *)tg.data, &sum, &count),
            TS_OK);
  std::vector<float> logits(ref.numel);
  ASSERT_EQ(ts_engine_get_logits(e, logits.data(), logits.size()), TS_OK) << ts_last_error();
  double err = 0, scale = 0;
  for (size_t k = 0; k < logits.size(); k++) {
    err = std::fmax(err, std::fabs((double)logits[k] - ((const float *)ref.data)[k]));
    scale = std::fmax(scale, std::fabs((double)((const float *)ref.data)[k]));
  }
  EXPECT_LT(err / scale, 1e-5);
  // checkpoint, then export: one file, sharded, bf16
  std::string ck = d.path("ck");
  ASSERT_EQ(ts_checkpoint_save(e, nullptr, ck.c_str(), nullptr, 0), TS_OK) << ts_last_error();
  ts_checkpoint *c = nullptr;
  ASSERT_EQ(ts_checkpoint_open(&c, ck.c_str(), &fx.model), TS_OK) << ts_last_error();
  std::string config = Slurp(fx.folder + "/config.json");
  std::vector<std::vector<float>> a = Weights(fx.folder, fx.model);
  for (size_t max_shard : {(size_t)0, (size_t)40000}) {
    std::string out = d.path("export-" + std::to_string(max_shard));
    ASSERT_EQ(ts_hf_export(out.c_str(), &fx.model, config.c_str(), TS_FP32, max_shard,
                           FromCheckpoint, c),
              TS_OK)
        << ts_last_error();
    bool sharded = access((out + "/model.safetensors.index.json").c_str(), F_OK) == 0;
    EXPECT_EQ(sharded, max_shard != 0);
    EXPECT_EQ(access((out + "/model.safetensors").c_str(), F_OK) == 0, max_shard == 0);
    std::vector<std::vector<float>> b = Weights(out, fx.model);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); k++)
      EXPECT_EQ(memcmp(a[k].data(), b[k].data(), a[k].size() * 4), 0) << "tensor " << k;
    // ... and back into an engine
    ts_engine *e2 = fx.Engine();
    ASSERT_EQ(ts_checkpoint_import_hf(e2, out.c_str()), TS_OK) << ts_last_error();
    size_t k = 0;
    for (int u = 0; u < fx.model.n_units; u++)
      for (int i = 0; i < fx.model.units[u].n_tensors; i++, k++) {
        const ts_tensor_spec &t = fx.model.units[u].tensors[i];
        std::vector<float> v(t.numel);
        ASSERT_EQ(ts_engine_get_tensor(e2, t.name, v.data(), v.size()), TS_OK);
        EXPECT_EQ(memcmp(v.data(), a[k].data(), v.size() * 4), 0) << t.name;
      }
    ts_engine_free(e2);
    std::string cfg = Slurp(out + "/config.json");
    EXPECT_NE(cfg.find("\"torch_dtype\":\t\"float32\""), std::string::npos) << cfg;
    // The head's own matrix is written exactly when the model has one
    // (untied): a tied model's export holds no copy of the embedding.
    ts_hf_folder *hf = nullptr;
    ASSERT_EQ(ts_hf_folder_open(&hf, out.c_str()), TS_OK) << ts_last_error();
    for (const char *head : {"lm_head.weight", "cls.predictions.decoder.weight"}) {
      bool in_model = false;
      for (int u = 0; u < fx.model.n_units; u++)
        for (int i = 0; i < fx.model.units[u].n_tensors; i++)
          in_model |= std::string(fx.model.units[u].tensors[i].name) == head;
      float one;
      ts_status st = ts_hf_folder_read(hf, head, &one, 1);  // 1 element: found, or "no tensor"
      bool written = st == TS_OK || std::string(ts_last_error()).find("no tensor") == std::string::npos;
      EXPECT_EQ(written, in_model) << head;
    }
    ts_hf_folder_close(hf);
  }
  // A config without model_type and architectures (tessera reads its
  // default family; transformers' AutoConfig could not): the export writes
  // the family's; and one that names only the architecture is read as it.
  cJSON *bare = cJSON_Parse(config.c_str());
  ASSERT_NE(bare, nullptr);
  cJSON_DeleteItemFromObjectCaseSensitive(bare, "model_type");
  cJSON_DeleteItemFromObjectCaseSensitive(bare, "architectures");
  char *bare_text = cJSON_Print(bare);
  std::string bare_out = d.path("export-bare");
  ASSERT_EQ(ts_hf_export(bare_out.c_str(), &fx.model, bare_text, TS_FP32, 0, FromCheckpoint, c),
            TS_OK)
      << ts_last_error();
  cJSON_free(bare_text);
  cJSON *written = cJSON_Parse(Slurp(bare_out + "/config.json").c_str());
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(written, "model_type");
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(written, "architectures");
  ASSERT_TRUE(cJSON_IsString(mt));
  EXPECT_STREQ(mt->valuestring, fx.model.family->model_type);
  ASSERT_EQ(cJSON_GetArraySize(arch), 1);
  EXPECT_STREQ(cJSON_GetArrayItem(arch, 0)->valuestring, fx.model.family->architecture);
  cJSON_Delete(written);
  cJSON_AddItemToObject(bare, "architectures",
                        cJSON_CreateStringArray(&fx.model.family->architecture, 1));
  bare_text = cJSON_Print(bare);
  ts_model named{};
  ASSERT_EQ(ts_model_parse(bare_text, "named", &named), TS_OK) << ts_last_error();
  EXPECT_EQ(named.family, fx.model.family);
  ts_model_free(&named);
  cJSON_free(bare_text);
  cJSON_Delete(bare);
  // Bazel keeps what a test writes here (test.outputs/outputs.zip): the
  // folders tests/hf_parity/check_export.py loads with transformers.
  if (const char *keep = getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::string out = std::string(keep) + "/" + variant;
    EXPECT_EQ(ts_hf_export(out.c_str(), &fx.model, config.c_str(), TS_FP32, 0, FromCheckpoint, c),
              TS_OK);
  }
  for (ts_dtype dt : {TS_BF16, TS_FP16}) {  // narrowed: each element rounded to nearest even
    std::string half = d.path(std::string("export-") + ts_dtype_name(dt));
    ASSERT_EQ(ts_hf_export(half.c_str(), &fx.model, config.c_str(), dt, 0, FromCheckpoint, c),
              TS_OK);
    std::vector<std::vector<float>> h = Weights(half, fx.model);
    for (size_t k = 0; k < a.size(); k++)
      for (size_t q = 0; q < a[k].size(); q++) {
        float want = dt == TS_BF16 ? ts_bf16_to_f32(ts_f32_to_bf16(a[k][q]))
                                   : ts_f16_to_f32(ts_f32_to_f16(a[k][q]));
        ASSERT_EQ(ts_f32_bits(h[k][q]), ts_f32_bits(want)) << ts_dtype_name(dt) << " " << k;
      }
  }
  std::string out = d.path("export-bf16");
  ts_safetensors *sf = nullptr;
  ASSERT_EQ(ts_safetensors_open(&sf, (out + "/model.safetensors").c_str()), TS_OK);
  EXPECT_EQ(ts_safetensors_count(sf), a.size()) << "a tied model writes no lm_head.weight";
  EXPECT_STREQ(ts_safetensors_metadata(sf, "format"), "pt");  // what from_pretrained asks for
  ts_safetensors_close(sf);
  ts_checkpoint_close(c);
  ts_engine_free(e);
}

TEST(HfRoundTrip, UntiedImportsExportsAndReimportsBitwise) { RoundTrip("llama_untied"); }
TEST(HfRoundTrip, TiedImportsExportsAndReimportsBitwise) { RoundTrip("llama_tied"); }
TEST(HfRoundTrip, BertImportsExportsAndReimportsBitwise) {
  RoundTrip("bert_gelu");  // padding, two segments; the decoder tied to the word embeddings
  RoundTrip("bert_gelu_new");
}

TEST(HfRoundTrip, BertFolderOfBertForPreTrainingImports) {
  // A Hub BERT (BertForPreTraining) also carries the tied decoder, its
  // bias, the position-id buffer, the pooler and the next-sentence head:
  // skipped as from_pretrained skips them, the weights load bitwise.
  TempDir d;
  Fixture fx("bert_gelu", d);
  const char *word = "bert.embeddings.word_embeddings.weight", *bias = "cls.predictions.bias";
  std::vector<ts_safetensors_tensor> ws;
  for (int u = 0; u < fx.model.n_units; u++)
    for (int i = 0; i < fx.model.units[u].n_tensors; i++)
      ws.push_back(fx.Get(fx.model.units[u].tensors[i].name));
  ts_safetensors_tensor dec = fx.Get(word), dec_bias = fx.Get(bias), pool = fx.Get(bias);
  dec.name = "cls.predictions.decoder.weight";
  dec_bias.name = "cls.predictions.decoder.bias";
  pool.name = "bert.pooler.dense.bias";
  ws.push_back(dec);
  ws.push_back(dec_bias);
  ws.push_back(pool);
  std::string dir = d.path("hub");
  ASSERT_EQ(system(("mkdir -p '" + dir + "' && cp '" + fx.folder + "/config.json' '" + dir + "'")
                       .c_str()),
            0);
  ASSERT_EQ(
      ts_safetensors_write((dir + "/model.safetensors").c_str(), ws.data(), ws.size(), nullptr),
      TS_OK)
      << ts_last_error();
  EXPECT_EQ(Weights(dir, fx.model), Weights(fx.folder, fx.model));
  // A tied folder whose decoder bias is not cls.predictions.bias (another
  // value, another shape): transformers would load it untied; refused,
  // naming both tensors (and the shapes).
  std::vector<float> other((const float *)dec_bias.data,
                           (const float *)dec_bias.data + dec_bias.numel);
  other[5] += 1.0f;
  ts_safetensors_tensor shifted = dec_bias, small = fx.Get("cls.predictions.transform.dense.bias");
  shifted.data = other.data();
  small.name = "cls.predictions.decoder.bias";
  for (int k = 0; k < 2; k++) {
    std::vector<ts_safetensors_tensor> bad = ws;
    bad[bad.size() - 2] = k == 0 ? shifted : small;
    std::string dir2 = d.path(k == 0 ? "hub-bias" : "hub-shape");
    ASSERT_EQ(system(("mkdir -p '" + dir2 + "' && cp '" + fx.folder + "/config.json' '" + dir2 +
                      "'").c_str()),
              0);
    ASSERT_EQ(ts_safetensors_write((dir2 + "/model.safetensors").c_str(), bad.data(), bad.size(),
                                   nullptr),
              TS_OK);
    ts_hf_folder *hf = nullptr;
    ASSERT_EQ(ts_hf_folder_open(&hf, dir2.c_str()), TS_OK) << ts_last_error();
    EXPECT_EQ(ts_hf_folder_check(hf, &fx.model), TS_ERR_FORMAT);
    std::string want = k == 0 ? "tensor cls.predictions.decoder.bias differs from cls.predictions.bias"
                              : "tensor cls.predictions.decoder.bias has shape [64, 1] (1 dims), but "
                                "the model " + std::string(fx.model.name) +
                                    " ties it to cls.predictions.bias of shape [96, 1]";
    EXPECT_NE(std::string(ts_last_error()).find(want), std::string::npos) << ts_last_error();
    ts_hf_folder_close(hf);
  }
  // An untied BERT does need the decoder's own bias and weight: one line
  // naming the first missing.
  ts_model untied{};
  std::string cfg = Slurp(fx.folder + "/config.json");
  size_t at = cfg.find("\"tie_word_embeddings\": true");
  ASSERT_NE(at, std::string::npos) << cfg;
  cfg.replace(at, strlen("\"tie_word_embeddings\": true"), "\"tie_word_embeddings\": false");
  ASSERT_EQ(ts_model_parse(cfg.c_str(), "untied", &untied), TS_OK) << ts_last_error();
  ts_hf_folder *f = nullptr;
  ASSERT_EQ(ts_hf_folder_open(&f, fx.folder.c_str()), TS_OK);
  EXPECT_EQ(ts_hf_folder_check(f, &untied), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("no tensor cls.predictions.decoder.bias"),
            std::string::npos) << ts_last_error();
  ts_hf_folder_close(f);
  ts_model_free(&untied);
}

TEST(HfRoundTrip, AnotherModelsFolderOrAWrongTensorIsRefusedInOneLine) {
  TempDir d;
  Fixture untied("llama_untied", d), tied("llama_tied", d);
  std::string msg;
  ts_hf_folder *f = nullptr;
  // the untied model reading the tied folder lacks lm_head.weight; the tied
  // model reading the untied one finds an lm_head.weight that differs from
  // the embedding it would tie it to (transformers loads such a folder
  // untied): refused, not dropped
  ASSERT_EQ(ts_hf_folder_open(&f, tied.folder.c_str()), TS_OK);
  EXPECT_EQ(ts_hf_folder_check(f, &untied.model), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("no tensor lm_head.weight, which the model"), std::string::npos) << msg;
  ts_hf_folder_close(f);
  ASSERT_EQ(ts_hf_folder_open(&f, untied.folder.c_str()), TS_OK);
  EXPECT_EQ(ts_hf_folder_check(f, &tied.model), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("model.safetensors: tensor lm_head.weight differs from "
                     "model.embed_tokens.weight, but the model"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  ts_hf_folder_close(f);
  // a stranger tensor
  std::string odd = d.path("odd");
  ASSERT_EQ(system(("cp -r '" + untied.folder + "' '" + odd + "'").c_str()), 0);
  std::vector<ts_safetensors_tensor> ws;
  for (int u = 0; u < untied.model.n_units; u++)
    for (int i = 0; i < untied.model.units[u].n_tensors; i++)
      ws.push_back(untied.Get(untied.model.units[u].tensors[i].name));
  ts_safetensors_tensor extra = untied.Get("model.norm.weight");
  extra.name = "model.layers.0.mlp.bias";
  ws.push_back(extra);
  ASSERT_EQ(ts_safetensors_write((odd + "/model.safetensors").c_str(), ws.data(), ws.size(), nullptr),
            TS_OK);
  ASSERT_EQ(ts_hf_folder_open(&f, odd.c_str()), TS_OK);
  EXPECT_EQ(ts_hf_folder_check(f, &untied.model), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("tensor model.layers.0.mlp.bias is not in the model"), std::string::npos)
      << msg;
  ts_hf_folder_close(f);
  // an integer tensor where a weight belongs
  ws.pop_back();
  for (ts_safetensors_tensor &w : ws)
    if (std::string(w.name) == "model.norm.weight") {
      w = untied.Get("input_ids");
      w.name = "model.norm.weight";
    }
  ASSERT_EQ(ts_safetensors_write((odd + "/model.safetensors").c_str(), ws.data(), ws.size(), nullptr),
            TS_OK);
  ASSERT_EQ(ts_hf_folder_open(&f, odd.c_str()), TS_OK);
  EXPECT_EQ(ts_hf_folder_check(f, &untied.model), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("model.norm.weight has shape"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  ts_hf_folder_close(f);
  EXPECT_EQ(ts_hf_folder_open(&f, d.path("nothing").c_str()), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("no model.safetensors"), std::string::npos);
}

}  // namespace

/*
 * text_tokenizer.cc — the tokenizer a model was trained with, as
 * text_tokenizer.h describes: prepare's meta.json says which kind, a
 * Hugging Face folder's tokenizer.model is read by hf_tokenizer.cc.
 */
#include "tools/text_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tools/corpus.h"
#include "tools/hf_tokenizer.h"
#include "tools/py_helper.h"
#include "tools/prepare.h"

namespace ts_prepare {

ts_status EncodeText(const sentencepiece::SentencePieceProcessor &sp, const std::string &text,
                     const char *what, uint32_t newline, std::vector<uint32_t> *out) {
  std::vector<int> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    if (end > pos) {
      auto st = sp.Encode(absl::string_view(text.data() + pos, end - pos), &ids);
      if (!st.ok())
        return ts_set_error(TS_ERR_INTERNAL, "encoding the %s text at byte %zu: %s", what, pos,
                            st.ToString().c_str());
      for (int id : ids) out->push_back((uint32_t)id);
    }
    if (nl == std::string::npos) break;
    out->push_back(newline);
    pos = nl + 1;
  }
  return TS_OK;
}

}  // namespace ts_prepare

struct ts_text_tokenizer {
  ts_prepare::HfTokenizer hf;  // sp, and BOS/EOS for a model's tokenizer
  bool own = false;            // prepare's own tokenizer: lines and a newline id
  int newline = -1;
  std::map<std::string, int> special;  // meta.json's special_ids (a tokenizer.json's: its config's)
  std::unique_ptr<ts_prepare::JsonCodec> json;  // a tokenizer.json, in a Python helper
};

namespace {

// meta.json's integer field special_ids.<key>, or -1.
int SpecialId(const cJSON *meta, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(meta, "special_ids"), key);
  return cJSON_IsNumber(v) ? v->valueint : -1;
}

// DIR/tokenizer.json in a helper; from_config: its special tokens' ids by
// the names DIR/tokenizer_config.json gives (bos_token ... mask_token, a
// string or an AddedToken's "content"; BERT's "[CLS]" and the like by
// default where the file has them).
ts_status OpenJson(ts_text_tokenizer *t, const std::string &dir, bool from_config) {
  t->json.reset(new (std::nothrow) ts_prepare::JsonCodec);
  if (!t->json) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate");
  TS_CHECK(t->json->Open(dir + "/tokenizer.json", dir));
  if (!from_config) return TS_OK;
  cJSON *cfg = nullptr;
  TS_CHECK(ts_prepare::ReadTokenizerConfig(dir, &cfg));
  const char *keys[][2] = {{"bos", ""}, {"eos", ""}, {"unk", "[UNK]"}, {"pad", "[PAD]"},
                           {"cls", "[CLS]"}, {"sep", "[SEP]"}, {"mask", "[MASK]"}};
  for (auto &k : keys) {
    std::string name = ts_prepare::ConfigToken(cfg, (std::string(k[0]) + "_token").c_str(), k[1]);
    int32_t id = name.empty() ? -1 : t->json->TokenId(name);
    if (id >= 0) t->special[k[0]] = id;
  }
  cJSON_Delete(cfg);
  return TS_OK;
}

// A folder prepare wrote: its meta.json says which tokenizer.
ts_status OpenPrepared(ts_text_tokenizer *t, const std::string &dir, const std::string &path) {
  std::string text;
  TS_CHECK(ts_prepare::ReadText(path.c_str(), &text));
  cJSON *meta = cJSON_ParseWithLength(text.data(), text.size());
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(meta, "tokenizer");
  std::string k = cJSON_IsString(kind) ? kind->valuestring : "";
  const cJSON *sp_ids = cJSON_GetObjectItemCaseSensitive(meta, "special_ids"), *it;
  cJSON_ArrayForEach(it, sp_ids) if (cJSON_IsNumber(it)) t->special[it->string] = it->valueint;
  ts_status st = TS_OK;
  if (k == "sentencepiece-bpe") {
    t->own = true;
    t->newline = SpecialId(meta, "newline");
    std::string model;
    st = ts_prepare::ReadText((dir + "/tokenizer.model").c_str(), &model);
    if (st == TS_OK && !t->hf.sp.LoadFromSerializedProto(model).ok())
      st = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s/tokenizer.model: not a SentencePiece model",
                        dir.c_str());
    if (st == TS_OK && t->newline < 0)
      st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: field \"special_ids.newline\": missing, expected the newline id",
                        path.c_str());
  } else if (k == "sentencepiece") {  // a model's tokenizer, copied with what it adds
    st = ts_prepare::LoadHfTokenizer(dir.c_str(), &t->hf);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(meta, "add_bos");
    t->hf.add_bos = cJSON_IsTrue(bos);
    if (SpecialId(meta, "bos") >= 0) t->hf.bos = SpecialId(meta, "bos");
    if (SpecialId(meta, "eos") >= 0) t->hf.eos = SpecialId(meta, "eos");
  } else if (k == "tokenizers") {  // a model's tokenizer.json, copied
    st = OpenJson(t, dir, false);
  } else {
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: field \"tokenizer\": %s, expected \"sentencepiece-bpe\" or "
                      "\"sentencepiece\" (a folder tessera prepare wrote)",
                      path.c_str(), meta ? (k.empty() ? "missing" : k.c_str()) : "not JSON");
  }
  cJSON_Delete(meta);
  return st;
}

}  // namespace

extern "C" ts_status ts_text_tokenizer_open(ts_text_tokenizer **out, const char *dir) {
  *out = nullptr;
  ts_text_tokenizer *t = new (std::nothrow) ts_text_tokenizer;
  if (!t) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "tokenizer: cannot allocate");
  std::string meta = std::string(dir) + "/meta.json", model = std::string(dir) + "/tokenizer.model";
  ts_status st;
  std::string json = std::string(dir) + "/tokenizer.json";
  if (access(meta.c_str(), F_OK) == 0)
    st = OpenPrepared(t, dir, meta);
  else if (access(model.c_str(), F_OK) == 0)
    st = ts_prepare::LoadHfTokenizer(dir, &t->hf);
  else if (access(json.c_str(), F_OK) == 0)
    st = OpenJson(t, dir, true);
  else
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: no tokenizer.model nor tokenizer.json, expected a folder tessera "
                      "prepare wrote or a Hugging Face folder with its tokenizer",
                      dir);
  if (st != TS_OK) {
    delete t;
    return st;
  }
  *out = t;
  return TS_OK;
}

extern "C" ts_status ts_text_tokenizer_encode(const ts_text_tokenizer *t, const char *text,
                                              int32_t **ids, size_t *n) {
  *ids = nullptr;
  *n = 0;
  std::vector<uint32_t> v;
  if (t->json) {  // as transformers' tokenizer(prompt): with its post-processor's tokens
    TS_CHECK(t->json->Encode(text, true, &v));
  } else if (t->own) {
    TS_CHECK(ts_prepare::EncodeText(t->hf.sp, text, "prompt", (uint32_t)t->newline, &v));
  } else {
    std::vector<ts_prepare::Doc> docs = {{text, true}};
    std::vector<std::vector<uint32_t>> out;
    std::string err;
    if (!ts_prepare::EncodeDocs(t->hf, docs, 1, &out, &err))
      return ts_set_error(TS_ERR_INTERNAL, "encoding the prompt: %s", err.c_str());
    v = out[0];
    if (t->hf.add_eos && !v.empty()) v.pop_back();  // a prompt goes on
  }
  if (v.empty())
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "the prompt \"%s\" has no tokens, expected text",
                        text);
  *ids = (int32_t *)malloc(v.size() * sizeof **ids);
  if (!*ids) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "prompt ids");
  for (size_t i = 0; i < v.size(); i++) (*ids)[i] = (int32_t)v[i];
  *n = v.size();
  return TS_OK;
}

extern "C" char *ts_text_tokenizer_decode(const ts_text_tokenizer *t, const int32_t *ids,
                                          size_t n) {
  std::string text, piece;
  if (t->json) {
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || (size_t)ids[i] >= t->json->vocab) return nullptr;
    if (t->json->Decode(ids, n, &text) != TS_OK) return nullptr;
    return strdup(text.c_str());
  }
  std::vector<int> run;
  int V = t->hf.sp.GetPieceSize();
  auto flush = [&]() {
    if (run.empty()) return true;
    if (!t->hf.sp.Decode(run, &piece).ok()) return false;
    text += piece;
    run.clear();
    return true;
  };
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= V) return nullptr;
    if (t->own && ids[i] == t->newline) {  // lines are encoded apart: decode them apart
      if (!flush()) return nullptr;
      text += '\n';
    } else {
      run.push_back(ids[i]);
    }
  }
  if (!flush()) return nullptr;
  return strdup(text.c_str());
}

extern "C" int32_t ts_text_tokenizer_special(const ts_text_tokenizer *t, const char *name) {
  auto it = t->special.find(name);
  if (it != t->special.end()) return it->second;
  if (t->json) return -1;
  std::string n = name;
  if (n == "bos") return t->hf.bos;
  if (n == "eos") return t->hf.eos;
  if (n == "unk") return t->hf.sp.unk_id();
  if (n == "pad") return t->hf.sp.pad_id();
  return -1;
}

extern "C" ts_status ts_text_tokenizer_encode_masked(const ts_text_tokenizer *t, const char *text,
                                                     int32_t **ids, size_t *n, size_t **masks,
                                                     size_t *n_masks) {
  *ids = nullptr;
  *masks = nullptr;
  *n = *n_masks = 0;
  int mask = ts_text_tokenizer_special(t, "mask"), cls = ts_text_tokenizer_special(t, "cls"),
      sep = ts_text_tokenizer_special(t, "sep");
  if ((!t->own && !t->json) || mask < 0 || cls < 0 || sep < 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--fill-mask needs a masked-LM tokenizer with [CLS], [SEP] and [MASK] "
                        "(tessera prepare --mlm), expected one");
  std::string s = text, tag = "[MASK]";
  std::vector<uint32_t> v = {(uint32_t)cls};
  std::vector<size_t> at;
  size_t pos = 0;
  for (;;) {
    size_t k = s.find(tag, pos);
    std::string piece = s.substr(pos, k == std::string::npos ? k : k - pos);
    if (t->json) {  // the text alone: the frame is ours
      std::vector<uint32_t> w;
      TS_CHECK(t->json->Encode(piece, false, &w));
      v.insert(v.end(), w.begin(), w.end());
    } else {
      TS_CHECK(ts_prepare::EncodeText(t->hf.sp, piece, "--fill-mask", (uint32_t)t->newline, &v));
    }
    if (k == std::string::npos) break;
    at.push_back(v.size());
    v.push_back((uint32_t)mask);
    pos = k + tag.size();
  }
  v.push_back((uint32_t)sep);
  if (at.empty())
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--fill-mask \"%s\": no [MASK], expected text with one or more [MASK]",
                        text);
  *ids = (int32_t *)malloc(v.size() * sizeof **ids);
  *masks = (size_t *)malloc(at.size() * sizeof **masks);
  if (!*ids || !*masks) {
    free(*ids);
    free(*masks);
    *ids = nullptr;
    *masks = nullptr;
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "--fill-mask ids");
  }
  for (size_t i = 0; i < v.size(); i++) (*ids)[i] = (int32_t)v[i];
  for (size_t i = 0; i < at.size(); i++) (*masks)[i] = at[i];
  *n = v.size();
  *n_masks = at.size();
  return TS_OK;
}

extern "C" size_t ts_text_tokenizer_vocab(const ts_text_tokenizer *t) {
  return t->json ? t->json->vocab : (size_t)t->hf.sp.GetPieceSize();
}

extern "C" int32_t ts_text_tokenizer_eos(const ts_text_tokenizer *t) {
  if (t->json) return ts_text_tokenizer_special(t, "eos");
  return t->own ? -1 : t->hf.eos;
}

extern "C" void ts_text_tokenizer_free(ts_text_tokenizer *t) { delete t; }

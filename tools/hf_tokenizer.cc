/*
 * hf_tokenizer.cc — a Hugging Face folder's SentencePiece tokenizer as
 * transformers 5 uses it (see hf_tokenizer.h).
 */
#include "tools/hf_tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <system_error>
#include <thread>

namespace ts_prepare {

// The part of a SentencePiece status message after its "[check] " prefix.
std::string SpMessage(const sentencepiece::util::Status &st) {
  std::string m = st.ToString();
  size_t k = m.rfind("] ");
  if (k != std::string::npos) m = m.substr(k + 2);
  return m.empty() ? "code " + std::to_string((int)st.code()) : m;
}


std::string ConfigToken(const cJSON *cfg, const char *key, const char *dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  return cJSON_IsString(v) ? v->valuestring : dflt;
}

ts_status ReadTokenizerConfig(const std::string &dir, cJSON **cfg) {
  *cfg = nullptr;
  const std::string path = dir + "/tokenizer_config.json";
  if (access(path.c_str(), F_OK) != 0) return TS_OK;
  std::string text;
  TS_CHECK(ReadText(path.c_str(), &text));
  *cfg = cJSON_ParseWithLength(text.data(), text.size());
  if (cJSON_IsObject(*cfg)) return TS_OK;
  cJSON_Delete(*cfg);
  *cfg = nullptr;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: not valid JSON or not an object, expected "
                      "transformers' tokenizer_config.json", path.c_str());
}

ts_status LoadHfTokenizer(const char *hf_dir, HfTokenizer *t) {
  std::string dir = hf_dir;
  struct stat sb;
  if (stat(hf_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--tokenizer %s: not a folder, expected a "
                        "Hugging Face model folder with tokenizer.model", hf_dir);
  const std::string model_path = dir + "/tokenizer.model";
  if (access(model_path.c_str(), F_OK) != 0) {
    if (access((dir + "/tokenizer.json").c_str(), F_OK) == 0)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "--tokenizer %s: has tokenizer.json but no tokenizer.model: "
                          "tokenizer.json (byte-level BPE, WordPiece) is not read yet, expected "
                          "tokenizer.model (SentencePiece: LLaMA-2, TinyLlama, Mistral)",
                          hf_dir);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--tokenizer %s: no tokenizer.model, expected a Hugging Face model folder "
                        "with a SentencePiece tokenizer.model",
                        hf_dir);
  }
  TS_CHECK(ReadText(model_path.c_str(), &t->model));
  auto st = t->sp.LoadFromSerializedProto(t->model);
  if (!st.ok())
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--tokenizer %s: tokenizer.model: %s, expected a "
                        "SentencePiece model", hf_dir, SpMessage(st).c_str());
  t->bos = t->sp.bos_id();
  t->eos = t->sp.eos_id();
  std::vector<std::string> probe;  // "a" encodes to "▁a" or "▁" "a" under a dummy prefix
  t->dummy_prefix = t->sp.Encode("a", &probe).ok() && !probe.empty() &&
                    probe[0].compare(0, 3, "\xe2\x96\x81") == 0;
  t->add_bos = false;  // transformers 5's defaults when the configuration says nothing
  t->add_eos = false;
  // transformers 5 converts tokenizer.model with its own pre-tokenizer
  // (spaces to "▁", one "▁" prepended) and no normalizer, whatever the
  // model's: a model that normalizes (NFKC, extra whitespace removed), has
  // no dummy prefix or cannot spell every text (no byte fallback) would get
  // other ids here than there.
  const std::string probe_text = "a  b \xef\xac\x81 \xef\xbd\x86\t\xe2\x91\xa0 c";  // ﬁ, ｆ, ①
  std::vector<int> probe_ids;
  std::string back;
  if (!t->dummy_prefix || !t->sp.Encode(probe_text, &probe_ids).ok() ||
      !t->sp.Decode(probe_ids, &back).ok() || back != probe_text)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--tokenizer %s: tokenizer.model %s, expected LLaMA's SentencePiece "
                        "settings (identity normalization, whitespace kept, a dummy prefix, byte "
                        "fallback), which transformers 5 assumes",
                        hf_dir,
                        !t->dummy_prefix ? "has no dummy prefix"
                                         : "does not give back the text it encodes (it normalizes "
                                           "it, or lacks byte fallback)");
  const std::string cfg_path = dir + "/tokenizer_config.json";
  cJSON *cfg = nullptr;
  TS_CHECK(ReadTokenizerConfig(dir, &cfg));
  if (cfg == nullptr) return TS_OK;
  ts_status rc = TS_OK;
  const char *keys[] = {"add_bos_token", "add_eos_token"};
  bool *vals[] = {&t->add_bos, &t->add_eos};
  const cJSON *aps = cJSON_GetObjectItemCaseSensitive(cfg, "add_prefix_space");
  if (cJSON_IsFalse(aps))
    rc = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "%s: field \"add_prefix_space\" is false: not read yet, expected true or "
                      "absent (the \"▁\" before each text)",
                      cfg_path.c_str());
  for (int i = 0; i < 2 && rc == TS_OK; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);
    if (v == nullptr || cJSON_IsNull(v)) continue;
    if (!cJSON_IsBool(v))
      rc = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: field \"%s\": expected true or false",
                        cfg_path.c_str(), keys[i]);
    else
      *vals[i] = cJSON_IsTrue(v);
  }
  const char *names[] = {"bos_token", "eos_token"};
  int *ids[] = {&t->bos, &t->eos};
  for (int i = 0; i < 2 && rc == TS_OK; i++) {
    std::string name = ConfigToken(cfg, names[i]);
    if (name.empty()) continue;
    int id = t->sp.PieceToId(name);
    if (id == t->sp.unk_id() && name != t->sp.IdToPiece(id))
      rc = ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: field \"%s\" \"%s\": not a piece of "
                        "tokenizer.model, expected one of its pieces", cfg_path.c_str(), names[i],
                        name.c_str());
    else
      *ids[i] = id;
  }
  cJSON_Delete(cfg);
  TS_CHECK(rc);
  if ((t->add_bos && t->bos < 0) || (t->add_eos && t->eos < 0))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: add_%s_token is true, but tokenizer.model "
                        "has no %s piece and bos/eos_token names none", cfg_path.c_str(),
                        t->add_bos && t->bos < 0 ? "bos" : "eos",
                        t->add_bos && t->bos < 0 ? "BOS" : "EOS");
  return TS_OK;
}

// Encodes one document whole as transformers' tokenizer does with its
// special tokens: [BOS] ids [EOS] as the configuration says. transformers 5
// converts tokenizer.model with a Metaspace pre-tokenizer that writes
// spaces as "▁" and prepends one "▁" unless the text already begins with
// it, where SentencePiece's dummy prefix always adds one: a leading space
// (or "▁") is left to the dummy prefix, so "  x" is "▁▁x" in both.
static bool EncodeDoc(const HfTokenizer &t, const std::string &text, std::vector<uint32_t> *out,
               std::string *err) {
  absl::string_view v(text.data(), text.size());
  if (t.dummy_prefix && !v.empty() && v[0] == ' ')
    v.remove_prefix(1);
  else if (t.dummy_prefix && v.size() >= 3 && v.compare(0, 3, "\xe2\x96\x81") == 0)
    v.remove_prefix(3);
  std::vector<int> ids;
  sentencepiece::util::Status st;
  if (v.empty() && !text.empty()) {
    // " " or "▁" alone: transformers gives the "▁" piece (its three byte
    // pieces where the model has no such piece).
    int id = t.sp.PieceToId("\xe2\x96\x81");
    if (id != t.sp.unk_id()) {
      ids.push_back(id);
    } else {
      for (unsigned char c : std::string("\xe2\x96\x81")) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", c);
        ids.push_back(t.sp.PieceToId(hex));
      }
    }
  } else {
    st = t.sp.Encode(v, &ids);
  }
  if (!st.ok()) {
    *err = SpMessage(st);
    return false;
  }
  if (t.add_bos) out->push_back((uint32_t)t.bos);
  for (int id : ids) out->push_back((uint32_t)id);
  if (t.add_eos) out->push_back((uint32_t)t.eos);
  return true;
}

// Encodes every document (EncodeDoc) on up to `threads` threads, document i
// on thread i mod threads (SentencePieceProcessor::Encode is const), into
// (*out)[i]: the ids do not depend on the thread count (a thread that
// cannot be started leaves its share to this one). On failure *err says the
// first document (in order) that failed, by its size.
bool EncodeDocs(const HfTokenizer &t, const std::vector<Doc> &docs, unsigned threads,
                std::vector<std::vector<uint32_t>> *out, std::string *err) {
  out->assign(docs.size(), {});
  std::vector<std::string> errs(docs.size());
  std::vector<char> ok(docs.size(), 1);
  auto work = [&](unsigned k) {
    for (size_t i = k; i < docs.size(); i += threads)
      ok[i] = EncodeDoc(t, docs[i].text, &(*out)[i], &errs[i]);
  };
  std::vector<std::thread> pool;
  std::vector<unsigned> inline_ks = {0};  // this thread's share, and any a thread could not take
  for (unsigned k = 1; k < threads; k++) {
    try {
      pool.emplace_back(work, k);
    } catch (const std::system_error &) {  // no thread to be had: the same work, here
      inline_ks.push_back(k);
    }
  }
  for (unsigned k : inline_ks) work(k);
  for (std::thread &th : pool) th.join();
  for (size_t i = 0; i < docs.size(); i++)
    if (!ok[i]) {
      *err = "a section of " + std::to_string(docs[i].text.size()) + " bytes: " + errs[i];
      return false;
    }
  return true;
}

}  // namespace ts_prepare

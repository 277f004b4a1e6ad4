/*
 * hf_tokenizer.h — a Hugging Face model folder's SentencePiece tokenizer
 * (tokenizer.model, tokenizer_config.json) encoding documents as
 * transformers 5's AutoTokenizer does (prepare.h, "A Hugging Face
 * tokenizer"; tests/hf_tokenizer holds the ids it must give). Internal to
 * //tools:prepare (C++, host).
 */
#ifndef TS_TOOLS_HF_TOKENIZER_H
#define TS_TOOLS_HF_TOKENIZER_H

#include <cjson/cJSON.h>
#include <sentencepiece_processor.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "base/base.h"
#include "tools/corpus.h"

namespace ts_prepare {

// tokenizer_config.json's `key` ("bos_token", "mask_token", ...): a string,
// or an object whose "content" is one (transformers' AddedToken); dflt
// when absent (cfg NULL too).
std::string ConfigToken(const cJSON *cfg, const char *key, const char *dflt = "");

// DIR/tokenizer_config.json parsed into *cfg (cJSON_Delete it), NULL when
// the folder has none. TS_ERR_INVALID_ARGUMENT naming the file when it is
// not a JSON object, TS_ERR_IO.
ts_status ReadTokenizerConfig(const std::string &dir, cJSON **cfg);

// The part of a SentencePiece status message after its "[check] " prefix.
std::string SpMessage(const sentencepiece::util::Status &st);

// A Hugging Face folder's SentencePiece tokenizer (tokenizer.model) and
// what its tokenizer_config.json says about BOS and EOS.
struct HfTokenizer {
  std::string model;  // the file's bytes, copied into DIR as they are
  sentencepiece::SentencePieceProcessor sp;
  bool add_bos = false, add_eos = false;
  int bos = -1, eos = -1;
  bool dummy_prefix = false;  // the model puts "▁" before a text (add_dummy_prefix)
};

// Loads HF_DIR's tokenizer.model and what tokenizer_config.json (optional)
// says: add_bos_token / add_eos_token (absent or null: false, transformers
// 5's defaults), bos_token / eos_token (a string or an AddedToken object).
// TS_ERR_INVALID_ARGUMENT, naming the file and field, for: not a folder, no
// tokenizer.model (tokenizer.json only: not read yet), a model SentencePiece
// cannot load or whose settings transformers 5 does not follow (it
// normalizes, lacks byte fallback or a dummy prefix), a configuration that
// is not a JSON object, add_prefix_space false, a non-boolean add_*_token,
// a bos/eos_token that is not a piece, add_*_token true without the piece;
// TS_ERR_IO.
ts_status LoadHfTokenizer(const char *hf_dir, HfTokenizer *t);

// Encodes docs[i] into (*out)[i] as transformers does: [BOS] ids [EOS] as
// configured, the whole document at once, a leading " " or "▁" taken by the
// dummy prefix. Document i runs on thread i mod threads (at most `threads`,
// at least the caller's), so the ids do not depend on the thread count. On
// failure returns false and *err names the first failed document by size.
bool EncodeDocs(const HfTokenizer &t, const std::vector<Doc> &docs, unsigned threads,
                std::vector<std::vector<uint32_t>> *out, std::string *err);

}  // namespace ts_prepare

#endif  // TS_TOOLS_HF_TOKENIZER_H

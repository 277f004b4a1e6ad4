// py_helper.h — Hugging Face's `tokenizers` (tokenizer.json) and Apache
// Arrow's Parquet reader, which have no C or C++ library in Debian, used
// through their Python packages: a Python child process (the interpreter of
// tools/setup.sh's pinned venv, /opt/tessera-py/..., or $TESSERA_PYTHON)
// running a short script embedded here, talking binary frames over its
// stdin and stdout (little-endian uint32s). Internal to //tools:prepare
// (C++, host).
#ifndef TS_TOOLS_PY_HELPER_H
#define TS_TOOLS_PY_HELPER_H

#include <stdint.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "base/base.h"
#include "tools/corpus.h"

namespace ts_prepare {

// The venv tools/setup.sh makes, with tokenizers and pyarrow pinned.
#define TS_PY_VENV "/opt/tessera-py/tokenizers-0.23.3-pyarrow-26.0.1"

// A running helper: its pid, the pipe to its stdin and from its stdout,
// and the file its stderr goes to.
class PyHelper {
 public:
  PyHelper() = default;
  PyHelper(const PyHelper &) = delete;
  PyHelper &operator=(const PyHelper &) = delete;
  ~PyHelper();  // kills a helper still running

  // Starts the helper in `mode` ("encode", "parquet") with args; `what`
  // names the input in errors ("--tokenizer DIR", "--text FILE").
  // TS_ERR_UNSUPPORTED when no Python with the packages is found (one line
  // naming tools/setup.sh and TESSERA_PYTHON), TS_ERR_IO.
  ts_status Start(const char *mode, const std::vector<std::string> &args, const std::string &what);
  ts_status Write(const void *p, size_t n);  // all of it, or TS_ERR_IO
  ts_status Read(void *p, size_t n);         // exactly n bytes, or the helper's error
  ts_status ReadU32(uint32_t *v) { return Read(v, 4); }
  // Closes its stdin, waits; TS_OK on exit 0, else its last stderr line.
  ts_status Finish();

 private:
  ts_status Failed();  // the helper's own error line (waits for it)
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string err_path_, what_;
};

// A Hugging Face folder's tokenizer.json, encoding as transformers'
// AutoTokenizer(text)["input_ids"] does (the library's encode_batch with
// its special tokens, no truncation or padding).
struct JsonTokenizer {
  std::string json;  // the file's bytes, copied into DIR as they are
  size_t vocab = 0;  // get_vocab_size(with_added_tokens=True)
  bool mlm = false;  // text tokens alone (no special tokens), and:
  int32_t special[5] = {-1, -1, -1, -1, -1};  // [PAD] [UNK] [CLS] [SEP] [MASK]'s ids
  PyHelper helper;
};

// Starts hf_dir's tokenizer.json in a helper. mlm: the documents are
// encoded without the special tokens its post-processor would add (the
// masked-LM loader frames [CLS] ... [SEP] itself), and the five specials
// are looked up by tokenizer_config.json's pad/unk/cls/sep/mask_token
// (defaults "[PAD]" ... "[MASK]"). TS_ERR_INVALID_ARGUMENT naming the file
// when the library cannot load it or (mlm) a special is not a token,
// PyHelper::Start's.
ts_status LoadJsonTokenizer(const char *hf_dir, bool mlm, JsonTokenizer *t);

// Encodes docs (a batch) into (*out)[i]. The helper's error on failure.
ts_status EncodeJsonDocs(JsonTokenizer *t, const std::vector<Doc> &docs,
                         std::vector<std::vector<uint32_t>> *out);

// A tokenizer.json for one text at a time (generate, train --sample-every):
// encode, decode, a token's id, in a helper that stays up.
struct JsonCodec {
  size_t vocab = 0;
  PyHelper helper;
  // Starts the helper on tokenizer.json `file`; `what` names it in errors.
  ts_status Open(const std::string &file, const std::string &what);
  // text's ids, with the special tokens its post-processor adds when special.
  ts_status Encode(const std::string &text, bool special, std::vector<uint32_t> *ids);
  // ids' text, special tokens skipped (transformers' decode(skip_special_tokens=True)).
  ts_status Decode(const int32_t *ids, size_t n, std::string *text);
  // The id of token `name`, or -1.
  int32_t TokenId(const std::string &name);
};

// Each value of column `field` of a Parquet file, in row order, to take
// (with its bytes added to *bytes); a null or non-string value refused in
// one line naming the file, the row and the field (the helper's).
ts_status StreamParquet(const std::string &path, const char *field, size_t *bytes,
                        const std::function<ts_status(std::string &&)> &take);

}  // namespace ts_prepare

#endif  // TS_TOOLS_PY_HELPER_H

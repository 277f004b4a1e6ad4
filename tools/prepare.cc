/*
 * prepare.cc — `tessera prepare`: text corpus -> SentencePiece BPE tokenizer,
 * train.bin / val.bin token shards and meta.json (see prepare.h).
 *
 * C++ only because SentencePiece is a C++ library; the interface is C.
 * Invariants: nothing is created before the inputs are validated; every
 * output goes to a temporary directory beside DIR and reaches DIR by rename
 * only after all four files are complete and fsync'ed; decoding train.bin
 * (val.bin) with tokenizer.model gives back the training (validation) text.
 */
#include "tools/prepare.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/atomic_file.h"
#include "engine/token_file.h"
#include "tools/flags.h"

namespace {

const char *const kFiles[] = {"tokenizer.model", "train.bin", "val.bin", "meta.json"};
const size_t kNumFiles = sizeof kFiles / sizeof kFiles[0];
// A one-line paragraph shorter than this is a heading, joined to the next.
const size_t kHeadingMaxBytes = 80;
// SentencePiece reads at most this many training lines (sampled with the seed).
const char *const kMaxTrainLines = "2000000";

double NowSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Reads a whole file into *out.
ts_status ReadText(const char *path, std::string *out) {
  FILE *f = fopen(path, "rb");
  if (f == nullptr)
    return ts_set_error(TS_ERR_IO, "--text %s: cannot open: %s", path, strerror(errno));
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int err = ferror(f);
  fclose(f);
  if (err) return ts_set_error(TS_ERR_IO, "--text %s: read failed", path);
  return TS_OK;
}

// Decodes one UTF-8 code point at s[i]; returns its length (0 if malformed).
size_t Utf8Next(const std::string &s, size_t i, uint32_t *cp) {
  const unsigned char c = (unsigned char)s[i];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; k++) {
    const unsigned char d = (unsigned char)s[i + k];
    if ((d & 0xC0) != 0x80) return 0;
    v = (v << 6) | (d & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// Byte offset of the first malformed UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(const std::string &s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8Next(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

// Distinct characters SentencePiece must give a piece each at coverage 1.0:
// every code point but '\n', with ' ' counted as its meta symbol U+2581.
size_t DistinctChars(const std::string &s) {
  std::unordered_set<uint32_t> seen;
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8Next(s, i, &cp);
    i += n ? n : 1;  // the text was validated; never stall
    if (n == 0 || cp == '\n') continue;
    seen.insert(cp == ' ' ? 0x2581 : cp);
  }
  return seen.size();
}

bool IsBlank(const char *b, const char *e) {
  for (; b < e; b++)
    if (*b != ' ' && *b != '\t' && *b != '\r') return false;
  return true;
}

// Cuts text into sections (see prepare.h): returns their start offsets; the
// last section ends at text.size().
std::vector<size_t> SplitSections(const std::string &text) {
  // Paragraphs: [start, end) spans; a paragraph starts at the first line
  // after the previous paragraph's last non-blank line.
  struct Para {
    size_t start;
    size_t lines;      // non-blank lines
    size_t last_len;   // bytes of its (only) line, when lines == 1
  };
  std::vector<Para> paras;
  const char *base = text.data();
  size_t pos = 0, cur_start = 0;
  bool in_para = false;
  while (pos < text.size()) {
    const char *nl = (const char *)memchr(base + pos, '\n', text.size() - pos);
    size_t end = nl ? (size_t)(nl - base) + 1 : text.size();
    size_t content_end = nl ? end - 1 : end;
    bool blank = IsBlank(base + pos, base + content_end);
    if (!blank) {
      if (!in_para) {
        paras.push_back(Para{cur_start, 0, 0});
        in_para = true;
      }
      paras.back().lines++;
      paras.back().last_len = content_end - pos;
    } else if (in_para) {
      in_para = false;
      cur_start = pos;  // blank lines belong to the next paragraph
    }
    pos = end;
  }
  std::vector<size_t> starts;
  bool joined = false;  // previous paragraph was a heading: this one continues its section
  for (const Para &p : paras) {
    if (!joined) starts.push_back(p.start);
    joined = p.lines == 1 && p.last_len < kHeadingMaxBytes;
  }
  if (starts.empty()) starts.push_back(0);
  starts[0] = 0;  // anything before the first paragraph belongs to it
  return starts;
}

// Feeds the non-empty lines of a text to the SentencePiece trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string &text) : text_(text) { Advance(); }
  bool done() const override { return done_; }
  void Next() override { Advance(); }
  const std::string &value() const override { return line_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  void Advance() {
    while (pos_ < text_.size()) {
      size_t nl = text_.find('\n', pos_);
      size_t end = nl == std::string::npos ? text_.size() : nl;
      line_.assign(text_, pos_, end - pos_);
      pos_ = nl == std::string::npos ? text_.size() : nl + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  const std::string &text_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// Encodes text line by line; each '\n' becomes `newline`.
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

// Removes the temporary directory and whatever this tool put in it.
void RemoveTempDir(const std::string &dir) {
  for (size_t i = 0; i < kNumFiles; i++) {
    std::string p = dir + "/" + kFiles[i];
    unlink(p.c_str());
    unlink((p + ".tmp").c_str());
  }
  rmdir(dir.c_str());
}

// The part of a SentencePiece status message after its "[check] " prefix.
std::string SpMessage(const sentencepiece::util::Status &st) {
  std::string m = st.ToString();
  size_t k = m.rfind("] ");
  return k == std::string::npos ? m : m.substr(k + 2);
}

ts_status BuildMeta(const ts_prepare_opts *o, const ts_prepare_report *r, size_t K,
                    std::string *out) {
  cJSON *m = cJSON_CreateObject();
  if (m == nullptr) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "meta.json: out of memory");
  char *abs = realpath(o->text_path, nullptr);
  cJSON_AddNumberToObject(m, "version", 1);
  cJSON_AddStringToObject(m, "tokenizer", "sentencepiece-bpe");
  cJSON_AddStringToObject(m, "tokenizer_model", "tokenizer.model");
  cJSON_AddNumberToObject(m, "vocab_size", (double)r->vocab_size);
  cJSON_AddStringToObject(m, "token_dtype",
                          r->vocab_size > TS_TOKEN_FILE_U16_MAX_VOCAB ? "uint32" : "uint16");
  cJSON *ids = cJSON_AddObjectToObject(m, "special_ids");
  if (o->mlm) {
    cJSON_AddBoolToObject(m, "mlm", 1);
    const char *names[] = {"pad", "unk", "cls", "sep", "mask", "newline"};
    for (int i = 0; i < TS_PREPARE_MLM_NUM_SPECIAL; i++) cJSON_AddNumberToObject(ids, names[i], i);
  } else {
    cJSON_AddNumberToObject(ids, "unk", 0);
    cJSON_AddNumberToObject(ids, "bos", 1);
    cJSON_AddNumberToObject(ids, "eos", 2);
    cJSON_AddNumberToObject(ids, "newline", TS_PREPARE_NEWLINE_ID);
  }
  cJSON_AddBoolToObject(m, "byte_fallback", 1);
  cJSON_AddStringToObject(m, "source", abs ? abs : o->text_path);
  free(abs);
  cJSON_AddNumberToObject(m, "val_every", (double)K);
  cJSON_AddNumberToObject(m, "seed", (double)o->seed);
  cJSON_AddNumberToObject(m, "sections", (double)r->sections);
  cJSON_AddNumberToObject(m, "val_sections", (double)r->val_sections);
  cJSON_AddNumberToObject(m, "train_bytes", (double)r->train_bytes);
  cJSON_AddNumberToObject(m, "val_bytes", (double)r->val_bytes);
  cJSON_AddNumberToObject(m, "train_tokens", (double)r->train_tokens);
  cJSON_AddNumberToObject(m, "val_tokens", (double)r->val_tokens);
  cJSON_AddNumberToObject(m, "unigram_val_loss", r->unigram_val_loss);
  cJSON_AddStringToObject(m, "unigram_val_loss_note",
                          "nats/token of val.bin under train.bin token frequencies, add-one "
                          "smoothed over vocab_size");
  cJSON_AddNumberToObject(m, "unigram_val_accuracy", r->unigram_val_accuracy);
  cJSON_AddStringToObject(m, "unigram_val_accuracy_note",
                          "share of val.bin tokens equal to train.bin's most frequent token");
  char *s = cJSON_Print(m);
  cJSON_Delete(m);
  if (s == nullptr) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "meta.json: out of memory");
  *out = s;
  out->push_back('\n');
  free(s);
  return TS_OK;
}

}  // namespace

extern "C" ts_status ts_prepare_corpus(const ts_prepare_opts *opts, ts_prepare_report *report) {
  const double t0 = NowSeconds();
  if (opts == nullptr)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_prepare_corpus: opts is NULL");
  if (opts->text_path == nullptr || opts->text_path[0] == '\0')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--text: missing, expected a UTF-8 text file");
  if (opts->out_dir == nullptr || opts->out_dir[0] == '\0')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--out: missing, expected an output directory");
  const size_t n_special = opts->mlm ? TS_PREPARE_MLM_NUM_SPECIAL : TS_PREPARE_NUM_SPECIAL;
  const uint32_t newline = opts->mlm ? TS_PREPARE_MLM_NEWLINE_ID : TS_PREPARE_NEWLINE_ID;
  const size_t min_vocab = n_special + 256 + 1;
  if (opts->vocab_size < min_vocab || opts->vocab_size > (size_t)INT_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--vocab-size %zu: expected %zu .. %d (%zu special + 256 byte pieces + the "
                        "text's characters and merges)",
                        opts->vocab_size, min_vocab, INT_MAX, n_special);
  const size_t K = opts->val_every ? opts->val_every : TS_PREPARE_DEFAULT_VAL_EVERY;
  if (K < 2)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--val-every %zu: expected >= 2 (every K-th section is validation)", K);

  // Read, check and split the text.
  std::string text;
  TS_CHECK(ReadText(opts->text_path, &text));
  size_t bad = FirstInvalidUtf8(text);
  if (bad != std::string::npos)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--text %s: invalid UTF-8 at byte %zu, expected UTF-8 text",
                        opts->text_path, bad);
  std::vector<size_t> starts = SplitSections(text);
  std::string train, val;
  size_t n_val = 0;
  for (size_t i = 0; i < starts.size(); i++) {
    size_t end = i + 1 < starts.size() ? starts[i + 1] : text.size();
    std::string &dst = (i + 1) % K == 0 ? val : train;
    if ((i + 1) % K == 0) n_val++;
    dst.append(text, starts[i], end - starts[i]);
  }
  if (n_val == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s: %zu sections (paragraphs split by blank lines), expected at "
                        "least --val-every %zu so that one is validation",
                        opts->text_path, starts.size(), K);
  if (train.find_first_not_of(" \t\r\n") == std::string::npos)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--text %s: the training part is empty",
                        opts->text_path);
  const size_t chars = DistinctChars(train);
  const size_t need = n_special + 256 + chars;
  if (opts->vocab_size < need)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--vocab-size %zu: too small for byte fallback, expected at least %zu (%zu "
                        "special + 256 byte pieces + %zu distinct characters in the training text "
                        "of %s)",
                        opts->vocab_size, need, n_special, chars, opts->text_path);
  // BPE adds one piece per merge and each merge joins at least one pair of
  // the training text's symbols, so it cannot make more pieces than this;
  // SentencePiece would refuse a larger vocabulary only after training.
  const size_t most = need + train.size();
  if (opts->vocab_size > most)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--vocab-size %zu: expected at most %zu (%zu special + 256 byte pieces + "
                        "%zu distinct characters + one merge per byte of the %zu-byte training "
                        "text of %s)",
                        opts->vocab_size, most, n_special, chars, train.size(), opts->text_path);

  // Train the tokenizer on the training part.
  sentencepiece::SetRandomGeneratorSeed((unsigned)(opts->seed % 0xFFFFFFFFull));
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opts->vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"num_threads", "2"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"user_defined_symbols", "\n"},  // id 3
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},  // "▁▁" before verse numbers
      {"max_sentence_length", "65536"},
      {"input_sentence_size", kMaxTrainLines},
      {"shuffle_input_sentence", "true"},
      {"minloglevel", "2"},  // library code does not print
  };
  if (opts->mlm) {  // BERT's pieces: 0 [PAD] 1 [UNK] 2 [CLS] 3 [SEP] 4 [MASK] 5 "\n"
    const std::pair<const char *, const char *> mlm[] = {
        {"pad_id", "0"},        {"pad_piece", "[PAD]"}, {"unk_id", "1"},
        {"unk_piece", "[UNK]"}, {"bos_id", "2"},        {"bos_piece", "[CLS]"},
        {"eos_id", "3"},        {"eos_piece", "[SEP]"}, {"control_symbols", "[MASK]"}};
    for (const auto &kv : mlm) args[kv.first] = kv.second;
  }
  LineIterator lines(train);
  std::string model;
  auto sst = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!sst.ok()) {
    std::string m = SpMessage(sst);
    if (m.find("ocabulary size") != std::string::npos)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--vocab-size %zu: SentencePiece on %s: %s",
                          opts->vocab_size, opts->text_path, m.c_str());
    return ts_set_error(TS_ERR_INTERNAL, "SentencePiece training on %s failed: %s",
                        opts->text_path, m.c_str());
  }
  sentencepiece::SentencePieceProcessor sp;
  sst = sp.LoadFromSerializedProto(model);
  if (!sst.ok())
    return ts_set_error(TS_ERR_INTERNAL, "loading the trained tokenizer: %s", SpMessage(sst).c_str());
  if ((size_t)sp.GetPieceSize() != opts->vocab_size || sp.IdToPiece((int)newline) != "\n" ||
      (opts->mlm && sp.IdToPiece(4) != "[MASK]"))
    return ts_set_error(TS_ERR_INTERNAL,
                        "trained tokenizer has %d pieces and piece %u '%s', expected %zu and a "
                        "line break",
                        sp.GetPieceSize(), newline, sp.IdToPiece((int)newline).c_str(),
                        opts->vocab_size);

  // Tokenize both parts and compute the unigram baseline.
  std::vector<uint32_t> train_ids, val_ids;
  TS_CHECK(EncodeText(sp, train, "training", newline, &train_ids));
  TS_CHECK(EncodeText(sp, val, "validation", newline, &val_ids));
  if (train_ids.size() > (size_t)INT32_MAX || val_ids.size() > (size_t)INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s: %zu tokens, expected at most %d per shard", opts->text_path,
                        train_ids.size(), INT32_MAX);
  const size_t V = opts->vocab_size;
  std::vector<double> counts(V, 0.0);
  for (uint32_t t : train_ids) counts[t] += 1.0;
  double nll = 0.0;
  const double denom = (double)train_ids.size() + (double)V;
  for (uint32_t t : val_ids) nll -= log((counts[t] + 1.0) / denom);
  size_t top = 0, hits = 0;  // the unigram predictor: always train's most frequent token
  for (size_t v = 1; v < V; v++)
    if (counts[v] > counts[top]) top = v;
  for (uint32_t t : val_ids) hits += t == top;

  ts_prepare_report rep;
  memset(&rep, 0, sizeof rep);
  rep.vocab_size = V;
  rep.sections = starts.size();
  rep.val_sections = n_val;
  rep.train_bytes = train.size();
  rep.val_bytes = val.size();
  rep.train_tokens = train_ids.size();
  rep.val_tokens = val_ids.size();
  rep.unigram_val_loss = val_ids.empty() ? 0.0 : nll / (double)val_ids.size();
  rep.unigram_val_accuracy = val_ids.empty() ? 0.0 : (double)hits / (double)val_ids.size();

  // Write everything into a temporary directory beside DIR.
  std::string dir = opts->out_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat sb;
  bool dir_exists = stat(dir.c_str(), &sb) == 0;
  if (dir_exists && !S_ISDIR(sb.st_mode))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--out %s: exists and is not a directory",
                        opts->out_dir);
  size_t slash = dir.rfind('/');
  std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  std::string leaf = slash == std::string::npos ? dir : dir.substr(slash + 1);
  std::string tmpl = parent + "/." + leaf + ".prepare-XXXXXX";
  std::vector<char> tbuf(tmpl.begin(), tmpl.end());
  tbuf.push_back('\0');
  if (mkdtemp(tbuf.data()) == nullptr)
    return ts_set_error(TS_ERR_IO, "--out %s: cannot create a temporary directory in %s: %s",
                        opts->out_dir, parent.c_str(), strerror(errno));
  const std::string tmp = tbuf.data();
  chmod(tmp.c_str(), 0755);  // mkdtemp makes it 0700; it may become DIR itself

  ts_status st = TS_OK;
  std::string meta;
  TS_CHECK_GOTO(ts_atomic_write((tmp + "/tokenizer.model").c_str(), model.data(), model.size()), st, fail);
  TS_CHECK_GOTO(ts_token_file_write((tmp + "/train.bin").c_str(), train_ids.data(), train_ids.size(), V),
                st, fail);
  TS_CHECK_GOTO(ts_token_file_write((tmp + "/val.bin").c_str(), val_ids.data(), val_ids.size(), V), st,
                fail);
  TS_CHECK_GOTO(BuildMeta(opts, &rep, K, &meta), st, fail);
  TS_CHECK_GOTO(ts_atomic_write((tmp + "/meta.json").c_str(), meta.data(), meta.size()), st, fail);

  // Move into place: the whole directory when DIR is new, else file by file.
  if (!dir_exists && ts_atomic_rename(tmp.c_str(), dir.c_str()) == TS_OK) {
    // done
  } else {
    if (!dir_exists && mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      st = ts_set_error(TS_ERR_IO, "--out %s: cannot create: %s", opts->out_dir, strerror(errno));
      goto fail;
    }
    for (size_t i = 0; i < kNumFiles; i++) {
      std::string from = tmp + "/" + kFiles[i], to = dir + "/" + kFiles[i];
      if (ts_atomic_rename(from.c_str(), to.c_str()) != TS_OK) {
        std::string why = ts_last_error();  // a copy: ts_set_error rewrites that buffer
        st = ts_set_error(TS_ERR_IO, "--out %s: cannot move %s into place: %s", opts->out_dir,
                          kFiles[i], why.c_str());
        goto fail;
      }
    }
    rmdir(tmp.c_str());
  }
  rep.seconds = NowSeconds() - t0;
  if (report != nullptr) *report = rep;
  return TS_OK;

fail:
  RemoveTempDir(tmp);
  return st;
}

/* ------------------------------------------------------------ the command */

namespace {

const char kUsage[] =
    "usage: tessera prepare --text FILE --vocab-size N --out DIR [--mlm] [flags]\n"
    "  Trains a SentencePiece BPE tokenizer (byte fallback) on FILE less every K-th\n"
    "  section, and writes DIR/tokenizer.model, DIR/train.bin, DIR/val.bin and\n"
    "  DIR/meta.json.\n";

}  // namespace

extern "C" int ts_tool_prepare(int argc, char **argv) {
  ts_prepare_opts o;
  memset(&o, 0, sizeof o);
  size_t seed = 0;
  const char *vocab_given = nullptr;
  const ts_flag flags[] = {
      TS_FLAG_STRING("--text", nullptr, &o.text_path, "FILE", "the UTF-8 corpus; required",
                     nullptr),
      TS_FLAG_SIZE("--vocab-size", nullptr, &o.vocab_size, 0, "N",
                   "SentencePiece pieces, e.g. 4096 (at least 261); required", &vocab_given),
      TS_FLAG_STRING("--out", nullptr, &o.out_dir, "DIR", "the output directory; required",
                     nullptr),
      TS_FLAG_SIZE("--val-every", nullptr, &o.val_every, 2, "K",
                   "every K-th section is validation (default 30)", nullptr),
      TS_FLAG_SIZE("--seed", nullptr, &seed, 0, "S",
                   "SentencePiece sampling seed, used past 2 million lines (default 0)", nullptr),
      TS_FLAG_SWITCH("--mlm", nullptr, &o.mlm,
                     "a masked-LM (BERT) tokenizer: [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0-4"),
  };
  int rc = ts_flags_parse("prepare", flags, sizeof flags / sizeof *flags, argc, argv, kUsage);
  if (rc != TS_FLAGS_OK) return rc == TS_FLAGS_HELP ? 0 : 2;
  o.seed = seed;
  if (o.text_path == nullptr)
    return ts_flags_error("prepare", "--text FILE is required (the UTF-8 corpus)");
  if (vocab_given == nullptr)
    return ts_flags_error("prepare", "--vocab-size N is required (e.g. 4096; at least 261)");
  if (o.out_dir == nullptr)
    return ts_flags_error("prepare", "--out DIR is required (the output directory)");
  ts_prepare_report r;
  ts_status st = ts_prepare_corpus(&o, &r);
  if (st != TS_OK) {
    fprintf(stderr, "tessera prepare: %s\n", ts_flags_last_error());
    return st == TS_ERR_INVALID_ARGUMENT ? 2 : 1;
  }
  const size_t K = o.val_every ? o.val_every : TS_PREPARE_DEFAULT_VAL_EVERY;
  printf("tessera prepare: %s -> %s\n", o.text_path, o.out_dir);
  printf("  tokenizer   sentencepiece bpe, vocab %zu (byte fallback%s)\n", r.vocab_size,
         o.mlm ? "; masked LM: [PAD] [UNK] [CLS] [SEP] [MASK] = 0-4" : "");
  printf("  sections    %zu, %zu held out for validation (--val-every %zu)\n", r.sections,
         r.val_sections, K);
  printf("  train.bin   %zu tokens (%zu bytes of text, %.2f bytes/token)\n", r.train_tokens,
         r.train_bytes, r.train_tokens ? (double)r.train_bytes / (double)r.train_tokens : 0.0);
  printf("  val.bin     %zu tokens (%zu bytes of text, %.1f%% of the text)\n", r.val_tokens,
         r.val_bytes, 100.0 * (double)r.val_bytes / (double)(r.train_bytes + r.val_bytes));
  printf("  unigram val loss %.4f nats/token (train frequencies, add-one smoothing)\n",
         r.unigram_val_loss);
  printf("  took %.1f s\n", r.seconds);
  return 0;
}

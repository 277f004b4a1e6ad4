/*
 * prepare.cc — `tessera prepare`: text corpus -> SentencePiece BPE tokenizer,
 * train.bin / val.bin token shards and meta.json (see prepare.h); the
 * corpus is read by corpus.h, a Hugging Face tokenizer by hf_tokenizer.h.
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

#include <algorithm>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/atomic_file.h"
#include "engine/token_file.h"
#include "tools/corpus.h"
#include "tools/flags.h"
#include "tools/hf_tokenizer.h"
#include "tools/py_helper.h"
#include "tools/text_tokenizer.h"

namespace {

using namespace ts_prepare;  // corpus.h, hf_tokenizer.h

// (one of the two tokenizer files: tokenizer.model, or a model's tokenizer.json)
const char *const kFiles[] = {"tokenizer.model", "tokenizer.json", "train.bin", "val.bin",
                              "meta.json"};
const size_t kNumFiles = sizeof kFiles / sizeof kFiles[0];
// SentencePiece reads at most this many training lines (sampled with the seed).
const char *const kMaxTrainLines = "2000000";

double NowSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

// Removes the temporary directory and whatever this tool put in it.
void RemoveTempDir(const std::string &dir) {
  for (size_t i = 0; i < kNumFiles; i++) {
    std::string p = dir + "/" + kFiles[i];
    unlink(p.c_str());
    unlink((p + ".tmp").c_str());
  }
  rmdir(dir.c_str());
}

ts_status BuildMeta(const ts_prepare_opts *o, const ts_prepare_report *r, size_t K,
                    const HfTokenizer *hf, const JsonTokenizer *json, std::string *out) {
  cJSON *m = cJSON_CreateObject();
  if (m == nullptr) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "meta.json: out of memory");
  char *abs = realpath(o->text_path, nullptr);
  cJSON_AddNumberToObject(m, "version", 1);
  cJSON_AddStringToObject(m, "tokenizer",
                          json ? "tokenizers" : hf ? "sentencepiece" : "sentencepiece-bpe");
  cJSON_AddStringToObject(m, "tokenizer_model", json ? "tokenizer.json" : "tokenizer.model");
  if (hf || json) {
    char *from = realpath(o->tokenizer_dir, nullptr);
    cJSON_AddStringToObject(m, "tokenizer_from", from ? from : o->tokenizer_dir);
    free(from);
  }
  cJSON_AddNumberToObject(m, "vocab_size", (double)r->vocab_size);
  cJSON_AddStringToObject(m, "token_dtype",
                          r->vocab_size > TS_TOKEN_FILE_U16_MAX_VOCAB ? "uint32" : "uint16");
  cJSON *ids = cJSON_AddObjectToObject(m, "special_ids");
  if (hf) {
    const sentencepiece::SentencePieceProcessor &sp = hf->sp;
    if (sp.unk_id() >= 0) cJSON_AddNumberToObject(ids, "unk", sp.unk_id());
    if (hf->bos >= 0) cJSON_AddNumberToObject(ids, "bos", hf->bos);
    if (hf->eos >= 0) cJSON_AddNumberToObject(ids, "eos", hf->eos);
    if (sp.pad_id() >= 0) cJSON_AddNumberToObject(ids, "pad", sp.pad_id());
    cJSON_AddBoolToObject(m, "add_bos", hf->add_bos);
    cJSON_AddBoolToObject(m, "add_eos", hf->add_eos);
  } else if (json && json->mlm) {  // the shards hold text tokens; the loader frames them
    cJSON_AddBoolToObject(m, "mlm", 1);
    const char *names[] = {"pad", "unk", "cls", "sep", "mask"};
    for (int i = 0; i < 5; i++) cJSON_AddNumberToObject(ids, names[i], json->special[i]);
  } else if (json) {
    // the special tokens are the tokenizer.json's own (its post-processor adds them)
  } else if (o->mlm) {
    cJSON_AddBoolToObject(m, "mlm", 1);
    const char *names[] = {"pad", "unk", "cls", "sep", "mask", "newline"};
    for (int i = 0; i < TS_PREPARE_MLM_NUM_SPECIAL; i++) cJSON_AddNumberToObject(ids, names[i], i);
  } else {
    cJSON_AddNumberToObject(ids, "unk", 0);
    cJSON_AddNumberToObject(ids, "bos", 1);
    cJSON_AddNumberToObject(ids, "eos", 2);
    cJSON_AddNumberToObject(ids, "newline", TS_PREPARE_NEWLINE_ID);
  }
  if (!hf && !json) cJSON_AddBoolToObject(m, "byte_fallback", 1);
  cJSON_AddStringToObject(m, "source", abs ? abs : o->text_path);
  free(abs);
  if (o->text_field) cJSON_AddStringToObject(m, "text_field", o->text_field);
  cJSON_AddNumberToObject(m, "files", (double)r->files);
  cJSON_AddNumberToObject(m, "val_every", (double)K);
  if (!hf && !json) cJSON_AddNumberToObject(m, "seed", (double)o->seed);
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

// DIR (trailing slashes dropped), whether it existed, and the temporary
// folder beside it that the outputs are written into.
struct OutDir {
  std::string dir, tmp;
  bool exists = false;
};

ts_status MakeOutDir(const ts_prepare_opts *opts, OutDir *o) {
  o->dir = opts->out_dir;
  while (o->dir.size() > 1 && o->dir.back() == '/') o->dir.pop_back();
  struct stat sb;
  o->exists = stat(o->dir.c_str(), &sb) == 0;
  if (o->exists && !S_ISDIR(sb.st_mode))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--out %s: exists and is not a directory",
                        opts->out_dir);
  size_t slash = o->dir.rfind('/');
  std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : o->dir.substr(0, slash));
  std::string leaf = slash == std::string::npos ? o->dir : o->dir.substr(slash + 1);
  std::string tmpl = parent + "/." + leaf + ".prepare-XXXXXX";
  std::vector<char> tbuf(tmpl.begin(), tmpl.end());
  tbuf.push_back('\0');
  if (mkdtemp(tbuf.data()) == nullptr)
    return ts_set_error(TS_ERR_IO, "--out %s: cannot create a temporary directory in %s: %s",
                        opts->out_dir, parent.c_str(), strerror(errno));
  o->tmp = tbuf.data();
  chmod(o->tmp.c_str(), 0755);  // mkdtemp makes it 0700; it may become DIR itself
  return TS_OK;
}

// Moves the four finished files into place: the whole temporary folder when
// DIR is new, else file by file (a tokenizer file of the other kind that DIR
// holds from an earlier run is removed). On failure the caller removes the
// temporary folder.
ts_status MoveIntoPlace(const ts_prepare_opts *opts, const OutDir &o) {
  if (!o.exists && ts_atomic_rename(o.tmp.c_str(), o.dir.c_str()) == TS_OK) return TS_OK;
  if (!o.exists && mkdir(o.dir.c_str(), 0755) != 0 && errno != EEXIST)
    return ts_set_error(TS_ERR_IO, "--out %s: cannot create: %s", opts->out_dir, strerror(errno));
  for (size_t i = 0; i < kNumFiles; i++) {
    std::string from = o.tmp + "/" + kFiles[i], to = o.dir + "/" + kFiles[i];
    if (access(from.c_str(), F_OK) != 0) {  // the other tokenizer file: an older one goes
      unlink(to.c_str());
      continue;
    }
    if (ts_atomic_rename(from.c_str(), to.c_str()) != TS_OK) {
      std::string why = ts_last_error();  // a copy: ts_set_error rewrites that buffer
      return ts_set_error(TS_ERR_IO, "--out %s: cannot move %s into place: %s", opts->out_dir,
                          kFiles[i], why.c_str());
    }
  }
  rmdir(o.tmp.c_str());
  return TS_OK;
}

// train.bin and val.bin being written into the temporary folder, with the
// token counts per id that the unigram baseline needs.
struct Shards {
  ts_token_file_writer *train = nullptr, *val = nullptr;
  std::vector<double> ctrain, cval;
  Shards() = default;
  Shards(const Shards &) = delete;
  Shards &operator=(const Shards &) = delete;
  ~Shards() {  // after a failure: the .tmp files go
    ts_token_file_writer_discard(train);
    ts_token_file_writer_discard(val);
  }
  ts_status Open(const std::string &tmp, size_t V) {
    ctrain.assign(V, 0.0);
    cval.assign(V, 0.0);
    TS_CHECK(ts_token_file_writer_open(&train, (tmp + "/train.bin").c_str(), V));
    return ts_token_file_writer_open(&val, (tmp + "/val.bin").c_str(), V);
  }
  ts_status Add(bool is_val, const std::vector<uint32_t> &ids) {
    TS_CHECK(ts_token_file_writer_append(is_val ? val : train, ids.data(), ids.size()));
    std::vector<double> &c = is_val ? cval : ctrain;
    for (uint32_t id : ids) c[id] += 1.0;
    return TS_OK;
  }
  size_t Tokens() const {
    return ts_token_file_writer_count(train) + ts_token_file_writer_count(val);
  }
  // The token counts and the unigram baseline (prepare.h) into *r, summed
  // over the vocabulary; then both files committed.
  ts_status Commit(ts_prepare_report *r) {
    const size_t V = ctrain.size(), ntrain = ts_token_file_writer_count(train),
                 nval = ts_token_file_writer_count(val);
    const double denom = (double)ntrain + (double)V;
    double nll = 0.0;
    size_t top = 0;  // the unigram predictor: always train's most frequent token
    for (size_t v = 0; v < V; v++) {
      if (cval[v] > 0) nll -= cval[v] * log((ctrain[v] + 1.0) / denom);
      if (ctrain[v] > ctrain[top]) top = v;
    }
    r->vocab_size = V;
    r->train_tokens = ntrain;
    r->val_tokens = nval;
    r->unigram_val_loss = nval ? nll / (double)nval : 0.0;
    r->unigram_val_accuracy = nval ? cval[top] / (double)nval : 0.0;
    ts_status st = ts_token_file_writer_commit(train);
    train = nullptr;
    TS_CHECK(st);
    st = ts_token_file_writer_commit(val);
    val = nullptr;
    return st;
  }
};

// The rest of DIR beside the committed shards: tokenizer.model (its bytes;
// tokenizer.json when json), meta.json; then everything moved into place.
ts_status Finish(const ts_prepare_opts *opts, const OutDir &od, const std::string &model,
                 const ts_prepare_report &rep, size_t K, const HfTokenizer *hf,
                 const JsonTokenizer *json = nullptr) {
  std::string meta;
  TS_CHECK(ts_atomic_write((od.tmp + (json ? "/tokenizer.json" : "/tokenizer.model")).c_str(),
                           model.data(), model.size()));
  TS_CHECK(BuildMeta(opts, &rep, K, hf, json, &meta));
  TS_CHECK(ts_atomic_write((od.tmp + "/meta.json").c_str(), meta.data(), meta.size()));
  return MoveIntoPlace(opts, od);
}

// A corpus of `sections` sections from `files` files, `val` of them
// validation: refused when it has none, or no validation section.
ts_status CheckSplit(const ts_prepare_opts *opts, size_t files, size_t sections, size_t val,
                     size_t K) {
  if (sections == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s: no text (%zu file%s, empty), expected a non-empty corpus",
                        opts->text_path, files, files == 1 ? "" : "s");
  if (val == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s: %zu sections (a text's paragraphs split by blank lines, or "
                        "JSON Lines records), expected at least --val-every %zu so that one is "
                        "validation",
                        opts->text_path, sections, K);
  return TS_OK;
}

// Sections encoded per batch: a batch holds about this many bytes of text
// (ts_prepare_opts.batch_bytes 0).
const size_t kBatchBytes = 16u << 20;

// `prepare --tokenizer`: the corpus streamed in batches of sections through
// the Hugging Face tokenizer into train.bin / val.bin as they come. Memory:
// one batch, its ids, one text file (a text file's sections need the whole
// file), the unigram counts. A progress line on stderr when opts->progress
// and stderr is a terminal.
// A model's tokenizer: its tokenizer.model (SentencePiece, here), or its
// tokenizer.json (the tokenizers library, in a Python helper).
struct ModelTokenizer {
  const HfTokenizer *sp = nullptr;
  JsonTokenizer *json = nullptr;
  size_t Vocab() const { return sp ? (size_t)sp->sp.GetPieceSize() : json->vocab; }
  const char *File() const { return sp ? "tokenizer.model" : "tokenizer.json"; }
  const std::string &Bytes() const { return sp ? sp->model : json->json; }
};

ts_status PrepareHf(const ts_prepare_opts *opts, size_t K, const char *field,
                    const ModelTokenizer &tk, double t0, ts_prepare_report *report) {
  std::vector<std::string> files;
  TS_CHECK(ListCorpus(opts->text_path, &files));
  OutDir od;
  TS_CHECK(MakeOutDir(opts, &od));
  ts_prepare_report rep;
  memset(&rep, 0, sizeof rep);
  bool shown = false;  // a progress line is on the terminal, not yet ended
  ts_status st = [&]() -> ts_status {
    Shards shards;
    TS_CHECK(shards.Open(od.tmp, tk.Vocab()));
    unsigned threads = std::thread::hardware_concurrency();
    threads = std::max(1u, std::min(threads, 16u));
    size_t ndocs = 0, nval = 0, read_bytes = 0;
    const bool show = opts->progress && isatty(STDERR_FILENO);
    double last = NowSeconds();
    std::vector<Doc> batch;
    size_t batch_bytes = 0;
    auto flush = [&]() -> ts_status {
      if (batch.empty()) return TS_OK;
      std::vector<std::vector<uint32_t>> enc;
      std::string why;
      const unsigned t = std::min(threads, (unsigned)batch.size());
      if (tk.json)
        TS_CHECK(EncodeJsonDocs(tk.json, batch, &enc));
      else if (!EncodeDocs(*tk.sp, batch, t, &enc, &why))
        return ts_set_error(TS_ERR_INTERNAL, "--text %s: encoding with %s/tokenizer.model: %s",
                            opts->text_path, opts->tokenizer_dir, why.c_str());
      for (size_t i = 0; i < batch.size(); i++, ndocs++) {
        const bool is_val = (ndocs + 1) % K == 0;
        TS_CHECK(shards.Add(is_val, enc[i]));
        (is_val ? rep.val_bytes : rep.train_bytes) += batch[i].text.size();
        nval += is_val;
      }
      batch.clear();
      batch_bytes = 0;
      if (show && NowSeconds() - last >= 1.0) {
        last = NowSeconds();
        fprintf(stderr, "\r  %.1f MB read (%.1f MB/s), %zu sections, %zu tokens", read_bytes / 1e6,
                read_bytes / 1e6 / (last - t0), ndocs, shards.Tokens());
        shown = true;
      }
      return TS_OK;
    };
    auto take = [&](Doc &&d) -> ts_status {
      if (opts->stop && *opts->stop)
        return ts_set_error(TS_ERR_IO, "--out %s: interrupted by a signal; nothing written",
                            opts->out_dir);
      batch_bytes += d.text.size();
      batch.push_back(std::move(d));
      return batch_bytes >= (opts->batch_bytes ? opts->batch_bytes : kBatchBytes) ? flush() : TS_OK;
    };
    for (const std::string &f : files) {
      if (IsJsonl(f) || IsParquet(f)) {
        auto one = [&](std::string &&text) { return take(Doc{std::move(text), false}); };
        TS_CHECK(IsParquet(f) ? StreamParquet(f, field, &read_bytes, one)
                              : StreamJsonl(f, field, &read_bytes, one));
      } else {
        std::vector<Doc> docs;
        TS_CHECK(ReadTextDocs(f, &docs));
        for (Doc &d : docs) {
          read_bytes += d.text.size();
          TS_CHECK(take(std::move(d)));
        }
      }
    }
    TS_CHECK(flush());
    if (shown) fprintf(stderr, "\n");
    shown = false;
    if (opts->stop && *opts->stop) return TS_ERR_IO;  // said below
    TS_CHECK(CheckSplit(opts, files.size(), ndocs, nval, K));
    rep.files = files.size();
    rep.sections = ndocs;
    rep.val_sections = nval;
    TS_CHECK(shards.Commit(&rep));
    if (tk.json) TS_CHECK(tk.json->helper.Finish());
    return Finish(opts, od, tk.Bytes(), rep, K, tk.sp, tk.json);
  }();
  if (st != TS_OK && opts->stop && *opts->stop)  // a read it cut short, too
    st = ts_set_error(TS_ERR_IO, "--out %s: interrupted by a signal; nothing written",
                      opts->out_dir);
  if (st != TS_OK) {
    if (shown) fprintf(stderr, "\n");  // the error's line is a line of its own
    RemoveTempDir(od.tmp);
    return st;
  }
  rep.seconds = NowSeconds() - t0;
  if (report != nullptr) *report = rep;
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
  const bool hf_mode = opts->tokenizer_dir != nullptr;
  const char *field = opts->text_field ? opts->text_field : "text";
  if (field[0] == '\0')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--text-field: empty, expected a field name");
  const size_t n_special = opts->mlm ? TS_PREPARE_MLM_NUM_SPECIAL : TS_PREPARE_NUM_SPECIAL;
  const uint32_t newline = opts->mlm ? TS_PREPARE_MLM_NEWLINE_ID : TS_PREPARE_NEWLINE_ID;
  const size_t min_vocab = n_special + 256 + 1;
  if (hf_mode && opts->vocab_size != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--vocab-size %zu: not with --tokenizer (the vocabulary is the "
                        "tokenizer's own)",
                        opts->vocab_size);
  const std::string sp_file = hf_mode ? std::string(opts->tokenizer_dir) + "/tokenizer.model" : "",
                    json_file = hf_mode ? std::string(opts->tokenizer_dir) + "/tokenizer.json" : "";
  const bool json_mode = hf_mode && access(sp_file.c_str(), F_OK) != 0 &&
                         access(json_file.c_str(), F_OK) == 0;
  if (hf_mode && opts->mlm && !json_mode)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--mlm with --tokenizer %s: its tokenizer.model (SentencePiece) has no "
                        "[CLS]/[SEP]/[MASK], expected a BERT folder's tokenizer.json (WordPiece) "
                        "or --mlm with a tokenizer trained here (--vocab-size)",
                        opts->tokenizer_dir);
  if (!hf_mode && (opts->vocab_size < min_vocab || opts->vocab_size > (size_t)INT_MAX))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--vocab-size %zu: expected %zu .. %d (%zu special + 256 byte pieces + the "
                        "text's characters and merges)",
                        opts->vocab_size, min_vocab, INT_MAX, n_special);
  const size_t K = opts->val_every ? opts->val_every : TS_PREPARE_DEFAULT_VAL_EVERY;
  if (K < 2)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--val-every %zu: expected >= 2 (every K-th section is validation)", K);
  if (hf_mode) {  // tokenizer.model when the folder has one (tested equal), else tokenizer.json
    if (json_mode) {
      std::vector<std::string> files;
      TS_CHECK(ListCorpus(opts->text_path, &files));  // before the helper starts
      JsonTokenizer json;
      TS_CHECK(LoadJsonTokenizer(opts->tokenizer_dir, opts->mlm, &json));
      ModelTokenizer tk;
      tk.json = &json;
      return PrepareHf(opts, K, field, tk, t0, report);
    }
    HfTokenizer hf;
    TS_CHECK(LoadHfTokenizer(opts->tokenizer_dir, &hf));
    ModelTokenizer tk;
    tk.sp = &hf;
    return PrepareHf(opts, K, field, tk, t0, report);
  }

  // Read the documents and split them: every K-th is validation.
  std::vector<Doc> docs;
  size_t files = 0;
  TS_CHECK(ReadDocuments(opts->text_path, field, &docs, &files));
  size_t n_val = 0;
  for (size_t i = 0; i < docs.size(); i++) n_val += (i + 1) % K == 0;
  TS_CHECK(CheckSplit(opts, files, docs.size(), n_val, K));
  std::vector<uint32_t> train_ids, val_ids;
  std::string model;  // tokenizer.model's bytes

  // The training and validation texts: a text file's sections as they are
  // (they concatenate to the file), a record's text with a line break after
  // it.
  std::string train, val;
  for (size_t i = 0; i < docs.size(); i++) {
    std::string &dst = (i + 1) % K == 0 ? val : train;
    dst += docs[i].text;
    if (!docs[i].section && !HasSuffix(docs[i].text, "\n")) dst += '\n';
  }
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

  // Tokenize both parts.
  TS_CHECK(EncodeText(sp, train, "training", newline, &train_ids));
  TS_CHECK(EncodeText(sp, val, "validation", newline, &val_ids));
  ts_prepare_report rep;
  memset(&rep, 0, sizeof rep);
  rep.files = files;
  rep.sections = docs.size();
  rep.val_sections = n_val;
  rep.train_bytes = train.size();
  rep.val_bytes = val.size();

  // Write everything into a temporary directory beside DIR.
  OutDir od;
  TS_CHECK(MakeOutDir(opts, &od));
  ts_status st = [&]() -> ts_status {
    Shards shards;
    TS_CHECK(shards.Open(od.tmp, opts->vocab_size));
    TS_CHECK(shards.Add(false, train_ids));
    TS_CHECK(shards.Add(true, val_ids));
    TS_CHECK(shards.Commit(&rep));
    return Finish(opts, od, model, rep, K, nullptr);
  }();
  if (st != TS_OK) {
    RemoveTempDir(od.tmp);
    return st;
  }
  rep.seconds = NowSeconds() - t0;
  if (report != nullptr) *report = rep;
  return TS_OK;
}

/* ------------------------------------------------------------ the command */

namespace {

volatile sig_atomic_t g_stop_signal;  // the SIGINT/SIGTERM that stopped the run, or 0

void OnStopSignal(int sig) { g_stop_signal = sig; }

const char kUsage[] =
    "usage: tessera prepare --text PATH --vocab-size N --out DIR [--mlm] [flags]\n"
    "       tessera prepare --text PATH --tokenizer HF_DIR --out DIR [flags]\n"
    "  PATH is a UTF-8 text file, JSON Lines (.jsonl, .ndjson, .json: one object a\n"
    "  line, its text in --text-field), Parquet (.parquet: the --text-field column)\n"
    "  or a folder of them. Trains a SentencePiece BPE tokenizer (byte fallback) on\n"
    "  PATH less every K-th section, or tokenizes with the Hugging Face model\n"
    "  folder's own tokenizer.model (BOS/EOS as its tokenizer_config.json says) or\n"
    "  tokenizer.json, and writes DIR/tokenizer.model (or tokenizer.json),\n"
    "  DIR/train.bin, DIR/val.bin and DIR/meta.json.\n";

}  // namespace

extern "C" int ts_tool_prepare(int argc, char **argv) {
  ts_prepare_opts o;
  memset(&o, 0, sizeof o);
  o.progress = 1;
  size_t seed = 0;
  const char *vocab_given = nullptr;
  const ts_flag flags[] = {
      TS_FLAG_STRING("--text", nullptr, &o.text_path, "PATH",
                     "the corpus: a UTF-8 text file, JSON Lines (.jsonl) or a folder of them; "
                     "required",
                     nullptr),
      TS_FLAG_STRING("--tokenizer", nullptr, &o.tokenizer_dir, "HF_DIR",
                     "tokenize with this Hugging Face folder's tokenizer.model (SentencePiece) "
                     "instead of training one",
                     nullptr),
      TS_FLAG_STRING("--text-field", nullptr, &o.text_field, "NAME",
                     "JSON Lines: the field holding each record's text (default text)", nullptr),
      TS_FLAG_SIZE("--vocab-size", nullptr, &o.vocab_size, 0, "N",
                   "SentencePiece pieces to train, e.g. 4096 (at least 261); required "
                   "without --tokenizer",
                   &vocab_given),
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
    return ts_flags_error("prepare", "--text PATH is required (the corpus: text, JSON Lines or a folder)");
  if (vocab_given == nullptr && o.tokenizer_dir == nullptr)
    return ts_flags_error("prepare",
                          "--vocab-size N (e.g. 4096; at least 261) or --tokenizer HF_DIR is "
                          "required");
  if (vocab_given != nullptr && o.tokenizer_dir != nullptr)
    return ts_flags_error("prepare", "--vocab-size with --tokenizer: expected one of them (the "
                          "vocabulary is the tokenizer's own)");
  if (o.out_dir == nullptr)
    return ts_flags_error("prepare", "--out DIR is required (the output directory)");
  // With --tokenizer, SIGINT/SIGTERM stop the streaming at the next section
  // and leave nothing behind (exit 128 + the signal). Training a tokenizer
  // keeps the default: its outputs appear only at the end.
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  if (o.tokenizer_dir) {
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    o.stop = &g_stop_signal;
  }
  ts_prepare_report r;
  ts_status st = ts_prepare_corpus(&o, &r);
  if (o.tokenizer_dir) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
  if (st != TS_OK) {
    fprintf(stderr, "tessera prepare: %s\n", ts_flags_last_error());
    if (g_stop_signal) return 128 + (int)g_stop_signal;
    return st == TS_ERR_INVALID_ARGUMENT ? 2 : 1;
  }
  const size_t K = o.val_every ? o.val_every : TS_PREPARE_DEFAULT_VAL_EVERY;
  printf("tessera prepare: %s -> %s\n", o.text_path, o.out_dir);
  std::string sp_file = o.tokenizer_dir ? std::string(o.tokenizer_dir) + "/tokenizer.model" : "";
  if (o.tokenizer_dir && access(sp_file.c_str(), F_OK) == 0)
    printf("  tokenizer   %s (sentencepiece), vocab %zu\n", sp_file.c_str(), r.vocab_size);
  else if (o.tokenizer_dir)
    printf("  tokenizer   %s/tokenizer.json (tokenizers), vocab %zu\n", o.tokenizer_dir,
           r.vocab_size);
  else
    printf("  tokenizer   sentencepiece bpe, vocab %zu (byte fallback%s)\n", r.vocab_size,
           o.mlm ? "; masked LM: [PAD] [UNK] [CLS] [SEP] [MASK] = 0-4" : "");
  printf("  sections    %zu from %zu file%s, %zu held out for validation (--val-every %zu)\n",
         r.sections, r.files, r.files == 1 ? "" : "s", r.val_sections, K);
  printf("  train.bin   %zu tokens (%zu bytes of text, %.2f bytes/token)\n", r.train_tokens,
         r.train_bytes, r.train_tokens ? (double)r.train_bytes / (double)r.train_tokens : 0.0);
  printf("  val.bin     %zu tokens (%zu bytes of text, %.1f%% of the text)\n", r.val_tokens,
         r.val_bytes, 100.0 * (double)r.val_bytes / (double)(r.train_bytes + r.val_bytes));
  printf("  unigram val loss %.4f nats/token (train frequencies, add-one smoothing)\n",
         r.unigram_val_loss);
  printf("  took %.1f s\n", r.seconds);
  return 0;
}

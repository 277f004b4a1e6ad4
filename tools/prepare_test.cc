// prepare_test.cc — `tessera prepare` on a small generated corpus: the four
// files, shards that decode back to the exact train/val split, meta.json
// counts, the unigram baseline recomputed from the shards, and bad input that
// leaves no output behind.
#include "tools/prepare.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <math.h>
#include <sentencepiece_processor.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/testing.h"
#include "engine/mlm.h"
#include "engine/token_file.h"

namespace {

using ts_test::TempDir;

const size_t kVocab = 400;
const size_t kValEvery = 5;
const size_t kSections = 40;
const char kKnownSentence[] = "In the beginning was the test, and the test was good.";


bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

std::string Slurp(const std::string &p) {
  std::string s;
  FILE *f = fopen(p.c_str(), "rb");
  if (!f) return s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

void Spit(const std::string &p, const std::string &s) {
  FILE *f = fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(s.data(), 1, s.size(), f);
  fclose(f);
}

// A Bible-shaped corpus of kSections chapters (~30 KB): each section is
// "\nChapter i\n\n" followed by numbered verse lines, so the expected split
// is known. One validation chapter holds a character the training part
// lacks, which only the byte fallback can encode.
struct Corpus {
  std::string text, train, val;
  std::vector<std::string> sections;  // text is their concatenation
};

Corpus MakeCorpus() {
  static const char *words[] = {
      "the",   "and",    "of",     "unto",  "he",    "said",   "land",   "water", "light",
      "great", "people", "went",   "house", "day",   "them",   "king",   "city",  "made",
      "upon",  "gave",   "brought", "forth", "seed",  "earth",  "heaven", "night", "shall",
      "be",    "was",    "in",     "his",   "all",   "before", "came",   "sons",  "café",
      "naïve", "Israel", "Moses",  "after", "their", "kind",   "every",  "thing", "good"};
  const size_t n_words = sizeof words / sizeof words[0];
  uint64_t state = 12345;
  auto next = [&state]() {  // LCG (Knuth MMIX constants)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (size_t)(state >> 33);
  };
  Corpus c;
  for (size_t s = 0; s < kSections; s++) {
    std::string sec = "\nChapter " + std::to_string(s + 1) + "\n\n";
    for (size_t v = 1; v <= 10; v++) {
      std::string line = "  " + std::to_string(v) + " ";
      if (s == 0 && v == 1) {
        line += kKnownSentence;
      } else {
        size_t n = 8 + next() % 10;
        for (size_t w = 0; w < n; w++) {
          std::string word = words[next() % n_words];
          if (w == 0) word[0] = (char)toupper((unsigned char)word[0]);
          line += word;
          line += (w + 1 == n) ? "." : (next() % 7 == 0 ? ", " : " ");
        }
      }
      if (s == kValEvery - 1 && v == 2) line += " \xe2\x98\x83";  // U+2603, validation only
      sec += line + "\n";
    }
    c.text += sec;
    c.sections.push_back(sec);
    ((s + 1) % kValEvery == 0 ? c.val : c.train) += sec;
  }
  return c;
}

std::vector<int> ShardIds(const std::string &path, size_t vocab) {
  std::vector<int> ids;
  ts_token_file *sh = nullptr;
  EXPECT_EQ(ts_token_file_open(&sh, path.c_str(), vocab), TS_OK) << ts_last_error();
  if (!sh) return ids;
  for (size_t i = 0; i < ts_token_file_num_tokens(sh); i++) ids.push_back((int)ts_token_file_token(sh, i));
  ts_token_file_close(sh);
  return ids;
}

double JsonNumber(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  EXPECT_TRUE(cJSON_IsNumber(v)) << key;
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

TEST(Prepare, WritesTokenizerShardsAndMeta) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  ASSERT_GT(c.text.size(), 20000u);
  ASSERT_LT(c.text.size(), 40000u);
  const std::string text_path = dir.path("corpus.txt"), out = dir.path("out");
  Spit(text_path, c.text);

  ts_prepare_opts opts = {text_path.c_str(), out.c_str(), kVocab, kValEvery, 7};
  ts_prepare_report rep;
  ASSERT_EQ(ts_prepare_corpus(&opts, &rep), TS_OK) << ts_last_error();
  for (const char *f : {"tokenizer.model", "train.bin", "val.bin", "meta.json"})
    EXPECT_TRUE(Exists(out + "/" + f)) << f;
  // Only the corpus and the output directory: no temporary directory left.
  EXPECT_EQ(dir.List().size(), 2u);
  EXPECT_EQ(rep.sections, kSections);
  EXPECT_EQ(rep.val_sections, kSections / kValEvery);
  EXPECT_EQ(rep.train_bytes, c.train.size());
  EXPECT_EQ(rep.val_bytes, c.val.size());

  // The shards load and decode back to exactly the training / validation text.
  std::vector<int> train_ids = ShardIds(out + "/train.bin", kVocab);
  std::vector<int> val_ids = ShardIds(out + "/val.bin", kVocab);
  EXPECT_EQ(train_ids.size(), rep.train_tokens);
  EXPECT_EQ(val_ids.size(), rep.val_tokens);
  EXPECT_LT(train_ids.size(), c.train.size());  // BPE merges: fewer tokens than bytes
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(out + "/tokenizer.model").ok());
  EXPECT_EQ(sp.GetPieceSize(), (int)kVocab);
  EXPECT_EQ(sp.IdToPiece(TS_PREPARE_NEWLINE_ID), "\n");
  std::string train_text, val_text;
  ASSERT_TRUE(sp.Decode(train_ids, &train_text).ok());
  ASSERT_TRUE(sp.Decode(val_ids, &val_text).ok());
  EXPECT_NE(train_text.find(kKnownSentence), std::string::npos);
  EXPECT_EQ(train_text, c.train);
  EXPECT_EQ(val_text, c.val);  // includes the snowman, through byte pieces
  EXPECT_EQ(c.train.find("\xe2\x98\x83"), std::string::npos);

  // meta.json is well-formed and agrees with the shards.
  cJSON *meta = cJSON_Parse(Slurp(out + "/meta.json").c_str());
  ASSERT_NE(meta, nullptr);
  EXPECT_EQ(JsonNumber(meta, "vocab_size"), (double)kVocab);
  EXPECT_EQ(JsonNumber(meta, "train_tokens"), (double)train_ids.size());
  EXPECT_EQ(JsonNumber(meta, "val_tokens"), (double)val_ids.size());
  EXPECT_EQ(JsonNumber(meta, "val_every"), (double)kValEvery);
  const cJSON *tok = cJSON_GetObjectItemCaseSensitive(meta, "tokenizer");
  ASSERT_TRUE(cJSON_IsString(tok));
  EXPECT_STREQ(tok->valuestring, "sentencepiece-bpe");
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(meta, "source");
  ASSERT_TRUE(cJSON_IsString(src));
  EXPECT_NE(std::string(src->valuestring).find("corpus.txt"), std::string::npos);

  // The unigram baseline, recomputed from the shards (add-one smoothing).
  std::vector<double> counts(kVocab, 0.0);
  for (int t : train_ids) counts[t] += 1.0;
  double nll = 0.0;
  for (int t : val_ids) nll -= log((counts[t] + 1.0) / ((double)train_ids.size() + kVocab));
  const double expect = nll / (double)val_ids.size();
  // prepare sums per vocabulary entry (count x log), this per token: the
  // same terms in another order, well inside 1e-12.
  EXPECT_NEAR(rep.unigram_val_loss, expect, 1e-12);
  EXPECT_NEAR(JsonNumber(meta, "unigram_val_loss"), expect, 1e-12);
  EXPECT_GT(expect, 1.0);           // a real text is far from one repeated token
  EXPECT_LT(expect, log((double)kVocab));  // frequencies beat the uniform distribution
  cJSON_Delete(meta);
}

TEST(Prepare, ReplacesFilesInExistingDirectory) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  const std::string text_path = dir.path("corpus.txt"), out = dir.path("out");
  Spit(text_path, c.text);
  ASSERT_EQ(mkdir(out.c_str(), 0755), 0);
  Spit(out + "/keep.txt", "unrelated");
  Spit(out + "/meta.json", "stale");
  ts_prepare_opts opts = {text_path.c_str(), out.c_str(), kVocab, 4, 0};
  ts_prepare_report rep;
  ASSERT_EQ(ts_prepare_corpus(&opts, &rep), TS_OK) << ts_last_error();
  EXPECT_EQ(rep.val_sections, kSections / 4);
  EXPECT_EQ(Slurp(out + "/keep.txt"), "unrelated");
  cJSON *meta = cJSON_Parse(Slurp(out + "/meta.json").c_str());
  ASSERT_NE(meta, nullptr);
  EXPECT_EQ(JsonNumber(meta, "val_every"), 4.0);
  cJSON_Delete(meta);
  EXPECT_EQ(dir.List().size(), 2u);
}

TEST(Prepare, MissingTextFileCreatesNothing) {
  TempDir dir("ts_prepare_test");
  const std::string text_path = dir.path("missing.txt"), out = dir.path("out");
  ts_prepare_opts opts = {text_path.c_str(), out.c_str(), kVocab, kValEvery, 0};
  EXPECT_EQ(ts_prepare_corpus(&opts, nullptr), TS_ERR_IO);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("--text"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  EXPECT_FALSE(Exists(out));
  EXPECT_TRUE(dir.List().empty());
}

TEST(Prepare, VocabularyTooSmallForByteFallback) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  const std::string text_path = dir.path("corpus.txt"), out = dir.path("out");
  Spit(text_path, c.text);
  ts_prepare_opts opts = {text_path.c_str(), out.c_str(), 270, kValEvery, 0};
  EXPECT_EQ(ts_prepare_corpus(&opts, nullptr), TS_ERR_INVALID_ARGUMENT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("--vocab-size 270"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected at least"), std::string::npos) << msg;
  EXPECT_FALSE(Exists(out));
  EXPECT_EQ(dir.List().size(), 1u);
}

TEST(Prepare, TooFewSectionsForValidation) {
  TempDir dir("ts_prepare_test");
  const std::string text_path = dir.path("corpus.txt"), out = dir.path("out");
  Spit(text_path, "one paragraph only\nand no blank line\n");
  ts_prepare_opts opts = {text_path.c_str(), out.c_str(), kVocab, kValEvery, 0};
  EXPECT_EQ(ts_prepare_corpus(&opts, nullptr), TS_ERR_INVALID_ARGUMENT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("--val-every 5"), std::string::npos) << msg;
  EXPECT_FALSE(Exists(out));
}

TEST(PrepareTool, MissingFlagReturnsTwo) {
  TempDir dir("ts_prepare_test");
  const std::string out = dir.path("out");
  std::string text = dir.path("corpus.txt");
  Spit(text, MakeCorpus().text);
  std::vector<std::string> args = {"prepare", "--text", text, "--out", out};
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(&a[0]);
  EXPECT_EQ(ts_tool_prepare((int)argv.size(), argv.data()), 2);
  EXPECT_NE(std::string(ts_last_error()).find("--vocab-size"), std::string::npos);
  EXPECT_FALSE(Exists(out));

  std::vector<std::string> bad = {"prepare", "--text", text, "--vocab-size", "many", "--out", out};
  argv.clear();
  for (auto &a : bad) argv.push_back(&a[0]);
  EXPECT_EQ(ts_tool_prepare((int)argv.size(), argv.data()), 2);
  EXPECT_NE(std::string(ts_last_error()).find("--vocab-size many: expected"), std::string::npos);

  std::vector<std::string> good = {"prepare", "--text=" + text, "--vocab-size=400", "--out", out,
                                   "--val-every", "5", "--seed", "3"};
  argv.clear();
  for (auto &a : good) argv.push_back(&a[0]);
  EXPECT_EQ(ts_tool_prepare((int)argv.size(), argv.data()), 0) << ts_last_error();
  EXPECT_TRUE(Exists(out + "/train.bin"));
}

// ---------------------------------------------- a Hugging Face tokenizer

const char kHfDir[] = "tests/hf_tokenizer/";

// One JSON Lines line {"FIELD": text} (cJSON escapes the text).
std::string JsonlLine(const std::string &text, const char *field = "text") {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, field, text.c_str());
  char *p = cJSON_PrintUnformatted(o);
  std::string line = std::string(p) + "\n";
  free(p);
  cJSON_Delete(o);
  return line;
}

// samples.json: the texts and, per fixture folder, transformers' ids.
struct HfSamples {
  std::vector<std::string> texts;
  std::vector<std::vector<int>> ids;
};

HfSamples LoadSamples(const char *fixture) {
  HfSamples out;
  cJSON *root = cJSON_Parse(Slurp(std::string(kHfDir) + "samples.json").c_str());
  EXPECT_NE(root, nullptr) << "tests/hf_tokenizer/samples.json";
  if (!root) return out;
  const cJSON *t, *l;
  cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "samples"))
      out.texts.push_back(t->valuestring);
  cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(root, fixture)) {
    std::vector<int> ids;
    const cJSON *id;
    cJSON_ArrayForEach(id, l) ids.push_back(id->valueint);
    out.ids.push_back(ids);
  }
  cJSON_Delete(root);
  EXPECT_EQ(out.texts.size(), out.ids.size());
  return out;
}

// The non-empty samples as JSON Lines records, and their ids as --val-every
// 2 splits them: record i is validation when (i + 1) % 2 == 0. Returns the
// record count.
size_t SplitSamples(const HfSamples &s, std::string *jsonl, std::vector<int> *train,
                    std::vector<int> *val) {
  size_t n = 0;
  for (size_t i = 0; i < s.texts.size(); i++) {
    if (s.texts[i].empty()) continue;
    *jsonl += JsonlLine(s.texts[i]);
    std::vector<int> *dst = (n + 1) % 2 == 0 ? val : train;
    dst->insert(dst->end(), s.ids[i].begin(), s.ids[i].end());
    n++;
  }
  return n;
}

ts_status PrepareHf(const std::string &text, const std::string &out, const char *fixture,
                    size_t val_every, const char *field = nullptr, size_t batch_bytes = 0,
                    int mlm = 0) {
  const std::string hf = std::string(kHfDir) + fixture;
  ts_prepare_opts o;
  memset(&o, 0, sizeof o);
  o.text_path = text.c_str();
  o.out_dir = out.c_str();
  o.val_every = val_every;
  o.tokenizer_dir = hf.c_str();
  o.text_field = field;
  o.batch_bytes = batch_bytes;
  o.mlm = mlm;
  return ts_prepare_corpus(&o, nullptr);
}

// samples.json's texts as JSON Lines in DIR/corpus.jsonl, prepared with
// --tokenizer fixture --val-every 2 (and mlm) into DIR/out; the ids its
// `ids_key` list says they must give, split as SplitSamples splits them.
struct Prepared {
  ts_status st = TS_OK;
  std::string out;
  size_t texts = 0, n = 0;  // samples, and records written (the non-empty ones)
  std::vector<int> train, val;
  // out/meta.json parsed (free with cJSON_Delete), its "sections" checked
  // against the records written; NULL (a failure) if unreadable.
  cJSON *Meta() const {
    cJSON *meta = cJSON_Parse(Slurp(out + "/meta.json").c_str());
    EXPECT_NE(meta, nullptr);
    if (meta) EXPECT_EQ(JsonNumber(meta, "sections"), (double)n);
    return meta;
  }
  // train.bin and val.bin hold the expected ids (vocabulary V).
  void ExpectShards(size_t V) const {
    EXPECT_EQ(ShardIds(out + "/train.bin", V), train);
    EXPECT_EQ(ShardIds(out + "/val.bin", V), val);
  }
};
Prepared PrepareSamples(TempDir &dir, const char *ids_key, const char *fixture, int mlm = 0) {
  Prepared p;
  HfSamples s = LoadSamples(ids_key);
  std::string jsonl;
  p.texts = s.texts.size();
  p.n = SplitSamples(s, &jsonl, &p.train, &p.val);
  const std::string text = dir.path("corpus.jsonl");
  p.out = dir.path("out");
  Spit(text, jsonl);
  p.st = PrepareHf(text, p.out, fixture, 2, nullptr, 0, mlm);
  return p;
}

// Every sample a record: record i is validation when (i + 1) % 2 == 0, so
// train.bin is the even records' ids (as transformers gives them, BOS and
// EOS included) back to back and val.bin the odd ones'. Records with empty
// text are skipped, as prepare skips them.
TEST(PrepareHf, SentencePieceIdsEqualTransformersWithBosAndEos) {
  // llama_sp_json also has a tokenizer.json whose normalizer prepends "▁"
  // to every text: transformers 5 gives the same ids as without it.
  for (const char *fixture : {"llama_sp", "llama_sp_eos", "llama_sp_json"}) {
    SCOPED_TRACE(fixture);
    TempDir dir("ts_prepare_test");
    Prepared p = PrepareSamples(dir, fixture, fixture);
    ASSERT_GE(p.texts, 10u);
    ASSERT_EQ(p.st, TS_OK) << ts_last_error();
    const std::string &out = p.out;
    const size_t V = 480;  // make_fixtures.py's vocab_size
    p.ExpectShards(V);
    EXPECT_EQ(Slurp(out + "/tokenizer.model"),
              Slurp(std::string(kHfDir) + fixture + "/tokenizer.model"));
    cJSON *meta = p.Meta();
    ASSERT_NE(meta, nullptr);
    EXPECT_EQ(JsonNumber(meta, "vocab_size"), (double)V);
    EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(meta, "tokenizer")->valuestring, "sentencepiece");
    EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "add_bos")));
    EXPECT_EQ(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "add_eos")),
              std::string(fixture) == "llama_sp_eos");
    // The unigram baseline recomputed token by token from the shards; prepare
    // sums it per vocabulary entry, another order: 1e-12 relative covers it.
    std::vector<double> counts(V, 0.0);
    for (int t : p.train) counts[t] += 1.0;
    double nll = 0.0;
    for (int t : p.val) nll -= log((counts[t] + 1.0) / ((double)p.train.size() + V));
    const double unigram = nll / (double)p.val.size();
    EXPECT_NEAR(JsonNumber(meta, "unigram_val_loss"), unigram, 1e-12 * unigram);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(meta, "special_ids");
    EXPECT_EQ(JsonNumber(ids, "bos"), 1.0);
    EXPECT_EQ(JsonNumber(ids, "eos"), 2.0);
    EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(ids, "newline"), nullptr);
    cJSON_Delete(meta);
    EXPECT_EQ(dir.List().size(), 2u);  // the corpus and DIR: no temporary folder left
  }
}

// A byte-level BPE tokenizer.json (BOS from its post-processor) and a
// WordPiece one ([CLS] $A [SEP], lowercasing), both trained by the tokenizers
// library: the shards hold AutoTokenizer's ids, through the Python helper
// (tools/py_helper.h); tokenizer.json is copied, meta.json says "tokenizers".
// The same samples as Parquet give the same shards as JSON Lines.
TEST(PrepareHf, TokenizerJsonIdsEqualTransformersAndParquetEqualsJsonLines) {
  for (const char *fixture : {"bpe_json", "wordpiece_json"}) {
    SCOPED_TRACE(fixture);
    TempDir dir("ts_prepare_test");
    Prepared p = PrepareSamples(dir, fixture, fixture);
    ASSERT_GE(p.texts, 10u);
    ASSERT_EQ(p.st, TS_OK) << ts_last_error();
    const std::string &out = p.out;
    cJSON *meta = p.Meta();
    ASSERT_NE(meta, nullptr);
    const size_t V = (size_t)JsonNumber(meta, "vocab_size");
    EXPECT_GT(V, 300u);
    EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(meta, "tokenizer")->valuestring, "tokenizers");
    EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(meta, "tokenizer_model")->valuestring,
                 "tokenizer.json");
    cJSON_Delete(meta);
    p.ExpectShards(V);
    EXPECT_EQ(Slurp(out + "/tokenizer.json"),
              Slurp(std::string(kHfDir) + fixture + "/tokenizer.json"));
    EXPECT_FALSE(Exists(out + "/tokenizer.model"));
    // Parquet (samples.parquet: the same texts, a column "text") and the
    // committed samples.jsonl give these very shards.
    for (const char *input : {"samples.parquet", "samples.jsonl"}) {
      const std::string out2 = dir.path(std::string("from-") + input);
      ASSERT_EQ(PrepareHf(std::string(kHfDir) + input, out2, fixture, 2), TS_OK) << ts_last_error();
      EXPECT_EQ(Slurp(out2 + "/train.bin"), Slurp(out + "/train.bin")) << input;
      EXPECT_EQ(Slurp(out2 + "/val.bin"), Slurp(out + "/val.bin")) << input;
    }
  }
}

// --mlm with a BERT folder's tokenizer.json: the shards hold the text tokens
// alone (AutoTokenizer(text, add_special_tokens=False)), meta.json says
// "mlm": true with the tokenizer's own [PAD] [UNK] [CLS] [SEP] [MASK] ids
// (here 0, 1 and 361-363, after the vocabulary); a tokenizer.model (no
// [MASK]) is refused in one line.
TEST(PrepareHf, MlmWithAModelsWordPieceKeepsItsSpecialIds) {
  TempDir dir("ts_prepare_test");
  Prepared p = PrepareSamples(dir, "bert_wordpiece_plain", "bert_wordpiece", 1);
  ASSERT_EQ(p.st, TS_OK) << ts_last_error();
  const std::string &out = p.out;
  cJSON *meta = p.Meta();
  ASSERT_NE(meta, nullptr);
  const size_t V = (size_t)JsonNumber(meta, "vocab_size");
  EXPECT_EQ(V, 364u);
  EXPECT_TRUE(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "mlm")));
  cJSON *fix = cJSON_Parse(Slurp(std::string(kHfDir) + "samples.json").c_str());
  const cJSON *want = cJSON_GetObjectItemCaseSensitive(fix, "bert_wordpiece_special");
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(meta, "special_ids");
  const char *names[][2] = {{"pad", "[PAD]"}, {"unk", "[UNK]"}, {"cls", "[CLS]"},
                            {"sep", "[SEP]"}, {"mask", "[MASK]"}};
  for (auto &nm : names) EXPECT_EQ(JsonNumber(ids, nm[0]), JsonNumber(want, nm[1])) << nm[0];
  EXPECT_EQ(JsonNumber(ids, "mask"), 363.0);
  cJSON_Delete(fix);
  cJSON_Delete(meta);
  p.ExpectShards(V);
  ts_mlm_spec spec;  // and the masked-LM loader takes these ids
  ASSERT_EQ(ts_mlm_read_meta(out.c_str(), &spec), TS_OK) << ts_last_error();
  EXPECT_EQ(spec.cls_id, 361);
  EXPECT_EQ(spec.sep_id, 362);
  // --mlm with a SentencePiece tokenizer.model: no [MASK] to be had
  const std::string sp = std::string(kHfDir) + "llama_sp", out2 = dir.path("out2");
  EXPECT_EQ(PrepareHf(dir.path("corpus.jsonl"), out2, "llama_sp", 2, nullptr, 0, 1),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(ts_last_error()),
            "--mlm with --tokenizer " + sp + ": its tokenizer.model (SentencePiece) has no "
            "[CLS]/[SEP]/[MASK], expected a BERT folder's tokenizer.json (WordPiece) or --mlm "
            "with a tokenizer trained here (--vocab-size)");
  EXPECT_FALSE(Exists(out2));
}

// The same documents as a text file's sections, as JSON Lines records, and
// as a folder of two JSON Lines files: the same shards.
TEST(PrepareHf, TextJsonLinesAndAFolderGiveTheSameTokens) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  const std::string txt = dir.path("corpus.txt"), jsonl = dir.path("corpus.jsonl");
  Spit(txt, c.text);
  std::string all, first, second;
  for (size_t i = 0; i < c.sections.size(); i++) {
    std::string line = JsonlLine(c.sections[i], "content");
    all += line;
    (i < 13 ? first : second) += line;
  }
  Spit(jsonl, all);
  ASSERT_EQ(mkdir(dir.path("parts").c_str(), 0755), 0);
  Spit(dir.path("parts/a.jsonl"), first);
  Spit(dir.path("parts/b.jsonl"), second);
  ASSERT_EQ(PrepareHf(txt, dir.path("from_txt"), "llama_sp", kValEvery), TS_OK) << ts_last_error();
  ASSERT_EQ(PrepareHf(jsonl, dir.path("from_jsonl"), "llama_sp", kValEvery, "content"), TS_OK)
      << ts_last_error();
  ASSERT_EQ(PrepareHf(dir.path("parts"), dir.path("from_folder"), "llama_sp", kValEvery, "content"),
            TS_OK)
      << ts_last_error();
  // Streamed a section at a time (every section its own batch) and in
  // batches of about 3 KB: the same shards as one batch.
  ASSERT_EQ(PrepareHf(jsonl, dir.path("one_by_one"), "llama_sp", kValEvery, "content", 1), TS_OK)
      << ts_last_error();
  ASSERT_EQ(PrepareHf(dir.path("parts"), dir.path("by_3k"), "llama_sp", kValEvery, "content", 3000),
            TS_OK)
      << ts_last_error();
  for (const char *f : {"/train.bin", "/val.bin"}) {
    std::vector<int> want = ShardIds(dir.path("from_txt") + f, 480);
    EXPECT_GT(want.size(), 1000u) << f;
    EXPECT_EQ(ShardIds(dir.path("from_jsonl") + f, 480), want) << f;
    EXPECT_EQ(ShardIds(dir.path("from_folder") + f, 480), want) << f;
    EXPECT_EQ(ShardIds(dir.path("one_by_one") + f, 480), want) << f;
    EXPECT_EQ(ShardIds(dir.path("by_3k") + f, 480), want) << f;
  }
  // Each section is its own document: one BOS per section.
  std::vector<int> train = ShardIds(dir.path("from_txt") + "/train.bin", 480);
  EXPECT_EQ((size_t)std::count(train.begin(), train.end(), 1), kSections - kSections / kValEvery);
  cJSON *meta = cJSON_Parse(Slurp(dir.path("from_folder") + "/meta.json").c_str());
  ASSERT_NE(meta, nullptr);
  EXPECT_EQ(JsonNumber(meta, "files"), 2.0);
  cJSON_Delete(meta);
}

// A tokenizer trained here reads JSON Lines too: each record's text and a
// line break, so the shards decode to the records' texts line by line.
TEST(Prepare, TrainsOnJsonLinesRecords) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  std::string jsonl, want_train, want_val;
  for (size_t i = 0; i < c.sections.size(); i++) {
    std::string body = c.sections[i].substr(1, c.sections[i].size() - 2);  // no outer line breaks
    jsonl += JsonlLine(body);
    ((i + 1) % kValEvery == 0 ? want_val : want_train) += body + "\n";
  }
  const std::string text = dir.path("c.jsonl"), out = dir.path("out");
  Spit(text, jsonl);
  ts_prepare_opts opts = {text.c_str(), out.c_str(), kVocab, kValEvery, 7};
  ASSERT_EQ(ts_prepare_corpus(&opts, nullptr), TS_OK) << ts_last_error();
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(out + "/tokenizer.model").ok());
  std::string train, val;
  ASSERT_TRUE(sp.Decode(ShardIds(out + "/train.bin", kVocab), &train).ok());
  ASSERT_TRUE(sp.Decode(ShardIds(out + "/val.bin", kVocab), &val).ok());
  EXPECT_EQ(train, want_train);
  EXPECT_EQ(val, want_val);
}

// Bad input: one line naming the file (and line, and field) and the
// expected value, and nothing written.
TEST(PrepareHf, BadInputIsOneLineAndWritesNothing) {
  TempDir dir("ts_prepare_test");
  const std::string out = dir.path("out");
  struct Case {
    const char *name, *content, *want;
    const char *field;
  } cases[] = {
      {"bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": oops}\n",
       "bad.jsonl:2: not valid JSON or not an object", nullptr},
      {"array.jsonl", "[\"text\"]\n", "array.jsonl:1: not valid JSON or not an object", nullptr},
      {"two.jsonl", "{\"text\": \"a\"}{\"text\": \"b\"}\n", "two.jsonl:1: more after the JSON object",
       nullptr},
      {"nul.jsonl", "{\"text\": \"a\\\\u0000 is text\"}\n{\"text\": \"ab\\u0000cd\"}\n",
       "nul.jsonl:2: \\u0000 (a NUL character)", nullptr},
      {"null.JSONL", "{\"text\": null}\n", "null.JSONL:1: field \"text\" is null", nullptr},
      {"nofield.jsonl", "{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n",
       "nofield.jsonl:3: field \"text\" missing, expected a string", nullptr},
      {"number.jsonl", "{\"text\": 3}\n", "number.jsonl:1: field \"text\" is not a string",
       nullptr},
      {"other.jsonl", "{\"text\": \"a\"}\n", "other.jsonl:1: field \"body\" missing", "body"},
      {"latin1.jsonl", "{\"text\": \"caf\xe9\"}\n",
       "latin1.jsonl:1: invalid UTF-8 at byte 13 of the line", nullptr},
      {"empty.jsonl", "\n{\"text\": \"\"}\n  \n", "no text (1 file, empty)", nullptr},
      {"data.parquet", "PAR1", "data.parquet: not a Parquet file Arrow reads", nullptr},
  };
  for (const Case &k : cases) {
    SCOPED_TRACE(k.name);
    const std::string path = dir.path(k.name);
    Spit(path, k.content);
    EXPECT_EQ(PrepareHf(path, out, "llama_sp", 2, k.field), TS_ERR_INVALID_ARGUMENT);
    std::string msg = ts_last_error();
    EXPECT_NE(msg.find(k.want), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_FALSE(Exists(out));
  }
  // A folder inside the corpus folder; a tokenizer folder without
  // tokenizer.model, and one with only tokenizer.json.
  ASSERT_EQ(mkdir(dir.path("corpus").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.path("corpus/sub").c_str(), 0755), 0);
  Spit(dir.path("corpus/a.txt"), "text\n");
  EXPECT_EQ(PrepareHf(dir.path("corpus"), out, "llama_sp", 2), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("corpus/sub: a folder inside the corpus folder"),
            std::string::npos)
      << ts_last_error();
  ASSERT_EQ(mkdir(dir.path("hf").c_str(), 0755), 0);
  ts_prepare_opts o;
  memset(&o, 0, sizeof o);
  const std::string text = dir.path("corpus/a.txt"), hf = dir.path("hf");
  o.text_path = text.c_str();
  o.out_dir = out.c_str();
  o.tokenizer_dir = hf.c_str();
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("no tokenizer.model"), std::string::npos)
      << ts_last_error();
  Spit(dir.path("hf/tokenizer.json"), "{}");
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error())
                .find("--tokenizer " + hf + ": tokenizer.json: "),
            std::string::npos)
      << ts_last_error();
  EXPECT_NE(std::string(ts_last_error())
                .find("expected a tokenizer.json of Hugging Face's tokenizers"),
            std::string::npos)
      << ts_last_error();
  EXPECT_FALSE(Exists(out));
  // Parquet with a null text, or numbers where the text should be; a
  // column that is not there: one line each naming the file (and the row)
  const std::string pq_null = std::string(kHfDir) + "bad_null.parquet",
                    pq_int = std::string(kHfDir) + "bad_int.parquet";
  const std::pair<std::string, std::string> pq_cases[] = {
      {pq_null, "--text " + pq_null + ": row 1: field \"text\" is null, expected a string"},
      {pq_int, "--text " + pq_int + ": column \"text\" holds int64, expected strings"},
  };
  for (const auto &k : pq_cases) {
    EXPECT_EQ(PrepareHf(k.first, out, "llama_sp", 2), TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(ts_last_error()), k.second);
    EXPECT_FALSE(Exists(out));
  }
  EXPECT_EQ(PrepareHf(std::string(kHfDir) + "samples.parquet", out, "llama_sp", 2, "body"),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(ts_last_error()), "--text " + std::string(kHfDir) +
                                              "samples.parquet: no column \"body\" (--text-field), "
                                              "expected one of: text, n");
  Spit(dir.path("hf/tokenizer.model"), "not a model");
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("tokenizer.model: "), std::string::npos)
      << ts_last_error();
  // The fixture's model with add_prefix_space false (not read yet); a model
  // trained here as prepare trains (no dummy prefix): transformers 5 would
  // give other ids, so both are refused.
  Spit(dir.path("hf/tokenizer.model"), Slurp(std::string(kHfDir) + "llama_sp/tokenizer.model"));
  Spit(dir.path("hf/tokenizer_config.json"), "{\"add_prefix_space\": false}");
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("\"add_prefix_space\" is false: not read yet"),
            std::string::npos)
      << ts_last_error();
  {
    Corpus c = MakeCorpus();
    Spit(dir.path("c.txt"), c.text);
    ts_prepare_opts t = {nullptr, nullptr, kVocab, kValEvery, 0};
    const std::string ctxt = dir.path("c.txt"), own = dir.path("own");
    t.text_path = ctxt.c_str();
    t.out_dir = own.c_str();
    ASSERT_EQ(ts_prepare_corpus(&t, nullptr), TS_OK) << ts_last_error();
    o.tokenizer_dir = own.c_str();
    EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ts_last_error()).find("tokenizer.model has no dummy prefix"),
              std::string::npos)
        << ts_last_error();
  }
  EXPECT_FALSE(Exists(out));
}

// A stop request (a signal handler's flag) ends the run with nothing
// written, however far it got.
TEST(PrepareHf, AStopRequestLeavesNothing) {
  TempDir dir("ts_prepare_test");
  Corpus c = MakeCorpus();
  const std::string text = dir.path("c.txt"), out = dir.path("out"), hf = std::string(kHfDir) + "llama_sp";
  Spit(text, c.text);
  volatile sig_atomic_t stop = 1;
  ts_prepare_opts o;
  memset(&o, 0, sizeof o);
  o.text_path = text.c_str();
  o.out_dir = out.c_str();
  o.tokenizer_dir = hf.c_str();
  o.stop = &stop;
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("interrupted by a signal; nothing written"),
            std::string::npos)
      << ts_last_error();
  EXPECT_EQ(dir.List().size(), 1u);  // the corpus alone: no DIR, no temporary folder
  stop = 0;
  EXPECT_EQ(ts_prepare_corpus(&o, nullptr), TS_OK) << ts_last_error();
}

TEST(PrepareTool, TokenizerAndVocabSizeAreOneOrTheOther) {
  TempDir dir("ts_prepare_test");
  const std::string text = dir.path("c.txt"), out = dir.path("out");
  Spit(text, MakeCorpus().text);
  std::vector<std::string> args = {"prepare",     "--text", text, "--tokenizer",
                                   std::string(kHfDir) + "llama_sp", "--vocab-size", "400",
                                   "--out",       out};
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(&a[0]);
  EXPECT_EQ(ts_tool_prepare((int)argv.size(), argv.data()), 2);
  EXPECT_NE(std::string(ts_last_error()).find("--vocab-size with --tokenizer"), std::string::npos)
      << ts_last_error();
  EXPECT_FALSE(Exists(out));
  args.erase(args.begin() + 5, args.begin() + 7);  // without --vocab-size
  argv.clear();
  for (auto &a : args) argv.push_back(&a[0]);
  EXPECT_EQ(ts_tool_prepare((int)argv.size(), argv.data()), 0) << ts_last_error();
  EXPECT_TRUE(Exists(out + "/train.bin"));
}

}  // namespace

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
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "base/testing.h"
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
  // Same terms in the same order; 1e-12 only absorbs printing to JSON.
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

}  // namespace

// mlm_test.cc — masked-LM batches: the 15% / 80-10-10 statistics over 10^6
// tokens, specials never selected, [CLS] ... [SEP] framing, masks that are
// a pure function of (seed, sample) whatever the rank count, and the
// meta.json checks (one line naming the file and field).
#include "engine/mlm.h"

#include <gtest/gtest.h>
#include <stdio.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/testing.h"
#include "engine/loader.h"

namespace {

using ts_test::TempDir;

ts_mlm_spec Spec(size_t vocab = 4096) {
  ts_mlm_spec s{};
  s.pad_id = 0;
  s.unk_id = 1;
  s.cls_id = 2;
  s.sep_id = 3;
  s.mask_id = 4;
  s.n_special = 5;
  s.vocab_size = vocab;
  s.mask_prob = 0.15;
  s.replace_prob = 0.8;
  s.random_prob = 0.1;
  return s;
}

TEST(Mlm, StatisticsOverAMillionTokens) {
  // 10^6 text tokens (ids >= 5) with a special every 8th position: 15.0 %
  // of the text tokens selected within +-0.1 % (the binomial's sd is 0.036
  // %, so this is ~3 sd), of those 80 / 10 / 10 within +-0.3 % (sd 0.10 %).
  ts_mlm_spec s = Spec();
  const size_t T = 128, rows = 9000;  // 1 152 000 positions, 1 008 000 text tokens
  size_t text = 0, selected = 0, masked = 0, random = 0, kept = 0, special_selected = 0;
  std::vector<int32_t> in(T), orig(T), tg(T);
  for (size_t k = 0; k < rows; k++) {
    for (size_t t = 0; t < T; t++)
      orig[t] = t % 8 == 0 ? (int32_t)(t / 8 % 5) : (int32_t)(5 + (k * 131 + t * 17) % 4091);
    in = orig;
    ts_mlm_mask(&s, 42, k, in.data(), tg.data(), T);
    for (size_t t = 0; t < T; t++) {
      bool special = orig[t] < s.n_special;
      text += !special;
      if (tg[t] == -100) {
        EXPECT_EQ(in[t], orig[t]) << "an unselected token changed";
        continue;
      }
      if (special) special_selected++;
      EXPECT_EQ(tg[t], orig[t]) << "the target is the original token";
      selected++;
      if (in[t] == s.mask_id) masked++;
      else if (in[t] == orig[t]) kept++;
      else {
        random++;
        EXPECT_GE(in[t], s.n_special) << "random replacements are never special";
        EXPECT_LT(in[t], (int32_t)s.vocab_size);
      }
    }
  }
  ASSERT_GE(text, 1000000u);
  EXPECT_EQ(special_selected, 0u);
  double sel = 100.0 * (double)selected / (double)text;
  EXPECT_NEAR(sel, 15.0, 0.1) << selected << " of " << text;
  EXPECT_NEAR(100.0 * (double)masked / (double)selected, 80.0, 0.3);
  // a random draw equal to the original counts as kept: 1 in 4091, well
  // inside the tolerance
  EXPECT_NEAR(100.0 * (double)random / (double)selected, 10.0, 0.3);
  EXPECT_NEAR(100.0 * (double)kept / (double)selected, 10.0, 0.3);
}

TEST(Mlm, MaskIsAPureFunctionOfSeedAndSample) {
  ts_mlm_spec s = Spec();
  const size_t T = 64;
  std::vector<int32_t> base(T);
  for (size_t t = 0; t < T; t++) base[t] = (int32_t)(5 + t);
  auto mask = [&](uint64_t seed, uint64_t k) {
    std::vector<int32_t> in = base, tg(T);
    ts_mlm_mask(&s, seed, k, in.data(), tg.data(), T);
    in.insert(in.end(), tg.begin(), tg.end());
    return in;
  };
  EXPECT_EQ(mask(1, 7), mask(1, 7));
  EXPECT_NE(mask(1, 7), mask(1, 8)) << "samples differ";
  EXPECT_NE(mask(1, 7), mask(2, 7)) << "seeds differ";
}

// A token file of n text tokens 5, 6, ... (cycling below vocab).
std::string WriteText(const TempDir &d, size_t n, size_t vocab) {
  std::vector<uint32_t> toks(n);
  for (size_t i = 0; i < n; i++) toks[i] = (uint32_t)(5 + i % (vocab - 5));
  std::string p = d.path("train.bin");
  EXPECT_EQ(ts_token_file_write(p.c_str(), toks.data(), n, vocab), TS_OK) << ts_last_error();
  return p;
}

TEST(Mlm, FramesWindowsAndIsTheSameOnAnyRankCount) {
  // A global batch of 8 sequences read by 1, 2 or 4 data-parallel ranks
  // (each its slice, ts_loader_sample_index) gives the same ids and targets.
  TempDir d;
  const size_t V = 512, T = 16, G = 8;
  std::string p = WriteText(d, 5000, V);
  ts_token_file *tf;
  ASSERT_EQ(ts_token_file_open(&tf, p.c_str(), V), TS_OK);
  ts_mlm_spec s = Spec(V);
  std::vector<std::vector<int32_t>> results;
  for (size_t dp : {1, 2, 4}) {
    ts_loader *ld;
    ASSERT_EQ(ts_loader_init(&ld, tf, T - 2, 99, 1), TS_OK);
    size_t B = G / dp;
    std::vector<int32_t> all, in(B * T), tg(B * T), scratch(ts_mlm_scratch_elems(B, T));
    for (size_t step = 0; step < 3; step++)
      for (size_t r = 0; r < dp; r++) {
        uint64_t k = ts_loader_sample_index(step, 0, 1, r, dp, B);
        ASSERT_EQ(ts_mlm_fill(ld, &s, 99, scratch.data(), in.data(), tg.data(), k, B, T), TS_OK);
        for (size_t i = 0; i < B; i++) {
          EXPECT_EQ(in[i * T], s.cls_id);
          EXPECT_EQ(in[i * T + T - 1], s.sep_id);
          EXPECT_EQ(tg[i * T], -100);
          EXPECT_EQ(tg[i * T + T - 1], -100);
        }
        all.insert(all.end(), in.begin(), in.end());
        all.insert(all.end(), tg.begin(), tg.end());
      }
    results.push_back(all);
    ts_loader_free(ld);
  }
  // rank slices interleave differently: compare per sequence, sorted by
  // sample (dp ranks of one step cover consecutive samples in rank order)
  auto per_sample = [&](const std::vector<int32_t> &all, size_t dp) {
    std::vector<std::vector<int32_t>> seqs;
    size_t B = G / dp, chunk = 2 * B * T;
    for (size_t c = 0; c * chunk < all.size(); c++)
      for (size_t i = 0; i < B; i++) {
        std::vector<int32_t> s1(all.begin() + c * chunk + i * T,
                                all.begin() + c * chunk + (i + 1) * T);
        s1.insert(s1.end(), all.begin() + c * chunk + B * T + i * T,
                  all.begin() + c * chunk + B * T + (i + 1) * T);
        seqs.push_back(s1);
      }
    return seqs;
  };
  EXPECT_EQ(per_sample(results[0], 1), per_sample(results[1], 2));
  EXPECT_EQ(per_sample(results[0], 1), per_sample(results[2], 4));
  ts_token_file_close(tf);
}

void WriteMeta(const TempDir &d, const std::string &json) {
  FILE *f = fopen(d.path("meta.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(json.c_str(), f);
  fclose(f);
}

TEST(Mlm, MetaWithoutMlmIsRefusedInOneLine) {
  TempDir d;
  WriteMeta(d, R"({"vocab_size": 4096,
      "special_ids": {"unk": 0, "bos": 1, "eos": 2, "newline": 3}})");
  ts_mlm_spec s;
  EXPECT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_ERR_FORMAT);
  std::string e = ts_last_error();
  EXPECT_NE(e.find("meta.json: field \"mlm\" missing: expected true"), std::string::npos) << e;
  EXPECT_NE(e.find("prepare with `mlm`"), std::string::npos) << e;
  WriteMeta(d, R"({"mlm": true, "vocab_size": 4096, "special_ids": {"pad": 0, "unk": 1, "cls": 2,
      "sep": 3, "newline": 5}})");
  EXPECT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("special_ids.mask"), std::string::npos);
  WriteMeta(d, R"({"mlm": true, "vocab_size": 4096, "special_ids": {"pad": 0, "unk": 1, "cls": 2,
      "sep": 3, "mask": 4, "newline": 5}})");
  ASSERT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_OK) << ts_last_error();
  EXPECT_EQ(s.n_special, 5);
  EXPECT_EQ(s.mask_id, 4);
  // A model's own ids (BERT's: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
  // [MASK] 103); two specials with one id, or an id past the vocabulary, refused
  WriteMeta(d, R"({"mlm": true, "vocab_size": 400, "special_ids": {"pad": 0, "unk": 100,
      "cls": 101, "sep": 102, "mask": 103}})");
  ASSERT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_OK) << ts_last_error();
  EXPECT_EQ(s.cls_id, 101);
  WriteMeta(d, R"({"mlm": true, "vocab_size": 400, "special_ids": {"pad": 0, "unk": 100,
      "cls": 101, "sep": 101, "mask": 103}})");
  EXPECT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("field \"special_ids.sep\" = 101: expected an id "
                                              "below vocab_size 400 that no other"),
            std::string::npos)
      << ts_last_error();
  WriteMeta(d, R"({"mlm": true, "vocab_size": 400, "special_ids": {"pad": 0, "unk": 100,
      "cls": 101, "sep": 102, "mask": 400}})");
  EXPECT_EQ(ts_mlm_read_meta(d.dir().c_str(), &s), TS_ERR_FORMAT);
}

// Specials anywhere in the vocabulary (BERT's 0 and 100-103): none is ever
// selected nor drawn as a random replacement, and the replacements reach
// the ids on both sides of them (below 100, between, above 103).
TEST(Mlm, AModelsOwnSpecialIdsAreNeverSelectedNorDrawn) {
  ts_mlm_spec s = Spec(400);
  s.unk_id = 100;
  s.cls_id = 101;
  s.sep_id = 102;
  s.mask_id = 103;
  const size_t T = 64;
  std::vector<int32_t> in(T), tg(T);
  size_t selected = 0, random = 0, low = 0, high = 0;
  bool special_drawn = false, special_selected = false;
  for (uint64_t k = 0; k < 20000; k++) {
    for (size_t t = 0; t < T; t++) {
      const int32_t sp[] = {0, 100, 101, 102, 103};
      in[t] = t % 4 == 0 ? sp[(t / 4) % 5] : (int32_t)((k * 37 + t * 11) % 400);
    }
    std::vector<int32_t> orig = in;
    ts_mlm_mask(&s, 9, k, in.data(), tg.data(), T);
    for (size_t t = 0; t < T; t++) {
      if (tg[t] == -100) continue;
      selected++;
      int32_t o = orig[t];
      special_selected |= o == 0 || (o >= 100 && o <= 103);
      if (in[t] != 103 && in[t] != o) {
        random++;
        special_drawn |= in[t] == 0 || (in[t] >= 100 && in[t] <= 103) || in[t] >= 400;
        low += in[t] < 100;
        high += in[t] > 103;
      }
    }
  }
  EXPECT_GT(selected, 10000u);
  EXPECT_FALSE(special_selected);
  EXPECT_FALSE(special_drawn);
  // 395 drawable ids, 99 below 100 and 296 above 103: shares 0.25 and 0.75
  // (random ~ 0.1 of the selected, > 1000 draws: 5 sigma is below 0.07)
  EXPECT_NEAR((double)low / random, 99.0 / 395, 0.07);
  EXPECT_NEAR((double)high / random, 296.0 / 395, 0.07);
}

}  // namespace

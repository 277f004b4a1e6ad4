// token_file_test.cc — token files (round trip, every malformed-file error) and
// the loader (contiguous windows, shifted targets, per-epoch permutation,
// data-parallel slices that tile the global batch).
#include "engine/token_file.h"

#include <gtest/gtest.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "base/testing.h"
#include "engine/loader.h"

namespace {

using ts_test::TempDir;  // a fresh folder per test, removed with its files

bool FileExists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

std::vector<uint8_t> ReadFile(const std::string &p) {
  std::vector<uint8_t> out;
  FILE *f = fopen(p.c_str(), "rb");
  if (!f) return out;
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  fclose(f);
  return out;
}

void WriteFile(const std::string &p, const std::vector<uint8_t> &bytes) {
  FILE *f = fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  }
  fclose(f);
}

void PutInt32(std::vector<uint8_t> *bytes, size_t slot, int32_t v) {
  memcpy(bytes->data() + slot * 4, &v, 4);
}

// Tokens 0, 1, 2, ... (mod vocab) so each position is recognisable.
std::vector<uint32_t> Ramp(size_t n, size_t vocab) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i % vocab);
  return t;
}

TEST(Shard, RoundTripUint16) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> toks = {0, 1, 65534, 42, 7, 65534, 3};
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 65535), TS_OK) << ts_last_error();
  EXPECT_FALSE(FileExists(p + ".tmp"));
  std::vector<uint8_t> bytes = ReadFile(p);
  ASSERT_EQ(bytes.size(), 1024 + 2 * toks.size());
  int32_t h[3];
  memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], (int32_t)toks.size());

  ts_token_file *sh = nullptr;
  ASSERT_EQ(ts_token_file_open(&sh, p.c_str(), 65535), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_token_file_num_tokens(sh), toks.size());
  for (size_t i = 0; i < toks.size(); i++) EXPECT_EQ(ts_token_file_token(sh, i), toks[i]) << i;
  ts_token_file_close(sh);
}

TEST(Shard, RoundTripUint32) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  const size_t vocab = 100000;  // > 65535: uint32 tokens
  std::vector<uint32_t> toks = {0, 65535, 65536, 99999, 12345};
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), vocab), TS_OK) << ts_last_error();
  std::vector<uint8_t> bytes = ReadFile(p);
  ASSERT_EQ(bytes.size(), 1024 + 4 * toks.size());
  int32_t h[3];
  memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], (int32_t)toks.size());

  ts_token_file *sh = nullptr;
  ASSERT_EQ(ts_token_file_open(&sh, p.c_str(), vocab), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_token_file_num_tokens(sh), toks.size());
  for (size_t i = 0; i < toks.size(); i++) EXPECT_EQ(ts_token_file_token(sh, i), toks[i]) << i;
  ts_token_file_close(sh);
}

// Written piece by piece, a token file is byte for byte the one written at
// once (both widths); nothing is at the path until commit; a bad id names
// its position in the whole file; discard leaves nothing.
TEST(Shard, WriterInPiecesEqualsOneWrite) {
  TempDir dir("ts_data_test");
  for (size_t vocab : {(size_t)50000, (size_t)100000}) {
    SCOPED_TRACE(vocab);
    const std::string once = dir.path("once" + std::to_string(vocab) + ".bin"),
                      pieces = dir.path("pieces" + std::to_string(vocab) + ".bin");
    std::vector<uint32_t> toks = Ramp(10000, vocab);
    for (size_t i = 0; i < toks.size(); i += 7) toks[i] = (uint32_t)(vocab - 1 - i % 13);
    ASSERT_EQ(ts_token_file_write(once.c_str(), toks.data(), toks.size(), vocab), TS_OK)
        << ts_last_error();
    ts_token_file_writer *w = nullptr;
    ASSERT_EQ(ts_token_file_writer_open(&w, pieces.c_str(), vocab), TS_OK) << ts_last_error();
    size_t at = 0;
    for (size_t k : {0, 1, 4095, 4097, 1, 1806}) {  // 10000 in all, across 4096-token chunks
      ASSERT_EQ(ts_token_file_writer_append(w, toks.data() + at, k), TS_OK) << ts_last_error();
      at += k;
    }
    ASSERT_EQ(at, toks.size());
    EXPECT_EQ(ts_token_file_writer_count(w), toks.size());
    EXPECT_FALSE(FileExists(pieces));
    ASSERT_EQ(ts_token_file_writer_commit(w), TS_OK) << ts_last_error();
    EXPECT_EQ(ReadFile(pieces), ReadFile(once));
    EXPECT_FALSE(FileExists(pieces + ".tmp"));
  }
  const std::string bad = dir.path("bad.bin");
  ts_token_file_writer *w = nullptr;
  ASSERT_EQ(ts_token_file_writer_open(&w, bad.c_str(), 10), TS_OK) << ts_last_error();
  std::vector<uint32_t> ok = {1, 2, 3}, wrong = {4, 10};
  ASSERT_EQ(ts_token_file_writer_append(w, ok.data(), ok.size()), TS_OK);
  EXPECT_EQ(ts_token_file_writer_append(w, wrong.data(), wrong.size()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("token 4 is id 10, expected an id below vocab_size 10"),
            std::string::npos)
      << ts_last_error();
  ts_token_file_writer_discard(w);
  EXPECT_FALSE(FileExists(bad));
  EXPECT_FALSE(FileExists(bad + ".tmp"));
}

TEST(Shard, RewriteReplacesExistingFile) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> a = Ramp(10, 50), b = Ramp(3, 50);
  ASSERT_EQ(ts_token_file_write(p.c_str(), a.data(), a.size(), 50), TS_OK);
  ASSERT_EQ(ts_token_file_write(p.c_str(), b.data(), b.size(), 50), TS_OK);
  EXPECT_EQ(ReadFile(p).size(), 1024u + 2 * 3);
}

TEST(Shard, MissingFileIsIoError) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  ts_token_file *sh = (ts_token_file *)0x1;
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_IO);
  EXPECT_EQ(sh, nullptr);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("train.bin: cannot open: No such file or directory"), std::string::npos) << msg;
}

TEST(Shard, BadMagicNamesFieldAndExpectedValues) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> toks = Ramp(8, 100);
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 100), TS_OK);
  std::vector<uint8_t> bytes = ReadFile(p);
  PutInt32(&bytes, 0, 12345);
  WriteFile(p, bytes);
  ts_token_file *sh = nullptr;
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_FORMAT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("12345"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20240520"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20240801"), std::string::npos) << msg;
}

TEST(Shard, BadVersionNamesFieldAndExpectedValue) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("val.bin");
  std::vector<uint32_t> toks = Ramp(8, 100);
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 100), TS_OK);
  std::vector<uint8_t> bytes = ReadFile(p);
  PutInt32(&bytes, 1, 7);  // uint32's version with uint16's magic
  WriteFile(p, bytes);
  ts_token_file *sh = nullptr;
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_FORMAT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("val.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("version"), std::string::npos) << msg;
  EXPECT_NE(msg.find("is 7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 1"), std::string::npos) << msg;
}

TEST(Shard, TruncatedAndTrailingBytesNameExpectedSize) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> toks = Ramp(10, 100);
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 100), TS_OK);
  std::vector<uint8_t> good = ReadFile(p);
  ASSERT_EQ(good.size(), 1044u);

  std::vector<uint8_t> cut(good.begin(), good.end() - 3);  // 1041 bytes
  WriteFile(p, cut);
  ts_token_file *sh = nullptr;
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_FORMAT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1041"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected 1044"), std::string::npos) << msg;

  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  WriteFile(p, longer);
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("expected 1044"), std::string::npos) << msg;
  EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;

  std::vector<uint8_t> stub(good.begin(), good.begin() + 100);  // not even a header
  WriteFile(p, stub);
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 100), TS_ERR_FORMAT);
  msg = ts_last_error();
  EXPECT_NE(msg.find("1024"), std::string::npos) << msg;
  EXPECT_EQ(sh, nullptr);
}

TEST(Shard, TokenOutsideVocabularyNamesPositionAndId) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> toks = Ramp(10, 100);
  toks[6] = 250;
  ASSERT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 300), TS_OK);
  ts_token_file *sh = nullptr;
  EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), 200), TS_ERR_FORMAT);
  EXPECT_EQ(sh, nullptr);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("250"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 200"), std::string::npos) << msg;
}

TEST(Shard, WritingInvalidTokenLeavesNoFile) {
  TempDir dir("ts_data_test");
  const std::string p = dir.path("train.bin");
  std::vector<uint32_t> toks = Ramp(10, 100);
  toks[9] = 100;  // == vocab_size
  EXPECT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 100), TS_ERR_INVALID_ARGUMENT);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 100"), std::string::npos) << msg;
  EXPECT_FALSE(FileExists(p));
  EXPECT_FALSE(FileExists(p + ".tmp"));

  // An existing good shard survives a failed rewrite untouched.
  std::vector<uint32_t> good = Ramp(5, 100);
  ASSERT_EQ(ts_token_file_write(p.c_str(), good.data(), good.size(), 100), TS_OK);
  std::vector<uint8_t> before = ReadFile(p);
  EXPECT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), 100), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ReadFile(p), before);
}

// ----------------------------------------------------------------- loader

struct ShardFixture {
  TempDir dir{"ts_data_test"};
  ts_token_file *sh = nullptr;
  std::vector<uint32_t> toks;
  explicit ShardFixture(size_t n, size_t vocab = 1000) {
    toks = Ramp(n, vocab);
    std::string p = dir.path("train.bin");
    EXPECT_EQ(ts_token_file_write(p.c_str(), toks.data(), toks.size(), vocab), TS_OK);
    EXPECT_EQ(ts_token_file_open(&sh, p.c_str(), vocab), TS_OK) << ts_last_error();
  }
  ~ShardFixture() { ts_token_file_close(sh); }
};

// Window index of one filled sequence (tokens are a ramp, so the first input
// is the window's start).
size_t WindowOf(const int32_t *inputs, size_t T) { return (size_t)inputs[0] / T; }

TEST(Loader, WindowsAreContiguousAndTargetsShifted) {
  const size_t T = 8;
  ShardFixture f(8 * 10 + 3);  // W = (83-1)/8 = 10
  ts_loader *ld = nullptr;
  ASSERT_EQ(ts_loader_init(&ld, f.sh, T, 0, /*shuffle=*/0), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_loader_num_windows(ld), 10u);
  const size_t count = 13;  // crosses into the second epoch
  std::vector<int32_t> in(count * T), tg(count * T);
  ASSERT_EQ(ts_loader_fill(ld, in.data(), tg.data(), 0, count), TS_OK);
  for (size_t i = 0; i < count; i++) {
    size_t w = i % 10;  // identity order, wraps each epoch
    for (size_t t = 0; t < T; t++) {
      EXPECT_EQ(in[i * T + t], (int32_t)f.toks[w * T + t]) << i << "," << t;
      EXPECT_EQ(tg[i * T + t], (int32_t)f.toks[w * T + t + 1]) << i << "," << t;
    }
  }
  ts_loader_free(ld);
}

TEST(Loader, LastWindowReachesButDoesNotPassTheEnd) {
  const size_t T = 4;
  ShardFixture f(4 * 3 + 1);  // exactly W = 3 windows; last target is the last token
  ts_loader *ld = nullptr;
  ASSERT_EQ(ts_loader_init(&ld, f.sh, T, 0, 0), TS_OK);
  ASSERT_EQ(ts_loader_num_windows(ld), 3u);
  std::vector<int32_t> in(T), tg(T);
  ASSERT_EQ(ts_loader_fill(ld, in.data(), tg.data(), 2, 1), TS_OK);
  EXPECT_EQ(tg[T - 1], (int32_t)f.toks.back());
  ts_loader_free(ld);
}

TEST(Loader, TooShortShardIsAnError) {
  ShardFixture f(8);
  ts_loader *ld = (ts_loader *)0x1;
  EXPECT_EQ(ts_loader_init(&ld, f.sh, 8, 0, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ld, nullptr);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("shard has 8 tokens, fewer than seq T+1 = 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
}

TEST(Loader, ShuffleVisitsEveryWindowOncePerEpoch) {
  const size_t T = 4, W = 37;
  ShardFixture f(T * W + 1);
  ts_loader *ld = nullptr;
  ASSERT_EQ(ts_loader_init(&ld, f.sh, T, 1234, 1), TS_OK);
  ASSERT_EQ(ts_loader_num_windows(ld), W);
  std::vector<std::vector<size_t>> epochs;
  for (int e = 0; e < 3; e++) {
    std::vector<int32_t> in(W * T), tg(W * T);
    ASSERT_EQ(ts_loader_fill(ld, in.data(), tg.data(), (uint64_t)e * W, W), TS_OK);
    std::vector<size_t> order;
    for (size_t i = 0; i < W; i++) {
      order.push_back(WindowOf(&in[i * T], T));
      for (size_t t = 0; t < T; t++) EXPECT_EQ(tg[i * T + t], in[i * T + t] + 1);
    }
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < W; i++) EXPECT_EQ(sorted[i], i) << "epoch " << e;
    epochs.push_back(order);
  }
  std::vector<size_t> identity(W);
  for (size_t i = 0; i < W; i++) identity[i] = i;
  EXPECT_NE(epochs[0], identity);
  EXPECT_NE(epochs[0], epochs[1]);  // a new permutation each epoch
  EXPECT_NE(epochs[1], epochs[2]);
  ts_loader_free(ld);
}

TEST(Loader, PureFunctionOfSeedAndSampleIndex) {
  const size_t T = 4, W = 20;
  ShardFixture f(T * W + 1);
  ts_loader *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(ts_loader_init(&a, f.sh, T, 7, 1), TS_OK);
  ASSERT_EQ(ts_loader_init(&b, f.sh, T, 7, 1), TS_OK);
  ASSERT_EQ(ts_loader_init(&c, f.sh, T, 8, 1), TS_OK);
  // a reads samples 0..59 in one call; b reads them backwards one by one,
  // jumping between epochs; both must agree.
  std::vector<int32_t> in_a(60 * T), tg_a(60 * T), in_b(60 * T), tg_b(60 * T);
  ASSERT_EQ(ts_loader_fill(a, in_a.data(), tg_a.data(), 0, 60), TS_OK);
  for (size_t k = 60; k-- > 0;)
    ASSERT_EQ(ts_loader_fill(b, &in_b[k * T], &tg_b[k * T], k, 1), TS_OK);
  EXPECT_EQ(in_a, in_b);
  EXPECT_EQ(tg_a, tg_b);
  // A different seed gives a different order.
  std::vector<int32_t> in_c(60 * T), tg_c(60 * T);
  ASSERT_EQ(ts_loader_fill(c, in_c.data(), tg_c.data(), 0, 60), TS_OK);
  EXPECT_NE(in_a, in_c);
  ts_loader_free(a);
  ts_loader_free(b);
  ts_loader_free(c);
}

// The windows a configuration (dp, accum, B) reads at one optimizer step,
// per rank, gathered over its accumulation steps.
std::vector<std::vector<size_t>> StepWindows(ts_loader *ld, size_t T, uint64_t step, size_t dp,
                                             size_t accum, size_t B) {
  std::vector<std::vector<size_t>> per_rank(dp);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (size_t r = 0; r < dp; r++) {
    for (size_t a = 0; a < accum; a++) {
      uint64_t k0 = ts_loader_sample_index(step, a, accum, r, dp, B);
      EXPECT_EQ(ts_loader_fill(ld, in.data(), tg.data(), k0, B), TS_OK);
      for (size_t b = 0; b < B; b++) per_rank[r].push_back(WindowOf(&in[b * T], T));
    }
  }
  return per_rank;
}

TEST(Loader, DataParallelRanksTileTheGlobalBatch) {
  const size_t T = 4, W = 23;  // W not a multiple of the global batch: steps straddle epochs
  ShardFixture f(T * W + 1);
  ts_loader *ld = nullptr;
  ASSERT_EQ(ts_loader_init(&ld, f.sh, T, 99, 1), TS_OK);
  const size_t B = 3;
  for (uint64_t step = 0; step < 12; step++) {
    // Reference: one rank, accumulation 2 -> global batch of 6 samples.
    auto ref = StepWindows(ld, T, step, 1, 2, B);
    std::multiset<size_t> global(ref[0].begin(), ref[0].end());
    ASSERT_EQ(global.size(), 2 * B);
    // ... which is samples [step*G, (step+1)*G) in order.
    std::vector<int32_t> in(2 * B * T), tg(2 * B * T);
    ASSERT_EQ(ts_loader_fill(ld, in.data(), tg.data(), step * 2 * B, 2 * B), TS_OK);
    for (size_t i = 0; i < 2 * B; i++) EXPECT_EQ(ref[0][i], WindowOf(&in[i * T], T));

    // Two ranks, no accumulation: disjoint sample indices whose union is the
    // same global batch.
    auto dp2 = StepWindows(ld, T, step, 2, 1, B);
    std::multiset<size_t> u(dp2[0].begin(), dp2[0].end());
    u.insert(dp2[1].begin(), dp2[1].end());
    EXPECT_EQ(u, global) << "step " << step;
    std::set<uint64_t> k0, k1;
    for (size_t b = 0; b < B; b++) {
      k0.insert(ts_loader_sample_index(step, 0, 1, 0, 2, B) + b);
      k1.insert(ts_loader_sample_index(step, 0, 1, 1, 2, B) + b);
    }
    for (uint64_t k : k0) EXPECT_EQ(k1.count(k), 0u);

    // With accumulation as well: dp 2 x accum 2 covers the same global batch
    // as dp 1 x accum 4.
    auto big_ref = StepWindows(ld, T, step, 1, 4, B);
    auto big = StepWindows(ld, T, step, 2, 2, B);
    std::multiset<size_t> g4(big_ref[0].begin(), big_ref[0].end());
    std::multiset<size_t> u4(big[0].begin(), big[0].end());
    u4.insert(big[1].begin(), big[1].end());
    EXPECT_EQ(u4, g4) << "step " << step;
  }
  ts_loader_free(ld);
}

TEST(Loader, SampleIndexLayout) {
  // G = dp*B*accum = 2*3*2 = 12 samples per step.
  EXPECT_EQ(ts_loader_sample_index(0, 0, 2, 0, 2, 3), 0u);
  EXPECT_EQ(ts_loader_sample_index(0, 0, 2, 1, 2, 3), 3u);
  EXPECT_EQ(ts_loader_sample_index(0, 1, 2, 0, 2, 3), 6u);
  EXPECT_EQ(ts_loader_sample_index(0, 1, 2, 1, 2, 3), 9u);
  EXPECT_EQ(ts_loader_sample_index(5, 1, 2, 1, 2, 3), 69u);
}

}  // namespace

// safetensors_test.cc — the safetensors reader and writer: round trips,
// atomic replacement, malformed files, and the committed Hugging Face parity
// fixtures (tests/hf_parity/fixtures, made by tests/hf_parity/make_fixtures.py).
#include "models/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

std::string TmpPath(const std::string &name) { return ::testing::TempDir() + "/" + name; }

std::string ReadAll(const std::string &path) {
  std::string out;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

void WriteBytes(const std::string &path, const std::string &bytes) {
  FILE *f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

// A safetensors file from a header string and a data section.
std::string MakeFile(const std::string &header, const std::string &data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; i++) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

ts_safetensors_tensor Desc(const char *name, const char *dtype, std::vector<size_t> shape,
                           const void *data, size_t nbytes) {
  ts_safetensors_tensor t = {};
  t.name = name;
  std::snprintf(t.dtype, sizeof t.dtype, "%s", dtype);
  t.ndim = static_cast<int>(shape.size());
  t.numel = 1;
  for (size_t d = 0; d < shape.size(); d++) {
    t.shape[d] = shape[d];
    t.numel *= shape[d];
  }
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

bool Contains(const char *haystack, const std::string &needle) {
  return std::string(haystack).find(needle) != std::string::npos;
}

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(ts_safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(ts_safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(ts_safetensors_dtype_size("I64"), 8u);
  EXPECT_EQ(ts_safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(ts_safetensors_dtype_size("F31"), 0u);
  EXPECT_EQ(ts_safetensors_dtype_size(nullptr), 0u);
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  const std::string path = TmpPath("roundtrip.safetensors");
  const float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  const uint16_t bf16[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
  const int32_t i32[8] = {0, -1, 2, -3, 4, -5, 6, 2147483647};
  const int64_t i64 = -1234567890123LL;
  std::vector<ts_safetensors_tensor> in = {
      Desc("model.layers.0.w", "F32", {2, 3}, f32, sizeof f32),
      Desc("a.bf16", "BF16", {4}, bf16, sizeof bf16),
      Desc("ids \"quoted\" \xc3\xa9", "I32", {2, 2, 2}, i32, sizeof i32),
      Desc("scalar", "I64", {}, &i64, sizeof i64),
      Desc("empty", "U8", {0, 5}, nullptr, 0),
  };
  const char *meta[] = {"lr", "0.01", "note", "a \"quoted\"\nline \xc3\xa9", "empty", "", nullptr};
  ASSERT_EQ(ts_safetensors_write(path.c_str(), in.data(), in.size(), meta), TS_OK)
      << ts_last_error();
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0) << "temporary file left behind";

  // Header length is a multiple of 8 and the data section is exactly the bytes.
  std::string bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(hlen % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + hlen + sizeof f32 + sizeof bf16 + sizeof i32 + sizeof i64);

  ts_safetensors *st = nullptr;
  ASSERT_EQ(ts_safetensors_open(&st, path.c_str()), TS_OK) << ts_last_error();
  ASSERT_EQ(ts_safetensors_count(st), in.size());
  for (size_t i = 0; i < in.size(); i++) {
    EXPECT_STREQ(ts_safetensors_name(st, i), in[i].name) << "listing keeps the written order";
    ts_safetensors_tensor t;
    ASSERT_EQ(ts_safetensors_find(st, in[i].name, &t), TS_OK) << ts_last_error();
    EXPECT_STREQ(t.name, in[i].name);
    EXPECT_STREQ(t.dtype, in[i].dtype);
    ASSERT_EQ(t.ndim, in[i].ndim);
    for (int d = 0; d < t.ndim; d++) EXPECT_EQ(t.shape[d], in[i].shape[d]);
    EXPECT_EQ(t.numel, in[i].numel);
    ASSERT_EQ(t.nbytes, in[i].nbytes);
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(t.data, in[i].data, t.nbytes), 0) << t.name;
    }
  }
  EXPECT_EQ(ts_safetensors_name(st, in.size()), nullptr);
  ts_safetensors_tensor w;
  ASSERT_EQ(ts_safetensors_find(st, "model.layers.0.w", &w), TS_OK);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % 64, 0u) << "data section is 64-byte aligned";

  EXPECT_STREQ(ts_safetensors_metadata(st, "lr"), "0.01");
  EXPECT_STREQ(ts_safetensors_metadata(st, "note"), meta[3]);
  EXPECT_STREQ(ts_safetensors_metadata(st, "empty"), "");
  EXPECT_EQ(ts_safetensors_metadata(st, "absent"), nullptr);

  ts_safetensors_tensor t;
  EXPECT_EQ(ts_safetensors_find(st, "x", &t), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(ts_last_error()), path + ": no tensor 'x'");
  ts_safetensors_close(st);
}

TEST(Safetensors, WriteWithoutTensorsOrMetadata) {
  const std::string path = TmpPath("empty.safetensors");
  ASSERT_EQ(ts_safetensors_write(path.c_str(), nullptr, 0, nullptr), TS_OK) << ts_last_error();
  ts_safetensors *st = nullptr;
  ASSERT_EQ(ts_safetensors_open(&st, path.c_str()), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_safetensors_count(st), 0u);
  EXPECT_EQ(ts_safetensors_metadata(st, "lr"), nullptr);
  ts_safetensors_close(st);
}

TEST(Safetensors, BadWriteLeavesExistingFileUntouched) {
  const std::string path = TmpPath("keep.safetensors");
  const float good[2] = {1.0f, 2.0f};
  ts_safetensors_tensor t = Desc("w", "F32", {2}, good, sizeof good);
  ASSERT_EQ(ts_safetensors_write(path.c_str(), &t, 1, nullptr), TS_OK) << ts_last_error();
  const std::string before = ReadAll(path);

  ts_safetensors_tensor bad = Desc("w", "F32", {3}, good, sizeof good);  // 12 bytes expected
  EXPECT_EQ(ts_safetensors_write(path.c_str(), &bad, 1, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(ts_last_error(), "'w'")) << ts_last_error();
  ts_safetensors_tensor dup[2] = {t, t};
  EXPECT_EQ(ts_safetensors_write(path.c_str(), dup, 2, nullptr), TS_ERR_INVALID_ARGUMENT);
  ts_safetensors_tensor unknown = Desc("w", "F33", {2}, good, sizeof good);
  EXPECT_EQ(ts_safetensors_write(path.c_str(), &unknown, 1, nullptr), TS_ERR_INVALID_ARGUMENT);
  const char *meta_null_value[] = {"k", nullptr};
  EXPECT_EQ(ts_safetensors_write(path.c_str(), &t, 1, meta_null_value), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ReadAll(path), before);

  const std::string nodir = TmpPath("no/such/dir/x.safetensors");
  EXPECT_EQ(ts_safetensors_write(nodir.c_str(), &t, 1, nullptr), TS_ERR_IO);
  EXPECT_TRUE(Contains(ts_last_error(), nodir)) << ts_last_error();

  // A good write replaces the contents.
  const float other[2] = {3.0f, 4.0f};
  ts_safetensors_tensor t2 = Desc("w", "F32", {2}, other, sizeof other);
  ASSERT_EQ(ts_safetensors_write(path.c_str(), &t2, 1, nullptr), TS_OK) << ts_last_error();
  ts_safetensors *st = nullptr;
  ASSERT_EQ(ts_safetensors_open(&st, path.c_str()), TS_OK) << ts_last_error();
  ts_safetensors_tensor r;
  ASSERT_EQ(ts_safetensors_find(st, "w", &r), TS_OK);
  EXPECT_EQ(static_cast<const float *>(r.data)[1], 4.0f);
  ts_safetensors_close(st);
}

TEST(Safetensors, MissingFileIsIoError) {
  const std::string path = TmpPath("does_not_exist.safetensors");
  ts_safetensors *st = reinterpret_cast<ts_safetensors *>(&st);
  EXPECT_EQ(ts_safetensors_open(&st, path.c_str()), TS_ERR_IO);
  EXPECT_EQ(st, nullptr);
  EXPECT_TRUE(Contains(ts_last_error(), path)) << ts_last_error();
}

struct Malformed {
  const char *label;
  std::string bytes;
  std::vector<std::string> message_has;  // besides the path
};

TEST(Safetensors, MalformedFilesAreFormatErrors) {
  const std::string f32x2(8, '\0');
  const std::string hdr_ok = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  std::string short_len_field = MakeFile("{}", "").substr(0, 5);
  std::string len_past_end = MakeFile(hdr_ok, f32x2).substr(0, 8) + "{}";
  const std::vector<Malformed> cases = {
      {"truncated header length", short_len_field, {"8-byte header length"}},
      {"header length past the end", len_past_end, {"header length"}},
      {"bad JSON", MakeFile("{\"x\": {\"dtype\": ", ""), {"not valid JSON"}},
      {"not an object", MakeFile("[1, 2]", ""), {"not a JSON object"}},
      {"trailing bytes", MakeFile(hdr_ok + " x", f32x2), {"after the JSON object"}},
      {"offsets past the end", MakeFile(hdr_ok, f32x2.substr(0, 4)), {"'x'", "data_offsets"}},
      {"shape/bytes mismatch",
       MakeFile("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", f32x2),
       {"'x'", "data_offsets", "[3]", "expected 12"}},
      {"begin after end",
       MakeFile("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", f32x2),
       {"'x'", "begin > end"}},
      {"unknown dtype",
       MakeFile("{\"x\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2),
       {"'x'", "dtype", "F33"}},
      {"negative dim",
       MakeFile("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", f32x2),
       {"'x'", "shape[0]"}},
      {"missing data_offsets", MakeFile("{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", f32x2),
       {"'x'", "data_offsets"}},
      {"too many dims",
       MakeFile("{\"x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                "a"),
       {"'x'", "9 dims"}},
      {"overlap",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                std::string(12, '\0')),
       {"'a'", "'b'", "overlap"}},
      {"duplicate name",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                f32x2),
       {"'a'", "twice"}},
      {"non-string metadata", MakeFile("{\"__metadata__\":{\"lr\":0.01}}", ""),
       {"__metadata__", "lr"}},
  };
  for (size_t i = 0; i < cases.size(); i++) {
    const std::string path = TmpPath("malformed_" + std::to_string(i) + ".safetensors");
    WriteBytes(path, cases[i].bytes);
    ts_safetensors *st = nullptr;
    EXPECT_EQ(ts_safetensors_open(&st, path.c_str()), TS_ERR_FORMAT) << cases[i].label;
    EXPECT_EQ(st, nullptr) << cases[i].label;
    const std::string msg = ts_last_error();
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << cases[i].label << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << cases[i].label << ": " << msg;
    for (const std::string &want : cases[i].message_has) {
      EXPECT_NE(msg.find(want), std::string::npos) << cases[i].label << ": " << msg;
    }
  }
}

// ---- the committed Hugging Face fixtures ----

class HfFixture : public ::testing::TestWithParam<const char *> {
 protected:
  void SetUp() override {
    path_ = std::string("tests/hf_parity/fixtures/") + GetParam() + ".safetensors";
    ASSERT_EQ(ts_safetensors_open(&st_, path_.c_str()), TS_OK) << ts_last_error();
  }
  void TearDown() override { ts_safetensors_close(st_); }
  ts_safetensors_tensor Get(const char *name) {
    ts_safetensors_tensor t = {};
    EXPECT_EQ(ts_safetensors_find(st_, name, &t), TS_OK) << ts_last_error();
    return t;
  }
  std::string path_;
  ts_safetensors *st_ = nullptr;
};

TEST_P(HfFixture, LossEqualsCrossEntropyOfLogits) {
  const size_t B = 2, T = 12, V = 96;
  ts_safetensors_tensor logits = Get("logits"), targets = Get("targets"), loss = Get("loss");
  ASSERT_STREQ(logits.dtype, "F32");
  ASSERT_EQ(logits.ndim, 3);
  EXPECT_EQ(logits.shape[0], B);
  EXPECT_EQ(logits.shape[1], T);
  EXPECT_EQ(logits.shape[2], V);
  ASSERT_STREQ(targets.dtype, "I32");
  ASSERT_EQ(targets.numel, B * T);
  ASSERT_STREQ(loss.dtype, "F32");
  ASSERT_EQ(loss.numel, 1u);
  ASSERT_EQ(Get("input_ids").numel, B * T);

  const float *l = static_cast<const float *>(logits.data);
  const int32_t *y = static_cast<const int32_t *>(targets.data);
  double sum = 0.0;
  size_t counted = 0;
  for (size_t i = 0; i < B * T; i++) {
    if (y[i] == -100) continue;
    ASSERT_GE(y[i], 0);
    ASSERT_LT(static_cast<size_t>(y[i]), V);
    const float *row = l + i * V;
    double mx = row[0];
    for (size_t v = 1; v < V; v++) mx = std::fmax(mx, row[v]);
    double z = 0.0;
    for (size_t v = 0; v < V; v++) z += std::exp(row[v] - mx);
    sum += mx + std::log(z) - row[y[i]];
    counted++;
  }
  EXPECT_EQ(counted, B * T - 3) << "3 targets are ignored (-100)";
  const double want = sum / static_cast<double>(counted);
  const double got = static_cast<const float *>(loss.data)[0];
  // 1e-5 relative: PyTorch reduces 21 fp32 log-softmax rows (~1e-7 relative
  // rounding each); a wrong row, target or ignore rule moves the loss by >1e-3.
  EXPECT_NEAR(got, want, 1e-5 * std::fabs(want));
}

TEST_P(HfFixture, EveryParameterHasGradientAndAdamwResult) {
  const bool tied = std::strstr(GetParam(), "_tied") != nullptr;
  const size_t nparams = tied ? 20 : 21;  // 9 per layer x 2, final norm, embedding, [lm_head]
  EXPECT_EQ(ts_safetensors_count(st_), 3 * nparams + 5);  // + input_ids targets logits loss adamw.losses
  ts_safetensors_tensor probe;
  EXPECT_EQ(ts_safetensors_find(st_, "lm_head.weight", &probe) == TS_OK, !tied);
  size_t seen = 0;
  for (size_t i = 0; i < ts_safetensors_count(st_); i++) {
    const std::string name = ts_safetensors_name(st_, i);
    if (name.rfind("model.", 0) != 0 && name != "lm_head.weight") continue;
    seen++;
    ts_safetensors_tensor p = Get(name.c_str());
    ts_safetensors_tensor g = Get(("grad." + name).c_str());
    ts_safetensors_tensor f = Get(("adamw.final." + name).c_str());
    EXPECT_EQ(g.ndim, p.ndim) << name;
    EXPECT_EQ(g.numel, p.numel) << name;
    EXPECT_EQ(f.numel, p.numel) << name;
  }
  EXPECT_EQ(seen, nparams);
  ts_safetensors_tensor q = Get("model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(q.shape[0], 32u) << "GQA: 2 KV heads x head size 16";
  EXPECT_EQ(q.shape[1], 64u);
  ts_safetensors_tensor losses = Get("adamw.losses");
  ASSERT_EQ(losses.numel, 5u);
  EXPECT_EQ(static_cast<const float *>(losses.data)[0], static_cast<const float *>(Get("loss").data)[0])
      << "the first AdamW loss is the recorded forward's loss";
  EXPECT_STREQ(ts_safetensors_metadata(st_, "lr"), "0.01");
  EXPECT_STREQ(ts_safetensors_metadata(st_, "beta2"), "0.95");
  EXPECT_STREQ(ts_safetensors_metadata(st_, "weight_decay"), "0.1");
  EXPECT_STREQ(ts_safetensors_metadata(st_, "steps"), "5");
  EXPECT_STREQ(ts_safetensors_metadata(st_, "dtype"),
               std::strstr(GetParam(), "_bf16") ? "bf16" : "fp32");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfFixture,
                         ::testing::Values("llama_untied", "llama_tied", "llama_untied_bf16",
                                           "llama_tied_bf16"));

}  // namespace

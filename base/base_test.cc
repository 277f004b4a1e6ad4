// Tests of base/: atomic files (whole or absent, the old file kept on every
// failure) and the whole-file read, the seeded generator against its published reference values,
// and the status and dtype vocabulary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "base/atomic_file.h"
#include "base/base.h"
#include "base/checksum.h"
#include "base/rng.h"
#include "base/testing.h"

namespace {

using ts_test::TempDir;

std::string Slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

TEST(AtomicFile, CommitWritesEverythingAndLeavesNoTemporary) {
  TempDir d;
  std::string p = d.path("out.bin");
  ts_atomic_file *f;
  ASSERT_EQ(ts_atomic_file_open(&f, p.c_str()), TS_OK);
  EXPECT_TRUE(Exists(p + ".tmp"));
  EXPECT_FALSE(Exists(p)) << "the final name appears only at commit";
  ASSERT_EQ(ts_atomic_file_write(f, "abc", 3), TS_OK);
  fprintf(ts_atomic_file_stream(f), "%d", 42);
  ASSERT_EQ(ts_atomic_file_commit(f), TS_OK);
  EXPECT_EQ(Slurp(p), "abc42");
  EXPECT_FALSE(Exists(p + ".tmp"));
  EXPECT_EQ(d.List().size(), 1u);
}

TEST(ReadFile, ReadsAWholeFileOfAnySizeAndNamesAMissingOne) {
  TempDir d;
  std::string p = d.path("big.bin"), text(100000, 'x');
  text[4095] = '\0';  // embedded NUL: the length, not strlen, is the size
  text[99999] = 'y';
  ASSERT_EQ(ts_atomic_write(p.c_str(), text.data(), text.size()), TS_OK);
  char *buf = nullptr;
  size_t len = 0;
  ASSERT_EQ(ts_read_file(p.c_str(), &buf, &len), TS_OK) << ts_last_error();
  ASSERT_EQ(len, text.size());
  EXPECT_EQ(std::string(buf, len), text);
  EXPECT_EQ(buf[len], '\0');
  free(buf);
  ASSERT_EQ(ts_atomic_write(p.c_str(), "", 0), TS_OK);
  ASSERT_EQ(ts_read_file(p.c_str(), &buf, &len), TS_OK);
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(buf[0], '\0');
  free(buf);
  std::string missing = d.path("nope.json");
  EXPECT_EQ(ts_read_file(missing.c_str(), &buf, nullptr), TS_ERR_IO);
  EXPECT_EQ(buf, nullptr);
  EXPECT_NE(std::string(ts_last_error()).find(missing + ": cannot open"), std::string::npos)
      << ts_last_error();
}

TEST(AtomicFile, DiscardKeepsTheOldFile) {
  TempDir d;
  std::string p = d.path("keep.txt");
  ASSERT_EQ(ts_atomic_write(p.c_str(), "old", 3), TS_OK);
  ts_atomic_file *f;
  ASSERT_EQ(ts_atomic_file_open(&f, p.c_str()), TS_OK);
  ASSERT_EQ(ts_atomic_file_write(f, "new!", 4), TS_OK);
  ts_atomic_file_discard(f);
  EXPECT_EQ(Slurp(p), "old");
  EXPECT_FALSE(Exists(p + ".tmp"));
}

TEST(AtomicFile, ReplacesAnExistingFileWhole) {
  TempDir d;
  std::string p = d.path("f");
  ASSERT_EQ(ts_atomic_write(p.c_str(), "first version", 13), TS_OK);
  ASSERT_EQ(ts_atomic_write(p.c_str(), "2", 1), TS_OK);
  EXPECT_EQ(Slurp(p), "2");
}

TEST(AtomicFile, AStreamErrorFailsTheCommitAndKeepsTheOldFile) {
  TempDir d;
  std::string p = d.path("f");
  ASSERT_EQ(ts_atomic_write(p.c_str(), "old", 3), TS_OK);
  ts_atomic_file *f;
  ASSERT_EQ(ts_atomic_file_open(&f, p.c_str()), TS_OK);
  FILE *s = ts_atomic_file_stream(f);
  fgetc(s);  // reading a write-only stream sets its error flag
  ASSERT_TRUE(ferror(s));
  EXPECT_EQ(ts_atomic_file_commit(f), TS_ERR_IO);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_EQ(Slurp(p), "old");
  EXPECT_FALSE(Exists(p + ".tmp"));
}

TEST(AtomicFile, AMissingFolderIsAnIoErrorNamingTheFile) {
  TempDir d;
  std::string p = d.path("no/such/folder/f");
  EXPECT_EQ(ts_atomic_write(p.c_str(), "x", 1), TS_ERR_IO);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("no/such/folder/f.tmp: cannot create"), std::string::npos) << msg;
}

TEST(AtomicFile, RenameMovesAFinishedFolderIntoPlace) {
  TempDir d;
  std::string tmp = d.path("staging"), dst = d.path("final");
  ASSERT_EQ(mkdir(tmp.c_str(), 0755), 0);
  ASSERT_EQ(ts_atomic_write((tmp + "/a").c_str(), "A", 1), TS_OK);
  ASSERT_EQ(ts_atomic_rename(tmp.c_str(), dst.c_str()), TS_OK);
  EXPECT_EQ(Slurp(dst + "/a"), "A");
  EXPECT_FALSE(Exists(tmp));
  EXPECT_EQ(ts_atomic_rename(tmp.c_str(), dst.c_str()), TS_ERR_IO) << "tmp is gone now";
}

// splitmix64 from state 0: the first outputs of Vigna's reference
// implementation (prng.di.unimi.it/splitmix64.c).
TEST(Rng, Splitmix64MatchesTheReference) {
  uint64_t s = 0;
  EXPECT_EQ(ts_splitmix64(&s), 0xe220a8397b1dcdafull);
  EXPECT_EQ(ts_splitmix64(&s), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(ts_splitmix64(&s), 0x06c45d188009454full);
  EXPECT_EQ(s, 3 * 0x9e3779b97f4a7c15ull);
  EXPECT_EQ(ts_mix64(0x9e3779b97f4a7c15ull), 0xe220a8397b1dcdafull);
}

// FNV-1a 64 test vectors (Fowler, Noll, Vo; draft-eastlake-fnv).
TEST(Rng, Fnv1aMatchesTheTestVectors) {
  EXPECT_EQ(ts_fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(ts_fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(ts_fnv1a64("foobar"), 0x85944171f73967e8ull);
}

// FIPS 180-4's examples (NIST CSRC "SHA256.pdf"): "abc", the empty string,
// and the 448-bit two-block message; a file's digest equals its bytes'.
TEST(Sha256, MatchesTheNistVectorsForBytesAndFiles) {
  auto digest = [](const std::string &s) {
    ts_sha256 *h;
    EXPECT_EQ(ts_sha256_new(&h), TS_OK);
    // fed in two pieces: the running digest must not depend on the cut
    ts_sha256_update(h, s.data(), s.size() / 2);
    ts_sha256_update(h, s.data() + s.size() / 2, s.size() - s.size() / 2);
    char hex[TS_SHA256_HEX];
    ts_sha256_final(h, hex);
    return std::string(hex);
  };
  EXPECT_EQ(digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(digest(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  TempDir d;
  std::string p = d.path("f.bin");
  ASSERT_EQ(ts_atomic_write(p.c_str(), two.data(), two.size()), TS_OK);
  char hex[TS_SHA256_HEX];
  size_t n = 0;
  ASSERT_EQ(ts_sha256_file(p.c_str(), hex, &n), TS_OK);
  EXPECT_EQ(std::string(hex), digest(two));
  EXPECT_EQ(n, two.size());
  char once[TS_SHA256_HEX];
  ASSERT_EQ(ts_sha256_bytes(two.data(), two.size(), once), TS_OK);
  EXPECT_EQ(std::string(once), digest(two));
  EXPECT_EQ(ts_sha256_file(d.path("missing").c_str(), hex, &n), TS_ERR_IO);
  EXPECT_NE(std::string(ts_last_error()).find("missing: cannot open"), std::string::npos);
}

TEST(Base, DtypesAndStatusNames) {
  ts_dtype dt;
  EXPECT_EQ(ts_dtype_parse("bf16", &dt), TS_OK);
  EXPECT_EQ(dt, TS_BF16);
  EXPECT_EQ(ts_dtype_size(TS_FP32), 4u);
  EXPECT_EQ(ts_dtype_size(TS_FP16), 2u);
  EXPECT_EQ(ts_dtype_parse("fp8", &dt), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("'fp8'"), std::string::npos);
  EXPECT_STREQ(ts_status_str(TS_ERR_NUMERIC), "numerical failure");
  EXPECT_STREQ(ts_device_name(TS_DEVICE_CUDA), "cuda");
}

}  // namespace

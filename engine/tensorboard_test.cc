// tensorboard_test.cc — the event files of engine/tensorboard.h read back
// record by record: lengths and CRCs checked by a bitwise CRC-32C of its
// own (not ISA-L's), each Event unpacked (protobuf-c) with its step, tag
// and value. (TensorBoard's own reader on a real run's file:
// tools/check_tensorboard.py, a developer's check.)
#include "engine/tensorboard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/tensorboard.pb-c.h"
#include "engine/tensorboard_testing.h"

namespace {

std::string TempDir() {
  const char *t = getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  char tmpl[4096];
  snprintf(tmpl, sizeof tmpl, "%s/tbXXXXXX", base.c_str());
  return mkdtemp(tmpl);
}

using ts_test::Crc32c;
using ts_test::Records;

TEST(TensorBoard, Crc32cOfTheStandardCheckString) {
  EXPECT_EQ(ts_tensorboard_crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c((const uint8_t *)"123456789", 9), 0xE3069283u);
  std::vector<uint8_t> big(100000);
  for (size_t i = 0; i < big.size(); i++) big[i] = (uint8_t)(i * 131 + 7);
  EXPECT_EQ(ts_tensorboard_crc32c(big.data(), big.size()), Crc32c(big.data(), big.size()));
}

TEST(TensorBoard, EveryScalarReadsBackAfterEachFlush) {
  std::string dir = TempDir() + "/run";
  ts_tensorboard *tb = nullptr;
  ASSERT_EQ(ts_tensorboard_open(&tb, dir.c_str()), TS_OK) << ts_last_error();
  std::string path = ts_tensorboard_path(tb);
  EXPECT_EQ(path.rfind(dir + "/events.out.tfevents.", 0), 0u) << path;
  const char *tags[] = {"train/loss", "train/lr", "memory/params_MiB"};
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < 3; i++)
      ASSERT_EQ(ts_tensorboard_scalar(tb, tags[i], step, i == 2 ? 0.0 : 0.5 * step + i), TS_OK);
    ASSERT_EQ(ts_tensorboard_flush(tb), TS_OK);
    // flushed: a reader sees every record so far, whole
    std::vector<std::vector<uint8_t>> recs = Records(path);
    ASSERT_EQ(recs.size(), 1u + 3u * step);
    Tessera__Tb__Event *first = tessera__tb__event__unpack(nullptr, recs[0].size(), recs[0].data());
    ASSERT_NE(first, nullptr);
    EXPECT_STREQ(first->file_version, "brain.Event:2");
    EXPECT_GT(first->wall_time, 1.7e9);
    tessera__tb__event__free_unpacked(first, nullptr);
    for (size_t r = 1; r < recs.size(); r++) {
      Tessera__Tb__Event *ev = tessera__tb__event__unpack(nullptr, recs[r].size(), recs[r].data());
      ASSERT_NE(ev, nullptr) << r;
      int s = (int)(r - 1) / 3 + 1, i = (int)(r - 1) % 3;
      EXPECT_EQ(ev->step, s);
      ASSERT_NE(ev->summary, nullptr);
      ASSERT_EQ(ev->summary->n_value, 1u);
      EXPECT_STREQ(ev->summary->value[0]->tag, tags[i]);
      // 0.0 too is present (TensorBoard reads a value whose oneof is set)
      EXPECT_EQ(ev->summary->value[0]->value_case,
                TESSERA__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
      EXPECT_EQ(ev->summary->value[0]->simple_value, i == 2 ? 0.0f : (float)(0.5 * s + i));
      tessera__tb__event__free_unpacked(ev, nullptr);
    }
  }
  ts_tensorboard_close(tb);
}

TEST(TensorBoard, AFileInTheWayIsRefusedInOneLine) {
  std::string file = TempDir() + "/plain";
  FILE *f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  ts_tensorboard *tb = nullptr;
  EXPECT_EQ(ts_tensorboard_open(&tb, file.c_str()), TS_ERR_IO);
  EXPECT_EQ(tb, nullptr);
  EXPECT_EQ(std::string(ts_last_error()),
            "`tensorboard_dir` " + file + ": not a folder, expected a folder for the event file");
}

}  // namespace

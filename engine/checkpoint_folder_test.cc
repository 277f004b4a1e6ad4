// checkpoint_folder_test.cc — the folder of checkpoints (checkpoint.h):
// a resume's hold keeps its checkpoint from --keep's pruning (a restart's
// load raced the pruning of ranks that outlived their launcher: "rank-
// 00000.bin: is missing", issue 45), and the next older checkpoint for
// `resume` auto. Folders of step-N with an index.json stand in for
// checkpoints: these functions read names and files only.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "engine/checkpoint.h"

namespace {

class Folder : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ts_folder_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(system(("rm -rf " + root_).c_str()), 0); }
  // step-N with an index.json and a rank file
  std::string Make(int step) {
    char name[32];
    snprintf(name, sizeof name, "step-%08d", step);
    std::string dir = root_ + "/" + name;
    EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
    std::ofstream(dir + "/index.json") << "{}";
    std::ofstream(dir + "/rank-00000.bin") << "bytes";
    return dir;
  }
  static bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }
  std::string root_;
};

TEST_F(Folder, AHeldCheckpointOutlivesAPruneAndGoesAtTheNextOne) {
  std::string a = Make(2), b = Make(4), c = Make(6);
  int fd = ts_checkpoint_hold(a.c_str());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ts_checkpoint_prune(root_.c_str(), 1), TS_OK) << ts_last_error();
  EXPECT_TRUE(Exists(a + "/rank-00000.bin")) << "pruned while a resume reads it";
  EXPECT_TRUE(Exists(a + "/index.json"));
  EXPECT_FALSE(Exists(b)) << "not held: pruned";
  EXPECT_TRUE(Exists(c));
  close(fd);
  ASSERT_EQ(ts_checkpoint_prune(root_.c_str(), 1), TS_OK) << ts_last_error();
  EXPECT_FALSE(Exists(a)) << "released: pruned";
  EXPECT_TRUE(Exists(c));
}

TEST_F(Folder, AHoldAfterThePruneFindsNoCheckpoint) {
  std::string a = Make(2);
  Make(4);
  ASSERT_EQ(ts_checkpoint_prune(root_.c_str(), 1), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_checkpoint_hold(a.c_str()), -1);
}

TEST_F(Folder, TheNextOlderCheckpoint) {
  Make(2);
  std::string b = Make(4);
  mkdir((root_ + "/step-00000005").c_str(), 0755);  // incomplete: no index
  Make(6);
  char out[4096];
  size_t step = 0;
  ASSERT_EQ(ts_checkpoint_latest_below(root_.c_str(), 6, out, sizeof out, &step), 1);
  EXPECT_EQ(std::string(out), b);
  EXPECT_EQ(step, 4u);
  ASSERT_EQ(ts_checkpoint_latest_below(root_.c_str(), 2, out, sizeof out, &step), 0);
  EXPECT_STREQ(out, "");
}

}  // namespace

// checkpoint_faults_test.cc — a checkpoint folder is whole or ignored, and
// a damaged one is refused in one line:
//  - a writer killed at every point of a save (after each chunk of its
//    file, before its commit, before each extra file, before the index's
//    rename) leaves the newest complete checkpoint loadable and passing its
//    checksums, and the folder it was writing is not a checkpoint;
//  - a flipped byte, a truncated file, a missing file, a garbled index,
//    another model's index each fail with one line naming the file.
// One process (no mpirun); the writer runs in a forked child.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "base/testing.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "models/llama.h"
#include "tests/tiny_model.h"

namespace {

using ts_test::TempDir;
constexpr size_t kB = 2, kT = 8;

ts_status Fill(void *, int mb, int32_t *in, int32_t *tgt) {
  for (size_t i = 0; i < kB * kT; i++) {
    in[i] = (int32_t)((i * 31 + (size_t)mb * 7) % tiny::kV);
    tgt[i] = (int32_t)((i * 17 + 5) % tiny::kV);
  }
  return TS_OK;
}

struct Fixture {
  ts_model model{};
  ts_engine *e = nullptr;
  explicit Fixture(size_t layers = 2, size_t intermediate = 64) {
    ts_llama_config cfg = tiny::Config("ckpt-faults", false, layers);
    cfg.intermediate_size = intermediate;
    EXPECT_EQ(ts_llama_model_init(&model, &cfg), TS_OK);
    ts_engine_opts o = ts_engine_default_opts();
    o.micro_batch = kB;
    o.seq = kT;
    o.dtype = TS_BF16;  // four kinds: param, master, exp_avg, exp_avg_sq
    EXPECT_EQ(ts_engine_create(&e, &model, &o, nullptr), TS_OK) << ts_last_error();
  }
  ~Fixture() {
    ts_engine_free(e);
    ts_model_free(&model);
  }
  void Step() {
    ts_step_stats st;
    ASSERT_EQ(ts_engine_step(e, Fill, nullptr, 1e-2f, &st), TS_OK) << ts_last_error();
  }
};

int kill_at = 0, points_passed = 0;
// The seam's save_point: exits at the kill_at-th point of this process.
void KillAt(void *) {
  if (++points_passed == kill_at) _exit(7);
}
const ts_engine_hooks kKillHooks = {nullptr, KillAt, nullptr, nullptr, nullptr};

bool Exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

// Opens and verifies dir against the model: TS_OK or the status, with the
// message in *msg.
ts_status OpenAndVerify(const std::string &dir, const ts_model *m, std::string *msg) {
  ts_checkpoint *ck = nullptr;
  ts_status st = ts_checkpoint_open(&ck, dir.c_str(), m);
  if (st == TS_OK) st = ts_checkpoint_verify(ck, 0, 1);
  if (st == TS_OK) {
    char *text = nullptr;
    st = ts_checkpoint_read_extra(ck, "trainer.json", &text, nullptr);
    free(text);
  }
  *msg = st == TS_OK ? "" : ts_last_error();
  ts_checkpoint_close(ck);
  return st;
}

ts_status Save(ts_engine *e, const std::string &dir) {
  const char tj[] = "{\"step\": 1}";
  ts_checkpoint_extra ex[1] = {{"trainer.json", tj, sizeof tj - 1}};
  return ts_checkpoint_save(e, nullptr, dir.c_str(), ex, 1);
}

TEST(CheckpointFaults, AWriterKilledAnywhereLeavesTheNewestCompleteCheckpoint) {
  TempDir d;
  Fixture f;
  f.Step();
  std::string good = d.path("step-00000001"), next = d.path("step-00000002");
  ASSERT_EQ(Save(f.e, good), TS_OK) << ts_last_error();
  f.Step();
  int points = 0;
  for (kill_at = 1; kill_at < 100; kill_at++) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ts_engine_set_hooks(&kKillHooks);
      _exit(Save(f.e, next) == TS_OK ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    char latest[4096];
    size_t step = 0;
    ASSERT_EQ(ts_checkpoint_latest(d.dir().c_str(), latest, sizeof latest, &step), 1);
    if (WEXITSTATUS(status) == 0) {  // past the last point: the save completed
      EXPECT_EQ(std::string(latest), next);
      break;
    }
    ASSERT_EQ(WEXITSTATUS(status), 7) << "killed at point " << kill_at;
    points++;
    SCOPED_TRACE("killed at point " + std::to_string(kill_at));
    EXPECT_EQ(step, 1u);
    EXPECT_EQ(std::string(latest), good);
    EXPECT_FALSE(Exists(next + "/index.json"));
    std::string msg;
    EXPECT_EQ(OpenAndVerify(good, &f.model, &msg), TS_OK) << msg;
    EXPECT_EQ(OpenAndVerify(next, &f.model, &msg), TS_ERR_IO);
    EXPECT_NE(msg.find("not a complete checkpoint"), std::string::npos) << msg;
  }
  // 4 kinds x 4 units of chunks, the file's commit, trainer.json, the index
  EXPECT_EQ(points, 4 * 4 + 3);
  std::string msg;
  EXPECT_EQ(OpenAndVerify(next, &f.model, &msg), TS_OK) << msg;
}

// A copy of a good checkpoint in a new folder, damaged by `damage`.
struct Damaged {
  TempDir d;
  std::string dir;
  Damaged(const std::string &good, const char *shell) {
    dir = d.path("ck");
    std::string cmd = "cp -r '" + good + "' '" + dir + "' && cd '" + dir + "' && " + shell;
    EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
  }
};

TEST(CheckpointFaults, DamagedFilesAndForeignIndexesFailWithOneLine) {
  TempDir d;
  Fixture f;
  f.Step();
  std::string good = d.path("good");
  ASSERT_EQ(Save(f.e, good), TS_OK) << ts_last_error();
  std::string msg;
  ASSERT_EQ(OpenAndVerify(good, &f.model, &msg), TS_OK) << msg;
  struct Case {
    const char *damage;
    ts_status status;
    const char *says;
  } cases[] = {
      {"printf '\\x55' | dd of=rank-00000.bin bs=1 seek=1000 conv=notrunc status=none",
       TS_ERR_FORMAT, "rank-00000.bin: sha256"},
      {"truncate -s -4 rank-00000.bin", TS_ERR_FORMAT, "rank-00000.bin: has"},
      {"rm rank-00000.bin", TS_ERR_FORMAT, "rank-00000.bin: is missing"},
      {"printf '{\"step\": 9}' > trainer.json", TS_ERR_FORMAT, "trainer.json: sha256"},
      {"rm index.json", TS_ERR_IO, "not a complete checkpoint"},
      {"echo '{\"format\": \"tessera-checkpoint\", \"version\": [' > index.json", TS_ERR_FORMAT,
       "index.json: not valid JSON"},
      {"sed -i 's/\"version\":\\t1/\"version\":\\t2/' index.json", TS_ERR_FORMAT,
       "index.json: version 2: expected 1"},
      {"sed -i 's/\"shape\":\\t\\[32\\]/\"shape\":\\t[33]/' index.json", TS_ERR_FORMAT,
       "the slices do not cover its 33 elements exactly once"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.damage);
    Damaged dm(good, c.damage);
    EXPECT_EQ(OpenAndVerify(dm.dir, &f.model, &msg), c.status);
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // another model's checkpoint: one more layer
  Fixture other(3);
  EXPECT_EQ(OpenAndVerify(good, &other.model, &msg), TS_ERR_FORMAT);
  EXPECT_NE(msg.find("is of another model"), std::string::npos) << msg;
  Fixture wider(2, 96);  // another MLP width
  EXPECT_EQ(OpenAndVerify(good, &wider.model, &msg), TS_ERR_FORMAT);
  EXPECT_NE(msg.find("mlp.gate_proj.weight has shape [64, 32], the model ckpt-faults [96, 32]"),
            std::string::npos)
      << msg;
}

}  // namespace

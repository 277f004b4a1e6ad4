// checkpoint_index_test.cc — index.json as untrusted input, on sealed
// indexes built here (no engine, no files): what the parser
// (engine/checkpoint_index.h) refuses of an index the writer could not have
// written, in one line naming the field, and how its cost grows:
//  - the bounds: a tensor's kind in more slices than data-parallel rank
//    files, two slices of one tensor's kind in one file, more slices in all
//    than the writer cuts (786,432 one-element slices of one tensor are
//    refused before anything sorts them: an insertion sort took ~35 minutes);
//  - slices sorted and tensor names checked by qsort: 200,000 tensors parse
//    in about 3 s where comparing every pair of names took over 7 minutes
//    (past the "small" timeout);
//  - the writer's layout: in each rank file, slices ordered by (kind,
//    tensor) lie at rising offsets;
//  - one version, sealed: version 1 (unsealed) and 3 are refused;
//  - the counters: the optimizer's step against the overflow skips the loss
//    scaler's history shows, the attempts against a step-N folder's name;
//    the data seed, a decimal string.
#include "engine/checkpoint_index.h"

#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

// The kinds of an fp32 index, in the writer's order.
const char *const kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};

// A sealed fp32 index (ZeRO 0, one pipeline stage of one unit) over dp
// rank files of `bytes` each; the test adds tensors and their slices.
struct Index {
  cJSON *root = cJSON_CreateObject();
  cJSON *tensors;
  double num_params = 0;

  Index(int dp, double bytes) {
    cJSON_AddStringToObject(root, "format", "tessera-checkpoint");
    cJSON_AddNumberToObject(root, "version", 2);
    cJSON_AddStringToObject(root, "model", "synthetic");
    cJSON_AddNumberToObject(root, "num_params", 0);
    cJSON_AddStringToObject(root, "dtype", "fp32");
    cJSON_AddNumberToObject(root, "zero_stage", 0);
    cJSON_AddNumberToObject(root, "dp", dp);
    cJSON_AddNumberToObject(root, "pipeline", 1);
    int split[2] = {0, 1};
    cJSON_AddItemToObject(root, "split", cJSON_CreateIntArray(split, 2));
    cJSON_AddNumberToObject(root, "world", dp);
    cJSON *opt = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddNumberToObject(opt, "step", 1);
    cJSON_AddNumberToObject(opt, "attempts", 1);
    cJSON_AddStringToObject(root, "data_seed", "1337");
    cJSON *ls = cJSON_AddObjectToObject(root, "loss_scaler");
    cJSON_AddNumberToObject(ls, "scale", 1);
    cJSON_AddNumberToObject(ls, "clean_steps", 0);
    cJSON_AddArrayToObject(ls, "history");
    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (int f = 0; f < dp; f++) {
      char name[32];
      std::snprintf(name, sizeof name, "rank-%05d.bin", f);
      cJSON *jf = cJSON_CreateObject();
      cJSON_AddStringToObject(jf, "name", name);
      cJSON_AddNumberToObject(jf, "bytes", bytes);
      cJSON_AddStringToObject(jf, "sha256", std::string(64, 'a').c_str());
      cJSON_AddItemToArray(files, jf);
    }
    tensors = cJSON_AddArrayToObject(root, "tensors");
  }
  ~Index() { cJSON_Delete(root); }
  Index(const Index &) = delete;
  Index &operator=(const Index &) = delete;

  // Adds a 1-D tensor of numel elements with an empty slice list per kind
  // (param, exp_avg, exp_avg_sq, all F32); returns it for Slices().
  cJSON *Tensor(const std::string &name, size_t numel) {
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", name.c_str());
    double shape[1] = {(double)numel};
    cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, 1));
    for (const char *kind : kKinds) {
      cJSON *k = cJSON_AddObjectToObject(t, kind);
      cJSON_AddStringToObject(k, "dtype", "F32");
      cJSON_AddArrayToObject(k, "slices");
    }
    cJSON_AddItemToArray(tensors, t);
    num_params += (double)numel;
    return t;
  }
  static cJSON *Slices(cJSON *tensor, const char *kind) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tensor, kind),
                                            "slices");
  }
  // Appends slice [file, begin, end, byte offset].
  static void Slice(cJSON *slices, double file, double begin, double end, double offset) {
    double v[4] = {file, begin, end, offset};
    cJSON_AddItemToArray(slices, cJSON_CreateDoubleArray(v, 4));
  }
  // Replaces member `name` of obj (the root if NULL) with v.
  void Set(const char *name, cJSON *v, cJSON *obj = nullptr) {
    cJSON_ReplaceItemInObjectCaseSensitive(obj ? obj : root, name, v);
  }

  // Seals the index (num_params the tensors' sum) and parses it as folder
  // dir's: the status, the message in *msg.
  ts_status Parse(std::string *msg, const char *dir = "synthetic") {
    Set("num_params", cJSON_CreateNumber(num_params));
    cJSON_DeleteItemFromObjectCaseSensitive(root, "digest");
    char hex[TS_SHA256_HEX];
    EXPECT_EQ(ts_checkpoint_index_digest(root, hex), TS_OK);
    cJSON_AddStringToObject(root, "digest", hex);
    ck_index ix;
    ts_status st = ts_checkpoint_index_parse(&ix, dir, root);
    *msg = st == TS_OK ? "" : ts_last_error();
    if (st == TS_OK) ts_checkpoint_index_free(&ix);
    EXPECT_EQ(msg->find('\n'), std::string::npos) << *msg;
    return st;
  }
  // Whether it parses (TS_OK).
  testing::AssertionResult Accepted(const char *dir = "synthetic") {
    std::string msg;
    ts_status st = Parse(&msg, dir);
    if (st == TS_OK) return testing::AssertionSuccess();
    return testing::AssertionFailure() << ts_status_str(st) << " \"" << msg << "\"";
  }
  // Whether it is refused (TS_ERR_FORMAT) in a line holding `says`.
  testing::AssertionResult Refused(const std::string &says, const char *dir = "synthetic") {
    std::string msg;
    ts_status st = Parse(&msg, dir);
    if (st == TS_ERR_FORMAT && msg.find(says) != std::string::npos)
      return testing::AssertionSuccess();
    return testing::AssertionFailure()
           << ts_status_str(st) << " \"" << msg << "\", expected \"" << says << "\"";
  }
};

// One tensor "w" of n elements at dp 1, its exp_avg and exp_avg_sq whole
// after the parameters (which the caller cuts).
cJSON *OneTensor(Index *ix, size_t n) {
  cJSON *t = ix->Tensor("w", n);
  Index::Slice(Index::Slices(t, "exp_avg"), 0, 0, (double)n, 4.0 * (double)n);
  Index::Slice(Index::Slices(t, "exp_avg_sq"), 0, 0, (double)n, 8.0 * (double)n);
  return t;
}

// The smallest well-formed index: one one-element tensor in one rank file.
struct Small : Index {
  Small() : Index(1, 12) { Slice(Slices(OneTensor(this, 1), "param"), 0, 0, 1, 0); }
};

// Tensors "a" and "b" of 4 elements each, every kind's slice whole in
// rank-00000.bin at offset[kind][tensor].
void TwoTensors(Index *ix, const double (&offset)[3][2]) {
  for (int i = 0; i < 2; i++) {
    cJSON *t = ix->Tensor(i ? "b" : "a", 4);
    for (int k = 0; k < 3; k++) Index::Slice(Index::Slices(t, kKinds[k]), 0, 0, 4, offset[k][i]);
  }
}

// ---- bounds: what the writer cuts ----------------------------------------

TEST(CheckpointIndex, ManySlicesOfOneTensorAreRefusedBeforeTheyAreSorted) {
  // 786,432 one-element slices, last element first, all in the one rank
  // file: an insertion sort of them took ~35 minutes (over 5 here, past
  // this test's timeout); refused by their count at once.
  const size_t n = 786432;
  Index ix(1, 12.0 * n);
  cJSON *param = Index::Slices(OneTensor(&ix, n), "param");
  for (size_t j = 0; j < n; j++)
    Index::Slice(param, 0, (double)(n - 1 - j), (double)(n - j), 4.0 * (double)(n - 1 - j));
  EXPECT_TRUE(
      ix.Refused("synthetic/index.json: tensor w, param: field \"slices\": 786432 slices: "
                 "expected 1 to 1 (at most one per data-parallel rank's file, dp 1)"));
}

TEST(CheckpointIndex, TwoSlicesOfOneTensorsKindInOneFileAreRefused) {
  // dp 2, and tensor w's parameters both in rank-00000.bin: each half
  // alone is well formed (inside the file, aligned, no overlap, covering w)
  Index ix(2, 64);
  cJSON *t = ix.Tensor("w", 8);
  Index::Slice(Index::Slices(t, "param"), 0, 0, 4, 0);
  Index::Slice(Index::Slices(t, "param"), 0, 4, 8, 16);
  Index::Slice(Index::Slices(t, "exp_avg"), 1, 0, 8, 0);
  Index::Slice(Index::Slices(t, "exp_avg_sq"), 1, 0, 8, 32);
  EXPECT_TRUE(
      ix.Refused("synthetic/index.json: files[0]: tensor w has two param slices (elements "
                 "0..4 and 4..8): expected at most one per rank file"));
}

TEST(CheckpointIndex, MoreSlicesThanTheWriterCutsAreRefused) {
  // dp 4, one unit of two 4-element tensors, each element its own slice in
  // its own file: per tensor and kind one slice per file, in the writer's
  // order, but 24 slices where dp rank boundaries can cut at most
  // 3 kinds x (2 tensors + 1 unit x 3 boundaries) = 15.
  Index ix(4, 24);
  for (int i = 0; i < 2; i++) {
    cJSON *t = ix.Tensor(i ? "b" : "a", 4);
    for (int k = 0; k < 3; k++)
      for (int f = 0; f < 4; f++)
        Index::Slice(Index::Slices(t, kKinds[k]), f, f, f + 1, 8 * k + 4 * i);
  }
  EXPECT_TRUE(
      ix.Refused("synthetic/index.json: field \"tensors\": more than 15 slices: expected "
                 "at most 3 kinds x (2 tensors + 1 units x (dp 4 - 1))"));
  // The same two tensors as the writer cuts them at dp 4 (a unit's shard
  // of 16 elements holds both): one slice each, in rank-00000.bin.
  Index ok(4, 96);
  TwoTensors(&ok, {{0, 16}, {32, 48}, {64, 80}});
  EXPECT_TRUE(ok.Accepted());
}

TEST(CheckpointIndex, SlicesInAnyOrderAcrossManyFilesAreSorted) {
  // dp 4096, one tensor cut one element per file, listed last element
  // first: sorted, they cover it exactly once.
  const int dp = 4096;
  Index ix(dp, 12);
  cJSON *t = ix.Tensor("w", dp);
  for (int k = 0; k < 3; k++)
    for (int j = dp - 1; j >= 0; j--) Index::Slice(Index::Slices(t, kKinds[k]), j, j, j + 1, 4 * k);
  EXPECT_TRUE(ix.Accepted());
  // one element missing: not covered
  cJSON_DeleteItemFromArray(Index::Slices(t, "exp_avg"), 7);
  EXPECT_TRUE(
      ix.Refused("tensor w, exp_avg: the slices do not cover its 4096 elements exactly "
                 "once"));
}

// n one-element tensors of one unit in rank-00000.bin, as the writer lays
// them out.
void ManyTensors(Index *ix, int n) {
  for (int i = 0; i < n; i++) {
    cJSON *t = ix->Tensor("model.layers." + std::to_string(i) + ".mlp.down_proj.weight", 1);
    for (int k = 0; k < 3; k++)
      Index::Slice(Index::Slices(t, kKinds[k]), 0, 0, 1, 4.0 * (k * n + i));
  }
}

TEST(CheckpointIndex, TwoHundredThousandTensorsAreCheckedForTwiceListedNamesBySorting) {
  // Comparing every pair of 200,000 names took over 7 minutes (50,000:
  // 8 s; 100,000: 53 s), past this test's timeout; sorted, about 3 s.
  const int n = 200000;
  Index ix(1, 12.0 * n);
  ManyTensors(&ix, n);
  EXPECT_TRUE(ix.Accepted());
  // the last renamed as the first: listed twice
  Index twice(1, 36);
  ManyTensors(&twice, 3);
  twice.Set("name", cJSON_CreateString("model.layers.0.mlp.down_proj.weight"),
            cJSON_GetArrayItem(twice.tensors, 2));
  EXPECT_TRUE(twice.Refused(
      "synthetic/index.json: tensor model.layers.0.mlp.down_proj.weight is listed twice"));
}

// ---- the writer's layout ---------------------------------------------------

TEST(CheckpointIndex, SlicesOutOfTheWritersOrderAreRefused) {
  // Two 4-element tensors, kind by kind, a before b in each: as written.
  Index ok(1, 96);
  TwoTensors(&ok, {{0, 16}, {32, 48}, {64, 80}});
  EXPECT_TRUE(ok.Accepted());
  // a and b trade their parameters' places: no byte shared, all inside
  Index swapped(1, 96);
  TwoTensors(&swapped, {{16, 0}, {32, 48}, {64, 80}});
  EXPECT_TRUE(swapped.Refused(
      "synthetic/index.json: files[0]: tensor b's param slice at offset 0 lies before tensor a's "
      "param slice at offset 16: expected the writer's order (kind, then tensor)"));
  // b's parameters after the moments: a kind out of place
  Index late(1, 112);
  TwoTensors(&late, {{0, 96}, {32, 48}, {64, 80}});
  EXPECT_TRUE(late.Refused(
      "tensor a's exp_avg slice at offset 32 lies before tensor b's param slice at offset 96"));
  // overlapping in the writer's order: still said as shared bytes
  Index shared(1, 96);
  TwoTensors(&shared, {{0, 8}, {32, 48}, {64, 80}});
  EXPECT_TRUE(shared.Refused("files[0]: two slices share bytes 8..16"));
}

// ---- the version -----------------------------------------------------------

TEST(CheckpointIndex, OnlyTheSealedVersionIsRead) {
  Small one, three;
  one.Set("version", cJSON_CreateNumber(1));
  EXPECT_TRUE(
      one.Refused("synthetic/index.json: field \"version\" = 1: expected 2; version 1 is "
                  "unsealed (no \"digest\") and no longer read"));
  three.Set("version", cJSON_CreateNumber(3));
  EXPECT_TRUE(three.Refused("synthetic/index.json: field \"version\" = 3: expected 2"));
  // version 1 without its digest, as tessera wrote it once
  Small ix;
  ix.Set("version", cJSON_CreateNumber(1));
  ix.Set("num_params", cJSON_CreateNumber(1));
  ck_index parsed;
  EXPECT_EQ(ts_checkpoint_index_parse(&parsed, "old", ix.root), TS_ERR_FORMAT);
  EXPECT_NE(std::string(ts_last_error()).find("old/index.json: field \"version\" = 1: expected 2"),
            std::string::npos)
      << ts_last_error();
}

// ---- the counters and the data seed -----------------------------------------

// Small with the optimizer's counters and the loss scaler's history set.
struct Counters : Small {
  Counters(int step, int attempts, const char *history) {
    cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    Set("step", cJSON_CreateNumber(step), opt);
    Set("attempts", cJSON_CreateNumber(attempts), opt);
    Set("history", cJSON_Parse(history), cJSON_GetObjectItemCaseSensitive(root, "loss_scaler"));
  }
};

TEST(CheckpointIndex, OptimizerStepIsCheckedAgainstTheOverflowSkipsOfItsHistory) {
  // The loss scaler's history as a dynamic fp16 run writes it (the check
  // reads the header only, so an fp32 body will do): halved at attempts 2
  // and 5 (two overflow skips), doubled at 4.
  const char *hist = "[[0, 1024], [2, 512], [4, 1024], [5, 512]]";
  EXPECT_TRUE(Counters(6, 8, hist).Accepted());
  EXPECT_TRUE(Counters(7, 8, hist)
                  .Refused("field \"optimizer.step\" = 7: expected at most optimizer.attempts 8 "
                           "less the 2 overflow "
                           "skips loss_scaler.history shows (6)"));
  // the history's steps are optimizer attempts: rising, none after the last
  EXPECT_TRUE(Counters(6, 8, "[[0, 1024], [9, 512]]")
                  .Refused("field \"loss_scaler.history\"[1]: step 9: expected rising steps up "
                           "to optimizer.attempts 8"));
  EXPECT_TRUE(Counters(6, 8, "[[3, 1024], [2, 512]]")
                  .Refused("field \"loss_scaler.history\"[1]: step 2: expected rising steps"));
  // fp32 and bf16 skip too (a non-finite gradient or loss): step < attempts
  // is theirs as well
  EXPECT_TRUE(Counters(5, 8, "[]").Accepted());
}

TEST(CheckpointIndex, AttemptsAreTheStepInAStepFoldersName) {
  for (const char *dir :
       {"ck/step-00000001", "ck/step-1", "ck/step-00000001/", "ck/other", "step-x", "ck/step-"})
    EXPECT_TRUE(Small().Accepted(dir)) << dir;
  EXPECT_TRUE(Small().Refused(
      "ck/step-00000020/index.json: field \"optimizer.attempts\" = 1: expected 20, the step in "
      "the folder's name step-00000020",
      "ck/step-00000020"));
}

TEST(CheckpointIndex, DataSeedIsADecimalStringOfA64BitSeed) {
  for (const char *seed : {"0", "18446744073709551615"}) {
    Small ix;
    ix.Set("data_seed", cJSON_CreateString(seed));
    EXPECT_TRUE(ix.Accepted()) << seed;
  }
  for (const char *seed : {"18446744073709551616", "-1", "", "12a"}) {
    Small ix;
    ix.Set("data_seed", cJSON_CreateString(seed));
    EXPECT_TRUE(ix.Refused("field \"data_seed\": expected a decimal string of a 64-bit seed"))
        << seed;
  }
  Small number;
  number.Set("data_seed", cJSON_CreateNumber(1337));
  EXPECT_TRUE(number.Refused("field \"data_seed\": expected a decimal string of a 64-bit seed"));
}

}  // namespace

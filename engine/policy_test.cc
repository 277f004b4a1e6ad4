// The engine's two self-contained parts on their own: the ZeRO stage as a
// policy table (zero.h) against the table of DESIGN.md "Flat parameters and
// shards", and the fp16 loss scaler (loss_scale.h) against PyTorch
// GradScaler's rules (halve on overflow, double after a window of clean
// steps, a floor that stops training).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/loss_scale.h"
#include "engine/zero.h"

namespace {

TEST(ZeroPolicy, StagesShardWhatTheTableSays) {
  // stage: params sharded, grads sharded, optimizer state sharded
  const int table[4][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 1}, {1, 1, 1}};
  for (int s = 0; s < 4; s++) {
    const ts_zero_policy *z = ts_zero_policy_of(s);
    ASSERT_NE(z, nullptr);
    EXPECT_EQ(z->stage, s);
    EXPECT_EQ(z->shard_params, table[s][0]) << s;
    EXPECT_EQ(z->shard_grads, table[s][1]) << s;
    EXPECT_EQ(z->shard_optim, table[s][2]) << s;
    // Gradients are reduced once: per unit when sharded, else after the step.
    EXPECT_NE(z->reduce_after_step, z->shard_grads) << s;
    // Only DDP all-gathers the reduced gradients back; stages that keep the
    // parameters whole but update a shard all-gather the updated ones.
    EXPECT_EQ(z->gather_grads, s == 0) << s;
    EXPECT_EQ(z->gather_after_update, z->shard_optim && !z->shard_params) << s;
  }
  EXPECT_EQ(ts_zero_policy_of(-1), nullptr);
  EXPECT_EQ(ts_zero_policy_of(4), nullptr);
}

TEST(LossScaler, BfloatAndFp32NeedNone) {
  ts_loss_scaler s;
  for (ts_dtype dt : {TS_FP32, TS_BF16}) {
    ASSERT_EQ(ts_loss_scaler_init(&s, dt, 0, 65536, 2000, 1), TS_OK);
    EXPECT_FALSE(s.enabled);
    EXPECT_EQ(s.scale, 1.0f);
  }
}

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterTheWindow) {
  ts_loss_scaler s;
  ASSERT_EQ(ts_loss_scaler_init(&s, TS_FP16, 0, 1024, 3, 1), TS_OK);
  EXPECT_TRUE(s.enabled && s.dynamic);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 1, "t", 0), TS_OK);
  EXPECT_EQ(s.scale, 512.0f);
  ts_loss_scaler_clean(&s, 2);
  ts_loss_scaler_clean(&s, 3);
  EXPECT_EQ(s.scale, 512.0f) << "two clean steps of a window of three";
  ts_loss_scaler_clean(&s, 4);
  EXPECT_EQ(s.scale, 1024.0f);
  // An overflow resets the clean count.
  ts_loss_scaler_clean(&s, 5);
  ts_loss_scaler_clean(&s, 6);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 7, "t", 0), TS_OK);
  ts_loss_scaler_clean(&s, 8);
  ts_loss_scaler_clean(&s, 9);
  EXPECT_EQ(s.scale, 512.0f);
}

TEST(LossScaler, StopsAtTheFloorNamingTheTensorAndTheHistory) {
  ts_loss_scaler s;
  ASSERT_EQ(ts_loss_scaler_init(&s, TS_FP16, 0, 8, 100, 2), TS_OK);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 3, "a", 1), TS_OK);
  EXPECT_EQ(s.scale, 4.0f);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 5, "b", 1), TS_OK);
  EXPECT_EQ(s.scale, 2.0f);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 6, "model.layers.0.mlp.up_proj.weight", 2),
            TS_ERR_NUMERIC);
  EXPECT_EQ(s.scale, 2.0f) << "unchanged at the floor";
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("fp16 overflow at step 6 with the loss scale at its minimum 2"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight (unit 2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step 0: 8, step 3: 4, step 5: 2"), std::string::npos) << msg;
}

TEST(LossScaler, AFixedScaleNeverMovesAndBadSettingsAreRefused) {
  ts_loss_scaler s;
  ASSERT_EQ(ts_loss_scaler_init(&s, TS_FP16, 128, 65536, 1, 1), TS_OK);
  EXPECT_FALSE(s.dynamic);
  EXPECT_EQ(ts_loss_scaler_overflow(&s, 1, "t", 0), TS_OK);
  ts_loss_scaler_clean(&s, 2);
  EXPECT_EQ(s.scale, 128.0f);
  EXPECT_EQ(ts_loss_scaler_init(&s, TS_FP16, -1, 65536, 1, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("`loss_scale` -1"), std::string::npos);
  EXPECT_EQ(ts_loss_scaler_init(&s, TS_FP16, INFINITY, 65536, 1, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_loss_scaler_init(&s, TS_FP16, 0, 1, 1, 2), TS_ERR_INVALID_ARGUMENT)
      << "minimum above the initial scale";
  EXPECT_EQ(ts_loss_scaler_init(&s, TS_FP16, 0, 4, 0, 1), TS_ERR_INVALID_ARGUMENT) << "window 0";
}

TEST(LossScaler, ADoubleThatWouldOverflowIsNotTaken) {
  ts_loss_scaler s;
  ASSERT_EQ(ts_loss_scaler_init(&s, TS_FP16, 0, 0x1p127f, 1, 1), TS_OK);
  ts_loss_scaler_clean(&s, 1);
  EXPECT_EQ(s.scale, 0x1p127f);
}

}  // namespace

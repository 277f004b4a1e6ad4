// shard_test.cc — flat-buffer layout and the memory ledger.
#include <gtest/gtest.h>

#include <cstdint>

#include "shard/flat.h"
#include "shard/ledger.h"

namespace {

TEST(FlatLayout, PadsToMultipleOfWorldSizeTimes16) {
  const size_t numels[] = {10, 7, 100};
  for (size_t dp : {1, 2, 3, 4, 8}) {
    ts_flat_layout l;
    ASSERT_EQ(ts_flat_layout_init(&l, numels, 3, dp), TS_OK);
    EXPECT_EQ(l.total, 117u);
    EXPECT_EQ(l.padded % (dp * 16), 0u);
    EXPECT_GE(l.padded, l.total);
    EXPECT_LT(l.padded - l.total, dp * 16);  // the smallest such multiple
    EXPECT_EQ(l.shard * dp, l.padded);
    EXPECT_EQ(l.offset[0], 0u);
    EXPECT_EQ(l.offset[1], 10u);
    EXPECT_EQ(l.offset[2], 17u);
    EXPECT_EQ(ts_flat_shard_begin(&l, dp - 1), (dp - 1) * l.shard);
  }
}

TEST(FlatLayout, ShardOverlapsPartitionEveryTensor) {
  // Tensors of 5, 40 and 3 elements on 4 ranks: padded 64, shards of 16.
  // Each rank's overlaps lie in its shard, and over all ranks they cover
  // every tensor exactly once.
  const size_t numels[] = {5, 40, 3};
  ts_flat_layout l;
  ASSERT_EQ(ts_flat_layout_init(&l, numels, 3, 4), TS_OK);
  ASSERT_EQ(l.shard, 16u);
  for (size_t i = 0; i < 3; i++) {
    size_t covered = 0, next = l.offset[i];
    for (size_t r = 0; r < 4; r++) {
      size_t b, e;
      ts_flat_shard_overlap(&l, i, r, &b, &e);
      ASSERT_LE(b, e);
      if (b == e) continue;
      EXPECT_GE(b, r * l.shard);
      EXPECT_LE(e, (r + 1) * l.shard);
      EXPECT_EQ(b, next) << "tensor " << i << " rank " << r;
      next = e;
      covered += e - b;
    }
    EXPECT_EQ(covered, numels[i]);
  }
  size_t b, e;  // tensor 1 spans [5, 45): rank 3 owns [48, 64) of none of it
  ts_flat_shard_overlap(&l, 1, 3, &b, &e);
  EXPECT_EQ(b, e);
  EXPECT_EQ(b, 48u) << "an empty part sits at the shard's first element";
  // Tensor 0 spans [0, 5), wholly before rank 2's shard [32, 48): the empty
  // part must not index before the shard (b - 32 would wrap around).
  ts_flat_shard_overlap(&l, 0, 2, &b, &e);
  EXPECT_EQ(b, 32u);
  EXPECT_EQ(e, 32u);
  ts_flat_shard_overlap(&l, 1, 1, &b, &e);
  EXPECT_EQ(b, 16u);
  EXPECT_EQ(e, 32u);
}

TEST(FlatLayout, RejectsBadArguments) {
  size_t numels[TS_FLAT_MAX_TENSORS + 1] = {};
  ts_flat_layout l;
  EXPECT_EQ(ts_flat_layout_init(&l, numels, TS_FLAT_MAX_TENSORS + 1, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_flat_layout_init(&l, numels, 1, 0), TS_ERR_INVALID_ARGUMENT);
}

TEST(Ledger, TracksCurrentAndPeakPerCategory) {
  ts_ledger l;
  ts_ledger_init(&l);
  void *a, *b, *c;
  ASSERT_EQ(ts_ledger_alloc(&l, TS_MEM_PARAMS, 1000, &a), TS_OK);
  ASSERT_EQ(ts_ledger_alloc(&l, TS_MEM_ACTIVATIONS, 300, &b), TS_OK);
  EXPECT_EQ((uintptr_t)a % 64, 0u);
  EXPECT_EQ(((unsigned char *)a)[999], 0);  // zero-filled
  EXPECT_EQ(l.current[TS_MEM_PARAMS], 1000u);
  EXPECT_EQ(l.current_total, 1300u);
  ts_ledger_free(&l, b);
  ASSERT_EQ(ts_ledger_alloc(&l, TS_MEM_ACTIVATIONS, 200, &c), TS_OK);
  EXPECT_EQ(l.current[TS_MEM_ACTIVATIONS], 200u);
  EXPECT_EQ(l.peak[TS_MEM_ACTIVATIONS], 300u);
  EXPECT_EQ(l.peak_total, 1300u);  // the peak of the sum, not the sum of peaks
  EXPECT_EQ(ts_ledger_size(c), 200u);
  ts_ledger_free(&l, a);
  ts_ledger_free(&l, c);
  ts_ledger_free(&l, nullptr);
  EXPECT_EQ(l.current_total, 0u);
  EXPECT_STREQ(ts_mem_category_name(TS_MEM_OPTIM), "optim");
}

TEST(Ledger, RejectsBadCategoryAndImpossibleSizes) {
  ts_ledger l;
  ts_ledger_init(&l);
  void *p = (void *)1;
  EXPECT_EQ(ts_ledger_alloc(&l, TS_MEM_NUM_CATEGORIES, 8, &p), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ts_ledger_alloc(&l, TS_MEM_GRADS, SIZE_MAX - 8, &p), TS_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(l.current_total, 0u);
}

}  // namespace

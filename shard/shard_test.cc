// shard_test.cc — flat-buffer layout and the memory ledger.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/rng.h"
#include "kernels/kernels.h"

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
  size_t numels[TS_UNIT_MAX_TENSORS + 1] = {};
  ts_flat_layout l;
  EXPECT_EQ(ts_flat_layout_init(&l, numels, TS_UNIT_MAX_TENSORS + 1, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_flat_layout_init(&l, numels, 1, 0), TS_ERR_INVALID_ARGUMENT);
}

TEST(Ledger, TracksCurrentAndPeakPerCategory) {
  ts_ledger l;
  ts_ledger_init(&l);
  void *a, *b, *c;
  ASSERT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_PARAMS, 1000, &a), TS_OK);
  ASSERT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, 300, &b), TS_OK);
  EXPECT_EQ((uintptr_t)a % 64, 0u);
  EXPECT_EQ(((unsigned char *)a)[999], 0);  // zero-filled
  const ts_mem_account *m = ts_ledger_account(&l, TS_DEVICE_CPU);
  EXPECT_EQ(m->current[TS_MEM_PARAMS], 1000u);
  EXPECT_EQ(m->current_total, 1300u);
  ts_ledger_free(&l, b);
  ASSERT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, 200, &c), TS_OK);
  EXPECT_EQ(m->current[TS_MEM_ACTIVATIONS], 200u);
  EXPECT_EQ(m->peak[TS_MEM_ACTIVATIONS], 300u);
  EXPECT_EQ(m->peak_total, 1300u);  // the peak of the sum, not the sum of peaks
  EXPECT_EQ(ts_ledger_size(&l, c), 200u);
  EXPECT_EQ(ts_mem_model_state_bytes(m), 1000u);
  ts_ledger_free(&l, a);
  ts_ledger_free(&l, c);
  ts_ledger_free(&l, nullptr);
  EXPECT_EQ(m->current_total, 0u);
  EXPECT_EQ(ts_ledger_account(&l, TS_DEVICE_CUDA)->peak_total, 0u);
  EXPECT_STREQ(ts_mem_category_name(TS_MEM_OPTIM), "optim");
  void *z = (void *)1;
  ASSERT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_COMM, 0, &z), TS_OK);
  EXPECT_EQ(z, nullptr) << "zero bytes: no block, nothing charged";
  EXPECT_EQ(m->current_total, 0u);
  ts_ledger_release(&l);
}

TEST(Ledger, RejectsBadCategoryAndImpossibleSizes) {
  ts_ledger l;
  ts_ledger_init(&l);
  void *p = (void *)1;
  EXPECT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_NUM_CATEGORIES, 8, &p),
            TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ts_ledger_alloc(&l, (ts_device)5, TS_MEM_GRADS, 8, &p), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_GRADS, SIZE_MAX - 8, &p),
            TS_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ts_last_error()).find("grads"), std::string::npos) << ts_last_error();
  // The allocator's refusal keeps its own words after the ledger's.
  EXPECT_EQ(ts_ledger_alloc(&l, TS_DEVICE_CPU, TS_MEM_OPTIM, SIZE_MAX >> 2, &p),
            TS_ERR_OUT_OF_MEMORY);
  std::string msg = ts_last_error();
  EXPECT_NE(msg.find("bytes of optim: cpu: cannot allocate"), std::string::npos) << msg;
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ts_ledger_account(&l, TS_DEVICE_CPU)->current_total, 0u);
  ts_ledger_release(&l);
}

// The side table under churn: thousands of blocks of two devices, freed in
// a shuffled order while others are allocated, every size and every
// account right throughout (a plan ledger: no GPU needed for device blocks).
TEST(Ledger, SideTableKeepsEveryBlockThroughChurn) {
  for (int plan = 0; plan < 2; plan++) {
    ts_ledger l;
    if (plan) ts_ledger_init_plan(&l);
    else ts_ledger_init(&l);
    const ts_device devs[2] = {TS_DEVICE_CPU, plan ? TS_DEVICE_CUDA : TS_DEVICE_CPU};
    std::vector<std::pair<void *, size_t>> live;
    size_t want[TS_DEVICE_COUNT] = {0, 0}, peak[TS_DEVICE_COUNT] = {0, 0};
    uint64_t s = 99;
    auto rnd = [&s]() { return ts_splitmix64(&s); };
    for (int round = 0; round < 3000; round++) {
      if (live.empty() || rnd() % 3 != 0) {
        size_t n = 1 + rnd() % 5000;
        ts_device d = devs[rnd() % 2];
        void *p;
        ASSERT_EQ(ts_ledger_alloc(&l, d, (ts_mem_category)(rnd() % TS_MEM_NUM_CATEGORIES), n, &p),
                  TS_OK);
        ASSERT_NE(p, nullptr);
        for (auto &q : live) ASSERT_NE(q.first, p) << "addresses are unique";
        live.push_back({p, n * TS_DEVICE_COUNT + d});
        want[d] += n;
        if (want[d] > peak[d]) peak[d] = want[d];
      } else {
        size_t k = rnd() % live.size();
        size_t n = live[k].second / TS_DEVICE_COUNT, d = live[k].second % TS_DEVICE_COUNT;
        ASSERT_EQ(ts_ledger_size(&l, live[k].first), n);
        ts_ledger_free(&l, live[k].first);
        want[d] -= n;
        live[k] = live.back();
        live.pop_back();
      }
      for (int d = 0; d < TS_DEVICE_COUNT; d++)
        ASSERT_EQ(ts_ledger_account(&l, (ts_device)d)->current_total, want[d]) << round;
    }
    for (auto &q : live) ASSERT_EQ(ts_ledger_size(&l, q.first), q.second / TS_DEVICE_COUNT);
    for (int d = 0; d < TS_DEVICE_COUNT; d++)
      EXPECT_EQ(ts_ledger_account(&l, (ts_device)d)->peak_total, peak[d]);
    for (auto &q : live) ts_ledger_free(&l, q.first);
    EXPECT_EQ(ts_ledger_account(&l, TS_DEVICE_CPU)->current_total, 0u);
    ts_ledger_release(&l);
  }
}

}  // namespace

// Transients: a plan ledger counts, per (device, size), the most in use at
// once (what a device engine reserves at create); on the CPU a transient is
// a plain zeroed block, freed at once, and nothing is kept.
TEST(Ledger, TransientsAreProfiledAndCpuKeepsNone) {
  ts_ledger plan;
  ts_ledger_init_plan(&plan);
  void *a, *b, *c;
  ASSERT_EQ(ts_ledger_alloc_transient(&plan, TS_DEVICE_CUDA, TS_MEM_PARAMS, 4096, &a), TS_OK);
  ASSERT_EQ(ts_ledger_alloc_transient(&plan, TS_DEVICE_CUDA, TS_MEM_GRADS, 4096, &b), TS_OK);
  EXPECT_EQ(ts_ledger_account(&plan, TS_DEVICE_CUDA)->current_total, 8192u);  // charged
  ts_ledger_free_transient(&plan, a);
  ts_ledger_free_transient(&plan, b);
  ASSERT_EQ(ts_ledger_alloc_transient(&plan, TS_DEVICE_CUDA, TS_MEM_PARAMS, 4096, &c), TS_OK);
  ts_ledger_free_transient(&plan, c);
  EXPECT_EQ(ts_ledger_account(&plan, TS_DEVICE_CUDA)->current_total, 0u);
  EXPECT_EQ(ts_ledger_account(&plan, TS_DEVICE_CUDA)->peak_total, 8192u);
  int found = 0;
  for (const ts_ledger_transient &t : plan.transients)
    if (t.nbytes == 4096 && t.device == TS_DEVICE_CUDA) {
      EXPECT_EQ(t.most, 2u);
      EXPECT_EQ(t.live, 0u);
      found++;
    }
  EXPECT_EQ(found, 1);
  EXPECT_EQ(ts_ledger_cached_bytes(&plan, TS_DEVICE_CUDA), 0u);  // a plan keeps nothing
  // Reserving every transient costs more than the plan's peak when sizes
  // peak at different moments: a steady 1000-byte block, then 4096 x 2
  // (above), then a 6000-byte transient alone.
  void *steady, *big;
  ASSERT_EQ(ts_ledger_alloc(&plan, TS_DEVICE_CUDA, TS_MEM_PARAMS, 1000, &steady), TS_OK);
  ASSERT_EQ(ts_ledger_alloc_transient(&plan, TS_DEVICE_CUDA, TS_MEM_GRADS, 6000, &big), TS_OK);
  ts_ledger_free_transient(&plan, big);
  EXPECT_EQ(ts_ledger_account(&plan, TS_DEVICE_CUDA)->peak_total, 8192u);  // 4096 x 2 earlier
  EXPECT_EQ(ts_ledger_reserved_peak(&plan, TS_DEVICE_CUDA), 1000u + 2 * 4096u + 6000u);
  ts_ledger_free(&plan, steady);

  ts_ledger cpu;
  ts_ledger_init(&cpu);
  ASSERT_EQ(ts_ledger_alloc_transient(&cpu, TS_DEVICE_CPU, TS_MEM_GRADS, 256, &a), TS_OK);
  for (int i = 0; i < 256; i++) EXPECT_EQ(((unsigned char *)a)[i], 0) << i;
  ((unsigned char *)a)[0] = 7;
  ts_ledger_free_transient(&cpu, a);
  EXPECT_EQ(ts_ledger_cached_bytes(&cpu, TS_DEVICE_CPU), 0u);
  // Reserving the plan's CUDA transients needs a GPU: without one it fails
  // in one line and keeps nothing.
  if (ts_k_device_count(TS_DEVICE_CUDA) == 0) {
    EXPECT_NE(ts_ledger_reserve_transients(&cpu, &plan), TS_OK);
    EXPECT_NE(std::string(ts_last_error()), "");
    EXPECT_EQ(ts_ledger_cached_bytes(&cpu, TS_DEVICE_CUDA), 0u);
  }
  ASSERT_EQ(ts_ledger_alloc_transient(&cpu, TS_DEVICE_CPU, TS_MEM_GRADS, 256, &b), TS_OK);
  EXPECT_EQ(((unsigned char *)b)[0], 0);  // a fresh zeroed block
  ts_ledger_free_transient(&cpu, b);
  EXPECT_EQ(ts_ledger_account(&cpu, TS_DEVICE_CPU)->current_total, 0u);
  ts_ledger_release(&cpu);
  ts_ledger_release(&plan);
}

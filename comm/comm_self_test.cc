// comm_self_test.cc — ts_comm_self without MPI: this binary never calls
// ts_comm_init and runs without mpirun. Any MPI call on an uninitialised MPI
// would abort the process (Open MPI's default), and every test checks that
// MPI is still uninitialised afterwards (MPI_Initialized may be called at
// any time). Counters must stay zero: a one-rank group sends nothing.
#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "base/floats.h"

namespace {

class Self : public testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(ts_comm_self(&c_), TS_OK) << ts_last_error(); }
  void TearDown() override {
    for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
      EXPECT_EQ(ts_comm_get_counters(c_)->bytes[k], 0u) << ts_comm_kind_name((ts_comm_kind)k);
      EXPECT_EQ(ts_comm_get_counters(c_)->calls[k], 0u) << ts_comm_kind_name((ts_comm_kind)k);
    }
    EXPECT_EQ(ts_comm_bytes_sent(c_), 0u);
    ts_comm_free(c_);
    int init = 1;
    MPI_Initialized(&init);
    EXPECT_EQ(init, 0) << "something initialised MPI";
    EXPECT_EQ(ts_comm_initialized(), 0);
  }
  ts_comm *c_ = nullptr;
};

TEST_F(Self, IsRankZeroOfOne) {
  EXPECT_EQ(ts_comm_rank(c_), 0);
  EXPECT_EQ(ts_comm_size(c_), 1);
  EXPECT_STREQ(ts_comm_name(c_), "self");
  EXPECT_EQ(ts_comm_reduce_scatter_scratch_bytes(c_, 1000, TS_FP32), 0u);
  EXPECT_EQ(ts_comm_all_reduce_scratch_bytes(c_, 1000, TS_BF16), 0u);
  EXPECT_EQ(ts_comm_barrier(c_), TS_OK);
  ts_comm *sub = nullptr;
  ASSERT_EQ(ts_comm_split(c_, 3, 0, "dp", &sub), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_size(sub), 1);
  EXPECT_STREQ(ts_comm_name(sub), "dp");
  ts_comm_free(sub);
  EXPECT_EQ(ts_comm_split(c_, -1, 0, "dp", &sub), TS_ERR_INVALID_ARGUMENT);
  ts_comm_free(nullptr);
}

TEST_F(Self, CollectivesCopy) {
  std::vector<float> send = {1.5f, -2.25f, 3.0f}, recv(3, 0.0f);
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), 3, TS_FP32, 0, nullptr, 0), TS_OK)
      << ts_last_error();
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), 0.0f);
  ASSERT_EQ(ts_comm_all_gather(c_, send.data(), recv.data(), 3, TS_FP32), TS_OK);
  EXPECT_EQ(recv, send);
  // In place: nothing changes.
  std::vector<float> keep = send;
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), send.data(), 3, TS_FP32, 0, nullptr, 0), TS_OK);
  ASSERT_EQ(ts_comm_all_gather(c_, send.data(), send.data(), 3, TS_FP32), TS_OK);
  ASSERT_EQ(ts_comm_all_reduce(c_, send.data(), 3, TS_FP32, nullptr, 0), TS_OK);
  ASSERT_EQ(ts_comm_broadcast(c_, send.data(), 3, TS_FP32, 0), TS_OK);
  EXPECT_EQ(send, keep);
  double d[2] = {0.1, -7.0};
  for (ts_comm_op op : {TS_COMM_SUM, TS_COMM_MAX, TS_COMM_MIN}) {
    ASSERT_EQ(ts_comm_all_reduce_f64(c_, d, 2, op), TS_OK);
  }
  EXPECT_EQ(d[0], 0.1);
  EXPECT_EQ(d[1], -7.0);
}

// Accumulate adds the previous recv after the (one-rank) sum, in fp32,
// rounding once to bf16 (ulp 2^-7 at 1, 2^-6 at 3), so the expected bits are
// known by hand: 1 + 2^-8 is a tie and rounds to even (1.0); 3 + 3*2^-8 is
// 0.75 ulp above 3 and rounds up to 3 + 2^-6.
TEST_F(Self, ReduceScatterAccumulateAdds) {
  std::vector<float> send = {1.0f, 0.5f}, recv = {2.0f, 0.25f};
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), 2, TS_FP32, 1, nullptr, 0), TS_OK);
  EXPECT_EQ(recv[0], 3.0f);
  EXPECT_EQ(recv[1], 0.75f);
  uint16_t hs[2] = {ts_f32_to_bf16(1.0f), ts_f32_to_bf16(3.0f)};
  uint16_t hr[2] = {ts_f32_to_bf16(0.00390625f), ts_f32_to_bf16(0.0117187500f)};
  ASSERT_EQ(ts_comm_reduce_scatter(c_, hs, hr, 2, TS_BF16, 1, nullptr, 0), TS_OK);
  EXPECT_EQ(hr[0], ts_f32_to_bf16(1.0f));
  EXPECT_EQ(hr[1], ts_f32_to_bf16(3.015625f));
}

TEST_F(Self, NonBlockingFormsComplete) {
  std::vector<float> send = {4.0f, 5.0f}, recv(2, 0.0f), all(2, 0.0f), b = {6.0f, 7.0f};
  ts_comm_request *q1 = nullptr, *q2 = nullptr, *q3 = nullptr;
  ASSERT_EQ(ts_comm_ireduce_scatter(c_, send.data(), recv.data(), 2, TS_FP32, 0, nullptr, 0, &q1),
            TS_OK);
  ASSERT_EQ(ts_comm_iall_gather(c_, send.data(), all.data(), 2, TS_FP32, &q2), TS_OK);
  ASSERT_EQ(ts_comm_ibroadcast(c_, b.data(), 2, TS_FP32, 0, &q3), TS_OK);
  EXPECT_EQ(ts_comm_wait(q3), TS_OK);
  EXPECT_EQ(ts_comm_wait(q2), TS_OK);
  EXPECT_EQ(ts_comm_wait(q1), TS_OK);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(all, send);
  EXPECT_EQ(b[1], 7.0f);
}

TEST_F(Self, ArgumentErrors) {
  float x[2] = {0, 0};
  ts_comm_request *q = nullptr;
  EXPECT_EQ(ts_comm_broadcast(c_, x, 2, TS_FP32, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_send(c_, x, 2, TS_FP32, 0, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_recv(c_, x, 2, TS_FP32, 0, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_isend(c_, x, 2, TS_FP32, 1, 0, &q), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_irecv(c_, x, 2, TS_FP32, -1, 0, &q), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_all_gather(c_, x, x, 2, (ts_dtype)5), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_all_reduce_f64(c_, nullptr, 0, (ts_comm_op)3), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_reduce_scatter(c_, nullptr, x, 2, TS_FP32, 0, nullptr, 0),
            TS_ERR_INVALID_ARGUMENT);
}

// Without ts_comm_init, the world is refused (not an MPI crash), and
// finalize is a no-op.
TEST_F(Self, WorldNeedsInit) {
  ts_comm *w = nullptr;
  EXPECT_EQ(ts_comm_world(&w), TS_ERR_INVALID_USAGE);
  EXPECT_EQ(ts_comm_finalize(), TS_OK);
}

}  // namespace

// Lent memory (ts_comm_set_memory): the one-rank collectives move the data
// with the lender's copy and add only. The lender here is host memory that
// counts its calls and records what it was asked, so a copy done behind its
// back (a plain memcpy on what could be device memory) fails the test.
struct Lender {
  int copies = 0, adds = 0;
  static ts_status Copy(void *user, void *dst, const void *src, size_t nbytes) {
    static_cast<Lender *>(user)->copies++;
    memcpy(dst, src, nbytes);
    return TS_OK;
  }
  static ts_status Add(void *user, void *out, const void *a, const void *b, size_t count,
                       ts_dtype dt) {
    static_cast<Lender *>(user)->adds++;
    EXPECT_EQ(dt, TS_FP32);
    for (size_t i = 0; i < count; i++)
      ((float *)out)[i] = ((const float *)a)[i] + ((const float *)b)[i];
    return TS_OK;
  }
};

TEST_F(Self, LentMemoryMovesDataThroughTheLendersOperations) {
  Lender l;
  ts_comm_memory mem = {&l, Lender::Copy, Lender::Add, nullptr, nullptr, nullptr, nullptr, 0};
  ASSERT_EQ(ts_comm_set_memory(c_, &mem), TS_OK) << ts_last_error();
  std::vector<float> send = {1, 2, 3}, recv(3, 0.0f);
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), 3, TS_FP32, 0, nullptr, 0), TS_OK);
  EXPECT_EQ(l.copies, 1);
  ASSERT_EQ(ts_comm_reduce_scatter(c_, send.data(), recv.data(), 3, TS_FP32, 1, nullptr, 0), TS_OK);
  EXPECT_EQ(l.adds, 1);
  EXPECT_EQ(recv, (std::vector<float>{2, 4, 6}));
  std::vector<float> full(3, 0.0f);
  ASSERT_EQ(ts_comm_all_gather(c_, recv.data(), full.data(), 3, TS_FP32), TS_OK);
  EXPECT_EQ(l.copies, 2);
  EXPECT_EQ(full, recv);
  // Back to host memory: the lender is no longer called.
  ASSERT_EQ(ts_comm_set_memory(c_, nullptr), TS_OK);
  ASSERT_EQ(ts_comm_all_gather(c_, send.data(), full.data(), 3, TS_FP32), TS_OK);
  EXPECT_EQ(l.copies, 2);
  EXPECT_EQ(full, send);
  ts_comm_memory half = {&l, Lender::Copy, nullptr, nullptr, nullptr, nullptr, nullptr, 0};
  EXPECT_EQ(ts_comm_set_memory(c_, &half), TS_ERR_INVALID_ARGUMENT);
}

// A plan group: rank 1 of 4 without MPI; calls are checked and counted as
// on a real group of 4 (reduce-scatter sends (N-1)/N of the buffer), and
// nothing moves: its buffers here are addresses without memory.
TEST(Plan, CountsLikeARealGroupAndMovesNothing) {
  ts_comm *p = nullptr;
  ASSERT_EQ(ts_comm_plan(1, 4, "dp", &p), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_rank(p), 1);
  EXPECT_EQ(ts_comm_size(p), 4);
  void *whole = reinterpret_cast<void *>(uintptr_t{1} << 20);         // (4, 100) fp32: 1600 bytes
  void *part = reinterpret_cast<void *>((uintptr_t{1} << 20) + 400);  // rank 1's chunk
  void *scratch = reinterpret_cast<void *>(uintptr_t{1} << 24);
  size_t sb = ts_comm_reduce_scatter_scratch_bytes(p, 100, TS_FP32);
  ASSERT_EQ(ts_comm_reduce_scatter(p, whole, part, 100, TS_FP32, 0, scratch, sb), TS_OK)
      << ts_last_error();
  ASSERT_EQ(ts_comm_all_gather(p, part, whole, 100, TS_FP32), TS_OK) << ts_last_error();
  ts_comm_request *r = nullptr;
  ASSERT_EQ(ts_comm_isend(p, part, 10, TS_FP32, 2, 0, &r), TS_OK) << ts_last_error();
  EXPECT_EQ(ts_comm_wait(r), TS_OK);
  double sums[2] = {1.5, 2.5};
  ASSERT_EQ(ts_comm_all_reduce_f64(p, sums, 2, TS_COMM_SUM), TS_OK);
  EXPECT_EQ(sums[0], 1.5);  // left as it is
  const ts_comm_counters *k = ts_comm_get_counters(p);
  EXPECT_EQ(k->bytes[TS_COMM_REDUCE_SCATTER], 1200u);  // 3 of 4 chunks of 400 bytes
  EXPECT_EQ(k->bytes[TS_COMM_ALL_GATHER], 1200u);
  EXPECT_EQ(k->bytes[TS_COMM_SEND], 40u);
  // Still checked: a peer outside the group, a small scratch.
  EXPECT_EQ(ts_comm_send(p, part, 10, TS_FP32, 4, 0), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_reduce_scatter(p, whole, part, 100, TS_FP32, 0, scratch, sb - 1),
            TS_ERR_INVALID_ARGUMENT);
  ts_comm_free(p);
  EXPECT_EQ(ts_comm_plan(4, 4, "dp", &p), TS_ERR_INVALID_ARGUMENT);
  int init = 1;
  MPI_Initialized(&init);
  EXPECT_EQ(init, 0);
}

// nccl_test.cc — the NCCL transport's set-up checks on any machine (the
// transfers need GPUs: tests/nccl_gpu_test). Without MPI and without a
// GPU: refusals name what is missing in one line and leave the group as
// it was; a plan group keeps the lent memory and moves nothing (the
// estimate of `--comm nccl`); without a GPU the one-rank NCCL path fails
// with CUDA's message (TS_ERR_CUDA) and the group stays on its own
// transport with no memory lent.
#include "comm/nccl.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "comm/comm.h"

namespace {

ts_status Copy(void *, void *, const void *, size_t) { return TS_OK; }
ts_status Add(void *, void *, const void *, const void *, size_t, ts_dtype) { return TS_OK; }
ts_status Sum(void *, void *, const void *const *, int, size_t, ts_dtype, int) { return TS_OK; }

// Memory with copy and add, and streams with sum_ranks and no stream.
struct Lent {
  ts_comm_memory mem{};
  ts_comm_nccl_streams s{};
  Lent() {
    mem.copy = Copy;
    mem.add = Add;
    s.sum_ranks = Sum;
  }
};

TEST(Nccl, RefusalsNameWhatIsMissingAndLeaveTheGroupAsItWas) {
  ts_comm *c = nullptr;
  ASSERT_EQ(ts_comm_self(&c), TS_OK);
  Lent l;
  ts_comm_memory &mem = l.mem;
  ts_comm_nccl_streams &s = l.s;
  EXPECT_EQ(ts_comm_set_nccl(nullptr, &mem, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ts_comm_set_nccl(c, &mem, nullptr), TS_ERR_INVALID_ARGUMENT);
  ts_comm_nccl_streams no_sum = s;
  no_sum.sum_ranks = nullptr;
  EXPECT_EQ(ts_comm_set_nccl(c, &mem, &no_sum), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("streams needs sum_ranks"), std::string::npos);
  // no streams: refused before any CUDA call
  EXPECT_EQ(ts_comm_set_nccl(c, &mem, &s), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ts_last_error()).find("streams needs step_stream and comm_stream"),
            std::string::npos)
      << ts_last_error();
  EXPECT_STREQ(ts_comm_transport(c), "self");
  // other memory already lent
  ts_comm_memory other = mem;
  ASSERT_EQ(ts_comm_set_memory(c, &other), TS_OK);
  EXPECT_EQ(ts_comm_set_nccl(c, &mem, &s), TS_ERR_INVALID_USAGE);
  ASSERT_EQ(ts_comm_set_memory(c, nullptr), TS_OK);
  ts_comm_free(c);
}

TEST(Nccl, APlanGroupKeepsTheMemoryAndMovesNothing) {
  ts_comm *c = nullptr;
  ASSERT_EQ(ts_comm_plan(1, 4, "dp", &c), TS_OK);
  Lent l;  // a plan context has no stream
  ts_comm_memory &mem = l.mem;
  ts_comm_nccl_streams &s = l.s;
  ASSERT_EQ(ts_comm_set_nccl(c, &mem, &s), TS_OK) << ts_last_error();
  EXPECT_STREQ(ts_comm_transport(c), "plan");
  char *recv = reinterpret_cast<char *>(uintptr_t{64});                      // no memory behind it
  EXPECT_EQ(ts_comm_all_gather(c, recv + 2000, recv, 1000, TS_BF16), TS_OK)  // rank 1 in place
      << ts_last_error();
  EXPECT_EQ(ts_comm_set_memory(c, nullptr), TS_OK);
  ts_comm_free(c);
}

TEST(Nccl, WithoutAGpuTheOneRankPathFailsCleanly) {
  // CI has no GPU; on a GPU machine this test has nothing to show
  // (nccl_gpu_test runs the path)
  if (ts_comm_nccl_version()[0] == '?') GTEST_SKIP() << "libnccl did not answer ncclGetVersion";
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0)  // the streams below are fake
    GTEST_SKIP() << "a GPU is present; tests/nccl_gpu_test covers this path";
  cudaGetLastError();
  printf("NCCL %s\n", ts_comm_nccl_version());
  ts_comm *c = nullptr;
  ASSERT_EQ(ts_comm_self(&c), TS_OK);
  Lent l;
  ts_comm_memory &mem = l.mem;
  ts_comm_nccl_streams &s = l.s;
  s.step_stream = (void *)1;  // never used: the device is checked first
  s.comm_stream = (void *)2;
  s.device = 0;
  EXPECT_EQ(ts_comm_set_nccl(c, &mem, &s), TS_ERR_CUDA) << ts_last_error();
  EXPECT_NE(std::string(ts_last_error()).find("ts_comm_set_nccl (nccl): cudaSetDevice"),
            std::string::npos)
      << ts_last_error();
  EXPECT_EQ(std::string(ts_last_error()).find('\n'), std::string::npos);
  EXPECT_STREQ(ts_comm_transport(c), "self");
  // the group works as before, on host memory
  float x[2] = {1, 2}, y[2] = {0, 0};
  EXPECT_EQ(ts_comm_all_gather(c, x, y, 2, TS_FP32), TS_OK);
  EXPECT_EQ(y[1], 2.0f);
  ts_comm_free(c);
}

}  // namespace

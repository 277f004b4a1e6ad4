// GPU smoke test for ts_cuda_library (tag "gpu": built everywhere, run only
// with `bazel test --test_tag_filters=gpu //...` on a machine with a GPU).
#include "third_party/smoke/cuda_smoke.h"

#include <vector>

#include "gtest/gtest.h"

TEST(CudaSmoke, SeesADevice) { EXPECT_GE(ts_smoke_cuda_device_count(), 1); }

TEST(CudaSmoke, SaxpyKernelRuns) {
  const int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; i++) {
    x[i] = (float)i;
    y[i] = 1.0f;
  }
  ASSERT_EQ(ts_smoke_cuda_saxpy(n, 2.0f, x.data(), y.data()), 0);
  // 2*i + 1 for i < 1000 is an integer below 2^24: exact in fp32 even if
  // the device fuses the multiply-add, so compare exactly.
  for (int i = 0; i < n; i++) ASSERT_EQ(y[i], 2.0f * i + 1.0f) << "i=" << i;
}

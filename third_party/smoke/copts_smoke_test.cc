// Checks that the shared build settings reach the code: C files compile as
// C11 with OpenMP, POSIX names and unfused multiply-adds (third_party/copts.bzl
// and .bazelrc); C++ files compile as C++17.
#include "third_party/smoke/copts_smoke.h"

#include "gtest/gtest.h"

TEST(CoptsSmoke, CIsC11) { EXPECT_EQ(ts_smoke_c_std_version(), 201112L); }

TEST(CoptsSmoke, CxxIsCxx17) { EXPECT_EQ(__cplusplus, 201703L); }

TEST(CoptsSmoke, OpenMpIsOn) {
  EXPECT_EQ(ts_smoke_c_openmp_enabled(), 1);
  EXPECT_GE(ts_smoke_c_omp_threads(), 1);
}

TEST(CoptsSmoke, MultiplyAddIsNotFused) {
  EXPECT_EQ(ts_smoke_c_fp_contract_off(), 1);
}

TEST(CoptsSmoke, PosixClockIsAvailable) {
  double t0 = ts_smoke_c_now();
  double t1 = ts_smoke_c_now();
  EXPECT_GT(t0, 0.0);
  EXPECT_GE(t1, t0);
}

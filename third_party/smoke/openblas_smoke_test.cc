// Smoke test for @openblas: <cblas.h> resolves to OpenBLAS and cblas_sgemm
// links and computes a known product.
#include <cblas.h>

#include "gtest/gtest.h"

TEST(OpenBlasSmoke, SgemmTwoByTwo) {
  // Row-major A = [1 2; 3 4], B = [5 6; 7 8]: A*B = [19 22; 43 50].
  const float a[4] = {1, 2, 3, 4};
  const float b[4] = {5, 6, 7, 8};
  float c[4] = {-1, -1, -1, -1};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2,
              b, 2, 0.0f, c, 2);
  // Small integers: every product and sum is exact in fp32, so compare exactly.
  EXPECT_EQ(c[0], 19.0f);
  EXPECT_EQ(c[1], 22.0f);
  EXPECT_EQ(c[2], 43.0f);
  EXPECT_EQ(c[3], 50.0f);
}

TEST(OpenBlasSmoke, SgemmTransposedB) {
  // A * B^T with B = [5 6; 7 8]: [1*5+2*6 1*7+2*8; 3*5+4*6 3*7+4*8].
  const float a[4] = {1, 2, 3, 4};
  const float b[4] = {5, 6, 7, 8};
  float c[4] = {0, 0, 0, 0};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2, 2, 2, 1.0f, a, 2, b,
              2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 17.0f);
  EXPECT_EQ(c[1], 23.0f);
  EXPECT_EQ(c[2], 39.0f);
  EXPECT_EQ(c[3], 53.0f);
}

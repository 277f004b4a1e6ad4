// Smoke test for @mpi: mpi.h resolves, libmpi links, and a singleton
// MPI_Init (no mpirun) gives a world of one rank.
#include <mpi.h>

#include "gtest/gtest.h"

TEST(MpiSmoke, SingletonWorldHasOneRank) {
  int argc = 0;
  char **argv = nullptr;
  ASSERT_EQ(MPI_Init(&argc, &argv), MPI_SUCCESS);
  int size = -1, rank = -1;
  EXPECT_EQ(MPI_Comm_size(MPI_COMM_WORLD, &size), MPI_SUCCESS);
  EXPECT_EQ(MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_SUCCESS);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(rank, 0);
  // An all-reduce over one rank returns the input unchanged.
  double in = 2.5, out = 0.0;
  EXPECT_EQ(MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
            MPI_SUCCESS);
  EXPECT_EQ(out, 2.5);
  EXPECT_EQ(MPI_Finalize(), MPI_SUCCESS);
}

// grid_test.cc — the pipeline grid (engine/grid.h) on the ranks mpirun
// gives (1, 2, 4): for every P dividing the world, each rank's stage and dp
// rank follow rank = stage * dp + dp_rank; an all-reduce in the dp group
// adds exactly the world ranks of this stage; activations passed down the
// pipeline group (stage s to s + 1) and gradients back up arrive from the
// right neighbour; a P that does not divide the world is refused on every
// rank in one line. Every test is collective.
#include <gtest/gtest.h>

#include <string>

#include "comm/comm.h"
#include "engine/grid.h"

namespace {

TEST(Grid, StagesAndGroupsFollowTheLayout) {
  ts_comm *world = nullptr;
  ASSERT_EQ(ts_comm_world(&world), TS_OK) << ts_last_error();
  int N = ts_comm_size(world), rank = ts_comm_rank(world);
  for (int P = 1; P <= N; P++) {
    if (N % P != 0) continue;
    SCOPED_TRACE("P=" + std::to_string(P));
    ts_grid g;
    ASSERT_EQ(ts_grid_make(world, P, &g), TS_OK) << ts_last_error();
    int dp = N / P;
    EXPECT_EQ(g.dp, dp);
    EXPECT_EQ(g.stage * dp + g.dp_rank, rank);
    EXPECT_EQ(ts_comm_size(g.dp_group), dp);
    EXPECT_EQ(ts_comm_rank(g.dp_group), g.dp_rank);
    EXPECT_EQ(ts_comm_size(g.pp_group), P);
    EXPECT_EQ(ts_comm_rank(g.pp_group), g.stage);
    // The dp group holds the world ranks stage*dp .. stage*dp + dp - 1.
    double sum = rank;
    ASSERT_EQ(ts_comm_all_reduce_f64(g.dp_group, &sum, 1, TS_COMM_SUM), TS_OK);
    double want = 0;
    for (int r = g.stage * dp; r < (g.stage + 1) * dp; r++) want += r;
    EXPECT_EQ(sum, want);
    // Down the pipeline and back: each stage hears its neighbours' world
    // ranks (the first sends first, so nobody waits on a wrong peer).
    float from_prev = -1, from_next = -1, me = (float)rank;
    if (g.stage > 0)
      ASSERT_EQ(ts_comm_recv(g.pp_group, &from_prev, 1, TS_FP32, g.stage - 1, 1), TS_OK);
    if (g.stage < P - 1)
      ASSERT_EQ(ts_comm_send(g.pp_group, &me, 1, TS_FP32, g.stage + 1, 1), TS_OK);
    if (g.stage < P - 1)
      ASSERT_EQ(ts_comm_recv(g.pp_group, &from_next, 1, TS_FP32, g.stage + 1, 2), TS_OK);
    if (g.stage > 0)
      ASSERT_EQ(ts_comm_send(g.pp_group, &me, 1, TS_FP32, g.stage - 1, 2), TS_OK);
    if (g.stage > 0) EXPECT_EQ(from_prev, (float)(rank - dp));
    if (g.stage < P - 1) EXPECT_EQ(from_next, (float)(rank + dp));
    ts_grid_free(&g);
  }
  ts_comm_free(world);
}

TEST(Grid, StagesThatDoNotDivideTheWorldAreRefused) {
  ts_comm *world = nullptr;
  ASSERT_EQ(ts_comm_world(&world), TS_OK) << ts_last_error();
  int N = ts_comm_size(world);
  ts_grid g;
  EXPECT_EQ(ts_grid_make(world, N + 1, &g), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(ts_last_error()), "`pipeline_stages` " + std::to_string(N + 1) +
                                              ": expected a number of stages dividing the " +
                                              std::to_string(N) + (N == 1 ? " rank" : " ranks"));
  EXPECT_EQ(g.dp_group, nullptr);
  EXPECT_EQ(ts_grid_make(world, 0, &g), TS_ERR_INVALID_ARGUMENT);
  ts_comm_free(world);
}

}  // namespace

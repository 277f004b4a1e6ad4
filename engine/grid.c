/*
 * grid.c — the P x dp process grid (grid.h).
 */
#include "engine/grid.h"

#include <string.h>

ts_status ts_grid_make(ts_comm *world, int stages, ts_grid *out) {
  memset(out, 0, sizeof *out);
  int N = ts_comm_size(world), rank = ts_comm_rank(world);
  if (stages < 1 || N % stages != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_stages` %d: expected a number of stages dividing the %d rank%s",
                        stages, N, N == 1 ? "" : "s");
  int dp = N / stages, stage = rank / dp, dp_rank = rank % dp;
  ts_grid g = {stages, dp, stage, dp_rank, NULL, NULL};
  ts_status st = ts_comm_split(world, stage, dp_rank, "dp", &g.dp_group);
  /* every rank makes both splits, whatever happened to its first */
  ts_status st2 = ts_comm_split(world, dp_rank, stage, "pp", &g.pp_group);
  if (st == TS_OK) st = st2;
  if (st != TS_OK) {
    ts_grid_free(&g);
    return st;
  }
  *out = g;
  return TS_OK;
}

void ts_grid_free(ts_grid *g) {
  ts_comm_free(g->dp_group);
  ts_comm_free(g->pp_group);
  memset(g, 0, sizeof *g);
}

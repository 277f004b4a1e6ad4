/*
 * grid.h — the process grid of pipeline parallelism (DESIGN.md "Pipeline
 * stages"): world = P pipeline stages x dp data-parallel ranks, the
 * data-parallel ranks of a stage adjacent, rank = stage * dp + dp_rank (so
 * gradient reductions stay on a node), with one communicator for each
 * stage's data-parallel group and one for each dp rank's pipeline (its P
 * stages in order, where activations and their gradients travel).
 */
#ifndef TS_ENGINE_GRID_H
#define TS_ENGINE_GRID_H

#include "base/base.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_grid {
  int stages;      /* P >= 1 */
  int dp;          /* data-parallel ranks per stage: world / P */
  int stage;       /* this rank's pipeline stage, 0 .. P-1 */
  int dp_rank;     /* this rank in its stage's data-parallel group, 0 .. dp-1 */
  ts_comm *dp_group; /* the dp ranks of this stage, ordered by dp_rank (owned) */
  ts_comm *pp_group; /* the P stages of this dp_rank, ordered by stage (owned):
                        rank s of it is stage s */
} ts_grid;

/* Collective over world: cuts it into P stages (ts_comm_split, named "dp"
 * and "pp"). TS_ERR_INVALID_ARGUMENT, the same on every rank before any
 * communication, when P < 1 or P does not divide the world size; TS_ERR_MPI,
 * TS_ERR_OUT_OF_MEMORY. *out is zeroed on error. */
ts_status ts_grid_make(ts_comm *world, int stages, ts_grid *out);
/* Frees the two groups; a zeroed grid is a no-op. */
void ts_grid_free(ts_grid *g);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_GRID_H */

/*
 * params.h — private to engine/: params.c: the full parameters of a unit (stage 3
 * gathers them).
 */
#ifndef TS_ENGINE_PARAMS_H
#define TS_ENGINE_PARAMS_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The full parameters (P) of unit u for a forward or backward: gathered on
 * first use when sharded. Pair with ts_engine_release_params. */
ts_status ts_engine_acquire_params(ts_engine *e, int u, const void **full);
void ts_engine_release_params(ts_engine *e, int u);
/* opts.overlap, sharded parameters: takes a use of unit u (and of the unit
 * it borrows from, tied embeddings) ahead of its next acquire, starting
 * the all-gather unless the unit is gathered already; no-op when a use is
 * taken already or u is not this stage's. Prefetch depth 1: the passes
 * take unit u+1's (backward: u-1's) before computing u. */
ts_status ts_engine_prefetch(ts_engine *e, int u);
/* opts.keep_gathered (sharded parameters, a training micro-batch): the
 * step's first forward of unit u holds its gathered parameters once more,
 * until the unit's backward in the last micro-batch (ts_engine_drop_kept). */
void ts_engine_keep_gathered(ts_engine *e, int u);
/* Releases the step's hold of unit u's gathered parameters, if any. */
void ts_engine_drop_kept(ts_engine *e, int u);
/* Releases every hold opts.keep_gathered still has on gathered parameters
 * (each is dropped at its unit's last backward; REDUCE makes sure before
 * the shards change). */
void ts_engine_drop_gathered(ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_PARAMS_H */

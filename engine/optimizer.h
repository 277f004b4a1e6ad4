/*
 * optimizer.h — private to engine/: optimizer.c: the OPTIMIZER action.
 */
#ifndef TS_ENGINE_OPTIMIZER_H
#define TS_ENGINE_OPTIMIZER_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* OPTIMIZER, after REDUCE (engine.h ts_engine_step: the skip, clipping,
 * AdamW and the loss scaler's rules): from e->sc.reduced, a non-finite norm
 * (or loss, without loss scaling) skips the step on every rank, naming
 * where the overflow began (the whole skip, here); else the clip factor,
 * AdamW's t, and the update's span begun. Fills *stats' loss and step (a
 * skip: all of it but the traffic). Errors: TS_ERR_NUMERIC (overflow at
 * the minimum scale), TS_ERR_MPI. */
ts_status ts_engine_optimizer_action(ts_engine *e, float lr, ts_step_stats *stats);
/* OPTIMIZER_UNIT of unit u: on a clean step, the unit's AdamW with learning
 * rate lr on this rank's part and the all-gather of its update (stages
 * 1-2); nothing on a skipped step or after a unit's error (kept for
 * OPTIMIZER_END). Returns TS_OK. */
ts_status ts_engine_optimizer_unit_action(ts_engine *e, int u, float lr);
/* OPTIMIZER_END: on a clean step, the units' all-gathers ended, the tied
 * head's replica updated, gradients zeroed, the loss scaler told, *stats's
 * norm, lr, step and next scale; the first error of the update's actions.
 * Nothing on a skipped step. */
ts_status ts_engine_optimizer_end_action(ts_engine *e, float lr, ts_step_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OPTIMIZER_H */

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
 * AdamW and the loss scaler's rules): from e->reduced, a non-finite norm
 * (or loss, without loss scaling) skips the step on every rank, naming
 * where the overflow began; else clip, AdamW with learning rate lr on this
 * rank's part, all-gather of the updated parameters (stages 1-2), the tied
 * head's replica updated; gradients zeroed. Fills *stats but for the
 * traffic. Errors: TS_ERR_NUMERIC (overflow at the minimum scale),
 * TS_ERR_MPI. */
ts_status ts_engine_optimizer_action(ts_engine *e, float lr, ts_step_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OPTIMIZER_H */

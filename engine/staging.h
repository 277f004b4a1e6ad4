/*
 * staging.h — private to engine/: checkpoint.c's part in the step: an asynchronous
 * save's staging, which the step waits for before the state changes.
 */
#ifndef TS_ENGINE_STAGING_H
#define TS_ENGINE_STAGING_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes of an asynchronous save's staging: the largest checkpoint
 * file of this rank's pipeline stage (dp rank 0's: every kind of every unit
 * of the stage, its part; another dp rank's is at most that), so that
 * every rank and the plan charge the same. TS_ERR_OUT_OF_MEMORY. */
ts_status ts_checkpoint_staging_bytes(const ts_engine *e, size_t *bytes);

/* Called before anything changes the state a checkpoint holds (the
 * optimizer step, a tensor or moment set, a load): waits until the
 * asynchronous save in flight has copied it to the staging (on the CPU its
 * writer thread copies while the next step's forward and backward run),
 * adding the wait to e->ckpt.staging_wait. None in flight: returns at once. */
void ts_engine_wait_staging(ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_STAGING_H */

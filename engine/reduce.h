/*
 * reduce.h — private to engine/: reduce.c: the gradients' buffers, REDUCE_UNIT and
 * REDUCE.
 */
#ifndef TS_ENGINE_REDUCE_H
#define TS_ENGINE_REDUCE_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The full gradient (P) that unit u's backward accumulates into: the
 * unit's own buffer, or a zeroed transient one when gradients are sharded. */
ts_status ts_engine_full_grads(ts_engine *e, int u, void **out);
/* Before unit u's backward: ends its own reduce-scatter still in flight
 * (its full gradient is free again); a no-op otherwise. */
ts_status ts_engine_reduce_pending(ts_engine *e, int u);
/* Whether a unit's gradient is reduced as its backward of micro-batch mb
 * ends (a REDUCE_UNIT action follows its BACKWARD_UNIT): stages 2/3 every
 * micro-batch; stages 0/1 with overlap in the last one (their bucket);
 * else REDUCE reduces it once per step. */
int ts_engine_unit_reduce_due(const ts_engine *e, int mb);
/* REDUCE_UNIT of unit u (micro-batch e->run.mb): stages 2/3 reduce-scatter
 * its full gradient into the shard (adding after the first micro-batch),
 * stages 0/1 its whole gradient in place; after the one in flight ends.
 * With overlap it runs beside the next unit's backward; without, it ends
 * here. */
ts_status ts_engine_reduce_unit_action(ts_engine *e, int u);
/* Waits for the gradient reductions still in flight: the last
 * reduce-scatter, so that every gradient shard (this rank's part) is
 * final, and with gathers != 0 stage 0's all-gathers of the reduced
 * gradients too (else the optimizer waits for unit u's just before its
 * AdamW; the norm needs the shards alone). */
ts_status ts_engine_finish_reductions(ts_engine *e, int gathers);
/* Zeroes every gradient buffer this rank holds (the shard when sharded). */
ts_status ts_engine_zero_grads(ts_engine *e);
/* REDUCE, after the last micro-batch's backward: every pipeline send done,
 * an asynchronous save's copy of the state waited for, kept gathers
 * dropped, stages 0/1's reductions without overlap, every reduction ended,
 * hybrid sharding's sum over the replicas (blocking, rank order), then
 * each unit's squared norm, the step's one read of the device, and the
 * sums over the pipeline, dp and replica groups into e->sc.reduced. Errors:
 * the collectives', the device's. */
ts_status ts_engine_reduce_action(ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_REDUCE_H */

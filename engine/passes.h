/*
 * passes.h — private to engine/: passes.c: the FORWARD, BACKWARD_UNIT and BACKWARD
 * actions, the batch load and the forward of a slot (evaluation too).
 */
#ifndef TS_ENGINE_PASSES_H
#define TS_ENGINE_PASSES_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FORWARD of micro-batch mb on this stage: its host arrays filled by batch
 * (the slot's own on the CPU, the engine's host batch beside a device),
 * loaded into its slot once the slot's previous sends left, its loss
 * gradient's scale set, forward over the stage's units; the last stage's
 * loss pair into e->sc.loss[mb]. backward_next: the next action is this
 * micro-batch's BACKWARD (the last unit stays gathered for it). With v
 * model chunks, FORWARD of chunk c over its units (slot (mb, c)); each
 * chunk loads the batch. Errors: batch's, the load's, the units'. */
ts_status ts_engine_forward_action(ts_engine *e, int mb, int c, int backward_next,
                                   ts_engine_batch_fn batch, void *user);
/* BACKWARD_UNIT of unit u in micro-batch mb: the unit's backward, its
 * parameters gathered (and the next unit's prefetched), its gradient
 * accumulated; the chunk's first one (its last unit) waits for the slot's
 * sends and takes the gradient of the chunk's output (dbuf[1], received,
 * unless the chunk ends the model). The units' input gradients ping-pong
 * through dbuf (e->bw). */
ts_status ts_engine_backward_unit_action(ts_engine *e, int mb, int u);
/* WEIGHT_UNIT of unit u in micro-batch mb (a split backward, ZB-H1): the
 * W its B left in the slot's store, run into the unit's full gradient
 * (stages 2/3: the transient a REDUCE_UNIT then reduces; the tied head's
 * fold first, for the lender's last micro-batch), then the test seam. */
ts_status ts_engine_weight_unit_action(ts_engine *e, int mb, int u);
/* WEIGHT of micro-batch mb on chunk c, after its units': the tied head's
 * gradient sent after the head's last W (ts_engine_backward_action's,
 * with a split backward). */
ts_status ts_engine_weight_action(ts_engine *e, int mb, int c);
/* BACKWARD of micro-batch mb on chunk c, after its units': the last
 * stage's replica sends the tied head's gradient after the head's chunk's
 * backward of the step's last micro-batch. */
ts_status ts_engine_backward_action(ts_engine *e, int mb, int c);

/* The one batch load: a micro-batch's (B, T) host inputs and targets
 * checked on the host (ts_k_check_indices), then into slot sl on the
 * device, and in *count the targets that are not -100. On the CPU nothing
 * moves when the caller filled the slot's own buffers. Beside a device the
 * batch goes through the page-locked staging by one asynchronous copy
 * each: the only wait is for the previous micro-batch's copies to have
 * left the staging, long done by now. Errors: the host check's, the
 * copies'. */
ts_status ts_engine_load_batch(ts_engine *e, act_slot *sl, const int32_t *inputs,
                               const int32_t *targets, size_t *count);
/* Forward of micro-batch slot sl over its chunk's units (its inputs and
 * dloss already in place); a last stage writes the loss pair (2) to loss
 * (fused: with the loss gradient, for a backward). */
ts_status ts_engine_forward_slot(ts_engine *e, act_slot *sl, double *loss, int fused);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_PASSES_H */

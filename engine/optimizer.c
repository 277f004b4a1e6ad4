/* optimizer.c — the update, as the executor's OPTIMIZER, OPTIMIZER_UNIT
 * (one per unit of the stage) and OPTIMIZER_END actions, after REDUCE
 * (reduce.c) has summed the global norm and the loss. OPTIMIZER: the
 * overflow decision (a non-finite norm, or without loss scaling a
 * non-finite loss) and the whole skip, else the clip factor and AdamW's
 * t; OPTIMIZER_UNIT: a unit's AdamW on this rank's part (offloaded: piece
 * by piece, each read in, the next one's read started, its own written
 * back behind) and the all-gather of its update; OPTIMIZER_END: the all-gathers ended, the tied head's
 * replica, gradients zeroed, the loss scaler told. Calls nothing of the
 * executor. */
#include <math.h>
#include <stdio.h>

#include "engine/observe.h"
#include "engine/offload.h"
#include "engine/optimizer.h"
#include "engine/pipeline_internal.h"
#include "engine/reduce.h"
#include "engine/slices.h"
#include "engine/state.h"
#include "shard/collect.h"

/* A non-finite gradient (fp16 overflow, or in fp32/bf16 a diverging run)
 * or, without loss scaling, a non-finite loss: the step is skipped
 * (gradients dropped, parameters and moments untouched) and, in fp16, the
 * loss scaler told, which halves a dynamic scale or stops at its minimum.
 * bad_norm: the gradients hold the non-finite values (the search names
 * the tensor); else the loss alone does ("loss"). */
static ts_status skip_step(ts_engine *e, ts_step_stats *stats, int bad_norm) {
  int u = -1, i = 0;
  TS_CHECK(ts_engine_finish_reductions(e, 1)); /* stage 0's whole gradients again */
  if (bad_norm) TS_CHECK(ts_engine_find_overflow(e, &u, &i));
  TS_CHECK(ts_engine_zero_grads(e));
  const char *name = u >= 0 ? e->model->units[u].tensors[i].name : "loss";
  stats->skipped = 1;
  stats->overflow_unit = u;
  snprintf(stats->overflow_tensor, sizeof stats->overflow_tensor, "%s", name);
  e->optim.attempts++;
  if (e->optim.scaler.enabled) TS_CHECK(ts_loss_scaler_overflow(&e->optim.scaler, e->optim.attempts, name, u));
  stats->next_loss_scale = e->optim.scaler.scale;
  return TS_OK;
}

/* OPTIMIZER_UNIT of unit u on a clean step: its reduced gradient
 * gathered (stage 0: the norm needed its part only), AdamW on this rank's
 * part, the all-gather of its update started (stages 1-2; with overlap
 * beside the next unit's AdamW, waited for by OPTIMIZER_END). After an
 * error of an earlier unit it does nothing; OPTIMIZER_END returns it. */
ts_status ts_engine_optimizer_unit_action(ts_engine *e, int u, float lr) {
  if (e->update.skipped || e->update.st != TS_OK) return TS_OK;
  unit_state *s = &e->units[u];
  ts_status st = ts_engine_comm_wait(e, &s->reduce_ag_req, TS_SPAN_ALL_GATHER, u);
  ts_engine_span_begin(e, TS_SPAN_OPTIMIZER, u); /* the unit's AdamW, inside the update's */
  if (st == TS_OK && e->offload) { /* piece by piece, the next one read behind each */
    int pieces = ts_offload_pieces(e, u);
    for (int p = 0; p < pieces && st == TS_OK; p++) {
      float *at[3];
      st = ts_offload_acquire(e, u, p, at);
      if (p + 1 < pieces) ts_offload_prefetch(e, u, p + 1);
      else ts_offload_prefetch(e, ts_engine_next_unit(e, u), 0);
      if (st != TS_OK) break;
      size_t lo = ts_offload_piece_first(e, p), hi = ts_offload_piece_first(e, p + 1);
      st = ts_engine_adamw_part(e, u, lr, e->update.scale, lo, hi, at);
      ts_status w = ts_offload_release(e, u, p, st == TS_OK); /* written back behind the next */
      if (st == TS_OK) st = w;
    }
  } else if (st == TS_OK) {
    st = ts_engine_adamw_unit(e, u, lr, e->update.scale);
  }
  ts_engine_span_end(e, TS_SPAN_OPTIMIZER, u);
  if (st == TS_OK && e->zero->gather_after_update) {
    ts_engine_comm_note(e, u);
    st = ts_shard_iall_gather(e->dp, &s->layout,
                              (char *)s->params + ts_engine_shard_begin(e, u) * e->es, s->params,
                              e->opts.dtype, &s->gather_req);
    if (st == TS_OK && !e->opts.overlap)
      st = ts_engine_comm_wait(e, &s->gather_req, TS_SPAN_ALL_GATHER, u);
  }
  e->update.st = st;
  return TS_OK;
}

ts_status ts_engine_optimizer_end_action(ts_engine *e, float lr, ts_step_stats *stats) {
  if (e->update.skipped) return TS_OK;
  ts_status st = e->update.st;
  TS_ENGINE_FOR_UNITS(e, u) {
    ts_status w = ts_engine_comm_wait(e, &e->units[u].gather_req, TS_SPAN_ALL_GATHER, u);
    if (st == TS_OK) st = w;
  }
  ts_engine_span_end(e, TS_SPAN_OPTIMIZER, -1);
  TS_CHECK(st);
  TS_CHECK(ts_engine_sync_replica(e));
  TS_CHECK(ts_engine_zero_grads(e));
  e->optim.attempts++;
  ts_loss_scaler_clean(&e->optim.scaler, e->optim.attempts);
  stats->grad_norm = e->update.norm;
  stats->lr = lr;
  stats->step = e->optim.step;
  stats->next_loss_scale = e->optim.scaler.scale;
  return TS_OK;
}

ts_status ts_engine_optimizer_action(ts_engine *e, float lr, ts_step_stats *stats) {
  (void)lr; /* the units' actions apply it */
  const double *sums = e->sc.reduced; /* REDUCE's: the loss sum, the sum of squares */
  stats->loss = sums[0] / ((double)e->opts.grad_accum * (double)e->dp_size * (double)e->replicas);
  stats->step = e->optim.step;
  int bad_norm = !isfinite(sums[1]), bad_loss = !isfinite(sums[0]) && !e->optim.scaler.enabled;
  e->update.skipped = bad_norm || bad_loss;
  e->update.st = TS_OK;
  if (e->update.skipped) { /* agreed: both sums are the same on every rank of the grid */
    stats->grad_norm = sums[1];
    return skip_step(e, stats, bad_norm);
  }
  /* a clean step: the clip and unscale factor of every unit's AdamW */
  float loss_scale = e->optim.scaler.scale;
  double norm = sqrt(sums[1]) / (double)loss_scale;
  float scale = 1.0f;
  if (e->opts.grad_clip > 0 && norm > e->opts.grad_clip)
    scale = (float)(e->opts.grad_clip / (norm + 1e-6)); /* torch clip_grad_norm_ */
  e->update.scale = scale / loss_scale; /* unscale: exact for a power of two */
  e->update.norm = norm;
  e->optim.step++;
  if (e->offload) ts_offload_prefetch(e, ts_engine_first_unit(e), 0); /* the first piece */
  ts_engine_span_begin(e, TS_SPAN_OPTIMIZER, -1); /* ended by OPTIMIZER_END */
  return TS_OK;
}

/* optimizer.c — the step's OPTIMIZER action, after REDUCE (reduce.c) has
 * summed the global norm and the loss: the overflow decision (a
 * non-finite norm, or without loss scaling a non-finite loss) and skip,
 * else clipping, AdamW on this rank's part, the stage's all-gather of the
 * updated parameters and the tied head's replica; gradients zeroed, the
 * loss scaler told. Calls nothing of the executor. */
#include <math.h>
#include <stdio.h>

#include "engine/observe.h"
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
  e->attempts++;
  if (e->scaler.enabled) TS_CHECK(ts_loss_scaler_overflow(&e->scaler, e->attempts, name, u));
  stats->next_loss_scale = e->scaler.scale;
  return TS_OK;
}

/* A clean step: clip, AdamW on this rank's part, the stage's all-gather of
 * the updated parameters, gradients zeroed, the scaler told. */
static ts_status apply_step(ts_engine *e, float lr, double sumsq, ts_step_stats *stats) {
  float loss_scale = e->scaler.scale;
  double norm = sqrt(sumsq) / (double)loss_scale;
  float scale = 1.0f;
  if (e->opts.grad_clip > 0 && norm > e->opts.grad_clip)
    scale = (float)(e->opts.grad_clip / (norm + 1e-6)); /* torch clip_grad_norm_ */
  scale /= loss_scale; /* unscale: exact for a power of two */
  e->step++;
  ts_engine_span_begin(e, TS_SPAN_OPTIMIZER, -1);
  ts_status st = TS_OK;
  for (int u = e->u_begin; u < e->u_end && st == TS_OK; u++) {
    unit_state *s = &e->units[u];
    /* stage 0: the unit's reduced gradient gathered (the norm needed its part) */
    st = ts_engine_comm_wait(e, &s->reduce_ag_req, TS_SPAN_ALL_GATHER, u);
    ts_engine_span_begin(e, TS_SPAN_OPTIMIZER, u); /* the unit's AdamW, inside the update's */
    if (st == TS_OK) st = ts_engine_adamw_unit(e, u, lr, scale);
    ts_engine_span_end(e, TS_SPAN_OPTIMIZER, u);
    if (st == TS_OK && e->zero->gather_after_update) {
      /* with overlap beside the next unit's AdamW, waited for below */
      ts_engine_comm_note(e, u);
      st = ts_shard_iall_gather(e->dp, &s->layout,
                                (char *)s->params + ts_engine_shard_begin(e, u) * e->es, s->params,
                                e->opts.dtype, &s->gather_req);
      if (st == TS_OK && !e->opts.overlap)
        st = ts_engine_comm_wait(e, &s->gather_req, TS_SPAN_ALL_GATHER, u);
    }
  }
  for (int u = e->u_begin; u < e->u_end; u++) {
    ts_status w = ts_engine_comm_wait(e, &e->units[u].gather_req, TS_SPAN_ALL_GATHER, u);
    if (st == TS_OK) st = w;
  }
  ts_engine_span_end(e, TS_SPAN_OPTIMIZER, -1);
  TS_CHECK(st);
  TS_CHECK(ts_engine_sync_replica(e));
  TS_CHECK(ts_engine_zero_grads(e));
  e->attempts++;
  ts_loss_scaler_clean(&e->scaler, e->attempts);
  stats->grad_norm = norm;
  stats->lr = lr;
  stats->step = e->step;
  stats->next_loss_scale = e->scaler.scale;
  return TS_OK;
}

ts_status ts_engine_optimizer_action(ts_engine *e, float lr, ts_step_stats *stats) {
  const double *sums = e->reduced; /* REDUCE's: the loss sum, the sum of squares */
  stats->loss = sums[0] / ((double)e->opts.grad_accum * (double)e->dp_size * (double)e->replicas);
  stats->step = e->step;
  int bad_norm = !isfinite(sums[1]), bad_loss = !isfinite(sums[0]) && !e->scaler.enabled;
  if (bad_norm || bad_loss) { /* agreed: both sums are the same on every rank of the grid */
    stats->grad_norm = sums[1];
    return skip_step(e, stats, bad_norm);
  }
  return apply_step(e, lr, sums[1], stats);
}

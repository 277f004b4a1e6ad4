/* optimizer.c — the optimizer step (engine.h ts_engine_optimizer_step):
 * the stage's gradient reduction, the global norm summed per unit in model
 * order over the pipeline's stages and the dp group, the fp16 overflow
 * decision and skip, clipping, AdamW on this rank's part, the stage's
 * all-gather of updated parameters and the tied head's replica. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

/* The counters of the dp group plus the pipeline group and (hybrid) the
 * replica group. */
static ts_comm_counters counters_now(const ts_engine *e) {
  ts_comm_counters d = *ts_comm_get_counters(e->dp);
  ts_comm *more[2] = {e->pp, e->rep};
  for (int g = 0; g < 2; g++) {
    if (!more[g]) continue;
    const ts_comm_counters *p = ts_comm_get_counters(more[g]);
    for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
      d.bytes[k] += p->bytes[k];
      d.calls[k] += p->calls[k];
      d.remote[k] += p->remote[k];
    }
  }
  return d;
}

void ts_engine_step_begin(ts_engine *e) { e->step_start = counters_now(e); }

/* Counter differences now - since. */
static ts_comm_counters counters_since(const ts_engine *e, const ts_comm_counters *since) {
  ts_comm_counters d = counters_now(e);
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
    d.bytes[k] -= since->bytes[k];
    d.calls[k] -= since->calls[k];
    d.remote[k] -= since->remote[k];
  }
  return d;
}

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
    if (st == TS_OK) st = ts_engine_adamw_unit(e, u, lr, scale);
    ts_engine_sim_op(e, TS_SPAN_OPTIMIZER, u);
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
  ts_engine_span_end(e);
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

ts_status ts_engine_optimizer_step(ts_engine *e, float lr, ts_step_stats *stats) {
  if ((size_t)e->micro_done != e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: optimizer step after %d micro-steps: expected grad_accum = %zu",
                        e->micro_done, e->opts.grad_accum);
  const ts_model *m = e->model;
  ts_engine_wait_staging(e); /* an asynchronous save's copy of the state first */
  ts_engine_drop_gathered(e); /* no gathered copy outlives the shards it came from */
  memset(stats, 0, sizeof *stats);
  stats->overflow_unit = -1;
  stats->loss_scale = stats->next_loss_scale = e->scaler.scale;
  TS_CHECK(ts_engine_reduce_buckets(e));       /* stages 0/1 without overlap */
  TS_CHECK(ts_engine_finish_reductions(e, 0)); /* every gradient shard final */
  TS_CHECK(ts_engine_reduce_replicas(e));      /* hybrid: summed over the shard's replicas */
  for (int u = e->u_begin; u < e->u_end; u++)
    TS_CHECK(ts_k_sumsq(&e->ctx, e->sumsq + u, ts_engine_grad_shard(e, u),
                        e->units[u].layout.shard, e->opts.dtype));
  /* The step's one read of the device: the micro-batches' losses and the
   * units' squared norms, one block. */
  size_t K = e->opts.grad_accum, U = (size_t)m->n_units;
  const double *h = e->h_scalars;
  TS_CHECK(ts_k_to_host(&e->ctx, e->h_scalars, e->scalars, (2 * K + U) * sizeof(double)));
  /* part[0]: this rank's sum of micro-batch mean losses (the stage with
   * the loss), part[1 + u]: the squared norm of its shard of unit u (the
   * stage computing u, else 0). A pipeline gathers them by a sum over its
   * stages (each entry is non-zero on one stage alone: exact), so the
   * norm below is summed per unit in model order whatever the layout. */
  double *part = e->h_part;
  part[0] = 0.0;
  if (ts_engine_owns(e, m->n_units - 1))
    for (size_t k = 0; k < K; k++) part[0] += ts_engine_mean_loss(h + 2 * k);
  for (size_t u = 0; u < U; u++) part[1 + u] = ts_engine_owns(e, (int)u) ? h[2 * K + u] : 0.0;
  ts_engine_comm_note(e, -1); /* the step's sums: no unit */
  if (e->pp) TS_CHECK(ts_comm_all_reduce_f64(e->pp, part, U + 1, TS_COMM_SUM));
  /* [0]: the loss sum, [1]: the sum of squares of the gradient shards, per
   * unit in model order (not finite on any rank: overflow, agreed by this
   * one all-reduce over the dp group; the pipeline's sum came first). */
  double sums[2] = {part[0], 0.0};
  for (size_t u = 0; u < U; u++) sums[1] += part[1 + u];
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, sums, 2, TS_COMM_SUM));
  /* hybrid: the loss over every shard group (the shards' squares are the
   * same on every replica: the norm is the group's) */
  if (e->rep) TS_CHECK(ts_comm_all_reduce_f64(e->rep, sums, 1, TS_COMM_SUM));
  stats->loss = sums[0] / ((double)e->opts.grad_accum * (double)e->dp_size * (double)e->replicas);
  stats->step = e->step;
  ts_status st;
  int bad_norm = !isfinite(sums[1]), bad_loss = !isfinite(sums[0]) && !e->scaler.enabled;
  if (bad_norm || bad_loss) { /* agreed: both sums are the same on every rank of the grid */
    stats->grad_norm = sums[1];
    st = skip_step(e, stats, bad_norm);
  } else {
    st = apply_step(e, lr, sums[1], stats);
  }
  stats->comm = counters_since(e, &e->step_start);
  stats->comm_bytes = stats->comm_remote_bytes = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
    stats->comm_bytes += stats->comm.bytes[k];
    stats->comm_remote_bytes += stats->comm.remote[k];
  }
  e->micro_done = 0;
  return st;
}


/*
 * reduce.c — the gradients' buffers and their reductions (DESIGN.md "One
 * step"), and the step's REDUCE action.
 *
 * Within the backward (passes.c asks): a unit's full gradient (its own
 * buffer, or a transient when the ZeRO stage shards gradients). The
 * REDUCE_UNIT action after a unit's backward: its reduce-scatter (stages
 * 2/3 every micro-batch; stages 0/1 with overlap once, in the last
 * micro-batch: DDP's bucket, a unit). Every collective is started, then waited for where its result is
 * needed (ts_engine_comm_wait): with opts.overlap that is as late as the
 * step allows, without it at once; one reduce-scatter is in flight at a
 * time (the transport shares one scratch).
 *
 * The REDUCE action (after the last backward): every send of the step
 * done, stages 0/1's reductions without overlap, every reduction ended,
 * hybrid sharding's sum over the replicas, then the global norm's parts:
 * each unit's squared norm on the device, the step's one read of it
 * (losses and norms, one block), the sums over the pipeline's stages and
 * the dp group (per unit in model order, whatever the layout) into
 * e->sc.reduced for the OPTIMIZER action. Calls nothing of the executor.
 */
#include "engine/observe.h"
#include "engine/params.h"
#include "engine/pipeline_internal.h"
#include "engine/reduce.h"
#include "engine/slices.h"
#include "engine/staging.h"
#include "engine/state.h"
#include "shard/collect.h"

ts_status ts_engine_full_grads(ts_engine *e, int u, void **out) {
  unit_state *s = &e->units[u];
  if (!e->zero->shard_grads) {
    *out = s->grads;
    return TS_OK;
  }
  if (!s->full_grads) {
    size_t bytes = s->layout.padded * e->es;
    TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_GRADS, bytes,
                                       &s->full_grads));
    /* a device's transients come back unzeroed (ledger.h); the CPU's are new */
    if (e->device != TS_DEVICE_CPU) TS_CHECK(ts_k_zero(&e->ctx, s->full_grads, bytes));
  }
  *out = s->full_grads;
  return TS_OK;
}

/* Waits for unit u's reduce-scatter in flight (stages 2/3: then frees its
 * full gradient; stage 0: then starts the all-gather of the reduced part,
 * reduce_ag_req, waited for before the unit's AdamW). */
static ts_status finish_reduce(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->rs_pending == u) e->rs_pending = -1;
  ts_status st = ts_engine_comm_wait(e, &s->reduce_req, TS_SPAN_REDUCE_SCATTER, u);
  if (e->zero->shard_grads) {
    ts_shard_release(&e->ledger, &s->full_grads);
  } else if (st == TS_OK && e->zero->gather_grads && !e->rep) { /* hybrid: after the replicas' */
    ts_engine_comm_note(e, u);
    st = ts_shard_iall_gather(e->dp, &s->layout, ts_engine_grad_shard(e, u), s->grads,
                              e->opts.dtype, &s->reduce_ag_req);
  }
  return st;
}

/* Starts unit u's reduce-scatter (rs_pending), after the one in flight:
 * stages 2/3 its full gradient into the shard, adding to it after the
 * first micro-batch; stages 0/1 its whole gradient in place into this
 * rank's slice. */
static ts_status start_reduce(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->rs_pending >= 0) TS_CHECK(finish_reduce(e, e->rs_pending));
  ts_engine_comm_note(e, u);
  if (e->zero->shard_grads) {
    TS_CHECK(ts_shard_ireduce_scatter(e->dp, &s->layout, s->full_grads, s->grads, e->opts.dtype,
                                      e->run.mb > 0, e->scratch, e->scratch_bytes, &s->reduce_req));
  } else {
    TS_CHECK(ts_shard_ireduce_scatter(e->dp, &s->layout, s->grads, ts_engine_grad_shard(e, u),
                                      e->opts.dtype, 0, e->scratch, e->scratch_bytes,
                                      &s->reduce_req));
  }
  e->rs_pending = u;
  return TS_OK;
}

ts_status ts_engine_reduce_pending(ts_engine *e, int u) {
  return e->rs_pending == u ? finish_reduce(e, u) : TS_OK;
}

int ts_engine_unit_reduce_due(const ts_engine *e, int mb) {
  if (e->zero->shard_grads) return 1;
  return e->zero->reduce_after_step && e->opts.overlap && (size_t)mb + 1 == e->opts.grad_accum;
}

ts_status ts_engine_reduce_unit_action(ts_engine *e, int u) {
  TS_CHECK(start_reduce(e, u));
  return e->opts.overlap ? TS_OK : finish_reduce(e, u);
}

/* Stages 0/1 without overlap: reduce-scatters every unit's whole gradient
 * in place into this rank's slice (stage 0 then all-gathers it); with
 * overlap the step's last backward started it. */
static ts_status reduce_buckets(ts_engine *e) {
  if (!e->zero->reduce_after_step || e->opts.overlap) return TS_OK; /* overlap: the backward did */
  TS_ENGINE_FOR_UNITS(e, u) {
    TS_CHECK(start_reduce(e, u));
    TS_CHECK(finish_reduce(e, u));
    TS_CHECK(ts_engine_comm_wait(e, &e->units[u].reduce_ag_req, TS_SPAN_ALL_GATHER, u));
  }
  return TS_OK;
}

/* Hybrid sharding (e->rep): each unit's reduced gradient shard summed
 * over the replica group (ts_comm_all_reduce, blocking: rank-order sums,
 * the same bits on every replica), once per step after every reduction
 * within the shard group ended; stage 0 then starts the all-gather of its
 * part (reduce_ag_req). A no-op without hybrid sharding. */
static ts_status reduce_replicas(ts_engine *e) {
  if (!e->rep) return TS_OK;
  TS_ENGINE_FOR_UNITS(e, u) {
    unit_state *s = &e->units[u];
    ts_engine_comm_note(e, u);
    void *shard = ts_engine_grad_shard(e, u);
    TS_CHECK(ts_comm_all_reduce(e->rep, shard, s->layout.shard, e->opts.dtype, e->scratch,
                                e->scratch_bytes));
    if (e->zero->gather_grads)
      TS_CHECK(ts_shard_iall_gather(e->dp, &s->layout, shard, s->grads, e->opts.dtype,
                                    &s->reduce_ag_req));
  }
  return TS_OK;
}

ts_status ts_engine_finish_reductions(ts_engine *e, int gathers) {
  if (e->rs_pending >= 0) TS_CHECK(finish_reduce(e, e->rs_pending));
  for (int u = gathers ? ts_engine_first_unit(e) : -1; u >= 0; u = ts_engine_next_unit(e, u))
    TS_CHECK(ts_engine_comm_wait(e, &e->units[u].reduce_ag_req, TS_SPAN_ALL_GATHER, u));
  return TS_OK;
}

ts_status ts_engine_zero_grads(ts_engine *e) {
  TS_ENGINE_FOR_UNITS(e, u) {
    unit_state *s = &e->units[u];
    size_t n = e->zero->shard_grads ? s->layout.shard : s->layout.padded;
    TS_CHECK(ts_k_zero(&e->ctx, s->grads, n * e->es));
  }
  return TS_OK;
}

/* The global norm's parts and the step's loss: each unit's squared norm
 * of its gradient shard, the step's one read of the device (the
 * micro-batches' losses and the norms, one block), summed over the
 * pipeline's stages, the dp group and (hybrid) the replicas. */
static ts_status step_sums(ts_engine *e) {
  const ts_model *m = e->model;
  TS_ENGINE_FOR_UNITS(e, u)
    TS_CHECK(ts_k_sumsq(&e->ctx, e->sc.sumsq + u, ts_engine_grad_shard(e, u),
                        e->units[u].layout.shard, e->opts.dtype));
  size_t K = e->opts.grad_accum, U = (size_t)m->n_units;
  const double *h = e->sc.host;
  TS_CHECK(ts_k_to_host(&e->ctx, e->sc.host, e->sc.block, (2 * K + U) * sizeof(double)));
  /* part[0]: this rank's sum of micro-batch mean losses (the stage with
   * the loss), part[1 + u]: the squared norm of its shard of unit u (the
   * stage computing u, else 0). A pipeline gathers them by a sum over its
   * stages (each entry is non-zero on one stage alone: exact), so the
   * norm below is summed per unit in model order whatever the layout. */
  double *part = e->sc.part;
  part[0] = 0.0;
  if (ts_engine_owns(e, m->n_units - 1))
    for (size_t k = 0; k < K; k++) part[0] += ts_engine_mean_loss(h + 2 * k);
  for (size_t u = 0; u < U; u++) part[1 + u] = ts_engine_owns(e, (int)u) ? h[2 * K + u] : 0.0;
  ts_engine_comm_note(e, -1); /* the step's sums: no unit */
  if (e->pipe.pp) TS_CHECK(ts_comm_all_reduce_f64(e->pipe.pp, part, U + 1, TS_COMM_SUM));
  /* [0]: the loss sum, [1]: the sum of squares of the gradient shards, per
   * unit in model order (not finite on any rank: overflow, agreed by this
   * one all-reduce over the dp group; the pipeline's sum came first). */
  double *sums = e->sc.reduced;
  sums[0] = part[0];
  sums[1] = 0.0;
  for (size_t u = 0; u < U; u++) sums[1] += part[1 + u];
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, sums, 2, TS_COMM_SUM));
  /* hybrid: the loss over every shard group (the shards' squares are the
   * same on every replica: the norm is the group's) */
  if (e->rep) TS_CHECK(ts_comm_all_reduce_f64(e->rep, sums, 1, TS_COMM_SUM));
  return TS_OK;
}

ts_status ts_engine_reduce_action(ts_engine *e) {
  TS_CHECK(ts_engine_wait_sends(e)); /* a pipeline's: nothing left reading a slot */
  ts_engine_wait_staging(e);  /* an asynchronous save's copy of the state first */
  ts_engine_drop_gathered(e); /* no gathered copy outlives the shards it came from */
  TS_CHECK(reduce_buckets(e));                 /* stages 0/1 without overlap */
  TS_CHECK(ts_engine_finish_reductions(e, 0)); /* every gradient shard final */
  TS_CHECK(reduce_replicas(e));                /* hybrid: summed over the shard's replicas */
  return step_sums(e);
}

/*
 * step.c — the step, for every run (DESIGN.md "One step"): a run without
 * pipelining is a one-stage 1F1B schedule, so one executor runs every
 * step's list of actions (schedule.h), top to bottom:
 *
 *   for each micro-batch:  its batch loaded (load_batch: the host's check,
 *     then the device), forward over this stage's units ([stage 3:
 *     all-gather] -> forward -> [release]), the loss, backward in reverse
 *     ([all-gather] -> [recompute] -> backward -> [stage 2/3:
 *     reduce-scatter into the shard; release]); on a pipeline, the
 *     activations and their gradients sent and received between;
 *   after the last micro-batch: the optimizer step (optimizer.c).
 *
 * ts_engine_micro_step runs one micro-batch's forward and backward (the
 * same functions) for callers that feed batches one at a time. The ZeRO
 * stage's rules come from zero.c's policy table; sends and receives are
 * pipeline.c's; the tied head's gradient is folded into its lender's here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

/* ---- gathers and reductions -------------------------------------------------- */

/* Every collective of the step is started, then waited for where its
 * result is needed (ts_engine_comm_wait): with opts.overlap that is as
 * late as the step allows, without it at once. */

/* Starts the all-gather of unit u's parameter shards into a new full
 * buffer (full_params, a transient; gather_req). On a plan ledger it is
 * charged and the plan group moves nothing. */
static ts_status start_gather(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_PARAMS, s->layout.padded * e->es,
                                     &s->full_params));
  ts_engine_comm_note(e, u);
  ts_status st = ts_shard_iall_gather(e->dp, &s->layout, s->params, s->full_params, e->opts.dtype,
                                      &s->gather_req);
  if (st != TS_OK) ts_shard_release(&e->ledger, &s->full_params);
  return st;
}

ts_status ts_engine_acquire_params(ts_engine *e, int u, const void **full) {
  unit_state *s = &e->units[u];
  if (!e->zero->shard_params) {
    *full = s->params;
    return TS_OK;
  }
  if (s->holds > 0) {
    s->holds--; /* a use taken ahead (prefetch): this is it */
  } else {
    if (s->uses == 0) TS_CHECK(start_gather(e, u));
    s->uses++;
  }
  TS_CHECK(ts_engine_comm_wait(e, &s->gather_req, TS_SPAN_ALL_GATHER, u));
  *full = s->full_params;
  return TS_OK;
}

/* opts.overlap, sharded parameters: takes a use of unit u (and of the unit
 * it borrows from, tied embeddings) ahead of its next acquire, starting
 * the all-gather unless the unit is gathered already; no-op when a use is
 * taken already or u is not this stage's. Prefetch depth 1: the step takes
 * unit u+1's (backward: u-1's) before computing u. */
static ts_status prefetch(ts_engine *e, int u) {
  if (!e->opts.overlap || !e->zero->shard_params || !ts_engine_owns(e, u)) return TS_OK;
  unit_state *s = &e->units[u];
  if (s->holds == 0) {
    if (s->uses == 0) TS_CHECK(start_gather(e, u));
    s->uses++;
    s->holds++;
  }
  int lender = e->model->units[u].tied_unit;
  return lender >= 0 && lender != u ? prefetch(e, lender) : TS_OK;
}

void ts_engine_release_params(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->zero->shard_params && s->uses > 0 && --s->uses == 0)
    ts_shard_release(&e->ledger, &s->full_params);
}

/* opts.keep_gathered (sharded parameters, a training micro-batch): the
 * step's first forward of unit u holds its gathered parameters once more,
 * until the unit's backward in the last micro-batch (drop_kept). */
static void keep_gathered(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->opts.keep_gathered && e->zero->shard_params && e->in_micro_step && !s->kept) {
    s->kept = 1;
    s->uses++;
  }
}

/* Releases the step's hold of unit u's gathered parameters, if any. */
static void drop_kept(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (!s->kept) return;
  s->kept = 0;
  ts_engine_release_params(e, u);
}

void ts_engine_drop_gathered(ts_engine *e) {
  for (int u = 0; u < e->model->n_units; u++) drop_kept(e, u);
}

/* The full gradient (P) that unit u's backward accumulates into: the
 * unit's own buffer, or a zeroed transient one when gradients are sharded. */
static ts_status full_grads(ts_engine *e, int u, void **out) {
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

/* Starts unit u's reduce-scatter (rs_pending), after the one in flight
 * (one at a time: the transport shares one scratch): stages 2/3 its full
 * gradient into the shard, adding to it after the first micro-batch;
 * stages 0/1 its whole gradient in place into this rank's slice (DDP's
 * bucket, a unit). */
static ts_status start_reduce(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->rs_pending >= 0) TS_CHECK(finish_reduce(e, e->rs_pending));
  ts_engine_comm_note(e, u);
  if (e->zero->shard_grads) {
    TS_CHECK(ts_shard_ireduce_scatter(e->dp, &s->layout, s->full_grads, s->grads, e->opts.dtype,
                                      e->cur_mb > 0, e->scratch, e->scratch_bytes, &s->reduce_req));
  } else {
    TS_CHECK(ts_shard_ireduce_scatter(e->dp, &s->layout, s->grads, ts_engine_grad_shard(e, u),
                                      e->opts.dtype, 0, e->scratch, e->scratch_bytes,
                                      &s->reduce_req));
  }
  e->rs_pending = u;
  return TS_OK;
}

/* After unit u's backward: stages 2/3 reduce-scatter its full gradient;
 * stages 0/1 with overlap their bucket once the unit's last backward of
 * the step is done (without overlap, ts_engine_reduce_buckets in the
 * optimizer step). With overlap the reduce-scatter runs beside the next
 * unit's backward; without, it ends here. */
static ts_status reduce_unit_grads(ts_engine *e, int u) {
  int bucket = !e->zero->shard_grads && e->zero->reduce_after_step && e->opts.overlap &&
               (size_t)e->cur_mb + 1 == e->opts.grad_accum;
  if (!e->zero->shard_grads && !bucket) return TS_OK;
  TS_CHECK(start_reduce(e, u));
  return e->opts.overlap ? TS_OK : finish_reduce(e, u);
}

ts_status ts_engine_reduce_buckets(ts_engine *e) {
  if (!e->zero->reduce_after_step || e->opts.overlap) return TS_OK; /* overlap: the backward did */
  for (int u = e->u_begin; u < e->u_end; u++) {
    TS_CHECK(start_reduce(e, u));
    TS_CHECK(finish_reduce(e, u));
    TS_CHECK(ts_engine_comm_wait(e, &e->units[u].reduce_ag_req, TS_SPAN_ALL_GATHER, u));
  }
  return TS_OK;
}

ts_status ts_engine_reduce_replicas(ts_engine *e) {
  if (!e->rep) return TS_OK;
  for (int u = e->u_begin; u < e->u_end; u++) {
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
  for (int u = e->u_begin; u < e->u_end && gathers; u++)
    TS_CHECK(ts_engine_comm_wait(e, &e->units[u].reduce_ag_req, TS_SPAN_ALL_GATHER, u));
  return TS_OK;
}

/* ---- tied embeddings ------------------------------------------------------------ */

/* Whether the tied head adds its gradient straight into the lender's
 * (full, zeroed) gradient: one micro-batch, both units here, gradients not
 * sharded. The bits are those of the fold below (zero + T = T). */
static int tied_direct(const ts_engine *e, int head) {
  int lender = e->model->units[head].tied_unit;
  return !e->zero->shard_grads && e->opts.grad_accum == 1 && ts_engine_owns(e, lender) &&
         ts_engine_owns(e, head);
}

/* The tied head's gradient of the borrowed tensor, summed over the step's
 * micro-batches in T = e->tied_grads (a zeroed transient from its first
 * backward), is added into the lender's gradient once per step, just
 * before the lender's backward of the last micro-batch: the lender's full
 * gradient becomes G + T (with sharded gradients, G is that micro-batch's
 * zeroed transient: T itself becomes it), then the lender's own backward
 * adds to it. On a pipeline, T comes from the last stage. */
static ts_status fold_tied(ts_engine *e, int lender) {
  unit_state *s = &e->units[lender];
  if (!e->tied_grads) TS_CHECK(ts_engine_recv_tied_grads(e));
  if (e->zero->shard_grads) {
    s->full_grads = e->tied_grads; /* same size and category: a transient either way */
    e->tied_grads = NULL;
    return TS_OK;
  }
  ts_status st =
      ts_k_add(&e->ctx, s->grads, s->grads, e->tied_grads, s->layout.padded, e->opts.dtype);
  ts_shard_release(&e->ledger, &e->tied_grads);
  return st;
}

/* The buffer a tied head's backward adds its borrowed tensor's gradient
 * to: the lender's own gradient (tied_direct), else T (allocated zeroed on
 * first use). *out: the lender's layout (P). */
static ts_status tied_grads(ts_engine *e, int head, void **out) {
  int lender = e->model->units[head].tied_unit;
  if (tied_direct(e, head)) {
    *out = e->units[lender].grads;
    return TS_OK;
  }
  if (!e->tied_grads) {
    size_t bytes = e->units[lender].layout.padded * e->es;
    TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_GRADS, bytes,
                                       &e->tied_grads));
    if (e->device != TS_DEVICE_CPU) TS_CHECK(ts_k_zero(&e->ctx, e->tied_grads, bytes));
  }
  *out = e->tied_grads;
  return TS_OK;
}

/* ---- forward and backward ------------------------------------------------------- */

/* Arguments common to every unit call of slot sl's micro-batch. */
static ts_unit_args base_args(const ts_engine *e, const act_slot *sl) {
  ts_unit_args a;
  memset(&a, 0, sizeof a);
  a.B = e->opts.micro_batch;
  a.T = e->opts.seq;
  a.dt = e->opts.dtype;
  a.tokens = sl->tokens;
  a.targets = sl->targets;
  a.dloss = sl->dloss;
  return a;
}

/* Points *at into the borrowed tensor of unit u's lender (tied
 * embeddings) inside that unit's full buffer `flat`. */
static void *borrowed(const ts_engine *e, int u, const void *flat) {
  const ts_unit *un = &e->model->units[u];
  const ts_tensor_spec *t = &e->model->units[un->tied_unit].tensors[un->tied_tensor];
  return (char *)flat + t->offset * e->es;
}

/* Forward of unit u with its parameters acquired (and the lender's). */
static ts_status forward_unit(ts_engine *e, int u, ts_unit_args *a) {
  const ts_unit *un = &e->model->units[u];
  const void *params, *lender = NULL;
  TS_CHECK(ts_engine_acquire_params(e, u, &params));
  keep_gathered(e, u);
  ts_status st = un->tied_unit >= 0 ? ts_engine_acquire_params(e, un->tied_unit, &lender) : TS_OK;
  if (st == TS_OK && lender) keep_gathered(e, un->tied_unit);
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_FORWARD, u);
    st = ts_unit_forward(e->model, u, &e->ctx, params, a);
    ts_engine_span_end(e);
    ts_engine_sim_op(e, TS_SPAN_FORWARD, u);
  }
  if (lender) ts_engine_release_params(e, un->tied_unit);
  ts_engine_release_params(e, u);
  return st;
}

ts_status ts_engine_forward_slot(ts_engine *e, act_slot *sl, double *loss, int fused) {
  int n = e->model->n_units;
  for (int u = e->u_begin; u < e->u_end; u++) {
    TS_CHECK(prefetch(e, u));
    if (u + 1 == e->u_end && e->hold_last && e->in_micro_step && e->units[u].holds > 0) {
      /* its backward comes next: one more use, for that acquire */
      e->units[u].uses++;
      e->units[u].holds++;
    }
    if (u + 1 < e->u_end) TS_CHECK(prefetch(e, u + 1));
    ts_unit_args a = base_args(e, sl);
    a.fused_loss_grad = fused && u == n - 1;
    a.x = u > 0 ? sl->acts[u] : NULL;
    a.y = u + 1 < n ? sl->acts[u + 1] : NULL;
    a.saved = e->units[u].recompute ? e->recompute_saved : sl->saved[u];
    a.loss = u == n - 1 ? loss : NULL;
    TS_CHECK(forward_unit(e, u, &a));
  }
  return TS_OK;
}

/* d(scaled step loss)/d(row loss) of a micro-batch with `count` targets:
 * the loss scale (1 unless fp16; exact: 2^k) over count N K (hybrid
 * sharding: N = S x replicas, every data-parallel rank). */
static float dloss_of(const ts_engine *e, size_t count) {
  double micro_batches = (double)e->opts.grad_accum * (double)e->dp_size * (double)e->replicas;
  return count ? (float)((double)e->scaler.scale / ((double)count * micro_batches)) : 0.0f;
}

/* The arithmetic of unit u's backward (with its recompute, and the test
 * seam), on acquired buffers. */
static ts_status backward_compute(ts_engine *e, int u, ts_unit_args *a, const void *params,
                                  void *grads, const void *lender) {
  ts_status st = TS_OK;
  if (e->units[u].recompute) {
    /* Recompute: the forward again, from the kept input, with the same
     * (when sharded: the same gathered) parameters. It rewrites the unit's
     * output (the next unit's kept input) with the same bits; that unit
     * is done with it. */
    ts_unit_args f = *a;
    f.tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_RECOMPUTE, u);
    st = ts_unit_forward(e->model, u, &e->ctx, params, &f);
    ts_engine_span_end(e);
    ts_engine_sim_op(e, TS_SPAN_RECOMPUTE, u);
  }
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_BACKWARD, u);
    st = ts_unit_backward(e->model, u, &e->ctx, params, grads, a);
    ts_engine_span_end(e);
    ts_engine_sim_op(e, TS_SPAN_BACKWARD, u);
  }
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (st == TS_OK && h && h->after_backward)
    st = h->after_backward(h->user, e, e->attempts + 1, u, grads);
  return st;
}

/* Backward of unit u: parameters acquired, gradients accumulated into the
 * full gradient (a tied head's borrowed one into tied_grads), then reduced
 * when sharded. */
static ts_status backward_unit(ts_engine *e, int u, ts_unit_args *a) {
  const ts_unit *un = &e->model->units[u];
  const void *params, *lender = NULL;
  void *grads, *lender_grads = NULL;
  if (e->rs_pending == u) TS_CHECK(finish_reduce(e, u)); /* its full gradient is free again */
  if (u == e->lender && (size_t)e->cur_mb + 1 == e->opts.grad_accum &&
      !tied_direct(e, e->model->n_units - 1))
    TS_CHECK(fold_tied(e, u));
  TS_CHECK(ts_engine_acquire_params(e, u, &params));
  ts_status st = full_grads(e, u, &grads);
  if (st == TS_OK && un->tied_unit >= 0) {
    st = ts_engine_acquire_params(e, un->tied_unit, &lender);
    if (st == TS_OK) st = tied_grads(e, u, &lender_grads);
    if (st == TS_OK) a->tied_grad = borrowed(e, u, lender_grads);
  }
  if (st == TS_OK) st = backward_compute(e, u, a, params, grads, lender);
  if (lender) ts_engine_release_params(e, un->tied_unit);
  ts_engine_release_params(e, u);
  if ((size_t)e->cur_mb + 1 == e->opts.grad_accum) { /* the unit's last backward of the step */
    drop_kept(e, u);
    if (lender && !ts_engine_owns(e, un->tied_unit)) drop_kept(e, un->tied_unit); /* a replica */
  }
  if (st == TS_OK) st = reduce_unit_grads(e, u);
  return st;
}

static ts_status backward_slot(ts_engine *e, act_slot *sl, const void *dy) {
  int n = e->model->n_units, cur = 0;
  const void *din = dy; /* the gradient of the current unit's output */
  for (int u = e->u_end - 1; u >= e->u_begin; u--) {
    ts_unit_args a = base_args(e, sl);
    a.fused_loss_grad = u == n - 1;
    a.x = u > 0 ? sl->acts[u] : NULL;
    a.y = u + 1 < n ? sl->acts[u + 1] : NULL; /* what a recompute rewrites */
    a.saved = e->units[u].recompute ? e->recompute_saved : sl->saved[u];
    a.dy = u < n - 1 ? din : NULL;
    /* ping-pong through dbuf; a pipeline stage's input gradient goes to its
     * send buffer (dy arrives in dbuf[1], so dbuf[0] is free first) */
    a.dx = u == 0 ? NULL : u == e->u_begin && sl->gsend ? sl->gsend : e->dbuf[cur];
    TS_CHECK(prefetch(e, u));
    if (u > e->u_begin) TS_CHECK(prefetch(e, u - 1));
    TS_CHECK(backward_unit(e, u, &a));
    din = a.dx;
    cur ^= 1;
  }
  if (e->replica && (size_t)e->cur_mb + 1 == e->opts.grad_accum)
    TS_CHECK(ts_engine_send_tied_grads(e));
  return TS_OK;
}

ts_status ts_engine_zero_grads(ts_engine *e) {
  for (int u = e->u_begin; u < e->u_end; u++) {
    unit_state *s = &e->units[u];
    size_t n = e->zero->shard_grads ? s->layout.shard : s->layout.padded;
    TS_CHECK(ts_k_zero(&e->ctx, s->grads, n * e->es));
  }
  return TS_OK;
}

/* Drops the gradients accumulated so far in this step and any transient
 * buffer, so that a failed micro-step leaves the engine as it was after
 * the last optimizer step. */
static void discard_step(ts_engine *e) {
  ts_engine_wait_all(e); /* no collective still writes a buffer */
  ts_engine_zero_grads(e);
  ts_engine_wait_sends(e);
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    ts_shard_release(&e->ledger, &s->full_grads);
    ts_shard_release(&e->ledger, &s->full_params);
    s->uses = 0;
    s->kept = 0;
    s->holds = 0;
  }
  e->hold_last = 0;
  ts_shard_release(&e->ledger, &e->tied_grads);
  e->micro_done = 0;
}

/* ---- a micro-batch ------------------------------------------------------------------ */

/* Slot of micro-batch mb. */
static act_slot *slot_of(ts_engine *e, int mb) { return &e->slots[mb % e->n_slots]; }

/* The host arrays a batch source fills for slot sl: the slot's own buffers
 * on the CPU (nothing moves), the engine's host batch beside a device (its
 * staging sends them; a device runs one slot). */
static void host_batch(ts_engine *e, act_slot *sl, int32_t **inputs, int32_t **targets) {
  *inputs = e->device == TS_DEVICE_CPU ? sl->tokens : e->h_tokens;
  *targets = e->device == TS_DEVICE_CPU ? sl->targets : e->h_targets;
}

ts_status ts_engine_load_batch(ts_engine *e, act_slot *sl, const int32_t *inputs,
                               const int32_t *targets, size_t *count) {
  size_t BT = e->opts.micro_batch * e->opts.seq;
  TS_CHECK(ts_k_check_indices(&e->ctx, inputs, targets, BT, e->model->vocab_size));
  if (e->staging) {
    TS_CHECK(ts_k_host_wait(&e->ctx)); /* the previous micro-batch's copies have left */
    TS_CHECK(ts_k_host_copy(&e->ctx, e->staging, inputs, BT * 4));
    TS_CHECK(ts_k_host_copy(&e->ctx, e->staging + BT, targets, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, sl->tokens, e->staging, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, sl->targets, e->staging + BT, BT * 4));
  } else {
    if (inputs != sl->tokens) TS_CHECK(ts_k_from_host(&e->ctx, sl->tokens, inputs, BT * 4));
    if (targets != sl->targets) TS_CHECK(ts_k_from_host(&e->ctx, sl->targets, targets, BT * 4));
  }
  return ts_k_count_targets(&e->ctx, count, targets, BT);
}

/* Micro-batch mb's forward on this stage from the host arrays inputs and
 * targets: loaded into its slot (once its previous output was sent), its
 * loss gradient's scale set, the loss pair of the last stage into loss. */
static ts_status forward_mb(ts_engine *e, int mb, const int32_t *inputs, const int32_t *targets) {
  act_slot *sl = slot_of(e, mb);
  size_t count = 0;
  e->cur_mb = mb;
  TS_CHECK(ts_engine_wait_req(&sl->act_req)); /* the slot's output is free */
  TS_CHECK(ts_engine_load_batch(e, sl, inputs, targets, &count));
  sl->dloss = dloss_of(e, count);
  return ts_engine_forward_slot(e, sl, e->loss + 2 * (size_t)mb, 1);
}

/* Micro-batch mb's backward on this stage, the gradient of its output in
 * dbuf[1] (received) unless this is the last stage. */
static ts_status backward_mb(ts_engine *e, int mb) {
  act_slot *sl = slot_of(e, mb);
  e->cur_mb = mb;
  TS_CHECK(ts_engine_wait_req(&sl->grad_req)); /* the slot's gradient buffer is free */
  TS_CHECK(ts_engine_wait_req(&sl->act_req));  /* a recompute may rewrite the output */
  int last = e->stage == e->stages - 1;
  return backward_slot(e, sl, last ? NULL : e->dbuf[1]);
}

/* ---- the executor -------------------------------------------------------------------- */

/* Runs action a of this stage's list; batch fills a micro-batch's host
 * arrays. */
static ts_status run_action(ts_engine *e, const ts_action *a, const ts_action *next,
                            ts_engine_batch_fn batch, void *user) {
  act_slot *sl = a->mb >= 0 ? slot_of(e, a->mb) : NULL;
  size_t n = ts_engine_btc(e);
  if (a->mb >= 0) e->cur_mb = a->mb; /* spans name it */
  int32_t *inputs, *targets;
  switch (a->kind) {
    case TS_ACT_FORWARD:
      host_batch(e, sl, &inputs, &targets);
      TS_CHECK(ts_engine_wait_req(&sl->act_req)); /* the slot's inputs are free */
      TS_CHECK(batch(user, a->mb, inputs, targets));
      e->hold_last = next && next->kind == TS_ACT_BACKWARD && next->mb == a->mb;
      return forward_mb(e, a->mb, inputs, targets);
    case TS_ACT_SEND_ACT:
      return ts_engine_isend(e, sl->acts[e->u_end], n, a->peer, ts_engine_tag(TS_TAG_ACT, a->mb),
                             &sl->act_req);
    case TS_ACT_RECV_ACT:
      return ts_engine_recv(e, sl->acts[e->u_begin], n, a->peer, ts_engine_tag(TS_TAG_ACT, a->mb));
    case TS_ACT_RECV_GRAD: /* into dbuf[1]: backward's first output goes to dbuf[0] */
      return ts_engine_recv(e, e->dbuf[1], n, a->peer, ts_engine_tag(TS_TAG_GRAD, a->mb));
    case TS_ACT_BACKWARD:
      return backward_mb(e, a->mb);
    case TS_ACT_SEND_GRAD:
      return ts_engine_isend(e, sl->gsend, n, a->peer, ts_engine_tag(TS_TAG_GRAD, a->mb),
                             &sl->grad_req);
    case TS_ACT_REDUCE:
      return ts_engine_wait_sends(e);
    case TS_ACT_OPTIMIZER: /* ts_engine_step's, after the list */
      return TS_OK;
    default:
      return ts_set_error(TS_ERR_INTERNAL, "step: action kind %d", (int)a->kind);
  }
}

ts_status ts_engine_step(ts_engine *e, ts_engine_batch_fn batch, void *user, float lr,
                         ts_step_stats *stats) {
  if (!batch) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "engine: step without a batch source");
  if (e->micro_done != 0)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: step after %d micro-steps of an unfinished step",
                        e->micro_done);
  ts_engine_step_begin(e);
  const ts_stage_schedule *ss = &e->sched.stage[e->stage];
  ts_status st = TS_OK;
  e->in_micro_step = 1;
  for (size_t i = 0; i < ss->n && st == TS_OK; i++)
    st = run_action(e, &ss->actions[i], i + 1 < ss->n ? &ss->actions[i + 1] : NULL, batch, user);
  e->in_micro_step = 0;
  if (st != TS_OK) {
    discard_step(e); /* the batch source's error too */
    return st;
  }
  e->micro_done = (int)e->opts.grad_accum;
  return ts_engine_optimizer_step(e, lr, stats);
}

ts_status ts_engine_micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                               double *loss) {
  if (e->stages > 1)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: micro-step on pipeline stage %d of %d: a pipeline runs whole "
                        "steps (ts_engine_step)",
                        e->stage, e->stages);
  if ((size_t)e->micro_done >= e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: micro-step %d of a step with grad_accum %zu: call "
                        "ts_engine_optimizer_step first",
                        e->micro_done + 1, e->opts.grad_accum);
  if (e->micro_done == 0) ts_engine_step_begin(e);
  int mb = e->micro_done;
  e->in_micro_step = 1;
  e->hold_last = 1; /* the backward follows */
  ts_status st = forward_mb(e, mb, inputs, targets);
  if (st == TS_OK) st = backward_mb(e, mb);
  e->in_micro_step = 0;
  if (st == TS_OK) e->micro_done++;
  if (st == TS_OK && loss) {
    double pair[2];
    st = ts_k_to_host(&e->ctx, pair, e->loss + 2 * (size_t)mb, sizeof pair);
    *loss = ts_engine_mean_loss(pair);
  }
  if (st != TS_OK) discard_step(e);
  return st;
}

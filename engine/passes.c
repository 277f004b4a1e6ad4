/*
 * passes.c — the step's FORWARD and BACKWARD actions: a micro-batch's
 * batch loaded (the host's check, then the device), forward over this
 * stage's units ([stage 3: all-gather] -> forward -> [release]), the loss;
 * backward in reverse, one BACKWARD_UNIT action per unit (step.c's
 * lowering: [all-gather] -> [recompute] -> backward -> [release], its
 * REDUCE_UNIT after it where the stage reduces then), then the
 * micro-batch's BACKWARD; the tied head's gradient folded into its
 * lender's. Gathers are params.c's, gradient buffers and reductions
 * reduce.c's, sends and receives pipeline.c's; the evaluation forward
 * (eval.c) runs ts_engine_forward_slot too. Calls nothing of the executor.
 */
#include <string.h>

#include "engine/engine_testing.h"
#include "engine/observe.h"
#include "engine/params.h"
#include "engine/passes.h"
#include "engine/pipeline_internal.h"
#include "engine/reduce.h"
#include "engine/state.h"
#include "shard/collect.h"

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
 * micro-batches in T = e->pipe.tied_grads (a zeroed transient from its first
 * backward), is added into the lender's gradient once per step, just
 * before the lender's backward of the last micro-batch: the lender's full
 * gradient becomes G + T (with sharded gradients, G is that micro-batch's
 * zeroed transient: T itself becomes it), then the lender's own backward
 * adds to it. On a pipeline, T comes from the last stage. */
static ts_status fold_tied(ts_engine *e, int lender) {
  unit_state *s = &e->units[lender];
  if (!e->pipe.tied_grads) TS_CHECK(ts_engine_recv_tied_grads(e));
  if (e->zero->shard_grads) {
    s->full_grads = e->pipe.tied_grads; /* same size and category: a transient either way */
    e->pipe.tied_grads = NULL;
    return TS_OK;
  }
  ts_status st =
      ts_k_add(&e->ctx, s->grads, s->grads, e->pipe.tied_grads, s->layout.padded, e->opts.dtype);
  ts_shard_release(&e->ledger, &e->pipe.tied_grads);
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
  if (!e->pipe.tied_grads) {
    size_t bytes = e->units[lender].layout.padded * e->es;
    TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_GRADS, bytes,
                                       &e->pipe.tied_grads));
    if (e->device != TS_DEVICE_CPU) TS_CHECK(ts_k_zero(&e->ctx, e->pipe.tied_grads, bytes));
  }
  *out = e->pipe.tied_grads;
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
  a.host_targets = sl->host_targets;
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
  ts_engine_keep_gathered(e, u);
  ts_status st = un->tied_unit >= 0 ? ts_engine_acquire_params(e, un->tied_unit, &lender) : TS_OK;
  if (st == TS_OK && lender) ts_engine_keep_gathered(e, un->tied_unit);
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_FORWARD, u);
    st = ts_unit_forward(e->model, u, &e->ctx, params, a);
    ts_engine_span_end(e, TS_SPAN_FORWARD, u);
  }
  if (lender) ts_engine_release_params(e, un->tied_unit);
  ts_engine_release_params(e, u);
  return st;
}

ts_status ts_engine_forward_slot(ts_engine *e, act_slot *sl, double *loss, int fused) {
  int n = e->model->n_units, end = e->pipe.c_end[sl->chunk];
  for (int u = e->pipe.c_begin[sl->chunk]; u < end; u++) {
    TS_CHECK(ts_engine_prefetch(e, u));
    if (u + 1 == end && e->hold_last && e->run.in_micro_batch && e->units[u].holds > 0) {
      /* its backward comes next: one more use, for that acquire */
      e->units[u].uses++;
      e->units[u].holds++;
    }
    if (u + 1 < end) TS_CHECK(ts_engine_prefetch(e, u + 1));
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
  return count ? (float)((double)e->optim.scaler.scale / ((double)count * micro_batches)) : 0.0f;
}

/* The arithmetic of unit u's backward (with its recompute, and the test
 * seam), on acquired buffers; w: B alone, W deferred into that store
 * (the seam then runs after W), else NULL. */
static ts_status backward_compute(ts_engine *e, int u, ts_unit_args *a, const void *params,
                                  void *grads, const void *lender, ts_k_wgrad *w) {
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
    ts_engine_span_end(e, TS_SPAN_RECOMPUTE, u);
  }
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_kctx k = e->ctx;
    k.wgrad = w;
    ts_engine_span_begin(e, TS_SPAN_BACKWARD, u);
    st = ts_unit_backward(e->model, u, &k, params, grads, a);
    ts_engine_span_end(e, TS_SPAN_BACKWARD, u);
  }
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (st == TS_OK && !w && h && h->after_backward)
    st = h->after_backward(h->user, e, e->optim.attempts + 1, u, grads);
  return st;
}

/* Backward of unit u: parameters acquired, gradients accumulated into the
 * full gradient (a tied head's borrowed one into tied_grads); its
 * reduction is the REDUCE_UNIT action after it (reduce.c). */
static ts_status backward_unit(ts_engine *e, int u, ts_unit_args *a, ts_k_wgrad *w) {
  const ts_unit *un = &e->model->units[u];
  const void *params, *lender = NULL;
  void *grads, *lender_grads = NULL;
  if (!w) { /* B alone touches no gradient: the fold and the buffer wait for W */
    TS_CHECK(ts_engine_reduce_pending(e, u)); /* its full gradient is free again */
    if (u == e->pipe.lender && (size_t)e->run.mb + 1 == e->opts.grad_accum &&
        !tied_direct(e, e->model->n_units - 1))
      TS_CHECK(fold_tied(e, u));
  }
  TS_CHECK(ts_engine_acquire_params(e, u, &params));
  /* B records its gradients' addresses in the unit's own buffer; W moves
   * them to the one it accumulates into (ts_engine_weight_unit_action) */
  ts_status st = w ? (grads = e->units[u].grads, TS_OK) : ts_engine_full_grads(e, u, &grads);
  if (st == TS_OK && un->tied_unit >= 0) {
    st = ts_engine_acquire_params(e, un->tied_unit, &lender);
    if (st == TS_OK) st = tied_grads(e, u, &lender_grads);
    if (st == TS_OK) a->tied_grad = borrowed(e, u, lender_grads);
  }
  if (st == TS_OK) st = backward_compute(e, u, a, params, grads, lender, w);
  if (lender) ts_engine_release_params(e, un->tied_unit);
  ts_engine_release_params(e, u);
  if ((size_t)e->run.mb + 1 == e->opts.grad_accum) { /* the unit's last backward of the step */
    ts_engine_drop_kept(e, u);
    if (lender && !ts_engine_owns(e, un->tied_unit)) ts_engine_drop_kept(e, un->tied_unit); /* a replica */
  }
  return st;
}

ts_status ts_engine_backward_unit_action(ts_engine *e, int mb, int u) {
  int c = ts_engine_chunk_of(e, u), n = e->model->n_units;
  int begin = e->pipe.c_begin[c], end = e->pipe.c_end[c];
  act_slot *sl = ts_engine_slot(e, mb, c);
  if (u == end - 1) { /* the chunk's first unit: the micro-batch's backward begins */
    TS_CHECK(ts_engine_wait_req(&sl->grad_req)); /* the slot's gradient buffer is free */
    TS_CHECK(ts_engine_wait_req(&sl->act_req));  /* a recompute may rewrite the output */
    e->bw.din = end == n ? NULL : e->dbuf[1]; /* the model's last chunk has the loss */
    e->bw.cur = 0;
  }
  ts_unit_args a = base_args(e, sl);
  a.fused_loss_grad = u == n - 1;
  a.x = u > 0 ? sl->acts[u] : NULL;
  a.y = u + 1 < n ? sl->acts[u + 1] : NULL; /* what a recompute rewrites */
  a.saved = e->units[u].recompute ? e->recompute_saved : sl->saved[u];
  a.dy = u < n - 1 ? e->bw.din : NULL;
  /* ping-pong through dbuf; a pipeline stage's input gradient goes to its
   * send buffer (dy arrives in dbuf[1], so dbuf[0] is free first) */
  a.dx = u == 0 ? NULL : u == begin && sl->gsend ? sl->gsend : e->dbuf[e->bw.cur];
  TS_CHECK(ts_engine_prefetch(e, u));
  if (u > begin) TS_CHECK(ts_engine_prefetch(e, u - 1));
  ts_k_wgrad *w = sl->wgrad ? sl->wgrad[u] : NULL; /* a split backward: B alone */
  TS_CHECK(backward_unit(e, u, &a, w));
  e->bw.din = a.dx;
  e->bw.cur ^= 1;
  return TS_OK;
}

/* After the head's chunk's last backward (with a split backward: its
 * last W) the last stage's replica sends the tied head's gradient. */
static ts_status send_tied(ts_engine *e, int mb, int c) {
  if (e->pipe.replica && (size_t)mb + 1 == e->opts.grad_accum &&
      e->pipe.c_end[c] == e->model->n_units) /* the head's chunk */
    TS_CHECK(ts_engine_send_tied_grads(e));
  return TS_OK;
}

ts_status ts_engine_backward_action(ts_engine *e, int mb, int c) {
  return e->pipe.sched.split_backward ? TS_OK : send_tied(e, mb, c);
}

ts_status ts_engine_weight_unit_action(ts_engine *e, int mb, int u) {
  act_slot *sl = ts_engine_slot(e, mb, ts_engine_chunk_of(e, u));
  unit_state *s = &e->units[u];
  void *grads;
  TS_CHECK(ts_engine_reduce_pending(e, u)); /* its full gradient is free again */
  if (u == e->pipe.lender && (size_t)mb + 1 == e->opts.grad_accum &&
      !tied_direct(e, e->model->n_units - 1))
    TS_CHECK(fold_tied(e, u)); /* where the whole backward folds: before this one's */
  TS_CHECK(ts_engine_full_grads(e, u, &grads));
  ts_engine_span_begin(e, TS_SPAN_WEIGHT, u);
  ts_status st = ts_k_wgrad_run(&e->ctx, sl->wgrad[u], s->grads, s->layout.padded * e->es, grads);
  ts_engine_span_end(e, TS_SPAN_WEIGHT, u);
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (st == TS_OK && h && h->after_backward)
    st = h->after_backward(h->user, e, e->optim.attempts + 1, u, grads);
  return st;
}

ts_status ts_engine_weight_action(ts_engine *e, int mb, int c) { return send_tied(e, mb, c); }

/* The host arrays a batch source fills for slot sl: the slot's own buffers
 * on the CPU (nothing moves), the engine's host batch beside a device (its
 * staging sends them; a device runs one slot). */
static void host_batch(ts_engine *e, act_slot *sl, int32_t **inputs, int32_t **targets) {
  *inputs = e->device == TS_DEVICE_CPU ? sl->tokens : e->batch.host_tokens;
  *targets = e->device == TS_DEVICE_CPU ? sl->targets : e->batch.host_targets;
}

ts_status ts_engine_load_batch(ts_engine *e, act_slot *sl, const int32_t *inputs,
                               const int32_t *targets, size_t *count) {
  size_t BT = e->opts.micro_batch * e->opts.seq;
  TS_CHECK(ts_k_check_indices(&e->ctx, inputs, targets, BT, e->model->vocab_size));
  if (e->batch.staging) {
    TS_CHECK(ts_k_host_wait(&e->ctx)); /* the previous micro-batch's copies have left */
    TS_CHECK(ts_k_host_copy(&e->ctx, e->batch.staging, inputs, BT * 4));
    TS_CHECK(ts_k_host_copy(&e->ctx, e->batch.staging + BT, targets, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, sl->tokens, e->batch.staging, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, sl->targets, e->batch.staging + BT, BT * 4));
  } else {
    if (inputs != sl->tokens) TS_CHECK(ts_k_from_host(&e->ctx, sl->tokens, inputs, BT * 4));
    if (targets != sl->targets) TS_CHECK(ts_k_from_host(&e->ctx, sl->targets, targets, BT * 4));
  }
  if (sl->host_targets && sl->host_targets != sl->targets) /* beside a device: the host's copy */
    TS_CHECK(ts_k_host_copy(&e->ctx, sl->host_targets, targets, BT * 4));
  return ts_k_count_targets(&e->ctx, count, targets, BT);
}

ts_status ts_engine_forward_action(ts_engine *e, int mb, int c, int backward_next,
                                   ts_engine_batch_fn batch, void *user) {
  act_slot *sl = ts_engine_slot(e, mb, c);
  int32_t *inputs, *targets;
  size_t count = 0;
  host_batch(e, sl, &inputs, &targets);
  TS_CHECK(ts_engine_wait_req(&sl->act_req)); /* the slot's inputs and output are free */
  TS_CHECK(batch(user, mb, inputs, targets));
  e->hold_last = backward_next;
  TS_CHECK(ts_engine_load_batch(e, sl, inputs, targets, &count));
  sl->dloss = dloss_of(e, count);
  return ts_engine_forward_slot(e, sl, e->sc.loss + 2 * (size_t)mb, 1);
}

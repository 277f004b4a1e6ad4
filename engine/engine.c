/* engine.c — create, free and the micro-step: forward over this pipeline
 * stage's units, backward in reverse with the ZeRO stage's gathers and
 * reduce-scatters, the tied head's gradient folded into the lender's
 * (engine.h; the ZeRO stage's rules come from zero.c's policy table, the
 * optimizer step is optimizer.c's, the pipeline's schedule pipeline.c's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

ts_engine_opts ts_engine_default_opts(void) {
  ts_engine_opts o;
  memset(&o, 0, sizeof o);
  o.micro_batch = 8;
  o.seq = 128;
  o.grad_accum = 1;
  o.dtype = TS_FP32;
  o.seed = 1337;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  o.grad_clip = 1.0f;
  o.zero_stage = 0;
  o.loss_scale = 0.0f;
  o.loss_scale_init = 65536.0f;
  o.loss_scale_window = 2000;
  o.min_loss_scale = 1.0f;
  o.recompute_every = 0;
  o.device = TS_DEVICE_CPU;
  o.pipeline_stages = 1;
  o.schedule = TS_SCHEDULE_1F1B;
  return o;
}

/* ---- create ------------------------------------------------------------------ */

/* Initialises unit u's parameters, identical on every rank: the full unit
 * is initialised in fp32 and each rank keeps its part. */
static ts_status init_unit(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  size_t P = s->layout.padded, S = s->layout.shard, r0 = ts_engine_shard_begin(e, u);
  ts_dtype dt = e->opts.dtype;
  if (dt == TS_FP32 && !e->zero->shard_params)
    return ts_model_init_unit(e->model, u, &e->ctx, s->params, e->opts.seed);
  /* A transient full fp32 copy of the unit, scratch of initialisation
   * (workspace), so that the model-state categories hold model state only. */
  float *full;
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_WORKSPACE, P * 4, (void **)&full));
  ts_status st = ts_model_init_unit(e->model, u, &e->ctx, full, e->opts.seed);
  const float *own = e->zero->shard_optim ? full + r0 : full; /* what the optimizer state holds */
  if (st == TS_OK && s->master)
    st = ts_k_copy(&e->ctx, s->master, own, (e->zero->shard_optim ? S : P) * 4);
  if (st == TS_OK)
    st = e->zero->shard_params ? ts_k_cast(&e->ctx, s->params, dt, full + r0, TS_FP32, S)
                               : ts_k_cast(&e->ctx, s->params, dt, full, TS_FP32, P);
  ts_ledger_free(&e->ledger, full);
  return st;
}

ts_status ts_engine_alloc_model_state(ts_ledger *ledger, ts_device dev, const ts_flat_layout *l,
                                      const ts_zero_policy *z, ts_dtype dt, unit_state *s) {
  size_t P = l->padded, S = l->shard, es = ts_dtype_size(dt);
  TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_PARAMS, (z->shard_params ? S : P) * es, &s->params));
  TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_GRADS, (z->shard_grads ? S : P) * es, &s->grads));
  size_t n_opt = z->shard_optim ? S : P;
  if (dt != TS_FP32)
    TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_MASTER, n_opt * 4, (void **)&s->master));
  TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_OPTIM, n_opt * 4, (void **)&s->m));
  TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_OPTIM, n_opt * 4, (void **)&s->v));
  return TS_OK;
}

void ts_engine_free_model_state(ts_ledger *ledger, unit_state *s) {
  ts_ledger_free(ledger, s->params);
  ts_ledger_free(ledger, s->grads);
  ts_ledger_free(ledger, s->master);
  ts_ledger_free(ledger, s->m);
  ts_ledger_free(ledger, s->v);
}

ts_status ts_engine_unit_layout(const ts_model *m, int u, size_t dp_size, ts_flat_layout *out) {
  const ts_unit *un = &m->units[u];
  size_t numels[TS_UNIT_MAX_TENSORS];
  for (int i = 0; i < un->n_tensors; i++) numels[i] = un->tensors[i].numel;
  return ts_flat_layout_init(out, numels, (size_t)un->n_tensors, dp_size);
}

static ts_status init_layout(ts_engine *e, int u) {
  return ts_engine_unit_layout(e->model, u, (size_t)e->dp_size, &e->units[u].layout);
}

/* Saved bytes of unit u for slot sl, unless it is recomputed. */
static ts_status alloc_saved(ts_engine *e, act_slot *sl, int u) {
  if (e->units[u].recompute) return TS_OK;
  size_t saved = ts_unit_saved_bytes(e->model, u, e->opts.micro_batch, e->opts.seq, e->opts.dtype,
                                     e->opts.device);
  return ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, saved, &sl->saved[u]);
}

static ts_status alloc_unit(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  TS_CHECK(init_layout(e, u));
  TS_CHECK(ts_engine_alloc_model_state(&e->ledger, e->device, &s->layout, e->zero, e->opts.dtype,
                                       s));
  s->recompute = ts_engine_is_recomputed(e->model, &e->opts, u);
  TS_CHECK(alloc_saved(e, &e->slots[0], u));
  size_t sb = ts_shard_scratch_bytes(&s->layout, e->opts.dtype);
  if (sb > e->scratch_bytes) e->scratch_bytes = sb;
  return init_unit(e, u);
}

/* The last stage's copy of a tied head's lender (unit u): its parameters
 * alone, held as the stage's policy holds parameters, initialised as
 * stage 0 initialises them (the same bits). */
static ts_status alloc_replica(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  TS_CHECK(init_layout(e, u));
  size_t n = e->zero->shard_params ? s->layout.shard : s->layout.padded;
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_PARAMS, n * e->es, &s->params));
  return init_unit(e, u);
}

/* The activations of slot k: saved bytes (slot 0's come with the units),
 * the units' inputs and the stage's output, the batch, and (stages s > 0)
 * the gradient sent back. */
static ts_status alloc_slot(ts_engine *e, int k) {
  const ts_model *m = e->model;
  act_slot *sl = &e->slots[k];
  size_t B = e->opts.micro_batch, T = e->opts.seq, BTC = B * T * m->hidden_size * e->es;
  if (k > 0)
    for (int u = e->u_begin; u < e->u_end; u++) TS_CHECK(alloc_saved(e, sl, u));
  int first = e->u_begin > 1 ? e->u_begin : 1, last = e->u_end < m->n_units ? e->u_end : m->n_units - 1;
  for (int u = first; u <= last; u++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, BTC, &sl->acts[u]));
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, B * T * 4,
                           (void **)&sl->tokens));
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, B * T * 4,
                           (void **)&sl->targets));
  if (e->stage > 0)
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, BTC, &sl->gsend));
  return TS_OK;
}

static void free_slot(ts_engine *e, act_slot *sl) {
  if (sl->acts)
    for (int u = 0; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, sl->acts[u]);
  if (sl->saved)
    for (int u = 0; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, sl->saved[u]);
  ts_ledger_free(&e->ledger, sl->tokens);
  ts_ledger_free(&e->ledger, sl->targets);
  ts_ledger_free(&e->ledger, sl->gsend);
  free(sl->acts);
  free(sl->saved);
}

/* The step's scalars: a few hundred bytes the engine reads once per step.
 * On a GPU they are device memory, charged to the workspace category; on
 * the CPU they are host bookkeeping like the rest of this struct and are
 * not charged (as the running sums they replace never were). */
static ts_status alloc_scalars(ts_engine *e) {
  size_t K = e->opts.grad_accum, U = (size_t)e->model->n_units;
  size_t doubles = 2 * K + U + 2;
  e->scalar_bytes = doubles * sizeof(double) + U * TS_UNIT_MAX_TENSORS * sizeof(int32_t);
  e->h_scalars = calloc(1, e->scalar_bytes); /* the host's copy of the block */
  e->h_part = calloc(U + 1, sizeof(double));
  if (!e->h_scalars || !e->h_part) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: step scalars");
  void *block = NULL;
  if (e->device == TS_DEVICE_CPU) {
    block = calloc(1, e->scalar_bytes);
    if (!block) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: step scalars");
  } else {
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_WORKSPACE, e->scalar_bytes, &block));
  }
  e->scalars = block;
  e->loss = e->scalars;
  e->sumsq = e->loss + 2 * K;
  e->eval_loss = e->sumsq + U;
  e->nonfinite = (int32_t *)(e->eval_loss + 2);
  return TS_OK;
}

ts_status ts_engine_alloc(ts_engine *e) {
  const ts_model *m = e->model;
  ts_device dev = e->device;
  size_t B = e->opts.micro_batch, T = e->opts.seq, C = m->hidden_size, es = e->es;
  size_t U = (size_t)m->n_units;
  e->units = calloc(U, sizeof *e->units);
  e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
  if (!e->units || !e->slots) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: unit tables");
  for (int k = 0; k < e->n_slots; k++) {
    e->slots[k].acts = calloc(U, sizeof(void *));
    e->slots[k].saved = calloc(U, sizeof(void *));
    if (!e->slots[k].acts || !e->slots[k].saved)
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: slot tables");
  }
  /* Units first: their initialisation scratch (workspace category) is gone
   * before the kernel workspace exists, so the category's peak is the
   * larger of the two, not their sum. */
  for (int u = e->u_begin; u < e->u_end; u++) TS_CHECK(alloc_unit(e, u));
  if (e->replica) TS_CHECK(alloc_replica(e, e->lender));
  size_t ws = 0;
  for (int u = e->u_begin; u < e->u_end; u++) {
    size_t w = ts_unit_workspace_bytes(m, u, B, T, e->opts.dtype, dev);
    if (w > ws) ws = w;
  }
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_WORKSPACE, ws, &e->ctx.workspace));
  e->ctx.workspace_bytes = ws;
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_COMM, e->scratch_bytes, &e->scratch));
  TS_CHECK(alloc_slot(e, 0));
  e->tokens = e->slots[0].tokens;
  e->targets = e->slots[0].targets;
  /* The host's batch (ts_engine_batch): the same buffers on the CPU, host
   * staging (the ledger's CPU account) beside a device's. */
  e->h_tokens = e->tokens;
  e->h_targets = e->targets;
  if (dev != TS_DEVICE_CPU) {
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, B * T * 4,
                             (void **)&e->h_tokens));
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, B * T * 4,
                             (void **)&e->h_targets));
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, 2 * B * T * 4,
                             (void **)&e->staging));
    TS_CHECK(ts_k_host_register(&e->ctx, e->staging, 2 * B * T * 4));
  }
  for (int i = 0; i < 2; i++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_ACTIVATIONS, B * T * C * es, &e->dbuf[i]));
  size_t rb = ts_engine_recompute_bytes(m, &e->opts, e->u_begin, e->u_end);
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_ACTIVATIONS, rb, &e->recompute_saved));
  for (int k = 1; k < e->n_slots; k++) TS_CHECK(alloc_slot(e, k)); /* a pipeline's others */
  return alloc_scalars(e);
}

ts_status ts_engine_check_zero_stage(long long zero_stage) {
  if (zero_stage < 0 || zero_stage > 3 || !ts_zero_policy_of((int)zero_stage))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`zero_stage` %lld: expected a ZeRO stage 0, 1, 2 or 3", zero_stage);
  return TS_OK;
}

ts_status ts_engine_check_pipeline_stages(long long stages) {
  if (stages < 1 || stages > TS_ENGINE_MAX_STAGES)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`pipeline_stages` %lld: expected 1 to %d stages",
                        stages, TS_ENGINE_MAX_STAGES);
  return TS_OK;
}

/* The argument checks of ts_engine_create and ts_engine_plan. */
static ts_status check_opts(const ts_model *model, const ts_engine_opts *opts) {
  if (opts->micro_batch == 0 || opts->seq == 0 || opts->grad_accum == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`micro_batch` %zu, `seq` %zu, `grad_accum` %zu: expected each >= 1",
                        opts->micro_batch, opts->seq, opts->grad_accum);
  if (opts->seq > model->max_seq)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`seq` %zu: expected at most max_position_embeddings = %zu of %s",
                        opts->seq, model->max_seq, ts_model_origin(model));
  /* int32 token positions and micro-batch indices; B T so bounded keeps
   * every byte count (B T times model sizes) far inside 64 bits */
  if (opts->micro_batch > INT32_MAX / opts->seq || opts->grad_accum > INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`micro_batch` %zu x `seq` %zu = %.3g tokens per micro-batch, `grad_accum` "
                        "%zu: expected at most 2^31 - 1 each",
                        opts->micro_batch, opts->seq, (double)opts->micro_batch * (double)opts->seq,
                        opts->grad_accum);
  if ((unsigned)opts->device >= TS_DEVICE_COUNT)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "device %d: expected cpu or cuda",
                        (int)opts->device);
  return ts_engine_check_zero_stage(opts->zero_stage);
}

/* The unit a tied head borrows from (its tied_unit), or -1 without one. */
static int tied_lender(const ts_model *m) {
  for (int u = 0; u < m->n_units; u++)
    if (m->units[u].tied_unit >= 0) return m->units[u].tied_unit;
  return -1;
}

ts_status ts_engine_new(const ts_model *model, const ts_engine_opts *opts, ts_engine **out) {
  *out = NULL;
  TS_CHECK(check_opts(model, opts));
  ts_engine *e = calloc(1, sizeof *e);
  if (!e) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: cannot allocate");
  ts_status st = ts_loss_scaler_init(&e->scaler, opts->dtype, opts->loss_scale,
                                     opts->loss_scale_init, opts->loss_scale_window,
                                     opts->min_loss_scale);
  if (st != TS_OK) {
    free(e);
    return st;
  }
  e->model = model;
  e->opts = *opts;
  e->zero = ts_zero_policy_of(opts->zero_stage);
  e->device = opts->device;
  e->ctx.device = opts->device;
  e->es = ts_dtype_size(opts->dtype);
  e->stages = 1; /* no pipelining until ts_engine_set_stage */
  e->lender = tied_lender(model);
  e->u_end = model->n_units;
  e->n_slots = 1;
  ts_ledger_init(&e->ledger);
  *out = e;
  return TS_OK;
}

ts_status ts_engine_create_stage(ts_engine **out, const ts_model *model,
                                 const ts_engine_opts *opts, ts_comm *dp, ts_comm *pp, int stage) {
  *out = NULL;
  ts_engine *e;
  TS_CHECK(ts_engine_new(model, opts, &e));
  ts_status st = ts_k_context_init(&e->ctx, e->device, opts->device_index);
  if (st == TS_OK && !dp) st = ts_comm_self(&e->own_comm);
  if (st == TS_OK) {
    e->dp = dp ? dp : e->own_comm;
    e->pp = pp;
    e->rank = ts_comm_rank(e->dp);
    e->dp_size = ts_comm_size(e->dp);
    st = ts_engine_set_stage(e, stage);
  }
  if (st == TS_OK && e->device != TS_DEVICE_CPU) st = ts_engine_prepare_device(e);
  if (st == TS_OK) st = ts_engine_alloc(e);
  if (st != TS_OK) {
    ts_engine_free(e);
    return st;
  }
  *out = e;
  return TS_OK;
}

ts_status ts_engine_create(ts_engine **out, const ts_model *model, const ts_engine_opts *opts,
                           ts_comm *dp) {
  if (opts->pipeline_stages > 1) {
    *out = NULL;
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "engine: `pipeline_stages` %d needs its grid (ts_engine_create_pipeline)",
                        opts->pipeline_stages);
  }
  return ts_engine_create_stage(out, model, opts, dp, NULL, 0);
}

void ts_engine_free(ts_engine *e) {
  if (!e) return;
  /* Whatever is still queued on the device finishes before its buffers go. */
  if (e->ctx.stream) ts_k_synchronize(&e->ctx);
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (h && h->release) h->release(h->user, e);
  ts_engine_wait_sends(e); /* no send may still read a buffer */
  if (e->units) {
    for (int u = 0; u < e->model->n_units; u++) {
      unit_state *s = &e->units[u];
      ts_engine_free_model_state(&e->ledger, s);
      ts_shard_release(&e->ledger, &s->full_params);
      ts_shard_release(&e->ledger, &s->full_grads);
    }
  }
  ts_shard_release(&e->ledger, &e->tied_grads);
  if (e->slots)
    for (int k = 0; k < e->n_slots; k++) free_slot(e, &e->slots[k]);
  if (e->h_tokens != e->tokens) ts_ledger_free(&e->ledger, e->h_tokens);
  if (e->staging) {
    ts_k_host_wait(&e->ctx); /* no copy may still read it */
    ts_k_host_unregister(&e->ctx, e->staging);
    ts_ledger_free(&e->ledger, e->staging);
  }
  if (e->dp && e->comm_mem.copy) ts_comm_set_memory(e->dp, NULL);
  if (e->h_targets != e->targets) ts_ledger_free(&e->ledger, e->h_targets);
  ts_ledger_free(&e->ledger, e->dbuf[0]);
  ts_ledger_free(&e->ledger, e->dbuf[1]);
  ts_ledger_free(&e->ledger, e->ctx.workspace);
  ts_ledger_free(&e->ledger, e->scratch);
  ts_ledger_free(&e->ledger, e->recompute_saved);
  if (e->device == TS_DEVICE_CPU) free(e->scalars);
  else ts_ledger_free(&e->ledger, e->scalars);
  free(e->h_scalars);
  free(e->h_part);
  ts_ledger_release(&e->ledger);
  ts_k_context_destroy(&e->ctx);
  ts_comm_free(e->own_comm);
  ts_comm_free(e->own_pp);
  free(e->units);
  free(e->slots);
  ts_schedule_free(&e->sched);
  free(e);
}

/* ---- trace spans ---------------------------------------------------------------- */

void ts_engine_span_begin(ts_engine *e, ts_span_kind kind, int unit) {
  if (!e->trace) return;
  /* micro-batch: the one in progress during a step, none outside */
  int mb = e->in_micro_step ? e->cur_mb : -1;
  ts_trace_begin(e->trace, kind, unit, mb);
}

void ts_engine_span_end(ts_engine *e) {
  if (!e->trace) return;
  if (e->device != TS_DEVICE_CPU) ts_k_synchronize(&e->ctx);
  ts_trace_end(e->trace);
}

void ts_engine_set_trace(ts_engine *e, ts_trace *t) { e->trace = t; }

/* ---- gathers and reductions -------------------------------------------------- */

ts_status ts_engine_acquire_params(ts_engine *e, int u, const void **full) {
  unit_state *s = &e->units[u];
  if (e->zero->shard_params) {
    if (s->uses == 0) {
      ts_engine_span_begin(e, TS_SPAN_ALL_GATHER, u);
      ts_status st = ts_shard_gather_alloc(&e->ledger, e->device, TS_MEM_PARAMS, e->dp,
                                           &s->layout, s->params, e->opts.dtype, &s->full_params);
      ts_engine_span_end(e);
      TS_CHECK(st);
    }
    s->uses++;
    *full = s->full_params;
  } else {
    *full = s->params;
  }
  return TS_OK;
}

void ts_engine_release_params(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->zero->shard_params && s->uses > 0 && --s->uses == 0)
    ts_shard_release(&e->ledger, &s->full_params);
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

/* Sharded gradients, after unit u's backward: reduce-scatter its full
 * gradient into the shard (adding to it after the first micro-batch) and
 * free it. */
static ts_status reduce_unit_grads(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (!e->zero->shard_grads) return TS_OK;
  ts_engine_span_begin(e, TS_SPAN_REDUCE_SCATTER, u);
  ts_status st = ts_shard_reduce_scatter(e->dp, &s->layout, s->full_grads, s->grads, e->opts.dtype,
                                         e->cur_mb > 0, e->scratch, e->scratch_bytes);
  ts_engine_span_end(e);
  ts_shard_release(&e->ledger, &s->full_grads);
  return st;
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
  ts_status st = un->tied_unit >= 0 ? ts_engine_acquire_params(e, un->tied_unit, &lender) : TS_OK;
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_FORWARD, u);
    st = ts_unit_forward(e->model, u, &e->ctx, params, a);
    ts_engine_span_end(e);
  }
  if (lender) ts_engine_release_params(e, un->tied_unit);
  ts_engine_release_params(e, u);
  return st;
}

ts_status ts_engine_forward_slot(ts_engine *e, act_slot *sl, double *loss, int fused) {
  int n = e->model->n_units;
  for (int u = e->u_begin; u < e->u_end; u++) {
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

/* ts_engine_load_batch (engine_internal.h). */
ts_status ts_engine_load_batch(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                              size_t *count) {
  size_t BT = e->opts.micro_batch * e->opts.seq;
  if (e->staging) {
    TS_CHECK(ts_k_check_indices(&e->ctx, inputs, targets, BT, e->model->vocab_size));
    TS_CHECK(ts_k_host_wait(&e->ctx));
    TS_CHECK(ts_k_host_copy(&e->ctx, e->staging, inputs, BT * 4));
    TS_CHECK(ts_k_host_copy(&e->ctx, e->staging + BT, targets, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, e->tokens, e->staging, BT * 4));
    TS_CHECK(ts_k_from_host_async(&e->ctx, e->targets, e->staging + BT, BT * 4));
  } else {
    if (inputs != e->tokens) TS_CHECK(ts_k_from_host(&e->ctx, e->tokens, inputs, BT * 4));
    if (targets != e->targets) TS_CHECK(ts_k_from_host(&e->ctx, e->targets, targets, BT * 4));
  }
  return ts_k_count_targets(&e->ctx, count, targets, BT);
}

/* d(scaled step loss)/d(row loss) of a micro-batch with `count` targets:
 * the loss scale (1 unless fp16; exact: 2^k) over count N K. */
float ts_engine_dloss(const ts_engine *e, size_t count) {
  double micro_batches = (double)e->opts.grad_accum * (double)e->dp_size;
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
  }
  if (st == TS_OK) {
    a->tied_weight = lender ? borrowed(e, u, lender) : NULL;
    ts_engine_span_begin(e, TS_SPAN_BACKWARD, u);
    st = ts_unit_backward(e->model, u, &e->ctx, params, grads, a);
    ts_engine_span_end(e);
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
  if (st == TS_OK) st = reduce_unit_grads(e, u);
  return st;
}

ts_status ts_engine_backward_slot(ts_engine *e, act_slot *sl, const void *dy) {
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
void ts_engine_discard_step(ts_engine *e) {
  ts_engine_zero_grads(e);
  ts_engine_wait_sends(e);
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    ts_shard_release(&e->ledger, &s->full_grads);
    ts_shard_release(&e->ledger, &s->full_params);
    s->uses = 0;
  }
  ts_shard_release(&e->ledger, &e->tied_grads);
  e->micro_done = 0;
}

/* ts_engine_run_micro_step's body. */
static ts_status run_micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets) {
  size_t count = 0;
  act_slot *sl = &e->slots[0];
  TS_CHECK(ts_engine_load_batch(e, inputs, targets, &count));
  sl->dloss = ts_engine_dloss(e, count);
  e->cur_mb = e->micro_done;
  TS_CHECK(ts_engine_forward_slot(e, sl, e->loss + 2 * (size_t)e->cur_mb, 1));
  TS_CHECK(ts_engine_backward_slot(e, sl, NULL));
  e->micro_done++;
  return TS_OK;
}

ts_status ts_engine_run_micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets) {
  e->in_micro_step = 1;
  ts_status st = run_micro_step(e, inputs, targets);
  e->in_micro_step = 0;
  return st;
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
  ts_status st = ts_engine_run_micro_step(e, inputs, targets);
  if (st == TS_OK && loss) {
    double pair[2];
    st = ts_k_to_host(&e->ctx, pair, e->loss + 2 * (size_t)(e->micro_done - 1), sizeof pair);
    *loss = ts_engine_mean_loss(pair);
  }
  if (st != TS_OK) ts_engine_discard_step(e);
  return st;
}

/* ---- accessors --------------------------------------------------------------------- */

const ts_mem_account *ts_engine_memory(const ts_engine *e) {
  return ts_ledger_account(&e->ledger, e->device);
}

void ts_engine_batch(ts_engine *e, int32_t **inputs, int32_t **targets) {
  *inputs = e->h_tokens;
  *targets = e->h_targets;
}

const ts_flat_layout *ts_engine_layout(const ts_engine *e, int u) {
  TS_ASSERT(u >= 0 && u < e->model->n_units);
  return &e->units[u].layout;
}

float ts_engine_loss_scale(const ts_engine *e) { return e->scaler.scale; }

const ts_engine_opts *ts_engine_options(const ts_engine *e) { return &e->opts; }

ts_comm *ts_engine_comm(const ts_engine *e) { return e->dp; }

int ts_engine_num_units(const ts_engine *e) { return e->model->n_units; }

int ts_engine_stage_units(const ts_engine *e, int *begin, int *end) {
  *begin = e->u_begin;
  *end = e->u_end;
  return e->stage;
}

/* The test seam (engine_testing.h): NULL in training. */
static const ts_engine_hooks *g_hooks;

void ts_engine_set_hooks(const ts_engine_hooks *hooks) { g_hooks = hooks; }

const ts_engine_hooks *ts_engine_get_hooks(void) { return g_hooks; }

const ts_model *ts_engine_model(const ts_engine *e) { return e->model; }

const ts_kctx *ts_engine_context(const ts_engine *e) { return &e->ctx; }

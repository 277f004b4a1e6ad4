/* engine.c — the engine's create and free (every buffer through the ledger,
 * the parameters initialised alike on every rank) and accessors
 * (engine.h). The step is step.c's executor and its action families'
 * (passes.c, reduce.c, optimizer.c, pipeline.c), what watches it
 * observe.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/engine_internal.h"
#include "engine/engine_testing.h"
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
  o.overlap = 1;
  return o;
}

/* ---- create ------------------------------------------------------------------ */

/* init_unit's copy of the initial fp32 values into an offloaded piece of
 * the master weights (offload.h ts_offload_each). */
typedef struct init_copy {
  ts_engine *e;
  const float *own; /* the optimizer state's part of the initial values */
} init_copy;

/* n fp32 values of the device into optimizer state, which is host memory
 * when ts_engine_state_on_host. */
static ts_status state_from_device(ts_engine *e, float *dst, const float *src, size_t n) {
  return ts_engine_state_on_host(e) ? ts_k_to_host(&e->ctx, dst, src, n * 4)
                                    : ts_k_copy(&e->ctx, dst, src, n * 4);
}

static ts_status copy_master(void *arg, float *const at[3], size_t first, size_t count) {
  const init_copy *c = arg;
  return state_from_device(c->e, at[0], c->own + first, count);
}

/* Initialises unit u's parameters, identical on every rank: the full unit
 * is initialised in fp32 and each rank keeps its part. */
static ts_status init_unit(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  size_t P = s->layout.padded, S = s->layout.shard, r0 = ts_engine_shard_begin(e, u);
  ts_dtype dt = e->opts.dtype;
  if (dt == TS_FP32 && !e->zero->shard_params) /* (never with offload_params: stage 3) */
    return ts_model_init_unit(e->model, u, &e->ctx, s->params, e->opts.seed);
  /* A transient full fp32 copy of the unit, scratch of initialisation
   * (workspace), so that the model-state categories hold model state only. */
  float *full;
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_WORKSPACE, P * 4, (void **)&full));
  ts_status st = ts_model_init_unit(e->model, u, &e->ctx, full, e->opts.seed);
  const float *own = e->zero->shard_optim ? full + r0 : full; /* what the optimizer state holds */
  size_t n_opt = e->zero->shard_optim ? S : P;
  /* offloaded master weights: written piece by piece (a replica has no
   * optimizer state; fp32 has no master) */
  init_copy c = {e, own};
  if (st == TS_OK && e->offload && ts_engine_owns(e, u) && dt != TS_FP32)
    st = ts_offload_each(e, u, 0, n_opt, 1, copy_master, &c);
  if (st == TS_OK && s->master) st = state_from_device(e, s->master, own, n_opt);
  if (st == TS_OK && ts_engine_params_on_host(e)) { /* the shard cast here, then to the host */
    void *cast = NULL;
    st = ts_ledger_alloc(&e->ledger, e->device, TS_MEM_WORKSPACE, S * e->es, &cast);
    if (st == TS_OK) st = ts_k_cast(&e->ctx, cast, dt, full + r0, TS_FP32, S);
    if (st == TS_OK) st = ts_k_to_host(&e->ctx, s->params, cast, S * e->es);
    ts_ledger_free(&e->ledger, cast);
  } else if (st == TS_OK) {
    st = e->zero->shard_params ? ts_k_cast(&e->ctx, s->params, dt, full + r0, TS_FP32, S)
                               : ts_k_cast(&e->ctx, s->params, dt, full, TS_FP32, P);
  }
  ts_ledger_free(&e->ledger, full);
  return st;
}

ts_status ts_engine_alloc_model_state(ts_ledger *ledger, ts_device dev, const ts_flat_layout *l,
                                      const ts_zero_policy *z, ts_dtype dt, ts_state_place place,
                                      int params_on_host, unit_state *s) {
  size_t P = l->padded, S = l->shard, es = ts_dtype_size(dt);
  TS_CHECK(ts_ledger_alloc(ledger, params_on_host ? TS_DEVICE_CPU : dev, TS_MEM_PARAMS,
                           (z->shard_params ? S : P) * es, &s->params));
  TS_CHECK(ts_ledger_alloc(ledger, dev, TS_MEM_GRADS, (z->shard_grads ? S : P) * es, &s->grads));
  if (place == TS_STATE_IN_FILE) return TS_OK; /* the optimizer state: offload.c's */
  ts_device sd = place == TS_STATE_ON_HOST ? TS_DEVICE_CPU : dev;
  size_t n_opt = z->shard_optim ? S : P;
  if (dt != TS_FP32)
    TS_CHECK(ts_ledger_alloc(ledger, sd, TS_MEM_MASTER, n_opt * 4, (void **)&s->master));
  TS_CHECK(ts_ledger_alloc(ledger, sd, TS_MEM_OPTIM, n_opt * 4, (void **)&s->m));
  TS_CHECK(ts_ledger_alloc(ledger, sd, TS_MEM_OPTIM, n_opt * 4, (void **)&s->v));
  return TS_OK;
}

/* Page-locks (ts_k_host_register: beside a GPU; on the CPU a no-op but for
 * ts_k_check_host_blocks) or unlocks the host blocks a of n; the message
 * names what and why they are locked. */
static ts_status lock_host(ts_engine *e, void *const *a, int n, const char *what) {
  for (int k = 0; k < n; k++) {
    size_t bytes = ts_ledger_size(&e->ledger, a[k]);
    if (a[k] && ts_k_host_register(&e->ctx, a[k], bytes) != TS_OK)
      return ts_set_error(TS_ERR_OUT_OF_MEMORY,
                          "%s: cannot page-lock %zu bytes of host memory for %s (%s): expected a "
                          "higher locked-memory limit (ulimit -l, the container's memlock) or "
                          "less host memory in use",
                          e->opts.offload_dir ? "`offload_dir`" : "`offload_optimizer`", bytes,
                          what, ts_last_error());
  }
  return TS_OK;
}

static void unlock_host(ts_engine *e, void *const *a, int n) {
  for (int k = 0; k < n; k++) ts_k_host_unregister(&e->ctx, a[k]);
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
  ts_state_place place = e->offload                ? TS_STATE_IN_FILE
                        : e->opts.offload_optimizer ? TS_STATE_ON_HOST
                                                    : TS_STATE_ON_DEVICE;
  TS_CHECK(ts_engine_alloc_model_state(&e->ledger, e->device, &s->layout, e->zero, e->opts.dtype,
                                       place, ts_engine_params_on_host(e), s));
  char what[64];
  if (place == TS_STATE_ON_HOST) {
    void *const state[3] = {s->master, s->m, s->v};
    snprintf(what, sizeof what, "unit %d's optimizer state", u);
    TS_CHECK(lock_host(e, state, 3, what));
  }
  if (ts_engine_params_on_host(e)) {
    snprintf(what, sizeof what, "unit %d's parameter shard", u);
    TS_CHECK(lock_host(e, &s->params, 1, what));
  }
  s->recompute = ts_engine_is_recomputed(e->model, &e->opts, u);
  TS_CHECK(alloc_saved(e, &e->slots[e->pipe.slot0[ts_engine_chunk_of(e, u)]], u));
  size_t sb = ts_shard_scratch_bytes(&s->layout, e->opts.dtype);
  if (sb > e->scratch_bytes) e->scratch_bytes = sb;
  /* hybrid: the shard's all-reduce over the replicas shares the scratch */
  sb = e->rep ? ts_comm_all_reduce_scratch_bytes(e->rep, s->layout.shard, e->opts.dtype) : 0;
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

/* The activations of slot k of chunk c: saved bytes (a chunk's first
 * slot's come with the units), the units' inputs and the chunk's output,
 * the batch, and (every virtual stage but the first) the gradient sent
 * back. */
static ts_status alloc_slot(ts_engine *e, int k, int c) {
  const ts_model *m = e->model;
  act_slot *sl = &e->slots[k];
  size_t B = e->opts.micro_batch, T = e->opts.seq, BTC = B * T * m->hidden_size * e->es;
  int u0 = e->pipe.c_begin[c], u1 = e->pipe.c_end[c];
  sl->chunk = c;
  if (k > e->pipe.slot0[c])
    for (int u = u0; u < u1; u++) TS_CHECK(alloc_saved(e, sl, u));
  int first = u0 > 1 ? u0 : 1, last = u1 < m->n_units ? u1 : m->n_units - 1;
  for (int u = first; u <= last; u++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, BTC, &sl->acts[u]));
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, B * T * 4,
                           (void **)&sl->tokens));
  TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, B * T * 4,
                           (void **)&sl->targets));
  if (e->device == TS_DEVICE_CPU)
    sl->host_targets = sl->targets;
  else if (u1 == m->n_units) /* the last unit's, read on the host */
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, B * T * 4,
                             (void **)&sl->host_targets));
  if (u0 > 0)
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_ACTIVATIONS, BTC, &sl->gsend));
  if (e->pipe.sched.split_backward) { /* a W store per unit that splits (ZB-H1) */
    sl->wgrad = calloc((size_t)m->n_units, sizeof *sl->wgrad);
    if (!sl->wgrad) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: W stores");
    for (int u = u0; u < u1; u++)
      if (ts_unit_splits_backward(m, u)) TS_CHECK(ts_k_wgrad_new(&e->wmem, &sl->wgrad[u]));
  }
  return TS_OK;
}

/* The W stores' memory (ts_k_wgrad_mem): a copy is a transient of the
 * activations category on the engine's device. */
static ts_status wgrad_alloc(void *user, size_t bytes, void **out) {
  ts_engine *e = user;
  return ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_ACTIVATIONS, bytes, out);
}
static void wgrad_release(void *user, void *p) {
  ts_engine *e = user;
  ts_ledger_free_transient(&e->ledger, p);
}

/* What a B's weight-gradient records must copy: the workspace (the
 * units' temporaries) and the recompute buffer (the next recompute
 * rewrites it); a unit's dx and dy ts_unit_backward adds itself. */
static void wgrad_mem(ts_engine *e, size_t recompute_bytes) {
  e->wmem.ranges[0].p = e->ctx.workspace;
  e->wmem.ranges[0].bytes = e->ctx.workspace_bytes;
  e->wmem.ranges[1].p = e->recompute_saved;
  e->wmem.ranges[1].bytes = recompute_bytes;
  e->wmem.n_ranges = 2;
}

static void free_slot(ts_engine *e, act_slot *sl) {
  if (sl->wgrad)
    for (int u = 0; u < e->model->n_units; u++) ts_k_wgrad_free(sl->wgrad[u]);
  free(sl->wgrad);
  if (sl->acts)
    for (int u = 0; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, sl->acts[u]);
  if (sl->saved)
    for (int u = 0; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, sl->saved[u]);
  ts_ledger_free(&e->ledger, sl->tokens);
  if (sl->host_targets != sl->targets) ts_ledger_free(&e->ledger, sl->host_targets);
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
  e->sc.bytes = doubles * sizeof(double) + U * TS_UNIT_MAX_TENSORS * sizeof(int32_t);
  e->sc.host = calloc(1, e->sc.bytes); /* the host's copy of the block */
  e->sc.part = calloc(U + 1, sizeof(double));
  if (!e->sc.host || !e->sc.part) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: step scalars");
  void *block = NULL;
  if (e->device == TS_DEVICE_CPU) {
    block = calloc(1, e->sc.bytes);
    if (!block) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: step scalars");
  } else {
    TS_CHECK(ts_ledger_alloc(&e->ledger, e->device, TS_MEM_WORKSPACE, e->sc.bytes, &block));
  }
  e->sc.block = block;
  e->sc.loss = e->sc.block;
  e->sc.sumsq = e->sc.loss + 2 * K;
  e->sc.eval_loss = e->sc.sumsq + U;
  e->sc.nonfinite = (int32_t *)(e->sc.eval_loss + 2);
  return TS_OK;
}

/* The staged update's host pieces (ts_engine_state_on_host): a gradient
 * and a parameter piece of opts.offload_piece elements (default
 * TS_OFFLOAD_PIECE), no longer than the largest unit's optimizer state. */
static ts_status alloc_update_staging(ts_engine *e) {
  size_t n = e->opts.offload_piece ? e->opts.offload_piece : TS_OFFLOAD_PIECE, most = 0;
  TS_ENGINE_FOR_UNITS(e, u) {
    const ts_flat_layout *l = &e->units[u].layout;
    size_t k = e->zero->shard_optim ? l->shard : l->padded;
    if (k > most) most = k;
  }
  e->update.stage_n = n < most ? n : most;
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_STAGING, e->update.stage_n * e->es,
                           &e->update.host_grad));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_STAGING, e->update.stage_n * e->es,
                           &e->update.host_param));
  void *const both[2] = {e->update.host_grad, e->update.host_param};
  return lock_host(e, both, 2, "the update's gradient and parameter pieces");
}

ts_status ts_engine_alloc(ts_engine *e) {
  const ts_model *m = e->model;
  ts_device dev = e->device;
  size_t B = e->opts.micro_batch, T = e->opts.seq, C = m->hidden_size, es = e->es;
  size_t U = (size_t)m->n_units;
  e->units = calloc(U, sizeof *e->units);
  e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
  e->wmem = (ts_k_wgrad_mem){wgrad_alloc, wgrad_release, e, {{NULL, 0}}, 0}; /* ranges: below */
  if (!e->units || !e->slots) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: unit tables");
  for (int k = 0; k < e->n_slots; k++) {
    e->slots[k].acts = calloc(U, sizeof(void *));
    e->slots[k].saved = calloc(U, sizeof(void *));
    if (!e->slots[k].acts || !e->slots[k].saved)
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: slot tables");
  }
  /* Offload: the file and its slots first (they need the layouts), so
   * that each unit's initialisation writes its master weights there. */
  if (e->opts.offload_dir) {
    TS_ENGINE_FOR_UNITS(e, u) TS_CHECK(init_layout(e, u));
    TS_CHECK(ts_offload_open(e));
  }
  /* Units first: their initialisation scratch (workspace category) is gone
   * before the kernel workspace exists, so the category's peak is the
   * larger of the two, not their sum. */
  TS_ENGINE_FOR_UNITS(e, u) TS_CHECK(alloc_unit(e, u));
  if (e->pipe.replica) TS_CHECK(alloc_replica(e, e->pipe.lender));
  if (ts_engine_state_on_host(e)) TS_CHECK(alloc_update_staging(e));
  size_t ws = 0;
  TS_ENGINE_FOR_UNITS(e, u) {
    size_t w = ts_unit_workspace_bytes(m, u, B, T, e->opts.dtype, dev);
    if (w > ws) ws = w;
  }
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_WORKSPACE, ws, &e->ctx.workspace));
  e->ctx.workspace_bytes = ws;
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_COMM, e->scratch_bytes, &e->scratch));
  TS_CHECK(alloc_slot(e, 0, 0));
  e->batch.tokens = e->slots[0].tokens;
  e->batch.targets = e->slots[0].targets;
  /* The host's batch (ts_engine_batch): the same buffers on the CPU, host
   * staging (the ledger's CPU account) beside a device's. */
  e->batch.host_tokens = e->batch.tokens;
  e->batch.host_targets = e->batch.targets;
  if (dev != TS_DEVICE_CPU) {
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, B * T * 4,
                             (void **)&e->batch.host_tokens));
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, B * T * 4,
                             (void **)&e->batch.host_targets));
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_ACTIVATIONS, 2 * B * T * 4,
                             (void **)&e->batch.staging));
    TS_CHECK(ts_k_host_register(&e->ctx, e->batch.staging, 2 * B * T * 4));
  }
  for (int i = 0; i < 2; i++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_ACTIVATIONS, B * T * C * es, &e->dbuf[i]));
  size_t rb = 0;
  for (int c = 0; c < e->pipe.chunks; c++) {
    size_t b = ts_engine_recompute_bytes(m, &e->opts, e->pipe.c_begin[c], e->pipe.c_end[c]);
    if (b > rb) rb = b;
  }
  TS_CHECK(ts_ledger_alloc(&e->ledger, dev, TS_MEM_ACTIVATIONS, rb, &e->recompute_saved));
  wgrad_mem(e, rb);
  for (int c = 0; c < e->pipe.chunks; c++) /* a pipeline's others */
    for (int k = c ? e->pipe.slot0[c] : 1; k < e->pipe.slot0[c] + e->pipe.nslot[c]; k++)
      TS_CHECK(alloc_slot(e, k, c));
  if (e->opts.async_save) { /* host memory, whatever the device: the ledger's CPU account */
    TS_CHECK(ts_checkpoint_staging_bytes(e, &e->ckpt.staging_bytes));
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_DEVICE_CPU, TS_MEM_STAGING, e->ckpt.staging_bytes,
                             &e->ckpt.staging));
    if (dev != TS_DEVICE_CPU)
      TS_CHECK(ts_k_host_register(&e->ctx, e->ckpt.staging, e->ckpt.staging_bytes));
  }
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
  /* a negative bound would silently turn clipping off (0 is "no clipping") */
  if (!(opts->grad_clip >= 0) || !isfinite(opts->grad_clip))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`grad_clip` %g: expected a gradient-norm bound >= 0 (0: no clipping)",
                        (double)opts->grad_clip);
  if (!(opts->weight_decay >= 0) || !isfinite(opts->weight_decay))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`weight_decay` %g: expected a finite number >= 0",
                        (double)opts->weight_decay);
  if (opts->comm < TS_ENGINE_COMM_AUTO || opts->comm > TS_ENGINE_COMM_NCCL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`comm` %d: expected auto, mpi, staged or nccl",
                        opts->comm);
  if (opts->offload_optimizer != 0 && opts->offload_optimizer != 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`offload_optimizer` %d: expected 0 or 1",
                        opts->offload_optimizer);
  if (opts->offload_params != 0 && opts->offload_params != 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`offload_params` %d: expected 0 or 1",
                        opts->offload_params);
  if (opts->offload_params && opts->zero_stage != 3)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`offload_params` at ZeRO stage %d: expected stage 3 (the parameters "
                        "sharded)",
                        opts->zero_stage);
  if (opts->offload_params && !opts->offload_optimizer)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`offload_params` without `offload_optimizer`: expected both (the host's "
                        "AdamW writes the host's parameters)");
  if (opts->virtual_stages < 0 || opts->virtual_stages > TS_ENGINE_MAX_CHUNKS)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`virtual_stages` %d: expected 1 to %d model chunks per rank",
                        opts->virtual_stages, TS_ENGINE_MAX_CHUNKS);
  if (opts->schedule == TS_SCHEDULE_INTERLEAVED) {
    if (opts->pipeline_stages < 2)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "schedule interleaved with %d pipeline stage: expected 2 or more",
                          opts->pipeline_stages);
    if (opts->virtual_stages < 2)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "schedule interleaved with `virtual_stages` %d: expected 2 to %d model "
                          "chunks per rank (1 is 1f1b)",
                          opts->virtual_stages, TS_ENGINE_MAX_CHUNKS);
    if (opts->grad_accum % (size_t)opts->pipeline_stages)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "schedule interleaved: `grad_accum` %zu micro-batches on %d pipeline "
                          "stages: expected a multiple of %d",
                          opts->grad_accum, opts->pipeline_stages, opts->pipeline_stages);
  } else if (opts->schedule == TS_SCHEDULE_ZB_H1 && opts->pipeline_stages < 2) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule zb-h1 with %d pipeline stage: expected 2 or more",
                        opts->pipeline_stages);
  } else if (opts->schedule == TS_SCHEDULE_ZBV) {
    if (opts->pipeline_stages < 2)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "schedule zbv with %d pipeline stage: expected 2 or more",
                          opts->pipeline_stages);
    if (opts->virtual_stages > 2)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "schedule zbv with `virtual_stages` %d: expected 2 (ZB-V places two "
                          "model chunks per rank in a V)",
                          opts->virtual_stages);
  } else if (opts->virtual_stages > 1) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`virtual_stages` %d with schedule %s: expected 1 (more model chunks per "
                        "rank need the interleaved schedule)",
                        opts->virtual_stages, ts_schedule_kind_name(opts->schedule));
  }
  if (opts->offload_params && opts->pipeline_stages > 1)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "`offload_params` with %d pipeline stages: not built; expected 1",
                        opts->pipeline_stages);
  if (opts->offload_dir && !opts->offload_dir[0])
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`offload_dir` \"\": expected a folder");
  if (opts->offload_piece % 1024 || opts->offload_piece > ((size_t)1 << 40))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`offload_piece` %zu: expected 0 (the default) or a multiple of 1024 "
                        "elements up to 2^40",
                        opts->offload_piece);
  if (opts->comm == TS_ENGINE_COMM_NCCL && opts->device == TS_DEVICE_CPU)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`comm` nccl moves GPU memory only; on cpu use mpi (or auto)");
  if (opts->comm == TS_ENGINE_COMM_MPI && opts->device != TS_DEVICE_CPU)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`comm` mpi moves host memory only; on %s use staged (or auto)",
                        ts_device_name(opts->device));
  if (opts->shard_group < 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`shard_group` %d: expected 0 (shard over every data-parallel rank) or a "
                        "group size >= 1",
                        opts->shard_group);
  if (opts->comm_chunk_bytes != 0 && opts->comm_chunk_bytes < TS_COMM_STAGING_MIN_PIECE)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`comm_chunk_bytes` %zu: expected 0 (1 MiB) or at least %d bytes",
                        opts->comm_chunk_bytes, TS_COMM_STAGING_MIN_PIECE);
  return ts_engine_check_zero_stage(opts->zero_stage);
}

const char *ts_engine_comm_name(int comm) {
  switch (comm) {
    case TS_ENGINE_COMM_AUTO: return "auto";
    case TS_ENGINE_COMM_MPI: return "mpi";
    case TS_ENGINE_COMM_STAGED: return "staged";
    case TS_ENGINE_COMM_NCCL: return "nccl";
    default: return "?";
  }
}

ts_engine_comm_kind ts_engine_comm_resolve(const ts_engine_opts *opts) {
  if (opts->comm != TS_ENGINE_COMM_AUTO) return (ts_engine_comm_kind)opts->comm;
  if (opts->device == TS_DEVICE_CPU) return TS_ENGINE_COMM_MPI;
  return opts->gpu_shared ? TS_ENGINE_COMM_STAGED : TS_ENGINE_COMM_NCCL;
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
  ts_status st = ts_loss_scaler_init(&e->optim.scaler, opts->dtype, opts->loss_scale,
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
  e->pipe.stages = 1; /* no pipelining until ts_engine_set_stage */
  e->pipe.lender = tied_lender(model);
  e->rs_pending = -1;
  e->pipe.chunks = 1; /* one chunk of every unit, one slot */
  e->pipe.c_begin[0] = 0;
  e->pipe.c_end[0] = model->n_units;
  e->pipe.slot0[0] = 0;
  e->pipe.nslot[0] = 1;
  e->n_slots = 1;
  e->replicas = 1;
  ts_ledger_init(&e->ledger);
  *out = e;
  return TS_OK;
}

int ts_engine_shard_size(const ts_engine_opts *opts, int dp_size) {
  int S = opts->shard_group;
  return S > 0 && S < dp_size ? S : dp_size;
}

ts_status ts_engine_check_shard_group(const ts_engine_opts *opts, int dp_size) {
  int S = opts->shard_group;
  if (S == 0 || (S <= dp_size && dp_size % S == 0)) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "`shard_group` %d: expected a divisor of the %d data-parallel rank%s "
                      "(groups of S consecutive ranks)",
                      S, dp_size, dp_size == 1 ? "" : "s");
}

/* Hybrid sharding (opts.shard_group S < N, the size of dp): dp cut into
 * its N/S groups of S consecutive ranks ("shard": the engine's dp from
 * here) and, across them, the ranks of the same place in each group
 * ("replica", ordered by group). Collective over dp: every rank makes both
 * splits. A no-op for plain ZeRO. */
static ts_status make_hybrid(ts_engine *e, ts_comm *dp) {
  int N = ts_comm_size(dp), r = ts_comm_rank(dp);
  TS_CHECK(ts_engine_check_shard_group(&e->opts, N));
  int S = ts_engine_shard_size(&e->opts, N);
  if (S == N) return TS_OK;
  ts_status st = ts_comm_split(dp, r / S, r % S, "shard", &e->own_shard);
  ts_status st2 = ts_comm_split(dp, r % S, r / S, "replica", &e->own_rep);
  TS_CHECK(st);
  TS_CHECK(st2);
  e->dp = e->own_shard;
  e->rep = e->own_rep;
  e->rank = r % S;
  e->dp_size = S;
  e->replicas = N / S;
  e->rep_rank = r / S;
  return TS_OK;
}

ts_status ts_engine_create_stage(ts_engine **out, const ts_model *model,
                                 const ts_engine_opts *opts, ts_comm *dp, ts_comm *pp, int stage) {
  *out = NULL;
  ts_engine *e;
  TS_CHECK(ts_engine_new(model, opts, &e));
  /* NCCL's set-up is collective over dp (comm/nccl.h), and so is its
   * teardown: the ranks agree before it (a rank that failed earlier never
   * reaches it) and after the allocations (a rank that fails alone would
   * tear down alone). */
  int collective = dp && ts_comm_size(dp) > 1 && ts_engine_dp_on_nccl(opts, ts_comm_size(dp));
  ts_status st = ts_k_context_init(&e->ctx, e->device, opts->device_index);
  if (st == TS_OK && !dp) st = ts_comm_self(&e->own_comm);
  if (st == TS_OK) {
    e->dp = dp ? dp : e->own_comm;
    e->pipe.pp = pp;
    e->rank = ts_comm_rank(e->dp);
    e->dp_size = ts_comm_size(e->dp);
    st = make_hybrid(e, e->dp);
    if (st == TS_OK) st = ts_engine_set_stage(e, stage);
  }
  if (collective) st = ts_comm_agree(dp, st, "setting up the engine", NULL);
  if (st == TS_OK) st = ts_engine_lend_memory(e);
  if (st == TS_OK && e->device != TS_DEVICE_CPU) st = ts_engine_prepare_device(e);
  if (st == TS_OK) st = ts_engine_alloc(e);
  if (collective && ts_engine_dp_lent(e)) st = ts_comm_agree(dp, st, "creating the engine", NULL);
  /* On NCCL the communication stream is the overlap: no thread. */
  if (st == TS_OK && opts->overlap && e->dp_size > 1 &&
      (e->device == TS_DEVICE_CPU || ts_engine_comm_resolve(opts) == TS_ENGINE_COMM_STAGED)) {
    /* A group that cannot have a thread (MPI without MPI_THREAD_MULTIPLE)
     * runs the same order without one: the bits and the plan are the same.
     * Beside a GPU the thread's staging copies run on the step's stream,
     * each after the work queued before it (CUDA streams take work from
     * any host thread; a copy needs no current device). */
    e->comm_thread = ts_comm_set_thread(e->dp, 1) == TS_OK;
  }
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
  ts_engine_lending_sync(e);
  ts_checkpoint_abandon(e->ckpt.pending); /* a save still in flight: joined, not committed */
  const ts_engine_hooks *h = ts_engine_get_hooks();
  if (h && h->release) h->release(h->user, e);
  ts_engine_wait_sends(e); /* no send may still read a buffer */
  ts_engine_wait_all(e);   /* nor a collective write one */
  ts_engine_drop_observers(e); /* no group keeps the engine's watcher */
  ts_offload_close(e);         /* its writes ended, its slots freed */
  if (e->comm_thread) ts_comm_set_thread(e->dp, 0);
  if (e->units) {
    for (int u = 0; u < e->model->n_units; u++) {
      unit_state *s = &e->units[u];
      if (ts_engine_state_on_host(e)) {
        void *const state[3] = {s->master, s->m, s->v};
        unlock_host(e, state, 3);
      }
      if (ts_engine_params_on_host(e)) unlock_host(e, &s->params, 1);
      ts_engine_free_model_state(&e->ledger, s);
      ts_shard_release(&e->ledger, &s->full_params);
      ts_shard_release(&e->ledger, &s->full_grads);
    }
  }
  ts_shard_release(&e->ledger, &e->pipe.tied_grads);
  void *const staging[2] = {e->update.host_grad, e->update.host_param};
  unlock_host(e, staging, 2);
  ts_ledger_free(&e->ledger, e->update.host_grad);
  ts_ledger_free(&e->ledger, e->update.host_param);
  if (e->slots)
    for (int k = 0; k < e->n_slots; k++) free_slot(e, &e->slots[k]);
  if (e->batch.host_tokens != e->batch.tokens) ts_ledger_free(&e->ledger, e->batch.host_tokens);
  if (e->batch.staging) {
    ts_k_host_wait(&e->ctx); /* no copy may still read it */
    ts_k_host_unregister(&e->ctx, e->batch.staging);
    ts_ledger_free(&e->ledger, e->batch.staging);
  }
  if (e->ckpt.staging) {
    if (e->device != TS_DEVICE_CPU) ts_k_host_unregister(&e->ctx, e->ckpt.staging);
    ts_ledger_free(&e->ledger, e->ckpt.staging);
  }
  ts_engine_unlend_memory(e);
  if (e->batch.host_targets != e->batch.targets) ts_ledger_free(&e->ledger, e->batch.host_targets);
  ts_ledger_free(&e->ledger, e->dbuf[0]);
  ts_ledger_free(&e->ledger, e->dbuf[1]);
  ts_ledger_free(&e->ledger, e->ctx.workspace);
  ts_ledger_free(&e->ledger, e->scratch);
  ts_ledger_free(&e->ledger, e->recompute_saved);
  if (e->device == TS_DEVICE_CPU) free(e->sc.block);
  else ts_ledger_free(&e->ledger, e->sc.block);
  free(e->sc.host);
  free(e->sc.part);
  ts_ledger_release(&e->ledger);
  ts_k_context_destroy(&e->ctx);
  ts_comm_free(e->own_shard);
  ts_comm_free(e->own_rep);
  ts_comm_free(e->own_comm);
  ts_comm_free(e->pipe.own_pp);
  free(e->units);
  free(e->slots);
  ts_schedule_free(&e->pipe.sched);
  free(e->pipe.program.actions);
  free(e);
}

/* ---- accessors --------------------------------------------------------------------- */

const ts_mem_account *ts_engine_memory(const ts_engine *e) {
  return ts_ledger_account(&e->ledger, e->device);
}

const ts_mem_account *ts_engine_disk(const ts_engine *e) { return ts_ledger_disk_account(&e->ledger); }

const ts_mem_account *ts_engine_host_memory(const ts_engine *e) {
  return ts_ledger_account(&e->ledger, TS_DEVICE_CPU);
}

void ts_engine_batch(ts_engine *e, int32_t **inputs, int32_t **targets) {
  *inputs = e->batch.host_tokens;
  *targets = e->batch.host_targets;
}

const ts_flat_layout *ts_engine_layout(const ts_engine *e, int u) {
  TS_ASSERT(u >= 0 && u < e->model->n_units);
  return &e->units[u].layout;
}

float ts_engine_loss_scale(const ts_engine *e) { return e->optim.scaler.scale; }

const ts_engine_opts *ts_engine_options(const ts_engine *e) { return &e->opts; }

ts_comm *ts_engine_comm(const ts_engine *e) { return e->dp; }

int ts_engine_num_units(const ts_engine *e) { return e->model->n_units; }

int ts_engine_stage_units(const ts_engine *e, int *begin, int *end) {
  *begin = e->pipe.c_begin[0];
  *end = e->pipe.c_end[0];
  return e->pipe.stage;
}

int ts_engine_chunks(const ts_engine *e) { return e->pipe.chunks; }

void ts_engine_chunk_units(const ts_engine *e, int c, int *begin, int *end) {
  TS_ASSERT(c >= 0 && c < e->pipe.chunks);
  *begin = e->pipe.c_begin[c];
  *end = e->pipe.c_end[c];
}

int ts_engine_computes_unit(const ts_engine *e, int u) { return ts_engine_owns(e, u); }

/* The test seam (engine_testing.h): NULL in training. */
static const ts_engine_hooks *g_hooks;

void ts_engine_set_hooks(const ts_engine_hooks *hooks) { g_hooks = hooks; }

const ts_engine_hooks *ts_engine_get_hooks(void) { return g_hooks; }

const ts_model *ts_engine_model(const ts_engine *e) { return e->model; }

const ts_kctx *ts_engine_context(const ts_engine *e) { return &e->ctx; }

/* engine.c — one rank's training step over the units of a model.
 * See engine.h for ownership and the loss convention. */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_testing.h"
#include "shard/collect.h"

typedef struct unit_state {
  ts_flat_layout layout; /* offsets, padding P, shard S for the N ranks */
  void *params;          /* compute dtype: stages 0-2 (P), stage 3 (S) */
  void *grads;           /* compute dtype: stages 0-1 (P), stages 2-3 (S) */
  float *master;         /* fp32, NULL in fp32: stage 0 (P), stages 1-3 (S) */
  float *m, *v;          /* fp32 Adam moments: stage 0 (P), stages 1-3 (S) */
  void *saved;           /* ts_llama_saved_bytes() of one micro-batch; NULL when
                            checkpointed (the engine's recompute_saved serves) */
  int recompute;              /* activation checkpointing: recompute before backward */
  void *full_params;     /* stage 3: (P) gathered while uses > 0, else NULL */
  int uses;              /* stage 3: holders of full_params */
  void *full_grads;      /* stages 2-3: (P) from the unit's (or the tied head's)
                            backward to its reduce-scatter, else NULL */
} unit_state;

struct ts_engine {
  const ts_llama *model;
  ts_engine_opts opts;
  ts_ledger ledger;
  ts_kctx ctx;           /* CPU, with the workspace */
  ts_comm *dp;           /* data-parallel group (borrowed or own_comm) */
  ts_comm *own_comm;     /* the one-rank group made when none was given */
  int rank, world;       /* this rank r and N */
  int stage;             /* ZeRO stage 0-3 */
  size_t es;             /* bytes per compute element */
  void *scratch;         /* reduce-scatter scratch, (N-1) * max S elements */
  size_t scratch_bytes;
  unit_state *units;     /* [n_units] */
  void **acts;           /* [n_units] input of unit u (B, T, C), acts[0] unused */
  int32_t *tokens;       /* (B, T) inputs of the current micro-batch */
  int32_t *targets;      /* (B, T) */
  void *dbuf[2];         /* (B, T, C) activation gradients, ping-pong */
  void *recompute_saved;      /* saved activations of the checkpointed unit in use */
  int micro_done;        /* micro-steps since the last optimizer step */
  int step;              /* optimizer updates applied (AdamW's t) */
  int attempts;          /* optimizer steps finished, skipped ones included */
  /* Loss scaling (fp16; scale 1 and no checks otherwise). */
  int scaling;           /* 1: fp16, gradients carry loss_scale */
  int dynamic;           /* 1: the scale adapts */
  float loss_scale;
  size_t clean_steps;    /* consecutive steps without overflow */
  struct {
    int step;            /* attempt at which the scale became `scale` */
    float scale;
  } history[8];          /* ring of the recent scale changes */
  int n_history;         /* changes recorded so far */
  int plan;              /* 1: ts_engine_plan: allocations charged to a plan
                            ledger, no compute, no communication */
  ts_engine_inject inject[4]; /* test hook (engine_testing.h) */
  int n_inject;
  double loss_acc;       /* sum of this rank's micro-batch mean losses this step */
  ts_comm_counters step_start; /* counters when the current step began */
};

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
  return o;
}

int ts_engine_is_recomputed(const ts_llama *m, const ts_engine_opts *o, int u) {
  const ts_unit *un = &m->units[u];
  return o->recompute_every > 0 && un->kind == TS_UNIT_BLOCK && (size_t)un->layer % o->recompute_every == 0;
}

/* The recompute buffer: the largest saved bytes of a checkpointed unit
 * (0 when none is). */
static size_t recompute_bytes(const ts_llama *m, const ts_engine_opts *o) {
  size_t recompute = 0;
  for (int u = 0; u < m->n_units; u++) {
    size_t saved = ts_llama_saved_bytes(m, u, o->micro_batch, o->seq, o->dtype);
    if (ts_engine_is_recomputed(m, o, u) && saved > recompute) recompute = saved;
  }
  return recompute;
}

size_t ts_engine_activation_bytes(const ts_llama *m, const ts_engine_opts *o) {
  size_t B = o->micro_batch, T = o->seq, C = m->cfg.hidden_size, es = ts_dtype_size(o->dtype);
  size_t bytes = 2 * B * T * 4 + ((size_t)m->n_units - 1 + 2) * B * T * C * es;
  for (int u = 0; u < m->n_units; u++)
    if (!ts_engine_is_recomputed(m, o, u)) bytes += ts_llama_saved_bytes(m, u, B, T, o->dtype);
  return bytes + recompute_bytes(m, o);
}

/* First flat element of this rank's shard of unit u. */
static size_t shard_begin(const ts_engine *e, int u) {
  return ts_flat_shard_begin(&e->units[u].layout, (size_t)e->rank);
}

/* This rank's gradient shard (S) of unit u: its own buffer in stages 2-3,
 * its slice of the full gradient in stages 0-1. */
static void *grad_shard(const ts_engine *e, int u) {
  const unit_state *s = &e->units[u];
  return e->stage >= 2 ? s->grads : (char *)s->grads + shard_begin(e, u) * e->es;
}

/* The elements [*b, *end) (flat offsets) of tensor i of unit u that this
 * rank holds in a buffer that is the full unit (sharded == 0) or its shard. */
static void held_range(const ts_engine *e, int u, int i, int sharded, size_t *b, size_t *end) {
  const ts_tensor_spec *t = &e->model->units[u].tensors[i];
  *b = t->offset;
  *end = t->offset + t->numel;
  if (sharded) ts_flat_shard_overlap(&e->units[u].layout, (size_t)i, (size_t)e->rank, b, end);
}

/* Initialises unit u's parameters (identical on every rank: the full unit
 * is initialised and each rank keeps its part). */
static ts_status init_unit(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  size_t P = s->layout.padded, S = s->layout.shard, r0 = shard_begin(e, u);
  ts_dtype dt = e->opts.dtype;
  if (dt == TS_FP32 && e->stage < 3)
    return e->plan ? TS_OK : ts_llama_init_unit(e->model, u, s->params, TS_FP32, e->opts.seed);
  /* A transient full fp32 copy of the unit, scratch of initialisation
   * (workspace), so that the model-state categories hold model state only. */
  float *full;
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_WORKSPACE, P * 4, (void **)&full));
  if (e->plan) {
    ts_ledger_free(&e->ledger, full);
    return TS_OK;
  }
  ts_status st = ts_llama_init_unit(e->model, u, full, TS_FP32, e->opts.seed);
  if (st == TS_OK && s->master)
    memcpy(s->master, e->stage == 0 ? full : full + r0, (e->stage == 0 ? P : S) * 4);
  if (st == TS_OK)
    st = e->stage == 3 ? ts_k_cast(&e->ctx, s->params, dt, full + r0, TS_FP32, S)
                       : ts_k_cast(&e->ctx, s->params, dt, full, TS_FP32, P);
  ts_ledger_free(&e->ledger, full);
  return st;
}

/* The model state of one flat buffer of layout l at `stage` in dt (the
 * table in engine.h): s->params, grads, master (NULL in fp32), m, v. */
static ts_status alloc_model_state(ts_ledger *ledger, const ts_flat_layout *l, int stage,
                                   ts_dtype dt, unit_state *s) {
  size_t P = l->padded, S = l->shard, es = ts_dtype_size(dt);
  TS_CHECK(ts_ledger_alloc(ledger, TS_MEM_PARAMS, (stage == 3 ? S : P) * es, &s->params));
  TS_CHECK(ts_ledger_alloc(ledger, TS_MEM_GRADS, (stage >= 2 ? S : P) * es, &s->grads));
  size_t n_opt = stage >= 1 ? S : P;
  if (dt != TS_FP32)
    TS_CHECK(ts_ledger_alloc(ledger, TS_MEM_MASTER, n_opt * 4, (void **)&s->master));
  TS_CHECK(ts_ledger_alloc(ledger, TS_MEM_OPTIM, n_opt * 4, (void **)&s->m));
  TS_CHECK(ts_ledger_alloc(ledger, TS_MEM_OPTIM, n_opt * 4, (void **)&s->v));
  return TS_OK;
}

static void free_model_state(ts_ledger *ledger, unit_state *s) {
  ts_ledger_free(ledger, s->params);
  ts_ledger_free(ledger, s->grads);
  ts_ledger_free(ledger, s->master);
  ts_ledger_free(ledger, s->m);
  ts_ledger_free(ledger, s->v);
}

/* The checks shared by create and the plans: a ZeRO stage 0-3, and (plans)
 * a world of 1 .. INT32_MAX ranks. */
static ts_status check_stage(int zero_stage) {
  if (zero_stage < 0 || zero_stage > 3)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--zero %d: expected a ZeRO stage 0, 1, 2 or 3",
                        zero_stage);
  return TS_OK;
}

static ts_status check_world(size_t world) {
  if (world < 1 || world > (size_t)INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "-n %zu: expected a number of ranks from 1 to %d", world, INT32_MAX);
  return TS_OK;
}

ts_status ts_engine_plan_params(size_t psi, ts_dtype dtype, int zero_stage, size_t world,
                                ts_ledger *out) {
  ts_ledger_init_plan(out);
  TS_CHECK(check_world(world));
  TS_CHECK(check_stage(zero_stage));
  ts_flat_layout l;
  TS_CHECK(ts_flat_layout_init(&l, &psi, 1, world));
  unit_state s;
  memset(&s, 0, sizeof s);
  ts_status st = alloc_model_state(out, &l, zero_stage, dtype, &s);
  ts_ledger plan = *out;
  free_model_state(out, &s);
  if (st == TS_OK) *out = plan;
  return st;
}

static ts_status alloc_unit(ts_engine *e, int u) {
  const ts_unit *un = &e->model->units[u];
  unit_state *s = &e->units[u];
  size_t numels[TS_UNIT_MAX_TENSORS];
  for (int i = 0; i < un->n_tensors; i++) numels[i] = un->tensors[i].numel;
  TS_CHECK(ts_flat_layout_init(&s->layout, numels, (size_t)un->n_tensors, (size_t)e->world));
  TS_CHECK(alloc_model_state(&e->ledger, &s->layout, e->stage, e->opts.dtype, s));
  s->recompute = ts_engine_is_recomputed(e->model, &e->opts, u);
  size_t saved = ts_llama_saved_bytes(e->model, u, e->opts.micro_batch, e->opts.seq, e->opts.dtype);
  if (!s->recompute) TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, saved, &s->saved));
  size_t sb = ts_shard_scratch_bytes(&s->layout, e->opts.dtype);
  if (sb > e->scratch_bytes) e->scratch_bytes = sb;
  return init_unit(e, u);
}

static ts_status create(ts_engine *e) {
  const ts_llama *m = e->model;
  size_t B = e->opts.micro_batch, T = e->opts.seq, C = m->cfg.hidden_size, es = e->es;
  e->units = calloc((size_t)m->n_units, sizeof *e->units);
  e->acts = calloc((size_t)m->n_units, sizeof *e->acts);
  if (!e->units || !e->acts) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: unit tables");
  /* Units first: their initialisation scratch (workspace category) is gone
   * before the kernel workspace exists, so the category's peak is the
   * larger of the two, not their sum. */
  for (int u = 0; u < m->n_units; u++) TS_CHECK(alloc_unit(e, u));
  size_t ws = 0;
  for (int u = 0; u < m->n_units; u++) {
    size_t w = ts_llama_workspace_bytes(m, u, B, T, e->opts.dtype, TS_DEVICE_CPU);
    if (w > ws) ws = w;
  }
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_WORKSPACE, ws, &e->ctx.workspace));
  e->ctx.workspace_bytes = ws;
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_COMM, e->scratch_bytes, &e->scratch));
  for (int u = 1; u < m->n_units; u++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->acts[u]));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->tokens));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->targets));
  for (int i = 0; i < 2; i++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->dbuf[i]));
  size_t recompute = recompute_bytes(m, &e->opts);
  if (recompute) TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, recompute, &e->recompute_saved));
  return TS_OK;
}

/* Checks the loss-scaling options (fp16 only) and sets the initial scale. */
static ts_status init_scaler(ts_engine *e) {
  const ts_engine_opts *o = &e->opts;
  e->loss_scale = 1.0f;
  if (o->dtype != TS_FP16) return TS_OK;
  if (!(o->loss_scale >= 0 && isfinite(o->loss_scale)))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--loss-scale %g: expected 'dynamic' or a finite scale > 0",
                        (double)o->loss_scale);
  e->scaling = 1;
  e->dynamic = o->loss_scale == 0;
  e->loss_scale = e->dynamic ? o->loss_scale_init : o->loss_scale;
  if (e->dynamic &&
      !(o->min_loss_scale > 0 && isfinite(o->loss_scale_init) &&
        o->loss_scale_init >= o->min_loss_scale && o->loss_scale_window >= 1))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "dynamic loss scale: initial %g, --min-loss-scale %g, "
                        "--loss-scale-window %zu: expected 0 < minimum <= initial and window >= 1",
                        (double)o->loss_scale_init, (double)o->min_loss_scale,
                        o->loss_scale_window);
  e->history[0].step = 0;
  e->history[0].scale = e->loss_scale;
  e->n_history = 1;
  return TS_OK;
}

/* The argument checks of ts_engine_create and ts_engine_plan. */
static ts_status check_opts(const ts_llama *model, const ts_engine_opts *opts) {
  if (opts->micro_batch == 0 || opts->seq == 0 || opts->grad_accum == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--micro-batch %zu, --seq %zu, --grad-accum %zu: expected each >= 1",
                        opts->micro_batch, opts->seq, opts->grad_accum);
  if (opts->seq > model->cfg.max_position_embeddings)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--seq %zu: expected at most max_position_embeddings = %zu of %s",
                        opts->seq, model->cfg.max_position_embeddings,
                        ts_llama_config_origin(&model->cfg));
  return check_stage(opts->zero_stage);
}

/* A zeroed engine for model and opts (checked), its ledger not yet set. */
static ts_status engine_new(const ts_llama *model, const ts_engine_opts *opts, ts_engine **out) {
  *out = NULL;
  TS_CHECK(check_opts(model, opts));
  ts_engine *e = calloc(1, sizeof *e);
  if (!e) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: cannot allocate");
  e->model = model;
  e->opts = *opts;
  e->ctx.device = TS_DEVICE_CPU;
  e->stage = opts->zero_stage;
  e->es = ts_dtype_size(opts->dtype);
  *out = e;
  return TS_OK;
}

ts_status ts_engine_create(ts_engine **out, const ts_llama *model, const ts_engine_opts *opts,
                           ts_comm *dp) {
  *out = NULL;
  ts_engine *e;
  TS_CHECK(engine_new(model, opts, &e));
  ts_ledger_init(&e->ledger);
  ts_status st = TS_OK;
  if (!dp) st = ts_comm_self(&e->own_comm);
  if (st == TS_OK) {
    e->dp = dp ? dp : e->own_comm;
    e->rank = ts_comm_rank(e->dp);
    e->world = ts_comm_size(e->dp);
    st = init_scaler(e);
    if (st == TS_OK) st = create(e);
  }
  if (st != TS_OK) {
    ts_engine_free(e);
    return st;
  }
  *out = e;
  return TS_OK;
}

void ts_engine_free(ts_engine *e) {
  if (!e) return;
  if (e->units) {
    for (int u = 0; u < e->model->n_units; u++) {
      unit_state *s = &e->units[u];
      free_model_state(&e->ledger, s);
      ts_ledger_free(&e->ledger, s->saved);
      ts_ledger_free(&e->ledger, s->full_params);
      ts_ledger_free(&e->ledger, s->full_grads);
    }
  }
  if (e->acts)
    for (int u = 1; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, e->acts[u]);
  ts_ledger_free(&e->ledger, e->tokens);
  ts_ledger_free(&e->ledger, e->targets);
  ts_ledger_free(&e->ledger, e->dbuf[0]);
  ts_ledger_free(&e->ledger, e->dbuf[1]);
  ts_ledger_free(&e->ledger, e->ctx.workspace);
  ts_ledger_free(&e->ledger, e->scratch);
  ts_ledger_free(&e->ledger, e->recompute_saved);
  ts_comm_free(e->own_comm);
  free(e->units);
  free(e->acts);
  free(e);
}

/* The full parameters (P) of unit u for a forward or backward: stage 3
 * all-gathers them on first use (every rank does the same calls), other
 * stages hold them. Pair with release_params. */
static ts_status acquire_params(ts_engine *e, int u, const void **full) {
  unit_state *s = &e->units[u];
  if (e->stage == 3) {
    if (s->uses == 0)
      TS_CHECK(ts_shard_gather_alloc(&e->ledger, TS_MEM_PARAMS, e->dp, &s->layout, s->params,
                                     e->opts.dtype, &s->full_params));
    s->uses++;
    *full = s->full_params;
  } else {
    *full = s->params;
  }
  return TS_OK;
}

/* Stage 3: drops one use of unit u's gathered parameters; frees them at 0. */
static void release_params(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->stage == 3 && s->uses > 0 && --s->uses == 0)
    ts_shard_release(&e->ledger, &s->full_params);
}

/* The full gradient (P) that unit u's backward accumulates into: the
 * unit's own buffer in stages 0-1, a zeroed transient one in stages 2-3. */
static ts_status full_grads(ts_engine *e, int u, void **out) {
  unit_state *s = &e->units[u];
  if (e->stage < 2) {
    *out = s->grads;
    return TS_OK;
  }
  if (!s->full_grads)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_GRADS, s->layout.padded * e->es,
                             &s->full_grads));
  *out = s->full_grads;
  return TS_OK;
}

/* Stages 2-3, after unit u's backward: reduce-scatter its full gradient
 * into the shard (adding to it after the first micro-batch) and free it. */
static ts_status reduce_unit_grads(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->stage < 2) return TS_OK;
  ts_status st = e->plan ? TS_OK
                         : ts_shard_reduce_scatter(e->dp, &s->layout, s->full_grads, s->grads,
                                                   e->opts.dtype, e->micro_done > 0, e->scratch,
                                                   e->scratch_bytes);
  ts_shard_release(&e->ledger, &s->full_grads);
  return st;
}

/* Arguments common to every unit call of this micro-batch. */
static ts_unit_args base_args(const ts_engine *e) {
  ts_unit_args a;
  memset(&a, 0, sizeof a);
  a.B = e->opts.micro_batch;
  a.T = e->opts.seq;
  a.dt = e->opts.dtype;
  a.tokens = e->tokens;
  a.targets = e->targets;
  return a;
}

/* The head of a tied model uses the embedding's weight (and gradient). */
static int uses_tied(const ts_engine *e, int u) {
  return e->model->cfg.tie_word_embeddings && u == e->model->n_units - 1;
}

/* Forward of unit u with parameters acquired (and the tied weight). */
static ts_status forward_unit(ts_engine *e, int u, ts_unit_args *a) {
  const void *params, *tied = NULL;
  TS_CHECK(acquire_params(e, u, &params));
  ts_status st = uses_tied(e, u) ? acquire_params(e, 0, &tied) : TS_OK;
  if (st == TS_OK && !e->plan) {
    a->tied_weight = tied;
    st = ts_llama_forward(e->model, u, &e->ctx, params, a);
  }
  if (tied) release_params(e, 0);
  release_params(e, u);
  return st;
}

/* Forward over all units; the head's loss lands in *head. */
static ts_status forward(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                         ts_unit_args *head) {
  size_t BT = e->opts.micro_batch * e->opts.seq;
  if (inputs != e->tokens) memcpy(e->tokens, inputs, BT * sizeof *inputs);
  if (targets != e->targets) memcpy(e->targets, targets, BT * sizeof *targets);
  int n = e->model->n_units;
  for (int u = 0; u < n; u++) {
    ts_unit_args a = base_args(e);
    a.x = u > 0 ? e->acts[u] : NULL;
    a.y = u + 1 < n ? e->acts[u + 1] : NULL;
    a.saved = e->units[u].recompute ? e->recompute_saved : e->units[u].saved;
    TS_CHECK(forward_unit(e, u, &a));
    if (u == n - 1) *head = a;
  }
  return TS_OK;
}

/* The arithmetic of unit u's backward (with its recompute when
 * checkpointed, and the test hook), on acquired buffers. */
static ts_status backward_compute(ts_engine *e, int u, ts_unit_args *a, const void *params,
                                  void *grads, const void *tied) {
  ts_status st = TS_OK;
  if (e->units[u].recompute) {
    /* Recompute: the forward again, from the kept input, with the same
     * (in stage 3: the same gathered) parameters. It rewrites the unit's
     * output, acts[u + 1], with the same bits; unit u + 1 is done with it. */
    ts_unit_args f = *a;
    f.y = e->acts[u + 1];
    st = ts_llama_forward(e->model, u, &e->ctx, params, &f);
  }
  if (st == TS_OK) {
    a->tied_weight = tied;
    st = ts_llama_backward(e->model, u, &e->ctx, params, grads, a);
  }
  for (int k = 0; st == TS_OK && k < e->n_inject; k++)
    if (e->inject[k].step == e->attempts + 1 && e->inject[k].unit == u) {
      const ts_tensor_spec *t = &e->model->units[u].tensors[e->inject[k].tensor];
      st = ts_k_cast(&e->ctx, (char *)grads + t->offset * e->es, e->opts.dtype,
                     &e->inject[k].value, TS_FP32, 1);
    }
  return st;
}

/* Backward of unit u: parameters acquired, gradients accumulated into the
 * full gradient (and the embedding's, tied), then reduced (stages 2-3). */
static ts_status backward_unit(ts_engine *e, int u, ts_unit_args *a) {
  const void *params, *tied = NULL;
  void *grads;
  TS_CHECK(acquire_params(e, u, &params));
  ts_status st = full_grads(e, u, &grads);
  if (st == TS_OK && uses_tied(e, u)) {
    st = acquire_params(e, 0, &tied);
    if (st == TS_OK) st = full_grads(e, 0, &a->tied_grad);
  }
  if (st == TS_OK && !e->plan) st = backward_compute(e, u, a, params, grads, tied);
  if (tied) release_params(e, 0);
  release_params(e, u);
  if (st == TS_OK) st = reduce_unit_grads(e, u);
  return st;
}

/* Drops the gradients accumulated so far in this step and any transient
 * buffer, so that a failed micro-step leaves the engine as it was after
 * the last optimizer step. */
static void discard_step(ts_engine *e) {
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    size_t n = e->stage >= 2 ? s->layout.shard : s->layout.padded;
    ts_k_zero(&e->ctx, s->grads, n * e->es);
    ts_shard_release(&e->ledger, &s->full_grads);
    ts_shard_release(&e->ledger, &s->full_params);
    s->uses = 0;
  }
  e->micro_done = 0;
  e->loss_acc = 0;
}

/* Forward and backward of one micro-batch (see ts_engine_micro_step). */
static ts_status micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                            double *loss) {
  ts_unit_args head;
  TS_CHECK(forward(e, inputs, targets, &head));
  double mean = head.loss_count ? head.loss_sum / (double)head.loss_count : 0.0;
  int n = e->model->n_units;
  double micro_batches = (double)e->opts.grad_accum * (double)e->world;
  /* d(scaled loss)/d(row loss); the scale is 1 unless fp16 (exact: 2^k). */
  float dloss = head.loss_count
                    ? (float)((double)e->loss_scale / ((double)head.loss_count * micro_batches))
                    : 0.0f;
  for (int u = n - 1, cur = 0; u >= 0; u--) {
    ts_unit_args a = base_args(e);
    a.x = u > 0 ? e->acts[u] : NULL;
    a.saved = e->units[u].recompute ? e->recompute_saved : e->units[u].saved;
    a.dloss = dloss;
    a.dy = u < n - 1 ? e->dbuf[cur] : NULL;
    a.dx = u > 0 ? e->dbuf[cur ^ 1] : NULL;
    TS_CHECK(backward_unit(e, u, &a));
    cur ^= 1;
  }
  e->micro_done++;
  e->loss_acc += mean;
  *loss = mean;
  return TS_OK;
}

ts_status ts_engine_micro_step(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                               double *loss) {
  if ((size_t)e->micro_done >= e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: micro-step %d of a step with grad_accum %zu: call "
                        "ts_engine_optimizer_step first",
                        e->micro_done + 1, e->opts.grad_accum);
  if (e->micro_done == 0) e->step_start = *ts_comm_get_counters(e->dp);
  ts_status st = micro_step(e, inputs, targets, loss);
  if (st != TS_OK) discard_step(e);
  return st;
}

ts_status ts_engine_plan(const ts_llama *model, const ts_engine_opts *opts, size_t world,
                         ts_ledger *out) {
  ts_ledger_init_plan(out);
  TS_CHECK(check_world(world));
  ts_engine *e;
  TS_CHECK(engine_new(model, opts, &e));
  ts_ledger_init_plan(&e->ledger);
  e->plan = 1;
  e->rank = 0; /* shards are equal, so every rank's plan is rank 0's */
  e->world = (int)world;
  ts_status st = init_scaler(e);
  if (st == TS_OK) st = create(e);
  double loss;
  if (st == TS_OK) st = micro_step(e, e->tokens, e->targets, &loss);
  if (st == TS_OK) *out = e->ledger;
  ts_engine_free(e);
  return st;
}

/* Stages 0-1: reduce-scatter every unit's full gradient in place into this
 * rank's slice; stage 0 all-gathers the reduced slices back (all-reduce). */
static ts_status reduce_full_grads(ts_engine *e) {
  if (e->stage >= 2) return TS_OK;
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    TS_CHECK(ts_shard_reduce_scatter(e->dp, &s->layout, s->grads, grad_shard(e, u),
                                     e->opts.dtype, 0, e->scratch, e->scratch_bytes));
    if (e->stage == 0)
      TS_CHECK(ts_shard_all_gather(e->dp, &s->layout, grad_shard(e, u), s->grads, e->opts.dtype));
  }
  return TS_OK;
}

/* AdamW on unit u: the whole unit in stage 0, this rank's shard otherwise;
 * each tensor's part with its own weight decay. */
static ts_status adamw_unit(ts_engine *e, int u, float lr, float scale) {
  unit_state *s = &e->units[u];
  const ts_unit *un = &e->model->units[u];
  ts_dtype dt = e->opts.dtype;
  size_t es = e->es;
  size_t r0 = e->stage == 0 ? 0 : shard_begin(e, u); /* flat index of optimizer element 0 */
  size_t p0 = e->stage == 3 ? r0 : 0;                 /* ... of params element 0 */
  size_t g0 = e->stage >= 2 ? r0 : 0;                 /* ... of grads element 0 */
  for (int i = 0; i < un->n_tensors; i++) {
    const ts_tensor_spec *t = &un->tensors[i];
    size_t b, end;
    held_range(e, u, i, e->stage > 0, &b, &end);
    if (b == end) continue;
    ts_adamw_hparams hp = {lr, e->opts.beta1, e->opts.beta2, e->opts.eps,
                           t->decay ? e->opts.weight_decay : 0.0f, e->step, scale};
    char *param = (char *)s->params + (b - p0) * es;
    float *master = s->master ? s->master + (b - r0) : (float *)param;
    TS_CHECK(ts_k_adamw(&e->ctx, master, s->master ? param : NULL, dt, s->m + (b - r0),
                        s->v + (b - r0), (char *)s->grads + (b - g0) * es, dt, end - b, &hp));
  }
  return TS_OK;
}

/* Counter differences now - since. */
static ts_comm_counters counters_since(const ts_comm *c, const ts_comm_counters *since) {
  ts_comm_counters d = *ts_comm_get_counters(c);
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
    d.bytes[k] -= since->bytes[k];
    d.calls[k] -= since->calls[k];
  }
  return d;
}

/* Zeroes every gradient buffer this rank holds (the shard in stages 2-3). */
static ts_status zero_grads(ts_engine *e) {
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    size_t n = e->stage >= 2 ? s->layout.shard : s->layout.padded;
    TS_CHECK(ts_k_zero(&e->ctx, s->grads, n * e->es));
  }
  return TS_OK;
}

/* Skipped step: where the overflow began. Backward runs from the last unit
 * to the first and a non-finite activation gradient spoils every unit
 * below it, so the answer is the highest unit holding a non-finite
 * reduced gradient on any rank, and in it the first such tensor in layout
 * order: agreed by an all-reduce (max) of each rank's
 * u * TS_UNIT_MAX_TENSORS + (TS_UNIT_MAX_TENSORS - 1 - i), -1 for none. */
static ts_status find_overflow(ts_engine *e, int *unit, int *tensor) {
  const ts_llama *m = e->model;
  double key = -1;
  for (int u = m->n_units - 1; u >= 0 && key < 0; u--) {
    size_t r0 = shard_begin(e, u);
    for (int i = 0; i < m->units[u].n_tensors; i++) {
      size_t b, end;
      double sq;
      held_range(e, u, i, 1, &b, &end);
      TS_CHECK(ts_k_sumsq(&e->ctx, &sq, (char *)grad_shard(e, u) + (b - r0) * e->es, end - b,
                          e->opts.dtype));
      if (!isfinite(sq)) {
        key = (double)(u * TS_UNIT_MAX_TENSORS + (TS_UNIT_MAX_TENSORS - 1 - i));
        break;
      }
    }
  }
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, &key, 1, TS_COMM_MAX));
  if (key < 0) /* partial sums overflowed, no element did: impossible in fp16 */
    return ts_set_error(TS_ERR_INTERNAL, "engine: overflow agreed but no rank holds a "
                                         "non-finite gradient");
  *unit = (int)key / TS_UNIT_MAX_TENSORS;
  *tensor = TS_UNIT_MAX_TENSORS - 1 - (int)key % TS_UNIT_MAX_TENSORS;
  return TS_OK;
}

/* Records a scale change in the history ring. */
static void note_scale(ts_engine *e) {
  int k = e->n_history++ % (int)(sizeof e->history / sizeof e->history[0]);
  e->history[k].step = e->attempts;
  e->history[k].scale = e->loss_scale;
}

/* The recent scale history, oldest first: "step 0: 65536, step 3: 32768". */
static void format_history(const ts_engine *e, char *buf, size_t cap) {
  int n = (int)(sizeof e->history / sizeof e->history[0]);
  int first = e->n_history > n ? e->n_history - n : 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int k = first; k < e->n_history && len < cap; k++) {
    int w = snprintf(buf + len, cap - len, "%sstep %d: %g", k > first ? ", " : "",
                     e->history[k % n].step, (double)e->history[k % n].scale);
    if (w < 0) break;
    len += (size_t)w;
  }
}

/* fp16 overflow: the step is skipped (gradients dropped) and the dynamic
 * scale halves, or training stops at the minimum. */
static ts_status skip_step(ts_engine *e, ts_step_stats *stats) {
  int u = 0, i = 0;
  TS_CHECK(find_overflow(e, &u, &i));
  TS_CHECK(zero_grads(e));
  const ts_tensor_spec *t = &e->model->units[u].tensors[i];
  stats->skipped = 1;
  stats->overflow_unit = u;
  snprintf(stats->overflow_tensor, sizeof stats->overflow_tensor, "%s", t->name);
  e->clean_steps = 0;
  e->attempts++;
  if (!e->dynamic) return TS_OK;
  if (e->loss_scale <= e->opts.min_loss_scale) {
    char hist[512];
    format_history(e, hist, sizeof hist);
    return ts_set_error(TS_ERR_NUMERIC,
                        "fp16 overflow at step %d with the loss scale at its minimum %g "
                        "(--min-loss-scale): it began in %s (unit %d); recent "
                        "loss scales: %s",
                        e->attempts, (double)e->loss_scale, t->name, u, hist);
  }
  float half = e->loss_scale * 0.5f;
  e->loss_scale = half > e->opts.min_loss_scale ? half : e->opts.min_loss_scale;
  note_scale(e);
  stats->next_loss_scale = e->loss_scale;
  return TS_OK;
}

/* A clean step: after loss_scale_window of them in a row the dynamic scale
 * doubles (while the double stays finite). */
static void grow_scale(ts_engine *e) {
  if (!e->dynamic || ++e->clean_steps < e->opts.loss_scale_window) return;
  e->clean_steps = 0;
  if (isfinite(e->loss_scale * 2.0f)) {
    e->loss_scale *= 2.0f;
    note_scale(e);
  }
}

ts_status ts_engine_optimizer_step(ts_engine *e, float lr, ts_step_stats *stats) {
  if ((size_t)e->micro_done != e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: optimizer step after %d micro-steps: expected grad_accum = %zu",
                        e->micro_done, e->opts.grad_accum);
  const ts_llama *m = e->model;
  ts_dtype dt = e->opts.dtype;
  memset(stats, 0, sizeof *stats);
  stats->overflow_unit = -1;
  stats->loss_scale = stats->next_loss_scale = e->loss_scale;
  TS_CHECK(reduce_full_grads(e));
  /* [0]: this rank's loss sum, [1]: sum of squares of its gradient shards
   * (not finite on any rank: overflow, agreed by this one all-reduce). */
  double sums[2] = {e->loss_acc, 0.0};
  for (int u = 0; u < m->n_units; u++) {
    double sq;
    TS_CHECK(ts_k_sumsq(&e->ctx, &sq, grad_shard(e, u), e->units[u].layout.shard, dt));
    sums[1] += sq;
  }
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, sums, 2, TS_COMM_SUM));
  stats->loss = sums[0] / ((double)e->opts.grad_accum * (double)e->world);
  stats->step = e->step;
  ts_status st = TS_OK;
  if (e->scaling && !isfinite(sums[1])) {
    stats->grad_norm = sums[1];
    st = skip_step(e, stats);
  } else {
    double norm = sqrt(sums[1]) / (double)e->loss_scale;
    float scale = 1.0f;
    if (e->opts.grad_clip > 0 && norm > e->opts.grad_clip)
      scale = (float)(e->opts.grad_clip / (norm + 1e-6)); /* torch clip_grad_norm_ */
    scale /= e->loss_scale; /* unscale: exact for a power of two */
    e->step++;
    for (int u = 0; u < m->n_units; u++) {
      unit_state *s = &e->units[u];
      TS_CHECK(adamw_unit(e, u, lr, scale));
      if (e->stage == 1 || e->stage == 2)
        TS_CHECK(ts_shard_all_gather(e->dp, &s->layout,
                                     (char *)s->params + shard_begin(e, u) * e->es, s->params, dt));
    }
    TS_CHECK(zero_grads(e));
    e->attempts++;
    grow_scale(e);
    stats->grad_norm = norm;
    stats->lr = lr;
    stats->step = e->step;
    stats->next_loss_scale = e->loss_scale;
  }
  stats->comm = counters_since(e->dp, &e->step_start);
  stats->comm_bytes = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) stats->comm_bytes += stats->comm.bytes[k];
  e->micro_done = 0;
  e->loss_acc = 0;
  return st;
}

ts_status ts_engine_eval(ts_engine *e, const int32_t *inputs, const int32_t *targets,
                         double *loss_sum, size_t *count) {
  ts_unit_args head;
  TS_CHECK(forward(e, inputs, targets, &head));
  *loss_sum = head.loss_sum;
  *count = head.loss_count;
  return TS_OK;
}

const ts_ledger *ts_engine_ledger(const ts_engine *e) { return &e->ledger; }

void ts_engine_batch(ts_engine *e, int32_t **inputs, int32_t **targets) {
  *inputs = e->tokens;
  *targets = e->targets;
}

const ts_flat_layout *ts_engine_layout(const ts_engine *e, int u) {
  TS_ASSERT(u >= 0 && u < e->model->n_units);
  return &e->units[u].layout;
}

/* Finds tensor `name`: its unit and spec, or TS_ERR_INVALID_ARGUMENT. */
static ts_status find(const ts_engine *e, const char *name, size_t numel, int *unit,
                      const ts_tensor_spec **spec) {
  const ts_llama *m = e->model;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++)
      if (strcmp(m->units[u].tensors[i].name, name) == 0) {
        *unit = u;
        *spec = &m->units[u].tensors[i];
        if ((*spec)->numel != numel)
          return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                              "tensor %s: %zu elements given, expected %zu", name, numel,
                              (*spec)->numel);
        return TS_OK;
      }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "tensor %s: not a parameter of model %s", name,
                      m->cfg.name);
}

ts_status ts_engine_set_tensor(ts_engine *e, const char *name, const float *src, size_t numel) {
  int u;
  const ts_tensor_spec *t;
  TS_CHECK(find(e, name, numel, &u, &t));
  unit_state *s = &e->units[u];
  int i = (int)(t - e->model->units[u].tensors);
  size_t b, end, r0 = shard_begin(e, u);
  held_range(e, u, i, e->stage == 3, &b, &end);
  size_t p0 = e->stage == 3 ? r0 : 0;
  TS_CHECK(ts_k_cast(&e->ctx, (char *)s->params + (b - p0) * e->es, e->opts.dtype,
                     src + (b - t->offset), TS_FP32, end - b));
  if (s->master) {
    held_range(e, u, i, e->stage > 0, &b, &end);
    memcpy(s->master + (b - (e->stage > 0 ? r0 : 0)), src + (b - t->offset), (end - b) * 4);
  }
  return TS_OK;
}

ts_status ts_engine_get_tensor(ts_engine *e, const char *name, float *dst, size_t numel) {
  int u;
  const ts_tensor_spec *t;
  TS_CHECK(find(e, name, numel, &u, &t));
  const void *full;
  TS_CHECK(acquire_params(e, u, &full));
  ts_status st = ts_k_cast(&e->ctx, dst, TS_FP32, (const char *)full + t->offset * e->es,
                           e->opts.dtype, numel);
  release_params(e, u);
  return st;
}

ts_status ts_engine_get_grad(const ts_engine *e, const char *name, float *dst, size_t numel) {
  if (e->world != 1)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: get_grad of %s on %d ranks: gradients are unreduced or sharded; "
                        "expected a one-rank group",
                        name, e->world);
  int u;
  const ts_tensor_spec *t;
  TS_CHECK(find(e, name, numel, &u, &t));
  /* One rank: the gradient buffer is the whole padded unit in every stage. */
  TS_CHECK(ts_k_cast(&e->ctx, dst, TS_FP32, (const char *)e->units[u].grads + t->offset * e->es,
                     e->opts.dtype, numel));
  if (e->loss_scale != 1.0f)
    for (size_t k = 0; k < numel; k++) dst[k] /= e->loss_scale;
  return TS_OK;
}

float ts_engine_loss_scale(const ts_engine *e) { return e->loss_scale; }

const float *ts_engine_optimizer_state(const ts_engine *e, int u, int which, size_t *n) {
  TS_ASSERT(u >= 0 && u < e->model->n_units && which >= 0 && which <= 2);
  const unit_state *s = &e->units[u];
  *n = e->stage == 0 ? s->layout.padded : s->layout.shard;
  return which == 0 ? s->m : which == 1 ? s->v : s->master;
}

void ts_engine_inject_nonfinite(ts_engine *e, const ts_engine_inject *inject) {
  TS_ASSERT(!inject || (inject->unit >= 0 && inject->unit < e->model->n_units &&
                        inject->tensor >= 0 &&
                        inject->tensor < e->model->units[inject->unit].n_tensors));
  int cap = (int)(sizeof e->inject / sizeof e->inject[0]);
  if (!inject) e->n_inject = 0;
  else e->inject[e->n_inject < cap ? e->n_inject++ : cap - 1] = *inject;
}

const ts_engine_opts *ts_engine_options(const ts_engine *e) { return &e->opts; }

ts_comm *ts_engine_comm(const ts_engine *e) { return e->dp; }

int ts_engine_num_units(const ts_engine *e) { return e->model->n_units; }

ts_status ts_engine_get_logits(const ts_engine *e, float *dst, size_t numel) {
  size_t B = e->opts.micro_batch, T = e->opts.seq, V = e->model->cfg.vocab_size;
  if (numel != B * T * V)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "logits: %zu elements given, expected %zu",
                        numel, B * T * V);
  int h = e->model->n_units - 1;
  void *logits = ts_llama_head_logits(e->model, e->units[h].saved, B, T, e->opts.dtype);
  return ts_k_cast(&e->ctx, dst, TS_FP32, logits, e->opts.dtype, numel);
}

/* engine.c — one rank's training step over the units of a model.
 * See engine.h for ownership and the loss convention. */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard/collect.h"

typedef struct unit_state {
  ts_flat_layout layout; /* offsets, padding P, shard S for the N ranks */
  void *params;          /* compute dtype: stages 0-2 (P), stage 3 (S) */
  void *grads;           /* compute dtype: stages 0-1 (P), stages 2-3 (S) */
  float *master;         /* fp32, NULL in fp32: stage 0 (P), stages 1-3 (S) */
  float *m, *v;          /* fp32 Adam moments: stage 0 (P), stages 1-3 (S) */
  void *saved;           /* ts_llama_saved_bytes() of one micro-batch */
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
  int micro_done;        /* micro-steps since the last optimizer step */
  int step;              /* optimizer steps taken */
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
  return o;
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
    return ts_llama_init_unit(e->model, u, s->params, TS_FP32, e->opts.seed);
  /* A transient full fp32 copy, charged like a gathered unit. */
  float *full;
  ts_mem_category c = dt == TS_FP32 ? TS_MEM_PARAMS : TS_MEM_MASTER;
  TS_CHECK(ts_ledger_alloc(&e->ledger, c, P * 4, (void **)&full));
  ts_status st = ts_llama_init_unit(e->model, u, full, TS_FP32, e->opts.seed);
  if (st == TS_OK && s->master)
    memcpy(s->master, e->stage == 0 ? full : full + r0, (e->stage == 0 ? P : S) * 4);
  if (st == TS_OK)
    st = e->stage == 3 ? ts_k_cast(&e->ctx, s->params, dt, full + r0, TS_FP32, S)
                       : ts_k_cast(&e->ctx, s->params, dt, full, TS_FP32, P);
  ts_ledger_free(&e->ledger, full);
  return st;
}

static ts_status alloc_unit(ts_engine *e, int u) {
  const ts_unit *un = &e->model->units[u];
  unit_state *s = &e->units[u];
  size_t numels[TS_UNIT_MAX_TENSORS];
  for (int i = 0; i < un->n_tensors; i++) numels[i] = un->tensors[i].numel;
  TS_CHECK(ts_flat_layout_init(&s->layout, numels, (size_t)un->n_tensors, (size_t)e->world));
  size_t P = s->layout.padded, S = s->layout.shard, es = e->es;
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_PARAMS, (e->stage == 3 ? S : P) * es, &s->params));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_GRADS, (e->stage >= 2 ? S : P) * es, &s->grads));
  size_t n_opt = e->stage >= 1 ? S : P;
  if (e->opts.dtype != TS_FP32)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_MASTER, n_opt * 4, (void **)&s->master));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_OPTIM, n_opt * 4, (void **)&s->m));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_OPTIM, n_opt * 4, (void **)&s->v));
  size_t saved = ts_llama_saved_bytes(e->model, u, e->opts.micro_batch, e->opts.seq, e->opts.dtype);
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, saved, &s->saved));
  size_t sb = ts_shard_scratch_bytes(e->dp, &s->layout, e->opts.dtype);
  if (sb > e->scratch_bytes) e->scratch_bytes = sb;
  return init_unit(e, u);
}

static ts_status create(ts_engine *e) {
  const ts_llama *m = e->model;
  size_t B = e->opts.micro_batch, T = e->opts.seq, C = m->cfg.hidden_size, es = e->es;
  e->units = calloc((size_t)m->n_units, sizeof *e->units);
  e->acts = calloc((size_t)m->n_units, sizeof *e->acts);
  if (!e->units || !e->acts) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: unit tables");
  size_t ws = 0;
  for (int u = 0; u < m->n_units; u++) {
    size_t w = ts_llama_workspace_bytes(m, u, B, T, e->opts.dtype);
    if (w > ws) ws = w;
  }
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_WORKSPACE, ws, &e->ctx.workspace));
  e->ctx.workspace_bytes = ws;
  for (int u = 0; u < m->n_units; u++) TS_CHECK(alloc_unit(e, u));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_COMM, e->scratch_bytes, &e->scratch));
  for (int u = 1; u < m->n_units; u++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->acts[u]));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->tokens));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->targets));
  for (int i = 0; i < 2; i++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->dbuf[i]));
  return TS_OK;
}

ts_status ts_engine_create(ts_engine **out, const ts_llama *model, const ts_engine_opts *opts,
                           ts_comm *dp) {
  *out = NULL;
  if (opts->micro_batch == 0 || opts->seq == 0 || opts->grad_accum == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--micro-batch %zu, --seq %zu, --grad-accum %zu: expected each >= 1",
                        opts->micro_batch, opts->seq, opts->grad_accum);
  if (opts->seq > model->cfg.max_position_embeddings)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--seq %zu: expected at most max_position_embeddings = %zu of %s",
                        opts->seq, model->cfg.max_position_embeddings,
                        ts_llama_config_origin(&model->cfg));
  if (opts->zero_stage < 0 || opts->zero_stage > 3)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--zero %d: expected a ZeRO stage 0, 1, 2 or 3",
                        opts->zero_stage);
  if (opts->dtype != TS_FP32)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "--dtype %s: this build trains in fp32 only (mixed precision is the "
                        "next milestone)",
                        ts_dtype_name(opts->dtype));
  ts_engine *e = calloc(1, sizeof *e);
  if (!e) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "engine: cannot allocate");
  e->model = model;
  e->opts = *opts;
  e->ctx.device = TS_DEVICE_CPU;
  e->stage = opts->zero_stage;
  e->es = ts_dtype_size(opts->dtype);
  ts_ledger_init(&e->ledger);
  ts_status st = TS_OK;
  if (!dp) st = ts_comm_self(&e->own_comm);
  if (st == TS_OK) {
    e->dp = dp ? dp : e->own_comm;
    e->rank = ts_comm_rank(e->dp);
    e->world = ts_comm_size(e->dp);
    st = create(e);
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
      ts_ledger_free(&e->ledger, s->params);
      ts_ledger_free(&e->ledger, s->grads);
      ts_ledger_free(&e->ledger, s->master);
      ts_ledger_free(&e->ledger, s->m);
      ts_ledger_free(&e->ledger, s->v);
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
  ts_status st = ts_shard_reduce_scatter(e->dp, &s->layout, s->full_grads, s->grads,
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
  if (st == TS_OK) {
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
    a.saved = e->units[u].saved;
    TS_CHECK(forward_unit(e, u, &a));
    if (u == n - 1) *head = a;
  }
  return TS_OK;
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
  if (st == TS_OK) {
    a->tied_weight = tied;
    st = ts_llama_backward(e->model, u, &e->ctx, params, grads, a);
  }
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
  float dloss = head.loss_count ? (float)(1.0 / ((double)head.loss_count * micro_batches)) : 0.0f;
  for (int u = n - 1, cur = 0; u >= 0; u--) {
    ts_unit_args a = base_args(e);
    a.x = u > 0 ? e->acts[u] : NULL;
    a.saved = e->units[u].saved;
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

ts_status ts_engine_optimizer_step(ts_engine *e, float lr, ts_step_stats *stats) {
  if ((size_t)e->micro_done != e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: optimizer step after %d micro-steps: expected grad_accum = %zu",
                        e->micro_done, e->opts.grad_accum);
  const ts_llama *m = e->model;
  ts_dtype dt = e->opts.dtype;
  TS_CHECK(reduce_full_grads(e));
  /* [0]: this rank's loss sum, [1]: sum of squares of its gradient shards. */
  double sums[2] = {e->loss_acc, 0.0};
  for (int u = 0; u < m->n_units; u++) {
    double sq;
    TS_CHECK(ts_k_sumsq(&e->ctx, &sq, grad_shard(e, u), e->units[u].layout.shard, dt));
    sums[1] += sq;
  }
  TS_CHECK(ts_comm_all_reduce_f64(e->dp, sums, 2, TS_COMM_SUM));
  double norm = sqrt(sums[1]);
  float scale = 1.0f;
  if (e->opts.grad_clip > 0 && norm > e->opts.grad_clip)
    scale = (float)(e->opts.grad_clip / (norm + 1e-6)); /* torch clip_grad_norm_ */
  e->step++;
  for (int u = 0; u < m->n_units; u++) {
    unit_state *s = &e->units[u];
    TS_CHECK(adamw_unit(e, u, lr, scale));
    if (e->stage == 1 || e->stage == 2)
      TS_CHECK(ts_shard_all_gather(e->dp, &s->layout, (char *)s->params + shard_begin(e, u) * e->es,
                                   s->params, dt));
    size_t n = e->stage >= 2 ? s->layout.shard : s->layout.padded;
    TS_CHECK(ts_k_zero(&e->ctx, s->grads, n * e->es));
  }
  stats->loss = sums[0] / ((double)e->opts.grad_accum * (double)e->world);
  stats->grad_norm = norm;
  stats->lr = lr;
  stats->step = e->step;
  stats->comm = counters_since(e->dp, &e->step_start);
  stats->comm_bytes = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) stats->comm_bytes += stats->comm.bytes[k];
  e->micro_done = 0;
  e->loss_acc = 0;
  return TS_OK;
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
  return ts_k_cast(&e->ctx, dst, TS_FP32, (const char *)e->units[u].grads + t->offset * e->es,
                   e->opts.dtype, numel);
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

/* engine.c — one rank's training step over the units of a model.
 * See engine.h for ownership and the loss convention. */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct unit_state {
  ts_flat_layout layout; /* offsets, padding, shard */
  void *params;          /* (padded) compute dtype */
  void *grads;           /* (padded) compute dtype */
  float *master;         /* (padded) fp32, NULL when the compute dtype is fp32 */
  float *m, *v;          /* (padded) fp32 Adam moments */
  void *saved;           /* ts_llama_saved_bytes() of one micro-batch */
} unit_state;

struct ts_engine {
  const ts_llama *model;
  ts_engine_opts opts;
  ts_ledger ledger;
  ts_kctx ctx;           /* CPU, with the workspace */
  unit_state *units;     /* [n_units] */
  void **acts;           /* [n_units] input of unit u (B, T, C), acts[0] unused */
  int32_t *tokens;       /* (B, T) inputs of the current micro-batch */
  int32_t *targets;      /* (B, T) */
  void *dbuf[2];         /* (B, T, C) activation gradients, ping-pong */
  int micro_done;        /* micro-steps since the last optimizer step */
  int step;              /* optimizer steps taken */
  double loss_acc;       /* sum of micro-batch mean losses this step */
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
  return o;
}

/* Float (padded) fp32 weights of unit u: the master copy, or the params. */
static float *master_of(const ts_engine *e, int u) {
  return e->units[u].master ? e->units[u].master : (float *)e->units[u].params;
}

static ts_status alloc_unit(ts_engine *e, int u) {
  const ts_unit *un = &e->model->units[u];
  unit_state *s = &e->units[u];
  size_t numels[TS_UNIT_MAX_TENSORS];
  for (int i = 0; i < un->n_tensors; i++) numels[i] = un->tensors[i].numel;
  TS_CHECK(ts_flat_layout_init(&s->layout, numels, (size_t)un->n_tensors, 1));
  size_t n = s->layout.padded, es = ts_dtype_size(e->opts.dtype);
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_PARAMS, n * es, &s->params));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_GRADS, n * es, &s->grads));
  if (e->opts.dtype != TS_FP32)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_MASTER, n * 4, (void **)&s->master));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_OPTIM, n * 4, (void **)&s->m));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_OPTIM, n * 4, (void **)&s->v));
  size_t saved = ts_llama_saved_bytes(e->model, u, e->opts.micro_batch, e->opts.seq, e->opts.dtype);
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, saved, &s->saved));
  /* Initialise in fp32, then cast to the compute dtype. */
  TS_CHECK(ts_llama_init_unit(e->model, u, master_of(e, u), TS_FP32, e->opts.seed));
  if (s->master) TS_CHECK(ts_k_cast(&e->ctx, s->params, e->opts.dtype, s->master, TS_FP32, n));
  return TS_OK;
}

static ts_status create(ts_engine *e) {
  const ts_llama *m = e->model;
  size_t B = e->opts.micro_batch, T = e->opts.seq, C = m->cfg.hidden_size;
  size_t es = ts_dtype_size(e->opts.dtype);
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
  for (int u = 1; u < m->n_units; u++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->acts[u]));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->tokens));
  TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * 4, (void **)&e->targets));
  for (int i = 0; i < 2; i++)
    TS_CHECK(ts_ledger_alloc(&e->ledger, TS_MEM_ACTIVATIONS, B * T * C * es, &e->dbuf[i]));
  return TS_OK;
}

ts_status ts_engine_create(ts_engine **out, const ts_llama *model, const ts_engine_opts *opts) {
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
  ts_ledger_init(&e->ledger);
  ts_status st = create(e);
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
    }
  }
  if (e->acts)
    for (int u = 1; u < e->model->n_units; u++) ts_ledger_free(&e->ledger, e->acts[u]);
  ts_ledger_free(&e->ledger, e->tokens);
  ts_ledger_free(&e->ledger, e->targets);
  ts_ledger_free(&e->ledger, e->dbuf[0]);
  ts_ledger_free(&e->ledger, e->dbuf[1]);
  ts_ledger_free(&e->ledger, e->ctx.workspace);
  free(e->units);
  free(e->acts);
  free(e);
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
  if (e->model->cfg.tie_word_embeddings) {
    a.tied_weight = e->units[0].params;
    a.tied_grad = e->units[0].grads;
  }
  return a;
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
    TS_CHECK(ts_llama_forward(e->model, u, &e->ctx, e->units[u].params, &a));
    if (u == n - 1) *head = a;
  }
  return TS_OK;
}

/* Drops the gradients accumulated so far in this step, so that a failed
 * micro-step leaves the engine as it was after the last optimizer step. */
static void discard_step(ts_engine *e) {
  for (int u = 0; u < e->model->n_units; u++)
    ts_k_zero(&e->ctx, e->units[u].grads,
              e->units[u].layout.padded * ts_dtype_size(e->opts.dtype));
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
  float dloss = head.loss_count
                    ? (float)(1.0 / ((double)head.loss_count * (double)e->opts.grad_accum))
                    : 0.0f;
  for (int u = n - 1, cur = 0; u >= 0; u--) {
    ts_unit_args a = base_args(e);
    a.x = u > 0 ? e->acts[u] : NULL;
    a.saved = e->units[u].saved;
    a.dloss = dloss;
    a.dy = u < n - 1 ? e->dbuf[cur] : NULL;
    a.dx = u > 0 ? e->dbuf[cur ^ 1] : NULL;
    TS_CHECK(ts_llama_backward(e->model, u, &e->ctx, e->units[u].params, e->units[u].grads, &a));
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
  ts_status st = micro_step(e, inputs, targets, loss);
  if (st != TS_OK) discard_step(e);
  return st;
}

ts_status ts_engine_optimizer_step(ts_engine *e, float lr, ts_step_stats *stats) {
  if ((size_t)e->micro_done != e->opts.grad_accum)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: optimizer step after %d micro-steps: expected grad_accum = %zu",
                        e->micro_done, e->opts.grad_accum);
  const ts_llama *m = e->model;
  ts_dtype dt = e->opts.dtype;
  double sumsq = 0;
  for (int u = 0; u < m->n_units; u++) {
    double s;
    TS_CHECK(ts_k_sumsq(&e->ctx, &s, e->units[u].grads, e->units[u].layout.padded, dt));
    sumsq += s;
  }
  double norm = sqrt(sumsq);
  float scale = 1.0f;
  if (e->opts.grad_clip > 0 && norm > e->opts.grad_clip)
    scale = (float)(e->opts.grad_clip / (norm + 1e-6)); /* torch clip_grad_norm_ */
  e->step++;
  size_t es = ts_dtype_size(dt);
  for (int u = 0; u < m->n_units; u++) {
    unit_state *s = &e->units[u];
    const ts_unit *un = &m->units[u];
    float *master = master_of(e, u);
    for (int i = 0; i < un->n_tensors; i++) {
      const ts_tensor_spec *t = &un->tensors[i];
      ts_adamw_hparams hp = {lr, e->opts.beta1, e->opts.beta2, e->opts.eps,
                             t->decay ? e->opts.weight_decay : 0.0f, e->step, scale};
      size_t o = t->offset;
      TS_CHECK(ts_k_adamw(&e->ctx, master + o, s->master ? (char *)s->params + o * es : NULL, dt,
                          s->m + o, s->v + o, (char *)s->grads + o * es, dt, t->numel, &hp));
    }
    TS_CHECK(ts_k_zero(&e->ctx, s->grads, s->layout.padded * es));
  }
  stats->loss = e->loss_acc / (double)e->opts.grad_accum;
  stats->grad_norm = norm;
  stats->lr = lr;
  stats->step = e->step;
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
  size_t es = ts_dtype_size(e->opts.dtype);
  if (s->master) memcpy(s->master + t->offset, src, numel * 4);
  return ts_k_cast(&e->ctx, (char *)s->params + t->offset * es, e->opts.dtype, src, TS_FP32,
                   numel);
}

static ts_status get(const ts_engine *e, const char *name, float *dst, size_t numel, int grads) {
  int u;
  const ts_tensor_spec *t;
  TS_CHECK(find(e, name, numel, &u, &t));
  const unit_state *s = &e->units[u];
  size_t es = ts_dtype_size(e->opts.dtype);
  const char *base = grads ? s->grads : s->params;
  return ts_k_cast(&e->ctx, dst, TS_FP32, base + t->offset * es, e->opts.dtype, numel);
}

ts_status ts_engine_get_tensor(const ts_engine *e, const char *name, float *dst, size_t numel) {
  return get(e, name, dst, numel, 0);
}

ts_status ts_engine_get_grad(const ts_engine *e, const char *name, float *dst, size_t numel) {
  return get(e, name, dst, numel, 1);
}

ts_status ts_engine_get_logits(const ts_engine *e, float *dst, size_t numel) {
  size_t B = e->opts.micro_batch, T = e->opts.seq, V = e->model->cfg.vocab_size;
  if (numel != B * T * V)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "logits: %zu elements given, expected %zu",
                        numel, B * T * V);
  int h = e->model->n_units - 1;
  void *logits = ts_llama_head_logits(e->model, e->units[h].saved, B, T, e->opts.dtype);
  return ts_k_cast(&e->ctx, dst, TS_FP32, logits, e->opts.dtype, numel);
}

/*
 * generate.c — autoregressive generation (models/generate.h): the weights
 * of every unit whole on one device, a key/value cache per block, the
 * units' decode ops in chain order, and transformers' sampling.
 *
 * Buffers (all on the device): each unit's weights in the storage dtype;
 * each block's cache (ts_unit_cache_bytes(max_T)); two activation rows
 * buffers (max_T, C) that the units ping-pong; one scratch of the largest
 * ts_unit_saved_bytes(1, max_T) of any unit (a decode call's
 * intermediates, or a whole forward's saved bytes without the cache); the
 * workspace; the ids; the newest logits (V), and for bf16/fp16 their fp32
 * copy.
 */
#include "models/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

struct ts_generator {
  const ts_model *m;
  ts_generator_opts o;
  ts_kctx ctx;
  void **params; /* [n_units] weights in o.dtype, NULL for a unit with none */
  void **cache;  /* [n_units] key/value cache, NULL where a unit keeps none */
  void *act[2];  /* (max_T, C) activations */
  void *scratch; /* largest saved bytes at (1, max_T) */
  void *ws;      /* ctx.workspace */
  void *logits;  /* (V) newest logits, o.dtype (recompute: inside scratch) */
  float *wide;   /* (V) fp32: the logits widened on the device (bf16/fp16), else NULL */
  int32_t *ids;     /* (max_T) device: the new ids, or the whole sequence (recompute) */
  int32_t *targets; /* recompute: (max_T) -100 */
  double *loss;     /* recompute: the head's (2) fp64 */
  int32_t *seq;     /* (max_T) host: the sequence so far */
  size_t len;
  float *host; /* (max(V, largest unit)) fp32 staging */
};

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

static ts_status dev_alloc(ts_generator *g, size_t bytes, void **out) {
  *out = NULL;
  return bytes ? ts_k_alloc(g->o.device, bytes, out) : TS_OK;
}

static void dev_free(ts_generator *g, void *p) {
  if (p) ts_k_free(g->o.device, p);
}

void ts_generator_free(ts_generator *g) {
  if (!g) return;
  for (int u = 0; g->m && u < g->m->n_units; u++) {
    if (g->params) dev_free(g, g->params[u]);
    if (g->cache) dev_free(g, g->cache[u]);
  }
  free(g->params);
  free(g->cache);
  dev_free(g, g->act[0]);
  dev_free(g, g->act[1]);
  dev_free(g, g->scratch);
  dev_free(g, g->ws);
  dev_free(g, g->logits);
  dev_free(g, g->wide);
  dev_free(g, g->ids);
  dev_free(g, g->targets);
  dev_free(g, g->loss);
  free(g->seq);
  free(g->host);
  if (g->ctx.device == g->o.device) ts_k_context_destroy(&g->ctx);
  free(g);
}

/* Unit u's weights: each tensor read by name into g->host (fp32), then
 * onto the device in o.dtype through a fp32 staging buffer `stage`. */
static ts_status load_unit(ts_generator *g, int u, void *stage, ts_weights_fn read, void *user) {
  const ts_unit *un = &g->m->units[u];
  size_t n = un->numel, es = ts_dtype_size(g->o.dtype);
  if (n == 0) return TS_OK;
  for (int i = 0; i < un->n_tensors; i++)
    TS_CHECK(read(user, un->tensors[i].name, g->host + un->tensors[i].offset,
                  un->tensors[i].numel));
  TS_CHECK(dev_alloc(g, n * es, &g->params[u]));
  if (g->o.dtype == TS_FP32) return ts_k_from_host(&g->ctx, g->params[u], g->host, n * 4);
  TS_CHECK(ts_k_from_host(&g->ctx, stage, g->host, n * 4));
  return ts_k_cast(&g->ctx, g->params[u], g->o.dtype, stage, TS_FP32, n);
}

ts_status ts_generator_create(ts_generator **out, const ts_model *m,
                              const ts_generator_opts *opts, ts_weights_fn read, void *user) {
  *out = NULL;
  if (!opts->recompute && !ts_model_can_decode(m))
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "%s: a %s model cannot generate text (generation needs a causal LM)",
                        ts_model_origin(m), m->family ? m->family->model_type : "hand-built");
  if (opts->max_T == 0 || opts->max_T > m->max_seq)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "generate: %zu positions (prompt + new tokens): expected 1..%zu, "
                        "max_position_embeddings of %s",
                        opts->max_T, m->max_seq, ts_model_origin(m));
  ts_generator *g = calloc(1, sizeof *g);
  if (!g) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "generate: cannot allocate the generator");
  g->m = m;
  g->o = *opts;
  g->ctx.device = TS_DEVICE_COUNT; /* not yet a context: nothing to destroy */
  ts_status st = ts_k_context_init(&g->ctx, opts->device, 0);
  if (st != TS_OK) {
    g->ctx.device = TS_DEVICE_COUNT;
    ts_generator_free(g);
    return st;
  }
  size_t T = opts->max_T, C = m->hidden_size, V = m->vocab_size, es = ts_dtype_size(opts->dtype);
  size_t largest = 0, saved = 0, ws = 0;
  for (int u = 0; u < m->n_units; u++) {
    largest = max2(largest, m->units[u].numel);
    saved = max2(saved, ts_unit_saved_bytes(m, u, 1, T, opts->dtype, opts->device));
    ws = max2(ws, ts_unit_workspace_bytes(m, u, 1, T, opts->dtype, opts->device));
    ws = max2(ws, ts_unit_workspace_bytes(m, u, 1, 1, opts->dtype, opts->device));
  }
  g->params = calloc((size_t)m->n_units, sizeof *g->params);
  g->cache = calloc((size_t)m->n_units, sizeof *g->cache);
  g->seq = malloc(T * sizeof *g->seq);
  g->host = malloc(max2(largest, V) * sizeof *g->host);
  if (!g->params || !g->cache || !g->seq || !g->host) {
    ts_generator_free(g);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "generate: cannot allocate %zu fp32 host values",
                        max2(largest, V));
  }
  void *stage = NULL;
  if (opts->dtype != TS_FP32) st = dev_alloc(g, largest * 4, &stage);
  for (int u = 0; st == TS_OK && u < m->n_units; u++) {
    st = load_unit(g, u, stage, read, user);
    if (st == TS_OK && !opts->recompute)
      st = dev_alloc(g, ts_unit_cache_bytes(m, u, T, opts->dtype), &g->cache[u]);
  }
  dev_free(g, stage);
  if (st == TS_OK) st = dev_alloc(g, T * C * es, &g->act[0]);
  if (st == TS_OK) st = dev_alloc(g, T * C * es, &g->act[1]);
  if (st == TS_OK) st = dev_alloc(g, saved, &g->scratch);
  if (st == TS_OK) st = dev_alloc(g, ws, &g->ws);
  if (st == TS_OK) st = dev_alloc(g, V * es, &g->logits);
  if (st == TS_OK && opts->dtype != TS_FP32) st = dev_alloc(g, V * 4, (void **)&g->wide);
  if (st == TS_OK) st = dev_alloc(g, T * sizeof(int32_t), (void **)&g->ids);
  if (st == TS_OK && opts->recompute) {
    st = dev_alloc(g, T * sizeof(int32_t), (void **)&g->targets);
    if (st == TS_OK) st = dev_alloc(g, 2 * sizeof(double), (void **)&g->loss);
    for (size_t i = 0; i < T; i++) g->seq[i] = TS_IGNORE_INDEX;
    if (st == TS_OK) st = ts_k_from_host(&g->ctx, g->targets, g->seq, T * sizeof(int32_t));
  }
  if (st != TS_OK) {
    ts_generator_free(g);
    return st;
  }
  g->ctx.workspace = g->ws;
  g->ctx.workspace_bytes = ws;
  *out = g;
  return TS_OK;
}

size_t ts_generator_length(const ts_generator *g) { return g->len; }

void ts_generator_reset(ts_generator *g) { g->len = 0; }

/* The weight unit u borrows (tied embeddings), whole on the device. */
static const void *tied_weight(const ts_generator *g, int u) {
  const ts_unit *un = &g->m->units[u];
  if (un->tied_unit < 0) return NULL;
  const ts_unit *src = &g->m->units[un->tied_unit];
  return (const char *)g->params[un->tied_unit] +
         src->tensors[un->tied_tensor].offset * ts_dtype_size(g->o.dtype);
}

/* The units' decode ops over the n new ids at g->len; logits in g->logits. */
static ts_status run_decode(ts_generator *g, size_t n) {
  const ts_model *m = g->m;
  int cur = 0;
  for (int u = 0; u < m->n_units; u++) {
    ts_decode_args a = {.T = n,
                        .pos0 = g->len,
                        .max_T = g->o.max_T,
                        .dt = g->o.dtype,
                        .tokens = g->ids,
                        .x = g->act[cur],
                        .y = g->act[cur ^ 1],
                        .cache = g->cache[u],
                        .scratch = g->scratch,
                        .tied_weight = tied_weight(g, u),
                        .logits = g->logits};
    TS_CHECK(ts_unit_decode(m, u, &g->ctx, g->params[u], &a));
    cur ^= 1;
  }
  return TS_OK;
}

/* The whole sequence (T ids in g->ids) through ts_unit_forward, no cache;
 * *logits points at the first row's inside g->scratch. */
static ts_status run_forward(ts_generator *g, size_t T, const void **logits) {
  const ts_model *m = g->m;
  int cur = 0, last = m->n_units - 1;
  for (int u = 0; u < m->n_units; u++) {
    ts_unit_args a = {.B = 1,
                      .T = T,
                      .dt = g->o.dtype,
                      .tokens = g->ids,
                      .targets = g->targets,
                      .x = g->act[cur],
                      .y = g->act[cur ^ 1],
                      .saved = g->scratch,
                      .tied_weight = tied_weight(g, u),
                      .loss = g->loss};
    TS_CHECK(ts_unit_forward(m, u, &g->ctx, g->params[u], &a));
    cur ^= 1;
  }
  *logits = ts_unit_logits(m, last, g->scratch, 1, T, g->o.dtype);
  return TS_OK;
}

/* Row `row` of the (V) logits at dev (storage dtype) into host fp32. */
static ts_status logits_to_host(ts_generator *g, const void *dev, size_t row, float *host) {
  size_t V = g->m->vocab_size, es = ts_dtype_size(g->o.dtype);
  const char *at = (const char *)dev + row * V * es;
  if (g->o.dtype == TS_FP32) return ts_k_to_host(&g->ctx, host, at, V * 4);
  TS_CHECK(ts_k_cast(&g->ctx, g->wide, TS_FP32, at, g->o.dtype, V)); /* widened on the device */
  return ts_k_to_host(&g->ctx, host, g->wide, V * 4);
}

/* Every id of tokens (n) in [0, V), or TS_ERR_INVALID_ARGUMENT naming one. */
static ts_status check_ids(const ts_model *m, const int32_t *tokens, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (tokens[i] < 0 || (size_t)tokens[i] >= m->vocab_size)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "generate: token %d: expected 0..%zu of %s",
                          tokens[i], m->vocab_size - 1, ts_model_origin(m));
  return TS_OK;
}

ts_status ts_generator_forward(ts_generator *g, const int32_t *tokens, size_t n,
                               const size_t *rows, size_t n_rows, float *logits) {
  const ts_model *m = g->m;
  if (n == 0 || n > g->o.max_T)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "generate: a sequence of %zu tokens: expected 1..%zu (the generator's "
                        "`max_T`)",
                        n, g->o.max_T);
  TS_CHECK(check_ids(m, tokens, n));
  for (size_t r = 0; r < n_rows; r++)
    if (rows[r] >= n)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "generate: row %zu of a %zu-token sequence",
                          rows[r], n);
  if (!g->targets) { /* a cached generator: the forward's targets and loss, once */
    TS_CHECK(dev_alloc(g, g->o.max_T * sizeof(int32_t), (void **)&g->targets));
    TS_CHECK(dev_alloc(g, 2 * sizeof(double), (void **)&g->loss));
    int32_t *ignore = malloc(g->o.max_T * sizeof *ignore);
    if (!ignore) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "generate: targets");
    for (size_t i = 0; i < g->o.max_T; i++) ignore[i] = TS_IGNORE_INDEX;
    ts_status st = ts_k_from_host(&g->ctx, g->targets, ignore, g->o.max_T * sizeof *ignore);
    free(ignore);
    TS_CHECK(st);
  }
  const void *out = NULL;
  TS_CHECK(ts_k_from_host(&g->ctx, g->ids, tokens, n * sizeof *tokens));
  TS_CHECK(run_forward(g, n, &out));
  for (size_t r = 0; r < n_rows; r++) /* (append uploads its own ids again) */
    TS_CHECK(logits_to_host(g, out, rows[r], logits + r * m->vocab_size));
  return TS_OK;
}

ts_status ts_generator_append(ts_generator *g, const int32_t *tokens, size_t n, float *logits) {
  const ts_model *m = g->m;
  if (n == 0 || n > g->o.max_T - g->len)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "generate: %zu new positions after %zu: expected 1..%zu (the "
                        "generator's max_T)",
                        n, g->len, g->o.max_T - g->len);
  TS_CHECK(check_ids(m, tokens, n));
  memcpy(g->seq + g->len, tokens, n * sizeof *tokens);
  const void *out = g->logits;
  size_t row = 0;
  ts_status st;
  if (g->o.recompute) {
    st = ts_k_from_host(&g->ctx, g->ids, g->seq, (g->len + n) * sizeof *tokens);
    if (st == TS_OK) st = run_forward(g, g->len + n, &out);
    row = g->len + n - 1;
  } else {
    st = ts_k_from_host(&g->ctx, g->ids, tokens, n * sizeof *tokens);
    if (st == TS_OK) st = run_decode(g, n);
  }
  if (st == TS_OK) st = logits_to_host(g, out, row, logits);
  if (st != TS_OK) return st;
  g->len += n;
  return TS_OK;
}

/* ---- sampling ------------------------------------------------------------------ */

typedef struct scored {
  float v;
  int32_t id;
} scored;

/* Ascending by value, then by id. */
static int by_value(const void *a, const void *b) {
  const scored *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

static int32_t argmax(const float *x, size_t V) {
  size_t best = 0;
  for (size_t i = 1; i < V; i++)
    if (x[i] > x[best]) best = i;
  return (int32_t)best;
}

int32_t ts_sample(float *logits, size_t V, const ts_sampling *s, uint64_t *rng) {
  if (!(s->temperature > 0.0f)) return argmax(logits, V);
  for (size_t i = 0; i < V; i++) logits[i] /= s->temperature;
  int cut_k = s->top_k > 0 && s->top_k < V, cut_p = s->top_p < 1.0f;
  scored *o = (cut_k || cut_p) ? malloc(V * sizeof *o) : NULL;
  if (o) {
    for (size_t i = 0; i < V; i++) o[i] = (scored){logits[i], (int32_t)i};
    qsort(o, V, sizeof *o, by_value);
    if (cut_k) { /* TopKLogitsWarper: below the k-th largest value -> -inf */
      float kth = o[V - s->top_k].v;
      for (size_t i = 0; i < V; i++)
        if (o[i].v < kth) o[i].v = logits[o[i].id] = -INFINITY;
    }
    if (cut_p) { /* TopPLogitsWarper: ascending cumulative probability <= 1 - p -> -inf */
      double mx = o[V - 1].v, z = 0.0, cum = 0.0;
      for (size_t i = 0; i < V; i++) z += exp((double)o[i].v - mx);
      for (size_t i = 0; i + 1 < V; i++) { /* the largest is always kept */
        cum += exp((double)o[i].v - mx) / z;
        if (cum <= 1.0 - (double)s->top_p) logits[o[i].id] = -INFINITY;
      }
    }
    free(o);
  }
  float mx = logits[argmax(logits, V)];
  double z = 0.0;
  for (size_t i = 0; i < V; i++) z += exp((double)logits[i] - mx);
  double u = (double)(ts_splitmix64(rng) >> 11) * 0x1.0p-53 * z, cum = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < V; i++) {
    double p = exp((double)logits[i] - mx);
    if (p == 0.0) continue;
    cum += p;
    last = (int32_t)i;
    if (cum > u) return last;
  }
  return last;
}

ts_status ts_generate(ts_generator *g, const int32_t *prompt, size_t n, size_t max_new,
                      const ts_sampling *s, const int32_t *stop, size_t n_stop, int32_t *out,
                      size_t *n_out, ts_token_fn on_token, void *user) {
  *n_out = 0;
  if (n == 0 || n > g->o.max_T || max_new > g->o.max_T - n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "generate: a prompt of %zu tokens and %zu new ones: expected a prompt "
                        "and at most %zu positions in all (the generator's `max_T`)",
                        n, max_new, g->o.max_T);
  ts_generator_reset(g);
  float *logits = malloc(g->m->vocab_size * sizeof *logits);
  if (!logits) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "generate: logits");
  uint64_t rng = s->seed;
  ts_status st = max_new ? ts_generator_append(g, prompt, n, logits) : TS_OK;
  for (size_t k = 0; st == TS_OK && k < max_new; k++) {
    int32_t tok = ts_sample(logits, g->m->vocab_size, s, &rng);
    out[(*n_out)++] = tok;
    int halt = on_token && on_token(user, tok);
    for (size_t i = 0; i < n_stop; i++) halt |= tok == stop[i];
    if (halt || k + 1 == max_new) break;
    st = ts_generator_append(g, &tok, 1, logits);
  }
  free(logits);
  return st;
}

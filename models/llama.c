/* llama.c — units of the LLaMA decoder: layout, init, forward, backward.
 * Matches transformers' LlamaForCausalLM (modeling_llama.py) in fp32. */
#include "models/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

/* Indices of a block's tensors in layout order (Hugging Face order). */
enum {
  B_LN1 = 0, B_WQ, B_WK, B_WV, B_WO, B_LN2, B_WGATE, B_WUP, B_WDOWN,
};
/* Indices of the head's tensors. */
enum { H_NORM = 0, H_LM_HEAD = 1 };

static void add_tensor(ts_unit *u, const char *name, size_t rows, size_t cols, int ndim) {
  ts_tensor_spec *t = &u->tensors[u->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = rows * cols;
  t->offset = u->numel;
  t->decay = ndim >= 2;
  u->numel += t->numel;
}

ts_status ts_llama_init(ts_llama *m, const ts_llama_config *cfg) {
  memset(m, 0, sizeof *m);
  TS_CHECK(ts_llama_config_validate(cfg));
  m->cfg = *cfg;
  size_t L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
  size_t HS = ts_llama_head_size(cfg);
  size_t QD = cfg->num_attention_heads * HS, KVD = cfg->num_key_value_heads * HS;
  m->n_units = (int)L + 2;
  m->units = calloc((size_t)m->n_units, sizeof *m->units);
  if (!m->units) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "llama: cannot allocate %d units",
                                     m->n_units);
  ts_unit *e = &m->units[0];
  e->kind = TS_UNIT_EMBEDDING;
  e->layer = -1;
  add_tensor(e, "model.embed_tokens.weight", cfg->vocab_size, C, 2);
  char name[80];
  for (size_t l = 0; l < L; l++) {
    ts_unit *b = &m->units[1 + l];
    b->kind = TS_UNIT_BLOCK;
    b->layer = (int)l;
#define BT(suffix, r, c, nd)                                              \
  snprintf(name, sizeof name, "model.layers.%zu." suffix, l);             \
  add_tensor(b, name, r, c, nd)
    BT("input_layernorm.weight", C, 1, 1);
    BT("self_attn.q_proj.weight", QD, C, 2);
    BT("self_attn.k_proj.weight", KVD, C, 2);
    BT("self_attn.v_proj.weight", KVD, C, 2);
    BT("self_attn.o_proj.weight", C, QD, 2);
    BT("post_attention_layernorm.weight", C, 1, 1);
    BT("mlp.gate_proj.weight", I, C, 2);
    BT("mlp.up_proj.weight", I, C, 2);
    BT("mlp.down_proj.weight", C, I, 2);
#undef BT
  }
  ts_unit *h = &m->units[L + 1];
  h->kind = TS_UNIT_HEAD;
  h->layer = -1;
  add_tensor(h, "model.norm.weight", C, 1, 1);
  if (!cfg->tie_word_embeddings) add_tensor(h, "lm_head.weight", cfg->vocab_size, C, 2);
  return TS_OK;
}

void ts_llama_free(ts_llama *m) {
  free(m->units);
  m->units = NULL;
  m->n_units = 0;
}

/* ---- deterministic init ---------------------------------------------------- */

/* Uniform in (0, 1) with 53 random bits. */
static double uniform01(uint64_t *s) {
  return ((double)(ts_splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

ts_status ts_llama_init_unit(const ts_llama *m, int u, void *params, ts_dtype dt, uint64_t seed) {
  if (u < 0 || u >= m->n_units)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "llama: unit %d: expected 0..%d", u,
                        m->n_units - 1);
  const ts_unit *unit = &m->units[u];
  ts_kctx cpu = {TS_DEVICE_CPU, NULL, NULL, 0};
  size_t es = ts_dtype_size(dt);
  float chunk[1024];
  for (int i = 0; i < unit->n_tensors; i++) {
    const ts_tensor_spec *t = &unit->tensors[i];
    uint64_t s = seed ^ ts_fnv1a64(t->name);
    ts_splitmix64(&s);
    for (size_t j = 0; j < t->numel; j += 1024) {
      size_t n = t->numel - j < 1024 ? t->numel - j : 1024;
      for (size_t k = 0; k < n; k++) {
        if (t->ndim == 1) {
          chunk[k] = 1.0f;
        } else {
          /* Box–Muller; one normal per pair of uniforms keeps it simple. */
          double u1 = uniform01(&s), u2 = uniform01(&s);
          chunk[k] = (float)(0.02 * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        }
      }
      TS_CHECK(ts_k_cast(&cpu, (char *)params + (t->offset + j) * es, dt, chunk, TS_FP32, n));
    }
  }
  return TS_OK;
}

/* ---- sizes ----------------------------------------------------------------- */

typedef struct dims {
  size_t B, T, N, C, I, V, NH, NKV, HS, QD, KVD;
} dims;

static dims get_dims(const ts_llama *m, size_t B, size_t T) {
  const ts_llama_config *c = &m->cfg;
  dims d;
  d.B = B;
  d.T = T;
  d.N = B * T;
  d.C = c->hidden_size;
  d.I = c->intermediate_size;
  d.V = c->vocab_size;
  d.NH = c->num_attention_heads;
  d.NKV = c->num_key_value_heads;
  d.HS = ts_llama_head_size(c);
  d.QD = d.NH * d.HS;
  d.KVD = d.NKV * d.HS;
  return d;
}

/* Pointers into a block's saved buffer; fp32 vectors first. */
typedef struct block_saved {
  float *rstd1, *rstd2;  /* (N) */
  void *xn1, *xmid, *xn2; /* (N, C) */
  void *q, *att;         /* (N, QD) */
  void *k, *v;           /* (N, KVD) */
  void *probs;           /* (B, NH, T, T) */
  void *gate, *up, *h;   /* (N, I) */
  size_t bytes;
} block_saved;

/* Carves n elements of size es from *p and returns the region. */
static void *carve(char **p, size_t n, size_t es) {
  void *r = *p;
  *p += n * es;
  return r;
}

static block_saved block_layout(const dims *d, void *base, ts_dtype dt) {
  block_saved s;
  size_t es = ts_dtype_size(dt);
  char *p = base;
  s.rstd1 = carve(&p, d->N, 4);
  s.rstd2 = carve(&p, d->N, 4);
  s.xn1 = carve(&p, d->N * d->C, es);
  s.xmid = carve(&p, d->N * d->C, es);
  s.xn2 = carve(&p, d->N * d->C, es);
  s.q = carve(&p, d->N * d->QD, es);
  s.att = carve(&p, d->N * d->QD, es);
  s.k = carve(&p, d->N * d->KVD, es);
  s.v = carve(&p, d->N * d->KVD, es);
  s.probs = carve(&p, d->B * d->NH * d->T * d->T, es);
  s.gate = carve(&p, d->N * d->I, es);
  s.up = carve(&p, d->N * d->I, es);
  s.h = carve(&p, d->N * d->I, es);
  s.bytes = (size_t)(p - (char *)base);
  return s;
}

typedef struct head_saved {
  float *rstd;  /* (N) */
  void *xn;     /* (N, C) */
  void *logits; /* (N, V) */
  size_t bytes;
} head_saved;

static head_saved head_layout(const dims *d, void *base, ts_dtype dt) {
  head_saved s;
  size_t es = ts_dtype_size(dt);
  char *p = base;
  s.rstd = carve(&p, d->N, 4);
  s.xn = carve(&p, d->N * d->C, es);
  s.logits = carve(&p, d->N * d->V, es);
  s.bytes = (size_t)(p - (char *)base);
  return s;
}

size_t ts_llama_saved_bytes(const ts_llama *m, int u, size_t B, size_t T, ts_dtype dt) {
  TS_ASSERT(u >= 0 && u < m->n_units);
  dims d = get_dims(m, B, T);
  switch (m->units[u].kind) {
    case TS_UNIT_EMBEDDING: return 0;
    case TS_UNIT_BLOCK: return block_layout(&d, NULL, dt).bytes;
    case TS_UNIT_HEAD: return head_layout(&d, NULL, dt).bytes;
  }
  return 0;
}

/* Block backward temporaries in the workspace, before the kernels' share. */
typedef struct block_temps {
  void *d_xmid, *d_xn, *d_tmp; /* (N, C) */
  void *d_h, *d_gate, *d_up;   /* (N, I) */
  void *d_att, *dq;            /* (N, QD) */
  void *dk, *dv;               /* (N, KVD) */
  size_t bytes;
} block_temps;

static block_temps block_temps_layout(const dims *d, void *base, ts_dtype dt) {
  block_temps t;
  size_t es = ts_dtype_size(dt);
  char *p = base;
  t.d_xmid = carve(&p, d->N * d->C, es);
  t.d_xn = carve(&p, d->N * d->C, es);
  t.d_tmp = carve(&p, d->N * d->C, es);
  t.d_h = carve(&p, d->N * d->I, es);
  t.d_gate = carve(&p, d->N * d->I, es);
  t.d_up = carve(&p, d->N * d->I, es);
  t.d_att = carve(&p, d->N * d->QD, es);
  t.dq = carve(&p, d->N * d->QD, es);
  t.dk = carve(&p, d->N * d->KVD, es);
  t.dv = carve(&p, d->N * d->KVD, es);
  t.bytes = (size_t)(p - (char *)base);
  return t;
}

/* Head temporaries: fp32 row losses (forward), d_xn (backward). */
static size_t head_temps_bytes(const dims *d, ts_dtype dt) {
  size_t f = d->N * 4, b = d->N * d->C * ts_dtype_size(dt);
  return f > b ? f : b;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

/* Largest kernel workspace any op of a unit asks for. */
static size_t kernel_ws(const dims *d, ts_unit_kind kind, ts_dtype dt, ts_device dev) {
  size_t w = 0;
  if (kind == TS_UNIT_BLOCK) {
    w = max2(w, ts_k_linear_workspace_bytes(dev, d->N, d->QD, d->C, dt));
    w = max2(w, ts_k_linear_workspace_bytes(dev, d->N, d->KVD, d->C, dt));
    w = max2(w, ts_k_linear_workspace_bytes(dev, d->N, d->C, d->QD, dt));
    w = max2(w, ts_k_linear_workspace_bytes(dev, d->N, d->I, d->C, dt));
    w = max2(w, ts_k_linear_workspace_bytes(dev, d->N, d->C, d->I, dt));
    w = max2(w, ts_k_attention_workspace_bytes(dev, d->B, d->T, d->NH, d->NKV, d->HS, dt));
  } else if (kind == TS_UNIT_HEAD) {
    w = ts_k_linear_workspace_bytes(dev, d->N, d->V, d->C, dt);
  } else if (kind == TS_UNIT_EMBEDDING) {
    /* forward needs none; backward gets the whole of ctx (no temps). */
    w = ts_k_embedding_workspace_bytes(dev, d->N, dt);
  }
  return w;
}

/* Temporaries are rounded to 64 bytes so the kernels' share stays aligned. */
static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t temps_bytes(const dims *d, ts_unit_kind kind, ts_dtype dt) {
  if (kind == TS_UNIT_BLOCK) return round64(block_temps_layout(d, NULL, dt).bytes);
  if (kind == TS_UNIT_HEAD) return round64(head_temps_bytes(d, dt));
  return 0;
}

size_t ts_llama_workspace_bytes(const ts_llama *m, int u, size_t B, size_t T, ts_dtype dt,
                                ts_device dev) {
  TS_ASSERT(u >= 0 && u < m->n_units);
  dims d = get_dims(m, B, T);
  ts_unit_kind kind = m->units[u].kind;
  return temps_bytes(&d, kind, dt) + kernel_ws(&d, kind, dt, dev);
}

void *ts_llama_head_logits(const ts_llama *m, void *saved, size_t B, size_t T, ts_dtype dt) {
  dims d = get_dims(m, B, T);
  return head_layout(&d, saved, dt).logits;
}

double ts_llama_flops_per_token(const ts_llama_config *c, size_t T) {
  size_t C = c->hidden_size, HS = ts_llama_head_size(c);
  size_t QD = c->num_attention_heads * HS, KVD = c->num_key_value_heads * HS;
  double per_block = (double)(QD * C + 2 * KVD * C + C * QD + 3 * c->intermediate_size * C);
  double matmul = (double)c->num_hidden_layers * per_block + (double)c->vocab_size * C;
  return 6.0 * matmul + 12.0 * (double)c->num_hidden_layers * (double)C * (double)T;
}

/* ---- forward / backward ------------------------------------------------------ */

/* Pointer to tensor i of a unit's flat buffer. */
static void *tensor(const ts_unit *u, int i, const void *flat, ts_dtype dt) {
  return (char *)flat + u->tensors[i].offset * ts_dtype_size(dt);
}

/* Splits ctx's workspace: the first `temps` bytes for the unit, the rest
 * for the kernels (in *kctx). */
static ts_status split_ws(const ts_kctx *ctx, size_t temps, size_t need, ts_kctx *kctx,
                          const char *what) {
  if (ctx->workspace_bytes < need)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "llama %s: workspace has %zu bytes, needs %zu",
                        what, ctx->workspace_bytes, need);
  *kctx = *ctx;
  kctx->workspace = (char *)ctx->workspace + temps;
  kctx->workspace_bytes = ctx->workspace_bytes - temps;
  return TS_OK;
}

static ts_status check_args(const ts_llama *m, int u, const ts_unit_args *a) {
  if (u < 0 || u >= m->n_units)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "llama: unit %d: expected 0..%d", u,
                        m->n_units - 1);
  if (a->T == 0 || a->B == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "llama: micro-batch %zu x seq %zu: expected > 0",
                        a->B, a->T);
  if (a->T > m->cfg.max_position_embeddings)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "sequence length %zu: expected at most max_position_embeddings = %zu "
                        "of %s",
                        a->T, m->cfg.max_position_embeddings, ts_llama_config_origin(&m->cfg));
  return TS_OK;
}

static ts_status block_forward(const ts_llama *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  ts_kctx k;
  TS_CHECK(split_ws(ctx, 0, ts_llama_workspace_bytes(m, 1 + un->layer, a->B, a->T, dt, ctx->device), &k,
                    "block forward"));
  block_saved s = block_layout(&d, a->saved, dt);
  float eps = m->cfg.rms_norm_eps, theta = m->cfg.rope_theta;
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn1, s.rstd1, a->x, tensor(un, B_LN1, p, dt), d.N, d.C, eps,
                                dt));
  TS_CHECK(ts_k_linear_forward(&k, s.q, s.xn1, tensor(un, B_WQ, p, dt), d.N, d.QD, d.C, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.k, s.xn1, tensor(un, B_WK, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.v, s.xn1, tensor(un, B_WV, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_rope_forward(&k, s.q, s.q, d.B, d.T, d.NH, d.HS, theta, dt));
  TS_CHECK(ts_k_rope_forward(&k, s.k, s.k, d.B, d.T, d.NKV, d.HS, theta, dt));
  TS_CHECK(ts_k_attention_forward(&k, s.att, s.probs, s.q, s.k, s.v, d.B, d.T, d.NH, d.NKV, d.HS,
                                  dt));
  TS_CHECK(ts_k_linear_forward(&k, s.xmid, s.att, tensor(un, B_WO, p, dt), d.N, d.C, d.QD, dt));
  TS_CHECK(ts_k_add(&k, s.xmid, s.xmid, a->x, d.N * d.C, dt));
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn2, s.rstd2, s.xmid, tensor(un, B_LN2, p, dt), d.N, d.C,
                                eps, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.gate, s.xn2, tensor(un, B_WGATE, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.up, s.xn2, tensor(un, B_WUP, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(ts_k_swiglu_forward(&k, s.h, s.gate, s.up, d.N * d.I, dt));
  TS_CHECK(ts_k_linear_forward(&k, a->y, s.h, tensor(un, B_WDOWN, p, dt), d.N, d.C, d.I, dt));
  return ts_k_add(&k, a->y, a->y, s.xmid, d.N * d.C, dt);
}

static ts_status block_backward(const ts_llama *m, const ts_unit *un, const ts_kctx *ctx,
                                const void *p, void *g, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  float theta = m->cfg.rope_theta;
  size_t temps = temps_bytes(&d, TS_UNIT_BLOCK, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, ts_llama_workspace_bytes(m, 1 + un->layer, a->B, a->T, dt, ctx->device), &k,
                    "block backward"));
  block_saved s = block_layout(&d, a->saved, dt);
  block_temps t = block_temps_layout(&d, ctx->workspace, dt);
  size_t NC = d.N * d.C;
  /* MLP: y = xmid + down(silu(gate) * up) */
  TS_CHECK(ts_k_cast(&k, t.d_xmid, dt, a->dy, dt, NC));
  TS_CHECK(ts_k_linear_backward(&k, t.d_h, tensor(un, B_WDOWN, g, dt), a->dy, s.h,
                                tensor(un, B_WDOWN, p, dt), d.N, d.C, d.I, dt));
  TS_CHECK(ts_k_swiglu_backward(&k, t.d_gate, t.d_up, t.d_h, s.gate, s.up, d.N * d.I, dt));
  TS_CHECK(ts_k_linear_backward(&k, t.d_xn, tensor(un, B_WGATE, g, dt), t.d_gate, s.xn2,
                                tensor(un, B_WGATE, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(ts_k_linear_backward(&k, t.d_tmp, tensor(un, B_WUP, g, dt), t.d_up, s.xn2,
                                tensor(un, B_WUP, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(ts_k_rmsnorm_backward(&k, t.d_xmid, tensor(un, B_LN2, g, dt), t.d_xn, s.xmid,
                                 tensor(un, B_LN2, p, dt), s.rstd2, d.N, d.C, dt));
  /* attention: xmid = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))) */
  TS_CHECK(ts_k_linear_backward(&k, t.d_att, tensor(un, B_WO, g, dt), t.d_xmid, s.att,
                                tensor(un, B_WO, p, dt), d.N, d.C, d.QD, dt));
  TS_CHECK(ts_k_attention_backward(&k, t.dq, t.dk, t.dv, t.d_att, s.q, s.k, s.v, s.probs, d.B,
                                   d.T, d.NH, d.NKV, d.HS, dt));
  TS_CHECK(ts_k_rope_backward(&k, t.dq, t.dq, d.B, d.T, d.NH, d.HS, theta, dt));
  TS_CHECK(ts_k_rope_backward(&k, t.dk, t.dk, d.B, d.T, d.NKV, d.HS, theta, dt));
  TS_CHECK(ts_k_linear_backward(&k, t.d_xn, tensor(un, B_WQ, g, dt), t.dq, s.xn1,
                                tensor(un, B_WQ, p, dt), d.N, d.QD, d.C, dt));
  TS_CHECK(ts_k_linear_backward(&k, t.d_tmp, tensor(un, B_WK, g, dt), t.dk, s.xn1,
                                tensor(un, B_WK, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(ts_k_linear_backward(&k, t.d_tmp, tensor(un, B_WV, g, dt), t.dv, s.xn1,
                                tensor(un, B_WV, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(ts_k_cast(&k, a->dx, dt, t.d_xmid, dt, NC));
  return ts_k_rmsnorm_backward(&k, a->dx, tensor(un, B_LN1, g, dt), t.d_xn, a->x,
                               tensor(un, B_LN1, p, dt), s.rstd1, d.N, d.C, dt);
}

/* The LM head's weight and gradient: its own, or the tied embedding's. */
static ts_status head_weight(const ts_llama *m, const ts_unit *un, const void *p, void *g,
                             const ts_unit_args *a, const void **w, void **gw) {
  if (m->cfg.tie_word_embeddings) {
    if (!a->tied_weight)
      return ts_set_error(TS_ERR_INVALID_USAGE,
                          "llama head: tie_word_embeddings needs the embedding weight");
    *w = a->tied_weight;
    if (gw) {
      if (!a->tied_grad)
        return ts_set_error(TS_ERR_INVALID_USAGE,
                            "llama head: tie_word_embeddings needs the embedding gradient");
      *gw = a->tied_grad;
    }
  } else {
    *w = tensor(un, H_LM_HEAD, p, a->dt);
    if (gw) *gw = tensor(un, H_LM_HEAD, g, a->dt);
  }
  return TS_OK;
}

static ts_status head_forward(const ts_llama *m, const ts_unit *un, const ts_kctx *ctx,
                              const void *p, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  size_t temps = temps_bytes(&d, TS_UNIT_HEAD, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, ts_llama_workspace_bytes(m, m->n_units - 1, a->B, a->T, dt, ctx->device), &k,
                    "head forward"));
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  TS_CHECK(head_weight(m, un, p, NULL, a, &w, NULL));
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn, s.rstd, a->x, tensor(un, H_NORM, p, dt), d.N, d.C,
                                m->cfg.rms_norm_eps, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.logits, s.xn, w, d.N, d.V, d.C, dt));
  float *rows = ctx->workspace;
  TS_CHECK(ts_k_cross_entropy_forward(&k, rows, s.logits, a->targets, d.N, d.V, dt));
  double sum = 0;
  size_t count = 0;
  for (size_t i = 0; i < d.N; i++) {
    if (a->targets[i] == TS_IGNORE_INDEX) continue;
    sum += rows[i];
    count++;
  }
  a->loss_sum = sum;
  a->loss_count = count;
  return TS_OK;
}

static ts_status head_backward(const ts_llama *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, void *g, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  size_t temps = temps_bytes(&d, TS_UNIT_HEAD, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, ts_llama_workspace_bytes(m, m->n_units - 1, a->B, a->T, dt, ctx->device), &k,
                    "head backward"));
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  void *gw = NULL;
  TS_CHECK(head_weight(m, un, p, g, a, &w, &gw));
  void *d_xn = ctx->workspace;
  TS_CHECK(ts_k_cross_entropy_backward(&k, s.logits, s.logits, a->targets, d.N, d.V, a->dloss,
                                       dt));
  TS_CHECK(ts_k_linear_backward(&k, d_xn, gw, s.logits, s.xn, w, d.N, d.V, d.C, dt));
  TS_CHECK(ts_k_zero(&k, a->dx, d.N * d.C * ts_dtype_size(dt)));
  return ts_k_rmsnorm_backward(&k, a->dx, tensor(un, H_NORM, g, dt), d_xn, a->x,
                               tensor(un, H_NORM, p, dt), s.rstd, d.N, d.C, dt);
}

ts_status ts_llama_forward(const ts_llama *m, int u, const ts_kctx *ctx, const void *params,
                           ts_unit_args *a) {
  TS_CHECK(check_args(m, u, a));
  const ts_unit *un = &m->units[u];
  switch (un->kind) {
    case TS_UNIT_EMBEDDING:
      return ts_k_embedding_forward(ctx, a->y, a->tokens, params, a->B * a->T, m->cfg.hidden_size,
                                    m->cfg.vocab_size, a->dt);
    case TS_UNIT_BLOCK: return block_forward(m, un, ctx, params, a);
    case TS_UNIT_HEAD: return head_forward(m, un, ctx, params, a);
  }
  return ts_set_error(TS_ERR_INTERNAL, "llama: unit %d has unknown kind", u);
}

ts_status ts_llama_backward(const ts_llama *m, int u, const ts_kctx *ctx, const void *params,
                            void *grads, ts_unit_args *a) {
  TS_CHECK(check_args(m, u, a));
  const ts_unit *un = &m->units[u];
  switch (un->kind) {
    case TS_UNIT_EMBEDDING:
      return ts_k_embedding_backward(ctx, grads, a->dy, a->tokens, a->B * a->T,
                                     m->cfg.hidden_size, m->cfg.vocab_size, a->dt);
    case TS_UNIT_BLOCK: return block_backward(m, un, ctx, params, grads, a);
    case TS_UNIT_HEAD: return head_backward(m, un, ctx, params, grads, a);
  }
  return ts_set_error(TS_ERR_INTERNAL, "llama: unit %d has unknown kind", u);
}

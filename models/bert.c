/*
 * bert.c — the BERT family (models/bert.h): config.json -> units, and the
 * ops tables of its three unit kinds (embeddings, encoder block, MLM head):
 * layout, saved and workspace bytes, forward, backward, logits. Matches
 * transformers' BertForMaskedLM (modeling_bert.py) in fp32
 * (tests/bert_parity_test).
 */
#include "models/bert.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/bert_internal.h"
#include "models/family.h"

/* Tensor indices in layout order (Hugging Face names below). */
enum { E_WORD = 0, E_POS, E_TYPE, E_LN_W, E_LN_B };
enum {
  B_Q_W = 0, B_Q_B, B_K_W, B_K_B, B_V_W, B_V_B, B_O_W, B_O_B, B_LN1_W, B_LN1_B,
  B_I_W, B_I_B, B_OUT_W, B_OUT_B, B_LN2_W, B_LN2_B,
};
enum { H_T_W = 0, H_T_B, H_LN_W, H_LN_B, H_BIAS, H_DEC_W /* untied only */ };

static const ts_unit_ops embedding_ops, block_ops, head_ops;

const ts_bert_config *ts_bert_config_of(const ts_model *m) {
  TS_ASSERT(m->family == &ts_bert_family);
  return (const ts_bert_config *)m->impl;
}

/* Matrices start N(0, initializer_range^2), LayerNorm weights at 1, biases
 * at 0 (BertPreTrainedModel._init_weights; the [PAD] row of the word
 * embeddings is not zeroed). */
static void matrix(ts_unit *u, const char *name, size_t r, size_t c, double std) {
  ts_family_add_tensor(u, name, r, c, 2, TS_INIT_NORMAL, std);
}
static void vector(ts_unit *u, const char *name, size_t n, ts_init_kind init) {
  ts_family_add_tensor(u, name, n, 1, 1, init, 0.0);
}
/* A dense layer's weight (out, in) and bias (out), names prefix.weight/.bias. */
static void dense(ts_unit *u, const char *prefix, size_t out, size_t in, double std) {
  char name[96];
  snprintf(name, sizeof name, "%s.weight", prefix);
  matrix(u, name, out, in, std);
  snprintf(name, sizeof name, "%s.bias", prefix);
  vector(u, name, out, TS_INIT_ZEROS);
}
static void layernorm(ts_unit *u, const char *prefix, size_t C) {
  char name[96];
  snprintf(name, sizeof name, "%s.weight", prefix);
  vector(u, name, C, TS_INIT_ONES);
  snprintf(name, sizeof name, "%s.bias", prefix);
  vector(u, name, C, TS_INIT_ZEROS);
}

/* ts_model_family.init: the config.json object -> the model. */
static ts_status bert_init(ts_model *m, const void *root) {
  ts_bert_config cfg;
  TS_CHECK(ts_bert_config_from_json(root, m->source[0] ? m->source : m->name, &cfg));
  ts_bert_config *own = malloc(sizeof *own);
  size_t L = cfg.num_hidden_layers, C = cfg.hidden_size, I = cfg.intermediate_size;
  m->n_units = (int)L + 2;
  m->units = calloc((size_t)m->n_units, sizeof *m->units);
  if (!own || !m->units) {
    free(own);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "bert: cannot allocate %d units", m->n_units);
  }
  *own = cfg;
  m->impl = own;
  m->hidden_size = C;
  m->vocab_size = cfg.vocab_size;
  m->max_seq = cfg.max_position_embeddings;
  m->num_params = ts_bert_num_params(&cfg);
  m->objective = TS_OBJECTIVE_MASKED_LM;
  m->pad_token_id = cfg.pad_token_id;
  m->sep_token_id = cfg.sep_token_id;
  double std = cfg.initializer_range;
  ts_unit *e = &m->units[0];
  ts_family_start_unit(e, &embedding_ops, TS_UNIT_EMBEDDING, -1);
  matrix(e, "bert.embeddings.word_embeddings.weight", cfg.vocab_size, C, std);
  matrix(e, "bert.embeddings.position_embeddings.weight", cfg.max_position_embeddings, C, std);
  matrix(e, "bert.embeddings.token_type_embeddings.weight", cfg.type_vocab_size, C, std);
  layernorm(e, "bert.embeddings.LayerNorm", C);
  char p[96];
  for (size_t l = 0; l < L; l++) {
    ts_unit *b = &m->units[1 + l];
    ts_family_start_unit(b, &block_ops, TS_UNIT_BLOCK, (int)l);
#define LAYER(suffix) (snprintf(p, sizeof p, "bert.encoder.layer.%zu." suffix, l), p)
    dense(b, LAYER("attention.self.query"), C, C, std);
    dense(b, LAYER("attention.self.key"), C, C, std);
    dense(b, LAYER("attention.self.value"), C, C, std);
    dense(b, LAYER("attention.output.dense"), C, C, std);
    layernorm(b, LAYER("attention.output.LayerNorm"), C);
    dense(b, LAYER("intermediate.dense"), I, C, std);
    dense(b, LAYER("output.dense"), C, I, std);
    layernorm(b, LAYER("output.LayerNorm"), C);
#undef LAYER
  }
  ts_unit *h = &m->units[L + 1];
  ts_family_start_unit(h, &head_ops, TS_UNIT_HEAD, -1);
  dense(h, "cls.predictions.transform.dense", C, C, std);
  layernorm(h, "cls.predictions.transform.LayerNorm", C);
  /* The decoder's bias: tied, transformers 5 ties cls.predictions.decoder.bias
   * to cls.predictions.bias; untied, its forward adds decoder.bias and never
   * reads cls.predictions.bias (BertLMPredictionHead: transform, decoder). */
  vector(h, cfg.tie_word_embeddings ? "cls.predictions.bias" : "cls.predictions.decoder.bias",
         cfg.vocab_size, TS_INIT_ZEROS);
  if (cfg.tie_word_embeddings) {
    h->tied_unit = 0; /* the decoder is the word embeddings */
    h->tied_tensor = E_WORD;
  } else {
    matrix(h, "cls.predictions.decoder.weight", cfg.vocab_size, C, std);
  }
  return TS_OK;
}

static void bert_free(ts_model *m) {
  free(m->impl);
  m->impl = NULL;
}

/* PaLM's count (Chowdhery et al. 2022, App. B): 6 x matmul parameters
 * (the decoder included, embedding lookups excluded) + 12 L C T. */
/* ts_model_family.ignorable: the position-id and token-type buffers; the
 * tied decoder's copies (weight: the word embeddings; bias:
 * cls.predictions.bias; hf_folder checks they are equal); an untied model's
 * cls.predictions.bias, which transformers' forward never reads; and
 * BertForPreTraining's pooler and next-sentence head. */
static int bert_ignorable(const ts_model *m, const char *name) {
  int tied = m->units[m->n_units - 1].tied_unit >= 0;
  if (!strcmp(name, ts_bert_family.tied_copy) || !strcmp(name, ts_bert_family.tied_copy2))
    return tied;
  if (!strcmp(name, "cls.predictions.bias")) return !tied;
  return !strcmp(name, "bert.embeddings.position_ids") ||
         !strcmp(name, "bert.embeddings.token_type_ids") || !strncmp(name, "bert.pooler.", 12) ||
         !strncmp(name, "cls.seq_relationship.", 21);
}

#define FIELD(name, type) \
  { #name, offsetof(ts_bert_config, name), type }
static const ts_config_field FIELDS[] = {
    FIELD(hidden_size, TS_CONFIG_SIZE),
    FIELD(intermediate_size, TS_CONFIG_SIZE),
    FIELD(num_hidden_layers, TS_CONFIG_SIZE),
    FIELD(num_attention_heads, TS_CONFIG_SIZE),
    FIELD(vocab_size, TS_CONFIG_SIZE),
    FIELD(max_position_embeddings, TS_CONFIG_SIZE),
    FIELD(type_vocab_size, TS_CONFIG_SIZE),
    FIELD(layer_norm_eps, TS_CONFIG_FLOAT),
    FIELD(initializer_range, TS_CONFIG_DOUBLE),
    {"hidden_act", offsetof(ts_bert_config, act), TS_CONFIG_INT},
    FIELD(tie_word_embeddings, TS_CONFIG_INT),
    FIELD(pad_token_id, TS_CONFIG_INT32),
    FIELD(sep_token_id, TS_CONFIG_INT32),
};
#undef FIELD

const ts_model_family ts_bert_family = {
    .model_type = "bert",
    .architecture = "BertForMaskedLM",
    .init = bert_init,
    .free = bert_free,
    .ignorable = bert_ignorable,
    .tied_copy = "cls.predictions.decoder.weight",
    .tied_copy2 = "cls.predictions.decoder.bias",
    .tied_copy2_of = "cls.predictions.bias",
    .fields = FIELDS,
    .n_fields = sizeof FIELDS / sizeof FIELDS[0],
};

/* ---- sizes ----------------------------------------------------------------- */

typedef struct dims {
  size_t B, T, N, C, I, V, NH, HS, NT;
} dims;

static dims get_dims(const ts_model *m, size_t B, size_t T) {
  const ts_bert_config *c = ts_bert_config_of(m);
  dims d = {B, T, B * T, c->hidden_size, c->intermediate_size, c->vocab_size,
            c->num_attention_heads, c->hidden_size / c->num_attention_heads,
            c->type_vocab_size};
  return d;
}

typedef struct emb_saved {
  int32_t *types;    /* (N) token type ids */
  float *mean, *rstd; /* (N) */
  void *pre;         /* (N, C) the sum before LayerNorm */
  size_t bytes;
} emb_saved;

static emb_saved emb_layout(const dims *d, void *base, ts_dtype dt) {
  emb_saved s;
  char *p = base;
  s.types = ts_family_carve(base, &p, d->N, 4);
  s.mean = ts_family_carve(base, &p, d->N, 4);
  s.rstd = ts_family_carve(base, &p, d->N, 4);
  s.pre = ts_family_carve(base, &p, d->N * d->C, ts_dtype_size(dt));
  s.bytes = (size_t)(p - (char *)base);
  return s;
}

typedef struct block_saved {
  float *mean1, *rstd1, *mean2, *rstd2; /* (N) */
  void *q, *k, *v, *att;                /* (N, C) */
  void *att_state;                      /* ts_k_attention_state_bytes */
  void *s1, *h1, *s2;                   /* (N, C): pre-LayerNorm sums, LayerNorm 1's output */
  void *ipre, *g;                       /* (N, I): intermediate before and after GELU */
  size_t bytes;
} block_saved;

static block_saved block_layout(const dims *d, void *base, ts_dtype dt, ts_device dev) {
  block_saved s;
  size_t es = ts_dtype_size(dt), NC = d->N * d->C;
  char *p = base;
  s.mean1 = ts_family_carve(base, &p, d->N, 4);
  s.rstd1 = ts_family_carve(base, &p, d->N, 4);
  s.mean2 = ts_family_carve(base, &p, d->N, 4);
  s.rstd2 = ts_family_carve(base, &p, d->N, 4);
  s.q = ts_family_carve(base, &p, NC, es);
  s.k = ts_family_carve(base, &p, NC, es);
  s.v = ts_family_carve(base, &p, NC, es);
  s.att = ts_family_carve(base, &p, NC, es);
  s.att_state = ts_family_carve(
      base, &p, ts_k_attention_state_bytes(dev, d->B, d->T, d->NH, d->NH, d->HS, dt), 1);
  s.s1 = ts_family_carve(base, &p, NC, es);
  s.h1 = ts_family_carve(base, &p, NC, es);
  s.s2 = ts_family_carve(base, &p, NC, es);
  s.ipre = ts_family_carve(base, &p, d->N * d->I, es);
  s.g = ts_family_carve(base, &p, d->N * d->I, es);
  s.bytes = (size_t)(p - (char *)base);
  return s;
}

typedef struct head_saved {
  float *mean, *rstd; /* (N) */
  void *t, *g, *h;    /* (N, C): dense output, after GELU, after LayerNorm */
  void *logits;       /* (N, V) */
  size_t bytes;
} head_saved;

static head_saved head_layout(const dims *d, void *base, ts_dtype dt) {
  head_saved s;
  size_t es = ts_dtype_size(dt), NC = d->N * d->C;
  char *p = base;
  s.mean = ts_family_carve(base, &p, d->N, 4);
  s.rstd = ts_family_carve(base, &p, d->N, 4);
  s.t = ts_family_carve(base, &p, NC, es);
  s.g = ts_family_carve(base, &p, NC, es);
  s.h = ts_family_carve(base, &p, NC, es);
  s.logits = ts_family_carve(base, &p, d->N * d->V, es);
  s.bytes = (size_t)(p - (char *)base);
  return s;
}

/* The unit's own temporaries at the start of the workspace (the larger of
 * forward's and backward's), before the kernels' share. */
typedef struct temps {
  void *a, *b, *c, *d, *e, *f, *g; /* (N, C) */
  void *wide;                      /* (N, I) block; the [PAD] row (C) embeddings */
  size_t bytes;
} temps;

static temps temps_layout(const dims *d, ts_unit_role role, void *base, ts_dtype dt) {
  temps t;
  memset(&t, 0, sizeof t);
  size_t es = ts_dtype_size(dt), NC = d->N * d->C;
  char *p = base;
  if (role == TS_UNIT_EMBEDDING) { /* forward: the type gather; backward: d_pre, the pad row */
    t.a = ts_family_carve(base, &p, NC, es);
    t.wide = ts_family_carve(base, &p, d->C, es);
  } else if (role == TS_UNIT_BLOCK) { /* backward only */
    t.a = ts_family_carve(base, &p, NC, es);
    t.b = ts_family_carve(base, &p, NC, es);
    t.c = ts_family_carve(base, &p, NC, es);
    t.d = ts_family_carve(base, &p, NC, es);
    t.e = ts_family_carve(base, &p, NC, es);
    t.f = ts_family_carve(base, &p, NC, es);
    t.wide = ts_family_carve(base, &p, d->N * d->I, es);
  } else { /* head: backward's d_h and d_g; forward's fp32 row losses share their bytes */
    t.a = ts_family_carve(base, &p, NC, es);
    t.b = ts_family_carve(base, &p, NC, es);
    if ((size_t)(p - (char *)base) < d->N * 4) p = (char *)base + d->N * 4;
  }
  t.bytes = ts_family_round64((size_t)(p - (char *)base));
  return t;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

/* A dense layer's kernel workspace: its forward's (with the bias) and
 * backward's. */
static size_t linear_ws(ts_device dev, size_t rows, size_t cols, size_t in, ts_dtype dt) {
  return max2(ts_k_linear_bias_workspace_bytes(dev, rows, cols, in, dt),
              ts_k_linear_workspace_bytes(dev, rows, cols, in, dt));
}

/* Largest kernel workspace any op of a unit asks for. */
static size_t kernel_ws(const dims *d, ts_unit_role role, ts_dtype dt, ts_device dev) {
  size_t w = ts_k_layernorm_workspace_bytes(dev, d->N, d->C, dt);
  if (role == TS_UNIT_EMBEDDING) {
    w = max2(w, ts_k_embedding_workspace_bytes(dev, d->N, dt));
    w = max2(w, ts_k_bias_workspace_bytes(dev, d->B, d->T * d->C, dt));
  } else if (role == TS_UNIT_BLOCK) {
    w = max2(w, linear_ws(dev, d->N, d->C, d->C, dt));
    w = max2(w, linear_ws(dev, d->N, d->I, d->C, dt));
    w = max2(w, linear_ws(dev, d->N, d->C, d->I, dt));
    w = max2(w, ts_k_attention_workspace_bytes(dev, d->B, d->T, d->NH, d->NH, d->HS, dt));
    w = max2(w, ts_k_bias_workspace_bytes(dev, d->N, d->C, dt));
    w = max2(w, ts_k_bias_workspace_bytes(dev, d->N, d->I, dt));
  } else {
    w = max2(w, linear_ws(dev, d->N, d->V, d->C, dt));
    w = max2(w, linear_ws(dev, d->N, d->C, d->C, dt));
    w = max2(w, ts_k_bias_workspace_bytes(dev, d->N, d->V, dt));
    w = max2(w, ts_k_bias_workspace_bytes(dev, d->N, d->C, dt));
  }
  return w;
}

/* ts_unit_ops.saved_bytes and .workspace_bytes: what forward keeps besides
 * the input (embeddings: token types, LayerNorm statistics and input;
 * block: q, k, v, attention state and output, both residual sums, LayerNorm
 * 1's output, the MLP's hidden before and after GELU, four fp32 statistics
 * vectors; head: the transform before and after GELU and after LayerNorm,
 * the logits (B, T, V)), and the unit's temporaries plus its kernels'. */
static size_t unit_saved(const ts_model *m, const ts_unit *u, size_t B, size_t T, ts_dtype dt,
                         ts_device dev) {
  dims d = get_dims(m, B, T);
  if (u->role == TS_UNIT_EMBEDDING) return emb_layout(&d, NULL, dt).bytes;
  if (u->role == TS_UNIT_BLOCK) return block_layout(&d, NULL, dt, dev).bytes;
  return head_layout(&d, NULL, dt).bytes;
}

static size_t unit_workspace(const ts_model *m, const ts_unit *u, size_t B, size_t T,
                             ts_dtype dt, ts_device dev) {
  dims d = get_dims(m, B, T);
  return temps_layout(&d, u->role, NULL, dt).bytes + kernel_ws(&d, u->role, dt, dev);
}

static void *head_logits(const ts_model *m, const ts_unit *u, void *saved, size_t B, size_t T,
                         ts_dtype dt) {
  dims d = get_dims(m, B, T);
  return head_layout(&d, saved, dt).logits;
}

/* ---- forward / backward ------------------------------------------------------ */

#define W(i) ts_family_tensor(un, (i), p, dt) /* parameter i */
#define G(i) ts_family_tensor(un, (i), g, dt) /* its gradient */

/* The kernels' context after the unit's temporaries (*t). */
static ts_status start(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                       const ts_unit_args *a, dims *d, temps *t, ts_kctx *k, const char *what) {
  *d = get_dims(m, a->B, a->T);
  *t = temps_layout(d, un->role, ctx->workspace, a->dt);
  return ts_family_split_ws(ctx, t->bytes, unit_workspace(m, un, a->B, a->T, a->dt, ctx->device),
                            k, "bert", what);
}

/* out (rows, cols) = inp @ weight^T + bias: nn.Linear, the bias added to
 * each fp32 sum before its one rounding (ts_k_linear_bias_forward). */
static ts_status linear(const ts_kctx *k, void *out, const void *inp, const void *w,
                        const void *b, size_t rows, size_t cols, size_t in, ts_dtype dt) {
  return ts_k_linear_bias_forward(k, out, inp, w, b, rows, cols, in, dt);
}

/* Its backward: dbias += sum of dout's rows, dweight += dout^T inp, dinp =
 * dout weight. The bias gradient stays ts_k_bias_backward's (fp32 sums
 * added to dbias, one rounding): cuBLASLt's BGRAD epilogues write it (=)
 * in D's dtype, a second rounding of an accumulated gradient. */
static ts_status linear_back(const ts_kctx *k, void *dinp, void *dw, void *db, const void *dout,
                             const void *inp, const void *w, size_t rows, size_t cols, size_t in,
                             ts_dtype dt) {
  TS_CHECK(ts_k_bias_backward(k, db, dout, rows, cols, dt));
  return ts_k_linear_backward(k, dinp, dw, dout, inp, w, rows, cols, in, dt);
}

static ts_status emb_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                             const void *p, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "embeddings forward"));
  const ts_bert_config *c = ts_bert_config_of(m);
  emb_saved s = emb_layout(&d, a->saved, dt);
  /* HF BertEmbeddings: words + token types, then += positions, LayerNorm */
  TS_CHECK(ts_k_token_types(&k, s.types, a->tokens, d.B, d.T, c->sep_token_id, d.NT));
  TS_CHECK(ts_k_embedding_forward(&k, s.pre, a->tokens, W(E_WORD), d.N, d.C, d.V, dt));
  TS_CHECK(ts_k_embedding_forward(&k, t.a, s.types, W(E_TYPE), d.N, d.C, d.NT, dt));
  TS_CHECK(ts_k_add(&k, s.pre, s.pre, t.a, d.N * d.C, dt));
  TS_CHECK(ts_k_bias_add(&k, s.pre, W(E_POS), d.B, d.T * d.C, dt));
  return ts_k_layernorm_forward(&k, a->y, s.mean, s.rstd, s.pre, W(E_LN_W), W(E_LN_B), d.N, d.C,
                                c->layer_norm_eps, dt);
}

static ts_status emb_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                              const void *p, void *g, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "embeddings backward"));
  emb_saved s = emb_layout(&d, a->saved, dt);
  size_t es = ts_dtype_size(dt);
  TS_CHECK(ts_k_zero(&k, t.a, d.N * d.C * es));
  TS_CHECK(ts_k_layernorm_backward(&k, t.a, G(E_LN_W), G(E_LN_B), a->dy, s.pre, W(E_LN_W),
                                   s.mean, s.rstd, d.N, d.C, dt));
  TS_CHECK(ts_k_bias_backward(&k, G(E_POS), t.a, d.B, d.T * d.C, dt));
  TS_CHECK(ts_k_embedding_backward(&k, G(E_TYPE), t.a, s.types, d.N, d.C, d.NT, dt));
  /* nn.Embedding(padding_idx): the lookup leaves the [PAD] row's gradient alone */
  int32_t pad = m->pad_token_id;
  char *pad_row = pad >= 0 ? (char *)G(E_WORD) + (size_t)pad * d.C * es : NULL;
  if (pad_row) TS_CHECK(ts_k_copy(&k, t.wide, pad_row, d.C * es));
  TS_CHECK(ts_k_embedding_backward(&k, G(E_WORD), t.a, a->tokens, d.N, d.C, d.V, dt));
  return pad_row ? ts_k_copy(&k, pad_row, t.wide, d.C * es) : TS_OK;
}

static ts_status block_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "block forward"));
  const ts_bert_config *c = ts_bert_config_of(m);
  block_saved s = block_layout(&d, a->saved, dt, ctx->device);
  size_t N = d.N, C = d.C, I = d.I;
  float eps = c->layer_norm_eps;
  TS_CHECK(linear(&k, s.q, a->x, W(B_Q_W), W(B_Q_B), N, C, C, dt));
  TS_CHECK(linear(&k, s.k, a->x, W(B_K_W), W(B_K_B), N, C, C, dt));
  TS_CHECK(linear(&k, s.v, a->x, W(B_V_W), W(B_V_B), N, C, C, dt));
  TS_CHECK(ts_k_attention_bidir_forward(&k, s.att, s.att_state, s.q, s.k, s.v, a->tokens,
                                        m->pad_token_id, d.B, d.T, d.NH, d.HS, dt));
  /* BertSelfOutput: LayerNorm(dense(att) + x) */
  TS_CHECK(linear(&k, s.s1, s.att, W(B_O_W), W(B_O_B), N, C, C, dt));
  TS_CHECK(ts_k_add_layernorm_forward(&k, s.h1, s.mean1, s.rstd1, s.s1, s.s1, a->x, W(B_LN1_W),
                                      W(B_LN1_B), N, C, eps, dt)); /* s1 += x, in place */
  /* BertIntermediate, BertOutput: LayerNorm(dense(gelu(dense(h1))) + h1) */
  TS_CHECK(linear(&k, s.ipre, s.h1, W(B_I_W), W(B_I_B), N, I, C, dt));
  TS_CHECK(ts_k_gelu_forward(&k, s.g, s.ipre, N * I, c->act, dt));
  TS_CHECK(linear(&k, s.s2, s.g, W(B_OUT_W), W(B_OUT_B), N, C, I, dt));
  return ts_k_add_layernorm_forward(&k, a->y, s.mean2, s.rstd2, s.s2, s.s2, s.h1, W(B_LN2_W),
                                    W(B_LN2_B), N, C, eps, dt); /* s2 += h1, in place */
}

static ts_status block_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                                const void *p, void *g, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "block backward"));
  const ts_bert_config *c = ts_bert_config_of(m);
  block_saved s = block_layout(&d, a->saved, dt, ctx->device);
  size_t N = d.N, C = d.C, I = d.I, NC = N * C, es = ts_dtype_size(dt);
  void *d_s2 = t.a, *d_h1 = t.b, *d_att = t.c, *dq = t.d, *dk = t.e, *dv = t.f, *d_g = t.wide;
  /* y = LN2(s2), s2 = out(gelu(i(h1))) + h1 */
  TS_CHECK(ts_k_zero(&k, d_s2, NC * es));
  TS_CHECK(ts_k_layernorm_backward(&k, d_s2, G(B_LN2_W), G(B_LN2_B), a->dy, s.s2, W(B_LN2_W),
                                   s.mean2, s.rstd2, N, C, dt));
  TS_CHECK(linear_back(&k, d_g, G(B_OUT_W), G(B_OUT_B), d_s2, s.g, W(B_OUT_W), N, C, I, dt));
  TS_CHECK(ts_k_gelu_backward(&k, d_g, d_g, s.ipre, N * I, c->act, dt));
  TS_CHECK(linear_back(&k, d_h1, G(B_I_W), G(B_I_B), d_g, s.h1, W(B_I_W), N, I, C, dt));
  TS_CHECK(ts_k_add(&k, d_h1, d_h1, d_s2, NC, dt));
  /* h1 = LN1(s1), s1 = o(attn(q(x), k(x), v(x))) + x: dx starts as d_s1 */
  TS_CHECK(ts_k_zero(&k, a->dx, NC * es));
  TS_CHECK(ts_k_layernorm_backward(&k, a->dx, G(B_LN1_W), G(B_LN1_B), d_h1, s.s1, W(B_LN1_W),
                                   s.mean1, s.rstd1, N, C, dt));
  TS_CHECK(linear_back(&k, d_att, G(B_O_W), G(B_O_B), a->dx, s.att, W(B_O_W), N, C, C, dt));
  TS_CHECK(ts_k_attention_bidir_backward(&k, dq, dk, dv, d_att, s.att, s.q, s.k, s.v,
                                         s.att_state, d.B, d.T, d.NH, d.HS, dt));
  void *tmp = d_s2; /* free again */
  const struct { int w; void *dout; } qkv[3] = {{B_Q_W, dq}, {B_K_W, dk}, {B_V_W, dv}};
  for (int i = 0; i < 3; i++) {
    TS_CHECK(linear_back(&k, tmp, G(qkv[i].w), G(qkv[i].w + 1), qkv[i].dout, a->x, W(qkv[i].w),
                         N, C, C, dt));
    TS_CHECK(ts_k_add(&k, a->dx, a->dx, tmp, NC, dt));
  }
  return TS_OK;
}

/* The decoder's weight and gradient: its own, or the tied word embeddings'. */
static ts_status decoder(const ts_unit *un, const void *p, void *g, const ts_unit_args *a,
                         const void **w, void **gw) {
  ts_dtype dt = a->dt;
  if (un->tied_unit < 0) {
    *w = W(H_DEC_W);
    if (gw) *gw = G(H_DEC_W);
    return TS_OK;
  }
  if (!a->tied_weight || (gw && !a->tied_grad))
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "bert head: tie_word_embeddings needs the word embeddings and their "
                        "gradient");
  *w = a->tied_weight;
  if (gw) *gw = a->tied_grad;
  return TS_OK;
}

/* ---- the head on the masked rows only ------------------------------------------
 * In training, the head runs on the R rows whose target is not
 * TS_IGNORE_INDEX (a masked LM's ~15%), gathered in row order, as NVIDIA's
 * BERT does (--dense_seq_output): the transform, GELU, LayerNorm, decoder
 * and loss of the other rows are never computed (their loss gradient is 0,
 * so they add nothing but exact zeros to the parameters' gradients, and
 * their input gradient is 0). The rows are picked on the host from
 * a->host_targets, and what the device needs of them moves there by
 * ts_k_from_host, made on the stack a piece at a time: forward's targets
 * and indices, backward's indices and each row's place among them. Both
 * row moves are the embedding lookup, a copy of stored bits on every
 * device: the gather of the R rows' inputs, and the scatter of their input
 * gradient, which gathers dx's row n from a table of those R gradient rows
 * and a zero row after them (row R, for the rows without a target). The
 * saved buffers and the temporaries keep their N-row sizes (the plan does
 * not know R) and use their first R rows (backward: row R of s.t too).
 * The full path runs without host targets, when nothing or everything is
 * masked, in evaluation (the logits of every row are read) and under a
 * plan context (which counts no targets). */

/* What upload_rows makes from the host targets. */
typedef enum rows_kind {
  ROWS_TARGETS, /* (R) the masked rows' targets, in row order */
  ROWS_INDICES, /* (R) their row indices, in row order */
  ROWS_PLACES,  /* (N) each row's place among them: r for the r-th, R for the others */
} rows_kind;

/* Int32 values made on the host a piece at a time (16 KiB of stack). */
enum { ROWS_PIECE = 4096 };

/* dst (ctx's device) = the array `kind` of the N host targets h_targets,
 * R of them masked. Each piece has left the stack when ts_k_from_host
 * returns (kernels.h), so nothing here outlives the call. */
static ts_status upload_rows(const ts_kctx *k, int32_t *dst, const int32_t *h_targets, size_t N,
                             size_t R, rows_kind kind) {
  int32_t piece[ROWS_PIECE];
  size_t m = 0, r = 0, done = 0;
  for (size_t n = 0; n < N; n++) {
    int masked = h_targets[n] != TS_IGNORE_INDEX;
    if (kind == ROWS_PLACES)
      piece[m++] = (int32_t)(masked ? r : R);
    else if (masked)
      piece[m++] = kind == ROWS_TARGETS ? h_targets[n] : (int32_t)n;
    r += (size_t)masked;
    if (m == ROWS_PIECE || (m > 0 && n + 1 == N)) {
      TS_CHECK(ts_k_from_host(k, dst + done, piece, m * sizeof(int32_t)));
      done += m;
      m = 0;
    }
  }
  return TS_OK;
}

/* *R = the rows this call runs the head on: the masked rows in training
 * with host targets, N (every row) otherwise or when none or all are
 * masked. Forward keeps the row losses, targets and indices (4 N + 8 R
 * bytes) in temps a, backward the indices and places (4 R + 4 N) in s.g,
 * both N C elements: C elements of a row must hold 12 bytes. */
static ts_status head_rows(const ts_kctx *ctx, const ts_unit_args *a, const dims *d, size_t *R) {
  *R = d->N;
  if (!a->fused_loss_grad || !a->host_targets) return TS_OK;
  if (d->C * ts_dtype_size(a->dt) < 3 * sizeof(int32_t)) return TS_OK;
  size_t masked;
  TS_CHECK(ts_k_count_targets(ctx, &masked, a->host_targets, d->N)); /* a plan: 0 */
  if (masked > 0) *R = masked;
  return TS_OK;
}

static ts_status head_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                              const void *p, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "head forward"));
  const ts_bert_config *c = ts_bert_config_of(m);
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  TS_CHECK(decoder(un, p, NULL, a, &w, NULL));
  /* masked rows only: their inputs gathered into t.b; their targets and
   * indices after the N row losses in t.a (head_rows checked the room) */
  size_t N;
  TS_CHECK(head_rows(ctx, a, &d, &N));
  const void *x = a->x;
  const int32_t *targets = a->targets;
  float *rows = t.a;
  if (N < d.N) {
    int32_t *tgt = (int32_t *)(rows + d.N), *idx = tgt + N;
    TS_CHECK(upload_rows(&k, tgt, a->host_targets, d.N, N, ROWS_TARGETS));
    TS_CHECK(upload_rows(&k, idx, a->host_targets, d.N, N, ROWS_INDICES));
    TS_CHECK(ts_k_embedding_forward(&k, t.b, idx, a->x, N, d.C, d.N, dt)); /* a row gather */
    x = t.b, targets = tgt;
  }
  /* BertPredictionHeadTransform, then the decoder with its bias */
  TS_CHECK(linear(&k, s.t, x, W(H_T_W), W(H_T_B), N, d.C, d.C, dt));
  TS_CHECK(ts_k_gelu_forward(&k, s.g, s.t, N * d.C, c->act, dt));
  TS_CHECK(ts_k_layernorm_forward(&k, s.h, s.mean, s.rstd, s.g, W(H_LN_W), W(H_LN_B), N, d.C,
                                  c->layer_norm_eps, dt));
  TS_CHECK(linear(&k, s.logits, s.h, w, W(H_BIAS), N, d.V, d.C, dt));
  if (a->fused_loss_grad)
    TS_CHECK(ts_k_cross_entropy_fused(&k, rows, s.logits, s.logits, targets, N, d.V, a->dloss, dt));
  else
    TS_CHECK(ts_k_cross_entropy_forward(&k, rows, s.logits, targets, N, d.V, dt));
  return ts_k_loss_sum(&k, a->loss, rows, targets, N);
}

static ts_status head_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, void *g, ts_unit_args *a) {
  dims d;
  temps t;
  ts_kctx k;
  ts_dtype dt = a->dt;
  TS_CHECK(start(m, un, ctx, a, &d, &t, &k, "head backward"));
  const ts_bert_config *c = ts_bert_config_of(m);
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  void *gw = NULL;
  TS_CHECK(decoder(un, p, g, a, &w, &gw));
  size_t N, es = ts_dtype_size(dt);
  TS_CHECK(head_rows(ctx, a, &d, &N)); /* < d.N: forward's first N rows of every buffer */
  size_t NC = N * d.C;
  void *d_h = t.a, *d_g = t.b;
  if (!a->fused_loss_grad) /* else forward left the gradient in place of the logits */
    TS_CHECK(ts_k_cross_entropy_backward(&k, s.logits, s.logits, a->targets, d.N, d.V, a->dloss,
                                         dt));
  TS_CHECK(linear_back(&k, d_h, gw, G(H_BIAS), s.logits, s.h, w, N, d.V, d.C, dt));
  TS_CHECK(ts_k_zero(&k, d_g, NC * es));
  TS_CHECK(ts_k_layernorm_backward(&k, d_g, G(H_LN_W), G(H_LN_B), d_h, s.g, W(H_LN_W), s.mean,
                                   s.rstd, N, d.C, dt));
  TS_CHECK(ts_k_gelu_backward(&k, d_g, d_g, s.t, NC, c->act, dt));
  if (N == d.N)
    return linear_back(&k, a->dx, G(H_T_W), G(H_T_B), d_g, a->x, W(H_T_W), d.N, d.C, d.C, dt);
  /* the masked rows' indices and every row's place (into s.g, read by the
   * LayerNorm backward above and done with), their inputs again (into d_h,
   * done with), their input gradient and a zero row (into s.t, done with),
   * each row of dx gathered from those by its place */
  int32_t *idx = (int32_t *)s.g, *place = idx + N;
  TS_CHECK(upload_rows(&k, idx, a->host_targets, d.N, N, ROWS_INDICES));
  TS_CHECK(upload_rows(&k, place, a->host_targets, d.N, N, ROWS_PLACES));
  TS_CHECK(ts_k_embedding_forward(&k, d_h, idx, a->x, N, d.C, d.N, dt)); /* a row gather */
  TS_CHECK(linear_back(&k, s.t, G(H_T_W), G(H_T_B), d_g, d_h, W(H_T_W), N, d.C, d.C, dt));
  TS_CHECK(ts_k_zero(&k, (char *)s.t + NC * es, d.C * es));
  return ts_k_embedding_forward(&k, a->dx, place, s.t, d.N, d.C, N + 1, dt); /* a row scatter */
}

static const ts_unit_ops embedding_ops = {
    .kind = "embedding",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = emb_forward,
    .backward = emb_backward,
};

static const ts_unit_ops block_ops = {
    .kind = "block",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = block_forward,
    .backward = block_backward,
    .split_backward = 1,
};

static const ts_unit_ops head_ops = {
    .kind = "head",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = head_forward,
    .backward = head_backward,
    .logits = head_logits,
};

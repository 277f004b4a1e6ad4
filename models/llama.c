/*
 * llama.c — the LLaMA family (models/llama.h): config.json -> units, and the
 * ops tables of its three unit kinds (embedding, block, head): layout,
 * saved and workspace bytes, forward, backward, logits. Matches
 * transformers' LlamaForCausalLM (modeling_llama.py) in fp32
 * (tests/hf_parity).
 */
#include "models/llama.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family.h"

/* Indices of a block's tensors in layout order (Hugging Face order). */
enum {
  B_LN1 = 0, B_WQ, B_WK, B_WV, B_WO, B_LN2, B_WGATE, B_WUP, B_WDOWN,
};
/* Indices of the head's tensors. */
enum { H_NORM = 0, H_LM_HEAD = 1 };

/* Hugging Face's initializer_range for LLaMA: the std of every matrix. */
#define INIT_STD 0.02

static const ts_unit_ops embedding_ops, block_ops, head_ops;

const ts_llama_config *ts_llama_config_of(const ts_model *m) {
  TS_ASSERT(m->family == &ts_llama_family);
  return (const ts_llama_config *)m->impl;
}

/* Appends a tensor to unit u's layout: matrices N(0, 0.02^2) with weight
 * decay, vectors (norm weights) ones without. */
static void add_tensor(ts_unit *u, const char *name, size_t rows, size_t cols, int ndim) {
  ts_family_add_tensor(u, name, rows, cols, ndim, ndim >= 2 ? TS_INIT_NORMAL : TS_INIT_ONES,
                       INIT_STD);
}

ts_status ts_llama_model_init(ts_model *m, const ts_llama_config *cfg) {
  TS_CHECK(ts_llama_config_validate(cfg));
  if (!m->family) { /* built by hand, not through ts_model_parse */
    m->family = &ts_llama_family;
    snprintf(m->name, sizeof m->name, "%s", cfg->name);
    snprintf(m->source, sizeof m->source, "%s", cfg->source);
  }
  TS_ASSERT(m->family == &ts_llama_family && !m->impl && !m->units);
  ts_llama_config *own = malloc(sizeof *own);
  size_t L = cfg->num_hidden_layers, C = cfg->hidden_size, I = cfg->intermediate_size;
  m->n_units = (int)L + 2;
  m->units = calloc((size_t)m->n_units, sizeof *m->units);
  if (!own || !m->units) {
    free(own);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "llama: cannot allocate %d units", m->n_units);
  }
  *own = *cfg;
  m->impl = own;
  m->hidden_size = C;
  m->vocab_size = cfg->vocab_size;
  m->max_seq = cfg->max_position_embeddings;
  m->num_params = ts_llama_num_params(cfg);
  m->objective = TS_OBJECTIVE_CAUSAL_LM;
  m->pad_token_id = m->sep_token_id = -1;
  size_t HS = ts_llama_head_size(cfg);
  size_t QD = cfg->num_attention_heads * HS, KVD = cfg->num_key_value_heads * HS;
  ts_unit *e = &m->units[0];
  ts_family_start_unit(e, &embedding_ops, TS_UNIT_EMBEDDING, -1);
  add_tensor(e, "model.embed_tokens.weight", cfg->vocab_size, C, 2);
  char name[96];
  for (size_t l = 0; l < L; l++) {
    ts_unit *b = &m->units[1 + l];
    ts_family_start_unit(b, &block_ops, TS_UNIT_BLOCK, (int)l);
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
  ts_family_start_unit(h, &head_ops, TS_UNIT_HEAD, -1);
  add_tensor(h, "model.norm.weight", C, 1, 1);
  if (cfg->tie_word_embeddings) {
    h->tied_unit = 0; /* lm_head is embed_tokens */
    h->tied_tensor = 0;
  } else {
    add_tensor(h, "lm_head.weight", cfg->vocab_size, C, 2);
  }
  return TS_OK;
}

/* ts_model_family.init: the config.json object -> the model. */
static ts_status llama_init(ts_model *m, const void *root) {
  ts_llama_config cfg;
  TS_CHECK(ts_llama_config_from_json(root, m->name, m->source, &cfg));
  return ts_llama_model_init(m, &cfg);
}

/* ts_model_family.free: the config copy (ts_model_free frees the units). */
static void llama_free(ts_model *m) {
  free(m->impl);
  m->impl = NULL;
}

/* ts_model_family.ignorable: RoPE's inverse-frequency buffer, and the LM
 * head of a tied model (it is the embedding). */
static int llama_ignorable(const ts_model *m, const char *name) {
  size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
  if (n >= k && !strcmp(name + n - k, "rotary_emb.inv_freq")) return 1;
  return m->units[m->n_units - 1].tied_unit >= 0 && !strcmp(name, ts_llama_family.tied_copy);
}

#define FIELD(name, type) \
  { #name, offsetof(ts_llama_config, name), type }
static const ts_config_field FIELDS[] = {
    FIELD(hidden_size, TS_CONFIG_SIZE),
    FIELD(intermediate_size, TS_CONFIG_SIZE),
    FIELD(num_hidden_layers, TS_CONFIG_SIZE),
    FIELD(num_attention_heads, TS_CONFIG_SIZE),
    FIELD(num_key_value_heads, TS_CONFIG_SIZE),
    FIELD(vocab_size, TS_CONFIG_SIZE),
    FIELD(max_position_embeddings, TS_CONFIG_SIZE),
    FIELD(rms_norm_eps, TS_CONFIG_FLOAT),
    FIELD(rope_theta, TS_CONFIG_FLOAT),
    FIELD(tie_word_embeddings, TS_CONFIG_INT),
};
#undef FIELD

const ts_model_family ts_llama_family = {
    .model_type = "llama",
    .architecture = "LlamaForCausalLM",
    .init = llama_init,
    .free = llama_free,
    .ignorable = llama_ignorable,
    .tied_copy = "lm_head.weight",
    .fields = FIELDS,
    .n_fields = sizeof FIELDS / sizeof FIELDS[0],
};

/* ---- sizes ----------------------------------------------------------------- */

typedef struct dims {
  size_t B, T, N, C, I, V, NH, NKV, HS, QD, KVD;
} dims;

static dims get_dims(const ts_model *m, size_t B, size_t T) {
  const ts_llama_config *c = ts_llama_config_of(m);
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
  void *att_state;       /* ts_k_attention_state_bytes: (B, NH, T) lse + flags, or probs */
  void *gate, *up, *h;   /* (N, I) */
  size_t bytes;
} block_saved;

static block_saved block_layout(const dims *d, void *base, ts_dtype dt, ts_device dev) {
  block_saved s;
  size_t es = ts_dtype_size(dt);
  char *p = base;
  s.rstd1 = ts_family_carve(base, &p, d->N, 4);
  s.rstd2 = ts_family_carve(base, &p, d->N, 4);
  s.xn1 = ts_family_carve(base, &p, d->N * d->C, es);
  s.xmid = ts_family_carve(base, &p, d->N * d->C, es);
  s.xn2 = ts_family_carve(base, &p, d->N * d->C, es);
  s.q = ts_family_carve(base, &p, d->N * d->QD, es);
  s.att = ts_family_carve(base, &p, d->N * d->QD, es);
  s.k = ts_family_carve(base, &p, d->N * d->KVD, es);
  s.v = ts_family_carve(base, &p, d->N * d->KVD, es);
  s.att_state = ts_family_carve(
      base, &p, ts_k_attention_state_bytes(dev, d->B, d->T, d->NH, d->NKV, d->HS, dt), 1);
  s.gate = ts_family_carve(base, &p, d->N * d->I, es);
  s.up = ts_family_carve(base, &p, d->N * d->I, es);
  s.h = ts_family_carve(base, &p, d->N * d->I, es);
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
  s.rstd = ts_family_carve(base, &p, d->N, 4);
  s.xn = ts_family_carve(base, &p, d->N * d->C, es);
  s.logits = ts_family_carve(base, &p, d->N * d->V, es);
  s.bytes = (size_t)(p - (char *)base);
  return s;
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
  t.d_xmid = ts_family_carve(base, &p, d->N * d->C, es);
  t.d_xn = ts_family_carve(base, &p, d->N * d->C, es);
  t.d_tmp = ts_family_carve(base, &p, d->N * d->C, es);
  t.d_h = ts_family_carve(base, &p, d->N * d->I, es);
  t.d_gate = ts_family_carve(base, &p, d->N * d->I, es);
  t.d_up = ts_family_carve(base, &p, d->N * d->I, es);
  t.d_att = ts_family_carve(base, &p, d->N * d->QD, es);
  t.dq = ts_family_carve(base, &p, d->N * d->QD, es);
  t.dk = ts_family_carve(base, &p, d->N * d->KVD, es);
  t.dv = ts_family_carve(base, &p, d->N * d->KVD, es);
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
/* A block's linear layer's workspace: fp8's when the model trains in fp8. */
static size_t lin_ws(ts_device dev, size_t M, size_t N, size_t K, ts_dtype dt, ts_fp8_scaling f8) {
  return f8 ? ts_k_linear_fp8_workspace_bytes(dev, M, N, K, f8)
            : ts_k_linear_workspace_bytes(dev, M, N, K, dt);
}

static size_t kernel_ws(const dims *d, ts_unit_role kind, ts_dtype dt, ts_device dev,
                        ts_fp8_scaling f8) {
  size_t w = 0;
  if (kind == TS_UNIT_BLOCK) {
    w = max2(w, lin_ws(dev, d->N, d->QD, d->C, dt, f8));
    w = max2(w, lin_ws(dev, d->N, d->KVD, d->C, dt, f8));
    w = max2(w, lin_ws(dev, d->N, d->C, d->QD, dt, f8));
    w = max2(w, lin_ws(dev, d->N, d->I, d->C, dt, f8));
    w = max2(w, lin_ws(dev, d->N, d->C, d->I, dt, f8));
    w = max2(w, ts_k_attention_workspace_bytes(dev, d->B, d->T, d->NH, d->NKV, d->HS, dt));
    w = max2(w, ts_k_rmsnorm_workspace_bytes(dev, d->N, d->C, dt));
  } else if (kind == TS_UNIT_HEAD) {
    w = max2(ts_k_linear_workspace_bytes(dev, d->N, d->V, d->C, dt),
             ts_k_rmsnorm_workspace_bytes(dev, d->N, d->C, dt));
  } else if (kind == TS_UNIT_EMBEDDING) {
    /* forward needs none; backward gets the whole of ctx (no temps). */
    w = ts_k_embedding_workspace_bytes(dev, d->N, dt);
  }
  return w;
}

static size_t temps_bytes(const dims *d, ts_unit_role kind, ts_dtype dt) {
  if (kind == TS_UNIT_BLOCK) return ts_family_round64(block_temps_layout(d, NULL, dt).bytes);
  if (kind == TS_UNIT_HEAD) return ts_family_round64(head_temps_bytes(d, dt));
  return 0;
}

/* ts_unit_ops.saved_bytes and .workspace_bytes, one pair per kind: what
 * forward keeps besides the input (the block's normalised inputs, rotated
 * q/k, v, attention probabilities, attention output, mid-residual, MLP
 * gate/up/hidden and two fp32 rstd vectors; the head's rstd, normalised
 * input and logits (B, T, V); nothing for the embedding), and the larger
 * scratch of either pass (the unit's temporaries then the kernels'). */
static size_t unit_saved(const ts_model *m, const ts_unit *u, size_t B, size_t T, ts_dtype dt,
                         ts_device dev) {
  dims d = get_dims(m, B, T);
  if (u->role == TS_UNIT_BLOCK) return block_layout(&d, NULL, dt, dev).bytes;
  if (u->role == TS_UNIT_HEAD) return head_layout(&d, NULL, dt).bytes;
  return 0;
}

static size_t unit_workspace(const ts_model *m, const ts_unit *u, size_t B, size_t T,
                             ts_dtype dt, ts_device dev) {
  dims d = get_dims(m, B, T);
  return temps_bytes(&d, u->role, dt) + kernel_ws(&d, u->role, dt, dev, m->fp8);
}

static void *head_logits(const ts_model *m, const ts_unit *u, void *saved, size_t B, size_t T,
                         ts_dtype dt) {
  dims d = get_dims(m, B, T);
  return head_layout(&d, saved, dt).logits;
}

/* ---- forward / backward ------------------------------------------------------ */

/* Pointer to tensor i of a unit's flat buffer (ts_family_tensor). */
static void *tensor(const ts_unit *u, int i, const void *flat, ts_dtype dt) {
  return ts_family_tensor(u, i, flat, dt);
}

/* The unit's workspace split: ts_family_split_ws for this family. */
static ts_status split_ws(const ts_kctx *ctx, size_t temps, size_t need, ts_kctx *kctx,
                          const char *what) {
  return ts_family_split_ws(ctx, temps, need, kctx, "llama", what);
}

/* A block's linear layer, forward and backward (ts_k_linear_*): fp8
 * products when the model trains in fp8 (ts_model.fp8; the blocks'
 * projections only, as torchao converts them: the head, norms, attention
 * and embeddings stay in dt). */
static ts_status lin(const ts_kctx *k, ts_fp8_scaling f8, void *out, const void *inp,
                     const void *w, size_t M, size_t N, size_t K, ts_dtype dt) {
  return f8 ? ts_k_linear_fp8_forward(k, out, inp, w, M, N, K, f8, dt)
            : ts_k_linear_forward(k, out, inp, w, M, N, K, dt);
}

static ts_status lin_back(const ts_kctx *k, ts_fp8_scaling f8, void *dinp, void *dw,
                          const void *dout, const void *inp, const void *w, size_t M, size_t N,
                          size_t K, ts_dtype dt) {
  return f8 ? ts_k_linear_fp8_backward(k, dinp, dw, dout, inp, w, M, N, K, f8, dt)
            : ts_k_linear_backward(k, dinp, dw, dout, inp, w, M, N, K, dt);
}

/* The block after its attention (s->att written): the output projection,
 * the residual, the MLP and its residual into y (N, C). */
static ts_status block_after_attention(const ts_kctx *k, const ts_unit *un, const void *p,
                                       const dims *d, const block_saved *s, const void *x, void *y,
                                       float eps, ts_fp8_scaling f8, ts_dtype dt) {
  TS_CHECK(lin(k, f8, s->xmid, s->att, tensor(un, B_WO, p, dt), d->N, d->C, d->QD, dt));
  /* xmid = xmid + x in place, then its RMSNorm: one op (ts_k_add's and the norm's bits) */
  TS_CHECK(ts_k_add_rmsnorm_forward(k, s->xn2, s->rstd2, s->xmid, s->xmid, x,
                                    tensor(un, B_LN2, p, dt), d->N, d->C, eps, dt));
  TS_CHECK(lin(k, f8, s->gate, s->xn2, tensor(un, B_WGATE, p, dt), d->N, d->I, d->C, dt));
  TS_CHECK(lin(k, f8, s->up, s->xn2, tensor(un, B_WUP, p, dt), d->N, d->I, d->C, dt));
  TS_CHECK(ts_k_swiglu_forward(k, s->h, s->gate, s->up, d->N * d->I, dt));
  TS_CHECK(lin(k, f8, y, s->h, tensor(un, B_WDOWN, p, dt), d->N, d->C, d->I, dt));
  return ts_k_add(k, y, y, s->xmid, d->N * d->C, dt);
}

static ts_status block_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  ts_kctx k;
  TS_CHECK(split_ws(ctx, 0, unit_workspace(m, un, a->B, a->T, dt, ctx->device), &k,
                    "block forward"));
  block_saved s = block_layout(&d, a->saved, dt, ctx->device);
  const ts_llama_config *c = ts_llama_config_of(m);
  float eps = c->rms_norm_eps, theta = c->rope_theta;
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn1, s.rstd1, a->x, tensor(un, B_LN1, p, dt), d.N, d.C, eps,
                                dt));
  TS_CHECK(lin(&k, m->fp8, s.q, s.xn1, tensor(un, B_WQ, p, dt), d.N, d.QD, d.C, dt));
  TS_CHECK(lin(&k, m->fp8, s.k, s.xn1, tensor(un, B_WK, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(lin(&k, m->fp8, s.v, s.xn1, tensor(un, B_WV, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_rope_forward(&k, s.q, s.q, d.B, d.T, d.NH, d.HS, theta, dt));
  TS_CHECK(ts_k_rope_forward(&k, s.k, s.k, d.B, d.T, d.NKV, d.HS, theta, dt));
  TS_CHECK(ts_k_attention_forward(&k, s.att, s.att_state, s.q, s.k, s.v, d.B, d.T, d.NH, d.NKV, d.HS,
                                  dt));
  return block_after_attention(&k, un, p, &d, &s, a->x, a->y, eps, m->fp8, dt);
}

static ts_status block_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                                const void *p, void *g, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  float theta = ts_llama_config_of(m)->rope_theta;
  size_t temps = temps_bytes(&d, TS_UNIT_BLOCK, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, unit_workspace(m, un, a->B, a->T, dt, ctx->device), &k,
                    "block backward"));
  block_saved s = block_layout(&d, a->saved, dt, ctx->device);
  block_temps t = block_temps_layout(&d, ctx->workspace, dt);
  size_t NC = d.N * d.C;
  /* MLP: y = xmid + down(silu(gate) * up) */
  TS_CHECK(ts_k_cast(&k, t.d_xmid, dt, a->dy, dt, NC));
  TS_CHECK(lin_back(&k, m->fp8, t.d_h, tensor(un, B_WDOWN, g, dt), a->dy, s.h,
                                tensor(un, B_WDOWN, p, dt), d.N, d.C, d.I, dt));
  TS_CHECK(ts_k_swiglu_backward(&k, t.d_gate, t.d_up, t.d_h, s.gate, s.up, d.N * d.I, dt));
  TS_CHECK(lin_back(&k, m->fp8, t.d_xn, tensor(un, B_WGATE, g, dt), t.d_gate, s.xn2,
                                tensor(un, B_WGATE, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(lin_back(&k, m->fp8, t.d_tmp, tensor(un, B_WUP, g, dt), t.d_up, s.xn2,
                                tensor(un, B_WUP, p, dt), d.N, d.I, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(ts_k_rmsnorm_backward(&k, t.d_xmid, tensor(un, B_LN2, g, dt), t.d_xn, s.xmid,
                                 tensor(un, B_LN2, p, dt), s.rstd2, d.N, d.C, dt));
  /* attention: xmid = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))) */
  TS_CHECK(lin_back(&k, m->fp8, t.d_att, tensor(un, B_WO, g, dt), t.d_xmid, s.att,
                                tensor(un, B_WO, p, dt), d.N, d.C, d.QD, dt));
  TS_CHECK(ts_k_attention_backward(&k, t.dq, t.dk, t.dv, t.d_att, s.att, s.q, s.k, s.v,
                                   s.att_state, d.B, d.T, d.NH, d.NKV, d.HS, dt));
  TS_CHECK(ts_k_rope_backward(&k, t.dq, t.dq, d.B, d.T, d.NH, d.HS, theta, dt));
  TS_CHECK(ts_k_rope_backward(&k, t.dk, t.dk, d.B, d.T, d.NKV, d.HS, theta, dt));
  TS_CHECK(lin_back(&k, m->fp8, t.d_xn, tensor(un, B_WQ, g, dt), t.dq, s.xn1,
                                tensor(un, B_WQ, p, dt), d.N, d.QD, d.C, dt));
  TS_CHECK(lin_back(&k, m->fp8, t.d_tmp, tensor(un, B_WK, g, dt), t.dk, s.xn1,
                                tensor(un, B_WK, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(lin_back(&k, m->fp8, t.d_tmp, tensor(un, B_WV, g, dt), t.dv, s.xn1,
                                tensor(un, B_WV, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_add(&k, t.d_xn, t.d_xn, t.d_tmp, NC, dt));
  TS_CHECK(ts_k_cast(&k, a->dx, dt, t.d_xmid, dt, NC));
  return ts_k_rmsnorm_backward(&k, a->dx, tensor(un, B_LN1, g, dt), t.d_xn, a->x,
                               tensor(un, B_LN1, p, dt), s.rstd1, d.N, d.C, dt);
}

/* The LM head's weight and gradient: its own, or the tied embedding's. */
static ts_status head_weight(const ts_model *m, const ts_unit *un, const void *p, void *g,
                             const ts_unit_args *a, const void **w, void **gw) {
  if (un->tied_unit >= 0) {
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

static ts_status head_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                              const void *p, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  size_t temps = temps_bytes(&d, TS_UNIT_HEAD, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, unit_workspace(m, un, a->B, a->T, dt, ctx->device), &k,
                    "head forward"));
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  TS_CHECK(head_weight(m, un, p, NULL, a, &w, NULL));
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn, s.rstd, a->x, tensor(un, H_NORM, p, dt), d.N, d.C,
                                ts_llama_config_of(m)->rms_norm_eps, dt));
  TS_CHECK(ts_k_linear_forward(&k, s.logits, s.xn, w, d.N, d.V, d.C, dt));
  float *rows = ctx->workspace;
  if (a->fused_loss_grad)
    TS_CHECK(ts_k_cross_entropy_fused(&k, rows, s.logits, s.logits, a->targets, d.N, d.V,
                                      a->dloss, dt));
  else
    TS_CHECK(ts_k_cross_entropy_forward(&k, rows, s.logits, a->targets, d.N, d.V, dt));
  return ts_k_loss_sum(&k, a->loss, rows, a->targets, d.N);
}

static ts_status head_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                               const void *p, void *g, ts_unit_args *a) {
  dims d = get_dims(m, a->B, a->T);
  ts_dtype dt = a->dt;
  size_t temps = temps_bytes(&d, TS_UNIT_HEAD, dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, temps, unit_workspace(m, un, a->B, a->T, dt, ctx->device), &k,
                    "head backward"));
  head_saved s = head_layout(&d, a->saved, dt);
  const void *w = NULL;
  void *gw = NULL;
  TS_CHECK(head_weight(m, un, p, g, a, &w, &gw));
  void *d_xn = ctx->workspace;
  if (!a->fused_loss_grad) /* else forward left the gradient in place of the logits */
    TS_CHECK(ts_k_cross_entropy_backward(&k, s.logits, s.logits, a->targets, d.N, d.V, a->dloss,
                                         dt));
  TS_CHECK(ts_k_linear_backward(&k, d_xn, gw, s.logits, s.xn, w, d.N, d.V, d.C, dt));
  TS_CHECK(ts_k_zero(&k, a->dx, d.N * d.C * ts_dtype_size(dt)));
  return ts_k_rmsnorm_backward(&k, a->dx, tensor(un, H_NORM, g, dt), d_xn, a->x,
                               tensor(un, H_NORM, p, dt), s.rstd, d.N, d.C, dt);
}

static ts_status embedding_forward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                                   const void *p, ts_unit_args *a) {
  return ts_k_embedding_forward(ctx, a->y, a->tokens, p, a->B * a->T, m->hidden_size,
                                m->vocab_size, a->dt);
}

static ts_status embedding_backward(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                                    const void *p, void *g, ts_unit_args *a) {
  return ts_k_embedding_backward(ctx, g, a->dy, a->tokens, a->B * a->T, m->hidden_size,
                                 m->vocab_size, a->dt);
}

/* ---- decoding with a key/value cache (one sequence) -------------------------- */

/* ts_unit_ops.cache_bytes: a block's keys then values after RoPE, (T, KVD)
 * each; nothing for the embedding and the head. */
static size_t unit_cache(const ts_model *m, const ts_unit *u, size_t T, ts_dtype dt) {
  if (u->role != TS_UNIT_BLOCK) return 0;
  dims d = get_dims(m, 1, T);
  return 2 * T * d.KVD * ts_dtype_size(dt);
}

static ts_status embedding_decode(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                                  const void *p, ts_decode_args *a) {
  return ts_k_embedding_forward(ctx, a->y, a->tokens, p, a->T, m->hidden_size, m->vocab_size,
                                a->dt);
}

/* block_forward over the new rows: their keys and values go straight into
 * the cache at rows pos0.., RoPE at their positions, and attention reads
 * every cached row before them. */
static ts_status block_decode(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                              const void *p, ts_decode_args *a) {
  dims d = get_dims(m, 1, a->T);
  ts_dtype dt = a->dt;
  size_t es = ts_dtype_size(dt);
  ts_kctx k;
  TS_CHECK(split_ws(ctx, 0, unit_workspace(m, un, 1, a->T, dt, ctx->device), &k,
                    "block decode"));
  block_saved s = block_layout(&d, a->scratch, dt, ctx->device);
  const ts_llama_config *c = ts_llama_config_of(m);
  float eps = c->rms_norm_eps, theta = c->rope_theta;
  char *kc = a->cache, *vc = kc + a->max_T * d.KVD * es;
  void *kn = kc + a->pos0 * d.KVD * es, *vn = vc + a->pos0 * d.KVD * es;
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn1, s.rstd1, a->x, tensor(un, B_LN1, p, dt), d.N, d.C, eps,
                                dt));
  TS_CHECK(ts_k_linear_forward(&k, s.q, s.xn1, tensor(un, B_WQ, p, dt), d.N, d.QD, d.C, dt));
  TS_CHECK(ts_k_linear_forward(&k, kn, s.xn1, tensor(un, B_WK, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_linear_forward(&k, vn, s.xn1, tensor(un, B_WV, p, dt), d.N, d.KVD, d.C, dt));
  TS_CHECK(ts_k_rope_forward_at(&k, s.q, s.q, d.T, a->pos0, d.NH, d.HS, theta, dt));
  TS_CHECK(ts_k_rope_forward_at(&k, kn, kn, d.T, a->pos0, d.NKV, d.HS, theta, dt));
  TS_CHECK(ts_k_attention_cached(&k, s.att, s.q, kc, vc, d.T, a->pos0, d.NH, d.NKV, d.HS, dt));
  return block_after_attention(&k, un, p, &d, &s, a->x, a->y, eps, TS_FP8_OFF, dt);
}

/* head_forward of the newest row only: its norm and logits, no loss. */
static ts_status head_decode(const ts_model *m, const ts_unit *un, const ts_kctx *ctx,
                             const void *p, ts_decode_args *a) {
  dims d = get_dims(m, 1, 1);
  ts_dtype dt = a->dt;
  ts_kctx k;
  TS_CHECK(split_ws(ctx, 0, unit_workspace(m, un, 1, 1, dt, ctx->device), &k, "head decode"));
  head_saved s = head_layout(&d, a->scratch, dt);
  const void *w = NULL;
  ts_unit_args fa = {.dt = dt, .tied_weight = a->tied_weight};
  TS_CHECK(head_weight(m, un, p, NULL, &fa, &w, NULL));
  const char *last = (const char *)a->x + (a->T - 1) * d.C * ts_dtype_size(dt);
  TS_CHECK(ts_k_rmsnorm_forward(&k, s.xn, s.rstd, last, tensor(un, H_NORM, p, dt), 1, d.C,
                                ts_llama_config_of(m)->rms_norm_eps, dt));
  return ts_k_linear_forward(&k, a->logits, s.xn, w, 1, d.V, d.C, dt);
}

static const ts_unit_ops embedding_ops = {
    .kind = "embedding",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = embedding_forward,
    .backward = embedding_backward,
    .cache_bytes = unit_cache,
    .decode = embedding_decode,
    .split_backward = 1,
};

static const ts_unit_ops block_ops = {
    .kind = "block",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = block_forward,
    .backward = block_backward,
    .cache_bytes = unit_cache,
    .decode = block_decode,
    .split_backward = 1,
};

static const ts_unit_ops head_ops = {
    .kind = "head",
    .saved_bytes = unit_saved,
    .workspace_bytes = unit_workspace,
    .forward = head_forward,
    .backward = head_backward,
    .logits = head_logits,
    .cache_bytes = unit_cache,
    .decode = head_decode,
    .split_backward = 1,
};

/*
 * model.c — the model interface (model.h): the registry of families,
 * config.json loading, the seeded initialisation every family shares, and
 * the unit calls that dispatch through each unit's ops table.
 *
 * Adding a family means a file with a ts_model_family and its units' ops
 * tables, plus one line in FAMILIES below; nothing outside models/ changes.
 */
#include "models/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/atomic_file.h"
#include "base/rng.h"
#include "models/config_json.h"
#include "models/bert.h"
#include "models/llama.h"

/* Every family tessera computes; the first is the default for a
 * config.json without "model_type". */
static const ts_model_family *const FAMILIES[] = {&ts_llama_family, &ts_bert_family};
enum { N_FAMILIES = sizeof FAMILIES / sizeof FAMILIES[0] };

/* ---- loading ------------------------------------------------------------------ */

ts_status ts_model_resolve(const char *model, char *out, size_t cap) {
  struct stat sb;
  if (stat(model, &sb) == 0 && S_ISREG(sb.st_mode)) {
    snprintf(out, cap, "%s", model);
    return TS_OK;
  }
  if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* a Hugging Face folder, a checkpoint */
    snprintf(out, cap, "%s/config.json", model);
    if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return TS_OK;
    return ts_set_error(TS_ERR_IO, "%s: no config.json in the folder: expected a Hugging Face "
                        "model folder or a tessera checkpoint", model);
  }
  if (strchr(model, '/') || strstr(model, ".json"))
    return ts_set_error(TS_ERR_IO, "%s: model config not found: expected a config.json file",
                        model);
  const char *home = getenv("TESSERA_HOME");
  snprintf(out, cap, "%s%smodels/configs/%s.json", home ? home : "", home ? "/" : "", model);
  if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return TS_OK;
  return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                      "`model` %s: unknown preset: expected a config.json path or a preset in "
                      "%s%smodels/configs/ (llama-tiny, llama-small, llama-124m, llama-1.1b, "
                      "llama-2-7b, llama-2-13b, llama-2-70b, bert-tiny, bert-base, bert-large)%s",
                      model, home ? home : "", home ? "/" : "",
                      home ? "" : "; TESSERA_HOME is unset, so that is relative to this directory");
}

/* The family of root's "model_type"; absent, the family whose
 * architecture "architectures" names first (transformers' AutoConfig
 * needs model_type; tessera's own configs may omit it), else the first. */
static ts_status find_family(const cJSON *root, const char *source,
                             const ts_model_family **out) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (!mt) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    *out = FAMILIES[0];
    for (int f = 0; f < N_FAMILIES && cJSON_IsString(a0); f++)
      if (!strcmp(a0->valuestring, FAMILIES[f]->architecture)) *out = FAMILIES[f];
    return TS_OK;
  }
  for (int f = 0; f < N_FAMILIES && cJSON_IsString(mt); f++)
    if (strcmp(mt->valuestring, FAMILIES[f]->model_type) == 0) {
      *out = FAMILIES[f];
      return TS_OK;
    }
  char known[256] = "";
  for (int f = 0; f < N_FAMILIES; f++)
    snprintf(known + strlen(known), sizeof known - strlen(known), "%s\"%s\"", f ? ", " : "",
             FAMILIES[f]->model_type);
  char *found = cJSON_PrintUnformatted(mt);
  ts_set_error(TS_ERR_FORMAT, "%s: field \"model_type\" = %.40s: expected one of %s", source,
               found ? found : "?", known);
  cJSON_free(found);
  return TS_ERR_FORMAT;
}

ts_status ts_model_parse(const char *json, const char *source, ts_model *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_Parse(json);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return ts_set_error(TS_ERR_FORMAT, "%s: not a JSON object: expected a Hugging Face config.json",
                        source);
  }
  const ts_model_family *fam = NULL;
  ts_status st = find_family(root, source, &fam);
  if (st == TS_OK) {
    ts_cfg_stem(source, out->name, sizeof out->name);
    snprintf(out->source, sizeof out->source, "%s", source);
    out->family = fam;
    st = fam->init(out, root);
    if (st != TS_OK) ts_model_free(out);
  }
  cJSON_Delete(root);
  return st;
}

ts_status ts_model_load(const char *path, ts_model *out) {
  memset(out, 0, sizeof *out);
  char *buf;
  TS_CHECK(ts_read_file(path, &buf, NULL));
  ts_status st = ts_model_parse(buf, path, out);
  free(buf);
  return st;
}

ts_status ts_model_set_fp8(ts_model *m, ts_fp8_scaling scaling, ts_dtype dt) {
  if (scaling == TS_FP8_OFF) {
    m->fp8 = TS_FP8_OFF;
    return TS_OK;
  }
  const char *name = ts_fp8_scaling_name(scaling);
  if (!name) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`fp8` %d: not a scaling", (int)scaling);
  if (strcmp(m->family->model_type, "llama") != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`fp8` %s: %s is a %s model: fp8 linear layers exist for llama models only",
                        name, ts_model_origin(m), m->family->model_type);
  if (dt != TS_BF16)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`fp8` %s: `dtype` %s: expected bf16", name,
                        ts_dtype_name(dt));
  /* every block product's M (B x T rows) is checked by the kernel; its
   * widths are the model's, known now */
  size_t C = m->hidden_size;
  if (C % 16)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`fp8` %s: %s: hidden_size %zu: expected a multiple of 16 (fp8 products)",
                        name, ts_model_origin(m), C);
  m->fp8 = scaling;
  return TS_OK;
}

void ts_model_free(ts_model *m) {
  if (m->family && m->family->free) m->family->free(m);
  free(m->units);
  memset(m, 0, sizeof *m);
}

const char *ts_model_origin(const ts_model *m) { return m->source[0] ? m->source : m->name; }

double ts_unit_forward_flops(const ts_model *m, int u, size_t T) {
  const ts_unit *un = &m->units[u];
  if (un->role == TS_UNIT_EMBEDDING) return 0.0; /* a gather: no products */
  double f = 0.0;
  for (int i = 0; i < un->n_tensors; i++)
    if (un->tensors[i].ndim == 2) f += 2.0 * (double)un->tensors[i].numel;
  if (un->tied_unit >= 0)
    f += 2.0 * (double)m->units[un->tied_unit].tensors[un->tied_tensor].numel;
  if (un->role == TS_UNIT_BLOCK) f += 4.0 * (double)T * (double)m->hidden_size;
  return f;
}

double ts_model_flops_per_token(const ts_model *m, size_t T) {
  double f = 0.0; /* integers below 2^53: exact in any order */
  for (int u = 0; u < m->n_units; u++) f += ts_unit_forward_flops(m, u, T);
  return 3.0 * f;
}

/* Field f of config cfg printed into out (32 bytes); its value as a double
 * into *x (exact for the sizes and ids a config holds). */
static void config_value(const void *cfg, const ts_config_field *f, char out[32], double *x) {
  const char *p = (const char *)cfg + f->offset;
  switch (f->type) {
    case TS_CONFIG_SIZE: *x = (double)*(const size_t *)p; break;
    case TS_CONFIG_INT: *x = *(const int *)p; break;
    case TS_CONFIG_INT32: *x = *(const int32_t *)p; break;
    case TS_CONFIG_FLOAT: *x = *(const float *)p; break;
    case TS_CONFIG_DOUBLE: *x = *(const double *)p; break;
  }
  snprintf(out, 32, "%.9g", *x);
}

int ts_model_config_diff(const ts_model *a, const ts_model *b, const char **field, char va[32],
                         char vb[32]) {
  if (a->family != b->family) {
    *field = "model_type";
    snprintf(va, 32, "\"%s\"", a->family->model_type);
    snprintf(vb, 32, "\"%s\"", b->family->model_type);
    return 1;
  }
  for (int i = 0; i < a->family->n_fields; i++) {
    const ts_config_field *f = &a->family->fields[i];
    double x, y;
    config_value(a->impl, f, va, &x);
    config_value(b->impl, f, vb, &y);
    if (memcmp(&x, &y, sizeof x) != 0) {
      *field = f->name;
      return 1;
    }
  }
  return 0;
}

int ts_model_ignorable(const ts_model *m, const char *name) {
  return m->family->ignorable && m->family->ignorable(m, name);
}

ts_status ts_model_find_tensor(const ts_model *m, const char *name, int *u, int *i) {
  for (int a = 0; a < m->n_units; a++)
    for (int b = 0; b < m->units[a].n_tensors; b++)
      if (strcmp(m->units[a].tensors[b].name, name) == 0) {
        *u = a;
        *i = b;
        return TS_OK;
      }
  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "tensor %s: not a parameter of model %s", name,
                      m->name);
}

/* ---- initialisation --------------------------------------------------------------- */

ts_status ts_model_init_unit(const ts_model *m, int u, const ts_kctx *ctx, float *params,
                             uint64_t seed) {
  TS_ASSERT(u >= 0 && u < m->n_units);
  const ts_unit *unit = &m->units[u];
  for (int i = 0; i < unit->n_tensors; i++) {
    const ts_tensor_spec *t = &unit->tensors[i];
    float *dst = params + t->offset;
    if (t->init == TS_INIT_ONES || t->init == TS_INIT_ZEROS) {
      TS_CHECK(ts_k_init_fill(ctx, dst, t->numel, t->init == TS_INIT_ONES ? 1.0f : 0.0f));
    } else {
      uint64_t s = seed ^ ts_fnv1a64(t->name); /* the tensor's own stream */
      ts_splitmix64(&s);
      TS_CHECK(ts_k_init_normal(ctx, dst, t->numel, t->init_std, &s));
    }
  }
  return TS_OK;
}

/* ---- unit calls --------------------------------------------------------------------- */

/* Unit u of m, asserted in range. */
static const ts_unit *unit_at(const ts_model *m, int u) {
  TS_ASSERT(u >= 0 && u < m->n_units);
  return &m->units[u];
}

size_t ts_unit_saved_bytes(const ts_model *m, int u, size_t B, size_t T, ts_dtype dt,
                           ts_device dev) {
  const ts_unit *un = unit_at(m, u);
  return un->ops->saved_bytes(m, un, B, T, dt, dev);
}

size_t ts_unit_workspace_bytes(const ts_model *m, int u, size_t B, size_t T, ts_dtype dt,
                               ts_device dev) {
  const ts_unit *un = unit_at(m, u);
  return un->ops->workspace_bytes(m, un, B, T, dt, dev);
}

/* The checks every unit call shares: the unit exists, the batch is not
 * empty and fits the model's positions. */
static ts_status check_call(const ts_model *m, int u, const ts_unit_args *a) {
  if (u < 0 || u >= m->n_units)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "model: unit %d: expected 0..%d", u,
                        m->n_units - 1);
  if (a->T == 0 || a->B == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "model: micro-batch %zu x seq %zu: expected > 0",
                        a->B, a->T);
  if (a->T > m->max_seq)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "sequence length %zu: expected at most max_position_embeddings = %zu "
                        "of %s",
                        a->T, m->max_seq, ts_model_origin(m));
  return TS_OK;
}

ts_status ts_unit_forward(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                          ts_unit_args *a) {
  TS_CHECK(check_call(m, u, a));
  return m->units[u].ops->forward(m, &m->units[u], ctx, params, a);
}

ts_status ts_unit_backward(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                           void *grads, ts_unit_args *a) {
  TS_CHECK(check_call(m, u, a));
  if (ctx && ctx->wgrad && !m->units[u].ops->split_backward)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "unit %d (%s) of %s: its backward cannot defer its weight gradients "
                        "(ctx->wgrad)",
                        u, m->units[u].ops->kind, ts_model_origin(m));
  if (!ctx || !ctx->wgrad) return m->units[u].ops->backward(m, &m->units[u], ctx, params, grads, a);
  /* B: what the backward may still write (its dx, and dy) is copied when
   * a weight-gradient op reads it */
  size_t bytes = a->B * a->T * m->hidden_size * ts_dtype_size(a->dt);
  ts_k_wgrad_volatile(ctx->wgrad, 0, a->dx, bytes);
  ts_k_wgrad_volatile(ctx->wgrad, 1, a->dy, bytes);
  ts_status st = m->units[u].ops->backward(m, &m->units[u], ctx, params, grads, a);
  ts_k_wgrad_volatile(ctx->wgrad, 0, NULL, 0);
  ts_k_wgrad_volatile(ctx->wgrad, 1, NULL, 0);
  return st;
}

int ts_unit_splits_backward(const ts_model *m, int u) {
  return unit_at(m, u)->ops->split_backward;
}

void *ts_unit_logits(const ts_model *m, int u, void *saved, size_t B, size_t T, ts_dtype dt) {
  const ts_unit *un = unit_at(m, u);
  return un->ops->logits ? un->ops->logits(m, un, saved, B, T, dt) : NULL;
}

int ts_model_can_decode(const ts_model *m) {
  for (int u = 0; u < m->n_units; u++)
    if (!m->units[u].ops->decode || !m->units[u].ops->cache_bytes) return 0;
  return m->n_units > 0;
}

size_t ts_unit_cache_bytes(const ts_model *m, int u, size_t T, ts_dtype dt) {
  const ts_unit *un = unit_at(m, u);
  TS_ASSERT(un->ops->cache_bytes);
  return un->ops->cache_bytes(m, un, T, dt);
}

ts_status ts_unit_decode(const ts_model *m, int u, const ts_kctx *ctx, const void *params,
                         ts_decode_args *a) {
  if (u < 0 || u >= m->n_units)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "model: unit %d: expected 0..%d", u,
                        m->n_units - 1);
  const ts_unit *un = &m->units[u];
  if (!un->ops->decode)
    return ts_set_error(TS_ERR_UNSUPPORTED, "%s: a %s model cannot generate text (not a causal LM)",
                        ts_model_origin(m), m->family ? m->family->model_type : "hand-built");
  if (a->T == 0 || a->pos0 + a->T > a->max_T || a->max_T > m->max_seq)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "decode: positions %zu..%zu: expected at least one, within the cache's "
                        "%zu and max_position_embeddings = %zu of %s",
                        a->pos0, a->pos0 + a->T, a->max_T, m->max_seq, ts_model_origin(m));
  return un->ops->decode(m, un, ctx, params, a);
}

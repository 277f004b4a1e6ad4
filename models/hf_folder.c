/* hf_folder.c — Hugging Face model folders in and out (hf_folder.h). */
#include "models/hf_folder.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/floats.h"
#include "models/safetensors.h"

#define SINGLE "model.safetensors"
#define INDEX "model.safetensors.index.json"

struct ts_hf_folder {
  char dir[4096];
  ts_safetensors **shards; /* [n] */
  int n;
};

int ts_hf_is_folder(const char *dir) {
  struct stat sb;
  char path[4200];
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
  snprintf(path, sizeof path, "%s/config.json", dir);
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

void ts_hf_folder_close(ts_hf_folder *f) {
  if (!f) return;
  for (int k = 0; k < f->n; k++) ts_safetensors_close(f->shards[k]);
  free(f->shards);
  free(f);
}

/* Opens shard `name` of f unless already open. */
static ts_status add_shard(ts_hf_folder *f, const char *name) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", f->dir, name);
  for (int k = 0; k < f->n; k++)
    if (!strcmp(ts_safetensors_path(f->shards[k]), path)) return TS_OK;
  ts_safetensors **s = realloc(f->shards, (size_t)(f->n + 1) * sizeof *s);
  if (!s) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: shards", f->dir);
  f->shards = s;
  TS_CHECK(ts_safetensors_open(&f->shards[f->n], path));
  f->n++;
  return TS_OK;
}

ts_status ts_hf_folder_open(ts_hf_folder **out, const char *dir) {
  *out = NULL;
  ts_hf_folder *f = calloc(1, sizeof *f);
  if (!f) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s", dir);
  snprintf(f->dir, sizeof f->dir, "%s", dir);
  char path[4200], *text = NULL;
  struct stat sb;
  ts_status st = TS_OK;
  snprintf(path, sizeof path, "%s/" INDEX, dir);
  if (stat(path, &sb) == 0) {
    st = ts_read_file(path, &text, NULL);
    cJSON *root = st == TS_OK ? cJSON_Parse(text) : NULL;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (st == TS_OK && !cJSON_IsObject(map))
      st = ts_set_error(TS_ERR_FORMAT, "%s: field \"weight_map\": expected an object of "
                        "tensor name -> shard file", path);
    const cJSON *e;
    if (st == TS_OK)
      cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
          st = ts_set_error(TS_ERR_FORMAT, "%s: weight_map[\"%s\"]: expected a file name", path,
                            e->string);
          break;
        }
        if ((st = add_shard(f, e->valuestring)) != TS_OK) break;
      }
    cJSON_Delete(root);
    free(text);
  } else {
    snprintf(path, sizeof path, "%s/" SINGLE, dir);
    if (stat(path, &sb) != 0)
      st = ts_set_error(TS_ERR_IO, "%s: no " SINGLE " or " INDEX " (a Hugging Face model folder "
                        "holds one)", dir);
    else
      st = add_shard(f, SINGLE);
  }
  if (st != TS_OK) {
    ts_hf_folder_close(f);
    return st;
  }
  *out = f;
  return TS_OK;
}

/* The shard holding `name` and its descriptor, or NULL. */
static ts_safetensors *lookup(const ts_hf_folder *f, const char *name, ts_safetensors_tensor *t) {
  for (int k = 0; k < f->n; k++)
    if (ts_safetensors_find(f->shards[k], name, t) == TS_OK) return f->shards[k];
  return NULL;
}

/* Element k of a floating-point tensor (F32, BF16, F16) as fp32. */
static float element(const ts_safetensors_tensor *t, size_t k) {
  const uint8_t *p = t->data;
  if (!strcmp(t->dtype, "F32")) {
    float v;
    memcpy(&v, p + 4 * k, 4);
    return v;
  }
  uint16_t h = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
  return !strcmp(t->dtype, "BF16") ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

/* A tied model's folder may hold the head's weight as well (the family's
 * tied_copy, or BERT's decoder bias, tied_copy2): transformers ties it to
 * the tensor it copies only if they are equal, else loads the folder
 * untied and warns. Tessera computes the tied model, so a copy of another
 * shape or other values is refused (TS_ERR_FORMAT, naming both). */
static ts_status check_copy(const ts_hf_folder *f, const ts_model *m, const char *copy,
                            const ts_tensor_spec *s) {
  ts_safetensors_tensor c, t;
  ts_safetensors *sh;
  if (!copy || !(sh = lookup(f, copy, &c))) return TS_OK;
  if (!lookup(f, s->name, &t)) return TS_OK; /* reported by the caller */
  size_t d0 = c.ndim > 0 ? c.shape[0] : 1, d1 = c.ndim > 1 ? c.shape[1] : 1;
  if (c.ndim != s->ndim || d0 != s->shape[0] || d1 != s->shape[1])
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: tensor %s has shape [%zu, %zu] (%d dims), but the model %s ties it "
                        "to %s of shape [%zu, %zu] (tie_word_embeddings): expected that shape",
                        ts_safetensors_path(sh), copy, d0, d1, c.ndim, m->name, s->name,
                        s->shape[0], s->shape[1]);
  int same = c.numel == t.numel;
  for (size_t k = 0; k < c.numel && same; k++) {
    float a = element(&c, k), b = element(&t, k);
    same = memcmp(&a, &b, sizeof a) == 0;
  }
  if (same) return TS_OK;
  return ts_set_error(TS_ERR_FORMAT,
                      "%s: tensor %s differs from %s, but the model %s ties them "
                      "(tie_word_embeddings): expected tie_word_embeddings false in config.json, "
                      "or the same values (transformers would load this folder untied)",
                      ts_safetensors_path(sh), copy, s->name, m->name);
}

/* The family's copies of a tied head: the borrowed tensor's
 * (tied_copy), and one of the head's own (tied_copy2 of tied_copy2_of). */
static ts_status check_tied_copy(const ts_hf_folder *f, const ts_model *m) {
  const ts_unit *head = &m->units[m->n_units - 1];
  if (head->tied_unit < 0) return TS_OK;
  const ts_tensor_spec *s = &m->units[head->tied_unit].tensors[head->tied_tensor];
  TS_CHECK(check_copy(f, m, m->family->tied_copy, s));
  int u, i;
  if (!m->family->tied_copy2 || ts_model_find_tensor(m, m->family->tied_copy2_of, &u, &i) != TS_OK)
    return TS_OK;
  return check_copy(f, m, m->family->tied_copy2, &m->units[u].tensors[i]);
}

ts_status ts_hf_folder_check(const ts_hf_folder *f, const ts_model *m) {
  size_t count = 0;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++, count++) {
      const ts_tensor_spec *s = &m->units[u].tensors[i];
      ts_safetensors_tensor t;
      ts_safetensors *sh = lookup(f, s->name, &t);
      if (!sh)
        return ts_set_error(TS_ERR_FORMAT, "%s: no tensor %s, which the model %s has", f->dir,
                            s->name, m->name);
      size_t d0 = t.ndim > 0 ? t.shape[0] : 1, d1 = t.ndim > 1 ? t.shape[1] : 1;
      if (t.ndim != s->ndim || d0 != s->shape[0] || d1 != s->shape[1])
        return ts_set_error(TS_ERR_FORMAT,
                            "%s: tensor %s has shape [%zu, %zu] (%d dims), the model %s [%zu, %zu]",
                            ts_safetensors_path(sh), s->name, d0, d1, t.ndim, m->name,
                            s->shape[0], s->shape[1]);
      if (strcmp(t.dtype, "F32") && strcmp(t.dtype, "BF16") && strcmp(t.dtype, "F16"))
        return ts_set_error(TS_ERR_FORMAT, "%s: tensor %s has dtype %s: expected F32, BF16 or F16",
                            ts_safetensors_path(sh), s->name, t.dtype);
    }
  for (int k = 0; k < f->n; k++)
    for (size_t j = 0; j < ts_safetensors_count(f->shards[k]); j++) {
      const char *name = ts_safetensors_name(f->shards[k], j);
      int u, i;
      if (ts_model_find_tensor(m, name, &u, &i) != TS_OK && !ts_model_ignorable(m, name))
        return ts_set_error(TS_ERR_FORMAT, "%s: tensor %s is not in the model %s: the folder is "
                            "of another model", ts_safetensors_path(f->shards[k]), name, m->name);
    }
  (void)count;
  return check_tied_copy(f, m);
}

ts_status ts_hf_folder_read(const ts_hf_folder *f, const char *name, float *dst, size_t numel) {
  ts_safetensors_tensor t;
  if (!lookup(f, name, &t)) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: no tensor %s", f->dir, name);
  if (t.numel != numel)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor %s has %zu elements, expected %zu",
                        f->dir, name, t.numel, numel);
  if (!strcmp(t.dtype, "F32")) {
    memcpy(dst, t.data, numel * 4);
    return TS_OK;
  }
  const uint8_t *p = t.data; /* 2-byte elements, little-endian, maybe unaligned */
  int bf = !strcmp(t.dtype, "BF16");
  if (!bf && strcmp(t.dtype, "F16"))
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor %s has dtype %s: expected F32, BF16 or F16",
                        f->dir, name, t.dtype);
  for (size_t k = 0; k < numel; k++) {
    uint16_t h = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
    dst[k] = bf ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
  }
  return TS_OK;
}

/* ---- export ---------------------------------------------------------------------- */

static const char *st_name(ts_dtype dt) { return dt == TS_FP32 ? "F32" : dt == TS_BF16 ? "BF16" : "F16"; }
static const char *torch_name(ts_dtype dt) {
  return dt == TS_FP32 ? "float32" : dt == TS_BF16 ? "bfloat16" : "float16";
}

/* The model's tensors in layout order, flattened. */
typedef struct flat_tensor {
  const ts_tensor_spec *spec;
  int shard; /* 0-based shard it goes to */
} flat_tensor;

/* Writes tensors [a, b) of list to path, converted to dt. */
static ts_status write_shard(const char *path, const flat_tensor *list, int a, int b, ts_dtype dt,
                             ts_hf_tensor_fn get, void *user) {
  size_t es = ts_dtype_size(dt);
  ts_safetensors_tensor *ts = calloc((size_t)(b - a), sizeof *ts);
  void **bufs = calloc((size_t)(b - a), sizeof *bufs);
  ts_status st = ts && bufs ? TS_OK : ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s", path);
  for (int k = a; k < b && st == TS_OK; k++) {
    const ts_tensor_spec *s = list[k].spec;
    float *v = malloc(s->numel * 4);
    if (!v) {
      st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: tensor %s", path, s->name);
      break;
    }
    bufs[k - a] = v;
    st = get(user, s->name, v, s->numel);
    if (st == TS_OK && dt != TS_FP32) { /* narrow in place, front to back */
      uint16_t *h = (uint16_t *)v;
      for (size_t q = 0; q < s->numel; q++) h[q] = dt == TS_BF16 ? ts_f32_to_bf16(v[q]) : ts_f32_to_f16(v[q]);
    }
    ts_safetensors_tensor *t = &ts[k - a];
    t->name = s->name;
    snprintf(t->dtype, sizeof t->dtype, "%s", st_name(dt));
    t->ndim = s->ndim;
    t->shape[0] = s->shape[0];
    t->shape[1] = s->shape[1];
    t->data = v;
    t->nbytes = s->numel * es;
  }
  const char *meta[] = {"format", "pt", NULL};
  if (st == TS_OK) st = ts_safetensors_write(path, ts, (size_t)(b - a), meta);
  for (int k = 0; bufs && k < b - a; k++) free(bufs[k]);
  free(bufs);
  free(ts);
  return st;
}

ts_status ts_hf_export(const char *out, const ts_model *m, const char *config_text,
                       ts_dtype dtype, size_t max_shard_bytes, ts_hf_tensor_fn get, void *user) {
  if (!max_shard_bytes) max_shard_bytes = TS_HF_MAX_SHARD_BYTES;
  cJSON *config = cJSON_Parse(config_text);
  if (!cJSON_IsObject(config)) {
    cJSON_Delete(config);
    return ts_set_error(TS_ERR_FORMAT, "%s: config.json is not a JSON object", ts_model_origin(m));
  }
  cJSON_DeleteItemFromObjectCaseSensitive(config, "torch_dtype");
  cJSON_AddStringToObject(config, "torch_dtype", torch_name(dtype));
  /* transformers' AutoConfig needs model_type, and its Auto classes and
   * pipelines read architectures: a config that omits them (tessera reads
   * those as its default family) gets the family's */
  if (!cJSON_GetObjectItemCaseSensitive(config, "model_type"))
    cJSON_AddStringToObject(config, "model_type", m->family->model_type);
  if (!cJSON_GetObjectItemCaseSensitive(config, "architectures"))
    cJSON_AddItemToObject(config, "architectures",
                          cJSON_CreateStringArray(&m->family->architecture, 1));
  if (mkdir(out, 0777) != 0 && errno != EEXIST) {
    cJSON_Delete(config);
    return ts_set_error(TS_ERR_IO, "%s: cannot create the folder: %s", out, strerror(errno));
  }
  int n = 0;
  for (int u = 0; u < m->n_units; u++) n += m->units[u].n_tensors;
  flat_tensor *list = calloc((size_t)n, sizeof *list);
  if (!list) {
    cJSON_Delete(config);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s", out);
  }
  /* Greedy shards in layout order (save_pretrained's rule): a tensor that
   * would overflow the current shard starts the next. */
  int k = 0, shards = 1;
  size_t used = 0, es = ts_dtype_size(dtype), total = 0;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++, k++) {
      size_t b = m->units[u].tensors[i].numel * es;
      if (used > 0 && used + b > max_shard_bytes) {
        shards++;
        used = 0;
      }
      used += b;
      total += b;
      list[k] = (flat_tensor){&m->units[u].tensors[i], shards - 1};
    }
  char path[4200];
  ts_status st = TS_OK;
  cJSON *index = cJSON_CreateObject();
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(index, "metadata"), "total_size", (double)total);
  cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
  for (int s = 0, a = 0; s < shards && st == TS_OK; s++) {
    int b = a;
    while (b < n && list[b].shard == s) b++;
    char name[64];
    if (shards == 1) snprintf(name, sizeof name, SINGLE);
    else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    snprintf(path, sizeof path, "%s/%s", out, name);
    st = write_shard(path, list, a, b, dtype, get, user);
    for (int q = a; q < b; q++) cJSON_AddStringToObject(map, list[q].spec->name, name);
    a = b;
  }
  /* the other form must not shadow this one: transformers reads
   * model.safetensors first */
  snprintf(path, sizeof path, "%s/%s", out, shards == 1 ? INDEX : SINGLE);
  if (st == TS_OK && unlink(path) != 0 && errno != ENOENT)
    st = ts_set_error(TS_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
  char *text = NULL;
  if (st == TS_OK && shards > 1) {
    text = cJSON_Print(index);
    snprintf(path, sizeof path, "%s/" INDEX, out);
    st = text ? ts_atomic_write(path, text, strlen(text)) : ts_set_error(TS_ERR_OUT_OF_MEMORY, "index");
    free(text);
  }
  if (st == TS_OK) {
    text = cJSON_Print(config);
    snprintf(path, sizeof path, "%s/config.json", out);
    st = text ? ts_atomic_write(path, text, strlen(text)) : ts_set_error(TS_ERR_OUT_OF_MEMORY, "config");
    free(text);
  }
  cJSON_Delete(index);
  cJSON_Delete(config);
  free(list);
  return st;
}

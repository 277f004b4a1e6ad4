/* mlm.c — masked-LM batches (engine/mlm.h). */
#include "engine/mlm.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/rng.h"

/* Uniform in [0, 1) with 53 random bits. */
static double uniform01(uint64_t *s) {
  return (double)(ts_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* The five special ids ascending (distinct: ts_mlm_read_meta checks). */
static void sorted_specials(const ts_mlm_spec *s, int32_t sp[5]) {
  int32_t v[5] = {s->pad_id, s->unk_id, s->cls_id, s->sep_id, s->mask_id};
  for (int i = 0; i < 5; i++) {
    int k = i;
    for (int j = i + 1; j < 5; j++)
      if (v[j] < v[k]) k = j;
    int32_t x = v[i];
    v[i] = v[k];
    v[k] = x;
    sp[i] = v[i];
  }
}

void ts_mlm_mask(const ts_mlm_spec *s, uint64_t seed, uint64_t sample, int32_t *inputs,
                 int32_t *targets, size_t T) {
  uint64_t st = ts_mix64(seed ^ 0x6d6c6d2d6d61736bull) ^ ts_mix64(sample + 0x9e3779b97f4a7c15ull);
  uint64_t range = (uint64_t)s->vocab_size - (uint64_t)s->n_special;
  int32_t sp[5];
  sorted_specials(s, sp);
  for (size_t t = 0; t < T; t++) {
    targets[t] = -100;
    double u1 = uniform01(&st), u2 = uniform01(&st); /* two draws per position, always */
    uint64_t r = ts_splitmix64(&st);
    int32_t id = inputs[t];
    int special = id == sp[0] || id == sp[1] || id == sp[2] || id == sp[3] || id == sp[4];
    if (special || u1 >= s->mask_prob) continue;
    targets[t] = id;
    if (u2 < s->replace_prob) {
      inputs[t] = s->mask_id;
    } else if (u2 < s->replace_prob + s->random_prob) {
      /* the k-th id that is not special: k past each special at or below it */
      int32_t k = (int32_t)(((r >> 32) * range) >> 32);
      for (int i = 0; i < 5; i++) k += k >= sp[i];
      inputs[t] = k;
    }
  }
}

ts_status ts_mlm_fill(ts_loader *ld, const ts_mlm_spec *s, uint64_t seed, int32_t *scratch,
                      int32_t *inputs, int32_t *targets, uint64_t first_sample, size_t count,
                      size_t T) {
  TS_ASSERT(T >= 3);
  size_t W = T - 2;
  int32_t *text = scratch, *next = scratch + count * W;
  TS_CHECK(ts_loader_fill(ld, text, next, first_sample, count));
  for (size_t i = 0; i < count; i++) {
    int32_t *in = inputs + i * T;
    in[0] = s->cls_id;
    memcpy(in + 1, text + i * W, W * sizeof *in);
    in[T - 1] = s->sep_id;
    ts_mlm_mask(s, seed, first_sample + i, in, targets + i * T, T);
  }
  return TS_OK;
}

/* meta.json's special id `name` into *out. */
static ts_status special_id(const cJSON *ids, const char *path, const char *name, int32_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(ids, name);
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"special_ids.%s\": expected a token id (written by "
                        "prepare with `mlm`)",
                        path, name);
  *out = (int32_t)v->valuedouble;
  return TS_OK;
}

/* The spec from meta.json's parsed root (path names it in messages). */
static ts_status read_spec(const cJSON *root, const char *path, ts_mlm_spec *out) {
  const cJSON *mlm = cJSON_GetObjectItemCaseSensitive(root, "mlm");
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "special_ids");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(root, "vocab_size");
  if (!cJSON_IsObject(root))
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: not a JSON object: expected tessera prepare's meta.json", path);
  if (!cJSON_IsTrue(mlm))
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"mlm\" %s: expected true (a masked-LM model needs data from "
                        "prepare with `mlm`)",
                        path, mlm ? "is not true" : "missing");
  if (!cJSON_IsNumber(vocab) || vocab->valuedouble < 1)
    return ts_set_error(TS_ERR_FORMAT, "%s: field \"vocab_size\": expected a positive integer",
                        path);
  const char *names[] = {"pad", "unk", "cls", "sep", "mask"};
  int32_t *dst[] = {&out->pad_id, &out->unk_id, &out->cls_id, &out->sep_id, &out->mask_id};
  /* five distinct ids below vocab_size: prepare's own ids 0-4 ([UNK] included: byte
   * fallback never emits it; the line break is text), or a model's (BERT's 0, 100-103) */
  out->vocab_size = (size_t)vocab->valuedouble;
  for (int i = 0; i < 5; i++) {
    TS_CHECK(special_id(ids, path, names[i], dst[i]));
    int dup = 0;
    for (int j = 0; j < i; j++) dup |= *dst[j] == *dst[i];
    if (dup || (size_t)*dst[i] >= out->vocab_size)
      return ts_set_error(TS_ERR_FORMAT,
                          "%s: field \"special_ids.%s\" = %d: expected an id below vocab_size "
                          "%zu that no other of [PAD] [UNK] [CLS] [SEP] [MASK] has",
                          path, names[i], (int)*dst[i], out->vocab_size);
  }
  out->n_special = 5;
  if (out->vocab_size <= (size_t)out->n_special)
    return ts_set_error(TS_ERR_FORMAT, "%s: field \"vocab_size\" = %zu: expected more than the "
                        "%d special ids", path, out->vocab_size, out->n_special);
  out->mask_prob = 0.15;
  out->replace_prob = 0.8;
  out->random_prob = 0.1;
  return TS_OK;
}

ts_status ts_data_meta_parse(const char *text, size_t len, const char *path, ts_data_meta *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_ParseWithLength(text, len);
  ts_status st = TS_OK;
  const cJSON *mlm = cJSON_GetObjectItemCaseSensitive(root, "mlm");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(root, "vocab_size");
  double v = cJSON_IsNumber(vocab) ? vocab->valuedouble : 0;
  if (!cJSON_IsObject(root))
    st = ts_set_error(TS_ERR_FORMAT, "%s: not a JSON object: expected tessera prepare's meta.json",
                      path);
  else if (mlm && !cJSON_IsBool(mlm))
    st = ts_set_error(TS_ERR_FORMAT, "%s: field \"mlm\": expected true or false", path);
  else if (!(v >= 1 && v <= INT32_MAX && v == floor(v)))
    st =
        ts_set_error(TS_ERR_FORMAT, "%s: field \"vocab_size\"%s: expected an integer 1 .. 2^31 - 1",
                     path, vocab ? "" : " missing");
  else if (cJSON_IsTrue(mlm))
    st = read_spec(root, path, &out->spec);
  if (st == TS_OK) {
    out->present = 1;
    out->mlm = cJSON_IsTrue(mlm);
    out->mlm_given = mlm != NULL;
    out->vocab_size = (size_t)v;
  }
  cJSON_Delete(root);
  return st;
}

ts_status ts_data_meta_read(const char *data_dir, ts_data_meta *out) {
  memset(out, 0, sizeof *out);
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", data_dir);
  if (access(path, F_OK) != 0 && errno == ENOENT) return TS_OK;
  char *text;
  size_t len;
  TS_CHECK(ts_read_file(path, &text, &len));
  ts_status st = ts_data_meta_parse(text, len, path, out);
  free(text);
  return st;
}

ts_status ts_mlm_read_meta(const char *data_dir, ts_mlm_spec *out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/meta.json", data_dir);
  char *text;
  TS_CHECK(ts_read_file(path, &text, NULL));
  cJSON *root = cJSON_Parse(text);
  free(text);
  memset(out, 0, sizeof *out);
  ts_status st = read_spec(root, path, out);
  cJSON_Delete(root);
  return st;
}

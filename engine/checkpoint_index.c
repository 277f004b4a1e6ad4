/*
 * checkpoint_index.c — index.json read as untrusted input (checkpoint_index.h):
 * its digest checked first, then every field for type, range and
 * consistency before it sizes anything, then the slices' geometry (cover,
 * alignment, no overlap). Messages name DIR/index.json, the field and what
 * was expected, in one line.
 */
#include "engine/checkpoint_index.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  MAX_DP = 1 << 24,     /* data-parallel ranks a checkpoint may name */
  MAX_EXTRA = 8,        /* extra files beside the rank files */
  MAX_TENSORS = 1 << 20 /* logical tensors */
};
static const double MAX_DIM = 1099511627776.0;      /* 2^40 elements along one dimension */
static const double MAX_COUNT = 4503599627370496.0; /* 2^52: exact in a double */

/* TS_ERR_FORMAT: "DIR/index.json: " and the message. */
static ts_status bad(const ck_index *ix, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ts_set_error(TS_ERR_FORMAT, "%s/" TS_CHECKPOINT_INDEX ": %s", ix->dir, msg);
}

/* An integral number in [lo, hi] (exact in a double), or NAN. */
static double integer_in(const cJSON *v, double lo, double hi) {
  if (!cJSON_IsNumber(v)) return NAN;
  double x = v->valuedouble;
  return x >= lo && x <= hi && x == floor(x) ? x : NAN;
}

/* Field `field` of obj (named `name` in messages) as an integer in [lo, hi]. */
static ts_status get_int(const ck_index *ix, const cJSON *obj, const char *field, const char *name,
                         double lo, double hi, double *out) {
  const cJSON *v = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, field) : NULL;
  *out = integer_in(v, lo, hi);
  if (isnan(*out))
    return bad(ix, "field \"%s\"%s: expected an integer %.0f..%.0f", name, v ? "" : " missing", lo,
               hi);
  return TS_OK;
}

ts_status ts_checkpoint_index_digest(const cJSON *root, char hex[TS_SHA256_HEX]) {
  cJSON *copy = cJSON_Duplicate(root, 1);
  if (!copy) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: the index's digest");
  cJSON_DeleteItemFromObjectCaseSensitive(copy, "digest");
  char *text = cJSON_PrintUnformatted(copy);
  cJSON_Delete(copy);
  if (!text) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "checkpoint: the index's digest");
  ts_status st = ts_sha256_bytes(text, strlen(text), hex);
  cJSON_free(text);
  return st;
}

void ts_checkpoint_index_free(ck_index *ix) {
  if (ix->tensors)
    for (size_t t = 0; t < ix->n_tensors; t++)
      for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) free(ix->tensors[t].slices[k]);
  free(ix->files);
  free(ix->tensors);
  ix->files = NULL;
  ix->tensors = NULL;
  ix->n_files = 0;
  ix->n_tensors = 0;
}

/* 1 if s is 64 lowercase hexadecimal digits. */
static int is_sha256(const char *s) {
  return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* ---- the header fields ------------------------------------------------------------ */

static ts_status parse_header(ck_index *ix, const cJSON *root, int version) {
  double v;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!cJSON_IsString(model) || !model->valuestring[0] ||
      strlen(model->valuestring) >= sizeof ix->model)
    return bad(ix, "field \"model\": expected the model's name (1-%zu characters)",
               sizeof ix->model - 1);
  snprintf(ix->model, sizeof ix->model, "%s", model->valuestring);
  TS_CHECK(get_int(ix, root, "num_params", "num_params", 1, MAX_COUNT, &v));
  ix->num_params = (size_t)v;
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  ts_dtype dtype;
  if (!cJSON_IsString(dt) || ts_dtype_parse(dt->valuestring, &dtype) != TS_OK)
    return bad(ix, "field \"dtype\": expected fp32, bf16 or fp16");
  snprintf(ix->dtype, sizeof ix->dtype, "%s", ts_dtype_name(dtype));
  ix->info.dtype = ix->dtype;
  TS_CHECK(get_int(ix, root, "zero_stage", "zero_stage", 0, 3, &v));
  ix->info.zero_stage = (int)v;
  TS_CHECK(get_int(ix, root, "dp", "dp", 1, MAX_DP, &v));
  ix->info.dp = (int)v;
  TS_CHECK(get_int(ix, root, "pipeline", "pipeline", 1, TS_ENGINE_MAX_STAGES, &v));
  ix->info.pipeline = (int)v;
  TS_CHECK(get_int(ix, root, "world", "world", 1, (double)MAX_DP * TS_ENGINE_MAX_STAGES, &v));
  ix->info.world = (int)v;
  if ((double)ix->info.world != (double)ix->info.dp * ix->info.pipeline)
    return bad(ix, "field \"world\" = %d: expected dp %d x pipeline %d = %d", ix->info.world,
               ix->info.dp, ix->info.pipeline, ix->info.dp * ix->info.pipeline);
  /* virtual_stages: model chunks per rank (interleaved), absent for 1 */
  int vs = 1;
  if (cJSON_GetObjectItemCaseSensitive(root, "virtual_stages")) {
    TS_CHECK(get_int(ix, root, "virtual_stages", "virtual_stages", 2, TS_ENGINE_MAX_CHUNKS, &v));
    vs = (int)v;
    if (ix->info.pipeline < 2 || ix->info.pipeline * vs > TS_ENGINE_MAX_STAGES)
      return bad(ix,
                 "field \"virtual_stages\" = %d: expected pipeline >= 2 and pipeline x %d <= %d",
                 vs, vs, TS_ENGINE_MAX_STAGES);
  }
  /* split: pipeline x virtual_stages + 1 unit counts from 0, rising
   * (version 1 may lack it) */
  const cJSON *split = cJSON_GetObjectItemCaseSensitive(root, "split");
  if (split || version >= TS_CHECKPOINT_VERSION_DIGEST) {
    int P = ix->info.pipeline * vs;
    if (!cJSON_IsArray(split) || cJSON_GetArraySize(split) != P + 1)
      return bad(ix,
                 "field \"split\": expected %d rising unit counts from 0 (pipeline %d x "
                 "virtual stages %d + 1)",
                 P + 1, ix->info.pipeline, vs);
    for (int s = 0; s <= P; s++) {
      double x = integer_in(cJSON_GetArrayItem(split, s), 0, MAX_TENSORS);
      if (isnan(x) || (s == 0 && x != 0) || (s > 0 && x <= ix->split[s - 1]))
        return bad(ix, "field \"split\"[%d]: expected rising unit counts from 0", s);
      ix->split[s] = (int)x;
    }
  }
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  TS_CHECK(get_int(ix, opt, "step", "optimizer.step", 0, INT32_MAX, &v));
  ix->info.optimizer_step = (int)v;
  TS_CHECK(get_int(ix, opt, "attempts", "optimizer.attempts", v, INT32_MAX, &v));
  ix->attempts = (int)v;
  ix->info.attempts = ix->attempts;
  const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler");
  const cJSON *scale = cJSON_GetObjectItemCaseSensitive(ls, "scale");
  if (!cJSON_IsNumber(scale) || !(scale->valuedouble > 0) || !(scale->valuedouble <= 3.4e38))
    return bad(ix, "field \"loss_scaler.scale\": expected a finite number > 0");
  ix->scale = (float)scale->valuedouble;
  TS_CHECK(get_int(ix, ls, "clean_steps", "loss_scaler.clean_steps", 0, INT32_MAX, &v));
  ix->clean_steps = (size_t)v;
  const cJSON *hist = cJSON_GetObjectItemCaseSensitive(ls, "history");
  int nh = cJSON_GetArraySize(hist);
  if (!cJSON_IsArray(hist) || nh > 8)
    return bad(ix, "field \"loss_scaler.history\": expected up to 8 [step, scale] pairs");
  for (int k = 0; k < nh; k++) {
    const cJSON *h = cJSON_GetArrayItem(hist, k);
    const cJSON *hs = cJSON_GetArrayItem(h, 1);
    double step = integer_in(cJSON_GetArrayItem(h, 0), 0, INT32_MAX);
    if (!cJSON_IsArray(h) || cJSON_GetArraySize(h) != 2 || isnan(step) || !cJSON_IsNumber(hs) ||
        !(hs->valuedouble > 0) || !(hs->valuedouble <= 3.4e38))
      return bad(ix, "field \"loss_scaler.history\"[%d]: expected [step, scale > 0]", k);
    ix->hist_step[k] = (int)step;
    ix->hist_scale[k] = (float)hs->valuedouble;
  }
  ix->n_history = nh;
  return TS_OK;
}

/* ---- files ---------------------------------------------------------------------- */

static ts_status parse_files(ck_index *ix, const cJSON *root) {
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  int n = cJSON_GetArraySize(files), world = ix->info.world;
  if (!cJSON_IsArray(files) || n < world || n > world + MAX_EXTRA)
    return bad(ix, "field \"files\": expected the %d rank files, then up to %d others", world,
               MAX_EXTRA);
  ix->files = calloc((size_t)n, sizeof *ix->files);
  if (!ix->files) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  ix->n_files = n;
  for (int f = 0; f < n; f++) ix->files[f].fd = -1;
  for (int f = 0; f < n; f++) {
    ck_file *cf = &ix->files[f];
    const cJSON *jf = cJSON_GetArrayItem(files, f);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(jf, "name");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(jf, "sha256");
    char want[32];
    snprintf(want, sizeof want, "rank-%05d.bin", f);
    if (!cJSON_IsString(name) || !name->valuestring[0] ||
        strlen(name->valuestring) >= sizeof cf->name || strchr(name->valuestring, '/') ||
        !strcmp(name->valuestring, ".") || !strcmp(name->valuestring, "..") ||
        (f < world && strcmp(name->valuestring, want) != 0))
      return bad(ix, "field \"files\"[%d].name: expected %s", f,
                 f < world ? want : "a file name in the folder");
    if (!cJSON_IsString(sha) || !is_sha256(sha->valuestring))
      return bad(ix, "field \"files\"[%d].sha256: expected 64 hexadecimal digits", f);
    snprintf(cf->name, sizeof cf->name, "%s", name->valuestring);
    snprintf(cf->sha, sizeof cf->sha, "%s", sha->valuestring);
    for (int g = 0; g < f; g++)
      if (!strcmp(ix->files[g].name, cf->name))
        return bad(ix, "field \"files\"[%d].name: %s is listed twice", f, cf->name);
    char field[32];
    snprintf(field, sizeof field, "files[%d].bytes", f);
    double b;
    TS_CHECK(get_int(ix, jf, "bytes", field, 0, MAX_COUNT, &b));
    cf->bytes = (size_t)b;
    ix->info.bytes += cf->bytes;
  }
  return TS_OK;
}

/* ---- tensors and their slices ------------------------------------------------------- */

/* The slices of kind k of tensor t from its JSON entry jk: each inside the
 * tensor and its rank file, aligned to the dtype, covering [0, numel)
 * exactly once. */
static ts_status parse_kind(ck_index *ix, ck_tensor *t, int k, const cJSON *jk) {
  const char *kind = ts_checkpoint_kind_name((ts_checkpoint_kind)k);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(jk, "dtype");
  const cJSON *sl = cJSON_GetObjectItemCaseSensitive(jk, "slices");
  const char *d = cJSON_IsString(dt) ? dt->valuestring : "";
  int es = !strcmp(d, "F32") ? 4 : !strcmp(d, "BF16") || !strcmp(d, "F16") ? 2 : 0;
  if (!es || (k != TS_CHECKPOINT_PARAM && es != 4))
    return bad(ix, "tensor %s, %s: field \"dtype\": expected %s", t->name, kind,
               k == TS_CHECKPOINT_PARAM ? "F32, BF16 or F16" : "F32");
  int n = cJSON_GetArraySize(sl);
  if (!cJSON_IsArray(sl) || n < 1 || (size_t)n > t->numel)
    return bad(ix, "tensor %s, %s: field \"slices\": expected 1 to %zu slices", t->name, kind,
               t->numel);
  t->es[k] = es;
  snprintf(t->dtype[k], sizeof t->dtype[k], "%s", d);
  t->slices[k] = calloc((size_t)n, sizeof(ck_slice));
  if (!t->slices[k]) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  t->n[k] = n;
  for (int j = 0; j < n; j++) {
    const cJSON *s = cJSON_GetArrayItem(sl, j);
    double v[4];
    int ok = cJSON_IsArray(s) && cJSON_GetArraySize(s) == 4;
    for (int q = 0; q < 4 && ok; q++) {
      v[q] = integer_in(cJSON_GetArrayItem(s, q), 0, q == 0 ? ix->info.world - 1 : MAX_COUNT);
      ok = !isnan(v[q]);
    }
    ck_slice *c = &t->slices[k][j];
    if (ok) *c = (ck_slice){(int)v[0], (size_t)v[1], (size_t)v[2], (size_t)v[3]};
    if (!ok || c->begin >= c->end || c->end > t->numel || c->offset % (size_t)es != 0 ||
        c->offset > ix->files[c->file].bytes ||
        (c->end - c->begin) * (size_t)es > ix->files[c->file].bytes - c->offset)
      return bad(ix,
                 "tensor %s, %s slice %d: expected [rank file, begin, end, offset] inside the "
                 "tensor (%zu elements) and the file, the offset a multiple of %d",
                 t->name, kind, j, t->numel, es);
  }
  /* sorted by begin, each must start where the previous ended */
  for (int j = 1; j < n; j++) /* insertion sort: the writer's order is sorted already */
    for (int i = j; i > 0 && t->slices[k][i - 1].begin > t->slices[k][i].begin; i--) {
      ck_slice tmp = t->slices[k][i];
      t->slices[k][i] = t->slices[k][i - 1];
      t->slices[k][i - 1] = tmp;
    }
  size_t next = 0;
  for (int j = 0; j < n && t->slices[k][j].begin == next; j++) next = t->slices[k][j].end;
  if (next != t->numel)
    return bad(ix, "tensor %s, %s: the slices do not cover its %zu elements exactly once", t->name,
               kind, t->numel);
  return TS_OK;
}

static ts_status parse_tensor(ck_index *ix, ck_tensor *t, const cJSON *jt) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(jt, "name");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(jt, "shape");
  int nd = cJSON_GetArraySize(shape);
  if (!cJSON_IsString(name) || !name->valuestring[0] ||
      strlen(name->valuestring) >= sizeof t->name || !cJSON_IsArray(shape) || nd < 1 || nd > 2)
    return bad(ix, "a tensor without a name or a shape of 1-2 dimensions");
  snprintf(t->name, sizeof t->name, "%s", name->valuestring);
  t->ndim = nd;
  t->shape[1] = 1;
  for (int d = 0; d < nd; d++) {
    double x = integer_in(cJSON_GetArrayItem(shape, d), 1, MAX_DIM);
    if (isnan(x)) return bad(ix, "tensor %s: field \"shape\": expected 1-2 sizes >= 1", t->name);
    t->shape[d] = (size_t)x;
  }
  if ((double)t->shape[0] * (double)t->shape[1] > MAX_COUNT)
    return bad(ix, "tensor %s: field \"shape\": too many elements", t->name);
  t->numel = t->shape[0] * t->shape[1];
  int fp32 = !strcmp(ix->dtype, "fp32");
  for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) {
    const char *kind = ts_checkpoint_kind_name((ts_checkpoint_kind)k);
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(jt, kind);
    int want = k != TS_CHECKPOINT_MASTER || !fp32; /* fp32 runs keep no separate master */
    if (jk && !want)
      return bad(ix, "tensor %s: \"%s\": an fp32 checkpoint keeps none", t->name, kind);
    if (!jk && want) return bad(ix, "tensor %s: no \"%s\"", t->name, kind);
    if (jk) TS_CHECK(parse_kind(ix, t, k, jk));
  }
  return TS_OK;
}

/* One slice's bytes in its file, for the overlap check. */
typedef struct byte_range {
  int file;
  size_t lo, hi;
} byte_range;

static int cmp_range(const void *a, const void *b) {
  const byte_range *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* No two slices of one file (of any tensor or kind) share a byte. */
static ts_status check_overlaps(ck_index *ix) {
  size_t n = 0;
  for (size_t t = 0; t < ix->n_tensors; t++)
    for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) n += (size_t)ix->tensors[t].n[k];
  byte_range *r = malloc((n ? n : 1) * sizeof *r);
  if (!r) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  size_t m = 0;
  for (size_t t = 0; t < ix->n_tensors; t++)
    for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++)
      for (int j = 0; j < ix->tensors[t].n[k]; j++) {
        const ck_slice *s = &ix->tensors[t].slices[k][j];
        r[m++] = (byte_range){s->file, s->offset,
                              s->offset + (s->end - s->begin) * (size_t)ix->tensors[t].es[k]};
      }
  qsort(r, m, sizeof *r, cmp_range);
  ts_status st = TS_OK;
  for (size_t i = 1; i < m && st == TS_OK; i++)
    if (r[i].file == r[i - 1].file && r[i].lo < r[i - 1].hi)
      st = bad(ix, "files[%d]: two slices share bytes %zu..%zu", r[i].file, r[i].lo,
               r[i - 1].hi < r[i].hi ? r[i - 1].hi : r[i].hi);
  free(r);
  return st;
}

static ts_status parse_tensors(ck_index *ix, const cJSON *root) {
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  int nt = cJSON_GetArraySize(tensors);
  if (!cJSON_IsArray(tensors) || nt < 1 || nt > MAX_TENSORS)
    return bad(ix, "field \"tensors\": expected 1 to %d tensors", MAX_TENSORS);
  ix->tensors = calloc((size_t)nt, sizeof *ix->tensors);
  if (!ix->tensors) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  ix->n_tensors = ix->info.n_tensors = (size_t)nt;
  size_t total = 0;
  for (int t = 0; t < nt; t++) {
    TS_CHECK(parse_tensor(ix, &ix->tensors[t], cJSON_GetArrayItem(tensors, t)));
    for (int u = 0; u < t; u++)
      if (!strcmp(ix->tensors[u].name, ix->tensors[t].name))
        return bad(ix, "tensor %s is listed twice", ix->tensors[t].name);
    total += ix->tensors[t].numel;
  }
  if (total != ix->num_params)
    return bad(ix, "field \"num_params\" = %zu: expected the tensors' %zu elements", ix->num_params,
               total);
  return check_overlaps(ix);
}

ts_status ts_checkpoint_index_parse(ck_index *ix, const char *dir, const cJSON *root) {
  memset(ix, 0, sizeof *ix);
  snprintf(ix->dir, sizeof ix->dir, "%s", dir);
  if (!cJSON_IsObject(root)) return bad(ix, "expected a JSON object");
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, TS_CHECKPOINT_FORMAT) != 0)
    return bad(ix, "field \"format\": expected \"" TS_CHECKPOINT_FORMAT "\"");
  double version;
  TS_CHECK(get_int(ix, root, "version", "version", 1, TS_CHECKPOINT_VERSION, &version));
  /* Sealed (version 2, or any index that carries a digest: a version edited
   * down to 1 does not lift the seal): nothing else is read unchecked. */
  const cJSON *digest = cJSON_GetObjectItemCaseSensitive(root, "digest");
  if (version >= TS_CHECKPOINT_VERSION_DIGEST || digest) {
    char hex[TS_SHA256_HEX];
    if (!cJSON_IsString(digest) || !is_sha256(digest->valuestring))
      return bad(ix, "field \"digest\": expected the index's SHA-256 (64 hexadecimal digits)");
    TS_CHECK(ts_checkpoint_index_digest(root, hex));
    if (strcmp(hex, digest->valuestring) != 0)
      return bad(ix,
                 "its digest %.12s... does not match its contents (%.12s...): the index was "
                 "changed or is corrupt",
                 digest->valuestring, hex);
  }
  ts_status st = parse_header(ix, root, (int)version);
  if (st == TS_OK) st = parse_files(ix, root);
  if (st == TS_OK) st = parse_tensors(ix, root);
  if (st != TS_OK) ts_checkpoint_index_free(ix);
  return st;
}

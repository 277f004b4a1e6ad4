/*
 * checkpoint_index.c — index.json read as untrusted input (checkpoint_index.h):
 * its version and digest checked first, then every field for type, range
 * and consistency before it sizes anything, then the slices' geometry
 * (cover, alignment) and the writer's layout of each rank file (kind by
 * kind, tensor by tensor, no overlap). Every count is bounded by what the
 * writer cuts before it sizes an allocation, and every check sorts
 * (qsort) or walks once: O(n log n) in the slices and tensors. Messages
 * name DIR/index.json, the field and what was expected, in one line.
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
  free(ix->by_name);
  ix->files = NULL;
  ix->tensors = NULL;
  ix->by_name = NULL;
  ix->n_files = 0;
  ix->n_tensors = 0;
}

int ts_checkpoint_seed_parse(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n == 0 || n > 20 || strspn(s, "0123456789") != n) return 0;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t d = (uint64_t)(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return 0;
    v = v * 10 + d;
  }
  *out = v;
  return 1;
}

/* 1 if s is 64 lowercase hexadecimal digits. */
static int is_sha256(const char *s) {
  return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* ---- the header fields ------------------------------------------------------------ */

/* A folder named step-N (its last path component "step-" and digits: the
 * trainer's step-NNNNNNNN, as ts_checkpoint_latest reads it) holds the
 * checkpoint after N training steps: optimizer.attempts must be N. */
static ts_status check_folder_step(const ck_index *ix) {
  size_t end = strlen(ix->dir);
  while (end > 1 && ix->dir[end - 1] == '/') end--;
  size_t start = end;
  while (start > 0 && ix->dir[start - 1] != '/') start--;
  const char *name = ix->dir + start;
  size_t len = end - start, digits = len > 5 ? len - 5 : 0;
  if (strncmp(name, "step-", 5) != 0 || digits == 0 || digits > 15 ||
      strspn(name + 5, "0123456789") < digits)
    return TS_OK;
  double n = 0;
  for (size_t i = 0; i < digits; i++) n = n * 10 + (name[5 + i] - '0');
  if (n != (double)ix->attempts)
    return bad(ix,
               "field \"optimizer.attempts\" = %d: expected %.0f, the step in the folder's "
               "name %.*s",
               ix->attempts, n, (int)len, name);
  return TS_OK;
}

static ts_status parse_header(ck_index *ix, const cJSON *root) {
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
  /* split: pipeline x virtual_stages + 1 unit counts from 0, rising */
  const cJSON *split = cJSON_GetObjectItemCaseSensitive(root, "split");
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
  ix->n_units = ix->split[P];
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  TS_CHECK(get_int(ix, opt, "step", "optimizer.step", 0, INT32_MAX, &v));
  ix->info.optimizer_step = (int)v;
  TS_CHECK(get_int(ix, opt, "attempts", "optimizer.attempts", v, INT32_MAX, &v));
  ix->attempts = (int)v;
  ix->info.attempts = ix->attempts;
  TS_CHECK(check_folder_step(ix));
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "data_seed");
  if (!cJSON_IsString(seed) || !ts_checkpoint_seed_parse(seed->valuestring, &ix->info.data_seed))
    return bad(ix, "field \"data_seed\"%s: expected a decimal string of a 64-bit seed",
               seed ? "" : " missing");
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
  int skips = 0; /* halvings: overflow skips */
  for (int k = 0; k < nh; k++) {
    const cJSON *h = cJSON_GetArrayItem(hist, k);
    const cJSON *hs = cJSON_GetArrayItem(h, 1);
    double step = integer_in(cJSON_GetArrayItem(h, 0), 0, INT32_MAX);
    if (!cJSON_IsArray(h) || cJSON_GetArraySize(h) != 2 || isnan(step) || !cJSON_IsNumber(hs) ||
        !(hs->valuedouble > 0) || !(hs->valuedouble <= 3.4e38))
      return bad(ix, "field \"loss_scaler.history\"[%d]: expected [step, scale > 0]", k);
    ix->hist_step[k] = (int)step;
    ix->hist_scale[k] = (float)hs->valuedouble;
    /* each change is recorded at the attempt that made it (loss_scale.c),
     * one at most per attempt */
    if (ix->hist_step[k] > ix->attempts || (k > 0 && ix->hist_step[k] <= ix->hist_step[k - 1]))
      return bad(ix,
                 "field \"loss_scaler.history\"[%d]: step %d: expected rising steps up to "
                 "optimizer.attempts %d",
                 k, ix->hist_step[k], ix->attempts);
    skips += k > 0 && ix->hist_scale[k] < ix->hist_scale[k - 1];
  }
  ix->n_history = nh;
  /* optimizer.step <= attempts: each attempt is an update or a skip. A skip
   * is an fp16 overflow or, at any dtype, a non-finite gradient or loss
   * (optimizer.c; the trainer goes on, and saves, after a later clean
   * step), so step < attempts is no error at fp32 or bf16 either. How many
   * steps were skipped is recorded nowhere: the history is a ring of the
   * last 8 scale changes, with none for a fixed scale or without scaling.
   * Its halvings are overflow skips at distinct attempts, though: a lower
   * bound on attempts - step. */
  if (ix->info.optimizer_step > ix->attempts - skips)
    return bad(ix,
               "field \"optimizer.step\" = %d: expected at most optimizer.attempts %d less the "
               "%d overflow skips loss_scaler.history shows (%d)",
               ix->info.optimizer_step, ix->attempts, skips, ix->attempts - skips);
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
  const cJSON *jf = files->child;
  for (int f = 0; f < n; f++, jf = jf->next) {
    ck_file *cf = &ix->files[f];
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
    /* the rank files' names differ by construction: an extra file's is
     * compared with every name before it (MAX_EXTRA x files at most) */
    for (int g = 0; f >= world && g < f; g++)
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

static int cmp_begin(const void *a, const void *b) {
  const ck_slice *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The slices of kind k of tensor t from its JSON entry jk: at most one per
 * data-parallel rank's file (the writer cuts a tensor's kind once per dp
 * rank of its stage) and at most `most` in the whole index, each inside
 * the tensor and its rank file, aligned to the dtype, covering [0, numel)
 * exactly once. */
static ts_status parse_kind(ck_index *ix, ck_tensor *t, int k, const cJSON *jk, double most) {
  const char *kind = ts_checkpoint_kind_name((ts_checkpoint_kind)k);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(jk, "dtype");
  const cJSON *sl = cJSON_GetObjectItemCaseSensitive(jk, "slices");
  const char *d = cJSON_IsString(dt) ? dt->valuestring : "";
  int es = !strcmp(d, "F32") ? 4 : !strcmp(d, "BF16") || !strcmp(d, "F16") ? 2 : 0;
  if (!es || (k != TS_CHECKPOINT_PARAM && es != 4))
    return bad(ix, "tensor %s, %s: field \"dtype\": expected %s", t->name, kind,
               k == TS_CHECKPOINT_PARAM ? "F32, BF16 or F16" : "F32");
  int dp = ix->info.dp, n = cJSON_GetArraySize(sl);
  size_t up_to = t->numel < (size_t)dp ? t->numel : (size_t)dp;
  if (!cJSON_IsArray(sl) || n < 1)
    return bad(ix, "tensor %s, %s: field \"slices\": expected 1 to %zu slices", t->name, kind,
               up_to);
  if ((size_t)n > up_to)
    return bad(ix, "tensor %s, %s: field \"slices\": %d slices: expected 1 to %zu (%s, dp %d)",
               t->name, kind, n, up_to,
               up_to == (size_t)dp ? "at most one per data-parallel rank's file"
                                   : "at most one per element",
               dp);
  if ((double)ix->n_slices + n > most)
    return bad(ix,
               "field \"tensors\": more than %.0f slices: expected at most %d kinds x (%zu "
               "tensors + %d units x (dp %d - 1)), as the writer cuts them",
               most, !strcmp(ix->dtype, "fp32") ? 3 : 4, ix->n_tensors, ix->n_units, dp);
  t->es[k] = es;
  snprintf(t->dtype[k], sizeof t->dtype[k], "%s", d);
  t->slices[k] = calloc((size_t)n, sizeof(ck_slice));
  if (!t->slices[k]) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  t->n[k] = n;
  ix->n_slices += (size_t)n;
  const cJSON *s = sl->child;
  for (int j = 0; j < n; j++, s = s->next) {
    double v[4];
    int ok = cJSON_IsArray(s) && cJSON_GetArraySize(s) == 4;
    const cJSON *q = ok ? s->child : NULL;
    for (int i = 0; i < 4 && ok; i++, q = q->next) {
      v[i] = integer_in(q, 0, i == 0 ? ix->info.world - 1 : MAX_COUNT);
      ok = !isnan(v[i]);
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
  qsort(t->slices[k], (size_t)n, sizeof(ck_slice), cmp_begin);
  size_t next = 0;
  for (int j = 0; j < n && t->slices[k][j].begin == next; j++) next = t->slices[k][j].end;
  if (next != t->numel)
    return bad(ix, "tensor %s, %s: the slices do not cover its %zu elements exactly once", t->name,
               kind, t->numel);
  return TS_OK;
}

static ts_status parse_tensor(ck_index *ix, ck_tensor *t, const cJSON *jt, double most) {
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
    if (jk) TS_CHECK(parse_kind(ix, t, k, jk, most));
  }
  return TS_OK;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(ck_tensor *const *)a)->name, (*(ck_tensor *const *)b)->name);
}

static int cmp_key_name(const void *key, const void *t) {
  return strcmp(key, (*(ck_tensor *const *)t)->name);
}

ck_tensor *ts_checkpoint_index_find(const ck_index *ix, const char *name) {
  ck_tensor **t = ix->by_name
                      ? bsearch(name, ix->by_name, ix->n_tensors, sizeof *ix->by_name, cmp_key_name)
                      : NULL;
  return t ? *t : NULL;
}

/* No name twice: by_name sorted, neighbours compared. */
static ts_status index_names(ck_index *ix) {
  ix->by_name = malloc(ix->n_tensors * sizeof *ix->by_name);
  if (!ix->by_name) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  for (size_t t = 0; t < ix->n_tensors; t++) ix->by_name[t] = &ix->tensors[t];
  qsort(ix->by_name, ix->n_tensors, sizeof *ix->by_name, cmp_name);
  for (size_t t = 1; t < ix->n_tensors; t++)
    if (!strcmp(ix->by_name[t - 1]->name, ix->by_name[t]->name))
      return bad(ix, "tensor %s is listed twice", ix->by_name[t]->name);
  return TS_OK;
}

/* ---- the writer's layout of each rank file ------------------------------------------ */

/* One slice where its file holds it: bytes [lo, hi) of file `file`, tensor
 * number `tensor` (the index's order) of kind `kind`. */
typedef struct placed {
  int file, kind;
  size_t tensor, lo, hi;
  const ck_slice *s;
} placed;

/* By file, then the writer's order in it: kind, then tensor (then offset,
 * for a deterministic message about two slices of one tensor's kind). */
static int cmp_placed(const void *a, const void *b) {
  const placed *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Each rank file as the writer lays it out (checkpoint.c, for_each_chunk):
 * kind by kind (param, master, exp_avg, exp_avg_sq), within a kind its
 * units in model order and each unit's tensors in order, back to back but
 * for the flat layout's padding; the index lists the tensors in that same
 * order. So ordered by (kind, tensor), a file's slices lie at strictly
 * rising offsets, each after the previous one's end: at most one per
 * tensor and kind, in that order, no two sharing a byte. */
static ts_status check_layout(ck_index *ix) {
  size_t n = ix->n_slices, m = 0;
  placed *r = malloc((n ? n : 1) * sizeof *r);
  if (!r) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ix->dir);
  for (size_t t = 0; t < ix->n_tensors; t++)
    for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++)
      for (int j = 0; j < ix->tensors[t].n[k]; j++) {
        const ck_slice *s = &ix->tensors[t].slices[k][j];
        size_t lo = s->offset, hi = lo + (s->end - s->begin) * (size_t)ix->tensors[t].es[k];
        r[m++] = (placed){s->file, k, t, lo, hi, s};
      }
  qsort(r, m, sizeof *r, cmp_placed);
  ts_status st = TS_OK;
  for (size_t i = 1; i < m && st == TS_OK; i++) {
    const placed *a = &r[i - 1], *b = &r[i];
    const char *ka = ts_checkpoint_kind_name((ts_checkpoint_kind)a->kind);
    const char *kb = ts_checkpoint_kind_name((ts_checkpoint_kind)b->kind);
    if (a->file != b->file) continue;
    if (a->kind == b->kind && a->tensor == b->tensor)
      st = bad(ix,
               "files[%d]: tensor %s has two %s slices (elements %zu..%zu and %zu..%zu): "
               "expected at most one per rank file",
               b->file, ix->tensors[b->tensor].name, kb, a->s->begin, a->s->end, b->s->begin,
               b->s->end);
    else if (b->lo < a->lo)
      st = bad(ix,
               "files[%d]: tensor %s's %s slice at offset %zu lies before tensor %s's %s slice "
               "at offset %zu: expected the writer's order (kind, then tensor)",
               b->file, ix->tensors[b->tensor].name, kb, b->lo, ix->tensors[a->tensor].name, ka,
               a->lo);
    else if (b->lo < a->hi)
      st = bad(ix, "files[%d]: two slices share bytes %zu..%zu", b->file, b->lo,
               a->hi < b->hi ? a->hi : b->hi);
  }
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
  /* The writer cuts a unit's flat elements of a kind at its dp ranks' shard
   * boundaries: dp - 1 of them, each splitting at most one tensor in two.
   * So the slices of a kind number at most tensors + units x (dp - 1), in
   * all at most kinds x that. */
  double kinds = !strcmp(ix->dtype, "fp32") ? 3 : 4;
  double most = kinds * ((double)nt + (double)ix->n_units * (ix->info.dp - 1));
  size_t total = 0;
  const cJSON *jt = tensors->child;
  for (int t = 0; t < nt; t++, jt = jt->next) {
    TS_CHECK(parse_tensor(ix, &ix->tensors[t], jt, most));
    total += ix->tensors[t].numel;
  }
  TS_CHECK(index_names(ix));
  if (total != ix->num_params)
    return bad(ix, "field \"num_params\" = %zu: expected the tensors' %zu elements", ix->num_params,
               total);
  return check_layout(ix);
}

ts_status ts_checkpoint_index_parse(ck_index *ix, const char *dir, const cJSON *root) {
  memset(ix, 0, sizeof *ix);
  snprintf(ix->dir, sizeof ix->dir, "%s", dir);
  if (!cJSON_IsObject(root)) return bad(ix, "expected a JSON object");
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, TS_CHECKPOINT_FORMAT) != 0)
    return bad(ix, "field \"format\": expected \"" TS_CHECKPOINT_FORMAT "\"");
  /* One version, sealed: nothing else is read unchecked. */
  const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
  if (!cJSON_IsNumber(version))
    return bad(ix, "field \"version\"%s: expected %d", version ? "" : " missing",
               TS_CHECKPOINT_VERSION);
  if (version->valuedouble != TS_CHECKPOINT_VERSION)
    return bad(
        ix, "field \"version\" = %g: expected %d%s", version->valuedouble, TS_CHECKPOINT_VERSION,
        version->valuedouble == 1 ? "; version 1 is unsealed (no \"digest\") and no longer read"
                                  : "");
  const cJSON *digest = cJSON_GetObjectItemCaseSensitive(root, "digest");
  char hex[TS_SHA256_HEX];
  if (!cJSON_IsString(digest) || !is_sha256(digest->valuestring))
    return bad(ix, "field \"digest\": expected the index's SHA-256 (64 hexadecimal digits)");
  TS_CHECK(ts_checkpoint_index_digest(root, hex));
  if (strcmp(hex, digest->valuestring) != 0)
    return bad(ix,
               "its digest %.12s... does not match its contents (%.12s...): the index was "
               "changed or is corrupt",
               digest->valuestring, hex);
  ts_status st = parse_header(ix, root);
  if (st == TS_OK) st = parse_files(ix, root);
  if (st == TS_OK) st = parse_tensors(ix, root);
  if (st != TS_OK) ts_checkpoint_index_free(ix);
  return st;
}

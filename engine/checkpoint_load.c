/*
 * checkpoint_load.c — open a checkpoint folder, check its index against the
 * model and its files against their checksums, read tensors whole, and
 * load it into an engine of any layout (checkpoint.h): each rank reads the
 * flat ranges it holds from whichever rank files hold them.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/checksum.h"
#include "base/floats.h"
#include "engine/checkpoint.h"
#include "engine/engine_internal.h"
#include "models/hf_folder.h"

#define FORMAT TS_CHECKPOINT_FORMAT
#define VERSION TS_CHECKPOINT_VERSION
#define INDEX TS_CHECKPOINT_INDEX

/* ---- open, verify, read ---------------------------------------------------------- */

typedef struct ck_slice {
  int file;                  /* index into files */
  size_t begin, end, offset; /* tensor elements [begin, end), at byte offset */
} ck_slice;

typedef struct ck_tensor {
  char name[96];
  int ndim;
  size_t shape[2], numel;
  int es[TS_CHECKPOINT_NUM_KINDS];        /* bytes per element; 0: the kind is absent */
  char dtype[TS_CHECKPOINT_NUM_KINDS][8]; /* "F32", "BF16", "F16" */
  ck_slice *slices[TS_CHECKPOINT_NUM_KINDS];
  int n[TS_CHECKPOINT_NUM_KINDS];
} ck_tensor;

typedef struct ck_file {
  char name[64];
  size_t bytes;
  char sha[TS_SHA256_HEX];
  int fd; /* opened at the first read, else -1 */
} ck_file;

struct ts_checkpoint {
  char dir[4096];
  char dtype[8];
  ts_checkpoint_info info;
  ck_file *files;
  int n_files;
  ck_tensor *tensors;
  size_t n_tensors;
  float scale;          /* loss scaler */
  size_t clean_steps;
  int n_history;
  int hist_step[8];
  float hist_scale[8];
  int attempts;
};

void ts_checkpoint_close(ts_checkpoint *ck) {
  if (!ck) return;
  for (int f = 0; f < ck->n_files; f++)
    if (ck->files[f].fd >= 0) close(ck->files[f].fd);
  for (size_t t = 0; t < ck->n_tensors; t++)
    for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) free(ck->tensors[t].slices[k]);
  free(ck->files);
  free(ck->tensors);
  free(ck);
}

const char *ts_checkpoint_dir(const ts_checkpoint *ck) { return ck->dir; }
void ts_checkpoint_get_info(const ts_checkpoint *ck, ts_checkpoint_info *out) { *out = ck->info; }

/* A required number field of obj (>= 0, integral), or an error naming it. */
static ts_status get_size(const ts_checkpoint *ck, const cJSON *obj, const char *field,
                          size_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(size_t)v->valuedouble)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"%s\": expected an integer >= 0",
                        ck->dir, field);
  *out = (size_t)v->valuedouble;
  return TS_OK;
}

static int cmp_slice(const void *a, const void *b) {
  const ck_slice *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The slices of kind k of tensor t from its JSON entry: inside their
 * files, covering [0, numel) exactly once. */
static ts_status parse_kind(ts_checkpoint *ck, ck_tensor *t, int k, const cJSON *jk) {
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(jk, "dtype");
  const cJSON *sl = cJSON_GetObjectItemCaseSensitive(jk, "slices");
  int es = cJSON_IsString(dt) ? (!strcmp(dt->valuestring, "F32") ? 4
                                 : !strcmp(dt->valuestring, "BF16") || !strcmp(dt->valuestring, "F16") ? 2
                                 : 0)
                              : 0;
  if (!es || !cJSON_IsArray(sl))
    return ts_set_error(TS_ERR_FORMAT,
                        "%s/" INDEX ": tensor %s, %s: expected a dtype F32, BF16 or F16 and slices",
                        ck->dir, t->name, ts_checkpoint_kind_name((ts_checkpoint_kind)k));
  if (k != TS_CHECKPOINT_PARAM && es != 4)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": tensor %s, %s: expected dtype F32", ck->dir,
                        t->name, ts_checkpoint_kind_name((ts_checkpoint_kind)k));
  t->es[k] = es;
  snprintf(t->dtype[k], sizeof t->dtype[k], "%s", dt->valuestring);
  int n = cJSON_GetArraySize(sl);
  t->slices[k] = calloc(n ? (size_t)n : 1, sizeof(ck_slice));
  if (!t->slices[k]) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ck->dir);
  t->n[k] = n;
  for (int j = 0; j < n; j++) {
    const cJSON *s = cJSON_GetArrayItem(sl, j);
    double v[4];
    int ok = cJSON_IsArray(s) && cJSON_GetArraySize(s) == 4;
    for (int q = 0; q < 4 && ok; q++) {
      const cJSON *x = cJSON_GetArrayItem(s, q);
      ok = cJSON_IsNumber(x) && x->valuedouble >= 0;
      v[q] = ok ? x->valuedouble : 0;
    }
    ck_slice *c = &t->slices[k][j];
    if (ok) *c = (ck_slice){(int)v[0], (size_t)v[1], (size_t)v[2], (size_t)v[3]};
    if (!ok || c->file >= ck->info.world || c->begin >= c->end || c->end > t->numel ||
        c->offset + (c->end - c->begin) * (size_t)es > ck->files[c->file].bytes)
      return ts_set_error(TS_ERR_FORMAT,
                          "%s/" INDEX
                          ": tensor %s, %s slice %d: expected [rank file, begin, end, "
                          "offset] inside the tensor (%zu elements) and the file",
                          ck->dir, t->name, ts_checkpoint_kind_name((ts_checkpoint_kind)k), j,
                          t->numel);
  }
  qsort(t->slices[k], (size_t)n, sizeof(ck_slice), cmp_slice);
  size_t next = 0;
  for (int j = 0; j < n; j++) {
    if (t->slices[k][j].begin != next) break;
    next = t->slices[k][j].end;
  }
  if (next != t->numel)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s/" INDEX
                        ": tensor %s, %s: the slices do not cover its %zu elements "
                        "exactly once",
                        ck->dir, t->name, ts_checkpoint_kind_name((ts_checkpoint_kind)k), t->numel);
  return TS_OK;
}

static ts_status parse_tensor(ts_checkpoint *ck, ck_tensor *t, const cJSON *jt) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(jt, "name");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(jt, "shape");
  int nd = cJSON_GetArraySize(shape);
  if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof t->name || !cJSON_IsArray(shape) ||
      nd < 1 || nd > 2)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": a tensor without a name or a shape of 1-2 dims",
                        ck->dir);
  snprintf(t->name, sizeof t->name, "%s", name->valuestring);
  t->ndim = nd;
  t->shape[1] = 1;
  for (int d = 0; d < nd; d++) {
    const cJSON *x = cJSON_GetArrayItem(shape, d);
    if (!cJSON_IsNumber(x) || x->valuedouble < 1)
      return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": tensor %s: bad shape", ck->dir, t->name);
    t->shape[d] = (size_t)x->valuedouble;
  }
  t->numel = t->shape[0] * t->shape[1];
  for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++) {
    const cJSON *jk =
        cJSON_GetObjectItemCaseSensitive(jt, ts_checkpoint_kind_name((ts_checkpoint_kind)k));
    if (jk) TS_CHECK(parse_kind(ck, t, k, jk));
    else if (k != TS_CHECKPOINT_MASTER || strcmp(ck->dtype, "fp32") != 0)
      return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": tensor %s: no \"%s\"", ck->dir, t->name,
                          ts_checkpoint_kind_name((ts_checkpoint_kind)k));
  }
  return TS_OK;
}

static ck_tensor *find_tensor(const ts_checkpoint *ck, const char *name) {
  for (size_t t = 0; t < ck->n_tensors; t++)
    if (!strcmp(ck->tensors[t].name, name)) return &ck->tensors[t];
  return NULL;
}

/* The model and the checkpoint hold the same tensors with the same shapes. */
static ts_status check_model(const ts_checkpoint *ck, const ts_model *m) {
  size_t count = 0;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++, count++) {
      const ts_tensor_spec *s = &m->units[u].tensors[i];
      const ck_tensor *t = find_tensor(ck, s->name);
      if (!t)
        return ts_set_error(TS_ERR_FORMAT,
                            "%s/" INDEX ": no tensor %s, which the model %s has: the checkpoint "
                            "is of another model",
                            ck->dir, s->name, m->name);
      if (t->shape[0] != s->shape[0] || t->shape[1] != s->shape[1])
        return ts_set_error(TS_ERR_FORMAT,
                            "%s/" INDEX ": tensor %s has shape [%zu, %zu], the model %s [%zu, %zu]",
                            ck->dir, s->name, t->shape[0], t->shape[1], m->name, s->shape[0],
                            s->shape[1]);
    }
  if (count != ck->n_tensors)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s/" INDEX ": %zu tensors, the model %s has %zu: the checkpoint is of "
                        "another model",
                        ck->dir, ck->n_tensors, m->name, count);
  return TS_OK;
}

static ts_status parse_index(ts_checkpoint *ck, const cJSON *root) {
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  size_t version = 0, v;
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT) != 0)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"format\": expected \"" FORMAT "\"",
                        ck->dir);
  TS_CHECK(get_size(ck, root, "version", &version));
  if (version != VERSION)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": version %zu: expected %d", ck->dir, version,
                        VERSION);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  ts_dtype dtype;
  if (!cJSON_IsString(dt) || ts_dtype_parse(dt->valuestring, &dtype) != TS_OK)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"dtype\": expected fp32, bf16 or fp16",
                        ck->dir);
  snprintf(ck->dtype, sizeof ck->dtype, "%s", ts_dtype_name(dtype));
  ck->info.dtype = ck->dtype;
  TS_CHECK(get_size(ck, root, "zero_stage", &v));
  ck->info.zero_stage = (int)v;
  TS_CHECK(get_size(ck, root, "dp", &v));
  ck->info.dp = (int)v;
  TS_CHECK(get_size(ck, root, "pipeline", &v));
  ck->info.pipeline = (int)v;
  TS_CHECK(get_size(ck, root, "world", &v));
  ck->info.world = (int)v;
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  TS_CHECK(get_size(ck, opt, "step", &v));
  ck->info.optimizer_step = (int)v;
  TS_CHECK(get_size(ck, opt, "attempts", &v));
  ck->attempts = (int)v;
  const cJSON *ls = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler");
  const cJSON *scale = cJSON_GetObjectItemCaseSensitive(ls, "scale");
  const cJSON *hist = cJSON_GetObjectItemCaseSensitive(ls, "history");
  if (!cJSON_IsNumber(scale) || !cJSON_IsArray(hist) || cJSON_GetArraySize(hist) > 8)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"loss_scaler\": expected scale, "
                        "clean_steps and up to 8 history entries", ck->dir);
  ck->scale = (float)scale->valuedouble;
  TS_CHECK(get_size(ck, ls, "clean_steps", &ck->clean_steps));
  ck->n_history = cJSON_GetArraySize(hist);
  for (int k = 0; k < ck->n_history; k++) {
    const cJSON *h = cJSON_GetArrayItem(hist, k);
    ck->hist_step[k] = (int)cJSON_GetArrayItem(h, 0)->valuedouble;
    ck->hist_scale[k] = (float)cJSON_GetArrayItem(h, 1)->valuedouble;
  }
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  ck->n_files = cJSON_GetArraySize(files);
  if (!cJSON_IsArray(files) || ck->n_files < ck->info.world || ck->info.world < 1 ||
      ck->info.world != ck->info.dp * ck->info.pipeline)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"files\": expected one per rank of "
                        "the dp x pipeline world", ck->dir);
  ck->files = calloc((size_t)ck->n_files, sizeof *ck->files);
  if (!ck->files) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ck->dir);
  for (int f = 0; f < ck->n_files; f++) {
    const cJSON *jf = cJSON_GetArrayItem(files, f);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(jf, "name");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(jf, "sha256");
    ck->files[f].fd = -1;
    if (!cJSON_IsString(name) || strlen(name->valuestring) >= sizeof ck->files[f].name ||
        strchr(name->valuestring, '/') || !cJSON_IsString(sha) || strlen(sha->valuestring) != 64)
      return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": files[%d]: expected a name and a sha256",
                          ck->dir, f);
    snprintf(ck->files[f].name, sizeof ck->files[f].name, "%s", name->valuestring);
    snprintf(ck->files[f].sha, sizeof ck->files[f].sha, "%s", sha->valuestring);
    TS_CHECK(get_size(ck, jf, "bytes", &ck->files[f].bytes));
    ck->info.bytes += ck->files[f].bytes;
  }
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  int nt = cJSON_GetArraySize(tensors);
  if (!cJSON_IsArray(tensors) || nt < 1)
    return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": field \"tensors\": expected an array",
                        ck->dir);
  ck->tensors = calloc((size_t)nt, sizeof *ck->tensors);
  if (!ck->tensors) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: index", ck->dir);
  ck->n_tensors = ck->info.n_tensors = (size_t)nt;
  for (int t = 0; t < nt; t++)
    TS_CHECK(parse_tensor(ck, &ck->tensors[t], cJSON_GetArrayItem(tensors, t)));
  return TS_OK;
}

ts_status ts_checkpoint_open(ts_checkpoint **out, const char *dir, const ts_model *model) {
  *out = NULL;
  ts_checkpoint *ck = calloc(1, sizeof *ck);
  if (!ck) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: checkpoint", dir);
  snprintf(ck->dir, sizeof ck->dir, "%s", dir);
  char path[4200], *text = NULL;
  snprintf(path, sizeof path, "%s/" INDEX, dir);
  struct stat sb;
  ts_status st = TS_OK;
  if (stat(path, &sb) != 0)
    st = ts_set_error(TS_ERR_IO, "%s: not a complete checkpoint (no " INDEX ")", dir);
  if (st == TS_OK) st = ts_read_file(path, &text, NULL);
  cJSON *root = st == TS_OK ? cJSON_Parse(text) : NULL;
  if (st == TS_OK && !root)
    st = ts_set_error(TS_ERR_FORMAT, "%s: not valid JSON near byte %td", path,
                      cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : 0);
  if (st == TS_OK) st = parse_index(ck, root);
  if (st == TS_OK && model) st = check_model(ck, model);
  cJSON_Delete(root);
  free(text);
  if (st != TS_OK) {
    ts_checkpoint_close(ck);
    return st;
  }
  *out = ck;
  return TS_OK;
}

ts_status ts_checkpoint_verify(const ts_checkpoint *ck, int rank, int size) {
  if (size < 1) size = 1;
  for (int f = rank; f < ck->n_files; f += size) {
    const ck_file *cf = &ck->files[f];
    char path[4200], hex[TS_SHA256_HEX];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/%s", ck->dir, cf->name);
    struct stat sb;
    if (stat(path, &sb) != 0)
      return ts_set_error(TS_ERR_FORMAT, "%s: is missing (listed in " INDEX ")", path);
    if ((size_t)sb.st_size != cf->bytes)
      return ts_set_error(TS_ERR_FORMAT, "%s: has %lld bytes, " INDEX " says %zu: the file is "
                          "truncated or replaced", path, (long long)sb.st_size, cf->bytes);
    TS_CHECK(ts_sha256_file(path, hex, &n));
    ((ts_checkpoint *)ck)->info.bytes_read += n;
    if (strcmp(hex, cf->sha) != 0)
      return ts_set_error(TS_ERR_FORMAT, "%s: sha256 %.12s... differs from " INDEX "'s %.12s...: "
                          "the file is corrupt", path, hex, cf->sha);
  }
  return TS_OK;
}

/* Reads tensor elements [a, b) of kind k into dst[a, b) as fp32. */
static ts_status read_range(ts_checkpoint *ck, const ck_tensor *t, int k, size_t a, size_t b,
                            float *dst) {
  if (!t->es[k])
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor %s has no %s", ck->dir, t->name,
                        ts_checkpoint_kind_name((ts_checkpoint_kind)k));
  for (int j = 0; j < t->n[k] && a < b; j++) {
    const ck_slice *s = &t->slices[k][j];
    size_t lo = a > s->begin ? a : s->begin, hi = b < s->end ? b : s->end;
    if (lo >= hi) continue;
    ck_file *f = &ck->files[s->file];
    if (f->fd < 0) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s", ck->dir, f->name);
      f->fd = open(path, O_RDONLY | O_CLOEXEC);
      if (f->fd < 0) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    size_t es = (size_t)t->es[k], nbytes = (hi - lo) * es;
    char *into = es == 4 ? (char *)(dst + lo) : (char *)(dst + lo) + nbytes; /* 2-byte: upper half */
    off_t at = (off_t)(s->offset + (lo - s->begin) * es);
    for (size_t done = 0; done < nbytes;) {
      ssize_t r = pread(f->fd, into + done, nbytes - done, at + (off_t)done);
      if (r <= 0)
        return ts_set_error(TS_ERR_FORMAT, "%s/%s: short read at byte %lld: the file is truncated",
                            ck->dir, f->name, (long long)(at + (off_t)done));
      done += (size_t)r;
    }
    ck->info.bytes_read += nbytes;
    if (es == 2) { /* widen in place, front to back: the source sits in the upper half */
      const uint16_t *h = (const uint16_t *)into;
      int bf = !strcmp(t->dtype[k], "BF16");
      for (size_t q = 0; q < hi - lo; q++) dst[lo + q] = bf ? ts_bf16_to_f32(h[q]) : ts_f16_to_f32(h[q]);
    }
  }
  return TS_OK;
}

ts_status ts_checkpoint_read_tensor(ts_checkpoint *ck, const char *name, ts_checkpoint_kind k,
                                    float *dst, size_t numel) {
  const ck_tensor *t = find_tensor(ck, name);
  if (!t) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: no tensor %s", ck->dir, name);
  if (numel != t->numel)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor %s: %zu elements given, expected %zu",
                        ck->dir, name, numel, t->numel);
  return read_range(ck, t, (int)k, 0, numel, dst);
}

ts_status ts_checkpoint_read_extra(const ts_checkpoint *ck, const char *name, char **out,
                                   size_t *len) {
  *out = NULL;
  for (int f = ck->info.world; f < ck->n_files; f++)
    if (!strcmp(ck->files[f].name, name)) {
      char path[4200], *buf;
      size_t n;
      snprintf(path, sizeof path, "%s/%s", ck->dir, name);
      TS_CHECK(ts_read_file(path, &buf, &n));
      char hex[TS_SHA256_HEX];
      ts_status st = ts_sha256_bytes(buf, n, hex);
      if (st != TS_OK) {
        free(buf);
        return st;
      }
      if (n != ck->files[f].bytes || strcmp(hex, ck->files[f].sha) != 0) {
        free(buf);
        return ts_set_error(TS_ERR_FORMAT, "%s: sha256 differs from " INDEX "'s: the file is corrupt",
                            path);
      }
      *out = buf;
      if (len) *len = n;
      return TS_OK;
    }
  return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": no file %s", ck->dir, name);
}

/* ---- load ------------------------------------------------------------------------ */

/* Flat range [b, e) of unit tensor t (at flat offset off) into dst as fp32
 * from kind k: the tensor-element range [b - off, e - off). */
static ts_status read_flat(ts_checkpoint *ck, const ck_tensor *t, int k, size_t off, size_t b,
                           size_t e, float *dst) {
  return b < e ? read_range(ck, t, k, b - off, e - off, dst) : TS_OK;
}

ts_status ts_checkpoint_load(ts_checkpoint *ck, ts_engine *e) {
  const ts_model *m = e->model;
  TS_CHECK(check_model(ck, m));
  size_t most = 1;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++)
      if (m->units[u].tensors[i].numel > most) most = m->units[u].tensors[i].numel;
  float *buf = malloc(most * sizeof(float));
  if (!buf) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %zu floats to load", ck->dir, most);
  ts_status st = TS_OK;
  for (int u = 0; u < m->n_units && st == TS_OK; u++) {
    int replica = e->replica && u == e->lender; /* the tied head's copy: parameters only */
    if (!ts_engine_owns(e, u) && !replica) continue;
    for (int i = 0; i < m->units[u].n_tensors && st == TS_OK; i++) {
      const ts_tensor_spec *s = &m->units[u].tensors[i];
      const ck_tensor *t = find_tensor(ck, s->name);
      int src = t->es[TS_CHECKPOINT_MASTER] ? TS_CHECKPOINT_MASTER : TS_CHECKPOINT_PARAM;
      if (t->es[src] != 4) {
        st = ts_set_error(TS_ERR_FORMAT, "%s: tensor %s has no fp32 master weights", ck->dir, s->name);
        break;
      }
      /* the parameters' and master weights' parts this rank holds */
      ts_slice p = ts_slice_of(e, u, i, e->zero->shard_params);
      ts_slice o = ts_slice_of(e, u, i, e->zero->shard_optim);
      st = read_flat(ck, t, src, s->offset, p.begin, p.end, buf);
      /* the master weights' part, unless the parameters' covered it */
      int master = !replica && e->units[u].master && (o.begin < p.begin || o.end > p.end);
      if (st == TS_OK && master) st = read_flat(ck, t, src, s->offset, o.begin, o.end, buf);
      if (st == TS_OK) st = ts_engine_set_tensor(e, s->name, buf, s->numel);
      for (int k = TS_CHECKPOINT_EXP_AVG; k <= TS_CHECKPOINT_EXP_AVG_SQ && st == TS_OK && !replica;
           k++) {
        st = read_flat(ck, t, k, s->offset, o.begin, o.end, buf);
        if (st == TS_OK) st = ts_engine_set_state(e, u, i, k - TS_CHECKPOINT_EXP_AVG, buf);
      }
    }
  }
  free(buf);
  TS_CHECK(st);
  e->step = ck->info.optimizer_step;
  e->attempts = ck->attempts;
  if (e->scaler.enabled && e->scaler.dynamic && !strcmp(ck->dtype, "fp16")) {
    e->scaler.scale = ck->scale;
    e->scaler.clean_steps = ck->clean_steps;
    e->scaler.n_history = ck->n_history;
    for (int k = 0; k < ck->n_history; k++) {
      e->scaler.history[k].step = ck->hist_step[k];
      e->scaler.history[k].scale = ck->hist_scale[k];
    }
  }
  return TS_OK;
}


/* ---- import from Hugging Face ------------------------------------------------------ */

ts_status ts_checkpoint_import_hf(ts_engine *e, const char *dir) {
  const ts_model *m = e->model;
  ts_hf_folder *f;
  TS_CHECK(ts_hf_folder_open(&f, dir));
  ts_status st = ts_hf_folder_check(f, m);
  float *buf = NULL;
  for (int u = 0; u < m->n_units && st == TS_OK; u++) {
    if (!ts_engine_owns(e, u) && !(e->replica && u == e->lender)) continue;
    for (int i = 0; i < m->units[u].n_tensors && st == TS_OK; i++) {
      const ts_tensor_spec *s = &m->units[u].tensors[i];
      float *nb = realloc(buf, s->numel * sizeof(float));
      if (!nb) {
        st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: tensor %s", dir, s->name);
        break;
      }
      buf = nb;
      st = ts_hf_folder_read(f, s->name, buf, s->numel);
      if (st == TS_OK) st = ts_engine_set_tensor(e, s->name, buf, s->numel);
    }
  }
  free(buf);
  ts_hf_folder_close(f);
  return st;
}

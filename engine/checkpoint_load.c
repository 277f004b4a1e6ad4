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
#include "engine/engine_testing.h"
#include "base/floats.h"
#include "engine/checkpoint.h"
#include "engine/checkpoint_index.h"
#include "engine/engine_internal.h"
#include "models/hf_folder.h"

#define FORMAT TS_CHECKPOINT_FORMAT
#define VERSION TS_CHECKPOINT_VERSION
#define INDEX TS_CHECKPOINT_INDEX

/* ---- open, verify, read ---------------------------------------------------------- */

/* An opened checkpoint: its checked index (checkpoint_index.h), whose
 * rank files open at their first read. */
struct ts_checkpoint {
  ck_index ix;
};

void ts_checkpoint_close(ts_checkpoint *ck) {
  if (!ck) return;
  for (int f = 0; ck->ix.files && f < ck->ix.n_files; f++)
    if (ck->ix.files[f].fd >= 0) close(ck->ix.files[f].fd);
  ts_checkpoint_index_free(&ck->ix);
  free(ck);
}

const char *ts_checkpoint_dir(const ts_checkpoint *ck) { return ck->ix.dir; }
void ts_checkpoint_get_info(const ts_checkpoint *ck, ts_checkpoint_info *out) {
  *out = ck->ix.info;
}

static ck_tensor *find_tensor(const ts_checkpoint *ck, const char *name) {
  return ts_checkpoint_index_find(&ck->ix, name);
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
                            "%s/" INDEX
                            ": no tensor %s, which the model %s has: the checkpoint "
                            "is of another model",
                            ck->ix.dir, s->name, m->name);
      if (t->shape[0] != s->shape[0] || t->shape[1] != s->shape[1])
        return ts_set_error(
            TS_ERR_FORMAT, "%s/" INDEX ": tensor %s has shape [%zu, %zu], the model %s [%zu, %zu]",
            ck->ix.dir, s->name, t->shape[0], t->shape[1], m->name, s->shape[0], s->shape[1]);
    }
  if (count != ck->ix.n_tensors)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s/" INDEX
                        ": %zu tensors, the model %s has %zu: the checkpoint is of "
                        "another model",
                        ck->ix.dir, ck->ix.n_tensors, m->name, count);
  return TS_OK;
}

ts_status ts_checkpoint_open(ts_checkpoint **out, const char *dir, const ts_model *model) {
  *out = NULL;
  ts_checkpoint *ck = calloc(1, sizeof *ck);
  if (!ck) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: checkpoint", dir);
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
  if (st == TS_OK) st = ts_checkpoint_index_parse(&ck->ix, dir, root);
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
  for (int f = rank; f < ck->ix.n_files; f += size) {
    const ck_file *cf = &ck->ix.files[f];
    char path[4200], hex[TS_SHA256_HEX];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/%s", ck->ix.dir, cf->name);
    struct stat sb;
    if (stat(path, &sb) != 0)
      return ts_set_error(TS_ERR_FORMAT, "%s: is missing (listed in " INDEX ")", path);
    if ((size_t)sb.st_size != cf->bytes)
      return ts_set_error(TS_ERR_FORMAT, "%s: has %lld bytes, " INDEX " says %zu: the file is "
                          "truncated or replaced", path, (long long)sb.st_size, cf->bytes);
    TS_CHECK(ts_sha256_file(path, hex, &n));
    ((ts_checkpoint *)ck)->ix.info.bytes_read += n;
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
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor %s has no %s", ck->ix.dir, t->name,
                        ts_checkpoint_kind_name((ts_checkpoint_kind)k));
  for (int j = 0; j < t->n[k] && a < b; j++) {
    const ck_slice *s = &t->slices[k][j];
    size_t lo = a > s->begin ? a : s->begin, hi = b < s->end ? b : s->end;
    if (lo >= hi) continue;
    ck_file *f = &ck->ix.files[s->file];
    if (f->fd < 0) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%s", ck->ix.dir, f->name);
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
                            ck->ix.dir, f->name, (long long)(at + (off_t)done));
      done += (size_t)r;
    }
    ck->ix.info.bytes_read += nbytes;
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
  if (!t) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: no tensor %s", ck->ix.dir, name);
  if (numel != t->numel)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor %s: %zu elements given, expected %zu",
                        ck->ix.dir, name, numel, t->numel);
  return read_range(ck, t, (int)k, 0, numel, dst);
}

ts_status ts_checkpoint_read_extra(const ts_checkpoint *ck, const char *name, char **out,
                                   size_t *len) {
  *out = NULL;
  for (int f = ck->ix.info.world; f < ck->ix.n_files; f++)
    if (!strcmp(ck->ix.files[f].name, name)) {
      char path[4200], *buf;
      size_t n;
      snprintf(path, sizeof path, "%s/%s", ck->ix.dir, name);
      TS_CHECK(ts_read_file(path, &buf, &n));
      char hex[TS_SHA256_HEX];
      ts_status st = ts_sha256_bytes(buf, n, hex);
      if (st != TS_OK) {
        free(buf);
        return st;
      }
      if (n != ck->ix.files[f].bytes || strcmp(hex, ck->ix.files[f].sha) != 0) {
        free(buf);
        return ts_set_error(TS_ERR_FORMAT, "%s: sha256 differs from " INDEX "'s: the file is corrupt",
                            path);
      }
      *out = buf;
      if (len) *len = n;
      return TS_OK;
    }
  return ts_set_error(TS_ERR_FORMAT, "%s/" INDEX ": no file %s", ck->ix.dir, name);
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
  ts_engine_wait_staging(e);
  size_t most = 1;
  for (int u = 0; u < m->n_units; u++)
    for (int i = 0; i < m->units[u].n_tensors; i++)
      if (m->units[u].tensors[i].numel > most) most = m->units[u].tensors[i].numel;
  float *buf = malloc(most * sizeof(float));
  if (!buf) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %zu floats to load", ck->ix.dir, most);
  ts_status st = TS_OK;
  for (int u = 0; u < m->n_units && st == TS_OK; u++) {
    int replica = e->pipe.replica && u == e->pipe.lender; /* the tied head's copy: parameters only */
    if (!ts_engine_owns(e, u) && !replica) continue;
    for (int i = 0; i < m->units[u].n_tensors && st == TS_OK; i++) {
      const ts_tensor_spec *s = &m->units[u].tensors[i];
      const ck_tensor *t = find_tensor(ck, s->name);
      const ts_engine_hooks *h = ts_engine_get_hooks(); /* the test seam */
      if (h && h->load_point) h->load_point(h->user);
      int src = t->es[TS_CHECKPOINT_MASTER] ? TS_CHECKPOINT_MASTER : TS_CHECKPOINT_PARAM;
      if (t->es[src] != 4) {
        st = ts_set_error(TS_ERR_FORMAT, "%s: tensor %s has no fp32 master weights", ck->ix.dir,
                          s->name);
        break;
      }
      /* the parameters' and master weights' parts this rank holds */
      ts_slice p = ts_slice_of(e, u, i, e->zero->shard_params);
      ts_slice o = ts_slice_of(e, u, i, e->zero->shard_optim);
      st = read_flat(ck, t, src, s->offset, p.begin, p.end, buf);
      /* the master weights' part, unless the parameters' covered it */
      int master = !replica && e->opts.dtype != TS_FP32 && (o.begin < p.begin || o.end > p.end);
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
  e->optim.step = ck->ix.info.optimizer_step;
  e->optim.attempts = ck->ix.attempts;
  if (e->optim.scaler.enabled && e->optim.scaler.dynamic && !strcmp(ck->ix.dtype, "fp16")) {
    e->optim.scaler.scale = ck->ix.scale;
    e->optim.scaler.clean_steps = ck->ix.clean_steps;
    e->optim.scaler.n_history = ck->ix.n_history;
    for (int k = 0; k < ck->ix.n_history; k++) {
      e->optim.scaler.history[k].step = ck->ix.hist_step[k];
      e->optim.scaler.history[k].scale = ck->ix.hist_scale[k];
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
    if (!ts_engine_owns(e, u) && !(e->pipe.replica && u == e->pipe.lender)) continue;
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

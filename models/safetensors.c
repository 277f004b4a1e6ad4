/*
 * safetensors.c — the safetensors reader and writer (format and invariants
 * in safetensors.h).
 *
 * The reader reads the whole file: the header into a temporary buffer parsed
 * by cJSON, the data section into one 64-byte-aligned allocation that every
 * tensor points into. Tensors are kept sorted by data offset (the listing
 * order) and, through a second array of pointers, by name (for find).
 * The writer builds the header with cJSON (numbers inserted as raw text so
 * that byte counts above 2^31 print exactly), pads it with spaces to a
 * multiple of 8 bytes, and writes header and data to "<path>.tmp" before an
 * fsync and a rename.
 */
#define _POSIX_C_SOURCE 200809L

#include "models/safetensors.h"

#include "base/atomic_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER_BYTES 100000000ull /* the upstream reader's limit */
#define DATA_ALIGN 64                 /* bytes; alignment of the data section in memory */
#define MAX_JSON_INT 9007199254740992.0 /* 2^53: cJSON keeps integers as doubles */

struct ts_safetensors {
  char *path;                          /* as given to open */
  size_t count;                        /* tensors */
  ts_safetensors_tensor *tensors;      /* (count) sorted by data offset; names owned */
  const ts_safetensors_tensor **by_name; /* (count) pointers into tensors, sorted by name */
  size_t nmeta;                        /* metadata entries */
  char **meta_keys;                    /* (nmeta) owned */
  char **meta_values;                  /* (nmeta) owned */
  void *data;                          /* the data section, DATA_ALIGN-aligned; owned */
  size_t data_nbytes;                  /* bytes in the data section */
};

static const struct {
  const char *name;
  size_t size;
} kDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},     {"I32", 4},
    {"F32", 4},  {"U64", 8}, {"I64", 8}, {"F64", 8},
};

size_t ts_safetensors_dtype_size(const char *dtype) {
  if (dtype == NULL) return 0;
  for (size_t i = 0; i < sizeof kDtypes / sizeof kDtypes[0]; i++) {
    if (strcmp(dtype, kDtypes[i].name) == 0) return kDtypes[i].size;
  }
  return 0;
}

/* Writes "[d0,d1,...]" into buf (truncated to cap) for error messages. */
static const char *shape_str(char *buf, size_t cap, const size_t *shape, int ndim) {
  size_t len = 0;
  len += (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && len < cap; d++) {
    len += (size_t)snprintf(buf + len, cap - len, d ? ",%zu" : "%zu", shape[d]);
  }
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

/* Product of shape into *numel; 0 on size_t overflow, 1 on success. */
static int shape_numel(const size_t *shape, int ndim, size_t *numel) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] != 0 && n > SIZE_MAX / shape[d]) return 0;
    n *= shape[d];
  }
  *numel = n;
  return 1;
}

/* A JSON number that is a non-negative integer below 2^53 into *out; 1 if ok. */
static int json_size(const cJSON *item, size_t *out) {
  if (!cJSON_IsNumber(item)) return 0;
  double v = item->valuedouble;
  if (!(v >= 0.0) || v > MAX_JSON_INT || v != (double)(uint64_t)v) return 0;
  if ((uint64_t)v > SIZE_MAX) return 0;
  *out = (size_t)v;
  return 1;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* qsort/bsearch order of tensor pointers by name. */
static int cmp_by_name(const void *a, const void *b) {
  const ts_safetensors_tensor *x = *(const ts_safetensors_tensor *const *)a;
  const ts_safetensors_tensor *y = *(const ts_safetensors_tensor *const *)b;
  return strcmp(x->name, y->name);
}

/* A tensor during open: its descriptor, begin offset and header position. */
typedef struct pending {
  ts_safetensors_tensor t;
  size_t begin;      /* bytes from the start of the data section */
  size_t header_pos; /* index in header order, to break offset ties */
} pending;

static int cmp_by_offset(const void *a, const void *b) {
  const pending *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->header_pos < y->header_pos ? -1 : (x->header_pos > y->header_pos);
}

/* Parses one header entry into *p (name already set); checks it against a
 * data section of data_nbytes bytes. */
static ts_status parse_entry(const char *path, const cJSON *e, size_t data_nbytes, pending *p) {
  const char *name = p->t.name;
  char sbuf[160];
  if (!cJSON_IsObject(e)) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
  }
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dtype)) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': field dtype is missing or not a string",
                        path, name);
  }
  size_t esize = ts_safetensors_dtype_size(dtype->valuestring);
  if (esize == 0) {
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field dtype is '%.32s', expected one of BOOL, U8, I8, "
                        "F8_E5M2, F8_E4M3, F8_E8M0, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64",
                        path, name, dtype->valuestring);
  }
  snprintf(p->t.dtype, sizeof p->t.dtype, "%s", dtype->valuestring);
  if (!cJSON_IsArray(shape)) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': field shape is missing or not an array",
                        path, name);
  }
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > TS_SAFETENSORS_MAX_DIMS) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': field shape has %d dims, expected at most %d",
                        path, name, ndim, TS_SAFETENSORS_MAX_DIMS);
  }
  p->t.ndim = ndim;
  int d = 0;
  const cJSON *dim;
  cJSON_ArrayForEach(dim, shape) {
    if (!json_size(dim, &p->t.shape[d])) {
      return ts_set_error(TS_ERR_FORMAT,
                          "%s: tensor '%s': field shape[%d] is not a non-negative integer", path,
                          name, d);
    }
    d++;
  }
  if (!shape_numel(p->t.shape, ndim, &p->t.numel) || p->t.numel > SIZE_MAX / esize) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': field shape %s overflows size_t", path,
                        name, shape_str(sbuf, sizeof sbuf, p->t.shape, ndim));
  }
  size_t begin, end;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      !json_size(cJSON_GetArrayItem(offs, 0), &begin) ||
      !json_size(cJSON_GetArrayItem(offs, 1), &end)) {
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field data_offsets is missing or not [begin, end] "
                        "non-negative integers",
                        path, name);
  }
  if (begin > end) {
    return ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s': field data_offsets [%zu, %zu) has begin > end",
                        path, name, begin, end);
  }
  if (end > data_nbytes) {
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field data_offsets [%zu, %zu) runs past the data section "
                        "(%zu bytes)",
                        path, name, begin, end, data_nbytes);
  }
  p->t.nbytes = p->t.numel * esize;
  if (end - begin != p->t.nbytes) {
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: tensor '%s': field data_offsets [%zu, %zu) spans %zu bytes, expected "
                        "%zu for shape %s of %s",
                        path, name, begin, end, end - begin, p->t.nbytes,
                        shape_str(sbuf, sizeof sbuf, p->t.shape, ndim), p->t.dtype);
  }
  p->begin = begin;
  return TS_OK;
}

/* Copies the "__metadata__" object into st. */
static ts_status parse_metadata(const char *path, const cJSON *meta, ts_safetensors *st) {
  if (!cJSON_IsObject(meta)) {
    return ts_set_error(TS_ERR_FORMAT, "%s: field __metadata__ is not a JSON object", path);
  }
  size_t n = (size_t)cJSON_GetArraySize(meta);
  st->meta_keys = calloc(n ? n : 1, sizeof *st->meta_keys);
  st->meta_values = calloc(n ? n : 1, sizeof *st->meta_values);
  if (!st->meta_keys || !st->meta_values) {
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu metadata entries", path, n);
  }
  const cJSON *kv;
  cJSON_ArrayForEach(kv, meta) {
    if (!cJSON_IsString(kv)) {
      return ts_set_error(TS_ERR_FORMAT, "%s: field __metadata__['%s'] is not a string", path,
                          kv->string);
    }
    st->meta_keys[st->nmeta] = dup_str(kv->string);
    st->meta_values[st->nmeta] = dup_str(kv->valuestring);
    st->nmeta++;
    if (!st->meta_keys[st->nmeta - 1] || !st->meta_values[st->nmeta - 1]) {
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for metadata", path);
    }
  }
  return TS_OK;
}

/* Parses and validates the header (hdr, hlen bytes) into st. */
static ts_status parse_header(const char *path, const char *hdr, size_t hlen, ts_safetensors *st) {
  ts_status s = TS_OK;
  pending *ps = NULL;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
  if (root == NULL) {
    size_t at = (end && end >= hdr) ? (size_t)(end - hdr) : 0;
    return ts_set_error(TS_ERR_FORMAT, "%s: header is not valid JSON (error near header byte %zu of %zu)",
                        path, at, hlen);
  }
  if (!cJSON_IsObject(root)) {
    s = ts_set_error(TS_ERR_FORMAT, "%s: header is not a JSON object", path);
    goto done;
  }
  for (const char *c = end; c < hdr + hlen; c++) {
    if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
      s = ts_set_error(TS_ERR_FORMAT,
                       "%s: header has bytes other than padding after the JSON object (header byte %zu)",
                       path, (size_t)(c - hdr));
      goto done;
    }
  }
  size_t nentries = (size_t)cJSON_GetArraySize(root);
  ps = calloc(nentries ? nentries : 1, sizeof *ps);
  if (!ps) {
    s = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu header entries", path, nentries);
    goto done;
  }
  size_t n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (st->meta_keys) {
        s = ts_set_error(TS_ERR_FORMAT, "%s: field __metadata__ appears twice in the header", path);
        goto done;
      }
      TS_CHECK_GOTO(parse_metadata(path, e, st), s, done);
      continue;
    }
    ps[n].header_pos = n;
    ps[n].t.name = e->string; /* borrowed from cJSON until copied below */
    TS_CHECK_GOTO(parse_entry(path, e, st->data_nbytes, &ps[n]), s, done);
    n++;
  }

  /* No two non-empty byte ranges may overlap. */
  qsort(ps, n, sizeof *ps, cmp_by_offset);
  const pending *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    if (ps[i].t.nbytes == 0) continue;
    if (prev && prev->begin + prev->t.nbytes > ps[i].begin) {
      s = ts_set_error(TS_ERR_FORMAT,
                       "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap in data_offsets",
                       path, prev->t.name, prev->begin, prev->begin + prev->t.nbytes, ps[i].t.name,
                       ps[i].begin, ps[i].begin + ps[i].t.nbytes);
      goto done;
    }
    prev = &ps[i];
  }

  st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
  st->by_name = calloc(n ? n : 1, sizeof *st->by_name);
  if (!st->tensors || !st->by_name) {
    s = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", path, n);
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    st->tensors[i] = ps[i].t;
    st->tensors[i].name = dup_str(ps[i].t.name);
    st->tensors[i].data = (const char *)st->data + ps[i].begin;
    st->by_name[i] = &st->tensors[i];
    st->count++;
    if (!st->tensors[i].name) {
      s = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for tensor names", path);
      goto done;
    }
  }
  qsort(st->by_name, n, sizeof *st->by_name, cmp_by_name);
  for (size_t i = 1; i < n; i++) {
    if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0) {
      s = ts_set_error(TS_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path,
                       st->by_name[i]->name);
      goto done;
    }
  }
done:
  free(ps);
  cJSON_Delete(root);
  return s;
}

/* Reads exactly n bytes; 1 on success. */
static int read_exact(FILE *f, void *buf, size_t n) { return n == 0 || fread(buf, 1, n, f) == n; }

ts_status ts_safetensors_open(ts_safetensors **out, const char *path) {
  if (out == NULL || path == NULL) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_safetensors_open: out and path must not be NULL");
  }
  *out = NULL;
  ts_status s = TS_OK;
  char *hdr = NULL;
  ts_safetensors *st = calloc(1, sizeof *st);
  if (st == NULL) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    s = ts_set_error(TS_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    goto fail;
  }
  st->path = dup_str(path);
  if (!st->path) {
    s = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    goto fail;
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0) {
    s = ts_set_error(TS_ERR_IO, "%s: cannot stat (%s)", path, strerror(errno));
    goto fail;
  }
  size_t fsize = (size_t)sb.st_size;
  unsigned char len8[8];
  if (fsize < 8) {
    s = ts_set_error(TS_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length",
                     path, fsize);
    goto fail;
  }
  if (!read_exact(f, len8, 8)) {
    s = ts_set_error(TS_ERR_IO, "%s: cannot read the header length", path);
    goto fail;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
  if (hlen > MAX_HEADER_BYTES) {
    s = ts_set_error(TS_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", path,
                     (unsigned long long)hlen, MAX_HEADER_BYTES);
    goto fail;
  }
  if (hlen > fsize - 8) {
    s = ts_set_error(TS_ERR_FORMAT,
                     "%s: header length %llu runs past the end of the file (%zu bytes after the "
                     "8-byte length)",
                     path, (unsigned long long)hlen, fsize - 8);
    goto fail;
  }
  hdr = malloc(hlen + 1);
  st->data_nbytes = fsize - 8 - (size_t)hlen;
  size_t alloc = (st->data_nbytes + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN;
  st->data = aligned_alloc(DATA_ALIGN, alloc ? alloc : DATA_ALIGN);
  if (!hdr || !st->data) {
    s = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, fsize);
    goto fail;
  }
  if (!read_exact(f, hdr, (size_t)hlen) || !read_exact(f, st->data, st->data_nbytes)) {
    s = ts_set_error(TS_ERR_IO, "%s: short read (file changed while reading?)", path);
    goto fail;
  }
  hdr[hlen] = '\0';
  TS_CHECK_GOTO(parse_header(path, hdr, (size_t)hlen, st), s, fail);
  free(hdr);
  fclose(f);
  *out = st;
  return TS_OK;
fail:
  free(hdr);
  if (f) fclose(f);
  ts_safetensors_close(st);
  return s;
}

size_t ts_safetensors_count(const ts_safetensors *st) { return st ? st->count : 0; }

const char *ts_safetensors_name(const ts_safetensors *st, size_t i) {
  return (st && i < st->count) ? st->tensors[i].name : NULL;
}

ts_status ts_safetensors_find(const ts_safetensors *st, const char *name,
                              ts_safetensors_tensor *out) {
  if (st == NULL || name == NULL || out == NULL) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_safetensors_find: st, name and out must not be NULL");
  }
  ts_safetensors_tensor key = {0};
  key.name = name;
  const ts_safetensors_tensor *kp = &key;
  const ts_safetensors_tensor *const *hit =
      bsearch(&kp, st->by_name, st->count, sizeof *st->by_name, cmp_by_name);
  if (hit == NULL) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: no tensor '%s'", st->path, name);
  }
  *out = **hit;
  return TS_OK;
}

const char *ts_safetensors_metadata(const ts_safetensors *st, const char *key) {
  if (st == NULL || key == NULL) return NULL;
  for (size_t i = 0; i < st->nmeta; i++) {
    if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
  }
  return NULL;
}

const char *ts_safetensors_path(const ts_safetensors *st) { return st ? st->path : NULL; }

void ts_safetensors_close(ts_safetensors *st) {
  if (st == NULL) return;
  for (size_t i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
  for (size_t i = 0; i < st->nmeta; i++) {
    free(st->meta_keys[i]);
    free(st->meta_values[i]);
  }
  free(st->meta_keys);
  free(st->meta_values);
  free(st->tensors);
  free(st->by_name);
  free(st->data);
  free(st->path);
  free(st);
}

/* ---- writer ---- */

/* Checks the tensors and metadata given to ts_safetensors_write. */
static ts_status check_write_args(const char *path, const ts_safetensors_tensor *t, size_t n,
                                  const char *const *meta_kv) {
  char sbuf[160];
  for (size_t i = 0; i < n; i++) {
    if (t[i].name == NULL || t[i].name[0] == '\0' || strcmp(t[i].name, "__metadata__") == 0) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: tensors[%zu].name is empty, NULL or '__metadata__'", path, i);
    }
    size_t esize = ts_safetensors_dtype_size(t[i].dtype);
    if (memchr(t[i].dtype, '\0', sizeof t[i].dtype) == NULL || esize == 0) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: tensor '%s': dtype is not a safetensors dtype (F32, BF16, I32, ...)",
                          path, t[i].name);
    }
    if (t[i].ndim < 0 || t[i].ndim > TS_SAFETENSORS_MAX_DIMS) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': ndim is %d, expected 0..%d",
                          path, t[i].name, t[i].ndim, TS_SAFETENSORS_MAX_DIMS);
    }
    size_t numel = 0;
    if (!shape_numel(t[i].shape, t[i].ndim, &numel) || numel > SIZE_MAX / esize) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': shape %s overflows size_t",
                          path, t[i].name, shape_str(sbuf, sizeof sbuf, t[i].shape, t[i].ndim));
    }
    if (numel * esize != t[i].nbytes) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: tensor '%s': nbytes is %zu, expected %zu for shape %s of %s", path,
                          t[i].name, t[i].nbytes, numel * esize,
                          shape_str(sbuf, sizeof sbuf, t[i].shape, t[i].ndim), t[i].dtype);
    }
    if (t[i].nbytes > 0 && t[i].data == NULL) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': data is NULL", path, t[i].name);
    }
    for (size_t j = 0; j < i; j++) {
      if (strcmp(t[i].name, t[j].name) == 0) {
        return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is given twice", path,
                            t[i].name);
      }
    }
  }
  for (size_t i = 0; meta_kv && meta_kv[i]; i += 2) {
    if (meta_kv[i + 1] == NULL) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: metadata key '%s' has a NULL value", path,
                          meta_kv[i]);
    }
    for (size_t j = 0; j < i; j += 2) {
      if (strcmp(meta_kv[i], meta_kv[j]) == 0) {
        return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: metadata key '%s' is given twice", path,
                            meta_kv[i]);
      }
    }
  }
  return TS_OK;
}

/* Appends an unsigned integer as raw JSON text to array; 1 on success. */
static int add_raw_size(cJSON *array, size_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%zu", v);
  cJSON *item = cJSON_CreateRaw(buf);
  return item != NULL && cJSON_AddItemToArray(array, item);
}

/* The header JSON (unpadded), malloc'd by cJSON; NULL when out of memory. */
static char *build_header(const ts_safetensors_tensor *t, size_t n, const char *const *meta_kv) {
  char *text = NULL;
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  if (meta_kv && meta_kv[0]) {
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (meta == NULL) goto done;
    for (size_t i = 0; meta_kv[i]; i += 2) {
      if (!cJSON_AddStringToObject(meta, meta_kv[i], meta_kv[i + 1])) goto done;
    }
  }
  size_t offset = 0;
  for (size_t i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
    if (e == NULL || !cJSON_AddStringToObject(e, "dtype", t[i].dtype)) goto done;
    cJSON *shape = cJSON_AddArrayToObject(e, "shape");
    if (shape == NULL) goto done;
    for (int d = 0; d < t[i].ndim; d++) {
      if (!add_raw_size(shape, t[i].shape[d])) goto done;
    }
    cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
    if (offs == NULL || !add_raw_size(offs, offset) || !add_raw_size(offs, offset + t[i].nbytes)) {
      goto done;
    }
    offset += t[i].nbytes;
  }
  text = cJSON_PrintUnformatted(root);
done:
  cJSON_Delete(root);
  return text;
}

ts_status ts_safetensors_write(const char *path, const ts_safetensors_tensor *tensors, size_t n,
                               const char *const *meta_kv) {
  if (path == NULL || (n > 0 && tensors == NULL)) {
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "ts_safetensors_write: path (and tensors when n > 0) must not be NULL");
  }
  TS_CHECK(check_write_args(path, tensors, n, meta_kv));
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (tensors[i].nbytes > SIZE_MAX - total) {
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: total tensor bytes overflow size_t", path);
    }
    total += tensors[i].nbytes;
  }

  char *json = build_header(tensors, n, meta_kv);
  if (json == NULL) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
  size_t jlen = strlen(json);
  size_t hlen = (jlen + 7) / 8 * 8; /* padded with spaces to 8-byte alignment */
  char *hdr = malloc(8 + hlen);
  ts_atomic_file *f = NULL;
  ts_status s = hdr ? ts_atomic_file_open(&f, path)
                    : ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
  if (s == TS_OK) {
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    memcpy(hdr + 8, json, jlen);
    memset(hdr + 8 + jlen, ' ', hlen - jlen);
    s = ts_atomic_file_write(f, hdr, 8 + hlen);
    for (size_t i = 0; i < n && s == TS_OK; i++)
      s = ts_atomic_file_write(f, tensors[i].data, tensors[i].nbytes);
    s = s == TS_OK ? ts_atomic_file_commit(f) : (ts_atomic_file_discard(f), s);
  }
  free(hdr);
  cJSON_free(json);
  return s;
}

/*
 * safetensors.h — read and write the safetensors file format (Hugging Face),
 * the format of tessera's parity fixtures, imported weights and exports.
 *
 * Layout (https://github.com/huggingface/safetensors, "Format"):
 *   8 bytes      N, unsigned little-endian: header length in bytes
 *   N bytes      UTF-8 JSON object: name -> {"dtype": "F32", "shape": [..],
 *                "data_offsets": [begin, end)} with offsets relative to the
 *                start of the data section, plus an optional "__metadata__"
 *                object of string -> string; may be padded with spaces
 *   rest         the data section: raw little-endian, row-major elements
 *
 * Invariants the reader checks (anything else is TS_ERR_FORMAT, with a
 * one-line message naming the file, the tensor and the field): 8 <= file
 * size; N <= 100 000 000 (the upstream limit) and 8 + N <= file size; the
 * header is one JSON object followed only by whitespace; every dtype is known;
 * every shape has at most TS_SAFETENSORS_MAX_DIMS non-negative integer dims;
 * begin <= end <= data section size; end - begin == product(shape) * dtype
 * size; no two tensors' byte ranges overlap; names are unique.
 *
 * Ownership: a ts_safetensors handle owns a copy of the whole file (header
 * strings and the data section, read into host memory at open). Every
 * pointer it hands out (names, data, metadata values) stays valid until
 * ts_safetensors_close. Data is host memory in the file's byte order
 * (little-endian; tessera runs on little-endian hosts only). The data section
 * starts 64-byte aligned in memory, so a tensor's data is aligned to its
 * element size whenever its begin offset is (true for files written by the
 * safetensors library and by ts_safetensors_write when tensors are given
 * largest element size first).
 */
#ifndef TS_MODELS_SAFETENSORS_H
#define TS_MODELS_SAFETENSORS_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most dims a tensor may have (the reader rejects more). */
#define TS_SAFETENSORS_MAX_DIMS 8

/* An open safetensors file (opaque; see ownership above). */
typedef struct ts_safetensors ts_safetensors;

/* One tensor: a plain descriptor. From the reader, every pointer is owned by
 * the ts_safetensors handle; given to the writer, by the caller. */
typedef struct ts_safetensors_tensor {
  const char *name;                       /* NUL-terminated, e.g. "lm_head.weight" */
  char dtype[8];                          /* "F32", "BF16", "I32", ... NUL-terminated */
  int ndim;                               /* 0 .. TS_SAFETENSORS_MAX_DIMS (0: a scalar) */
  size_t shape[TS_SAFETENSORS_MAX_DIMS];  /* elements per dim, row-major; [ndim..) unused */
  size_t numel;                           /* elements: product of shape (1 for a scalar) */
  const void *data;                       /* host bytes, little-endian; NULL only if nbytes == 0 */
  size_t nbytes;                          /* bytes: numel * ts_safetensors_dtype_size(dtype) */
} ts_safetensors_tensor;

/* Bytes per element of a safetensors dtype name: 1 for BOOL, U8, I8,
 * F8_E5M2, F8_E4M3, F8_E8M0; 2 for U16, I16, F16, BF16; 4 for U32, I32, F32;
 * 8 for U64, I64, F64. Returns 0 for an unknown name (and for NULL). */
size_t ts_safetensors_dtype_size(const char *dtype);

/* Opens `path`, reads the whole file into host memory and validates it
 * (see the invariants above). On success *out is a new handle, to be freed
 * with ts_safetensors_close; on failure *out is NULL.
 * Returns TS_OK; TS_ERR_INVALID_ARGUMENT (NULL out or path); TS_ERR_IO
 * (cannot open or read the file); TS_ERR_FORMAT (malformed contents);
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_safetensors_open(ts_safetensors **out, const char *path);

/* Number of tensors in the file (the "__metadata__" entry is not one). */
size_t ts_safetensors_count(const ts_safetensors *st);

/* Name of tensor i, 0 <= i < count, in ascending data-offset order (the order
 * in which they were written; header order breaks ties). NULL if i is out of
 * range. */
const char *ts_safetensors_name(const ts_safetensors *st, size_t i);

/* Looks a tensor up by exact name and fills *out (pointers owned by st).
 * Returns TS_OK; TS_ERR_INVALID_ARGUMENT when a pointer is NULL or there is
 * no such tensor (message "<path>: no tensor '<name>'"). O(log count). */
ts_status ts_safetensors_find(const ts_safetensors *st, const char *name,
                              ts_safetensors_tensor *out);

/* Value of "__metadata__"[key], or NULL if the file has no such key. */
const char *ts_safetensors_metadata(const ts_safetensors *st, const char *key);

/* The path the file was opened with (owned by st). */
const char *ts_safetensors_path(const ts_safetensors *st);

/* Frees the handle and everything it owns. NULL is a no-op. */
void ts_safetensors_close(ts_safetensors *st);

/* Writes n tensors to `path` as one safetensors file, atomically: it writes
 * "<path>.tmp", fsyncs it, renames it over `path` and fsyncs the directory
 * (best effort),
 * so `path` either keeps its old contents or has the complete new ones.
 * Tensors are laid out back to back in the given order (header entries in
 * the same order); the header is padded with spaces to a multiple of 8 bytes.
 * Each tensor needs a unique, non-empty name other than "__metadata__", a
 * known dtype, 0 <= ndim <= TS_SAFETENSORS_MAX_DIMS, and nbytes ==
 * product(shape) * dtype size (numel is not read). meta_kv lists metadata as
 * key, value, key, value, ..., NULL (or is NULL for none); keys must be
 * unique. Returns TS_OK; TS_ERR_INVALID_ARGUMENT (a bad tensor descriptor or
 * metadata list; nothing is written); TS_ERR_IO (create/write/fsync/rename
 * failed; the temporary file is removed, `path` is untouched);
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_safetensors_write(const char *path, const ts_safetensors_tensor *tensors,
                               size_t n, const char *const *meta_kv);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_SAFETENSORS_H */

/*
 * checkpoint_index.h — private to engine/'s checkpoints: the parsed form of
 * a checkpoint folder's index.json (checkpoint.h), and the digest that
 * seals it.
 *
 * Invariants of a parsed index (ts_checkpoint_index_parse): every field was
 * checked for type, range and consistency before it sized an allocation or
 * an offset: the version (2 only) and the digest first, world = dp x
 * pipeline, the optimizer's counters against the loss scaler's history and
 * a step-N folder's name, the rank files named rank-RRRRR.bin in order and
 * every file name unique, tensor names unique, each tensor's slices of each
 * kind covering it exactly once, inside their file, aligned to their dtype,
 * at most one per rank file and dp in all, no more slices in all than the
 * writer cuts, and in each rank file the slices in the writer's order
 * (kind, then tensor: rising offsets, no two overlapping). Parsing costs
 * O(n log n) in the slices and tensors. On any error everything built so
 * far is freed (ts_checkpoint_index_free).
 */
#ifndef TS_ENGINE_CHECKPOINT_INDEX_H
#define TS_ENGINE_CHECKPOINT_INDEX_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/checksum.h"
#include "engine/checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ck_slice {
  int file;                  /* index into files, a rank file */
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

/* A parsed index. Owns files and tensors (and their slices). */
typedef struct ck_index {
  char dir[4096];                      /* the folder, for messages */
  char dtype[8];                       /* "fp32", "bf16", "fp16" */
  char model[96];                      /* the saving run's model name */
  size_t num_params;                   /* its parameters, the tensors' elements summed */
  int split[TS_ENGINE_MAX_STAGES + 1]; /* first unit of each pipeline stage, then n_units */
  ts_checkpoint_info info;             /* dtype points into dtype above */
  ck_file *files;                      /* (n_files): the rank files (info.world), then the extras */
  int n_files;
  ck_tensor *tensors; /* (n_tensors), in the index's (the model's) order */
  size_t n_tensors;
  ck_tensor **by_name; /* (n_tensors) the same, sorted by name (strcmp) */
  int n_units;         /* the model's units: split's last count */
  size_t n_slices;     /* slices of every tensor and kind */
  float scale; /* loss scaler */
  size_t clean_steps;
  int n_history;
  int hist_step[8];
  float hist_scale[8];
  int attempts; /* optimizer steps finished, skipped ones included */
} ck_index;

/* The digest of an index: SHA-256 of cJSON_PrintUnformatted of its root
 * object without the member "digest" (so whitespace does not matter and
 * any other change does), as 64 hex digits into hex. TS_ERR_OUT_OF_MEMORY. */
ts_status ts_checkpoint_index_digest(const cJSON *root, char hex[TS_SHA256_HEX]);

/* Parses and checks index.json's root into *ix (zeroed first; ix->dir is
 * dir), checking nothing on disk but what the index says and dir's name:
 * a folder named step-N (the trainer's step-NNNNNNNN) must hold the index
 * of optimizer.attempts N. TS_ERR_FORMAT naming DIR/index.json, the field
 * and what was expected (a version other than 2: "field \"version\" = 1:
 * expected 2; version 1 is unsealed (no \"digest\") and no longer read");
 * TS_ERR_OUT_OF_MEMORY. On error *ix holds nothing (freed). */
ts_status ts_checkpoint_index_parse(ck_index *ix, const char *dir, const cJSON *root);

/* The tensor named `name` of a parsed index, or NULL: a binary search of
 * by_name. */
ck_tensor *ts_checkpoint_index_find(const ck_index *ix, const char *name);

/* 1 if s is a data seed as the index and trainer.json write it: 1-20
 * decimal digits of a value below 2^64 (into *out), else 0. */
int ts_checkpoint_seed_parse(const char *s, uint64_t *out);

/* Frees what a parse built (closing no files); NULL members are fine. */
void ts_checkpoint_index_free(ck_index *ix);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_CHECKPOINT_INDEX_H */

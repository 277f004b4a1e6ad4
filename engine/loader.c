/*
 * loader.c — the deterministic data loader (engine/loader.h).
 *
 * Invariant: a loader's output depends only on (file, T, seed, shuffle,
 * sample index).
 */
#include "engine/loader.h"

#include <stdlib.h>

#include "base/rng.h"

struct ts_loader {
  const ts_token_file *shard; /* borrowed */
  size_t T;                    /* sequence length in tokens */
  size_t n_windows;            /* W = (n_tokens - 1) / T */
  uint64_t seed;               /* shuffle seed */
  int shuffle;                 /* 0: identity order */
  uint64_t perm_epoch;         /* epoch whose permutation is cached */
  int perm_valid;              /* perm holds perm_{perm_epoch} */
  size_t *perm;                /* (W) window order of perm_epoch; NULL if !shuffle */
};

/* Uniform integer in [0, n), n >= 1, without modulo bias (rejection). */
static uint64_t uniform_below(uint64_t *state, uint64_t n) {
  uint64_t threshold = (0 - n) % n; /* 2^64 mod n: outputs below it are rejected */
  for (;;) {
    uint64_t r = ts_splitmix64(state);
    if (r >= threshold) return r % n;
  }
}

/* perm = Fisher-Yates (Durstenfeld) permutation of [0, W) for one epoch; the
 * stream starts at ts_mix64(seed ^ ts_mix64(epoch + 1)), distinct per (seed, epoch). */
static void build_permutation(size_t *perm, size_t W, uint64_t seed, uint64_t epoch) {
  uint64_t state = ts_mix64(seed ^ ts_mix64(epoch + 1));
  for (size_t i = 0; i < W; i++) perm[i] = i;
  for (size_t i = W; i > 1; i--) {
    size_t j = (size_t)uniform_below(&state, (uint64_t)i);
    size_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
}

ts_status ts_loader_init(ts_loader **out, const ts_token_file *shard, size_t T, uint64_t seed,
                         int shuffle) {
  if (out == NULL || shard == NULL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_loader_init: out and shard must not be NULL");
  *out = NULL;
  const char *path = ts_token_file_path(shard);
  size_t n = ts_token_file_num_tokens(shard);
  if (T == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: sequence length T is 0, expected >= 1", path);
  size_t W = n > 0 ? (n - 1) / T : 0;
  if (W == 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: shard has %zu tokens, fewer than seq T+1 = %zu", path, n, T + 1);
  ts_loader *ld = (ts_loader *)calloc(1, sizeof *ld);
  if (ld == NULL) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: loader: out of memory", path);
  ld->shard = shard;
  ld->T = T;
  ld->n_windows = W;
  ld->seed = seed;
  ld->shuffle = shuffle != 0;
  if (ld->shuffle) {
    ld->perm = (size_t *)malloc(W * sizeof(size_t));
    if (ld->perm == NULL) {
      free(ld);
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: loader permutation of %zu windows: out of memory",
                          path, W);
    }
  }
  *out = ld;
  return TS_OK;
}

ts_status ts_loader_fill(ts_loader *ld, int32_t *inputs, int32_t *targets, uint64_t first_sample,
                         size_t count) {
  if (ld == NULL) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_loader_fill: loader is NULL");
  if (count == 0) return TS_OK;
  if (inputs == NULL || targets == NULL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: ts_loader_fill: inputs and targets must not be NULL", ts_token_file_path(ld->shard));
  if (first_sample + (uint64_t)count < first_sample)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: ts_loader_fill: sample index %llu + count %zu overflows", ts_token_file_path(ld->shard),
                        (unsigned long long)first_sample, count);
  const size_t T = ld->T;
  const uint64_t W = ld->n_windows;
  for (size_t i = 0; i < count; i++) {
    uint64_t k = first_sample + i;
    uint64_t epoch = k / W;
    size_t pos = (size_t)(k % W);
    size_t window = pos;
    if (ld->shuffle) {
      if (!ld->perm_valid || ld->perm_epoch != epoch) {
        build_permutation(ld->perm, ld->n_windows, ld->seed, epoch);
        ld->perm_epoch = epoch;
        ld->perm_valid = 1;
      }
      window = ld->perm[pos];
    }
    size_t start = window * T;
    ts_token_file_read(ld->shard, start, T, inputs + i * T);      /* (T) */
    ts_token_file_read(ld->shard, start + 1, T, targets + i * T);  /* (T): shifted by one */
  }
  return TS_OK;
}

size_t ts_loader_num_windows(const ts_loader *ld) { return ld->n_windows; }

void ts_loader_free(ts_loader *ld) {
  if (ld == NULL) return;
  free(ld->perm);
  free(ld);
}

uint64_t ts_loader_sample_index(uint64_t step, size_t accum_step, size_t accum, size_t dp_rank,
                                size_t dp_size, size_t B) {
  TS_ASSERT(accum_step < accum);
  TS_ASSERT(dp_rank < dp_size);
  uint64_t G = (uint64_t)dp_size * B * accum; /* samples per global batch */
  return step * G + (uint64_t)accum_step * dp_size * B + (uint64_t)dp_rank * B;
}

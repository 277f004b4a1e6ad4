/*
 * generate.h — autoregressive generation from a causal LM (LLaMA): one
 * sequence at a time, every unit's weights whole on one device, a
 * key/value cache per block (ts_unit_decode), and the sampling of
 * transformers' generate (temperature, top-k, top-p, in that order, as
 * its logits processors run them; greedy when the temperature is 0).
 *
 * Sampling draws from base/rng.h's splitmix64 seeded with the seed alone,
 * so a seed gives the same tokens on every run and thread count (not
 * torch's stream: the same seed does not give transformers' tokens).
 */
#ifndef TS_MODELS_GENERATE_H
#define TS_MODELS_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_generator ts_generator;

/* Fills dst (numel fp32 host values) with the tensor of Hugging Face name
 * `name` (ts_hf_tensor_fn's contract: a folder, a checkpoint). */
typedef ts_status (*ts_weights_fn)(void *user, const char *name, float *dst, size_t numel);

typedef struct ts_generator_opts {
  ts_device device; /* where the weights, cache and math live */
  ts_dtype dtype;   /* storage dtype of weights, activations and cache */
  size_t max_T;     /* positions the cache holds: prompt + new tokens, at most max_seq */
  int recompute;    /* 1: no cache: every step runs ts_unit_forward over the whole
                       sequence (a check of the cache; slower by the sequence length) */
} ts_generator_opts;

/* Creates a generator for m (kept by pointer; it must outlive g): each
 * unit's weights read by name through `read`, rounded to opts->dtype and
 * placed on opts->device, and a cache of opts->max_T positions (none with
 * opts->recompute, which any model takes: an encoder such as BERT then
 * serves ts_generator_forward). TS_ERR_UNSUPPORTED (m cannot decode: not
 * a causal LM, and not opts->recompute),
 * TS_ERR_INVALID_ARGUMENT (max_T 0 or past max_position_embeddings, no
 * device), TS_ERR_OUT_OF_MEMORY, read's errors. *out NULL on failure. */
ts_status ts_generator_create(ts_generator **out, const ts_model *m,
                              const ts_generator_opts *opts, ts_weights_fn read, void *user);

/* Appends tokens (n >= 1 host ids in [0, V)) to the sequence and writes
 * the logits that follow its newest position into logits (V fp32, host).
 * TS_ERR_INVALID_ARGUMENT (n == 0, the sequence past max_T, an id out of
 * range: the sequence is then unchanged), the kernels' errors. */
ts_status ts_generator_append(ts_generator *g, const int32_t *tokens, size_t n, float *logits);

/* The whole forward of tokens (n >= 1 host ids, at most max_T) as one
 * sequence, without the cache (ts_unit_forward of every unit; for BERT,
 * [CLS] ... [SEP] as the caller frames it), and the logits of the n_rows
 * positions rows[] into logits (n_rows, V) fp32 host. The sequence of
 * ts_generator_append is left as it was. TS_ERR_INVALID_ARGUMENT (n 0 or
 * past max_T, an id or a row out of range), the kernels' errors. */
ts_status ts_generator_forward(ts_generator *g, const int32_t *tokens, size_t n,
                               const size_t *rows, size_t n_rows, float *logits);

/* Positions in the sequence so far. */
size_t ts_generator_length(const ts_generator *g);

/* Empties the sequence (the cache is overwritten from position 0). */
void ts_generator_reset(ts_generator *g);

/* Frees g; NULL is a no-op. */
void ts_generator_free(ts_generator *g);

/* How the next token is chosen from the logits. */
typedef struct ts_sampling {
  float temperature; /* 0: greedy (the first largest logit, torch.argmax's choice) */
  size_t top_k;      /* keep the k largest logits (ties with the k-th kept); 0: all */
  float top_p;       /* keep the smallest set whose probability reaches top_p; 1: all */
  uint64_t seed;     /* the sampler's stream */
} ts_sampling;

/* The next token from logits (V fp32, host; overwritten): greedy when
 * s->temperature == 0, else logits / temperature, then top-k
 * (TopKLogitsWarper), then top-p (TopPLogitsWarper: the ascending-sorted
 * cumulative probability <= 1 - top_p is cut, the largest always kept),
 * then one uniform draw u in [0, 1) from *rng (splitmix64, 53 bits)
 * against the kept tokens' cumulative softmax in id order. V >= 1. */
int32_t ts_sample(float *logits, size_t V, const ts_sampling *s, uint64_t *rng);

/* Called with each new token as it is chosen; nonzero stops generation. */
typedef int (*ts_token_fn)(void *user, int32_t token);

/* Generates up to max_new tokens after prompt (n >= 1 ids) into out
 * (max_new ids; *n_out of them written), from an empty sequence: stops
 * early after a token of stop (n_stop ids; it is kept in out) or when
 * on_token returns nonzero (may be NULL). TS_ERR_INVALID_ARGUMENT when
 * n + max_new exceeds the generator's max_T, ts_generator_append's
 * errors. */
ts_status ts_generate(ts_generator *g, const int32_t *prompt, size_t n, size_t max_new,
                      const ts_sampling *s, const int32_t *stop, size_t n_stop, int32_t *out,
                      size_t *n_out, ts_token_fn on_token, void *user);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_GENERATE_H */

/*
 * loader.h — the deterministic data loader over a token file
 * (engine/token_file.h): sequences by global sample index.
 *
 * The loader cuts a token file into windows of T+1 tokens at stride T (window w is
 * tokens [w*T, w*T + T], so consecutive windows share one token) and hands
 * them out by a global sample index k = 0, 1, 2, ...: epoch e = k / W,
 * position p = k % W, window perm_e[p], where perm_e is a Fisher-Yates
 * permutation of [0, W) drawn from a splitmix64 stream seeded with (seed, e),
 * or the identity when shuffling is off. Which sequence a sample index names
 * is therefore a pure function of (seed, k): it does not depend on the world
 * size, the ZeRO stage, the micro-batch size or on what was read before.
 * ts_loader_sample_index() says which indices each data-parallel rank reads.
 */
#ifndef TS_ENGINE_LOADER_H
#define TS_ENGINE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/token_file.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A loader over one token file (opaque). Borrows the file; caches the window
 * permutation of the most recent epoch, so it is not thread-safe (one loader
 * per thread). */
typedef struct ts_loader ts_loader;

/* Creates a loader of sequences of T tokens over `tf`:
 * W = (n_tokens - 1) / T windows; shuffle != 0 permutes the windows anew
 * each epoch from `seed` (training), shuffle == 0 visits them in file order
 * (evaluation; `seed` is ignored).
 * Returns TS_OK; TS_ERR_INVALID_ARGUMENT if T is 0 or the file has fewer
 * than T+1 tokens (W == 0; "val.bin: shard has N tokens, fewer than seq
 * T+1 = ..."); TS_ERR_OUT_OF_MEMORY. On failure *out is NULL. */
ts_status ts_loader_init(ts_loader **out, const ts_token_file *tf, size_t T,
                         uint64_t seed, int shuffle);

/* Fills `count` sequences for the sample indices first_sample, ...,
 * first_sample + count - 1. Sample k is window w = perm_{k/W}[k % W]:
 *   inputs[i*T + t]  = token[w*T + t]        inputs:  (count, T) int32, host
 *   targets[i*T + t] = token[w*T + t + 1]    targets: (count, T) int32, host
 * so targets are inputs shifted left by one. inputs and targets must not
 * overlap. Returns TS_OK; TS_ERR_INVALID_ARGUMENT if a pointer is NULL with
 * count > 0 or first_sample + count overflows. */
ts_status ts_loader_fill(ts_loader *ld, int32_t *inputs, int32_t *targets,
                         uint64_t first_sample, size_t count);

/* Number of windows W per epoch. */
size_t ts_loader_num_windows(const ts_loader *ld);

/* Frees the loader (not the file); NULL is a no-op. */
void ts_loader_free(ts_loader *ld);

/* First sample index of one micro-batch: rank dp_rank of a data-parallel
 * group of dp_size ranks, micro-batch size B, at optimizer step `step` and
 * gradient-accumulation step accum_step of `accum`. With G = dp_size * B *
 * accum samples per global batch, the micro-batch is samples
 *   k = step*G + accum_step*dp_size*B + dp_rank*B + b,   b = 0 .. B-1.
 * Every rank reads a disjoint slice of every global batch, and the global
 * batch of a step, samples [step*G, (step+1)*G), is the same however it is
 * split between ranks and accumulation steps (dp 2 x accum 1 and dp 1 x
 * accum 2 read the same samples). Pass the result to ts_loader_fill with
 * count = B. Arguments are asserted: accum_step < accum, dp_rank < dp_size. */
uint64_t ts_loader_sample_index(uint64_t step, size_t accum_step, size_t accum,
                                size_t dp_rank, size_t dp_size, size_t B);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_LOADER_H */

/*
 * mlm.h — masked-LM batches (BERT; Devlin et al. 2019 §3.1, as Hugging
 * Face's DataCollatorForLanguageModeling builds them) from the token files
 * of `tessera prepare --mlm`.
 *
 * A sequence of T ids is [CLS] w [SEP], w a window of T - 2 text tokens
 * cut by a loader of seq T - 2 (engine/token_file.h: windows at stride
 * T - 2, so the whole text is covered). Masking draws, for each position
 * t of sample k, from a splitmix64 stream seeded by (seed, k) alone:
 *   u1 < mask_prob (0.15) selects a non-special token ([CLS], [SEP], [PAD],
 *     [UNK] and [MASK], wherever their ids are, are never selected);
 *   of the selected: u2 < 0.8 -> [MASK], 0.8 <= u2 < 0.9 -> a token drawn
 *     uniformly from the vocab_size - 5 ids that are not special (the k-th
 *     of them, k uniform: with the specials at 0-4, the id 5 + k), else
 *     unchanged;
 *   targets[t] = the original id where selected, -100 elsewhere.
 * Hugging Face draws the random replacement from the whole vocabulary;
 * tessera keeps specials out of it so the attention mask and token types,
 * which the model derives from [PAD] and [SEP], stay those of the text.
 * A sample index names one (step, position in the global batch)
 * (ts_loader_sample_index), so the mask is a pure function of (seed, step,
 * sample): the same on any rank count, pipeline stage or resume.
 */
#ifndef TS_ENGINE_MLM_H
#define TS_ENGINE_MLM_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "engine/loader.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The special ids and rates of masked-LM batches. */
typedef struct ts_mlm_spec {
  int32_t pad_id, unk_id, cls_id, sep_id, mask_id; /* the tokenizer's special pieces */
  int32_t n_special;  /* the special ids above: 5, never selected nor drawn */
  size_t vocab_size;  /* the tokenizer's pieces; random replacements < it */
  double mask_prob;   /* fraction of text tokens selected: 0.15 */
  double replace_prob; /* of those, replaced by [MASK]: 0.8 */
  double random_prob;  /* of those, replaced by a random token: 0.1 (the rest unchanged) */
} ts_mlm_spec;

/* Reads DIR/meta.json of `tessera prepare --mlm`: "mlm": true and the
 * special ids (pad, unk, cls, sep, mask: five distinct ids below
 * vocab_size, 0-4 for prepare's own tokenizer, a model's own with
 * --tokenizer; n_special = 5; the line break is text), vocab_size; the
 * rates are BERT's. TS_ERR_FORMAT naming the file and
 * field ("data/kjv/meta.json: field \"mlm\" missing: expected true (a
 * masked-LM model needs data from prepare with `mlm`)"), TS_ERR_IO. */
ts_status ts_mlm_read_meta(const char *data_dir, ts_mlm_spec *out);

/* What DIR/meta.json, written by `tessera prepare`, says about the data. */
typedef struct ts_data_meta {
  int present;       /* 0: the folder has no meta.json (llm.c's shards, for one) */
  int mlm;           /* 1: masked-LM data (prepare with `mlm`) */
  int mlm_given;     /* 1: the field "mlm" is there (true or false) */
  size_t vocab_size; /* the tokenizer's pieces */
  ts_mlm_spec spec;  /* mlm only: as ts_mlm_read_meta reads it */
} ts_data_meta;

/* Parses meta.json's text (len bytes, host; `path` names it in messages)
 * into *out (present = 1): a JSON object whose "vocab_size" is an integer
 * 1 .. 2^31 - 1, whose "mlm", when present, is true or false, and, with
 * "mlm" true, whose special ids are as ts_mlm_read_meta requires.
 * TS_ERR_FORMAT naming the file and field in one line. */
ts_status ts_data_meta_parse(const char *text, size_t len, const char *path, ts_data_meta *out);

/* Reads DIR/meta.json into *out; a folder without one gives TS_OK and
 * present = 0. TS_ERR_IO (unreadable), TS_ERR_FORMAT (ts_data_meta_parse). */
ts_status ts_data_meta_read(const char *data_dir, ts_data_meta *out);

/* Masks one sequence in place: inputs (T) int32 host, holding the
 * original ids, are masked as described above from the stream of (seed,
 * sample); targets (T) int32 host are written (=). */
void ts_mlm_mask(const ts_mlm_spec *s, uint64_t seed, uint64_t sample, int32_t *inputs,
                 int32_t *targets, size_t T);

/* Host scratch (int32 elements) ts_mlm_fill needs for `count` sequences of T. */
static inline size_t ts_mlm_scratch_elems(size_t count, size_t T) { return 2 * count * (T - 2); }

/* Fills `count` masked sequences for the sample indices first_sample ...:
 * inputs and targets (count, T) int32 host; ld must be a loader of seq
 * T - 2 (T >= 3); scratch holds ts_mlm_scratch_elems(count, T) int32.
 * Errors: ts_loader_fill's. */
ts_status ts_mlm_fill(ts_loader *ld, const ts_mlm_spec *s, uint64_t seed, int32_t *scratch,
                      int32_t *inputs, int32_t *targets, uint64_t first_sample, size_t count,
                      size_t T);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_MLM_H */

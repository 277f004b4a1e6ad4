/*
 * sample.h — text from a model in one call, for `tessera generate` and
 * `train --sample-every` (tools/generate_main.c): the prompt encoded with
 * the model's tokenizer, ts_generate (models/generate.h), the prompt and
 * the new text printed as the tokens come. Host; one process.
 */
#ifndef TS_TOOLS_SAMPLE_H
#define TS_TOOLS_SAMPLE_H

#include <stdio.h>

#include "models/generate.h"
#include "tools/text_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_tool_sample_opts {
  const ts_text_tokenizer *tokenizer; /* encodes prompt, decodes the output; NULL with ids */
  const char *prompt;                 /* the text to continue, or NULL with prompt_ids */
  const int32_t *prompt_ids;          /* ids to continue instead (printed as ids), or NULL */
  size_t n_prompt_ids;
  size_t max_new;     /* tokens at most */
  float temperature;  /* ts_sampling */
  size_t top_k;
  float top_p;
  uint64_t seed;
  ts_device device;   /* ts_generator_opts */
  ts_dtype dtype;
  int recompute;
  int ignore_eos;     /* 0: stop after the tokenizer's end-of-sequence id */
  int stats;          /* 1: a line on stderr: tokens, seconds, tokens/s */
} ts_tool_sample_opts;

/* Writes the prompt and what m writes after it (weights through read,
 * user) to out, then a line break: text through o->tokenizer, or the new
 * ids separated by spaces for prompt_ids. TS_ERR_INVALID_ARGUMENT (the
 * prompt and max_new past the model's max_position_embeddings, naming
 * both), ts_generator_create's and ts_generate's errors. */
ts_status ts_tool_sample(const ts_model *m, ts_weights_fn read, void *user,
                         const ts_tool_sample_opts *o, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_SAMPLE_H */

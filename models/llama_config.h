/*
 * llama_config.h — a LLaMA-style model's hyper-parameters, read from a
 * Hugging Face config.json (the fields of transformers.LlamaConfig that
 * tessera uses). Part of the LLaMA family (models/llama.h); the engine and
 * tools see only models/model.h.
 *
 * Invariants after a successful load: every size is positive;
 * hidden_size % num_attention_heads == 0; the head size is even (RoPE);
 * num_attention_heads % num_key_value_heads == 0.
 */
#ifndef TS_MODELS_LLAMA_CONFIG_H
#define TS_MODELS_LLAMA_CONFIG_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_llama_config {
  char name[64];                 /* preset or file stem, for logs */
  char source[256];              /* the config.json it came from, for errors */
  size_t hidden_size;            /* C */
  size_t intermediate_size;      /* I, SwiGLU width */
  size_t num_hidden_layers;      /* L */
  size_t num_attention_heads;    /* NH */
  size_t num_key_value_heads;    /* NKV (GQA); defaults to NH when absent */
  size_t vocab_size;             /* V */
  size_t max_position_embeddings;/* largest T */
  float rms_norm_eps;            /* RMSNorm epsilon */
  float rope_theta;              /* RoPE base; 10000 when absent */
  int tie_word_embeddings;       /* 1: lm_head shares embed_tokens; default 0 */
} ts_llama_config;

/* What error messages call the config: its file, or its name if it was
 * built by hand. */
static inline const char *ts_llama_config_origin(const ts_llama_config *c) {
  return c->source[0] ? c->source : c->name;
}

/* Head size HS = C / NH. */
static inline size_t ts_llama_head_size(const ts_llama_config *c) {
  return c->hidden_size / c->num_attention_heads;
}

/* Checks the invariants above (sizes positive, eps and theta positive,
 * heads divide hidden_size, even head size, kv heads divide heads, at
 * most TS_MODEL_MAX_PARAMS parameters counting an untied head);
 * TS_ERR_FORMAT naming c->source (or c->name) and the field otherwise. */
ts_status ts_llama_config_validate(const ts_llama_config *c);

/* Reads a config.json already parsed into a cJSON object (json_object).
 * `name` is the model's name in logs, `source` names the file in error
 * messages. Required: hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, vocab_size, max_position_embeddings, rms_norm_eps.
 * Optional: num_key_value_heads (= NH), rope_theta (10000),
 * tie_word_embeddings (false), head_dim (must equal C / NH). hidden_act,
 * attention_bias, mlp_bias and pretraining_tp, when present, must be
 * "silu", false, false and 1, and rope_scaling null: other values describe
 * a model tessera does not compute. A missing or mistyped field, a value
 * found but not supported, or sizes that break the invariants above, give
 * TS_ERR_FORMAT with a one-line message naming the file, the field and the
 * expected value. */
ts_status ts_llama_config_from_json(const void *json_object, const char *name,
                                    const char *source, ts_llama_config *out);

/* The same from config.json text (the name is the file stem of source),
 * through ts_model_parse: TS_ERR_FORMAT also for another model_type. */
ts_status ts_llama_config_parse(const char *json, const char *source, ts_llama_config *out);

/* Parameter count Ψ (unpadded): embeddings, L blocks, final norm, and the
 * LM head unless tied. */
size_t ts_llama_num_params(const ts_llama_config *c);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_LLAMA_CONFIG_H */

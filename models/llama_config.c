/* llama_config.c — a Hugging Face LlamaConfig config.json -> ts_llama_config,
 * with validation. */
#include "models/llama_config.h"

#include "models/config_json.h"
#include "models/llama.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ts_status ts_llama_config_validate(const ts_llama_config *c) {
  const char *src = ts_llama_config_origin(c);
  const struct {
    const char *field;
    size_t value;
  } sizes[] = {{"hidden_size", c->hidden_size},
               {"intermediate_size", c->intermediate_size},
               {"num_hidden_layers", c->num_hidden_layers},
               {"num_attention_heads", c->num_attention_heads},
               {"num_key_value_heads", c->num_key_value_heads},
               {"vocab_size", c->vocab_size},
               {"max_position_embeddings", c->max_position_embeddings}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].value == 0)
      return ts_set_error(TS_ERR_FORMAT, "%s: field \"%s\" = 0: expected a positive integer", src,
                          sizes[i].field);
  if (!(c->rms_norm_eps > 0) || !(c->rope_theta > 0))
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: rms_norm_eps = %g, rope_theta = %g: expected positive numbers", src,
                        c->rms_norm_eps, c->rope_theta);
  if (c->hidden_size % c->num_attention_heads != 0)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"hidden_size\" = %zu: expected a multiple of "
                        "num_attention_heads = %zu",
                        src, c->hidden_size, c->num_attention_heads);
  if (ts_llama_head_size(c) % 2 != 0)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: head size hidden_size/num_attention_heads = %zu: expected an even "
                        "number (rotary embedding)",
                        src, ts_llama_head_size(c));
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"num_key_value_heads\" = %zu: expected a divisor of "
                        "num_attention_heads = %zu",
                        src, c->num_key_value_heads, c->num_attention_heads);
  /* Ψ in double (exact enough to compare): sizes whose products would wrap
   * size_t in the unit layouts, byte counts and plans are refused here. */
  double C = (double)c->hidden_size, I = (double)c->intermediate_size,
         V = (double)c->vocab_size, kv = (double)c->num_key_value_heads * (double)ts_llama_head_size(c);
  double psi = 2 * V * C + (double)c->num_hidden_layers * (2 * C * C + 2 * kv * C + 3 * I * C);
  return ts_cfg_check_param_count(src, psi, c->hidden_size, c->intermediate_size,
                                  c->num_hidden_layers, c->vocab_size);
}

/* A config of another family patched to say "llama" would train as a
 * LLaMA decoder: its own fields say otherwise. "architectures", when
 * given, must name LlamaForCausalLM alone; a field that changes the math
 * of a family tessera does not compute (Mistral's and Qwen's sliding
 * window, BERT's token types, absolute positions and LayerNorm, dropout)
 * must be absent, null, false or 0. TS_ERR_FORMAT naming the field. */
static ts_status check_foreign(const cJSON *root, const char *src) {
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
  if (arch) {
    int ok = cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1;
    const cJSON *a = ok ? cJSON_GetArrayItem(arch, 0) : NULL;
    if (!ok || !cJSON_IsString(a) || strcmp(a->valuestring, "LlamaForCausalLM") != 0) {
      char *found = cJSON_PrintUnformatted(arch);
      ts_status st = ts_set_error(TS_ERR_FORMAT,
                                  "%s: field \"architectures\" = %.60s: expected "
                                  "[\"LlamaForCausalLM\"] (tessera computes LLaMA decoders)",
                                  src, found ? found : "?");
      cJSON_free(found);
      return st;
    }
  }
  static const char *const foreign[] = {
      "sliding_window", "use_sliding_window", "max_window_layers", "type_vocab_size",
      "position_embedding_type", "layer_norm_eps", "hidden_dropout_prob",
      "attention_probs_dropout_prob", "attention_dropout", "qkv_bias", "partial_rotary_factor"};
  for (size_t k = 0; k < sizeof foreign / sizeof *foreign; k++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, foreign[k]);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0))
      continue;
    char *found = cJSON_PrintUnformatted(v);
    ts_status st = ts_set_error(TS_ERR_FORMAT,
                                "%s: field \"%s\" = %.40s: expected it absent, null, false or 0 "
                                "(tessera's LLaMA has no such feature; the config is of another "
                                "model family)",
                                src, foreign[k], found ? found : "?");
    cJSON_free(found);
    return st;
  }
  return TS_OK;
}

ts_status ts_llama_config_from_json(const void *json_object, const char *name,
                                    const char *source, ts_llama_config *out) {
  const cJSON *root = json_object;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", name);
  snprintf(out->source, sizeof out->source, "%s", source);
  ts_status st = TS_OK;
  ts_llama_config *c = out;
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "hidden_size", 1, 0, &c->hidden_size), st, done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "intermediate_size", 1, 0, &c->intermediate_size), st,
                done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "num_hidden_layers", 1, 0, &c->num_hidden_layers), st,
                done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "num_attention_heads", 1, 0, &c->num_attention_heads), st,
                done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "num_key_value_heads", 0, c->num_attention_heads,
                         &c->num_key_value_heads),
                st, done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "vocab_size", 1, 0, &c->vocab_size), st, done);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "max_position_embeddings", 1, 0,
                         &c->max_position_embeddings),
                st, done);
  TS_CHECK_GOTO(ts_cfg_get_float(root, source, "rms_norm_eps", 1, 0, &c->rms_norm_eps), st, done);
  /* transformers >= 5 nests the RoPE settings in "rope_parameters". */
  const cJSON *rope = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  float theta = 10000.0f;
  if (cJSON_IsObject(rope)) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rope, "rope_type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)) {
      st = ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"rope_parameters.rope_type\": expected \"default\" (RoPE "
                        "scaling is not supported)",
                        source);
      goto done;
    }
    TS_CHECK_GOTO(ts_cfg_get_float(rope, source, "rope_theta", 0, theta, &theta), st, done);
  }
  TS_CHECK_GOTO(ts_cfg_get_float(root, source, "rope_theta", 0, theta, &c->rope_theta), st, done);
  const cJSON *scaling = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (scaling && !cJSON_IsNull(scaling)) {
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: field \"rope_scaling\": expected null (RoPE scaling is not supported)",
                      source);
    goto done;
  }
  TS_CHECK_GOTO(check_foreign(root, source), st, done);
  TS_CHECK_GOTO(ts_cfg_expect_value(root, source, "hidden_act", "\"silu\""), st, done);
  TS_CHECK_GOTO(ts_cfg_expect_value(root, source, "attention_bias", "false"), st, done);
  TS_CHECK_GOTO(ts_cfg_expect_value(root, source, "mlp_bias", "false"), st, done);
  TS_CHECK_GOTO(ts_cfg_expect_value(root, source, "pretraining_tp", "1"), st, done);
  const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
  if (tie && !cJSON_IsBool(tie)) {
    st = ts_set_error(TS_ERR_FORMAT, "%s: field \"tie_word_embeddings\": expected true or false",
                      source);
    goto done;
  }
  c->tie_word_embeddings = tie ? cJSON_IsTrue(tie) : 0;
  TS_CHECK_GOTO(ts_llama_config_validate(c), st, done);
  size_t head_dim = ts_llama_head_size(c);
  TS_CHECK_GOTO(ts_cfg_get_size(root, source, "head_dim", 0, head_dim, &head_dim), st, done);
  if (head_dim != ts_llama_head_size(c)) {
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: field \"head_dim\" = %zu: expected hidden_size / num_attention_heads "
                      "= %zu",
                      source, head_dim, ts_llama_head_size(c));
    goto done;
  }
done:
  return st;
}

ts_status ts_llama_config_parse(const char *json, const char *source, ts_llama_config *out) {
  memset(out, 0, sizeof *out);
  ts_model m;
  TS_CHECK(ts_model_parse(json, source, &m));
  ts_status st = TS_OK;
  if (m.family == &ts_llama_family)
    *out = *ts_llama_config_of(&m);
  else
    st = ts_set_error(TS_ERR_FORMAT, "%s: field \"model_type\": expected \"llama\"", source);
  ts_model_free(&m);
  return st;
}

size_t ts_llama_num_params(const ts_llama_config *c) {
  size_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  size_t HS = ts_llama_head_size(c);
  size_t q = c->num_attention_heads * HS, kv = c->num_key_value_heads * HS;
  size_t block = C + q * C + 2 * kv * C + C * q + C + 3 * I * C;
  return V * C + c->num_hidden_layers * block + C + (c->tie_word_embeddings ? 0 : V * C);
}

/* bert_config.c — a Hugging Face BertConfig config.json -> ts_bert_config,
 * with validation (the field rules are in models/bert.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/bert.h"
#include "models/bert_internal.h"
#include "models/config_json.h"

/* A field that must be a number equal to 0 (tessera has no dropout). */
static ts_status expect_zero(const cJSON *root, const char *src, const char *field) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
  if (!it)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: missing field \"%s\": expected 0.0 (Hugging Face's default is 0.1; "
                        "tessera has no dropout)",
                        src, field);
  if (!cJSON_IsNumber(it) || it->valuedouble != 0)
    return ts_cfg_field_error(it, src, field, "0.0 (tessera has no dropout)");
  return TS_OK;
}

/* An optional token id field: absent or null gives dflt; else an integer
 * in [0, vocab). */
static ts_status get_token_id(const cJSON *root, const char *src, const char *field,
                              int32_t dflt, size_t vocab, int32_t *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
  *out = dflt;
  if (!it || cJSON_IsNull(it)) return TS_OK;
  double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
  if (!cJSON_IsNumber(it) || v < 0 || v != floor(v) || v >= (double)vocab) {
    char want[64];
    snprintf(want, sizeof want, "a token id in [0, vocab_size = %zu)", vocab);
    return ts_cfg_field_error(it, src, field, want);
  }
  *out = (int32_t)v;
  return TS_OK;
}

/* "architectures", when given, must be ["BertForMaskedLM"]. */
static ts_status check_architectures(const cJSON *root, const char *src) {
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
  if (!arch || cJSON_IsNull(arch)) return TS_OK;
  int ok = cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1;
  const cJSON *a = ok ? cJSON_GetArrayItem(arch, 0) : NULL;
  if (ok && cJSON_IsString(a) && strcmp(a->valuestring, "BertForMaskedLM") == 0) return TS_OK;
  return ts_cfg_field_error(arch, src, "architectures",
                            "[\"BertForMaskedLM\"] (tessera computes BERT's masked LM)");
}

ts_status ts_bert_config_from_json(const void *json_object, const char *src, ts_bert_config *c) {
  const cJSON *root = json_object;
  memset(c, 0, sizeof *c);
  static const struct {
    const char *field;
    size_t offset;
  } sizes[] = {
      {"hidden_size", offsetof(ts_bert_config, hidden_size)},
      {"intermediate_size", offsetof(ts_bert_config, intermediate_size)},
      {"num_hidden_layers", offsetof(ts_bert_config, num_hidden_layers)},
      {"num_attention_heads", offsetof(ts_bert_config, num_attention_heads)},
      {"vocab_size", offsetof(ts_bert_config, vocab_size)},
      {"max_position_embeddings", offsetof(ts_bert_config, max_position_embeddings)},
      {"type_vocab_size", offsetof(ts_bert_config, type_vocab_size)},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    TS_CHECK(ts_cfg_get_size(root, src, sizes[i].field, 1, 0,
                             (size_t *)((char *)c + sizes[i].offset)));
  TS_CHECK(ts_cfg_get_float(root, src, "layer_norm_eps", 1, 0, &c->layer_norm_eps));
  float range = 0.02f;
  TS_CHECK(ts_cfg_get_float(root, src, "initializer_range", 0, range, &range));
  c->initializer_range = range;
  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (!act)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: missing field \"hidden_act\": expected \"gelu\" or \"gelu_new\"", src);
  if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu") == 0)
    c->act = TS_GELU_ERF;
  else if (cJSON_IsString(act) && (strcmp(act->valuestring, "gelu_new") == 0 ||
                                   strcmp(act->valuestring, "gelu_pytorch_tanh") == 0))
    c->act = TS_GELU_TANH;
  else
    return ts_cfg_field_error(act, src, "hidden_act",
                              "\"gelu\", \"gelu_new\" or \"gelu_pytorch_tanh\"");
  TS_CHECK(expect_zero(root, src, "hidden_dropout_prob"));
  TS_CHECK(expect_zero(root, src, "attention_probs_dropout_prob"));
  TS_CHECK(ts_cfg_expect_value(root, src, "position_embedding_type", "\"absolute\""));
  TS_CHECK(ts_cfg_expect_value(root, src, "is_decoder", "false"));
  TS_CHECK(ts_cfg_expect_value(root, src, "add_cross_attention", "false"));
  TS_CHECK(check_architectures(root, src));
  const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
  if (tie && !cJSON_IsBool(tie))
    return ts_cfg_field_error(tie, src, "tie_word_embeddings", "true or false");
  c->tie_word_embeddings = tie ? cJSON_IsTrue(tie) : 1;
  TS_CHECK(get_token_id(root, src, "pad_token_id", 0, c->vocab_size, &c->pad_token_id));
  TS_CHECK(get_token_id(root, src, "sep_token_id", -1, c->vocab_size, &c->sep_token_id));
  if (c->hidden_size % c->num_attention_heads != 0)
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: field \"hidden_size\" = %zu: expected a multiple of "
                        "num_attention_heads = %zu",
                        src, c->hidden_size, c->num_attention_heads);
  if (c->vocab_size > INT32_MAX || c->type_vocab_size > INT32_MAX)
    return ts_set_error(TS_ERR_FORMAT, "%s: vocab_size %zu, type_vocab_size %zu: expected at "
                        "most 2^31 - 1 (int32 ids)", src, c->vocab_size, c->type_vocab_size);
  double C = (double)c->hidden_size, I = (double)c->intermediate_size;
  double psi = (double)(c->vocab_size + c->max_position_embeddings + c->type_vocab_size) * C +
               (double)c->num_hidden_layers * (4 * C * C + 2 * I * C);
  return ts_cfg_check_param_count(src, psi, c->hidden_size, c->intermediate_size,
                                  c->num_hidden_layers, c->vocab_size);
}

size_t ts_bert_num_params(const ts_bert_config *c) {
  size_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  size_t emb = (V + c->max_position_embeddings + c->type_vocab_size) * C + 2 * C;
  size_t block = 4 * (C * C + C) + 2 * C + (I * C + I) + (C * I + C) + 2 * C;
  size_t head = C * C + C + 2 * C + V + (c->tie_word_embeddings ? 0 : V * C);
  return emb + c->num_hidden_layers * block + head;
}

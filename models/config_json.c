/* config_json.c — the field readers of config_json.h. */
#include "models/config_json.h"

#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

ts_status ts_cfg_field_error(const cJSON *it, const char *src, const char *field,
                             const char *want) {
  char *found = cJSON_PrintUnformatted(it);
  ts_set_error(TS_ERR_FORMAT, "%s: field \"%s\" = %.40s: expected %s", src, field,
               found ? found : "?", want);
  cJSON_free(found);
  return TS_ERR_FORMAT;
}

ts_status ts_cfg_get_size(const cJSON *root, const char *src, const char *field, int required,
                          size_t dflt, size_t *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
  if (!it) {
    if (required)
      return ts_set_error(TS_ERR_FORMAT, "%s: missing field \"%s\": expected a positive integer",
                          src, field);
    *out = dflt;
    return TS_OK;
  }
  double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
  if (!cJSON_IsNumber(it) || v < 1 || v != floor(v) || v > 1e15)
    return ts_cfg_field_error(it, src, field, "a positive integer");
  *out = (size_t)v;
  return TS_OK;
}

ts_status ts_cfg_get_float(const cJSON *root, const char *src, const char *field, int required,
                           float dflt, float *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
  if (!it) {
    if (required)
      return ts_set_error(TS_ERR_FORMAT, "%s: missing field \"%s\": expected a positive number",
                          src, field);
    *out = dflt;
    return TS_OK;
  }
  if (!cJSON_IsNumber(it) || !(it->valuedouble > 0))
    return ts_cfg_field_error(it, src, field, "a positive number");
  *out = (float)it->valuedouble;
  return TS_OK;
}

ts_status ts_cfg_expect_value(const cJSON *root, const char *src, const char *field,
                              const char *want) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, field);
  if (!it || cJSON_IsNull(it)) return TS_OK;
  char *found = cJSON_PrintUnformatted(it);
  int ok = found && strcmp(found, want) == 0;
  cJSON_free(found);
  if (ok) return TS_OK;
  char expected[64];
  snprintf(expected, sizeof expected, "%s (the only value tessera supports)", want);
  return ts_cfg_field_error(it, src, field, expected);
}

ts_status ts_cfg_check_param_count(const char *src, double psi, size_t hidden_size,
                                   size_t intermediate_size, size_t num_hidden_layers,
                                   size_t vocab_size) {
  if (num_hidden_layers > TS_MODEL_MAX_LAYERS)
    return ts_set_error(TS_ERR_FORMAT, "%s: num_hidden_layers %zu: expected at most %d", src,
                        num_hidden_layers, TS_MODEL_MAX_LAYERS);
  if (psi <= TS_MODEL_MAX_PARAMS) return TS_OK;
  return ts_set_error(TS_ERR_FORMAT,
                      "%s: hidden_size %zu, intermediate_size %zu, num_hidden_layers %zu, "
                      "vocab_size %zu give %.3g parameters: expected at most 2^48",
                      src, hidden_size, intermediate_size, num_hidden_layers, vocab_size, psi);
}

void ts_cfg_stem(const char *path, char *out, size_t cap) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  snprintf(out, cap, "%s", base);
  char *dot = strrchr(out, '.');
  if (dot && strcmp(dot, ".json") == 0) *dot = '\0';
}

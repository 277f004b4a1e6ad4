/*
 * config_json.h — private to models/: reading the fields of a Hugging Face
 * config.json (a cJSON object) with one error format for every family:
 * "SRC: field "F" = <value found>: expected WANT" or "SRC: missing field
 * "F": expected ...", all TS_ERR_FORMAT.
 */
#ifndef TS_MODELS_CONFIG_JSON_H
#define TS_MODELS_CONFIG_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records "SRC: field "F" = <value of it>: expected WANT"; returns
 * TS_ERR_FORMAT. */
ts_status ts_cfg_field_error(const cJSON *it, const char *src, const char *field,
                             const char *want);

/* A positive integer field (at most 1e15); absent: an error if required,
 * else dflt. */
ts_status ts_cfg_get_size(const cJSON *obj, const char *src, const char *field, int required,
                          size_t dflt, size_t *out);

/* A positive number field; absent: an error if required, else dflt. */
ts_status ts_cfg_get_float(const cJSON *obj, const char *src, const char *field, int required,
                           float dflt, float *out);

/* Fails unless optional field `field` is absent, null, or equal to the JSON
 * text `want` (e.g. "\"silu\"", "false", "1"): the model math supports only
 * that value. */
ts_status ts_cfg_expect_value(const cJSON *obj, const char *src, const char *field,
                              const char *want);

/* TS_ERR_FORMAT ("SRC: num_hidden_layers L: expected at most 65536") when
 * L exceeds TS_MODEL_MAX_LAYERS, or ("SRC: hidden_size H, intermediate_size
 * I, num_hidden_layers L, vocab_size V give P parameters: expected at most
 * 2^48") when psi, a family's parameter count in double, exceeds
 * TS_MODEL_MAX_PARAMS; TS_OK otherwise. */
ts_status ts_cfg_check_param_count(const char *src, double psi, size_t hidden_size,
                                   size_t intermediate_size, size_t num_hidden_layers,
                                   size_t vocab_size);

/* The file stem of path ("a/b/llama-tiny.json" -> "llama-tiny"): a
 * model's name in logs. */
void ts_cfg_stem(const char *path, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_CONFIG_JSON_H */

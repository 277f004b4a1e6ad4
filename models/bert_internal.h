/* bert_internal.h — private to the BERT family's files (models/bert*.c). */
#ifndef TS_MODELS_BERT_INTERNAL_H
#define TS_MODELS_BERT_INTERNAL_H

#include "models/bert.h"

/* Reads a config.json parsed into a cJSON object (rules in bert.h);
 * `src` names the file in messages. TS_ERR_FORMAT. */
ts_status ts_bert_config_from_json(const void *json_object, const char *src, ts_bert_config *c);

/* Parameter count Ψ (unpadded; a tied decoder counted once). */
size_t ts_bert_num_params(const ts_bert_config *c);

#endif /* TS_MODELS_BERT_INTERNAL_H */

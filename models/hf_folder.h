/*
 * hf_folder.h — a Hugging Face model folder as transformers'
 * save_pretrained writes it and from_pretrained reads it: config.json plus
 * the weights in model.safetensors, or sharded as model-0000K-of-0000N.
 * safetensors with model.safetensors.index.json ({"metadata":
 * {"total_size": bytes}, "weight_map": {name: file}}). tessera imports
 * such a folder (train --init-from, --model DIR) and exports one (tessera
 * export). Weights are F32, BF16 or F16; values pass through fp32 (bf16 and
 * fp16 widen exactly; narrowing rounds to nearest even).
 *
 * Tied embeddings: a tied model has no lm_head.weight (transformers does not
 * save it); an import ignores one if present, and the rotary caches older
 * checkpoints carry (…rotary_emb.inv_freq). Any other tensor the model does
 * not have is refused: the folder is of another model.
 */
#ifndef TS_MODELS_HF_FOLDER_H
#define TS_MODELS_HF_FOLDER_H

#include <stddef.h>

#include "base/base.h"
#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* transformers' default max_shard_size: past it, the weights are sharded. */
#define TS_HF_MAX_SHARD_BYTES ((size_t)5000000000)

typedef struct ts_hf_folder ts_hf_folder; /* an opened folder; owns its shards */

/* Whether dir is a folder with a config.json (a Hugging Face folder or a
 * tessera checkpoint). */
int ts_hf_is_folder(const char *dir);

/* Opens the weights of folder dir: model.safetensors.index.json and every
 * shard it names, else model.safetensors. TS_ERR_IO ("DIR: no
 * model.safetensors or model.safetensors.index.json"), TS_ERR_FORMAT (a
 * malformed index, a shard's errors, a tensor in two shards). */
ts_status ts_hf_folder_open(ts_hf_folder **out, const char *dir);

/* Checks the weights against m: every tensor of m with its shape and a
 * dtype F32, BF16 or F16, and no tensor m lacks (but the two above); a
 * tied model's copy of its head (ts_model_family.tied_copy, e.g.
 * lm_head.weight; tied_copy2, BERT's cls.predictions.decoder.bias) of the
 * same shape and equal, value for value, to the tensor it copies.
 * TS_ERR_FORMAT naming the file, the tensor and what differs. */
ts_status ts_hf_folder_check(const ts_hf_folder *f, const ts_model *m);

/* Tensor `name` (numel elements) as fp32 host values into dst.
 * TS_ERR_INVALID_ARGUMENT (absent, or another size). */
ts_status ts_hf_folder_read(const ts_hf_folder *f, const char *name, float *dst, size_t numel);

/* Frees f; NULL is a no-op. */
void ts_hf_folder_close(ts_hf_folder *f);

/* Fills dst (numel fp32 host values) with tensor `name`; the exporter's
 * source. */
typedef ts_status (*ts_hf_tensor_fn)(void *user, const char *name, float *dst, size_t numel);

/* Writes model m as a Hugging Face folder out (created; files it holds of
 * the same names are replaced, each atomically; config.json last, so a
 * folder whose config.json is new is whole): the weights in dtype, taken
 * from get, in layout order, one file while their bytes fit
 * max_shard_bytes (0: TS_HF_MAX_SHARD_BYTES), else shards and the index;
 * config.json is config_text with "torch_dtype" set to dtype's name in
 * transformers' spelling ("float32", "bfloat16", "float16"), and
 * "model_type" and "architectures" set to the family's where config_text
 * lacks them (transformers' AutoConfig needs the first). Errors:
 * TS_ERR_IO naming the file, TS_ERR_FORMAT (config_text not a JSON
 * object), get's. */
ts_status ts_hf_export(const char *out, const ts_model *m, const char *config_text,
                       ts_dtype dtype, size_t max_shard_bytes, ts_hf_tensor_fn get, void *user);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_HF_FOLDER_H */

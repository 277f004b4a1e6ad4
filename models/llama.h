/*
 * llama.h — the LLaMA family behind models/model.h: a decoder whose unit 0
 * is the token embedding, units 1..L the transformer blocks (RMSNorm -> GQA
 * attention with RoPE -> residual -> RMSNorm -> SwiGLU -> residual), unit
 * L+1 the final RMSNorm and the LM head (tied to the embedding when
 * tie_word_embeddings: the head borrows unit 0's tensor 0). The math
 * matches transformers' LlamaForCausalLM (checked by tests/hf_parity).
 *
 * The engine and the tools never include this header; models/model.c lists
 * ts_llama_family, and tests of the family build models from hand-made
 * configs through ts_llama_model_init.
 */
#ifndef TS_MODELS_LLAMA_H
#define TS_MODELS_LLAMA_H

#include <stddef.h>

#include "models/llama_config.h"
#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The family: model_type "llama". */
extern const ts_model_family ts_llama_family;

/* Builds the model of cfg (copied) into m, zeroed or filled by
 * ts_model_parse up to the family's init: its units, sizes and Ψ.
 * TS_ERR_FORMAT when cfg breaks the invariants of ts_llama_config_validate,
 * TS_ERR_OUT_OF_MEMORY. Free with ts_model_free. */
ts_status ts_llama_model_init(ts_model *m, const ts_llama_config *cfg);

/* The config of a LLaMA model (asserted to be one). */
const ts_llama_config *ts_llama_config_of(const ts_model *m);


#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_LLAMA_H */

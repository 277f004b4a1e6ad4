/*
 * bert.h — the BERT family behind models/model.h: an encoder trained as a
 * masked language model, matching transformers' BertForMaskedLM
 * (modeling_bert.py; Devlin et al. 2019) in fp32 (tests/bert_parity_test).
 *
 * Units: 0 the embeddings (word + token type + learned absolute position,
 * then LayerNorm); 1..L the post-LayerNorm blocks (bidirectional attention
 * with biases -> LayerNorm(dense(att) + x) -> dense -> GELU -> dense ->
 * LayerNorm(. + h)); L+1 the MLM head (dense -> GELU -> LayerNorm -> decoder
 * tied to the word embeddings, plus its own bias -> cross-entropy over the
 * masked positions, -100 ignored).
 *
 * What Hugging Face takes as separate inputs, tessera derives from the ids
 * (every unit gets them, ts_unit_args.tokens): the attention mask is
 * ids != pad_token_id (the tokenizer's attention_mask), the token type of a
 * position is the number of sep_token_id before it, capped at
 * type_vocab_size - 1 (the tokenizer's sentence-pair encoding), and the
 * positions are 0..T-1. As nn.Embedding(padding_idx=pad_token_id) does, the
 * lookup gives the [PAD] row no gradient (the tied decoder still does).
 *
 * The engine and the tools never include this header; models/model.c lists
 * ts_bert_family.
 */
#ifndef TS_MODELS_BERT_H
#define TS_MODELS_BERT_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A BERT config.json's fields that tessera computes (transformers.BertConfig). */
typedef struct ts_bert_config {
  size_t hidden_size;             /* C */
  size_t intermediate_size;       /* I */
  size_t num_hidden_layers;       /* L */
  size_t num_attention_heads;     /* NH; HS = C / NH */
  size_t vocab_size;              /* V */
  size_t max_position_embeddings; /* largest T */
  size_t type_vocab_size;         /* token types */
  float layer_norm_eps;           /* every LayerNorm's epsilon */
  double initializer_range;       /* std of the matrices' initial values (0.02) */
  ts_gelu_kind act;               /* hidden_act: "gelu" erf, "gelu_new"/"gelu_pytorch_tanh" tanh */
  int tie_word_embeddings;        /* 1 (default): the decoder is the word embeddings */
  int32_t pad_token_id;           /* default 0 */
  int32_t sep_token_id;           /* absent: -1 (every token type 0) */
} ts_bert_config;

/* The family: model_type "bert". Its init reads a config.json: required
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
 * vocab_size, max_position_embeddings, type_vocab_size, layer_norm_eps,
 * hidden_act ("gelu", "gelu_new", "gelu_pytorch_tanh"),
 * hidden_dropout_prob and attention_probs_dropout_prob (both 0: tessera
 * has no dropout); optional pad_token_id (0), sep_token_id (none),
 * initializer_range (0.02), tie_word_embeddings (true),
 * position_embedding_type ("absolute" only), architectures
 * (["BertForMaskedLM"] only), is_decoder and add_cross_attention (false
 * only), classifier_dropout (ignored: no classifier). Anything else found
 * wrong is TS_ERR_FORMAT naming the file, the field and the expected value. */
extern const ts_model_family ts_bert_family;

/* The config of a BERT model (asserted to be one). */
const ts_bert_config *ts_bert_config_of(const ts_model *m);

#ifdef __cplusplus
}
#endif

#endif /* TS_MODELS_BERT_H */

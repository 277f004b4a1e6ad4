/*
 * text_tokenizer.h — text to ids and back with the tokenizer a model was
 * trained with, for `tessera generate` and `train --sample-every`: a folder
 * `tessera prepare` wrote (DIR/meta.json and DIR/tokenizer.model, either
 * tokenizer it makes) or a Hugging Face model folder (tokenizer.model and
 * its tokenizer_config.json). A prompt is encoded as prepare encodes a
 * document of the shards, so the model sees what it was trained on:
 *   - prepare's own tokenizer ("sentencepiece-bpe"): line by line, each
 *     line break its newline id, no BOS;
 *   - a model's SentencePiece tokenizer: transformers 5's encoding
 *     (tools/hf_tokenizer.h), BOS as configured, never EOS (a prompt goes
 *     on);
 *   - a model's tokenizer.json (no tokenizer.model beside it): Hugging
 *     Face's tokenizers in a Python helper (tools/py_helper.h), encoded
 *     with its post-processor's tokens as transformers' tokenizer(prompt),
 *     decoded skipping special tokens; its special ids by the names
 *     tokenizer_config.json gives (prepared data: meta.json's).
 * Host; C++ inside (SentencePiece), this interface C.
 */
#ifndef TS_TOOLS_TEXT_TOKENIZER_H
#define TS_TOOLS_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
#include <sentencepiece_processor.h>

#include <string>
#include <vector>

namespace ts_prepare {
// Encodes text line by line with sp; each '\n' becomes `newline` (the
// shards of prepare's own tokenizer). TS_ERR_INTERNAL naming `what` and
// the byte where SentencePiece failed.
ts_status EncodeText(const sentencepiece::SentencePieceProcessor &sp, const std::string &text,
                     const char *what, uint32_t newline, std::vector<uint32_t> *out);
}  // namespace ts_prepare

extern "C" {
#endif

typedef struct ts_text_tokenizer ts_text_tokenizer;

/* Opens DIR's tokenizer: DIR/meta.json of `tessera prepare` when present,
 * else a Hugging Face folder's tokenizer.model, else its tokenizer.json. TS_ERR_INVALID_ARGUMENT
 * naming the file and field (no tokenizer.model, a meta.json whose
 * "tokenizer" is neither kind, hf_tokenizer.h's refusals), TS_ERR_IO. */
ts_status ts_text_tokenizer_open(ts_text_tokenizer **out, const char *dir);

/* text (UTF-8, NUL-terminated) as ids into *ids (malloc'd, free() them),
 * *n of them. TS_ERR_INVALID_ARGUMENT (an empty encoding), TS_ERR_INTERNAL
 * (SentencePiece's failure), the helper's errors. */
ts_status ts_text_tokenizer_encode(const ts_text_tokenizer *t, const char *text, int32_t **ids,
                                   size_t *n);

/* ids (n) as text, malloc'd and NUL-terminated (free() it); control
 * pieces (BOS, EOS) print as nothing, the newline id as "\n". NULL when
 * out of memory or an id is not in the vocabulary. */
char *ts_text_tokenizer_decode(const ts_text_tokenizer *t, const int32_t *ids, size_t n);

/* The id of special token `name` ("mask", "cls", "sep", "pad", "unk",
 * "bos", "eos", "newline") as meta.json's special_ids or the model's
 * tokenizer says, or -1. */
int32_t ts_text_tokenizer_special(const ts_text_tokenizer *t, const char *name);

/* text with every "[MASK]" (literally) as the mask id, framed [CLS] ...
 * [SEP] (prepare --mlm's tokenizer, or a BERT folder's tokenizer.json: BERT's input), into *ids
 * (malloc'd) and the positions of the masks into *masks (malloc'd), *n and
 * *n_masks of them. TS_ERR_INVALID_ARGUMENT (not a masked-LM tokenizer, no
 * "[MASK]" in text), TS_ERR_INTERNAL. */
ts_status ts_text_tokenizer_encode_masked(const ts_text_tokenizer *t, const char *text,
                                          int32_t **ids, size_t *n, size_t **masks,
                                          size_t *n_masks);

/* Its vocabulary size, and its end-of-sequence id (-1: none that ends a
 * document: prepare's own tokenizer never writes one). */
size_t ts_text_tokenizer_vocab(const ts_text_tokenizer *t);
int32_t ts_text_tokenizer_eos(const ts_text_tokenizer *t);

/* Frees t; NULL is a no-op. */
void ts_text_tokenizer_free(ts_text_tokenizer *t);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_TEXT_TOKENIZER_H */

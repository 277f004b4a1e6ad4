/*
 * prepare.h — `tessera prepare`: turns a UTF-8 text corpus into a trained
 * SentencePiece tokenizer and two token shards, or into token shards in a
 * Hugging Face model's own tokenizer.
 *
 *   tessera prepare --text PATH --vocab-size N --out DIR [--val-every K] [--seed S]
 *   tessera prepare --text PATH --tokenizer HF_DIR --out DIR [--val-every K]
 *
 * writes DIR/tokenizer.model, DIR/train.bin, DIR/val.bin (engine/token_file.h
 * shards) and DIR/meta.json. The implementation is C++ (SentencePiece is a
 * C++ library); this interface is C.
 *
 * Split. The text is cut into sections: a paragraph is a run of non-blank
 * lines with the blank lines before it, and a heading (a paragraph of one
 * line shorter than 80 bytes, such as "Genesis 3") is joined to the paragraph
 * after it, so in the King James Bible from `bible -l0` a section is one
 * chapter. Every K-th section (sections K-1, 2K-1, ... counting from 0) is
 * validation, the rest training; the concatenation of all sections is the
 * text. The tokenizer is trained on the training part only.
 *
 * Tokenizer. SentencePiece BPE, vocab_size N, byte_fallback (so any UTF-8
 * text encodes without <unk>), character_coverage 1.0, split_digits, the
 * identity normalization with whitespace kept as is and no dummy prefix, so
 * decoding the tokens gives back the text byte for byte. Ids: 0 <unk>,
 * 1 <s>, 2 </s> (reserved; the shards contain neither), 3 "\n" (a
 * user-defined piece: text is encoded line by line and each line break is
 * this token), 4..259 the byte pieces <0x00>..<0xFF>, then the merges.
 * Training reads every line (up to 2 million lines; beyond that SentencePiece
 * samples lines with --seed); it is deterministic for a given text and seed.
 *
 * Masked LM (--mlm, BERT's data: engine/mlm.h builds the batches): the
 * tokenizer's special pieces are 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP],
 * 4 [MASK] (control pieces: text never encodes to them), 5 "\n", then the
 * byte pieces 6..261 and the merges; meta.json says "mlm": true and lists
 * them in special_ids. The shards hold the text's tokens alone (no
 * [CLS]/[SEP]); the loader frames each window at training time.
 *
 * Inputs (--text PATH). A UTF-8 text file is cut into sections as above;
 * a JSON Lines file (name ending .jsonl, .ndjson or .json, any case) gives
 * one section per record, the string in its field text_field (records whose
 * text is empty and blank lines are skipped; a line with more after its
 * object, a null text or one with \u0000 is refused); a folder gives the
 * sections of each of its files in name order (hidden files skipped; a
 * folder inside it is refused); a Parquet file (.parquet, any case) gives one
 * section per row, the string in its column text_field (read by Apache
 * Arrow's pyarrow in a Python helper, tools/py_helper.h; empty texts
 * skipped, a null, a non-string column or a NUL refused). Every K-th section of the
 * whole corpus is validation. When a tokenizer is trained, a record's text
 * is followed by a line break in the training text.
 *
 * A Hugging Face tokenizer (--tokenizer HF_DIR). HF_DIR/tokenizer.model
 * (SentencePiece: LLaMA-2, TinyLlama, Mistral) encodes each section whole,
 * as transformers' LlamaTokenizer and the fast tokenizer it converts from
 * that file do (tests/hf_tokenizer: the same ids on a multilingual sample),
 * with the BOS before and the EOS after it as HF_DIR/tokenizer_config.json's
 * add_bos_token / add_eos_token say (absent or null: neither, transformers
 * 5's defaults; bos_token / eos_token name the pieces). A leading space (or
 * "▁") is the model's dummy prefix, as transformers 5's Metaspace has it; a
 * section that spells a special token ("<s>") encodes it as text, where
 * transformers would give the control token. A model whose settings
 * transformers 5 does not follow is refused: one that normalizes (NFKC,
 * extra whitespace removed) or cannot spell every text (no byte fallback),
 * one without a dummy prefix, a configuration with add_prefix_space false. The
 * file is copied into DIR; the shards hold uint32 tokens when it has more
 * than 65 535 pieces. The corpus streams through: JSON Lines a line at a
 * time, a text file whole, sections gathered into batches of batch_bytes of
 * text, each batch encoded on the machine's threads and appended to the
 * shards (engine/token_file.h's writer), so memory is bounded by a batch
 * and the largest text file; the shards are the same for any batch size and
 * thread count. A folder with tokenizer.json and no tokenizer.model
 * (byte-level BPE as GPT-2's and LLaMA-3's, WordPiece as BERT's) encodes
 * through Hugging Face's tokenizers library in a Python helper
 * (tools/py_helper.h: encode_batch with the special tokens its
 * post-processor adds, no truncation or padding, as transformers'
 * tokenizer call), tokenizer.json copied into DIR, meta.json's tokenizer
 * "tokenizers"; a folder with both uses tokenizer.model, as above.
 *
 * Output is all or nothing: the files are written into a temporary
 * directory beside DIR and renamed into place only after all four succeeded.
 */
#ifndef TS_TOOLS_PREPARE_H
#define TS_TOOLS_PREPARE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default K of --val-every: in the King James Bible every 30th of the 1189
 * chapters (39 chapters, about 3% of the text) is held out. */
#define TS_PREPARE_DEFAULT_VAL_EVERY 30
/* Special pieces before the byte pieces: <unk>, <s>, </s>, "\n". */
#define TS_PREPARE_NUM_SPECIAL 4
/* Token id of the line break. */
#define TS_PREPARE_NEWLINE_ID 3
/* With --mlm: [PAD] [UNK] [CLS] [SEP] [MASK] "\n" before the byte pieces. */
#define TS_PREPARE_MLM_NUM_SPECIAL 6
#define TS_PREPARE_MLM_NEWLINE_ID 5

/* What to prepare (plain descriptor; strings are borrowed). */
typedef struct ts_prepare_opts {
  const char *text_path;  /* the corpus: a UTF-8 text file, JSON Lines, or a folder of them */
  const char *out_dir;    /* output directory; created or its four files replaced */
  size_t vocab_size;      /* SentencePiece pieces, incl. 4 special + 256 bytes */
  size_t val_every;       /* K: every K-th section is validation; 0 = default; >= 2 */
  uint64_t seed;          /* SentencePiece sampling seed (only used past 2M lines) */
  int mlm;                /* 1: a masked-LM tokenizer (the special pieces above) */
  const char *tokenizer_dir; /* a Hugging Face folder: its tokenizer.model encodes the text
                              * (vocab_size 0, mlm 0); NULL: train a tokenizer */
  const char *text_field;  /* JSON Lines: the field holding a record's text; NULL: "text" */
  int progress;            /* 1: with tokenizer_dir, a progress line on stderr (a terminal) */
  size_t batch_bytes;      /* with tokenizer_dir: bytes of text encoded per batch (the memory
                            * bound); 0: 16 MiB. The shards do not depend on it. */
  const volatile sig_atomic_t *stop; /* with tokenizer_dir: when *stop becomes nonzero (a
                            * signal handler's flag), the run stops at the next section with
                            * TS_ERR_IO ("interrupted"), leaving nothing; NULL: never */
} ts_prepare_opts;

/* What was written. */
typedef struct ts_prepare_report {
  size_t vocab_size;       /* pieces in the tokenizer (trained: = opts vocab_size) */
  size_t files;            /* files read (a folder's; 1 for a file) */
  size_t sections;         /* sections (documents) in the corpus */
  size_t val_sections;     /* of which validation */
  size_t train_bytes;      /* bytes of training text */
  size_t val_bytes;        /* bytes of validation text */
  size_t train_tokens;     /* tokens in train.bin */
  size_t val_tokens;       /* tokens in val.bin */
  double unigram_val_loss; /* nats/token, see ts_prepare_corpus */
  double unigram_val_accuracy; /* share of val tokens equal to train's most frequent one */
  double seconds;          /* wall-clock seconds of the whole preparation */
} ts_prepare_report;

/* Prepares opts->text_path into opts->out_dir as described above and fills
 * *report (may be NULL). The unigram baseline is the cross-entropy of the
 * validation tokens under the training tokens' frequencies with add-one
 * (Laplace) smoothing over the vocabulary of V pieces:
 *   p(v) = (count_train(v) + 1) / (train_tokens + V),
 *   loss = -(1/val_tokens) * sum over val tokens x of ln p(x)   [nats/token],
 * the loss a model that ignores context cannot beat by much.
 * Returns TS_OK; TS_ERR_INVALID_ARGUMENT for a missing option, K < 2, a text
 * that is not UTF-8, has fewer than K sections or an empty training part, or
 * a vocab_size SentencePiece cannot fill (below 4 + 256 + the number of
 * distinct characters in the training text, or above what the text yields);
 * for a JSON Lines line that is not an object, lacks text_field or holds
 * another type there (the message names the file and line), a Parquet
 * file Arrow cannot read, without the column or with a null or non-string
 * value, a folder inside the corpus folder, a corpus with no text; with
 * tokenizer_dir, for vocab_size or mlm given, a folder without
 * tokenizer.model or tokenizer.json, a tokenizer.json the library refuses, a file
 * SentencePiece cannot load, a tokenizer_config.json that is not an object
 * or whose add_bos_token / add_eos_token is not a boolean or whose
 * bos_token / eos_token is not a piece;
 * TS_ERR_UNSUPPORTED when tokenizer.json or Parquet is needed and the
 * Python with tokenizers and pyarrow is missing (tools/setup.sh installs it);
 * TS_ERR_IO if the text cannot be read or an output cannot be written;
 * TS_ERR_INTERNAL if SentencePiece fails otherwise. On failure no temporary
 * directory is left and nothing under out_dir changes (short of a rename
 * failing between two of the four files while replacing them in an existing
 * DIR); ts_last_error() holds a one-line message naming the flag or file and
 * the expected value. */
ts_status ts_prepare_corpus(const ts_prepare_opts *opts, ts_prepare_report *report);

/* The `tessera prepare` command. argv[0] is the command name ("prepare"),
 * flags follow (`--flag value` or `--flag=value`). Prints a summary to stdout
 * and returns 0 on success; `--help` prints usage and returns 0; on any error
 * prints "tessera prepare: <message>" to stderr and returns 2 for bad usage
 * or input (malformed flags, TS_ERR_INVALID_ARGUMENT) and 1 for a failure
 * while running (I/O, SentencePiece). */
int ts_tool_prepare(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_PREPARE_H */

/*
 * token_file.h — token files (the training data on disk); engine/loader.h
 * cuts them into sequences. (Not to be confused with parameter shards,
 * shard/: a token file is what llm.c calls a shard.)
 *
 * A token file is one file in llm.c's shard layout: a header of 256 little-endian
 * int32 values (header[0] magic, header[1] version, header[2] token count,
 * the rest zero), then the tokens back to back:
 *   magic 20240520, version 1: uint16 tokens (vocabulary of at most 65 535 ids);
 *   magic 20240801, version 7: uint32 tokens (vocab_size > 65 535).
 * File size is exactly 1024 + count * token bytes; every token id is below the
 * vocabulary size. The host must be little-endian, as llm.c assumes.
 */
#ifndef TS_ENGINE_TOKEN_FILE_H
#define TS_ENGINE_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Header layout (int32 slots) and the two accepted formats. */
#define TS_TOKEN_FILE_HEADER_INTS 256
#define TS_TOKEN_FILE_HEADER_BYTES (TS_TOKEN_FILE_HEADER_INTS * 4)
#define TS_TOKEN_FILE_MAGIC_U16 20240520
#define TS_TOKEN_FILE_VERSION_U16 1
#define TS_TOKEN_FILE_MAGIC_U32 20240801
#define TS_TOKEN_FILE_VERSION_U32 7
/* Largest vocabulary stored as uint16 tokens; larger ones use uint32. */
#define TS_TOKEN_FILE_U16_MAX_VOCAB 65535
/* Largest vocabulary a token file may declare: ids must fit the loader's int32. */
#define TS_TOKEN_FILE_MAX_VOCAB ((size_t)INT32_MAX)

/* Writes tokens (n_tokens, uint32, host) as a token file at `path`: uint16 tokens
 * when vocab_size <= 65 535, else uint32. The file appears atomically: the
 * bytes go to path + ".tmp", are fsync'ed, then renamed over `path` (an
 * existing file is replaced only on success).
 * Returns TS_OK; TS_ERR_INVALID_ARGUMENT if vocab_size is 0 or above
 * TS_TOKEN_FILE_MAX_VOCAB, if n_tokens exceeds INT32_MAX (llm.c's int32 count), or
 * if a token is >= vocab_size (the message names the position and the id;
 * nothing is written); TS_ERR_IO if a write, fsync or rename fails (the .tmp
 * file is removed). */
ts_status ts_token_file_write(const char *path, const uint32_t *tokens, size_t n_tokens,
                         size_t vocab_size);

/* A token file written piece by piece (opaque), for a corpus larger than
 * memory: the tokens go to path + ".tmp" as they come, the header's count
 * is filled in at commit, which fsyncs and renames the file over `path`
 * (ts_token_file_write's format and guarantees). */
typedef struct ts_token_file_writer ts_token_file_writer;

/* Starts the token file at `path` for a vocabulary of vocab_size ids (uint16
 * tokens when vocab_size <= 65 535, else uint32). Returns TS_OK;
 * TS_ERR_INVALID_ARGUMENT if vocab_size is 0 or above TS_TOKEN_FILE_MAX_VOCAB;
 * TS_ERR_IO if path + ".tmp" cannot be created; TS_ERR_OUT_OF_MEMORY. On
 * failure *out is NULL. */
ts_status ts_token_file_writer_open(ts_token_file_writer **out, const char *path,
                                    size_t vocab_size);

/* Appends n tokens (uint32, host). TS_ERR_INVALID_ARGUMENT if a token is >=
 * vocab_size (the message names its position in the file and its id) or the
 * file would pass INT32_MAX tokens; TS_ERR_IO if a write fails. After an
 * error the writer can only be discarded. */
ts_status ts_token_file_writer_append(ts_token_file_writer *w, const uint32_t *tokens, size_t n);

/* Tokens appended so far. */
size_t ts_token_file_writer_count(const ts_token_file_writer *w);

/* Writes the count into the header, fsyncs and renames the file into place,
 * and frees w (also on failure, when the .tmp file is removed). TS_ERR_IO. */
ts_status ts_token_file_writer_commit(ts_token_file_writer *w);

/* Removes the .tmp file and frees w (NULL: nothing). */
void ts_token_file_writer_discard(ts_token_file_writer *w);

/* An open, validated token file (opaque). Owns its mapping of the file; read-only
 * after ts_token_file_open, so several loaders and threads may share one. */
typedef struct ts_token_file ts_token_file;

/* Opens and validates the token file at `path` (memory-mapped read-only).
 * Checks, in order: the file opens (TS_ERR_IO: "train.bin: cannot open: No
 * such file or directory"); it holds a whole header; header[0] is a known
 * magic and header[1] its version; header[2] is a non-negative count; the
 * file is exactly 1024 + count * token bytes (no truncation, no trailing
 * bytes); every token id is < vocab_size. Format failures return
 * TS_ERR_FORMAT with a message naming the file, the field, the value found
 * and the expected value. TS_ERR_INVALID_ARGUMENT if vocab_size is 0 or above
 * TS_TOKEN_FILE_MAX_VOCAB; TS_ERR_OUT_OF_MEMORY. On failure *out is NULL. */
ts_status ts_token_file_open(ts_token_file **out, const char *path, size_t vocab_size);

/* Number of tokens in the file. */
size_t ts_token_file_num_tokens(const ts_token_file *tf);

/* Token i (i < ts_token_file_num_tokens; asserted). */
uint32_t ts_token_file_token(const ts_token_file *tf, size_t i);

/* The path the file was opened from (for messages). */
const char *ts_token_file_path(const ts_token_file *tf);

/* Unmaps and frees the file; NULL is a no-op. Loaders built on it must be
 * freed first. */
void ts_token_file_close(ts_token_file *tf);

/* Copies tokens [first, first + n) as int32 into out (n, host);
 * first + n <= ts_token_file_num_tokens (asserted). The loader's read. */
void ts_token_file_read(const ts_token_file *tf, size_t first, size_t n, int32_t *out);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TOKEN_FILE_H */

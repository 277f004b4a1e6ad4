/*
 * corpus.h — the corpus `tessera prepare` reads (prepare.h, "Inputs"): a
 * UTF-8 text file cut into sections, JSON Lines records (read whole or a
 * line at a time), a folder of such files. Internal to //tools:prepare
 * (C++, host). Errors are ts_status with a one-line message naming the
 * flag --text, the file and, for JSON Lines, the line and the field.
 */
#ifndef TS_TOOLS_CORPUS_H
#define TS_TOOLS_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <string>
#include <vector>

#include "base/base.h"

namespace ts_prepare {

// One document of the corpus: a text file's section, or a JSON Lines
// record's text. `section`: a text file's, whose sections concatenate to
// the file byte for byte (so no separator is added between them).
struct Doc {
  std::string text;
  bool section;
};

// Reads a whole file into *out. TS_ERR_IO ("PATH: cannot open: ..."),
// TS_ERR_INVALID_ARGUMENT for a folder ("PATH: is a folder; expected a file").
ts_status ReadText(const char *path, std::string *out);

// Decodes one UTF-8 code point at s[i]; returns its length (0 if malformed:
// overlong, surrogate, above U+10FFFF, truncated).
size_t Utf8Next(const std::string &s, size_t i, uint32_t *cp);

// Byte offset of the first malformed UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(const std::string &s);

// Whether s ends with suf (byte for byte).
bool HasSuffix(const std::string &s, const char *suf);

// A text file's sections (prepare.h), appended to *docs; TS_ERR_IO,
// TS_ERR_INVALID_ARGUMENT for text that is not UTF-8.
ts_status ReadTextDocs(const std::string &path, std::vector<Doc> *docs);

// Reads a JSON Lines file a line at a time (memory: one line), calling
// take(text) for each record whose string field `field` is not empty (blank
// lines and empty texts are skipped); *bytes counts the bytes read. A take
// that fails ends the read with its status. TS_ERR_INVALID_ARGUMENT for a
// line that is not one JSON object, a field missing, null or not a string,
// \u0000, invalid UTF-8; TS_ERR_IO.
ts_status StreamJsonl(const std::string &path, const char *field, size_t *bytes,
                      const std::function<ts_status(std::string &&)> &take);

// Whether a file is JSON Lines by its name: .jsonl, .ndjson, .json, any case.
bool IsJsonl(const std::string &path);

// Whether a file is Parquet by its name: .parquet, any case (read through
// pyarrow: tools/py_helper.h StreamParquet).
bool IsParquet(const std::string &path);

// The corpus's files: `path` itself, or a folder's files (not its hidden
// ones) in name order. TS_ERR_INVALID_ARGUMENT for a folder inside it, an
// empty folder; TS_ERR_IO. Nothing is read but the folder.
ts_status ListCorpus(const char *path, std::vector<std::string> *files);

// The whole corpus at `path` in memory, file by file (Parquet, JSON Lines or
// text by IsParquet and IsJsonl); *files counts the files read. Errors as
// above, and StreamParquet's.
ts_status ReadDocuments(const char *path, const char *field, std::vector<Doc> *docs,
                        size_t *files);

}  // namespace ts_prepare

#endif  // TS_TOOLS_CORPUS_H

/*
 * corpus.cc — the corpus `tessera prepare` reads (see corpus.h): a text
 * file's sections, JSON Lines records, a folder of them.
 */
#include "tools/corpus.h"

#include "tools/py_helper.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <algorithm>

namespace ts_prepare {

// A one-line paragraph shorter than this is a heading, joined to the next.
static const size_t kHeadingMaxBytes = 80;

// Reads a whole file into *out.
ts_status ReadText(const char *path, std::string *out) {
  FILE *f = fopen(path, "rb");
  if (f == nullptr) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {  // (fopen opens a folder for reading)
    fclose(f);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: is a folder; expected a file", path);
  }
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int err = ferror(f) ? errno : 0;
  fclose(f);
  if (err) return ts_set_error(TS_ERR_IO, "%s: read failed: %s", path, strerror(err));
  return TS_OK;
}

// Decodes one UTF-8 code point at s[i]; returns its length (0 if malformed).
size_t Utf8Next(const std::string &s, size_t i, uint32_t *cp) {
  const unsigned char c = (unsigned char)s[i];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; k++) {
    const unsigned char d = (unsigned char)s[i + k];
    if ((d & 0xC0) != 0x80) return 0;
    v = (v << 6) | (d & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// Byte offset of the first malformed UTF-8 sequence, or npos.
size_t FirstInvalidUtf8(const std::string &s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8Next(s, i, &cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}
static bool IsBlank(const char *b, const char *e) {
  for (; b < e; b++)
    if (*b != ' ' && *b != '\t' && *b != '\r') return false;
  return true;
}

// Cuts text into sections (see prepare.h): returns their start offsets; the
// last section ends at text.size().
static std::vector<size_t> SplitSections(const std::string &text) {
  // Paragraphs: [start, end) spans; a paragraph starts at the first line
  // after the previous paragraph's last non-blank line.
  struct Para {
    size_t start;
    size_t lines;      // non-blank lines
    size_t last_len;   // bytes of its (only) line, when lines == 1
  };
  std::vector<Para> paras;
  const char *base = text.data();
  size_t pos = 0, cur_start = 0;
  bool in_para = false;
  while (pos < text.size()) {
    const char *nl = (const char *)memchr(base + pos, '\n', text.size() - pos);
    size_t end = nl ? (size_t)(nl - base) + 1 : text.size();
    size_t content_end = nl ? end - 1 : end;
    bool blank = IsBlank(base + pos, base + content_end);
    if (!blank) {
      if (!in_para) {
        paras.push_back(Para{cur_start, 0, 0});
        in_para = true;
      }
      paras.back().lines++;
      paras.back().last_len = content_end - pos;
    } else if (in_para) {
      in_para = false;
      cur_start = pos;  // blank lines belong to the next paragraph
    }
    pos = end;
  }
  std::vector<size_t> starts;
  bool joined = false;  // previous paragraph was a heading: this one continues its section
  for (const Para &p : paras) {
    if (!joined) starts.push_back(p.start);
    joined = p.lines == 1 && p.last_len < kHeadingMaxBytes;
  }
  if (starts.empty()) starts.push_back(0);
  starts[0] = 0;  // anything before the first paragraph belongs to it
  return starts;
}


bool HasSuffix(const std::string &s, const char *suf) {
  size_t n = strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// HasSuffix, ignoring ASCII case (file name extensions).
static bool HasSuffixNoCase(const std::string &s, const char *suf) {
  size_t n = strlen(suf);
  return s.size() >= n && strcasecmp(s.c_str() + s.size() - n, suf) == 0;
}

// Whether a JSON text has the escape \u0000 in it (an odd run of
// backslashes before "u0000"): cJSON's strings end at a NUL, so such a
// string would be cut short without a word.
static bool HasNulEscape(const std::string &json) {
  for (size_t i = json.find("u0000"); i != std::string::npos; i = json.find("u0000", i + 1)) {
    size_t b = 0;
    while (b < i && json[i - 1 - b] == '\\') b++;
    if (b % 2 == 1) return true;
  }
  return false;
}

// A text file's sections (see prepare.h), appended to *docs.
ts_status ReadTextDocs(const std::string &path, std::vector<Doc> *docs) {
  std::string text;
  ts_status st = ReadText(path.c_str(), &text);
  if (st != TS_OK) return ts_set_error(st, "--text %s", std::string(ts_last_error()).c_str());
  size_t bad = FirstInvalidUtf8(text);
  if (bad != std::string::npos)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--text %s: invalid UTF-8 at byte %zu, expected UTF-8 text",
                        path.c_str(), bad);
  if (text.empty()) return TS_OK;
  std::vector<size_t> starts = SplitSections(text);
  for (size_t i = 0; i < starts.size(); i++) {
    size_t end = i + 1 < starts.size() ? starts[i + 1] : text.size();
    docs->push_back(Doc{text.substr(starts[i], end - starts[i]), true});
  }
  return TS_OK;
}

// One line (line_no from 1) of the JSON Lines file `path`: its record's
// string field `field` into *text; a blank line gives TS_OK and an empty
// text. Errors name the file, the line and the field.
static ts_status ParseJsonlLine(const std::string &path, size_t line_no, const std::string &line,
                         const char *field, std::string *text) {
  text->clear();
  if (line.find_first_not_of(" \t\r") == std::string::npos) return TS_OK;
  size_t bad = FirstInvalidUtf8(line);
  if (bad != std::string::npos)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s:%zu: invalid UTF-8 at byte %zu of the line, expected UTF-8 "
                        "JSON",
                        path.c_str(), line_no, bad);
  const char *end = nullptr;
  cJSON *rec = cJSON_ParseWithLengthOpts(line.data(), line.size(), &end, 0);
  bool trailing = rec != nullptr && end != nullptr &&
                  line.find_first_not_of(" \t\r", (size_t)(end - line.data())) != std::string::npos;
  if (rec == nullptr || !cJSON_IsObject(rec) || trailing) {
    cJSON_Delete(rec);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s:%zu: %s, expected one JSON object a line (JSON Lines)",
                        path.c_str(), line_no,
                        trailing ? "more after the JSON object" : "not valid JSON or not an object");
  }
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, field);
  if (!cJSON_IsString(v)) {
    ts_status st = ts_set_error(TS_ERR_INVALID_ARGUMENT,
                                "--text %s:%zu: field \"%s\" %s, expected a string (--text-field "
                                "names the field that holds the text)",
                                path.c_str(), line_no, field,
                                v == nullptr       ? "missing"
                                : cJSON_IsNull(v)  ? "is null"
                                                   : "is not a string");
    cJSON_Delete(rec);
    return st;
  }
  if (HasNulEscape(line)) {
    cJSON_Delete(rec);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s:%zu: \\u0000 (a NUL character), expected text without NULs",
                        path.c_str(), line_no);
  }
  *text = v->valuestring;
  cJSON_Delete(rec);
  bad = FirstInvalidUtf8(*text);
  if (bad != std::string::npos)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "--text %s:%zu: field \"%s\": invalid UTF-8 at byte %zu, expected UTF-8 "
                        "text",
                        path.c_str(), line_no, field, bad);
  return TS_OK;
}

// Reads a JSON Lines file a line at a time (memory: one line), calling
// take(text) for each record whose text is not empty (blank lines and empty
// texts are skipped). *bytes counts the bytes read.
ts_status StreamJsonl(const std::string &path, const char *field, size_t *bytes,
                      const std::function<ts_status(std::string &&)> &take) {
  FILE *f = fopen(path.c_str(), "rb");
  if (f == nullptr)
    return ts_set_error(TS_ERR_IO, "--text %s: cannot open: %s", path.c_str(), strerror(errno));
  char *buf = nullptr;
  size_t cap = 0, line_no = 0;
  ssize_t n;
  ts_status st = TS_OK;
  std::string line, text;
  while (st == TS_OK && (n = getline(&buf, &cap, f)) > 0) {
    *bytes += (size_t)n;
    line.assign(buf, (size_t)n);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    st = ParseJsonlLine(path, ++line_no, line, field, &text);
    if (st == TS_OK && !text.empty()) st = take(std::move(text));
  }
  if (st == TS_OK && ferror(f)) st = ts_set_error(TS_ERR_IO, "--text %s: read failed", path.c_str());
  free(buf);
  fclose(f);
  return st;
}

// A JSON Lines file's records, one JSON object a line, each one document:
// its string field `field` (records whose text is empty are skipped; blank
// lines too).
static ts_status ReadJsonlDocs(const std::string &path, const char *field, std::vector<Doc> *docs) {
  size_t bytes = 0;
  return StreamJsonl(path, field, &bytes, [&](std::string &&text) {
    docs->push_back(Doc{std::move(text), false});
    return TS_OK;
  });
}

bool IsJsonl(const std::string &path) {
  return HasSuffixNoCase(path, ".jsonl") || HasSuffixNoCase(path, ".ndjson") ||
         HasSuffixNoCase(path, ".json");
}

// The corpus's files: `path` itself, or a folder's files (not its hidden
// ones) in name order; a folder inside it and an empty folder are refused.
// Checked before anything is written.
ts_status ListCorpus(const char *path, std::vector<std::string> *files) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return ts_set_error(TS_ERR_IO, "--text %s: cannot open: %s", path, strerror(errno));
  files->clear();
  if (!S_ISDIR(sb.st_mode)) {
    files->push_back(path);
  } else {
    DIR *d = opendir(path);
    if (d == nullptr)
      return ts_set_error(TS_ERR_IO, "--text %s: cannot open: %s", path, strerror(errno));
    std::vector<std::string> names;
    for (struct dirent *e; (e = readdir(d)) != nullptr;)
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    std::string dir = path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    for (const std::string &n : names) {
      std::string p = dir + "/" + n;
      if (stat(p.c_str(), &sb) != 0)
        return ts_set_error(TS_ERR_IO, "--text %s: cannot open: %s", p.c_str(), strerror(errno));
      if (S_ISDIR(sb.st_mode))
        return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                            "--text %s: a folder inside the corpus folder, expected files only",
                            p.c_str());
      files->push_back(p);
    }
    if (files->empty())
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "--text %s: an empty folder, expected text or JSON Lines files", path);
  }
  return TS_OK;
}

bool IsParquet(const std::string &path) { return HasSuffixNoCase(path, ".parquet"); }

// One input file by its name: .jsonl, .ndjson and .json (any case) are JSON
// Lines, .parquet Parquet (through pyarrow, py_helper.h), anything else
// UTF-8 text.
static ts_status ReadFileDocs(const std::string &path, const char *field, std::vector<Doc> *docs) {
  if (IsParquet(path)) {
    size_t bytes = 0;
    return StreamParquet(path, field, &bytes, [&](std::string &&text) {
      docs->push_back(Doc{std::move(text), false});
      return TS_OK;
    });
  }
  return IsJsonl(path) ? ReadJsonlDocs(path, field, docs) : ReadTextDocs(path, docs);
}

// The whole corpus at `path` in memory (a tokenizer is trained on it).
// *files counts the files read.
ts_status ReadDocuments(const char *path, const char *field, std::vector<Doc> *docs, size_t *files) {
  std::vector<std::string> list;
  TS_CHECK(ListCorpus(path, &list));
  for (const std::string &f : list) TS_CHECK(ReadFileDocs(f, field, docs));
  *files = list.size();
  return TS_OK;
}

}  // namespace ts_prepare

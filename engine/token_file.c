/*
 * token_file.c — token files (llm.c shard layout); the loader over them is
 * engine/loader.c.
 *
 * Invariants: an open token file has been validated completely (header,
 * exact size, every token < vocab_size), so readers never re-check; token
 * files are only ever replaced by rename (base/atomic_file.h), so a mapping
 * stays valid while open.
 */
#define _POSIX_C_SOURCE 200809L

#include "engine/token_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"

struct ts_token_file {
  char *path;              /* as passed to ts_token_file_open (owned) */
  void *map;               /* whole file, read-only mapping */
  size_t map_bytes;        /* file size in bytes */
  const uint16_t *tok16;   /* (n_tokens) when stored as uint16, else NULL */
  const uint32_t *tok32;   /* (n_tokens) when stored as uint32, else NULL */
  size_t n_tokens;         /* header[2] */
};

/* ------------------------------------------------------------------ writing */

struct ts_token_file_writer {
  ts_atomic_file *f;
  char *path; /* for messages (owned) */
  size_t vocab_size;
  size_t n;   /* tokens appended */
  int wide;   /* uint32 tokens */
};

ts_status ts_token_file_writer_open(ts_token_file_writer **out, const char *path,
                                    size_t vocab_size) {
  if (out == NULL || path == NULL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_token_file_writer_open: out and path must not be NULL");
  *out = NULL;
  if (vocab_size == 0 || vocab_size > TS_TOKEN_FILE_MAX_VOCAB)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: vocab_size %zu: expected 1 .. %zu", path,
                        vocab_size, TS_TOKEN_FILE_MAX_VOCAB);
  ts_token_file_writer *w = calloc(1, sizeof *w);
  char *p = w ? strdup(path) : NULL;
  if (p == NULL) {
    free(w);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  }
  w->path = p;
  w->vocab_size = vocab_size;
  w->wide = vocab_size > TS_TOKEN_FILE_U16_MAX_VOCAB;
  ts_status st = ts_atomic_file_open(&w->f, path);
  int32_t header[TS_TOKEN_FILE_HEADER_INTS] = {0}; /* the count is written at commit */
  header[0] = w->wide ? TS_TOKEN_FILE_MAGIC_U32 : TS_TOKEN_FILE_MAGIC_U16;
  header[1] = w->wide ? TS_TOKEN_FILE_VERSION_U32 : TS_TOKEN_FILE_VERSION_U16;
  if (st == TS_OK) st = ts_atomic_file_write(w->f, header, sizeof header);
  if (st != TS_OK) {
    ts_token_file_writer_discard(w);
    return st;
  }
  *out = w;
  return TS_OK;
}

ts_status ts_token_file_writer_append(ts_token_file_writer *w, const uint32_t *tokens, size_t n) {
  if (n > 0 && tokens == NULL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: tokens must not be NULL", w->path);
  if (n > (size_t)INT32_MAX - w->n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: %zu tokens: expected at most %d (llm.c's int32 token count)", w->path,
                        w->n + n, INT32_MAX);
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] >= w->vocab_size)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: token %zu is id %u, expected an id below vocab_size %zu", w->path,
                          w->n + i, (unsigned)tokens[i], w->vocab_size);
  }
  ts_status st = TS_OK;
  if (w->wide) {
    st = ts_atomic_file_write(w->f, tokens, n * sizeof(uint32_t));
  } else {
    uint16_t buf[4096]; /* converts in chunks to keep the copy small */
    for (size_t i = 0; i < n && st == TS_OK;) {
      size_t k = n - i < 4096 ? n - i : 4096;
      for (size_t j = 0; j < k; j++) buf[j] = (uint16_t)tokens[i + j];
      st = ts_atomic_file_write(w->f, buf, k * sizeof(uint16_t));
      i += k;
    }
  }
  if (st == TS_OK) w->n += n;
  return st;
}

size_t ts_token_file_writer_count(const ts_token_file_writer *w) { return w->n; }

ts_status ts_token_file_writer_commit(ts_token_file_writer *w) {
  FILE *f = ts_atomic_file_stream(w->f);
  int32_t count = (int32_t)w->n;
  if (fflush(f) != 0 || fseek(f, 2 * (long)sizeof(int32_t), SEEK_SET) != 0 ||
      fwrite(&count, sizeof count, 1, f) != 1 || fseek(f, 0, SEEK_END) != 0) {
    ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot write the token count: %s", w->path,
                                strerror(errno));
    ts_token_file_writer_discard(w);
    return st;
  }
  ts_status st = ts_atomic_file_commit(w->f);
  w->f = NULL; /* commit freed it, also on failure */
  free(w->path);
  free(w);
  return st;
}

void ts_token_file_writer_discard(ts_token_file_writer *w) {
  if (w == NULL) return;
  if (w->f) ts_atomic_file_discard(w->f);
  free(w->path);
  free(w);
}

ts_status ts_token_file_write(const char *path, const uint32_t *tokens, size_t n_tokens,
                         size_t vocab_size) {
  if (path == NULL || (tokens == NULL && n_tokens > 0))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_token_file_write: path and tokens must not be NULL");
  if (vocab_size == 0 || vocab_size > TS_TOKEN_FILE_MAX_VOCAB)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: vocab_size %zu: expected 1 .. %zu", path,
                        vocab_size, TS_TOKEN_FILE_MAX_VOCAB);
  if (n_tokens > (size_t)INT32_MAX)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s: %zu tokens: expected at most %d (llm.c's int32 token count)", path,
                        n_tokens, INT32_MAX);
  for (size_t i = 0; i < n_tokens; i++) { /* checked before anything is created */
    if (tokens[i] >= vocab_size)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s: token %zu is id %u, expected an id below vocab_size %zu", path, i,
                          (unsigned)tokens[i], vocab_size);
  }
  ts_token_file_writer *w;
  TS_CHECK(ts_token_file_writer_open(&w, path, vocab_size));
  ts_status st = ts_token_file_writer_append(w, tokens, n_tokens);
  if (st != TS_OK) {
    ts_token_file_writer_discard(w);
    return st;
  }
  return ts_token_file_writer_commit(w);
}

/* ------------------------------------------------------------------ reading */

ts_status ts_token_file_open(ts_token_file **out, const char *path, size_t vocab_size) {
  if (out == NULL || path == NULL)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ts_token_file_open: out and path must not be NULL");
  *out = NULL;
  if (vocab_size == 0 || vocab_size > TS_TOKEN_FILE_MAX_VOCAB)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: vocab_size %zu: expected 1 .. %zu", path,
                        vocab_size, TS_TOKEN_FILE_MAX_VOCAB);

  int fd = open(path, O_RDONLY);
  if (fd < 0) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    close(fd);
    return st;
  }
  size_t file_bytes = (size_t)sb.st_size;
  if (file_bytes < TS_TOKEN_FILE_HEADER_BYTES) {
    close(fd);
    return ts_set_error(TS_ERR_FORMAT,
                        "%s: file is %zu bytes, expected at least the %d-byte header (256 x int32)",
                        path, file_bytes, TS_TOKEN_FILE_HEADER_BYTES);
  }
  void *map = mmap(NULL, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED)
    return ts_set_error(TS_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, file_bytes,
                        strerror(map_errno));

  ts_status st = TS_OK;
  ts_token_file *sh = NULL;
  const int32_t *header = (const int32_t *)map;
  size_t token_bytes = 0;
  if (header[0] == TS_TOKEN_FILE_MAGIC_U16) {
    token_bytes = 2;
    if (header[1] != TS_TOKEN_FILE_VERSION_U16) {
      st = ts_set_error(TS_ERR_FORMAT, "%s: header[1] (version) is %d, expected %d for magic %d",
                        path, header[1], TS_TOKEN_FILE_VERSION_U16, TS_TOKEN_FILE_MAGIC_U16);
      goto fail;
    }
  } else if (header[0] == TS_TOKEN_FILE_MAGIC_U32) {
    token_bytes = 4;
    if (header[1] != TS_TOKEN_FILE_VERSION_U32) {
      st = ts_set_error(TS_ERR_FORMAT, "%s: header[1] (version) is %d, expected %d for magic %d",
                        path, header[1], TS_TOKEN_FILE_VERSION_U32, TS_TOKEN_FILE_MAGIC_U32);
      goto fail;
    }
  } else {
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: header[0] (magic) is %d, expected %d (uint16 tokens) or %d (uint32 tokens)",
                      path, header[0], TS_TOKEN_FILE_MAGIC_U16, TS_TOKEN_FILE_MAGIC_U32);
    goto fail;
  }
  if (header[2] < 0) {
    st = ts_set_error(TS_ERR_FORMAT, "%s: header[2] (token count) is %d, expected >= 0", path,
                      header[2]);
    goto fail;
  }
  size_t n_tokens = (size_t)header[2];
  size_t expect_bytes = TS_TOKEN_FILE_HEADER_BYTES + n_tokens * token_bytes;
  if (file_bytes != expect_bytes) {
    st = ts_set_error(TS_ERR_FORMAT,
                      "%s: file is %zu bytes, expected %zu (1024-byte header + %zu tokens x %zu "
                      "bytes): %s",
                      path, file_bytes, expect_bytes, n_tokens, token_bytes,
                      file_bytes < expect_bytes ? "truncated" : "trailing bytes");
    goto fail;
  }

  sh = (ts_token_file *)calloc(1, sizeof *sh);
  if (sh == NULL || (sh->path = strdup(path)) == NULL) {
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    goto fail;
  }
  sh->map = map;
  sh->map_bytes = file_bytes;
  sh->n_tokens = n_tokens;
  const char *body = (const char *)map + TS_TOKEN_FILE_HEADER_BYTES;
  if (token_bytes == 2) {
    sh->tok16 = (const uint16_t *)body;
    for (size_t i = 0; i < n_tokens; i++) {
      if (sh->tok16[i] >= vocab_size) {
        st = ts_set_error(TS_ERR_FORMAT,
                          "%s: token %zu is id %u, expected an id below vocab_size %zu", path, i,
                          (unsigned)sh->tok16[i], vocab_size);
        goto fail;
      }
    }
  } else {
    sh->tok32 = (const uint32_t *)body;
    for (size_t i = 0; i < n_tokens; i++) {
      if (sh->tok32[i] >= vocab_size) {
        st = ts_set_error(TS_ERR_FORMAT,
                          "%s: token %zu is id %u, expected an id below vocab_size %zu", path, i,
                          (unsigned)sh->tok32[i], vocab_size);
        goto fail;
      }
    }
  }
  *out = sh;
  return TS_OK;

fail:
  if (sh != NULL) {
    free(sh->path);
    free(sh);
  }
  munmap(map, file_bytes);
  return st;
}

size_t ts_token_file_num_tokens(const ts_token_file *shard) { return shard->n_tokens; }

uint32_t ts_token_file_token(const ts_token_file *shard, size_t i) {
  TS_ASSERT(i < shard->n_tokens);
  return shard->tok16 != NULL ? shard->tok16[i] : shard->tok32[i];
}

void ts_token_file_read(const ts_token_file *shard, size_t first, size_t n, int32_t *out) {
  TS_ASSERT(first <= shard->n_tokens && n <= shard->n_tokens - first);
  if (shard->tok16 != NULL) {
    const uint16_t *src = shard->tok16 + first; /* (n) */
    for (size_t t = 0; t < n; t++) out[t] = (int32_t)src[t];
  } else {
    const uint32_t *src = shard->tok32 + first; /* (n) */
    for (size_t t = 0; t < n; t++) out[t] = (int32_t)src[t];
  }
}

const char *ts_token_file_path(const ts_token_file *shard) { return shard->path; }

void ts_token_file_close(ts_token_file *shard) {
  if (shard == NULL) return;
  munmap(shard->map, shard->map_bytes);
  free(shard->path);
  free(shard);
}

/*
 * atomic_file.h — files that appear whole or not at all: every writer in
 * tessera (token files, safetensors, prepare's folder, compare's reports,
 * checkpoints) goes through these, so a crash, a full disk or bad input
 * never leaves a half-written file under the name a reader opens; and the
 * one whole-file read their readers share.
 *
 * Protocol (POSIX rename(2) atomicity): the bytes go to "PATH.tmp"; commit
 * checks every write, flushes, fsyncs the file, closes it, renames it over
 * PATH and fsyncs the folder holding PATH so the rename itself is durable.
 * Any failure, or a discard, removes PATH.tmp and leaves PATH as it was.
 *
 * Errors are TS_ERR_IO (or TS_ERR_OUT_OF_MEMORY) with a one-line message
 * naming the file, the step that failed and strerror's text. Host code; an
 * ts_atomic_file is owned by its opener until commit or discard frees it.
 */
#ifndef TS_BASE_ATOMIC_FILE_H
#define TS_BASE_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_atomic_file ts_atomic_file;

/* Creates (truncates) PATH.tmp for writing; *out receives the file, or NULL
 * on failure. TS_ERR_IO ("PATH.tmp: cannot create: ..."),
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_atomic_file_open(ts_atomic_file **out, const char *path);

/* The stdio stream of the temporary, for fprintf/fwrite; stream errors are
 * caught by commit (ferror). Do not fclose it. */
FILE *ts_atomic_file_stream(ts_atomic_file *f);

/* Appends nbytes from data. TS_ERR_IO naming the temporary on a short
 * write (the file stays open: commit will refuse it, discard removes it). */
ts_status ts_atomic_file_write(ts_atomic_file *f, const void *data, size_t nbytes);

/* Flush, fsync, close, rename over the final path, fsync the folder; frees
 * f whatever happens. On any failure (an earlier stream error included) the
 * temporary is removed and the final path is untouched: TS_ERR_IO naming
 * the file and the step. */
ts_status ts_atomic_file_commit(ts_atomic_file *f);

/* Closes and removes the temporary; frees f. NULL is a no-op. */
void ts_atomic_file_discard(ts_atomic_file *f);

/* The whole protocol for one buffer: path gets exactly nbytes of data. */
ts_status ts_atomic_write(const char *path, const void *data, size_t nbytes);

/* Moves a finished file or folder `tmp` (written by the caller, e.g. by
 * another program) over `path`: fsync tmp, rename, fsync the folder of
 * path. On failure tmp is left for the caller to remove. TS_ERR_IO. */
ts_status ts_atomic_rename(const char *tmp, const char *path);

/* Checks now, before the work, that a file (folder 0) or a folder created
 * if absent (folder 1) can be written at path later: the path, if it
 * exists, of that kind and writable, else its parent an existing folder we
 * may write into. TS_ERR_INVALID_ARGUMENT, one line starting with `what`
 * (the option's name, e.g. "`save_dir`") and path: "exists and is not a
 * folder", "is a folder", "not writable", "the folder P does not exist",
 * "cannot write into P". */
ts_status ts_check_writable(const char *path, const char *what, int folder);

/* The reader's side: the whole file at path into a new NUL-terminated
 * buffer *out (free with free()), its length in bytes in *len (NULL: not
 * wanted). TS_ERR_IO ("PATH: cannot open: ..." or "PATH: read failed"),
 * TS_ERR_OUT_OF_MEMORY. *out is NULL on error. */
ts_status ts_read_file(const char *path, char **out, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* TS_BASE_ATOMIC_FILE_H */

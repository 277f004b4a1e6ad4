/* atomic_file.c — temporary, fsync, rename, fsync of the folder
 * (atomic_file.h). */
#include "base/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ts_atomic_file {
  FILE *f;    /* the temporary, open for writing */
  char *path; /* final name (owned) */
  char *tmp;  /* path + ".tmp" (owned) */
};

/* fsync of the file or folder at p; 0 or an errno. */
static int fsync_path(const char *p) {
  int fd = open(p, O_RDONLY);
  if (fd < 0) return errno;
  int err = fsync(fd) != 0 ? errno : 0;
  close(fd);
  return err;
}

/* fsync of the folder holding path, so a rename into it is durable (best
 * effort: some file systems refuse fsync on folders). */
static void fsync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
  if (dir == NULL) return;
  (void)fsync_path(dir);
  free(dir);
}

/* Frees f and its names (the stream is closed by then). */
static void release(ts_atomic_file *f) {
  free(f->path);
  free(f->tmp);
  free(f);
}

ts_status ts_atomic_file_open(ts_atomic_file **out, const char *path) {
  *out = NULL;
  ts_atomic_file *f = calloc(1, sizeof *f);
  size_t n = strlen(path);
  if (f) f->path = strdup(path);
  if (f) f->tmp = malloc(n + 5);
  if (!f || !f->path || !f->tmp) {
    if (f) release(f);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
  }
  memcpy(f->tmp, path, n);
  memcpy(f->tmp + n, ".tmp", 5);
  f->f = fopen(f->tmp, "wb");
  if (!f->f) {
    ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
    release(f);
    return st;
  }
  *out = f;
  return TS_OK;
}

FILE *ts_atomic_file_stream(ts_atomic_file *f) { return f->f; }

ts_status ts_atomic_file_write(ts_atomic_file *f, const void *data, size_t nbytes) {
  if (nbytes > 0 && fwrite(data, 1, nbytes, f->f) != nbytes)
    return ts_set_error(TS_ERR_IO, "%s: write failed: %s", f->tmp, strerror(errno));
  return TS_OK;
}

ts_status ts_atomic_file_commit(ts_atomic_file *f) {
  const char *what = NULL;
  int err = 0;
  if (ferror(f->f)) what = "write", err = EIO;
  else if (fflush(f->f) != 0) what = "write", err = errno;
  else if (fsync(fileno(f->f)) != 0) what = "fsync", err = errno;
  int closed = fclose(f->f);
  if (!what && closed != 0) what = "close", err = errno;
  if (!what && rename(f->tmp, f->path) != 0) what = "rename into place", err = errno;
  if (what) {
    ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot %s %s: %s", f->path, what, f->tmp,
                                strerror(err));
    unlink(f->tmp);
    release(f);
    return st;
  }
  fsync_parent(f->path);
  release(f);
  return TS_OK;
}

void ts_atomic_file_discard(ts_atomic_file *f) {
  if (!f) return;
  fclose(f->f);
  unlink(f->tmp);
  release(f);
}

ts_status ts_atomic_write(const char *path, const void *data, size_t nbytes) {
  ts_atomic_file *f;
  TS_CHECK(ts_atomic_file_open(&f, path));
  ts_status st = ts_atomic_file_write(f, data, nbytes);
  if (st != TS_OK) {
    ts_atomic_file_discard(f);
    return st;
  }
  return ts_atomic_file_commit(f);
}

ts_status ts_atomic_rename(const char *tmp, const char *path) {
  int err = fsync_path(tmp);
  if (err != 0)
    return ts_set_error(TS_ERR_IO, "%s: cannot fsync %s: %s", path, tmp, strerror(err));
  if (rename(tmp, path) != 0)
    return ts_set_error(TS_ERR_IO, "%s: cannot rename %s into place: %s", path, tmp,
                        strerror(errno));
  fsync_parent(path);
  return TS_OK;
}

ts_status ts_read_file(const char *path, char **out, size_t *len) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 8192;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot buffer the file", path);
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, 4096, f);
    n += got;
    if (got < 4096) break;
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(buf);
    return ts_set_error(TS_ERR_IO, "%s: read failed", path);
  }
  buf[n] = '\0';
  *out = buf;
  if (len) *len = n;
  return TS_OK;
}

ts_status ts_check_writable(const char *path, const char *what, int folder) {
  struct stat sb;
  if (stat(path, &sb) == 0) {
    if (folder && !S_ISDIR(sb.st_mode))
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "%s %s: exists and is not a folder: expected a folder (created if "
                          "absent)",
                          what, path);
    if (!folder && S_ISDIR(sb.st_mode))
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s %s: is a folder: expected a file path", what,
                          path);
    if (access(path, W_OK) != 0)
      return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s %s: not writable: %s", what, path,
                          strerror(errno));
    return TS_OK;
  }
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  if (!slash)
    snprintf(parent, sizeof parent, ".");
  else if (slash == parent)
    parent[1] = '\0';
  else
    *slash = '\0';
  if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "%s %s: the folder %s does not exist: expected a path in an existing "
                        "folder",
                        what, path, parent);
  if (access(parent, W_OK | X_OK) != 0)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s %s: cannot write into %s: %s", what, path,
                        parent, strerror(errno));
  return TS_OK;
}

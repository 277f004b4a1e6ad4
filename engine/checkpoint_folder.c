/*
 * checkpoint_folder.c — the folder of checkpoints (checkpoint.h): its
 * newest complete one (a step-N child with its index) and the pruning to
 * the newest K. Names and files only: nothing of an engine.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/checkpoint.h"

/* N of a child named "step-N" (digits only), else -1. */
static long long step_of(const char *name) {
  if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
  long long n = 0;
  for (const char *p = name + 5; *p; p++) {
    if (*p < '0' || *p > '9' || n > (1LL << 50)) return -1;
    n = n * 10 + (*p - '0');
  }
  return n;
}

static int has_index(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/" TS_CHECKPOINT_INDEX, dir);
  return access(path, F_OK) == 0;
}

int ts_checkpoint_latest(const char *root, char *out, size_t cap, size_t *step) {
  out[0] = '\0';
  if (step) *step = 0;
  if (has_index(root)) {
    snprintf(out, cap, "%s", root);
    return 1;
  }
  return ts_checkpoint_latest_below(root, (size_t)-1, out, cap, step);
}

int ts_checkpoint_latest_below(const char *root, size_t below, char *out, size_t cap,
                               size_t *step) {
  out[0] = '\0';
  if (step) *step = 0;
  DIR *d = opendir(root);
  if (!d) return 0;
  long long best = -1;
  struct dirent *de;
  while ((de = readdir(d))) {
    long long n = step_of(de->d_name);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, de->d_name);
    if (n > best && (unsigned long long)n < (unsigned long long)below && has_index(path)) {
      best = n;
      snprintf(out, cap, "%s", path);
    }
  }
  closedir(d);
  if (best >= 0 && step) *step = (size_t)best;
  return best >= 0;
}

int ts_checkpoint_hold(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/" TS_CHECKPOINT_INDEX, dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat sb;
  while (flock(fd, LOCK_SH) != 0 && errno == EINTR) {
  }
  /* a prune that took it first has unlinked it: no checkpoint now */
  if (fstat(fd, &sb) != 0 || sb.st_nlink == 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Removes folder dir's index first, then its files, then the folder. The
 * index is unlinked under an exclusive flock, taken without waiting: a
 * folder held by a reader (ts_checkpoint_hold) is left as it is, *held 1. */
static ts_status remove_checkpoint(const char *dir, int *held) {
  char path[4200];
  *held = 0;
  snprintf(path, sizeof path, "%s/" TS_CHECKPOINT_INDEX, dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    *held = 1;
    return TS_OK;
  }
  int gone = unlink(path) == 0 || errno == ENOENT;
  int err = errno;
  if (fd >= 0) close(fd); /* the lock goes with it, the index already unlinked */
  if (!gone) return ts_set_error(TS_ERR_IO, "%s: cannot remove: %s", path, strerror(err));
  DIR *d = opendir(dir);
  if (!d) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      unlink(path);
    }
  closedir(d);
  if (rmdir(dir) != 0) return ts_set_error(TS_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
  return TS_OK;
}

/* A child "step-N" of root: N and its name as found (padded or not). */
typedef struct step_dir {
  long long step;
  char name[64];
} step_dir;

static int newest_first(const void *a, const void *b) {
  long long x = ((const step_dir *)a)->step, y = ((const step_dir *)b)->step;
  return x > y ? -1 : x < y;
}

ts_status ts_checkpoint_prune(const char *root, size_t keep) {
  DIR *d = opendir(root);
  if (!d) return ts_set_error(TS_ERR_IO, "%s: cannot open: %s", root, strerror(errno));
  enum { MOST = 4096 };
  step_dir *dirs = malloc(MOST * sizeof *dirs);
  if (!dirs) {
    closedir(d);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot list it", root);
  }
  size_t n = 0;
  long long newest = -1;
  struct dirent *de;
  char path[4200];
  while ((de = readdir(d)) && n < MOST) {
    long long s = step_of(de->d_name);
    if (s < 0 || strlen(de->d_name) >= sizeof dirs[n].name) continue;
    dirs[n].step = s;
    snprintf(dirs[n++].name, sizeof dirs->name, "%s", de->d_name);
    snprintf(path, sizeof path, "%s/%s", root, de->d_name);
    if (has_index(path) && s > newest) newest = s;
  }
  closedir(d);
  qsort(dirs, n, sizeof *dirs, newest_first);
  size_t complete = 0;
  ts_status st = TS_OK;
  for (size_t k = 0; k < n && st == TS_OK; k++) {
    snprintf(path, sizeof path, "%s/%s", root, dirs[k].name);
    int whole = has_index(path);
    complete += (size_t)whole;
    int held;
    if ((whole && keep > 0 && complete > keep) || (!whole && dirs[k].step < newest))
      st = remove_checkpoint(path, &held);
  }
  free(dirs);
  return st;
}

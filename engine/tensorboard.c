/*
 * tensorboard.c — TensorBoard event files (engine/tensorboard.h): Event
 * messages packed by protobuf-c, framed as TFRecord records with ISA-L's
 * CRC-32C.
 */
#include "engine/tensorboard.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/tensorboard.pb-c.h"

struct ts_tensorboard {
  FILE *f;
  char path[4200];
};

uint32_t ts_tensorboard_crc32c(const void *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  const unsigned char *b = p;
  while (n > 0) { /* crc32_iscsi takes an int length */
    int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
    c = crc32_iscsi((unsigned char *)b, k, c);
    b += k;
    n -= (size_t)k;
  }
  return c ^ 0xFFFFFFFFu;
}

uint32_t ts_tensorboard_masked_crc(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static double wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One TFRecord: length, its masked CRC, the bytes, their masked CRC. */
static ts_status write_record(ts_tensorboard *tb, const uint8_t *data, size_t n) {
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
  uint32_t c1 = ts_tensorboard_masked_crc(ts_tensorboard_crc32c(len, 8));
  uint32_t c2 = ts_tensorboard_masked_crc(ts_tensorboard_crc32c(data, n));
  uint8_t a[4], b[4];
  for (int i = 0; i < 4; i++) a[i] = (uint8_t)(c1 >> (8 * i)), b[i] = (uint8_t)(c2 >> (8 * i));
  if (fwrite(len, 1, 8, tb->f) != 8 || fwrite(a, 1, 4, tb->f) != 4 ||
      fwrite(data, 1, n, tb->f) != n || fwrite(b, 1, 4, tb->f) != 4)
    return ts_set_error(TS_ERR_IO, "%s: write failed: %s", tb->path, strerror(errno));
  return TS_OK;
}

/* Packs ev and writes it as a record. */
static ts_status write_event(ts_tensorboard *tb, const Tessera__Tb__Event *ev) {
  size_t n = tessera__tb__event__get_packed_size(ev);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: an event of %zu bytes", tb->path, n);
  tessera__tb__event__pack(ev, buf);
  ts_status st = write_record(tb, buf, n);
  free(buf);
  return st;
}

/* mkdir -p of dir's last two levels (DIR and its parent). */
static ts_status make_dir(const char *dir) {
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    if (mkdir(parent, 0777) != 0 && errno != EEXIST)
      return ts_set_error(TS_ERR_IO, "`tensorboard_dir` %s: cannot create %s: %s", dir, parent,
                          strerror(errno));
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return ts_set_error(TS_ERR_IO, "`tensorboard_dir` %s: cannot create it: %s", dir, strerror(errno));
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return ts_set_error(TS_ERR_IO, "`tensorboard_dir` %s: not a folder, expected a folder for the "
                        "event file", dir);
  return TS_OK;
}

ts_status ts_tensorboard_open(ts_tensorboard **out, const char *dir) {
  *out = NULL;
  TS_CHECK(make_dir(dir));
  ts_tensorboard *tb = calloc(1, sizeof *tb);
  if (!tb) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "tensorboard writer");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%d.tessera", dir,
           (long long)time(NULL), host, (int)getpid());
  tb->f = fopen(tb->path, "wbx"); /* a new file: never another run's */
  if (!tb->f) {
    ts_status st = ts_set_error(TS_ERR_IO, "%s: cannot create: %s", tb->path, strerror(errno));
    free(tb);
    return st;
  }
  Tessera__Tb__Event ev = TESSERA__TB__EVENT__INIT;
  ev.wall_time = wall_time();
  ev.what_case = TESSERA__TB__EVENT__WHAT_FILE_VERSION;
  ev.file_version = (char *)"brain.Event:2";
  ts_status st = write_event(tb, &ev);
  if (st == TS_OK) st = ts_tensorboard_flush(tb);
  if (st != TS_OK) {
    ts_tensorboard_close(tb);
    return st;
  }
  *out = tb;
  return TS_OK;
}

ts_status ts_tensorboard_scalar(ts_tensorboard *tb, const char *tag, int64_t step, double value) {
  Tessera__Tb__Summary__Value v = TESSERA__TB__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag;
  v.value_case = TESSERA__TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v.simple_value = (float)value;
  Tessera__Tb__Summary__Value *vs[1] = {&v};
  Tessera__Tb__Summary sum = TESSERA__TB__SUMMARY__INIT;
  sum.n_value = 1;
  sum.value = vs;
  Tessera__Tb__Event ev = TESSERA__TB__EVENT__INIT;
  ev.wall_time = wall_time();
  ev.step = step;
  ev.what_case = TESSERA__TB__EVENT__WHAT_SUMMARY;
  ev.summary = &sum;
  return write_event(tb, &ev);
}

ts_status ts_tensorboard_flush(ts_tensorboard *tb) {
  if (fflush(tb->f) != 0)
    return ts_set_error(TS_ERR_IO, "%s: write failed: %s", tb->path, strerror(errno));
  return TS_OK;
}

const char *ts_tensorboard_path(const ts_tensorboard *tb) { return tb->path; }

void ts_tensorboard_close(ts_tensorboard *tb) {
  if (!tb) return;
  if (tb->f) fclose(tb->f);
  free(tb);
}

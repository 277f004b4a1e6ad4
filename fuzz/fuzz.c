/* fuzz.c — the fuzz targets' shared helpers (fuzz.h). */
#include "fuzz/fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *ts_fuzz_file(const char *name, const uint8_t *data, size_t size) {
  static char path[4096];
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/ts-fuzz-%d-%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  size_t w = size ? fwrite(data, 1, size, f) : 0;
  int ok = fclose(f) == 0 && w == size;
  return ok ? path : NULL;
}

char *ts_fuzz_text(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) return NULL;
  if (size) memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

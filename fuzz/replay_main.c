/*
 * replay_main.c — a fuzz target without libFuzzer, for the test suite (gcc,
 * and `--config=asan`): runs LLVMFuzzerTestOneInput on every seed file
 * named on the command line (files, or folders of them) and on inputs
 * derived from each, deterministically: every prefix length up to 64
 * bytes, then 64 more spread over the file; and 256 single-byte changes
 * (a bit flipped, a byte set to 0, 0xff, '"', '}', '-', '9') at positions
 * of a fixed xorshift stream. A crash ends the process (the test fails);
 * otherwise it prints "N inputs from S seeds, no crash" and exits 0; no
 * seed at all is exit 1 (a test that ran nothing must fail).
 *   replay SEED_OR_FOLDER...
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz/fuzz.h"

static size_t inputs, seeds;

static void run(const uint8_t *d, size_t n) {
  LLVMFuzzerTestOneInput(d, n);
  inputs++;
}

static void replay(const uint8_t *d, size_t n) {
  seeds++;
  run(d, n);
  for (size_t k = 0; k < n && k < 64; k++) run(d, k);
  for (size_t j = 1; n > 64 && j <= 64; j++) run(d, 64 + (n - 64) * j / 65);
  if (n == 0) return;
  uint8_t *m = malloc(n);
  if (!m) return;
  static const uint8_t set[] = {0x00, 0xff, '"', '}', '-', '9'};
  uint64_t x = 0x9e3779b97f4a7c15ull ^ n;
  for (int i = 0; i < 256; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(m, d, n);
    size_t at = (size_t)(x % n);
    int how = (int)((x >> 32) % 7);
    m[at] = how == 6 ? (uint8_t)(m[at] ^ (1u << ((x >> 40) % 8))) : set[how];
    run(m, n);
  }
  free(m);
}

static int replay_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) return fprintf(stderr, "replay: %s: no such file\n", path), 1;
  if (S_ISDIR(sb.st_mode)) {
    DIR *dir = opendir(path);
    struct dirent *e;
    int rc = 0;
    while (dir && (e = readdir(dir)))
      if (e->d_name[0] != '.') {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        rc |= replay_path(sub);
      }
    if (dir) closedir(dir);
    return rc;
  }
  FILE *f = fopen(path, "rb");
  uint8_t *buf = malloc((size_t)sb.st_size + 1);
  size_t n = f && buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
  if (f) fclose(f);
  if (!buf || n != (size_t)sb.st_size)
    return free(buf), fprintf(stderr, "replay: %s: unreadable\n", path), 1;
  replay(buf, n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int rc = 0;
  for (int i = 1; i < argc; i++) rc |= replay_path(argv[i]);
  if (rc || seeds == 0) {
    fprintf(stderr, "replay: no seeds read\n");
    return 1;
  }
  printf("%zu inputs from %zu seeds, no crash\n", inputs, seeds);
  return 0;
}

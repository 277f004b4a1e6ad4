/* token_file_fuzz.c — a token shard (llm.c's layout, engine/token_file.h)
 * from any bytes: the 1 KiB header's magic, version and count against the
 * file's size, every id against the vocabulary. An accepted file's first
 * and last token are read. */
#include <stdint.h>

#include "engine/token_file.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = ts_fuzz_file("train.bin", data, size);
  ts_token_file *tf = NULL;
  if (!path || ts_token_file_open(&tf, path, 70000) != TS_OK) return 0;
  size_t n = ts_token_file_num_tokens(tf);
  if (n && (ts_token_file_token(tf, 0) >= 70000 || ts_token_file_token(tf, n - 1) >= 70000))
    __builtin_trap();
  ts_token_file_close(tf);
  return 0;
}

/* safetensors_fuzz.c — models/safetensors.h's reader on any bytes as a
 * .safetensors file: the header's length, JSON, dtypes, shapes and data
 * offsets. An accepted file's every tensor is touched at its first and last
 * byte, so a range outside the mapping is a sanitizer's report. */
#include <stdint.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "models/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = ts_fuzz_file("model.safetensors", data, size);
  ts_safetensors *st = NULL;
  if (!path || ts_safetensors_open(&st, path) != TS_OK) return 0;
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < ts_safetensors_count(st); i++) {
    ts_safetensors_tensor t;
    if (ts_safetensors_find(st, ts_safetensors_name(st, i), &t) != TS_OK) __builtin_trap();
    if (t.nbytes) sink ^= ((const uint8_t *)t.data)[0] ^ ((const uint8_t *)t.data)[t.nbytes - 1];
  }
  (void)ts_safetensors_metadata(st, "format");
  ts_safetensors_close(st);
  (void)sink;
  return 0;
}

/* meta_fuzz.c — a data folder's meta.json (tessera prepare's) through
 * ts_data_meta_parse: its type checks, the masked-LM special ids. */
#include <stdint.h>

#include "engine/mlm.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ts_data_meta m;
  if (ts_data_meta_parse((const char *)data, size, "fuzz/meta.json", &m) == TS_OK &&
      (m.vocab_size == 0 || (m.mlm && m.spec.n_special != 5)))
    __builtin_trap();
  return 0;
}

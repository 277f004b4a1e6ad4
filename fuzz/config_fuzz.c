/* config_fuzz.c — a Hugging Face config.json of either family (its
 * model_type or architectures picks LLaMA or BERT) through ts_model_parse:
 * every field's type and range, the sizes' invariants, the units built.
 * An accepted model's units are walked and its FLOPs computed. */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz/fuzz.h"
#include "models/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = ts_fuzz_text(data, size);
  if (!text) return 0;
  ts_model m;
  if (ts_model_parse(text, "fuzz/config.json", &m) == TS_OK) {
    size_t n = 0;
    for (int u = 0; u < m.n_units; u++) n += m.units[u].numel;
    if (n != m.num_params && m.units[m.n_units - 1].tied_unit < 0) __builtin_trap();
    (void)ts_model_flops_per_token(&m, 1);
    ts_model_free(&m);
  }
  free(text);
  return 0;
}

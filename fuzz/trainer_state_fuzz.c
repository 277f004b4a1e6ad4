/* trainer_state_fuzz.c — a checkpoint's trainer.json through the parser
 * resume trusts (engine/trainer_state.h), against a fixed index (step 2,
 * fp32, ZeRO 0, one rank, data seed 1337). What it accepts is consistent
 * with that index. */
#include <stdint.h>

#include "engine/trainer_state.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ts_checkpoint_info info = {.dtype = "fp32",
                             .zero_stage = 0,
                             .dp = 1,
                             .pipeline = 1,
                             .world = 1,
                             .optimizer_step = 2,
                             .attempts = 2,
                             .data_seed = 1337};
  ts_trainer_state s;
  if (ts_trainer_state_parse((const char *)data, size, "fuzz", &info, &s) == TS_OK &&
      (s.step != 2 || s.steps < s.step || s.global_batch == 0 || s.data_seed != 1337))
    __builtin_trap();
  return 0;
}

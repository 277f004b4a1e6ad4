/* checkpoint_index_fuzz.c — a checkpoint's index.json through the parser
 * resume trusts (engine/checkpoint_index.h): the version and the digest,
 * then, resealed as a lying writer would (a mutation almost never keeps
 * the seal), every field's type, range and consistency, the slices'
 * geometry and the writer's order. Whatever it accepts must keep its
 * invariants: each tensor's slices in their files. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "engine/checkpoint_index.h"
#include "fuzz/fuzz.h"

/* Parses root; traps if an accepted index breaks its invariants. */
static void parse(const cJSON *root) {
  ck_index ix;
  if (ts_checkpoint_index_parse(&ix, "fuzz", root) != TS_OK) return;
  for (size_t t = 0; t < ix.n_tensors; t++)
    for (int k = 0; k < TS_CHECKPOINT_NUM_KINDS; k++)
      for (int s = 0; s < ix.tensors[t].n[k]; s++) {
        const ck_slice *sl = &ix.tensors[t].slices[k][s];
        size_t bytes = (sl->end - sl->begin) * (size_t)ix.tensors[t].es[k];
        if (sl->file < 0 || sl->file >= ix.n_files ||
            sl->offset + bytes > ix.files[sl->file].bytes)
          __builtin_trap();
      }
  ts_checkpoint_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cJSON *root = cJSON_ParseWithLength((const char *)data, size);
  if (!root) return 0;
  parse(root); /* as it is: the seal */
  char hex[TS_SHA256_HEX];
  if (cJSON_IsObject(root) && ts_checkpoint_index_digest(root, hex) == TS_OK) {
    cJSON_DeleteItemFromObjectCaseSensitive(root, "digest");
    cJSON_AddStringToObject(root, "digest", hex);
    parse(root); /* resealed: the fields */
  }
  cJSON_Delete(root);
  return 0;
}

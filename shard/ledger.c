/* ledger.c — the charging allocator behind the memory ledger.
 * Each block carries a 64-byte header {magic, category, nbytes} in front of
 * the returned pointer, so free needs only the pointer. A plan ledger
 * allocates the header alone. */
#include "shard/ledger.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HEADER_BYTES 64
#define LEDGER_MAGIC 0x7e55e1a1edce4ull

typedef struct block_header {
  uint64_t magic;  /* LEDGER_MAGIC while live */
  uint64_t category;
  uint64_t nbytes; /* bytes charged */
} block_header;

const char *ts_mem_category_name(ts_mem_category c) {
  static const char *names[TS_MEM_NUM_CATEGORIES] = {
      "params", "grads", "master", "optim", "activations", "comm", "workspace"};
  return (unsigned)c < TS_MEM_NUM_CATEGORIES ? names[c] : "?";
}

void ts_ledger_init(ts_ledger *ledger) { memset(ledger, 0, sizeof *ledger); }

void ts_ledger_init_plan(ts_ledger *ledger) {
  ts_ledger_init(ledger);
  ledger->plan_only = 1;
}

ts_status ts_ledger_alloc(ts_ledger *ledger, ts_mem_category c, size_t nbytes, void **out) {
  *out = NULL;
  if ((unsigned)c >= TS_MEM_NUM_CATEGORIES)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ledger: category %d: expected 0..%d", (int)c,
                        TS_MEM_NUM_CATEGORIES - 1);
  size_t total = HEADER_BYTES + ((nbytes + 63) & ~(size_t)63);
  if (ledger->plan_only) total = HEADER_BYTES; /* the header alone: sizes, no memory */
  else if (total < nbytes)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ledger: %zu bytes of %s overflow size_t", nbytes,
                        ts_mem_category_name(c));
  void *raw = aligned_alloc(64, total);
  if (!raw)
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ledger: cannot allocate %zu bytes of %s", nbytes,
                        ts_mem_category_name(c));
  memset(raw, 0, total);
  block_header *h = (block_header *)raw;
  h->magic = LEDGER_MAGIC;
  h->category = (uint64_t)c;
  h->nbytes = nbytes;
  ledger->current[c] += nbytes;
  if (ledger->current[c] > ledger->peak[c]) ledger->peak[c] = ledger->current[c];
  ledger->current_total += nbytes;
  if (ledger->current_total > ledger->peak_total) ledger->peak_total = ledger->current_total;
  *out = (char *)raw + HEADER_BYTES;
  return TS_OK;
}

void ts_ledger_free(ts_ledger *ledger, void *p) {
  if (!p) return;
  block_header *h = (block_header *)((char *)p - HEADER_BYTES);
  TS_ASSERT(h->magic == LEDGER_MAGIC);
  TS_ASSERT(ledger->current[h->category] >= h->nbytes);
  ledger->current[h->category] -= h->nbytes;
  ledger->current_total -= h->nbytes;
  h->magic = 0;
  free(h);
}

size_t ts_ledger_model_state_bytes(const ts_ledger *ledger) {
  return ledger->current[TS_MEM_PARAMS] + ledger->current[TS_MEM_GRADS] +
         ledger->current[TS_MEM_MASTER] + ledger->current[TS_MEM_OPTIM];
}

size_t ts_ledger_size(const void *p) {
  if (!p) return 0;
  const block_header *h = (const block_header *)((const char *)p - HEADER_BYTES);
  TS_ASSERT(h->magic == LEDGER_MAGIC);
  return (size_t)h->nbytes;
}

/*
 * ledger.h — the memory ledger: every byte tessera allocates for training is
 * charged to one category, with current and peak bytes per category and in
 * total, per rank (DESIGN.md "The memory ledger").
 *
 * Invariants: the ledger charges exactly the bytes requested (the allocator's
 * own 64-byte header and alignment slack are not model state and are not
 * charged); current[c] is the sum of live allocations of category c; peak[c]
 * is the largest current[c] ever seen; peak_total is the largest sum over
 * categories seen at one time (not the sum of per-category peaks).
 * A ledger is a plain struct owned by its creator; it is not thread-safe.
 */
#ifndef TS_SHARD_LEDGER_H
#define TS_SHARD_LEDGER_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ledger categories. Values are stable: they index arrays and JSON output. */
typedef enum ts_mem_category {
  TS_MEM_PARAMS = 0,      /* compute parameters (full or shard, compute dtype) */
  TS_MEM_GRADS = 1,       /* gradients (compute dtype) */
  TS_MEM_MASTER = 2,      /* fp32 master weights (mixed precision only) */
  TS_MEM_OPTIM = 3,       /* optimizer state: Adam m and v, fp32 */
  TS_MEM_ACTIVATIONS = 4, /* unit inputs and saved activations */
  TS_MEM_COMM = 5,        /* communication buffers */
  TS_MEM_WORKSPACE = 6,   /* kernel and unit scratch */
  TS_MEM_NUM_CATEGORIES = 7,
} ts_mem_category;

typedef struct ts_ledger {
  size_t current[TS_MEM_NUM_CATEGORIES]; /* bytes live now, per category */
  size_t peak[TS_MEM_NUM_CATEGORIES];    /* largest current[c] seen, bytes */
  size_t current_total;                  /* sum of current[], bytes */
  size_t peak_total;                     /* largest current_total seen, bytes */
  int plan_only;                         /* 1: charge without allocating (ts_ledger_init_plan) */
} ts_ledger;

/* Short stable name of a category for tables and JSON: "params", "grads",
 * "master", "optim", "activations", "comm", "workspace". */
const char *ts_mem_category_name(ts_mem_category c);

/* Zeroes all counters. */
void ts_ledger_init(ts_ledger *ledger);

/* Zeroes all counters and makes the ledger a plan: ts_ledger_alloc charges
 * nbytes exactly as it would and returns a pointer that frees and sizes
 * like a real block but addresses no memory (only a 64-byte header is
 * allocated; the caller must not read or write through it). The engine's
 * memory estimate (ts_engine_plan) replays its allocations on such a
 * ledger, so the estimate is the allocation plan itself. */
void ts_ledger_init_plan(ts_ledger *ledger);

/* Allocates nbytes of host memory, 64-byte aligned and zero-filled, and
 * charges them to category c. nbytes == 0 yields a valid unique pointer that
 * charges nothing. *out receives the pointer, or NULL on failure.
 * Returns TS_OK, TS_ERR_INVALID_ARGUMENT (bad category), or
 * TS_ERR_OUT_OF_MEMORY (message names the category and the bytes). */
ts_status ts_ledger_alloc(ts_ledger *ledger, ts_mem_category c, size_t nbytes, void **out);

/* Releases p (from ts_ledger_alloc on the same ledger) and uncharges its
 * bytes. p == NULL is a no-op. */
void ts_ledger_free(ts_ledger *ledger, void *p);

/* Model states allocated now: current params + grads + master + optim
 * bytes (what the ZeRO paper's per-rank formulas count). */
size_t ts_ledger_model_state_bytes(const ts_ledger *ledger);

/* Bytes that p was charged (0 for NULL). */
size_t ts_ledger_size(const void *p);

#ifdef __cplusplus
}
#endif

#endif /* TS_SHARD_LEDGER_H */

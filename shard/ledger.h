/*
 * ledger.h — the memory ledger: every byte tessera allocates for training is
 * charged to one category on one device, with current and peak bytes per
 * category and in total, per device, per rank (DESIGN.md "The memory
 * ledger and the plan").
 *
 * The accounting lives in a side table (block address -> bytes, category,
 * device), never in a header in front of the block, so the same ledger
 * charges host memory and device memory alike: the blocks come from the
 * kernels' allocator of their device (ts_k_alloc), zero-filled.
 *
 * Invariants: the ledger charges exactly the bytes requested (alignment
 * slack is not model state and is not charged); current[c] is the sum of
 * live blocks of category c on that device; peak[c] is the largest
 * current[c] ever seen; peak_total is the largest sum over categories seen
 * at one time (not the sum of per-category peaks).
 *
 * Ownership: a ts_ledger owns its side table; it is used through a pointer
 * and never copied (copy a ts_mem_account instead: plain counters). It is
 * not thread-safe.
 */
#ifndef TS_SHARD_LEDGER_H
#define TS_SHARD_LEDGER_H

#include <stddef.h>
#include <stdint.h>

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
  TS_MEM_STAGING = 7,     /* host copy of a rank's checkpoint for an asynchronous save */
  TS_MEM_NUM_CATEGORIES = 8,
} ts_mem_category;

/* The counters of one device: plain values, copyable (a plan's result, a
 * run's summary). */
typedef struct ts_mem_account {
  size_t current[TS_MEM_NUM_CATEGORIES]; /* bytes live now, per category */
  size_t peak[TS_MEM_NUM_CATEGORIES];    /* largest current[c] seen, bytes */
  size_t current_total;                  /* sum of current[], bytes */
  size_t peak_total;                     /* largest current_total seen, bytes */
} ts_mem_account;

typedef struct ts_ledger_table ts_ledger_table; /* the side table (ledger.c) */

/* Transient blocks of one size on one device (ts_ledger_alloc_transient):
 * how many are in use and the most ever in use at once. */
enum { TS_LEDGER_TRANSIENT_SIZES = 32, TS_LEDGER_CACHE = 64 };
typedef struct ts_ledger_transient {
  size_t nbytes;  /* 0: unused entry */
  uint8_t device; /* ts_device */
  uint32_t live;  /* in use now */
  uint32_t most;  /* the most in use at once */
} ts_ledger_transient;

/* A freed device transient the ledger keeps for reuse. */
typedef struct ts_ledger_cached {
  void *p; /* NULL: unused entry */
  size_t nbytes;
  uint8_t device;
} ts_ledger_cached;

typedef struct ts_ledger {
  ts_mem_account device[TS_DEVICE_COUNT]; /* counters per device kind */
  int plan_only;                          /* 1: charge without allocating (ts_ledger_init_plan) */
  uintptr_t next_plan_address;            /* plan ledgers: the next made-up address */
  ts_ledger_table *table;                 /* live blocks (owned); NULL until the first */
  ts_ledger_transient transients[TS_LEDGER_TRANSIENT_SIZES]; /* per (device, size) */
  size_t transient_current[TS_DEVICE_COUNT]; /* bytes of transients in use, per device */
  size_t steady_peak[TS_DEVICE_COUNT]; /* largest current_total - transient_current seen */
  ts_ledger_cached cache[TS_LEDGER_CACHE]; /* kept device transients: owned, uncharged */
  ts_mem_account disk; /* bytes in files on a local disk (ts_ledger_charge_disk) */
} ts_ledger;

/* Short stable name of a category for tables and JSON: "params", "grads",
 * "master", "optim", "activations", "comm", "workspace", "staging". */
const char *ts_mem_category_name(ts_mem_category c);

/* An empty ledger that allocates (through ts_k_alloc). */
void ts_ledger_init(ts_ledger *ledger);

/* An empty plan ledger: ts_ledger_alloc charges nbytes exactly as it would
 * and returns a unique made-up address that frees and sizes like a real
 * block but addresses no memory (nothing is allocated; the caller must not
 * read or write through it). The engine's memory estimate (ts_engine_plan)
 * replays its allocations on such a ledger, so the estimate is the
 * allocation plan itself. */
void ts_ledger_init_plan(ts_ledger *ledger);

/* Frees the side table. Every block must have been freed (asserted: a
 * leak is a bug). The ledger may then be initialised again. */
void ts_ledger_release(ts_ledger *ledger);

/* Allocates nbytes on device dev, zero-filled and 64-byte aligned, and
 * charges them to category c of that device. *out receives the pointer, or
 * NULL on failure; nbytes == 0 gives NULL and charges nothing.
 * Returns TS_OK, TS_ERR_INVALID_ARGUMENT (bad category or device), or the
 * allocator's status (TS_ERR_OUT_OF_MEMORY, TS_ERR_CUDA) with a message
 * naming the bytes, the category and the allocator's own words ("cpu:
 * cannot allocate ... of host memory"). */
ts_status ts_ledger_alloc(ts_ledger *ledger, ts_device dev, ts_mem_category c, size_t nbytes,
                          void **out);

/* Releases p (from ts_ledger_alloc on the same ledger) and uncharges its
 * bytes. p == NULL is a no-op; any other unknown p is a bug (asserted). */
void ts_ledger_free(ts_ledger *ledger, void *p);

/* Bytes that p was charged (0 for NULL; asserted to be a live block). */
size_t ts_ledger_size(const ts_ledger *ledger, const void *p);

/* A transient block: one the step allocates and frees again every time
 * (ZeRO-3's gathered parameters, ZeRO-2/3's full gradients), charged like
 * any block while in use. On a device other than the CPU a freed transient
 * is kept (uncharged: ts_ledger_cached_bytes) and handed out again to the
 * next transient of the same size and device, so that a step allocates
 * nothing; CPU transients are plain blocks. A block handed out again is NOT
 * zeroed: the caller overwrites it whole or zeroes it on its own stream
 * (ts_k_zero). Every ledger counts, per (device, size), the transients in
 * use and the most at once: a plan ledger's counts are what
 * ts_ledger_reserve_transients reserves. Errors as ts_ledger_alloc. */
ts_status ts_ledger_alloc_transient(ts_ledger *ledger, ts_device dev, ts_mem_category c,
                                    size_t nbytes, void **out);
/* Ends a transient's use (NULL: no-op); p from ts_ledger_alloc_transient. */
void ts_ledger_free_transient(ts_ledger *ledger, void *p);
/* Allocates, into ledger's cache (uncharged), as many blocks of each
 * (device, size) as plan had transients of it in use at once, minus those
 * cached already; the CPU's are skipped. Errors as ts_ledger_alloc. */
ts_status ts_ledger_reserve_transients(ts_ledger *ledger, const ts_ledger *plan);
/* Bytes of dev's transients the ledger keeps for reuse (not charged). */
size_t ts_ledger_cached_bytes(const ts_ledger *ledger, ts_device dev);
/* What a device holds at most when the transients of plan are reserved
 * (ts_ledger_reserve_transients): the largest sum of its other blocks at
 * any moment, plus every reserved transient, bytes. Not plan's peak_total,
 * which counts only the transients in use at its peak. */
size_t ts_ledger_reserved_peak(const ts_ledger *plan, ts_device dev);

/* Disk-resident state (an offload folder's scratch file, engine/
 * offload.h): charges nbytes to category c of the ledger's disk account,
 * or (discharge) takes them off again (asserted: no more than charged).
 * Nothing is allocated: the caller owns the file. A plan ledger charges
 * the same. */
void ts_ledger_charge_disk(ts_ledger *ledger, ts_mem_category c, size_t nbytes);
void ts_ledger_discharge_disk(ts_ledger *ledger, ts_mem_category c, size_t nbytes);
/* The disk account's counters. */
const ts_mem_account *ts_ledger_disk_account(const ts_ledger *ledger);

/* The counters of device dev (asserted in range). */
const ts_mem_account *ts_ledger_account(const ts_ledger *ledger, ts_device dev);

/* Model states in an account now: current params + grads + master + optim
 * bytes (what the ZeRO paper's per-rank formulas count). */
size_t ts_mem_model_state_bytes(const ts_mem_account *a);

#ifdef __cplusplus
}
#endif

#endif /* TS_SHARD_LEDGER_H */

/* ledger.c — the charging allocator behind the memory ledger (ledger.h).
 *
 * The side table is an open-addressing hash map from block address to
 * (bytes, category, device), linear probing, kept at most half full, with
 * backward-shift deletion (no tombstones). Blocks come from ts_k_alloc on
 * their device; a plan ledger makes up addresses instead (each block its
 * own 256-aligned range, a gap between blocks: never dereferenced). */
#include "shard/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "kernels/kernels.h"

typedef struct entry {
  uintptr_t key;   /* block address; 0: empty slot */
  size_t nbytes;   /* bytes charged */
  uint8_t category; /* ts_mem_category */
  uint8_t device;  /* ts_device */
} entry;

struct ts_ledger_table {
  entry *slots; /* (cap,) */
  size_t cap;   /* a power of two */
  size_t n;     /* live entries */
};

const char *ts_mem_category_name(ts_mem_category c) {
  static const char *names[TS_MEM_NUM_CATEGORIES] = {
      "params", "grads", "master", "optim", "activations", "comm", "workspace", "staging"};
  return (unsigned)c < TS_MEM_NUM_CATEGORIES ? names[c] : "?";
}

void ts_ledger_init(ts_ledger *ledger) { memset(ledger, 0, sizeof *ledger); }

void ts_ledger_init_plan(ts_ledger *ledger) {
  ts_ledger_init(ledger);
  ledger->plan_only = 1;
}

void ts_ledger_release(ts_ledger *ledger) {
  for (int i = 0; i < TS_LEDGER_CACHE; i++) {
    ts_ledger_cached *c = &ledger->cache[i];
    if (c->p && !ledger->plan_only) ts_k_free((ts_device)c->device, c->p);
    c->p = NULL;
  }
  if (ledger->table) {
    TS_ASSERT(ledger->table->n == 0); /* every block freed */
    free(ledger->table->slots);
    free(ledger->table);
  }
  ledger->table = NULL;
}

/* Home slot of key k in a table of cap slots (splitmix64's mixer of the
 * address, base/rng.h). */
static size_t home(uintptr_t k, size_t cap) { return (size_t)ts_mix64((uint64_t)k) & (cap - 1); }

/* The slot holding key k, or the empty slot where it would go. */
static size_t probe(const ts_ledger_table *t, uintptr_t k) {
  size_t i = home(k, t->cap);
  while (t->slots[i].key != 0 && t->slots[i].key != k) i = (i + 1) & (t->cap - 1);
  return i;
}

/* Makes room for one more entry (allocates the table on first use,
 * doubles it past half full). */
static ts_status reserve(ts_ledger *ledger) {
  ts_ledger_table *t = ledger->table;
  if (t && 2 * (t->n + 1) <= t->cap) return TS_OK;
  size_t cap = t ? 2 * t->cap : 64;
  entry *slots = calloc(cap, sizeof *slots);
  if (!slots) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ledger: cannot grow the block table");
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t) {
      free(slots);
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ledger: cannot allocate the block table");
    }
    ledger->table = t;
  }
  ts_ledger_table grown = {slots, cap, t->n};
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i].key) grown.slots[probe(&grown, t->slots[i].key)] = t->slots[i];
  free(t->slots);
  *t = grown;
  return TS_OK;
}

/* Records block p, already allocated, as live in the table and the
 * accounts (ts_ledger_alloc's bookkeeping). */
static ts_status charge(ts_ledger *ledger, ts_device dev, ts_mem_category c, size_t nbytes,
                        void *p) {
  TS_CHECK(reserve(ledger));
  ts_ledger_table *t = ledger->table;
  entry *e = &t->slots[probe(t, (uintptr_t)p)];
  TS_ASSERT(e->key == 0);
  *e = (entry){(uintptr_t)p, nbytes, (uint8_t)c, (uint8_t)dev};
  t->n++;
  ts_mem_account *a = &ledger->device[dev];
  a->current[c] += nbytes;
  if (a->current[c] > a->peak[c]) a->peak[c] = a->current[c];
  a->current_total += nbytes;
  if (a->current_total > a->peak_total) a->peak_total = a->current_total;
  size_t steady = a->current_total - ledger->transient_current[dev];
  if (steady > ledger->steady_peak[dev]) ledger->steady_peak[dev] = steady;
  return TS_OK;
}

ts_status ts_ledger_alloc(ts_ledger *ledger, ts_device dev, ts_mem_category c, size_t nbytes,
                          void **out) {
  *out = NULL;
  if ((unsigned)c >= TS_MEM_NUM_CATEGORIES)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ledger: category %d: expected 0..%d", (int)c,
                        TS_MEM_NUM_CATEGORIES - 1);
  if ((unsigned)dev >= TS_DEVICE_COUNT)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "ledger: device %d: expected 0..%d", (int)dev,
                        TS_DEVICE_COUNT - 1);
  if (nbytes == 0) return TS_OK;
  if (nbytes > SIZE_MAX - 512) /* room for a plan block's rounding and gap */
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "ledger: %zu bytes of %s overflow size_t", nbytes,
                        ts_mem_category_name(c));
  TS_CHECK(reserve(ledger));
  void *p = NULL;
  if (ledger->plan_only) {
    /* the block's own range, 256-aligned, with a gap before the next: no
     * two blocks (nor one's end and another's start) share an address, so
     * the kernels' aliasing checks see what a real run's would */
    ledger->next_plan_address += 256;
    p = (void *)ledger->next_plan_address;
    ledger->next_plan_address += (nbytes + 255) & ~(size_t)255;
  } else {
    ts_status st = ts_k_alloc(dev, nbytes, &p);
    if (st != TS_OK) { /* the allocator's status, its message after the category */
      char why[512];
      snprintf(why, sizeof why, "%s", ts_last_error());
      return ts_set_error(st, "ledger: %zu bytes of %s: %s", nbytes, ts_mem_category_name(c), why);
    }
  }
  TS_CHECK(charge(ledger, dev, c, nbytes, p)); /* cannot fail: the table has room */
  *out = p;
  return TS_OK;
}

/* Uncharges live block p and drops it from the table; returns its entry. */
static entry forget(ts_ledger *ledger, void *p) {
  ts_ledger_table *t = ledger->table;
  TS_ASSERT(t != NULL);
  size_t i = probe(t, (uintptr_t)p);
  entry e = t->slots[i];
  TS_ASSERT(e.key == (uintptr_t)p); /* not a block of this ledger */
  ts_mem_account *a = &ledger->device[e.device];
  TS_ASSERT(a->current[e.category] >= e.nbytes);
  a->current[e.category] -= e.nbytes;
  a->current_total -= e.nbytes;
  /* Backward-shift deletion: pull later entries of the run into the hole
   * when their home slot does not lie strictly between the hole and them. */
  size_t hole = i, j = i;
  for (;;) {
    j = (j + 1) & (t->cap - 1);
    if (t->slots[j].key == 0) break;
    size_t h = home(t->slots[j].key, t->cap);
    int between = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (!between) {
      t->slots[hole] = t->slots[j];
      hole = j;
    }
  }
  t->slots[hole].key = 0;
  t->n--;
  return e;
}

void ts_ledger_free(ts_ledger *ledger, void *p) {
  if (!p) return;
  entry e = forget(ledger, p);
  if (!ledger->plan_only) ts_k_free((ts_device)e.device, p);
}

size_t ts_ledger_size(const ts_ledger *ledger, const void *p) {
  if (!p) return 0;
  const ts_ledger_table *t = ledger->table;
  TS_ASSERT(t != NULL);
  const entry *e = &t->slots[probe(t, (uintptr_t)p)];
  TS_ASSERT(e->key == (uintptr_t)p);
  return e->nbytes;
}

void ts_ledger_charge_disk(ts_ledger *ledger, ts_mem_category c, size_t nbytes) {
  TS_ASSERT((unsigned)c < TS_MEM_NUM_CATEGORIES);
  ts_mem_account *a = &ledger->disk;
  a->current[c] += nbytes;
  if (a->current[c] > a->peak[c]) a->peak[c] = a->current[c];
  a->current_total += nbytes;
  if (a->current_total > a->peak_total) a->peak_total = a->current_total;
}

void ts_ledger_discharge_disk(ts_ledger *ledger, ts_mem_category c, size_t nbytes) {
  TS_ASSERT((unsigned)c < TS_MEM_NUM_CATEGORIES);
  ts_mem_account *a = &ledger->disk;
  TS_ASSERT(a->current[c] >= nbytes);
  a->current[c] -= nbytes;
  a->current_total -= nbytes;
}

const ts_mem_account *ts_ledger_disk_account(const ts_ledger *ledger) { return &ledger->disk; }

const ts_mem_account *ts_ledger_account(const ts_ledger *ledger, ts_device dev) {
  TS_ASSERT((unsigned)dev < TS_DEVICE_COUNT);
  return &ledger->device[dev];
}

size_t ts_mem_model_state_bytes(const ts_mem_account *a) {
  return a->current[TS_MEM_PARAMS] + a->current[TS_MEM_GRADS] + a->current[TS_MEM_MASTER] +
         a->current[TS_MEM_OPTIM];
}

/* ---- transients ------------------------------------------------------------ */

/* The profile entry of (dev, nbytes), made if absent; NULL when the table
 * is full (the profile is then incomplete: a reserve falls short and the
 * step allocates, which stays correct). */
static ts_ledger_transient *profile(ts_ledger *ledger, ts_device dev, size_t nbytes) {
  ts_ledger_transient *free_slot = NULL;
  for (int i = 0; i < TS_LEDGER_TRANSIENT_SIZES; i++) {
    ts_ledger_transient *t = &ledger->transients[i];
    if (t->nbytes == nbytes && t->device == (uint8_t)dev) return t;
    if (t->nbytes == 0 && !free_slot) free_slot = t;
  }
  if (free_slot) *free_slot = (ts_ledger_transient){nbytes, (uint8_t)dev, 0, 0};
  return free_slot;
}

/* Takes a cached block of (dev, nbytes) out of the cache, or NULL. */
static void *take_cached(ts_ledger *ledger, ts_device dev, size_t nbytes) {
  for (int i = 0; i < TS_LEDGER_CACHE; i++) {
    ts_ledger_cached *c = &ledger->cache[i];
    if (c->p && c->nbytes == nbytes && c->device == (uint8_t)dev) {
      void *p = c->p;
      c->p = NULL;
      return p;
    }
  }
  return NULL;
}

/* Keeps p in the cache; 0 when the cache is full. */
static int put_cached(ts_ledger *ledger, ts_device dev, size_t nbytes, void *p) {
  for (int i = 0; i < TS_LEDGER_CACHE; i++) {
    ts_ledger_cached *c = &ledger->cache[i];
    if (!c->p) {
      *c = (ts_ledger_cached){p, nbytes, (uint8_t)dev};
      return 1;
    }
  }
  return 0;
}

ts_status ts_ledger_alloc_transient(ts_ledger *ledger, ts_device dev, ts_mem_category c,
                                    size_t nbytes, void **out) {
  *out = NULL;
  if (nbytes == 0 || (unsigned)c >= TS_MEM_NUM_CATEGORIES || (unsigned)dev >= TS_DEVICE_COUNT)
    return ts_ledger_alloc(ledger, dev, c, nbytes, out); /* its checks, its messages */
  void *p = NULL;
  if (dev != TS_DEVICE_CPU && !ledger->plan_only) p = take_cached(ledger, dev, nbytes);
  /* counted as transient before charge() sees it, so the steady peak
   * never includes it */
  ledger->transient_current[dev] += nbytes;
  ts_status st = p ? charge(ledger, dev, c, nbytes, p) : ts_ledger_alloc(ledger, dev, c, nbytes, &p);
  if (st != TS_OK) {
    ledger->transient_current[dev] -= nbytes;
    if (p) put_cached(ledger, dev, nbytes, p);
    return st;
  }
  ts_ledger_transient *t = profile(ledger, dev, nbytes);
  if (t && ++t->live > t->most) t->most = t->live;
  *out = p;
  return TS_OK;
}

void ts_ledger_free_transient(ts_ledger *ledger, void *p) {
  if (!p) return;
  entry e = forget(ledger, p);
  ledger->transient_current[e.device] -= e.nbytes;
  ts_ledger_transient *pr = profile(ledger, (ts_device)e.device, e.nbytes);
  if (pr && pr->live > 0) pr->live--;
  if (ledger->plan_only) return;
  if (e.device == TS_DEVICE_CPU || !put_cached(ledger, (ts_device)e.device, e.nbytes, p))
    ts_k_free((ts_device)e.device, p);
}

ts_status ts_ledger_reserve_transients(ts_ledger *ledger, const ts_ledger *plan) {
  for (int i = 0; i < TS_LEDGER_TRANSIENT_SIZES; i++) {
    const ts_ledger_transient *t = &plan->transients[i];
    if (t->nbytes == 0 || t->device == TS_DEVICE_CPU) continue;
    uint32_t have = 0;
    for (int j = 0; j < TS_LEDGER_CACHE; j++)
      have += ledger->cache[j].p && ledger->cache[j].nbytes == t->nbytes &&
              ledger->cache[j].device == t->device;
    for (; have < t->most; have++) {
      void *p = NULL;
      if (!ledger->plan_only) TS_CHECK(ts_k_alloc((ts_device)t->device, t->nbytes, &p));
      if (!p || !put_cached(ledger, (ts_device)t->device, t->nbytes, p)) {
        if (p) ts_k_free((ts_device)t->device, p);
        break; /* cache full (or a plan): the rest is allocated by the step */
      }
    }
  }
  return TS_OK;
}

size_t ts_ledger_cached_bytes(const ts_ledger *ledger, ts_device dev) {
  size_t n = 0;
  for (int i = 0; i < TS_LEDGER_CACHE; i++)
    if (ledger->cache[i].p && ledger->cache[i].device == (uint8_t)dev)
      n += ledger->cache[i].nbytes;
  return n;
}

size_t ts_ledger_reserved_peak(const ts_ledger *plan, ts_device dev) {
  size_t reserved = 0;
  for (int i = 0; i < TS_LEDGER_TRANSIENT_SIZES; i++) {
    const ts_ledger_transient *t = &plan->transients[i];
    if (t->nbytes && t->device == (uint8_t)dev) reserved += (size_t)t->most * t->nbytes;
  }
  return plan->steady_peak[dev] + reserved;
}

/*
 * params.c — the full parameters a unit's forward or backward computes
 * with (DESIGN.md "Flat parameters and shards"): the unit's own buffer
 * when the ZeRO stage keeps parameters whole; when it shards them
 * (stage 3) an all-gather of the shards into a transient (P) buffer,
 * started at first use or ahead of it (opts.overlap: prefetch depth 1),
 * counted by uses and freed at the last release, or held from the unit's
 * first forward to its last backward of the step (opts.keep_gathered).
 * With opts.offload_params the shards are host memory: each gather copies
 * this rank's to its place in the device's buffer, then gathers in place.
 * Part of the forward and backward actions (passes.c); calls nothing of
 * the executor.
 */
#include "engine/observe.h"
#include "engine/params.h"
#include "engine/slices.h"
#include "engine/state.h"
#include "shard/collect.h"

/* Starts the all-gather of unit u's parameter shards into a new full
 * buffer (full_params, a transient; gather_req). On a plan ledger it is
 * charged and the plan group moves nothing. */
static ts_status start_gather(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_PARAMS, s->layout.padded * e->es,
                                     &s->full_params));
  const void *shard = s->params;
  ts_status st = TS_OK;
  if (ts_engine_params_on_host(e)) { /* the host's shard to its place on the device first */
    char *mine = (char *)s->full_params + ts_engine_shard_begin(e, u) * e->es;
    st = ts_k_from_host(&e->ctx, mine, s->params, s->layout.shard * e->es);
    shard = mine; /* an in-place all-gather */
  }
  ts_engine_comm_note(e, u);
  if (st == TS_OK)
    st = ts_shard_iall_gather(e->dp, &s->layout, shard, s->full_params, e->opts.dtype,
                              &s->gather_req);
  if (st != TS_OK) ts_shard_release(&e->ledger, &s->full_params);
  return st;
}

ts_status ts_engine_acquire_params(ts_engine *e, int u, const void **full) {
  unit_state *s = &e->units[u];
  if (!e->zero->shard_params) {
    *full = s->params;
    return TS_OK;
  }
  if (s->holds > 0) {
    s->holds--; /* a use taken ahead (prefetch): this is it */
  } else {
    if (s->uses == 0) TS_CHECK(start_gather(e, u));
    s->uses++;
  }
  TS_CHECK(ts_engine_comm_wait(e, &s->gather_req, TS_SPAN_ALL_GATHER, u));
  *full = s->full_params;
  return TS_OK;
}

ts_status ts_engine_prefetch(ts_engine *e, int u) {
  if (!e->opts.overlap || !e->zero->shard_params || !ts_engine_owns(e, u)) return TS_OK;
  unit_state *s = &e->units[u];
  if (s->holds == 0) {
    if (s->uses == 0) TS_CHECK(start_gather(e, u));
    s->uses++;
    s->holds++;
  }
  int lender = e->model->units[u].tied_unit;
  return lender >= 0 && lender != u ? ts_engine_prefetch(e, lender) : TS_OK;
}

void ts_engine_release_params(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->zero->shard_params && s->uses > 0 && --s->uses == 0)
    ts_shard_release(&e->ledger, &s->full_params);
}

void ts_engine_keep_gathered(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (e->opts.keep_gathered && e->zero->shard_params && e->run.in_micro_batch && !s->kept) {
    s->kept = 1;
    s->uses++;
  }
}

void ts_engine_drop_kept(ts_engine *e, int u) {
  unit_state *s = &e->units[u];
  if (!s->kept) return;
  s->kept = 0;
  ts_engine_release_params(e, u);
}

void ts_engine_drop_gathered(ts_engine *e) {
  for (int u = 0; u < e->model->n_units; u++) ts_engine_drop_kept(e, u);
}

/* collect.c — gather and reduce-scatter of one unit's flat buffer. */
#include "shard/collect.h"

/* The layout is for this group's size (a programmer error otherwise). */
static void check_group(const ts_comm *dp, const ts_flat_layout *l) {
  TS_ASSERT((size_t)ts_comm_size(dp) == l->dp_size);
}

void ts_shard_release(ts_ledger *ledger, void **full) {
  ts_ledger_free_transient(ledger, *full);
  *full = NULL;
}

size_t ts_shard_scratch_bytes(const ts_flat_layout *l, ts_dtype dt) {
  return ts_comm_reduce_scatter_scratch_bytes_n(l->dp_size, l->shard, dt);
}

ts_status ts_shard_iall_gather(ts_comm *dp, const ts_flat_layout *l, const void *shard, void *full,
                               ts_dtype dt, ts_comm_request **req) {
  check_group(dp, l);
  return ts_comm_iall_gather(dp, shard, full, l->shard, dt, req);
}

ts_status ts_shard_ireduce_scatter(ts_comm *dp, const ts_flat_layout *l, const void *full,
                                   void *shard, ts_dtype dt, int accumulate, void *scratch,
                                   size_t scratch_bytes, ts_comm_request **req) {
  check_group(dp, l);
  return ts_comm_ireduce_scatter(dp, full, shard, l->shard, dt, accumulate, scratch, scratch_bytes,
                                 req);
}

/* collect.c — gather and reduce-scatter of one unit's flat buffer. */
#include "shard/collect.h"

/* The layout is for this group's size (a programmer error otherwise). */
static void check_group(const ts_comm *dp, const ts_flat_layout *l) {
  TS_ASSERT((size_t)ts_comm_size(dp) == l->dp_size);
}

ts_status ts_shard_all_gather(ts_comm *dp, const ts_flat_layout *l, const void *shard,
                              void *full, ts_dtype dt) {
  check_group(dp, l);
  return ts_comm_all_gather(dp, shard, full, l->shard, dt);
}

ts_status ts_shard_gather_alloc(ts_ledger *ledger, ts_device dev, ts_mem_category c, ts_comm *dp,
                                const ts_flat_layout *l, const void *shard, ts_dtype dt,
                                void **full) {
  *full = NULL;
  void *buf;
  TS_CHECK(ts_ledger_alloc_transient(ledger, dev, c, l->padded * ts_dtype_size(dt), &buf));
  ts_status st = ts_shard_all_gather(dp, l, shard, buf, dt);
  if (st != TS_OK) {
    ts_ledger_free_transient(ledger, buf);
    return st;
  }
  *full = buf;
  return TS_OK;
}

void ts_shard_release(ts_ledger *ledger, void **full) {
  ts_ledger_free_transient(ledger, *full);
  *full = NULL;
}

size_t ts_shard_scratch_bytes(const ts_flat_layout *l, ts_dtype dt) {
  return ts_comm_reduce_scatter_scratch_bytes_n(l->dp_size, l->shard, dt);
}

ts_status ts_shard_reduce_scatter(ts_comm *dp, const ts_flat_layout *l, const void *full,
                                  void *shard, ts_dtype dt, int accumulate, void *scratch,
                                  size_t scratch_bytes) {
  check_group(dp, l);
  return ts_comm_reduce_scatter(dp, full, shard, l->shard, dt, accumulate, scratch,
                                scratch_bytes);
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

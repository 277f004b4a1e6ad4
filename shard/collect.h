/*
 * collect.h — a unit's flat buffer moved between its shards and the full
 * buffer: all-gather of parameters before use (and their release), and
 * reduce-scatter of gradients into this rank's shard (DESIGN.md "Flat
 * parameters and shards", "One step").
 *
 * With layout l (padded P, shard S = P / N) and rank r of the data-parallel
 * group dp (N = l->dp_size ranks, asserted equal to the group's size), a
 * full buffer is (P,) elements and a shard (S,) elements of the compute
 * dtype; rank r's shard is elements [r*S, (r+1)*S) of the full buffer.
 * Summation order and byte counts are comm/'s (comm/comm.h): rank order,
 * (N-1) * S elements sent per call.
 */
#ifndef TS_SHARD_COLLECT_H
#define TS_SHARD_COLLECT_H

#include <stddef.h>

#include "comm/comm.h"
#include "base/base.h"
#include "shard/flat.h"
#include "shard/ledger.h"

#ifdef __cplusplus
extern "C" {
#endif

/* All-gathers every rank's shard (S,) into full (P,), both host memory (or
 * the group's lent memory, comm.h), dtype dt; in place when shard == full +
 * r*S. Started here, finished by ts_comm_wait(*req): until then the
 * buffers belong to the call, and on a group with a communication thread
 * (ts_comm_set_thread) the data moves while the caller goes on. Byte counts
 * (N-1) * S * sizeof(dt). comm/'s errors. */
ts_status ts_shard_iall_gather(ts_comm *dp, const ts_flat_layout *l, const void *shard, void *full,
                               ts_dtype dt, ts_comm_request **req);

/* Ends the use of a transient buffer (any ts_ledger_alloc_transient block,
 * e.g. a gathered unit) and sets *full to NULL; NULL *full is a no-op. */
void ts_shard_release(ts_ledger *ledger, void **full);

/* Scratch bytes ts_shard_ireduce_scatter needs for layout l: (N-1) * S
 * elements of dt, N = l->dp_size (no group needed: estimates use it). */
size_t ts_shard_scratch_bytes(const ts_flat_layout *l, ts_dtype dt);

/* Reduce-scatters full (P,) gradients of every rank into this rank's shard
 * (S,): shard = [shard +] sum over ranks, in rank order (accumulate != 0
 * adds the previous shard last); in place when shard == full + r*S.
 * scratch: ts_shard_scratch_bytes bytes. Started here, finished (and
 * summed) by ts_comm_wait(*req), as for the all-gather. Errors as
 * ts_comm_ireduce_scatter. */
ts_status ts_shard_ireduce_scatter(ts_comm *dp, const ts_flat_layout *l, const void *full,
                                   void *shard, ts_dtype dt, int accumulate, void *scratch,
                                   size_t scratch_bytes, ts_comm_request **req);

#ifdef __cplusplus
}
#endif

#endif /* TS_SHARD_COLLECT_H */

/*
 * self.c — the local backend: every group of one rank (ts_comm_self, its
 * splits, and an MPI group that has one rank) runs its calls here (the
 * table is backend.h).
 *
 * Invariants:
 * - No MPI call, ever: ts_comm_self works in a process that never
 *   initialises MPI (comm_self_test checks it).
 * - One rank holds every chunk, so a collective is a copy, an addition of
 *   the previous recv (reduce-scatter with accumulate, through the same
 *   rank-order sum as every transport), or nothing at all in place. With
 *   N = 1 the uneven chunks of all-reduce's halves are the even ones.
 * - The front rejects every send and recv on one rank (no peer exists), and
 *   counts nothing for one rank; this file never touches the counters.
 * - Requests are already complete when run returns; wait only frees them
 *   (on lent memory, ts_comm_set_memory, they are queued in its order).
 * - On lent memory the copy and the addition are the lender's operations.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/backend.h"
#include "comm/sum.h"

/* Runs call d on the one rank; a non-blocking call gets a finished request. */
static ts_status self_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  ts_comm_request *q = NULL;
  if (req) TS_CHECK(ts_comm_request_new(c, d->name, sizeof *q, &q));
  size_t nb = d->count * ts_dtype_size(d->dt);
  const ts_comm_memory *mem = c->mem;
  ts_status st = TS_OK;
  switch (d->kind) {
    case TS_COMM_CALL_REDUCE_SCATTER:
      if (d->accumulate) {
        const void *src[1] = {d->send};
        if (mem)
          st = mem->add(mem->user, d->recv, d->send, d->recv, d->count, d->dt);
        else
          ts_comm_sum_rank_order(d->recv, src, 1, d->count, d->dt, 1);
      } else if (!d->in_place) {
        if (mem)
          st = nb ? mem->copy(mem->user, d->recv, d->send, nb) : TS_OK;
        else
          memcpy(d->recv, d->send, nb);
      }
      break;
    case TS_COMM_CALL_ALL_GATHER:
      if (!d->in_place) {
        if (mem)
          st = nb ? mem->copy(mem->user, d->recv, d->send, nb) : TS_OK;
        else
          memcpy(d->recv, d->send, nb);
      }
      break;
    case TS_COMM_CALL_SEND:
    case TS_COMM_CALL_RECV:
    case TS_COMM_CALL_ALL_REDUCE:
      ts_comm_request_release(q);
      return ts_set_error(TS_ERR_INTERNAL, "%s: call kind %d reached the one-rank backend", d->name,
                          (int)d->kind);
    /* barrier; all_reduce_f64 and broadcast: one rank's data is already in place */
    default: break;
  }
  if (st != TS_OK) {
    ts_comm_request_release(q);
    return st;
  }
  if (q) *req = q;
  return TS_OK;
}

/* Gives a request of this backend back to the pool (its call finished in
 * run). */
static ts_status self_wait(ts_comm_request *req) {
  ts_comm_request_release(req);
  return TS_OK;
}

/* Splitting one rank gives another one-rank group, without MPI. */
static ts_status self_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  return ts_comm_self_new("ts_comm_split", name, out);
}

/* A one-rank group holds no backend state. */
static void self_free_group(ts_comm *c) {}

const ts_comm_backend ts_comm_self_backend = {
    .name = "self",
    .caps = {.moves = 1},
    .run = self_run,
    .wait = self_wait,
    .split = self_split,
    .free_group = self_free_group,
};

ts_status ts_comm_self_new(const char *op, const char *name, ts_comm **out) {
  return ts_comm_new(op, &ts_comm_self_backend, name, NULL, out);
}

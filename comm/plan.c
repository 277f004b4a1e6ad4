/*
 * plan.c — the plan backend: a group that stands for `size` ranks seen from
 * one of them and moves nothing (the memory plan's communicator, beside
 * the kernels' plan context, TS_K_PLAN: engine/plan.c).
 *
 * Invariants:
 * - The front checks and counts every call exactly as on a real group of
 *   that size and rank (bytes per kind, calls), so a plan knows what a
 *   step would send; the backend then reads and writes nothing, so the
 *   buffers may be addresses without memory. all_reduce_f64's host
 *   doubles are left as they are.
 * - No MPI call, ever. Requests are finished when run returns.
 */
#include <stdlib.h>

#include "comm/backend.h"

/* Nothing moves; a non-blocking call gets a finished request. */
static ts_status plan_run(ts_comm *c, const ts_comm_call *d, ts_comm_request **req) {
  if (!req) return TS_OK;
  return ts_comm_request_new(c, d->name, sizeof(ts_comm_request), req);
}

static ts_status plan_wait(ts_comm_request *req) {
  ts_comm_request_release(req);
  return TS_OK;
}

static ts_status plan_split(ts_comm *parent, int color, int key, const char *name, ts_comm **out) {
  return ts_set_error(TS_ERR_UNSUPPORTED, "ts_comm_split: plan group %s: a plan is not split",
                      parent->name);
}

static void plan_free_group(ts_comm *c) {}

const ts_comm_backend ts_comm_plan_backend = {
    .name = "plan",
    .caps = {.moves = 0},
    .run = plan_run,
    .wait = plan_wait,
    .split = plan_split,
    .free_group = plan_free_group,
};

ts_status ts_comm_plan(int rank, int size, const char *name, ts_comm **out) {
  static const char op[] = "ts_comm_plan";
  if (!out) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
  *out = NULL;
  if (size < 1 || rank < 0 || rank >= size)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "%s: rank %d of %d: expected 0 <= rank < size",
                        op, rank, size);
  TS_CHECK(ts_comm_new(op, &ts_comm_plan_backend, name, NULL, out));
  (*out)->rank = rank;
  (*out)->size = size;
  return TS_OK;
}

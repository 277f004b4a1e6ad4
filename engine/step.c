/*
 * step.c — the executor (DESIGN.md "One step"): every step, on every
 * rank, is this rank's list of actions from the step's schedule
 * (schedule.h; a run without pipelining is a one-stage 1F1B schedule),
 * run top to bottom, one place per action kind:
 *
 *   FORWARD                a micro-batch's forward over this stage's units
 *                          (passes.c; stage 3's gathers params.c's)
 *   BACKWARD_UNIT          one unit's backward of a micro-batch (passes.c)
 *   REDUCE_UNIT            its gradient's reduce-scatter, where the ZeRO
 *                          stage reduces as the backward ends (reduce.c)
 *   BACKWARD               a micro-batch's backward done (passes.c)
 *   SEND_*, RECV_*         activations and their gradients between pipeline
 *                          stages (pipeline.c)
 *   REDUCE                 the step's gradient reductions and the global
 *                          norm's sums (reduce.c)
 *   OPTIMIZER              skip, or the clip factor (optimizer.c)
 *   OPTIMIZER_UNIT         one unit's AdamW and its update's all-gather
 *   OPTIMIZER_END          the update's end: gathers, replica, zeroed grads
 *
 * The schedule (schedule.h) says BACKWARD of a micro-batch; the executor
 * runs the list lowered once (lower, below): BACKWARD becomes the stage's
 * units' BACKWARD_UNIT in reverse, each followed by its REDUCE_UNIT when
 * the ZeRO stage reduces it then, and a closing BACKWARD; OPTIMIZER is
 * followed by one OPTIMIZER_UNIT per unit and OPTIMIZER_END. With a split
 * backward (ZB-H1) BACKWARD_UNIT is B alone for a unit that splits, and
 * WEIGHT becomes those units' WEIGHT_UNIT in reverse, each followed by its
 * REDUCE_UNIT, and a closing WEIGHT.
 *
 *   WEIGHT_UNIT            one unit's deferred weight gradients (passes.c)
 *   WEIGHT                 a micro-batch's W done (passes.c)
 * Observers (observer.h) see each action begin and end. No other file
 * calls into this one: the action families call each other's parts
 * (params, reduce, pipeline), never the executor. A step that fails before
 * its OPTIMIZER action leaves the engine as after the last step.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/observe.h"
#include "engine/optimizer.h"
#include "engine/passes.h"
#include "engine/pipeline_internal.h"
#include "engine/reduce.h"
#include "engine/state.h"
#include "shard/collect.h"

/* The counters of the dp group plus the pipeline group and (hybrid) the
 * replica group. */
static ts_comm_counters counters_now(const ts_engine *e) {
  ts_comm_counters d = *ts_comm_get_counters(e->dp);
  ts_comm *more[2] = {e->pipe.pp, e->rep};
  for (int g = 0; g < 2; g++) {
    if (!more[g]) continue;
    const ts_comm_counters *p = ts_comm_get_counters(more[g]);
    for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
      d.bytes[k] += p->bytes[k];
      d.calls[k] += p->calls[k];
      d.remote[k] += p->remote[k];
    }
  }
  return d;
}

/* The step's traffic into stats: counters now minus those at its start. */
static void count_traffic(const ts_engine *e, const ts_comm_counters *since, ts_step_stats *stats) {
  ts_comm_counters d = counters_now(e);
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
    d.bytes[k] -= since->bytes[k];
    d.calls[k] -= since->calls[k];
    d.remote[k] -= since->remote[k];
  }
  stats->comm = d;
  stats->comm_bytes = stats->comm_remote_bytes = 0;
  for (int k = 0; k < TS_COMM_NUM_KINDS; k++) {
    stats->comm_bytes += stats->comm.bytes[k];
    stats->comm_remote_bytes += stats->comm.remote[k];
  }
}

/* Drops the gradients accumulated so far in this step and any transient
 * buffer, so that a failed step leaves the engine as it was after the
 * last optimizer step. */
static void discard_step(ts_engine *e) {
  ts_engine_wait_all(e); /* no collective still writes a buffer */
  ts_engine_zero_grads(e);
  ts_engine_wait_sends(e);
  for (int k = 0; k < e->n_slots; k++) /* W left undone, and its copies */
    for (int u = 0; e->slots[k].wgrad && u < e->model->n_units; u++)
      ts_k_wgrad_clear(e->slots[k].wgrad[u]);
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    ts_shard_release(&e->ledger, &s->full_grads);
    ts_shard_release(&e->ledger, &s->full_params);
    s->uses = 0;
    s->kept = 0;
    s->holds = 0;
  }
  e->hold_last = 0;
  ts_shard_release(&e->ledger, &e->pipe.tied_grads);
}

/* This stage's list lowered into e->pipe.program (the header comment): built
 * at the first step, the same for every step. TS_ERR_OUT_OF_MEMORY. */
static ts_status lower(ts_engine *e) {
  const ts_stage_schedule *ss = &e->pipe.sched.stage[e->pipe.stage];
  size_t units = 0, n = 0;
  TS_ENGINE_FOR_UNITS(e, u) units++;
  ts_action *out = malloc((ss->n + ss->n * 2 * units + units + 1) * sizeof *out);
  if (!out) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "step: the list of %zu actions", ss->n);
  int split = e->pipe.sched.split_backward;
  for (size_t i = 0; i < ss->n; i++) {
    const ts_action *a = &ss->actions[i];
    if (a->kind == TS_ACT_BACKWARD) { /* split: a unit that splits reduces after its W */
      int due = ts_engine_unit_reduce_due(e, a->mb), c = a->chunk;
      for (int u = e->pipe.c_end[c] - 1; u >= e->pipe.c_begin[c]; u--) {
        out[n++] = (ts_action){TS_ACT_BACKWARD_UNIT, a->mb, -1, u, c};
        if (due && !(split && ts_unit_splits_backward(e->model, u)))
          out[n++] = (ts_action){TS_ACT_REDUCE_UNIT, a->mb, -1, u, c};
      }
    }
    if (a->kind == TS_ACT_WEIGHT) {
      int due = ts_engine_unit_reduce_due(e, a->mb), c = a->chunk;
      for (int u = e->pipe.c_end[c] - 1; u >= e->pipe.c_begin[c]; u--) {
        if (!ts_unit_splits_backward(e->model, u)) continue; /* its B was whole */
        out[n++] = (ts_action){TS_ACT_WEIGHT_UNIT, a->mb, -1, u, c};
        if (due) out[n++] = (ts_action){TS_ACT_REDUCE_UNIT, a->mb, -1, u, c};
      }
    }
    out[n++] = *a;
    if (a->kind == TS_ACT_OPTIMIZER) {
      TS_ENGINE_FOR_UNITS(e, u) out[n++] = (ts_action){TS_ACT_OPTIMIZER_UNIT, -1, -1, u, 0};
      out[n++] = (ts_action){TS_ACT_OPTIMIZER_END, -1, -1, -1, 0};
    }
  }
  e->pipe.program = (ts_stage_schedule){out, n};
  return TS_OK;
}

/* A receive from this rank itself (ZB-V's turn at stage P - 1): the
 * output of chunk `from` (its slot of micro-batch mb) copied to `dst`. */
static ts_status recv_self(ts_engine *e, void *dst, int mb, int from, int grad) {
  act_slot *src = ts_engine_slot(e, mb, from);
  const void *p = grad ? src->gsend : src->acts[e->pipe.c_end[from]];
  return ts_k_copy(&e->ctx, dst, p, ts_engine_btc(e) * e->es);
}

/* Runs action a of this stage's list (next: the one after it, or NULL);
 * batch fills a micro-batch's host arrays. A message's tag names the
 * sender's chunk (the chunk of virtual stage j - 1 for an activation
 * received by j, of j + 1 for a gradient: interleaved, rank 0 receives
 * chunk c's input from the last rank's chunk c - 1). A send to this rank
 * itself posts nothing; its receive copies from the sender's slot. */
static ts_status run_action(ts_engine *e, const ts_action *a, const ts_action *next,
                            ts_engine_batch_fn batch, void *user, float lr, ts_step_stats *stats) {
  int c = a->chunk, j = ts_engine_vstage(e, c), self = a->peer == e->pipe.stage;
  act_slot *sl = a->mb >= 0 ? ts_engine_slot(e, a->mb, c) : NULL;
  size_t n = ts_engine_btc(e);
  switch (a->kind) {
    case TS_ACT_FORWARD:
      return ts_engine_forward_action(e, a->mb, c,
                                      next && next->kind == TS_ACT_BACKWARD_UNIT &&
                                          next->mb == a->mb && next->chunk == c,
                                      batch, user);
    case TS_ACT_BACKWARD_UNIT:
      return ts_engine_backward_unit_action(e, a->mb, a->unit);
    case TS_ACT_REDUCE_UNIT:
      return ts_engine_reduce_unit_action(e, a->unit);
    case TS_ACT_BACKWARD:
      return ts_engine_backward_action(e, a->mb, c);
    case TS_ACT_WEIGHT_UNIT:
      return ts_engine_weight_unit_action(e, a->mb, a->unit);
    case TS_ACT_WEIGHT:
      return ts_engine_weight_action(e, a->mb, c);
    case TS_ACT_SEND_ACT:
      if (self) return TS_OK;
      return ts_engine_isend(e, sl->acts[e->pipe.c_end[c]], n, a->peer,
                             ts_engine_chunk_tag(e, TS_TAG_ACT, a->mb, c), &sl->act_req);
    case TS_ACT_RECV_ACT: {
      int from = ts_engine_chunk_of_vstage(e, j - 1);
      if (self) return recv_self(e, sl->acts[e->pipe.c_begin[c]], a->mb, from, 0);
      return ts_engine_recv(e, sl->acts[e->pipe.c_begin[c]], n, a->peer,
                            ts_engine_chunk_tag(e, TS_TAG_ACT, a->mb, from));
    }
    case TS_ACT_SEND_GRAD:
      if (self) return TS_OK;
      return ts_engine_isend(e, sl->gsend, n, a->peer,
                             ts_engine_chunk_tag(e, TS_TAG_GRAD, a->mb, c), &sl->grad_req);
    case TS_ACT_RECV_GRAD: { /* into dbuf[1]: backward's first output goes to dbuf[0] */
      int from = ts_engine_chunk_of_vstage(e, j + 1);
      if (self) return recv_self(e, e->dbuf[1], a->mb, from, 1);
      return ts_engine_recv(e, e->dbuf[1], n, a->peer,
                            ts_engine_chunk_tag(e, TS_TAG_GRAD, a->mb, from));
    }
    case TS_ACT_REDUCE:
      return ts_engine_reduce_action(e);
    case TS_ACT_OPTIMIZER:
      return ts_engine_optimizer_action(e, lr, stats);
    case TS_ACT_OPTIMIZER_UNIT:
      return ts_engine_optimizer_unit_action(e, a->unit, lr);
    case TS_ACT_OPTIMIZER_END:
      return ts_engine_optimizer_end_action(e, lr, stats);
    default:
      return ts_set_error(TS_ERR_INTERNAL, "step: action kind %d", (int)a->kind);
  }
}

/* Runs action a between its observers' begin and end (an observer's
 * error fails the action); *optimizer: 1 once the OPTIMIZER action runs. */
static ts_status observed_action(ts_engine *e, const ts_action *a, const ts_action *next,
                                 ts_engine_batch_fn batch, void *user, float lr,
                                 ts_step_stats *stats, int *optimizer) {
  TS_CHECK(ts_engine_observe_action(e, a, 0, TS_OK));
  *optimizer |= a->kind == TS_ACT_OPTIMIZER;
  ts_status st = run_action(e, a, next, batch, user, lr, stats);
  ts_status end = ts_engine_observe_action(e, a, 1, st);
  return st != TS_OK ? st : end;
}

ts_status ts_engine_step(ts_engine *e, ts_engine_batch_fn batch, void *user, float lr,
                         ts_step_stats *stats) {
  if (!batch) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "engine: step without a batch source");
  if (e->run.in_step)
    return ts_set_error(TS_ERR_INVALID_USAGE, "engine: step inside a step: expected a step "
                                              "boundary");
  if (!e->pipe.program.actions) TS_CHECK(lower(e));
  const ts_stage_schedule *ss = &e->pipe.program;
  ts_comm_counters start = counters_now(e);
  memset(stats, 0, sizeof *stats);
  stats->overflow_unit = -1;
  stats->loss_scale = stats->next_loss_scale = e->optim.scaler.scale;
  ts_status st = TS_OK;
  int optimizing = 0; /* the OPTIMIZER action runs: the step is the optimizer's to finish */
  e->run.in_step = 1;
  for (size_t i = 0; i < ss->n && st == TS_OK; i++) {
    const ts_action *a = &ss->actions[i];
    e->run.in_micro_batch = a->mb >= 0; /* spans and the watchdog name it */
    if (a->mb >= 0) e->run.mb = a->mb;
    st = observed_action(e, a, i + 1 < ss->n ? &ss->actions[i + 1] : NULL, batch, user, lr, stats,
                         &optimizing);
  }
  e->run.in_micro_batch = 0;
  e->run.in_step = 0;
  if (st != TS_OK && !optimizing) {
    discard_step(e); /* the batch source's error too */
    return st;
  }
  count_traffic(e, &start, stats);
  return st;
}

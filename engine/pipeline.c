/*
 * pipeline.c — pipeline stages (DESIGN.md "Pipeline stages"; engine.h
 * ts_engine_create_pipeline): the stage's geometry (its units, the step's
 * schedule, its micro-batch slots; without pipelining a one-stage 1F1B
 * schedule, which step.c's executor runs like any other), and the
 * point-to-point traffic between neighbour stages over the pipeline group:
 * activations forward, their gradients backward, the tied head's gradient
 * (last stage -> stage 0, once per step) and the lender's updated
 * parameters (stage 0 -> last stage, once per applied step).
 *
 * Invariants. Micro-batch mb of chunk c uses slot mb % nslot[c] of the
 * chunk's; the micro-batches in flight on a chunk are consecutive and at
 * most nslot[c] (ts_schedule_in_flight_chunk), so no two share a slot.
 * Sends are non-blocking and their buffers untouched
 * until waited: a slot's output before its next forward or backward writes
 * it, its gradient buffer before its next backward, all of them at the
 * step's reduce. Receives block. Every unit computes exactly what it
 * computes without pipelining (same inputs, same parameters, backward in
 * micro-batch order), which is the bitwise contract; step.c's tied fold
 * and optimizer.c's step do the rest (the fold's T and the norm's sum over
 * stages).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

ts_status ts_engine_set_stage(ts_engine *e, int s) {
  const ts_model *m = e->model;
  int P = e->opts.pipeline_stages, n = m->n_units;
  int v = P > 1 ? ts_engine_opts_chunks(&e->opts) : 1;
  int *first = malloc((size_t)(P > 0 ? P * v + 1 : 1) * sizeof *first);
  if (!first) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline: %d stages", P);
  ts_status st = ts_engine_pipeline_split(m, &e->opts, first);
  if (st == TS_OK && (s < 0 || s >= P))
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT, "pipeline stage %d: expected 0 .. %d", s, P - 1);
  if (st == TS_OK) {
    e->pipe.stages = P;
    e->pipe.stage = s;
    e->pipe.chunks = v;
    ts_schedule_kind kind = P > 1 ? e->opts.schedule : TS_SCHEDULE_1F1B;
    for (int c = 0; c < v; c++) { /* chunk c is virtual stage c P + s (round-robin) or ZB-V's */
      int j = ts_schedule_vstage(kind, P, s, c);
      e->pipe.c_begin[c] = first[j];
      e->pipe.c_end[c] = first[j + 1];
    }
    e->pipe.head_stage = ts_schedule_rank_of(kind, P, P * v - 1);
  }
  free(first);
  TS_CHECK(st);
  e->pipe.replica = e->pipe.lender >= 0 && ts_engine_owns(e, n - 1) && !ts_engine_owns(e, e->pipe.lender);
  /* Without pipelining the step is a one-stage 1F1B schedule (forward and
   * backward of each micro-batch in turn, one slot), whatever opts says. */
  ts_schedule_kind kind = P > 1 ? e->opts.schedule : TS_SCHEDULE_1F1B;
  ts_schedule_free(&e->pipe.sched);
  free(e->pipe.program.actions); /* lowered again at the next step (step.c) */
  e->pipe.program = (ts_stage_schedule){NULL, 0};
  TS_CHECK(ts_schedule_make(kind, P, v, (int)e->opts.grad_accum, &e->pipe.sched));
  e->n_slots = 0;
  for (int c = 0; c < v; c++) { /* each chunk's slots, chunk by chunk */
    e->pipe.slot0[c] = e->n_slots;
    e->pipe.nslot[c] = ts_schedule_in_flight_chunk(&e->pipe.sched, s, c);
    e->n_slots += e->pipe.nslot[c];
  }
  return TS_OK;
}

ts_status ts_engine_create_pipeline(ts_engine **out, const ts_model *model,
                                    const ts_engine_opts *opts, const ts_grid *grid) {
  *out = NULL;
  if (!grid || grid->stages != opts->pipeline_stages)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "engine: a grid of %d pipeline stages for `pipeline_stages` %d",
                        grid ? grid->stages : 0, opts->pipeline_stages);
  return ts_engine_create_stage(out, model, opts, grid->dp_group,
                                grid->stages > 1 ? grid->pp_group : NULL, grid->stage);
}

/* ---- point-to-point --------------------------------------------------------- */

ts_status ts_engine_wait_req(ts_comm_request **req) {
  ts_status st = ts_comm_wait(*req);
  *req = NULL;
  return st;
}

ts_status ts_engine_wait_sends(ts_engine *e) {
  ts_status first = TS_OK, st;
  for (int k = 0; e->slots && k < e->n_slots; k++) {
    if ((st = ts_engine_wait_req(&e->slots[k].act_req)) != TS_OK && first == TS_OK) first = st;
    if ((st = ts_engine_wait_req(&e->slots[k].grad_req)) != TS_OK && first == TS_OK) first = st;
  }
  if ((st = ts_engine_wait_req(&e->pipe.tied_req)) != TS_OK && first == TS_OK) first = st;
  /* the last stage's T is done once sent */
  if (e->pipe.replica) ts_shard_release(&e->ledger, &e->pipe.tied_grads);
  return first;
}

ts_status ts_engine_recv(ts_engine *e, void *buf, size_t count, int peer, int t) {
  ts_engine_span_begin(e, TS_SPAN_RECV, -1);
  ts_engine_comm_note(e, -1);
  ts_status st = ts_comm_recv(e->pipe.pp, buf, count, e->opts.dtype, peer, t);
  ts_engine_span_end(e, TS_SPAN_RECV, -1);
  return st;
}

ts_status ts_engine_isend(ts_engine *e, const void *buf, size_t count, int peer, int t,
                          ts_comm_request **req) {
  ts_engine_span_begin(e, TS_SPAN_SEND, -1);
  ts_engine_comm_note(e, -1);
  ts_status st = ts_comm_isend(e->pipe.pp, buf, count, e->opts.dtype, peer, t, req);
  ts_engine_span_end(e, TS_SPAN_SEND, -1);
  return st;
}

ts_status ts_engine_recv_tied_grads(ts_engine *e) {
  size_t P = e->units[e->pipe.lender].layout.padded;
  TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_GRADS, P * e->es,
                                     &e->pipe.tied_grads));
  return ts_engine_recv(e, e->pipe.tied_grads, P, e->pipe.head_stage,
                        ts_engine_tag(TS_TAG_TIED, 0));
}

ts_status ts_engine_send_tied_grads(ts_engine *e) {
  size_t P = e->units[e->pipe.lender].layout.padded;
  return ts_engine_isend(e, e->pipe.tied_grads, P, 0, ts_engine_tag(TS_TAG_TIED, 0), &e->pipe.tied_req);
}

ts_status ts_engine_sync_replica(ts_engine *e) {
  /* no replica where the head is on stage 0 too (ZB-V's V) */
  if (e->pipe.stages == 1 || e->pipe.lender < 0 || e->pipe.head_stage == 0) return TS_OK;
  unit_state *s = &e->units[e->pipe.lender];
  ts_engine_comm_note(e, e->pipe.lender);
  size_t n = e->zero->shard_params ? s->layout.shard : s->layout.padded;
  if (e->pipe.stage == 0)
    return ts_comm_send(e->pipe.pp, s->params, n, e->opts.dtype, e->pipe.head_stage,
                        ts_engine_tag(TS_TAG_PARAMS, 0));
  if (e->pipe.replica)
    return ts_comm_recv(e->pipe.pp, s->params, n, e->opts.dtype, 0, ts_engine_tag(TS_TAG_PARAMS, 0));
  return TS_OK;
}

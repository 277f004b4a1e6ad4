/*
 * pipeline.c — pipeline stages (DESIGN.md "Pipeline stages"; engine.h
 * ts_engine_create_pipeline, ts_engine_step): the stage's geometry (its
 * units, its micro-batch slots), the executor that runs this stage's list
 * of the schedule (schedule.h), and the point-to-point traffic between
 * neighbour stages over the pipeline group: activations forward, their
 * gradients backward, the tied head's gradient (last stage -> stage 0, once
 * per step) and the lender's updated parameters (stage 0 -> last stage,
 * once per applied step).
 *
 * Invariants. Micro-batch mb uses slot mb % n_slots; the micro-batches in
 * flight are consecutive and at most n_slots (ts_schedule_in_flight), so no
 * two share a slot. Sends are non-blocking and their buffers untouched
 * until waited: a slot's output before its next forward or backward writes
 * it, its gradient buffer before its next backward, all of them at the
 * step's reduce. Receives block. Every unit computes exactly what it
 * computes without pipelining (same inputs, same parameters, backward in
 * micro-batch order), which is the bitwise contract; engine.c's tied fold
 * and optimizer step do the rest (the fold's T and the norm's sum over
 * stages).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "shard/collect.h"

/* Message tags on the pipeline group: kind + TAGS * micro-batch. */
enum { TAG_ACT = 0, TAG_GRAD, TAG_TIED, TAG_PARAMS, TAG_EVAL, TAGS };

static int tag(int kind, int mb) { return kind + TAGS * mb; }

/* Elements of one (B, T, C) activation. */
static size_t btc(const ts_engine *e) {
  return e->opts.micro_batch * e->opts.seq * e->model->hidden_size;
}

ts_status ts_engine_set_stage(ts_engine *e, int s) {
  const ts_model *m = e->model;
  int P = e->opts.pipeline_stages, n = m->n_units;
  int *first = malloc((size_t)(P > 0 ? P + 1 : 1) * sizeof *first);
  if (!first) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline: %d stages", P);
  ts_status st = ts_engine_pipeline_split(m, &e->opts, first);
  if (st == TS_OK && (s < 0 || s >= P))
    st = ts_set_error(TS_ERR_INVALID_ARGUMENT, "pipeline stage %d: expected 0 .. %d", s, P - 1);
  if (st == TS_OK) {
    e->stages = P;
    e->stage = s;
    e->u_begin = first[s];
    e->u_end = first[s + 1];
  }
  free(first);
  TS_CHECK(st);
  e->replica = e->lender >= 0 && ts_engine_owns(e, n - 1) && !ts_engine_owns(e, e->lender);
  e->n_slots = 1;
  if (P > 1) {
    TS_CHECK(ts_schedule_build(e->opts.schedule, P, (int)e->opts.grad_accum, &e->sched));
    e->n_slots = ts_schedule_in_flight(e->opts.schedule, P, (int)e->opts.grad_accum, s);
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
  if (grid->stages > 1 && opts->device != TS_DEVICE_CPU)
    return ts_set_error(TS_ERR_UNSUPPORTED,
                        "`pipeline_stages` %d on %s: pipeline stages exchange activations through "
                        "host MPI only (no device transport yet); use `device` cpu",
                        grid->stages, ts_device_name(opts->device));
  return ts_engine_create_stage(out, model, opts, grid->dp_group,
                                grid->stages > 1 ? grid->pp_group : NULL, grid->stage);
}

/* ---- point-to-point --------------------------------------------------------- */

static ts_status wait_req(ts_comm_request **req) {
  ts_status st = ts_comm_wait(*req);
  *req = NULL;
  return st;
}

ts_status ts_engine_wait_sends(ts_engine *e) {
  ts_status first = TS_OK, st;
  for (int k = 0; e->slots && k < e->n_slots; k++) {
    if ((st = wait_req(&e->slots[k].act_req)) != TS_OK && first == TS_OK) first = st;
    if ((st = wait_req(&e->slots[k].grad_req)) != TS_OK && first == TS_OK) first = st;
  }
  if ((st = wait_req(&e->tied_req)) != TS_OK && first == TS_OK) first = st;
  /* the last stage's T is done once sent */
  if (e->replica) ts_shard_release(&e->ledger, &e->tied_grads);
  return first;
}

/* A blocking receive on the pipeline group, traced. */
static ts_status recv(ts_engine *e, void *buf, size_t count, int peer, int t) {
  ts_engine_span_begin(e, TS_SPAN_RECV, -1);
  ts_status st = ts_comm_recv(e->pp, buf, count, e->opts.dtype, peer, t);
  ts_engine_span_end(e);
  return st;
}

/* A non-blocking send on the pipeline group, traced (its posting). */
static ts_status isend(ts_engine *e, const void *buf, size_t count, int peer, int t,
                       ts_comm_request **req) {
  ts_engine_span_begin(e, TS_SPAN_SEND, -1);
  ts_status st = ts_comm_isend(e->pp, buf, count, e->opts.dtype, peer, t, req);
  ts_engine_span_end(e);
  return st;
}

ts_status ts_engine_recv_tied_grads(ts_engine *e) {
  size_t P = e->units[e->lender].layout.padded;
  TS_CHECK(ts_ledger_alloc_transient(&e->ledger, e->device, TS_MEM_GRADS, P * e->es,
                                     &e->tied_grads));
  return recv(e, e->tied_grads, P, e->stages - 1, tag(TAG_TIED, 0));
}

ts_status ts_engine_send_tied_grads(ts_engine *e) {
  size_t P = e->units[e->lender].layout.padded;
  return isend(e, e->tied_grads, P, 0, tag(TAG_TIED, 0), &e->tied_req);
}

ts_status ts_engine_sync_replica(ts_engine *e) {
  if (e->stages == 1 || e->lender < 0) return TS_OK;
  unit_state *s = &e->units[e->lender];
  size_t n = e->zero->shard_params ? s->layout.shard : s->layout.padded;
  if (e->stage == 0)
    return ts_comm_send(e->pp, s->params, n, e->opts.dtype, e->stages - 1, tag(TAG_PARAMS, 0));
  if (e->replica)
    return ts_comm_recv(e->pp, s->params, n, e->opts.dtype, 0, tag(TAG_PARAMS, 0));
  return TS_OK;
}

/* ---- the executor ----------------------------------------------------------- */

/* Micro-batch mb's inputs and targets into slot sl from the caller, and its
 * loss gradient's scale. */
static ts_status fetch(ts_engine *e, act_slot *sl, int mb, ts_engine_batch_fn batch, void *user) {
  TS_CHECK(batch(user, mb, sl->tokens, sl->targets));
  size_t BT = e->opts.micro_batch * e->opts.seq, count = 0;
  TS_CHECK(ts_k_count_targets(&e->ctx, &count, sl->targets, BT));
  sl->dloss = ts_engine_dloss(e, count);
  return TS_OK;
}

/* Runs action a of this stage's list. */
static ts_status run_action(ts_engine *e, const ts_action *a, ts_engine_batch_fn batch,
                            void *user) {
  act_slot *sl = a->mb >= 0 ? &e->slots[a->mb % e->n_slots] : NULL;
  int last = e->stage == e->stages - 1;
  if (a->mb >= 0) e->cur_mb = a->mb;
  switch (a->kind) {
    case TS_ACT_FORWARD:
      TS_CHECK(wait_req(&sl->act_req)); /* the slot's output is free */
      TS_CHECK(fetch(e, sl, a->mb, batch, user));
      return ts_engine_forward_slot(e, sl, e->loss + 2 * (size_t)a->mb, 1);
    case TS_ACT_SEND_ACT:
      return isend(e, sl->acts[e->u_end], btc(e), a->peer, tag(TAG_ACT, a->mb), &sl->act_req);
    case TS_ACT_RECV_ACT:
      return recv(e, sl->acts[e->u_begin], btc(e), a->peer, tag(TAG_ACT, a->mb));
    case TS_ACT_RECV_GRAD: /* into dbuf[1]: backward's first output goes to dbuf[0] */
      return recv(e, e->dbuf[1], btc(e), a->peer, tag(TAG_GRAD, a->mb));
    case TS_ACT_BACKWARD:
      TS_CHECK(wait_req(&sl->grad_req)); /* the slot's gradient buffer is free */
      TS_CHECK(wait_req(&sl->act_req));  /* a recompute may rewrite the output */
      return ts_engine_backward_slot(e, sl, last ? NULL : e->dbuf[1]);
    case TS_ACT_SEND_GRAD:
      return isend(e, sl->gsend, btc(e), a->peer, tag(TAG_GRAD, a->mb), &sl->grad_req);
    case TS_ACT_REDUCE:
      return ts_engine_wait_sends(e);
    case TS_ACT_OPTIMIZER: /* ts_engine_step's caller part */
      return TS_OK;
    default:
      return ts_set_error(TS_ERR_INTERNAL, "pipeline: action kind %d", (int)a->kind);
  }
}

/* Without pipelining: grad_accum micro-steps. */
static ts_status micro_steps(ts_engine *e, ts_engine_batch_fn batch, void *user) {
  for (size_t k = 0; k < e->opts.grad_accum; k++) {
    TS_CHECK(batch(user, (int)k, e->h_tokens, e->h_targets));
    TS_CHECK(ts_engine_micro_step(e, e->h_tokens, e->h_targets, NULL));
  }
  return TS_OK;
}

ts_status ts_engine_step(ts_engine *e, ts_engine_batch_fn batch, void *user, float lr,
                         ts_step_stats *stats) {
  if (!batch) return ts_set_error(TS_ERR_INVALID_ARGUMENT, "engine: step without a batch source");
  if (e->micro_done != 0)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: step after %d micro-steps of an unfinished step",
                        e->micro_done);
  ts_status st;
  if (e->stages == 1) {
    st = micro_steps(e, batch, user);
    if (st != TS_OK) ts_engine_discard_step(e); /* the batch source's error too */
  } else {
    ts_engine_step_begin(e);
    const ts_stage_schedule *ss = &e->sched.stage[e->stage];
    e->in_micro_step = 1;
    st = TS_OK;
    for (size_t i = 0; i < ss->n && st == TS_OK; i++) st = run_action(e, &ss->actions[i], batch, user);
    e->in_micro_step = 0;
    if (st != TS_OK) ts_engine_discard_step(e);
    else e->micro_done = (int)e->opts.grad_accum;
  }
  TS_CHECK(st);
  return ts_engine_optimizer_step(e, lr, stats);
}

/* ---- evaluation ------------------------------------------------------------- */

ts_status ts_engine_eval_pipeline(ts_engine *e, double sums[3], const int32_t *targets,
                                  int want_correct) {
  act_slot *sl = &e->slots[0];
  int s = e->stage, P = e->stages;
  if (s > 0) TS_CHECK(recv(e, sl->acts[e->u_begin], btc(e), s - 1, tag(TAG_EVAL, 0)));
  TS_CHECK(ts_engine_forward_slot(e, sl, e->eval_loss, 0));
  if (s < P - 1)
    TS_CHECK(ts_comm_send(e->pp, sl->acts[e->u_end], btc(e), e->opts.dtype, s + 1,
                          tag(TAG_EVAL, 0)));
  sums[0] = sums[1] = sums[2] = 0.0;
  if (s == P - 1) {
    TS_CHECK(ts_k_to_host(&e->ctx, sums, e->eval_loss, 2 * sizeof(double)));
    if (want_correct) TS_CHECK(ts_engine_count_correct(e, targets, &sums[2]));
  }
  /* the last stage's sums on every stage (the others add zeros: exact) */
  return ts_comm_all_reduce_f64(e->pp, sums, 3, TS_COMM_SUM);
}


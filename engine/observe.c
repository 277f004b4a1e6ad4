/*
 * observe.c — what the step tells its watchers, and the step's waits for
 * its collectives (engine_internal.h): the observers (observer.h) and
 * their calls (actions, spans, timed waits, the groups' calls through
 * comm's watcher), the trace as one observer,
 * the watchdog's context of the calls started next, waiting for every
 * collective in flight. A leaf of the step's files: it calls comm, the
 * trace and the kernels' synchronize, never back into the step.
 */
#include "engine/observe.h"
#include "engine/state.h"

/* ---- observers (observer.h) ----------------------------------------------------- */

/* comm.h's watcher on the engine's groups: numbers each call and tells
 * the observers that watch calls. */
static int64_t watch_started(void *user, const ts_comm *g, const ts_comm_call_info *k, int blocking) {
  ts_engine *e = user;
  int64_t id = e->obs.calls_told++;
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->call) e->obs.list[i]->call(e->obs.list[i]->user, e, g, k, blocking, id);
  return id;
}

static void watch_waited(void *user, int64_t id) {
  ts_engine *e = user;
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->call_wait) e->obs.list[i]->call_wait(e->obs.list[i]->user, e, id);
}

/* Puts the watcher on the groups while an observer watches calls, and
 * takes it off when none does. */
static void update_watcher(ts_engine *e) {
  int want = 0;
  for (int i = 0; i < e->obs.n; i++)
    want |= e->obs.list[i]->call != NULL || e->obs.list[i]->call_wait != NULL;
  if (want == e->obs.watching) return;
  e->obs.watcher = (ts_comm_watcher){.user = e, .started = watch_started, .waited = watch_waited};
  ts_comm *groups[3] = {e->dp, e->rep, e->pipe.pp};
  for (int k = 0; k < 3; k++)
    if (groups[k]) ts_comm_set_watcher(groups[k], want ? &e->obs.watcher : NULL);
  e->obs.watching = want;
  e->obs.calls_told = 0;
}

ts_status ts_engine_add_observer(ts_engine *e, const ts_step_observer *o) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i] == o)
      return ts_set_error(TS_ERR_INVALID_USAGE, "engine: observer registered twice");
  if (e->obs.n == TS_ENGINE_MAX_OBSERVERS || e->run.in_step)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: observer added %s: expected at most %d, between steps",
                        e->run.in_step ? "inside a step" : "beyond the last slot",
                        TS_ENGINE_MAX_OBSERVERS);
  e->obs.list[e->obs.n++] = o;
  update_watcher(e);
  return TS_OK;
}

void ts_engine_remove_observer(ts_engine *e, const ts_step_observer *o) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i] == o) {
      for (int k = i + 1; k < e->obs.n; k++) e->obs.list[k - 1] = e->obs.list[k];
      e->obs.n--;
      update_watcher(e);
      return;
    }
}

void ts_engine_drop_observers(ts_engine *e) {
  e->obs.n = 0;
  update_watcher(e);
}

int ts_engine_micro_batch(const ts_engine *e) { return e->run.in_micro_batch ? e->run.mb : -1; }

ts_status ts_engine_observe_action(ts_engine *e, const ts_action *a, int end, ts_status status) {
  ts_status first = TS_OK;
  for (int i = 0; i < e->obs.n; i++) {
    const ts_step_observer *o = e->obs.list[i];
    ts_status st = o->action ? o->action(o->user, e, a, end, status) : TS_OK;
    if (first == TS_OK) first = st;
  }
  return first;
}

void ts_engine_observe_io(ts_engine *e, int write, int unit, uint64_t bytes, int64_t id) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->io) e->obs.list[i]->io(e->obs.list[i]->user, e, write, unit, bytes, id);
}

void ts_engine_observe_io_wait(ts_engine *e, int64_t id) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->io_wait) e->obs.list[i]->io_wait(e->obs.list[i]->user, e, id);
}

/* ---- spans, and the trace as an observer ----------------------------------------- */

void ts_engine_span_begin(ts_engine *e, ts_span_kind kind, int unit) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->span_begin) e->obs.list[i]->span_begin(e->obs.list[i]->user, e, kind, unit);
}

void ts_engine_span_end(ts_engine *e, ts_span_kind kind, int unit) {
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->span_end) e->obs.list[i]->span_end(e->obs.list[i]->user, e, kind, unit);
}

/* The trace's spans: every span but a unit's AdamW (the update is one
 * span), named with the micro-batch in progress; a device's span ends once
 * its kernels have. */
static void trace_span_begin(void *user, ts_engine *e, ts_span_kind kind, int unit) {
  if (kind == TS_SPAN_OPTIMIZER && unit >= 0) return;
  ts_trace_begin((ts_trace *)user, kind, unit, ts_engine_micro_batch(e));
}

static void trace_span_end(void *user, ts_engine *e, ts_span_kind kind, int unit) {
  if (kind == TS_SPAN_OPTIMIZER && unit >= 0) return;
  if (e->device != TS_DEVICE_CPU) ts_k_synchronize(&e->ctx);
  ts_trace_end((ts_trace *)user);
}

/* A collective's spans: on the communication thread its own (async) and
 * the step's wait for it, else the wait on the step's thread. */
static void trace_wait(void *user, ts_engine *e, ts_span_kind kind, int unit,
                       const double times[4], double t0, double t1) {
  ts_trace *t = (ts_trace *)user;
  int mb = ts_engine_micro_batch(e);
  if (times[2] >= 0) { /* ran to its end inside its start, on the step's thread (staged) */
    ts_trace_add(t, kind, unit, mb, times[2], times[3], 0);
  }
  if (times[0] >= 0) { /* ran on the communication thread: its span, and the step's wait */
    ts_trace_add(t, kind, unit, mb, times[0], times[1], TS_TRACE_ASYNC);
    ts_trace_add(t, kind, unit, mb, t0, t1, TS_TRACE_WAIT);
  } else { /* ran inside its wait, on the step's thread */
    ts_trace_add(t, kind, unit, mb, t0, t1, 0);
  }
}

void ts_engine_set_trace(ts_engine *e, ts_trace *t) {
  if (e->obs.trace) ts_engine_remove_observer(e, &e->obs.trace_observer);
  e->obs.trace = t;
  if (!t) return;
  e->obs.trace_observer = (ts_step_observer){.span_begin = trace_span_begin,
                                         .span_end = trace_span_end,
                                         .wait = trace_wait,
                                         .user = t};
  if (ts_engine_add_observer(e, &e->obs.trace_observer) != TS_OK) e->obs.trace = NULL; /* a full list */
}

void ts_engine_comm_note(const ts_engine *e, int unit) {
  ts_comm_context c = ts_comm_get_context();
  c.unit = unit;
  c.stage = e->pipe.stages > 1 ? e->pipe.stage : -1;
  c.micro_batch = ts_engine_micro_batch(e);
  ts_comm_set_context(&c);
}

ts_status ts_engine_comm_wait(ts_engine *e, ts_comm_request **req, ts_span_kind kind, int unit) {
  ts_comm_request *q = *req;
  if (!q) return TS_OK;
  *req = NULL;
  int timed = 0;
  for (int i = 0; i < e->obs.n; i++) timed |= e->obs.list[i]->wait != NULL;
  if (!timed) return ts_comm_wait(q);
  double times[4], t0 = ts_trace_now_us();
  ts_status st = ts_comm_wait_timed(q, times);
  double t1 = ts_trace_now_us();
  for (int i = 0; i < e->obs.n; i++)
    if (e->obs.list[i]->wait)
      e->obs.list[i]->wait(e->obs.list[i]->user, e, kind, unit, times, t0, t1);
  return st;
}

void ts_engine_wait_all(ts_engine *e) {
  if (!e->units) return;
  for (int u = 0; u < e->model->n_units; u++) {
    unit_state *s = &e->units[u];
    ts_comm_wait(s->gather_req);
    ts_comm_wait(s->reduce_req);
    ts_comm_wait(s->reduce_ag_req);
    s->gather_req = s->reduce_req = s->reduce_ag_req = NULL;
  }
  e->rs_pending = -1;
}


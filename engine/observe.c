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
  int64_t id = e->calls_told++;
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i]->call) e->observers[i]->call(e->observers[i]->user, e, g, k, blocking, id);
  return id;
}

static void watch_waited(void *user, int64_t id) {
  ts_engine *e = user;
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i]->call_wait) e->observers[i]->call_wait(e->observers[i]->user, e, id);
}

/* Puts the watcher on the groups while an observer watches calls, and
 * takes it off when none does. */
static void update_watcher(ts_engine *e) {
  int want = 0;
  for (int i = 0; i < e->n_observers; i++)
    want |= e->observers[i]->call != NULL || e->observers[i]->call_wait != NULL;
  if (want == e->watching) return;
  e->watcher = (ts_comm_watcher){.user = e, .started = watch_started, .waited = watch_waited};
  ts_comm *groups[3] = {e->dp, e->rep, e->pp};
  for (int k = 0; k < 3; k++)
    if (groups[k]) ts_comm_set_watcher(groups[k], want ? &e->watcher : NULL);
  e->watching = want;
  e->calls_told = 0;
}

ts_status ts_engine_add_observer(ts_engine *e, const ts_step_observer *o) {
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i] == o)
      return ts_set_error(TS_ERR_INVALID_USAGE, "engine: observer registered twice");
  if (e->n_observers == TS_ENGINE_MAX_OBSERVERS || e->in_step)
    return ts_set_error(TS_ERR_INVALID_USAGE,
                        "engine: observer added %s: expected at most %d, between steps",
                        e->in_step ? "inside a step" : "beyond the last slot",
                        TS_ENGINE_MAX_OBSERVERS);
  e->observers[e->n_observers++] = o;
  update_watcher(e);
  return TS_OK;
}

void ts_engine_remove_observer(ts_engine *e, const ts_step_observer *o) {
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i] == o) {
      for (int k = i + 1; k < e->n_observers; k++) e->observers[k - 1] = e->observers[k];
      e->n_observers--;
      update_watcher(e);
      return;
    }
}

void ts_engine_drop_observers(ts_engine *e) {
  e->n_observers = 0;
  update_watcher(e);
}

int ts_engine_micro_batch(const ts_engine *e) { return e->in_micro_batch ? e->cur_mb : -1; }

ts_status ts_engine_observe_action(ts_engine *e, const ts_action *a, int end, ts_status status) {
  ts_status first = TS_OK;
  for (int i = 0; i < e->n_observers; i++) {
    const ts_step_observer *o = e->observers[i];
    ts_status st = o->action ? o->action(o->user, e, a, end, status) : TS_OK;
    if (first == TS_OK) first = st;
  }
  return first;
}

/* ---- spans, and the trace as an observer ----------------------------------------- */

void ts_engine_span_begin(ts_engine *e, ts_span_kind kind, int unit) {
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i]->span_begin) e->observers[i]->span_begin(e->observers[i]->user, e, kind, unit);
}

void ts_engine_span_end(ts_engine *e, ts_span_kind kind, int unit) {
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i]->span_end) e->observers[i]->span_end(e->observers[i]->user, e, kind, unit);
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
  if (e->trace) ts_engine_remove_observer(e, &e->trace_observer);
  e->trace = t;
  if (!t) return;
  e->trace_observer = (ts_step_observer){.span_begin = trace_span_begin,
                                         .span_end = trace_span_end,
                                         .wait = trace_wait,
                                         .user = t};
  if (ts_engine_add_observer(e, &e->trace_observer) != TS_OK) e->trace = NULL; /* a full list */
}

void ts_engine_comm_note(const ts_engine *e, int unit) {
  ts_comm_context c = ts_comm_get_context();
  c.unit = unit;
  c.stage = e->stages > 1 ? e->stage : -1;
  c.micro_batch = ts_engine_micro_batch(e);
  ts_comm_set_context(&c);
}

ts_status ts_engine_comm_wait(ts_engine *e, ts_comm_request **req, ts_span_kind kind, int unit) {
  ts_comm_request *q = *req;
  if (!q) return TS_OK;
  *req = NULL;
  int timed = 0;
  for (int i = 0; i < e->n_observers; i++) timed |= e->observers[i]->wait != NULL;
  if (!timed) return ts_comm_wait(q);
  double times[4], t0 = ts_trace_now_us();
  ts_status st = ts_comm_wait_timed(q, times);
  double t1 = ts_trace_now_us();
  for (int i = 0; i < e->n_observers; i++)
    if (e->observers[i]->wait)
      e->observers[i]->wait(e->observers[i]->user, e, kind, unit, times, t0, t1);
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


/*
 * observe.h — private to engine/: observe.c: what the step tells its observers
 * (observer.h) — actions, spans, timed waits — and its waits for
 * collectives.
 */
#ifndef TS_ENGINE_OBSERVE_H
#define TS_ENGINE_OBSERVE_H

#include "engine/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tells the observers (observer.h) that a span of `kind` of unit `unit`
 * begins / ends on the step's thread. */
void ts_engine_span_begin(ts_engine *e, ts_span_kind kind, int unit);
void ts_engine_span_end(ts_engine *e, ts_span_kind kind, int unit);

/* Sets the watchdog's context (comm.h ts_comm_set_context) for the calls
 * started next: the step the trainer set, unit `unit` (-1: none), this
 * rank's pipeline stage when pipelined, and the micro-batch while one of
 * its actions runs. */
void ts_engine_comm_note(const ts_engine *e, int unit);

/* Waits for *req (NULL: nothing) and sets it NULL; timed, and told to the
 * observers that watch waits, when one does. */
ts_status ts_engine_comm_wait(ts_engine *e, ts_comm_request **req, ts_span_kind kind, int unit);

/* Tells the observers (observer.h) of an offload job queued (io) and of a
 * wait for one (io_wait). */
void ts_engine_observe_io(ts_engine *e, int write, int unit, uint64_t bytes, int64_t id);
void ts_engine_observe_io_wait(ts_engine *e, int64_t id);

/* Tells the observers (observer.h) that action a begins (end 0) or ended
 * with status (end 1); the first error an observer returns. */
ts_status ts_engine_observe_action(ts_engine *e, const ts_action *a, int end, ts_status status);

/* Removes every observer, and the watcher from the engine's groups (for
 * free: the groups may outlive the engine). */
void ts_engine_drop_observers(ts_engine *e);

/* Waits for every collective in flight (errors dropped: for discarding a
 * step and for free), so that no buffer is released under one. */
void ts_engine_wait_all(ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OBSERVE_H */

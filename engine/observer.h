/*
 * observer.h — what watches a step from outside it (DESIGN.md "One
 * step"): the run's trace (train --trace: ts_engine_set_trace registers
 * the engine's trace observer), the simulator's clock (simulate.c), tests
 * that look at the gradients before the optimizer or fail an action on
 * purpose. An observer is a set of callbacks registered on an engine; in
 * registration order each is told when an action of this rank's list
 * begins and ends (the executor, step.c), when a span of work on the
 * step's thread begins and ends (a unit's forward, recompute or backward,
 * passes.c; the update and each unit's AdamW in it, optimizer.c; a
 * pipeline send or receive, pipeline.c), when a collective was waited
 * for (observe.c ts_engine_comm_wait), and, while an observer asks for
 * them, when a call starts on one of the engine's groups and when the step
 * begins to wait for it (comm.h's watcher on the groups, observe.c's). The
 * step's code has no other calls for watchers: with no observer it pays
 * one loop over an empty list per action and span, and untimed waits.
 */
#ifndef TS_ENGINE_OBSERVER_H
#define TS_ENGINE_OBSERVER_H

#include "base/base.h"
#include "comm/comm.h"
#include "engine/schedule.h"
#include "engine/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ts_engine;

/* The callbacks; each may be NULL. Called on the step's thread. */
typedef struct ts_step_observer {
  /* Action a of this rank's list, end 0 just before it runs, end 1 just
   * after (status: what it returned). A status other than TS_OK fails the
   * action: the step stops there and returns it (discarded, as any failed
   * step, unless the OPTIMIZER action ran). */
  ts_status (*action)(void *user, struct ts_engine *e, const ts_action *a, int end,
                      ts_status status);
  /* A span of work on the step's thread begins / ends, in nested pairs:
   * TS_SPAN_FORWARD, TS_SPAN_RECOMPUTE, TS_SPAN_BACKWARD of unit `unit`
   * (the micro-batch is ts_engine_micro_batch's); TS_SPAN_OPTIMIZER with
   * unit -1 the whole update, inside it with unit u that unit's AdamW;
   * TS_SPAN_SEND, TS_SPAN_RECV (unit -1) a pipeline send's posting or a
   * receive. On a device the ops are queued: an observer that times them
   * synchronises (ts_k_synchronize) itself. */
  void (*span_begin)(void *user, struct ts_engine *e, ts_span_kind kind, int unit);
  void (*span_end)(void *user, struct ts_engine *e, ts_span_kind kind, int unit);
  /* A collective of unit `unit` (TS_SPAN_ALL_GATHER, TS_SPAN_REDUCE_SCATTER;
   * -1: none) was waited for: times[4] as ts_comm_wait_timed gives them
   * (where a communication thread ran it, or a start that ran it), t0 and
   * t1 the wait's own begin and end (us, trace.h's clock). Set: the
   * engine's waits are timed. */
  void (*wait)(void *user, struct ts_engine *e, ts_span_kind kind, int unit, const double times[4],
               double t0, double t1);
  /* A call started on group g, one of the engine's (its data-parallel
   * group, the replica group of hybrid sharding, the pipeline group; a
   * communication thread's wrap where one runs), on the step's thread:
   * what it sends (comm.h ts_comm_call_info; receives too), blocking 1 when
   * the caller waits for its end there, and its number id: 0, 1, ... in the
   * order calls started since the first observer with call or call_wait
   * was registered. Set (either): a watcher is on the groups. */
  void (*call)(void *user, struct ts_engine *e, const ts_comm *g, const ts_comm_call_info *call,
               int blocking, int64_t id);
  /* The step begins to wait for started call id (-1: one started before
   * the watcher was on its group). */
  void (*call_wait)(void *user, struct ts_engine *e, int64_t id);
  /* Offload (engine/offload.h): a piece of unit `unit`'s optimizer state,
   * `bytes` of it, queued to be read from the disk (write 0) or written
   * back (1) as job id: the engine numbers its jobs 0, 1, ... in queue
   * order from its creation (one I/O channel), so the first an observer
   * sees may be above 0. Told on the thread that queued it (the step's,
   * or an asynchronous save's writer). */
  void (*io)(void *user, struct ts_engine *e, int write, int unit, uint64_t bytes, int64_t id);
  /* The caller begins to wait for queued job id (a unit's state needed). */
  void (*io_wait)(void *user, struct ts_engine *e, int64_t id);
  void *user; /* passed back as is */
} ts_step_observer;

enum { TS_ENGINE_MAX_OBSERVERS = 4 };

/* Registers observer o on engine e (borrowed: it must outlive its
 * registration) after those registered before. An observer with call or
 * call_wait puts the engine's watcher on its groups (comm.h
 * ts_comm_set_watcher, replacing one another engine put on a shared group)
 * until the last such observer is removed. TS_ERR_INVALID_USAGE when
 * e has TS_ENGINE_MAX_OBSERVERS already, o is registered already, or a
 * step is running. */
ts_status ts_engine_add_observer(struct ts_engine *e, const ts_step_observer *o);

/* Removes o from e's observers; a no-op when it is not one. */
void ts_engine_remove_observer(struct ts_engine *e, const ts_step_observer *o);

/* The micro-batch whose action or op runs (0 .. m - 1), -1 outside a
 * micro-batch's actions (REDUCE, OPTIMIZER, outside a step). */
int ts_engine_micro_batch(const struct ts_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_OBSERVER_H */

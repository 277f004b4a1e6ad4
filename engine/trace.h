/*
 * trace.h — a run's timeline as Chrome trace events (train --trace FILE;
 * the JSON Object Format of the Trace Event Format, which chrome://tracing
 * and Perfetto open): one process per rank ("pid": the rank, named
 * "rank R") with two tracks, tid 0 "compute" (forward, backward and
 * recompute of a unit for a micro-batch; the optimizer step) and tid 1
 * "communication" (the all-gathers and reduce-scatters of its parameters
 * and gradients, a pipeline's sends and receives); a complete ("X") event
 * per span. A collective that ran on the step's own thread is exposed: the
 * step waited for all of it. One that ran on the communication thread
 * (overlap, comm.h ts_comm_set_thread) is a span with args "async": 1 on
 * tid 1, from when the thread began it to when it finished, and the time
 * the step then still waited for it is a span with args "wait": 1 on tid 0
 * (the exposed part). The file's otherData says so ("tracks") beside
 * "trace_format": 2 (format 1, before 2026-11-26, had pid 0 and one track
 * per rank, tid = rank).
 *
 * Times are host wall-clock microseconds (CLOCK_REALTIME, so the ranks of a
 * job share one axis), shifted so the earliest span of the run starts at 0.
 * On a GPU the engine waits for the device at the end of every span while
 * tracing, so a span covers its kernels, not just their launch: tracing
 * slows a GPU run down.
 *
 * Memory: 6 doubles per span, kept until the end of the run; spans past
 * TS_TRACE_MAX_SPANS per rank are counted and dropped (the file says how
 * many).
 */
#ifndef TS_ENGINE_TRACE_H
#define TS_ENGINE_TRACE_H

#include <stddef.h>

#include "base/base.h"
#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ts_span_kind {
  TS_SPAN_FORWARD = 0,
  TS_SPAN_BACKWARD,
  TS_SPAN_RECOMPUTE,
  TS_SPAN_ALL_GATHER,
  TS_SPAN_REDUCE_SCATTER,
  TS_SPAN_OPTIMIZER,
  TS_SPAN_SEND,    /* a pipeline send posted (activation or its gradient) */
  TS_SPAN_RECV,    /* a pipeline receive: the wait for a neighbour stage */
  TS_SPAN_WEIGHT,  /* a unit's deferred weight gradients, W (zero-bubble schedules) */
  TS_SPAN_NUM_KINDS,
} ts_span_kind;

enum { TS_TRACE_MAX_SPANS = 1 << 20, TS_TRACE_MAX_DEPTH = 8, TS_TRACE_FORMAT = 2 };

typedef struct ts_trace ts_trace;

/* An empty trace of this rank. TS_ERR_OUT_OF_MEMORY. */
ts_status ts_trace_new(ts_trace **out);
void ts_trace_free(ts_trace *t); /* NULL: no-op */

/* Opens a span of `kind` for unit (-1: none) and micro-batch mb (-1:
 * none); spans nest up to TS_TRACE_MAX_DEPTH (deeper ones are dropped).
 * NULL t: no-op, so callers need no test. */
void ts_trace_begin(ts_trace *t, ts_span_kind kind, int unit, int mb);
/* Closes the innermost open span. */
void ts_trace_end(ts_trace *t);

/* Flags of ts_trace_add. */
enum { TS_TRACE_ASYNC = 1, TS_TRACE_WAIT = 2 };

/* Records a finished span of `kind` from t0 to t1 (us, the axis of
 * ts_trace_now_us) with flags: TS_TRACE_ASYNC (it ran on the communication
 * thread), TS_TRACE_WAIT (the step waited for such a span). Needs no open
 * span and opens none; counts against TS_TRACE_MAX_SPANS. NULL t: no-op. */
void ts_trace_add(ts_trace *t, ts_span_kind kind, int unit, int mb, double t0, double t1,
                  int flags);

/* Now on the trace's axis: CLOCK_REALTIME in microseconds. */
double ts_trace_now_us(void);

/* Spans recorded (kept) and dropped so far. */
size_t ts_trace_spans(const ts_trace *t);
size_t ts_trace_dropped(const ts_trace *t);

/* Collective over c: gathers every rank's spans and rank 0 writes them to
 * path ({"traceEvents": [...], "displayTimeUnit": "ms", "otherData":
 * {...}}) through base/'s atomic write, laid out as at the top.
 * TS_ERR_IO (the path), TS_ERR_OUT_OF_MEMORY, TS_ERR_MPI; every rank
 * returns the same status. */
ts_status ts_trace_write(ts_trace *t, ts_comm *c, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_TRACE_H */

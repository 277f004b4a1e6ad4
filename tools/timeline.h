/*
 * timeline.h — one optimizer step of a `train --trace` file as the
 * pipeline's timeline (tools/timeline.c): spans per rank, the step's
 * window, each rank's compute time in it and the measured bubble; and its
 * picture. Used by `tessera timeline`, compare and bench_pipeline.sh.
 */
#ifndef TS_TOOLS_TIMELINE_H
#define TS_TOOLS_TIMELINE_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_timeline_span {
  int rank;    /* its track */
  int kind;    /* compute, recv, send, comm, optimizer, other (timeline.c) */
  char letter; /* compute: 'F' forward, 'B' backward, 'R' recompute, 'W' weight; else 0 */
  int mb;      /* micro-batch, or -1 */
  int async;   /* 1: ran on the communication thread beside the step (args "async") */
  int wait;    /* 1: the step's wait for such a collective (args "wait"): exposed time,
                  not more time in the collective */
  double t0, t1; /* start and end, microseconds from the trace's origin */
} ts_timeline_span;

typedef struct ts_timeline {
  int ranks;              /* tracks of the trace */
  ts_timeline_span *spans; /* (n) the step's spans, by rank then start (owned) */
  size_t n;
  double begin, end;      /* the window: the step's first compute start, last compute end (us) */
  double *busy;           /* (ranks) compute time in the window, microseconds (owned) */
  double *comm;           /* (ranks) time in the step's collectives (all-gather,
                             reduce-scatter): their spans but the waits, microseconds
                             (owned) */
  double *exposed;        /* (ranks) the part of comm the step waited for: the collective
                             spans that ran on the step's thread and the waits for those
                             on the communication thread, microseconds (owned) */
  double bubble;          /* mean over ranks of the idle fraction of the window (stages of
                             unequal cost add their imbalance to it) */
  double bubble_busiest;  /* the idle fraction of the busiest rank (the slowest stage): the
                             fill and drain alone, what (P-1)/(m+P-1) predicts for equal
                             stages */
} ts_timeline;

/* Reads step `step` (1-based; a rank's step k ends with its k-th optimizer
 * span) of the trace at path into *t. TS_ERR_IO (unreadable),
 * TS_ERR_FORMAT (not a trace, no spans), TS_ERR_INVALID_ARGUMENT (a step
 * the trace does not hold on every rank), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_timeline_load(const char *path, int step, ts_timeline *t);
void ts_timeline_free(ts_timeline *t);

/* Draws t to png (gnuplot, through a temporary name, renamed when done),
 * one row per rank, its data and script in dir. TS_ERR_IO. */
ts_status ts_timeline_draw(const ts_timeline *t, const char *title, const char *dir,
                           const char *png);

#ifdef __cplusplus
}
#endif

#endif /* TS_TOOLS_TIMELINE_H */

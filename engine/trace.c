/*
 * trace.c — spans in memory, gathered and written as Chrome trace events
 * (trace.h).
 */
#include "engine/trace.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/atomic_file.h"

/* A span: start and duration (us), kind, unit, micro-batch, flags
 * (TS_TRACE_ASYNC, TS_TRACE_WAIT) — as doubles, so that ranks' spans travel
 * in one all-reduce (exact: integers < 2^53). */
enum { FIELDS = 6 };

struct ts_trace {
  double *spans; /* (cap, FIELDS) */
  size_t n, cap, dropped;
  int depth;
  size_t open[TS_TRACE_MAX_DEPTH]; /* indices of the open spans; SIZE_MAX: dropped */
};

static const char *const NAMES[TS_SPAN_NUM_KINDS] = {
    "forward", "backward",       "recompute", "all_gather",
    "reduce_scatter", "optimizer_step", "send", "recv", "weight"};
static const char *const CATEGORIES[TS_SPAN_NUM_KINDS] = {
    "compute", "compute", "compute", "comm", "comm", "optimizer", "p2p", "p2p", "compute"};

/* A rank's tracks (trace.h): compute and the optimizer step, then
 * communication (collectives, sends and receives). */
enum { TRACK_COMPUTE = 0, TRACK_COMM = 1 };
static const char *const TRACKS[2] = {"compute", "communication"};

static int track_of(int kind, int flags) {
  if (flags & TS_TRACE_WAIT) return TRACK_COMPUTE; /* the step's thread waited */
  return kind == TS_SPAN_ALL_GATHER || kind == TS_SPAN_REDUCE_SCATTER || kind == TS_SPAN_SEND ||
                 kind == TS_SPAN_RECV
             ? TRACK_COMM
             : TRACK_COMPUTE;
}

/* A metadata event ("M") naming process pid (tid < 0) or its thread tid. */
static void add_name(cJSON *events, int pid, int tid, const char *name) {
  cJSON *meta = cJSON_CreateObject(), *args = cJSON_CreateObject();
  cJSON_AddStringToObject(meta, "name", tid < 0 ? "process_name" : "thread_name");
  cJSON_AddStringToObject(meta, "ph", "M");
  cJSON_AddNumberToObject(meta, "pid", pid);
  cJSON_AddNumberToObject(meta, "tid", tid < 0 ? 0 : tid);
  cJSON_AddStringToObject(args, "name", name);
  cJSON_AddItemToObject(meta, "args", args);
  cJSON_AddItemToArray(events, meta);
}

double ts_trace_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e6 + (double)(ts.tv_nsec / 1000);
}

ts_status ts_trace_new(ts_trace **out) {
  *out = calloc(1, sizeof **out);
  if (!*out) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "trace: cannot allocate");
  return TS_OK;
}

void ts_trace_free(ts_trace *t) {
  if (!t) return;
  free(t->spans);
  free(t);
}

/* A new span's fields (start t0, duration 0, kind, unit, mb, flags), or
 * NULL when TS_TRACE_MAX_SPANS are kept or memory runs out (counted as
 * dropped). *at receives its index (SIZE_MAX when dropped). */
static double *push_span(ts_trace *t, ts_span_kind kind, int unit, int mb, double t0, int flags,
                         size_t *at) {
  *at = SIZE_MAX;
  if (t->n == t->cap && t->cap < TS_TRACE_MAX_SPANS) {
    size_t cap = t->cap ? 2 * t->cap : 1024;
    if (cap > TS_TRACE_MAX_SPANS) cap = TS_TRACE_MAX_SPANS;
    double *s = realloc(t->spans, cap * FIELDS * sizeof *s);
    if (s) t->spans = s, t->cap = cap;
  }
  if (t->n == t->cap) {
    t->dropped++;
    return NULL;
  }
  *at = t->n++;
  double *s = t->spans + *at * FIELDS;
  s[0] = t0;
  s[1] = 0;
  s[2] = kind;
  s[3] = unit;
  s[4] = mb;
  s[5] = flags;
  return s;
}

void ts_trace_begin(ts_trace *t, ts_span_kind kind, int unit, int mb) {
  if (!t) return;
  if (t->depth == TS_TRACE_MAX_DEPTH) {
    t->dropped++;
    return;
  }
  size_t at;
  push_span(t, kind, unit, mb, ts_trace_now_us(), 0, &at);
  t->open[t->depth++] = at;
}

void ts_trace_end(ts_trace *t) {
  if (!t || t->depth == 0) return;
  size_t at = t->open[--t->depth];
  if (at == SIZE_MAX) return;
  double *s = t->spans + at * FIELDS;
  s[1] = ts_trace_now_us() - s[0];
}

void ts_trace_add(ts_trace *t, ts_span_kind kind, int unit, int mb, double t0, double t1,
                  int flags) {
  if (!t) return;
  size_t at;
  double *s = push_span(t, kind, unit, mb, t0, flags, &at);
  if (s) s[1] = t1 > t0 ? t1 - t0 : 0;
}

size_t ts_trace_spans(const ts_trace *t) { return t ? t->n : 0; }
size_t ts_trace_dropped(const ts_trace *t) { return t ? t->dropped : 0; }

/* The JSON of every rank's spans: all (N, most, FIELDS), counts (N). */
static ts_status write_json(const double *all, const double *counts, int N, size_t most,
                            double dropped, const char *path) {
  double t0 = 0;
  int first = 1;
  for (int r = 0; r < N; r++)
    for (size_t i = 0; i < (size_t)counts[r]; i++) {
      double ts = all[((size_t)r * most + i) * FIELDS];
      if (first || ts < t0) t0 = ts, first = 0;
    }
  cJSON *root = cJSON_CreateObject(), *events = cJSON_AddArrayToObject(root, "traceEvents");
  for (int r = 0; r < N; r++) {
    char name[32];
    snprintf(name, sizeof name, "rank %d", r);
    add_name(events, r, -1, name);
    for (int k = 0; k < 2; k++) add_name(events, r, k, TRACKS[k]);
    for (size_t i = 0; i < (size_t)counts[r]; i++) {
      const double *s = all + ((size_t)r * most + i) * FIELDS;
      int kind = (int)s[2];
      cJSON *e = cJSON_CreateObject(), *a = cJSON_CreateObject();
      cJSON_AddStringToObject(e, "name", (unsigned)kind < TS_SPAN_NUM_KINDS ? NAMES[kind] : "?");
      cJSON_AddStringToObject(e, "cat",
                              (unsigned)kind < TS_SPAN_NUM_KINDS ? CATEGORIES[kind] : "?");
      cJSON_AddStringToObject(e, "ph", "X");
      cJSON_AddNumberToObject(e, "ts", s[0] - t0);
      cJSON_AddNumberToObject(e, "dur", s[1]);
      cJSON_AddNumberToObject(e, "pid", r);
      int flags = (int)s[5];
      cJSON_AddNumberToObject(e, "tid", track_of(kind, flags));
      if (s[3] >= 0) cJSON_AddNumberToObject(a, "unit", s[3]);
      if (s[4] >= 0) cJSON_AddNumberToObject(a, "mb", s[4]);
      if (flags & TS_TRACE_ASYNC) cJSON_AddNumberToObject(a, "async", 1);
      if (flags & TS_TRACE_WAIT) cJSON_AddNumberToObject(a, "wait", 1);
      cJSON_AddItemToObject(e, "args", a);
      cJSON_AddItemToArray(events, e);
    }
  }
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  cJSON *other = cJSON_AddObjectToObject(root, "otherData");
  cJSON_AddStringToObject(other, "producer", "tessera");
  cJSON_AddNumberToObject(other, "trace_format", TS_TRACE_FORMAT);
  cJSON_AddStringToObject(other, "tracks",
                          "pid: rank; tid 0: compute, the optimizer step and the step's waits "
                          "for communication (args wait: 1); tid 1: communication, on the "
                          "step's thread or (args async: 1) on the communication thread");
  cJSON_AddNumberToObject(other, "dropped_spans", dropped);
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: cannot format the trace", path);
  ts_status st = ts_atomic_write(path, text, strlen(text));
  cJSON_free(text);
  return st;
}

ts_status ts_trace_write(ts_trace *t, ts_comm *c, const char *path) {
  int N = ts_comm_size(c), rank = ts_comm_rank(c);
  /* [0, N): span counts; [N]: dropped spans (sums over ranks) */
  double *counts = calloc((size_t)N + 1, sizeof *counts);
  if (!counts) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "trace: %d counts", N);
  counts[rank] = (double)t->n;
  counts[N] = (double)t->dropped;
  ts_status st = ts_comm_all_reduce_f64(c, counts, (size_t)N + 1, TS_COMM_SUM);
  size_t most = 0;
  for (int r = 0; r < N && st == TS_OK; r++)
    if ((size_t)counts[r] > most) most = (size_t)counts[r];
  /* Every rank fills its own rows, the rest are zero: the sum is a gather. */
  double *all = NULL;
  if (st == TS_OK) {
    all = calloc((size_t)N * most * FIELDS + 1, sizeof *all);
    if (!all) st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "trace: %zu spans", (size_t)N * most);
  }
  /* an allocation failure on one rank must not leave the others waiting */
  double ok = st == TS_OK ? 0 : 1;
  ts_status agree = ts_comm_all_reduce_f64(c, &ok, 1, TS_COMM_MAX);
  if (st == TS_OK && agree != TS_OK) st = agree;
  if (st == TS_OK && ok > 0)
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "trace: another rank could not gather the spans");
  if (st == TS_OK) {
    if (t->n) memcpy(all + (size_t)rank * most * FIELDS, t->spans, t->n * FIELDS * sizeof *all);
    st = ts_comm_all_reduce_f64(c, all, (size_t)N * most * FIELDS, TS_COMM_SUM);
  }
  if (st == TS_OK && rank == 0) st = write_json(all, counts, N, most, counts[N], path);
  /* every rank learns whether rank 0 wrote the file */
  double bad = st == TS_OK ? 0 : 1;
  if (ts_comm_all_reduce_f64(c, &bad, 1, TS_COMM_MAX) == TS_OK && bad > 0 && st == TS_OK)
    st = ts_set_error(TS_ERR_IO, "%s: rank 0 could not write the trace", path);
  free(all);
  free(counts);
  return st;
}

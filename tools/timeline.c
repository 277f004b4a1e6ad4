/* timeline.c — `tessera timeline TRACE`: one optimizer step of a
 * `train --trace` file (engine/trace.h: Chrome trace events, a process per
 * rank; format 1's one track per rank is read too) as the pipeline's
 * timeline: per rank, the time its units compute
 * (forward, backward, recompute spans) inside the step's window (from the
 * first compute span of the step on any rank to the last one's end), the
 * idle rest as the measured bubble, the time in collectives (all-gather,
 * reduce-scatter) and the part of it the step waited for (exposed: every
 * collective span that ran on the step's thread, and the spans marked
 * "wait": 1, the step's waits for collectives that ran on the
 * communication thread, which are marked "async": 1 and count as time in
 * collectives only), and a
 * picture (gnuplot) with one row
 * per rank, a box per micro-batch's forward or backward on that rank, the
 * receives (time spent waiting for a neighbour stage) and collectives
 * between them. compare and tools/bench_pipeline.sh use it. */
#include "tools/timeline.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "tools/flags.h"
#include "tools/tools.h"

enum { K_COMPUTE, K_RECV, K_SEND, K_COMM, K_OPTIMIZER, K_OTHER };
enum { TIMELINE_MAX_RANKS = 1 << 20 }; /* a span's rank (pid or tid) is below this */

/* The kind of a span named `name` and, for compute, its letter. */
static int kind_of(const char *name, char *letter) {
  *letter = 0;
  if (!strcmp(name, "forward")) return *letter = 'F', K_COMPUTE;
  if (!strcmp(name, "backward")) return *letter = 'B', K_COMPUTE;
  if (!strcmp(name, "recompute")) return *letter = 'R', K_COMPUTE;
  if (!strcmp(name, "weight")) return *letter = 'W', K_COMPUTE;
  if (!strcmp(name, "recv")) return K_RECV;
  if (!strcmp(name, "send")) return K_SEND;
  if (!strcmp(name, "all_gather") || !strcmp(name, "reduce_scatter")) return K_COMM;
  if (!strcmp(name, "optimizer_step")) return K_OPTIMIZER;
  return K_OTHER;
}

static int by_start(const void *a, const void *b) {
  const ts_timeline_span *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

void ts_timeline_free(ts_timeline *t) {
  free(t->spans);
  free(t->busy);
  free(t->comm);
  free(t->exposed);
  memset(t, 0, sizeof *t);
}

/* Reads every span of the trace, sorted by rank then start. */
static ts_status read_spans(const char *path, ts_timeline *t) {
  char *text;
  TS_CHECK(ts_read_file(path, &text, NULL));
  cJSON *root = cJSON_Parse(text);
  free(text);
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(events)) {
    cJSON_Delete(root);
    return ts_set_error(TS_ERR_FORMAT, "%s: expected a Chrome trace with \"traceEvents\" "
                                       "(tessera train --trace)", path);
  }
  size_t cap = (size_t)cJSON_GetArraySize(events);
  t->spans = calloc(cap ? cap : 1, sizeof *t->spans);
  if (!t->spans) {
    cJSON_Delete(root);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "%s: %zu events", path, cap);
  }
  /* Format 2 (engine/trace.h): the rank is the pid; format 1: the tid. */
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(root, "otherData"), "trace_format");
  int rank_is_pid = cJSON_IsNumber(format) && format->valuedouble >= 2;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
    const cJSON *track = cJSON_GetObjectItemCaseSensitive(e, rank_is_pid ? "pid" : "tid");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !cJSON_IsString(name) ||
        !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) || !cJSON_IsNumber(track))
      continue;
    if (!(track->valuedouble >= 0 && track->valuedouble < TIMELINE_MAX_RANKS)) {
      ts_status bad = ts_set_error(
          TS_ERR_FORMAT, "%s: span \"%s\": %s %g: expected a rank in [0, %d)", path,
          name->valuestring, rank_is_pid ? "pid" : "tid", track->valuedouble, TIMELINE_MAX_RANKS);
      cJSON_Delete(root);
      return bad;
    }
    ts_timeline_span *s = &t->spans[t->n++];
    s->kind = kind_of(name->valuestring, &s->letter);
    s->rank = (int)track->valuedouble;
    s->t0 = ts->valuedouble;
    s->t1 = ts->valuedouble + dur->valuedouble;
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(args, "mb");
    s->mb = cJSON_IsNumber(mb) ? (int)mb->valuedouble : -1;
    const cJSON *async = cJSON_GetObjectItemCaseSensitive(args, "async");
    s->async = cJSON_IsNumber(async) && async->valuedouble != 0;
    const cJSON *wait = cJSON_GetObjectItemCaseSensitive(args, "wait");
    s->wait = cJSON_IsNumber(wait) && wait->valuedouble != 0;
    if (s->rank + 1 > t->ranks) t->ranks = s->rank + 1;
  }
  cJSON_Delete(root);
  qsort(t->spans, t->n, sizeof *t->spans, by_start);
  return TS_OK;
}

ts_status ts_timeline_load(const char *path, int step, ts_timeline *t) {
  memset(t, 0, sizeof *t);
  ts_status st = read_spans(path, t);
  if (st == TS_OK && t->ranks == 0)
    st = ts_set_error(TS_ERR_FORMAT, "%s: no spans", path);
  if (st == TS_OK && (!(t->busy = calloc((size_t)t->ranks, sizeof *t->busy)) ||
                      !(t->comm = calloc((size_t)t->ranks, sizeof *t->comm)) ||
                      !(t->exposed = calloc((size_t)t->ranks, sizeof *t->exposed))))
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "timeline: %d ranks", t->ranks);
  if (st != TS_OK) {
    ts_timeline_free(t);
    return st;
  }
  /* Step k on a rank: its spans after its (k-1)-th optimizer step, up to
   * and including its k-th. Keep those, drop the rest. */
  size_t kept = 0;
  int steps_seen = 0;
  for (int r = 0, opt = 0; r < t->ranks; r++, opt = 0) {
    for (size_t i = 0; i < t->n; i++) {
      ts_timeline_span s = t->spans[i];
      if (s.rank != r) continue;
      if (opt + 1 == step) t->spans[kept++] = s;
      if (s.kind == K_OPTIMIZER) opt++;
    }
    if (r == 0 || opt < steps_seen) steps_seen = opt;
  }
  t->n = kept;
  if (step < 1 || step > steps_seen) {
    ts_timeline_free(t);
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "--step %d: expected 1 to %d (the steps of %s)",
                        step, steps_seen, path);
  }
  /* The window: the step's compute on every rank. */
  int first = 1;
  for (size_t i = 0; i < t->n; i++) {
    const ts_timeline_span *s = &t->spans[i];
    if (s->kind != K_COMPUTE) continue;
    if (first || s->t0 < t->begin) t->begin = s->t0;
    if (first || s->t1 > t->end) t->end = s->t1;
    first = 0;
  }
  for (size_t i = 0; i < t->n; i++) {
    const ts_timeline_span *s = &t->spans[i];
    if (s->kind == K_COMPUTE) t->busy[s->rank] += s->t1 - s->t0;
    if (s->kind == K_COMM) {
      if (!s->wait) t->comm[s->rank] += s->t1 - s->t0;
      if (!s->async) t->exposed[s->rank] += s->t1 - s->t0;
    }
  }
  double idle = 0, window = t->end - t->begin, most = 0;
  for (int r = 0; r < t->ranks; r++) {
    idle += window - t->busy[r];
    if (t->busy[r] > most) most = t->busy[r];
  }
  t->bubble = window > 0 ? idle / (window * t->ranks) : 0;
  t->bubble_busiest = window > 0 ? 1 - most / window : 0;
  return TS_OK;
}

/* ---- the picture ------------------------------------------------------------ */

static const char *color_of(int kind, char letter) {
  if (kind == K_COMPUTE)
    return letter == 'F'   ? "0x4C8BE8"
           : letter == 'B' ? "0x2E9D52"
           : letter == 'W' ? "0xE67E22"
                           : "0xF2B705";
  if (kind == K_RECV) return "0xD0D0D0";
  if (kind == K_COMM) return "0xE57373";
  if (kind == K_OPTIMIZER) return "0x8E6CC8";
  return "0x909090";
}

ts_status ts_timeline_draw(const ts_timeline *t, const char *title, const char *dir,
                           const char *png) {
  char dat[4200], gp[4200], tmp[4200], log[4200];
  snprintf(dat, sizeof dat, "%s/timeline.dat", dir);
  snprintf(gp, sizeof gp, "%s/timeline.gp", dir);
  snprintf(log, sizeof log, "%s/timeline.log", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", png);
  FILE *f = fopen(dat, "w");
  if (!f) return ts_set_error(TS_ERR_IO, "%s: %s", dat, strerror(errno));
  /* Consecutive spans of one kind and micro-batch on a rank (a stage's
   * units one after another) become one box, labelled F3, B3, R3. */
  double ms = 1e-3, window = t->end - t->begin;
  for (size_t i = 0; i < t->n;) {
    const ts_timeline_span *s = &t->spans[i];
    size_t j = i + 1;
    double t1 = s->t1;
    while (j < t->n && t->spans[j].rank == s->rank && t->spans[j].kind == s->kind &&
           t->spans[j].letter == s->letter && t->spans[j].mb == s->mb &&
           t->spans[j].t0 - t1 < 0.002 * window)
      t1 = t->spans[j++].t1;
    if (s->kind != K_SEND) { /* a send is posted, not waited: nothing to see */
      char label[16] = "";
      if (s->kind == K_COMPUTE && s->mb >= 0 && (t1 - s->t0) > window / 40)
        snprintf(label, sizeof label, "%c%d", s->letter, s->mb);
      fprintf(f, "%d %.4f %.4f %s \"%s\"\n", s->rank, (s->t0 - t->begin) * ms,
              (t1 - t->begin) * ms, color_of(s->kind, s->letter), label);
    }
    i = j;
  }
  fclose(f);
  f = fopen(gp, "w");
  if (!f) return ts_set_error(TS_ERR_IO, "%s: %s", gp, strerror(errno));
  fprintf(f,
          "set terminal pngcairo size 1200,%d font 'sans,10'\nset output '%s'\n"
          "set title \"%s\"\nset xlabel 'ms from the step''s first compute'\n"
          "set yrange [%d.6:-0.6]\nset ytics (",
          160 + 56 * t->ranks, tmp, title, t->ranks - 1);
  for (int r = 0; r < t->ranks; r++) fprintf(f, "%s\"rank %d\" %d", r ? ", " : "", r, r);
  fprintf(f,
          ")\nset xrange [%.4f:%.4f]\nset grid xtics\nset style fill solid 0.9 border rgb 'black'\n"
          "set key outside below horizontal\n"
          "plot '%s' using (($2+$3)/2):1:(($3-$2)/2):(0.36):4 with boxxyerror lc rgb variable "
          "notitle, '' using (($2+$3)/2):1:5 with labels font ',8' notitle, "
          "NaN with boxes fs solid lc rgb '#4C8BE8' title 'forward', "
          "NaN with boxes fs solid lc rgb '#2E9D52' title 'backward', "
          "NaN with boxes fs solid lc rgb '#F2B705' title 'recompute', "
          "NaN with boxes fs solid lc rgb '#E67E22' title 'weight gradients (W)', "
          "NaN with boxes fs solid lc rgb '#D0D0D0' title 'receive (waiting for a neighbour)', "
          "NaN with boxes fs solid lc rgb '#E57373' title 'all-gather / reduce-scatter', "
          "NaN with boxes fs solid lc rgb '#8E6CC8' title 'optimizer step'\n",
          -0.01 * window * ms, 1.01 * window * ms, dat);
  fclose(f);
  char *argv[] = {"/usr/bin/gnuplot", gp, NULL};
  if (access(argv[0], X_OK) != 0)
    return ts_set_error(TS_ERR_IO, "/usr/bin/gnuplot not found: install gnuplot-nox "
                                   "(tools/setup.sh does)");
  int rc = ts_tool_spawn(argv, log);
  if (rc != 0) {
    remove(tmp);
    return ts_set_error(TS_ERR_IO, "gnuplot failed (exit %d): see %s", rc, log);
  }
  return ts_atomic_rename(tmp, png);
}

/* ---- the subcommand --------------------------------------------------------- */

static const char *USAGE =
    "usage: tessera timeline TRACE [--step K] [--png FILE] [--json]\n"
    "  One optimizer step of a `tessera train --trace` file: per rank the time its\n"
    "  units compute in the step's window and the idle rest (the measured bubble),\n"
    "  the time in all-gathers and reduce-scatters and how much of it the step\n"
    "  waited for (exposed), and with --png a picture of the pipeline's timeline.\n";

int ts_tool_timeline(int argc, char **argv) {
  size_t step = 2;
  const char *png = NULL;
  int json = 0;
  const ts_flag flags[] = {
      TS_FLAG_SIZE("--step", NULL, &step, 1, "K",
                   "the optimizer step to show (default 2: step 1 warms caches)", NULL),
      TS_FLAG_STRING("--png", NULL, &png, "FILE", "draw the timeline to FILE (gnuplot)", NULL),
      TS_FLAG_SWITCH("--json", NULL, &json, "print one JSON object instead of the text"),
  };
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
      fputs(USAGE, stdout);
      return 0;
    }
    return ts_flags_error("timeline", "expected a trace file first (tessera train --trace FILE)");
  }
  const char *path = argv[1];
  int r = ts_flags_parse("timeline", flags, sizeof flags / sizeof *flags, argc - 1, argv + 1,
                         USAGE);
  if (r != TS_FLAGS_OK) return r == TS_FLAGS_HELP ? 0 : 2;
  ts_timeline t;
  ts_status st = ts_timeline_load(path, (int)step, &t);
  if (st != TS_OK) {
    fprintf(stderr, "tessera timeline: %s\n", ts_flags_last_error());
    return st == TS_ERR_INVALID_ARGUMENT || st == TS_ERR_FORMAT ? 2 : 1;
  }
  double window = (t.end - t.begin) * 1e-3;
  if (json) {
    printf("{\"step\": %zu, \"ranks\": %d, \"window_ms\": %.4f, \"bubble\": %.6f, "
           "\"bubble_busiest\": %.6f, \"busy_ms\": [",
           step, t.ranks, window, t.bubble, t.bubble_busiest);
    for (int q = 0; q < t.ranks; q++) printf("%s%.4f", q ? ", " : "", t.busy[q] * 1e-3);
    printf("], \"comm_ms\": [");
    for (int q = 0; q < t.ranks; q++) printf("%s%.4f", q ? ", " : "", t.comm[q] * 1e-3);
    printf("], \"exposed_comm_ms\": [");
    for (int q = 0; q < t.ranks; q++) printf("%s%.4f", q ? ", " : "", t.exposed[q] * 1e-3);
    printf("]}\n");
  } else {
    printf("step %zu of %s: %d ranks, window %.2f ms (first compute to last)\n", step, path,
           t.ranks, window);
    for (int q = 0; q < t.ranks; q++)
      printf(
          "rank %d: computes %.2f ms, idle %.2f ms (%.1f%%); collectives %.2f ms, %.2f ms "
          "of them exposed\n",
          q, t.busy[q] * 1e-3, window - t.busy[q] * 1e-3, 100.0 * (1 - t.busy[q] * 1e-3 / window),
          t.comm[q] * 1e-3, t.exposed[q] * 1e-3);
    printf("bubble: %.1f%% on the busiest rank (fill and drain), %.1f%% mean over ranks "
           "(with the stages' imbalance)\n",
           100.0 * t.bubble_busiest, 100.0 * t.bubble);
  }
  if (png && st == TS_OK) {
    char dir[4096], title[512];
    snprintf(dir, sizeof dir, "%s", png);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    snprintf(title, sizeof title,
             "step %zu: %d ranks, bubble %.1f%% on the busiest rank, %.1f%% mean (measured)",
             step, t.ranks, 100.0 * t.bubble_busiest, 100.0 * t.bubble);
    st = ts_timeline_draw(&t, title, dir, png);
    if (st != TS_OK) fprintf(stderr, "tessera timeline: %s\n", ts_flags_last_error());
  }
  ts_timeline_free(&t);
  return st == TS_OK ? 0 : 1;
}

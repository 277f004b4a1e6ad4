/*
 * split.c — the split of a model's units into pipeline stages
 * (schedule.h): balanced by cost (the least largest stage), ZB-V's V
 * (each stage's two pieces balanced), or given by the user.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/schedule.h"

ts_status ts_pipeline_split_balanced(const double *cost, int n, int stages, int *first) {
  if (stages < 1 || stages > n)
    return ts_set_error(
        TS_ERR_INVALID_ARGUMENT,
        "`pipeline_stages` %d: expected 1 to %d stages (one unit each at least; the "
        "model has %d units)",
        stages, n, n);
  int P = stages;
  double *prefix = calloc((size_t)n + 1, sizeof(double));
  double *best = malloc((size_t)(P + 1) * (size_t)(n + 1) * sizeof(double));
  int *cut = malloc((size_t)(P + 1) * (size_t)(n + 1) * sizeof(int));
  if (!prefix || !best || !cut) {
    free(prefix), free(best), free(cut);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline split: %d units, %d stages", n, P);
  }
#define B(p, i) best[(size_t)(p) * (size_t)(n + 1) + (size_t)(i)]
#define C(p, i) cut[(size_t)(p) * (size_t)(n + 1) + (size_t)(i)]
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
  for (int i = 0; i <= n; i++) B(1, i) = prefix[i], C(1, i) = 0;
  /* B(p, i): the least possible largest stage cost of the first i units in
   * p stages; C(p, i): where its last stage starts (the earliest that
   * attains it). */
  for (int p = 2; p <= P; p++)
    for (int i = p; i <= n; i++) {
      B(p, i) = DBL_MAX;
      C(p, i) = p - 1;
      for (int j = p - 1; j < i; j++) {
        double a = B(p - 1, j), b = prefix[i] - prefix[j], v = a > b ? a : b;
        if (v < B(p, i)) B(p, i) = v, C(p, i) = j;
      }
    }
  for (int p = P, i = n; p >= 1; p--) {
    first[p - 1] = C(p, i);
    i = C(p, i);
  }
#undef B
#undef C
  free(prefix), free(best), free(cut);
  return TS_OK;
}

ts_status ts_pipeline_split_v(const double *cost, int n, int stages, int *first) {
  int P = stages;
  if (P < 1 || 2 * P > n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_stages` %d in a V: expected 1 to %d stages (two pieces of one "
                        "unit each at least; the model has %d units)",
                        P, n / 2, n);
  double *prefix = calloc((size_t)n + 1, sizeof(double));
  if (!prefix) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline split: %d units", n);
  for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + cost[i];
#define COST(a, b) (prefix[b] - prefix[a])
  int a = 0, b = n; /* the units left: [a, b) */
  for (int s = 0; s < P - 1; s++) {
    int after = 2 * (P - 1 - s); /* units the stages after this one need at least */
    double share = COST(a, b) / (double)(P - s);
    int f = a + 1; /* the front piece [a, f): nearest half the share */
    while (f + 1 <= b - 1 - after &&
           fabs(COST(a, f + 1) - share / 2) < fabs(COST(a, f) - share / 2))
      f++;
    int k = b - 1; /* the back piece [k, b): the pair nearest the share */
    while (k - 1 >= f + after &&
           fabs(COST(a, f) + COST(k - 1, b) - share) < fabs(COST(a, f) + COST(k, b) - share))
      k--;
    first[s] = a;
    first[2 * P - 1 - s] = k;
    a = f;
    b = k;
  }
  int mid = a + 1; /* the last stage: the middle [a, b) at its half */
  while (mid + 1 <= b - 1 &&
         fabs(COST(a, mid + 1) - COST(mid + 1, b)) < fabs(COST(a, mid) - COST(mid, b)))
    mid++;
  first[P - 1] = a;
  first[P] = mid;
  first[2 * P] = n;
  /* the pieces of least largest cost, when their busiest stage is less busy */
  int *other = malloc((size_t)(2 * P + 1) * sizeof *other);
  ts_status st = other ? ts_pipeline_split_balanced(cost, n, 2 * P, other)
                       : ts_set_error(TS_ERR_OUT_OF_MEMORY, "pipeline split: %d pieces", 2 * P);
  if (st == TS_OK) {
    other[2 * P] = n;
    double mine = 0, theirs = 0;
    for (int s = 0; s < P; s++) {
      int j = 2 * P - 1 - s;
      double x = COST(first[s], first[s + 1]) + COST(first[j], first[j + 1]);
      double y = COST(other[s], other[s + 1]) + COST(other[j], other[j + 1]);
      mine = x > mine ? x : mine;
      theirs = y > theirs ? y : theirs;
    }
    if (theirs < mine) memcpy(first, other, (size_t)(2 * P + 1) * sizeof *first);
  }
#undef COST
  free(other);
  free(prefix);
  return st;
}

ts_status ts_pipeline_split_parse(const char *text, int n, int stages, int *first) {
  const char *p = text;
  int sum = 0;
  for (int s = 0; s < stages; s++) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 1 || v > n || *p < '0' || *p > '9')
      return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                          "`pipeline_split` %s: stage %d: expected a count of units from 1 to %d",
                          text, s, n);
    first[s] = sum;
    sum += (int)v;
    p = end;
    if (s + 1 < stages) {
      if (*p != ',')
        return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                            "`pipeline_split` %s: expected %d comma-separated counts, one per "
                            "stage (with model chunks: one per virtual stage)",
                            text, stages);
      p++;
    }
  }
  if (*p != '\0')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_split` %s: expected %d counts, one per stage (with model "
                        "chunks: one per virtual stage)",
                        text, stages);
  if (sum != n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_split` %s: covers %d units: expected the model's %d exactly",
                        text, sum, n);
  return TS_OK;
}

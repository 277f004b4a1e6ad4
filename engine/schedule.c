/*
 * schedule.c — GPipe and 1F1B as per-stage action lists, their simulator,
 * and the split of units into stages (schedule.h).
 */
#include "engine/schedule.h"

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ts_schedule_kind_name(ts_schedule_kind k) {
  return k == TS_SCHEDULE_GPIPE ? "gpipe" : k == TS_SCHEDULE_1F1B ? "1f1b" : "?";
}

const char *ts_action_kind_name(ts_action_kind k) {
  static const char *names[TS_ACT_NUM_KINDS] = {
      "forward", "backward",  "send_act",      "recv_act",   "send_grad",
      "recv_grad", "reduce", "optimizer", "backward_unit", "reduce_unit", "optimizer_unit",
      "optimizer_end"};
  return (unsigned)k < TS_ACT_NUM_KINDS ? names[k] : "?";
}

ts_status ts_schedule_kind_parse(const char *s, ts_schedule_kind *kind) {
  if (strcmp(s, "gpipe") == 0) *kind = TS_SCHEDULE_GPIPE;
  else if (strcmp(s, "1f1b") == 0) *kind = TS_SCHEDULE_1F1B;
  else return ts_set_error(TS_ERR_INVALID_ARGUMENT, "schedule %s: expected gpipe or 1f1b", s);
  return TS_OK;
}

int ts_schedule_in_flight(ts_schedule_kind kind, int stages, int micro_batches, int s) {
  if (kind == TS_SCHEDULE_GPIPE) return micro_batches;
  int w = stages - s; /* warm-up forwards plus the steady state's one */
  return w < micro_batches ? w : micro_batches;
}

/* ---- building ------------------------------------------------------------- */

typedef struct {
  ts_stage_schedule *st;
  size_t cap;
} list;

static void push(list *l, ts_action_kind kind, int mb, int peer) {
  l->st->actions[l->st->n++] = (ts_action){kind, mb, peer, -1};
  TS_ASSERT(l->st->n <= l->cap);
}

/* Forward of mb on stage s of P, with its receive and send. */
static void forward(list *l, int s, int P, int mb) {
  if (s > 0) push(l, TS_ACT_RECV_ACT, mb, s - 1);
  push(l, TS_ACT_FORWARD, mb, -1);
  if (s < P - 1) push(l, TS_ACT_SEND_ACT, mb, s + 1);
}

/* Backward of mb on stage s of P, with its receive and send. */
static void backward(list *l, int s, int P, int mb) {
  if (s < P - 1) push(l, TS_ACT_RECV_GRAD, mb, s + 1);
  push(l, TS_ACT_BACKWARD, mb, -1);
  if (s > 0) push(l, TS_ACT_SEND_GRAD, mb, s - 1);
}

ts_status ts_schedule_build(ts_schedule_kind kind, int stages, int micro_batches,
                            ts_schedule *out) {
  memset(out, 0, sizeof *out);
  if (stages < 1 || micro_batches < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule: %d stages, %d micro-batches: expected each >= 1", stages,
                        micro_batches);
  if (kind != TS_SCHEDULE_GPIPE && kind != TS_SCHEDULE_1F1B)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT, "schedule kind %d: expected gpipe or 1f1b",
                        (int)kind);
  int P = stages, m = micro_batches;
  out->kind = kind;
  out->stages = P;
  out->micro_batches = m;
  out->stage = calloc((size_t)P, sizeof *out->stage);
  if (!out->stage) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule: %d stages", P);
  size_t cap = 6 * (size_t)m + 2; /* 3 actions per pass at most, two passes, then 2 */
  for (int s = 0; s < P; s++) {
    out->stage[s].actions = malloc(cap * sizeof(ts_action));
    if (!out->stage[s].actions) {
      ts_schedule_free(out);
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule: %zu actions", cap);
    }
    list l = {&out->stage[s], cap};
    if (kind == TS_SCHEDULE_GPIPE) {
      for (int i = 0; i < m; i++) forward(&l, s, P, i);
      for (int i = 0; i < m; i++) backward(&l, s, P, i);
    } else {
      int w = P - s - 1 < m ? P - s - 1 : m; /* warm-up forwards */
      for (int i = 0; i < w; i++) forward(&l, s, P, i);
      for (int j = 0; j < m - w; j++) { /* steady: one forward, one backward */
        forward(&l, s, P, w + j);
        backward(&l, s, P, j);
      }
      for (int i = m - w; i < m; i++) backward(&l, s, P, i); /* cool-down */
    }
    push(&l, TS_ACT_REDUCE, -1, -1);
    push(&l, TS_ACT_OPTIMIZER, -1, -1);
  }
  return TS_OK;
}

void ts_schedule_free(ts_schedule *s) {
  if (s->stage)
    for (int i = 0; i < s->stages; i++) free(s->stage[i].actions);
  free(s->stage);
  memset(s, 0, sizeof *s);
}

/* ---- the simulator ------------------------------------------------------------ */

/* A FIFO of posted sends (their micro-batches) on one directed link. */
typedef struct {
  int *mb;
  size_t head, tail;
} fifo;

typedef struct {
  int P, m;
  ts_schedule_kind kind;
  int *fwd, *bwd, *got_act, *got_grad, *sent_act, *sent_grad; /* (P, m) flags */
  const size_t *n_of; /* (P) list lengths */
  int *next_bwd, *in_flight, *reduced, *optimized; /* (P) */
  fifo *act, *grad; /* act[s]: s -> s + 1; grad[s]: s -> s - 1 (P each) */
  ts_schedule_report *r;
} sim;

#define AT(a, s, i) ((a)[(size_t)(s) * (size_t)S->m + (size_t)(i)])

static ts_status violation(sim *S, int s, size_t pc, const ts_action *a, const char *what) {
  snprintf(S->r->msg, sizeof S->r->msg, "P=%d m=%d: stage %d action %zu (%s mb %d): %s", S->P,
           S->m, s, pc, ts_action_kind_name(a->kind), a->mb, what);
  return ts_set_error(TS_ERR_INTERNAL, "schedule %s", S->r->msg);
}

/* The executor's slot rule (engine/pipeline.c): micro-batch mb uses slot
 * mb % n on stage s (n = ts_schedule_in_flight), and before its forward
 * (which writes the slot's output) or backward (which writes the slot's
 * input gradient and may rewrite the output) the sends of the micro-batch
 * that used the slot before, mb - n, must have been received; before a
 * backward also mb's own output. 1 when that holds. */
static int slot_free(const sim *S, int s, int mb, int forward) {
  int n = ts_schedule_in_flight(S->kind, S->P, S->m, s), prev = mb - n;
  if (s < S->P - 1 && prev >= 0 && !AT(S->got_act, s + 1, prev)) return 0;
  if (forward) return 1;
  if (s > 0 && prev >= 0 && !AT(S->got_grad, s - 1, prev)) return 0;
  return s == S->P - 1 || AT(S->got_act, s + 1, mb);
}

/* Runs stage s's action a if it can; *ran = 1 then. Errors: a violation. */
static ts_status step(sim *S, int s, size_t pc, const ts_action *a, int last, int *ran) {
  int P = S->P, m = S->m, mb = a->mb;
  *ran = 0;
  int needs_mb = a->kind != TS_ACT_REDUCE && a->kind != TS_ACT_OPTIMIZER;
  if (needs_mb && (mb < 0 || mb >= m)) return violation(S, s, pc, a, "micro-batch out of range");
  switch (a->kind) {
    case TS_ACT_FORWARD:
      if (AT(S->fwd, s, mb)) return violation(S, s, pc, a, "second forward");
      if (s > 0 && !AT(S->got_act, s, mb)) return violation(S, s, pc, a, "input not received");
      if (!slot_free(S, s, mb, 1)) return TS_OK; /* blocked: its slot's output is in flight */
      AT(S->fwd, s, mb) = 1;
      S->in_flight[s]++;
      if (s < 64 && S->in_flight[s] > S->r->max_in_flight[s])
        S->r->max_in_flight[s] = S->in_flight[s];
      break;
    case TS_ACT_BACKWARD:
      if (!AT(S->fwd, s, mb)) return violation(S, s, pc, a, "backward before forward");
      if (AT(S->bwd, s, mb)) return violation(S, s, pc, a, "second backward");
      if (mb != S->next_bwd[s]) return violation(S, s, pc, a, "backward out of micro-batch order");
      if (s < P - 1 && !AT(S->got_grad, s, mb))
        return violation(S, s, pc, a, "output gradient not received");
      if (!slot_free(S, s, mb, 0)) return TS_OK; /* blocked: its slot's gradient is in flight */
      AT(S->bwd, s, mb) = 1;
      S->next_bwd[s]++;
      S->in_flight[s]--;
      break;
    case TS_ACT_SEND_ACT:
    case TS_ACT_SEND_GRAD: {
      int act = a->kind == TS_ACT_SEND_ACT;
      if (a->peer != (act ? s + 1 : s - 1) || a->peer < 0 || a->peer >= P)
        return violation(S, s, pc, a, "send to a stage that is not the neighbour");
      if (act ? !AT(S->fwd, s, mb) : !AT(S->bwd, s, mb))
        return violation(S, s, pc, a, "sends what was not computed");
      int *sent = act ? &AT(S->sent_act, s, mb) : &AT(S->sent_grad, s, mb);
      if (*sent) return violation(S, s, pc, a, "second send of the same micro-batch");
      *sent = 1;
      fifo *f = act ? &S->act[s] : &S->grad[s];
      f->mb[f->tail++] = mb;
      break;
    }
    case TS_ACT_RECV_ACT:
    case TS_ACT_RECV_GRAD: {
      int act = a->kind == TS_ACT_RECV_ACT;
      if (a->peer != (act ? s - 1 : s + 1) || a->peer < 0 || a->peer >= P)
        return violation(S, s, pc, a, "receive from a stage that is not the neighbour");
      fifo *f = act ? &S->act[a->peer] : &S->grad[a->peer];
      if (f->head == f->tail) return TS_OK; /* blocked: the send is not posted yet */
      if (act ? AT(S->got_act, s, mb) : AT(S->got_grad, s, mb))
        return violation(S, s, pc, a, "second receive of the same micro-batch");
      if (f->mb[f->head] != mb)
        return violation(S, s, pc, a, "matches a send of another micro-batch (order)");
      f->head++;
      if (act) AT(S->got_act, s, mb) = 1;
      else AT(S->got_grad, s, mb) = 1;
      break;
    }
    case TS_ACT_REDUCE:
      if (S->next_bwd[s] != m) return violation(S, s, pc, a, "reduce before every backward");
      if (S->reduced[s]) return violation(S, s, pc, a, "second reduce");
      if (pc + 2 != S->n_of[s]) return violation(S, s, pc, a, "reduce is not second to last");
      for (int i = 0; i < m; i++) /* the executor waits for every send to be received */
        if ((s < P - 1 && !AT(S->got_act, s + 1, i)) || (s > 0 && !AT(S->got_grad, s - 1, i)))
          return TS_OK;
      S->reduced[s] = 1;
      break;
    case TS_ACT_OPTIMIZER:
      if (!S->reduced[s]) return violation(S, s, pc, a, "optimizer step before the reduce");
      if (!last) return violation(S, s, pc, a, "optimizer step is not the last action");
      S->optimized[s] = 1;
      break;
    default:
      return violation(S, s, pc, a, "unknown action");
  }
  *ran = 1;
  return TS_OK;
}

ts_status ts_schedule_simulate(const ts_schedule *sch, ts_schedule_report *report) {
  memset(report, 0, sizeof *report);
  int P = sch->stages, m = sch->micro_batches;
  sim Sv;
  memset(&Sv, 0, sizeof Sv);
  sim *S = &Sv;
  S->P = P;
  S->m = m;
  S->kind = sch->kind;
  S->r = report;
  size_t pm = (size_t)P * (size_t)m;
  size_t *n_of = calloc((size_t)P, sizeof(size_t));
  for (int s = 0; n_of && s < P; s++) n_of[s] = sch->stage[s].n;
  S->n_of = n_of;
  S->sent_act = calloc(pm, sizeof(int));
  S->sent_grad = calloc(pm, sizeof(int));
  S->optimized = calloc((size_t)P, sizeof(int));
  S->fwd = calloc(pm, sizeof(int));
  S->bwd = calloc(pm, sizeof(int));
  S->got_act = calloc(pm, sizeof(int));
  S->got_grad = calloc(pm, sizeof(int));
  S->next_bwd = calloc((size_t)P, sizeof(int));
  S->in_flight = calloc((size_t)P, sizeof(int));
  S->reduced = calloc((size_t)P, sizeof(int));
  S->act = calloc((size_t)P, sizeof(fifo));
  S->grad = calloc((size_t)P, sizeof(fifo));
  size_t *pc = calloc((size_t)P, sizeof(size_t));
  ts_status st = TS_OK;
  if (!S->fwd || !S->bwd || !S->got_act || !S->got_grad || !S->next_bwd || !S->in_flight ||
      !S->reduced || !S->act || !S->grad || !pc || !n_of || !S->sent_act || !S->sent_grad ||
      !S->optimized)
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule simulator: P=%d m=%d", P, m);
  for (int s = 0; s < P && st == TS_OK; s++) {
    /* a link carries at most one send per action of its sender */
    S->act[s].mb = calloc(sch->stage[s].n + 1, sizeof(int));
    S->grad[s].mb = calloc(sch->stage[s].n + 1, sizeof(int));
    if (!S->act[s].mb || !S->grad[s].mb)
      st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule simulator: links");
  }
  /* Rounds: every stage runs at most one action per round, blocked
   * receives wait; a round where nobody runs, with work left, deadlocks. */
  for (int done = 0; st == TS_OK && !done;) {
    int progress = 0;
    done = 1;
    for (int s = 0; s < P && st == TS_OK; s++) {
      const ts_stage_schedule *l = &sch->stage[s];
      if (pc[s] == l->n) continue;
      done = 0;
      int ran = 0;
      st = step(S, s, pc[s], &l->actions[pc[s]], pc[s] + 1 == l->n, &ran);
      if (ran) {
        pc[s]++;
        progress = 1;
      }
    }
    if (!done) report->rounds++;
    if (st == TS_OK && !done && !progress) {
      report->deadlocked = 1;
      int s = 0;
      while (pc[s] == sch->stage[s].n) s++;
      st = violation(S, s, pc[s], &sch->stage[s].actions[pc[s]], "deadlock: waits forever");
    }
  }
  for (int s = 0; s < P && st == TS_OK; s++) {
    ts_action none = {TS_ACT_OPTIMIZER, -1, -1, -1};
    if (S->next_bwd[s] != m || !S->reduced[s] || !S->optimized[s])
      st = violation(S, s, pc[s], &none,
                     "the list ends before every backward, the reduce and the optimizer step");
    else if (S->act[s].head != S->act[s].tail || S->grad[s].head != S->grad[s].tail)
      st = violation(S, s, pc[s], &none, "a send nobody received");
    for (int i = 0; i < m && st == TS_OK; i++)
      if (!AT(S->fwd, s, i)) st = violation(S, s, pc[s], &none, "a micro-batch never ran forward");
  }
  for (int s = 0; s < P && S->act && S->grad; s++) {
    free(S->act[s].mb);
    free(S->grad[s].mb);
  }
  free(S->fwd), free(S->bwd), free(S->got_act), free(S->got_grad), free(S->next_bwd);
  free(S->in_flight), free(S->reduced), free(S->act), free(S->grad), free(pc);
  free(n_of), free(S->sent_act), free(S->sent_grad), free(S->optimized);
  return st;
}

/* ---- splits ------------------------------------------------------------------- */

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
                            "stage",
                            text, stages);
      p++;
    }
  }
  if (*p != '\0')
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_split` %s: expected %d counts, one per stage", text, stages);
  if (sum != n)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "`pipeline_split` %s: covers %d units: expected the model's %d exactly",
                        text, sum, n);
  return TS_OK;
}

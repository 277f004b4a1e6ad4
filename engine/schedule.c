/*
 * schedule.c — the schedules (GPipe, 1F1B, interleaved, ZB-H1, ZB-V) as
 * per-stage action lists, their simulator and their own timing
 * (schedule.h); the split of units into stages is split.c's.
 */
#include "engine/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ts_schedule_kind_name(ts_schedule_kind k) {
  return k == TS_SCHEDULE_GPIPE         ? "gpipe"
         : k == TS_SCHEDULE_1F1B        ? "1f1b"
         : k == TS_SCHEDULE_INTERLEAVED ? "interleaved"
         : k == TS_SCHEDULE_ZB_H1       ? "zb-h1"
         : k == TS_SCHEDULE_ZBV         ? "zbv"
                                        : "?";
}

const char *ts_action_kind_name(ts_action_kind k) {
  static const char *names[TS_ACT_NUM_KINDS] = {
      "forward",   "backward",      "send_act",    "recv_act",       "send_grad",
      "recv_grad", "reduce",        "optimizer",   "weight",         "backward_unit",
      "reduce_unit", "optimizer_unit", "optimizer_end", "weight_unit"};
  return (unsigned)k < TS_ACT_NUM_KINDS ? names[k] : "?";
}

ts_status ts_schedule_kind_parse(const char *s, ts_schedule_kind *kind) {
  if (strcmp(s, "gpipe") == 0) *kind = TS_SCHEDULE_GPIPE;
  else if (strcmp(s, "1f1b") == 0) *kind = TS_SCHEDULE_1F1B;
  else if (strcmp(s, "interleaved") == 0) *kind = TS_SCHEDULE_INTERLEAVED;
  else if (strcmp(s, "zb-h1") == 0) *kind = TS_SCHEDULE_ZB_H1;
  else if (strcmp(s, "zbv") == 0) *kind = TS_SCHEDULE_ZBV;
  else
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule %s: expected gpipe, 1f1b, interleaved, zb-h1 or zbv", s);
  return TS_OK;
}

int ts_schedule_in_flight(ts_schedule_kind kind, int stages, int micro_batches, int s) {
  if (kind == TS_SCHEDULE_GPIPE) return micro_batches;
  if (kind == TS_SCHEDULE_ZB_H1) return stages < micro_batches ? stages : micro_batches;
  if (kind == TS_SCHEDULE_ZBV) return 2 * (stages < micro_batches ? stages : micro_batches);
  int w = stages - s; /* warm-up forwards plus the steady state's one */
  return w < micro_batches ? w : micro_batches;
}

/* ---- building ------------------------------------------------------------- */

typedef struct {
  ts_stage_schedule *st;
  size_t cap;
} list;

static void push_chunk(list *l, ts_action_kind kind, int mb, int peer, int chunk) {
  l->st->actions[l->st->n++] = (ts_action){kind, mb, peer, -1, chunk};
  TS_ASSERT(l->st->n <= l->cap);
}

static void push(list *l, ts_action_kind kind, int mb, int peer) {
  push_chunk(l, kind, mb, peer, 0);
}

/* Actions a stage's list holds at most: 3 per pass (a receive, the pass,
 * a send), two passes (and a W) per (chunk, micro-batch), then the reduce and the
 * optimizer step. */
static size_t list_cap(int m, int v) { return 7 * (size_t)m * (size_t)v + 2; }

/* out's header and P empty lists of list_cap(m, v) actions each. */
static ts_status new_lists(ts_schedule *out, ts_schedule_kind kind, int P, int m, int v) {
  out->kind = kind;
  out->stages = P;
  out->micro_batches = m;
  out->virtual_stages = v;
  out->stage = calloc((size_t)P, sizeof *out->stage);
  if (!out->stage) return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule: %d stages", P);
  for (int s = 0; s < P; s++) {
    out->stage[s].actions = malloc(list_cap(m, v) * sizeof(ts_action));
    if (!out->stage[s].actions) {
      ts_schedule_free(out);
      return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule: %zu actions", list_cap(m, v));
    }
  }
  return TS_OK;
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

/* ZB-H1's B of mb on stage s (backward above), then W of the oldest
 * micro-batches while more than `lag` wait for theirs; *w: the next W. */
static void backward_weight(list *l, int s, int P, int mb, int lag, int *w) {
  backward(l, s, P, mb);
  while (mb + 1 - *w > lag) push(l, TS_ACT_WEIGHT, (*w)++, -1);
}

/* ZB-V's virtual-stage passes with their receives and sends (any
 * neighbour, the rank itself included). */
static void zbv_forward(list *l, int P, int j, int mb) {
  int V = 2 * P, c = ts_schedule_chunk_of(TS_SCHEDULE_ZBV, P, j);
  if (j > 0) push_chunk(l, TS_ACT_RECV_ACT, mb, ts_schedule_rank_of(TS_SCHEDULE_ZBV, P, j - 1), c);
  push_chunk(l, TS_ACT_FORWARD, mb, -1, c);
  if (j < V - 1)
    push_chunk(l, TS_ACT_SEND_ACT, mb, ts_schedule_rank_of(TS_SCHEDULE_ZBV, P, j + 1), c);
}

static void zbv_backward(list *l, int P, int j, int mb) {
  int V = 2 * P, c = ts_schedule_chunk_of(TS_SCHEDULE_ZBV, P, j);
  if (j < V - 1)
    push_chunk(l, TS_ACT_RECV_GRAD, mb, ts_schedule_rank_of(TS_SCHEDULE_ZBV, P, j + 1), c);
  push_chunk(l, TS_ACT_BACKWARD, mb, -1, c);
  if (j > 0) push_chunk(l, TS_ACT_SEND_GRAD, mb, ts_schedule_rank_of(TS_SCHEDULE_ZBV, P, j - 1), c);
}

/* ZB-V's lists (ts_schedule_build): unit-time chunk passes placed
 * greedily, time step by time step, rank by rank. */
static ts_status build_zbv(ts_schedule *out, int P, int m) {
  int V = 2 * P;
  size_t Vm = (size_t)V * (size_t)m;
  int *nf = calloc((size_t)V * 3, sizeof(int)), *nb = nf + V, *nw = nb + V;
  long *act = malloc(Vm * sizeof(long)), *grad = malloc(Vm * sizeof(long));
  long *busy = calloc((size_t)P, sizeof(long));
  if (!nf || !act || !grad || !busy) {
    free(nf), free(act), free(grad), free(busy);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule zbv: P=%d m=%d", P, m);
  }
  for (size_t i = 0; i < Vm; i++) act[i] = grad[i] = -1;
  for (int i = 0; i < m; i++) act[i] = 0; /* virtual stage 0's inputs: the batch */
#define READY(a, j, i) ((a)[(size_t)(j) * (size_t)m + (size_t)(i)] >= 0 && \
                        (a)[(size_t)(j) * (size_t)m + (size_t)(i)] <= t)
  int done = 0;
  for (long t = 0; done < V && t < 64L * (P + 3) * (m + 3); t++) {
    for (int r = 0; r < P; r++) {
      if (busy[r] > t) continue;
      list l = {&out->stage[r], list_cap(m, 2)};
      int j0 = r, j1 = V - 1 - r;
      int held = nf[j0] - nw[j0] + nf[j1] - nw[j1], room = held < 2 * P;
      int f1 = room && nf[j1] < m && READY(act, j1, nf[j1]);
      int b1 = nb[j1] < nf[j1] && (j1 == V - 1 || READY(grad, j1, nb[j1]));
      int b0 = nb[j0] < nf[j0] && READY(grad, j0, nb[j0]);
      int f0 = room && nf[j0] < m && READY(act, j0, nf[j0]);
      int w1 = nw[j1] < nb[j1], w0 = nw[j0] < nb[j0];
      int j = f1 || b1 ? j1 : b0 || f0 ? j0 : w1 && (!w0 || nw[j1] <= nw[j0]) ? j1 : w0 ? j0 : -1;
      if (j < 0) continue;
      busy[r] = t + 1;
      if ((j == j1 && f1) || (j == j0 && !b0 && f0)) {
        int i = nf[j]++;
        zbv_forward(&l, P, j, i);
        if (j < V - 1) act[(size_t)(j + 1) * (size_t)m + (size_t)i] = t + 1;
      } else if ((j == j1 && b1) || (j == j0 && b0)) {
        int i = nb[j]++;
        zbv_backward(&l, P, j, i);
        if (j > 0) grad[(size_t)(j - 1) * (size_t)m + (size_t)i] = t + 1;
      } else {
        push_chunk(&l, TS_ACT_WEIGHT, nw[j]++, -1, ts_schedule_chunk_of(TS_SCHEDULE_ZBV, P, j));
        done += nw[j] == m;
      }
    }
  }
#undef READY
  free(nf), free(act), free(grad), free(busy);
  if (done < V) return ts_set_error(TS_ERR_INTERNAL, "schedule zbv: P=%d m=%d: no progress", P, m);
  for (int r = 0; r < P; r++) {
    list l = {&out->stage[r], list_cap(m, 2)};
    push(&l, TS_ACT_REDUCE, -1, -1);
    push(&l, TS_ACT_OPTIMIZER, -1, -1);
  }
  return TS_OK;
}

ts_status ts_schedule_build(ts_schedule_kind kind, int stages, int micro_batches,
                            ts_schedule *out) {
  memset(out, 0, sizeof *out);
  if (stages < 1 || micro_batches < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule: %d stages, %d micro-batches: expected each >= 1", stages,
                        micro_batches);
  if (kind != TS_SCHEDULE_GPIPE && kind != TS_SCHEDULE_1F1B && kind != TS_SCHEDULE_ZB_H1 &&
      kind != TS_SCHEDULE_ZBV)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule kind %d: expected gpipe, 1f1b, zb-h1 or zbv (interleaved: "
                        "ts_schedule_build_interleaved)",
                        (int)kind);
  int P = stages, m = micro_batches;
  if (kind == TS_SCHEDULE_ZBV) {
    TS_CHECK(new_lists(out, kind, P, m, 2));
    out->split_backward = 1;
    ts_status st = build_zbv(out, P, m);
    if (st != TS_OK) ts_schedule_free(out);
    return st;
  }
  TS_CHECK(new_lists(out, kind, P, m, 1));
  out->split_backward = kind == TS_SCHEDULE_ZB_H1;
  for (int s = 0; s < P; s++) {
    list l = {&out->stage[s], list_cap(m, 1)};
    if (kind == TS_SCHEDULE_ZB_H1) {
      int w = P - s - 1 < m ? P - s - 1 : m, next_w = 0; /* 1F1B's warm-up */
      for (int i = 0; i < w; i++) forward(&l, s, P, i);
      for (int j = 0; j < m - w; j++) { /* steady: F, B, and W s micro-batches behind */
        forward(&l, s, P, w + j);
        backward_weight(&l, s, P, j, s, &next_w);
      }
      for (int i = m - w; i < m; i++) backward_weight(&l, s, P, i, s, &next_w);
      while (next_w < m) push(&l, TS_ACT_WEIGHT, next_w++, -1); /* the rest fill the cool-down */
    } else if (kind == TS_SCHEDULE_GPIPE) {
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

/* Forward and backward of micro-batch mb on chunk c of rank s, with their
 * receives and sends: virtual stage j = c P + s of V = P v talks to j - 1
 * and j + 1, on ranks (s - 1) mod P and (s + 1) mod P. */
static void forward_chunk(list *l, int s, int P, int V, int c, int mb) {
  int j = c * P + s;
  if (j > 0) push_chunk(l, TS_ACT_RECV_ACT, mb, (s + P - 1) % P, c);
  push_chunk(l, TS_ACT_FORWARD, mb, -1, c);
  if (j < V - 1) push_chunk(l, TS_ACT_SEND_ACT, mb, (s + 1) % P, c);
}

static void backward_chunk(list *l, int s, int P, int V, int c, int mb) {
  int j = c * P + s;
  if (j < V - 1) push_chunk(l, TS_ACT_RECV_GRAD, mb, (s + 1) % P, c);
  push_chunk(l, TS_ACT_BACKWARD, mb, -1, c);
  if (j > 0) push_chunk(l, TS_ACT_SEND_GRAD, mb, (s + P - 1) % P, c);
}

/* Megatron-LM's warm-up forwards of rank s (all of them when m = P). */
static int interleaved_warm_up(int P, int v, int m, int s) {
  int total = m * v;
  if (m == P) return total;
  int w = (P - s - 1) * 2 + (v - 1) * P;
  return w < total ? w : total;
}

int ts_schedule_in_flight_interleaved(int stages, int virtual_stages, int micro_batches, int s) {
  int total = micro_batches * virtual_stages;
  int w = interleaved_warm_up(stages, virtual_stages, micro_batches, s);
  return w < total ? w + 1 : total;
}

ts_status ts_schedule_build_interleaved(int stages, int virtual_stages, int micro_batches,
                                        ts_schedule *out) {
  memset(out, 0, sizeof *out);
  int P = stages, v = virtual_stages, m = micro_batches;
  if (P < 1 || m < 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule interleaved: %d stages, %d micro-batches: expected each >= 1", P,
                        m);
  if (v < 2)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule interleaved: %d virtual stages: expected at least 2 model chunks "
                        "per rank (1 is 1f1b)",
                        v);
  if (m % P)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule interleaved: %d micro-batches on %d stages: expected a multiple "
                        "of %d",
                        m, P, P);
  TS_CHECK(new_lists(out, TS_SCHEDULE_INTERLEAVED, P, m, v));
  int total = m * v, group = P * v, V = P * v;
  for (int s = 0; s < P; s++) {
    list l = {&out->stage[s], list_cap(m, v)};
    int w = interleaved_warm_up(P, v, m, s);
#define CHUNK_OF(k, fwd) ((fwd) ? ((k) % group) / P : v - 1 - ((k) % group) / P)
#define MB_OF(k) (((k) / group) * P + (k) % P)
    for (int k = 0; k < w; k++) forward_chunk(&l, s, P, V, CHUNK_OF(k, 1), MB_OF(k));
    for (int k = 0; k < total - w; k++) { /* steady: one forward, one backward */
      forward_chunk(&l, s, P, V, CHUNK_OF(k + w, 1), MB_OF(k + w));
      backward_chunk(&l, s, P, V, CHUNK_OF(k, 0), MB_OF(k));
    }
    for (int k = total - w; k < total; k++) backward_chunk(&l, s, P, V, CHUNK_OF(k, 0), MB_OF(k));
#undef CHUNK_OF
#undef MB_OF
    push(&l, TS_ACT_REDUCE, -1, -1);
    push(&l, TS_ACT_OPTIMIZER, -1, -1);
  }
  return TS_OK;
}

ts_status ts_schedule_make(ts_schedule_kind kind, int stages, int virtual_stages,
                           int micro_batches, ts_schedule *out) {
  if (kind == TS_SCHEDULE_INTERLEAVED)
    return ts_schedule_build_interleaved(stages, virtual_stages, micro_batches, out);
  memset(out, 0, sizeof *out);
  if (kind == TS_SCHEDULE_ZBV && virtual_stages != 2)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule zbv with %d virtual stages: expected 2 (two model chunks per "
                        "rank in a V)",
                        virtual_stages);
  if (kind == TS_SCHEDULE_ZBV) return ts_schedule_build(kind, stages, micro_batches, out);
  if (virtual_stages != 1)
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule %s with %d virtual stages: expected 1 (more model chunks per "
                        "rank need the interleaved schedule)",
                        ts_schedule_kind_name(kind), virtual_stages);
  return ts_schedule_build(kind, stages, micro_batches, out);
}

int ts_schedule_in_flight_chunk(const ts_schedule *sched, int s, int c) {
  if (s < 0 || s >= sched->stages || c < 0 || c >= sched->virtual_stages) return 0;
  const ts_stage_schedule *l = &sched->stage[s];
  ts_action_kind release = sched->split_backward ? TS_ACT_WEIGHT : TS_ACT_BACKWARD;
  int now = 0, most = 0;
  for (size_t i = 0; i < l->n; i++) {
    if (l->actions[i].chunk != c) continue;
    if (l->actions[i].kind == TS_ACT_FORWARD && ++now > most) most = now;
    if (l->actions[i].kind == release) now--;
  }
  return most;
}

void ts_schedule_free(ts_schedule *s) {
  if (s->stage)
    for (int i = 0; i < s->stages; i++) free(s->stage[i].actions);
  free(s->stage);
  memset(s, 0, sizeof *s);
}

/* ---- the simulator ------------------------------------------------------------ */

/* A FIFO of posted sends (their micro-batches) on one directed link
 * between virtual stages. */
typedef struct {
  int *mb;
  size_t head, tail;
} fifo;

/* Virtual stage j = chunk * P + rank holds the model's j-th piece (one
 * chunk per rank without interleaving: j is the rank). */
typedef struct {
  int P, m, v, V; /* ranks, micro-batches, chunks per rank, V = P v virtual stages */
  ts_schedule_kind kind;
  int *fwd, *bwd, *got_act, *got_grad, *sent_act, *sent_grad; /* (V, m) flags */
  int *next_bwd;                       /* (V) */
  int *next_w;                         /* (V) the next W (split_backward) */
  int split;                           /* the schedule's split_backward */
  int *nslot;                          /* (V) the executor's slots of each virtual stage */
  const size_t *n_of;                  /* (P) list lengths */
  int *in_flight, *reduced, *optimized; /* (P) */
  fifo *act, *grad; /* act[j]: j -> j + 1; grad[j]: j -> j - 1 (V each) */
  ts_schedule_report *r;
} sim;

#define AT(a, j, i) ((a)[(size_t)(j) * (size_t)S->m + (size_t)(i)])

static ts_status violation(sim *S, int s, size_t pc, const ts_action *a, const char *what) {
  char chunk[24] = "";
  if (S->v > 1) snprintf(chunk, sizeof chunk, " chunk %d", a->chunk);
  snprintf(S->r->msg, sizeof S->r->msg, "P=%d m=%d: stage %d action %zu (%s mb %d%s): %s", S->P,
           S->m, s, pc, ts_action_kind_name(a->kind), a->mb, chunk, what);
  return ts_set_error(TS_ERR_INTERNAL, "schedule %s", S->r->msg);
}

/* The executor's slot rule (engine/pipeline.c): micro-batch mb of
 * virtual stage j uses slot mb % n of j's (n = nslot[j],
 * ts_schedule_in_flight_chunk), and before its forward (which writes the
 * slot's output) or backward (which writes the slot's input gradient and
 * may rewrite the output) the sends of the micro-batch that used the slot
 * before, mb - n, must have been received; before a backward also mb's own
 * output. 1 when that holds. */
static int slot_free(const sim *S, int j, int mb, int forward) {
  int prev = mb - S->nslot[j];
  if (j < S->V - 1 && prev >= 0 && !AT(S->got_act, j + 1, prev)) return 0;
  if (forward) return 1;
  if (j > 0 && prev >= 0 && !AT(S->got_grad, j - 1, prev)) return 0;
  return j == S->V - 1 || AT(S->got_act, j + 1, mb);
}

/* Whether every send from rank s's virtual stages was received. */
static int sends_received(const sim *S, int s) {
  for (int c = 0; c < S->v; c++) {
    int j = ts_schedule_vstage(S->kind, S->P, s, c);
    for (int i = 0; i < S->m; i++)
      if ((j < S->V - 1 && !AT(S->got_act, j + 1, i)) || (j > 0 && !AT(S->got_grad, j - 1, i)))
        return 0;
  }
  return 1;
}

/* Runs stage s's action a if it can; *ran = 1 then. Errors: a violation. */
static ts_status step(sim *S, int s, size_t pc, const ts_action *a, int last, int *ran) {
  int P = S->P, m = S->m, V = S->V, mb = a->mb;
  *ran = 0;
  int needs_mb = a->kind != TS_ACT_REDUCE && a->kind != TS_ACT_OPTIMIZER;
  if (needs_mb && (mb < 0 || mb >= m)) return violation(S, s, pc, a, "micro-batch out of range");
  if (needs_mb && (a->chunk < 0 || a->chunk >= S->v))
    return violation(S, s, pc, a, "chunk out of range");
  int j = ts_schedule_vstage(S->kind, P, s, a->chunk); /* the virtual stage */
  switch (a->kind) {
    case TS_ACT_FORWARD:
      if (AT(S->fwd, j, mb)) return violation(S, s, pc, a, "second forward");
      if (j > 0 && !AT(S->got_act, j, mb)) return violation(S, s, pc, a, "input not received");
      if (!slot_free(S, j, mb, 1)) return TS_OK; /* blocked: its slot's output is in flight */
      AT(S->fwd, j, mb) = 1;
      S->in_flight[s]++;
      if (s < 64 && S->in_flight[s] > S->r->max_in_flight[s])
        S->r->max_in_flight[s] = S->in_flight[s];
      break;
    case TS_ACT_BACKWARD:
      if (!AT(S->fwd, j, mb)) return violation(S, s, pc, a, "backward before forward");
      if (AT(S->bwd, j, mb)) return violation(S, s, pc, a, "second backward");
      if (mb != S->next_bwd[j]) return violation(S, s, pc, a, "backward out of micro-batch order");
      if (j < V - 1 && !AT(S->got_grad, j, mb))
        return violation(S, s, pc, a, "output gradient not received");
      if (!slot_free(S, j, mb, 0)) return TS_OK; /* blocked: its slot's gradient is in flight */
      AT(S->bwd, j, mb) = 1;
      S->next_bwd[j]++;
      if (!S->split) S->in_flight[s]--;
      break;
    case TS_ACT_WEIGHT:
      if (!S->split) return violation(S, s, pc, a, "W in a schedule whose backward is whole");
      if (mb >= S->next_bwd[j]) return violation(S, s, pc, a, "W before its B");
      if (mb != S->next_w[j]) return violation(S, s, pc, a, "W out of micro-batch order");
      S->next_w[j]++;
      S->in_flight[s]--;
      break;
    case TS_ACT_SEND_ACT:
    case TS_ACT_SEND_GRAD: {
      int act = a->kind == TS_ACT_SEND_ACT, to = act ? j + 1 : j - 1;
      if (to < 0 || to >= V || a->peer != ts_schedule_rank_of(S->kind, P, to))
        return violation(S, s, pc, a, "send to a stage that is not the neighbour");
      if (act ? !AT(S->fwd, j, mb) : !AT(S->bwd, j, mb))
        return violation(S, s, pc, a, "sends what was not computed");
      int *sent = act ? &AT(S->sent_act, j, mb) : &AT(S->sent_grad, j, mb);
      if (*sent) return violation(S, s, pc, a, "second send of the same micro-batch");
      *sent = 1;
      fifo *f = act ? &S->act[j] : &S->grad[j];
      f->mb[f->tail++] = mb;
      break;
    }
    case TS_ACT_RECV_ACT:
    case TS_ACT_RECV_GRAD: {
      int act = a->kind == TS_ACT_RECV_ACT, from = act ? j - 1 : j + 1;
      if (from < 0 || from >= V || a->peer != ts_schedule_rank_of(S->kind, P, from))
        return violation(S, s, pc, a, "receive from a stage that is not the neighbour");
      fifo *f = act ? &S->act[from] : &S->grad[from];
      if (f->head == f->tail) return TS_OK; /* blocked: the send is not posted yet */
      if (act ? AT(S->got_act, j, mb) : AT(S->got_grad, j, mb))
        return violation(S, s, pc, a, "second receive of the same micro-batch");
      if (f->mb[f->head] != mb)
        return violation(S, s, pc, a, "matches a send of another micro-batch (order)");
      f->head++;
      if (act) AT(S->got_act, j, mb) = 1;
      else AT(S->got_grad, j, mb) = 1;
      break;
    }
    case TS_ACT_REDUCE:
      for (int c = 0; c < S->v; c++)
        if (S->next_bwd[ts_schedule_vstage(S->kind, P, s, c)] != m ||
            (S->split && S->next_w[ts_schedule_vstage(S->kind, P, s, c)] != m))
          return violation(S, s, pc, a, "reduce before every backward");
      if (S->reduced[s]) return violation(S, s, pc, a, "second reduce");
      if (pc + 2 != S->n_of[s]) return violation(S, s, pc, a, "reduce is not second to last");
      if (!sends_received(S, s)) return TS_OK; /* the executor waits for every send */
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
  int P = sch->stages, m = sch->micro_batches, v = sch->virtual_stages > 1 ? sch->virtual_stages : 1;
  sim Sv;
  memset(&Sv, 0, sizeof Sv);
  sim *S = &Sv;
  S->P = P;
  S->m = m;
  S->v = v;
  S->V = P * v;
  S->kind = sch->kind;
  S->r = report;
  size_t Vm = (size_t)S->V * (size_t)m;
  size_t *n_of = calloc((size_t)P, sizeof(size_t));
  for (int s = 0; n_of && s < P; s++) n_of[s] = sch->stage[s].n;
  S->n_of = n_of;
  S->sent_act = calloc(Vm, sizeof(int));
  S->sent_grad = calloc(Vm, sizeof(int));
  S->optimized = calloc((size_t)P, sizeof(int));
  S->fwd = calloc(Vm, sizeof(int));
  S->bwd = calloc(Vm, sizeof(int));
  S->got_act = calloc(Vm, sizeof(int));
  S->got_grad = calloc(Vm, sizeof(int));
  S->next_bwd = calloc((size_t)S->V, sizeof(int));
  S->next_w = calloc((size_t)S->V, sizeof(int));
  S->split = sch->split_backward;
  S->nslot = calloc((size_t)S->V, sizeof(int));
  for (int j = 0; S->nslot && j < S->V; j++)
    S->nslot[j] = ts_schedule_in_flight_chunk(sch, ts_schedule_rank_of(sch->kind, P, j),
                                              ts_schedule_chunk_of(sch->kind, P, j));
  S->in_flight = calloc((size_t)P, sizeof(int));
  S->reduced = calloc((size_t)P, sizeof(int));
  S->act = calloc((size_t)S->V, sizeof(fifo));
  S->grad = calloc((size_t)S->V, sizeof(fifo));
  size_t *pc = calloc((size_t)P, sizeof(size_t));
  ts_status st = TS_OK;
  if (!S->fwd || !S->bwd || !S->got_act || !S->got_grad || !S->next_bwd || !S->nslot ||
      !S->next_w ||
      !S->in_flight ||
      !S->reduced || !S->act || !S->grad || !pc || !n_of || !S->sent_act || !S->sent_grad ||
      !S->optimized)
    st = ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule simulator: P=%d m=%d", P, m);
  for (int j = 0; j < S->V && st == TS_OK; j++) {
    /* a link carries at most one send per action of its sender */
    size_t cap = sch->stage[ts_schedule_rank_of(sch->kind, P, j)].n + 1;
    S->act[j].mb = calloc(cap, sizeof(int));
    S->grad[j].mb = calloc(cap, sizeof(int));
    if (!S->act[j].mb || !S->grad[j].mb)
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
    ts_action none = {TS_ACT_OPTIMIZER, -1, -1, -1, 0};
    int backwards = 1;
    for (int c = 0; c < v; c++) {
      int j = ts_schedule_vstage(S->kind, P, s, c);
      backwards &= S->next_bwd[j] == m && (!S->split || S->next_w[j] == m);
    }
    if (!backwards || !S->reduced[s] || !S->optimized[s])
      st = violation(S, s, pc[s], &none,
                     "the list ends before every backward, the reduce and the optimizer step");
    for (int c = 0; c < v && st == TS_OK; c++) {
      int j = ts_schedule_vstage(S->kind, P, s, c);
      if (S->act[j].head != S->act[j].tail || S->grad[j].head != S->grad[j].tail)
        st = violation(S, s, pc[s], &none, "a send nobody received");
      for (int i = 0; i < m && st == TS_OK; i++)
        if (!AT(S->fwd, j, i))
          st = violation(S, s, pc[s], &none, "a micro-batch never ran forward");
    }
  }
  for (int j = 0; j < S->V && S->act && S->grad; j++) {
    free(S->act[j].mb);
    free(S->grad[j].mb);
  }
  free(S->fwd), free(S->bwd), free(S->got_act), free(S->got_grad), free(S->next_bwd);
  free(S->nslot), free(S->next_w);
  free(S->in_flight), free(S->reduced), free(S->act), free(S->grad), free(pc);
  free(n_of), free(S->sent_act), free(S->sent_grad), free(S->optimized);
  return st;
}

/* ---- timing ------------------------------------------------------------------- */

ts_status ts_schedule_time(const ts_schedule *sch, double t_forward, double t_backward,
                           double *step, double *bubble) {
  *step = 0.0;
  if (!(t_forward > 0) || !(t_backward > 0))
    return ts_set_error(TS_ERR_INVALID_ARGUMENT,
                        "schedule time: forward %g, backward %g: expected both > 0", t_forward,
                        t_backward);
  ts_schedule_report rep;
  TS_CHECK(ts_schedule_simulate(sch, &rep)); /* runnable: every receive meets its send */
  int P = sch->stages, m = sch->micro_batches, v = sch->virtual_stages > 1 ? sch->virtual_stages : 1;
  int V = P * v;
  size_t Vm = (size_t)V * (size_t)m;
  /* when each (virtual stage, micro-batch)'s activation and gradient were
   * sent (-1: not yet), each rank's clock and next action */
  double *act = malloc(Vm * sizeof(double)), *grad = malloc(Vm * sizeof(double));
  double *clock = calloc((size_t)P, sizeof(double));
  size_t *pc = calloc((size_t)P, sizeof(size_t));
  if (!act || !grad || !clock || !pc) {
    free(act), free(grad), free(clock), free(pc);
    return ts_set_error(TS_ERR_OUT_OF_MEMORY, "schedule time: P=%d m=%d", P, m);
  }
  for (size_t i = 0; i < Vm; i++) act[i] = grad[i] = -1.0;
  /* Rounds over the ranks, each running actions until a receive whose
   * send has not happened yet (the simulation above proved they all do). */
  for (int left = 1; left;) {
    left = 0;
    for (int s = 0; s < P; s++) {
      const ts_stage_schedule *l = &sch->stage[s];
      for (; pc[s] < l->n; pc[s]++) {
        const ts_action *a = &l->actions[pc[s]];
        int j = ts_schedule_vstage(sch->kind, P, s, a->chunk);
        size_t at = (size_t)j * (size_t)m + (size_t)(a->mb < 0 ? 0 : a->mb);
        if (a->kind == TS_ACT_RECV_ACT || a->kind == TS_ACT_RECV_GRAD) {
          double sent = a->kind == TS_ACT_RECV_ACT ? act[at - (size_t)m] : grad[at + (size_t)m];
          if (sent < 0) break; /* its send has not run yet */
          if (sent > clock[s]) clock[s] = sent;
        } else if (a->kind == TS_ACT_FORWARD) {
          clock[s] += t_forward / v;
        } else if (a->kind == TS_ACT_BACKWARD || a->kind == TS_ACT_WEIGHT) {
          clock[s] += t_backward / v / (sch->split_backward ? 2.0 : 1.0);
        } else if (a->kind == TS_ACT_SEND_ACT) {
          act[at] = clock[s];
        } else if (a->kind == TS_ACT_SEND_GRAD) {
          grad[at] = clock[s];
        }
      }
      left |= pc[s] < l->n;
    }
  }
  for (int s = 0; s < P; s++)
    if (clock[s] > *step) *step = clock[s];
  for (int s = 0; bubble && s < P; s++) bubble[s] = 1.0 - m * (t_forward + t_backward) / *step;
  free(act), free(grad), free(clock), free(pc);
  return TS_OK;
}

double ts_schedule_bubble_theory(ts_schedule_kind kind, int stages, int virtual_stages,
                                 int micro_batches) {
  double P = stages, m = micro_batches, v = virtual_stages > 1 ? virtual_stages : 1;
  if (stages <= 1 || micro_batches < 1) return 0.0;
  if (kind == TS_SCHEDULE_INTERLEAVED) return (P - 1) / (v * m + P - 1);
  if (kind == TS_SCHEDULE_ZB_H1) return (P - 1) / (3 * m + P - 1);
  if (kind == TS_SCHEDULE_ZBV) return (P - 1) / (6 * m + P - 1);
  return (P - 1) / (m + P - 1);
}

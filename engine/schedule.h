/*
 * schedule.h — pipeline-parallel schedules as data (DESIGN.md "Pipeline
 * stages"): for each pipeline stage, the ordered list of actions one step
 * runs (forward and backward of a micro-batch, sends and receives of
 * activations and their gradients, the reduction and the optimizer step),
 * built by GPipe (Huang et al. 2019) or 1F1B (PipeDream-Flush: Narayanan
 * et al. 2021, §2.2; Megatron-LM's non-interleaved schedule), the
 * interleaved 1F1B of v model chunks per rank (§2.2.2; checked here, not
 * yet run by the engine), and the split of a model's units into
 * contiguous stages.
 *
 * The executor runs a stage's list in order; a simulator
 * (ts_schedule_simulate) runs all stages' lists against each other with no
 * compute, which is how the schedules are checked: every stage runs each
 * micro-batch's forward and backward once, every send meets its receive in
 * the same order, nothing deadlocks, and the activations a stage holds at
 * once never exceed what the memory plan charges (ts_schedule_in_flight).
 * With v chunks per rank it does the same per virtual stage (chunk c of
 * rank r is virtual stage c P + r, talking to its neighbours j - 1 and
 * j + 1 on the ranks before and after, cyclically), counting a rank's
 * activations over all its chunks.
 *
 * Communication model: a send is non-blocking (the executor posts it and
 * keeps its buffer until it completes; MPI_Isend); a receive blocks until
 * the matching send has been posted. The executor holds the activations of
 * ts_schedule_in_flight micro-batches in as many slots (mb uses slot
 * mb % n; per chunk, ts_schedule_in_flight_chunk) and reuses a slot only
 * once the sends from it were received;
 * its reduce waits for every send. The simulator models those waits too. Backward passes run in micro-batch
 * order 0, 1, ..., m-1 in both schedules, so gradients accumulate in the
 * order of a run without pipelining (the bitwise contract).
 */
#ifndef TS_ENGINE_SCHEDULE_H
#define TS_ENGINE_SCHEDULE_H

#include <stddef.h>

#include "base/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ts_schedule_kind {
  TS_SCHEDULE_GPIPE = 0, /* all m forwards, then all m backwards */
  TS_SCHEDULE_1F1B = 1,  /* P - s - 1 warm-up forwards, then one forward, one backward */
  TS_SCHEDULE_INTERLEAVED = 2, /* v chunks per rank, 1F1B over them (Narayanan et al. 2021,
                                  §2.2.2; Megatron-LM's interleaved schedule):
                                  ts_schedule_build_interleaved */
  TS_SCHEDULE_ZB_H1 = 3, /* 1F1B with each backward split into B (input gradient) and a
                            deferred W (weight gradient) that fills the cool-down (Qi et al.
                            2024, ZB-H1): the bubble (P-1)(t_F + t_B - t_W) */
  TS_SCHEDULE_ZBV = 4,   /* two chunks per rank in a V (virtual stages s and 2P-1-s), B and
                            W split (Qi et al. 2024, §6 ZB-V): ts_schedule_build */
} ts_schedule_kind;

/* The virtual stage of chunk c on rank s of P: c P + s (round-robin: the
 * interleaved schedule, and c = 0 for the others), or for ZB-V s (c = 0)
 * and 2 P - 1 - s (c = 1). */
static inline int ts_schedule_vstage(ts_schedule_kind kind, int P, int s, int c) {
  return kind == TS_SCHEDULE_ZBV ? (c == 0 ? s : 2 * P - 1 - s) : c * P + s;
}
/* The rank and the chunk of virtual stage j: ts_schedule_vstage's inverse. */
static inline int ts_schedule_rank_of(ts_schedule_kind kind, int P, int j) {
  return kind == TS_SCHEDULE_ZBV ? (j < P ? j : 2 * P - 1 - j) : j % P;
}
static inline int ts_schedule_chunk_of(ts_schedule_kind kind, int P, int j) {
  return kind == TS_SCHEDULE_ZBV ? (j < P ? 0 : 1) : j / P;
}

typedef enum ts_action_kind {
  TS_ACT_FORWARD = 0,   /* forward of micro-batch `mb` over this stage's units */
  TS_ACT_BACKWARD,      /* its backward */
  TS_ACT_SEND_ACT,      /* send micro-batch mb's output activation to stage s + 1 */
  TS_ACT_RECV_ACT,      /* receive its input activation from stage s - 1 */
  TS_ACT_SEND_GRAD,     /* send the gradient of its input to stage s - 1 */
  TS_ACT_RECV_GRAD,     /* receive the gradient of its output from stage s + 1 */
  TS_ACT_REDUCE,        /* the step's gradient reduction and global norm (mb = -1) */
  TS_ACT_OPTIMIZER,     /* the optimizer step (mb = -1) */
  TS_ACT_WEIGHT,        /* W: the weight gradients of micro-batch mb, after its BACKWARD,
                           which is then B alone (schedules with split_backward) */
  /* The engine's lowering of a stage's list (engine/step.c; never in a
   * built schedule, which ts_schedule_simulate checks at micro-batch
   * granularity): BACKWARD of mb becomes BACKWARD_UNIT of each of the
   * stage's units in reverse, each followed by its REDUCE_UNIT where the
   * ZeRO stage reduces the unit's gradient as its backward ends, then a
   * closing BACKWARD of mb; OPTIMIZER (the decision) is followed by one
 * OPTIMIZER_UNIT per unit and OPTIMIZER_END. */
  TS_ACT_BACKWARD_UNIT, /* backward of unit `unit` of micro-batch mb */
  TS_ACT_REDUCE_UNIT,   /* the reduce-scatter of unit `unit`'s gradient (its bucket) */
  TS_ACT_OPTIMIZER_UNIT, /* AdamW of unit `unit` and its update's all-gather */
  TS_ACT_OPTIMIZER_END,  /* the update's end (after every OPTIMIZER_UNIT) */
  TS_ACT_WEIGHT_UNIT,    /* W of unit `unit` of micro-batch mb (WEIGHT lowered) */
  TS_ACT_NUM_KINDS,
} ts_action_kind;

typedef struct ts_action {
  ts_action_kind kind;
  int mb;    /* micro-batch 0 .. m-1, or -1 */
  int peer;  /* the other stage (rank) of a send or receive, else -1 */
  int unit;  /* the unit of a *_UNIT action, else -1 */
  int chunk; /* the model chunk of this rank it runs (interleaved: 0 .. v-1, virtual stage
                chunk * P + rank; ZB-V: 0, 1: ts_schedule_vstage), else 0 */
} ts_action;

/* One stage's actions for one step, in order. */
typedef struct ts_stage_schedule {
  ts_action *actions; /* (n), owned */
  size_t n;
} ts_stage_schedule;

/* A step's schedule: P stages' lists. */
typedef struct ts_schedule {
  ts_schedule_kind kind;
  int stages;         /* P >= 1 ranks */
  int micro_batches;  /* m >= 1 */
  int virtual_stages; /* v >= 1 model chunks per rank (1 but for interleaved) */
  int split_backward; /* 1: BACKWARD is B, and WEIGHT actions run the weight gradients
                         (ZB-H1, ZB-V); 0: BACKWARD is the whole backward */
  ts_stage_schedule *stage; /* (P), owned */
} ts_schedule;

/* Short names: "gpipe", "1f1b", "interleaved", "zb-h1", "zbv"; and the action kinds'
 * ("forward", ...). */
const char *ts_schedule_kind_name(ts_schedule_kind k);
const char *ts_action_kind_name(ts_action_kind k);
/* "gpipe", "1f1b", "interleaved", "zb-h1" or "zbv" into *kind;
 * TS_ERR_INVALID_ARGUMENT otherwise. */
ts_status ts_schedule_kind_parse(const char *s, ts_schedule_kind *kind);

/* Builds the schedule of `kind` (GPipe, 1F1B, ZB-H1 or ZB-V) for P stages
 * and m micro-batches into *out (free with ts_schedule_free). m < P is
 * allowed (a larger bubble). ZB-V (Qi et al. 2024, §6): 2 chunks per rank,
 * virtual stages s and 2 P - 1 - s (rank P - 1 passes its first chunk's
 * output to its second itself, and rank 0 holds the embedding and the
 * head), B and W split; its list is what a greedy scheduler of unit-time
 * chunk passes gives when every rank runs, of what is ready, the second
 * chunk's F, then its B, the first chunk's B, the first chunk's F (while
 * the rank holds fewer than 2 P chunk micro-batches from forward to W:
 * 1F1B's memory at stage 0), else the oldest W (the second chunk's
 * first); with F = B = W its bubble is (P - 1) / (6 m + P - 1) at m = P
 * and 2 P and in most other cases, never more than ZB-H1's for m >= P
 * (schedule_test). ZB-H1 (Qi et al. 2024, §2.1): stage s runs 1F1B's
 * P - s - 1 warm-up forwards, then forward, B and, once more than s
 * micro-batches wait for theirs, W of the oldest; the rest of the W fill
 * the cool-down. Every stage then holds at most P micro-batches from
 * forward to W (stage 0's 1F1B count), and with t_F = t_B = t_W the step
 * is 3 m + P - 1 of them: a bubble (P - 1) / (3 m + P - 1).
 * TS_ERR_INVALID_ARGUMENT (P or m < 1, unknown kind), TS_ERR_OUT_OF_MEMORY. */
ts_status ts_schedule_build(ts_schedule_kind kind, int stages, int micro_batches,
                            ts_schedule *out);
void ts_schedule_free(ts_schedule *s);

/* The interleaved schedule of P ranks with v model chunks each (virtual
 * stage j = c P + r is the model's j-th contiguous piece, on rank j % P:
 * round-robin) and m micro-batches, as Megatron-LM orders it: rank r runs
 * W = (P - r - 1) 2 + (v - 1) P warm-up forwards (all m v when m = P),
 * then one forward and one backward, then the cool-down backwards; its
 * k-th forward is chunk (k mod P v) / P of micro-batch (k / P v) P + k mod
 * P, its k-th backward the same with the chunks in reverse. Each chunk's
 * backwards run in micro-batch order (the bitwise contract). A send of the
 * last rank's chunk c goes to rank 0's chunk c + 1. The bubble is
 * (P - 1) / (v m + P - 1) of a step (Narayanan et al. 2021, §2.2.2).
 * TS_ERR_INVALID_ARGUMENT naming the values: P < 1, v < 2 (1 is 1F1B), m
 * not a multiple of P (Megatron-LM's rule); TS_ERR_OUT_OF_MEMORY. */
ts_status ts_schedule_build_interleaved(int stages, int virtual_stages, int micro_batches,
                                        ts_schedule *out);

/* The schedule of `kind` with v model chunks per rank: the interleaved
 * schedule's builder for TS_SCHEDULE_INTERLEAVED, ts_schedule_build's for
 * the others (v must be 2 for ZB-V, 1 for the rest). Errors as theirs,
 * and TS_ERR_INVALID_ARGUMENT naming v for another v. */
ts_status ts_schedule_make(ts_schedule_kind kind, int stages, int virtual_stages,
                           int micro_batches, ts_schedule *out);

/* The most micro-batches whose forward of chunk c ran and whose backward
 * (with split_backward: W) of it has not, at any point of rank s's list
 * of schedule `s`: the
 * activations (slots) that chunk holds at once. A chunk's micro-batches
 * run in order, so these are consecutive. 0 for a chunk or rank the
 * schedule lacks. */
int ts_schedule_in_flight_chunk(const ts_schedule *sched, int s, int c);

/* The most (chunk, micro-batch) forwards whose backward has not run that
 * rank s holds at once under the interleaved schedule: W + 1 of
 * ts_schedule_build_interleaved's W warm-up forwards, at most m v. */
int ts_schedule_in_flight_interleaved(int stages, int virtual_stages, int micro_batches, int s);

/* The most micro-batches whose activations stage s holds at once under
 * this schedule: forwards done whose backward (ZB-H1: W) has not run.
 * GPipe: m; 1F1B: min(P - s, m); ZB-H1: min(P, m); ZB-V, in chunk
 * micro-batches (half a stage each), its bound 2 min(P, m). What the
 * memory plan charges a stage (the engine counts each chunk's own:
 * ts_schedule_in_flight_chunk). */
int ts_schedule_in_flight(ts_schedule_kind kind, int stages, int micro_batches, int s);

/* What ts_schedule_simulate found. */
typedef struct ts_schedule_report {
  int deadlocked;          /* 1: some stage waits forever (msg says where) */
  int max_in_flight[64];   /* per stage (first 64), measured */
  size_t rounds;           /* simulation rounds until every list finished */
  char msg[256];           /* the first problem found, "" if none */
} ts_schedule_report;

/* Runs every stage's list against the others with no compute, under the
 * communication model above, and checks: each stage runs FORWARD and
 * BACKWARD of every micro-batch exactly once, forward before backward, and
 * backwards in micro-batch order; a stage's first action needing a peer
 * only talks to s - 1 and s + 1; the k-th send of a kind from a to b meets
 * the k-th receive of that kind at b from a, and both name the same
 * micro-batch; FORWARD of mb on stage s > 0 follows its RECV_ACT, BACKWARD
 * on s < P - 1 follows its RECV_GRAD; REDUCE then OPTIMIZER end every list;
 * nothing deadlocks. With v > 1 (interleaved) each of these holds per
 * virtual stage (s above reads j = chunk P + rank, its neighbours j - 1
 * and j + 1) and max_in_flight counts a rank's chunks together. The
 * executor's slot rule is modelled: a pass waits until the sends of the
 * micro-batch that used its slot before (ts_schedule_in_flight_chunk
 * slots per chunk) were received. TS_OK
 * when all hold, else TS_ERR_INTERNAL with the first violation in
 * report->msg (and in ts_last_error). */
ts_status ts_schedule_simulate(const ts_schedule *s, ts_schedule_report *report);

/* The schedule's own timing, no communication cost: every rank runs its
 * list in order; a forward of one chunk takes t_forward / v, a backward
 * t_backward / v (a stage's time split over its v chunks; split into B
 * and W, half each); a send costs
 * nothing and a receive waits for its send; reduce and optimizer take no
 * time. *step receives the makespan and bubble[s] (P entries, may be
 * NULL) the part of it rank s is idle: 1 - m (t_forward + t_backward) /
 * *step. For GPipe and 1F1B that is (P - 1) / (m + P - 1) on every rank,
 * for the interleaved schedule (P - 1) / (v m + P - 1) (Narayanan et al.
 * 2021, §2.2), for ZB-H1 with t_backward = 2 t_forward (B = W = F) (P -
 * 1) / (3 m + P - 1) (Qi et al. 2024, §2.1), for ZB-V (P - 1) / (6 m + P
 * - 1) at m = P and 2 P. TS_ERR_INVALID_ARGUMENT (times not > 0),
 * TS_ERR_INTERNAL (a list that cannot run: ts_schedule_simulate says why),
 * TS_ERR_OUT_OF_MEMORY. */
ts_status ts_schedule_time(const ts_schedule *s, double t_forward, double t_backward,
                           double *step, double *bubble);

/* The bubble of `kind` on P stages, v chunks, m micro-batches in theory
 * (equal stages, free communication; m a multiple of P for interleaved,
 * m >= P for ZB-H1 and ZB-V): GPipe and 1F1B (P - 1) / (m + P - 1),
 * interleaved (P - 1) / (v m + P - 1), ZB-H1 with t_F = t_B = t_W (P - 1)
 * / (3 m + P - 1), ZB-V (P - 1) / (6 m + P - 1) (half a stage's forward
 * per rank less); what ts_schedule_time measures for those. 0 for P <= 1. */
double ts_schedule_bubble_theory(ts_schedule_kind kind, int stages, int virtual_stages,
                                 int micro_batches);

/* Splits n units with costs cost[0..n) into P contiguous stages minimising
 * the largest stage's cost (ties: the earliest boundaries); first[s] is the
 * index of stage s's first unit (first[0] = 0), P entries.
 * TS_ERR_INVALID_ARGUMENT when P < 1 or P > n (every stage needs a unit). */
ts_status ts_pipeline_split_balanced(const double *cost, int n, int stages, int *first);

/* ZB-V's split of n units with costs cost[0..n) into 2 P contiguous
 * pieces, piece j on stage ts_schedule_rank_of(TS_SCHEDULE_ZBV, P, j):
 * what a stage computes is two pieces, s and 2 P - 1 - s, so this
 * balances their sums, not the pieces. From the outside in, stage s's
 * first piece takes units from the front until it is nearest half of its
 * fair share (what is left over the stages left), its second from the
 * back until the two are nearest that share; the last stage splits the
 * middle at its half. Where the 2 P pieces of least largest cost
 * (ts_pipeline_split_balanced) leave the busiest stage less busy, those
 * instead. The busiest stage's sum then lies within two units' cost of
 * the mean, and never above the other split's (schedule_test). first:
 * 2 P + 1 entries as ts_pipeline_split_balanced's. TS_ERR_INVALID_ARGUMENT
 * when P < 1 or 2 P > n. */
ts_status ts_pipeline_split_v(const double *cost, int n, int stages, int *first);

/* An explicit split: "a,b,c" units per stage (P numbers, each >= 1,
 * summing to n) into first[] as above. TS_ERR_INVALID_ARGUMENT naming what
 * is wrong (a count of 0, a sum that is not n, P numbers expected). */
ts_status ts_pipeline_split_parse(const char *text, int n, int stages, int *first);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_SCHEDULE_H */

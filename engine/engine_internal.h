/*
 * engine_internal.h — private to engine/: the engine's state, shared by the
 * files that implement engine.h by concept:
 *   engine.c   create, free, accessors
 *   observe.c  the observers and what the step tells them (actions, spans,
 *              timed waits; the trace is one), the waits for collectives
 *   step.c     the executor: this rank's list of the step's actions, one
 *              place per action kind (nothing calls back into it)
 *   passes.c   FORWARD and BACKWARD: a micro-batch's load, forward and
 *              backward over the units, the tied head's gradient fold
 *   params.c   the full parameters of a unit: stage 3's gathers, their
 *              prefetch and holds
 *   reduce.c   the gradients' buffers and reduce-scatters, and REDUCE: the
 *              step's reductions and the global norm's sums
 *   optimizer.c  OPTIMIZER: skip, or clip, AdamW, all-gather the update
 *   pipeline.c SEND_* and RECV_*: the stage's geometry and schedule, create
 *              on a grid, the sends and receives of activations, their
 *              gradients, the tied embedding and its replica
 *   device.c   the engine beside a GPU: its preparation at create, the
 *              card's memory report
 *   zero.c     the ZeRO stage as a policy table (zero.h)
 *   loss_scale.c  the fp16 loss scaler (loss_scale.h)
 *   tensors.c  the slice iterator over (tensor, this rank's part), AdamW
 *              per unit, get/set tensor, the overflow search
 *   plan.c     the memory plan (create and one step on the plan device),
 *              the activation prediction and the units' costs
 *   checkpoint.c, checkpoint_load.c  checkpoints (checkpoint.h): each rank's
 *              slices out, any layout's parts back in
 *   eval.c     evaluation (one stage or a pipeline): a batch's loss, a
 *              masked LM's accuracy
 *
 * Ownership: the engine owns every buffer below and allocates each through
 * its ledger on its device (e->device), except: the batch's host staging
 * beside a device (the ledger's CPU account), the step scalars on the CPU
 * and their host copy (plain host memory; see alloc_scalars in engine.c).
 */
#ifndef TS_ENGINE_ENGINE_INTERNAL_H
#define TS_ENGINE_ENGINE_INTERNAL_H

#include "engine/engine.h"
#include "engine/loss_scale.h"
#include "engine/observer.h"
#include "engine/trace.h"
#include "engine/zero.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct unit_state {
  ts_flat_layout layout; /* offsets, padding P, shard S for the N ranks */
  void *params;          /* compute dtype: (P), or (S) when the policy shards them */
  void *grads;           /* compute dtype: (P), or (S) when the policy shards them */
  float *master;         /* fp32, NULL in fp32: (P), or (S) with sharded optimizer state */
  float *m, *v;          /* fp32 Adam moments: as master */
  int recompute;         /* activation checkpointing: forward again before backward */
  void *full_params;     /* sharded params: (P) gathered while uses > 0, else NULL */
  int uses;              /* sharded params: holders of full_params */
  int kept;              /* opts.keep_gathered: 1 while the step holds full_params (one
                            of uses) from the unit's first forward to its last backward */
  void *full_grads;      /* sharded grads: (P) from the unit's (or a borrower's)
                            backward to its reduce-scatter, else NULL */
  /* opts.overlap: */
  int holds;                      /* uses taken ahead (a prefetch, the last unit kept for its
                                     backward), each handed to a later acquire */
  ts_comm_request *gather_req;    /* all-gather in flight into full_params (stage 3) or of
                                     updated params (the optimizer, stages 1/2), else NULL */
  ts_comm_request *reduce_req;    /* reduce-scatter of the gradient in flight, else NULL */
  ts_comm_request *reduce_ag_req; /* stage 0: the all-gather of the reduced gradient after
                                     it, else NULL */
} unit_state;

/* The activations of one micro-batch in flight (pipeline schedules hold
 * several; without pipelining there is one). A slot serves micro-batches
 * mb with mb % n_slots equal to its index: the ones in flight at once are
 * consecutive, never more than n_slots (ts_schedule_in_flight). */
typedef struct act_slot {
  void **acts;      /* [n_units] input (B, T, C) of unit u, for the units this stage
                       computes (u > 0) and the next stage's first unit (its output) */
  void **saved;     /* [n_units] the saved bytes of unit u; NULL when recomputed (the
                       engine's recompute_saved serves) or not on this stage */
  int32_t *tokens;  /* (B, T) the micro-batch's inputs */
  int32_t *targets; /* (B, T) its targets, -100 = ignore */
  void *gsend;      /* (B, T, C) gradient of the stage's input, sent to stage s - 1
                       (stages s > 0 of a pipeline), else NULL */
  float dloss;      /* d(scaled step loss)/d(row loss) of this micro-batch */
  ts_comm_request *act_req;  /* pending send of its output (acts[u_end]), or NULL */
  ts_comm_request *grad_req; /* pending send of gsend, or NULL */
} act_slot;

struct ts_engine {
  const ts_model *model;      /* borrowed from the creator */
  ts_engine_opts opts;        /* as given */
  const ts_zero_policy *zero; /* the stage's policy (zero.h) */
  ts_device device;      /* where every training buffer lives */
  ts_ledger ledger;      /* every buffer below, per device */
  ts_kctx ctx;           /* the device's context, with the workspace */
  ts_comm *dp;           /* data-parallel group (borrowed or own_comm) */
  ts_comm *own_comm;     /* the one-rank group made when none was given */
  int rank, dp_size;     /* this rank r and N, of the data-parallel group (hybrid sharding:
                            of the shard group, S ranks) */
  ts_comm *rep;          /* hybrid sharding: the replica group (this shard's N/S copies, one per
                            shard group, in group order), else NULL */
  ts_comm *own_shard, *own_rep; /* hybrid sharding: the two groups cut from the dp group given */
  int replicas, rep_rank;       /* N/S and this rank's shard group (1 and 0 without hybrid) */
  size_t es;             /* bytes per compute element */
  void *scratch;         /* reduce-scatter scratch, (N-1) * max S elements */
  size_t scratch_bytes;  /* its size, bytes */
  unit_state *units;     /* [n_units]; those of other pipeline stages stay zeroed, but
                            for a tied head's lender (its params alone: the replica) */
  act_slot *slots;       /* [n_slots] micro-batches in flight */
  int n_slots;           /* 1 without pipelining */
  int32_t *tokens;       /* (B, T) slot 0's inputs (the micro-step's batch) */
  int32_t *targets;      /* (B, T) slot 0's targets */
  int32_t *h_tokens;     /* (B, T) the host's batch (ts_engine_batch): tokens itself on the
                            CPU, host staging for a device */
  int32_t *h_targets;    /* (B, T) likewise */
  int32_t *staging;      /* beside a device: (2, B, T) page-locked host copy of a micro-batch's
                            tokens then targets, read by an asynchronous copy; else NULL */
  struct ts_engine_lending *lending; /* device.c's: the memory lent to dp, pp and rep
                                        (ts_engine_lend_memory), NULL while none is */
  ts_device_report report; /* beside a device: its name, total and used_at_create */
  void *dbuf[2];         /* (B, T, C) activation gradients, ping-pong */
  void *recompute_saved; /* saved activations of the recomputed unit in use */
  /* The step's scalars on the device, read once per step (one block): */
  double *scalars;       /* the block: loss then sumsq then eval_loss */
  double *loss;          /* (grad_accum, 2): each micro-batch's (loss sum, rows) */
  double *sumsq;         /* (n_units): squared norm of each unit's gradient shard */
  double *eval_loss;     /* (2): the evaluation's (loss sum, rows) */
  int32_t *nonfinite;    /* (n_units, TS_UNIT_MAX_TENSORS): overflow search flags */
  size_t scalar_bytes;   /* bytes of the block */
  double *h_scalars;     /* host copy of the block (what the step reads back) */
  double *h_part;        /* (1 + n_units) host: the step's loss sum and per-unit squared
                            norms, summed over the pipeline's stages */
  double reduced[2];     /* the REDUCE action's sums over the grid: the step's loss (each
                            micro-batch's mean, summed) and the gradients' sum of squares */
  int step;              /* optimizer updates applied (AdamW's t) */
  int attempts;          /* optimizer steps finished, skipped ones included */
  ts_loss_scaler scaler; /* fp16 loss scaling (scale 1 otherwise) */
  /* Pipeline stages (pipeline.c; without pipelining P = 1, stage 0, all units): */
  int stages, stage;     /* P and this rank's pipeline stage s */
  int u_begin, u_end;    /* the units this stage computes, [u_begin, u_end) */
  ts_comm *pp;           /* the pipeline group of this dp rank (borrowed or own_pp), NULL
                            when P = 1 */
  ts_comm *own_pp;       /* a plan's own pipeline group (ts_comm_plan), else NULL */
  int lender;            /* the unit a tied head borrows from (its tied_unit), or -1 */
  int replica;           /* 1: units[lender] holds only the tied head's copy of the
                            lender's parameters (the last stage, P > 1) */
  int cur_mb;            /* the micro-batch of the action running (its index in the step) */
  void *tied_grads;      /* tied head: its gradient of the borrowed tensor, summed over the
                            step's micro-batches, (P) of the lender's layout, compute dtype;
                            a transient (grads) from the first head backward to the fold */
  ts_comm_request *tied_req; /* pending send of tied_grads to stage 0, or NULL */
  ts_schedule sched;     /* the step's schedule (P > 1), built once */
  ts_stage_schedule program; /* this stage's list as the executor runs it: sched's, lowered
                                (step.c) at the first step; owned */
  struct {                 /* the backward of the micro-batch in progress (passes.c) */
    const void *din;       /* the gradient of the current unit's output */
    int cur;               /* dbuf index its input gradient goes to */
  } bw;
  ts_trace *trace;              /* train --trace: spans (borrowed); NULL: none */
  ts_step_observer trace_observer; /* the trace's observer, registered while trace is set */
  const ts_step_observer *observers[TS_ENGINE_MAX_OBSERVERS]; /* (n_observers), borrowed */
  int n_observers;
  int comm_thread;              /* 1: dp has a communication thread this engine started */
  int rs_pending;               /* opts.overlap, stages 2/3: the unit whose reduce-scatter is
                                   in flight (its full_grads kept until it ends), else -1 */
  int hold_last;                /* opts.overlap: the action after this forward is the same
                                   micro-batch's backward (keep the last unit gathered) */
  int in_step;                  /* 1 while ts_engine_step runs its list */
  int in_micro_batch;           /* 1 while an action of micro-batch cur_mb runs (spans and the
                                   watchdog name it; a forward that keeps gathered units) */
  ts_comm_counters step_start;  /* counters when the current step began */
  void *ckpt_staging;           /* opts.async_save: this rank's checkpoint file bytes (host,
                                   staging), the copy an asynchronous save writes; else NULL */
  size_t ckpt_staging_bytes;    /* its size, bytes */
  struct ts_checkpoint_pending *ckpt_pending; /* the asynchronous save in flight, else NULL */
  double ckpt_staging_wait; /* seconds state changes waited for its copies, summed */
};

/* Whether unit u is computed by this rank's stage. */
static inline int ts_engine_owns(const ts_engine *e, int u) {
  return u >= e->u_begin && u < e->u_end;
}

/* The mean loss of a (sum, rows) pair: 0 when no row has a target. */
static inline double ts_engine_mean_loss(const double *pair) {
  return pair[1] > 0 ? pair[0] / pair[1] : 0.0;
}

/* ---- checkpoint.c ----------------------------------------------------------------- */

/* The bytes of an asynchronous save's staging: the largest checkpoint
 * file of this rank's pipeline stage (dp rank 0's: every kind of every unit
 * of the stage, its part; another dp rank's is at most that), so that
 * every rank and the plan charge the same. TS_ERR_OUT_OF_MEMORY. */
ts_status ts_checkpoint_staging_bytes(const ts_engine *e, size_t *bytes);

/* Called before anything changes the state a checkpoint holds (the
 * optimizer step, a tensor or moment set, a load): waits until the
 * asynchronous save in flight has copied it to the staging (on the CPU its
 * writer thread copies while the next step's forward and backward run),
 * adding the wait to e->ckpt_staging_wait. None in flight: returns at once. */
void ts_engine_wait_staging(ts_engine *e);

/* ---- engine.c: create, free; observe.c: observers, spans, waits ------------------ */

/* A new engine for model and opts (every option checked, the loss scaler
 * set up) with an empty ledger and nothing allocated yet; *out is NULL on
 * any error. */
ts_status ts_engine_new(const ts_model *model, const ts_engine_opts *opts, ts_engine **out);

/* Allocates every buffer through the ledger and initialises the
 * parameters (on the plan device: charges only). */
ts_status ts_engine_alloc(ts_engine *e);

/* ts_engine_create's body for pipeline stage `stage` (0 without
 * pipelining; pp NULL then), both groups borrowed. */
ts_status ts_engine_create_stage(ts_engine **out, const ts_model *model, const ts_engine_opts *opts,
                                 ts_comm *dp, ts_comm *pp, int stage);

/* The model state of one flat buffer of layout l under policy z in dt
 * (zero.h's table): s->params, grads, master (NULL in fp32), m, v, on dev. */
ts_status ts_engine_alloc_model_state(ts_ledger *ledger, ts_device dev, const ts_flat_layout *l,
                                      const ts_zero_policy *z, ts_dtype dt, unit_state *s);
/* Frees what ts_engine_alloc_model_state allocated (NULLs are fine). */
void ts_engine_free_model_state(ts_ledger *ledger, unit_state *s);

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

/* Tells the observers (observer.h) that action a begins (end 0) or ended
 * with status (end 1); the first error an observer returns. */
ts_status ts_engine_observe_action(ts_engine *e, const ts_action *a, int end, ts_status status);

/* Waits for every collective in flight (errors dropped: for discarding a
 * step and for free), so that no buffer is released under one. */
void ts_engine_wait_all(ts_engine *e);

/* ---- step.c: the executor (engine.h ts_engine_step) ------------------------------- */

/* Slot of micro-batch mb. */
static inline act_slot *ts_engine_slot(ts_engine *e, int mb) {
  return &e->slots[mb % e->n_slots];
}

/* ---- passes.c: FORWARD and BACKWARD ------------------------------------------------ */

/* FORWARD of micro-batch mb on this stage: its host arrays filled by batch
 * (the slot's own on the CPU, the engine's host batch beside a device),
 * loaded into its slot once the slot's previous sends left, its loss
 * gradient's scale set, forward over the stage's units; the last stage's
 * loss pair into e->loss[mb]. backward_next: the next action is this
 * micro-batch's BACKWARD (the last unit stays gathered for it). Errors:
 * batch's, the load's, the units'. */
ts_status ts_engine_forward_action(ts_engine *e, int mb, int backward_next,
                                   ts_engine_batch_fn batch, void *user);
/* BACKWARD_UNIT of unit u in micro-batch mb: the unit's backward, its
 * parameters gathered (and the next unit's prefetched), its gradient
 * accumulated; the stage's first one (u = u_end - 1) waits for the slot's
 * sends and takes the gradient of the stage's output (dbuf[1], received,
 * unless this is the last stage). The units' input gradients ping-pong
 * through dbuf (e->bw). */
ts_status ts_engine_backward_unit_action(ts_engine *e, int mb, int u);
/* BACKWARD of micro-batch mb, after its units': the last stage's replica
 * sends the tied head's gradient in the step's last micro-batch. */
ts_status ts_engine_backward_action(ts_engine *e, int mb);

/* The one batch load: a micro-batch's (B, T) host inputs and targets
 * checked on the host (ts_k_check_indices), then into slot sl on the
 * device, and in *count the targets that are not -100. On the CPU nothing
 * moves when the caller filled the slot's own buffers. Beside a device the
 * batch goes through the page-locked staging by one asynchronous copy
 * each: the only wait is for the previous micro-batch's copies to have
 * left the staging, long done by now. Errors: the host check's, the
 * copies'. */
ts_status ts_engine_load_batch(ts_engine *e, act_slot *sl, const int32_t *inputs,
                               const int32_t *targets, size_t *count);
/* Forward of micro-batch slot sl over this stage's units (its inputs and
 * dloss already in place); a last stage writes the loss pair (2) to loss
 * (fused: with the loss gradient, for a backward). */
ts_status ts_engine_forward_slot(ts_engine *e, act_slot *sl, double *loss, int fused);

/* ---- params.c: the full parameters of a unit --------------------------------------- */

/* The full parameters (P) of unit u for a forward or backward: gathered on
 * first use when sharded. Pair with ts_engine_release_params. */
ts_status ts_engine_acquire_params(ts_engine *e, int u, const void **full);
void ts_engine_release_params(ts_engine *e, int u);
/* opts.overlap, sharded parameters: takes a use of unit u (and of the unit
 * it borrows from, tied embeddings) ahead of its next acquire, starting
 * the all-gather unless the unit is gathered already; no-op when a use is
 * taken already or u is not this stage's. Prefetch depth 1: the passes
 * take unit u+1's (backward: u-1's) before computing u. */
ts_status ts_engine_prefetch(ts_engine *e, int u);
/* opts.keep_gathered (sharded parameters, a training micro-batch): the
 * step's first forward of unit u holds its gathered parameters once more,
 * until the unit's backward in the last micro-batch (ts_engine_drop_kept). */
void ts_engine_keep_gathered(ts_engine *e, int u);
/* Releases the step's hold of unit u's gathered parameters, if any. */
void ts_engine_drop_kept(ts_engine *e, int u);
/* Releases every hold opts.keep_gathered still has on gathered parameters
 * (each is dropped at its unit's last backward; REDUCE makes sure before
 * the shards change). */
void ts_engine_drop_gathered(ts_engine *e);

/* ---- reduce.c: gradients and REDUCE ------------------------------------------------ */

/* The full gradient (P) that unit u's backward accumulates into: the
 * unit's own buffer, or a zeroed transient one when gradients are sharded. */
ts_status ts_engine_full_grads(ts_engine *e, int u, void **out);
/* Before unit u's backward: ends its own reduce-scatter still in flight
 * (its full gradient is free again); a no-op otherwise. */
ts_status ts_engine_reduce_pending(ts_engine *e, int u);
/* Whether a unit's gradient is reduced as its backward of micro-batch mb
 * ends (a REDUCE_UNIT action follows its BACKWARD_UNIT): stages 2/3 every
 * micro-batch; stages 0/1 with overlap in the last one (their bucket);
 * else REDUCE reduces it once per step. */
int ts_engine_unit_reduce_due(const ts_engine *e, int mb);
/* REDUCE_UNIT of unit u (micro-batch e->cur_mb): stages 2/3 reduce-scatter
 * its full gradient into the shard (adding after the first micro-batch),
 * stages 0/1 its whole gradient in place; after the one in flight ends.
 * With overlap it runs beside the next unit's backward; without, it ends
 * here. */
ts_status ts_engine_reduce_unit_action(ts_engine *e, int u);
/* Waits for the gradient reductions still in flight: the last
 * reduce-scatter, so that every gradient shard (this rank's part) is
 * final, and with gathers != 0 stage 0's all-gathers of the reduced
 * gradients too (else the optimizer waits for unit u's just before its
 * AdamW; the norm needs the shards alone). */
ts_status ts_engine_finish_reductions(ts_engine *e, int gathers);
/* Zeroes every gradient buffer this rank holds (the shard when sharded). */
ts_status ts_engine_zero_grads(ts_engine *e);
/* REDUCE, after the last micro-batch's backward: every pipeline send done,
 * an asynchronous save's copy of the state waited for, kept gathers
 * dropped, stages 0/1's reductions without overlap, every reduction ended,
 * hybrid sharding's sum over the replicas (blocking, rank order), then
 * each unit's squared norm, the step's one read of the device, and the
 * sums over the pipeline, dp and replica groups into e->reduced. Errors:
 * the collectives', the device's. */
ts_status ts_engine_reduce_action(ts_engine *e);

/* ---- optimizer.c: OPTIMIZER -------------------------------------------------------- */

/* OPTIMIZER, after REDUCE (engine.h ts_engine_step: the skip, clipping,
 * AdamW and the loss scaler's rules): from e->reduced, a non-finite norm
 * (or loss, without loss scaling) skips the step on every rank, naming
 * where the overflow began; else clip, AdamW with learning rate lr on this
 * rank's part, all-gather of the updated parameters (stages 1-2), the tied
 * head's replica updated; gradients zeroed. Fills *stats but for the
 * traffic. Errors: TS_ERR_NUMERIC (overflow at the minimum scale),
 * TS_ERR_MPI. */
ts_status ts_engine_optimizer_action(ts_engine *e, float lr, ts_step_stats *stats);

/* ---- pipeline.c: stages and their traffic ---------------------------------------- */

/* Sets the engine's stage geometry for stage s of opts->pipeline_stages
 * (units from the split; the step's schedule, a one-stage 1F1B without
 * pipelining; slots from the schedule). Errors: the split's. */
ts_status ts_engine_set_stage(ts_engine *e, int s);

/* Message tags on the pipeline group: kind + TS_TAG_KINDS * micro-batch. */
enum { TS_TAG_ACT = 0, TS_TAG_GRAD, TS_TAG_TIED, TS_TAG_PARAMS, TS_TAG_EVAL, TS_TAG_KINDS };
static inline int ts_engine_tag(int kind, int mb) { return kind + TS_TAG_KINDS * mb; }

/* Elements of one (B, T, C) activation. */
static inline size_t ts_engine_btc(const ts_engine *e) {
  return e->opts.micro_batch * e->opts.seq * e->model->hidden_size;
}

/* A blocking receive, a non-blocking send (its posting traced) on the
 * pipeline group, count elements of the compute dtype; and the wait for a
 * pending send (*req NULL afterwards; NULL: nothing to wait for). */
ts_status ts_engine_recv(ts_engine *e, void *buf, size_t count, int peer, int tag);
ts_status ts_engine_isend(ts_engine *e, const void *buf, size_t count, int peer, int tag,
                          ts_comm_request **req);
ts_status ts_engine_wait_req(ts_comm_request **req);
/* Waits for every pending send (activations, gradients, the tied
 * gradient): nothing left reading a buffer. Errors are ignored (the
 * engine is stopping or failing anyway) but for the first, returned. */
ts_status ts_engine_wait_sends(ts_engine *e);

/* Stage 0 of a pipeline, before the lender's backward of the step's last
 * micro-batch: receives the tied head's gradient from the last stage into
 * a new transient (P), e->tied_grads. */
ts_status ts_engine_recv_tied_grads(ts_engine *e);
/* The last stage, after the step's last backward: sends e->tied_grads. */
ts_status ts_engine_send_tied_grads(ts_engine *e);
/* After an applied optimizer step: stage 0 sends the lender's updated
 * parameters (as its policy holds them) to the last stage's replica. */
ts_status ts_engine_sync_replica(ts_engine *e);

/* ---- eval.c ------------------------------------------------------------------------ */

/* After an evaluation forward of slot 0 on the last stage: *correct = the
 * rows of the (B, T) host targets, -100 skipped, whose logits' first
 * maximum is the target (the logits are read on the host: a copy from a
 * device). */
ts_status ts_engine_count_correct(ts_engine *e, const int32_t *targets, double *correct);

/* ---- device.c ---------------------------------------------------------------------- */

/* Beside a GPU, before anything is allocated (ts_engine_lend_memory has
 * lent comm the device's memory): sets the kernels' flags, refuses a run the card cannot hold (the
 * plan's other blocks at their peak plus every reserved transient), naming each category, and
 * reserves the step's transients. */
ts_status ts_engine_prepare_device(ts_engine *e);

/* Lends the engine's memory to its groups (comm.h ts_comm_set_memory):
 * beside a device, dp always (its collectives run on device buffers); on
 * the staged transport, dp with two or more ranks and pp, each with host
 * staging of ts_comm_staging_bytes(N, comm_chunk_bytes) charged to the
 * ledger's CPU account (category comm) and page-locked; on nccl, dp on
 * NCCL (with the communication stream's context, comm_ctx) and pp staged.
 * Hybrid sharding's replica group (rep) is lent as pp is, staged on every
 * transport: beside a device, and on the CPU's staged transport. Before
 * ts_engine_alloc, in create and in the plan alike. */
ts_status ts_engine_lend_memory(ts_engine *e);
/* 1 when dp of dp_size ranks goes on NCCL under opts: nccl resolved on a
 * GPU, with two ranks or more, or one when `comm` names nccl (the one-rank
 * NCCL path; auto keeps one rank local). */
int ts_engine_dp_on_nccl(const ts_engine_opts *opts, int dp_size);
/* Undoes ts_engine_lend_memory (groups back to host memory, staging
 * freed); a no-op for what was not lent. */
void ts_engine_unlend_memory(ts_engine *e);
/* 1 while dp holds the engine's memory (its set-up was collective). */
int ts_engine_dp_lent(const ts_engine *e);
/* Waits for the communication stream (NCCL's), if any. */
void ts_engine_lending_sync(ts_engine *e);

/* ---- plan.c ------------------------------------------------------------------------ */

/* An engine on the plan device (plan ledger, TS_K_PLAN context, plan
 * groups: nothing allocated, computed or sent) after create and one step:
 * ts_engine_plan's, kept for its ledger (the account and the transients'
 * profile). Free with ts_engine_free. */
/* The plan's engine (ts_engine_plan_engine) before its step: world rank
 * stage x dp_size's, its groups' link classes for ranks_per_node
 * consecutive world ranks per node (0: one node). Errors as
 * ts_engine_plan_stage. */
ts_status ts_engine_plan_build(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                               int stage, int ranks_per_node, ts_engine **out);
/* The plan's batch source (ts_engine_batch_fn): nothing to read. */
ts_status ts_engine_plan_batch(void *user, int mb, int32_t *inputs, int32_t *targets);

ts_status ts_engine_plan_engine(const ts_model *model, const ts_engine_opts *opts, size_t dp_size,
                                int stage, ts_engine **out);

/* The recompute buffer's bytes: the largest saved bytes of a recomputed
 * unit among units [begin, end) (0 when none is). */
size_t ts_engine_recompute_bytes(const ts_model *m, const ts_engine_opts *o, int begin, int end);

/* ---- tensors.c: (tensor, this rank's part) ------------------------------------------ */

/* First flat element of this rank's shard of unit u. */
size_t ts_engine_shard_begin(const ts_engine *e, int u);

/* This rank's gradient shard (S) of unit u: its own buffer when the
 * policy shards gradients, else its slice of the full gradient. */
void *ts_engine_grad_shard(const ts_engine *e, int u);

/* One part of a tensor that this rank holds in a buffer of unit u. */
typedef struct ts_slice {
  int tensor;    /* index in the unit's layout */
  size_t begin;  /* first flat element of the part (offset in the full unit) */
  size_t end;    /* one past the last */
  size_t offset; /* element offset of `begin` in the held buffer */
} ts_slice;

/* The part of tensor i alone (possibly empty: begin == end). */
ts_slice ts_slice_of(const ts_engine *e, int u, int i, int sharded);
/* Element offset of flat element `flat` of unit u in a held buffer. */
size_t ts_engine_held_offset(const ts_engine *e, int u, int sharded, size_t flat);

/* AdamW on this rank's part of unit u (for the optimizer step): each
 * tensor's part with its own weight decay; scale multiplies the gradient
 * first. */
ts_status ts_engine_adamw_unit(ts_engine *e, int u, float lr, float scale);

/* Writes this rank's part of Adam's moment `which` (0: m, 1: v) of tensor
 * i of unit u (owned, asserted) from src, the whole tensor as fp32 host
 * values (only the part held is read). A checkpoint's load. */
ts_status ts_engine_set_state(ts_engine *e, int u, int i, int which, const float *src);

/* Skipped step: where the overflow began: the highest unit holding a
 * non-finite reduced gradient on any rank and its first such tensor
 * (layout order), agreed by one all-reduce. */
ts_status ts_engine_find_overflow(ts_engine *e, int *unit, int *tensor);

#ifdef __cplusplus
}
#endif

#endif /* TS_ENGINE_ENGINE_INTERNAL_H */
